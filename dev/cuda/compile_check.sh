#!/usr/bin/env bash
# make test's CUDA step: compiles every CUDA target (the CUDA trainer, which
# includes every host header it shares with train_llama2.c, test_llama2cu, and the
# kernel checks) for sm_80 and sm_90 with warnings as errors (make
# cuda-compile-check; no GPU needed), so a compile break cannot land. Prints one
# ok / FAIL / SKIP line for test/run.sh to count.
cd "$(dirname "$0")/../.."
nvcc=${NVCC:-nvcc}
if ! command -v "$nvcc" >/dev/null; then
    echo "SKIP cuda compile check: $nvcc not found (CUDA targets not built; CUDA lives in /usr/local/cuda/bin?)"
    exit 0
fi
log=$(mktemp)
start=$(date +%s)
if make -j"$(nproc)" cuda-compile-check NVCC="$nvcc" >"$log" 2>&1; then
    echo "ok cuda compile check: every CUDA target for sm_80 and sm_90, -Werror ($(( $(date +%s) - start )) s)"
    rc=0
else
    cat "$log"
    echo "FAIL cuda compile check (make cuda-compile-check)"
    rc=1
fi
rm -f "$log"
exit $rc
