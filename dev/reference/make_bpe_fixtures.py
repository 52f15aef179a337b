#!/usr/bin/env python3
# Regenerate (from the repo root):
#   python3 dev/reference/make_bpe_fixtures.py
#   python3 dev/reference/make_bpe_fixtures.py --llama3 PATH/tokenizer.json
#       (also writes llama3_expected.txt for Meta's tokenizer.json at PATH; the
#        tokenizer itself is never copied into the repo)
#
# Writes the reference data for tokenizer.h's tokenizer.json path
# (test/test_tokenizer.c), with the Hugging Face `tokenizers` library (tested
# with 0.23.3) as the ground truth:
#   test/fixtures/tokenizer/bpe_llama3.json   byte-level BPE, vocab 3000, trained here
#       with Llama-3's pre-tokenizer (Split on Llama-3's regex, Isolated, then
#       ByteLevel without its regex), ignore_merges, merges written as pairs, the
#       pre-tokens of the HARD strings (and each two neighbours joined) as whole
#       vocab entries, and Llama-3's
#       special tokens added after the vocabulary (as Meta's file has them)
#   test/fixtures/tokenizer/bpe_gpt2.json     GPT-2's pre-tokenizer (ByteLevel with its
#       own regex), ignore_merges off, merges in the older "a b" string form (one
#       pair listed again at the end), an
#       alphabet of only the bytes the corpus has (other bytes are dropped, as
#       tokenizers drops a character its vocab lacks when there is no unk_token),
#       and added tokens with lstrip, rstrip, normalized and overlapping contents
#   test/fixtures/tokenizer/bpe_unk.json      bpe_gpt2.json with unk_token "<unk>", fuse_unk
#   test/fixtures/tokenizer/<name>_expected.txt  tokenizers' ids and decodes for them
#
# The training text is public and on every machine with this Python (3.11.7): CPython's
# LICENSE.txt, the UTF-8 CJK samples of its test suite (Lib/test/cjkencodings/*-utf8.txt),
# and the sources of a few standard library modules (English docstrings and code;
# Lib/test/test_codecs.py also has text in Arabic, Hebrew, Hindi, Russian and more).
# Nothing is downloaded; the script is deterministic.
#
# Fixture format: as make_tokenizer_fixtures.py's (tab-separated, text in hex), and
#   id      <hex of a string>  <tokenizer.token_to_id(string), -1 for None>
#   sample  <k>  <ids>  <1 if decode(ids) gives the text back, else 0>
#       for the k-th shared SAMSum/Alpaca sample (as make_tokenizer_fixtures.py's
#       shared_samples() picks them); only ids are written, the C test reads the
#       text from ../shared/data itself (and skips, saying so, without it)
# Text that is not valid UTF-8 is given to tokenizers as Python decodes it with
# errors="replace" (each maximal ill-formed subsequence becomes one U+FFFD), which
# is what tokenizer_encode does with such bytes.
import json
import os
import random
import sys
import sysconfig

import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tokenizer_fixtures import test_strings as sentencepiece_test_strings, shared_samples  # noqa: E402

OUT = "test/fixtures/tokenizer"
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPECIAL = (["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
                   "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>", "<|start_header_id|>",
                   "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"] +
                  ["<|reserved_special_token_%d|>" % i for i in range(3, 20)])


def corpus():
    lib = sysconfig.get_paths()["stdlib"]
    files = [os.path.join(lib, "LICENSE.txt")]
    cjk = os.path.join(lib, "test", "cjkencodings")
    files += sorted(os.path.join(cjk, f) for f in os.listdir(cjk) if f.endswith("-utf8.txt"))
    files += [os.path.join(lib, f) for f in ("argparse.py", "textwrap.py", "string.py", "json/encoder.py",
                                             "test/test_codecs.py", "difflib.py")]
    lines = []
    for f in files:
        with open(f, encoding="utf-8") as fh:
            lines += fh.read().splitlines(keepends=True)
    return files, lines


def train(vocab_size, pre_tokenizer, ignore_merges, alphabet, trainer_special=()):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=alphabet, special_tokens=list(trainer_special))
    tok.train_from_iterator(corpus()[1], trainer=trainer)
    return tok


