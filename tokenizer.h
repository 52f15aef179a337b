// tokenizer.h: a single-header tokenizer (C99, also compiles as C++/CUDA) for
// the two formats Llama-family checkpoints ship, each encoding and decoding
// exactly as its reference library does:
//
// 1. sentencepiece `tokenizer.model` (Llama-2, Mistral, CodeLlama, TinyLlama):
//    the serialized protobuf ModelProto, read directly, encoded like the
//    sentencepiece library for Llama-2-style models:
//      model_type BPE, byte_fallback, identity normalization (no charsmap),
//      add_dummy_prefix on or off, remove_extra_whitespaces on or off,
//      pieces of type NORMAL / UNKNOWN / CONTROL / USER_DEFINED / UNUSED / BYTE.
//    Models it cannot reproduce exactly (unigram/word/char models, a
//    normalization rule other than identity, treat_whitespace_as_suffix,
//    escape_whitespaces=false, a denormalizer) are refused with a message.
//    The behaviour follows sentencepiece's normalizer.cc (Normalize),
//    bpe_model.cc (SampleEncode without dropout), model_interface.cc
//    (InitializePieces) and sentencepiece_processor.cc (Encode/Decode).
//
// 2. Hugging Face `tokenizer.json` with a byte-level BPE (Llama-3.x, GPT-2
//    style), encoded like the `tokenizers` library's
//    encode(text, add_special_tokens=False) and decoded like its
//    decode(ids, skip_special_tokens=False). See "tokenizer.json" below for
//    what is supported; everything else is refused naming the field.
//
// Tokenizer.kind says which one was loaded; tokenizer_load picks the format
// from the name (".json") or the content (a JSON object starts with '{').
//
// Every byte of a tokenizer file is untrusted: all reads are bounds-checked,
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
#include "support/json.h"
#include "support/unicode_tables.h"

// Limits on what a tokenizer file may claim. Llama-2 has 32000 pieces of at
// most 16 bytes (48 with the ▁ encoding), Llama-3 128256 tokens of at most 256
// bytes; these leave plenty of room.
#define TOKENIZER_MAX_PIECES (1 << 21)
#define TOKENIZER_MAX_PIECE_LEN 2048
#define TOKENIZER_MAX_FILE_SIZE ((size_t)1 << 28)   // 256 MiB
#define TOKENIZER_MAX_PB_DEPTH 64                   // nesting of protobuf groups
// encode keeps positions in ints: the normalized text (up to 3x the input) must fit
#define TOKENIZER_MAX_TEXT ((size_t)1 << 29)

// Tokenizer.kind
enum { TOKENIZER_SENTENCEPIECE = 1, TOKENIZER_BPE_JSON = 2 };

// sentencepiece's ModelProto.SentencePiece.Type
enum { TOK_NORMAL = 1, TOK_UNKNOWN = 2, TOK_CONTROL = 3, TOK_USER_DEFINED = 4, TOK_UNUSED = 5, TOK_BYTE = 6 };

// Tokenizer.literal: pieces matched in the text as they are, longest first,
// before anything else (sentencepiece's user-defined pieces; tokenizer.json's
// added tokens: those with normalized false in a first pass, then those with
// normalized true in the text between, with their lstrip/rstrip)
enum { TOK_LIT_PASS1 = 1, TOK_LIT_PASS2 = 2, TOK_LIT_LSTRIP = 4, TOK_LIT_RSTRIP = 8 };

// one slot of the open-addressing hash table from piece string to id.
// sentencepiece keeps two maps: "pieces_" (NORMAL, USER_DEFINED, UNUSED: the
// ones BPE may merge into) and "reserved" (UNKNOWN, CONTROL, BYTE). The same
// string may appear once in each, so a slot holds one id of each kind.
// tokenizer.json: normal is the id in model.vocab, reserved the added token's.
typedef struct {
    uint32_t hash;
    int len;          // the key, kept here so a lookup touches one cache line
    const char *str;  // (points into Tokenizer.strings)
    int normal;       // id in pieces_, or -1
    int reserved;     // id in the reserved map, or -1
} TokSlot;

// the pieces of one pass of literal matching: which first bytes and lengths to try
typedef struct {
    unsigned char first[256]; // 1 if some piece of the set starts with this byte
    int *lens; int n_lens;    // distinct lengths of its pieces, descending
} TokLiterals;

// one slot of the merges table of tokenizer.json (open addressing on the id pair)
typedef struct {
    uint64_t key;     // left id << 32 | right id; empty slot: id < 0
    uint32_t rank;    // position in model.merges: lower merges first
    int id;           // the merged token's id
} TokMerge;

