// json.h: a small DOM parser for JSON (RFC 8259) and a JSON string writer.
// Single header, C99, also compiles as C++ (the CUDA trainer includes it).
//
// The parser takes a memory buffer (not NUL-terminated) because it reads
// untrusted input (safetensors headers, index files, configs) and is fuzzed:
//   - strings must be valid UTF-8; escapes incl. \uXXXX surrogate pairs are
//     decoded to UTF-8; lone surrogates and raw control characters are refused
//   - strings may hold NUL (via \u0000), so every string keeps its length
//   - numbers follow the RFC grammar exactly (no leading zeros, no "1.", no
//     hex, no NaN/Infinity) and become doubles; integer literals that fit in
//     a long long are also kept exactly (JsonValue.integer), so offsets above
//     2^53 are not silently rounded
//   - nesting is limited to JSON_MAX_DEPTH (stack safety) and a document to
//     JSON_MAX_VALUES values (memory: a value takes ~80 bytes of DOM for as
//     little as 2 bytes of text, so "[0,0,..." would otherwise grow ~40x);
//     trailing garbage, trailing commas and empty input are errors
// Errors read like "offset 17 (line 2, column 5): expected ':' after object key".
// Duplicate object keys are kept (json_get returns the first); callers that
// must refuse them (safetensors) call json_find_duplicate_key.
#ifndef JSON_H
#define JSON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdarg.h>
#include <stddef.h>
#include <locale.h>

#ifndef JSON_MAX_DEPTH
#define JSON_MAX_DEPTH 64
#endif
#ifndef JSON_MAX_VALUES
#define JSON_MAX_VALUES (1 << 22) // 4M values: at most ~0.5 GB of DOM
#endif

#if defined(__GNUC__)
#define JSON__PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define JSON__PRINTF(a, b)
#endif

typedef enum { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } JsonType;

typedef struct JsonValue {
    JsonType type;
    int boolean;              // JSON_BOOL: 0 or 1
    double number;            // JSON_NUMBER: the value, correctly rounded by strtod
    int is_int;               // JSON_NUMBER: 1 if the literal was an integer that fits a long long
    long long integer;        // ... and then its exact value
    char *string;             // JSON_STRING: UTF-8, NUL-terminated, but may contain NUL:
    size_t string_len;        //   use string_len
    struct JsonValue *items;  // JSON_ARRAY: elements; JSON_OBJECT: values (parallel to keys)
    char **keys;              // JSON_OBJECT: keys, NUL-terminated (may contain NUL: see key_lens)
    size_t *key_lens;         // JSON_OBJECT: key lengths
    int count;                // JSON_ARRAY / JSON_OBJECT: number of items
} JsonValue;

// return codes of the typed getters
#define JSON_OK 0
#define JSON_MISSING (-1)    // obj is not an object, or the key is absent
#define JSON_WRONG_TYPE (-2) // present but of another type (or not a representable integer)

static inline const char *json_type_name(JsonType t) {
    switch (t) {
    case JSON_NULL: return "null";
    case JSON_BOOL: return "boolean";
    case JSON_NUMBER: return "number";
    case JSON_STRING: return "string";
    case JSON_ARRAY: return "array";
    case JSON_OBJECT: return "object";
    }
    return "?";
}

// ----------------------------------------------------------------------------
// parser internals

typedef struct {
    const unsigned char *s;
    size_t len, pos;
    int depth;
    long values;   // values started so far (bounded by JSON_MAX_VALUES)
    char *err;
    size_t errlen;
} JsonParser;

