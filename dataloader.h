// Datasets to token and label batches.
//
// First data path: JSONL, one {"text": "..."} per line, each row tokenized as
// BOS + text + EOS and truncated to max_seq_len. A batch pads its rows on the
// right to its longest row; the model predicts token t+1 at position t, so
// targets[t] = tokens[t+1], and the last real position and all padding get -100.
// Right padding needs no attention mask: causal attention never lets a real
// position see a later pad.
#ifndef DATALOADER_H
#define DATALOADER_H
#include <stdint.h>
#include "utils.h"
#include "json.h"
#include "tokenizer.h"

typedef struct {
    int *tokens;    // all rows back to back
    size_t *start;  // (n_rows) offset of each row in tokens
    int *len;       // (n_rows)
    int n_rows;
} Dataset;

static void dataset_free(Dataset *ds) { free(ds->tokens); free(ds->start); free(ds->len); memset(ds, 0, sizeof *ds); }

// 0 ok; -1 with a message naming the file and line
static int dataset_load_text_jsonl(Dataset *ds, const char *path, const Tokenizer *tok, int max_seq_len) {
    memset(ds, 0, sizeof *ds);
    size_t size;
    char *text = read_file(path, &size);
    if (!text) { fprintf(stderr, "error: %s: cannot read: %s\n", path, strerror(errno)); return -1; }
    size_t cap_rows = 1024, cap_tokens = 1 << 16, used = 0;
    ds->start = (size_t *)mallocCheck(cap_rows * sizeof(size_t));
    ds->len = (int *)mallocCheck(cap_rows * sizeof(int));
    ds->tokens = (int *)mallocCheck(cap_tokens * sizeof(int));
    int line = 0, rc = 0;
    char err[256];
    for (size_t pos = 0; pos < size && rc == 0;) {
        size_t end = pos;
        while (end < size && text[end] != '\n') end++;
        line++;
        size_t a = pos, b = end;
        pos = end + 1;
        while (a < b && (text[a] == ' ' || text[a] == '\t' || text[a] == '\r')) a++;
        if (a == b) continue; // blank lines are allowed
        JsonValue v;
        const JsonValue *t;
        if (json_parse(text + a, b - a, &v, err, sizeof err) != 0) {
            fprintf(stderr, "error: %s:%d: invalid JSON: %s\n", path, line, err);
            rc = -1;
            break;
        }
        if (v.type != JSON_OBJECT || !(t = json_get(&v, "text")) || t->type != JSON_STRING) {
            fprintf(stderr, "error: %s:%d: expected an object with a string field \"text\"\n", path, line);
            json_free(&v);
            rc = -1;
            break;
        }
        int n;
        int *ids = tokenizer_encode(tok, t->string, t->string_len, 1, 1, &n);
        json_free(&v);
        if (!ids) die("%s:%d: out of memory while tokenizing", path, line);
        if (n > max_seq_len) n = max_seq_len;
        if ((size_t)ds->n_rows == cap_rows) {
            cap_rows *= 2;
            ds->start = (size_t *)realloc(ds->start, cap_rows * sizeof(size_t));
            ds->len = (int *)realloc(ds->len, cap_rows * sizeof(int));
            if (!ds->start || !ds->len) die("%s: out of memory", path);
        }
        while (used + n > cap_tokens) {
            cap_tokens *= 2;
            ds->tokens = (int *)realloc(ds->tokens, cap_tokens * sizeof(int));
            if (!ds->tokens) die("%s: out of memory", path);
        }
        memcpy(ds->tokens + used, ids, n * sizeof(int));
        free(ids);
        ds->start[ds->n_rows] = used;
        ds->len[ds->n_rows] = n;
        ds->n_rows++;
        used += n;
    }
    free(text);
    if (rc == 0 && ds->n_rows == 0) { fprintf(stderr, "error: %s: no rows (expected JSONL with a \"text\" field per line)\n", path); rc = -1; }
    if (rc != 0) dataset_free(ds);
    return rc;
}

// Rows in order, or shuffled every epoch; the stream runs on across epochs so
// every optimizer step gets a full batch and no row is dropped.
typedef struct {
    const Dataset *ds;
    int *order;      // (n_rows) row order of the current epoch
    int pos;         // next index into order
    int epoch;
    int shuffle;
    uint64_t seed;
} DataLoader;

static void dataloader_shuffle(DataLoader *dl) {
    for (int i = 0; i < dl->ds->n_rows; i++) dl->order[i] = i;
    if (!dl->shuffle) return;
    uint64_t state = splitmix64(dl->seed ^ (0xDA7Aull << 32) ^ (uint64_t)dl->epoch);
    for (int i = dl->ds->n_rows - 1; i > 0; i--) { // Fisher-Yates
        int j = (int)(rng_next(&state) % (uint64_t)(i + 1));
        int t = dl->order[i]; dl->order[i] = dl->order[j]; dl->order[j] = t;
    }
}

static void dataloader_init(DataLoader *dl, const Dataset *ds, int shuffle, uint64_t seed) {
    dl->ds = ds; dl->shuffle = shuffle; dl->seed = seed; dl->epoch = 0; dl->pos = 0;
    dl->order = (int *)mallocCheck((size_t)ds->n_rows * sizeof(int));
    dataloader_shuffle(dl);
}
static void dataloader_free(DataLoader *dl) { free(dl->order); }

// Fills tokens and targets (B, *T) with the next B rows, *T being the longest of
// them. Returns the number of label positions (targets != -100).
static long dataloader_next_batch(DataLoader *dl, int B, int pad_id, int *tokens, int *targets, int *T) {
    int *rows = (int *)mallocCheck((size_t)B * sizeof(int));
    int maxlen = 0;
    for (int b = 0; b < B; b++) {
        if (dl->pos == dl->ds->n_rows) { dl->epoch++; dl->pos = 0; dataloader_shuffle(dl); }
        rows[b] = dl->order[dl->pos++];
        if (dl->ds->len[rows[b]] > maxlen) maxlen = dl->ds->len[rows[b]];
    }
    long labels = 0;
    for (int b = 0; b < B; b++) {
        const int *src = dl->ds->tokens + dl->ds->start[rows[b]];
        int n = dl->ds->len[rows[b]];
        for (int t = 0; t < maxlen; t++) {
            tokens[b * maxlen + t] = t < n ? src[t] : pad_id;
            targets[b * maxlen + t] = t + 1 < n ? src[t + 1] : -100;
        }
        labels += n > 0 ? n - 1 : 0;
    }
    free(rows);
    *T = maxlen;
    return labels;
}
#endif
