// torch_zip.h: read PyTorch's torch.save files (pytorch_model.bin) into safetensors.h's StFile,
// so that st_find, st_read_f32 (a rank reads only its own bytes) and st_close work on them.
// Single header, C99 + POSIX, also compiles as C++. Include it before any system header
// (it includes safetensors.h, which sets the feature macros).
//
// The format, as torch.save writes it since torch 1.6: an uncompressed ZIP archive (ZIP64
// past 4 GB) whose entries all sit in one folder, <prefix>/ (the first entry's folder, as
// torch's reader takes it): data.pkl, a pickle of the state dict; data/<key>, one storage's raw
// little-endian bytes per key; byteorder ("little"); version and a few more that we do not
// read. Offsets come from the central directory; an entry's data starts after ITS local
// header (30 bytes, its name, its extra field: torch pads the extra so storages start
// 64-byte aligned). Only the end records, the central directory, the local headers of the
// entries used, byteorder and data.pkl are read: never the tensors' data.
//
// data.pkl goes through a restricted unpickler that accepts a subset of what
// torch.load(weights_only=True) accepts (torch/_weights_only_unpickler.py), and runs nothing:
//   opcodes: PROTO STOP MARK TUPLE TUPLE1-3 EMPTY_TUPLE EMPTY_DICT SETITEM SETITEMS NONE
//     NEWTRUE NEWFALSE BININT BININT1 BININT2 LONG1 BINUNICODE GLOBAL REDUCE BUILD BINPERSID
//     BINGET LONG_BINGET BINPUT LONG_BINPUT; any other is refused by its hex code;
//   globals: collections.OrderedDict (called with no arguments), torch._utils._rebuild_tensor_v2
//     (storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata]),
//     torch._utils._rebuild_parameter(tensor, requires_grad, backward_hooks) and torch's typed
//     storages; any other is refused by name;
//   BUILD only sets an OrderedDict's attributes (state_dict()'s _metadata, ignored);
//   BINPERSID only ('storage', <storage type>, key, location, numel).
// The pickle must give a dict or OrderedDict of str -> tensor. A tensor's storage must be
// F32, F16 or BF16 (torch.FloatStorage, HalfStorage, BFloat16Storage; any other dtype is
// refused naming the tensor); it must be contiguous (C-order strides; a dimension of size 1
// may have any stride) and lie inside its storage, whose record must hold exactly numel
// elements. Storages may be shared (tied weights, views at an offset). Refused too: duplicate
// keys, names with NUL, strings that are not UTF-8, compressed or encrypted entries (torch.save
// never writes them), a byteorder other than "little", the legacy pre-1.6 format.
// Sizes, offsets, memo indices, stack and MARK depth are checked before use, and what any
// input can make us allocate is bounded (the PT_MAX_* limits).
//
// Errors are printed as "error: <path>: <problem>" or "error: <path>: tensor '<name>': <problem>"
// (safetensors.h's st__err) and the function returns -1, with sf left empty.
#ifndef TORCH_ZIP_H
#define TORCH_ZIP_H

#include "safetensors.h"

#define PT_MAX_PKL (16u << 20)   // data.pkl: a 70B model's whole state dict pickles to ~100 KB
#define PT_MAX_CD (64u << 20)    // central directory (~100 bytes per tensor)
#define PT_MAX_PUSHES (1 << 20)  // values pushed by data.pkl (~20 a tensor): bounds values, stack and items (~100 MB)
#define PT_MAX_MARKS 64          // MARK nesting depth
#define PT_MAX_MEMO (1 << 20)    // memo indices (torch.save numbers them 0, 1, 2, ...)
#define PT_MAX_LINE 256          // a GLOBAL's module or name

// ----------------------------------------------------------------------------
// reading the archive: from a file, or from bytes in memory (the fuzzing entry point)

typedef struct {
    const char *path;
    FILE *f;                     // one of f and mem
    const unsigned char *mem;
    uint64_t size;
} Pt__Src;

// n bytes at offset off; what names them in the message
static inline int pt__read(const Pt__Src *s, uint64_t off, void *buf, size_t n, const char *what) {
    if (off > s->size || n > s->size - off) {
        st__err(s->path, NULL, "%s at offset %llu (%zu bytes) is past the end of the file (%llu bytes): truncated?", what,
                (unsigned long long)off, n, (unsigned long long)s->size);
        return -1;
    }
    if (!s->f) { memcpy(buf, s->mem + off, n); return 0; }
    if (off > (uint64_t)INT64_MAX || fseeko(s->f, (off_t)off, SEEK_SET) != 0 || fread(buf, 1, n, s->f) != n) {
        st__err(s->path, NULL, "cannot read %s at offset %llu: %s", what, (unsigned long long)off,
                ferror(s->f) ? strerror(errno) : "unexpected end of file (file changed?)");
        clearerr(s->f);
        return -1;
    }
    return 0;
}

// ----------------------------------------------------------------------------
// the ZIP archive

typedef struct {
    char *name;                  // NUL-terminated (names with NUL are refused)
    uint64_t header, size;       // local header offset; size (stored: compressed == uncompressed)
    int method, flags;
    uint64_t data;               // where the data starts, once pt__entry_data read the local header (0: not yet)
    int storage_type;            // as a storage: the pt__globals index it was first read with (-1: not yet)
    uint64_t storage_numel;
} Pt__Entry;

typedef struct {
    Pt__Src src;
    Pt__Entry *e;                // sorted by name
    int n;
    char *names;                 // the entries' names, one allocation
    char *prefix;                // the first entry's folder, with its '/': the records are named under it
} Pt__Zip;

static inline int pt__cmp_entry(const void *a, const void *b) {
    return strcmp(((const Pt__Entry *)a)->name, ((const Pt__Entry *)b)->name);
}

static inline Pt__Entry *pt__find(const Pt__Zip *z, const char *name) {
    int lo = 0, hi = z->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2, c = strcmp(name, z->e[mid].name);
        if (c == 0) return &z->e[mid];
        if (c < 0) hi = mid - 1; else lo = mid + 1;
    }
    return NULL;
}

