// Planted bug: the host reads pinned memory that a cudaMemcpyAsync from the device
// writes, before it synchronizes the stream. On a GPU the copy may not have
// happened yet. The emulated runtime (lazy, the default) runs the copy only when
// the host synchronizes, so the host reads what was there before and the program
// reports it (exit 1). Given "fixed", it synchronizes first and reads the result.
#include <cstdio>
#include <cstring>

__global__ void square_kernel(float *x, int n) { // x[i] = i^2
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = (float)i * i;
}

int main(int argc, char **argv) {
    bool fixed = argc > 1 && !strcmp(argv[1], "fixed");
    const int n = 128;
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    float *x, *host;
    cudaMalloc(&x, n * sizeof(float));
    cudaMallocHost((void **)&host, n * sizeof(float));
    memset(host, 0, n * sizeof(float));
    square_kernel<<<n / 64, 64, 0, s>>>(x, n);
    cudaMemcpyAsync(host, x, n * sizeof(float), cudaMemcpyDeviceToHost, s); // pinned: runs in stream order
    if (fixed) cudaStreamSynchronize(s);
    float last = host[n - 1]; // PLANTED: read before the stream is synchronized
    float want = (float)(n - 1) * (n - 1);
    if (last != want) {
        fprintf(stderr, "host_read_before_sync: host[%d] = %g, want %g: the host read the copy's destination before "
                "cudaStreamSynchronize\n", n - 1, last, want);
        return 1;
    }
    printf("host_read_before_sync: host[%d] = %g\n", n - 1, last);
    cudaStreamSynchronize(s);
    return 0;
}
