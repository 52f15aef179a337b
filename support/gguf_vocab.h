// support/gguf_vocab.h: the vocabulary of the GGUF export (support/export_gguf.h; docs/export.md):
// the tokenizer.* keys and the chat template, what llama.cpp's converter (LlamaModel.set_vocab,
// with gguf-py's SpecialVocab) writes from the same tokenizer file and the files beside it.
//
//   sentencepiece  a tokenizer.model: tokenizer.ggml.model "llama", pre "default", tokens,
//                  scores and the converter's token types (unknown 2, control 3, unused 5,
//                  byte 6, every other piece normal 1).
//   byte-level BPE a tokenizer.json (_set_vocab_gpt2): model "gpt2", pre named by the
//                  pre-tokenizer's regex ("llama-bpe" Llama-3's, "gpt-2" GPT-2's: the converter
//                  hashes the reference tokenizer's ids instead, which a C exporter cannot),
//                  the vocab's strings, types (added tokens control when special or looking
//                  special, else user-defined; normal), merges.
//   both           ids past the tokenizer's up to vocab_size "[PADi]" (score -10000), unused;
//                  SpecialVocab's special ids and add_*_token flags from tokenizer.json's added
//                  tokens and post_processor, tokenizer_config.json and config.json;
//                  add_space_prefix; CodeLlama's eot 32010; tokenizer.chat_template from the
//                  folder, else the run's chat format's.
#ifndef GGUF_VOCAB_H
#define GGUF_VOCAB_H
#include <dirent.h>
#include "gguf.h"
#include "json.h"
#include "../tokenizer.h"

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
#endif
