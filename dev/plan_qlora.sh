#!/usr/bin/env bash
# QLoRA's memory plans in docs/quantization.md: train_llama2cu --dry_run --random_init (no GPU, no
# weights) on Llama-2-7B's and Llama-2-70B's config.json, NF4 with double quantization,
# LoRA r = 16 on every linear layer, batch 1 of 2048 tokens, bf16; one process, and two
# ranks FULL_SHARD (dev/launch.sh 2, --collectives host: the plan is per rank, the same
# with NCCL); and issue 51's target, two ranks at r 8. GPU memory the trainer allocates,
# without the CUDA context and cuBLAS' workspace (about 0.5-1 GiB more). Prints a markdown
# table (GiB).
#   dev/plan_qlora.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source dev/plan_common.sh 5000 # $work, $work/long.jsonl, gib
echo "| model | ranks | memory mode | 4-bit layers | other base weights, slots, dequantize scratch | LoRA, grads, AdamW | activations | KV carry | total per GPU |"
echo "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"
row() { # row MODEL RANKS MODE: a plan's line of the table (MODE: options, after --lora_r 16's)
    local model=$1 ranks=$2 mode=$3 launch=() log base bits lora act carry total
    mkdir -p "$work/$model"
    cp "test/fixtures/configs/$model/config.json" "$work/$model/config.json"
    [ "$ranks" = 2 ] && launch=(dev/launch.sh 2)
    log=$("${launch[@]}" ./train_llama2cu --model "$work/$model" --random_init --tokenizer test/fixtures/tiny_gqa/tokenizer.model \
        --data "$work/long.jsonl" --data_format text --batching packing --data_cache_dir "$work" --max_seq_len 2048 \
        --batch_size 1 --lora_r 16 --lora_target_modules all-linear --quantize nf4 $mode --collectives host \
        --dry_run --output_dir "$work/out" 2>&1 | awk '/^memory plan/ { n++ } n == 1')
    grep -q "of which 4-bit layers" <<<"$log" || { echo "error: $model: no QLoRA plan" >&2; exit 1; }
    base=$(awk '/base weights/ { print $4 }' <<<"$log")
    bits=$(awk '/of which 4-bit layers/ { print $5 }' <<<"$log")
    lora=$(awk '/trainable weights/ { print $5 }' <<<"$log")
    act=$(awk '/activations and scratch/ { print $4 }' <<<"$log")
    carry=$(awk '/KV and dKV carry/ { print $5 }' <<<"$log")
    total=$(awk '/^  total/ { print $2; exit }' <<<"$log") # the GPU's (the host's follows)
    echo "| $model | $ranks | ${mode//--/} | $(gib "$bits") | $(gib "$(awk -v a="$base" -v b="$bits" 'BEGIN { print a - b }')") | $(gib "$lora") | $(gib "$act") | $(gib "$carry") | $(gib "$total") |"
}
for model in llama-2-7b llama-2-70b; do
    for ranks in 1 2; do
        [ $model = llama-2-7b ] && [ $ranks = 2 ] && continue
        for mode in "--activation_checkpointing" "--chunk_size 512 --chunk_memory recompute"; do
            row $model $ranks "$mode"
        done
    done
done
# issue 51's target: Llama-2-70B on two 24 GB GPUs (22.5 GiB each after the reserve) at 2048 tokens, r 8
row llama-2-70b 2 "--lora_r 8 --chunk_size 512 --chunk_memory recompute --activation_checkpointing"
