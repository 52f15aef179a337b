#!/usr/bin/env python3
"""Registers, spills and shared memory of every kernel, as ptxas reports them.

    python3 dev/cuda/ptxas_table.py > table.md

Compiles train_llama2.cu (which instantiates every kernel the trainer launches, for
every head dim and storage type) with `nvcc -Xptxas -v` for sm_80 and sm_90 and prints
a markdown table, one row per kernel instantiation and architecture. No GPU needed.
The table in dev/cuda/README.md is this script's output.
"""
import re, subprocess, sys, tempfile, os

ARCHS = ["80", "90"]
cmd = ["nvcc", "-O3", "-std=c++17", "-Xptxas", "-v", "-Xcompiler", "-fopenmp", "-c", "train_llama2.cu"]
for a in ARCHS:
    cmd += ["-gencode", f"arch=compute_{a},code=sm_{a}"]
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
with tempfile.TemporaryDirectory() as tmp:
    out = subprocess.run(cmd + ["-o", os.path.join(tmp, "t.o")], cwd=root, capture_output=True, text=True)
if out.returncode != 0:
    sys.exit("nvcc failed:\n" + out.stderr)
log = out.stdout + out.stderr

rows, cur = [], None
for line in log.splitlines():
    m = re.search(r"Compiling entry function '(\w+)' for 'sm_(\d+)'", line)
    if m:
        cur = {"mangled": m.group(1), "arch": m.group(2), "stack": 0, "spill_st": 0, "spill_ld": 0, "smem": 0}
        rows.append(cur)
        continue
    if cur is None:
        continue
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
    if m:
        cur["stack"], cur["spill_st"], cur["spill_ld"] = map(int, m.groups())
    m = re.search(r"Used (\d+) registers", line)
    if m:
        cur["regs"] = int(m.group(1))
        s = re.search(r"(\d+) bytes smem", line)
        cur["smem"] = int(s.group(1)) if s else 0

names = subprocess.run(["c++filt"], input="\n".join(r["mangled"] for r in rows), capture_output=True, text=True).stdout.split("\n")
for r, n in zip(rows, names):
    # the kernel and its template arguments; the parameter list is in the source
    r["name"] = re.sub(r"\(.*\)$", "", n).replace("void ", "").replace("__nv_bfloat16", "bf16")
rows.sort(key=lambda r: (r["name"], r["arch"]))
print("| kernel | arch | registers | spill stores / loads (bytes) | stack (bytes) | static shared (bytes) |")
print("| --- | --- | --- | --- | --- | --- |")
for r in rows:
    print(f"| `{r['name']}` | sm_{r['arch']} | {r['regs']} | {r['spill_st']} / {r['spill_ld']} | {r['stack']} | {r['smem']} |")
