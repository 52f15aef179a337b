// tokenizer.h: a single-header SentencePiece BPE tokenizer (C99, also compiles
// as C++/CUDA). It reads a sentencepiece `tokenizer.model` (a serialized
// protobuf ModelProto) directly and encodes/decodes exactly like the
// sentencepiece library does for Llama-2-style models:
//   model_type BPE, byte_fallback, identity normalization (no charsmap),
//   add_dummy_prefix on or off, remove_extra_whitespaces on or off,
//   pieces of type NORMAL / UNKNOWN / CONTROL / USER_DEFINED / UNUSED / BYTE.
// Models it cannot reproduce exactly (unigram/word/char models, a
// normalization rule other than identity, treat_whitespace_as_suffix,
// escape_whitespaces=false, a denormalizer) are refused with a message.
//
// The behaviour follows sentencepiece's normalizer.cc (Normalize),
// bpe_model.cc (SampleEncode without dropout), model_interface.cc
// (InitializePieces) and sentencepiece_processor.cc (Encode/Decode).
//
// Every byte of the model file is untrusted: all reads are bounds-checked,
// counts and lengths are limited before anything is allocated, and
// tokenizer_load_from_memory is the single function that parses.
//
// Usage:
//   Tokenizer tok;
//   if (tokenizer_load(&tok, "tokenizer.model") != 0) exit(1);
//   int n; int *ids = tokenizer_encode(&tok, text, strlen(text), 1, 0, &n);
//   size_t len; char *s = tokenizer_decode(&tok, ids, n, &len);
//   free(ids); free(s); tokenizer_free(&tok);
#ifndef TOKENIZER_H
#define TOKENIZER_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <errno.h>
#include <sys/stat.h> // fstat: the file size is checked before reading (POSIX, like fileno)

// Limits on what a model file may claim. Llama-2 has 32000 pieces of at most
// 16 bytes (48 with the ▁ encoding); these leave plenty of room.
#define TOKENIZER_MAX_PIECES (1 << 21)
#define TOKENIZER_MAX_PIECE_LEN 2048
#define TOKENIZER_MAX_FILE_SIZE ((size_t)1 << 28)   // 256 MiB
#define TOKENIZER_MAX_PB_DEPTH 64                   // nesting of protobuf groups
// encode keeps positions in ints: the normalized text (up to 3x the input) must fit
#define TOKENIZER_MAX_TEXT ((size_t)1 << 29)

// sentencepiece's ModelProto.SentencePiece.Type
enum { TOK_NORMAL = 1, TOK_UNKNOWN = 2, TOK_CONTROL = 3, TOK_USER_DEFINED = 4, TOK_UNUSED = 5, TOK_BYTE = 6 };

// one slot of the open-addressing hash table from piece string to id.
// sentencepiece keeps two maps: "pieces_" (NORMAL, USER_DEFINED, UNUSED: the
// ones BPE may merge into) and "reserved" (UNKNOWN, CONTROL, BYTE). The same
// string may appear once in each, so a slot holds one id of each kind.
typedef struct {
    uint32_t hash;
    int len;          // the key, kept here so a lookup touches one cache line
    const char *str;  // (points into Tokenizer.strings)
    int normal;       // id in pieces_, or -1
    int reserved;     // id in the reserved map, or -1
} TokSlot;

typedef struct {
    int vocab_size;
    int bos_id, eos_id, unk_id, pad_id; // as sentencepiece's bos_id() etc.: -1 when the model has none
    // --- internals ---
    char *strings;          // all piece strings, each NUL-terminated
    char **pieces;          // pieces[id] points into strings
    int *piece_len;         // byte length (a piece may contain NUL; pieces[id] is then cut short as a C string)
    float *scores;
    uint32_t *rank;         // position of each score in descending order (equal scores, equal rank)
    unsigned char *types;   // TOK_*
    int *canon;             // PieceToId(pieces[id]): a reserved piece shadows a normal one with the same string
    int *unused_slot;       // per id: index among UNUSED pieces, or -1
    int n_unused;
    short *byte_of;         // per id: the byte a BYTE piece stands for, or -1
    int byte_ids[256];      // id of piece <0xXX>, or -1 (all present when byte_fallback)
    int unk_internal;       // the UNKNOWN piece: what unknown symbols map to
    int max_normal_len;     // longest piece in pieces_: longer candidate merges need no lookup
    TokSlot *table; size_t table_mask;
    // proper prefixes and suffixes (1-4 bytes) of the pieces in pieces_, as
    // packed keys: a character that is none of these can never be merged, so
    // encode may run BPE separately on the stretches between such characters
    uint64_t *edges; size_t edges_mask;
    // user-defined symbols are matched longest-first and never merged
    unsigned char ud_first[256]; // 1 if some user-defined piece starts with this byte
    int *ud_lens; int n_ud_lens; // distinct lengths of user-defined pieces, descending
    int add_dummy_prefix, remove_extra_whitespaces, byte_fallback;
    int legacy;             // tokenizer_config.json's "legacy" (set by the data loader): text after a special token gets the dummy prefix too
    char *unk_surface; size_t unk_surface_len; // what decode prints for <unk> (" ⁇ " by default)
} Tokenizer;

// ----------------------------------------------------------------------------
// small helpers

static inline uint32_t tok_hash(const char *s, size_t n) {
    uint32_t h = 2166136261u; // FNV-1a: piece strings are short, this is plenty fast
    for (size_t i = 0; i < n; i++) { h ^= (unsigned char)s[i]; h *= 16777619u; }
    return h;
}

// the slot holding string s, or NULL. The table always has empty slots, so this ends.
static inline const TokSlot *tok_find(const Tokenizer *t, const char *s, size_t n) {
    uint32_t h = tok_hash(s, n);
    for (size_t i = h & t->table_mask;; i = (i + 1) & t->table_mask) {
        const TokSlot *e = &t->table[i];
        if (e->normal < 0 && e->reserved < 0) return NULL;
        if (e->hash == h && (size_t)e->len == n && memcmp(e->str, s, n) == 0) return e;
    }
}

// sentencepiece's PieceToId: reserved map first, then pieces_, else <unk>
static inline int tok_piece_to_id(const Tokenizer *t, const char *s, size_t n) {
    const TokSlot *e = tok_find(t, s, n);
    if (!e) return t->unk_internal;
    return e->reserved >= 0 ? e->reserved : e->normal;
}

// the id of a piece given by its exact string (a control token such as "</s>" included), -1 if there is none
static inline int tokenizer_token_id(const Tokenizer *t, const char *s) {
    const TokSlot *e = tok_find(t, s, strlen(s));
    return !e ? -1 : e->reserved >= 0 ? e->reserved : e->normal;
}

