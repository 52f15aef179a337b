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
//   vocabulary  (LlamaModel.set_vocab; docs/export.md) a sentencepiece tokenizer.model:
//             tokenizer.ggml.model "llama", pre "default", tokens, scores and the converter's
//             token types (unknown 2, control 3, unused 5, byte 6, every other piece normal 1).
//             A tokenizer.json's byte-level BPE (_set_vocab_gpt2): model "gpt2", pre named by
//             the pre-tokenizer's regex ("llama-bpe" Llama-3's, "gpt-2" GPT-2's: the converter
//             hashes the reference tokenizer's ids instead, which a C exporter cannot), the
//             vocab's strings, types (added tokens control when special or looking special,
//             else user-defined; normal), merges. Both: ids past the tokenizer's up to
//             vocab_size "[PADi]" (score -10000), unused; SpecialVocab's special ids and
//             add_*_token flags from tokenizer.json's added tokens and post_processor,
//             tokenizer_config.json and config.json; add_space_prefix; CodeLlama's eot 32010;
//             tokenizer.chat_template from the folder, else the run's chat format's.
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
#include <dirent.h>
#include "gguf.h"
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

// an integer config.json key as Python's isinstance(v, int) sees it (-1: absent or not one)
static long long gguf_config_int(const JsonValue *cfg, const char *key) {
    const JsonValue *v = json_get(cfg, key);
    return v && v->type == JSON_NUMBER && v->is_int ? v->integer : -1;
}

// ---------------------------------------------------------------------------------------
// The vocabulary: the tokenizer.* keys, from the tokenizer file and the files of its folder
// that llama.cpp's converter reads there (SpecialVocab): tokenizer.json's added tokens,
// merges and post_processor, tokenizer_config.json's special tokens, add_*_token flags,
// add_prefix_space and chat template (else chat_template.jinja, else chat_template.json),
// config.json's special ids. Every one of them is untrusted: a value the converter could
// not use is an error naming the file, found before anything is written.

// a folder's files as parsed (JSON null: the folder has no such file); the paths name them in messages
typedef struct {
    JsonValue tj, tc, ctj;          // tokenizer.json, tokenizer_config.json, chat_template.json
    char *jinja; size_t jinja_len;  // chat_template.jinja (NULL: none)
    int more_templates;             // additional_chat_templates/*.jinja beside it
    char tj_path[4200], tc_path[4200], ctj_path[4200], jinja_path[4200];
} GgufFolder;

// SpecialVocab's special tokens, in its order; eot and eom join when a post-processor ends
// with a token other than the eos
enum { GS_BOS, GS_EOS, GS_UNK, GS_SEP, GS_PAD, GS_CLS, GS_MASK, GS_EOT, GS_EOM, GS_N };
static const char *const gguf_special_names[GS_N] = {"bos", "eos", "unk", "sep", "pad", "cls", "mask", "eot", "eom"};
typedef struct {
    int n_types;                 // the kinds looked up: 7, or 8 / 9 with eot / eom
    const JsonValue *name[GS_N]; // tokenizer_config.json's <kind>_token as SpecialVocab updates it (NULL: none)
    long long id[GS_N];          // -1: none
    int add[GS_N];               // add_<kind>_token: -1 none, else 0 or 1
} GgufSpecial;

// Python's None for JSON null and absent keys
static const JsonValue *gguf_py(const JsonValue *v) { return v && v->type != JSON_NULL ? v : NULL; }
// Python's truth value
static int gguf_py_true(const JsonValue *v) {
    v = gguf_py(v);
    if (!v) return 0;
    if (v->type == JSON_BOOL) return v->boolean;
    if (v->type == JSON_NUMBER) return v->number != 0;
    if (v->type == JSON_STRING) return v->string_len > 0;
    return v->count > 0;
}
// Python's == on what SpecialVocab compares (token names: strings; other values only equal themselves)
static int gguf_py_eq(const JsonValue *a, const JsonValue *b) {
    a = gguf_py(a), b = gguf_py(b);
    if (!a || !b || a == b) return a == b;
    return a->type == JSON_STRING && b->type == JSON_STRING && a->string_len == b->string_len &&
           !memcmp(a->string, b->string, a->string_len);
}
static int gguf_is_str(const JsonValue *v, const char *s) {
    return v && v->type == JSON_STRING && v->string_len == strlen(s) && !memcmp(v->string, s, v->string_len);
}

