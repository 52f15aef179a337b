// attention.h: the CPU twin's attention, forward and backward, for a chunk of
// queries against the KV carry (docs/chunked.md), causal with the mask aligned
// bottom-right: query i of the chunk sits at position t0 + i and sees keys
// attention_first_key .. t0 + i (chunk.h: 0, a sliding window's start, or
// the start of the query's group under shifted sparse attention, per query head).
// GQA: query head h reads key/value head h / (NH / NKV).
// Like flash attention it keeps only each row's log-sum-exp, not the (len, t0 + len)
// probabilities, and the backward recomputes them; attention.cuh is its CUDA twin.
//   q (B, len, NH, hd); k, v (B, T, NKV, hd) with rows < t0 + len filled (the
//   rest is never read) -> out (B, len, NH, hd), lse (B, NH, len)
#ifndef ATTENTION_H
#define ATTENTION_H
#include <math.h>
#include <string.h>
#include "support/utils.h"
#include "support/vec.h"
#include "support/matmul.h"
#include "chunk.h" // Chunk and the attention mask

// Tiled for the caches and the vector units: ATT_QT queries of one head meet
// ATT_KT keys at a time, and every product is a gemm_tile. The scores are kept
// transposed, S^T (keys, queries), so that a query's softmax runs down a column:
// the loops vectorize across queries, and each query's max and sum take its keys
// in order. Key tiles start at multiples of ATT_KT from position 0, so a query
// meets the same tiles in the same order wherever its chunk starts or ends; the
// keys it does not see (after it, or before its first key, in its own tiles or in
// whole tiles that other queries of its tile need) add exact zeros and scale by
// exactly 1. So chunked attention equals whole-sequence attention bit for bit
// (test/test_attention.c, test_chunked.c). Key tiles wholly before the first key
// of every query of a query tile are skipped: with a window, the work per query is
// O(W), not O(position); with shifted sparse attention O(G).
#define ATT_QT 64 // queries per tile, a multiple of GEMM_NR (vectors run across queries)
#define ATT_KT 64 // keys per tile

// x[j][i] = e^(x[j][i] - sub[i]) for rows j of w floats (vector-aligned), arguments <= 88
static void attention_exp(float *x, int rows, int w, const float *sub) {
    int NV = w / VLEN;
    vfloat *xv = (vfloat *)x;
    const vfloat *subv = (const vfloat *)sub;
    for (int j = 0; j < rows; j++)
        for (int v = 0; v < NV; v++) xv[j * NV + v] = vexp(xv[j * NV + v] - subv[v]);
}

static float *attention_scratch(size_t n) {
    float *p = (float *)aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64); // vector loads and stores
    if (!p) die("out of memory for attention scratch (%zu floats)", n);
    return p;
}

// dst (rows, w) <- rows r0 .. r0 + rows - 1 of a tensor whose row r is hd floats at
// src + r * stride; zero past row n and past column hd
static void attention_load_rows(float *dst, int w, const float *src, size_t stride, int r0, int rows, int n, int hd) {
    for (int r = 0; r < rows; r++) {
        float *o = dst + (size_t)r * w;
        int valid = r0 + r < n;
        if (valid) memcpy(o, src + (size_t)(r0 + r) * stride, hd * sizeof(float));
        memset(o + (valid ? hd : 0), 0, (w - (valid ? hd : 0)) * sizeof(float));
    }
}
// dst (hd, w) <- scale * rows r0 .. r0 + w - 1 of such a tensor, transposed; column by
// column, so that the stores run in order (row by row, a row's hd scattered stores hold
// back the next rows' loads)
static void attention_load_cols(float *dst, int w, const float *src, size_t stride, int r0, int n, int hd, float scale) {
    int rows = n - r0 < w ? n - r0 : w;
    for (int d = 0; d < hd; d++) {
        for (int i = 0; i < rows; i++) dst[(size_t)d * w + i] = scale * src[(size_t)(r0 + i) * stride + d];
        for (int i = rows; i < w; i++) dst[(size_t)d * w + i] = 0.0f;
    }
}

