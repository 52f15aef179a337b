// Tests tokenizer.h against sentencepiece's own output, recorded by
// dev/reference/make_tokenizer_fixtures.py in test/fixtures/tokenizer/, and
// the tokenizer.json path against the `tokenizers` library's, recorded by
// dev/reference/make_bpe_fixtures.py there, and feeds both broken files.
// Run from the repo root:
//   gcc -O2 -Wall -Wextra -std=c11 -o /tmp/test_tokenizer test/test_tokenizer.c -lm && /tmp/test_tokenizer
#define _POSIX_C_SOURCE 200809L // dup/dup2, to catch the tokenizer's messages on stderr
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "../tokenizer.h"
#include "test_common.h"

#define FIXTURES "test/fixtures/tokenizer/"
#define LLAMA_MODEL "../shared/data/llama2/tokenizer.model"
#define SAMSUM "../shared/data/samsum/samsum_test_300.jsonl"
#define ALPACA "../shared/data/alpaca/alpaca_1000.json"

// whole file into memory (NUL-terminated); NULL if it can't be read
static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = (char *)malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - 1 - n, f);
        if (n < cap - 1) break;
        char *nb = (char *)realloc(buf, cap *= 2);
        if (!nb) { free(buf); buf = NULL; }
        else buf = nb;
    }
    fclose(f);
    if (buf) buf[n] = 0;
    if (len) *len = n;
    return buf;
}

// splits s at the first tab (or the end); returns the rest, or NULL if none
static char *cut(char *s) {
    char *t = strchr(s, '\t');
    if (!t) return NULL;
    *t = 0;
    return t + 1;
}

static int hexval(int c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; }

// hex string -> bytes (malloc'd, NUL-terminated for printing)
static char *unhex(const char *h, size_t *len) {
    size_t n = strlen(h) / 2;
    char *out = (char *)malloc(n + 1);
    for (size_t i = 0; i < n; i++) out[i] = (char)(hexval(h[2 * i]) * 16 + hexval(h[2 * i + 1]));
    out[n] = 0;
    *len = n;
    return out;
}

// "1 2 3" -> ids (malloc'd)
static int *parse_ids(const char *s, int *n) {
    int cap = 16, k = 0;
    int *ids = (int *)malloc(cap * sizeof(int));
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s) break;
        if (k == cap) ids = (int *)realloc(ids, (cap *= 2) * sizeof(int));
        ids[k++] = (int)v;
        s = end;
    }
    *n = k;
    return ids;
}

// printable rendering of some bytes for failure messages (static buffer)
static const char *show(const char *s, size_t n) {
    static char buf[2][128];
    static int which = 0;
    char *b = buf[which ^= 1];
    size_t o = 0;
    for (size_t i = 0; i < n && o < 100; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7F && c != '\\') b[o++] = (char)c;
        else o += (size_t)sprintf(b + o, "\\x%02x", c);
    }
    if (o >= 100) { strcpy(b + o, "..."); o += 3; }
    b[o] = 0;
    return b;
}

// first index where the id arrays differ, or -1
static int first_diff(const int *a, int na, const int *b, int nb) {
    for (int i = 0; i < na || i < nb; i++)
        if (i >= na || i >= nb || a[i] != b[i]) return i;
    return -1;
}

// the shared SAMSum and Alpaca samples, as make_tokenizer_fixtures.py's
// shared_samples() picks them: 10 dialogues, 5 summaries, 10 Alpaca records as
// "instruction\ninput\noutput". NULL (n 0) when the files are absent.
static char **shared_samples(int *n) {
    static char *s[25];
    static int count = -1;
    if (count >= 0) { *n = count; return count ? s : NULL; }
    count = 0;
    size_t len;
    char *samsum = slurp(SAMSUM, &len), *alpaca = slurp(ALPACA, NULL);
    if (samsum && alpaca) {
        int row = 0;
        for (char *line = samsum, *next; line && *line && row < 15; line = next, row++) {
            next = strchr(line, '\n');
            if (next) *next++ = 0;
            JsonValue v;
            const char *text;
            if (json_parse(line, strlen(line), &v, NULL, 0) == 0 && json_get_string(&v, row < 10 ? "dialogue" : "summary", &text, NULL) == JSON_OK)
                s[count++] = strdup(text);
            json_free(&v);
        }
        JsonValue a;
        if (json_parse(alpaca, strlen(alpaca), &a, NULL, 0) == 0 && a.type == JSON_ARRAY)
            for (int i = 0; i < 10 && i < a.count; i++) {
                const char *in, *ins, *out;
                if (json_get_string(&a.items[i], "instruction", &ins, NULL) != JSON_OK || json_get_string(&a.items[i], "input", &in, NULL) != JSON_OK ||
                    json_get_string(&a.items[i], "output", &out, NULL) != JSON_OK) continue;
                s[count] = (char *)malloc(strlen(ins) + strlen(in) + strlen(out) + 3);
                sprintf(s[count++], "%s\n%s\n%s", ins, in, out);
            }
        json_free(&a);
    }
    free(samsum); free(alpaca);
    *n = count;
    return count ? s : NULL;
}

