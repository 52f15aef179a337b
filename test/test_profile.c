// Tests of --profile_dir's traces (support/profile.h), read with support/json.h's parser,
// which shares nothing with the trace's writer (printf):
//   - with no arguments: the checks below on traces made here, one good and one broken in
//     each way a check looks for, so that every check is seen to fail when it should;
//   - with --check TRACE A B LAYERS CHUNKS [--coverage] [--sharded] [--overlap]: a trainer's
//     trace of steps A..B of a model of LAYERS layers in CHUNKS chunks (test/test_profile.sh
//     runs both trainers).
// Run from the repo root.
#include "../support/utils.h" // first: feature macros; read_file
#include "../support/json.h"
#include "test_common.h"

typedef struct {
    char name[64], cat[32];
    int tid, step, layer, chunk;
    long long bytes; // -1: none
    double ts, dur;
} Ev;

typedef struct {
    Ev *ev;
    int n;
    int compute, comm; // the tracks named "compute stream" and "collectives stream" (-1: none)
} Trace;

// what a check expects of a trace
typedef struct {
    int first, last, layers, chunks;
    int coverage, sharded, overlap; // the optional checks
} Expect;

enum { C_PARSE = 1, C_DUR = 2, C_STEPS = 4, C_NAMES = 8, C_NEST = 16, C_COVER = 32, C_BYTES = 64, C_OVERLAP = 128 };
static const char *const check_what[] = {
    "the trace parses as JSON, every event complete (name, cat, tid, ts, dur, args.step)",
    "every duration >= 0 (a stream's span can measure 0: events resolve ~0.5 us), every host span's > 0",
    "its steps are exactly --profile_steps, every event inside its own step's time",
    "every step has data, optimizer, and per chunk each layer's forward and backward and the head",
    "on each track (the host, a stream) spans nest or follow each other",
    "the layers, embedding and head cover >= 95% of the step (the median step: data, the optimizer and the rest are ~2.5% of this toy model's step)",
    "every collective has its bytes; sharded: each layer gathered in every step",
    "the gather of layer i+1 starts (on the collectives' stream) before layer i's forward ends (on the compute stream)",
};
#define N_CHECKS 8

// why the last failing check failed
static char why[256];
static int fail(int check, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return check;
}

// the trace's complete events into t; 0, or C_PARSE
static int read_trace(const char *text, size_t len, Trace *t) {
    JsonValue j;
    char err[160];
    memset(t, 0, sizeof *t);
    t->compute = t->comm = -1;
    if (json_parse(text, len, &j, err, sizeof err) != 0) return fail(C_PARSE, "%s", err);
    const JsonValue *evs = json_get(&j, "traceEvents");
    int rc = 0;
    if (!evs || evs->type != JSON_ARRAY) rc = fail(C_PARSE, "no traceEvents array");
    t->ev = (Ev *)calloc(evs && evs->type == JSON_ARRAY ? evs->count + 1 : 1, sizeof(Ev));
    for (int i = 0; !rc && i < evs->count; i++) {
        const JsonValue *e = &evs->items[i], *args = json_get(e, "args");
        const char *ph, *name, *cat;
        long long tid, step;
        if (json_get_string(e, "ph", &ph, NULL) != 0 || json_get_int(e, "tid", &tid) != 0) { rc = fail(C_PARSE, "event %d: no ph or tid", i); break; }
        if (!strcmp(ph, "M")) { // a track's name
            const char *track;
            if (json_get_string(e, "name", &name, NULL) == 0 && !strcmp(name, "thread_name") && json_get_string(args, "name", &track, NULL) == 0) {
                if (!strcmp(track, "compute stream")) t->compute = (int)tid;
                if (!strcmp(track, "collectives stream")) t->comm = (int)tid;
            }
            continue;
        }
        Ev *v = &t->ev[t->n];
        if (strcmp(ph, "X") != 0 || json_get_string(e, "name", &name, NULL) != 0 || json_get_string(e, "cat", &cat, NULL) != 0 ||
            json_get_number(e, "ts", &v->ts) != 0 || json_get_number(e, "dur", &v->dur) != 0 || json_get_int(args, "step", &step) != 0) {
            rc = fail(C_PARSE, "event %d: not a complete event with name, cat, ts, dur and args.step", i);
            break;
        }
        long long layer = -1, chunk = -1;
        v->bytes = -1;
        json_get_int(args, "layer", &layer);
        json_get_int(args, "chunk", &chunk);
        json_get_int(args, "bytes", &v->bytes);
        snprintf(v->name, sizeof v->name, "%s", name);
        snprintf(v->cat, sizeof v->cat, "%s", cat);
        v->tid = (int)tid, v->step = (int)step, v->layer = (int)layer, v->chunk = (int)chunk;
        t->n++;
    }
    json_free(&j);
    return rc;
}