// prefix + rest, malloc'd (a record's full name)
static inline char *pt__record_name(const Pt__Zip *z, const char *rest, const char *rest2, size_t n2) {
    size_t a = strlen(z->prefix), b = strlen(rest);
    char *s = (char *)malloc(a + b + n2 + 1);
    if (!s) return NULL;
    memcpy(s, z->prefix, a);
    memcpy(s + a, rest, b);
    if (n2) memcpy(s + a + b, rest2, n2);
    s[a + b + n2] = 0;
    return s;
}

// ZIP64's end record, found through its locator just before the end record at end_pos:
// 1 if there is no locator (a plain ZIP), 0 with the central directory's place, -1 on error
static inline int pt__zip64_end(Pt__Zip *z, uint64_t end_pos, uint64_t *count, uint64_t *cd_off, uint64_t *cd_size,
                                uint64_t *cd_limit) {
    unsigned char loc[20], r[56];
    if (end_pos < 20 || pt__read(&z->src, end_pos - 20, loc, 20, "ZIP64 locator") || st__le32(loc) != 0x07064b50u) return 1;
    uint64_t at = st__le64(loc + 8);
    if (st__le32(loc + 4) != 0 || st__le32(loc + 16) > 1) { st__err(z->src.path, NULL, "multi-disk ZIP archives are not supported"); return -1; }
    if (at > end_pos - 20 || end_pos - 20 - at < 56) {
        st__err(z->src.path, NULL, "ZIP64 end record offset %llu is out of place", (unsigned long long)at);
        return -1;
    }
    if (pt__read(&z->src, at, r, 56, "ZIP64 end record")) return -1;
    if (st__le32(r) != 0x06064b50u) { st__err(z->src.path, NULL, "no ZIP64 end record at offset %llu", (unsigned long long)at); return -1; }
    if (st__le32(r + 16) != 0 || st__le32(r + 20) != 0 || st__le64(r + 24) != st__le64(r + 32)) {
        st__err(z->src.path, NULL, "multi-disk ZIP archives are not supported");
        return -1;
    }
    *count = st__le64(r + 32);
    *cd_size = st__le64(r + 40);
    *cd_off = st__le64(r + 48);
    *cd_limit = at;
    return 0;
}

// an end of central directory record at b[i], its comment reaching the end of the file
static inline int pt__is_end(const unsigned char *b, size_t i, size_t tail) {
    return st__le32(b + i) == 0x06054b50u && 22 + (size_t)st__le16(b + i + 20) == tail - i;
}

// the end of central directory record (in the last 22 + 65535 bytes: a comment of up to
// 64 KB may follow it), then ZIP64's if there is one: where the central directory is
static inline int pt__find_end(Pt__Zip *z, uint64_t *count, uint64_t *cd_off, uint64_t *cd_size, uint64_t *cd_limit) {
    uint64_t size = z->src.size, tail = size < 22 + 65535 ? size : 22 + 65535;
    if (size < 22) { st__err(z->src.path, NULL, "file is %llu bytes, too small for a ZIP archive", (unsigned long long)size); return -1; }
    unsigned char *b = (unsigned char *)malloc((size_t)tail);
    if (!b) { st__err(z->src.path, NULL, "out of memory"); return -1; }
    if (pt__read(&z->src, size - tail, b, (size_t)tail, "the end of the archive")) { free(b); return -1; }
    size_t i = (size_t)tail - 22;
    while (i > 0 && !pt__is_end(b, i, (size_t)tail)) i--;
    if (!pt__is_end(b, i, (size_t)tail)) {
        free(b);
        st__err(z->src.path, NULL, "no ZIP end of central directory record: not a torch.save file, or truncated "
                "(the legacy format of torch before 1.6 is not supported)");
        return -1;
    }
    const unsigned char *p = b + i;
    int disks_ok = st__le16(p + 4) == 0 && st__le16(p + 6) == 0 && st__le16(p + 8) == st__le16(p + 10);
    *count = st__le16(p + 10);
    *cd_size = st__le32(p + 12);
    *cd_off = st__le32(p + 16);
    *cd_limit = size - tail + i;
    free(b);
    if (!disks_ok) { st__err(z->src.path, NULL, "multi-disk ZIP archives are not supported"); return -1; }
    int r = pt__zip64_end(z, *cd_limit, count, cd_off, cd_size, cd_limit);
    return r < 0 ? -1 : 0;
}

// a field the 32-bit record saturated (0xFFFFFFFF) is in the ZIP64 extra field (id 1),
// 8 bytes each, in the order uncompressed size, compressed size, local header offset
static inline int pt__zip64_extra(const unsigned char *x, size_t xlen, uint64_t *usize, uint64_t *csize, uint64_t *hdr) {
    uint64_t *f[3] = {usize, csize, hdr};
    for (size_t k = 0; k + 4 <= xlen;) {
        size_t id = st__le16(x + k), len = st__le16(x + k + 2), at = k + 4;
        if (len > xlen - at) return -1;
        if (id == 1)
            for (int j = 0; j < 3; j++) {
                if (*f[j] != 0xFFFFFFFFu) continue;
                if (at + 8 > k + 4 + len) return -1;
                *f[j] = st__le64(x + at);
                at += 8;
            }
        k += 4 + len;
    }
    return 0;
}

// one central directory record at cd[*pos] into e (its name copied to *names)
static inline int pt__cd_entry(Pt__Zip *z, const unsigned char *cd, uint64_t cd_size, uint64_t *pos, char **names, Pt__Entry *e) {
    const unsigned char *p = cd + *pos;
    size_t nlen = 0, xlen = 0, clen = 0;
    if (cd_size - *pos >= 46 && st__le32(p) == 0x02014b50u) { nlen = st__le16(p + 28); xlen = st__le16(p + 30); clen = st__le16(p + 32); }
    if (cd_size - *pos < 46 || st__le32(p) != 0x02014b50u || 46 + nlen + xlen + clen > cd_size - *pos) {
        st__err(z->src.path, NULL, "central directory record %d at offset %llu is malformed", z->n, (unsigned long long)*pos);
        return -1;
    }
    memcpy(*names, p + 46, nlen);
    (*names)[nlen] = 0;
    e->name = *names;
    *names += nlen + 1;
    char q[160];
    if (strlen(e->name) != nlen) { st__err(z->src.path, NULL, "an entry name contains a NUL byte"); return -1; }
    e->flags = st__le16(p + 8);
    e->method = st__le16(p + 10);
    uint64_t csize = st__le32(p + 20), usize = st__le32(p + 24), hdr = st__le32(p + 42);
    if (pt__zip64_extra(p + 46 + nlen, xlen, &usize, &csize, &hdr)) {
        st__err(z->src.path, NULL, "entry '%s': malformed ZIP64 extra field", st__quote(e->name, q, sizeof q));
        return -1;
    }
    if (e->method == 0 && csize != usize) {
        st__err(z->src.path, NULL, "entry '%s' is stored, but its sizes differ (%llu and %llu)", st__quote(e->name, q, sizeof q),
                (unsigned long long)csize, (unsigned long long)usize);
        return -1;
    }
    e->size = usize;
    e->header = hdr;
    e->storage_type = -1;
    *pos += 46 + nlen + xlen + clen;
    return 0;
}

