// Shared helpers of the fuzz targets in dev/fuzz/. Include it after the
// project headers (they set the feature macros that must come first).
//
// Each target is one file with one entry point, written FUZZ_TARGET(name):
//   - built with clang -fsanitize=fuzzer (make fuzz), it is libFuzzer's
//     LLVMFuzzerTestOneInput;
//   - built with -DFUZZ_REPLAY, it is fuzz_<name>, and test/test_fuzz_replay.c
//     links every target into one program that `make test` runs over the seed
//     corpora (dev/fuzz/corpus/<name>/) and the crash regressions (test/fuzz_regress/<name>/).
// Targets that need files on disk write them into a private temporary
// directory (fuzz_tmpdir), removed at exit. Fixtures are read relative to the
// repo root, or to $FUZZ_ROOT when set.
#ifndef FUZZ_H
#define FUZZ_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/stat.h>
#include "../../support/checkpoint.h" // remove_tree

#ifdef FUZZ_REPLAY
#define FUZZ_TARGET(name) int fuzz_##name(const uint8_t *data, size_t size)
#else
#define FUZZ_TARGET(name) int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
#endif

// FUZZ_KNOWN_BUGS=1 turns on the checks for bugs that are reported but not
// fixed yet in code these harnesses do not own (see dev/fuzz_results.md); off,
// the harness steps around them so fuzzing can go on past them. (None is open
// now: wrap a new one's check in `if (fuzz_known_bugs())`.)
static int fuzz_known_bugs(void) {
    static int known = -1;
    if (known < 0) { const char *k = getenv("FUZZ_KNOWN_BUGS"); known = k && k[0] == '1'; }
    return known;
}

// a harness bug or a broken invariant: stop loudly (libFuzzer reports it as a crash)
#define FUZZ_ASSERT(cond) do { if (!(cond)) { fprintf(stderr, "%s:%d: fuzz invariant failed: %s\n", __FILE__, __LINE__, #cond); abort(); } } while (0)


// one temporary directory per target per process, made on first use
static char fuzz__dir[512];
static void fuzz__cleanup(void) { if (fuzz__dir[0]) remove_tree(fuzz__dir); }
static const char *fuzz_tmpdir(void) {
    if (!fuzz__dir[0]) {
        const char *base = getenv("TMPDIR");
        snprintf(fuzz__dir, sizeof fuzz__dir, "%s/llama2tune_fuzz_XXXXXX", base && base[0] ? base : "/tmp");
        FUZZ_ASSERT(mkdtemp(fuzz__dir) != NULL);
        atexit(fuzz__cleanup);
    }
    return fuzz__dir;
}

// tmpdir/name, in a static buffer per call site's choice
static void fuzz_path(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", fuzz_tmpdir(), name); }

static void fuzz_write(const char *path, const void *data, size_t n) {
    unlink(path); // may be a symlink to a fixture: never write through it
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    FUZZ_ASSERT(fd >= 0);
    const char *p = (const char *)data;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        FUZZ_ASSERT(w > 0);
        p += w; n -= (size_t)w;
    }
    close(fd);
}

// the absolute path of a fixture (relative to the repo root or $FUZZ_ROOT); aborts if absent
static void fuzz_fixture(char *out, size_t n, const char *rel) {
    const char *root = getenv("FUZZ_ROOT");
    char cwd[2048];
    if (!root || !root[0]) root = ".";
    if (root[0] == '/') snprintf(out, n, "%s/%s", root, rel);
    else {
        FUZZ_ASSERT(getcwd(cwd, sizeof cwd) != NULL);
        snprintf(out, n, "%s/%s/%s", cwd, root, rel);
    }
    if (access(out, R_OK) != 0) { fprintf(stderr, "fuzz: fixture %s not found (run from the repo root or set FUZZ_ROOT)\n", out); abort(); }
}

