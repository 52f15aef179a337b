// Tests for torch_zip.h: torch.save files (test/fixtures/torch, made by
// dev/reference/make_torch_fixtures.py) read with pt_open + st_read_f32 against the same
// tensors written by the safetensors library, bit for bit (names, dtypes, shapes, bytes,
// values, sub-range reads); the trainer's tiny models as pytorch_model.bin (whole and
// sharded) against their model.safetensors; every refused file's message; and every
// truncation and many byte flips of a valid file, which must never crash. Run from the repo root.
#include "../support/torch_zip.h" // first: it sets the POSIX feature macros
#include "../support/utils.h"     // read_file
#include "test_common.h"
#include "capture.h"

#define DIR "test/fixtures/torch"

static int same_floats(const float *a, const float *b, uint64_t n) { return n == 0 || memcmp(a, b, (size_t)n * 4) == 0; }

// tensor a of pa against tensor b of pb: dtype, shape, the raw bytes, all values and a sub-range
static int same_tensor(StFile *pa, const StTensor *a, StFile *pb, const StTensor *b, char *why, size_t wn) {
    if (a->dtype != b->dtype || a->ndim != b->ndim || a->numel != b->numel || memcmp(a->shape, b->shape, sizeof a->shape) != 0) {
        snprintf(why, wn, "%s: dtype %s/%s, ndim %d/%d, numel %llu/%llu", a->name, st_dtype_name(a->dtype), st_dtype_name(b->dtype),
                 a->ndim, b->ndim, (unsigned long long)a->numel, (unsigned long long)b->numel);
        return 0;
    }
    size_t nb = (size_t)(a->end - a->begin);
    unsigned char *ra = (unsigned char *)malloc(nb + 1), *rb = (unsigned char *)malloc(nb + 1);
    float *fa = (float *)malloc((size_t)a->numel * 4 + 4), *fb = (float *)malloc((size_t)a->numel * 4 + 4);
    int ok = b->end - b->begin == nb && fseeko(pa->f, (off_t)a->begin, SEEK_SET) == 0 && fread(ra, 1, nb, pa->f) == nb &&
             fseeko(pb->f, (off_t)b->begin, SEEK_SET) == 0 && fread(rb, 1, nb, pb->f) == nb && memcmp(ra, rb, nb) == 0;
    if (!ok) snprintf(why, wn, "%s: raw bytes differ", a->name);
    uint64_t first = a->numel / 3, count = a->numel / 2;
    if (ok && (st_read_f32(pa, a, 0, a->numel, fa) || st_read_f32(pb, b, 0, b->numel, fb) || !same_floats(fa, fb, a->numel))) {
        snprintf(why, wn, "%s: values differ", a->name);
        ok = 0;
    }
    if (ok && (st_read_f32(pa, a, first, count, fa) || !same_floats(fa, fb + first, count))) {
        snprintf(why, wn, "%s: sub-range [%llu, +%llu) differs", a->name, (unsigned long long)first, (unsigned long long)count);
        ok = 0;
    }
    free(ra); free(rb); free(fa); free(fb);
    return ok;
}

// pt_parse_bytes on the file's bytes must give what pt_open gave
static int same_as_pure(const StFile *sf, const char *path) {
    size_t n;
    unsigned char *b = (unsigned char *)read_file(path, &n);
    StFile pure;
    int ok = b && pt_parse_bytes(&pure, path, b, n) == 0 && pure.f == NULL && pure.n_tensors == sf->n_tensors;
    for (int i = 0; ok && i < sf->n_tensors; i++)
        ok = strcmp(pure.tensors[i].name, sf->tensors[i].name) == 0 && pure.tensors[i].begin == sf->tensors[i].begin &&
             pure.tensors[i].end == sf->tensors[i].end;
    if (b && ok) st_close(&pure);
    free(b);
    return ok;
}