// the folder of the first entry (torch's reader takes the archive's name from it)
static inline int pt__prefix(Pt__Zip *z) {
    char q[160];
    if (!z->n) { st__err(z->src.path, NULL, "the archive is empty: not a torch.save file"); return -1; }
    const char *slash = strchr(z->e[0].name, '/');
    if (!slash) {
        st__err(z->src.path, NULL, "entry '%s' is not in a folder: not a torch.save file", st__quote(z->e[0].name, q, sizeof q));
        return -1;
    }
    size_t n = (size_t)(slash - z->e[0].name) + 1;
    z->prefix = (char *)malloc(n + 1);
    if (!z->prefix) { st__err(z->src.path, NULL, "out of memory"); return -1; }
    memcpy(z->prefix, z->e[0].name, n);
    z->prefix[n] = 0;
    return 0;
}

// the central directory: every entry, sorted by name (a name twice is refused: which one
// torch would read is not ours to guess)
static inline int pt__read_cd(Pt__Zip *z) {
    uint64_t count, off, size, limit;
    if (pt__find_end(z, &count, &off, &size, &limit)) return -1;
    if (size > PT_MAX_CD) {
        st__err(z->src.path, NULL, "central directory is %llu bytes, over the limit of %u", (unsigned long long)size, PT_MAX_CD);
        return -1;
    }
    if (off > limit || size > limit - off || count > size / 46) {
        st__err(z->src.path, NULL, "central directory (%llu entries, %llu bytes at offset %llu) does not fit before its end record",
                (unsigned long long)count, (unsigned long long)size, (unsigned long long)off);
        return -1;
    }
    unsigned char *cd = (unsigned char *)malloc((size_t)size + 1);
    z->names = (char *)malloc((size_t)size + 1);
    z->e = (Pt__Entry *)calloc(count ? (size_t)count : 1, sizeof(Pt__Entry));
    if (!cd || !z->names || !z->e) { free(cd); st__err(z->src.path, NULL, "out of memory"); return -1; }
    int rc = pt__read(&z->src, off, cd, (size_t)size, "the central directory");
    char *names = z->names;
    uint64_t pos = 0;
    for (uint64_t k = 0; rc == 0 && k < count; k++) {
        rc = pt__cd_entry(z, cd, size, &pos, &names, &z->e[k]);
        if (rc == 0) z->n++;
    }
    free(cd);
    if (rc || pt__prefix(z)) return -1;
    qsort(z->e, (size_t)z->n, sizeof *z->e, pt__cmp_entry);
    char q[160];
    for (int k = 1; k < z->n; k++)
        if (strcmp(z->e[k - 1].name, z->e[k].name) == 0) {
            st__err(z->src.path, NULL, "entry '%s' is in the archive twice", st__quote(z->e[k].name, q, sizeof q));
            return -1;
        }
    return 0;
}

// where an entry's bytes start: after its local header, whose own name and extra lengths
// count (they may differ from the central directory's)
static inline int pt__entry_data(Pt__Zip *z, Pt__Entry *e) {
    char q[160];
    unsigned char h[30];
    if (e->data) return 0;
    if (e->method != 0) {
        st__err(z->src.path, NULL, "entry '%s' is compressed (method %d): torch.save stores every entry uncompressed",
                st__quote(e->name, q, sizeof q), e->method);
        return -1;
    }
    if (e->flags & 1) { st__err(z->src.path, NULL, "entry '%s' is encrypted", st__quote(e->name, q, sizeof q)); return -1; }
    if (pt__read(&z->src, e->header, h, 30, "a local header")) return -1;
    if (st__le32(h) != 0x04034b50u || st__le16(h + 8) != 0 || st__le16(h + 26) != strlen(e->name)) {
        st__err(z->src.path, NULL, "entry '%s': its local header at offset %llu does not match the central directory",
                st__quote(e->name, q, sizeof q), (unsigned long long)e->header);
        return -1;
    }
    uint64_t data = e->header + 30 + st__le16(h + 26) + st__le16(h + 28);
    if (data > z->src.size || e->size > z->src.size - data) {
        st__err(z->src.path, NULL, "entry '%s': its %llu bytes at offset %llu run past the end of the file (%llu bytes): truncated?",
                st__quote(e->name, q, sizeof q), (unsigned long long)e->size, (unsigned long long)data, (unsigned long long)z->src.size);
        return -1;
    }
    e->data = data;
    return 0;
}

// a whole small record (data.pkl, byteorder) into memory; NULL, *e NULL and no message if absent
static inline unsigned char *pt__record(Pt__Zip *z, const char *rest, uint64_t limit, Pt__Entry **e) {
    char *name = pt__record_name(z, rest, NULL, 0);
    *e = NULL;
    if (!name) { st__err(z->src.path, NULL, "out of memory"); return NULL; }
    *e = pt__find(z, name);
    free(name);
    if (!*e || pt__entry_data(z, *e)) return NULL;
    if ((*e)->size > limit) {
        st__err(z->src.path, NULL, "%s is %llu bytes, over the limit of %llu", rest, (unsigned long long)(*e)->size, (unsigned long long)limit);
        return NULL;
    }
    unsigned char *b = (unsigned char *)malloc((size_t)(*e)->size + 1);
    if (!b) { st__err(z->src.path, NULL, "out of memory for %s", rest); return NULL; }
    if (pt__read(&z->src, (*e)->data, b, (size_t)(*e)->size, rest)) { free(b); return NULL; }
    return b;
}

