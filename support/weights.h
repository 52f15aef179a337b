// weights.h: a model folder's weights, in whichever format the folder holds
// them, each tensor seen under its Hugging Face name and shape. Tried in this
// order (transformers too prefers safetensors when a folder has both):
//   model.safetensors, or model.safetensors.index.json + the shards it names
//   pytorch_model.bin, or pytorch_model.bin.index.json + the shards it names
//     (torch.save's files: support/torch_zip.h)
//   params.json + consolidated.00.pth, .01, ...: Meta's original download,
//     one file per model-parallel rank, renamed and reassembled (see below)
// An index and its shards must agree: a tensor that is in a shard but not in
// the weight_map is REFUSED, since silently picking one copy could load stale
// weights. weights_read_f32 reads only the elements asked for, so that a rank
// reads only the bytes it keeps.
//
// Errors go to stderr as safetensors.h's do ("error: <path>: <problem>"), and
// the function returns -1.
#ifndef WEIGHTS_H
#define WEIGHTS_H

#include "safetensors.h"
#include "torch_zip.h"
#include <dirent.h>

#define WEIGHTS_MAX_INDEX_LEN 100000000L // an index file's (or params.json's) size limit
#define WEIGHTS_MAX_PARTS 64             // Meta's files (70B has 8)

typedef struct {
    const char *name;        // Hugging Face's name
    int file;                // index into Weights.files of the file holding it (Meta's: its first part's)
    const StTensor *tensor;  // its dtype and shape (Meta's: the whole tensor's)
    // Meta's model-parallel pieces: part k is parts[k], in files[k] (n_parts 0 for a plain tensor),
    // concatenated along axis cat (0: rows, 1: columns, -1: replicated, part 0 read); rope > 0: rows
    // reordered from Meta's interleaved RoPE pairs to Hugging Face's halves in each block of rope rows
    const StTensor *const *parts;
    int n_parts, cat, rope;
} WeightsEntry;

typedef struct {
    char *dir;
    StFile *files;           // each distinct file opened once
    int n_files;
    WeightsEntry *entries;   // all tensors, sorted by name
    int n_entries;
    JsonValue index;         // the parsed index file (JSON_NULL without one)
    StTensor *whole;         // Meta's: the assembled tensors' names and shapes (NULL otherwise)
    const StTensor **part_table; // Meta's: n_entries * n_files part pointers
} Weights;

static inline void weights_close(Weights *m) {
    if (!m) return;
    for (int i = 0; i < m->n_files; i++) st_close(&m->files[i]);
    for (int i = 0; m->whole && i < m->n_entries; i++) free(m->whole[i].name);
    free(m->files);
    free(m->entries);
    free(m->whole);
    free((void *)m->part_table);
    free(m->dir);
    json_free(&m->index);
    memset(m, 0, sizeof *m);
}

static inline int weights__cmp_entry(const void *a, const void *b) {
    return strcmp(((const WeightsEntry *)a)->name, ((const WeightsEntry *)b)->name);
}
static inline int weights__cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

static inline int weights__exists(const char *dir, const char *name) {
    char *p = st__join(dir, name);
    int yes = p && access(p, F_OK) == 0;
    free(p);
    return yes;
}

// a shard name from the index must be a plain file name inside dir
static inline int weights__plain_filename(const JsonValue *v) {
    if (v->type != JSON_STRING || v->string_len == 0 || strlen(v->string) != v->string_len) return 0;
    if (strchr(v->string, '/') || strchr(v->string, '\\')) return 0;
    if (strcmp(v->string, ".") == 0 || strcmp(v->string, "..") == 0) return 0;
    return 1;
}

typedef int (*WeightsOpenFn)(StFile *sf, const char *path); // st_open or pt_open

// one file, dir/<single>: its tensors (sorted by name already) are the entries
static inline int weights__open_single(Weights *m, const char *single, WeightsOpenFn open_file) {
    m->files = (StFile *)calloc(1, sizeof(StFile));
    if (!m->files) { st__err(m->dir, NULL, "out of memory"); return -1; }
    if (open_file(&m->files[0], single)) return -1;
    m->n_files = 1;
    StFile *sf = &m->files[0];
    m->entries = (WeightsEntry *)calloc(sf->n_tensors ? (size_t)sf->n_tensors : 1, sizeof(WeightsEntry));
    if (!m->entries) { st__err(single, NULL, "out of memory"); return -1; }
    for (int i = 0; i < sf->n_tensors; i++) {
        m->entries[i].name = sf->tensors[i].name;
        m->entries[i].tensor = &sf->tensors[i];
    }
    m->n_entries = sf->n_tensors;
    return 0;
}

