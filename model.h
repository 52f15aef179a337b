// The model as files and host arrays, shared by both trainers: the config,
// the base weights' layout, names and shapes (Hugging Face Llama conventions),
// loading a checkpoint folder into host fp32 arrays, and saving one (full
// fine-tuning, and base + adapter merged). Nothing here computes a forward;
// a backend's Model embeds a HostModel (train_llama2.c, train_llama2.cu).
//
// Include after the backend's matmul_forward / matmul_backward (lora.h calls them).
#ifndef MODEL_H
#define MODEL_H
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <float.h>
#include "support/utils.h"
#include "support/json.h"
#include "support/safetensors.h"
#include "fsdp.h"
#include "lora.h"
#include "support/progress.h"

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
    float init_std;   // initializer_range: the std of --random_init's weights
    int sliding_window; // W: query i sees keys i-W+1..i; 0 = unlimited (plain causal)
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
    // Mistral v0.1: "sliding_window": 4096; null (v0.2+) or absent (Llama): plain causal
    c->sliding_window = 0;
    if ((v = json_get(&j, "sliding_window")) && v->type != JSON_NULL &&
        config_int(&j, path, "sliding_window", &c->sliding_window, 1, 1, 1 << 30)) goto done;
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
    c->init_std = 0.02f; // transformers' LlamaConfig default
    if (json_get_number(&j, "initializer_range", &d) == 0) c->init_std = d > 0 && d <= 1e3 ? (float)d : -1.0f;
    if (!(c->init_std > 0)) { fprintf(stderr, "error: %s: initializer_range must be a number in (0, 1000]\n", path); goto done; }
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
// units (fsdp.h): the embedding, one per decoder layer, the head. A layer unit
// holds P_ATTN_NORM .. P_WDOWN in enum order; the head unit the final norm and
// (untied) lm_head.

#define LAYER_TENSORS (P_WDOWN - P_ATTN_NORM + 1)

static void model_units(const Config *c, FsdpUnits *u, int n_shards) {
    fsdp_units_llama(u, c->n_layers, c->dim, c->hidden_dim, c->n_heads * c->head_dim, c->n_kv_heads * c->head_dim,
                     c->vocab_size, c->tied, n_shards);
}

// where tensor j of unit u starts in the whole model's flat layout (param_layout's):
// the map between a unit's flat buffer and the whole model's weights, gradients, moments
static size_t model_tensor_offset(const Config *c, int u, int j) {
    int p = u == 0 ? P_EMBED : u > c->n_layers ? (j ? P_HEAD : P_NORM) : P_ATTN_NORM + j;
    size_t off = 0;
    for (int q = 0; q < p; q++) off += q == P_HEAD && c->tied ? 0 : param_numel(c, q);
    if (param_per_layer(p)) off += (size_t)(u - 1) * (param_numel(c, p) / c->n_layers);
    return off;
}

// the shapes of the seven linear layers peft can adapt, in LORA_* order
static void lora_shapes(const Config *c, int in[LORA_N_TARGETS], int out[LORA_N_TARGETS]) {
    int D = c->dim, H = c->hidden_dim, Q = c->n_heads * c->head_dim, KV = c->n_kv_heads * c->head_dim;
    int ins[LORA_N_TARGETS] = {D, D, D, Q, D, D, H}, outs[LORA_N_TARGETS] = {Q, KV, KV, D, H, H, D};
    memcpy(in, ins, sizeof ins);
    memcpy(out, outs, sizeof outs);
}

// ----------------------------------------------------------------------------
// the host model: what both backends keep in host memory. On the CPU it is the
// only copy; the CUDA trainer uploads it and copies the trainable part back
// before a save (model_sync_host in trainer.h's contract).

typedef struct {
    Config config;
    ParameterTensors w;       // base weights (fp32), pointers into params: the whole model
    float *params;            // (NULL when sharded)
    size_t num_params;        // every base weight (the whole model's, sharded or not)
    FsdpUnits units;          // the model's units, sharded units.n_shards ways
    float *shards;            // sharded (units.n_shards > 1): this rank's shard of every unit
                              // (units.shard_numel, fsdp.h's layout); NULL when whole
    int full_finetune;        // train every weight (else LoRA on frozen weights)
    int use_lora;
    LoRA lora;                // adapters: shapes, targets, dropout flag, params (and grads)
} HostModel;

