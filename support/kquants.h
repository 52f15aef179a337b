// support/kquants.h: llama.cpp's k-quant blocks (Q4_K, Q5_K, Q6_K) and the 32-element types
// its quantizer falls back to (Q5_0, Q5_1), encoded as ggml's reference quantizers
// (ggml-quants.c, quantize_row_*_ref: what llama-quantize runs without an importance matrix)
// compute them, so that a block equals llama.cpp's byte for byte. Our own code, written from
// reading theirs; the layouts (little-endian, d and dmin as F16):
//
//   Q4_K  256 values: d, dmin, 12 bytes of 6-bit scales and mins for 8 groups of 32, 128 bytes
//         of 4-bit quants (x = d * scale * q - dmin * min)                        144 bytes
//   Q5_K  the same with a fifth bit per quant (32 bytes of high bits before the 128)  176 bytes
//   Q6_K  128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales for groups of 16,
//         d last (x = d * scale * (q - 32))                                        210 bytes
//   Q5_0  32 values: d, 4 bytes of fifth bits, 16 bytes of nibbles (x = d (q - 16))  22 bytes
//   Q5_1  d, m (the minimum), fifth bits, nibbles (x = d q + m)                      24 bytes
//
// The float operations are ggml's, in its order. ggml's reference quantizers live in
// libggml-base, which x86-64 builds compile for the baseline ISA: no fused multiply-add, so each
// product is rounded before it is added. Our trainers are built with -march=native, where gcc
// would fuse a * b + c; every product that meets an addition therefore passes through
// kq_mul (KQ_ROUNDED: its own rounding) so the compiler cannot fuse it, whatever the flags.
// (A llama.cpp built where the compiler fuses inside ggml-base, e.g. gcc on aarch64, can
// differ from both in rare blocks.)
#ifndef KQUANTS_H
#define KQUANTS_H
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <float.h>

#define KQ_K 256
#define KQ_Q4_K_BYTES 144
#define KQ_Q5_K_BYTES 176
#define KQ_Q6_K_BYTES 210
#define KQ_Q5_0_BYTES 22
#define KQ_Q5_1_BYTES 24
#define KQ_GROUP_EPS 1e-15f // ggml's GROUP_MAX_EPS: a group below it is all zeros

// float32 -> float16 bits, round to nearest even (support/gguf.h's, which includes this file)
static inline uint16_t gguf_f16(float f);

// KQ_ROUNDED(v): v, a float just computed, taken as it is (rounded to fp32), so that the
// compiler cannot fuse the product behind it into the add that follows: an empty asm that
// keeps v in a vector register (gcc, clang; as fast as the fused code), else a volatile
#if defined(__GNUC__) && defined(__x86_64__)
#define KQ_ROUNDED(v) __asm__("" : "+x"(v))
#elif defined(__GNUC__) && defined(__aarch64__)
#define KQ_ROUNDED(v) __asm__("" : "+w"(v))
#else
#define KQ_ROUNDED(v) do { volatile float kq_v = (v); (v) = kq_v; } while (0)
#endif

// a * b rounded to fp32 on its own (never fused into a following add)
static inline float kq_mul(float a, float b) {
    float p = a * b;
    KQ_ROUNDED(p);
    return p;
}

// round to nearest (ties to even) by adding 1.5 * 2^23, as ggml's nearest_int; |v| < 2^22
static inline int kq_nearest_int(float v) {
    KQ_ROUNDED(v); // (v is often a product: rounded before the add)
    float s = v + 12582912.f;
    int32_t i;
    memcpy(&i, &s, 4);
    return (i & 0x007fffff) - 0x00400000;
}

