#!/usr/bin/env python3
# Reference values for --s2_attn 1, LongLoRA's shifted sparse attention (S2-Attn) in
# its flash-attention form, written here from its description, not from the trainer:
# each row of T positions is cut in 4 groups of G = T / 4; the first half of the
# query heads attend causally within their groups; for the second half q, k and v
# are shifted by G / 2 positions (floored) so that the groups start at 0 again,
# reshaped into groups, attended causally, and shifted back, with no wrap-around:
# the group that the shift wraps (the last G / 2 positions and the first) is two
# groups. The KV heads are repeated to one per query head first, as LongLoRA does.
# It replaces the attention of transformers' LlamaForCausalLM (float64, with
# make_fixtures.py's patches) for tiny_gqa (4 query heads, 2 KV heads) and gives the
# loss and every gradient of one step of two micro-batches, T = 24 (G = 6) and T = 20
# (G = 5: half-groups of 2), for full fine-tuning and for LoRA from peft_init.
# It checks that the grouping binds (the loss differs from causal attention's) and
# that with one unshifted group of T it is causal attention.
#
# Writes NEW files only: test/fixtures/tiny_gqa/ref/s2attn.safetensors (tokens_<g>,
# targets_<g>, full.grad.*, lora.grad.*) and s2attn.json (the labels and both losses).
#
# Run from anywhere: /tmp/venv/bin/python dev/reference/make_s2attn_fixtures.py (after
# make_fixtures.py, whose model folder it reads; ~5 s).
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402  (its import patches transformers' Llama for float64)
from transformers.models.llama import modeling_llama as ml  # noqa: E402

MODEL = "tiny_gqa"
SHAPES = [(2, 24), (2, 20)]  # (rows, T) of each micro-batch
GROUPS = 4                   # LongLoRA's group_size_ratio 1/4


def grouped_causal(q, k, v, scaling, G, shift):
    """q, k, v (B, H, T, hd): shifted by `shift` positions to the left, cut in groups of G,
    causal attention in each, shifted back. The last group of a shifted sequence holds its
    last G - shift positions and then (wrapped) its first shift ones: two groups, not one."""
    B, H, T, hd = q.shape
    n = T // G
    q, k, v = (x.roll(-shift, dims=2).reshape(B, H, n, G, hd) for x in (q, k, v))
    allowed = torch.ones(n, G, G, dtype=torch.bool).tril()
    if shift:
        r = torch.arange(G)
        allowed[-1] &= (r[:, None] < G - shift) == (r[None, :] < G - shift)
    scores = (q @ k.transpose(-1, -2)) * scaling
    p = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    return (p @ v).reshape(B, H, T, hd).roll(shift, dims=2)


def s2_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """eager_attention_forward's replacement: query (B, NH, T, hd), key and value (B, NKV,
    T, hd) after RoPE -> (B, T, NH, hd). No padding in these batches: the mask is S2-Attn's."""
    assert dropout == 0.0
    k, v = (ml.repeat_kv(x, module.num_key_value_groups) for x in (key, value))
    NH, T = query.shape[1], query.shape[2]
    assert T % GROUPS == 0 and NH % 2 == 0
    G, h = T // GROUPS, NH // 2
    first = grouped_causal(query[:, :h], k[:, :h], v[:, :h], scaling, G, 0)
    second = grouped_causal(query[:, h:], k[:, h:], v[:, h:], scaling, G, G // 2)
    return torch.cat([first, second], dim=1).transpose(1, 2).contiguous(), None


def batches():
    """random tokens; every position but the last of a row labelled with the next token"""
    g = torch.Generator().manual_seed(38)
    mbs = []
    for B, T in SHAPES:
        tok = torch.randint(3, 500, (B, T), generator=g)
        tgt = torch.full((B, T), mf.IGNORE, dtype=torch.long)
        tgt[:, :-1] = tok[:, 1:]
        mbs.append((tok, tgt))
    return mbs


def step_loss(model, mbs):
    """the step loss of mbs, no gradients"""
    with torch.no_grad():
        sums = [mf.loss_sum_count(mf.forward_logits(model, tok), tgt) for tok, tgt in mbs]
    return sum(s.item() for s, _ in sums) / sum(c for _, c in sums)


def self_check():
    """one unshifted group of T is causal attention (the definition above against torch's own)"""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 12, 4, generator=g, dtype=torch.float64) for _ in range(3))
    causal = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.5)
    assert torch.allclose(grouped_causal(q, k, v, 0.5, 12, 0), causal, rtol=0, atol=1e-14)


def main():
    os.chdir(mf.ROOT)
    self_check()
    folder = f"{mf.FIX}/{MODEL}"
    mbs = batches()
    out = {"labels": sum(int((t != mf.IGNORE).sum()) for _, t in mbs), "shapes": SHAPES}
    expected = {}
    for g, (tok, tgt) in enumerate(mbs):
        expected[f"tokens_{g}"], expected[f"targets_{g}"] = tok.to(torch.int32), tgt.to(torch.int32)

    causal_loss = step_loss(mf.load_base(folder, torch.float64), mbs)
    ml.eager_attention_forward = s2_attention
    out["full_loss"], out["lora_loss"] = mf.full_and_lora_grads(folder, mbs, expected)
    assert abs(out["full_loss"] - causal_loss) > 1e-3 * causal_loss, (out["full_loss"], causal_loss)
    print(f"{MODEL}: {out['labels']} labels; causal full loss {causal_loss!r}; with S2-Attn full loss "
          f"{out['full_loss']!r}, LoRA loss {out['lora_loss']!r}")

    mf.save_ref(folder, "s2attn", expected, out)


if __name__ == "__main__":
    main()