// the byteorder record, if there is one, must say "little" (as torch.save writes on every
// machine we run on); without it torch assumes little-endian too
static inline int pt__byteorder(Pt__Zip *z) {
    Pt__Entry *e;
    unsigned char *b = pt__record(z, "byteorder", 16, &e);
    if (!b) return e ? -1 : 0; // (absent, or refused with a message)
    int ok = e->size == 6 && memcmp(b, "little", 6) == 0;
    free(b);
    if (!ok) st__err(z->src.path, NULL, "byteorder record is not \"little\": big-endian archives are not supported");
    return ok ? 0 : -1;
}

static inline void pt__zip_free(Pt__Zip *z) {
    free(z->e);
    free(z->names);
    free(z->prefix);
}

// ----------------------------------------------------------------------------
// the restricted unpickler: it builds values, never calls anything

enum { PV_NONE, PV_BOOL, PV_INT, PV_STR, PV_TUPLE, PV_DICT, PV_ODICT, PV_GLOBAL, PV_STORAGE, PV_TENSOR };
static const char *const pt__type_names[] = {"None", "bool", "int", "str", "tuple", "dict", "OrderedDict", "global", "storage", "tensor"};

typedef struct {
    int type;
    int n, cap;                  // items: a tuple's n values; a dict's n/2 keys and values, interleaved
    int *items;                  // (indices of values)
    int64_t i;                   // PV_INT, PV_BOOL: the value; PV_GLOBAL: its pt__globals index;
                                 // PV_STORAGE: its persistent id tuple; PV_TENSOR: its _rebuild_tensor_v2 arguments
    const unsigned char *s;      // PV_STR: its bytes in data.pkl (not NUL-terminated)
    uint32_t len;
} Pt__Val;

enum { PG_ODICT, PG_REBUILD, PG_PARAM, PG_STORAGE };
typedef struct { const char *module, *name; int kind; StDtype dtype; } Pt__Global;

// every global we accept (torch.load(weights_only=True) accepts all of them, and more);
// a storage whose dtype is ST_NDTYPES is accepted here and refused on the tensor using it
static const Pt__Global pt__globals[] = {
    {"collections", "OrderedDict", PG_ODICT, ST_NDTYPES},
    {"torch._utils", "_rebuild_tensor_v2", PG_REBUILD, ST_NDTYPES},
    {"torch._utils", "_rebuild_parameter", PG_PARAM, ST_NDTYPES},
    {"torch", "FloatStorage", PG_STORAGE, ST_F32},
    {"torch", "HalfStorage", PG_STORAGE, ST_F16},
    {"torch", "BFloat16Storage", PG_STORAGE, ST_BF16},
    {"torch", "DoubleStorage", PG_STORAGE, ST_NDTYPES},
    {"torch", "LongStorage", PG_STORAGE, ST_NDTYPES},
    {"torch", "IntStorage", PG_STORAGE, ST_NDTYPES},
    {"torch", "ShortStorage", PG_STORAGE, ST_NDTYPES},
    {"torch", "CharStorage", PG_STORAGE, ST_NDTYPES},
    {"torch", "ByteStorage", PG_STORAGE, ST_NDTYPES},
    {"torch", "BoolStorage", PG_STORAGE, ST_NDTYPES},
    {"torch", "ComplexFloatStorage", PG_STORAGE, ST_NDTYPES},
    {"torch", "ComplexDoubleStorage", PG_STORAGE, ST_NDTYPES},
};
#define PT__N_GLOBALS ((int)(sizeof pt__globals / sizeof pt__globals[0]))

typedef struct {
    const char *path;
    const unsigned char *b;      // data.pkl
    size_t len, pos, op;         // op: where the current opcode starts (for messages)
    Pt__Val *v;
    int nv, capv;
    int *stack, ns, caps;
    int marks[PT_MAX_MARKS], nm; // the stack heights at each open MARK
    int *memo, nmemo;            // value index per memo slot, -1 if unset
    long pushes;
} Pt__Pickle;

static inline void pt__perr(Pt__Pickle *P, const char *fmt, ...) ST__PRINTF(2, 3);
static inline void pt__perr(Pt__Pickle *P, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    st__err(P->path, NULL, "%s (data.pkl byte %zu)", msg, P->op);
}

static inline Pt__Val *pt__val(Pt__Pickle *P, int k) { return &P->v[k]; }

// a new value (not on the stack), -1 when out of memory
static inline int pt__new(Pt__Pickle *P, int type) {
    if (P->nv == P->capv) {
        int cap = P->capv ? 2 * P->capv : 256;
        Pt__Val *v = (Pt__Val *)realloc(P->v, (size_t)cap * sizeof *v);
        if (!v) { pt__perr(P, "out of memory"); return -1; }
        P->v = v;
        P->capv = cap;
    }
    memset(&P->v[P->nv], 0, sizeof P->v[0]);
    P->v[P->nv].type = type;
    return P->nv++;
}

static inline int pt__push(Pt__Pickle *P, int k) {
    if (k < 0) return -1;
    if (++P->pushes > PT_MAX_PUSHES) { pt__perr(P, "more than %d values pushed: not a state_dict", PT_MAX_PUSHES); return -1; }
    if (P->ns == P->caps) {
        int cap = P->caps ? 2 * P->caps : 256;
        int *s = (int *)realloc(P->stack, (size_t)cap * sizeof *s);
        if (!s) { pt__perr(P, "out of memory"); return -1; }
        P->stack = s;
        P->caps = cap;
    }
    P->stack[P->ns++] = k;
    return 0;
}

static inline int pt__push_new(Pt__Pickle *P, int type, int64_t i) {
    int k = pt__new(P, type);
    if (k >= 0) P->v[k].i = i;
    return pt__push(P, k);
}

// the stack below the innermost MARK belongs to an enclosing frame (as in Python's pickle)
static inline int pt__floor(const Pt__Pickle *P) { return P->nm ? P->marks[P->nm - 1] : 0; }

static inline int pt__pop(Pt__Pickle *P, int *k) {
    if (P->ns <= pt__floor(P)) { pt__perr(P, "pickle stack underflow"); return -1; }
    *k = P->stack[--P->ns];
    return 0;
}

