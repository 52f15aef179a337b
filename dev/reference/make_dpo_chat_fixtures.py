#!/usr/bin/env python3
# Regenerate (from the repository root, after make_fixtures.py and make_chat_fixtures.py;
# no network; trl 1.16.0 and datasets):
#
#     /tmp/venv/bin/python dev/reference/make_dpo_chat_fixtures.py
#
# The conversational preference form (issue 50): records whose "chosen" and "rejected" are
# lists of messages, with an explicit "prompt" list or without one (the shared leading
# messages are the prompt). Writes
#   test/fixtures/preference/chat.jsonl        the records (both forms, in one file)
#   test/fixtures/preference/chat_tokens.json  what TRL 1.16's DPOTrainer makes of each record
#       for both chat families: its _prepare_dataset (extract_prompt for a record without a
#       prompt, apply_chat_template with the generation prompt on the prompt and without it on
#       prompt + completion, the common prefix, the filter of prompts that fill max_length) and
#       DataCollatorForPreference's keep_start cut. One record per Dataset: TRL decides the form
#       (and whether to extract a prompt) from a dataset's first record.
# The families' templates are their published ones, read from their tokenizer_config.json:
#   llama2  tiny_gqa's tokenizer.model with test/fixtures/chat/llama2 (Llama-2-chat's
#           template, "legacy": false as a Llama-2 folder that says nothing gets)
#   llama2_legacy  the same with "legacy": true (test/fixtures/chat/llama2_legacy)
#   llama3  test/fixtures/tiny_llama3_bpe (its tokenizer.json and chat template)
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_chat_fixtures as mcf  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402
import transformers  # noqa: E402
import trl  # noqa: E402
import datasets  # noqa: E402

datasets.disable_progress_bars()

PREF = "test/fixtures/preference"
MAX_SEQ_LEN = 96


def u(text):
    return {"role": "user", "content": text}


def a(text):
    return {"role": "assistant", "content": text}


SYSTEM = {"role": "system", "content": " Answer briefly.\n"}
LONG = ("Once upon a time the old man walked to the station, counted his coins, visited the market, "
        "bought bread and a silver box, then walked home by the river and the old road to the garden.")
# The records, in file order. 0: an explicit prompt, one turn each; 1: no prompt, a system
# message and a user turn shared (contents with spaces to strip); 2: an explicit multi-turn
# prompt with a system message; 3: no prompt, two turns, the answers differ in the second;
# 4: no prompt, the conversations part at a user turn (each completion a user and an
# assistant message: TRL trains on the whole rest); 5: the chosen answer runs past
# max_seq_len and is cut; 6: a prompt that fills max_seq_len (TRL drops it: a skip); 7: an
# empty answer (TRL trains on its template's tokens: the spaces and the end token); 8: no
# prompt, the chosen conversation the start of the rejected one (extract_prompt's loop ends
# without a difference: the prompt is all but the shorter one's last message); 9: a prompt of
# a system message alone (Llama-2's template renders it only inside the first user turn: its
# prompt has no tokens, and the completion's first token no target).
RECORDS = [
    {"prompt": [u("Where did the cat sit?")], "chosen": [a("On the mat.")], "rejected": [a("On the old road.")]},
    {"chosen": [SYSTEM, u("  Hi there "), a(" Hello, friend! ")], "rejected": [SYSTEM, u("  Hi there "), a("Go away.")]},
    {"prompt": [SYSTEM, u("What is 2+2?"), a("4"), u("And 3+3?")], "chosen": [a("6, of course.")], "rejected": [a("7")]},
    {"chosen": [u("x"), a("y"), u("Zoë paid 7 €. Why?"), a("It cost $12.50.")],
     "rejected": [u("x"), a("y"), u("Zoë paid 7 €. Why?"), a("Über-fast!")]},
    {"chosen": [u("Hi"), a("Hello."), u("Tell me a story."), a("The cat sat.")],
     "rejected": [u("Hi"), a("Hello."), u("Go."), a("No.")]},
    {"prompt": [u("Describe the forest.")], "chosen": [a(LONG + " " + LONG)], "rejected": [a("Green.")]},
    {"prompt": [u(LONG + " " + LONG)], "chosen": [a("Yes.")], "rejected": [a("No.")]},
    {"prompt": [u("Say nothing.")], "chosen": [a("")], "rejected": [a("Something.")]},
    {"chosen": [u("Hi"), a("Hello.")], "rejected": [u("Hi"), a("Hello."), u("More?"), a("No.")]},
    {"prompt": [SYSTEM], "chosen": [u("Hi"), a("Yes.")], "rejected": [u("Hi"), a("No.")]},
]
SKIPPED = [6]  # records whose prompt fills MAX_SEQ_LEN


