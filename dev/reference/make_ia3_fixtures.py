#!/usr/bin/env python3
# Regenerate (from the repository root, after make_fixtures.py, no network needed):
#
#     python3 dev/reference/make_ia3_fixtures.py
#
# IA3 references (peft's IA3Config) for test/test_llama2.c, under
# test/fixtures/<model>/ia3/ for tiny_gqa (peft's defaults for llama: k_proj, v_proj
# and down_proj, down_proj feedforward) and tiny_tied (q_proj, v_proj, o_proj,
# gate_proj, down_proj with gate_proj and down_proj feedforward: an input-scaled
# module whose input another module shares, and an output-scaled one after attention):
#   peft_init/           an IA3 adapter as peft saves it, its vectors moved off their
#                        init of 1 (1 + 0.2 N(0, 1)) so every gradient term is live
#   expected.json, expected.safetensors: for "ia3": the step-0 loss, the gradient of
#                        every vector, the logits, 10 AdamW steps and the final
#                        vectors, in float64 with make_fixtures.py's patches.
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402  (its float64 patches come with it)
from peft import IA3Config, get_peft_model  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

SPECS = {
    "tiny_gqa": dict(target_modules=["k_proj", "v_proj", "down_proj"], feedforward_modules=["down_proj"],
                     seed=3001, grad_clip=0.223),
    "tiny_tied": dict(target_modules=["q_proj", "v_proj", "o_proj", "gate_proj", "down_proj"],
                      feedforward_modules=["gate_proj", "down_proj"], seed=3002, grad_clip=0.19),
}


def make_adapter(name, ia3, folder):
    """peft's IA3 adapter on the float32 base, its vectors drawn off 1; saved as peft saves it."""
    base32 = mf.load_base(f"{mf.FIX}/{name}", torch.float32)
    pm = get_peft_model(base32, IA3Config(target_modules=ia3["target_modules"],
                                          feedforward_modules=ia3["feedforward_modules"], task_type="CAUSAL_LM"))
    mf.move_off_init(pm, lambda n: "ia3_l" in n, 1.0, 1.0, 0.2, ia3["seed"])
    out = f"{folder}/peft_init"
    mf.save_adapter(pm, out, feedforward_modules=sorted(ia3["feedforward_modules"]))  # (peft keeps a set)
    adapter = load_file(out + "/adapter_model.safetensors")
    assert len(adapter) == len(ia3["target_modules"]) * mf.MODELS[name]["config"]["num_hidden_layers"], sorted(adapter)
    return adapter


def feedforward_scales_input_check():
    """peft's IA3 on one Linear, the maths the trainers implement: a feedforward module's
    vector (1, in) scales its input, another's (out, 1) its output; merging scales W's
    columns or rows."""
    for ff in (False, True):
        lin = torch.nn.Linear(6, 5, bias=False).double()
        W = lin.weight.detach().clone()
        pm = get_peft_model(torch.nn.Sequential(lin), IA3Config(target_modules=["0"],
                                                                feedforward_modules=["0"] if ff else []))
        layer = pm.base_model.model[0]
        vec = layer.ia3_l["default"]
        with torch.no_grad():
            vec.copy_(1.0 + torch.randn(vec.shape, dtype=torch.float64))
        x = torch.randn(3, 6, dtype=torch.float64)
        want = (x * vec.flatten()) @ W.T if ff else (x @ W.T) * vec.flatten()
        assert vec.shape == ((1, 6) if ff else (5, 1)), vec.shape
        assert torch.allclose(layer(x), want, rtol=1e-12, atol=0)
        merged = pm.merge_and_unload()[0].weight.detach()
        assert torch.allclose(merged, W * (vec.detach() if ff else vec.detach()), rtol=1e-15, atol=0)


def main():
    os.chdir(mf.ROOT)
    feedforward_scales_input_check()
    mf.peft_fixtures("ia3", SPECS, make_adapter, rename=lambda n: n.replace(".ia3_l.default", ".ia3_l"))

if __name__ == "__main__":
    main()
