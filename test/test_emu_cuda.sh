#!/usr/bin/env bash
# make test-all's runs of the CUDA sources on the CPU, through the execution layer
# (dev/emu/; built by `make test-all` into build-emu/, no GPU and no nvcc needed):
# 1. every dev/cuda/ kernel check against its CPU twin (--quick: the small shapes,
#    no timing), each line as the check prints it;
#    dev/cuda/fsdp_nccl (fsdp.h's device collectives) alone (NCCL for one rank and
#    the staged backend) and as 2 and 3 ranks started by dev/launch.sh (staged);
# 2. test_llama2cu, the CUDA trainer against the CPU twin, every case of the GPU
#    run, in two processes that share the cases (--part 0/2 and 1/2: the two cores
#    a CI machine has), the second with blocks and streams in shuffled orders.
# --quick (make test's quick tier): 2. alone, test_llama2cu's --quick cases (the kernel
# checks and fsdp_nccl are not built there).
# The emulated kernel checks are ASan + UBSan builds (test_llama2cu is not: see the
# Makefile): an out-of-bounds access, a divergent barrier or a host read of device
# memory stops one with a report, which fails it here. Streams run lazily
# (EMU_STREAMS, dev/emu/runtime.h), so a missing event wait shows as a wrong result.
cd "$(dirname "$0")/.."
EMU=build-emu
quick=()
[ "${1:-}" = --quick ] && quick=(--quick)
status=0
kernel_checks() {
checks=$(make --no-print-directory -s cuda-checks | tail -1) # every dev/cuda/ check (the Makefile's CUDA_CHECKS)
for k in $checks; do
    if [ ! -x "$EMU/dev/cuda/$k" ]; then
        echo "FAIL emulated dev/cuda/$k: not built ($EMU/dev/cuda/$k)"
        status=1
        continue
    fi
    start=$(date +%s)
    "$EMU/dev/cuda/$k" --quick 2>&1 | sed "s/^\(ok\|FAIL\) /\1 emulated /"
    rc=${PIPESTATUS[0]}
    echo "# emulated dev/cuda/$k: $(( $(date +%s) - start )) s"
    [ $rc -ne 0 ] && { echo "FAIL emulated dev/cuda/$k exited with status $rc"; status=1; }
done
for w in 1 2 3; do
    launch=()
    [ $w -gt 1 ] && launch=(dev/launch.sh $w)
    LLAMA2TUNE_TIMEOUT=60 timeout 300 "${launch[@]}" "$EMU/dev/cuda/fsdp_nccl" --quick 2>&1 | sed "s/^\(ok\|FAIL\|SKIP\) /\1 emulated dev\/cuda\/fsdp_nccl: /"
    rc=${PIPESTATUS[0]}
    [ $rc -ne 0 ] && { echo "FAIL emulated dev/cuda/fsdp_nccl at W = $w exited with status $rc"; status=1; }
done
}
[ ${#quick[@]} -gt 0 ] || kernel_checks

if [ ! -x "$EMU/test/test_llama2cu" ]; then
    echo "FAIL emulated test_llama2cu: not built ($EMU/test/test_llama2cu)"
    exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)
# the second half with its blocks and its streams' work in shuffled orders: a correct
# program gives the same checks either way, so an order the code relies on fails here
modes=("" "EMU_SHUFFLE=1 EMU_STREAMS=shuffle:1")
for part in 0 1; do
    env OMP_NUM_THREADS=1 ${modes[$part]} "$EMU/test/test_llama2cu" "${quick[@]}" --part $part/2 >"$tmp/part$part.log" 2>&1 &
    pids[$part]=$!
done
for part in 0 1; do
    wait ${pids[$part]}
    rc=$?
    sed "s/^\(ok\|FAIL\|SKIP\) /\1 emulated /" "$tmp/part$part.log"
    [ $rc -ne 0 ] && { echo "FAIL emulated test_llama2cu --part $part/2 exited with status $rc"; status=1; }
done
echo "# emulated test_llama2cu: $(( $(date +%s) - start )) s"
exit $status