static inline int pt__top(Pt__Pickle *P, int *k) {
    if (P->ns <= pt__floor(P)) { pt__perr(P, "pickle stack underflow"); return -1; }
    *k = P->stack[P->ns - 1];
    return 0;
}

// appends n value indices to v's items
static inline int pt__add_items(Pt__Pickle *P, int k, const int *items, int n) {
    Pt__Val *v = pt__val(P, k);
    if (n == 0) return 0;
    if (v->n + n > v->cap) {
        int cap = v->cap ? v->cap : 4;
        while (cap < v->n + n) cap *= 2;
        int *it = (int *)realloc(v->items, (size_t)cap * sizeof *it);
        if (!it) { pt__perr(P, "out of memory"); return -1; }
        v->items = it;
        v->cap = cap;
    }
    memcpy(v->items + v->n, items, (size_t)n * sizeof *items);
    v->n += n;
    return 0;
}

// the top n values of the frame become one tuple
static inline int pt__tuple(Pt__Pickle *P, int n) {
    if (P->ns - pt__floor(P) < n) { pt__perr(P, "pickle stack underflow"); return -1; }
    int k = pt__new(P, PV_TUPLE);
    const int *items = n ? P->stack + P->ns - n : NULL; // (no stack is allocated before the first push)
    if (k < 0 || pt__add_items(P, k, items, n)) return -1;
    P->ns -= n;
    return pt__push(P, k);
}

// closes the innermost MARK: its frame's values are P->stack[*from .. P->ns)
static inline int pt__pop_mark(Pt__Pickle *P, int *from) {
    if (!P->nm) { pt__perr(P, "pickle opcode needs a MARK, and none is open"); return -1; }
    *from = P->marks[--P->nm];
    return 0;
}

static inline int pt__need(Pt__Pickle *P, size_t n) {
    if (n > P->len - P->pos) { pt__perr(P, "data.pkl ends inside an opcode: truncated?"); return -1; }
    return 0;
}

static inline int pt__utf8(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        int l = json__utf8_len(s + i, n - i);
        if (!l) return 0;
        i += (size_t)l;
    }
    return 1;
}

// ---- the opcodes with arguments

// GLOBAL "module\nname\n": only ours, by exact name
static inline int pt__op_global(Pt__Pickle *P) {
    const char *s[2];
    size_t n[2];
    for (int j = 0; j < 2; j++) {
        size_t room = P->len - P->pos < PT_MAX_LINE + 1 ? P->len - P->pos : PT_MAX_LINE + 1;
        const unsigned char *nl = (const unsigned char *)memchr(P->b + P->pos, '\n', room);
        if (!nl) { pt__perr(P, "GLOBAL's name is unterminated or longer than %d bytes", PT_MAX_LINE); return -1; }
        s[j] = (const char *)P->b + P->pos;
        n[j] = (size_t)(nl - (P->b + P->pos));
        P->pos += n[j] + 1;
    }
    for (int g = 0; g < PT__N_GLOBALS; g++)
        if (strlen(pt__globals[g].module) == n[0] && memcmp(pt__globals[g].module, s[0], n[0]) == 0 &&
            strlen(pt__globals[g].name) == n[1] && memcmp(pt__globals[g].name, s[1], n[1]) == 0)
            return pt__push_new(P, PV_GLOBAL, g);
    char full[2 * PT_MAX_LINE + 2], q[160];
    snprintf(full, sizeof full, "%.*s.%.*s", (int)n[0], s[0], (int)n[1], s[1]);
    pt__perr(P, "refused: pickle global %s is not part of a state_dict", st__quote(full, q, sizeof q));
    return -1;
}

// REDUCE: calls only OrderedDict(), _rebuild_tensor_v2 and _rebuild_parameter, and only
// records the call (a tensor is its argument tuple until it is named)
static inline int pt__op_reduce(Pt__Pickle *P) {
    int a, f;
    if (pt__pop(P, &a) || pt__top(P, &f)) return -1;
    const Pt__Val *args = pt__val(P, a), *fn = pt__val(P, f);
    if (fn->type != PV_GLOBAL) { pt__perr(P, "refused: pickle calls a value of type %s", pt__type_names[fn->type]); return -1; }
    const Pt__Global *g = &pt__globals[fn->i];
    if (args->type != PV_TUPLE) { pt__perr(P, "REDUCE's arguments are of type %s, expected a tuple", pt__type_names[args->type]); return -1; }
    int k = -1;
    if (g->kind == PG_ODICT && args->n == 0) k = pt__new(P, PV_ODICT);
    else if (g->kind == PG_REBUILD && (args->n == 6 || args->n == 7) && pt__val(P, args->items[0])->type == PV_STORAGE) {
        k = pt__new(P, PV_TENSOR);
        if (k >= 0) P->v[k].i = a;
    } else if (g->kind == PG_PARAM && args->n == 3 && pt__val(P, args->items[0])->type == PV_TENSOR) k = args->items[0];
    else {
        pt__perr(P, "refused: pickle calls %s.%s with %d arguments, not as torch.save does for a state_dict", g->module, g->name, args->n);
        return -1;
    }
    if (k < 0) return -1;
    P->stack[P->ns - 1] = k;
    return 0;
}

// BUILD: only an OrderedDict's attributes (state_dict()'s _metadata), which we ignore
static inline int pt__op_build(Pt__Pickle *P) {
    int s, o;
    if (pt__pop(P, &s) || pt__top(P, &o)) return -1;
    int st = pt__val(P, s)->type, ot = pt__val(P, o)->type;
    if (ot != PV_ODICT || (st != PV_DICT && st != PV_ODICT)) {
        pt__perr(P, "refused: pickle BUILD on a value of type %s (state of type %s): only an OrderedDict's attributes may be set",
                 pt__type_names[ot], pt__type_names[st]);
        return -1;
    }
    return 0;
}

// SETITEM and SETITEMS: the pairs P->stack[from .. P->ns) into the dict below them
static inline int pt__op_setitems(Pt__Pickle *P, int from) {
    int d;
    if ((P->ns - from) % 2) { pt__perr(P, "SETITEMS with an odd number of values"); return -1; }
    int n = P->ns - from;
    P->ns = from;
    if (pt__top(P, &d)) return -1;
    int t = pt__val(P, d)->type;
    if (t != PV_DICT && t != PV_ODICT) { pt__perr(P, "SETITEM into a value of type %s, expected a dict", pt__type_names[t]); return -1; }
    return pt__add_items(P, d, P->stack + from, n); // (the popped slots are still intact)
}

