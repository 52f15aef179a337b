#!/usr/bin/env bash
# --cpu_offload (train_llama2cu, full fine-tuning; with an adapter it streams the frozen base:
# test_base_offload.sh): the masters, gradients and optimizer
# state on the host and the step on the CPU give the same results as the same run without
# it, bit for bit: every step's loss and gradient norm, and the final weights (or each
# rank's shard file), byte for byte. Run by the emulated build ($EMU_BIN, default
# ./train_llama2cu_emu; without it this says SKIP). Tolerance 0 because nothing may
# differ: the step's elements are the kernels' (support/optimizer.h), the norm is summed
# in the device's order (layers.cuh's sum_host), a whole model's gradient goes back up
# before the backward adds to it again, and a shard's is added on the host as the device
# adds it; a difference anywhere shows within a step.
#
# One process: bf16 with chunks of 7, two micro-batches a step and clipping that bites
# (the running total goes up and down each chunk); the same unclipped; fp32; fp16 (its loss
# scale unscaled on the host); AdamW8bit; SGD with Nesterov
# momentum; --freeze_layers 1 (the masters a copy of the trained runs); killed after step
# 3 and resumed from checkpoint 2 == uninterrupted (with the offload; and without it, whose
# saves stream the weights back from the GPU and the frozen units from their files, after a
# checkpoint rotation deleted those files). Ranks (dev/launch.sh, --collectives
# host): W = 2 FULL_SHARD, 3 SHARD_GRAD_OP (a shard's gradient added on the host), 2
# NO_SHARD (summed over the host's communicator); a NaN planted in a weight's file is not
# saved without the offload (fp32 masters, --pure_bf16; one process and W = 2 FULL_SHARD) nor
# --pure_bf16 offloaded; --dry_run's host plan.
# --pure_bf16 1 --optimizer anyprecision (the host keeps the bf16 parameters, the step's bf16
# gradient and the bf16 state): whole sequences, 2 micro-batches, clipped (each micro-batch's
# gradient rounded into the bf16 sum on the host); chunks of 7 with Kahan summation (the fp32
# micro-batch sum on the host, then rounded); --freeze_layers 1 (the parameters in runs); W = 2
# FULL_SHARD in chunks and with --freeze_layers 1, 3 SHARD_GRAD_OP with Kahan, 2 NO_SHARD
# clipped (the bf16 sum over ranks in fp32, rounded once); killed and resumed, one process and W = 2 (the base, or each rank's shards,
# streamed to the GPU's bf16 weights and copied down; the resume's through shards_put);
# unclipped, overlapped (below): whole sequences with 2 micro-batches (each unit's bf16 gradient
# final once the last micro-batch's is rounded into the sum on the host), W = 2 FULL_SHARD with
# Kahan summation, and killed and resumed; in chunks of 7 unclipped the step stays after the
# backward (the micro-batch's fp32 sum is rounded into the bf16 one at its end);
# the CPU trainer, which holds it all on the host anyway, takes the combination and changes nothing;
# Llama-2-7B's plans, one process and four ranks (no fp32 shard on the host).
# The cases with --grad_clip 0 but fp16, NO_SHARD and pure bf16 in chunks step each unit as its gradient becomes
# final, overlapped with the backward (offload.cuh's OffloadStep; fp16's loss scale and
# NO_SHARD's sum over replicas keep the step after the backward): LLAMA2TUNE_OFFLOAD_LOG's
# line each step says so (every unit that trains stepped that way) and how many units were
# stepped before the last one's gradient was final (timing: counted over the cases, > 0).
# With the overlap a NaN gradient stops the run (the units are stepped already): exit 1 with
# the step's message, the checkpoint before it intact (AdamW; pure bf16).
set -u
cd "$(dirname "$0")/.."
SUITE="cpu offload"
source test/train_helpers.sh # BIN, TMP, check, trajectory_diff
EMU_BIN=${EMU_BIN:-./train_llama2cu_emu}
if [ ! -x "$EMU_BIN" ]; then
    echo "SKIP --cpu_offload: no emulated build at $EMU_BIN (make train_llama2cu_emu; or set EMU_BIN)"
    exit 0
