#!/usr/bin/env bash
# --activation_offloading (train_llama2cu; docs/long_context.md "Activation offloading: the
# layer-major schedule"): each micro-batch layer by layer over the whole sequence, every layer's
# input in pinned host memory, gives the same results as the chunk-major run without it, bit for
# bit: every step's metrics but the timings, the adapter's (or model's) file and the optimizer's
# state, byte for byte. Tolerance 0: each (layer, chunk) runs the same functions on the same bytes
# (layer_forward, layer_backward; the refill's layer_kv is layer_forward's first kernels), and
# every gradient and the dKV carry sum the chunks in the same order (last first). Run by the
# emulated build ($EMU_BIN, default ./train_llama2cu_emu; without it this says SKIP), whose
# streams run lazily (dev/emu/README.md): a copy up or down that the compute does not wait for
# moves stale bytes there.
#
# One step each (its metrics, the weights it wrote, the optimizer's state after it), of a model of
# 5 decoder layers (tiny_gqa's shapes, untied; its weights drawn once by the CPU trainer), rows of
# 24 in chunks of 10 (10, 10, 4: uneven), 2 rows a micro-batch: LoRA bf16 chunked and fp32 whole;
# QLoRA nf4 with --cpu_offload 1 (the base streamed too); DoRA; full fine-tuning; a sliding-window
# model (tiny_mistral); DPO (its loss weights, and the reference's forward: model_forward's
# layer-major branch); 2 ranks FULL_SHARD; QLoRA nf4 resumed from a checkpoint. The plan, on a
# model of dim 256 and 2 rows of 64: the GPU plan's total against the peak the emulated GPU saw
# (less cuBLASLt's 32 MiB workspace, which no plan counts) within 3%, and
# the host plan's "layer inputs (pinned)" == what the run pinned. Refused, saying why: a tied
# embedding that trains, --context_parallel, --sample_prompt. The CPU trainer takes the option
# and changes nothing (--quick: that alone, no emulated build: make test).
set -u
cd "$(dirname "$0")/.."
SUITE="activation offload"
source test/train_helpers.sh # BIN, TMP, FIX, check, trajectory, need_emu
export OMP_NUM_THREADS=1 LLAMA2TUNE_TIMEOUT=60
QUICK=0
[ "${1:-}" = --quick ] && QUICK=1

# the CPU trainer: the same bytes with it (its activations are host memory already)
CPU=(--model "$FIX/tiny_gqa" --data "$FIX/data.jsonl" --max_seq_len 24 --max_steps 2 --lr 5e-3 --threads 1 --chunk_size 10)
rc=0
"$BIN" "${CPU[@]}" --output_dir "$TMP/cpu0" --metrics_file "$TMP/cpu0.jsonl" >"$TMP/cpu0.log" 2>&1 || rc=1
"$BIN" "${CPU[@]}" --activation_offloading --offload_every 2 --output_dir "$TMP/cpu1" --metrics_file "$TMP/cpu1.jsonl" >"$TMP/cpu1.log" 2>&1 || rc=1
diff -q <(trajectory "$TMP/cpu0.jsonl") <(trajectory "$TMP/cpu1.jsonl") >/dev/null 2>&1 || rc=1
cmp -s "$TMP/cpu0/adapter_model.safetensors" "$TMP/cpu1/adapter_model.safetensors" || rc=1
check "the CPU trainer: --activation_offloading --offload_every 2 changes nothing" $rc "$(tail -2 "$TMP/cpu1.log")"
[ $QUICK = 1 ] && { [ "$fails" -eq 0 ]; exit; }

need_emu "--activation_offloading"
# the 5-layer model: tiny_gqa's config and tokenizer, weights drawn once
mkdir -p "$TMP/shape"
cp "$FIX/tiny_gqa/config.json" "$FIX/tiny_gqa/tokenizer.model" "$TMP/shape/"
sed -i 's/"num_hidden_layers": *2/"num_hidden_layers": 5/' "$TMP/shape/config.json"
"$BIN" --model "$TMP/shape" --random_init --full_finetune --data "$FIX/data.jsonl" --max_seq_len 24 --max_steps 1 \
    --lr 0 --threads 1 --output_dir "$TMP/m5" >"$TMP/m5.log" 2>&1 || { echo "FAIL $SUITE: the 5-layer model: $(tail -2 "$TMP/m5.log")"; exit 1; }
