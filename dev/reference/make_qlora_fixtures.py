#!/usr/bin/env python3
# Regenerate (from the repository root, CPU only, no network):
#
#     python3 dev/reference/make_qlora_fixtures.py
#
# QLoRA's reference, computed by the real thing: transformers + peft with
# BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
# bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=float32) on the CPU
# (bitsandbytes 0.50.2 runs there: dev/reference/README.md). Writes
# test/fixtures/tiny_qlora/:
#   config.json, model.safetensors (BF16, as Llama checkpoints are), tokenizer.model
#       (tiny_gqa's), a tiny random Llama whose every linear layer has a row length
#       that is a multiple of 64 (bitsandbytes' AVX-512 dequantize misreads others:
#       dev/reference/README.md)
#   peft_init/  a LoRA adapter on all seven linear layers, r 4, alpha 8, saved by peft from
#       the 4-bit model; lora_B is drawn at random (peft starts it at 0) so that every
#       lora_A has a gradient too
#   ref/expected.safetensors:
#       tokens, targets    I32 (2, 16) one batch (targets -100: no loss)
#       logits             F32 (2, 16, 512) of the 4-bit model with the adapter
#       loss               F32 (1) the mean cross-entropy over the targets
#       grad.<peft key>    F32 d loss / d every LoRA tensor
#       deq.<hf name>      F32 each 4-bit weight as bitsandbytes dequantizes it for the products
#   prequantized/  config.json and model.safetensors of the 4-bit model as save_pretrained
#       writes it (uint8 weights with .absmax, .quant_map, .quant_state... tensors): the
#       trainer must refuse it by name
# The model computes in fp32 (bitsandbytes dequantizes to fp32, no float64), so the C
# test's tolerances are fp32's (test/test_qlora.c).
import json
import os
import shutil

import numpy as np
import torch

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)
import bitsandbytes as bnb
import bitsandbytes.functional as F
import peft
import transformers
from peft import LoraConfig, get_peft_model
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = "test/fixtures/tiny_qlora"  # relative: it ends up in adapter_config.json's base_model_name_or_path
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
B, T = 2, 16


def main():
    os.chdir(ROOT)
    print("bitsandbytes", bnb.__version__, "transformers", transformers.__version__, "peft", peft.__version__)
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    torch.manual_seed(7)
    config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
                         rms_norm_eps=1e-5, initializer_range=0.1, tie_word_embeddings=False, bos_token_id=1,
                         eos_token_id=2)
    base = LlamaForCausalLM(config).to(torch.bfloat16)
    base.save_pretrained(OUT, safe_serialization=True)
    os.remove(os.path.join(OUT, "generation_config.json"))
    shutil.copy("test/fixtures/tiny_gqa/tokenizer.model", OUT)

    bnb_config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                    bnb_4bit_compute_dtype=torch.float32)
    model = AutoModelForCausalLM.from_pretrained(OUT, quantization_config=bnb_config, device_map="cpu",
                                                 dtype=torch.float32)
    pre = os.path.join(OUT, "prequantized")
    model.save_pretrained(pre, safe_serialization=True)
    for f in os.listdir(pre):
        if f not in ("config.json", "model.safetensors"):
            os.remove(os.path.join(pre, f))

    ref = {}
    same = 0
    for name, mod in model.named_modules():
        if isinstance(mod, bnb.nn.Linear4bit):
            w, qs = mod.weight, mod.weight.quant_state
            assert qs.quant_type == "nf4" and qs.nested and qs.blocksize == 64 and qs.dtype == torch.float32
            ref["deq." + name + ".weight"] = F.dequantize_4bit(w.data, qs).contiguous()
            _, plain = F.quantize_4bit(base.get_submodule(name).weight.float(), blocksize=64, quant_type="nf4")
            same += bool(np.float32(np.float32(plain.absmax.double().sum().item()) / np.float32(plain.absmax.numel()))
                         == qs.offset.item())
    print(f"{same} of {len(TARGETS) * config.num_hidden_layers} offsets equal the correctly rounded sum / n")

    lcfg = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=TARGETS, bias="none", task_type="CAUSAL_LM")
    pm = get_peft_model(model, lcfg)
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    pm.save_pretrained(os.path.join(OUT, "peft_init"))
    os.remove(os.path.join(OUT, "peft_init", "README.md"))
    cfg_path = os.path.join(OUT, "peft_init", "adapter_config.json")  # peft writes the targets in set order
    with open(cfg_path) as f:
        acfg = json.load(f)
    acfg["target_modules"] = sorted(acfg["target_modules"])
    with open(cfg_path, "w") as f:
        json.dump(acfg, f, indent=2, sort_keys=True)

    # training mode, as QLoRA trains: in eval mode with inputs that need no gradient,
    # bitsandbytes 0.50.2 on a CPU with AVX-512 BF16 repacks the weight for an inference
    # kernel whose products are not dequantize_4bit's fp32 (logits off by ~1e-2)
    pm.train()
    tokens = torch.randint(3, config.vocab_size, (B, T), generator=g)
    targets = torch.cat([tokens[:, 1:], torch.full((B, 1), -100)], dim=1)
    targets[1, 11:] = -100  # a shorter second row
    logits = pm(input_ids=tokens).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, config.vocab_size), targets.reshape(-1),
                                             ignore_index=-100)
    loss.backward()
    ref["tokens"] = tokens.to(torch.int32)
    ref["targets"] = targets.to(torch.int32)
    ref["logits"] = logits.detach().float().contiguous()
    ref["loss"] = loss.detach().reshape(1).float()
    for n, p in pm.named_parameters():
        if p.requires_grad:
            key = n.replace(".default.weight", ".weight")
            ref["grad." + key] = p.grad.float().contiguous()
    os.makedirs(os.path.join(OUT, "ref"))
    save_file(ref, os.path.join(OUT, "ref", "expected.safetensors"))
    print("loss", loss.item(), "wrote", OUT)


if __name__ == "__main__":
    main()