static void test_accepted(const char *name) {
    char bin[256], ref[256], what[600], why[400] = "";
    snprintf(bin, sizeof bin, DIR "/%s.bin", name);
    snprintf(ref, sizeof ref, DIR "/%s.safetensors", name);
    StFile pt, st;
    if (pt_open(&pt, bin) != 0 || st_open(&st, ref) != 0) { CHECK(0, bin, "cannot open %s or its reference", bin); return; }
    int ok = pt.n_tensors == st.n_tensors;
    if (!ok) snprintf(why, sizeof why, "%d tensors, the reference has %d", pt.n_tensors, st.n_tensors);
    for (int i = 0; ok && i < pt.n_tensors; i++) {
        ok = strcmp(pt.tensors[i].name, st.tensors[i].name) == 0;
        if (!ok) snprintf(why, sizeof why, "tensor %d is '%s', the reference's '%s'", i, pt.tensors[i].name, st.tensors[i].name);
        else ok = same_tensor(&pt, &pt.tensors[i], &st, &st.tensors[i], why, sizeof why);
    }
    snprintf(what, sizeof what, "%s (%d tensors) equals the safetensors reference bit for bit", bin, pt.n_tensors);
    CHECK(ok, what, "%s", why);
    snprintf(what, sizeof what, "%s: pt_parse_bytes agrees with pt_open", bin);
    CHECK(same_as_pure(&pt, bin), what, "differs");
    st_close(&pt);
    st_close(&st);
}

// the reference model: its model.safetensors or its two shards (safetensors.h alone)
typedef struct { StFile f[2]; int n, n_tensors; } Ref;

static int ref_open(Ref *r, const char *dir) {
    char p[300];
    r->n = r->n_tensors = 0;
    for (int k = 0; k < 2; k++) {
        if (k == 0) snprintf(p, sizeof p, "%s/model.safetensors", dir);
        if (k == 1 || access(p, F_OK) != 0) snprintf(p, sizeof p, "%s/model-%05d-of-00002.safetensors", dir, k + 1);
        if (access(p, F_OK) != 0) break;
        if (st_open(&r->f[r->n], p) != 0) return -1;
        r->n_tensors += r->f[r->n++].n_tensors;
    }
    return r->n ? 0 : -1;
}

static void ref_close(Ref *r) { for (int k = 0; k < r->n; k++) st_close(&r->f[k]); }

// the tensor called name in the reference (a tied lm_head.weight is the embedding), *f its file
static const StTensor *ref_tensor(Ref *r, const char *name, StFile **f) {
    for (int pass = 0; pass < 2; pass++, name = "model.embed_tokens.weight")
        for (int k = 0; k < r->n; k++) {
            const StTensor *t = st_find(&r->f[k], name);
            if (t) { *f = &r->f[k]; return t; }
        }
    return NULL;
}

// values of one pytorch_model.bin tensor against the reference model's (F32 or BF16) bit for bit
static int same_values(StFile *pf, const StTensor *t, Ref *ref, char *why, size_t wn) {
    StFile *rf;
    const StTensor *r = ref_tensor(ref, t->name, &rf);
    if (!r || r->numel != t->numel || r->ndim != t->ndim || memcmp(r->shape, t->shape, sizeof r->shape) != 0) {
        snprintf(why, wn, "%s: missing from the reference or another shape", t->name);
        return 0;
    }
    float *a = (float *)malloc((size_t)t->numel * 4 + 4), *b = (float *)malloc((size_t)t->numel * 4 + 4);
    uint64_t first = t->numel / 3, count = t->numel / 2;
    int ok = st_read_f32(pf, t, 0, t->numel, a) == 0 && st_read_f32(rf, r, 0, r->numel, b) == 0 && same_floats(a, b, t->numel) &&
             st_read_f32(pf, t, first, count, a) == 0 && same_floats(a, b + first, count);
    if (!ok) snprintf(why, wn, "%s: values differ", t->name);
    free(a);
    free(b);
    return ok;
}

