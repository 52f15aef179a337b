// tensorboard.h: TensorBoard event files, written without TensorBoard.
//
// An event file is a TFRecord stream: each record is
//   uint64 length, uint32 masked CRC-32C of those 8 bytes, the payload,
//   uint32 masked CRC-32C of the payload (all little-endian),
// and each payload an Event protocol buffer (tensorflow/core/util/event.proto):
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }
//   Value   { string tag = 1; float simple_value = 2; TensorProto tensor = 8; SummaryMetadata metadata = 9; }
// The first record says file_version "brain.Event:2"; scalars are Values with a
// simple_value, as torch.utils.tensorboard's add_scalar writes them; text is a
// string tensor under the "text" plugin, as its add_text does. Each record is
// flushed when written, so a live `tensorboard --logdir` follows the run and a
// killed run's file is readable up to its last whole record.
#ifndef TENSORBOARD_H
#define TENSORBOARD_H

#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/time.h>

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), table-driven
static inline uint32_t tb_crc32c(const unsigned char *p, size_t n) {
    static uint32_t table[256];
    if (!table[1])
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
            table[i] = c;
        }
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}
// TFRecord masks its CRCs (a CRC of data that holds CRCs is weak otherwise)
static inline uint32_t tb_masked_crc(const unsigned char *p, size_t n) {
    uint32_t c = tb_crc32c(p, n);
    return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

// ----------------------------------------------------------------------------
// protocol buffer encoding, into a bounded buffer (an event is small)

typedef struct { unsigned char b[32768]; size_t n; int overflow; } TbBuf;

static inline void tb__bytes(TbBuf *o, const void *p, size_t n) {
    if (o->n + n > sizeof o->b) { o->overflow = 1; return; }
    memcpy(o->b + o->n, p, n);
    o->n += n;
}
static inline void tb__varint(TbBuf *o, uint64_t v) {
    unsigned char x[10];
    int n = 0;
    do { x[n++] = (unsigned char)((v & 0x7F) | (v > 0x7F ? 0x80 : 0)); v >>= 7; } while (v);
    tb__bytes(o, x, (size_t)n);
}
static inline void tb__key(TbBuf *o, int field, int wire) { tb__varint(o, (uint64_t)(field << 3 | wire)); }
static inline void tb__fixed(TbBuf *o, int field, uint64_t bits, int bytes) { // wire type 1 (8 bytes) or 5 (4)
    unsigned char x[8];
    tb__key(o, field, bytes == 8 ? 1 : 5);
    for (int i = 0; i < bytes; i++) x[i] = (unsigned char)(bits >> (8 * i));
    tb__bytes(o, x, (size_t)bytes);
}
static inline void tb__field(TbBuf *o, int field, const void *p, size_t n) { // wire type 2: bytes, string or message
    tb__key(o, field, 2);
    tb__varint(o, n);
    tb__bytes(o, p, n);
}
static inline void tb__double(TbBuf *o, int field, double v) { uint64_t b; memcpy(&b, &v, 8); tb__fixed(o, field, b, 8); }
static inline void tb__float(TbBuf *o, int field, float v) { uint32_t b; memcpy(&b, &v, 4); tb__fixed(o, field, b, 4); }

// ----------------------------------------------------------------------------
// the writer

typedef struct {
    FILE *f;
    char path[4096];
} TbWriter;

static inline double tb__now(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return tv.tv_sec + tv.tv_usec / 1e6;
}

// one record around payload p (n bytes), flushed. 0 ok, -1 (errno says why)
static inline int tb__record(TbWriter *w, const unsigned char *p, size_t n) {
    unsigned char head[12], tail[4];
    for (int i = 0; i < 8; i++) head[i] = (unsigned char)((uint64_t)n >> (8 * i));
    uint32_t hc = tb_masked_crc(head, 8), pc = tb_masked_crc(p, n);
    for (int i = 0; i < 4; i++) head[8 + i] = (unsigned char)(hc >> (8 * i)), tail[i] = (unsigned char)(pc >> (8 * i));
    if (fwrite(head, 1, 12, w->f) != 12 || fwrite(p, 1, n, w->f) != n || fwrite(tail, 1, 4, w->f) != 4) return -1;
    return fflush(w->f);
}

// an Event at step holding the Summary summary (encoded), now
static inline int tb__event(TbWriter *w, long step, const TbBuf *summary) {
    TbBuf e = {{0}, 0, 0};
    tb__double(&e, 1, tb__now());
    if (step) tb__key(&e, 2, 0), tb__varint(&e, (uint64_t)step); // (0 is proto3's default, left out as protobuf does)
    tb__field(&e, 5, summary->b, summary->n);
    return summary->overflow || e.overflow ? -1 : tb__record(w, e.b, e.n);
}

// Opens dir/events.out.tfevents.<time>.<host>.<pid>.0 (TensorBoard's own writer's name,
// so that its loader orders and finds it) and writes the file_version record. dir must
// exist. 0 ok, -1 (errno says why).
static inline int tb_open(TbWriter *w, const char *dir) {
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%010ld.%s.%ld.0", dir, (long)time(NULL), host, (long)getpid());
    w->f = fopen(w->path, "wb");
    if (!w->f) return -1;
    TbBuf e = {{0}, 0, 0};
    tb__double(&e, 1, tb__now());
    tb__field(&e, 3, "brain.Event:2", 13);
    return tb__record(w, e.b, e.n);
}

// scalars tags[i] = values[i] at step, in one event. 0 ok, -1
static inline int tb_scalars(TbWriter *w, long step, const char *const *tags, const float *values, int n) {
    TbBuf s = {{0}, 0, 0};
    for (int i = 0; i < n; i++) {
        TbBuf v = {{0}, 0, 0};
        tb__field(&v, 1, tags[i], strlen(tags[i]));
        tb__float(&v, 2, values[i]);
        tb__field(&s, 1, v.b, v.n);
        s.overflow |= v.overflow;
    }
    return tb__event(w, step, &s);
}

// text (markdown, as TensorBoard's text plugin renders it) under tag at step, as
// add_text writes it: a string tensor of shape [1] (TensorProto: dtype 7, DT_STRING;
// tensor_shape { dim { size: 1 } }; string_val) with the plugin's name in its metadata.
// 0 ok, -1 (also when the text is too long for one event: 32 KiB)
static inline int tb_text(TbWriter *w, long step, const char *tag, const char *text) {
    static const unsigned char shape[] = {0x12, 0x02, 0x08, 0x01}; // dim (field 2) { size (field 1): 1 }
    static const unsigned char meta[] = {0x0A, 0x06, 0x0A, 0x04, 't', 'e', 'x', 't'}; // plugin_data { plugin_name: "text" }
    TbBuf tensor = {{0}, 0, 0}, v = {{0}, 0, 0}, s = {{0}, 0, 0};
    tb__key(&tensor, 1, 0);
    tb__varint(&tensor, 7);
    tb__field(&tensor, 2, shape, sizeof shape);
    tb__field(&tensor, 8, text, strlen(text));
    tb__field(&v, 1, tag, strlen(tag));
    tb__field(&v, 8, tensor.b, tensor.n);
    tb__field(&v, 9, meta, sizeof meta);
    tb__field(&s, 1, v.b, v.n);
    s.overflow |= tensor.overflow | v.overflow;
    return tb__event(w, step, &s);
}

static inline int tb_close(TbWriter *w) {
    int rc = w->f && fclose(w->f) != 0 ? -1 : 0;
    w->f = NULL;
    return rc;
}

#endif // TENSORBOARD_H
