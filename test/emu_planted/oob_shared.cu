// Planted bug: a kernel reads one element past its dynamic shared memory (the launch
// asked for n floats, the loop reads n + 1). AddressSanitizer must report it at
// the marked line: dynamic shared memory is exactly the launch's bytes.
#include <cstdio>
#include <vector>

__global__ void tile_sum_kernel(float *out, const float *x, int n) {
    extern __shared__ float tile[];
    tile[threadIdx.x] = x[threadIdx.x];
    __syncthreads();
    if (threadIdx.x != 0) return;
    float s = 0.0f;
    for (int i = 0; i <= n; i++) s += tile[i]; // PLANTED: <= reads tile[n]
    *out = s;
}

int main() {
    setenv("EMU_STREAMS", "eager", 1); // kernels here read host memory, right after their launch
    int n = 64;
    std::vector<float> x(n, 1.0f);
    float out = 0.0f;
    tile_sum_kernel<<<1, n, n * sizeof(float)>>>(&out, x.data(), n);
    printf("sum = %g\n", out);
    return 0;
}
