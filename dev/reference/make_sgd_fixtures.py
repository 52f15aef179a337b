#!/usr/bin/env python3
# Regenerate (from the repository root, after make_fixtures.py, no network needed):
#
#     python3 dev/reference/make_sgd_fixtures.py
#
# Writes test/fixtures/tiny_gqa/ref/sgd.json and sgd.safetensors: 10 steps of
# torch.optim.SGD (dampening 0, weight decay 0.1) in float64 on tiny_gqa, LoRA
# (from its peft_init adapter) and full fine-tuning, each with momentum 0.9, with
# Nesterov momentum 0.9, and without momentum; with make_fixtures.py's data,
# batches, loss, cosine schedule after 3 warmup steps and gradient clipping (the
# clip norm chosen per run so that some steps clip and some do not). sgd.json
# holds each run's settings and per-step loss, lr and gradient norm;
# sgd.safetensors each run's final trainable tensors as "<run>.final.<name>".
# test/test_llama2.c trains the same runs and compares.
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # its float64 patches of transformers apply on import

MODEL = "tiny_gqa"
# (name, mode, lr, momentum, nesterov, grad_clip): SGD needs a larger lr than AdamW to move
# the tiny model in 10 steps; each clip norm sits between the runs' gradient norms
RUNS = [
    ("lora_momentum", "lora", 0.5, 0.9, False, 1.2),
    ("lora_nesterov", "lora", 0.5, 0.9, True, 1.2),
    ("lora_plain", "lora", 0.5, 0.0, False, 1.2),
    ("full_momentum", "full", 0.1, 0.9, False, 3.5),
    ("full_nesterov", "full", 0.1, 0.9, True, 3.5),
    ("full_plain", "full", 0.1, 0.0, False, 3.5),
]


def hparams(lr, momentum, nesterov, grad_clip):
    return {"optimizer": "sgd", "lr": lr, "weight_decay": 0.1, "momentum": momentum, "nesterov": nesterov,
            "warmup_steps": mf.WARMUP, "lr_scheduler": "cosine", "grad_clip": grad_clip, "max_steps": mf.STEPS}


def main():
    mf.optimizer_runs(MODEL, [(name, mode, hparams(lr, momentum, nesterov, clip))
                              for name, mode, lr, momentum, nesterov, clip in RUNS], "sgd")


if __name__ == "__main__":
    main()