// the JSON file ipath (an index, params.json) parsed into out (its size bounded first: it is untrusted too)
static inline int weights__read_json(const char *ipath, JsonValue *out) {
    FILE *f = fopen(ipath, "rb");
    if (!f) { st__err(ipath, NULL, "cannot open: %s", strerror(errno)); return -1; }
    if (fseeko(f, 0, SEEK_END) != 0) { st__err(ipath, NULL, "cannot seek: %s", strerror(errno)); fclose(f); return -1; }
    off_t len = ftello(f);
    if (len < 0 || len > WEIGHTS_MAX_INDEX_LEN) { st__err(ipath, NULL, "file size %lld is not sane", (long long)len); fclose(f); return -1; }
    rewind(f);
    char err[256], *text = (char *)malloc((size_t)len + 1);
    size_t got = text ? fread(text, 1, (size_t)len, f) : 0;
    fclose(f);
    int rc = -1;
    if (!text) st__err(ipath, NULL, "out of memory");
    else if (got != (size_t)len) st__err(ipath, NULL, "cannot read the file");
    else if (json_parse(text, (size_t)len, out, err, sizeof err)) st__err(ipath, NULL, "not valid JSON: %s", err);
    else rc = 0;
    free(text);
    return rc;
}

// the index's weight_map, the object it must be (and "metadata", if there, an object); NULL with a message
static inline const JsonValue *weights__weight_map(Weights *m, const char *ipath) {
    const JsonValue *idx = &m->index;
    if (idx->type != JSON_OBJECT) { st__err(ipath, NULL, "index is a JSON %s, expected an object", json_type_name(idx->type)); return NULL; }
    const JsonValue *meta = json_get(idx, "metadata");
    if (meta && meta->type != JSON_OBJECT) { st__err(ipath, NULL, "\"metadata\" is a JSON %s, expected an object", json_type_name(meta->type)); return NULL; }
    const JsonValue *wm = json_get(idx, "weight_map");
    if (!wm) { st__err(ipath, NULL, "missing \"weight_map\""); return NULL; }
    if (wm->type != JSON_OBJECT) { st__err(ipath, NULL, "\"weight_map\" is a JSON %s, expected an object", json_type_name(wm->type)); return NULL; }
    int dup = json_find_duplicate_key(wm);
    if (dup >= 0) { st__err(ipath, wm->keys[dup], "listed twice in weight_map"); return NULL; }
    if (json_find_duplicate_key(idx) >= 0) { st__err(ipath, NULL, "duplicate top-level key"); return NULL; }
    return wm;
}

// the distinct shard file names of weight_map, sorted, into names[0..*nd), after
// checking that each is a plain file name inside dir
static inline int weights__shard_names(const JsonValue *wm, const char *ipath, const char *dir, const char **names, int *nd) {
    for (int i = 0; i < wm->count; i++) {
        if (strlen(wm->keys[i]) != wm->key_lens[i]) { st__err(ipath, NULL, "a tensor name contains a NUL character"); return -1; }
        if (!weights__plain_filename(&wm->items[i])) {
            char q[160];
            if (wm->items[i].type == JSON_STRING)
                st__err(ipath, wm->keys[i], "shard file \"%s\" is not a plain file name inside %s (no '/', '..')",
                        st__quote(wm->items[i].string, q, sizeof q), dir);
            else st__err(ipath, wm->keys[i], "shard file name is a JSON %s, expected a string", json_type_name(wm->items[i].type));
            return -1;
        }
        names[i] = wm->items[i].string;
    }
    qsort(names, (size_t)wm->count, sizeof *names, weights__cmp_str);
    *nd = 0;
    for (int i = 0; i < wm->count; i++)
        if (*nd == 0 || strcmp(names[*nd - 1], names[i]) != 0) names[(*nd)++] = names[i];
    return 0;
}

