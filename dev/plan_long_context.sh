#!/usr/bin/env bash
# The long-context memory plan of docs/memory.md: train_llama2cu --dry_run --random_init
# (no GPU, no weights) on real models' config.json files, LoRA r = 8 on q_proj,v_proj,
# batch 1, chunks with recompute, bf16. Prints a markdown table (GiB).
#   dev/plan_long_context.sh [MODEL_DIR ...]   (folders with a config.json; default: Llama-2-7B and Llama-3.1-8B)
# With --context_parallel first, the plan of one rank of P = 1, 2, 4, 8 GPUs in one context
# group (docs/long_context.md; dev/launch.sh P, FULL_SHARD: the frozen base sharded over them)
# at 32k to 256k tokens, in pieces of 1024 with recompute and activation checkpointing.
set -euo pipefail
cd "$(dirname "$0")/.."
cp_table=0
if [ "${1:-}" = --context_parallel ]; then cp_table=1; shift; fi
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=(test/fixtures/configs/llama-2-7b test/fixtures/configs/llama-3.1-8b)
source dev/plan_common.sh $((cp_table ? 50000 : 25000)) # $work, $work/long.jsonl (enough text for 256k tokens with --context_parallel), gib
if [ $cp_table = 1 ]; then
    echo "| model (config) | T | GPUs | activations | carries and gathered layer | total per GPU | fits 80 GB |"
    echo "| --- | ---: | ---: | ---: | ---: | ---: | --- |"
    for cfg in "${configs[@]}"; do
        mkdir -p "$work/model"
        cp "$cfg/config.json" "$work/model/config.json"
        for T in 32768 65536 131072 262144; do
            for P in 1 2 4 8; do
                # (rank 0's plan: every rank's is the same size; the others print nothing)
                log=$(LAUNCH_GRACE=5 dev/launch.sh $P ./train_llama2cu --model "$work/model" --random_init \
                    --tokenizer test/fixtures/tiny_gqa/tokenizer.model --data "$work/long.jsonl" --data_format text \
                    --batching packing --data_cache_dir "$work" --max_seq_len $T --chunk_size 1024 --chunk_memory recompute \
                    --activation_checkpointing --batch_size 1 --lora_r 8 --lora_target_modules q_proj,v_proj \
                    --context_parallel $P --sharding_strategy FULL_SHARD --dry_run --output_dir "$work/out")
                grep -q "T <= $T" <<<"$log" || { echo "error: $cfg: the dry run did not plan rows of $T tokens" >&2; exit 1; }
                act=$(awk '/activations and scratch/ { print $4; exit }' <<<"$log")
                carry=$(awk '/KV and dKV carry/ { print $5; exit }' <<<"$log")
                total=$(awk '/^  total/ { print $2; exit }' <<<"$log")
                fits=$(awk -v t="$total" 'BEGIN { print (t <= 80e9 / 1048576) ? "yes" : "no" }')
                echo "| $(basename "$cfg") | $T | $P | $(gib "$act") | $(gib "$carry") | $(gib "$total") | $fits |"
            done
        done
    done
    exit 0
fi
echo "| model (config) | T | chunk | activations | carry | total | fits 80 GB |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | --- |"
for cfg in "${configs[@]}"; do
    mkdir -p "$work/model"
    cp "$cfg/config.json" "$work/model/config.json"
    for T in 32768 65536 131072; do
        for C in 1024 4096; do
            log=$(./train_llama2cu --model "$work/model" --random_init --tokenizer test/fixtures/tiny_gqa/tokenizer.model \
                --data "$work/long.jsonl" --data_format text --batching packing --data_cache_dir "$work" --max_seq_len $T \
                --chunk_size $C --chunk_memory recompute --batch_size 1 --lora_r 8 --lora_target_modules q_proj,v_proj \
                --dry_run --output_dir "$work/out")
            grep -q "T <= $T" <<<"$log" || { echo "error: $cfg: the dry run did not plan rows of $T tokens" >&2; exit 1; }
            act=$(awk '/activations and scratch/ { print $4 }' <<<"$log")
            carry=$(awk '/KV and dKV carry/ { print $5 }' <<<"$log")
            total=$(awk '/^  total/ { print $2; exit }' <<<"$log") # the GPU's (the host's follows)
            fits=$(awk -v t="$total" 'BEGIN { print (t <= 80e9 / 1048576) ? "yes" : "no" }')
            echo "| $(basename "$cfg") | $T | $C | $(gib "$act") | $(gib "$carry") | $(gib "$total") | $fits |"
        done
    done
done
