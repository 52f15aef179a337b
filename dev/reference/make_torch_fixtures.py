# Writes the torch.save fixtures read by test/test_torch_zip.c (support/torch_zip.h).
# Run from the repo root, after make_fixtures.py (it reads tiny_gqa and tiny_tied):
#   /tmp/venv/bin/python dev/reference/make_torch_fixtures.py
# Outputs, in test/fixtures/torch/ (see dev/reference/README.md):
#   <name>.bin + <name>.safetensors   accepted files, each with its tensors written again
#                                     by the safetensors library (the reference)
#   refused/<name>.bin                files the reader must refuse; refused/expected.txt
#                                     lists "<name>.bin<TAB><the message's problem>"
#   tiny_gqa_{f32,f16,bf16}/, tiny_tied_{f32,f16,bf16}/, tiny_tied_sharded/
#                                     pytorch_model.bin (or shards + index) + config.json
#                                     + tokenizer.model
import io
import json
import os
import shutil
import struct
import zipfile
from collections import OrderedDict

import torch
from safetensors.torch import load_file, save_file

OUT = os.path.join("test", "fixtures", "torch")
REFUSED = os.path.join(OUT, "refused")
torch.manual_seed(0)


def save_pair(name, tensors):
    """name.bin by torch.save, name.safetensors by the safetensors library (copies: it
    refuses shared storage), checked against torch.load(weights_only=True)."""
    path = os.path.join(OUT, name + ".bin")
    torch.save(tensors, path)
    ref = {k: v.detach().clone().contiguous() for k, v in tensors.items()}
    save_file(ref, os.path.join(OUT, name + ".safetensors"))
    back = torch.load(path, weights_only=True)
    assert list(back) == list(tensors) and all(torch.equal(back[k], ref[k]) or (back[k].isnan() == ref[k].isnan()).all() for k in ref)
    return path


def bits(dtype, words):
    return torch.tensor([w - 0x10000 if w >= 0x8000 else w for w in words], dtype=torch.int16).view(dtype)


def accepted():
    save_pair("f32", {"a": torch.randn(3, 4), "b.weight": torch.arange(5, dtype=torch.float32) - 2.5,
                      "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 3),
                      "special": torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-45, 3.4e38])})
    # F16 and BF16 from bit patterns: signed zeros, subnormals, inf, NaN, ordinary values
    save_pair("f16", {"h": bits(torch.float16, [0x0000, 0x8000, 0x0001, 0x03ff, 0x0400, 0x3c00, 0xbc00, 0x3555, 0x7bff,
                                                0x7c00, 0xfc00, 0x7e00]).reshape(3, 4),
                      "h2": torch.randn(2, 3).half()})
    save_pair("bf16", {"g": bits(torch.bfloat16, [0x0000, 0x8000, 0x0001, 0x007f, 0x0080, 0x3f80, 0xbf80, 0x3eab, 0x7f7f,
                                                  0x7f80, 0xff80, 0x7fc0]).reshape(2, 2, 3),
                       "g2": torch.randn(5).bfloat16()})
    # tied weights: one tensor under two names, one storage
    w = torch.randn(4, 3)
    save_pair("shared", {"model.embed_tokens.weight": w, "lm_head.weight": w, "other": torch.randn(2)})
    # views at an offset of a storage (torch.save writes the whole storage once), and a
    # contiguous view whose size-1 dimension has an unusual stride
    base = torch.arange(24, dtype=torch.float32)
    m = base.view(4, 6)
    save_pair("views", {"whole": base, "row2": m[2], "tail": base[17:], "rows1_3": m[1:3],
                        "unsqueezed": torch.randn(4, 1).t()})
    # model.state_dict(): an OrderedDict with _metadata set by BUILD
    net = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.LayerNorm(2))
    sd = net.state_dict()
    assert hasattr(sd, "_metadata")
    save_pair("state_dict", sd)
    # an nn.Parameter (_rebuild_parameter around _rebuild_tensor_v2), in F16
    save_pair("parameter", {"p": torch.nn.Parameter(torch.randn(2, 3).half()), "t": torch.ones(2)})
    # a ZIP64 archive as miniz writes past 4 GB, made small
    zip64(os.path.join(OUT, "f32.bin"), os.path.join(OUT, "zip64.bin"))
    shutil.copy(os.path.join(OUT, "f32.safetensors"), os.path.join(OUT, "zip64.safetensors"))
    back = torch.load(os.path.join(OUT, "zip64.bin"), weights_only=True)
    assert torch.equal(back["a"], load_file(os.path.join(OUT, "f32.safetensors"))["a"])


