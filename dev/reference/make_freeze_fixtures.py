#!/usr/bin/env python3
# Reference values for --freeze_layers N (full fine-tuning with the embedding and the
# first N decoder layers frozen): transformers' LlamaForCausalLM in float64 (with
# make_fixtures.py's float64 patches), requires_grad=False on those parameters, and 10
# steps of torch.optim.AdamW over the rest, with the data, batches, schedule and
# clipping of make_fixtures.py's full fine-tuning. Writes NEW files only, next to that
# script's: test/fixtures/<model>/ref/freeze.json (the steps) and freeze.safetensors
# (every tensor after the 10 steps: the frozen ones are the base weights unchanged).
#
# Tied embeddings (tiny_tied): lm_head.weight is the embedding's tensor itself, so
# requires_grad=False on it freezes the output projection too; only the final norm
# and the layers from N on train. train_llama2 does the same.
#
# llama-recipes' freeze_transformer_layers(model, N) sets requires_grad=False on the
# first N decoder layers only and leaves the embedding training; --freeze_layers freezes the
# embedding as well, which is what this reference (and the trainer) does.
#
# Run from anywhere: python3 dev/reference/make_freeze_fixtures.py (after make_fixtures.py,
# whose model folders it reads).
import json
import os
import sys

import sentencepiece as spm
import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402  (its import patches transformers' Llama for float64)

# model -> (layers frozen, grad_clip): the clip is chosen so that it cuts some steps, not all,
# and no norm lies within 0.5% of it (make_fixtures.train checks both)
CASES = {"tiny_gqa": (1, 1.9), "tiny_tied": (1, 1.1)}


def frozen(name, n):
    """Is this parameter frozen: the embedding (and a head tied to it: the same tensor) or layers < n?"""
    if name == "model.embed_tokens.weight":
        return True
    return name.startswith("model.layers.") and int(name.split(".")[2]) < n


def main():
    os.chdir(mf.ROOT)
    for name, (n, clip) in CASES.items():
        spec = mf.MODELS[name]
        folder = f"{mf.FIX}/{name}"
        sp = spm.SentencePieceProcessor(model_file=folder + "/tokenizer.model")
        rows = mf.tokenize_rows(sp)
        base = mf.load_base(folder, torch.float64, spec.get("arch", "llama"))
        base.train()
        named = list(mf.base_state(base).items())  # a tied head is the embedding, listed once
        trainable = []
        for k, p in named:
            p.requires_grad_(not frozen(k, n))
            if p.requires_grad:
                trainable.append((k, p))
        if base.config.tie_word_embeddings:
            assert base.lm_head.weight is base.model.embed_tokens.weight and not base.lm_head.weight.requires_grad
        print(f"== {name}: --freeze_layers {n}: {len(trainable)} of {len(named)} tensors train "
              f"({sum(p.numel() for _, p in trainable)} of {sum(p.numel() for _, p in named)} weights)")
        hp = mf.hparams(dict(spec["train"]["full"], grad_clip=clip))
        before = {k: p.detach().clone() for k, p in named}
        steps = mf.train(base, trainable, rows, hp)
        for k, p in named:
            if frozen(k, n):
                assert torch.equal(p.detach(), before[k]), k  # no gradient: AdamW leaves it alone
        out = {"freeze_layers": n, "train": hp, "steps": steps, "trainable": [k for k, _ in trainable],
               "trainable_numel": sum(p.numel() for _, p in trainable)}
        save_file({"final." + k: p.detach().to(torch.float32).contiguous() for k, p in named},
                  folder + "/ref/freeze.safetensors")
        with open(folder + "/ref/freeze.json", "w") as f:
            json.dump(out, f, indent=1)  # floats with repr: full float64
    print("done")


if __name__ == "__main__":
    main()
