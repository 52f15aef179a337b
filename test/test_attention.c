// The CPU attention (attention_forward / attention_backward in attention.h)
// against the textbook definition computed here in double precision: the full
// masked score row of each query (causal, and with a sliding window W only the
// keys pos - W + 1 .. pos, as transformers' Mistral masks them, or with shifted
// sparse attention only the keys of the query's group), its softmax, the
// weighted sum of values, and the gradient through them. The shapes cross several
// query and key tiles, start chunks off the tile grid, use GQA and head sizes that
// are not a multiple of the vector width, and windows of 1 key, fewer than a
// tile's, a tile's, more, and more than the sequence; shifted sparse groups of 1
// position, odd sizes, a tile's, across tiles, with a KV head shared by both halves
// of the query heads. Rows of k, v past the chunk are NaN (they must never be read),
// and so are the key tiles before every query's first key (they must be skipped,
// not masked: 0 * NaN would show).
// Then chunked attention against whole-sequence attention, with and without
// windows and groups: out, lse and dq bit-identical (each query meets the same key tiles in
// the same order), dk, dv within rounding (they sum the chunks' contributions in
// another order). And attention_exp against libm's exp.
#define TESTING
#include "../train_llama2.c"
#include "test_common.h"

// W: the sliding window, G: shifted sparse attention's group size (0: none)
typedef struct { int B, T, t0, len, NH, NKV, hd, W, G; } Shape;

static float *random_floats(size_t n, float amp, uint64_t *state) {
    float *x = (float *)mallocCheck(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = amp * (2.0f * rng_uniform(state) - 1.0f);
    return x;
}

// largest |a - ref| over the largest |ref|, or over vanish where ref is all zeros
static double rel_err(const float *a, const double *ref, size_t n, double vanish) {
    double err = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        err = fmax(err, fabs((double)a[i] - ref[i]));
        if (isnan(a[i])) err = INFINITY;
        scale = fmax(scale, fabs(ref[i]));
    }
    return err / (scale > 0 ? scale : fmax(vanish, 1e-30));
}

// the group of position p, LongLoRA's S2-Attn as described: groups of G from 0 for the
// first half of the heads; for the second half, cut at G/2, G/2 + G, ... (the
// positions before G/2 a group of their own, no wrap-around)
static int s2_group_of(int p, int G, int shifted) { return shifted ? (p + G - G / 2) / G : p / G; }
// whether the query at position pos of head h sees key j: causal, and inside a window
// of W keys or in the query's group
static int visible(const Shape *s, int h, int pos, int j) {
    int shifted = h >= s->NH / 2;
    return j <= pos && (s->W == 0 || pos - j < s->W) && (s->G == 0 || s2_group_of(j, s->G, shifted) == s2_group_of(pos, s->G, shifted));
}
// the first key the chunk's first query sees in any head: no query sees the keys before it
static int first_seen(const Shape *s) {
    int lo = s->t0;
    for (int h = 0; h < s->NH; h++)
        for (int j = s->t0; j >= 0 && visible(s, h, s->t0, j); j--) lo = j < lo ? j : lo;
    return lo;
}

