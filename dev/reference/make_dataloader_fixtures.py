#!/usr/bin/env python3
# Regenerate (from the repo root):
#   python3 dev/reference/make_dataloader_fixtures.py
#
# Reference data for test/test_dataloader.c, computed with the `sentencepiece`
# Python package (tested with 0.2.3) and the prompt templates written out
# again below, independently of dataloader.h:
#   test/fixtures/data/<format>.jsonl, <format>.json   small data files, every
#       format in both layouts (JSON Lines and one JSON array)
#   test/fixtures/data/expected.json   for each case (file, options): the rows
#       the dataloader must produce in dataset order (tokens, targets with
#       -100) and the skipped samples (line, reason)
#   test/fixtures/data/llama2_expected.json   the same for the first 5 samples
#       of ../shared/data/samsum/samsum_test_300.jsonl and
#       ../shared/data/alpaca/alpaca_1000.json with Meta's Llama-2 tokenizer,
#       written only when ../shared is present (the data itself is not copied)
#
# The rules, as dataloader.h documents them:
#   prompt tokens: [BOS] + sp.encode(prompt); response tokens: sp.encode(response) + [EOS];
#   text: [BOS] + sp.encode(text) + [EOS], all labelled; chat: apply_chat_template's ids and
#   assistant mask (make_chat_fixtures.py), after dropping a trailing user turn.
#   targets[t] = tokens[t+1] if token t+1 is labelled (or train_on_prompt) else -100.
#   padding: one sample per row, first max_seq_len tokens; a sample with no labelled
#     target left is skipped ("no response token within max_seq_len").
#   packing: all samples concatenated, cut into rows of max_seq_len; the shorter tail
#     is dropped unless it is the only row.
#   skips: empty response / empty text (encodes to no tokens), chat without a pair.
import json
import os
import sys

import sentencepiece as spm

sys.path.insert(0, os.path.dirname(__file__))
from make_chat_fixtures import chat_ids  # noqa: E402

OUT = "test/fixtures/data"
TOKENIZER = "test/fixtures/tiny_gqa/tokenizer.model"
LLAMA = "../shared/data/llama2/tokenizer.model"
SAMSUM = "../shared/data/samsum/samsum_test_300.jsonl"
ALPACA = "../shared/data/alpaca/alpaca_1000.json"

SAMSUM_PROMPT = "Summarize this dialog:\n{dialogue}\n---\nSummary:\n"
ALPACA_PROMPT_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:"
)
ALPACA_PROMPT_NO_INPUT = (
    "Below is an instruction that describes a task. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:"
)
# chat: Llama-2-chat's template through transformers, with TOKENIZER and "legacy": false
# (make_chat_fixtures.py writes that folder)
CHAT_CONFIG = "test/fixtures/chat/llama2"

# ----------------------------------------------------------------------------
# fixture records (each format; odd cases on purpose)

RECORDS = {
    "text": [
        {"text": "The cat sat on the mat."},
        {"text": "Zo\u00eb paid 7 \u20ac at the caf\u00e9. \U0001F642"},
        {"text": ""},  # skipped: empty text
        {"text": "Once upon a time the old man walked to the station and counted the coins before the train left.",
         "meta": {"source": "x"}},
    ],
    "prompt_response": [
        {"prompt": "What is two plus two?", "response": "Four."},
        {"prompt": "Say nothing.", "response": ""},  # skipped: empty response
        {"prompt": "", "response": "An answer with no question."},
        {"prompt": "Translate 'chat' from French.", "response": " Cat (with a leading space)\n"},
    ],
    "alpaca": [
        {"instruction": "Name a colour.", "input": "", "output": "Blue."},
        {"instruction": "Add the numbers.", "input": "3 and 4", "output": "7"},
        {"instruction": "Write a greeting.", "output": "Hello there!"},  # no "input" key
        {"instruction": "Is this a question?", "input": None, "output": "No."},  # null input: no input
    ],
    "samsum": [
        {"id": "1", "dialogue": "Anna: Are you coming?\nBen: In ten minutes.", "summary": "Ben will come in ten minutes."},
        {"id": "2", "dialogue": "Tom: I lost my keys \U0001F615\nAmy: Check the car.", "summary": "Amy thinks Tom's keys are in the car."},
        {"id": "3", "dialogue": "Kim: ok", "summary": ""},  # skipped: empty response
    ],
    "chat": [
        {"messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "  Hi there \u00a0"},
            {"role": "assistant", "content": "Hello.\n"},
            {"role": "user", "content": "What is the time?"},
            {"role": "assistant", "content": "\u3000Noon."},
        ]},
        {"messages": [
            {"role": "user", "content": "One question?"},
            {"role": "assistant", "content": "One answer."},
            {"role": "user", "content": "A trailing user turn is dropped."},
        ]},
        {"messages": [
            {"role": "system", "content": "Alone."},
            {"role": "user", "content": "No answer comes."},
        ]},  # skipped: no user/assistant pair
        {"messages": [
            {"role": "user", "content": "Say it."},
            {"role": "assistant", "content": " \t "},
        ]},  # skipped: empty response after strip
    ],
}


