#!/usr/bin/env python3
# tokenizer.h's tokenizer.json path against the `tokenizers` library on a
# Llama-3-sized vocabulary, on the same few MB of text:
#   python3 dev/bench_tokenizer.py [tokenizer.json]
# Without an argument it trains one (once; kept in /tmp/llama2tune_bench_bpe.json):
# a byte-level BPE with Llama-3's pre-tokenizer, ignore_merges and special tokens,
# 128000 tokens, on the CPython standard library's sources (Lib/ but Lib/test/).
# The text is 4 MB: the shared SAMSum/Alpaca files when present, then Lib/test/*.py.
# Prints both throughputs (one thread each: tokenizers' encode of one string runs
# on one) and checks that both give the same ids (a checksum over them).
import os
import subprocess
import sys
import sysconfig
import time

import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference"))
from make_bpe_fixtures import LLAMA3_PATTERN, LLAMA3_SPECIAL  # noqa: E402

CACHE = "/tmp/llama2tune_bench_bpe.json"
TEXT = "/tmp/llama2tune_bench_text.txt"
LIB = sysconfig.get_paths()["stdlib"]


def sources(under, exclude=None):
    out = []
    for root, dirs, files in os.walk(under):
        dirs[:] = sorted(d for d in dirs if os.path.join(root, d) != exclude and d != "site-packages")
        out += [os.path.join(root, f) for f in sorted(files) if f.endswith(".py")]
    return out


def read(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def train():
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=128000, min_frequency=1, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    files = sources(LIB, exclude=os.path.join(LIB, "test"))
    t0 = time.time()
    tok.train_from_iterator((read(f) for f in files), trainer=trainer)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in LLAMA3_SPECIAL])
    tok.save(CACHE)
    print("trained %s: %d tokens on %d files in %.0f s" % (CACHE, tok.get_vocab_size(), len(files), time.time() - t0))
    return CACHE


def text(size=4 << 20):
    parts = [read(p) for p in ("../shared/data/samsum/samsum_test_300.jsonl", "../shared/data/alpaca/alpaca_1000.json")
             if os.path.exists(p)]
    for f in sources(os.path.join(LIB, "test")):
        if sum(map(len, parts)) >= size:
            break
        parts.append(read(f))
    data = "".join(parts).encode("utf-8")[:size].decode("utf-8", "ignore")
    with open(TEXT, "w", encoding="utf-8") as f:
        f.write(data)
    return data


def main():
    if not os.path.exists("tokenizer.h"):
        sys.exit("run from the repo root")
    path = sys.argv[1] if len(sys.argv) > 1 else (CACHE if os.path.exists(CACHE) else train())
    tok = Tokenizer.from_file(path)
    data = text()
    best = 1e30
    for _ in range(3):
        t0 = time.perf_counter()
        ids = tok.encode(data, add_special_tokens=False).ids
        best = min(best, time.perf_counter() - t0)
    checksum = sum((i + 1) * x for i, x in enumerate(ids)) % (1 << 64)
    mb = len(data.encode("utf-8")) / (1 << 20)
    print("tokenizers %s: %.2f MB -> %d tokens: %.1f ms, %.1f MB/s, %.2f M tokens/s (encode, one string, best of 3); "
          "ids checksum %d" % (tokenizers.__version__, mb, len(ids), 1e3 * best, mb / best, 1e-6 * len(ids) / best, checksum))
    # the same text as many short documents, encode_batch (its thread pool: every core)
    lines = data.splitlines(keepends=True)
    docs = ["".join(lines[i:i + 20]) for i in range(0, len(lines), 20)]
    best_batch = 1e30
    for _ in range(3):
        t0 = time.perf_counter()
        n = sum(len(e.ids) for e in tok.encode_batch(docs, add_special_tokens=False))
        best_batch = min(best_batch, time.perf_counter() - t0)
    print("tokenizers encode_batch of %d documents of 20 lines, %d threads: %d tokens, %.1f MB/s, %.2f M tokens/s (best of 3)"
          % (len(docs), os.cpu_count(), n, mb / best_batch, 1e-6 * n / best_batch))
    subprocess.run("make -s dev/bench_tokenizer", shell=True, check=True)
    out = subprocess.run(["dev/bench_tokenizer", path, "--text", TEXT], capture_output=True, text=True, check=True).stdout
    print("tokenizer.h:\n  " + out.strip().replace("\n", "\n  "))
    same = ("ids checksum %d" % checksum) in out
    print("same ids: %s" % ("yes" if same else "NO"))
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
