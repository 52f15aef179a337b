// Tests of support/tensorboard.h, without TensorBoard: a reader of our own (records,
// both CRCs recomputed by a bitwise CRC-32C that shares nothing with the writer's table,
// the Event and Summary fields) reads
//   - test/fixtures/tensorboard/golden.tfevents, written by TensorBoard's own writer
//     (dev/reference/check_tensorboard.py --golden): its events are golden.json's, and
//     our writer encodes the same events to the same bytes (all but wall_time);
//   - with --check DIR METRICS: a trainer's --tensorboard_dir, whose scalars must be the
//     metrics file's at every step (test/test_tensorboard.sh runs both trainers).
// Run from the repo root.
#include "../support/utils.h" // first: feature macros; read_file, json_load_file
#include "../support/tensorboard.h"
#include "test_common.h"
#include <dirent.h>

#define FIX "test/fixtures/tensorboard"

// CRC-32C bit by bit (Castagnoli's reflected polynomial), and TFRecord's mask
static uint32_t crc_bitwise(const unsigned char *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1)));
    }
    return ~c;
}
static uint32_t mask(uint32_t c) { return ((c >> 15) | (c << 17)) + 0xA282EAD8u; }
static uint32_t le32(const unsigned char *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

// ----------------------------------------------------------------------------
// the reader

typedef struct { const unsigned char *p; size_t n; } Bytes;
#define MAX_RECORDS 4096
typedef struct { char *data; Bytes rec[MAX_RECORDS]; int n; int bad_crc; } Records;

// every whole record of the file (a cut last one is left out, as TensorBoard's reader does)
static int read_records(const char *path, Records *r) {
    size_t len;
    memset(r, 0, sizeof *r);
    if (!(r->data = read_file(path, &len))) return -1;
    const unsigned char *d = (const unsigned char *)r->data;
    for (size_t at = 0; at + 12 <= len && r->n < MAX_RECORDS;) {
        uint64_t n = le32(d + at) | (uint64_t)le32(d + at + 4) << 32;
        if (n > len - at - 12 || len - at - 12 - n < 4) break;
        r->bad_crc += le32(d + at + 8) != mask(crc_bitwise(d + at, 8)) || le32(d + at + 12 + n) != mask(crc_bitwise(d + at + 12, n));
        r->rec[r->n++] = (Bytes){d + at + 12, (size_t)n};
        at += 16 + n;
    }
    return 0;
}

// protocol buffer fields: the next one of b (its number, wire type, varint or fixed value, or bytes)
typedef struct { int field, wire; uint64_t v; Bytes bytes; } Field;
static int next_field(Bytes *b, Field *f) {
    uint64_t key = 0;
    f->v = 0;
    int shift = 0;
    if (b->n == 0) return 0;
    #define VARINT(out) do { out = 0; shift = 0; unsigned char c_; do { if (!b->n) return -1; c_ = *b->p++; b->n--; \
                             out |= (uint64_t)(c_ & 0x7F) << shift; shift += 7; } while (c_ & 0x80); } while (0)
    VARINT(key);
    f->field = (int)(key >> 3), f->wire = (int)(key & 7);
    if (f->wire == 0) VARINT(f->v);
    else if (f->wire == 1 || f->wire == 5) {
        size_t k = f->wire == 1 ? 8 : 4;
        if (b->n < k) return -1;
        f->v = 0;
        for (size_t i = 0; i < k; i++) f->v |= (uint64_t)b->p[i] << (8 * i);
        b->p += k, b->n -= k;
    } else if (f->wire == 2) {
        uint64_t n;
        VARINT(n);
        if (n > b->n) return -1;
        f->bytes = (Bytes){b->p, (size_t)n};
        b->p += n, b->n -= n;
    } else return -1;
    #undef VARINT
    return 1;
}
// the bytes of field `field` (the first) in b, or {NULL, 0}
static Bytes sub(Bytes b, int field) {
    Field f;
    while (next_field(&b, &f) == 1) if (f.field == field && f.wire == 2) return f.bytes;
    return (Bytes){NULL, 0};
}

