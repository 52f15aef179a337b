/*
CPU reference trainer for Llama-2-family models: LoRA (default) or full
fine-tuning of a Hugging Face checkpoint, in fp32 with OpenMP.

It is the judge of everything else in this repository: the CUDA trainer is
compared with it, and it is compared with Hugging Face transformers + peft
(test/test_llama2.c, fixtures from dev/reference/). So it favours plain loops
that read like the math; the one place that is tuned is matmul, which every
linear layer uses for its forward and both backward products.

Shapes: B rows of T tokens, D = hidden_size, H = intermediate_size,
NH / NKV = attention / key-value heads, hd = head_dim, V = vocab_size.
*/
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <float.h>
#include <time.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <signal.h>
#include <limits.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "utils.h"
#include "json.h"
#include "safetensors.h"
#include "tokenizer.h"
#include "checkpoint.h"
#include "default_model.h"

// ----------------------------------------------------------------------------
// matmul: one packed, register-tiled GEMM behind every linear layer.
// C (M, N) = [C +] alpha * op(A) (M, K) @ op(B) (K, N)
// Blocks of A and B are packed into contiguous strips (MR rows of A, NR columns
// of B) so the inner kernel streams through memory and keeps an MR x NR tile of
// C in registers. Each element of C is summed by one thread in a fixed order,
// so results do not depend on the number of threads.

// The kernel is written with GCC/Clang vector extensions: an MR x NR tile is MR
// rows of two vectors, 12 accumulators that fit the 16 vector registers of AVX2
// (or 32 of AVX-512, which doubles the vector width).
#if defined(__AVX512F__)
#define GEMM_VLEN 16
#else
#define GEMM_VLEN 8
#endif
typedef float vfloat __attribute__((vector_size(GEMM_VLEN * sizeof(float))));
#define GEMM_MR 6
#define GEMM_NR (2 * GEMM_VLEN)
#define GEMM_KC 256
#define GEMM_MC 96
#define GEMM_NC 256

static float *gemm_scratch = NULL;
static size_t gemm_scratch_size = 0;

// C (mr, nr) += a (kc, MR strip) @ b (kc, NR strip), both packed
static inline void gemm_kernel(int kc, const float *a, const float *b, float *C, int ldc, int mr, int nr) {
    vfloat c[GEMM_MR][2];
    memset(c, 0, sizeof c);
    for (int k = 0; k < kc; k++) {
        vfloat b0 = *(const vfloat *)(b + k * GEMM_NR), b1 = *(const vfloat *)(b + k * GEMM_NR + GEMM_VLEN);
        for (int i = 0; i < GEMM_MR; i++) {
            float av = a[k * GEMM_MR + i];
            c[i][0] += av * b0;
            c[i][1] += av * b1;
        }
    }
    float tile[GEMM_MR][GEMM_NR];
    memcpy(tile, c, sizeof tile);
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) C[(size_t)i * ldc + j] += tile[i][j];
}

// dst[k][i] = scale * X(i0 + i, k0 + k) for a strip of w rows (i) of a matrix X (n, K) that is
// stored row-major (X[i * ld + k]) when rowmajor, else transposed (X[k * ld + i])
static void gemm_pack(float *dst, const float *X, int ld, int rowmajor, size_t i0, size_t n, int k0, int kc, int w,
                      float scale) {
    for (int i = 0; i < w; i++) {
        if (i0 + i >= n) { for (int k = 0; k < kc; k++) dst[k * w + i] = 0.0f; continue; }
        if (rowmajor) {
            const float *row = X + (i0 + i) * ld + k0;
            for (int k = 0; k < kc; k++) dst[k * w + i] = scale * row[k];
        } else {
            for (int k = 0; k < kc; k++) dst[k * w + i] = scale * X[(size_t)(k0 + k) * ld + i0 + i];
        }
    }
}

static void gemm(int M, int N, int K, float alpha, const float *A, int lda, int transA,
                 const float *B, int ldb, int transB, float *C, int ldc, int accumulate) {
    if (!accumulate)
        for (int i = 0; i < M; i++) memset(C + (size_t)i * ldc, 0, (size_t)N * sizeof(float));
    if (M == 0 || N == 0 || K == 0) return;
    size_t Mp = (size_t)(M + GEMM_MR - 1) / GEMM_MR * GEMM_MR;
    size_t Np = (size_t)(N + GEMM_NR - 1) / GEMM_NR * GEMM_NR;
    size_t need = (Mp + Np) * GEMM_KC;
    if (need > gemm_scratch_size) {
        free(gemm_scratch);
        gemm_scratch = (float *)aligned_alloc(64, need * sizeof(float)); // vector loads of packed B
        if (!gemm_scratch) die("out of memory for matmul scratch (%zu floats)", need);
        gemm_scratch_size = need;
    }
    float *ap = gemm_scratch, *bp = gemm_scratch + Mp * GEMM_KC;
    for (int k0 = 0; k0 < K; k0 += GEMM_KC) {
        int kc = K - k0 < GEMM_KC ? K - k0 : GEMM_KC;
        // pack alpha * A into strips of MR rows, ap[strip][k][i], and B into strips of
        // NR columns, bp[strip][k][j]; padding is zero. Reads run along memory.
        #pragma omp parallel for
        for (size_t s = 0; s < Mp / GEMM_MR; s++)
            gemm_pack(ap + s * GEMM_MR * kc, A, lda, !transA, s * GEMM_MR, (size_t)M, k0, kc, GEMM_MR, alpha);
        #pragma omp parallel for
        for (size_t s = 0; s < Np / GEMM_NR; s++)
            gemm_pack(bp + s * GEMM_NR * kc, B, ldb, transB, s * GEMM_NR, (size_t)N, k0, kc, GEMM_NR, 1.0f);
        int nbm = (int)((Mp + GEMM_MC - 1) / GEMM_MC), nbn = (int)((Np + GEMM_NC - 1) / GEMM_NC);
        #pragma omp parallel for collapse(2) schedule(dynamic)
        for (int bn = 0; bn < nbn; bn++)
            for (int bm = 0; bm < nbm; bm++) {
                size_t j1 = (size_t)(bn + 1) * GEMM_NC < Np ? (size_t)(bn + 1) * GEMM_NC : Np;
                size_t i1 = (size_t)(bm + 1) * GEMM_MC < Mp ? (size_t)(bm + 1) * GEMM_MC : Mp;
                for (size_t j = (size_t)bn * GEMM_NC; j < j1; j += GEMM_NR)
                    for (size_t i = (size_t)bm * GEMM_MC; i < i1; i += GEMM_MR) {
                        int mr = M - (int)i < GEMM_MR ? M - (int)i : GEMM_MR;
                        int nr = N - (int)j < GEMM_NR ? N - (int)j : GEMM_NR;
                        gemm_kernel(kc, ap + i * kc, bp + j * kc, C + i * ldc + j, ldc, mr, nr);
                    }
            }
    }
}

// out (N, O) = [out +] alpha * inp (N, I) @ weight (O, I)^T      (torch Linear layout)
static void matmul_forward(float *out, const float *inp, const float *weight, int N, int I, int O,
                           float alpha, int accumulate) {
    gemm(N, O, I, alpha, inp, I, 0, weight, I, 1, out, O, accumulate);
}

// dinp (N, I) += alpha * dout (N, O) @ weight (O, I);  dweight (O, I) += alpha * dout^T @ inp
// (either output may be NULL: frozen weights need no dweight)
static void matmul_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                            const float *weight, int N, int I, int O, float alpha) {
    if (dinp) gemm(N, I, O, alpha, dout, O, 0, weight, I, 0, dinp, I, 1);
    if (dweight) gemm(O, I, N, alpha, dout, O, 1, inp, I, 0, dweight, I, 1);
}

#include "lora.h"
#include "dataloader.h"

// ----------------------------------------------------------------------------
// model configuration, read from the checkpoint's config.json

typedef struct {
    int dim;          // hidden_size D
    int hidden_dim;   // intermediate_size H
    int n_layers;     // num_hidden_layers L
    int n_heads;      // num_attention_heads NH
    int n_kv_heads;   // num_key_value_heads NKV (GQA), defaults to NH
    int head_dim;     // hd, defaults to D / NH
    int vocab_size;   // V
    int max_pos;      // max_position_embeddings
    float norm_eps;   // rms_norm_eps
    float rope_theta;
    int tied;         // tie_word_embeddings
} Config;