typedef struct {
    int kind;                           // TOKENIZER_SENTENCEPIECE or TOKENIZER_BPE_JSON
    int vocab_size;                     // ids are 0 .. vocab_size-1 (tokenizer.json: model.vocab and the added tokens)
    int bos_id, eos_id, unk_id, pad_id; // as sentencepiece's bos_id() etc.: -1 when the model has none;
                                        // tokenizer.json: bos/eos/pad -1 (config files name them), unk model.unk_token
    // --- internals, both formats ---
    char *strings;          // all piece strings, each NUL-terminated
    char **pieces;          // pieces[id] points into strings
    int *piece_len;         // byte length (a piece may contain NUL; pieces[id] is then cut short as a C string)
    TokSlot *table; size_t table_mask;
    int byte_ids[256];      // the id a lone byte becomes: piece <0xXX> (sentencepiece), the byte's
                            // character (tokenizer.json byte-level); -1 if none
    int unk_internal;       // what unknown symbols map to (tokenizer.json: -1 when model.unk_token is null)
    unsigned char *literal; // per id: TOK_LIT_* flags, 0 for most
    TokLiterals lit[2];     // the literal pieces of each pass
    // --- sentencepiece ---
    float *scores;
    uint32_t *rank;         // position of each score in descending order (equal scores, equal rank)
    unsigned char *types;   // TOK_*
    int *canon;             // PieceToId(pieces[id]): a reserved piece shadows a normal one with the same string
    int *unused_slot;       // per id: index among UNUSED pieces, or -1
    int n_unused;
    short *byte_of;         // per id: the byte a BYTE piece stands for, or -1
    int max_normal_len;     // longest piece in pieces_: longer candidate merges need no lookup
    // proper prefixes and suffixes (1-4 bytes) of the pieces in pieces_, as
    // packed keys: a character that is none of these can never be merged, so
    // encode may run BPE separately on the stretches between such characters
    uint64_t *edges; size_t edges_mask;
    int add_dummy_prefix, remove_extra_whitespaces, byte_fallback;
    int legacy;             // tokenizer_config.json's "legacy" (set by the data loader): text after a special token gets the dummy prefix too
    char *unk_surface; size_t unk_surface_len; // what decode prints for <unk> (" ⁇ " by default)
    // --- tokenizer.json ---
    int pretok;             // TOK_PRE_*: which pre-tokenizer regex splits the text
    int ignore_merges, fuse_unk;
    TokMerge *merges; size_t merges_mask;
    char *dec;              // what each id decodes to (bytes, before the UTF-8 check): dec[dec_off[id] .. dec_off[id+1])
    size_t *dec_off;
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

// length of the longest piece of a literal set (pieces with flag in t->literal)
// that is a prefix of s[0..n), or 0; *id gets its id
static inline size_t tok_match_literal(const Tokenizer *t, const TokLiterals *set, unsigned flag, const char *s,
                                       size_t n, int *id) {
    if (set->n_lens == 0 || n == 0 || !set->first[(unsigned char)s[0]]) return 0;
    for (int k = 0; k < set->n_lens; k++) { // descending, so the first hit is the longest
        size_t l = (size_t)set->lens[k];
        if (l > n) continue;
        const TokSlot *e = tok_find(t, s, l);
        if (!e) continue;
        if (e->reserved >= 0 && (t->literal[e->reserved] & flag)) { *id = e->reserved; return l; }
        if (e->normal >= 0 && (t->literal[e->normal] & flag)) { *id = e->normal; return l; }
    }
    return 0;
}

// puts piece id (string s[0..n), already in t->strings) into the hash table, in
// its normal or reserved map; -1 if that map has the string already (*other: its id)
static inline int tok_table_insert(Tokenizer *t, const char *s, size_t n, int id, int reserved, int *other) {
    uint32_t h = tok_hash(s, n);
    size_t i = h & t->table_mask;
    for (;; i = (i + 1) & t->table_mask) { // the string's slot, claimed when no piece before had it
        TokSlot *e = &t->table[i];
        if (e->normal < 0 && e->reserved < 0) { e->hash = h; e->len = (int)n; e->str = s; break; }
        if (e->hash == h && (size_t)e->len == n && memcmp(e->str, s, n) == 0) break;
    }
    int *slot = reserved ? &t->table[i].reserved : &t->table[i].normal;
    if (*slot >= 0) { *other = *slot; return -1; }
    *slot = id;
    return 0;
}

// an empty hash table for n pieces
static inline int tok_table_alloc(Tokenizer *t, size_t n) {
    size_t size = 16;
    while (size < 2 * n) size *= 2;
    t->table = (TokSlot *)malloc(size * sizeof(TokSlot));
    if (!t->table) return -1;
    t->table_mask = size - 1;
    memset(t->table, 0, size * sizeof(TokSlot));
    for (size_t i = 0; i < size; i++) t->table[i].normal = t->table[i].reserved = -1;
    return 0;
}

// the literal set of the pieces with flag: their distinct lengths, longest first, and first bytes
static inline int tok_build_literals(Tokenizer *t, TokLiterals *set, unsigned flag, char *err, size_t errn) {
    int n = t->vocab_size, count = 0;
    for (int i = 0; i < n; i++) count += (t->literal[i] & flag) != 0;
    if (count == 0) return 0;
    set->lens = (int *)malloc((size_t)count * sizeof(int));
    if (!set->lens) { snprintf(err, errn, "out of memory"); return -1; }
    for (int i = 0; i < n; i++) {
        if (!(t->literal[i] & flag) || t->piece_len[i] == 0) continue;
        set->first[(unsigned char)t->pieces[i][0]] = 1;
        int l = t->piece_len[i], k = 0;
        while (k < set->n_lens && set->lens[k] > l) k++;
        if (k < set->n_lens && set->lens[k] == l) continue;
        memmove(set->lens + k + 1, set->lens + k, (size_t)(set->n_lens - k) * sizeof(int));
        set->lens[k] = l;
        set->n_lens++;
    }
    return 0;
}

// ----------------------------------------------------------------------------
// BPE merging, shared by both formats: symbols in a linked list, candidate
// merges of neighbours in a heap, the best popped and applied until none is left

typedef struct { int pos, len, prev, next; int freeze; int id; } TokSymbol; // id: tokenizer.json only
// key = score rank << 32 | left: the smallest key is the next merge (best
// rank first, then leftmost), and one integer compares fast. (Only one valid
// pair can start at a given symbol, so this is a total order on the valid
// pairs and any correct heap pops them in the reference libraries' order.)
typedef struct { uint64_t key; int right, size, id; } TokPair; // size: both sides' bytes; id: the merged token (tokenizer.json)

static inline int tok_pair_before(const TokPair *a, const TokPair *b) { return a->key < b->key; }

typedef struct TokBPE {
    const Tokenizer *t;
    const char *norm;    // the text the symbols index
    TokSymbol *sym;
    TokPair *heap; size_t n_heap, cap_heap;
    int *split;          // per UNUSED piece: where its last candidate pair split it (sentencepiece's rev_merge)
    void (*add_pair)(struct TokBPE *b, int left, int right); // queues the merge of two neighbours, if any
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

// queues the pairs of symbols first..last, then merges the best pair until
// none is left. Stale pairs (a side already merged away or grown since: the
// bytes they cover changed) are skipped when popped.
static inline void tok_merge_all(TokBPE *b, int first, int last) {
    for (int i = first + 1; i <= last; i++) b->add_pair(b, i - 1, i);
    while (b->n_heap > 0 && !b->oom) {
        TokPair top = tok_heap_pop(b);
        int left = (int)(uint32_t)top.key;
        TokSymbol *l = &b->sym[left], *r = &b->sym[top.right];
        if (l->len == 0 || r->len == 0 || l->len + r->len != top.size) continue;
        l->len += r->len;
        l->id = top.id;
        l->next = r->next;
        if (r->next >= 0) b->sym[r->next].prev = left;
        r->len = 0;
        b->add_pair(b, l->prev, left);
        b->add_pair(b, left, l->next);
    }
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
// sentencepiece: loading

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
    t->literal = (unsigned char *)calloc(n_pieces, 1);
    t->strings = (char *)malloc(len + n_pieces); // piece bytes + a NUL each
    t->unk_surface = (char *)malloc(spec->unk_surface_len + 1);
    if (!t->pieces || !t->piece_len || !t->scores || !t->rank || !t->types || !t->canon || !t->unused_slot ||
        !t->byte_of || !t->literal || !t->strings || tok_table_alloc(t, n_pieces) != 0 || !t->unk_surface) {
        snprintf(err, errn, "out of memory"); return -1;
    }
    memcpy(t->unk_surface, spec->unk_surface, spec->unk_surface_len);
    t->unk_surface[spec->unk_surface_len] = 0;
    t->unk_surface_len = spec->unk_surface_len;
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
        int normal = tok_type_is_normal(type), other;
        if (tok_table_insert(t, t->pieces[id], sl, id, !normal, &other) != 0) {
            snprintf(err, errn, "piece '%s' is defined twice (ids %d and %d)", tok_quote(q, (const char *)s, sl), other, id);
            return -1;
        }
        if (type == TOK_USER_DEFINED) t->literal[id] = TOK_LIT_PASS1;
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

// loads a sentencepiece model: the specs (pass 1), the pieces (pass 2), then
// the tables derived from them; on failure writes a message into err and returns -1
static inline int tok_sp_load(Tokenizer *t, const unsigned char *data, size_t len, char *err, size_t errn) {
    TokSpec spec;
    size_t n_pieces;
    if (tok_read_spec(&spec, &n_pieces, data, len, err, errn) != 0 || tok_check_spec(&spec, n_pieces, err, errn) != 0) return -1;
    t->kind = TOKENIZER_SENTENCEPIECE;
    if (tok_alloc(t, &spec, n_pieces, len, err, errn) != 0 || tok_read_pieces(t, data, len, err, errn) != 0) return -1;
    for (int i = 0; i < t->vocab_size; i++) {
        t->canon[i] = tok_piece_to_id(t, t->pieces[i], (size_t)t->piece_len[i]);
        t->unused_slot[i] = t->types[i] == TOK_UNUSED ? t->n_unused++ : -1;
    }
    if (tok_build_ranks(t, err, errn) != 0 || tok_build_edges(t, err, errn) != 0 ||
        tok_build_literals(t, &t->lit[0], TOK_LIT_PASS1, err, errn) != 0) return -1;
    t->unk_id = tok_special_id(t, spec.name[0], spec.name_len[0], TOK_UNKNOWN);
    t->bos_id = tok_special_id(t, spec.name[1], spec.name_len[1], TOK_CONTROL);
    t->eos_id = tok_special_id(t, spec.name[2], spec.name_len[2], TOK_CONTROL);
    t->pad_id = tok_special_id(t, spec.name[3], spec.name_len[3], TOK_CONTROL);
    return 0;
}

// ----------------------------------------------------------------------------
// sentencepiece: encoding

#define TOK_SPACE "\xE2\x96\x81" // U+2581 "▁", which stands for ' ' in pieces

// sentencepiece's Normalizer::Normalize with an identity rule: user-defined
// pieces pass through untouched, valid UTF-8 characters are copied, each byte
// of malformed UTF-8 becomes U+FFFD, and ' ' becomes ▁. out needs 3 * len + 3 bytes.
static inline size_t tok_normalize(const Tokenizer *t, const char *in, size_t len, int dummy_prefix, char *out) {
    size_t i = 0, o = 0;
    if (len == 0) return 0;
    // one normalized "prefix" of in+i: its text (p, pn) and the input bytes it consumed
    #define TOK_PREFIX(p, pn, consumed) do { \
        int id_; size_t ud_ = tok_match_literal(t, &t->lit[0], TOK_LIT_PASS1, in + i, len - i, &id_), mb_; \
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

// sentencepiece's MaybeAddNewSymbolPair: if the two neighbours together form a
// piece in pieces_, queue the merge
static inline void tok_maybe_add_pair(TokBPE *b, int left, int right) {
    if (left < 0 || right < 0 || b->sym[left].freeze || b->sym[right].freeze) return;
    const Tokenizer *t = b->t;
    int len = b->sym[left].len + b->sym[right].len;
    if (len > t->max_normal_len) return;
    const TokSlot *e = tok_find(t, b->norm + b->sym[left].pos, (size_t)len);
    if (!e || e->normal < 0) return;
    TokPair p; p.key = ((uint64_t)t->rank[e->normal] << 32) | (uint32_t)left; p.right = right; p.size = len; p.id = -1;
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

// tokenizer_encode for a sentencepiece model (dummy_prefix: whether to add the ▁ its normalizer may add)
static inline int *tok_sp_encode(const Tokenizer *t, const char *text, size_t len, int bos, int eos, int dummy_prefix, int *n_out) {
    char *norm = (char *)malloc(3 * len + 4);
    if (!norm) return NULL;
    int nn = (int)tok_normalize(t, text, len, dummy_prefix, norm);

    TokBPE b;
    memset(&b, 0, sizeof(b));
    b.t = t; b.norm = norm; b.add_pair = tok_maybe_add_pair;
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
            int ud_id;
            size_t ud = tok_match_literal(t, &t->lit[0], TOK_LIT_PASS1, norm + i, (size_t)(nn - i), &ud_id);
            int l;
            if (ud) l = (int)ud;
            else { // sentencepiece's OneCharLen on the lead byte, clipped to the end
                static const unsigned char one_char_len[16] = {1,1,1,1,1,1,1,1,1,1,1,1,2,2,3,4};
                l = one_char_len[(unsigned char)norm[i] >> 4];
                if (l > nn - i) l = nn - i;
            }
            TokSymbol s; s.pos = i; s.len = l; s.prev = ns - 1; s.freeze = ud > 0; s.id = -1;
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
            tok_merge_all(&b, first, last);
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

// ----------------------------------------------------------------------------
// sentencepiece: decoding

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

// tokenizer_decode for a sentencepiece model: like sentencepiece's DecodeIds,
// control pieces vanish, <unk> becomes " ⁇ " (trainer_spec.unk_surface), runs
// of byte pieces are reassembled, ▁ becomes ' ', and the first piece's leading
// ▁ (the dummy prefix) is dropped.
static inline char *tok_sp_decode(const Tokenizer *t, const int *ids, int n, size_t *len_out) {
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

// ----------------------------------------------------------------------------
// tokenizer.json: loading
//
// Supported, exactly as the `tokenizers` library (0.23) encodes and decodes;
// anything else is refused with a message naming the field and its value:
//   model: type "BPE" with byte_fallback false, dropout, continuing_subword_prefix
//     and end_of_word_suffix null; ignore_merges (Llama-3 sets it: a pre-token
//     that is in the vocab as a whole becomes that token, unmerged); unk_token
//     null or a vocab entry, with fuse_unk; vocab ids 0..n-1 with no gaps;
//     merges as "a b" strings or ["a", "b"] pairs (a pair listed twice ranks
//     where it is listed last, as tokenizers has it)
//   normalizer, truncation and padding null
//   pre_tokenizer: Llama-3's, Sequence [Split(its regex, Isolated, invert
//     false), ByteLevel(add_prefix_space false, use_regex false)], or GPT-2's,
//     ByteLevel(add_prefix_space false, use_regex true)
//   decoder: ByteLevel
//   added_tokens with single_word false; each must have the id tokenizers
//     gives it (a content in the vocab keeps its vocab id, the others follow
//     the vocab in order); a content may not repeat
// post_processor is not read: it only adds tokens when encode is asked for
// special tokens (Llama-3's TemplateProcessing prepends <|begin_of_text|>),
// and tokenizer_encode is encode(text, add_special_tokens=False). Its bos/eos
// arguments add bos_id/eos_id, which are -1 for a tokenizer.json: the model's
// config files say which tokens they are (the caller sets them).

// Tokenizer.pretok: the pre-tokenizer's regex
enum { TOK_PRE_LLAMA3 = 1, TOK_PRE_GPT2 = 2 };
#define TOK_LLAMA3_PATTERN "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

// GPT-2's bytes_to_unicode: the character that stands for byte b in the vocab.
// The printable bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF stand for themselves,
// the other 68 (0x00..0x20, 0x7F..0xA0, 0xAD), in order, for U+0100..U+0143.
static inline uint32_t tok_byte_char(int b) {
    if (b <= 0x20) return 0x100 + (uint32_t)b;
    if (b >= 0x7F && b <= 0xA0) return 0x100 + 33 + (uint32_t)(b - 0x7F);
    if (b == 0xAD) return 0x100 + 67;
    return (uint32_t)b;
}

// writes byte b's character as UTF-8 (1 or 2 bytes); returns the length
static inline size_t tok_put_byte_char(char *out, int b) {
    uint32_t c = tok_byte_char(b);
    if (c < 0x80) { out[0] = (char)c; return 1; }
    out[0] = (char)(0xC0 | (c >> 6)); out[1] = (char)(0x80 | (c & 0x3F));
    return 2;
}

// the code point at s[i] and its byte length (s is valid UTF-8 there)
static inline uint32_t tok_cp(const unsigned char *s, size_t i, size_t *len) {
    unsigned char c = s[i];
    if (c < 0x80) { *len = 1; return c; }
    if (c < 0xE0) { *len = 2; return ((uint32_t)(c & 0x1F) << 6) | (s[i + 1] & 0x3F); }
    if (c < 0xF0) { *len = 3; return ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F); }
    *len = 4;
    return ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[i + 1] & 0x3F) << 12) | ((uint32_t)(s[i + 2] & 0x3F) << 6) | (s[i + 3] & 0x3F);
}

// Rust's from_utf8_lossy and Python's decode(errors="replace"): the length of
// the maximal well-formed start of a character at s (n > 0 bytes there; at
// least 1), *whole whether it is a whole character. An ill-formed start
// becomes one U+FFFD (Unicode's "maximal subpart" practice).
static inline size_t tok_utf8_prefix(const unsigned char *s, size_t n, int *whole) {
    unsigned char c = s[0], lo = 0x80, hi = 0xBF; // lo, hi: the range of the second byte (Unicode Table 3-7)
    size_t need;
    *whole = 0;
    if (c < 0x80) { *whole = 1; return 1; }
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c == 0xE0) { need = 3; lo = 0xA0; }
    else if (c == 0xED) { need = 3; hi = 0x9F; }
    else if (c >= 0xE1 && c <= 0xEF) need = 3;
    else if (c == 0xF0) { need = 4; lo = 0x90; }
    else if (c == 0xF4) { need = 4; hi = 0x8F; }
    else if (c >= 0xF1 && c <= 0xF3) need = 4;
    else return 1;
    size_t k = 1;
    if (k < n && s[k] >= lo && s[k] <= hi)
        for (k = 2; k < need && k < n && s[k] >= 0x80 && s[k] <= 0xBF; k++) {}
    *whole = k == need;
    return k;
}

// in[0..n) with each ill-formed part replaced by U+FFFD into out (3n bytes); returns out's length
static inline size_t tok_utf8_lossy(const unsigned char *in, size_t n, char *out) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        int whole;
        size_t k = tok_utf8_prefix(in + i, n - i, &whole);
        if (whole) memcpy(out + o, in + i, k), o += k;
        else memcpy(out + o, "\xEF\xBF\xBD", 3), o += 3;
        i += k;
    }
    return o;
}

static inline int tok_fail(char *err, size_t errn, const char *fmt, ...) JSON__PRINTF(3, 4);
static inline int tok_fail(char *err, size_t errn, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errn, fmt, ap);
    va_end(ap);
    return -1;
}

