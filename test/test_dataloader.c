// Tests of dataloader.h: formats, templates, masks, padding and packing,
// truncation against sentencepiece-made expectations
// (dev/reference/make_dataloader_fixtures.py), then epochs and shuffling,
// slices, the validation split, per-rank slices, the token cache and bad input.
// Run from the repository root; temporary files go to a fresh /tmp directory.
#include "../dataloader.h"
#include "test_common.h"
#include <time.h>

#define TINY_TOKENIZER "test/fixtures/tiny_gqa/tokenizer.model"
#define LLAMA_TOKENIZER "../shared/data/llama2/tokenizer.model"
static Tokenizer tok;
static char tmp[256];      // this run's temporary directory
static char cache_dir[300];

// a path in tmp; valid until 8 more calls
static const char *tmp_path(const char *name) {
    static char buf[8][512];
    static int k = 0;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmp, name);
    return buf[k];
}
static void write_text(const char *path, const char *text) {
    if (write_bytes_atomic(path, text, strlen(text)) != 0) die("cannot write %s", path);
}
static DataOptions opts(const char *format, int train_on_prompt, int packing, int max_seq_len) {
    DataOptions o;
    memset(&o, 0, sizeof o);
    o.format = format;
    o.train_on_prompt = train_on_prompt;
    o.packing = packing;
    o.max_seq_len = max_seq_len;
    o.slice = "";
    o.cache_dir = cache_dir;
    o.quiet = 1;
    return o;
}
static int load(Dataset *ds, const char *path, DataOptions o) { return dataset_load(ds, path, &tok, TINY_TOKENIZER, &o); }

// the JSONL file of n {"text": "sample <i> ..."} records; record `empty` (if >= 0) has an empty text
static void write_samples(const char *path, int n, int empty) {
    size_t cap = (size_t)n * 128 + 16, len = 0;
    char *s = (char *)mallocCheck(cap);
    for (int i = 0; i < n; i++) {
        if (i == empty) len += (size_t)snprintf(s + len, cap - len, "{\"text\": \"\"}\n");
        else len += (size_t)snprintf(s + len, cap - len, "{\"text\": \"sample %d%.*s\"}\n", i, i % 7 * 3, " the cat sat on the mat again");
    }
    write_text(path, s);
    free(s);
}

// the record (0-based position in the file) of sample i of ds
static long rec_of(const Dataset *ds, long i) { return (long)ds->store->index[ds->samples[i]].record; }

// ----------------------------------------------------------------------------
// expected rows from sentencepiece

static int json_int_at(const JsonValue *a, int i) { return (int)a->items[i].number; }

// compares every row of ds with the expected rows; "" when equal
static void compare_rows(const Dataset *ds, const JsonValue *rows, const JsonValue *targets, long labels, char *why, size_t n) {
    why[0] = 0;
    if (ds->n_rows != rows->count) { snprintf(why, n, "%ld rows, expected %d", ds->n_rows, rows->count); return; }
    int L = dataset_max_len(ds), maxlen = 0;
    for (int r = 0; r < rows->count; r++) maxlen = rows->items[r].count > maxlen ? rows->items[r].count : maxlen;
    if (L != maxlen) { snprintf(why, n, "dataset_max_len %d, expected %d", L, maxlen); return; }
    int *tk = (int *)mallocCheck((size_t)L * rows->count * sizeof(int)), *tg = (int *)mallocCheck((size_t)L * rows->count * sizeof(int)), T;
    long got_labels = 0;
    for (int r = 0; r < rows->count && !why[0]; r++) {
        const JsonValue *er = &rows->items[r], *et = &targets->items[r];
        long lab = dataset_get_rows(ds, r, 1, -7, tk, tg, &T);
        got_labels += lab;
        if (T != er->count) { snprintf(why, n, "row %d: length %d, expected %d", r, T, er->count); break; }
        if (lab != ds->row_labels[r]) { snprintf(why, n, "row %d: %ld labels filled, row_labels says %d", r, lab, ds->row_labels[r]); break; }
        for (int t = 0; t < T; t++) {
            if (tk[t] != json_int_at(er, t)) { snprintf(why, n, "row %d token %d: %d, expected %d", r, t, tk[t], json_int_at(er, t)); break; }
            if (tg[t] != json_int_at(et, t)) { snprintf(why, n, "row %d target %d: %d, expected %d", r, t, tg[t], json_int_at(et, t)); break; }
        }
    }
    // all rows in one batch: padded on the right to the longest with pad_id / -100
    if (!why[0]) {
        long all = dataset_get_rows(ds, 0, rows->count, -7, tk, tg, &T);
        for (int r = 0; r < rows->count && !why[0]; r++)
            for (int t = 0; t < T; t++) {
                int len = rows->items[r].count;
                int wt = t < len ? json_int_at(&rows->items[r], t) : -7, wg = t < len ? json_int_at(&targets->items[r], t) : -100;
                if (tk[r * T + t] != wt || tg[r * T + t] != wg) { snprintf(why, n, "batch row %d position %d: padding wrong", r, t); break; }
            }
        if (!why[0] && (all != labels || got_labels != labels || ds->n_labels != labels))
            snprintf(why, n, "labels %ld / %ld / %ld, expected %ld", all, got_labels, ds->n_labels, labels);
    }
    free(tk); free(tg);
}

static void compare_skips(const Dataset *ds, const JsonValue *skipped, char *why, size_t n) {
    why[0] = 0;
    if (ds->n_skipped != skipped->count) { snprintf(why, n, "%ld skipped, expected %d", ds->n_skipped, skipped->count); return; }
    for (int i = 0; i < skipped->count && i < DATA_SKIP_LIST; i++) {
        const JsonValue *s = &skipped->items[i];
        long line = (long)s->items[0].number;
        const char *reason = s->items[1].string;
        if ((line && ds->skip_line[i] != line) || strcmp(skip_reason_names[ds->skip_reason[i]], reason) != 0) {
            snprintf(why, n, "skip %d: line %ld (%s), expected line %ld (%s)", i, ds->skip_line[i], skip_reason_names[ds->skip_reason[i]], line, reason);
            return;
        }
    }
}

static void run_cases(const char *expected_path, const Tokenizer *t, const char *tokpath) {
    JsonValue exp;
    if (json_load_file(expected_path, &exp) != 0) die("cannot read %s", expected_path);
    const JsonValue *cases = json_get(&exp, "cases");
    for (int c = 0; c < cases->count; c++) {
        const JsonValue *k = &cases->items[c];
        const char *file, *format;
        long long top, packing, L, max_samples;
        if (json_get_string(k, "file", &file, NULL) || json_get_string(k, "format", &format, NULL) || json_get_int(k, "train_on_prompt", &top) ||
            json_get_int(k, "packing", &packing) || json_get_int(k, "max_seq_len", &L) || json_get_int(k, "max_samples", &max_samples))
            die("%s: case %d is malformed", expected_path, c);
        DataOptions o = opts(format, (int)top, (int)packing, (int)L);
        o.max_samples = (long)max_samples;
        Dataset ds;
        char what[512], why[512] = "";
        snprintf(what, sizeof what, "%s: %s format %s, %s, max_seq_len %lld, train_on_prompt %lld%s", strrchr(expected_path, '/') + 1,
                 file, format, packing ? "packing" : "padding", L, top, max_samples ? ", max_samples" : "");
        if (dataset_load(&ds, file, t, tokpath, &o) != 0) { CHECK(0, what, "load failed: %s", ds.error); continue; }
        compare_rows(&ds, json_get(k, "rows"), json_get(k, "targets"), (long)json_get(k, "labels")->number, why, sizeof why);
        if (!why[0]) compare_skips(&ds, json_get(k, "skipped"), why, sizeof why);
        CHECK(!why[0], what, "%s", why);
        dataset_free(&ds);
    }
    json_free(&exp);
}