static int config_int(const JsonValue *cfg, const char *path, const char *key, int *out, int required, int lo, int hi) {
    long long v;
    int rc = json_get_int(cfg, key, &v);
    if (rc == -1 && !required) return 0;
    if (rc != 0 || v < lo || v > hi) {
        fprintf(stderr, "error: %s: '%s' must be an integer in [%d, %d]%s\n", path, key, lo, hi, rc == -1 ? " (missing)" : "");
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int config_load(Config *c, const char *model_dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", model_dir);
    JsonValue j;
    if (json_load_file(path, &j) != 0) return -1;
    int rc = -1;
    const char *s;
    double d;
    int b;
    const JsonValue *v, *rope = NULL;
    if (j.type != JSON_OBJECT) { fprintf(stderr, "error: %s: not a JSON object\n", path); goto done; }
    if (json_get_string(&j, "model_type", &s, NULL) == 0 && strcmp(s, "llama") != 0)
        fprintf(stderr, "warning: %s: model_type is \"%s\", reading it as a Llama model\n", path, s);
    if (config_int(&j, path, "hidden_size", &c->dim, 1, 1, 1 << 16) ||
        config_int(&j, path, "intermediate_size", &c->hidden_dim, 1, 1, 1 << 18) ||
        config_int(&j, path, "num_hidden_layers", &c->n_layers, 1, 1, 1024) ||
        config_int(&j, path, "num_attention_heads", &c->n_heads, 1, 1, 1024) ||
        config_int(&j, path, "vocab_size", &c->vocab_size, 1, 1, 1 << 24)) goto done;
    c->n_kv_heads = c->n_heads;
    c->head_dim = c->dim / c->n_heads;
    c->max_pos = 4096;
    if (config_int(&j, path, "num_key_value_heads", &c->n_kv_heads, 0, 1, c->n_heads) ||
        config_int(&j, path, "head_dim", &c->head_dim, 0, 2, 1 << 12) ||
        config_int(&j, path, "max_position_embeddings", &c->max_pos, 0, 1, 1 << 24)) goto done;
    if (c->n_heads % c->n_kv_heads != 0) {
        fprintf(stderr, "error: %s: num_attention_heads (%d) is not a multiple of num_key_value_heads (%d)\n",
                path, c->n_heads, c->n_kv_heads);
        goto done;
    }
    if (c->head_dim % 2 != 0 || (json_get(&j, "head_dim") == NULL && c->dim % c->n_heads != 0)) {
        fprintf(stderr, "error: %s: head dimension must be even and hidden_size divisible by num_attention_heads\n", path);
        goto done;
    }
    c->norm_eps = 1e-6f;
    // out-of-range doubles become -1 (refused below): converting them to float is undefined
    if (json_get_number(&j, "rms_norm_eps", &d) == 0) c->norm_eps = d > 0 && d <= FLT_MAX ? (float)d : -1.0f;
    // transformers < 5 writes rope_theta at the top; transformers 5 inside rope_parameters
    c->rope_theta = 10000.0f;
    if ((v = json_get(&j, "rope_parameters")) && v->type == JSON_OBJECT) rope = v;
    if ((v = json_get(&j, "rope_scaling")) && v->type != JSON_NULL) rope = v;
    if (json_get_number(&j, "rope_theta", &d) == 0) c->rope_theta = d > 0 && d <= FLT_MAX ? (float)d : -1.0f;
    if (rope) {
        if (json_get_number(rope, "rope_theta", &d) == 0) c->rope_theta = d > 0 && d <= FLT_MAX ? (float)d : -1.0f;
        if ((json_get_string(rope, "rope_type", &s, NULL) == 0 || json_get_string(rope, "type", &s, NULL) == 0) &&
            strcmp(s, "default") != 0) {
            fprintf(stderr, "error: %s: rope scaling type \"%s\" is not supported yet (only plain RoPE)\n", path, s);
            goto done;
        }
    }
    if (!(c->rope_theta > 0) || !(c->norm_eps > 0)) { fprintf(stderr, "error: %s: rope_theta and rms_norm_eps must be positive finite numbers\n", path); goto done; }
    if (json_get_string(&j, "hidden_act", &s, NULL) == 0 && strcmp(s, "silu") != 0) {
        fprintf(stderr, "error: %s: hidden_act \"%s\" is not supported (Llama uses silu)\n", path, s); goto done;
    }
    if ((json_get_bool(&j, "attention_bias", &b) == 0 && b) || (json_get_bool(&j, "mlp_bias", &b) == 0 && b)) {
        fprintf(stderr, "error: %s: attention_bias / mlp_bias are not supported (Llama has no biases)\n", path); goto done;
    }
    c->tied = 0;
    if (json_get_bool(&j, "tie_word_embeddings", &b) == 0) c->tied = b;
    rc = 0;
done:
    json_free(&j);
    return rc;
}

// ----------------------------------------------------------------------------
// parameters: every base weight in one flat buffer, in Hugging Face order

enum { P_EMBED, P_ATTN_NORM, P_WQ, P_WK, P_WV, P_WO, P_MLP_NORM, P_WGATE, P_WUP, P_WDOWN, P_NORM, P_HEAD, NUM_PARAM_TENSORS };

typedef struct {
    float *embed;      // (V, D)
    float *attn_norm;  // (L, D)
    float *wq;         // (L, NH*hd, D)
    float *wk;         // (L, NKV*hd, D)
    float *wv;         // (L, NKV*hd, D)
    float *wo;         // (L, D, NH*hd)
    float *mlp_norm;   // (L, D)
    float *wgate;      // (L, H, D)
    float *wup;        // (L, H, D)
    float *wdown;      // (L, D, H)
    float *norm;       // (D)
    float *head;       // (V, D); points at embed when tied
} ParameterTensors;

// per-layer shape (rows, cols) of each tensor; rows = 1 for vectors
static void param_shape(const Config *c, int p, int64_t *rows, int64_t *cols) {
    int64_t D = c->dim, H = c->hidden_dim, Q = (int64_t)c->n_heads * c->head_dim, KV = (int64_t)c->n_kv_heads * c->head_dim;
    int64_t shapes[NUM_PARAM_TENSORS][2] = {
        {c->vocab_size, D}, {1, D}, {Q, D}, {KV, D}, {KV, D}, {D, Q}, {1, D}, {H, D}, {H, D}, {D, H}, {1, D}, {c->vocab_size, D}};
    *rows = shapes[p][0];
    *cols = shapes[p][1];
}
static int param_per_layer(int p) { return p != P_EMBED && p != P_NORM && p != P_HEAD; }
static size_t param_numel(const Config *c, int p) {
    int64_t r, k;
    param_shape(c, p, &r, &k);
    return (size_t)(r * k) * (param_per_layer(p) ? (size_t)c->n_layers : 1);
}

static void param_name(int p, int layer, char *buf, size_t n) {
    static const char *fmt[NUM_PARAM_TENSORS] = {
        "model.embed_tokens.weight", "model.layers.%d.input_layernorm.weight",
        "model.layers.%d.self_attn.q_proj.weight", "model.layers.%d.self_attn.k_proj.weight",
        "model.layers.%d.self_attn.v_proj.weight", "model.layers.%d.self_attn.o_proj.weight",
        "model.layers.%d.post_attention_layernorm.weight", "model.layers.%d.mlp.gate_proj.weight",
        "model.layers.%d.mlp.up_proj.weight", "model.layers.%d.mlp.down_proj.weight", "model.norm.weight",
        "lm_head.weight"};
    snprintf(buf, n, fmt[p], layer);
}

// the tensors' pointers in enum order, for loops over all of them
static void param_tensors(const ParameterTensors *t, float *out[NUM_PARAM_TENSORS]) {
    float *p[NUM_PARAM_TENSORS] = {t->embed, t->attn_norm, t->wq, t->wk, t->wv, t->wo,
                                   t->mlp_norm, t->wgate, t->wup, t->wdown, t->norm, t->head};
    memcpy(out, p, sizeof p);
}

// points the tensors into a flat buffer laid out in enum order; returns its size
static size_t param_layout(const Config *c, ParameterTensors *t, float *base) {
    float **ptrs[NUM_PARAM_TENSORS] = {&t->embed, &t->attn_norm, &t->wq, &t->wk, &t->wv, &t->wo,
                                       &t->mlp_norm, &t->wgate, &t->wup, &t->wdown, &t->norm, &t->head};
    size_t off = 0;
    for (int p = 0; p < NUM_PARAM_TENSORS; p++) {
        if (p == P_HEAD && c->tied) { t->head = t->embed; continue; }
        if (base) *ptrs[p] = base + off;
        off += param_numel(c, p);
    }
    return off;
}

// ----------------------------------------------------------------------------
// activations, run chunk by chunk (DESIGN section 4)
//
// A batch of B sequences of T tokens runs in chunks of C positions (C = T: the
// whole sequence). Attention needs the keys and values of every earlier position,
// so those live for the whole sequence in the KV carry; everything else a chunk's
// backward needs is kept per chunk: for every chunk until its backward ("keep"),
// or for one chunk at a time, re-running its forward just before its backward
// ("recompute"), so activation memory grows with C, not with T.

typedef struct {
    float *resid;      // (L+1, B, C, D) input of each layer, and the final residual
    float *ln1;        // (L, B, C, D)
    float *rstd1;      // (L, B, C)
    float *q;          // (L, B, C, NH*hd) after RoPE
    float *lse;        // (L, B, NH, C) log-sum-exp of each query's attention scores
    float *atty;       // (L, B, C, NH*hd) attention output
    float *resid_mid;  // (L, B, C, D) after the attention block
    float *ln2;        // (L, B, C, D)
    float *rstd2;      // (L, B, C)
    float *gate;       // (L, B, C, H) pre-activation
    float *up;         // (L, B, C, H)
    float *hmlp;       // (L, B, C, H) silu(gate) * up
    float *lora_h;     // (L, 7, B, C, r) LoRA A-projections
} ChunkActs;

typedef struct {
    ChunkActs *chunk;  // (n_slots) one per chunk in keep mode, one in all in recompute mode
    int n_slots;
    float *k, *v;      // (L, B, T, NKV*hd) the KV carry (keys after RoPE)
    float *dk, *dv;    // (L, B, T, NKV*hd) the dKV carry: gradients for earlier positions
    // scratch for one chunk
    int *tokens;       // (B, C)
    float *lnf;        // (B, C, D)
    float *rstdf;      // (B, C)
    float *logits;     // (ceil(C / num_output_chunks), V) one piece of one row at a time
    float *kv;         // (B, C, NKV*hd) a chunk's keys or values before they enter the carry
    float *dresid;     // (B, C, D)
    float *dln;        // (B, C, D)
    float *dq, *datty; // (B, C, NH*hd)
    float *dgate, *dup, *dhmlp;  // (B, C, H)
    float *lora_dh;    // (B, C, r)
    float *xdrop;      // (B, C, max(D, H, NH*hd)) LoRA dropout scratch
    size_t act_bytes, carry_bytes; // what the activations and the two carries hold
} Activations;

typedef struct {
    Config config;
    ParameterTensors w;       // base weights
    float *params;
    size_t num_params;
    int full_finetune;        // train every weight (else LoRA on frozen weights)
    ParameterTensors g;       // gradients of the base weights (full fine-tuning only)
    float *grads;
    LoRA lora;
    int use_lora;
    Activations a;
    int B, T;                 // activation capacity
    int chunk_size;           // C (== T: whole sequence)
    int recompute;            // chunk memory mode: 1 recompute, 0 keep
    int num_output_chunks;    // the output head runs in this many pieces of a chunk
    float *rope_cos, *rope_sin; // (T, hd/2)
    uint64_t dropout_key;     // set per micro-batch by the training loop
    int pad_id;               // the token padding rows (the tokenizer's EOS)
} Model;

// ----------------------------------------------------------------------------
// loading a Hugging Face checkpoint

static int model_load(Model *m, const char *dir) {
    if (config_load(&m->config, dir) != 0) return -1;
    Config *c = &m->config;
    StModel sm;
    if (st_model_open(&sm, dir) != 0) return -1;
    // pass 0 checks every tensor's presence, shape and dtype; only then pass 1
    // allocates and reads, so a config.json claiming terabytes allocates nothing
    m->num_params = param_layout(c, &m->w, NULL);
    float *ptrs[NUM_PARAM_TENSORS];
    char name[256];
    int rc = 0;
    for (int pass = 0; pass < 2 && rc == 0; pass++) {
        if (pass == 1) {
            m->params = (float *)mallocCheck(m->num_params * sizeof(float));
            param_layout(c, &m->w, m->params);
            param_tensors(&m->w, ptrs);
        }
        for (int p = 0; p < NUM_PARAM_TENSORS && rc == 0; p++) {
            if (p == P_HEAD && c->tied) continue;
            int64_t rows, cols;
            param_shape(c, p, &rows, &cols);
            int nl = param_per_layer(p) ? c->n_layers : 1;
            for (int l = 0; l < nl && rc == 0; l++) {
                param_name(p, l, name, sizeof name);
                StFile *f;
                const StTensor *t = st_model_find(&sm, name, &f);
                int vec = rows == 1;
                if (!t) {
                    fprintf(stderr, "error: %s: tensor '%s' is missing from the checkpoint%s\n", dir, name,
                            p == P_HEAD ? " (config.json says tie_word_embeddings is false)" : "");
                    rc = -1;
                } else if (t->ndim != (vec ? 1 : 2) || t->shape[0] != (vec ? cols : rows) || (!vec && t->shape[1] != cols)) {
                    char got[128], want[64];
                    st_format_shape(t->shape, t->ndim, got, sizeof got);
                    if (vec) snprintf(want, sizeof want, "[%lld]", (long long)cols);
                    else snprintf(want, sizeof want, "[%lld, %lld]", (long long)rows, (long long)cols);
                    fprintf(stderr, "error: %s: tensor '%s' has shape %s but config.json implies %s\n", f->path, name, got, want);
                    rc = -1;
                } else if (t->dtype != ST_F32 && t->dtype != ST_BF16 && t->dtype != ST_F16) {
                    fprintf(stderr, "error: %s: tensor '%s' has dtype %s; only F32, BF16 and F16 weights are supported\n",
                            f->path, name, st_dtype_name(t->dtype));
                    rc = -1;
                } else if (pass == 1) {
                    rc = st_read_f32(f, t, 0, t->numel, ptrs[p] + (size_t)l * rows * cols);
                }
            }
        }
    }
    // a tied config with a stored head that is not the embedding would silently train another model
    StFile *hf;
    const StTensor *ht = c->tied ? st_model_find(&sm, "lm_head.weight", &hf) : NULL;
    if (ht && rc == 0) {
        size_t n = (size_t)c->vocab_size * c->dim;
        float *head = (float *)mallocCheck(n * sizeof(float));
        if (ht->numel != n || st_read_f32(hf, ht, 0, n, head) != 0 || memcmp(head, m->w.embed, n * sizeof(float)) != 0) {
            fprintf(stderr, "error: %s: tensor 'lm_head.weight' differs from model.embed_tokens.weight but config.json "
                    "says tie_word_embeddings is true\n", hf->path);
            rc = -1;
        }
        free(head);
    }
    // a checkpoint with more layers than the config does not match it
    for (int i = 0; i < sm.n_entries && rc == 0; i++) {
        const char *n = sm.entries[i].name;
        int layer;
        if (sscanf(n, "model.layers.%d.", &layer) == 1 && (layer < 0 || layer >= c->n_layers)) {
            fprintf(stderr, "error: %s: checkpoint has tensor '%s' but config.json says num_hidden_layers = %d\n", dir, n, c->n_layers);
            rc = -1;
        }
    }
    st_model_close(&sm);
    return rc;
}

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

// Hugging Face's rotate_half layout: pairs are (i, i + hd/2). The angles are
// computed in float32 as transformers does, so long positions round the same way.
static void rope_tables(float *cosb, float *sinb, int T, int hd, float theta) {
    int half = hd / 2;
    for (int i = 0; i < half; i++) {
        float inv_freq = 1.0f / powf(theta, (float)(2 * i) / (float)hd);
        for (int t = 0; t < T; t++) {
            float angle = (float)t * inv_freq;
            cosb[t * half + i] = cosf(angle);
            sinb[t * half + i] = sinf(angle);
        }
    }
}
// rotates x (B, len, nh, hd) of chunk ch in place, row n at position t0 + n % len;
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

// Attention of a chunk of queries against the KV carry, causal with the mask
// aligned bottom-right: query i of the chunk sits at position t0 + i and sees
// keys 0 .. t0 + i. GQA: query head h reads key/value head h / (NH / NKV).
// Like flash attention it keeps only each row's log-sum-exp, not the (C, T)
// probabilities, and the backward recomputes them (attention.cuh mirrors this).
//   q (B, len, NH, hd); k, v (B, T, NKV, hd) with rows < t0 + len filled
//   -> out (B, len, NH, hd), lse (B, NH, len)
static float attention_dot(const float *a, const float *b, int hd) {
    float dot = 0;
    #pragma omp simd reduction(+ : dot) // a fixed vector order: deterministic
    for (int d = 0; d < hd; d++) dot += a[d] * b[d];
    return dot;
}
// y += a x; restrict tells the compiler the rows do not overlap, so it vectorizes
static void attention_axpy(float *restrict y, float a, const float *restrict x, int hd) {
    #pragma omp simd
    for (int d = 0; d < hd; d++) y[d] += a * x[d];
}

static void attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                              const Chunk *ch, int NH, int NKV, int hd) {
    float scale = 1.0f / sqrtf((float)hd);
    int B = ch->B, len = ch->len, T = ch->T, t0 = ch->t0, group = NH / NKV;
    #pragma omp parallel
    {
        float *p = (float *)mallocCheck((size_t)(t0 + len) * sizeof(float)); // one row of scores
        #pragma omp for collapse(3)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < NH; h++)
                for (int i = 0; i < len; i++) {
                    const float *qi = q + (((size_t)b * len + i) * NH + h) * hd;
                    const float *kb = k + (size_t)b * T * NKV * hd + (h / group) * hd;
                    const float *vb = v + (size_t)b * T * NKV * hd + (h / group) * hd;
                    int n = t0 + i + 1; // keys this query sees
                    float maxv = -INFINITY;
                    for (int s = 0; s < n; s++) {
                        p[s] = attention_dot(qi, kb + (size_t)s * NKV * hd, hd) * scale;
                        if (p[s] > maxv) maxv = p[s];
                    }
                    double sum = 0;
                    for (int s = 0; s < n; s++) { p[s] = expf(p[s] - maxv); sum += p[s]; }
                    lse[((size_t)b * NH + h) * len + i] = maxv + (float)log(sum);
                    float inv = (float)(1.0 / sum), *o = out + (((size_t)b * len + i) * NH + h) * hd;
                    for (int d = 0; d < hd; d++) o[d] = 0.0f;
                    for (int s = 0; s < n; s++) attention_axpy(o, p[s] * inv, vb + (size_t)s * NKV * hd, hd);
                }
        free(p);
    }
}

// With P = exp(scores - lse) recomputed and Di = dout_i . out_i (= sum_s P_is dP_is):
// dV_s += P_is dout_i, dS_is = P_is (dout_i . v_s - Di), dq_i = scale sum_s dS_is k_s,
// dK_s += scale dS_is q_i. dq (B, len, NH, hd) is overwritten; dk, dv (B, T, NKV, hd)
// are added into for every position < t0 + len: the chunk's own rows and the
// dKV carry of earlier chunks. One thread owns each (b, kv head), so the query
// heads of a group add into the shared dk/dv without races.
static void attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                               const float *q, const float *k, const float *v, const Chunk *ch, int NH, int NKV, int hd) {
    float scale = 1.0f / sqrtf((float)hd);
    int B = ch->B, len = ch->len, T = ch->T, t0 = ch->t0, group = NH / NKV;
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++)
        for (int kh = 0; kh < NKV; kh++) {
            size_t kv0 = (size_t)b * T * NKV * hd + kh * hd;
            const float *kb = k + kv0, *vb = v + kv0;
            float *dkb = dk + kv0, *dvb = dv + kv0;
            for (int h = kh * group; h < (kh + 1) * group; h++)
                for (int i = 0; i < len; i++) {
                    size_t qi_off = (((size_t)b * len + i) * NH + h) * hd;
                    const float *qi = q + qi_off, *doi = dout + qi_off;
                    float *dqi = dq + qi_off, l = lse[((size_t)b * NH + h) * len + i];
                    float Di = attention_dot(doi, out + qi_off, hd);
                    for (int d = 0; d < hd; d++) dqi[d] = 0.0f;
                    for (int s = 0; s <= t0 + i; s++) {
                        const float *ks = kb + (size_t)s * NKV * hd, *vs = vb + (size_t)s * NKV * hd;
                        float *dks = dkb + (size_t)s * NKV * hd, *dvs = dvb + (size_t)s * NKV * hd;
                        float p = expf(attention_dot(qi, ks, hd) * scale - l);
                        float ds = p * (attention_dot(doi, vs, hd) - Di) * scale;
                        attention_axpy(dvs, p, doi, hd);
                        attention_axpy(dqi, ds, ks, hd);
                        attention_axpy(dks, ds, qi, hd);
                    }
                }
        }
}

