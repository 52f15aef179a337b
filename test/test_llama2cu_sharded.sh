#!/usr/bin/env bash
# The CUDA trainer over several ranks, run by the emulated build ($EMU_BIN,
# default ./train_llama2cu_emu; without it this says SKIP; on a GPU machine
# EMU_BIN=./train_llama2cu runs the real one, as dev/gpu_check.sh does): W = 2
# and 3 ranks started by dev/launch.sh (TCP), and by mpirun where it is installed and the
# binary was built with MPI (W = 2 FULL_SHARD and 3 HYBRID_SHARD), with --collectives host (each device collective
# through host memory and fsdp.h's host side: the path ranks sharing a GPU
# take) and --precision fp32, for every sharding strategy: LoRA (dropout,
# all-linear) on the GQA fixture and full fine-tuning (chunks of 7 with a KV
# carry) on the tied one, QLoRA (W = 2 and 3, every strategy), DoRA and prefix tuning; LoRA
# with --trainable_params embed,norm on the tied one (W = 2 and 3 NO_SHARD). With the same global batch (6 rows = W ranks x 6/W)
# each run's losses and gradient norms must equal one process of the same
# binary, and the CPU trainer's (train_llama2, $BIN), and its final weights one
# process's. MPI and TCP must give the same bits (both sum in rank order). The
# default (auto) must pick host for two ranks on the emulated device, which
# they share, and --collectives nccl there must be refused before any NCCL call.
#
# Tolerances (relative, each step's loss and gradient norm; the weights relative
# to their scale, st_compare):
# - W ranks against one process of the same binary: 1e-5. The ranks sum in rank
#   order, so the runs differ only where fp32 rounding falls: each rank's products
#   and reductions run over its own rows, then the ranks' partial sums are added.
#   test_sharded.sh measures 2.3e-7 for this on the CPU; the CUDA kernels' own
#   orders change with the rows per rank too (about 1e-7 an operation,
#   test_llama2cu's estimate), over 4 steps. A real error (a row dropped, a unit
#   gathered into the wrong slot, a gradient reduced before it was complete)
#   moves the loss by 1e-3 or more. Weights: 2e-4, test_sharded.sh's (AdamW's
#   m / sqrt(v) turns a rounding-sized difference in a near-zero gradient into a
#   step-sized one).
# - against the CPU trainer: 1e-4, test_llama2cu's fp32 tolerance for its steps
#   (the GPU's summation orders against the CPU's).
# These come from the CPU's measurements and test_llama2cu's estimates; the first
# emulated runs should bring them down to a few times what they measure.
set -u
cd "$(dirname "$0")/.."
SUITE="llama2cu sharded"
source test/train_helpers.sh # BIN (the CPU trainer), TMP, check, trajectory_diff, need_emu
need_emu "train_llama2cu over several ranks" # EMU_BIN
compare="$(dirname "$BIN")/test/st_compare"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1
export LLAMA2TUNE_TIMEOUT=60 LAUNCH_GRACE=20
# the emulated build is an ASan build: its leaks are checked, except MPI's own, which the build
# suppresses itself (dev/emu/mpi_leaks.h); so under mpirun it runs as a user's would, with no
# ASAN_OPTIONS or LSAN_OPTIONS, and must exit 0
plain=(env -u ASAN_OPTIONS -u LSAN_OPTIONS)
SELF_TOL=1e-5
CPU_TOL=1e-4
WEIGHT_TOL=2e-4
TIMEOUT=600 # seconds for one run: a hang fails
LORA=(--model test/fixtures/tiny_gqa --lora_dropout 0.1 --lora_target_modules all-linear)
FULL=(--model test/fixtures/tiny_tied --full_finetune --chunk_size 7)
COMMON=(--data test/fixtures/data.jsonl --max_seq_len 24 --max_steps 4 --lr 5e-3 --warmup_steps 1 --weight_decay 0.01
        --threads 1 --precision fp32)
