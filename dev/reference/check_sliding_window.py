#!/usr/bin/env python3
# An independent check of the sliding window (Mistral's `sliding_window`), not a
# fixture: run from the repository root after `make train_llama2`,
#
#     python3 dev/reference/check_sliding_window.py
#
# test/fixtures/tiny_gqa's weights, tokenizer and initial adapter become a Mistral
# folder (config.json: model_type mistral, "sliding_window": 5, shorter than every
# micro-batch of the fixture data). transformers' MistralForCausalLM (eager
# attention, whose mask carries the window) trains it in float64 for 10 AdamW
# steps, full fine-tuning and LoRA from the adapter, with make_fixtures.py's data,
# batches and hyperparameters; train_llama2 trains the same folder whole and in
# chunks of 1, 4 and 7 (the window crosses chunk boundaries). Printed: each run's
# worst relative difference of the step losses and gradient norms, and the same
# for transformers without the window (to show that the window binds).
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402  (patches Llama's modules only; Mistral's are patched below)
import sentencepiece as spm  # noqa: E402
from peft import PeftModel  # noqa: E402
from transformers import MistralForCausalLM  # noqa: E402
from transformers.models.mistral import modeling_mistral as mm  # noqa: E402

WINDOW = 5
# float64 throughout, as make_fixtures.py does for Llama (see its note)
mm.MistralRMSNorm.forward = mf._rmsnorm_forward
mm.MistralRotaryEmbedding.forward = mf._rope_forward
mm.eager_attention_forward = mf._eager_attention_forward


def mistral_folder(dst, window):
    """tiny_gqa as a Mistral folder (window None: plain causal)."""
    src = f"{mf.FIX}/tiny_gqa"
    for name in ("model.safetensors", "tokenizer.model"):
        shutil.copy(f"{src}/{name}", dst)
    shutil.copytree(f"{src}/peft_init", f"{dst}/peft_init")
    cfg = json.load(open(f"{src}/config.json"))
    cfg.update(model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=window)
    with open(f"{dst}/config.json", "w") as f:
        json.dump(cfg, f, indent=1)


def hf_steps(folder, rows, lora):
    model = MistralForCausalLM.from_pretrained(folder, dtype=torch.float64, attn_implementation="eager")
    assert model.config._attn_implementation == "eager"
    if lora:
        model = PeftModel.from_pretrained(model, f"{folder}/peft_init", is_trainable=True).double()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    model.train()
    hp = mf.hparams(mf.MODELS["tiny_gqa"]["train"]["lora" if lora else "full"])
    # make_fixtures.train asserts that clipping acts on some steps, not all, and that no norm
    # is near the threshold; with the window LoRA's norms are 0.84 .. 1.09, all below 1.1
    hp["grad_clip"] = 1.06 if lora else hp["grad_clip"]
    return mf.train(model, named, rows, hp), hp


def ours(folder, hp, lora, chunk, work):
    metrics = f"{work}/metrics_{lora}_{chunk}.jsonl"
    args = ["./train_llama2", "--model", folder, "--data", f"{mf.FIX}/data.jsonl", "--max_seq_len", str(mf.MAX_SEQ_LEN),
            "--batch_size", str(mf.B), "--gradient_accumulation_steps", str(mf.GA), "--shuffle", "0",
            "--lr", repr(hp["lr"]), "--weight_decay", repr(hp["weight_decay"]), "--adam_beta1", repr(hp["beta1"]),
            "--adam_beta2", repr(hp["beta2"]), "--adam_epsilon", repr(hp["eps"]),
            "--warmup_steps", str(hp["warmup_steps"]), "--grad_clip", repr(hp["grad_clip"]),
            "--max_steps", str(hp["max_steps"]), "--lr_scheduler", hp["lr_scheduler"], "--chunk_size", str(chunk),
            "--output_dir", f"{work}/out", "--metrics_file", metrics, "--threads", "1"]
    args += ["--from_peft_checkpoint", f"{folder}/peft_init", "--lora_dropout", "0"] if lora else ["--full_finetune"]
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
    return [json.loads(line) for line in open(metrics) if '"loss"' in line]


def worst(a, b, key):
    return max(abs(x[key] - y[key]) / abs(y[key]) for x, y in zip(a, b))


def main():
    os.chdir(mf.ROOT)
    sp = spm.SentencePieceProcessor(model_file=f"{mf.FIX}/tiny_gqa/tokenizer.model")
    rows = mf.tokenize_rows(sp)
    assert min(len(r) for r in rows) > WINDOW, [len(r) for r in rows]
    work = tempfile.mkdtemp(prefix="llama2tune_swa_")
    windowed, causal = f"{work}/windowed", f"{work}/causal"
    os.makedirs(windowed), os.makedirs(causal)
    mistral_folder(windowed, WINDOW)
    mistral_folder(causal, None)
    for lora in (False, True):
        what = "lora" if lora else "full"
        ref, hp = hf_steps(windowed, rows, lora)
        plain, _ = hf_steps(causal, rows, lora)
        print(f"{what}: transformers with the window vs without: losses differ by up to "
              f"{worst(plain, ref, 'loss'):.3e}, gradient norms {worst(plain, ref, 'grad_norm'):.3e}")
        for chunk in (0, 1, 4, 7):
            got = ours(windowed, hp, lora, chunk, work)
            assert len(got) == len(ref), (len(got), len(ref))
            print(f"{what}: train_llama2 chunk_size {chunk} vs transformers: losses {worst(got, ref, 'loss'):.3e}, "
                  f"gradient norms {worst(got, ref, 'grad_norm'):.3e} (worst relative difference over "
                  f"{len(ref)} steps)")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