// ----------------------------------------------------------------------------
// chat templates against transformers' apply_chat_template (make_chat_fixtures.py):
// each family's folder holds its tokenizer_config.json

static void test_chat_families(void) {
    const char *dir = "test/fixtures/chat";
    char path[400];
    snprintf(path, sizeof path, "%s/expected.json", dir);
    JsonValue exp;
    if (json_load_file(path, &exp) != 0) die("cannot read %s", path);
    const JsonValue *cases = json_get(&exp, "cases");
    snprintf(path, sizeof path, "%s/chat.jsonl", dir);
    for (int f = 0; f < cases->count; f++) {
        const char *family = cases->keys[f], *tokpath;
        const JsonValue *want = json_get(&cases->items[f], "chats");
        char folder[300], what[300], why[300] = "";
        snprintf(folder, sizeof folder, "%s/%s", dir, family);
        if (json_get_string(&cases->items[f], "tokenizer", &tokpath, NULL) != 0 || !want) die("%s: %s is malformed", dir, family);
        snprintf(what, sizeof what, "chat: %s's template == apply_chat_template (ids and assistant mask, %d chats)", family, want->count);
        Tokenizer t;
        Dataset ds;
        if (tokenizer_load(&t, tokpath) != 0 || tokenizer_configure(&t, folder, folder) != 0) { CHECK(0, what, "cannot load %s", tokpath); continue; }
        DataOptions o = opts("chat", 0, 0, 4096);
        if (dataset_load(&ds, path, &t, tokpath, &o) != 0) { CHECK(0, what, "load failed: %s", ds.error); tokenizer_free(&t); continue; }
        for (int r = 0; r < want->count && !why[0]; r++) {
            const JsonValue *ids = json_get(&want->items[r], "ids"), *labels = json_get(&want->items[r], "labels");
            int n = ids->count, T, tokens[4096], targets[4096];
            if (ds.n_rows != want->count) { snprintf(why, sizeof why, "%ld rows, expected %d", ds.n_rows, want->count); break; }
            dataset_get_rows(&ds, r, 1, t.eos_id, tokens, targets, &T);
            if (T != n) { snprintf(why, sizeof why, "chat %d: %d tokens, expected %d", r, T, n); break; }
            for (int i = 0; i < n && !why[0]; i++) {
                int target = i + 1 < n && json_int_at(labels, i + 1) ? json_int_at(ids, i + 1) : -100;
                if (tokens[i] != json_int_at(ids, i)) snprintf(why, sizeof why, "chat %d token %d: %d, expected %d", r, i, tokens[i], json_int_at(ids, i));
                else if (targets[i] != target) snprintf(why, sizeof why, "chat %d target %d: %d, expected %d", r, i, targets[i], target);
            }
        }
        CHECK(!why[0], what, "%s", why);
        dataset_free(&ds);
        tokenizer_free(&t);
    }
    json_free(&exp);
}

// ----------------------------------------------------------------------------
// epochs and shuffling

// the stream of rows (by index) that `batches` batches of B rows give
static void draw(DataLoader *dl, int batches, int B, long *out) {
    int T, L = dataset_max_len(dl->ds);
    int *tk = (int *)mallocCheck((size_t)B * L * sizeof(int)), *tg = (int *)mallocCheck((size_t)B * L * sizeof(int));
    int *rt = (int *)mallocCheck((size_t)L * sizeof(int)), *rg = (int *)mallocCheck((size_t)L * sizeof(int));
    for (int i = 0; i < batches; i++) {
        dataloader_next_batch(dl, B, 0, tk, tg, &T);
        for (int b = 0; b < B; b++) { // which row is it? (each row of these datasets is unique)
            long found = -1;
            for (long r = 0; r < dl->ds->n_rows && found < 0; r++) {
                int Tr;
                dataset_get_rows(dl->ds, r, 1, 0, rt, rg, &Tr);
                int same = Tr <= T;
                for (int t = 0; t < T && same; t++) same = tk[b * T + t] == (t < Tr ? rt[t] : 0);
                if (same) found = r;
            }
            out[(long)i * B + b] = found;
        }
    }
    free(tk); free(tg); free(rt); free(rg);
}

static int is_permutation(const long *x, long n) {
    char *seen = (char *)callocCheck((size_t)n, 1);
    int ok = 1;
    for (long i = 0; i < n && ok; i++) {
        ok = x[i] >= 0 && x[i] < n && !seen[x[i]];
        if (ok) seen[x[i]] = 1;
    }
    free(seen);
    return ok;
}

static void test_epochs(void) {
    const char *path = tmp_path("epochs.jsonl");
    write_samples(path, 37, -1);
    Dataset ds;
    if (load(&ds, path, opts("auto", 0, 0, 64)) != 0) die("epochs data: %s", ds.error);
    const int B = 5, N = 37, batches = 3 * N / B + 1; // the stream runs over 3+ epochs, batches straddle them
    long a[200], b[200], c[200], d[200];
    DataLoader dl;
    dataloader_init(&dl, &ds, 1, 1234, 0, 1); draw(&dl, batches, B, a); dataloader_free(&dl);
    dataloader_init(&dl, &ds, 1, 1234, 0, 1); draw(&dl, batches, B, b); dataloader_free(&dl);
    dataloader_init(&dl, &ds, 1, 99, 0, 1); draw(&dl, batches, B, c); dataloader_free(&dl);
    dataloader_init(&dl, &ds, 0, 1234, 0, 1); draw(&dl, batches, B, d); dataloader_free(&dl);
    CHECK(memcmp(a, b, sizeof(long) * batches * B) == 0, "shuffle: the same seed gives the same order", "");
    CHECK(memcmp(a, c, sizeof(long) * N) != 0, "shuffle: another seed gives another order", "");
    int perms = 1;
    for (int e = 0; e < 3; e++) perms &= is_permutation(a + e * N, N);
    CHECK(perms, "shuffle: every row exactly once per epoch (3 epochs, batches across epoch ends)", "");
    CHECK(memcmp(a, a + N, sizeof(long) * N) != 0 && memcmp(a + N, a + 2 * N, sizeof(long) * N) != 0, "shuffle: each epoch a new order", "");
    int in_order = 1;
    for (long i = 0; i < (long)batches * B; i++) in_order &= d[i] == i % N;
    CHECK(in_order, "no shuffle: rows in file order, epoch after epoch", "");
    int moved = 0;
    for (int i = 0; i < N; i++) moved += a[i] != i;
    CHECK(moved > N / 2, "shuffle: the order is actually shuffled", "%d of %d rows moved", moved, N);

    // the position (epoch, pos) restores the stream (a later resume uses it)
    dataloader_init(&dl, &ds, 1, 1234, 0, 1);
    draw(&dl, 9, B, c);
    CHECK(dl.epoch == 1 && dl.pos == 9 * B - N, "position: (epoch, pos) after 45 rows of 37", "(%ld, %ld)", dl.epoch, dl.pos);
    long epoch = dl.epoch, pos = dl.pos;
    dataloader_free(&dl);
    dataloader_init(&dl, &ds, 1, 1234, 0, 1);
    dataloader_seek(&dl, epoch, pos);
    draw(&dl, 6, B, c);
    dataloader_free(&dl);
    CHECK(memcmp(c, a + 9 * B, sizeof(long) * 6 * B) == 0, "position: dataloader_seek continues the same stream", "");
    dataset_free(&ds);
}

