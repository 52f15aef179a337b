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
#include "support/optimizer_cpu.h" // round_bf16
#include "fsdp.h"
#include "lora.h"
#include "peft/quant.h"
#include "tokenizer.h" // model_save_hf names the tokenizer copy by its format
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
    // RoPE's frequency scaling (rope_type of rope_parameters or rope_scaling), its
    // parameters as config.json has them (transformers reads them as Python floats)
    int rope_type;              // ROPE_DEFAULT, ROPE_LINEAR or ROPE_LLAMA3
    double rope_factor;         // linear and llama3: factor
    double rope_low_freq_factor, rope_high_freq_factor; // llama3
    int rope_original_max_pos;  // llama3: original_max_position_embeddings
    int sliding_window; // W: query i sees keys i-W+1..i; 0 = unlimited (plain causal)
} Config;

enum { ROPE_DEFAULT, ROPE_LINEAR, ROPE_LLAMA3 };
static const char *rope_type_names[] = {"default", "linear", "llama3"};

// an integer field; null is transformers' None, which means its default as a missing key does
static int config_int(const JsonValue *cfg, const char *path, const char *key, int *out, int required, int lo, int hi) {
    long long v;
    const JsonValue *x = json_get(cfg, key);
    int rc = x && x->type == JSON_NULL ? JSON_MISSING : json_get_int(cfg, key, &v);
    if (rc == JSON_MISSING && !required) return 0;
    if (rc != 0 || v < lo || v > hi) {
        fprintf(stderr, "error: %s: '%s' must be an integer in [%d, %d]%s\n", path, key, lo, hi, rc == JSON_MISSING ? " (missing)" : "");
        return -1;
    }
    *out = (int)v;
    return 0;
}

// a positive number that float holds (a double beyond FLT_MAX would become inf);
// 0 and *out untouched when it is missing and not required
static int config_positive(const JsonValue *obj, const char *path, const char *where, const char *key, double *out, int required) {
    double d;
    int rc = json_get_number(obj, key, &d);
    if (rc == JSON_MISSING && !required) return 0;
    if (rc == 0 && d > 0 && (float)d == 0) { // (the model reads them as floats)
        fprintf(stderr, "error: %s: '%s%s' is %g, which a float rounds to 0\n", path, where, key, d);
        return -1;
    }
    if (rc != 0 || !(d > 0 && d <= FLT_MAX)) {
        fprintf(stderr, "error: %s: '%s%s' must be a positive finite number%s\n", path, where, key, rc == JSON_MISSING ? " (missing)" : "");
        return -1;
    }
    *out = d;
    return 0;
}

// RoPE's settings as transformers 5 reads them (RotaryEmbeddingConfigMixin): the
// parameters from rope_scaling (transformers < 5) or else rope_parameters
// (transformers 5); rope_theta from inside them, else the top level, else 10000;
// the type from rope_type, else type, else "default". Types that change the
// frequencies in ways not implemented here are refused by name.
static int config_rope(Config *c, const JsonValue *j, const char *path) {
    const JsonValue *rope = NULL, *v;
    const char *in = "", *keys[2] = {"rope_scaling", "rope_parameters"}; // in: where rope is, for the messages
    char where[32];
    for (int k = 0; k < 2 && !rope; k++) {
        if (!(v = json_get(j, keys[k])) || v->type == JSON_NULL || (v->type == JSON_OBJECT && v->count == 0)) continue;
        if (v->type != JSON_OBJECT) { fprintf(stderr, "error: %s: '%s' must be an object or null\n", path, keys[k]); return -1; }
        rope = v;
        snprintf(where, sizeof where, "%s.", keys[k]);
        in = where;
    }
    double theta = 10000.0, partial = 1.0;
    if (config_positive(j, path, "", "rope_theta", &theta, 0) || config_positive(rope, path, in, "rope_theta", &theta, 0) ||
        config_positive(j, path, "", "partial_rotary_factor", &partial, 0) ||
        config_positive(rope, path, in, "partial_rotary_factor", &partial, 0)) return -1;
    c->rope_theta = (float)theta;
    if (partial != 1.0) { // RoPE on part of each head only (other architectures)
        fprintf(stderr, "error: %s: partial_rotary_factor %g is not supported (RoPE over the whole head only)\n", path, partial);
        return -1;
    }
    const char *type = "default";
    int rc = json_get_string(rope, "rope_type", &type, NULL);
    if (rc == JSON_MISSING) rc = json_get_string(rope, "type", &type, NULL);
    if (rc == JSON_WRONG_TYPE) { fprintf(stderr, "error: %s: '%srope_type' must be a string\n", path, in); return -1; }
    c->rope_type = -1;
    for (int t = 0; t < (int)(sizeof rope_type_names / sizeof rope_type_names[0]); t++)
        if (strcmp(type, rope_type_names[t]) == 0) c->rope_type = t;
    if (c->rope_type < 0) {
        fprintf(stderr, "error: %s: rope scaling type \"%s\" is not supported (default, linear and llama3 are)\n", path, type);
        return -1;
    }
    if (c->rope_type == ROPE_DEFAULT) return 0;
    if (config_positive(rope, path, in, "factor", &c->rope_factor, 1)) return -1;
    if (c->rope_type == ROPE_LINEAR) return 0;
    if (config_positive(rope, path, in, "low_freq_factor", &c->rope_low_freq_factor, 1) ||
        config_positive(rope, path, in, "high_freq_factor", &c->rope_high_freq_factor, 1) ||
        config_int(rope, path, "original_max_position_embeddings", &c->rope_original_max_pos, 1, 1, 1 << 24)) return -1;
    if (!(c->rope_high_freq_factor > c->rope_low_freq_factor)) { // the blend divides by their difference
        fprintf(stderr, "error: %s: %shigh_freq_factor (%g) must be greater than low_freq_factor (%g)\n", path, in,
                c->rope_high_freq_factor, c->rope_low_freq_factor);
        return -1;
    }
    return 0;
}

// 1 when dir's tokenizer.model is tiktoken's (tokenizer.h), as in Llama-3's original download
static int tokenizer_file_is_tiktoken(const char *dir) {
    char path[4096];
    unsigned char head[128];
    snprintf(path, sizeof path, "%s/tokenizer.model", dir);
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(head, 1, sizeof head, f) : 0;
    if (f) fclose(f);
    return tokenizer_is_tiktoken(head, n);
}