// a JSON value for a message: a string quoted (cut at 40 bytes), else its type or value
static inline const char *tok_json_show(char *buf, size_t n, const JsonValue *v) {
    char q[200];
    if (!v) snprintf(buf, n, "missing");
    else if (v->type == JSON_STRING) snprintf(buf, n, "\"%s\"", tok_quote(q, v->string, v->string_len));
    else if (v->type == JSON_BOOL) snprintf(buf, n, "%s", v->boolean ? "true" : "false");
    else if (v->type == JSON_NUMBER) snprintf(buf, n, "%g", v->number);
    else snprintf(buf, n, "%s", v->type == JSON_NULL ? "null" : v->type == JSON_ARRAY ? "an array" : "an object");
    return buf;
}

// In the checks below, prefix is where obj is in the file, as it begins the
// names of obj's fields in messages: "" (the top level), "model.", "added_tokens[3]."

// obj must be an object without repeated keys
static inline int tok_json_object(const JsonValue *obj, const char *prefix, char *err, size_t errn) {
    char v[260], q[200];
    int pl = (int)strlen(prefix) - 1; // the object's own name: the prefix without its '.'
    if (pl <= 0) pl = (int)strlen("the top level"), prefix = "the top level";
    if (!obj || obj->type != JSON_OBJECT) return tok_fail(err, errn, "%.*s is %s, not an object", pl, prefix, tok_json_show(v, sizeof v, obj));
    int d = json_find_duplicate_key(obj);
    if (d >= 0) return tok_fail(err, errn, "%.*s has the key \"%s\" twice", pl, prefix, tok_quote(q, obj->keys[d], obj->key_lens[d]));
    return 0;
}

// obj.key must be absent or null (what is supported: `why`)
static inline int tok_json_null(const JsonValue *obj, const char *path, const char *key, const char *why, char *err, size_t errn) {
    const JsonValue *v = json_get(obj, key);
    char s[260];
    if (!v || v->type == JSON_NULL) return 0;
    if (v->type == JSON_OBJECT && json_get(v, "type"))
        return tok_fail(err, errn, "%s%s is of type %s; %s", path, key, tok_json_show(s, sizeof s, json_get(v, "type")), why);
    return tok_fail(err, errn, "%s%s is %s; %s", path, key, tok_json_show(s, sizeof s, v), why);
}

