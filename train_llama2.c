/*
CPU reference trainer for Llama-2-family models: LoRA (default) or full
fine-tuning of a Hugging Face checkpoint, in fp32 with OpenMP.

It is the judge of everything else in this repository: the CUDA trainer is
compared with it, and it is compared with Hugging Face transformers + peft
(test/test_llama2.c, fixtures from dev/reference/). So it favours plain loops
that read like the math. The two places that are tuned live apart: the GEMM
behind every linear layer's forward and both backward products
(support/matmul.h, on support/vec.h's vectors) and the tiled attention, which
dominates long sequences (attention.h); both are checked against plain
definitions (test/test_llama2.c, test/test_attention.c).

This file is the CPU backend, in reading order: the layers, the Model with its
forward and backward, then the machinery they call, AdamW and SGD, and the few
functions trainer.h's contract asks for. The host side (options, loading and
saving, the training loop, checkpoints, main's default run) is trainer.h and
model.h, shared with train_llama2.cu.

Shapes: B rows of T tokens, D = hidden_size, H = intermediate_size,
NH / NKV = attention / key-value heads, hd = head_dim, V = vocab_size.
*/
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <sys/resource.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "support/utils.h"
#include "support/vec.h"
#include "support/matmul.h" // matmul_forward, matmul_backward
#include "lora.h"
#include "model.h"
#include "support/optimizer.h"
#include "support/optimizer_cpu.h" // adamw_update, sgd_update, adamw8bit_update, ...
#include "attention.h"     // attention_forward, attention_backward
#include "peft/ia3.h"     // IA3: ia3_forward, ia3_backward
#include "peft/adaption_prompt.h" // llama_adapter's branch: adaption_prompt_forward, adaption_prompt_backward
#include "peft/prefix.h"   // prefix tuning in the KV carry: prefix_to_carry, prefix_backward
#include "support/profile.h" // PROF_BEGIN, PROF_END: the spans of --profile_dir

// ----------------------------------------------------------------------------
// the layers, forward and backward (same names in train_llama2.cu)

static void embedding_forward(float *out, const int *tokens, const float *embed, int N, int D) {
    for (int i = 0; i < N; i++) memcpy(out + (size_t)i * D, embed + (size_t)tokens[i] * D, D * sizeof(float));
}
static void embedding_backward(float *dembed, const float *dout, const int *tokens, int N, int D) {
    for (int i = 0; i < N; i++) {
        float *row = dembed + (size_t)tokens[i] * D;
        for (int d = 0; d < D; d++) row[d] += dout[(size_t)i * D + d];
    }
}

// out = x * rsqrt(mean(x^2) + eps) * w, one row of D per token (statistics in double)
static void rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N, int D, float eps) {
    #pragma omp parallel for
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * D;
        double ss = 0;
        for (int d = 0; d < D; d++) ss += (double)x[d] * x[d];
        float r = (float)(1.0 / sqrt(ss / D + eps));
        rstd[i] = r;
        for (int d = 0; d < D; d++) out[(size_t)i * D + d] = x[d] * r * w[d];
    }
}
// dinp += rstd * (w dout - x rstd^2 mean(w dout x)); dw += sum over tokens of dout x rstd
static void rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                             const float *rstd, int N, int D) {
    #pragma omp parallel for
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * D, *dy = dout + (size_t)i * D;
        double dot = 0;
        for (int d = 0; d < D; d++) dot += (double)w[d] * dy[d] * x[d];
        float r = rstd[i], c = (float)(dot / D) * r * r;
        for (int d = 0; d < D; d++) dinp[(size_t)i * D + d] += r * (w[d] * dy[d] - x[d] * c);
    }
    if (dw)
        #pragma omp parallel for
        for (int d = 0; d < D; d++) {
            double s = 0;
            for (int i = 0; i < N; i++) s += (double)dout[(size_t)i * D + d] * inp[(size_t)i * D + d] * rstd[i];
            dw[d] += (float)s;
        }
}

// RoPE in Hugging Face's rotate_half layout, by model.h's tables (rope_tables): rotates x (B, len, nh, hd) of chunk ch in place, row n at position t0 + n % len;
// inverse = 1 applies the transpose (the backward)
static void rope_forward(float *x, const float *cosb, const float *sinb, const Chunk *ch, int nh, int hd, int inverse) {
    int half = hd / 2, N = ch->B * ch->len;
    float sgn = inverse ? -1.0f : 1.0f;
    #pragma omp parallel for
    for (int i = 0; i < N; i++) {
        size_t pos = ch->t0 + i % ch->len;
        const float *c = cosb + pos * half, *s = sinb + pos * half;
        for (int h = 0; h < nh; h++) {
            float *v = x + ((size_t)i * nh + h) * hd;
            for (int j = 0; j < half; j++) {
                float x1 = v[j], x2 = v[j + half];
                v[j] = x1 * c[j] - sgn * x2 * s[j];
                v[j + half] = x2 * c[j] + sgn * x1 * s[j];
            }
        }
    }
}
static void rope_backward(float *dx, const float *cosb, const float *sinb, const Chunk *ch, int nh, int hd) {
    rope_forward(dx, cosb, sinb, ch, nh, hd, 1);
}

// attention_forward and attention_backward, a chunk's queries against the KV carry:
// attention.h

// Summed cross-entropy of n rows of logits (n, V) against targets (-100: no
// loss); each row's into losses (n) when given. With grad_scale != 0 the logits are
// replaced by d(grad_scale * sum_i w_i loss_i)/d(logits) = grad_scale * w_i * (softmax -
// onehot), formed while the row is at hand (rows without a target get 0), so the
// probabilities are never stored; w_i = weights[i], or 1 without weights (SFT's uniform
// weight: preference tuning gives each target its own, trainer/preference.h).
//
// In vectors: the max, e^(z - max) by vexp_n four vectors at a time, the sum in double
// (vsum_add: each lane's share of the row in order, the lanes in order at the end), a
// ragged tail of the row padded with -inf (e^-inf = 0).
// The rows' losses are summed in row order after the parallel loop, not by OpenMP's
// reduction, whose partial sums depend on the thread count (and, from 3 threads, meet in
// whatever order the threads finish): the loss is then the same at any thread count.
static double crossentropy_forward_backward(float *logits, const int *targets, const float *weights, double *losses, int n, int V,
                                            float grad_scale) {
    double *row_loss = losses ? losses : (double *)mallocCheck((size_t)n * sizeof(double)), loss = 0;
    int nv = V / VLEN, tail = V - nv * VLEN;
    #pragma omp parallel for
    for (int i = 0; i < n; i++) {
        float *z = logits + (size_t)i * V;
        vfloat_u *zv = (vfloat_u *)z;
        int y = targets[i];
        row_loss[i] = 0;
        if (y < 0) { if (grad_scale != 0.0f) memset(z, 0, V * sizeof(float)); continue; }
        vfloat last = (vfloat){0} - INFINITY; // the tail, padded
        for (int j = 0; j < tail; j++) last[j] = z[nv * VLEN + j];
        vfloat vmax = last;
        for (int v = 0; v < nv; v++) vmax = vselect(zv[v] > vmax, zv[v], vmax);
        float maxv = vmax[0], zy = z[y];
        for (int j = 1; j < VLEN; j++) maxv = vmax[j] > maxv ? vmax[j] : maxv;
        vdouble lo = {0}, hi = {0};
        int v = 0;
        for (; v + VEXP_MAX <= nv; v += VEXP_MAX) { // z now holds exp(z - max)
            vfloat e[VEXP_MAX];
            for (int u = 0; u < VEXP_MAX; u++) e[u] = zv[v + u] - maxv;
            vexp_n(e, VEXP_MAX);
            for (int u = 0; u < VEXP_MAX; u++) zv[v + u] = e[u], vsum_add(&lo, &hi, e[u]);
        }
        for (; v < nv; v++) {
            vfloat e = vexp(zv[v] - maxv);
            zv[v] = e;
            vsum_add(&lo, &hi, e);
        }
        last = vexp(last - maxv);
        vsum_add(&lo, &hi, last);
        for (int j = 0; j < tail; j++) z[nv * VLEN + j] = last[j];
        double sum = 0;
        for (int j = 0; j < VLEN / 2; j++) sum += lo[j];
        for (int j = 0; j < VLEN / 2; j++) sum += hi[j];
        row_loss[i] = maxv + log(sum) - zy;
        if (grad_scale != 0.0f) {
            float gs = weights ? grad_scale * weights[i] : grad_scale, sc = (float)(gs / sum);
            for (int v = 0; v < nv; v++) zv[v] *= sc;
            for (int j = nv * VLEN; j < V; j++) z[j] *= sc;
            z[y] -= gs;
        }
    }
    for (int i = 0; i < n; i++) loss += row_loss[i];
    if (!losses) free(row_loss);
    return loss;
}

// silu(gate) * up and its backward, by vectors (vsigmoid; n's ragged tail in a padded vector)
static void swiglu_forward(float *out, const float *gate, const float *up, size_t n) {
    size_t nv = n / VLEN;
    int tail = (int)(n - nv * VLEN);
    vfloat_u *o = (vfloat_u *)out;
    const vfloat_u *g = (const vfloat_u *)gate, *u = (const vfloat_u *)up;
    #pragma omp parallel for
    for (size_t v = 0; v < nv; v++) o[v] = g[v] * vsigmoid(g[v]) * u[v];
    if (tail) {
        vfloat gt = vload_tail(gate + nv * VLEN, tail), ut = vload_tail(up + nv * VLEN, tail);
        vstore_tail(out + nv * VLEN, gt * vsigmoid(gt) * ut, tail);
    }
}
static inline void swiglu_backward_v(vfloat *dg, vfloat *du, vfloat d, vfloat g, vfloat u) {
    vfloat sig = vsigmoid(g);
    *du = d * g * sig;
    *dg = d * u * sig * (1.0f + g * (1.0f - sig));
}
static void swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n) {
    size_t nv = n / VLEN;
    int tail = (int)(n - nv * VLEN);
    vfloat_u *dg = (vfloat_u *)dgate, *du = (vfloat_u *)dup;
    const vfloat_u *d = (const vfloat_u *)dout, *g = (const vfloat_u *)gate, *u = (const vfloat_u *)up;
    #pragma omp parallel for
    for (size_t v = 0; v < nv; v++) {
        vfloat a, b;
        swiglu_backward_v(&a, &b, d[v], g[v], u[v]);
        dg[v] = a, du[v] = b;
    }
    if (tail) {
        size_t o = nv * VLEN;
        vfloat a, b;
        swiglu_backward_v(&a, &b, vload_tail(dout + o, tail), vload_tail(gate + o, tail), vload_tail(up + o, tail));
        vstore_tail(dgate + o, a, tail), vstore_tail(dup + o, b, tail);
    }
}

// ----------------------------------------------------------------------------
// the Model and its activations, run chunk by chunk (docs/chunked.md)
//
// A batch of B sequences of T tokens runs in chunks of C positions (C = T: the
// whole sequence). Attention needs the keys and values of every earlier position,
// so those live for the whole sequence in the KV carry; everything else a chunk's
// backward needs is kept per chunk: for every chunk until its backward ("keep"),
// or for one chunk at a time, re-running its forward just before its backward
// ("recompute"), so activation memory grows with C, not with T.
//
// Activation checkpointing (HF's gradient_checkpointing) goes further inside a
// chunk: only each layer's input, resid, is kept for every layer; the other
// arrays hold Lk = 1 layer (else Lk = L), which every layer overwrites in turn,
// and a layer's backward first re-runs its forward from its input to refill it.

typedef struct { CHUNK_ACTS(float) } ChunkActs; // (chunk.h lists the members and their shapes)