// stderr into a file while a parser runs, to check that a refusal says why
// (every reader prints "error: <file>: <problem>" before returning -1)
static int fuzz__err_fd = -1, fuzz__saved_err = -1;
static void fuzz_stderr_begin(void) {
    if (fuzz__err_fd < 0) {
        char p[4096];
        fuzz_path(p, sizeof p, "stderr.txt");
        int fd = open(p, O_RDWR | O_CREAT | O_TRUNC, 0600);
        FUZZ_ASSERT(fd >= 0);
        // above 2 even when libFuzzer has closed stdout/stderr (-close_fd_mask)
        fuzz__err_fd = fcntl(fd, F_DUPFD, 10);
        FUZZ_ASSERT(fuzz__err_fd >= 10);
        close(fd);
    }
    FUZZ_ASSERT(ftruncate(fuzz__err_fd, 0) == 0 && lseek(fuzz__err_fd, 0, SEEK_SET) == 0); // (the offset is shared with fd 2)
    fflush(stderr);
    fuzz__saved_err = fcntl(2, F_DUPFD, 10); // -1 if stderr is closed: then it is closed again after
    FUZZ_ASSERT(dup2(fuzz__err_fd, 2) == 2);
}
// ends the capture; 1 if what was printed has a line starting "error: " that contains `names` (NULL: anything)
static int fuzz_stderr_end(const char *names) {
    static char buf[8192];
    fflush(stderr);
    if (fuzz__saved_err >= 0) { dup2(fuzz__saved_err, 2); close(fuzz__saved_err); }
    else close(2);
    ssize_t n = pread(fuzz__err_fd, buf, sizeof buf - 1, 0);
    if (n <= 0) return 0;
    buf[n] = 0;
    for (char *line = buf; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        char *end = strchr(line, '\n');
        if (end) *end = 0;
        int ok = strncmp(line, "error: ", 7) == 0 && (!names || strstr(line, names));
        if (end) *end = '\n';
        if (ok) return 1;
    }
    return 0;
}

// points tmpdir/name at a fixture (a symlink, so nothing is copied per input)
static void fuzz_link_fixture(const char *name, const char *rel) {
    char target[4096], link[4096];
    fuzz_fixture(target, sizeof target, rel);
    fuzz_path(link, sizeof link, name);
    unlink(link);
    FUZZ_ASSERT(symlink(target, link) == 0);
}

