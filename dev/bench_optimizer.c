// Times the optimizers' host loops (support/optimizer_cpu.h) per element: the CPU
// trainer's step, and train_llama2cu's --cpu_offload step, which runs the same loops
// built by nvcc's host compiler. `make dev/bench_optimizer` builds it both ways
// (dev/bench_optimizer: cc with CFLAGS; dev/bench_optimizer_nvcc: nvcc's host flags).
// Results and what they mean for a 7B step: dev/bench_optimizer.md. Not a test.
//   dev/bench_optimizer [million elements (default 16)]
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "../support/optimizer_cpu.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
// *ns = nanoseconds an element of one call of step, the best of 5 after a warm-up call
#define TIME(ns, n, step) do { \
    step; \
    double best = 1e30; \
    for (int r = 0; r < 5; r++) { double t0 = now(); step; double dt = now() - t0; best = dt < best ? dt : best; } \
    *(ns) = best / (double)(n) * 1e9; \
} while (0)

int main(int argc, char **argv) {
    size_t n = (size_t)(argc > 1 ? atof(argv[1]) : 16) * (1 << 20) / ADAMW8BIT_BLOCK * ADAMW8BIT_BLOCK;
    float *p = (float *)mallocCheck(n * sizeof(float)), *g = (float *)mallocCheck(n * sizeof(float));
    float *m = (float *)callocCheck(n, sizeof(float)), *v = (float *)callocCheck(n, sizeof(float));
    uint8_t *mc = (uint8_t *)callocCheck(n, 1), *vc = (uint8_t *)callocCheck(n, 1);
    float *ma = (float *)callocCheck(n / ADAMW8BIT_BLOCK, sizeof(float)), *va = (float *)callocCheck(n / ADAMW8BIT_BLOCK, sizeof(float));
    float *pb = (float *)mallocCheck(n * sizeof(float)), *gb = (float *)mallocCheck(n * sizeof(float)); // (bf16 values)
    uint16_t *mb = (uint16_t *)callocCheck(n, 2), *vb = (uint16_t *)callocCheck(n, 2), *cb = (uint16_t *)callocCheck(n, 2);
    for (size_t i = 0; i < n; i++) {
        p[i] = (float)(splitmix64(i) >> 40) / 16777216.0f - 0.5f, g[i] = (float)(splitmix64(~i) >> 40) / 16777216.0f - 0.5f;
        pb[i] = bf16_round(p[i]), gb[i] = bf16_round(g[i]);
    }
    int t = 0;
    double clip, adamw, sgd, a8, ap, apk;
    TIME(&clip, n, clip_grads(g, n, 1e3, 1.0f, 1.0f));
    TIME(&adamw, n, adamw_update(p, g, m, v, n, ++t, 1e-5f, 0.9f, 0.999f, 1e-8f, 0.01f));
    TIME(&sgd, n, sgd_update(p, g, m, n, 0, 1e-5f, 0.9f, 1, 0.01f));
    t = 0;
    TIME(&a8, n, adamw8bit_update(p, g, mc, ma, vc, va, n, ++t, 1e-5, 0.9, 0.999, 1e-8, 0.01));
    t = 0;
    TIME(&ap, n, anyprecision_update(pb, gb, mb, vb, NULL, n, ++t, 1e-5, 0.9, 0.999, 1e-8, 0.01));
    t = 0;
    TIME(&apk, n, anyprecision_update(pb, gb, mb, vb, cb, n, ++t, 1e-5, 0.9, 0.999, 1e-8, 0.01));
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    printf("%zu M elements, %d threads; ns an element: clip_grads %.3f  adamw_update %.3f  sgd_update (nesterov) %.3f  "
           "adamw8bit_update %.3f  anyprecision_update %.3f (Kahan %.3f)\n", n >> 20, threads, clip, adamw, sgd, a8, ap, apk);
    printf("Llama-2-7B (6.74e9 parameters), clip + step: AdamW %.1f s, AdamW8bit %.1f s\n", (clip + adamw) * 6.738, (clip + a8) * 6.738);
    return 0;
}
