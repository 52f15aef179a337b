// safetensors.h: read and write the Hugging Face safetensors format.
// Single header, C99 + POSIX, also compiles as C++ (the CUDA trainer includes it).
//
// File layout: 8-byte little-endian header length N, N bytes of JSON
//   {"__metadata__": {str: str}, name: {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}, ...}
// then the data region; data_offsets are relative to the start of the data
// region (byte 8 + N). In StTensor, begin/end are ABSOLUTE file offsets.
//
// Everything in a file is untrusted and validated before use (st_parse_header
// is the pure parser, also the fuzzing entry point). We accept exactly what
// the Python library accepts, in particular the data region must be fully
// indexed: a gap between tensors or bytes after the last tensor are REFUSED
// (Python refuses them too: "invalid offset", "file not fully covered").
// Unknown extra fields inside a tensor entry are ignored, as Python does.
//
// Errors are printed to stderr as
//   "error: <path>: tensor '<name>': <problem>"  or  "error: <path>: <problem>"
// and the function returns -1. Tensor names in messages are escaped, so a
// hostile name cannot inject terminal control sequences.
//
// Include this header before any system header, or compile with
// -D_POSIX_C_SOURCE=200809L (or _GNU_SOURCE): it needs fseeko/fsync/fileno.
#ifndef SAFETENSORS_H
#define SAFETENSORS_H

#ifndef _FILE_OFFSET_BITS
#define _FILE_OFFSET_BITS 64
#endif
#if !defined(_POSIX_C_SOURCE) && !defined(_GNU_SOURCE) && !defined(_XOPEN_SOURCE)
#define _POSIX_C_SOURCE 200809L
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <stdarg.h>
#include <errno.h>
#include <sys/types.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>
#include "json.h"

#if defined(__GLIBC__) && !defined(__USE_XOPEN2K)
#error "safetensors.h needs POSIX 2001+: include it before system headers or compile with -D_POSIX_C_SOURCE=200809L"
#endif

#if defined(__GNUC__)
#define ST__PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define ST__PRINTF(a, b)
#endif

#define ST_MAX_DIMS 8
#define ST_MAX_HEADER_LEN 100000000ULL // 100 MB, Python's limit too

// all fixed-width dtypes the format defines (the sub-byte F4/F6 types are not supported)
typedef enum {
    ST_BOOL, ST_U8, ST_I8, ST_F8_E5M2, ST_F8_E4M3, ST_F8_E8M0, ST_I16, ST_U16, ST_F16, ST_BF16,
    ST_I32, ST_U32, ST_F32, ST_C64, ST_F64, ST_I64, ST_U64, ST_NDTYPES
} StDtype;

static const char *const st__dtype_names[ST_NDTYPES] = {
    "BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "I16", "U16", "F16", "BF16",
    "I32", "U32", "F32", "C64", "F64", "I64", "U64"};
static const int st__dtype_sizes[ST_NDTYPES] = {1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 4, 4, 4, 8, 8, 8, 8};

static inline const char *st_dtype_name(StDtype d) { return (unsigned)d < ST_NDTYPES ? st__dtype_names[d] : "?"; }
static inline int st_dtype_size(StDtype d) { return (unsigned)d < ST_NDTYPES ? st__dtype_sizes[d] : 0; }

typedef struct {
    char *name;                  // NUL-free (names with NUL are refused)
    StDtype dtype;
    int ndim;                    // 0..ST_MAX_DIMS (0 = scalar, numel 1)
    int64_t shape[ST_MAX_DIMS];
    uint64_t numel;
    uint64_t begin, end;         // ABSOLUTE byte offsets in the file: [begin, end)
} StTensor;

typedef struct {
    char *path;
    FILE *f;                     // NULL after st_parse_header alone
    uint64_t file_size, data_start; // data_start = 8 + header length
    StTensor *tensors;           // sorted by name (st_find does a binary search)
    int n_tensors;
    JsonValue metadata;          // the "__metadata__" object (string values only); empty object if absent
} StFile;

// ----------------------------------------------------------------------------
// small helpers

static inline void st__err(const char *path, const char *tensor, const char *fmt, ...) ST__PRINTF(3, 4);

// copies name into buf with non-printable bytes as \xNN, cut at ~120 chars
static inline const char *st__quote(const char *name, char *buf, size_t n) {
    size_t k = 0;
    for (const unsigned char *s = (const unsigned char *)name; *s && k + 8 < n; s++) {
        if (k > 120) { memcpy(buf + k, "...", 3); k += 3; break; }
        if (*s >= 0x20 && *s < 0x7f && *s != '\\') buf[k++] = (char)*s;
        else k += (size_t)snprintf(buf + k, n - k, "\\x%02x", *s);
    }
    buf[k] = 0;
    return buf;
}