// item.get(kind, {}).get("id") of a TemplateProcessing piece into *id (NULL: none); -1 with a
// message where Python would fail (not objects)
static int gguf_piece_id(const GgufFolder *f, const JsonValue *item, const char *kind, const JsonValue **id) {
    const JsonValue *k = item && item->type == JSON_OBJECT ? json_get(item, kind) : NULL;
    if (!item || item->type != JSON_OBJECT || (k && k->type != JSON_OBJECT)) {
        fprintf(stderr, "error: %s: post_processor: a TemplateProcessing piece is not an object {\"%s\": {\"id\": ...}}\n", f->tj_path, kind);
        return -1;
    }
    *id = k ? gguf_py(json_get(k, "id")) : NULL;
    return 0;
}

// TemplateProcessing's single and pair templates as SpecialVocab reads them: whether bos, eos
// and sep are added, and the names they imply (a leading or trailing special token)
static int gguf_template_processing(GgufSpecial *s, const GgufFolder *f, const JsonValue *proc, int tc) {
    const JsonValue *single = gguf_py(json_get(proc, "single")), *pair = gguf_py(json_get(proc, "pair"));
    const JsonValue **bos = &s->name[GS_BOS], **eos = &s->name[GS_EOS], **sep = &s->name[GS_SEP], **cls = &s->name[GS_CLS];
    if ((single && single->type != JSON_ARRAY) || (pair && pair->type != JSON_ARRAY)) {
        fprintf(stderr, "error: %s: post_processor: TemplateProcessing's single and pair must be lists\n", f->tj_path);
        return -1;
    }
    const JsonValue *first = NULL, *last = NULL;
    if (single && single->count > 1) {
        if (gguf_piece_id(f, &single->items[0], "SpecialToken", &first) != 0 ||
            gguf_piece_id(f, &single->items[single->count - 1], "SpecialToken", &last) != 0) return -1;
        if (!gguf_py_true(first)) first = NULL;
        if (!gguf_py_true(last)) last = NULL;
        if (first) { // a leading special token: the bos (or cls) when the config says so, else it names them
            if (!tc) *bos = first;
            else if (!gguf_py_eq(first, *bos) && !gguf_py_eq(first, *cls)) {
                if (!gguf_py_true(*bos)) *bos = first;
                if (!gguf_py_true(*cls)) *cls = first;
            }
            s->add[GS_BOS] = gguf_py_eq(first, *bos) || gguf_py_eq(first, *cls);
        }
        if (last) { // a trailing one becomes the eos; the config's eos moves to eot (then eom)
            if (!tc) *eos = last;
            else if (!gguf_py_eq(last, *eos)) {
                if (s->n_types < GS_EOM + 1) s->name[s->n_types++] = *eos;
                *eos = last;
            }
            s->add[GS_EOS] = gguf_py_eq(last, *eos);
        }
    }
    if (!pair || pair->count == 0) return 0;
    const JsonValue *p0, *pn, *a, *b, *e;
    if (gguf_piece_id(f, &pair->items[0], "SpecialToken", &p0) != 0 ||
        gguf_piece_id(f, &pair->items[pair->count - 1], "SpecialToken", &pn) != 0) return -1;
    int lo = first && gguf_py_eq(p0, first), hi = pair->count - (last && gguf_py_eq(pn, last)); // pair[lo:hi]
    if (hi <= lo) return 0;
    if (gguf_piece_id(f, &pair->items[lo], "Sequence", &a) != 0 || gguf_piece_id(f, &pair->items[hi - 1], "Sequence", &b) != 0) return -1;
    if (!gguf_is_str(a, "A") || !gguf_is_str(b, "B") || hi - lo <= 2) return 0;
    int add_sep = 0; // A [sep] [eos] B
    if (gguf_piece_id(f, &pair->items[lo + 1], "SpecialToken", &e) != 0) return -1;
    if (gguf_py_true(e) && (gguf_py_eq(e, *sep) || gguf_py_eq(e, *eos)) && !last) add_sep = 1;
    if (hi - lo - 2 == 2) {
        if (gguf_piece_id(f, &pair->items[lo + 2], "SpecialToken", &e) != 0) return -1;
        if (gguf_py_true(e) && (gguf_py_eq(e, *sep) || gguf_py_eq(e, *eos))) add_sep = 1;
    }
    s->add[GS_SEP] = add_sep;
    if (add_sep && !gguf_py_true(*sep) && tc) *sep = *eos;
    return 0;
}

