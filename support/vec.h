// vec.h: the CPU twin's vector arithmetic, in GCC/Clang vector extensions (no
// intrinsics, so the same code builds for AVX2, AVX-512 and machines without
// either). A vfloat is VLEN floats: one AVX-512 register, or one AVX2 register
// (and two SSE ones elsewhere). Beside the types: vexp, an e^x that vectorizes
// (libm's expf does not) and whose results do not depend on how many vectors it
// takes at once; vselect, C's ?: lane by lane; the sigmoid, and sums in double.
// support/matmul.h's GEMM, attention.h and train_llama2.c's cross-entropy and
// SwiGLU are built on them; dev/bench_cpu.md has what each choice measured.
#ifndef VEC_H
#define VEC_H
#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__)
#define VLEN 16
#else
#define VLEN 8
#endif
typedef float vfloat __attribute__((vector_size(VLEN * sizeof(float))));
typedef float vfloat_u __attribute__((vector_size(VLEN * sizeof(float)), aligned(4))); // any float's address
typedef int32_t vint __attribute__((vector_size(VLEN * sizeof(int32_t))));
typedef int32_t vint_u __attribute__((vector_size(VLEN * sizeof(int32_t)), aligned(4)));
typedef float vhalf __attribute__((vector_size(VLEN / 2 * sizeof(float))));
typedef double vdouble __attribute__((vector_size(VLEN / 2 * sizeof(double))));
#if defined(__GNUC__) && !defined(__clang__) // builds without AVX: GCC notes that these 32-byte vectors
#pragma GCC diagnostic ignored "-Wpsabi"    // pass differently there; static functions cross no ABI
#endif

// mask ? a : b, lane by lane (C has no ?: on vectors)
static inline vfloat vselect(vint mask, vfloat a, vfloat b) { return (vfloat)((mask & (vint)a) | (~mask & (vint)b)); }

// e^y for y <= 88, within 2 ulp (test/test_attention.c). y = k ln2 + r with
// |r| <= ln2/2; e^r by its Taylor series to r^7 (the rest is < 1e-8 relative);
// 2^k is written into the exponent bits. Below -87 (e^y < FLT_MIN) the result is
// 0, so masked scores (-inf) give exactly 0; e^0 is exactly 1; NaN stays NaN.
// vexp_n takes n <= VEXP_MAX vectors at once, each step for all of them before
// the next, so the core overlaps their chains of dependent operations; each
// vector's result is the same bits either way.
#define VEXP_MAX 4
static inline __attribute__((always_inline)) void vexp_n(vfloat *y, int n) {
    vint under[VEXP_MAX], two_k[VEXP_MAX];
    vfloat k[VEXP_MAX], r[VEXP_MAX], e[VEXP_MAX];
    for (int u = 0; u < n; u++) under[u] = y[u] < -87.0f;
    for (int u = 0; u < n; u++) y[u] = vselect(under[u], (vfloat){0} - 87.0f, y[u]); // keeps k in range
    // y / ln2 rounded: 1.5 * 2^23 has no fraction bits
    for (int u = 0; u < n; u++) k[u] = (y[u] * 1.44269504f + 12582912.0f) - 12582912.0f;
    // ln2 in two parts: k * the first is exact
    for (int u = 0; u < n; u++) r[u] = y[u] - k[u] * 0.693145751953125f - k[u] * 1.42860677e-6f;
    static const float taylor[] = {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f};
    for (int u = 0; u < n; u++) e[u] = (vfloat){0} + 1.0f / 5040;
    for (int t = 0; t < 7; t++)
        for (int u = 0; u < n; u++) e[u] = e[u] * r[u] + taylor[t];
    for (int u = 0; u < n; u++) two_k[u] = (__builtin_convertvector(k[u], vint) + 127) << 23;
    for (int u = 0; u < n; u++) y[u] = (vfloat)((vint)(e[u] * (vfloat)two_k[u]) & ~under[u]);
}
// (always inlined: as a call it costs more than its work)
static inline __attribute__((always_inline)) vfloat vexp(vfloat y) {
    vexp_n(&y, 1);
    return y;
}

// sigmoid(g) = 1 / (1 + e^-g) with e^-g's argument capped at 88 (vexp's domain; below
// g = -88 the sigmoid is < 1e-38 either way)
static inline vfloat vsigmoid(vfloat g) {
    vfloat m = (vfloat){0} - g;
    return 1.0f / (1.0f + vexp(vselect(m < 88.0f, m, (vfloat){0} + 88.0f)));
}

// the first n < VLEN floats of x as a vector padded with zeros, and back
static inline vfloat vload_tail(const float *x, int n) { vfloat v = {0}; for (int j = 0; j < n; j++) v[j] = x[j]; return v; }
static inline void vstore_tail(float *x, vfloat v, int n) { for (int j = 0; j < n; j++) x[j] = v[j]; }

// *lo, *hi += e's two halves in double: each lane's sum in order. Two vectors of the
// machine's width, not one of twice it, so that they stay in registers.
static inline void vsum_add(vdouble *lo, vdouble *hi, vfloat e) {
    vhalf h[2];
    memcpy(h, &e, sizeof h);
    *lo += __builtin_convertvector(h[0], vdouble);
    *hi += __builtin_convertvector(h[1], vdouble);
}
#endif
