#!/usr/bin/env bash
# make test's run of test_llama2cu (the CUDA trainer against the CPU twin), after
# dev/cuda/compile_check.sh built it: without nvcc there is no binary, and
# without a GPU the binary itself says SKIP.
cd "$(dirname "$0")/.."
if [ ! -x test/test_llama2cu ]; then
    echo "SKIP test_llama2cu: not built (no nvcc; see the cuda compile check above)"
    exit 0
fi
exec test/test_llama2cu