typedef struct {
    ChunkActs *chunk;  // (n_slots) one per chunk in keep mode, one in all in recompute mode
                       // (with activation checkpointing they share all but their resid);
                       // a shared prompt's micro-batch lays out one more (slots_layout)
    int n_slots;
    size_t slots_at, slots_bytes; // where the slots are in the activations' allocation, their bytes
    float *k, *v;      // (L, B, P + T, NKV*hd) the KV carry (keys after RoPE), a prefix's P positions first;
                       // context parallel: (L, B, T / P, NKV*hd) this rank's positions only (carry_rows)
    float *dk, *dv;    // the dKV carry, the same shape: gradients for earlier positions
    // scratch for one chunk
    int *tokens;       // (B, C)
    float *lnf;        // (B, C, D)
    float *rstdf;      // (B, C)
    float *logits;     // (ceil(C / num_output_chunks), V) one piece of one row at a time
    float *head_packed; // the output head packed for its forward and its backward product (gemm_pack_b)
                        // when a micro-batch runs the head more than once (NULL: not)
    int head_packed_ok; // which of them hold the head now: 1 the forward's, 2 the backward's
    float *kv;         // (B, C, NKV*hd) a chunk's keys or values before they enter the carry
    float *dresid, *dln; // (B, C, D)
    float *dq, *datty; // (B, C, NH*hd)
    float *dgate, *dup, *dhmlp;  // (B, C, H)
    float *lora_dh;    // (B, C, r)
    float *xdrop;      // (B, C, max(D, H, NH*hd)) LoRA dropout scratch, IA3's scaled input
    float *dora_pre;   // (B, C, max(D, H, NH*hd)) DoRA and IA3 scratch
    float *dora_norm;  // (L, 7, widest out) DoRA's row norms, set by each forward's first chunk
    // llama_adapter (adaption_prompt.h): o_proj's input, attention plus the prompt's branch
    // (B, C, NH*hd); Kp, Vp (2, A, NKV*hd) and their gradients (2, NKV*hd, A); the backward's
    // coefficients (2, B, C, NH, A) and gate shares (B, C, NH)
    float *adapter_y, *adapter_kv, *adapter_dkv, *adapter_coef, *adapter_gz;
    // context parallelism (docs/long_context.md): the rows padded to the group's layout (B, T); one
    // layer's keys, values and their gradients at absolute positions (B, T, NKV*hd), gathered from
    // every rank's carry (context_gather) or reduced into it (context_reduce)
    int *context_tokens, *context_targets;
    float *context_k, *context_v, *context_dk, *context_dv;
} Activations;

// the CPU backend's model
typedef struct {
    // trainer.h's contract: the members every backend's Model holds, described there
    HostModel host;           // on the CPU the only copy of the weights
    int B, T, chunk_size;     // (context parallel: the padded rows' and the pieces': model_buffers)
    int recompute;
    int activation_checkpointing;
    int s2_attn;
    int fp32, fp16;           // --precision fp32: the only one the CPU runs
    int pure_bf16;            // bf16 values in the weights' and gradients' floats (model_forward_backward rounds the gradients)
    int cpu_offload;          // where the trainable state is already (host memory)
    const char *collectives;  // host, always (nothing to choose here)
    int dry_run;
    size_t weight_bytes, param_bytes, act_bytes, carry_bytes;
    uint64_t dropout_key;
    int row0;
    Fsdp *fsdp;               // (NULL: one process)
    OptimizerSettings optimizer; // (the Optimizer's; its state counts here)
    // the CPU's own
    int sharded;              // the base weights are host.shards, sharded over fsdp->shard
    ParameterTensors g;       // gradients of the base weights (full fine-tuning, whole model, no frozen units)
    float *grads;             // full fine-tuning: the whole model's gradients (param_layout's order),
                              // or when sharded this rank's shard of them (host.units.shard_numel)
    uint16_t *grad_acc;       // --pure_bf16: the step's gradients before this micro-batch's (bf16)
    float **slot;             // (n_unit_slots) units gathered whole: two (the embedding's, and one the
    int *slot_unit;           // others share) when the strategy reshards after the forward, else one
    int n_unit_slots;         // per unit; slot_unit: the unit each slot holds (-1: none)
    float *unit_grad[2];      // full fine-tuning, sharded: a unit's gradient whole (the embedding's,
    int grad_open[2];         // the others'), and the unit it is open for (-1: none)
    float *grad_part;         // a unit's gradient reduced to this rank's shard
    float *deq;               // QLoRA: a decoder layer's unit whole, its 4-bit weights dequantized
    float *deq_absmax;        // (the absmax values of one weight, double quantization)
    int deq_unit;             // the unit deq holds (-1: none)
    Activations a;
    int num_output_chunks;    // the output head runs in this many pieces of a chunk
    OptimTensors opt_tensors; // AdamW8bit: the trainable tensors, whose state it lays out (model_alloc)
    void *alloc[4];           // what model_layout places: the slots, the gradients, the activations, the carries
    float *rope_cos, *rope_sin; // (P + T, hd/2)
    Rows rows;                // the micro-batch's rows while model_forward(_backward) runs them (rows_begin; chunk.h)
    int context_len;          // context parallelism with --chunk_size: the pieces' length C (0: each row in 2P pieces)
    // preference tuning (trainer.h's contract)
    const float *loss_weights;
    double *target_losses;
    int reference;
    float *ref_params;        // the trainable weights as training started (LoRA's parameters, the model's,
                              // or this rank's shards of it); model_reference_swap trades them with the trained
    int ref_taken;            // ref_params holds them (the first model_reference_swap copies them, a resume sets them)
    int shared_prompt;
    // context parallelism: the caller's loss_weights and target_losses (B, T) while the rows run
    // padded (rows_begin to rows_end), beside the padded ones the head reads and writes
    RowsScores rows_scores;
} Model;

// the context-parallel group while a micro-batch runs this rank's pieces of the rows (m->rows.P > 1:
// rows_begin to rows_end), else NULL
static FsdpComm *context_comm(const Model *m) { return m->rows.P > 1 ? &m->fsdp->context : NULL; }

// ----------------------------------------------------------------------------
// the model, top down: model_forward_backward runs a micro-batch's chunks through chunk_forward
// (layer_forward for each layer), then back through chunk_head and chunk_backward (docs/chunked.md)

// one decoder layer's tensors (a layer unit's, P_ATTN_NORM .. P_WDOWN), wherever they are
typedef struct { float *attn_norm, *wq, *wk, *wv, *wo, *mlp_norm, *wgate, *wup, *wdown; } LayerWeights;

// Layer l's activations within a chunk's (layer_acts; chunk.h lists the members)
typedef struct { LAYER_ACTS(float) } LayerActs;

typedef struct { float *k, *v, *dk, *dv; } AttentionKV; // what a layer's attention reads, and adds dK, dV into (attention_kv)

// declared ahead: the model's functions below model_forward_backward,
static void chunk_forward(Model *m, ChunkActs *s, const int *tokens, const Chunk *ch);
static void layer_forward(Model *m, ChunkActs *s, const Chunk *ch, int l);
static void chunk_backward(Model *m, ChunkActs *s, const int *tokens, const Chunk *ch);
static double chunk_head(Model *m, ChunkActs *s, const int *targets, const Chunk *ch, float grad_scale, float *logits_out);
// and the machinery the model calls, defined after it in this order: a base linear layer and its adapter,
static void linear_forward(Model *m, float *lora_h, const Chunk *ch, int layer, int t, float *out, const float *inp, const float *w);
static void linear_backward(Model *m, const float *lora_h, const Chunk *ch, int layer, int t, float *dinp, float *dw,
                            const float *dout, const float *inp, const float *w);
// where the weights and their gradients are (sharded: gathered, reduce-scattered; QLoRA: dequantized),
static void units_reshard(Model *m);
static float *embed_weight(Model *m), *head_weight(Model *m), *final_norm(Model *m);
static int head_trains(const Model *m);
static LayerWeights layer_params(Model *m, int l), layer_grads(Model *m, int l);
static float *grad_at(Model *m, int u, int j);
static void grads_done(Model *m, int u);
static float *saved_grad(Model *m, int k);
static void grads_bf16_begin(Model *m), grads_bf16_end(Model *m);
// a layer's activations within its chunk's, the chunk's tokens, the KV carry, context parallelism,
static LayerActs layer_acts(const Model *m, ChunkActs *s, const Chunk *ch, int l);
static void chunk_tokens(int *dst, const int *tokens, const Chunk *ch);
static void carry_copy(float *carry, float *x, const Chunk *ch, size_t w, int dir);
static void context_reduce(Model *m, float *dcarry, float *dx, float *stage, const Chunk *ch, size_t w);
static AttentionKV attention_kv(Model *m, float *k, float *v, float *dk, float *dv, const Chunk *ch, int backward);
// the rows of a micro-batch (their chunks: chunk.h's rows_chunk)
static void check_batch(const Model *m, const int *tokens, int B, int T);
static void rows_begin(Model *m, const int **tokens, const int **targets, int B, int T);
static void rows_end(Model *m);
static void carry_share(Model *m, int dir);
static void slots_place(Model *m, const Rows *r);

// Forward and backward of one micro-batch: returns the summed cross-entropy and
// adds grad_scale * d(loss)/d(parameter) into the gradients of the trainable ones.
// Chunks run forward in order, filling the KV carry, then backward in reverse
// order with the dKV carry; in recompute mode a chunk's forward runs again just
// before its backward (the last chunk's activations are still there).
static double model_forward_backward(Model *m, const int *tokens, const int *targets, int B, int T, float grad_scale) {
    check_batch(m, tokens, B, T);
    Activations *a = &m->a;
    if (head_trains(m)) a->head_packed_ok = 0; // the head may have trained since it was packed
    rows_begin(m, &tokens, &targets, B, T);
    const Rows *r = &m->rows;
    int n = r->n;
    if (r->share && !m->recompute) slots_place(m, r);
    T = r->T;
    size_t carry = (size_t)m->host.config.n_layers * B * (host_prefix(&m->host) + T / fsdp_context_size(m->fsdp)) *
                   m->host.config.n_kv_heads * m->host.config.head_dim;
    memset(a->dk, 0, carry * sizeof(float));
    memset(a->dv, 0, carry * sizeof(float));
    grads_bf16_begin(m);
    for (int j = 0; j < n; j++) {
        Chunk ch = rows_chunk(r, j, 1);
        chunk_forward(m, &a->chunk[m->recompute ? 0 : j], tokens, &ch);
        if (j == rows_shared_last(r)) carry_share(m, 1);
    }
    double loss = 0;
    for (int j = n - 1; j >= 0; j--) {
        Chunk ch = rows_chunk(r, j, 1);
        ChunkActs *s = &a->chunk[m->recompute ? 0 : j];
        if (j == rows_shared_last(r)) carry_share(m, -1);
        if (m->recompute && j < n - 1) chunk_forward(m, s, tokens, &ch);
        PROF_BEGIN(NULL, "head", -1, j, -1); // the final norm, the output projection and the loss, forward and backward
        loss += chunk_head(m, s, targets, &ch, grad_scale, NULL);
        PROF_END(NULL);
        chunk_backward(m, s, tokens, &ch);
    }
    const LoRA *lo = &m->host.lora;
    if (host_prefix(&m->host)) // (its gradient: the dKV carry's first rows)
        prefix_backward(lora_A(lo, lo->grads, 0, 0), a->dk, a->dv, m->host.config.n_layers, B, lo->prefix, T, lo->out[LORA_K]);
    if (r->share && !m->recompute) slots_place(m, NULL);
    rows_end(m);
    units_reshard(m);
    grads_bf16_end(m);
    return loss;
}

// Forward of one chunk through every decoder layer into the activations s,
// appending the chunk's keys and values to the KV carry.
static void chunk_forward(Model *m, ChunkActs *s, const int *tokens, const Chunk *ch) {
    Config *c = &m->host.config;
    int j = ch->t0 / m->chunk_size; // (the spans' chunk)
    const LoRA *lo = &m->host.lora;
    if (ch->t0 == 0 && host_prefix(&m->host)) // (the prefix: one more chunk ahead of the first)
        prefix_to_carry(m->a.k, m->a.v, lora_A(lo, lo->params, 0, 0), c->n_layers, ch->B, lo->prefix, ch->T, lo->out[LORA_K]);
    PROF_BEGIN(NULL, "embedding forward", -1, j, -1);
    chunk_tokens(m->a.tokens, tokens, ch);
    embedding_forward(s->resid, m->a.tokens, embed_weight(m), ch->B * ch->len, c->dim);
    PROF_END(NULL);
    for (int l = 0; l < c->n_layers; l++) {
        PROF_BEGIN(NULL, "forward", l, j, -1);
        layer_forward(m, s, ch, l);
        PROF_END(NULL);
    }
}

