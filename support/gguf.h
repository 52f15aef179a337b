// support/gguf.h: a GGUF v3 writer (the file format of llama.cpp and ggml), format only:
// the header, typed key-value pairs and arrays, tensor infos, alignment, the tensor data in
// F32, F16, BF16, Q8_0 or llama.cpp's k-quants (support/kquants.h), and an atomic write (a
// temp file, flushed and fsynced, renamed over the path, the directory fsynced), as
// support/safetensors.h's st_write. What the keys and
// tensors of a model are is the caller's (support/export_gguf.h: Llama).
//
//   file     "GGUF", u32 version 3, u64 tensor count, u64 KV count, the KVs, the tensor
//            infos, zero padding to the alignment (32), the tensors' data, each one starting
//            at a multiple of 32 from the data's start (zero padding between them)
//   KV       a string key (u64 length, bytes), u32 value type, the value; an array is u32
//            element type, u64 count, the elements. Little-endian throughout.
//   tensor   name, u32 n_dims, u64 ne[n_dims] (ne[0] the fastest: a (rows, cols) row-major
//            matrix is ne = {cols, rows}), u32 ggml type, u64 offset into the data
//
// The encodings are gguf-py's (gguf/quants.py), bit for bit, so that a file equals what
// llama.cpp's convert_hf_to_gguf.py writes from the same fp32 values:
//   F16   numpy's float32 -> float16: round to nearest, ties to even, overflow to inf,
//         subnormals rounded the same way
//   BF16  ggml_compute_fp32_to_bf16: a NaN made quiet, else round to nearest even
//   Q8_0  blocks of 32 along ne[0]: d = max|x| / 127 (fp32), q = x * (1 / d) rounded half
//         away from zero (np_roundf), d stored as F16; a block of zeros keeps d = 0, q = 0
// (the same Q8_0 as ggml's quantize_row_q8_0_ref, whose roundf rounds halves the same way).
// Q4_K, Q5_K, Q6_K, Q5_0 and Q5_1 are ggml's reference quantizers' (support/kquants.h).
// The rows of a block are encoded in parallel (OpenMP), each on its own: the bytes do not
// depend on the thread count.
#ifndef GGUF_H
#define GGUF_H
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <unistd.h>

enum { GGUF_T_U8 = 0, GGUF_T_I8, GGUF_T_U16, GGUF_T_I16, GGUF_T_U32, GGUF_T_I32, GGUF_T_F32, GGUF_T_BOOL,
       GGUF_T_STRING, GGUF_T_ARRAY, GGUF_T_U64, GGUF_T_I64, GGUF_T_F64 };
// ggml's tensor types (the ones written here)
enum { GGML_F32 = 0, GGML_F16 = 1, GGML_Q5_0 = 6, GGML_Q5_1 = 7, GGML_Q8_0 = 8, GGML_Q4_K = 12, GGML_Q5_K = 13,
       GGML_Q6_K = 14, GGML_BF16 = 30 };
#define GGUF_ALIGN 32
#define GGUF_QK8_0 32
#define GGUF_MAX_DIMS 4
#define GGUF_OUT_BYTES (8u << 20) // the encoded rows gathered for one write (at least a row)

// float32 -> float16 bits as numpy's astype(np.float16) (npy_floatbits_to_halfbits)
static inline uint16_t gguf_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) { // inf, or NaN with its top significand bits (never 0x7c00: that is inf)
        if (ax == 0x7f800000u) return sign | 0x7c00u;
        uint16_t h = (uint16_t)(0x7c00u + ((ax & 0x7fffffu) >> 13));
        return sign | (h == 0x7c00u ? 0x7c01u : h);
    }
    if (ax >= 0x477ff000u) return sign | 0x7c00u; // 65520 and above round to inf
    if (ax < 0x38800000u) { // below 2^-14: a subnormal (units of 2^-24) or zero
        int e = (int)(ax >> 23);
        if (e < 102) return sign; // below 2^-25
        uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        int shift = 126 - e; // 14 .. 24
        uint32_t h = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1))) h++;
        return sign | (uint16_t)h;
    }
    uint32_t r = ax - 0x38000000u; // the exponent rebiased (127 - 15)
    return sign | (uint16_t)((r + 0xfffu + ((r >> 13) & 1u)) >> 13);
}