// ----------------------------------------------------------------------------
// slices, max_samples, validation split

static void test_slices(void) {
    const char *path = tmp_path("slices.jsonl");
    write_samples(path, 25, 5); // 25 records, record 5 is skipped (empty text)
    struct { const char *slice; long max; long first, count, skipped; } cases[] = {
        {"", 0, 0, 24, 1},
        {"[:10%]", 0, 0, 2, 0},          // round(2.5) = 2 (half to even, as HF datasets)
        {"[:30%]", 0, 0, 7, 1},          // round(7.5) = 8 records, one skipped
        {"[10%:20%]", 0, 2, 3, 0},       // records [2, 5): 2, 3, 4
        {"[20%:40%]", 0, 6, 4, 1},       // records [5, 10): 5 is skipped
        {"[:4]", 0, 0, 4, 0},
        {"[20:]", 0, 20, 5, 0},
        {"train[-3:]", 0, 22, 3, 0},
        {"[-5:-2]", 0, 20, 3, 0},
        {"[3:100]", 0, 3, 21, 1},
        {"", 3, 0, 3, 0},                // max_samples
        {"[4:]", 3, 4, 3, 1},            // records 4, (5 skipped), 6, 7
        {"[:50%]", 100, 0, 11, 1},       // round(12.5) = 12 records, one skipped
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        DataOptions o = opts("auto", 0, 0, 64);
        o.slice = cases[i].slice;
        o.max_samples = cases[i].max;
        Dataset ds;
        char what[128];
        snprintf(what, sizeof what, "slice \"%s\", max_samples %ld", cases[i].slice, cases[i].max);
        if (load(&ds, path, o) != 0) { CHECK(0, what, "%s", ds.error); continue; }
        int ok = ds.n_samples == cases[i].count && ds.n_skipped == cases[i].skipped;
        for (long k = 0, r = cases[i].first; ok && k < ds.n_samples; k++, r++) {
            if (r == 5) r++;
            ok = rec_of(&ds, k) == r;
        }
        CHECK(ok, what, "%ld samples from record %ld, %ld skipped; expected %ld from %ld, %ld skipped", ds.n_samples,
              ds.n_samples ? rec_of(&ds, 0) : -1, ds.n_skipped, cases[i].count, cases[i].first, cases[i].skipped);
        dataset_free(&ds);
    }
    const char *bad[] = {"[1:2%]", "[abc]", "[:101%]", "[1:2", "[:5]x", "[25:]"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        DataOptions o = opts("auto", 0, 0, 64);
        o.slice = bad[i];
        Dataset ds;
        char what[128];
        snprintf(what, sizeof what, "slice \"%s\" is an error naming the file", bad[i]);
        int rc = load(&ds, path, o);
        CHECK(rc == -1 && strstr(ds.error, "slices.jsonl") && (strstr(ds.error, bad[i]) || strstr(ds.error, "no samples")), what, "rc %d: %s", rc, ds.error);
        if (rc == 0) dataset_free(&ds);
    }
}

static void test_val_split(void) {
    const char *path = tmp_path("split.jsonl");
    write_samples(path, 40, -1);
    for (int packing = 0; packing < 2; packing++) {
        Dataset all, tr, va, tr2, va2, tr3, va3;
        if (load(&all, path, opts("auto", 0, packing, packing ? 16 : 64)) != 0) die("split data: %s", all.error);
        char what[128];
        snprintf(what, sizeof what, "val_split 0.2 (%s): 8 validation and 32 training samples, disjoint, covering all", packing ? "packing" : "padding");
        int rc = dataset_split(&all, 0.2, 7, &tr, &va);
        char *seen = (char *)callocCheck(40, 1);
        int ok = rc == 0 && va.n_samples == 8 && tr.n_samples == 32;
        for (long i = 0; ok && i < tr.n_samples; i++) seen[rec_of(&tr, i)]++;
        for (long i = 0; ok && i < va.n_samples; i++) seen[rec_of(&va, i)]++;
        for (int i = 0; ok && i < 40; i++) ok = seen[i] == 1;
        for (long i = 1; ok && i < va.n_samples; i++) ok = rec_of(&va, i) > rec_of(&va, i - 1); // file order
        free(seen);
        CHECK(ok, what, "rc %d, %ld + %ld samples", rc, va.n_samples, tr.n_samples);
        dataset_split(&all, 0.2, 7, &tr2, &va2);
        dataset_split(&all, 0.2, 8, &tr3, &va3);
        int same = va2.n_samples == va.n_samples, other = 0;
        for (long i = 0; i < va.n_samples; i++) { same &= rec_of(&va, i) == rec_of(&va2, i); other |= rec_of(&va, i) != rec_of(&va3, i); }
        snprintf(what, sizeof what, "val_split (%s): the same seed gives the same split, another seed another", packing ? "packing" : "padding");
        CHECK(same && other, what, "");
        if (packing) {
            long tokens = 0;
            for (long i = 0; i < va.n_samples; i++) tokens += all.store->index[va.samples[i]].n_tokens;
            CHECK(va.n_rows == (tokens / 16 ? tokens / 16 : 1) && va.packing, "val_split (packing): the validation half is packed on its own", "%ld rows from %ld tokens", va.n_rows, tokens);
        }
        dataset_free(&tr2); dataset_free(&va2); dataset_free(&tr3); dataset_free(&va3);
        dataset_free(&all); // the halves share the tokens and outlive it
        int T, tk[64], tg[64];
        long lab = dataset_get_rows(&va, 0, 1, 0, tk, tg, &T);
        CHECK(lab > 0 && T > 0, "val_split: the halves stay usable after the full set is freed", "");
        dataset_free(&tr); dataset_free(&va);
    }
    Dataset all, tr, va;
    if (load(&all, path, opts("auto", 0, 0, 64)) != 0) die("split data");
    all.quiet = 1;
    int r1 = dataset_split(&all, 0.999, 1, &tr, &va), r2 = dataset_split(&all, 0, 1, &tr, &va), r3 = dataset_split(&all, 1.5, 1, &tr, &va);
    CHECK(r1 == -1 && r2 == -1 && r3 == -1 && strstr(tr.error, "split.jsonl"), "val_split: fractions that leave a half empty are errors", "%d %d %d", r1, r2, r3);
    dataset_free(&all);
}

// ----------------------------------------------------------------------------
// per-rank slices: W ranks of B rows together are world size 1 with W*B rows

