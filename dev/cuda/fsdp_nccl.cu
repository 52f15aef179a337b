// fsdp.h's device backends on the GPU, NCCL and staged (through host memory:
// --collectives host), against plain loops on the host, then NCCL timed:
//   make dev/cuda/fsdp_nccl && mpirun -np <GPUs> dev/cuda/fsdp_nccl   (or dev/launch.sh <GPUs> ..., or alone: one GPU)
// --quick: the checks only, not the 7B layer's timing (for the emulated build)
// Each rank uses GPU (rank % device count); NCCL is checked where every rank
// has its own (fsdp_device_backend), the staged backend always (ranks may
// share a GPU). Checks, on sizes that do not divide by W: all-gather exact
// (fp32, and bf16 as the CUDA trainer's bf16 weights); reduce-scatter and
// all-reduce against a float64 sum, within (W - 1) * 2^-24 * sum|x| per
// element, the bound on fp32 rounding for W terms added in any order (NCCL
// picks its own order), and staged exactly equal to the fp32 sum in rank order
// ((x_0 + x_1) + x_2 ..., what the host side promises); every rank gets the
// same bits from all-reduce. Then the bandwidth of NCCL's all-gather and
// reduce-scatter of a Llama-2-7B decoder layer (202 M parameters, fp32).
#include "../../fsdp.h"
#include <math.h>
#include <vector>

static float value(int rank, size_t i) { return hash_uniform((uint64_t)rank, i) - 0.5f; }
// a bf16 of it (its top 16 bits: any bits do, the gather moves them unchanged)
static uint16_t value_bf16(int rank, size_t i) {
    float x = value(rank, i);
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (uint16_t)(u >> 16);
}

// all-gather of E elements through gather (fp32, or bf16 bits): every rank gets
// every rank's shard value_of(rank, 0 .. S - 1), in rank order, exactly; 1 if not
template <typename E, typename Value, typename Gather>
static int gather_bad(FsdpComm *c, size_t S, void *dev_a, void *dev_b, Value value_of, Gather gather) {
    std::vector<E> mine(S), got((size_t)c->size * S);
    for (size_t i = 0; i < S; i++) mine[i] = value_of(c->rank, i);
    fsdp_cudaCheck(c, cudaMemcpy(dev_a, mine.data(), S * sizeof(E), cudaMemcpyHostToDevice));
    gather(c, dev_b, dev_a, S);
    fsdp_cudaCheck(c, cudaMemcpyAsync(got.data(), dev_b, got.size() * sizeof(E), cudaMemcpyDeviceToHost, c->stream));
    fsdp_barrier(c);
    int bad = 0;
    for (int q = 0; q < c->size; q++)
        for (size_t i = 0; i < S; i++) bad |= got[(size_t)q * S + i] != value_of(q, i);
    return bad;
}

// c: a device communicator (NCCL or staged); host: the same ranks on the host side (MPI or TCP)
static int check(FsdpComm *c, FsdpComm *host_comm, size_t S, float *dev_a, float *dev_b) {
    int W = c->size, me = c->rank;
    size_t full_n = (size_t)W * S;
    float *host = (float *)mallocCheck(full_n * sizeof(float)), *got = (float *)mallocCheck(full_n * sizeof(float));
    int bad = gather_bad<float>(c, S, dev_a, dev_b, value, [](FsdpComm *cc, void *full, const void *shard, size_t n) {
        fsdp_all_gather(cc, (float *)full, (const float *)shard, n);
    });
    bad |= gather_bad<uint16_t>(c, S, dev_a, dev_b, value_bf16, fsdp_all_gather_bf16);
    // reduce-scatter and all-reduce: rank q holds value(q, i) at element i of the full buffer
    for (size_t i = 0; i < full_n; i++) host[i] = value(me, i);
    fsdp_cudaCheck(c, cudaMemcpy(dev_b, host, full_n * sizeof(float), cudaMemcpyHostToDevice));
    fsdp_reduce_scatter(c, dev_a, dev_b, S);
    fsdp_all_reduce(c, dev_b, full_n, FSDP_F32);
    fsdp_cudaCheck(c, cudaMemcpyAsync(got, dev_a, S * sizeof(float), cudaMemcpyDeviceToHost, c->stream));
    fsdp_cudaCheck(c, cudaMemcpyAsync(host, dev_b, full_n * sizeof(float), cudaMemcpyDeviceToHost, c->stream));
    fsdp_barrier(c);
    for (size_t i = 0; i < full_n; i++) {
        double sum = 0, mag = 0;
        float ordered = 0; // the fp32 sum in rank order
        for (int q = 0; q < W; q++) sum += value(q, i), mag += fabs(value(q, i)), ordered += value(q, i);
        double tol = (W - 1) * ldexp(mag, -24);
        if (c->backend == FSDP_BACKEND_STAGED) sum = ordered, tol = 0;
        bad |= fabs(host[i] - sum) > tol;
        if (i / S == (size_t)me) bad |= fabs(got[i - (size_t)me * S] - sum) > tol;
    }
    // every rank holds the same all-reduce bits: compare a checksum with rank 0's
    uint64_t h = data_hash_bytes(0, host, full_n * sizeof(float)), h0 = h;
    fsdp_broadcast(host_comm, &h0, sizeof h0, 0);
    bad |= h != h0;
    free(host);
    free(got);
    return bad;
}