// out, lse, dq, and dk, dv (only what the chunk adds), by the definition: each
// query's row of T scores, -inf where masked (masked keys are not even read);
// terms: the largest |P dP| scale, the size of what dS = P (dP - D) scale cancels
static void reference(const Shape *s, const float *q, const float *k, const float *v, const float *dout, double *out,
                      double *lse, double *dq, double *dk, double *dv, double *terms) {
    int hd = s->hd, group = s->NH / s->NKV, n = s->T;
    double scale = 1.0 / sqrt((double)hd), *p = (double *)mallocCheck((size_t)s->T * sizeof(double));
    double *dp = (double *)mallocCheck((size_t)s->T * sizeof(double));
    memset(dk, 0, (size_t)s->B * s->T * s->NKV * hd * sizeof(double));
    memset(dv, 0, (size_t)s->B * s->T * s->NKV * hd * sizeof(double));
    *terms = 0;
    for (int b = 0; b < s->B; b++)
        for (int h = 0; h < s->NH; h++)
            for (int i = 0; i < s->len; i++) {
                size_t qi = (((size_t)b * s->len + i) * s->NH + h) * hd;
                int pos = s->t0 + i;
                double maxv = -INFINITY, sum = 0;
                for (int j = 0; j < n; j++) {
                    const float *kj = k + (((size_t)b * s->T + j) * s->NKV + h / group) * hd;
                    p[j] = -INFINITY;
                    if (!visible(s, h, pos, j)) continue;
                    p[j] = 0;
                    for (int d = 0; d < hd; d++) p[j] += (double)q[qi + d] * kj[d];
                    p[j] *= scale;
                    maxv = fmax(maxv, p[j]);
                }
                for (int j = 0; j < n; j++) sum += exp(p[j] - maxv);
                lse[((size_t)b * s->NH + h) * s->len + i] = maxv + log(sum);
                for (int d = 0; d < hd; d++) out[qi + d] = 0;
                double D = 0; // sum_j P_j dP_j
                for (int j = 0; j < n; j++) {
                    size_t kv = (((size_t)b * s->T + j) * s->NKV + h / group) * hd;
                    p[j] = exp(p[j] - maxv) / sum;
                    dp[j] = 0;
                    if (!visible(s, h, pos, j)) continue; // (p[j] = 0; v is not read)
                    for (int d = 0; d < hd; d++) out[qi + d] += p[j] * v[kv + d], dp[j] += (double)dout[qi + d] * v[kv + d];
                    D += p[j] * dp[j];
                    *terms = fmax(*terms, p[j] * fabs(dp[j]) * scale);
                }
                for (int d = 0; d < hd; d++) dq[qi + d] = 0;
                for (int j = 0; j < n; j++) {
                    size_t kv = (((size_t)b * s->T + j) * s->NKV + h / group) * hd;
                    if (!visible(s, h, pos, j)) continue;
                    double ds = p[j] * (dp[j] - D) * scale;
                    for (int d = 0; d < hd; d++) {
                        dq[qi + d] += ds * k[kv + d];
                        dk[kv + d] += ds * q[qi + d];
                        dv[kv + d] += p[j] * dout[qi + d];
                    }
                }
            }
    free(p), free(dp);
}

// Tolerance 2e-6 of each tensor's largest magnitude: fp32 against double, with
// sums over up to ~300 keys or queries of terms rounded to 6e-8 relative, and
// exp within 2 ulp; measured up to 9e-7 (gcc and clang, with and without FMA).
// With a window of one key, dq and dk are exactly 0 (P = 1, dP = D, so dS = 0),
// and fp32 gives the rounding of dP - D: there the error is measured against the
// size of those terms, |P dP| scale times the largest |k| (dq) or |q| (dk).
#define ATT_TOL 2e-6

