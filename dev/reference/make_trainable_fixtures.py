#!/usr/bin/env python3
# Regenerate (from the repository root, after make_fixtures.py, no network needed):
#
#     python3 dev/reference/make_trainable_fixtures.py
#
# --trainable_params embed,norm (LongLoRA's; peft's modules_to_save) references for
# test/test_llama2.c, in test/fixtures/<model>/trainable/ for tiny_gqa (all-linear) and
# tiny_tied (q_proj, v_proj; tied embeddings, so the embedding is the head too):
#   peft_init/           a LoRA adapter as peft saves it with modules_to_save = the
#                        embedding and every RMSNorm (ensure_weight_tying on the tied
#                        model, so that peft's head is the trained embedding), B and the
#                        saved tensors moved off their start so that every term matters
#                        (tied, peft saves lm_head.weight too, equal to the embedding)
#   expected.json, expected.safetensors: for "trainable": the step-0 loss, the gradient
#                        of every A, B, the embedding and each norm, logits, 10 AdamW
#                        steps and the final tensors, in float64 with make_fixtures.py's
#                        patches (eager attention).
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402  (its float64 patches come with it)
from safetensors.torch import load_file  # noqa: E402

# what --trainable_params embed,norm names in peft's terms (lora.h's lora_saved_modules)
MODULES = ["embed_tokens", "input_layernorm", "post_attention_layernorm", "norm"]
# the gradient norm with the embedding in is larger than LoRA's alone: a clip threshold that
# clips some steps only (make_fixtures.train asserts it)
HEAD = "base_model.model.lm_head.weight"
MODE = "trainable"
GRAD_CLIP = {"tiny_gqa": 2.0, "tiny_tied": 2.0}


def make_adapter(name, spec, folder):
    """peft's adapter with modules_to_save on the float32 base, B and the saved tensors off their start"""
    tied = spec["config"].get("tie_word_embeddings", False)
    pm, g = mf.peft_adapter(f"{mf.FIX}/{name}", spec, spec["lora_seed"] + 400, modules_to_save=MODULES,
                            ensure_weight_tying=tied)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "modules_to_save" in n:
                scale = 0.02 if "embed_tokens" in n else 0.1
                p.add_(scale * p.abs().mean() * torch.randn(p.shape, generator=g, dtype=torch.float32))
    mf.save_adapter(pm, f"{folder}/peft_init")
    acfg = json.load(open(f"{folder}/peft_init/adapter_config.json"))
    assert sorted(acfg["modules_to_save"]) == sorted(MODULES), acfg["modules_to_save"]
    adapter = load_file(f"{folder}/peft_init/adapter_model.safetensors")
    L = spec["config"]["num_hidden_layers"]
    saved = [k for k in adapter if "lora_" not in k]
    # the embedding, 2 norms a layer, the final norm; tied, peft saves the head too: the same tensor
    assert len(saved) == 2 + 2 * L + tied, sorted(saved)
    assert "base_model.model.model.embed_tokens.weight" in saved and "base_model.model.model.norm.weight" in saved
    if tied:
        assert torch.equal(adapter.pop(HEAD), adapter["base_model.model.model.embed_tokens.weight"])
    return adapter


def finish(lm, expected):
    """tied: peft's head must be the saved embedding, one tensor, as the trainers train it; peft
    saves that head under its own key too (save_pretrained), which the final tensors then hold"""
    inner = lm.base_model.model
    embed = inner.model.embed_tokens.modules_to_save["default"].weight
    tied = inner.config.tie_word_embeddings
    assert (inner.lm_head.weight is embed) == tied, "ensure_weight_tying did not tie the head"
    if tied:
        expected[MODE + ".final." + HEAD] = embed.detach().clone()


def main():
    specs = {name: dict(mf.MODELS[name], grad_clip=GRAD_CLIP[name]) for name in ("tiny_gqa", "tiny_tied")}
    mf.peft_fixtures(MODE, specs, make_adapter, finish=finish,
                     rename=lambda n: n.replace(".modules_to_save.default.", ".").replace(".default.", "."))


if __name__ == "__main__":
    main()
