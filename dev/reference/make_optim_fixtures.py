#!/usr/bin/env python3
# Regenerate (from the repository root, CPU only, no network, ~6 s):
#
#     python3 dev/reference/make_optim_fixtures.py
#
# Reference steps of two optimizers, run eagerly on the CPU by their own code, for
# test/test_optim.c (train_llama2.c's adamw8bit_update, adamw_torchao_update and
# anyprecision_update, compared bit for bit):
#
# - torchao.optim.AdamW8bit: its 8-bit path (numel >= 4096 and a multiple of 256:
#   exp_avg / exp_avg_sq as OptimState8bit, codes + one absmax per block of 256) and
#   its fp32 path (the other tensors: plain fp32 moments, the same formula).
# - llama_recipes.policies.AnyPrecisionAdamW: bf16 parameters, gradients, moments
#   and Kahan compensation, use_kahan_summation off and on.
#
# Writes test/fixtures/optim/:
#   optim.json             each run's hyperparameters (as the Python floats passed),
#                          steps, tensors (name, numel, 8-bit or not) and the versions
#   optim.safetensors      per run <r> and tensor <x>: <r>.<x>.p0 (the initial
#                          parameters), and for each step t = 1..steps <r>.<x>.g<t> (the
#                          gradient) and the state after it: <r>.<x>.p<t>; 8-bit
#                          .m_codes<t> .m_absmax<t> .v_codes<t> .v_absmax<t> (U8, F32);
#                          fp32 path .m<t> .v<t>; AnyPrecision (all BF16) .m<t> .v<t>,
#                          with Kahan .c<t>. States start at zero, as both optimizers
#                          start them (8-bit: codes 0 and absmax 0).
# and support/optimizer_qmap.h: torchao's two 256-entry code tables
# (create_dynamic_map(signed=True / False)) as C hex floats; optim.safetensors also
# holds them (qmap.signed, qmap.unsigned).
#
# Eager, not compiled: AdamW8bit.step() runs single_param_adam through torch.compile;
# TORCHDYNAMO_DISABLE=1 (set before torch is imported) makes torch.compile return the
# function itself, checked below. (Compiled, inductor's C++ rounds differently: in a
# trial 372 of 1000 fp32-path moments and 251 of 5120 8-bit-path parameters differed
# after 3 steps.)
#
# Square roots: torch's CPU float32 sqrt (and pow(x, 0.5)) is MKL's vmsSqrt, which on
# the AMD EPYC this was made on is not correctly rounded (1 ulp off for ~20% of
# inputs, up to 0.75 ulp of error), so its bits depend on the machine and MKL's code
# path. Both optimizers' fp32 square roots are taken here as IEEE sqrt (numpy's, which
# is correctly rounded) through a TorchDispatchMode: what torch computes on CUDA and in
# builds without MKL, and what C's sqrtf gives. The script prints how many results
# that changed. (bf16 sqrt does not use MKL: fp32 sqrt rounded to bf16.)
#
# torch runs one thread: its bf16 add with alpha (AnyPrecision's
# exp_avg.add_(grad, alpha=1 - beta1)) rounds alpha * grad to bf16 first in the scalar
# loop that ends each thread's chunk of a tensor (its last numel % 32 elements, AVX-512),
# unlike its vector loop; AnyPrecision's tensors here are multiples of 64 elements, so
# every element takes the vector loop (AVX-512 or AVX2) that the C twin follows.
#
# The code tables come from torch's CPU linspace, whose rounding depends on torch's CPU
# capability: AVX2 and AVX-512 give these tables, ATEN_CPU_CAPABILITY=default 73 of the
# 512 entries 1-2 ulp away; the script requires AVX2 or AVX-512 (what torchao computes
# its tables with on an x86 machine, whatever device trains).
#
# Versions used: Python 3.11.7, torch 2.15.0 (CPU capability AVX512; AVX2 gives the same
# files), torchao 0.18.0, llama-recipes 0.0.4.post1, numpy 2.4.6, safetensors 0.8.0.
import os

os.environ["TORCHDYNAMO_DISABLE"] = "1"  # before torch is imported (see above)
import json
import platform
import sys
from importlib.metadata import version

import numpy as np
import torch