static const Ev *find(const Trace *t, int step, const char *name, int tid) { // tid -1: any track
    for (int i = 0; i < t->n; i++)
        if (t->ev[i].step == step && !strcmp(t->ev[i].name, name) && (tid < 0 || t->ev[i].tid == tid)) return &t->ev[i];
    return NULL;
}
static const Ev *step_span(const Trace *t, int step) {
    char name[32];
    snprintf(name, sizeof name, "step %d", step);
    return find(t, step, name, 0);
}
static double end_of(const Ev *e) { return e->ts + e->dur; }
#define ROUNDING 0.002 // us: ts and dur are written with 3 decimals

static int check_dur(const Trace *t, const Expect *x) {
    (void)x;
    for (int i = 0; i < t->n; i++)
        if (t->ev[i].dur < 0 || (t->ev[i].tid == 0 && t->ev[i].dur <= 0))
            return fail(C_DUR, "%s (step %d, track %d): dur %g", t->ev[i].name, t->ev[i].step, t->ev[i].tid, t->ev[i].dur);
    return 0;
}

// A stream's times are put on the host clock through a reference event (support/profile.h):
// that mapping may place them up to the reference's sync latency late, a few microseconds
#define STREAM_SLACK_US 100.0
static int check_steps(const Trace *t, const Expect *x) {
    for (int i = 0; i < t->n; i++) {
        const Ev *e = &t->ev[i];
        if (e->step < x->first || e->step > x->last) return fail(C_STEPS, "%s has step %d, outside %d-%d", e->name, e->step, x->first, x->last);
        if (!strcmp(e->cat, "step") && (e != step_span(t, e->step) || e->tid != 0)) return fail(C_STEPS, "a second span of step %d", e->step);
    }
    for (int s = x->first; s <= x->last; s++)
        if (!step_span(t, s)) return fail(C_STEPS, "no span of step %d", s);
    for (int i = 0; i < t->n; i++) { // inside its step: from the step's start to the next one's
        const Ev *e = &t->ev[i], *st = step_span(t, e->step), *next = e->step < x->last ? step_span(t, e->step + 1) : NULL;
        double slack = e->tid ? STREAM_SLACK_US : ROUNDING;
        if (e->ts < st->ts - slack || (next && end_of(e) > next->ts + slack))
            return fail(C_STEPS, "%s of step %d at %.3f..%.3f, outside the step's %.3f..%.3f", e->name, e->step, e->ts, end_of(e), st->ts,
                        next ? next->ts : INFINITY);
    }
    return 0;
}

static int check_names(const Trace *t, const Expect *x) {
    static const char *const kinds[] = {"forward", "backward"};
    char name[64];
    for (int s = x->first; s <= x->last; s++) {
        if (!find(t, s, "data", 0) || !find(t, s, "optimizer", 0)) return fail(C_NAMES, "step %d: no data or optimizer span", s);
        for (int c = 0; c < x->chunks; c++) {
            snprintf(name, sizeof name, "head chunk %d", c);
            if (!find(t, s, name, -1)) return fail(C_NAMES, "step %d: no '%s'", s, name);
            for (int l = 0; l < x->layers; l++)
                for (int k = 0; k < 2; k++) {
                    snprintf(name, sizeof name, "%s layer %d chunk %d", kinds[k], l, c);
                    const Ev *e = find(t, s, name, -1);
                    if (!e || e->layer != l || e->chunk != c) return fail(C_NAMES, "step %d: no '%s' (with its layer and chunk)", s, name);
                }
        }
    }
    return 0;
}

