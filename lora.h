// LoRA adapters in peft's semantics and file format.
//
//   y = W x + scale * B (A dropout(x)),   A: (r, in), B: (out, r),
//   scale = alpha / r   (alpha / sqrt(r) with use_rslora, as peft does)
//
// DoRA (use_dora, peft's DoraLinearLayer) adds a magnitude m (out) per module and
// rescales each output of the adapted layer by s = m / ||W + scale B A||, the norm
// over each row (the input dimension). As peft computes it:
//
//   y = W x + (s - 1) W xd + s scale B A xd,   xd = dropout(x)
//
// which is s (W x + scale B A x) without dropout. The norm counts as a constant
// (peft detaches it, as the DoRA paper's section 4.3 says): no gradient flows
// through it. m starts at the norm itself, so training starts at the base model.
//
// IA3 (peft's IA3Config, peft_method ia3) is the other adapter kept here: one learned
// vector per adapted module, starting at 1. A feedforward module's vector (in) scales
// its input, y = W (l * x); any other module's (out) scales its output, y = l * (W x)
// (k_proj, v_proj: before RoPE). It reuses LoRA's layout (one flat buffer, a vector where
// A would start) and files' code; r is 0, so LoRA's activations take no room. Its
// forward and backward are peft/ia3.h's (the GPU's peft/ia3.cuh).
//
// llama_adapter (peft's AdaptionPromptConfig, peft_method llama_adapter) is kept here
// too: each of the top adapter_layers decoder layers learns a prompt P (adapter_len, D)
// and a gate g (starting at 0). peft/adaption_prompt.h has the maths; here are only its
// place in the flat buffer (P, then g, where layer l's q_proj's A would be) and files.
//
// prefix (peft's PrefixTuningConfig without prefix_projection, peft_method prefix) too:
// num_virtual_tokens positions of learned keys and values for every layer, ahead of the
// sequence in the KV carry (the trainers put them there; docs/lora.md). Its one tensor is
// peft's prompt_embeddings (P, n_layers * 2 * NKV*hd), kept whole where layer 0's q_proj's
// A would be: row j holds layer 0's key, layer 0's value, layer 1's key, ... of position j.
//
// A starts kaiming-uniform with a = sqrt(5), i.e. uniform in +-1/sqrt(in), and
// B at zero, so training starts exactly at the base model. All adapter tensors
// live in one flat buffer (params, grads), so the optimizer, the gradient norm
// and the checkpoint code treat LoRA and full fine-tuning alike.
//
// The forward and backward pieces here are the CPU's (their GPU twins, with the
// same names, are in lora.cuh, so nvcc leaves these out); they call
// matmul_forward / matmul_backward (support/matmul.h).
#ifndef LORA_H
#define LORA_H
#include <math.h>
#include <float.h>
#include <stdint.h>
#include <sys/stat.h>
#include "support/utils.h"
#include "support/json.h"
#include "support/safetensors.h"
#include "chunk.h" // Chunk, and the KV carry's layout

// peft's module names, in the order they appear in a decoder layer
enum { LORA_Q, LORA_K, LORA_V, LORA_O, LORA_GATE, LORA_UP, LORA_DOWN, LORA_N_TARGETS };
static const char *lora_target_names[LORA_N_TARGETS] = {
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
static const char *lora_target_parents[LORA_N_TARGETS] = {
    "self_attn", "self_attn", "self_attn", "self_attn", "mlp", "mlp", "mlp"};

typedef struct {
    int r;
    float alpha, dropout, scale;
    int use_rslora;
    int use_dora;                   // each module also has a magnitude m (out) after its B
    int ia3;                        // IA3 instead of LoRA: one vector per module (r = 0, no dropout)
    unsigned feedforward;           // IA3, bit t set: module t's vector (in) scales its input, else (out) its output
    int adapter_len, adapter_layers; // llama_adapter (adapter_len > 0): prompt rows, and how many layers
                                    // from the top have one (targets is 0: no linear layer is adapted)
    int prefix;                     // prefix tuning (> 0): num_virtual_tokens (targets is 0 too)
    int kv_heads;                   // prefix: the model's KV heads, for adapter_config.json (the loader sets it)
    unsigned char *mag_unset;       // (n_layers, LORA_N_TARGETS) DoRA: m still to be set to the norm (dora_norm)
    int training;                   // dropout applies only while training (not in evaluation)
    unsigned targets;               // bit t set: module t is adapted
    int n_layers;
    int in[LORA_N_TARGETS], out[LORA_N_TARGETS]; // Linear shapes, set from the model
    size_t *offset;                 // (n_layers, LORA_N_TARGETS): start of A; B follows A
    unsigned saved;                 // --trainable_params: LORA_SAVE_* bits of base tensors that train whole
    int vocab, dim, tied;           // their shapes (tied: the embedding is the head too)
    size_t saved_offset;            // where they start in the flat buffers, after the adapter
    float *params, *grads;          // flat, num_params each
    size_t num_params;
} LoRA;

// --trainable_params (LongLoRA's embed,norm): base tensors that train whole, in fp32, beside
// the adapter, as peft's modules_to_save. They sit at the end of the flat buffers, so the
// optimizer, the gradient norm and checkpoints treat them as adapter parameters; the
// forward reads them there instead of the base's copies.
enum { LORA_SAVE_EMBED = 1, LORA_SAVE_NORM = 2 };

// "q_proj,v_proj" or "all-linear" (every linear of the decoder layers; peft's
// all-linear also leaves out lm_head) -> bit mask. 0 ok, -1 on an unknown name
// (the message names option, where the list came from).
static int lora_parse_targets(const char *s, const char *option, unsigned *mask) {
    *mask = 0;
    if (strcmp(s, "all-linear") == 0) { *mask = (1u << LORA_N_TARGETS) - 1; return 0; }
    const char *p = s;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        int found = -1;
        for (int t = 0; t < LORA_N_TARGETS; t++)
            if (strlen(lora_target_names[t]) == n && strncmp(p, lora_target_names[t], n) == 0) found = t;
        if (found < 0) {
            fprintf(stderr, "error: %s: unknown module '%.*s' (known: q_proj,k_proj,"
                    "v_proj,o_proj,gate_proj,up_proj,down_proj or all-linear)\n", option, (int)n, p);
            return -1;
        }
        *mask |= 1u << found;
        p += n;
        if (*p == ',') p++;
    }
    if (!*mask) fprintf(stderr, "error: %s: no module named (known: q_proj,k_proj,v_proj,o_proj,"
                        "gate_proj,up_proj,down_proj or all-linear)\n", option);
    return *mask ? 0 : -1;
}

static inline int ia3_feedforward(const LoRA *l, int t) { return (l->feedforward >> t) & 1; }

// llama_adapter's longest prompt: the GPU keeps a query head's probabilities over it in shared memory
#define ADAPTER_MAX_LEN 1024