static inline float kq_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ffu, x;
    if (e == 0x1f) x = sign | 0x7f800000u | (m << 13);
    else if (e) x = sign | ((e + 112) << 23) | (m << 13);
    else if (!m) x = sign;
    else { // a subnormal: normalise it
        e = 113;
        while (!(m & 0x400u)) m <<= 1, e--;
        x = sign | (e << 23) | ((m & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &x, 4);
    return f;
}
// a float through F16 and back (the d that a block stores, as the dequantizer reads it)
static inline float kq_f16_round(float f) { return kq_f16_to_f32(gguf_f16(f)); }
static inline void kq_put_f16(uint8_t *p, float f) {
    uint16_t h = gguf_f16(f);
    p[0] = (uint8_t)(h & 0xff), p[1] = (uint8_t)(h >> 8);
}

// ggml's make_qkx2_quants: the scale and minimum of n values (quants 0..nmax, L) that
// minimise the weighted squared error over nstep + 1 trial scales; *the_min gets -min
static float kq_scale_min(int n, int nmax, const float *x, const float *weights, uint8_t *L, float *the_min,
                          uint8_t *Laux, float rmin, float rdelta, int nstep) {
    float min = x[0], max = x[0], sum_w = weights[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += weights[i];
        sum_x += kq_mul(weights[i], x[i]);
    }
    if (min > 0) min = 0;
    if (max == min) {
        for (int i = 0; i < n; i++) L[i] = 0;
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min), scale = 1 / iscale, best_error = 0;
    for (int i = 0; i < n; i++) {
        int l = kq_nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)(l < 0 ? 0 : l > nmax ? nmax : l);
        float diff = kq_mul(scale, L[i]) + min - x[i];
        best_error += kq_mul(weights[i], diff * diff);
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + kq_mul(rdelta, (float)is) + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = kq_nearest_int(iscale * (x[i] - min));
            l = l < 0 ? 0 : l > nmax ? nmax : l;
            Laux[i] = (uint8_t)l;
            float wl = kq_mul(weights[i], (float)l);
            sum_l += wl;
            sum_l2 += kq_mul(wl, (float)l);
            sum_xl += kq_mul(wl, x[i]);
        }
        float D = kq_mul(sum_w, sum_l2) - kq_mul(sum_l, sum_l);
        if (D > 0) {
            float this_scale = (kq_mul(sum_w, sum_xl) - kq_mul(sum_x, sum_l)) / D;
            float this_min = (kq_mul(sum_l2, sum_x) - kq_mul(sum_l, sum_xl)) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; i++) {
                float diff = kq_mul(this_scale, Laux[i]) + this_min - x[i];
                cur_error += kq_mul(weights[i], diff * diff);
            }
            if (cur_error < best_error) {
                memcpy(L, Laux, (size_t)n);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

// ggml's make_qx_quants with rmse_type 1 (weights x^2): a signed scale for n values, quants
// -nmax..nmax-1 stored as L = q + nmax, the best of 19 trial scales
static float kq_signed_scale(int n, int nmax, const float *x, int8_t *L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) amax = fabsf(x[i]), max = x[i];
    if (amax < KQ_GROUP_EPS) {
        for (int i = 0; i < n; i++) L[i] = 0;
        return 0.f;
    }
    float iscale = -nmax / max, sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = kq_nearest_int(iscale * x[i]);
        l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
        L[i] = (int8_t)(l + nmax);
        float w = x[i] * x[i];
        sumlx += kq_mul(w * x[i], (float)l);
        suml2 += kq_mul(w * l, (float)l);
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f, best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -(nmax + kq_mul(0.1f, (float)is)) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = kq_nearest_int(iscale * x[i]);
            l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
            float w = x[i] * x[i];
            sumlx += kq_mul(w * x[i], (float)l);
            suml2 += kq_mul(w * l, (float)l);
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++) {
                int l = kq_nearest_int(iscale * x[i]);
                L[i] = (int8_t)(nmax + (l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l));
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

// Q4_K and Q5_K share the search: 8 groups of 32, each a scale and a minimum (kq_scale_min,
// weighted by rms + |x|), both stored in 6 bits against the block's largest; then the
// quants again from the stored scales. bits: 4 or 5. L gets the 256 quants; out the header.
static void kq_groups_k(const float *x, int bits, uint8_t *L, uint8_t *out) {
    int nmax = (1 << bits) - 1;
    uint8_t Laux[32];
    float weights[32], mins[8], scales[8], max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += kq_mul(x[32 * j + l], x[32 * j + l]);
        float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) weights[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = bits == 4 ? kq_scale_min(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, -1.f, 0.1f, 20)
                              : kq_scale_min(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, -0.5f, 0.1f, 15);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f, inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    uint8_t *sc = out + 4, ls[8], lm[8];
    for (int j = 0; j < 8; j++) {
        ls[j] = (uint8_t)kq_nearest_int(inv_scale * scales[j]);
        lm[j] = (uint8_t)kq_nearest_int(inv_min * mins[j]);
        ls[j] = ls[j] < 63 ? ls[j] : 63;
        lm[j] = lm[j] < 63 ? lm[j] : 63;
    }
    for (int j = 0; j < 4; j++) { // groups 0-3 whole in bytes 0-7; 4-7 as nibbles, their top bits above 0-3's
        sc[j] = (uint8_t)(ls[j] | ((ls[j + 4] >> 4) << 6));
        sc[j + 4] = (uint8_t)(lm[j] | ((lm[j + 4] >> 4) << 6));
        sc[j + 8] = (uint8_t)((ls[j + 4] & 0xf) | ((lm[j + 4] & 0xf) << 4));
    }
    kq_put_f16(out, max_scale / 63.f);
    kq_put_f16(out + 2, max_min / 63.f);
    float d_all = kq_f16_to_f32((uint16_t)(out[0] | out[1] << 8)), dmin_all = kq_f16_to_f32((uint16_t)(out[2] | out[3] << 8));
    for (int j = 0; j < 8; j++) {
        float d = d_all * ls[j];
        if (!d) continue;
        float dm = dmin_all * lm[j];
        for (int i = 0; i < 32; i++) {
            int l = kq_nearest_int((x[32 * j + i] + dm) / d);
            L[32 * j + i] = (uint8_t)(l < 0 ? 0 : l > nmax ? nmax : l);
        }
    }
}

// one Q4_K block of x[0..256)
static inline void kq_q4_k_block(const float *x, uint8_t *out) {
    uint8_t L[KQ_K];
    kq_groups_k(x, 4, L, out);
    uint8_t *q = out + 16;
    for (int j = 0; j < KQ_K; j += 64, q += 32)
        for (int l = 0; l < 32; l++) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
}

// one Q5_K block of x[0..256)
static inline void kq_q5_k_block(const float *x, uint8_t *out) {
    uint8_t L[KQ_K];
    kq_groups_k(x, 5, L, out);
    uint8_t *qh = out + 16, *ql = out + 48;
    memset(qh, 0, 32);
    for (int n = 0, b = 0; n < KQ_K; n += 64, b += 2, ql += 32)
        for (int j = 0; j < 32; j++) {
            int l1 = L[n + j], l2 = L[n + j + 32];
            if (l1 > 15) l1 -= 16, qh[j] |= (uint8_t)(1u << b);
            if (l2 > 15) l2 -= 16, qh[j] |= (uint8_t)(2u << b);
            ql[j] = (uint8_t)(l1 | (l2 << 4));
        }
}

// one Q6_K block of x[0..256): 16 groups of 16, each a signed scale (kq_signed_scale) stored
// as int8 against the largest, then the quants again from the stored scales
static inline void kq_q6_k_block(const float *x, uint8_t *out) {
    int8_t L[KQ_K];
    float scales[16], max_scale = 0, max_abs_scale = 0;
    for (int ib = 0; ib < 16; ib++) {
        scales[ib] = kq_signed_scale(16, 32, x + 16 * ib, L + 16 * ib);
        if (fabsf(scales[ib]) > max_abs_scale) max_abs_scale = fabsf(scales[ib]), max_scale = scales[ib];
    }
    memset(out, 0, KQ_Q6_K_BYTES);
    if (max_abs_scale < KQ_GROUP_EPS) return; // (zeros, d = 0)
    uint8_t *ql = out, *qh = out + 128;
    int8_t *sc = (int8_t *)(out + 192);
    float iscale = -128.f / max_scale;
    kq_put_f16(out + 208, 1 / iscale);
    float d_all = kq_f16_to_f32((uint16_t)(out[208] | out[209] << 8));
    for (int ib = 0; ib < 16; ib++) {
        int s = kq_nearest_int(iscale * scales[ib]);
        sc[ib] = (int8_t)(s < 127 ? s : 127);
    }
    for (int j = 0; j < 16; j++) {
        float d = d_all * sc[j];
        if (!d) continue;
        for (int i = 0; i < 16; i++) {
            int l = kq_nearest_int(x[16 * j + i] / d);
            L[16 * j + i] = (int8_t)((l < -32 ? -32 : l > 31 ? 31 : l) + 32);
        }
    }
    for (int j = 0; j < KQ_K; j += 128, ql += 64, qh += 32)
        for (int l = 0; l < 32; l++) {
            ql[l] = (uint8_t)((L[j + l] & 0xf) | ((L[j + l + 64] & 0xf) << 4));
            ql[l + 32] = (uint8_t)((L[j + l + 32] & 0xf) | ((L[j + l + 96] & 0xf) << 4));
            qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6));
        }
}

