// Planted bug: a leak of the program's own beside MPI's. OpenMPI keeps what MPI_Init
// and MPI_Finalize allocate until the process exits; the emulated build suppresses
// those leaks by MPI's frames (dev/emu/mpi_leaks.h, compiled in: no LSAN_OPTIONS).
// Here each rank stages a kernel's result through a host buffer it never frees:
// LeakSanitizer must report that allocation at its line and the program must fail,
// with every leak of MPI's still suppressed. Given the argument "fixed" the buffer is
// freed and the program exits 0 (test/test_emu_checkers.sh runs both under mpirun).
// Built with MPI where mpicc is (the Makefile); without it the program runs alone.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#ifdef USE_MPI
#define OMPI_SKIP_MPICXX 1 // the C API only, as fsdp.h
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

__global__ void fill_kernel(float *x, float v, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = v;
}

// the sum of the rank's n values, copied to the host through a staging buffer
static float rank_sum(const float *x, int n, bool fixed) {
    float *staged = (float *)malloc(n * sizeof(float)); // PLANTED: leaked unless "fixed"
    cudaMemcpy(staged, x, n * sizeof(float), cudaMemcpyDeviceToHost);
    float s = 0;
    for (int i = 0; i < n; i++) s += staged[i];
    if (fixed) free(staged);
    return s;
}

int main(int argc, char **argv) {
    bool fixed = argc > 1 && !strcmp(argv[1], "fixed");
    int rank = 0, world = 1;
#ifdef USE_MPI
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
#endif
    const int n = 64;
    float *x;
    cudaMalloc(&x, n * sizeof(float));
    fill_kernel<<<1, n>>>(x, (float)(rank + 1), n);
    float sum = rank_sum(x, n, fixed), total = sum;
    cudaFree(x);
#ifdef USE_MPI
    MPI_Allreduce(&sum, &total, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Finalize();
#endif
    float want = n * world * (world + 1) / 2.0f;
    if (total != want) {
        fprintf(stderr, "mpi_leak: rank %d: total %g, want %g\n", rank, total, want);
        return 1;
    }
#ifdef USE_MPI
    if (rank == 0) printf("mpi_leak: %d MPI ranks, total %g\n", world, total);
#else
    printf("mpi_leak: built without MPI (no mpicc), total %g\n", total);
#endif
    return 0;
}
