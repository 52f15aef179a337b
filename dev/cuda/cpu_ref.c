// The real CPU twins, not copies: train_llama2.c is included whole (TESTING
// leaves out its main) and its static layer functions are exported under ref_
// names for the dev/cuda checks (cpu_ref.h).
#define TESTING
#include "../../train_llama2.c"
#include "cpu_ref.h"

void ref_matmul_forward(float *out, const float *inp, const float *weight, int N, int I, int O, float alpha,
                        int accumulate) {
    matmul_forward(out, inp, weight, N, I, O, alpha, accumulate);
}
void ref_matmul_backward(float *dinp, float *dweight, const float *dout, const float *inp, const float *weight, int N,
                         int I, int O, float alpha) {
    matmul_backward(dinp, dweight, dout, inp, weight, N, I, O, alpha);
}
void ref_embedding_forward(float *out, const int *tokens, const float *embed, int N, int D) {
    embedding_forward(out, tokens, embed, N, D);
}
void ref_embedding_backward(float *dembed, const float *dout, const int *tokens, int N, int D) {
    embedding_backward(dembed, dout, tokens, N, D);
}
void ref_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N, int D, float eps) {
    rmsnorm_forward(out, rstd, inp, w, N, D, eps);
}
void ref_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                          const float *rstd, int N, int D) {
    rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, D);
}
void ref_rope_inv_freq(float *inv_freq, int hd, float theta, const char *type, double factor, double low_freq_factor,
                       double high_freq_factor, int original_max_pos) {
    int t = ROPE_DEFAULT;
    while (strcmp(rope_type_names[t], type) != 0) t++; // (the checks name only these types)
    Config c = {.head_dim = hd, .rope_theta = theta, .rope_type = t, .rope_factor = factor,
                .rope_low_freq_factor = low_freq_factor, .rope_high_freq_factor = high_freq_factor,
                .rope_original_max_pos = original_max_pos};
    rope_inv_freq(&c, inv_freq);
}
void ref_rope_tables(float *cosb, float *sinb, int T, int hd, const float *inv_freq) {
    rope_tables(cosb, sinb, T, hd, inv_freq);
}
void ref_rope_forward(float *x, const float *cosb, const float *sinb, int B, int T, int t0, int len, int nh, int hd,
                      int inverse) {
    Chunk ch = {B, T, t0, len, 0, 0};
    rope_forward(x, cosb, sinb, &ch, nh, hd, inverse);
}
void ref_rope_backward(float *dx, const float *cosb, const float *sinb, int B, int T, int t0, int len, int nh, int hd) {
    Chunk ch = {B, T, t0, len, 0, 0};
    rope_backward(dx, cosb, sinb, &ch, nh, hd);
}
void ref_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v, int B, int T,
                           int t0, int len, int window, int s2_group, int NH, int NKV, int hd) {
    Chunk ch = {B, T, t0, len, window, s2_group};
    attention_forward(out, lse, q, k, v, &ch, NH, NKV, hd);
}
void ref_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                            const float *q, const float *k, const float *v, int B, int T, int t0, int len, int window,
                            int s2_group, int NH, int NKV, int hd) {
    Chunk ch = {B, T, t0, len, window, s2_group};
    attention_backward(dq, dk, dv, dout, out, lse, q, k, v, &ch, NH, NKV, hd);
}
double ref_crossentropy_forward_backward(float *logits, const int *targets, const float *weights, int n, int V, float grad_scale) {
    return crossentropy_forward_backward(logits, targets, weights, NULL, n, V, grad_scale);
}
void ref_swiglu_forward(float *out, const float *gate, const float *up, size_t n) { swiglu_forward(out, gate, up, n); }
void ref_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n) {
    swiglu_backward(dgate, dup, dout, gate, up, n);
}
void ref_adamw_update(float *params, float *grads, float *m, float *v, size_t n, int t, float lr, float beta1,
                      float beta2, float eps, float wd) {
    adamw_update(params, grads, m, v, n, t, lr, beta1, beta2, eps, wd);
}
void ref_sgd_update(float *params, float *grads, float *buf, size_t n, int t, float lr, float momentum, int nesterov,
                    float wd) {
    sgd_update(params, grads, buf, n, t == 1, lr, momentum, nesterov, wd);
}
void ref_adamw8bit_update(float *p, const float *g, uint8_t *m_codes, float *m_absmax, uint8_t *v_codes,
                          float *v_absmax, size_t n, int t, double lr, double beta1, double beta2, double eps,
                          double wd) {
    adamw8bit_update(p, g, m_codes, m_absmax, v_codes, v_absmax, n, t, lr, beta1, beta2, eps, wd);
}
void ref_adamw_torchao_update(float *p, const float *g, float *m, float *v, size_t n, int t, double lr, double beta1,
                              double beta2, double eps, double wd) {
    adamw_torchao_update(p, g, m, v, n, t, lr, beta1, beta2, eps, wd);
}
void ref_anyprecision_update(uint16_t *p, const uint16_t *g, uint16_t *m, uint16_t *v, uint16_t *comp, size_t n,
                             int t, double lr, double beta1, double beta2, double eps, double wd) {
    float *pf = (float *)callocCheck(2 * n + 1, sizeof(float)), *gf = pf + n; // (the CPU loop's floats)
    for (size_t i = 0; i < n; i++) pf[i] = st_bf16_to_f32(p[i]), gf[i] = st_bf16_to_f32(g[i]);
    anyprecision_update(pf, gf, m, v, comp, n, t, lr, beta1, beta2, eps, wd);
    for (size_t i = 0; i < n; i++) p[i] = bf16_from_f32(pf[i]);
    free(pf);
}
double ref_grad_norm(const float *g, size_t n) { return grad_norm(g, n); }
void ref_clip_grads(float *g, size_t n, double norm, float max_norm, float inv_scale) { clip_grads(g, n, norm, max_norm, inv_scale); }