// opens the nd shards dir/names[i] into m->files; *total: the tensors they hold
static inline int weights__open_shards(Weights *m, const char *ipath, const char *const *names, int nd, int *total,
                                       WeightsOpenFn open_file) {
    m->files = (StFile *)calloc(nd ? (size_t)nd : 1, sizeof(StFile));
    if (!m->files) { st__err(ipath, NULL, "out of memory"); return -1; }
    *total = 0;
    for (int i = 0; i < nd; i++) {
        char *sp = st__join(m->dir, names[i]);
        if (!sp) { st__err(ipath, NULL, "out of memory"); return -1; }
        int r = open_file(&m->files[i], sp);
        free(sp);
        if (r) { st__err(ipath, NULL, "cannot open shard \"%s\" (see above)", names[i]); return -1; }
        m->n_files = i + 1;
        *total += m->files[i].n_tensors;
    }
    return 0;
}

// m->entries, sorted by name: each weight_map entry's tensor, which must exist in
// its shard; and no shard may hold a tensor the map does not send to it
static inline int weights__map_entries(Weights *m, const char *ipath, const JsonValue *wm, const char *const *names, int nd, int total) {
    m->entries = (WeightsEntry *)calloc(wm->count ? (size_t)wm->count : 1, sizeof(WeightsEntry));
    if (!m->entries) { st__err(ipath, NULL, "out of memory"); return -1; }
    for (int i = 0; i < wm->count; i++) {
        const char *fname = wm->items[i].string;
        int lo = 0, hi = nd - 1, fi = -1;
        while (lo <= hi) { // shard index by name (names[] is sorted)
            int mid = lo + (hi - lo) / 2, c = strcmp(fname, names[mid]);
            if (c == 0) { fi = mid; break; }
            if (c < 0) hi = mid - 1; else lo = mid + 1;
        }
        const StTensor *t = fi >= 0 ? st_find(&m->files[fi], wm->keys[i]) : NULL;
        if (!t) { st__err(ipath, wm->keys[i], "weight_map says shard \"%s\", but that shard has no such tensor", fname); return -1; }
        m->entries[i].name = t->name;
        m->entries[i].file = fi;
        m->entries[i].tensor = t;
    }
    m->n_entries = wm->count;
    // each tensor is mapped to one shard, so if the shards hold more tensors
    // than the map names, some shard tensor is unmapped: find it for the message
    if (total != wm->count) {
        for (int i = 0; i < nd; i++)
            for (int j = 0; j < m->files[i].n_tensors; j++) {
                const StTensor *t = &m->files[i].tensors[j];
                const JsonValue *v = json_get(wm, t->name);
                if (!v || strcmp(v->string, names[i]) != 0) {
                    st__err(ipath, t->name, "present in shard \"%s\" but not mapped to it in weight_map", names[i]);
                    return -1;
                }
            }
    }
    qsort(m->entries, (size_t)m->n_entries, sizeof(WeightsEntry), weights__cmp_entry);
    return 0;
}

// a sharded model: the index file ipath, every shard it names (each opened once)
// and the entries that say which shard holds each tensor
static inline int weights__open_index(Weights *m, const char *ipath, WeightsOpenFn open_file) {
    if (weights__read_json(ipath, &m->index) != 0) return -1;
    const JsonValue *wm = weights__weight_map(m, ipath);
    if (!wm) return -1;
    const char **names = (const char **)malloc((wm->count ? (size_t)wm->count : 1) * sizeof *names);
    if (!names) { st__err(ipath, NULL, "out of memory"); return -1; }
    int nd = 0, total = 0;
    int rc = weights__shard_names(wm, ipath, m->dir, names, &nd) != 0 || weights__open_shards(m, ipath, names, nd, &total, open_file) != 0 ||
             weights__map_entries(m, ipath, wm, names, nd, total) != 0 ? -1 : 0;
    free(names);
    return rc;
}

// ----------------------------------------------------------------------------
// Meta's original layout (llama-2-7b/, as Meta's download.sh leaves it):
// params.json, tokenizer.model and consolidated.NN.pth, one file per
// model-parallel rank (7B 1, 13B 2, 70B 8), each a torch.save of that rank's
// slices under Meta's names. A tensor is its ranks' slices concatenated: along
// the rows for the layers that split their outputs (wq, wk, wv, w1, w3, output),
// along the columns for those that split their inputs (wo, w2) and for Llama-2's
// embedding; the norms are replicated. Meta's wq and wk rows hold each head's
// RoPE pairs interleaved (x0 y0 x1 y1 ...), where Hugging Face's rotate_half
// wants them in halves (x0 x1 ... y0 y1 ...): Hugging Face row h*hd + j*hd/2 + i
// is Meta row h*hd + 2i + j, the permutation transformers'
// convert_llama_weights_to_hf.py applies. rope.freqs (RoPE's table) is ignored.

