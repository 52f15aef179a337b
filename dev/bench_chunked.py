#!/usr/bin/env python3
"""Chunked training: time and memory of one LoRA step at T = 1k, 4k, 16k.

  make train_llama2 && python3 dev/bench_chunked.py [--threads 1] [--lengths 1024,4096,16384]

For each sequence length: whole-sequence training, then chunks of 256 in
"keep" and in "recompute" mode, each without and with --activation_checkpointing
(--no_checkpointing: without only). Each configuration runs twice, for one step and
for two; the step's time is the second step: the difference of the two runs'
process CPU time (user + sys), which holds on a machine shared with other work,
and the trainer's own wall-clock ms for it. --repeat N runs each pair N times and
reports the smallest of each (other work on the machine only ever adds time). Memory: the trainer's accounting of
activations and carry, and the process's peak resident memory. A benchmark,
not a test: standard library only, writes a random checkpoint (vocab 512, so
the test tokenizer fits) under /tmp.
"""
import argparse, json, os, random, resource, struct, subprocess, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPE = dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=4, vocab_size=512)


def write_model(d, max_pos):
    D, H, L, V = SHAPE["hidden_size"], SHAPE["intermediate_size"], SHAPE["num_hidden_layers"], SHAPE["vocab_size"]
    cfg = dict(SHAPE, architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu", rms_norm_eps=1e-5,
               rope_theta=10000.0, max_position_embeddings=max_pos, tie_word_embeddings=False, bos_token_id=1,
               eos_token_id=2)
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=1)
    shapes = [("model.embed_tokens.weight", (V, D)), ("model.norm.weight", (D,)), ("lm_head.weight", (V, D))]
    for i in range(L):
        p = f"model.layers.{i}."
        shapes += [(p + "input_layernorm.weight", (D,)), (p + "post_attention_layernorm.weight", (D,))]
        shapes += [(p + f"self_attn.{n}_proj.weight", (D, D)) for n in "qkvo"]
        shapes += [(p + "mlp.gate_proj.weight", (H, D)), (p + "mlp.up_proj.weight", (H, D)),
                   (p + "mlp.down_proj.weight", (D, H))]
    rng = random.Random(0)
    header, blobs, off = {}, [], 0
    for name, shape in shapes:
        n = 1
        for s in shape:
            n *= s
        vals = [1.0] * n if len(shape) == 1 else [rng.gauss(0, 0.02) for _ in range(n)]
        blob = struct.pack(f"<{n}f", *vals)
        header[name] = dict(dtype="F32", shape=list(shape), data_offsets=[off, off + len(blob)])
        blobs.append(blob)
        off += len(blob)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)
    os.symlink(os.path.join(ROOT, "test/fixtures/tiny_gqa/tokenizer.model"), os.path.join(d, "tokenizer.model"))


def write_data(path, tokens):
    words = "the cat sat on a mat while old men walked to the station and counted coins before trains left".split()
    rng = random.Random(1)
    text = " ".join(rng.choice(words) for _ in range(tokens))  # >= 1 token per word: long enough to truncate
    with open(path, "w") as f:
        f.write(json.dumps({"text": text}) + "\n")


def run(model, data, T, chunk, mode, ckpt, threads, tmp, steps):
    """One training run; returns its process CPU seconds, wall seconds and the last metrics line."""
    metrics = os.path.join(tmp, "m.jsonl")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    before, wall = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run([os.path.join(ROOT, "train_llama2"), "--model", model, "--data", data, "--max_seq_len", str(T),
                    "--batch_size", "1", "--max_steps", str(steps), "--lora_r", "8", "--lora_dropout", "0",
                    "--lora_target_modules", "q_proj,v_proj", "--chunk_size", str(chunk), "--chunk_memory", mode,
                    "--activation_checkpointing=" + str(ckpt), "--output_dir", os.path.join(tmp, "out"),
                    "--metrics_file", metrics],
                   check=True, env=env, capture_output=True, text=True)
    wall, after = time.perf_counter() - wall, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, [json.loads(l) for l in open(metrics)][-1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lengths", default="1024,4096,16384")
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--no_checkpointing", action="store_true", help="skip the --activation_checkpointing runs")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each configuration; the fastest is reported")
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "model")
        os.mkdir(model)
        write_model(model, max(lengths))
        print(f"model: {SHAPE}, LoRA r=8 on q_proj,v_proj, batch 1, {args.threads} threads\n")
        print("| T | mode | step CPU s | step wall s | 2-step run CPU s (wall) | activations MiB | KV+dKV carry MiB "
              "| peak RSS MiB |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for T in lengths:
            data = os.path.join(tmp, f"data{T}.jsonl")
            write_data(data, T)
            for chunk, mode, ckpt in [(c, m, k) for c, m in [(0, "keep"), (args.chunk, "keep"), (args.chunk, "recompute")]
                                      for k in ([0] if args.no_checkpointing else [0, 1])]:
                step_cpu = step_wall = run_cpu = run_wall = float("inf")
                for _ in range(args.repeat):
                    cpu1, _, _ = run(model, data, T, chunk, mode, ckpt, args.threads, tmp, 1)
                    cpu2, wall2, last = run(model, data, T, chunk, mode, ckpt, args.threads, tmp, 2)
                    step_cpu, step_wall = min(step_cpu, cpu2 - cpu1), min(step_wall, last["ms"] / 1e3)
                    run_cpu, run_wall = min(run_cpu, cpu2), min(run_wall, wall2)
                label = ("whole" if chunk == 0 else f"C={chunk} {mode}") + (" + ckpt" if ckpt else "")
                print(f"| {T} | {label} | {step_cpu:.2f} | {step_wall:.2f} | {run_cpu:.1f} ({run_wall:.1f}) "
                      f"| {last['act_mb']:.1f} | {last['carry_mb']:.1f} | {last['mem_mb']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