// layer's module t has trained parameters: LoRA's and IA3's targets; llama_adapter's prompt
// and gate count as module 0's (q_proj's slot) of its top adapter_layers layers
static inline int adapter_has_prompt(const LoRA *l, int layer) { return l->adapter_len && layer >= l->n_layers - l->adapter_layers; }
static inline int lora_trains(const LoRA *l, int layer, int t) {
    if (l->prefix) return layer == 0 && t == 0; // (the whole prompt_embeddings, in one place)
    return l->adapter_len ? t == 0 && adapter_has_prompt(l, layer) : (l->targets >> t) & 1;
}

// prefix tuning's most virtual tokens (the carry grows by them; peft sets no bound)
#define PREFIX_MAX_TOKENS 65536
// prefix: one virtual position's row of prompt_embeddings, every layer's key and value
static inline size_t prefix_row(const LoRA *l) { return (size_t)l->n_layers * 2 * l->out[LORA_K]; }

// an adapted module's parameters: llama_adapter's prompt and gate, IA3's vector, or LoRA's
// A, B (and DoRA's m)
static size_t lora_module_numel(const LoRA *l, int t) {
    if (l->adapter_len) return (size_t)l->adapter_len * l->in[LORA_Q] + 1;
    if (l->prefix) return (size_t)l->prefix * prefix_row(l);
    if (l->ia3) return (size_t)(ia3_feedforward(l, t) ? l->in[t] : l->out[t]);
    return (size_t)l->r * (l->in[t] + l->out[t]) + (l->use_dora ? l->out[t] : 0);
}

// lays out the flat buffers of the adapter l's settings describe, for the given shapes;
// weights are left to the caller
static void lora_layout(LoRA *l, int n_layers, const int in[LORA_N_TARGETS], const int out[LORA_N_TARGETS]) {
    l->n_layers = n_layers; l->training = 1;
    l->offset = (size_t *)mallocCheck((size_t)n_layers * LORA_N_TARGETS * sizeof(size_t));
    size_t n = 0;
    for (int t = 0; t < LORA_N_TARGETS; t++) { l->in[t] = in[t]; l->out[t] = out[t]; }
    for (int i = 0; i < n_layers; i++)
        for (int t = 0; t < LORA_N_TARGETS; t++) {
            l->offset[i * LORA_N_TARGETS + t] = n;
            if (lora_trains(l, i, t)) n += lora_module_numel(l, t);
        }
    l->num_params = n;
    l->mag_unset = (unsigned char *)callocCheck((size_t)n_layers * LORA_N_TARGETS, 1);
    l->params = (float *)callocCheck(n, sizeof(float));
    l->grads = (float *)callocCheck(n, sizeof(float));
}

// a LoRA (with use_dora DoRA) adapter of rank r on the modules in targets; its weights are
// left to the caller (lora_init, or a file's)
static void lora_alloc(LoRA *l, int n_layers, const int in[LORA_N_TARGETS], const int out[LORA_N_TARGETS],
                       int r, float alpha, float dropout, int use_rslora, int use_dora, unsigned targets) {
    memset(l, 0, sizeof *l);
    l->r = r; l->alpha = alpha; l->dropout = dropout; l->use_rslora = use_rslora; l->use_dora = use_dora;
    l->scale = use_rslora ? alpha / sqrtf((float)r) : alpha / (float)r;
    l->targets = targets;
    lora_layout(l, n_layers, in, out);
}

// IA3's vectors for the modules in targets, those in feedforward (a subset) scaling their
// input, all at peft's init, 1
static void ia3_alloc(LoRA *l, int n_layers, const int in[LORA_N_TARGETS], const int out[LORA_N_TARGETS],
                      unsigned targets, unsigned feedforward) {
    memset(l, 0, sizeof *l);
    l->ia3 = 1; l->targets = targets; l->feedforward = feedforward;
    lora_layout(l, n_layers, in, out);
    for (size_t i = 0; i < l->num_params; i++) l->params[i] = 1.0f;
}

// the adapter's kind as --peft_method names it
static const char *lora_method(const LoRA *l) {
    return l->adapter_len ? "llama_adapter" : l->prefix ? "prefix" : l->ia3 ? "ia3" : "lora";
}

static void lora_free(LoRA *l) { free(l->offset); free(l->mag_unset); free(l->params); free(l->grads); }

// "embed,norm" -> LORA_SAVE_* bits ("" none). 0 ok, -1 with a message naming what.
static int lora_parse_saved(const char *s, unsigned *mask, const char *what) {
    *mask = 0;
    for (const char *p = s; *p;) {
        size_t n = strcspn(p, ",");
        if (n == 5 && !strncmp(p, "embed", 5)) *mask |= LORA_SAVE_EMBED;
        else if (n == 4 && !strncmp(p, "norm", 4)) *mask |= LORA_SAVE_NORM;
        else {
            fprintf(stderr, "error: %s: unknown '%.*s' (known: embed, norm)\n", what, (int)n, p);
            return -1;
        }
        p += n + (p[n] == ',');
    }
    return 0;
}

// The saved tensors (peft's modules_to_save), k = 0 .. lora_n_saved - 1: 0 the embedding (vocab, dim),
// 1 + 2 i + j layer i's input (j 0) or post-attention (j 1) norm, 1 + 2 n_layers the final norm.
static int lora_n_saved(const LoRA *l) { return 2 + 2 * l->n_layers; }
// saved tensor k's peft key
static void lora_saved_key(int n_layers, int k, char *key, size_t n) {
    if (k == 0) snprintf(key, n, "base_model.model.model.embed_tokens.weight");
    else if (k == 1 + 2 * n_layers) snprintf(key, n, "base_model.model.model.norm.weight");
    else snprintf(key, n, "base_model.model.model.layers.%d.%s.weight", (k - 1) / 2,
                  (k - 1) % 2 ? "post_attention_layernorm" : "input_layernorm");
}
// peft saves a tied head it keeps tied (ensure_weight_tying) under its own key as well
#define LORA_TIED_HEAD_KEY "base_model.model.lm_head.weight"
// where saved tensor k starts in the flat buffers, -1 when it does not train (or k < 0; the CUDA trainer
// reads it in its bf16 copy of them too)
static int64_t lora_saved_at(const LoRA *l, int k) {
    int embed = k == 0;
    if (k < 0 || !(l->saved & (embed ? LORA_SAVE_EMBED : LORA_SAVE_NORM))) return -1;
    size_t embed_n = l->saved & LORA_SAVE_EMBED ? (size_t)l->vocab * l->dim : 0;
    return (int64_t)(l->saved_offset + (embed ? 0 : embed_n + (size_t)(k - 1) * l->dim));
}
// saved tensor k in base (params or grads), NULL when it does not train (or k < 0); its size into numel when given
static float *lora_saved(const LoRA *l, float *base, int k, int64_t *numel) {
    int64_t at = lora_saved_at(l, k);
    if (at < 0) return NULL;
    if (numel) *numel = k == 0 ? (int64_t)l->vocab * l->dim : l->dim;
    return base + at;
}
// where the forward reads a norm (layer n_layers: the final one) or the embedding: the trained copy, else w
static inline float *lora_norm_or(const LoRA *l, int layer, int j, float *w) {
    float *p = l->saved ? lora_saved(l, l->params, 1 + 2 * layer + j, NULL) : NULL;
    return p ? p : w;
}
static inline float *lora_embed_or(const LoRA *l, float *w) {
    float *p = l->saved ? lora_saved(l, l->params, 0, NULL) : NULL;
    return p ? p : w;
}

