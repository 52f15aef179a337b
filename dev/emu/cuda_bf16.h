// dev/emu/cuda_bf16.h: CUDA's bfloat16 type and the conversions llama2.tune's
// kernels use, rounding as the hardware's cvt.rn.bf16.f32 does: to nearest, ties
// to even, subnormals kept, overflow to infinity, any NaN to the canonical NaN
// 0x7FFF (as CUDA's own host implementation of __float2bfloat16 also does).
#pragma once
#include <cstdint>
#include <cstring>

struct __nv_bfloat16;
inline __nv_bfloat16 __float2bfloat16_rn(float f);
inline float __bfloat162float(__nv_bfloat16 h);

// the upper 16 bits of an IEEE float; trivially constructible, as CUDA's (a
// default-constructed one is uninitialized), with CUDA's conversions to and from float
struct __nv_bfloat16 {
    uint16_t __x;
    __nv_bfloat16() = default;
    __nv_bfloat16(float f) : __x(__float2bfloat16_rn(f).__x) {}
    operator float() const { return __bfloat162float(*this); }
};
static_assert(sizeof(__nv_bfloat16) == 2, "bf16 is 2 bytes");

inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    __nv_bfloat16 h;
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
        h.__x = 0x7FFF;
    } else {
        // adding 0x7FFF rounds up past halfway; the kept bit's value breaks the tie to even
        // (a carry into the exponent is right: the next binade, or infinity)
        h.__x = (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
    }
    return h;
}
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }

inline float __bfloat162float(__nv_bfloat16 h) {
    uint32_t u = (uint32_t)h.__x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