torch.set_num_threads(1)
import safetensors
from llama_recipes.policies.anyprecision_optimizer import AnyPrecisionAdamW
from safetensors.torch import save_file
from torch.utils._python_dispatch import TorchDispatchMode
from torchao.optim import AdamW8bit
from torchao.optim.quant_utils import create_dynamic_map

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "test/fixtures/optim")
HEADER = os.path.join(ROOT, "support/optimizer_qmap.h")
f32 = np.float32

# (name, hyperparameters, steps, tensors (name, numel)). The second AdamW8bit run's betas
# put both lerp weights (1 - beta) above 0.5, torch's other lerp formula. The lr and weight
# decay are chosen so that their roundings tell apart: for AdamW8bit fp32(lr) * fp32(wd) is
# not fp32(lr * wd); for AnyPrecision the decay 1 - lr * wd in fp32 and in bf16 move bf16
# parameters differently, and lr * (1 / bc1) is not lr / bc1 at any step (by one fp32 ulp,
# which seldom shows in bf16).
ADAMW8BIT_RUNS = [
    ("adamw8bit", dict(lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1), 3,
     [("a", 4096), ("b", 256 * 20), ("c", 1000), ("d", 4097)]),
    ("adamw8bit_low_betas", dict(lr=8e-3, betas=(0.3, 0.45), eps=1e-6, weight_decay=0.05), 3,
     [("a", 4096), ("c", 600)]),
]
ANYPRECISION_RUNS = [
    ("anyprecision", dict(lr=9e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.7, use_kahan_summation=False), 3,
     [("a", 2048), ("b", 576)]),
    ("anyprecision_kahan", dict(lr=9e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.7, use_kahan_summation=True), 3,
     [("a", 2048), ("b", 576)]),
]


class IeeeSqrt(TorchDispatchMode):
    """fp32 sqrt and pow(x, 0.5) correctly rounded (see the opening comment)."""

    changed = 0
    total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        x = args[0] if args else None
        if (isinstance(x, torch.Tensor) and x.dtype == torch.float32 and
                (func is torch.ops.aten.sqrt.default or (func is torch.ops.aten.pow.Tensor_Scalar and args[1] == 0.5))):
            ieee = torch.from_numpy(np.array(np.sqrt(x.numpy()), dtype=f32))
            IeeeSqrt.changed += int((ieee.view(torch.int32) != out.view(torch.int32)).sum())
            IeeeSqrt.total += ieee.numel()
            return ieee
        return out


def log_uniform(gen, n, lo, hi):  # magnitudes 10^U(lo, hi), random signs
    mag = 10.0 ** (lo + (hi - lo) * torch.rand(n, generator=gen, dtype=torch.float64))
    sign = torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0).double()
    return (mag * sign).float()


def neighbours(x, k):  # the 2k + 1 floats around each positive float32 x, in order
    bits = np.asarray(x, dtype=f32).view(np.int32).astype(np.int64)
    return (bits[..., None] + np.arange(-k, k + 1)).astype(np.int32).view(f32).reshape(-1)


def ties_block(gen, q, gmax, value, inverse):
    """256 positive gradients for a block whose moment at step 1, value(g) (torchao's fp32
    ops from a zero state), divided by the block's absmax value(gmax), lands exactly on
    torchao's rounding boundary (x - q[k] == (q[k+1] - q[k]) * 0.5 in fp32) wherever a
    search finds a gradient for it: the ties that decide which way quantization rounds."""
    A = value(np.array([gmax], dtype=f32))[0]
    g = (torch.rand(256, generator=gen).numpy() * gmax * 0.5).astype(f32)
    g[0] = gmax
    found = 0
    for j, k in enumerate(range(130, 254, 2)):  # codes of the upper half, in both maps positive
        lo, hi = q[k], q[k + 1]
        half = (hi - lo) * f32(0.5)
        xs = neighbours(lo + half, 64)
        xs = xs[(xs - lo) == half]
        gs = neighbours(inverse(xs * A), 256)
        hit = gs[np.isin(value(gs) / A, xs)]
        if hit.size:
            g[1 + j] = hit[0]
            found += 1
    return torch.from_numpy(g), found


