// The optimizers both trainers run, as torch.optim, torchao and llama-recipes define them: their
// settings and their state tensors. trainer.h fills the settings from the
// command line; each backend runs the updates (train_llama2.c's adamw_update,
// sgd_update and adamw8bit_update, layers.cuh's kernels of the same names);
// checkpoints save the state under torch's names, so a checkpoint says what it holds.
#ifndef OPTIMIZER_H
#define OPTIMIZER_H
#include <stdint.h>
#include <string.h>
#include <math.h>
#include "utils.h"
#include "safetensors.h"
#ifdef __CUDACC__
#include <cuda_bf16.h> // bf16_rn on the device
#endif

enum { OPTIMIZER_ADAMW, OPTIMIZER_SGD, OPTIMIZER_ADAMW8BIT, OPTIMIZER_ANYPRECISION };
static const char *const optimizer_names[] = {"adamw", "sgd", "adamw8bit", "anyprecision"}; // --optimizer, by kind

typedef struct {
    int kind;                 // OPTIMIZER_ADAMW, OPTIMIZER_SGD, OPTIMIZER_ADAMW8BIT or OPTIMIZER_ANYPRECISION
    float weight_decay;       // AdamW: decoupled, p -= lr * wd * p; SGD: added to the gradient, g += wd * p
    float grad_clip;          // the global gradient norm is clipped to this before the step (0: off)
    float beta1, beta2, eps;  // AdamW, AdamW8bit, AnyPrecisionAdamW
    float momentum;           // SGD: the momentum buffer's decay (0: plain SGD, no buffer)
    int nesterov;             // SGD: Nesterov momentum (needs momentum > 0)
    int kahan;                // AnyPrecisionAdamW: Kahan summation (a bf16 compensation buffer)
} OptimizerSettings;

// the state tensors the optimizer keeps: AdamW's two moments and SGD's momentum buffer
// (none without momentum), one float per trainable parameter; AdamW8bit's two moments as
// the codes and block absmax of its 8-bit tensors and the fp32 moments of the others;
// AnyPrecisionAdamW's two moments and, with Kahan summation, its compensation, one bf16
// per parameter (llama-recipes' defaults: momentum, variance and compensation in bf16)
#define OPTIMIZER_MAX_STATES 6
static inline int optimizer_n_states(const OptimizerSettings *s) {
    return s->kind == OPTIMIZER_ADAMW ? 2 : s->kind == OPTIMIZER_ADAMW8BIT ? 6 : s->kind == OPTIMIZER_ANYPRECISION ? 2 + !!s->kahan
                                                                                                                : s->momentum != 0.0f;
}
static const char *const optimizer_state_names[][OPTIMIZER_MAX_STATES] = {
    {"exp_avg", "exp_avg_sq"}, {"momentum_buffer"},
    {"exp_avg.codes", "exp_avg.absmax", "exp_avg", "exp_avg_sq.codes", "exp_avg_sq.absmax", "exp_avg_sq"},
    {"exp_avg", "exp_avg_sq", "compensation"}};
static const char *const optimizer_state_what[] = {"AdamW", "momentum", "AdamW8bit", "AnyPrecision"}; // (the memory plan's words)

