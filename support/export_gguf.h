// The trained model as GGUF for llama.cpp and ollama (docs/export.md): the Llama mapping
// onto support/gguf.h's format. What is written is what llama.cpp's own converter
// (convert_hf_to_gguf.py, LlamaModel; convert_lora_to_gguf.py for adapters) writes from
// the Hugging Face folder of the same model (--merge_adapter's or full fine-tuning's output),
// and nothing else (dev/reference/check_gguf.py compares the two, key by key, tensor by tensor):
//
//   metadata  general.architecture "llama", general.type "model", llama.block_count,
//             embedding_length, feed_forward_length, attention.head_count, rope.dimension_count
//             (head_dim), llama.vocab_size, general.file_type, general.quantization_version 2;
//             and where config.json has the key behind it (as the converter reads it):
//             context_length (max_position_embeddings), attention.head_count_kv,
//             rope.freq_base (rope_theta), attention.layer_norm_rms_epsilon (rms_norm_eps),
//             attention.key_length / value_length (head_dim), rope.scaling.type "linear" and
//             rope.scaling.factor (linear RoPE scaling). Llama-3's RoPE scaling is the tensor
//             rope_freqs (a divisor per frequency pair), as the converter computes it in fp32;
//             plain RoPE has none. (Not written: general.name and general.size_label, which the
//             converter guesses from the folder's name; Mistral's sliding_window, which the
//             converter does not write either: llama.cpp then attends to every position.)
//   vocabulary  support/gguf_vocab.h's (LlamaModel.set_vocab): the tokenizer.* keys and the chat template.
//   tensors   token_embd, blk.N.attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm,
//             ffn_gate, ffn_up, ffn_down, output_norm, output (untied only), each ".weight",
//             ne = {in, out}; the rows of q and k permuted from Hugging Face's rotate-half
//             layout to llama.cpp's interleaved pairs (LlamaModel.permute: within each head,
//             row 2i + j of the output is row j * hd/2 + i). 1-D tensors (the norms,
//             rope_freqs) stay F32; the others are --gguf_type's, except that Q8_0 falls back
//             to F16 where a row is not a multiple of 32 (as the converter does). The
//             k-quants (q4_k_m, q5_k_m, q6_k) are what llama-quantize writes from the f32 file
//             (gguf_kquant_type's types, support/kquants.h's blocks, general.file_type the
//             only key that differs from the f32 file's; dev/reference/check_kquants.py).
//   adapter   general.architecture "llama", general.type "adapter", adapter.type "lora",
//             adapter.lora.alpha (f32), general.quantization_version; blk.N.<name>.weight.lora_a
//             (ne {in, r}) and .lora_b (ne {r, out}, q's and k's rows permuted as above).
//             llama.cpp scales B A by alpha / r: with rsLoRA (alpha / sqrt(r)) the alpha written
//             is scale * r, so that llama.cpp applies the scale the run trained with.
//             DoRA's magnitudes have no place there: refused.
#ifndef EXPORT_GGUF_H
#define EXPORT_GGUF_H
#include "gguf_vocab.h"
#include "../model.h"

// --gguf_type: the names, ggml's tensor type and llama.cpp's general.file_type of each
static const char *const gguf_type_names[] = {"f32", "f16", "bf16", "q8_0", "q4_k_m", "q5_k_m", "q6_k"};
static const int gguf_type_ggml[] = {GGML_F32, GGML_F16, GGML_BF16, GGML_Q8_0, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K};
// LlamaFileType: ALL_F32, MOSTLY_F16, MOSTLY_BF16, MOSTLY_Q8_0, MOSTLY_Q4_K_M, MOSTLY_Q5_K_M, MOSTLY_Q6_K
static const int gguf_file_type[] = {0, 1, 32, 7, 15, 17, 18};
static int gguf_is_kquant(int gtype) { return gguf_block_size(gguf_type_ggml[gtype]) == KQ_K; }

// llama.cpp's names of the base weights (param_* order; NULL: none of llama.cpp's)
static const char *const gguf_param_names[NUM_PARAM_TENSORS] = {
    "token_embd", "blk.%d.attn_norm", "blk.%d.attn_q", "blk.%d.attn_k", "blk.%d.attn_v", "blk.%d.attn_output",
    "blk.%d.ffn_norm", "blk.%d.ffn_gate", "blk.%d.ffn_up", "blk.%d.ffn_down", "output_norm", "output"};
static const int gguf_lora_param[LORA_N_TARGETS] = {P_WQ, P_WK, P_WV, P_WO, P_WGATE, P_WUP, P_WDOWN};

