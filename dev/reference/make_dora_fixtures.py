#!/usr/bin/env python3
# Regenerate (from the repository root, after make_fixtures.py, no network needed):
#
#     python3 dev/reference/make_dora_fixtures.py
#
# DoRA references (peft's LoraConfig(use_dora=True)) for test/test_llama2.c, in new
# files under test/fixtures/<model>/dora/ for tiny_gqa (all-linear) and tiny_tied
# (q_proj, v_proj; BF16 shards):
#   peft_init/           a DoRA adapter as peft saves it (lora_magnitude_vector next to
#                        lora_A / lora_B), B and the magnitude moved off their init so
#                        that every term of DoRA's output and gradient matters
#   peft_init_dropout/   the same tensors with lora_dropout 0.1 in adapter_config.json
#   expected.json, expected.safetensors: for "dora" (no dropout) and "dora_dropout":
#                        the step-0 loss, the gradient of every A, B and magnitude,
#                        logits (evaluation: no dropout), 10 AdamW steps and the
#                        final tensors, in float64 with make_fixtures.py's patches.
#
# Dropout: peft draws its masks from torch's RNG, which C cannot reproduce, so here
# peft's nn.Dropout is replaced by the mask the trainers draw: lora.h's counter hash
# of (key, position, feature), with the key the training loop sets per micro-batch
# (trainer.h: splitmix64(seed << 32 ^ (step * GA + g)), then per module
# lora_dropout_key). Everything else (where peft applies the mask, its recomputing
# of the base product on the dropped input) is peft's own code.
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402  (its float64 patches come with it)
import sentencepiece as spm  # noqa: E402
from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

SEED = 42  # the trainer's default --seed, which test_llama2.c's fixture runs use
DROPOUT = 0.1
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]  # lora.h's order
M64 = (1 << 64) - 1


def splitmix64(x):
    """support/utils.h's splitmix64 on numpy uint64 arrays (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = np.asarray(x, dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def microbatch_key(step, g):
    return int(splitmix64(np.uint64(((SEED << 32) & M64) ^ (step * mf.GA + g))))


class HashDropout(torch.nn.Module):
    """lora.h's lora_dropout: row b, position p, feature j of a (B, T, in) input is dropped
    when hash_uniform(lora_dropout_key(key, layer, t), (b * T + p) * in + j) < p; survivors
    are scaled by 1 / (1 - p). key: the micro-batch's, set before each forward."""
    key = None

    def __init__(self, layer, t, p):
        super().__init__()
        self.module_key = lambda key: splitmix64(np.uint64(key) ^ np.uint64(layer * len(TARGETS) + t + 1))
        self.p = np.float32(p)

    def forward(self, x):
        Bn, T, n_in = x.shape
        idx = np.arange(Bn * T * n_in, dtype=np.uint64)  # (b * T + p) * in + j, row-major
        u = (splitmix64(self.module_key(HashDropout.key) ^ splitmix64(idx)) >> np.uint64(40)).astype(np.float64) / 16777216.0
        keep = torch.from_numpy(u >= self.p).reshape(Bn, T, n_in)
        return x * keep.to(x.dtype) / (1.0 - float(self.p))


def make_adapter(name, spec, folder):
    """peft's DoRA adapter on the float32 base, B and m moved off their init; saved twice."""
    pm, g = mf.peft_adapter(f"{mf.FIX}/{name}", spec, spec["lora_seed"] + 300, use_dora=True)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_magnitude_vector" in n:  # peft set m = ||W|| per row; s = m / norm != 1 now
                p.mul_(1.0 + 0.2 * torch.randn(p.shape, generator=g, dtype=torch.float32))
    for sub, dropout in (("peft_init", 0.0), ("peft_init_dropout", DROPOUT)):
        mf.save_adapter(pm, f"{folder}/{sub}", lora_dropout=dropout)
        assert json.load(open(f"{folder}/{sub}/adapter_config.json"))["use_dora"] is True
    adapter = load_file(f"{folder}/peft_init/adapter_model.safetensors")
    n_expect = spec["config"]["num_hidden_layers"] * len(spec["lora"]["target_modules"]) * 3
    assert len(adapter) == n_expect and sum("lora_magnitude_vector" in k for k in adapter) == n_expect // 3, sorted(adapter)
    return adapter