// 1-4 bytes packed with their length into a nonzero key for the edges set
static inline uint64_t tok_edge_key(const char *s, int n) {
    uint64_t k = (uint64_t)n << 32;
    for (int i = 0; i < n; i++) k |= (uint64_t)(unsigned char)s[i] << (8 * i);
    return k;
}

static inline size_t tok_edge_slot(uint64_t k, size_t mask) {
    return (size_t)((k * 0x9E3779B97F4A7C15ull) >> 29) & mask;
}

// could the symbol s[0..n) ever be merged with a neighbour?
static inline int tok_mergeable(const Tokenizer *t, const char *s, int n) {
    if (n > 4) return 1; // (initial symbols longer than 4 bytes are user-defined, never passed here)
    uint64_t k = tok_edge_key(s, n);
    for (size_t i = tok_edge_slot(k, t->edges_mask);; i = (i + 1) & t->edges_mask) {
        if (t->edges[i] == k) return 1;
        if (t->edges[i] == 0) return 0;
    }
}

// sentencepiece's string_util::DecodeUTF8 validity check: returns 1 and the
// length of the valid UTF-8 character at s, or 0 (with *mblen = 1) if malformed.
// Overlong forms, surrogates and code points above U+10FFFF are malformed.
static inline int tok_utf8_valid(const unsigned char *s, size_t n, size_t *mblen) {
    *mblen = 1;
    if (s[0] < 0x80) return 1;
    uint32_t cp;
    if (n >= 2 && (s[0] & 0xE0) == 0xC0) {
        cp = ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
        if ((s[1] & 0xC0) == 0x80 && cp >= 0x80) { *mblen = 2; return 1; }
    } else if (n >= 3 && (s[0] & 0xF0) == 0xE0) {
        cp = ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
        if ((s[1] & 0xC0) == 0x80 && (s[2] & 0xC0) == 0x80 && cp >= 0x800 && (cp < 0xD800 || cp >= 0xE000)) {
            *mblen = 3; return 1;
        }
    } else if (n >= 4 && (s[0] & 0xF8) == 0xF0) {
        cp = ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
             ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
        if ((s[1] & 0xC0) == 0x80 && (s[2] & 0xC0) == 0x80 && (s[3] & 0xC0) == 0x80 &&
            cp >= 0x10000 && cp <= 0x10FFFF) { *mblen = 4; return 1; }
    }
    return 0;
}

// length of the longest user-defined piece that is a prefix of s[0..n), or 0
static inline size_t tok_match_user_defined(const Tokenizer *t, const char *s, size_t n) {
    if (t->n_ud_lens == 0 || n == 0 || !t->ud_first[(unsigned char)s[0]]) return 0;
    for (int k = 0; k < t->n_ud_lens; k++) { // descending, so the first hit is the longest
        size_t l = (size_t)t->ud_lens[k];
        if (l > n) continue;
        const TokSlot *e = tok_find(t, s, l);
        if (e && e->normal >= 0 && t->types[e->normal] == TOK_USER_DEFINED) return l;
    }
    return 0;
}

// ----------------------------------------------------------------------------
// protobuf wire format reader. Only what ModelProto needs: varints (wire type 0),
// fixed32 (5) for scores, length-delimited (2) for strings and sub-messages;
// fixed64 (1) and groups (3/4) are skipped like any unknown field.

typedef struct { const unsigned char *p, *end; } TokPB;
typedef struct { uint32_t num; int wire; uint64_t val; const unsigned char *data; size_t len; } TokField;

static inline int tok_pb_varint(TokPB *r, uint64_t *out) {
    uint64_t x = 0;
    for (int shift = 0; shift < 70; shift += 7) { // at most 10 bytes
        if (r->p >= r->end) return -1;
        unsigned char b = *r->p++;
        x |= (uint64_t)(b & 0x7F) << shift; // bits past 64 fall off, as in protobuf
        if (!(b & 0x80)) { *out = x; return 0; }
    }
    return -1;
}

static inline int tok_pb_value(TokPB *r, TokField *f, int depth);

// reads a field tag; 0 ok, -1 malformed
static inline int tok_pb_tag(TokPB *r, TokField *f) {
    uint64_t tag;
    if (tok_pb_varint(r, &tag) != 0 || tag > 0xFFFFFFFFu) return -1;
    f->num = (uint32_t)(tag >> 3);
    f->wire = (int)(tag & 7);
    if (f->num == 0 || f->wire > 5) return -1; // field 0 and wire types 6, 7 don't exist
    return 0;
}

// skips the rest of a group started by field `num` (up to its end-group tag)
static inline int tok_pb_skip_group(TokPB *r, uint32_t num, int depth) {
    if (depth >= TOKENIZER_MAX_PB_DEPTH) return -1;
    for (;;) {
        TokField f;
        if (r->p >= r->end || tok_pb_tag(r, &f) != 0) return -1; // unterminated group
        if (f.wire == 4) return f.num == num ? 0 : -1;
        if (tok_pb_value(r, &f, depth + 1) != 0) return -1;
    }
}

// reads (or skips) the value of a field whose tag was just read
static inline int tok_pb_value(TokPB *r, TokField *f, int depth) {
    size_t left = (size_t)(r->end - r->p);
    f->val = 0; f->data = NULL; f->len = 0;
    switch (f->wire) {
    case 0: return tok_pb_varint(r, &f->val);
    case 1: if (left < 8) return -1; r->p += 8; return 0;
    case 2: {
        uint64_t n;
        if (tok_pb_varint(r, &n) != 0) return -1;
        if (n > (uint64_t)(size_t)(r->end - r->p)) return -1; // claims more bytes than there are
        f->data = r->p; f->len = (size_t)n; r->p += n;
        return 0;
    }
    case 3: return tok_pb_skip_group(r, f->num, depth);
    case 5: {
        if (left < 4) return -1;
        f->val = (uint64_t)r->p[0] | ((uint64_t)r->p[1] << 8) | ((uint64_t)r->p[2] << 16) | ((uint64_t)r->p[3] << 24);
        r->p += 4;
        return 0;
    }
    default: return -1; // an end-group tag (4) with no group open
    }
}

// next field of a message: 1 read, 0 end of message, -1 malformed
static inline int tok_pb_next(TokPB *r, TokField *f) {
    if (r->p >= r->end) return 0;
    if (tok_pb_tag(r, f) != 0 || tok_pb_value(r, f, 0) != 0) return -1;
    return 1;
}

