// Planted bug: lanes of one warp reach two different __shfl_xor_sync (a reduction
// written once per branch), each with the full mask. The emulator must report
// both collectives (marked lines) and which lanes wait at each.
#include <cstdio>
#include <vector>

__global__ void branchy_kernel(float *out) {
    float v = (float)threadIdx.x;
    if (threadIdx.x % 2 == 0) v += __shfl_xor_sync(0xffffffff, v, 16); // PLANTED: even
    else v -= __shfl_xor_sync(0xffffffff, v, 16);                       // PLANTED: odd
    out[threadIdx.x] = v;
}

int main() {
    setenv("EMU_STREAMS", "eager", 1); // kernels here read host memory, right after their launch
    std::vector<float> out(32);
    branchy_kernel<<<1, 32>>>(out.data());
    printf("out[0] = %g\n", out[0]);
    return 0;
}