// grows the flat buffers by the saved tensors (zeros: model_saved_copy or a file fills them);
// a dry run (alloc 0) only counts them: its plan needs their size, not them
static void lora_add_saved(LoRA *l, unsigned saved, int vocab, int dim, int tied, int alloc) {
    l->saved = saved; l->vocab = vocab; l->dim = dim; l->tied = tied;
    l->saved_offset = l->num_params;
    size_t n = (saved & LORA_SAVE_EMBED ? (size_t)vocab * dim : 0) + (saved & LORA_SAVE_NORM ? (2 * (size_t)l->n_layers + 1) * dim : 0);
    l->num_params += n;
    if (!alloc) return;
    l->params = (float *)reallocCheck(l->params, l->num_params * sizeof(float));
    l->grads = (float *)reallocCheck(l->grads, l->num_params * sizeof(float));
    memset(l->params + l->saved_offset, 0, n * sizeof(float));
    memset(l->grads, 0, l->num_params * sizeof(float));
}

static inline float *lora_A(const LoRA *l, float *base, int layer, int t) { return base + l->offset[layer * LORA_N_TARGETS + t]; }
static inline float *lora_B(const LoRA *l, float *base, int layer, int t) { return lora_A(l, base, layer, t) + (size_t)l->r * l->in[t]; }
// IA3's vector (in for a feedforward module, else out), where A would be
static inline float *ia3_vector(const LoRA *l, float *base, int layer, int t) { return lora_A(l, base, layer, t); }
// llama_adapter's prompt (adapter_len, D) of a layer that has one, and its gate (1) after it
static inline float *adapter_prompt(const LoRA *l, float *base, int layer) { return lora_A(l, base, layer, LORA_Q); }
static inline float *adapter_gate(const LoRA *l, float *base, int layer) {
    return adapter_prompt(l, base, layer) + (size_t)l->adapter_len * l->in[LORA_Q];
}

// llama_adapter's prompts (adapter_len, D) for the top adapter_layers layers, drawn N(0, 1)
// from seed as peft draws them (not its stream), and their gates at peft's init, 0
static void adapter_alloc(LoRA *l, int n_layers, const int in[LORA_N_TARGETS], const int out[LORA_N_TARGETS],
                          int adapter_len, int adapter_layers, uint64_t seed) {
    memset(l, 0, sizeof *l);
    l->adapter_len = adapter_len; l->adapter_layers = adapter_layers;
    lora_layout(l, n_layers, in, out);
    uint64_t key = splitmix64(seed ^ 0x41646170ull);
    for (size_t i = 0; i < l->num_params; i++) l->params[i] = hash_normal(key, i);
    for (int i = n_layers - adapter_layers; i < n_layers; i++) *adapter_gate(l, l->params, i) = 0.0f;
}

// prefix tuning's prompt_embeddings for num_virtual_tokens positions, drawn N(0, 1) from
// seed as peft draws them (nn.Embedding's init; not its stream)
static void prefix_alloc(LoRA *l, int n_layers, const int in[LORA_N_TARGETS], const int out[LORA_N_TARGETS],
                         int num_virtual_tokens, uint64_t seed) {
    memset(l, 0, sizeof *l);
    l->prefix = num_virtual_tokens;
    lora_layout(l, n_layers, in, out);
    uint64_t key = splitmix64(seed ^ 0x50726566ull);
    for (size_t i = 0; i < l->num_params; i++) l->params[i] = hash_normal(key, i);
}

// DoRA's magnitude m (out), after B
static inline float *lora_mag(const LoRA *l, float *base, int layer, int t) { return lora_B(l, base, layer, t) + (size_t)l->out[t] * l->r; }
// DoRA: where module t of a layer keeps its row norms in a buffer of (n_layers, LORA_N_TARGETS, widest out)
static inline size_t dora_norm_index(const LoRA *l, int layer, int t) {
    int widest = 0;
    for (int k = 0; k < LORA_N_TARGETS; k++) widest = l->out[k] > widest ? l->out[k] : widest;
    return ((size_t)layer * LORA_N_TARGETS + t) * widest;
}

// peft's default init: A ~ kaiming_uniform(a=sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in)), B = 0.
// DoRA's m is the norm of the weights' rows, which only the layer's forward sees whole
// (sharded, they are gathered there): it is set there, the first time (mag_unset).
static void lora_init(LoRA *l, uint64_t seed) {
    uint64_t state = splitmix64(seed ^ 0x4C6F5241ull);
    memset(l->params, 0, l->num_params * sizeof(float));
    memset(l->mag_unset, l->use_dora, (size_t)l->n_layers * LORA_N_TARGETS);
    for (int i = 0; i < l->n_layers; i++)
        for (int t = 0; t < LORA_N_TARGETS; t++) {
            if (!(l->targets & (1u << t))) continue;
            float *A = lora_A(l, l->params, i, t);
            float bound = 1.0f / sqrtf((float)l->in[t]);
            for (size_t k = 0; k < (size_t)l->r * l->in[t]; k++) A[k] = (2.0f * rng_uniform(&state) - 1.0f) * bound;
        }
}

// the dropout mask's key for one module of one layer, from the micro-batch's key
static uint64_t lora_dropout_key(uint64_t key, int layer, int t) { return splitmix64(key ^ (uint64_t)(layer * LORA_N_TARGETS + t + 1)); }

// The chunk as the dropout masks see it. Masks are drawn per position of the
// global micro-batch (every rank's rows), so that any number of ranks drops what
// one process would: this rank's rows start at row row0 of it (the rows of the
// ranks before it come first), row0 * T positions further on.
static Chunk lora_dropout_chunk(const Chunk *ch, int row0) {
    Chunk d = *ch;
    d.t0 += row0 * ch->T;
    return d;
}
// the trainers' chunk ch of rows r (chunk.h), as the dropout masks see it: its rows are context
// parallelism's before their padding, so that any layout drops what one process drops
static Chunk dropout_chunk(const Rows *r, const Chunk *ch, int row0) {
    Chunk d = *ch;
    if (r->P > 1) d.T = r->T_real;
    return lora_dropout_chunk(&d, row0);
}

