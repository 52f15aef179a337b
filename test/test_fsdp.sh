#!/usr/bin/env bash
# fsdp.h's tests: test/test_fsdp alone (one process: shard arithmetic, units,
# rank-local loading and checkpoints for every rank of n = 1..5, collectives at
# W = 1), then with real ranks under mpirun: collectives and every strategy at
# W = 1, 2, 3 and 4 (4: HYBRID_SHARD with two groups of two); a checkpoint saved
# at W = 3 loaded at 2 and 1, and one saved at 2 loaded at 3; and faults: a
# rank that fails (bad input and fsdp_abort, die(), SIGKILL) while the others
# wait in a collective must end every rank, non-zero, within FAULT_TIMEOUT.
# Without mpirun (a build without MPI) that part is skipped, saying so; then all
# of it again with the ranks launched by the environment (dev/launch.sh, the TCP
# backend), which needs no MPI.
set -u
cd "$(dirname "$0")/.."
bin="$(dirname "${BIN:-./train_llama2}")/test/test_fsdp" # next to the trainer (build-san/ under SANITIZE=1)
if [ -n "${ASAN_OPTIONS:-}" ]; then # SANITIZE=1: leaks are checked, except OpenMPI's own (see the file)
    export ASAN_OPTIONS="$ASAN_OPTIONS:fast_unwind_on_malloc=0" LSAN_OPTIONS="${LSAN_OPTIONS:-}:suppressions=$PWD/test/lsan_mpi.supp"
fi
"$bin" || exit 1
# each rank single-threaded: the ranks share the machine's cores
export OMP_NUM_THREADS=1
status=0
FAULT_TIMEOUT=60 # seconds; a clean abort takes about one
# multi LAUNCH...: the multi-process tests with LAUNCH N as the launcher: collectives at W = 1-4, checkpoints
# saved and loaded at other W, and faults on rank 1 of 3 (EXPECT-KILL: what a killed rank's end looks like;
# $extra_fault: another kind of fault to try, where the launch's backend names it)
multi() {
    local expect_kill=$1 extra_fault=${extra_fault:-}; shift
    run() { # run NP ARGS...: under a timeout so a hang fails
        local np=$1; shift
        timeout 120 "$@" "$np" "$bin" "${args[@]}" || { echo "FAIL $* $np $bin ${args[*]} exited with status $?"; status=1; }
    }
    local np dir kind start out rc took what expect
    for np in 1 2 3 4; do args=(collectives); run $np "$@"; done
    dir=$(mktemp -d /tmp/test_fsdp_ckpt.XXXXXX)
    args=(save "$dir/w3"); run 3 "$@"; args=(load "$dir/w3"); run 2 "$@"; run 1 "$@"
    args=(save "$dir/w2"); run 2 "$@"; args=(load "$dir/w2"); run 3 "$@"
    rm -rf "$dir"
    for kind in abort exit kill $extra_fault; do
        start=$(date +%s)
        out=$(timeout $FAULT_TIMEOUT "$@" 3 "$bin" fault $kind 2>&1)
        rc=$?
        took=$(( $(date +%s) - start ))
        what="$*: fault '$kind' on rank 1 of 3 while ranks 0 and 2 wait in a barrier: every rank ends, non-zero ($took s)"
        [ $kind = mismatch ] && what="$*: rank 1 of 3 enters an all-gather of another size: every rank ends, non-zero, the sizes named ($took s)"
        case $kind in
            abort) expect="error: rank 1: cannot load the model" ;;
            exit) expect="error: rank 1 gives up" ;;
            kill) expect=$expect_kill ;;
            mismatch) expect="error: rank 0: rank 1 sent an all-gather of 12 bytes where this rank is in an all-gather of 8 bytes" ;;
        esac
        if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [[ "$out" == *"$expect"* ]] && ! pgrep -f "$bin fault" >/dev/null; then
            echo "ok $what"
        else
            echo "$out" | tail -20
            echo "FAIL $what: status $rc (124 = hung until the timeout), expected the message '$expect'"
            status=1
        fi
    done
}
if ! command -v mpirun >/dev/null || ! "$bin" --mpi-build 2>/dev/null; then
    echo "SKIP multi-process fsdp tests under mpirun: $( command -v mpirun >/dev/null && echo "$bin was built without MPI" || echo "no mpirun (install OpenMPI: libopenmpi-dev openmpi-bin)")"
else
    # OpenMPI refuses root without these; --oversubscribe: more ranks than cores
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
    multi "signal 9" mpirun -np
fi
# the same launched by the environment as torchrun does (the TCP backend), MPI or not
LAUNCH_GRACE=20 LLAMA2TUNE_TIMEOUT=30 extra_fault=mismatch multi "lost the connection to rank 1" dev/launch.sh
exit $status