// folder/pytorch_model.bin: every tensor of the reference model, in dtype, the tied head on the embedding's bytes
static void test_model(const char *folder, const char *refdir, StDtype dtype, int tied) {
    char bin[256], what[300], why[400] = "";
    snprintf(bin, sizeof bin, DIR "/%s/pytorch_model.bin", folder);
    Ref ref;
    StFile pf;
    if (ref_open(&ref, refdir) != 0 || pt_open(&pf, bin) != 0) { CHECK(0, bin, "cannot open it or %s", refdir); return; }
    int ok = pf.n_tensors == ref.n_tensors + tied;
    if (!ok) snprintf(why, sizeof why, "%d tensors, the reference has %d", pf.n_tensors, ref.n_tensors);
    for (int i = 0; ok && i < pf.n_tensors; i++) {
        ok = pf.tensors[i].dtype == dtype && same_values(&pf, &pf.tensors[i], &ref, why, sizeof why);
        if (!ok && !why[0]) snprintf(why, sizeof why, "%s is %s", pf.tensors[i].name, st_dtype_name(pf.tensors[i].dtype));
    }
    const StTensor *head = st_find(&pf, "lm_head.weight"), *emb = st_find(&pf, "model.embed_tokens.weight");
    if (ok && tied && (!head || !emb || head->begin != emb->begin)) { ok = 0; snprintf(why, sizeof why, "lm_head.weight does not share the embedding's storage"); }
    snprintf(what, sizeof what, "%s (%s, %d tensors) equals %s", bin, st_dtype_name(dtype), pf.n_tensors, refdir);
    CHECK(ok, what, "%s", why);
    st_close(&pf);
    ref_close(&ref);
}

// pytorch_model.bin.index.json and its shards: every mapped tensor in its shard, equal to the reference
static void test_sharded(void) {
    const char *folder = DIR "/tiny_tied_sharded";
    char ipath[256], sp[512], why[400] = "";
    snprintf(ipath, sizeof ipath, "%s/pytorch_model.bin.index.json", folder);
    size_t n;
    char *text = read_file(ipath, &n), err[200];
    JsonValue idx;
    Ref ref;
    if (!text || json_parse(text, n, &idx, err, sizeof err) || ref_open(&ref, "test/fixtures/tiny_tied")) {
        CHECK(0, "sharded pytorch_model.bin", "cannot read %s or the reference", ipath);
        free(text);
        return;
    }
    const JsonValue *wm = json_get(&idx, "weight_map");
    StFile shards[2];
    int ok = wm && wm->count == ref.n_tensors + 1, nopen = 0, total = 0;
    for (int k = 0; ok && k < 2; k++) {
        snprintf(sp, sizeof sp, "%s/pytorch_model-%05d-of-00002.bin", folder, k + 1);
        ok = pt_open(&shards[k], sp) == 0;
        nopen += ok;
        total += ok ? shards[k].n_tensors : 0;
    }
    for (int i = 0; ok && i < wm->count; i++) {
        int k = strstr(wm->items[i].string, "00001-of") ? 0 : 1;
        const StTensor *t = st_find(&shards[k], wm->keys[i]);
        ok = t && same_values(&shards[k], t, &ref, why, sizeof why);
        if (!t) snprintf(why, sizeof why, "%s is not in shard %d", wm->keys[i], k + 1);
    }
    CHECK(ok && total == wm->count, "sharded pytorch_model.bin (2 shards + index) equals tiny_tied", "%s (total %d)", why, total);
    for (int k = 0; k < nopen; k++) st_close(&shards[k]);
    ref_close(&ref);
    json_free(&idx);
    free(text);
}

// pt_open must fail, leave sf empty, and print "error: <path>: ..." containing want; so must pt_parse_bytes
static void expect_refused(const char *path, const char *want) {
    StFile sf;
    char prefix[400], what[600];
    capture_begin();
    int r = pt_open(&sf, path);
    const char *msg = capture_end();
    snprintf(prefix, sizeof prefix, "error: %s: ", path);
    snprintf(what, sizeof what, "%s is refused: %s", path, want);
    CHECK(r == -1 && sf.tensors == NULL && sf.f == NULL && sf.path == NULL && strncmp(msg, prefix, strlen(prefix)) == 0 && strstr(msg, want),
          what, "r=%d msg='%s'", r, msg);
    if (r == 0) st_close(&sf);
    size_t n;
    unsigned char *b = (unsigned char *)read_file(path, &n);
    if (!b) return;
    capture_begin();
    r = pt_parse_bytes(&sf, path, b, n);
    msg = capture_end();
    snprintf(what, sizeof what, "%s is refused by pt_parse_bytes too", path);
    CHECK(r == -1 && sf.tensors == NULL && strstr(msg, want), what, "r=%d msg='%s'", r, msg);
    if (r == 0) st_close(&sf);
    free(b);
}

