// GGUF export (support/export_gguf.h, support/gguf_vocab.h, support/gguf.h, support/kquants.h; docs/export.md), read back by a small GGUF
// reader of its own (CI has no Python):
//   test_gguf                       the encodings (F16, BF16, Q8_0) against gguf-py's of edge
//                                   values (test/fixtures/gguf/encodings.gguf, written by gguf-py),
//                                   and the committed files below as if fresh
//   test_gguf MODEL.gguf ADAPTER.gguf   an f32 export of test/test_gguf.sh's run (the flags of
//                                   dev/reference/check_gguf.py's fixture run): the structure (every
//                                   KV equal to the committed model.gguf's, which check_gguf.py
//                                   found equal to llama.cpp's converter's; the tensors' names,
//                                   shapes and types), then our forward on its weights (q/k rows
//                                   permuted back) and on the base + its adapter (alpha / r), on
//                                   the committed tokens, against the committed logits of
//                                   transformers (float64, the merged HF model) and of llama.cpp
//                                   (llama-cpp-python on the committed model.gguf, and on the
//                                   converter's base + adapter.gguf)
//   test_gguf --bpe MODEL.gguf      an f32 export of test_gguf.sh's full fine-tuning of tiny_llama3_bpe (the
//                                   flags of check_gguf.py's BPE_FIX_FLAGS): its vocabulary keys equal to
//                                   the committed bpe_vocab.gguf's (== the converter's, by check_gguf.py;
//                                   with llama.cpp's tokenizer reading it == tokenizers'), read one by one
//                                   (tokens, types, merges, ids, the folder's chat template, byte for byte),
//                                   and our forward on its weights against the logits llama.cpp and
//                                   transformers gave on the same run
//   test_gguf --bpe-vocab FILE      the vocabulary keys alone (another run of tiny_llama3_bpe: LoRA merged)
//   test_gguf --chat FILE FAMILY    tokenizer.chat_template is FAMILY's (llama2 or llama3) of dataloader.h
//                                   (a --data_format chat run of a folder with none)
//   test_gguf --template FILE JSON  tokenizer.chat_template is JSON's "chat_template", byte for byte
//   test_gguf --types FILE TYPE     the tensors' types of an export with --gguf_type TYPE
// and the k-quants: our blocks against ggml's of hard rows, our type mix against the ones
// llama-quantize chose for five shapes (test/fixtures/gguf/kquant_*, check_kquants.py).
// Tolerances (of the logits' largest magnitude): see TOL_HF and TOL_LLAMA below.
#define TESTING
#include "../train_llama2.c"
#include "test_common.h"

// The logits, against the largest logit's magnitude. Measured (dev/reference/check_gguf.py,
// test/fixtures/gguf/measured.json; TEST_VERBOSE=1 prints ours): our fp32 forward vs
// transformers' float64 5.5e-7; llama.cpp (fp32, its KV cache in f32, its own summation
// orders: ggml's vectorised dot products, softmax, RMSNorm) vs transformers 3.0e-7; so ours
// vs llama.cpp ~1e-6. test_gguf.sh also retrains the fixture run, whose weights may differ
// by rounding on another machine (other fused multiply-adds). 2e-5 is ~20x the measured
// differences; a broken export moves the logits by far more (a q permutation left out:
// 0.78; alpha doubled: 0.49).
#define TOL_HF 2e-5
#define TOL_LLAMA 2e-5

#define FIXDIR "test/fixtures/gguf"

// a fixture run: its model, the committed file whose keys (those starting with kv_prefix) an
// export must equal, what llama.cpp must find in it, and the committed tokens and logits
typedef struct {
    const char *model, *kv_ref, *kv_prefix, *tokenizer, *pre;
    int bos, eos;
    const char *tokens, *hf_logits, *llama_logits;
} Fixture;
static const Fixture FIX_LORA = {"test/fixtures/tiny_gqa", "model.gguf", "", "llama", "default", 1, 2,
                                 "tokens.i32", "transformers_logits.f32", "llama_cpp_logits.f32"};
static const Fixture FIX_BPE = {"test/fixtures/tiny_llama3_bpe", "bpe_vocab.gguf", "tokenizer.", "gpt2", "llama-bpe", 400, 409,
                                "bpe_tokens.i32", "bpe_transformers_logits.f32", "bpe_llama_cpp_logits.f32"};

// ---------------------------------------------------------------------------------------
// a GGUF reader: the file in memory, every read bounds-checked

typedef struct { const char *key; size_t klen; uint32_t type; const uint8_t *val; size_t vlen; } RKv;
typedef struct { char name[128]; uint32_t n_dims, type; uint64_t ne[4], offset; const uint8_t *data; size_t bytes; } RTensor;
typedef struct {
    uint8_t *buf; size_t len;
    uint32_t version;
    RKv *kv; uint64_t n_kv;
    RTensor *t; uint64_t n_t;
    const uint8_t *kv_begin, *kv_end; // the KV section's bytes
} RGguf;

