#!/usr/bin/env bash
# The full fine-tuning plans of issue 35's run log (docs/memory.md, *Full fine-tuning by
# plan*): train_llama2cu --dry_run --random_init (no GPU, no weights) on Llama-2-7B's
# config.json and on Llama-2-13B's (written here: hidden 5120, MLP 13824, 40 layers of 40
# heads), bf16, batch 1 of 512 tokens with --activation_checkpointing, on one GPU and on four
# (FULL_SHARD over dev/launch.sh 4, --collectives host: the plan is per rank, the same with
# NCCL), with each optimizer the run can take, with and without --cpu_offload 1, and
# --pure_bf16 1 with AnyPrecisionAdamW (Kahan summation off and on; with and without
# --cpu_offload 1). Per GPU: the
# plan's total (what the trainer allocates, without the CUDA context and cuBLAS' workspace,
# about 1 GiB more); the host's:
# its host plan per process (four ranks on one machine: four of them). Prints a markdown table (GiB).
#   dev/plan_full_ft.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source dev/plan_common.sh 600 # $work, $work/long.jsonl, gib
mkdir -p "$work/llama-2-7b" "$work/llama-2-13b"
cp test/fixtures/configs/llama-2-7b/config.json "$work/llama-2-7b/config.json"
sed -e 's/"hidden_size": 4096/"hidden_size": 5120/' -e 's/"intermediate_size": 11008/"intermediate_size": 13824/' \
    -e 's/"num_attention_heads": 32/"num_attention_heads": 40/' -e 's/"num_hidden_layers": 32/"num_hidden_layers": 40/' \
    -e 's/"num_key_value_heads": 32/"num_key_value_heads": 40/' -e 's/Llama-2-7b/Llama-2-13b/' \
    test/fixtures/configs/llama-2-7b/config.json >"$work/llama-2-13b/config.json"
echo "| model | GPUs | optimizer | offload | weights | trainable weights, grads, state | activations and carry | per GPU | host, per process |"
echo "| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |"
for model in llama-2-7b llama-2-13b; do
    for gpus in 1 4; do
        for run in adamw:0 adamw8bit:0 adamw:1 adamw8bit:1 anyprecision:0 anyprecision-kahan:0 anyprecision:1 anyprecision-kahan:1; do
            opt=${run%:*} offload=${run#*:} pure=()
            [ "${opt%-kahan}" = anyprecision ] && pure=(--pure_bf16 1 --kahan_summation $([ $opt = anyprecision ] && echo 0 || echo 1))
            launch=(); [ $gpus = 4 ] && launch=(dev/launch.sh 4)
            log=$("${launch[@]}" ./train_llama2cu --model "$work/$model" --random_init --tokenizer test/fixtures/tiny_gqa/tokenizer.model \
                --data "$work/long.jsonl" --data_format text --batching packing --data_cache_dir "$work" --max_seq_len 512 \
                --batch_size 1 --full_finetune --activation_checkpointing --optimizer ${opt%-kahan} "${pure[@]}" --cpu_offload $offload --collectives host --host_memory_limit 1e6 \
                --dry_run --output_dir "$work/out" 2>&1) || true
            if ! grep -q "^memory plan" <<<"$log"; then
                echo "| $model | $gpus | $opt | $offload | refused: $(grep -m1 '^error' <<<"$log" | cut -c8-90)... | | | | |"
                continue
            fi
            gpu=$(awk '/^memory plan/ { n++ } n == 1' <<<"$log")
            weights=$(awk '/^  (base )?weights \(/ { print $(NF - 1); exit }' <<<"$gpu")
            train=$(awk '/trainable weights/ { print $(NF - 1); exit }' <<<"$gpu")
            act=$(awk '/activations and scratch/ { a = $4 } /KV and dKV carry/ { c = $5 } END { print a + c }' <<<"$gpu")
            total=$(awk '/^  total/ { print $2; exit }' <<<"$gpu")
            host=$(awk '/^host memory plan/ { h = 1 } h && /^  total/ { print $2; exit }' <<<"$log")
            echo "| $model | $gpus | $opt | $([ $offload = 1 ] && echo yes || echo no) | $(gib "$weights") | $(gib "$train") | $(gib "$act") | $(gib "$total") | $(gib "$host") |"
        done
    done
done