static void test_ranks(void) {
    const char *path = tmp_path("ranks.jsonl");
    write_samples(path, 29, -1);
    for (int packing = 0; packing < 2; packing++)
        for (int W = 2; W <= 3; W++) {
            Dataset ds;
            if (load(&ds, path, opts("auto", 0, packing, packing ? 12 : 64)) != 0) die("ranks data: %s", ds.error);
            const int B = 2, steps = 2 * (int)ds.n_rows / (W * B) + 2;
            int L = dataset_max_len(&ds), T1, Tr;
            int *t1 = (int *)mallocCheck((size_t)W * B * L * sizeof(int)), *g1 = (int *)mallocCheck((size_t)W * B * L * sizeof(int));
            int *tr = (int *)mallocCheck((size_t)B * L * sizeof(int)), *gr = (int *)mallocCheck((size_t)B * L * sizeof(int));
            DataLoader one, *rank = (DataLoader *)mallocCheck((size_t)W * sizeof(DataLoader));
            dataloader_init(&one, &ds, 1, 5, 0, 1);
            for (int r = 0; r < W; r++) dataloader_init(&rank[r], &ds, 1, 5, r, W);
            int same = 1, labels_ok = 1;
            for (int s = 0; s < steps; s++) {
                long l1 = dataloader_next_batch(&one, W * B, -1, t1, g1, &T1), sum = 0;
                for (int r = 0; r < W; r++) {
                    long lr = dataloader_next_batch(&rank[r], B, -1, tr, gr, &Tr);
                    sum += lr;
                    labels_ok &= dataloader_global_labels(&rank[r]) == l1;
                    for (int b = 0; b < B; b++) // row b of rank r is row r*B+b of the W=1 batch (T may differ: compare up to the longer)
                        for (int t = 0; t < (T1 > Tr ? T1 : Tr); t++) {
                            int x1 = t < T1 ? t1[(r * B + b) * T1 + t] : -1, y1 = t < T1 ? g1[(r * B + b) * T1 + t] : -100;
                            int xr = t < Tr ? tr[b * Tr + t] : -1, yr = t < Tr ? gr[b * Tr + t] : -100;
                            same &= x1 == xr && y1 == yr;
                        }
                }
                labels_ok &= sum == l1 && dataloader_global_labels(&one) == l1;
            }
            char what[128];
            snprintf(what, sizeof what, "ranks (%s): W=%d x B=%d equals W=1 x B=%d token for token, %d steps over epochs", packing ? "packing" : "padding", W, B, W * B, steps);
            CHECK(same, what, "");
            snprintf(what, sizeof what, "ranks (%s): W=%d label counts sum to W=1's; dataloader_global_labels on every rank", packing ? "packing" : "padding", W);
            CHECK(labels_ok, what, "");
            dataloader_free(&one);
            for (int r = 0; r < W; r++) dataloader_free(&rank[r]);
            free(rank); free(t1); free(g1); free(tr); free(gr);
            dataset_free(&ds);
        }
}

// ----------------------------------------------------------------------------
// the token cache

static int rows_equal(const Dataset *a, const Dataset *b) {
    if (a->n_rows != b->n_rows) return 0;
    int L = dataset_max_len(a), ok = dataset_max_len(b) == L, Ta, Tb;
    int *x = (int *)mallocCheck((size_t)L * 4 * sizeof(int)), *y = x + L, *u = y + L, *v = u + L;
    for (long r = 0; ok && r < a->n_rows; r++) {
        dataset_get_rows(a, r, 1, 0, x, y, &Ta);
        dataset_get_rows(b, r, 1, 0, u, v, &Tb);
        ok = Ta == Tb && memcmp(x, u, (size_t)Ta * sizeof(int)) == 0 && memcmp(y, v, (size_t)Ta * sizeof(int)) == 0;
    }
    free(x);
    return ok;
}

static void corrupt(const char *path, long offset, unsigned char xor_byte) {
    FILE *f = fopen(path, "r+b");
    if (!f) die("cannot open %s", path);
    fseek(f, offset < 0 ? 0 : offset, offset < 0 ? SEEK_END : SEEK_SET);
    if (offset < 0) fseek(f, offset, SEEK_END);
    long at = ftell(f);
    int c = fgetc(f);
    fseek(f, at, SEEK_SET);
    fputc(c ^ xor_byte, f);
    fclose(f);
}

static void test_cache(void) {
    // > DATA_BATCH_RECORDS records so tokenization runs over several batches
    char path[512]; // (tmp_path's buffers are reused)
    snprintf(path, sizeof path, "%s", tmp_path("cache.jsonl"));
    write_samples(path, 2500, 1700);
    DataOptions o = opts("auto", 0, 0, 64);
    o.cache_dir = ""; // next to the data
    Dataset a, b, m;
    int rc = load(&a, path, o);
    char cpath[600];
    snprintf(cpath, sizeof cpath, "%s.tokcache", path);
    CHECK(rc == 0 && a.cache_status == CACHE_BUILT && access(cpath, F_OK) == 0 && strcmp(a.cache_path, cpath) == 0,
          "cache: built next to the data file", "rc %d status %d path '%s'", rc, a.cache_status, a.cache_path);
    CHECK(a.n_samples == 2499 && a.n_skipped == 1 && a.skip_line[0] == 1701, "cache: 2500 records over several tokenizer batches, line 1701 skipped",
          "%ld samples, %ld skipped (line %ld)", a.n_samples, a.n_skipped, a.skip_line[0]);
    // each row is BOS + encode(text) + EOS of its own record
    int ok = 1, T, tk[64], tg[64];
    for (long r = 0; r < a.n_rows && ok; r += 97) {
        char text[128];
        long i = rec_of(&a, r);
        snprintf(text, sizeof text, "sample %ld%.*s", i, (int)(i % 7 * 3), " the cat sat on the mat again");
        int n, *ids = tokenizer_encode(&tok, text, strlen(text), 1, 1, &n);
        dataset_get_rows(&a, r, 1, 0, tk, tg, &T);
        ok = T == n && memcmp(ids, tk, (size_t)n * sizeof(int)) == 0;
        free(ids);
    }
    CHECK(ok, "cache: the rows are the records in file order, across batches", "");
    rc = load(&b, path, o);
    CHECK(rc == 0 && b.cache_status == CACHE_REUSED && rows_equal(&a, &b), "cache: reused on the next load, same rows", "status %d", b.cache_status);
    dataset_free(&b);
    DataOptions o2 = o;
    o2.train_on_prompt = 1;
    o2.packing = 1;
    o2.max_seq_len = 32;
    rc = load(&b, path, o2);
    CHECK(rc == 0 && b.cache_status == CACHE_REUSED, "cache: train_on_prompt, packing and max_seq_len do not rebuild it", "status %d", b.cache_status);
    dataset_free(&b);
    DataOptions om = o;
    om.cache_dir = tmp_path("not_a_dir/sub"); // a file is in the way: no cache can be written there
    write_text(tmp_path("not_a_dir"), "x");
    rc = load(&m, path, om);
    CHECK(rc == 0 && m.cache_status == CACHE_NONE && rows_equal(&a, &m), "cache: without a writable directory the tokens stay in memory", "rc %d status %d", rc, m.cache_status);
    // a read-only data directory (no write bits; root could still write there) gets no cache
    mkdir(tmp_path("ro"), 0755);
    write_samples(tmp_path("ro/data.jsonl"), 5, -1);
    chmod(tmp_path("ro"), 0555);
    Dataset r;
    rc = load(&r, tmp_path("ro/data.jsonl"), o);
    CHECK(rc == 0 && r.cache_status == CACHE_NONE && access(tmp_path("ro/data.jsonl.tokcache"), F_OK) != 0,
          "cache: none is written into a read-only data directory, even by root", "rc %d status %d", rc, r.cache_status);
    if (rc == 0) dataset_free(&r);
    chmod(tmp_path("ro"), 0755);
    // from here m is the reference: a maps the cache file, which the damage below changes in place
    // (the loader itself never writes a cache in place: it writes a new file and renames it)
    dataset_free(&a);

    // stale and corrupt caches are detected and rebuilt
    struct { const char *what; long offset; } damage[] = {
        {"cache: a flipped byte in the tokens (checksum mismatch) is rebuilt", 4000},
        {"cache: a flipped byte in the index is rebuilt", -100},
        {"cache: bad magic is rebuilt", 0},
        {"cache: a flipped byte in the header counts is rebuilt", 96},
    };
    for (size_t i = 0; i < sizeof damage / sizeof damage[0]; i++) {
        corrupt(cpath, damage[i].offset, 0x20);
        rc = load(&b, path, o);
        CHECK(rc == 0 && b.cache_status == CACHE_REBUILT && rows_equal(&m, &b), damage[i].what, "rc %d status %d", rc, b.cache_status);
        dataset_free(&b);
    }
    if (truncate(cpath, 5000) != 0) die("truncate");
    rc = load(&b, path, o);
    CHECK(rc == 0 && b.cache_status == CACHE_REBUILT && rows_equal(&m, &b), "cache: a truncated cache is rebuilt", "rc %d status %d", rc, b.cache_status);
    dataset_free(&b);
    write_text(cpath, "");
    rc = load(&b, path, o);
    CHECK(rc == 0 && b.cache_status == CACHE_REBUILT, "cache: an empty cache file is rebuilt", "status %d", b.cache_status);
    dataset_free(&b);
    rc = load(&b, path, o);
    CHECK(rc == 0 && b.cache_status == CACHE_REUSED, "cache: and reused after the rebuild", "status %d", b.cache_status);
    dataset_free(&b);
    Tokenizer other;
    if (tokenizer_load(&other, "test/fixtures/tokenizer/tok512.model") != 0) die("tok512");
    rc = dataset_load(&b, path, &other, "test/fixtures/tokenizer/tok512.model", &o);
    CHECK(rc == 0 && b.cache_status == CACHE_REBUILT, "cache: another tokenizer rebuilds it", "status %d", b.cache_status);
    dataset_free(&b);
    tokenizer_free(&other);
    rc = load(&b, path, o); // the cache is for this tokenizer and "auto" again
    dataset_free(&b);
    DataOptions of = o;
    of.format = "text"; // the same tokens as "auto" here, but the cache records what was asked for
    rc = load(&b, path, of);
    CHECK(rc == 0 && b.cache_status == CACHE_REBUILT, "cache: another --data_format rebuilds it", "rc %d status %d", rc, b.cache_status);
    dataset_free(&b);
    of.format = "prompt_response";
    rc = load(&b, path, of);
    CHECK(rc == -1 && strstr(b.error, "missing field \"prompt\""), "cache: another --data_format is not served from the cache", "rc %d: %s", rc, b.error);
    // the data changes (same number of records, other text): stale
    write_samples(path, 2500, 3);
    rc = load(&b, path, o);
    CHECK(rc == 0 && b.cache_status == CACHE_REBUILT && b.n_skipped == 1 && b.skip_line[0] == 4 && !rows_equal(&m, &b),
          "cache: a changed data file makes it stale, rebuilt with the new data", "rc %d status %d skip line %ld", rc, b.cache_status, b.skip_line[0]);
    dataset_free(&b);
    // same size and mtime, one byte of content changed: the hash of the first and last MiB sees it
    struct stat st;
    stat(path, &st);
    corrupt(path, 100, 0x01); // a digit of "sample N" becomes another digit
    struct timespec times[2] = {st.st_atim, st.st_mtim};
    utimensat(AT_FDCWD, path, times, 0);
    rc = load(&b, path, o);
    CHECK(rc == 0 && b.cache_status == CACHE_REBUILT, "cache: a same-size edit with the old mtime is detected (content hash)", "status %d", b.cache_status);
    dataset_free(&b);
    dataset_free(&m);
    // a cache_dir: the cache goes there, named after the data file
    DataOptions od = o;
    od.cache_dir = tmp_path("cachedir/deeper");
    rc = load(&b, path, od);
    CHECK(rc == 0 && b.cache_status == CACHE_BUILT && strncmp(b.cache_path, od.cache_dir, strlen(od.cache_dir)) == 0 && access(b.cache_path, F_OK) == 0,
          "cache: --data_cache_dir is created and used", "status %d path %s", b.cache_status, b.cache_path);
    dataset_free(&b);
}