// proto2 enums: a value outside the enum is kept as an unknown field, leaving
// the field unchanged, so only accept known values (int32 truncation as protobuf)
static inline void tok_pb_enum(const TokField *f, int lo, int hi, int *out) {
    int32_t v = (int32_t)(uint32_t)f->val;
    if (v >= lo && v <= hi) *out = v;
}

// the parts of TrainerSpec / NormalizerSpec that change how we tokenize
typedef struct {
    int model_type;                // 1 UNIGRAM (the default!), 2 BPE, 3 WORD, 4 CHAR
    int treat_whitespace_as_suffix, byte_fallback;
    const unsigned char *unk_surface; size_t unk_surface_len;
    const unsigned char *name[4]; size_t name_len[4]; // unk, bos, eos, pad piece strings
    int add_dummy_prefix, remove_extra_whitespaces, escape_whitespaces;
    const unsigned char *rule; size_t rule_len; int has_rule;
    size_t charsmap_len, denorm_charsmap_len;
} TokSpec;

// a sub-message may occur several times: protobuf merges them, so these parse
// into the same struct without resetting it
static inline int tok_parse_trainer_spec(TokSpec *s, const unsigned char *data, size_t len) {
    TokPB r; r.p = data; r.end = data + len;
    TokField f; int rc;
    while ((rc = tok_pb_next(&r, &f)) > 0) {
        if (f.wire == 0) {
            if (f.num == 3) tok_pb_enum(&f, 1, 4, &s->model_type);
            else if (f.num == 24) s->treat_whitespace_as_suffix = f.val != 0;
            else if (f.num == 35) s->byte_fallback = f.val != 0;
        } else if (f.wire == 2) {
            if (f.num == 44) { s->unk_surface = f.data; s->unk_surface_len = f.len; }
            else if (f.num >= 45 && f.num <= 48) { s->name[f.num - 45] = f.data; s->name_len[f.num - 45] = f.len; }
        }
    }
    return rc;
}

static inline int tok_parse_normalizer_spec(TokSpec *s, const unsigned char *data, size_t len, int denorm) {
    TokPB r; r.p = data; r.end = data + len;
    TokField f; int rc;
    while ((rc = tok_pb_next(&r, &f)) > 0) {
        if (f.wire == 2 && f.num == 2) { if (denorm) s->denorm_charsmap_len = f.len; else s->charsmap_len = f.len; }
        if (denorm) continue; // only a denormalizer's charsmap changes anything
        if (f.wire == 2 && f.num == 1) { s->rule = f.data; s->rule_len = f.len; s->has_rule = 1; }
        else if (f.wire == 0 && f.num == 3) s->add_dummy_prefix = f.val != 0;
        else if (f.wire == 0 && f.num == 4) s->remove_extra_whitespaces = f.val != 0;
        else if (f.wire == 0 && f.num == 5) s->escape_whitespaces = f.val != 0;
    }
    return rc;
}

// one ModelProto.SentencePiece
static inline int tok_parse_piece(const unsigned char *data, size_t len, const unsigned char **str,
                                  size_t *str_len, float *score, int *type) {
    TokPB r; r.p = data; r.end = data + len;
    TokField f; int rc;
    *str = NULL; *str_len = 0; *score = 0.0f; *type = TOK_NORMAL;
    while ((rc = tok_pb_next(&r, &f)) > 0) {
        if (f.num == 1 && f.wire == 2) { *str = f.data; *str_len = f.len; }
        else if (f.num == 2 && f.wire == 5) { uint32_t u = (uint32_t)f.val; memcpy(score, &u, 4); }
        else if (f.num == 3 && f.wire == 0) tok_pb_enum(&f, 1, 6, type);
    }
    return rc;
}

// ----------------------------------------------------------------------------
// loading

static inline void tokenizer_free(Tokenizer *t) {
    if (!t) return;
    free(t->strings); free(t->pieces); free(t->piece_len); free(t->scores); free(t->rank); free(t->types);
    free(t->canon); free(t->unused_slot); free(t->byte_of); free(t->table); free(t->ud_lens); free(t->edges);
    free(t->unk_surface);
    memset(t, 0, sizeof(*t));
    t->bos_id = t->eos_id = t->unk_id = t->pad_id = -1;
}

// writes s into buf for an error message: printable ASCII as is, the rest as \xNN, cut at 40 bytes
static inline const char *tok_quote(char *buf, const char *s, size_t n) {
    size_t o = 0;
    for (size_t i = 0; i < n && i < 40; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7F) buf[o++] = (char)c;
        else o += (size_t)snprintf(buf + o, 5, "\\x%02X", c);
    }
    if (n > 40) { memcpy(buf + o, "...", 3); o += 3; }
    buf[o] = 0;
    return buf;
}

typedef struct { float score; int id; } TokScoreId;

// higher score first; NaN (only in a broken model) after everything
static inline int tok_cmp_score_desc(const void *pa, const void *pb) {
    float a = ((const TokScoreId *)pa)->score, b = ((const TokScoreId *)pb)->score;
    int na = a != a, nb = b != b;
    if (na || nb) return na - nb;
    return a > b ? -1 : a < b ? 1 : 0;
}

