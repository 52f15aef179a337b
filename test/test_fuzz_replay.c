// Replays the fuzz targets of dev/fuzz/ (linked in, built with -DFUZZ_REPLAY)
// over every committed input: the seed corpus dev/fuzz/corpus/<target>/ and the
// regression inputs test/fuzz_regress/<target>/ (crashes that fuzzing found,
// minimised, kept after the fix). One ok/FAIL line per target and directory.
// Under `make test SANITIZE=1` this runs with ASan and UBSan, as the fuzzers do.
//
//   test/test_fuzz_replay                 every target, the committed inputs
//   test/test_fuzz_replay TARGET PATH...  one target over the given files or directories
//                                         (e.g. test/fuzz_regress/known/model, open bugs)
// A target that crashes or exits takes the program down: the input being run is named.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/stat.h>
#include "test_common.h"

// the Makefile passes its FUZZ_TARGETS list as -D'FUZZ_LIST(X)=X(json) X(cli) ...'
#ifndef FUZZ_LIST
#error "build with make (it defines FUZZ_LIST from FUZZ_TARGETS and links dev/fuzz/fuzz_*.c)"
#endif
#define DECLARE(name) int fuzz_##name(const uint8_t *data, size_t size);
FUZZ_LIST(DECLARE)
#define ENTRY(name) {#name, fuzz_##name},
static const struct { const char *name; int (*fn)(const uint8_t *, size_t); } targets[] = {FUZZ_LIST(ENTRY)};
#define N_TARGETS ((int)(sizeof targets / sizeof targets[0]))

// sanitizer hooks, present only in sanitized builds
void __sanitizer_set_report_fd(void *fd) __attribute__((weak));
void __sanitizer_set_death_callback(void (*cb)(void)) __attribute__((weak));

static int out_fd = -1;           // the real stderr, kept while the targets' own messages go to /dev/null
static char current[1024];        // the input being run
static void say_current(void) {
    if (out_fd < 0 || !current[0]) return;
    const char *pre = "\nFAIL fuzz replay: crashed or exited on input ";
    if (write(out_fd, pre, strlen(pre)) < 0 || write(out_fd, current, strlen(current)) < 0 || write(out_fd, "\n", 1) < 0) return;
}
static void on_signal(int sig) {
    say_current();
    signal(sig, SIG_DFL);
    raise(sig);
}

// the targets print an error for nearly every input: send their stdout/stderr to /dev/null
static int saved_out = -1, saved_err = -1;
static void quiet(int on) {
    fflush(stdout);
    fflush(stderr);
    if (on) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        dup2(null, 2);
        close(null);
    } else {
        dup2(saved_out, 1);
        dup2(saved_err, 2);
    }
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

// runs fn on path (a file, or every file of a directory, in name order);
// returns the number of inputs run, -1 if path does not exist
static int run_path(int (*fn)(const uint8_t *, size_t), const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) return -1;
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        if (!d) return -1;
        char **names = NULL;
        int n = 0, cap = 0, total = 0;
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.') continue; // also skips README-like dotfiles
            if (n == cap) names = (char **)realloc(names, (size_t)(cap = cap ? 2 * cap : 64) * sizeof *names);
            names[n++] = strdup(e->d_name);
        }
        closedir(d);
        qsort(names, (size_t)n, sizeof *names, cmp_str);
        for (int i = 0; i < n; i++) {
            char sub[2048];
            snprintf(sub, sizeof sub, "%s/%s", path, names[i]);
            int k = run_path(fn, sub);
            if (k > 0) total += k;
            free(names[i]);
        }
        free(names);
        return total;
    }
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    size_t cap = 4096, n = 0;
    uint8_t *buf = (uint8_t *)malloc(cap);
    for (;;) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        buf = (uint8_t *)realloc(buf, cap *= 2);
    }
    fclose(f);
    // an exact-size copy, so that ASan catches a read one byte past the input
    uint8_t *exact = (uint8_t *)malloc(n ? n : 1);
    memcpy(exact, buf, n);
    free(buf);
    snprintf(current, sizeof current, "%s", path);
    fn(exact, n);
    current[0] = 0;
    free(exact);
    return 1;
}

static int find_target(const char *name) {
    for (int i = 0; i < N_TARGETS; i++)
        if (strcmp(targets[i].name, name) == 0) return i;
    return -1;
}

int main(int argc, char **argv) {
    saved_out = dup(1);
    saved_err = dup(2);
    out_fd = saved_err;
    if (__sanitizer_set_report_fd) __sanitizer_set_report_fd((void *)(intptr_t)saved_err);
    if (__sanitizer_set_death_callback) __sanitizer_set_death_callback(say_current);
    signal(SIGSEGV, on_signal);
    signal(SIGBUS, on_signal);
    signal(SIGFPE, on_signal);
    signal(SIGILL, on_signal);
    signal(SIGABRT, on_signal);
    atexit(say_current); // a target that calls exit() (it must not) is named too

    if (argc >= 2) { // one target over the given paths
        int t = find_target(argv[1]);
        if (t < 0) { fprintf(stderr, "unknown target '%s'\n", argv[1]); return 2; }
        for (int i = 2; i < argc; i++) {
            quiet(1);
            int n = run_path(targets[t].fn, argv[i]);
            quiet(0);
            char what[1200];
            snprintf(what, sizeof what, "fuzz replay %s: %s (%d inputs)", targets[t].name, argv[i], n < 0 ? 0 : n);
            CHECK(n >= 0, what, "cannot read it");
        }
        return test_summary();
    }
    for (int t = 0; t < N_TARGETS; t++) {
        char dir[512], what[600];
        // the seed corpus must exist and not be empty
        snprintf(dir, sizeof dir, "dev/fuzz/corpus/%s", targets[t].name);
        quiet(1);
        int n = run_path(targets[t].fn, dir);
        quiet(0);
        snprintf(what, sizeof what, "fuzz replay %s: seed corpus %s (%d inputs)", targets[t].name, dir, n < 0 ? 0 : n);
        CHECK(n > 0, what, "missing or empty (run from the repo root)");
        // the regressions, if this target has any
        snprintf(dir, sizeof dir, "test/fuzz_regress/%s", targets[t].name);
        quiet(1);
        n = run_path(targets[t].fn, dir);
        quiet(0);
        if (n >= 0) {
            snprintf(what, sizeof what, "fuzz replay %s: regressions %s (%d inputs)", targets[t].name, dir, n);
            CHECK(1, what, "");
        }
    }
    return test_summary();
}
