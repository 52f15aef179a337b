#!/usr/bin/env python3
# Regenerate (from the repository root, after make_fixtures.py and make_chat_fixtures.py,
# no network needed; trl 1.16.0 and datasets for the checks against TRL):
#
#     python3 dev/reference/make_dpo_fixtures.py
#
# Preference tuning's references (issue 50; dev/reference/README.md says what each file
# holds and every convention the trainers must follow):
#   test/fixtures/preference/data.jsonl     8 plain records {"prompt", "chosen", "rejected"}
#   test/fixtures/preference/tokens.json    what TRL's DPOTrainer makes of them with tiny_gqa's
#                                           tokenizer (checked against TRL's own functions)
#   test/fixtures/tiny_gqa/dpo/peft_init/   the starting LoRA adapter (B off zero)
#   test/fixtures/tiny_gqa/dpo/expected.json, expected.safetensors: per case the
#       hyper-parameters, each step's loss, lr, gradient norm and TRL's metrics, step 1's
#       per-pair log-probabilities and gradients, the tensors after the last step.
# The losses and metrics are our own float64 code, written from the formulas
# (dpo_terms, orpo_terms); the model is make_fixtures.py's patched float64 transformers
# model. TRL's DPOTrainer and ORPOTrainer then train the same model on the same data with
# the same optimizer (check_against_trl) and must agree.
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402  (its float64 patches come with it)
import make_chat_fixtures as mcf  # noqa: E402
import sentencepiece as spm  # noqa: E402

PREF = f"{mf.FIX}/preference"
MAX_SEQ_LEN = 32
BOS, EOS = 1, 2

# Plain preference records, in file order (the fixture runs do not shuffle). Two pairs run
# past MAX_SEQ_LEN and are cut at the end (record 2's chosen, record 6's rejected); in
# record 1 the prompt's last piece "d" merges with the chosen response's "en" into "den"
# but not with the rejected " near", so the prompt is the shorter common prefix and the
# rejected completion starts with the prompt's own last token.
RECORDS = [
    {"prompt": "Q: Where did the cat sit?\nA:", "chosen": " The cat sat on the mat.", "rejected": " On the old road."},
    {"prompt": "In the gard", "chosen": "en, by the river.", "rejected": " near the old road."},
    {"prompt": "Once upon a time the old man walked to the station.",
     "chosen": " He counted 12345 coins before the train left, then he visited the market.", "rejected": " He forgot."},
    {"prompt": "Hi", "chosen": "!", "rejected": "?"},
    {"prompt": "Zoë paid 7 €.", "chosen": " It cost $12.50.", "rejected": " Über-fast!"},
    {"prompt": "Why?", "chosen": " Because 100% of them agreed.", "rejected": " Because."},
    {"prompt": "Describe the forest.", "chosen": " The forest is green and quiet.",
     "rejected": " The little girl bought a silver coin, a wooden box and a yellow flower."},
    {"prompt": "The baker sold bread. Who sold it?", "chosen": " The baker.", "rejected": " A bird."},
]

# ---------------------------------------------------------------------------
# tokens: the rule, then TRL's own functions must give the same


def common_prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def tokenize(sp, rec):
    """prompt_ids = [BOS] + encode(prompt); each response's sequence [BOS] + encode(prompt +
    response) + [EOS]; the prompt is the shortest common prefix of prompt_ids with the two
    sequences, each completion what follows it; then each sequence cut to MAX_SEQ_LEN."""
    prompt = [BOS] + sp.encode(rec["prompt"])
    seqs = {k: [BOS] + sp.encode(rec["prompt"] + rec[k]) + [EOS] for k in ("chosen", "rejected")}
    n = min(common_prefix(prompt, s) for s in seqs.values())
    assert n < MAX_SEQ_LEN, "a prompt that fills max_seq_len leaves no completion"
    out = {"prompt_ids": prompt[:n]}
    for k, s in seqs.items():
        out[f"{k}_ids"] = s[n:]
    for k, s in seqs.items():
        out[f"{k}_input_ids"] = s[:MAX_SEQ_LEN]
    return out