typedef struct { const uint8_t *p, *end; int bad; } Cur;
static uint64_t cur_u(Cur *c, int n) {
    if (c->bad || (size_t)(c->end - c->p) < (size_t)n) { c->bad = 1; return 0; }
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v |= (uint64_t)c->p[i] << (8 * i);
    c->p += n;
    return v;
}
static const uint8_t *cur_bytes(Cur *c, uint64_t n) {
    if (c->bad || (uint64_t)(c->end - c->p) < n) { c->bad = 1; return NULL; }
    const uint8_t *p = c->p;
    c->p += n;
    return p;
}
static size_t type_size(uint32_t t) {
    static const size_t sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return t < 13 ? sz[t] : 0;
}
// skips one value of type t (arrays of arrays refused); 0 ok
static int cur_value(Cur *c, uint32_t t, int depth) {
    if (t == GGUF_T_STRING) { uint64_t n = cur_u(c, 8); cur_bytes(c, n); return c->bad; }
    if (t == GGUF_T_ARRAY) {
        if (depth) return -1;
        uint32_t et = (uint32_t)cur_u(c, 4);
        uint64_t n = cur_u(c, 8);
        if (et == GGUF_T_STRING) { for (uint64_t i = 0; i < n && !c->bad; i++) cur_value(c, et, 1); return c->bad; }
        if (!type_size(et) || n > (uint64_t)(c->end - c->p) / type_size(et)) return -1;
        cur_bytes(c, n * type_size(et));
        return c->bad;
    }
    if (!type_size(t)) return -1;
    cur_bytes(c, type_size(t));
    return c->bad;
}

// 0 ok, -1 with why in err
static int gguf_read(RGguf *g, const char *path, char *err, size_t errn) {
    memset(g, 0, sizeof *g);
    g->buf = (uint8_t *)read_file(path, &g->len);
    if (!g->buf) { snprintf(err, errn, "cannot read %s", path); return -1; }
    Cur c = {g->buf, g->buf + g->len, 0};
    const uint8_t *magic = cur_bytes(&c, 4);
    if (!magic || memcmp(magic, "GGUF", 4)) { snprintf(err, errn, "no GGUF magic"); return -1; }
    g->version = (uint32_t)cur_u(&c, 4);
    g->n_t = cur_u(&c, 8);
    g->n_kv = cur_u(&c, 8);
    if (c.bad || g->n_t > 100000 || g->n_kv > 100000) { snprintf(err, errn, "bad counts"); return -1; }
    g->kv = (RKv *)callocCheck(g->n_kv + 1, sizeof(RKv));
    g->t = (RTensor *)callocCheck(g->n_t + 1, sizeof(RTensor));
    g->kv_begin = c.p;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        uint64_t kl = cur_u(&c, 8);
        g->kv[i].key = (const char *)cur_bytes(&c, kl);
        g->kv[i].klen = (size_t)kl;
        g->kv[i].type = (uint32_t)cur_u(&c, 4);
        g->kv[i].val = c.p;
        if (c.bad || cur_value(&c, g->kv[i].type, 0) != 0) { snprintf(err, errn, "bad KV %llu", (unsigned long long)i); return -1; }
        g->kv[i].vlen = (size_t)(c.p - g->kv[i].val);
    }
    g->kv_end = c.p;
    for (uint64_t i = 0; i < g->n_t; i++) {
        RTensor *t = &g->t[i];
        uint64_t nl = cur_u(&c, 8);
        const uint8_t *name = cur_bytes(&c, nl);
        if (!name || nl >= sizeof t->name) { snprintf(err, errn, "bad tensor name %llu", (unsigned long long)i); return -1; }
        memcpy(t->name, name, nl);
        t->n_dims = (uint32_t)cur_u(&c, 4);
        if (t->n_dims < 1 || t->n_dims > 4) { snprintf(err, errn, "%s: %u dims", t->name, t->n_dims); return -1; }
        for (int d = 0; d < 4; d++) t->ne[d] = d < (int)t->n_dims ? cur_u(&c, 8) : 1;
        t->type = (uint32_t)cur_u(&c, 4);
        t->offset = cur_u(&c, 8);
        if (c.bad) { snprintf(err, errn, "truncated tensor info"); return -1; }
    }
    size_t data = ((size_t)(c.p - g->buf) + GGUF_ALIGN - 1) / GGUF_ALIGN * GGUF_ALIGN;
    for (uint64_t i = 0; i < g->n_t; i++) {
        RTensor *t = &g->t[i];
        size_t rb = gguf_row_bytes((int)t->type, t->ne[0]);
        if (!rb || t->ne[0] % (uint64_t)gguf_block_size((int)t->type)) { snprintf(err, errn, "%s: unknown type %u", t->name, t->type); return -1; }
        t->bytes = rb * t->ne[1] * t->ne[2] * t->ne[3];
        if (t->offset % GGUF_ALIGN || data + t->offset > g->len || t->bytes > g->len - data - t->offset) {
            snprintf(err, errn, "%s: data out of the file or misaligned", t->name);
            return -1;
        }
        t->data = g->buf + data + t->offset;
    }
    return 0;
}
static void gguf_close(RGguf *g) { free(g->buf); free(g->kv); free(g->t); memset(g, 0, sizeof *g); }

