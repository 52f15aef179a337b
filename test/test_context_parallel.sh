#!/usr/bin/env bash
# Context parallelism (--context_parallel P, docs/long_context.md): the ranks of a group
# hold different pieces of the same rows, keep their own positions' keys and values, gather
# every rank's per layer and reduce-scatter their gradients.
#   - the memory plan (--dry_run): each rank's KV and dKV carry at P = 1, 2, 4 is 1/P of one
#     process's plus one layer's gathered K, V, dK, dV, as computed here from the config.
# Rows of up to 329 tokens (110 to 179 words, generated here), 2 micro-batches
# of 2 rows a step. Launched by the environment (dev/launch.sh, TCP), against one process:
#   - LoRA (tiny_gqa: GQA, dropout 0.1 on every linear layer) and full fine-tuning
#     (tiny_tied: tied embeddings), P = 2 and 3, whole rows and with --chunk_size (keep and
#     recompute), with --activation_checkpointing, FULL_SHARD and NO_SHARD; DoRA (its norms
#     at each rank's first piece), llama_adapter, a sliding window (tiny_mistral), QLoRA,
#     --trainable_params embed,norm (NO_SHARD), --s2_attn (packed rows of 256, padded at
#     P = 3; against one process with --s2_attn, whose first loss is not causal's): the 10-step
#     trajectory (loss and gradient norm at every step), the tokens counted, the final weights;
#   - every gradient: one SGD step at lr 1000 without clipping (LoRA from an adapter whose
#     B is not zero, so that A has a gradient too), whose weights are then w - 1000 g, so
#     st_compare's error (the largest difference over the tensor's largest value) is the
#     gradient's error relative to its largest element wherever 1000 |g| outweighs |w|;
#   - data parallel x context parallel on 4 ranks (2 groups of 2): NO_SHARD, FULL_SHARD
#     (parameters sharded over all 4) and HYBRID_SHARD;
#   - a checkpoint saved by a P = 2 run resumes in one process and at P = 3, and one process's at
#     P = 2, each continuing the uninterrupted one-process trajectory (the context group changes
#     nothing in a checkpoint);
#   - evaluation (--val_data), context-parallel as well: the validation loss is one process's;
#   - sampling at P = 2 with one row (a carry of half a row): one process's greedy sample;
#   - under mpirun (when the trainer is built with MPI): the same bits as dev/launch.sh's run;
#   - refusals: a P that does not divide the world size, --peft_method prefix,
#     --pure_bf16.
#
# Tolerances (why): the forward is the same bits as one process (the attention of a piece
# against the gathered keys meets the same key tiles as whole-row attention, and the
# projections are row by row), so the first step's loss is bit-identical. The backward sums
# in another order: a weight's gradient is a sum over positions that each rank sums over
# its own pieces before the ranks' sums are added (in rank order), and dK, dV of a position
# is summed over the ranks for each group of pieces, then over the groups. That is fp32
# rounding, measured: gradients within 7.2e-7 of their largest element, trajectories within
# 2.4e-7 relative, final weights within 5.6e-5 (AdamW divides by sqrt(v),
# so an element with a near-zero gradient moves by about lr whatever its rounding). Bounds:
# GRAD_TOL 1e-5, TRAJ_TOL 1e-6 and WEIGHT_TOL 2e-4, test_sharded.sh's. A real error (a
# piece misplaced, a key not gathered, a gradient not reduced, a label counted twice) moves
# the loss by 1e-3 or more and the gradients by whole percents.
set -u
cd "$(dirname "$0")/.."
SUITE=context_parallel
source test/train_helpers.sh # BIN, TMP, check, trajectory_diff
compare="$(dirname "$BIN")/test/st_compare"
export OMP_NUM_THREADS=1 LAUNCH_GRACE=10
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
GRAD_TOL=1e-5
TRAJ_TOL=1e-6
WEIGHT_TOL=2e-4
# rows of 290 to 470 tokens: words drawn by a fixed linear congruential generator (the same file everywhere)
awk 'BEGIN { split("the cat sat on a mat while an old dog ran far away from the green hill and every student wrote long letters by the sea in 1987", w, " ")
             x = 7; for (i = 0; i < 12; i++) { printf "{\"text\": \""; x = (x * 1103 + 12345) % 65536; n = 110 + x % 70
             for (j = 0; j < n; j++) { x = (x * 1103 + 12345) % 65536; printf "%s%s", j ? " " : "", w[1 + x % 26] }; print "\"}" } }' >"$TMP/long.jsonl"
