// matmul.h: the CPU twin's matrix products, the counterpart of support/matmul.cuh:
// matmul_forward and matmul_backward (a linear layer, torch's weight layout) on
// one GEMM, C (M, N) = [C +] alpha * op(A) (M, K) @ op(B) (K, N). Blocks of A and
// B are packed into contiguous strips (MR rows of A, NR columns of B) so that the
// kernel streams through memory and keeps an MR x NR tile of C in registers: MR
// rows of two vectors (support/vec.h), 12 accumulators, which fit AVX2's 16 vector
// registers (or AVX-512's 32, at twice the width). Each element of C is summed by
// one thread in a fixed order, so results do not depend on the number of threads
// (test/test_trainer.c). dev/bench_cpu.md has the measurements behind each choice.
#ifndef MATMUL_H
#define MATMUL_H
#include <string.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "utils.h"
#include "vec.h"

#define GEMM_MR 6
#define GEMM_NR (2 * VLEN)
#define GEMM_KC 320
#define GEMM_MC 96
#define GEMM_NC 256

static float *gemm_scratch = NULL;
static size_t gemm_scratch_size = 0;

// c (MR, NR) = A (MR, n) @ B (n, NR) in registers, each element summed over k in order.
// A(i, k) = a[i * ars + k * aks] (a packed strip: ars = 1, aks = MR; or a plain matrix
// either way round, for attention); row k of B at b + k * ldb, vector-aligned.
// Rows i >= rows of A are not read (they repeat the last row), and their c is not used.
static inline void gemm_tile(vfloat c[GEMM_MR][2], int rows, int n, const float *a, int ars, int aks, const float *b,
                             int ldb) {
    const float *ar[GEMM_MR];
    for (int i = 0; i < GEMM_MR; i++) ar[i] = a + (size_t)(i < rows ? i : rows - 1) * ars;
    for (int i = 0; i < GEMM_MR; i++) c[i][0] = c[i][1] = (vfloat){0}; // (not memset: a library call)
    for (int k = 0; k < n; k++) {
        vfloat b0 = *(const vfloat *)(b + (size_t)k * ldb), b1 = *(const vfloat *)(b + (size_t)k * ldb + VLEN);
        for (int i = 0; i < GEMM_MR; i++) {
            float av = ar[i][(size_t)k * aks];
            c[i][0] += av * b0;
            c[i][1] += av * b1;
        }
    }
}

// C (mr, nr) = [C +] a (kc, MR strip) @ b (kc, NR strip), b packed, a packed (lda 0) or
// read in place, rows lda apart. Storing instead of adding on a product's first block of
// k spares the memset of C and a read of it from memory.
static inline void gemm_kernel(int kc, const float *a, int lda, const float *b, float *C, int ldc, int mr, int nr, int add) {
    vfloat c[GEMM_MR][2];
    if (lda) gemm_tile(c, mr, kc, a, lda, 1, b, GEMM_NR);
    else gemm_tile(c, GEMM_MR, kc, a, 1, GEMM_MR, b, GEMM_NR);
    if (mr == GEMM_MR && nr == GEMM_NR) {
        for (int i = 0; i < GEMM_MR; i++) {
            vfloat_u *ci = (vfloat_u *)(C + (size_t)i * ldc);
            ci[0] = add ? ci[0] + c[i][0] : c[i][0];
            ci[1] = add ? ci[1] + c[i][1] : c[i][1];
        }
        return;
    }
    float tile[GEMM_MR][GEMM_NR];
    memcpy(tile, c, sizeof tile);
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) C[(size_t)i * ldc + j] = add ? C[(size_t)i * ldc + j] + tile[i][j] : tile[i][j];
}

