// Small utilities shared by the trainers: checked allocation and file access
// that stop with a message naming the call site and the file.
#ifndef UTILS_H
#define UTILS_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <errno.h>
#include <unistd.h>

static void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
#include <stdarg.h>
static void die(const char *fmt, ...) {
    va_list ap; va_start(ap, fmt);
    fprintf(stderr, "error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

// x rounded to fp32 once, as a separate op: a product kept from being fused with the sum
// after it into one fma (GNU C's default -ffp-contract=fast), where a reference (torch)
// rounds each op
static inline float f32_rounded(float x) { volatile float v = x; return v; }
// a float's bits and back
static inline uint32_t f32_bits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static inline float f32_from_bits(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }

// the overlap of the ranges [a, a + n) and [b, b + m): its first element into *lo, its
// length returned (0: they do not overlap)
static inline size_t range_overlap(size_t a, size_t n, size_t b, size_t m, size_t *lo) {
    size_t s = a > b ? a : b, e = a + n < b + m ? a + n : b + m;
    *lo = s;
    return e > s ? e - s : 0;
}

static void *malloc_check(size_t size, const char *file, int line) {
    void *p = malloc(size ? size : 1);
    if (!p) die("%s:%d: out of memory allocating %zu bytes", file, line, size);
    return p;
}
static void *calloc_check(size_t n, size_t size, const char *file, int line) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) die("%s:%d: out of memory allocating %zu x %zu bytes", file, line, n, size);
    return p;
}
static void *realloc_check(void *p, size_t size, const char *file, int line) {
    p = realloc(p, size ? size : 1);
    if (!p) die("%s:%d: out of memory growing a buffer to %zu bytes", file, line, size);
    return p;
}
#define mallocCheck(size) malloc_check((size), __FILE__, __LINE__)
#define callocCheck(n, size) calloc_check((n), (size), __FILE__, __LINE__)
#define reallocCheck(p, size) realloc_check((p), (size), __FILE__, __LINE__)

static FILE *fopen_check(const char *path, const char *mode, const char *file, int line) {
    FILE *f = fopen(path, mode);
    if (!f) die("%s:%d: cannot open '%s' (mode %s): %s", file, line, path, mode, strerror(errno));
    return f;
}
#define fopenCheck(path, mode) fopen_check((path), (mode), __FILE__, __LINE__)

// reads a whole file into a NUL-terminated buffer; NULL (errno set) on failure.
// A file of more than max bytes is refused (errno EFBIG): before reading when it
// is a regular file, else once that much has been read.
#include <sys/stat.h>
static char *read_file_max(const char *path, size_t *len, size_t max) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode) && (unsigned long long)st.st_size > max) {
        fclose(f);
        errno = EFBIG;
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = (char *)malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - 1 - n, f);
        if (n > max) { free(buf); buf = NULL; errno = EFBIG; break; }
        if (n < cap - 1) break;
        char *nb = (char *)realloc(buf, cap *= 2);
        if (!nb) { free(buf); buf = NULL; errno = ENOMEM; }
        else buf = nb;
    }
    int err = !buf ? (errno ? errno : ENOMEM) : ferror(f) ? (errno ? errno : EIO) : 0; // e.g. EISDIR for a directory
    fclose(f);
    if (err) { free(buf); errno = err; return NULL; }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}
static char *read_file(const char *path, size_t *len) { return read_file_max(path, len, (size_t)-1); }

// temporary file, flush, fsync, rename: a reader never sees a half-written file
static int write_bytes_atomic(const char *path, const void *data, size_t n) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) { fprintf(stderr, "error: cannot write '%s': %s\n", tmp, strerror(errno)); return -1; }
    int bad = fwrite(data, 1, n, f) != n;
    bad |= fflush(f) != 0;
    bad |= fsync(fileno(f)) != 0;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) {
        fprintf(stderr, "error: writing '%s' failed: %s\n", path, strerror(errno));
        remove(tmp);
        return -1;
    }
    return 0;
}

// reads and parses a JSON file (a config: at most JSON_FILE_MAX bytes):
// 0 ok, -1 with an error naming the file printed
#include "json.h"
#define JSON_FILE_MAX ((size_t)64 << 20)
static int json_load_file(const char *path, JsonValue *out) {
    size_t len;
    char err[256];
    char *text = read_file_max(path, &len, JSON_FILE_MAX);
    if (!text && errno == EFBIG) { fprintf(stderr, "error: %s: larger than the %zu bytes allowed\n", path, JSON_FILE_MAX); return -1; }
    if (!text) { fprintf(stderr, "error: %s: cannot read: %s\n", path, strerror(errno)); return -1; }
    int rc = json_parse(text, len, out, err, sizeof err);
    free(text);
    if (rc != 0) fprintf(stderr, "error: %s: invalid JSON: %s\n", path, err);
    return rc;
}

