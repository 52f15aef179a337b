// dev/emu/cuda_fp16.h: CUDA's half-precision type and the conversions
// llama2.tune's kernels use, rounding as the hardware's cvt.rn.f16.f32 (and
// CUDA's __float2half_rn) does: to nearest, ties to even; below 2^-14 to the
// subnormals (steps of 2^-24), below 2^-25 to zero (ties to even: exactly 2^-25
// too); from 65520 up (halfway past the largest, 65504) to infinity; any NaN
// to the canonical NaN 0x7FFF, as CUDA's own host implementation does.
#pragma once
#include <cstdint>
#include <cstring>

struct __half;
inline __half __float2half_rn(float f);
inline float __half2float(__half h);

// 1 sign, 5 exponent (bias 15) and 10 fraction bits; trivially constructible, as
// CUDA's (a default-constructed one is uninitialized), with CUDA's conversions
struct __half {
    uint16_t __x;
    __half() = default;
    __half(float f) : __x(__float2half_rn(f).__x) {}
    operator float() const { return __half2float(*this); }
};
static_assert(sizeof(__half) == 2, "fp16 is 2 bytes");

inline __half __float2half_rn(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7FFFFFFFu;
    __half h;
    if (a > 0x7F800000u) { h.__x = 0x7FFF; return h; }              // NaN
    if (a >= 0x477FF000u) { h.__x = (uint16_t)(sign | 0x7C00u); return h; } // >= 65520 (and inf): infinity
    int e = (int)(a >> 23) - 127;                                    // unbiased exponent of f
    uint32_t mant = (a & 0x7FFFFFu) | 0x800000u;                      // 24 significant bits (normal f)
    if (a < 0x00800000u) mant = a & 0x7FFFFFu, e = -126;              // f subnormal (rounds to 0 in fp16)
    // the fp16 result in units of its last place: 2^-24 below 2^-14, else 2^(e - 10)
    int shift = e < -14 ? 13 + (-14 - e) : 13;                        // bits of mant below that unit
    uint32_t q;
    if (shift > 24) q = 0;                                            // below 2^-25: zero (the tie 2^-25 rounds to even, 0)
    else {
        uint32_t rest = mant & ((1u << shift) - 1), half_unit = 1u << (shift - 1);
        q = mant >> shift;
        if (rest > half_unit || (rest == half_unit && (q & 1))) q++;  // to nearest, ties to even
    }
    // normal: q has an implicit leading 1 at bit 10 and the exponent goes above it;
    // adding the biased exponent to q lets a carry out of the fraction move it up (as bf16's)
    uint32_t bits = e < -14 ? q : ((uint32_t)(e + 14) << 10) + q;
    h.__x = (uint16_t)(sign | bits);
    return h;
}
inline __half __float2half(float f) { return __float2half_rn(f); }

inline float __half2float(__half h) {
    uint32_t sign = (uint32_t)(h.__x & 0x8000u) << 16, e = (h.__x >> 10) & 0x1Fu, m = h.__x & 0x3FFu, u;
    if (e == 0x1F) u = sign | 0x7F800000u | (m << 13);                // inf, NaN (payload kept)
    else if (e != 0) u = sign | ((e + 112) << 23) | (m << 13);        // normal: rebias 15 -> 127
    else {                                                            // zero or subnormal: m * 2^-24, exact in fp32
        float f = (float)m * 5.9604644775390625e-8f;
        memcpy(&u, &f, 4);
        u |= sign;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}
