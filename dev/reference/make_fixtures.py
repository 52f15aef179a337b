#!/usr/bin/env python3
# Regenerate (from the repository root, no network needed):
#
#     python3 dev/reference/make_fixtures.py
#
# Writes test/fixtures/data.jsonl and test/fixtures/<model>/** for every model in
# MODELS: a SentencePiece BPE tokenizer trained on a corpus generated here, tiny
# random models of the Llama family (HF folders: tiny_gqa and tiny_tied as
# Llama-2, then one per family with its own settings: tiny_llama3, tiny_linear,
# tiny_codellama, tiny_mistral), an initial peft LoRA adapter per model, and
# reference values (logits, gradients, 10 AdamW steps) computed with transformers
# + peft in float64 on the CPU.
# Everything is deterministic (fixed seeds, single-threaded torch).
#
# Note: transformers 5's Llama code casts to float32 inside RMSNorm, inside the
# eager attention softmax and in RoPE (cos/sin), even when the model is float64.
# To get a genuine float64 reference those three pieces are patched below to
# compute in the input's dtype (same maths, more precision), in LlamaForCausalLM
# and MistralForCausalLM alike. An independent plain-torch float64 forward checks
# the patched HF model (see check_forward).
import copy
import io
import json
import math
import os
import random
import shutil
import sys

import numpy as np
import torch

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)

import peft
import safetensors
import sentencepiece as spm
import transformers
from peft import LoraConfig, PeftConfig, PeftModel, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          get_cosine_schedule_with_warmup)
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama import modeling_llama as ml
from transformers.models.mistral import modeling_mistral as mm

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIX = "test/fixtures"  # relative: it ends up in adapter_config.json's base_model_name_or_path
MAX_SEQ_LEN = 24
B = 2
GA = 2
PAD_ID = 2  # EOS
IGNORE = -100
STEPS = 10
WARMUP = 3

# ---------------------------------------------------------------------------
# float64 patches for transformers' Llama (see the note at the top)


def _rmsnorm_forward(self, hidden_states):
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    return self.weight * hidden_states


def inv_freq_of(config):
    """RoPE's inverse frequencies: plain ones in float64 (the formula, more precisely than
    float32); scaled ones (llama3, linear) as transformers' own functions compute them, in
    float32, the values the C code must reproduce (and whose scaling exists only in float32)."""
    params = config.rope_parameters
    if params["rope_type"] == "default":
        theta = params["rope_theta"]
        dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    return ROPE_INIT_FUNCTIONS[params["rope_type"]](config)[0].to(torch.float64)


def _rope_forward(self, x, position_ids):
    freqs = position_ids[..., None].to(torch.float64) * inv_freq_of(self.config)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def _eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    key_states = ml.repeat_kv(key, module.num_key_value_groups)
    value_states = ml.repeat_kv(value, module.num_key_value_groups)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = torch.nn.functional.softmax(attn_weights, dim=-1)
    assert dropout == 0.0
    attn_output = torch.matmul(attn_weights, value_states)
    return attn_output.transpose(1, 2).contiguous(), attn_weights


for module, prefix in ((ml, "Llama"), (mm, "Mistral")):
    getattr(module, prefix + "RMSNorm").forward = _rmsnorm_forward
    getattr(module, prefix + "RotaryEmbedding").forward = _rope_forward
    module.eager_attention_forward = _eager_attention_forward

# ---------------------------------------------------------------------------
# corpus + tokenizer

SUBJECTS = ["the cat", "a dog", "my friend", "the old man", "our teacher", "the little girl", "a farmer",
            "the captain", "her brother", "the baker", "a young boy", "the doctor", "his sister", "the king",
            "a bird", "the river", "the children", "every student", "the queen", "a traveller"]
VERBS = ["sat on", "looked at", "walked to", "found", "painted", "carried", "remembered", "built", "opened",
         "followed", "watched", "cleaned", "visited", "wanted", "bought", "sold", "climbed", "crossed",
         "described", "forgot"]
OBJECTS = ["the mat", "a red house", "the green hill", "an apple", "the window", "a small boat", "the bridge",
           "the market", "a long letter", "the garden", "a wooden box", "the mountain", "the station",
           "a blue door", "the library", "the forest", "a silver coin", "the kitchen", "the old road",
           "a yellow flower"]
TAILS = ["yesterday", "in the morning", "before dinner", "after the rain", "at night", "last summer",
         "on Monday", "with great care", "without a word", "in 1987", "at 7 o'clock", "for 25 minutes",
         "near the café", "by the sea", "every day", "in 2024", "twice", "quickly", "slowly", "again"]
OPENERS = ["", "", "", "Then ", "Later, ", "Suddenly ", "Once upon a time ", "Today ", "However, ", "Still, "]
ENDS = [".", ".", ".", "!", "?", "...", "."]
EXTRA = ["It cost $12.50, or 3 coins.", "Call 555-0199 (ask for Zoë).", "She said: \"yes\"; he said: no.",
         "The naïve café owner counted 1, 2, 3, 4, 5, 6, 7, 8, 9, 10.", "Room 42 is on floor 3 - left side!",
         "Why?  Because 100% of them agreed.", "Numbers: 0 11 222 3333 44444.", "Über-fast trains run at 300 km/h."]


