// Planted bug: block b reads what block b - 1 of the same launch wrote (a running
// sum carried from block to block). Blocks of a launch are unordered on a GPU, so
// this is wrong, yet in grid order it gives the right answer. Run shuffled
// (EMU_SHUFFLE=<seed>) the result is wrong and the program says so; under
// ThreadSanitizer the write and the read (both marked) are reported as a race.
#include <cstdio>
#include <vector>
#include "../../support/cuda_common.cuh"

__global__ void carry_kernel(float *partial, const float *x) {
    float prev = blockIdx.x == 0 ? 0.0f : partial[blockIdx.x - 1]; // PLANTED: read
    float s = block_sum(x[blockIdx.x * blockDim.x + threadIdx.x]);
    if (threadIdx.x == 0) partial[blockIdx.x] = prev + s; // PLANTED: write
}

int main() {
    setenv("EMU_STREAMS", "eager", 1); // kernels here read host memory, right after their launch
    int blocks = 16, threads = 64;
    std::vector<float> x(blocks * threads, 1.0f), partial(blocks, 0.0f);
    carry_kernel<<<blocks, threads>>>(partial.data(), x.data());
    float want = (float)(blocks * threads);
    printf("total %g, want %g\n", partial[blocks - 1], want);
    if (partial[blocks - 1] != want) {
        fprintf(stderr, "race_between_blocks: wrong result %g (want %g): a block read another block's output\n",
                partial[blocks - 1], want);
        return 1;
    }
    return 0;
}