// Summed cross-entropy of n rows of logits (n, V) against targets (-100: no
// loss). With grad_scale != 0 the logits are replaced by d(grad_scale * loss)/d(logits)
// = grad_scale * (softmax - onehot), formed while the row is at hand (rows
// without a target get 0), so the probabilities are never stored.
static double crossentropy_forward_backward(float *logits, const int *targets, int n, int V, float grad_scale) {
    double loss = 0;
    #pragma omp parallel for reduction(+ : loss)
    for (int i = 0; i < n; i++) {
        float *z = logits + (size_t)i * V;
        int y = targets[i];
        if (y < 0) { if (grad_scale != 0.0f) memset(z, 0, V * sizeof(float)); continue; }
        float maxv = -INFINITY, zy = z[y];
        for (int j = 0; j < V; j++) maxv = z[j] > maxv ? z[j] : maxv;
        double sum = 0;
        for (int j = 0; j < V; j++) { z[j] = expf(z[j] - maxv); sum += z[j]; } // z now holds exp(z - max)
        loss += maxv + log(sum) - zy;
        if (grad_scale != 0.0f) {
            float sc = (float)(grad_scale / sum);
            for (int j = 0; j < V; j++) z[j] *= sc;
            z[y] -= grad_scale;
        }
    }
    return loss;
}

static void swiglu_forward(float *out, const float *gate, const float *up, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}
static void swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float sig = 1.0f / (1.0f + expf(-gate[i]));
        dup[i] = dout[i] * gate[i] * sig;
        dgate[i] = dout[i] * up[i] * sig * (1.0f + gate[i] * (1.0f - sig));
    }
}

// ----------------------------------------------------------------------------
// building the model's buffers

// lays out one chunk's activations from base (or only counts them when base is
// NULL); returns the number of floats
static size_t chunk_acts_layout(const Config *c, int B, int C, int r, ChunkActs *s, float *base) {
    size_t L = c->n_layers, N = (size_t)B * C, D = c->dim, H = c->hidden_dim, Q = (size_t)c->n_heads * c->head_dim;
    struct { float **ptr; size_t n; } parts[] = {
        {&s->resid, (L + 1) * N * D}, {&s->ln1, L * N * D}, {&s->rstd1, L * N}, {&s->q, L * N * Q},
        {&s->lse, L * N * c->n_heads}, {&s->atty, L * N * Q}, {&s->resid_mid, L * N * D}, {&s->ln2, L * N * D},
        {&s->rstd2, L * N}, {&s->gate, L * N * H}, {&s->up, L * N * H}, {&s->hmlp, L * N * H},
        {&s->lora_h, L * LORA_N_TARGETS * N * r}};
    size_t off = 0;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        if (base) *parts[i].ptr = base + off;
        off += parts[i].n;
    }
    return off;
}

static void *alloc_counted(size_t bytes, size_t *total) { *total += bytes; return mallocCheck(bytes); }

// Buffers for micro-batches of up to B rows of T tokens, run in chunks of C
// positions (C = 0: T); recompute selects the memory mode.
static void model_alloc(Model *m, int B, int T, int C, int recompute, int num_output_chunks) {
    Config *c = &m->config;
    Activations *a = &m->a;
    if (C <= 0 || C > T) C = T;
    m->B = B; m->T = T; m->chunk_size = C; m->recompute = recompute; m->num_output_chunks = num_output_chunks;
    size_t L = c->n_layers, N = (size_t)B * C, D = c->dim, H = c->hidden_dim;
    size_t Q = (size_t)c->n_heads * c->head_dim, KV = (size_t)c->n_kv_heads * c->head_dim;
    size_t r = m->use_lora ? m->lora.r : 0, widest = D > H ? D : H;
    if (Q > widest) widest = Q;
    a->act_bytes = a->carry_bytes = 0;
    a->n_slots = recompute ? 1 : (T + C - 1) / C;
    a->chunk = (ChunkActs *)callocCheck(a->n_slots, sizeof(ChunkActs));
    size_t per_slot = chunk_acts_layout(c, B, C, r, &a->chunk[0], NULL);
    float *slots = (float *)alloc_counted(a->n_slots * per_slot * sizeof(float), &a->act_bytes);
    for (int i = 0; i < a->n_slots; i++) chunk_acts_layout(c, B, C, r, &a->chunk[i], slots + i * per_slot);
    size_t carry = L * B * (size_t)T * KV * sizeof(float);
    a->k = (float *)alloc_counted(carry, &a->carry_bytes);
    a->v = (float *)alloc_counted(carry, &a->carry_bytes);
    a->dk = (float *)alloc_counted(carry, &a->carry_bytes);
    a->dv = (float *)alloc_counted(carry, &a->carry_bytes);
    size_t piece = (C + num_output_chunks - 1) / num_output_chunks;
    a->tokens = (int *)alloc_counted(N * sizeof(int), &a->act_bytes);
    a->lnf = (float *)alloc_counted(N * D * sizeof(float), &a->act_bytes);
    a->rstdf = (float *)alloc_counted(N * sizeof(float), &a->act_bytes);
    a->logits = (float *)alloc_counted(piece * c->vocab_size * sizeof(float), &a->act_bytes);
    a->kv = (float *)alloc_counted(N * KV * sizeof(float), &a->act_bytes);
    a->dresid = (float *)alloc_counted(N * D * sizeof(float), &a->act_bytes);
    a->dln = (float *)alloc_counted(N * D * sizeof(float), &a->act_bytes);
    a->dq = (float *)alloc_counted(N * Q * sizeof(float), &a->act_bytes);
    a->datty = (float *)alloc_counted(N * Q * sizeof(float), &a->act_bytes);
    a->dgate = (float *)alloc_counted(N * H * sizeof(float), &a->act_bytes);
    a->dup = (float *)alloc_counted(N * H * sizeof(float), &a->act_bytes);
    a->dhmlp = (float *)alloc_counted(N * H * sizeof(float), &a->act_bytes);
    a->lora_dh = (float *)alloc_counted(N * r * sizeof(float), &a->act_bytes);
    a->xdrop = (float *)alloc_counted(N * widest * sizeof(float), &a->act_bytes);
    m->rope_cos = (float *)mallocCheck((size_t)T * c->head_dim / 2 * sizeof(float));
    m->rope_sin = (float *)mallocCheck((size_t)T * c->head_dim / 2 * sizeof(float));
    rope_tables(m->rope_cos, m->rope_sin, T, c->head_dim, c->rope_theta);
    if (m->full_finetune) {
        m->grads = (float *)callocCheck(m->num_params, sizeof(float));
        param_layout(c, &m->g, m->grads);
    }
}

static void model_free(Model *m) {
    Activations *a = &m->a;
    void *bufs[] = {a->chunk[0].resid, a->chunk, a->k, a->v, a->dk, a->dv, a->tokens, a->lnf, a->rstdf, a->logits,
                    a->kv, a->dresid, a->dln, a->dq, a->datty, a->dgate, a->dup, a->dhmlp, a->lora_dh, a->xdrop,
                    m->rope_cos, m->rope_sin, m->params, m->grads};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    if (m->use_lora) lora_free(&m->lora);
}

// the shapes of the seven linear layers peft can adapt, in LORA_* order
static void lora_shapes(const Config *c, int in[LORA_N_TARGETS], int out[LORA_N_TARGETS]) {
    int D = c->dim, H = c->hidden_dim, Q = c->n_heads * c->head_dim, KV = c->n_kv_heads * c->head_dim;
    int ins[LORA_N_TARGETS] = {D, D, D, Q, D, D, H}, outs[LORA_N_TARGETS] = {Q, KV, KV, D, H, H, D};
    memcpy(in, ins, sizeof ins);
    memcpy(out, outs, sizeof outs);
}

// ----------------------------------------------------------------------------
// forward and backward of one micro-batch, chunk by chunk (DESIGN section 4)

// a base linear layer plus its LoRA adapter, if any: out (N, O) = inp (N, I) W^T + lora, N = B * len
static void linear_forward(Model *m, ChunkActs *s, const Chunk *ch, int layer, int t, float *out, const float *inp,
                           const float *w) {
    LoRA *l = &m->lora;
    int in[LORA_N_TARGETS], outd[LORA_N_TARGETS], N = ch->B * ch->len;
    lora_shapes(&m->config, in, outd);
    matmul_forward(out, inp, w, N, in[t], outd[t], 1.0f, 0);
    if (m->use_lora && (l->targets & (1u << t))) {
        float *h = s->lora_h + ((size_t)layer * LORA_N_TARGETS + t) * N * l->r;
        lora_forward(l, layer, t, out, inp, h, m->a.xdrop, ch, m->dropout_key);
    }
}
// dinp (N, I) += dout W (+ LoRA); dW += dout^T inp when training the base weights
static void linear_backward(Model *m, ChunkActs *s, const Chunk *ch, int layer, int t, float *dinp, float *dw,
                            const float *dout, const float *inp, const float *w) {
    LoRA *l = &m->lora;
    int in[LORA_N_TARGETS], outd[LORA_N_TARGETS], N = ch->B * ch->len;
    lora_shapes(&m->config, in, outd);
    matmul_backward(dinp, m->full_finetune ? dw : NULL, dout, inp, w, N, in[t], outd[t], 1.0f);
    if (m->use_lora && (l->targets & (1u << t))) {
        const float *h = s->lora_h + ((size_t)layer * LORA_N_TARGETS + t) * N * l->r;
        lora_backward(l, layer, t, dinp, dout, inp, h, m->a.lora_dh, m->a.xdrop, ch, m->dropout_key);
    }
}

#define LAYER(buf, l, size) ((buf) + (size_t)(l) * (size))

// the chunk's tokens (B, len) out of the batch's (B, T)
static void chunk_tokens(int *dst, const int *tokens, const Chunk *ch) {
    for (int b = 0; b < ch->B; b++)
        memcpy(dst + (size_t)b * ch->len, tokens + (size_t)b * ch->T + ch->t0, ch->len * sizeof(int));
}
// a chunk's rows x (B, len, w) into the carry (B, T, w), or back out (dir = -1)
static void carry_copy(float *carry, float *x, const Chunk *ch, size_t w, int dir) {
    for (int b = 0; b < ch->B; b++) {
        float *c = carry + ((size_t)b * ch->T + ch->t0) * w, *xb = x + (size_t)b * ch->len * w;
        if (dir > 0) memcpy(c, xb, ch->len * w * sizeof(float));
        else memcpy(xb, c, ch->len * w * sizeof(float));
    }
}

// Forward of one chunk through every decoder layer into the activations s,
// appending the chunk's keys and values to the KV carry.
static void chunk_forward(Model *m, ChunkActs *s, const int *tokens, const Chunk *ch) {
    Config *c = &m->config;
    Activations *a = &m->a;
    int N = ch->B * ch->len, D = c->dim, H = c->hidden_dim, NH = c->n_heads, NKV = c->n_kv_heads, hd = c->head_dim;
    size_t Q = (size_t)NH * hd, KV = (size_t)NKV * hd, ND = (size_t)N * D, NHd = (size_t)N * H;
    size_t carry = (size_t)ch->B * ch->T * KV;
    ParameterTensors *w = &m->w;
    chunk_tokens(a->tokens, tokens, ch);
    embedding_forward(s->resid, a->tokens, w->embed, N, D);
    for (int l = 0; l < c->n_layers; l++) {
        float *x = LAYER(s->resid, l, ND), *ln1 = LAYER(s->ln1, l, ND), *q = LAYER(s->q, l, N * Q);
        float *atty = LAYER(s->atty, l, N * Q), *mid = LAYER(s->resid_mid, l, ND), *ln2 = LAYER(s->ln2, l, ND);
        float *gate = LAYER(s->gate, l, NHd), *up = LAYER(s->up, l, NHd), *hm = LAYER(s->hmlp, l, NHd);
        float *out = LAYER(s->resid, l + 1, ND), *kc = LAYER(a->k, l, carry), *vc = LAYER(a->v, l, carry);
        rmsnorm_forward(ln1, LAYER(s->rstd1, l, N), x, LAYER(w->attn_norm, l, D), N, D, c->norm_eps);
        linear_forward(m, s, ch, l, LORA_Q, q, ln1, LAYER(w->wq, l, Q * D));
        rope_forward(q, m->rope_cos, m->rope_sin, ch, NH, hd, 0);
        linear_forward(m, s, ch, l, LORA_K, a->kv, ln1, LAYER(w->wk, l, KV * D));
        rope_forward(a->kv, m->rope_cos, m->rope_sin, ch, NKV, hd, 0);
        carry_copy(kc, a->kv, ch, KV, 1);
        linear_forward(m, s, ch, l, LORA_V, a->kv, ln1, LAYER(w->wv, l, KV * D));
        carry_copy(vc, a->kv, ch, KV, 1);
        attention_forward(atty, LAYER(s->lse, l, (size_t)N * NH), q, kc, vc, ch, NH, NKV, hd);
        linear_forward(m, s, ch, l, LORA_O, mid, atty, LAYER(w->wo, l, D * Q));
        for (size_t i = 0; i < ND; i++) mid[i] += x[i];
        rmsnorm_forward(ln2, LAYER(s->rstd2, l, N), mid, LAYER(w->mlp_norm, l, D), N, D, c->norm_eps);
        linear_forward(m, s, ch, l, LORA_GATE, gate, ln2, LAYER(w->wgate, l, (size_t)H * D));
        linear_forward(m, s, ch, l, LORA_UP, up, ln2, LAYER(w->wup, l, (size_t)H * D));
        swiglu_forward(hm, gate, up, NHd);
        linear_forward(m, s, ch, l, LORA_DOWN, out, hm, LAYER(w->wdown, l, (size_t)D * H));
        for (size_t i = 0; i < ND; i++) out[i] += mid[i];
    }
}

