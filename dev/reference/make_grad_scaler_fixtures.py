#!/usr/bin/env python3
# Regenerate (from the repository root, after make_fixtures.py):
#
#     python3 dev/reference/make_grad_scaler_fixtures.py
#
# Reference values for dynamic loss scaling (trainer/schedule.h's LossScale, --loss_scale
# dynamic) from torch.amp.GradScaler("cpu") with its defaults (init_scale 2^16,
# growth_factor 2, backoff_factor 0.5, growth_interval 2000). Writes
# test/fixtures/grad_scaler/:
#
# - expected.json "sequence": GradScaler driven alone for SEQ_STEPS steps with
#   an inf gradient at the steps in SEQ_INF: the steps after which the scale
#   changed, and to what (test_trainer checks the scale after every step).
# - expected.json "train" and final.safetensors: tiny_gqa's LoRA run of
#   make_fixtures.py (float64, its hyperparameters, 10 steps) in the plain torch
#   loop with a GradScaler: scaler.scale(loss).backward(), unscale_, clip,
#   scaler.step, scaler.update, scheduler.step() every iteration. The gradients
#   of TRAIN_INF's steps are set to NaN (the trainer's LLAMA2TUNE_FAULT=nan), so
#   those steps are skipped: per step the loss, lr, scale, whether it was
#   skipped, the norm of the others; the final adapter (test_llama2 checks them).
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # its float64 patches of transformers, data and batches
import sentencepiece as spm
from peft import PeftModel
from safetensors.torch import save_file
from transformers import get_cosine_schedule_with_warmup

OUT = "test/fixtures/grad_scaler"
SEQ_STEPS = 6600
# 1-based: two backoffs, a growth after 2000 clean steps (at 2002), a backoff that
# resets the count (2500), another one step before it would have grown (4499)
SEQ_INF = [1, 2, 2500, 4499]
TRAIN_MODEL = "tiny_gqa"
TRAIN_INF = [3, 4]  # 1-based, as LLAMA2TUNE_FAULT=nan:3-4


def scale_sequence():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.0)
    scaler = torch.amp.GradScaler("cpu")
    assert scaler.get_scale() == 65536.0 and scaler.get_growth_interval() == 2000
    changes, prev = [], scaler.get_scale()
    for s in range(1, SEQ_STEPS + 1):
        p.grad = None
        scaler.scale(p.sum()).backward()  # (the scaler wants its scale used in the iteration)
        if s in SEQ_INF:
            p.grad.fill_(float("inf"))
        scaler.step(opt)
        scaler.update()
        if scaler.get_scale() != prev:
            prev = scaler.get_scale()
            changes.append([s, prev])
    print("sequence: scale changes", changes)
    return {"steps": SEQ_STEPS, "inf_steps": SEQ_INF, "init_scale": 65536.0, "changes": changes}


def train_run():
    folder = f"{mf.FIX}/{TRAIN_MODEL}"
    sp = spm.SentencePieceProcessor(model_file=folder + "/tokenizer.model")
    rows = mf.tokenize_rows(sp)
    hp = json.load(open(folder + "/ref/expected.json"))["train"]["lora"]
    lm = PeftModel.from_pretrained(mf.load_base(folder, torch.float64), folder + "/peft_init", is_trainable=True).double()
    lm.train()
    named = [(n.replace(".default.", "."), p) for n, p in lm.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    opt = torch.optim.AdamW(params, lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"],
                            weight_decay=hp["weight_decay"])
    sched = get_cosine_schedule_with_warmup(opt, num_warmup_steps=hp["warmup_steps"], num_training_steps=hp["max_steps"])
    scaler = torch.amp.GradScaler("cpu")
    steps = []
    for s in range(hp["max_steps"]):
        for p in params:
            p.grad = None
        mbs = mf.step_microbatches(rows, s)
        count = sum(int((t != mf.IGNORE).sum()) for _, t in mbs)
        total = 0.0
        for tok, tgt in mbs:
            loss_sum, _ = mf.loss_sum_count(mf.forward_logits(lm, tok), tgt)
            scaler.scale(loss_sum / count).backward()
            total += loss_sum.item()
        if s + 1 in TRAIN_INF:
            for p in params:
                p.grad.fill_(float("nan"))
        scale = scaler.get_scale()
        scaler.unscale_(opt)
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm=hp["grad_clip"]).item()
        lr = opt.param_groups[0]["lr"]
        t_before = opt.state[params[0]].get("step", torch.tensor(0.0)).item() if params[0] in opt.state else 0
        scaler.step(opt)
        scaler.update()
        sched.step()  # every iteration, skipped or not (the plain torch loop)
        t_after = opt.state[params[0]]["step"].item() if params[0] in opt.state else 0
        skipped = t_after == t_before
        assert skipped == (s + 1 in TRAIN_INF), (s + 1, t_before, t_after)
        rec = {"step": s + 1, "loss": total / count, "lr": lr, "loss_scale": scale, "skipped": int(skipped)}
        if not skipped:
            rec["grad_norm"] = norm
        steps.append(rec)
        print(f"    step {s + 1:2d} loss {total / count:.10f} lr {lr:.6e} scale {scale:g}"
              f"{'  skipped' if skipped else f'  grad_norm {norm:.6f}'}")
    final = {k: p.detach().to(torch.float32).contiguous() for k, p in named}
    return {"model": TRAIN_MODEL, "inf_steps": TRAIN_INF, "hparams": hp, "steps": steps,
            "scale_after": scaler.get_scale()}, final


def main():
    os.chdir(mf.ROOT)
    os.makedirs(OUT, exist_ok=True)
    out = {"sequence": scale_sequence()}
    out["train"], final = train_run()
    out["versions"] = {"torch": torch.__version__}
    save_file(dict(sorted(final.items())), OUT + "/final.safetensors")
    with open(OUT + "/expected.json", "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
