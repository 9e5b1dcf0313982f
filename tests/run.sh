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
echo "$total_p passed, $total_f failed"
exit $status