static const struct { const char *meta, *hf; int cat, rope; } weights__meta_names[] = {
    {"tok_embeddings.weight", "model.embed_tokens.weight", 1, 0},
    {"norm.weight", "model.norm.weight", -1, 0},
    {"output.weight", "lm_head.weight", 0, 0},
    {"attention.wq.weight", "self_attn.q_proj.weight", 0, 1},
    {"attention.wk.weight", "self_attn.k_proj.weight", 0, 1},
    {"attention.wv.weight", "self_attn.v_proj.weight", 0, 0},
    {"attention.wo.weight", "self_attn.o_proj.weight", 1, 0},
    {"feed_forward.w1.weight", "mlp.gate_proj.weight", 0, 0},
    {"feed_forward.w2.weight", "mlp.down_proj.weight", 1, 0},
    {"feed_forward.w3.weight", "mlp.up_proj.weight", 0, 0},
    {"attention_norm.weight", "input_layernorm.weight", -1, 0},
    {"ffn_norm.weight", "post_attention_layernorm.weight", -1, 0},
};
#define WEIGHTS__N_META_NAMES (int)(sizeof weights__meta_names / sizeof weights__meta_names[0])
#define WEIGHTS__META_TOP 3 // the first three are not per layer

// Meta's name into Hugging Face's (buf), with its kind (an index into weights__meta_names); -1 if unknown
static inline int weights__meta_name(const char *meta, char *buf, size_t n) {
    int layer, at = 0;
    if (sscanf(meta, "layers.%d.%n", &layer, &at) == 1 && at > 0 && layer >= 0) {
        char check[32];
        snprintf(check, sizeof check, "layers.%d.", layer); // no sign, no leading zeros
        if (strncmp(meta, check, strlen(check)) != 0) return -1;
        for (int k = WEIGHTS__META_TOP; k < WEIGHTS__N_META_NAMES; k++)
            if (strcmp(meta + at, weights__meta_names[k].meta) == 0) {
                snprintf(buf, n, "model.layers.%d.%s", layer, weights__meta_names[k].hf);
                return k;
            }
        return -1;
    }
    for (int k = 0; k < WEIGHTS__META_TOP; k++)
        if (strcmp(meta, weights__meta_names[k].meta) == 0) { snprintf(buf, n, "%s", weights__meta_names[k].hf); return k; }
    return -1;
}

// the count of consolidated.NN.pth files, which must be numbered 00, 01, ... without a gap
static inline int weights__meta_count(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) { st__err(dir, NULL, "cannot list the folder: %s", strerror(errno)); return -1; }
    int n = 0, top = -1;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int k, at = 0;
        if (strncmp(e->d_name, "consolidated.", 13) != 0) continue;
        if (sscanf(e->d_name, "consolidated.%2d.pth%n", &k, &at) != 1 || e->d_name[at] != 0 || strlen(e->d_name) != 19) continue;
        n++;
        top = k > top ? k : top;
    }
    closedir(d);
    if (n == 0) { st__err(dir, NULL, "params.json but no consolidated.00.pth: not a complete download of Meta's weights"); return -1; }
    if (top != n - 1) { st__err(dir, NULL, "consolidated.NN.pth files are not numbered 00 to %02d without a gap", n - 1); return -1; }
    if (n > WEIGHTS_MAX_PARTS) { st__err(dir, NULL, "%d consolidated.NN.pth files: at most %d are read", n, WEIGHTS_MAX_PARTS); return -1; }
    return n;
}

// params.json's n_heads (the rest of it is the model's config: model.h): Meta's wq and wk
// rows are permuted in blocks of dim / n_heads
static inline int weights__meta_heads(const char *dir) {
    char *p = st__join(dir, "params.json");
    JsonValue j;
    int heads = -1;
    double d;
    if (p && weights__read_json(p, &j) == 0) {
        if (j.type == JSON_OBJECT && json_get_number(&j, "n_heads", &d) == 0 && d >= 1 && d <= 1024 && d == (int)d) heads = (int)d;
        else st__err(p, NULL, "\"n_heads\" must be an integer in [1, 1024]");
        json_free(&j);
    }
    free(p);
    return heads;
}