// tokenizer.json's post_processor (ByteLevel, RobertaProcessing, TemplateProcessing, or a
// Sequence of them; others say nothing), as SpecialVocab reads it
static int gguf_post_processor(GgufSpecial *s, const GgufFolder *f, int tc) {
    const JsonValue **bos = &s->name[GS_BOS], **eos = &s->name[GS_EOS], **sep = &s->name[GS_SEP], **cls = &s->name[GS_CLS];
    if (!gguf_py_true(*bos) && gguf_py_true(*cls) && tc) *bos = *cls;
    if (!gguf_py_true(*eos) && gguf_py_true(*sep) && tc) *eos = *sep;
    const JsonValue *pp = json_get(&f->tj, "post_processor");
    if (!gguf_py_true(pp)) return 0;
    const JsonValue *list = pp->type == JSON_OBJECT ? json_get(pp, "processors") : NULL;
    if (pp->type != JSON_OBJECT || (list && list->type != JSON_ARRAY)) {
        fprintf(stderr, "error: %s: post_processor is not an object (or its processors not a list)\n", f->tj_path);
        return -1;
    }
    for (int i = 0; i < (list ? list->count : 1); i++) {
        const JsonValue *proc = list ? &list->items[i] : pp, *type = proc->type == JSON_OBJECT ? json_get(proc, "type") : NULL;
        if (proc->type != JSON_OBJECT) {
            fprintf(stderr, "error: %s: post_processor.processors[%d] is not an object\n", f->tj_path, i);
            return -1;
        }
        if (gguf_is_str(type, "ByteLevel")) {
            if (s->add[GS_BOS] < 0) s->add[GS_BOS] = 0;
            if (s->add[GS_EOS] < 0) s->add[GS_EOS] = 0;
        } else if (gguf_is_str(type, "RobertaProcessing")) {
            s->add[GS_BOS] = s->add[GS_EOS] = s->add[GS_SEP] = 1;
            const JsonValue *c = json_get(proc, "cls"), *p = json_get(proc, "sep");
            if ((c && (c->type != JSON_ARRAY || !c->count)) || (p && (p->type != JSON_ARRAY || !p->count))) {
                fprintf(stderr, "error: %s: post_processor: RobertaProcessing's cls and sep must be [token, id]\n", f->tj_path);
                return -1;
            }
            if (!gguf_py_true(*cls) && tc) *cls = c ? &c->items[0] : *bos;
            if (!gguf_py_true(*sep) && tc) *sep = p ? &p->items[0] : *eos;
        } else if (gguf_is_str(type, "TemplateProcessing") && gguf_template_processing(s, f, proc, tc) != 0) return -1;
    }
    return 0;
}

// sets the id of kind k unless set (SpecialVocab._set_special_token): integers only; an id
// below 0 or not below limit (sentencepiece: the vocabulary's size) is left out
static void gguf_special_id(GgufSpecial *s, int k, const JsonValue *v, long long limit) {
    v = gguf_py(v);
    if (!v || v->type != JSON_NUMBER || !v->is_int || v->integer < 0 || v->integer >= limit || s->id[k] >= 0) return;
    s->id[k] = v->integer;
}

