#!/usr/bin/env python3
"""torch.nn.functional.scaled_dot_product_attention on the shapes of `dev/cuda/attention --bench`,
forward and backward, as markdown rows in the same columns (the GPU benchmarks' attention part:
attention.cuh against SDPA's flash and cuDNN kernels; docs/performance.md).

  python3 dev/bench_sdpa.py [--device cuda] [--reps 20]

Shapes (Llama-2-7B's attention: 32 heads of 128, bf16), as attention.cu's: square causal at
16k tokens a batch (seq 512 to 4096), and a chunk of 1024 queries against a KV prefix of 4k
to 32k (the last chunk of a sequence: query i sees keys <= t0 + i, the causal mask aligned
bottom-right). Tensors are laid out (B, L, NH, hd) as ours and transformers' are, and passed
to SDPA transposed to (B, NH, L, hd), as transformers does.

Backends, each alone (torch.nn.attention.sdpa_kernel): square shapes with is_causal=True on
FLASH, CUDNN and EFFICIENT. The chunk shapes cannot use is_causal (top-left aligned when the
lengths differ): there, torch.nn.attention.bias.causal_lower_right (which torch routes to the
flash kernel, whose causal mask is bottom-right, or to the efficient kernel's lower-right
mask), and an explicit boolean mask on EFFICIENT and CUDNN. A backend that refuses a shape
gets a row saying so. Before timing, every variant is checked on a small shape of its kind
against the plain definition in float32 (max error over the largest magnitude <= 2e-2:
bf16 inputs and outputs; a wrong mask is off by O(1)).

FLOPs are useful work, the same count as attention.cu's: 4 hd per query-key pair that the mask
keeps, forward; 2.5 times that backward. An explicit mask computes the whole rectangle, so
its rate is lower than its kernel's: it is the time to the same result that is compared.
Times: the median of --reps runs, each between CUDA events, after 3 warm-up runs.

--device cpu --tiny tries the script on the CPU; its numbers mean nothing.
"""
import argparse, datetime, statistics, sys, time
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