// float32 -> bfloat16 bits as gguf-py (and ggml_compute_fp32_to_bf16)
static inline uint16_t gguf_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) x = (x & 0xffff0000u) | (64u << 16); // a quiet NaN
    return (uint16_t)(((uint64_t)x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// rounding half away from zero, op by op as gguf-py's np_roundf (fp32)
static inline float gguf_roundf(float v) {
    volatile float a = fabsf(v), fl = floorf(a);
    volatile float twice = 2.0f * (a - fl);
    float b = fl + floorf(twice);
    return v < 0 ? -b : v > 0 ? b : 0.0f * b;
}

// one Q8_0 block (34 bytes: d as F16, then 32 int8) of x[0..32)
static inline void gguf_q8_0_block(const float *x, uint8_t *out) {
    float amax = 0.0f;
    for (int i = 0; i < GGUF_QK8_0; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    volatile float d = amax / 127.0f;
    volatile float id = d == 0.0f ? 0.0f : 1.0f / d;
    uint16_t h = gguf_f16(d);
    out[0] = (uint8_t)(h & 0xff);
    out[1] = (uint8_t)(h >> 8);
    for (int i = 0; i < GGUF_QK8_0; i++) {
        volatile float p = x[i] * id;
        out[2 + i] = (uint8_t)(int8_t)gguf_roundf(p);
    }
}

#include "kquants.h"

// a type's elements per block and bytes per block (0: not a type written here)
static inline int gguf_block_size(int type) {
    return type == GGML_Q4_K || type == GGML_Q5_K || type == GGML_Q6_K ? KQ_K
         : type == GGML_Q5_0 || type == GGML_Q5_1 || type == GGML_Q8_0 ? 32 : 1;
}
static inline size_t gguf_block_bytes(int type) {
    switch (type) {
    case GGML_F32: return 4;
    case GGML_F16: case GGML_BF16: return 2;
    case GGML_Q8_0: return 2 + GGUF_QK8_0;
    case GGML_Q5_0: return KQ_Q5_0_BYTES;
    case GGML_Q5_1: return KQ_Q5_1_BYTES;
    case GGML_Q4_K: return KQ_Q4_K_BYTES;
    case GGML_Q5_K: return KQ_Q5_K_BYTES;
    case GGML_Q6_K: return KQ_Q6_K_BYTES;
    default: return 0;
    }
}
// bytes of one row of n elements in type (n a multiple of its block)
static inline size_t gguf_row_bytes(int type, uint64_t n) { return (size_t)(n / (uint64_t)gguf_block_size(type)) * gguf_block_bytes(type); }
static inline const char *gguf_type_name(int type) {
    switch (type) {
    case GGML_F32: return "F32";
    case GGML_F16: return "F16";
    case GGML_BF16: return "BF16";
    case GGML_Q8_0: return "Q8_0";
    case GGML_Q5_0: return "Q5_0";
    case GGML_Q5_1: return "Q5_1";
    case GGML_Q4_K: return "Q4_K";
    case GGML_Q5_K: return "Q5_K";
    case GGML_Q6_K: return "Q6_K";
    default: return "?";
    }
}

// one row of n fp32 values into out, encoded as type
static inline void gguf_encode_row(int type, const float *x, uint64_t n, uint8_t *out) {
    for (uint64_t i = 0; type == GGML_F32 && i < n; i++) memcpy(out + 4 * i, &x[i], 4);
    for (uint64_t i = 0; (type == GGML_F16 || type == GGML_BF16) && i < n; i++) {
        uint16_t h = type == GGML_F16 ? gguf_f16(x[i]) : gguf_bf16(x[i]);
        out[2 * i] = (uint8_t)(h & 0xff);
        out[2 * i + 1] = (uint8_t)(h >> 8);
    }
    if (gguf_block_size(type) == 1) return;
    size_t qk = (size_t)gguf_block_size(type), bytes = gguf_block_bytes(type);
    for (uint64_t b = 0; b < n / qk; b++) {
        const float *xb = x + b * qk;
        uint8_t *ob = out + b * bytes;
        switch (type) {
        case GGML_Q8_0: gguf_q8_0_block(xb, ob); break;
        case GGML_Q5_0: kq_q5_0_block(xb, ob); break;
        case GGML_Q5_1: kq_q5_1_block(xb, ob); break;
        case GGML_Q4_K: kq_q4_k_block(xb, ob); break;
        case GGML_Q5_K: kq_q5_k_block(xb, ob); break;
        case GGML_Q6_K: kq_q6_k_block(xb, ob); break;
        }
    }
}

// A tensor to write: fp32 values, row-major with ne[0] elements a row, encoded as type when
// the file is written. row_map (optional): row r of the tensor is row row_map[r] of data
// (a permutation, e.g. Llama's q/k rows); it and data must live until gguf_write. Or, with
// data NULL (gguf_add_tensor_fill), its rows read as they are written, a block of whole rows
// at a time (GgufWriter's fill_bytes): fill(ctx, first, count, dst) puts elements
// [first, first + count) of the tensor (fp32) into dst, 0 ok.
typedef int (*GgufFillFn)(void *ctx, size_t first, size_t count, void *dst);
typedef struct {
    char *name;
    int type, n_dims;
    uint64_t ne[GGUF_MAX_DIMS];
    const float *data;
    const int *row_map;
    GgufFillFn fill;
    void *ctx;
    uint64_t offset; // in the data section (gguf_write sets it)
} GgufTensor;

typedef struct {
    uint8_t *kv; size_t kv_n, kv_cap; // the KV section, encoded
    uint64_t n_kv;
    GgufTensor *t; int n_t, cap_t;
    int oom;
    size_t fill_bytes; // a fill reads up to this many bytes of whole rows (at least one row; 0: one row a fill)
} GgufWriter;

static inline void gguf_init(GgufWriter *w) { memset(w, 0, sizeof *w); }
static inline void gguf_free(GgufWriter *w) {
    for (int i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->t); free(w->kv);
    memset(w, 0, sizeof *w);
}

static inline void gguf__put(GgufWriter *w, const void *p, size_t n) {
    if (w->oom) return;
    if (w->kv_n + n > w->kv_cap) {
        size_t cap = w->kv_cap ? w->kv_cap : 4096;
        while (cap < w->kv_n + n) cap *= 2;
        uint8_t *k = (uint8_t *)realloc(w->kv, cap);
        if (!k) { w->oom = 1; return; }
        w->kv = k; w->kv_cap = cap;
    }
    memcpy(w->kv + w->kv_n, p, n);
    w->kv_n += n;
}
static inline void gguf__u32(GgufWriter *w, uint32_t v) { uint8_t b[4]; for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> (8 * i)); gguf__put(w, b, 4); }
static inline void gguf__u64(GgufWriter *w, uint64_t v) { uint8_t b[8]; for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i)); gguf__put(w, b, 8); }
static inline void gguf__f32(GgufWriter *w, float f) { uint32_t v; memcpy(&v, &f, 4); gguf__u32(w, v); }
static inline void gguf__str(GgufWriter *w, const char *s, size_t n) { gguf__u64(w, n); gguf__put(w, s, n); }
static inline void gguf__key(GgufWriter *w, const char *key, uint32_t type) {
    gguf__str(w, key, strlen(key));
    gguf__u32(w, type);
    w->n_kv++;
}