// Final norm, output head and cross-entropy of one chunk; returns the summed loss
// over its targets != -100. The head runs on pieces of ceil(len / num_output_chunks)
// positions of one row at a time, so full-vocabulary logits exist only for a
// piece. With grad_scale != 0 each piece's d(grad_scale * loss)/d(logits) is
// formed in place while its logits are at hand, and a->dresid ends up holding
// d loss / d(final residual) for the chunk. logits_out (B, T, V), when given,
// receives the logits (for tests).
static double chunk_head(Model *m, ChunkActs *s, const int *targets, const Chunk *ch, float grad_scale,
                         float *logits_out) {
    Config *c = &m->config;
    Activations *a = &m->a;
    int N = ch->B * ch->len, D = c->dim, V = c->vocab_size;
    int piece = (ch->len + m->num_output_chunks - 1) / m->num_output_chunks;
    const float *xL = LAYER(s->resid, c->n_layers, (size_t)N * D);
    rmsnorm_forward(a->lnf, a->rstdf, xL, m->w.norm, N, D, c->norm_eps);
    if (grad_scale != 0.0f) memset(a->dln, 0, (size_t)N * D * sizeof(float));
    double loss = 0;
    for (int b = 0; b < ch->B; b++)
        for (int p0 = 0; p0 < ch->len; p0 += piece) {
            int n = ch->len - p0 < piece ? ch->len - p0 : piece;
            size_t row = (size_t)b * ch->len + p0, pos = (size_t)b * ch->T + ch->t0 + p0; // in the chunk, in the batch
            const float *xf = a->lnf + row * D;
            float *lg = a->logits; // (n, V)
            matmul_forward(lg, xf, m->w.head, n, D, V, 1.0f, 0);
            if (logits_out) memcpy(logits_out + pos * V, lg, (size_t)n * V * sizeof(float));
            loss += crossentropy_forward_backward(lg, targets + pos, n, V, grad_scale);
            if (grad_scale != 0.0f)
                matmul_backward(a->dln + row * D, m->full_finetune ? m->g.head : NULL, lg, xf, m->w.head, n, D, V, 1.0f);
        }
    if (grad_scale != 0.0f) {
        memset(a->dresid, 0, (size_t)N * D * sizeof(float));
        rmsnorm_backward(a->dresid, m->full_finetune ? m->g.norm : NULL, a->dln, xL, m->w.norm, a->rstdf, N, D);
    }
    return loss;
}

// Backward of one chunk through every decoder layer, from a->dresid (chunk_head's).
// At each layer's attention the chunk adds dK, dV for every position before its
// end into the dKV carry; its own rows are complete then (later chunks ran
// first), so they flow on through its key and value projections at once.
static void chunk_backward(Model *m, ChunkActs *s, const int *tokens, const Chunk *ch) {
    Config *c = &m->config;
    Activations *a = &m->a;
    int N = ch->B * ch->len, D = c->dim, H = c->hidden_dim, NH = c->n_heads, NKV = c->n_kv_heads, hd = c->head_dim;
    size_t Q = (size_t)NH * hd, KV = (size_t)NKV * hd, ND = (size_t)N * D, NHd = (size_t)N * H;
    size_t carry = (size_t)ch->B * ch->T * KV;
    int full = m->full_finetune;
    ParameterTensors *g = &m->g, *w = &m->w;
    for (int l = c->n_layers - 1; l >= 0; l--) {
        float *x = LAYER(s->resid, l, ND), *ln1 = LAYER(s->ln1, l, ND), *q = LAYER(s->q, l, N * Q);
        float *atty = LAYER(s->atty, l, N * Q), *mid = LAYER(s->resid_mid, l, ND), *ln2 = LAYER(s->ln2, l, ND);
        float *gate = LAYER(s->gate, l, NHd), *up = LAYER(s->up, l, NHd), *hm = LAYER(s->hmlp, l, NHd);
        float *kc = LAYER(a->k, l, carry), *vc = LAYER(a->v, l, carry);
        float *dkc = LAYER(a->dk, l, carry), *dvc = LAYER(a->dv, l, carry);
        // MLP block; the residual passes dresid through unchanged
        memset(a->dhmlp, 0, NHd * sizeof(float));
        linear_backward(m, s, ch, l, LORA_DOWN, a->dhmlp, full ? LAYER(g->wdown, l, (size_t)D * H) : NULL, a->dresid,
                        hm, LAYER(w->wdown, l, (size_t)D * H));
        swiglu_backward(a->dgate, a->dup, a->dhmlp, gate, up, NHd);
        memset(a->dln, 0, ND * sizeof(float));
        linear_backward(m, s, ch, l, LORA_GATE, a->dln, full ? LAYER(g->wgate, l, (size_t)H * D) : NULL, a->dgate,
                        ln2, LAYER(w->wgate, l, (size_t)H * D));
        linear_backward(m, s, ch, l, LORA_UP, a->dln, full ? LAYER(g->wup, l, (size_t)H * D) : NULL, a->dup, ln2,
                        LAYER(w->wup, l, (size_t)H * D));
        rmsnorm_backward(a->dresid, full ? LAYER(g->mlp_norm, l, D) : NULL, a->dln, mid, LAYER(w->mlp_norm, l, D),
                         LAYER(s->rstd2, l, N), N, D);
        // attention block
        memset(a->datty, 0, (size_t)N * Q * sizeof(float));
        linear_backward(m, s, ch, l, LORA_O, a->datty, full ? LAYER(g->wo, l, D * Q) : NULL, a->dresid, atty,
                        LAYER(w->wo, l, D * Q));
        attention_backward(a->dq, dkc, dvc, a->datty, atty, LAYER(s->lse, l, (size_t)N * NH), q, kc, vc, ch, NH, NKV, hd);
        rope_backward(a->dq, m->rope_cos, m->rope_sin, ch, NH, hd);
        memset(a->dln, 0, ND * sizeof(float));
        linear_backward(m, s, ch, l, LORA_Q, a->dln, full ? LAYER(g->wq, l, Q * D) : NULL, a->dq, ln1,
                        LAYER(w->wq, l, Q * D));
        carry_copy(dkc, a->kv, ch, KV, -1);
        rope_backward(a->kv, m->rope_cos, m->rope_sin, ch, NKV, hd);
        linear_backward(m, s, ch, l, LORA_K, a->dln, full ? LAYER(g->wk, l, KV * D) : NULL, a->kv, ln1,
                        LAYER(w->wk, l, KV * D));
        carry_copy(dvc, a->kv, ch, KV, -1);
        linear_backward(m, s, ch, l, LORA_V, a->dln, full ? LAYER(g->wv, l, KV * D) : NULL, a->kv, ln1,
                        LAYER(w->wv, l, KV * D));
        rmsnorm_backward(a->dresid, full ? LAYER(g->attn_norm, l, D) : NULL, a->dln, x, LAYER(w->attn_norm, l, D),
                         LAYER(s->rstd1, l, N), N, D);
    }
    if (full) {
        chunk_tokens(a->tokens, tokens, ch);
        embedding_backward(g->embed, a->dresid, a->tokens, N, D);
    }
}

static void check_batch(const Model *m, const int *tokens, int B, int T) {
    if (B > m->B || T > m->T) die("internal: batch (%d, %d) exceeds the allocated (%d, %d)", B, T, m->B, m->T);
    for (int i = 0; i < B * T; i++)
        if (tokens[i] < 0 || tokens[i] >= m->config.vocab_size)
            die("token id %d at position %d is outside the vocabulary (%d)", tokens[i], i, m->config.vocab_size);
}

static Chunk chunk_at(const Model *m, int B, int T, int j) {
    Chunk ch = {B, T, j * m->chunk_size, m->chunk_size};
    if (ch.t0 + ch.len > T) ch.len = T - ch.t0; // the last chunk may be shorter
    return ch;
}

// The summed cross-entropy of B rows of T tokens over targets != -100 (no
// gradients: evaluation, tests). logits_out as in chunk_head.
static double model_forward(Model *m, const int *tokens, const int *targets, int B, int T, float *logits_out) {
    check_batch(m, tokens, B, T);
    double loss = 0;
    for (int j = 0; j * m->chunk_size < T; j++) {
        Chunk ch = chunk_at(m, B, T, j);
        chunk_forward(m, &m->a.chunk[0], tokens, &ch);
        loss += chunk_head(m, &m->a.chunk[0], targets, &ch, 0.0f, logits_out);
    }
    return loss;
}

// Forward and backward of one micro-batch: returns the summed cross-entropy and
// adds grad_scale * d(loss)/d(parameter) into the gradients of the trainable ones.
// Chunks run forward in order, filling the KV carry, then backward in reverse
// order with the dKV carry; in recompute mode a chunk's forward runs again just
// before its backward (the last chunk's activations are still there).
static double model_forward_backward(Model *m, const int *tokens, const int *targets, int B, int T, float grad_scale) {
    check_batch(m, tokens, B, T);
    Activations *a = &m->a;
    size_t carry = (size_t)m->config.n_layers * B * T * m->config.n_kv_heads * m->config.head_dim;
    memset(a->dk, 0, carry * sizeof(float));
    memset(a->dv, 0, carry * sizeof(float));
    int n = (T + m->chunk_size - 1) / m->chunk_size;
    for (int j = 0; j < n; j++) {
        Chunk ch = chunk_at(m, B, T, j);
        chunk_forward(m, &a->chunk[m->recompute ? 0 : j], tokens, &ch);
    }
    double loss = 0;
    for (int j = n - 1; j >= 0; j--) {
        Chunk ch = chunk_at(m, B, T, j);
        ChunkActs *s = &a->chunk[m->recompute ? 0 : j];
        if (m->recompute && j < n - 1) chunk_forward(m, s, tokens, &ch);
        loss += chunk_head(m, s, targets, &ch, grad_scale, NULL);
        chunk_backward(m, s, tokens, &ch);
    }
    return loss;
}

// ----------------------------------------------------------------------------
// sampling: one sequence, with the KV carry as the cache

// logits (V) of position ch->len - 1 of the chunk chunk_forward just ran (B = 1)
static float *last_logits(Model *m, const Chunk *ch) {
    Config *c = &m->config;
    Activations *a = &m->a;
    const float *x = LAYER(a->chunk[0].resid, c->n_layers, (size_t)ch->len * c->dim) + (size_t)(ch->len - 1) * c->dim;
    rmsnorm_forward(a->lnf, a->rstdf, x, m->w.norm, 1, c->dim, c->norm_eps);
    matmul_forward(a->logits, a->lnf, m->w.head, 1, c->dim, c->vocab_size, 1.0f, 0);
    return a->logits;
}

static int cmp_prob_desc(const void *a, const void *b) {
    float x = ((const float *)a)[0], y = ((const float *)b)[0];
    return (x < y) - (x > y);
}

// the next token from logits z (V): argmax at temperature 0, else a draw from
// softmax(z / temperature) restricted to the smallest set of tokens whose
// probability adds up to top_p (nucleus sampling). Ties go to the lower id.
static int sample_token(float *z, int V, float temperature, float top_p, uint64_t *rng) {
    int best = 0;
    for (int i = 1; i < V; i++) if (z[i] > z[best]) best = i;
    if (temperature <= 0.0f) return best;
    float (*pi)[2] = (float (*)[2])mallocCheck((size_t)V * sizeof *pi); // (probability, id) pairs
    double sum = 0;
    for (int i = 0; i < V; i++) { pi[i][0] = expf((z[i] - z[best]) / temperature); pi[i][1] = (float)i; sum += pi[i][0]; }
    qsort(pi, V, sizeof *pi, cmp_prob_desc);
    int n = 0;
    double kept = 0;
    while (n < V && (n == 0 || kept < top_p * sum)) kept += pi[n++][0];
    double r = rng_uniform(rng) * kept, acc = 0;
    int tok = (int)pi[n - 1][1];
    for (int i = 0; i < n; i++) if ((acc += pi[i][0]) > r) { tok = (int)pi[i][1]; break; }
    free(pi);
    return tok;
}