// records "offset N (line L, column C): message" for the byte at `at`.
// Line and column are computed only here, so the happy path pays nothing.
static inline int json__fail_at(JsonParser *p, size_t at, const char *fmt, ...) JSON__PRINTF(3, 4);
static inline int json__fail_at(JsonParser *p, size_t at, const char *fmt, ...) {
    if (!p->err || p->errlen == 0) return -1;
    size_t line = 1, col = 1;
    for (size_t i = 0; i < at && i < p->len; i++) {
        if (p->s[i] == '\n') { line++; col = 1; } else col++;
    }
    int n = snprintf(p->err, p->errlen, "offset %zu (line %zu, column %zu): ", at, line, col);
    if (n >= 0 && (size_t)n < p->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(p->err + n, p->errlen - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return -1;
}

// a printable description of the byte at pos, for "unexpected ..." messages
static inline const char *json__describe(JsonParser *p, size_t pos, char *buf, size_t n) {
    if (pos >= p->len) { snprintf(buf, n, "end of input"); return buf; }
    unsigned char c = p->s[pos];
    if (c >= 0x21 && c < 0x7f) snprintf(buf, n, "character '%c'", c);
    else snprintf(buf, n, "byte 0x%02x", c);
    return buf;
}

static inline void json__skip_ws(JsonParser *p) {
    while (p->pos < p->len) {
        unsigned char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

// length (1..4) of the well-formed UTF-8 sequence at s (n bytes available),
// or 0 if it is malformed: overlong forms, surrogates (U+D800..DFFF) and
// code points above U+10FFFF are all refused (Unicode Table 3-7).
static inline int json__utf8_len(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    int len;
    unsigned char lo = 0x80, hi = 0xBF; // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c == 0xE0) { len = 3; lo = 0xA0; }
    else if (c >= 0xE1 && c <= 0xEC) len = 3;
    else if (c == 0xED) { len = 3; hi = 0x9F; }
    else if (c >= 0xEE && c <= 0xEF) len = 3;
    else if (c == 0xF0) { len = 4; lo = 0x90; }
    else if (c >= 0xF1 && c <= 0xF3) len = 4;
    else if (c == 0xF4) { len = 4; hi = 0x8F; }
    else return 0;
    if (n < (size_t)len) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (int i = 2; i < len; i++) if (s[i] < 0x80 || s[i] > 0xBF) return 0;
    return len;
}

static inline int json__hex4(const unsigned char *s, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

static inline size_t json__put_utf8(char *d, unsigned cp) {
    if (cp < 0x80) { d[0] = (char)cp; return 1; }
    if (cp < 0x800) { d[0] = (char)(0xC0 | (cp >> 6)); d[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        d[0] = (char)(0xE0 | (cp >> 12)); d[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        d[2] = (char)(0x80 | (cp & 0x3F)); return 3;
    }
    d[0] = (char)(0xF0 | (cp >> 18)); d[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    d[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); d[3] = (char)(0x80 | (cp & 0x3F)); return 4;
}

// parses the string starting at the '"' at p->pos into a fresh buffer.
// The decoded string is never longer than its source text, so one scan for
// the closing quote sizes the buffer and the second pass decodes/validates.
static inline int json__parse_string(JsonParser *p, char **out, size_t *out_len) {
    size_t start = p->pos, i = start + 1;
    while (i < p->len && p->s[i] != '"') i += (p->s[i] == '\\') ? 2 : 1;
    if (i >= p->len) return json__fail_at(p, start, "unterminated string");
    size_t end = i; // index of the closing quote
    char *d = (char *)malloc(end - start);
    if (!d) return json__fail_at(p, start, "out of memory");
    size_t n = 0;
    i = start + 1;
    while (i < end) {
        unsigned char c = p->s[i];
        if (c < 0x20) {
            free(d);
            return json__fail_at(p, i, "control character 0x%02x in string (must be escaped)", c);
        }
        if (c >= 0x80) {
            int l = json__utf8_len(p->s + i, end - i);
            if (!l) { free(d); return json__fail_at(p, i, "invalid UTF-8 in string"); }
            memcpy(d + n, p->s + i, (size_t)l);
            n += (size_t)l; i += (size_t)l;
            continue;
        }
        if (c != '\\') { d[n++] = (char)c; i++; continue; }
        unsigned char e = p->s[i + 1]; // exists: the scan above never stops between '\' and its escape
        switch (e) {
        case '"': d[n++] = '"'; i += 2; break;
        case '\\': d[n++] = '\\'; i += 2; break;
        case '/': d[n++] = '/'; i += 2; break;
        case 'b': d[n++] = '\b'; i += 2; break;
        case 'f': d[n++] = '\f'; i += 2; break;
        case 'n': d[n++] = '\n'; i += 2; break;
        case 'r': d[n++] = '\r'; i += 2; break;
        case 't': d[n++] = '\t'; i += 2; break;
        case 'u': {
            unsigned cp, lo;
            if (end - i < 6 || json__hex4(p->s + i + 2, &cp) != 0) {
                free(d);
                return json__fail_at(p, i, "invalid \\u escape: expected 4 hex digits");
            }
            if (cp >= 0xDC00 && cp <= 0xDFFF) {
                free(d);
                return json__fail_at(p, i, "unpaired low surrogate \\u%04X in string", cp);
            }
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                // a high surrogate must be followed by an escaped low surrogate
                if (end - i < 12 || p->s[i + 6] != '\\' || p->s[i + 7] != 'u' ||
                    json__hex4(p->s + i + 8, &lo) != 0 || lo < 0xDC00 || lo > 0xDFFF) {
                    free(d);
                    return json__fail_at(p, i, "high surrogate \\u%04X not followed by a \\u low surrogate", cp);
                }
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                i += 6;
            }
            n += json__put_utf8(d + n, cp);
            i += 6;
            break;
        }
        default:
            free(d);
            if (e >= 0x21 && e < 0x7f) return json__fail_at(p, i, "invalid escape '\\%c' in string", e);
            return json__fail_at(p, i, "invalid escape (byte 0x%02x after '\\') in string", e);
        }
    }
    d[n] = 0;
    p->pos = end + 1;
    *out = d;
    *out_len = n;
    return 0;
}

static inline int json__is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

static inline int json__parse_number(JsonParser *p, JsonValue *out) {
    size_t start = p->pos, i = start;
    const unsigned char *s = p->s;
    int neg = 0, is_int = 1;
    if (s[i] == '-') { neg = 1; i++; }
    if (i >= p->len || !json__is_digit(s[i])) return json__fail_at(p, start, "'-' must be followed by a digit");
    if (s[i] == '0' && i + 1 < p->len && json__is_digit(s[i + 1]))
        return json__fail_at(p, start, "leading zeros are not allowed in numbers");
    // integer part, accumulated exactly while it fits in 64 bits
    unsigned long long mag = 0;
    int overflow = 0;
    while (i < p->len && json__is_digit(s[i])) {
        unsigned d = (unsigned)(s[i] - '0');
        if (mag > (~0ULL - d) / 10) overflow = 1;
        else mag = mag * 10 + d;
        i++;
    }
    if (i < p->len && s[i] == '.') {
        is_int = 0;
        i++;
        if (i >= p->len || !json__is_digit(s[i])) return json__fail_at(p, i, "expected a digit after '.' in number");
        while (i < p->len && json__is_digit(s[i])) i++;
    }
    if (i < p->len && (s[i] == 'e' || s[i] == 'E')) {
        is_int = 0;
        i++;
        if (i < p->len && (s[i] == '+' || s[i] == '-')) i++;
        if (i >= p->len || !json__is_digit(s[i])) return json__fail_at(p, i, "expected a digit in number exponent");
        while (i < p->len && json__is_digit(s[i])) i++;
    }
    // |integer| <= 2^53 converts to double exactly: skip strtod
    if (is_int && !overflow && mag <= (1ULL << 53)) {
        out->type = JSON_NUMBER;
        out->is_int = 1;
        out->integer = neg ? -(long long)mag : (long long)mag;
        out->number = neg ? -(double)mag : (double)mag; // keeps "-0" negative
        p->pos = i;
        return 0;
    }
    if (is_int && !overflow) { // above 2^53 the double is rounded: keep the exact integer too
        if (!neg && mag <= 9223372036854775807ULL) { out->is_int = 1; out->integer = (long long)mag; }
        if (neg && mag <= 9223372036854775808ULL) {
            out->is_int = 1;
            out->integer = mag == 9223372036854775808ULL ? (-9223372036854775807LL - 1) : -(long long)mag;
        }
    }
    // strtod needs a NUL-terminated copy; it also honours the locale's decimal
    // point, so '.' is replaced by it (the process may have called setlocale)
    const char *dp = localeconv()->decimal_point;
    if (!dp || !dp[0]) dp = ".";
    size_t dpl = strlen(dp), len = i - start;
    char small[128];
    char *buf = len + dpl < sizeof small ? small : (char *)malloc(len + dpl + 1);
    if (!buf) return json__fail_at(p, start, "out of memory");
    size_t k = 0;
    for (size_t j = start; j < i; j++) {
        if (s[j] == '.') { memcpy(buf + k, dp, dpl); k += dpl; }
        else buf[k++] = (char)s[j];
    }
    buf[k] = 0;
    char *endp = NULL;
    double v = strtod(buf, &endp);
    int consumed = endp == buf + k;
    if (buf != small) free(buf);
    if (!consumed) return json__fail_at(p, start, "cannot convert number");
    if (v > 1.7976931348623157e308 || v < -1.7976931348623157e308)
        return json__fail_at(p, start, "number out of the range of a double");
    out->type = JSON_NUMBER;
    out->number = v;
    p->pos = i;
    return 0;
}

static inline int json__parse_value(JsonParser *p, JsonValue *out);

static inline int json__enter(JsonParser *p) {
    if (++p->depth > JSON_MAX_DEPTH) return json__fail_at(p, p->pos, "nesting deeper than %d levels", JSON_MAX_DEPTH);
    return 0;
}

// grows an array of `size`-byte elements to hold at least n+1 entries
static inline int json__grow(void **arr, int *cap, int n, size_t size) {
    if (n < *cap) return 0;
    if (n >= 0x3fffffff) return -1; // count is an int
    int nc = *cap ? *cap * 2 : 4;
    void *na = realloc(*arr, (size_t)nc * size);
    if (!na) return -1;
    *arr = na;
    *cap = nc;
    return 0;
}

static inline int json__parse_array(JsonParser *p, JsonValue *out) {
    size_t open = p->pos;
    if (json__enter(p)) return -1;
    out->type = JSON_ARRAY;
    p->pos++;
    json__skip_ws(p);
    int cap = 0;
    if (p->pos < p->len && p->s[p->pos] == ']') { p->pos++; p->depth--; return 0; }
    for (;;) {
        void *items = out->items;
        if (json__grow(&items, &cap, out->count, sizeof(JsonValue))) {
            json__fail_at(p, p->pos, "out of memory (array too large)");
            break;
        }
        out->items = (JsonValue *)items;
        if (json__parse_value(p, &out->items[out->count])) break;
        out->count++;
        json__skip_ws(p);
        if (p->pos < p->len && p->s[p->pos] == ',') {
            p->pos++;
            json__skip_ws(p);
            if (p->pos < p->len && p->s[p->pos] == ']') { json__fail_at(p, p->pos, "trailing comma before ']'"); break; }
            continue;
        }
        if (p->pos < p->len && p->s[p->pos] == ']') { p->pos++; p->depth--; return 0; }
        char d[32];
        if (p->pos >= p->len) json__fail_at(p, open, "unterminated array (no matching ']')");
        else json__fail_at(p, p->pos, "expected ',' or ']' after array element, got %s", json__describe(p, p->pos, d, sizeof d));
        break;
    }
    return -1; // the caller frees the partial value
}

static inline int json__parse_object(JsonParser *p, JsonValue *out) {
    size_t open = p->pos;
    if (json__enter(p)) return -1;
    out->type = JSON_OBJECT;
    p->pos++;
    json__skip_ws(p);
    int cap = 0, cap_k = 0, cap_l = 0;
    char d[32];
    if (p->pos < p->len && p->s[p->pos] == '}') { p->pos++; p->depth--; return 0; }
    for (;;) {
        if (p->pos >= p->len) { json__fail_at(p, open, "unterminated object (no matching '}')"); break; }
        if (p->s[p->pos] != '"') {
            json__fail_at(p, p->pos, "expected a string key in object, got %s", json__describe(p, p->pos, d, sizeof d));
            break;
        }
        void *items = out->items, *keys = out->keys, *lens = out->key_lens;
        int g = json__grow(&items, &cap, out->count, sizeof(JsonValue));
        out->items = (JsonValue *)items;
        g = g || json__grow(&keys, &cap_k, out->count, sizeof(char *));
        out->keys = (char **)keys;
        g = g || json__grow(&lens, &cap_l, out->count, sizeof(size_t));
        out->key_lens = (size_t *)lens;
        if (g) { json__fail_at(p, p->pos, "out of memory (object too large)"); break; }
        char *key;
        size_t klen;
        if (json__parse_string(p, &key, &klen)) break;
        json__skip_ws(p);
        if (p->pos >= p->len || p->s[p->pos] != ':') {
            free(key);
            json__fail_at(p, p->pos, "expected ':' after object key, got %s", json__describe(p, p->pos, d, sizeof d));
            break;
        }
        p->pos++;
        if (json__parse_value(p, &out->items[out->count])) { free(key); break; }
        out->keys[out->count] = key;
        out->key_lens[out->count] = klen;
        out->count++;
        json__skip_ws(p);
        if (p->pos < p->len && p->s[p->pos] == ',') {
            p->pos++;
            json__skip_ws(p);
            if (p->pos < p->len && p->s[p->pos] == '}') { json__fail_at(p, p->pos, "trailing comma before '}'"); break; }
            continue;
        }
        if (p->pos < p->len && p->s[p->pos] == '}') { p->pos++; p->depth--; return 0; }
        if (p->pos >= p->len) json__fail_at(p, open, "unterminated object (no matching '}')");
        else json__fail_at(p, p->pos, "expected ',' or '}' after object member, got %s", json__describe(p, p->pos, d, sizeof d));
        break;
    }
    return -1;
}

static inline int json__match(JsonParser *p, const char *lit) {
    size_t n = strlen(lit);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, lit, n) != 0) return 0;
    p->pos += n;
    return 1;
}

static inline void json_free(JsonValue *v);

// on failure *out is freed and reset to JSON_NULL
static inline int json__parse_value(JsonParser *p, JsonValue *out) {
    memset(out, 0, sizeof *out);
    json__skip_ws(p);
    if (p->pos >= p->len) return json__fail_at(p, p->pos, "unexpected end of input, expected a value");
    if (++p->values > JSON_MAX_VALUES) return json__fail_at(p, p->pos, "more than %d values in one document", JSON_MAX_VALUES);
    int r;
    unsigned char c = p->s[p->pos];
    char d[32];
    switch (c) {
    case '{': r = json__parse_object(p, out); break;
    case '[': r = json__parse_array(p, out); break;
    case '"':
        out->type = JSON_STRING;
        r = json__parse_string(p, &out->string, &out->string_len);
        break;
    case 't': case 'f': case 'n':
        if (json__match(p, "true")) { out->type = JSON_BOOL; out->boolean = 1; return 0; }
        if (json__match(p, "false")) { out->type = JSON_BOOL; return 0; }
        if (json__match(p, "null")) return 0;
        return json__fail_at(p, p->pos, "invalid literal (expected true, false or null)");
    default:
        if (c == '-' || json__is_digit(c)) { r = json__parse_number(p, out); break; }
        return json__fail_at(p, p->pos, "unexpected %s, expected a value", json__describe(p, p->pos, d, sizeof d));
    }
    if (r) json_free(out);
    return r;
}

// ----------------------------------------------------------------------------
// public API

// Parses text[0..len) (no NUL terminator needed). 0 ok, -1 error: *out is
// JSON_NULL and err (if errlen > 0) holds the message.
static inline int json_parse(const char *text, size_t len, JsonValue *out, char *err, size_t errlen) {
    JsonParser p;
    p.s = (const unsigned char *)text;
    p.len = text ? len : 0;
    p.pos = 0;
    p.depth = 0;
    p.values = 0;
    p.err = err;
    p.errlen = errlen;
    if (err && errlen) err[0] = 0;
    memset(out, 0, sizeof *out);
    json__skip_ws(&p);
    if (p.pos >= p.len) return json__fail_at(&p, p.pos, "empty input, expected a JSON value");
    if (json__parse_value(&p, out)) return -1;
    json__skip_ws(&p);
    if (p.pos < p.len) {
        char d[32];
        json_free(out);
        return json__fail_at(&p, p.pos, "unexpected %s after the JSON value", json__describe(&p, p.pos, d, sizeof d));
    }
    return 0;
}

// frees everything v owns and resets it to JSON_NULL (safe on a zeroed value)
static inline void json_free(JsonValue *v) {
    if (!v) return;
    free(v->string);
    for (int i = 0; i < v->count; i++) {
        if (v->items) json_free(&v->items[i]);
        if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->key_lens);
    memset(v, 0, sizeof *v);
}

// index of key in obj (first match), or -1
static inline int json_find(const JsonValue *obj, const char *key) {
    if (!obj || obj->type != JSON_OBJECT || !key) return -1;
    size_t n = strlen(key);
    for (int i = 0; i < obj->count; i++)
        if (obj->key_lens[i] == n && memcmp(obj->keys[i], key, n) == 0) return i;
    return -1;
}

// the value of key in obj (first match); NULL if absent or obj is not an object
static inline const JsonValue *json_get(const JsonValue *obj, const char *key) {
    int i = json_find(obj, key);
    return i < 0 ? NULL : &obj->items[i];
}

typedef struct { const char *k; size_t n; int i; } JsonKeyRef;
static inline int json__keycmp(const void *a, const void *b) {
    const JsonKeyRef *x = (const JsonKeyRef *)a, *y = (const JsonKeyRef *)b;
    size_t n = x->n < y->n ? x->n : y->n;
    int c = memcmp(x->k, y->k, n);
    if (c) return c;
    if (x->n != y->n) return x->n < y->n ? -1 : 1;
    return x->i < y->i ? -1 : (x->i > y->i);
}

// Index of a key that appears more than once in obj (its second occurrence),
// or -1 if all keys are distinct or obj is not an object. O(n log n), so a
// hostile header with a million keys cannot make it quadratic.
static inline int json_find_duplicate_key(const JsonValue *obj) {
    if (!obj || obj->type != JSON_OBJECT || obj->count < 2) return -1;
    int n = obj->count, dup = -1;
    JsonKeyRef *r = (JsonKeyRef *)malloc((size_t)n * sizeof *r);
    if (!r) { // out of memory: fall back to the quadratic scan
        for (int i = 1; i < n; i++)
            for (int j = 0; j < i; j++)
                if (obj->key_lens[i] == obj->key_lens[j] && memcmp(obj->keys[i], obj->keys[j], obj->key_lens[i]) == 0) return i;
        return -1;
    }
    for (int i = 0; i < n; i++) { r[i].k = obj->keys[i]; r[i].n = obj->key_lens[i]; r[i].i = i; }
    qsort(r, (size_t)n, sizeof *r, json__keycmp);
    for (int i = 1; i < n; i++)
        if (r[i].n == r[i - 1].n && memcmp(r[i].k, r[i - 1].k, r[i].n) == 0) { dup = r[i].i; break; }
    free(r);
    return dup;
}

// v as an exact long long: 0 ok, JSON_WRONG_TYPE if v is not a number or not
// an integer that a long long holds exactly. Accepts 3 and 3.0e0; a double
// beyond 2^53 is refused unless it was written as an integer literal (then
// is_int holds its exact value).
static inline int json_as_int(const JsonValue *v, long long *out) {
    if (!v || v->type != JSON_NUMBER) return JSON_WRONG_TYPE;
    if (v->is_int) { *out = v->integer; return JSON_OK; }
    double x = v->number;
    if (!(x >= -9007199254740992.0 && x <= 9007199254740992.0)) return JSON_WRONG_TYPE;
    long long i = (long long)x;
    if ((double)i != x) return JSON_WRONG_TYPE;
    *out = i;
    return JSON_OK;
}

static inline int json_get_number(const JsonValue *obj, const char *key, double *out) {
    const JsonValue *v = json_get(obj, key);
    if (!v) return JSON_MISSING;
    if (v->type != JSON_NUMBER) return JSON_WRONG_TYPE;
    *out = v->number;
    return JSON_OK;
}

// integral number that fits a long long (callers check narrower ranges)
static inline int json_get_int(const JsonValue *obj, const char *key, long long *out) {
    const JsonValue *v = json_get(obj, key);
    if (!v) return JSON_MISSING;
    return json_as_int(v, out);
}

static inline int json_get_bool(const JsonValue *obj, const char *key, int *out) {
    const JsonValue *v = json_get(obj, key);
    if (!v) return JSON_MISSING;
    if (v->type != JSON_BOOL) return JSON_WRONG_TYPE;
    *out = v->boolean;
    return JSON_OK;
}

// *out points into the DOM (valid until json_free). If len is NULL the string
// must not contain NUL (else JSON_WRONG_TYPE), so C-string callers are safe.
static inline int json_get_string(const JsonValue *obj, const char *key, const char **out, size_t *len) {
    const JsonValue *v = json_get(obj, key);
    if (!v) return JSON_MISSING;
    if (v->type != JSON_STRING) return JSON_WRONG_TYPE;
    if (!len && strlen(v->string) != v->string_len) return JSON_WRONG_TYPE;
    *out = v->string;
    if (len) *len = v->string_len;
    return JSON_OK;
}

// ----------------------------------------------------------------------------
// writing JSON strings

// output sink: a FILE, or a buffer of cap bytes (n counts what would be written)
typedef struct { FILE *f; char *buf; size_t cap, n; } JsonOut;
static inline void json__out(JsonOut *o, const char *s, size_t n) {
    if (o->f) fwrite(s, 1, n, o->f);
    else if (o->buf && o->n < o->cap) {
        size_t k = o->cap - o->n < n ? o->cap - o->n : n;
        memcpy(o->buf + o->n, s, k);
    }
    o->n += n;
}

// Quoted, escaped form of s[0..len). Control characters and DEL are escaped;
// bytes that are not valid UTF-8 become U+FFFD, so the output is always
// valid JSON whatever the input.
static inline void json__escape(JsonOut *o, const char *s, size_t len) {
    const unsigned char *u = (const unsigned char *)s;
    json__out(o, "\"", 1);
    size_t i = 0;
    while (i < len) {
        unsigned char c = u[i];
        char e[8];
        const char *rep = NULL;
        switch (c) {
        case '"': rep = "\\\""; break;
        case '\\': rep = "\\\\"; break;
        case '\b': rep = "\\b"; break;
        case '\f': rep = "\\f"; break;
        case '\n': rep = "\\n"; break;
        case '\r': rep = "\\r"; break;
        case '\t': rep = "\\t"; break;
        default: break;
        }
        if (rep) { json__out(o, rep, 2); i++; continue; }
        if (c < 0x20 || c == 0x7f) { snprintf(e, sizeof e, "\\u%04x", c); json__out(o, e, 6); i++; continue; }
        int l = json__utf8_len(u + i, len - i);
        if (!l) { json__out(o, "\\ufffd", 6); i++; continue; }
        json__out(o, s + i, (size_t)l);
        i += (size_t)l;
    }
    json__out(o, "\"", 1);
}

static inline void json_write_stringn(FILE *f, const char *s, size_t len) {
    JsonOut o;
    o.f = f; o.buf = NULL; o.cap = 0; o.n = 0;
    json__escape(&o, s, len);
}

// writes s as a quoted, escaped JSON string (for metrics and config writers)
static inline void json_write_string(FILE *f, const char *s) { json_write_stringn(f, s, strlen(s)); }

// snprintf-style: writes at most cap bytes of the quoted form of s[0..len) to
// dst (not NUL-terminated) and returns its full length; dst may be NULL to measure
static inline size_t json_escape_string(char *dst, size_t cap, const char *s, size_t len) {
    JsonOut o;
    o.f = NULL; o.buf = dst; o.cap = dst ? cap : 0; o.n = 0;
    json__escape(&o, s, len);
    return o.n;
}

#endif // JSON_H