// obj.key as a bool: `dflt` when absent or null, or required when dflt < 0
static inline int tok_json_bool(const JsonValue *obj, const char *path, const char *key, int dflt, int *out, char *err, size_t errn) {
    const JsonValue *v = json_get(obj, key);
    char s[260];
    if ((!v || v->type == JSON_NULL) && dflt >= 0) { *out = dflt; return 0; }
    if (!v || v->type != JSON_BOOL) return tok_fail(err, errn, "%s%s is %s, not true or false", path, key, tok_json_show(s, sizeof s, v));
    *out = v->boolean;
    return 0;
}

// obj.key must be the string want
static inline int tok_json_is(const JsonValue *obj, const char *path, const char *key, const char *want, char *err, size_t errn) {
    const JsonValue *v = json_get(obj, key);
    char s[260];
    if (v && v->type == JSON_STRING && v->string_len == strlen(want) && memcmp(v->string, want, v->string_len) == 0) return 0;
    return tok_fail(err, errn, "%s%s is %s; only \"%.80s\" is supported", path, key, tok_json_show(s, sizeof s, v), want);
}

// a ByteLevel pre-tokenizer with add_prefix_space false and use_regex as wanted
static inline int tok_json_byte_level(const JsonValue *pt, const char *prefix, int use_regex, char *err, size_t errn) {
    int space = 0, regex = 0;
    if (tok_json_object(pt, prefix, err, errn) != 0 || tok_json_is(pt, prefix, "type", "ByteLevel", err, errn) != 0 ||
        tok_json_bool(pt, prefix, "add_prefix_space", -1, &space, err, errn) != 0 ||
        tok_json_bool(pt, prefix, "use_regex", 1, &regex, err, errn) != 0) return -1;
    if (space) return tok_fail(err, errn, "%sadd_prefix_space is true; only false is supported", prefix);
    if (regex != use_regex)
        return tok_fail(err, errn, "%suse_regex is %s; only %s is supported here", prefix, regex ? "true" : "false", use_regex ? "true" : "false");
    return 0;
}

// pre_tokenizer: Llama-3's or GPT-2's (Tokenizer.pretok)
static inline int tok_json_pretok(Tokenizer *t, const JsonValue *root, char *err, size_t errn) {
    static const char *const supported = "only Llama-3's (a Sequence of Split and ByteLevel) and GPT-2's (ByteLevel) are supported";
    const JsonValue *pt = json_get(root, "pre_tokenizer");
    char s[260];
    if (!pt || pt->type == JSON_NULL) return tok_fail(err, errn, "pre_tokenizer is null; %s", supported);
    if (tok_json_object(pt, "pre_tokenizer.", err, errn) != 0) return -1;
    const JsonValue *type = json_get(pt, "type");
    if (type && type->type == JSON_STRING && strcmp(type->string, "ByteLevel") == 0) {
        t->pretok = TOK_PRE_GPT2;
        return tok_json_byte_level(pt, "pre_tokenizer.", 1, err, errn);
    }
    if (tok_json_is(pt, "pre_tokenizer.", "type", "Sequence", err, errn) != 0) {
        return tok_fail(err, errn, "pre_tokenizer.type is %s; %s", tok_json_show(s, sizeof s, type), supported);
    }
    const JsonValue *list = json_get(pt, "pretokenizers");
    if (!list || list->type != JSON_ARRAY || list->count != 2)
        return tok_fail(err, errn, "pre_tokenizer.pretokenizers is %s%s; only Llama-3's [Split, ByteLevel] is supported",
                        tok_json_show(s, sizeof s, list), list && list->type == JSON_ARRAY ? " of another length" : "");
    const JsonValue *split = &list->items[0];
    const char *sp = "pre_tokenizer.pretokenizers[0].";
    const JsonValue *regex = json_get(json_get(split, "pattern"), "Regex");
    int invert = 0;
    if (tok_json_object(split, sp, err, errn) != 0 || tok_json_is(split, sp, "type", "Split", err, errn) != 0 ||
        tok_json_object(json_get(split, "pattern"), "pre_tokenizer.pretokenizers[0].pattern.", err, errn) != 0) return -1;
    if (regex && regex->type == JSON_STRING && (regex->string_len != strlen(TOK_LLAMA3_PATTERN) || memcmp(regex->string, TOK_LLAMA3_PATTERN, regex->string_len)))
        return tok_fail(err, errn, "%spattern.Regex is \"%.*s\"%s: not Llama-3's (llama.cpp's \"llama-bpe\"), the one split regex supported",
                        sp, (int)(regex->string_len < 300 ? regex->string_len : 300), regex->string, regex->string_len > 300 ? "..." : "");
    if (tok_json_is(json_get(split, "pattern"), "pre_tokenizer.pretokenizers[0].pattern.", "Regex", TOK_LLAMA3_PATTERN, err, errn) != 0 ||
        tok_json_is(split, sp, "behavior", "Isolated", err, errn) != 0 ||
        tok_json_bool(split, sp, "invert", -1, &invert, err, errn) != 0) return -1;
    if (invert) return tok_fail(err, errn, "%sinvert is true; only false is supported", sp);
    t->pretok = TOK_PRE_LLAMA3;
    return tok_json_byte_level(&list->items[1], "pre_tokenizer.pretokenizers[1].", 0, err, errn);
}

// the top level's fields other than the model and added tokens
static inline int tok_json_pipeline(Tokenizer *t, const JsonValue *root, char *err, size_t errn) {
    const JsonValue *version = json_get(root, "version");
    if (version && tok_json_is(root, "", "version", "1.0", err, errn) != 0) return -1;
    if (tok_json_null(root, "", "truncation", "only null is supported", err, errn) != 0 ||
        tok_json_null(root, "", "padding", "only null is supported", err, errn) != 0 ||
        tok_json_null(root, "", "normalizer", "only null (no normalizer) is supported", err, errn) != 0 ||
        tok_json_pretok(t, root, err, errn) != 0) return -1;
    const JsonValue *dec = json_get(root, "decoder");
    char s[260];
    if (!dec || dec->type == JSON_NULL) return tok_fail(err, errn, "decoder is null; only ByteLevel is supported");
    if (tok_json_object(dec, "decoder.", err, errn) != 0) return -1;
    if (tok_json_is(dec, "decoder.", "type", "ByteLevel", err, errn) != 0)
        return tok_fail(err, errn, "decoder.type is %s; only \"ByteLevel\" is supported", tok_json_show(s, sizeof s, json_get(dec, "type")));
    return 0;
}

// stores piece id, s[0..n), in t->strings (at *used) and the hash table; -1 if the
// table already has it (in the normal or reserved map as asked; *other: that id)
static inline int tok_json_add_piece(Tokenizer *t, int id, const char *s, size_t n, int reserved, size_t *used, int *other) {
    if (!t->pieces[id]) {
        memcpy(t->strings + *used, s, n);
        t->strings[*used + n] = 0;
        t->pieces[id] = t->strings + *used;
        t->piece_len[id] = (int)n;
        *used += n + 1;
    }
    return tok_table_insert(t, t->pieces[id], n, id, reserved, other);
}

// model.vocab: ids 0..n-1, each once
static inline int tok_json_vocab(Tokenizer *t, const JsonValue *vocab, size_t *used, char *err, size_t errn) {
    char q[200], q2[200], s[260];
    for (int i = 0; i < vocab->count; i++) {
        const char *key = vocab->keys[i];
        size_t kl = vocab->key_lens[i];
        long long id;
        if (json_as_int(&vocab->items[i], &id) != JSON_OK)
            return tok_fail(err, errn, "model.vocab[\"%s\"] is %s, not an integer id", tok_quote(q, key, kl), tok_json_show(s, sizeof s, &vocab->items[i]));
        if (id < 0 || id >= vocab->count)
            return tok_fail(err, errn, "model.vocab[\"%s\"] is %lld, outside 0..%d: the ids must number the %d entries without gaps",
                            tok_quote(q, key, kl), id, vocab->count - 1, vocab->count);
        if (kl > TOKENIZER_MAX_PIECE_LEN)
            return tok_fail(err, errn, "model.vocab[\"%s\"] is %zu bytes long, more than the %d allowed", tok_quote(q, key, kl), kl, TOKENIZER_MAX_PIECE_LEN);
        if (t->pieces[id])
            return tok_fail(err, errn, "model.vocab gives id %lld to both \"%s\" and \"%s\"", id,
                            tok_quote(q, t->pieces[id], (size_t)t->piece_len[id]), tok_quote(q2, key, kl));
        int other;
        if (tok_json_add_piece(t, (int)id, key, kl, 0, used, &other) != 0)
            return tok_fail(err, errn, "model.vocab has \"%s\" twice", tok_quote(q, key, kl));
    }
    return 0;
}

