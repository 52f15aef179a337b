#!/usr/bin/env python3
# Reference values for targets that are -100 inside a row, as SFT data has them (the
# prompt unlabelled, then the response; a padded row's tail): transformers'
# LlamaForCausalLM in float64 (with make_fixtures.py's float64 patches), the loss and
# every gradient of one micro-batch of tiny_gqa, for full fine-tuning and for LoRA from
# the adapter peft saved (peft_init). Our trainer runs its output head on the labelled
# positions only; this is what shows that the others still get a zero gradient and the
# labelled ones theirs, against code that computes every position.
#
# Writes NEW files only: test/fixtures/tiny_gqa/ref/mask.safetensors (tokens, targets,
# full.grad.*, lora.grad.*) and mask.json (the losses, per labelled target).
#
# Run from anywhere: python3 dev/reference/make_mask_fixtures.py (after make_fixtures.py,
# whose model folder it reads).
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402  (its import patches transformers' Llama for float64)

MODEL = "tiny_gqa"
B, T = 3, 24


def batch():
    """tokens (B, T) and targets: row 0 a prompt of 9 then a response; row 1 a prompt of 4,
    a response, then padding; row 2 labelled in two runs with a hole between them"""
    g = torch.Generator().manual_seed(7)
    tok = torch.randint(3, 200, (B, T), generator=g)
    tgt = torch.full((B, T), mf.IGNORE, dtype=torch.long)
    for b, runs in enumerate([[(9, T - 1)], [(4, 17)], [(2, 8), (14, T - 1)]]):
        for a, e in runs:
            tgt[b, a:e] = tok[b, a + 1:e + 1]
    tok[1, 18:] = mf.PAD_ID
    return tok, tgt


def main():
    os.chdir(mf.ROOT)
    folder = f"{mf.FIX}/{MODEL}"
    tok, tgt = batch()
    mbs = [(tok, tgt)]
    out = {"labels": int((tgt != mf.IGNORE).sum())}
    expected = {"tokens": tok.to(torch.int32), "targets": tgt.to(torch.int32)}

    out["full_loss"], out["lora_loss"] = mf.full_and_lora_grads(folder, mbs, expected)
    print(f"{MODEL}: {out['labels']} labels of {B * T}; full loss {out['full_loss']!r}, LoRA loss {out['lora_loss']!r}")

    mf.save_ref(folder, "mask", expected, out)


if __name__ == "__main__":
    main()