// runs one fixture file: every "encode" and "decode" line against the tokenizer
static void run_fixture(const char *name, const char *fixture) {
    char what[256];
    size_t flen;
    char *text = slurp(fixture, &flen);
    snprintf(what, sizeof(what), "%s: fixture %s readable", name, fixture);
    CHECK(text != NULL, what, "cannot read it (regenerate with dev/reference/make_tokenizer_fixtures.py)");
    if (!text) return;

    Tokenizer tok;
    int loaded = 0, n_enc = 0, bad_enc = 0, bad_dec_of_enc = 0, n_dec = 0, bad_dec = 0, n_round = 0, bad_round = 0;
    int n_id = 0, bad_id = 0, n_sample = 0, bad_sample = 0, n_shared = 0;
    char **shared = shared_samples(&n_shared);
    const char *ref = "sentencepiece"; // the library the fixture comes from
    char first_enc[700] = "", first_dec[700] = "", first_round[400] = "", first_id[300] = "", first_sample[300] = "";
    for (char *line = text, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        if (line[0] == '#' || line[0] == 0) continue;
        char *f1 = cut(line), *f2 = f1 ? cut(f1) : NULL, *f3 = f2 ? cut(f2) : NULL;
        if (strcmp(line, "model") == 0 && f1) {
            if (strcmp(name, "llama2") == 0) {
                FILE *probe = fopen(f1, "rb");
                if (!probe) { test_skip("llama2 tokenizer cases", LLAMA_MODEL " not present"); break; }
                fclose(probe);
            }
            if (strcmp(name, "llama3") == 0) f1 = getenv("LLAMA3_TOKENIZER"); // the fixture was made from a copy somewhere
            snprintf(what, sizeof(what), "%s: load %s", name, f1);
            loaded = tokenizer_load(&tok, f1) == 0;
            CHECK(loaded, what, "tokenizer_load failed");
            if (!loaded) break;
            if (tok.kind == TOKENIZER_BPE_JSON) ref = "tokenizers";
        } else if (strcmp(line, "meta") == 0 && f1 && loaded) {
            int n, *m = parse_ids(f1, &n);
            snprintf(what, sizeof(what), "%s: vocab_size/bos/eos/unk/pad match %s", name, ref);
            CHECK(n == 5 && m[0] == tok.vocab_size && m[1] == tok.bos_id && m[2] == tok.eos_id && m[3] == tok.unk_id && m[4] == tok.pad_id,
                  what, "want %d %d %d %d %d, got %d %d %d %d %d", m[0], m[1], m[2], m[3], m[4],
                  tok.vocab_size, tok.bos_id, tok.eos_id, tok.unk_id, tok.pad_id);
            free(m);
        } else if (strcmp(line, "encode") == 0 && f3 && loaded) {
            size_t tl, dl;
            char *in = unhex(f1, &tl), *want_dec = unhex(f3, &dl);
            int nw, ng;
            int *want = parse_ids(f2, &nw);
            int *got = tokenizer_encode(&tok, in, tl, 0, 0, &ng);
            n_enc++;
            int d = got ? first_diff(got, ng, want, nw) : 0;
            if (d >= 0 && bad_enc++ == 0)
                snprintf(first_enc, sizeof(first_enc), "case %d '%s': %d ids vs %d wanted, first difference at %d: got %d want %d",
                         n_enc, show(in, tl), ng, nw, d, d < ng ? got[d] : -1, d < nw ? want[d] : -1);
            // decoding sentencepiece's ids must give sentencepiece's text
            size_t gl;
            char *dec = tokenizer_decode(&tok, want, nw, &gl);
            if (!dec || gl != dl || memcmp(dec, want_dec, dl) != 0) bad_dec_of_enc++;
            // round trip where sentencepiece's round trip is exact
            if (dl == tl && memcmp(want_dec, in, tl) == 0) {
                n_round++;
                size_t rl;
                char *rt = got ? tokenizer_decode(&tok, got, ng, &rl) : NULL;
                if (!rt || rl != tl || memcmp(rt, in, tl) != 0) {
                    if (bad_round++ == 0) snprintf(first_round, sizeof(first_round), "'%s' came back as '%s'", show(in, tl), rt ? show(rt, rl) : "(null)");
                }
                free(rt);
            }
            free(in); free(want_dec); free(want); free(got); free(dec);
        } else if (strcmp(line, "decode") == 0 && f2 && loaded) {
            size_t wl, gl;
            int n;
            int *ids = parse_ids(f1, &n);
            char *want = unhex(f2, &wl);
            char *got = tokenizer_decode(&tok, ids, n, &gl);
            n_dec++;
            if (!got || gl != wl || memcmp(got, want, wl) != 0) {
                if (bad_dec++ == 0) snprintf(first_dec, sizeof(first_dec), "ids [%s]: got '%s' want '%s'", f1, got ? show(got, gl) : "(null)", show(want, wl));
            }
            free(ids); free(want); free(got);
        } else if (strcmp(line, "id") == 0 && f2 && loaded) { // tokenizers' token_to_id
            size_t pl;
            char *piece = unhex(f1, &pl);
            int want = atoi(f2), got = tokenizer_token_id(&tok, piece);
            n_id++;
            if (got != want && bad_id++ == 0) snprintf(first_id, sizeof first_id, "'%s': got %d want %d", show(piece, pl), got, want);
            free(piece);
        } else if (strcmp(line, "sample") == 0 && f3 && loaded && shared) { // ids of a shared sample, read here
            int k = atoi(f1), nw, ng, round_trips = atoi(f3);
            int *want = parse_ids(f2, &nw);
            const char *s = k < n_shared ? shared[k] : "";
            int *got = tokenizer_encode(&tok, s, strlen(s), 0, 0, &ng);
            size_t dl;
            char *dec = got ? tokenizer_decode(&tok, got, ng, &dl) : NULL;
            n_sample++;
            int d = got ? first_diff(got, ng, want, nw) : 0;
            int same = dec && dl == strlen(s) && memcmp(dec, s, dl) == 0;
            if ((d >= 0 || !dec || same != round_trips) && bad_sample++ == 0)
                snprintf(first_sample, sizeof first_sample, "sample %d: %d ids vs %d wanted, first difference at %d; decode %s",
                         k, ng, nw, d, same ? "round-trips" : "differs");
            free(want); free(got); free(dec);
        }
    }
    if (loaded) {
        snprintf(what, sizeof(what), "%s: encode matches %s (%d cases)", name, ref, n_enc);
        CHECK(bad_enc == 0 && n_enc > 0, what, "%d of %d differ; first: %s", bad_enc, n_enc, first_enc);
        snprintf(what, sizeof(what), "%s: decode of %s's ids matches (%d cases)", name, ref, n_enc);
        CHECK(bad_dec_of_enc == 0, what, "%d of %d differ", bad_dec_of_enc, n_enc);
        snprintf(what, sizeof(what), "%s: decode(encode(x)) == x where %s round-trips (%d cases)", name, ref, n_round);
        CHECK(bad_round == 0, what, "%d of %d differ; first: %s", bad_round, n_round, first_round);
        snprintf(what, sizeof(what), "%s: decode of id sequences matches (%d cases)", name, n_dec);
        CHECK(bad_dec == 0 && n_dec > 0, what, "%d of %d differ; first: %s", bad_dec, n_dec, first_dec);

        if (n_id > 0) {
            snprintf(what, sizeof(what), "%s: tokenizer_token_id matches token_to_id (%d pieces)", name, n_id);
            CHECK(bad_id == 0, what, "%d of %d differ; first: %s", bad_id, n_id, first_id);
        }
        if (n_sample > 0) {
            snprintf(what, sizeof(what), "%s: the shared SAMSum/Alpaca samples encode as tokenizers, decode round-trips where it does (%d)", name, n_sample);
            CHECK(bad_sample == 0 && n_sample == n_shared, what, "%d of %d differ (%d samples here); first: %s", bad_sample, n_sample, n_shared, first_sample);
        } else if (tok.kind == TOKENIZER_BPE_JSON) {
            snprintf(what, sizeof(what), "%s: shared SAMSum/Alpaca samples", name);
            test_skip(what, shared ? "the fixture has no sample lines (made without ../shared)" : SAMSUM " or " ALPACA " not present");
        }

        // BOS/EOS around the plain encoding, where the model has them (a tokenizer.json has none of its own)
        int n0, n1, has_bos = tok.bos_id >= 0, has_eos = tok.eos_id >= 0;
        int *a = tokenizer_encode(&tok, "Hello world", 11, 0, 0, &n0);
        int *b = tokenizer_encode(&tok, "Hello world", 11, 1, 1, &n1);
        snprintf(what, sizeof(what), "%s: bos/eos added around the ids%s", name, has_bos || has_eos ? "" : " (none: bos_id = eos_id = -1)");
        CHECK(a && b && n1 == n0 + has_bos + has_eos && (!has_bos || b[0] == tok.bos_id) && (!has_eos || b[n1 - 1] == tok.eos_id) &&
              memcmp(a, b + has_bos, n0 * sizeof(int)) == 0, what, "n %d vs %d, first %d last %d", n0, n1, b ? b[0] : -9, b ? b[n1 - 1] : -9);
        free(a); free(b);
        tokenizer_free(&tok);
    }
    free(text);
}

