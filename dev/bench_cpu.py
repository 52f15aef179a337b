#!/usr/bin/env python3
"""CPU step time: train_llama2 against PyTorch (transformers + peft) in the same run.

  make train_llama2 && python3 dev/bench_cpu.py [--threads 2] [--steps 6]

Same model shape (stories15M: dim 288, 6 layers, 6 heads, hidden 768, vocab 32000),
same batch (4 x 256 tokens, every position a label), LoRA r=8 on q_proj,v_proj,
AdamW, fp32, the same number of threads. Both start from one random checkpoint
written here; the step time is the median over the steps after the first.
A benchmark, not a test: needs torch, transformers and peft.
"""
import argparse, json, os, random, statistics, subprocess, tempfile, time
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from peft import LoraConfig, get_peft_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPE = dict(hidden_size=288, intermediate_size=768, num_hidden_layers=6, num_attention_heads=6,
             num_key_value_heads=6, vocab_size=32000, max_position_embeddings=1024, rms_norm_eps=1e-5)
B, T, R = 4, 256, 8


def bench_torch(model_dir, steps, threads):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=R, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                                             task_type="CAUSAL_LM"))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    ids = torch.randint(3, 512, (B, T))
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        opt.step()
        opt.zero_grad()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times[1:]), model.base_model.model.model.config._attn_implementation


def bench_ours(model_dir, data, steps, threads):
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "m.jsonl")
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        subprocess.run([os.path.join(ROOT, "train_llama2"), "--model", model_dir, "--data", data, "--max_seq_len", str(T),
                        "--batch_size", str(B), "--max_steps", str(steps), "--lora_r", str(R), "--lora_dropout", "0",
                        "--lora_target_modules", "q_proj,v_proj", "--output_dir", os.path.join(tmp, "out"),
                        "--metrics_file", metrics], check=True, env=env, stdout=subprocess.DEVNULL)
        ms = [json.loads(l)["ms"] for l in open(metrics)]
    return statistics.median(ms[1:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        LlamaForCausalLM(LlamaConfig(**SHAPE)).save_pretrained(tmp)
        with open(os.path.join(ROOT, "test/fixtures/tiny_gqa/tokenizer.model"), "rb") as f:
            open(os.path.join(tmp, "tokenizer.model"), "wb").write(f.read())
        # rows long enough that every one is truncated to T tokens
        rng = random.Random(0)
        words = "the a cat dog sat on mat ran far away 12 345 quickly slowly red blue tree house river".split()
        data = os.path.join(tmp, "data.jsonl")
        with open(data, "w") as f:
            for _ in range(64):
                f.write(json.dumps({"text": " ".join(rng.choice(words) for _ in range(400))}) + "\n")
        ours = bench_ours(tmp, data, args.steps, args.threads)
        ref, attn = bench_torch(tmp, args.steps, args.threads)
    print(f"| threads | train_llama2 ms/step | PyTorch {torch.__version__} ({attn}) ms/step | ratio |")
    print(f"| {args.threads} | {ours:.0f} | {ref:.0f} | {ref / ours:.2f}x |")


if __name__ == "__main__":
    main()