// an Event: its step (absent: 0, proto3's default) and summary; file_version when it has one
typedef struct { long step; Bytes summary, version; } Event;
static Event event_of(Bytes b) {
    Event e = {0, {NULL, 0}, {NULL, 0}};
    Field f;
    while (next_field(&b, &f) == 1) {
        if (f.field == 2 && f.wire == 0) e.step = (long)f.v;
        if (f.field == 5 && f.wire == 2) e.summary = f.bytes;
        if (f.field == 3 && f.wire == 2) e.version = f.bytes;
    }
    return e;
}
static int bytes_is(Bytes b, const char *s) { return b.p && b.n == strlen(s) && memcmp(b.p, s, b.n) == 0; }

// the simple_value of tag in summary s (1 found, 0 absent)
static int scalar_of(Bytes s, const char *tag, float *out) {
    Field f, g;
    while (next_field(&s, &f) == 1) {
        if (f.field != 1 || f.wire != 2 || !bytes_is(sub(f.bytes, 1), tag)) continue;
        Bytes v = f.bytes;
        while (next_field(&v, &g) == 1)
            if (g.field == 2 && g.wire == 5) { uint32_t u = (uint32_t)g.v; memcpy(out, &u, 4); return 1; }
    }
    return 0;
}

// ----------------------------------------------------------------------------

static void test_crc(void) {
    // the CRC catalogue's check value for CRC-32C ("123456789")
    CHECK(crc_bitwise((const unsigned char *)"123456789", 9) == 0xE3069283u, "the bitwise CRC-32C gives the catalogue's check value", "");
    unsigned char buf[1000];
    int same = 1;
    for (int i = 0; i < 1000; i++) buf[i] = (unsigned char)(i * 131 + 7);
    for (size_t n = 0; n <= sizeof buf; n += 37) same &= tb_crc32c(buf, n) == crc_bitwise(buf, n);
    CHECK(same, "the writer's table-driven CRC-32C == the bitwise one", "");
}

// golden.tfevents (TensorBoard's writer) against golden.json, and our writer's bytes
static void test_golden(void) {
    Records g, ours;
    JsonValue j;
    if (read_records(FIX "/golden.tfevents", &g) != 0 || json_load_file(FIX "/golden.json", &j) != 0) die("cannot read " FIX);
    CHECK(g.n == 4 && g.bad_crc == 0 && bytes_is(event_of(g.rec[0]).version, "brain.Event:2"),
          "golden.tfevents: 4 records, every CRC right, file_version first", "%d records, %d bad CRCs", g.n, g.bad_crc);
    char tmpl[] = "/tmp/llama2tune_tb_XXXXXX";
    if (!mkdtemp(tmpl)) die("mkdtemp");
    TbWriter w;
    if (tb_open(&w, tmpl) != 0) die("tb_open");
    const JsonValue *sc = json_get(&j, "scalars");
    int good = 1;
    for (int i = 0; i < sc->count; i++) { // each [step, {tag: value}] as one event, read from the golden file and written by us
        const JsonValue *vals = &sc->items[i].items[1];
        long step = (long)sc->items[i].items[0].number;
        const char *tags[8];
        float v[8], got;
        Event e = event_of(g.rec[1 + i]);
        for (int k = 0; k < vals->count; k++) {
            tags[k] = vals->keys[k], v[k] = (float)vals->items[k].number;
            good &= e.step == step && scalar_of(e.summary, tags[k], &got) == 1 && got == v[k];
        }
        tb_scalars(&w, step, tags, v, vals->count);
    }
    CHECK(good, "golden.tfevents: every scalar at its step, as golden.json lists them", "");
    const JsonValue *tx = json_get(&j, "text");
    const char *text = json_get(tx, "text")->string;
    Bytes t = sub(sub(sub(event_of(g.rec[3]).summary, 1), 8), 8); // value, tensor, string_val
    CHECK(bytes_is(t, text), "golden.tfevents: the text event's string_val", "");
    tb_text(&w, (long)json_get(tx, "step")->number, json_get(tx, "tag")->string, text);
    tb_close(&w);
    DIR *d = opendir(tmpl);
    struct dirent *de;
    char path[600] = "";
    while ((de = readdir(d))) if (!strncmp(de->d_name, "events.out.tfevents.", 20)) snprintf(path, sizeof path, "%s/%s", tmpl, de->d_name);
    closedir(d);
    CHECK(path[0] && read_records(path, &ours) == 0 && ours.n == g.n && ours.bad_crc == 0,
          "our writer: the same number of records, every CRC right, named events.out.tfevents.*", "%d records", ours.n);
    int equal = ours.n == g.n;
    for (int i = 0; equal && i < g.n; i++) { // wall_time aside: the same step, version and summary bytes
        Event a = event_of(g.rec[i]), b = event_of(ours.rec[i]);
        equal = a.step == b.step && a.version.n == b.version.n && a.summary.n == b.summary.n &&
                (!a.summary.n || memcmp(a.summary.p, b.summary.p, a.summary.n) == 0) &&
                (!a.version.n || memcmp(a.version.p, b.version.p, a.version.n) == 0);
    }
    CHECK(equal, "our writer encodes the golden events to TensorBoard's bytes (scalars and text; wall_time aside)", "");
    unlink(path);
    rmdir(tmpl);
    free(g.data); free(ours.data);
    json_free(&j);
}

