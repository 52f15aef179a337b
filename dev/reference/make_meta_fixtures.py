# Writes test/fixtures/meta/tiny_gqa/: test/fixtures/tiny_gqa (a Hugging Face folder, F32,
# GQA 4/2 heads) in Meta's original layout, as Meta's download leaves a model of two
# model-parallel ranks (13B's count): params.json, tokenizer.model and consolidated.00.pth,
# consolidated.01.pth written by torch.save.
#
# The layout is built with the inverse of transformers' convert_llama_weights_to_hf.py:
# wq and wk rows back into Meta's interleaved RoPE order (the inverse of its permute),
# each tensor split between the ranks along the axis the converter concatenates (rows
# for wq, wk, wv, w1, w3, output; columns for wo, w2 and Llama-2's tok_embeddings), the
# norms replicated, rope.freqs added. As in Meta's files, a layer's tensors are views
# into one storage per rank. The script then checks its own work the converter's way:
# concatenating and permuting the parts gives back every Hugging Face tensor exactly.
#
# test/test_checkpoints.sh trains on this folder and on tiny_gqa's model.safetensors:
# the losses must be equal bit for bit.
#
# Run from the repo root (torch, safetensors; ~2 s, deterministic):
#   python3 dev/reference/make_meta_fixtures.py
import json, os, shutil
import torch
from safetensors.torch import load_file

src = os.path.join("test", "fixtures", "tiny_gqa")
out = os.path.join("test", "fixtures", "meta", "tiny_gqa")
RANKS = 2

cfg = json.load(open(os.path.join(src, "config.json")))
hf = load_file(os.path.join(src, "model.safetensors"))
dim, heads, kv_heads = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
hd = dim // heads
assert cfg["head_dim"] == hd and not cfg["tie_word_embeddings"]


def permute(w, n_heads):  # the converter's: Meta's rows -> Hugging Face's
    d1, d2 = w.shape
    return w.view(n_heads, d1 // n_heads // 2, 2, d2).transpose(1, 2).reshape(d1, d2)


def unpermute(w, n_heads):  # Hugging Face's rows -> Meta's
    d1, d2 = w.shape
    return w.view(n_heads, 2, d1 // n_heads // 2, d2).transpose(1, 2).reshape(d1, d2)


# Meta name, Hugging Face name, the axis the ranks split (None: replicated), RoPE heads
top = [("tok_embeddings.weight", "model.embed_tokens.weight", 1, None),
       ("norm.weight", "model.norm.weight", None, None),
       ("output.weight", "lm_head.weight", 0, None)]
per_layer = [("attention.wq.weight", "self_attn.q_proj.weight", 0, heads),
             ("attention.wk.weight", "self_attn.k_proj.weight", 0, kv_heads),
             ("attention.wv.weight", "self_attn.v_proj.weight", 0, None),
             ("attention.wo.weight", "self_attn.o_proj.weight", 1, None),
             ("feed_forward.w1.weight", "mlp.gate_proj.weight", 0, None),
             ("feed_forward.w2.weight", "mlp.down_proj.weight", 1, None),
             ("feed_forward.w3.weight", "mlp.up_proj.weight", 0, None),
             ("attention_norm.weight", "input_layernorm.weight", None, None),
             ("ffn_norm.weight", "post_attention_layernorm.weight", None, None)]
names = [(m, h, a, r) for m, h, a, r in top]
for l in range(cfg["num_hidden_layers"]):
    names += [(f"layers.{l}.{m}", f"model.layers.{l}.{h}", a, r) for m, h, a, r in per_layer]
assert sorted(h for _, h, _, _ in names) == sorted(hf), "every Hugging Face tensor is mapped once"


def parts(hf_name, axis, rope):
    w = hf[hf_name]
    if rope:
        w = unpermute(w, rope)
    return [w.clone() for _ in range(RANKS)] if axis is None else list(torch.chunk(w, RANKS, dim=axis))


split = {m: parts(h, a, r) for m, h, a, r in names}
inv_freq = 1.0 / (cfg["rope_parameters"]["rope_theta"] ** (torch.arange(0, hd, 2).float() / hd))

shutil.rmtree(out, ignore_errors=True)
os.makedirs(out)
for k in range(RANKS):
    sd = {}
    for prefix in [""] + [f"layers.{l}." for l in range(cfg["num_hidden_layers"])]:
        group = [(m, split[m][k]) for m, _, _, _ in names if m.startswith(prefix) and (prefix or not m.startswith("layers."))]
        flat = torch.cat([t.contiguous().reshape(-1) for _, t in group])  # one storage for the group
        at = 0
        for m, t in group:
            sd[m] = flat[at:at + t.numel()].view(t.shape)
            at += t.numel()
    sd["rope.freqs"] = inv_freq.clone()
    torch.save(sd, os.path.join(out, f"consolidated.{k:02d}.pth"))

# Meta's FFN formula gives tiny_gqa's 96 from dim 64 with these (int(8 * 64 / 3) = 170;
# 0.5 * 170 = 85; rounded up to a multiple of 32)
params = {"dim": dim, "multiple_of": 32, "ffn_dim_multiplier": 0.5, "n_heads": heads, "n_kv_heads": kv_heads,
          "n_layers": cfg["num_hidden_layers"], "norm_eps": cfg["rms_norm_eps"], "vocab_size": -1}
assert 32 * ((int(0.5 * int(8 * dim / 3)) + 31) // 32) == cfg["intermediate_size"]
json.dump(params, open(os.path.join(out, "params.json"), "w"))
shutil.copy(os.path.join(src, "tokenizer.model"), out)

# the converter's direction, from the files just written
loaded = [torch.load(os.path.join(out, f"consolidated.{k:02d}.pth"), weights_only=True) for k in range(RANKS)]
for m, h, axis, rope in names:
    w = loaded[0][m] if axis is None else torch.cat([loaded[k][m] for k in range(RANKS)], dim=axis)
    if rope:
        w = permute(w, rope)
    assert torch.equal(w, hf[h]), h
print(f"wrote {out}: {RANKS} ranks, {len(names)} tensors; the converter's reassembly gives back every tensor")