COMMON=(--data "$TMP/long.jsonl" --max_seq_len 512 --batch_size 2 --gradient_accumulation_steps 2 --max_steps 10 --lr 5e-3
        --warmup_steps 2 --weight_decay 0.01 --threads 1)
LORA=(--model $FIX/tiny_gqa --lora_dropout 0.1 --lora_target_modules all-linear)
FULL=(--model $FIX/tiny_tied --full_finetune)
TIMEOUT=120
run() { # run W OUT [args]: W ranks by dev/launch.sh (0: one process), output in OUT, metrics OUT.jsonl, log OUT.log
    local w=$1 out=$2; shift 2
    local launch=(timeout $TIMEOUT)
    [ "$w" -gt 0 ] && launch+=(dev/launch.sh "$w")
    "${launch[@]}" "$BIN" "${COMMON[@]}" --output_dir "$out" --metrics_file "$out.jsonl" "$@" >"$out.log" 2>&1
}
same_run() { # same_run NAME REF OUT WEIGHTS_FILE: trajectory and weights of OUT within tolerance of REF
    local t w rc
    t=$(trajectory_diff "$3.jsonl" "$2.jsonl")
    w=$("$compare" "$3/$4" "$2/$4" $WEIGHT_TOL 2>&1)
    rc=$?
    awk -v t="$t" -v tol=$TRAJ_TOL 'BEGIN { exit !(t <= tol) }' && [ $rc -eq 0 ]
    check "$1 (trajectory within $t of one process's, $w)" $? "$(tail -3 "$3.log")"
}
first_loss() { sed -n '1s/.*"loss": \([^,]*\),.*/\1/p' "$1"; }
tokens() { grep -o '"tokens": [0-9]*' "$1" | tr '\n' ' '; } # every step's (counted once per context group)

# The memory plan (--dry_run; --random_init: no weights): each rank's KV and dKV carry holds its own
# positions, 1/P of one process's, plus one layer's K, V, dK and dV at every position. Expected values
# from the config here: tiny_gqa with 8 layers, 2 rows of T = 4096 (a multiple of 2P: no padding),
# fp32: one process 4 L B T NKV hd floats, P ranks 4 L B (T / P) NKV hd + 4 B T NKV hd. The plan prints
# MiB to 0.1; the values are whole MiB, and the least a mistake moves, a layer's K at one rank's
# positions, is 0.25 MiB.
mkdir -p "$TMP/m8"
sed 's/"num_hidden_layers": [0-9]*/"num_hidden_layers": 8/' $FIX/tiny_gqa/config.json >"$TMP/m8/config.json"
cfg() { sed -n "s/.*\"$1\": \([0-9]*\).*/\1/p" "$TMP/m8/config.json"; }
L=$(cfg num_hidden_layers) KVW=$(($(cfg num_key_value_heads) * $(cfg head_dim)))
awk 'BEGIN { for (i = 0; i < 4; i++) { printf "{\"text\": \""; for (j = 0; j < 6000; j++) printf "the cat sat "; print "\"}" } }' >"$TMP/words.jsonl"
for P in 1 2 4; do
    timeout $TIMEOUT dev/launch.sh $P "$BIN" --model "$TMP/m8" --random_init --tokenizer $FIX/tiny_gqa/tokenizer.model \
        --data "$TMP/words.jsonl" --batching packing --max_seq_len 4096 --batch_size 2 --threads 1 --context_parallel $P \
        --dry_run --output_dir "$TMP/dry$P" >"$TMP/dry$P.log" 2>&1
    rc=$?
    carry=$(sed -n 's/^  KV and dKV carry  *\([0-9.]*\) MiB.*/\1/p' "$TMP/dry$P.log")
    want=$(awk -v L="$L" -v K="$KVW" -v P=$P 'BEGIN { B = 2; T = 4096; f = 4 * L * B * (T / P) * K + (P > 1 ? 4 * B * T * K : 0)
                                                     printf "%.1f", f * 4 / 1048576 }')
    [ $rc -eq 0 ] && [ "$carry" = "$want" ] && grep -q "T <= 4096" "$TMP/dry$P.log"
    check "memory plan, P = $P: the KV and dKV carry per rank is $carry MiB ($want MiB from the config: $L layers, NKV hd $KVW, 2 rows of 4096)" $? \
        "$(tail -3 "$TMP/dry$P.log")"
done

run 0 "$TMP/lora1" "${LORA[@]}"
check "LoRA reference (one process; rows up to $(grep -o 'T <= [0-9]*' "$TMP/lora1.log"))" $? "$(tail -3 "$TMP/lora1.log")"
run 0 "$TMP/full1" "${FULL[@]}"
check "full fine-tuning reference (one process)" $? "$(tail -3 "$TMP/full1.log")"

