#!/usr/bin/env python3
# Regenerate (from the repo root):
#   python3 dev/reference/make_tokenizer_fixtures.py
#
# Writes the reference data for test/test_tokenizer.c using the `sentencepiece`
# Python package (tested with 0.2.x) as the ground truth:
#   test/fixtures/tokenizer/<name>.model          small tokenizers trained here
#   test/fixtures/tokenizer/<name>_expected.txt   sentencepiece's ids / decodes for them
#   test/fixtures/tokenizer/llama2_expected.txt   the same for Meta's Llama-2 tokenizer,
#       written only if ../shared/data/llama2/tokenizer.model exists (that model
#       itself must not be committed)
#
# Everything is deterministic: the training corpus and the test strings are
# generated below from fixed seeds; nothing is downloaded.
#
# Fixture format (trivial to parse in C): one record per line, tab-separated,
# text as lower-case hex (so any bytes, NUL included, survive), ids in decimal:
#   # comment
#   model   <model path relative to the repo root>
#   meta    <vocab_size> <bos_id> <eos_id> <unk_id> <pad_id>
#   encode  <hex text>  <ids space-separated>  <hex of sentencepiece's decode(ids)>
#   decode  <ids space-separated>  <hex of sentencepiece's decode(ids)>
# An empty field (empty text, no ids) is just an empty string between tabs.
import io
import json
import os
import random
import sys

import sentencepiece as spm

OUT = "test/fixtures/tokenizer"
LLAMA = "../shared/data/llama2/tokenizer.model"
SAMSUM = "../shared/data/samsum/samsum_test_300.jsonl"
ALPACA = "../shared/data/alpaca/alpaca_1000.json"

# ----------------------------------------------------------------------------
# training corpus

WORDS = ("the of and to in is was for on that with as by at from his her they this "
         "have had are not be which one you were all we she there been their has would "
         "when who will more no if out so said what up its about into than them can only "
         "other new some could time these two may then do first any my now such like our "
         "over man me even most made after also did many before must through back years "
         "where much your way well down should because each just those people how too "
         "little state good very make world still own see men work long get here between "
         "both life being under never day same another know while last might us great old "
         "year off come since against go came right used take three tokenizer model train "
         "learning rate gradient batch loss token sentence piece Llama fine tuning").split()
CODE = [
    "def main():\n    x = 1\n    for i in range(10):\n        x += i * 2\n    return x\n",
    "int main(int argc, char **argv) {\n\tif (argc < 2) {\n\t\treturn 1;\n\t}\n\treturn 0;\n}\n",
    "for (size_t i = 0; i < n; i++) { out[i] = a[i] + b[i]; }\n",
    "    if self.training:\n        loss = F.cross_entropy(logits, targets)\n",
    "SELECT name, COUNT(*) FROM users WHERE age >= 21 GROUP BY name;\n",
    "<html>\n  <body>\n    <p class=\"x\">Hello &amp; welcome</p>\n  </body>\n</html>\n",
    "const f = (a, b) => a ?? b; // nullish\n",
    "{\"key\": [1, 2, 3], \"nested\": {\"a\": null, \"b\": true}}\n",
]
UNICODE = [
    "Привет, как дела? Всё хорошо, спасибо.", "Москва — столица России.",
    "日本語のテキストです。東京は大きい都市です。", "我爱自然语言处理。今天天气很好。",
    "مرحبا بالعالم، كيف حالك اليوم؟", "Γειά σου κόσμε", "नमस्ते दुनिया",
    "한국어 문장입니다.", "Ünïcödé àccents: café, naïve, résumé, Zürich",
    "emoji 😀😃😄 🎉🎉 👍🏽 ❤️ 🇫🇷 👨‍👩‍👧", "math ∑ ∫ √ ∞ ≤ ≥ ≠ → ← ↔ ∀ ∃",
]


SYLLABLES = ("ka to ri me su na lo ve pi da ne mo ru chi sha ter ing con pre str ion ent "
             "al ous able ly ment ness qu ex dis un re in over ph th gr bl").split()


def corpus(seed=1234, n=6000):
    rng = random.Random(seed)
    # made-up words give BPE enough distinct material for a 4000-piece vocabulary
    fake = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(3000)]
    lines = []
    for i in range(n):
        k = rng.random()
        if k < 0.45:
            w = [rng.choice(WORDS if rng.random() < 0.6 else fake) for _ in range(rng.randint(3, 18))]
            s = " ".join(w)
            lines.append(s[0].upper() + s[1:] + rng.choice([".", "!", "?", ",", ""]))
        elif k < 0.6:
            lines.append(rng.choice(CODE))
        elif k < 0.7:
            lines.append(rng.choice(UNICODE))
        elif k < 0.8:  # numbers
            lines.append(" ".join(str(rng.randint(0, 10 ** rng.randint(1, 9))) for _ in range(rng.randint(1, 6))))
        elif k < 0.9:  # whitespace runs
            ws = rng.choice([" ", "  ", "    ", "\t", "\n", " \t ", "        "])
            lines.append(ws.join(rng.choice(WORDS) for _ in range(rng.randint(2, 8))))
        else:
            lines.append(rng.choice(UNICODE) + " " + " ".join(rng.choice(WORDS) for _ in range(5)))
    return lines