// mkdir -p: 0 ok, -1 with errno set
static int mkdir_p(const char *path) {
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf) { errno = ENAMETOOLONG; return -1; }
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != 0) continue;
        char c = buf[i];
        buf[i] = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -1;
        buf[i] = c;
    }
    struct stat st;
    if (stat(path, &st) != 0) return -1;
    if (!S_ISDIR(st.st_mode)) { errno = ENOTDIR; return -1; }
    return 0;
}

// ----------------------------------------------------------------------------
// random numbers: splitmix64, used both as a stream (init, shuffling) and as a
// counter-based hash (dropout masks), so results never depend on thread count.

#include <stdint.h>
// the hash also runs on the GPU (LoRA dropout masks in lora.cuh): one definition for both trainers
#ifdef __CUDACC__
#define HOST_DEVICE __host__ __device__
#else
#define HOST_DEVICE
#endif
static inline HOST_DEVICE uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}
static inline uint64_t rng_next(uint64_t *state) { return splitmix64(*state += 0x9E3779B97F4A7C15ull); }
// uniform in [0, 1) with 24 bits, exactly representable as float
static inline float rng_uniform(uint64_t *state) { return (float)(rng_next(state) >> 40) / 16777216.0f; }
static inline HOST_DEVICE float hash_uniform(uint64_t key, uint64_t i) { return (float)(splitmix64(key ^ splitmix64(i)) >> 40) / 16777216.0f; }
// standard normal: Marsaglia's polar method on a point (x, y) of 24-bit coordinates from the
// hash, hashed again until it falls inside the unit disc (79% of tries); |z| < 8. No sine
// or cosine: 1.5x faster than Box-Muller, which matters for drawing 7 G weights.
#include <math.h>
static inline float hash_normal(uint64_t key, uint64_t i) {
    for (uint64_t h = splitmix64(key ^ splitmix64(i));; h = splitmix64(h)) {
        float x = (float)(h >> 40) / 8388608.0f - 1.0f, y = (float)((h >> 16) & 0xFFFFFF) / 8388608.0f - 1.0f;
        float s = x * x + y * y;
        if (s > 0.0f && s < 1.0f) return x * sqrtf(-2.0f * logf(s) / s);
    }
}

// clocks in milliseconds, for durations: now_ms monotonic wall time, cpu_now_ms the CPU
// time of every thread of the process so far
#include <time.h>
static double clock_ms(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}
static double now_ms(void) { return clock_ms(CLOCK_MONOTONIC); }
static double cpu_now_ms(void) { return clock_ms(CLOCK_PROCESS_CPUTIME_ID); }
// hashing (the token cache's keys and checksum, checkpoint file digests); not
// cryptographic: it catches damage and change, not forgery

#define DATA_HASH_SEED 0x6C6C616D61327475ull
// n must be a multiple of 8 (the token cache is written in 8-byte words); data_hash_bytes takes any n
static uint64_t data_hash_words(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = (h ^ w) * 0x9E3779B97F4A7C15ull; // each step is a bijection of h: one changed word always changes the result
        h ^= h >> 29;
    }
    return h;
}
static uint64_t data_hash_bytes(uint64_t h, const void *p, size_t n) {
    size_t whole = n & ~(size_t)7;
    h = data_hash_words(h, p, whole);
    uint64_t tail[2] = {0, (uint64_t)n};
    memcpy(tail, (const unsigned char *)p + whole, n - whole);
    return splitmix64(data_hash_words(h, tail, sizeof tail));
}

// Consecutive pieces of one allocation, laid out by two passes over the same calls: with
// base NULL they only count the bytes (the memory plan), then, with base an allocation of
// that many bytes, they place each piece. Each piece starts a multiple of align bytes
// from base. (Both trainers' model_layout; place() wraps it for their element types.)
typedef struct { char *base; size_t bytes, align; } Layout;
static void *layout_take(Layout *l, size_t bytes) {
    char *p = l->base ? l->base + l->bytes : NULL;
    l->bytes += (bytes + l->align - 1) / l->align * l->align;
    return p;
}
#endif
