#!/usr/bin/env bash
# fsdp.h's tests: test/test_fsdp alone (one process: shard arithmetic, units,
# rank-local loading and checkpoints for every rank of n = 1..5, collectives at
# W = 1), then with real ranks under mpirun: collectives and every strategy at
# W = 1, 2, 3 and 4 (4: HYBRID_SHARD with two groups of two); a checkpoint saved
# at W = 3 loaded at 2 and 1, and one saved at 2 loaded at 3; and faults: a
# rank that fails (bad input and fsdp_abort, die(), SIGKILL) while the others
# wait in a collective must end every rank, non-zero, within FAULT_TIMEOUT.
# Without mpirun (a build without MPI) the multi-process part is skipped, saying so.
set -u
cd "$(dirname "$0")/.."
bin="$(dirname "${BIN:-./train_llama2}")/test/test_fsdp" # next to the trainer (build-san/ under SANITIZE=1)
if [ -n "${ASAN_OPTIONS:-}" ]; then # SANITIZE=1: leaks are checked, except OpenMPI's own (see the file)
    export ASAN_OPTIONS="$ASAN_OPTIONS:fast_unwind_on_malloc=0" LSAN_OPTIONS="${LSAN_OPTIONS:-}:suppressions=$PWD/test/lsan_mpi.supp"
fi
"$bin" || exit 1
if ! command -v mpirun >/dev/null || ! "$bin" --mpi-build 2>/dev/null; then
    echo "SKIP multi-process fsdp tests: $( command -v mpirun >/dev/null && echo "$bin was built without MPI" || echo "no mpirun (install OpenMPI: libopenmpi-dev openmpi-bin)")"
    exit 0
fi
# OpenMPI refuses root without these; --oversubscribe: more ranks than cores
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# each rank single-threaded: the ranks share the machine's cores
export OMP_NUM_THREADS=1
status=0
run() { # run NP ARGS...: mpirun, under a timeout so a hang fails
    local np=$1; shift
    timeout 120 mpirun -np "$np" "$bin" "$@" || { echo "FAIL mpirun -np $np $bin $* exited with status $?"; status=1; }
}
for np in 1 2 3 4; do run $np collectives; done
dir=$(mktemp -d /tmp/test_fsdp_ckpt.XXXXXX)
run 3 save "$dir/w3"; run 2 load "$dir/w3"; run 1 load "$dir/w3"
run 2 save "$dir/w2"; run 3 load "$dir/w2"
rm -rf "$dir"

FAULT_TIMEOUT=60 # seconds; a clean abort takes about one
for kind in abort exit kill; do
    start=$(date +%s)
    out=$(timeout $FAULT_TIMEOUT mpirun -np 3 "$bin" fault $kind 2>&1)
    rc=$?
    took=$(( $(date +%s) - start ))
    what="fault '$kind' on rank 1 of 3 while ranks 0 and 2 wait in a barrier: every rank ends, non-zero ($took s)"
    case $kind in
        abort) expect="error: rank 1: cannot load the model" ;;
        exit) expect="error: rank 1 gives up" ;;
        kill) expect="signal 9" ;;
    esac
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [[ "$out" == *"$expect"* ]] && ! pgrep -f "$bin fault" >/dev/null; then
        echo "ok $what"
    else
        echo "$out" | tail -20
        echo "FAIL $what: status $rc (124 = hung until the timeout), expected the message '$expect'"
        status=1
    fi
done
exit $status