emu() { # emu LAUNCH OUT [args]: $EMU_BIN under LAUNCH (none, env W, mpi W), output in OUT, metrics OUT.jsonl, log OUT.log
    local launch=(timeout $TIMEOUT) how=$1 out=$2
    shift 2
    case $how in
    env*) launch+=(dev/launch.sh "${how#env }") ;;
    mpi*) launch+=("${plain[@]}" mpirun -np "${how#mpi }") ;;
    esac
    "${launch[@]}" "$EMU_BIN" "${COMMON[@]}" --output_dir "$out" --metrics_file "$out.jsonl" "$@" >"$out.log" 2>&1
}
# close NAME OUT REF TOL [WEIGHTS]: OUT's losses and norms within TOL of REF's (and its weights, when named,
# within WEIGHT_TOL of their scale; WEIGHT_FLIPS="N ABS": but N elements, each within ABS: st_compare)
close() {
    local t w="" rc=0
    t=$(trajectory_diff "$2.jsonl" "$3.jsonl")
    if [ $# -ge 5 ]; then w=$("$compare" "$2/$5" "$3/$5" $WEIGHT_TOL ${WEIGHT_FLIPS:-} 2>&1) || rc=1; fi
    awk -v t="$t" -v tol="$4" 'BEGIN { exit !(t <= tol) }' && [ $rc -eq 0 ]
    check "$1 (trajectory within $t, tolerance $4${w:+; $w})" $? "$(tail -3 "$2.log")"
}
same_bits() { # same_bits NAME OUT REF WEIGHTS
    local t
    t=$(trajectory_diff "$2.jsonl" "$3.jsonl")
    [ "$t" = 0 ] && cmp -s "$2/$4" "$3/$4"
    check "$1 (largest trajectory difference $t)" $? "$(tail -3 "$2.log")"
}

# the references: one process of the emulated binary, and the CPU trainer, 6 rows a step
for mode in lora full; do
    [ $mode = lora ] && args=("${LORA[@]}") || args=("${FULL[@]}")
    emu none "$TMP/$mode-1" "${args[@]}" --batch_size 6
    check "$mode: one process of the emulated build" $? "$(tail -3 "$TMP/$mode-1.log")"
    "$BIN" "${COMMON[@]}" "${args[@]}" --batch_size 6 --output_dir "$TMP/$mode-cpu" --metrics_file "$TMP/$mode-cpu.jsonl" \
        >"$TMP/$mode-cpu.log" 2>&1
    check "$mode: the CPU trainer" $? "$(tail -3 "$TMP/$mode-cpu.log")"
    close "$mode: one emulated process == the CPU trainer" "$TMP/$mode-1" "$TMP/$mode-cpu" $CPU_TOL
done

# resume: the optimizer state lives on the device alone, and a checkpoint streams it through a
# staging buffer both ways (1000 bytes here: 250 floats, so every state tensor crosses many
# pieces, one of them short). Full fine-tuning killed after step 3 and resumed from checkpoint 2
# == uninterrupted, bit for bit (the final checkpoint's weights and optimizer state): one process
# (optimizer.safetensors: AdamW's moments, and AdamW8bit's codes, absmax and fp32 moments) and
# W = 2 FULL_SHARD (each rank's shards of the weights and AdamW's moments); and --pure_bf16 with
# AnyPrecisionAdamW and Kahan summation at W = 1 and 2 (the bf16 weights, moments and compensation)
for c in "1 adamw" "2 adamw" "1 adamw8bit" "1 anyprecision" "2 anyprecision"; do
    set -- $c
    w=$1 tag="$1-$2" how=none files="model.safetensors optimizer.safetensors"
    [ $w = 2 ] && how="env 2" files="fsdp-00000-of-00002.safetensors fsdp-00001-of-00002.safetensors"
    args=("${FULL[@]}" --batch_size $((6 / w)) --sharding_strategy FULL_SHARD --collectives host --optimizer $2 --save_every 2)
    [ $2 = anyprecision ] && args+=(--pure_bf16 1 --kahan_summation 1 --precision bf16 --gradient_accumulation_steps 2)
    LLAMA2TUNE_STAGING_BYTES=1000 emu "$how" "$TMP/ckpt-$tag" "${args[@]}"
    LLAMA2TUNE_STAGING_BYTES=1000 LLAMA2TUNE_FAULT=step:3 emu "$how" "$TMP/killed-$tag" "${args[@]}"
    LLAMA2TUNE_STAGING_BYTES=1000 emu "$how" "$TMP/killed-$tag" "${args[@]}" --resume "$TMP/killed-$tag"
    rc=$?
    for f in $files; do cmp -s "$TMP/ckpt-$tag/checkpoint-4/$f" "$TMP/killed-$tag/checkpoint-4/$f" || rc=1; done
    grep -q "resumed from $TMP/killed-$tag/checkpoint-2 at step 2" "$TMP/killed-$tag.log" || rc=1
    check "full fine-tuning, $2, W = $w: killed after step 3, resumed from checkpoint 2 == uninterrupted, bit for bit ($files)" $rc \
        "$(tail -3 "$TMP/killed-$tag.log")"
done
# Sharded full fine-tuning streams each rank's shards between the files and the GPU: loaded a piece at
# a time (model_stream_base; a sharded checkpoint's through fsdp_load's put), saved a staging buffer at
# a time from the GPU (shards_get; the final model and --export_gguf by rank 0 as the ranks send it
# each piece, shard_gather_get), never held in host memory. With SGD at lr 0 (no state, and the
# weights as loaded: a zero update leaves them) a checkpoint's shard files and index, the final
# model.safetensors and the GGUF file == the CPU trainer's, byte for byte (it reads its shards into
# host memory, fsdp_load_model, saves them from there, and gathers the whole model into rank 0 for the
# final files): W = 2 FULL_SHARD, 3 SHARD_GRAD_OP and 4 HYBRID_SHARD (2 x 2), each also killed after
# step 2 and resumed from checkpoint 1 (its shards put back through fsdp_load) == uninterrupted, byte for byte
for c in "2 FULL_SHARD 2" "3 SHARD_GRAD_OP 3" "4 HYBRID_SHARD 2"; do
    set -- $c
    tag="lr0-$1-$2" files="fsdp_index.json"
    for ((k = 0; k < $3; k++)); do files+=" $(printf 'fsdp-%05d-of-%05d.safetensors' $k $3)"; done
    args=("${FULL[@]}" --batch_size 1 --max_steps 2 --save_every 1 --optimizer sgd --lr 0 --sharding_strategy $2)
    [ $2 = HYBRID_SHARD ] && args+=(--shard_group 2)
    emu "env $1" "$TMP/$tag" "${args[@]}" --collectives host --export_gguf "$TMP/$tag.gguf"
    timeout $TIMEOUT dev/launch.sh $1 "$BIN" "${COMMON[@]}" "${args[@]}" --output_dir "$TMP/$tag-cpu" \
        --metrics_file "$TMP/$tag-cpu.jsonl" --export_gguf "$TMP/$tag-cpu.gguf" >"$TMP/$tag-cpu.log" 2>&1
    rc=$?
    for f in $files; do cmp "$TMP/$tag/checkpoint-2/$f" "$TMP/$tag-cpu/checkpoint-2/$f" >>"$TMP/$tag.log" 2>&1 || rc=1; done
    check "sharded full fine-tuning, W = $1 $2, SGD at lr 0: the checkpoint == the CPU trainer's, byte for byte ($files)" $rc \
        "$(tail -3 "$TMP/$tag.log")"
    cmp "$TMP/$tag/model.safetensors" "$TMP/$tag-cpu/model.safetensors" >>"$TMP/$tag.log" 2>&1 &&
        cmp "$TMP/$tag.gguf" "$TMP/$tag-cpu.gguf" >>"$TMP/$tag.log" 2>&1
    check "sharded full fine-tuning, W = $1 $2, SGD at lr 0: the final model and --export_gguf == the CPU trainer's, byte for byte" $? \
        "$(tail -3 "$TMP/$tag.log")"
    LLAMA2TUNE_FAULT=step:2 emu "env $1" "$TMP/$tag-killed" "${args[@]}" --collectives host
    emu "env $1" "$TMP/$tag-killed" "${args[@]}" --collectives host --resume "$TMP/$tag-killed"
    rc=$?
    for f in $files; do cmp -s "$TMP/$tag/checkpoint-2/$f" "$TMP/$tag-killed/checkpoint-2/$f" || rc=1; done
    grep -q "resumed from $TMP/$tag-killed/checkpoint-1 at step 1" "$TMP/$tag-killed.log" || rc=1
    check "sharded full fine-tuning, W = $1 $2, SGD at lr 0: killed after step 2, resumed from checkpoint 1 == uninterrupted, byte for byte" $rc \
        "$(tail -3 "$TMP/$tag-killed.log")"
done
# at lr 5e-3 (AdamW; the shards move): W = 3 SHARD_GRAD_OP killed after step 3, resumed from its checkpoint 2
# == uninterrupted, bit for bit (W = 2 FULL_SHARD: above); one process's checkpoint 2 (model.safetensors, the
# whole model read a rank's shard at a time, a piece at a time) resumed at W = 2 FULL_SHARD, and --pure_bf16
# with --freeze_layers 1 at W = 2 (the frozen units' shards in the bf16 weights, saved from there) == one
# process, at the tolerances above
S3=("${FULL[@]}" --batch_size 2 --sharding_strategy SHARD_GRAD_OP --collectives host --save_every 2)
emu "env 3" "$TMP/sgo-3" "${S3[@]}"
LLAMA2TUNE_FAULT=step:3 emu "env 3" "$TMP/sgo-3-killed" "${S3[@]}"
emu "env 3" "$TMP/sgo-3-killed" "${S3[@]}" --resume "$TMP/sgo-3-killed"
rc=$?
for f in fsdp-0000{0,1,2}-of-00003.safetensors; do cmp -s "$TMP/sgo-3/checkpoint-4/$f" "$TMP/sgo-3-killed/checkpoint-4/$f" || rc=1; done
check "full fine-tuning, W = 3 SHARD_GRAD_OP: killed after step 3, resumed from checkpoint 2 == uninterrupted, bit for bit" $rc \
    "$(tail -3 "$TMP/sgo-3-killed.log")"
emu none "$TMP/whole-1" "${FULL[@]}" --batch_size 6 --save_every 2
mkdir -p "$TMP/whole-2" && cp -r "$TMP/whole-1/checkpoint-2" "$TMP/whole-2/" && head -2 "$TMP/whole-1.jsonl" >"$TMP/whole-2.jsonl"
emu "env 2" "$TMP/whole-2" "${FULL[@]}" --batch_size 3 --sharding_strategy FULL_SHARD --collectives host --resume "$TMP/whole-2"
grep -q "resumed from $TMP/whole-2/checkpoint-2 at step 2" "$TMP/whole-2.log"
check "one process's checkpoint resumed at W = 2 FULL_SHARD" $? "$(tail -3 "$TMP/whole-2.log")"
close "one process's checkpoint resumed at W = 2 FULL_SHARD == one process uninterrupted" "$TMP/whole-2" "$TMP/whole-1" $SELF_TOL model.safetensors
PF=(--model test/fixtures/tiny_tied --full_finetune --pure_bf16 1 --optimizer anyprecision --precision bf16 --freeze_layers 1)
emu none "$TMP/pf-1" "${PF[@]}" --batch_size 6
emu "env 2" "$TMP/pf-2" "${PF[@]}" --batch_size 3 --sharding_strategy FULL_SHARD --collectives host
WEIGHT_TOL=1e-2 close "pure bf16, --freeze_layers 1, W = 2 FULL_SHARD == one process" "$TMP/pf-2" "$TMP/pf-1" 5e-3 model.safetensors

# AdamW8bit (fp32): the emulated build's trajectory == the CPU trainer's (the tolerance above: the
# kernels == the CPU twin bit for bit from equal inputs, dev/cuda/adamw8bit.cu; the products' orders
# differ), and LoRA over W = 2 FULL_SHARD == one process
emu none "$TMP/a8-full-1" "${FULL[@]}" --batch_size 6 --optimizer adamw8bit
"$BIN" "${COMMON[@]}" "${FULL[@]}" --batch_size 6 --optimizer adamw8bit --output_dir "$TMP/a8-full-cpu" \
    --metrics_file "$TMP/a8-full-cpu.jsonl" >"$TMP/a8-full-cpu.log" 2>&1
close "AdamW8bit, full fine-tuning: one emulated process == the CPU trainer" "$TMP/a8-full-1" "$TMP/a8-full-cpu" $CPU_TOL
# with --freeze_layers 1 (the trainable tensors then lie in runs, one per tensor type)
emu none "$TMP/a8-freeze-1" "${FULL[@]}" --batch_size 6 --optimizer adamw8bit --freeze_layers 1
"$BIN" "${COMMON[@]}" "${FULL[@]}" --batch_size 6 --optimizer adamw8bit --freeze_layers 1 --output_dir "$TMP/a8-freeze-cpu" \
    --metrics_file "$TMP/a8-freeze-cpu.jsonl" >"$TMP/a8-freeze-cpu.log" 2>&1
close "AdamW8bit, --freeze_layers 1: one emulated process == the CPU trainer" "$TMP/a8-freeze-1" "$TMP/a8-freeze-cpu" $CPU_TOL
emu none "$TMP/a8-lora-1" "${LORA[@]}" --batch_size 6 --optimizer adamw8bit --lora_r 64
emu "env 2" "$TMP/a8-lora-2" "${LORA[@]}" --batch_size 3 --optimizer adamw8bit --lora_r 64 --sharding_strategy FULL_SHARD --collectives host
# (the weights within 2e-3 of their scale, test_llama2.c's AdamW8bit tolerance: the ranks' sums round
# the gradients otherwise, and a moment near the midpoint of two codes may take the other; measured
# 2.9e-4 on an AVX2 host; on an AVX-512 one (2026-12-07) three such flips, one 9.1e-3 of a lora_B's
# scale, which starts at 0: 9.2e-5 apart. So up to 8 elements of the file's 118,784 may lie beyond it, each
# within 5e-4, a tenth of the peak lr; a sum gone wrong moves every element of a tensor, and the steps)
WEIGHT_FLIPS="8 5e-4" WEIGHT_TOL=2e-3 close "AdamW8bit, LoRA r = 64 (8-bit A), W = 2 FULL_SHARD == one process" "$TMP/a8-lora-2" "$TMP/a8-lora-1" $SELF_TOL \
    adapter_model.safetensors

# AdamW8bit with sharded full fine-tuning, on a model whose 8-bit tensors start at multiples of
# 256 in their units (test_sharded.sh's, made by the CPU trainer): W = 2 FULL_SHARD == one emulated
# process and == the CPU trainer at W = 2 (the trajectories within the tolerances above, the weights
# within 1e-2 of their scale: test_sharded.sh says why 8-bit moments need more), and killed after
# step 3 and resumed == uninterrupted, bit for bit (each rank's shards of the codes and absmax)
aligned_model "$TMP/a8-base"
A8S=(--model "$TMP/a8-base" --full_finetune --chunk_size 7 --optimizer adamw8bit --save_every 2)
A8S2=("${A8S[@]}" --batch_size 3 --sharding_strategy FULL_SHARD --collectives host)
emu none "$TMP/a8s-1" "${A8S[@]}" --batch_size 6
LLAMA2TUNE_STAGING_BYTES=1000 emu "env 2" "$TMP/a8s-2" "${A8S2[@]}"
WEIGHT_TOL=1e-2 close "AdamW8bit, sharded full fine-tuning, W = 2 FULL_SHARD == one process" "$TMP/a8s-2" "$TMP/a8s-1" $SELF_TOL model.safetensors
timeout $TIMEOUT dev/launch.sh 2 "$BIN" "${COMMON[@]}" "${A8S[@]}" --batch_size 3 --sharding_strategy FULL_SHARD \
    --output_dir "$TMP/a8s-cpu" --metrics_file "$TMP/a8s-cpu.jsonl" >"$TMP/a8s-cpu.log" 2>&1
WEIGHT_TOL=1e-2 close "AdamW8bit, sharded full fine-tuning, W = 2: emulated == the CPU trainer" "$TMP/a8s-2" "$TMP/a8s-cpu" $CPU_TOL model.safetensors
LLAMA2TUNE_STAGING_BYTES=1000 LLAMA2TUNE_FAULT=step:3 emu "env 2" "$TMP/a8s-killed" "${A8S2[@]}"
LLAMA2TUNE_STAGING_BYTES=1000 emu "env 2" "$TMP/a8s-killed" "${A8S2[@]}" --resume "$TMP/a8s-killed"
rc=$?
for f in fsdp-00000-of-00002.safetensors fsdp-00001-of-00002.safetensors; do
    cmp -s "$TMP/a8s-2/checkpoint-4/$f" "$TMP/a8s-killed/checkpoint-4/$f" || rc=1
done
check "AdamW8bit, sharded full fine-tuning, W = 2: killed after step 3, resumed from checkpoint 2 == uninterrupted, bit for bit (both shards)" \
    $rc "$(tail -3 "$TMP/a8s-killed.log")"

# --pure_bf16 1 --optimizer anyprecision --kahan_summation 1 (in --precision bf16, the one it runs in) on
# the tied model, 2 micro-batches a step: whole sequences (each unit's fp32 gradient rounded into the
# step's bf16 one as its backward ends) and in chunks of 7 (the micro-batch's fp32 sum over its chunks
# rounded at its end). One process == the CPU trainer within PURE_CPU_TOL, test_llama2cu's bf16 step
# tolerance for losses (the GPU computes in bf16, the CPU in fp32 from the same bf16 weights; the norms,
# which test_llama2cu allows 1e-1, stay within it here). W = 2 FULL_SHARD (each rank's part rounded to
# bf16 before the reduce-scatter) and NO_SHARD (the replicas' bf16 gradients summed in fp32, rounded
# once) == one process within test_sharded.sh's pure bf16 tolerances, 5e-3 and the weights 1e-2 of their
# scale: W ranks round the gradient once more than one process (a bf16 ulp, 2^-8 relative, where an
# update falls near a weight's rounding boundary). (Killed and resumed: with AdamW's, above.)
PURE=(--model test/fixtures/tiny_tied --full_finetune --pure_bf16 1 --optimizer anyprecision --kahan_summation 1
      --precision bf16 --gradient_accumulation_steps 2)
PURE_CPU_TOL=1e-2 PURE_TOL=5e-3
for chunk in 0 7; do
    tag=pure-c$chunk
    emu none "$TMP/$tag-1" "${PURE[@]}" --chunk_size $chunk --batch_size 6 --save_every 2
    check "pure bf16, chunks of $chunk (0: whole): one process of the emulated build" $? "$(tail -3 "$TMP/$tag-1.log")"
    "$BIN" "${COMMON[@]}" "${PURE[@]}" --precision fp32 --chunk_size $chunk --batch_size 6 --save_every 2 --output_dir "$TMP/$tag-cpu" \
        --metrics_file "$TMP/$tag-cpu.jsonl" >"$TMP/$tag-cpu.log" 2>&1
    close "pure bf16, chunks of $chunk: one emulated process == the CPU trainer" "$TMP/$tag-1" "$TMP/$tag-cpu" $PURE_CPU_TOL
    for s in FULL_SHARD NO_SHARD; do
        emu "env 2" "$TMP/$tag-2-$s" "${PURE[@]}" --chunk_size $chunk --batch_size 3 --sharding_strategy $s --collectives host
        WEIGHT_TOL=1e-2 close "pure bf16, chunks of $chunk, W = 2 $s == one process" "$TMP/$tag-2-$s" "$TMP/$tag-1" $PURE_TOL model.safetensors
    done
done
# W = 4 HYBRID_SHARD in groups of 2 (sharded within a group, each shard's bf16 gradients summed over
# the two replicas), whole; a micro-batch of 3 rows a rank and no accumulation: the same 12 rows a step
emu "env 4" "$TMP/pure-c0-4-HYBRID_SHARD" "${PURE[@]}" --batch_size 3 --gradient_accumulation_steps 1 \
    --sharding_strategy HYBRID_SHARD --shard_group 2 --collectives host
WEIGHT_TOL=1e-2 close "pure bf16, whole, W = 4 HYBRID_SHARD (2 x 2) == one process" "$TMP/pure-c0-4-HYBRID_SHARD" "$TMP/pure-c0-1" $PURE_TOL model.safetensors
# either trainer resumes the other's checkpoint (the weights F32 holding bf16 values, the state BF16):
# the CPU trainer's checkpoint 2 continued by the emulated build == the CPU trainer's run, and the
# emulated build's continued by the CPU trainer == the emulated run, within PURE_CPU_TOL (steps 3-4)
for from in cpu 1; do
    out="$TMP/pure-from-$from"
    mkdir -p "$out" && cp -r "$TMP/pure-c0-$from/checkpoint-2" "$out/" && head -2 "$TMP/pure-c0-$from.jsonl" >"$out.jsonl"
    if [ $from = cpu ]; then emu none "$out" "${PURE[@]}" --batch_size 6 --resume "$out"
    else "$BIN" "${COMMON[@]}" "${PURE[@]}" --precision fp32 --batch_size 6 --resume "$out" --output_dir "$out" \
        --metrics_file "$out.jsonl" >"$out.log" 2>&1; fi
    grep -q "resumed from $out/checkpoint-2 at step 2" "$out.log"
    check "pure bf16: $([ $from = cpu ] && echo "the CPU trainer's checkpoint resumed by the emulated build" ||
        echo "the emulated build's checkpoint resumed by the CPU trainer")" $? "$(tail -3 "$out.log")"
    close "pure bf16: that run's steps 3-4 == the uninterrupted one's" "$out" "$TMP/pure-c0-$from" $PURE_CPU_TOL