static inline int pt__op_setitem(Pt__Pickle *P) {
    if (P->ns - pt__floor(P) < 2) { pt__perr(P, "pickle stack underflow"); return -1; }
    return pt__op_setitems(P, P->ns - 2);
}

static inline int pt__is_str(const Pt__Val *v, const char *s) {
    return v->type == PV_STR && v->len == strlen(s) && memcmp(v->s, s, v->len) == 0;
}

// BINPERSID: only ('storage', <storage type>, key, location, numel)
static inline int pt__op_persid(Pt__Pickle *P) {
    int k;
    if (pt__pop(P, &k)) return -1;
    const Pt__Val *t = pt__val(P, k);
    int ok = t->type == PV_TUPLE && t->n == 5 && pt__is_str(pt__val(P, t->items[0]), "storage");
    if (ok) {
        const Pt__Val *ty = pt__val(P, t->items[1]), *num = pt__val(P, t->items[4]);
        ok = ty->type == PV_GLOBAL && pt__globals[ty->i].kind == PG_STORAGE && pt__val(P, t->items[2])->type == PV_STR &&
             pt__val(P, t->items[3])->type == PV_STR && num->type == PV_INT && num->i >= 0;
    }
    if (!ok) { pt__perr(P, "refused: a persistent id that is not ('storage', type, key, location, numel)"); return -1; }
    return pt__push_new(P, PV_STORAGE, k);
}

static inline int pt__op_put(Pt__Pickle *P, uint32_t idx) {
    int k;
    if (idx >= PT_MAX_MEMO) { pt__perr(P, "memo index %u is over the limit of %d", idx, PT_MAX_MEMO); return -1; }
    if (pt__top(P, &k)) return -1;
    if ((int)idx >= P->nmemo) {
        int n = P->nmemo ? P->nmemo : 64;
        while (n <= (int)idx) n *= 2;
        int *m = (int *)realloc(P->memo, (size_t)n * sizeof *m);
        if (!m) { pt__perr(P, "out of memory"); return -1; }
        for (int j = P->nmemo; j < n; j++) m[j] = -1;
        P->memo = m;
        P->nmemo = n;
    }
    P->memo[idx] = k;
    return 0;
}

static inline int pt__op_get(Pt__Pickle *P, uint32_t idx) {
    if (idx >= (uint32_t)P->nmemo || P->memo[idx] < 0) { pt__perr(P, "memo index %u is not set", idx); return -1; }
    return pt__push(P, P->memo[idx]);
}

// LONG1: n bytes of two's complement, little-endian; more than 8 do not fit
static inline int pt__op_long1(Pt__Pickle *P) {
    if (pt__need(P, 1)) return -1;
    size_t n = P->b[P->pos++];
    if (pt__need(P, n)) return -1;
    if (n > 8) { pt__perr(P, "refused: an integer of %zu bytes", n); return -1; }
    uint64_t u = 0;
    for (size_t j = 0; j < n; j++) u |= (uint64_t)P->b[P->pos + j] << (8 * j);
    if (n && n < 8 && (P->b[P->pos + n - 1] & 0x80)) u |= ~0ULL << (8 * n); // sign-extend
    P->pos += n;
    int64_t i;
    memcpy(&i, &u, 8);
    return pt__push_new(P, PV_INT, i);
}

static inline int pt__op_unicode(Pt__Pickle *P) {
    if (pt__need(P, 4)) return -1;
    uint32_t n = st__le32(P->b + P->pos);
    P->pos += 4;
    if (pt__need(P, n)) return -1;
    if (!pt__utf8(P->b + P->pos, n)) { pt__perr(P, "a string is not valid UTF-8"); return -1; }
    int k = pt__new(P, PV_STR);
    if (k < 0) return -1;
    P->v[k].s = P->b + P->pos;
    P->v[k].len = n;
    P->pos += n;
    return pt__push(P, k);
}

// an opcode's fixed-size little-endian argument of n bytes (1, 2 or 4)
static inline int pt__arg(Pt__Pickle *P, size_t n, uint32_t *out) {
    if (pt__need(P, n)) return -1;
    const unsigned char *p = P->b + P->pos;
    *out = n == 1 ? p[0] : n == 2 ? st__le16(p) : st__le32(p);
    P->pos += n;
    return 0;
}

// one opcode; *done when it was STOP
static inline int pt__step(Pt__Pickle *P, int *done) {
    uint32_t a;
    int from;
    P->op = P->pos;
    unsigned char op = P->b[P->pos++];
    switch (op) {
    case 0x80: // PROTO
        if (pt__arg(P, 1, &a)) return -1;
        if (a < 2 || a > 5) { pt__perr(P, "refused: pickle protocol %u (torch.save writes 2)", a); return -1; }
        return 0;
    case '.': *done = 1; return 0; // STOP
    case 'c': return pt__op_global(P);
    case 'R': return pt__op_reduce(P);
    case 'b': return pt__op_build(P);
    case '(': // MARK
        if (P->nm == PT_MAX_MARKS) { pt__perr(P, "MARKs nested deeper than %d", PT_MAX_MARKS); return -1; }
        P->marks[P->nm++] = P->ns;
        return 0;
    case 't': return pt__pop_mark(P, &from) ? -1 : pt__tuple(P, P->ns - from); // TUPLE (the frame is the tuple)
    case ')': return pt__tuple(P, 0);  // EMPTY_TUPLE
    case 0x85: return pt__tuple(P, 1); // TUPLE1
    case 0x86: return pt__tuple(P, 2); // TUPLE2
    case 0x87: return pt__tuple(P, 3); // TUPLE3
    case '}': return pt__push_new(P, PV_DICT, 0); // EMPTY_DICT
    case 's': return pt__op_setitem(P);
    case 'u': return pt__pop_mark(P, &from) ? -1 : pt__op_setitems(P, from); // SETITEMS
    case 'N': return pt__push_new(P, PV_NONE, 0);
    case 0x88: return pt__push_new(P, PV_BOOL, 1); // NEWTRUE
    case 0x89: return pt__push_new(P, PV_BOOL, 0); // NEWFALSE
    case 'J': return pt__arg(P, 4, &a) ? -1 : pt__push_new(P, PV_INT, (int32_t)a); // BININT (signed)
    case 'K': return pt__arg(P, 1, &a) ? -1 : pt__push_new(P, PV_INT, a);          // BININT1
    case 'M': return pt__arg(P, 2, &a) ? -1 : pt__push_new(P, PV_INT, a);          // BININT2
    case 0x8a: return pt__op_long1(P);
    case 'X': return pt__op_unicode(P); // BINUNICODE
    case 'Q': return pt__op_persid(P);  // BINPERSID
    case 'h': return pt__arg(P, 1, &a) ? -1 : pt__op_get(P, a); // BINGET
    case 'j': return pt__arg(P, 4, &a) ? -1 : pt__op_get(P, a); // LONG_BINGET
    case 'q': return pt__arg(P, 1, &a) ? -1 : pt__op_put(P, a); // BINPUT
    case 'r': return pt__arg(P, 4, &a) ? -1 : pt__op_put(P, a); // LONG_BINPUT
    default:
        pt__perr(P, "refused: pickle opcode 0x%02x is not one torch.save writes for a state_dict", op);
        return -1;
    }
}

