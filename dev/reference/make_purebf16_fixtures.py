#!/usr/bin/env python3
# Regenerate (from the repository root, after make_fixtures.py, no network needed):
#
#     python3 dev/reference/make_purebf16_fixtures.py
#
# Writes test/fixtures/tiny_gqa/ref/purebf16.json and purebf16.safetensors: llama-recipes'
# pure bf16 full fine-tuning (finetuning.py with --pure_bf16: model.to(torch.bfloat16), then
# AnyPrecisionAdamW from src/llama_recipes/policies/anyprecision_optimizer.py, no gradient
# clipping, its default) on tiny_gqa, 10 steps with make_fixtures.py's data, batches (2
# micro-batches of 2 rows), loss and cosine schedule after 3 warmup steps; Kahan summation
# off and on. purebf16.json holds each run's settings and per-step loss, lr and gradient
# norm; purebf16.safetensors each run's final weights (bf16, stored as F32) as
# "<run>.final.<name>". test/test_llama2.c trains the same runs and compares.
#
# What torch does here, the trainers' pure bf16 follows in storage, not in every sum:
# - the weights, the gradients (each micro-batch's rounded to bf16, then added to the
#   step's in bf16: .grad's accumulation) and the optimizer's moments are bf16;
# - torch's activations are bf16 too, each matmul rounded to bf16 (HF's RMSNorm and the
#   softmax compute in fp32 and round); the trainers compute in fp32 from the bf16 weights.
#   That is what the test's tolerances are for.
# - transformers' own code runs here, not make_fixtures.py's float64 patches (its import
#   applies them: the originals are put back below).
# - model.to(torch.bfloat16) rounds RoPE's inv_freq buffer to bf16 as well; the trainers
#   compute RoPE from fp32 inverse frequencies (transformers' at load), so it is put back in
#   fp32 here: at position 23 the bf16 buffer moves an angle by up to 4e-3 rad, an error of
#   llama-recipes' recipe, not of pure bf16.
# - the loss is make_fixtures.py's: float64 log-softmax of the bf16 logits, each micro-batch's
#   sum over the step's label count, backward per micro-batch.
# - fp32 square roots IEEE (make_optim_fixtures.py's IeeeSqrt), single thread.
import os
import sys

os.environ["TORCHDYNAMO_DISABLE"] = "1"  # before torch is imported (make_optim_fixtures.py)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from transformers.models.llama import modeling_llama as ml

ORIGINAL = (ml.LlamaRMSNorm.forward, ml.LlamaRotaryEmbedding.forward, ml.eager_attention_forward)
import make_fixtures as mf  # noqa: E402 (patches transformers on import: undone here)

ml.LlamaRMSNorm.forward, ml.LlamaRotaryEmbedding.forward, ml.eager_attention_forward = ORIGINAL
import json  # noqa: E402

import sentencepiece as spm  # noqa: E402
import torch  # noqa: E402
from llama_recipes.policies.anyprecision_optimizer import AnyPrecisionAdamW  # noqa: E402
from make_optim_fixtures import IeeeSqrt  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import get_cosine_schedule_with_warmup  # noqa: E402

MODEL = "tiny_gqa"
RUNS = [("plain", 0), ("kahan", 1)]


def hparams(kahan):
    return {"optimizer": "anyprecision", "pure_bf16": 1, "kahan_summation": kahan, "lr": 2e-3, "weight_decay": 0.1,
            "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "warmup_steps": mf.WARMUP, "lr_scheduler": "cosine",
            "grad_clip": 0.0, "max_steps": mf.STEPS}


def bf16_model(folder):
    model = mf.load_base(folder, torch.float32)
    assert all(torch.equal(p, p.bfloat16().float()) for p in model.parameters())  # tiny_gqa's weights are bf16 values
    rope = model.model.rotary_emb
    inv_freq = rope.inv_freq.clone()
    assert inv_freq.dtype == torch.float32
    model.to(torch.bfloat16)
    rope.inv_freq = inv_freq  # (see the opening comment)
    assert rope.inv_freq.dtype == torch.float32 and ml.eager_attention_forward is ORIGINAL[2]
    return model


def train(model, named, rows, hp):
    params = [p for _, p in named]
    opt = AnyPrecisionAdamW(params, lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"],
                            weight_decay=hp["weight_decay"], use_kahan_summation=bool(hp["kahan_summation"]))
    sched = get_cosine_schedule_with_warmup(opt, num_warmup_steps=hp["warmup_steps"], num_training_steps=hp["max_steps"])
    steps = []
    for s in range(hp["max_steps"]):
        loss = mf.step_grads(model, params, mf.step_microbatches(rows, s))
        assert all(p.grad.dtype == torch.bfloat16 for p in params)
        norm = sum(float((p.grad.double() ** 2).sum()) for p in params) ** 0.5  # of the bf16 gradients, in double
        lr = float(opt.param_groups[0]["lr"])
        with IeeeSqrt():
            opt.step()
        sched.step()
        steps.append({"step": s + 1, "loss": loss, "lr": lr, "grad_norm": norm})
        print(f"    step {s + 1:2d} loss {loss:.10f} lr {lr:.6e} grad_norm {norm:.6f}")
    return steps


def main():
    os.chdir(mf.ROOT)
    torch.set_num_threads(1)
    folder = f"{mf.FIX}/{MODEL}"
    sp = spm.SentencePieceProcessor(model_file=folder + "/tokenizer.model")
    rows = mf.tokenize_rows(sp)
    out = {"model": MODEL, "runs": []}
    final = {}
    for name, kahan in RUNS:
        print(f"== {name}")
        model = bf16_model(folder)
        model.train()
        named = list(mf.base_state(model).items())
        start = {k: p.detach().clone() for k, p in named}
        hp = hparams(kahan)
        steps = train(model, named, rows, hp)
        moved = sum(int((p.detach() != start[k]).sum()) for k, p in named)
        total = sum(p.numel() for _, p in named)
        print(f"  {moved} of {total} weights moved")
        assert moved > total // 2
        for k, p in named:
            assert p.dtype == torch.bfloat16
            final[f"{name}.final.{k}"] = p.detach().to(torch.float32).contiguous()
        out["runs"].append({"name": name, "mode": "full", "hparams": hp, "steps": steps})
    save_file(dict(sorted(final.items())), f"{folder}/ref/purebf16.safetensors")
    with open(f"{folder}/ref/purebf16.json", "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print("done")


if __name__ == "__main__":
    main()