def zip64(src, dst):
    """src's entries again, every size and offset in ZIP64 extra fields (0xFFFFFFFF in the
    32-bit fields), a ZIP64 end record and locator: what miniz (torch.save) writes for
    entries past 4 GB. Data stays 64-byte aligned, padded in the local extra field."""
    zin = zipfile.ZipFile(src)
    out, central = bytearray(), bytearray()
    for info in zin.infolist():
        data, name = zin.read(info), info.filename.encode()
        off = len(out)
        x = struct.pack("<HHQQ", 1, 16, len(data), len(data))
        pad = (-(off + 30 + len(name) + len(x) + 4)) % 64
        x += struct.pack("<HH", 0x4246, pad) + b"Z" * pad  # torch's "FB" padding block
        out += struct.pack("<IHHHHHIIIHH", 0x04034b50, 45, 0, 0, 0, 0x21, info.CRC, 0xFFFFFFFF, 0xFFFFFFFF, len(name), len(x))
        out += name + x + data
        cx = struct.pack("<HHQQQ", 1, 24, len(data), len(data), off)
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014b50, 45, 45, 0, 0, 0, 0x21, info.CRC, 0xFFFFFFFF, 0xFFFFFFFF,
                               len(name), len(cx), 0, 0, 0, 0, 0xFFFFFFFF) + name + cx
    n, cd_off = len(zin.infolist()), len(out)
    out += central
    end64 = len(out)
    out += struct.pack("<IQHHIIQQQQ", 0x06064b50, 44, 45, 45, 0, 0, n, n, len(central), cd_off)
    out += struct.pack("<IIQI", 0x07064b50, 0, end64, 1)
    out += struct.pack("<IHHHHIIH", 0x06054b50, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    open(dst, "wb").write(bytes(out))


# ---- hand-assembled pickles (protocol 2), for the refusals torch.save cannot be made to write

def U(s):
    b = s.encode() if isinstance(s, str) else s
    return b"X" + struct.pack("<I", len(b)) + b


def I(n):
    return b"J" + struct.pack("<i", n)


def G(module, name):
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def T(*items):
    return b"(" + b"".join(items) + b"t"


def storage(key, numel, typ="FloatStorage"):
    return T(U("storage"), G("torch", typ), U(key), U("cpu"), I(numel)) + b"Q"


def tensor(key, numel, offset, size, stride, typ="FloatStorage"):
    return (G("torch._utils", "_rebuild_tensor_v2") +
            T(storage(key, numel, typ), I(offset), T(*map(I, size)), T(*map(I, stride)), b"\x89",
              G("collections", "OrderedDict") + b")R") + b"R")


def pdict(*pairs, end=b"."):
    return b"\x80\x02}(" + b"".join(U(k) + v for k, v in pairs) + b"u" + end


def entry(name):
    return zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))  # fixed, so reruns give the same bytes


def archive(path, pkl, records, byteorder=b"little"):
    """a torch.save-like archive (stored entries under archive/) holding pkl and records"""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr(entry("archive/data.pkl"), pkl)
        z.writestr(entry("archive/byteorder"), byteorder)
        for k, v in records.items():
            z.writestr(entry("archive/data/" + k), v)
        z.writestr(entry("archive/version"), b"3\n")


