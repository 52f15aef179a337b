// Tests for json.h: valid documents, every rejection with its message, the
// typed getters, duplicate keys, the string writer, a small mutation fuzz, and
// the size limits (values per document; json_load_file's file size, utils.h).
//   gcc -O2 -Wall -Wextra -Wno-unused-function -std=c11 -o /tmp/test_json test/test_json.c -lm && /tmp/test_json
#define _POSIX_C_SOURCE 200809L // mkstemp, ftruncate, dup2 for the file-size limit test
#include "../support/json.h"
#include "../support/utils.h" // json_load_file, read_file_max
#include "test_common.h"
#include <stdint.h>
#include <fcntl.h>

static JsonValue parse_ok(const char *what, const char *text, size_t len) {
    JsonValue v;
    char err[256];
    int r = json_parse(text, len, &v, err, sizeof err);
    CHECK(r == 0, what, "json_parse failed: %s", err);
    return v;
}
#define PARSE_OK(what, lit) parse_ok((what), (lit), sizeof(lit) - 1)

// the document must be refused with a message containing `want`
static void parse_bad(const char *text, size_t len, const char *want) {
    JsonValue v;
    char err[256], what[160];
    memset(err, 'X', sizeof err);
    int r = json_parse(text, len, &v, err, sizeof err);
    char shown[48];
    size_t k = 0;
    for (size_t i = 0; i < len && k + 5 < sizeof shown; i++) {
        unsigned char c = (unsigned char)text[i];
        k += (size_t)snprintf(shown + k, sizeof shown - k, (c >= 0x20 && c < 0x7f) ? "%c" : "\\x%02x", c);
    }
    shown[k] = 0;
    snprintf(what, sizeof what, "rejects %s", shown);
    CHECK(r == -1 && v.type == JSON_NULL && strstr(err, want) != NULL && strstr(err, "offset ") == err, what,
          "r=%d err='%s' (want '%s')", r, r ? err : "", want);
}
#define BAD(lit, want) parse_bad((lit), sizeof(lit) - 1, (want))