// ----------------------------------------------------------------------------
// bad input

static unsigned long long rng_state = 88172645463325252ULL;
static unsigned rnd(void) { // xorshift64, deterministic
    rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17;
    return (unsigned)(rng_state >> 32);
}

// stderr goes to a temporary file while loading, so that each failure can be
// checked to come with a message (and thousands of them don't flood the log)
static FILE *err_file = NULL;
static char last_msg[512]; // first line the last load printed

// tokenizer_load(path) or, with path NULL, tokenizer_load_from_memory(d, n, "(test input)")
static int load_captured(Tokenizer *t, const char *path, const unsigned char *d, size_t n) {
    if (!err_file) err_file = tmpfile();
    int saved = -1;
    long start = 0;
    if (err_file) {
        fflush(stderr);
        saved = dup(2);
        fseek(err_file, 0, SEEK_END);
        start = ftell(err_file);
        dup2(fileno(err_file), 2);
    }
    int rc = path ? tokenizer_load(t, path) : tokenizer_load_from_memory(t, d, n, "(test input)");
    last_msg[0] = 0;
    if (saved >= 0) {
        fflush(stderr);
        dup2(saved, 2);
        close(saved);
        fseek(err_file, start, SEEK_SET);
        if (!fgets(last_msg, sizeof(last_msg), err_file)) last_msg[0] = 0;
        last_msg[strcspn(last_msg, "\n")] = 0;
    }
    return rc;
}

