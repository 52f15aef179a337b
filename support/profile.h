// profile.h: where a step's time goes, as a Chrome/Perfetto trace (--profile_dir,
// --profile_steps) and as NVTX ranges for Nsight Systems, from one set of marks.
//
// The trainers mark the structure of a step with PROF_BEGIN / PROF_END pairs (a
// span: data loading, each layer's forward and backward per chunk, the head, the
// collectives, the optimizer, checkpoint writes). A span is timed on the host with
// the monotonic clock, or, given a CUDA stream, on that stream by two CUDA events
// (the stream's own time: the collectives' stream beside the compute stream shows
// their overlap), and it is a track (tid) of its own per stream. Events are kept in
// memory during the profiled steps; the trace (a JSON object of "complete" events,
// ph "X", ts and dur in microseconds of CLOCK_MONOTONIC, so that ranks of one machine
// line up) is written when the last of them ends, atomically (temporary file, rename).
//
// Outside the profiled steps a mark costs one branch on prof.on: no clock read, no
// event, no allocation. Under Nsight Systems (built with nvcc, where NVTX3's header-only
// API is; the emulated build and the CPU trainer have none) every span is also an NVTX
// range; nsys marks its launch by NVTX_INJECTION64_PATH, so without a tool attached the
// ranges cost the same one branch.
#ifndef PROFILE_H
#define PROFILE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>
#include "utils.h" // now_ms, mallocCheck, reallocCheck, write_bytes_atomic, mkdir_p, die

#if defined(__NVCC__) && __has_include(<nvtx3/nvToolsExt.h>)
#include <nvtx3/nvToolsExt.h>
static inline void prof__nvtx_push(const char *name) { nvtxRangePushA(name); }
static inline void prof__nvtx_pop(void) { nvtxRangePop(); }
#define PROF_HAVE_NVTX 1
#else
static inline void prof__nvtx_push(const char *name) { (void)name; }
static inline void prof__nvtx_pop(void) {}
#define PROF_HAVE_NVTX 0
#endif

#define PROF_NAME 56   // a span's name: "backward layer 79 chunk 127" and the like
#define PROF_DEPTH 32  // spans open at once
#define PROF_TRACKS 8  // streams with a track of their own

typedef struct {
    char name[PROF_NAME];
    const char *cat;      // what kind of span (a static string: "forward", "gather", ...)
    int tid;              // its track: 0 the host, else a stream's
    int step, layer, chunk; // -1: none
    long long bytes;      // a collective's: the buffer it moves (a gather's whole unit); -1: none
    double ts, dur;       // microseconds (CLOCK_MONOTONIC)
    int ev, ev_end;       // a stream's span: its events in the pool; -1: the host's
} ProfEvent;

typedef struct {
    int first, last;      // --profile_steps A-B (1-based, as the steps are printed)
    char path[4200];      // where the trace goes (empty: no trace)
    int rank;             // the process in the trace (pid)
    int nvtx;             // NVTX ranges: built with NVTX, and a tool is attached
    int recording;        // inside a profiled step: spans become events
    int on;               // recording || nvtx: the one flag a mark tests
    int step;             // the profiled step being recorded
    ProfEvent *ev;        // the events so far
    int n, cap;
    int stack[PROF_DEPTH], depth; // the open spans (indices in ev; -1: not recorded)
    void *streams[PROF_TRACKS]; // track 1 + i is streams[i]'s (track 0: the host)
    const char *stream_names[PROF_TRACKS];
    int n_streams;
#ifdef __CUDACC__
    cudaEvent_t *pool;    // a step's stream spans' events, reused every step
    int pool_n, pool_cap;
    cudaEvent_t ref;      // recorded at the step's start, when the host clock read ref_us
    double ref_us;
#endif
} Profile;

static Profile prof; // one per process: the marks are everywhere, the run has one trace

static inline double prof__now_us(void) { return now_ms() * 1e3; }