// Forward of decoder layer l of one chunk, from its input resid[l] to resid[l + 1],
// its activations into layer_acts' place and its keys and values into the KV carry.
// chunk_backward calls it again with activation checkpointing: the same operations
// on the same input (LoRA dropout masks hash the absolute position) give the same
// bits, the carry's rows included.
static void layer_forward(Model *m, ChunkActs *s, const Chunk *ch, int l) {
    Config *c = &m->host.config;
    Activations *a = &m->a;
    int N = ch->B * ch->len, D = c->dim, NH = c->n_heads, NKV = c->n_kv_heads, hd = c->head_dim;
    Chunk cc = carry_chunk(ch, host_prefix(&m->host)); // the chunk as RoPE and attention see it
    Chunk cr = carry_rows(&m->rows, ch, host_prefix(&m->host)); // and where its keys and values go in the carries
    size_t KV = (size_t)NKV * hd, ND = (size_t)N * D, carry = carry_positions(&m->rows, &cr) * KV;
    LayerWeights w = layer_params(m, l);
    LayerActs act = layer_acts(m, s, ch, l);
    float *kc = LAYER(a->k, l, carry), *vc = LAYER(a->v, l, carry);
    rmsnorm_forward(act.ln1, act.rstd1, act.x, w.attn_norm, N, D, c->norm_eps);
    linear_forward(m, act.lora_h, ch, l, LORA_Q, act.q, act.ln1, w.wq);
    rope_forward(act.q, m->rope_cos, m->rope_sin, &cc, NH, hd, 0);
    linear_forward(m, act.lora_h, ch, l, LORA_K, a->kv, act.ln1, w.wk);
    rope_forward(a->kv, m->rope_cos, m->rope_sin, &cc, NKV, hd, 0);
    carry_copy(kc, a->kv, &cr, KV, 1);
    linear_forward(m, act.lora_h, ch, l, LORA_V, a->kv, act.ln1, w.wv);
    carry_copy(vc, a->kv, &cr, KV, 1);
    AttentionKV at = attention_kv(m, kc, vc, NULL, NULL, ch, 0);
    attention_forward(act.atty, act.lse, act.q, at.k, at.v, &cc, NH, NKV, hd);
    const float *o_in = act.atty; // o_proj's input: with a prompt, the attention plus its branch
    LoRA *lo = &m->host.lora;
    if (m->host.use_lora && adapter_has_prompt(lo, l)) {
        adaption_prompt_forward(a->adapter_y, act.atty, act.q, adapter_prompt(lo, lo->params, l), adapter_gate(lo, lo->params, l),
                                w.wk, w.wv, a->adapter_kv, N, D, NH, NKV, hd, lo->adapter_len);
        o_in = a->adapter_y;
    }
    linear_forward(m, act.lora_h, ch, l, LORA_O, act.mid, o_in, w.wo);
    for (size_t i = 0; i < ND; i++) act.mid[i] += act.x[i];
    rmsnorm_forward(act.ln2, act.rstd2, act.mid, w.mlp_norm, N, D, c->norm_eps);
    linear_forward(m, act.lora_h, ch, l, LORA_GATE, act.gate, act.ln2, w.wgate);
    linear_forward(m, act.lora_h, ch, l, LORA_UP, act.up, act.ln2, w.wup);
    swiglu_forward(act.hm, act.gate, act.up, (size_t)N * c->hidden_dim);
    linear_forward(m, act.lora_h, ch, l, LORA_DOWN, act.out, act.hm, w.wdown);
    for (size_t i = 0; i < ND; i++) act.out[i] += act.mid[i];
}

// Backward of one chunk through every decoder layer, from a->dresid (chunk_head's).
// At each layer's attention the chunk adds dK, dV for every position before its
// end into the dKV carry (context parallel: into the gathered dK, dV, reduced into
// the ranks' carries: context_reduce); its own rows are complete then (later chunks ran
// first), so they flow on through its key and value projections at once. With
// activation checkpointing each layer first re-runs its forward from its input.
static void chunk_backward(Model *m, ChunkActs *s, const int *tokens, const Chunk *ch) {
    Config *c = &m->host.config;
    Activations *a = &m->a;
    int N = ch->B * ch->len, D = c->dim, NH = c->n_heads, NKV = c->n_kv_heads, hd = c->head_dim;
    size_t Q = (size_t)NH * hd, KV = (size_t)NKV * hd, ND = (size_t)N * D, NHd = (size_t)N * c->hidden_dim;
    Chunk cc = carry_chunk(ch, host_prefix(&m->host)), cr = carry_rows(&m->rows, ch, host_prefix(&m->host)); // (as layer_forward's)
    size_t carry = carry_positions(&m->rows, &cr) * KV;
    int full = m->host.full_finetune, frozen = m->host.frozen_units;
    // frozen units (the embedding and layers 0 .. frozen - 2) need no gradient, and nothing
    // below them trains: the backward stops at the first layer that trains
    for (int l = c->n_layers - 1; l >= (frozen ? frozen - 1 : 0); l--) {
        PROF_BEGIN(NULL, "backward", l, ch->t0 / m->chunk_size, -1);
        if (m->activation_checkpointing) layer_forward(m, s, ch, l);
        LayerWeights w = layer_params(m, l), g = {0};
        if (full) g = layer_grads(m, l);
        else g.attn_norm = saved_grad(m, 1 + 2 * l), g.mlp_norm = saved_grad(m, 2 + 2 * l); // (--trainable_params norm)
        LayerActs act = layer_acts(m, s, ch, l);
        float *kc = LAYER(a->k, l, carry), *vc = LAYER(a->v, l, carry);
        float *dkc = LAYER(a->dk, l, carry), *dvc = LAYER(a->dv, l, carry);
        // MLP block; the residual passes dresid through unchanged
        memset(a->dhmlp, 0, NHd * sizeof(float));
        linear_backward(m, act.lora_h, ch, l, LORA_DOWN, a->dhmlp, g.wdown, a->dresid, act.hm, w.wdown);
        swiglu_backward(a->dgate, a->dup, a->dhmlp, act.gate, act.up, NHd);
        memset(a->dln, 0, ND * sizeof(float));
        linear_backward(m, act.lora_h, ch, l, LORA_GATE, a->dln, g.wgate, a->dgate, act.ln2, w.wgate);
        linear_backward(m, act.lora_h, ch, l, LORA_UP, a->dln, g.wup, a->dup, act.ln2, w.wup);
        rmsnorm_backward(a->dresid, g.mlp_norm, a->dln, act.mid, w.mlp_norm, act.rstd2, N, D);
        // attention block
        memset(a->datty, 0, (size_t)N * Q * sizeof(float));
        linear_backward(m, act.lora_h, ch, l, LORA_O, a->datty, g.wo, a->dresid, act.atty, w.wo);
        AttentionKV at = attention_kv(m, kc, vc, dkc, dvc, ch, 1);
        attention_backward(a->dq, at.dk, at.dv, a->datty, act.atty, act.lse, act.q, at.k, at.v, &cc, NH, NKV, hd);
        if (context_comm(m)) context_reduce(m, dkc, at.dk, at.k, ch, KV), context_reduce(m, dvc, at.dv, at.v, ch, KV);
        LoRA *lo = &m->host.lora;
        if (m->host.use_lora && adapter_has_prompt(lo, l)) // datty is its out's gradient too
            adaption_prompt_backward(a->dq, adapter_prompt(lo, lo->grads, l), adapter_gate(lo, lo->grads, l), a->datty, act.q,
                                     adapter_prompt(lo, lo->params, l), adapter_gate(lo, lo->params, l), w.wk, w.wv,
                                     a->adapter_kv, a->adapter_dkv, a->adapter_coef, a->adapter_gz, N, D, NH, NKV, hd, lo->adapter_len);
        rope_backward(a->dq, m->rope_cos, m->rope_sin, &cc, NH, hd);
        // LoRA's layer 0: nothing below it trains (unless --trainable_params: the embedding, the
        // norms), so the gradient of its input is not needed: q, k and v skip their input products
        // (3 of the layer's 7), as autograd skips them
        float *dln = full || l > 0 || m->host.lora.saved ? a->dln : NULL;
        if (dln) memset(dln, 0, ND * sizeof(float));
        linear_backward(m, act.lora_h, ch, l, LORA_Q, dln, g.wq, a->dq, act.ln1, w.wq);
        carry_copy(dkc, a->kv, &cr, KV, -1);
        rope_backward(a->kv, m->rope_cos, m->rope_sin, &cc, NKV, hd);
        linear_backward(m, act.lora_h, ch, l, LORA_K, dln, g.wk, a->kv, act.ln1, w.wk);
        carry_copy(dvc, a->kv, &cr, KV, -1);
        linear_backward(m, act.lora_h, ch, l, LORA_V, dln, g.wv, a->kv, act.ln1, w.wv);
        if (dln) rmsnorm_backward(a->dresid, g.attn_norm, dln, act.x, w.attn_norm, act.rstd1, N, D);
        if (full) grads_done(m, fsdp_layer_unit(l));
        PROF_END(NULL);
    }
    float *dembed = full ? (frozen ? NULL : grad_at(m, 0, 0)) : saved_grad(m, 0);
    if (dembed) {
        PROF_BEGIN(NULL, "embedding backward", -1, ch->t0 / m->chunk_size, -1);
        chunk_tokens(a->tokens, tokens, ch);
        embedding_backward(dembed, a->dresid, a->tokens, N, D);
        if (full) grads_done(m, 0);
        PROF_END(NULL);
    }
}