// dst[k][i] = scale * X(i0 + i, k0 + k) for a strip of w rows (i) of a matrix X (n, K) that is
// stored row-major (X[i * ld + k]) when rowmajor, else transposed (X[k * ld + i])
static void gemm_pack(float *dst, const float *X, int ld, int rowmajor, size_t i0, size_t n, int k0, int kc, int w,
                      float scale) {
    int wn = i0 + w <= n ? w : (int)(n - i0); // rows that exist; the rest of the strip is zero padding
    if (rowmajor) {
        // a transpose, 8 k at a time: each row's 8 floats are one read along memory (one k at a
        // time, GCC gathers the strip's w rows element by element)
        const float *x = X + i0 * ld + k0;
        int k = 0;
        for (; k + 8 <= kc; k += 8)
            for (int i = 0; i < wn; i++)
                for (int kk = 0; kk < 8; kk++) dst[(k + kk) * w + i] = scale * x[(size_t)i * ld + k + kk];
        for (; k < kc; k++)
            for (int i = 0; i < wn; i++) dst[k * w + i] = scale * x[(size_t)i * ld + k];
        for (k = 0; k < kc; k++)
            for (int i = wn; i < w; i++) dst[k * w + i] = 0.0f;
    } else {
        for (int k = 0; k < kc; k++) {
            const float *x = X + (size_t)(k0 + k) * ld + i0;
            for (int i = 0; i < wn; i++) dst[k * w + i] = scale * x[i];
            for (int i = wn; i < w; i++) dst[k * w + i] = 0.0f;
        }
    }
}

// K runs in the fewest blocks of at most GEMM_KC, of equal depth: the head's K = 288 in
// one block, not 256 + 32 (a second pass over its 32 MB of logits for little work)
static int gemm_kc(int K) {
    int blocks = (K + GEMM_KC - 1) / GEMM_KC;
    return (K + blocks - 1) / blocks;
}

// the packing scratch of an (M, N, K) product: strips of A, then from a cache line on
// (vector loads) strips of B, as deep as a block of k (at most, so that the count grows
// with each of M, N, K)
static size_t gemm_a_floats(size_t M, size_t K) {
    return ((M + GEMM_MR - 1) / GEMM_MR * GEMM_MR * (K < GEMM_KC ? K : GEMM_KC) + 15) / 16 * 16;
}
static size_t gemm_scratch_floats(size_t M, size_t N, size_t K) {
    return gemm_a_floats(M, K) + (N + GEMM_NR - 1) / GEMM_NR * GEMM_NR * (K < GEMM_KC ? K : GEMM_KC);
}

// the packing scratch grown to at least n floats. model_alloc reserves the most any product
// of a step needs before the first: grown step by step, the freed smaller scratches would
// stay resident in glibc's heap, outside the memory plan.
static void gemm_reserve(size_t n) {
    if (n <= gemm_scratch_size) return;
    free(gemm_scratch);
    gemm_scratch = (float *)aligned_alloc(64, n * sizeof(float)); // vector loads of packed B
    if (!gemm_scratch) die("out of memory for matmul scratch (%zu floats)", n);
    gemm_scratch_size = n;
}

// B's strips for the block of k at k0, kc deep: bp[strip][k][j], as gemm's kernel reads them
static void gemm_pack_b_block(float *bp, int N, const float *B, int ldb, int transB, int k0, int kc) {
    #pragma omp parallel for
    for (size_t s = 0; s < (size_t)(N + GEMM_NR - 1) / GEMM_NR; s++)
        gemm_pack(bp + s * GEMM_NR * kc, B, ldb, transB, s * GEMM_NR, (size_t)N, k0, kc, GEMM_NR, 1.0f);
}

// B (K, N) packed whole, every block of k in turn (a product that runs many times on one B
// packs it once: the output head, used by every row of the batch)
static size_t gemm_packed_b_floats(size_t N, size_t K) { return (N + GEMM_NR - 1) / GEMM_NR * GEMM_NR * K; }
static void gemm_pack_b(float *bp, int N, int K, const float *B, int ldb, int transB) {
    int KC = gemm_kc(K);
    for (int k0 = 0; k0 < K; k0 += KC)
        gemm_pack_b_block(bp + gemm_packed_b_floats(N, k0), N, B, ldb, transB, k0, K - k0 < KC ? K - k0 : KC);
}