// Continues prompt (n_prompt ids) by up to max_new tokens, stopping after eos.
// The prompt runs in chunks of the model's chunk size, then one token at a time,
// each step attending to the KV carry of everything before it. Returns the new
// tokens (malloc'd, *n_new of them); the length is capped by the model's T.
static int *generate(Model *m, const int *prompt, int n_prompt, int max_new, float temperature, float top_p,
                     uint64_t seed, int eos, int *n_new) {
    int T = m->T, cap = m->B * m->chunk_size; // positions the carry / a chunk's activations hold
    if (n_prompt > T - 1) n_prompt = T - 1;   // keep the end of a long prompt's room for one token
    if (max_new > T - n_prompt) max_new = T - n_prompt;
    int *seq = (int *)callocCheck(T, sizeof(int)), *out = (int *)mallocCheck((max_new + 1) * sizeof(int));
    memcpy(seq, prompt, n_prompt * sizeof(int));
    int training = m->lora.training;
    m->lora.training = 0; // no dropout
    uint64_t rng = seed;
    Chunk ch = {1, T, 0, 0};
    for (ch.t0 = 0; ch.t0 < n_prompt; ch.t0 += ch.len) {
        ch.len = n_prompt - ch.t0 < cap ? n_prompt - ch.t0 : cap;
        chunk_forward(m, &m->a.chunk[0], seq, &ch);
    }
    *n_new = 0;
    for (int pos = n_prompt; *n_new < max_new; pos++) {
        int tok = sample_token(last_logits(m, &ch), m->config.vocab_size, temperature, top_p, &rng);
        out[(*n_new)++] = tok;
        if (tok == eos || pos + 1 >= T) break;
        seq[pos] = tok;
        ch.t0 = pos; ch.len = 1;
        chunk_forward(m, &m->a.chunk[0], seq, &ch);
    }
    m->lora.training = training;
    free(seq);
    return out;
}

// ----------------------------------------------------------------------------
// optimizer: AdamW as torch.optim.AdamW, learning-rate schedules as transformers'

typedef struct {
    float *params, *grads;  // the trainable parameters, flat
    size_t n;
    float *m, *v;           // AdamW moments
    int t;                  // optimizer steps taken
} Optimizer;

// p -= lr * wd * p; then the bias-corrected Adam step (torch's decoupled weight decay)
static void adamw_update(Optimizer *o, float lr, float beta1, float beta2, float eps, float wd) {
    o->t++;
    double bc1 = 1.0 - pow(beta1, o->t), bc2 = 1.0 - pow(beta2, o->t);
    float step_size = (float)(lr / bc1), bc2_sqrt = (float)sqrt(bc2);
    #pragma omp parallel for
    for (size_t i = 0; i < o->n; i++) {
        float g = o->grads[i];
        float mi = o->m[i] = beta1 * o->m[i] + (1.0f - beta1) * g;
        float vi = o->v[i] = beta2 * o->v[i] + (1.0f - beta2) * g * g;
        o->params[i] *= 1.0f - lr * wd;
        o->params[i] -= step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
    }
}

static double grad_norm(const float *g, size_t n) {
    double s = 0;
    #pragma omp parallel for reduction(+ : s)
    for (size_t i = 0; i < n; i++) s += (double)g[i] * g[i];
    return sqrt(s);
}

// torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when that is below 1
static void clip_grads(float *g, size_t n, double norm, float max_norm) {
    if (max_norm <= 0) return;
    double coef = max_norm / (norm + 1e-6);
    if (coef >= 1.0) return;
    for (size_t i = 0; i < n; i++) g[i] = (float)(g[i] * coef);
}

// learning rate for optimizer step s (0-based), as transformers' get_*_schedule_with_warmup
static float lr_at(const char *sched, float base, int s, int warmup, int total) {
    if (s < warmup) return base * (float)s / (float)(warmup > 1 ? warmup : 1);
    if (strcmp(sched, "constant") == 0) return base;
    double progress = (double)(s - warmup) / (double)(total - warmup > 1 ? total - warmup : 1);
    if (strcmp(sched, "linear") == 0) return (float)(base * fmax(0.0, (double)(total - s) / fmax(1.0, total - warmup)));
    return (float)(base * fmax(0.0, 0.5 * (1.0 + cos(M_PI * progress)))); // cosine, half a cycle
}

// ----------------------------------------------------------------------------
// command line

#define MAX_LIST 16
typedef struct { const char *v[MAX_LIST]; int n; } StrList; // a repeatable option's values

typedef struct {
    const char *model, *data, *val_data, *output_dir, *tokenizer, *metrics_file, *from_peft_checkpoint;
    int max_seq_len, batch_size, grad_accum, max_steps, num_epochs, warmup_steps, seed, shuffle;
    int eval_every, full_finetune, lora_r, use_rslora, threads, chunk_size, num_output_chunks;
    float lr, weight_decay, grad_clip, beta1, beta2, eps, lora_alpha, lora_dropout;
    const char *lr_scheduler, *lora_target_modules, *chunk_memory;
    const char *resume;
    int save_every, keep_checkpoints, max_bad_steps;
    const char *data_format, *batching, *data_slice, *data_cache_dir;
    int train_on_prompt, max_samples;
    float val_split;
    StrList sample_prompt;
    int sample_every, max_new_tokens;
    float temperature, top_p;
    int dry_run, merge_adapter;
    float peak_tflops;
} TrainConfig;

enum { OPT_STR, OPT_INT, OPT_FLOAT, OPT_FLAG, OPT_LIST };
typedef struct { const char *name; int type; void *ptr; const char *def, *help; double lo, hi; } Option;

#define OPTIONS(tc) { \
    {"model", OPT_STR, &(tc)->model, "", "Hugging Face checkpoint folder (config.json, *.safetensors, tokenizer.model)", 0, 0}, \
    {"data", OPT_STR, &(tc)->data, "", "training data: JSONL or a JSON array of records (see --data_format)", 0, 0}, \
    {"data_format", OPT_STR, &(tc)->data_format, "auto", "auto | text | prompt_response | alpaca | samsum | chat (auto: from the first record's keys)", 0, 0}, \
    {"train_on_prompt", OPT_INT, &(tc)->train_on_prompt, "0", "1: prompt tokens carry loss too; 0: only the response does", 0, 1}, \
    {"batching", OPT_STR, &(tc)->batching, "padding", "padding: one sample per row; packing: samples concatenated into full --max_seq_len rows", 0, 0}, \
    {"max_samples", OPT_INT, &(tc)->max_samples, "0", "use only the first N samples (0: all)", 0, 2147483647}, \
    {"data_slice", OPT_STR, &(tc)->data_slice, "", "records to use, HF datasets style: [:10%], [10%:20%], [:100], [50:]", 0, 0}, \
    {"data_cache_dir", OPT_STR, &(tc)->data_cache_dir, "", "where the token cache goes (default: next to the data file)", 0, 0}, \
    {"val_data", OPT_STR, &(tc)->val_data, "", "validation data (same format options; evaluated at the end and every --eval_every steps)", 0, 0}, \
    {"val_split", OPT_FLOAT, &(tc)->val_split, "0", "hold out this fraction of --data's samples for validation (seeded)", 0, 0.99}, \
    {"output_dir", OPT_STR, &(tc)->output_dir, "output", "where the PEFT adapter (or the full model) is written at the end", 0, 0}, \
    {"tokenizer", OPT_STR, &(tc)->tokenizer, "", "tokenizer.model to use (default: the one in --model)", 0, 0}, \
    {"metrics_file", OPT_STR, &(tc)->metrics_file, "", "write one JSON object per step and per evaluation to this file", 0, 0}, \
    {"max_seq_len", OPT_INT, &(tc)->max_seq_len, "512", "sequences are truncated to this many tokens", 2, 1 << 20}, \
    {"batch_size", OPT_INT, &(tc)->batch_size, "4", "rows per micro-batch", 1, 1 << 16}, \
    {"gradient_accumulation_steps", OPT_INT, &(tc)->grad_accum, "1", "micro-batches per optimizer step", 1, 1 << 16}, \
    {"max_steps", OPT_INT, &(tc)->max_steps, "-1", "optimizer steps (-1: as many as --num_epochs needs)", -1, 1 << 30}, \
    {"num_epochs", OPT_INT, &(tc)->num_epochs, "1", "passes over the data when --max_steps is -1", 1, 1 << 20}, \
    {"lr", OPT_FLOAT, &(tc)->lr, "1e-4", "peak learning rate", 0, 1e3}, \
    {"weight_decay", OPT_FLOAT, &(tc)->weight_decay, "0.0", "AdamW decoupled weight decay (applied to every trainable tensor)", 0, 1e3}, \
    {"adam_beta1", OPT_FLOAT, &(tc)->beta1, "0.9", "AdamW beta1", 0, 0.999999}, \
    {"adam_beta2", OPT_FLOAT, &(tc)->beta2, "0.999", "AdamW beta2", 0, 0.9999999}, \
    {"adam_epsilon", OPT_FLOAT, &(tc)->eps, "1e-8", "AdamW epsilon", 0, 1}, \
    {"lr_scheduler", OPT_STR, &(tc)->lr_scheduler, "cosine", "constant | linear | cosine (each after --warmup_steps of linear warmup)", 0, 0}, \
    {"warmup_steps", OPT_INT, &(tc)->warmup_steps, "0", "linear warmup steps", 0, 1 << 30}, \
    {"grad_clip", OPT_FLOAT, &(tc)->grad_clip, "1.0", "clip the global gradient norm to this (0: off)", 0, 1e9}, \
    {"seed", OPT_INT, &(tc)->seed, "42", "seed for LoRA init, dropout and shuffling", 0, 2147483647}, \
    {"shuffle", OPT_INT, &(tc)->shuffle, "1", "1: shuffle rows every epoch, 0: file order", 0, 1}, \
    {"eval_every", OPT_INT, &(tc)->eval_every, "0", "evaluate --val_data every N steps (0: only at the end)", 0, 1 << 30}, \
    {"full_finetune", OPT_FLAG, &(tc)->full_finetune, "0", "train every weight instead of LoRA adapters", 0, 1}, \
    {"lora_r", OPT_INT, &(tc)->lora_r, "8", "LoRA rank", 1, 65536}, \
    {"lora_alpha", OPT_FLOAT, &(tc)->lora_alpha, "16", "LoRA alpha (scale = alpha / r)", 0, 1e6}, \
    {"lora_dropout", OPT_FLOAT, &(tc)->lora_dropout, "0.05", "dropout on the LoRA input", 0, 0.99}, \
    {"lora_target_modules", OPT_STR, &(tc)->lora_target_modules, "q_proj,v_proj", "comma-separated peft module names, or all-linear", 0, 0}, \
    {"use_rslora", OPT_INT, &(tc)->use_rslora, "0", "1: scale = alpha / sqrt(r) (rank-stabilised LoRA)", 0, 1}, \
    {"from_peft_checkpoint", OPT_STR, &(tc)->from_peft_checkpoint, "", "start from this PEFT adapter folder (its r, alpha, targets)", 0, 0}, \
    {"chunk_size", OPT_INT, &(tc)->chunk_size, "0", "train each sequence in chunks of this many tokens with a KV carry (0: whole)", 0, 1 << 20}, \
    {"chunk_memory", OPT_STR, &(tc)->chunk_memory, "keep", "keep: every chunk's activations until its backward; recompute: re-run a chunk's forward before its backward", 0, 0}, \
    {"num_output_chunks", OPT_INT, &(tc)->num_output_chunks, "1", "run the output head and loss in this many pieces of a chunk", 1, 1 << 20}, \
    {"threads", OPT_INT, &(tc)->threads, "0", "OpenMP threads (0: OpenMP's default)", 0, 4096}, \
    {"save_every", OPT_INT, &(tc)->save_every, "0", "write a checkpoint every N steps (and at the end; 0: only at the end)", 0, 1 << 30}, \
    {"keep_checkpoints", OPT_INT, &(tc)->keep_checkpoints, "2", "keep the newest K checkpoints (0: all)", 0, 1 << 20}, \
    {"max_bad_steps", OPT_INT, &(tc)->max_bad_steps, "5", "stop when this many steps in a row have a NaN or infinite loss or gradient norm (each is skipped)", 1, 1 << 30}, \
    {"resume", OPT_STR, &(tc)->resume, "", "continue from a checkpoint folder, or the newest checkpoint in an --output_dir", 0, 0}, \
    {"sample_prompt", OPT_LIST, &(tc)->sample_prompt, "", "print a continuation of this prompt before and after training (repeatable)", 0, 0}, \
    {"sample_every", OPT_INT, &(tc)->sample_every, "0", "also print the samples every N steps (0: only before and after)", 0, 1 << 30}, \
    {"max_new_tokens", OPT_INT, &(tc)->max_new_tokens, "48", "tokens to generate per sample", 1, 1 << 20}, \
    {"temperature", OPT_FLOAT, &(tc)->temperature, "0", "sampling temperature (0: greedy)", 0, 100}, \
    {"dry_run", OPT_FLAG, &(tc)->dry_run, "0", "print the configuration and the memory plan, then exit", 0, 1}, \
    {"merge_adapter", OPT_FLAG, &(tc)->merge_adapter, "0", "LoRA: also save OUTPUT_DIR/merged, a Hugging Face model with the adapter folded in", 0, 1}, \
    {"peak_tflops", OPT_FLOAT, &(tc)->peak_tflops, "0", "the machine's peak TFLOP/s, to report MFU (0: report TFLOP/s only)", 0, 1e6}, \
    {"top_p", OPT_FLOAT, &(tc)->top_p, "0.9", "nucleus sampling: draw from the smallest set of tokens with this much probability", 0, 1}, \
}

static void print_help(const Option *opts, int n) {
    printf("usage: train_llama2 --model DIR --data FILE.jsonl [options]\n\n");
    for (int i = 0; i < n; i++)
        printf("  --%-28s %s (default: %s)\n", opts[i].name, opts[i].help, opts[i].def[0] ? opts[i].def : "none");
    printf("  --%-28s %s\n", "help", "print this and exit");
}

static int set_option(const Option *o, const char *val) {
    char *end;
    errno = 0;
    if (o->type == OPT_STR) { *(const char **)o->ptr = val; return 0; }
    if (o->type == OPT_LIST) {
        StrList *l = (StrList *)o->ptr;
        if (!*val) { l->n = 0; return 0; } // the default: empty
        if (l->n == MAX_LIST) { fprintf(stderr, "error: --%s given more than %d times\n", o->name, MAX_LIST); return -1; }
        l->v[l->n++] = val;
        return 0;
    }
    if (o->type == OPT_INT || o->type == OPT_FLAG) {
        long v = strtol(val, &end, 10);
        if (*val == 0 || *end != 0 || errno || v < o->lo || v > o->hi) {
            fprintf(stderr, "error: --%s: '%s' is not an integer in [%g, %g]\n", o->name, val, o->lo, o->hi);
            return -1;
        }
        *(int *)o->ptr = (int)v;
        return 0;
    }
    double v = strtod(val, &end);
    if (*val == 0 || *end != 0 || errno || !(v >= o->lo && v <= o->hi)) {
        fprintf(stderr, "error: --%s: '%s' is not a number in [%g, %g]\n", o->name, val, o->lo, o->hi);
        return -1;
    }
    *(float *)o->ptr = (float)v;
    return 0;
}