// an adapter of one module (layer 0, q_proj) holding A (r, in) and B (out, r): the
// key passed to ref_lora_forward / ref_lora_backward is the per-micro-batch key
// that lora_dropout_key turns into the module's own; with mag, a DoRA module (NULL: LoRA's)
static LoRA one_module(const float *A, const float *Bw, const float *mag, int r, int in, int out_dim, float alpha, float p) {
    int ins[LORA_N_TARGETS] = {in}, outs[LORA_N_TARGETS] = {out_dim};
    LoRA l;
    lora_alloc(&l, 1, ins, outs, r, alpha, p, 0, mag != NULL, 1u << LORA_Q);
    memcpy(lora_A(&l, l.params, 0, LORA_Q), A, (size_t)r * in * sizeof(float));
    memcpy(lora_B(&l, l.params, 0, LORA_Q), Bw, (size_t)out_dim * r * sizeof(float));
    if (mag) memcpy(lora_mag(&l, l.params, 0, LORA_Q), mag, (size_t)out_dim * sizeof(float));
    return l;
}
void ref_lora_dropout(float *out, const float *inp, int in, int B, int T, int t0, int len, uint64_t key, float p) {
    LoRA l = {.dropout = p};
    Chunk ch = {B, T, t0, len, 0, 0};
    lora_dropout(&l, out, inp, in, &ch, key);
}
void ref_lora_forward(float *out, const float *inp, float *h, const float *A, const float *Bw, int r, int in, int out_dim,
                      float alpha, float p, int B, int T, int t0, int len, uint64_t key) {
    LoRA l = one_module(A, Bw, NULL, r, in, out_dim, alpha, p);
    Chunk ch = {B, T, t0, len, 0, 0};
    float *xdrop = (float *)mallocCheck((size_t)B * len * in * sizeof(float));
    lora_forward(&l, 0, LORA_Q, out, inp, h, xdrop, &ch, key);
    free(xdrop);
    lora_free(&l);
}
void ref_lora_backward(float *dinp, float *dA, float *dB, const float *dout, const float *inp, const float *h,
                       const float *A, const float *Bw, int r, int in, int out_dim, float alpha, float p, int B, int T,
                       int t0, int len, uint64_t key) {
    LoRA l = one_module(A, Bw, NULL, r, in, out_dim, alpha, p);
    Chunk ch = {B, T, t0, len, 0, 0};
    size_t N = (size_t)B * len;
    float *dh = (float *)mallocCheck(N * r * sizeof(float)), *xdrop = (float *)mallocCheck(N * in * sizeof(float));
    memcpy(lora_A(&l, l.grads, 0, LORA_Q), dA, (size_t)r * in * sizeof(float)); // the gradients are added into
    memcpy(lora_B(&l, l.grads, 0, LORA_Q), dB, (size_t)out_dim * r * sizeof(float));
    lora_backward(&l, 0, LORA_Q, dinp, dout, inp, h, dh, xdrop, &ch, key);
    memcpy(dA, lora_A(&l, l.grads, 0, LORA_Q), (size_t)r * in * sizeof(float));
    memcpy(dB, lora_B(&l, l.grads, 0, LORA_Q), (size_t)out_dim * r * sizeof(float));
    free(dh); free(xdrop);
    lora_free(&l);
}