NH, HD = 32, 128
SQUARE = [(16384 // T, T) for T in (512, 1024, 2048, 4096)]  # (B, T)
CHUNK, PREFIXED = 1024, [4096, 8192, 16384, 32768]           # a chunk of 1024 queries, KV length T


def attention_flops(B, nh, q_len, kv_len, hd):
    t0 = kv_len - q_len
    pairs = B * nh * (q_len * t0 + 0.5 * q_len * (q_len + 1))
    return 4.0 * pairs * hd


def bottom_right_mask(q_len, kv_len, dev):
    """True where query i (at position kv_len - q_len + i) sees key j."""
    i = torch.arange(q_len, device=dev)[:, None]
    j = torch.arange(kv_len, device=dev)[None, :]
    return j <= kv_len - q_len + i


def variants(square):
    """(name, backend, mask kind) for a shape's kind; mask kind: causal, lower_right or explicit."""
    if square:
        return [("flash, is_causal", SDPBackend.FLASH_ATTENTION, "causal"),
                ("cudnn, is_causal", SDPBackend.CUDNN_ATTENTION, "causal"),
                ("efficient, is_causal", SDPBackend.EFFICIENT_ATTENTION, "causal")]
    return [("flash, causal_lower_right", SDPBackend.FLASH_ATTENTION, "lower_right"),
            ("efficient, causal_lower_right", SDPBackend.EFFICIENT_ATTENTION, "lower_right"),
            ("efficient, explicit mask", SDPBackend.EFFICIENT_ATTENTION, "explicit"),
            ("cudnn, explicit mask", SDPBackend.CUDNN_ATTENTION, "explicit")]


def inputs(B, nh, q_len, kv_len, hd, dev, dtype):
    """q (B, NH, q_len, hd), k, v (B, NH, kv_len, hd): transposed views of (B, L, NH, hd) tensors."""
    def t(L):
        return torch.randn(B, L, nh, hd, device=dev, dtype=dtype).transpose(1, 2).requires_grad_()
    return t(q_len), t(kv_len), t(kv_len), torch.randn(B, q_len, nh, hd, device=dev, dtype=dtype).transpose(1, 2)


def attend(q, k, v, backend, kind):
    q_len, kv_len = q.shape[2], k.shape[2]
    with sdpa_kernel([backend]):
        if kind == "causal":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        mask = causal_lower_right(q_len, kv_len) if kind == "lower_right" else bottom_right_mask(q_len, kv_len, q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def check(backend, kind, dev, dtype):
    """Max error over the largest magnitude of out, dq, dk, dv against float32 math, at a small shape of the kind."""
    q_len, kv_len = (128, 128) if kind == "causal" else (64, 256)
    q, k, v, dout = inputs(1, 4, q_len, kv_len, HD, dev, dtype)
    out = attend(q, k, v, backend, kind)
    got = [out] + list(torch.autograd.grad(out, (q, k, v), dout))
    q32, k32, v32 = (x.detach().float().requires_grad_() for x in (q, k, v))
    s = (q32 @ k32.transpose(-1, -2)) / HD ** 0.5
    ref_out = torch.softmax(s.masked_fill(~bottom_right_mask(q_len, kv_len, dev), float("-inf")), -1) @ v32
    ref = [ref_out] + list(torch.autograd.grad(ref_out, (q32, k32, v32), dout.float()))
    return max(((g.float() - r).abs().max() / r.abs().max()).item() for g, r in zip(got, ref))


def median_ms(fn, dev, reps):
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        if dev.type == "cuda":
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def bench(name, backend, kind, B, nh, q_len, kv_len, dev, dtype, reps, checked):
    lead = f"| SDPA | {name} | {B} | {nh} | {q_len} | {kv_len} | {HD} |"
    if checked is None:
        return lead + " - | - | - | - | - | refused at the check's shape |"
    try:
        q, k, v, dout = inputs(B, nh, q_len, kv_len, HD, dev, dtype)
        out = attend(q, k, v, backend, kind)
        fwd = median_ms(lambda: attend(q, k, v, backend, kind), dev, reps)
        bwd = median_ms(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), dev, reps)
    except (RuntimeError, torch.OutOfMemoryError) as e:  # no kernel for this shape, or the explicit mask's memory
        return lead + f" - | - | - | - | - | refused: {str(e).splitlines()[0][:120]} |"
    flops = attention_flops(B, nh, q_len, kv_len, HD)
    note = f" checked: error {checked:.1e}" if checked <= 2e-2 else f" WRONG: error {checked:.2e} at the check's shape"
    return lead + (f" {fwd:.3f} | {flops / fwd / 1e9:.1f} | {bwd:.3f} | {2.5 * flops / bwd / 1e9:.1f} | "
                   f"{3.5 * flops / (fwd + bwd) / 1e9:.1f} |{note}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--tiny", action="store_true", help="small shapes (to try the script on a CPU)")
    args = ap.parse_args()
    dev, dtype = torch.device(args.device), torch.bfloat16
    if dev.type == "cuda" and not torch.cuda.is_available():
        sys.exit("error: --device cuda but torch sees no GPU (torch.cuda.is_available() is False); --device cpu --tiny to try it")
    nh = 2 if args.tiny else NH
    square = [(2, 128), (1, 256)] if args.tiny else SQUARE
    chunk, prefixed = (64, [256, 512]) if args.tiny else (CHUNK, PREFIXED)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    print(f"<!-- dev/bench_sdpa.py on {name}, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC: "
          f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()} -->")
    print("| impl | variant | B | NH | q len | kv len | hd | fwd ms | fwd TFLOP/s | bwd ms | bwd TFLOP/s | fwd+bwd TFLOP/s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |", flush=True)
    for is_square, shapes in ((True, [(B, T, T) for B, T in square]), (False, [(1, chunk, T) for T in prefixed])):
        for name, backend, kind in variants(is_square):
            try:
                err = check(backend, kind, dev, dtype)
            except RuntimeError:  # the backend has no kernel here at all
                err = None
            for B, q_len, kv_len in shapes:
                print(bench(name, backend, kind, B, nh, q_len, kv_len, dev, dtype, args.reps, err), flush=True)
                if dev.type == "cuda":
                    torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
