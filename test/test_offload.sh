#!/usr/bin/env bash
# --cpu_offload (train_llama2cu, full fine-tuning): the masters, gradients and optimizer
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
# (the running total goes up and down each chunk); fp32; fp16 (its loss scale unscaled on
# the host); AdamW8bit; SGD with Nesterov
# momentum; --freeze_layers 1 (the masters a copy of the trained runs); killed after step
# 3 and resumed from checkpoint 2 == uninterrupted (with the offload; and without it, whose
# saves stream the weights back from the GPU and the frozen units from their files, after a
# checkpoint rotation deleted those files). Ranks (dev/launch.sh, --collectives
# host): W = 2 FULL_SHARD, 3 SHARD_GRAD_OP (a shard's gradient added on the host), 2
# NO_SHARD (summed over the host's communicator); a NaN planted in a weight's file is not
# saved without the offload (fp32 masters, --pure_bf16; one process and W = 2 FULL_SHARD);
# --dry_run's host plan.
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
# pair NAME LAUNCH FILES [args]: the run with --cpu_offload 1 == without, bit for bit
pair() {
    local name=$1 launch=$2 files=$3 tag rc=0 t
    shift 3
    tag=$(echo "$name" | tr -c 'A-Za-z0-9\n' _)
    run "$launch" "$TMP/$tag-dev" "$@" || rc=1
    run "$launch" "$TMP/$tag-host" "$@" --cpu_offload 1 || rc=1
    t=$(trajectory_diff "$TMP/$tag-host.jsonl" "$TMP/$tag-dev.jsonl")
    diff -q <(trajectory "$TMP/$tag-host.jsonl") <(trajectory "$TMP/$tag-dev.jsonl") >/dev/null || rc=1
    for f in $files; do cmp -s "$TMP/$tag-host/$f" "$TMP/$tag-dev/$f" || rc=1; done
    grep -q '"step": *4' "$TMP/$tag-host.jsonl" || rc=1
    check "$name: --cpu_offload 1 == without, bit for bit (trajectory difference $t; $files)" $rc "$(tail -3 "$TMP/$tag-host.log")"
}
W1="model.safetensors checkpoint-4/optimizer.safetensors"
pair "bf16, chunks of 7, 2 micro-batches, clipped" none "$W1" --batch_size 2 --gradient_accumulation_steps 2 --chunk_size 7 --grad_clip 0.05
pair "fp32" none "$W1" --batch_size 4 --precision fp32
pair "fp16, dynamic loss scaling" none "$W1" --batch_size 4 --precision fp16
pair "AdamW8bit" none "$W1" --batch_size 4 --optimizer adamw8bit
pair "SGD, Nesterov momentum" none "$W1" --batch_size 4 --optimizer sgd --momentum 0.9 --nesterov 1 --lr 5e-2
pair "--freeze_layers 1" none "$W1" --batch_size 4 --freeze_layers 1
S2="model.safetensors checkpoint-4/fsdp-00000-of-00002.safetensors checkpoint-4/fsdp-00001-of-00002.safetensors"
pair "W = 2 FULL_SHARD, chunks of 7" 2 "$S2" --batch_size 2 --sharding_strategy FULL_SHARD --collectives host --chunk_size 7
pair "W = 3 SHARD_GRAD_OP, 2 micro-batches" 3 \
    "model.safetensors $(printf 'checkpoint-4/fsdp-%05d-of-00003.safetensors ' 0 1 2)" \
    --batch_size 1 --gradient_accumulation_steps 2 --sharding_strategy SHARD_GRAD_OP --collectives host
pair "W = 2 NO_SHARD" 2 "$W1" --batch_size 2 --sharding_strategy NO_SHARD --collectives host

# resume: the state streams from the host's memory into the checkpoint and back
args=(--batch_size 4 --cpu_offload 1 --save_every 2)
run none "$TMP/resume-ref" "${args[@]}"
LLAMA2TUNE_FAULT=step:3 run none "$TMP/resume" "${args[@]}"
run none "$TMP/resume" "${args[@]}" --resume "$TMP/resume"
rc=0
for f in $W1; do cmp -s "$TMP/resume/$f" "$TMP/resume-ref/$f" || rc=1; done
grep -q "resumed from $TMP/resume/checkpoint-2 at step 2" "$TMP/resume.log" || rc=1
check "--cpu_offload 1: killed after step 3, resumed from checkpoint 2 == uninterrupted, bit for bit" $rc "$(tail -3 "$TMP/resume.log")"
# without it the base streams from the files to the GPU and saves stream it back, a frozen unit's
# from the files it came from, which the run keeps open: resumed from checkpoint 2 with
# --keep_checkpoints 1, whose rotation deletes that checkpoint when checkpoint 4 is written, before
# the final save reads the frozen units again == the offloaded run (host masters) uninterrupted
args=(--batch_size 4 --freeze_layers 1 --save_every 2)
LLAMA2TUNE_FAULT=step:3 run none "$TMP/stream" "${args[@]}"
run none "$TMP/stream" "${args[@]}" --resume "$TMP/stream" --keep_checkpoints 1
rc=0
for f in $W1; do cmp -s "$TMP/stream/$f" "$TMP/__freeze_layers_1-host/$f" || rc=1; done
grep -q "resumed from $TMP/stream/checkpoint-2 at step 2" "$TMP/stream.log" && [ ! -e "$TMP/stream/checkpoint-2" ] || rc=1
check "--freeze_layers 1 without offload: resumed from checkpoint 2, deleted by the rotation before the final save == offloaded, bit for bit" \
    $rc "$(tail -3 "$TMP/stream.log")"

# a NaN in a trained weight is never saved: without the offload the check runs on the GPU
# (masters_finite: each tensor's sum), and says what trainer.h's check of host weights says.
# The NaN is planted in the file (the final norm's last element, bf16 0x7fc0): every step's
# loss is NaN and skipped, so the optimizer state stays zero and the weights alone trip it.
# One process, and W = 2 FULL_SHARD (the NaN in rank 1's shard, which streams to its GPU: its
# check trips and every rank refuses)
cp -r test/fixtures/tiny_tied "$TMP/nan_model"
f="$TMP/nan_model/model-00002-of-00002.safetensors"
printf '\xc0\x7f' | dd of="$f" bs=1 seek=$(($(stat -c %s "$f") - 2)) conv=notrunc status=none
for w in none 2; do
    for how in "fp32 masters:" "--pure_bf16 1:--pure_bf16 1 --optimizer anyprecision"; do
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
rc=0
"$EMU_BIN" --model test/fixtures/tiny_tied --data test/fixtures/data.jsonl --cpu_offload 1 >"$TMP/lora.log" 2>&1 && rc=1
grep -q -- "--cpu_offload .*--full_finetune" "$TMP/lora.log" || rc=1
check "--cpu_offload without --full_finetune is refused with the reason" $rc "$(tail -2 "$TMP/lora.log")"
exit $((fails > 0))