done

# mpirun: where it is installed and $EMU_BIN was built with MPI (a build without it says so and stops)
launchers=(env)
if command -v mpirun >/dev/null; then
    timeout 120 "${plain[@]}" mpirun -np 2 "$EMU_BIN" "${COMMON[@]}" "${LORA[@]}" --dry_run --output_dir "$TMP/probe" >"$TMP/probe.log" 2>&1
    if grep -q "^2 ranks" "$TMP/probe.log"; then launchers+=(mpi)
    else echo "SKIP the emulated build under mpirun: $EMU_BIN is not an MPI build ($(grep -m1 error "$TMP/probe.log"))"; fi
else
    echo "SKIP the emulated build under mpirun: no mpirun (install OpenMPI: libopenmpi-dev openmpi-bin)"
fi

for how in "${launchers[@]}"; do
    for w in 2 3; do
        for s in FULL_SHARD SHARD_GRAD_OP NO_SHARD HYBRID_SHARD; do
            # under mpirun, two of them (what MPI adds is the transport, which TCP == MPI checks)
            [ $how = mpi ] && [ "$w $s" != "2 FULL_SHARD" ] && [ "$w $s" != "3 HYBRID_SHARD" ] && continue
            for mode in lora full; do
                [ $mode = lora ] && args=("${LORA[@]}") weights=adapter_model.safetensors || args=("${FULL[@]}") weights=model.safetensors
                out="$TMP/$mode-$how-$w-$s"
                emu "$how $w" "$out" "${args[@]}" --batch_size $((6 / w)) --sharding_strategy $s --collectives host
                rc=$? plain_note=""
                # (under mpirun: exit 0 with the sanitizer options unset, MPI's leaks and all)
                [ $how = mpi ] && plain_note=", exit 0 with no ASAN_OPTIONS or LSAN_OPTIONS"
                check "$mode, W = $w ($how), $s, --collectives host: runs$plain_note" $rc \
                    "$(grep -m1 "SUMMARY: AddressSanitizer" "$out.log"; tail -3 "$out.log")"
                close "$mode, W = $w ($how), $s == one process" "$out" "$TMP/$mode-1" $SELF_TOL $weights
                close "$mode, W = $w ($how), $s == the CPU trainer" "$out" "$TMP/$mode-cpu" $CPU_TOL
                [ $how = mpi ] && same_bits "$mode, W = $w, $s: MPI and TCP give the same bits" "$out" "$TMP/$mode-env-$w-$s" $weights
            done
        done
    done
