// Tests for safetensors.h: every header rejection (files built here in a temp
// dir), dtype conversions against files written by Python's safetensors
// (test/fixtures/safetensors, made by dev/reference/make_safetensors_fixtures.py),
// write -> read round trips, byte-identical output to Python's writer, atomic
// writes, and sharded models. Run from the repo root:
//   gcc -O2 -Wall -Wextra -std=c11 -o /tmp/test_safetensors test/test_safetensors.c -lm && /tmp/test_safetensors
#include "../support/weights.h" // first: safetensors.h sets the POSIX feature macros (the model folders: test_model)
#include "test_common.h"
#include "capture.h"
#include "../support/checkpoint.h" // remove_tree
#include <dirent.h>
#include <stdint.h>

#define FIXTURES "test/fixtures/safetensors"

static char tmpdir[256];

// ----------------------------------------------------------------------------
// helpers

static void path_in(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", tmpdir, name); }


static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n) { fprintf(stderr, "cannot write %s\n", path); exit(2); }
    fclose(f);
}

// a safetensors file: 8-byte length `hlen` (may lie), header text, data_len bytes
static void write_st(const char *path, uint64_t hlen, const char *header, size_t data_len) {
    size_t h = strlen(header);
    unsigned char *b = (unsigned char *)calloc(8 + h + data_len + 1, 1);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(hlen >> (8 * i));
    memcpy(b + 8, header, h);
    for (size_t i = 0; i < data_len; i++) b[8 + h + i] = (unsigned char)i;
    write_bytes(path, b, 8 + h + data_len);
    free(b);
}

// st_open must fail, leave sf empty, and print "error: <path>: ..." containing want
static void expect_open_fail(const char *what, const char *path, const char *want) {
    StFile sf;
    capture_begin();
    int r = st_open(&sf, path);
    const char *msg = capture_end();
    char prefix[400];
    snprintf(prefix, sizeof prefix, "error: %s: ", path);
    CHECK(r == -1 && sf.tensors == NULL && sf.f == NULL && strncmp(msg, prefix, strlen(prefix)) == 0 && strstr(msg, want),
          what, "r=%d msg='%s' (want '%s')", r, msg, want);
    if (r == 0) st_close(&sf);
}

// a one-off malformed file: header text + data_len data bytes
static void bad_header(const char *what, const char *header, size_t data_len, const char *want) {
    char p[512];
    path_in(p, sizeof p, "bad.safetensors");
    write_st(p, strlen(header), header, data_len);
    expect_open_fail(what, p, want);
}

// bit for bit: -0 differs from 0, NaNs must agree in sign and payload
static int same_float(float a, float b) { return memcmp(&a, &b, 4) == 0; }

// ----------------------------------------------------------------------------