static inline size_t tok_merge_slot(uint64_t key, size_t mask) {
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 24) & mask;
}

// the merge of ids a and b, NULL if none. The table always has empty slots, so this ends.
static inline const TokMerge *tok_merge_find(const Tokenizer *t, int a, int b) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (size_t i = tok_merge_slot(key, t->merges_mask);; i = (i + 1) & t->merges_mask) {
        const TokMerge *m = &t->merges[i];
        if (m->id < 0) return NULL;
        if (m->key == key) return m;
    }
}

// the model vocab's id of s[0..n), -1 if none
static inline int tok_vocab_id(const Tokenizer *t, const char *s, size_t n) {
    const TokSlot *e = tok_find(t, s, n);
    return e ? e->normal : -1;
}

// model.merges: "a b" strings (lines starting "#version" skipped, as in merges.txt)
// or ["a", "b"] pairs, in rank order; a, b and a+b must be in the vocab
static inline int tok_json_merges(Tokenizer *t, const JsonValue *merges, char *err, size_t errn) {
    char q[200], q2[200], s[260];
    size_t size = 16;
    while (size < 2 * (size_t)merges->count) size *= 2;
    t->merges = (TokMerge *)malloc(size * sizeof(TokMerge));
    char *cat = (char *)malloc(2 * TOKENIZER_MAX_PIECE_LEN);
    if (!t->merges || !cat) { free(cat); return tok_fail(err, errn, "out of memory"); }
    t->merges_mask = size - 1;
    for (size_t i = 0; i < size; i++) t->merges[i].id = -1;
    int legacy = merges->count > 0 && merges->items[0].type == JSON_STRING, rc = 0;
    uint32_t rank = 0;
    for (int i = 0; i < merges->count && rc == 0; i++) {
        const JsonValue *m = &merges->items[i];
        const char *a, *b;
        size_t al, bl;
        if (legacy) {
            if (m->type != JSON_STRING) { rc = tok_fail(err, errn, "model.merges[%d] is %s, but model.merges[0] is a string: one form for all", i, tok_json_show(s, sizeof s, m)); break; }
            if (m->string_len >= 8 && memcmp(m->string, "#version", 8) == 0) continue;
            const char *sp = (const char *)memchr(m->string, ' ', m->string_len);
            if (!sp || memchr(sp + 1, ' ', m->string_len - (size_t)(sp + 1 - m->string))) {
                rc = tok_fail(err, errn, "model.merges[%d] %s is not two tokens with one space between", i, tok_json_show(s, sizeof s, m));
                break;
            }
            a = m->string; al = (size_t)(sp - a); b = sp + 1; bl = m->string_len - al - 1;
        } else {
            if (m->type != JSON_ARRAY || m->count != 2 || m->items[0].type != JSON_STRING || m->items[1].type != JSON_STRING) {
                rc = tok_fail(err, errn, "model.merges[%d] is %s, not a pair of strings like model.merges[0]", i, tok_json_show(s, sizeof s, m));
                break;
            }
            a = m->items[0].string; al = m->items[0].string_len; b = m->items[1].string; bl = m->items[1].string_len;
        }
        int ia = tok_vocab_id(t, a, al), ib = tok_vocab_id(t, b, bl), id = -1;
        if (ia >= 0 && ib >= 0) { // a and b are in the vocab, so each fits in cat
            memcpy(cat, a, al); memcpy(cat + al, b, bl);
            id = tok_vocab_id(t, cat, al + bl);
        }
        if (ia < 0 || ib < 0 || id < 0) {
            rc = tok_fail(err, errn, "model.merges[%d] (\"%s\", \"%s\"): %s is not in model.vocab", i, tok_quote(q, a, al), tok_quote(q2, b, bl),
                          ia < 0 ? "the first" : ib < 0 ? "the second" : "their concatenation");
            break;
        }
        uint64_t key = (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib;
        size_t k = tok_merge_slot(key, t->merges_mask);
        while (t->merges[k].id >= 0 && t->merges[k].key != key) k = (k + 1) & t->merges_mask;
        t->merges[k].key = key; t->merges[k].rank = rank++; t->merges[k].id = id; // a pair listed again: the later rank
    }
    free(cat);
    return rc;
}

// model: BPE with its options, the vocab (ids 0..n-1) and the merges
static inline int tok_json_model(Tokenizer *t, const JsonValue *model, size_t *used, char *err, size_t errn) {
    char s[260];
    int byte_fallback = 0;
    if (tok_json_object(model, "model.", err, errn) != 0 || tok_json_is(model, "model.", "type", "BPE", err, errn) != 0 ||
        tok_json_null(model, "model.", "dropout", "only null (no dropout) is supported", err, errn) != 0 ||
        tok_json_null(model, "model.", "continuing_subword_prefix", "only null is supported", err, errn) != 0 ||
        tok_json_null(model, "model.", "end_of_word_suffix", "only null is supported", err, errn) != 0 ||
        tok_json_bool(model, "model.", "byte_fallback", 0, &byte_fallback, err, errn) != 0 ||
        tok_json_bool(model, "model.", "fuse_unk", 0, &t->fuse_unk, err, errn) != 0 ||
        tok_json_bool(model, "model.", "ignore_merges", 0, &t->ignore_merges, err, errn) != 0) return -1;
    if (byte_fallback) return tok_fail(err, errn, "model.byte_fallback is true; only false (byte-level BPE) is supported");
    const JsonValue *vocab = json_get(model, "vocab"), *merges = json_get(model, "merges"), *unk = json_get(model, "unk_token");
    if (tok_json_object(vocab, "model.vocab.", err, errn) != 0) return -1;
    if (vocab->count == 0) return tok_fail(err, errn, "model.vocab is empty");
    if (!merges || merges->type != JSON_ARRAY) return tok_fail(err, errn, "model.merges is %s, not an array", tok_json_show(s, sizeof s, merges));
    if (tok_json_vocab(t, vocab, used, err, errn) != 0 || tok_json_merges(t, merges, err, errn) != 0) return -1;
    t->unk_internal = -1;
    if (unk && unk->type != JSON_NULL) {
        if (unk->type != JSON_STRING) return tok_fail(err, errn, "model.unk_token is %s, not a string or null", tok_json_show(s, sizeof s, unk));
        t->unk_internal = tok_vocab_id(t, unk->string, unk->string_len);
        if (t->unk_internal < 0) return tok_fail(err, errn, "model.unk_token %s is not in model.vocab", tok_json_show(s, sizeof s, unk));
    }
    t->unk_id = t->unk_internal;
    return 0;
}

// added_tokens: each one's id as tokenizers assigns them, its flags in t->literal
static inline int tok_json_added(Tokenizer *t, const JsonValue *added, int n_model, size_t *used, char *err, size_t errn) {
    char q[200], s[260], prefix[64];
    int next_id = n_model; // tokens not in the vocab get the next ids, in order
    for (int i = 0; added && i < added->count; i++) {
        const JsonValue *a = &added->items[i];
        snprintf(prefix, sizeof prefix, "added_tokens[%d].", i);
        int single_word = 0, lstrip = 0, rstrip = 0, normalized = 0, special = 0;
        long long id;
        if (tok_json_object(a, prefix, err, errn) != 0 ||
            tok_json_bool(a, prefix, "single_word", -1, &single_word, err, errn) != 0 ||
            tok_json_bool(a, prefix, "lstrip", -1, &lstrip, err, errn) != 0 ||
            tok_json_bool(a, prefix, "rstrip", -1, &rstrip, err, errn) != 0 ||
            tok_json_bool(a, prefix, "normalized", -1, &normalized, err, errn) != 0 ||
            tok_json_bool(a, prefix, "special", -1, &special, err, errn) != 0) return -1;
        const JsonValue *content = json_get(a, "content");
        if (!content || content->type != JSON_STRING) return tok_fail(err, errn, "%scontent is %s, not a string", prefix, tok_json_show(s, sizeof s, content));
        if (json_get_int(a, "id", &id) != JSON_OK) return tok_fail(err, errn, "%sid is %s, not an integer", prefix, tok_json_show(s, sizeof s, json_get(a, "id")));
        const char *c = content->string;
        size_t cl = content->string_len;
        if (cl == 0) continue; // tokenizers ignores an empty one
        if (cl > TOKENIZER_MAX_PIECE_LEN) return tok_fail(err, errn, "%scontent is %zu bytes long, more than the %d allowed", prefix, cl, TOKENIZER_MAX_PIECE_LEN);
        if (single_word) return tok_fail(err, errn, "%ssingle_word is true (\"%s\"); only false is supported", prefix, tok_quote(q, c, cl));
        int want = tok_vocab_id(t, c, cl);
        if (want < 0) want = next_id++;
        if (id != want)
            return tok_fail(err, errn, "%sid is %lld for \"%s\", but tokenizers gives it id %d (a content in model.vocab keeps "
                            "its id there; the others get the ids after the vocab's, in order)", prefix, id, tok_quote(q, c, cl), want);
        int other;
        if (tok_json_add_piece(t, want, c, cl, 1, used, &other) != 0)
            return tok_fail(err, errn, "%scontent \"%s\" is also an earlier added token's", prefix, tok_quote(q, c, cl));
        t->literal[want] = (unsigned char)((normalized ? TOK_LIT_PASS2 : TOK_LIT_PASS1) | (lstrip ? TOK_LIT_LSTRIP : 0) |
                                           (rstrip ? TOK_LIT_RSTRIP : 0));
    }
    t->vocab_size = next_id;
    return 0;
}

// what each id decodes to (dec, dec_off): ByteLevel's decoder maps each character
// of the piece back to its byte, or, when a character is none of the 256, takes
// the piece's own UTF-8 bytes (added tokens such as "<|eot_id|>" map either way)
static inline int tok_json_build_decode(Tokenizer *t, char *err, size_t errn) {
    int byte_of[0x144]; // the inverse of tok_byte_char
    for (int c = 0; c < 0x144; c++) byte_of[c] = -1;
    for (int b = 0; b < 256; b++) byte_of[tok_byte_char(b)] = b;
    size_t total = 0;
    for (int id = 0; id < t->vocab_size; id++) total += (size_t)t->piece_len[id];
    t->dec = (char *)malloc(total + 1);
    t->dec_off = (size_t *)malloc(((size_t)t->vocab_size + 1) * sizeof(size_t));
    if (!t->dec || !t->dec_off) return tok_fail(err, errn, "out of memory");
    size_t o = 0;
    for (int id = 0; id < t->vocab_size; id++) {
        const unsigned char *p = (const unsigned char *)t->pieces[id];
        size_t n = (size_t)t->piece_len[id], start = o, l;
        t->dec_off[id] = o;
        for (size_t i = 0; i < n; i += l) {
            uint32_t c = tok_cp(p, i, &l);
            if (c >= 0x144 || byte_of[c] < 0) { o = start; memcpy(t->dec + o, p, n); o += n; break; }
            t->dec[o++] = (char)byte_of[c];
        }
    }
    t->dec_off[t->vocab_size] = o;
    for (int b = 0; b < 256; b++) { // the id each byte starts as
        char u[2];
        t->byte_ids[b] = tok_vocab_id(t, u, tok_put_byte_char(u, b));
    }
    return 0;
}

// loads a tokenizer.json from its parsed document; on failure writes a message into err and returns -1
static inline int tok_json_read(Tokenizer *t, const JsonValue *root, size_t len, char *err, size_t errn) {
    char s[260];
    if (tok_json_object(root, "", err, errn) != 0 || tok_json_pipeline(t, root, err, errn) != 0) return -1;
    const JsonValue *model = json_get(root, "model"), *vocab = json_get(model, "vocab"), *added = json_get(root, "added_tokens");
    if (added && added->type == JSON_NULL) added = NULL;
    if (added && added->type != JSON_ARRAY) return tok_fail(err, errn, "added_tokens is %s, not an array", tok_json_show(s, sizeof s, added));
    if (vocab && vocab->type == JSON_OBJECT && (size_t)vocab->count + (added ? (size_t)added->count : 0) > TOKENIZER_MAX_PIECES)
        return tok_fail(err, errn, "model.vocab and added_tokens have more than %d entries; not a tokenizer this code supports", TOKENIZER_MAX_PIECES);
    // room for every entry (an added token may be new), the strings bounded by the file size
    size_t cap = (size_t)(vocab && vocab->type == JSON_OBJECT ? vocab->count : 0) + (added ? (size_t)added->count : 0), used = 0;
    t->kind = TOKENIZER_BPE_JSON;
    t->pieces = (char **)calloc(cap + 1, sizeof(char *));
    t->piece_len = (int *)calloc(cap + 1, sizeof(int));
    t->literal = (unsigned char *)calloc(cap + 1, 1);
    t->strings = (char *)malloc(len + cap + 1);
    if (!t->pieces || !t->piece_len || !t->literal || !t->strings || tok_table_alloc(t, cap) != 0) return tok_fail(err, errn, "out of memory");
    if (tok_json_model(t, model, &used, err, errn) != 0 || tok_json_added(t, added, vocab->count, &used, err, errn) != 0 ||
        tok_json_build_decode(t, err, errn) != 0 || tok_build_literals(t, &t->lit[0], TOK_LIT_PASS1, err, errn) != 0 ||
        tok_build_literals(t, &t->lit[1], TOK_LIT_PASS2, err, errn) != 0) return -1;
    t->bos_id = t->eos_id = t->pad_id = -1;
    return 0;
}

static inline int tok_json_load(Tokenizer *t, const unsigned char *data, size_t len, char *err, size_t errn) {
    JsonValue root;
    char jerr[300];
    if (json_parse((const char *)data, len, &root, jerr, sizeof jerr) != 0) return tok_fail(err, errn, "not valid JSON: %s", jerr);
    int rc = tok_json_read(t, &root, len, err, errn);
    json_free(&root);
    return rc;
}

// ----------------------------------------------------------------------------
// tokenizer.json: the pre-tokenizer regexes, as hand-written matchers
//
// Each returns where the pre-token that starts at s[i] ends (i < end; s[i..end)
// valid UTF-8), choosing as the regex engine does: the first alternative that
// matches at i, each quantifier greedy with backtracking. Every character is
// matched by some alternative, so the pre-tokens tile the text.
// Llama-3:  (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//           ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// GPT-2:    's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+

enum { TOK_CLASS_OTHER, TOK_CLASS_LETTER, TOK_CLASS_NUMBER, TOK_CLASS_SPACE };

static inline int tok_in_ranges(uint32_t c, const uint32_t (*r)[2], int n) {
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (c < r[mid][0]) hi = mid - 1;
        else if (c > r[mid][1]) lo = mid + 1;
        else return 1;
    }
    return 0;
}

