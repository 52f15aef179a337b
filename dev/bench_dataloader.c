// Times dataloader.h on a large generated SAMSum-like JSONL: tokenization
// (first load, writes the token cache), the cached load, and batching; prints
// peak memory to show the data file is streamed, not read whole. Not a test.
//   make dev/bench_dataloader
//   dev/bench_dataloader [MB (default 200)] [tokenizer.model]
//     tokenizer: default ../shared/data/llama2/tokenizer.model, else the tiny test one
// The data goes to /tmp/bench_dataloader.jsonl (+ .tokcache); both are removed at the end.
#include <sys/resource.h>
#include <time.h>
#include "../dataloader.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static double peak_rss_mb(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss / 1024.0; // Linux: KiB
}
// current resident memory split as the kernel counts it: anonymous (heap) and file-backed (the mapped cache)
static void rss_now(double *anon_mb, double *file_mb) {
    *anon_mb = *file_mb = 0;
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        long kb;
        if (sscanf(line, "RssAnon: %ld kB", &kb) == 1) *anon_mb = kb / 1024.0;
        if (sscanf(line, "RssFile: %ld kB", &kb) == 1) *file_mb = kb / 1024.0;
    }
    fclose(f);
}

static const char *NAMES[] = {"Anna", "Ben", "Chloe", "Dmitri", "Eve", "Farah", "Gus", "Hannah", "Igor", "Jules", "Kim", "Luca"};
static const char *WORDS[] = {"are", "you", "coming", "tonight", "I", "think", "so", "the", "train", "is", "late", "again", "can",
                              "we", "meet", "at", "seven", "sure", "bring", "snacks", "did", "see", "new", "movie", "it", "was",
                              "great", "honestly", "weird", "ending", "what", "time", "tomorrow", "okay", "thanks", "😂", "café",
                              "lol", "no", "way", "really?", "maybe", "later", "send", "me", "photos", "please"};
#define NW (sizeof WORDS / sizeof WORDS[0])

// ~mb MB of {"id", "dialogue", "summary"} lines, deterministic
static long generate(const char *path, long mb) {
    FILE *f = fopen(path, "w");
    if (!f) die("cannot write %s", path);
    uint64_t rng = 42;
    long n = 0;
    char line[8192];
    while (ftell(f) < mb * 1000000L) {
        int len = snprintf(line, sizeof line, "{\"id\": \"%ld\", \"dialogue\": \"", n);
        int turns = 3 + (int)(rng_next(&rng) % 12);
        for (int t = 0; t < turns; t++) {
            len += snprintf(line + len, sizeof line - len, "%s%s:", t ? "\\n" : "", NAMES[rng_next(&rng) % 12]);
            int words = 2 + (int)(rng_next(&rng) % 14);
            for (int w = 0; w < words; w++) len += snprintf(line + len, sizeof line - len, " %s", WORDS[rng_next(&rng) % NW]);
        }
        len += snprintf(line + len, sizeof line - len, "\", \"summary\": \"%s and %s", NAMES[rng_next(&rng) % 12], NAMES[rng_next(&rng) % 12]);
        int words = 5 + (int)(rng_next(&rng) % 20);
        for (int w = 0; w < words; w++) len += snprintf(line + len, sizeof line - len, " %s", WORDS[rng_next(&rng) % NW]);
        len += snprintf(line + len, sizeof line - len, ".\"}\n");
        fwrite(line, 1, (size_t)len, f);
        n++;
    }
    fclose(f);
    return n;
}

static double batches(const Dataset *ds, int B, int steps, long *tokens_out) {
    DataLoader dl;
    dataloader_init(&dl, ds, 1, 1, 0, 1);
    int L = dataset_max_len(ds), T;
    int *tk = (int *)mallocCheck((size_t)B * L * sizeof(int)), *tg = (int *)mallocCheck((size_t)B * L * sizeof(int));
    long tokens = 0;
    double t0 = now();
    for (int s = 0; s < steps; s++) {
        dataloader_next_batch(&dl, B, 0, tk, tg, &T);
        tokens += (long)B * T;
    }
    double dt = now() - t0;
    free(tk); free(tg);
    dataloader_free(&dl);
    *tokens_out = tokens;
    return dt;
}