fi
export OMP_NUM_THREADS=1 LLAMA2TUNE_TIMEOUT=60 LAUNCH_GRACE=20
TIMEOUT=600
FULL=(--model test/fixtures/tiny_tied --full_finetune --data test/fixtures/data.jsonl --max_seq_len 24 --max_steps 4
      --lr 5e-3 --warmup_steps 1 --weight_decay 0.01 --threads 1)
run() { # run LAUNCH OUT [args]: $EMU_BIN (LAUNCH: none, or W for dev/launch.sh), metrics OUT.jsonl, log OUT.log
    local launch=(timeout $TIMEOUT) out=$2
    [ "$1" != none ] && launch+=(dev/launch.sh "$1")
    shift 2
    "${launch[@]}" "$EMU_BIN" "${FULL[@]}" --output_dir "$out" --metrics_file "$out.jsonl" "$@" >"$out.log" 2>&1
}
# pair NAME LAUNCH FILES [args]: the run with --cpu_offload 1 == without, bit for bit; with
# OVERLAP=1 its step overlapped the backward at each of the 4 steps (else never)
early=0 # units stepped before the step's last gradient was final, over the overlapped cases
pair() {
    local name=$1 launch=$2 files=$3 tag rc=0 t lines e how
    shift 3
    tag=$(echo "$name" | tr -c 'A-Za-z0-9\n' _)
    run "$launch" "$TMP/$tag-dev" "$@" || rc=1
    LLAMA2TUNE_OFFLOAD_LOG=1 run "$launch" "$TMP/$tag-host" "$@" --cpu_offload 1 || rc=1
    t=$(trajectory_diff "$TMP/$tag-host.jsonl" "$TMP/$tag-dev.jsonl")
    diff -q <(trajectory "$TMP/$tag-host.jsonl") <(trajectory "$TMP/$tag-dev.jsonl") >/dev/null || rc=1
    for f in $files; do cmp -s "$TMP/$tag-host/$f" "$TMP/$tag-dev/$f" || rc=1; done
    grep -q '"step": *4' "$TMP/$tag-host.jsonl" || rc=1
    # (rank 0's lines: each rank says the same of its shards)
    lines=$(grep -E "^offload step [1-4]: [1-9][0-9]* units stepped as their gradients became final" "$TMP/$tag-host.log" |
        sort -u -t: -k1,1)
    if [ "${OVERLAP:-0}" = 1 ]; then
        [ "$(echo "$lines" | grep -c .)" -eq 4 ] || rc=1
        e=$(echo "$lines" | awk 'NF > 6 { s += $(NF - 6) } END { print s + 0 }')
        early=$((early + e))
        how="overlapped at 4 of 4 steps, $e units stepped before the last was final"
    else
        [ -z "$lines" ] || rc=1
        how="the step after the backward"
    fi
    check "$name: --cpu_offload 1 == without, bit for bit ($how; trajectory difference $t; $files)" $rc "$(tail -3 "$TMP/$tag-host.log")"
}
W1="model.safetensors checkpoint-4/optimizer.safetensors"
pair "bf16, chunks of 7, 2 micro-batches, clipped" none "$W1" --batch_size 2 --gradient_accumulation_steps 2 --chunk_size 7 --grad_clip 0.05
OVERLAP=1 pair "bf16, chunks of 7, 2 micro-batches, unclipped" none "$W1" --batch_size 2 --gradient_accumulation_steps 2 --chunk_size 7 --grad_clip 0
OVERLAP=1 pair "fp32, unclipped" none "$W1" --batch_size 4 --precision fp32 --grad_clip 0
pair "fp16, dynamic loss scaling, unclipped" none "$W1" --batch_size 4 --precision fp16 --grad_clip 0
OVERLAP=1 pair "AdamW8bit, unclipped" none "$W1" --batch_size 4 --optimizer adamw8bit --grad_clip 0
OVERLAP=1 pair "SGD, Nesterov momentum, unclipped" none "$W1" --batch_size 4 --optimizer sgd --momentum 0.9 --nesterov 1 --lr 5e-2 --grad_clip 0
OVERLAP=1 pair "--freeze_layers 1" none "$W1" --batch_size 4 --freeze_layers 1 --grad_clip 0
S2="model.safetensors checkpoint-4/fsdp-00000-of-00002.safetensors checkpoint-4/fsdp-00001-of-00002.safetensors"
OVERLAP=1 pair "W = 2 FULL_SHARD, chunks of 7, unclipped" 2 "$S2" --batch_size 2 --sharding_strategy FULL_SHARD --collectives host --chunk_size 7 --grad_clip 0
OVERLAP=1 pair "W = 3 SHARD_GRAD_OP, 2 micro-batches, unclipped" 3 \
    "model.safetensors $(printf 'checkpoint-4/fsdp-%05d-of-00003.safetensors ' 0 1 2)" \
    --batch_size 1 --gradient_accumulation_steps 2 --sharding_strategy SHARD_GRAD_OP --collectives host --grad_clip 0
