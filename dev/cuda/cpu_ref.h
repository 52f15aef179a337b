// The CPU twins of the CUDA kernels, exported from train_llama2.c by cpu_ref.c
// for the dev/cuda checks. Same arguments as the twins, except that a Chunk is
// passed as its numbers (B, T, t0, len, and for attention window and s2_group) and the
// optimizer as its arrays.
#ifndef CPU_REF_H
#define CPU_REF_H
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

void ref_matmul_forward(float *out, const float *inp, const float *weight, int N, int I, int O, float alpha,
                        int accumulate);
void ref_matmul_backward(float *dinp, float *dweight, const float *dout, const float *inp, const float *weight, int N,
                         int I, int O, float alpha);
void ref_embedding_forward(float *out, const int *tokens, const float *embed, int N, int D);
void ref_embedding_backward(float *dembed, const float *dout, const int *tokens, int N, int D);
void ref_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N, int D, float eps);
void ref_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                          const float *rstd, int N, int D);
// model.h's rope_inv_freq for a Config with these RoPE settings (type: "default", "linear" or "llama3")
void ref_rope_inv_freq(float *inv_freq, int hd, float theta, const char *type, double factor, double low_freq_factor,
                       double high_freq_factor, int original_max_pos);
void ref_rope_tables(float *cosb, float *sinb, int T, int hd, const float *inv_freq);
void ref_rope_forward(float *x, const float *cosb, const float *sinb, int B, int T, int t0, int len, int nh, int hd,
                      int inverse);
void ref_rope_backward(float *dx, const float *cosb, const float *sinb, int B, int T, int t0, int len, int nh, int hd);
void ref_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v, int B, int T,
                           int t0, int len, int window, int s2_group, int NH, int NKV, int hd);
void ref_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                            const float *q, const float *k, const float *v, int B, int T, int t0, int len, int window,
                            int s2_group, int NH, int NKV, int hd);
double ref_crossentropy_forward_backward(float *logits, const int *targets, const float *weights, int n, int V, float grad_scale);
void ref_swiglu_forward(float *out, const float *gate, const float *up, size_t n);
void ref_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n);
// t: the step number after this update (1 for the first), as Optimizer.t after adamw_update's increment
void ref_adamw_update(float *params, float *grads, float *m, float *v, size_t n, int t, float lr, float beta1,
                      float beta2, float eps, float wd);
// buf: the momentum buffer, NULL without momentum; t as for ref_adamw_update (1: the buffer starts as the gradient)
void ref_sgd_update(float *params, float *grads, float *buf, size_t n, int t, float lr, float momentum, int nesterov,
                    float wd);
// torchao's AdamW8bit (its 8-bit path: codes and a per-256 absmax; its fp32 path) and
// AnyPrecisionAdamW (bf16 as uint16_t, comp NULL: no Kahan); t as for ref_adamw_update,
// the hyperparameters as the Python floats the optimizers take
void ref_adamw8bit_update(float *p, const float *g, uint8_t *m_codes, float *m_absmax, uint8_t *v_codes,
                          float *v_absmax, size_t n, int t, double lr, double beta1, double beta2, double eps,
                          double wd);
void ref_adamw_torchao_update(float *p, const float *g, float *m, float *v, size_t n, int t, double lr, double beta1,
                              double beta2, double eps, double wd);
void ref_anyprecision_update(uint16_t *p, const uint16_t *g, uint16_t *m, uint16_t *v, uint16_t *comp, size_t n,
                             int t, double lr, double beta1, double beta2, double eps, double wd);
double ref_grad_norm(const float *g, size_t n);
void ref_clip_grads(float *g, size_t n, double norm, float max_norm, float inv_scale);
// lora.h's pieces for an adapter of one module (layer 0, q_proj): A (r, in), B (out, r),
// scale alpha / r, dropout p (while training), rows of the chunk (B, T, t0, len)
void ref_lora_dropout(float *out, const float *inp, int in, int B, int T, int t0, int len, uint64_t key, float p);
void ref_lora_forward(float *out, const float *inp, float *h, const float *A, const float *Bw, int r, int in, int out_dim,
                      float alpha, float p, int B, int T, int t0, int len, uint64_t key);
void ref_lora_backward(float *dinp, float *dA, float *dB, const float *dout, const float *inp, const float *h,
                       const float *A, const float *Bw, int r, int in, int out_dim, float alpha, float p, int B, int T,
                       int t0, int len, uint64_t key);
// DoRA's (the same module with a magnitude mag (out)): the row norms of w (out, in) + scale B A,
// and the magnitude they start it at; the forward onto out = x w^T; the backward after dinp += dout w
void ref_dora_norm(float *norm, float *mag_init, const float *w, const float *A, const float *Bw, int r, int in,
                   int out_dim, float alpha);
void ref_dora_forward(float *out, const float *inp, const float *w, float *h, const float *A, const float *Bw,
                      const float *mag, const float *norm, int r, int in, int out_dim, float alpha, float p, int B, int T,
                      int t0, int len, uint64_t key);
void ref_dora_backward(float *dinp, float *dA, float *dB, float *dmag, const float *dout, const float *inp,
                       const float *w, const float *h, const float *A, const float *Bw, const float *mag,
                       const float *norm, int r, int in, int out_dim, float alpha, float p, int B, int T, int t0, int len,
                       uint64_t key);
// IA3 on one module (layer 0, q_proj) with vector vec: (in) scaling its input when
// feedforward, else (out) its output; dvec (its length) is added into
void ref_ia3_forward(float *out, const float *inp, const float *w, const float *vec, int feedforward, int in, int out_dim,
                     int N);
void ref_ia3_backward(float *dinp, float *dvec, const float *dout, const float *inp, const float *w, const float *vec,
                      int feedforward, int in, int out_dim, int N);

void ref_adaption_prompt_forward(float *out, const float *inp, const float *q, const float *prompt, const float *g,
                                 const float *wk, const float *wv, float *kpvp, int N, int D, int NH, int NKV, int hd, int A);
void ref_adaption_prompt_backward(float *dq, float *dprompt, float *dgate, const float *dout, const float *q,
                                  const float *prompt, const float *g, const float *wk, const float *wv, float *kpvp,
                                  float *dkv, float *coef, float *gz, int N, int D, int NH, int NKV, int hd, int A);

// prefix tuning (peft/prefix.h): the prompt (P, L * 2 * KV) into the carries' first P rows of
// (L, B, P + T, KV); dprompt += the dKV carries' first P rows, summed over the B rows
void ref_prefix_to_carry(float *k, float *v, const float *prompt, int L, int B, int P, int T, size_t KV);
void ref_prefix_backward(float *dprompt, const float *dk, const float *dv, int L, int B, int P, int T, size_t KV);

#ifdef __cplusplus
}
#endif
#endif