def make_corpus():
    rng = random.Random(1234)
    lines = []
    for i in range(600):
        s = rng.choice(OPENERS) + " ".join([rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS)])
        if rng.random() < 0.7:
            s += " " + rng.choice(TAILS)
        if rng.random() < 0.25:
            s += " and " + " ".join([rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS)])
        s = s[0].upper() + s[1:] + rng.choice(ENDS)
        if rng.random() < 0.1:
            s += " " + str(rng.randint(0, 99999))
        lines.append(s)
    lines += EXTRA * 5
    return lines


def train_tokenizer():
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(make_corpus()), model_writer=buf,
        model_type="bpe", vocab_size=512, byte_fallback=True, split_digits=True,
        allow_whitespace_only_pieces=True, remove_extra_whitespaces=False,
        normalization_rule_name="identity", add_dummy_prefix=True,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, character_coverage=1.0,
        num_threads=1, minloglevel=2)
    return buf.getvalue()


# ---------------------------------------------------------------------------
# data

DATA = [
    # row 0: long (truncated), digits
    "Once upon a time the old man walked to the station in 1987 and counted 12345 coins before the train left.",
    # row 1: short
    "The cat sat.",
    # row 2: medium, non-ASCII (ë and é are in the vocabulary, € only via byte fallback)
    "Zoë paid 7 € at the café.",
    # row 3: short
    "A dog ran!",
    # row 4: long
    "However, every student remembered the long letter that our teacher wrote last summer by the sea, again.",
    # row 5: short
    "Why? Because.",
    # row 6: medium with digits
    "Room 42 cost $12.50 in 2024.",
    # row 7: long
    "The little girl bought a silver coin, a wooden box and a yellow flower, then climbed the green hill slowly.",
]


def tokenize_rows(sp):
    rows = []
    for text in DATA:
        ids = [1] + sp.encode(text) + [2]
        rows.append(ids[:MAX_SEQ_LEN])
    return rows


def make_microbatch(rows):
    T = max(len(r) for r in rows)
    tok = torch.full((len(rows), T), PAD_ID, dtype=torch.long)
    tgt = torch.full((len(rows), T), IGNORE, dtype=torch.long)
    for i, r in enumerate(rows):
        tok[i, :len(r)] = torch.tensor(r)
        tgt[i, :len(r) - 1] = torch.tensor(r[1:])
    return tok, tgt


def step_microbatches(rows, step):
    idx = [(4 * step + j) % len(rows) for j in range(B * GA)]
    return [make_microbatch([rows[i] for i in idx[m * B:(m + 1) * B]]) for m in range(GA)]