// 0: parsed, 1: --help printed, -1: error (message printed)
static int parse_args(TrainConfig *tc, int argc, char **argv) {
    Option opts[] = OPTIONS(tc);
    int n = (int)(sizeof opts / sizeof opts[0]);
    for (int i = 0; i < n; i++) set_option(&opts[i], opts[i].def);
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) { print_help(opts, n); return 1; }
        if (strncmp(arg, "--", 2) != 0) { fprintf(stderr, "error: unexpected argument '%s' (options start with --; see --help)\n", arg); return -1; }
        const char *name = arg + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const Option *o = NULL;
        for (int k = 0; k < n; k++)
            if (strlen(opts[k].name) == len && strncmp(opts[k].name, name, len) == 0) o = &opts[k];
        if (!o) { fprintf(stderr, "error: unknown option '--%.*s' (see --help)\n", (int)len, name); return -1; }
        const char *val;
        if (eq) val = eq + 1;
        else if (o->type == OPT_FLAG) val = "1";
        else if (i + 1 < argc) val = argv[++i];
        else { fprintf(stderr, "error: --%s needs a value\n", o->name); return -1; }
        if (set_option(o, val) != 0) return -1;
    }
    const char *sched = tc->lr_scheduler;
    if (strcmp(sched, "constant") && strcmp(sched, "linear") && strcmp(sched, "cosine")) {
        fprintf(stderr, "error: --lr_scheduler: '%s' is not one of constant, linear, cosine\n", sched);
        return -1;
    }
    if (strcmp(tc->batching, "padding") && strcmp(tc->batching, "packing")) {
        fprintf(stderr, "error: --batching: '%s' is not one of padding, packing\n", tc->batching);
        return -1;
    }
    int fmt_ok = 0;
    for (size_t i = 0; i < sizeof data_format_names / sizeof data_format_names[0]; i++) fmt_ok |= !strcmp(tc->data_format, data_format_names[i]);
    if (!fmt_ok) {
        fprintf(stderr, "error: --data_format: '%s' is not one of auto, text, prompt_response, alpaca, samsum, chat\n", tc->data_format);
        return -1;
    }
    if (tc->val_data[0] && tc->val_split > 0) {
        fprintf(stderr, "error: --val_data and --val_split do not go together (one validation set)\n");
        return -1;
    }
    if (strcmp(tc->chunk_memory, "keep") && strcmp(tc->chunk_memory, "recompute")) {
        fprintf(stderr, "error: --chunk_memory: '%s' is not one of keep, recompute\n", tc->chunk_memory);
        return -1;
    }
    if (tc->chunk_size > tc->max_seq_len) {
        fprintf(stderr, "error: --chunk_size %d is larger than --max_seq_len %d (use 0 for whole sequences)\n",
                tc->chunk_size, tc->max_seq_len);
        return -1;
    }
    int chunk = tc->chunk_size ? tc->chunk_size : tc->max_seq_len;
    if (tc->num_output_chunks > chunk) {
        fprintf(stderr, "error: --num_output_chunks %d is more than the %d tokens of a chunk\n", tc->num_output_chunks, chunk);
        return -1;
    }
    unsigned mask;
    if (lora_parse_targets(tc->lora_target_modules, &mask) != 0) return -1;
    if (!tc->model[0]) { fprintf(stderr, "error: --model is required (see --help)\n"); return -1; }
    if (!tc->data[0]) { fprintf(stderr, "error: --data is required (see --help)\n"); return -1; }
    if (tc->full_finetune && tc->merge_adapter) {
        fprintf(stderr, "error: --merge_adapter folds a LoRA adapter in; with --full_finetune there is none\n");
        return -1;
    }
    if (tc->full_finetune && tc->from_peft_checkpoint[0]) {
        fprintf(stderr, "error: --from_peft_checkpoint and --full_finetune do not go together\n");
        return -1;
    }
    return 0;
}

// ----------------------------------------------------------------------------
// training