// AdamW8bit's state over the trainable tensors, as torchao lays it out: each tensor of at
// least 4096 elements in whole blocks of 256 keeps 8-bit moments (a code per element and
// an fp32 absmax per block, the blocks from the tensor's first element), every other one
// fp32 moments. The tensors are the flat trainable parameters' (LoRA's A, B and DoRA's
// magnitudes, or the model's weights) in their flat order; in sharded full fine-tuning, the
// pieces of them in this rank's shards, each a tensor's whole blocks (model.h aligns the
// shards to them), its 8-bit state decided by the whole tensor.
#define ADAMW8BIT_BLOCK 256
typedef struct {
    int n;              // tensors (or pieces)
    size_t *numel;      // (n) each one's elements
    size_t *first;      // (n) where it starts in the flat trainable parameters and gradients
    size_t *at;         // (n) where its state starts: in the codes (8-bit; its absmax at at / 256), or in the fp32 moments
    uint8_t *quant;     // (n) 8-bit state (or fp32)
    size_t n8, n32;     // the elements with 8-bit state, with fp32 state
} OptimTensors;
static inline int adamw8bit_quantized(size_t numel) { return numel >= 4096 && numel % ADAMW8BIT_BLOCK == 0; }
// n tensors (pieces) of numel[k] elements at first[k], 8-bit where quant[k]; first NULL: they
// follow one another from 0, quant NULL: each as adamw8bit_quantized says
static inline void optim_tensors_init(OptimTensors *t, const size_t *numel, const size_t *first, const uint8_t *quant, int n) {
    t->n = n;
    t->numel = (size_t *)mallocCheck((size_t)n * sizeof(size_t) + 1);
    t->first = (size_t *)mallocCheck((size_t)n * sizeof(size_t) + 1);
    t->at = (size_t *)mallocCheck((size_t)n * sizeof(size_t) + 1);
    t->quant = (uint8_t *)mallocCheck((size_t)n + 1);
    t->n8 = t->n32 = 0;
    size_t f = 0;
    for (int k = 0; k < n; f += numel[k++]) {
        t->numel[k] = numel[k];
        t->first[k] = first ? first[k] : f;
        t->quant[k] = quant ? quant[k] : (uint8_t)adamw8bit_quantized(numel[k]);
        size_t *count = t->quant[k] ? &t->n8 : &t->n32;
        t->at[k] = *count;
        *count += numel[k];
    }
}
static inline void optim_tensors_free(OptimTensors *t) {
    free(t->numel);
    free(t->first);
    free(t->at);
    free(t->quant);
    memset(t, 0, sizeof *t);
}

// state tensor i (of optimizer_n_states) for n trainable parameters (t: their tensors, for
// AdamW8bit): its elements, and their dtype in *dtype (F32, or U8 for codes)
// AdamW8bit's state tensor i is part i % ADAMW8BIT_PARTS of moment i / ADAMW8BIT_PARTS
// (exp_avg, exp_avg_sq): the 8-bit tensors' codes, their block absmax, the fp32 moments
enum { ADAMW8BIT_CODES, ADAMW8BIT_ABSMAX, ADAMW8BIT_FP32, ADAMW8BIT_PARTS };
static inline size_t optimizer_state_count(const OptimizerSettings *s, const OptimTensors *t, size_t n, int i, StDtype *dtype) {
    *dtype = s->kind == OPTIMIZER_ANYPRECISION ? ST_BF16 : ST_F32;
    if (s->kind != OPTIMIZER_ADAMW8BIT) return n;
    int part = i % ADAMW8BIT_PARTS;
    if (part == ADAMW8BIT_CODES) *dtype = ST_U8;
    return part == ADAMW8BIT_CODES ? t->n8 : part == ADAMW8BIT_ABSMAX ? t->n8 / ADAMW8BIT_BLOCK : t->n32;
}
// the two moments' parts in a backend's state tensors (host or device pointers)
typedef struct { uint8_t *codes[2]; float *absmax[2], *fp32[2]; } Adamw8bitState;
static inline Adamw8bitState adamw8bit_state(void *const state[OPTIMIZER_MAX_STATES]) {
    Adamw8bitState a;
    for (int k = 0; k < 2; k++) {
        a.codes[k] = (uint8_t *)state[k * ADAMW8BIT_PARTS + ADAMW8BIT_CODES];
        a.absmax[k] = (float *)state[k * ADAMW8BIT_PARTS + ADAMW8BIT_ABSMAX];
        a.fp32[k] = (float *)state[k * ADAMW8BIT_PARTS + ADAMW8BIT_FP32];
    }
    return a;
}
// state tensor i's element size in bytes, and its elements into *count
static inline size_t optimizer_state_elem(const OptimizerSettings *s, const OptimTensors *t, size_t n, int i, size_t *count) {
    StDtype d;
    *count = optimizer_state_count(s, t, n, i, &d);
    return (size_t)st_dtype_size(d);
}
static inline size_t optimizer_state_bytes(const OptimizerSettings *s, const OptimTensors *t, size_t n) {
    size_t bytes = 0;
    StDtype d;
    for (int i = 0; i < optimizer_n_states(s); i++) bytes += optimizer_state_count(s, t, n, i, &d) * st_dtype_size(d);
    return bytes;
}
// the host buffer a checkpoint moves the state through (support/safetensors.h's staging):
// as big as the largest state tensor, at most st_staging_bytes()
static inline size_t optimizer_staging_bytes(const OptimizerSettings *s, const OptimTensors *t, size_t n) {
    size_t widest = 0;
    StDtype d;
    for (int i = 0; i < optimizer_n_states(s); i++) {
        size_t bytes = optimizer_state_count(s, t, n, i, &d) * st_dtype_size(d);
        widest = bytes > widest ? bytes : widest;
    }
    return widest < st_staging_bytes() ? widest : st_staging_bytes();
}