// loads from memory; when it succeeds, the tokenizer must also work.
// Returns 0 / -1 from the loader, or -2 if a failure left state behind or
// printed no "error: tokenizer <name>: <problem>" line.
static int try_load(const unsigned char *d, size_t n) {
    Tokenizer t;
    int rc = load_captured(&t, NULL, d, n);
    if (rc == 0) {
        static const char s[] = " Hello  w\xc3\xb6rld\xff 123 \xf0\x9f\x98\x80";
        int k; int *ids = tokenizer_encode(&t, s, sizeof(s) - 1, 1, 1, &k);
        size_t l; char *dec = tokenizer_decode(&t, ids, k, &l);
        free(ids); free(dec);
        tokenizer_free(&t);
    } else if (t.vocab_size != 0 || t.pieces != NULL || t.table != NULL ||
               strncmp(last_msg, "error: tokenizer (test input): ", 31) != 0) {
        rc = -2;
    }
    return rc;
}

// one ok/FAIL line for a load that should give `want`, quoting the message
static void expect(int got, int want, const char *what) {
    char w[700];
    if (want == -1 && got == -1) snprintf(w, sizeof(w), "%s [%s]", what, last_msg);
    else snprintf(w, sizeof(w), "%s", what);
    CHECK(got == want, w, "got %d, want %d (%s)", got, want, last_msg);
}

// random byte flips (1 to max_flips per copy of d): each copy either loads (and then works) or returns -1
static void flips(const unsigned char *d, size_t n, int copies, int max_flips, const char *what_files) {
    unsigned char *buf = (unsigned char *)malloc(n);
    int ok = 0, bad = 0;
    for (int it = 0; it < copies; it++) {
        memcpy(buf, d, n);
        int k = 1 + (int)(rnd() % (unsigned)max_flips);
        for (int j = 0; j < k; j++) buf[rnd() % n] ^= (unsigned char)(1 + rnd() % 255);
        int rc = try_load(buf, n);
        ok += rc == 0;
        bad += rc == -2;
    }
    char what[200];
    snprintf(what, sizeof(what), "%d %s with flipped bytes handled (%d still load)", copies, what_files, ok);
    CHECK(bad == 0, what, "%d left state behind", bad);
    free(buf);
}