static void test_header_rejections(void) {
    char p[512];
    path_in(p, sizeof p, "short.safetensors");
    write_bytes(p, "\x02\0\0\0\0", 5);
    expect_open_fail("truncated file (5 bytes)", p, "too small for the 8-byte header length");
    path_in(p, sizeof p, "trunc_header.safetensors");
    write_st(p, 100, "{\"a\":{\"dtype\":\"F32\"", 0);
    expect_open_fail("truncated header", p, "header length 100 exceeds the file size");
    path_in(p, sizeof p, "tera.safetensors");
    write_st(p, 1ULL << 42, "{}", 0);
    expect_open_fail("header length claiming terabytes", p, "exceeds the limit of 100000000 bytes");
    write_st(p, ~0ULL, "{}", 0);
    expect_open_fail("header length 2^64-1", p, "exceeds the limit");
    write_st(p, 1, "{}", 0);
    expect_open_fail("header length 1", p, "header length 1 is too small");
    path_in(p, sizeof p, "does_not_exist.safetensors");
    expect_open_fail("missing file", p, "cannot open: No such file");
    expect_open_fail("a directory", tmpdir, "not a regular file");

    bad_header("non-JSON header", "{not json}", 0, "header is not valid JSON: offset 1 (line 1, column 2)");
    bad_header("binary header", "\x01\x02", 0, "header is not valid JSON");
    bad_header("header with trailing garbage", "{}x", 0, "header is not valid JSON");
    bad_header("header is an array", "[]", 0, "header is a JSON array, expected an object");
    bad_header("entry not an object", "{\"a\": 5}", 0, "tensor 'a': entry is a JSON number");
    bad_header("missing dtype", "{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor 'a': missing \"dtype\"");
    bad_header("missing shape", "{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "tensor 'a': missing \"shape\"");
    bad_header("missing data_offsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "tensor 'a': missing \"data_offsets\"");
    bad_header("bad dtype", "{\"a\":{\"dtype\":\"F31\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor 'a': unknown or unsupported dtype \"F31\"");
    bad_header("lowercase dtype", "{\"a\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "unknown or unsupported dtype");
    bad_header("dtype not a string", "{\"a\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "\"dtype\" is a JSON number");
    bad_header("shape not an array", "{\"a\":{\"dtype\":\"F32\",\"shape\":4,\"data_offsets\":[0,4]}}", 4, "\"shape\" is a JSON number");
    bad_header("negative shape", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,-1],\"data_offsets\":[0,4]}}", 4, "tensor 'a': shape[1] is not a non-negative integer");
    bad_header("fractional shape", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4, "shape[0] is not a non-negative integer");
    bad_header("string shape", "{\"a\":{\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]}}", 4, "shape[0] is not a non-negative integer");
    bad_header("overflowing shape", "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,4]}}", 4,
               "shape [4294967296, 4294967296, 4294967296] overflows: too many elements");
    bad_header("shape overflowing in bytes", "{\"a\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904],\"data_offsets\":[0,4]}}", 4,
               "overflows: too many bytes");
    bad_header("shape beyond int64", "{\"a\":{\"dtype\":\"F32\",\"shape\":[18446744073709551616],\"data_offsets\":[0,4]}}", 4,
               "shape[0] is not a non-negative integer");
    bad_header("9 dimensions", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, "shape has 9 dimensions, at most 8");
    bad_header("offsets past the end", "{\"a\":{\"dtype\":\"F32\",\"shape\":[100],\"data_offsets\":[0,400]}}", 8,
               "tensor 'a': data_offsets [0, 400]: end is past the data region (8 bytes)");
    bad_header("offsets begin after end", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 8, "begin is after end");
    bad_header("negative offset", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 8, "two non-negative integers");
    bad_header("three offsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8, "array of two integers");
    bad_header("offsets not integers", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4.5]}}", 8, "two non-negative integers");
    bad_header("size mismatch", "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
               "tensor 'a': data_offsets [0, 8] span 8 bytes, but dtype F32 with shape [3] needs 12");
    bad_header("overlapping tensors",
               "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12,
               "tensor 'b': data [4, 12) overlaps tensor 'a'");
    bad_header("identical offsets",
               "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"b\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
               "overlaps tensor");
    bad_header("empty tensor inside another",
               "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}", 8,
               "tensor 'z': data [4, 4) overlaps tensor 'a'");
    bad_header("gap between tensors",
               "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12,
               "tensor 'b': 4 unused bytes before its data");
    bad_header("gap at the start", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "4 unused bytes before its data");
    bad_header("bytes after the last tensor", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8,
               "4 unused bytes after the last tensor");
    bad_header("duplicate tensor names",
               "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
               "tensor 'a': duplicate tensor name");
    bad_header("duplicate field in entry", "{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
               "duplicate field \"dtype\"");
    bad_header("metadata not an object", "{\"__metadata__\":[\"x\"]}", 0, "\"__metadata__\" is a JSON array");
    bad_header("metadata value not a string", "{\"__metadata__\":{\"format\":\"pt\",\"n\":3}}", 0, "value of \"n\" is a JSON number, expected a string");
    bad_header("duplicate metadata", "{\"__metadata__\":{},\"__metadata__\":{}}", 0, "duplicate tensor name");
    bad_header("name with NUL", "{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "contains a NUL character");
    bad_header("name with escape sequence is quoted", "{\"\\u001b[31mred\":{\"dtype\":\"X\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
               "tensor '\\x1b[31mred': unknown");
    {
        // a header of tiny values (~80 bytes of DOM per 2 bytes of text) is refused at JSON_MAX_VALUES
        size_t n = (size_t)JSON_MAX_VALUES + 1, k = 0;
        char *h = (char *)malloc(2 * n + 16);
        h[k++] = '{'; h[k++] = '"'; h[k++] = 'a'; h[k++] = '"'; h[k++] = ':'; h[k++] = '[';
        for (size_t i = 0; i < n; i++) { h[k++] = '0'; h[k++] = ','; }
        h[k - 1] = ']'; h[k++] = '}'; h[k] = 0;
        char want[64];
        snprintf(want, sizeof want, "more than %d values", JSON_MAX_VALUES);
        bad_header("header with more than JSON_MAX_VALUES values", h, 0, want);
        free(h);
    }
    bad_header("deeply nested header", "{\"a\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}", 0,
               "nesting deeper than 64");
}

