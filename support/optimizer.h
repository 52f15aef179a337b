// The optimizers both trainers run, as torch.optim defines them: their
// settings and their state tensors. trainer.h fills the settings from the
// command line; each backend runs the updates (train_llama2.c's adamw_update
// and sgd_update, layers.cuh's kernels of the same names); checkpoints save
// the state under torch's names, so a checkpoint says what it holds.
#ifndef OPTIMIZER_H
#define OPTIMIZER_H

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

#endif
