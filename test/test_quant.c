// peft/quant.h against bitsandbytes: every case of test/fixtures/quant/cases.safetensors
// (dev/reference/make_quant_fixtures.py: bnb.functional.quantize_4bit with blocksize
// 64, nf4 and fp4, compress_statistics off and on, and dequantize_4bit) byte for byte:
// the packed codes, the absmax values, the double quantization's 8-bit codes and
// scales, and the dequantized weights bit for bit. The one statistic not compared
// exactly is the double quantization's offset, torch.mean's fp32 rounding (peft/quant.h's
// opening comment): it must be within 2 ulp, and the 8-bit codes are compared twice,
// from bitsandbytes' offset (always exact) and from ours (exact whenever the offsets agree).
#include <stdint.h>
#include <string.h>
#include "../support/utils.h"
#include "../support/json.h"
#include "../support/safetensors.h"
#include "../peft/quant.h"
#include "test_common.h"

#define FIXTURE "test/fixtures/quant/cases.safetensors"

static StFile sf;

static const StTensor *find(const char *name) {
    const StTensor *t = st_find(&sf, name);
    if (!t) die("%s: tensor '%s' is missing (regenerate with dev/reference/make_quant_fixtures.py)", FIXTURE, name);
    return t;
}
static float *read_f32(const char *name, size_t *n) {
    const StTensor *t = find(name);
    float *x = (float *)mallocCheck(t->numel * sizeof(float));
    if (st_read_f32(&sf, t, 0, t->numel, x) != 0) die("%s: cannot read '%s'", FIXTURE, name);
    if (n) *n = t->numel;
    return x;
}
static uint8_t *read_u8(const char *name, size_t *n) {
    const StTensor *t = find(name);
    if (t->dtype != ST_U8) die("%s: '%s' is not U8", FIXTURE, name);
    uint8_t *x = (uint8_t *)mallocCheck(t->numel);
    if (st__read_at(&sf, t, t->begin, x, t->numel) != 0) die("%s: cannot read '%s'", FIXTURE, name);
    *n = t->numel;
    return x;
}

// the first index where a and b (n bytes) differ, or -1
static long first_diff(const void *a, const void *b, size_t n) {
    const unsigned char *x = (const unsigned char *)a, *y = (const unsigned char *)b;
    for (size_t i = 0; i < n; i++)
        if (x[i] != y[i]) return (long)i;
    return -1;
}

static int32_t float_bits(float x) { int32_t i; memcpy(&i, &x, 4); return i; }

static void check_tables(void) {
    size_t n;
    float *nf4 = read_f32("nf4", &n), *fp4 = read_f32("fp4", NULL), *dyn = read_f32("dynamic", NULL);
    CHECK(n == 16 && first_diff(nf4, quant_nf4, sizeof quant_nf4) < 0, "quant: the NF4 table is bitsandbytes'", "differs");
    CHECK(first_diff(fp4, quant_fp4, sizeof quant_fp4) < 0, "quant: the FP4 table is bitsandbytes'", "differs");
    CHECK(first_diff(dyn, quant_dynamic, sizeof quant_dynamic) < 0, "quant: the 8-bit dynamic code is bitsandbytes'", "differs");
    free(nf4), free(fp4), free(dyn);
}

static int offsets_exact = 0, offsets_total = 0;

// the name of case c's tensor <c>.<part>
static const char *part(const char *c, const char *p) {
    static char name[300];
    snprintf(name, sizeof name, "%s.%s", c, p);
    return name;
}

