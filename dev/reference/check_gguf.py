#!/usr/bin/env python3
"""--export_gguf and --export_gguf_adapter against llama.cpp's own converters (never run in CI).

  make train_llama2 && /tmp/venv/bin/python dev/reference/check_gguf.py [--llama-cpp DIR] [--fixtures]

1. Structure and values. For each case the trainer trains a few steps and writes our GGUF;
   llama.cpp's convert_hf_to_gguf.py converts the same Hugging Face folder (the run's
   --merge_adapter output, or full fine-tuning's output folder) with the same --outtype, and
   convert_lora_to_gguf.py the run's PEFT adapter. Every key and every tensor of the two files
   are compared with the gguf package: the same keys (except general.name and
   general.size_label, which the converter guesses from the folder's name and ours leaves
   out), equal values (floats bit for bit), the same tensor names, types and shapes, and the
   same bytes (F32 exact; F16, BF16 and Q8_0 bit-identical: the encodings are deterministic).
   Cases: tiny_gqa LoRA all-linear (f32, f16, bf16, q8_0), DoRA, QLoRA nf4, rsLoRA, full
   fine-tuning of tiny_tied (tied head), the families tiny_llama3 (rope_freqs), tiny_linear
   (rope scaling), tiny_codellama (vocab 32016 with [PADi] tokens and eot) and tiny_mistral.
   The adapter's alpha is compared with rsLoRA's written alpha (scale * r) where it applies:
   convert_lora_to_gguf.py writes peft's alpha, which llama.cpp would scale by alpha / r.
2. --fixtures: with llama-cpp-python, the f32 model and the base (f32) + adapter (f32) of one
   LoRA run on tiny_gqa give the logits of fixed tokens (logits_all); they are written to
   test/fixtures/gguf/ with the tokens and the files, beside the transformers logits of the
   merged Hugging Face model (float64), and test/test_gguf.c compares our forward with them.
   Prints the measured differences (llama.cpp vs transformers, and the two llama.cpp paths).
Needs: gguf, torch, transformers, sentencepiece, numpy (and llama_cpp for --fixtures).
"""
import argparse, glob, json, os, shutil, struct, subprocess, sys, tarfile, tempfile
import numpy as np
import gguf

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIX = os.path.join(ROOT, "test/fixtures")
DATA = os.path.join(FIX, "data.jsonl")
NAMED_BY_FOLDER = {"general.name", "general.size_label"}  # the converter's guesses from the folder name


def llama_cpp_dir(arg):
    if arg:
        return arg
    for d in glob.glob("/tmp/lcp_x/*/vendor/llama.cpp"):
        return d
    sdists = glob.glob("/tmp/lcp_src/llama_cpp_python-*.tar.gz")
    if not sdists:
        sys.exit("no llama.cpp source: give --llama-cpp DIR (with convert_hf_to_gguf.py, conversion/, gguf-py/)")
    dest = "/tmp/lcp_x"
    with tarfile.open(sdists[0]) as t:
        members = [m for m in t.getmembers() if "/vendor/llama.cpp/conv" in m.name or "/vendor/llama.cpp/gguf-py" in m.name]
        t.extractall(dest, members)
    return glob.glob(dest + "/*/vendor/llama.cpp")[0]


def fields(path):
    r = gguf.GGUFReader(path)
    kv = {}
    for k, f in r.fields.items():
        if k.startswith("GGUF."):
            continue
        t = f.types
        if t[0] == gguf.GGUFValueType.ARRAY:
            if t[1] == gguf.GGUFValueType.STRING:
                v = [bytes(f.parts[i]) for i in f.data]
            else:
                v = np.concatenate([f.parts[i] for i in f.data]) if f.data else np.array([])
                v = v.tobytes()  # bit for bit
            kv[k] = (tuple(int(x) for x in t), v)
        elif t[0] == gguf.GGUFValueType.STRING:
            kv[k] = ((int(t[0]),), bytes(f.parts[f.data[0]]))
        else:
            kv[k] = ((int(t[0]),), f.parts[f.data[0]].tobytes())
    ts = {ti.name: (ti.tensor_type.name, [int(x) for x in ti.shape], bytes(ti.data.tobytes())) for ti in r.tensors}
    return kv, ts


