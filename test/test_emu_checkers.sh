#!/usr/bin/env bash
# Shows each checker of the emulated build firing on a planted bug (the programs in
# test/emu_planted/, built by `make test-all` into build-emu/ with ASan, unoptimized, and,
# for the races, into build-emu-tsan/ with ThreadSanitizer). Each check wants the
# program to fail and its report to name the kernel and the planted lines, which
# the sources mark with "// PLANTED: <what>". Last, LeakSanitizer under mpirun (mpi_leak,
# built with MPI where mpicc is): MPI's own leaks suppressed by the build, the program's not.
set -u
cd "$(dirname "$0")/.."
E=build-emu/test/emu_planted
T=build-emu-tsan/test/emu_planted
P=test/emu_planted
export ASAN_OPTIONS=abort_on_error=1:detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 TSAN_OPTIONS=halt_on_error=1
failed=0

# file:line of the line of test/emu_planted/<program>.cu marked "PLANTED: <what>"
planted() { echo "$P/$1.cu:$(grep -n "PLANTED: $2\$" "$P/$1.cu" | cut -d: -f1)"; }

# expect_report <what> <command> <text>...: the command fails, and its output holds every text
expect_report() {
    local what=$1 cmd=$2 out rc text
    shift 2
    out=$(eval "$cmd" 2>&1)
    rc=$?
    if [ $rc -eq 0 ]; then
        echo "FAIL $what: '$cmd' exited 0, the checker did not fire"
        failed=1
        return
    fi
    for text in "$@"; do
        if ! grep -qF -- "$text" <<<"$out"; then
            echo "FAIL $what: the report of '$cmd' (status $rc) lacks \"$text\":"
            sed 's/^/    /' <<<"$out" | head -30
            failed=1
            return
        fi
    done
    echo "ok $what"
}

expect_report "ASan: an out-of-bounds read of a buffer is reported at its line" "$E/oob_global" \
    "heap-buffer-overflow" "in shift_kernel" "$(planted oob_global 'reads x\[n\] in the last thread')"
expect_report "ASan: a read past the launch's dynamic shared memory is reported at its line" "$E/oob_shared" \
    "heap-buffer-overflow" "in tile_sum_kernel" "$(planted oob_shared '<= reads tile\[n\]')"
expect_report "racecheck: a missing __syncthreads is reported with the write and the read" "$T/race_missing_sync" \
    "ThreadSanitizer: data race" "$(planted race_missing_sync write)" "$(planted race_missing_sync read)" \
    "rotate_kernel block (0,0,0) thread"
expect_report "barriers: threads waiting at different __syncthreads are reported with both lines" "$E/barrier_divergent" \
    "kernel halves_kernel" "threads of the block wait at different __syncthreads" \
    "threads 0-31: at __syncthreads ($(planted barrier_divergent first))" \
    "threads 32-63: at __syncthreads ($(planted barrier_divergent second))"
expect_report "barriers: part of a block exiting before a __syncthreads is reported" "$E/barrier_exit" \
    "kernel early_exit_kernel" "part of the block exited while the rest waits at __syncthreads" \
    "threads 0-99: at __syncthreads ($(planted barrier_exit barrier))" "threads 100-127: exited"
expect_report "warp collectives: lanes at different __shfl_xor_sync are reported with both lines" "$E/warp_divergent" \
    "kernel branchy_kernel" "warp collectives that cannot complete" \
    "thread 0: at __shfl_xor_sync with mask 0xffffffff ($(planted warp_divergent even))" \
    "thread 1: at __shfl_xor_sync with mask 0xffffffff ($(planted warp_divergent odd))"

# a block reading another block's output: right in grid order, wrong shuffled, a race for TSan
if $E/race_between_blocks >/dev/null 2>&1; then
    expect_report "shuffle: a block reading another block's output gives a wrong result in a shuffled order" \
        "EMU_SHUFFLE=1 $E/race_between_blocks" "wrong result"