// The permutation of LlamaModel.permute for n_heads heads of hd rows: row h hd + 2i + j of
// the result is row h hd + j hd/2 + i of Hugging Face's weight (n_heads * hd entries)
static int *gguf_llama_row_map(int n_heads, int hd) {
    int *map = (int *)mallocCheck((size_t)n_heads * hd * sizeof(int));
    for (int h = 0; h < n_heads; h++)
        for (int i = 0; i < hd / 2; i++)
            for (int j = 0; j < 2; j++) map[h * hd + 2 * i + j] = h * hd + j * (hd / 2) + i;
    return map;
}

// the element type of a 2-D weight with rows of n: Q8_0 needs whole blocks (else F16, as the converter)
static int gguf_weight_type(int gtype, int64_t n) {
    int t = gguf_type_ggml[gtype];
    return t == GGML_Q8_0 && n % GGUF_QK8_0 != 0 ? GGML_F16 : t;
}

// The type of 2-D weight p of layer l (rows of cols) in a k-quant file: what llama-quantize
// (llama.cpp's src/llama-quant.cpp, llama_tensor_get_type) gives it from an f32 file of a
// Llama without an importance matrix, for Q4_K_M, Q5_K_M and Q6_K:
//   output (or, tied, token_embd: llama.cpp reads it as the output too) Q6_K; Q8_0 where a
//     row is not a multiple of 256
//   attn_v and ffn_down, in Q4_K_M and Q5_K_M: Q6_K in the layers use_more_bits picks (the
//     first and last eighth, and every third between); llama-quantize counts the tensors as
//     it visits them, in its loader's order (by layer number, then by name), so the count
//     is the layer's number. attn_v of a 70B (80 layers, fewer kv heads than heads) that is
//     still Q4_K becomes Q5_K.
//   every other weight the file type's own (Q4_K, Q5_K, Q6_K)
// then where a row is not a multiple of the type's block: Q4_K -> Q5_0, Q5_K -> Q5_1,
// Q6_K -> Q8_0, and F16 where a row is not a multiple of 32 either.
static int gguf_kquant_type(int gtype, const Config *c, int p, int l, int64_t cols) {
    int t = gguf_type_ggml[gtype], n = c->n_layers;
    int more_bits = l < n / 8 || l >= 7 * n / 8 || (l - n / 8) % 3 == 2;
    if (p == P_HEAD || (p == P_EMBED && c->tied)) t = cols % KQ_K != 0 ? GGML_Q8_0 : GGML_Q6_K;
    else if ((p == P_WV || p == P_WDOWN) && t != GGML_Q6_K && more_bits) t = GGML_Q6_K;
    if (p == P_WV && t == GGML_Q4_K && n == 80 && c->n_kv_heads != c->n_heads) t = GGML_Q5_K;
    if (cols % gguf_block_size(t) != 0) t = t == GGML_Q4_K ? GGML_Q5_0 : t == GGML_Q5_K ? GGML_Q5_1 : GGML_Q8_0;
    return cols % gguf_block_size(t) != 0 ? GGML_F16 : t;
}

// Llama-3's rope_freqs: for each of the hd/2 frequencies the divisor llama.cpp applies, as
// LlamaModel.generate_extra_tensors computes it (fp32 tensors, Python numbers rounded to
// fp32 as they meet them, `x / t` as x * (1 / t)); each step its own rounding (volatile: no
// fused multiply-add)
static void gguf_llama3_factors(const Config *c, float *out) {
    float factor = (float)c->rope_factor, lo = (float)c->rope_low_freq_factor;
    double old = c->rope_original_max_pos;
    for (int i = 0; i < c->head_dim / 2; i++) {
        volatile float freq = 1.0f / powf(c->rope_theta, (float)(2 * i) / (float)c->head_dim);
        volatile float wavelen = (1.0f / freq) * (float)(2 * M_PI);
        if (wavelen < (float)(old / c->rope_high_freq_factor)) out[i] = 1.0f;
        else if (wavelen > (float)(old / c->rope_low_freq_factor)) out[i] = factor;
        else {
            volatile float ratio = (float)old * (1.0f / wavelen);
            volatile float smooth = (ratio - lo) / (float)(c->rope_high_freq_factor - c->rope_low_freq_factor);
            volatile float part = (1.0f - smooth) / factor;
            volatile float sum = part + smooth;
            out[i] = 1.0f / sum;
        }
    }
}

