#!/usr/bin/env bash
# Runs every test program given on the command line, keeps their output, says
# how long each took, and ends with the line "N passed, N failed" counted from
# their ok/FAIL lines.
set -u
log=$(mktemp)
status=0
for t in "$@"; do
    echo "== $t"
    start=$SECONDS
    $t 2>&1 | tee -a "$log"
    rc=${PIPESTATUS[0]}
    echo "== $t: $((SECONDS - start)) s"
    if [ "$rc" -ne 0 ]; then
        echo "FAIL $t exited with status $rc" | tee -a "$log"
        status=1
    fi
done
passed=$(grep -c '^ok ' "$log")
failed=$(grep -c '^FAIL ' "$log")
skipped=$(grep -c '^SKIP ' "$log")
rm -f "$log"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ] && [ "$status" -eq 0 ]