// the special ids and add_*_token flags SpecialVocab takes from the folder's files (cfg:
// config.json, may be NULL) for a vocabulary of limit ids. 0 ok, -1 with a message
static int gguf_special_vocab(GgufSpecial *s, const GgufFolder *f, const JsonValue *cfg, long long limit) {
    memset(s, 0, sizeof *s);
    s->n_types = GS_EOT;
    int tc = gguf_py_true(&f->tc);
    for (int k = 0; k < GS_N; k++) {
        char key[32];
        snprintf(key, sizeof key, "%s_token", gguf_special_names[k]);
        s->name[k] = f->tc.type == JSON_OBJECT ? gguf_py(json_get(&f->tc, key)) : NULL;
        s->id[k] = -1, s->add[k] = -1;
    }
    const JsonValue *added = gguf_py(json_get(&f->tj, "added_tokens"));
    if (added && added->type != JSON_ARRAY) { fprintf(stderr, "error: %s: added_tokens is not a list\n", f->tj_path); return -1; }
    if (f->tj.type != JSON_NULL && gguf_post_processor(s, f, tc) != 0) return -1;
    for (int k = 0; tc && k < s->n_types; k++) {
        char key[32];
        snprintf(key, sizeof key, "add_%s_token", gguf_special_names[k]);
        const JsonValue *flag = json_get(&f->tc, key), *name = s->name[k];
        if (flag && flag->type == JSON_BOOL && s->add[k] < 0) s->add[k] = flag->boolean; // (a post-processor's says first)
        if (name && name->type == JSON_OBJECT) name = json_get(name, "content");
        if (!name || name->type != JSON_STRING) continue;
        for (int i = 0; added && i < added->count; i++) { // the first added token of that content
            const JsonValue *a = &added->items[i];
            if (a->type != JSON_OBJECT) { fprintf(stderr, "error: %s: added_tokens[%d] is not an object\n", f->tj_path, i); return -1; }
            if (!gguf_py_eq(json_get(a, "content"), name)) continue;
            gguf_special_id(s, k, json_get(a, "id"), limit);
            break;
        }
    }
    const JsonValue *text_cfg = cfg && cfg->type == JSON_OBJECT ? json_get(cfg, "text_config") : NULL;
    for (int k = 0; cfg && cfg->type == JSON_OBJECT && k < s->n_types; k++) {
        char key[32];
        snprintf(key, sizeof key, "%s_token_id", gguf_special_names[k]);
        const JsonValue *v = gguf_py(json_get(cfg, key));
        if (!v && text_cfg && text_cfg->type == JSON_OBJECT) v = json_get(text_cfg, key);
        gguf_special_id(s, k, v, limit);
    }
    return 0;
}

// the chat template the converter writes (*tmpl NULL: none, else *len bytes): tokenizer_config.json's
// "chat_template" when it has the key, else chat_template.jinja's text, else chat_template.json's.
// A list of named templates is refused (the converter writes their names from a Python set, in
// no fixed order), as is anything but a string. 0 ok, -1 with a message
static int gguf_chat_template(const GgufFolder *f, const char **tmpl, size_t *len) {
    *tmpl = NULL, *len = 0;
    if (!gguf_py_true(&f->tc)) return 0; // (SpecialVocab reads no template without a tokenizer_config.json)
    const JsonValue *v = json_get(&f->tc, "chat_template");
    const char *from = f->tc_path;
    if (!v && f->jinja) {
        if (f->more_templates) {
            fprintf(stderr, "error: %s: named chat templates (additional_chat_templates/) are not written to the GGUF; "
                    "keep chat_template.jinja alone\n", f->jinja_path);
            return -1;
        }
        size_t at = 0, mb;
        for (; at < f->jinja_len && tok_utf8_valid((const unsigned char *)f->jinja + at, f->jinja_len - at, &mb); at += mb) {}
        if (at < f->jinja_len) { fprintf(stderr, "error: %s: not UTF-8 text (byte %zu)\n", f->jinja_path, at); return -1; }
        *tmpl = f->jinja, *len = f->jinja_len;
        return 0;
    }
    if (!v && f->ctj.type != JSON_NULL) {
        if (f->ctj.type != JSON_OBJECT) { fprintf(stderr, "error: %s: not a JSON object\n", f->ctj_path); return -1; }
        v = json_get(&f->ctj, "chat_template"), from = f->ctj_path;
    }
    if (!gguf_py(v)) return 0;
    if (v->type != JSON_STRING) {
        fprintf(stderr, "error: %s: chat_template is %s; only a string (one Jinja template) is written to the GGUF%s\n", from,
                json_type_name(v->type), v->type == JSON_ARRAY ? " (a list of named templates is not)" : "");
        return -1;
    }
    *tmpl = v->string, *len = v->string_len;
    return 0;
}