// Meta's params.json (the original download: support/weights.h reads its tensors),
// as transformers' convert_llama_weights_to_hf.py reads it, checked against the
// tensors: the FFN width its formula gives against w1's rows, its vocab_size (-1:
// the embedding's rows) and dim against the embedding. params.json has no context
// length: the converter's, 4096 (Llama-2), 16384 where rope_theta > 10000 (CodeLlama).
// Keys beyond Llama-2's and CodeLlama's are refused by name, and so is Llama-3's
// original folder. 0 ok, -1 with a message.
static int config_load_meta(Config *c, const char *dir) {
    static const char *known[] = {"dim", "n_layers", "n_heads", "n_kv_heads", "multiple_of", "ffn_dim_multiplier", "norm_eps", "vocab_size", "rope_theta"};
    char path[4096];
    snprintf(path, sizeof path, "%s/params.json", dir);
    if (tokenizer_file_is_tiktoken(dir)) {
        fprintf(stderr, "error: %s/tokenizer.model is tiktoken's (Llama-3's original download), which is not read: "
                "give the model's Hugging Face folder (config.json, model.safetensors, tokenizer.json)\n", dir);
        return -1;
    }
    JsonValue j;
    if (json_load_file(path, &j) != 0) return -1;
    int rc = -1, multiple_of = 256, vocab = -1;
    long long ffn;
    double ffn_mult = 1.0, eps = 1e-5, theta = 10000.0, ffn_raw;
    Weights w;
    const WeightsEntry *embed, *gate;
    memset(&w, 0, sizeof w);
    memset(c, 0, sizeof *c);
    if (j.type != JSON_OBJECT) { fprintf(stderr, "error: %s: not a JSON object\n", path); goto done; }
    for (int i = 0; i < j.count; i++) {
        size_t k = 0;
        while (k < sizeof known / sizeof known[0] && strcmp(j.keys[i], known[k]) != 0) k++;
        if (k == sizeof known / sizeof known[0]) {
            fprintf(stderr, "error: %s: key \"%s\" is not one of Llama-2's (dim, n_layers, n_heads, n_kv_heads, multiple_of, "
                    "ffn_dim_multiplier, norm_eps, vocab_size, rope_theta): give the model's Hugging Face folder\n", path, j.keys[i]);
            goto done;
        }
    }
    if (config_int(&j, path, "dim", &c->dim, 1, 1, 1 << 16) || config_int(&j, path, "n_layers", &c->n_layers, 1, 1, 1024) ||
        config_int(&j, path, "n_heads", &c->n_heads, 1, 1, 1024) || config_int(&j, path, "multiple_of", &multiple_of, 0, 1, 1 << 16) ||
        config_int(&j, path, "vocab_size", &vocab, 0, -1, 1 << 24)) goto done;
    c->n_kv_heads = c->n_heads;
    if (config_int(&j, path, "n_kv_heads", &c->n_kv_heads, 0, 1, c->n_heads) ||
        config_positive(&j, path, "", "ffn_dim_multiplier", &ffn_mult, 0) || config_positive(&j, path, "", "norm_eps", &eps, 0) ||
        config_positive(&j, path, "", "rope_theta", &theta, 0)) goto done;
    if (vocab == 0 || c->dim % c->n_heads || (c->dim / c->n_heads) % 2 || c->n_heads % c->n_kv_heads) {
        fprintf(stderr, "error: %s: vocab_size must be -1 or positive, dim a multiple of n_heads with an even quotient, "
                "n_heads a multiple of n_kv_heads\n", path);
        goto done;
    }
    if (weights_open(&w, dir) != 0) goto done;
    embed = weights_find(&w, "model.embed_tokens.weight"), gate = weights_find(&w, "model.layers.0.mlp.gate_proj.weight");
    if (!embed || !gate) { fprintf(stderr, "error: %s: the checkpoint has no %s\n", dir, embed ? "layers.0.feed_forward.w1" : "tok_embeddings"); goto done; }
    ffn_raw = ffn_mult * (double)(int)(2.0 * 4 * c->dim / 3); // Meta's model.py, in Python's arithmetic
    if (!(ffn_raw < (double)(1 << 18))) { // (config.json's bound on intermediate_size; the cast below needs it in range)
        fprintf(stderr, "error: %s: dim %d and ffn_dim_multiplier %g give an FFN width of %.6g, more than %d\n", path, c->dim,
                ffn_mult, ffn_raw, 1 << 18);
        goto done;
    }
    ffn = (long long)ffn_raw;
    ffn = multiple_of * ((ffn + multiple_of - 1) / multiple_of);
    if (gate->tensor->shape[0] != ffn) {
        fprintf(stderr, "error: %s: dim %d, multiple_of %d and ffn_dim_multiplier %g give an FFN width of %lld, but "
                "layers.0.feed_forward.w1 has %lld rows\n", path, c->dim, multiple_of, ffn_mult, ffn, (long long)gate->tensor->shape[0]);
        goto done;
    }
    if ((vocab > 0 && embed->tensor->shape[0] != vocab) || embed->tensor->shape[1] != c->dim) {
        fprintf(stderr, "error: %s: vocab_size %d and dim %d, but tok_embeddings is %lld x %lld\n", path, vocab, c->dim,
                (long long)embed->tensor->shape[0], (long long)embed->tensor->shape[1]);
        goto done;
    }
    c->hidden_dim = (int)ffn;
    c->vocab_size = (int)embed->tensor->shape[0];
    c->head_dim = c->dim / c->n_heads;
    c->max_pos = theta > 10000.0 ? 16384 : 4096;
    c->norm_eps = (float)eps;
    c->rope_theta = (float)theta;
    c->init_std = 0.02f;
    rc = 0;
done:
    weights_close(&w);
    json_free(&j);
    return rc;
}

// The families read here are Llama's and Mistral's (transformers' LlamaConfig and
// MistralConfig, whose models compute the same layers); any setting of theirs
// that would change that computation beyond what this trainer implements is
// refused by name, and so is any other model_type, whose keys these classes
// would not even read (biases, norms of q and k, other activations...).
static int config_load(Config *c, const char *model_dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/params.json", model_dir);
    int meta = access(path, F_OK) == 0;
    snprintf(path, sizeof path, "%s/config.json", model_dir);
    if (meta && access(path, F_OK) != 0) return config_load_meta(c, model_dir); // Meta's original download
    JsonValue j;
    if (json_load_file(path, &j) != 0) return -1;
    int rc = -1;
    const char *s;
    double d;
    int b, mistral = 0;
    memset(c, 0, sizeof *c);
    if (j.type != JSON_OBJECT) { fprintf(stderr, "error: %s: not a JSON object\n", path); goto done; }
    if (json_get(&j, "model_type")) { // (test configs without one are read as Llama's)
        if (json_get_string(&j, "model_type", &s, NULL) != 0) { fprintf(stderr, "error: %s: 'model_type' must be a string\n", path); goto done; }
        mistral = strcmp(s, "mistral") == 0;
        if (!mistral && strcmp(s, "llama") != 0) {
            fprintf(stderr, "error: %s: model_type \"%s\" is not supported (llama and mistral are)\n", path, s);
            goto done;
        }
    }
    if (config_int(&j, path, "hidden_size", &c->dim, 1, 1, 1 << 16) ||
        config_int(&j, path, "intermediate_size", &c->hidden_dim, 1, 1, 1 << 18) ||
        config_int(&j, path, "num_hidden_layers", &c->n_layers, 1, 1, 1024) ||
        config_int(&j, path, "num_attention_heads", &c->n_heads, 1, 1, 1024) ||
        config_int(&j, path, "vocab_size", &c->vocab_size, 1, 1, 1 << 24)) goto done;
    // the defaults of transformers' LlamaConfig and MistralConfig
    c->n_kv_heads = mistral ? 8 : c->n_heads;
    c->head_dim = c->dim / c->n_heads;
    c->max_pos = mistral ? 131072 : 2048;
    if (config_int(&j, path, "num_key_value_heads", &c->n_kv_heads, 0, 1, c->n_heads) ||
        config_int(&j, path, "head_dim", &c->head_dim, 0, 2, 1 << 12) ||
        config_int(&j, path, "max_position_embeddings", &c->max_pos, 0, 1, 1 << 24)) goto done;
    // Mistral v0.1: "sliding_window": 4096; null (v0.2+) or absent (Llama): plain causal.
    // Absent from a Mistral config it is MistralConfig's default, 4096
    c->sliding_window = mistral && !json_get(&j, "sliding_window") ? 4096 : 0;
    if (config_int(&j, path, "sliding_window", &c->sliding_window, 0, 1, 1 << 30)) goto done;
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
    if (config_rope(c, &j, path) != 0) goto done;
    c->init_std = 0.02f; // transformers' LlamaConfig default
    if (json_get_number(&j, "initializer_range", &d) == 0) c->init_std = d > 0 && d <= 1e3 ? (float)d : -1.0f;
    if (!(c->init_std > 0)) { fprintf(stderr, "error: %s: initializer_range must be a number in (0, 1000]\n", path); goto done; }
    if (!(c->norm_eps > 0)) { fprintf(stderr, "error: %s: rms_norm_eps must be a positive finite number\n", path); goto done; }
    // (a value of the wrong type is refused as a value other than the one implemented)
    if (json_get(&j, "hidden_act") && (json_get_string(&j, "hidden_act", &s, NULL) != 0 || strcmp(s, "silu") != 0)) {
        fprintf(stderr, "error: %s: hidden_act \"%s\" is not supported (Llama uses silu)\n", path,
                json_get_string(&j, "hidden_act", &s, NULL) == 0 ? s : "(not a string)");
        goto done;
    }
    if ((json_get(&j, "attention_bias") && (json_get_bool(&j, "attention_bias", &b) != 0 || b)) ||
        (json_get(&j, "mlp_bias") && (json_get_bool(&j, "mlp_bias", &b) != 0 || b))) {
        fprintf(stderr, "error: %s: attention_bias / mlp_bias are not supported (Llama has no biases)\n", path); goto done;
    }
    // dropout on the attention probabilities while training: not implemented (peft's
    // lora_dropout is). pretraining_tp is ignored, as transformers 5 ignores it (4.x
    // only split the matmuls by it: the same maths).
    if (json_get(&j, "attention_dropout") && (json_get_number(&j, "attention_dropout", &d) != 0 || d != 0)) {
        fprintf(stderr, "error: %s: attention_dropout is not supported (only 0)\n", path); goto done;
    }
    c->tied = 0;
    if (json_get_bool(&j, "tie_word_embeddings", &b) == 0) c->tied = b;
    rc = 0;
done:
    json_free(&j);
    return rc;
}