// a track runs one thing at a time: any two of its spans are disjoint or one holds the other
static int check_nest(const Trace *t, const Expect *x) {
    (void)x;
    for (int i = 0; i < t->n; i++)
        for (int k = i + 1; k < t->n; k++) {
            const Ev *a = &t->ev[i], *b = &t->ev[k];
            if (a->tid != b->tid) continue;
            int disjoint = end_of(a) <= b->ts + ROUNDING || end_of(b) <= a->ts + ROUNDING;
            int nested = (a->ts <= b->ts + ROUNDING && end_of(b) <= end_of(a) + ROUNDING) ||
                         (b->ts <= a->ts + ROUNDING && end_of(a) <= end_of(b) + ROUNDING);
            if (!disjoint && !nested) return fail(C_NEST, "'%s' and '%s' (track %d) overlap without nesting", a->name, b->name, a->tid);
        }
    return 0;
}

static int is_model_span(const Ev *e) {
    return !strcmp(e->cat, "forward") || !strcmp(e->cat, "backward") || !strcmp(e->cat, "head") || !strncmp(e->cat, "embedding", 9);
}
static int cmp_double(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }
// the host's layer, embedding and head spans inside the step's span (not an evaluation's
// after it), each counted once (not those inside another, as a recomputed forward inside a
// backward), against the step's span
static int check_coverage(const Trace *t, const Expect *x) {
    double ratio[64];
    int n = 0;
    for (int s = x->first; s <= x->last && n < 64; s++) {
        const Ev *st = step_span(t, s);
        double sum = 0;
        for (int i = 0; i < t->n; i++) {
            const Ev *e = &t->ev[i];
            if (e->step != s || e->tid != 0 || !is_model_span(e) || !st || e->ts < st->ts || end_of(e) > end_of(st) + ROUNDING) continue;
            int inner = 0;
            for (int k = 0; k < t->n && !inner; k++)
                inner = k != i && t->ev[k].step == s && t->ev[k].tid == 0 && is_model_span(&t->ev[k]) && t->ev[k].ts <= e->ts &&
                        end_of(e) <= end_of(&t->ev[k]) && t->ev[k].dur > e->dur;
            if (!inner) sum += e->dur;
        }
        ratio[n++] = st ? sum / st->dur : 0;
    }
    qsort(ratio, n, sizeof *ratio, cmp_double);
    double median = n ? ratio[(n - 1) / 2] : 0;
    fail(C_COVER, "the median step's model spans cover %.1f%% of it (lowest %.1f%%)", 100 * median, n ? 100 * ratio[0] : 0); // (said when it passes too)
    return median >= 0.95 && median <= 1.0 + 1e-6 ? 0 : C_COVER;
}

static int is_collective(const Ev *e) { return !strncmp(e->cat, "gather", 6) || !strncmp(e->cat, "reduce-scatter", 14) || !strncmp(e->cat, "all-reduce", 10); }
static int check_bytes(const Trace *t, const Expect *x) {
    for (int i = 0; i < t->n; i++)
        if (is_collective(&t->ev[i]) && t->ev[i].bytes <= 0) return fail(C_BYTES, "%s (step %d): bytes %lld", t->ev[i].name, t->ev[i].step, t->ev[i].bytes);
    char name[64];
    for (int s = x->first; x->sharded && s <= x->last; s++)
        for (int l = 0; l < x->layers; l++) {
            snprintf(name, sizeof name, "gather layer %d", l);
            if (!find(t, s, name, -1)) return fail(C_BYTES, "step %d: no '%s'", s, name);
        }
    return 0;
}