pair "W = 2 NO_SHARD, unclipped" 2 "$W1" --batch_size 2 --sharding_strategy NO_SHARD --collectives host --grad_clip 0
[ "$early" -gt 0 ]
check "the overlapped step: $early units stepped before their step's last gradient was final, over the cases' steps" $? ""
# --grad_clip 1e9 (the way back to skipping bad steps) clips nothing here and keeps the step after the backward
tag=bf16__chunks_of_7__2_micro_batches__unclipped
LLAMA2TUNE_OFFLOAD_LOG=1 run none "$TMP/clip1e9" --batch_size 2 --gradient_accumulation_steps 2 --chunk_size 7 --grad_clip 1e9 --cpu_offload 1
rc=$?
for f in $W1; do cmp -s "$TMP/clip1e9/$f" "$TMP/$tag-host/$f" || rc=1; done
diff -q <(trajectory "$TMP/clip1e9.jsonl") <(trajectory "$TMP/$tag-host.jsonl") >/dev/null && ! grep -q "^offload step" "$TMP/clip1e9.log" || rc=1
check "--grad_clip 1e9 == --grad_clip 0 with the offload, bit for bit, the step after the backward" $rc "$(tail -3 "$TMP/clip1e9.log")"

PURE=(--pure_bf16 1 --optimizer anyprecision)
pair "pure bf16: whole, 2 micro-batches, clipped" none "$W1" "${PURE[@]}" --batch_size 2 --gradient_accumulation_steps 2 --grad_clip 0.05
pair "pure bf16: chunks of 7, 2 micro-batches, Kahan, clipped" none "$W1" "${PURE[@]}" --batch_size 2 --gradient_accumulation_steps 2 \
    --chunk_size 7 --kahan_summation 1 --grad_clip 0.05
pair "pure bf16: --freeze_layers 1" none "$W1" "${PURE[@]}" --batch_size 4 --freeze_layers 1
pair "pure bf16: W = 2 FULL_SHARD, chunks of 7" 2 "$S2" "${PURE[@]}" --batch_size 2 --sharding_strategy FULL_SHARD --collectives host --chunk_size 7
pair "pure bf16: W = 2 FULL_SHARD, --freeze_layers 1" 2 "$S2" "${PURE[@]}" --batch_size 2 --sharding_strategy FULL_SHARD --collectives host \
    --freeze_layers 1
pair "pure bf16: W = 3 SHARD_GRAD_OP, 2 micro-batches, Kahan" 3 \
    "model.safetensors $(printf 'checkpoint-4/fsdp-%05d-of-00003.safetensors ' 0 1 2)" \
    "${PURE[@]}" --batch_size 1 --gradient_accumulation_steps 2 --sharding_strategy SHARD_GRAD_OP --collectives host --kahan_summation 1
pair "pure bf16: W = 2 NO_SHARD, clipped" 2 "$W1" "${PURE[@]}" --batch_size 2 --sharding_strategy NO_SHARD --collectives host --grad_clip 0.05
# unclipped: each unit's AnyPrecisionAdamW step overlapped with the backward (whole sequences)
OVERLAP=1 pair "pure bf16: whole, 2 micro-batches, unclipped" none "$W1" "${PURE[@]}" --batch_size 2 --gradient_accumulation_steps 2 --grad_clip 0
OVERLAP=1 pair "pure bf16: W = 2 FULL_SHARD, Kahan, unclipped" 2 "$S2" "${PURE[@]}" --batch_size 2 --sharding_strategy FULL_SHARD \
    --collectives host --kahan_summation 1 --grad_clip 0
