// The optimizers both trainers run, as torch.optim defines them: their
// settings and their state tensors. trainer.h fills the settings from the
// command line; each backend runs the updates (train_llama2.c's adamw_update
// and sgd_update, layers.cuh's kernels of the same names); checkpoints save
// the state under torch's names, so a checkpoint says what it holds.
#ifndef OPTIMIZER_H
#define OPTIMIZER_H
#include <stdint.h>
#include <string.h>
#include <math.h>

enum { OPTIMIZER_ADAMW, OPTIMIZER_SGD };
static const char *const optimizer_names[] = {"adamw", "sgd"}; // --optimizer, by kind

typedef struct {
    int kind;                 // OPTIMIZER_ADAMW or OPTIMIZER_SGD
    float weight_decay;       // AdamW: decoupled, p -= lr * wd * p; SGD: added to the gradient, g += wd * p
    float grad_clip;          // the global gradient norm is clipped to this before the step (0: off)
    float beta1, beta2, eps;  // AdamW
    float momentum;           // SGD: the momentum buffer's decay (0: plain SGD, no buffer)
    int nesterov;             // SGD: Nesterov momentum (needs momentum > 0)
} OptimizerSettings;

// the state tensors the optimizer keeps, each one float per trainable
// parameter: AdamW's two moments, SGD's momentum buffer (none without momentum)
#define OPTIMIZER_MAX_STATES 2
static inline int optimizer_n_states(const OptimizerSettings *s) {
    return s->kind == OPTIMIZER_ADAMW ? 2 : s->momentum != 0.0f;
}
static const char *const optimizer_state_names[][OPTIMIZER_MAX_STATES] = {{"exp_avg", "exp_avg_sq"}, {"momentum_buffer", ""}};

// ----------------------------------------------------------------------------
// The scalars of one step of torchao's AdamW8bit (and of its fp32-state path) and of
// llama-recipes' AnyPrecisionAdamW, rounded as torch rounds them, for both backends'
// updates (train_llama2.c, layers.cuh). The hyperparameters are the Python floats a
// script passes (double): each optimizer rounds 1 - beta in double first, then to fp32,
// so an fp32 beta would give another weight. t is the step, 1 for the first.

// bf16 from fp32, to nearest even as torch's c10::BFloat16 (a NaN becomes 0x7fc0)
static inline uint16_t bf16_from_f32(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if (isnan(x)) return 0x7fc0;
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static inline float bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}
static inline float bf16_round(float x) { return bf16_to_f32(bf16_from_f32(x)); }

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

#endif