// C's rows i0 .. i1 - 1 and columns j0 .. j1 - 1 (multiples of MR and NR) of one block of k,
// kc deep, tile by tile: A's row i at a + i * astep, B's column j at bp + j * kc. A is
// packed strips (astep: kc, or a block's full depth where strips stay put between
// blocks), or read in place (astep: its row stride).
static void gemm_block(int M, int N, int kc, const float *a, size_t astep, int in_place, const float *bp, float *C,
                       int ldc, size_t i0, size_t i1, size_t j0, size_t j1, int add) {
    for (size_t j = j0; j < j1; j += GEMM_NR)
        for (size_t i = i0; i < i1; i += GEMM_MR) {
            int mr = M - (int)i < GEMM_MR ? M - (int)i : GEMM_MR;
            int nr = N - (int)j < GEMM_NR ? N - (int)j : GEMM_NR;
            gemm_kernel(kc, a + i * astep, in_place ? (int)astep : 0, bp + j * kc, C + i * ldc + j, ldc, mr, nr, add);
        }
}

// Where packing A would only copy it (alpha 1, A's rows along memory: the layers' inputs in
// the forward, the output gradients in the backward), the kernel reads A in place, MR rows
// lda apart: the same bits, a copy of A fewer.
static int gemm_a_in_place(float alpha, int transA) { return alpha == 1.0f && !transA; }

// gemm with B packed whole beforehand (Bp): each thread takes its share of A's strips of
// rows and runs them through every block of k alone, packing its own strips of A, so the
// threads never wait for each other between blocks (the output head's backward has many
// blocks of k, V / KC, and few uneven tasks in each). The same floats meet in the same
// order as in gemm.
static void gemm_rows(int M, int N, int K, float alpha, const float *A, int lda, int transA, const float *Bp,
                      float *C, int ldc, int accumulate) {
    size_t strips = (size_t)(M + GEMM_MR - 1) / GEMM_MR, Np = (size_t)(N + GEMM_NR - 1) / GEMM_NR * GEMM_NR;
    int KC = gemm_kc(K), in_place = gemm_a_in_place(alpha, transA);
    float *ap = gemm_scratch; // rows i.. of a block at ap + i * KC (not kc: the last block may be shorter
                              // while another thread still reads the one before): each thread its own
    #pragma omp parallel
    {
        size_t t = 0, nt = 1;
#ifdef _OPENMP
        t = omp_get_thread_num(), nt = omp_get_num_threads();
#endif
        size_t i0 = strips * t / nt * GEMM_MR, i1 = strips * (t + 1) / nt * GEMM_MR; // this thread's rows
        for (int k0 = 0; k0 < K; k0 += KC) {
            int kc = K - k0 < KC ? K - k0 : KC, add = accumulate || k0 > 0;
            const float *bp = Bp + Np * k0;
            if (!in_place)
                for (size_t i = i0; i < i1; i += GEMM_MR)
                    gemm_pack(ap + i * KC, A, lda, !transA, i, (size_t)M, k0, kc, GEMM_MR, alpha);
            const float *a = in_place ? A + k0 : ap; // row i at a + i * astep
            size_t astep = in_place ? (size_t)lda : (size_t)KC;
            // blocks of NC columns of B (in L2), within them of MC rows of A, as gemm's
            for (size_t jb = 0; jb < Np; jb += GEMM_NC)
                for (size_t ib = i0; ib < i1; ib += GEMM_MC)
                    gemm_block(M, N, kc, a, astep, in_place, bp, C, ldc, ib, ib + GEMM_MC < i1 ? ib + GEMM_MC : i1, jb,
                               jb + GEMM_NC < Np ? jb + GEMM_NC : Np, add);
        }
    }
}

