// Planted bug: a missing __syncthreads between writing a shared tile and reading a
// neighbour's element of it. The emulator runs each thread until it blocks, so
// here the result may even look right; ThreadSanitizer (the race check) must
// report the write and the read, both marked lines.
#include <cstdio>
#include <vector>

__global__ void rotate_kernel(float *out, const float *x) {
    __shared__ float tile[128];
    tile[threadIdx.x] = 2.0f * x[threadIdx.x]; // PLANTED: write
    // (missing: __syncthreads();)
    out[threadIdx.x] = tile[(threadIdx.x + 1) % blockDim.x]; // PLANTED: read
}

int main() {
    setenv("EMU_STREAMS", "eager", 1); // kernels here read host memory, right after their launch
    int n = 128;
    std::vector<float> x(n, 1.0f), out(n);
    rotate_kernel<<<1, n>>>(out.data(), x.data());
    printf("out[0] = %g\n", out[0]);
    return 0;
}