#ifndef __CUDACC__ // the CPU's pieces; lora.cuh has the GPU's
#include "support/matmul.h"
// dropout as torch's nn.Dropout: zero with probability p, scale survivors by 1/(1-p).
// The mask is a hash of (key, absolute position, feature), so forward and backward
// regenerate it instead of storing it, it is the same for any number of threads,
// and a chunked run drops exactly what a whole-sequence run drops.
static void lora_dropout(const LoRA *l, float *out, const float *inp, int in, const Chunk *ch, uint64_t key) {
    float keep_scale = 1.0f / (1.0f - l->dropout);
    int N = ch->B * ch->len;
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        uint64_t pos = (uint64_t)(n / ch->len) * ch->T + ch->t0 + n % ch->len;
        for (int j = 0; j < in; j++) {
            size_t i = (size_t)n * in + j;
            out[i] = hash_uniform(key, pos * in + j) < l->dropout ? 0.0f : inp[i] * keep_scale;
        }
    }
}

// out (N, out) += scale * (dropout(inp) (N, in) @ A^T) @ B^T with N = B * len rows;
// h (N, r) is kept for the backward. xdrop is scratch of N * in floats, used only when dropout > 0.
static void lora_forward(const LoRA *l, int layer, int t, float *out, const float *inp, float *h,
                         float *xdrop, const Chunk *ch, uint64_t key) {
    const float *x = inp;
    int N = ch->B * ch->len;
    if (l->training && l->dropout > 0.0f) { lora_dropout(l, xdrop, inp, l->in[t], ch, lora_dropout_key(key, layer, t)); x = xdrop; }
    matmul_forward(h, x, lora_A(l, l->params, layer, t), N, l->in[t], l->r, 1.0f, 0);
    matmul_forward(out, h, lora_B(l, l->params, layer, t), N, l->r, l->out[t], l->scale, 1);
}

// given dout (N, out): dB += scale dout^T h, dA += dh^T dropout(x) with dh = scale dout B,
// and dinp (N, in) += dropout'(dh A) (dinp NULL: not needed). dh is scratch (N, r); xdrop as
// in the forward.
static void lora_backward(LoRA *l, int layer, int t, float *dinp, const float *dout, const float *inp,
                          const float *h, float *dh, float *xdrop, const Chunk *ch, uint64_t key) {
    int in = l->in[t], r = l->r, N = ch->B * ch->len;
    memset(dh, 0, (size_t)N * r * sizeof(float));
    // dh = scale * dout @ B and dB += scale * dout^T @ h
    matmul_backward(dh, lora_B(l, l->grads, layer, t), dout, h, lora_B(l, l->params, layer, t), N, r, l->out[t], l->scale);
    uint64_t dkey = lora_dropout_key(key, layer, t);
    if (l->dropout == 0.0f) {
        matmul_backward(dinp, lora_A(l, l->grads, layer, t), dh, inp, lora_A(l, l->params, layer, t), N, in, r, 1.0f);
        return;
    }
    // with dropout the input gradient passes through the same mask: compute dx_drop, then mask it in
    if (dinp) {
        memset(xdrop, 0, (size_t)N * in * sizeof(float));
        matmul_backward(xdrop, NULL, dh, NULL, lora_A(l, l->params, layer, t), N, in, r, 1.0f);
        lora_dropout(l, xdrop, xdrop, in, ch, dkey);
        #pragma omp parallel for
        for (size_t i = 0; i < (size_t)N * in; i++) dinp[i] += xdrop[i];
    }
    // dA += dh^T @ dropout(x): regenerate the dropped input once more (xdrop now holds dx)
    lora_dropout(l, xdrop, inp, in, ch, dkey);
    matmul_backward(NULL, lora_A(l, l->grads, layer, t), dh, xdrop, NULL, N, in, r, 1.0f);
}

// DoRA's row norms: norm (out) = ||W + scale B A|| over each row of it, w (out, in) the
// base weight. The first time (mag_unset), m = norm, as peft sets it when it adds the adapter.
static void dora_norm(LoRA *l, int layer, int t, float *norm, const float *w) {
    const float *A = lora_A(l, l->params, layer, t), *B = lora_B(l, l->params, layer, t);
    int in = l->in[t], r = l->r;
    #pragma omp parallel for
    for (int o = 0; o < l->out[t]; o++) {
        double sum = 0;
        for (int i = 0; i < in; i++) {
            float ba = 0.0f; // (B A)[o, i]
            for (int k = 0; k < r; k++) ba += B[(size_t)o * r + k] * A[(size_t)k * in + i];
            float v = w[(size_t)o * in + i] + l->scale * ba;
            sum += (double)v * v;
        }
        norm[o] = (float)sqrt(sum);
    }
    if (l->mag_unset[layer * LORA_N_TARGETS + t]) {
        memcpy(lora_mag(l, l->params, layer, t), norm, l->out[t] * sizeof(float));
        l->mag_unset[layer * LORA_N_TARGETS + t] = 0;
    }
}

// out (N, O) = (accumulate ? out : 0) + (m / norm + shift) * inp (N, O), per column:
// with shift 0 the scale s of DoRA, with shift -1 the s - 1 of its base path; norm NULL
// counts as 1 (IA3's m * inp). out may be inp.
static void dora_scale(float *out, const float *inp, const float *mag, const float *norm, int N, int O, float shift,
                       int accumulate) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++)
        for (int o = 0; o < O; o++) {
            size_t i = (size_t)n * O + o;
            out[i] = (accumulate ? out[i] : 0.0f) + (mag[o] / (norm ? norm[o] : 1.0f) + shift) * inp[i];
        }
}

// dmag (O) += sum over rows of dout (N, O) * pre (N, O) / norm: the magnitude's gradient,
// pre = W xd + scale B A xd being what s multiplies (norm NULL: 1, IA3's vector's gradient)
static void dora_magnitude_backward(float *dmag, const float *dout, const float *pre, const float *norm, int N, int O) {
    #pragma omp parallel for
    for (int o = 0; o < O; o++) {
        float sum = 0.0f;
        for (int n = 0; n < N; n++) sum += dout[(size_t)n * O + o] * pre[(size_t)n * O + o];
        dmag[o] += norm ? sum / norm[o] : sum;
    }
}

// out (N, O) holds W x: adds DoRA's (s - 1) W xd + s scale B A xd (see the top). w: W (O, in);
// norm: the module's (dora_norm); h (N, r) kept for the backward; xdrop (N, in) and pre (N, O) scratch.
static void dora_forward(const LoRA *l, int layer, int t, float *out, const float *inp, const float *w, float *h,
                         float *xdrop, float *pre, const float *norm, const Chunk *ch, uint64_t key) {
    int in = l->in[t], O = l->out[t], N = ch->B * ch->len;
    const float *x = inp, *mag = lora_mag(l, l->params, layer, t);
    if (l->training && l->dropout > 0.0f) { // peft recomputes the base product on the dropped input
        lora_dropout(l, xdrop, inp, in, ch, lora_dropout_key(key, layer, t));
        x = xdrop;
        matmul_forward(pre, x, w, N, in, O, 1.0f, 0);
    } else memcpy(pre, out, (size_t)N * O * sizeof(float));
    dora_scale(out, pre, mag, norm, N, O, -1.0f, 1);
    matmul_forward(h, x, lora_A(l, l->params, layer, t), N, in, l->r, 1.0f, 0);
    matmul_forward(pre, h, lora_B(l, l->params, layer, t), N, l->r, O, l->scale, 0);
    dora_scale(out, pre, mag, norm, N, O, 0.0f, 1);
}

