// peft/adaption_prompt.h: llama_adapter's attention branch (peft's AdaptionPromptConfig, the
// LLaMA-Adapter paper's zero-init attention), the CPU's forward and backward.
//
// A layer with a prompt P (A, D) (lora.h keeps it, and its gate g) adds to its attention
// output, before o_proj, for every query q (its head h, after RoPE):
//
//   Kp = P Wk^T, Vp = P Wv^T         (A, NKV*hd): the layer's own frozen k_proj, v_proj, no RoPE
//   y_h = g * softmax(q_h Kp_kv^T / sqrt(hd)) Vp_kv,   kv = h / (NH / NKV)
//
// with no mask (every query sees every prompt row), so a query's branch depends on
// nothing but itself: a chunk's queries need no carry. GQA's kv is peft's
// repeat_interleave of the KV heads. The gate multiplies plainly (no tanh), from 0:
// training starts at the base model. The backward recomputes Kp, Vp and the
// probabilities (A rows per query) rather than keep them. peft/adaption_prompt.cuh has the
// GPU's twins, with the same names and arguments (the gate is read where the optimizer
// keeps it, as a pointer; Kp and Vp are fp32, their gradients in the compute type).
#ifndef ADAPTION_PROMPT_H
#define ADAPTION_PROMPT_H
#include <math.h>
#include <string.h>
#include "../support/matmul.h"

// kpvp (2, A, KV) = Kp, Vp: the prompt (A, D) through the layer's k_proj and v_proj (KV, D)
static void adaption_kv(float *kpvp, const float *prompt, const float *wk, const float *wv, int A, int D, int KV) {
    matmul_forward(kpvp, prompt, wk, A, D, KV, 1.0f, 0);
    matmul_forward(kpvp + (size_t)A * KV, prompt, wv, A, D, KV, 1.0f, 0);
}

// softmax(q Kp^T / sqrt(hd)) (A) of one query head q (hd) against its KV head's rows of kp
// (A, KV), KV = NKV * hd; kv0: the head's first column
static void adaption_probs(float *p, const float *q, const float *kp, int A, size_t KV, size_t kv0, int hd) {
    float scale = 1.0f / sqrtf((float)hd), max = -INFINITY, sum = 0.0f;
    for (int j = 0; j < A; j++) {
        float s = 0.0f;
        for (int d = 0; d < hd; d++) s += q[d] * kp[j * KV + kv0 + d];
        p[j] = s * scale;
        max = p[j] > max ? p[j] : max;
    }
    for (int j = 0; j < A; j++) sum += p[j] = expf(p[j] - max);
    for (int j = 0; j < A; j++) p[j] /= sum;
}

// out (N, NH*hd) = inp + g * softmax(q Kp^T / sqrt(hd)) Vp per head, q (N, NH*hd) after RoPE;
// prompt (A, D), wk, wv (NKV*hd, D); kpvp (2, A, NKV*hd) scratch
static void adaption_prompt_forward(float *out, const float *inp, const float *q, const float *prompt, const float *g,
                                    const float *wk, const float *wv, float *kpvp, int N, int D, int NH, int NKV,
                                    int hd, int A) {
    float gate = *g;
    size_t KV = (size_t)NKV * hd, Q = (size_t)NH * hd;
    const float *kp = kpvp, *vp = kpvp + (size_t)A * KV;
    adaption_kv(kpvp, prompt, wk, wv, A, D, (int)KV);
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        float p[A];
        for (int h = 0; h < NH; h++) {
            size_t kv0 = (size_t)(h / (NH / NKV)) * hd, at = (size_t)n * Q + (size_t)h * hd;
            adaption_probs(p, q + at, kp, A, KV, kv0, hd);
            for (int d = 0; d < hd; d++) {
                float z = 0.0f;
                for (int j = 0; j < A; j++) z += p[j] * vp[j * KV + kv0 + d];
                out[at + d] = inp[at + d] + gate * z;
            }
        }
    }
}