static void test_header_valid(void) {
    // empty header, no data; and a header padded with spaces like Python's
    StFile sf;
    const char *h = "{}";
    int r = st_parse_header(&sf, "mem", (const unsigned char *)h, 2, 10);
    CHECK(r == 0 && sf.n_tensors == 0 && sf.metadata.type == JSON_OBJECT && sf.data_start == 10, "parse empty header", "r=%d", r);
    st_close(&sf);
    const char *h2 = "{\"__metadata__\":{\"k\":\"v\"},\"z\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
                     "\"e\":{\"dtype\":\"BF16\",\"shape\":[0,5],\"data_offsets\":[4,4]},\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[4,7],\"extra\":1}}   ";
    size_t n = strlen(h2);
    r = st_parse_header(&sf, "mem", (const unsigned char *)h2, n, 8 + n + 7);
    CHECK(r == 0 && sf.n_tensors == 3, "parse padded header with scalar, empty, extra field", "r=%d", r);
    if (r == 0) {
        CHECK(!strcmp(sf.tensors[0].name, "a") && !strcmp(sf.tensors[1].name, "e") && !strcmp(sf.tensors[2].name, "z"),
              "tensors sorted by name", "");
        const StTensor *z = st_find(&sf, "z"), *e = st_find(&sf, "e"), *a = st_find(&sf, "a");
        CHECK(z && z->ndim == 0 && z->numel == 1 && z->begin == 8 + n && z->end == 8 + n + 4, "scalar tensor, absolute offsets", "");
        CHECK(e && e->ndim == 2 && e->numel == 0 && e->dtype == ST_BF16, "empty tensor", "");
        CHECK(a && a->dtype == ST_U8 && a->numel == 3, "U8 tensor", "");
        CHECK(st_find(&sf, "b") == NULL && st_find(&sf, "") == NULL, "st_find absent", "");
        const char *v = NULL;
        CHECK(json_get_string(&sf.metadata, "k", &v, NULL) == 0 && !strcmp(v, "v"), "metadata kept", "");
    }
    st_close(&sf);
    st_close(&sf); // twice is harmless
}

// mutated headers through the pure parser: no crash, a clean -1 or 0
static void test_header_mutations(void) {
    const char *seed = "{\"__metadata__\":{\"format\":\"pt\"},\"b\":{\"dtype\":\"F16\",\"shape\":[2,2],\"data_offsets\":[16,24]},"
                       "\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}";
    uint64_t rng = 88172645463325252ULL;
    char buf[512];
    int ok = 0, bad = 0;
    capture_begin(); // thousands of error messages: keep them out of the log
    for (int it = 0; it < 50000; it++) {
        size_t len = strlen(seed);
        memcpy(buf, seed, len);
        for (int m = 0; m < 1 + (int)(rng % 3); m++) {
            rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
            size_t pos = (size_t)(rng >> 33) % len;
            if (rng % 3 == 0) buf[pos] = "0123456789[]{},:\"-e."[(rng >> 8) % 20];
            else if (rng % 3 == 1) buf[pos] = (char)(rng >> 16);
            else if (len > 1) { memmove(buf + pos, buf + pos + 1, len - pos - 1); len--; }
        }
        StFile sf;
        int r = st_parse_header(&sf, "fuzz", (const unsigned char *)buf, len, 8 + len + (rng >> 40) % 40);
        if (r == 0) { ok++; st_close(&sf); }
        else if (r != -1 || sf.tensors != NULL || sf.path != NULL) bad++;
    }
    capture_end();
    CHECK(bad == 0, "50000 mutated headers parse or fail cleanly", "%d bad, %d ok", bad, ok);
}