// C (M, N) = [C +] A (M, n) @ B (n, N) in register tiles; N a multiple of GEMM_NR, rows of
// B and C vector-aligned; A(i, k) = a[i * ars + k * aks] as in gemm_tile. Where A's row i
// is zero outside k = klo[i] .. khi[i] - 1 (both non-decreasing in i; NULL: 0, n), a block
// of rows sums only over its rows' union of those: the zeros it leaves out add exact
// zeros (a sum that starts at +0 stays +0 through +-0 terms), so C is bit for bit the same.
static void attention_matmul(float *c, int ldc, const float *a, int ars, int aks, const float *b, int ldb, int M, int N,
                             int n, int accumulate, const int *klo, const int *khi) {
    for (int i = 0; i < M; i += GEMM_MR)
        for (int j = 0; j < N; j += GEMM_NR) {
            vfloat t[GEMM_MR][2];
            int rows = M - i < GEMM_MR ? M - i : GEMM_MR;
            int k0 = klo ? klo[i] : 0, k1 = khi ? khi[i + rows - 1] : n;
            gemm_tile(t, rows, k1 - k0, a + (size_t)i * ars + (size_t)k0 * aks, ars, aks, b + (size_t)k0 * ldb + j, ldb);
            for (int r = 0; r < rows; r++) {
                vfloat *cr = (vfloat *)(c + (size_t)(i + r) * ldc + j);
                cr[0] = accumulate ? cr[0] + t[r][0] : t[r][0];
                cr[1] = accumulate ? cr[1] + t[r][1] : t[r][1];
            }
        }
}

// The width of the query tiles: ATT_QT, or for a short chunk (generation runs one
// query at a time) the fewest vectors that hold it.
static int attention_tile_width(int len) {
    return len < ATT_QT ? (len + GEMM_NR - 1) / GEMM_NR * GEMM_NR : ATT_QT;
}
// The query tile at row i0 of the chunk for query head h of NH, w wide: qpos, each
// query's position, and qlo, the first key it sees (rows past len, the padding,
// repeat the last query). Returns the last key the tile sees, and in *first the
// start of the first key tile it sees (the one holding the first query's first key).
static int attention_query_tile(int *qpos, int *qlo, int w, const Chunk *ch, int i0, int h, int NH, int *first) {
    for (int i = 0; i < w; i++) {
        qpos[i] = ch->t0 + (i0 + i < ch->len ? i0 + i : ch->len - 1);
        qlo[i] = attention_first_key(ch, qpos[i], h, NH);
    }
    *first = qlo[0] / ATT_KT * ATT_KT;
    return qpos[w - 1];
}

// The causal shape of the key tile at s0 against a query tile (qpos as above): cols[j],
// from which column S^T's row j (key s0 + j) is computed, a multiple of GEMM_NR: every
// query in the blocks of GEMM_NR before it comes before the key; keys[i], how many of the
// tile's keys query i may see (the rest come after it). What lies outside is masked, so
// its products are skipped, and P, dS are set to 0 there (on the diagonal tiles of whole
// sequences, about a third of the score products and nearly half of P V's). The results
// are bit for bit the same (see attention_matmul).
static void attention_key_tile(int *cols, int *keys, int w, int s0, const int *qpos) {
    for (int j = 0, i = 0; j < ATT_KT; j++) {
        while (i < w && qpos[i] < s0 + j) i++;
        cols[j] = i / GEMM_NR * GEMM_NR;
    }
    for (int i = 0; i < w; i++) {
        int n = qpos[i] - s0 + 1;
        keys[i] = n < 0 ? 0 : n > ATT_KT ? ATT_KT : n;
    }
}
// The leading rows of a key tile that every query block sees (cols 0): all of them on
// the tiles off the diagonal, which then run as one product and one exp pass
static int attention_full_rows(const int *cols) {
    int j = 0;
    while (j < ATT_KT && cols[j] == 0) j++;
    return j;
}
// c (ATT_KT, w) = A (ATT_KT, n) @ B (n, w), A's row j at a + j * lda, row j of c from
// column cols[j] on (a block of GEMM_MR rows from its first row's: the columns its
// other rows do not need are computed but not used)
static void attention_matmul_st(float *c, int w, const float *a, int lda, const float *b, int n, const int *cols) {
    int full = attention_full_rows(cols);
    attention_matmul(c, w, a, lda, 1, b, w, full, w, n, 0, NULL, NULL);
    for (int j = full; j < ATT_KT; j += GEMM_MR) {
        int rows = ATT_KT - j < GEMM_MR ? ATT_KT - j : GEMM_MR;
        attention_matmul(c + (size_t)j * w + cols[j], w, a + (size_t)j * lda, lda, 1, b + cols[j], w, rows, w - cols[j],
                         n, 0, NULL, NULL);
    }
}
// st (ATT_KT, w) = S^T: the scores of the key tile at position s0 (kt: its rows,
// (ATT_KT, hdp)) against a query tile (qt: scale * its rows transposed, (hd, w)),
// -inf where the key comes after the query or before its first key; row j only from
// column cols[j] on
static void attention_scores(float *st, const float *kt, const float *qt, int w, int hd, int hdp, int s0,
                             const int *qpos, const int *qlo, const int *cols) {
    attention_matmul_st(st, w, kt, hdp, qt, hd, cols);
    if (s0 + ATT_KT - 1 <= qpos[0] && s0 >= qlo[w - 1]) return; // every query sees every key
    for (int j = 0; j < ATT_KT; j++) { // in explicit vectors (faster than GCC's own)
        vint key = (vint){0} + (s0 + j);
        for (int i = cols[j]; i < w; i += VLEN) {
            vint masked = (key > *(const vint_u *)(qpos + i)) | (key < *(const vint_u *)(qlo + i));
            vfloat *s = (vfloat *)(st + (size_t)j * w + i);
            *s = vselect(masked, (vfloat){0} - INFINITY, *s);
        }
    }
}
// P^T from S^T in place: row j = e^(s - sub) from column cols[j] on, 0 before it
static void attention_probs(float *st, int w, const float *sub, const int *cols) {
    int full = attention_full_rows(cols);
    attention_exp(st, full, w, sub);
    for (int j = full; j < ATT_KT; j++) {
        float *row = st + (size_t)j * w;
        for (int i = 0; i < cols[j]; i += VLEN) *(vfloat *)(row + i) = (vfloat){0};
        attention_exp(row + cols[j], 1, w - cols[j], sub + cols[j]);
    }
}