// the whole tensor of entry i, from its parts: each of file k's tensor of the same name,
// with part 0's dtype and rank, and the parts' sizes along cat adding up
static inline int weights__meta_assemble(Weights *m, int i, int kind, const StTensor *t0, const char *hf) {
    StTensor *w = &m->whole[i];
    const StTensor **parts = m->part_table + (size_t)i * m->n_files;
    int cat = weights__meta_names[kind].cat;
    *w = *t0;
    w->name = st__strdup(hf);
    if (!w->name) { st__err(m->dir, NULL, "out of memory"); return -1; }
    if ((cat >= 0 && t0->ndim != 2) || (cat < 0 && t0->ndim != 1)) {
        st__err(m->files[0].path, t0->name, "has %d dimensions; Meta's layout has %d", t0->ndim, cat < 0 ? 1 : 2);
        return -1;
    }
    for (int k = 0; k < m->n_files; k++) {
        const StTensor *p = st_find(&m->files[k], t0->name);
        if (!p) { st__err(m->files[k].path, t0->name, "is missing (consolidated.00.pth has it)"); return -1; }
        int same = p->ndim == t0->ndim && p->dtype == t0->dtype;
        for (int d = 0; same && d < t0->ndim; d++) same = p->shape[d] == t0->shape[d];
        if (!same) { st__err(m->files[k].path, t0->name, "has another shape or dtype than in consolidated.00.pth"); return -1; }
        parts[k] = p;
    }
    if (cat >= 0) {
        w->shape[cat] *= m->n_files;
        w->numel *= (uint64_t)m->n_files;
    }
    WeightsEntry *e = &m->entries[i];
    e->name = w->name;
    e->tensor = w;
    e->parts = parts;
    e->n_parts = m->n_files;
    e->cat = cat;
    return 0;
}

// Meta's files as the entries of the tensors they assemble into (see above); every file
// must hold the same tensors, and every tensor must be one of Meta's Llama names
static inline int weights__open_meta(Weights *m) {
    int n = weights__meta_count(m->dir), heads = weights__meta_heads(m->dir);
    if (n < 0 || heads < 0) return -1;
    m->files = (StFile *)calloc((size_t)n, sizeof(StFile));
    if (!m->files) { st__err(m->dir, NULL, "out of memory"); return -1; }
    for (int k = 0; k < n; k++) {
        char name[32];
        snprintf(name, sizeof name, "consolidated.%02d.pth", k);
        char *p = st__join(m->dir, name);
        int r = p ? pt_open(&m->files[k], p) : -1;
        free(p);
        if (r) return -1;
        m->n_files = k + 1;
        if (m->files[k].n_tensors != m->files[0].n_tensors) {
            st__err(m->files[k].path, NULL, "holds %d tensors where consolidated.00.pth holds %d", m->files[k].n_tensors, m->files[0].n_tensors);
            return -1;
        }
    }
    const StFile *f0 = &m->files[0];
    m->entries = (WeightsEntry *)calloc(f0->n_tensors ? (size_t)f0->n_tensors : 1, sizeof(WeightsEntry));
    m->whole = (StTensor *)calloc(f0->n_tensors ? (size_t)f0->n_tensors : 1, sizeof(StTensor));
    m->part_table = (const StTensor **)calloc((f0->n_tensors ? (size_t)f0->n_tensors : 1) * (size_t)n, sizeof(StTensor *));
    if (!m->entries || !m->whole || !m->part_table) { st__err(m->dir, NULL, "out of memory"); return -1; }
    int64_t head_dim = 0;
    for (int j = 0; j < f0->n_tensors; j++) {
        const StTensor *t = &f0->tensors[j];
        char hf[160];
        if (strcmp(t->name, "rope.freqs") == 0) continue;
        int kind = weights__meta_name(t->name, hf, sizeof hf);
        if (kind < 0) { st__err(f0->path, t->name, "is not one of Meta's Llama tensors"); return -1; }
        if (weights__meta_assemble(m, m->n_entries++, kind, t, hf) != 0) return -1;
        if (strcmp(weights__meta_names[kind].meta, "tok_embeddings.weight") == 0) head_dim = m->whole[m->n_entries - 1].shape[1] / heads;
    }
    if (head_dim < 2 || head_dim % 2) { st__err(m->dir, NULL, "the embedding's width over params.json's n_heads is not an even head size"); return -1; }
    for (int i = 0; i < m->n_entries; i++) {
        WeightsEntry *e = &m->entries[i];
        if (strstr(e->name, "q_proj") || strstr(e->name, "k_proj")) {
            if (e->tensor->shape[0] % head_dim) { st__err(m->dir, e->name, "has %lld rows, not whole heads of %lld", (long long)e->tensor->shape[0], (long long)head_dim); return -1; }
            e->rope = (int)head_dim;
        }
    }
    qsort(m->entries, (size_t)m->n_entries, sizeof(WeightsEntry), weights__cmp_entry);
    return 0;
}