static void test_fixtures(void) {
    StFile sf;
    capture_begin();
    int r = st_open(&sf, FIXTURES "/dtypes.safetensors");
    const char *msg = capture_end();
    CHECK(r == 0, "open Python-written dtypes.safetensors", "%s (run from the repo root)", msg);
    if (r) return;
    const char *fmt = NULL;
    CHECK(sf.n_tensors == 12 && json_get_string(&sf.metadata, "format", &fmt, NULL) == 0 && !strcmp(fmt, "pt"),
          "fixture: 12 tensors and metadata format=pt", "n=%d", sf.n_tensors);
    const char *pairs[3][2] = {{"f16", "f16_expected"}, {"bf16", "bf16_expected"}, {"f64", "f64_expected"}};
    StDtype dts[3] = {ST_F16, ST_BF16, ST_F64};
    for (int k = 0; k < 3; k++) {
        const StTensor *t = st_find(&sf, pairs[k][0]), *e = st_find(&sf, pairs[k][1]);
        char what[96];
        snprintf(what, sizeof what, "%s -> f32 matches torch bit for bit (incl. subnormals, inf, nan, -0)", pairs[k][0]);
        if (!t || !e || t->dtype != dts[k] || e->dtype != ST_F32 || t->numel != e->numel) {
            CHECK(0, what, "tensors missing or wrong dtype");
            continue;
        }
        float *got = (float *)malloc(t->numel * 4), *want = (float *)malloc(e->numel * 4);
        int r1 = st_read_f32(&sf, t, 0, t->numel, got), r2 = st_read_f32(&sf, e, 0, e->numel, want);
        int bad = -1;
        for (uint64_t i = 0; i < t->numel && bad < 0; i++)
            if (!same_float(got[i], want[i])) bad = (int)i;
        CHECK(r1 == 0 && r2 == 0 && bad < 0, what, "element %d: got %a want %a", bad, bad >= 0 ? got[bad] : 0, bad >= 0 ? want[bad] : 0);
        // a sub-range reads the same values
        if (t->numel > 7) {
            float part[4];
            r1 = st_read_f32(&sf, t, 3, 4, part);
            int same = r1 == 0;
            for (int i = 0; i < 4; i++) same = same && same_float(part[i], want[3 + i]);
            snprintf(what, sizeof what, "%s sub-range [3, 7)", pairs[k][0]);
            CHECK(same, what, "r=%d", r1);
        }
        free(got);
        free(want);
    }
    const StTensor *t = st_find(&sf, "f32");
    float f[6], want[6] = {0.0f, -0.0f, 1.5f, -3.25f, 1e-45f, INFINITY};
    CHECK(t && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 3 && st_read_f32(&sf, t, 0, 6, f) == 0 &&
              same_float(f[1], want[1]) && same_float(f[4], want[4]) && same_float(f[5], want[5]) && f[3] == want[3],
          "f32 [2,3] read", "");
    size_t worst = 0;
    while (t && worst < 4 && f[worst] == want[worst]) worst++;
    CHECK(t && worst == 4, "f32 values exact", "element %zu", worst);
    float g[2];
    CHECK(t && st_read_f32(&sf, t, 4, 2, g) == 0 && same_float(g[0], 1e-45f) && isinf(g[1]), "f32 sub-range [4, 6)", "");
    capture_begin();
    r = t ? st_read_f32(&sf, t, 5, 2, g) : 0;
    msg = capture_end();
    CHECK(r == -1 && strstr(msg, "tensor 'f32': read of elements [5, 7) is out of range"), "f32 read past the end refused", "%s", msg);
    t = st_find(&sf, "scalar");
    CHECK(t && t->ndim == 0 && t->numel == 1 && st_read_f32(&sf, t, 0, 1, g) == 0 && g[0] == 2.5f, "scalar tensor", "");
    t = st_find(&sf, "empty");
    CHECK(t && t->numel == 0 && t->begin == t->end && st_read_f32(&sf, t, 0, 0, g) == 0, "empty [0,3] tensor", "");

    int32_t iv[6];
    t = st_find(&sf, "i32");
    CHECK(t && st_read_i32(&sf, t, iv) == 0 && iv[0] == 0 && iv[2] == -1 && iv[3] == INT32_MAX && iv[4] == INT32_MIN && iv[5] == 123456,
          "i32 read", "");
    t = st_find(&sf, "i64");
    CHECK(t && t->dtype == ST_I64 && st_read_i32(&sf, t, iv) == 0 && iv[1] == -1 && iv[2] == 42 && iv[3] == INT32_MAX && iv[4] == INT32_MIN,
          "i64 read as int32", "");
    t = st_find(&sf, "i64_big");
    capture_begin();
    r = t ? st_read_i32(&sf, t, iv) : 0;
    msg = capture_end();
    CHECK(r == -1 && strstr(msg, "dtypes.safetensors: tensor 'i64_big': element 1 = 2147483648 does not fit in int32"),
          "i64 out of int32 range refused", "%s", msg);
    capture_begin();
    r = st_read_f32(&sf, st_find(&sf, "i32"), 0, 1, g);
    msg = capture_end();
    CHECK(r == -1 && strstr(msg, "tensor 'i32': dtype I32 cannot be read as float"), "st_read_f32 refuses I32", "%s", msg);
    capture_begin();
    r = st_read_i32(&sf, st_find(&sf, "f32"), iv);
    msg = capture_end();
    CHECK(r == -1 && strstr(msg, "dtype F32 cannot be read as int32"), "st_read_i32 refuses F32", "%s", msg);
    st_close(&sf);
}

// every F16 and BF16 bit pattern against an independent ldexp formula
static void test_exhaustive_half(void) {
    int bad16 = -1, badbf = -1;
    for (uint32_t h = 0; h < 65536; h++) {
        int s = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023;
        double v = e == 31 ? (m ? NAN : INFINITY) : e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
        float want = (float)(s ? -v : v), got = st_f16_to_f32((uint16_t)h);
        uint32_t gb;
        memcpy(&gb, &got, 4);
        if (!same_float(got, want) && !(isnan(got) && isnan(want))) { if (bad16 < 0) bad16 = (int)h; }
        if (isnan(got) && (((h & 0x3ff) << 13) != (gb & 0x7fffff) || (signbit(got) != 0) != s)) { if (bad16 < 0) bad16 = (int)h; } // NaN sign, payload kept
        int be = (h >> 7) & 255, bm = h & 127;
        double bv = be == 255 ? (bm ? NAN : INFINITY) : be == 0 ? ldexp(bm, -133) : ldexp(128 + bm, be - 134);
        float bwant = (float)(s ? -bv : bv), bgot = st_bf16_to_f32((uint16_t)h);
        uint32_t bb;
        memcpy(&bb, &bgot, 4);
        if (!same_float(bgot, bwant) && !(isnan(bgot) && isnan(bwant))) { if (badbf < 0) badbf = (int)h; }
        if (bb != h << 16) { if (badbf < 0) badbf = (int)h; }
    }
    CHECK(bad16 < 0, "all 65536 F16 patterns convert exactly", "first bad 0x%04x", bad16);
    CHECK(badbf < 0, "all 65536 BF16 patterns convert exactly", "first bad 0x%04x", badbf);
}

