// One trainer backend behind the few calls test/test_llama2cu.cu makes, written
// once and compiled twice: test/cpu_twin.c binds it to train_llama2.c (names
// cpu_*), test_llama2cu.cu to train_llama2.cu (names gpu_*), so the CPU twin and
// the CUDA trainer run the same sequence of calls, set up from the same
// arguments, in one process. Include after the trainer, with TWIN_PREFIX defined.
#define TWIN_CAT2(a, b) a##b
#define TWIN_CAT(a, b) TWIN_CAT2(a, b)
#define TWIN(name) TWIN_CAT(TWIN_PREFIX, name)

typedef struct { Model m; Optimizer opt; TrainConfig tc; } Twin;

// a backend set up as the trainer sets itself up from these arguments, for
// micro-batches of up to B rows of T tokens
void *TWIN(new)(int argc, char **argv, int B, int T) {
    Twin *t = (Twin *)callocCheck(1, sizeof(Twin));
    if (parse_args(&t->tc, argc, argv) != 0) die("test arguments rejected");
    if (model_setup(&t->m, NULL, &t->tc, B, T, NULL) != 0) die("cannot set up %s", t->tc.model);
    optimizer_init(&t->opt, &t->m);
    return t;
}

void TWIN(free)(void *p) {
    Twin *t = (Twin *)p;
    optimizer_free(&t->opt);
    model_free(&t->m);
    free(t);
}

// LoRA dropout from now on (an adapter read from a PEFT folder brings its own)
void TWIN(set_lora_dropout)(void *p, float dropout) { ((Twin *)p)->m.host.lora.dropout = dropout; }

// the summed loss as evaluation computes it (no dropout) and the logits (B, T, V)
double TWIN(forward)(void *p, const int *tokens, const int *targets, int B, int T, float *logits) {
    Twin *t = (Twin *)p;
    t->m.host.lora.training = 0;
    double loss = model_forward(&t->m, tokens, targets, B, T, logits);
    t->m.host.lora.training = 1;
    return loss;
}

// the summed loss with dropout masks from key, and the gradients of grad_scale * loss
double TWIN(forward_backward)(void *p, const int *tokens, const int *targets, int B, int T, float grad_scale,
                              uint64_t key) {
    Twin *t = (Twin *)p;
    optimizer_zero_grad(&t->opt);
    t->m.dropout_key = key;
    return model_forward_backward(&t->m, tokens, targets, B, T, grad_scale);
}

// one optimizer step of `micro` micro-batches (tokens and targets (micro, B, T)) with the
// arguments' optimizer settings, --lr (constant) and clipping, the gradients computed
// loss_scale times larger and unscaled in the step (a power of two; 1: none); returns the
// summed loss, *norm the (unscaled) gradient norm
double TWIN(step)(void *p, const int *tokens, const int *targets, int B, int T, float grad_scale, uint64_t key,
                  float loss_scale, double *norm, int micro) {
    Twin *t = (Twin *)p;
    double loss = 0;
    for (int k = 0; k < micro; k++) { // (the first zeroes the gradients)
        if (k == 0) optimizer_zero_grad(&t->opt);
        t->m.dropout_key = key + k;
        loss += model_forward_backward(&t->m, tokens + (size_t)k * B * T, targets + (size_t)k * B * T, B, T,
                                       grad_scale * loss_scale);
    }
    *norm = optimizer_step(&t->opt, t->tc.lr, 1.0f / loss_scale, 1);
    return loss;
}

// preference tuning from now on (trainer.h's contract): each target's weight in the loss (weights,
// B T; NULL: 1), each target's cross-entropy into losses (B T; NULL: none), and the first `shared`
// positions of rows B/2 .. B - 1 run once, with rows 0 .. B/2 - 1's (0: two rows)
void TWIN(set_preference)(void *p, const float *weights, double *losses, int shared) {
    Twin *t = (Twin *)p;
    t->m.loss_weights = weights, t->m.target_losses = losses, t->m.shared_prompt = shared;
}

// DPO's reference traded with the trained weights (model_reference_swap; set up with --objective dpo)
void TWIN(reference_swap)(void *p) { model_reference_swap(&((Twin *)p)->m); }

// the trainable gradients into out (host, n of them; NULL: only count them)
size_t TWIN(grads)(void *p, float *out) {
    Twin *t = (Twin *)p;
    size_t n = t->opt.n;
#ifdef __CUDACC__
    if (out) cudaCheck(cudaMemcpy(out, t->m.grads, n * sizeof(float), cudaMemcpyDeviceToHost));
#else
    if (out) memcpy(out, t->opt.grads, n * sizeof(float));
#endif
    return n;
}
