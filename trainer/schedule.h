// trainer/schedule.h: what changes from one optimizer step to the next besides the
// weights: the learning rate (transformers' schedules) and the loss scale (torch.amp's
// dynamic loss scaling). train_step reads both; a checkpoint keeps the loss scale.
#ifndef TRAINER_SCHEDULE_H
#define TRAINER_SCHEDULE_H

// ----------------------------------------------------------------------------
// learning-rate schedules as transformers'

// learning rate for optimizer step s (0-based), as transformers' get_*_schedule_with_warmup
static float lr_at(const char *sched, float base, int s, int warmup, int total) {
    if (s < warmup) return base * (float)s / (float)(warmup > 1 ? warmup : 1);
    if (strcmp(sched, "constant") == 0) return base;
    double progress = (double)(s - warmup) / (double)(total - warmup > 1 ? total - warmup : 1);
    if (strcmp(sched, "linear") == 0) return (float)(base * fmax(0.0, (double)(total - s) / fmax(1.0, total - warmup)));
    return (float)(base * fmax(0.0, 0.5 * (1.0 + cos(M_PI * progress)))); // cosine, half a cycle
}

// ----------------------------------------------------------------------------
// dynamic loss scaling as torch.amp.GradScaler's defaults
//
// fp16 has 5 exponent bits: gradients below 2^-24 flush to zero in its
// activations' backward. The loss (and so every gradient) is multiplied by a
// scale, a power of two, and the fp32 gradients divided by it again before
// clipping (exact: a power of two). A step whose gradients overflow (inf or
// NaN) is skipped and the scale halved; after LOSS_SCALE_GROWTH_INTERVAL steps
// in a row without one it doubles. The learning-rate schedule moves on over a
// skipped step (a torch loop calls scheduler.step() every iteration), AdamW's
// step count does not (optimizer.step() did not run).

#define LOSS_SCALE_INIT 65536.0f          // 2^16
#define LOSS_SCALE_GROWTH 2.0f
#define LOSS_SCALE_BACKOFF 0.5f
#define LOSS_SCALE_GROWTH_INTERVAL 2000
typedef struct {
    int on;             // --loss_scale dynamic (auto: with --precision fp16)
    float scale;        // the loss scale of the next step
    int growth_tracker; // steps in a row without an overflow since the last change
} LossScale;

static void loss_scale_init(LossScale *ls, int on) {
    ls->on = on;
    ls->scale = on ? LOSS_SCALE_INIT : 1.0f;
    ls->growth_tracker = 0;
}

// after a step: found_inf says whether its gradients had an inf or NaN (torch's _amp_update_scale_)
static void loss_scale_update(LossScale *ls, int found_inf) {
    if (!ls->on) return;
    if (found_inf) {
        ls->scale *= LOSS_SCALE_BACKOFF;
        ls->growth_tracker = 0;
    } else if (++ls->growth_tracker == LOSS_SCALE_GROWTH_INTERVAL) {
        if (isfinite(ls->scale * LOSS_SCALE_GROWTH)) ls->scale *= LOSS_SCALE_GROWTH;
        ls->growth_tracker = 0;
    }
}

#endif
