#!/bin/sh
# Runs every test binary given, prints each one's report, and ends with the
# sum as "N passed, N failed". Exit status 0 iff every test binary exited 0.
# Usage: tests/run.sh BUILD_DIR TEST_BIN...
build=$1; shift
export DHSA_CLI="$build/dhsa"
total_p=0; total_f=0; status=0
for t in "$@"; do
    out=$("$t" 2>&1); rc=$?
    printf '%s\n' "$out"
    line=$(printf '%s\n' "$out" | grep -E '^[A-Za-z0-9_]+: [0-9]+ passed, [0-9]+ failed$' | tail -n 1)
    if [ -z "$line" ]; then
        echo "$t: no report line (exit $rc): counted as 1 failure"
        total_f=$((total_f + 1)); status=1; continue
    fi
    p=$(printf '%s' "$line" | sed -E 's/.*: ([0-9]+) passed, ([0-9]+) failed/\1/')
    f=$(printf '%s' "$line" | sed -E 's/.*: ([0-9]+) passed, ([0-9]+) failed/\2/')
    total_p=$((total_p + p)); total_f=$((total_f + f))
    if [ "$rc" -ne 0 ]; then
        status=1
        [ "$f" -eq 0 ] && { echo "$t: exit $rc with no failed check: counted as 1 failure"; total_f=$((total_f + 1)); }
    fi
done
# Python binding tests (python/tests): they need numpy and pytest, which
# .ci/run installs; where they are missing the suite is skipped, loudly.
if [ -d python/tests ]; then
    if [ -n "${DHSA_SANITIZED:-}" ]; then
        echo "SKIP: python tests under sanitizers (python would need the sanitizer runtime preloaded; make test runs them)"
    elif python3 -c 'import numpy, pytest' >/dev/null 2>&1; then
        out=$(DHSA_LIB="$build/libdhsa.so" PYTHONPATH=python python3 -m pytest -q python/tests 2>&1); rc=$?
        printf '%s\n' "$out" | tail -n 15
        line=$(printf '%s\n' "$out" | grep -E '[0-9]+ (passed|failed)' | tail -n 1)
        p=$(printf '%s' "$line" | grep -oE '[0-9]+ passed' | grep -oE '[0-9]+'); p=${p:-0}
        f=$(printf '%s' "$line" | grep -oE '[0-9]+ failed' | grep -oE '[0-9]+'); f=${f:-0}
        e=$(printf '%s' "$line" | grep -oE '[0-9]+ errors?' | grep -oE '[0-9]+'); e=${e:-0}
        echo "python: $p passed, $((f + e)) failed"
        total_p=$((total_p + p)); total_f=$((total_f + f + e))
        if [ "$rc" -ne 0 ]; then
            status=1
            [ $((f + e)) -eq 0 ] && { echo "python: pytest exit $rc with no failed test: counted as 1 failure"; total_f=$((total_f + 1)); }
        fi
    else
        echo "SKIP: python tests need numpy and pytest (pip install numpy pytest; .ci/run does)"
    fi
fi
echo "$total_p passed, $total_f failed"
exit $status