def adamw8bit_data(name, numel, gen, steps, w1, w2):
    """The initial parameters and the gradients of each step of tensor `name`."""
    p = log_uniform(gen, numel, -4, 0)
    p[torch.randperm(numel, generator=gen)[: numel // 64]] = 0
    grads = []
    for t in range(steps):
        g = log_uniform(gen, numel, -9, 0.5)
        g[torch.randperm(numel, generator=gen)[: numel // 32]] = 0
        grads.append(g)
    if name == "b":  # blocks of 256 with something to show
        p[:256] = 0  # block 0: parameters and gradients all zero (absmax clipped at 1e-12)
        for t in range(steps):
            grads[t][:256] = 0
            grads[t][256:512] = 0  # block 1: no gradient ever, decay alone
            grads[t][5 * 256:6 * 256] = log_uniform(gen, 256, -10, 1)  # block 5: 11 decades in one block
        grads[1][4 * 256:5 * 256] = 0  # block 4: a zero gradient at step 2 only
        # block 2: exp_avg at step 1 (torchao: lerp(-0.0, g, w1) = fl(w1 * g)) on ties of the signed map;
        # block 3: exp_avg_sq at step 1 (fl(w2 * fl(g * g))) on ties of the unsigned map
        qs = np.array(create_dynamic_map(signed=True), dtype=f32)
        qu = np.array(create_dynamic_map(signed=False), dtype=f32)
        grads[0][512:768], nm = ties_block(gen, qs, f32(10.0), lambda g: f32(w1) * g, lambda m: m / f32(w1))
        grads[0][768:1024], nv = ties_block(gen, qu, f32(0.5), lambda g: f32(w2) * (g * g), lambda v: np.sqrt(v / f32(w2)))
        assert nm >= 10 and nv >= 10, (nm, nv)
        print(f"  b: {nm} exp_avg and {nv} exp_avg_sq elements on rounding ties at step 1")
    return p, grads


def take_step(opt, name, tensors, params, grads, t, out):
    """Step t of opt with the tensors' gradients (kept in out, with the parameters after it);
    each tensor's name and optimizer state after it."""
    for x, _ in tensors:
        params[x].grad = grads[x][t - 1].clone()
        out[f"{name}.{x}.g{t}"] = grads[x][t - 1]
    with IeeeSqrt():
        opt.step()
    for x, _ in tensors:
        out[f"{name}.{x}.p{t}"] = params[x].detach().clone()
    return [(x, opt.state[params[x]]) for x, _ in tensors]


def run_adamw8bit(name, hp, steps, tensors, out, meta):
    gen = torch.Generator().manual_seed(len(name))
    w1, w2 = 1 - hp["betas"][0], 1 - hp["betas"][1]
    params, grads = {}, {}
    for x, numel in tensors:
        p, gs = adamw8bit_data(x, numel, gen, steps, w1, w2)
        params[x] = torch.nn.Parameter(p.clone())
        grads[x] = gs
        out[f"{name}.{x}.p0"] = p
    opt = AdamW8bit([params[x] for x, _ in tensors], **hp)
    for t in range(1, steps + 1):
        for x, st in take_step(opt, name, tensors, params, grads, t, out):
            if hasattr(st["exp_avg"], "codes"):
                assert st["exp_avg"].block_size == 256 and st["exp_avg_sq"].block_size == 256
                for s, k in (("exp_avg", "m"), ("exp_avg_sq", "v")):
                    out[f"{name}.{x}.{k}_codes{t}"] = st[s].codes.clone()
                    out[f"{name}.{x}.{k}_absmax{t}"] = st[s].scale.clone()
            else:
                out[f"{name}.{x}.m{t}"] = st["exp_avg"].clone()
                out[f"{name}.{x}.v{t}"] = st["exp_avg_sq"].clone()
    eight = [x for x, _ in tensors if hasattr(opt.state[params[x]]["exp_avg"], "codes")]
    assert eight == [x for x, n in tensors if n >= 4096 and n % 256 == 0], eight
    meta.append({"name": name, "lr": hp["lr"], "beta1": hp["betas"][0], "beta2": hp["betas"][1], "eps": hp["eps"],
                 "weight_decay": hp["weight_decay"], "steps": steps,
                 "tensors": [{"name": x, "numel": n, "eight_bit": x in eight} for x, n in tensors]})


def run_anyprecision(name, hp, steps, tensors, out, meta):
    gen = torch.Generator().manual_seed(7)  # the same data for both runs: only Kahan differs
    params, grads = {}, {}
    for x, numel in tensors:
        assert numel % 64 == 0  # whole vectors (see the opening comment)
        p = log_uniform(gen, numel, -3, 0).bfloat16()
        p[: numel // 16] = 0
        params[x] = torch.nn.Parameter(p.clone())
        grads[x] = [log_uniform(gen, numel, -8, 0.5).bfloat16() for _ in range(steps)]
        for g in grads[x]:
            g[torch.randperm(numel, generator=gen)[: numel // 32]] = 0
        out[f"{name}.{x}.p0"] = p
    opt = AnyPrecisionAdamW([params[x] for x, _ in tensors], **hp)
    for t in range(1, steps + 1):
        for x, st in take_step(opt, name, tensors, params, grads, t, out):
            out[f"{name}.{x}.m{t}"] = st["exp_avg"].clone()
            out[f"{name}.{x}.v{t}"] = st["exp_avg_sq"].clone()
            if hp["use_kahan_summation"]:
                out[f"{name}.{x}.c{t}"] = st["compensation"].clone()
            assert all(s.dtype == torch.bfloat16 for k, s in st.items() if k != "step")
    meta.append({"name": name, "lr": hp["lr"], "beta1": hp["betas"][0], "beta2": hp["betas"][1], "eps": hp["eps"],
                 "weight_decay": hp["weight_decay"], "kahan": hp["use_kahan_summation"], "steps": steps,
                 "tensors": [{"name": x, "numel": n} for x, n in tensors]})


def write_header(qs, qu):
    def hexf(v):  # shortest hex float: 0x1.fc6666p-1f
        mant, exp = float(v).hex().split("p")
        return mant.rstrip("0").rstrip(".") + "p" + exp + "f"

    def table(name, q):
        rows = [", ".join(hexf(v) for v in q[i:i + 4]) for i in range(0, 256, 4)]
        return f"static const float {name}[256] = {{\n    " + ",\n    ".join(rows) + ",\n};\n"
    with open(HEADER, "w") as f:
        f.write("// torchao's 8-bit optimizer-state codes (torchao.optim.quant_utils.create_dynamic_map:\n"
                "// signed for exp_avg, unsigned for exp_avg_sq; sorted), in fp32 as OptimState8bit\n"
                "// holds them. Written by dev/reference/make_optim_fixtures.py: do not edit.\n"
                "#ifndef OPTIMIZER_QMAP_H\n#define OPTIMIZER_QMAP_H\n\n")
        f.write(table("qmap8_signed", qs) + "\n" + table("qmap8_unsigned", qu) + "\n#endif\n")


def main():
    def ident(x):
        return x
    assert torch.compile(ident, fullgraph=True, dynamic=False) is ident, "torch.compile is not disabled"
    cap = torch.backends.cpu.get_cpu_capability()
    assert cap in ("AVX2", "AVX512"), f"torch's CPU capability is {cap}: the code tables need AVX2 or AVX-512"
    os.makedirs(OUT, exist_ok=True)
    qs = torch.tensor(create_dynamic_map(signed=True), dtype=torch.float32)
    qu = torch.tensor(create_dynamic_map(signed=False), dtype=torch.float32)
    out = {"qmap.signed": qs, "qmap.unsigned": qu}
    meta = {"adamw8bit": [], "anyprecision": []}
    for run in ADAMW8BIT_RUNS:
        print(f"== {run[0]}")
        run_adamw8bit(*run, out, meta["adamw8bit"])
    for run in ANYPRECISION_RUNS:
        print(f"== {run[0]}")
        run_anyprecision(*run, out, meta["anyprecision"])
    print(f"IEEE sqrt changed {IeeeSqrt.changed} of {IeeeSqrt.total} results of torch's CPU sqrt")
    meta["versions"] = {"python": platform.python_version(), "torch": torch.__version__, "torchao": version("torchao"),
                        "llama-recipes": version("llama-recipes"), "numpy": np.__version__,
                        "safetensors": safetensors.__version__}
    save_file({k: v.contiguous() for k, v in sorted(out.items())}, os.path.join(OUT, "optim.safetensors"))
    with open(os.path.join(OUT, "optim.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    write_header(qs.numpy(), qu.numpy())
    print("done")


if __name__ == "__main__":
    sys.exit(main())
