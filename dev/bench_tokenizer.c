// Times tokenizer.h on ~1 MB of text encoded as ONE string (the worst case:
// Llama's normalizer does no word splitting, so BPE sees one long sequence).
// The text is the shared samsum/alpaca samples concatenated when present,
// else generated. Not a test: prints MB/s.
//   gcc -O2 -Wall -Wextra -std=c11 -o /tmp/bench_tokenizer dev/bench_tokenizer.c
//   /tmp/bench_tokenizer [tokenizer.model | tokenizer.json] [--one-line] [--text FILE]
//     model: default ../shared/data/llama2/tokenizer.model, else test/fixtures/tokenizer/tok4000.model
//     --one-line: newlines become spaces first. For Llama a newline is never
//       merged, which lets encode run BPE per stretch between them; without
//       any such break BPE runs on the whole 1 MB at once (the slow case).
//     --text FILE: that file's bytes (up to 64 MB) instead; dev/bench_tokenizer.py
//       passes the text it times the `tokenizers` library on, and compares the
//       ids' checksum printed here with its own
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "../tokenizer.h"

static double now(void) {
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// appends the file at path to buf (capacity cap); returns the new length
static size_t append_file(char *buf, size_t n, size_t cap, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return n;
    n += fread(buf + n, 1, cap - n, f);
    fclose(f);
    return n;
}

int main(int argc, char **argv) {
    const char *text_file = NULL;
    if (argc > 2 && strcmp(argv[argc - 2], "--text") == 0) { text_file = argv[argc - 1]; argc -= 2; }
    int one_line = argc > 1 && strcmp(argv[argc - 1], "--one-line") == 0;
    if (one_line) argc--;
    const char *path = argc > 1 ? argv[1] : "../shared/data/llama2/tokenizer.model";
    if (argc <= 1) {
        FILE *f = fopen(path, "rb");
        if (f) fclose(f);
        else path = "test/fixtures/tokenizer/tok4000.model";
    }
    Tokenizer tok;
    double t0 = now();
    if (tokenizer_load(&tok, path) != 0) return 1;
    double t_load = now() - t0;

    const size_t target = text_file ? (size_t)64 << 20 : 1 << 20;
    char *text = (char *)malloc(target);
    size_t n = 0;
    const char *source = "shared samsum + alpaca samples";
    if (text_file) {
        n = append_file(text, 0, target, text_file);
        source = text_file;
    }
    // real text, repeated until 1 MB
    for (int rounds = 0; !text_file && n < target && rounds < 100; rounds++) {
        size_t before = n;
        n = append_file(text, n, target, "../shared/data/samsum/samsum_test_300.jsonl");
        n = append_file(text, n, target, "../shared/data/alpaca/alpaca_1000.json");
        if (n == before) break;
    }
    if (!text_file && n < target) { // generated: words, code-like indentation, digits, some UTF-8
        static const char *const parts[] = {"the ", "quick ", "brown ", "fox ", "jumps ", "over ", "lazy ", "dog",
                                            ". ", "\n", "    ", "return x * 2;", "12345 ", "caf\xc3\xa9 ",
                                            "\xe6\x97\xa5\xe6\x9c\xac ", "\xf0\x9f\x98\x80 ", "tokenization ", "\t"};
        unsigned s = 12345;
        source = n ? "shared samples + generated text" : "generated text";
        while (n < target) {
            s = s * 1103515245u + 12345u;
            const char *p = parts[(s >> 16) % (sizeof(parts) / sizeof(parts[0]))];
            size_t l = strlen(p);
            if (n + l > target) break;
            memcpy(text + n, p, l); n += l;
        }
    }

    if (one_line)
        for (size_t i = 0; i < n; i++) if (text[i] == '\n') text[i] = ' ';

    int n_ids = 0;
    unsigned long long checksum = 0; // sum of (i + 1) * ids[i] mod 2^64, what dev/bench_tokenizer.py compares
    double best_enc = 1e30, best_dec = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        t0 = now();
        int *ids = tokenizer_encode(&tok, text, n, 1, 0, &n_ids);
        double t = now() - t0;
        if (!ids) { fprintf(stderr, "out of memory\n"); return 1; }
        if (t < best_enc) best_enc = t;
        checksum = 0;
        for (int i = 0; i < n_ids; i++) checksum += (unsigned long long)(i + 1) * (unsigned long long)ids[i];
        size_t len;
        t0 = now();
        char *back = tokenizer_decode(&tok, ids, n_ids, &len);
        t = now() - t0;
        if (t < best_dec) best_dec = t;
        if (!back || len != n || memcmp(back, text, n) != 0) printf("note: decode(encode(text)) != text\n");
        free(ids); free(back);
    }
    double mb = (double)n / (1 << 20);
    printf("model %s (%d pieces), loaded in %.1f ms\n", path, tok.vocab_size, 1e3 * t_load);
    printf("text: %.2f MB of %s%s, one string -> %d tokens\n", mb, source, one_line ? " (newlines -> spaces)" : "", n_ids);
    printf("encode: %.1f ms, %.1f MB/s, %.2f M tokens/s (best of 5); ids checksum %llu\n", 1e3 * best_enc, mb / best_enc,
           1e-6 * n_ids / best_enc, checksum);
    printf("decode: %.1f ms, %.1f MB/s (best of 5)\n", 1e3 * best_dec, mb / best_dec);
    free(text);
    tokenizer_free(&tok);
    return 0;
}
