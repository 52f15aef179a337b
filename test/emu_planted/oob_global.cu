// Planted bug: an off-by-one index reads past the end of a buffer. AddressSanitizer
// must report a heap-buffer-overflow at the marked line (test/test_emu_checkers.sh).
#include <cstdio>
#include <vector>

__global__ void shift_kernel(float *out, const float *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i + 1]; // PLANTED: reads x[n] in the last thread
}

int main() {
    setenv("EMU_STREAMS", "eager", 1); // kernels here read host memory, right after their launch
    int n = 100;
    std::vector<float> x(n, 1.0f), out(n);
    shift_kernel<<<(n + 31) / 32, 32>>>(out.data(), x.data(), n);
    printf("out[0] = %g\n", out[0]);
    return 0;
}