static const RKv *kv_find(const RGguf *g, const char *key) {
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (g->kv[i].klen == strlen(key) && !memcmp(g->kv[i].key, key, g->kv[i].klen)) return &g->kv[i];
    return NULL;
}
static int kv_str_is(const RGguf *g, const char *key, const char *want) {
    const RKv *k = kv_find(g, key);
    if (!k || k->type != GGUF_T_STRING) return 0;
    Cur c = {k->val, k->val + k->vlen, 0};
    uint64_t n = cur_u(&c, 8);
    return n == strlen(want) && !memcmp(c.p, want, n);
}
static int64_t kv_u32(const RGguf *g, const char *key) {
    const RKv *k = kv_find(g, key);
    if (!k || k->type != GGUF_T_U32) return -1;
    Cur c = {k->val, k->val + k->vlen, 0};
    return (int64_t)cur_u(&c, 4);
}
static const RTensor *t_find(const RGguf *g, const char *name) {
    for (uint64_t i = 0; i < g->n_t; i++) if (!strcmp(g->t[i].name, name)) return &g->t[i];
    return NULL;
}

// ---------------------------------------------------------------------------------------

// x (F32) encoded as type against t's bytes: how many differ (*first: the first), or t->bytes + 1
// when t is not a tensor of that type and size
static size_t encoding_differs(const RTensor *x, const RTensor *t, int type, size_t *first) {
    if (!x || !t || x->type != GGML_F32 || t->type != (uint32_t)type || gguf_row_bytes(type, x->ne[0]) != t->bytes) return t ? t->bytes + 1 : 1;
    float *xs = (float *)mallocCheck(x->bytes);
    memcpy(xs, x->data, x->bytes);
    uint8_t *out = (uint8_t *)mallocCheck(t->bytes);
    gguf_encode_row(type, xs, x->ne[0], out);
    size_t bad = 0;
    for (size_t i = 0; i < t->bytes; i++) if (out[i] != t->data[i] && !bad++) *first = i;
    free(xs); free(out);
    return bad;
}

static void check_encodings(void) {
    RGguf g;
    char err[256] = "";
    int ok = gguf_read(&g, FIXDIR "/encodings.gguf", err, sizeof err) == 0;
    CHECK(ok, "gguf reader reads gguf-py's file", "%s", err);
    if (!ok) return;
    const RTensor *x = t_find(&g, "x");
    const char *names[3] = {"x_f16", "x_bf16", "x_q8_0"};
    int types[3] = {GGML_F16, GGML_BF16, GGML_Q8_0};
    for (int k = 0; k < 3; k++) {
        const RTensor *t = t_find(&g, names[k]);
        char what[96];
        snprintf(what, sizeof what, "%s encoding == gguf-py's, bit for bit (ties, subnormals, overflow)", gguf_type_name(types[k]));
        size_t first = 0, bad = encoding_differs(x, t, types[k], &first);
        CHECK(bad == 0, what, "%zu of %zu bytes differ (more: tensors missing), the first at byte %zu", bad, t ? t->bytes : 0, first);
    }
    gguf_close(&g);
}

// ggml's blocks (ggml_quantize_chunk, the reference quantizers llama-quantize runs) of hard
// rows against ours, byte for byte: test/fixtures/gguf/kquant_blocks.gguf holds each row x
// (F32) and x.TYPE for Q4_K, Q5_K, Q6_K, Q5_0, Q5_1, Q8_0 (dev/reference/check_kquants.py)
static void check_kquant_blocks(void) {
    RGguf g;
    char err[256] = "";
    int ok = gguf_read(&g, FIXDIR "/kquant_blocks.gguf", err, sizeof err) == 0;
    CHECK(ok, "kquant_blocks.gguf reads", "%s", err);
    if (!ok) return;
    int types[6] = {GGML_Q4_K, GGML_Q5_K, GGML_Q6_K, GGML_Q5_0, GGML_Q5_1, GGML_Q8_0};
    for (int k = 0; k < 6; k++) {
        int rows = 0, bad = 0;
        char badname[160] = "", what[160];
        for (uint64_t i = 0; i < g.n_t; i++) {
            const RTensor *x = &g.t[i], *t;
            char name[160];
            snprintf(name, sizeof name, "%s.%s", x->name, gguf_type_name(types[k]));
            if (x->type != GGML_F32 || !(t = t_find(&g, name))) continue;
            size_t first;
            if (encoding_differs(x, t, types[k], &first)) bad++, snprintf(badname, sizeof badname, "%s", name);
            rows++;
        }
        snprintf(what, sizeof what, "%s blocks == ggml's reference quantizer's, byte for byte (%d hard rows)", gguf_type_name(types[k]), rows);
        CHECK(rows >= 20 && bad == 0, what, "%d of %d rows differ (%s)", bad, rows, badname);
    }
    gguf_close(&g);
}

// llama.cpp's name of a base weight -> its param_* and layer; 0 ok
static int gguf_param_of(const char *name, int *p, int *l) {
    for (int k = 0; k < NUM_PARAM_TENSORS; k++) {
        char want[96];
        int layer = 0, n = 0;
        if (param_per_layer(k)) {
            if (sscanf(name, "blk.%d.%n", &layer, &n) != 1 || layer < 0) continue;
            snprintf(want, sizeof want, gguf_param_names[k], layer);
        } else snprintf(want, sizeof want, "%s", gguf_param_names[k]);
        strcat(want, ".weight");
        if (!strcmp(name, want)) { *p = k, *l = layer; return 0; }
    }
    return -1;
}