# ---------------------------------------------------------------------------
# models

ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# vocab_sample: the tensors with a vocabulary axis are stored in expected.safetensors for
# the rows of vocab_index only (every vocab_sample-th row, the last, and every token the data
# has), which keeps the files small (see vocab_rows)
MODELS = {
    "tiny_gqa": dict(
        config=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, vocab_size=512, max_position_embeddings=128, rms_norm_eps=1e-5,
                    rope_theta=10000.0, tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
                    initializer_range=0.1, bos_token_id=1, eos_token_id=2),
        seed=1001, save_dtype=torch.float32, max_shard_size=None,
        lora=dict(r=4, lora_alpha=8, target_modules=ALL_LINEAR),
        lora_seed=2001,
        train=dict(lora=dict(lr=1e-2, grad_clip=1.1), full=dict(lr=3e-3, grad_clip=3.0)),
    ),
    "tiny_tied": dict(
        config=dict(hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=3,
                    num_key_value_heads=3, vocab_size=512, max_position_embeddings=128, rms_norm_eps=1e-6,
                    rope_theta=500000.0, tie_word_embeddings=True, attention_bias=False, mlp_bias=False,
                    initializer_range=0.1, bos_token_id=1, eos_token_id=2),
        seed=1002, save_dtype=torch.bfloat16, max_shard_size="100KB",
        lora=dict(r=2, lora_alpha=16, target_modules=["q_proj", "v_proj"]),
        lora_seed=2002,
        train=dict(lora=dict(lr=1e-2, grad_clip=1.1), full=dict(lr=3e-3, grad_clip=2.4)),
    ),
    # Llama-3.2 style: GQA, rope_theta 500000, tied embeddings and llama3 RoPE scaling, with
    # factor, low/high_freq_factor and original_max_position_embeddings chosen so that the
    # 6 frequencies of head_dim 12 fall in all three bands (print_rope shows them); and a
    # head_dim that is not hidden_size / heads (12, not 32 / 4)
    "tiny_llama3": dict(
        config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=12, vocab_size=512, max_position_embeddings=4096,
                    rms_norm_eps=1e-5, rope_theta=500000.0,
                    rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=32.0,
                                      original_max_position_embeddings=1024),
                    tie_word_embeddings=True, attention_bias=False, mlp_bias=False, initializer_range=0.1,
                    bos_token_id=1, eos_token_id=2),
        seed=1003, save_dtype=torch.bfloat16, max_shard_size=None, vocab_sample=16,
        lora=dict(r=4, lora_alpha=8, target_modules=ALL_LINEAR),
        lora_seed=2003,
        train=dict(lora=dict(lr=1e-2, grad_clip=0.66), full=dict(lr=3e-3, grad_clip=1.8)),
    ),
    # linear RoPE scaling (positions / factor)
    "tiny_linear": dict(
        config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=4, vocab_size=512, max_position_embeddings=4096, rms_norm_eps=1e-5,
                    rope_theta=10000.0, rope_scaling=dict(rope_type="linear", factor=4.0),
                    tie_word_embeddings=False, attention_bias=False, mlp_bias=False, initializer_range=0.1,
                    bos_token_id=1, eos_token_id=2),
        seed=1004, save_dtype=torch.float32, max_shard_size=None, vocab_sample=16,
        lora=dict(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]),
        lora_seed=2004,
        train=dict(lora=dict(lr=1e-2, grad_clip=0.35), full=dict(lr=3e-3, grad_clip=1.9)),
    ),
    # CodeLlama's vocabulary of 32016 rows (a small dim keeps the file small) and rope_theta 1e6
    "tiny_codellama": dict(
        config=dict(hidden_size=8, intermediate_size=24, num_hidden_layers=2, num_attention_heads=1,
                    num_key_value_heads=1, vocab_size=32016, max_position_embeddings=16384, rms_norm_eps=1e-5,
                    rope_theta=1000000.0, tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
                    initializer_range=0.1, bos_token_id=1, eos_token_id=2),
        seed=1005, save_dtype=torch.bfloat16, max_shard_size=None, vocab_sample=127,
        lora=dict(r=2, lora_alpha=4, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
        lora_seed=2005,
        train=dict(lora=dict(lr=1e-2, grad_clip=0.2), full=dict(lr=3e-3, grad_clip=0.575)),
    ),
    # Mistral (MistralForCausalLM): GQA and a sliding window of 5 tokens, shorter than the
    # sequences (24), so that it changes the result (make_model measures by how much)
    "tiny_mistral": dict(
        arch="mistral",
        config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, vocab_size=512, max_position_embeddings=4096, rms_norm_eps=1e-5,
                    rope_theta=10000.0, sliding_window=5, tie_word_embeddings=False, initializer_range=0.1,
                    bos_token_id=1, eos_token_id=2),
        seed=1006, save_dtype=torch.bfloat16, max_shard_size=None, vocab_sample=16,
        lora=dict(r=4, lora_alpha=8, target_modules=ALL_LINEAR),
        lora_seed=2006,
        train=dict(lora=dict(lr=1e-2, grad_clip=0.75), full=dict(lr=3e-3, grad_clip=1.8)),
    ),
}
ARCHS = {"llama": (LlamaConfig, LlamaForCausalLM), "mistral": (MistralConfig, MistralForCausalLM)}


def build_model(spec):
    config_cls, model_cls = ARCHS[spec.get("arch", "llama")]
    cfg = config_cls(**spec["config"])
    torch.manual_seed(spec["seed"])
    model = model_cls(cfg).float()
    g = torch.Generator().manual_seed(spec["seed"])
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied lm_head is listed once (as embed_tokens)
            r = torch.randn(p.shape, generator=g, dtype=torch.float32)
            v = 1.0 + 0.1 * r if name.endswith("norm.weight") else 0.1 * r
            p.copy_(v.to(torch.bfloat16).to(torch.float32))
    return model