// ----------------------------------------------------------------------------
// One element's update, written once for every place that steps: train_llama2.c's loops
// (support/optimizer_cpu.h), layers.cuh's kernels and train_llama2.cu's --cpu_offload
// step on the host, so the three agree bit for bit. Each product that feeds a sum is
// either an explicit fmaf or rounded on its own (mul_rn): compilers that contract
// a*b + c (nvcc, GCC in -std=gnu11 or C++) then have nothing left to fuse.
// On the device, mul_rn is the intrinsic; the emulated build runs device code on the
// host, with its volatile twin. Host code built by GCC marks every element and loop
// OPTIMIZER_HOST (contraction off), so a plain product stays
// rounded on its own and the loops vectorize (a volatile round trip would stop them:
// dev/bench_optimizer.md); other host compilers get the volatile round trip.
#if defined(__CUDA_ARCH__) || (defined(__CUDACC__) && !defined(__NVCC__))
#define mul_rn(a, b) __fmul_rn(a, b)
#define OPTIMIZER_HOST
#elif defined(__GNUC__) && !defined(__clang__)
#define mul_rn(a, b) ((a) * (b))
#define OPTIMIZER_HOST __attribute__((optimize("fp-contract=off")))
#else
#define mul_rn(a, b) f32_rounded((a) * (b))
#define OPTIMIZER_HOST
#endif

// torch.lerp(s, e, w) with a scalar weight: one fma from the nearer end (torch's
// vector and scalar loops alike)
static inline OPTIMIZER_HOST HOST_DEVICE float torch_lerp(float s, float e, float w) {
    return fabsf(w) < 0.5f ? fmaf(w, e - s, s) : fmaf(w - 1.0f, e - s, e);
}

// torch.optim.AdamW's (foreach=False) step t on one parameter, as torch computes it on
// the CPU: the moments by lerp and one fused addcmul, then decay, then the step; its bias
// corrections in double from the fp32 betas, as both trainers always have
typedef struct {
    float beta2, w1, w2; // exp_avg.lerp_(g, w1); exp_avg_sq * beta2 + w2 * g * g
    float decay;         // 1 - lr * wd: p *= decay
    float neg_step;      // -lr / (1 - beta1^t)
    float bc2_sqrt;      // sqrt(1 - beta2^t)
    float eps;
} AdamWScalars;
static inline AdamWScalars adamw_scalars(int t, float lr, float beta1, float beta2, float eps, float wd) {
    AdamWScalars s;
    s.beta2 = beta2;
    s.w1 = (float)(1.0 - beta1);
    s.w2 = (float)(1.0 - beta2);
    s.decay = (float)(1.0 - (double)lr * wd);
    s.neg_step = (float)(-lr / (1.0 - pow(beta1, t)));
    s.bc2_sqrt = (float)sqrt(1.0 - pow(beta2, t));
    s.eps = eps;
    return s;
}
static inline OPTIMIZER_HOST HOST_DEVICE void adamw_elem(float *p, float g, float *m, float *v, const AdamWScalars *s) {
    float mi = *m = torch_lerp(*m, g, s->w1);
    float vi = *v = fmaf(s->w2 * g, g, s->beta2 * *v);
    *p = mul_rn(*p, s->decay) + s->neg_step * mi / (sqrtf(vi) / s->bc2_sqrt + s->eps);
}