// --profile_steps: "A-B" with 1 <= A <= B. 0 ok, -1 with a message naming the option
static int profile_parse_steps(const char *s, int *first, int *last) {
    char *end;
    errno = 0;
    long a = strtol(s, &end, 10), b = -1;
    int ok = end != s && *end == '-' && a >= 1 && a <= 1 << 30 && !errno && (s[0] >= '0' && s[0] <= '9');
    if (ok) {
        const char *t = end + 1;
        b = strtol(t, &end, 10);
        ok = end != t && *end == 0 && (t[0] >= '0' && t[0] <= '9') && b <= 1 << 30 && !errno;
    }
    if (!ok || a > b) {
        fprintf(stderr, "error: --profile_steps: '%s' is not a range A-B of steps with 1 <= A <= B (e.g. 3-5)\n", s);
        return -1;
    }
    *first = (int)a, *last = (int)b;
    return 0;
}

// Sets the profiler up: the trace of steps first..last into dir (NULL: no trace),
// named trace.json, or trace.rank<R>.json when there are several ranks. Checks that dir
// can be written, so that a bad one stops the run before it trains: 0 ok, -1 (errno).
static int profile_init(const char *dir, int first, int last, int rank, int world) {
    prof.first = first, prof.last = last, prof.rank = rank;
    prof.nvtx = PROF_HAVE_NVTX && getenv("NVTX_INJECTION64_PATH") != NULL;
    prof.on = prof.nvtx;
    if (!dir) return 0;
    if (world > 1) snprintf(prof.path, sizeof prof.path, "%s/trace.rank%d.json", dir, rank);
    else snprintf(prof.path, sizeof prof.path, "%s/trace.json", dir);
    return mkdir_p(dir) == 0 && access(dir, W_OK | X_OK) == 0 ? 0 : -1;
}

// the stream's spans go on the track of this name (a backend names its streams as it
// makes them; a model made again moves the name to its new stream)
static void profile_track(void *stream, const char *name) {
    int i = 0;
    while (i < prof.n_streams && strcmp(prof.stream_names[i], name) != 0) i++;
    if (i == PROF_TRACKS) die("internal: --profile_dir: more than %d streams", PROF_TRACKS);
    prof.streams[i] = stream, prof.stream_names[i] = name;
    if (i == prof.n_streams) prof.n_streams++;
}
static int prof__track(void *stream) {
    for (int i = 0; i < prof.n_streams; i++)
        if (prof.streams[i] == stream) return 1 + i;
    die("internal: --profile_dir: a span on a stream without a track (profile_track)");
}

#ifdef __CUDACC__
static void prof__cuda(cudaError_t e, const char *what) {
    if (e != cudaSuccess) die("--profile_dir: %s: %s", what, cudaGetErrorString(e));
}
// the next of the step's events, recorded on stream
static int prof__record(void *stream) {
    if (prof.pool_n == prof.pool_cap) {
        prof.pool_cap = prof.pool_cap ? 2 * prof.pool_cap : 256;
        prof.pool = (cudaEvent_t *)reallocCheck(prof.pool, prof.pool_cap * sizeof(cudaEvent_t));
        for (int i = prof.pool_n; i < prof.pool_cap; i++) prof__cuda(cudaEventCreate(&prof.pool[i]), "cudaEventCreate");
    }
    prof__cuda(cudaEventRecord(prof.pool[prof.pool_n], (cudaStream_t)stream), "cudaEventRecord");
    return prof.pool_n++;
}
#endif

