// capture.h: what a C test's code printed on stderr, for tests that check a reader's
// messages word for word: fd 2 goes to a temporary file from capture_begin to capture_end.
#ifndef TEST_CAPTURE_H
#define TEST_CAPTURE_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int capture__fd = -1, capture__saved = -1;
static char capture__text[4096];

static void capture_begin(void) {
    char path[] = "/tmp/llama2tune_capture_XXXXXX";
    fflush(stderr);
    capture__fd = mkstemp(path);
    if (capture__fd < 0) { perror("mkstemp"); exit(2); }
    unlink(path); // the file goes when it is closed
    capture__saved = dup(2);
    dup2(capture__fd, 2);
}

// what was printed since capture_begin (its first 4095 bytes), a final newline dropped
// so that it stays on one line in the test's output
static const char *capture_end(void) {
    fflush(stderr);
    dup2(capture__saved, 2);
    close(capture__saved);
    lseek(capture__fd, 0, SEEK_SET);
    ssize_t n = read(capture__fd, capture__text, sizeof capture__text - 1);
    close(capture__fd);
    capture__text[n > 0 ? n : 0] = 0;
    char *nl = strrchr(capture__text, '\n');
    if (nl && nl[1] == 0) *nl = 0;
    return capture__text;
}
#endif