done

# QLoRA: each decoder layer's 4-bit run sharded as bytes and gathered (fsdp_all_gather_u8 through the
# staged backend) into a slot before it is dequantized on the device: W = 2 FULL_SHARD, 3 HYBRID_SHARD,
# 2 SHARD_GRAD_OP (every run kept gathered) and 3 NO_SHARD (each rank whole). DoRA: its magnitudes
# all-reduced like A and B, its row norms read from the gathered weights: W = 2 FULL_SHARD and 3
# HYBRID_SHARD. prefix: its keys and values replicated, each rank's rows' dK, dV summed into their
# gradient, then all-reduced like A and B: W = 2 FULL_SHARD in chunks of 7 and 3 HYBRID_SHARD. Each ==
# one process and == the CPU trainer, with the tolerances above (LoRA's products)
for kind in qlora dora prefix; do
    args=("${LORA[@]}" --quantize nf4) cases=("2 FULL_SHARD" "3 HYBRID_SHARD" "2 SHARD_GRAD_OP" "3 NO_SHARD")
    [ $kind = dora ] && args=("${LORA[@]}" --use_dora) cases=("2 FULL_SHARD" "3 HYBRID_SHARD")
    [ $kind = prefix ] && args=(--model test/fixtures/tiny_gqa --peft_method prefix --num_virtual_tokens 4 --chunk_size 7) \
        cases=("2 FULL_SHARD" "3 HYBRID_SHARD")
    emu none "$TMP/$kind-1" "${args[@]}" --batch_size 6
    "$BIN" "${COMMON[@]}" "${args[@]}" --batch_size 6 --output_dir "$TMP/$kind-cpu" --metrics_file "$TMP/$kind-cpu.jsonl" >"$TMP/$kind-cpu.log" 2>&1
    close "$kind: one emulated process == the CPU trainer" "$TMP/$kind-1" "$TMP/$kind-cpu" $CPU_TOL
    for c in "${cases[@]}"; do
        set -- $c
        out="$TMP/$kind-env-$1-$2"
        emu "env $1" "$out" "${args[@]}" --batch_size $((6 / $1)) --sharding_strategy $2 --collectives host
        close "$kind, W = $1, $2, --collectives host == one process" "$out" "$TMP/$kind-1" $SELF_TOL adapter_model.safetensors
        close "$kind, W = $1, $2 == the CPU trainer" "$out" "$TMP/$kind-cpu" $CPU_TOL
    done