// the k-quant type of each 2-D weight (gguf_kquant_type) against the ones llama-quantize gave
// the shapes of test/fixtures/gguf/kquant_types.txt (dev/reference/check_kquants.py)
static void check_kquant_types(void) {
    FILE *f = fopen(FIXDIR "/kquant_types.txt", "r");
    CHECK(f != NULL, "kquant_types.txt reads", "%s", strerror(errno));
    if (!f) return;
    char line[256], shape[64] = "", badline[300] = "";
    Config c;
    int n = 0, bad = 0, shapes = 0;
    while (fgets(line, sizeof line, f)) {
        char ft[16], name[128], type[16];
        int layers, dim, hidden, heads, kv, tied, p, l, gtype = -1;
        if (line[0] == '#') continue;
        if (sscanf(line, "shape %63s %d %d %d %d %d %d", shape, &layers, &dim, &hidden, &heads, &kv, &tied) == 7) {
            memset(&c, 0, sizeof c);
            c.n_layers = layers, c.dim = dim, c.hidden_dim = hidden, c.n_heads = heads, c.n_kv_heads = kv, c.tied = tied;
            c.head_dim = dim / heads, c.vocab_size = 512;
            shapes++;
            continue;
        }
        if (sscanf(line, "%15s %127s %15s", ft, name, type) != 3) continue;
        for (int i = 0; i < (int)(sizeof gguf_type_names / sizeof *gguf_type_names); i++) if (!strcmp(ft, gguf_type_names[i])) gtype = i;
        int64_t rows, cols;
        int ok = gtype >= 0 && gguf_is_kquant(gtype) && gguf_param_of(name, &p, &l) == 0;
        if (ok) param_shape(&c, p, &rows, &cols);
        if (!ok || strcmp(gguf_type_name(gguf_kquant_type(gtype, &c, p, l, cols)), type))
            bad++, snprintf(badline, sizeof badline, "%s: %s %s is %s here", shape, ft, name, ok ? gguf_type_name(gguf_kquant_type(gtype, &c, p, l, cols)) : "?");
        n++;
    }
    fclose(f);
    char what[160];
    snprintf(what, sizeof what, "k-quant types == llama-quantize's (%d tensors of %d shapes, 16 and 80 layers among them)", n, shapes);
    CHECK(n > 500 && shapes >= 5 && bad == 0, what, "%d differ (the last: %s)", bad, badline);
}

// f32 data of a tensor (F32 only here)
static const float *t_f32(const RTensor *t) { return t && t->type == GGML_F32 ? (const float *)(const void *)t->data : NULL; }

// a fixture's model (full fine-tuning's layout: params whole), B = 1, T = n
static int setup_model(Model *m, const char *dir, int T) {
    TrainConfig tc;
    char *argv[] = {(char *)"test_gguf", (char *)"--model", (char *)dir, (char *)"--data",
                    (char *)"test/fixtures/data.jsonl", (char *)"--full_finetune", (char *)"--max_seq_len", (char *)"24",
                    (char *)"--threads", (char *)"1"};
    if (parse_args(&tc, (int)(sizeof argv / sizeof argv[0]), argv) != 0) return -1;
    return model_setup(m, NULL, &tc, 1, T, NULL);
}

static float *read_f32s(const char *path, size_t n) {
    size_t len;
    char *b = read_file(path, &len);
    if (!b || len != n * 4) { free(b); return NULL; }
    return (float *)(void *)b;
}

// max |a - b| / max |b|
static double rel_diff(const float *a, const float *b, size_t n) {
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) { d = fmax(d, fabs((double)a[i] - b[i])); s = fmax(s, fabs((double)b[i])); }
    return d / s;
}

static void compare_logits(const char *what, const float *logits, size_t n, const char *ref, double tol) {
    char path[256], w[256];
    snprintf(path, sizeof path, FIXDIR "/%s", ref);
    float *want = read_f32s(path, n);
    snprintf(w, sizeof w, "%s: our forward's logits == %s within %g of their scale", what, ref, tol);
    if (!want) { test_skip(w, "no fixture (dev/reference/check_gguf.py --fixtures writes it with llama-cpp-python)"); return; }
    double d = rel_diff(logits, want, n);
    CHECK(d <= tol, w, "%.3g", d);
    free(want);
}

// our forward's logits (24, vocab) on the fixture's tokens, every next token a target, against
// transformers' and llama.cpp's (llama_ref) on the same weights
static void check_forward(Model *m, const Fixture *fx, const char *label, const char *kind, const char *llama_ref) {
    int tokens[24], targets[24];
    size_t tl, n = (size_t)24 * m->host.config.vocab_size;
    char path[256], what[256];
    snprintf(path, sizeof path, FIXDIR "/%s", fx->tokens);
    char *tb = read_file(path, &tl);
    if (!tb || tl != sizeof tokens) die("cannot read %s", path);
    memcpy(tokens, tb, sizeof tokens);
    free(tb);
    for (int i = 0; i < 24; i++) targets[i] = i + 1 < 24 ? tokens[i + 1] : -100;
    float *logits = (float *)mallocCheck(n * sizeof(float));
    model_forward(m, tokens, targets, 1, 24, logits);
    snprintf(what, sizeof what, "%s (%s)", label, kind);
    compare_logits(what, logits, n, fx->hf_logits, TOL_HF);
    compare_logits(what, logits, n, llama_ref, TOL_LLAMA);
    free(logits);
}