def refused():
    os.makedirs(REFUSED, exist_ok=True)
    expected = []

    def add(name, want):
        expected.append(f"{name}.bin\t{want}")

    def rpath(name):
        return os.path.join(REFUSED, name + ".bin")

    # written by torch.save
    torch.save({"t": torch.randn(3, 4).t()}, rpath("transposed"))
    add("transposed", "tensor 't': is not contiguous (size [4, 3], stride [1, 4])")
    torch.save({"ids": torch.arange(4)}, rpath("int64"))
    add("int64", "tensor 'ids': dtype torch.LongStorage is not supported (F32, F16 and BF16 are)")
    torch.save({"d": torch.randn(2, dtype=torch.float64)}, rpath("float64"))
    add("float64", "tensor 'd': dtype torch.DoubleStorage is not supported")

    class Evil:  # what a malicious checkpoint carries: pickle writes os.system as posix.system on Linux
        def __reduce__(self):
            return (os.system, ("echo x",))

    torch.save({"w": torch.ones(2), "evil": Evil()}, rpath("os_system"))
    add("os_system", "refused: pickle global posix.system is not part of a state_dict")
    src = zipfile.ZipFile(os.path.join(OUT, "f32.bin"))
    with zipfile.ZipFile(rpath("deflated"), "w", zipfile.ZIP_DEFLATED) as z:
        for info in src.infolist():
            z.writestr(entry(info.filename), src.read(info), zipfile.ZIP_DEFLATED)
    add("deflated", "entry 'f32/byteorder' is compressed (method 8): torch.save stores every entry uncompressed")
    whole = open(os.path.join(OUT, "f32.bin"), "rb").read()
    open(rpath("truncated"), "wb").write(whole[: len(whole) // 2])
    add("truncated", "no ZIP end of central directory record")

    # hand-assembled; ok.bin is accepted (and torch.load agrees), each other one breaks one rule
    rec = {"0": struct.pack("<6f", 1, 2, 3, 4, 5, 6)}
    good = tensor("0", 6, 0, [2, 3], [3, 1])
    archive(os.path.join(OUT, "crafted.bin"), pdict(("w", good), ("v", tensor("0", 6, 4, [2], [1]))), rec)
    back = torch.load(os.path.join(OUT, "crafted.bin"), weights_only=True)
    save_file({k: v.clone() for k, v in back.items()}, os.path.join(OUT, "crafted.safetensors"))
    cases = [
        ("opcode", pdict(("w", good)).replace(b"\x80\x02}", b"\x80\x02\x93}"), rec,
         "refused: pickle opcode 0x93 is not one torch.save writes for a state_dict (data.pkl byte 2)"),
        ("rebuild_v1", pdict(("w", good)).replace(b"_rebuild_tensor_v2", b"_rebuild_tensor"), rec,
         "refused: pickle global torch._utils._rebuild_tensor is not part of a state_dict"),
        ("exec", b"\x80\x02" + G("builtins", "exec") + T(U("print(1)")) + b"R.", rec,
         "refused: pickle global builtins.exec is not part of a state_dict"),
        ("short_record", pdict(("w", good)), {"0": rec["0"][:20]},
         "tensor 'w': its storage 'archive/data/0' is 20 bytes, but holds 6 elements of torch.FloatStorage"),
        ("outside", pdict(("w", tensor("0", 6, 4, [4], [1]))), rec, "tensor 'w': elements [4, 4 + 4) lie outside its storage of 6"),
        ("dup_key", pdict(("w", good), ("w", good)), rec, "tensor 'w': is in the state dict twice"),
        ("nul_name", pdict(("a\0b", good)), rec, "a tensor name contains a NUL character"),
        ("no_record", pdict(("w", tensor("7", 6, 0, [6], [1]))), rec, "tensor 'w': its storage has no record 'archive/data/7'"),
        ("unset_memo", b"\x80\x02}(" + U("w") + b"h\x07u.", rec, "memo index 7 is not set"),
        ("not_dict", b"\x80\x02" + T(good) + b".", rec, "refused: data.pkl holds a value of type tuple, expected a dict of tensors"),
        ("build_tensor", pdict(("w", good + b"}b")), rec, "refused: pickle BUILD on a value of type tensor"),
        ("not_tensor", pdict(("w", I(5))), rec, "tensor 'w': refused: its value is of type int, expected a tensor"),
        ("no_stop", pdict(("w", good), end=b""), rec, "data.pkl ends before its STOP opcode"),
        ("deep_marks", b"\x80\x02" + b"(" * 65, rec, "MARKs nested deeper than 64"),
        ("two_dtypes", pdict(("w", tensor("0", 12, 0, [12], [1], "HalfStorage")), ("v", tensor("0", 12, 0, [12], [1], "BFloat16Storage"))),
         rec, "tensor 'v': its storage 'archive/data/0' is declared twice, as 12 of torch.HalfStorage and 12 of torch.BFloat16Storage"),
        ("persid", pdict(("w", G("torch._utils", "_rebuild_tensor_v2") + T(T(U("module"), I(0)) + b"Q") + b"R")), rec,
         "refused: a persistent id that is not ('storage', type, key, location, numel)"),
        ("big_endian", pdict(("w", good)), rec, "byteorder record is not \"little\""),
    ]
    for name, pkl, records, want in cases:
        archive(rpath(name), pkl, records, byteorder=b"big" if name == "big_endian" else b"little")
        add(name, want)
    open(os.path.join(REFUSED, "expected.txt"), "w").write("\n".join(expected) + "\n")


# ---- the trainer's tiny models as transformers 4.x saved them with safe_serialization=False

def tiny_models():
    """transformers 5 writes safetensors whatever safe_serialization says, so the files are
    written as 4.x's save_pretrained(safe_serialization=False) did: torch.save of a plain dict
    of the state dict's tensors, tied lm_head.weight included (it shares the embedding's
    storage), as pytorch_model.bin, or shards pytorch_model-0000k-of-0000n.bin and
    pytorch_model.bin.index.json ({"metadata": {"total_size"}, "weight_map"}, sorted, indent 2)."""
    from transformers import AutoModelForCausalLM
    for src, tied in (("tiny_gqa", False), ("tiny_tied", True)):
        folder = os.path.join("test", "fixtures", src)
        orig = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict()
        for tag, dtype in (("f32", torch.float32), ("f16", torch.float16), ("bf16", torch.bfloat16)):
            sd = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).state_dict()
            if not all(torch.equal(v.float(), orig[k]) for k, v in sd.items()):
                print(f"skip {src} {tag}: not exactly representable")
                continue
            assert ("lm_head.weight" in sd) and (sd["lm_head.weight"].data_ptr() == sd["model.embed_tokens.weight"].data_ptr()) == tied
            write_model(os.path.join(OUT, f"{src}_{tag}"), folder, dict(sd))
            if tied and tag == "bf16":
                write_model(os.path.join(OUT, f"{src}_sharded"), folder, dict(sd), shard_bytes=100_000)


def write_model(dst, folder, sd, shard_bytes=None):
    os.makedirs(dst, exist_ok=True)
    for f in ("config.json", "tokenizer.model"):
        shutil.copy(os.path.join(folder, f), dst)
    if shard_bytes is None:
        torch.save(sd, os.path.join(dst, "pytorch_model.bin"))
        return
    shards, cur, size = [], {}, 0
    for k, v in sd.items():
        n = v.numel() * v.element_size()
        if cur and size + n > shard_bytes:
            shards.append(cur)
            cur, size = {}, 0
        cur[k] = v
        size += n
    shards.append(cur)
    assert len(shards) == 2, len(shards)
    weight_map = {}
    for i, shard in enumerate(shards):
        name = f"pytorch_model-{i + 1:05d}-of-{len(shards):05d}.bin"
        torch.save(shard, os.path.join(dst, name))
        weight_map.update({k: name for k in shard})
    total = sum(v.numel() * v.element_size() for v in sd.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    with open(os.path.join(dst, "pytorch_model.bin.index.json"), "w") as f:
        f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    accepted()
    refused()
    tiny_models()
    print("wrote", OUT)