# ----------------------------------------------------------------------------
# the reference rules

def detect(rec):
    for key, fmt in (("messages", "chat"), ("instruction", "alpaca"), ("dialogue", "samsum"),
                     ("prompt", "prompt_response"), ("text", "text")):
        if key in rec:
            return fmt
    raise ValueError("cannot detect format")


def segments(rec, fmt):
    """[(kind, text)] with kind 'prompt' | 'response' | 'text', or a skip reason (str)"""
    if fmt == "text":
        return [("text", rec["text"])]
    if fmt == "prompt_response":
        return [("prompt", rec["prompt"]), ("response", rec["response"])]
    if fmt == "samsum":
        return [("prompt", SAMSUM_PROMPT.format(dialogue=rec["dialogue"])), ("response", rec["summary"])]
    if fmt == "alpaca":
        inp = rec.get("input") or ""
        tpl = ALPACA_PROMPT_INPUT if inp != "" else ALPACA_PROMPT_NO_INPUT
        return [("prompt", tpl.format(instruction=rec["instruction"], input=inp)), ("response", rec["output"])]
    if fmt == "chat":
        msgs = list(rec["messages"])
        if msgs and msgs[-1]["role"] == "user":
            msgs = msgs[:-1]  # a trailing user turn has no answer: dropped
        if not any(m["role"] == "assistant" for m in msgs):
            return "no user/assistant pair"
        if any(m["role"] == "assistant" and not m["content"].strip() for m in msgs):
            return "empty response"
        return [("chat", msgs)]
    raise ValueError(fmt)


def tokenize(sp, segs):
    if segs[0][0] == "chat":  # the ids and loss mask of transformers' apply_chat_template
        return chat_ids(TOKENIZER, CHAT_CONFIG, segs[0][1])
    ids, lab = [], []
    for kind, text in segs:
        enc = sp.encode(text)
        if not enc and kind != "prompt":
            return "empty text" if kind == "text" else "empty response"
        if kind in ("prompt", "text"):
            ids.append(sp.bos_id()); lab.append(kind == "text")
        ids += enc; lab += [kind != "prompt"] * len(enc)
        if kind != "prompt":
            ids.append(sp.eos_id()); lab.append(True)
    return ids, lab


def row_targets(ids, lab, train_on_prompt):
    return [ids[t + 1] if (train_on_prompt or lab[t + 1]) else -100 for t in range(len(ids) - 1)] + [-100]


def expected_case(sp, path, samples, fmt, train_on_prompt, packing, max_seq_len, max_samples=0):
    """samples: [(line, ids, lab) or (line, reason)] in file order"""
    rows, skipped, kept = [], [], []
    for s in samples:
        if len(s) == 2:
            skipped.append([s[0], s[1]])
            continue
        line, ids, lab = s
        if not packing:
            ids, lab = ids[:max_seq_len], lab[:max_seq_len]
            if not any(train_on_prompt or l for l in lab[1:]):
                skipped.append([line, "no response token within max_seq_len"])
                continue
        kept.append((ids, lab))
        if max_samples and len(kept) == max_samples:
            break
    if packing:
        ids = [i for k in kept for i in k[0]]
        lab = [l for k in kept for l in k[1]]
        n = len(ids) // max_seq_len
        spans = [(r * max_seq_len, (r + 1) * max_seq_len) for r in range(n)] or [(0, len(ids))]
        rows = [(ids[a:b], lab[a:b]) for a, b in spans]
    else:
        rows = kept
    out_rows = [r[0] for r in rows]
    out_targets = [row_targets(r[0], r[1], train_on_prompt) for r in rows]
    return {"file": path, "format": fmt, "train_on_prompt": train_on_prompt, "packing": packing,
            "max_seq_len": max_seq_len, "max_samples": max_samples, "skipped": skipped,
            "labels": sum(t != -100 for r in out_targets for t in r), "rows": out_rows, "targets": out_targets}


