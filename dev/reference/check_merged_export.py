#!/usr/bin/env python3
"""--merge_adapter's export loads in transformers and gives the logits of base + adapter.

  make train_llama2 && python3 dev/reference/check_merged_export.py

train_llama2 trains a LoRA adapter (all-linear) on the tiny fixture model for a few
steps with --merge_adapter. transformers then loads OUTPUT/merged as a plain
LlamaForCausalLM, and the base model with the adapter through PeftModel; both run
in float64 on the same random tokens. Tolerance: 1e-5 of the logits' scale (the
merged weights are fp32 sums W + s B A; the float64 PeftModel path computes
W x + s B (A x) exactly). The adapter must move the logits by far more than that.
Then the same with DoRA (--use_dora): our merge rescales each row by m / ||W + s B A||,
which must give what peft's DoRA forward computes. And with IA3 (--peft_method ia3, every
module, gate_proj and down_proj feedforward): our merge scales W's columns or rows by
the vectors; besides the logits, each merged weight must equal peft's merge_and_unload
of the same adapter (float64) to 1e-6 of the weight's scale (ours is one fp32 product).
And with --trainable_params embed,norm, whose trained embedding and norms (peft's
modules_to_save) the merged model holds. And QLoRA (--quantize nf4 on tiny_qlora): the merged
folder must be the dequantized base plus the merged adapter, what peft's merge_and_unload
gives on the model whose 4-bit weights are replaced by bitsandbytes' own dequantization of
them (test/fixtures/tiny_qlora/ref/expected.safetensors' deq.* tensors, written by
make_qlora_fixtures.py with bitsandbytes): logits and every weight, as for IA3.
Needs torch, transformers, peft (not needed by CI).
"""
import os, subprocess, sys, tempfile
import torch
from transformers import LlamaForCausalLM
from peft import PeftModel

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "test/fixtures/tiny_gqa")


LORA = ["--lora_target_modules", "all-linear", "--lora_dropout", "0"]
IA3 = ["--peft_method", "ia3", "--ia3_target_modules", "all-linear", "--ia3_feedforward_modules", "gate_proj,down_proj"]


QLORA = os.path.join(ROOT, "test/fixtures/tiny_qlora")


def load_base(model):
    """the base model in float64; tiny_qlora's linear weights as bitsandbytes dequantizes them"""
    base = LlamaForCausalLM.from_pretrained(model, dtype=torch.float64)
    if model == QLORA:
        from safetensors.torch import load_file
        weights = base.state_dict()
        deq = {k[4:]: v for k, v in load_file(os.path.join(QLORA, "ref/expected.safetensors")).items() if k.startswith("deq.")}
        assert len(deq) == 7 * base.config.num_hidden_layers
        with torch.no_grad():
            for name, w in deq.items():
                weights[name].copy_(w.double())
    return base


def merge_matches_peft(out, merged, model):
    """each weight of our merged model against peft's merge_and_unload of our adapter"""
    base = load_base(model)
    theirs = PeftModel.from_pretrained(base, out).double().merge_and_unload().state_dict()
    worst = 0.0
    for name, w in merged.state_dict().items():
        ref = theirs[name]
        worst = max(worst, ((w - ref).abs().max() / ref.abs().max()).item())
    ok = worst <= 1e-6
    print(f"  merged weights vs peft's merge_and_unload (float64): worst {worst:.3e} of a weight's scale: "
          f"{'ok' if ok else 'FAIL'}")
    return ok


def check(flags, model=MODEL):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out")
        subprocess.run([os.path.join(ROOT, "train_llama2"), "--model", model, "--data",
                        os.path.join(ROOT, "test/fixtures/data.jsonl"), "--max_seq_len", "24", "--max_steps", "8",
                        "--lr", "1e-2", "--threads", "1",
                        "--data_cache_dir", tmp, "--output_dir", out, "--merge_adapter"] + flags,
                       check=True, stdout=subprocess.DEVNULL)
        torch.manual_seed(0)
        ids = torch.randint(0, 512, (2, 24))
        with torch.no_grad():
            merged = LlamaForCausalLM.from_pretrained(os.path.join(out, "merged"), dtype=torch.float64).eval()
            base = load_base(model)
            peft = PeftModel.from_pretrained(base, out).double().eval()
            a, b = merged(ids).logits, peft(ids).logits
            plain = load_base(model).eval()(ids).logits
        err, scale, effect = (a - b).abs().max().item(), b.abs().max().item(), (b - plain).abs().max().item()
        ok = err <= 1e-5 * scale and effect > 1e3 * err
        print(f"{' '.join(flags)}: merged vs base + adapter (transformers, float64): max err {err:.3e} of "
              f"scale {scale:.3e}; the adapter moves logits by {effect:.3e}: {'ok' if ok else 'FAIL'}")
        if flags == IA3 or model == QLORA:
            ok &= merge_matches_peft(out, merged, model)
        return ok


def main():
    ok = check(LORA)
    ok &= check(LORA + ["--use_dora"])
    ok &= check(IA3)
    ok &= check(LORA + ["--trainable_params", "embed,norm"])
    ok &= check(LORA + ["--quantize", "nf4"], QLORA)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
