#!/usr/bin/env bash
# The GPU benchmarks (docs/performance.md: train_llama2cu against transformers + peft,
# attention.cuh against SDPA, the longest sequence) on one GPU, in parts that each fit one
# 10-minute call of a GPU lease:
#
#   dev/bench_gpu.sh PART...     PART: hf | ours | attention | long | shared | tier
#
#   hf         transformers + peft: LoRA qv8 and all16 x seq 512, 2048, 4096, each at the largest
#              batch that fits (dev/bench_hf.py)
#   ours       train_llama2cu --random_init on the same settings: the largest batch by its memory
#              plan, and transformers + peft's batch (equal settings) where `hf` ran before: its
#              rows from $HF_JSON, else RESULTS/bench_hf.jsonl, else dev/gpu_results/bench_hf.jsonl
#   attention  dev/cuda/attention --bench (attention.cuh) and dev/bench_sdpa.py (SDPA's backends)
#   long       the longest sequence that trains, batch 1, LoRA qv8: ours whole and chunked
#              (recompute), then transformers + peft with gradient checkpointing
#   shared     train_llama2cu DPO, LoRA qv8, bf16, batch 1, a pair's prompt once (--shared_prompt on)
#              against two rows (off) at prompts of SHARED_PROMPTS words (256,1024,4096; responses of
#              256): the median step time of steps 2-4 (metrics' ms), tokens/s as two rows, the peak
#
#   tier       host memory as the GPU's second tier: train_llama2cu LoRA qv8 and QLoRA nf4 all-linear at
#              TIER_SEQ (2048) tokens with the base streamed (--cpu_offload 1) against resident, and LoRA
#              qv8 at TIER_LONG (16384) tokens in chunks of TIER_CHUNK (2048) with --activation_offloading against
#              without: the median step time of steps 2-4, the peak, and the plan's PCIe estimate
# Each part writes RESULTS/bench_PART.md (device, date, commit and versions, then the rows),
# RESULTS/bench_PART.log (all output) and, but for attention, RESULTS/bench_PART.jsonl;
# RESULTS is $OUT when set (the folder a GPU lease sends back), else out/bench. The tables
# are printed again at the end (a lease sends back 8 files a call: three parts fit). Both sides
# train a Llama-2-7B-shaped model with random weights (config.json and tokenizer.model from
# dev/bench_hf.py --write_config, in /tmp). MFU uses the GPU's datasheet bf16 peak
# (dev/bench_common.py), or PEAK_TFLOPS.
#
# Without a GPU (no nvidia-smi, or it lists none) it stops with an error. To try the scripts
# on a CPU, put a stand-in nvidia-smi first on the PATH (its memory.free is what the CPU
# trainer's plan may fill) and run, e.g.:
#   PATH=$PWD/dev/fake_gpu:$PATH SHAPE=tiny DEVICE=cpu BIN=./train_llama2 SEQ=128,256 BATCH=2 RESERVE_MIB=0 \
#       LONG_FROM=256 LONG_MAX=2048 CHUNK=128 dev/bench_gpu.sh hf ours long
# Environment: SHAPE (7b), DEVICE (cuda), BIN (./train_llama2cu, built here for the GPU present),
# SEQ (512,2048,4096), LORA (qv8,all16), BATCH (0: search), RESERVE_MIB (dev/bench_ours.py's
# 2048), HF_JSON, PEAK_TFLOPS, PART_SECONDS (each part's time limit: 570 s shared by the parts
# given, so that one call ends within a lease's 10 minutes); for long: LONG_FROM,
# LONG_MAX, CHUNK (the scripts' defaults: 4096; 262144 ours, 1048576 transformers; 1024).
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/cuda/bin" # nvcc, where the image keeps it
[ $# -gt 0 ] || { sed -n '2,14p' "$0"; exit 2; }
for p in "$@"; do
    case $p in hf|ours|attention|long|shared|tier) ;; *) echo "error: unknown part '$p' (hf, ours, attention, long, shared, tier)" >&2; exit 2 ;; esac