// does the converter take this added token for a special one (does_token_look_special)?
static int gguf_looks_special(const char *s, size_t n) {
    static const char *const named[] = {"<pad>", "<mask>", "<2mass>", "[@BOS@]"};
    for (size_t i = 0; i < sizeof named / sizeof named[0]; i++)
        if (n == strlen(named[i]) && !memcmp(s, named[i], n)) return 1;
    static const char *const ends[][2] = {{"<|", "|>"}, {"<\xef\xbd\x9c", "\xef\xbd\x9c>"}, {"<unused", ">"}}; // (the second: fullwidth bars)
    for (size_t i = 0; i < sizeof ends / sizeof ends[0]; i++) {
        size_t a = strlen(ends[i][0]), b = strlen(ends[i][1]);
        if (n >= a && n >= b && !memcmp(s, ends[i][0], a) && !memcmp(s + n - b, ends[i][1], b)) return 1;
    }
    return 0;
}

// a token string and its id, ordered by the bytes (then the length)
typedef struct { const char *s; int len, id; } GgufNamed;
static int gguf_named_cmp(const void *pa, const void *pb) {
    const GgufNamed *a = (const GgufNamed *)pa, *b = (const GgufNamed *)pb;
    int c = memcmp(a->s, b->s, (size_t)(a->len < b->len ? a->len : b->len));
    return c ? c : (a->len > b->len) - (a->len < b->len);
}

// the token strings and types of a tokenizer.json vocabulary, n_vocab of them (get_vocab_base):
// the vocab's strings as they are (normal); an added token control when it is special or looks
// special, else user-defined with "▁" as " "; an added token with normalized false first as
// tokenizers encodes and decodes it (ByteLevel's decoder turns some strings into others);
// [PADi] unused past the tokenizer's ids. Two tokens of one string are refused (llama.cpp
// would find only one of them). s[i] malloc'd. 0 ok, -1 with a message
static int gguf_bpe_tokens(const Tokenizer *tok, const GgufFolder *f, int n_vocab, char **s, int *lens, int32_t *types) {
    const JsonValue *added = gguf_py(json_get(&f->tj, "added_tokens"));
    for (int i = 0; i < n_vocab; i++) {
        if (i >= tok->vocab_size) {
            s[i] = (char *)mallocCheck(24);
            lens[i] = snprintf(s[i], 24, "[PAD%d]", i), types[i] = TOK_UNUSED;
            continue;
        }
        s[i] = (char *)mallocCheck((size_t)tok->piece_len[i] + 1);
        memcpy(s[i], tok->pieces[i], (size_t)tok->piece_len[i] + 1);
        lens[i] = tok->piece_len[i], types[i] = TOK_NORMAL;
    }
    for (int a = 0; added && a < added->count; a++) { // (tokenizer_load checked each one's fields and id)
        const JsonValue *e = &added->items[a], *special = json_get(e, "special"), *normalized = json_get(e, "normalized");
        long long id;
        if (json_get_int(e, "id", &id) != JSON_OK || id < 0 || id >= tok->vocab_size || !tok->literal[id]) continue;
        int n;
        if (!(normalized && normalized->boolean)) {
            int *ids = tokenizer_encode(tok, s[id], (size_t)lens[id], 0, 0, &n);
            size_t len;
            char *back = ids ? tokenizer_decode(tok, ids, n, &len) : NULL;
            if (!back) die("out of memory");
            free(ids), free(s[id]);
            s[id] = back, lens[id] = (int)len;
        }
        if ((special && special->boolean) || gguf_looks_special(s[id], (size_t)lens[id])) { types[id] = TOK_CONTROL; continue; }
        types[id] = TOK_USER_DEFINED;
        char *p = s[id], *q = s[id];
        for (int k = 0; k < lens[id]; k++) {
            if (k + 2 < lens[id] && !memcmp(p + k, "\xe2\x96\x81", 3)) { *q++ = ' ', k += 2; continue; }
            *q++ = p[k];
        }
        *q = 0, lens[id] = (int)(q - s[id]);
    }
    GgufNamed *order = (GgufNamed *)mallocCheck((size_t)tok->vocab_size * sizeof(GgufNamed)); // the strings, sorted
    for (int i = 0; i < tok->vocab_size; i++) order[i].s = s[i], order[i].len = lens[i], order[i].id = i;
    qsort(order, (size_t)tok->vocab_size, sizeof *order, gguf_named_cmp);
    int rc = 0;
    for (int i = 1; i < tok->vocab_size && rc == 0; i++)
        if (gguf_named_cmp(&order[i - 1], &order[i]) == 0) {
            char q[200];
            int a = order[i - 1].id < order[i].id ? order[i - 1].id : order[i].id, b = order[i - 1].id ^ order[i].id ^ a;
            fprintf(stderr, "error: %s: tokens %d and %d are both \"%s\" in the GGUF vocabulary (an added token as llama.cpp's "
                    "converter writes it collides with another token); llama.cpp would find only one of them\n",
                    f->tj_path, a, b, tok_quote(q, order[i].s, (size_t)order[i].len));
            rc = -1;
        }
    free(order);
    return rc;
}