// The gather that feeds layer l + 1's forward of chunk c is the last gather of that layer
// on the collectives' stream to start before that forward does. Overlap: it starts before
// layer l's forward of the chunk ends. (The emulated build runs streams one at a time, so
// there it shows the order the work was issued in, not concurrency: test_profile.sh.)
static int check_overlap(const Trace *t, const Expect *x) {
    if (t->compute < 0 || t->comm < 0) return fail(C_OVERLAP, "no 'compute stream' and 'collectives stream' tracks");
    char name[64];
    for (int s = x->first; s <= x->last; s++)
        for (int c = 0; c < x->chunks; c++)
            for (int l = 0; l + 1 < x->layers; l++) {
                snprintf(name, sizeof name, "forward layer %d chunk %d", l, c);
                const Ev *f = find(t, s, name, t->compute), *g = NULL;
                snprintf(name, sizeof name, "forward layer %d chunk %d", l + 1, c);
                const Ev *f1 = find(t, s, name, t->compute);
                if (!f || !f1) return fail(C_OVERLAP, "step %d: no forward of layers %d and %d, chunk %d, on the compute stream", s, l, l + 1, c);
                snprintf(name, sizeof name, "gather layer %d", l + 1);
                for (int i = 0; i < t->n; i++) {
                    const Ev *e = &t->ev[i];
                    if (e->step == s && e->tid == t->comm && !strcmp(e->name, name) && e->ts <= f1->ts && (!g || e->ts > g->ts)) g = e;
                }
                if (!g) return fail(C_OVERLAP, "step %d: no gather of layer %d before its forward of chunk %d", s, l + 1, c);
                if (g->ts >= end_of(f))
                    return fail(C_OVERLAP, "step %d chunk %d: the gather of layer %d starts at %.3f, after layer %d's forward ended (%.3f)", s, c,
                                l + 1, g->ts, l, end_of(f));
            }
    return 0;
}

// every check's bit that fails (why: the last failure's reason)
static int check_trace(const char *text, size_t len, const Expect *x, int report) {
    Trace t;
    int failed = read_trace(text, len, &t);
    if (report) CHECK(!failed, check_what[0], "%s", why);
    if (failed) { free(t.ev); return failed; }
    int (*checks[])(const Trace *, const Expect *) = {NULL, check_dur, check_steps, check_names, check_nest, check_coverage, check_bytes, check_overlap};
    for (int k = 1; k < N_CHECKS; k++) { // (in check_what's order: bit 1 << k)
        if ((1 << k == C_COVER && !x->coverage) || (1 << k == C_OVERLAP && !x->overlap)) continue;
        why[0] = 0;
        int f = checks[k](&t, x);
        if (report) CHECK(!f, check_what[k], "%s", why);
        failed |= f;
    }
    free(t.ev);
    return failed;
}

// ----------------------------------------------------------------------------
// the checks on traces made here: steps 2-3 of 2 layers in 2 chunks, on the host (as the
// CPU trainer's) or on streams (gpu: the layers on the compute stream, 1, and each
// layer's gather on the collectives' stream, 2, starting as the layer before begins),
// each broken one way (break_as: a check's bit, 0 none)

