#!/usr/bin/env bash
# dev/launch.sh N PROGRAM [ARGS...]: starts N ranks of PROGRAM on this machine the
# way torchrun --no_python does, without MPI or Python: each gets RANK,
# WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR (127.0.0.1) and
# MASTER_PORT (the environment's, else a free one), and the ranks meet over TCP
# (fsdp.h). For one node; across nodes use torchrun, srun or mpirun.
#   dev/launch.sh 2 ./train_llama2cu --model ... --data ...
# Exits with the first non-zero status it sees among the ranks, else 0. When a rank fails
# the others normally stop on their own (they see its connection close); any
# still running LAUNCH_GRACE seconds later (default 30) are killed. SIGINT and
# SIGTERM are passed on to every rank.
set -u
if [ $# -lt 2 ] || ! [[ "$1" =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: $0 N PROGRAM [ARGS...]   (N: the number of ranks, at least 1)" >&2
    exit 2
fi
n=$1; shift
if [ -z "${MASTER_PORT:-}" ]; then # a port nobody answers on, below Linux's ephemeral ports (32768-60999), which
    for _ in $(seq 50); do            # outgoing connections take without listening
        MASTER_PORT=$(( 20000 + RANDOM % 12768 ))
        (exec 3<>"/dev/tcp/127.0.0.1/$MASTER_PORT") 2>/dev/null || break
    done
fi
export MASTER_ADDR=${MASTER_ADDR:-127.0.0.1} MASTER_PORT WORLD_SIZE=$n LOCAL_WORLD_SIZE=$n
pids=()
for ((r = 0; r < n; r++)); do
    RANK=$r LOCAL_RANK=$r "$@" &
    pids+=($!)
done
trap 'kill -TERM "${pids[@]}" 2>/dev/null' INT TERM
# Polls rather than `wait -n`: bash may reap a rank killed by a signal on its own
# (it reports "Killed"), after which `wait -n` no longer knows it; `wait PID` still
# returns its status.
status=0 live=("${pids[@]}")
while [ ${#live[@]} -gt 0 ]; do
    still=()
    for p in "${live[@]}"; do
        if kill -0 "$p" 2>/dev/null; then still+=("$p"); continue; fi
        wait "$p"
        rc=$?
        if [ $rc -ne 0 ] && [ $status -eq 0 ]; then
            status=$rc
            ( sleep "${LAUNCH_GRACE:-30}"; kill -KILL "${pids[@]}" ) >/dev/null 2>&1 &
            killer=$!
        fi
    done
    live=("${still[@]}")
    [ ${#live[@]} -gt 0 ] && sleep 0.1
done
# Every rank has ended: the killer must not outlive this script, or its kill, after the grace,
# could reach processes that have reused the ranks' PIDs. SIGKILL ends it at once, before it
# can run that kill (its sleep, orphaned, ends by itself).
[ -n "${killer:-}" ] && kill -KILL "$killer" 2>/dev/null
exit $status