# P = 2 and 3: whole rows, --chunk_size (keep, recompute), activation checkpointing, strategies
# --s2_attn: packed rows of 256 (groups of 64), padded at P = 3 to 258 (whole) and 300 (in chunks of 50)
S2=(--s2_attn 1 --batching packing --max_seq_len 256)
cases=("lora 2 whole|" "lora 3 whole|" "lora 2 chunks of 64|--chunk_size 64" "lora 3 chunks of 50, recompute|--chunk_size 50 --chunk_memory recompute"
       "lora 2 activation checkpointing|--activation_checkpointing" "lora 3 NO_SHARD|--sharding_strategy NO_SHARD"
       "full 2 whole|" "full 3 whole|" "full 2 chunks of 64, recompute, activation checkpointing|--chunk_size 64 --chunk_memory recompute --activation_checkpointing"
       "full 3 chunks of 50|--chunk_size 50" "full 2 NO_SHARD|--sharding_strategy NO_SHARD"
       "dora 3 chunks of 50|--use_dora --chunk_size 50" "llama_adapter 2 whole|--peft_method llama_adapter --adapter_layers 2 --adapter_len 4"
       "mistral 2 chunks of 64 (sliding window of 5)|--chunk_size 64" "qlora 2 chunks of 64, FULL_SHARD|--chunk_size 64"
       "trainable 2 NO_SHARD|--sharding_strategy NO_SHARD"
       "s2 2 whole|" "s2 3 whole|" "s2 2 chunks of 64|--chunk_size 64"
       "s2 3 chunks of 50, recompute, activation checkpointing|--chunk_size 50 --chunk_memory recompute --activation_checkpointing")
for c in "${cases[@]}"; do
    name=${c%%|*} extra=${c#*|}
    read -r mode P rest <<<"$name"
    out="$TMP/$(echo "$name" | tr ' ,' '__')"
    ref=$TMP/$mode-ref weights=adapter_model.safetensors
    case $mode in
        lora) args=("${LORA[@]}") ref=$TMP/lora1 ;;
        full) args=("${FULL[@]}") ref=$TMP/full1 weights=model.safetensors ;;
        dora) args=("${LORA[@]}" --use_dora) ;;
        llama_adapter) args=(--model $FIX/tiny_gqa --peft_method llama_adapter --adapter_layers 2 --adapter_len 4) ;;
        mistral) args=(--model $FIX/tiny_mistral --lora_target_modules all-linear) ;;
        qlora) args=(--model $FIX/tiny_llama3 --quantize nf4 --double_quant 1) ;;
        trainable) args=("${LORA[@]}" --trainable_params embed,norm) ;; # (with sharded base weights: not supported yet)
        s2) args=("${LORA[@]}" "${S2[@]}") ;;
    esac
    [ -f "$ref.jsonl" ] || run 0 "$ref" "${args[@]}" # (one process, in chunks or not: the same bits)
    # shellcheck disable=SC2086
    run $P "$out" "${args[@]}" --context_parallel $P $extra
    [ -n "$(first_loss "$ref.jsonl")" ] && [ "$(first_loss "$out.jsonl")" = "$(first_loss "$ref.jsonl")" ] && [ "$(tokens "$out.jsonl")" = "$(tokens "$ref.jsonl")" ]
    check "$mode, P = $P, $rest: the first loss is one process's, bit for bit, and so are the tokens counted" $? \
        "$(first_loss "$out.jsonl") against $(first_loss "$ref.jsonl"); $(tail -2 "$out.log")"
    same_run "$mode, P = $P, $rest == one process" "$ref" "$out" $weights
done

# the --s2_attn cases compare with a run that trains S2's mask: its first loss is not causal attention's on the same rows
run 0 "$TMP/s2-causal" "${LORA[@]}" --batching packing --max_seq_len 256
[ -n "$(first_loss "$TMP/s2-ref.jsonl")" ] && [ "$(first_loss "$TMP/s2-ref.jsonl")" != "$(first_loss "$TMP/s2-causal.jsonl")" ]
check "--s2_attn's one-process run trains S2's mask (first loss $(first_loss "$TMP/s2-ref.jsonl"), causal attention's $(first_loss "$TMP/s2-causal.jsonl"))" $? \
    "$(tail -2 "$TMP/s2-causal.log")"

