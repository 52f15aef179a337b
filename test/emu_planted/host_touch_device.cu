// Planted bug: host code reads a cudaMalloc'd buffer as if it were host memory.
// On a GPU that is a segmentation fault. The emulated runtime keeps device memory
// closed to host code: its report must name the allocation (its size and address),
// and AddressSanitizer, which the fault goes on to, must give the line
// (test/test_emu_checkers.sh checks both).
#include <cstdio>

int main() {
    const int n = 64;
    float *x;
    cudaMalloc(&x, n * sizeof(float));
    cudaMemset(x, 0, n * sizeof(float));
    cudaDeviceSynchronize();
    volatile float first = x[0]; // PLANTED: host read of device memory
    printf("x[0] = %g\n", (float)first);
    return 0;
}