// model.merges as SpecialVocab writes them: "a b" strings as they are, ["a", "b"] pairs
// joined by a space, a space inside either written as U+0120 (its byte-level character).
// llama.cpp cannot load a BPE vocabulary without merges: none is an error. 0 ok, -1 with a message
static int gguf_bpe_merges(GgufWriter *w, const GgufFolder *f) {
    const JsonValue *m = json_get(json_get(&f->tj, "model"), "merges");
    if (!m || m->type != JSON_ARRAY || m->count == 0) {
        fprintf(stderr, "error: %s: model.merges is missing or empty: llama.cpp cannot load a BPE vocabulary without merges\n", f->tj_path);
        return -1;
    }
    int legacy = m->items[0].type == JSON_STRING; // (tokenizer_load checked that all are of one form)
    char **s = (char **)callocCheck((size_t)m->count, sizeof(char *));
    int *lens = (int *)mallocCheck((size_t)m->count * sizeof(int));
    for (int i = 0; i < m->count; i++) {
        const JsonValue *e = &m->items[i];
        if (legacy) { s[i] = e->string, lens[i] = (int)e->string_len; continue; }
        size_t n = 0;
        s[i] = (char *)mallocCheck(2 * (e->items[0].string_len + e->items[1].string_len) + 2);
        for (int side = 0; side < 2; side++) {
            const JsonValue *p = &e->items[side];
            if (side) s[i][n++] = ' ';
            for (size_t k = 0; k < p->string_len; k++)
                if (p->string[k] == ' ') memcpy(s[i] + n, "\xc4\xa0", 2), n += 2;
                else s[i][n++] = p->string[k];
        }
        lens[i] = (int)n;
    }
    gguf_kv_strs(w, "tokenizer.ggml.merges", (const char *const *)s, lens, (uint64_t)m->count);
    for (int i = 0; !legacy && i < m->count; i++) free(s[i]);
    free(s), free(lens);
    return 0;
}

// the file at path parsed into *out: 0 (JSON null when there is no such file), -1 with a message
static int gguf_folder_json(const char *path, JsonValue *out) {
    memset(out, 0, sizeof *out);
    if (access(path, F_OK) != 0) return 0;
    size_t len;
    char err[256], *text = read_file_max(path, &len, TOKENIZER_MAX_FILE_SIZE);
    if (!text) { fprintf(stderr, "error: %s: cannot read: %s\n", path, strerror(errno)); return -1; }
    int rc = json_parse(text, len, out, err, sizeof err);
    free(text);
    if (rc != 0) { fprintf(stderr, "error: %s: invalid JSON: %s\n", path, err); memset(out, 0, sizeof *out); }
    return rc;
}

