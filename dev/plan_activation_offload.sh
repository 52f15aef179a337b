#!/usr/bin/env bash
# The longest context that fits, by plan, with --activation_offloading (docs/long_context.md
# "Activation offloading: the layer-major schedule"): train_llama2cu --dry_run --random_init (no
# GPU, no weights) on real models' config.json files, QLoRA nf4 r 32 on all linear layers, batch 1,
# chunks of 2048, bf16, every K-th layer's input in host memory (--offload_every K); the most
# tokens (a multiple of the chunk) whose GPU plan fits the budget and whose host plan fits 128 GiB,
# found by bisection, beside the plan at the issue's target and the compute the re-run adds.
# Prints a markdown table (GiB).
#   dev/plan_activation_offload.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source dev/plan_common.sh 120000 # $work, $work/long.jsonl (packed rows up to ~1.4M tokens), gib
C=2048 HOST=128
plan() { # plan CONFIG T K: the dry run's log
    mkdir -p "$work/model"
    cp "$1/config.json" "$work/model/config.json"
    ./train_llama2cu --model "$work/model" --random_init --tokenizer test/fixtures/tiny_gqa/tokenizer.model \
        --data "$work/long.jsonl" --data_format text --batching packing --data_cache_dir "$work" --max_seq_len "$2" \
        --chunk_size $C --batch_size 1 --quantize nf4 --lora_r 32 --lora_target_modules all-linear \
        --activation_offloading --offload_every "$3" --dry_run --output_dir "$work/out" 2>/dev/null
}
gpu() { awk '/^memory plan/ { on = 1 } on && $1 == "total" { print $2; exit }' <<<"$1"; }
host() { awk '/^host memory plan/ { on = 1 } on && $1 == "total" { print $2; exit }' <<<"$1"; }
rerun() { sed -n 's/.*forward re-run, \([0-9.]*\)% of the compute.*/\1/p' <<<"$1"; }
fits() { # fits CONFIG T K GPU_GIB: the plan of T tokens fits GPU_GIB and the host's 128 GiB
    local log
    log=$(plan "$1" "$2" "$3") || return 1
    awk -v g="$(gpu "$log")" -v h="$(host "$log")" -v G="$4" -v H=$HOST 'BEGIN { exit !(g <= G * 1024 && h <= H * 1024) }'
}
echo "| model (config) | GPU budget | --offload_every | target | at the target: GPU, host; re-run | longest that fits (chunks of $C) | stops it |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | --- |"
while read -r cfg budget k target; do
    lo=0 hi=$((1600000 / C)) # in chunks: lo fits (0: none), hi does not
    while [ $((hi - lo)) -gt 1 ]; do
        mid=$(((lo + hi) / 2))
        if fits "$cfg" $((mid * C)) "$k" "$budget"; then lo=$mid; else hi=$mid; fi
    done
    log=$(plan "$cfg" "$target" "$k")
    g=$(gpu "$log") h=$(host "$log")
    stop=$(awk -v g="$g" -v h="$h" -v G="$budget" -v H=$HOST 'BEGIN { print (g > G * 1024 ? "GPU" : h > H * 1024 ? "host memory" : "fits at the target") }')
    r=$(rerun "$log")
    [ $lo -gt 0 ] && log=$(plan "$cfg" $(((lo + 1) * C)) "$k") && stop="$stop; past it the $(awk -v g="$(gpu "$log")" -v G="$budget" 'BEGIN { print (g > G * 1024 ? "GPU" : "host memory") }')"
    echo "| $(basename "$cfg") | $budget GiB | $k | $target | $(gib "$g"), $(gib "$h") GiB; ${r:-0}% | $((lo * C)) | $stop |"
done <<'ROWS'
test/fixtures/configs/llama-3.1-8b 76 1 400000
test/fixtures/configs/llama-3.1-8b 22.5 1 100000
test/fixtures/configs/llama-3.1-70b 76 1 131072
test/fixtures/configs/llama-3.1-70b 76 2 131072
test/fixtures/configs/llama-3.1-70b 76 4 131072
ROWS