// torch.optim.SGD's (dampening 0) step on one parameter: weight decay into the gradient,
// the momentum buffer (b = g at the first step, then momentum * b + g; buf NULL: none),
// the step along g + momentum * b (Nesterov) or b; every sum one fma, as torch's
static inline OPTIMIZER_HOST HOST_DEVICE void sgd_elem(float *p, float g, float *buf, int first, float lr, float momentum, int nesterov,
                                        float wd) {
    g = fmaf(wd, *p, g);
    if (buf) {
        float b = *buf = first ? g : fmaf(momentum, *buf, g);
        g = nesterov ? fmaf(momentum, b, g) : b;
    }
    *p = fmaf(-lr, g, *p);
}

// The scalars of one step of torchao's AdamW8bit (and of its fp32-state path) and of
// llama-recipes' AnyPrecisionAdamW, rounded as torch rounds them, for both backends'
// updates. The hyperparameters are the Python floats a
// script passes (double): each optimizer rounds 1 - beta in double first, then to fp32,
// so an fp32 beta would give another weight. t is the step, 1 for the first.

// bf16 from fp32, to nearest even as torch's c10::BFloat16 (a NaN becomes 0x7fc0)
static inline OPTIMIZER_HOST uint16_t bf16_from_f32(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if (isnan(x)) return 0x7fc0;
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static inline OPTIMIZER_HOST float bf16_round(float x) { return st_bf16_to_f32(bf16_from_f32(x)); }

// torchao's quantize_8bit_with_qmap for x, a moment divided by its block's absmax: a
// branchless binary search for the last code at or below x in the sorted map, then the
// code above when x - lo >= (hi - lo) / 2 in fp32, so a tie rounds up (not to the first
// nearest code)
static inline OPTIMIZER_HOST HOST_DEVICE uint8_t qmap8_code(float x, const float *qmap) {
    // (unrolled, so that the host's loop over a block's elements vectorizes: GCC does not
    // unroll this search itself before the vectorizer runs, which then sees a loop nest)
    int c = x >= qmap[128] ? 128 : 0;
    c += x >= qmap[c + 64] ? 64 : 0;
    c += x >= qmap[c + 32] ? 32 : 0;
    c += x >= qmap[c + 16] ? 16 : 0;
    c += x >= qmap[c + 8] ? 8 : 0;
    c += x >= qmap[c + 4] ? 4 : 0;
    c += x >= qmap[c + 2] ? 2 : 0;
    c += x >= qmap[c + 1] ? 1 : 0;
    int up = c < 255 ? c + 1 : 255;
    return (uint8_t)(x - qmap[c] >= (qmap[up] - qmap[c]) * 0.5f ? up : c);
}

// torchao.optim.adam's single_param_adam (AdamW: is_adamw): lr is an fp32 tensor, the
// step an fp32 tensor too (beta^step: fp32 powf), weight decay and eps Python numbers
// met by fp32 tensors (rounded to fp32)
typedef struct {
    float lr;
    float decay;    // lr * weight_decay: p - decay * p
    float w1, w2;   // the lerp weights 1 - beta1, 1 - beta2
    float bc1;      // 1 - beta1^t
    float bc2_sqrt; // sqrt(1 - beta2^t)
    float eps;
} TorchaoAdamScalars;
static inline TorchaoAdamScalars torchao_adam_scalars(int t, double lr, double beta1, double beta2, double eps,
                                                      double wd) {
    TorchaoAdamScalars s;
    s.lr = (float)lr;
    s.decay = s.lr * (float)wd;
    s.w1 = (float)(1.0 - beta1);
    s.w2 = (float)(1.0 - beta2);
    s.bc1 = 1.0f - powf((float)beta1, (float)t);
    s.bc2_sqrt = sqrtf(1.0f - powf((float)beta2, (float)t));
    s.eps = (float)eps;
    return s;
}
// single_param_adam's update of one parameter p with its new moments m, v: decay first
static inline OPTIMIZER_HOST HOST_DEVICE float torchao_adam_param(float p, float m, float v, const TorchaoAdamScalars *s) {
    p -= mul_rn(s->decay, p);
    return p - s->lr * (m / s->bc1) / (sqrtf(v) / s->bc2_sqrt + s->eps);
}

// AnyPrecisionAdamW with bf16 moments: Python numbers scaling a bf16 tensor stay fp32
// (mul_, addcmul_'s and addcdiv_'s value), but the alpha of add_ and a number added by
// add_ become bf16 (torch's CPU kernels); lr / (1 - beta1^t), a Python number over an
// fp32 tensor, is torch's reciprocal times lr
typedef struct {
    float decay;        // 1 - lr * weight_decay, in double: p *= decay
    float beta1, beta2; // exp_avg.mul_(beta1), exp_avg_sq.mul_(beta2)
    float alpha1;       // exp_avg.add_(g, alpha=1 - beta1): bf16
    float w2;           // exp_avg_sq.addcmul_(g, g, value=1 - beta2)
    float neg_step;     // -lr / (1 - beta1^t), addcdiv_'s value
    float bc2_sqrt;     // (1 - beta2^t) ** 0.5, fp32
    float eps;          // bf16
} AnyPrecisionScalars;
static inline AnyPrecisionScalars anyprecision_scalars(int t, double lr, double beta1, double beta2, double eps,
                                                       double wd) {
    AnyPrecisionScalars s;
    s.decay = (float)(1.0 - lr * wd);
    s.beta1 = (float)beta1;
    s.beta2 = (float)beta2;
    s.alpha1 = bf16_round((float)(1.0 - beta1));
    s.w2 = (float)(1.0 - beta2);
    s.neg_step = -((1.0f / (1.0f - powf(s.beta1, (float)t))) * (float)lr);
    s.bc2_sqrt = sqrtf(1.0f - powf(s.beta2, (float)t));
    s.eps = bf16_round((float)eps);
    return s;
}

// fp32 rounded to bf16 (to nearest even), as a float: bf16_round, or the device's intrinsics
#ifdef __CUDA_ARCH__
#define bf16_rn(x) __bfloat162float(__float2bfloat16(x))
#else
#define bf16_rn(x) bf16_round(x)
#endif
// --pure_bf16: a micro-batch's gradient g (summed in fp32) added to the step's so far, acc (a
// bf16 value): g rounded once, the sum rounded again, as torch's .grad += on a bf16 tensor
// (train_llama2.c's grads_bf16_end, layers.cuh's grads_bf16_add)
static inline HOST_DEVICE float bf16_grad_add(float acc, float g) { return bf16_rn(acc + bf16_rn(g)); }
// AnyPrecisionAdamW's step on one bf16 parameter p with its bf16 gradient g, moments m, v and
// Kahan compensation c (NULL: none), all floats holding bf16 values; returns the new p. The
// new *c is rounded to bf16 where it is stored.
static inline OPTIMIZER_HOST HOST_DEVICE float anyprecision_elem(float p, float g, float *m, float *v, float *c, const AnyPrecisionScalars *s) {
    p = bf16_rn(p * s->decay);
    // (alpha1 * g, two bf16 significands, is exact: fused or not, one rounding)
    float mi = *m = bf16_rn(fmaf(s->alpha1, g, bf16_rn(*m * s->beta1)));
    float vi = *v = bf16_rn(fmaf(s->w2 * g, g, bf16_rn(*v * s->beta2)));
    float denom = bf16_rn(bf16_rn(bf16_rn(sqrtf(vi)) / s->bc2_sqrt) + s->eps);
    float step = s->neg_step * mi / denom;
    if (!c) return bf16_rn(p + step);
    float ci = bf16_rn(*c + step), pn = bf16_rn(p + ci);
    *c = ci + bf16_rn(p - pn);
    return pn;
}

#endif