static inline int tok_hex_digit(unsigned char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

// id of a special piece named in trainer_spec, as sentencepiece's bos_id() etc.:
// the piece must exist and have the expected type, else -1
static inline int tok_special_id(const Tokenizer *t, const unsigned char *name, size_t n, int type) {
    int id = tok_piece_to_id(t, (const char *)name, n);
    return (id >= 0 && t->types[id] == type) ? id : -1;
}

// is a piece of this type in sentencepiece's pieces_ map (the ones BPE may merge into)?
// UNKNOWN, CONTROL and BYTE pieces are in the reserved map instead
static inline int tok_type_is_normal(int type) { return type == TOK_NORMAL || type == TOK_USER_DEFINED || type == TOK_UNUSED; }

// pass 1: walks ModelProto, counts the pieces and reads the specs over sentencepiece's defaults
static inline int tok_read_spec(TokSpec *spec, size_t *n_pieces, const unsigned char *data, size_t len, char *err, size_t errn) {
    memset(spec, 0, sizeof(*spec));
    spec->model_type = 1;
    spec->add_dummy_prefix = spec->remove_extra_whitespaces = spec->escape_whitespaces = 1;
    spec->unk_surface = (const unsigned char *)" \xE2\x81\x87 "; spec->unk_surface_len = 5;
    static const char *const default_names[4] = {"<unk>", "<s>", "</s>", "<pad>"};
    for (int k = 0; k < 4; k++) { spec->name[k] = (const unsigned char *)default_names[k]; spec->name_len[k] = strlen(default_names[k]); }
    *n_pieces = 0;
    TokPB r; r.p = data; r.end = data + len;
    TokField f; int rc;
    while ((rc = tok_pb_next(&r, &f)) > 0) {
        if (f.wire != 2) continue;
        if (f.num == 1) {
            if (++*n_pieces > TOKENIZER_MAX_PIECES) {
                snprintf(err, errn, "more than %d pieces; not a tokenizer this code supports", TOKENIZER_MAX_PIECES);
                return -1;
            }
        } else if (f.num == 2) rc = tok_parse_trainer_spec(spec, f.data, f.len);
        else if (f.num == 3) rc = tok_parse_normalizer_spec(spec, f.data, f.len, 0);
        else if (f.num == 5) rc = tok_parse_normalizer_spec(spec, f.data, f.len, 1);
        if (rc < 0) break;
    }
    if (rc < 0) {
        snprintf(err, errn, "not a valid sentencepiece model (malformed or truncated protobuf near byte %zu of %zu)",
                 (size_t)(r.p - data), len);
        return -1;
    }
    return 0;
}

// refuses a model this code cannot reproduce exactly
static inline int tok_check_spec(const TokSpec *spec, size_t n_pieces, char *err, size_t errn) {
    char q[200];
    static const char *const model_types[5] = {"?", "UNIGRAM", "BPE", "WORD", "CHAR"};
    if (spec->model_type != 2) {
        snprintf(err, errn, "model_type is %s; only BPE models (like Llama-2's) are supported", model_types[spec->model_type]);
        return -1;
    }
    if (spec->has_rule && !(spec->rule_len == 8 && memcmp(spec->rule, "identity", 8) == 0)) {
        snprintf(err, errn, "normalization rule '%s' is not supported (only 'identity', as Llama-2 uses)",
                 tok_quote(q, (const char *)spec->rule, spec->rule_len));
        return -1;
    }
    if (spec->charsmap_len > 0) {
        snprintf(err, errn, "normalizer has a %zu-byte precompiled_charsmap; only identity normalization (none) is supported",
                 spec->charsmap_len);
        return -1;
    }
    if (spec->denorm_charsmap_len > 0) { snprintf(err, errn, "a denormalizer is not supported"); return -1; }
    if (spec->treat_whitespace_as_suffix) { snprintf(err, errn, "treat_whitespace_as_suffix is not supported"); return -1; }
    if (!spec->escape_whitespaces) { snprintf(err, errn, "escape_whitespaces=false is not supported"); return -1; }
    if (n_pieces == 0) { snprintf(err, errn, "model has no pieces"); return -1; }
    return 0;
}

// t's per-piece arrays and empty hash table for n_pieces pieces, and the spec's options.
// The pieces' total size is bounded by the file size len.
static inline int tok_alloc(Tokenizer *t, const TokSpec *spec, size_t n_pieces, size_t len, char *err, size_t errn) {
    t->vocab_size = (int)n_pieces;
    t->pieces = (char **)calloc(n_pieces, sizeof(char *));
    t->piece_len = (int *)calloc(n_pieces, sizeof(int));
    t->scores = (float *)calloc(n_pieces, sizeof(float));
    t->rank = (uint32_t *)calloc(n_pieces, sizeof(uint32_t));
    t->types = (unsigned char *)calloc(n_pieces, 1);
    t->canon = (int *)calloc(n_pieces, sizeof(int));
    t->unused_slot = (int *)calloc(n_pieces, sizeof(int));
    t->byte_of = (short *)calloc(n_pieces, sizeof(short));
    t->strings = (char *)malloc(len + n_pieces); // piece bytes + a NUL each
    size_t table_size = 16;
    while (table_size < 2 * n_pieces) table_size *= 2;
    t->table = (TokSlot *)malloc(table_size * sizeof(TokSlot));
    t->table_mask = table_size - 1;
    t->unk_surface = (char *)malloc(spec->unk_surface_len + 1);
    if (!t->pieces || !t->piece_len || !t->scores || !t->rank || !t->types || !t->canon || !t->unused_slot ||
        !t->byte_of || !t->strings || !t->table || !t->unk_surface) {
        snprintf(err, errn, "out of memory"); return -1;
    }
    memcpy(t->unk_surface, spec->unk_surface, spec->unk_surface_len);
    t->unk_surface[spec->unk_surface_len] = 0;
    t->unk_surface_len = spec->unk_surface_len;
    memset(t->table, 0, table_size * sizeof(TokSlot));
    for (size_t i = 0; i < table_size; i++) t->table[i].normal = t->table[i].reserved = -1;
    for (int b = 0; b < 256; b++) t->byte_ids[b] = -1;
    t->unk_internal = -1;
    t->byte_fallback = spec->byte_fallback;
    t->add_dummy_prefix = spec->add_dummy_prefix;
    t->remove_extra_whitespaces = spec->remove_extra_whitespaces;
    return 0;
}

// BYTE piece id, s[0..sl): which byte it stands for (byte_ids, byte_of)
static inline int tok_add_byte_piece(Tokenizer *t, int id, const unsigned char *s, size_t sl, char *err, size_t errn) {
    char q[200];
    if (!t->byte_fallback) {
        snprintf(err, errn, "byte piece '%s' found although byte_fallback is false", tok_quote(q, (const char *)s, sl));
        return -1;
    }
    // exactly "<0xXX>" with upper-case hex, as sentencepiece's PieceToByte
    int hi = sl == 6 ? tok_hex_digit(s[3]) : -1, lo = sl == 6 ? tok_hex_digit(s[4]) : -1;
    if (hi < 0 || lo < 0 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') {
        snprintf(err, errn, "byte piece '%s' is invalid", tok_quote(q, (const char *)s, sl));
        return -1;
    }
    int b = hi * 16 + lo;
    t->byte_of[id] = (short)b;
    t->byte_ids[b] = id; // unique: byte pieces are reserved, duplicates were refused before
    return 0;
}

// pass 2: the pieces in file order (pass 1 checked the structure) into the arrays and
// the hash table, with the checks of sentencepiece's ModelInterface::InitializePieces
static inline int tok_read_pieces(Tokenizer *t, const unsigned char *data, size_t len, char *err, size_t errn) {
    char q[200];
    size_t used = 0;
    int id = 0;
    TokPB r; r.p = data; r.end = data + len;
    TokField f;
    while (tok_pb_next(&r, &f) > 0) {
        if (f.num != 1 || f.wire != 2) continue;
        const unsigned char *s; size_t sl; float score; int type;
        if (tok_parse_piece(f.data, f.len, &s, &sl, &score, &type) < 0) {
            snprintf(err, errn, "piece %d is malformed", id); return -1;
        }
        if (sl == 0) { snprintf(err, errn, "piece %d is empty", id); return -1; }
        if (sl > TOKENIZER_MAX_PIECE_LEN) {
            snprintf(err, errn, "piece %d is %zu bytes long, more than the %d allowed", id, sl, TOKENIZER_MAX_PIECE_LEN);
            return -1;
        }
        memcpy(t->strings + used, s, sl);
        t->strings[used + sl] = 0;
        t->pieces[id] = t->strings + used;
        used += sl + 1;
        t->piece_len[id] = (int)sl;
        t->scores[id] = score;
        t->types[id] = (unsigned char)type;
        t->byte_of[id] = -1;
        // the string's slot, claimed when no piece before had it; the normal or reserved id in it must be free
        uint32_t h = tok_hash((const char *)s, sl);
        size_t i = h & t->table_mask;
        for (;; i = (i + 1) & t->table_mask) {
            TokSlot *e = &t->table[i];
            if (e->normal < 0 && e->reserved < 0) { e->hash = h; e->len = (int)sl; e->str = t->pieces[id]; break; }
            if (e->hash == h && (size_t)e->len == sl && memcmp(e->str, s, sl) == 0) break;
        }
        int normal = tok_type_is_normal(type);
        int *slot = normal ? &t->table[i].normal : &t->table[i].reserved;
        if (*slot >= 0) {
            snprintf(err, errn, "piece '%s' is defined twice (ids %d and %d)", tok_quote(q, (const char *)s, sl), *slot, id);
            return -1;
        }
        *slot = id;
        if (normal && (int)sl > t->max_normal_len) t->max_normal_len = (int)sl;
        if (type == TOK_UNKNOWN) {
            if (t->unk_internal >= 0) { snprintf(err, errn, "more than one UNKNOWN piece (ids %d and %d)", t->unk_internal, id); return -1; }
            t->unk_internal = id;
        }
        if (type == TOK_BYTE && tok_add_byte_piece(t, id, s, sl, err, errn) != 0) return -1;
        id++;
    }
    if (t->unk_internal < 0) { snprintf(err, errn, "no UNKNOWN piece (<unk>) defined"); return -1; }
    if (t->byte_fallback) {
        for (int b = 0; b < 256; b++) if (t->byte_ids[b] < 0) {
            snprintf(err, errn, "byte_fallback is set but byte piece <0x%02X> is missing", b);
            return -1;
        }
    }
    return 0;
}

// score ranks (rank), so that the BPE heap compares one integer
static inline int tok_build_ranks(Tokenizer *t, char *err, size_t errn) {
    int n = t->vocab_size;
    TokScoreId *order = (TokScoreId *)malloc((size_t)n * sizeof(TokScoreId));
    if (!order) { snprintf(err, errn, "out of memory"); return -1; }
    for (int i = 0; i < n; i++) { order[i].score = t->scores[i]; order[i].id = i; }
    qsort(order, (size_t)n, sizeof(TokScoreId), tok_cmp_score_desc);
    uint32_t r = 0;
    for (int i = 0; i < n; i++) {
        if (i > 0 && tok_cmp_score_desc(&order[i - 1], &order[i]) != 0) r++;
        t->rank[order[i].id] = r;
    }
    free(order);
    return 0;
}

// the edges set: proper prefixes/suffixes of 1-4 bytes of every piece in pieces_
static inline int tok_build_edges(Tokenizer *t, char *err, size_t errn) {
    int n = t->vocab_size;
    size_t n_keys = 0;
    for (int i = 0; i < n; i++)
        if (tok_type_is_normal(t->types[i])) n_keys += (size_t)(2 * (t->piece_len[i] - 1 < 4 ? t->piece_len[i] - 1 : 4));
    size_t size = 16;
    while (size < 2 * n_keys) size *= 2;
    t->edges = (uint64_t *)calloc(size, sizeof(uint64_t));
    if (!t->edges) { snprintf(err, errn, "out of memory"); return -1; }
    t->edges_mask = size - 1;
    for (int i = 0; i < n; i++) {
        int l = t->piece_len[i];
        if (!tok_type_is_normal(t->types[i])) continue;
        for (int k = 1; k < l && k <= 4; k++) {
            uint64_t key[2] = {tok_edge_key(t->pieces[i], k), tok_edge_key(t->pieces[i] + l - k, k)};
            for (int j = 0; j < 2; j++) {
                size_t e = tok_edge_slot(key[j], t->edges_mask);
                while (t->edges[e] != 0 && t->edges[e] != key[j]) e = (e + 1) & t->edges_mask;
                t->edges[e] = key[j];
            }
        }
    }
    return 0;
}

// the distinct lengths of user-defined pieces, longest first (ud_lens), and their first bytes (ud_first)
static inline int tok_build_user_defined(Tokenizer *t, char *err, size_t errn) {
    int n = t->vocab_size, n_ud = 0;
    for (int i = 0; i < n; i++) n_ud += t->types[i] == TOK_USER_DEFINED;
    if (n_ud == 0) return 0;
    t->ud_lens = (int *)malloc((size_t)n_ud * sizeof(int));
    if (!t->ud_lens) { snprintf(err, errn, "out of memory"); return -1; }
    for (int i = 0; i < n; i++) {
        if (t->types[i] != TOK_USER_DEFINED) continue;
        t->ud_first[(unsigned char)t->pieces[i][0]] = 1;
        int l = t->piece_len[i], k = 0;
        while (k < t->n_ud_lens && t->ud_lens[k] > l) k++;
        if (k < t->n_ud_lens && t->ud_lens[k] == l) continue;
        memmove(t->ud_lens + k + 1, t->ud_lens + k, (size_t)(t->n_ud_lens - k) * sizeof(int));
        t->ud_lens[k] = l;
        t->n_ud_lens++;
    }
    return 0;
}

// the body of tokenizer_load_from_memory: the specs (pass 1), the pieces (pass 2), then
// the tables derived from them; on failure writes a message into err and returns -1
static inline int tok_load(Tokenizer *t, const unsigned char *data, size_t len, char *err, size_t errn) {
    if (len == 0) { snprintf(err, errn, "file is empty"); return -1; }
    if (len > TOKENIZER_MAX_FILE_SIZE) { snprintf(err, errn, "file is %zu bytes, larger than the %zu allowed", len, TOKENIZER_MAX_FILE_SIZE); return -1; }
    TokSpec spec;
    size_t n_pieces;
    if (tok_read_spec(&spec, &n_pieces, data, len, err, errn) != 0 || tok_check_spec(&spec, n_pieces, err, errn) != 0) return -1;
    if (tok_alloc(t, &spec, n_pieces, len, err, errn) != 0 || tok_read_pieces(t, data, len, err, errn) != 0) return -1;
    for (int i = 0; i < t->vocab_size; i++) {
        t->canon[i] = tok_piece_to_id(t, t->pieces[i], (size_t)t->piece_len[i]);
        t->unused_slot[i] = t->types[i] == TOK_UNUSED ? t->n_unused++ : -1;
    }
    if (tok_build_ranks(t, err, errn) != 0 || tok_build_edges(t, err, errn) != 0 || tok_build_user_defined(t, err, errn) != 0) return -1;
    t->unk_id = tok_special_id(t, spec.name[0], spec.name_len[0], TOK_UNKNOWN);
    t->bos_id = tok_special_id(t, spec.name[1], spec.name_len[1], TOK_CONTROL);
    t->eos_id = tok_special_id(t, spec.name[2], spec.name_len[2], TOK_CONTROL);
    t->pad_id = tok_special_id(t, spec.name[3], spec.name_len[3], TOK_CONTROL);
    return 0;
}

// parses a tokenizer.model held in memory (the only function that parses).
// 0 on success; on failure prints "error: tokenizer <name>: <problem>", returns -1
// and leaves *t empty (nothing allocated).
static inline int tokenizer_load_from_memory(Tokenizer *t, const unsigned char *data, size_t len, const char *name) {
    char err[400];
    memset(t, 0, sizeof(*t));
    if (!data) len = 0;
    if (tok_load(t, data, len, err, sizeof(err)) != 0) {
        fprintf(stderr, "error: tokenizer %s: %s\n", name ? name : "(memory)", err);
        tokenizer_free(t);
        return -1;
    }
    return 0;
}

static inline int tokenizer_load(Tokenizer *t, const char *path) {
    memset(t, 0, sizeof(*t));
    t->bos_id = t->eos_id = t->unk_id = t->pad_id = -1;
    FILE *fp = fopen(path, "rb");
    if (!fp) { fprintf(stderr, "error: tokenizer %s: cannot open: %s\n", path, strerror(errno)); return -1; }
    // a regular file that is too large is refused before anything is allocated for it
    struct stat st;
    if (fstat(fileno(fp), &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size > TOKENIZER_MAX_FILE_SIZE) {
        fprintf(stderr, "error: tokenizer %s: file is %llu bytes, larger than the 256 MiB allowed\n", path,
                (unsigned long long)st.st_size);
        fclose(fp);
        return -1;
    }
    // read in chunks rather than trusting ftell: works for pipes and stops at the size limit
    size_t cap = 1 << 16, n = 0;
    unsigned char *buf = (unsigned char *)malloc(cap);
    int too_big = 0, read_err = 0, read_errno = 0;
    while (buf) {
        n += fread(buf + n, 1, cap - n, fp);
        if (n < cap) { read_err = ferror(fp); read_errno = errno; break; }
        if (cap > TOKENIZER_MAX_FILE_SIZE) { too_big = 1; break; }
        unsigned char *nb = (unsigned char *)realloc(buf, cap * 2);
        if (!nb) { free(buf); buf = NULL; break; }
        buf = nb; cap *= 2;
    }
    fclose(fp);
    const char *problem = !buf ? "out of memory reading the file" : read_err ? strerror(read_errno) :
                          too_big ? "file is larger than the 256 MiB allowed" : NULL;
    if (problem) { fprintf(stderr, "error: tokenizer %s: %s\n", path, problem); free(buf); return -1; }
    int rc = tokenizer_load_from_memory(t, buf, n, path);
    free(buf); // the tokenizer keeps copies of what it needs
    return rc;
}

// the piece string of id (with ▁ for spaces, "<0x41>" for byte pieces), NULL if out of range
static inline const char *tokenizer_piece(const Tokenizer *t, int id) {
    return (id >= 0 && id < t->vocab_size) ? t->pieces[id] : NULL;
}

// ----------------------------------------------------------------------------
// encoding

#define TOK_SPACE "\xE2\x96\x81" // U+2581 "▁", which stands for ' ' in pieces

// sentencepiece's Normalizer::Normalize with an identity rule: user-defined
// pieces pass through untouched, valid UTF-8 characters are copied, each byte
// of malformed UTF-8 becomes U+FFFD, and ' ' becomes ▁. out needs 3 * len + 3 bytes.
static inline size_t tok_normalize(const Tokenizer *t, const char *in, size_t len, int dummy_prefix, char *out) {
    size_t i = 0, o = 0;
    if (len == 0) return 0;
    // one normalized "prefix" of in+i: its text (p, pn) and the input bytes it consumed
    #define TOK_PREFIX(p, pn, consumed) do { \
        size_t ud_ = tok_match_user_defined(t, in + i, len - i), mb_; \
        if (ud_) { p = in + i; pn = consumed = ud_; } \
        else if (tok_utf8_valid((const unsigned char *)in + i, len - i, &mb_)) { p = in + i; pn = consumed = mb_; } \
        else { p = "\xEF\xBF\xBD"; pn = 3; consumed = 1; } \
    } while (0)
    const char *p; size_t pn, consumed;
    if (t->remove_extra_whitespaces) { // drop leading spaces
        while (i < len) {
            TOK_PREFIX(p, pn, consumed);
            if (!(pn == 1 && p[0] == ' ')) break;
            i += consumed;
        }
        if (i == len) return 0; // all spaces: no dummy prefix either
    }
    if (dummy_prefix) { memcpy(out, TOK_SPACE, 3); o = 3; }
    int prev_space = t->remove_extra_whitespaces;
    while (i < len) {
        TOK_PREFIX(p, pn, consumed);
        // with remove_extra_whitespaces, a run of spaces collapses into one
        while (prev_space && pn > 0 && p[0] == ' ') { p++; pn--; }
        if (pn > 0) {
            for (size_t k = 0; k < pn; k++) {
                if (p[k] == ' ') { memcpy(out + o, TOK_SPACE, 3); o += 3; }
                else out[o++] = p[k];
            }
            prev_space = p[pn - 1] == ' ';
        }
        i += consumed;
        if (!t->remove_extra_whitespaces) prev_space = 0;
    }
    #undef TOK_PREFIX
    if (t->remove_extra_whitespaces) // drop trailing ▁ (also a literal one in the text, as sentencepiece does)
        while (o >= 3 && memcmp(out + o - 3, TOK_SPACE, 3) == 0) o -= 3;
    return o;
}

typedef struct { int pos, len, prev, next; int freeze; } TokSymbol;
// key = score rank << 32 | left: the smallest key is sentencepiece's agenda
// top (higher score first, then leftmost), and one integer compares fast.
// (Only one valid pair can start at a given symbol, so this is a total order on
// the valid pairs and any correct heap pops them in sentencepiece's order.)
typedef struct { uint64_t key; int right, size; } TokPair;

static inline int tok_pair_before(const TokPair *a, const TokPair *b) { return a->key < b->key; }

typedef struct {
    const Tokenizer *t;
    const char *norm;
    TokSymbol *sym;
    TokPair *heap; size_t n_heap, cap_heap;
    int *split;          // per UNUSED piece: where its last candidate pair split it (sentencepiece's rev_merge)
    int oom;
} TokBPE;

static inline void tok_heap_push(TokBPE *b, TokPair p) {
    if (b->n_heap == b->cap_heap) {
        size_t nc = b->cap_heap ? b->cap_heap * 2 : 1024;
        TokPair *nh = (TokPair *)realloc(b->heap, nc * sizeof(TokPair));
        if (!nh) { b->oom = 1; return; }
        b->heap = nh; b->cap_heap = nc;
    }
    size_t i = b->n_heap++;
    while (i > 0) { // sift up
        size_t parent = (i - 1) / 2;
        if (!tok_pair_before(&p, &b->heap[parent])) break;
        b->heap[i] = b->heap[parent];
        i = parent;
    }
    b->heap[i] = p;
}

static inline TokPair tok_heap_pop(TokBPE *b) {
    TokPair top = b->heap[0], last = b->heap[--b->n_heap];
    size_t i = 0, n = b->n_heap;
    for (;;) { // sift down
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && tok_pair_before(&b->heap[c + 1], &b->heap[c])) c++;
        if (!tok_pair_before(&b->heap[c], &last)) break;
        b->heap[i] = b->heap[c];
        i = c;
    }
    if (n > 0) b->heap[i] = last;
    return top;
}

