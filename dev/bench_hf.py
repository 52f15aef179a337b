#!/usr/bin/env python3
"""transformers + peft, the reference for train_llama2cu's speed (docs/performance.md): LoRA steps of a Llama
model initialised randomly in bf16 on the device, SDPA attention, AdamW, synthetic tokens.

  python3 dev/bench_hf.py --write_config DIR [--shape 7b]     # the model folder both sides use
  python3 dev/bench_hf.py --model DIR [--lora qv8,all16] [--seq 512,2048,4096] [--batch N] [--long]

For each LoRA setting (dev/bench_common.py: r 8 on q_proj,v_proj; r 16 on all-linear) and
sequence length: the largest batch that fits (doubling from 1, then bisecting; --batch N fixes
it), then --steps steps after --warmup, timed with the device synchronised. --long instead
trains one sequence at a time with gradient checkpointing, doubling the length from --long_from
until it runs out of memory or --long_budget seconds. Each result is a markdown row
(dev/bench_common.py's columns) on stdout, and a JSON object appended to --json (which
dev/bench_ours.py reads for its equal-settings runs).

- tokens/s: batch x seq x steps over their time (a step: forward with labels, backward,
  clip_grad_norm_ 1.0 as our trainer's default, AdamW, zero_grad); bf16 autocast over the
  forward, as the HF Trainer's bf16=True (peft keeps the adapters in fp32).
- MFU: trainer.h's FLOP formula (dev/bench_common.py) over the time and --peak_tflops
  (default: the datasheet peak for the GPU's name); recomputed forwards are not counted.
- allocated MiB: torch.cuda.max_memory_allocated over the timed steps (the model included);
  GPU used MiB: cudaMemGetInfo's total - free after them, the caching allocator's reserve and
  the CUDA context included: what our trainer's mem_mb reports.
- PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True unless set: less fragmentation, larger batches.

--device cpu (with --shape tiny, --dtype fp32) runs everything on the CPU, to try the script
without a GPU; its numbers mean nothing.
"""
import argparse, datetime, gc, json, os, shutil, sys, time

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # before torch allocates anything
import torch
import transformers
import peft
from transformers import AutoModelForCausalLM, LlamaConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "dev"))
from bench_common import SHAPES, LORA, flops_per_sequence, peak_tflops, header, emit


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def make_model(cfg_path, lora_name, dev, dtype, checkpointing):
    """The base model drawn on the device in dtype (transformers' own init), wrapped by peft."""
    config = LlamaConfig.from_json_file(cfg_path)
    config.use_cache = False  # training: no KV cache
    with dev:
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lc = LORA[lora_name]
    model = peft.get_peft_model(model, peft.LoraConfig(r=lc["r"], lora_alpha=lc["alpha"], lora_dropout=lc["dropout"],
                                                       target_modules=lc["targets"], task_type="CAUSAL_LM"))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)  # torch's default implementation for the device (foreach on CUDA)
    return model, params, opt


def step(model, params, opt, ids, dev, dtype):
    with torch.autocast(dev.type, dtype=dtype, enabled=dtype != torch.float32):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


def free_memory(dev):
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


SIMULATED_LIMIT = 0  # --simulate_oom_above: steps of more tokens fail as if out of memory (to try the searches on a CPU)


def try_steps(model, params, opt, B, T, n, dev, dtype, vocab):
    """n steps at batch B, each timed alone; None when the device runs out of memory."""
    out_of_memory = False
    times = []
    try:
        if SIMULATED_LIMIT and B * T > SIMULATED_LIMIT:
            raise torch.OutOfMemoryError(f"simulated: {B} x {T} tokens > --simulate_oom_above {SIMULATED_LIMIT}")
        ids = torch.randint(0, vocab, (B, T), device=dev)
        for _ in range(n):
            sync(dev)
            t0 = time.perf_counter()
            loss = step(model, params, opt, ids, dev, dtype)
            sync(dev)
            times.append(time.perf_counter() - t0)
            if loss != loss:
                raise RuntimeError(f"NaN loss at batch {B}, seq {T}")
    except torch.OutOfMemoryError:
        out_of_memory = True  # the exception holds the failed step's tensors: free them outside this block
    if out_of_memory:
        opt.zero_grad(set_to_none=True)
        free_memory(dev)
        return None
    return times