def reference(name, spec, folder, sub, adapter, rows, expected, out):
    """float64 peft DoRA from folder/sub: logits, step-0 loss and gradients, 10 AdamW steps."""
    mode = "dora" if sub == "peft_init" else "dora_dropout"
    base64 = mf.load_base(f"{mf.FIX}/{name}", torch.float64, spec.get("arch", "llama"))
    lm = PeftModel.from_pretrained(base64, f"{folder}/{sub}", is_trainable=True)
    lm.double()
    if mode == "dora_dropout":
        n_dropout = 0
        for n, mod in lm.named_modules():
            if hasattr(mod, "lora_dropout") and "default" in mod.lora_dropout:
                assert isinstance(mod.lora_dropout["default"], torch.nn.Dropout), n
                layer = int(n.split(".layers.")[1].split(".")[0])
                mod.lora_dropout["default"] = HashDropout(layer, TARGETS.index(n.split(".")[-1]), DROPOUT)
                n_dropout += 1
        assert n_dropout == len(adapter) // 3
    named = []
    for n, p in lm.named_parameters():
        if p.requires_grad:
            named.append((n.replace("lora_magnitude_vector.default.weight", "lora_magnitude_vector")
                          .replace(".default.", "."), p))
    assert sorted(k for k, _ in named) == sorted(adapter), "peft key mismatch"
    for k, p in named:
        assert torch.equal(p.detach(), adapter[k].double()), k
    mbs0 = mf.step_microbatches(rows, 0)
    lm.eval()  # the logits without dropout: what evaluation computes
    with torch.no_grad():
        expected[mode + ".logits"] = mf.forward_logits(lm, mbs0[0][0])
    lm.train()

    def set_key(step, g):
        HashDropout.key = microbatch_key(step, g)

    params = [p for _, p in named]
    loss0 = mf.step_grads(lm, params, mbs0, lambda g: set_key(0, g))
    for k, p in named:
        assert p.grad is not None and p.grad.abs().max() > 0, k
        expected[mode + ".grad." + k] = p.grad.clone()
    hp = mf.hparams(spec["train"]["lora"])
    print(f"    {mode}: step-0 loss {loss0!r}")
    steps = mf.train(lm, named, rows, hp, set_key)
    assert steps[0]["loss"] == loss0
    for k, p in named:
        expected[mode + ".final." + k] = p.detach().clone()
    out[mode] = {"loss": loss0, "steps": steps}
    out.setdefault("train", {})[mode] = hp


def no_grad_through_norm_check():
    """peft detaches the norm: the magnitude's gradient is sum(dy * (W xd + scale B A xd)) / norm
    exactly, with no term from the norm. Checked on one layer, as the C code computes it."""
    lin = torch.nn.Linear(6, 5, bias=False).double()
    lm = get_peft_model(torch.nn.Sequential(lin), LoraConfig(r=2, lora_alpha=4, target_modules=["0"], use_dora=True))
    lm.double()
    layer = lm.base_model.model[0]
    with torch.no_grad():
        layer.lora_B["default"].weight.normal_()
    x = torch.randn(3, 6, dtype=torch.float64)
    dy = torch.randn(3, 5, dtype=torch.float64)
    (layer(x) * dy).sum().backward()
    W, A, Bm = lin.weight, layer.lora_A["default"].weight, layer.lora_B["default"].weight
    scale = layer.scaling["default"]
    norm = (W + scale * Bm @ A).norm(dim=1)
    pre = x @ W.T + scale * x @ A.T @ Bm.T
    want = (dy * pre).sum(0) / norm
    got = layer.lora_magnitude_vector["default"].weight.grad
    assert torch.allclose(got, want, rtol=1e-12, atol=0), (got, want)


def main():
    os.chdir(mf.ROOT)
    no_grad_through_norm_check()
    sp = spm.SentencePieceProcessor(model_file=f"{mf.FIX}/tiny_gqa/tokenizer.model")
    rows = mf.tokenize_rows(sp)
    for name in ("tiny_gqa", "tiny_tied"):
        spec = mf.MODELS[name]
        print(f"== {name} (DoRA)")
        folder = f"{mf.FIX}/{name}/dora"
        mf.fresh_folder(folder)
        adapter = make_adapter(name, spec, folder)
        expected, out = {}, {}
        for sub in ("peft_init", "peft_init_dropout"):
            reference(name, spec, folder, sub, adapter, rows, expected, out)
        mf.write_expected(folder, expected, out)
    print("done")


if __name__ == "__main__":
    main()