// runs data.pkl to its STOP; *root: the dict it leaves on top
static inline int pt__run(Pt__Pickle *P, int *root) {
    int done = 0;
    while (!done) {
        if (P->pos == P->len) { P->op = P->pos; pt__perr(P, "data.pkl ends before its STOP opcode: truncated?"); return -1; }
        if (pt__step(P, &done)) return -1;
    }
    if (pt__pop(P, root)) return -1;
    int t = pt__val(P, *root)->type;
    if (t != PV_DICT && t != PV_ODICT) { pt__perr(P, "refused: data.pkl holds a value of type %s, expected a dict of tensors", pt__type_names[t]); return -1; }
    return 0;
}

static inline void pt__pickle_free(Pt__Pickle *P) {
    for (int k = 0; k < P->nv; k++) free(P->v[k].items);
    free(P->v);
    free(P->stack);
    free(P->memo);
}

// ----------------------------------------------------------------------------
// the tensors: each dict entry checked against its storage's record

// a tuple of at most ST_MAX_DIMS ints (>= 0 unless signed_ok) into out; its length, -1 if not such a tuple
static inline int pt__ints(Pt__Pickle *P, int k, int64_t *out, int signed_ok) {
    const Pt__Val *t = pt__val(P, k);
    if (t->type != PV_TUPLE || t->n > ST_MAX_DIMS) return -1;
    for (int d = 0; d < t->n; d++) {
        const Pt__Val *x = pt__val(P, t->items[d]);
        if (x->type != PV_INT || (!signed_ok && x->i < 0)) return -1;
        out[d] = x->i;
    }
    return t->n;
}

// size and stride: C order (a dimension of size 1 may have any stride); numel without overflow
static inline int pt__shape(Pt__Pickle *P, const char *name, const Pt__Val *args, StTensor *t) {
    int64_t stride[ST_MAX_DIMS];
    t->ndim = pt__ints(P, args->items[2], t->shape, 0);
    if (t->ndim < 0) { st__err(P->path, name, "size is not a tuple of at most %d non-negative integers", ST_MAX_DIMS); return -1; }
    if (pt__ints(P, args->items[3], stride, 1) != t->ndim) { st__err(P->path, name, "stride is not a tuple of %d integers", t->ndim); return -1; }
    char shp[200], str[200];
    st_format_shape(t->shape, t->ndim, shp, sizeof shp);
    st_format_shape(stride, t->ndim, str, sizeof str);
    uint64_t numel = 1;
    for (int d = 0; d < t->ndim; d++)
        numel = t->shape[d] == 0 || numel == 0 ? 0 : numel > UINT64_MAX / (uint64_t)t->shape[d] ? UINT64_MAX : numel * (uint64_t)t->shape[d];
    if (numel == UINT64_MAX) { st__err(P->path, name, "size %s overflows: too many elements", shp); return -1; }
    uint64_t expect = 1; // (at most numel: no overflow)
    for (int d = t->ndim - 1; d >= 0 && numel; d--) {
        if (t->shape[d] != 1 && (uint64_t)stride[d] != expect) {
            st__err(P->path, name, "is not contiguous (size %s, stride %s): save it with .contiguous()", shp, str);
            return -1;
        }
        expect *= (uint64_t)t->shape[d];
    }
    t->numel = numel;
    return 0;
}

// the storage's record: found, the size its numel says, and read with one dtype and numel
// by every tensor on it (tied weights share a storage); *data: where its bytes start
static inline int pt__storage(Pt__Zip *z, Pt__Pickle *P, const char *name, const Pt__Val *pid, uint64_t *data) {
    const Pt__Val *key = pt__val(P, pid->items[2]);
    int type = (int)pt__val(P, pid->items[1])->i;
    uint64_t numel = (uint64_t)pt__val(P, pid->items[4])->i, es = (uint64_t)st_dtype_size(pt__globals[type].dtype);
    char *rec = pt__record_name(z, "data/", (const char *)key->s, key->len), q[160];
    if (!rec) { st__err(P->path, name, "out of memory"); return -1; }
    Pt__Entry *e = strlen(rec) == strlen(z->prefix) + 5 + key->len ? pt__find(z, rec) : NULL;
    if (!e) { st__err(P->path, name, "its storage has no record '%s' in the archive", st__quote(rec, q, sizeof q)); free(rec); return -1; }
    free(rec);
    if (pt__entry_data(z, e)) return -1;
    if (e->storage_type >= 0 && (e->storage_type != type || e->storage_numel != numel)) {
        st__err(P->path, name, "its storage '%s' is declared twice, as %llu of torch.%s and %llu of torch.%s", st__quote(e->name, q, sizeof q),
                (unsigned long long)e->storage_numel, pt__globals[e->storage_type].name, (unsigned long long)numel, pt__globals[type].name);
        return -1;
    }
    if (e->size % es || e->size / es != numel) {
        st__err(P->path, name, "its storage '%s' is %llu bytes, but holds %llu elements of torch.%s", st__quote(e->name, q, sizeof q),
                (unsigned long long)e->size, (unsigned long long)numel, pt__globals[type].name);
        return -1;
    }
    e->storage_type = type;
    e->storage_numel = numel;
    *data = e->data;
    return 0;
}

