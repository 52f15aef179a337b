// Planted bug: a producer kernel on stream a writes x, a consumer kernel on stream
// b reads it, and the cudaStreamWaitEvent that orders the consumer after the
// producer is left out. On a GPU the consumer may run first. The emulated
// runtime's default (lazy) mode runs an operation only when the host forces it:
// synchronizing b runs b's work and what it waits for, which is not a's kernel, so
// the consumer reads x's NaN and the program reports the wrong y (exit 1). Given
// the argument "fixed" the wait is made and y is right: the difference is the wait
// (test/test_emu_checkers.sh runs both).
#include <cstdio>
#include <cstring>
#include <vector>

__global__ void produce_kernel(float *x, int n) { // x[i] = i
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = (float)i;
}
__global__ void consume_kernel(float *y, const float *x, int n) { // y[i] = 2 x[i]
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}

int main(int argc, char **argv) {
    bool fixed = argc > 1 && !strcmp(argv[1], "fixed");
    const int n = 256;
    cudaStream_t a, b;
    cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking);
    cudaEvent_t produced;
    cudaEventCreateWithFlags(&produced, cudaEventDisableTiming);
    float *x, *y;
    cudaMalloc(&x, n * sizeof(float));
    cudaMalloc(&y, n * sizeof(float));
    produce_kernel<<<n / 64, 64, 0, a>>>(x, n);
    cudaEventRecord(produced, a);
    if (fixed) cudaStreamWaitEvent(b, produced, 0); // PLANTED: the wait, left out unless "fixed"
    consume_kernel<<<n / 64, 64, 0, b>>>(y, x, n);
    std::vector<float> out(n);
    cudaMemcpyAsync(out.data(), y, n * sizeof(float), cudaMemcpyDeviceToHost, b); // pageable: done on return
    for (int i = 0; i < n; i++)
        if (out[i] != 2.0f * i) {
            fprintf(stderr, "missing_event_wait: y[%d] = %g, want %g: the consumer on stream b read x before the "
                    "producer on stream a wrote it\n", i, out[i], 2.0f * i);
            return 1;
        }
    printf("missing_event_wait: y = 2x\n");
    return 0;
}
