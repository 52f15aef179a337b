// The optimizers' updates on the CPU, over flat runs of parameters (OpenMP): the CPU
// trainer's (train_llama2.c), and the CUDA trainer's --cpu_offload step on the host
// (train_llama2.cu), which must equal its kernels (layers.cuh) bit for bit. Each element
// is support/optimizer.h's (adamw_elem, sgd_elem, torchao_adam_param, ...), as the kernels'.
#ifndef OPTIMIZER_CPU_H
#define OPTIMIZER_CPU_H
#include "optimizer.h"
#include "optimizer_qmap.h" // qmap8_signed, qmap8_unsigned

// x (n) rounded to bf16 in its floats (--pure_bf16: the weights at load, as llama-recipes'
// model.to(torch.bfloat16); the gradients where torch's are bf16 tensors)
static inline void round_bf16(float *x, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) x[i] = bf16_round(x[i]);
}

// one AdamW step (the t-th) on n parameters p with gradients g and moments m, v (adamw_elem)
static inline OPTIMIZER_HOST void adamw_update(float *p, const float *g, float *m, float *v, size_t n, int t, float lr, float beta1,
                         float beta2, float eps, float wd) {
    AdamWScalars s = adamw_scalars(t, lr, beta1, beta2, eps, wd);
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) adamw_elem(p + i, g[i], m + i, v + i, &s);
}

// one SGD step on n parameters p with gradients g (sgd_elem); without momentum there is
// no buffer (buf NULL)
static inline OPTIMIZER_HOST void sgd_update(float *p, const float *g, float *buf, size_t n, int first, float lr, float momentum, int nesterov,
                       float wd) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) sgd_elem(p + i, g[i], buf ? buf + i : NULL, first, lr, momentum, nesterov, wd);
}

// g (n) holds 1 / inv_scale times the gradients (a loss scale, a power of two):
// unscaled as torch's GradScaler.unscale_, then clipped as
// torch.nn.utils.clip_grad_norm_ (times max_norm / (norm + 1e-6) when that is
// below 1; norm: the unscaled gradients'; max_norm <= 0: no clipping), in one
// pass: g * inv_scale is exact, so one rounding of g * (inv_scale * coef) is both's
static inline OPTIMIZER_HOST void clip_grads(float *g, size_t n, double norm, float max_norm, float inv_scale) {
    double coef = max_norm > 0 ? max_norm / (norm + 1e-6) : 1.0;
    coef = coef < 1.0 ? coef * inv_scale : inv_scale;
    if (coef == 1.0) return;
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) g[i] = (float)(g[i] * coef);
}

// ----------------------------------------------------------------------------
// torchao's AdamW8bit (torchao.optim.AdamW8bit) and llama-recipes' AnyPrecisionAdamW,
// op for op as torch computes them eagerly on the CPU, each op rounded where torch's
// rounds (test/test_optim.c: bit for bit against both; layers.cuh has the kernels)

// One AdamW8bit step (the t-th) on n parameters p (fp32) with gradients g: torchao's
// 8-bit path, for tensors of at least 4096 elements in blocks of 256 (n % 256 == 0).
// Each block's moments are codes (n) into the signed (m) and unsigned (v) maps times the
// block's absmax (n / 256); they start as torchao's, all zero. The moments are
// dequantized, updated by lerp in fp32 and requantized, and p takes the fp32 moments.
// Blocks are independent, so p may be any run of whole blocks of a tensor (a shard)
// with its codes and absmax.
static inline OPTIMIZER_HOST void adamw8bit_update(float *p, const float *g, uint8_t *m_codes, float *m_absmax, uint8_t *v_codes,
                             float *v_absmax, size_t n, int t, double lr, double beta1, double beta2, double eps,
                             double wd) {
    if (n % ADAMW8BIT_BLOCK) die("adamw8bit_update: %zu elements are not whole blocks of %d", n, ADAMW8BIT_BLOCK);
    TorchaoAdamScalars s = torchao_adam_scalars(t, lr, beta1, beta2, eps, wd);
    // (each thread its own s: read through the shared one, p's stores might alias it, and
    // the block's loop would not vectorize)
    #pragma omp parallel for firstprivate(s)
    for (size_t b = 0; b < n / ADAMW8BIT_BLOCK; b++) {
        float m[ADAMW8BIT_BLOCK], v[ADAMW8BIT_BLOCK];
        uint32_t m_max = 0, v_max = 0; // the largest |m|, |v| as bits: non-negative floats order as their bits (a NaN above all, as in torch's amax)
        size_t i0 = b * ADAMW8BIT_BLOCK;
        for (int k = 0; k < ADAMW8BIT_BLOCK; k++) {
            size_t i = i0 + k;
            m[k] = torch_lerp(mul_rn(qmap8_signed[m_codes[i]], m_absmax[b]), g[i], s.w1);
            v[k] = torch_lerp(mul_rn(qmap8_unsigned[v_codes[i]], v_absmax[b]), mul_rn(g[i], g[i]), s.w2);
            p[i] = torchao_adam_param(p[i], m[k], v[k], &s);
            uint32_t am = f32_bits(fabsf(m[k])), av = f32_bits(fabsf(v[k]));
            m_max = am > m_max ? am : m_max;
            v_max = av > v_max ? av : v_max;
        }
        // the new absmax, at least 1e-12 (torchao's clip: a block of zeros divides by it; a NaN stays)
        float m_top = f32_from_bits(m_max), v_top = f32_from_bits(v_max);
        float m_top_clipped = m_absmax[b] = m_top < 1e-12f ? 1e-12f : m_top;
        float v_top_clipped = v_absmax[b] = v_top < 1e-12f ? 1e-12f : v_top;
        // (the codes go to the block's own arrays first: stores through the callers' uint8_t
        // pointers might alias the maps, and the searches' loads would not vectorize)
        uint8_t mq[ADAMW8BIT_BLOCK], vq[ADAMW8BIT_BLOCK];
        for (int k = 0; k < ADAMW8BIT_BLOCK; k++) {
            mq[k] = qmap8_code(m[k] / m_top_clipped, qmap8_signed);
            vq[k] = qmap8_code(v[k] / v_top_clipped, qmap8_unsigned);
        }
        memcpy(m_codes + i0, mq, sizeof mq);
        memcpy(v_codes + i0, vq, sizeof vq);
    }
}

