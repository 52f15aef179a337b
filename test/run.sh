#!/usr/bin/env bash
# Runs every test program given on the command line, keeps their output, says
# how long each took (wall and CPU seconds: make test's budget is CPU time on two
# cores), and ends with the line "N passed, N failed" counted from their ok/FAIL lines.
set -u
log=$(mktemp)
status=0
# the CPU time of this shell's finished children, in clock ticks (/proc: Linux; else 0)
cpu_ticks() {
    local s
    read -r s 2>/dev/null </proc/$$/stat || { echo 0; return; }
    set -- ${s##*) } # the fields after the command's name: cutime and cstime are the 14th and 15th
    echo $((${14} + ${15}))
}
hz=$(getconf CLK_TCK 2>/dev/null || echo 100)
for t in "$@"; do
    echo "== $t"
    start=$SECONDS c0=$(cpu_ticks)
    $t 2>&1 | tee -a "$log"
    rc=${PIPESTATUS[0]}
    echo "== $t: $((SECONDS - start)) s (CPU $((($(cpu_ticks) - c0) / hz)) s)"
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