// The model m (m->params whole: the fine-tuned weights, or the base with the adapter merged
// in; or, where the backend keeps them, read through weights_get a block of rows at a time) as GGUF at path, its type gtype (an index of gguf_type_names); model_dir's config.json
// (config_json_load) says which keys the converter would write, tokpath is the vocabulary (with its folder's
// files), chat_fallback the chat template when that folder has none (NULL: none). 0 ok, -1 with a message.
static int export_gguf_model(const HostModel *m, const char *path, const char *model_dir, const char *tokpath, int gtype,
                             const char *chat_fallback) {
    const Config *c = &m->config;
    JsonValue cfg;
    if (config_json_load(c, model_dir, &cfg) != 0) return -1;
    const JsonValue *rope = json_get(&cfg, "rope_parameters");
    if (!rope || rope->type != JSON_OBJECT) rope = json_get(&cfg, "rope_scaling");
    if (rope && rope->type != JSON_OBJECT) rope = NULL;
    GgufWriter w;
    gguf_init(&w);
    w.fill_bytes = st_staging_bytes(); // (the backend's weights: a staging buffer's worth of rows a read)
    gguf_kv_str(&w, "general.architecture", "llama");
    gguf_kv_str(&w, "general.type", "model");
    gguf_kv_u32(&w, "llama.block_count", (uint32_t)c->n_layers);
    gguf_kv_u32(&w, "llama.context_length", (uint32_t)c->max_pos); // (llama.cpp requires it: LlamaConfig's default when absent)
    gguf_kv_u32(&w, "llama.embedding_length", (uint32_t)c->dim);
    gguf_kv_u32(&w, "llama.feed_forward_length", (uint32_t)c->hidden_dim);
    gguf_kv_u32(&w, "llama.attention.head_count", (uint32_t)c->n_heads);
    if (json_get(&cfg, "num_key_value_heads") && json_get(&cfg, "num_key_value_heads")->type != JSON_NULL)
        gguf_kv_u32(&w, "llama.attention.head_count_kv", (uint32_t)c->n_kv_heads);
    if (c->rope_type == ROPE_LINEAR) {
        gguf_kv_str(&w, "llama.rope.scaling.type", "linear");
        gguf_kv_f32(&w, "llama.rope.scaling.factor", (float)c->rope_factor);
    }
    if (json_get(&cfg, "rope_theta") || (rope && json_get(rope, "rope_theta")))
        gguf_kv_f32(&w, "llama.rope.freq_base", c->rope_theta);
    if (json_get(&cfg, "rms_norm_eps")) gguf_kv_f32(&w, "llama.attention.layer_norm_rms_epsilon", c->norm_eps);
    if (gguf_config_int(&cfg, "head_dim") >= 0) {
        gguf_kv_u32(&w, "llama.attention.key_length", (uint32_t)c->head_dim);
        gguf_kv_u32(&w, "llama.attention.value_length", (uint32_t)c->head_dim);
    }
    gguf_kv_u32(&w, "general.file_type", (uint32_t)gguf_file_type[gtype]);
    gguf_kv_u32(&w, "llama.vocab_size", (uint32_t)c->vocab_size);
    gguf_kv_u32(&w, "llama.rope.dimension_count", (uint32_t)c->head_dim);
    gguf_kv_u32(&w, "general.quantization_version", 2);
    int rc = gguf_llama_vocab(&w, tokpath, &cfg, c->vocab_size, chat_fallback);
    json_free(&cfg);
    // the tensors
    float *freqs = NULL;
    int *qmap = gguf_llama_row_map(c->n_heads, c->head_dim), *kmap = gguf_llama_row_map(c->n_kv_heads, c->head_dim);
    if (rc == 0 && c->rope_type == ROPE_LLAMA3) {
        freqs = (float *)mallocCheck((size_t)c->head_dim / 2 * sizeof(float));
        gguf_llama3_factors(c, freqs);
        uint64_t ne[1] = {(uint64_t)c->head_dim / 2};
        rc = gguf_add_tensor(&w, "rope_freqs.weight", GGML_F32, 1, ne, freqs, NULL);
    }
    float *ptrs[NUM_PARAM_TENSORS];
    param_tensors(&m->w, ptrs);
    TensorRef *refs = (TensorRef *)callocCheck((size_t)NUM_PARAM_TENSORS * c->n_layers, sizeof(TensorRef)), *ref = refs;
    int order[NUM_PARAM_TENSORS] = {P_EMBED, P_ATTN_NORM, P_WQ, P_WK, P_WV, P_WO, P_MLP_NORM, P_WGATE, P_WUP, P_WDOWN, P_NORM, P_HEAD};
    for (int pass = 0; pass < 3 && rc == 0; pass++) // the embedding, the layers, the final norm and head
        for (int l = 0; l < (pass == 1 ? c->n_layers : 1) && rc == 0; l++)
            for (int k = 0; k < NUM_PARAM_TENSORS && rc == 0; k++) {
                int p = order[k];
                if ((pass == 1) != (param_per_layer(p) != 0) || (pass == 0) != (p == P_EMBED) || (p == P_HEAD && c->tied)) continue;
                int64_t rows, cols;
                param_shape(c, p, &rows, &cols);
                char name[96];
                snprintf(name, sizeof name - 8, gguf_param_names[p], l);
                strcat(name, ".weight");
                uint64_t ne[2] = {(uint64_t)cols, (uint64_t)rows};
                int vec = rows == 1, type = vec ? GGML_F32 : gguf_is_kquant(gtype) ? gguf_kquant_type(gtype, c, p, l, cols)
                                                                    : gguf_weight_type(gtype, cols);
                const int *map = p == P_WQ ? qmap : p == P_WK ? kmap : NULL;
                if (m->params) rc = gguf_add_tensor(&w, name, type, vec ? 1 : 2, ne, ptrs[p] + (size_t)l * rows * cols, map);
                else { // (the backend's)
                    ref->m = m;
                    param_unit(c, p, l, &ref->u, &ref->j);
                    rc = gguf_add_tensor_fill(&w, name, type, vec ? 1 : 2, ne, tensor_fill, ref++, map);
                }
            }
    if (rc == 0) rc = gguf_write(&w, path);
    gguf_free(&w);
    free(qmap); free(kmap); free(freqs); free(refs);
    return rc;
}