static void host_model_free(HostModel *h) {
    free(h->params);
    free(h->shards);
    fsdp_units_free(&h->units);
    lora_free(&h->lora); // a zeroed LoRA frees nothing
    memset(h, 0, sizeof *h);
}

// ----------------------------------------------------------------------------
// loading a Hugging Face checkpoint

// config.json, and the checkpoint's tensors opened and checked against the
// model's units (sharded n ways): every tensor present with its shape and a
// float dtype, nothing beyond them (fsdp_check_model). Reads no weights, so
// a config.json claiming terabytes allocates nothing. 0 ok, -1 with a message.
static int model_open(HostModel *m, const char *dir, StModel *sm, int n_shards) {
    if (config_load(&m->config, dir) != 0) return -1;
    model_units(&m->config, &m->units, n_shards);
    m->num_params = m->units.numel;
    if (st_model_open(sm, dir) != 0) return -1;
    if (fsdp_check_model(&m->units, sm) == 0) return 0;
    st_model_close(sm);
    return -1;
}

// every tensor of the whole model into m->params (allocated here, in the layout
// of ParameterTensors), tensor by tensor through read (fsdp.h's FsdpReadFn: the
// checkpoint's bytes, or random weights), with a progress bar saying what
static int model_fill(HostModel *m, const char *what, FsdpReadFn read, void *ctx) {
    const Config *c = &m->config;
    m->params = (float *)mallocCheck(m->num_params * sizeof(float));
    param_layout(c, &m->w, m->params);
    Progress bar = progress_begin(stderr, what, m->num_params / 1e6, "M params");
    double done = 0; // parameters filled so far
    int rc = 0;
    for (int i = 0; i < m->units.n_units && rc == 0; i++)
        for (int j = 0; j < m->units.units[i].n_tensors && rc == 0; j++) {
            size_t n = m->units.units[i].tensors[j].numel;
            rc = read(ctx, i, j, 0, n, m->params + model_tensor_offset(c, i, j));
            progress_update(&bar, (done += (double)n) / 1e6);
        }
    if (rc == 0) progress_end(&bar, m->num_params / 1e6);
    return rc;
}

typedef struct { const FsdpUnits *u; StModel *sm; } CheckpointReader;
static int read_checkpoint_tensor(void *ctx, int unit, int tensor, size_t first, size_t count, float *dst) {
    const CheckpointReader *r = (const CheckpointReader *)ctx;
    StFile *f = NULL;
    const StTensor *st = st_model_find(r->sm, r->u->units[unit].tensors[tensor].name, &f); // present: model_open checked
    return st_read_f32(f, st, first, count, dst);
}

// config.json and the base weights of a checkpoint folder into h, whole: the
// case of one shard of model_load_shard, in the layout of ParameterTensors.
// (h->params is allocated only once every tensor checked out; the caller frees
// h, also after a failure.) 0 ok, -1 with a message naming the file.
static int model_load(HostModel *m, const char *dir) {
    StModel sm;
    if (model_open(m, dir, &sm, 1) != 0) return -1;
    CheckpointReader r = {&m->units, &sm};
    int rc = model_fill(m, "loading the weights", read_checkpoint_tensor, &r);
    if (rc == 0 && m->config.tied) rc = fsdp_check_tied_head(&sm, 0, m->units.units[0].numel, m->w.embed);
    st_model_close(&sm);
    return rc;
}

// config.json and shard `rank` of n of every unit of a checkpoint folder into
// h->shards: only those bytes are read, so no rank ever holds the whole model.
// 0 ok, -1 with a message naming the file.
static int model_load_shard(HostModel *m, const char *dir, int rank, int n) {
    StModel sm;
    if (model_open(m, dir, &sm, n) != 0) return -1;
    m->shards = (float *)mallocCheck(m->units.shard_numel * sizeof(float));
    int rc = fsdp_load_model(&m->units, &sm, rank, m->shards);
    st_model_close(&sm);
    return rc;
}

// ----------------------------------------------------------------------------
// random weights (--random_init): a model's shape from its config.json alone,
// for benchmarks, where speed depends on the shape and not on the values (and
// a GPU machine may have no 13 GB checkpoint and no way to download one)
//
// As transformers initialises LlamaForCausalLM: the embedding and every linear
// layer N(0, initializer_range), the RMSNorm weights 1. Element e of tensor j of
// unit u is a hash of (seed, u, j, e), so the weights are the same whole or
// sharded at any world size and thread count.