// the most resident memory this process has had, in MiB (Linux reports KiB)
static double peak_rss_mb(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss / 1024.0;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

// sets up the model for training as tc says: LoRA adapters (fresh or from a PEFT folder) or full
// fine-tuning; resume_dir, when given, is a checkpoint whose trained weights replace the starting ones
static int model_setup(Model *m, const TrainConfig *tc, int B, int T, const char *resume_dir) {
    memset(m, 0, sizeof *m);
    if (model_load(m, resume_dir && tc->full_finetune ? resume_dir : tc->model) != 0) return -1;
    m->full_finetune = tc->full_finetune;
    m->use_lora = !tc->full_finetune;
    if (m->use_lora) {
        int in[LORA_N_TARGETS], out[LORA_N_TARGETS];
        lora_shapes(&m->config, in, out);
        const char *adapter = resume_dir ? resume_dir : tc->from_peft_checkpoint;
        if (adapter[0]) {
            if (lora_load_peft(&m->lora, adapter, m->config.n_layers, in, out) != 0) return -1;
        } else {
            unsigned targets;
            lora_parse_targets(tc->lora_target_modules, &targets);
            lora_alloc(&m->lora, m->config.n_layers, in, out, tc->lora_r, tc->lora_alpha, tc->lora_dropout,
                       tc->use_rslora, targets);
            lora_init(&m->lora, (uint64_t)tc->seed);
        }
    }
    model_alloc(m, B, T, tc->chunk_size, strcmp(tc->chunk_memory, "recompute") == 0, tc->num_output_chunks);
    return 0;
}

static void optimizer_init(Optimizer *o, Model *m) {
    memset(o, 0, sizeof *o);
    o->params = m->use_lora ? m->lora.params : m->params;
    o->grads = m->use_lora ? m->lora.grads : m->grads;
    o->n = m->use_lora ? m->lora.num_params : m->num_params;
    o->m = (float *)callocCheck(o->n, sizeof(float));
    o->v = (float *)callocCheck(o->n, sizeof(float));
}

static void optimizer_free(Optimizer *o) { free(o->m); free(o->v); }

// mean cross-entropy over every label token of a dataset, in file order
static double evaluate(Model *m, const Dataset *ds, int B, int pad_id) {
    int *tokens = (int *)mallocCheck((size_t)B * m->T * sizeof(int)), *targets = (int *)mallocCheck((size_t)B * m->T * sizeof(int));
    double loss = 0;
    long count = 0;
    m->lora.training = 0;
    for (long r = 0; r < ds->n_rows; r += B) {
        int rows = ds->n_rows - r < B ? (int)(ds->n_rows - r) : B, T;
        count += dataset_get_rows(ds, r, rows, pad_id, tokens, targets, &T);
        loss += model_forward(m, tokens, targets, rows, T, NULL);
    }
    m->lora.training = 1;
    free(tokens); free(targets);
    return count ? loss / count : 0.0;
}

static void report_eval(Model *m, const Dataset *ds, int B, int pad_id, int step, FILE *metrics) {
    double vl = evaluate(m, ds, B, pad_id);
    printf("step %d | val loss %.6f | val ppl %.4f\n", step, vl, exp(vl));
    if (metrics) {
        fprintf(metrics, "{\"step\": %d, \"val_loss\": %.9g, \"val_ppl\": %.9g}\n", step, vl, exp(vl));
        fflush(metrics);
    }
}

// full fine-tuning output: a Hugging Face folder (config.json and tokenizer.model
// copied from the inputs, model.safetensors in F32 with the standard names)
static int copy_file(const char *from, const char *to) {
    size_t len;
    char *buf = read_file(from, &len);
    if (!buf) { fprintf(stderr, "error: cannot read '%s': %s\n", from, strerror(errno)); return -1; }
    int rc = write_bytes_atomic(to, buf, len);
    free(buf);
    return rc;
}

static int model_save_hf(const Model *m, const char *dir, const char *model_dir, const char *tokpath) {
    if (mkdir_p(dir) != 0) {
        fprintf(stderr, "error: cannot create output directory '%s': %s\n", dir, strerror(errno));
        return -1;
    }
    const Config *c = &m->config;
    float *ptrs[NUM_PARAM_TENSORS];
    param_tensors(&m->w, ptrs);
    int cap = NUM_PARAM_TENSORS * c->n_layers, n = 0;
    StWriteTensor *ts = (StWriteTensor *)callocCheck(cap, sizeof(StWriteTensor));
    char (*names)[128] = (char (*)[128])mallocCheck((size_t)cap * 128);
    for (int p = 0; p < NUM_PARAM_TENSORS; p++) {
        if (p == P_HEAD && c->tied) continue;
        int64_t rows, cols;
        param_shape(c, p, &rows, &cols);
        for (int l = 0; l < (param_per_layer(p) ? c->n_layers : 1); l++, n++) {
            param_name(p, l, names[n], 128);
            ts[n].name = names[n];
            ts[n].dtype = ST_F32;
            ts[n].ndim = rows == 1 ? 1 : 2;
            ts[n].shape[0] = rows == 1 ? cols : rows;
            ts[n].shape[1] = cols;
            ts[n].data = ptrs[p] + (size_t)l * rows * cols;
        }
    }
    char path[4096], from[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    const char *meta[2] = {"format", "pt"};
    int rc = st_write(path, ts, n, meta, 1);
    free(ts); free(names);
    snprintf(from, sizeof from, "%s/config.json", model_dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (rc == 0) rc = copy_file(from, path);
    snprintf(path, sizeof path, "%s/tokenizer.model", dir);
    if (rc == 0) rc = copy_file(tokpath, path);
    return rc;
}

// ----------------------------------------------------------------------------
// checkpoints and exact resume (checkpoint.h makes each checkpoint folder atomic)
//
// A checkpoint holds everything the rest of the run depends on: the trainable
// weights (a PEFT adapter, or the whole model for full fine-tuning, in F32),
// the AdamW moments and step count, the optimizer step and the data position.
// Dropout masks and the shuffle order are functions of --seed, the step and
// the epoch, so no RNG state needs saving: a resumed run is bit-identical.

static volatile sig_atomic_t stop_requested = 0;
static void on_stop_signal(int sig) { (void)sig; stop_requested = 1; }

// Fault injection for the tests: LLAMA2TUNE_FAULT=<point>:<step> (or
// <point>:<first>-<last>, a range of steps) is on at <point> for those steps.
// At "step" and "checkpoint" the process is killed (SIGKILL, no cleanup); at
// "nan" and "huge" train_step poisons one gradient element (NaN, 1e30).
static int fault_at(const char *point, int step) {
    const char *f = getenv("LLAMA2TUNE_FAULT");
    size_t n = strlen(point);
    if (!f || strncmp(f, point, n) != 0 || f[n] != ':') return 0;
    char *end;
    long first = strtol(f + n + 1, &end, 10), last = *end == '-' ? strtol(end + 1, NULL, 10) : first;
    return step >= first && step <= last;
}
static void fault_point(const char *point, int step) { if (fault_at(point, step)) raise(SIGKILL); }

// the options that shape the training trajectory: a resumed run must use the same
// (--max_steps and --num_epochs may change, to train longer; the schedule then
// spans the new length, so such a run differs from one planned that long)
static const char *resume_must_match[] = {
    "model", "data", "max_seq_len", "batch_size", "gradient_accumulation_steps", "lr",
    "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "lr_scheduler", "warmup_steps", "grad_clip", "seed",
    "shuffle", "full_finetune", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "use_rslora",
    "from_peft_checkpoint", "data_format", "train_on_prompt", "batching", "max_samples", "data_slice", "val_split"};

// an option's value as text; exact: floats with every digit (for resume checks)
static void option_value(const Option *o, char *buf, size_t n, int exact) {
    switch (o->type) {
    case OPT_STR: snprintf(buf, n, "%s", *(const char **)o->ptr); break;
    case OPT_FLOAT: snprintf(buf, n, exact ? "%.9g" : "%g", *(float *)o->ptr); break;
    case OPT_LIST: snprintf(buf, n, "(%d values)", ((StrList *)o->ptr)->n); break;
    default: snprintf(buf, n, "%d", *(int *)o->ptr);
    }
}

// a file's identity for resume: the one the token cache keys on (dataloader.h's
// data_identity: size, modification time and a hash of its first and last MiB)
static void file_fingerprint(const char *path, char *out, size_t n) {
    CacheHeader h;
    memset(&h, 0, sizeof h);
    if (data_identity(path, &h) != 0) { snprintf(out, n, "unreadable"); return; }
    snprintf(out, n, "%llu:%lld:%016llx", (unsigned long long)h.data_size, (long long)h.data_mtime_ns,
             (unsigned long long)h.data_hash);
}

// opt_t < step when steps were skipped (non-finite loss or gradient); bad_in_row counts the latest run of them
typedef struct { int step, opt_t, data_epoch, data_pos, bad_in_row; } TrainState;

static int all_finite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

static int save_checkpoint(TrainConfig *tc, Model *m, Optimizer *o, const TrainState *ts, const char *tokpath) {
    char dir[PATH_MAX], path[PATH_MAX + 64];
    // finite losses and gradients can still overflow the update (AdamW's g^2 above FLT_MAX without --grad_clip): never save that
    if (!all_finite(o->params, o->n) || !all_finite(o->m, o->n) || !all_finite(o->v, o->n)) {
        fprintf(stderr, "error: not saving checkpoint %d: the trainable weights or AdamW moments hold NaN or inf (an update "
                "overflowed: a gradient above 1e19; keep --grad_clip on, lower --lr); the checkpoints before it are intact\n", ts->step);
        return -1;
    }
    if (checkpoint_begin(tc->output_dir, ts->step, dir, sizeof dir) != 0) return -1;
    int rc = m->use_lora ? lora_save_peft(&m->lora, dir, tc->model) : model_save_hf(m, dir, tc->model, tokpath);
    fault_point("checkpoint", ts->step); // the tests kill the run here, halfway through a checkpoint
    StWriteTensor moments[2] = {{"exp_avg", ST_F32, 1, {(int64_t)o->n}, o->m}, {"exp_avg_sq", ST_F32, 1, {(int64_t)o->n}, o->v}};
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    if (rc == 0) rc = st_write(path, moments, 2, NULL, 0);
    // trainer_state.json: the position, and the options and data it belongs to
    char *js, val[4096], fp[128];
    size_t len;
    FILE *f = open_memstream(&js, &len);
    if (!f) die("out of memory");
    file_fingerprint(tc->data, fp, sizeof fp);
    fprintf(f, "{\n  \"step\": %d,\n  \"optimizer_step\": %d,\n  \"data_epoch\": %d,\n  \"data_position\": %d,\n"
            "  \"bad_steps_in_row\": %d,\n  \"data_fingerprint\": \"%s\",\n  \"files\": ", ts->step, ts->opt_t, ts->data_epoch,
            ts->data_pos, ts->bad_in_row, fp);
    if (rc == 0) rc = checkpoint_write_digests(f, dir); // what a resume checks before reading them
    fprintf(f, ",\n  \"options\": {");
    Option opts[] = OPTIONS(tc);
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
        option_value(&opts[i], val, sizeof val, 1);
        fprintf(f, "%s\n    \"%s\": ", i ? "," : "", opts[i].name);
        json_write_string(f, val);
    }
    fprintf(f, "\n  }\n}\n");
    if (fclose(f) != 0) die("out of memory writing trainer_state.json");
    snprintf(path, sizeof path, "%s/trainer_state.json", dir);
    if (rc == 0) rc = write_bytes_atomic(path, js, len);
    free(js);
    if (rc != 0) {
        fprintf(stderr, "error: writing checkpoint step %d failed; the previous checkpoints are intact\n", ts->step);
        remove_tree(dir);
        return -1;
    }
    return checkpoint_commit(tc->output_dir, ts->step, tc->keep_checkpoints);
}

// Reads a checkpoint's state and optimizer moments, after checking that it
// belongs to this run (same trajectory-shaping options, same data file).
static int load_checkpoint(TrainConfig *tc, const char *dir, Optimizer *o, TrainState *ts) {
    char path[PATH_MAX + 64], val[4096], fp[128];
    snprintf(path, sizeof path, "%s/trainer_state.json", dir);
    JsonValue st;
    if (json_load_file(path, &st) != 0) return -1;
    int rc = -1;
    long long v[5];
    const char *keys[5] = {"step", "optimizer_step", "data_epoch", "data_position", "bad_steps_in_row"}, *saved;
    const JsonValue *opts_saved = json_get(&st, "options");
    for (int i = 0; i < 5; i++)
        if (json_get_int(&st, keys[i], &v[i]) != 0 || v[i] < 0 || v[i] > INT32_MAX) {
            fprintf(stderr, "error: %s: '%s' missing or not a non-negative integer\n", path, keys[i]); goto done;
        }
    if (!opts_saved || opts_saved->type != JSON_OBJECT) { fprintf(stderr, "error: %s: no \"options\" object\n", path); goto done; }
    Option opts[] = OPTIONS(tc);
    for (size_t k = 0; k < sizeof resume_must_match / sizeof resume_must_match[0]; k++)
        for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
            if (strcmp(opts[i].name, resume_must_match[k])) continue;
            option_value(&opts[i], val, sizeof val, 1);
            if (json_get_string(opts_saved, opts[i].name, &saved, NULL) != 0 || strcmp(saved, val) != 0) {
                fprintf(stderr, "error: --resume %s: --%s was '%s' in the checkpoint but is '%s' now; resume with the same value\n",
                        dir, opts[i].name, json_get_string(opts_saved, opts[i].name, &saved, NULL) == 0 ? saved : "(missing)", val);
                goto done;
            }
        }
    file_fingerprint(tc->data, fp, sizeof fp);
    if (json_get_string(&st, "data_fingerprint", &saved, NULL) != 0 || strcmp(saved, fp) != 0) {
        fprintf(stderr, "error: --resume %s: the data file '%s' has changed since the checkpoint (size, time or contents)\n", dir, tc->data);
        goto done;
    }
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    StFile sf;
    if (st_open(&sf, path) != 0) goto done;
    const StTensor *tm = st_find(&sf, "exp_avg"), *tv = st_find(&sf, "exp_avg_sq");
    if (!tm || !tv || tm->numel != o->n || tv->numel != o->n || tm->dtype != ST_F32 || tv->dtype != ST_F32) {
        fprintf(stderr, "error: %s: expected F32 tensors exp_avg and exp_avg_sq of %zu elements\n", path, o->n);
        st_close(&sf); goto done;
    }
    rc = st_read_f32(&sf, tm, 0, o->n, o->m) | st_read_f32(&sf, tv, 0, o->n, o->v);
    st_close(&sf);
    ts->step = (int)v[0]; ts->opt_t = (int)v[1]; ts->data_epoch = (int)v[2]; ts->data_pos = (int)v[3]; ts->bad_in_row = (int)v[4];
    o->t = ts->opt_t;
done:
    json_free(&st);
    return rc;
}

// ----------------------------------------------------------------------------
// FLOPs, memory plan, merged export

// Model FLOPs of one sequence of T tokens, forward and backward (DESIGN section 9):
// a matmul with W (O, I) costs 2 O I per token forward; the backward costs the
// same again for dX, and again for dW when W trains. So full fine-tuning is
// 6 N T and LoRA 4 N T (plus its small adapters), N = the matmul parameters
// (the head included, the embedding lookup not). Causal attention adds
// 2 L NH hd T^2 forward (QK^T and PV over half the T x T scores) and twice
// that backward. Recomputed forwards (--chunk_memory recompute) are not counted.
static double flops_per_sequence(const Model *m, int T) {
    const Config *c = &m->config;
    double D = c->dim, H = c->hidden_dim, Q = (double)c->n_heads * c->head_dim, KV = (double)c->n_kv_heads * c->head_dim;
    double per_layer = D * Q * 2 + D * KV * 2 + 3 * D * H, N = c->n_layers * per_layer + (double)c->vocab_size * D;
    double lora = 0;
    if (m->use_lora) {
        int in[LORA_N_TARGETS], out[LORA_N_TARGETS];
        lora_shapes(c, in, out);
        for (int t = 0; t < LORA_N_TARGETS; t++)
            if (m->lora.targets & (1u << t)) lora += c->n_layers * (double)m->lora.r * (in[t] + out[t]);
    }
    double attn = 2.0 * c->n_layers * Q * (double)T * T;
    return (m->full_finetune ? 6 * N : 4 * N + 6 * lora) * T + 3 * attn;
}

// What training holds, known before it starts: printed as the memory plan
// (and alone with --dry_run). Per process; this trainer runs one rank.
static double memory_plan(const Model *m, const Optimizer *o, const Dataset *train, const Dataset *val, int print) {
    const double MiB = 1048576.0;
    double weights = m->num_params * 4.0, trainable = o->n * 4.0, grads = o->n * 4.0, moments = o->n * 8.0;
    if (m->full_finetune) trainable = 0; // the weights are the trainable parameters
    double data = 0;
    for (int i = 0; i < 2; i++) {
        const Dataset *d = i ? val : train;
        if (d && d->store) data += d->n_tokens * 5.0 + d->n_rows * 8.0; // tokens and label flags (mapped cache)
    }
    double total = weights + trainable + grads + moments + m->a.act_bytes + m->a.carry_bytes + data;
    if (print) {
        printf("memory plan (this process):\n");
        printf("  %-34s %10.1f MiB\n", "base weights (fp32)", weights / MiB);
        if (trainable) printf("  %-34s %10.1f MiB\n", "LoRA parameters", trainable / MiB);
        printf("  %-34s %10.1f MiB\n", "gradients", grads / MiB);
        printf("  %-34s %10.1f MiB\n", "AdamW moments", moments / MiB);
        printf("  %-34s %10.1f MiB   (chunks of %d, %s)\n", "activations and scratch", m->a.act_bytes / MiB,
               m->chunk_size, m->recompute ? "recompute" : "keep");
        printf("  %-34s %10.1f MiB\n", "KV and dKV carry", m->a.carry_bytes / MiB);
        printf("  %-34s %10.1f MiB\n", "tokenized data", data / MiB);
        printf("  %-34s %10.1f MiB\n", "total", total / MiB);
    }
    return total;
}

// base + LoRA as one Hugging Face model: W += scale * B @ A in every adapted layer
static int model_save_merged(Model *m, const char *dir, const char *model_dir, const char *tokpath) {
    Config *c = &m->config;
    LoRA *l = &m->lora;
    float *w[NUM_PARAM_TENSORS];
    param_tensors(&m->w, w);
    int map[LORA_N_TARGETS] = {P_WQ, P_WK, P_WV, P_WO, P_WGATE, P_WUP, P_WDOWN};
    size_t total = m->num_params;
    float *saved = (float *)mallocCheck(total * sizeof(float));
    memcpy(saved, m->params, total * sizeof(float));
    for (int i = 0; i < c->n_layers; i++)
        for (int t = 0; t < LORA_N_TARGETS; t++) {
            if (!(l->targets & (1u << t))) continue;
            // W (out, in) += scale * B (out, r) @ A (r, in), i.e. matmul_forward with inp = B, weight = A^T
            float *W = w[map[t]] + (size_t)i * l->out[t] * l->in[t], *At = (float *)mallocCheck((size_t)l->r * l->in[t] * sizeof(float));
            const float *A = lora_A(l, l->params, i, t);
            for (int r = 0; r < l->r; r++)
                for (int k = 0; k < l->in[t]; k++) At[(size_t)k * l->r + r] = A[(size_t)r * l->in[t] + k];
            matmul_forward(W, lora_B(l, l->params, i, t), At, l->out[t], l->r, l->in[t], l->scale, 1);
            free(At);
        }
    int rc = model_save_hf(m, dir, model_dir, tokpath);
    memcpy(m->params, saved, total * sizeof(float));
    free(saved);
    return rc;
}

// the start-up table: every option with its value, three to a line
static void print_config(TrainConfig *tc) {
    Option opts[] = OPTIONS(tc);
    int n = (int)(sizeof opts / sizeof opts[0]);
    char val[4096];
    printf("configuration:\n");
    for (int i = 0; i < n; i++) {
        option_value(&opts[i], val, sizeof val, 0);
        printf("  %-27s %-14.60s%s", opts[i].name, val[0] ? val : "-", i % 3 == 2 || i == n - 1 ? "\n" : "");
    }
}

// on resume the metrics file keeps only its records up to the checkpoint's step
// (a killed run may have logged steps after its last checkpoint)
static int metrics_truncate(const char *path, int step) {
    size_t len, kept = 0;
    char *text = read_file(path, &len);
    if (!text) return errno == ENOENT ? 0 : -1;
    for (size_t pos = 0; pos < len;) {
        char *nl = memchr(text + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - text) + 1 : len;
        JsonValue rec;
        long long s;
        char err[8];
        if (json_parse(text + pos, end - pos, &rec, err, sizeof err) == 0) {
            if (json_get_int(&rec, "step", &s) == 0 && s <= step) {
                memmove(text + kept, text + pos, end - pos);
                kept += end - pos;
            }
            json_free(&rec);
        }
        pos = end;
    }
    int rc = write_bytes_atomic(path, text, kept);
    free(text);
    return rc;
}

// ----------------------------------------------------------------------------
// the training loop

// a value for the metrics file: JSON has no NaN or infinity, so those are null
static const char *metrics_num(char *buf, size_t n, double v) {
    if (isfinite(v)) snprintf(buf, n, "%.9g", v);
    else snprintf(buf, n, "null");
    return buf;
}
static int metrics_error(const char *path) {
    fprintf(stderr, "error: --metrics_file '%s': writing failed: %s (the checkpoints are intact)\n", path, strerror(errno));
    return 1;
}

static void print_samples(Model *m, const TrainConfig *tc, const Tokenizer *tok, int step) {
    for (int i = 0; i < tc->sample_prompt.n; i++) {
        const char *p = tc->sample_prompt.v[i];
        int n, k;
        int *ids = tokenizer_encode(tok, p, strlen(p), 1, 0, &n);
        if (!ids) die("--sample_prompt: cannot tokenize '%s'", p);
        int *gen = generate(m, ids, n, tc->max_new_tokens, tc->temperature, tc->top_p, (uint64_t)tc->seed + i, tok->eos_id, &k);
        if (k > 0 && gen[k - 1] == tok->eos_id) k--;
        char *text = tokenizer_decode(tok, gen, k, NULL);
        printf("sample at step %d | %s|%s\n", step, p, text ? text : "");
        free(text); free(gen); free(ids);
    }
    fflush(stdout);
}

// One optimizer step: GA micro-batches, the loss normalised by the label count
// of the whole step, clipping, AdamW. Returns the mean loss.
// A NaN or infinite loss or gradient norm skips the update (*skipped = 1): the
// weights, the moments and AdamW's t stay as they were; the data moves on.
static double train_step(Model *m, Optimizer *opt, DataLoader *dl, const TrainConfig *tc, int step, int total,
                         int *tokens, int *targets, int *Ts, long *n_tokens, double *norm, float *lr, int *skipped) {
    int B = tc->batch_size, GA = tc->grad_accum, T = m->T;
    long labels = 0;
    *n_tokens = 0;
    for (int g = 0; g < GA; g++) { // the whole step's batches first: the loss is normalised by their label count
        dataloader_next_batch(dl, B, m->pad_id, tokens + (size_t)g * B * T, targets + (size_t)g * B * T, &Ts[g]);
        labels += dataloader_global_labels(dl);
        *n_tokens += dl->batch_tokens;
    }
    memset(opt->grads, 0, opt->n * sizeof(float));
    double loss = 0;
    float scale = labels ? 1.0f / (float)labels : 0.0f;
    for (int g = 0; g < GA; g++) {
        m->dropout_key = splitmix64(((uint64_t)tc->seed << 32) ^ ((uint64_t)step * GA + g));
        loss += model_forward_backward(m, tokens + (size_t)g * B * T, targets + (size_t)g * B * T, B, Ts[g], scale);
    }
    // the tests' injected faults (1-based steps, as printed): a NaN, or a finite gradient whose square overflows
    if (fault_at("nan", step + 1)) opt->grads[opt->n / 2] = NAN;
    if (fault_at("huge", step + 1)) opt->grads[opt->n / 2] = 1e30f;
    *norm = grad_norm(opt->grads, opt->n);
    *lr = lr_at(tc->lr_scheduler, tc->lr, step, tc->warmup_steps, total);
    loss = labels ? loss / labels : 0.0;
    *skipped = !isfinite(loss) || !isfinite(*norm);
    if (*skipped) return loss;
    clip_grads(opt->grads, opt->n, *norm, tc->grad_clip);
    adamw_update(opt, *lr, tc->beta1, tc->beta2, tc->eps, tc->weight_decay);
    return loss;
}

// trains and saves; returns the process exit code
static int train(TrainConfig *tc) {
#ifdef _OPENMP
    if (tc->threads > 0) omp_set_num_threads(tc->threads);
#endif
    if (mkdir_p(tc->output_dir) != 0) {
        fprintf(stderr, "error: cannot create --output_dir '%s': %s\n", tc->output_dir, strerror(errno));
        return 1;
    }
    print_config(tc);
    char tokpath[4096], resume_dir[PATH_MAX];
    if (tc->resume[0] && (checkpoint_resolve(tc->resume, resume_dir, sizeof resume_dir) != 0 || checkpoint_verify(resume_dir) != 0)) return 1;
    if (tc->tokenizer[0]) snprintf(tokpath, sizeof tokpath, "%s", tc->tokenizer);
    else snprintf(tokpath, sizeof tokpath, "%s/tokenizer.model", tc->model);
    Tokenizer tok;
    if (tokenizer_load(&tok, tokpath) != 0) return 1;
    Dataset all_ds, train_ds, val_ds;
    int have_val = tc->val_data[0] || tc->val_split > 0;
    DataOptions dopt = {tc->data_format, tc->train_on_prompt, !strcmp(tc->batching, "packing"), tc->max_seq_len,
                        tc->max_samples, tc->data_slice, tc->data_cache_dir, 0};
    if (dataset_load(&all_ds, tc->data, &tok, tokpath, &dopt) != 0) return 1;
    if (tc->val_split > 0) {
        if (dataset_split(&all_ds, tc->val_split, (uint64_t)tc->seed, &train_ds, &val_ds) != 0) return 1;
    } else {
        train_ds = all_ds; // no split: the training set is the whole file
        memset(&all_ds, 0, sizeof all_ds);
        DataOptions vopt = dopt; // a separate validation file takes all its samples
        vopt.max_samples = 0; vopt.slice = "";
        if (tc->val_data[0] && dataset_load(&val_ds, tc->val_data, &tok, tokpath, &vopt) != 0) return 1;
    }
    int B = tc->batch_size, GA = tc->grad_accum, T = dataset_max_len(&train_ds);
    if (have_val && dataset_max_len(&val_ds) > T) T = dataset_max_len(&val_ds);
    int sample_len = 0; // room for the samples' prompts and continuations
    for (int i = 0; i < tc->sample_prompt.n; i++) {
        int n = (int)strlen(tc->sample_prompt.v[i]) + 1 + tc->max_new_tokens; // a token has at least one byte
        sample_len = n > sample_len ? n : sample_len;
    }
    if (sample_len > T) T = sample_len < tc->max_seq_len ? sample_len : tc->max_seq_len;

    Model m;
    if (model_setup(&m, tc, B, T, tc->resume[0] ? resume_dir : NULL) != 0) return 1;
    if (tok.vocab_size > m.config.vocab_size) {
        fprintf(stderr, "error: %s has %d pieces but the model's vocab_size is %d\n", tokpath, tok.vocab_size, m.config.vocab_size);
        return 1;
    }
    m.pad_id = tok.eos_id;
    Optimizer opt;
    optimizer_init(&opt, &m);
    TrainState ts = {0};
    if (tc->resume[0] && load_checkpoint(tc, resume_dir, &opt, &ts) != 0) return 1;
    long rows_per_step = (long)B * GA;
    int total = tc->max_steps >= 0 ? tc->max_steps : (int)((tc->num_epochs * (long)train_ds.n_rows + rows_per_step - 1) / rows_per_step);
    printf("model %s: %d layers, dim %d, %d heads (%d kv), vocab %d, %.2fM parameters\n", tc->model, m.config.n_layers,
           m.config.dim, m.config.n_heads, m.config.n_kv_heads, m.config.vocab_size, m.num_params / 1e6);
    printf("training %s: %zu trainable parameters, %ld rows, %d steps of %d x %d rows, T <= %d\n",
           m.use_lora ? "LoRA" : "all weights", opt.n, train_ds.n_rows, total, GA, B, T);
    double act_mb = m.a.act_bytes / 1048576.0, carry_mb = m.a.carry_bytes / 1048576.0;
    memory_plan(&m, &opt, &train_ds, have_val ? &val_ds : NULL, 1);
    if (tc->dry_run) {
        optimizer_free(&opt);
        model_free(&m);
        dataset_free(&train_ds);
        if (have_val) dataset_free(&val_ds);
        dataset_free(&all_ds);
        tokenizer_free(&tok);
        return 0;
    }
    if (tc->resume[0]) printf("resumed from %s at step %d\n", resume_dir, ts.step);

    FILE *metrics = NULL;
    if (tc->metrics_file[0] && tc->resume[0] && metrics_truncate(tc->metrics_file, ts.step) != 0) {
        fprintf(stderr, "error: cannot rewrite --metrics_file '%s': %s\n", tc->metrics_file, strerror(errno));
        return 1;
    }
    if (tc->metrics_file[0]) metrics = fopenCheck(tc->metrics_file, tc->resume[0] ? "a" : "w");
    DataLoader dl;
    dataloader_init(&dl, &train_ds, tc->shuffle, (uint64_t)tc->seed, 0, 1);
    if (ts.data_pos > train_ds.n_rows) { fprintf(stderr, "error: --resume %s: data position %d is past the %ld rows\n", resume_dir, ts.data_pos, train_ds.n_rows); return 1; }
    dataloader_seek(&dl, ts.data_epoch, ts.data_pos);
    int *tokens = (int *)mallocCheck((size_t)GA * B * T * sizeof(int)), *targets = (int *)mallocCheck((size_t)GA * B * T * sizeof(int));
    int *Ts = (int *)mallocCheck(GA * sizeof(int));
    signal(SIGINT, on_stop_signal);
    signal(SIGTERM, on_stop_signal);
    if (ts.step == 0) print_samples(&m, tc, &tok, 0);
    int rc = 0, first_step = ts.step;
    double run_ms = 0;
    while (ts.step < total && !stop_requested) {
        double t0 = now_ms(), norm;
        long n_tokens;
        float lr;
        int skipped;
        double loss = train_step(&m, &opt, &dl, tc, ts.step, total, tokens, targets, Ts, &n_tokens, &norm, &lr, &skipped);
        double ms = now_ms() - t0, flops = 0;
        for (int g = 0; g < GA; g++) flops += B * flops_per_sequence(&m, Ts[g]);
        double tflops = flops / (ms * 1e9), mfu = tc->peak_tflops > 0 ? tflops / tc->peak_tflops : -1;
        run_ms += ms;
        ts.step++;
        ts.opt_t = opt.t; ts.data_epoch = (int)dl.epoch; ts.data_pos = (int)dl.pos;
        ts.bad_in_row = skipped ? ts.bad_in_row + 1 : 0;
        double eta_s = run_ms / (ts.step - first_step) * (total - ts.step) / 1e3;
        printf("step %d/%d | loss %.6f | lr %.3e | grad norm %.4f | %.1f ms | %.0f tok/s | %.3f TFLOP/s", ts.step, total,
               loss, lr, norm, ms, n_tokens / (ms / 1e3), tflops);
        if (mfu >= 0) printf(" | MFU %.1f%%", 100 * mfu);
        if (skipped) printf(" | skipped: NaN or inf loss or grad norm (%d skipped so far)", ts.step - ts.opt_t);
        printf(" | ETA %dm%02ds\n", (int)(eta_s / 60), (int)eta_s % 60);
        if (metrics) {
            char lb[32], nb[32];
            fprintf(metrics, "{\"step\": %d, \"loss\": %s, \"lr\": %.9g, \"grad_norm\": %s, \"tokens\": %ld, \"skipped\": %d, "
                    "\"skipped_total\": %d, \"ms\": %.3f, \"tok_per_s\": %.3f, \"tflops\": %.6g, ", ts.step,
                    metrics_num(lb, sizeof lb, loss), lr, metrics_num(nb, sizeof nb, norm), n_tokens, skipped, ts.step - ts.opt_t, ms,
                    n_tokens / (ms / 1e3), tflops);
            if (mfu >= 0) fprintf(metrics, "\"mfu\": %.6g, ", mfu);
            fprintf(metrics, "\"mem_mb\": %.1f, \"act_mb\": %.3f, \"carry_mb\": %.3f}\n", peak_rss_mb(), act_mb, carry_mb);
            if (fflush(metrics) != 0 || ferror(metrics)) { rc = metrics_error(tc->metrics_file); break; }
        }
        fault_point("step", ts.step);
        if (ts.bad_in_row >= tc->max_bad_steps) { // nothing is saved: the checkpoints so far stay the last good ones
            fprintf(stderr, "error: %d steps in a row (up to step %d) had a NaN or infinite loss or gradient norm (--max_bad_steps %d); "
                    "stopping without saving. Likely causes: a learning rate too high (lower --lr, more --warmup_steps, keep "
                    "--grad_clip on), overflow in low precision (fp16/bf16), or bad data (a sample with a huge loss). The "
                    "checkpoints in %s are intact: fix the cause and --resume from there.\n", ts.bad_in_row, ts.step,
                    tc->max_bad_steps, tc->output_dir);
            rc = 1;
            break;
        }
        if (have_val && tc->eval_every > 0 && ts.step % tc->eval_every == 0 && ts.step < total)
            report_eval(&m, &val_ds, B, m.pad_id, ts.step, metrics);
        if (tc->sample_every > 0 && ts.step % tc->sample_every == 0 && ts.step < total) print_samples(&m, tc, &tok, ts.step);
        int last = ts.step == total || stop_requested;
        if ((tc->save_every > 0 && ts.step % tc->save_every == 0) || last) {
            if (save_checkpoint(tc, &m, &opt, &ts, tokpath) != 0) { rc = 1; break; }
            printf("saved checkpoint %s/checkpoint-%d\n", tc->output_dir, ts.step);
        }
    }
    if (stop_requested && rc == 0) printf("stopped by a signal after step %d; continue with --resume %s\n", ts.step, tc->output_dir);
    if (!stop_requested && rc == 0) {
        if (have_val) report_eval(&m, &val_ds, B, m.pad_id, total, metrics); // also with --max_steps 0: evaluates the start
        print_samples(&m, tc, &tok, ts.step);
        printf("peak memory %.1f MiB (activations %.1f MiB, carry %.1f MiB)\n", peak_rss_mb(), act_mb, carry_mb);
        if (m.use_lora) {
            rc = lora_save_peft(&m.lora, tc->output_dir, tc->model);
            if (rc == 0) printf("saved the PEFT adapter to %s/\n", tc->output_dir);
            char merged[PATH_MAX + 16];
            snprintf(merged, sizeof merged, "%s/merged", tc->output_dir);
            if (rc == 0 && tc->merge_adapter) {
                rc = model_save_merged(&m, merged, tc->model, tokpath);
                if (rc == 0) printf("saved the model with the adapter merged in to %s/\n", merged);
            }
        } else {
            rc = model_save_hf(&m, tc->output_dir, tc->model, tokpath);
            if (rc == 0) printf("saved the model to %s/\n", tc->output_dir);
        }
    }
    if (metrics) {
        int bad = ferror(metrics);
        if ((fclose(metrics) != 0 || bad) && rc == 0) rc = metrics_error(tc->metrics_file);
    }
    free(tokens); free(targets); free(Ts);
    optimizer_free(&opt);
    dataloader_free(&dl);
    model_free(&m);
    dataset_free(&train_ds);
    if (have_val) dataset_free(&val_ds);
    dataset_free(&all_ds);
    tokenizer_free(&tok);
    return rc ? 1 : 0;
}

#ifndef TESTING
int main(int argc, char **argv) {
    // no --model and no --data: the built-in default run (default_model.h), the
    // user's own options after its defaults so that they win
    int given = 0;
    for (int i = 1; i < argc; i++)
        given |= !strncmp(argv[i], "--model", 7) || !strncmp(argv[i], "--data", 6) || !strcmp(argv[i], "--help") || !strcmp(argv[i], "-h");
    char model_dir[4096], data_path[4096];
    int n_def = (int)(sizeof default_run_args / sizeof default_run_args[0]);
    char **args = argv;
    if (!given) {
        if (default_setup(DEFAULT_RUN_DIR, model_dir, sizeof model_dir, data_path, sizeof data_path) != 0) return 1;
        printf("no --model or --data: the built-in default run (a small model and data generated in %s/; delete it to regenerate)\n", DEFAULT_RUN_DIR);
        args = (char **)mallocCheck((size_t)(argc + n_def + 5) * sizeof(char *));
        int n = 0;
        args[n++] = argv[0];
        for (int i = 0; i < n_def; i++) args[n++] = (char *)default_run_args[i];
        args[n++] = "--model"; args[n++] = model_dir; args[n++] = "--data"; args[n++] = data_path;
        for (int i = 1; i < argc; i++) args[n++] = argv[i];
        argc = n;
    }
    TrainConfig tc;
    int rc = parse_args(&tc, argc, args);
    if (rc != 0) return rc > 0 ? 0 : 2;
    return train(&tc);
}
#endif
