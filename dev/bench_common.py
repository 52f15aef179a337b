"""What the GPU benchmarks share (dev/bench_hf.py, dev/bench_ours.py): the model shapes, the
LoRA settings, the FLOP count of trainer/plan.h, and the markdown rows. No torch here.

The FLOP count is trainer/plan.h's flops_per_sequence written out again, so that transformers +
peft get their MFU from the same formula as our trainer prints; dev/bench_ours.py checks the
two against each other on every run (the trainer's own tflops x ms against this).
"""
import json

# transformers' LlamaConfig arguments. "7b": Llama-2-7B (meta-llama/Llama-2-7b-hf's config.json);
# "tiny": the same structure, small enough for a CPU dry run of every script.
SHAPES = {
    "7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096, rms_norm_eps=1e-5),
    "tiny": dict(hidden_size=128, intermediate_size=344, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=4, vocab_size=4096, max_position_embeddings=4096, rms_norm_eps=1e-5),
}

# the issue's two LoRA settings: llama-recipes' default (r 8 on q_proj, v_proj) and r 16 on every
# linear layer; alpha 32 and dropout 0.05 (llama-recipes' lora_config) on both sides
LORA = {
    "qv8": dict(r=8, alpha=32, dropout=0.05, targets=["q_proj", "v_proj"], ours="q_proj,v_proj"),
    "all16": dict(r=16, alpha=32, dropout=0.05, targets="all-linear", ours="all-linear"),
}
ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# H100 SXM and H200: dense bf16 tensor-core peak by NVIDIA's datasheet (989.4 TFLOP/s), the MFU's denominator
PEAK_TFLOPS = {"H100": 989.4, "H200": 989.4}


def peak_tflops(device_name):
    """The datasheet peak for a GPU's name (torch's or nvidia-smi's), or 0 when unknown."""
    for key, tflops in PEAK_TFLOPS.items():
        if key in device_name:
            return tflops
    return 0.0


def flops_per_sequence(cfg, T, lora):
    """trainer/plan.h's flops_per_sequence for LoRA: (4 N + 6 N_lora) T + 3 x 2 L NH hd T^2, with a
    sliding window W < T: T^2 - (T - W)^2 in place of T^2. cfg: config.json as a dict; lora: an entry of LORA."""
    D, H, L, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    NH = cfg["num_attention_heads"]
    NKV = cfg.get("num_key_value_heads") or NH
    hd = cfg.get("head_dim") or D // NH
    Q, KV = NH * hd, NKV * hd
    N = L * (D * Q * 2 + D * KV * 2 + 3 * D * H) + V * D  # every matmul weight, the head included
    shapes = dict(q_proj=(D, Q), k_proj=(D, KV), v_proj=(D, KV), o_proj=(Q, D), gate_proj=(D, H), up_proj=(D, H),
                  down_proj=(H, D))
    targets = ALL_LINEAR if lora["targets"] == "all-linear" else lora["targets"]
    n_lora = sum(L * lora["r"] * (shapes[t][0] + shapes[t][1]) for t in targets)
    W = cfg.get("sliding_window") or 0
    outside = T - W if 0 < W < T else 0
    attn = 2.0 * L * Q * (T * T - outside * outside)
    return (4.0 * N + 6.0 * n_lora) * T + 3 * attn


COLUMNS = ["impl", "LoRA", "seq", "batch", "tokens/s", "TFLOP/s", "MFU", "allocated MiB", "GPU used MiB", "note"]


def header():
    return "| " + " | ".join(COLUMNS) + " |\n|" + " --- |" * len(COLUMNS)


def row(r):
    """One markdown row of a result dict (keys: impl, lora, seq, batch, tok_per_s, tflops, mfu,
    alloc_mib, used_mib, note); missing values print as '-'."""
    def fmt(v, spec):
        return "-" if v is None else format(v, spec)
    mfu = r.get("mfu")
    return "| " + " | ".join([r["impl"], r["lora"], str(r["seq"]), fmt(r.get("batch"), "d"), fmt(r.get("tok_per_s"), ".0f"),
                              fmt(r.get("tflops"), ".1f"), "-" if not mfu else f"{100 * mfu:.1f}%",
                              fmt(r.get("alloc_mib"), ".0f"), fmt(r.get("used_mib"), ".0f"), r.get("note", "")]) + " |"


def emit(r, json_path):
    """Prints the row, and appends it to the JSON-lines file (if any)."""
    print(row(r), flush=True)
    if json_path:
        with open(json_path, "a") as f:
            f.write(json.dumps(r) + "\n")