// st_write must produce the bytes Python's save_file produced for the same tensors
static void test_python_identical(void) {
    size_t pn = 0, cn = 0;
    unsigned char *py = (unsigned char *)read_file(FIXTURES "/python_f32.safetensors", &pn);
    if (!py) { CHECK(0, "python_f32.safetensors fixture present", "run from the repo root"); return; }
    float a[6], b[3];
    int32_t tok[5] = {3, 1, 4, 1, 5};
    for (int i = 0; i < 6; i++) a[i] = (float)i / 4;
    for (int i = 0; i < 3; i++) b[i] = (float)i - 1.5f;
    StWriteTensor ts[3];
    memset(ts, 0, sizeof ts);
    ts[0].name = "tokens"; ts[0].dtype = ST_I32; ts[0].ndim = 1; ts[0].shape[0] = 5; ts[0].data = tok;
    ts[1].name = "b.weight"; ts[1].dtype = ST_F32; ts[1].ndim = 1; ts[1].shape[0] = 3; ts[1].data = b;
    ts[2].name = "a"; ts[2].dtype = ST_F32; ts[2].ndim = 2; ts[2].shape[0] = 2; ts[2].shape[1] = 3; ts[2].data = a;
    const char *meta[2] = {"format", "np"};
    char p[512];
    path_in(p, sizeof p, "mine.safetensors");
    int r = st_write(p, ts, 3, meta, 1);
    unsigned char *mine = (unsigned char *)read_file(p, &cn);
    CHECK(r == 0 && mine && cn == pn && memcmp(mine, py, pn) == 0, "st_write output is byte-identical to Python's save_file",
          "r=%d sizes %zu vs %zu", r, cn, pn);
    free(mine);
    free(py);
}