def load_samples(sp, records, lines, fmt_requested):
    fmt = detect(records[0]) if fmt_requested == "auto" else fmt_requested
    out = []
    for rec, line in zip(records, lines):
        segs = segments(rec, fmt)
        res = segs if isinstance(segs, str) else tokenize(sp, segs)
        out.append((line, res) if isinstance(res, str) else (line, res[0], res[1]))
    return out


# ----------------------------------------------------------------------------
# writing the fixture files (tracking the line where each record starts)

def write_jsonl(path, records, ensure_ascii):
    """one record per line, with a blank line and a CRLF line in between"""
    text, lines, line = "", [], 1
    for i, rec in enumerate(records):
        if i == 1:
            text += "\n"  # blank lines are allowed
            line += 1
        lines.append(line)
        text += json.dumps(rec, ensure_ascii=ensure_ascii) + ("\r\n" if i == 2 else "\n")
        line += 1
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    return lines


def write_array(path, records):
    """a pretty-printed JSON array: elements span several lines"""
    text, lines, line = "[\n", [], 2
    for i, rec in enumerate(records):
        body = json.dumps(rec, ensure_ascii=False, indent=1)
        body = "\n".join(" " + l for l in body.split("\n"))
        lines.append(line)
        text += body + (",\n" if i + 1 < len(records) else "\n")
        line += body.count("\n") + 1
    text += "]\n"
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    return lines


def main():
    os.makedirs(OUT, exist_ok=True)
    sp = spm.SentencePieceProcessor(model_file=TOKENIZER)
    cases = []
    for fmt, records in RECORDS.items():
        jl = f"{OUT}/{fmt}.jsonl"
        ja = f"{OUT}/{fmt}.json"
        lines_l = write_jsonl(jl, records, ensure_ascii=(fmt == "samsum"))  # samsum: \u escapes, surrogate pairs
        lines_a = write_array(ja, records)
        s_l = load_samples(sp, records, lines_l, "auto")
        s_a = load_samples(sp, records, lines_a, "auto")
        # a short max_seq_len that truncates: about the median sample length
        lens = sorted(len(s[1]) for s in s_l if len(s) == 3)
        short = max(4, lens[len(lens) // 2] - 3)
        for top in (0, 1):
            cases.append(expected_case(sp, jl, s_l, "auto", top, 0, 512))
            cases.append(expected_case(sp, jl, s_l, "auto", top, 0, short))
            cases.append(expected_case(sp, jl, s_l, "auto", top, 1, 16))
        cases.append(expected_case(sp, jl, s_l, fmt, 0, 1, 7))            # format forced, tiny rows
        cases.append(expected_case(sp, jl, s_l, "auto", 0, 1, 4096))      # packing: the only (short) row
        cases.append(expected_case(sp, ja, s_a, "auto", 0, 0, 512))
        cases.append(expected_case(sp, ja, s_a, "auto", 1, 1, 16))
        cases.append(expected_case(sp, ja, s_a, "auto", 0, 0, 512, max_samples=2))
    with open(f"{OUT}/expected.json", "w") as f:
        json.dump({"tokenizer": TOKENIZER, "sentencepiece": spm.__version__, "cases": cases}, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {len(cases)} cases to {OUT}/expected.json")

    if os.path.exists(LLAMA) and os.path.exists(SAMSUM) and os.path.exists(ALPACA):
        meta = spm.SentencePieceProcessor(model_file=LLAMA)
        lcases = []
        with open(SAMSUM, encoding="utf-8") as f:
            recs = [json.loads(l) for l in f.read().split("\n")[:5]]
        s = load_samples(meta, recs, [1, 2, 3, 4, 5], "auto")
        lcases.append(expected_case(meta, SAMSUM, s, "auto", 0, 0, 4096, max_samples=5))
        with open(ALPACA, encoding="utf-8") as f:
            recs = json.load(f)[:5]
        s = load_samples(meta, recs, [0] * 5, "auto")  # (lines of the array elements are not checked)
        lcases.append(expected_case(meta, ALPACA, s, "auto", 0, 0, 4096, max_samples=5))
        lcases.append(expected_case(meta, ALPACA, s, "auto", 1, 1, 256, max_samples=5))
        with open(f"{OUT}/llama2_expected.json", "w") as f:
            json.dump({"tokenizer": LLAMA, "sentencepiece": spm.__version__, "cases": lcases}, f, separators=(",", ":"))
            f.write("\n")
        print(f"wrote {len(lcases)} cases to {OUT}/llama2_expected.json")
    else:
        print(f"{LLAMA} or the shared data not present: llama2_expected.json not written", file=sys.stderr)


if __name__ == "__main__":
    main()