static void check_against_reference(const Shape *s, uint64_t seed) {
    char what[160];
    snprintf(what, sizeof what, "attention B=%d T=%d t0=%d len=%d NH=%d NKV=%d hd=%d W=%d G=%d", s->B, s->T, s->t0, s->len,
             s->NH, s->NKV, s->hd, s->W, s->G);
    uint64_t state = seed;
    size_t nq = (size_t)s->B * s->len * s->NH * s->hd, nkv = (size_t)s->B * s->T * s->NKV * s->hd;
    size_t nlse = (size_t)s->B * s->NH * s->len;
    // scores of a few units, so the softmax is neither flat nor one-hot
    float *q = random_floats(nq, 2.0f, &state), *k = random_floats(nkv, 2.0f, &state);
    float *v = random_floats(nkv, 1.0f, &state), *dout = random_floats(nq, 1.0f, &state);
    // keys the chunk's first query sees: lo .. t0 + len - 1; no query sees a key before lo,
    // and the key tiles (ATT_KT from 0) wholly before it must not even be read
    int lo = first_seen(s), skipped = lo / ATT_KT * ATT_KT;
    for (int b = 0; b < s->B; b++)
        for (int t = 0; t < s->T; t++)
            for (size_t x = ((size_t)b * s->T + t) * s->NKV * s->hd, e = x + (size_t)s->NKV * s->hd; x < e; x++)
                if (t < skipped || t >= s->t0 + s->len) k[x] = v[x] = NAN;
    // dk, dv are added into: a small base (its rounding stays far below the tolerance)
    float *dk0 = random_floats(nkv, 0.01f, &state), *dv0 = random_floats(nkv, 0.01f, &state);
    float *out = (float *)mallocCheck(nq * sizeof(float)), *lse = (float *)mallocCheck(nlse * sizeof(float));
    float *dq = random_floats(nq, 1.0f, &state); // overwritten
    float *dk = (float *)mallocCheck(nkv * sizeof(float)), *dv = (float *)mallocCheck(nkv * sizeof(float));
    memcpy(dk, dk0, nkv * sizeof(float)), memcpy(dv, dv0, nkv * sizeof(float));
    Chunk ch = {s->B, s->T, s->t0, s->len, s->W, s->G};
    attention_forward(out, lse, q, k, v, &ch, s->NH, s->NKV, s->hd);
    attention_backward(dq, dk, dv, dout, out, lse, q, k, v, &ch, s->NH, s->NKV, s->hd);

    double *rout = (double *)mallocCheck(nq * sizeof(double)), *rlse = (double *)mallocCheck(nlse * sizeof(double));
    double *rdq = (double *)mallocCheck(nq * sizeof(double)), *rdk = (double *)mallocCheck(nkv * sizeof(double));
    double *rdv = (double *)mallocCheck(nkv * sizeof(double));
    double terms, qmax = 0, kmax = 0;
    reference(s, q, k, v, dout, rout, rlse, rdq, rdk, rdv, &terms);
    for (size_t x = 0; x < nq; x++) qmax = fmax(qmax, fabs(q[x]));
    for (size_t x = 0; x < nkv; x++) kmax = fmax(kmax, fabs(k[x])); // (NaN rows: fmax ignores NaN)
    // dk, dv: what the call added to the rows it may touch; outside them (before the first
    // query's window, past the chunk) nothing may change
    int untouched = 1;
    for (int b = 0; b < s->B; b++)
        for (int t = 0; t < s->T; t++)
            for (size_t x = ((size_t)b * s->T + t) * s->NKV * s->hd, e = x + (size_t)s->NKV * s->hd; x < e; x++) {
                int seen = t >= lo && t < s->t0 + s->len;
                if (!seen) untouched &= memcmp(&dk[x], &dk0[x], 4) == 0 && memcmp(&dv[x], &dv0[x], 4) == 0;
                dk[x] = seen ? dk[x] - dk0[x] : 0, dv[x] = seen ? dv[x] - dv0[x] : 0;
            }
    double e_out = rel_err(out, rout, nq, 0), e_lse = rel_err(lse, rlse, nlse, 0), e_dq = rel_err(dq, rdq, nq, terms * kmax);
    double e_dk = rel_err(dk, rdk, nkv, terms * qmax), e_dv = rel_err(dv, rdv, nkv, 0);
    CHECK(e_out < ATT_TOL && e_lse < ATT_TOL && e_dq < ATT_TOL && e_dk < ATT_TOL && e_dv < ATT_TOL && untouched,
          what, "out %.2g lse %.2g dq %.2g dk %.2g dv %.2g (tol %g), rows no query sees untouched %d", e_out, e_lse,
          e_dq, e_dk, e_dv, ATT_TOL, untouched);
    free(q), free(k), free(v), free(dout), free(dk0), free(dv0), free(out), free(lse), free(dq), free(dk), free(dv);
    free(rout), free(rlse), free(rdq), free(rdk), free(rdv);
}

// attention_exp against libm's exp in double, over its whole domain [-87, 88] in
// steps of 1e-5 (1.75e7 points: every exponent, all patterns of the reduced
// argument), and at the values the attention relies on: e^0 = 1, e^-inf = 0.
static void check_exp(void) {
    enum { N = 1 << 14 };
    static float x[N] __attribute__((aligned(64))), y[N] __attribute__((aligned(64))), zero[ATT_QT] __attribute__((aligned(64)));
    double worst = 0, worst_x = 0;
    for (int blk = 0; blk * N < 17500000; blk++) {
        for (int i = 0; i < N; i++) x[i] = y[i] = -87.0f + 1e-5f * (float)(blk * N + i);
        attention_exp(y, N / ATT_QT, ATT_QT, zero);
        for (int i = 0; i < N; i++) {
            double ref = exp((double)x[i]), ulp = ldexp(1.0, ilogb(ref) - 23); // one unit in the last place of ref
            if (fabs(y[i] - ref) / ulp > worst) worst = fabs(y[i] - ref) / ulp, worst_x = x[i];
        }
    }
    // 2 ulp: the Taylor tail is < 0.2 ulp, and the reduction and the polynomial each round
    // (measured 0.93 ulp with FMA contraction, 1.21 without)
    CHECK(worst <= 2.0, "attention_exp within 2 ulp of exp on [-87, 88]", "worst %.2f ulp at x = %.9g", worst, worst_x);
    for (int i = 0; i < N; i++) y[i] = 0.0f;
    y[1] = -INFINITY, y[2] = -87.5f, y[3] = NAN;
    attention_exp(y, N / ATT_QT, ATT_QT, zero);
    CHECK(y[0] == 1.0f && y[1] == 0.0f && y[2] == 0.0f && isnan(y[3]), "attention_exp: e^0 = 1, e^-inf = 0, e^-87.5 = 0, NaN stays",
          "%g %g %g %g", y[0], y[1], y[2], y[3]);
}