#define TOK_RANGES(r) (r), (int)(sizeof(r) / sizeof((r)[0]))

// \p{L}, \p{N}, \s or none of them (support/unicode_tables.h)
static inline int tok_class(uint32_t c) {
    if (c < 0x80) {
        if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return TOK_CLASS_LETTER;
        if (c >= '0' && c <= '9') return TOK_CLASS_NUMBER;
        if (c == ' ' || (c >= 0x09 && c <= 0x0D)) return TOK_CLASS_SPACE;
        return TOK_CLASS_OTHER;
    }
    if (tok_in_ranges(c, TOK_RANGES(uni_letter))) return TOK_CLASS_LETTER;
    if (tok_in_ranges(c, TOK_RANGES(uni_number))) return TOK_CLASS_NUMBER;
    if (tok_in_ranges(c, TOK_RANGES(uni_space))) return TOK_CLASS_SPACE;
    return TOK_CLASS_OTHER;
}

static inline int tok_class_at(const unsigned char *s, size_t i) {
    size_t l;
    return tok_class(tok_cp(s, i, &l));
}

// what (?i:) folds c to among Llama-3's contraction letters, else 0
static inline int tok_fold(uint32_t c) {
    for (size_t k = 0; k < sizeof(uni_fold) / sizeof(uni_fold[0]); k++)
        if (uni_fold[k][0] == c) return (int)uni_fold[k][1];
    return 0;
}

// the end of the run of characters of class cls from i, at most max of them
static inline size_t tok_run(const unsigned char *s, size_t i, size_t end, int cls, int max) {
    for (int k = 0; i < end && k < max; k++) {
        size_t l;
        if (tok_class(tok_cp(s, i, &l)) != cls) break;
        i += l;
    }
    return i;
}

// the whitespace alternatives at i (a whitespace character). Llama-3's
// \s*[\r\n]+ (newlines set): \s* takes the whole run, then gives back up to its
// last \r or \n. \s+(?!\S): the run at the end of the text, else the run but its
// last character (which then starts the next pre-token: " word"), which needs
// two; \s+ the run of one.
static inline size_t tok_pretok_space(const unsigned char *s, size_t i, size_t end, int newlines) {
    size_t q = i, last = i, after_newline = 0;
    while (q < end) {
        size_t l;
        uint32_t c = tok_cp(s, q, &l);
        if (tok_class(c) != TOK_CLASS_SPACE) break;
        if (c == '\r' || c == '\n') after_newline = q + 1;
        last = q;
        q += l;
    }
    if (newlines && after_newline) return after_newline;
    if (q == end || last == i) return q;
    return last;
}