// the KVs of g whose keys start with prefix, equal (in order, key, type and bytes) to those of ref's
static int kv_equal(const RGguf *g, const RGguf *ref, const char *prefix, char *why, size_t wn) {
    size_t pl = strlen(prefix);
    uint64_t i = 0, j = 0;
    for (;; i++, j++) {
        while (i < g->n_kv && (g->kv[i].klen < pl || memcmp(g->kv[i].key, prefix, pl))) i++;
        while (j < ref->n_kv && (ref->kv[j].klen < pl || memcmp(ref->kv[j].key, prefix, pl))) j++;
        if (i == g->n_kv || j == ref->n_kv) break;
        const RKv *a = &g->kv[i], *b = &ref->kv[j];
        if (a->klen != b->klen || memcmp(a->key, b->key, a->klen) || a->type != b->type || a->vlen != b->vlen || memcmp(a->val, b->val, a->vlen)) {
            snprintf(why, wn, "%.*s: other %s than the committed %.*s", (int)a->klen, a->key,
                     a->klen != b->klen || memcmp(a->key, b->key, a->klen) ? "key" : "value", (int)b->klen, b->key);
            return 0;
        }
    }
    if (i != g->n_kv || j != ref->n_kv) { snprintf(why, wn, "%s keys: %s has more", prefix, i != g->n_kv ? "the file" : "the committed file"); return 0; }
    return 1;
}

// element k of an array KV of strings (*len bytes; NULL: not one) or of i32
static const char *kv_str_at(const RGguf *g, const char *key, uint64_t k, uint64_t *n, size_t *len) {
    const RKv *kv = kv_find(g, key);
    if (!kv || kv->type != GGUF_T_ARRAY) return NULL;
    Cur c = {kv->val, kv->val + kv->vlen, 0};
    if (cur_u(&c, 4) != GGUF_T_STRING) return NULL;
    *n = cur_u(&c, 8);
    for (uint64_t i = 0; i < *n && !c.bad; i++) {
        uint64_t l = cur_u(&c, 8);
        const uint8_t *p = cur_bytes(&c, l);
        if (i == k) { *len = (size_t)l; return (const char *)p; }
    }
    return NULL;
}
static int64_t kv_i32_at(const RGguf *g, const char *key, uint64_t k) {
    const RKv *kv = kv_find(g, key);
    if (!kv || kv->type != GGUF_T_ARRAY) return INT64_MIN;
    Cur c = {kv->val, kv->val + kv->vlen, 0};
    if (cur_u(&c, 4) != GGUF_T_I32 || k >= cur_u(&c, 8)) return INT64_MIN;
    cur_bytes(&c, 4 * k);
    return (int32_t)cur_u(&c, 4);
}
// a string KV's bytes (NULL: none)
static const char *kv_text(const RGguf *g, const char *key, size_t *len) {
    const RKv *k = kv_find(g, key);
    if (!k || k->type != GGUF_T_STRING) return NULL;
    Cur c = {k->val, k->val + k->vlen, 0};
    *len = (size_t)cur_u(&c, 8);
    return (const char *)cur_bytes(&c, *len);
}
static int kv_text_is(const RGguf *g, const char *key, const char *want, size_t n) {
    size_t len;
    const char *t = kv_text(g, key, &len);
    return t && len == n && !memcmp(t, want, n);
}

