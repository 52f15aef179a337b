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


def compare(ours, theirs, what, expect_alpha=None, other="converter"):
    """every key and tensor; returns the list of differences (empty: equal); other: what
    wrote theirs, for the messages"""
    ko, to = fields(ours)
    kt, tt = fields(theirs)
    diffs = []
    for k in sorted(set(ko) | set(kt)):
        if k in NAMED_BY_FOLDER:
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


def convert(lcp, hf_dir, outfile, gtype):
    subprocess.run([sys.executable, os.path.join(lcp, "convert_hf_to_gguf.py"), hf_dir, "--outfile", outfile,
                    "--outtype", gtype], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def convert_lora(lcp, peft_dir, base, outfile, gtype):
    subprocess.run([sys.executable, os.path.join(lcp, "convert_lora_to_gguf.py"), "--base", base, "--outfile", outfile,
                    "--outtype", gtype, peft_dir], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


CASES = [  # name, fixture, flags, gguf types, with the adapter
    ("lora", "tiny_gqa", ["--lora_target_modules", "all-linear", "--merge_adapter"], ["f32", "f16", "bf16", "q8_0"], True),
    ("rslora", "tiny_gqa", ["--lora_target_modules", "all-linear", "--use_rslora", "1", "--merge_adapter"], ["f32"], True),
    ("dora", "tiny_gqa", ["--lora_target_modules", "all-linear", "--use_dora", "--merge_adapter"], ["f32"], False),
    ("full_tied", "tiny_tied", ["--full_finetune"], ["f32", "q8_0"], False),
    ("llama3", "tiny_llama3", ["--full_finetune"], ["f32", "f16"], False),
    ("linear", "tiny_linear", ["--lora_target_modules", "q_proj,k_proj", "--merge_adapter"], ["bf16"], True),
    ("codellama", "tiny_codellama", ["--full_finetune"], ["f32"], False),
    ("mistral", "tiny_mistral", ["--full_finetune"], ["f16"], False),
]


def check_all(lcp):
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, fixture, flags, gtypes, adapter in CASES:
            model = os.path.join(FIX, fixture)
            for g in gtypes:
                tag = f"{name}_{g}"
                extra = ["--export_gguf_adapter", os.path.join(tmp, tag + ".adapter.gguf")] if adapter else []
                out = train(tmp, tag, model, flags + extra, g)
                hf = os.path.join(out, "merged") if "--merge_adapter" in flags else out
                theirs = os.path.join(tmp, tag + ".converter.gguf")
                convert(lcp, hf, theirs, g)
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
        json.dump(measured, open(os.path.join(dest, "measured.json"), "w"), indent=1)
        print("wrote", dest)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", default=None)
    ap.add_argument("--fixtures", action="store_true")
    a = ap.parse_args()
    lcp = llama_cpp_dir(a.llama_cpp)
    failed = check_all(lcp)
    if a.fixtures:
        make_fixtures()
    print(f"{failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