static inline size_t tok_pretok_llama3(const unsigned char *s, size_t i, size_t end) {
    size_t l0, l1, l2;
    uint32_t c0 = tok_cp(s, i, &l0);
    size_t i1 = i + l0;
    int k0 = tok_class(c0);
    if (c0 == '\'' && i1 < end) { // (?i:'s|'t|'re|'ve|'m|'ll|'d)
        int f1 = tok_fold(tok_cp(s, i1, &l1));
        size_t i2 = i1 + l1;
        if (f1 == 's' || f1 == 't' || f1 == 'm' || f1 == 'd') return i2;
        if ((f1 == 'r' || f1 == 'v' || f1 == 'l') && i2 < end && tok_fold(tok_cp(s, i2, &l2)) == (f1 == 'l' ? 'l' : 'e')) return i2 + l2;
    }
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (k0 == TOK_CLASS_LETTER) return tok_run(s, i, end, TOK_CLASS_LETTER, INT32_MAX);
    if (c0 != '\r' && c0 != '\n' && k0 != TOK_CLASS_NUMBER && i1 < end && tok_class_at(s, i1) == TOK_CLASS_LETTER)
        return tok_run(s, i1, end, TOK_CLASS_LETTER, INT32_MAX);
    if (k0 == TOK_CLASS_NUMBER) return tok_run(s, i, end, TOK_CLASS_NUMBER, 3); // \p{N}{1,3}
    //  ?[^\s\p{L}\p{N}]+[\r\n]*
    size_t j = c0 == ' ' && i1 < end && tok_class_at(s, i1) == TOK_CLASS_OTHER ? i1 : i;
    if (j > i || k0 == TOK_CLASS_OTHER) {
        j = tok_run(s, j, end, TOK_CLASS_OTHER, INT32_MAX);
        while (j < end && (s[j] == '\r' || s[j] == '\n')) j++;
        return j;
    }
    return tok_pretok_space(s, i, end, 1);
}

static inline size_t tok_pretok_gpt2(const unsigned char *s, size_t i, size_t end) {
    size_t l0;
    uint32_t c0 = tok_cp(s, i, &l0);
    size_t i1 = i + l0;
    if (c0 == '\'' && i1 < end) { // 's|'t|'re|'ve|'m|'ll|'d
        unsigned char a = s[i1], b = i1 + 1 < end ? s[i1 + 1] : 0;
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return i1 + 1;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i1 + 2;
    }
    //  ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+: a space joins the run of one class that follows it
    size_t j = i;
    int k = tok_class(c0);
    if (c0 == ' ' && i1 < end && tok_class_at(s, i1) != TOK_CLASS_SPACE) { j = i1; k = tok_class_at(s, i1); }
    if (k != TOK_CLASS_SPACE) return tok_run(s, j, end, k, INT32_MAX);
    return tok_pretok_space(s, i, end, 0);
}

// ----------------------------------------------------------------------------
// tokenizer.json: encoding, as tokenizers' encode(text, add_special_tokens=False)
//
// Text that is not valid UTF-8 (the library only takes str) is first decoded
// as Python's bytes.decode("utf-8", errors="replace") does: each maximal
// ill-formed part becomes U+FFFD. Then: added tokens split the text (those with
// normalized false first, then those with normalized true in the text between),
// the pre-tokenizer's regex splits each stretch between them into pre-tokens,
// and each pre-token, as bytes, is merged by rank (tokenizers' BPE::merge_word).

typedef struct { int *ids; size_t n, cap; int oom; } TokIds;

static inline void tok_ids_push(TokIds *o, int id) {
    if (o->n == o->cap) {
        size_t nc = o->cap ? 2 * o->cap : 64;
        int *ni = (int *)realloc(o->ids, nc * sizeof(int));
        if (!ni) { o->oom = 1; return; }
        o->ids = ni; o->cap = nc;
    }
    o->ids[o->n++] = id;
}

typedef struct {
    const Tokenizer *t;
    const unsigned char *text; // the whole text, valid UTF-8
    TokBPE bpe;                // the merging of one pre-token (sym: room for the longest)
    char *mapped;              // a pre-token in byte-level characters (2 bytes per byte at most)
    TokIds out;
} TokJsonEncoder;

// queues the merge of two neighbouring symbols if model.merges has their pair
static inline void tok_bpe_add_pair(TokBPE *b, int left, int right) {
    if (left < 0 || right < 0) return;
    const TokMerge *m = tok_merge_find(b->t, b->sym[left].id, b->sym[right].id);
    if (!m) return;
    TokPair p;
    p.key = ((uint64_t)m->rank << 32) | (uint32_t)left; p.right = right; p.size = b->sym[left].len + b->sym[right].len; p.id = m->id;
    tok_heap_push(b, p);
}

// one pre-token s[0..n): with ignore_merges, the whole of it if it is in the
// vocab; else each byte's character (one unknown to the vocab becomes
// unk_token, consecutive ones fused with fuse_unk, or is dropped without an
// unk_token), then merges by rank
static inline void tok_bpe_word(TokJsonEncoder *e, const unsigned char *s, size_t n) {
    const Tokenizer *t = e->t;
    TokBPE *b = &e->bpe;
    if (t->ignore_merges) {
        size_t m = 0;
        for (size_t k = 0; k < n; k++) m += tok_put_byte_char(e->mapped + m, s[k]);
        int id = tok_vocab_id(t, e->mapped, m);
        if (id >= 0) { tok_ids_push(&e->out, id); return; }
    }
    int ns = 0, last_unknown = 0;
    for (size_t k = 0; k < n; k++) {
        int id = t->byte_ids[s[k]], unknown = id < 0;
        if (unknown && t->unk_internal < 0) continue;
        if (unknown && last_unknown && t->fuse_unk) { b->sym[ns - 1].len++; continue; }
        if (unknown) id = t->unk_internal;
        TokSymbol y; y.pos = (int)k; y.len = 1; y.prev = ns - 1; y.next = ns + 1; y.freeze = 0; y.id = id;
        b->sym[ns++] = y;
        last_unknown = unknown;
    }
    if (ns == 0) return;
    b->sym[ns - 1].next = -1;
    b->n_heap = 0;
    tok_merge_all(b, 0, ns - 1);
    for (int i = 0; i >= 0; i = b->sym[i].next) tok_ids_push(&e->out, b->sym[i].id);
}

// text[s0..s1) split into pre-tokens, each encoded
static inline void tok_bpe_pretokenize(TokJsonEncoder *e, size_t s0, size_t s1) {
    for (size_t i = s0; i < s1;) {
        size_t j = e->t->pretok == TOK_PRE_LLAMA3 ? tok_pretok_llama3(e->text, i, s1) : tok_pretok_gpt2(e->text, i, s1);
        tok_bpe_word(e, e->text + i, j - i);
        i = j;
    }
}

// text[s0..s1) with the added tokens of pass (0, 1) matched first, as tokenizers'
// AddedVocabulary::find_matches: leftmost, then longest; each match may take the
// whitespace before it (lstrip, not past the previous match) and after it
// (rstrip); the stretches between go to the next pass
static inline void tok_bpe_segment(TokJsonEncoder *e, size_t s0, size_t s1, int pass) {
    const Tokenizer *t = e->t;
    if (pass == 2 || t->lit[pass].n_lens == 0) { tok_bpe_pretokenize(e, s0, s1); return; }
    const unsigned char *x = e->text;
    size_t done = s0; // the end of the last match (with its strip)
    for (size_t i = s0; i < s1;) {
        int id;
        size_t l = tok_match_literal(t, &t->lit[pass], pass == 0 ? TOK_LIT_PASS1 : TOK_LIT_PASS2, (const char *)x + i, s1 - i, &id);
        if (!l) { i++; continue; }
        size_t start = i, stop = i + l, cl;
        i = stop; // the next match is looked for after this one, whatever the strips take
        if (t->literal[id] & TOK_LIT_LSTRIP)
            while (start > done) { // back over whitespace characters, not into the previous match
                size_t k = start - 1;
                while (k > done && (x[k] & 0xC0) == 0x80) k--;
                if (tok_class(tok_cp(x, k, &cl)) != TOK_CLASS_SPACE) break;
                start = k;
            }
        if (t->literal[id] & TOK_LIT_RSTRIP)
            while (stop < s1 && tok_class(tok_cp(x, stop, &cl)) == TOK_CLASS_SPACE) stop += cl;
        if (done < start) tok_bpe_segment(e, done, start, pass + 1);
        tok_ids_push(&e->out, id);
        done = stop;
    }
    if (done < s1) tok_bpe_segment(e, done, s1, pass + 1);
}