def make_llama3():
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok = train(3000, pre, True, pre_tokenizers.ByteLevel.alphabet())
    # Every pre-token of the HARD strings becomes a vocab entry of its own (after
    # the trained ones), as Llama-3's vocab has whole words no merge sequence
    # reaches: with ignore_merges each is one id, so a pre-token split where the
    # regex does not split changes the ids. So does each two neighbouring
    # pre-tokens joined: a boundary missed (the regex's subtleties, the Unicode
    # tables) gives that entry's id.
    d = json.loads(tok.to_str())
    vocab = d["model"]["vocab"]
    for text in HARD:
        pieces = [p for p, _ in tok.pre_tokenizer.pre_tokenize_str(text)]
        for piece in pieces + [a + b for a, b in zip(pieces, pieces[1:])]:
            vocab.setdefault(piece, len(vocab))
    print("bpe_llama3: %d trained tokens, %d whole pre-tokens and pairs added" % (3000, len(vocab) - 3000))
    tok = Tokenizer.from_str(json.dumps(d))
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in LLAMA3_SPECIAL])
    path = os.path.join(OUT, "bpe_llama3.json")
    tok.save(path)
    return path


def make_gpt2():
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    tok = train(800, pre, False, [], trainer_special=["<|endoftext|>", "<unk>"])
    tok.add_tokens([
        AddedToken("<mask>", lstrip=True, rstrip=False, special=True, normalized=False),
        AddedToken("<tool>", rstrip=True, special=True, normalized=False),
        AddedToken("<tool_call>", special=True, normalized=False),
        AddedToken("tool", special=False, normalized=True),
        AddedToken("call>", special=False, normalized=True),
        AddedToken("foo bar", special=False, normalized=True, lstrip=True, rstrip=True),
        AddedToken("日本", special=False, normalized=False),
        AddedToken("<|endoftext|>", special=True, normalized=False),  # also in the vocab (id 0), as GPT-2's
    ])
    path = os.path.join(OUT, "bpe_gpt2.json")
    tok.save(path)
    # the older merges format ("a b" strings), which many tokenizer.json files still have
    d = json.load(open(path, encoding="utf-8"))
    assert all(" " not in a and " " not in b for a, b in d["model"]["merges"])
    d["model"]["merges"] = ["%s %s" % (a, b) for a, b in d["model"]["merges"]]
    d["model"]["merges"].append(d["model"]["merges"][3])  # listed twice: it ranks where it is listed last
    with open(path, "w", encoding="utf-8") as f:
        json.dump(d, f, ensure_ascii=False, indent=2)
    # the same with an unknown token: characters the vocab lacks become <unk>, runs fused
    d["model"]["unk_token"] = "<unk>"
    d["model"]["fuse_unk"] = True
    unk_path = os.path.join(OUT, "bpe_unk.json")
    with open(unk_path, "w", encoding="utf-8") as f:
        json.dump(d, f, ensure_ascii=False, indent=2)
    return path, unk_path


HARD = [
    "", " ", "  ", "   ", " " * 17, "\t", "\n", "\r\n", "\r", "\n\n\n", " \n", "\n ", " \n ", "  \n  ", "\t\n\t",
    " \r\n \r\n", "a\r\nb", "a \r\n b", "line\nnext", "a\rb", "\nx", "\r\nHello", "x.\nY", "x\n\n  y", "x  \n\ny", "end   ", "end\n", "end \n", "end\t\t",
    "  leading", "\tleading tab", "a  b", "a   b", "a \tb", "a\t b", "a \u00a0b", "a\u3000\u3000b", "\u2028x\u2029",
    "\u0085next line", "\x1c\x1d\x1e\x1f are not \\s", "\u180e mongolian vowel separator", "\u200bzero width",
    # contractions, all cases, and what (?i:) folds (U+017F LATIN SMALL LETTER LONG S folds to s)
    "I'm", "I'M", "you're", "YOU'RE", "You'Re", "we've", "WE'VE", "he'll", "HE'LL", "He'Ll", "it's", "IT'S",
    "don't", "DON'T", "she'd", "SHE'D", "'s", "'S", "'LL", "'ll", "'Ll", "'lL", "'sa", "'Sa", "'re'", "''s",
    "'\u017f", "x'\u017fy", "'\u212a", " 's", "x 'll", "'", "''", "'''", "' ", "'1", "'\n",
    # digits
    "0", "12", "123", "1234", "1234567", "12345678901", "3.14159", "1,000,000", "a1b22c333d4444", "x 123", " 1",
    "\u0661\u0662\u0663\u0664", "\u00b2\u00b3\u00bd", "\u2160\u2161\u2162 roman", "\U0001D7CE\U0001D7CF",
    # punctuation and symbols before newlines, spaces before punctuation
    "hello!!!\n\n", "a ...\n", "a  ...", "?!\r\n\r\nx", "((x))", " (x)", "$100", " $ 100", "#include <stdio.h>\n",
    "def f(x):\n    return x\n\n\n", "    indented\n        more\n", "{\"a\": [1, 2]}", "a/b\\c", "~`^",
    # scripts
    "日本語のテキストです。", "我爱自然语言处理", "한국어 문장입니다", "مرحبا بالعالم", "नमस्ते दुनिया", "Привет мир",
    "Γειά σου κόσμε", "שלום עולם", "ภาษาไทย", "Tiếng Việt có dấu", "e\u0301te\u0301", "\u0301combining first",
    "a\u0308\u0304", "\u1100\u1161\u11a8", "😀", "😀😃", "👍🏽", "👨‍👩‍👧", "🇫🇷🇩🇪", "I ❤️ emoji 🎉", "x😀y",
    # letters and numbers new in Unicode 15 and 16 (Python 3.11's unicodedata does not have them)
    "\U00011F04\U00011F05", "a\U0001E030b", "\U00031350\U00031351", "\U0002EBF0", "\u1c89\u1c8a",
    "\U00010D40\U00010D41", "\U000105c0x", "\U0001E5D0 \U0001E5F1",
    # unassigned, private use, controls, NUL
    "\U000E0001", "\ue000\uf8ff", "\U0010FFFF", "\x00", "a\x00b", "\x7f\x01\x1b[0m", "\ufffd", "\ufeffBOM",
]