pair "pure bf16: chunks of 7, unclipped" none "$W1" "${PURE[@]}" --batch_size 4 --chunk_size 7 --grad_clip 0
# the CPU trainer: its state is on the host already, so the combination changes nothing
for o in 0 1; do
    timeout $TIMEOUT "$BIN" "${FULL[@]}" "${PURE[@]}" --batch_size 2 --gradient_accumulation_steps 2 --chunk_size 7 --grad_clip 0.05 \
        --cpu_offload $o --output_dir "$TMP/cpu$o" --metrics_file "$TMP/cpu$o.jsonl" >"$TMP/cpu$o.log" 2>&1
done
diff -q <(trajectory "$TMP/cpu1.jsonl") <(trajectory "$TMP/cpu0.jsonl") >/dev/null && grep -q '"step": *4' "$TMP/cpu1.jsonl" &&
    cmp -s "$TMP/cpu1/model.safetensors" "$TMP/cpu0/model.safetensors" &&
    cmp -s "$TMP/cpu1/checkpoint-4/optimizer.safetensors" "$TMP/cpu0/checkpoint-4/optimizer.safetensors"
check "the CPU trainer ($BIN): pure bf16 with --cpu_offload 1 == without, bit for bit" $? "$(tail -3 "$TMP/cpu1.log")"


# resume: the state streams from the host's memory into the checkpoint and back (AdamW
# unclipped: the step overlapped, the optimizer's step count the checkpoint's)
# resumed NAME LAUNCH FILES [args]: killed after step 3, resumed from checkpoint 2 == uninterrupted
resumed() {
    local name=$1 launch=$2 files=$3 tag rc=0
    shift 3
    tag=resume_$(echo "$name" | tr -c 'A-Za-z0-9\n' _)
    run "$launch" "$TMP/$tag-ref" "$@" --cpu_offload 1 --save_every 2
    LLAMA2TUNE_FAULT=step:3 run "$launch" "$TMP/$tag" "$@" --cpu_offload 1 --save_every 2
    run "$launch" "$TMP/$tag" "$@" --cpu_offload 1 --save_every 2 --resume "$TMP/$tag"
    for f in $files; do cmp -s "$TMP/$tag/$f" "$TMP/$tag-ref/$f" || rc=1; done
    grep -q "resumed from $TMP/$tag/checkpoint-2 at step 2" "$TMP/$tag.log" || rc=1
    check "--cpu_offload 1, $name: killed after step 3, resumed from checkpoint 2 == uninterrupted, bit for bit" $rc "$(tail -3 "$TMP/$tag.log")"
}
resumed "AdamW, unclipped" none "$W1" --batch_size 4 --grad_clip 0
resumed "pure bf16, Kahan" none "$W1" "${PURE[@]}" --batch_size 4 --kahan_summation 1
resumed "pure bf16, W = 2 FULL_SHARD" 2 "$S2" "${PURE[@]}" --batch_size 2 --sharding_strategy FULL_SHARD --collectives host
resumed "pure bf16, unclipped (overlapped)" none "$W1" "${PURE[@]}" --batch_size 4 --grad_clip 0
# without it the base streams from the files to the GPU and saves stream it back, a frozen unit's
# from the files it came from, which the run keeps open: resumed from checkpoint 2 with
# --keep_checkpoints 1, whose rotation deletes that checkpoint when checkpoint 4 is written, before
# the final save reads the frozen units again == the offloaded run (host masters) uninterrupted
args=(--batch_size 4 --freeze_layers 1 --save_every 2 --grad_clip 0)
LLAMA2TUNE_FAULT=step:3 run none "$TMP/stream" "${args[@]}"
run none "$TMP/stream" "${args[@]}" --resume "$TMP/stream" --keep_checkpoints 1
rc=0
for f in $W1; do cmp -s "$TMP/stream/$f" "$TMP/__freeze_layers_1-host/$f" || rc=1; done
grep -q "resumed from $TMP/stream/checkpoint-2 at step 2" "$TMP/stream.log" && [ ! -e "$TMP/stream/checkpoint-2" ] || rc=1
check "--freeze_layers 1 without offload: resumed from checkpoint 2, deleted by the rotation before the final save == offloaded, bit for bit" \
    $rc "$(tail -3 "$TMP/stream.log")"