else
    echo "FAIL shuffle: race_between_blocks should pass in grid order (the bug the shuffle exposes stays hidden there)"
    failed=1
fi
expect_report "racecheck: a block reading another block's output is reported with the write and the read" \
    "$T/race_between_blocks" "ThreadSanitizer: data race" "$(planted race_between_blocks write)" \
    "$(planted race_between_blocks read)"

# expect_fixed <what> <program> <text>...: the program fails reporting every text, and
# given "fixed" (the planted line done right) it passes, so that the line is the difference
expect_fixed() {
    local what=$1 program=$2 out
    shift 2
    expect_report "$what" "$E/$program" "$@"
    if out=$($E/$program fixed 2>&1); then
        echo "ok $what: right when fixed"
    else
        echo "FAIL $what: '$E/$program fixed' fails too:"
        sed 's/^/    /' <<<"$out" | head -30
        failed=1
    fi
}

# the host side: stream order (lazy by default), device memory closed to host code
expect_fixed "streams: a consumer without the cudaStreamWaitEvent on its producer reads stale data" missing_event_wait \
    "missing_event_wait: y[0] = -nan, want 0: the consumer on stream b read x before the producer on stream a wrote it"
expect_fixed "streams: the host reading a copy's pinned destination before synchronizing sees the old value" \
    host_read_before_sync "host_read_before_sync: host[127] = 0, want 16129"
expect_report "memory: host code reading device memory is reported with the allocation and the line" \
    "$E/host_touch_device" "emu: host code touched device memory: byte 0 of the allocation of 256 bytes" \
    "AddressSanitizer: SEGV" "$(planted host_touch_device 'host read of device memory')"
# cuBLASLt: a transposed operand is no error to cuBLAS; the comparison with plain loops catches it
expect_fixed "cuBLASLt: a weight passed with the wrong transpose flag gives a product the loops reject" gemm_transposed \
    "gemm_transposed: out[0][2] = 10, want -9 (the worst of 12 elements)"

# LeakSanitizer beside MPI: the build suppresses MPI's own leaks (dev/emu/mpi_leaks.h, compiled
# in), so under mpirun, with ASAN_OPTIONS and LSAN_OPTIONS unset, a leak of the program's own is
# reported at its line and alone (MPI leaves thousands), and with it freed the program exits 0
mpi="env -u ASAN_OPTIONS -u LSAN_OPTIONS OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    OMPI_MCA_rmaps_base_oversubscribe=1 timeout 120 mpirun -np 2"
if ! command -v mpirun >/dev/null; then
    echo "SKIP LeakSanitizer beside MPI: no mpirun (install OpenMPI: libopenmpi-dev openmpi-bin)"
else
    fixed_out=$(eval "$mpi $E/mpi_leak fixed" 2>&1)
    fixed_rc=$?
    if grep -q "built without MPI" <<<"$fixed_out"; then
        echo "SKIP LeakSanitizer beside MPI: $E/mpi_leak was built without MPI (no mpicc)"
    else
        expect_report "LeakSanitizer beside MPI: a leak of the program's own under mpirun -np 2 is reported at its line, MPI's are not" \
            "$mpi $E/mpi_leak" "ERROR: LeakSanitizer: detected memory leaks" \
            "in rank_sum $(planted mpi_leak 'leaked unless "fixed"')" "SUMMARY: AddressSanitizer: 256 byte(s) leaked in 1 allocation(s)."
        if [ $fixed_rc -eq 0 ] && grep -q "mpi_leak: 2 MPI ranks" <<<"$fixed_out"; then
            echo "ok LeakSanitizer beside MPI: right when fixed (exits 0 under mpirun -np 2, MPI's leaks suppressed)"
        else
            echo "FAIL LeakSanitizer beside MPI: '$E/mpi_leak fixed' under mpirun -np 2 exited with status $fixed_rc:"
            sed 's/^/    /' <<<"$fixed_out" | head -30
            failed=1
        fi
    fi
fi
exit $failed