typedef struct { char *p; size_t n, cap; } Out;
static void put(Out *o, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    o->n += vsnprintf(o->p + o->n, o->cap - o->n, fmt, ap);
    va_end(ap);
}
static void span(Out *o, const char *name, const char *cat, int tid, double ts, double dur, int step, int layer, int chunk, long long bytes) {
    put(o, ",\n{\"ph\": \"X\", \"name\": \"%s\", \"cat\": \"%s\", \"pid\": 0, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f, \"args\": {\"step\": %d",
        name, cat, tid, ts, dur, step);
    if (layer >= 0) put(o, ", \"layer\": %d", layer);
    if (chunk >= 0) put(o, ", \"chunk\": %d", chunk);
    if (bytes >= 0) put(o, ", \"bytes\": %lld", bytes);
    put(o, "}}");
}
static size_t make_trace(char *buf, size_t cap, int gpu, int break_as) {
    Out o = {buf, 0, cap};
    char name[64];
    put(&o, "{\"traceEvents\": [\n{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": 0, \"tid\": 0, \"args\": {\"name\": \"host\"}}");
    put(&o, ",\n{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": 0, \"tid\": 1, \"args\": {\"name\": \"compute stream\"}}");
    put(&o, ",\n{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": 0, \"tid\": 2, \"args\": {\"name\": \"collectives stream\"}}");
    double t = 1000, W = 20; // the model's 14 spans a step, W us apart, fill 280 of its 290 us
    int layer_tid = gpu ? 1 : 0;
    double model_dur = break_as == C_COVER ? W / 2 : W;
    for (int s = 2; s <= 3 + (break_as == C_STEPS); s++) {
        double t0 = t;
        snprintf(name, sizeof name, "step %d", s);
        span(&o, name, "step", 0, t0, 290, s, -1, -1, -1);
        span(&o, "data", "data", 0, t0 + 0.5, 1, s, -1, -1, -1);
        t = t0 + 2;
        for (int c = 0; c < 2; c++) {
            snprintf(name, sizeof name, "embedding forward chunk %d", c);
            span(&o, name, "embedding forward", layer_tid, t, model_dur, s, -1, c, -1), t += W;
            for (int l = 0; l < 2; l++) {
                snprintf(name, sizeof name, "gather layer %d", l);
                double g = l == 0 ? t - 1 : break_as == C_OVERLAP ? t : t - W + 1; // as the layer before starts (broken: as it ends)
                if (gpu) span(&o, name, "gather", 2, g, 1, s, l, -1, break_as == C_BYTES ? -1 : 4096);
                snprintf(name, sizeof name, "forward layer %d chunk %d", l, c);
                span(&o, name, "forward", layer_tid, t, model_dur, s, l, c, -1), t += W;
            }
        }
        for (int c = 1; c >= 0; c--) {
            snprintf(name, sizeof name, "head chunk %d", c);
            span(&o, name, "head", layer_tid, t, model_dur, s, -1, c, -1), t += W;
            for (int l = 1; l >= 0; l--) {
                snprintf(name, sizeof name, "backward layer %d chunk %d", l, c);
                if (!(break_as == C_NAMES && s == 3 && l == 1 && c == 0))
                    span(&o, name, "backward", layer_tid, t, l == 0 && break_as == C_DUR ? -1 : model_dur, s, l, c, -1);
                t += W;
            }
            snprintf(name, sizeof name, "embedding backward chunk %d", c);
            span(&o, name, "embedding backward", layer_tid, t, model_dur, s, -1, c, -1), t += W;
        }
        span(&o, "optimizer", "optimizer", 0, t0 + 283, break_as == C_NEST ? 10 : 5, s, -1, -1, -1); // (broken: past the step's end)
        if (break_as == C_STEPS && s == 3) span(&o, "late", "late", 0, t0 + 400, 1, 2, -1, -1, -1);
        t = t0 + 291;
    }
    put(&o, "\n]}\n");
    if (break_as == C_PARSE) o.n -= 4; // cut short
    return o.n;
}

static void test_checks(void) {
    static char buf[1 << 17];
    Expect host = {2, 3, 2, 2, 1, 0, 0}, gpu = {2, 3, 2, 2, 0, 1, 1};
    size_t n = make_trace(buf, sizeof buf, 0, 0);
    int got = check_trace(buf, n, &host, 0);
    CHECK(got == 0, "a good trace of the host passes every check", "failed 0x%x: %s", got, why);
    n = make_trace(buf, sizeof buf, 1, 0);
    got = check_trace(buf, n, &gpu, 0);
    CHECK(got == 0, "a good trace of streams passes every check", "failed 0x%x: %s", got, why);
    for (int k = 0; k < N_CHECKS; k++) {
        int bit = 1 << k, on_gpu = bit == C_OVERLAP || bit == C_BYTES;
        n = make_trace(buf, sizeof buf, on_gpu, bit);
        got = check_trace(buf, n, on_gpu ? &gpu : &host, 0);
        char what[320];
        snprintf(what, sizeof what, "a trace that breaks it fails: %s", check_what[k]);
        CHECK(got & bit, what, "failed 0x%x", got);
    }
}

int main(int argc, char **argv) {
    if (argc >= 7 && !strcmp(argv[1], "--check")) {
        Expect x = {atoi(argv[3]), atoi(argv[4]), atoi(argv[5]), atoi(argv[6]), 0, 0, 0};
        for (int i = 7; i < argc; i++) {
            if (!strcmp(argv[i], "--coverage")) x.coverage = 1;
            else if (!strcmp(argv[i], "--sharded")) x.sharded = 1;
            else if (!strcmp(argv[i], "--overlap")) x.overlap = 1;
            else die("unknown option %s", argv[i]);
        }
        size_t len;
        char *text = read_file(argv[2], &len);
        CHECK(text != NULL, "the trace is there", "%s: %s", argv[2], strerror(errno));
        if (text) check_trace(text, len, &x, 1);
        free(text);
        return test_summary();
    }
    test_checks();
    return test_summary();
}