// the 5-bit quants q[0..32) of a Q5_0 / Q5_1 block into its fifth bits (4 bytes) and nibbles
static inline void kq_pack5(const uint8_t *q, uint8_t *qh, uint8_t *qs) {
    uint32_t h = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((q[j] & 0xf) | ((q[j + 16] & 0xf) << 4));
        h |= (uint32_t)((q[j] & 0x10u) >> 4) << j;
        h |= (uint32_t)((q[j + 16] & 0x10u) >> 4) << (j + 16);
    }
    for (int i = 0; i < 4; i++) qh[i] = (uint8_t)(h >> (8 * i));
}

// one Q5_0 block of x[0..32): d = the value of largest magnitude / -16
static inline void kq_q5_0_block(const float *x, uint8_t *out) {
    float amax = 0, max = 0;
    for (int j = 0; j < 32; j++)
        if (amax < fabsf(x[j])) amax = fabsf(x[j]), max = x[j];
    float d = max / -16, id = d ? 1.0f / d : 0.0f;
    uint8_t q[32];
    for (int j = 0; j < 32; j++) {
        int8_t t = (int8_t)(kq_mul(x[j], id) + 16.5f);
        q[j] = (uint8_t)(t < 31 ? t : 31);
    }
    kq_put_f16(out, d);
    kq_pack5(q, out + 2, out + 6);
}

// one Q5_1 block of x[0..32): d = (max - min) / 31 from the minimum m
static inline void kq_q5_1_block(const float *x, uint8_t *out) {
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < 32; j++) {
        if (x[j] < min) min = x[j];
        if (x[j] > max) max = x[j];
    }
    float d = (max - min) / 31, id = d ? 1.0f / d : 0.0f;
    uint8_t q[32];
    for (int j = 0; j < 32; j++) q[j] = (uint8_t)(kq_mul(x[j] - min, id) + 0.5f);
    kq_put_f16(out, d);
    kq_put_f16(out + 2, min);
    kq_pack5(q, out + 4, out + 8);
}
#endif
