#!/usr/bin/env python3
"""Plot a training run's --metrics_file into one PNG.

    python3 dev/plot_metrics.py out/default/metrics.jsonl            # -> out/default/metrics.png
    python3 dev/plot_metrics.py run/metrics.jsonl -o run/curves.png

Panels: the training loss per step (and its moving average when the run is
long) with the validation loss of each evaluation; the learning rate; the
gradient norm (before clipping); tokens per second; and memory (peak RSS
mem_mb, activations act_mb, KV carry carry_mb). A panel whose fields the file
does not have is left out, saying so.

The file is what train_llama2 writes: one JSON object per line, per step
{"step", "loss", "lr", "grad_norm", "tokens", "ms", "tok_per_s", ...} and per
evaluation {"step", "val_loss", "val_ppl"}. Lines that are not JSON (a run
killed while writing one) are skipped with a warning. A resumed run plots as
one: train_llama2 --resume cuts the file back to the checkpoint's step before
appending. Where steps still go back (runs appended to one file by hand, or by
another tool), a step logged twice is plotted with its later value and a
dashed line marks the place.

Needs matplotlib, a development dependency only (the trainer and the tests
need no Python): pip install matplotlib
"""
import argparse
import json
import math
import os
import sys


def read_metrics(path):
    """Returns (steps, evals, restarts): dicts step -> record (later lines win)
    and the steps at which a line's step was not larger than the one before."""
    steps, evals, restarts = {}, {}, []
    bad = []
    last = None
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().split("\n")
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            step = rec["step"] if isinstance(rec, dict) else None
        except (ValueError, KeyError):
            step = None
        if not isinstance(step, int):
            if i == len(lines):  # no newline after it: a record still being written
                print(f"note: {path}: the last line is incomplete (the run may still be writing it); skipped",
                      file=sys.stderr)
            else:
                bad.append(i)
            continue
        if "loss" in rec:
            if last is not None and step <= last:
                restarts.append(step)
            last = step
            steps[step] = rec
        elif "val_loss" in rec:
            evals[step] = rec
    if bad:
        shown = ", ".join(map(str, bad[:5])) + (" ..." if len(bad) > 5 else "")
        print(f"warning: {path}: {len(bad)} line(s) are not metrics records and were skipped (line {shown})",
              file=sys.stderr)
    return steps, evals, restarts


def series(records, key):
    """(xs, ys) of the records that have a finite number under key."""
    xs, ys = [], []
    for step in sorted(records):
        v = records[step].get(key)
        if isinstance(v, (int, float)) and math.isfinite(v):
            xs.append(step)
            ys.append(v)
    return xs, ys


def moving_average(ys, window):
    out, acc = [], 0.0
    for i, y in enumerate(ys):
        acc += y
        if i >= window:
            acc -= ys[i - window]
        out.append(acc / min(i + 1, window))
    return out


