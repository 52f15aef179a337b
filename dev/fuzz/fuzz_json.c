// json_parse on arbitrary bytes. A document that parses is written back out
// (strings through json_escape_string, numbers exactly) and parsed again: the
// two trees must be identical. The getters and json_find_duplicate_key run on
// every object.
#include "../../support/json.h"
#include "fuzz.h"
#include <math.h>

typedef struct { char *p; size_t n, cap; } Buf;
static void put(Buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 256;
        while (nc < b->n + n + 1) nc *= 2;
        b->p = (char *)realloc(b->p, nc);
        FUZZ_ASSERT(b->p != NULL);
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}
static void put_string(Buf *b, const char *s, size_t len) {
    size_t need = json_escape_string(NULL, 0, s, len);
    char *tmp = (char *)malloc(need);
    FUZZ_ASSERT(tmp != NULL && json_escape_string(tmp, need, s, len) == need);
    put(b, tmp, need);
    free(tmp);
}

static void serialize(Buf *b, const JsonValue *v) {
    char num[64];
    switch (v->type) {
    case JSON_NULL: put(b, "null", 4); break;
    case JSON_BOOL: put(b, v->boolean ? "true" : "false", v->boolean ? 4 : 5); break;
    case JSON_NUMBER:
        if (v->is_int) snprintf(num, sizeof num, "%lld", v->integer);
        else {
            snprintf(num, sizeof num, "%.17g", v->number);
            if (!strpbrk(num, ".e")) strcat(num, ".0"); // keep it a non-integer literal
        }
        if (v->is_int && v->integer == 0 && signbit(v->number)) snprintf(num, sizeof num, "-0");
        put(b, num, strlen(num));
        break;
    case JSON_STRING: put_string(b, v->string, v->string_len); break;
    case JSON_ARRAY:
        put(b, "[", 1);
        for (int i = 0; i < v->count; i++) { if (i) put(b, ",", 1); serialize(b, &v->items[i]); }
        put(b, "]", 1);
        break;
    case JSON_OBJECT:
        put(b, "{", 1);
        for (int i = 0; i < v->count; i++) {
            if (i) put(b, ",", 1);
            put_string(b, v->keys[i], v->key_lens[i]);
            put(b, ":", 1);
            serialize(b, &v->items[i]);
        }
        put(b, "}", 1);
        break;
    }
}

static int same(const JsonValue *a, const JsonValue *b) {
    if (a->type != b->type) return 0;
    switch (a->type) {
    case JSON_NULL: return 1;
    case JSON_BOOL: return a->boolean == b->boolean;
    case JSON_NUMBER:
        return memcmp(&a->number, &b->number, sizeof(double)) == 0 && a->is_int == b->is_int &&
               (!a->is_int || a->integer == b->integer);
    case JSON_STRING: return a->string_len == b->string_len && memcmp(a->string, b->string, a->string_len) == 0 && b->string[b->string_len] == 0;
    case JSON_ARRAY:
    case JSON_OBJECT:
        if (a->count != b->count) return 0;
        for (int i = 0; i < a->count; i++) {
            if (a->type == JSON_OBJECT &&
                (a->key_lens[i] != b->key_lens[i] || memcmp(a->keys[i], b->keys[i], a->key_lens[i]) != 0)) return 0;
            if (!same(&a->items[i], &b->items[i])) return 0;
        }
        return 1;
    }
    return 0;
}

// the typed getters on every key of every object, and the duplicate finder
static void walk(const JsonValue *v) {
    if (v->type == JSON_OBJECT) {
        int dup = json_find_duplicate_key(v);
        FUZZ_ASSERT(dup == -1 || (dup > 0 && dup < v->count));
        for (int i = 0; i < v->count; i++) {
            if (strlen(v->keys[i]) != v->key_lens[i]) continue; // C-string getters cannot name it
            long long ll; double d; int bo; const char *s; size_t sl;
            json_get_int(v, v->keys[i], &ll);
            json_get_number(v, v->keys[i], &d);
            json_get_bool(v, v->keys[i], &bo);
            json_get_string(v, v->keys[i], &s, NULL);
            if (json_get_string(v, v->keys[i], &s, &sl) == JSON_OK) FUZZ_ASSERT(s[sl] == 0);
            FUZZ_ASSERT(json_get(v, v->keys[i]) != NULL);
        }
    }
    if (v->type == JSON_ARRAY || v->type == JSON_OBJECT)
        for (int i = 0; i < v->count; i++) walk(&v->items[i]);
}

FUZZ_TARGET(json) {
    JsonValue v, w;
    char err[256];
    int r = json_parse((const char *)data, size, &v, err, sizeof err);
    if (r != 0) {
        FUZZ_ASSERT(r == -1 && v.type == JSON_NULL && strncmp(err, "offset ", 7) == 0);
        return 0;
    }
    walk(&v);
    Buf b = {0};
    serialize(&b, &v);
    int r2 = json_parse(b.p, b.n, &w, err, sizeof err);
    if (r2 != 0) { fprintf(stderr, "re-parse failed: %s\n%.*s\n", err, (int)b.n, b.p); abort(); }
    FUZZ_ASSERT(same(&v, &w));
    free(b.p);
    json_free(&v);
    json_free(&w);
    return 0;
}