// rows t0 .. t0 + len - 1 of each batch row of x (B, T, w) <-> c (B, len, w)
static void chunk_rows(float *c, float *x, int B, int T, int t0, int len, size_t w, int to_chunk) {
    for (int b = 0; b < B; b++)
        for (int i = 0; i < len; i++) {
            float *xr = x + ((size_t)b * T + t0 + i) * w, *cr = c + ((size_t)b * len + i) * w;
            memcpy(to_chunk ? cr : xr, to_chunk ? xr : cr, w * sizeof(float));
        }
}

// Whole-sequence attention against the same sequence in chunks of C (the last
// one shorter), run as the trainer runs them: forward in order, backward in
// reverse, dk and dv added up across chunks; with a sliding window of W keys, or
// shifted sparse groups of G positions.
static void check_chunked(int C, int W, int G) {
    enum { B = 2, T = 300, NH = 4, NKV = 2, HD = 48 };
    uint64_t state = 7;
    size_t nq = (size_t)B * T * NH * HD, nkv = (size_t)B * T * NKV * HD, w = (size_t)NH * HD;
    float *q = random_floats(nq, 2.0f, &state), *k = random_floats(nkv, 2.0f, &state);
    float *v = random_floats(nkv, 1.0f, &state), *dout = random_floats(nq, 1.0f, &state);
    float *out = (float *)mallocCheck(nq * sizeof(float)), *lse = (float *)mallocCheck((size_t)B * NH * T * sizeof(float));
    float *dq = (float *)mallocCheck(nq * sizeof(float));
    float *dk = (float *)callocCheck(nkv, sizeof(float)), *dv = (float *)callocCheck(nkv, sizeof(float));
    Chunk whole = {B, T, 0, T, W, G};
    attention_forward(out, lse, q, k, v, &whole, NH, NKV, HD);
    attention_backward(dq, dk, dv, dout, out, lse, q, k, v, &whole, NH, NKV, HD);

    float *cq = (float *)mallocCheck(nq * sizeof(float)), *cdout = (float *)mallocCheck(nq * sizeof(float));
    float *cout = (float *)mallocCheck(nq * sizeof(float)), *cdq = (float *)mallocCheck(nq * sizeof(float));
    float *clse = (float *)mallocCheck((size_t)B * NH * T * sizeof(float)); // (B, NH, len) of one chunk
    float *out_c = (float *)mallocCheck(nq * sizeof(float)), *dq_c = (float *)mallocCheck(nq * sizeof(float));
    float *dk_c = (float *)callocCheck(nkv, sizeof(float)), *dv_c = (float *)callocCheck(nkv, sizeof(float));
    int lse_same = 1;
    for (int t0 = 0; t0 < T; t0 += C) {
        Chunk ch = {B, T, t0, T - t0 < C ? T - t0 : C, W, G};
        chunk_rows(cq, q, B, T, t0, ch.len, w, 1);
        attention_forward(cout, clse, cq, k, v, &ch, NH, NKV, HD);
        chunk_rows(cout, out_c, B, T, t0, ch.len, w, 0);
        for (int bh = 0; bh < B * NH; bh++)
            lse_same &= memcmp(clse + (size_t)bh * ch.len, lse + (size_t)bh * T + t0, ch.len * sizeof(float)) == 0;
    }
    for (int t0 = (T - 1) / C * C; t0 >= 0; t0 -= C) {
        Chunk ch = {B, T, t0, T - t0 < C ? T - t0 : C, W, G};
        chunk_rows(cq, q, B, T, t0, ch.len, w, 1);
        chunk_rows(cdout, dout, B, T, t0, ch.len, w, 1);
        chunk_rows(cout, out_c, B, T, t0, ch.len, w, 1);
        for (int bh = 0; bh < B * NH; bh++) memcpy(clse + (size_t)bh * ch.len, lse + (size_t)bh * T + t0, ch.len * sizeof(float));
        attention_backward(cdq, dk_c, dv_c, cdout, cout, clse, cq, k, v, &ch, NH, NKV, HD);
        chunk_rows(cdq, dq_c, B, T, t0, ch.len, w, 0);
    }
    double *dk64 = (double *)mallocCheck(nkv * sizeof(double)), *dv64 = (double *)mallocCheck(nkv * sizeof(double));
    for (size_t x = 0; x < nkv; x++) dk64[x] = dk[x], dv64[x] = dv[x];
    double e_dk = rel_err(dk_c, dk64, nkv, 0), e_dv = rel_err(dv_c, dv64, nkv, 0);
    char what[160];
    snprintf(what, sizeof what, "attention in chunks of %d, window %d, groups of %d == whole: out, lse, dq bit for bit", C, W, G);
    CHECK(memcmp(out, out_c, nq * sizeof(float)) == 0 && lse_same && memcmp(dq, dq_c, nq * sizeof(float)) == 0, what,
          "out %s, lse %s, dq %s", memcmp(out, out_c, nq * sizeof(float)) ? "differ" : "same", lse_same ? "same" : "differ",
          memcmp(dq, dq_c, nq * sizeof(float)) ? "differ" : "same");
    // dk, dv sum the same terms in another order (chunk by chunk, later chunks first):
    // a few roundings of fp32 sums, measured up to ~3e-7 of the largest element
    snprintf(what, sizeof what, "attention in chunks of %d, window %d, groups of %d == whole: dk, dv within 1e-6", C, W, G);
    CHECK(e_dk < 1e-6 && e_dv < 1e-6, what, "dk %.2g dv %.2g", e_dk, e_dv);
    free(q), free(k), free(v), free(dout), free(out), free(lse), free(dq), free(dk), free(dv), free(cq), free(cdout);
    free(cout), free(cdq), free(clse), free(out_c), free(dq_c), free(dk_c), free(dv_c), free(dk64), free(dv64);
}