static void test_valid(void) {
    JsonValue v = PARSE_OK("parse nested document",
                           " {\"a\": 1, \"b\": [true, false, null], \"c\": \"x\\ny\", \"d\": {\"e\": -1.5e3}, \"f\": [], \"g\": {}}\r\n\t");
    CHECK(v.type == JSON_OBJECT && v.count == 6, "object with 6 members", "type %d count %d", v.type, v.count);
    const JsonValue *b = json_get(&v, "b");
    CHECK(b && b->type == JSON_ARRAY && b->count == 3 && b->items[0].type == JSON_BOOL && b->items[0].boolean == 1 &&
              b->items[1].boolean == 0 && b->items[2].type == JSON_NULL,
          "array of true, false, null", "bad array");
    const JsonValue *c = json_get(&v, "c");
    CHECK(c && c->type == JSON_STRING && c->string_len == 3 && strcmp(c->string, "x\ny") == 0, "string with \\n", "bad string");
    const JsonValue *e = json_get(json_get(&v, "d"), "e");
    CHECK(e && e->type == JSON_NUMBER && e->number == -1500.0 && !e->is_int, "nested number -1.5e3", "bad number");
    CHECK(json_get(&v, "f")->count == 0 && json_get(&v, "g")->type == JSON_OBJECT && json_get(&v, "g")->count == 0,
          "empty array and object", "bad");
    CHECK(json_get(&v, "zz") == NULL && json_get(b, "a") == NULL && json_get(NULL, "a") == NULL, "json_get absent / non-object",
          "should be NULL");

    // typed getters
    long long i = 0;
    double d = 0;
    int bo = -1;
    const char *s = NULL;
    size_t sl = 0;
    CHECK(json_get_int(&v, "a", &i) == JSON_OK && i == 1, "json_get_int ok", "i=%lld", i);
    CHECK(json_get_int(&v, "e", &i) == JSON_MISSING, "json_get_int missing", "");
    CHECK(json_get_int(&v, "c", &i) == JSON_WRONG_TYPE, "json_get_int wrong type", "");
    CHECK(json_get_number(&v, "a", &d) == JSON_OK && d == 1.0, "json_get_number ok", "");
    CHECK(json_get_number(&v, "b", &d) == JSON_WRONG_TYPE, "json_get_number wrong type", "");
    CHECK(json_get_string(&v, "c", &s, &sl) == JSON_OK && sl == 3 && s[1] == '\n', "json_get_string ok", "");
    CHECK(json_get_string(&v, "a", &s, NULL) == JSON_WRONG_TYPE, "json_get_string wrong type", "");
    CHECK(json_get_bool(&v, "a", &bo) == JSON_WRONG_TYPE && json_get_bool(&v, "x", &bo) == JSON_MISSING,
          "json_get_bool wrong type / missing", "");
    CHECK(json_get_int(b, "a", &i) == JSON_MISSING, "getter on a non-object is MISSING", "");
    json_free(&v);
    CHECK(v.type == JSON_NULL && v.items == NULL, "json_free resets", "");
    json_free(&v); // twice is harmless

    v = PARSE_OK("bool getter doc", "{\"t\": true, \"half\": 1.5, \"three\": 3.0e0, \"big\": 1e300, \"neg\": -7}");
    CHECK(json_get_bool(&v, "t", &bo) == JSON_OK && bo == 1, "json_get_bool ok", "");
    CHECK(json_get_int(&v, "half", &i) == JSON_WRONG_TYPE, "json_get_int refuses 1.5", "");
    CHECK(json_get_int(&v, "three", &i) == JSON_OK && i == 3, "json_get_int accepts 3.0e0", "");
    CHECK(json_get_int(&v, "big", &i) == JSON_WRONG_TYPE, "json_get_int refuses 1e300", "");
    CHECK(json_get_int(&v, "neg", &i) == JSON_OK && i == -7, "json_get_int negative", "");
    json_free(&v);

    // numbers
    struct { const char *text; double want; int is_int; long long integer; } nums[] = {
        {"0", 0.0, 1, 0}, {"-0", -0.0, 1, 0}, {"-123", -123.0, 1, -123}, {"0.1", 0.1, 0, 0}, {"1E+2", 100.0, 0, 0},
        {"1e-2", 0.01, 0, 0}, {"2.5e-3", 0.0025, 0, 0}, {"1.7976931348623157e308", 1.7976931348623157e308, 0, 0},
        {"5e-324", 5e-324, 0, 0}, {"1e-400", 0.0, 0, 0},
        {"9007199254740993", 9007199254740992.0, 1, 9007199254740993LL},
        {"9223372036854775807", 9223372036854775807.0, 1, 9223372036854775807LL},
        {"-9223372036854775808", -9223372036854775808.0, 1, (-9223372036854775807LL - 1)},
        {"9223372036854775808", 9223372036854775808.0, 0, 0},
        {"123456789012345678901234567890", 1.2345678901234568e29, 0, 0},
    };
    for (size_t k = 0; k < sizeof nums / sizeof nums[0]; k++) {
        char what[96];
        snprintf(what, sizeof what, "number %s", nums[k].text);
        JsonValue n;
        char err[128];
        int r = json_parse(nums[k].text, strlen(nums[k].text), &n, err, sizeof err);
        CHECK(r == 0 && n.type == JSON_NUMBER && n.number == nums[k].want && n.is_int == nums[k].is_int &&
                  (!n.is_int || n.integer == nums[k].integer) && signbit(n.number) == signbit(nums[k].want),
              what, "r=%d number=%.17g is_int=%d integer=%lld", r, n.number, n.is_int, n.integer);
        json_free(&n);
    }
    JsonValue n = PARSE_OK("big integer literal", "[9007199254740993, 1e20, 2.0]");
    long long x = 0;
    CHECK(json_as_int(&n.items[0], &x) == 0 && x == 9007199254740993LL, "json_as_int exact above 2^53", "x=%lld", x);
    CHECK(json_as_int(&n.items[1], &x) == JSON_WRONG_TYPE, "json_as_int refuses 1e20 (inexact)", "");
    CHECK(json_as_int(&n.items[2], &x) == 0 && x == 2, "json_as_int 2.0", "");
    json_free(&n);

    // strings: every escape, surrogate pairs, raw UTF-8, embedded NUL
    v = PARSE_OK("escapes", "\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"");
    CHECK(v.string_len == 8 && memcmp(v.string, "\"\\/\b\f\n\r\t", 8) == 0, "all simple escapes decode", "got len %zu", v.string_len);
    json_free(&v);
    v = PARSE_OK("unicode escapes", "\"\\u0041\\u00e9\\u20AC\\ud83d\\ude00\\uFFFF\"");
    const char *want = "A\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\xef\xbf\xbf";
    CHECK(v.string_len == strlen(want) && memcmp(v.string, want, v.string_len) == 0, "\\u escapes and surrogate pair -> UTF-8",
          "len %zu", v.string_len);
    json_free(&v);
    v = PARSE_OK("raw utf-8", "\"h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf\"");
    CHECK(v.string_len == 20, "raw UTF-8 kept (incl. U+10FFFF)", "len %zu", v.string_len);
    json_free(&v);
    v = PARSE_OK("embedded NUL", "{\"k\\u0000ey\": \"a\\u0000b\"}");
    CHECK(v.items[0].string_len == 3 && v.items[0].string[1] == 0 && v.items[0].string[2] == 'b' && v.key_lens[0] == 4,
          "\\u0000 kept with length", "");
    const char *sp;
    size_t spl;
    CHECK(json_get_string(&v, "k", &sp, &spl) == JSON_MISSING, "key with NUL does not match its prefix", "");
    json_free(&v);
    v = PARSE_OK("string with NUL value", "{\"s\": \"a\\u0000b\"}");
    CHECK(json_get_string(&v, "s", &sp, NULL) == JSON_WRONG_TYPE && json_get_string(&v, "s", &sp, &spl) == JSON_OK && spl == 3,
          "json_get_string refuses NUL without a length", "");
    json_free(&v);
    v = PARSE_OK("empty string", "\"\"");
    CHECK(v.type == JSON_STRING && v.string_len == 0 && v.string[0] == 0, "empty string", "");
    json_free(&v);

    // top-level scalars and not NUL-terminated input
    v = parse_ok("scalar from a longer buffer", "123xyz", 3);
    CHECK(v.type == JSON_NUMBER && v.number == 123, "length bounds the input", "");
    json_free(&v);

    // nesting limit: exactly JSON_MAX_DEPTH is fine
    char deep[2 * JSON_MAX_DEPTH + 2];
    for (int k = 0; k < JSON_MAX_DEPTH; k++) { deep[k] = '['; deep[2 * JSON_MAX_DEPTH - 1 - k] = ']'; }
    v = parse_ok("nesting at the limit", deep, 2 * JSON_MAX_DEPTH);
    json_free(&v);

    // duplicate keys: kept, first wins, and detectable
    v = PARSE_OK("duplicate keys", "{\"a\": 1, \"b\": 2, \"a\": 3}");
    CHECK(json_get(&v, "a")->number == 1, "json_get returns the first duplicate", "");
    CHECK(json_find_duplicate_key(&v) == 2, "json_find_duplicate_key finds it", "got %d", json_find_duplicate_key(&v));
    json_free(&v);
    v = PARSE_OK("distinct keys", "{\"a\": 1, \"ab\": 2, \"a\\u0000\": 3, \"b\": 4}");
    CHECK(json_find_duplicate_key(&v) == -1, "no duplicate among a, ab, a\\0, b", "");
    json_free(&v);
}

static void test_invalid(void) {
    BAD("", "empty input");
    BAD("  \n ", "empty input");
    BAD("{", "unterminated object");
    BAD("{\"a\":1", "unterminated object");
    BAD("[1,2", "unterminated array");
    BAD("[1,", "unexpected end of input");
    BAD("[1,]", "trailing comma");
    BAD("{\"a\":1,}", "trailing comma");
    BAD("{\"a\" 1}", "expected ':'");
    BAD("{1:2}", "expected a string key");
    BAD("{\"a\":}", "unexpected character '}'");
    BAD("[1 2]", "expected ',' or ']'");
    BAD("{\"a\":1 \"b\":2}", "expected ',' or '}'");
    BAD("01", "leading zeros");
    BAD("-01", "leading zeros");
    BAD("-", "'-' must be followed by a digit");
    BAD("-a", "'-' must be followed by a digit");
    BAD("1.", "digit after '.'");
    BAD("1.e5", "digit after '.'");
    BAD(".5", "unexpected character '.'");
    BAD("1e", "exponent");
    BAD("1e+", "exponent");
    BAD("+1", "unexpected character '+'");
    BAD("0x10", "unexpected character 'x'");
    BAD("1e999", "out of the range");
    BAD("-1e999", "out of the range");
    BAD("NaN", "unexpected character 'N'");
    BAD("Infinity", "unexpected character 'I'");
    BAD("tru", "invalid literal");
    BAD("nul", "invalid literal");
    BAD("True", "unexpected character 'T'");
    BAD("truex", "unexpected character 'x' after");
    BAD("\"abc", "unterminated string");
    BAD("\"abc\\\"", "unterminated string");
    BAD("\"a\x01 b\"", "control character 0x01");
    BAD("\"a\tb\"", "control character 0x09");
    BAD("\"a\nb\"", "control character 0x0a");
    BAD("\"\\x\"", "invalid escape '\\x'");
    BAD("\"\\'\"", "invalid escape");
    BAD("\"\\u12\"", "4 hex digits");
    BAD("\"\\u12G4\"", "4 hex digits");
    BAD("\"\\ud800\"", "high surrogate");
    BAD("\"\\ud800\\u0041\"", "high surrogate");
    BAD("\"\\ud800\\ud800\"", "high surrogate");
    BAD("\"\\ud800x\"", "high surrogate");
    BAD("\"\\udc00\"", "unpaired low surrogate");
    BAD("\"\xff\"", "invalid UTF-8");
    BAD("\"\x80\"", "invalid UTF-8");
    BAD("\"\xc0\xaf\"", "invalid UTF-8");         // overlong '/'
    BAD("\"\xe0\x80\xaf\"", "invalid UTF-8");     // overlong
    BAD("\"\xed\xa0\x80\"", "invalid UTF-8");     // encoded surrogate
    BAD("\"\xf4\x90\x80\x80\"", "invalid UTF-8"); // above U+10FFFF
    BAD("\"\xe2\x82\"", "invalid UTF-8");         // truncated sequence
    BAD("\"\xc3\"", "invalid UTF-8");
    BAD("[1] x", "unexpected character 'x' after the JSON value");
    BAD("{} {}", "after the JSON value");
    BAD("\"a\"\0", "byte 0x00 after the JSON value");
    BAD("\xef\xbb\xbf{}", "unexpected byte 0xef");
    BAD("\x00", "unexpected byte 0x00");
    BAD("[\x0b]", "unexpected byte 0x0b");
    BAD("'a'", "unexpected character");
    BAD("{\"a\":1}}", "after the JSON value");

    char deep[2 * JSON_MAX_DEPTH + 4];
    for (int k = 0; k <= JSON_MAX_DEPTH; k++) { deep[k] = '['; deep[2 * JSON_MAX_DEPTH + 1 - k] = ']'; }
    parse_bad(deep, 2 * JSON_MAX_DEPTH + 2, "nesting deeper than 64");
    char deepo[8 * JSON_MAX_DEPTH + 16];
    size_t k = 0;
    for (int j = 0; j <= JSON_MAX_DEPTH; j++) k += (size_t)sprintf(deepo + k, "{\"a\":");
    parse_bad(deepo, k, "nesting deeper than 64");

    // the location: offset, line and column of the offending byte
    JsonValue v;
    char err[128];
    json_parse("{\n  \"a\" 1}", 10, &v, err, sizeof err);
    CHECK(strncmp(err, "offset 8 (line 2, column 7): ", 29) == 0, "error names offset, line and column", "got '%s'", err);
    // tiny or missing error buffers are safe
    char tiny[8];
    CHECK(json_parse("[1,]", 4, &v, tiny, sizeof tiny) == -1 && strlen(tiny) == 7, "error message truncated safely", "");
    CHECK(json_parse("[1,]", 4, &v, NULL, 0) == -1, "error without a buffer", "");
    CHECK(json_parse(NULL, 5, &v, err, sizeof err) == -1, "NULL text refused", "");
}

static void test_write(void) {
    FILE *f = tmpfile();
    if (!f) { test_skip("json_write_string", "no tmpfile"); return; }
    json_write_string(f, "a\"b\\c\n\t\x01\x1f\x7f \xc3\xa9 \xff/");
    json_write_stringn(f, "x\0y", 3);
    rewind(f);
    char buf[256] = {0};
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    const char *want = "\"a\\\"b\\\\c\\n\\t\\u0001\\u001f\\u007f \xc3\xa9 \\ufffd/\"\"x\\u0000y\"";
    CHECK(n == strlen(want) && strcmp(buf, want) == 0, "json_write_string escapes", "got %s", buf);

    // escape -> parse is the identity for valid UTF-8, whatever the bytes
    const char *src = "tab\t nl\n quote\" bs\\ nul-free \x01\x02\x1f del\x7f \xe2\x82\xac \xf0\x9f\x98\x80";
    size_t need = json_escape_string(NULL, 0, src, strlen(src));
    char *esc = (char *)malloc(need);
    CHECK(json_escape_string(esc, need, src, strlen(src)) == need, "json_escape_string measures", "");
    JsonValue v;
    char err[128];
    int r = json_parse(esc, need, &v, err, sizeof err);
    CHECK(r == 0 && v.string_len == strlen(src) && memcmp(v.string, src, v.string_len) == 0, "escape then parse round-trips",
          "r=%d %s", r, err);
    json_free(&v);
    char small[5];
    memset(small, '#', sizeof small);
    CHECK(json_escape_string(small, 4, "abcdef", 6) == 8 && memcmp(small, "\"abc#", 5) == 0, "json_escape_string truncates at cap", "");
    free(esc);

    // every byte value 1..255 in a string survives escape -> parse as text or U+FFFD
    char all[256];
    for (int i = 1; i < 256; i++) all[i - 1] = (char)i;
    need = json_escape_string(NULL, 0, all, 255);
    esc = (char *)malloc(need);
    json_escape_string(esc, need, all, 255);
    r = json_parse(esc, need, &v, err, sizeof err);
    CHECK(r == 0 && v.string_len >= 128 && memcmp(v.string, all, 127) == 0, "all bytes escape to valid JSON", "r=%d %s", r, err);
    json_free(&v);
    free(esc);
}

// random mutations of valid documents: the parser must either succeed or
// fail with a message, never crash (run under ASan/UBSan to make this bite)
static void test_mutations(void) {
    const char *seeds[] = {
        "{\"__metadata__\":{\"format\":\"pt\"},\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}",
        "[1, -2.5e-3, true, false, null, \"\\ud83d\\ude00\\n\", {\"a\": [[], {}]}]",
        "\"h\xc3\xa9llo \\u0000 \\\" \\\\ \"",
    };
    uint64_t rng = 0x9E3779B97F4A7C15ULL;
    int bad = 0, ok = 0, n = 0;
    char buf[512];
    for (int it = 0; it < 200000; it++) {
        const char *s = seeds[it % 3];
        size_t len = strlen(s);
        memcpy(buf, s, len);
        int muts = 1 + (int)(rng % 4);
        for (int m = 0; m < muts; m++) {
            rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
            size_t pos = (size_t)(rng >> 32) % (len ? len : 1);
            switch (rng % 4) {
            case 0: buf[pos] = (char)(rng >> 24); break;                           // replace
            case 1: if (len > 1) { memmove(buf + pos, buf + pos + 1, len - pos - 1); len--; } break; // delete
            case 2: if (len < 500) { memmove(buf + pos + 1, buf + pos, len - pos); buf[pos] = "[]{}\",:\\u0e-. "[(rng >> 16) % 15]; len++; } break;
            case 3: len = pos; break; // truncate
            }
        }
        JsonValue v;
        char err[256];
        err[0] = 0;
        int r = json_parse(buf, len, &v, err, sizeof err);
        if (r == 0) { ok++; json_free(&v); }
        else if (r != -1 || strncmp(err, "offset ", 7) != 0 || v.type != JSON_NULL) bad++;
        n++;
    }
    CHECK(bad == 0, "200000 mutated documents: parse or fail with a message", "%d of %d bad (%d parsed)", bad, n, ok);
}

// size bombs: a document of many tiny values (each ~80 bytes of DOM for 2 bytes
// of text) is refused at JSON_MAX_VALUES; json_load_file refuses a file over
// JSON_FILE_MAX before reading it
static void test_limits(void) {
    size_t n = (size_t)JSON_MAX_VALUES; // the array itself is one value: n - 1 zeros fit
    char *text = (char *)malloc(2 * n + 2);
    size_t k = 0;
    text[k++] = '[';
    for (size_t i = 0; i + 1 < n; i++) { text[k++] = '0'; text[k++] = ','; }
    text[k - 1] = ']'; // the last comma closes the array
    JsonValue v;
    char err[256];
    int r = json_parse(text, k, &v, err, sizeof err);
    CHECK(r == 0 && v.type == JSON_ARRAY && v.count == JSON_MAX_VALUES - 1, "array of JSON_MAX_VALUES - 1 numbers parses",
          "r=%d count=%d %s", r, v.count, r ? err : "");
    json_free(&v);
    text[k - 1] = ',';
    text[k++] = '0';
    text[k++] = ']';
    r = json_parse(text, k, &v, err, sizeof err);
    char want[64];
    snprintf(want, sizeof want, "more than %d values in one document", JSON_MAX_VALUES);
    CHECK(r == -1 && v.type == JSON_NULL && strstr(err, want), "one value more is refused", "r=%d err='%s'", r, err);
    free(text);

    // a sparse file just over the limit: refused before any of it is read
    char path[64] = "/tmp/test_json_big_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0 && ftruncate(fd, (off_t)JSON_FILE_MAX + 1) == 0, "sparse file for json_load_file", "cannot create it");
    if (fd >= 0) close(fd);
    fflush(stderr);
    int saved = dup(2), null = open("/dev/null", O_WRONLY);
    dup2(null, 2);
    errno = 0;
    size_t len = 0;
    char *big = read_file_max(path, &len, JSON_FILE_MAX);
    int big_errno = errno;
    r = json_load_file(path, &v);
    dup2(saved, 2);
    close(saved);
    close(null);
    CHECK(big == NULL && big_errno == EFBIG && r == -1 && v.type == JSON_NULL, "json_load_file refuses a file over JSON_FILE_MAX",
          "errno %d r=%d", big_errno, r);
    free(big);
    unlink(path);
    // and a small one still loads
    strcpy(path, "/tmp/test_json_small_XXXXXX");
    fd = mkstemp(path);
    CHECK(fd >= 0 && write(fd, "{\"a\": 1}", 8) == 8, "small file for json_load_file", "cannot create it");
    if (fd >= 0) close(fd);
    r = json_load_file(path, &v);
    CHECK(r == 0 && json_get(&v, "a") != NULL, "json_load_file reads a small file", "r=%d", r);
    json_free(&v);
    unlink(path);
}

int main(void) {
    test_valid();
    test_invalid();
    test_write();
    test_mutations();
    test_limits();
    return test_summary();
}