done

# --trainable_params embed,norm on the tied model (its embedding is the head too), LoRA with dropout:
# the trained copies are seeded from the base as it streams to the device, replicated like the adapter
# and their gradients all-reduced with its, so one process == the CPU trainer (the saved adapter, its
# modules_to_save included, and the merged model, the base streamed again with the trained copies
# written into it, within WEIGHT_TOL), W = 2 and 3 NO_SHARD == one process (the adapter too) and the
# CPU trainer; killed after step 3 and resumed from checkpoint 2 == uninterrupted, bit for bit (the
# adapter and its optimizer state); a shard group of more than one rank refused, as the CPU trainer
# refuses it
TP=("${LORA[@]/tiny_gqa/tiny_tied}" --trainable_params embed,norm --save_every 2)
emu none "$TMP/tp-1" "${TP[@]}" --batch_size 6 --merge_adapter
check "--trainable_params embed,norm: one process of the emulated build" $? "$(tail -3 "$TMP/tp-1.log")"
"$BIN" "${COMMON[@]}" "${TP[@]}" --batch_size 6 --merge_adapter --output_dir "$TMP/tp-cpu" --metrics_file "$TMP/tp-cpu.jsonl" \
    >"$TMP/tp-cpu.log" 2>&1
close "--trainable_params embed,norm: one emulated process == the CPU trainer (adapter_model.safetensors)" "$TMP/tp-1" "$TMP/tp-cpu" \
    $CPU_TOL adapter_model.safetensors