// opens a span named name (cat: its kind, a static string) on the host (stream NULL)
// or on a CUDA stream
static void prof__begin(void *stream, const char *cat, const char *name, int layer, int chunk, long long bytes) {
    if (prof.nvtx) prof__nvtx_push(name);
    int i = -1;
    if (prof.recording) {
        if (prof.n == prof.cap) {
            prof.cap = prof.cap ? 2 * prof.cap : 1024;
            prof.ev = (ProfEvent *)reallocCheck(prof.ev, prof.cap * sizeof(ProfEvent));
        }
        i = prof.n++;
        ProfEvent *e = &prof.ev[i];
        snprintf(e->name, sizeof e->name, "%s", name);
        e->cat = cat, e->step = prof.step, e->layer = layer, e->chunk = chunk, e->bytes = bytes;
        e->tid = stream ? prof__track(stream) : 0;
        e->ev = e->ev_end = -1;
        e->dur = 0;
#ifdef __CUDACC__
        if (stream) e->ev = prof__record(stream);
#endif
        if (!stream) e->ts = prof__now_us();
    }
    if (prof.depth == PROF_DEPTH) die("internal: --profile_dir: spans nested deeper than %d", PROF_DEPTH);
    prof.stack[prof.depth++] = i;
}

// a span of kind cat: its name is cat, then " layer L" (layer >= 0), then " chunk C" (chunk >= 0)
static void prof_begin(void *stream, const char *cat, int layer, int chunk, long long bytes) {
    char name[PROF_NAME];
    int n = snprintf(name, sizeof name, "%s", cat);
    if (layer >= 0 && n < PROF_NAME) n += snprintf(name + n, sizeof name - n, " layer %d", layer);
    if (chunk >= 0 && n < PROF_NAME) snprintf(name + n, sizeof name - n, " chunk %d", chunk);
    prof__begin(stream, cat, name, layer, chunk, bytes);
}

// a collective of unit u (fsdp.h's: 0 the embedding, 1 + l decoder layer l, then the head)
// moving bytes
static void prof_begin_unit(void *stream, const char *cat, int u, int n_layers, long long bytes) {
    char name[PROF_NAME];
    if (u >= 1 && u <= n_layers) snprintf(name, sizeof name, "%s layer %d", cat, u - 1);
    else snprintf(name, sizeof name, "%s %s", cat, u == 0 ? "embedding" : "head");
    prof__begin(stream, cat, name, u >= 1 && u <= n_layers ? u - 1 : -1, -1, bytes);
}

// closes the innermost open span (its stream: the one it was opened on)
static void prof_end(void *stream) {
    if (prof.depth == 0) die("internal: --profile_dir: a span closed that was not open");
    int i = prof.stack[--prof.depth];
    if (prof.nvtx) prof__nvtx_pop();
    if (i < 0) return;
    ProfEvent *e = &prof.ev[i];
#ifdef __CUDACC__
    if (stream) { e->ev_end = prof__record(stream); return; }
#endif
    (void)stream;
    e->dur = prof__now_us() - e->ts;
}

// the marks: one branch when neither a trace nor NVTX wants them
#define PROF_BEGIN(stream, cat, layer, chunk, bytes) do { if (prof.on) prof_begin(stream, cat, layer, chunk, bytes); } while (0)
#define PROF_BEGIN_UNIT(stream, cat, u, n_layers, bytes) do { if (prof.on) prof_begin_unit(stream, cat, u, n_layers, bytes); } while (0)
#define PROF_END(stream) do { if (prof.on) prof_end(stream); } while (0)

// Before step (1-based, as printed) runs: records it when it is one of the profiled
// steps, and opens its span ("step N"), which the trainer closes with PROF_END(NULL)
// when the optimizer step is done. On the GPU the streams are drained first and a
// reference event recorded with the host clock's reading, onto which the step's stream
// times are put (cudaEventElapsedTime from it).
static void profile_step_begin(int step) {
    prof.recording = prof.path[0] && step >= prof.first && step <= prof.last;
    prof.on = prof.recording || prof.nvtx;
    if (!prof.on) return;
    prof.step = step;
#ifdef __CUDACC__
    if (prof.recording) {
        if (!prof.ref) prof__cuda(cudaEventCreate(&prof.ref), "cudaEventCreate");
        prof__cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
        prof__cuda(cudaEventRecord(prof.ref, 0), "cudaEventRecord");
        prof__cuda(cudaEventSynchronize(prof.ref), "cudaEventSynchronize");
        prof.ref_us = prof__now_us();
    }
#endif
    char name[PROF_NAME];
    snprintf(name, sizeof name, "step %d", step);
    prof__begin(NULL, "step", name, -1, -1, -1);
}