// One step of AdamW8bit's fp32 path, for its other tensors (fewer than 4096 elements, or
// not whole blocks): fp32 moments m, v (n, starting at zero), torchao's formula and
// rounding, which are not torch.optim.AdamW's (adamw_update)
static inline OPTIMIZER_HOST void adamw_torchao_update(float *p, const float *g, float *m, float *v, size_t n, int t, double lr,
                                 double beta1, double beta2, double eps, double wd) {
    TorchaoAdamScalars s = torchao_adam_scalars(t, lr, beta1, beta2, eps, wd);
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        m[i] = torch_lerp(m[i], g[i], s.w1);
        v[i] = torch_lerp(v[i], mul_rn(g[i], g[i]), s.w2);
        p[i] = torchao_adam_param(p[i], m[i], v[i], &s);
    }
}

// One AnyPrecisionAdamW step (the t-th) on n bf16 parameters p with bf16 gradients g (both
// bf16 values in floats, as the CPU trainer's --pure_bf16 holds them), bf16 moments m, v
// and, with Kahan summation, the bf16 compensation comp (NULL: none), all starting at zero. Each op computes in fp32 and rounds to bf16, in the optimizer's
// order: decay p; m = m * beta1 + (1 - beta1) g; v = v * beta2 + (1 - beta2) g^2 (one
// fma, as torch's addcmul_); denom = sqrt(v) / sqrt(1 - beta2^t) + eps; the step
// -lr / (1 - beta1^t) * m / denom goes into comp and comp into p, comp keeping what p
// could not take, or straight into p.
// element i of anyprecision_update: bf16 state in, bf16 state out (kahan 0: no compensation;
// a constant where it is called, so that each loop is one straight line)
static inline OPTIMIZER_HOST void anyprecision_at(float *p, const float *g, uint16_t *m, uint16_t *v, uint16_t *comp, int kahan,
                                                  size_t i, const AnyPrecisionScalars *s) {
    float mi = st_bf16_to_f32(m[i]), vi = st_bf16_to_f32(v[i]), ci = kahan ? st_bf16_to_f32(comp[i]) : 0.0f;
    p[i] = anyprecision_elem(p[i], g[i], &mi, &vi, kahan ? &ci : NULL, s);
    m[i] = bf16_from_f32(mi), v[i] = bf16_from_f32(vi);
    if (kahan) comp[i] = bf16_from_f32(ci);
}
static inline OPTIMIZER_HOST void anyprecision_update(float *p, const float *g, uint16_t *m, uint16_t *v, uint16_t *comp, size_t n,
                                int t, double lr, double beta1, double beta2, double eps, double wd) {
    AnyPrecisionScalars s = anyprecision_scalars(t, lr, beta1, beta2, eps, wd);
    // (a loop for each case: one loop testing comp at each element does not vectorize)
    if (comp) {
        #pragma omp parallel for firstprivate(s) // (as adamw8bit_update's)
        for (size_t i = 0; i < n; i++) anyprecision_at(p, g, m, v, comp, 1, i, &s);
    } else {
        #pragma omp parallel for firstprivate(s)
        for (size_t i = 0; i < n; i++) anyprecision_at(p, g, m, v, NULL, 0, i, &s);
    }
}

#endif