// sentencepiece's MaybeAddNewSymbolPair: if the two neighbours together form a
// piece in pieces_, queue the merge
static inline void tok_maybe_add_pair(TokBPE *b, int left, int right) {
    if (left < 0 || right < 0 || b->sym[left].freeze || b->sym[right].freeze) return;
    const Tokenizer *t = b->t;
    int len = b->sym[left].len + b->sym[right].len;
    if (len > t->max_normal_len) return;
    const TokSlot *e = tok_find(t, b->norm + b->sym[left].pos, (size_t)len);
    if (!e || e->normal < 0) return;
    TokPair p; p.key = ((uint64_t)t->rank[e->normal] << 32) | (uint32_t)left; p.right = right; p.size = len;
    tok_heap_push(b, p);
    // an UNUSED piece may be merged through but is never output: remember how
    // it was formed (per string, last one wins, like sentencepiece's rev_merge)
    if (t->types[e->normal] == TOK_UNUSED) b->split[t->unused_slot[e->normal]] = b->sym[left].len;
}

// appends the ids for one final symbol norm[pos..pos+len) to out
static inline int tok_emit(const Tokenizer *t, const char *norm, int pos, int len, const int *split,
                           int *out, int n, int *prev_unk) {
    // sentencepiece's resegment(): an UNUSED piece is replaced by the two
    // symbols it was merged from, recursively. A stack instead of recursion:
    // each level is shorter, so TOKENIZER_MAX_PIECE_LEN entries suffice.
    int stack[2 * TOKENIZER_MAX_PIECE_LEN + 2], sp = 0;
    stack[sp++] = pos; stack[sp++] = len;
    while (sp > 0) {
        len = stack[--sp]; pos = stack[--sp];
        int id = tok_piece_to_id(t, norm + pos, (size_t)len);
        int type = t->types[id];
        if (type == TOK_UNUSED && split[t->unused_slot[id]] > 0 && split[t->unused_slot[id]] < len &&
            sp + 4 <= (int)(sizeof(stack) / sizeof(stack[0]))) {
            int l = split[t->unused_slot[id]];
            stack[sp++] = pos + l; stack[sp++] = len - l; // right, popped second
            stack[sp++] = pos; stack[sp++] = l;           // left, popped first
            continue;
        }
        // sentencepiece's PopulateSentencePieceText
        int unk = type == TOK_UNKNOWN;
        if (unk && t->byte_fallback) {
            for (int k = 0; k < len; k++) out[n++] = t->byte_ids[(unsigned char)norm[pos + k]];
        } else if (!(unk && *prev_unk)) { // without byte fallback a run of unknowns is one <unk>
            out[n++] = id;
        }
        *prev_unk = unk;
    }
    return n;
}

