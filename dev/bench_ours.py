#!/usr/bin/env python3
"""train_llama2cu's side of the GPU benchmarks (docs/performance.md): LoRA steps of a randomly initialised
model (--random_init: config.json and tokenizer.model, no weights), read from --metrics_file.

  python3 dev/bench_ours.py --model DIR [--bin ./train_llama2cu] [--lora qv8,all16] [--seq 512,2048,4096]
                            [--batch N] [--hf_json FILE] [--long]

- The batch: the largest whose memory plan fits (--dry_run, which draws no weights and
  touches no GPU, so the search costs a fraction of a second a try) in --gpu_mib less
  --reserve_mib (the CUDA context, cuBLAS's workspace, the upload's staging buffer); a run
  that still runs out of memory is retried an eighth smaller. --batch N fixes it; with
  --hf_json (dev/bench_hf.py's rows) each setting also runs at transformers + peft's batch,
  the issue's equal settings, when that fits.
- The data: packed rows of exactly --seq tokens of generated text, so every step has
  batch x seq tokens, as dev/bench_hf.py's synthetic ones.
- A row: the steps after --warmup; tokens/s = their tokens over their time, TFLOP/s and MFU
  from the trainer's own tflops (trainer/plan.h's formula, checked here against
  dev/bench_common.py's, which dev/bench_hf.py uses), GPU used = the metrics' mem_mb
  (cudaMemGetInfo's view), allocated = the plan's device memory.
- --long: one sequence per step, the longest --seq whose plan fits, whole (the head in
  pieces of --chunk), the same with --activation_checkpointing, and in chunks of --chunk
  with --chunk_memory recompute; each confirmed by a run of two steps, the second timed (as
  dev/bench_hf.py --long).

BIN=./train_llama2 (or --bin) runs all of it on the CPU trainer with --gpu_mib standing for
the memory, to try the script without a GPU; its numbers mean nothing then.
"""
import argparse, json, os, random, re, shutil, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import LORA, flops_per_sequence, peak_tflops, header, emit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def gpu_query(field):
    """nvidia-smi's value of a --query-gpu field for GPU 0, or None without one."""
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.splitlines()[0].strip() if out.returncode == 0 and out.stdout.strip() else None