// --check DIR METRICS: the one event file in DIR holds, at each step of the metrics file,
// its loss, learning rate, grad norm, tokens/s (and validation loss) within one float32
// ulp (the event holds the float32 of the trainer's double, the file that double to 9
// digits: two roundings of one value; tokens/s is printed to 3 decimals, so 0.0005 more),
// and the configuration text
static void check_run(const char *dir, const char *metrics) {
    static const char *tags[] = {"train/loss", "train/learning_rate", "train/grad_norm", "train/tokens_per_second", "eval/loss"};
    static const char *keys[] = {"loss", "lr", "grad_norm", "tok_per_s", "val_loss"};
    DIR *d = opendir(dir);
    struct dirent *de;
    char path[4096] = "";
    int files = 0;
    while (d && (de = readdir(d))) if (!strncmp(de->d_name, "events.out.tfevents.", 20)) files++, snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
    if (d) closedir(d);
    Records r;
    CHECK(files == 1 && read_records(path, &r) == 0 && r.bad_crc == 0, "the run's event file: one, every CRC right", "%d files", files);
    if (files != 1) return;
    size_t len;
    char *text = read_file(metrics, &len), *line = text;
    int n = 0, bad = 0;
    for (char *nl; text && (nl = strchr(line, '\n')); line = nl + 1) {
        *nl = 0;
        JsonValue m;
        char err[128];
        if (json_parse(line, strlen(line), &m, err, sizeof err) != 0) die("bad metrics line");
        long step = (long)json_get(&m, "step")->number;
        for (int k = 0; k < 5; k++) {
            double want;
            float got = NAN;
            if (json_get_number(&m, keys[k], &want) != 0) continue;
            int found = 0;
            for (int i = 0; i < r.n && !found; i++) {
                Event e = event_of(r.rec[i]);
                found = e.step == step && scalar_of(e.summary, tags[k], &got);
            }
            n++;
            double tol = nextafterf(fabsf((float)want), INFINITY) - fabsf((float)want) + (k == 3 ? 5e-4 : 0);
            bad += !found || fabs((double)got - want) > tol;
        }
        json_free(&m);
    }
    CHECK(n > 0 && bad == 0, "the run's scalars == its metrics file's at every step (within a float32 ulp)", "%d of %d differ", bad, n);
    int config = 0;
    for (int i = 0; i < r.n; i++) config |= bytes_is(sub(sub(event_of(r.rec[i]).summary, 1), 1), "config");
    CHECK(config, "the run's configuration is a text event", "");
    free(text); free(r.data);
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "--check")) {
        check_run(argv[2], argv[3]);
        return test_summary();
    }
    test_crc();
    test_golden();
    return test_summary();
}