def test_strings(added):
    t = list(HARD)
    # special tokens inside text and next to words
    for s in added[:12]:
        t += [s, s + s, "x" + s + "y", " " + s + " ", "Hello" + s + "world", s + "\n\n", "'" + s + "s"]
    t += ["<|begin_of_text|>Hello<|eot_id|>", "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>",
          "<|eot_id", "|eot_id|>", "<|<|eot_id|>|>", "<|begin_of_text|><|begin_of_text|>", "<|reserved_special_token_1|>0",
          "<tool_call>", "<tool_calls", "<tool>  x", "  <mask>", "a <mask> b", "toolcall>", "foo bar", "  foo bar  ",
          "xfoo barx", "日本語", "<|endoftext|>", "a<|endoftext|>b"]
    cases = [s.encode("utf-8") for s in t]
    cases += sentencepiece_test_strings()  # the sentencepiece fixtures' strings, invalid UTF-8 included
    cases += [b"\xe2\x82x", b"\xed\xa0\x80", b"\xf0\x9f\x98", b"\xc0\xaf", b"\xf4\x90\x80\x80", b"a\xffb", b"\x80",
              b"<|eot_id|>\xff<|eot_id|>", b"\xe6\x97<|eot_id|>"]
    rng = random.Random(2024)
    for _ in range(400):
        cases.append(random_text(rng, added).encode("utf-8", "surrogatepass"))
    return cases


def random_text(rng, added):
    """a random string from a mix of the classes the regexes distinguish"""
    pools = [
        lambda: rng.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"),
        lambda: rng.choice("0123456789"),
        lambda: rng.choice(" \t\n\r\u00a0\u3000\x0b\x0c\u2028\u0085"),
        lambda: " " * rng.randint(1, 5),
        lambda: rng.choice("\n\r\n\r") * rng.randint(1, 3),
        lambda: rng.choice(".,;:!?()[]{}<>|/\\\"'`~@#$%^&*-_=+"),
        lambda: rng.choice(["'s", "'S", "'ll", "'LL", "'re", "'Ve", "'m", "'D", "'t", "'\u017f"]),
        lambda: rng.choice("éüñçßøåæœ\u0301\u0308\u20ac\u00b2\u00bd"),
        lambda: chr(rng.randint(0x4E00, 0x9FFF)),
        lambda: chr(rng.choice([rng.randint(0x600, 0x6FF), rng.randint(0x900, 0x97F), rng.randint(0x400, 0x4FF)])),
        lambda: chr(rng.randint(0x1F300, 0x1FAFF)),
        lambda: chr(rng.choice([c for c in [rng.randint(0x80, 0x10FFFF)] if not 0xD800 <= c <= 0xDFFF] or [0x41])),
        lambda: rng.choice(added),
        lambda: rng.choice(["<|", "|>", "<", "_id|>", "<|eot"]),
    ]
    weights = [20, 6, 8, 4, 3, 6, 3, 3, 2, 2, 2, 3, 1, 1]
    return "".join(rng.choices(pools, weights)[0]() for _ in range(rng.randint(1, 40)))