close "--trainable_params embed,norm: the merged model == the CPU trainer's" "$TMP/tp-1" "$TMP/tp-cpu" $CPU_TOL merged/model.safetensors
for w in 2 3; do
    emu "env $w" "$TMP/tp-$w" "${TP[@]}" --batch_size $((6 / w)) --sharding_strategy NO_SHARD --collectives host
    close "--trainable_params embed,norm, W = $w, NO_SHARD == one process" "$TMP/tp-$w" "$TMP/tp-1" $SELF_TOL adapter_model.safetensors
    close "--trainable_params embed,norm, W = $w, NO_SHARD == the CPU trainer" "$TMP/tp-$w" "$TMP/tp-cpu" $CPU_TOL
done
LLAMA2TUNE_FAULT=step:3 emu none "$TMP/tp-killed" "${TP[@]}" --batch_size 6
emu none "$TMP/tp-killed" "${TP[@]}" --batch_size 6 --resume "$TMP/tp-killed"
rc=$?
for f in adapter_model.safetensors optimizer.safetensors; do cmp -s "$TMP/tp-1/checkpoint-4/$f" "$TMP/tp-killed/checkpoint-4/$f" || rc=1; done
grep -q "resumed from $TMP/tp-killed/checkpoint-2 at step 2" "$TMP/tp-killed.log" || rc=1
check "--trainable_params embed,norm: killed after step 3, resumed from checkpoint 2 == uninterrupted, bit for bit" $rc \
    "$(tail -3 "$TMP/tp-killed.log")"
