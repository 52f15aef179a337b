// Times the CPU attention (attention_forward / attention_backward of
// attention.h, with train_llama2.c included whole) on a few shapes: whole sequences and a chunk
// of queries at the end of a longer KV prefix, GQA among them, and some again
// with a sliding window (W, Mistral's) or --s2_attn's groups (G = T / 4), whose
// skipped key tiles the time shows.
// Not a test.
//   make dev/bench_attention && OMP_NUM_THREADS=1 ./dev/bench_attention
//
// GFLOP/s counts model FLOPs, as the trainer's FLOP count does: the forward is
// 4 hd FLOPs per (query, visible key) pair (Q K^T and P V), the backward twice
// that (dV, dP, dQ, dK); recomputing the scores in the backward is not counted.
// Times are the process's CPU time, so GFLOP/s is per core and the numbers
// hold on a machine shared with other work (the wall time is printed beside).
#define TESTING
#include "../train_llama2.c"

typedef struct { int B, T, t0, len, NH, NKV, hd, W, G; } Shape; // W: sliding window, G: S2-Attn's groups; 0: none

static double seconds(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static float *random_floats(size_t n, uint64_t *state) {
    float *x = (float *)mallocCheck(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = 2.0f * rng_uniform(state) - 1.0f;
    return x;
}

int main(void) {
    const Shape shapes[] = {
        {4, 256, 0, 256, 6, 6, 48, 0, 0},         // a stories15M layer (dev/bench_cpu.py): hd 48
        {1, 1024, 0, 1024, 4, 4, 64, 0, 0},       // the dev/bench_chunked.py model, whole sequence
        {1, 1024, 768, 256, 4, 4, 64, 0, 0},      // ... its last chunk of 256
        {1, 4096, 0, 4096, 4, 4, 32, 0, 0},
        {1, 4096, 0, 4096, 4, 4, 32, 512, 0},     // ... with a sliding window of 512 keys
        {1, 4096, 0, 4096, 4, 4, 32, 0, 1024}, // ... with --s2_attn's groups of T / 4
        {1, 2048, 0, 2048, 8, 2, 128, 0, 0},      // GQA, 4 query heads per KV head
        {1, 2048, 0, 2048, 8, 2, 128, 0, 512}, // ... with --s2_attn's groups
        {1, 4096, 3840, 256, 32, 8, 128, 0, 0},   // a Llama-2-70B-like layer: the last chunk of 4k
        {1, 4096, 3840, 256, 32, 8, 128, 512, 0}, // ... with a sliding window of 512 keys
        {2, 2048, 1792, 256, 16, 4, 64, 0, 0},
        {1, 4096, 4095, 1, 32, 8, 128, 0, 0},     // generation: one query against a 4k KV cache
    };
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    printf("%d thread(s); GFLOP/s in model FLOPs (forward 4 hd per visible pair, backward 8 hd) per CPU second\n\n", threads);
    printf("| B | T | t0 | len | NH | NKV | hd | W | G | forward CPU ms (wall) | GFLOP/s per core | backward CPU ms (wall) | GFLOP/s per core |\n");
    printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        Shape s = shapes[si];
        Chunk ch = {s.B, s.T, s.t0, s.len, s.W, s.G};
        uint64_t state = 42 + si;
        size_t nq = (size_t)s.B * s.len * s.NH * s.hd, nkv = (size_t)s.B * s.T * s.NKV * s.hd;
        float *q = random_floats(nq, &state), *k = random_floats(nkv, &state), *v = random_floats(nkv, &state);
        float *dout = random_floats(nq, &state), *out = random_floats(nq, &state), *dq = random_floats(nq, &state);
        float *dk = (float *)callocCheck(nkv, sizeof(float)), *dv = (float *)callocCheck(nkv, sizeof(float));
        float *lse = (float *)mallocCheck((size_t)s.B * s.NH * s.len * sizeof(float));
        // visible (query, key) pairs: query i of head h sees keys attention_first_key .. t0 + i
        double pairs = 0;
        for (int h = 0; h < s.NH; h++)
            for (int i = 0; i < s.len; i++) pairs += s.t0 + i + 1 - attention_first_key(&ch, s.t0 + i, h, s.NH);
        pairs *= (double)s.B;
        double fwd = 4.0 * s.hd * pairs;
        // the best of a few runs (at least 1 s of work, at most 5 runs)
        double tf = 1e30, tb = 1e30, wf = 0, wb = 0, spent = 0;
        for (int rep = 0; rep < 5 && (rep == 0 || spent < 1.0); rep++) {
            double c0 = seconds(CLOCK_PROCESS_CPUTIME_ID), w0 = seconds(CLOCK_MONOTONIC);
            attention_forward(out, lse, q, k, v, &ch, s.NH, s.NKV, s.hd);
            double c1 = seconds(CLOCK_PROCESS_CPUTIME_ID), w1 = seconds(CLOCK_MONOTONIC);
            attention_backward(dq, dk, dv, dout, out, lse, q, k, v, &ch, s.NH, s.NKV, s.hd);
            double c2 = seconds(CLOCK_PROCESS_CPUTIME_ID), w2 = seconds(CLOCK_MONOTONIC);
            if (c1 - c0 < tf) tf = c1 - c0, wf = w1 - w0;
            if (c2 - c1 < tb) tb = c2 - c1, wb = w2 - w1;
            spent += c2 - c0;
        }
        printf("| %d | %d | %d | %d | %d | %d | %d | %d | %d | %.1f (%.1f) | %.2f | %.1f (%.1f) | %.2f |\n", s.B, s.T, s.t0,
               s.len, s.NH, s.NKV, s.hd, s.W, s.G, tf * 1e3, wf * 1e3, fwd / tf * 1e-9, tb * 1e3, wb * 1e3, 2 * fwd / tb * 1e-9);
        fflush(stdout);
        free(q), free(k), free(v), free(dout), free(out), free(dq), free(dk), free(dv), free(lse);
    }
    return 0;
}