// given dout (N, O), with dinp (N, in) already holding dout W (the base path): dm, dA, dB
// and the rest of dinp: dropout'((s - 1) dout W) and the LoRA path's for s dout (dinp NULL:
// not needed).
// dh, xdrop, pre as scratch (dh (N, r), the others as in dora_forward).
static void dora_backward(LoRA *l, int layer, int t, float *dinp, const float *dout, const float *inp, const float *w,
                          const float *h, float *dh, float *xdrop, float *pre, const float *norm, const Chunk *ch,
                          uint64_t key) {
    int in = l->in[t], O = l->out[t], N = ch->B * ch->len, dropping = l->dropout > 0.0f;
    const float *x = inp, *mag = lora_mag(l, l->params, layer, t);
    uint64_t dkey = lora_dropout_key(key, layer, t);
    // dm += sum dout (W xd + scale B A xd) / norm, the forward's products recomputed
    if (dropping) { lora_dropout(l, xdrop, inp, in, ch, dkey); x = xdrop; }
    matmul_forward(pre, x, w, N, in, O, 1.0f, 0);
    matmul_forward(pre, h, lora_B(l, l->params, layer, t), N, l->r, O, l->scale, 1);
    dora_magnitude_backward(lora_mag(l, l->grads, layer, t), dout, pre, norm, N, O);
    // the base path's (s - 1) W xd: dinp += dropout'((s - 1) dout W)
    if (dinp) {
        dora_scale(pre, dout, mag, norm, N, O, -1.0f, 0);
        memset(xdrop, 0, (size_t)N * in * sizeof(float));
        matmul_backward(xdrop, NULL, pre, NULL, w, N, in, O, 1.0f);
        if (dropping) lora_dropout(l, xdrop, xdrop, in, ch, dkey);
        #pragma omp parallel for
        for (size_t i = 0; i < (size_t)N * in; i++) dinp[i] += xdrop[i];
    }
    // the LoRA path, s scale B A xd: LoRA's backward of s dout
    dora_scale(pre, dout, mag, norm, N, O, 0.0f, 0);
    lora_backward(l, layer, t, dinp, pre, inp, h, dh, xdrop, ch, key);
}

#endif

// ----------------------------------------------------------------------------
// PEFT adapter files: adapter_model.safetensors + adapter_config.json

// A module's tensors in the files, k = 0 .. lora_n_kinds - 1: LoRA's A (r, in), B (out, r)
// and with DoRA m (out), which peft names without ".weight"; IA3's vector ia3_l, (1, in)
// for a feedforward module, else (out, 1); llama_adapter's adaption_prompt (1, adapter_len,
// D) and adaption_gate (1) of the layer's self_attn; prefix's prompt_embeddings (P, n_layers * 2 * NKV*hd)
static int lora_n_kinds(const LoRA *l) { return l->ia3 || l->prefix ? 1 : l->use_dora ? 3 : 2; }
static void lora_key(const LoRA *l, char *buf, size_t n, int layer, int t, int k) {
    static const char *const kinds[3] = {"lora_A.weight", "lora_B.weight", "lora_magnitude_vector"};
    if (l->adapter_len) {
        snprintf(buf, n, "base_model.model.model.layers.%d.self_attn.%s", layer, k ? "adaption_gate" : "adaption_prompt");
        return;
    }
    if (l->prefix) { snprintf(buf, n, "prompt_embeddings"); return; }
    snprintf(buf, n, "base_model.model.model.layers.%d.%s.%s.%s", layer, lora_target_parents[t], lora_target_names[t],
             l->ia3 ? "ia3_l" : kinds[k]);
}
static float *lora_tensor(const LoRA *l, float *base, int layer, int t, int k) {
    if (l->adapter_len) return k ? adapter_gate(l, base, layer) : adapter_prompt(l, base, layer);
    if (l->ia3 || l->prefix) return lora_A(l, base, layer, t); // (the vector; the prompt embeddings, at layer 0)
    return k == 0 ? lora_A(l, base, layer, t) : k == 1 ? lora_B(l, base, layer, t) : lora_mag(l, base, layer, t);
}
// l's settings and shapes (not its buffers) give the shape; returns the number of dimensions
static int lora_tensor_shape(const LoRA *l, int t, int k, int64_t shape[3]) {
    if (l->adapter_len) {
        shape[0] = 1; shape[1] = l->adapter_len; shape[2] = l->in[LORA_Q];
        return k ? 1 : 3;
    }
    if (l->prefix) {
        shape[0] = l->prefix; shape[1] = (int64_t)prefix_row(l);
        return 2;
    }
    if (l->ia3) {
        int ff = ia3_feedforward(l, t);
        shape[0] = ff ? 1 : l->out[t];
        shape[1] = ff ? l->in[t] : 1;
        return 2;
    }
    shape[0] = k == 0 ? l->r : l->out[t];
    shape[1] = k == 0 ? l->in[t] : l->r;
    return k == 2 ? 1 : 2;
}
static size_t lora_tensor_numel(const LoRA *l, int t, int k) {
    int64_t shape[3];
    size_t n = 1;
    for (int d = 0, nd = lora_tensor_shape(l, t, k, shape); d < nd; d++) n *= (size_t)shape[d];
    return n;
}

// the modules of mask as a JSON list's items: "q_proj", "v_proj"
static void lora_module_list(unsigned mask, char *buf, size_t n) {
    buf[0] = 0;
    for (int t = 0; t < LORA_N_TARGETS; t++)
        if (mask & (1u << t)) {
            size_t k = strlen(buf);
            snprintf(buf + k, n - k, "%s\"%s\"", k ? ", " : "", lora_target_names[t]);
        }
}

// the peft modules each LORA_SAVE_* bit trains (their names end the module paths; peft's
// ensure_weight_tying adds the embedding's longer name)
static const char *lora_saved_modules[2][3] = {{"embed_tokens", "model.embed_tokens"},
                                               {"input_layernorm", "post_attention_layernorm", "norm"}};
// adapter_config.json's modules_to_save for the bits: a JSON list, or null
static const char *lora_saved_json(unsigned saved) {
    static const char *lists[4] = {"null", "[\"embed_tokens\"]", "[\"input_layernorm\", \"post_attention_layernorm\", \"norm\"]",
                                   "[\"embed_tokens\", \"input_layernorm\", \"post_attention_layernorm\", \"norm\"]"};
    return lists[saved & 3];
}

