#!/usr/bin/env bash
# Everything a short GPU lease should run, in one command (about 5-10 minutes):
# the device, a build for the GPU that is present, every dev/cuda check
# (validation against the CPU twins, then timing), test_llama2cu (the CUDA
# trainer against the CPU twin; then its logits of more than 2^31 elements), dev/cuda/fsdp_nccl as one rank (where it is
# built), W = 2 and 3 ranks sharing the GPU (test_llama2cu_sharded.sh, test_llama2cu_context.sh), compute-sanitizer on the small shapes
# (memcheck on every check and on test_llama2cu --quick; racecheck on
# attention and test_llama2cu; synccheck on attention), a short run of the
# built-in default through train_llama2cu, --profile_dir's trace (and NVTX under nsys, where it
# is installed), and a summary table: kernel,
# variant, worst error, tolerance, result, time.
#
#   dev/gpu_check.sh [RESULTS.md]    default: $OUT/gpu_check.md if $OUT is set, else gpu_check.md
#
# The table goes to RESULTS.md (and the end of stdout), the full output to
# RESULTS.log. Exits 1 when anything failed.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/cuda/bin" # nvcc and compute-sanitizer, where the image keeps them
results=${1:-${OUT:+$OUT/gpu_check.md}}
results=${results:-gpu_check.md}
log=${results%.md}.log
budget=${GPU_CHECK_SECONDS:-540} # sanitizer runs that would start later than this are skipped
checks=$(make --no-print-directory -s cuda-checks | tail -1) # every dev/cuda/ check (the Makefile's CUDA_CHECKS)
t_start=$(date +%s)
: >"$log"
steps=() # "name|result|seconds" for the table

# step NAME LIMIT COMMAND...: runs it with its output in the log, records ok / FAIL / TIMEOUT
step() {
    local name=$1 limit=$2 start rc result
    shift 2
    start=$(date +%s)
    echo "== $name: $*" | tee -a "$log"
    timeout "$limit" "$@" >>"$log" 2>&1
    rc=$?
    result=ok
    [ $rc -ne 0 ] && result="FAIL (exit $rc)"
    [ $rc -eq 124 ] && result="TIMEOUT (${limit} s)"
    echo "   $result" | tee -a "$log"
    steps+=("$name|$result|$(( $(date +%s) - start ))")
}
elapsed() { echo $(( $(date +%s) - t_start )); }

{
    echo "# dev/gpu_check.sh"
    echo
    echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    rev=$(git rev-parse --short HEAD 2>/dev/null) && { git diff --quiet HEAD || rev="$rev + uncommitted changes"; }
    echo "- commit: ${rev:-unknown (not a git checkout)}"
    echo "- device: $(nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader 2>&1 | head -1)"
    echo "- nvcc: $(nvcc --version 2>&1 | grep -o 'release [0-9.]*' || echo 'not found')"
} | tee "$results"
nvidia-smi >>"$log" 2>&1

# build for the GPU that is here (CI compiles sm_80 and sm_90 separately)
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '.')
arch=${cc:+-gencode arch=compute_$cc,code=sm_$cc}
step build 400 make -B -j"$(nproc)" cuda ${arch:+CUDA_ARCHS="$arch"}

for c in $checks; do step "$c" 180 "dev/cuda/$c"; done
checks_end=$(wc -l <"$log") # the table reads the checks above, not their repeats under the sanitizer
step test_llama2cu 300 test/test_llama2cu
# logits of more than 2^31 elements (2 x 35200 positions x 32000), the head in one piece and in 4,
# against the CPU twin (about 9 GB of logits a side). The CPU twin's share of the time, from its
# runs at T = 4400 and 8800 on 2 Zen 1 threads (a T + b T^2: the attention is quadratic), is
# ~65 s a case there, 4 cases: so 30-60 s on 16 cores
step "test_llama2cu --big_logits" 240 test/test_llama2cu --big_logits 35200
# fsdp.h's NCCL backend as one rank (built where nccl.h is): the collectives' checks and the bf16 gather
[ -x dev/cuda/fsdp_nccl ] && step "fsdp_nccl (one rank)" 120 dev/cuda/fsdp_nccl
# several ranks on this one GPU (--collectives host): test_llama2cu_sharded.sh with the real binary in
# the emulated one's place, every strategy, LoRA, full fine-tuning, QLoRA and DoRA against one process
# and the CPU trainer (which it needs built, with st_compare)
step "build the CPU trainer" 120 make -j"$(nproc)" train_llama2 test/st_compare test/test_gguf
step "sharded on one GPU" 400 env EMU_BIN=./train_llama2cu test/test_llama2cu_sharded.sh
# --cpu_offload 1 == without it, bit for bit, on the GPU (the host step against the kernels,
# the unit gradients' trips to the host; the step overlapped with the backward where unclipped,
# its threads and streams for real; --pure_bf16 offloaded), one rank and several sharing the GPU
# (about 90 trainer runs: 90 s emulated on 2 cores)
step "cpu offload" 240 env EMU_BIN=./train_llama2cu test/test_offload.sh
# --context_parallel 2 and 3 (and 2 x 2) with ranks sharing the GPU: == one process and the CPU
# trainer, sampling, the refusals
step "context parallel on one GPU" 180 env EMU_BIN=./train_llama2cu test/test_llama2cu_context.sh
# --objective dpo and orpo against the CPU trainer: DPO sigmoid with LoRA and full fine-tuning, ORPO,
# LoRA in chunks, bf16, and 2 ranks FULL_SHARD sharing the GPU == one process (3 steps each); a pair's
# prompt once (--shared_prompt on) == two rows (off) and == the CPU trainer's on, LoRA in kept chunks, ORPO
step "preference tuning" 180 env EMU_BIN=./train_llama2cu test/test_llama2cu_preference.sh --quick
# --export_gguf from the device's weights (read back a staging buffer of rows at a time): the same
# bytes as the CPU trainer's, every --gguf_type the test exports (the k-quants too), the vocabularies
step "GGUF export on the GPU" 120 env EMU_BIN=./train_llama2cu test/test_gguf.sh
# the built-in default (a small generated model and data, LoRA), 50 steps: it trains and samples
step "train_llama2cu default" 300 ./train_llama2cu --max_steps 50 --output_dir out/gpu_check \
    --metrics_file out/gpu_check/metrics.jsonl