// Final norm, output head and cross-entropy of one chunk; returns the summed loss
// over its targets != -100. The head runs on pieces of ceil(len / num_output_chunks)
// positions of one row at a time, so full-vocabulary logits exist only for a
// piece. With grad_scale != 0 each piece's d(grad_scale * loss)/d(logits) is
// formed in place while its logits are at hand, and a->dresid ends up holding
// d loss / d(final residual) for the chunk. logits_out (B, T, V), when given,
// receives the logits (for tests).
//
// Positions without a target (-100: the prompt and the padding of SFT data, often most
// of a batch) need neither logits nor their gradient, whose rows are zeros: each piece
// runs the head on its positions that have a target only, their rows of lnf moved to
// the piece's front (lnf is not read after the head), and their rows of dln moved back
// after. Each row's logits, loss and gradient are the ones computed in place (rows are
// independent); the head's own gradient (full fine-tuning) leaves out terms that were
// zeros, so it is the same bits too where a piece fits one block of k (GEMM_KC rows),
// and the same sum blocked differently where it does not.
static double chunk_head(Model *m, ChunkActs *s, const int *targets, const Chunk *ch, float grad_scale,
                         float *logits_out) {
    Config *c = &m->host.config;
    Activations *a = &m->a;
    int N = ch->B * ch->len, D = c->dim, V = c->vocab_size;
    int piece = (ch->len + m->num_output_chunks - 1) / m->num_output_chunks;
    const float *xL = LAYER(s->resid, c->n_layers, (size_t)N * D);
    int hu = fsdp_head_unit(&m->host.units), full = m->host.full_finetune && grad_scale != 0.0f;
    float *norm = final_norm(m), *head = head_weight(m);
    // tied embeddings: the head is the embedding, frozen with it (--freeze_layers); the final norm trains.
    // LoRA: their trained copies' (--trainable_params), if any
    int full_head = full && !(c->tied && m->host.frozen_units), lora = grad_scale != 0.0f && !full;
    float *dnorm = full ? grad_at(m, hu, 0) : lora ? saved_grad(m, 1 + 2 * c->n_layers) : NULL;
    float *dhead = full_head ? grad_at(m, c->tied ? 0 : hu, c->tied ? 0 : 1) : lora && c->tied ? saved_grad(m, 0) : NULL;
    rmsnorm_forward(a->lnf, a->rstdf, xL, norm, N, D, c->norm_eps);
    if (grad_scale != 0.0f) memset(a->dln, 0, (size_t)N * D * sizeof(float));
    int *kept = (int *)mallocCheck(2 * (size_t)piece * sizeof(int)), *kept_targets = kept + piece; // (piece)
    float *kept_weights = m->loss_weights ? (float *)mallocCheck((size_t)piece * sizeof(float)) : NULL;
    double *kept_losses = m->target_losses ? (double *)mallocCheck((size_t)piece * sizeof(double)) : NULL;
    int any = logits_out != NULL; // a target anywhere in the chunk: else the head is not even packed
    for (int b = 0; b < ch->B && !any; b++)
        for (int p = 0; p < ch->len && !any; p++) any = targets[(size_t)b * ch->T + ch->t0 + p] >= 0;
    // the head (V, D) packed as the B of logits = xf head^T, and of dxf = dlogits head; when the
    // head does not train (head_trains) it is packed once in a run, not twice a micro-batch
    float *head_fwd = a->head_packed, *head_bwd = head_fwd ? head_fwd + gemm_packed_b_floats(V, D) : NULL;
    if (head_fwd && any && !(a->head_packed_ok & 1)) gemm_pack_b(head_fwd, V, D, head, D, 1), a->head_packed_ok |= 1;
    if (head_bwd && any && grad_scale != 0.0f && !(a->head_packed_ok & 2))
        gemm_pack_b(head_bwd, D, V, head, D, 0), a->head_packed_ok |= 2;
    double loss = 0;
    for (int b = 0; b < ch->B && any; b++)
        for (int p0 = 0; p0 < ch->len; p0 += piece) {
            int n = ch->len - p0 < piece ? ch->len - p0 : piece, nk = 0;
            size_t row = (size_t)b * ch->len + p0, pos = (size_t)b * ch->T + ch->t0 + p0; // in the chunk, in the batch
            float *xf = a->lnf + row * D, *dxf = a->dln + row * D; // (n, D)
            for (int i = 0; i < n; i++) // all of them for logits_out
                if (logits_out || targets[pos + i] >= 0) kept[nk] = i, kept_targets[nk++] = targets[pos + i];
            if (nk == 0) continue;
            for (int j = 0; j < nk && kept_weights; j++) kept_weights[j] = m->loss_weights[pos + kept[j]];
            for (int j = 0; j < nk; j++) // kept[j] >= j: no row is overwritten before it moves
                if (kept[j] != j) memcpy(xf + (size_t)j * D, xf + (size_t)kept[j] * D, D * sizeof(float));
            float *lg = a->logits; // (nk, V)
            gemm(nk, V, D, 1.0f, xf, D, 0, head, D, 1, head_fwd, lg, V, 0); // matmul_forward's
            if (logits_out) memcpy(logits_out + pos * V, lg, (size_t)n * V * sizeof(float));
            loss += crossentropy_forward_backward(lg, kept_targets, kept_weights, kept_losses, nk, V, grad_scale);
            for (int j = 0; j < nk && kept_losses; j++) m->target_losses[pos + kept[j]] = kept_losses[j];
            if (grad_scale != 0.0f) { // matmul_backward's
                gemm(nk, D, V, 1.0f, lg, V, 0, head, D, 0, head_bwd, dxf, D, 1);
                if (dhead) gemm(V, D, nk, 1.0f, lg, V, 1, xf, D, 0, NULL, dhead, D, 1);
                for (int j = nk - 1; j >= 0; j--) // back to their rows, last first; the rows left are zeros
                    if (kept[j] != j) {
                        memcpy(dxf + (size_t)kept[j] * D, dxf + (size_t)j * D, D * sizeof(float));
                        memset(dxf + (size_t)j * D, 0, D * sizeof(float));
                    }
            }
        }
    free(kept); free(kept_weights); free(kept_losses);
    if (grad_scale != 0.0f) {
        memset(a->dresid, 0, (size_t)N * D * sizeof(float));
        rmsnorm_backward(a->dresid, dnorm, a->dln, xL, norm, a->rstdf, N, D);
    }
    if (full) grads_done(m, hu); // tied: the embedding's gradient stays open for the embedding's backward
    return loss;
}

// The summed cross-entropy of B rows of T tokens over targets != -100 (no
// gradients: evaluation, tests). logits_out as in chunk_head (not with context
// parallelism, whose ranks hold pieces of the rows: the sum is the group's).
static double model_forward(Model *m, const int *tokens, const int *targets, int B, int T, float *logits_out) {
    check_batch(m, tokens, B, T);
    if (head_trains(m)) m->a.head_packed_ok = 0; // the head may have trained since it was packed
    rows_begin(m, &tokens, &targets, B, T);
    if (context_comm(m) && logits_out) die("internal: model_forward's logits with context parallelism");
    double loss = 0;
    for (int j = 0; j < m->rows.n; j++) {
        Chunk ch = rows_chunk(&m->rows, j, 0);
        chunk_forward(m, &m->a.chunk[0], tokens, &ch);
        PROF_BEGIN(NULL, "head", -1, j, -1);
        loss += chunk_head(m, &m->a.chunk[0], targets, &ch, 0.0f, logits_out);
        PROF_END(NULL);
        if (j == rows_shared_last(&m->rows)) carry_share(m, 1);
    }
    if (context_comm(m)) fsdp_all_reduce(context_comm(m), &loss, 1, FSDP_F64); // (in rank order: every rank the same)
    rows_end(m);
    units_reshard(m);
    return loss;
}

// ----------------------------------------------------------------------------
// sampling (generate, in trainer.h): one sequence, with the KV carry as the cache

// Runs positions ch->t0 .. ch->t0 + ch->len - 1 of one sequence seq (B = 1)
// forward, adding their keys and values to the KV carry; returns the logits (V)
// of the last of them.
static float *model_next_logits(Model *m, const int *seq, const Chunk *ch) {
    Config *c = &m->host.config;
    Activations *a = &m->a;
    chunk_forward(m, &a->chunk[0], seq, ch);
    const float *x = LAYER(a->chunk[0].resid, c->n_layers, (size_t)ch->len * c->dim) + (size_t)(ch->len - 1) * c->dim;
    rmsnorm_forward(a->lnf, a->rstdf, x, final_norm(m), 1, c->dim, c->norm_eps);
    matmul_forward(a->logits, a->lnf, head_weight(m), 1, c->dim, c->vocab_size, 1.0f, 0);
    units_reshard(m);
    return a->logits;
}

// ----------------------------------------------------------------------------
// the machinery the model calls, from here to the optimizer; first a base linear layer
// and its adapter (lora.h)

// a base linear layer plus its LoRA adapter, if any: out (N, O) = inp (N, I) W^T + lora, N = B * len
// (IA3: the product with its input or output scaled); lora_h: the layer's LoRA A-projections (7, N, r)
static void linear_forward(Model *m, float *lora_h, const Chunk *ch, int layer, int t, float *out, const float *inp,
                           const float *w) {
    LoRA *l = &m->host.lora;
    int in[LORA_N_TARGETS], outd[LORA_N_TARGETS], N = ch->B * ch->len, adapted = m->host.use_lora && (l->targets & (1u << t));
    if (adapted && l->ia3) { ia3_forward(l, layer, t, out, inp, w, m->a.xdrop, N); return; }
    lora_shapes(&m->host.config, in, outd);
    matmul_forward(out, inp, w, N, in[t], outd[t], 1.0f, 0);
    if (!adapted) return;
    Chunk dc = dropout_chunk(&m->rows, ch, m->row0); // (where LoRA dropout draws its masks)
    float *h = lora_h + (size_t)t * N * l->r;
    if (l->use_dora) { // the norms depend on the weights alone: once per forward pass, at its first chunk
        float *norm = m->a.dora_norm + dora_norm_index(l, layer, t);  // (context parallel: its first group)
        if (ch->t0 < (context_comm(m) ? context_comm(m)->size * ch->len : 1)) dora_norm(l, layer, t, norm, w);
        dora_forward(l, layer, t, out, inp, w, h, m->a.xdrop, m->a.dora_pre, norm, &dc, m->dropout_key);
    } else lora_forward(l, layer, t, out, inp, h, m->a.xdrop, &dc, m->dropout_key);
}
// dinp (N, I) += dout W (+ LoRA); dW += dout^T inp when training the base weights
static void linear_backward(Model *m, const float *lora_h, const Chunk *ch, int layer, int t, float *dinp, float *dw,
                            const float *dout, const float *inp, const float *w) {
    LoRA *l = &m->host.lora;
    int in[LORA_N_TARGETS], outd[LORA_N_TARGETS], N = ch->B * ch->len, adapted = m->host.use_lora && (l->targets & (1u << t));
    if (adapted && l->ia3) { ia3_backward(l, layer, t, dinp, dout, inp, w, m->a.xdrop, m->a.dora_pre, N); return; }
    lora_shapes(&m->host.config, in, outd);
    matmul_backward(dinp, m->host.full_finetune ? dw : NULL, dout, inp, w, N, in[t], outd[t], 1.0f);
    if (!adapted) return;
    Chunk dc = dropout_chunk(&m->rows, ch, m->row0); // (where LoRA dropout draws its masks)
    const float *h = lora_h + (size_t)t * N * l->r;
    if (l->use_dora)
        dora_backward(l, layer, t, dinp, dout, inp, w, h, m->a.lora_dh, m->a.xdrop, m->a.dora_pre,
                      m->a.dora_norm + dora_norm_index(l, layer, t), &dc, m->dropout_key);
    else lora_backward(l, layer, t, dinp, dout, inp, h, m->a.lora_dh, m->a.xdrop, &dc, m->dropout_key);
}

// ----------------------------------------------------------------------------
// where the base weights are (docs/sharding.md): the whole model in host.params
// (one process, or a shard group of one: NO_SHARD), or sharded over the shard
// group, each unit gathered whole into a slot when the forward or backward
// needs it and resharded (the slot emptied) when the forward-backward ends

static int unit_slot(const Model *m, int u) { return m->n_unit_slots == 2 ? u != 0 : u; }

static LayerWeights layer_weights(float *const t[LAYER_TENSORS]) {
    LayerWeights w = {t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8]};
    return w;
}

// unit u's parameters, whole: gathered from the shards unless its slot holds them
// (collective). A packed unit's slot holds its bytes (QLoRA: a layer's run).
static float *unit_gather(Model *m, int u) {
    int s = unit_slot(m, u);
    const FsdpUnit *un = &m->host.units.units[u];
    if (m->slot_unit[s] != u) {
        PROF_BEGIN_UNIT(NULL, "gather", u, m->host.config.n_layers,
                        (long long)m->fsdp->shard.size * (un->packed ? un->packed_shard : un->shard * sizeof(float)));
        if (un->packed) fsdp_gather_packed(m->fsdp, un, m->host.quant_shards, (uint8_t *)m->slot[s]);
        else fsdp_gather(m->fsdp, un, m->host.shards, m->slot[s]);
        PROF_END(NULL);
        m->slot_unit[s] = u;
    }
    return m->slot[s];
}

static void units_reshard(Model *m) {
    for (int s = 0; s < m->n_unit_slots; s++) m->slot_unit[s] = -1;
}