# Llama-2's trainer settings (what Meta's tokenizer.model's trainer_spec says)
LLAMA_SETTINGS = dict(
    model_type="bpe", byte_fallback=True, split_digits=True, allow_whitespace_only_pieces=True,
    remove_extra_whitespaces=False, normalization_rule_name="identity", add_dummy_prefix=True,
    unk_id=0, bos_id=1, eos_id=2, pad_id=-1, character_coverage=0.9995,
    num_threads=1, shuffle_input_sentence=False, minloglevel=2,
)


def train(name, vocab_size, **over):
    settings = dict(LLAMA_SETTINGS)
    settings.update(over)
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus()), model_writer=buf,
                                   vocab_size=vocab_size, **settings)
    path = os.path.join(OUT, name + ".model")
    with open(path, "wb") as f:
        f.write(buf.getvalue())
    return path


# ----------------------------------------------------------------------------
# a tiny protobuf rewriter, only to make a model with UNUSED pieces (which the
# trainer never produces) so that sentencepiece's "resegment" path is covered

def read_varint(b, i):
    x = shift = 0
    while True:
        c = b[i]; i += 1
        x |= (c & 0x7F) << shift; shift += 7
        if not c & 0x80:
            return x, i


def varint(x):
    out = bytearray()
    while True:
        c = x & 0x7F; x >>= 7
        out.append(c | (0x80 if x else 0))
        if not x:
            return bytes(out)


def fields(b):
    i = 0
    while i < len(b):
        tag, i = read_varint(b, i)
        num, wire = tag >> 3, tag & 7
        start = i
        if wire == 0:
            _, i = read_varint(b, i)
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        elif wire == 2:
            n, i = read_varint(b, i)
            start = i
            i += n
        else:
            raise ValueError("unexpected wire type")
        yield num, wire, b[start:i]


def mark_unused(src, dst, every):
    """copies model src to dst with every `every`-th multi-character NORMAL piece made UNUSED"""
    data = open(src, "rb").read()
    out = bytearray()
    k = 0
    for num, wire, val in fields(data):
        if num == 1 and wire == 2:
            piece = dict((n, v) for n, _, v in fields(val))
            typ = read_varint(piece[3], 0)[0] if 3 in piece else 1
            if typ == 1 and len(piece[1].decode()) > 1:
                k += 1
                if k % every == 0:
                    val = b"".join(varint(n << 3 | w) + (varint(len(v)) + v if w == 2 else v)
                                   for n, w, v in fields(val) if n != 3) + varint(3 << 3) + varint(5)
        if wire == 2:
            out += varint(num << 3 | wire) + varint(len(val)) + val
        else:
            out += varint(num << 3 | wire) + val
    open(dst, "wb").write(out)
    return dst


# ----------------------------------------------------------------------------
# test strings

def test_strings():
    t = [
        "", " ", "  ", "   ", "\t", "\n", "\n\n\n", " \t\n ",
        "Hello world", "hello  world", " hello world", "hello world ", "  leading and trailing  ",
        "Hello, world! How are you today?", "The quick brown fox jumps over the lazy dog.",
        "I'm sure it's fine; isn't it?", "e-mail: someone@example.com, URL: https://example.com/a?b=c",
        "def f(x):\n    return x * 2\n\n\nclass A:\n\tpass\n",
        "    four spaces", "\t\ttabs\tand\ttabs", "a\n\nb\r\nc\rd",
        "        ", " " * 33, "\t" * 9, "\n" * 17, "x" + " " * 20 + "y",
        "0", "12345", "3.14159", "1,000,000 and 2024-01-31", "phone 555-0123 ext. 42",
        "😀", "I ❤️ emoji 🎉👍🏽", "👨‍👩‍👧 family", "🇫🇷🇩🇪",
        "Привет мир", "日本語のテキスト", "我爱自然语言处理", "مرحبا بالعالم", "Γειά σου", "नमस्ते",
        "한국어", "café naïve résumé", "mixed English и русский 和中文 🎉 123",
        "▁", "▁▁ already escaped ▁", "<s>", "</s>", "<unk>", "<0x41>", "<s>hello</s>",
        "a" * 100, "ab" * 60, "😀" * 20, " a" * 30, "1" * 40,
        "\x00", "a\x00b", "\x7f\x01\x1b[0m",
        "\ufffd", "\u2581\u2581",
        "Z", "z", "Zz", "q", "\u00a0nbsp\u3000ideographic space",
        "\U0001F9EA rare char \U00010348", "tail\u200b", "\u0301combining",
    ]
    cases = [s.encode("utf-8") for s in t]
    # invalid UTF-8: the Python API takes bytes as-is
    cases += [b"\xff", b"\xfe\xff", b"abc\x80def", b"\xc3", b"\xc3(", b"\xe2\x82", b"\xe2\x82(x",
              b"\xed\xa0\x80 surrogate", b"\xc0\xaf overlong", b"\xf4\x90\x80\x80 too big",
              b"\xf0\x9f\x98", b" \xff \xff ", b"\x80\x80\x80", b"ok \xe6\x97\xa5\xe6 cut"]
    # deterministic random mixes: words, whitespace, unicode, random bytes
    rng = random.Random(99)
    pool = WORDS + [" ", "  ", "\t", "\n", "1", "42", "😀", "日本", "Привет", ".", ",", "é"]
    for _ in range(40):
        cases.append("".join(rng.choice(pool) + rng.choice(["", " "]) for _ in range(rng.randint(1, 30))).encode())
    for _ in range(20):
        cases.append(bytes(rng.randrange(256) for _ in range(rng.randint(1, 24))))
    return cases


