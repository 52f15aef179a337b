// A whole safetensors file from arbitrary bytes: st_open on it (header length,
// header JSON, every tensor entry, the tiling of the data region), then, when it
// opens, every tensor read back (whole and a sub-range, as float or int32 as
// its dtype allows) and the file written again with st_write and reopened: the
// tensors must come back with the same dtype, shape and bytes. st_parse_header
// on the same bytes must agree with st_open.
#include "../../support/safetensors.h"
#include "fuzz.h"

static void check_parsed(const StFile *sf) {
    for (int i = 0; i < sf->n_tensors; i++) {
        const StTensor *t = &sf->tensors[i];
        FUZZ_ASSERT(t->begin >= sf->data_start && t->begin <= t->end && t->end <= sf->file_size);
        FUZZ_ASSERT(t->end - t->begin == t->numel * (uint64_t)st_dtype_size(t->dtype));
        FUZZ_ASSERT(t->ndim >= 0 && t->ndim <= ST_MAX_DIMS);
        if (i > 0) FUZZ_ASSERT(strcmp(sf->tensors[i - 1].name, t->name) < 0); // sorted, no duplicates
        FUZZ_ASSERT(st_find(sf, t->name) == t);
    }
}

static void read_all(StFile *sf) {
    for (int i = 0; i < sf->n_tensors; i++) {
        const StTensor *t = &sf->tensors[i];
        // numel <= the file size: every element is at least a byte of the file
        float *f = (float *)malloc((size_t)t->numel * sizeof(float) + 1);
        int32_t *v = (int32_t *)malloc((size_t)t->numel * sizeof(int32_t) + 1);
        FUZZ_ASSERT(f && v);
        if (t->dtype == ST_F32 || t->dtype == ST_F16 || t->dtype == ST_BF16 || t->dtype == ST_F64) {
            FUZZ_ASSERT(st_read_f32(sf, t, 0, t->numel, f) == 0);
            FUZZ_ASSERT(st_read_f32(sf, t, t->numel / 2, t->numel - t->numel / 2, f) == 0);
            FUZZ_ASSERT(st_read_f32(sf, t, t->numel, 1, f) == -1); // past the end
        } else {
            FUZZ_ASSERT(st_read_f32(sf, t, 0, t->numel, f) == -1);
        }
        if (t->dtype == ST_I32) FUZZ_ASSERT(st_read_i32(sf, t, v) == 0);
        else if (t->dtype == ST_I64) st_read_i32(sf, t, v); // values may not fit in int32
        else FUZZ_ASSERT(st_read_i32(sf, t, v) == -1);
        free(f);
        free(v);
    }
}

// writes the tensors (and string metadata) of sf back out and compares
static void roundtrip(const StFile *sf, const uint8_t *data) {
    const JsonValue *md = &sf->metadata;
    for (int i = 0; i < md->count; i++) // st_write takes C strings
        if (strlen(md->keys[i]) != md->key_lens[i] || strlen(md->items[i].string) != md->items[i].string_len) return;
    for (int i = 0; i < sf->n_tensors; i++)
        if (!sf->tensors[i].name[0]) return; // the writer refuses an empty name
    StWriteTensor *ts = (StWriteTensor *)calloc((size_t)sf->n_tensors + 1, sizeof *ts);
    const char **kv = (const char **)calloc(2 * (size_t)md->count + 1, sizeof *kv);
    FUZZ_ASSERT(ts && kv);
    for (int i = 0; i < sf->n_tensors; i++) {
        const StTensor *t = &sf->tensors[i];
        ts[i].name = t->name;
        ts[i].dtype = t->dtype;
        ts[i].ndim = t->ndim;
        memcpy(ts[i].shape, t->shape, sizeof t->shape);
        ts[i].data = data + t->begin;
    }
    for (int i = 0; i < md->count; i++) { kv[2 * i] = md->keys[i]; kv[2 * i + 1] = md->items[i].string; }
    char p[4096];
    fuzz_path(p, sizeof p, "roundtrip.safetensors");
    int w = st_write(p, ts, sf->n_tensors, kv, md->count);
    // the writer refuses a shape whose byte count overflows its (stricter) check
    if (w == 0) {
        StFile rt;
        FUZZ_ASSERT(st_open(&rt, p) == 0);
        FUZZ_ASSERT(rt.n_tensors == sf->n_tensors && rt.metadata.count == md->count);
        unsigned char *buf = NULL;
        for (int i = 0; i < rt.n_tensors; i++) {
            const StTensor *a = &sf->tensors[i], *b = &rt.tensors[i];
            FUZZ_ASSERT(strcmp(a->name, b->name) == 0 && a->dtype == b->dtype && a->ndim == b->ndim &&
                        memcmp(a->shape, b->shape, sizeof a->shape) == 0 && a->numel == b->numel);
            size_t n = (size_t)(b->end - b->begin);
            buf = (unsigned char *)realloc(buf, n + 1);
            FUZZ_ASSERT(buf && fseeko(rt.f, (off_t)b->begin, SEEK_SET) == 0 && fread(buf, 1, n, rt.f) == n);
            FUZZ_ASSERT(memcmp(buf, data + a->begin, n) == 0);
        }
        free(buf);
        st_close(&rt);
    }
    free(ts);
    free(kv);
}

FUZZ_TARGET(safetensors) {
    char p[4096];
    fuzz_path(p, sizeof p, "fuzz.safetensors");
    fuzz_write(p, data, size);
    StFile sf;
    fuzz_stderr_begin();
    int r = st_open(&sf, p);
    int said = fuzz_stderr_end(p); // "error: <path>: ..."
    // the pure parser on the same bytes agrees
    StFile pure;
    uint64_t n = 0;
    for (int i = 0; i < 8 && size >= 8; i++) n |= (uint64_t)data[i] << (8 * i);
    fuzz_stderr_begin();
    int r2 = st_parse_header(&pure, p, data + (size >= 8 ? 8 : 0), (size_t)n, size);
    fuzz_stderr_end(NULL);
    FUZZ_ASSERT(r == r2);
    if (r2 == 0) {
        FUZZ_ASSERT(pure.n_tensors == sf.n_tensors && pure.f == NULL);
        st_close(&pure);
    }
    if (r != 0) {
        FUZZ_ASSERT(said && sf.tensors == NULL && sf.f == NULL && sf.n_tensors == 0);
        return 0;
    }
    check_parsed(&sf);
    read_all(&sf);
    roundtrip(&sf, data);
    st_close(&sf);
    return 0;
}