static void test_roundtrip(void) {
    char p[512];
    path_in(p, sizeof p, "rt.safetensors");
    float w[2 * 3 * 4], s = -7.0f, nanv = NAN;
    int32_t ids[7] = {0, -1, 2147483647, -2147483647 - 1, 5, 6, 7};
    for (int i = 0; i < 24; i++) w[i] = (float)i * 0.37f - 3.0f;
    w[5] = -0.0f; w[6] = INFINITY; w[7] = 1e-40f;
    StWriteTensor ts[5];
    memset(ts, 0, sizeof ts);
    ts[0].name = "model.layers.0.w\"q\\\xc3\xa9"; ts[0].dtype = ST_F32; ts[0].ndim = 3; ts[0].shape[0] = 2; ts[0].shape[1] = 3; ts[0].shape[2] = 4; ts[0].data = w;
    ts[1].name = "ids"; ts[1].dtype = ST_I32; ts[1].ndim = 1; ts[1].shape[0] = 7; ts[1].data = ids;
    ts[2].name = "scalar"; ts[2].dtype = ST_F32; ts[2].ndim = 0; ts[2].data = &s;
    ts[3].name = "empty"; ts[3].dtype = ST_F32; ts[3].ndim = 2; ts[3].shape[0] = 0; ts[3].shape[1] = 9; ts[3].data = NULL;
    ts[4].name = "nan"; ts[4].dtype = ST_F32; ts[4].ndim = 1; ts[4].shape[0] = 1; ts[4].data = &nanv;
    const char *meta[4] = {"step", "12", "note", "tab\there \"quoted\" \xe2\x82\xac"};
    int r = st_write(p, ts, 5, meta, 2);
    CHECK(r == 0, "st_write round-trip file", "r=%d", r);
    StFile sf;
    r = st_open(&sf, p);
    CHECK(r == 0 && sf.n_tensors == 5 && sf.data_start % 8 == 0, "reopen written file, data 8-byte aligned", "r=%d start=%llu", r,
          (unsigned long long)sf.data_start);
    if (r) return;
    const StTensor *t = st_find(&sf, ts[0].name);
    float got[24];
    int same = t && t->ndim == 3 && t->shape[2] == 4 && st_read_f32(&sf, t, 0, 24, got) == 0;
    for (int i = 0; same && i < 24; i++) same = same_float(got[i], w[i]);
    CHECK(same, "F32 [2,3,4] round trip (name with quote, backslash, UTF-8)", "");
    int32_t gi[7];
    t = st_find(&sf, "ids");
    CHECK(t && st_read_i32(&sf, t, gi) == 0 && memcmp(gi, ids, sizeof ids) == 0, "I32 round trip", "");
    t = st_find(&sf, "scalar");
    CHECK(t && t->ndim == 0 && st_read_f32(&sf, t, 0, 1, got) == 0 && got[0] == -7.0f, "scalar round trip", "");
    t = st_find(&sf, "empty");
    CHECK(t && t->numel == 0 && t->shape[1] == 9, "empty round trip", "");
    t = st_find(&sf, "nan");
    CHECK(t && st_read_f32(&sf, t, 0, 1, got) == 0 && isnan(got[0]), "NaN round trip", "");
    const char *v = NULL;
    CHECK(json_get_string(&sf.metadata, "note", &v, NULL) == 0 && !strcmp(v, meta[3]) &&
              json_get_string(&sf.metadata, "step", &v, NULL) == 0 && !strcmp(v, "12"),
          "metadata round trip", "");
    st_close(&sf);

    // large F16 / F64 / I64 tensors: conversions go through the chunked path
    {
        const uint64_t N = 200003;
        uint16_t *h = (uint16_t *)malloc(N * 2);
        double *dd = (double *)malloc(N * 8);
        int64_t *ll = (int64_t *)malloc(N * 8);
        for (uint64_t i = 0; i < N; i++) { h[i] = (uint16_t)(i * 40503u); dd[i] = (double)i / 3.0; ll[i] = (int64_t)i - 100000; }
        StWriteTensor big[3];
        memset(big, 0, sizeof big);
        big[0].name = "h"; big[0].dtype = ST_F16; big[0].ndim = 1; big[0].shape[0] = (int64_t)N; big[0].data = h;
        big[1].name = "d"; big[1].dtype = ST_F64; big[1].ndim = 2; big[1].shape[0] = 1; big[1].shape[1] = (int64_t)N; big[1].data = dd;
        big[2].name = "l"; big[2].dtype = ST_I64; big[2].ndim = 1; big[2].shape[0] = (int64_t)N; big[2].data = ll;
        path_in(p, sizeof p, "big.safetensors");
        r = st_write(p, big, 3, NULL, 0);
        float *o = (float *)malloc(N * 4);
        int32_t *oi = (int32_t *)malloc(N * 4);
        r = r || st_open(&sf, p);
        const StTensor *th = r ? NULL : st_find(&sf, "h"), *td = r ? NULL : st_find(&sf, "d"), *tl = r ? NULL : st_find(&sf, "l");
        uint64_t first = 1000, cnt = N - 2000;
        int ok = th && td && tl && st_read_f32(&sf, th, first, cnt, o) == 0;
        for (uint64_t i = 0; ok && i < cnt; i++) ok = same_float(o[i], st_f16_to_f32(h[first + i]));
        CHECK(ok, "F16 sub-range over several chunks", "");
        ok = td && st_read_f32(&sf, td, first, cnt, o) == 0;
        for (uint64_t i = 0; ok && i < cnt; i++) ok = same_float(o[i], (float)dd[first + i]);
        CHECK(ok, "F64 sub-range over several chunks", "");
        ok = tl && st_read_i32(&sf, tl, oi) == 0;
        for (uint64_t i = 0; ok && i < N; i++) ok = oi[i] == (int32_t)ll[i];
        CHECK(ok, "I64 over several chunks", "");
        if (!r) st_close(&sf);
        free(h); free(dd); free(ll); free(o); free(oi);
    }

    // writing zero tensors is fine too
    r = st_write(p, NULL, 0, NULL, 0);
    CHECK(r == 0 && st_open(&sf, p) == 0 && sf.n_tensors == 0, "write and read an empty file", "");
    st_close(&sf);
}

static int file_equals(const char *path, const unsigned char *want, size_t n) {
    size_t m = 0;
    unsigned char *b = (unsigned char *)read_file(path, &m);
    int eq = b && m == n && memcmp(b, want, n) == 0;
    free(b);
    return eq;
}