M5=(--model "$TMP/m5" --data "$FIX/data.jsonl" --max_seq_len 24)
ARGS=("${M5[@]}" --lr 5e-3 --warmup_steps 0 --threads 1 --batch_size 2)
ALL=(--lora_target_modules all-linear) CHUNKS=(--chunk_size 10)
emu() { # emu OUT [args]: the emulated trainer (under dev/launch.sh $LAUNCH when set), metrics OUT.jsonl, log OUT.log
    local out=$1 launch=(timeout 600)
    shift
    [ -n "${LAUNCH:-}" ] && launch+=(dev/launch.sh "$LAUNCH")
    "${launch[@]}" "$EMU_BIN" "${ARGS[@]}" --output_dir "$out" --metrics_file "$out.jsonl" "$@" >"$out.log" 2>&1
}
# same FILE A B: the runs A and B wrote the same metrics but timings, FILE, and checkpoint (the
# optimizer's state; sharded, each rank's shards) but its trainer_state.json (their paths)
same() {
    local f
    diff -q <(trajectory "$2.jsonl") <(trajectory "$3.jsonl") >/dev/null 2>&1 && cmp -s "$2/$1" "$3/$1" || return 1
    [ -n "$(ls "$2/checkpoint-1" 2>/dev/null)" ] || return 1
    for f in "$2"/checkpoint-1/*; do
        [ "${f##*/}" = trainer_state.json ] || cmp -s "$f" "$3/checkpoint-1/${f##*/}" || return 1
    done
}
# pair NAME FILE [args]: a step with --activation_offloading == without, bit for bit; with
# $EVERY (K ...), with --offload_every K too
pair() {
    local name=$1 file=$2 tag rc=0 k
    shift 2
    tag=$(echo "$name" | tr -c 'A-Za-z0-9\n' _)
    emu "$TMP/$tag-dev" --max_steps 1 "$@" || rc=1
    emu "$TMP/$tag-host" --max_steps 1 "$@" --activation_offloading || rc=1
    grep -q '"step": *1' "$TMP/$tag-host.jsonl" 2>/dev/null || rc=1
    grep -q "layer inputs moved a micro-batch" "$TMP/$tag-host.log" || rc=1
    same "$file" "$TMP/$tag-dev" "$TMP/$tag-host" || rc=1
    check "$name: --activation_offloading == without, bit for bit" $rc \
        "$(tail -2 "$TMP/$tag-host.log"; diff <(trajectory "$TMP/$tag-host.jsonl") <(trajectory "$TMP/$tag-dev.jsonl") 2>&1 | head -4)"
    for k in ${EVERY:-}; do
        rc=0
        emu "$TMP/$tag-k$k" --max_steps 1 "$@" --activation_offloading --offload_every "$k" || rc=1
        grep -q "layer inputs on the GPU .*--offload_every $k" "$TMP/$tag-k$k.log" || rc=1
        same "$file" "$TMP/$tag-dev" "$TMP/$tag-k$k" || rc=1
        check "$name: --offload_every $k == without, bit for bit" $rc \
            "$(tail -2 "$TMP/$tag-k$k.log"; diff <(trajectory "$TMP/$tag-k$k.jsonl") <(trajectory "$TMP/$tag-dev.jsonl") 2>&1 | head -4)"
    done
}
A=adapter_model.safetensors W=model.safetensors
EVERY="2 3" pair "LoRA bf16, chunks of 10 (10, 10, 4), 2 rows" $A "${ALL[@]}" "${CHUNKS[@]}"
pair "LoRA fp32, whole sequences" $A "${ALL[@]}" --precision fp32
EVERY="2 3" pair "QLoRA nf4 with --cpu_offload 1 (the base streamed), chunks of 10" $A "${ALL[@]}" "${CHUNKS[@]}" --quantize nf4 --cpu_offload 1
pair "DoRA, chunks of 10" $A "${ALL[@]}" "${CHUNKS[@]}" --use_dora
pair "full fine-tuning, chunks of 10" $W --full_finetune "${CHUNKS[@]}"
ARGS=(--model "$FIX/tiny_mistral" --data "$FIX/data.jsonl" --max_seq_len 24 --lr 5e-3 --warmup_steps 0 --threads 1 --batch_size 2)
pair "LoRA, a sliding window of 5 (tiny_mistral), chunks of 4" $A "${ALL[@]}" --chunk_size 4
ARGS=(--model "$FIX/tiny_gqa" --data "$FIX/preference/data.jsonl" --max_seq_len 32 --lr 1e-2 --warmup_steps 0 --threads 1 --batch_size 2
      --shuffle 0 --objective dpo --shared_prompt off)
pair "DPO, LoRA, chunks of 7" $A --from_peft_checkpoint "$FIX/tiny_gqa/dpo/peft_init" --chunk_size 7
ARGS=("${M5[@]}" --lr 5e-3 --warmup_steps 0 --threads 1 --batch_size 2)
LAUNCH=2 pair "2 ranks FULL_SHARD, full fine-tuning, chunks of 10" $W --full_finetune "${CHUNKS[@]}" --sharding_strategy FULL_SHARD \
    --collectives host