// refused/expected.txt: "<file><TAB><what the message says>" per line
static void test_refused(void) {
    size_t n;
    char *list = read_file(DIR "/refused/expected.txt", &n), path[512];
    int count = 0;
    for (char *line = list; line && *line;) {
        char *nl = strchr(line, '\n'), *tab = strchr(line, '\t');
        if (nl) *nl = 0;
        if (tab) {
            *tab = 0;
            snprintf(path, sizeof path, DIR "/refused/%s", line);
            expect_refused(path, tab + 1);
            count++;
        }
        line = nl ? nl + 1 : NULL;
    }
    CHECK(count >= 20, "refused/expected.txt lists every refused fixture", "%d listed", count);
    free(list);
    expect_refused(DIR "/does_not_exist.bin", "cannot open: No such file");
    expect_refused(DIR, "not a regular file");
}

// every prefix of a valid file, and every byte of its first 2 KB and last 1 KB replaced by
// four values, must be refused with a message or read back in range; never crash
static void test_mutations(const char *path) {
    size_t n;
    unsigned char *b = (unsigned char *)read_file(path, &n), *c = (unsigned char *)malloc(n + 1);
    int ok = b != NULL, accepted = 0, runs = 0;
    static const unsigned char vals[4] = {0x00, 0xff, 0x80, 0x7f};
    capture_begin();
    for (size_t len = 0; ok && len <= n; len++, runs++) {
        StFile sf;
        memcpy(c, b, len);
        if (pt_parse_bytes(&sf, path, c, len) == 0) { ok = len == n; st_close(&sf); }
    }
    for (size_t i = 0; ok && i < n; i++) {
        if (i >= 2048 && i + 1024 < n) continue;
        for (int v = 0; v < 4; v++, runs++) {
            StFile sf;
            memcpy(c, b, n);
            c[i] = vals[v];
            if (pt_parse_bytes(&sf, path, c, n) != 0) continue;
            accepted++;
            for (int t = 0; ok && t < sf.n_tensors; t++) {
                const StTensor *x = &sf.tensors[t];
                ok = x->begin <= x->end && x->end <= n && x->end - x->begin == x->numel * (uint64_t)st_dtype_size(x->dtype);
            }
            st_close(&sf);
        }
    }
    capture_end();
    char what[300];
    snprintf(what, sizeof what, "%s: %d truncations and byte changes refused or read in range (%d accepted)", path, runs, accepted);
    CHECK(ok, what, "a truncated file was accepted, or a tensor lies outside the file");
    free(b);
    free(c);
}

int main(void) {
    const char *accepted[] = {"f32", "f16", "bf16", "shared", "views", "state_dict", "parameter", "zip64", "crafted"};
    for (size_t i = 0; i < sizeof accepted / sizeof *accepted; i++) test_accepted(accepted[i]);
    test_model("tiny_gqa_f32", "test/fixtures/tiny_gqa", ST_F32, 0);
    test_model("tiny_gqa_f16", "test/fixtures/tiny_gqa", ST_F16, 0);
    test_model("tiny_gqa_bf16", "test/fixtures/tiny_gqa", ST_BF16, 0);
    test_model("tiny_tied_f32", "test/fixtures/tiny_tied", ST_F32, 1);
    test_model("tiny_tied_bf16", "test/fixtures/tiny_tied", ST_BF16, 1);
    test_sharded();
    test_refused();
    test_mutations(DIR "/state_dict.bin");
    test_mutations(DIR "/zip64.bin");
    return test_summary();
}
