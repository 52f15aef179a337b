#!/usr/bin/env python3
# Regenerate (from the repository root, after make_fixtures.py, no network needed):
#
#     python3 dev/reference/make_adamw8bit_fixtures.py
#
# Writes test/fixtures/tiny_gqa/ref/adamw8bit.json and adamw8bit.safetensors: 10 steps of
# torchao's AdamW8bit (torchao.optim.AdamW8bit, run eagerly: TORCHDYNAMO_DISABLE=1, as
# make_optim_fixtures.py explains) on tiny_gqa, LoRA (from its peft_init adapter: every
# tensor under 4096 elements, so torchao's fp32 path) and full fine-tuning (wq, wo, the
# MLP's weights, the embedding and lm_head in 8 bits, blocks of 256; wk, wv and the norms
# in fp32), with make_fixtures.py's float64 model, data, batches, loss, cosine schedule after
# 3 warmup steps and gradient clipping. adamw8bit.json holds each run's settings and per-step
# loss, lr and gradient norm; adamw8bit.safetensors each run's final trainable tensors as
# "<run>.final.<name>". test/test_llama2.c trains the same runs and compares.
#
# torchao computes the step in fp32 whatever the parameters' dtype (p.float(), the moments
# lerped in fp32, the 8-bit ones requantized), so the float64 model differs from ours in its
# forward and backward only; where a moment lands near the midpoint of two codes, that
# difference can pick the other code (test_llama2.c says what that costs).
import os
import sys

os.environ["TORCHDYNAMO_DISABLE"] = "1"  # before torch is imported: torchao's step eager
from torchao.optim import AdamW8bit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # its float64 patches of transformers apply on import

MODEL = "tiny_gqa"
# (name, mode, lr, grad_clip): each clip norm sits between the run's gradient norms
RUNS = [("lora", "lora", 5e-3, 1.2), ("full", "full", 2e-3, 3.5)]


def hparams(lr, grad_clip):
    return {"optimizer": "adamw8bit", "lr": lr, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
            "warmup_steps": mf.WARMUP, "lr_scheduler": "cosine", "grad_clip": grad_clip, "max_steps": mf.STEPS}


def adamw8bit(params, hp):
    return AdamW8bit(params, lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"],
                     weight_decay=hp["weight_decay"])


def eight_bit(named):  # the tensors torchao keeps in 8 bits
    return {"eight_bit": [k for k, p in named if p.numel() >= 4096 and p.numel() % 256 == 0]}


def main():
    mf.make_optimizer = adamw8bit  # mf.train builds its optimizer through it
    mf.optimizer_runs(MODEL, [(name, mode, hparams(lr, clip)) for name, mode, lr, clip in RUNS], "adamw8bit", eight_bit)


if __name__ == "__main__":
    main()