done
if ! gpu=$(nvidia-smi --query-gpu=name,memory.total,memory.free,driver_version,compute_cap --format=csv,noheader 2>&1) ||
    [ -z "$gpu" ]; then
    echo "error: no GPU: nvidia-smi failed or lists none (${gpu:-no output}). These benchmarks need one;" \
        "the top of $0 says how to try them on a CPU with a stand-in nvidia-smi." >&2
    exit 1
fi
gpu=$(echo "$gpu" | head -1)
SHAPE=${SHAPE:-7b} DEVICE=${DEVICE:-cuda} SEQ=${SEQ:-512,2048,4096} LORA=${LORA:-qv8,all16}
RESULTS=${OUT:-out/bench}
limit=${PART_SECONDS:-$((570 / $#))} # the parts of one call share its 10 minutes
model=${TMPDIR:-/tmp}/llama2tune_bench_model-$SHAPE
hf_dtype=bf16
[ "$DEVICE" = cpu ] && hf_dtype=fp32 # (a CPU try: bf16 matmuls are slow there)
common=(${PEAK_TFLOPS:+--peak_tflops $PEAK_TFLOPS} ${BATCH:+--batch $BATCH})
long=(--long ${LONG_FROM:+--long_from $LONG_FROM} ${LONG_MAX:+--long_max $LONG_MAX})
mkdir -p "$RESULTS" || exit 1

# the part's header: what ran where
begin() {
    local rev
    rev=$(git rev-parse --short HEAD 2>/dev/null) && { git diff --quiet HEAD || rev="$rev + uncommitted changes"; }
    {
        echo "## $1"
        echo
        echo "- device: $gpu (name, memory total, free, driver, compute capability)"
        echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'); commit ${rev:-unknown}"
        echo "- nvcc: $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' || echo 'not found')"
        echo "- python: $(python3 -c 'import sys, torch, transformers, peft; print(sys.version.split()[0], "torch", torch.__version__,
            "transformers", transformers.__version__, "peft", peft.__version__)' 2>&1 | tail -1)"
        echo
    } >"$RESULTS/bench_$1.md"
    : >"$RESULTS/bench_$1.log"
    rm -f "$RESULTS/bench_$1.jsonl"
}

# step PART SECONDS COMMAND...: its output into the part's log, its table lines into the part's
# markdown, its rows and errors on the screen as they come; stopped after SECONDS
step() {
    local name=$1 secs=$2 start=$SECONDS rc from
    shift 2
    from=$(($(wc -l <"$RESULTS/bench_$name.log") + 1))
    echo "== $name: $*" | tee -a "$RESULTS/bench_$name.log"
    timeout "$secs" "$@" 2>&1 | tee -a "$RESULTS/bench_$name.log" | grep --line-buffered -iE '^\|.*[0-9]|error|traceback|^FAIL|hint'
    rc=${PIPESTATUS[0]}
    tail -n +"$from" "$RESULTS/bench_$name.log" | grep -E '^(\||<!--)' >>"$RESULTS/bench_$name.md"
    if [ "$rc" -eq 124 ]; then echo "(stopped at the $secs s limit: the rows so far)" | tee -a "$RESULTS/bench_$name.md"
    elif [ "$rc" -ne 0 ]; then echo "($1 failed, exit $rc: see bench_$name.log)" >>"$RESULTS/bench_$name.md"; fi
    echo >>"$RESULTS/bench_$name.md"
    echo "   $name: exit $rc after $((SECONDS - start)) s"
    return "$rc"
}

# make TARGET for the GPU present (CI builds sm_80 and sm_90; one is enough here)
build() {
    local cc
    cc=$(echo "$gpu" | awk -F', ' '{print $5}' | tr -d '.')
    make -j"$(nproc)" "$1" ${cc:+CUDA_ARCHS="-gencode arch=compute_$cc,code=sm_$cc"} >"$RESULTS/build.log" 2>&1 ||
        { echo "error: make $1 failed; the end of $RESULTS/build.log:" >&2; tail -20 "$RESULTS/build.log" >&2; return 1; }
    rm -f "$RESULTS/build.log" # (only a failed build's log is worth one of the files a lease sends back)
}

[ -f "$model/config.json" ] || python3 dev/bench_hf.py --write_config "$model" --shape "$SHAPE" || exit 1
if [ -z "${BIN:-}" ]; then
    for p in "$@"; do [ "$p" = ours ] || [ "$p" = long ] || [ "$p" = shared ] || [ "$p" = tier ] && { build train_llama2cu || exit 1; break; }; done
fi
BIN=${BIN:-./train_llama2cu}
ours=(python3 dev/bench_ours.py --model "$model" --bin "$BIN" ${RESERVE_MIB:+--reserve_mib $RESERVE_MIB} "${common[@]}")
hf=(python3 dev/bench_hf.py --model "$model" --device "$DEVICE" --dtype $hf_dtype "${common[@]}")
# shared: DPO with the prompt once against two rows, a table row each (the pairs as
# dev/bench_shared_prompt.py writes them: random words, about a token each)
shared_bench() {
    local P T data run ms peak s
    echo "| prompt | --shared_prompt | ms a step | tokens/s (as two rows) | positions run | peak GPU MiB |"
    echo "| --- | --- | --- | --- | --- | --- |"
    for P in ${SHARED_PROMPTS:-256,1024,4096}; do
        P=${P//,/ }
        for P in $P; do
            T=$((P + 256 + 64)) data=$RESULTS/shared_$P.jsonl
            python3 -c "import json, random, sys; sys.path.insert(0, 'dev'); from bench_shared_prompt import words
rng = random.Random($P)
with open('$data', 'w') as f:
    for _ in range(4): f.write(json.dumps({'prompt': words(rng, $P), 'chosen': ' ' + words(rng, 256), 'rejected': ' ' + words(rng, 256)}) + '\\n')" || return 1
            for s in on off; do
                run=$RESULTS/shared_run
                rm -rf "$run"
                "$BIN" --model "$model" --random_init --data "$data" --max_seq_len $T --objective dpo --shared_prompt $s --batch_size 1 \
                    --max_steps 4 --shuffle 0 --lora_r 8 --lora_dropout 0 --lora_target_modules q_proj,v_proj --precision bf16 \
                    --output_dir "$run" --metrics_file "$run.jsonl" >"$run.log" 2>&1 || { tail -5 "$run.log"; return 1; }
                ms=$(grep -o '"ms": [0-9.]*' "$run.jsonl" | tail -3 | awk '{print $2}' | sort -n | sed -n 2p)
                peak=$(sed -n 's/^peak GPU memory \([0-9.]*\) MiB.*/\1/p' "$run.log")
                echo "| $P | $s | $ms | $(grep -o '"tok_per_s": [0-9.]*' "$run.jsonl" | tail -1 | awk '{print $2}') |" \
                    "$(sed -n "s/^the pairs' rows ran \([0-9]*\) positions.*/\1/p" "$run.log") | $peak |"
            done
        done
    done
    rm -rf "$RESULTS/shared_run" "$RESULTS"/shared_*.jsonl "$RESULTS/shared_run.log"
}
# tier: each pair of runs, the offload off and on, a table row each: whether the copies the plan
# times at 25 GB/s hide behind the compute (the step as fast as resident) and what they save
tier_bench() {
    local T=${TIER_SEQ:-2048} L=${TIER_LONG:-16384} C=${TIER_CHUNK:-2048} data=$RESULTS/tier.jsonl run=$RESULTS/tier_run what opt o ms peak plan
    python3 -c "import json, random
rng = random.Random(0); w = 'the cat sat on a mat and then it went home to sleep'.split()
with open('$data', 'w') as f:
    for _ in range(8): f.write(json.dumps({'text': ' '.join(rng.choice(w) for _ in range($L))}) + '\\n')" || return 1
    echo "| what | offload | ms a step | peak GPU MiB | the plan's copies, ms a micro-batch (at 25 GB/s) against compute ms |"
    echo "| --- | --- | --- | --- | --- |"
    while IFS='|' read -r what opt args; do
        for o in 0 1; do
            rm -rf "$run"
            # shellcheck disable=SC2086 # (args: several options)
            "$BIN" --model "$model" --random_init --data "$data" --data_format text --batching packing --batch_size 1 --max_steps 4 \
                --lora_r 8 --precision bf16 --activation_checkpointing $args "$opt=$o" --output_dir "$run" --metrics_file "$run.jsonl" \
                >"$run.log" 2>&1 || { tail -5 "$run.log"; return 1; }
            ms=$(grep -o '"ms": [0-9.]*' "$run.jsonl" | tail -3 | awk '{print $2}' | sort -n | sed -n 2p)
            peak=$(sed -n 's/^peak GPU memory \([0-9.]*\) MiB.*/\1/p' "$run.log")
            plan=$(grep -E 'streamed up a micro-batch|layer inputs moved a micro-batch' "$run.log" | grep -oE '[0-9.]+ ms at [0-9]+ GB/s, against [0-9.]+ ms' | head -1)
            echo "| $what | $opt=$o | $ms | $peak | ${plan:-none} |"
        done
    done <<LIST
LoRA qv8, $T tokens, the base streamed|--cpu_offload|--max_seq_len $T --lora_target_modules q_proj,v_proj
QLoRA nf4 all-linear, $T tokens, the base streamed|--cpu_offload|--max_seq_len $T --lora_target_modules all-linear --quantize nf4
LoRA qv8, $L tokens in chunks of $C, layer inputs offloaded|--activation_offloading|--max_seq_len $L --chunk_size $C --chunk_memory recompute --lora_target_modules q_proj,v_proj
LIST
    rm -rf "$run" "$run.jsonl" "$run.log" "$data"
}

status=0
for p in "$@"; do
    begin "$p"
    case $p in
    hf) step hf "$limit" "${hf[@]}" --lora "$LORA" --seq "$SEQ" --json "$RESULTS/bench_hf.jsonl" ;;
    ours)
        hf_json=${HF_JSON:-$RESULTS/bench_hf.jsonl}
        [ -f "$hf_json" ] || hf_json=dev/gpu_results/bench_hf.jsonl
        step ours "$limit" "${ours[@]}" --lora "$LORA" --seq "$SEQ" --hf_json "$hf_json" --json "$RESULTS/bench_ours.jsonl" ;;
    attention)
        build dev/cuda/attention || exit 1
        step attention $((limit / 3)) dev/cuda/attention --bench
        status=$((status | $?))
        step attention $((limit * 2 / 3)) python3 dev/bench_sdpa.py --device "$DEVICE" $([ "$DEVICE" = cpu ] && echo --tiny) ;;
    long) # half the time each; ours first: its searches are dry runs, and it runs one timed step a length
        step long $((limit / 2)) "${ours[@]}" --lora qv8 "${long[@]}" ${CHUNK:+--chunk $CHUNK} --json "$RESULTS/bench_long.jsonl"
        status=$((status | $?))
        step long $((limit / 2)) "${hf[@]}" --lora qv8 "${long[@]}" --long_budget $((limit / 2 - 60)) \
            --json "$RESULTS/bench_long.jsonl" ;;
    shared) export RESULTS BIN model SHARED_PROMPTS # (step's timeout runs a command: the function in a shell)
        step shared "$limit" bash -c "$(declare -f shared_bench); shared_bench" ;;
    tier) export RESULTS BIN model TIER_SEQ TIER_LONG TIER_CHUNK
        step tier "$limit" bash -c "$(declare -f tier_bench); tier_bench" ;;
    esac
    status=$((status | $?))
done
for p in "$@"; do echo; cat "$RESULTS/bench_$p.md"; done
exit $status