# every gradient: one SGD step at lr 1000 (w - 1000 g), no clipping, no decay
SGD=(--optimizer sgd --lr 1000 --grad_clip 0 --weight_decay 0 --warmup_steps 0 --max_steps 1)
grad_case() { # grad_case NAME WEIGHTS ARGS...: one process against P = 2 whole and P = 3 in chunks of 50
    local name=$1 weights=$2 e rc
    shift 2
    run 0 "$TMP/g-$name-1" "$@" "${SGD[@]}"
    for pc in "2" "3 --chunk_size 50"; do
        # shellcheck disable=SC2086
        run ${pc%% *} "$TMP/g-$name-${pc%% *}" "$@" "${SGD[@]}" --context_parallel $pc
        e=$("$compare" "$TMP/g-$name-${pc%% *}/$weights" "$TMP/g-$name-1/$weights" $GRAD_TOL 2>&1)
        rc=$?
        check "$name gradients, P = $pc: every tensor within $GRAD_TOL of one process's ($e)" $rc "$(tail -2 "$TMP/g-$name-${pc%% *}.log")"
    done
}
grad_case lora adapter_model.safetensors "${LORA[@]}" --from_peft_checkpoint "$TMP/lora1"
grad_case full model.safetensors "${FULL[@]}"

# data parallel x context parallel: 4 ranks, 2 groups of 2, each group 1 row of a micro-batch
for s in NO_SHARD FULL_SHARD "HYBRID_SHARD --shard_group 2"; do
    # shellcheck disable=SC2086
    run 4 "$TMP/dp-lora-${s%% *}" "${LORA[@]}" --batch_size 1 --context_parallel 2 --sharding_strategy $s
    same_run "LoRA, 2 data-parallel x 2 context-parallel ranks, $s == one process" "$TMP/lora1" "$TMP/dp-lora-${s%% *}" adapter_model.safetensors
    # shellcheck disable=SC2086
    run 4 "$TMP/dp-full-${s%% *}" "${FULL[@]}" --batch_size 1 --context_parallel 2 --chunk_size 64 --sharding_strategy $s
    same_run "full fine-tuning in chunks of 64, 2 x 2 ranks, $s == one process" "$TMP/full1" "$TMP/dp-full-${s%% *}" model.safetensors
done

# resume: a P = 2 run's checkpoint (step 5 of 10, sharded full fine-tuning) continues in one process
run 2 "$TMP/save2" "${FULL[@]}" --context_parallel 2 --save_every 5 --keep_checkpoints 0
run 0 "$TMP/resume1" "${FULL[@]}" --resume "$TMP/save2/checkpoint-5"
t=$(trajectory_diff "$TMP/resume1.jsonl" "$TMP/full1.jsonl" 6)
w=$("$compare" "$TMP/resume1/model.safetensors" "$TMP/full1/model.safetensors" $WEIGHT_TOL 2>&1)
rc=$?
awk -v t="$t" -v tol=$TRAJ_TOL 'BEGIN { exit !(t <= tol) }' && [ $rc -eq 0 ] && grep -q '"world_size": 1' "$TMP/save2/checkpoint-5/trainer_state.json"
check "a P = 2 checkpoint (world_size 1: one data-parallel group) resumed in one process == uninterrupted (steps 6-10 within $t, $w)" $? "$(tail -2 "$TMP/resume1.log")"
# and at another P: the same checkpoint continued by 3 ranks at P = 3 (still one data-parallel group;
# the sharded weights and moments re-sharded over 3), and one process's checkpoint continued at P = 2
run 0 "$TMP/save1" "${FULL[@]}" --save_every 5 --keep_checkpoints 0
for from in "save2 3" "save1 2"; do
    set -- $from
    run $2 "$TMP/resume-$1-p$2" "${FULL[@]}" --context_parallel $2 --resume "$TMP/$1/checkpoint-5"
    t=$(trajectory_diff "$TMP/resume-$1-p$2.jsonl" "$TMP/full1.jsonl" 6)
    w=$("$compare" "$TMP/resume-$1-p$2/model.safetensors" "$TMP/full1/model.safetensors" $WEIGHT_TOL 2>&1)
    rc=$?
    awk -v t="$t" -v tol=$TRAJ_TOL 'BEGIN { exit !(t <= tol) }' && [ $rc -eq 0 ] && grep -q "resumed from $TMP/$1/checkpoint-5 at step 5" "$TMP/resume-$1-p$2.log"
    check "$([ $1 = save2 ] && echo "the P = 2 checkpoint" || echo "one process's checkpoint") resumed at P = $2 == uninterrupted (steps 6-10 within $t, $w)" $? "$(tail -2 "$TMP/resume-$1-p$2.log")"
