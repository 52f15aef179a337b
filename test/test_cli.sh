#!/usr/bin/env bash
# The trainer binary on bad input: every case must exit with status 1 or 2 (not
# a crash: >= 128 is a signal) and print an error that names the culprit.
set -u
BIN=${BIN:-./train_llama2}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
FIX=test/fixtures
DATA=$FIX/data.jsonl
fails=0

# expect_error NAME PATTERN ARGS...: non-zero exit below 128, stderr matching PATTERN
expect_error() {
    local name=$1 pattern=$2; shift 2
    "$BIN" "$@" >"$TMP/out" 2>"$TMP/err"
    local rc=$?
    if [ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -qE -- "$pattern" "$TMP/err"; then
        echo "ok cli: $name"
    else
        echo "FAIL cli: $name: exit $rc, stderr: $(head -c 400 "$TMP/err")"
        fails=$((fails + 1))
    fi
}

# a writable copy of a fixture model, to break
model_copy() { rm -rf "$TMP/m"; cp -r "$FIX/$1" "$TMP/m"; }

RUN=(--data "$DATA" --max_steps 1 --max_seq_len 24 --batch_size 2 --output_dir "$TMP/out_adapter")

# command line
expect_error "unknown option" "unknown option '--bogus'" --model $FIX/tiny_gqa "${RUN[@]}" --bogus 1
expect_error "bad number" "--lr: 'abc' is not a number" --model $FIX/tiny_gqa "${RUN[@]}" --lr abc
expect_error "bad integer" "--batch_size: '2.5' is not an integer" --model $FIX/tiny_gqa "${RUN[@]}" --batch_size 2.5
expect_error "out of range" "--lora_dropout" --model $FIX/tiny_gqa "${RUN[@]}" --lora_dropout 1.5
expect_error "missing value" "--lr needs a value" --model $FIX/tiny_gqa "${RUN[@]}" --lr
expect_error "missing --model" "--model is required" "${RUN[@]}"
expect_error "adam_beta2 that rounds to 1" "--adam_beta2: '0.99999999' is not a number" --model $FIX/tiny_gqa "${RUN[@]}" --adam_beta2 0.99999999
expect_error "bad scheduler" "--lr_scheduler: 'step'" --model $FIX/tiny_gqa "${RUN[@]}" --lr_scheduler step
expect_error "bad optimizer" "--optimizer: 'adam' is not one of adamw, sgd, adamw8bit, anyprecision" --model $FIX/tiny_gqa "${RUN[@]}" --optimizer adam
# --pure_bf16, --optimizer anyprecision and --kahan_summation go together
expect_error "--pure_bf16 without --full_finetune" "--pure_bf16 keeps full fine-tuning's weights in bf16 .*give it with --full_finetune" --model $FIX/tiny_gqa "${RUN[@]}" --pure_bf16 1 --optimizer anyprecision
expect_error "--pure_bf16 with AdamW" "--pure_bf16 has no fp32 weights for AdamW, SGD or AdamW8bit to update" --model $FIX/tiny_gqa "${RUN[@]}" --pure_bf16 1 --full_finetune
expect_error "--optimizer anyprecision without --pure_bf16" "--optimizer anyprecision steps bf16 weights with bf16 state: give it with --pure_bf16 1" --model $FIX/tiny_gqa "${RUN[@]}" --optimizer anyprecision --full_finetune
expect_error "--kahan_summation without anyprecision" "--kahan_summation is AnyPrecisionAdamW's" --model $FIX/tiny_gqa "${RUN[@]}" --kahan_summation 1 --full_finetune
expect_error "--kahan_summation 2" "--kahan_summation" --model $FIX/tiny_gqa "${RUN[@]}" --kahan_summation 2
expect_error "Nesterov without momentum (torch refuses it too)" "--nesterov 1 needs a --momentum above 0" --model $FIX/tiny_gqa "${RUN[@]}" --optimizer sgd --nesterov 1
expect_error "--momentum with AdamW" "--momentum and --nesterov are SGD's" --model $FIX/tiny_gqa "${RUN[@]}" --momentum 0.9
expect_error "negative momentum" "--momentum: '-0.5' is not a number" --model $FIX/tiny_gqa "${RUN[@]}" --optimizer sgd --momentum -0.5
expect_error "bad loss scale" "--loss_scale: 'static' is not one of auto, dynamic, none" --model $FIX/tiny_gqa "${RUN[@]}" --loss_scale static
expect_error "bad target module" "unknown module 'qq_proj'" --model $FIX/tiny_gqa "${RUN[@]}" --lora_target_modules q_proj,qq_proj
expect_error "chunk larger than the sequence" "--chunk_size 32 is larger than --max_seq_len 24" --model $FIX/tiny_gqa "${RUN[@]}" --chunk_size 32
expect_error "bad sharding strategy" "--sharding_strategy: unknown strategy 'ZERO3'" --model $FIX/tiny_gqa "${RUN[@]}" --sharding_strategy ZERO3
expect_error "--shard_group without HYBRID_SHARD" "--shard_group applies to HYBRID_SHARD only" --model $FIX/tiny_gqa "${RUN[@]}" --shard_group 2
expect_error "--shard_group that does not divide the ranks" "--shard_group 2 does not divide the world size 1" --model $FIX/tiny_gqa "${RUN[@]}" --sharding_strategy HYBRID_SHARD --shard_group 2
expect_error "--export_hf without --resume" "--export_hf writes a checkpoint out: give it with --resume" --model $FIX/tiny_gqa "${RUN[@]}" --export_hf "$TMP/hf"
expect_error "negative chunk size" "--chunk_size: '-4' is not an integer" --model $FIX/tiny_gqa "${RUN[@]}" --chunk_size -4
expect_error "bad chunk memory mode" "--chunk_memory: 'lazy' is not one of keep, recompute" --model $FIX/tiny_gqa "${RUN[@]}" --chunk_memory lazy
expect_error "zero output chunks" "--num_output_chunks: '0' is not an integer" --model $FIX/tiny_gqa "${RUN[@]}" --num_output_chunks 0
expect_error "more output chunks than tokens" "--num_output_chunks 9 is more than the 8 tokens" --model $FIX/tiny_gqa "${RUN[@]}" --chunk_size 8 --num_output_chunks 9
for steps in abc 3 5-3 0-2 3-5x -1-2 3-; do
    expect_error "bad --profile_steps '$steps'" "--profile_steps: '$steps' is not a range A-B of steps with 1 <= A <= B" \
        --model $FIX/tiny_gqa "${RUN[@]}" --profile_steps "$steps"
done
expect_error "bad batching" "--batching: 'pack' is not one of padding, packing" --model $FIX/tiny_gqa "${RUN[@]}" --batching pack
expect_error "bad data format" "--data_format: 'csv' is not one of" --model $FIX/tiny_gqa "${RUN[@]}" --data_format csv
expect_error "val_data with val_split" "--val_data and --val_split do not go together" --model $FIX/tiny_gqa "${RUN[@]}" --val_data "$DATA" --val_split 0.1
expect_error "bad val_split" "--val_split: '1.5' is not a number" --model $FIX/tiny_gqa "${RUN[@]}" --val_split 1.5
expect_error "--freeze_layers without --full_finetune" "--freeze_layers freezes layers of full fine-tuning: give it with --full_finetune" --model $FIX/tiny_gqa "${RUN[@]}" --freeze_layers 1
expect_error "--freeze_layers beyond the model's layers" "--freeze_layers 3 is more than the 2 decoder layers of $FIX/tiny_gqa" --model $FIX/tiny_gqa "${RUN[@]}" --full_finetune --freeze_layers 3
expect_error "negative --freeze_layers" "--freeze_layers: '-1' is not an integer" --model $FIX/tiny_gqa "${RUN[@]}" --full_finetune --freeze_layers -1
expect_error "bad --batch_size" "--batch_size: 'most' is not an integer in \[1, 65536\] or auto" --model $FIX/tiny_gqa "${RUN[@]}" --batch_size most
expect_error "--batch_size auto without --memory_limit on the CPU" "--batch_size auto needs --memory_limit GiB" --model $FIX/tiny_gqa "${RUN[@]}" --batch_size auto
expect_error "--memory_limit without --batch_size auto" "--memory_limit is what --batch_size auto fits the batch in" --model $FIX/tiny_gqa "${RUN[@]}" --memory_limit 1
expect_error "negative --memory_limit" "--memory_limit: '-1' is not a number" --model $FIX/tiny_gqa "${RUN[@]}" --batch_size auto --memory_limit -1
expect_error "--memory_limit below one row's plan" "--batch_size auto: even one row per micro-batch needs a memory plan of [0-9.]+ MiB, more than the [0-9.]+ MiB --memory_limit leaves" \
    --model $FIX/tiny_gqa "${RUN[@]}" --batch_size auto --memory_limit 0.002
expect_error "negative --global_batch_size" "--global_batch_size: '-8' is not an integer" --model $FIX/tiny_gqa "${RUN[@]}" --global_batch_size -8
expect_error "--global_batch_size that the batch does not divide" "--global_batch_size 5 is not a multiple of --batch_size 2 x 1 rank\(s\) = 2 rows" \
    --model $FIX/tiny_gqa "${RUN[@]}" --global_batch_size 5
expect_error "--global_batch_size against --gradient_accumulation_steps" "--global_batch_size 8 with --batch_size 2 on 1 rank\(s\) means --gradient_accumulation_steps 4, not 3" \
    --model $FIX/tiny_gqa "${RUN[@]}" --global_batch_size 8 --gradient_accumulation_steps 3
"$BIN" --model $FIX/tiny_gqa --data "$DATA" --max_seq_len 24 --dry_run --output_dir "$TMP/dry" >"$TMP/dry.log" 2>&1
if [ $? -eq 0 ] && grep -q "memory plan" "$TMP/dry.log" && grep -q "lr_scheduler" "$TMP/dry.log" && ! grep -q "^step 1" "$TMP/dry.log"; then
    echo "ok cli: --dry_run prints the configuration and the memory plan, and trains nothing"
else
    echo "FAIL cli: --dry_run: $(tail -3 "$TMP/dry.log")"; fails=$((fails + 1))
fi
# the host's memory: Llama-2-7B full fine-tuning planned in 4 GiB of address space (ulimit -v): a dry
# run allocates nothing of the model's size (its plan: 4 x 6738415616 bytes of weights, 25705.0 MiB,
# as many of gradients and two AdamW moments, 77115.0 MiB, and the 256 MiB a checkpoint moves a
# moment through, the activations and carry); a tiny run whose plan
# exceeds --host_memory_limit is refused before it trains, with its plan
# (an ASan build reserves terabytes of shadow address space: under SANITIZE=1 the plan is checked
# without the bound, which the plain build checks)
mkdir -p "$TMP/7b"; cp test/fixtures/configs/llama-2-7b/config.json "$TMP/7b/"
bound=4194304
[ -n "${ASAN_OPTIONS:-}" ] && bound=unlimited
(ulimit -v $bound; "$BIN" --model "$TMP/7b" --random_init --tokenizer $FIX/tiny_gqa/tokenizer.model --data "$DATA" --max_seq_len 512 \
    --batch_size 1 --full_finetune --activation_checkpointing --dry_run --output_dir "$TMP/dry") >"$TMP/dry7b.log" 2>&1
if [ $? -eq 0 ] && grep -qE "^  base weights \(fp32\) +25705\.0 MiB" "$TMP/dry7b.log" &&
        grep -qE "^  trainable weights, grads, AdamW +77371\.0 MiB" "$TMP/dry7b.log"; then
    echo "ok cli: --dry_run plans Llama-2-7B full fine-tuning (ulimit -v $bound KiB)"
else
    echo "FAIL cli: --dry_run of Llama-2-7B under ulimit -v 4 GiB: $(grep -A3 "^memory plan" "$TMP/dry7b.log"; tail -2 "$TMP/dry7b.log")"; fails=$((fails + 1))
fi
# --trainable_params embed,norm on Llama-2-7B: LoRA's 4194304 parameters (q, v at r 8) and the
# embedding's 32000 x 4096 and 65 norms of 4096, 135532544 in all, each with its fp32 weight,
# gradient and two AdamW moments (2068.1 MiB) and a checkpoint's 256 MiB staging; counted in a
# dry run, not allocated (the same bound)
(ulimit -v $bound; "$BIN" --model "$TMP/7b" --random_init --tokenizer $FIX/tiny_gqa/tokenizer.model --data "$DATA" --max_seq_len 512 \
    --batch_size 1 --trainable_params embed,norm --dry_run --output_dir "$TMP/dry") >"$TMP/dry7b.log" 2>&1
if [ $? -eq 0 ] && grep -q "^training LoRA with the embedding and the norms: 135532544 trainable parameters" "$TMP/dry7b.log" &&
        grep -qE "^  trainable weights, grads, AdamW +2324\.1 MiB" "$TMP/dry7b.log"; then
    echo "ok cli: --dry_run plans Llama-2-7B LoRA with --trainable_params embed,norm (ulimit -v $bound KiB)"
else
    echo "FAIL cli: --dry_run of Llama-2-7B --trainable_params embed,norm: $(grep -A3 "^memory plan" "$TMP/dry7b.log"; tail -2 "$TMP/dry7b.log")"; fails=$((fails + 1))
fi
expect_error "a plan over --host_memory_limit is refused" "^error: the host memory plan \([0-9.]+ GiB\) exceeds the 0\.0 GiB of --host_memory_limit" \
    --model $FIX/tiny_gqa "${RUN[@]}" --host_memory_limit 0.00001
grep -q "^memory plan" "$TMP/out" && [ ! -e "$TMP/out_adapter/checkpoint-1" ]
if [ $? -eq 0 ]; then echo "ok cli: ... with its plan, and nothing trained"; else echo "FAIL cli: the refusal's plan: $(head -5 "$TMP/out")"; fails=$((fails + 1)); fi
# the configuration table stays aligned whatever the values: every option once, its name in one of
# three columns that are the same on every line, and a long value (a path, a list) printed whole
long_dir="$TMP/an_output_directory_whose_name_is_longer_than_any_column_of_the_table"
targets=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj
"$BIN" --model $FIX/tiny_gqa --data "$DATA" --max_seq_len 24 --dry_run --output_dir "$long_dir" \
    --lora_target_modules $targets >"$TMP/table.log" 2>&1
# (but the quiet options, trainer/options.h's quiet_options, which it lists only when set)
"$BIN" --help | sed -n 's/^  --\([a-z_0-9]*\) .*/\1/p' | grep -vx -e help -e objective -e beta -e dpo_loss_type -e shared_prompt -e precompute_ref_log_probs -e activation_offloading -e offload_every >"$TMP/names"
bad=$(awk 'FNR == NR { name[$1] = 1; n++; next }
    /^configuration:/ { on = 1; next }
    on && !/^  / { on = 0 }
    on { line = $0; pos = 1
        while (match(substr(line, pos), /[^ ]+/)) { # each word and the column it starts at
            col = pos + RSTART - 1; word = substr(line, col, RLENGTH); pos = col + RLENGTH
            if (word in name) { seen[word]++; cols[col] = 1 } } }
    END { k = 0; for (c in cols) k++
        for (w in name) if (seen[w] != 1) { printf "%s shown %d times; ", w, seen[w]; bad = 1 }
        if (k != 3) printf "option names start at %d different columns, not 3", k }' "$TMP/names" "$TMP/table.log")
grep -qE "^  output_dir +$long_dir\$" "$TMP/table.log" && grep -qE "^  lora_target_modules +$targets\$" "$TMP/table.log" && [ -z "$bad" ]
if [ $? -eq 0 ]; then echo "ok cli: the configuration table is aligned with long values, which are shown whole"
else echo "FAIL cli: the configuration table: ${bad:-a long value not whole}: $(sed -n '/^configuration:/,/^[^ ]/p' "$TMP/table.log" | head -30)"; fails=$((fails + 1)); fi
expect_error "--collectives other than host on the CPU" "--collectives: 'nccl' is not one this trainer runs \(host\)" --model $FIX/tiny_gqa "${RUN[@]}" --collectives nccl
expect_error "--random_init with --resume" "--random_init is for benchmarks.*--resume" --model $FIX/tiny_gqa "${RUN[@]}" --random_init --resume "$TMP/none"
expect_error "--random_init without config.json" "$TMP/nope/config.json" --model "$TMP/nope" --tokenizer $FIX/tiny_gqa/tokenizer.model "${RUN[@]}" --random_init
model_copy tiny_gqa; sed -i 's/"initializer_range": 0.1/"initializer_range": -0.1/' "$TMP/m/config.json"
expect_error "--random_init: negative initializer_range" "config.json: initializer_range must be a number in \(0, 1000\]" --model "$TMP/m" "${RUN[@]}" --random_init
expect_error "merge with full fine-tuning" "--merge_adapter folds a LoRA adapter in" --model $FIX/tiny_gqa "${RUN[@]}" --full_finetune --merge_adapter
# QLoRA (--quantize)
expect_error "bad --quantize" "--quantize: 'int8' is not one of none, nf4, fp4" --model $FIX/tiny_qlora "${RUN[@]}" --quantize int8
expect_error "--quantize with full fine-tuning" "--quantize keeps the base weights frozen.*--full_finetune" --model $FIX/tiny_qlora "${RUN[@]}" --quantize nf4 --full_finetune
expect_error "--quantize with --use_dora" "--quantize with DoRA \(--use_dora\) is not supported yet" --model $FIX/tiny_qlora "${RUN[@]}" --quantize nf4 --use_dora
expect_error "bad --double_quant" "--double_quant: '2' is not an integer in \[0, 1\]" --model $FIX/tiny_qlora "${RUN[@]}" --quantize nf4 --double_quant 2
expect_error "a checkpoint bitsandbytes already quantized" "tensor 'model.layers.0.[a-z_.]*weight.(absmax|quant_map|nested_absmax|nested_quant_map|quant_state.bitsandbytes__nf4)' is bitsandbytes' quantization state" \
    --model $FIX/tiny_qlora/prequantized --tokenizer $FIX/tiny_qlora/tokenizer.model "${RUN[@]}"
expect_error "a checkpoint bitsandbytes already quantized, with --quantize" "is bitsandbytes' quantization state" \
    --model $FIX/tiny_qlora/prequantized --tokenizer $FIX/tiny_qlora/tokenizer.model "${RUN[@]}" --quantize nf4
# the plan of Llama-2-7B in 4 bits: per layer four (4096, 4096) weights of 262144 blocks and three
# (11008, 4096) of 704512; double quantization stores per weight the offset and one fp32 scale per
# 256 blocks, a byte per block and half a byte per element, rounded up to 16 bytes: 8654864 and
# 23259920 bytes; with the layer's two norms in fp32 (32768 bytes) a layer's run is 104431984 bytes,
# 32 layers: 3341823488 bytes = 3187.0 MiB (3475.0 MiB with fp32 absmax values)
mkdir -p "$TMP/7b"; cp $FIX/configs/llama-2-7b/config.json "$TMP/7b/"
for dq in 1 0; do
    "$BIN" --model "$TMP/7b" --random_init --tokenizer $FIX/tiny_gqa/tokenizer.model --data "$DATA" --max_seq_len 24 \
        --quantize nf4 --double_quant $dq --lora_target_modules all-linear --dry_run --output_dir "$TMP/dry" >"$TMP/dry.log" 2>&1
    want=$([ $dq = 1 ] && echo 3187.0 || echo 3475.0)
    if grep -qE "of which 4-bit layers +$want MiB" "$TMP/dry.log" && grep -q "of which dequantize scratch" "$TMP/dry.log"; then
        echo "ok cli: --quantize nf4 --double_quant $dq: the plan counts Llama-2-7B's 4-bit weights ($want MiB)"
    else
        echo "FAIL cli: --quantize nf4 --double_quant $dq plan: $(grep -A3 'base weights' "$TMP/dry.log")"; fails=$((fails + 1))
    fi
done
if "$BIN" --help | grep -q -- "--gradient_accumulation_steps"; then echo "ok cli: --help lists the options"; else echo "FAIL cli: --help"; fails=$((fails + 1)); fi
# docs/training.md lists the refusals parse_args checks, row for row (trainer/options.h's table)
if diff <("$BIN" --refusals) <(sed -n '/^| option | with | the message |$/,/^$/p' docs/training.md | sed '/^$/d') >"$TMP/refusals.diff"
then echo "ok cli: docs/training.md lists the options that do not go together as --refusals prints them"
else echo "FAIL cli: docs/training.md's refusals differ from --refusals: $(head -6 "$TMP/refusals.diff")"; fails=$((fails + 1)); fi

# checkpoints
expect_error "missing model folder" "$TMP/nope/(config.json|tokenizer.model)" --model "$TMP/nope" "${RUN[@]}"
model_copy tiny_gqa; printf '{"hidden_size": 64,' > "$TMP/m/config.json"
expect_error "config.json not JSON" "config.json: invalid JSON" --model "$TMP/m" "${RUN[@]}"
model_copy tiny_gqa; sed -i 's/"intermediate_size": 96/"intermediate_size": 100/' "$TMP/m/config.json"
expect_error "config does not match weights (shape)" "gate_proj.weight' has shape \[96, 64\] but config.json implies \[100, 64\]" --model "$TMP/m" "${RUN[@]}"
model_copy tiny_gqa; sed -i 's/"num_hidden_layers": 2/"num_hidden_layers": 1/' "$TMP/m/config.json"
expect_error "config does not match weights (layers)" "model.layers.1.* num_hidden_layers = 1" --model "$TMP/m" "${RUN[@]}"
model_copy tiny_gqa; sed -i 's/"num_hidden_layers": 2/"num_hidden_layers": 3/' "$TMP/m/config.json"
expect_error "missing tensor" "model.layers.2.input_layernorm.weight' is missing" --model "$TMP/m" "${RUN[@]}"
model_copy tiny_gqa; head -c 300000 $FIX/tiny_gqa/model.safetensors > "$TMP/m/model.safetensors"
expect_error "truncated safetensors" "model.safetensors" --model "$TMP/m" "${RUN[@]}"
model_copy tiny_gqa; head -c 6 $FIX/tiny_gqa/model.safetensors > "$TMP/m/model.safetensors"
expect_error "safetensors shorter than its header length" "model.safetensors" --model "$TMP/m" "${RUN[@]}"
model_copy tiny_gqa; perl -0pi -e 's/\{"dtype"/{"dtypo"/' "$TMP/m/model.safetensors"
expect_error "malformed safetensors header" "model.safetensors" --model "$TMP/m" "${RUN[@]}"
# same byte count, so only the shape is wrong: [512,64] -> [64,512] for the embedding
model_copy tiny_gqa; perl -0pi -e 's/("model\.embed_tokens\.weight":\{"dtype":"F32","shape":)\[512,64\]/${1}[64,512]/' "$TMP/m/model.safetensors"
expect_error "tensor of the wrong shape" "embed_tokens.weight' has shape \[64, 512\]" --model "$TMP/m" "${RUN[@]}"
model_copy tiny_gqa; sed -i 's/"vocab_size": 512/"vocab_size": 512, "sliding_window": 0/' "$TMP/m/config.json"
expect_error "sliding_window 0 (none is null)" "config.json: 'sliding_window' must be an integer in \[1, " --model "$TMP/m" "${RUN[@]}"
model_copy tiny_gqa; sed -i 's/"vocab_size": 512/"vocab_size": 512, "sliding_window": "4096"/' "$TMP/m/config.json"
expect_error "sliding_window as a string" "config.json: 'sliding_window' must be an integer" --model "$TMP/m" "${RUN[@]}"
model_copy tiny_gqa; sed -i 's/"vocab_size": 512/"vocab_size": 512, "sliding_window": 5/' "$TMP/m/config.json"
"$BIN" --model "$TMP/m" --data "$DATA" --max_seq_len 24 --dry_run --output_dir "$TMP/dry" >"$TMP/swa.log" 2>&1
if [ $? -eq 0 ] && grep -q "^model .*, a sliding window of 5 keys$" "$TMP/swa.log"; then
    echo "ok cli: a config.json with sliding_window 5: the plan names the window"
else
    echo "FAIL cli: sliding_window 5: $(grep -m1 "^model\|error" "$TMP/swa.log")"; fails=$((fails + 1))
fi
# --s2_attn: what it cannot compose with is refused, naming the option; a packed run plans and trains
expect_error "--s2_attn with padding's batches" "--s2_attn needs --batching packing" --model $FIX/tiny_gqa "${RUN[@]}" --s2_attn 1
expect_error "--s2_attn with rows not a multiple of 4" "--s2_attn cuts rows in 4 groups: --max_seq_len 22 is not a multiple of 4" \
    --model $FIX/tiny_gqa "${RUN[@]}" --s2_attn 1 --batching packing --max_seq_len 22
model_copy tiny_gqa; sed -i 's/"vocab_size": 512/"vocab_size": 512, "sliding_window": 5/' "$TMP/m/config.json"
expect_error "--s2_attn with a sliding window" "--s2_attn: .* has a sliding window of 5 keys" --model "$TMP/m" "${RUN[@]}" --s2_attn 1 --batching packing
expect_error "--s2_attn with an odd head count" "--s2_attn splits the query heads in halves: .* has 3 \(num_attention_heads\)" \
    --model $FIX/tiny_tied "${RUN[@]}" --s2_attn 1 --batching packing
"$BIN" --model $FIX/tiny_gqa "${RUN[@]}" --s2_attn 1 --batching packing --chunk_size 5 >"$TMP/s2.log" 2>&1
if [ $? -eq 0 ] && grep -q "^attention in training: shifted sparse (--s2_attn), rows of 24 cut in 4 groups of 6; full in evaluation$" "$TMP/s2.log"; then
    echo "ok cli: --s2_attn 1 --batching packing trains, and the plan says so"
else
    echo "FAIL cli: --s2_attn 1: $(grep -m1 "^attention\|error" "$TMP/s2.log")"; fails=$((fails + 1))
fi
model_copy tiny_gqa; sed -i 's/"rope_theta": 10000.0/"rope_theta": 1e39/' "$TMP/m/config.json"
expect_error "rope_theta beyond float" "rope_theta' must be a positive finite number" --model "$TMP/m" "${RUN[@]}"
model_copy tiny_gqa; sed -i 's/"hidden_size": 64/"hidden_size": 65536/; s/"intermediate_size": 96/"intermediate_size": 262144/; s/"vocab_size": 512/"vocab_size": 16777216/' "$TMP/m/config.json"
expect_error "config claiming terabytes of weights (checked before allocating)" "has shape .* but config.json implies" --model "$TMP/m" "${RUN[@]}"
model_copy tiny_tied; rm "$TMP/m/model-00002-of-00002.safetensors"
expect_error "missing shard" "model-00002-of-00002.safetensors" --model "$TMP/m" "${RUN[@]}"
model_copy tiny_gqa; sed -i 's/"tie_word_embeddings": false/"tie_word_embeddings": true/' "$TMP/m/config.json"
expect_error "untied checkpoint read as tied" "lm_head.weight' differs from model.embed_tokens.weight" --model "$TMP/m" "${RUN[@]}"

# tokenizer
model_copy tiny_gqa; head -c 1000 $FIX/tiny_gqa/tokenizer.model > "$TMP/m/tokenizer.model"
expect_error "truncated tokenizer.model" "tokenizer" --model "$TMP/m" "${RUN[@]}"
model_copy tiny_gqa; head -c 4000 /dev/urandom > "$TMP/m/tokenizer.model"
expect_error "garbage tokenizer.model" "tokenizer" --model "$TMP/m" "${RUN[@]}"

# a model folder with a tokenizer.json and no tokenizer.model (as Llama-3's): found, used, and copied into
# the output as tokenizer.json (packed rows: a tokenizer.json has no EOS of its own to pad with)
model_copy tiny_gqa; rm "$TMP/m/tokenizer.model"; cp $FIX/tokenizer/bpe_llama3.json "$TMP/m/tokenizer.json"
sed -i 's/"vocab_size": 512/"vocab_size": 3328/' "$TMP/m/config.json"
if "$BIN" --model "$TMP/m" --random_init --full_finetune --data "$DATA" --max_steps 1 --max_seq_len 16 --batching packing \
        --batch_size 2 --output_dir "$TMP/out_json" >"$TMP/out" 2>&1 &&
   cmp -s "$TMP/out_json/tokenizer.json" $FIX/tokenizer/bpe_llama3.json && [ ! -e "$TMP/out_json/tokenizer.model" ]; then
    echo "ok cli: a folder with only tokenizer.json trains, and the saved model has its tokenizer.json"
else
    echo "FAIL cli: a folder with only tokenizer.json: $(tail -3 "$TMP/out")"; fails=$((fails + 1))
fi
head -c 5000 $FIX/tokenizer/bpe_llama3.json > "$TMP/m/tokenizer.json"
expect_error "truncated tokenizer.json" "tokenizer $TMP/m/tokenizer.json: not valid JSON" --model "$TMP/m" "${RUN[@]}" --random_init
model_copy tiny_gqa; rm "$TMP/m/tokenizer.model"; cp $FIX/tokenizer/bpe_llama3.json "$TMP/m/tokenizer.json"
expect_error "tokenizer.json larger than the model's vocab" "tokenizer.json has 3326 pieces but the model's vocab_size is 512" --model "$TMP/m" "${RUN[@]}"

# data
printf '{"text": "fine"}\n{"text": oops}\n' > "$TMP/bad.jsonl"
expect_error "invalid JSON line" "bad.jsonl:2: invalid JSON" --model $FIX/tiny_gqa --data "$TMP/bad.jsonl" --max_steps 1
printf '{"text": "fine"}\n\n{"txt": "no"}\n' > "$TMP/bad2.jsonl"
expect_error "line without text" "bad2.jsonl:3: missing field \"text\"" --model $FIX/tiny_gqa --data "$TMP/bad2.jsonl" --max_steps 1
printf '\n\n' > "$TMP/empty.jsonl"
expect_error "empty data" "empty.jsonl: empty file" --model $FIX/tiny_gqa --data "$TMP/empty.jsonl" --max_steps 1
expect_error "missing data" "nothere.jsonl: cannot read" --model $FIX/tiny_gqa --data "$TMP/nothere.jsonl" --max_steps 1

# adapters
expect_error "adapter for another model" "adapter_model.safetensors: tensor .* has shape" --model $FIX/tiny_gqa "${RUN[@]}" --from_peft_checkpoint $FIX/tiny_tied/peft_init
mkdir -p "$TMP/ad"; cp $FIX/tiny_gqa/peft_init/* "$TMP/ad/"; sed -i 's/"peft_type": "LORA"/"peft_type": "ADALORA"/' "$TMP/ad/adapter_config.json"
expect_error "neither LoRA, IA3, llama_adapter nor prefix" 'peft_type must be "LORA", "IA3", "ADAPTION_PROMPT" or "PREFIX_TUNING"' --model $FIX/tiny_gqa "${RUN[@]}" --from_peft_checkpoint "$TMP/ad"
cp $FIX/tiny_gqa/peft_init/* "$TMP/ad/"; sed -i 's/"peft_type": "LORA"/"peft_type": "PREFIX_TUNING"/' "$TMP/ad/adapter_config.json"
expect_error "a LoRA config called PREFIX_TUNING" "adapter_config.json: 'num_virtual_tokens' must be an integer in \[1, 65536\]" --model $FIX/tiny_gqa "${RUN[@]}" --from_peft_checkpoint "$TMP/ad"
cp $FIX/tiny_gqa/peft_init/* "$TMP/ad/"; sed -i 's/"peft_type": "LORA"/"peft_type": "IA3"/' "$TMP/ad/adapter_config.json"
expect_error "a LoRA adapter's tensors under an IA3 config" "adapter_model.safetensors: tensor '.*ia3_l' is missing" --model $FIX/tiny_gqa "${RUN[@]}" --from_peft_checkpoint "$TMP/ad"
rm -f "$TMP/ad/"*; cp $FIX/tiny_gqa/ia3/peft_init/* "$TMP/ad/"; sed -i 's/"down_proj"$/"k_proj"/' "$TMP/ad/adapter_config.json"
expect_error "IA3: a vector of the other shape (feedforward)" "tensor '.*k_proj.ia3_l' has shape \[32, 1\], expected \[1, 64\]" --model $FIX/tiny_gqa "${RUN[@]}" --from_peft_checkpoint "$TMP/ad"
cp $FIX/tiny_gqa/ia3/peft_init/* "$TMP/ad/"; sed -i 's/"down_proj"$/"up_proj"/' "$TMP/ad/adapter_config.json"
expect_error "IA3: feedforward modules that are not targets" "feedforward_modules must be a subset of target_modules" --model $FIX/tiny_gqa "${RUN[@]}" --from_peft_checkpoint "$TMP/ad"
cp $FIX/tiny_gqa/peft_init/* "$TMP/ad/"; sed -i 's/"use_dora": false/"use_dora": true/' "$TMP/ad/adapter_config.json"
expect_error "DoRA config without magnitudes" "adapter_model.safetensors: tensor '.*lora_magnitude_vector' is missing" --model $FIX/tiny_gqa "${RUN[@]}" --from_peft_checkpoint "$TMP/ad"
expect_error "DoRA with full fine-tuning" "--use_dora trains a DoRA adapter" --model $FIX/tiny_gqa "${RUN[@]}" --full_finetune --use_dora
# --peft_method
expect_error "unknown PEFT method" "--peft_method: 'adalora' is not one of lora, ia3, llama_adapter, prefix" --model $FIX/tiny_gqa "${RUN[@]}" --peft_method adalora
expect_error "IA3 with --lora_r" "--lora_r is LoRA's; with --peft_method ia3" --model $FIX/tiny_gqa "${RUN[@]}" --peft_method ia3 --lora_r 4
expect_error "IA3 with --use_dora" "--use_dora is LoRA's; with --peft_method ia3" --model $FIX/tiny_gqa "${RUN[@]}" --use_dora --peft_method ia3
expect_error "IA3 with full fine-tuning" "--peft_method ia3 trains an adapter; with --full_finetune" --model $FIX/tiny_gqa "${RUN[@]}" --peft_method ia3 --full_finetune
expect_error "IA3: unknown target" "--ia3_target_modules: unknown module 'kk_proj'" --model $FIX/tiny_gqa "${RUN[@]}" --peft_method ia3 --ia3_target_modules kk_proj
expect_error "IA3: feedforward module not a target" "--ia3_feedforward_modules up_proj: must be among --ia3_target_modules" --model $FIX/tiny_gqa "${RUN[@]}" --peft_method ia3 --ia3_feedforward_modules up_proj
expect_error "IA3 from a LoRA adapter" "--peft_method ia3, but --from_peft_checkpoint .* holds a LoRA adapter" --model $FIX/tiny_gqa "${RUN[@]}" --peft_method ia3 --from_peft_checkpoint $FIX/tiny_gqa/peft_init
expect_error "llama_adapter: more layers than the model's" "--adapter_layers 30 is more than the 2 decoder layers of $FIX/tiny_gqa" --model $FIX/tiny_gqa "${RUN[@]}" --peft_method llama_adapter
expect_error "llama_adapter with --lora_r" "--lora_r is LoRA's; with --peft_method llama_adapter give --adapter_len and --adapter_layers" --model $FIX/tiny_gqa "${RUN[@]}" --peft_method llama_adapter --lora_r 4
expect_error "llama_adapter with full fine-tuning" "--peft_method llama_adapter trains an adapter; with --full_finetune" --model $FIX/tiny_gqa "${RUN[@]}" --peft_method llama_adapter --full_finetune
expect_error "llama_adapter merged" "--merge_adapter: a llama_adapter's prompt is no weight change" --model $FIX/tiny_gqa "${RUN[@]}" --from_peft_checkpoint $FIX/tiny_gqa/llama_adapter/peft_init --merge_adapter
expect_error "llama_adapter as GGUF" "--export_gguf: a llama_adapter's prompt is no weight change" --model $FIX/tiny_gqa "${RUN[@]}" --peft_method llama_adapter --adapter_layers 2 --export_gguf "$TMP/m.gguf"
expect_error "llama_adapter from an IA3 adapter" "--peft_method llama_adapter, but --from_peft_checkpoint .* holds an IA3 adapter" --model $FIX/tiny_gqa "${RUN[@]}" --peft_method llama_adapter --from_peft_checkpoint $FIX/tiny_gqa/ia3/peft_init
rm -f "$TMP/ad/"*; cp $FIX/tiny_gqa/llama_adapter/peft_init/* "$TMP/ad/"; sed -i 's/"adapter_layers": 1/"adapter_layers": 3/' "$TMP/ad/adapter_config.json"
expect_error "llama_adapter: a config with more layers than the model's" "adapter_config.json: 'adapter_layers' must be an integer in \[1, 2\]" --model $FIX/tiny_gqa "${RUN[@]}" --from_peft_checkpoint "$TMP/ad"
cp $FIX/tiny_gqa/llama_adapter/peft_init/* "$TMP/ad/"; sed -i 's/"adapter_len": 3/"adapter_len": 4/' "$TMP/ad/adapter_config.json"
expect_error "llama_adapter: a prompt of another length" "tensor '.*layers.1.self_attn.adaption_prompt' has shape \[1, 3, 64\], expected \[1, 4, 64\]" --model $FIX/tiny_gqa "${RUN[@]}" --from_peft_checkpoint "$TMP/ad"
expect_error "prefix with --lora_alpha" "--lora_alpha is LoRA's; with --peft_method prefix give --num_virtual_tokens" --model $FIX/tiny_gqa "${RUN[@]}" --peft_method prefix --lora_alpha 4
expect_error "prefix with full fine-tuning" "--peft_method prefix trains an adapter; with --full_finetune" --model $FIX/tiny_gqa "${RUN[@]}" --peft_method prefix --full_finetune
expect_error "no virtual tokens" "--num_virtual_tokens: '0' is not an integer" --model $FIX/tiny_gqa "${RUN[@]}" --peft_method prefix --num_virtual_tokens 0
expect_error "prefix merged" "--merge_adapter: a prefix's keys and values are no weight change" --model $FIX/tiny_gqa "${RUN[@]}" --from_peft_checkpoint $FIX/tiny_gqa/prefix/peft_init --merge_adapter
expect_error "prefix as a llama.cpp adapter" "--export_gguf_adapter: a prefix's keys and values are no weight change" --model $FIX/tiny_gqa "${RUN[@]}" --peft_method prefix --export_gguf_adapter "$TMP/a.gguf"
expect_error "prefix with --s2_attn" "--s2_attn with --peft_method prefix is not supported" --model $FIX/tiny_gqa "${RUN[@]}" --peft_method prefix --s2_attn 1 --batching packing
expect_error "prefix on a sliding-window model" "a prefix on $FIX/tiny_mistral, a model with a sliding window \(sliding_window 5\), is not supported yet" --model $FIX/tiny_mistral "${RUN[@]}" --peft_method prefix
expect_error "prefix from a llama_adapter" "--peft_method prefix, but --from_peft_checkpoint .* holds a llama_adapter" --model $FIX/tiny_gqa "${RUN[@]}" --peft_method prefix --from_peft_checkpoint $FIX/tiny_gqa/llama_adapter/peft_init
expect_error "llama_adapter from a prefix" "--peft_method llama_adapter, but --from_peft_checkpoint .* holds a prefix" --model $FIX/tiny_gqa "${RUN[@]}" --peft_method llama_adapter --from_peft_checkpoint $FIX/tiny_gqa/prefix/peft_init
rm -f "$TMP/ad/"*; cp $FIX/tiny_gqa/prefix/peft_init/* "$TMP/ad/"; sed -i 's/"num_virtual_tokens": 3/"num_virtual_tokens": 4/' "$TMP/ad/adapter_config.json"
expect_error "prefix: another number of virtual tokens" "tensor 'prompt_embeddings' has shape \[3, 128\], expected \[4, 128\]" --model $FIX/tiny_gqa "${RUN[@]}" --from_peft_checkpoint "$TMP/ad"
cp $FIX/tiny_gqa/prefix/peft_init/* "$TMP/ad/"; sed -i 's/"prefix_projection": false/"prefix_projection": true/' "$TMP/ad/adapter_config.json"
expect_error "prefix: prefix_projection" "adapter_config.json: prefix_projection is not supported" --model $FIX/tiny_gqa "${RUN[@]}" --from_peft_checkpoint "$TMP/ad"
cp $FIX/tiny_gqa/prefix/peft_init/* "$TMP/ad/"; sed -i 's/"num_layers": 2/"num_layers": 3/' "$TMP/ad/adapter_config.json"
expect_error "prefix: another model's layers" "adapter_config.json: 'num_layers' must be the model's 2 layers" --model $FIX/tiny_gqa "${RUN[@]}" --from_peft_checkpoint "$TMP/ad"
cp $FIX/tiny_gqa/prefix/peft_init/* "$TMP/ad/"; sed -i 's/"num_transformer_submodules": 1/"num_transformer_submodules": 2/' "$TMP/ad/adapter_config.json"
expect_error "prefix: an encoder-decoder's" "adapter_config.json: 'num_transformer_submodules' must be 1" --model $FIX/tiny_gqa "${RUN[@]}" --from_peft_checkpoint "$TMP/ad"
expect_error "prefix for another model" "tensor 'prompt_embeddings' has shape \[3, 128\], expected \[3, 192\]" --model $FIX/tiny_tied "${RUN[@]}" --from_peft_checkpoint $FIX/tiny_gqa/prefix/peft_init
expect_error "--trainable_params with prefix" "--trainable_params with --peft_method prefix is not supported yet" --model $FIX/tiny_gqa "${RUN[@]}" --peft_method prefix --trainable_params norm
expect_error "a k-quant llama.cpp adapter" "--export_gguf_adapter with --gguf_type q4_k_m: llama.cpp's k-quant mixes are for models" --model $FIX/tiny_gqa "${RUN[@]}" --export_gguf_adapter "$TMP/a.gguf" --gguf_type q4_k_m
expect_error "IA3 as a llama.cpp adapter" "--export_gguf_adapter writes a llama.cpp LoRA adapter, which cannot hold IA3's vectors" --model $FIX/tiny_gqa "${RUN[@]}" --peft_method ia3 --export_gguf_adapter "$TMP/a.gguf"
# --trainable_params (peft's modules_to_save)
expect_error "--trainable_params with full fine-tuning" "--trainable_params names base tensors .* --full_finetune" --model $FIX/tiny_gqa "${RUN[@]}" --full_finetune --trainable_params norm
expect_error "--trainable_params unknown name" "--trainable_params: unknown 'lm_head' \(known: embed, norm\)" --model $FIX/tiny_gqa "${RUN[@]}" --trainable_params embed,lm_head
rm -f "$TMP/ad/"*; cp $FIX/tiny_gqa/trainable/peft_init/* "$TMP/ad/"; sed -i '/"input_layernorm",/d' "$TMP/ad/adapter_config.json"
expect_error "modules_to_save with some of the norms" "adapter_config.json: modules_to_save must list embed_tokens and/or all of" --model $FIX/tiny_gqa "${RUN[@]}" --from_peft_checkpoint "$TMP/ad"
rm -f "$TMP/ad/"*; cp $FIX/tiny_tied/trainable/peft_init/* "$TMP/ad/"; sed -i 's/"ensure_weight_tying": true/"ensure_weight_tying": false/' "$TMP/ad/adapter_config.json"
expect_error "tied embed_tokens saved untied" "without ensure_weight_tying, so peft's head keeps the base embedding" --model $FIX/tiny_tied "${RUN[@]}" --from_peft_checkpoint "$TMP/ad"
expect_error "an adapter's modules_to_save against --trainable_params" "--trainable_params norm: .* trains \\[\"embed_tokens\"" --model $FIX/tiny_gqa "${RUN[@]}" --from_peft_checkpoint $FIX/tiny_gqa/trainable/peft_init --trainable_params norm
expect_error "--trainable_params with IA3" "--trainable_params with --peft_method ia3 is not supported yet \(only with lora\)" --model $FIX/tiny_gqa "${RUN[@]}" --peft_method ia3 --trainable_params norm
expect_error "--trainable_params with llama_adapter" "--trainable_params with --peft_method llama_adapter is not supported yet" --model $FIX/tiny_gqa "${RUN[@]}" --peft_method llama_adapter --adapter_layers 2 --trainable_params embed
rm -f "$TMP/ad/"*; cp $FIX/tiny_gqa/ia3/peft_init/* "$TMP/ad/"; sed -i 's/"modules_to_save": null/"modules_to_save": ["embed_tokens"]/' "$TMP/ad/adapter_config.json"
expect_error "an IA3 adapter with modules_to_save" "modules_to_save with peft_type \"IA3\" is not supported \(only with LoRA\)" --model $FIX/tiny_gqa "${RUN[@]}" --from_peft_checkpoint "$TMP/ad"

# and a good run writes the adapter and the metrics
if "$BIN" --model $FIX/tiny_gqa "${RUN[@]}" --metrics_file "$TMP/metrics.jsonl" >"$TMP/out" 2>&1 &&
   [ -s "$TMP/out_adapter/adapter_model.safetensors" ] && [ -s "$TMP/out_adapter/adapter_config.json" ] &&
   grep -q '"tok_per_s"' "$TMP/metrics.jsonl" &&
   # cpu_ms is positive: tested as a number, since a clock that ticks in whole ms (or a
   # value ending in .000 by chance, 1 in 1000 at any finer tick) prints no non-zero decimal
   grep -Eo '"cpu_ms": [0-9.]+' "$TMP/metrics.jsonl" | awk '$2 > 0 { ok = 1 } END { exit !ok }'; then
    echo "ok cli: a short run saves the adapter and metrics (with its CPU time)"
else
    echo "FAIL cli: a short run: $(tail -5 "$TMP/out") metrics: $(grep -o '"ms":.*"tok_per_s"' "$TMP/metrics.jsonl")"; fails=$((fails + 1))
fi
[ $fails -eq 0 ]
