#!/usr/bin/env python3
"""Adapters cross between our trainer and peft, both ways, on a tiny fixture model.

  make train_llama2 && python3 dev/reference/check_peft_roundtrip.py

1. ours -> peft: train_llama2 trains a LoRA adapter (all-linear, with dropout) for
   a few steps and saves it; PeftModel.from_pretrained loads it and computes the
   validation loss in float64, which must equal the val_loss our trainer reported
   after its last step (same weights, same data).
2. peft -> ours: the adapter peft itself saved (test/fixtures/tiny_gqa/peft_init)
   is loaded by train_llama2 with --max_steps 0, whose val_loss must equal what
   transformers + peft compute with the same adapter.
Both again with DoRA (--use_dora; peft's test/fixtures/tiny_gqa/dora/peft_init), and
with IA3 (--peft_method ia3 on every module, gate_proj and down_proj feedforward;
peft's test/fixtures/tiny_gqa/ia3/peft_init: k_proj, v_proj, down_proj), with
llama_adapter (--peft_method llama_adapter, 4 prompt rows in both layers, its gates trained
off 0; peft's test/fixtures/tiny_gqa/llama_adapter/peft_init: 3 rows in the top layer), with
prefix (--peft_method prefix, 6 virtual tokens; peft's test/fixtures/tiny_gqa/prefix/peft_init: 3), and
with --trainable_params embed,norm (peft's modules_to_save; <model>/trainable/peft_init) on
tiny_gqa and on tiny_tied, whose head is the trained embedding (ensure_weight_tying).
Tolerance: 1e-5 relative (our fp32 against float64).

  python3 dev/reference/check_peft_roundtrip.py --qlora

does the same for QLoRA (LoRA both ways, IA3, llama_adapter and prefix ours -> peft): our trainer with --quantize nf4 on test/fixtures/tiny_qlora,
and peft on that checkpoint loaded by transformers in 4 bits with
BitsAndBytesConfig(nf4, double quantization, fp32 compute), which computes in fp32
(tolerance 1e-5 relative all the same: both sides' rounding is ~1e-7). The model runs in
training mode with dropout off: in eval mode bitsandbytes 0.50.2 on a CPU with
AVX-512 BF16 takes an inference kernel whose products are not its dequantized fp32
weights' (dev/reference/make_qlora_fixtures.py).
Needs torch, transformers, peft, sentencepiece (and bitsandbytes for --qlora; not needed by CI).
"""
import json, math, os, subprocess, sys, tempfile
import torch
import sentencepiece as spm
from transformers import BitsAndBytesConfig, LlamaForCausalLM
from peft import PeftModel

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QLORA = "--qlora" in sys.argv[1:]
MODEL = os.path.join(ROOT, "test/fixtures/tiny_qlora" if QLORA else "test/fixtures/tiny_gqa")
DATA = os.path.join(ROOT, "test/fixtures/data.jsonl")
MAX_LEN = 24


def val_loss_torch(adapter_dir, model_dir=MODEL):
    """mean cross-entropy over every label token of DATA, rows BOS + text + EOS truncated to MAX_LEN"""
    if QLORA:
        q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                               bnb_4bit_compute_dtype=torch.float32)
        base = LlamaForCausalLM.from_pretrained(MODEL, attn_implementation="eager", dtype=torch.float32,
                                                quantization_config=q, device_map="cpu")
        model = PeftModel.from_pretrained(base, adapter_dir).train()
        for m in model.modules():
            if isinstance(m, torch.nn.Dropout):
                m.p = 0.0
    else:
        base = LlamaForCausalLM.from_pretrained(model_dir, attn_implementation="eager", dtype=torch.float64)
        model = PeftModel.from_pretrained(base, adapter_dir).double().eval()
    sp = spm.SentencePieceProcessor(model_file=os.path.join(model_dir, "tokenizer.model"))
    total, count = 0.0, 0
    with open(DATA) as f, torch.no_grad():
        for line in f:
            if not line.strip():
                continue
            ids = ([sp.bos_id()] + sp.encode(json.loads(line)["text"]) + [sp.eos_id()])[:MAX_LEN]
            logits = model(torch.tensor([ids])).logits[0]
            logp = torch.log_softmax(logits.double(), dim=-1)
            total += -sum(logp[t, ids[t + 1]].item() for t in range(len(ids) - 1))
            count += len(ids) - 1
    return total / count


def run_ours(args, model_dir=MODEL):
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "m.jsonl")
        cmd = [os.path.join(ROOT, "train_llama2"), "--model", model_dir, "--data", DATA, "--val_data", DATA,
               "--max_seq_len", str(MAX_LEN), "--metrics_file", metrics] + (["--quantize", "nf4"] if QLORA else []) + args
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        recs = [json.loads(l) for l in open(metrics)]
    return [r for r in recs if "val_loss" in r][-1]["val_loss"]


def report(name, ours, ref):
    rel = abs(ours - ref) / abs(ref)
    ok = rel <= 1e-5
    print(f"{'ok' if ok else 'FAIL'} {name}: ours {ours:.9f}, transformers+peft {ref:.9f}, rel {rel:.2e}")
    return ok


def main():
    ok = True
    lora = ["--lora_r", "4", "--lora_alpha", "8", "--lora_dropout", "0.1", "--lora_target_modules", "all-linear"]
    ia3 = ["--peft_method", "ia3", "--ia3_target_modules", "all-linear", "--ia3_feedforward_modules", "gate_proj,down_proj"]
    adapter = ["--peft_method", "llama_adapter", "--adapter_len", "4", "--adapter_layers", "2"]
    prefix = ["--peft_method", "prefix", "--num_virtual_tokens", "6"]
    kinds = [("LoRA", lora, "peft_init", MODEL), ("DoRA", lora + ["--use_dora"], "dora/peft_init", MODEL),
             ("IA3", ia3, "ia3/peft_init", MODEL), ("llama_adapter", adapter, "llama_adapter/peft_init", MODEL),
             ("prefix", prefix, "prefix/peft_init", MODEL)]
    if QLORA:  # (tiny_qlora has LoRA's adapter from peft only; IA3, llama_adapter and prefix cross one way, ours -> peft)
        kinds = [kinds[0], kinds[2], kinds[3], kinds[4]]
    else:  # (--trainable_params is not with --quantize)
        kinds += [(f"LoRA + embed,norm ({os.path.basename(m)})", lora + ["--trainable_params", "embed,norm"], "trainable/peft_init", m)
                  for m in (MODEL, os.path.join(ROOT, "test/fixtures/tiny_tied"))]
    for kind, flags, init, model_dir in kinds:
        with tempfile.TemporaryDirectory() as out:
            ours = run_ours(["--output_dir", out, "--max_steps", "5", "--lr", "1e-2", "--batch_size", "2"] + flags, model_dir)
            ok &= report(f"{kind} adapter saved by train_llama2, loaded by PeftModel.from_pretrained", ours,
                         val_loss_torch(out, model_dir))
        init = os.path.join(model_dir, init)
        if not os.path.isdir(init):
            continue
        with tempfile.TemporaryDirectory() as out:
            ours = run_ours(["--output_dir", out, "--max_steps", "0", "--from_peft_checkpoint", init], model_dir)
        ok &= report(f"{kind} adapter saved by peft, loaded by train_llama2", ours, val_loss_torch(init, model_dir))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