// encodes len bytes of text (any bytes) into a malloc'd array of ids, *n_out
// of them; bos/eos prepend/append BOS/EOS when the model has them. Returns
// NULL only when out of memory (or text is over TOKENIZER_MAX_TEXT bytes).
static inline int *tok_encode(const Tokenizer *t, const char *text, size_t len, int bos, int eos, int dummy_prefix, int *n_out) {
    *n_out = 0;
    if (!text) len = 0;
    if (len > TOKENIZER_MAX_TEXT) return NULL;
    char *norm = (char *)malloc(3 * len + 4);
    if (!norm) return NULL;
    int nn = (int)tok_normalize(t, text, len, dummy_prefix, norm);

    TokBPE b;
    memset(&b, 0, sizeof(b));
    b.t = t; b.norm = norm;
    b.sym = (TokSymbol *)malloc(((size_t)nn + 1) * sizeof(TokSymbol));
    b.split = (int *)malloc(((size_t)t->n_unused + 1) * sizeof(int));
    // each output id covers at least one normalized byte (byte fallback: exactly one)
    int *out = (int *)malloc(((size_t)nn + 2) * sizeof(int));
    int n = 0;
    b.oom = !b.sym || !b.split || !out;
    if (!b.oom && bos && t->bos_id >= 0) out[n++] = t->bos_id;
    if (!b.oom && nn > 0) {
        for (int k = 0; k < t->n_unused; k++) b.split[k] = -1;
        // split into characters; user-defined pieces are single frozen symbols
        int ns = 0;
        for (int i = 0; i < nn; ns++) {
            size_t ud = tok_match_user_defined(t, norm + i, (size_t)(nn - i));
            int l;
            if (ud) l = (int)ud;
            else { // sentencepiece's OneCharLen on the lead byte, clipped to the end
                static const unsigned char one_char_len[16] = {1,1,1,1,1,1,1,1,1,1,1,1,2,2,3,4};
                l = one_char_len[(unsigned char)norm[i] >> 4];
                if (l > nn - i) l = nn - i;
            }
            TokSymbol s; s.pos = i; s.len = l; s.prev = ns - 1; s.freeze = ud > 0;
            i += l;
            s.next = i < nn ? ns + 1 : -1;
            b.sym[ns] = s;
        }
        // A symbol that is no proper prefix or suffix of any piece is never
        // merged, so no merge crosses it, and BPE on each stretch between such
        // symbols pops its merges in the same order as on the whole text: the
        // heaps stay small (much faster on long texts). Not with UNUSED pieces:
        // sentencepiece's rev_merge depends on the global order of candidates.
        int segmented = t->n_unused == 0;
        for (int first = 0; first < ns && !b.oom;) {
            int last = ns - 1;
            if (segmented) {
                while (first < ns && (b.sym[first].freeze || !tok_mergeable(t, norm + b.sym[first].pos, b.sym[first].len))) first++;
                for (last = first; last + 1 < ns; last++) {
                    const TokSymbol *y = &b.sym[last + 1];
                    if (y->freeze || !tok_mergeable(t, norm + y->pos, y->len)) break;
                }
            }
            for (int i = first + 1; i <= last; i++) tok_maybe_add_pair(&b, i - 1, i);
            // merge the best pair until none is left; stale pairs (a side already
            // merged away or grown since) are skipped when popped
            while (b.n_heap > 0 && !b.oom) {
                TokPair top = tok_heap_pop(&b);
                int left = (int)(uint32_t)top.key;
                TokSymbol *l = &b.sym[left], *r = &b.sym[top.right];
                if (l->len == 0 || r->len == 0 || l->len + r->len != top.size) continue;
                l->len += r->len;
                l->next = r->next;
                if (r->next >= 0) b.sym[r->next].prev = left;
                r->len = 0;
                tok_maybe_add_pair(&b, l->prev, left);
                tok_maybe_add_pair(&b, left, l->next);
            }
            first = last + 1;
        }
        int prev_unk = 0;
        for (int i = 0; i >= 0 && !b.oom; i = b.sym[i].next)
            n = tok_emit(t, norm, b.sym[i].pos, b.sym[i].len, b.split, out, n, &prev_unk);
    }
    if (!b.oom && eos && t->eos_id >= 0) out[n++] = t->eos_id;
    free(norm); free(b.sym); free(b.heap); free(b.split);
    if (b.oom) { free(out); return NULL; }
    *n_out = n;
    int *shrunk = (int *)realloc(out, ((size_t)n + 1) * sizeof(int));
    return shrunk ? shrunk : out;
}

