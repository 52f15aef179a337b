# Writes the safetensors fixtures read by test/test_safetensors.c, using the
# Python safetensors library (the reference implementation), torch and numpy.
# Run from the repo root:
#   python3 dev/reference/make_safetensors_fixtures.py
# Outputs (in test/fixtures/safetensors/):
#   dtypes.safetensors   one tensor per dtype, named after it, plus "<name>_expected":
#                        the values converted to F32 by numpy (F16, F64; cross-checked
#                        against torch) or torch (BF16), bit for bit incl. NaN payloads
#   python_f32.safetensors  F32/I32 tensors + metadata, written by safetensors.numpy:
#                        st_write must produce these exact bytes for the same input
import os
import numpy as np
import torch
from safetensors.torch import save_file
from safetensors.numpy import save_file as np_save_file

out = os.path.join("test", "fixtures", "safetensors")
os.makedirs(out, exist_ok=True)

def bits(dtype, words):
    # tensors built from raw bit patterns, so every special case is exact
    return torch.from_numpy(np.array(words, dtype=np.uint16)).view(dtype)

# F16: signed zeros, smallest/largest subnormals, smallest normal, max, inf,
# quiet and signalling NaN, and a few rounded values (0.1, 1/3)
f16 = bits(torch.float16, [0x0000, 0x8000, 0x0001, 0x8001, 0x0200, 0x03ff, 0x83ff, 0x0400, 0x3c00, 0xbc00,
                           0x3555, 0x2e66, 0x7bff, 0xfbff, 0x7c00, 0xfc00, 0x7e00, 0x7c01, 0xfe00, 0xc100])
# BF16: the same categories (bf16 subnormals are below 2^-126)
bf16 = bits(torch.bfloat16, [0x0000, 0x8000, 0x0001, 0x8001, 0x007f, 0x0080, 0x3f80, 0xbf80, 0x3eab, 0x4049,
                             0x7f7f, 0xff7f, 0x7f80, 0xff80, 0x7fc0, 0x7f81, 0xffc0])
# F64 -> F32 rounding: ties to even at 1.0 and at the subnormal end, just above
# a tie, overflow at the FLT_MAX tie, underflow to signed zero
fmax = float(np.finfo(np.float32).max)
f64 = torch.tensor([0.0, -0.0, 1.0, 0.1, 1 / 3, -2.5,
                    1 + 2.0**-24, 1 + 3 * 2.0**-24, 1 + 2.0**-24 + 2.0**-50, -(1 + 2.0**-24),
                    fmax, fmax + 2.0**103, fmax + 2.0**103 - 2.0**80, -(fmax + 2.0**103),
                    1e300, -1e300, 1e-300, -1e-300,
                    2.0**-149, 2.0**-150, 3 * 2.0**-150, 2.0**-150 + 2.0**-200, 2.0**-126,
                    float("inf"), float("-inf"), float("nan")], dtype=torch.float64)
f32 = torch.tensor([[0.0, -0.0, 1.5], [-3.25, 1e-45, float("inf")]], dtype=torch.float32)

def expected(t):
    # The reference F32 values, bit for bit, NaN sign and payload included.
    # numpy converts F16/F64 as IEEE hardware does (keeps NaN sign/payload);
    # torch's CPU kernel canonicalizes F16 NaNs, so it is only cross-checked
    # on the non-NaN values. numpy has no bfloat16: torch's bf16 -> f32 is a shift.
    e = t.float().numpy()
    if t.dtype == torch.bfloat16:
        return torch.from_numpy(e)
    with np.errstate(over="ignore"):  # F64 values beyond FLT_MAX become inf on purpose
        n = t.numpy().astype(np.float32)
    nan = np.isnan(n)
    assert np.array_equal(np.isnan(e), nan), t.dtype
    assert np.array_equal(e.view(np.uint32)[~nan], n.view(np.uint32)[~nan]), t.dtype
    return torch.from_numpy(n)

tensors = {
    "f16": f16, "f16_expected": expected(f16),
    "bf16": bf16, "bf16_expected": expected(bf16),
    "f64": f64, "f64_expected": expected(f64),
    "f32": f32,
    "i32": torch.tensor([0, 1, -1, 2147483647, -2147483648, 123456], dtype=torch.int32),
    "i64": torch.tensor([[0, -1, 42], [2147483647, -2147483648, 7]], dtype=torch.int64),
    "i64_big": torch.tensor([1, 2147483648], dtype=torch.int64),  # does not fit int32
    "scalar": torch.tensor(2.5, dtype=torch.float32),             # shape []
    "empty": torch.zeros((0, 3), dtype=torch.float32),            # zero elements
}
save_file(tensors, os.path.join(out, "dtypes.safetensors"), metadata={"format": "pt"})

np_save_file({"b.weight": np.arange(3, dtype=np.float32) - 1.5,
              "a": np.arange(6, dtype=np.float32).reshape(2, 3) / 4,
              "tokens": np.array([3, 1, 4, 1, 5], dtype=np.int32)},
             os.path.join(out, "python_f32.safetensors"), metadata={"format": "np"})
print("wrote", out)