done
set --

# evaluation runs context-parallel too (each rank's pieces forward, the loss summed over the group):
# --val_data before training (--max_steps 0), P = 2 whole and P = 3 in chunks of 50, against one
# process to the metrics' 9 digits (every position's loss is the same bits; their sum in double
# is ordered otherwise, 1e-15 relative)
val_loss() { sed -n 's/.*"val_loss": \([^,]*\),.*/\1/p' "$1"; }
run 0 "$TMP/val1" "${LORA[@]}" --val_data "$TMP/long.jsonl" --max_steps 0
for pc in "2" "3 --chunk_size 50"; do
    # shellcheck disable=SC2086
    run ${pc%% *} "$TMP/val${pc%% *}" "${LORA[@]}" --val_data "$TMP/long.jsonl" --max_steps 0 --context_parallel $pc
    [ -n "$(val_loss "$TMP/val1.jsonl")" ] && [ "$(val_loss "$TMP/val${pc%% *}.jsonl")" = "$(val_loss "$TMP/val1.jsonl")" ]
    check "evaluation, P = $pc: the validation loss is one process's ($(val_loss "$TMP/val${pc%% *}.jsonl"))" $? \
        "$(val_loss "$TMP/val1.jsonl") in one process; $(tail -2 "$TMP/val${pc%% *}.log")"
done

# mpirun: the same bits as the launch by the environment (both sum in rank order)
if command -v mpirun >/dev/null && "$(dirname "$BIN")/test/test_fsdp" --mpi-build 2>/dev/null; then
    timeout $TIMEOUT mpirun -np 3 "$BIN" "${COMMON[@]}" "${LORA[@]}" --context_parallel 3 --output_dir "$TMP/mpi3" \
        --metrics_file "$TMP/mpi3.jsonl" >"$TMP/mpi3.log" 2>&1
    same_result "LoRA, P = 3 under mpirun: the same bits as dev/launch.sh's" "$TMP/lora_3_whole" "$TMP/mpi3" adapter_model.safetensors
else
    echo "SKIP $SUITE: under mpirun (no mpirun, or the trainer was built without MPI)"
fi

# refusals
run 2 "$TMP/bad-p" "${LORA[@]}" --context_parallel 3
[ $? -ne 0 ] && grep -q "context_parallel 3 does not divide the world size 2" "$TMP/bad-p.log"
check "--context_parallel 3 on 2 ranks is refused" $? "$(tail -2 "$TMP/bad-p.log")"
run 2 "$TMP/bad-prefix" --model $FIX/tiny_gqa --context_parallel 2 --peft_method prefix --num_virtual_tokens 4
[ $? -ne 0 ] && grep -q "context_parallel with --peft_method prefix is not supported yet" "$TMP/bad-prefix.log"
check "--context_parallel with --peft_method prefix is refused" $? "$(tail -2 "$TMP/bad-prefix.log")"
run 2 "$TMP/bad-bf16" "${FULL[@]}" --context_parallel 2 --pure_bf16 1 --optimizer anyprecision
[ $? -ne 0 ] && grep -q "context_parallel with --pure_bf16 is not supported yet" "$TMP/bad-bf16.log"
check "--context_parallel with --pure_bf16 is refused" $? "$(tail -2 "$TMP/bad-bf16.log")"

# sampling (--sample_prompt, greedy): every rank samples the whole sequence, in a row of its carry's
# B T / P positions a layer (here B = 1 < P = 2: half a row): before training (the same weights) the
# continuation is one process's, token for token (the CPU trainer's chunks give whole rows' bits)
SAMPLE=(--sample_prompt "the cat sat on" --max_new_tokens 24 --max_steps 1)
run 0 "$TMP/sample1" "${LORA[@]}" --batch_size 1 "${SAMPLE[@]}"
run 2 "$TMP/sample2" "${LORA[@]}" --batch_size 1 --context_parallel 2 "${SAMPLE[@]}"
a=$(grep -m1 "^sample at step 0 |" "$TMP/sample1.log") b=$(grep -m1 "^sample at step 0 |" "$TMP/sample2.log")
[ -n "$a" ] && [ "$a" = "$b" ]
check "--sample_prompt at P = 2 (batch 1) == one process's sample ($a)" $? "$(tail -2 "$TMP/sample2.log")"

[ $fails -eq 0 ] && echo "ok $SUITE: all passed" || { echo "FAIL $SUITE: $fails failed"; exit 1; }
