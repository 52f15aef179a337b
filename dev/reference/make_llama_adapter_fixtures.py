#!/usr/bin/env python3
# Regenerate (from the repository root, after make_fixtures.py, no network needed):
#
#     python3 dev/reference/make_llama_adapter_fixtures.py
#
# llama_adapter references (peft's AdaptionPromptConfig) for test/test_llama2.c, under
# test/fixtures/<model>/llama_adapter/ for tiny_gqa (GQA: 4 query heads over 2 KV heads;
# adapter_layers 1 of 2, so layer 0 has no prompt) and tiny_tied (3 heads, both layers):
#   peft_init/           the adapter as peft saves it, its gates moved off their init of 0
#                        (0.5 + 0.3 N(0, 1)) so the prompts' and queries' gradients are live
#                        from step 1; the prompts are peft's own N(0, 1) draws
#   expected.json, expected.safetensors: for "llama_adapter": the step-0 loss, the gradient
#                        of every prompt and gate, the logits, 10 AdamW steps and the final
#                        tensors, in float64 with make_fixtures.py's patches (peft computes
#                        the prompt's softmax in float32 whatever the model's dtype)
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402  (its float64 patches come with it)
from peft import AdaptionPromptConfig, get_peft_model  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

SPECS = {
    "tiny_gqa": dict(adapter_len=3, adapter_layers=1, seed=4001, grad_clip=0.12),
    "tiny_tied": dict(adapter_len=5, adapter_layers=2, seed=4002, grad_clip=0.105),
}


def make_adapter(name, spec, folder):
    """peft's adapter on the float32 base, its gates drawn off 0; saved as peft saves it."""
    torch.manual_seed(spec["seed"])  # peft draws the prompts from torch's generator
    base32 = mf.load_base(f"{mf.FIX}/{name}", torch.float32)
    pm = get_peft_model(base32, AdaptionPromptConfig(adapter_len=spec["adapter_len"],
                                                     adapter_layers=spec["adapter_layers"], task_type="CAUSAL_LM"))
    mf.move_off_init(pm, lambda n: n.endswith("adaption_gate"), 0.0, 0.5, 0.3, spec["seed"])
    out = f"{folder}/peft_init"
    pm.save_pretrained(out)
    if os.path.exists(out + "/README.md"):
        os.remove(out + "/README.md")
    adapter = load_file(out + "/adapter_model.safetensors")
    assert len(adapter) == 2 * spec["adapter_layers"], sorted(adapter)
    return adapter


def branch_check():
    """peft's adapted attention on tiny_gqa's last layer against the maths the trainers
    implement (peft/adaption_prompt.h): the prompt through the layer's k_proj and v_proj without
    RoPE, the RoPE'd queries, query head h on KV head h // (NH / NKV), no mask, the plain
    gate, then o_proj, added to the attention's output."""
    base = mf.load_base(f"{mf.FIX}/tiny_gqa", torch.float64)
    pm = get_peft_model(base, AdaptionPromptConfig(adapter_len=4, adapter_layers=1, task_type="CAUSAL_LM"))
    pm.double()
    layer = pm.base_model.model.model.layers[-1].self_attn
    with torch.no_grad():
        layer.adaption_gate.fill_(0.7)
    attn = layer.model
    c = base.config
    NH, NKV, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    x = torch.randn(2, 7, c.hidden_size, dtype=torch.float64)
    pos = torch.arange(7).unsqueeze(0)
    cos, sin = base.model.rotary_emb(x, pos)
    with torch.no_grad():
        got = layer(hidden_states=x, position_embeddings=(cos, sin), attention_mask=None)[0] - \
            attn(hidden_states=x, position_embeddings=(cos, sin), attention_mask=None)[0]
        P = layer.adaption_prompt[0]
        kp = (P @ attn.k_proj.weight.T).view(-1, NKV, hd)
        vp = (P @ attn.v_proj.weight.T).view(-1, NKV, hd)
        q = (x @ attn.q_proj.weight.T).view(2, 7, NH, hd)
        half = hd // 2
        rot = torch.cat((-q[..., half:], q[..., :half]), dim=-1)
        q = q * cos.unsqueeze(2) + rot * sin.unsqueeze(2)
        y = torch.zeros(2, 7, NH, hd, dtype=torch.float64)
        for h in range(NH):
            s = torch.einsum("btd,jd->btj", q[:, :, h], kp[:, h // (NH // NKV)]) / math.sqrt(hd)
            y[:, :, h] = 0.7 * torch.softmax(s, dim=-1) @ vp[:, h // (NH // NKV)]
        want = y.reshape(2, 7, -1) @ attn.o_proj.weight.T
    err = (got - want).abs().max().item() / want.abs().max().item()
    assert err < 1e-6, err  # (peft's softmax is float32's)
    print(f"    peft's branch == peft/adaption_prompt.h's maths: {err:.1e} of its scale")


def main():
    os.chdir(mf.ROOT)
    branch_check()
    mf.peft_fixtures("llama_adapter", SPECS, make_adapter)

if __name__ == "__main__":
    main()