def write_data(path, tokens):
    """Text records of common words, about `tokens` tokens with the fixture tokenizers (2.4 a word)."""
    rng = random.Random(0)
    words = "the a cat dog sat on mat ran far away 12 345 quickly slowly red blue tree house river".split()
    with open(path, "w") as f:
        for _ in range(tokens // 4000 + 1):
            f.write(json.dumps({"text": " ".join(rng.choice(words) for _ in range(1700))}) + "\n")


class Trainer:
    """Runs the trainer binary on the benchmark's model and data, in a scratch folder."""

    def __init__(self, args, work):
        self.args, self.work = args, work
        self.cfg = json.load(open(os.path.join(args.model, "config.json")))

    def cmd(self, lora, T, B, extra):
        lc = LORA[lora]
        a = self.args
        return [a.bin, "--model", a.model, "--random_init", "--data", a.data, "--data_format", "text", "--batching", "packing",
                "--data_cache_dir", self.work, "--max_seq_len", str(T), "--batch_size", str(B), "--lora_r", str(lc["r"]),
                "--lora_alpha", str(lc["alpha"]), "--lora_dropout", str(lc["dropout"]), "--lora_target_modules", lc["ours"],
                "--lr", "1e-4", "--seed", "0", "--output_dir", os.path.join(self.work, "out")] + extra

    def plan(self, lora, T, B, extra):
        """The dry run's memory plan: MiB the device needs (weights, trainable, activations, carry)."""
        p = subprocess.run(self.cmd(lora, T, B, extra + ["--dry_run"]), capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            sys.exit(f"error: the dry run failed (exit {p.returncode}): {' '.join(self.cmd(lora, T, B, extra))}\n{p.stderr[-2000:]}")
        gpu = p.stdout.split("host memory plan")[0] # the GPU's plan (the host's follows it)
        lines = dict((m.group(1), float(m.group(2))) for m in re.finditer(r"^  (\S.*?)\s+([\d.]+) MiB", gpu, re.M))
        t = re.search(r"T <= (\d+)", p.stdout)
        if not t or int(t.group(1)) != T:
            sys.exit(f"error: the dry run trains rows of {t and t.group(1)} tokens, not {T}: --data has too few tokens")
        return lines["total"]

    def fits(self, lora, T, B, extra):
        return self.plan(lora, T, B, extra) <= self.args.gpu_mib - self.args.reserve_mib

    def run(self, lora, T, B, extra, steps):
        """steps steps; the metrics records, or 'oom', or the error's last line."""
        metrics = os.path.join(self.work, "metrics.jsonl")
        if os.path.exists(metrics):
            os.remove(metrics)
        cmd = self.cmd(lora, T, B, extra + ["--max_steps", str(steps), "--metrics_file", metrics,
                                            "--peak_tflops", str(self.args.peak_tflops)])
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=self.args.run_timeout)
        except subprocess.TimeoutExpired:
            return f"timed out after {self.args.run_timeout} s"
        finally:
            shutil.rmtree(os.path.join(self.work, "out"), ignore_errors=True)  # the adapter and checkpoint it saved
        if p.returncode != 0:
            if "out of GPU memory" in p.stderr or "out of memory" in p.stderr:
                return "oom"
            last = [l for l in p.stderr.splitlines() if l.strip()]
            return f"failed (exit {p.returncode}): {last[-1][:200] if last else ''}"
        return [r for r in map(json.loads, open(metrics)) if "loss" in r]

    def row(self, lora, T, B, extra, note, warmup, steps):
        """A result row for batch B (warmup steps, then steps timed), stepping down an eighth while out of memory."""
        for _ in range(4):
            recs = self.run(lora, T, B, extra, warmup + steps)
            if recs != "oom" or B == 1:
                break
            B -= max(1, B // 8)
        base = dict(impl=os.path.basename(self.args.bin), lora=lora, seq=T, batch=B)
        if not isinstance(recs, list):
            return dict(base, note=f"{note}: {'out of memory' if recs == 'oom' else recs}")
        timed = recs[warmup:]
        ms = sum(r["ms"] for r in timed)
        tflops = sum(r["tflops"] * r["ms"] for r in timed) / ms
        # the trainer's FLOPs per step against dev/bench_common.py's (dev/bench_hf.py's MFU): the same formula
        mine, theirs = timed[0]["tflops"] * timed[0]["ms"] * 1e9, B * flops_per_sequence(self.cfg, T, LORA[lora])
        if abs(mine - theirs) > 1e-4 * theirs:
            sys.exit(f"error: the trainer counts {mine:.6g} FLOPs per step, dev/bench_common.py {theirs:.6g}: the MFUs would differ")
        if any(r["loss"] is None or r["loss"] != r["loss"] for r in recs):
            note += "; NaN loss"
        return dict(base, tok_per_s=sum(r["tokens"] for r in timed) / ms * 1e3, tflops=tflops,
                    mfu=tflops / self.args.peak_tflops if self.args.peak_tflops else None,
                    alloc_mib=self.plan(lora, T, B, extra), used_mib=max(r["mem_mb"] for r in recs),
                    note=f"{note}; {len(timed)} timed step{'s' if len(timed) > 1 else ''}")


def largest(ok, lo, cap, step):
    """The largest v <= cap, a multiple of step, with ok(v) (a batch, or a length): doubling from lo,
    then bisecting; 0 when lo is not ok."""
    if not ok(lo):
        return 0
    v = lo
    while 2 * v <= cap and ok(2 * v):
        v *= 2
    hi = min(2 * v, cap + step)  # the first known not ok (or past the cap)
    while hi - v > step:
        mid = (v + hi) // 2 // step * step
        v, hi = (mid, hi) if ok(mid) else (v, mid)
    return v


def hf_batches(path):
    """(lora, seq) -> transformers + peft's batch, from dev/bench_hf.py's --json rows."""
    out = {}
    for r in map(json.loads, open(path)) if path and os.path.exists(path) else []:
        if r.get("batch") and r.get("tok_per_s") and "checkpointing" not in r.get("note", ""):
            out[(r["lora"], r["seq"])] = r["batch"]
    return out


def throughput(t, args):
    hf = hf_batches(args.hf_json)
    for lora in args.lora.split(","):
        for T in map(int, args.seq.split(",")):
            B = args.batch or largest(lambda b: t.fits(lora, T, b, []), 1, args.max_tokens // T, 1)
            note = "batch given" if args.batch else "largest batch by plan"
            if B == 0:
                emit(dict(impl=os.path.basename(args.bin), lora=lora, seq=T, note="batch 1 does not fit"), args.json)
                continue
            emit(t.row(lora, T, B, [], note, args.warmup, args.steps), args.json)
            B_hf = hf.get((lora, T))
            if B_hf and B_hf != B and t.fits(lora, T, B_hf, []):
                emit(t.row(lora, T, B_hf, [], "transformers+peft's batch", args.warmup, args.steps), args.json)


def long_context(t, args):
    C = args.chunk
    # (name, options for length T): whole sequences, with the head in pieces of C so that full-vocabulary
    # logits never bound the length; the same with activation checkpointing, like transformers' side;
    # chunks of C with recompute, the mode
    modes = [(f"whole, head in pieces of {C}", lambda T: ["--num_output_chunks", str(max(1, T // C))]),
             (f"whole, head in pieces of {C}, activation checkpointing",
              lambda T: ["--num_output_chunks", str(max(1, T // C)), "--activation_checkpointing"]),
             (f"chunks of {C}, recompute", lambda T: ["--chunk_size", str(C), "--chunk_memory", "recompute"])]
    for lora in args.lora.split(","):
        for mode, extra in modes:
            # the largest length (a multiple of C) whose plan, with its own options, fits
            T = largest(lambda n: t.fits(lora, n, 1, extra(n)), args.long_from, args.long_max, C)
            note = f"{mode}: longest by plan" + (f" (the cap, --long_max {args.long_max})" if T + C > args.long_max else "")
            if T == 0:
                emit(dict(impl=os.path.basename(args.bin), lora=lora, seq=args.long_from, batch=1, note=f"{mode}: does not fit"),
                     args.json)
                continue
            r = None
            for _ in range(3):  # a length whose plan fits but whose run does not: an eighth shorter
                r = t.row(lora, T, 1, extra(T), note, 1, 1)
                if "out of memory" not in r["note"] or T <= C:
                    break
                T -= max(C, T // 8 // C * C)
            emit(r, args.json)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="folder with config.json and tokenizer.model")
    ap.add_argument("--bin", default=os.environ.get("BIN", os.path.join(ROOT, "train_llama2cu")))
    ap.add_argument("--data", help="JSONL of {\"text\"} records (default: generated in the scratch folder)")
    ap.add_argument("--lora", default="qv8,all16", help="comma-separated: " + ", ".join(LORA))
    ap.add_argument("--seq", default="512,2048,4096")
    ap.add_argument("--batch", type=int, default=0, help="fixed batch (0: the largest whose plan fits)")
    ap.add_argument("--hf_json", help="dev/bench_hf.py's rows: also run at its batches")
    ap.add_argument("--max_tokens", type=int, default=131072, help="the batch search stops at batch x seq = this")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--long", action="store_true", help="the long-context runs instead (batch 1, whole and chunked)")
    ap.add_argument("--long_from", type=int, default=4096)
    ap.add_argument("--long_max", type=int, default=262144)
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--gpu_mib", type=float, default=None, help="memory to fill (default: nvidia-smi's memory.free)")
    ap.add_argument("--reserve_mib", type=float, default=2048, help="of it, what the plan does not count")
    ap.add_argument("--peak_tflops", type=float, default=None, help="for MFU (default: the GPU's datasheet bf16 peak)")
    ap.add_argument("--run_timeout", type=int, default=300, help="seconds for one training run")
    ap.add_argument("--json", help="append the rows as JSON lines to this file")
    args = ap.parse_args()
    if args.long_from % args.chunk:
        sys.exit(f"error: --long_from {args.long_from} is not a multiple of --chunk {args.chunk}")
    if not os.access(args.bin, os.X_OK):
        sys.exit(f"error: {args.bin} is not an executable (make train_llama2cu, or --bin / BIN=)")
    if args.gpu_mib is None:
        free = gpu_query("memory.free")
        if free is None:
            sys.exit("error: nvidia-smi reports no GPU: give --gpu_mib to size the runs without one")
        args.gpu_mib = float(free)
    if args.peak_tflops is None:
        args.peak_tflops = peak_tflops(gpu_query("name") or "")
    work = tempfile.mkdtemp(prefix="bench_ours_")
    try:
        if not args.data:
            args.data = os.path.join(work, "data.jsonl")
            # enough for the longest row, and for a step's rows without repeating (a repeat costs nothing extra)
            write_data(args.data, max(args.long_max if args.long else 0, max(map(int, args.seq.split(",")))) + 100000)
        print(f"<!-- dev/bench_ours.py: {args.bin}, {args.gpu_mib:.0f} MiB less {args.reserve_mib:.0f} reserved, "
              f"peak {args.peak_tflops} TFLOP/s -->")
        print(header(), flush=True)
        (long_context if args.long else throughput)(Trainer(args, work), args)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