// the vocabulary keys of an export of tiny_llama3_bpe: equal to the committed ones, then read
// one by one against the folder's own files
static void check_bpe_vocab(const RGguf *g, const char *label) {
    RGguf ref;
    char err[256] = "", what[256], why[256] = "";
    int ok = gguf_read(&ref, FIXDIR "/bpe_vocab.gguf", err, sizeof err) == 0;
    snprintf(what, sizeof what, "%s: every tokenizer.* key == the committed bpe_vocab.gguf's (== the converter's)", label);
    CHECK(ok && kv_equal(g, &ref, "tokenizer.", why, sizeof why), what, "%s", ok ? why : err);
    if (ok) gguf_close(&ref);
    JsonValue tj, tc;
    if (json_load_file("test/fixtures/tiny_llama3_bpe/tokenizer.json", &tj) != 0 ||
        json_load_file("test/fixtures/tiny_llama3_bpe/tokenizer_config.json", &tc) != 0) die("cannot read tiny_llama3_bpe's files");
    const JsonValue *merges = json_get(json_get(&tj, "model"), "merges"), *tmpl = json_get(&tc, "chat_template");
    uint64_t n = 0, nm = 0;
    size_t len = 0, ml = 0;
    const char *t400 = kv_str_at(g, "tokenizer.ggml.tokens", 400, &n, &len), *t220 = kv_str_at(g, "tokenizer.ggml.tokens", 220, &n, &len);
    const char *pad = kv_str_at(g, "tokenizer.ggml.tokens", 511, &n, &len);
    const char *m0 = kv_str_at(g, "tokenizer.ggml.merges", 0, &nm, &ml);
    snprintf(what, sizeof what, "%s: 512 tokens (the vocab's strings, added tokens, [PADi] up to vocab_size) and their types", label);
    CHECK(n == 512 && t400 && !memcmp(t400, "<|begin_of_text|>", 17) && t220 && !memcmp(t220, "\xc4\xa0", 2) &&
          pad && len == 8 && !memcmp(pad, "[PAD511]", 8) && kv_i32_at(g, "tokenizer.ggml.token_type", 0) == TOK_NORMAL &&
          kv_i32_at(g, "tokenizer.ggml.token_type", 409) == TOK_CONTROL && kv_i32_at(g, "tokenizer.ggml.token_type", 411) == TOK_USER_DEFINED &&
          kv_i32_at(g, "tokenizer.ggml.token_type", 412) == TOK_UNUSED, what, "%llu tokens, or other strings or types", (unsigned long long)n);
    snprintf(what, sizeof what, "%s: merges: tokenizer.json's pairs, joined by a space (\"\\u0120 \\u0120\" first)", label);
    CHECK(merges && nm == (uint64_t)merges->count && m0 && ml == 5 && !memcmp(m0, "\xc4\xa0 \xc4\xa0", 5), what, "%llu merges",
          (unsigned long long)nm);
    snprintf(what, sizeof what, "%s: gpt2, llama-bpe, bos 400 and eos 409 (tokenizer_config.json's), add_bos_token (the post-processor's)", label);
    const RKv *add_bos = kv_find(g, "tokenizer.ggml.add_bos_token");
    CHECK(kv_str_is(g, "tokenizer.ggml.model", "gpt2") && kv_str_is(g, "tokenizer.ggml.pre", "llama-bpe") &&
          kv_u32(g, "tokenizer.ggml.bos_token_id") == 400 && kv_u32(g, "tokenizer.ggml.eos_token_id") == 409 && add_bos &&
          add_bos->type == GGUF_T_BOOL && add_bos->val[0] == 1 && !kv_find(g, "tokenizer.ggml.eot_token_id"), what, "another value");
    snprintf(what, sizeof what, "%s: tokenizer.chat_template == tokenizer_config.json's, byte for byte", label);
    CHECK(tmpl && tmpl->type == JSON_STRING && kv_text_is(g, "tokenizer.chat_template", tmpl->string, tmpl->string_len), what, "other bytes");
    json_free(&tj), json_free(&tc);
}

// the model file of a fixture run: structure, its keys, then its weights (q/k rows permuted back) in our forward
static void check_model(const char *path, const Fixture *fx, const char *label) {
    RGguf g, ref;
    char err[256] = "", what[256], why[256] = "";
    int ok = gguf_read(&g, path, err, sizeof err) == 0 && g.version == 3;
    snprintf(what, sizeof what, "%s: a GGUF v3 file, every tensor's data aligned and inside it", label);
    CHECK(ok, what, "%s", err);
    if (!ok) return;
    Model m;
    if (setup_model(&m, fx->model, 24) != 0) die("cannot set up %s", fx->model);
    const Config *c = &m.host.config;
    snprintf(what, sizeof what, "%s: llama.cpp's required metadata", label);
    CHECK(kv_str_is(&g, "general.architecture", "llama") && kv_str_is(&g, "general.type", "model") &&
          kv_u32(&g, "llama.block_count") == c->n_layers && kv_u32(&g, "llama.context_length") == c->max_pos &&
          kv_u32(&g, "llama.embedding_length") == c->dim && kv_u32(&g, "llama.feed_forward_length") == c->hidden_dim &&
          kv_u32(&g, "llama.attention.head_count") == c->n_heads && kv_u32(&g, "llama.attention.head_count_kv") == c->n_kv_heads &&
          kv_u32(&g, "llama.rope.dimension_count") == c->head_dim && kv_u32(&g, "general.file_type") == 0 &&
          kv_find(&g, "llama.rope.freq_base") && kv_find(&g, "llama.attention.layer_norm_rms_epsilon") &&
          kv_str_is(&g, "tokenizer.ggml.model", fx->tokenizer) && kv_str_is(&g, "tokenizer.ggml.pre", fx->pre) &&
          kv_u32(&g, "tokenizer.ggml.bos_token_id") == fx->bos && kv_u32(&g, "tokenizer.ggml.eos_token_id") == fx->eos, what,
          "a key is missing or has another value");
    // the KVs as the committed file's (== llama.cpp's converter's, by check_gguf.py)
    char refpath[256];
    snprintf(refpath, sizeof refpath, FIXDIR "/%s", fx->kv_ref);
    ok = gguf_read(&ref, refpath, why, sizeof why) == 0;
    snprintf(what, sizeof what, "%s: every %s key and value (the vocabulary's tokens, scores, types) == the converter's", label,
             fx->kv_prefix[0] ? fx->kv_prefix : "");
    CHECK(ok && kv_equal(&g, &ref, fx->kv_prefix, why, sizeof why), what, "%s", why);
    if (ok) gguf_close(&ref);
    if (fx == &FIX_BPE) check_bpe_vocab(&g, label);
    // the tensors: llama.cpp's names and shapes, F32, nothing else (but rope_freqs: llama3 RoPE)
    float *ptrs[NUM_PARAM_TENSORS];
    param_tensors(&m.host.w, ptrs);
    int *qmap = gguf_llama_row_map(c->n_heads, c->head_dim), *kmap = gguf_llama_row_map(c->n_kv_heads, c->head_dim);
    int found = c->rope_type == ROPE_LLAMA3 && t_find(&g, "rope_freqs.weight"), bad = 0;
    char badname[160] = "";
    for (int p = 0; p < NUM_PARAM_TENSORS; p++) {
        if (p == P_HEAD && c->tied) continue;
        int64_t rows, cols;
        param_shape(c, p, &rows, &cols);
        for (int l = 0; l < (param_per_layer(p) ? c->n_layers : 1); l++) {
            char name[96];
            snprintf(name, sizeof name - 8, gguf_param_names[p], l);
            strcat(name, ".weight");
            const RTensor *t = t_find(&g, name);
            const float *src = t_f32(t);
            if (!src || t->n_dims != (rows == 1 ? 1u : 2u) || t->ne[0] != (uint64_t)cols || t->ne[1] != (uint64_t)(rows == 1 ? 1 : rows)) {
                bad++;
                snprintf(badname, sizeof badname, "%s", name);
                continue;
            }
            found++;
            float *dst = ptrs[p] + (size_t)l * rows * cols;
            const int *map = p == P_WQ ? qmap : p == P_WK ? kmap : NULL;
            for (int64_t r = 0; r < rows; r++) memcpy(dst + (size_t)(map ? map[r] : r) * cols, src + (size_t)r * cols, (size_t)cols * 4);
        }
    }
    snprintf(what, sizeof what, "%s: tensors by llama.cpp's names and shapes (ne = {in, out}), F32, no others", label);
    CHECK(bad == 0 && (uint64_t)found == g.n_t, what, "%d bad (%s), %d found of %llu", bad, badname, found, (unsigned long long)g.n_t);
    check_forward(&m, fx, label, fx == &FIX_BPE ? "fine-tuned model" : "merged model", fx->llama_logits);
    free(qmap); free(kmap);
    model_free(&m);
    gguf_close(&g);
}

