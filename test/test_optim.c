// train_llama2.c's adamw8bit_update, adamw_torchao_update and anyprecision_update
// against the optimizers themselves (dev/reference/make_optim_fixtures.py: torchao's
// AdamW8bit and llama-recipes' AnyPrecisionAdamW, run eagerly by torch on the CPU):
// every step of every run of test/fixtures/optim/ from the same inputs, each tensor's
// parameters, moments (8-bit: codes and absmax; fp32; bf16) and Kahan compensation
// compared bit for bit after every step (tolerance: none). The states start at zero
// and carry on from our own previous step, so an error at one step shows there. Also:
// support/optimizer_qmap.h's tables are torchao's, the 8-bit update of a tensor in two
// slices of whole blocks is the update of the whole, and the results are the same at
// any thread count.
#ifdef _OPENMP
#include <omp.h>
#endif
#include "../support/optimizer_cpu.h"
#include "test_common.h"

#define DIR "test/fixtures/optim/"

static StFile sf;

static const StTensor *find(const char *name, size_t numel) {
    const StTensor *t = st_find(&sf, name);
    if (!t) die(DIR "optim.safetensors: tensor '%s' is missing (regenerate with dev/reference/make_optim_fixtures.py)", name);
    if (t->numel != numel) die(DIR "optim.safetensors: '%s' has %llu elements, not %zu", name, (unsigned long long)t->numel, numel);
    return t;
}
// the raw little-endian elements of a tensor of `size`-byte elements of dtype d
static void *read_raw(const char *name, size_t numel, StDtype d, size_t size) {
    const StTensor *t = find(name, numel);
    if (t->dtype != d) die(DIR "optim.safetensors: '%s' is %s, not %s", name, st_dtype_name(t->dtype), st_dtype_name(d));
    void *x = mallocCheck(numel * size + 1);
    if (st__read_at(&sf, t, t->begin, x, numel * size) != 0) die("cannot read '%s'", name);
    return x;
}
static float *read_f32(const char *name, size_t numel) { return (float *)read_raw(name, numel, ST_F32, 4); }
static uint16_t *read_bf16(const char *name, size_t numel) { return (uint16_t *)read_raw(name, numel, ST_BF16, 2); }
// bf16 elements x (n, freed) as floats, as the trainers' --pure_bf16 weights are held
static float *bf16_floats(uint16_t *x, size_t n) {
    float *f = (float *)mallocCheck(n * 4 + 1);
    for (size_t i = 0; i < n; i++) f[i] = st_bf16_to_f32(x[i]);
    free(x);
    return f;
}

static const char *tname(const char *run, const char *x, const char *what, int t) {
    static char name[256];
    if (t < 0) snprintf(name, sizeof name, "%s.%s.%s", run, x, what);
    else snprintf(name, sizeof name, "%s.%s.%s%d", run, x, what, t);
    return name;
}

// CHECKs that got (n elements of `size` bytes) is the fixture's tensor, byte for byte
static void check_bits(const char *what, const void *got, const void *want, size_t n, size_t size) {
    const unsigned char *a = (const unsigned char *)got, *b = (const unsigned char *)want;
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(a + i * size, b + i * size, size) != 0 && bad++ == 0) first = i;
    double gv = 0, wv = 0;
    if (bad && size == 4) { float f; memcpy(&f, a + first * 4, 4); gv = f; memcpy(&f, b + first * 4, 4); wv = f; }
    if (bad && size == 2) { uint16_t h; memcpy(&h, a + first * 2, 2); gv = st_bf16_to_f32(h); memcpy(&h, b + first * 2, 2); wv = st_bf16_to_f32(h); }
    if (bad && size == 1) { gv = a[first]; wv = b[first]; }
    CHECK(bad == 0, what, "%zu of %zu elements differ, the first at %zu: %.9g, the reference's %.9g", bad, n, first, gv, wv);
}

static void check_tables(void) {
    float *s = read_f32("qmap.signed", 256), *u = read_f32("qmap.unsigned", 256);
    check_bits("optimizer_qmap.h: qmap8_signed is torchao's create_dynamic_map(signed=True)", qmap8_signed, s, 256, 4);
    check_bits("optimizer_qmap.h: qmap8_unsigned is torchao's create_dynamic_map(signed=False)", qmap8_unsigned, u, 256, 4);
    free(s), free(u);
}

static double num(const JsonValue *o, const char *key) {
    double d;
    if (json_get_number(o, key, &d) != 0) die(DIR "optim.json: missing number '%s'", key);
    return d;
}
static const char *str(const JsonValue *o, const char *key) {
    const char *s;
    if (json_get_string(o, key, &s, NULL) != 0) die(DIR "optim.json: missing string '%s'", key);
    return s;
}
typedef struct { const char *name; double lr, beta1, beta2, eps, wd; int steps, kahan; const JsonValue *tensors; } Run;
static Run read_run(const JsonValue *r) {
    Run run = {str(r, "name"), num(r, "lr"), num(r, "beta1"), num(r, "beta2"), num(r, "eps"), num(r, "weight_decay"),
               (int)num(r, "steps"), 0, json_get(r, "tensors")};
    json_get_bool(r, "kahan", &run.kahan);
    if (!run.tensors || run.tensors->type != JSON_ARRAY) die(DIR "optim.json: run %s has no tensors", run.name);
    return run;
}