# --profile_dir with the stream spans timed by CUDA events (test_profile.sh with the real binary in
# the emulated one's place: its checks, and the gather of layer i+1 under way beside layer i), and
# the NVTX ranges as Nsight Systems records them, where nsys is installed
step "profile trace" 120 env EMU_TRAINER=./train_llama2cu test/test_profile.sh
if command -v nsys >/dev/null; then
    step "nsys NVTX ranges" 180 bash -c 'nsys profile -t cuda,nvtx -f true -o out/gpu_check/nsys ./train_llama2cu --max_steps 3 \
        --output_dir out/gpu_check/nsys_run >/dev/null && nsys stats --report nvtx_sum --format csv out/gpu_check/nsys.nsys-rep |
        tee out/gpu_check/nvtx_sum.csv | grep -q "forward layer 0 chunk 0"'
else steps+=("nsys NVTX ranges|skipped (no nsys)|0"); fi
for c in $checks; do
    if [ "$(elapsed)" -gt "$budget" ]; then steps+=("memcheck $c|skipped (time)|0"); continue; fi
    step "memcheck $c" 180 compute-sanitizer --tool memcheck --leak-check full --error-exitcode 1 "dev/cuda/$c" --quick
done
for tool in racecheck synccheck; do
    if [ "$(elapsed)" -gt "$budget" ]; then steps+=("$tool attention|skipped (time)|0"); continue; fi
    step "$tool attention" 240 compute-sanitizer --tool $tool --error-exitcode 1 dev/cuda/attention --quick
done
for tool in memcheck racecheck; do
    if [ "$(elapsed)" -gt "$budget" ]; then steps+=("$tool test_llama2cu|skipped (time)|0"); continue; fi
    step "$tool test_llama2cu" 300 compute-sanitizer --tool $tool --error-exitcode 1 test/test_llama2cu --quick
done

# the table: per kernel and variant, the check nearest its tolerance and the time at the largest shape
table=$(head -n "$checks_end" "$log" | grep -E '^(ok|FAIL|time) ' | awk '
    $1 != "time" {
        key = $2 " " $3
        if (!(key in worst)) order[++n] = key
        ratio = $8 > 0 ? $6 / $8 : ($6 > 0 ? 1e30 : 0)
        if (!(key in worst) || ratio > worst[key]) { worst[key] = ratio; err[key] = $6; tol[key] = $8 }
        if ($1 == "FAIL") failed[key]++
        checks[key]++
    }
    $1 == "time" { t[$2 " " $3] = $4 " ms, " $6 " " $7 }
    END {
        print "| kernel | variant | checks | worst error | tolerance | result | time (largest shape) |"
        print "| --- | --- | --- | --- | --- | --- | --- |"
        for (i = 1; i <= n; i++) {
            k = order[i]; split(k, kv, " ")
            printf "| %s | %s | %d | %s | %s | %s | %s |\n", kv[1], kv[2], checks[k], err[k], tol[k],
                   failed[k] ? "FAIL (" failed[k] ")" : "pass", (k in t) ? t[k] : "-"
        }
    }')
{
    echo
    echo "## kernels"
    echo
    echo "$table"
    echo
    echo "## steps"
    echo
    echo "| step | result | seconds |"
    echo "| --- | --- | --- |"
    for s in "${steps[@]}"; do echo "| ${s//|/ | } |"; done
    echo
    echo "total $(elapsed) s; full output in $(basename "$log")"
} | tee -a "$results"

printf '%s\n' "${steps[@]}" | grep -qE '\|(FAIL|TIMEOUT)' && exit 1
echo "$table" | grep -q 'FAIL' && exit 1
exit 0