// ----------------------------------------------------------------------------
// bad input: an error naming file:line (and the field), or a counted skip

static void expect_error(const char *what, const char *name, const char *content, const char *format, const char *want1, const char *want2) {
    const char *path = tmp_path(name);
    if (content) write_text(path, content);
    Dataset ds;
    int rc = load(&ds, path, opts(format, 0, 0, 64));
    CHECK(rc == -1 && strstr(ds.error, want1) && (!want2 || strstr(ds.error, want2)), what, "rc %d, error: %s", rc, ds.error);
    if (rc == 0) dataset_free(&ds);
}

static void test_bad_input(void) {
    expect_error("bad input: missing field names file:line and the field", "missing.jsonl",
                 "{\"dialogue\": \"A: hi\", \"summary\": \"hi\"}\n{\"dialogue\": \"B: yo\", \"summary\": \"yo\"}\n{\"dialogue\": \"C: x\"}\n", "auto",
                 "missing.jsonl:3:", "missing field \"summary\"");
    expect_error("bad input: a field of the wrong type", "wrongtype.jsonl",
                 "{\"prompt\": \"a\", \"response\": \"b\"}\n{\"prompt\": \"a\", \"response\": 5}\n", "auto", "wrongtype.jsonl:2:", "\"response\" is number");
    expect_error("bad input: wrong type in an array element (line of the element)", "wrongtype.json",
                 "[\n {\"instruction\": \"a\", \"output\": \"b\"},\n {\"instruction\": \"a\",\n  \"input\": [1],\n  \"output\": \"b\"}\n]\n", "auto",
                 "wrongtype.json:3:", "\"input\" is array");
    expect_error("bad input: invalid UTF-8 in a string", "utf8.jsonl", "{\"text\": \"fine\"}\n{\"text\": \"bad \xff\xfe here\"}\n", "auto",
                 "utf8.jsonl:2:", "invalid UTF-8");
    expect_error("bad input: an empty file", "empty.jsonl", "", "auto", "empty.jsonl", "empty file");
    expect_error("bad input: a file of blank lines", "blank.jsonl", "\n  \n\r\n", "auto", "blank.jsonl", "empty file");
    expect_error("bad input: an empty JSON array", "empty.json", " [ ]\n", "auto", "empty.json", "no records");
    expect_error("bad input: a missing file", "nonexistent.jsonl", NULL, "auto", "nonexistent.jsonl", "cannot read");
    expect_error("bad input: invalid JSON", "syntax.jsonl", "{\"text\": \"a\"}\n{\"text\": \"b\",}\n", "auto", "syntax.jsonl:2:", "invalid JSON");
    expect_error("bad input: a non-object array element", "scalar.json", "[\n{\"text\": \"a\"},\n 42\n]", "auto", "scalar.json:3:", "number, expected an object");
    expect_error("bad input: a non-object JSONL line", "scalar.jsonl", "{\"text\": \"a\"}\n\"just a string\"\n", "auto", "scalar.jsonl:2:", "string, expected an object");
    expect_error("bad input: a first record that is not an object", "first.jsonl", "[1, 2]\n", "auto", "first.jsonl:1:", "number, expected an object");
    expect_error("bad input: an unterminated array", "open.json", "[{\"text\": \"a\"},\n{\"text\": \"b\"}\n", "auto", "open.json:3:", "not closed");
    expect_error("bad input: content after the array", "after.json", "[{\"text\": \"a\"}]\n{\"text\": \"b\"}\n", "auto", "after.json:2:", "after the end");
    expect_error("bad input: a trailing comma in the array", "comma.json", "[{\"text\": \"a\"},\n]\n", "auto", "comma.json:2:", "trailing comma");
    expect_error("bad input: neither JSONL nor an array", "garbage.txt", "hello world\n", "auto", "garbage.txt:1:", "expected JSON Lines");
    expect_error("bad input: format not detectable names the keys", "keys.jsonl", "{\"question\": \"a\", \"answer\": \"b\"}\n", "auto", "keys.jsonl:1:",
                 "\"question\", \"answer\"");
    expect_error("bad input: an unknown --data_format", "keys.jsonl", NULL, "sharegpt", "keys.jsonl", "unknown data format 'sharegpt'");
    expect_error("bad input: a forced format that does not fit", "forced.jsonl", "{\"text\": \"a\"}\n", "samsum", "forced.jsonl:1:", "missing field \"dialogue\"");
    expect_error("bad input: chat roles out of order", "roles.jsonl",
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"user\", \"content\": \"b\"}]}\n", "auto", "roles.jsonl:1:",
                 "messages[1] has role \"user\", expected \"assistant\"");
    expect_error("bad input: an unknown chat role", "role2.jsonl",
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"tool\", \"content\": \"b\"}]}\n", "auto", "role2.jsonl:1:", "\"tool\"");
    expect_error("bad input: a system message that is not first", "role3.jsonl",
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \"b\"}, {\"role\": \"system\", \"content\": \"c\"}]}\n",
                 "auto", "role3.jsonl:1:", "messages[2] has role \"system\"");
    expect_error("bad input: chat content of the wrong type", "content.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": null}]}\n", "auto",
                 "content.jsonl:1:", "messages[0]: field \"content\" is null");
    expect_error("bad input: messages not an array", "msgs.jsonl", "{\"messages\": \"hi\"}\n", "auto", "msgs.jsonl:1:", "\"messages\" is string");
    expect_error("bad input: only skipped samples is an error listing them", "allskip.jsonl",
                 "{\"prompt\": \"a\", \"response\": \"\"}\n\n{\"prompt\": \"b\", \"response\": \"\"}\n", "auto", "allskip.jsonl", "line 3: empty response");

    // skips are counted and name their lines
    const char *path = tmp_path("skips.jsonl");
    write_text(path, "{\"prompt\": \"a\", \"response\": \"b\"}\n{\"prompt\": \"c\", \"response\": \"\"}\n{\"prompt\": \"d\", \"response\": \"e\"}\n"
                     "{\"prompt\": \"f\", \"response\": \"\"}\n");
    Dataset ds;
    int rc = load(&ds, path, opts("auto", 0, 0, 64));
    CHECK(rc == 0 && ds.n_samples == 2 && ds.n_skipped == 2 && ds.skip_line[0] == 2 && ds.skip_line[1] == 4 &&
          ds.skip_reason[0] == SKIP_EMPTY_RESPONSE, "bad input: empty responses are counted skips with their lines", "rc %d, %ld skipped", rc, ds.n_skipped);
    if (rc == 0) dataset_free(&ds);

    // brackets, braces and escaped quotes inside strings do not confuse the array scanner
    write_text(tmp_path("tricky.json"), "[{\"text\": \"a ] } \\\" [ { , \\\\\"}, {\"text\": \"x\\u005d\"}, \n{\"text\":\"]\"}]");
    write_text(tmp_path("tricky.jsonl"), "{\"text\": \"a ] } \\\" [ { , \\\\\"}\n{\"text\": \"x]\"}\n{\"text\":\"]\"}\n");
    Dataset x, y;
    int r1 = load(&x, tmp_path("tricky.json"), opts("auto", 0, 0, 64)), r2 = load(&y, tmp_path("tricky.jsonl"), opts("auto", 0, 0, 64));
    CHECK(r1 == 0 && r2 == 0 && x.n_samples == 3 && rows_equal(&x, &y), "array scanner: brackets and escapes inside strings", "%d %d: %s %s", r1, r2, x.error, y.error);
    if (r1 == 0) dataset_free(&x);
    if (r2 == 0) dataset_free(&y);

    // a UTF-8 byte order mark at the start is allowed
    write_text(tmp_path("bom.jsonl"), "\xEF\xBB\xBF{\"text\": \"a ] } \\\" [ { , \\\\\"}\n{\"text\": \"x]\"}\n{\"text\":\"]\"}\n");
    r1 = load(&x, tmp_path("bom.jsonl"), opts("auto", 0, 0, 64));
    r2 = load(&y, tmp_path("tricky.jsonl"), opts("auto", 0, 0, 64));
    CHECK(r1 == 0 && r2 == 0 && rows_equal(&x, &y), "a UTF-8 byte order mark is skipped", "%d: %s", r1, x.error);
    if (r1 == 0) dataset_free(&x);
    if (r2 == 0) dataset_free(&y);

    // a line of 100 MB: an error naming the line, read no further than the limit
    const char *big = tmp_path("big.jsonl");
    FILE *f = fopen(big, "wb");
    if (!f) die("cannot write %s", big);
    fputs("{\"text\": \"ok\"}\n{\"text\": \"", f);
    char *chunk = (char *)mallocCheck(1 << 20);
    memset(chunk, 'a', 1 << 20);
    for (int i = 0; i < 100; i++) fwrite(chunk, 1, 1 << 20, f);
    fputs("\"}\n", f);
    fclose(f);
    free(chunk);
    clock_t c0 = clock();
    expect_error("bad input: a 100 MB line is an error naming the line", "big.jsonl", NULL, "auto", "big.jsonl:2:", "longer than 64 MiB");
    // the same record in a JSON array
    f = fopen(tmp_path("big.json"), "wb");
    fputs("[{\"text\": \"ok\"},\n {\"text\": \"", f);
    chunk = (char *)mallocCheck(1 << 20);
    memset(chunk, 'a', 1 << 20);
    for (int i = 0; i < 100; i++) fwrite(chunk, 1, 1 << 20, f);
    fputs("\"}]\n", f);
    fclose(f);
    free(chunk);
    expect_error("bad input: a 100 MB array element is an error naming its line", "big.json", NULL, "auto", "big.json:2:", "longer than 64 MiB");
    double secs = (double)(clock() - c0) / CLOCKS_PER_SEC;
    CHECK(secs < 10, "bad input: the 100 MB records are refused quickly", "%.1f s", secs);
    remove(big);
    remove(tmp_path("big.json"));
}

