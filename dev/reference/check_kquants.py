#!/usr/bin/env python3
"""--gguf_type q4_k_m | q5_k_m | q6_k against llama.cpp's own quantizer (never run in CI).

  make train_llama2 && /tmp/venv/bin/python dev/reference/check_kquants.py [--fixtures]

1. Models. For each shape below the trainer makes a model (--random_init), trains it 2 steps
   (full fine-tuning) and exports f32; then, from the run's checkpoint (--resume), q4_k_m,
   q5_k_m and q6_k. llama.cpp's quantizer (llama_cpp.llama_model_quantize, no importance
   matrix, default parameters) quantizes our f32 file to the same three types. The two files
   of each type are compared as check_gguf.py compares with the converter's: every tensor's
   type and shape equal, its bytes identical; every key and value equal (general.file_type,
   the one key llama-quantize changes in our f32 file, is the type's in both); and
   llama.cpp's logits from both files on fixed tokens (llama-cpp-python, fp32 KV cache)
   equal bit for bit.
   Shapes: "deep" (16 layers, dim 256, hidden 768, GQA: use_more_bits picks layers 0, 1,
   4, 7, 10, 13-15), "tied" (tied embedding: token_embd is the output), "odd" (rows of 288
   and 200: the fallbacks Q5_0 / Q5_1 / Q8_0 and F16), "tied_odd" (dim 80: a tied
   token_embd of Q8_0 falling back to F16), and "70b" (80 layers with GQA, tiny dims:
   llama.cpp's 70B attn_v rule; q4_k_m only, types and bytes).
2. Blocks. ggml's ggml_quantize_chunk (libggml-base through ctypes: the reference
   quantizers llama-quantize runs) encodes hard rows (zeros, a constant, one huge value,
   only negatives, values near fp16's subnormals, mixed magnitudes, random, and rows whose
   blocks change when the compiler fuses a * b + c) as Q4_K, Q5_K, Q6_K, Q5_0, Q5_1, Q8_0.
--fixtures writes what the C tests compare against (test/test_gguf.c, no Python):
   test/fixtures/gguf/kquant_blocks.gguf (the rows as F32 tensors and ggml's blocks of each)
   and test/fixtures/gguf/kquant_types.txt (the types llama-quantize gave every 2-D tensor
   of the shapes above, per file type).
Needs: gguf, numpy, llama_cpp (llama-cpp-python).
"""
import argparse, ctypes, json, os, shutil, subprocess, sys, tempfile
import numpy as np
import gguf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_gguf  # noqa: E402
from check_gguf import fields, llama_logits  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIX = os.path.join(ROOT, "test/fixtures")
DATA = os.path.join(FIX, "data.jsonl")
FTYPES = {"q4_k_m": 15, "q5_k_m": 17, "q6_k": 18}  # llama.h's LLAMA_FTYPE_MOSTLY_*
GGML = {"Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8}

# name: (layers, dim, hidden, heads, kv heads, tied, file types)
SHAPES = {
    "deep": (16, 256, 768, 4, 2, False, list(FTYPES)),
    "tied": (3, 256, 512, 4, 4, True, list(FTYPES)),
    "odd": (2, 288, 200, 4, 2, False, list(FTYPES)),
    "tied_odd": (2, 80, 96, 5, 5, True, ["q4_k_m", "q6_k"]),
    "70b": (80, 256, 256, 4, 1, False, ["q4_k_m"]),
}


def make_model(tmp, name):
    layers, dim, hidden, heads, kv, tied, _ = SHAPES[name]
    d = os.path.join(tmp, name + "_model")
    os.makedirs(d, exist_ok=True)
    cfg = json.load(open(os.path.join(FIX, "tiny_gqa/config.json")))
    cfg.update(num_hidden_layers=layers, hidden_size=dim, intermediate_size=hidden, num_attention_heads=heads,
               num_key_value_heads=kv, head_dim=dim // heads, tie_word_embeddings=tied, initializer_range=0.05)
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=2)
    shutil.copy(os.path.join(FIX, "tiny_gqa/tokenizer.model"), d)
    return d


def export(tmp, name):
    """trains the shape 2 steps (f32 export), then exports each file type from the checkpoint"""
    model = make_model(tmp, name)
    out = os.path.join(tmp, name)
    common = ["--data", DATA, "--max_seq_len", "24", "--max_steps", "2", "--batch_size", "2", "--lr", "1e-3",
              "--threads", "2", "--seed", "3", "--full_finetune", "--data_cache_dir", tmp, "--output_dir", out]
    subprocess.run([os.path.join(ROOT, "train_llama2"), "--model", model, "--random_init", "--gguf_type", "f32",
                    "--export_gguf", out + ".f32.gguf"] + common, check=True, stdout=subprocess.DEVNULL)
    for ft in SHAPES[name][6]:
        subprocess.run([os.path.join(ROOT, "train_llama2"), "--model", model, "--resume", out + "/checkpoint-2",
                        "--gguf_type", ft, "--export_gguf", f"{out}.{ft}.gguf"] + common, check=True, stdout=subprocess.DEVNULL)
    return out


def llama_quantize(src, dst, ftype):
    import llama_cpp
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = FTYPES[ftype]
    p.nthread = 2
    if llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(p)) != 0:
        sys.exit(f"llama_model_quantize failed on {src}")