# the overlapped step cannot skip a step whose gradients turn out NaN (its units are stepped
# already): NaN gradients at step 3 (as the resumed run's) stop the run with the message, exit
# 1, checkpoint 2 as the uninterrupted run saved it
# nanstep NAME REF [args]: the same of the run resumed() ran as REF
nanstep() {
    local name=$1 ref=$TMP/$2-ref rc
    shift 2
    LLAMA2TUNE_FAULT=nan:3 run none "$TMP/nanstep" --batch_size 4 --cpu_offload 1 --save_every 2 --grad_clip 0 "$@"
    rc=$?
    [ $rc -eq 1 ] && grep -q "error: step 3: the loss or the gradient norm is NaN or inf, but --cpu_offload without --grad_clip" "$TMP/nanstep.log" &&
        cmp -s "$TMP/nanstep/checkpoint-2/optimizer.safetensors" "$ref/checkpoint-2/optimizer.safetensors" &&
        cmp -s "$TMP/nanstep/checkpoint-2/model.safetensors" "$ref/checkpoint-2/model.safetensors" && [ ! -e "$TMP/nanstep/checkpoint-3" ]
    check "the overlapped step ($name): NaN gradients at step 3 stop the run (exit 1, the message), checkpoint 2 intact" $? \
        "exit $rc: $(grep error "$TMP/nanstep.log" | tail -2)"
    rm -rf "$TMP/nanstep"
}
nanstep AdamW resume_AdamW__unclipped
nanstep "pure bf16" resume_pure_bf16__unclipped__overlapped_ "${PURE[@]}"