// Preference pairs (--data_format preference): test/fixtures/preference's records against
// TRL 1.16's DPOTrainer tokenization and its collator's cut to max_seq_len: data.jsonl's plain
// pairs with tiny_gqa's tokenizer (tokens.json, dev/reference/make_dpo_fixtures.py), chat.jsonl's
// conversational ones with each chat family's (chat_tokens.json, make_dpo_chat_fixtures.py): each
// pair's chosen and rejected rows, the targets its completion's tokens, the pairs TRL drops
// skipped; both from the token cache written and from it read back. Then the hostile records:
// an error naming file:line, or a counted skip.
static int ids_equal(const JsonValue *want, const int *got, int n) {
    if (!want || want->type != JSON_ARRAY || want->count > n) return 0;
    for (int i = 0; i < want->count; i++)
        if ((int)want->items[i].number != got[i]) return 0;
    return 1;
}
// the pairs of path (tokenized with t, from tokpath; cached in cache) == recs, skipped_lines (or NULL) the lines skipped
static void check_pairs(const char *name, const char *path, const Tokenizer *t, const char *tokpath, const char *cache, int L,
                        const JsonValue *recs, const JsonValue *skipped_lines) {
    for (int pass = 0; pass < 2; pass++) { // the cache written, then reused
        Dataset ds;
        DataOptions o = opts("auto", 0, 0, L);
        o.cache_dir = cache;
        int rc = dataset_load(&ds, path, t, tokpath, &o), skips_ok = rc == 0 && ds.n_skipped == (skipped_lines ? skipped_lines->count : 0);
        for (int i = 0; skips_ok && i < ds.n_skipped && i < DATA_SKIP_LIST; i++)
            skips_ok = ds.skip_line[i] == (long)skipped_lines->items[i].number && ds.skip_reason[i] == SKIP_TRUNCATED;
        char what[256];
        snprintf(what, sizeof what, "%s: %s", name, pass ? "the token cache reused" : "detected from the keys, TRL's pairs kept, the others skipped");
        CHECK(rc == 0 && skips_ok && ds.format == FORMAT_PREFERENCE && ds.n_rows == recs->count && ds.cache_status == (pass ? CACHE_REUSED : CACHE_BUILT),
              what, "rc %d, %ld rows, %ld skipped: %s", rc, rc == 0 ? ds.n_rows : 0, rc == 0 ? ds.n_skipped : 0, ds.error);
        if (rc != 0) continue;
        int *tokens = (int *)mallocCheck((size_t)2 * L * sizeof(int)), *targets = (int *)mallocCheck((size_t)2 * L * sizeof(int)), T;
        for (int r = 0; r < recs->count && r < ds.n_rows; r++) {
            const JsonValue *rec = &recs->items[r];
            long labels = dataset_get_rows(&ds, r, 1, 0, tokens, targets, &T), targeted = 0;
            int P = json_get(rec, "prompt_ids")->count, ok = 1;
            for (int s = 0; s < 2; s++) {
                const JsonValue *want = json_get(rec, s ? "rejected_input_ids" : "chosen_input_ids");
                const int *tk = tokens + s * T, *tg = targets + s * T;
                ok &= ids_equal(want, tk, T);
                for (int i = 0; i < T; i++) { // the completion's tokens are the targets; the prompt's and the padding's are not
                    ok &= tg[i] == (i + 1 < want->count && i + 1 >= P ? tk[i + 1] : -100);
                    targeted += tg[i] != -100;
                }
            }
            snprintf(what, sizeof what, "%s: record %d's rows, targets and label counts are TRL's%s", name, r, pass ? " (from the cache)" : "");
            CHECK(ok && labels == targeted && labels == ds.row_labels[r], what, "tokens or targets differ (prompt %d, T %d), labels %ld, %d counted, %ld targets",
                  P, T, labels, ds.row_labels[r], targeted);
        }
        free(tokens); free(targets);
        dataset_free(&ds);
    }
}
static void test_preference(void) {
    JsonValue exp;
    if (json_load_file("test/fixtures/preference/tokens.json", &exp) != 0) die("cannot read tokens.json");
    check_pairs("preference", "test/fixtures/preference/data.jsonl", &tok, TINY_TOKENIZER, cache_dir, 32, json_get(&exp, "records"), NULL);
    json_free(&exp);
    if (json_load_file("test/fixtures/preference/chat_tokens.json", &exp) != 0) die("cannot read chat_tokens.json");
    const JsonValue *families = json_get(&exp, "families");
    for (int f = 0; f < families->count; f++) {
        const JsonValue *fam = &families->items[f];
        const char *tokpath, *config;
        char name[64], cache[400];
        snprintf(name, sizeof name, "preference, conversational (%s)", families->keys[f]);
        snprintf(cache, sizeof cache, "%s/cache_%s", tmp, families->keys[f]);
        Tokenizer t;
        if (json_get_string(fam, "tokenizer", &tokpath, NULL) || json_get_string(fam, "config", &config, NULL) || tokenizer_load(&t, tokpath) != 0 ||
            tokenizer_configure(&t, config, config) != 0)
            die("chat_tokens.json: cannot load %s's tokenizer", families->keys[f]);
        check_pairs(name, "test/fixtures/preference/chat.jsonl", &t, tokpath, cache, (int)json_get(&exp, "max_seq_len")->number,
                    json_get(fam, "records"), json_get(fam, "skipped_lines"));
        tokenizer_free(&t);
    }
    json_free(&exp);

    expect_error("preference: a missing key names file:line", "pref_missing.jsonl",
                 "{\"prompt\": \"a\", \"chosen\": \" b\", \"rejected\": \" c\"}\n{\"prompt\": \"a\", \"chosen\": \" b\"}\n", "preference",
                 "pref_missing.jsonl:2:", "missing field \"rejected\"");
    expect_error("preference: a response that is not a string", "pref_type.jsonl",
                 "{\"prompt\": \"a\", \"chosen\": 5, \"rejected\": \" c\"}\n", "auto", "pref_type.jsonl:1:", "\"chosen\" is number");
    expect_error("preference: a plain record among pairs", "pref_mixed.jsonl",
                 "{\"prompt\": \"a\", \"chosen\": \" b\", \"rejected\": \" c\"}\n{\"text\": \"a b c\"}\n", "auto", "pref_mixed.jsonl:2:",
                 "missing field \"prompt\"");
    const char *path = tmp_path("pref_skips.jsonl");
    write_text(path, "{\"prompt\": \"a\", \"chosen\": \" b\", \"rejected\": \" c\"}\n{\"prompt\": \"x\", \"chosen\": \" same\", \"rejected\": \" same\"}\n"
                     "{\"prompt\": \"a prompt much longer than the limit of the rows\", \"chosen\": \" b\", \"rejected\": \" c\"}\n"
                     "{\"prompt\": \"\", \"chosen\": \"\", \"rejected\": \" c\"}\n");
    Dataset ds;
    int rc = load(&ds, path, opts("auto", 0, 0, 12));
    CHECK(rc == 0 && ds.n_samples == 2 && ds.n_skipped == 2 && ds.skip_line[0] == 2 && ds.skip_reason[0] == SKIP_SAME_RESPONSES &&
          ds.skip_line[1] == 3 && ds.skip_reason[1] == SKIP_TRUNCATED, "preference: chosen == rejected and a prompt over max_seq_len are counted skips",
          "rc %d, %ld samples, %ld skipped: %s", rc, ds.n_samples, ds.n_skipped, ds.error);
    if (rc == 0) dataset_free(&ds);
    rc = load(&ds, path, opts("auto", 0, 1, 12));
    CHECK(rc == -1 && strstr(ds.error, "--batching padding"), "preference: packing refused", "rc %d: %s", rc, ds.error);
    if (rc == 0) dataset_free(&ds);

    // the conversational form's (U, A: a user and an assistant message; P: a plain pair)
#define U(x) "{\"role\": \"user\", \"content\": \"" x "\"}"
#define A(x) "{\"role\": \"assistant\", \"content\": \"" x "\"}"
#define P "{\"prompt\": \"a\", \"chosen\": \" b\", \"rejected\": \" c\"}\n"
#define C "{\"prompt\": [" U("a") "], \"chosen\": [" A("b") "], \"rejected\": [" A("c") "]}\n"
    static const struct { const char *what, *text, *where, *why; } bad[] = {
        {"a conversational pair among plain ones", P P C, ":3:", "a conversational (lists of messages) pair among plain ones"},
        {"a plain pair among conversational ones", C P, ":2:", "a plain (strings) pair among conversational ones"},
        {"a missing key", C "{\"prompt\": [" U("a") "], \"chosen\": [" A("b") "]}\n", ":2:", "missing field \"rejected\""},
        {"a string among lists", "{\"prompt\": \"a\", \"chosen\": [" A("b") "], \"rejected\": [" A("c") "]}\n", ":1:",
         "field \"prompt\" is string: a conversational pair's fields are lists of messages"},
        {"a message that is not an object", "{\"chosen\": [" U("a") ", \"b\"], \"rejected\": [" U("a") ", " A("c") "]}\n", ":1:",
         "chosen[1] is string, expected an object"},
        {"a message without content", "{\"prompt\": [" U("a") "], \"chosen\": [{\"role\": \"assistant\"}], \"rejected\": [" A("c") "]}\n", ":1:",
         "chosen[0]: missing field \"content\""},
        {"a role out of order", "{\"prompt\": [" U("a") "], \"chosen\": [" A("b") "], \"rejected\": [" U("c") "]}\n", ":1:",
         "rejected[0] has role \"user\", expected \"assistant\""},
        {"a system message after the first", "{\"prompt\": [" U("a") ", {\"role\": \"system\", \"content\": \"s\"}], \"chosen\": [" A("b")
         "], \"rejected\": [" A("c") "]}\n", ":1:", "prompt[1] has role \"system\", expected \"assistant\""},
        {"no shared message and no prompt", "{\"chosen\": [" U("a") ", " A("b") "], \"rejected\": [" U("x") ", " A("c") "]}\n", ":1:",
         "share no leading message and there is no \"prompt\""},
        {"an empty completion", "{\"prompt\": [" U("a") "], \"chosen\": [], \"rejected\": [" A("c") "]}\n", ":1:",
         "field \"chosen\" is an empty list: no completion"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char what[128], name[64];
        snprintf(what, sizeof what, "preference, conversational: %s names file:line", bad[i].what);
        snprintf(name, sizeof name, "pref_chat_bad%zu.jsonl", i);
        expect_error(what, name, bad[i].text, i % 2 ? "auto" : "preference", bad[i].where, bad[i].why);
    }
    // counted skips (the same completions, explicit and implicit; a prompt over max_seq_len), and
    // what TRL trains on: an empty answer (its template's tokens), a completion of several turns
    path = tmp_path("pref_chat_skips.jsonl");
    write_text(path, C "{\"prompt\": [" U("x") "], \"chosen\": [" A("same") "], \"rejected\": [" A("same") "]}\n"
                     "{\"chosen\": [" U("x") ", " A("same") "], \"rejected\": [" U("x") ", " A("same") "]}\n"
                     "{\"prompt\": [" U("a prompt much longer than the limit of the rows, and longer still, with many more words in it") "], \"chosen\": [" A("b") "], \"rejected\": [" A("c") "]}\n"
                     "{\"prompt\": [" U("a") "], \"chosen\": [" A("") "], \"rejected\": [" A("c") "]}\n"
                     "{\"chosen\": [" U("a") ", " A("b") ", " U("d") ", " A("e") "], \"rejected\": [" U("a") ", " A("b") "]}\n");
    rc = load(&ds, path, opts("auto", 0, 0, 32));
    CHECK(rc == 0 && ds.n_samples == 3 && ds.n_skipped == 3 && ds.skip_line[0] == 2 && ds.skip_reason[0] == SKIP_SAME_RESPONSES &&
          ds.skip_line[1] == 3 && ds.skip_reason[1] == SKIP_SAME_RESPONSES && ds.skip_line[2] == 4 && ds.skip_reason[2] == SKIP_TRUNCATED,
          "preference, conversational: the same completions and a prompt over max_seq_len are counted skips, an empty answer is kept",
          "rc %d, %ld samples, %ld skipped: %s", rc, ds.n_samples, ds.n_skipped, ds.error);
    if (rc == 0) dataset_free(&ds);
#undef U
#undef A
#undef P
#undef C
}

// BOS and EOS from a model folder's files, in transformers' order of precedence
static void test_special_ids(void) {
    struct { const char *tok_config, *gen_config, *config; int rc, bos, eos; const char *what; } cases[] = {
        {NULL, NULL, NULL, 0, 1, 2, "no file names them: the tokenizer's own"},
        {NULL, NULL, "{\"bos_token_id\": 4, \"eos_token_id\": 3}", 0, 4, 3, "config.json"},
        {NULL, "{\"eos_token_id\": [5, 6]}", "{\"bos_token_id\": 4, \"eos_token_id\": 3}", 0, 4, 5,
         "generation_config.json before config.json; of a list, the first"},
        {"{\"eos_token\": {\"content\": \"<unk>\", \"special\": true}, \"bos_token\": null}", "{\"eos_token_id\": 5, \"bos_token_id\": 7}", NULL, 0, 7, 0,
         "tokenizer_config.json first (an AddedToken object); null says nothing"},
        {"{\"eos_token\": \"</s>\"}", "{\"eos_token_id\": 5}", NULL, 0, 1, 2, "tokenizer_config.json's string"},
        {"{\"bos_token\": \"<nope>\"}", NULL, NULL, -1, 0, 0, "a name that is not a token: an error"},
        {NULL, NULL, "{\"eos_token_id\": 512}", -1, 0, 0, "an id outside the vocabulary: an error"},
        {NULL, "{\"eos_token_id\": \"2\"}", NULL, -1, 0, 0, "an id of the wrong type: an error"},
        {NULL, NULL, "{\"eos_token_id\": [", -1, 0, 0, "invalid JSON: an error"},
        {"{\"eos_token\": 2}", NULL, NULL, -1, 0, 0, "tokenizer_config.json names tokens: an id is an error"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[300], cmd[400];
        snprintf(dir, sizeof dir, "%s/special%zu", tmp, i);
        snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir);
        if (system(cmd) != 0) die("cannot make %s", dir);
        const char *files[3] = {cases[i].tok_config, cases[i].gen_config, cases[i].config};
        static const char *const names[3] = {"tokenizer_config.json", "generation_config.json", "config.json"};
        for (int f = 0; f < 3; f++) {
            char path[400];
            snprintf(path, sizeof path, "%s/%s", dir, names[f]);
            if (files[f]) write_text(path, files[f]);
        }
        Tokenizer t = tok; // the ids are all this changes
        int rc = tokenizer_configure(&t, dir, dir);
        char what[200];
        snprintf(what, sizeof what, "special ids: %s", cases[i].what);
        CHECK(rc == cases[i].rc && (rc != 0 || (t.bos_id == cases[i].bos && t.eos_id == cases[i].eos)), what,
              "rc %d, bos %d, eos %d", rc, t.bos_id, t.eos_id);
    }
}

int main(void) {
    snprintf(tmp, sizeof tmp, "/tmp/test_dataloader_XXXXXX");
    if (!mkdtemp(tmp)) die("mkdtemp: %s", strerror(errno));
    snprintf(cache_dir, sizeof cache_dir, "%s/cache", tmp);
    if (tokenizer_load(&tok, TINY_TOKENIZER) != 0) die("cannot load " TINY_TOKENIZER);

    run_cases("test/fixtures/data/expected.json", &tok, TINY_TOKENIZER);
    Tokenizer llama;
    if (access(LLAMA_TOKENIZER, R_OK) != 0 || access("test/fixtures/data/llama2_expected.json", R_OK) != 0) {
        test_skip("dataloader on the shared SAMSum and Alpaca files", LLAMA_TOKENIZER " (../shared) not present");
    } else {
        if (tokenizer_load(&llama, LLAMA_TOKENIZER) != 0) die("cannot load " LLAMA_TOKENIZER);
        run_cases("test/fixtures/data/llama2_expected.json", &llama, LLAMA_TOKENIZER);
        tokenizer_free(&llama);
    }
    test_epochs();
    test_slices();
    test_val_split();
    test_ranks();
    test_cache();
    test_bad_input();
    test_special_ids();
    test_chat_families();
    test_preference();

    tokenizer_free(&tok);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    return test_summary();
}