// QLoRA: decoder layer unit u's parameters whole, its 4-bit weights dequantized
// (as bitsandbytes' dequantize_4bit) and its norms copied, from its run (whole, or
// gathered into its slot: collective) into the scratch before its products, unless
// the scratch holds them already (they are frozen; every rank asks in the same order)
static float *unit_dequant(Model *m, int u) {
    if (m->deq_unit != u) {
        const HostModel *h = &m->host;
        const FsdpUnit *un = &h->units.units[u];
        uint8_t *run = m->sharded ? (uint8_t *)unit_gather(m, u) : h->quant_bytes + (size_t)(u - 1) * h->run_bytes;
        for (int j = 0; j < un->n_tensors; j++) {
            float *dst = m->deq + un->tensors[j].offset;
            if (model_quantized(h, u, j)) {
                QuantTensor q = model_run_tensor(h, run, j);
                dequant_tensor(&q, dst, m->deq_absmax);
            } else memcpy(dst, run + h->run_offset[j], un->tensors[j].numel * sizeof(float));
        }
        m->deq_unit = u;
    }
    return m->deq;
}

// tensor j of unit u (fsdp_units_llama's order), where the forward reads it
static float *param_at(Model *m, int u, int j) {
    if (m->deq && m->host.units.units[u].packed) return unit_dequant(m, u) + m->host.units.units[u].tensors[j].offset;
    if (!m->sharded) return m->host.params + model_tensor_offset(&m->host.config, u, j);
    return unit_gather(m, u) + m->host.units.units[u].tensors[j].offset;
}
// the embedding (--trainable_params embed: LoRA's trained copy)
static float *embed_weight(Model *m) { return lora_embed_or(&m->host.lora, param_at(m, 0, 0)); }
// the output projection: lm_head, or with tied embeddings the embedding
static float *head_weight(Model *m) {
    return m->host.config.tied ? embed_weight(m) : param_at(m, fsdp_head_unit(&m->host.units), 1);
}
// the final norm (--trainable_params norm: LoRA's trained copy)
static float *final_norm(Model *m) {
    return lora_norm_or(&m->host.lora, m->host.config.n_layers, 0, param_at(m, fsdp_head_unit(&m->host.units), 0));
}
// the head changes between steps: it is packed again each micro-batch
static int head_trains(const Model *m) {
    return m->host.full_finetune || (m->host.config.tied && (m->host.lora.saved & LORA_SAVE_EMBED));
}
static LayerWeights layer_params(Model *m, int l) {
    float *t[LAYER_TENSORS];
    for (int j = 0; j < LAYER_TENSORS; j++) t[j] = param_at(m, fsdp_layer_unit(l), j);
    LayerWeights w = layer_weights(t);
    w.attn_norm = lora_norm_or(&m->host.lora, l, 0, w.attn_norm);
    w.mlp_norm = lora_norm_or(&m->host.lora, l, 1, w.mlp_norm);
    return w;
}

// Full fine-tuning's gradients, of the trainable units only (u >= host.frozen_units).
// Whole: added straight into m->grads (model_tensor_offset_from's layout) over the
// step's chunks and micro-batches. Sharded: a unit's backward adds into the
// unit's gradient, whole, zeroed when it opens; grads_done then reduce-scatters
// it over the shard group and adds this rank's shard into m->grads. (Tied
// embeddings: the embedding's stays open from the head to the embedding's backward.)
static float *grad_at(Model *m, int u, int j) {
    if (!m->sharded) return m->grads + model_tensor_offset_from(&m->host.config, m->host.frozen_units, u, j);
    const FsdpUnit *un = &m->host.units.units[u];
    int b = u != 0;
    if (m->grad_open[b] != u) {
        memset(m->unit_grad[b], 0, (size_t)m->fsdp->shard.size * un->shard * sizeof(float)); // the padding too
        m->grad_open[b] = u;
    }
    return m->unit_grad[b] + un->tensors[j].offset;
}
static void grads_done(Model *m, int u) {
    if (!m->sharded) return;
    const FsdpUnit *un = &m->host.units.units[u];
    if (m->pure_bf16) round_bf16(m->unit_grad[u != 0], (size_t)m->fsdp->shard.size * un->shard); // each rank's part bf16
    PROF_BEGIN_UNIT(NULL, "reduce-scatter", u, m->host.config.n_layers, (long long)m->fsdp->shard.size * un->shard * sizeof(float));
    fsdp_reduce_scatter(&m->fsdp->shard, m->grad_part, m->unit_grad[u != 0], un->shard); // collective
    PROF_END(NULL);
    float *mine = m->grads + (un->shard_offset - m->host.units.units[m->host.frozen_units].shard_offset);
    for (size_t i = 0; i < un->shard; i++) mine[i] += m->grad_part[i];
    m->grad_open[u != 0] = -1;
}
static LayerWeights layer_grads(Model *m, int l) {
    float *t[LAYER_TENSORS];
    for (int j = 0; j < LAYER_TENSORS; j++) t[j] = grad_at(m, fsdp_layer_unit(l), j);
    return layer_weights(t);
}
// LoRA's gradient of saved tensor k (lora_saved's numbering), NULL when it does not train
static float *saved_grad(Model *m, int k) { return lora_saved(&m->host.lora, m->host.lora.grads, k, NULL); }

// --pure_bf16: the step's gradients are bf16, as a bf16 model's .grad in torch. A micro-batch's
// are summed in fp32 over its chunks (and, sharded, over the ranks' bf16 parts: grads_done),
// rounded to bf16 once, then added to the step's so far in fp32 and rounded again:
// g = bf16(g + bf16(micro-batch's)), torch's .grad += in bf16. grads_bf16_begin moves the
// step's so far aside and zeroes the gradients; grads_bf16_end adds them back.
static void grads_bf16_begin(Model *m) {
    if (!m->pure_bf16) return;
    size_t n = model_trainable_numel(&m->host);
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) m->grad_acc[i] = bf16_from_f32(m->grads[i]); // (exact: bf16 values)
    memset(m->grads, 0, n * sizeof(float));
}
static void grads_bf16_end(Model *m) {
    if (!m->pure_bf16) return;
    size_t n = model_trainable_numel(&m->host);
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) m->grads[i] = bf16_grad_add(st_bf16_to_f32(m->grad_acc[i]), m->grads[i]);
}

// ----------------------------------------------------------------------------
// a layer's activations within its chunk's, the chunk's tokens, the KV carry

static LayerActs layer_acts(const Model *m, ChunkActs *s, const Chunk *ch, int l) {
    const Config *c = &m->host.config;
    size_t N = (size_t)ch->B * ch->len, ND = N * c->dim, NQ = N * c->n_heads * c->head_dim, NH = N * c->hidden_dim;
    size_t r = m->host.use_lora ? m->host.lora.r : 0;
    int k = m->activation_checkpointing ? 0 : l;
    LayerActs act = {LAYER(s->resid, l, ND), LAYER(s->resid, l + 1, ND), LAYER(s->ln1, k, ND),
                     LAYER(s->resid_mid, k, ND), LAYER(s->ln2, k, ND), LAYER(s->rstd1, k, N), LAYER(s->rstd2, k, N),
                     LAYER(s->q, k, NQ), LAYER(s->atty, k, NQ), LAYER(s->lse, k, N * c->n_heads),
                     LAYER(s->gate, k, NH), LAYER(s->up, k, NH), LAYER(s->hmlp, k, NH),
                     LAYER(s->lora_h, k, LORA_N_TARGETS * N * r)};
    return act;
}

// the chunk's tokens (B, len) out of the batch's (B, T)
static void chunk_tokens(int *dst, const int *tokens, const Chunk *ch) {
    for (int b = 0; b < ch->B; b++)
        memcpy(dst + (size_t)b * ch->len, tokens + (size_t)b * ch->T + ch->t0, ch->len * sizeof(int));
}
// rows [t0, t0 + n) of each of B rows: dst (B, dT, w) from dt0 on = src (B, sT, w) from st0 on
static void rows_copy(float *dst, int dT, int dt0, const float *src, int sT, int st0, int B, int n, size_t w) {
    for (int b = 0; b < B; b++)
        memcpy(dst + ((size_t)b * dT + dt0) * w, src + ((size_t)b * sT + st0) * w, (size_t)n * w * sizeof(float));
}
// a chunk's rows x (B, len, w) into the carry (B, T, w), or back out (dir = -1)
static void carry_copy(float *carry, float *x, const Chunk *ch, size_t w, int dir) {
    if (dir > 0) rows_copy(carry, ch->T, ch->t0, x, ch->len, 0, ch->B, ch->len, w);
    else rows_copy(x, ch->len, 0, carry, ch->T, ch->t0, ch->B, ch->len, w);
}

// ----------------------------------------------------------------------------
// context parallelism (docs/long_context.md; the layout: chunk.h's context_layout and
// context_piece): the ranks run their pieces group by group, in step. A rank's KV and dKV
// carries hold its own positions only (chunk.h's carry_rows). At each layer the keys and values of the
// group's and the earlier groups' positions are all-gathered from the ranks' carries to their
// absolute positions (context_gather), so every query attends to every earlier position with
// the attention of a chunk against a carry; in the backward their dK, dV, every rank's share,
// are reduce-scattered into their owners' dKV carries (context_reduce).

// Between every rank's compact rows [0, (j + 1) len) (its pieces of groups 0 .. j, ch being this
// rank's piece of group j), one block (B, (j + 1) len, w) a rank in blocks (P, ...), and x (B, T, w),
// where those pieces sit at their absolute positions: dir > 0 into x, < 0 out of it.
static void context_place(const Model *m, float *x, float *blocks, const Chunk *ch, size_t w, int dir) {
    int P = context_comm(m)->size, j = context_group(&m->rows, ch), rows = (j + 1) * ch->len;
    size_t n = (size_t)ch->B * rows * w;
    for (int r = 0; r < P; r++)
        for (int i = 0; i <= j; i++) {
            Chunk o = context_piece(P, ch->B, ch->T, ch->len, i, r, m->host.config.sliding_window);
            if (dir > 0) rows_copy(x, ch->T, o.t0, blocks + r * n, rows, i * ch->len, ch->B, ch->len, w);
            else rows_copy(blocks + r * n, rows, i * ch->len, x, ch->T, o.t0, ch->B, ch->len, w);
        }
}

// x (B, T, w) = a layer's keys or values at every position of groups 0 .. j of ch's rows (ch:
// this rank's piece of group j), all-gathered from the ranks' compact carries (B, T / P, w), this
// rank's carry among them; through stage (P, B, (j + 1) len, w). Collective over the context group.
static void context_gather(Model *m, float *x, const float *carry, float *stage, const Chunk *ch, size_t w) {
    FsdpComm *g = context_comm(m);
    int rows = (context_group(&m->rows, ch) + 1) * ch->len;
    size_t n = (size_t)ch->B * rows * w;
    PROF_BEGIN(NULL, "context all-gather", -1, -1, (long long)(g->size * n * sizeof(float)));
    rows_copy(stage + g->rank * n, rows, 0, carry, ch->T / g->size, 0, ch->B, rows, w); // (in place: this rank's block)
    fsdp_all_gather(g, stage, stage + g->rank * n, n);
    context_place(m, x, stage, ch, w, 1);
    PROF_END(NULL);
}

// dx (B, T, w) holds this rank's share of dK or dV at every position of groups 0 .. j (ch: this
// rank's piece of group j; each rank's queries add theirs): summed over the group's ranks, each
// owner's positions are added into its compact dKV carry (B, T / P, w). Its piece of group j is
// complete then (later groups added theirs before). Through stage (P, B, (j + 1) len, w); dx is
// spent (it receives the sum). Collective over the context group.
static void context_reduce(Model *m, float *dcarry, float *dx, float *stage, const Chunk *ch, size_t w) {
    FsdpComm *g = context_comm(m);
    int rows = (context_group(&m->rows, ch) + 1) * ch->len, own_T = ch->T / g->size;
    size_t per_row = (size_t)rows * w, n = ch->B * per_row;
    PROF_BEGIN(NULL, "context reduce-scatter", -1, -1, (long long)(g->size * n * sizeof(float)));
    context_place(m, dx, stage, ch, w, -1);
    fsdp_reduce_scatter(g, dx, stage, n); // (B, (j + 1) len, w)
    for (int b = 0; b < ch->B; b++) {
        float *d = dcarry + (size_t)b * own_T * w, *s = dx + b * per_row;
        #pragma omp parallel for
        for (size_t i = 0; i < per_row; i++) d[i] += s[i];
    }
    PROF_END(NULL);
}