def decode_cases(tok, rng, n):
    """random id sequences: any id, added ids, and byte-level characters that make up a
    UTF-8 character, split, so that decode meets invalid UTF-8 (replaced as tokenizers does)"""
    V = tok.get_vocab_size(with_added_tokens=True)
    vocab = tok.get_vocab(with_added_tokens=True)
    added = sorted(tok.get_added_tokens_decoder())
    byte_char = {b: c for b, c in zip(range(256), _bytes_to_unicode())}
    byte_ids = [vocab[byte_char[b]] for b in range(256) if byte_char[b] in vocab]
    out = []
    for k in range(n):
        ids = []
        for _ in range(rng.randint(1, 12)):
            r = rng.random()
            src = byte_ids if r < 0.4 else added if r < 0.5 else range(V)
            ids.append(rng.choice(src))
        if k % 4 == 0:  # a UTF-8 character split over byte-level tokens, maybe cut short
            ch = rng.choice(["é", "日", "😀", "Ж"]).encode()
            ch = ch[:rng.randint(1, len(ch))]
            ids += [vocab[byte_char[b]] for b in ch if byte_char[b] in vocab]
        out.append(ids)
    return out


def _bytes_to_unicode():
    """GPT-2's byte -> character table, in byte order (for picking byte-level tokens)"""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


def write_expected(path, tok_path, cases, samples, pieces, n_decode=80, seed=11):
    tok = Tokenizer.from_file(tok_path)
    model = json.load(open(tok_path, encoding="utf-8"))["model"]
    unk = tok.token_to_id(model["unk_token"]) if model.get("unk_token") else -1
    lines = ["# generated by dev/reference/make_bpe_fixtures.py with tokenizers %s; do not edit" % tokenizers.__version__,
             "model\t" + tok_path,
             "meta\t%d -1 -1 %d -1" % (tok.get_vocab_size(with_added_tokens=True), unk)]
    for c in cases:
        ids = tok.encode(c.decode("utf-8", "replace"), add_special_tokens=False).ids
        dec = tok.decode(ids, skip_special_tokens=False).encode("utf-8")
        lines.append("encode\t%s\t%s\t%s" % (c.hex(), " ".join(map(str, ids)), dec.hex()))
    for ids in decode_cases(tok, random.Random(seed), n_decode):
        dec = tok.decode(ids, skip_special_tokens=False).encode("utf-8")
        lines.append("decode\t%s\t%s" % (" ".join(map(str, ids)), dec.hex()))
    for p in pieces:
        i = tok.token_to_id(p)
        lines.append("id\t%s\t%d" % (p.encode("utf-8").hex(), -1 if i is None else i))
    for k, s in enumerate(samples):
        ids = tok.encode(s.decode("utf-8"), add_special_tokens=False).ids
        round_trip = tok.decode(ids, skip_special_tokens=False).encode("utf-8") == s  # then the C test checks it too
        lines.append("sample\t%d\t%s\t%d" % (k, " ".join(map(str, ids)), round_trip))
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return len(cases), n_decode, len(samples)


def pieces_for(tok_path):
    d = json.load(open(tok_path, encoding="utf-8"))
    vocab = sorted(d["model"]["vocab"], key=d["model"]["vocab"].get)
    return ([a["content"] for a in d["added_tokens"]] + vocab[:5] + vocab[-5:] + vocab[256:266] +
            ["", "not a piece", "<|eot_id", "Ġ", " ", "\u0120the", "<unk>"])


def main():
    if not os.path.exists("tokenizer.h"):
        sys.exit("run from the repo root")
    llama3 = None
    if "--llama3" in sys.argv:
        llama3 = sys.argv[sys.argv.index("--llama3") + 1]
    os.makedirs(OUT, exist_ok=True)
    files, lines = corpus()
    print("corpus: %d files, %d lines, %d characters" % (len(files), len(lines), sum(map(len, lines))))
    samples = shared_samples()
    if not samples:
        print("no shared SAMSum/Alpaca samples: no sample lines")
    made = [make_llama3()] + list(make_gpt2())
    for path in made:
        added = [a["content"] for a in json.load(open(path, encoding="utf-8"))["added_tokens"]]
        name = os.path.splitext(os.path.basename(path))[0]
        n = write_expected(os.path.join(OUT, name + "_expected.txt"), path, test_strings(added), samples, pieces_for(path))
        print("%-10s %7d bytes  %d encode, %d decode, %d sample cases" % (name, os.path.getsize(path), *n))
    if llama3:
        added = [a["content"] for a in json.load(open(llama3, encoding="utf-8"))["added_tokens"]]
        n = write_expected(os.path.join(OUT, "llama3_expected.txt"), llama3, test_strings(added), samples,
                           pieces_for(llama3), n_decode=200)
        print("llama3     %d encode, %d decode, %d sample cases (model line: %s; the test reads $LLAMA3_TOKENIZER)"
              % (*n, llama3))


if __name__ == "__main__":
    main()