def compare(ours, theirs, ftype, what):
    """check_gguf's comparison (every key, every tensor's type, shape and bytes), and
    general.file_type the ftype's; returns the differences and the types llama-quantize chose"""
    diffs = check_gguf.compare(ours, theirs, what, other="llama-quantize")
    kv, tt = fields(theirs)
    if kv["general.file_type"][1] != FTYPES[ftype].to_bytes(4, "little"):
        diffs.append(f"general.file_type is not {FTYPES[ftype]}")
        print(f"FAIL {what}: general.file_type")
    counts = {}
    for t, _, _ in tt.values():
        counts[t] = counts.get(t, 0) + 1
    print("    types: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    return diffs, tt


def without_extra_buffers():
    """llama.cpp's CPU backend without its extra buffer types: its AMX kernels (this CPU reports
    AMX, built with -march=native) stop on SIGILL where the kernel grants no AMX tile state, as
    in this sandbox; the plain CPU kernels read the same blocks"""
    import llama_cpp.llama as L
    default = L.llama_cpp.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = False
        return p
    L.llama_cpp.llama_model_default_params = params


def check_models(tmp, logits_tokens):
    failed, types = 0, {}
    for name in SHAPES:
        out = export(tmp, name)
        for ft in SHAPES[name][6]:
            theirs = f"{out}.{ft}.llama-quantize.gguf"
            llama_quantize(out + ".f32.gguf", theirs, ft)
            diffs, tt = compare(f"{out}.{ft}.gguf", theirs, ft, f"{name} {ft} vs llama_model_quantize of our f32")
            failed += bool(diffs)
            types[(name, ft)] = [(n, t) for n, (t, s, _) in tt.items() if len(s) == 2]
            if name != "70b":
                a, b = llama_logits(f"{out}.{ft}.gguf", logits_tokens), llama_logits(theirs, logits_tokens)
                same = np.array_equal(a, b)
                failed += not same
                print(f"{'ok' if same else 'FAIL'} {name} {ft}: llama.cpp's logits from both files equal "
                      f"(largest difference {float(np.abs(a - b).max()):.3g}, logits' scale {float(np.abs(b).max()):.3g})")
    return failed, types


def ggml_lib():
    import llama_cpp
    lib = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so"))
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_void_p]
    return lib


def ggml_quantize(lib, qtype, rows):
    rows = np.ascontiguousarray(rows, np.float32)
    dst = np.zeros(rows.size * 2, np.uint8)  # more than any of these types needs
    n = lib.ggml_quantize_chunk(GGML[qtype], rows.ctypes.data, dst.ctypes.data, 0, rows.shape[0], rows.shape[1], None)
    return dst[:n]