int main(void) {
    check_exp();
    const Shape shapes[] = {
        {2, 150, 0, 150, 4, 2, 16, 0, 0},   // whole sequences over three tiles, GQA, the fixtures' head size
        {1, 300, 171, 129, 3, 1, 40, 0, 0}, // a chunk starting off the tile grid, hd not a multiple of the vector width
        {2, 130, 64, 66, 8, 8, 64, 0, 0},
        {1, 200, 199, 1, 2, 2, 128, 0, 0},  // one query at the end of a long prefix
        {1, 70, 0, 70, 6, 3, 8, 0, 0},
        // sliding windows (ATT_KT = 64 keys a tile): of one key, fewer than a tile's, a tile's, more, more than T
        {2, 150, 0, 150, 4, 2, 16, 1, 0},
        {1, 300, 171, 129, 3, 1, 40, 1, 0},
        {1, 300, 171, 129, 3, 1, 40, 17, 0},
        {2, 300, 0, 300, 4, 2, 16, 64, 0},
        {1, 300, 200, 100, 2, 1, 64, 64, 0},
        {1, 400, 250, 150, 6, 2, 32, 100, 0},
        {1, 200, 199, 1, 2, 2, 128, 70, 0}, // one query, its window inside a long prefix
        {1, 150, 40, 110, 4, 4, 24, 1000, 0},
        // shifted sparse attention (groups of G = T / 4 as the trainer cuts them, and others):
        // groups across tiles; an odd G (half-groups of 37) in a chunk off the tile grid with one
        // KV head that both halves of the query heads read; G a tile; one query; groups of 1
        {2, 152, 0, 152, 4, 2, 16, 0, 38},
        {1, 300, 171, 129, 4, 1, 40, 0, 75},
        {1, 256, 0, 256, 2, 1, 64, 0, 64},
        {1, 400, 250, 150, 6, 2, 32, 0, 100},
        {1, 200, 199, 1, 2, 2, 128, 0, 50},
        {2, 4, 0, 4, 2, 1, 8, 0, 1},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) check_against_reference(&shapes[i], 100 + i);
    // chunk sizes: one query, off the tile grid, one tile, across tiles, half; windows: none,
    // one key, the chunk size 37, a tile, more than a tile, more than the sequence; shifted
    // sparse groups of T / 4 = 75 (half-groups of 37)
    const int chunks[] = {1, 37, 64, 100, 150}, windows[] = {0, 1, 37, 64, 100, 1000};
    for (size_t i = 0; i < sizeof chunks / sizeof chunks[0]; i++) {
        for (size_t j = 0; j < sizeof windows / sizeof windows[0]; j++) check_chunked(chunks[i], windows[j], 0);
        check_chunked(chunks[i], 0, 75);
    }
    return test_summary();
}