def hexs(b):
    return b.hex()


def write_expected(path, model_path, cases, n_decode=60, seed=7):
    sp = spm.SentencePieceProcessor(model_file=model_path)
    lines = ["# generated by dev/reference/make_tokenizer_fixtures.py with sentencepiece %s; do not edit"
             % spm.__version__,
             "model\t" + model_path,
             "meta\t%d %d %d %d %d" % (sp.vocab_size(), sp.bos_id(), sp.eos_id(), sp.unk_id(), sp.pad_id())]
    for c in cases:
        ids = sp.encode(c)
        dec = sp.decode(ids, out_type=bytes) if ids else b""
        lines.append("encode\t%s\t%s\t%s" % (hexs(c), " ".join(map(str, ids)), hexs(dec)))
    # decodes of random id sequences: byte pieces in and out of valid UTF-8,
    # control pieces, <unk>, pieces with leading ▁ in first position
    rng = random.Random(seed)
    V = sp.vocab_size()
    byte_ids = [i for i in range(V) if sp.IsByte(i)]
    special = [i for i in range(V) if sp.IsControl(i) or sp.IsUnknown(i)]
    ws = [i for i in range(V) if sp.id_to_piece(i).startswith("\u2581")]
    for k in range(n_decode):
        ids = []
        for _ in range(rng.randint(1, 12)):
            r = rng.random()
            src = byte_ids if r < 0.35 else special if r < 0.45 else ws if r < 0.6 else range(V)
            ids.append(rng.choice(src))
        if k % 5 == 0:  # a UTF-8 character split over byte pieces
            ch = rng.choice(["é", "日", "😀", "Ж"]).encode()
            ids += [byte_ids[b] if len(byte_ids) == 256 else 0 for b in ch]
        dec = sp.decode(ids, out_type=bytes)
        lines.append("decode\t%s\t%s" % (" ".join(map(str, ids)), hexs(dec)))
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return len(cases), n_decode


def shared_samples():
    out = []
    if os.path.exists(SAMSUM):
        with open(SAMSUM) as f:
            rows = [json.loads(l) for l in f if l.strip()]
        for r in rows[:10]:
            out.append(r["dialogue"].encode())
        for r in rows[10:15]:
            out.append(r["summary"].encode())
    if os.path.exists(ALPACA):
        rows = json.load(open(ALPACA))
        for r in rows[:10]:
            out.append(("%s\n%s\n%s" % (r["instruction"], r["input"], r["output"])).encode())
    return out


def main():
    if not os.path.exists("tokenizer.h"):
        sys.exit("run from the repo root")
    os.makedirs(OUT, exist_ok=True)
    cases = test_strings()
    models = [
        ("tok512", train("tok512", 512, character_coverage=0.98)),
        ("tok1000", train("tok1000", 1000)),
        ("tok4000", train("tok4000", 4000)),
        # not Llama's settings: the other whitespace options, user-defined and
        # extra control symbols
        ("variant", train("variant", 600, add_dummy_prefix=False, remove_extra_whitespaces=True,
                          user_defined_symbols=["<tool>", "[INST]", "foo bar", "ab"],
                          control_symbols=["<ctl>"])),
    ]
    models.append(("unused", mark_unused(os.path.join(OUT, "tok1000.model"), os.path.join(OUT, "unused.model"), 3)))
    extra = [b"<tool>call [INST] foo bar ab abab <ctl>", b"   spaces   everywhere   ", b"[INST][INST]<tool>"]
    for name, path in models:
        n = write_expected(os.path.join(OUT, name + "_expected.txt"), path, cases + extra)
        print("%-8s %6d bytes  %d encode, %d decode cases" % (name, os.path.getsize(path), n[0], n[1]))
    if os.path.exists(LLAMA):
        n = write_expected(os.path.join(OUT, "llama2_expected.txt"), LLAMA, cases + shared_samples(), n_decode=100)
        print("llama2   %d encode, %d decode cases" % n)
    else:
        print("no %s: llama2_expected.txt not written" % LLAMA)


if __name__ == "__main__":
    main()