static void check_case(const char *c) {
    char what[360];
    size_t nw, ncodes, nabs;
    int32_t meta[4];
    if (st_read_i32(&sf, find(part(c, "meta")), meta) != 0) die("%s: cannot read %s's meta", FIXTURE, c);
    int type = meta[0], dq = meta[1];
    char wname[256];
    snprintf(wname, sizeof wname, "%.*s.w", (int)(strchr(c, '.') - c), c);
    float *w = read_f32(wname, &nw), *absmax = read_f32(part(c, "absmax"), &nabs), *deq = read_f32(part(c, "deq"), NULL);
    uint8_t *codes = read_u8(part(c, "codes"), &ncodes);

    QuantTensor q, ref;
    size_t bytes = quant_layout(&q, type, dq, nw, NULL);
    uint8_t *buf = (uint8_t *)callocCheck(bytes, 1), *refbuf = (uint8_t *)callocCheck(bytes, 1);
    quant_layout(&q, type, dq, nw, buf);
    quant_layout(&ref, type, dq, nw, refbuf);
    float *scratch = (float *)mallocCheck(q.n_blocks * sizeof(float)), *out = (float *)mallocCheck(nw * sizeof(float));
    CHECK(ncodes == (nw + 1) / 2 && nabs == q.n_blocks, c, "fixture sizes %zu codes, %zu blocks for %zu weights", ncodes, nabs, nw);
    CHECK(quant_tensor(&q, w, scratch, c) == 0, c, "quant_tensor refused it");

    long d = first_diff(q.codes, codes, ncodes);
    snprintf(what, sizeof what, "%s: packed codes byte for byte", c);
    CHECK(d < 0, what, "byte %ld: 0x%02x, bitsandbytes 0x%02x", d, d < 0 ? 0 : q.codes[d], d < 0 ? 0 : codes[d]);
    memcpy(ref.codes, codes, ncodes);
    if (!dq) {
        d = first_diff(q.absmax, absmax, nabs * sizeof(float));
        snprintf(what, sizeof what, "%s: absmax bit for bit", c);
        CHECK(d < 0, what, "block %ld: %.9g, bitsandbytes %.9g", d / 4, d < 0 ? 0 : q.absmax[d / 4], d < 0 ? 0 : absmax[d / 4]);
        memcpy(ref.absmax, absmax, nabs * sizeof(float));
    } else {
        size_t nq, n2;
        uint8_t *qabsmax = read_u8(part(c, "qabsmax"), &nq);
        float *absmax2 = read_f32(part(c, "absmax2"), &n2), *offset = read_f32(part(c, "offset"), NULL);
        // torch.mean sums in fp32 in its own order: within 2 ulp of the correctly rounded mean
        int ulps = abs(float_bits(*q.offset) - float_bits(*offset));
        snprintf(what, sizeof what, "%s: offset (the mean of absmax) within 2 ulp of torch.mean's", c);
        CHECK(ulps <= 2, what, "%.9g, bitsandbytes %.9g (%d ulp)", *q.offset, *offset, ulps);
        offsets_total++;
        offsets_exact += ulps == 0;
        // the 8-bit codes from bitsandbytes' own offset: exact
        uint8_t *q8 = (uint8_t *)mallocCheck(nq);
        float *a2 = (float *)mallocCheck(n2 * sizeof(float));
        for (size_t b = 0; b < nabs; b++) scratch[b] = absmax[b] - *offset;
        quant_blocks8(scratch, nabs, q8, a2);
        d = first_diff(q8, qabsmax, nq);
        snprintf(what, sizeof what, "%s: 8-bit absmax codes byte for byte (bitsandbytes' offset)", c);
        CHECK(nq == q.n_blocks && d < 0, what, "block %ld: %d, bitsandbytes %d", d, d < 0 ? 0 : q8[d], d < 0 ? 0 : qabsmax[d]);
        d = first_diff(a2, absmax2, n2 * sizeof(float));
        snprintf(what, sizeof what, "%s: second-level absmax bit for bit (bitsandbytes' offset)", c);
        CHECK(n2 == q.n_blocks2 && d < 0, what, "block %ld: %.9g, bitsandbytes %.9g", d / 4, d < 0 ? 0 : a2[d / 4], d < 0 ? 0 : absmax2[d / 4]);
        if (ulps == 0) { // and quant_tensor's own, from its own (equal) offset
            snprintf(what, sizeof what, "%s: quant_tensor's 8-bit codes and scales byte for byte", c);
            CHECK(first_diff(q.qabsmax, qabsmax, nq) < 0 && first_diff(q.absmax2, absmax2, n2 * sizeof(float)) < 0, what, "differ");
        }
        memcpy(ref.qabsmax, qabsmax, nq);
        memcpy(ref.absmax2, absmax2, n2 * sizeof(float));
        *ref.offset = *offset;
        free(qabsmax), free(absmax2), free(offset), free(q8), free(a2);
    }
    // dequantize bitsandbytes' own quantization: its dequantize_4bit bit for bit, but for
    // the sign of FP4's zero code (peft/quant.h's quant_fp4), which no product or sum can see
    dequant_tensor(&ref, out, scratch);
    d = -1;
    for (size_t i = 0; i < nw && d < 0; i++)
        if (float_bits(out[i]) != float_bits(deq[i]) && !(out[i] == 0.0f && deq[i] == 0.0f)) d = (long)i * 4;
    snprintf(what, sizeof what, "%s: dequantized bit for bit", c);
    CHECK(d < 0, what, "element %ld: %.9g, bitsandbytes %.9g", d / 4, d < 0 ? 0 : out[d / 4], d < 0 ? 0 : deq[d / 4]);
    free(w), free(codes), free(absmax), free(deq), free(buf), free(refbuf), free(scratch), free(out);
}

// what quant_tensor refuses: weights it cannot quantize, each with a message
static void check_refusals(void) {
    QuantTensor q;
    uint8_t buf[64];
    float scratch[1], w[3] = {0.5f, NAN, 1.0f};
    quant_layout(&q, QUANT_NF4, 1, 3, buf);
    CHECK(quant_tensor(&q, w, scratch, "test.nan") == -1, "quant: a NaN weight is refused", "accepted");
    w[1] = INFINITY;
    CHECK(quant_tensor(&q, w, scratch, "test.inf") == -1, "quant: an infinite weight is refused", "accepted");
    quant_layout(&q, QUANT_NF4, 1, 0, buf);
    CHECK(quant_tensor(&q, w, scratch, "test.empty") == -1, "quant: a tensor of no elements is refused", "accepted");
}

int main(void) {
    if (st_open(&sf, FIXTURE) != 0) return 1;
    check_tables();
    for (int i = 0; i < sf.n_tensors; i++) {
        const char *name = sf.tensors[i].name;
        size_t n = strlen(name);
        if (n > 5 && strcmp(name + n - 5, ".meta") == 0) {
            char c[256];
            snprintf(c, sizeof c, "%.*s", (int)(n - 5), name);
            check_case(c);
        }
    }
    printf("(offsets equal to torch.mean's in %d of %d double-quantized cases)\n", offsets_exact, offsets_total);
    CHECK(offsets_total == 22, "quant: every case of the fixture ran", "%d double-quantized cases", offsets_total);
    check_refusals();
    st_close(&sf);
    return test_summary();
}