// Given dout (N, NH*hd), the gradient of the forward's out: dq (N, NH*hd) += the queries'
// (before RoPE's backward), dprompt (A, D) += the prompt's through k_proj and v_proj, and
// *dgate += the gate's. Scratch: kpvp (2, A, NKV*hd) Kp, Vp; dkv (2, NKV*hd, A) their
// gradients, transposed (the weight-gradient form of the product back to the prompt);
// coef (2, N, NH, A) each query's g * p and its score gradient; gz (N, NH).
static void adaption_prompt_backward(float *dq, float *dprompt, float *dgate, const float *dout, const float *q,
                                     const float *prompt, const float *g, const float *wk, const float *wv, float *kpvp,
                                     float *dkv, float *coef, float *gz, int N, int D, int NH, int NKV, int hd, int A) {
    size_t KV = (size_t)NKV * hd, Q = (size_t)NH * hd, NA = (size_t)N * NH * A;
    float *kp = kpvp, *vp = kp + (size_t)A * KV, *dkt = dkv, *dvt = dkv + (size_t)A * KV;
    float *gp = coef, *ds = coef + NA, scale = 1.0f / sqrtf((float)hd), gate = *g;
    int group = NH / NKV;
    adaption_kv(kpvp, prompt, wk, wv, A, D, (int)KV);
    // per query: the gate's share dout . z, dq, and the coefficients of dKp and dVp
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        float dp[A];
        for (int h = 0; h < NH; h++) {
            size_t kv0 = (size_t)(h / group) * hd, at = (size_t)n * Q + (size_t)h * hd, row = ((size_t)n * NH + h) * A;
            float *p = gp + row, pdp = 0.0f, share = 0.0f;
            adaption_probs(p, q + at, kp, A, KV, kv0, hd);
            for (int j = 0; j < A; j++) { // dp = g dout . Vp_j; the gate's: dout . sum_j p_j Vp_j
                float dv = 0.0f;
                for (int d = 0; d < hd; d++) dv += dout[at + d] * vp[j * KV + kv0 + d];
                share += p[j] * dv;
                dp[j] = gate * dv;
                pdp += p[j] * dp[j];
            }
            gz[(size_t)n * NH + h] = share;
            for (int j = 0; j < A; j++) { // softmax's backward, the 1/sqrt(hd) folded in
                ds[row + j] = p[j] * (dp[j] - pdp) * scale;
                for (int d = 0; d < hd; d++) dq[at + d] += ds[row + j] * kp[j * KV + kv0 + d];
                p[j] *= gate;
            }
        }
    }
    // dKp_j = sum over the queries of its KV head's heads of ds_j q, dVp_j of g p_j dout, in query order
    #pragma omp parallel for
    for (size_t c = 0; c < KV; c++) {
        int kv = (int)(c / hd), d = (int)(c % hd);
        for (int j = 0; j < A; j++) {
            float sk = 0.0f, sv = 0.0f;
            for (int n = 0; n < N; n++)
                for (int h = kv * group; h < (kv + 1) * group; h++) {
                    size_t at = (size_t)n * Q + (size_t)h * hd + d, row = ((size_t)n * NH + h) * A + j;
                    sk += ds[row] * q[at], sv += gp[row] * dout[at];
                }
            dkt[c * A + j] = sk, dvt[c * A + j] = sv;
        }
    }
    // dprompt (A, D) += dKp (A, KV) Wk + dVp Wv
    matmul_backward(NULL, dprompt, dkt, wk, NULL, (int)KV, D, A, 1.0f);
    matmul_backward(NULL, dprompt, dvt, wv, NULL, (int)KV, D, A, 1.0f);
    double sum = 0;
    for (size_t i = 0; i < (size_t)N * NH; i++) sum += gz[i];
    *dgate += (float)sum;
}
#endif
