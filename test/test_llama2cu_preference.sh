#!/usr/bin/env bash
# Preference tuning (--objective dpo and orpo, docs/preference.md) in the CUDA trainer, run by the
# emulated build ($EMU_BIN, default ./train_llama2cu_emu; without it this says SKIP; on a GPU
# machine EMU_BIN=./train_llama2cu runs the real one, as dev/gpu_check.sh does), against the CPU
# trainer (train_llama2, $BIN), which test_llama2's preference part checks against the float64
# reference (dev/reference/make_dpo_fixtures.py). 3 steps of 2 micro-batches of 2 pairs on
# test/fixtures/preference/data.jsonl: each step's loss, gradient norm and metrics (TRL's names in
# the metrics file) and the trained weights.
#   - fp32: DPO sigmoid, ipo and hinge with LoRA from the fixtures' starting adapter (its B is not
#     zero: the reference is not the base), DPO full fine-tuning, ORPO with LoRA; DPO in chunks of
#     7 with recompute, activation checkpointing and 3 output pieces (LoRA and full);
#   - 2 ranks (dev/launch.sh 2, --collectives host) FULL_SHARD == one process of the same binary,
#     LoRA and full fine-tuning;
#   - bf16: LoRA in --precision bf16, full fine-tuning with --pure_bf16 (AnyPrecisionAdamW);
#   - --context_parallel 2 (--collectives host) == one process: DPO LoRA (ORPO, DPO in chunks);
#   - DPO resumed from step 2 == uninterrupted, bit for bit: the checkpoint's reference weights
#     (LoRA fp32 and bf16, full fine-tuning fp32), each == the CPU trainer's file byte for byte;
#     the precomputed log-probabilities (LoRA, full); sharded full fine-tuning's resume refused;
#   - the full suite (without --quick) adds every adapter (DoRA, IA3, prefix, llama_adapter, QLoRA,
#     --trainable_params), --freeze_layers, AdamW8bit, --cpu_offload, ORPO full fine-tuning and in
#     chunks, the other sharding strategies (SHARD_GRAD_OP, NO_SHARD; HYBRID_SHARD over 4 ranks),
#     ORPO and DPO in chunks with context parallelism, the resumes with precompute and of full
#     fine-tuning, the sharded refusal.
#   - --shared_prompt on (a pair's prompt run once) == off (two rows) to rounding, and == the CPU
#     trainer's on: LoRA whole, in kept chunks of 7, in CHUNKED's; full fine-tuning, ORPO (LoRA and, in
#     chunks, full), 2 ranks (LoRA); the run says it ran fewer positions;
# --quick (make test): DPO sigmoid LoRA and full, ORPO, chunked LoRA, 2 ranks LoRA, bf16 LoRA,
# context parallel DPO, LoRA fp32 and bf16 resumed without precompute; the prompt once in kept
# chunks (LoRA) and ORPO.
#
# Tolerances, each the worst relative difference over the 3 steps (metrics: a reward against
# beta |logps| of its line, a reward being a difference of two log-probabilities; accuracies
# against 1; the log-odds against |logps/chosen| + |logps/rejected|, a difference of two terms of
# that size; the weights against each tensor's largest element, st_compare):
# - fp32 against the CPU: 1e-4 for the loss, the metrics and the gradient norms (test_llama2cu's and
#   test_llama2cu_sharded.sh's fp32 step tolerance: the GPU's summation orders against the CPU's,
#   about 1e-7 an operation), the weights 2e-4 (test_sharded.sh's: AdamW's m / sqrt(v) turns a
#   rounding-sized difference in a near-zero gradient into a step-sized one). Emulated, the worst:
#   metrics 2.6e-7, norms 2.1e-6, weights 8.9e-5 (full fine-tuning), 4.2e-5 (LoRA).
# - W ranks against one process: 1e-5 (2e-4 the weights), test_llama2cu_sharded.sh's (the same
#   kernels over fewer rows; emulated: 1.2e-7, 7e-7, 5.3e-5). Context parallel 2 the same
#   (test_llama2cu_context.sh's: the attention over pieces and the backward's sums over the group
#   in another order; emulated: metrics 1.6e-7, norms 2.2e-7, weights 1.6e-6).
# - --shared_prompt on against off, the same binary: 1e-5 for the loss, the metrics and the norms, the
#   weights 2e-4 (as W ranks against one process: the same kernels, the prompt's dK, dV summed before
#   its backward instead of after; emulated, the worst: metrics 8.7e-8, norms 1.6e-7, weights 3.2e-5);
#   on against the CPU trainer's on: the fp32 tolerances above.
# - bf16 (and --pure_bf16, whose activations are bf16 too) against the fp32 CPU: test_llama2cu's
#   BF16_TOL for steps, 1e-2 for the loss and every metric (a log-probability is a sum of
#   cross-entropies, as a loss), 1e-1 for the gradient norms; accuracies left out (a pair whose
#   margin is within bf16's noise of 0 may flip). The weights 1e-2 of their scale but for at most
#   1000 elements within 4e-2 (st_compare's FLIPS ABS): 3 AdamW steps move an element by at most
#   about the sum of the learning rates, 2e-2, so where bf16 flips the sign of a near-zero gradient
#   the two sides may end that far apart in either direction. Emulated: metrics 6.9e-3 (step 3),
#   norms 4.3e-2; at most 365 elements (of the full model's) beyond 1e-2, 3.0e-2 apart.
set -u
cd "$(dirname "$0")/.."
SUITE="llama2cu preference"
source test/train_helpers.sh # BIN (the CPU trainer), TMP, FIX, check, need_emu
need_emu "train_llama2cu preference tuning"
compare="$(dirname "$BIN")/test/st_compare"
quick=0
[ "${1:-}" = --quick ] && quick=1
export OMP_NUM_THREADS=1 LLAMA2TUNE_TIMEOUT=60 LAUNCH_GRACE=20
ARGS=(--model $FIX/tiny_gqa --data $FIX/preference/data.jsonl --data_cache_dir "$TMP/cache" --max_seq_len 32 --lr 1e-2
      --shuffle 0 --threads 1 --batch_size 2 --gradient_accumulation_steps 2 --max_steps 3 --grad_clip 1)