// one named tensor from its _rebuild_tensor_v2 arguments (storage, storage_offset, size, stride, ...)
static inline int pt__tensor(Pt__Zip *z, Pt__Pickle *P, const char *name, const Pt__Val *args, StTensor *t) {
    const Pt__Val *pid = pt__val(P, pt__val(P, args->items[0])->i), *off = pt__val(P, args->items[1]);
    const Pt__Global *g = &pt__globals[pt__val(P, pid->items[1])->i];
    uint64_t snumel = (uint64_t)pt__val(P, pid->items[4])->i, data;
    if (g->dtype == ST_NDTYPES) { st__err(P->path, name, "dtype torch.%s is not supported (F32, F16 and BF16 are)", g->name); return -1; }
    t->dtype = g->dtype;
    if (off->type != PV_INT || off->i < 0) { st__err(P->path, name, "storage_offset is not a non-negative integer"); return -1; }
    if (pt__shape(P, name, args, t)) return -1;
    if ((uint64_t)off->i > snumel || t->numel > snumel - (uint64_t)off->i) {
        st__err(P->path, name, "elements [%lld, %lld + %llu) lie outside its storage of %llu", (long long)off->i, (long long)off->i,
                (unsigned long long)t->numel, (unsigned long long)snumel);
        return -1;
    }
    if (pt__storage(z, P, name, pid, &data)) return -1;
    uint64_t es = (uint64_t)st_dtype_size(t->dtype);
    t->begin = data + (uint64_t)off->i * es;
    t->end = t->begin + t->numel * es;
    return 0;
}

// the root dict's entries into sf->tensors, sorted by name; a key twice is refused
// (torch would keep the last one silently)
static inline int pt__collect(Pt__Zip *z, Pt__Pickle *P, int root, StFile *sf) {
    const Pt__Val *d = pt__val(P, root);
    sf->tensors = (StTensor *)calloc(d->n ? (size_t)d->n / 2 : 1, sizeof(StTensor));
    if (!sf->tensors) { st__err(P->path, NULL, "out of memory"); return -1; }
    for (int j = 0; j < d->n; j += 2) {
        const Pt__Val *key = pt__val(P, d->items[j]), *val = pt__val(P, d->items[j + 1]);
        if (key->type != PV_STR) { st__err(P->path, NULL, "refused: a state_dict key of type %s, expected a str", pt__type_names[key->type]); return -1; }
        StTensor *t = &sf->tensors[sf->n_tensors];
        t->name = (char *)malloc((size_t)key->len + 1);
        if (!t->name) { st__err(P->path, NULL, "out of memory"); return -1; }
        memcpy(t->name, key->s, key->len);
        t->name[key->len] = 0;
        sf->n_tensors++;
        if (strlen(t->name) != key->len) { st__err(P->path, NULL, "a tensor name contains a NUL character"); return -1; }
        if (val->type != PV_TENSOR) { st__err(P->path, t->name, "refused: its value is of type %s, expected a tensor", pt__type_names[val->type]); return -1; }
        if (pt__tensor(z, P, t->name, pt__val(P, val->i), t)) return -1;
    }
    qsort(sf->tensors, (size_t)sf->n_tensors, sizeof(StTensor), st__cmp_name);
    for (int j = 1; j < sf->n_tensors; j++)
        if (strcmp(sf->tensors[j - 1].name, sf->tensors[j].name) == 0) {
            st__err(P->path, sf->tensors[j].name, "is in the state dict twice");
            return -1;
        }
    return 0;
}

// ----------------------------------------------------------------------------
// entry points

// the archive in src into sf (sf->f is left to the caller)
static inline int pt__parse(StFile *sf, const Pt__Src *src) {
    Pt__Zip z;
    Pt__Pickle P;
    memset(&z, 0, sizeof z);
    memset(&P, 0, sizeof P);
    memset(sf, 0, sizeof *sf);
    z.src = *src;
    P.path = src->path;
    Pt__Entry *e = NULL;
    unsigned char *pkl = NULL;
    int root, rc = -1;
    sf->path = st__strdup(src->path);
    if (!sf->path) st__err(src->path, NULL, "out of memory");
    else if (pt__read_cd(&z) == 0 && pt__byteorder(&z) == 0) {
        pkl = pt__record(&z, "data.pkl", PT_MAX_PKL, &e);
        if (!pkl && !e) st__err(src->path, NULL, "no %sdata.pkl in the archive: not a torch.save file", z.prefix);
    }
    if (pkl) {
        P.b = pkl;
        P.len = (size_t)e->size;
        rc = pt__run(&P, &root) || pt__collect(&z, &P, root, sf) ? -1 : 0;
    }
    free(pkl);
    pt__pickle_free(&P);
    pt__zip_free(&z);
    sf->file_size = src->size;
    sf->metadata.type = JSON_OBJECT; // torch.save has no metadata: an empty object, as safetensors.h gives
    if (rc) st_close(sf);
    return rc;
}

// The pure parser (also the fuzzing entry point): a torch.save file's bytes in memory,
// named path in messages. 0 ok (free with st_close; sf->f is NULL), -1 (sf is left empty).
static inline int pt_parse_bytes(StFile *sf, const char *path, const unsigned char *data, size_t size) {
    Pt__Src src = {path, NULL, data, size};
    return pt__parse(sf, &src);
}

// Opens and validates path, a torch.save file. 0 ok (read it with st_read_f32, free with
// st_close), -1 with a message on stderr. Reads the archive's directory, local headers,
// byteorder and data.pkl only.
static inline int pt_open(StFile *sf, const char *path) {
    memset(sf, 0, sizeof *sf);
    uint64_t size;
    FILE *f = st__open_regular(path, &size);
    if (!f) return -1;
    Pt__Src src = {path, f, NULL, size};
    if (pt__parse(sf, &src)) { fclose(f); return -1; }
    sf->f = f;
    return 0;
}

#endif // TORCH_ZIP_H