// Each query tile walks its key tiles with an online softmax: m, the running
// max, and l, the running sum of e^(s - m); o, the running sum of e^(s - m) v,
// is rescaled whenever m grows. One thread owns each (b, h, query tile). With a
// window or groups, a query may meet tiles before its first key: m stays -inf, and
// it subtracts 0 instead (-inf - -inf would be NaN), so l and o stay exactly 0.
static void attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                              const Chunk *ch, int NH, int NKV, int hd) {
    float scale = 1.0f / sqrtf((float)hd);
    int B = ch->B, len = ch->len, T = ch->T, group = NH / NKV, kv_end = ch->t0 + len;
    int w = attention_tile_width(len), ntiles = (len + w - 1) / w, hdp = (hd + GEMM_NR - 1) / GEMM_NR * GEMM_NR;
    #pragma omp parallel
    {
        float *qt = attention_scratch((size_t)(hd + ATT_KT + 5) * w + (size_t)(w + 2 * ATT_KT) * hdp);
        float *st = qt + (size_t)hd * w;         // (ATT_KT, w) scores, then probabilities
        float *m = st + (size_t)ATT_KT * w;      // (w) the running max
        float *mnew = m + w, *alpha = mnew + w;  // (w) the max with this tile; how much o shrinks
        float *sub = alpha + w;                  // (w) mnew, or 0 where it is -inf
        float *l = sub + w;                      // (w) the running sum
        float *o = l + w;                        // (w, hdp)
        float *kt = o + (size_t)w * hdp;         // (ATT_KT, hdp)
        float *vt = kt + (size_t)ATT_KT * hdp;   // (ATT_KT, hdp)
        vfloat *stv = (vfloat *)st, *mv = (vfloat *)m, *mnewv = (vfloat *)mnew, *alphav = (vfloat *)alpha;
        vfloat *lv = (vfloat *)l, *ov = (vfloat *)o;
        int NV = w / VLEN;
        int *qpos = (int *)mallocCheck((3 * w + ATT_KT) * sizeof(int)), *qlo = qpos + w, *keys = qlo + w, *cols = keys + w;
        #pragma omp for collapse(3) schedule(dynamic)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < NH; h++)
                for (int tile = ntiles - 1; tile >= 0; tile--) { // the last tiles see the most keys: start them first
                    int i0 = tile * w, first, last = attention_query_tile(qpos, qlo, w, ch, i0, h, NH, &first);
                    const float *qb = q + ((size_t)b * len * NH + h) * hd;
                    const float *kb = k + ((size_t)b * T * NKV + h / group) * hd, *vb = v + (kb - k);
                    attention_load_cols(qt, w, qb, (size_t)NH * hd, i0, len, hd, scale);
                    for (int i = 0; i < w; i++) m[i] = -INFINITY, l[i] = 0.0f;
                    memset(o, 0, (size_t)w * hdp * sizeof(float));
                    for (int s0 = first; s0 <= last; s0 += ATT_KT) {
                        attention_key_tile(cols, keys, w, s0, qpos);
                        attention_load_rows(kt, hdp, kb, (size_t)NKV * hd, s0, ATT_KT, kv_end, hd);
                        attention_load_rows(vt, hdp, vb, (size_t)NKV * hd, s0, ATT_KT, kv_end, hd);
                        attention_scores(st, kt, qt, w, hd, hdp, s0, qpos, qlo, cols);
                        // the loops across queries in vectors: GCC's Zen tuning would give them half-width ones
                        for (int v = 0; v < NV; v++) mnewv[v] = mv[v];
                        for (int j = 0; j < ATT_KT; j++)
                            for (int v = cols[j] / VLEN; v < NV; v++)
                                mnewv[v] = vselect(stv[j * NV + v] > mnewv[v], stv[j * NV + v], mnewv[v]);
                        for (int i = 0; i < w; i++) sub[i] = mnew[i] == -INFINITY ? 0.0f : mnew[i];
                        memcpy(alpha, m, w * sizeof(float));
                        attention_exp(alpha, 1, w, sub);
                        attention_probs(st, w, sub, cols); // P^T, for the new max
                        memcpy(m, mnew, w * sizeof(float));
                        for (int v = 0; v < NV; v++) lv[v] *= alphav[v];
                        for (int j = 0; j < ATT_KT; j++)
                            for (int v = cols[j] / VLEN; v < NV; v++) lv[v] += stv[j * NV + v];
                        for (int i = 0; i < w; i++)
                            for (int d = 0; d < hdp / VLEN; d++) ov[(size_t)i * (hdp / VLEN) + d] *= alpha[i];
                        // o (w, hdp) += P (w, ATT_KT) @ the value rows; P(i, j) = st[j * w + i]
                        attention_matmul(o, hdp, st, 1, w, vt, hdp, w, hdp, ATT_KT, 1, NULL, keys);
                    }
                    for (int i = 0; i < w && i0 + i < len; i++) {
                        float *oi = out + (((size_t)b * len + i0 + i) * NH + h) * hd;
                        for (int d = 0; d < hd; d++) oi[d] = o[(size_t)i * hdp + d] / l[i];
                        lse[((size_t)b * NH + h) * len + i0 + i] = m[i] + logf(l[i]);
                    }
                }
        free(qt), free(qpos);
    }
}

