#!/usr/bin/env python3
# Regenerate (from the repository root, no network needed):
#
#     python3 dev/reference/make_config_fixtures.py
#
# Reads every test/fixtures/configs/<name>/config.json (the config.json files of
# Llama-2-70B, Llama-3/3.1/3.2, Mistral, CodeLlama and TinyLlama checkpoints, written from their
# published values) with transformers' AutoConfig, as from_pretrained reads them, and
# writes test/fixtures/configs/expected.json: for each, the fields transformers
# parsed and RoPE's inverse frequencies as transformers computes them (float32),
# plain (before any scaling) and final, from the model's own rotary embedding.
# test/test_config.c compares config_load and rope_inv_freq with these.
import json
import os
import sys

import torch
import transformers
from transformers import AutoConfig
from transformers.models.llama import modeling_llama as ml
from transformers.models.mistral import modeling_mistral as mm

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DIR = "test/fixtures/configs"
ROTARY = {"llama": ml.LlamaRotaryEmbedding, "mistral": mm.MistralRotaryEmbedding}


def parsed(c):
    rope = c.rope_parameters
    out = {"model_type": c.model_type, "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
           "num_hidden_layers": c.num_hidden_layers, "num_attention_heads": c.num_attention_heads,
           "num_key_value_heads": c.num_key_value_heads, "head_dim": c.head_dim, "vocab_size": c.vocab_size,
           "max_position_embeddings": c.max_position_embeddings, "rms_norm_eps": c.rms_norm_eps,
           "tie_word_embeddings": c.tie_word_embeddings, "rope_type": rope["rope_type"],
           "rope_theta": float(rope["rope_theta"]),
           "sliding_window": getattr(c, "sliding_window", None)}
    for k in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
        if k in rope:
            out[k] = rope[k]
    rotary = ROTARY[c.model_type]
    plain = rotary.compute_default_rope_parameters(c)[0]
    final = rotary(c).inv_freq
    assert plain.dtype == final.dtype == torch.float32
    # float32 values are exact as Python floats, and json writes those exactly (repr)
    out["inv_freq_plain"] = plain.tolist()
    out["inv_freq"] = final.tolist()
    return out


def main():
    os.chdir(ROOT)
    torch.set_num_threads(1)
    versions = {"python": sys.version.split()[0], "torch": torch.__version__, "transformers": transformers.__version__}
    configs = {}
    for name in sorted(os.listdir(DIR)):
        if os.path.isfile(f"{DIR}/{name}/config.json"):
            configs[name] = parsed(AutoConfig.from_pretrained(f"{DIR}/{name}"))
            c = configs[name]
            print(f"{name}: {c['model_type']} {c['num_hidden_layers']} layers, dim {c['hidden_size']}, "
                  f"{c['num_attention_heads']}/{c['num_key_value_heads']} heads of {c['head_dim']}, "
                  f"vocab {c['vocab_size']}, rope {c['rope_type']} theta {c['rope_theta']:g}, "
                  f"tied {c['tie_word_embeddings']}, window {c['sliding_window']}")
    with open(f"{DIR}/expected.json", "w") as f:
        json.dump({"versions": versions, "configs": configs}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