static inline void gguf_kv_str(GgufWriter *w, const char *key, const char *v) { gguf__key(w, key, GGUF_T_STRING); gguf__str(w, v, strlen(v)); }
static inline void gguf_kv_u32(GgufWriter *w, const char *key, uint32_t v) { gguf__key(w, key, GGUF_T_U32); gguf__u32(w, v); }
static inline void gguf_kv_f32(GgufWriter *w, const char *key, float v) { gguf__key(w, key, GGUF_T_F32); gguf__f32(w, v); }
static inline void gguf_kv_bool(GgufWriter *w, const char *key, int v) { uint8_t b = v != 0; gguf__key(w, key, GGUF_T_BOOL); gguf__put(w, &b, 1); }
// arrays: of n strings (each lens[i] bytes), of f32, of i32
static inline void gguf_kv_strs(GgufWriter *w, const char *key, const char *const *s, const int *lens, uint64_t n) {
    gguf__key(w, key, GGUF_T_ARRAY);
    gguf__u32(w, GGUF_T_STRING);
    gguf__u64(w, n);
    for (uint64_t i = 0; i < n; i++) gguf__str(w, s[i], (size_t)lens[i]);
}
static inline void gguf_kv_f32s(GgufWriter *w, const char *key, const float *v, uint64_t n) {
    gguf__key(w, key, GGUF_T_ARRAY);
    gguf__u32(w, GGUF_T_F32);
    gguf__u64(w, n);
    for (uint64_t i = 0; i < n; i++) gguf__f32(w, v[i]);
}
static inline void gguf_kv_i32s(GgufWriter *w, const char *key, const int32_t *v, uint64_t n) {
    gguf__key(w, key, GGUF_T_ARRAY);
    gguf__u32(w, GGUF_T_I32);
    gguf__u64(w, n);
    for (uint64_t i = 0; i < n; i++) gguf__u32(w, (uint32_t)v[i]);
}

