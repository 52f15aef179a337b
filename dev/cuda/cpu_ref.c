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
void ref_rope_tables(float *cosb, float *sinb, int T, int hd, float theta) { rope_tables(cosb, sinb, T, hd, theta); }
void ref_rope_forward(float *x, const float *cosb, const float *sinb, int B, int T, int t0, int len, int nh, int hd,
                      int inverse) {
    Chunk ch = {B, T, t0, len};
    rope_forward(x, cosb, sinb, &ch, nh, hd, inverse);
}
void ref_rope_backward(float *dx, const float *cosb, const float *sinb, int B, int T, int t0, int len, int nh, int hd) {
    Chunk ch = {B, T, t0, len};
    rope_backward(dx, cosb, sinb, &ch, nh, hd);
}
void ref_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v, int B, int T,
                           int t0, int len, int NH, int NKV, int hd) {
    Chunk ch = {B, T, t0, len};
    attention_forward(out, lse, q, k, v, &ch, NH, NKV, hd);
}
void ref_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                            const float *q, const float *k, const float *v, int B, int T, int t0, int len, int NH,
                            int NKV, int hd) {
    Chunk ch = {B, T, t0, len};
    attention_backward(dq, dk, dv, dout, out, lse, q, k, v, &ch, NH, NKV, hd);
}
double ref_crossentropy_forward_backward(float *logits, const int *targets, int n, int V, float grad_scale) {
    return crossentropy_forward_backward(logits, targets, n, V, grad_scale);
}
void ref_swiglu_forward(float *out, const float *gate, const float *up, size_t n) { swiglu_forward(out, gate, up, n); }
void ref_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n) {
    swiglu_backward(dgate, dup, dout, gate, up, n);
}
void ref_adamw_update(float *params, float *grads, float *m, float *v, size_t n, int t, float lr, float beta1,
                      float beta2, float eps, float wd) {
    Optimizer o = {.params = params, .grads = grads, .n = n, .m = m, .v = v, .t = t - 1};
    adamw_update(&o, lr, beta1, beta2, eps, wd);
}
double ref_grad_norm(const float *g, size_t n) { return grad_norm(g, n); }
void ref_clip_grads(float *g, size_t n, double norm, float max_norm) { clip_grads(g, n, norm, max_norm); }