def largest_batch(model, params, opt, T, dev, dtype, vocab, max_tokens):
    """The largest batch whose step fits: doubling from 1, then bisecting to within an eighth."""
    lo, hi = 0, None
    B = 1
    while hi is None and B * T <= max_tokens:
        if try_steps(model, params, opt, B, T, 1, dev, dtype, vocab) is None:
            hi = B
        else:
            lo, B = B, 2 * B
    if hi is None:
        return lo  # capped by max_tokens
    while hi - lo > max(1, lo // 8):
        mid = (lo + hi) // 2
        if try_steps(model, params, opt, mid, T, 1, dev, dtype, vocab) is None:
            hi = mid
        else:
            lo = mid
    return lo


def measure(model, params, opt, B, T, args, dev, dtype, cfg, lora_name, peak, note):
    """The timed steps at batch B as a result row, or None when they do not fit."""
    if try_steps(model, params, opt, B, T, args.warmup, dev, dtype, cfg["vocab_size"]) is None:
        return None
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    times = try_steps(model, params, opt, B, T, args.steps, dev, dtype, cfg["vocab_size"])
    if times is None:
        return None
    t = sum(times)
    tflops = B * args.steps * flops_per_sequence(cfg, T, LORA[lora_name]) / t / 1e12
    r = dict(impl="transformers+peft", lora=lora_name, seq=T, batch=B, tok_per_s=B * T * args.steps / t, tflops=tflops,
             mfu=tflops / peak if peak else None, note=note)
    if dev.type == "cuda":
        free, total = torch.cuda.mem_get_info(dev)
        r.update(alloc_mib=torch.cuda.max_memory_allocated(dev) / 2**20, used_mib=(total - free) / 2**20)
    return r


def throughput(args, dev, dtype, cfg, peak):
    for lora_name in args.lora.split(","):
        model, params, opt = make_model(args.config, lora_name, dev, dtype, False)
        for T in [int(s) for s in args.seq.split(",")]:
            B = args.batch or largest_batch(model, params, opt, T, dev, dtype, cfg["vocab_size"], args.max_tokens)
            note = "batch given" if args.batch else "largest batch that fits"
            r = None
            while B > 0 and r is None:  # a batch that fitted one step may not fit the timed ones
                r = measure(model, params, opt, B, T, args, dev, dtype, cfg, lora_name, peak, note)
                B = B - max(1, B // 8) if r is None else B
            emit(r or dict(impl="transformers+peft", lora=lora_name, seq=T, note="batch 1 does not fit"), args.json)
        del model, params, opt
        free_memory(dev)


def long_context(args, dev, dtype, cfg, peak):
    """One sequence per step, gradient checkpointing: lengths doubling until out of memory or out of
    time. Each length: one step to warm up, one timed (a step at 64k tokens takes most of a minute)."""
    args.warmup, args.steps = 1, 1
    for lora_name in args.lora.split(","):
        model, params, opt = make_model(args.config, lora_name, dev, dtype, True)
        start, T, longest, last_s = time.perf_counter(), args.long_from, 0, 0.0
        while T <= args.long_max:
            # attention grows as T^2: the next step takes up to 4x the last one; stop before the budget would run out
            if longest and time.perf_counter() - start + 4 * last_s * (args.warmup + args.steps) > args.long_budget:
                emit(dict(impl="transformers+peft", lora=lora_name, seq=T, batch=1,
                          note=f"not tried: --long_budget {args.long_budget:.0f} s"), args.json)
                break
            r = measure(model, params, opt, 1, T, args, dev, dtype, cfg, lora_name, peak, "gradient checkpointing")
            if r is None:
                emit(dict(impl="transformers+peft", lora=lora_name, seq=T, batch=1,
                          note="gradient checkpointing: out of memory"), args.json)
                break
            emit(r, args.json)
            longest, last_s = T, T / r["tok_per_s"]
            T *= 2
        print(f"transformers+peft {lora_name}, gradient checkpointing: longest sequence that trained {longest}", flush=True)
        del model, params, opt
        free_memory(dev)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write_config", metavar="DIR", help="write DIR/config.json of --shape, and a tokenizer.model for our "
                    "trainer (test/fixtures' 4000 pieces: the tokens are synthetic anyway), and exit")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="7b")
    ap.add_argument("--model", metavar="DIR", help="folder holding the config.json to benchmark")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--lora", default="qv8,all16", help="comma-separated: " + ", ".join(LORA))
    ap.add_argument("--seq", default="512,2048,4096")
    ap.add_argument("--batch", type=int, default=0, help="fixed batch (0: the largest that fits)")
    ap.add_argument("--max_tokens", type=int, default=131072, help="the batch search stops at batch x seq = this")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--long", action="store_true", help="the long-context sweep instead (gradient checkpointing, batch 1)")
    ap.add_argument("--long_from", type=int, default=4096)
    ap.add_argument("--long_max", type=int, default=1 << 20)
    ap.add_argument("--long_budget", type=float, default=300, help="seconds for each LoRA setting's sweep")
    ap.add_argument("--peak_tflops", type=float, default=None, help="for MFU (default: the GPU's datasheet bf16 peak)")
    ap.add_argument("--simulate_oom_above", type=int, default=0, metavar="TOKENS",
                    help="for trying the script on a CPU: a step of more tokens fails as if out of memory")
    ap.add_argument("--json", help="append the rows as JSON lines to this file")
    args = ap.parse_args()
    global SIMULATED_LIMIT
    SIMULATED_LIMIT = args.simulate_oom_above
    if args.write_config:
        os.makedirs(args.write_config, exist_ok=True)
        LlamaConfig(**SHAPES[args.shape]).to_json_file(os.path.join(args.write_config, "config.json"))
        shutil.copy(os.path.join(ROOT, "test/fixtures/tokenizer/tok4000.model"), os.path.join(args.write_config, "tokenizer.model"))
        return
    if not args.model:
        ap.error("--model DIR (a folder with config.json, e.g. from --write_config) is required")
    args.config = os.path.join(args.model, "config.json")
    cfg = json.load(open(args.config))
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        sys.exit("error: --device cuda but torch sees no GPU (torch.cuda.is_available() is False); --device cpu to try it on the CPU")
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    peak = args.peak_tflops if args.peak_tflops is not None else peak_tflops(name)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    print(f"<!-- dev/bench_hf.py on {name}, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC: "
          f"torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}, "
          f"{args.dtype}, peak {peak} TFLOP/s, PYTORCH_CUDA_ALLOC_CONF={os.environ['PYTORCH_CUDA_ALLOC_CONF']} -->")
    print(header(), flush=True)
    (long_context if args.long else throughput)(args, dev, dtype, cfg, peak)


if __name__ == "__main__":
    main()