static void test_atomic_write(void) {
    char p[512], tmp[600];
    path_in(p, sizeof p, "ckpt.safetensors");
    float v1[4] = {1, 2, 3, 4};
    StWriteTensor t;
    memset(&t, 0, sizeof t);
    t.name = "w"; t.dtype = ST_F32; t.ndim = 1; t.shape[0] = 4; t.data = v1;
    CHECK(st_write(p, &t, 1, NULL, 0) == 0, "write the first version", "");
    size_t n1 = 0;
    unsigned char *old = (unsigned char *)read_file(p, &n1);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", p, (long)getpid());
    CHECK(access(tmp, F_OK) != 0, "no temp file left after success", "%s exists", tmp);

    float v2[4] = {5, 6, 7, 8};
    t.data = v2;
    // 1. the temp file cannot be created (a directory squats on its name; works as root too)
    mkdir(tmp, 0755);
    capture_begin();
    int r = st_write(p, &t, 1, NULL, 0);
    const char *msg = capture_end();
    CHECK(r == -1 && strstr(msg, "cannot create temp file") && file_equals(p, old, n1), "failed create leaves the old file intact",
          "r=%d %s", r, msg);
    rmdir(tmp);
    // 2. the rename fails after the data is written (target is a non-empty directory): temp file removed
    char dirp[512], inner[600];
    path_in(dirp, sizeof dirp, "adir.safetensors");
    mkdir(dirp, 0755);
    snprintf(inner, sizeof inner, "%s/keep", dirp);
    write_bytes(inner, "x", 1);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", dirp, (long)getpid());
    capture_begin();
    r = st_write(dirp, &t, 1, NULL, 0);
    msg = capture_end();
    CHECK(r == -1 && strstr(msg, "cannot rename") && access(tmp, F_OK) != 0 && access(inner, F_OK) == 0,
          "failed rename removes the temp file", "r=%d %s", r, msg);
    // 3. the directory does not exist
    char nop[512];
    path_in(nop, sizeof nop, "no/such/dir/x.safetensors");
    capture_begin();
    r = st_write(nop, &t, 1, NULL, 0);
    msg = capture_end();
    CHECK(r == -1 && strstr(msg, "cannot create temp file") && strstr(msg, "No such file"), "missing directory refused", "r=%d %s", r, msg);
    // 4. invalid input is refused before anything is written
    StWriteTensor two[2];
    two[0] = t; two[1] = t;
    capture_begin();
    r = st_write(p, two, 2, NULL, 0);
    msg = capture_end();
    CHECK(r == -1 && strstr(msg, "tensor 'w': duplicate tensor name") && file_equals(p, old, n1), "duplicate names refused, old file intact",
          "r=%d %s", r, msg);
    two[1].name = "x"; two[1].shape[0] = -2;
    capture_begin();
    r = st_write(p, two, 2, NULL, 0);
    msg = capture_end();
    CHECK(r == -1 && strstr(msg, "tensor 'x': shape[0] = -2 is negative") && file_equals(p, old, n1), "negative shape refused", "%s", msg);
    two[1].shape[0] = 4; two[1].data = NULL;
    capture_begin();
    r = st_write(p, two, 2, NULL, 0);
    msg = capture_end();
    CHECK(r == -1 && strstr(msg, "data is NULL"), "NULL data refused", "%s", msg);
    const char *meta[4] = {"k", "1", "k", "2"};
    capture_begin();
    r = st_write(p, &t, 1, meta, 2);
    msg = capture_end();
    CHECK(r == -1 && strstr(msg, "duplicate metadata key \"k\""), "duplicate metadata refused", "%s", msg);
    // and a good second write replaces it
    CHECK(st_write(p, &t, 1, NULL, 0) == 0 && !file_equals(p, old, n1), "second write replaces the file", "");
    free(old);
}

// ----------------------------------------------------------------------------
// sharded models

static void make_shard(const char *dir, const char *file, const char *const *names, int n) {
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    StWriteTensor ts[8];
    static float data[8][4];
    memset(ts, 0, sizeof ts);
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < 4; j++) data[i][j] = (float)(names[i][0] * 10 + j);
        ts[i].name = names[i]; ts[i].dtype = ST_F32; ts[i].ndim = 1; ts[i].shape[0] = 4; ts[i].data = data[i];
    }
    if (st_write(p, ts, n, NULL, 0)) exit(2);
}

static void make_model_dir(char *dir, size_t n, const char *name, const char *index) {
    path_in(dir, n, name);
    mkdir(dir, 0755);
    const char *s1[2] = {"a", "b"}, *s2[1] = {"c"};
    make_shard(dir, "model-00001-of-00002.safetensors", s1, 2);
    make_shard(dir, "model-00002-of-00002.safetensors", s2, 1);
    if (index) {
        char p[600];
        snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
        write_bytes(p, index, strlen(index));
    }
}

static void expect_model_fail(const char *what, const char *dir, const char *want) {
    Weights m;
    capture_begin();
    int r = weights_open(&m, dir);
    const char *msg = capture_end();
    CHECK(r == -1 && m.files == NULL && strstr(msg, want), what, "r=%d msg='%s' (want '%s')", r, msg, want);
    if (r == 0) weights_close(&m);
}

#define GOOD_MAP "\"a\":\"model-00001-of-00002.safetensors\",\"b\":\"model-00001-of-00002.safetensors\",\"c\":\"model-00002-of-00002.safetensors\""