// With P = exp(S - lse) recomputed and D_i = dout_i . out_i (= sum_s P_is dP_is):
// dV_s += P_is dout_i, dS_is = P_is (dout_i . v_s - D_i), dq_i = scale sum_s dS_is k_s,
// dK_s += scale dS_is q_i. dq (B, len, NH, hd) is overwritten; dk, dv (B, T, NKV, hd)
// are added into for every position < t0 + len that a query of the chunk sees:
// the chunk's own rows and the dKV carry of earlier chunks (key tiles wholly
// before every first key of a query tile are skipped: they would add exact zeros).
// One thread owns each (b, kv head) and walks the query tiles of every head of
// its group, so dk, dv need no reduction across threads (the price: the work
// splits B * NKV ways).
static void attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                               const float *q, const float *k, const float *v, const Chunk *ch, int NH, int NKV, int hd) {
    float scale = 1.0f / sqrtf((float)hd);
    int B = ch->B, len = ch->len, T = ch->T, group = NH / NKV, kv_end = ch->t0 + len;
    int w = attention_tile_width(len), hdp = (hd + GEMM_NR - 1) / GEMM_NR * GEMM_NR;
    size_t q_stride = (size_t)NH * hd, kv_stride = (size_t)NKV * hd;
    #pragma omp parallel
    {
        float *qt = attention_scratch((size_t)(2 * hd + 2 * ATT_KT + 2) * w + (size_t)(3 * w + 4 * ATT_KT) * hdp);
        float *dot = qt + (size_t)hd * w;          // (hd, w) dout transposed
        float *st = dot + (size_t)hd * w;          // (ATT_KT, w) scores, then P^T
        float *dst = st + (size_t)ATT_KT * w;      // (ATT_KT, w) dP^T, then scale * dS^T
        float *lsei = dst + (size_t)ATT_KT * w;    // (w) each query's lse
        float *D = lsei + w;                       // (w) each query's dout . out
        float *qr = D + w;                         // (w, hdp) the queries, rows
        float *dor = qr + (size_t)w * hdp;         // (w, hdp) dout, rows
        float *dqt = dor + (size_t)w * hdp;        // (w, hdp)
        float *kt = dqt + (size_t)w * hdp;         // (ATT_KT, hdp) each: keys, values, their gradients
        float *vt = kt + (size_t)ATT_KT * hdp, *dkt = vt + (size_t)ATT_KT * hdp, *dvt = dkt + (size_t)ATT_KT * hdp;
        vfloat *stv = (vfloat *)st, *dstv = (vfloat *)dst, *Dv = (vfloat *)D;
        int NV = w / VLEN;
        int *qpos = (int *)mallocCheck((3 * w + ATT_KT) * sizeof(int)), *qlo = qpos + w, *keys = qlo + w, *cols = keys + w;
        #pragma omp for collapse(2) schedule(dynamic)
        for (int b = 0; b < B; b++)
            for (int kh = 0; kh < NKV; kh++) {
                size_t kv0 = ((size_t)b * T * NKV + kh) * hd;
                for (int h = kh * group; h < (kh + 1) * group; h++)
                    for (int i0 = 0; i0 < len; i0 += w) {
                        size_t q0 = ((size_t)b * len * NH + h) * hd;
                        int first, last = attention_query_tile(qpos, qlo, w, ch, i0, h, NH, &first);
                        attention_load_cols(qt, w, q + q0, q_stride, i0, len, hd, scale);
                        attention_load_cols(dot, w, dout + q0, q_stride, i0, len, hd, 1.0f);
                        attention_load_rows(qr, hdp, q + q0, q_stride, i0, w, len, hd);
                        attention_load_rows(dor, hdp, dout + q0, q_stride, i0, w, len, hd);
                        for (int i = 0; i < w; i++) { // the padding rows (dout = 0) get D = 0, lse = 0
                            D[i] = 0.0f, lsei[i] = 0.0f;
                            if (i0 + i >= len) continue;
                            const float *oi = out + q0 + (size_t)(i0 + i) * q_stride;
                            for (int d = 0; d < hd; d++) D[i] += dor[(size_t)i * hdp + d] * oi[d];
                            lsei[i] = lse[((size_t)b * NH + h) * len + i0 + i];
                        }
                        memset(dqt, 0, (size_t)w * hdp * sizeof(float));
                        for (int s0 = first; s0 <= last; s0 += ATT_KT) {
                            attention_key_tile(cols, keys, w, s0, qpos);
                            attention_load_rows(kt, hdp, k + kv0, kv_stride, s0, ATT_KT, kv_end, hd);
                            attention_load_rows(vt, hdp, v + kv0, kv_stride, s0, ATT_KT, kv_end, hd);
                            attention_scores(st, kt, qt, w, hd, hdp, s0, qpos, qlo, cols);
                            attention_probs(st, w, lsei, cols); // P^T
                            attention_matmul_st(dst, w, vt, hdp, dot, hd, cols); // dP^T = V dout^T
                            for (int j = 0; j < ATT_KT; j++)
                                for (int v = 0; v < NV; v++)
                                    dstv[j * NV + v] = v < cols[j] / VLEN ? (vfloat){0}
                                                                               : stv[j * NV + v] * (dstv[j * NV + v] - Dv[v]) * scale;
                            // dV tile = P^T dout, dK tile = dS^T q (keys, hdp); dq += dS K (queries, hdp)
                            attention_matmul(dvt, hdp, st, w, 1, dor, hdp, ATT_KT, hdp, w, 0, cols, NULL);
                            attention_matmul(dkt, hdp, dst, w, 1, qr, hdp, ATT_KT, hdp, w, 0, cols, NULL);
                            attention_matmul(dqt, hdp, dst, 1, w, kt, hdp, w, hdp, ATT_KT, 1, NULL, keys);
                            for (int j = 0; j < ATT_KT && s0 + j < kv_end; j++) {
                                float *dks = dk + kv0 + (size_t)(s0 + j) * kv_stride, *dvs = dv + kv0 + (size_t)(s0 + j) * kv_stride;
                                for (int d = 0; d < hd; d++) dks[d] += dkt[(size_t)j * hdp + d], dvs[d] += dvt[(size_t)j * hdp + d];
                            }
                        }
                        for (int i = 0; i < w && i0 + i < len; i++)
                            memcpy(dq + q0 + (size_t)(i0 + i) * q_stride, dqt + (size_t)i * hdp, hd * sizeof(float));
                    }
            }
        free(qt), free(qpos);
    }
}
#endif