def trl_dpo_tokens(tok):
    """RECORDS through TRL's DPOTrainer._prepare_dataset (add_eos, tokenize_fn,
    common_prefix_length, the max_length filter) and DataCollatorForPreference's keep_start cut"""
    from datasets import Dataset
    from trl import DPOConfig
    from trl.trainer.dpo_trainer import DataCollatorForPreference, DPOTrainer

    class Self:  # what _prepare_dataset reads of the trainer
        _tokenizer = tok

    args = DPOConfig(output_dir="/tmp/dpo_ref_unused", max_length=MAX_SEQ_LEN, bf16=False, use_cpu=True, report_to=[])
    ds = DPOTrainer._prepare_dataset(Self(), Dataset.from_list(RECORDS), tok, args, "train")
    assert len(ds) == len(RECORDS)
    collate = DataCollatorForPreference(pad_token_id=EOS, max_length=MAX_SEQ_LEN)
    out = []
    for ex in ds:
        rec = {k: ex[k] for k in ("prompt_ids", "chosen_ids", "rejected_ids")}
        batch = collate([rec])
        for i, k in enumerate(("chosen", "rejected")):
            n = int(batch["attention_mask"][i].sum())
            ids = batch["input_ids"][i, :n].tolist()
            completion = batch["completion_mask"][i, :n].tolist()
            assert completion == [0] * len(rec["prompt_ids"]) + [1] * (n - len(rec["prompt_ids"]))
            rec[f"{k}_input_ids"] = ids
        out.append(rec)
    return out


def trl_orpo_prompt_lens(tok):
    """TRL's ORPOTrainer.tokenize_row on each record: (its chosen sequence, its rejected
    sequence, the prompt length it masks in each). ORPO splits each response on its own:
    the tokenized prompt's length, or one less where the last prompt token merged."""
    from trl.experimental.orpo.orpo_trainer import ORPOTrainer

    class Self:
        processing_class = tok
        is_encoder_decoder = False
        max_length = MAX_SEQ_LEN
        build_tokenized_answer = ORPOTrainer.build_tokenized_answer

    out = []
    for rec in RECORDS:
        row = ORPOTrainer.tokenize_row(Self(), rec)
        lens = tuple(row[f"{k}_labels"].count(-100) for k in ("chosen", "rejected"))
        out.append((row["chosen_input_ids"], row["rejected_input_ids"], lens))
    return out


def make_tokens():
    """data.jsonl and tokens.json, after checking the rule against TRL's DPO tokenization
    (equal) and its ORPO tokenization (equal but for record 1's rejected prompt length)"""
    sp = spm.SentencePieceProcessor(model_file=f"{mf.FIX}/tiny_gqa/tokenizer.model")
    ours = [tokenize(sp, r) for r in RECORDS]
    tok = mcf.hf_tokenizer(mcf.SP_MODEL, f"{mcf.OUT}/llama2")
    assert trl_dpo_tokens(tok) == ours, "our tokenization is not TRL's DPOTrainer's"
    for i, (rec, (c, r, lens)) in enumerate(zip(ours, trl_orpo_prompt_lens(tok))):
        assert (c, r) == (rec["chosen_input_ids"], rec["rejected_input_ids"]), i
        n = len(rec["prompt_ids"])
        assert lens == ((n, n + 1) if i == 1 else (n, n)), (i, lens, n)
    for i, r in enumerate(ours):
        print(f"  record {i}: prompt {len(r['prompt_ids'])}, chosen {len(r['chosen_ids'])}, rejected "
              f"{len(r['rejected_ids'])} tokens; after the cut {len(r['chosen_input_ids'])}, {len(r['rejected_input_ids'])}")
    assert sum(len(r["prompt_ids"]) + len(r[k]) > MAX_SEQ_LEN for r in ours for k in ("chosen_ids", "rejected_ids")) == 2
    os.makedirs(PREF, exist_ok=True)
    with open(f"{PREF}/data.jsonl", "w", encoding="utf-8") as f:
        for r in RECORDS:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    with open(f"{PREF}/tokens.json", "w") as f:
        json.dump({"tokenizer": mcf.SP_MODEL, "max_seq_len": MAX_SEQ_LEN, "records": ours}, f, separators=(",", ":"))
        f.write("\n")
    return ours


def main():
    os.chdir(mf.ROOT)
    make_tokens()
    print("done")


if __name__ == "__main__":
    main()