// text to ids (malloc'd; *n_out set), with BOS and EOS when asked; NULL when out of memory
static inline int *tokenizer_encode(const Tokenizer *t, const char *text, size_t len, int bos, int eos, int *n_out) {
    return tok_encode(t, text, len, bos, eos, t->add_dummy_prefix, n_out);
}

// text that follows a special token within one sequence, as transformers encodes it
// (Llama-2's tokenizer_config.json "legacy": false): without the dummy prefix
static inline int *tokenizer_encode_continued(const Tokenizer *t, const char *text, size_t len, int *n_out) {
    return tok_encode(t, text, len, 0, 0, 0, n_out);
}

// ----------------------------------------------------------------------------
// decoding

// appends a run of byte pieces: each valid UTF-8 character as is, each byte
// that doesn't start one as U+FFFD (sentencepiece's ProcessBytePieces)
static inline size_t tok_flush_bytes(const unsigned char *bytes, size_t nb, char *out, size_t o) {
    for (size_t i = 0; i < nb;) {
        size_t mb;
        if (tok_utf8_valid(bytes + i, nb - i, &mb)) { memcpy(out + o, bytes + i, mb); o += mb; }
        else { memcpy(out + o, "\xEF\xBF\xBD", 3); o += 3; }
        i += mb;
    }
    return o;
}