# a NaN in a trained weight is never saved: without the offload the check runs on the GPU
# (masters_finite: each tensor's sum), and says what trainer/checkpoint.h's check of host weights says.
# The NaN is planted in the file (the final norm's last element, bf16 0x7fc0): every step's
# loss is NaN and skipped, so the optimizer state stays zero and the weights alone trip it.
# One process, and W = 2 FULL_SHARD (the NaN in rank 1's shard, which streams to its GPU: its
# check trips and every rank refuses)
cp -r test/fixtures/tiny_tied "$TMP/nan_model"
f="$TMP/nan_model/model-00002-of-00002.safetensors"
printf '\xc0\x7f' | dd of="$f" bs=1 seek=$(($(stat -c %s "$f") - 2)) conv=notrunc status=none
for w in none 2; do
    for how in "fp32 masters:" "--pure_bf16 1:--pure_bf16 1 --optimizer anyprecision" \
        "--pure_bf16 1 offloaded:--pure_bf16 1 --optimizer anyprecision --cpu_offload 1"; do
        run $w "$TMP/nan" --model "$TMP/nan_model" --max_steps 2 --save_every 1 --collectives host ${how#*:}
        rc=$?
        [ $rc -eq 1 ] && grep -q "error: not saving checkpoint 1: the trainable weights or the optimizer state hold NaN or inf" "$TMP/nan.log" &&
            [ ! -e "$TMP/nan/checkpoint-1" ]
        ok=$? where=""
        [ $w = 2 ] && where=", W = 2 FULL_SHARD"
        check "a NaN weight (${how%%:*}$where) is not saved: exit 1 at checkpoint 1 with the message" $ok \
            "exit $rc: $(grep error "$TMP/nan.log" | tail -2)"
        rm -rf "$TMP/nan"
    done
done

# the plan: the offloaded state on the host's side, off the GPU's
"$EMU_BIN" "${FULL[@]}" --batch_size 4 --dry_run >"$TMP/plan-dev.log" 2>&1
"$EMU_BIN" "${FULL[@]}" --batch_size 4 --dry_run --cpu_offload 1 >"$TMP/plan-host.log" 2>&1
rc=0
grep -q "offloaded grads and optimizer state" "$TMP/plan-host.log" || rc=1
check "--dry_run --cpu_offload 1 plans the offloaded state in host memory" $rc "$(tail -5 "$TMP/plan-host.log")"
# --pure_bf16 offloaded on Llama-2-7B (6738415616 parameters; no GPU, no weights): the GPU keeps the
# bf16 weights, 12852.5 MiB, a unit's fp32 gradient at a time (the embedding's 500.0 MiB and a
# layer's 202383360 x 4 = 772.0) and the 64 MiB upload stage: 14188.5 MiB; the host the bf16
# parameters, their bf16 gradient and two bf16 moments, 8 bytes a parameter (51410.0 MiB), two
# stages of a layer's fp32 gradient (1544.1) and the step's two 64 MiB pieces: 53082.1 (alignment:
# 0.1); Kahan summation 2 bytes more (+ 12852.5 = 65934.6); in chunks the micro-batch's fp32 sum,
# 4 bytes, instead of the stages (+ 25705.0 - 1544.1 = 77243.0); the base a streamed 64 MiB piece
mkdir -p "$TMP/7b"
cp test/fixtures/configs/llama-2-7b/config.json "$TMP/7b/"
for c in "0 0 53082.1" "1 0 65934.6" "0 16 77243.0"; do
    set -- $c
    "$EMU_BIN" --model "$TMP/7b" --random_init --tokenizer test/fixtures/tiny_gqa/tokenizer.model --data test/fixtures/data.jsonl \
        --max_seq_len 512 --batch_size 1 --full_finetune --activation_checkpointing --output_dir "$TMP/out" --pure_bf16 1 \
        --optimizer anyprecision --kahan_summation $1 --chunk_size $2 --cpu_offload 1 --dry_run >"$TMP/pure7b.log" 2>&1
    rc=$?
    [ $rc -eq 0 ] && grep -qE "trainable weights, grads, AnyPrecision +14188\.5 MiB" "$TMP/pure7b.log" &&
        grep -qE "offloaded grads and optimizer state +$3 MiB" "$TMP/pure7b.log" &&
        grep -qE "base weights \(fp32: held, or streamed\) +64\.0 MiB" "$TMP/pure7b.log"
    check "Llama-2-7B --pure_bf16 --cpu_offload 1, Kahan $1, chunks of $2 (0: whole): 14188.5 MiB on the GPU, $3 MiB offloaded" $? \
        "exit $rc: $(grep -A12 '^memory plan' "$TMP/pure7b.log" | tail -12)"
done
# ... and over four ranks (FULL_SHARD): a rank's shard of 1684603904 parameters (the 6738415616
# divide by 4 unit by unit, no padding) as 8 bytes on the host (12852.5 MiB), two stages of the
# widest shard, a layer's 202383360 / 4 x 4 bytes (386.0), the step's two 64 MiB pieces: 13366.5;
# the base a streamed 64 MiB piece, not the rank's fp32 shards (1684603904 x 4 = 6426.0 MiB more)
dev/launch.sh 4 "$EMU_BIN" --model "$TMP/7b" --random_init --tokenizer test/fixtures/tiny_gqa/tokenizer.model \
    --data test/fixtures/data.jsonl --max_seq_len 512 --batch_size 1 --full_finetune --activation_checkpointing \
    --output_dir "$TMP/out" --pure_bf16 1 --optimizer anyprecision --cpu_offload 1 --collectives host --dry_run >"$TMP/pure7b4.log" 2>&1
rc=$?
[ $rc -eq 0 ] && grep -qE "offloaded grads and optimizer state +13366\.5 MiB" "$TMP/pure7b4.log" &&
    grep -qE "base weights \(fp32: held, or streamed\) +64\.0 MiB" "$TMP/pure7b4.log"
check "Llama-2-7B x 4 FULL_SHARD --pure_bf16 --cpu_offload 1: a rank's host 13366.5 MiB offloaded, its shards a streamed 64 MiB piece" $? \
    "exit $rc: $(grep -A7 '^host memory plan' "$TMP/pure7b4.log" | tail -7)"
exit $((fails > 0))