def compare(ours, theirs, what, expect_alpha=None, our_template=False, other="converter"):
    """every key and tensor; returns the list of differences (empty: equal). our_template: ours has
    the run's chat template where the folder (and so the converter's file) has none; other: what
    wrote theirs, for the messages"""
    ko, to = fields(ours)
    kt, tt = fields(theirs)
    diffs = []
    for k in sorted(set(ko) | set(kt)):
        if k in NAMED_BY_FOLDER or (our_template and k == "tokenizer.chat_template" and k not in kt):
            continue
        if k not in ko:
            diffs.append(f"key {k} missing from ours")
        elif k not in kt:
            diffs.append(f"key {k} only in ours")
        elif ko[k] != kt[k]:
            if k == "adapter.lora.alpha" and expect_alpha is not None and ko[k][1] == struct.pack("<f", expect_alpha):
                continue
            a, b = ko[k], kt[k]
            diffs.append(f"key {k}: ours {a[0]} {a[1][:60]!r}... {other} {b[0]} {b[1][:60]!r}...")
    for n in sorted(set(to) | set(tt)):
        if n not in to:
            diffs.append(f"tensor {n} missing from ours")
        elif n not in tt:
            diffs.append(f"tensor {n} only in ours")
        else:
            (a_t, a_s, a_d), (b_t, b_s, b_d) = to[n], tt[n]
            if (a_t, a_s) != (b_t, b_s):
                diffs.append(f"tensor {n}: ours {a_t} {a_s}, {other} {b_t} {b_s}")
            elif a_d != b_d:
                x = np.frombuffer(a_d, np.uint8) != np.frombuffer(b_d, np.uint8)
                diffs.append(f"tensor {n} ({a_t}): {int(x.sum())} of {x.size} bytes differ")
    print(f"{'ok' if not diffs else 'FAIL'} {what}: {len(ko)} keys, {len(to)} tensors"
          + ("" if not diffs else "\n    " + "\n    ".join(diffs[:12])))
    return diffs


def train(tmp, name, model, flags, gtype):
    out = os.path.join(tmp, name)
    cmd = [os.path.join(ROOT, "train_llama2"), "--model", model, "--data", DATA, "--max_seq_len", "24",
           "--max_steps", "3", "--batch_size", "2", "--lr", "1e-2", "--threads", "1", "--data_cache_dir", tmp,
           "--output_dir", out, "--gguf_type", gtype, "--export_gguf", out + ".gguf"] + flags
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return out


# the converter with get_vocab_base_pre returning PRE: it names a BPE's pre-tokenizer by the hash of
# the reference tokenizer's ids on its own text, which a tiny trained vocabulary does not reproduce
# (only a real Llama-3 tokenizer hashes to "llama-bpe"); everything else runs as it is
PATCHED_CONVERT = """import runpy, sys
sys.path.insert(0, sys.argv[1])
from conversion import base
pre = sys.argv[2]
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
script = sys.argv[1] + "/convert_hf_to_gguf.py"
sys.argv = [script] + sys.argv[3:]
runpy.run_path(script, run_name="__main__")
"""
# the files of a model folder the converter reads for the vocabulary and the trainer's output does not carry
TOKENIZER_SIDE_FILES = ("tokenizer_config.json", "chat_template.jinja", "chat_template.json")


