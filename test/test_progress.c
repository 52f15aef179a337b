// progress.h: plain lines (no \r, no escape codes) when the output is not a
// terminal, a bar redrawn in place when it is (a pseudo-terminal here), and
// nothing at all for a phase shorter than quiet_ms.
#define _GNU_SOURCE
#include <fcntl.h>
#include "../support/progress.h"
#include "test_common.h"

// runs a phase of 10 steps of 10 MB on out; quiet_ms < 0 keeps the default
static void phase(FILE *out, double quiet_ms) {
    Progress p = progress_begin(out, "reading x", 100, "MB");
    if (quiet_ms >= 0) p.quiet_ms = quiet_ms;
    for (int i = 1; i <= 10; i++) progress_update(&p, 10.0 * i);
    progress_end(&p, 100);
}

static size_t slurp(FILE *f, char *buf, size_t cap) {
    fflush(f);
    rewind(f);
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = 0;
    return n;
}

int main(void) {
    char buf[4096];
    FILE *f = tmpfile();
    phase(f, 0);
    size_t n = slurp(f, buf, sizeof buf);
    int lines = 0, plain = 1;
    for (char *line = buf; *line; lines++) {
        char *nl = strchr(line, '\n');
        plain &= nl != NULL && strncmp(line, "reading x: ", 11) == 0;
        if (!nl) break;
        line = nl + 1;
    }
    // the quarters reached at 30%, 50% and 80%, then the closing line
    CHECK(plain && lines == 4 && !strchr(buf, '\r') && !strchr(buf, '\033') && strstr(buf, "100.0 MB in"),
          "progress: not a terminal: a few plain lines", "%zu bytes, %d lines:\n%s", n, lines, buf);
    fclose(f);

    f = tmpfile();
    phase(f, -1);
    n = slurp(f, buf, sizeof buf);
    CHECK(n == 0, "progress: a phase shorter than a second prints nothing", "%zu bytes: %s", n, buf);
    fclose(f);

    int master = posix_openpt(O_RDWR | O_NOCTTY);
    FILE *tty = NULL;
    if (master >= 0 && grantpt(master) == 0 && unlockpt(master) == 0) tty = fopen(ptsname(master), "w");
    if (!tty) {
        test_skip("progress: on a terminal, a bar redrawn in place", "no pseudo-terminal");
        return test_summary();
    }
    phase(tty, 0);
    fclose(tty);
    fcntl(master, F_SETFL, O_NONBLOCK);
    n = 0;
    for (ssize_t got; n < sizeof buf - 1 && (got = read(master, buf + n, sizeof buf - 1 - n)) > 0;) n += (size_t)got;
    buf[n] = 0;
    CHECK(strstr(buf, "\rreading x [") && strstr(buf, "\rreading x: 100.0 MB in") && strstr(buf, "\033[K"),
          "progress: on a terminal, a bar redrawn in place", "%zu bytes: %s", n, buf);
    close(master);
    return test_summary();
}