// decodes ids like sentencepiece's DecodeIds: control pieces vanish, <unk>
// becomes " ⁇ " (trainer_spec.unk_surface), runs of byte pieces are
// reassembled, ▁ becomes ' ', and the first piece's leading ▁ (the dummy
// prefix) is dropped. Ids outside [0, vocab_size) are skipped as if absent
// (sentencepiece raises an error instead). Returns a malloc'd NUL-terminated
// string, *len_out its length (it may contain NUL bytes), NULL if out of memory.
static inline char *tokenizer_decode(const Tokenizer *t, const int *ids, int n, size_t *len_out) {
    if (len_out) *len_out = 0;
    if (!ids || n < 0) n = 0;
    // upper bound: a piece's text never grows (▁ -> ' ' shrinks), <unk> becomes
    // unk_surface, a byte becomes at most 3 bytes (U+FFFD)
    size_t cap = 1;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->vocab_size) continue;
        size_t pl = (size_t)t->piece_len[ids[i]];
        cap += (pl > t->unk_surface_len ? pl : t->unk_surface_len) + 3;
    }
    char *out = (char *)malloc(cap);
    unsigned char *bytes = (unsigned char *)malloc((size_t)n + 1);
    if (!out || !bytes) { free(out); free(bytes); return NULL; }
    size_t o = 0, nb = 0;
    int is_bos_ws = 1, bos_ws_seen = 0;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->vocab_size) continue;
        int id = t->canon[ids[i]]; // sentencepiece decodes ids -> pieces -> ids
        if (t->types[id] == TOK_BYTE) { bytes[nb++] = (unsigned char)t->byte_of[id]; continue; }
        o = tok_flush_bytes(bytes, nb, out, o); nb = 0;
        // only the first piece that produces text may lose its leading ▁
        if (bos_ws_seen || o > 0) is_bos_ws = 0;
        bos_ws_seen = 0;
        if (t->types[id] == TOK_CONTROL) continue;
        if (t->types[id] == TOK_UNKNOWN) { memcpy(out + o, t->unk_surface, t->unk_surface_len); o += t->unk_surface_len; continue; }
        const char *p = t->pieces[id];
        size_t pl = (size_t)t->piece_len[id];
        if (is_bos_ws && (t->add_dummy_prefix || t->remove_extra_whitespaces) && pl >= 3 && memcmp(p, TOK_SPACE, 3) == 0) {
            p += 3; pl -= 3;
            // with remove_extra_whitespaces every leading ▁ piece is stripped
            bos_ws_seen = !t->remove_extra_whitespaces;
        }
        for (size_t k = 0; k < pl;) {
            if (k + 3 <= pl && memcmp(p + k, TOK_SPACE, 3) == 0) { out[o++] = ' '; k += 3; }
            else out[o++] = p[k++];
        }
    }
    o = tok_flush_bytes(bytes, nb, out, o);
    free(bytes);
    out[o] = 0;
    if (len_out) *len_out = o;
    return out;
}

#endif // TOKENIZER_H