// ----------------------------------------------------------------------------
// the folder

// Opens dir's weights in the first format it holds (the order at the top of this
// file), checking what can be checked without reading data. 0 ok, -1 with a message.
static inline int weights_open(Weights *m, const char *dir) {
    static const struct { const char *single, *index; WeightsOpenFn open_file; } formats[] = {
        {"model.safetensors", "model.safetensors.index.json", st_open},
        {"pytorch_model.bin", "pytorch_model.bin.index.json", pt_open},
    };
    memset(m, 0, sizeof *m);
    m->dir = st__strdup(dir);
    if (!m->dir) { st__err(dir, NULL, "out of memory"); return -1; }
    int rc = 1; // 1: no format found yet
    for (size_t i = 0; rc == 1 && i < sizeof formats / sizeof formats[0]; i++) {
        char *path = NULL;
        if (weights__exists(dir, formats[i].single)) rc = (path = st__join(dir, formats[i].single)) ? weights__open_single(m, path, formats[i].open_file) : -1;
        else if (weights__exists(dir, formats[i].index)) rc = (path = st__join(dir, formats[i].index)) ? weights__open_index(m, path, formats[i].open_file) : -1;
        free(path);
    }
    if (rc == 1 && weights__exists(dir, "params.json")) rc = weights__open_meta(m);
    if (rc == 1) st__err(dir, NULL, "no model weights: none of model.safetensors, model.safetensors.index.json, pytorch_model.bin, "
                         "pytorch_model.bin.index.json, params.json with consolidated.00.pth");
    if (rc != 0) weights_close(m);
    return rc != 0 ? -1 : 0;
}

// the tensor called name (Hugging Face's name); NULL if absent
static inline const WeightsEntry *weights_find(const Weights *m, const char *name) {
    int lo = 0, hi = m->n_entries - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(name, m->entries[mid].name);
        if (c == 0) return &m->entries[mid];
        if (c < 0) hi = mid - 1; else lo = mid + 1;
    }
    return NULL;
}

// the file holding e (its first part), for messages
static inline const char *weights_path(const Weights *m, const WeightsEntry *e) { return m->files[e->file].path; }

// Reads elements [first, first + count) of e (flattened row-major, as Hugging Face
// lays it out) as floats, converting exactly as st_read_f32 does. A Meta tensor is
// read row by row, each row from the part and the row that hold it.
static inline int weights_read_f32(Weights *m, const WeightsEntry *e, uint64_t first, uint64_t count, float *out) {
    if (e->n_parts == 0 || e->cat < 0 || (e->n_parts == 1 && !e->rope))
        return st_read_f32(&m->files[e->file], e->n_parts ? e->parts[0] : e->tensor, first, count, out);
    if (first > e->tensor->numel || count > e->tensor->numel - first) {
        st__err(m->dir, e->name, "read [%llu, +%llu) past its %llu elements", (unsigned long long)first, (unsigned long long)count,
                (unsigned long long)e->tensor->numel);
        return -1;
    }
    uint64_t cols = (uint64_t)e->tensor->shape[1], rows_k = (uint64_t)e->parts[0]->shape[0], cols_k = (uint64_t)e->parts[0]->shape[1];
    for (uint64_t at = first, end = first + count; at < end;) {
        uint64_t row = at / cols, c = at % cols, stop = end - at < cols - c ? c + (end - at) : cols, src = row;
        if (e->rope) { // Hugging Face's row (h, j, i) is Meta's (h, i, j)
            uint64_t hd = (uint64_t)e->rope, r = row % hd;
            src = row - r + 2 * (r % (hd / 2)) + r / (hd / 2);
        }
        while (c < stop) { // the columns [c, stop) of row src, a part at a time
            int k = e->cat == 0 ? (int)(src / rows_k) : (int)(c / cols_k);
            uint64_t local = e->cat == 0 ? (src % rows_k) * cols_k + c : src * cols_k + c % cols_k;
            uint64_t n = e->cat == 0 ? stop - c : (stop - c < cols_k - c % cols_k ? stop - c : cols_k - c % cols_k);
            if (st_read_f32(&m->files[k], e->parts[k], local, n, out) != 0) return -1;
            out += n, c += n, at += n;
        }
    }
    return 0;
}

#endif // WEIGHTS_H