// (trainer/options.h's refusals refuse these options together before training)
static const char gguf_adapter_no_ia3[] = "--export_gguf_adapter writes a llama.cpp LoRA adapter, which cannot "
                                          "hold IA3's vectors; use --export_gguf for the model with the adapter merged in";
static const char gguf_adapter_saved_error[] = "--export_gguf_adapter: a llama.cpp adapter holds LoRA's A and B "
    "only, not the base tensors --trainable_params trains (modules_to_save); use --export_gguf for the model with them merged in";

// The LoRA adapter of m as llama.cpp's GGUF adapter at path (tensors of type gtype).
// 0 ok, -1 with a message (DoRA, IA3, --trainable_params).
static int export_gguf_adapter(const HostModel *m, const char *path, int gtype) {
    const Config *c = &m->config;
    const LoRA *l = &m->lora;
    if (!m->use_lora) { fprintf(stderr, "error: --export_gguf_adapter writes a LoRA adapter; with --full_finetune there is none\n"); return -1; }
    if (l->ia3) { fprintf(stderr, "error: %s\n", gguf_adapter_no_ia3); return -1; }
    if (l->use_dora) {
        fprintf(stderr, "error: --export_gguf_adapter: DoRA cannot be expressed as a llama.cpp adapter (it has no place for "
                "DoRA's magnitudes); use --export_gguf for the model with the adapter merged in\n");
        return -1;
    }
    if (l->saved) { fprintf(stderr, "error: %s\n", gguf_adapter_saved_error); return -1; }
    GgufWriter w;
    gguf_init(&w);
    w.fill_bytes = st_staging_bytes(); // (the backend's weights: a staging buffer's worth of rows a read)
    gguf_kv_str(&w, "general.architecture", "llama");
    gguf_kv_str(&w, "general.type", "adapter");
    gguf_kv_str(&w, "adapter.type", "lora");
    // llama.cpp scales by alpha / r: peft's alpha itself, or with rsLoRA the alpha that gives its scale
    gguf_kv_f32(&w, "adapter.lora.alpha", l->use_rslora ? l->scale * (float)l->r : l->alpha);
    gguf_kv_u32(&w, "general.quantization_version", 2);
    int *qmap = gguf_llama_row_map(c->n_heads, c->head_dim), *kmap = gguf_llama_row_map(c->n_kv_heads, c->head_dim);
    int rc = 0;
    for (int i = 0; i < l->n_layers && rc == 0; i++)
        for (int t = 0; t < LORA_N_TARGETS && rc == 0; t++) {
            if (!(l->targets & (1u << t))) continue;
            char base[64], name[96];
            snprintf(base, sizeof base, gguf_param_names[gguf_lora_param[t]], i);
            uint64_t ne_a[2] = {(uint64_t)l->in[t], (uint64_t)l->r}, ne_b[2] = {(uint64_t)l->r, (uint64_t)l->out[t]};
            snprintf(name, sizeof name, "%s.weight.lora_a", base);
            rc = gguf_add_tensor(&w, name, gguf_weight_type(gtype, l->in[t]), 2, ne_a, lora_A(l, l->params, i, t), NULL);
            snprintf(name, sizeof name, "%s.weight.lora_b", base);
            if (rc == 0)
                rc = gguf_add_tensor(&w, name, gguf_weight_type(gtype, l->r), 2, ne_b, lora_B(l, l->params, i, t),
                                     t == LORA_Q ? qmap : t == LORA_K ? kmap : NULL);
        }
    if (rc == 0) rc = gguf_write(&w, path);
    gguf_free(&w);
    free(qmap); free(kmap);
    return rc;
}
#endif