// CHECKs that got (count elements of dtype d) is tensor <run>.<x>.<suffix><t> of the fixture
static void check_step(const Run *r, const char *x, size_t n, const char *path, int t, const char *label,
                       const void *got, const char *suffix, size_t count, StDtype d) {
    size_t size = d == ST_U8 ? 1 : d == ST_BF16 ? 2 : 4;
    void *want = read_raw(tname(r->name, x, suffix, t), count, d, size);
    char what[300];
    snprintf(what, sizeof what, "%s %s (%zu, %s) step %d: %s", r->name, x, n, path, t, label);
    check_bits(what, got, want, count, size);
    free(want);
}

// AdamW8bit: tensors of the 8-bit path in slices (the first `first_blocks` blocks, then
// the rest: 0 for one call), the others by the fp32 path
static void check_adamw8bit(const Run *r) {
    for (int k = 0; k < r->tensors->count; k++) {
        const JsonValue *x = &r->tensors->items[k];
        const char *xn = str(x, "name");
        size_t n = (size_t)num(x, "numel");
        int eight = 0;
        json_get_bool(x, "eight_bit", &eight);
        float *p = read_f32(tname(r->name, xn, "p0", -1), n);
        size_t nb = n / ADAMW8BIT_BLOCK, first_blocks = !strcmp(xn, "b") ? 7 : 0; // b: two slices
        uint8_t *mc = (uint8_t *)callocCheck(n, 1), *vc = (uint8_t *)callocCheck(n, 1);
        float *ma = (float *)callocCheck(nb + 1, 4), *va = (float *)callocCheck(nb + 1, 4);
        float *m = (float *)callocCheck(n, 4), *v = (float *)callocCheck(n, 4);
        for (int t = 1; t <= r->steps; t++) {
            float *g = read_f32(tname(r->name, xn, "g", t), n);
            if (eight) {
                size_t cut = first_blocks * ADAMW8BIT_BLOCK;
                if (cut) adamw8bit_update(p, g, mc, ma, vc, va, cut, t, r->lr, r->beta1, r->beta2, r->eps, r->wd);
                adamw8bit_update(p + cut, g + cut, mc + cut, ma + first_blocks, vc + cut, va + first_blocks, n - cut, t,
                                 r->lr, r->beta1, r->beta2, r->eps, r->wd);
            } else {
                adamw_torchao_update(p, g, m, v, n, t, r->lr, r->beta1, r->beta2, r->eps, r->wd);
            }
            const char *path = eight ? (first_blocks ? "8-bit, two slices" : "8-bit") : "fp32 path";
            check_step(r, xn, n, path, t, "params", p, "p", n, ST_F32);
            if (eight) {
                check_step(r, xn, n, path, t, "exp_avg codes", mc, "m_codes", n, ST_U8);
                check_step(r, xn, n, path, t, "exp_avg absmax", ma, "m_absmax", nb, ST_F32);
                check_step(r, xn, n, path, t, "exp_avg_sq codes", vc, "v_codes", n, ST_U8);
                check_step(r, xn, n, path, t, "exp_avg_sq absmax", va, "v_absmax", nb, ST_F32);
            } else {
                check_step(r, xn, n, path, t, "exp_avg", m, "m", n, ST_F32);
                check_step(r, xn, n, path, t, "exp_avg_sq", v, "v", n, ST_F32);
            }
            free(g);
        }
        free(p), free(mc), free(vc), free(ma), free(va), free(m), free(v);
    }
}

static void check_anyprecision(const Run *r) {
    for (int k = 0; k < r->tensors->count; k++) {
        const JsonValue *x = &r->tensors->items[k];
        const char *xn = str(x, "name");
        size_t n = (size_t)num(x, "numel");
        float *p = bf16_floats(read_bf16(tname(r->name, xn, "p0", -1), n), n), *g = (float *)mallocCheck(n * 4);
        uint16_t *m = (uint16_t *)callocCheck(n, 2), *v = (uint16_t *)callocCheck(n, 2), *pb = (uint16_t *)mallocCheck(n * 2);
        uint16_t *c = r->kahan ? (uint16_t *)callocCheck(n, 2) : NULL;
        const char *path = r->kahan ? "Kahan" : "no Kahan";
        for (int t = 1; t <= r->steps; t++) {
            uint16_t *gb = read_bf16(tname(r->name, xn, "g", t), n);
            for (size_t i = 0; i < n; i++) g[i] = st_bf16_to_f32(gb[i]);
            anyprecision_update(p, g, m, v, c, n, t, r->lr, r->beta1, r->beta2, r->eps, r->wd);
            for (size_t i = 0; i < n; i++) pb[i] = bf16_from_f32(p[i]); // (exact: the update returns bf16 values)
            check_step(r, xn, n, path, t, "params", pb, "p", n, ST_BF16);
            check_step(r, xn, n, path, t, "exp_avg", m, "m", n, ST_BF16);
            check_step(r, xn, n, path, t, "exp_avg_sq", v, "v", n, ST_BF16);
            if (c) check_step(r, xn, n, path, t, "compensation", c, "c", n, ST_BF16);
            free(gb);
        }
        free(p), free(g), free(m), free(v), free(c), free(pb);
    }
}