LORA=(--from_peft_checkpoint $FIX/tiny_gqa/dpo/peft_init)
FULL=(--full_finetune --lr 3e-3)
CHUNKED=(--chunk_size 7 --chunk_memory recompute --activation_checkpointing --num_output_chunks 3)
BETA=0.1

# metrics_diff RUN REF SKIP: the worst relative difference of RUN's metrics from REF's, step by step, as
# "worst_loss worst_norm where" (loss: the loss and every metric but those matching SKIP; norm: grad_norm)
metrics_diff() {
    awk -v beta=$BETA -v skip="$3" '
        function abs(x) { return x < 0 ? -x : x }
        function parse(line, into,   n, i, kv, parts) {
            gsub(/[{}"]/, "", line); n = split(line, parts, ", ")
            for (i = 1; i <= n; i++) { split(parts[i], kv, ": "); into[kv[1]] = kv[2] }
        }
        FNR == NR { if (index($0, "\"loss\"")) { n_ref++; ref[n_ref] = $0 } next }
        index($0, "\"loss\"") { n_run++; delete a; delete b; parse($0, a); parse(ref[n_run], b)
            lp = abs(b["logps/chosen"]) > abs(b["logps/rejected"]) ? abs(b["logps/chosen"]) : abs(b["logps/rejected"])
            for (k in b) {
                if (k !~ /^(loss|grad_norm|rewards|logps|nll_loss|log_odds)/ || (skip != "" && k ~ skip)) continue
                if (!(k in a)) { worst = 1e9; at = k " missing"; continue }
                s = k ~ /^rewards\/accuracies/ ? 1 : k ~ /^rewards/ ? beta * lp : k ~ /^log_odds/ ? abs(b["logps/chosen"]) + abs(b["logps/rejected"]) : abs(b[k])
                e = abs(a[k] - b[k]) / (s > 0 ? s : 1)
                if (k == "grad_norm") { if (e > wn) wn = e } else if (e > worst) { worst = e; at = "step " n_run " " k }
            } }
        END { if (n_run == 0 || n_run != n_ref) { worst = 1e9; at = "steps: " n_run " of " n_ref }
              printf "%.3g %.3g %s\n", worst + 0, wn + 0, at }' "$2" "$1"
}
# within NAME RUN REF FILE LOSS_TOL NORM_TOL WEIGHT_TOL [SKIP]: RUN's metrics and weights (FILE) within
# the tolerances of REF's
within() {
    local d w loss norm where rc=0
    d=$(metrics_diff "$2.jsonl" "$3.jsonl" "${8:-}")
    # shellcheck disable=SC2086 # (the tolerance, and FLIPS ABS where given)
    w=$("$compare" "$2/$4" "$3/$4" $7 2>&1) || rc=1
    read -r loss norm where <<<"$d"
    awk -v l="$loss" -v n="$norm" -v lt="$5" -v nt="$6" 'BEGIN { exit !(l <= lt && n <= nt) }' || rc=1
    check "$1 (metrics within $loss of tol $5 [$where], norms $norm of tol $6; $w)" $rc "$(tail -3 "$2.log")"
}
n=0
emu() { # emu LAUNCH OUT [args]: $EMU_BIN (under dev/launch.sh W when LAUNCH is a number > 1)
    local how=$1 out=$2 launch=(timeout 600)
    shift 2
    [ "$how" -gt 1 ] && launch+=(dev/launch.sh "$how")
    "${launch[@]}" "$EMU_BIN" "${ARGS[@]}" --output_dir "$out" --metrics_file "$out.jsonl" "$@" >"$out.log" 2>&1
}
# versus NAME PRECISION FILE ARGS...: the CPU trainer and $EMU_BIN on ARGS (PRECISION fp32 or bf16: the
# emulated run's, and the tolerances), compared
versus() {
    local name=$1 class=$2 file=$3 gpu=(--precision fp32) tols=(1e-4 1e-4 2e-4) skip=""
    shift 3
    n=$((n + 1))
    [ "$class" = bf16 ] && gpu=(--precision bf16) tols=(1e-2 1e-1 "1e-2 1000 4e-2") skip=accuracies
    "$BIN" "${ARGS[@]}" --output_dir "$TMP/cpu$n" --metrics_file "$TMP/cpu$n.jsonl" "$@" >"$TMP/cpu$n.log" 2>&1
    check "$name: the CPU trainer" $? "$(tail -3 "$TMP/cpu$n.log")"
    emu 1 "$TMP/gpu$n" "$@" "${gpu[@]}"
    check "$name: the CUDA trainer" $? "$(tail -3 "$TMP/gpu$n.log")"
    within "$name: CUDA ($class) == CPU" "$TMP/gpu$n" "$TMP/cpu$n" "$file" "${tols[@]}" "$skip"
}
ADAPTER=adapter_model.safetensors MODEL=model.safetensors

versus "DPO sigmoid, LoRA" fp32 $ADAPTER --objective dpo "${LORA[@]}"
versus "DPO sigmoid, full fine-tuning" fp32 $MODEL --objective dpo "${FULL[@]}"
versus "ORPO, LoRA" fp32 $ADAPTER --objective orpo "${LORA[@]}"
versus "DPO sigmoid, LoRA in chunks (recompute, activation checkpointing, 3 output pieces)" fp32 $ADAPTER --objective dpo "${LORA[@]}" "${CHUNKED[@]}"
versus "DPO sigmoid, LoRA, bf16" bf16 $ADAPTER --objective dpo "${LORA[@]}"
if [ $quick = 0 ]; then
    for loss in ipo hinge; do versus "DPO $loss, LoRA" fp32 $ADAPTER --objective dpo --dpo_loss_type $loss "${LORA[@]}"; done
    versus "DPO sigmoid, full fine-tuning in chunks" fp32 $MODEL --objective dpo "${FULL[@]}" "${CHUNKED[@]}"
    versus "ORPO, full fine-tuning in chunks" fp32 $MODEL --objective orpo "${FULL[@]}" "${CHUNKED[@]}"
    versus "DPO sigmoid, full fine-tuning, --pure_bf16" bf16 $MODEL --objective dpo "${FULL[@]}" --pure_bf16 1 --optimizer anyprecision
    versus "DPO sigmoid, full fine-tuning, --freeze_layers 1" fp32 $MODEL --objective dpo "${FULL[@]}" --freeze_layers 1
    versus "DPO sigmoid, full fine-tuning, --cpu_offload" fp32 $MODEL --objective dpo "${FULL[@]}" --cpu_offload 1
    versus "DPO sigmoid, full fine-tuning, bf16 --cpu_offload" bf16 $MODEL --objective dpo "${FULL[@]}" --cpu_offload 1
    versus "DPO sigmoid, LoRA, AdamW8bit" fp32 $ADAPTER --objective dpo "${LORA[@]}" --optimizer adamw8bit
    for method in "--use_dora --lora_dropout 0" "--peft_method ia3" "--peft_method prefix --num_virtual_tokens 4" \
        "--peft_method llama_adapter --adapter_len 3 --adapter_layers 1" "--quantize nf4" "--trainable_params embed,norm"; do
        for class in fp32 bf16; do
            # shellcheck disable=SC2086 # (the method's options, split)
            versus "DPO sigmoid, $method" $class $ADAPTER --objective dpo $method
        done
    done
fi

# --shared_prompt on == off (two rows), and == the CPU trainer's on; fewer positions run
shared() { # shared NAME FILE LAUNCH ARGS...
    local name=$1 file=$2 how=$3 ran
    shift 3
    n=$((n + 1))
    emu "$how" "$TMP/on$n" "$@" --precision fp32 --shared_prompt on && emu "$how" "$TMP/off$n" "$@" --precision fp32 --shared_prompt off
    check "$name: the prompt once, and two rows" $? "$(tail -n 3 "$TMP/on$n.log" "$TMP/off$n.log")"
    ran=$(sed -n "s/^the pairs' rows ran \([0-9]*\) positions, \([0-9]*\) as two rows.*/\1 \2/p" "$TMP/on$n.log" | head -1)
    awk -v r="$ran" 'BEGIN { split(r, a, " "); exit !(a[1] > 0 && a[1] < a[2]) }'
    check "$name: the prompt once ran fewer positions ($ran)" $? "$(grep "rows ran" "$TMP/on$n.log")"
    within "$name: --shared_prompt on == off" "$TMP/on$n" "$TMP/off$n" "$file" 1e-5 1e-5 2e-4
    [ "$how" -gt 1 ] && return # (the CPU side: versus' runs, one process)
    "$BIN" "${ARGS[@]}" --output_dir "$TMP/cpuon$n" --metrics_file "$TMP/cpuon$n.jsonl" "$@" --shared_prompt on >"$TMP/cpuon$n.log" 2>&1
    check "$name: the CPU trainer, --shared_prompt on" $? "$(tail -3 "$TMP/cpuon$n.log")"
    within "$name: CUDA on == CPU on" "$TMP/on$n" "$TMP/cpuon$n" "$file" 1e-4 1e-4 2e-4
}
shared "shared prompt, DPO LoRA in kept chunks of 7" $ADAPTER 1 --objective dpo "${LORA[@]}" --chunk_size 7
shared "shared prompt, ORPO LoRA" $ADAPTER 1 --objective orpo "${LORA[@]}"
if [ $quick = 0 ]; then
    shared "shared prompt, DPO LoRA" $ADAPTER 1 --objective dpo "${LORA[@]}"
    shared "shared prompt, DPO LoRA in chunks (recompute, activation checkpointing, 3 output pieces)" $ADAPTER 1 --objective dpo "${LORA[@]}" "${CHUNKED[@]}"
    shared "shared prompt, DPO full fine-tuning" $MODEL 1 --objective dpo "${FULL[@]}"
    shared "shared prompt, ORPO full fine-tuning in chunks" $MODEL 1 --objective orpo "${FULL[@]}" "${CHUNKED[@]}"
    shared "shared prompt, DPO LoRA, 2 ranks" $ADAPTER 2 --objective dpo "${LORA[@]}" --batch_size 1 --collectives host
fi

# 2 ranks (each 1 pair a micro-batch) == one process (2 pairs), the same binary
strategies=(FULL_SHARD)
[ $quick = 0 ] && strategies+=(SHARD_GRAD_OP NO_SHARD)
for mode in lora full; do
    [ $mode = lora ] && extra=(--objective dpo "${LORA[@]}") file=$ADAPTER || extra=(--objective dpo "${FULL[@]}") file=$MODEL
    [ $mode = full ] && [ $quick = 1 ] && continue
    emu 1 "$TMP/one-$mode" "${extra[@]}" --precision fp32
    check "$mode: one process" $? "$(tail -3 "$TMP/one-$mode.log")"
    for s in "${strategies[@]}"; do
        emu 2 "$TMP/two-$mode-$s" "${extra[@]}" --precision fp32 --batch_size 1 --collectives host --sharding_strategy $s
        check "$mode: 2 ranks, $s" $? "$(tail -3 "$TMP/two-$mode-$s.log")"
        within "$mode: 2 ranks, $s == one process" "$TMP/two-$mode-$s" "$TMP/one-$mode" $file 1e-5 1e-5 2e-4
    done
done
if [ $quick = 0 ]; then # HYBRID_SHARD: 2 replicas of 2 shards, a pair a micro-batch on each rank, against 4 pairs
    emu 1 "$TMP/one-4" --objective dpo "${FULL[@]}" --precision fp32 --batch_size 4
    emu 4 "$TMP/four" --objective dpo "${FULL[@]}" --precision fp32 --batch_size 1 --collectives host --sharding_strategy HYBRID_SHARD
    check "full: 4 ranks, HYBRID_SHARD" $? "$(tail -3 "$TMP/four.log")"
    within "full: 4 ranks, HYBRID_SHARD == one process" "$TMP/four" "$TMP/one-4" $MODEL 1e-5 1e-5 2e-4
fi
# context parallelism: 2 ranks holding pieces of every row (--context_parallel 2, --collectives host) ==
# one process: each rank's targets weighted from the padded weights, their cross-entropies summed over
# the group (rows_end), so both ranks score every pair. DPO LoRA (and in the full suite ORPO, whose nll
# weighs every chosen target, and DPO in chunks of 7 with recompute: pieces of 7)
cp_cases=("dpo" "orpo" "dpo ${CHUNKED[*]}")
[ $quick = 1 ] && cp_cases=("dpo")
for i in "${!cp_cases[@]}"; do
    c=${cp_cases[$i]}
    read -r obj chunked <<<"$c"
    # shellcheck disable=SC2086 # (the chunk options, split)
    emu 1 "$TMP/cp1-$i" --objective $obj "${LORA[@]}" --precision fp32 $chunked &&
        emu 2 "$TMP/cp2-$i" --objective $obj "${LORA[@]}" --precision fp32 --context_parallel 2 --collectives host $chunked
    check "$c: context parallel 2 trains" $? "$(tail -n 3 "$TMP/cp1-$i.log" "$TMP/cp2-$i.log")"
    within "$c: context parallel 2 == one process" "$TMP/cp2-$i" "$TMP/cp1-$i" $ADAPTER 1e-5 1e-5 2e-4
done

# checkpoints: resumed from step 2 == uninterrupted, bit for bit (steps 3-4, every metric, and the
# weights). Without --precompute_ref_log_probs the checkpoint keeps the reference's weights, read from
# the device and written back (model_reference_get, _set) a staging buffer of 1000 bytes at a time
# (many pieces): LoRA in fp32 and bf16 (its fp32 parameters beside the bf16 copy the forward reads),
# full fine-tuning; each reference.safetensors is the CPU trainer's byte for byte (the starting
# weights in fp32, exactly, in both). With it the pairs' log-probabilities (LoRA, full).
ckpt=("lora fp32 0" "lora bf16 0" "full fp32 0" "lora fp32 1" "full fp32 1")
[ $quick = 1 ] && ckpt=("lora fp32 0" "lora bf16 0")
export LLAMA2TUNE_STAGING_BYTES=1000
for c in "${ckpt[@]}"; do
    read -r mode class pre <<<"$c"
    [ "$mode" = lora ] && extra=(--objective dpo "${LORA[@]}") file=$ADAPTER || extra=(--objective dpo "${FULL[@]}") file=$MODEL
    extra+=(--max_steps 4 --save_every 2 --precompute_ref_log_probs "$pre")
    out="$TMP/save-$mode-$class-$pre"
    emu 1 "$out" "${extra[@]}" --precision "$class" && emu 1 "$out-resumed" "${extra[@]}" --precision "$class" --resume "$out/checkpoint-2"
    check "$c: saves and resumes" $? "$(tail -n 3 "$out.log" "$out-resumed.log")"
    cmp -s "$out/$file" "$out-resumed/$file" && diff <(trajectory "$out-resumed.jsonl") <(trajectory "$out.jsonl" | grep -E '"step": [34],') >/dev/null
    check "DPO $mode $class, precompute $pre: resumed from step 2 == uninterrupted, bit for bit" $? \
        "$(diff <(trajectory "$out-resumed.jsonl") <(trajectory "$out.jsonl" | grep -E '"step": [34],') | head -4)"
    [ "$pre" = 1 ] && continue
    [ -e "$TMP/cpu-save-$mode" ] || "$BIN" "${ARGS[@]}" "${extra[@]}" --max_steps 2 --output_dir "$TMP/cpu-save-$mode" >"$TMP/cpu-save-$mode.log" 2>&1
    cmp "$out/checkpoint-2/reference.safetensors" "$TMP/cpu-save-$mode/checkpoint-2/reference.safetensors" >"$TMP/cmp.log" 2>&1
    check "DPO $mode $class: the checkpoint's reference == the CPU trainer's, byte for byte" $? "$(cat "$TMP/cmp.log"; tail -2 "$TMP/cpu-save-$mode.log")"
done
unset LLAMA2TUNE_STAGING_BYTES
if [ $quick = 0 ]; then # sharded full fine-tuning keeps its reference in shards, which a checkpoint does not save
    emu 2 "$TMP/sharded-save" --objective dpo "${FULL[@]}" --precision fp32 --batch_size 1 --collectives host --max_steps 2 --save_every 2 &&
        ! emu 2 "$TMP/sharded-resumed" --objective dpo "${FULL[@]}" --precision fp32 --batch_size 1 --collectives host --max_steps 4 \
            --resume "$TMP/sharded-save/checkpoint-2" &&
        grep -q "keeps its reference in shards, which a checkpoint does not save" "$TMP/sharded-resumed.log" && [ ! -e "$TMP/sharded-resumed/$MODEL" ]
    check "sharded full fine-tuning: a DPO resume without the precomputed reference is refused" $? "$(tail -2 "$TMP/sharded-resumed.log")"
fi
[ $fails -eq 0 ]