static void bad_inputs(void) {
    Tokenizer t;
    expect(load_captured(&t, "test/fixtures/tokenizer/no_such_file.model", NULL, 0), -1, "nonexistent path -> -1");
    const char *empty_path = "/tmp/llama2tune_test_tokenizer_empty.model";
    FILE *f = fopen(empty_path, "wb");
    if (f) fclose(f);
    expect(load_captured(&t, empty_path, NULL, 0), -1, "empty file -> -1");
    remove(empty_path);
    expect(try_load(NULL, 0), -1, "NULL/empty buffer -> -1");
    expect(load_captured(&t, "test", NULL, 0), -1, "a directory -> -1");
    // a (sparse) file over TOKENIZER_MAX_FILE_SIZE: refused from its size, before anything is read
    const char *big_path = "/tmp/llama2tune_test_tokenizer_big.model";
    f = fopen(big_path, "wb");
    int made = f && fclose(f) == 0 && truncate(big_path, (off_t)TOKENIZER_MAX_FILE_SIZE + 1) == 0;
    int rc_big = load_captured(&t, big_path, NULL, 0);
    CHECK(made && rc_big == -1 && strstr(last_msg, "larger than the 256 MiB allowed"), "file over 256 MiB -> -1 before reading",
          "made=%d rc=%d [%s]", made, rc_big, last_msg);
    remove(big_path);

    size_t n;
    unsigned char *model = (unsigned char *)slurp(FIXTURES "tok512.model", &n);
    CHECK(model != NULL, "tok512.model readable", "missing");
    if (!model) return;
    CHECK(try_load(model, n) == 0, "tok512.model loads from memory", "failed");

    // truncations: cutting mid-piece or mid-spec must fail; every prefix must be handled
    expect(try_load(model, n / 2), -1, "truncated at half -> -1");
    expect(try_load(model, n - 1), -1, "truncated by one byte -> -1");
    expect(try_load(model, 7), -1, "truncated to 7 bytes -> -1");
    int weird = 0, ok = 0;
    for (size_t k = 0; k < n; k++) {
        int rc = try_load(model, k);
        if (rc == -2) weird++;
        ok += rc == 0; // a prefix ending exactly between fields is a valid protobuf; some of those are valid models
    }
    char what[200];
    snprintf(what, sizeof(what), "all %zu prefixes handled (%d load as models, rest -1)", n, ok);
    CHECK(weird == 0, what, "%d left state behind", weird);

    // specific corruptions
    unsigned char *buf = (unsigned char *)malloc(n + 4096);
    memcpy(buf, model, n); buf[0] = 0xFF;
    expect(try_load(buf, n), -1, "invalid wire type in first tag -> -1");
    memcpy(buf, model, n); buf[1] = 0xFF;
    expect(try_load(buf, n), -1, "first piece length corrupted -> -1");
    for (size_t k = 0; k < 1000; k++) buf[k] = (unsigned char)rnd();
    expect(try_load(buf, 1000), -1, "1000 bytes of garbage -> -1");
    memset(buf, 0, 64);
    expect(try_load(buf, 64), -1, "64 zero bytes -> -1");
    static const unsigned char huge_len[] = {0x0A, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F};
    expect(try_load(huge_len, sizeof(huge_len)), -1, "piece claiming a 2^63-byte length -> -1");
    static const unsigned char long_varint[] = {0x0A, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01};
    expect(try_load(long_varint, sizeof(long_varint)), -1, "11-byte varint -> -1");
    memset(buf, 0x0B, 4096); // 4096 nested start-group tags: must not recurse without bound
    expect(try_load(buf, 4096), -1, "deeply nested groups -> -1");

    // well-formed protobuf saying things we refuse, appended to a good model
    // (a repeated field gets one more element; a sub-message is merged)
    static const struct { const char *what; int want; unsigned char len, bytes[16]; } appended[] = {
        {"trainer_spec model_type UNIGRAM -> -1", -1, 4, {0x12, 0x02, 0x18, 0x01}},
        {"normalizer rule nfkc -> -1", -1, 8, {0x1A, 0x06, 0x0A, 0x04, 'n', 'f', 'k', 'c'}},
        {"precompiled charsmap -> -1", -1, 5, {0x1A, 0x03, 0x12, 0x01, 'x'}},
        {"denormalizer charsmap -> -1", -1, 5, {0x2A, 0x03, 0x12, 0x01, 'x'}},
        {"treat_whitespace_as_suffix -> -1", -1, 5, {0x12, 0x03, 0xC0, 0x01, 0x01}},
        {"escape_whitespaces=false -> -1", -1, 4, {0x1A, 0x02, 0x28, 0x00}},
        {"second UNKNOWN piece -> -1", -1, 9, {0x0A, 0x07, 0x0A, 0x03, 'x', 'y', 'z', 0x18, 0x02}},
        {"empty piece -> -1", -1, 4, {0x0A, 0x02, 0x18, 0x01}},
        {"malformed byte piece name -> -1", -1, 12, {0x0A, 0x0A, 0x0A, 0x06, '<', '0', 'x', '4', 'g', '>', 0x18, 0x06}},
        {"lower-case byte piece name -> -1", -1, 12, {0x0A, 0x0A, 0x0A, 0x06, '<', '0', 'x', '4', 'a', '>', 0x18, 0x06}},
        {"duplicate byte piece -> -1", -1, 12, {0x0A, 0x0A, 0x0A, 0x06, '<', '0', 'x', '4', '1', '>', 0x18, 0x06}},
        // sentencepiece allows one string in both maps ("<0x41>" as NORMAL and BYTE)
        {"normal piece with a byte piece's string loads", 0, 12, {0x0A, 0x0A, 0x0A, 0x06, '<', '0', 'x', '4', '1', '>', 0x18, 0x01}},
        // unknown fields of every wire type are skipped
        {"unknown fields (all wire types) are skipped", 0, 16,
         {0x30, 0x05, 0x39, 1, 2, 3, 4, 5, 6, 7, 8, 0x3D, 1, 2, 3, 4}},
        {"unknown group field is skipped", 0, 6, {0x43, 0x08, 0x01, 0x44, 0x48, 0x00}},
        {"unmatched end-group -> -1", -1, 1, {0x44}},
    };
    for (size_t k = 0; k < sizeof(appended) / sizeof(appended[0]); k++) {
        memcpy(buf, model, n); memcpy(buf + n, appended[k].bytes, appended[k].len);
        expect(try_load(buf, n + appended[k].len), appended[k].want, appended[k].what);
    }
    // "<0x41>" as both a normal and a byte piece (appended[11]): PieceToId gives the byte piece (the reserved map first)
    memcpy(buf, model, n); memcpy(buf + n, appended[11].bytes, appended[11].len);
    if (tokenizer_load_from_memory(&t, buf, n + appended[11].len, "tok512") == 0) {
        int id = tokenizer_token_id(&t, "<0x41>");
        CHECK(id == t.byte_ids[0x41] && id != t.vocab_size - 1, "tokenizer_token_id of a string in both maps: the byte piece's",
              "got %d, byte piece %d, normal piece %d", id, t.byte_ids[0x41], t.vocab_size - 1);
        tokenizer_free(&t);
    }
    // a duplicate of an existing normal piece
    {
        if (tokenizer_load_from_memory(&t, model, n, "tok512") == 0) {
            int id = t.vocab_size - 1;
            size_t pl = strlen(t.pieces[id]);
            unsigned char extra[64];
            extra[0] = 0x0A; extra[1] = (unsigned char)(pl + 2); extra[2] = 0x0A; extra[3] = (unsigned char)pl;
            memcpy(extra + 4, t.pieces[id], pl);
            memcpy(buf, model, n); memcpy(buf + n, extra, pl + 4);
            expect(try_load(buf, n + pl + 4), -1, "duplicate piece -> -1");
            tokenizer_free(&t);
        }
    }
    // one piece longer than TOKENIZER_MAX_PIECE_LEN
    {
        size_t pl = TOKENIZER_MAX_PIECE_LEN + 1;
        unsigned char *big = (unsigned char *)malloc(n + pl + 16);
        memcpy(big, model, n);
        size_t o = n;
        big[o++] = 0x0A; big[o++] = (unsigned char)(((pl + 3) & 0x7F) | 0x80); big[o++] = (unsigned char)((pl + 3) >> 7);
        big[o++] = 0x0A; big[o++] = (unsigned char)((pl & 0x7F) | 0x80); big[o++] = (unsigned char)(pl >> 7);
        memset(big + o, 'a', pl); o += pl;
        expect(try_load(big, o), -1, "piece longer than the limit -> -1");
        free(big);
    }
    // more pieces than TOKENIZER_MAX_PIECES (tiny ones): refused before allocating per piece
    {
        size_t count = (size_t)TOKENIZER_MAX_PIECES + 1, sz = count * 5;
        unsigned char *many = (unsigned char *)malloc(sz);
        for (size_t k = 0; k < count; k++) {
            unsigned char *p = many + 5 * k;
            p[0] = 0x0A; p[1] = 0x03; p[2] = 0x0A; p[3] = 0x01; p[4] = 'a';
        }
        expect(try_load(many, sz), -1, "more pieces than the limit -> -1");
        free(many);
    }
    flips(model, n, 3000, 8, "models");
    free(buf);
    free(model);
}