// RoPE's inverse frequencies (hd/2 of them), in float32 op by op as transformers
// computes them (modeling_rope_utils.py), so that every angle is its angle. There a
// Python number meeting a float32 tensor is rounded to float32 first, and
// `number / tensor` is `number * (1 / tensor)`. The pow is libm's powf, correctly
// rounded, where torch's is within an ulp: a frequency here and there differs from
// torch's in its last bit (the 38th of 64 at theta 1e6: CodeLlama's, Mistral-v0.3's;
// none of Llama-2's or Llama-3's). rope_scale, from there on, gives torch's bits
// exactly (test/test_config.c), where each op rounds (f32_rounded).
static float rope_scale(const Config *c, float f) {
    float factor = (float)c->rope_factor;
    if (c->rope_type == ROPE_LINEAR) return f / factor;
    if (c->rope_type != ROPE_LLAMA3) return f;
    // wavelengths above original / low_freq_factor are divided by factor, those below
    // original / high_freq_factor kept, and those between blended smoothly
    double old = c->rope_original_max_pos, lo = c->rope_low_freq_factor, hi = c->rope_high_freq_factor;
    float wavelen = (1.0f / f) * (float)(2 * M_PI);
    float scaled = wavelen > (float)(old / lo) ? f / factor : f;
    float smooth = (f32_rounded((float)old * (1.0f / wavelen)) - (float)lo) / (float)(hi - lo);
    float blended = (1.0f - smooth) * scaled / factor + f32_rounded(smooth * scaled);
    return !(wavelen < (float)(old / hi)) && !(wavelen > (float)(old / lo)) ? blended : scaled;
}
static void rope_inv_freq(const Config *c, float *inv_freq) {
    for (int i = 0; i < c->head_dim / 2; i++)
        inv_freq[i] = rope_scale(c, 1.0f / powf(c->rope_theta, (float)(2 * i) / (float)c->head_dim));
}
// RoPE's cos and sin tables (T, hd/2), both trainers' (the GPU's copied to the device), in Hugging
// Face's rotate_half layout: pairs are (i, i + hd/2). The angles are computed in float32 as
// transformers does, so long positions round the same way, from the inverse frequencies inv_freq
// (hd/2) of rope_inv_freq.
static void rope_tables(float *cosb, float *sinb, int T, int hd, const float *inv_freq) {
    int half = hd / 2;
    for (int i = 0; i < half; i++) {
        for (int t = 0; t < T; t++) {
            float angle = (float)t * inv_freq[i];
            cosb[t * half + i] = cosf(angle);
            sinb[t * half + i] = sinf(angle);
        }
    }
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
// the widest of a layer's activations a position (D, H or NH hd): the scratch that any
// linear layer's input or output fits (LoRA's dropout, DoRA)
static size_t config_widest(const Config *c) {
    size_t D = c->dim, H = c->hidden_dim, Q = (size_t)c->n_heads * c->head_dim;
    return D > H ? (D > Q ? D : Q) : (H > Q ? H : Q);
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

// The flat layout of the units from `first` on: param_layout's order with the
// units before it left out, each tensor type holding layers first - 1 .. L - 1
// (first > 0: the embedding and layers 0 .. first - 2 are out). first = 0 is the
// whole model's layout; with the first units frozen (--freeze_layers) it is the
// layout of the trainable weights' gradients and moments.
static size_t param_numel_from(const Config *c, int first, int p) {
    if (p == P_HEAD && c->tied) return 0;
    if (p == P_EMBED) return first > 0 ? 0 : param_numel(c, p);
    if (!param_per_layer(p)) return param_numel(c, p);
    int skipped = first > 1 ? first - 1 : 0; // layers left out
    return param_numel(c, p) / c->n_layers * (size_t)(c->n_layers - skipped);
}
// where tensor j of unit u >= first starts in that layout: the map between a unit's
// flat buffer and the whole model's weights (first = 0), gradients, moments
static size_t model_tensor_offset_from(const Config *c, int first, int u, int j) {
    int p = u == 0 ? P_EMBED : u > c->n_layers ? (j ? P_HEAD : P_NORM) : P_ATTN_NORM + j;
    size_t off = 0;
    for (int q = 0; q < p; q++) off += param_numel_from(c, first, q);
    if (param_per_layer(p)) off += (size_t)(u - (first > 1 ? first : 1)) * (param_numel(c, p) / c->n_layers);
    return off;
}
static size_t model_tensor_offset(const Config *c, int u, int j) { return model_tensor_offset_from(c, 0, u, j); }
// the size of that layout
static size_t model_numel_from(const Config *c, int first) {
    size_t n = 0;
    for (int p = 0; p < NUM_PARAM_TENSORS; p++) n += param_numel_from(c, first, p);
    return n;
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
    float *shards;            // sharded (host_sharded): this rank's shard of every unit
                              // (units.shard_numel, fsdp.h's layout); NULL when whole, in a dry run,
                              // and where the backend keeps them (base_deferred)
    int full_finetune;        // train every weight (else LoRA on frozen weights)
    int frozen_units;         // full fine-tuning: units 0 .. frozen_units - 1 do not train (the
                              // embedding and the first --freeze_layers layers; 0: every unit trains)
    int use_lora;
    LoRA lora;                // adapters: shapes, targets, dropout flag, params (and grads)
    // QLoRA (--quantize): each decoder layer kept as one run of bytes (model_run_layout: its
    // linear weights in 4 bits, peft/quant.h, quantized as they load; its norms in fp32), a packed
    // unit (fsdp.h); its place in params is never written (its pages take no memory)
    int quant_type;           // QUANT_NONE, QUANT_NF4 or QUANT_FP4 (set before loading)
    int double_quant;         // (set before loading) the absmax values in 8 bits too
    int align_blocks;         // (set before loading) AdamW8bit's sharded full fine-tuning: shards of whole blocks (model_align_blocks)
    // the base weights read later, where the backend keeps them (model_stream_base: the CUDA
    // trainer's LoRA and full fine-tuning, sharded full fine-tuning's shards), not held here: from
    // the checkpoint folder base_dir, or drawn (random_init); or with base_resumed from a sharded
    // checkpoint, which a resume reads through shards_put
    int base_deferred, base_random, base_resumed;
    int saved_from_base;      // --trainable_params' copies start as the base's, which model_stream_base reads
    const char *base_dir;
    uint64_t base_seed;
    int base_keep;            // (set before model_stream_base) keep the source open after: model_base_read
    struct BaseSource *base;  // that source, open (NULL: none kept)
    // full fine-tuning's weights where the backend keeps them (base_deferred): elements [first,
    // first + count) of tensor j of unit u into dst (fsdp.h's FsdpReadFn), for a save; NULL: params
    FsdpReadFn weights_get;
    int (*weights_finite)(void *ctx); // 1 when every trainable weight it reads is finite (checked where they are)
    void *weights_ctx;
    // ... sharded: elements [first, first + count) of the rank's flat shard buffer (shards' layout)
    // from where the backend keeps them, and into it (a sharded checkpoint's "params": FsdpBuffer)
    StFillFn shards_get;
    FsdpPutFn shards_put;
    size_t run_offset[LAYER_TENSORS]; // where each tensor of a layer lies in the layer's run
    size_t run_bytes;         // one layer's run (the same for every layer)
    uint8_t *quant_bytes;     // whole: every layer's run, one after another (L * run_bytes)
    uint8_t *quant_shards;    // sharded: this rank's shard of every layer's run (units.packed_shard_bytes)
} HostModel;

// the units sharded over more than one rank: the base weights are this rank's shards
static int host_sharded(const HostModel *h) { return h->units.n_shards > 1; }
// a prefix's virtual positions ahead of every sequence in the KV carry (prefix tuning; 0: none)
static inline int host_prefix(const HostModel *h) { return h->use_lora ? h->lora.prefix : 0; }

static void model_base_free(HostModel *h);
static void host_model_free(HostModel *h) {
    model_base_free(h);
    free(h->quant_bytes);
    free(h->quant_shards);
    free(h->params);
    free(h->shards);
    fsdp_units_free(&h->units);
    lora_free(&h->lora); // a zeroed LoRA frees nothing
    memset(h, 0, sizeof *h);
}

// Where the host model holds the weights full fine-tuning trains (units frozen_units ..):
// this rank's shards of those units (one run of host.shards), the whole model (one run of
// host.params), or with frozen units a run of host.params per tensor type (its layers from
// the first trainable one). Run k starts at element first[k], count[k] long; returns the
// number of runs. Their gradients and moments lie one after another (when whole:
// model_tensor_offset_from's layout).
static int model_trainable_runs(const HostModel *h, size_t first[NUM_PARAM_TENSORS], size_t count[NUM_PARAM_TENSORS]) {
    const Config *c = &h->config;
    if (host_sharded(h) || !h->frozen_units) {
        first[0] = host_sharded(h) ? h->units.units[h->frozen_units].shard_offset : 0;
        count[0] = host_sharded(h) ? h->units.shard_numel - first[0] : h->num_params;
        return 1;
    }
    int n = 0;
    size_t off = 0; // where tensor type p starts in the whole layout
    for (int p = 0; p < NUM_PARAM_TENSORS; p++) {
        size_t keep = param_numel_from(c, h->frozen_units, p), whole = p == P_HEAD && c->tied ? 0 : param_numel(c, p);
        if (keep) {
            first[n] = off + (whole - keep); // the frozen layers come first
            count[n++] = keep;
        }
        off += whole;
    }
    return n;
}
// The trainable parameters' tensors in their flat order (the optimizer's: LoRA's layout,
// or model_trainable_runs' whole, the frozen units left out), their sizes into numel
// (when not NULL); returns how many. Not for a sharded model's shards, which cut tensors.
static int model_trainable_tensors(const HostModel *h, size_t *numel) {
    const Config *c = &h->config;
    int n = 0;
    if (h->use_lora) {
        const LoRA *l = &h->lora;
        for (int i = 0; i < l->n_layers; i++)
            for (int t = 0; t < LORA_N_TARGETS; t++) {
                if (!lora_trains(l, i, t)) continue;
                for (int k = 0; k < lora_n_kinds(l); k++, n++) // A, B, DoRA's m; IA3's vector
                    if (numel) numel[n] = lora_tensor_numel(l, t, k);
            }
        for (int k = 0; k < lora_n_saved(l); k++) { // --trainable_params', after the adapter
            int64_t one;
            if (!lora_saved(l, l->params, k, &one)) continue;
            if (numel) numel[n] = (size_t)one;
            n++;
        }
        return n;
    }
    for (int p = 0; p < NUM_PARAM_TENSORS; p++) {
        size_t keep = param_numel_from(c, h->frozen_units, p), one = param_per_layer(p) ? param_numel(c, p) / c->n_layers : keep;
        for (size_t k = 0; one && k < keep / one; k++, n++)
            if (numel) numel[n] = one;
    }
    return n;
}

// *t: the trainable tensors AdamW8bit lays its state out over (other optimizers: none),
// made again for this model (a plan before may have made them): the whole model's, or with
// rank >= 0 in sharded full fine-tuning the pieces of them in that rank's shards (each unit's
// shard and the tensors in it in order; the padding has no state)
static void model_optim_tensors(const HostModel *h, const OptimizerSettings *s, int rank, OptimTensors *t) {
    optim_tensors_free(t);
    if (s->kind != OPTIMIZER_ADAMW8BIT) return;
    if (rank < 0 || !host_sharded(h) || h->use_lora) {
        int n = model_trainable_tensors(h, NULL);
        size_t *numel = (size_t *)mallocCheck((size_t)n * sizeof(size_t) + 1);
        model_trainable_tensors(h, numel);
        optim_tensors_init(t, numel, NULL, NULL, n);
        free(numel);
        return;
    }
    const FsdpUnits *u = &h->units;
    int most = (u->n_units - h->frozen_units) * FSDP_UNIT_TENSORS_MAX, n = 0;
    size_t *numel = (size_t *)mallocCheck((size_t)most * sizeof(size_t) + 1), *first = (size_t *)mallocCheck((size_t)most * sizeof(size_t) + 1);
    uint8_t *quant = (uint8_t *)mallocCheck((size_t)most + 1);
    for (int i = h->frozen_units; i < u->n_units; i++) {
        const FsdpUnit *un = &u->units[i];
        size_t begin, count = fsdp_shard_range(un->numel, u->n_shards, u->align, rank, &begin);
        size_t base = un->shard_offset - u->units[h->frozen_units].shard_offset; // the unit's shard in the trainable run
        for (int j = 0; j < un->n_tensors; j++) {
            const FsdpTensor *tt = &un->tensors[j];
            size_t lo, k = range_overlap(begin, count, tt->offset, tt->numel, &lo);
            if (k) numel[n] = k, first[n] = base + (lo - begin), quant[n++] = (uint8_t)adamw8bit_quantized(tt->numel);
        }
    }
    optim_tensors_init(t, numel, first, quant, n);
    free(numel), free(first), free(quant);
}

// AdamW8bit's state part `part` (ADAMW8BIT_CODES, _ABSMAX or _FP32) of a unit: how many of
// its elements (the unit's tensors' in order) precede element x of the unit. An absmax
// counts once its block starts: model_align_blocks keeps a shard's blocks whole.
static size_t model_state_part(const FsdpUnit *un, int part, size_t x) {
    size_t n = 0;
    for (int j = 0; j < un->n_tensors && x > un->tensors[j].offset; j++) {
        const FsdpTensor *t = &un->tensors[j];
        size_t in = x - t->offset < t->numel ? x - t->offset : t->numel;
        int q = adamw8bit_quantized(t->numel);
        if (part == ADAMW8BIT_FP32 ? !q : q) n += part == ADAMW8BIT_ABSMAX ? (in + ADAMW8BIT_BLOCK - 1) / ADAMW8BIT_BLOCK : in;
    }
    return n;
}

// Sharded full fine-tuning with AdamW8bit: every shard a multiple of its blocks of 256, so
// that no block is cut between two ranks (each block's absmax is then one rank's), which
// holds when every 8-bit tensor starts at a multiple of 256 in its unit: true of every real
// Llama-family model (hidden sizes of multiples of 256), not of the smallest toy ones. Re-shards
// the units; 0 ok, -1 with a message naming the first tensor out of line.
static int model_align_blocks(HostModel *m, const char *dir) {
    FsdpUnits *u = &m->units;
    for (int i = 0; i < u->n_units; i++)
        for (int j = 0; j < u->units[i].n_tensors; j++) {
            const FsdpTensor *t = &u->units[i].tensors[j];
            if (!adamw8bit_quantized(t->numel) || t->offset % ADAMW8BIT_BLOCK == 0) continue;
            fprintf(stderr, "error: --optimizer adamw8bit with sharded full fine-tuning keeps each block of %d elements on one rank, "
                    "so every 8-bit tensor must start at a multiple of %d elements in its unit; %s's %s starts at element %zu of "
                    "unit %s (hidden_size %d is not a multiple of %d): train in one process, with --sharding_strategy NO_SHARD, "
                    "or with LoRA\n", ADAMW8BIT_BLOCK, ADAMW8BIT_BLOCK, dir, t->name, t->offset, u->units[i].name,
                    m->config.dim, ADAMW8BIT_BLOCK);
            return -1;
        }
    u->align = ADAMW8BIT_BLOCK;
    fsdp_units_set_shards(u, u->n_shards);
    return 0;
}

// how many weights train in full fine-tuning: whole, or this rank's shards of the trainable units
static size_t model_trainable_numel(const HostModel *h) {
    size_t first[NUM_PARAM_TENSORS], count[NUM_PARAM_TENSORS], n = 0;
    for (int r = model_trainable_runs(h, first, count) - 1; r >= 0; r--) n += count[r];
    return n;
}

// ----------------------------------------------------------------------------
// QLoRA: which weights are kept in 4 bits, and where

// is tensor j of unit u kept in 4 bits: the seven linear weights of a decoder layer
static int model_quantized(const HostModel *m, int u, int j) {
    static const int target[LAYER_TENSORS] = {-1, LORA_Q, LORA_K, LORA_V, LORA_O, -1, LORA_GATE, LORA_UP, LORA_DOWN};
    return m->quant_type != QUANT_NONE && u >= 1 && u <= m->config.n_layers && target[j] >= 0;
}

// The run of a decoder layer: its tensors in the unit's order, each at a multiple of 16
// bytes, a norm as fp32 and a linear weight as quant_layout lays it out (codes and
// statistics). Sets m->run_offset and m->run_bytes, and makes every layer unit a packed
// unit of that many bytes (re-sharding the units).
static void model_run_layout(HostModel *m) {
    const FsdpUnit *un = &m->units.units[fsdp_layer_unit(0)];
    size_t off = 0;
    for (int j = 0; j < un->n_tensors; j++) {
        QuantTensor q;
        m->run_offset[j] = off;
        off += model_quantized(m, fsdp_layer_unit(0), j) ? quant_layout(&q, m->quant_type, m->double_quant, un->tensors[j].numel, NULL)
                                                        : (un->tensors[j].numel * sizeof(float) + 15) / 16 * 16;
    }
    m->run_bytes = off;
    for (int l = 0; l < m->config.n_layers; l++) m->units.units[fsdp_layer_unit(l)].packed = off;
    fsdp_units_set_shards(&m->units, m->units.n_shards);
}

// the bytes of tensor j in a layer's run
static size_t model_run_tensor_bytes(const HostModel *m, int j) {
    return (j + 1 < LAYER_TENSORS ? m->run_offset[j + 1] : m->run_bytes) - m->run_offset[j];
}

// weight j (model_quantized) of the layer whose run starts at run (host or device memory)
static QuantTensor model_run_tensor(const HostModel *m, uint8_t *run, int j) {
    QuantTensor q;
    quant_layout(&q, m->quant_type, m->double_quant, m->units.units[fsdp_layer_unit(0)].tensors[j].numel, run + m->run_offset[j]);
    return q;
}

// the elements of a decoder layer's biggest weight
static size_t model_layer_widest(const HostModel *m) {
    const FsdpUnit *u = &m->units.units[fsdp_layer_unit(0)];
    size_t n = 0;
    for (int j = 0; j < u->n_tensors; j++) n = u->tensors[j].numel > n ? u->tensors[j].numel : n;
    return n;
}

// the weights kept in runs (0 without QLoRA): every decoder layer's
static size_t model_packed_numel(const HostModel *m) {
    return m->quant_type == QUANT_NONE ? 0 : (size_t)m->config.n_layers * m->units.units[fsdp_layer_unit(0)].numel;
}

// the runs' bytes a rank holds: every layer's whole, or its shards of them (a backend's
// slots, which gather units whole, count apart)
static size_t model_run_bytes_held(const HostModel *m) {
    if (m->quant_type == QUANT_NONE) return 0;
    return m->units.n_shards == 1 ? (size_t)m->config.n_layers * m->run_bytes : m->units.packed_shard_bytes;
}

// the scratch the CPU dequantizes a layer into: the layer unit whole (fp32), and the
// absmax values of its biggest weight
static size_t model_quant_scratch_bytes(const HostModel *m) {
    size_t blocks = (model_layer_widest(m) + QUANT_BLOCK - 1) / QUANT_BLOCK;
    return (m->units.units[fsdp_layer_unit(0)].numel + blocks) * sizeof(float);
}

// the base weights' bytes in host memory: fp32 (whole, or this rank's shards), and with
// QLoRA the layers' runs held (model_run_bytes_held) and the dequantize scratch
static inline size_t model_weight_bytes(const HostModel *m) {
    size_t fp32 = m->units.n_shards > 1 ? m->units.shard_numel : m->num_params - model_packed_numel(m);
    if (m->quant_type == QUANT_NONE) return fp32 * sizeof(float);
    return fp32 * sizeof(float) + model_run_bytes_held(m) + model_quant_scratch_bytes(m);
}

// tensor j of a decoder layer (w, read whole by the caller) as its run holds it, into at
// (model_run_tensor_bytes): quantized, or a norm copied. absmax: quant_tensor's scratch.
// 0 ok, -1 with a message.
static int model_run_put(const HostModel *m, uint8_t *at, int j, const float *w, float *absmax, const char *name) {
    size_t numel = m->units.units[fsdp_layer_unit(0)].tensors[j].numel;
    memset(at, 0, model_run_tensor_bytes(m, j)); // (the padding)
    if (!model_quantized(m, fsdp_layer_unit(0), j)) { memcpy(at, w, numel * sizeof(float)); return 0; }
    QuantTensor q;
    quant_layout(&q, m->quant_type, m->double_quant, numel, at);
    return quant_tensor(&q, w, absmax, name);
}

// A checkpoint that bitsandbytes already quantized (transformers' save_pretrained of
// a 4-bit model: uint8 weights with .absmax, .quant_map, .quant_state... beside them)
// is refused by the name of such a tensor. 0 ok, -1 with a message.
static int model_check_not_prequantized(const Weights *sm) {
    static const char *marks[] = {".absmax", ".quant_map", ".quant_state.", ".nested_absmax", ".nested_quant_map"};
    for (int i = 0; i < sm->n_entries; i++)
        for (size_t k = 0; k < sizeof marks / sizeof marks[0]; k++)
            if (strstr(sm->entries[i].name, marks[k])) {
                fprintf(stderr, "error: %s: tensor '%s' is bitsandbytes' quantization state: checkpoints saved "
                        "already quantized are not read; give the original checkpoint (F32, BF16 or F16) and "
                        "--quantize nf4 to quantize it as it loads\n", sm->dir, sm->entries[i].name);
                return -1;
            }
    return 0;
}

// config.json's model (of dir) as units sharded n ways, with QLoRA's layers packed into
// runs, and AdamW8bit's blocks whole in each shard. 0 ok, -1 with a message.
static int model_shape_units(HostModel *m, const char *dir, int n) {
    model_units(&m->config, &m->units, n);
    m->num_params = m->units.numel;
    if (m->quant_type != QUANT_NONE) model_run_layout(m);
    return m->align_blocks && n > 1 ? model_align_blocks(m, dir) : 0;
}

// config.json, and the checkpoint's tensors opened and checked against the
// model's units (sharded n ways): every tensor present with its shape and a
// float dtype, nothing beyond them (fsdp_check_model). Reads no weights, so
// a config.json claiming terabytes allocates nothing. 0 ok, -1 with a message.
static int model_open(HostModel *m, const char *dir, Weights *sm, int n_shards) {
    if (config_load(&m->config, dir) != 0 || model_shape_units(m, dir, n_shards) != 0) return -1;
    if (weights_open(sm, dir) != 0) return -1;
    if (model_check_not_prequantized(sm) == 0 && fsdp_check_model(&m->units, sm) == 0) return 0;
    weights_close(sm);
    return -1;
}

// every tensor of the whole model into m->params (allocated here, in the layout
// of ParameterTensors), tensor by tensor through read (fsdp.h's FsdpReadFn: the
// checkpoint's bytes, or random weights), with a progress bar saying what. With
// m->quant_type a decoder layer's tensors are read one at a time into a scratch
// and put from there into the layer's run in m->quant_bytes (quantized, the linear
// weights); their place in params stays untouched.
static int model_fill(HostModel *m, const char *what, FsdpReadFn read, void *ctx) {
    const Config *c = &m->config;
    m->params = (float *)mallocCheck(m->num_params * sizeof(float));
    param_layout(c, &m->w, m->params);
    float *scratch = NULL, *absmax = NULL;
    if (m->quant_type != QUANT_NONE) {
        m->quant_bytes = (uint8_t *)mallocCheck((size_t)c->n_layers * m->run_bytes);
        size_t widest = model_layer_widest(m);
        scratch = (float *)mallocCheck(widest * sizeof(float));
        absmax = (float *)mallocCheck((widest + QUANT_BLOCK - 1) / QUANT_BLOCK * sizeof(float));
    }
    Progress bar = progress_begin(stderr, what, m->num_params / 1e6, "M params");
    double done = 0; // parameters filled so far
    int rc = 0;
    for (int i = 0; i < m->units.n_units && rc == 0; i++)
        for (int j = 0; j < m->units.units[i].n_tensors && rc == 0; j++) {
            const FsdpTensor *t = &m->units.units[i].tensors[j];
            int packed = m->units.units[i].packed != 0;
            rc = read(ctx, i, j, 0, t->numel, packed ? scratch : m->params + model_tensor_offset(c, i, j));
            if (rc == 0 && packed)
                rc = model_run_put(m, m->quant_bytes + (size_t)(i - 1) * m->run_bytes + m->run_offset[j], j, scratch, absmax, t->name);
            progress_update(&bar, (done += (double)t->numel) / 1e6);
        }
    if (rc == 0) progress_end(&bar, m->num_params / 1e6);
    free(scratch), free(absmax);
    return rc;
}

// Sharded QLoRA: shard `rank` of every layer's run into m->quant_shards (allocated here;
// fsdp.h's packed units: bytes [rank * Sb, (rank + 1) * Sb) of each run, zero-padded).
// A tensor that overlaps those bytes is read whole through read and put into its form
// (quantizing needs the whole tensor: double quantization subtracts the mean of all its
// absmax values), and the overlap kept: a rank quantizes about 1/n of the model, and
// holds 1/n of it. 0 ok, -1 with a message.
static int model_fill_packed(HostModel *m, int rank, FsdpReadFn read, void *ctx) {
    const FsdpUnits *u = &m->units;
    m->quant_shards = (uint8_t *)callocCheck(u->packed_shard_bytes, 1);
    size_t widest = model_layer_widest(m), most = 0;
    for (int j = 0; j < LAYER_TENSORS; j++) most = model_run_tensor_bytes(m, j) > most ? model_run_tensor_bytes(m, j) : most;
    float *scratch = (float *)mallocCheck(widest * sizeof(float));
    float *absmax = (float *)mallocCheck((widest + QUANT_BLOCK - 1) / QUANT_BLOCK * sizeof(float));
    uint8_t *piece = (uint8_t *)mallocCheck(most); // one tensor in its run's form
    int rc = 0;
    for (int i = 0; i < u->n_units && rc == 0; i++) {
        const FsdpUnit *un = &u->units[i];
        size_t begin = (size_t)rank * un->packed_shard, end = begin + un->packed_shard;
        end = end < un->packed ? end : un->packed;
        for (int j = 0; un->packed && j < un->n_tensors && rc == 0; j++) {
            size_t lo = begin > m->run_offset[j] ? begin : m->run_offset[j];
            size_t hi = end < m->run_offset[j] + model_run_tensor_bytes(m, j) ? end : m->run_offset[j] + model_run_tensor_bytes(m, j);
            if (lo >= hi) continue;
            rc = read(ctx, i, j, 0, un->tensors[j].numel, scratch);
            if (rc == 0) rc = model_run_put(m, piece, j, scratch, absmax, un->tensors[j].name);
            if (rc == 0) memcpy(m->quant_shards + un->packed_offset + (lo - begin), piece + (lo - m->run_offset[j]), hi - lo);
        }
    }
    free(scratch), free(absmax), free(piece);
    return rc;
}

// config.json and the base weights of a checkpoint folder into h, whole: the
// case of one shard of model_load_shard, in the layout of ParameterTensors.
// (h->params is allocated only once every tensor checked out; the caller frees
// h, also after a failure.) 0 ok, -1 with a message naming the file.
static int model_load(HostModel *m, const char *dir) {
    Weights sm;
    if (model_open(m, dir, &sm, 1) != 0) return -1;
    FsdpCheckpoint r = {&m->units, &sm};
    int rc = model_fill(m, "loading the weights", fsdp_read_checkpoint, &r);
    if (rc == 0 && m->config.tied) rc = fsdp_check_tied_head(&sm, 0, m->units.units[0].numel, m->w.embed);
    weights_close(&sm);
    return rc;
}

// --pure_bf16: the base weights (whole, or this rank's shard) rounded to bf16 in their
// floats, as llama-recipes' model.to(torch.bfloat16) rounds them
static void model_round_bf16(HostModel *h) {
    float *w = host_sharded(h) ? h->shards : h->params;
    round_bf16(w, host_sharded(h) ? h->units.shard_numel : h->num_params);
}

// config.json and shard `rank` of n of every unit of a checkpoint folder into
// h->shards: only those bytes are read, so no rank ever holds the whole model.
// 0 ok, -1 with a message naming the file.
static int model_load_shard(HostModel *m, const char *dir, int rank, int n) {
    Weights sm;
    if (model_open(m, dir, &sm, n) != 0) return -1;
    m->shards = (float *)mallocCheck(m->units.shard_numel * sizeof(float));
    int rc = fsdp_load_model(&m->units, &sm, rank, m->shards);
    FsdpCheckpoint r = {&m->units, &sm};
    if (rc == 0 && m->quant_type != QUANT_NONE) rc = model_fill_packed(m, rank, fsdp_read_checkpoint, &r);
    weights_close(&sm);
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

// config.json of dir into h and the model's shape (units sharded n ways), with alloc
// room for its weights but nothing read into them (zeroed): this rank's shards (n > 1),
// or the whole model's in ParameterTensors' layout. For weights that come from
// elsewhere: random ones, or a sharded checkpoint that a resume reads; without alloc,
// for a dry run, whose plan needs the shapes alone. 0 ok, -1 with a message.
static int model_shape(HostModel *m, const char *dir, int n, int alloc) {
    if (config_load(&m->config, dir) != 0 || model_shape_units(m, dir, n) != 0) return -1;
    if (alloc && n > 1) m->shards = (float *)callocCheck(m->units.shard_numel, sizeof(float));
    else if (alloc) param_layout(&m->config, &m->w, m->params = (float *)callocCheck(m->num_params, sizeof(float)));
    return 0;
}

// a dry run's model_load: config.json and the checkpoint's tensors checked as
// model_open checks them (sharded n ways), nothing allocated or read. 0 ok, -1 with a message.
static int model_check(HostModel *m, const char *dir, int n) {
    Weights sm;
    if (model_open(m, dir, &sm, n) != 0) return -1;
    weights_close(&sm);
    return 0;
}

// config.json of dir into h, and its weights drawn as above: whole (n = 1, into
// h->params) or shard `rank` of n of every unit (into h->shards), as model_load
// and model_load_shard would read a checkpoint. With draw 0 (a dry run, whose
// plan needs only the shapes) nothing is drawn or allocated: a 7B model's plan
// takes no memory. 0 ok, -1 with a message.
static int model_init_random(HostModel *m, const char *dir, uint64_t seed, int rank, int n, int draw) {
    if (model_shape(m, dir, n, draw && n > 1) != 0) return -1; // (whole: model_fill allocates)
    RandomWeights r = {&m->units, seed, m->config.init_std};
    if (!draw) return 0;
    if (n == 1) return model_fill(m, "drawing random weights", random_tensor, &r);
    int rc = fsdp_read_shard(&m->units, rank, m->shards, random_tensor, &r);
    return rc == 0 && m->quant_type != QUANT_NONE ? model_fill_packed(m, rank, random_tensor, &r) : rc;
}

// Where a model's base weights come from when they are read after the model is set up
// (base_deferred): the checkpoint folder, opened again and checked against the units, or
// the random draw. read(ctx, ...) reads a tensor's elements as model_fill takes them.
typedef struct BaseSource { Weights sm; FsdpCheckpoint ck; RandomWeights rw; int open; FsdpReadFn read; void *ctx; } BaseSource;
static int model_base_open(const HostModel *m, BaseSource *b) {
    memset(b, 0, sizeof *b);
    if (m->base_random) {
        b->rw = (RandomWeights){&m->units, m->base_seed, m->config.init_std};
        b->read = random_tensor, b->ctx = &b->rw;
        return 0;
    }
    if (weights_open(&b->sm, m->base_dir) != 0) return -1;
    b->open = 1;
    if (fsdp_check_model(&m->units, &b->sm) != 0) { weights_close(&b->sm); return -1; }
    b->ck = (FsdpCheckpoint){&m->units, &b->sm};
    b->read = fsdp_read_checkpoint, b->ctx = &b->ck;
    return 0;
}
static void model_base_close(BaseSource *b) {
    if (b->open) weights_close(&b->sm);
}
static void model_base_free(HostModel *h) {
    if (h->base) model_base_close(h->base);
    free(h->base);
    h->base = NULL;
}
// elements [first, first + count) of tensor j of unit u of the base weights, from the source
// model_stream_base kept open (base_keep: the files stay readable when a later checkpoint
// rotation deletes them). 0 ok, -1 with a message.
static int model_base_read(const HostModel *m, int u, int j, size_t first, size_t count, float *dst) {
    return m->base->read(m->base->ctx, u, j, first, count, dst);
}

// --trainable_params: which saved tensor (lora_saved's k) tensor j of unit u is, -1 none: the
// embedding, a layer's two norms (P_ATTN_NORM, P_MLP_NORM), the final norm
static int model_saved_index(const HostModel *h, int u, int j) {
    int L = h->config.n_layers;
    if (u == 0) return 0;
    if (u > L) return j == 0 ? 1 + 2 * L : -1; // the head unit: the norm, lm_head
    int p = P_ATTN_NORM + j; // a layer unit's tensors in enum order
    return p == P_ATTN_NORM ? 1 + 2 * (u - 1) : p == P_MLP_NORM ? 2 + 2 * (u - 1) : -1;
}

// the part of tensor j of unit u that rank holds: its elements [*first, *first + count) (count
// returned, 0 when none), at *at of the base weights it holds: the whole model's layout
// (model_tensor_offset), or with its units sharded (host_sharded) the rank's flat shard buffer
static size_t model_tensor_part(const HostModel *m, int u, int j, int rank, size_t *first, size_t *at) {
    if (host_sharded(m)) return fsdp_tensor_shard(&m->units, u, j, rank, first, at);
    *first = 0, *at = model_tensor_offset(&m->config, u, j);
    return m->units.units[u].tensors[j].numel;
}

// The base weights of a model set up without them (base_deferred), or with its units sharded
// (host_sharded) shard `rank` of each, a piece of at most MODEL_STREAM_PIECE elements at a
// time, each handed to put(put_ctx, unit, tensor, first, count, src) and its buffer reused
// after: the CUDA trainer uploads them, so the model (the rank's shard) is never whole in host
// memory (a tied model's embedding, or the rank's part of it, is read whole, to check a stored
// lm_head against it, as model_load and fsdp_load_model do). With saved_from_base the trained
// copies of --trainable_params start as the pieces they read (model_saved_copy's, streamed). With
// base_keep the source stays open after (model_base_read). 0 ok, -1 with a message.
#define MODEL_STREAM_PIECE ((size_t)1 << 24)
typedef void (*ModelPutFn)(void *ctx, int unit, int tensor, size_t first, size_t count, const float *src);
static int model_stream_base(HostModel *m, int rank, ModelPutFn put, void *put_ctx) {
    BaseSource *b = (BaseSource *)mallocCheck(sizeof *b);
    if (model_base_open(m, b) != 0) { free(b); return -1; }
    float *piece = (float *)mallocCheck(MODEL_STREAM_PIECE * sizeof(float));
    double total = (double)(host_sharded(m) ? m->units.shard_numel : m->num_params), done = 0;
    Progress bar = progress_begin(stderr, "loading the weights", total / 1e6, "M params");
    int rc = 0;
    for (int i = 0; i < m->units.n_units && rc == 0; i++)
        for (int j = 0; j < m->units.units[i].n_tensors && rc == 0; j++) {
            size_t lo, at, n = model_tensor_part(m, i, j, rank, &lo, &at); // its elements [lo, lo + n) on this rank
            int whole = i == 0 && m->config.tied && b->open; // the embedding, which a stored lm_head must equal
            float *buf = whole ? (float *)mallocCheck(n * sizeof(float) + 1) : piece;
            size_t step = whole ? n : MODEL_STREAM_PIECE;
            for (size_t first = lo; first < lo + n && rc == 0; first += step) {
                size_t count = lo + n - first < step ? lo + n - first : step;
                rc = b->read(b->ctx, i, j, first, count, buf);
                if (rc == 0 && whole) rc = fsdp_check_tied_head(&b->sm, lo, n, buf);
                if (rc == 0) put(put_ctx, i, j, first, count, buf);
                float *saved = m->saved_from_base ? lora_saved(&m->lora, m->lora.params, model_saved_index(m, i, j), NULL) : NULL;
                if (rc == 0 && saved) memcpy(saved + first, buf, count * sizeof(float));
                progress_update(&bar, (done += (double)count) / 1e6);
            }
            if (whole) free(buf);
        }
    if (rc == 0) progress_end(&bar, total / 1e6);
    free(piece);
    if (rc == 0 && m->base_keep) m->base = b;
    else model_base_close(b), free(b);
    return rc;
}

// the base weights of a model set up without them, whole into m->params (model_fill): for
// what needs them on the host once, a merged export. 0 ok, -1 with a message.
static int model_load_base(HostModel *m, const char *what) {
    BaseSource b;
    if (model_base_open(m, &b) != 0) return -1;
    int rc = model_fill(m, what, b.read, b.ctx);
    model_base_close(&b);
    return rc;
}

// unit u >= first, whole (unit, its flat buffer) into the flat layout dst of the units from
// first on (model_tensor_offset_from: the whole model's weights with first = 0; gradients or
// moments, with first = frozen_units)
static void model_put_unit(const HostModel *m, int first, int u, const float *unit, float *dst) {
    const FsdpUnit *un = &m->units.units[u];
    for (int j = 0; j < un->n_tensors; j++)
        memcpy(dst + model_tensor_offset_from(&m->config, first, u, j), unit + un->tensors[j].offset,
               un->tensors[j].numel * sizeof(float));
}

// the shortest decimal that reads back as x (1e-05, not 9.99999975e-06)
static void float_text(char *buf, size_t n, float x) {
    for (int digits = 1; digits <= 9; digits++) {
        snprintf(buf, n, "%.*g", digits, (double)x);
        if (strtof(buf, NULL) == x) return;
    }
}

// the number x was written as, in double (0.9 for 0.9f): the Python float a script passes
static double float_decimal(float x) {
    char buf[32];
    float_text(buf, sizeof buf, x);
    return strtod(buf, NULL);
}

// c as the config.json transformers' LlamaConfig would write for it, for a model
// read from a folder without one (Meta's original layout, whose params.json
// transformers' converter turns into this), into buf; its length
static int config_json(const Config *c, char *buf, size_t size) {
    char eps[32], theta[32], rope[256] = "";
    float_text(eps, sizeof eps, c->norm_eps);
    float_text(theta, sizeof theta, c->rope_theta);
    if (c->rope_type == ROPE_LINEAR) snprintf(rope, sizeof rope, "  \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": %.17g},\n", c->rope_factor);
    if (c->rope_type == ROPE_LLAMA3)
        snprintf(rope, sizeof rope, "  \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": %.17g, \"low_freq_factor\": %.17g, "
                 "\"high_freq_factor\": %.17g, \"original_max_position_embeddings\": %d},\n",
                 c->rope_factor, c->rope_low_freq_factor, c->rope_high_freq_factor, c->rope_original_max_pos);
    return snprintf(buf, size,
                     "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\",\n  \"bos_token_id\": 1,\n"
                     "  \"eos_token_id\": 2,\n  \"hidden_act\": \"silu\",\n  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n"
                     "  \"num_hidden_layers\": %d,\n  \"num_attention_heads\": %d,\n  \"num_key_value_heads\": %d,\n  \"head_dim\": %d,\n"
                     "  \"vocab_size\": %d,\n  \"max_position_embeddings\": %d,\n  \"rms_norm_eps\": %s,\n  \"rope_theta\": %s,\n%s"
                     "  \"tie_word_embeddings\": %s\n}\n",
                     c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim, c->vocab_size, c->max_pos, eps,
                     theta, rope, c->tied ? "true" : "false");
}
static int config_save(const Config *c, const char *path) {
    char buf[2048];
    return write_bytes_atomic(path, buf, (size_t)config_json(c, buf, sizeof buf));
}

// model_dir's config.json parsed into out, or where it has none (Meta's layout) the one
// config_save would write for c. 0 ok, -1 with a message.
static int config_json_load(const Config *c, const char *model_dir, JsonValue *out) {
    char path[4096], buf[2048], err[256];
    snprintf(path, sizeof path, "%s/config.json", model_dir);
    if (access(path, F_OK) == 0) return json_load_file(path, out);
    if (json_parse(buf, (size_t)config_json(c, buf, sizeof buf), out, err, sizeof err) == 0) return 0;
    fprintf(stderr, "error: the config.json written for %s: %s\n", model_dir, err);
    return -1;
}

// full fine-tuning output: a Hugging Face folder (config.json, copied from the
// input's or else written from the model's, and the tokenizer, tokenizer.model or
// tokenizer.json, copied from the inputs, model.safetensors in F32 with the
// standard names, from m->params or, where the backend keeps the weights, weights_get)
static int copy_file(const char *from, const char *to) {
    size_t len;
    char *buf = read_file(from, &len);
    if (!buf) { fprintf(stderr, "error: cannot read '%s': %s\n", from, strerror(errno)); return -1; }
    int rc = write_bytes_atomic(to, buf, len);
    free(buf);
    return rc;
}

// the unit u and its tensor j that holds layer l of tensor type p (model_units' order)
static void param_unit(const Config *c, int p, int l, int *u, int *j) {
    *u = p == P_EMBED ? 0 : param_per_layer(p) ? 1 + l : c->n_layers + 1;
    *j = param_per_layer(p) ? p - P_ATTN_NORM : p == P_HEAD;
}
// a tensor of a model whose weights the backend keeps (weights_get), written a staging buffer at a time (StFillFn)
typedef struct { const HostModel *m; int u, j; } TensorRef;
static int tensor_fill(void *ctx, size_t first, size_t count, void *dst) {
    const TensorRef *r = (const TensorRef *)ctx;
    return r->m->weights_get(r->m->weights_ctx, r->u, r->j, first, count, (float *)dst);
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
    TensorRef *refs = (TensorRef *)callocCheck(cap, sizeof(TensorRef));
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
            if (m->params) ts[n].data = ptrs[p] + (size_t)l * rows * cols;
            else { // (the backend's: read back as it is written)
                refs[n].m = m;
                param_unit(c, p, l, &refs[n].u, &refs[n].j);
                ts[n].fill = tensor_fill, ts[n].ctx = &refs[n];
            }
        }
    }
    char path[4096], from[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    const char *meta[2] = {"format", "pt"};
    int rc = st_write(path, ts, n, meta, 1);
    free(ts); free(refs); free(names);
    snprintf(from, sizeof from, "%s/config.json", model_dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (rc == 0) rc = access(from, F_OK) == 0 ? copy_file(from, path) : config_save(c, path);
    size_t tl;
    char *tok = read_file(tokpath, &tl); // its format names the copy
    snprintf(path, sizeof path, "%s/%s", dir, tok && tokenizer_is_json(tokpath, (unsigned char *)tok, tl) ? "tokenizer.json" : "tokenizer.model");
    free(tok);
    if (rc == 0) rc = copy_file(tokpath, path);
    return rc;
}

// QLoRA: every decoder layer's run (whole, m->quant_bytes) into its place in m->params, the
// linear weights dequantized as bitsandbytes' dequantize_4bit gives them (what the forward
// computes with) and the norms copied: params then holds the whole model in fp32
static void model_dequantize_layers(HostModel *m) {
    const Config *c = &m->config;
    size_t blocks = (model_layer_widest(m) + QUANT_BLOCK - 1) / QUANT_BLOCK;
    float *absmax = (float *)mallocCheck((blocks ? blocks : 1) * sizeof(float));
    for (int l = 0; l < c->n_layers; l++) {
        int u = fsdp_layer_unit(l);
        uint8_t *run = m->quant_bytes + (size_t)l * m->run_bytes;
        for (int j = 0; j < m->units.units[u].n_tensors; j++) {
            float *dst = m->params + model_tensor_offset(c, u, j);
            if (!model_quantized(m, u, j)) { memcpy(dst, run + m->run_offset[j], m->units.units[u].tensors[j].numel * sizeof(float)); continue; }
            QuantTensor q = model_run_tensor(m, run, j);
            dequant_tensor(&q, dst, absmax);
        }
    }
    free(absmax);
}

// --trainable_params: the trained copies (lora_saved) from the base weights (dir > 0: where
// they start) or into them (dir < 0: a merged model holds the trained ones)
static void model_saved_copy(HostModel *h, int dir) {
    LoRA *l = &h->lora;
    for (int u = 0; u < h->units.n_units; u++)
        for (int j = 0; j < h->units.units[u].n_tensors; j++) {
            float *s = lora_saved(l, l->params, model_saved_index(h, u, j), NULL);
            if (!s) continue;
            float *w = h->params + model_tensor_offset(&h->config, u, j);
            size_t n = h->units.units[u].tensors[j].numel;
            if (dir > 0) memcpy(s, w, n * sizeof(float));
            else memcpy(w, s, n * sizeof(float));
        }
}
// base + LoRA as one model, in m->params (whole): W += scale * B @ A in every adapted
// layer, on the host (it runs once, after training). Each element sums its r products in
// order from zero and is then added to W, as the CPU matmul does. DoRA then rescales each
// row of it to its magnitude, as peft's merge does; IA3 scales W's columns by a feedforward
// module's vector, else its rows (peft's torch.mul of W by the vector). QLoRA's layers are
// dequantized into params first (the runs stay the model's base). Returns what
// model_unmerge_adapter needs to restore the base: a copy of the weights (NULL with QLoRA,
// whose params nothing else reads, and without keep: the caller drops params after).
static float *model_merge_adapter(HostModel *m, int keep) {
    Config *c = &m->config;
    LoRA *l = &m->lora;
    float *w[NUM_PARAM_TENSORS];
    param_tensors(&m->w, w);
    int map[LORA_N_TARGETS] = {P_WQ, P_WK, P_WV, P_WO, P_WGATE, P_WUP, P_WDOWN};
    float *saved = NULL;
    if (m->quant_type != QUANT_NONE) model_dequantize_layers(m);
    else if (keep) {
        saved = (float *)mallocCheck(m->num_params * sizeof(float));
        memcpy(saved, m->params, m->num_params * sizeof(float));
    }
    for (int i = 0; i < c->n_layers; i++)
        for (int t = 0; t < LORA_N_TARGETS; t++) {
            if (!(l->targets & (1u << t))) continue;
            if (l->ia3) {
                float *W = w[map[t]] + (size_t)i * l->out[t] * l->in[t]; // (out, in)
                const float *vec = ia3_vector(l, l->params, i, t);
                int ff = ia3_feedforward(l, t);
                for (int o = 0; o < l->out[t]; o++)
                    for (int k = 0; k < l->in[t]; k++) W[(size_t)o * l->in[t] + k] *= vec[ff ? k : o];
                continue;
            }
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
                    float *row = W + (size_t)o * in;
                    for (int k = 0; k < in; k++) row[k] += acc[k];
                    if (l->use_dora) { // as peft's merge: the row rescaled by m / ||W + scale B A||
                        double ss = 0;
                        for (int k = 0; k < in; k++) ss += (double)row[k] * row[k];
                        float f = lora_mag(l, l->params, i, t)[o] / (float)sqrt(ss);
                        for (int k = 0; k < in; k++) row[k] *= f;
                    }
                }
                free(acc);
            }
        }
    model_saved_copy(m, -1);
    return saved;
}
static void model_unmerge_adapter(HostModel *m, float *saved) {
    if (saved) memcpy(m->params, saved, m->num_params * sizeof(float));
    free(saved);
}

#endif