# resumed: 4 steps without it == 2 with it, saved, and 2 more resumed with it
rc=0
emu "$TMP/res-ref" --max_steps 4 "${CHUNKS[@]}" --quantize nf4 "${ALL[@]}" || rc=1
emu "$TMP/res" --max_steps 4 --save_every 2 "${CHUNKS[@]}" --quantize nf4 "${ALL[@]}" --activation_offloading || rc=1
emu "$TMP/res2" --max_steps 4 "${CHUNKS[@]}" --quantize nf4 "${ALL[@]}" --activation_offloading --resume "$TMP/res/checkpoint-2" || rc=1
diff -q <(trajectory "$TMP/res-ref.jsonl" | sed -n 3,4p) <(trajectory "$TMP/res2.jsonl" | grep -E '"step": *[34],') >/dev/null 2>&1 || rc=1
cmp -s "$TMP/res-ref/$A" "$TMP/res2/$A" || rc=1
check "QLoRA resumed from checkpoint 2 with it == uninterrupted without it" $rc "$(tail -2 "$TMP/res2.log")"

# the plan, on train_helpers.sh's model of dim 256 (2 layers), 2 rows of 64 in chunks of 16, with
# every layer's input kept and with --offload_every 2 (one on the GPU): the GPU's total against
# the emulated peak less the workspace, the host's layer inputs against what the run pinned
aligned_model "$TMP/big"
ARGS=(--model "$TMP/big" --data "$FIX/data.jsonl" --max_seq_len 64 --batching padding --batch_size 2 --threads 1)
for k in 1 2; do
    rc=0
    LLAMA2TUNE_OFFLOAD_LOG=1 emu "$TMP/big$k" --max_steps 1 --chunk_size 16 "${ALL[@]}" --activation_offloading --offload_every $k || rc=1
    peak=$(sed -n 's/^peak GPU memory \([0-9.]*\) MiB.*/\1/p' "$TMP/big$k.log")
    plan=$(awk '/^memory plan/ { on = 1 } on && $1 == "total" { print $2; exit }' "$TMP/big$k.log")
    awk -v p="${plan:-0}" -v k="${peak:-0}" 'BEGIN { m = k - 32; exit !(p > 0 && m > 0 && p >= 0.97 * m && p <= 1.03 * m) }' || rc=1
    pinned=$(sed -n 's/^activation offload: \([0-9]*\) bytes pinned/\1/p' "$TMP/big$k.log")
    inputs=$(awk '$1 == "layer" && $2 == "inputs" && $3 == "(pinned)" { print $4 }' "$TMP/big$k.log")
    [ $k = 1 ] && all=${pinned:-0} # (3 inputs: with --offload_every 2, 2 of them)
    awk -v p="${pinned:-0}" -v h="${inputs:-0}" -v n=$((2 / k + 1)) -v all="$all" \
        'BEGIN { exit !(p > 0 && p * 3 == all * n && p / 1048576 - h < 0.06 && h - p / 1048576 < 0.06) }' || rc=1
    check "the plan, --offload_every $k: the GPU's within 3% of the emulated peak less the workspace, the host's layer inputs what the run pinned" $rc \
        "plan ${plan:-none} MiB, peak ${peak:-none} MiB, pinned ${pinned:-none} bytes, planned ${inputs:-none} MiB: $(tail -2 "$TMP/big$k.log")"
done

# refused, saying why
ARGS=(--model "$FIX/tiny_tied" --data "$FIX/data.jsonl" --max_seq_len 24 --threads 1)
refused() { # refused NAME MESSAGE [args]
    local name=$1 msg=$2 rc=0
    shift 2
    emu "$TMP/refused" --max_steps 1 --activation_offloading "$@" && rc=1
    grep -q -- "$msg" "$TMP/refused.log" || rc=1
    check "refused: $name" $rc "$(tail -2 "$TMP/refused.log")"
}
refused "a tied embedding that trains" "with a tied embedding that trains is not supported yet" --full_finetune
refused "--context_parallel 2" "with --context_parallel is not supported yet" --context_parallel 2
refused "--sample_prompt" "with --sample_prompt is not supported yet" --sample_prompt hello
refused "--offload_every above the model's layers" "--offload_every 3 is more than the 2 decoder layers" --offload_every 3
ARGS+=(--max_steps 1)
rc=0
"$EMU_BIN" "${ARGS[@]}" --output_dir "$TMP/refused" --offload_every 2 >"$TMP/refused.log" 2>&1 && rc=1
grep -q -- "--offload_every 2 says which layers' inputs --activation_offloading keeps" "$TMP/refused.log" || rc=1
check "refused: --offload_every without --activation_offloading" $rc "$(tail -2 "$TMP/refused.log")"

[ "$fails" -eq 0 ]