// the trace: the tracks' names, then the events (ph "X": complete events)
static int profile_write(void) {
    size_t cap = (size_t)(prof.n + PROF_TRACKS + 4) * (PROF_NAME + 320), n = 0;
    char *buf = (char *)mallocCheck(cap);
#define PROF_PUT(...) (n += (size_t)snprintf(buf + n, cap - n, __VA_ARGS__))
    PROF_PUT("{\"traceEvents\": [\n{\"ph\": \"M\", \"name\": \"process_name\", \"pid\": %d, \"tid\": 0, \"args\": {\"name\": \"rank %d\"}}",
             prof.rank, prof.rank);
    for (int t = 0; t <= prof.n_streams; t++)
        PROF_PUT(",\n{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": %d, \"tid\": %d, \"args\": {\"name\": \"%s\"}}", prof.rank, t,
                 t ? prof.stream_names[t - 1] : "host");
    for (int i = 0; i < prof.n; i++) {
        const ProfEvent *e = &prof.ev[i];
        PROF_PUT(",\n{\"ph\": \"X\", \"name\": \"%s\", \"cat\": \"%s\", \"pid\": %d, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f, "
                 "\"args\": {\"step\": %d", e->name, e->cat, prof.rank, e->tid, e->ts, e->dur, e->step);
        if (e->layer >= 0) PROF_PUT(", \"layer\": %d", e->layer);
        if (e->chunk >= 0) PROF_PUT(", \"chunk\": %d", e->chunk);
        if (e->bytes >= 0) PROF_PUT(", \"bytes\": %lld", e->bytes);
        PROF_PUT("}}");
    }
    PROF_PUT("\n],\n\"displayTimeUnit\": \"ms\",\n\"otherData\": {\"profile_steps\": \"%d-%d\"}}\n", prof.first, prof.last);
#undef PROF_PUT
    int rc = n < cap ? write_bytes_atomic(prof.path, buf, n) : -1;
    free(buf);
    return rc;
}

// After step (1-based) and what follows it in the loop (evaluation, checkpoint): the
// stream spans' times read from their events; then, after the last profiled step (or
// the run's last step, run_ends, when the run ends before it), the trace is written and
// the events freed. 0 ok, -1 when the trace could not be written (errno says why).
static int profile_step_done(int step, int run_ends) {
    if (!prof.recording) return 0;
#ifdef __CUDACC__
    prof__cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    for (int i = 0; i < prof.n; i++) {
        ProfEvent *e = &prof.ev[i];
        if (e->step != step || e->ev < 0) continue;
        float from_ref = 0, ms = 0;
        prof__cuda(cudaEventElapsedTime(&from_ref, prof.ref, prof.pool[e->ev]), "cudaEventElapsedTime");
        prof__cuda(cudaEventElapsedTime(&ms, prof.pool[e->ev], prof.pool[e->ev_end]), "cudaEventElapsedTime");
        e->ts = prof.ref_us + 1e3 * from_ref, e->dur = 1e3 * ms;
        e->ev = e->ev_end = -1;
    }
    prof.pool_n = 0; // the next step reuses them
#endif
    if (step < prof.last && !run_ends) return 0;
    int rc = profile_write();
    free(prof.ev);
    prof.ev = NULL, prof.n = prof.cap = 0;
#ifdef __CUDACC__
    for (int i = 0; i < prof.pool_cap; i++) prof__cuda(cudaEventDestroy(prof.pool[i]), "cudaEventDestroy");
    prof__cuda(cudaEventDestroy(prof.ref), "cudaEventDestroy");
    free(prof.pool);
    prof.pool = NULL, prof.pool_cap = 0, prof.ref = NULL;
#endif
    prof.path[0] = 0; // (one trace per run)
    prof.recording = 0, prof.on = prof.nvtx;
    return rc;
}

#endif // PROFILE_H