// the adapter file: structure, then base + (alpha / r) B A (B's q/k rows permuted back) in our forward
static void check_adapter(const char *path, const char *label) {
    RGguf g;
    char err[256] = "", what[256];
    int ok = gguf_read(&g, path, err, sizeof err) == 0 && g.version == 3;
    snprintf(what, sizeof what, "%s: a GGUF v3 file", label);
    CHECK(ok, what, "%s", err);
    if (!ok) return;
    const RKv *alpha = kv_find(&g, "adapter.lora.alpha");
    snprintf(what, sizeof what, "%s: llama.cpp's adapter metadata (general.type adapter, adapter.type lora, alpha f32)", label);
    CHECK(kv_str_is(&g, "general.architecture", "llama") && kv_str_is(&g, "general.type", "adapter") &&
          kv_str_is(&g, "adapter.type", "lora") && alpha && alpha->type == GGUF_T_F32, what, "missing or of another type");
    if (!alpha || alpha->type != GGUF_T_F32) { gguf_close(&g); return; }
    float a;
    memcpy(&a, alpha->val, 4);
    Model m;
    if (setup_model(&m, FIX_LORA.model, 24) != 0) die("cannot set up tiny_gqa");
    const Config *c = &m.host.config;
    float *ptrs[NUM_PARAM_TENSORS];
    param_tensors(&m.host.w, ptrs);
    int *qmap = gguf_llama_row_map(c->n_heads, c->head_dim), *kmap = gguf_llama_row_map(c->n_kv_heads, c->head_dim);
    int in[LORA_N_TARGETS], out[LORA_N_TARGETS], pairs = 0, bad = 0, r = -1;
    lora_shapes(c, in, out);
    for (int l = 0; l < c->n_layers; l++)
        for (int t = 0; t < LORA_N_TARGETS; t++) {
            char base[64], na[96], nb[96];
            snprintf(base, sizeof base, gguf_param_names[gguf_lora_param[t]], l);
            snprintf(na, sizeof na, "%s.weight.lora_a", base);
            snprintf(nb, sizeof nb, "%s.weight.lora_b", base);
            const RTensor *A = t_find(&g, na), *B = t_find(&g, nb);
            if (!A && !B) continue;
            if (!t_f32(A) || !t_f32(B) || A->ne[0] != (uint64_t)in[t] || B->ne[1] != (uint64_t)out[t] || A->ne[1] != B->ne[0]) { bad++; continue; }
            pairs++;
            r = (int)A->ne[1];
            const float *Ad = t_f32(A), *Bd = t_f32(B);
            const int *map = t == LORA_Q ? qmap : t == LORA_K ? kmap : NULL;
            float *W = ptrs[gguf_lora_param[t]] + (size_t)l * out[t] * in[t];
            for (int o = 0; o < out[t]; o++) { // llama.cpp's row o is Hugging Face's row map[o]
                float *row = W + (size_t)(map ? map[o] : o) * in[t];
                for (int j = 0; j < r; j++) {
                    double b = (double)a / r * Bd[(size_t)o * r + j];
                    for (int k = 0; k < in[t]; k++) row[k] += (float)(b * Ad[(size_t)j * in[t] + k]);
                }
            }
        }
    snprintf(what, sizeof what, "%s: lora_a {in, r} and lora_b {r, out} pairs by llama.cpp's names, F32", label);
    CHECK(bad == 0 && pairs > 0 && (uint64_t)pairs * 2 == g.n_t, what, "%d bad, %d pairs, %llu tensors", bad, pairs, (unsigned long long)g.n_t);
    check_forward(&m, &FIX_LORA, label, "base + adapter", "llama_cpp_lora_logits.f32");
    free(qmap); free(kmap);
    model_free(&m);
    gguf_close(&g);
}