// a whole fixture file in memory
static unsigned char *fuzz_slurp_fixture(const char *rel, size_t *n) {
    char p[4096];
    fuzz_fixture(p, sizeof p, rel);
    FILE *f = fopen(p, "rb");
    FUZZ_ASSERT(f != NULL);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    rewind(f);
    unsigned char *b = (unsigned char *)malloc((size_t)len + 1);
    FUZZ_ASSERT(b != NULL && fread(b, 1, (size_t)len, f) == (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return b;
}

#ifdef TOKENIZER_H
// text encoded (*n ids, every one in the vocabulary) and the ids decoded: the
// decoded text (malloc'd, NUL-terminated), *dl its length
static char *fuzz_encode_decode(const Tokenizer *t, const char *text, size_t len, int bos, int eos, int *n, size_t *dl) {
    int *ids = tokenizer_encode(t, text, len, bos, eos, n);
    FUZZ_ASSERT(ids != NULL && *n >= 0);
    for (int i = 0; i < *n; i++) FUZZ_ASSERT(ids[i] >= 0 && ids[i] < t->vocab_size);
    char *s = tokenizer_decode(t, ids, *n, dl);
    FUZZ_ASSERT(s != NULL && s[*dl] == 0);
    free(ids);
    return s;
}

static void fuzz_use_tokenizer(const Tokenizer *t, const char *text, size_t len) {
    int n;
    size_t dl;
    free(fuzz_encode_decode(t, text, len, 1, 1, &n, &dl));
}

// the fixture tokenizers at paths[0..n) into toks, once per process (the encode targets)
static void fuzz_load_tokenizers(Tokenizer *toks, const char *const *paths, int n, int *loaded) {
    if (*loaded) return;
    for (int i = 0; i < n; i++) {
        size_t len;
        unsigned char *b = fuzz_slurp_fixture(paths[i], &len);
        FUZZ_ASSERT(tokenizer_load_from_memory(&toks[i], b, len, paths[i]) == 0);
        free(b);
    }
    *loaded = 1;
}

// text's bytes read as little-endian int32 ids (any value, negative and out
// of range included; mostly in range, so that decode has pieces to work with), decoded
static void fuzz_decode_bytes_as_ids(const Tokenizer *t, const char *text, size_t len) {
    int nid = (int)(len / 4);
    int *raw = (int *)malloc((size_t)nid * sizeof(int) + 1);
    FUZZ_ASSERT(raw != NULL);
    for (int i = 0; i < nid; i++) {
        uint32_t u = (uint32_t)(uint8_t)text[4 * i] | (uint32_t)(uint8_t)text[4 * i + 1] << 8 |
                     (uint32_t)(uint8_t)text[4 * i + 2] << 16 | (uint32_t)(uint8_t)text[4 * i + 3] << 24;
        raw[i] = (u >> 31) ? (int32_t)u : (int)(u % (uint32_t)(t->vocab_size + 2));
    }
    size_t dl;
    char *s = tokenizer_decode(t, raw, nid, &dl);
    FUZZ_ASSERT(s != NULL && s[dl] == 0);
    free(s);
    free(raw);
}

// every check of a tokenizer that loaded from `data`: its fields in range, a fixed
// text and data's own first bytes encoded and decoded, the whole vocabulary (and
// some ids out of range) decoded, each piece there and found again by its string
static void fuzz_check_tokenizer(const Tokenizer *t, const uint8_t *data, size_t size) {
    FUZZ_ASSERT(t->vocab_size > 0 && (t->kind == TOKENIZER_SENTENCEPIECE || t->kind == TOKENIZER_BPE_JSON));
    FUZZ_ASSERT(t->kind == TOKENIZER_BPE_JSON ? t->unk_internal >= -1 : t->unk_internal >= 0);
    FUZZ_ASSERT(t->unk_internal < t->vocab_size);
    int special[4] = {t->bos_id, t->eos_id, t->unk_id, t->pad_id};
    for (int k = 0; k < 4; k++) FUZZ_ASSERT(special[k] >= -1 && special[k] < t->vocab_size);
    static const char sample[] = "Hello  world! \xE2\x96\x81 caf\xC3\xA9 \xF0\x9F\x98\x80 \xFF\xFE <s> <|eot_id|> I'M x\ty\n\n  12345";
    fuzz_use_tokenizer(t, sample, sizeof sample - 1);
    fuzz_use_tokenizer(t, (const char *)data, size < 512 ? size : 512);
    fuzz_use_tokenizer(t, "", 0);
    int nv = t->vocab_size < 70000 ? t->vocab_size + 3 : 70003;
    int *all = (int *)malloc((size_t)nv * sizeof(int));
    FUZZ_ASSERT(all != NULL);
    for (int i = 0; i < nv - 3; i++) all[i] = i;
    all[nv - 3] = -1; all[nv - 2] = t->vocab_size; all[nv - 1] = 0x7fffffff;
    size_t dl;
    char *s = tokenizer_decode(t, all, nv, &dl);
    FUZZ_ASSERT(s != NULL);
    free(s);
    free(all);
    for (int i = 0; i < t->vocab_size && i < 70000; i++) {
        const char *p = tokenizer_piece(t, i);
        FUZZ_ASSERT(p != NULL);
        int id = tokenizer_token_id(t, p); // a piece with a NUL inside is found as its shorter C string, or not
        FUZZ_ASSERT(id >= -1 && id < t->vocab_size);
        if (strlen(p) == (size_t)t->piece_len[i]) FUZZ_ASSERT(id >= 0);
    }
}
#endif

#ifdef DATALOADER_H
// every row of a loaded dataset against its own counts: tokens in the
// vocabulary, targets -100 or the next token, label counts adding up
// (tokens and targets have room for max_seq_len)
static void fuzz_check_rows(const Dataset *ds, const Tokenizer *tok, int *tokens, int *targets) {
    long total = 0;
    int rows = ds->format == FORMAT_PREFERENCE ? 2 : 1; // (a pair: its chosen and rejected rows; tokens, targets hold 2 x max_seq_len)
    FUZZ_ASSERT(ds->n_rows >= 1 && dataset_max_len(ds) >= 1 && dataset_max_len(ds) <= ds->max_seq_len);
    for (long r = 0; r < ds->n_rows; r++) {
        int T;
        long labels = dataset_get_rows(ds, r, 1, tok->eos_id, tokens, targets, &T), counted = 0;
        FUZZ_ASSERT(T >= 1 && T <= ds->max_seq_len && labels == ds->row_labels[r]);
        for (int i = 0; i < rows * T; i++) {
            int t = i % T;
            FUZZ_ASSERT(tokens[i] >= 0 && tokens[i] < tok->vocab_size);
            FUZZ_ASSERT(targets[i] == -100 || (t + 1 < T && targets[i] == tokens[i + 1]));
            counted += targets[i] != -100;
        }
        FUZZ_ASSERT(counted == labels);
        total += labels;
    }
    FUZZ_ASSERT(total == ds->n_labels);
}
#endif
#endif