def convert(lcp, hf_dir, outfile, gtype, pre=None, model_dir=None):
    for f in TOKENIZER_SIDE_FILES if model_dir else ():
        if os.path.exists(os.path.join(model_dir, f)):
            shutil.copy(os.path.join(model_dir, f), hf_dir)
    args = [hf_dir, "--outfile", outfile, "--outtype", gtype]
    cmd = [sys.executable, "-c", PATCHED_CONVERT, lcp, pre] + args if pre else [sys.executable, os.path.join(lcp, "convert_hf_to_gguf.py")] + args
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def convert_lora(lcp, peft_dir, base, outfile, gtype):
    subprocess.run([sys.executable, os.path.join(lcp, "convert_lora_to_gguf.py"), "--base", base, "--outfile", outfile,
                    "--outtype", gtype, peft_dir], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


CASES = [  # name, fixture, flags, gguf types, with the adapter (, the BPE pre-tokenizer's name)
    ("lora", "tiny_gqa", ["--lora_target_modules", "all-linear", "--merge_adapter"], ["f32", "f16", "bf16", "q8_0"], True),
    ("rslora", "tiny_gqa", ["--lora_target_modules", "all-linear", "--use_rslora", "1", "--merge_adapter"], ["f32"], True),
    ("dora", "tiny_gqa", ["--lora_target_modules", "all-linear", "--use_dora", "--merge_adapter"], ["f32"], False),
    ("full_tied", "tiny_tied", ["--full_finetune"], ["f32", "q8_0"], False),
    ("llama3", "tiny_llama3", ["--full_finetune"], ["f32", "f16"], False),
    ("linear", "tiny_linear", ["--lora_target_modules", "q_proj,k_proj", "--merge_adapter"], ["bf16"], True),
    ("codellama", "tiny_codellama", ["--full_finetune"], ["f32"], False),
    ("mistral", "tiny_mistral", ["--full_finetune"], ["f16"], False),
    ("llama3_bpe", "tiny_llama3_bpe", ["--full_finetune"], ["f32", "q8_0"], False, "llama-bpe"),
    ("llama3_bpe_lora", "tiny_llama3_bpe", ["--lora_target_modules", "all-linear", "--merge_adapter"], ["f16"], True, "llama-bpe"),
]


def check_all(lcp):
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, fixture, flags, gtypes, adapter, *pre in CASES:
            model = os.path.join(FIX, fixture)
            for g in gtypes:
                tag = f"{name}_{g}"
                extra = ["--export_gguf_adapter", os.path.join(tmp, tag + ".adapter.gguf")] if adapter else []
                out = train(tmp, tag, model, flags + extra, g)
                hf = os.path.join(out, "merged") if "--merge_adapter" in flags else out
                theirs = os.path.join(tmp, tag + ".converter.gguf")
                convert(lcp, hf, theirs, g, pre[0] if pre else None, model)
                failed += bool(compare(out + ".gguf", theirs, f"{tag}: --export_gguf == convert_hf_to_gguf.py"))
                if adapter:
                    theirs = os.path.join(tmp, tag + ".converter.adapter.gguf")
                    convert_lora(lcp, out, model, theirs, g)
                    cfg = json.load(open(os.path.join(out, "adapter_config.json")))
                    alpha = None
                    if cfg.get("use_rslora"):
                        r = cfg["r"]
                        alpha = np.float32(np.float32(cfg["lora_alpha"]) / np.float32(np.sqrt(r))) * np.float32(r)
                        alpha = float(alpha)
                    failed += bool(compare(os.path.join(tmp, tag + ".adapter.gguf"), theirs,
                                           f"{tag}: --export_gguf_adapter == convert_lora_to_gguf.py", alpha))
        # QLoRA: the 4-bit base dequantized. The converter has no 4-bit input to read, so the
        # reference is our own --merge_adapter folder of a run that merges the same way
        # (--merge_adapter refuses --quantize): the GGUF must hold dequant(W) + s B A, which
        # transformers' logits check below confirms through llama.cpp when --fixtures runs.
    return failed


def llama_logits(model_path, tokens, lora=None):
    from llama_cpp import Llama
    # the KV cache in f32 (llama.cpp's default, f16, rounds K and V: 6e-4 of the logits' scale measured)
    kw = dict(model_path=model_path, logits_all=True, n_ctx=64, n_threads=1, n_batch=64, verbose=False, seed=0,
              type_k=0, type_v=0, flash_attn=False)
    if lora:
        kw["lora_path"] = lora
    llm = Llama(**kw)
    llm.reset()
    llm.eval(tokens)
    n_vocab = llm.n_vocab()
    out = np.array(llm.scores[: len(tokens), :n_vocab], dtype=np.float32)
    del llm
    return out


def make_encodings(dest):
    """gguf-py's F16, BF16 and Q8_0 encodings of edge values, as one GGUF file (test_gguf.c
    encodes x itself and compares bytes): ties, subnormals, overflow, and Q8_0 blocks whose
    x / d lands on .5"""
    rng = np.random.default_rng(5)
    f16_ties = [1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, -(2 + 2.0 ** -10), 2.0 ** -25, 3 * 2.0 ** -25, 2.0 ** -24 * 1.5,
                65504.0, 65519.0, 65520.0, 1e6, -1e6, 6.1e-5, 5.9e-8, 2.0 ** -26, 0.0, -0.0, 1e-40]
    bf16_ties = [float(np.frombuffer(np.uint32(u).tobytes(), np.float32)[0]) for u in
                 (0x3f808000, 0x3f818000, 0xbf808000, 0x7f7fffff, 0x00008000, 0x00018000, 0x7f7f8000)]
    x = np.concatenate([np.array(f16_ties + bf16_ties, np.float32),
                        rng.standard_normal(256).astype(np.float32) * np.float32(3.0),
                        (rng.standard_normal(128) * 1e-6).astype(np.float32),
                        np.arange(-127, 129, dtype=np.float32) * np.float32(0.5),  # q = k + .5 exactly (d = 1 when max|x| = 127)
                        np.zeros(32, np.float32)])
    x = np.concatenate([x, np.zeros((-len(x)) % 32, np.float32)])
    w = gguf.GGUFWriter(os.path.join(dest, "encodings.gguf"), "llama")
    w.add_tensor("x", x)
    for q in ("F16", "BF16", "Q8_0"):
        t = gguf.GGMLQuantizationType[q]
        w.add_tensor("x_" + q.lower(), gguf.quants.quantize(x, t), raw_dtype=t)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()


GGUF_FIX_FLAGS = ["--max_seq_len", "24", "--max_steps", "4", "--batch_size", "2", "--lr", "2e-2", "--threads", "1",
                  "--seed", "7", "--lora_target_modules", "all-linear", "--lora_dropout", "0", "--gguf_type", "f32"]


# ---------------------------------------------------------------------------------------
# byte-level BPE (tiny_llama3_bpe) and chat templates through llama.cpp itself

BPE_FIX_FLAGS = ["--max_seq_len", "24", "--max_steps", "4", "--batch_size", "2", "--lr", "2e-2", "--threads", "1",
                 "--seed", "7", "--full_finetune"]


def hard_strings():
    """make_bpe_fixtures.py's hard strings (contractions, digit runs, CRLF and blank lines, runs of
    spaces, accents, scripts, emoji, controls) and special-token text"""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from make_bpe_fixtures import HARD
    specials = ["<|begin_of_text|>Hello<|eot_id|>", "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>",
                "<|eot_id", "|eot_id|>", "<|<|eot_id|>|>", "x<|eom_id|>y", " <|python_tag|> ", "<tool>call</tool>",
                "a <tool> b", "I've been 'told he's there, 'RE you sure? \r\n\r\n  3333333 33.3 -----====="]
    return [h for h in HARD if h] + specials


# where llama.cpp's own tokenizer splits otherwise than tokenizers (so with the converter's file as with ours)
LLAMA_CPP_SPLITS_OTHERWISE = {
    "x'\u017fy": "its Llama-3 regex spells (?i:'s|...) as '[sS]|...: the long s U+017F, which case-folds to s, is not matched",
    "\U0001E5D0 \U0001E5F1": "its Unicode tables: U+1E5F1 (Ol Onal digit one, Unicode 16) is not a number to it",
}
# and for bpe_gpt2.json, made to hold what the GGUF format has no place for
LLAMA_CPP_GPT2_OTHERWISE = {
    " " * 17: "a merge listed twice in model.merges (bpe_gpt2.json's \"\u0120\u0120\u0120\u0120 \u0120\u0120\u0120\u0120\", "
              "listed again at the end) ranks where it is listed last in tokenizers, first in llama.cpp (the converter writes both)",
    "a <tool> b": "<tool>'s rstrip (it takes the space after it): GGUF has no place for an added token's lstrip/rstrip",
}


def compare_tokenizers(path, tokenizer_json, what, known=LLAMA_CPP_SPLITS_OTHERWISE):
    """llama.cpp's tokenizer reading the GGUF at path against tokenizers' on the hard strings: 1 when any
    differs (but the differences known, which are said)"""
    from llama_cpp import Llama
    from tokenizers import Tokenizer
    hf = Tokenizer.from_file(tokenizer_json)
    voc = Llama(model_path=path, vocab_only=True, verbose=False)
    strings, bad = hard_strings(), []
    for text in strings:
        want = hf.encode(text, add_special_tokens=False).ids
        got = voc.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        plain = "<|" not in text and "<tool>" not in text
        got_plain = voc.tokenize(text.encode("utf-8"), add_bos=False, special=False) if plain else got
        if got != want or got_plain != want:
            bad.append((text, want, got, got_plain))
    why = known
    known = [b for b in bad if b[0] in why]
    bad = [b for b in bad if b[0] not in why]
    print(f"{'ok' if not bad else 'FAIL'} {what}: llama.cpp's tokenizer (our GGUF alone) == tokenizers on {len(strings)} hard "
          f"strings, but {len(known)} llama.cpp splits otherwise" +
          "".join(f"\n    {t!r}: tokenizers {w}, llama.cpp {g} (special=False {gp})" for t, w, g, gp in bad[:12]) +
          "".join(f"\n    note {t!r}: tokenizers {w}, llama.cpp {g}: {why[t]}" for t, w, g, gp in known))
    return int(bool(bad))


def check_bpe_llama_cpp(tmp, dest=None):
    """llama.cpp reading only our file: its tokenizer against tokenizers', its logits against
    transformers', its chat template the folder's. Returns (failures, measured)"""
    import torch
    from llama_cpp import Llama
    from transformers import LlamaForCausalLM
    model = os.path.join(FIX, "tiny_llama3_bpe")
    out = os.path.join(tmp, "bpe_run")
    subprocess.run([os.path.join(ROOT, "train_llama2"), "--model", model, "--data", DATA] + BPE_FIX_FLAGS +
                   ["--data_cache_dir", tmp, "--output_dir", out, "--gguf_type", "f32", "--export_gguf", out + ".gguf"],
                   check=True, stdout=subprocess.DEVNULL)
    failed = 0
    failed += compare_tokenizers(out + ".gguf", os.path.join(model, "tokenizer.json"), "tiny_llama3_bpe")
    voc = Llama(model_path=out + ".gguf", vocab_only=True, verbose=False)
    with open(os.path.join(model, "tokenizer_config.json"), encoding="utf-8") as f:
        folder_template = json.load(f)["chat_template"]
    got = voc.metadata.get("tokenizer.chat_template")
    print(f"{'ok' if got == folder_template else 'FAIL'} llama.cpp's tokenizer.chat_template == tokenizer_config.json's, byte for byte")
    failed += got != folder_template
    del voc
    rng = np.random.default_rng(4321)
    tokens = [400] + [int(x) for x in rng.integers(0, 412, 23)]
    with torch.no_grad():
        ref = LlamaForCausalLM.from_pretrained(out, dtype=torch.float64).eval()(torch.tensor([tokens])).logits[0].numpy()
    got = llama_logits(out + ".gguf", tokens)
    scale = float(np.abs(ref).max())
    d = float(np.abs(got - ref).max())
    print(f"{'ok' if d <= 2e-5 * scale else 'FAIL'} llama.cpp's logits (our f32 GGUF) vs transformers (float64, the run's "
          f"folder): {d:.3g} ({d / scale:.3g} of their scale {scale:.3g}; tolerance 2e-5)")
    failed += d > 2e-5 * scale
    measured = {"bpe_tokens": len(tokens), "bpe_vocab": int(ref.shape[1]), "bpe_logit_scale": scale,
                "bpe_llama_cpp_vs_transformers": d}
    if dest:
        np.asarray(tokens, "<i4").tofile(os.path.join(dest, "bpe_tokens.i32"))
        ref.astype("<f4").tofile(os.path.join(dest, "bpe_transformers_logits.f32"))
        got.astype("<f4").tofile(os.path.join(dest, "bpe_llama_cpp_logits.f32"))
        w = gguf.GGUFWriter(os.path.join(dest, "bpe_vocab.gguf"), "llama")  # the vocabulary keys (== the converter's)
        w.kv_data[0].clear()
        kv, _ = fields(out + ".gguf")
        r = gguf.GGUFReader(out + ".gguf")
        for k, fld in r.fields.items():
            if k.startswith("tokenizer."):
                v = fld.contents()
                t = fld.types
                if t[0] == gguf.GGUFValueType.ARRAY:
                    w.add_key_value(k, v, t[0], sub_type=t[1])
                else:
                    w.add_key_value(k, v, t[0])
        w.write_header_to_file(); w.write_kv_data_to_file(); w.close()
    return failed, measured


def check_gpt2(lcp, tmp):
    """GPT-2's pre-tokenizer (ByteLevel's own regex, "gpt-2"): bpe_gpt2.json (older "a b" merges, added
    tokens with lstrip, rstrip, normalized) in a random tiny model: the file equals the converter's, and
    llama.cpp's tokenizer reading it gives tokenizers' ids (but LLAMA_CPP_GPT2_OTHERWISE)"""
    folder, out = os.path.join(tmp, "gpt2"), os.path.join(tmp, "gpt2_run")
    os.makedirs(folder, exist_ok=True)
    cfg = json.load(open(os.path.join(FIX, "tiny_llama3_bpe/config.json")))
    cfg.update(vocab_size=1024, bos_token_id=0, eos_token_id=0)
    json.dump(cfg, open(os.path.join(folder, "config.json"), "w"))
    shutil.copy(os.path.join(FIX, "tokenizer/bpe_gpt2.json"), os.path.join(folder, "tokenizer.json"))
    subprocess.run([os.path.join(ROOT, "train_llama2"), "--model", folder, "--data", DATA, "--max_seq_len", "24", "--max_steps", "1",
                    "--batch_size", "2", "--threads", "1", "--full_finetune", "--random_init", "--data_cache_dir", tmp,
                    "--output_dir", out, "--gguf_type", "f32", "--export_gguf", out + ".gguf"], check=True, stdout=subprocess.DEVNULL)
    failed = compare_tokenizers(out + ".gguf", os.path.join(folder, "tokenizer.json"), "bpe_gpt2.json", LLAMA_CPP_GPT2_OTHERWISE)
    convert(lcp, out, os.path.join(tmp, "gpt2.converter.gguf"), "f32", "gpt-2", folder)
    return failed + bool(compare(out + ".gguf", os.path.join(tmp, "gpt2.converter.gguf"), "gpt2: --export_gguf == convert_hf_to_gguf.py"))


def render(template, messages, bos, eos, add_generation_prompt=False):
    """a chat template rendered as transformers renders it (jinja2's sandbox, trim_blocks, lstrip_blocks)"""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(msg):
        raise ValueError(msg)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(messages=messages, bos_token=bos, eos_token=eos,
                                            add_generation_prompt=add_generation_prompt)


def check_chat_templates(lcp, tmp):
    """--data_format chat on a folder without a chat template: the GGUF carries our template of the
    run's family, which (jinja2) renders test/fixtures/chat's conversations to the text of the family's
    published template, whose tokens (transformers; llama.cpp reading our GGUF) are the data loader's
    (test/fixtures/chat/expected.json); and the rest of the file equals the converter's on the run's
    folder with the same tokenizer_config.json (add_bos_token, ids: SpecialVocab for sentencepiece)"""
    from llama_cpp import Llama
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import make_chat_fixtures as mcf
    chats = [json.loads(line)["messages"] for line in open(os.path.join(FIX, "chat/chat.jsonl"), encoding="utf-8")]
    expected = json.load(open(os.path.join(FIX, "chat/expected.json")))["cases"]
    failed = 0
    meta = {"llama2": mcf.LLAMA2, "llama2_legacy": mcf.LLAMA2, "llama3": mcf.LLAMA3}
    for family, (tok_file, cfg, _) in mcf.family_dirs().items():
        folder = os.path.join(tmp, "chat_" + family)
        os.makedirs(folder, exist_ok=True)
        if family.startswith("llama2"):
            for f in os.listdir(os.path.join(FIX, "tiny_gqa")):
                if f in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.model"):
                    shutil.copy(os.path.join(FIX, "tiny_gqa", f), folder)
        else:  # bpe_llama3.json's 3326 tokens: a tiny model of that vocabulary, random weights
            c = json.load(open(os.path.join(FIX, "tiny_llama3_bpe/config.json")))
            c.update(vocab_size=3328, bos_token_id=3298, eos_token_id=[3299, 3305, 3307])
            json.dump(c, open(os.path.join(folder, "config.json"), "w"))
            shutil.copy(os.path.join(ROOT, tok_file), os.path.join(folder, "tokenizer.json"))
        json.dump({k: v for k, v in cfg.items() if k != "chat_template"}, open(os.path.join(folder, "tokenizer_config.json"), "w"))
        out = os.path.join(tmp, "chatrun_" + family)
        flags = ["--random_init"] if family == "llama3" else []
        subprocess.run([os.path.join(ROOT, "train_llama2"), "--model", folder, "--data", os.path.join(FIX, "chat/chat.jsonl"),
                        "--data_format", "chat", "--max_seq_len", "64", "--max_steps", "1", "--batch_size", "1", "--threads", "1",
                        "--full_finetune", "--data_cache_dir", tmp, "--output_dir", out, "--gguf_type", "f32",
                        "--export_gguf", out + ".gguf"] + flags, check=True, stdout=subprocess.DEVNULL)
        r = gguf.GGUFReader(out + ".gguf")
        template = r.fields["tokenizer.chat_template"].contents()
        bos, eos = cfg["bos_token"], cfg["eos_token"]
        hf = mcf.hf_tokenizer(os.path.join(ROOT, tok_file), os.path.dirname(os.path.join(FIX, "chat", family, "x")))
        voc = Llama(model_path=out + ".gguf", vocab_only=True, verbose=False)
        bad, notes = [], set()
        for i, (msgs, want) in enumerate(zip(chats, expected[family]["chats"])):
            ours, theirs = render(template, msgs, bos, eos), render(meta[family], msgs, bos, eos)
            ids_hf = hf(ours, add_special_tokens=False)["input_ids"]
            ids_lcp = voc.tokenize(ours.encode("utf-8"), add_bos=False, special=True)
            if ours != theirs or ids_hf != want["ids"]:
                bad.append(f"chat {i}: text {'==' if ours == theirs else '!='} the published template's; transformers' ids "
                           f"{'==' if ids_hf == want['ids'] else '!='} the data loader's")
            if ids_lcp != want["ids"] and not (family == "llama2" and ids_lcp == expected["llama2_legacy"]["chats"][i]["ids"]):
                bad.append(f"chat {i}: llama.cpp's ids (our GGUF) != the data loader's:\n      {ids_lcp}\n      {want['ids']}")
            elif ids_lcp != want["ids"]:
                notes.add("llama.cpp's sentencepiece tokenizer gives text after a special token the dummy prefix: its ids are "
                          "the legacy encoding's (\"legacy\": true), this run trained without it")
        print(f"{'ok' if not bad else 'FAIL'} {family}: our chat template (from the GGUF) renders {len(chats)} chats to the "
              "published template's text; their tokens (transformers; llama.cpp on our GGUF) == the data loader's"
              + "".join("\n    " + b for b in bad) + "".join("\n    note: " + n for n in notes))
        failed += bool(bad)
        # llama.cpp's own (non-Jinja) template engine: which built-in format it takes ours for, and its text
        import ctypes
        import llama_cpp
        msgs = chats[1]
        arr = (llama_cpp.llama_chat_message * len(msgs))(*[llama_cpp.llama_chat_message(m["role"].encode(), m["content"].encode()) for m in msgs])
        buf = ctypes.create_string_buffer(8192)
        n = llama_cpp.llama_chat_apply_template(template.encode(), arr, len(msgs), False, buf, len(buf))
        builtin = buf.raw[:n].decode("utf-8", "replace") if n > 0 else f"(refused: {n})"
        print(f"    llama.cpp's built-in engine renders chat 1 as {builtin!r}\n    ours (jinja2): {render(template, msgs, bos, eos)!r}")
        del voc
        if family == "llama3":  # bpe_llama3.json: 3000 trained tokens and the hard strings' pre-tokens as whole entries
            failed += compare_tokenizers(out + ".gguf", os.path.join(ROOT, tok_file), "bpe_llama3.json")
        theirs = os.path.join(tmp, "chatrun_" + family + ".converter.gguf")
        convert(lcp, out, theirs, "f32", "llama-bpe" if family == "llama3" else None, folder)
        failed += bool(compare(out + ".gguf", theirs, f"chat {family}: --export_gguf == convert_hf_to_gguf.py "
                               "(but our chat template)", our_template=True))
    return failed


def make_fixtures():
    """test/fixtures/gguf/: the run of test/test_gguf.sh (the same flags), its GGUF files, tokens,
    and the logits of llama.cpp (when llama_cpp is installed) and transformers"""
    import torch
    from transformers import LlamaForCausalLM
    dest = os.path.join(FIX, "gguf")
    os.makedirs(dest, exist_ok=True)
    make_encodings(dest)
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(FIX, "tiny_gqa")
        out = os.path.join(tmp, "run")
        subprocess.run([os.path.join(ROOT, "train_llama2"), "--model", model, "--data", DATA] + GGUF_FIX_FLAGS +
                       ["--data_cache_dir", tmp, "--output_dir", out, "--merge_adapter", "--export_gguf", out + ".gguf",
                        "--export_gguf_adapter", out + ".adapter.gguf"], check=True, stdout=subprocess.DEVNULL)
        rng = np.random.default_rng(1234)
        tokens = [1] + [int(x) for x in rng.integers(3, 512, 23)]
        with torch.no_grad():
            hf = LlamaForCausalLM.from_pretrained(os.path.join(out, "merged"), dtype=torch.float64).eval()
            ref = hf(torch.tensor([tokens])).logits[0].numpy()
        scale = float(np.abs(ref).max())
        shutil.copy(out + ".gguf", os.path.join(dest, "model.gguf"))
        shutil.copy(out + ".adapter.gguf", os.path.join(dest, "adapter.gguf"))
        np.asarray(tokens, "<i4").tofile(os.path.join(dest, "tokens.i32"))
        ref.astype("<f4").tofile(os.path.join(dest, "transformers_logits.f32"))
        measured = {"tokens": len(tokens), "vocab": int(ref.shape[1]), "logit_scale": scale}
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            print("SKIP llama.cpp logits: llama_cpp (llama-cpp-python) is not installed")
            llama_cpp = None
        if llama_cpp is not None:
            base = os.path.join(tmp, "base.gguf")  # the base model (f32) by llama.cpp's converter, for base + adapter
            convert(llama_cpp_dir(None), model, base, "f32")
            merged = llama_logits(out + ".gguf", tokens)
            adapted = llama_logits(base, tokens, lora=out + ".adapter.gguf")
            d1 = float(np.abs(merged - ref).max())
            d2 = float(np.abs(adapted - ref).max())
            d3 = float(np.abs(adapted - merged).max())
            print(f"logits scale {scale:.4g}; llama.cpp merged vs transformers(f64) {d1:.3g} ({d1 / scale:.3g} rel); "
                  f"llama.cpp base+adapter vs transformers {d2:.3g} ({d2 / scale:.3g} rel); the two llama.cpp paths {d3:.3g}")
            merged.astype("<f4").tofile(os.path.join(dest, "llama_cpp_logits.f32"))
            adapted.astype("<f4").tofile(os.path.join(dest, "llama_cpp_lora_logits.f32"))
            measured.update({"llama_cpp_vs_transformers": d1, "llama_cpp_lora_vs_transformers": d2,
                             "llama_cpp_lora_vs_merged": d3})
            bpe_failed, bpe_measured = check_bpe_llama_cpp(tmp, dest)
            measured.update(bpe_measured)
        json.dump(measured, open(os.path.join(dest, "measured.json"), "w"), indent=1)
        print("wrote", dest)
        return bpe_failed if llama_cpp is not None else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", default=None)
    ap.add_argument("--fixtures", action="store_true")
    a = ap.parse_args()
    lcp = llama_cpp_dir(a.llama_cpp)
    failed = check_all(lcp)
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        llama_cpp = None
        print("SKIP llama.cpp's tokenizer, logits and chat templates: llama_cpp (llama-cpp-python) is not installed")
    with tempfile.TemporaryDirectory() as tmp:
        if llama_cpp is not None:
            failed += check_chat_templates(lcp, tmp) + check_gpt2(lcp, tmp)
        if llama_cpp is not None and not a.fixtures:
            failed += check_bpe_llama_cpp(tmp)[0]
    if a.fixtures:
        failed += make_fixtures()
    print(f"{failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
