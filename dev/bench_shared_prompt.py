#!/usr/bin/env python3
"""DPO with a pair's prompt run once (--shared_prompt on) against two rows a pair (off): time and
memory of one step at prompts of 256, 1024 and 4096 tokens.

  make train_llama2 && python3 dev/bench_shared_prompt.py [--threads 1] [--prompts 256,1024,4096]

Each pair: a prompt of about P tokens, two responses of about --response tokens. For each prompt
length: whole rows, and chunks of --chunk in recompute mode (long pairs, as SFT's long rows), each
with the prompt once and as two rows. Each configuration runs for one step and for two; the step's
time is the second step: the difference of the two runs' process CPU time (user + sys), which holds
on a machine shared with other work (dev/bench_chunked.md), and the trainer's own wall-clock ms.
tokens/s is the pairs' tokens as two rows (what TRL counts) over that CPU time. Memory: the
trainer's activation and carry accounting (the plan: two rows' either way) and the process's peak
resident memory. A benchmark, not a test: standard library only; dev/bench_chunked.py's random model
(dim 256, 4 layers, vocab 512) under /tmp, LoRA r 8 on q_proj, v_proj, no dropout.
"""
import argparse, json, os, random, re, resource, subprocess, tempfile, time

from bench_chunked import ROOT, SHAPE, write_model

WORDS = "the cat sat on a mat while old men walked to the station and counted coins before trains left".split()


def words(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def write_pairs(path, prompt_words, response_words):
    """two pairs (two steps of one pair) of random text"""
    rng = random.Random(prompt_words)
    with open(path, "w") as f:
        for _ in range(2):
            f.write(json.dumps({"prompt": words(rng, prompt_words), "chosen": " " + words(rng, response_words),
                                "rejected": " " + words(rng, response_words)}) + "\n")


def train(model, data, T, chunk, shared, threads, tmp, steps, dry=False):
    """one run; its process CPU seconds, wall seconds, the last metrics line and its log"""
    metrics = os.path.join(tmp, "m.jsonl")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    before, wall = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    out = subprocess.run([os.path.join(ROOT, "train_llama2"), "--model", model, "--data", data, "--max_seq_len", str(T),
                          "--objective", "dpo", "--shared_prompt", shared, "--batch_size", "1", "--max_steps", str(steps),
                          "--lora_r", "8", "--lora_dropout", "0", "--lora_target_modules", "q_proj,v_proj", "--shuffle", "0",
                          "--chunk_size", str(chunk), "--chunk_memory", "recompute", "--output_dir", os.path.join(tmp, "out"),
                          "--metrics_file", metrics] + (["--dry_run"] if dry else []),
                         check=True, env=env, capture_output=True, text=True)
    wall, after = time.perf_counter() - wall, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    last = None if dry else [json.loads(l) for l in open(metrics)][-1]
    return cpu, wall, last, out.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompts", default="256,1024,4096")
    ap.add_argument("--response", type=int, default=256)
    ap.add_argument("--chunk", type=int, default=512)
    args = ap.parse_args()
    prompts = [int(x) for x in args.prompts.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "model")
        os.mkdir(model)
        room = lambda P: int((P + args.response) * 1.15) + 16  # a pair's longest row, and some: none is cut
        write_model(model, room(max(prompts)))
        # words per token of this text under the tokenizer: from the plan's prompt length
        data = os.path.join(tmp, "calibrate.jsonl")
        n = max(prompts) // 4  # words: at most 2 tokens each, they fit
        write_pairs(data, n, 10)
        plan = train(model, data, room(max(prompts)), 0, "on", args.threads, tmp, 1, dry=True)[3]
        per_word = float(re.search(r"prompts of ([0-9.]+) tokens", plan).group(1)) / n
        print(f"model: {SHAPE}, DPO, LoRA r=8 on q_proj,v_proj, no dropout, one pair a step, {args.threads} threads; "
              f"responses of about {args.response} tokens\n")
        print("| prompt | mode | --shared_prompt | step CPU s | step wall s | tokens/s (CPU) | positions run | "
              "activations MiB | KV+dKV carry MiB | peak RSS MiB |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for P in prompts:
            data, T = os.path.join(tmp, f"pairs{P}.jsonl"), room(P)
            write_pairs(data, round(P / per_word), round(args.response / per_word))
            for chunk in (0, args.chunk):
                for shared in ("on", "off"):
                    cpu1 = train(model, data, T, chunk, shared, args.threads, tmp, 1)[0]
                    cpu2, _, last, log = train(model, data, T, chunk, shared, args.threads, tmp, 2)
                    ran = re.search(r"the pairs' rows ran ([0-9]+) positions, ([0-9]+) as two rows", log)
                    prompt = re.search(r"prompts of ([0-9.]+) tokens", log).group(1)
                    step = cpu2 - cpu1
                    mode = "whole" if chunk == 0 else f"C={chunk} recompute"
                    print(f"| {prompt} | {mode} | {shared} | {step:.2f} | {last['ms'] / 1e3:.2f} | "
                          f"{last['tokens'] / step:.0f} | {int(ran.group(1)) // 2} of {int(ran.group(2)) // 2} | "
                          f"{last['act_mb']:.1f} | {last['carry_mb']:.1f} | {last['mem_mb']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