// adds a tensor (see GgufTensor); 0 ok, -1 with a message (a row not a multiple of the type's block)
static inline int gguf_add_tensor(GgufWriter *w, const char *name, int type, int n_dims, const uint64_t *ne,
                                  const float *data, const int *row_map) {
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS || gguf_row_bytes(type, ne[0]) == 0 ||
        ne[0] % (uint64_t)gguf_block_size(type) != 0) {
        fprintf(stderr, "error: gguf: tensor '%s': cannot be stored as %s (%d dims, rows of %llu)\n", name,
                gguf_type_name(type), n_dims, (unsigned long long)ne[0]);
        return -1;
    }
    if (w->n_t == w->cap_t) {
        int cap = w->cap_t ? 2 * w->cap_t : 64;
        GgufTensor *t = (GgufTensor *)realloc(w->t, (size_t)cap * sizeof *t);
        if (!t) { w->oom = 1; return -1; }
        w->t = t; w->cap_t = cap;
    }
    GgufTensor *t = &w->t[w->n_t];
    memset(t, 0, sizeof *t);
    t->name = (char *)malloc(strlen(name) + 1);
    if (!t->name) { w->oom = 1; return -1; }
    strcpy(t->name, name);
    t->type = type; t->n_dims = n_dims;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = d < n_dims ? ne[d] : 1;
    t->data = data; t->row_map = row_map;
    w->n_t++;
    return 0;
}

// the same, its values read a block of rows at a time as the file is written (see GgufTensor)
static inline int gguf_add_tensor_fill(GgufWriter *w, const char *name, int type, int n_dims, const uint64_t *ne,
                                       GgufFillFn fill, void *ctx, const int *row_map) {
    if (gguf_add_tensor(w, name, type, n_dims, ne, NULL, row_map) != 0) return -1;
    w->t[w->n_t - 1].fill = fill, w->t[w->n_t - 1].ctx = ctx;
    return 0;
}

static inline uint64_t gguf__tensor_bytes(const GgufTensor *t) {
    return gguf_row_bytes(t->type, t->ne[0]) * t->ne[1] * t->ne[2] * t->ne[3];
}

// fsync the directory holding path (some file systems cannot: not a failure)
static inline int gguf__fsync_dir(const char *path) {
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == path) snprintf(dir, sizeof dir, "/");
    else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    int fd = open(dir, O_RDONLY);
    if (fd < 0) return -1;
    int r = fsync(fd);
    if (r != 0 && (errno == EINVAL || errno == ENOTSUP)) r = 0;
    close(fd);
    return r;
}

static inline int gguf__pad(FILE *f, uint64_t at) {
    static const uint8_t zeros[GGUF_ALIGN] = {0};
    size_t n = (size_t)((GGUF_ALIGN - at % GGUF_ALIGN) % GGUF_ALIGN);
    return n && fwrite(zeros, 1, n, f) != n ? -1 : 0;
}

// the rows of tensor t one fill reads (fill_bytes' worth, at least one; a tensor in memory: all)
static inline uint64_t gguf__fill_rows(const GgufWriter *w, const GgufTensor *t) {
    uint64_t rows = t->ne[1] * t->ne[2] * t->ne[3], per = w->fill_bytes / (t->ne[0] * sizeof(float));
    if (t->data) return rows;
    return per < 1 ? 1 : per < rows ? per : rows;
}

