#!/bin/sh
# Runs every test binary given, prints each one's report, and ends with the
# sum as "N passed, N failed, M skipped" (M: checks of parts that could not
# run here, counted as tests/t.h says, plus pytest's skipped tests), then,
# when M > 0, one line saying what the skipped checks need. Exit status 0
# iff every test binary exited 0: a skip never fails.
# Usage: tests/run.sh BUILD_DIR TEST_BIN...
build=$1; shift
export DHSA_CLI="$build/dhsa"
total_p=0; total_f=0; total_s=0; status=0
# "name: P passed, F failed, S skipped" (tests/t.h); the older line without
# the skipped count is still read, as 0 skipped.
report='^[A-Za-z0-9_]+: [0-9]+ passed, [0-9]+ failed(, [0-9]+ skipped)?$'
for t in "$@"; do
    out=$("$t" 2>&1); rc=$?
    printf '%s\n' "$out"
    line=$(printf '%s\n' "$out" | grep -E "$report" | tail -n 1)
    if [ -z "$line" ]; then
        echo "$t: no report line (exit $rc): counted as 1 failure"
        total_f=$((total_f + 1)); status=1; continue
    fi
    p=$(printf '%s' "$line" | sed -E 's/.*: ([0-9]+) passed.*/\1/')
    f=$(printf '%s' "$line" | sed -E 's/.*, ([0-9]+) failed.*/\1/')
    s=$(printf '%s' "$line" | grep -oE '[0-9]+ skipped' | grep -oE '[0-9]+'); s=${s:-0}
    total_p=$((total_p + p)); total_f=$((total_f + f)); total_s=$((total_s + s))
    if [ "$rc" -ne 0 ]; then
        status=1
        [ "$f" -eq 0 ] && { echo "$t: exit $rc with no failed check: counted as 1 failure"; total_f=$((total_f + 1)); }
    fi
done
# Python binding tests (python/tests): they need numpy and pytest, which
# .ci/run installs; where they are missing the suite is skipped, loudly.
# DHSA_PYTHON picks the interpreter (.ci/run: the venv with PyTorch).
py=${DHSA_PYTHON:-python3}
py_skipped=""; py_s=0
if [ -d python/tests ]; then
    if [ -n "${DHSA_SANITIZED:-}" ]; then
        echo "SKIP: python tests under sanitizers (python would need the sanitizer runtime preloaded; make test runs them)"
    elif "$py" -c 'import numpy, pytest' >/dev/null 2>&1; then
        out=$(DHSA_LIB="$build/libdhsa.so" PYTHONPATH=python "$py" -m pytest -q -rs python/tests 2>&1); rc=$?
        printf '%s\n' "$out" | tail -n 15
        line=$(printf '%s\n' "$out" | grep -E '[0-9]+ (passed|failed|skipped)' | tail -n 1)
        p=$(printf '%s' "$line" | grep -oE '[0-9]+ passed' | grep -oE '[0-9]+'); p=${p:-0}
        f=$(printf '%s' "$line" | grep -oE '[0-9]+ failed' | grep -oE '[0-9]+'); f=${f:-0}
        e=$(printf '%s' "$line" | grep -oE '[0-9]+ errors?' | grep -oE '[0-9]+'); e=${e:-0}
        s=$(printf '%s' "$line" | grep -oE '[0-9]+ skipped' | grep -oE '[0-9]+'); s=${s:-0}; py_s=$s
        echo "python: $p passed, $((f + e)) failed, $s skipped"
        total_p=$((total_p + p)); total_f=$((total_f + f + e)); total_s=$((total_s + s))
        if [ "$rc" -ne 0 ]; then
            status=1
            [ $((f + e)) -eq 0 ] && { echo "python: pytest exit $rc with no failed test: counted as 1 failure"; total_f=$((total_f + 1)); }
        fi
    else
        echo "SKIP: python tests need numpy and pytest (pip install numpy pytest; .ci/run does)"
        py_skipped=" The python suite did not run: pip install numpy pytest."
    fi
fi
echo "$total_p passed, $total_f failed, $total_s skipped"
if [ "$total_s" -gt 0 ] || [ -n "$py_skipped" ]; then
    what="$((total_s - py_s)) checks of the C tests, $py_s python tests"
    missing=""
    for d in models vocab; do [ -d "../shared/$d" ] || missing="$missing ../shared/$d"; done
    if [ -n "$missing" ]; then
        echo "$total_s skipped ($what):$missing absent, so the tests that need that data" \
             "(real models, tokenizer vectors: not in the repository) skipped; README.md" \
             "(\"Tests and their data\") says where to get it. The SKIP lines above name each part.$py_skipped"
    else
        echo "$total_s skipped ($what): the SKIP and SKIPPED lines above say why.$py_skipped"
    fi
fi
exit $status