static void gguf_folder_free(GgufFolder *f) { json_free(&f->tj), json_free(&f->tc), json_free(&f->ctj), free(f->jinja); memset(f, 0, sizeof *f); }
// the files the converter reads beside tokpath. 0 ok, -1 with a message (*f freed)
static int gguf_folder_load(GgufFolder *f, const char *tokpath) {
    memset(f, 0, sizeof *f);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", tokpath);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    else snprintf(dir, sizeof dir, ".");
    snprintf(f->jinja_path, sizeof f->jinja_path, "%s/chat_template.jinja", dir);
    if (access(f->jinja_path, F_OK) == 0) {
        f->jinja = read_file_max(f->jinja_path, &f->jinja_len, TOKENIZER_MAX_FILE_SIZE);
        if (!f->jinja) { fprintf(stderr, "error: %s: cannot read: %s\n", f->jinja_path, strerror(errno)); return -1; }
        char more[4200];
        snprintf(more, sizeof more, "%s/additional_chat_templates", dir);
        DIR *d = opendir(more);
        for (struct dirent *e; d && (e = readdir(d));)
            if (strlen(e->d_name) > 6 && !strcmp(e->d_name + strlen(e->d_name) - 6, ".jinja")) f->more_templates = 1;
        if (d) closedir(d);
    }
    // a tokenizer.json is the tokenizer file itself (whatever its name); beside a tokenizer.model, the folder's
    if (tokenizer_is_json(tokpath, NULL, 0)) snprintf(f->tj_path, sizeof f->tj_path, "%s", tokpath);
    else snprintf(f->tj_path, sizeof f->tj_path, "%s/tokenizer.json", dir);
    snprintf(f->tc_path, sizeof f->tc_path, "%s/tokenizer_config.json", dir);
    snprintf(f->ctj_path, sizeof f->ctj_path, "%s/chat_template.json", dir);
    if (gguf_folder_json(f->tj_path, &f->tj) != 0 || gguf_folder_json(f->tc_path, &f->tc) != 0 ||
        gguf_folder_json(f->ctj_path, &f->ctj) != 0) { gguf_folder_free(f); return -1; }
    if (f->tc.type != JSON_NULL && f->tc.type != JSON_OBJECT) {
        fprintf(stderr, "error: %s: not a JSON object\n", f->tc_path);
        gguf_folder_free(f);
        return -1;
    }
    return 0;
}