def hard_rows():
    """rows of 256 that stress the searches: each name -> values"""
    rng = np.random.default_rng(49)
    n = 256
    huge = (rng.standard_normal(n) * 0.01).astype(np.float32)
    huge[37] = 3e4
    rows = {
        "zeros": np.zeros(n, np.float32),
        "constant": np.full(n, 0.37, np.float32),
        "negative_constant": np.full(n, -1.5, np.float32),
        "one_huge": huge,
        "only_negative": -np.abs(rng.standard_normal(n)).astype(np.float32),
        "only_positive": np.abs(rng.standard_normal(n)).astype(np.float32) + np.float32(0.5),
        "near_f16_subnormal": (rng.standard_normal(n) * 2e-6).astype(np.float32),
        "below_f16": (rng.standard_normal(n) * 1e-9).astype(np.float32),
        "mixed_magnitudes": (rng.standard_normal(n) * 10.0 ** rng.uniform(-6, 3, n)).astype(np.float32),
        "sparse": np.where(rng.random(n) < 0.05, rng.standard_normal(n), 0).astype(np.float32),
        "steps": (np.arange(n) % 16 - 8).astype(np.float32) * np.float32(0.125),
    }
    for i in range(16):  # weights as trained models have them
        rows[f"normal{i}"] = (rng.standard_normal(n) * 0.02 * (i + 1)).astype(np.float32)
    # rows whose blocks a build that lets the compiler fuse a * b + c (ours with KQ_ROUNDED
    # left empty, gcc -O3 -march=native) gets wrong: of these 2000 rows it changed 100 Q4_K, 583
    # Q5_K and 38 Q6_K blocks (found by encoding them with both builds); these are a few of each
    rng = np.random.default_rng(11)
    scale = 10.0 ** rng.uniform(-4, 1, (2000, 1))
    fma = (rng.standard_normal((2000, n)) * scale).astype(np.float32)
    for i in (10, 35, 43, 1, 2, 8, 23, 41):
        rows[f"fused_differs{i}"] = fma[i]
    return rows


def make_block_fixture(dest):
    lib = ggml_lib()
    rows = hard_rows()
    w = gguf.GGUFWriter(os.path.join(dest, "kquant_blocks.gguf"), "llama")
    for name, x in rows.items():
        w.add_tensor(name, x)
        for q in GGML:
            t = gguf.GGMLQuantizationType[q]
            w.add_tensor(f"{name}.{q}", ggml_quantize(lib, q, x[None, :]), raw_dtype=t)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    # against gguf-py's dequantizers: the blocks of the normal rows read back near x (the
    # format the file's type says; rows below fp16's range are not expected to)
    worst = 0.0
    for name, x in rows.items():
        if not name.startswith("normal"):
            continue
        for q in ("Q4_K", "Q5_K", "Q6_K"):
            b = ggml_quantize(lib, q, x[None, :])
            y = gguf.quants.dequantize(b, gguf.GGMLQuantizationType[q]).reshape(-1)
            worst = max(worst, float(np.abs(y - x).max() / np.abs(x).max()))
    print(f"ok blocks: {len(rows)} rows x {len(GGML)} types written by ggml_quantize_chunk to kquant_blocks.gguf "
          f"(the normal rows' K blocks dequantize within {worst:.3g} of a row's largest magnitude)")


def write_types(dest, types):
    with open(os.path.join(dest, "kquant_types.txt"), "w") as f:
        f.write("# the type llama-quantize (llama_model_quantize) gave each 2-D tensor of an f32 export\n"
                "# (dev/reference/check_kquants.py --fixtures); shape lines: name layers dim hidden heads kv_heads tied\n")
        for name, (layers, dim, hidden, heads, kv, tied, fts) in SHAPES.items():
            f.write(f"shape {name} {layers} {dim} {hidden} {heads} {kv} {int(tied)}\n")
            for ft in fts:
                for n, t in sorted(types[(name, ft)]):
                    f.write(f"{ft} {n} {t}\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixtures", action="store_true", help="write test/fixtures/gguf/kquant_*")
    args = ap.parse_args()
    rng = np.random.default_rng(7)
    tokens = [1] + [int(x) for x in rng.integers(3, 512, 23)]
    without_extra_buffers()
    with tempfile.TemporaryDirectory() as tmp:
        failed, types = check_models(tmp, tokens)
    if args.fixtures:
        dest = os.path.join(FIX, "gguf")
        make_block_fixture(dest)
        write_types(dest, types)
    print("all equal" if not failed else f"{failed} FAILED")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
