#!/usr/bin/env python3
# Regenerate (from the repository root, after make_fixtures.py, no network needed):
#
#     python3 dev/reference/make_prefix_fixtures.py
#
# prefix references (peft's PrefixTuningConfig, no prefix_projection) for test/test_llama2.c,
# under test/fixtures/<model>/prefix/ for tiny_gqa (GQA: 4 query heads over 2 KV heads, 3
# virtual tokens) and tiny_tied (3 heads, 5 virtual tokens):
#   peft_init/           the adapter as peft saves it: prompt_embeddings (num_virtual_tokens,
#                        num_layers * 2 * NKV * hd), peft's own N(0, 1) draws (non-zero: every
#                        gradient is live from step 1)
#   expected.json, expected.safetensors: for "prefix": the step-0 loss, the gradient of
#                        prompt_embeddings, the logits, 10 AdamW steps and the final tensor,
#                        in float64 with make_fixtures.py's patches (eager attention)
# layout_check() first checks what the trainers assume of peft (docs/lora.md, prefix): row j of
# prompt_embeddings is [layer 0's key, layer 0's value, layer 1's key, ...], each (NKV, hd), no
# RoPE; the real tokens' RoPE positions start at num_virtual_tokens; every real token sees
# every virtual one (the mask prepends ones).
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402  (its float64 patches come with it)
from peft import PrefixTuningConfig, get_peft_model  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

SPECS = {
    "tiny_gqa": dict(num_virtual_tokens=3, seed=5001, grad_clip=0.15),
    "tiny_tied": dict(num_virtual_tokens=5, seed=5002, grad_clip=0.1143),
}
KEY = "prompt_embeddings"  # peft's name in adapter_model.safetensors


def make_adapter(name, spec, folder):
    """peft's adapter on the float32 base, its own N(0, 1) draw; saved as peft saves it."""
    torch.manual_seed(spec["seed"])  # peft draws the embedding from torch's generator
    base32 = mf.load_base(f"{mf.FIX}/{name}", torch.float32)
    pm = get_peft_model(base32, PrefixTuningConfig(num_virtual_tokens=spec["num_virtual_tokens"], task_type="CAUSAL_LM"))
    out = f"{folder}/peft_init"
    pm.save_pretrained(out)
    if os.path.exists(out + "/README.md"):
        os.remove(out + "/README.md")
    adapter = load_file(out + "/adapter_model.safetensors")
    assert list(adapter) == [KEY], sorted(adapter)
    return adapter


def rename(n):
    assert n == "prompt_encoder.default.embedding.weight", n
    return KEY


def layout_check():
    """peft's past_key_values, positions and mask on tiny_gqa, against what the trainers do."""
    base = mf.load_base(f"{mf.FIX}/tiny_gqa", torch.float64)
    c = base.config
    L, NKV, hd, P, T = c.num_hidden_layers, c.num_key_value_heads, c.head_dim, 4, 7
    pm = get_peft_model(base, PrefixTuningConfig(num_virtual_tokens=P, task_type="CAUSAL_LM"))
    pm.double()
    E = pm.prompt_encoder["default"].embedding.weight.detach()
    assert tuple(E.shape) == (P, L * 2 * NKV * hd), E.shape
    cache = pm.get_prompt(1)
    for l in range(L):
        for j, got in enumerate((cache.layers[l].keys, cache.layers[l].values)):  # (1, NKV, P, hd)
            want = E[:, (2 * l + j) * NKV * hd:(2 * l + j + 1) * NKV * hd].reshape(P, NKV, hd).transpose(0, 1)
            assert torch.equal(got[0], want), (l, j)
    seen = {}
    rope, attn = mf.ml.LlamaRotaryEmbedding.forward, mf.ml.eager_attention_forward

    def rope_spy(self, x, position_ids):
        seen["pos"] = position_ids.clone()
        return rope(self, x, position_ids)

    def attn_spy(module, query, key, value, attention_mask, scaling, dropout=0.0, **kw):
        seen["mask"], seen["keys"] = attention_mask, key.shape[2]
        return attn(module, query, key, value, attention_mask, scaling, dropout, **kw)
    mf.ml.LlamaRotaryEmbedding.forward, mf.ml.eager_attention_forward = rope_spy, attn_spy
    try:
        with torch.no_grad():
            pm(input_ids=torch.randint(3, c.vocab_size, (1, T)), use_cache=False)
    finally:
        mf.ml.LlamaRotaryEmbedding.forward, mf.ml.eager_attention_forward = rope, attn
    assert torch.equal(seen["pos"][0], torch.arange(P, P + T)), seen["pos"]
    assert seen["keys"] == P + T, seen["keys"]
    visible = seen["mask"][0, 0] == 0  # (T, P + T): 0 where a query sees the key
    want = torch.ones(T, P + T, dtype=torch.bool)
    want[:, P:] = torch.tril(torch.ones(T, T, dtype=torch.bool))
    assert torch.equal(visible, want), visible
    print(f"    peft's prefix: rows [K_0 V_0 K_1 V_1 ...] of (NKV, hd), RoPE positions from {P}, every query sees it")


def main():
    os.chdir(mf.ROOT)
    layout_check()
    mf.peft_fixtures("prefix", SPECS, make_adapter, rename)


if __name__ == "__main__":
    main()