typedef struct { const FsdpUnits *u; uint64_t seed; float std; } RandomWeights;
static int random_tensor(void *ctx, int unit, int tensor, size_t first, size_t count, float *dst) {
    const RandomWeights *r = (const RandomWeights *)ctx;
    if (r->u->units[unit].tensors[tensor].ndim == 1) { // an RMSNorm weight
        for (size_t i = 0; i < count; i++) dst[i] = 1.0f;
        return 0;
    }
    uint64_t key = splitmix64(r->seed ^ splitmix64(((uint64_t)unit << 8) | (uint64_t)tensor));
    #pragma omp parallel for schedule(static)
    for (long long i = 0; i < (long long)count; i++) dst[i] = r->std * hash_normal(key, first + (size_t)i);
    return 0;
}

// config.json of dir into h and the model's shape, with room for its weights
// but nothing read into them: a sharded model's shards (n > 1, h->shards: they
// also tell the backends that the model is sharded), and with whole a whole
// model's weights (zeroed, in ParameterTensors' layout). For weights that come
// from elsewhere: random ones, or a sharded checkpoint that a resume reads.
// 0 ok, -1 with a message.
static int model_shape(HostModel *m, const char *dir, int n, int whole) {
    if (config_load(&m->config, dir) != 0) return -1;
    model_units(&m->config, &m->units, n);
    m->num_params = m->units.numel;
    if (n > 1) m->shards = (float *)callocCheck(m->units.shard_numel, sizeof(float));
    else if (whole) param_layout(&m->config, &m->w, m->params = (float *)callocCheck(m->num_params, sizeof(float)));
    return 0;
}

// config.json of dir into h, and its weights drawn as above: whole (n = 1, into
// h->params) or shard `rank` of n of every unit (into h->shards), as model_load
// and model_load_shard would read a checkpoint. With draw 0 (a dry run, whose
// plan needs only the shapes) nothing is drawn, and a whole model's weights are
// not even allocated: a whole 7B model's plan takes no memory. 0 ok, -1 with a message.
static int model_init_random(HostModel *m, const char *dir, uint64_t seed, int rank, int n, int draw) {
    if (model_shape(m, dir, n, 0) != 0) return -1;
    RandomWeights r = {&m->units, seed, m->config.init_std};
    if (!draw) return 0;
    return n > 1 ? fsdp_read_shard(&m->units, rank, m->shards, random_tensor, &r) : model_fill(m, "drawing random weights", random_tensor, &r);
}

// unit u, whole (unit, its flat buffer) into the whole model's flat layout dst
// (weights, gradients or moments: param_layout's order)
static void model_put_unit(const HostModel *m, int u, const float *unit, float *dst) {
    const FsdpUnit *un = &m->units.units[u];
    for (int j = 0; j < un->n_tensors; j++)
        memcpy(dst + model_tensor_offset(&m->config, u, j), unit + un->tensors[j].offset, un->tensors[j].numel * sizeof(float));
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

static int model_save_hf(const HostModel *m, const char *dir, const char *model_dir, const char *tokpath) {
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

// base + LoRA as one Hugging Face model: W += scale * B @ A in every adapted
// layer, on the host (it runs once, after training). Each element sums its r
// products in order from zero and is then added to W, as the CPU matmul does.
static int model_save_merged(HostModel *m, const char *dir, const char *model_dir, const char *tokpath) {
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
            int in = l->in[t], r = l->r;
            float *W = w[map[t]] + (size_t)i * l->out[t] * in;   // (out, in)
            const float *A = lora_A(l, l->params, i, t);         // (r, in)
            const float *Bm = lora_B(l, l->params, i, t);        // (out, r)
            #pragma omp parallel
            {
                float *acc = (float *)mallocCheck((size_t)in * sizeof(float)); // one row of scale * B A
                #pragma omp for
                for (int o = 0; o < l->out[t]; o++) {
                    memset(acc, 0, (size_t)in * sizeof(float));
                    for (int j = 0; j < r; j++) {
                        float b = l->scale * Bm[(size_t)o * r + j];
                        const float *Aj = A + (size_t)j * in;
                        for (int k = 0; k < in; k++) acc[k] += b * Aj[k];
                    }
                    for (int k = 0; k < in; k++) W[(size_t)o * in + k] += acc[k];
                }
                free(acc);
            }
        }
    int rc = model_save_hf(m, dir, model_dir, tokpath);
    memcpy(m->params, saved, total * sizeof(float));
    free(saved);
    return rc;
}
#endif