def main():
    ap = argparse.ArgumentParser(description="Plot a train_llama2 --metrics_file into a PNG.")
    ap.add_argument("metrics", help="the JSON-lines metrics file")
    ap.add_argument("-o", "--output", help="the PNG to write (default: the metrics file with .png)")
    args = ap.parse_args()
    out = args.output or os.path.splitext(args.metrics)[0] + ".png"

    try:
        import matplotlib
        matplotlib.use("Agg")  # no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("error: plot_metrics needs matplotlib (a development dependency): pip install matplotlib")

    try:
        steps, evals, restarts = read_metrics(args.metrics)
    except OSError as e:
        sys.exit(f"error: {args.metrics}: cannot read: {e.strerror}")
    if not steps and not evals:
        sys.exit(f"error: {args.metrics}: no metrics records (empty file, or not a train_llama2 --metrics_file)")
    if restarts:
        print(f"note: {args.metrics}: steps went back at step(s) {', '.join(map(str, restarts[:5]))}"
              f"{' ...' if len(restarts) > 5 else ''}; a repeated step is plotted with its later value",
              file=sys.stderr)

    # the panels under the loss: (title, y label, noisy, [(field, label), ...]), kept when
    # some field is there; a noisy one gets a moving average over its faint raw values
    wanted = [
        ("learning rate", "lr", False, [("lr", "lr")]),
        ("gradient norm (before clipping)", "norm", True, [("grad_norm", "grad norm")]),
        ("throughput", "tokens/s", True, [("tok_per_s", "tokens/s")]),
        ("memory", "MiB", False, [("mem_mb", "peak RSS"), ("act_mb", "activations"), ("carry_mb", "KV carry")]),
    ]
    panels = []
    if not steps:
        print(f"note: {args.metrics} has evaluations only: plotting the validation loss alone", file=sys.stderr)
    for title, ylabel, noisy, fields in wanted if steps else []:
        present = [(k, label) for k, label in fields if series(steps, k)[0]]
        if present:
            panels.append((title, ylabel, noisy, present))
        else:
            print(f"note: no {' / '.join(k for k, _ in fields)} in {args.metrics}: the {title} panel is left out",
                  file=sys.stderr)

    rows = 1 + (len(panels) + 1) // 2
    fig = plt.figure(figsize=(12, 3.2 * rows), constrained_layout=True)
    grid = fig.add_gridspec(rows, 2, height_ratios=[1.6] + [1] * (rows - 1))

    def mark_restarts(ax, label=None):
        for i, s in enumerate(restarts):
            ax.axvline(s, color="grey", linestyle="--", linewidth=1, label=label if i == 0 else None)

    def plot_noisy(ax, xs, ys, label, color):
        """every value faintly and their moving average when there are many, else a plain line"""
        window = max(1, len(xs) // 50)
        if window > 1:
            ax.plot(xs, ys, color=color, alpha=0.25, linewidth=0.8, label=label)
            ax.plot(xs, moving_average(ys, window), color=color, linewidth=1.6, label=f"{label}, mean of {window} steps")
        else:
            ax.plot(xs, ys, color=color, linewidth=1.4, label=label)

    # loss: the training loss of every step, and the evaluations
    ax = fig.add_subplot(grid[0, :])
    xs, ys = series(steps, "loss")
    vx, vy = series(evals, "val_loss")
    if xs:
        plot_noisy(ax, xs, ys, "train loss", "tab:blue")
    if vx:
        ax.plot(vx, vy, color="tab:orange", marker="o", markersize=4, linewidth=1.4, label="validation loss")
    losses = [y for y in ys + vy if y > 0]
    if losses and max(losses) / min(losses) > 30:
        ax.set_yscale("log")  # a loss falling by orders of magnitude reads better on a log axis
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.grid(True, which="major", alpha=0.3)
    mark_restarts(ax, "steps went back (appended or resumed run)")
    ax.legend(loc="best")
    summary = []
    if xs:
        summary.append(f"{len(xs)} steps, loss {ys[0]:.4g} \u2192 {ys[-1]:.4g}")
        _, ms = series(steps, "ms")
        if ms:
            summary.append(f"{sum(ms) / 1e3:.1f} s of steps")
    if vx:
        summary.append(f"val loss {vy[0]:.4g} \u2192 {vy[-1]:.4g}" if len(vy) > 1 else f"val loss {vy[0]:.4g}")
    ax.set_title(f"{args.metrics}: " + ", ".join(summary), fontsize=11)

    for i, (title, ylabel, noisy, fields) in enumerate(panels):
        ax = fig.add_subplot(grid[1 + i // 2, i % 2])
        for j, (k, label) in enumerate(fields):
            px, py = series(steps, k)
            color = f"C{j}"
            if noisy:
                plot_noisy(ax, px, py, label, color)
            else:
                ax.plot(px, py, color=color, linewidth=1.2, label=label)
        values = [y for k, _ in fields for y in series(steps, k)[1]]
        if min(values) >= 0:
            # sizes and rates from zero, so their changes are not exaggerated, with room for the legend
            ax.set_ylim(0, 1.3 * max(values) if max(values) > 0 else 1)
        if len(fields) > 1 or noisy:
            ax.legend(loc="upper right", fontsize=8, ncol=len(fields))
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 5))
        mark_restarts(ax)

    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