int main(int argc, char **argv) {
    bool quick = argc > 1 && !strcmp(argv[1], "--quick");
    Fsdp f;
    if (fsdp_init(&f, FSDP_FULL_SHARD, 0) != 0) return 1;
    int devices;
    fsdp_cudaCheck(&f.world, cudaGetDeviceCount(&devices));
    fsdp_cudaCheck(&f.world, cudaSetDevice(f.world.rank % devices));
    cudaStream_t stream;
    fsdp_cudaCheck(&f.world, cudaStreamCreate(&stream));
    FsdpComm host = f.world, staged = f.world; // copies of the host side (MPI or TCP): the checks' own broadcast, and
    staged.scratch = NULL;                     // the staged backend, which runs over it
    fsdp_staged_init(&staged, stream);
    int W = f.world.size, bad = 0;
    char why[320];
    int here = f.local_size ? f.local_size : W; // the ranks on this node (not told: all)
    int nccl_runs = fsdp_device_backend("auto", W, here, devices, 1, why, sizeof why) == FSDP_BACKEND_NCCL;
    if (nccl_runs) fsdp_nccl_init(&f.world, stream);
    else if (f.world.rank == 0) printf("SKIP NCCL collectives at W = %d: %d ranks share %d GPU(s) (NCCL refuses that)\n", W, here, devices);
    // a 7B decoder layer: 4 * 4096^2 attention + 3 * 4096 * 11008 MLP + 2 * 4096 norms
    size_t layer = 4ull * 4096 * 4096 + 3ull * 4096 * 11008 + 2 * 4096, S_big = fsdp_shard_size(quick ? (size_t)W << 20 : layer, W, 1);
    float *dev_a, *dev_b;
    fsdp_cudaCheck(&f.world, cudaMalloc(&dev_a, S_big * sizeof(float)));
    fsdp_cudaCheck(&f.world, cudaMalloc(&dev_b, (size_t)W * S_big * sizeof(float)));
    size_t sizes[] = {1, 3, 7, 1000, 4099, 1 << 20};
    FsdpComm *comms[2] = {&staged, nccl_runs ? &f.world : NULL};
    for (int i = 0; i < 2 && comms[i]; i++)
        for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
            int b = check(comms[i], &host, sizes[k], dev_a, dev_b);
            if (f.world.rank == 0)
                printf("%s %s collectives at W = %d, %zu elements per rank\n", b ? "FAIL" : "ok", i ? "NCCL" : "staged", W, sizes[k]);
            bad |= b;
        }
    fsdp_device_free(&staged);
    free(staged.scratch);
    cudaEvent_t t0, t1;
    fsdp_cudaCheck(&f.world, cudaEventCreate(&t0));
    fsdp_cudaCheck(&f.world, cudaEventCreate(&t1));
    for (int op = 0; nccl_runs && !quick && op < 2; op++) {
        const int reps = 10;
        for (int r = -1; r < reps; r++) { // r = -1 warms up
            if (r == 0) fsdp_cudaCheck(&f.world, cudaEventRecord(t0, stream));
            if (op == 0) fsdp_all_gather(&f.world, dev_b, dev_a, S_big);
            else fsdp_reduce_scatter(&f.world, dev_a, dev_b, S_big);
        }
        fsdp_cudaCheck(&f.world, cudaEventRecord(t1, stream));
        fsdp_cudaCheck(&f.world, cudaEventSynchronize(t1)); // elapsed time needs both events complete
        fsdp_barrier(&f.world);
        float ms;
        fsdp_cudaCheck(&f.world, cudaEventElapsedTime(&ms, t0, t1));
        // bus bandwidth as nccl-tests reports it: (W - 1) / W of the full buffer crosses each link
        double bytes = (double)W * S_big * sizeof(float) * (W - 1) / W;
        if (f.world.rank == 0)
            printf("%s of a 7B layer (%.0f MB fp32) at W = %d: %.2f ms, bus bandwidth %.1f GB/s\n", op ? "reduce-scatter" : "all-gather",
                   layer * 4.0 / 1e6, W, ms / reps, bytes / (ms / reps * 1e6));
    }
    fsdp_cudaCheck(&f.world, cudaEventDestroy(t0));
    fsdp_cudaCheck(&f.world, cudaEventDestroy(t1));
    fsdp_cudaCheck(&f.world, cudaFree(dev_a));
    fsdp_cudaCheck(&f.world, cudaFree(dev_b));
    fsdp_free(&f);
    bad |= cudaStreamDestroy(stream) != cudaSuccess; // after the communicators that use it
    fsdp_world_finalize();
    return bad;
}
