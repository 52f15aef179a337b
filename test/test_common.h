// Tiny test harness shared by the C tests. Every check prints one line:
//   "ok <what>" or "FAIL <what>: <detail>", and "SKIP <what>: <why>".
// test/run.sh counts these lines over all test programs and prints the
// closing "N passed, N failed" line; each program also exits non-zero on failure.
#ifndef TEST_COMMON_H
#define TEST_COMMON_H
#include <stdio.h>
#include <stdarg.h>
#include <math.h>
#include <stdlib.h>

static int test_passed = 0, test_failed = 0;

// with TEST_VERBOSE=1 in the environment, passing checks print their detail too
// (the measured error against its tolerance)
static void test_check(int cond, const char *what, const char *fmt, ...) {
    static int verbose = -1;
    if (verbose < 0) verbose = getenv("TEST_VERBOSE") != NULL;
    printf("%s %s", cond ? "ok" : "FAIL", what);
    if (!cond || verbose) {
        va_list ap; va_start(ap, fmt);
        printf(": ");
        vprintf(fmt, ap);
        va_end(ap);
    }
    printf("\n");
    if (cond) test_passed++; else test_failed++;
}
#define CHECK(cond, what, ...) test_check((cond), (what), __VA_ARGS__)

static void test_skip(const char *what, const char *why) { printf("SKIP %s: %s\n", what, why); }

static int test_summary(void) {
    fflush(stdout);
    return test_failed ? 1 : 0;
}
#endif
