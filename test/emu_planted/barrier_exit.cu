// Planted bug: threads past the data return before a __syncthreads that the rest
// of the block waits at. The emulator must report the barrier (marked line), the
// threads that exited and those that wait.
#include <cstdio>
#include <vector>

__global__ void early_exit_kernel(float *out, const float *x, int n) {
    __shared__ float s[128];
    if ((int)threadIdx.x >= n) return; // the bug: these threads never reach the barrier
    s[threadIdx.x] = x[threadIdx.x];
    __syncthreads(); // PLANTED: barrier
    out[threadIdx.x] = s[n - 1 - threadIdx.x];
}

int main() {
    setenv("EMU_STREAMS", "eager", 1); // kernels here read host memory, right after their launch
    int n = 100;
    std::vector<float> x(n, 1.0f), out(n);
    early_exit_kernel<<<1, 128>>>(out.data(), x.data(), n);
    printf("out[0] = %g\n", out[0]);
    return 0;
}