static int lora_save_peft(const LoRA *l, const char *dir, const char *base_model) {
    if (mkdir_p(dir) != 0) {
        fprintf(stderr, "error: cannot create output directory '%s': %s\n", dir, strerror(errno));
        return -1;
    }
    int n = 0, most = l->n_layers * LORA_N_TARGETS * 3 + lora_n_saved(l) + 1;
    StWriteTensor *ts = (StWriteTensor *)callocCheck(most, sizeof(StWriteTensor));
    char (*names)[160] = (char (*)[160])mallocCheck((size_t)most * 160);
    for (int i = 0; i < l->n_layers; i++)
        for (int t = 0; t < LORA_N_TARGETS; t++) {
            if (!lora_trains(l, i, t)) continue;
            for (int k = 0; k < lora_n_kinds(l); k++) {
                lora_key(l, names[n], 160, i, t, k);
                ts[n].name = names[n];
                ts[n].dtype = ST_F32;
                ts[n].ndim = lora_tensor_shape(l, t, k, ts[n].shape);
                ts[n].data = lora_tensor(l, l->params, i, t, k);
                n++;
            }
        }
    for (int k = 0; k <= lora_n_saved(l); k++) { // peft's modules_to_save, whole (lora_n_saved: a tied head)
        int head = k == lora_n_saved(l), vec = k > 0 && !head;
        int64_t numel;
        if (!(ts[n].data = lora_saved(l, l->params, head ? 0 : k, &numel)) || (head && !l->tied)) continue;
        if (head) snprintf(names[n], 160, LORA_TIED_HEAD_KEY);
        else lora_saved_key(l->n_layers, k, names[n], 160);
        ts[n].name = names[n];
        ts[n].dtype = ST_F32;
        ts[n].ndim = vec ? 1 : 2;
        ts[n].shape[0] = vec ? numel : l->vocab;
        ts[n].shape[1] = l->dim;
        n++;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    const char *meta[2] = {"format", "pt"};
    int rc = st_write(path, ts, n, meta, 1);
    free(ts); free(names);
    if (rc != 0) return -1;
    // adapter_config.json with the fields PeftModel.from_pretrained needs
    char targets[256], feedforward[256], cfg[8192];
    lora_module_list(l->targets, targets, sizeof targets);
    lora_module_list(l->feedforward, feedforward, sizeof feedforward);
    char *base_json = NULL; size_t blen = 0;
    FILE *mf = open_memstream(&base_json, &blen);
    if (!mf) die("out of memory writing adapter_config.json");
    json_write_string(mf, base_model ? base_model : "");
    if (fclose(mf) != 0) die("out of memory writing adapter_config.json");
    if (l->adapter_len)
        snprintf(cfg, sizeof cfg,
                 "{\n  \"peft_type\": \"ADAPTION_PROMPT\",\n  \"task_type\": \"CAUSAL_LM\",\n  \"base_model_name_or_path\": %s,\n"
                 "  \"adapter_len\": %d,\n  \"adapter_layers\": %d,\n  \"target_modules\": \"self_attn\",\n"
                 "  \"inference_mode\": true\n}\n", base_json, l->adapter_len, l->adapter_layers);
    else if (l->prefix) // (peft's GQA form: token_dim and num_attention_heads are the KV heads')
        snprintf(cfg, sizeof cfg,
                 "{\n  \"peft_type\": \"PREFIX_TUNING\",\n  \"task_type\": \"CAUSAL_LM\",\n  \"base_model_name_or_path\": %s,\n"
                 "  \"num_virtual_tokens\": %d,\n  \"num_layers\": %d,\n  \"token_dim\": %d,\n  \"encoder_hidden_size\": %d,\n"
                 "  \"num_attention_heads\": %d,\n  \"num_transformer_submodules\": 1,\n  \"prefix_projection\": false,\n"
                 "  \"inference_mode\": true\n}\n", base_json, l->prefix, l->n_layers, l->out[LORA_K], l->out[LORA_K], l->kv_heads);
    else if (l->ia3)
        snprintf(cfg, sizeof cfg,
                 "{\n  \"peft_type\": \"IA3\",\n  \"task_type\": \"CAUSAL_LM\",\n  \"base_model_name_or_path\": %s,\n"
                 "  \"target_modules\": [%s],\n  \"feedforward_modules\": [%s],\n  \"fan_in_fan_out\": false,\n"
                 "  \"inference_mode\": true,\n  \"init_ia3_weights\": true,\n  \"modules_to_save\": null\n}\n",
                 base_json, targets, feedforward);
    else
        snprintf(cfg, sizeof cfg,
                 "{\n  \"peft_type\": \"LORA\",\n  \"task_type\": \"CAUSAL_LM\",\n  \"base_model_name_or_path\": %s,\n"
                 "  \"r\": %d,\n  \"lora_alpha\": %.9g,\n  \"lora_dropout\": %.9g,\n  \"target_modules\": [%s],\n"
                 "  \"bias\": \"none\",\n  \"use_rslora\": %s,\n  \"use_dora\": %s,\n  \"fan_in_fan_out\": false,\n"
                 "  \"inference_mode\": true,\n  \"init_lora_weights\": true,\n  \"modules_to_save\": %s%s\n}\n",
                 base_json, l->r, l->alpha, l->dropout, targets, l->use_rslora ? "true" : "false",
                 l->use_dora ? "true" : "false", lora_saved_json(l->saved),
                 // peft copies a module it saves: a tied head would keep the base embedding without this
                 l->tied && (l->saved & LORA_SAVE_EMBED) ? ",\n  \"ensure_weight_tying\": true" : "");
    free(base_json);
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    return write_bytes_atomic(path, cfg, strlen(cfg));
}

// adapter_config.json's list of modules under key (a list of names, or one string: a name
// list or all-linear) -> bit mask. 0 ok, -1 with a message naming path.
static int peft_modules(const JsonValue *cfg, const char *key, const char *path, unsigned *mask) {
    const JsonValue *v = json_get(cfg, key);
    *mask = 0;
    if (v && v->type == JSON_STRING) {
        if (lora_parse_targets(v->string, path, mask) == 0) return 0;
        fprintf(stderr, "error: %s: unsupported %s \"%s\"\n", path, key, v->string);
        return -1;
    }
    if (!v || v->type != JSON_ARRAY || v->count == 0) {
        fprintf(stderr, "error: %s: '%s' must be a list of module names\n", path, key);
        return -1;
    }
    for (int i = 0; i < v->count; i++) {
        unsigned m;
        if (v->items[i].type != JSON_STRING || lora_parse_targets(v->items[i].string, path, &m) != 0) {
            fprintf(stderr, "error: %s: %s[%d] is not a supported module name\n", path, key, i);
            return -1;
        }
        *mask |= m;
    }
    return 0;
}

// A LoRA adapter's settings from its adapter_config.json cfg (path) into want. 0 ok, -1 with a message.
static int lora_config_read(const JsonValue *cfg, const char *path, LoRA *want) {
    const JsonValue *v;
    const char *s;
    long long r = 0;
    double alpha = 0, dropout = 0;
    int b;
    if (json_get_int(cfg, "r", &r) != 0 || r < 1 || r > 65536) { fprintf(stderr, "error: %s: 'r' must be an integer in [1, 65536]\n", path); return -1; }
    // alpha and dropout are kept as floats: check what they become (1e39 is inf, 0.99999999 is 1)
    if (json_get_number(cfg, "lora_alpha", &alpha) != 0 || !(alpha >= -FLT_MAX && alpha <= FLT_MAX)) {
        fprintf(stderr, "error: %s: 'lora_alpha' must be a number in the float range\n", path); return -1;
    }
    if (json_get_number(cfg, "lora_dropout", &dropout) == -2 || dropout < 0 || (float)dropout >= 1.0f) {
        fprintf(stderr, "error: %s: 'lora_dropout' must be a number in [0, 1)\n", path); return -1;
    }
    want->r = (int)r; want->alpha = (float)alpha; want->dropout = (float)dropout;
    if (json_get_bool(cfg, "use_rslora", &b) == 0) want->use_rslora = b;
    if (json_get_bool(cfg, "use_dora", &b) == 0) want->use_dora = b;
    if (json_get_string(cfg, "bias", &s, NULL) == 0 && strcmp(s, "none") != 0) { fprintf(stderr, "error: %s: bias \"%s\" is not supported (only \"none\")\n", path, s); return -1; }
    for (int k = 0; k < 2; k++) {
        const char *key = k ? "alpha_pattern" : "rank_pattern";
        if ((v = json_get(cfg, key)) && !(v->type == JSON_OBJECT && v->count == 0) && v->type != JSON_NULL) {
            fprintf(stderr, "error: %s: per-module %s is not supported\n", path, key); return -1;
        }
    }
    return peft_modules(cfg, "target_modules", path, &want->targets);
}

// An IA3 adapter's settings: target_modules and feedforward_modules, which must be among
// them (peft's check); none given, peft takes llama's (down_proj) among the targets.
static int ia3_config_read(const JsonValue *cfg, const char *path, LoRA *want) {
    want->ia3 = 1;
    if (peft_modules(cfg, "target_modules", path, &want->targets) != 0) return -1;
    const JsonValue *v = json_get(cfg, "feedforward_modules");
    if (!v || v->type == JSON_NULL) { want->feedforward = want->targets & (1u << LORA_DOWN); return 0; }
    if (peft_modules(cfg, "feedforward_modules", path, &want->feedforward) != 0) return -1;
    if (want->feedforward & ~want->targets) {
        fprintf(stderr, "error: %s: feedforward_modules must be a subset of target_modules\n", path);
        return -1;
    }
    return 0;
}

// A llama_adapter's settings (peft's AdaptionPromptConfig): adapter_len, and adapter_layers,
// which peft refuses beyond the model's layers; target_modules, if given, must be llama's
// self_attn. 0 ok, -1 with a message naming path.
static int adapter_config_read(const JsonValue *cfg, const char *path, int n_layers, LoRA *want) {
    long long len = 0, layers = 0;
    const char *s;
    if (json_get_int(cfg, "adapter_len", &len) != 0 || len < 1 || len > ADAPTER_MAX_LEN) {
        fprintf(stderr, "error: %s: 'adapter_len' must be an integer in [1, %d]\n", path, ADAPTER_MAX_LEN); return -1;
    }
    if (json_get_int(cfg, "adapter_layers", &layers) != 0 || layers < 1 || layers > n_layers) {
        fprintf(stderr, "error: %s: 'adapter_layers' must be an integer in [1, %d] (the model's layers)\n", path, n_layers);
        return -1;
    }
    if (json_get(cfg, "target_modules") && json_get(cfg, "target_modules")->type != JSON_NULL &&
        (json_get_string(cfg, "target_modules", &s, NULL) != 0 || strcmp(s, "self_attn") != 0)) {
        fprintf(stderr, "error: %s: target_modules must be \"self_attn\" (llama's attention)\n", path); return -1;
    }
    want->adapter_len = (int)len; want->adapter_layers = (int)layers;
    return 0;
}

// A prefix's settings (peft's PrefixTuningConfig): num_virtual_tokens; prefix_projection
// (an MLP that makes the keys and values, which peft cannot flatten either) is refused, and
// num_layers and num_transformer_submodules, when given, must be the model's layers and 1
// (the tensor's shape checks token_dim). 0 ok, -1 with a message naming path.
static int prefix_config_read(const JsonValue *cfg, const char *path, int n_layers, LoRA *want) {
    long long p = 0, v;
    int b;
    if (json_get_int(cfg, "num_virtual_tokens", &p) != 0 || p < 1 || p > PREFIX_MAX_TOKENS) {
        fprintf(stderr, "error: %s: 'num_virtual_tokens' must be an integer in [1, %d]\n", path, PREFIX_MAX_TOKENS); return -1;
    }
    if (json_get_bool(cfg, "prefix_projection", &b) == 0 && b) {
        fprintf(stderr, "error: %s: prefix_projection is not supported (its MLP makes the keys and values; only the plain "
                "prompt_embeddings are)\n", path); return -1;
    }
    if (json_get(cfg, "num_layers") && json_get(cfg, "num_layers")->type != JSON_NULL &&
        (json_get_int(cfg, "num_layers", &v) != 0 || v != n_layers)) {
        fprintf(stderr, "error: %s: 'num_layers' must be the model's %d layers\n", path, n_layers); return -1;
    }
    if (json_get(cfg, "num_transformer_submodules") && json_get(cfg, "num_transformer_submodules")->type != JSON_NULL &&
        (json_get_int(cfg, "num_transformer_submodules", &v) != 0 || v != 1)) {
        fprintf(stderr, "error: %s: 'num_transformer_submodules' must be 1 (a decoder)\n", path); return -1;
    }
    want->prefix = (int)p;
    return 0;
}

// Reads a PEFT LoRA, IA3, llama_adapter or prefix adapter (peft_type) written by peft or by us. The model's shapes
// come in in[] / out[]; everything in the files is checked against them. 0 ok, -1 with a message.
static int lora_load_peft(LoRA *l, const char *dir, int n_layers, const int in[LORA_N_TARGETS],
                          const int out[LORA_N_TARGETS], int vocab, int tied) {
    char path[4096];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    JsonValue cfg;
    if (json_load_file(path, &cfg) != 0) return -1;
    int rc = -1, b, found = 0, allocated = 0;
    const JsonValue *v;
    const char *s;
    int tying = 0;
    unsigned saved = 0;
    LoRA want; // the settings and shapes the tensors are checked against
    memset(&want, 0, sizeof want);
    want.n_layers = n_layers;
    for (int t = 0; t < LORA_N_TARGETS; t++) want.in[t] = in[t], want.out[t] = out[t];
    if (cfg.type != JSON_OBJECT) { fprintf(stderr, "error: %s: not a JSON object\n", path); goto done; }
    if (json_get_string(&cfg, "peft_type", &s, NULL) != 0 ||
        (strcmp(s, "LORA") != 0 && strcmp(s, "IA3") != 0 && strcmp(s, "ADAPTION_PROMPT") != 0 && strcmp(s, "PREFIX_TUNING") != 0)) {
        fprintf(stderr, "error: %s: peft_type must be \"LORA\", \"IA3\", \"ADAPTION_PROMPT\" or \"PREFIX_TUNING\"\n", path); goto done;
    }
    if (json_get_bool(&cfg, "fan_in_fan_out", &b) == 0 && b) { fprintf(stderr, "error: %s: fan_in_fan_out adapters are not supported\n", path); goto done; }
    // modules_to_save: the embedding and the norms (--trainable_params), the norms all or none
    if ((v = json_get(&cfg, "modules_to_save")) && v->type != JSON_NULL) {
        unsigned names = 0; // bit 3 g + k: lora_saved_modules[g][k] listed
        int unknown = v->type != JSON_ARRAY;
        for (int i = 0; !unknown && i < v->count; i++) {
            unsigned was = names;
            for (int g = 0; g < 2; g++)
                for (int k = 0; k < 3 && lora_saved_modules[g][k]; k++)
                    if (v->items[i].type == JSON_STRING && !strcmp(v->items[i].string, lora_saved_modules[g][k]))
                        names |= 1u << (3 * g + k);
            unknown = names == was;
        }
        saved = (names & 3 ? LORA_SAVE_EMBED : 0) | (names >> 3 ? LORA_SAVE_NORM : 0);
        if (unknown || (names >> 3 && names >> 3 != 7)) {
            fprintf(stderr, "error: %s: modules_to_save must list embed_tokens and/or all of input_layernorm, "
                    "post_attention_layernorm and norm (what --trainable_params embed,norm trains)\n", path);
            goto done;
        }
    }
    // (--trainable_params trains them beside LoRA only: see trainer.h)
    if (saved && strcmp(s, "LORA") != 0) {
        fprintf(stderr, "error: %s: modules_to_save with peft_type \"%s\" is not supported (only with LoRA)\n", path, s);
        goto done;
    }
    if (json_get_bool(&cfg, "ensure_weight_tying", &b) == 0) tying = b;
    if (tied && (saved & LORA_SAVE_EMBED) && !tying) {
        fprintf(stderr, "error: %s: saves embed_tokens of a model with tied embeddings without ensure_weight_tying, so "
                "peft's head keeps the base embedding; this trainer trains them as one tensor\n", path);
        goto done;
    }
    if (strcmp(s, "ADAPTION_PROMPT") == 0 ? adapter_config_read(&cfg, path, n_layers, &want)
        : strcmp(s, "PREFIX_TUNING") == 0 ? prefix_config_read(&cfg, path, n_layers, &want)
        : (strcmp(s, "IA3") == 0 ? ia3_config_read : lora_config_read)(&cfg, path, &want)) goto done;
    // the tensors are checked against the config and the model before anything is
    // allocated for them (r alone, up to 65536, could ask for gigabytes), then read
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    StFile sf;
    if (st_open(&sf, path) != 0) goto done;
    char key[160];
    for (int pass = 0; pass < 2 && found >= 0; pass++) { // 0: check, 1: allocate and read
        if (pass == 1) {
            if (found != sf.n_tensors) {
                fprintf(stderr, "error: %s: holds %d tensors but the adapter config implies %d (layers beyond the model, "
                        "or modules we do not adapt)\n", path, sf.n_tensors, found);
                found = -1;
                break;
            }
            if (want.adapter_len) adapter_alloc(l, n_layers, in, out, want.adapter_len, want.adapter_layers, 0);
            else if (want.prefix) prefix_alloc(l, n_layers, in, out, want.prefix, 0);
            else if (want.ia3) ia3_alloc(l, n_layers, in, out, want.targets, want.feedforward);
            else lora_alloc(l, n_layers, in, out, want.r, want.alpha, want.dropout, want.use_rslora, want.use_dora, want.targets);
            lora_add_saved(l, saved, vocab, in[LORA_Q], tied, 1);
            allocated = 1;
        }
        // the saved tensors (k = 2 + 2 n_layers: a tied head, which peft saves beside the embedding: it must equal it)
        for (int k = 0; k <= 2 + 2 * n_layers && found >= 0; k++) {
            int head = k == 2 + 2 * n_layers, embed = k == 0 || head;
            if (!(saved & (embed ? LORA_SAVE_EMBED : LORA_SAVE_NORM)) || (head && !tied)) continue;
            if (head) snprintf(key, sizeof key, LORA_TIED_HEAD_KEY);
            else lora_saved_key(n_layers, k, key, sizeof key);
            const StTensor *st = st_find(&sf, key);
            if (pass == 1) {
                float *dst = head ? l->grads + l->saved_offset : lora_saved(l, l->params, k, NULL); // (the grads: scratch)
                if (st_read_f32(&sf, st, 0, st->numel, dst) != 0) { found = -1; break; }
                if (head && memcmp(dst, l->params + l->saved_offset, st->numel * sizeof(float)) != 0) {
                    fprintf(stderr, "error: %s: '%s' differs from the embedding, which the model ties it to\n", path, key);
                    found = -1;
                }
                if (head) memset(dst, 0, st->numel * sizeof(float));
                continue;
            }
            if (!st) { fprintf(stderr, "error: %s: tensor '%s' is missing (modules_to_save)\n", path, key); found = -1; break; }
            if (st->ndim != 2 - !embed || st->shape[0] != (embed ? vocab : in[LORA_Q]) || (embed && st->shape[1] != in[LORA_Q])) {
                fprintf(stderr, "error: %s: tensor '%s' has the wrong shape for the model (%s)\n", path, key,
                        embed ? "vocab_size, hidden_size" : "hidden_size");
                found = -1; break;
            }
            found++;
        }
        for (int i = 0; i < n_layers && found >= 0; i++)
            for (int t = 0; t < LORA_N_TARGETS && found >= 0; t++) {
                if (!lora_trains(&want, i, t)) continue;
                for (int k = 0; k < lora_n_kinds(&want); k++) {
                    lora_key(&want, key, sizeof key, i, t, k);
                    const StTensor *st = st_find(&sf, key);
                    int64_t d[3];
                    int ndim = lora_tensor_shape(&want, t, k, d);
                    if (pass == 1) {
                        if (st_read_f32(&sf, st, 0, st->numel, lora_tensor(l, l->params, i, t, k)) != 0) { found = -1; break; }
                        continue;
                    }
                    if (!st) { fprintf(stderr, "error: %s: tensor '%s' is missing\n", path, key); found = -1; break; }
                    int same = st->ndim == ndim;
                    for (int j = 0; j < ndim && same; j++) same = st->shape[j] == d[j];
                    if (!same) {
                        char got[128], wanted[128];
                        st_format_shape(st->shape, st->ndim, got, sizeof got);
                        st_format_shape(d, ndim, wanted, sizeof wanted);
                        fprintf(stderr, "error: %s: tensor '%s' has shape %s, expected %s from the model and "
                                "adapter_config.json\n", path, key, got, wanted);
                        found = -1; break;
                    }
                    found++;
                }
            }
    }
    st_close(&sf);
    if (found < 0) { if (allocated) lora_free(l); goto done; }
    rc = 0;
done:
    json_free(&cfg);
    return rc;
}
#endif