// What layer l's attention for ch reads, its keys and values, and where it adds dK, dV: the
// carries (k, v, dk, dv: the layer's); with context parallelism the gathered ones, every rank's
// pieces of ch's group and the groups before at their absolute positions. Those are gathered
// now (collective), but in a backward with activation checkpointing, whose layer_forward has just
// gathered them; a backward zeroes dK, dV for the positions of ch's group and the groups before.
static AttentionKV attention_kv(Model *m, float *k, float *v, float *dk, float *dv, const Chunk *ch, int backward) {
    Activations *a = &m->a;
    if (!context_comm(m)) return (AttentionKV){k, v, dk, dv};
    size_t KV = (size_t)m->host.config.n_kv_heads * m->host.config.head_dim;
    if (!backward || !m->activation_checkpointing) { // (both through dK's buffer, which a backward zeroes after)
        context_gather(m, a->context_k, k, a->context_dk, ch, KV);
        context_gather(m, a->context_v, v, a->context_dk, ch, KV);
    }
    size_t end = (size_t)(context_group(&m->rows, ch) + 1) * ch->len * context_comm(m)->size;
    for (int b = 0; backward && b < ch->B; b++) {
        memset(a->context_dk + (size_t)b * ch->T * KV, 0, end * KV * sizeof(float));
        memset(a->context_dv + (size_t)b * ch->T * KV, 0, end * KV * sizeof(float));
    }
    return (AttentionKV){a->context_k, a->context_v, a->context_dk, a->context_dv};
}

// ----------------------------------------------------------------------------
// the rows and chunks of a micro-batch

static void check_batch(const Model *m, const int *tokens, int B, int T) {
    if (B > m->B || T > m->T) die("internal: batch (%d, %d) exceeds the allocated (%d, %d)", B, T, m->B, m->T);
    for (int i = 0; i < B * T; i++)
        if (tokens[i] < 0 || tokens[i] >= m->host.config.vocab_size)
            die("token id %d at position %d is outside the vocabulary (%d)", tokens[i], i, m->host.config.vocab_size);
}

// The rows a forward (and backward) runs, in m->rows (chunk.h's rows_layout): B rows of tokens,
// targets (B, T). With context parallelism, the rows padded to the group's layout in
// context_tokens and context_targets (rows_pad): this rank runs its pieces, in step with its
// group (context_comm), until rows_end.
static void rows_begin(Model *m, const int **tokens, const int **targets, int B, int T) {
    Activations *a = &m->a;
    int P = fsdp_context_size(m->fsdp);
    m->rows = rows_layout(B, T, m->chunk_size, m->context_len, P, P > 1 ? m->fsdp->context.rank : 0,
                          m->host.config.sliding_window, m->s2_attn);
    rows_share(&m->rows, m->shared_prompt);
    if (P == 1) return;
    rows_pad(&m->rows, a->context_tokens, a->context_targets, *tokens, *targets);
    *tokens = a->context_tokens, *targets = a->context_targets;
    // preference tuning's weights and cross-entropies per target: in the padded layout too
    // (small beside the activations: B T floats and doubles, for the micro-batch)
    rows_scores_pad(&m->rows, &m->loss_weights, &m->target_losses, &m->rows_scores);
}
// the micro-batch's end: no rows, no context group (sampling runs its own chunks of whole rows).
// Context parallel: each target's cross-entropy summed over the group (rows_scores_unpad) back
// into the caller's layout. Collective over the context group.
static void rows_end(Model *m) {
    const Rows *r = &m->rows;
    if (r->P > 1 && m->rows_scores.losses) fsdp_all_reduce(context_comm(m), m->target_losses, (size_t)r->B * r->T, FSDP_F64);
    if (r->P > 1) rows_scores_unpad(r, &m->loss_weights, &m->target_losses, &m->rows_scores, m->a.context_targets);
    memset(&m->rows, 0, sizeof m->rows);
}

// A shared prompt's keys and values (chunk.h's rows_share): after its last chunk's forward (dir >
// 0) copied in every layer from rows 0 .. B/2 - 1 of the KV carry into rows B/2 .. B - 1, which
// attend to them as their own; before that chunk's backward (dir < 0) the dK, dV those rows added
// at its positions summed into rows 0 .. B/2 - 1, whose chunks' backward takes them on
static void carry_share(Model *m, int dir) {
    const Rows *r = &m->rows;
    size_t KV = (size_t)m->host.config.n_kv_heads * m->host.config.head_dim, n = (size_t)r->share * KV;
    for (int l = 0; l < m->host.config.n_layers; l++)
        for (int b = 0; b < r->B / 2; b++) {
            size_t own = ((size_t)l * r->B + b) * r->T * KV, twin = own + (size_t)r->B / 2 * r->T * KV;
            if (dir > 0) {
                memcpy(m->a.k + twin, m->a.k + own, n * sizeof(float));
                memcpy(m->a.v + twin, m->a.v + own, n * sizeof(float));
                continue;
            }
            float *dk = m->a.dk + own, *dv = m->a.dv + own;
            #pragma omp parallel for
            for (size_t i = 0; i < n; i++) dk[i] += dk[twin - own + i], dv[i] += dv[twin - own + i];
        }
}

// ----------------------------------------------------------------------------
// building the model's buffers

// p = n elements of the layout l (support/utils.h), left as it is while l only counts
#define place(l, p, n) do { void *at_ = layout_take((l), (size_t)(n) * sizeof *(p)); if (at_) (p) = at_; } while (0)
// Host layouts pack their pieces (align: a float), so the plan's bytes are the floats' own.
static Layout host_layout(void *base) { return (Layout){(char *)base, 0, sizeof(float)}; }

// lays out one chunk's activations but its residuals, for Lk layers
static void chunk_acts_layout(const Config *c, int B, int C, int r, int Lk, ChunkActs *s, Layout *a) {
    size_t L = Lk, N = (size_t)B * C, D = c->dim, H = c->hidden_dim, Q = (size_t)c->n_heads * c->head_dim;
    place(a, s->ln1, L * N * D); place(a, s->rstd1, L * N);
    place(a, s->q, L * N * Q); place(a, s->lse, L * N * c->n_heads); place(a, s->atty, L * N * Q);
    place(a, s->resid_mid, L * N * D); place(a, s->ln2, L * N * D); place(a, s->rstd2, L * N);
    place(a, s->gate, L * N * H); place(a, s->up, L * N * H); place(a, s->hmlp, L * N * H);
    place(a, s->lora_h, L * LORA_N_TARGETS * N * r);
}

// The chunks' slots (keep mode: one a chunk; recompute: one). Every slot keeps its chunk's
// residuals. The rest is each slot's own, for every layer; or with activation checkpointing one
// layer's worth, for the largest chunk, that all slots share: only the layer running (forward, or
// recomputed for its backward) uses it. For chunks of the capacity's (B, C) (r NULL), or in keep
// mode for the chunks of rows r, one slot each: a shared prompt's micro-batch (chunk.h's rows_share)
// runs chunks of B/2 rows, then of B, maybe one more chunk than the capacity's but no more
// positions, B T at most, so they fit the same room (model_forward_backward lays them out there).
static void slots_layout(Model *m, Layout *a, const Rows *r) {
    const Config *c = &m->host.config;
    Activations *ac = &m->a;
    size_t L = c->n_layers, lora_r = m->host.use_lora ? m->host.lora.r : 0;
    int ckpt = m->activation_checkpointing, n = r ? r->n : ac->n_slots;
    for (int i = 0; i < n; i++) {
        Chunk ch = r ? chunk_at(r, i) : (Chunk){m->B, m->T, 0, m->chunk_size, 0, 0};
        if (ckpt && i) ac->chunk[i] = ac->chunk[0];
        else if (ckpt) chunk_acts_layout(c, m->B, m->chunk_size, (int)lora_r, 1, &ac->chunk[i], a);
        else chunk_acts_layout(c, ch.B, ch.len, (int)lora_r, (int)L, &ac->chunk[i], a);
        place(a, ac->chunk[i].resid, (L + 1) * ch.B * ch.len * c->dim);
    }
}

// keep mode's slots laid out again where they are, for the chunks of rows r, or (NULL) the capacity's
static void slots_place(Model *m, const Rows *r) {
    Layout a = host_layout((char *)m->alloc[2] + m->a.slots_at);
    slots_layout(m, &a, r);
    if (a.bytes > m->a.slots_bytes) die("internal: the chunks' slots need %zu bytes of %zu", a.bytes, m->a.slots_bytes);
}

// The sharded model's buffers: the slots that hold gathered units (a slot as big as the
// biggest unit it holds, padding included), and for full fine-tuning a unit's gradient
// whole (the embedding's, the others') and its reduced shard. Returns the bytes of
// fsdp.h's reduce-scatter receive buffer, which the shard communicator allocates at
// its first use: room for every rank's block of the biggest unit.
static size_t sharded_layout(Model *m, Layout *w, Layout *p) {
    const FsdpUnits *u = &m->host.units;
    size_t G = (size_t)m->fsdp->shard.size, widest = 0, grad[2] = {0, 0};
    for (int s = 0; s < m->n_unit_slots; s++) {
        size_t need = 0;
        for (int i = 0; i < u->n_units; i++) { // (a packed unit's bytes in floats)
            const FsdpUnit *un = &u->units[i];
            size_t whole = un->packed ? (G * un->packed_shard + sizeof(float) - 1) / sizeof(float) : G * un->shard;
            if (unit_slot(m, i) == s && whole > need) need = whole;
        }
        place(w, m->slot[s], need);
    }
    if (!m->host.full_finetune) return 0;
    for (int i = m->host.frozen_units; i < u->n_units; i++) { // frozen units: no gradient
        grad[i != 0] = G * u->units[i].shard > grad[i != 0] ? G * u->units[i].shard : grad[i != 0];
        widest = u->units[i].shard > widest ? u->units[i].shard : widest;
    }
    place(p, m->unit_grad[0], grad[0]);
    place(p, m->unit_grad[1], grad[1]);
    place(p, m->grad_part, widest);
    return (grad[0] > grad[1] ? grad[0] : grad[1]) * sizeof(float);
}

