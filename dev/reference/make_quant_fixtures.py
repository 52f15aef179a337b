#!/usr/bin/env python3
# Regenerate (from the repository root, CPU only, no network):
#
#     python3 dev/reference/make_quant_fixtures.py
#
# Writes test/fixtures/quant/cases.safetensors: bitsandbytes' own 4-bit quantization
# of a set of weight tensors (bnb.functional.quantize_4bit with blocksize 64, nf4 and
# fp4, compress_statistics off and on) and its dequantize_4bit, which test/test_quant.c
# compares byte for byte with peft/quant.h. Per case <c>:
#   <w>.w         the input <w>, in the dtype bitsandbytes quantized (F32, BF16 or F16);
#                 the cases <c> = <w>.<nf4|fp4>.dq<0|1> quantize it
#   <c>.meta      I32 [type (1 nf4, 2 fp4), double_quant, rows, cols]
#   <c>.codes     U8 (ceil(numel / 2)) the packed bytes, as quantize_4bit returns them
#   <c>.absmax    F32 (blocks)  compress_statistics=False: the absmax per block of 64;
#                               True: the absmax of the same weights before compression
#                               (a run with False), from which double quantization starts
#   <c>.qabsmax   U8 (blocks)   True only: the 8-bit codes of absmax - offset
#   <c>.absmax2   F32           True only: state2.absmax, one per block of 256
#   <c>.offset    F32 (1)       True only: the mean of the absmax values (torch.mean)
#   <c>.deq       F32 (numel)   dequantize_4bit(codes, state) in fp32 (state.dtype float32:
#                               a model held in bf16 gets these rounded to bf16)
# and the tables: nf4, fp4 (get_4bit_type), dynamic (create_dynamic_map).
import os
import sys

os.environ.setdefault("TORCH_COMPILE_DISABLE", "1")  # bitsandbytes compiles its portable dequantize
import numpy as np
import torch

torch.set_num_threads(1)
import bitsandbytes as bnb
import bitsandbytes.functional as F
from bitsandbytes.backends.default.ops import _dequantize_4bit_compute
from safetensors.torch import save_file

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "test/fixtures/quant/cases.safetensors")
TYPES = {"nf4": 1, "fp4": 2}


def midpoints(quant_type):
    code = F.get_4bit_type(quant_type, device="cpu")
    s = torch.sort(code).values
    return ((s[:-1] + s[1:]) / 2).to(torch.float32)


def weights():
    """name -> tensor (2-D, the dtype bitsandbytes sees)"""
    g = torch.Generator().manual_seed(1234)
    cases = {}
    cases["random"] = torch.randn(64, 320, generator=g)                        # 320 blocks: 2 of 256 in double quant
    cases["llama_scale"] = (torch.randn(96, 200, generator=g) * 0.02)          # a Llama weight's scale, 300 blocks
    cases["llama_bf16"] = (torch.randn(64, 320, generator=g) * 0.02).to(torch.bfloat16)
    cases["llama_f16"] = (torch.randn(64, 192, generator=g) * 0.02).to(torch.float16)
    z = torch.randn(32, 128, generator=g) * 0.02
    z[3:9] = 0                                                                 # whole blocks of zeros
    z[12, :64] = -0.0
    cases["zero_blocks"] = z
    cases["all_zero"] = torch.zeros(16, 64)                                   # absmax all 0: the mean 0, 8-bit zeros
    h = torch.randn(24, 128, generator=g) * 0.02
    h[5, 17] = 1e4                                                             # one huge value in a block
    h[9, 70] = -3e38                                                           # near FLT_MAX: 1 / absmax is subnormal
    h[13, 0:64] *= 1e-37                                                       # absmax below 1e-38 (clamped)
    h[14, 0:64] = torch.randn(64, generator=g) * 1e-40                         # subnormal weights
    cases["outliers"] = h
    # ties: every midpoint of both tables exactly, and one ulp either side, in
    # blocks whose absmax is 1 (w * 1 / 1 = w)
    t = []
    for qt in ("nf4", "fp4"):
        for m in midpoints(qt).tolist():
            for v in (np.nextafter(np.float32(m), np.float32(-2)), np.float32(m), np.nextafter(np.float32(m), np.float32(2))):
                t.append(float(v))
    t = torch.tensor(t, dtype=torch.float32)
    t = torch.cat([t, torch.zeros((-len(t)) % 63)]).reshape(-1, 63)
    cases["ties"] = torch.cat([torch.ones(t.shape[0], 1), t], dim=1).reshape(-1, 64)
    cases["odd_37"] = torch.randn(3, 37, generator=g) * 0.02                   # 111: a short last block, an odd count
    cases["short_tail"] = torch.randn(5, 100, generator=g)                     # 500 = 7 * 64 + 52
    cases["one"] = torch.tensor([[0.5]])
    return cases


def main():
    print("bitsandbytes", bnb.__version__, "torch", torch.__version__)
    out = {"nf4": F.get_4bit_type("nf4", device="cpu").float(), "fp4": F.get_4bit_type("fp4", device="cpu").float(),
           "dynamic": F.create_dynamic_map().float()}
    same_offset, n_dq = 0, 0
    for name, w in weights().items():
        out[name + ".w"] = w.clone().contiguous()
        for qt, tcode in TYPES.items():
            for dq in (0, 1):
                c = f"{name}.{qt}.dq{dq}"
                q, st = F.quantize_4bit(w, blocksize=64, quant_type=qt, compress_statistics=bool(dq))
                st.dtype = torch.float32  # the fp32 values (what a model held in fp32 computes with)
                deq = F.dequantize_4bit(q, st)
                # bitsandbytes' portable dequantize (its default backend), which an AVX-512 CPU
                # does not run: the same values (+-0 aside), unless a row is a multiple of 16
                # but not of 64 (its AVX-512 loop then reads the wrong absmax; no case here)
                portable = _dequantize_4bit_compute(q.reshape(-1), st.absmax if not dq else F.dequantize_blockwise(
                    st.absmax, st.state2) + st.offset, F.get_4bit_type(qt, device="cpu"), 64, w.shape, torch.float32)
                assert torch.equal(deq, portable), c
                assert deq.shape == w.shape
                out[c + ".meta"] = torch.tensor([tcode, dq, w.shape[0], w.shape[1]], dtype=torch.int32)
                out[c + ".codes"] = q.reshape(-1).clone()
                _, plain = F.quantize_4bit(w, blocksize=64, quant_type=qt, compress_statistics=False)
                out[c + ".absmax"] = plain.absmax.float()
                if dq:
                    out[c + ".qabsmax"] = st.absmax.reshape(-1).clone()
                    out[c + ".absmax2"] = st.state2.absmax.float()
                    out[c + ".offset"] = st.offset.reshape(1).float()
                    n_dq += 1
                    exact = np.float32(plain.absmax.double().sum().item()) / np.float32(plain.absmax.numel())
                    same_offset += bool(np.float32(exact) == st.offset.item())
                out[c + ".deq"] = deq.contiguous()
    print(f"torch.mean's offset equals the correctly rounded sum / n in {same_offset} of {n_dq} cases")
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    save_file(out, OUT)
    print("wrote", os.path.relpath(OUT, ROOT), os.path.getsize(OUT), "bytes")


if __name__ == "__main__":
    main()