int main(int argc, char **argv) {
    long mb = argc > 1 ? atol(argv[1]) : 200;
    const char *tokpath = argc > 2 ? argv[2] : "../shared/data/llama2/tokenizer.model";
    if (argc <= 2 && access(tokpath, R_OK) != 0) tokpath = "test/fixtures/tiny_gqa/tokenizer.model";
    const char *path = "/tmp/bench_dataloader.jsonl", *cache = "/tmp/bench_dataloader.jsonl.tokcache";
    remove(cache);
    Tokenizer tok;
    if (tokenizer_load(&tok, tokpath) != 0) return 1;
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    double t0 = now();
    long records = generate(path, mb);
    struct stat st;
    stat(path, &st);
    printf("generated %s: %.1f MB, %ld records in %.1f s\n", path, st.st_size / 1e6, records, now() - t0);
    printf("tokenizer %s, %d threads\n\n", tokpath, threads);

    DataOptions o;
    memset(&o, 0, sizeof o);
    o.max_seq_len = 512;
    o.quiet = 1;
    Dataset ds;
    double anon, file;
    t0 = now();
    if (dataset_load(&ds, path, &tok, tokpath, &o) != 0) return 1;
    double t_tok = now() - t0;
    rss_now(&anon, &file);
    double peak_tok = peak_rss_mb();
    long n_tokens = (long)ds.store->h.n_tokens;
    struct stat cs;
    stat(cache, &cs);
    printf("| step | time | throughput | memory |\n|---|---|---|---|\n");
    printf("| first load: stream, parse, tokenize, write cache (%.0f MB) | %.2f s | %.2f M tokens/s, %.1f MB/s of JSONL (%ld tokens) | "
           "peak RSS %.0f MB; now %.0f MB heap + %.0f MB mapped cache |\n",
           cs.st_size / 1e6, t_tok, n_tokens / t_tok / 1e6, st.st_size / 1e6 / t_tok, n_tokens, peak_tok, anon, file);
    dataset_free(&ds);

    t0 = now();
    if (dataset_load(&ds, path, &tok, tokpath, &o) != 0 || ds.cache_status != CACHE_REUSED) die("the cache was not reused");
    double t_cache = now() - t0;
    rss_now(&anon, &file);
    printf("| cached load (verify checksum, index, rows; padding) | %.2f s | %.0f M tokens/s | now %.0f MB heap + %.0f MB mapped cache |\n",
           t_cache, n_tokens / t_cache / 1e6, anon, file);
    long tokens;
    double dt = batches(&ds, 8, 20000, &tokens);
    printf("| batching: padding, B=8, max_seq_len 512, shuffled (20000 batches) | %.2f s | %.1f M tokens/s (incl. padding) | |\n", dt,
           tokens / dt / 1e6);
    dataset_free(&ds);
    o.packing = 1;
    t0 = now();
    if (dataset_load(&ds, path, &tok, tokpath, &o) != 0) return 1;
    double t_pack = now() - t0;
    printf("| cached load, packing to 512 (%ld rows) | %.2f s | | |\n", ds.n_rows, t_pack);
    dt = batches(&ds, 8, 20000, &tokens);
    rss_now(&anon, &file);
    printf("| batching: packing, B=8, rows of 512, shuffled (20000 batches) | %.2f s | %.1f M tokens/s | now %.0f MB heap + %.0f MB mapped cache |\n",
           dt, tokens / dt / 1e6, anon, file);
    dataset_free(&ds);
    printf("\npeak RSS of the whole run: %.0f MB (data file %.0f MB, cache %.0f MB)\n", peak_rss_mb(), st.st_size / 1e6, cs.st_size / 1e6);
    tokenizer_free(&tok);
    remove(path);
    remove(cache);
    return 0;
}