// the whole file into f: header, KVs, tensor infos, padding, data (encoded a row at a time)
static inline int gguf__write_contents(GgufWriter *w, FILE *f) {
    GgufWriter h; // the header and the tensor infos, built with the KV encoder
    gguf_init(&h);
    gguf__put(&h, "GGUF", 4);
    gguf__u32(&h, 3);
    gguf__u64(&h, (uint64_t)w->n_t);
    gguf__u64(&h, w->n_kv);
    gguf__put(&h, w->kv, w->kv_n);
    uint64_t off = 0;
    for (int i = 0; i < w->n_t; i++) {
        GgufTensor *t = &w->t[i];
        t->offset = off;
        gguf__str(&h, t->name, strlen(t->name));
        gguf__u32(&h, (uint32_t)t->n_dims);
        for (int d = 0; d < t->n_dims; d++) gguf__u64(&h, t->ne[d]);
        gguf__u32(&h, (uint32_t)t->type);
        gguf__u64(&h, off);
        off += (gguf__tensor_bytes(t) + GGUF_ALIGN - 1) / GGUF_ALIGN * GGUF_ALIGN;
    }
    int rc = h.oom || fwrite(h.kv, 1, h.kv_n, f) != h.kv_n || gguf__pad(f, h.kv_n) != 0 ? -1 : 0;
    gguf_free(&h);
    size_t most = GGUF_OUT_BYTES, block = 0; // the encoded rows of a write; a filled tensor's block of rows, in elements
    for (int i = 0; i < w->n_t; i++) {
        most = gguf_row_bytes(w->t[i].type, w->t[i].ne[0]) > most ? gguf_row_bytes(w->t[i].type, w->t[i].ne[0]) : most;
        size_t per = w->t[i].data ? 0 : gguf__fill_rows(w, &w->t[i]) * (size_t)w->t[i].ne[0];
        block = per > block ? per : block;
    }
    uint8_t *out = (uint8_t *)malloc(most);
    float *values = (float *)malloc((block ? block : 1) * sizeof(float)); // a filled tensor's block
    if (!out || !values) { free(out); free(values); return -1; }
    for (int i = 0; i < w->n_t && rc == 0; i++) {
        const GgufTensor *t = &w->t[i];
        uint64_t rows = t->ne[1] * t->ne[2] * t->ne[3], per = gguf__fill_rows(w, t), n = t->ne[0];
        size_t rb = gguf_row_bytes(t->type, n);
        for (uint64_t r0 = 0, r1; r0 < rows && rc == 0; r0 = r1) {
            // rows r0 .. r1 - 1 come from the source rows lo .. hi: one fill when those are
            // exactly as many (row_map permutes within the block, as Llama's q/k within a head)
            r1 = r0 + per < rows ? r0 + per : rows;
            uint64_t lo = UINT64_MAX, hi = 0;
            for (uint64_t r = r0; r < r1; r++) {
                uint64_t src = t->row_map ? (uint64_t)t->row_map[r] : r;
                lo = src < lo ? src : lo, hi = src > hi ? src : hi;
            }
            if (hi - lo + 1 != r1 - r0) r1 = r0 + 1, lo = t->row_map ? (uint64_t)t->row_map[r0] : r0; // (one row)
            if (!t->data && t->fill(t->ctx, lo * n, (r1 - r0) * n, values) != 0) { rc = -1; break; }
            const float *from = t->data ? t->data + lo * n : values;
            uint64_t per_write = most / rb; // rows c0 .. c1 - 1 encoded in parallel, then written
            for (uint64_t c0 = r0, c1; c0 < r1 && rc == 0; c0 = c1) {
                c1 = c0 + per_write < r1 ? c0 + per_write : r1;
                #pragma omp parallel for schedule(dynamic) if (c1 - c0 > 1 && t->type != GGML_F32)
                for (int64_t r = (int64_t)c0; r < (int64_t)c1; r++) {
                    uint64_t src = t->row_map ? (uint64_t)t->row_map[r] : (uint64_t)r;
                    gguf_encode_row(t->type, from + (src - lo) * n, n, out + ((uint64_t)r - c0) * rb);
                }
                if (fwrite(out, 1, (c1 - c0) * rb, f) != (c1 - c0) * rb) rc = -1;
            }
        }
        if (rc == 0) rc = gguf__pad(f, gguf__tensor_bytes(t));
    }
    free(out);
    free(values);
    return rc;
}

// Writes the file to path atomically: path.tmp.<pid> written, flushed, fsynced, renamed
// over path, the directory fsynced; on failure path is untouched and the temp file removed.
// 0 ok, -1 with a message.
static inline int gguf_write(GgufWriter *w, const char *path) {
    if (w->oom) { fprintf(stderr, "error: %s: out of memory building the GGUF header\n", path); return -1; }
    for (int i = 0; i < w->n_t; i++)
        for (int j = 0; j < i; j++)
            if (strcmp(w->t[i].name, w->t[j].name) == 0) { fprintf(stderr, "error: %s: duplicate tensor '%s'\n", path, w->t[i].name); return -1; }
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) { fprintf(stderr, "error: cannot create '%s': %s\n", tmp, strerror(errno)); return -1; }
    int rc = gguf__write_contents(w, f);
    if (rc == 0 && (fflush(f) != 0 || fsync(fileno(f)) != 0)) rc = -1;
    if (fclose(f) != 0) rc = -1;
    if (rc != 0) fprintf(stderr, "error: writing '%s' failed: %s\n", tmp, strerror(errno));
    if (rc == 0 && rename(tmp, path) != 0) { fprintf(stderr, "error: cannot rename '%s' over '%s': %s\n", tmp, path, strerror(errno)); rc = -1; }
    if (rc != 0) { remove(tmp); return -1; }
    if (gguf__fsync_dir(path) != 0) { fprintf(stderr, "error: %s: cannot fsync its directory: %s\n", path, strerror(errno)); return -1; }
    return 0;
}
#endif