// Lays out the model's buffers in four allocations, as train_llama2.cu's model_layout
// does: w the slots that hold gathered units, p full fine-tuning's gradients, a the
// activations and scratch, k the KV and dKV carries. Called once to count, once to
// place. (The base weights, LoRA's parameters and the optimizer's state are allocated
// where they are loaded or made.)
static size_t model_layout(Model *m, Layout *w, Layout *p, Layout *a, Layout *k) {
    const HostModel *h = &m->host;
    const Config *c = &h->config;
    Activations *ac = &m->a;
    size_t L = c->n_layers, C = m->chunk_size, N = (size_t)m->B * C, D = c->dim, H = c->hidden_dim, V = c->vocab_size;
    size_t Q = (size_t)c->n_heads * c->head_dim, KV = (size_t)c->n_kv_heads * c->head_dim;
    size_t r = h->use_lora ? h->lora.r : 0, widest = config_widest(c);
    size_t piece = (C + m->num_output_chunks - 1) / m->num_output_chunks; // the head's positions at a time
    // full fine-tuning's gradients: the trainable weights' (param_layout's order), or when
    // sharded this rank's shard of them
    if (h->full_finetune) place(p, m->grads, model_trainable_numel(h));
    if (m->pure_bf16) place(p, m->grad_acc, model_trainable_numel(h));
    size_t comm = m->sharded ? sharded_layout(m, w, p) : 0;
    // The head runs on B x ceil(C / piece) pieces of a chunk; with more than one, its weight
    // is packed once for all of them, not again for each, and kept while the head does not
    // change (chunk_head). One piece a chunk (B = 1, chunked to save memory) packs it in
    // gemm's scratch instead: the copy would cost 2 V D floats (1 GiB at Llama-2-7B's shape)
    // for a small share of the time. First in the allocation: its vector loads are aligned.
    if (m->B * ((C + piece - 1) / piece) > 1) place(a, ac->head_packed, gemm_packed_b_floats(V, D) + gemm_packed_b_floats(D, V));
    ac->slots_at = a->bytes;
    slots_layout(m, a, NULL);
    ac->slots_bytes = a->bytes - ac->slots_at;
    // one chunk's scratch
    place(a, ac->tokens, N); place(a, ac->lnf, N * D); place(a, ac->rstdf, N); place(a, ac->logits, piece * V);
    place(a, ac->kv, N * KV); place(a, ac->dresid, N * D); place(a, ac->dln, N * D);
    place(a, ac->dq, N * Q); place(a, ac->datty, N * Q);
    place(a, ac->dgate, N * H); place(a, ac->dup, N * H); place(a, ac->dhmlp, N * H);
    place(a, ac->lora_dh, N * r); place(a, ac->xdrop, N * widest);
    int dora = h->use_lora && h->lora.use_dora, ia3 = h->use_lora && h->lora.ia3;
    place(a, ac->dora_pre, dora || ia3 ? N * widest : 0); place(a, ac->dora_norm, dora ? dora_norm_index(&h->lora, (int)L, 0) : 0);
    size_t A = h->use_lora ? h->lora.adapter_len : 0;
    place(a, ac->adapter_y, A ? N * Q : 0); place(a, ac->adapter_kv, 2 * A * KV); place(a, ac->adapter_dkv, 2 * A * KV);
    place(a, ac->adapter_coef, 2 * N * c->n_heads * A); place(a, ac->adapter_gz, A ? N * c->n_heads : 0);
    // Context parallelism's padded rows. The carries hold the whole sequence, after a prefix's virtual
    // positions; with context parallelism this rank's positions (T / P of the padded rows), and one
    // layer's K, V, dK, dV at every position.
    size_t P = fsdp_context_size(m->fsdp), rows = P > 1 ? (size_t)m->B * m->T : 0;
    place(a, ac->context_tokens, rows); place(a, ac->context_targets, rows);
    size_t carry = L * m->B * (size_t)(host_prefix(&m->host) + m->T / P) * KV;
    place(k, ac->k, carry); place(k, ac->v, carry); place(k, ac->dk, carry); place(k, ac->dv, carry);
    place(k, ac->context_k, rows * KV); place(k, ac->context_v, rows * KV);
    place(k, ac->context_dk, rows * KV); place(k, ac->context_dv, rows * KV);
    return comm;
}

// gemm's packing scratch, as big as the biggest product of a step needs: a layer's (rows x
// widest x widest; widest x widest x rows: the weight gradients) or the head's (a piece of
// a row: forward piece x V x D, backward piece x D x V; V x D x piece for its weight gradient)
static size_t model_gemm_scratch(const Model *m) {
    const Config *c = &m->host.config;
    size_t N = (size_t)m->B * m->chunk_size, D = c->dim, V = c->vocab_size, widest = config_widest(c);
    size_t piece = (m->chunk_size + m->num_output_chunks - 1) / m->num_output_chunks;
    size_t sizes[5] = {gemm_scratch_floats(N, widest, widest), gemm_scratch_floats(widest, widest, N),
                       gemm_scratch_floats(piece, V, D), gemm_scratch_floats(piece, D, V), gemm_scratch_floats(V, D, piece)};
    size_t pack = 0;
    for (int i = 0; i < 5; i++) pack = sizes[i] > pack ? sizes[i] : pack;
    return pack;
}

// Preference tuning's reference (m->reference): a copy of the trainable weights as training
// starts. Where they are (LoRA's parameters, the model's, or this rank's shards of it) and how many
static float **model_reference_place(Model *m) {
    HostModel *h = &m->host;
    return h->use_lora ? &h->lora.params : m->sharded ? &h->shards : &h->params;
}
static size_t model_reference_numel(const Model *m) {
    const HostModel *h = &m->host;
    if (!m->reference) return 0;
    return h->use_lora ? h->lora.num_params : m->sharded ? h->units.shard_numel : h->num_params;
}
// the reference taken (once): the trainable weights as they are now, into ref_params
static void reference_take(Model *m) {
    if (!m->ref_taken) memcpy(m->ref_params, *model_reference_place(m), model_reference_numel(m) * sizeof(float)), m->ref_taken = 1;
}
// trades the reference's weights with the trained ones where the forward reads them: called
// before the reference's forward and again after it; the gathered units and the packed head
// then hold neither. The first call takes the copy: it comes before the first optimizer step,
// after the policy's first forward (which sets a fresh DoRA adapter's magnitudes, as peft sets
// them when it adds the adapter)
static void model_reference_swap(Model *m) {
    reference_take(m);
    float **at = model_reference_place(m), *t = *at;
    *at = m->ref_params, m->ref_params = t;
    if (m->slot_unit) units_reshard(m);
    m->a.head_packed_ok = 0;
}
// elements [first, first + count) of the reference, out and in (trainer.h's contract: a
// checkpoint's reference.safetensors); set before the first swap, which then keeps them
static int model_reference_get(Model *m, size_t first, size_t count, float *dst) {
    reference_take(m);
    memcpy(dst, m->ref_params + first, count * sizeof(float));
    return 0;
}
static void model_reference_set(Model *m, size_t first, size_t count, const float *src) {
    memcpy(m->ref_params + first, src, count * sizeof(float));
    m->ref_taken = 1;
}

// Buffers for micro-batches of up to B rows of T tokens, run in chunks of C positions
// (C = 0: T); recompute selects the memory mode. Counts their bytes (the memory plan),
// and with alloc allocates them.
static void model_buffers(Model *m, int B, int T, int C, int recompute, int num_output_chunks, int alloc) {
    HostModel *h = &m->host;
    Activations *a = &m->a;
    int P = fsdp_context_size(m->fsdp);
    Rows longest = rows_capacity(B, T, C, P, &m->context_len);
    int pieces = longest.n;
    T = longest.T, C = longest.len;
    m->B = B; m->T = T; m->chunk_size = C; m->recompute = recompute; m->num_output_chunks = num_output_chunks;
    a->n_slots = recompute ? 1 : pieces;
    m->sharded = host_sharded(h);
    if (m->sharded) m->n_unit_slots = m->fsdp->info->reshard_after_forward ? 2 : h->units.n_units;
    free(a->chunk); // a plan before (--batch_size auto tries several)
    free(m->slot);
    a->chunk = (ChunkActs *)callocCheck(a->n_slots + 1, sizeof(ChunkActs)); // (+ 1: slots_layout's shared prompt)
    m->slot = (float **)callocCheck(m->n_unit_slots + 1, sizeof(float *)); // + 1: not empty when whole
    Layout lay[4] = {host_layout(NULL), host_layout(NULL), host_layout(NULL), host_layout(NULL)}; // slots, gradients, activations, carries
    size_t comm = model_layout(m, &lay[0], &lay[1], &lay[2], &lay[3]), pack = model_gemm_scratch(m);
    // the base weights (model_weight_bytes: as loaded, and QLoRA's dequantization scratch);
    // the trainable parameters' gradients, the optimizer's state (optimizer_init) and the
    // buffer a checkpoint moves it through, and LoRA's own parameters beside the base weights
    size_t n = h->use_lora ? h->lora.num_params : model_trainable_numel(h);
    model_optim_tensors(h, &m->optimizer, m->sharded ? m->fsdp->shard.rank : -1, &m->opt_tensors);
    m->weight_bytes = lay[0].bytes + model_weight_bytes(h);
    m->param_bytes = lay[1].bytes + comm + n * sizeof(float) * (h->use_lora ? 2 : 0) + optimizer_state_bytes(&m->optimizer, &m->opt_tensors, n) +
                     optimizer_staging_bytes(&m->optimizer, &m->opt_tensors, n); // (a checkpoint's, support/optimizer.h)
    size_t ref = model_reference_numel(m); // (preference tuning's reference)
    m->param_bytes += ref * sizeof(float);
    // (and the context group's reduce-scatter receive buffer, fsdp.h's, allocated at its first use: room
    // for every rank's block, a layer's dK or dV for every position of the longest row)
    size_t context_recv = P > 1 ? (size_t)B * T * h->config.n_kv_heads * h->config.head_dim * sizeof(float) : 0;
    m->act_bytes = lay[2].bytes + pack * sizeof(float) + context_recv;
    m->carry_bytes = lay[3].bytes;
    if (!alloc) return;
    // the activations from a cache line on (the packed head's vector loads); the gradients zeroed
    m->alloc[0] = mallocCheck(lay[0].bytes);
    m->alloc[1] = callocCheck(lay[1].bytes, 1);
    m->alloc[2] = aligned_alloc(64, (lay[2].bytes + 63) / 64 * 64);
    if (!m->alloc[2]) die("out of memory for the activations (%zu bytes)", lay[2].bytes);
    m->alloc[3] = mallocCheck(lay[3].bytes);
    if (ref) m->ref_params = (float *)mallocCheck(ref * sizeof(float));
    for (int i = 0; i < 4; i++) lay[i] = host_layout(m->alloc[i]);
    model_layout(m, &lay[0], &lay[1], &lay[2], &lay[3]);
    a->head_packed_ok = 0;
    gemm_reserve(pack);
    const Config *c = &h->config;
    int positions = host_prefix(&m->host) + T;
    m->rope_cos = (float *)mallocCheck((size_t)positions * c->head_dim / 2 * sizeof(float));
    m->rope_sin = (float *)mallocCheck((size_t)positions * c->head_dim / 2 * sizeof(float));
    float *inv_freq = (float *)mallocCheck(c->head_dim / 2 * sizeof(float));
    rope_inv_freq(c, inv_freq);
    rope_tables(m->rope_cos, m->rope_sin, positions, c->head_dim, inv_freq);
    free(inv_freq);
    if (m->sharded) {
        m->slot_unit = (int *)mallocCheck(m->n_unit_slots * sizeof(int));
        units_reshard(m);
        m->grad_open[0] = m->grad_open[1] = -1;
    } else if (h->full_finetune && !h->frozen_units) param_layout(c, &m->g, m->grads);
    if (h->quant_type != QUANT_NONE) { // (model_weight_bytes counted them)
        m->deq = (float *)mallocCheck(h->units.units[fsdp_layer_unit(0)].numel * sizeof(float));
        m->deq_absmax = (float *)mallocCheck((model_layer_widest(h) + QUANT_BLOCK - 1) / QUANT_BLOCK * sizeof(float));
        m->deq_unit = -1;
    }
}

// the memory plan's bytes for this capacity (weight_bytes .. carry_bytes), allocating nothing
static void model_plan(Model *m, int B, int T, int C, int recompute, int num_output_chunks) {
    model_buffers(m, B, T, C, recompute, num_output_chunks, 0);
}
static void model_alloc(Model *m, int B, int T, int C, int recompute, int num_output_chunks) {
    model_buffers(m, B, T, C, recompute, num_output_chunks, !m->dry_run);
}

// frees what model_alloc made and the host model; safe on a zeroed Model and
// on one whose model_alloc never ran (a failed load)
static void model_free(Model *m) {
    void *bufs[] = {m->alloc[0], m->alloc[1], m->alloc[2], m->alloc[3], m->a.chunk, m->slot, m->slot_unit,
                    m->rope_cos, m->rope_sin, m->deq, m->deq_absmax, m->ref_params};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    optim_tensors_free(&m->opt_tensors);
    host_model_free(&m->host);
    memset(m, 0, sizeof *m);
}

// ----------------------------------------------------------------------------
// optimizer: AdamW as torch.optim.AdamW, SGD as torch.optim.SGD, AdamW8bit as torchao's,
// AnyPrecisionAdamW as llama-recipes', clipping as torch.nn.utils.clip_grad_norm_

