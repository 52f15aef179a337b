#!/usr/bin/env bash
# Runs every test program given on the command line, RUN_JOBS of them at a time (default
# 1), keeps their output, says how long each took (wall and CPU seconds: make test's
# budget is CPU time on two cores), and ends with the line "N passed, N failed" counted
# from their ok/FAIL lines. With several at a time each test's output is printed whole
# when it ends; they start in the order given, so the longest go first.
set -u
jobs_max=${RUN_JOBS:-1}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# cpu_ticks PID: the CPU time of the (sub)shell PID's finished children, in clock ticks (/proc: Linux; else 0)
cpu_ticks() {
    local s
    read -r s 2>/dev/null </proc/$1/stat || { echo 0; return; }
    set -- ${s##*) } # the fields after the command's name: cutime and cstime are the 14th and 15th
    echo $((${14} + ${15}))
}
hz=$(getconf CLK_TCK 2>/dev/null || echo 100)
run_one() { # run_one I TEST: its output, then its time, in $dir/I.out (and on the screen when one at a time); its status in $dir/I.rc
    local start=$SECONDS me=$BASHPID c0 rc line
    c0=$(cpu_ticks $me)
    if [ "$jobs_max" -gt 1 ]; then
        $2 >"$dir/$1.out" 2>&1
        rc=$?
    else
        $2 2>&1 | tee "$dir/$1.out"
        rc=${PIPESTATUS[0]}
    fi
    line="== $2: $((SECONDS - start)) s (CPU $((($(cpu_ticks $me) - c0) / hz)) s)"
    echo "$line" >>"$dir/$1.out"
    [ "$jobs_max" -gt 1 ] || echo "$line"
    echo $rc >"$dir/$1.rc"
}
tests=("$@")
printed=()
status=0
report() { # records each test that has ended and is not recorded yet (with several at a time, prints it whole)
    local i rc
    for i in "${!tests[@]}"; do
        [ -f "$dir/$i.rc" ] && [ -z "${printed[$i]:-}" ] || continue
        printed[$i]=1
        [ "$jobs_max" -gt 1 ] && { echo "== ${tests[$i]}"; cat "$dir/$i.out"; }
        cat "$dir/$i.out" >>"$dir/all"
        rc=$(cat "$dir/$i.rc")
        if [ "$rc" -ne 0 ]; then
            echo "FAIL ${tests[$i]} exited with status $rc" | tee -a "$dir/all"
            status=1
        fi
    done
}
running=0
for i in "${!tests[@]}"; do
    if [ "$jobs_max" -le 1 ]; then
        echo "== ${tests[$i]}"
        run_one "$i" "${tests[$i]}"
        report
        continue
    fi
    while [ $running -ge "$jobs_max" ]; do
        wait -n
        running=$((running - 1))
        report
    done
    echo "== ${tests[$i]} (started)"
    run_one "$i" "${tests[$i]}" &
    running=$((running + 1))
done
wait
report
touch "$dir/all"
passed=$(grep -c '^ok ' "$dir/all")
failed=$(grep -c '^FAIL ' "$dir/all")
skipped=$(grep -c '^SKIP ' "$dir/all")
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ] && [ "$status" -eq 0 ]