// --types FILE TYPE: 2-D tensors of TYPE (Q8_0 where rows are whole blocks; a k-quant: the
// mix gguf_kquant_type gives the file's shape), 1-D ones F32
static void check_types(const char *path, const char *type) {
    RGguf g;
    char err[256] = "", what[256];
    int gtype = -1;
    for (int i = 0; i < (int)(sizeof gguf_type_names / sizeof *gguf_type_names); i++) if (!strcmp(type, gguf_type_names[i])) gtype = i;
    int ok = gtype >= 0 && gguf_read(&g, path, err, sizeof err) == 0;
    snprintf(what, sizeof what, "--gguf_type %s: %s reads", type, path);
    CHECK(ok, what, "%s", gtype < 0 ? "unknown type" : err);
    if (!ok) return;
    Config c = {0}; // the shape gguf_kquant_type reads
    c.n_layers = (int)kv_u32(&g, "llama.block_count"), c.n_heads = (int)kv_u32(&g, "llama.attention.head_count");
    c.n_kv_heads = kv_find(&g, "llama.attention.head_count_kv") ? (int)kv_u32(&g, "llama.attention.head_count_kv") : c.n_heads;
    c.tied = !t_find(&g, "output.weight");
    int bad = 0;
    char badname[160] = "";
    for (uint64_t i = 0; i < g.n_t; i++) {
        const RTensor *t = &g.t[i];
        int p, l;
        uint32_t want = t->n_dims == 1 ? GGML_F32
                      : !gguf_is_kquant(gtype) ? (uint32_t)gguf_weight_type(gtype, (int64_t)t->ne[0])
                      : gguf_param_of(t->name, &p, &l) == 0 ? (uint32_t)gguf_kquant_type(gtype, &c, p, l, (int64_t)t->ne[0]) : 0;
        if (t->type != want) { bad++; snprintf(badname, sizeof badname, "%s is %s", t->name, gguf_type_name((int)t->type)); }
    }
    int64_t ft = kv_u32(&g, "general.file_type");
    snprintf(what, sizeof what, "--gguf_type %s: weights %s, norms F32, general.file_type %d", type, type, gguf_file_type[gtype]);
    CHECK(bad == 0 && (ft == gguf_file_type[gtype] || !kv_find(&g, "general.file_type")), what, "%d bad (%s), file_type %lld",
          bad, badname, (long long)ft);
    gguf_close(&g);
}

// --chat FILE FAMILY / --template FILE JSON: the file's tokenizer.chat_template is want (n bytes)
static void check_template(const char *path, const char *want, size_t n, const char *what) {
    RGguf g;
    char err[256] = "";
    int ok = gguf_read(&g, path, err, sizeof err) == 0;
    size_t len = 0;
    const char *t = ok ? kv_text(&g, "tokenizer.chat_template", &len) : NULL;
    CHECK(t && len == n && !memcmp(t, want, n), what, "%s", !ok ? err : !t ? "no tokenizer.chat_template" : "other bytes");
    if (ok) gguf_close(&g);
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "--types")) {
        check_types(argv[2], argv[3]);
        return test_summary();
    }
    if (argc == 3 && !strcmp(argv[1], "--bpe")) {
        check_model(argv[2], &FIX_BPE, "--export_gguf (tiny_llama3_bpe)");
        return test_summary();
    }
    if (argc == 3 && !strcmp(argv[1], "--bpe-vocab")) {
        RGguf g;
        char err[256] = "";
        CHECK(gguf_read(&g, argv[2], err, sizeof err) == 0, "--bpe-vocab: the file reads", "%s", err);
        check_bpe_vocab(&g, argv[2]);
        gguf_close(&g);
        return test_summary();
    }
    if (argc == 4 && !strcmp(argv[1], "--chat")) {
        const char *t = !strcmp(argv[3], "llama3") ? CHAT_JINJA_LLAMA3 : CHAT_JINJA_LLAMA2;
        char what[256];
        snprintf(what, sizeof what, "--data_format chat, no template in the folder: tokenizer.chat_template is dataloader.h's %s", argv[3]);
        check_template(argv[2], t, strlen(t), what);
        return test_summary();
    }
    if (argc == 4 && !strcmp(argv[1], "--template")) {
        JsonValue j;
        if (json_load_file(argv[3], &j) != 0 || !json_get(&j, "chat_template") || json_get(&j, "chat_template")->type != JSON_STRING)
            die("%s: no chat_template string", argv[3]);
        check_template(argv[2], json_get(&j, "chat_template")->string, json_get(&j, "chat_template")->string_len,
                       "tokenizer.chat_template == the folder's tokenizer_config.json's, byte for byte");
        json_free(&j);
        return test_summary();
    }
    if (argc == 3) {
        check_model(argv[1], &FIX_LORA, "--export_gguf");
        check_adapter(argv[2], "--export_gguf_adapter");
        return test_summary();
    }
    check_encodings();
    check_kquant_blocks();
    check_kquant_types();
    check_model(FIXDIR "/model.gguf", &FIX_LORA, "committed model.gguf");
    check_adapter(FIXDIR "/adapter.gguf", "committed adapter.gguf");
    return test_summary();
}
