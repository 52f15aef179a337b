// Small utilities shared by the trainers: checked allocation and file access
// that stop with a message naming the call site and the file.
#ifndef UTILS_H
#define UTILS_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>

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
#define mallocCheck(size) malloc_check((size), __FILE__, __LINE__)
#define callocCheck(n, size) calloc_check((n), (size), __FILE__, __LINE__)

static FILE *fopen_check(const char *path, const char *mode, const char *file, int line) {
    FILE *f = fopen(path, mode);
    if (!f) die("%s:%d: cannot open '%s' (mode %s): %s", file, line, path, mode, strerror(errno));
    return f;
}
#define fopenCheck(path, mode) fopen_check((path), (mode), __FILE__, __LINE__)

// reads a whole file into a NUL-terminated buffer; NULL (errno set) on failure
static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - 1 - n, f);
        if (n < cap - 1) break;
        char *nb = realloc(buf, cap *= 2);
        if (!nb) { free(buf); buf = NULL; errno = ENOMEM; }
        else buf = nb;
    }
    int err = ferror(f);
    fclose(f);
    if (!buf) return NULL;
    if (err) { free(buf); errno = EIO; return NULL; }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}
#endif