// The vocabulary of tok (loaded from the folder f describes), n_vocab ids, into w as
// LlamaModel.set_vocab writes it: a sentencepiece tokenizer.model by _create_vocab_sentencepiece,
// a tokenizer.json by _set_vocab_gpt2; then SpecialVocab's keys (cfg: config.json, may be
// NULL), the chat template (the folder's, else chat_fallback when not NULL). 0 ok, -1 with a message
static int gguf_vocab(GgufWriter *w, const Tokenizer *tok, const GgufFolder *f, const JsonValue *cfg, int n_vocab,
                      const char *chat_fallback) {
    int bpe = tok->kind == TOKENIZER_BPE_JSON;
    const JsonValue *space = json_get(&f->tc, "add_prefix_space");
    if (gguf_py(space) && space->type != JSON_BOOL) { fprintf(stderr, "error: %s: add_prefix_space is not true or false\n", f->tc_path); return -1; }
    const char *tmpl;
    size_t tmpl_len;
    GgufSpecial sv;
    if (gguf_chat_template(f, &tmpl, &tmpl_len) != 0 || gguf_special_vocab(&sv, f, cfg, bpe ? (long long)UINT32_MAX + 1 : n_vocab) != 0) return -1;
    if (bpe && (tok->pretok == TOK_PRE_LLAMA3) != (tok->ignore_merges != 0)) {
        fprintf(stderr, "error: %s: model.ignore_merges is %s with %s pre-tokenizer, but llama.cpp's %s always does %s: it would "
                "tokenize differently\n", f->tj_path, tok->ignore_merges ? "true" : "false", tok->pretok == TOK_PRE_LLAMA3 ? "Llama-3's" :
                "GPT-2's", tok->pretok == TOK_PRE_LLAMA3 ? "llama-bpe" : "gpt-2", tok->pretok == TOK_PRE_LLAMA3 ? "ignore merges" : "not");
        return -1;
    }
    if (gguf_py(space)) gguf_kv_bool(w, "tokenizer.ggml.add_space_prefix", space->boolean);
    char **s = (char **)callocCheck((size_t)n_vocab, sizeof(char *));
    int *lens = (int *)mallocCheck((size_t)n_vocab * sizeof(int));
    int32_t *types = (int32_t *)mallocCheck((size_t)n_vocab * sizeof(int32_t));
    float *scores = NULL;
    int rc = 0;
    if (bpe) rc = gguf_bpe_tokens(tok, f, n_vocab, s, lens, types);
    else {
        scores = (float *)mallocCheck((size_t)n_vocab * sizeof(float));
        for (int i = 0; i < n_vocab; i++) {
            int t = i < tok->vocab_size ? (int)tok->types[i] : (int)TOK_UNUSED;
            s[i] = (char *)mallocCheck(i < tok->vocab_size ? (size_t)tok->piece_len[i] + 1 : 24);
            if (i < tok->vocab_size) memcpy(s[i], tok->pieces[i], (size_t)tok->piece_len[i] + 1), lens[i] = tok->piece_len[i];
            else lens[i] = snprintf(s[i], 24, "[PAD%d]", i);
            scores[i] = i < tok->vocab_size ? tok->scores[i] : -10000.0f;
            types[i] = t == TOK_UNKNOWN || t == TOK_CONTROL || t == TOK_UNUSED || t == TOK_BYTE ? t : TOK_NORMAL;
        }
    }
    if (rc == 0) {
        gguf_kv_str(w, "tokenizer.ggml.model", bpe ? "gpt2" : "llama");
        gguf_kv_str(w, "tokenizer.ggml.pre", !bpe ? "default" : tok->pretok == TOK_PRE_LLAMA3 ? "llama-bpe" : "gpt-2");
        gguf_kv_strs(w, "tokenizer.ggml.tokens", (const char *const *)s, lens, (uint64_t)n_vocab);
        if (scores) gguf_kv_f32s(w, "tokenizer.ggml.scores", scores, (uint64_t)n_vocab);
        gguf_kv_i32s(w, "tokenizer.ggml.token_type", types, (uint64_t)n_vocab);
        if (bpe) rc = gguf_bpe_merges(w, f);
    }
    for (int i = 0; i < n_vocab; i++) free(s[i]);
    free(s), free(lens), free(types), free(scores);
    if (rc != 0) return -1;
    if (n_vocab == 32016 && sv.id[GS_EOT] < 0) sv.id[GS_EOT] = 32010; // CodeLlama (LlamaModel.set_vocab)
    if (n_vocab == 49152) sv.add[GS_BOS] = 0;                         // Granite's small models (ditto)
    for (int k = 0; k < GS_N; k++) {
        char key[64];
        snprintf(key, sizeof key, "tokenizer.ggml.%s_token_id", gguf_special_names[k]);
        if (sv.id[k] >= 0) gguf_kv_u32(w, key, (uint32_t)sv.id[k]);
    }
    for (int k = 0; k < GS_N; k++) {
        char key[64];
        snprintf(key, sizeof key, "tokenizer.ggml.add_%s_token", gguf_special_names[k]);
        if (sv.add[k] >= 0) gguf_kv_bool(w, key, sv.add[k]);
    }
    if (!tmpl && chat_fallback) tmpl = chat_fallback, tmpl_len = strlen(chat_fallback);
    if (tmpl) { // (of its bytes, NUL too)
        gguf__key(w, "tokenizer.chat_template", GGUF_T_STRING);
        gguf__str(w, tmpl, tmpl_len);
    }
    return 0;
}

// the vocabulary of tokpath (and its folder) into w, n_vocab ids (0: the tokenizer's own).
// 0 ok, -1 with a message
static int gguf_llama_vocab(GgufWriter *w, const char *tokpath, const JsonValue *cfg, int n_vocab, const char *chat_fallback) {
    Tokenizer tok;
    GgufFolder f;
    if (tokenizer_load(&tok, tokpath) != 0) return -1;
    if (gguf_folder_load(&f, tokpath) != 0) { tokenizer_free(&tok); return -1; }
    if (n_vocab == 0) n_vocab = tok.vocab_size;
    int rc = -1;
    if (tok.vocab_size > n_vocab) fprintf(stderr, "error: %s has %d pieces but the model's vocab_size is %d\n", tokpath, tok.vocab_size, n_vocab);
    else rc = gguf_vocab(w, &tok, &f, cfg, n_vocab, chat_fallback);
    gguf_folder_free(&f);
    tokenizer_free(&tok);
    return rc;
}

// the checks of the export's vocabulary, before training: it is built and dropped. 0 ok, -1 with a message
static int gguf_check_tokenizer(const char *tokpath) {
    GgufWriter w;
    gguf_init(&w);
    int rc = gguf_llama_vocab(&w, tokpath, NULL, 0, NULL);
    gguf_free(&w);
    return rc;
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