emu "env 2" "$TMP/tp-sharded" "${TP[@]}" --batch_size 3 --sharding_strategy FULL_SHARD --collectives host
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q -- "--trainable_params with sharded base weights is not supported yet" "$TMP/tp-sharded.log"
check "--trainable_params embed,norm, W = 2 FULL_SHARD: refused (a sharded base)" $? "status $rc; $(tail -3 "$TMP/tp-sharded.log")"

# the default on a device two ranks share: host, the same bits as asking for it
emu "env 2" "$TMP/auto" "${LORA[@]}" --batch_size 3 --sharding_strategy FULL_SHARD
same_bits "two ranks on the emulated device: the default (auto) is host" "$TMP/auto" "$TMP/lora-env-2-FULL_SHARD" adapter_model.safetensors
# --collectives nccl there: refused before any NCCL call, pointing to host
emu "env 2" "$TMP/nccl" "${LORA[@]}" --batch_size 3 --collectives nccl
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q -- "--collectives nccl: .*--collectives host" "$TMP/nccl.log" &&
    ! grep -q "emu: NCCL" "$TMP/nccl.log"
check "two ranks on the emulated device: --collectives nccl is refused before any NCCL call" $? "status $rc; $(tail -3 "$TMP/nccl.log")"
exit $((fails > 0))
