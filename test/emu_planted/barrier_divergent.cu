// Planted bug: the two halves of a block wait at different __syncthreads (a barrier
// inside a branch that depends on the thread). The emulator must report both
// barriers (marked lines) and which threads wait at each.
#include <cstdio>
#include <vector>

__global__ void halves_kernel(float *out) {
    __shared__ float s[64];
    if (threadIdx.x < 32) {
        s[threadIdx.x] = 1.0f;
        __syncthreads(); // PLANTED: first
    } else {
        s[threadIdx.x] = 2.0f;
        __syncthreads(); // PLANTED: second
    }
    out[threadIdx.x] = s[63 - threadIdx.x];
}

int main() {
    setenv("EMU_STREAMS", "eager", 1); // kernels here read host memory, right after their launch
    std::vector<float> out(64);
    halves_kernel<<<1, 64>>>(out.data());
    printf("out[0] = %g\n", out[0]);
    return 0;
}