// a copy of d[0..n) with the first `old` after the first `after` replaced by
// `new` (malloc'd, *m its length); NULL if not found
static unsigned char *patched(const unsigned char *d, size_t n, const char *after, const char *old, const char *new_, size_t *m) {
    char *text = (char *)malloc(n + 1);
    memcpy(text, d, n);
    text[n] = 0;
    char *a = strstr(text, after), *o = a ? strstr(a, old) : NULL;
    if (!o) { free(text); return NULL; }
    size_t lo = strlen(old), ln = strlen(new_);
    unsigned char *out = (unsigned char *)malloc(n - lo + ln);
    size_t k = (size_t)(o - text);
    memcpy(out, text, k); memcpy(out + k, new_, ln); memcpy(out + k + ln, text + k + lo, n - k - lo);
    *m = n - lo + ln;
    free(text);
    return out;
}

// tokenizer.json: every refusal names the file and the field
static void bad_json_inputs(void) {
    size_t n, g;
    unsigned char *doc = (unsigned char *)slurp(FIXTURES "bpe_llama3.json", &n), *gpt2 = (unsigned char *)slurp(FIXTURES "bpe_gpt2.json", &g);
    CHECK(doc && gpt2, "bpe_llama3.json and bpe_gpt2.json readable", "missing");
    if (!doc || !gpt2) return;
    CHECK(try_load(doc, n) == 0 && try_load(gpt2, g) == 0, "bpe_llama3.json and bpe_gpt2.json load from memory (by content)", "failed");
    // each case: a patch of one of the two files, and what the message must say
    static const struct { int gpt2; const char *after, *old, *new_, *says; } cases[] = {
        {0, "\"model\"", "\"type\": \"BPE\"", "\"type\": \"WordPiece\"", "model.type is \"WordPiece\"; only \"BPE\" is supported"},
        {0, "\"model\"", "\"dropout\": null", "\"dropout\": 0.1", "model.dropout is 0.1; only null"},
        {0, "\"model\"", "\"byte_fallback\": false", "\"byte_fallback\": true", "model.byte_fallback is true"},
        {0, "\"model\"", "\"continuing_subword_prefix\": null", "\"continuing_subword_prefix\": \"##\"", "model.continuing_subword_prefix is \"##\""},
        {0, "\"model\"", "\"end_of_word_suffix\": null", "\"end_of_word_suffix\": \"</w>\"", "model.end_of_word_suffix is \"</w>\""},
        {0, "\"model\"", "\"ignore_merges\": true", "\"ignore_merges\": 1", "model.ignore_merges is 1, not true or false"},
        {0, "\"model\"", "\"unk_token\": null", "\"unk_token\": \"<nope>\"", "model.unk_token \"<nope>\" is not in model.vocab"},
        {0, "", "\"normalizer\": null", "\"normalizer\": {\"type\": \"NFC\"}", "normalizer is of type \"NFC\"; only null"},
        {0, "", "\"truncation\": null", "\"truncation\": {\"max_length\": 8}", "truncation is an object; only null"},
        {0, "", "\"padding\": null", "\"padding\": {}", "padding is an object; only null"},
        {0, "", "\"version\": \"1.0\"", "\"version\": \"2.0\"", "version is \"2.0\"; only \"1.0\""},
        {0, "\"Regex\"", "\\\\p{N}{1,3}", "\\\\p{N}+", "pre_tokenizer.pretokenizers[0].pattern.Regex is \"(?i:"},
        {0, "\"pre_tokenizer\"", "\"Regex\"", "\"String\"", "pre_tokenizer.pretokenizers[0].pattern.Regex is missing"},
        {0, "\"pre_tokenizer\"", "\"type\": \"Sequence\"", "\"type\": \"Metaspace\"", "pre_tokenizer.type is \"Metaspace\"; only Llama-3's"},
        {0, "\"pre_tokenizer\"", "\"Isolated\"", "\"Removed\"", "pre_tokenizer.pretokenizers[0].behavior is \"Removed\""},
        {0, "\"pre_tokenizer\"", "\"invert\": false", "\"invert\": true", "pre_tokenizer.pretokenizers[0].invert is true"},
        {0, "\"pre_tokenizer\"", "\"add_prefix_space\": false", "\"add_prefix_space\": true", "pre_tokenizer.pretokenizers[1].add_prefix_space is true"},
        {0, "\"pre_tokenizer\"", "\"use_regex\": false", "\"use_regex\": true", "pre_tokenizer.pretokenizers[1].use_regex is true; only false"},
        {0, "", "\"pre_tokenizer\": {", "\"pre_tokenizer\": null, \"x\": {", "pre_tokenizer is null"},
        {0, "\"decoder\"", "\"type\": \"ByteLevel\"", "\"type\": \"Metaspace\"", "decoder.type is \"Metaspace\"; only \"ByteLevel\""},
        {0, "\"vocab\"", "\"!\": 0,", "\"!\": 99999,", "model.vocab[\"!\"] is 99999, outside 0..3297: the ids must number the 3298 entries without gaps"},
        {0, "\"vocab\"", "\"!\": 0,", "\"!\": -1,", "model.vocab[\"!\"] is -1, outside"},
        {0, "\"vocab\"", "\"!\": 0,", "\"!\": \"0\",", "model.vocab[\"!\"] is \"0\", not an integer id"},
        {0, "\"vocab\"", "\"!\": 0,", "\"!\": 0.5,", "model.vocab[\"!\"] is 0.5, not an integer id"},
        {0, "\"vocab\"", "\"#\": 2,", "\"#\": 0,", "model.vocab gives id 0 to both \"!\" and \"#\""},
        {0, "\"vocab\"", "\"#\": 2,", "\"!\": 2,", "model.vocab has the key \"!\" twice"},
        {0, "\"merges\"", "\"\xC4\xA0\",", "\"nope\",", "model.merges[0] (\"nope\", \"\\xC4\\xA0\"): the first is not in model.vocab"},
        {0, "\"merges\"", "\"\xC4\xA0\"\n", "\"\xC3\xBF\"\n", "model.merges[0] (\"\\xC4\\xA0\", \"\\xC3\\xBF\"): their concatenation is not in model.vocab"},
        {0, "\"merges\"", "[\n        \"\xC4\xA0\",\n        \"\xC4\xA0\"\n      ]", "\"\xC4\xA0 \xC4\xA0\"", "model.merges[1] is an array, but model.merges[0] is a string"},
        {0, "\"merges\"", "[\n        \"\xC4\xA0\",\n        \"\xC4\xA0\"\n      ]", "[\"\xC4\xA0\"]", "model.merges[0] is an array, not a pair of strings"},
        {1, "\"merges\"", "\"\xC4\xA0 \xC4\xA0\"", "\"\xC4\xA0  \xC4\xA0\"", "model.merges[0] \"\\xC4\\xA0  \\xC4\\xA0\" is not two tokens with one space between"},
        {1, "\"merges\"", "\"\xC4\xA0 \xC4\xA0\"", "[\"\xC4\xA0\", \"\xC4\xA0\"]", "model.merges[1] is \"\\xC4\\xA0\\xC4\\xA0 \\xC4\\xA0\\xC4\\xA0\", not a pair of strings like model.merges[0]"},
        {0, "\"added_tokens\"", "\"id\": 3298", "\"id\": 5", "added_tokens[0].id is 5 for \"<|begin_of_text|>\", but tokenizers gives it id 3298"},
        {0, "\"added_tokens\"", "\"single_word\": false", "\"single_word\": true", "added_tokens[0].single_word is true"},
        {0, "\"added_tokens\"", "\"special\": true", "\"specia\": true", "added_tokens[0].special is missing, not true or false"},
        {0, "\"added_tokens\"", "\"content\": \"<|end_of_text|>\"", "\"content\": \"<|begin_of_text|>\"", "added_tokens[1].content \"<|begin_of_text|>\" is also an earlier added token's"},
        {0, "\"added_tokens\"", "\"content\": \"<|begin_of_text|>\"", "\"content\": 7", "added_tokens[0].content is 7, not a string"},
        {0, "", "\"added_tokens\": [", "\"added_tokens\": 3, \"x\": [", "added_tokens is 3, not an array"},
        {0, "", "\"model\": {", "\"model\": [], \"x\": {", "model is an array, not an object"},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        size_t m;
        unsigned char *d = patched(cases[k].gpt2 ? gpt2 : doc, cases[k].gpt2 ? g : n, cases[k].after, cases[k].old, cases[k].new_, &m);
        char what[400];
        snprintf(what, sizeof what, "tokenizer.json refused: %s", cases[k].says);
        if (!d) { CHECK(0, what, "the patch target '%s' is not in the fixture", cases[k].old); continue; }
        int rc = try_load(d, m);
        CHECK(rc == -1 && strstr(last_msg, cases[k].says), what, "rc %d, message [%s]", rc, last_msg);
        free(d);
    }
    // the file's name: by it a .json is read as JSON whatever its content; the
    // message names it (tokenizer_load prints the path it was given)
    Tokenizer t;
    expect(load_captured(&t, NULL, (const unsigned char *)"{}", 2), -1, "an empty JSON object -> -1");
    const char *json_path = "/tmp/llama2tune_test_tokenizer.json";
    FILE *f = fopen(json_path, "wb");
    if (f) { fwrite("\n[1]", 1, 4, f); fclose(f); }
    int rc = load_captured(&t, json_path, NULL, 0);
    CHECK(rc == -1 && strstr(last_msg, "error: tokenizer /tmp/llama2tune_test_tokenizer.json: the top level is an array, not an object"),
          "a .json file is read as JSON (leading whitespace, an array) and named in the message", "[%s]", last_msg);
    remove(json_path);
    // a vocab entry and an added token over TOKENIZER_MAX_PIECE_LEN
    char *longkey = (char *)malloc(TOKENIZER_MAX_PIECE_LEN + 40);
    memset(longkey, 'q', TOKENIZER_MAX_PIECE_LEN + 2); // a quote and 2049 bytes
    strcpy(longkey + TOKENIZER_MAX_PIECE_LEN + 2, "\": 0,");
    longkey[0] = '"';
    size_t m;
    unsigned char *d = patched(doc, n, "\"vocab\"", "\"!\": 0,", longkey, &m);
    rc = try_load(d, m);
    CHECK(rc == -1 && strstr(last_msg, "bytes long, more than the 2048 allowed"), "tokenizer.json: a vocab entry over 2048 bytes -> -1", "[%s]", last_msg);
    free(d); free(longkey);
    // more entries than TOKENIZER_MAX_PIECES: refused before anything is allocated per entry
    {
        const char *cut = strstr((const char *)doc, "\"vocab\": {");
        size_t head = (size_t)(cut - (const char *)doc) + strlen("\"vocab\": {"), count = (size_t)TOKENIZER_MAX_PIECES + 1;
        unsigned char *big = (unsigned char *)malloc(head + 6 * count + 8);
        memcpy(big, doc, head);
        size_t o = head;
        for (size_t k = 0; k < count; k++) { memcpy(big + o, "\"a\":0,", 6); o += 6; }
        memcpy(big + o - 1, "}}}", 3); o += 2;
        rc = try_load(big, o);
        CHECK(rc == -1 && strstr(last_msg, "more than 2097152 entries"), "tokenizer.json with more entries than the limit -> -1", "[%s]", last_msg);
        free(big);
    }
    // truncations and random byte flips: each loads (and then works) or fails with a message
    int weird = 0, ok = 0;
    for (size_t k = 0; k < g; k += k < g - 300 ? 17 : 1) {
        int r = try_load(gpt2, k);
        weird += r == -2;
        ok += r == 0;
    }
    CHECK(weird == 0 && ok == 0, "tokenizer.json: every 17th prefix and the last 300 are refused with a message", "%d left state behind, %d loaded", weird, ok);
    flips(gpt2, g, 2000, 4, "tokenizer.json files");
    free(doc); free(gpt2);
}