typedef struct {
    float *run[NUM_PARAM_TENSORS]; // the trainable parameters: runs of memory, n_runs of them, run_n[k]
    size_t run_n[NUM_PARAM_TENSORS]; // long: LoRA's, or full fine-tuning's (model_trainable_runs)
    int n_runs;
    float *grads;           // (n) their gradients, the runs one after another
    size_t n;
    OptimizerSettings s;
    void *state[OPTIMIZER_MAX_STATES]; // AdamW's moments m, v (n each); SGD's momentum buffer (with momentum); AdamW8bit's
                            // codes, absmax and fp32 moments of m, then v (optimizer_state_count); AnyPrecision's
                            // bf16 m, v and compensation
    const OptimTensors *tensors; // AdamW8bit: the trainable tensors (the Model's)
    int t;                  // optimizer steps taken
    FsdpComm *grad_sum;     // the ranks whose gradients of these parameters are summed before the step
    FsdpComm *norm_sum;     // the ranks whose squared norms make up the global norm (NULL: this rank's is)
} Optimizer;

// sum of g[i]^2 in double, the same at any thread count (it decides gradient clipping): in
// a fixed number of blocks, each summed in order by one thread, then the blocks in order
#define SUMSQ_BLOCKS 256
static double grad_sumsq(const float *g, size_t n) {
    double part[SUMSQ_BLOCKS], s = 0;
    #pragma omp parallel for
    for (int b = 0; b < SUMSQ_BLOCKS; b++) {
        double p = 0;
        for (size_t i = n * b / SUMSQ_BLOCKS; i < n * (b + 1) / SUMSQ_BLOCKS; i++) p += (double)g[i] * g[i];
        part[b] = p;
    }
    for (int b = 0; b < SUMSQ_BLOCKS; b++) s += part[b];
    return s;
}
static double grad_norm(const float *g, size_t n) { return sqrt(grad_sumsq(g, n)); }

// The trainable parameters: LoRA's (every rank holds them whole), or every base
// weight of the units that train, whole or this rank's shard, with the optimizer's state
// for them (so a shard's state is the shard's only). Replicated parameters sum their
// gradients over every rank; shards over the ranks that hold the same shard (the replica
// group), and their norm over the shard group.
static void optimizer_init(Optimizer *o, Model *m) {
    memset(o, 0, sizeof *o);
    HostModel *h = &m->host;
    int shard = m->sharded && !h->use_lora;
    size_t first[NUM_PARAM_TENSORS];
    o->n_runs = 1;
    if (h->use_lora) o->run[0] = h->lora.params, o->run_n[0] = h->lora.num_params;
    else {
        o->n_runs = model_trainable_runs(h, first, o->run_n);
        for (int r = 0; r < o->n_runs && !m->dry_run; r++) o->run[r] = (shard ? h->shards : h->params) + first[r];
    }
    o->grads = h->use_lora ? h->lora.grads : m->grads;
    for (int r = 0; r < o->n_runs; r++) o->n += o->run_n[r];
    o->s = m->optimizer;
    if (m->dry_run) return; // the plan needs n alone
    o->tensors = &m->opt_tensors;
    for (int i = 0; i < optimizer_n_states(&o->s); i++) {
        size_t count, es = optimizer_state_elem(&o->s, o->tensors, o->n, i, &count);
        o->state[i] = callocCheck(count + 1, es); // (+ 1: not NULL when empty)
    }
    if (m->fsdp) {
        o->grad_sum = shard ? &m->fsdp->replica : &m->fsdp->world;
        o->norm_sum = shard ? &m->fsdp->shard : NULL;
    }
}

static void optimizer_free(Optimizer *o) {
    for (int i = 0; i < OPTIMIZER_MAX_STATES; i++) free(o->state[i]);
    memset(o, 0, sizeof *o);
}

static void optimizer_zero_grad(Optimizer *o) { memset(o->grads, 0, o->n * sizeof(float)); }

// AdamW8bit's step (the t-th) over the trainable tensors (or this rank's pieces of them),
// each on its own as torchao steps it: 8-bit or fp32 state. The hyperparameters as the
// numbers typed (float_decimal: torchao rounds 1 - beta in double). A tensor lies inside one
// run of the parameters.
static void adamw8bit_step(Optimizer *o, float lr) {
    const OptimizerSettings *s = &o->s;
    const OptimTensors *ts = o->tensors;
    double b1 = float_decimal(s->beta1), b2 = float_decimal(s->beta2), eps = float_decimal(s->eps), wd = float_decimal(s->weight_decay);
    Adamw8bitState a = adamw8bit_state(o->state);
    size_t run_at = 0; // run r's first element in the flat gradients
    for (int k = 0, r = 0; k < ts->n; k++) {
        while (ts->first[k] >= run_at + o->run_n[r]) run_at += o->run_n[r++];
        float *p = o->run[r] + (ts->first[k] - run_at), *g = o->grads + ts->first[k];
        size_t n = ts->numel[k], at = ts->at[k];
        if (ts->quant[k])
            adamw8bit_update(p, g, a.codes[0] + at, a.absmax[0] + at / ADAMW8BIT_BLOCK, a.codes[1] + at,
                             a.absmax[1] + at / ADAMW8BIT_BLOCK, n, o->t, lr, b1, b2, eps, wd);
        else adamw_torchao_update(p, g, a.fp32[0] + at, a.fp32[1] + at, n, o->t, lr, b1, b2, eps, wd);
    }
}

// the gradients hold 1 / inv_scale times the true ones (a loss scale): the global norm of the
// true gradients (returned, before clipping); if update and the norm is finite, unscaling and
// clipping, then the step
static double optimizer_step(Optimizer *o, float lr, float inv_scale, int update) {
    const OptimizerSettings *s = &o->s;
    int bf16 = s->kind == OPTIMIZER_ANYPRECISION; // --pure_bf16's gradients
    if (o->grad_sum) { // (--pure_bf16: the ranks' bf16 gradients summed in fp32, the sum rounded once)
        PROF_BEGIN(NULL, "all-reduce gradients", -1, -1, (long long)(o->n * sizeof(float)));
        fsdp_all_reduce(o->grad_sum, o->grads, o->n, FSDP_F32);
        PROF_END(NULL);
        if (bf16) round_bf16(o->grads, o->n);
    }
    double sumsq = grad_sumsq(o->grads, o->n);
    if (o->norm_sum) fsdp_all_reduce(o->norm_sum, &sumsq, 1, FSDP_F64);
    double norm = sqrt(sumsq) * inv_scale; // the same on every rank; unscaled (exact: a power of two)
    if (!update || !isfinite(norm)) return norm; // a skipped step: nothing changes
    clip_grads(o->grads, o->n, norm, s->grad_clip, inv_scale);
    if (bf16) round_bf16(o->grads, o->n); // (clipped or unscaled: as torch's g.mul_ on bf16 gradients)
    o->t++;
    if (s->kind == OPTIMIZER_ADAMW8BIT) { adamw8bit_step(o, lr); return norm; }
    size_t off = 0; // the run's first element in grads and the state
    for (int r = 0; r < o->n_runs; off += o->run_n[r++]) {
        float *p = o->run[r], *g = o->grads + off, *s0 = o->state[0] && !bf16 ? (float *)o->state[0] + off : NULL;
        if (s->kind == OPTIMIZER_SGD) sgd_update(p, g, s0, o->run_n[r], o->t == 1, lr, s->momentum, s->nesterov, s->weight_decay);
        else if (bf16) // (the hyperparameters as the numbers typed, as llama-recipes passes Python floats)
            anyprecision_update(p, g, (uint16_t *)o->state[0] + off, (uint16_t *)o->state[1] + off,
                                s->kahan ? (uint16_t *)o->state[2] + off : NULL, o->run_n[r], o->t, lr, float_decimal(s->beta1),
                                float_decimal(s->beta2), float_decimal(s->eps), float_decimal(s->weight_decay));
        else adamw_update(p, g, s0, (float *)o->state[1] + off, o->run_n[r], o->t, lr, s->beta1, s->beta2, s->eps, s->weight_decay);
    }
    return norm;
}

// the weights and the optimizer state live in host memory already
static int optimizer_state_get(Optimizer *o, int i, size_t first, size_t count, void *dst) {
    size_t n, es = optimizer_state_elem(&o->s, o->tensors, o->n, i, &n);
    memcpy(dst, (char *)o->state[i] + first * es, count * es);
    return 0;
}
static void optimizer_state_set(Optimizer *o, int i, size_t first, size_t count, const void *src) {
    size_t n, es = optimizer_state_elem(&o->s, o->tensors, o->n, i, &n);
    memcpy((char *)o->state[i] + first * es, src, count * es);
}
static int optimizer_state_finite(Optimizer *o) {
    for (int i = 0; i < optimizer_n_states(&o->s); i++) {
        size_t n, es = optimizer_state_elem(&o->s, o->tensors, o->n, i, &n);
        for (size_t j = 0; es > 1 && j < n; j++) // (codes are bytes: nothing to check)
            if (!isfinite(es == 2 ? st_bf16_to_f32(((uint16_t *)o->state[i])[j]) : ((float *)o->state[i])[j])) return 0;
    }
    return 1;
}

// ----------------------------------------------------------------------------
// the rest of trainer.h's contract: no copies to sync (one memory), the memory plan's
// measures, the backend's constants

static void model_sync_host(Model *m) { (void)m; }
static void optimizer_sync_device(Optimizer *o) { (void)o; }

// the most resident memory this process has had, in MiB (Linux reports KiB)
static double model_peak_mb(Model *m) {
    (void)m;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss / 1024.0;
}
// --batch_size auto: what the memory plan may take. The CPU cannot tell what is free, so
// --memory_limit is required (backend_measures_free_memory 0); the plan must then fit in
// it less the resident memory outside the plan now (the program, its libraries and MPI:
// all but the base weights, which are loaded and which the plan counts already), less the
// program's whole code once more (the training loop's pages are not resident yet), and
// less a reserve for library code paged in later: it comes in the kernel's fault-around
// windows, which the randomized layout moves every run (dev/bench_cpu.md has the peaks).
static const int backend_measures_free_memory = 0;
static const int backend_streams_base = 0; // (it computes from m->host's weights)
static double model_memory_budget(Model *m, double limit) {
    long pages = 0, resident = 0, shared = 0, text = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f && fscanf(f, "%ld %ld %ld %ld", &pages, &resident, &shared, &text) != 4) resident = text = 0;
    if (f) fclose(f);
    double weights = (host_sharded(&m->host) ? m->host.units.shard_numel : m->host.num_params) * sizeof(float);
    double outside = (resident + text) * (double)sysconf(_SC_PAGESIZE) - weights, code_reserve = 1048576.0;
    return limit - (outside > 0 ? outside : 0) - code_reserve;
}
// QLoRA: a layer unit in fp32 and the absmax values of its biggest weight (deq, deq_absmax)
static size_t model_dequant_scratch_bytes(const Model *m) { return model_quant_scratch_bytes(&m->host); }
static const char *const backend_dequant_scratch = "one layer";
static const char *const backend_memory = "resident memory"; // (the host's: the plan is its host plan)
static const char *const model_host_advice = ", --activation_checkpointing, --chunk_size with --chunk_memory recompute";
static const char *const backend_precisions[] = {"fp32"}; // the CPU twin computes in fp32 only
static const char *const backend_collectives[] = {"host"}; // its buffers are host memory: MPI or TCP
static const int backend_sharding = 1; // any number of ranks, every strategy (the Model's fsdp)
static const int backend_activation_offloading = 0; // --activation_offloading changes nothing: the activations are host memory
static const int backend_context_parallel = 1; // --context_parallel with every option it runs (model_forward_backward, model_forward)
#define BACKEND_PREFERENCE // --objective dpo and orpo (trainer/preference.h): loss_weights, target_losses, model_reference_swap
#define BACKEND_SHARED_PROMPT // --shared_prompt: shared_prompt (chunk.h's rows_share)

// ----------------------------------------------------------------------------
// the host side: options, loading, the training loop, checkpoints, main

#include "trainer.h"

#ifndef TESTING
int main(int argc, char **argv) { return train_main(argc, argv); }
#endif