static inline void st__err(const char *path, const char *tensor, const char *fmt, ...) {
    char q[160];
    va_list ap;
    va_start(ap, fmt);
    if (tensor) fprintf(stderr, "error: %s: tensor '%s': ", path, st__quote(tensor, q, sizeof q));
    else fprintf(stderr, "error: %s: ", path);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
}

static inline char *st__strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = (char *)malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

// "a/b" -> "a/b" + "/" + "c"
static inline char *st__join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = (char *)malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

static inline int st__host_le(void) { uint32_t x = 1; unsigned char c; memcpy(&c, &x, 1); return c == 1; }

// writes a shape as "[2, 3]" into buf (for messages)
static inline void st_format_shape(const int64_t *shape, int ndim, char *buf, size_t n) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

// ----------------------------------------------------------------------------
// exact conversions to float

// IEEE binary16 -> binary32. Every half is exactly representable as a float;
// subnormal halves (exp == 0) are renormalized, inf/NaN keep sign and payload.
static inline float st_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
    if (exp == 0x1f) bits = sign | 0x7f800000u | (mant << 13);  // inf / NaN
    else if (exp != 0) bits = sign | ((exp + 112) << 23) | (mant << 13); // normal: rebias 15 -> 127
    else if (mant == 0) bits = sign;                                    // +-0
    else { // subnormal: value = mant * 2^-24; shift the leading 1 into the implicit bit
        int e = 113; // float biased exponent of 2^-14, decreased once per shift
        while (!(mant & 0x400)) { mant <<= 1; e--; }
        bits = sign | ((uint32_t)e << 23) | ((mant & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

// bfloat16 is the top half of a float
static inline float st_bf16_to_f32(uint16_t b) {
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

// double -> float: C's conversion rounds with the current rounding mode,
// which is round-to-nearest-even unless the program changed it; overflow
// gives inf, NaN stays NaN.
static inline float st_f64_to_f32(double d) { return (float)d; }

static inline uint16_t st__le16(const unsigned char *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t st__le32(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t st__le64(const unsigned char *p) { return (uint64_t)st__le32(p) | ((uint64_t)st__le32(p + 4) << 32); }

// ----------------------------------------------------------------------------
// header parsing

static inline int st_dtype_from_string(const char *s, size_t len, StDtype *out) {
    for (int i = 0; i < ST_NDTYPES; i++)
        if (strlen(st__dtype_names[i]) == len && memcmp(st__dtype_names[i], s, len) == 0) { *out = (StDtype)i; return 0; }
    return -1;
}

// the header length must be sane before anything is allocated for it
static inline int st__check_header_len(const char *path, uint64_t n, uint64_t file_size) {
    if (file_size < 8) {
        st__err(path, NULL, "file is %llu bytes, too small for the 8-byte header length", (unsigned long long)file_size);
        return -1;
    }
    if (n < 2) { st__err(path, NULL, "header length %llu is too small (at least 2, \"{}\")", (unsigned long long)n); return -1; }
    if (n > ST_MAX_HEADER_LEN) {
        st__err(path, NULL, "header length %llu exceeds the limit of %llu bytes (corrupt or not a safetensors file)",
                (unsigned long long)n, ST_MAX_HEADER_LEN);
        return -1;
    }
    if (n > file_size - 8) {
        st__err(path, NULL, "header length %llu exceeds the file size (%llu bytes): file truncated?",
                (unsigned long long)n, (unsigned long long)file_size);
        return -1;
    }
    return 0;
}

static inline int st__cmp_name(const void *a, const void *b) {
    return strcmp(((const StTensor *)a)->name, ((const StTensor *)b)->name);
}
static inline int st__cmp_offset(const void *a, const void *b) {
    const StTensor *x = *(const StTensor *const *)a, *y = *(const StTensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

// validates one tensor entry {"dtype", "shape", "data_offsets"} into t
static inline int st__parse_tensor(const char *path, const char *name, const JsonValue *e, uint64_t data_start,
                                   uint64_t data_size, StTensor *t) {
    if (e->type != JSON_OBJECT) {
        st__err(path, name, "entry is a JSON %s, expected an object with dtype, shape, data_offsets", json_type_name(e->type));
        return -1;
    }
    int dup = json_find_duplicate_key(e);
    if (dup >= 0) { st__err(path, name, "duplicate field \"%s\" in entry", e->keys[dup]); return -1; }
    const JsonValue *dt = json_get(e, "dtype"), *sh = json_get(e, "shape"), *off = json_get(e, "data_offsets");
    if (!dt) { st__err(path, name, "missing \"dtype\""); return -1; }
    if (!sh) { st__err(path, name, "missing \"shape\""); return -1; }
    if (!off) { st__err(path, name, "missing \"data_offsets\""); return -1; }
    char q[160];
    if (dt->type != JSON_STRING) { st__err(path, name, "\"dtype\" is a JSON %s, expected a string", json_type_name(dt->type)); return -1; }
    if (st_dtype_from_string(dt->string, dt->string_len, &t->dtype)) {
        st__err(path, name, "unknown or unsupported dtype \"%s\"", st__quote(dt->string, q, sizeof q));
        return -1;
    }
    if (sh->type != JSON_ARRAY) { st__err(path, name, "\"shape\" is a JSON %s, expected an array", json_type_name(sh->type)); return -1; }
    if (sh->count > ST_MAX_DIMS) { st__err(path, name, "shape has %d dimensions, at most %d supported", sh->count, ST_MAX_DIMS); return -1; }
    t->ndim = sh->count;
    int has_zero = 0;
    for (int i = 0; i < sh->count; i++) {
        long long d;
        if (json_as_int(&sh->items[i], &d) != 0 || d < 0) {
            st__err(path, name, "shape[%d] is not a non-negative integer", i);
            return -1;
        }
        t->shape[i] = d;
        if (d == 0) has_zero = 1;
    }
    // numel and byte size without overflow (a zero dim makes it 0 whatever the rest)
    uint64_t numel = 1, size = (uint64_t)st_dtype_size(t->dtype);
    char shp[200];
    st_format_shape(t->shape, t->ndim, shp, sizeof shp);
    if (has_zero) numel = 0;
    else
        for (int i = 0; i < t->ndim; i++) {
            uint64_t d = (uint64_t)t->shape[i];
            if (numel > UINT64_MAX / d) { st__err(path, name, "shape %s overflows: too many elements", shp); return -1; }
            numel *= d;
        }
    if (numel > UINT64_MAX / size) { st__err(path, name, "shape %s overflows: too many bytes", shp); return -1; }
    t->numel = numel;
    if (off->type != JSON_ARRAY || off->count != 2) {
        st__err(path, name, "\"data_offsets\" must be an array of two integers [begin, end]");
        return -1;
    }
    long long b, en;
    if (json_as_int(&off->items[0], &b) || json_as_int(&off->items[1], &en) || b < 0 || en < 0) {
        st__err(path, name, "\"data_offsets\" must be two non-negative integers");
        return -1;
    }
    if (b > en) { st__err(path, name, "data_offsets [%lld, %lld]: begin is after end", b, en); return -1; }
    if ((uint64_t)en > data_size) {
        st__err(path, name, "data_offsets [%lld, %lld]: end is past the data region (%llu bytes): file truncated?",
                b, en, (unsigned long long)data_size);
        return -1;
    }
    if ((uint64_t)(en - b) != numel * size) {
        st__err(path, name, "data_offsets [%lld, %lld] span %lld bytes, but dtype %s with shape %s needs %llu",
                b, en, en - b, st_dtype_name(t->dtype), shp, (unsigned long long)(numel * size));
        return -1;
    }
    t->begin = data_start + (uint64_t)b;
    t->end = data_start + (uint64_t)en;
    return 0;
}

static inline void st_close(StFile *sf);

// Parses and validates the JSON header hdr[0..hdr_len) of a file of file_size
// bytes (name is used in messages). The pure parser behind st_open, and the
// fuzzing entry point. 0 ok (free with st_close), -1 (sf is left empty).
static inline int st_parse_header(StFile *sf, const char *name, const unsigned char *hdr, size_t hdr_len, uint64_t file_size) {
    memset(sf, 0, sizeof *sf);
    JsonValue root;
    memset(&root, 0, sizeof root);
    StTensor **order = NULL;
    char err[256];
    if (st__check_header_len(name, hdr_len, file_size)) return -1;
    sf->path = st__strdup(name);
    if (!sf->path) { st__err(name, NULL, "out of memory"); return -1; }
    sf->file_size = file_size;
    sf->data_start = 8 + (uint64_t)hdr_len;
    uint64_t data_size = file_size - sf->data_start;
    if (json_parse((const char *)hdr, hdr_len, &root, err, sizeof err)) {
        st__err(name, NULL, "header is not valid JSON: %s", err);
        goto fail;
    }
    if (root.type != JSON_OBJECT) { st__err(name, NULL, "header is a JSON %s, expected an object", json_type_name(root.type)); goto fail; }
    {
        int dup = json_find_duplicate_key(&root);
        if (dup >= 0) {
            if (strlen(root.keys[dup]) != root.key_lens[dup]) st__err(name, NULL, "duplicate tensor name containing NUL");
            else st__err(name, root.keys[dup], "duplicate tensor name in header");
            goto fail;
        }
    }
    sf->tensors = (StTensor *)calloc(root.count ? (size_t)root.count : 1, sizeof(StTensor));
    if (!sf->tensors) { st__err(name, NULL, "out of memory"); goto fail; }
    for (int i = 0; i < root.count; i++) {
        const char *key = root.keys[i];
        JsonValue *e = &root.items[i];
        if (strlen(key) != root.key_lens[i]) { st__err(name, NULL, "a tensor name contains a NUL character"); goto fail; }
        if (strcmp(key, "__metadata__") == 0) {
            if (e->type != JSON_OBJECT) { st__err(name, NULL, "\"__metadata__\" is a JSON %s, expected an object of strings", json_type_name(e->type)); goto fail; }
            for (int j = 0; j < e->count; j++)
                if (e->items[j].type != JSON_STRING) {
                    char q[160];
                    st__err(name, NULL, "\"__metadata__\" value of \"%s\" is a JSON %s, expected a string",
                            st__quote(e->keys[j], q, sizeof q), json_type_name(e->items[j].type));
                    goto fail;
                }
            if (json_find_duplicate_key(e) >= 0) { st__err(name, NULL, "duplicate key in \"__metadata__\""); goto fail; }
            sf->metadata = *e; // move it out of the DOM
            memset(e, 0, sizeof *e);
            continue;
        }
        StTensor *t = &sf->tensors[sf->n_tensors];
        if (st__parse_tensor(name, key, e, sf->data_start, data_size, t)) goto fail;
        t->name = st__strdup(key);
        if (!t->name) { st__err(name, NULL, "out of memory"); goto fail; }
        sf->n_tensors++;
    }
    if (sf->metadata.type != JSON_OBJECT) sf->metadata.type = JSON_OBJECT; // absent: empty object
    // the data region must be exactly tiled by the tensors: sort by offset and
    // require each tensor to start where the previous one ended
    order = (StTensor **)malloc((sf->n_tensors ? (size_t)sf->n_tensors : 1) * sizeof *order);
    if (!order) { st__err(name, NULL, "out of memory"); goto fail; }
    for (int i = 0; i < sf->n_tensors; i++) order[i] = &sf->tensors[i];
    qsort(order, (size_t)sf->n_tensors, sizeof *order, st__cmp_offset);
    {
        uint64_t pos = sf->data_start;
        for (int i = 0; i < sf->n_tensors; i++) {
            StTensor *t = order[i];
            if (t->begin < pos) {
                st__err(name, t->name, "data [%llu, %llu) overlaps tensor '%s'", (unsigned long long)(t->begin - sf->data_start),
                        (unsigned long long)(t->end - sf->data_start), order[i - 1]->name);
                goto fail;
            }
            if (t->begin > pos) {
                st__err(name, t->name, "%llu unused bytes before its data (the data region must be fully indexed)",
                        (unsigned long long)(t->begin - pos));
                goto fail;
            }
            pos = t->end;
        }
        if (pos != file_size) {
            st__err(name, NULL, "%llu unused bytes after the last tensor (the data region must be fully indexed)",
                    (unsigned long long)(file_size - pos));
            goto fail;
        }
    }
    free(order);
    json_free(&root);
    qsort(sf->tensors, (size_t)sf->n_tensors, sizeof(StTensor), st__cmp_name);
    return 0;
fail:
    free(order);
    json_free(&root);
    st_close(sf);
    return -1;
}

// path opened for reading, a regular file of *size bytes; NULL with a message
static inline FILE *st__open_regular(const char *path, uint64_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) { st__err(path, NULL, "cannot open: %s", strerror(errno)); return NULL; }
    struct stat stt;
    if (fstat(fileno(f), &stt) != 0 || !S_ISREG(stt.st_mode)) {
        st__err(path, NULL, "not a regular file");
        fclose(f);
        return NULL;
    }
    *size = (uint64_t)stt.st_size;
    return f;
}

// Opens and validates path. 0 ok, -1 with a message on stderr.
static inline int st_open(StFile *sf, const char *path) {
    memset(sf, 0, sizeof *sf);
    uint64_t size, n = 0;
    FILE *f = st__open_regular(path, &size);
    if (!f) return -1;
    unsigned char len8[8];
    if (size >= 8) {
        if (fread(len8, 1, 8, f) != 8) { st__err(path, NULL, "cannot read the header length"); fclose(f); return -1; }
        n = st__le64(len8);
    }
    if (st__check_header_len(path, n, size)) { fclose(f); return -1; }
    unsigned char *hdr = (unsigned char *)malloc((size_t)n);
    if (!hdr) { st__err(path, NULL, "out of memory for a %llu-byte header", (unsigned long long)n); fclose(f); return -1; }
    if (fread(hdr, 1, (size_t)n, f) != (size_t)n) {
        st__err(path, NULL, "cannot read the %llu-byte header", (unsigned long long)n);
        free(hdr);
        fclose(f);
        return -1;
    }
    int r = st_parse_header(sf, path, hdr, (size_t)n, size);
    free(hdr);
    if (r) { fclose(f); return -1; }
    sf->f = f;
    return 0;
}

static inline void st_close(StFile *sf) {
    if (!sf) return;
    if (sf->f) fclose(sf->f);
    for (int i = 0; i < sf->n_tensors; i++) free(sf->tensors[i].name);
    free(sf->tensors);
    free(sf->path);
    json_free(&sf->metadata);
    memset(sf, 0, sizeof *sf);
}

// binary search by name; NULL if absent
static inline const StTensor *st_find(const StFile *sf, const char *name) {
    int lo = 0, hi = sf->n_tensors - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(name, sf->tensors[mid].name);
        if (c == 0) return &sf->tensors[mid];
        if (c < 0) hi = mid - 1; else lo = mid + 1;
    }
    return NULL;
}

// ----------------------------------------------------------------------------
// reading data

// reads n bytes at absolute offset off (the file may have changed since open)
static inline int st__read_at(StFile *sf, const StTensor *t, uint64_t off, void *buf, size_t n) {
    if (!sf->f) { st__err(sf->path, t->name, "file is not open"); return -1; }
    if (off > (uint64_t)INT64_MAX || fseeko(sf->f, (off_t)off, SEEK_SET) != 0) {
        st__err(sf->path, t->name, "cannot seek to offset %llu: %s", (unsigned long long)off, strerror(errno));
        return -1;
    }
    if (fread(buf, 1, n, sf->f) != n) {
        st__err(sf->path, t->name, "cannot read %zu bytes at offset %llu: %s", n, (unsigned long long)off,
                ferror(sf->f) ? strerror(errno) : "unexpected end of file (file changed?)");
        clearerr(sf->f);
        return -1;
    }
    return 0;
}

// elements [first, first + count) lie within t (else -1 with a message)
static inline int st__check_range(StFile *sf, const StTensor *t, uint64_t first, uint64_t count) {
    if (first > t->numel || count > t->numel - first) {
        st__err(sf->path, t->name, "read of elements [%llu, %llu) is out of range (tensor has %llu)",
                (unsigned long long)first, (unsigned long long)(first + count), (unsigned long long)t->numel);
        return -1;
    }
    return 0;
}

// Reads elements [first, first + count) of t (flattened row-major) as floats,
// converting F16/BF16/F64 exactly (F64 -> F32 rounds to nearest even). Only
// those bytes are read, so ranks can load their own slice of a tensor.
static inline int st_read_f32(StFile *sf, const StTensor *t, uint64_t first, uint64_t count, float *out) {
    if (st__check_range(sf, t, first, count) != 0) return -1;
    if (t->dtype != ST_F32 && t->dtype != ST_F16 && t->dtype != ST_BF16 && t->dtype != ST_F64) {
        st__err(sf->path, t->name, "dtype %s cannot be read as float (F32, F16, BF16, F64 can)", st_dtype_name(t->dtype));
        return -1;
    }
    size_t es = (size_t)st_dtype_size(t->dtype);
    if (count > SIZE_MAX / 8) { st__err(sf->path, t->name, "read too large"); return -1; }
    uint64_t off = t->begin + first * es;
    if (t->dtype == ST_F32) { // straight into the output
        if (count && st__read_at(sf, t, off, out, (size_t)count * 4)) return -1;
        if (!st__host_le())
            for (uint64_t i = 0; i < count; i++) {
                uint32_t u = st__le32((const unsigned char *)(out + i));
                memcpy(out + i, &u, 4);
            }
        return 0;
    }
    // others through a bounce buffer, in chunks
    const size_t chunk = 1 << 16;
    unsigned char *buf = (unsigned char *)malloc(chunk * es);
    if (!buf) { st__err(sf->path, t->name, "out of memory"); return -1; }
    for (uint64_t done = 0; done < count;) {
        size_t n = count - done < chunk ? (size_t)(count - done) : chunk;
        if (st__read_at(sf, t, off + done * es, buf, n * es)) { free(buf); return -1; }
        float *o = out + done;
        if (t->dtype == ST_F16) for (size_t i = 0; i < n; i++) o[i] = st_f16_to_f32(st__le16(buf + 2 * i));
        else if (t->dtype == ST_BF16) for (size_t i = 0; i < n; i++) o[i] = st_bf16_to_f32(st__le16(buf + 2 * i));
        else
            for (size_t i = 0; i < n; i++) {
                uint64_t u = st__le64(buf + 8 * i);
                double d;
                memcpy(&d, &u, 8);
                o[i] = st_f64_to_f32(d);
            }
        done += n;
    }
    free(buf);
    return 0;
}

// Reads elements [first, first + count) of a tensor of dtype d as they are stored (U8's bytes,
// BF16's as uint16_t, F32's floats: safetensors is little-endian, as every host this builds for).
static inline int st_read_stored(StFile *sf, const StTensor *t, StDtype d, uint64_t first, uint64_t count, void *out) {
    if (t->dtype != d) { st__err(sf->path, t->name, "dtype %s is not %s", st_dtype_name(t->dtype), st_dtype_name(d)); return -1; }
    if (st__check_range(sf, t, first, count) != 0) return -1;
    size_t es = (size_t)st_dtype_size(d);
    return count ? st__read_at(sf, t, t->begin + first * es, out, (size_t)count * es) : 0;
}

// Reads all of an I32 or I64 tensor as int32 (I64 values must fit in int32).
static inline int st_read_i32(StFile *sf, const StTensor *t, int32_t *out) {
    if (t->dtype != ST_I32 && t->dtype != ST_I64) {
        st__err(sf->path, t->name, "dtype %s cannot be read as int32 (I32, I64 can)", st_dtype_name(t->dtype));
        return -1;
    }
    if (t->numel > SIZE_MAX / 8) { st__err(sf->path, t->name, "tensor too large"); return -1; }
    size_t n = (size_t)t->numel;
    if (t->dtype == ST_I32) {
        if (n && st__read_at(sf, t, t->begin, out, n * 4)) return -1;
        for (size_t i = 0; i < n && !st__host_le(); i++) {
            uint32_t u = st__le32((const unsigned char *)(out + i));
            memcpy(out + i, &u, 4);
        }
        return 0;
    }
    const size_t chunk = 1 << 16;
    unsigned char *buf = (unsigned char *)malloc(chunk * 8);
    if (!buf) { st__err(sf->path, t->name, "out of memory"); return -1; }
    for (size_t done = 0; done < n;) {
        size_t k = n - done < chunk ? n - done : chunk;
        if (st__read_at(sf, t, t->begin + (uint64_t)done * 8, buf, k * 8)) { free(buf); return -1; }
        for (size_t i = 0; i < k; i++) {
            int64_t v = (int64_t)st__le64(buf + 8 * i);
            if (v < INT32_MIN || v > INT32_MAX) {
                st__err(sf->path, t->name, "element %zu = %lld does not fit in int32", done + i, (long long)v);
                free(buf);
                return -1;
            }
            out[done + i] = (int32_t)v;
        }
        done += k;
    }
    free(buf);
    return 0;
}

// ----------------------------------------------------------------------------
// writing

// elements [first, first + count) of a tensor into dst: how a tensor that is not in host
// memory (the CUDA trainer's optimizer state) is written, a piece at a time; 0 ok, -1 with a message
typedef int (*StFillFn)(void *ctx, size_t first, size_t count, void *dst);

typedef struct {
    const char *name;
    StDtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data;  // numel * dtype size bytes in host (little-endian) layout; may be NULL if numel == 0
    StFillFn fill;     // or, with data NULL, the bytes come from fill(ctx, ...) through a staging buffer
    void *ctx;
} StWriteTensor;       // any fixed-size dtype is written as raw bytes (the trainer uses F32 and I32)

// the bytes a staging buffer holds: what writing a tensor through its fill, or reading one
// piece by piece, keeps in host memory at once. LLAMA2TUNE_STAGING_BYTES sets it (the tests
// make it small, so that their small tensors cross several pieces).
#define ST_STAGING_BYTES ((size_t)256 << 20)
static inline size_t st_staging_bytes(void) {
    const char *e = getenv("LLAMA2TUNE_STAGING_BYTES");
    long long v = e ? atoll(e) : 0;
    return v >= 64 ? (size_t)v : ST_STAGING_BYTES; // (at least a few elements of any dtype)
}

// growable string buffer for building the header
typedef struct { char *p; size_t n, cap; int oom; } St__Buf;
static inline void st__put(St__Buf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = (b->cap ? b->cap * 2 : 256);
        while (nc < b->n + n + 1) nc *= 2;
        char *np = (char *)realloc(b->p, nc);
        if (!np) { b->oom = 1; return; }
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static inline void st__puts(St__Buf *b, const char *s) { st__put(b, s, strlen(s)); }
static inline void st__put_json_string(St__Buf *b, const char *s) {
    size_t len = strlen(s), need = json_escape_string(NULL, 0, s, len);
    char small[256];
    char *tmp = need <= sizeof small ? small : (char *)malloc(need);
    if (!tmp) { b->oom = 1; return; }
    json_escape_string(tmp, need, s, len);
    st__put(b, tmp, need);
    if (tmp != small) free(tmp);
}

static inline int st__cmp_wt(const void *a, const void *b) {
    return strcmp((*(const StWriteTensor *const *)a)->name, (*(const StWriteTensor *const *)b)->name);
}

// fsync the directory holding path, so the rename itself is durable
static inline int st__fsync_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir;
    if (!slash) dir = st__strdup(".");
    else if (slash == path) dir = st__strdup("/");
    else {
        dir = (char *)malloc((size_t)(slash - path) + 1);
        if (dir) { memcpy(dir, path, (size_t)(slash - path)); dir[slash - path] = 0; }
    }
    if (!dir) return -1;
    int fd = open(dir, O_RDONLY);
    free(dir);
    if (fd < 0) return -1;
    int r = fsync(fd);
    // some file systems cannot fsync a directory; that is not a write failure
    if (r != 0 && (errno == EINVAL || errno == ENOTSUP)) r = 0;
    close(fd);
    return r;
}

// checks the tensors and the metadata before anything touches the file system, and
// puts the tensors in name order into order[0..n)
static inline int st__write_check(const char *path, const StWriteTensor *tensors, int n, const char *const *meta_kv, int n_meta,
                                  const StWriteTensor **order) {
    for (int i = 0; i < n; i++) {
        const StWriteTensor *t = &tensors[i];
        order[i] = t;
        if (!t->name || !t->name[0]) { st__err(path, NULL, "tensor %d has no name", i); return -1; }
        if (strcmp(t->name, "__metadata__") == 0) { st__err(path, t->name, "reserved name"); return -1; }
        if ((unsigned)t->dtype >= ST_NDTYPES) { st__err(path, t->name, "invalid dtype %d", (int)t->dtype); return -1; }
        if (t->ndim < 0 || t->ndim > ST_MAX_DIMS) { st__err(path, t->name, "ndim %d not in [0, %d]", t->ndim, ST_MAX_DIMS); return -1; }
        uint64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            if (t->shape[d] < 0) { st__err(path, t->name, "shape[%d] = %lld is negative", d, (long long)t->shape[d]); return -1; }
            if (t->shape[d] && numel > UINT64_MAX / 64 / (uint64_t)t->shape[d]) { st__err(path, t->name, "shape too large"); return -1; }
            numel *= (uint64_t)t->shape[d];
        }
        if (numel && !t->data && !t->fill) { st__err(path, t->name, "data is NULL"); return -1; }
    }
    qsort(order, (size_t)n, sizeof *order, st__cmp_wt);
    for (int i = 1; i < n; i++)
        if (strcmp(order[i]->name, order[i - 1]->name) == 0) { st__err(path, order[i]->name, "duplicate tensor name"); return -1; }
    for (int i = 0; i < n_meta; i++) {
        if (!meta_kv[2 * i] || !meta_kv[2 * i + 1]) { st__err(path, NULL, "metadata pair %d has a NULL key or value", i); return -1; }
        for (int j = 0; j < i; j++)
            if (strcmp(meta_kv[2 * i], meta_kv[2 * j]) == 0) { st__err(path, NULL, "duplicate metadata key \"%s\"", meta_kv[2 * i]); return -1; }
    }
    return 0;
}

// the header JSON into hb, compact like Python's:
// {"__metadata__":{..},"name":{"dtype":..,"shape":[..],"data_offsets":[b,e]},..}, padded with
// spaces so that the data starts 8-byte aligned (hb->oom when out of memory)
static inline void st__write_header(St__Buf *hb, const StWriteTensor *const *order, int n, const char *const *meta_kv, int n_meta) {
    uint64_t off = 0;
    char num[64];
    st__puts(hb, "{");
    if (n_meta > 0) {
        st__puts(hb, "\"__metadata__\":{");
        for (int i = 0; i < n_meta; i++) {
            if (i) st__puts(hb, ",");
            st__put_json_string(hb, meta_kv[2 * i]);
            st__puts(hb, ":");
            st__put_json_string(hb, meta_kv[2 * i + 1]);
        }
        st__puts(hb, "}");
    }
    for (int i = 0; i < n; i++) {
        const StWriteTensor *t = order[i];
        uint64_t numel = 1;
        if (n_meta > 0 || i > 0) st__puts(hb, ",");
        st__put_json_string(hb, t->name);
        st__puts(hb, ":{\"dtype\":\"");
        st__puts(hb, st_dtype_name(t->dtype));
        st__puts(hb, "\",\"shape\":[");
        for (int d = 0; d < t->ndim; d++) {
            snprintf(num, sizeof num, d ? ",%lld" : "%lld", (long long)t->shape[d]);
            st__puts(hb, num);
            numel *= (uint64_t)t->shape[d];
        }
        uint64_t end = off + numel * (uint64_t)st_dtype_size(t->dtype);
        snprintf(num, sizeof num, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off, (unsigned long long)end);
        st__puts(hb, num);
        off = end;
    }
    st__puts(hb, "}");
    while ((8 + hb->n) % 8) st__puts(hb, " ");
}

// the file's bytes into f (the temp file tmp): the header's length, the header and
// each tensor's data in order, flushed and fsynced
static inline int st__write_contents(FILE *f, const char *path, const char *tmp, const St__Buf *hb, const StWriteTensor *const *order, int n) {
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)hb->n >> (8 * i));
    if (fwrite(len8, 1, 8, f) != 8 || fwrite(hb->p, 1, hb->n, f) != hb->n) {
        st__err(path, NULL, "cannot write %s: %s", tmp, strerror(errno));
        return -1;
    }
    for (int i = 0; i < n; i++) {
        const StWriteTensor *t = order[i];
        uint64_t bytes = (uint64_t)st_dtype_size(t->dtype);
        for (int d = 0; d < t->ndim; d++) bytes *= (uint64_t)t->shape[d];
        if (bytes > SIZE_MAX) { st__err(path, t->name, "too large for this platform"); return -1; }
        if (t->data || !bytes) {
            if (bytes && fwrite(t->data, 1, (size_t)bytes, f) != (size_t)bytes) {
                st__err(path, t->name, "cannot write data to %s: %s", tmp, strerror(errno));
                return -1;
            }
            continue;
        }
        size_t es = st_dtype_size(t->dtype), n = (size_t)bytes / es, piece = st_staging_bytes() / es; // elements at a time
        if (piece > n) piece = n;
        void *stage = malloc(piece * es);
        if (!stage) { st__err(path, t->name, "out of memory for a staging buffer"); return -1; }
        int rc = 0;
        for (size_t first = 0; first < n && rc == 0; first += piece) {
            size_t k = n - first < piece ? n - first : piece;
            if (t->fill(t->ctx, first, k, stage) != 0) rc = -1;
            else if (fwrite(stage, es, k, f) != k) {
                st__err(path, t->name, "cannot write data to %s: %s", tmp, strerror(errno));
                rc = -1;
            }
        }
        free(stage);
        if (rc != 0) return -1;
    }
    if (fflush(f) != 0 || fsync(fileno(f)) != 0) { st__err(path, NULL, "cannot flush %s: %s", tmp, strerror(errno)); return -1; }
    return 0;
}

// the file written as path.tmp.<pid>, renamed over path, then the directory fsynced
// (the rename is durable only then); on failure before the rename the temp file is removed
static inline int st__write_file(const char *path, const St__Buf *hb, const StWriteTensor *const *order, int n) {
    char pid[32];
    snprintf(pid, sizeof pid, ".tmp.%ld", (long)getpid());
    char *tmp = (char *)malloc(strlen(path) + strlen(pid) + 1);
    if (!tmp) { st__err(path, NULL, "out of memory"); return -1; }
    strcpy(tmp, path);
    strcat(tmp, pid);
    FILE *f = fopen(tmp, "wb");
    if (!f) { st__err(path, NULL, "cannot create temp file %s: %s", tmp, strerror(errno)); free(tmp); return -1; }
    int rc = st__write_contents(f, path, tmp, hb, order, n);
    int closed = fclose(f) == 0;
    if (rc == 0 && !closed) { st__err(path, NULL, "cannot close %s: %s", tmp, strerror(errno)); rc = -1; }
    if (rc == 0 && rename(tmp, path) != 0) { st__err(path, NULL, "cannot rename %s over it: %s", tmp, strerror(errno)); rc = -1; }
    if (rc != 0) remove(tmp);
    else if (st__fsync_dir(path) != 0) { st__err(path, NULL, "cannot fsync its directory: %s", strerror(errno)); rc = -1; }
    free(tmp);
    return rc;
}

// Writes tensors (sorted by name in header and data, as the Python library
// does for same-size dtypes) and n_meta metadata pairs meta_kv[2i] -> meta_kv[2i+1]
// to path, atomically: path.tmp.<pid> is written, flushed, fsynced and renamed
// over path, then the directory is fsynced. On failure the temp file is
// removed, path is untouched, and -1 is returned with a message.
static inline int st_write(const char *path, const StWriteTensor *tensors, int n, const char *const *meta_kv, int n_meta) {
    if (!st__host_le()) { st__err(path, NULL, "writing safetensors on a big-endian host is not supported"); return -1; }
    if (n < 0 || n_meta < 0 || (n > 0 && !tensors) || (n_meta > 0 && !meta_kv)) { st__err(path, NULL, "bad arguments to st_write"); return -1; }
    const StWriteTensor **order = (const StWriteTensor **)malloc((n ? (size_t)n : 1) * sizeof *order);
    if (!order) { st__err(path, NULL, "out of memory"); return -1; }
    St__Buf hb;
    memset(&hb, 0, sizeof hb);
    int rc = -1;
    if (st__write_check(path, tensors, n, meta_kv, n_meta, order) == 0) {
        st__write_header(&hb, order, n, meta_kv, n_meta);
        if (hb.oom) st__err(path, NULL, "out of memory building the header");
        else rc = st__write_file(path, &hb, order, n);
    }
    free(order);
    free(hb.p);
    return rc;
}

#endif // SAFETENSORS_H