// API details that don't need sentencepiece
static void api_details(void) {
    Tokenizer t;
    if (tokenizer_load(&t, FIXTURES "tok1000.model") != 0) { CHECK(0, "load tok1000", "failed"); return; }
    CHECK(tokenizer_piece(&t, -1) == NULL && tokenizer_piece(&t, t.vocab_size) == NULL, "tokenizer_piece out of range -> NULL", "not NULL");
    CHECK(tokenizer_piece(&t, t.bos_id) && strcmp(tokenizer_piece(&t, t.bos_id), "<s>") == 0, "tokenizer_piece(bos) == <s>", "got %s", tokenizer_piece(&t, t.bos_id));
    CHECK(tokenizer_token_id(&t, "<s>") == t.bos_id && tokenizer_token_id(&t, "<unk>") == t.unk_id && tokenizer_token_id(&t, "not a piece") == -1 &&
          tokenizer_token_id(&t, NULL) == -1 && t.kind == TOKENIZER_SENTENCEPIECE, "tokenizer_token_id: <s>, <unk>, absent; kind", "%d %d",
          tokenizer_token_id(&t, "<s>"), tokenizer_token_id(&t, "not a piece"));
    int n;
    int *ids = tokenizer_encode(&t, "", 0, 1, 1, &n);
    CHECK(ids && n == 2 && ids[0] == t.bos_id && ids[1] == t.eos_id, "encode empty with bos/eos", "n=%d", n);
    free(ids);
    ids = tokenizer_encode(&t, NULL, 0, 0, 0, &n);
    CHECK(ids && n == 0, "encode NULL,0 -> no ids", "n=%d", n);
    free(ids);
    ids = tokenizer_encode(&t, "Hello world", 11, 0, 0, &n);
    int *withbad = (int *)malloc((n + 3) * sizeof(int));
    withbad[0] = -5; memcpy(withbad + 1, ids, n * sizeof(int)); withbad[n + 1] = t.vocab_size; withbad[n + 2] = 1 << 30;
    size_t l1, l2;
    char *a = tokenizer_decode(&t, ids, n, &l1), *b = tokenizer_decode(&t, withbad, n + 3, &l2);
    CHECK(a && b && l1 == 11 && l1 == l2 && strcmp(a, "Hello world") == 0 && strcmp(a, b) == 0, "decode skips out-of-range ids", "'%s' vs '%s'", a, b);
    free(a); free(b); free(ids); free(withbad);
    a = tokenizer_decode(&t, NULL, 0, &l1);
    CHECK(a && l1 == 0 && a[0] == 0, "decode of nothing is \"\"", "len %zu", l1);
    free(a);
    tokenizer_free(&t);
    tokenizer_free(&t); // twice is harmless
}

int main(void) {
    static const char *const names[] = {"tok512", "tok1000", "tok4000", "variant", "unused", "llama2",
                                        "bpe_llama3", "bpe_gpt2", "bpe_unk", "llama3"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        char path[256];
        snprintf(path, sizeof(path), FIXTURES "%s_expected.txt", names[i]);
        if (strcmp(names[i], "llama3") == 0 && !getenv("LLAMA3_TOKENIZER")) {
            test_skip("llama3 tokenizer.json cases", "LLAMA3_TOKENIZER (the path of Meta's Llama-3 tokenizer.json) is not set");
            continue;
        }
        if (strcmp(names[i], "llama3") == 0 && access(path, R_OK) != 0) {
            test_skip("llama3 tokenizer.json cases", FIXTURES "llama3_expected.txt is missing: make it with "
                      "python3 dev/reference/make_bpe_fixtures.py --llama3 $LLAMA3_TOKENIZER");
            continue;
        }
        run_fixture(names[i], path);
    }
    api_details();
    bad_inputs();
    bad_json_inputs();
    return test_summary();
}