// C (M, N) = [C +] alpha * op(A) (M, K) @ op(B) (K, N); Bp: B packed by gemm_pack_b, or NULL
// to pack it here (the same floats either way)
static void gemm(int M, int N, int K, float alpha, const float *A, int lda, int transA,
                 const float *B, int ldb, int transB, const float *Bp, float *C, int ldc, int accumulate) {
    if (M == 0 || N == 0) return;
    if (K == 0) {
        if (!accumulate)
            for (int i = 0; i < M; i++) memset(C + (size_t)i * ldc, 0, (size_t)N * sizeof(float));
        return;
    }
    size_t Mp = (size_t)(M + GEMM_MR - 1) / GEMM_MR * GEMM_MR;
    size_t Np = (size_t)(N + GEMM_NR - 1) / GEMM_NR * GEMM_NR;
    gemm_reserve(gemm_scratch_floats(M, N, K));
    if (Bp) { gemm_rows(M, N, K, alpha, A, lda, transA, Bp, C, ldc, accumulate); return; }
    int KC = gemm_kc(K), in_place = gemm_a_in_place(alpha, transA);
    float *ap = gemm_scratch, *bp = gemm_scratch + gemm_a_floats(M, K);
    for (int k0 = 0; k0 < K; k0 += KC) {
        int kc = K - k0 < KC ? K - k0 : KC, add = accumulate || k0 > 0;
        // pack alpha * A into strips of MR rows, ap[strip][k][i], and B into strips of
        // NR columns, bp[strip][k][j]; padding is zero. Reads run along memory.
        if (!in_place) {
            #pragma omp parallel for
            for (size_t s = 0; s < Mp / GEMM_MR; s++)
                gemm_pack(ap + s * GEMM_MR * kc, A, lda, !transA, s * GEMM_MR, (size_t)M, k0, kc, GEMM_MR, alpha);
        }
        gemm_pack_b_block(bp, N, B, ldb, transB, k0, kc);
        const float *a = in_place ? A + k0 : ap; // row i at a + i * astep
        size_t astep = in_place ? (size_t)lda : (size_t)kc;
        int nbm = (int)((Mp + GEMM_MC - 1) / GEMM_MC), nbn = (int)((Np + GEMM_NC - 1) / GEMM_NC);
        #pragma omp parallel for collapse(2) schedule(dynamic)
        for (int bn = 0; bn < nbn; bn++)
            for (int bm = 0; bm < nbm; bm++) {
                size_t j1 = (size_t)(bn + 1) * GEMM_NC < Np ? (size_t)(bn + 1) * GEMM_NC : Np;
                size_t i1 = (size_t)(bm + 1) * GEMM_MC < Mp ? (size_t)(bm + 1) * GEMM_MC : Mp;
                gemm_block(M, N, kc, a, astep, in_place, bp, C, ldc, (size_t)bm * GEMM_MC, i1, (size_t)bn * GEMM_NC, j1, add);
            }
    }
}

// out (N, O) = [out +] alpha * inp (N, I) @ weight (O, I)^T      (torch Linear layout)
static void matmul_forward(float *out, const float *inp, const float *weight, int N, int I, int O,
                           float alpha, int accumulate) {
    gemm(N, O, I, alpha, inp, I, 0, weight, I, 1, NULL, out, O, accumulate);
}

// dinp (N, I) += alpha * dout (N, O) @ weight (O, I);  dweight (O, I) += alpha * dout^T @ inp
// (either output may be NULL: frozen weights need no dweight)
static void matmul_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                            const float *weight, int N, int I, int O, float alpha) {
    if (dinp) gemm(N, I, O, alpha, dout, O, 0, weight, I, 0, NULL, dinp, I, 1);
    if (dweight) gemm(O, I, N, alpha, dout, O, 1, inp, I, 0, NULL, dweight, I, 1);
}
#endif
