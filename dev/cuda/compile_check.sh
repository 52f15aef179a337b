#!/usr/bin/env bash
# make test's CUDA step: compiles every CUDA target (the CUDA trainer, which
# includes every host header it shares with train_llama2.c, for sm_80 and sm_90;
# test_llama2cu and the kernel checks for sm_90), and the trainer for sm_75 (T4: fp16
# only) and, where this nvcc still has Volta (CUDA 12 and older; 13 dropped it), sm_70
# (V100), with warnings as errors (make cuda-compile-check; no GPU needed), so a
# compile break cannot land. Prints one ok / FAIL / SKIP line for test/run.sh to count.
cd "$(dirname "$0")/../.."
nvcc=${NVCC:-nvcc}
if ! command -v "$nvcc" >/dev/null; then
    echo "SKIP cuda compile check: $nvcc not found (CUDA targets not built; CUDA lives in /usr/local/cuda/bin?)"
    exit 0
fi
log=$(mktemp)
archs="sm_75 and sm_70"
"$nvcc" --list-gpu-arch 2>/dev/null | grep -qx compute_70 || archs="sm_75 (this nvcc has no sm_70: CUDA 13 dropped Volta)"
# make test has built them with its other programs (the Makefile's CUDA_COMPILE_CHECK); run alone, this builds them
if make -j"$(nproc)" cuda-compile-check NVCC="$nvcc" >"$log" 2>&1; then
    echo "ok cuda compile check: the trainer for sm_80 and sm_90, its test and the kernel checks for sm_90, the trainer for $archs, -Werror"
    rc=0
else
    cat "$log"
    echo "FAIL cuda compile check (make cuda-compile-check)"
    rc=1
fi
rm -f "$log"
exit $rc