// tokenizer_encode for a tokenizer.json
static inline int *tok_bpe_encode(const Tokenizer *t, const char *text, size_t len, int bos, int eos, int *n_out) {
    TokJsonEncoder e;
    memset(&e, 0, sizeof e);
    e.t = t;
    char *clean = (char *)malloc(3 * len + 1);
    size_t n = clean ? tok_utf8_lossy((const unsigned char *)text, len, clean) : 0;
    e.text = (const unsigned char *)clean;
    e.bpe.t = t; e.bpe.add_pair = tok_bpe_add_pair;
    e.bpe.sym = (TokSymbol *)malloc((n + 1) * sizeof(TokSymbol));
    e.mapped = (char *)malloc(2 * n + 1);
    e.out.cap = n + 2; // nearly always enough: each id but BOS/EOS stands for a byte or more
    e.out.ids = (int *)malloc(e.out.cap * sizeof(int));
    e.out.oom = !clean || !e.bpe.sym || !e.mapped || !e.out.ids;
    if (!e.out.oom && bos && t->bos_id >= 0) tok_ids_push(&e.out, t->bos_id);
    if (!e.out.oom) tok_bpe_segment(&e, 0, n, 0);
    if (!e.out.oom && eos && t->eos_id >= 0) tok_ids_push(&e.out, t->eos_id);
    free(clean); free(e.bpe.sym); free(e.bpe.heap); free(e.mapped);
    if (e.out.oom || e.bpe.oom) { free(e.out.ids); return NULL; }
    *n_out = (int)e.out.n;
    return e.out.ids;
}

// tokenizer_decode for a tokenizer.json: each id's bytes (tok_json_build_decode),
// joined, with ill-formed UTF-8 replaced by U+FFFD as Rust's from_utf8_lossy does
static inline char *tok_bpe_decode(const Tokenizer *t, const int *ids, int n, size_t *len_out) {
    size_t total = 0;
    for (int i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < t->vocab_size) total += t->dec_off[ids[i] + 1] - t->dec_off[ids[i]];
    char *raw = (char *)malloc(total + 1), *out = (char *)malloc(3 * total + 1);
    if (!raw || !out) { free(raw); free(out); return NULL; }
    size_t o = 0;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->vocab_size) continue;
        size_t a = t->dec_off[ids[i]], l = t->dec_off[ids[i] + 1] - a;
        memcpy(raw + o, t->dec + a, l);
        o += l;
    }
    o = tok_utf8_lossy((const unsigned char *)raw, total, out);
    free(raw);
    out[o] = 0;
    if (len_out) *len_out = o;
    return out;
}

// ----------------------------------------------------------------------------
// the API, for both formats

static inline void tokenizer_free(Tokenizer *t) {
    if (!t) return;
    free(t->strings); free(t->pieces); free(t->piece_len); free(t->table); free(t->literal);
    free(t->lit[0].lens); free(t->lit[1].lens);
    free(t->scores); free(t->rank); free(t->types); free(t->canon); free(t->unused_slot); free(t->byte_of);
    free(t->edges); free(t->unk_surface);
    free(t->merges); free(t->dec); free(t->dec_off);
    memset(t, 0, sizeof(*t));
    t->bos_id = t->eos_id = t->unk_id = t->pad_id = -1;
}

// is this a tokenizer.json (else a sentencepiece model)? A name ending in
// ".json" says so, else the content: a JSON object starts with '{' (a
// ModelProto with its pieces first, as sentencepiece writes it, with 0x0A)
static inline int tokenizer_is_json(const char *name, const unsigned char *data, size_t len) {
    size_t nl = name ? strlen(name) : 0;
    if (nl >= 5 && strcmp(name + nl - 5, ".json") == 0) return 1;
    return len > 0 && data && data[0] == '{';
}

// Llama-3's original download has a tiktoken tokenizer.model: lines of "<base64 token> <rank>"
// (Llama-2's is a sentencepiece protobuf). 1 when data starts with such a line.
static inline int tokenizer_is_tiktoken(const unsigned char *data, size_t len) {
    size_t b = 0, d = 0;
    while (b < len && (((data[b] | 32) >= 'a' && (data[b] | 32) <= 'z') || (data[b] >= '0' && data[b] <= '9') || data[b] == '+' ||
                       data[b] == '/' || data[b] == '=')) b++;
    if (b == 0 || b >= len || data[b] != ' ') return 0;
    while (b + 1 + d < len && data[b + 1 + d] >= '0' && data[b + 1 + d] <= '9') d++;
    return d > 0 && b + 1 + d < len && data[b + 1 + d] == '\n';
}

// parses a tokenizer file held in memory (the only function that parses),
// name being its path (it picks the format, tokenizer_is_json, and names the
// file in messages). 0 on success; on failure prints
// "error: tokenizer <name>: <problem>", returns -1 and leaves *t empty (nothing allocated).
static inline int tokenizer_load_from_memory(Tokenizer *t, const unsigned char *data, size_t len, const char *name) {
    char err[600];
    memset(t, 0, sizeof(*t));
    if (!data) len = 0;
    int rc = -1;
    if (len == 0) snprintf(err, sizeof err, "file is empty");
    else if (len > TOKENIZER_MAX_FILE_SIZE) snprintf(err, sizeof err, "file is %zu bytes, larger than the %zu allowed", len, TOKENIZER_MAX_FILE_SIZE);
    else if (tokenizer_is_tiktoken(data, len))
        snprintf(err, sizeof err, "a tiktoken vocabulary (Llama-3's original download) is not read: give the model's Hugging Face "
                 "folder, whose tokenizer.json is");
    else rc = tokenizer_is_json(name, data, len) ? tok_json_load(t, data, len, err, sizeof err) : tok_sp_load(t, data, len, err, sizeof err);
    if (rc != 0) {
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

// encodes len bytes of text (any bytes) into a malloc'd array of ids, *n_out
// of them; bos/eos prepend/append BOS/EOS when the model has them (bos_id,
// eos_id >= 0). Returns NULL only when out of memory (or text is over
// TOKENIZER_MAX_TEXT bytes).
static inline int *tokenizer_encode(const Tokenizer *t, const char *text, size_t len, int bos, int eos, int *n_out) {
    *n_out = 0;
    if (!text) len = 0;
    if (len > TOKENIZER_MAX_TEXT) return NULL;
    return t->kind == TOKENIZER_BPE_JSON ? tok_bpe_encode(t, text, len, bos, eos, n_out)
                                         : tok_sp_encode(t, text, len, bos, eos, t->add_dummy_prefix, n_out);
}

// text that follows a special token within one sequence, as transformers encodes it
// (Llama-2's tokenizer_config.json "legacy": false): sentencepiece's without the dummy
// prefix; a tokenizer.json has none to leave out
static inline int *tokenizer_encode_continued(const Tokenizer *t, const char *text, size_t len, int *n_out) {
    *n_out = 0;
    if (!text) len = 0;
    if (len > TOKENIZER_MAX_TEXT) return NULL;
    return t->kind == TOKENIZER_BPE_JSON ? tok_bpe_encode(t, text, len, 0, 0, n_out) : tok_sp_encode(t, text, len, 0, 0, 0, n_out);
}

// decodes ids into a malloc'd NUL-terminated string, *len_out its length (it
// may contain NUL bytes); NULL if out of memory. Ids outside [0, vocab_size)
// are skipped as if absent (sentencepiece raises an error instead; tokenizers
// skips them too). Special and added tokens decode to their text (tokenizers'
// skip_special_tokens=False; sentencepiece drops control pieces).
static inline char *tokenizer_decode(const Tokenizer *t, const int *ids, int n, size_t *len_out) {
    if (len_out) *len_out = 0;
    if (!ids || n < 0) n = 0;
    return t->kind == TOKENIZER_BPE_JSON ? tok_bpe_decode(t, ids, n, len_out) : tok_sp_decode(t, ids, n, len_out);
}

// the piece string of id, NULL if out of range: sentencepiece's (with ▁ for
// spaces, "<0x41>" for byte pieces), tokenizer.json's vocab entry (in
// byte-level characters: "Ġthe") or added token content ("<|eot_id|>")
static inline const char *tokenizer_piece(const Tokenizer *t, int id) {
    return (id >= 0 && id < t->vocab_size) ? t->pieces[id] : NULL;
}

// the id of a piece, -1 if there is none: as sentencepiece's PieceToId (but
// -1, not <unk>, when absent) or tokenizers' token_to_id (an added token's id
// first, then the vocab's): tokenizer_token_id(t, "<|eot_id|>")
static inline int tokenizer_token_id(const Tokenizer *t, const char *piece) {
    if (!piece || !t->table) return -1;
    const TokSlot *e = tok_find(t, piece, strlen(piece));
    return !e ? -1 : e->reserved >= 0 ? e->reserved : e->normal;
}


#endif // TOKENIZER_H