static void test_model(void) {
    char dir[512], p[600];
    // single file
    path_in(dir, sizeof dir, "single");
    mkdir(dir, 0755);
    const char *s1[3] = {"x", "y", "z"};
    make_shard(dir, "model.safetensors", s1, 3);
    Weights m;
    int r = weights_open(&m, dir);
    const WeightsEntry *t = r == 0 ? weights_find(&m, "y") : NULL;
    float f[4];
    CHECK(r == 0 && m.n_files == 1 && m.n_entries == 3 && t && t->file == 0 && weights_read_f32(&m, t, 0, 4, f) == 0 && f[1] == 'y' * 10 + 1,
          "single-file model", "r=%d", r);
    CHECK(r == 0 && weights_find(&m, "nope") == NULL, "weights_find absent", "");
    if (r == 0) weights_close(&m);

    // sharded
    make_model_dir(dir, sizeof dir, "sharded", "{\"metadata\":{\"total_size\":48},\"weight_map\":{" GOOD_MAP "}}");
    r = weights_open(&m, dir);
    CHECK(r == 0 && m.n_files == 2 && m.n_entries == 3, "sharded model opens", "r=%d", r);
    if (r == 0) {
        const WeightsEntry *ta = weights_find(&m, "a"), *tc = weights_find(&m, "c");
        CHECK(ta && tc && strstr(weights_path(&m, ta), "model-00001") && strstr(weights_path(&m, tc), "model-00002"), "tensors map to their shards", "");
        CHECK(tc && weights_read_f32(&m, tc, 2, 2, f) == 0 && f[0] == 'c' * 10 + 2 && f[1] == 'c' * 10 + 3, "read from the second shard", "");
        weights_close(&m);
    }

    make_model_dir(dir, sizeof dir, "m_badjson", "{\"weight_map\":{\"a\":}");
    expect_model_fail("bad index JSON", dir, "model.safetensors.index.json: not valid JSON: offset 19");
    make_model_dir(dir, sizeof dir, "m_notobj", "[1]");
    expect_model_fail("index not an object", dir, "index is a JSON array");
    make_model_dir(dir, sizeof dir, "m_nomap", "{\"metadata\":{}}");
    expect_model_fail("index without weight_map", dir, "missing \"weight_map\"");
    make_model_dir(dir, sizeof dir, "m_mapnum", "{\"weight_map\":{\"a\":3}}");
    expect_model_fail("weight_map value not a string", dir, "tensor 'a': shard file name is a JSON number");
    make_model_dir(dir, sizeof dir, "m_missing", "{\"weight_map\":{" GOOD_MAP ",\"d\":\"model-00003-of-00003.safetensors\"}}");
    expect_model_fail("missing shard", dir, "model-00003-of-00003.safetensors: cannot open: No such file");
    make_model_dir(dir, sizeof dir, "m_dotdot", "{\"weight_map\":{\"a\":\"../single/model.safetensors\"}}");
    expect_model_fail("shard path with ..", dir, "tensor 'a': shard file \"../single/model.safetensors\" is not a plain file name");
    make_model_dir(dir, sizeof dir, "m_dotdot2", "{\"weight_map\":{\"a\":\"..\"}}");
    expect_model_fail("shard name ..", dir, "is not a plain file name");
    make_model_dir(dir, sizeof dir, "m_abs", "{\"weight_map\":{\"a\":\"/etc/passwd\"}}");
    expect_model_fail("absolute shard path", dir, "is not a plain file name");
    make_model_dir(dir, sizeof dir, "m_lacks",
                   "{\"weight_map\":{" GOOD_MAP ",\"q\":\"model-00002-of-00002.safetensors\"}}");
    expect_model_fail("weight_map names a tensor the shard lacks", dir,
                      "tensor 'q': weight_map says shard \"model-00002-of-00002.safetensors\", but that shard has no such tensor");
    make_model_dir(dir, sizeof dir, "m_unmapped",
                   "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\",\"c\":\"model-00002-of-00002.safetensors\"}}");
    expect_model_fail("shard tensor missing from weight_map", dir, "tensor 'b': present in shard \"model-00001-of-00002.safetensors\" but not mapped");
    make_model_dir(dir, sizeof dir, "m_wrongshard",
                   "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\",\"b\":\"model-00002-of-00002.safetensors\",\"c\":\"model-00002-of-00002.safetensors\"}}");
    expect_model_fail("tensor mapped to the wrong shard", dir, "tensor 'b': weight_map says shard \"model-00002-of-00002.safetensors\"");
    make_model_dir(dir, sizeof dir, "m_dup", "{\"weight_map\":{" GOOD_MAP ",\"a\":\"model-00001-of-00002.safetensors\"}}");
    expect_model_fail("tensor listed twice in weight_map", dir, "tensor 'a': listed twice in weight_map");
    make_model_dir(dir, sizeof dir, "m_badshard", "{\"weight_map\":{" GOOD_MAP "}}");
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    write_st(p, 1ULL << 40, "{}", 0);
    expect_model_fail("corrupt shard", dir, "cannot open shard \"model-00002-of-00002.safetensors\"");
    make_model_dir(dir, sizeof dir, "m_huge_index", NULL);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    write_bytes(p, "{}", 2);
    if (truncate(p, (off_t)WEIGHTS_MAX_INDEX_LEN + 1) != 0) exit(2); // sparse: nothing is written
    expect_model_fail("index file over the size limit", dir, "file size 100000001 is not sane");
    make_model_dir(dir, sizeof dir, "m_empty", NULL);
    expect_model_fail("no model files", dir, "no model weights: none of model.safetensors, model.safetensors.index.json, pytorch_model.bin");
}

int main(void) {
    (void)test_skip;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/test_safetensors_XXXXXX");
    if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 2; }
    test_header_rejections();
    test_header_valid();
    test_header_mutations();
    test_fixtures();
    test_exhaustive_half();
    test_python_identical();
    test_roundtrip();
    test_atomic_write();
    test_model();
    remove_tree(tmpdir);
    return test_summary();
}