def families():
    return {
        "llama2": (mcf.SP_MODEL, "test/fixtures/chat/llama2",
                   mcf.hf_tokenizer(mcf.SP_MODEL, "test/fixtures/chat/llama2")),
        "llama2_legacy": (mcf.SP_MODEL, "test/fixtures/chat/llama2_legacy",
                          mcf.hf_tokenizer(mcf.SP_MODEL, "test/fixtures/chat/llama2_legacy")),
        "llama3": ("test/fixtures/tiny_llama3_bpe/tokenizer.json", "test/fixtures/tiny_llama3_bpe",
                   AutoTokenizer.from_pretrained("test/fixtures/tiny_llama3_bpe")),
    }


def trl_tokens(tok, rec):
    """rec through DPOTrainer._prepare_dataset and the collator's cut (None: TRL drops it)"""
    from datasets import Dataset
    from trl import DPOConfig
    from trl.trainer.dpo_trainer import DataCollatorForPreference, DPOTrainer

    class Self:  # what _prepare_dataset reads of the trainer
        _tokenizer = tok

    args = DPOConfig(output_dir="/tmp/dpo_ref_unused", max_length=MAX_SEQ_LEN, bf16=False, use_cpu=True, report_to=[])
    ds = DPOTrainer._prepare_dataset(Self(), Dataset.from_list([rec]), tok, args, "train")
    if len(ds) == 0:
        return None
    ex = {k: ds[0][k] for k in ("prompt_ids", "chosen_ids", "rejected_ids")}
    batch = DataCollatorForPreference(pad_token_id=tok.eos_token_id, max_length=MAX_SEQ_LEN)([ex])
    for i, k in enumerate(("chosen", "rejected")):
        n = int(batch["attention_mask"][i].sum())
        assert batch["completion_mask"][i, :n].tolist() == [0] * len(ex["prompt_ids"]) + [1] * (n - len(ex["prompt_ids"]))
        ex[f"{k}_input_ids"] = batch["input_ids"][i, :n].tolist()
    return ex


def main():
    out = {"transformers": transformers.__version__, "trl": trl.__version__, "max_seq_len": MAX_SEQ_LEN, "families": {}}
    for name, (tok_file, config_dir, tok) in families().items():
        recs, skipped = [], []
        for i, rec in enumerate(RECORDS):
            ex = trl_tokens(tok, rec)
            if ex is None:
                skipped.append(i + 1)  # (its line)
                print(f"  {name} record {i}: dropped (prompt fills max_length)")
                continue
            recs.append(ex)
            print(f"  {name} record {i}: prompt {len(ex['prompt_ids'])}, chosen {len(ex['chosen_ids'])}, rejected "
                  f"{len(ex['rejected_ids'])} tokens; after the cut {len(ex['chosen_input_ids'])}, {len(ex['rejected_input_ids'])}")
        assert skipped == [i + 1 for i in SKIPPED], (name, skipped)
        cut = [len(r["prompt_ids"]) + len(r["chosen_ids"]) > MAX_SEQ_LEN for r in recs]
        assert cut[5], (name, cut)  # (record 5; legacy cuts record 2 by a token too)
        out["families"][name] = {"tokenizer": tok_file, "config": config_dir, "records": recs, "skipped_lines": skipped}
    os.makedirs(PREF, exist_ok=True)
    with open(f"{PREF}/chat.jsonl", "w", encoding="utf-8") as f:
        for r in RECORDS:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    with open(f"{PREF}/chat_tokens.json", "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    print("done")


if __name__ == "__main__":
    main()
