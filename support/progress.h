// Progress of a long phase (loading the weights, tokenizing the data). On a
// terminal: one bar, redrawn in place, with the rate and the time left.
// Otherwise (a log file, a pipe): a plain line at each quarter and one at the
// end, so that a log stays a list of lines. A phase that is over within
// quiet_ms (a second) prints nothing at all.
#ifndef PROGRESS_H
#define PROGRESS_H
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "utils.h"

typedef struct {
    FILE *out;
    const char *what, *unit; // "tokenizing data.jsonl", "MB"
    double total;            // in units
    double t0, drawn;        // ms: the start, the last redraw
    double quiet_ms;         // nothing appears before this
    int tty;                 // redraw in place
    int quarters;            // plain lines: the quarters reported so far
    int shown;               // anything printed yet
} Progress;

static Progress progress_begin(FILE *out, const char *what, double total, const char *unit) {
    Progress p = {out, what, unit, total, now_ms(), 0, 1000, isatty(fileno(out)), 0, 0};
    return p;
}

// done of total units so far
static void progress_update(Progress *p, double done) {
    double t = now_ms(), s = (t - p->t0) / 1e3, frac = p->total > 0 && done < p->total ? done / p->total : 1;
    if (t - p->t0 < p->quiet_ms) return;
    double rate = s > 0 ? done / s : 0, left = rate > 0 ? (p->total - done) / rate : 0;
    if (p->tty) {
        if (p->shown && t - p->drawn < 100) return; // ten redraws a second at most
        char bar[31];
        int n = (int)(frac * 30);
        memset(bar, '#', n), memset(bar + n, '.', 30 - n), bar[30] = 0;
        // \033[K clears what is left of a longer previous line
        fprintf(p->out, "\r%s [%s] %3.0f%% %.1f/%.1f %s, %.1f %s/s, %dm%02ds left\033[K", p->what, bar, 100 * frac, done,
                p->total, p->unit, rate, p->unit, (int)left / 60, (int)left % 60);
    } else {
        int q = (int)(frac * 4);
        if (q <= p->quarters || q == 4) return; // the end has its own line
        p->quarters = q;
        fprintf(p->out, "%s: %.0f%% (%.1f of %.1f %s, %.1f %s/s, %.0f s left)\n", p->what, 100 * frac, done, p->total,
                p->unit, rate, p->unit, left);
    }
    p->shown = 1, p->drawn = t;
    fflush(p->out);
}

// the phase is over, having done done units: the bar's last state, or a closing line
static void progress_end(Progress *p, double done) {
    double s = (now_ms() - p->t0) / 1e3;
    if (!p->shown && s * 1e3 < p->quiet_ms) return;
    fprintf(p->out, "%s%s: %.1f %s in %.1f s (%.1f %s/s)%s\n", p->tty ? "\r" : "", p->what, done, p->unit, s,
            s > 0 ? done / s : 0, p->unit, p->tty ? "\033[K" : "");
    fflush(p->out);
}
#endif