// the 8-bit update (and the others) at 1 and 3 threads: blocks (elements) are
// independent, so the bits must not change
static void check_threads(void) {
#ifdef _OPENMP
    size_t n = 4096;
    float *p[2], *g = (float *)mallocCheck(n * 4), *ma[2], *va[2], *m[2], *v[2];
    uint8_t *mc[2], *vc[2];
    float *bp[2], *bg = (float *)mallocCheck(n * 4); // AnyPrecision's bf16 parameters and gradients
    uint16_t *bm[2], *bv[2], *bc[2];
    for (size_t i = 0; i < n; i++) g[i] = sinf((float)i) * powf(10.0f, (float)(i % 9) - 6.0f), bg[i] = bf16_round(g[i]);
    int saved = omp_get_max_threads();
    for (int run = 0; run < 2; run++) {
        omp_set_num_threads(run ? 3 : 1);
        p[run] = (float *)mallocCheck(n * 4);
        for (size_t i = 0; i < n; i++) p[run][i] = cosf((float)i);
        mc[run] = (uint8_t *)callocCheck(n, 1), vc[run] = (uint8_t *)callocCheck(n, 1);
        ma[run] = (float *)callocCheck(n / 256, 4), va[run] = (float *)callocCheck(n / 256, 4);
        m[run] = (float *)callocCheck(n, 4), v[run] = (float *)callocCheck(n, 4);
        bp[run] = (float *)mallocCheck(n * 4), bm[run] = (uint16_t *)callocCheck(n, 2);
        bv[run] = (uint16_t *)callocCheck(n, 2), bc[run] = (uint16_t *)callocCheck(n, 2);
        for (size_t i = 0; i < n; i++) bp[run][i] = bf16_round(p[run][i]);
        for (int t = 1; t <= 2; t++) {
            adamw8bit_update(p[run], g, mc[run], ma[run], vc[run], va[run], n, t, 1e-3, 0.9, 0.999, 1e-8, 0.1);
            adamw_torchao_update(p[run], g, m[run], v[run], n, t, 1e-3, 0.9, 0.999, 1e-8, 0.1);
            anyprecision_update(bp[run], bg, bm[run], bv[run], bc[run], n, t, 1e-3, 0.9, 0.999, 1e-8, 0.1);
        }
    }
    omp_set_num_threads(saved);
    int same = !memcmp(p[0], p[1], n * 4) && !memcmp(mc[0], mc[1], n) && !memcmp(vc[0], vc[1], n) &&
               !memcmp(ma[0], ma[1], n / 256 * 4) && !memcmp(va[0], va[1], n / 256 * 4) && !memcmp(m[0], m[1], n * 4) &&
               !memcmp(v[0], v[1], n * 4) && !memcmp(bp[0], bp[1], n * 4) && !memcmp(bm[0], bm[1], n * 2) &&
               !memcmp(bv[0], bv[1], n * 2) && !memcmp(bc[0], bc[1], n * 2);
    CHECK(same, "optimizer updates: the same bits at 1 and 3 threads", "they differ");
    for (int run = 0; run < 2; run++) {
        free(p[run]), free(mc[run]), free(vc[run]), free(ma[run]), free(va[run]), free(m[run]), free(v[run]);
        free(bp[run]), free(bm[run]), free(bv[run]), free(bc[run]);
    }
    free(g), free(bg);
#else
    test_skip("optimizer updates at 1 and 3 threads", "built without OpenMP");
#endif
}

int main(void) {
    JsonValue meta;
    if (json_load_file(DIR "optim.json", &meta) != 0) return 1;
    if (st_open(&sf, DIR "optim.safetensors") != 0) return 1;
    check_tables();
    const JsonValue *runs = json_get(&meta, "adamw8bit");
    for (int i = 0; runs && i < runs->count; i++) {
        Run r = read_run(&runs->items[i]);
        check_adamw8bit(&r);
    }
    runs = json_get(&meta, "anyprecision");
    for (int i = 0; runs && i < runs->count; i++) {
        Run r = read_run(&runs->items[i]);
        check_anyprecision(&r);
    }
    check_threads();
    st_close(&sf);
    json_free(&meta);
    return test_summary();
}