def load_base(folder, dtype, arch="llama"):
    model, info = ARCHS[arch][1].from_pretrained(folder, dtype=dtype, attn_implementation="eager",
                                                 output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert model.config._attn_implementation == "eager"
    return model


def load_lora64(folder, arch="llama"):
    """The float64 base of the folder with its peft_init adapter, trainable: the model
    and its LoRA parameters as (peft key, parameter)."""
    lm = PeftModel.from_pretrained(load_base(folder, torch.float64, arch), folder + "/peft_init", is_trainable=True)
    lm.double()
    lora_named = []
    for n, p in lm.named_parameters():
        if p.requires_grad:
            assert "lora_" in n and ".default." in n, n
            lora_named.append((n.replace(".default.", "."), p))
        else:
            assert "lora_" not in n
    return lm, lora_named


def base_state(model):
    """HF weight names -> tensors; lm_head only if untied."""
    sd = {}
    for name, p in model.named_parameters():
        sd[name] = p
    if model.config.tie_word_embeddings:
        assert "lm_head.weight" not in sd
    return sd


def peft_adapter(folder, spec, seed, **lora_config):
    """spec's LoRA adapter made by peft on the float32 model in folder, B drawn off zero (so that
    A gets gradients); lora_config: more LoraConfig fields. Returns it and the generator it drew from."""
    lcfg = LoraConfig(r=spec["lora"]["r"], lora_alpha=spec["lora"]["lora_alpha"], lora_dropout=0.0,
                      target_modules=spec["lora"]["target_modules"], bias="none", task_type="CAUSAL_LM", **lora_config)
    base32 = load_base(folder, torch.float32, spec.get("arch", "llama"))
    torch.manual_seed(seed)
    pm = get_peft_model(base32, lcfg)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.copy_(0.05 * torch.randn(p.shape, generator=g, dtype=torch.float32))
    return pm, g


def save_adapter(pm, out, **config):
    """pm.save_pretrained(out), with config's fields set in adapter_config.json. peft keeps
    target_modules as a set, so its order in adapter_config.json depends on the string hash
    seed; sort it for reproducible files. Drop the generated model card (not needed)."""
    pm.save_pretrained(out)
    acfg_path = out + "/adapter_config.json"
    acfg = json.load(open(acfg_path))
    acfg["target_modules"] = sorted(acfg["target_modules"])
    acfg.update(config)
    with open(acfg_path, "w") as f:
        json.dump(acfg, f, indent=2, sort_keys=True)
    if os.path.exists(out + "/README.md"):
        os.remove(out + "/README.md")


def fresh_folder(folder):
    """folder emptied (a run before wrote it) and made"""
    if os.path.isdir(folder):
        shutil.rmtree(folder)
    os.makedirs(folder)


def peft_load_trainable(base, path):
    """path's peft adapter on base, trainable: prompt learning (make_prefix_fixtures.py) peft
    loads for inference only, so its prompt is set to train by hand"""
    if PeftConfig.from_pretrained(path).is_prompt_learning:
        lm = PeftModel.from_pretrained(base, path)
        lm.active_peft_config.inference_mode = False
        for p in lm.prompt_encoder.parameters():
            p.requires_grad_(True)
        return lm
    return PeftModel.from_pretrained(base, path, is_trainable=True)


def peft_reference(name, mode, folder, adapter, rows, expected, out, hp, rename=lambda k: k, finish=None):
    """A peft adapter's float64 reference (make_ia3_fixtures.py, make_llama_adapter_fixtures.py,
    make_trainable_fixtures.py): folder/peft_init loaded on name's base, its trainable tensors
    (their names through rename) checked against adapter, the file's; then into expected the
    logits, the step-0 gradients and the final tensors after hp's steps as "<mode>.logits",
    "<mode>.grad.<name>", "<mode>.final.<name>", and into out the step-0 loss and the steps;
    finish(lm, expected), when given, last (checks of the trained model, tensors of its own)."""
    lm = peft_load_trainable(load_base(f"{FIX}/{name}", torch.float64), f"{folder}/peft_init")
    lm.double()
    named = [(rename(n), p) for n, p in lm.named_parameters() if p.requires_grad]
    assert sorted(k for k, _ in named) == sorted(adapter), ("peft key mismatch", sorted(k for k, _ in named))
    for k, p in named:
        assert torch.equal(p.detach(), adapter[k].double()), k
    mbs0 = step_microbatches(rows, 0)
    lm.eval()
    with torch.no_grad():
        expected[f"{mode}.logits"] = forward_logits(lm, mbs0[0][0])
    lm.train()
    params = [p for _, p in named]
    loss0 = step_grads(lm, params, mbs0)
    for k, p in named:
        assert p.grad is not None and p.grad.abs().max() > 0, k
        expected[f"{mode}.grad.{k}"] = p.grad.clone()
    print(f"    {mode}: step-0 loss {loss0!r}")
    steps = train(lm, named, rows, hp)
    assert steps[0]["loss"] == loss0
    for k, p in named:
        expected[f"{mode}.final.{k}"] = p.detach().clone()
    out[mode] = {"loss": loss0, "steps": steps}
    out["train"] = {mode: hp}
    if finish:
        finish(lm, expected)


def move_off_init(pm, select, init, offset, scale, seed):
    """pm's parameters whose names select accepts, checked to be at peft's init value init, drawn
    again as offset + scale N(0, 1) from seed, so that every gradient term is live"""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if select(n):
                assert torch.equal(p, torch.full_like(p, init)), n
                p.copy_(offset + scale * torch.randn(p.shape, generator=g, dtype=torch.float32))


def peft_fixtures(mode, specs, make_adapter, rename=lambda k: k, finish=None):
    """Each model of specs' peft adapter (make_adapter(name, spec, folder) saves it into
    folder/peft_init and returns its tensors) and its reference, into FIX/<name>/<mode>/;
    spec["grad_clip"] is its clipping threshold (lr 1e-2); rename and finish as peft_reference's."""
    os.chdir(ROOT)
    sp = spm.SentencePieceProcessor(model_file=f"{FIX}/tiny_gqa/tokenizer.model")
    rows = tokenize_rows(sp)
    for name, spec in specs.items():
        print(f"== {name} ({mode})")
        folder = f"{FIX}/{name}/{mode}"
        fresh_folder(folder)
        adapter = make_adapter(name, spec, folder)
        hp = hparams(dict(lr=1e-2, grad_clip=spec["grad_clip"]))
        expected, out = {}, {}
        peft_reference(name, mode, folder, adapter, rows, expected, out, hp, rename, finish)
        write_expected(folder, expected, out)
    print("done")


def write_expected(folder, expected, out):
    """a reference's tensors (float32; I32 ones, vocab_index, as they are) and its JSON into
    folder/expected.safetensors and .json"""
    save_file({k: v.detach().to(torch.int32 if v.dtype == torch.int32 else torch.float32).contiguous()
               for k, v in sorted(expected.items())},
              folder + "/expected.safetensors")
    with open(folder + "/expected.json", "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


def loss_sum_count(logits, targets):
    lp = torch.log_softmax(logits.to(torch.float64), dim=-1)
    valid = targets != IGNORE
    picked = lp.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return -(picked * valid).sum(), int(valid.sum())


def forward_logits(model, tokens):
    return model(input_ids=tokens, use_cache=False).logits


def step_grads(model, params, mbs, on_microbatch=None):
    """Zeroes grads, accumulates d(step loss)/d(params); returns the step loss (float).
    on_microbatch(g), if given, runs before micro-batch g (make_dora_fixtures sets its dropout masks)."""
    for p in params:
        p.grad = None
    count = sum(int((t != IGNORE).sum()) for _, t in mbs)
    total = 0.0
    for g, (tok, tgt) in enumerate(mbs):
        if on_microbatch:
            on_microbatch(g)
        s, _ = loss_sum_count(forward_logits(model, tok), tgt)
        (s / count).backward()
        total += s.item()
    return total / count


def full_and_lora_grads(folder, mbs, expected):
    """One step of the micro-batches mbs on the float64 base of folder with every weight
    trainable, then on it with its peft_init adapter: returns the two step losses and puts the
    gradients in expected as full.grad.<hf name> and lora.grad.<peft key>."""
    base = load_base(folder, torch.float64)
    base.train()
    named = list(base_state(base).items())
    for _, p in named:
        p.requires_grad_(True)
    full_loss = step_grads(base, [p for _, p in named], mbs)
    for k, p in named:
        expected["full.grad." + k] = p.grad.clone()
    lm, lora_named = load_lora64(folder)
    lm.train()
    lora_loss = step_grads(lm, [p for _, p in lora_named], mbs)
    for k, p in lora_named:
        assert p.grad is not None and p.grad.abs().max() > 0, k
        expected["lora.grad." + k] = p.grad.clone()
    return full_loss, lora_loss


def save_ref(folder, name, expected, summary):
    """folder/ref/<name>.safetensors (expected's tensors: I32 as they are, the rest F32) and
    folder/ref/<name>.json (summary)"""
    save_file({k: v.detach().to(torch.int32 if v.dtype == torch.int32 else torch.float32).contiguous()
               for k, v in sorted(expected.items())}, f"{folder}/ref/{name}.safetensors")
    with open(f"{folder}/ref/{name}.json", "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")


def make_optimizer(params, hp):
    """torch.optim.AdamW, or torch.optim.SGD where hp says so (make_sgd_fixtures.py)"""
    if hp.get("optimizer") == "sgd":
        return torch.optim.SGD(params, lr=hp["lr"], momentum=hp["momentum"], dampening=0.0, nesterov=hp["nesterov"],
                               weight_decay=hp["weight_decay"])
    return torch.optim.AdamW(params, lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"],
                             weight_decay=hp["weight_decay"])


def train(model, named_params, rows, hp, on_microbatch=None, step_fn=None):
    """hp's optimizer steps; on_microbatch(step, g), if given, runs before each micro-batch.
    step_fn(s), if given, replaces the SFT step s (make_dpo_fixtures.py): it sets the gradients
    of the step's loss and returns the loss and the step's metrics (a dict, recorded with it)."""
    params = [p for _, p in named_params]
    opt = make_optimizer(params, hp)
    sched = get_cosine_schedule_with_warmup(opt, num_warmup_steps=hp["warmup_steps"],
                                            num_training_steps=hp["max_steps"])
    steps = []
    for s in range(hp["max_steps"]):
        if step_fn:
            loss, metrics = step_fn(s)
        else:
            hook = (lambda g, s=s: on_microbatch(s, g)) if on_microbatch else None
            loss, metrics = step_grads(model, params, step_microbatches(rows, s), hook), {}
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm=hp["grad_clip"]).item()
        lr = float(opt.param_groups[0]["lr"])  # (torchao's optimizers keep it as a tensor, changed in place)
        opt.step()
        sched.step()
        steps.append({"step": s + 1, "loss": loss, "lr": lr, "grad_norm": norm, **metrics})
        # keep every norm clearly on one side of the clip threshold (robust for float32 comparisons)
        assert abs(norm - hp["grad_clip"]) > 0.005 * hp["grad_clip"], (s + 1, norm)
        print(f"    step {s + 1:2d} loss {loss:.10f} lr {lr:.6e} grad_norm {norm:.6f}"
              f"{'  (clipped)' if norm > hp['grad_clip'] else ''}")
    n_clipped = sum(st["grad_norm"] > hp["grad_clip"] for st in steps)
    assert 2 <= n_clipped < len(steps), n_clipped  # clipping triggers on some steps, not all
    return steps


def optimizer_runs(model_name, runs, out_name, record=None):
    """Another optimizer's fixture (make_sgd_fixtures.py, make_adamw8bit_fixtures.py): each of
    runs, (name, "lora" | "full", hparams), trained by train() from model_name's start (LoRA
    from its peft_init adapter) through make_optimizer; writes ref/<out_name>.json (settings,
    steps, and what record(named parameters) adds) and ref/<out_name>.safetensors (the final
    trainable tensors as <run>.final.<name>)."""
    os.chdir(ROOT)
    folder = f"{FIX}/{model_name}"
    sp = spm.SentencePieceProcessor(model_file=folder + "/tokenizer.model")
    with open(f"{FIX}/data.jsonl", encoding="utf-8") as f:
        assert [json.loads(line)["text"] for line in f] == DATA, "data.jsonl is not make_fixtures.py's"
    rows = tokenize_rows(sp)
    out = {"model": model_name, "runs": []}
    final = {}
    for name, mode, hp in runs:
        print(f"== {name}")
        if mode == "lora":
            model, named = load_lora64(folder)
        else:
            model = load_base(folder, torch.float64)
            named = list(base_state(model).items())
            for _, p in named:
                p.requires_grad_(True)
        model.train()
        steps = train(model, named, rows, hp)
        for k, p in named:
            final[f"{name}.final.{k}"] = p.detach().to(torch.float32).contiguous()
        out["runs"].append({"name": name, "mode": mode, "hparams": hp, "steps": steps, **(record(named) if record else {})})
    save_file(dict(sorted(final.items())), f"{folder}/ref/{out_name}.safetensors")
    with open(f"{folder}/ref/{out_name}.json", "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print("done")


def hparams(spec_train):
    return {"lr": spec_train["lr"], "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
            "warmup_steps": WARMUP, "lr_scheduler": "cosine", "grad_clip": spec_train["grad_clip"],
            "max_steps": STEPS}


# ---------------------------------------------------------------------------
# independent float64 forward (checks the patched HF model)

def check_forward(model, tokens, logits):
    c = model.config
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    H, nh, nkv, hd = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
    Bn, T = tokens.shape
    theta = c.rope_parameters["rope_theta"]
    # plain RoPE from its formula; scaled RoPE's frequencies are transformers' definition itself
    scaled = None if c.rope_parameters["rope_type"] == "default" else inv_freq_of(c)

    def rms(x, w):
        return w * x / torch.sqrt((x * x).mean(-1, keepdim=True) + c.rms_norm_eps)

    def rope(x):  # x [B, h, T, hd], pairs (i, i + hd/2)
        inv = theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd) if scaled is None else scaled
        ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
        cos, sin = ang.cos(), ang.sin()
        x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

    x = sd["model.embed_tokens.weight"][tokens]
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    if getattr(c, "sliding_window", None):  # query i sees keys i - W + 1 .. i
        mask |= torch.tril(torch.ones(T, T, dtype=torch.bool), -c.sliding_window)
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        h = rms(x, sd[p + "input_layernorm.weight"])
        q = (h @ sd[p + "self_attn.q_proj.weight"].T).view(Bn, T, nh, hd).transpose(1, 2)
        k = (h @ sd[p + "self_attn.k_proj.weight"].T).view(Bn, T, nkv, hd).transpose(1, 2)
        v = (h @ sd[p + "self_attn.v_proj.weight"].T).view(Bn, T, nkv, hd).transpose(1, 2)
        q, k = rope(q), rope(k)
        k = k.repeat_interleave(nh // nkv, dim=1)
        v = v.repeat_interleave(nh // nkv, dim=1)
        a = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        a = torch.softmax(a.masked_fill(mask, float("-inf")), -1)
        o = (a @ v).transpose(1, 2).reshape(Bn, T, nh * hd)
        x = x + o @ sd[p + "self_attn.o_proj.weight"].T
        h = rms(x, sd[p + "post_attention_layernorm.weight"])
        g = h @ sd[p + "mlp.gate_proj.weight"].T
        u = h @ sd[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(g) * u) @ sd[p + "mlp.down_proj.weight"].T
    x = rms(x, sd["model.norm.weight"])
    head = sd["model.embed_tokens.weight"] if c.tie_word_embeddings else sd["lm_head.weight"]
    ref = x @ head.T
    err = (ref - logits).abs().max().item()
    print(f"    independent float64 forward vs HF: max abs diff {err:.3e}")
    assert err < 1e-10, err


def vocab_rows(expected, rows, V, stride):
    """The expected tensors with a vocabulary axis (the logits' last; the embedding's and
    the head's first) at the rows of vocab_index only: every stride-th, the last, and every
    token of the data; vocab_index (I32) says which, for the C test to pick the same."""
    index = torch.tensor(sorted(set(range(0, V, stride)) | {V - 1} | {t for r in rows for t in r}), dtype=torch.int32)
    out = {"vocab_index": index}
    for k, v in expected.items():
        if k.endswith(".logits"):
            v = v[..., index.long()]
        elif k.endswith(("embed_tokens.weight", "lm_head.weight")):
            v = v[index.long()]
        out[k] = v
    print(f"    vocabulary axis stored at {len(index)} of {V} rows")
    return out


def print_rope(c):
    """Each RoPE frequency with its band under llama3 scaling: high (kept), blended, low (divided)."""
    p = c.rope_parameters
    print(f"    rope: {json.dumps(p, sort_keys=True)}")
    if p["rope_type"] != "llama3":
        return
    plain = ml.LlamaRotaryEmbedding.compute_default_rope_parameters(c)[0]
    old = p["original_max_position_embeddings"]
    bands = []
    for f, g in zip(plain.tolist(), inv_freq_of(c).tolist()):
        wavelen = 2 * math.pi / f
        band = "high" if wavelen < old / p["high_freq_factor"] else "low" if wavelen > old / p["low_freq_factor"] else "blended"
        bands.append(band)
        print(f"      inv_freq {f:.6e} wavelength {wavelen:10.1f}: {band:7s} -> {g:.6e} (x{g / f:.4f})")
    assert set(bands) == {"high", "blended", "low"}, bands


def what_it_changes(base, tokens, logits):
    """The largest change of the logits, relative to their largest, were the model's RoPE
    scaling or sliding window ignored: what makes the fixture a test of them."""
    c = copy.deepcopy(base.config)
    if c.rope_parameters["rope_type"] != "default":
        c.rope_parameters = {"rope_type": "default", "rope_theta": c.rope_parameters["rope_theta"]}
    elif getattr(c, "sliding_window", None):
        c.sliding_window = None
    else:
        return
    c._attn_implementation = "eager"
    plain = type(base)(c).to(torch.float64)
    plain.load_state_dict(base.state_dict())
    with torch.no_grad():
        d = (forward_logits(plain, tokens) - logits).abs().max() / logits.abs().max()
    print(f"    without its RoPE scaling / sliding window the logits would change by {d.item():.3e} of their largest")
    assert d > 1e-2, d  # far beyond the C tests' tolerance of 1e-4


# ---------------------------------------------------------------------------

def make_model(name, spec, sp_bytes, rows, versions):
    folder = f"{FIX}/{name}"
    print(f"== {name}")
    if os.path.isdir(folder):
        shutil.rmtree(folder)
    os.makedirs(folder + "/ref")

    # base model, bf16-representable values, saved as the HF folder
    model = build_model(spec)
    model_save = model if spec["save_dtype"] == torch.float32 else build_model(spec).to(spec["save_dtype"])
    kw = {} if spec["max_shard_size"] is None else {"max_shard_size": spec["max_shard_size"]}
    model_save.save_pretrained(folder, **kw)
    with open(folder + "/tokenizer.model", "wb") as f:
        f.write(sp_bytes)
    ref_weights = {k: v.detach().clone() for k, v in base_state(model).items()}

    # check what got written
    files = sorted(os.listdir(folder))
    print("    files:", files)
    st_files = [f for f in files if f.endswith(".safetensors")]
    on_disk = {}
    for f in st_files:
        for k, v in load_file(f"{folder}/{f}").items():
            assert v.dtype == spec["save_dtype"], (k, v.dtype)
            on_disk[k] = v
    if spec["max_shard_size"]:
        assert len(st_files) >= 2 and "model.safetensors.index.json" in files, files
    else:
        assert st_files == ["model.safetensors"], files
    assert set(on_disk) == set(ref_weights), set(on_disk) ^ set(ref_weights)
    for k, v in on_disk.items():
        assert torch.equal(v.float(), ref_weights[k]), k
    cfg_json = json.load(open(folder + "/config.json"))
    print("    config.json:", json.dumps(cfg_json, sort_keys=True))

    # float64 reference base model, loaded back from the folder
    arch = spec.get("arch", "llama")
    base = load_base(folder, torch.float64, arch)
    print_rope(base.config)
    for k, p in base_state(base).items():
        assert torch.equal(p.detach(), ref_weights[k].double()), k
    if base.config.tie_word_embeddings:
        assert base.lm_head.weight is base.model.embed_tokens.weight
    assert base.config.rope_parameters["rope_theta"] == spec["config"]["rope_theta"]
    assert base.config.rms_norm_eps == spec["config"]["rms_norm_eps"]
    assert base.config.rope_parameters["rope_type"] == spec["config"].get("rope_scaling", {}).get("rope_type", "default")
    assert getattr(base.config, "sliding_window", None) == spec["config"].get("sliding_window")

    mbs0 = step_microbatches(rows, 0)
    batch = {}
    for m, (tok, tgt) in enumerate(mbs0):
        batch[f"tokens_{m}"] = tok.to(torch.int32).contiguous()
        batch[f"targets_{m}"] = tgt.to(torch.int32).contiguous()
    save_file(batch, folder + "/ref/batch.safetensors")
    tok0 = mbs0[0][0]

    expected = {}
    out = {"max_seq_len": MAX_SEQ_LEN, "batch_size": B, "gradient_accumulation_steps": GA, "pad_id": PAD_ID}

    # ---- full fine-tuning
    base.train()
    with torch.no_grad():
        full_logits = forward_logits(base, tok0)
    check_forward(base, tok0, full_logits)
    what_it_changes(base, tok0, full_logits)
    expected["full.logits"] = full_logits
    named = list(base_state(base).items())
    for _, p in named:
        p.requires_grad_(True)
    loss0 = step_grads(base, [p for _, p in named], mbs0)
    for k, p in named:
        expected["full.grad." + k] = p.grad.clone()
    hp_full = hparams(spec["train"]["full"])
    print(f"    full: step-0 loss {loss0!r}")
    full_steps = train(base, named, rows, hp_full)
    assert full_steps[0]["loss"] == loss0
    for k, p in named:
        expected["full.final." + k] = p.detach().clone()
    out_full = {"loss": loss0, "steps": full_steps}

    # ---- LoRA: create with peft (float32), save the initial adapter
    pm, _ = peft_adapter(folder, spec, spec["lora_seed"])
    save_adapter(pm, folder + "/peft_init")
    adapter = load_file(folder + "/peft_init/adapter_model.safetensors")
    assert all(v.dtype == torch.float32 for v in adapter.values())
    n_expect = spec["config"]["num_hidden_layers"] * len(spec["lora"]["target_modules"]) * 2
    assert len(adapter) == n_expect, sorted(adapter)

    # float64 LoRA reference: fresh float64 base from the folder + the saved adapter
    lm, lora_named = load_lora64(folder, arch)
    assert sorted(k for k, _ in lora_named) == sorted(adapter), "peft key mismatch"
    for k, p in lora_named:
        assert torch.equal(p.detach(), adapter[k].double()), k
    lm.train()
    with torch.no_grad():
        lora_logits = forward_logits(lm, tok0)
    expected["lora.logits"] = lora_logits
    print(f"    LoRA vs base logits max abs diff {(lora_logits - full_logits).abs().max().item():.4f}")
    lparams = [p for _, p in lora_named]
    lloss0 = step_grads(lm, lparams, mbs0)
    for k, p in lora_named:
        assert p.grad is not None and p.grad.abs().max() > 0, k
        expected["lora.grad." + k] = p.grad.clone()
    for n, p in lm.named_parameters():
        assert p.requires_grad or p.grad is None, n
    hp_lora = hparams(spec["train"]["lora"])
    print(f"    lora: step-0 loss {lloss0!r}")
    lora_steps = train(lm, lora_named, rows, hp_lora)
    assert lora_steps[0]["loss"] == lloss0
    for k, p in lora_named:
        expected["lora.final." + k] = p.detach().clone()

    out["lora"] = {"r": spec["lora"]["r"], "alpha": spec["lora"]["lora_alpha"],
                   "targets": spec["lora"]["target_modules"], "loss": lloss0, "steps": lora_steps}
    out["full"] = out_full
    out["train"] = {"lora": hp_lora, "full": hp_full}
    out["versions"] = versions

    if spec.get("vocab_sample"):
        expected = vocab_rows(expected, rows, spec["config"]["vocab_size"], spec["vocab_sample"])
    save_file({k: v.detach().to(v.dtype if k == "vocab_index" else torch.float32).contiguous()
               for k, v in sorted(expected.items())}, folder + "/ref/expected.safetensors")
    with open(folder + "/ref/expected.json", "w") as f:
        json.dump(out, f, indent=1)  # json writes floats with repr (shortest round-trip, full float64)
        f.write("\n")

    # ---- reload checks
    r32 = load_base(folder, torch.float32, arch)
    with torch.no_grad():
        l32 = forward_logits(r32.double(), tok0)
    assert (l32 - full_logits).abs().max().item() < 1e-12
    base64b = load_base(folder, torch.float64, arch)
    lm2 = PeftModel.from_pretrained(base64b, folder + "/peft_init").double()
    with torch.no_grad():
        l2 = forward_logits(lm2, tok0)
    assert (l2 - lora_logits).abs().max().item() < 1e-12
    return out


def main():
    os.chdir(ROOT)
    versions = {"python": sys.version.split()[0], "torch": torch.__version__,
                "transformers": transformers.__version__, "peft": peft.__version__,
                "sentencepiece": spm.__version__, "safetensors": safetensors.__version__,
                "numpy": np.__version__}
    print("versions:", versions)

    sp_bytes = train_tokenizer()
    sp = spm.SentencePieceProcessor(model_proto=sp_bytes)
    assert sp.get_piece_size() == 512 and sp.bos_id() == 1 and sp.eos_id() == 2 and sp.unk_id() == 0
    rows = tokenize_rows(sp)
    print("data rows:")
    for text, r in zip(DATA, rows):
        n = len(sp.encode(text)) + 2
        print(f"  {n:3d} ids{' (truncated)' if n > MAX_SEQ_LEN else ''}: {text!r} -> {sp.encode(text, out_type=str)}")
    full_lens = [len(sp.encode(t)) for t in DATA]
    assert sum(3 <= n <= 8 for n in full_lens) >= 2, full_lens
    assert sum(n + 2 > MAX_SEQ_LEN for n in full_lens) >= 2, full_lens
    # step 0: micro-batch 0 is padded to max_seq_len, micro-batch 1 to a shorter length
    assert len(rows[0]) == MAX_SEQ_LEN and max(len(rows[2]), len(rows[3])) < MAX_SEQ_LEN
    os.makedirs(FIX, exist_ok=True)
    with open(f"{FIX}/data.jsonl", "w", encoding="utf-8") as f:
        for text in DATA:
            f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")

    for name, spec in MODELS.items():
        make_model(name, spec, sp_bytes, rows, versions)
    print("done")


if __name__ == "__main__":
    main()