void ref_dora_norm(float *norm, float *mag_init, const float *w, const float *A, const float *Bw, int r, int in,
                   int out_dim, float alpha) {
    float *unset = (float *)callocCheck(out_dim, sizeof(float));
    LoRA l = one_module(A, Bw, unset, r, in, out_dim, alpha, 0.0f);
    l.mag_unset[LORA_Q] = 1;
    dora_norm(&l, 0, LORA_Q, norm, w);
    memcpy(mag_init, lora_mag(&l, l.params, 0, LORA_Q), (size_t)out_dim * sizeof(float));
    free(unset);
    lora_free(&l);
}
void ref_dora_forward(float *out, const float *inp, const float *w, float *h, const float *A, const float *Bw,
                      const float *mag, const float *norm, int r, int in, int out_dim, float alpha, float p, int B, int T,
                      int t0, int len, uint64_t key) {
    LoRA l = one_module(A, Bw, mag, r, in, out_dim, alpha, p);
    Chunk ch = {B, T, t0, len, 0, 0};
    size_t N = (size_t)B * len;
    float *xdrop = (float *)mallocCheck(N * in * sizeof(float)), *pre = (float *)mallocCheck(N * out_dim * sizeof(float));
    dora_forward(&l, 0, LORA_Q, out, inp, w, h, xdrop, pre, norm, &ch, key);
    free(xdrop); free(pre);
    lora_free(&l);
}
void ref_dora_backward(float *dinp, float *dA, float *dB, float *dmag, const float *dout, const float *inp,
                       const float *w, const float *h, const float *A, const float *Bw, const float *mag,
                       const float *norm, int r, int in, int out_dim, float alpha, float p, int B, int T, int t0, int len,
                       uint64_t key) {
    LoRA l = one_module(A, Bw, mag, r, in, out_dim, alpha, p);
    Chunk ch = {B, T, t0, len, 0, 0};
    size_t N = (size_t)B * len;
    float *dh = (float *)mallocCheck(N * r * sizeof(float)), *xdrop = (float *)mallocCheck(N * in * sizeof(float));
    float *pre = (float *)mallocCheck(N * out_dim * sizeof(float));
    memcpy(lora_A(&l, l.grads, 0, LORA_Q), dA, (size_t)r * in * sizeof(float)); // the gradients are added into
    memcpy(lora_B(&l, l.grads, 0, LORA_Q), dB, (size_t)out_dim * r * sizeof(float));
    memcpy(lora_mag(&l, l.grads, 0, LORA_Q), dmag, (size_t)out_dim * sizeof(float));
    dora_backward(&l, 0, LORA_Q, dinp, dout, inp, w, h, dh, xdrop, pre, norm, &ch, key);
    memcpy(dA, lora_A(&l, l.grads, 0, LORA_Q), (size_t)r * in * sizeof(float));
    memcpy(dB, lora_B(&l, l.grads, 0, LORA_Q), (size_t)out_dim * r * sizeof(float));
    memcpy(dmag, lora_mag(&l, l.grads, 0, LORA_Q), (size_t)out_dim * sizeof(float));
    free(dh); free(xdrop); free(pre);
    lora_free(&l);
}

static LoRA ia3_module(const float *vec, int feedforward, int in, int out_dim) {
    int ins[LORA_N_TARGETS] = {in}, outs[LORA_N_TARGETS] = {out_dim};
    LoRA l;
    ia3_alloc(&l, 1, ins, outs, 1u << LORA_Q, feedforward ? 1u << LORA_Q : 0);
    memcpy(ia3_vector(&l, l.params, 0, LORA_Q), vec, (feedforward ? in : out_dim) * sizeof(float));
    return l;
}
void ref_ia3_forward(float *out, const float *inp, const float *w, const float *vec, int feedforward, int in, int out_dim,
                     int N) {
    LoRA l = ia3_module(vec, feedforward, in, out_dim);
    float *xs = (float *)mallocCheck((size_t)N * in * sizeof(float));
    ia3_forward(&l, 0, LORA_Q, out, inp, w, xs, N);
    free(xs);
    lora_free(&l);
}
void ref_ia3_backward(float *dinp, float *dvec, const float *dout, const float *inp, const float *w, const float *vec,
                      int feedforward, int in, int out_dim, int N) {
    LoRA l = ia3_module(vec, feedforward, in, out_dim);
    size_t n = feedforward ? in : out_dim;
    float *xs = (float *)mallocCheck((size_t)N * in * sizeof(float)), *pre = (float *)mallocCheck((size_t)N * out_dim * sizeof(float));
    memcpy(ia3_vector(&l, l.grads, 0, LORA_Q), dvec, n * sizeof(float)); // the gradient is added into
    ia3_backward(&l, 0, LORA_Q, dinp, dout, inp, w, xs, pre, N);
    memcpy(dvec, ia3_vector(&l, l.grads, 0, LORA_Q), n * sizeof(float));
    free(xs); free(pre);
    lora_free(&l);
}
void ref_adaption_prompt_forward(float *out, const float *inp, const float *q, const float *prompt, const float *g,
                                 const float *wk, const float *wv, float *kpvp, int N, int D, int NH, int NKV, int hd, int A) {
    adaption_prompt_forward(out, inp, q, prompt, g, wk, wv, kpvp, N, D, NH, NKV, hd, A);
}
void ref_adaption_prompt_backward(float *dq, float *dprompt, float *dgate, const float *dout, const float *q,
                                  const float *prompt, const float *g, const float *wk, const float *wv, float *kpvp,
                                  float *dkv, float *coef, float *gz, int N, int D, int NH, int NKV, int hd, int A) {
    adaption_prompt_backward(dq, dprompt, dgate, dout, q, prompt, g, wk, wv, kpvp, dkv, coef, gz, N, D, NH, NKV, hd, A);
}
void ref_prefix_to_carry(float *k, float *v, const float *prompt, int L, int B, int P, int T, size_t KV) {
    prefix_to_carry(k, v, prompt, L, B, P, T, KV);
}
void ref_prefix_backward(float *dprompt, const float *dk, const float *dv, int L, int B, int P, int T, size_t KV) {
    prefix_backward(dprompt, dk, dv, L, B, P, T, KV);
}
