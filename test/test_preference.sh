#!/usr/bin/env bash
# Preference tuning through the command line (--objective dpo and orpo, docs/preference.md);
# test/test_llama2.c checks its numbers against the float64 reference (test_preference).
#   - sharded (dev/launch.sh 2, FULL_SHARD): LoRA DPO from the fixtures' starting adapter and
#     full fine-tuning DPO (the reference: this rank's shards, copied at the start), against one
#     process with the same pairs per micro-batch: the trajectory within TRAJ_TOL, the weights
#     within WEIGHT_TOL (test_sharded.sh's bounds: the ranks' sums meet in another order);
#   - every adapter (DoRA, IA3, prefix, llama_adapter, QLoRA, --trainable_params) and full
#     fine-tuning with frozen layers: step 1's policy is its reference (loss log 2, margin 0);
#   - evaluation (--val_data): before any step DPO's policy is its reference, so the validation
#     loss is log 2 and every reward 0; ORPO's eval/ metrics are there; TensorBoard's tags;
#   - the memory plan counts DPO's reference (Llama-2-7B full fine-tuning, a dry run);
#   - ORPO (no reference) resumes from a checkpoint to the uninterrupted run's bits;
#   - --shared_prompt on (a pair's prompt run once) == two rows, to rounding, in every chunk mode;
#   - --precompute_ref_log_probs: the same trajectory as the reference's forward every step (bit for
#     bit in file order, within PRECOMPUTE_TOL shuffled: the pairs are then scored in other batches);
#     the memory plan holds no reference copy;
#   - DPO resumed == uninterrupted, bit for bit: LoRA and full fine-tuning, with and without
#     precompute (the checkpoint's reference.safetensors); a resume whose --model changed is refused;
#   - --context_parallel 2 == one process for DPO LoRA and ORPO (trajectory within TRAJ_TOL);
#   - the conversational form (test/fixtures/preference/chat.jsonl): evaluation before any step,
#     a step;
#   - hostile data and options: SFT on pairs, DPO on SFT data, a plain record among pairs, a
#     missing key, mixed forms, an empty completion, --precompute_ref_log_probs with ORPO: a clear
#     error, nothing written; the same responses and a long prompt: skips (the CUDA trainer's runs:
#     test_llama2cu_preference.sh).
set -u
cd "$(dirname "$0")/.."
SUITE=preference
source test/train_helpers.sh # BIN, TMP, check, trajectory_diff
compare="$(dirname "$BIN")/test/st_compare"
export OMP_NUM_THREADS=1 LAUNCH_GRACE=10
TRAJ_TOL=1e-6
WEIGHT_TOL=2e-4
DATA=$FIX/preference/data.jsonl
ARGS=(--model $FIX/tiny_gqa --data "$DATA" --data_cache_dir "$TMP/cache" --max_seq_len 32 --lr 1e-2 --shuffle 0 --threads 1)
LORA=(--objective dpo --from_peft_checkpoint $FIX/tiny_gqa/dpo/peft_init)

# sharded == one process
for mode in lora full; do
    if [ $mode = lora ]; then extra=("${LORA[@]}"); file=adapter_model.safetensors; else extra=(--objective dpo --full_finetune --lr 3e-3); file=model.safetensors; fi
    run "$TMP/one_$mode" 3 "${extra[@]}" --batch_size 4
    check "$mode: one process trains" $? "$(tail -2 "$TMP/one_$mode.log")"
    dev/launch.sh 2 "$BIN" "${ARGS[@]}" "${extra[@]}" --max_steps 3 --batch_size 2 --output_dir "$TMP/two_$mode" \
        --metrics_file "$TMP/two_$mode.jsonl" >"$TMP/two_$mode.log" 2>&1
    check "$mode: 2 ranks train" $? "$(tail -2 "$TMP/two_$mode.log")"
    d=$(trajectory_diff "$TMP/two_$mode.jsonl" "$TMP/one_$mode.jsonl")
    awk -v d="$d" -v t=$TRAJ_TOL 'BEGIN { exit !(d <= t) }'
    check "$mode: 2 ranks' losses and gradient norms are one process's (worst $d, tol $TRAJ_TOL)" $? "worst $d"
    out=$("$compare" "$TMP/two_$mode/$file" "$TMP/one_$mode/$file" $WEIGHT_TOL)
    check "$mode: 2 ranks' weights are one process's ($out)" $? "$out"
done

# every adapter (and frozen layers): at step 1 the policy is its reference, so the loss is log 2
# and the margin 0 exactly; step 2 moves them (the reference copy stays the start)
for method in "--use_dora --lora_dropout 0" "--peft_method ia3" "--peft_method prefix --num_virtual_tokens 4" \
    "--peft_method llama_adapter --adapter_len 3 --adapter_layers 1" "--quantize nf4 --lora_dropout 0" \
    "--trainable_params embed,norm --lora_dropout 0" "--full_finetune --freeze_layers 1"; do
    # shellcheck disable=SC2086 # (the method's options, split)
    run "$TMP/method" 2 --objective dpo --batch_size 2 $method
    [ $? -eq 0 ] && sed -n 1p "$TMP/method.jsonl" | grep -q '"loss": 0.693147181, .*"rewards/margins": 0,' &&
        sed -n 2p "$TMP/method.jsonl" | grep -qv '"rewards/margins": 0,'
    check "$method: step 1's loss is log 2 and its margin 0, step 2's is not" $? "$(head -2 "$TMP/method.jsonl"; tail -2 "$TMP/method.log")"
done

# evaluation: DPO's start is its reference
run "$TMP/eval0" 0 "${LORA[@]}" --batch_size 2 --val_data "$DATA" --tensorboard_dir "$TMP/tb"
grep -q '"val_loss": 0.69314' "$TMP/eval0.jsonl" && grep -q '"eval/rewards/margins": 0,' "$TMP/eval0.jsonl" &&
    grep -q '"eval/rewards/accuracies": 0,' "$TMP/eval0.jsonl"
check "evaluation before any step: loss log 2, rewards 0 (the policy is the reference)" $? "$(cat "$TMP/eval0.jsonl"; tail -2 "$TMP/eval0.log")"
run "$TMP/orpo" 4 --objective orpo --from_peft_checkpoint $FIX/tiny_gqa/dpo/peft_init --batch_size 2 --val_data "$DATA" \
    --eval_every 2 --save_every 2 --tensorboard_dir "$TMP/tb"
[ $? -eq 0 ] && [ "$(grep -c '"eval/log_odds_chosen"' "$TMP/orpo.jsonl")" -eq 2 ] && [ "$(grep -c '"nll_loss"' "$TMP/orpo.jsonl")" -eq 4 ]
check "ORPO: its metrics every step and at each evaluation" $? "$(head -3 "$TMP/orpo.jsonl"; tail -2 "$TMP/orpo.log")"
grep -aq "train/rewards/margins" "$TMP"/tb/events.* && grep -aq "eval/log_odds_ratio" "$TMP"/tb/events.*
check "TensorBoard: train/ and eval/ tags under TRL's names" $? "$(ls "$TMP/tb")"
run "$TMP/orpo_resumed" 4 --objective orpo --from_peft_checkpoint $FIX/tiny_gqa/dpo/peft_init --batch_size 2 --val_data "$DATA" \
    --eval_every 2 --save_every 2 --resume "$TMP/orpo/checkpoint-2"
check "ORPO resumes" $? "$(tail -2 "$TMP/orpo_resumed.log")"
cmp -s "$TMP/orpo/adapter_model.safetensors" "$TMP/orpo_resumed/adapter_model.safetensors" &&
    [ "$(trajectory_diff "$TMP/orpo_resumed.jsonl" "$TMP/orpo.jsonl" 3)" = 0 ]
check "ORPO: resumed from step 2, the uninterrupted run's steps 3-4 and adapter, bit for bit" $? "$(diff <(trajectory "$TMP/orpo.jsonl") <(trajectory "$TMP/orpo_resumed.jsonl") | head -4)"

# --shared_prompt on == off (two rows) to rounding: the prompt's keys and values run once and its dK, dV
# are summed before its backward, where two rows take two backwards and sum their gradients. Whole and
# chunked (keep: the slots laid out again, one chunk more; recompute with activation checkpointing and
# output pieces), full fine-tuning, ORPO (the prompt's nll on the shared run), DoRA, QLoRA, accumulation.
# Tolerance: the trajectory TRAJ_TOL; the weights SHARED_TOL of their scale after 3 AdamW steps (measured
# worst 7.5e-6, ORPO: AdamW's first steps turn rounding-level gradient differences into larger ones of
# the near-zero elements' updates). The report says what ran: fewer positions when on, none fewer when
# off, and auto with LoRA dropout (a fresh adapter's: --from_peft_checkpoint takes its adapter's) is two
# rows (their own masks), off's bits.
SHARED_TOL=5e-5
for cfg in "whole|${LORA[*]} --lora_dropout 0" "keep C=5|${LORA[*]} --lora_dropout 0 --chunk_size 5" \
    "recompute C=5|${LORA[*]} --lora_dropout 0 --chunk_size 5 --chunk_memory recompute --activation_checkpointing --num_output_chunks 3" \
    "full C=6|--objective dpo --full_finetune --lr 3e-3 --chunk_size 6" "ORPO C=7|--objective orpo --lora_dropout 0 --chunk_size 7" \
    "DoRA|--objective dpo --use_dora --lora_dropout 0" "QLoRA|${LORA[*]} --quantize nf4 --lora_dropout 0" \
    "accumulation|${LORA[*]} --lora_dropout 0 --batch_size 1 --gradient_accumulation_steps 2"; do
    name=${cfg%%|*}
    read -r -a extra <<<"${cfg#*|}"
    file=adapter_model.safetensors
    [[ "${extra[*]}" == *full_finetune* ]] && file=model.safetensors
    run "$TMP/shared_on" 3 --batch_size 2 "${extra[@]}" --shared_prompt on && run "$TMP/shared_off" 3 --batch_size 2 "${extra[@]}" --shared_prompt off
    check "--shared_prompt, $name: trains" $? "$(tail -n 2 "$TMP/shared_on.log" "$TMP/shared_off.log")"
    d=$(trajectory_diff "$TMP/shared_on.jsonl" "$TMP/shared_off.jsonl")
    out=$("$compare" "$TMP/shared_on/$file" "$TMP/shared_off/$file" $SHARED_TOL) && awk -v d="$d" -v t=$TRAJ_TOL 'BEGIN { exit !(d <= t) }'
    check "--shared_prompt, $name: on == two rows (trajectory $d, $out)" $? "trajectory $d; $out"
    grep -q "(--shared_prompt on: [1-9][0-9.]*% fewer)" "$TMP/shared_on.log" && grep -q "(--shared_prompt off: 0.0% fewer)" "$TMP/shared_off.log"
    check "--shared_prompt, $name: the report says what ran" $? "$(tail -n 2 "$TMP/shared_on.log" "$TMP/shared_off.log")"
done
run "$TMP/shared_auto" 3 --objective dpo --batch_size 2 --lora_dropout 0.1 && run "$TMP/shared_off" 3 --objective dpo --batch_size 2 --lora_dropout 0.1 --shared_prompt off
cmp -s "$TMP/shared_auto/adapter_model.safetensors" "$TMP/shared_off/adapter_model.safetensors" &&
    grep -q "(--shared_prompt auto: 0.0% fewer)" "$TMP/shared_auto.log"
check "--shared_prompt auto with LoRA dropout: two rows, off's bits" $? "$(tail -2 "$TMP/shared_auto.log")"
# --precompute_ref_log_probs: the reference's log-probabilities from one pass before step 1 are the
# ones its forward gives every step: in file order the same batches run, so the same bits; shuffled,
# each pair is scored in other batches (other padding and blocking): within PRECOMPUTE_TOL, a few
# float roundings of the log-probabilities (measured: 0 in both, the tiny pairs' blocking being the same)
PRECOMPUTE_TOL=1e-6
for shuffle in 0 1; do
    for mode in lora full; do
        if [ $mode = lora ]; then extra=("${LORA[@]}"); else extra=(--objective dpo --full_finetune --lr 3e-3); fi
        run "$TMP/ref_$mode" 3 "${extra[@]}" --batch_size 2 --shuffle $shuffle --val_data "$DATA" --eval_every 2
        run "$TMP/pre_$mode" 3 "${extra[@]}" --batch_size 2 --shuffle $shuffle --val_data "$DATA" --eval_every 2 --precompute_ref_log_probs 1
        check "$mode, shuffle $shuffle: precomputed runs" $? "$(tail -2 "$TMP/pre_$mode.log")"
        want=0; [ $shuffle = 1 ] && want=$PRECOMPUTE_TOL
        d=$(trajectory_diff "$TMP/pre_$mode.jsonl" "$TMP/ref_$mode.jsonl")
        e=$(paste -d' ' <(grep -o '"eval/rewards/margins": [^,]*' "$TMP/pre_$mode.jsonl") <(grep -o '"eval/rewards/margins": [^,]*' "$TMP/ref_$mode.jsonl") |
            awk '{ d = $2 - $4; d = d < 0 ? -d : d; m = d > m ? d : m } END { print m + 0 }')
        awk -v d="$d" -v e="$e" -v t=$want 'BEGIN { exit !(d <= t && e <= t) }'
        check "$mode, shuffle $shuffle: precomputed == the reference's forward (worst $d, evaluation $e, tol $want)" $? "worst $d, $e"
    done
done
grep -q "precomputed the reference's log-probabilities of 8 training and 8 validation pairs" "$TMP/pre_full.log"
check "precompute says what it scored" $? "$(grep -i precomputed "$TMP/pre_full.log")"

# DPO resumed == uninterrupted, bit for bit: the checkpoint keeps the reference (or its log-probabilities)
for mode in lora full; do
    for pre in 0 1; do
        if [ $mode = lora ]; then extra=("${LORA[@]}"); file=adapter_model.safetensors; else extra=(--objective dpo --full_finetune --lr 3e-3); file=model.safetensors; fi
        extra+=(--batch_size 2 --shuffle 1 --precompute_ref_log_probs $pre --val_data "$DATA" --eval_every 2 --save_every 2)
        run "$TMP/dpo_$mode$pre" 4 "${extra[@]}"
        cp "$TMP/dpo_$mode$pre.jsonl" "$TMP/dpo_resumed_$mode$pre.jsonl"
        run "$TMP/dpo_resumed_$mode$pre" 4 "${extra[@]}" --resume "$TMP/dpo_$mode$pre/checkpoint-2"
        check "DPO $mode, precompute $pre: resumes" $? "$(tail -2 "$TMP/dpo_resumed_$mode$pre.log")"
        cmp -s "$TMP/dpo_$mode$pre/$file" "$TMP/dpo_resumed_$mode$pre/$file" &&
            [ "$(trajectory_diff "$TMP/dpo_resumed_$mode$pre.jsonl" "$TMP/dpo_$mode$pre.jsonl" 3)" = 0 ] &&
            diff <(grep -o '"eval/[^}]*' "$TMP/dpo_$mode$pre.jsonl") <(grep -o '"eval/[^}]*' "$TMP/dpo_resumed_$mode$pre.jsonl") >/dev/null
        check "DPO $mode, precompute $pre: resumed from step 2, the uninterrupted run's steps 3-4, evaluations and weights, bit for bit" $? \
            "$(diff <(trajectory "$TMP/dpo_$mode$pre.jsonl") <(trajectory "$TMP/dpo_resumed_$mode$pre.jsonl") | head -4)"
    done
done
# hostile: the starting model's weights changed since the checkpoint (a byte of a weight): refused (below)
cp -r $FIX/tiny_gqa "$TMP/model"
"$BIN" "${ARGS[@]}" --model "$TMP/model" "${LORA[@]}" --batch_size 2 --max_steps 2 --save_every 2 --output_dir "$TMP/moved" >"$TMP/moved.log" 2>&1
check "DPO on a copy of the model trains" $? "$(tail -2 "$TMP/moved.log")"
printf '\x3f' | dd of="$TMP/model/model.safetensors" bs=1 seek=$(($(stat -c %s "$TMP/model/model.safetensors") - 3)) conv=notrunc 2>/dev/null

# context parallelism: a pair's rows in pieces over 2 ranks == one process (the scores summed over the group)
for obj in dpo orpo; do
    run "$TMP/cp1_$obj" 3 --objective $obj --from_peft_checkpoint $FIX/tiny_gqa/dpo/peft_init --batch_size 2
    dev/launch.sh 2 "$BIN" "${ARGS[@]}" --objective $obj --from_peft_checkpoint $FIX/tiny_gqa/dpo/peft_init --batch_size 2 --max_steps 3 \
        --context_parallel 2 --output_dir "$TMP/cp2_$obj" --metrics_file "$TMP/cp2_$obj.jsonl" >"$TMP/cp2_$obj.log" 2>&1
    check "$obj: context parallel 2 trains" $? "$(tail -2 "$TMP/cp2_$obj.log")"
    d=$(trajectory_diff "$TMP/cp2_$obj.jsonl" "$TMP/cp1_$obj.jsonl")
    m=$(paste -d' ' <(grep -o '"rewards/margins": [^,]*' "$TMP/cp2_$obj.jsonl") <(grep -o '"rewards/margins": [^,]*' "$TMP/cp1_$obj.jsonl") |
        awk '{ d = $2 - $4; d = d < 0 ? -d : d; m = d > m ? d : m } END { print m + 0 }')
    awk -v d="$d" -v m="$m" -v t=$TRAJ_TOL 'BEGIN { exit !(d <= t && m <= t) }'
    check "$obj: context parallel 2's losses, gradient norms and margins are one process's (worst $d, margins $m, tol $TRAJ_TOL)" $? "worst $d, $m"
    out=$("$compare" "$TMP/cp2_$obj/adapter_model.safetensors" "$TMP/cp1_$obj/adapter_model.safetensors" $WEIGHT_TOL)
    check "$obj: context parallel 2's adapter is one process's ($out)" $? "$out"
done

# the conversational form (chat.jsonl through tiny_gqa's Llama-2 template; test_dataloader checks
# its tokens against TRL's): before any step the policy is its reference, the pairs TRL drops are
# skipped by line, and a step trains from log 2
CHAT=(--data $FIX/preference/chat.jsonl --max_seq_len 96)
run "$TMP/chat0" 0 "${LORA[@]}" "${CHAT[@]}" --batch_size 2 --val_data $FIX/preference/chat.jsonl
grep -q '"val_loss": 0.69314' "$TMP/chat0.jsonl" && grep -q '"eval/rewards/margins": 0,' "$TMP/chat0.jsonl" &&
    grep -q 'chat.jsonl: skipped 1 samples: line 7: no response token within max_seq_len' "$TMP/chat0.log"
check "conversational pairs: evaluation before any step gives loss log 2, rewards 0; line 7's long prompt skipped" $? "$(cat "$TMP/chat0.jsonl"; tail -2 "$TMP/chat0.log")"
run "$TMP/chat" 2 "${LORA[@]}" "${CHAT[@]}" --batch_size 2
[ $? -eq 0 ] && sed -n 1p "$TMP/chat.jsonl" | grep -q '"loss": 0.693147181, .*"rewards/margins": 0,' &&
    sed -n 2p "$TMP/chat.jsonl" | grep -qv '"rewards/margins": 0,' && [ -f "$TMP/chat/adapter_model.safetensors" ]
check "conversational pairs: DPO trains (step 1's loss log 2, step 2's margin moved)" $? "$(head -2 "$TMP/chat.jsonl"; tail -2 "$TMP/chat.log")"

# the memory plan counts DPO's reference: Llama-2-7B full fine-tuning plans its 25705.0 MiB of fp32
# weights once more than SFT (a dry run, nothing of the model's size allocated)
plan() { "$BIN" --model $FIX/configs/llama-2-7b --random_init --tokenizer $FIX/tiny_gqa/tokenizer.model --dry_run --max_seq_len 64 \
    --batch_size 1 --full_finetune --output_dir "$TMP/plan" "$@" 2>&1 | sed -n 's/^  trainable weights, grads, AdamW *\([0-9.]*\) MiB/\1/p'; }
sft=$(plan --data $FIX/data.jsonl) dpo=$(plan --data "$DATA" --objective dpo)
awk -v a="$sft" -v b="$dpo" 'BEGIN { d = b - a - 25705.0; exit !(a > 0 && d < 0.15 && d > -0.15) }' # (each printed to 0.1 MiB)
check "the plan counts DPO's reference: 7B full fine-tuning $dpo MiB, SFT $sft MiB (+ 25705.0)" $? "SFT '$sft', DPO '$dpo'"
pre=$(plan --data "$DATA" --objective dpo --precompute_ref_log_probs 1)
[ -n "$pre" ] && [ "$pre" = "$sft" ]
check "--precompute_ref_log_probs plans no reference: $pre MiB, SFT's $sft MiB" $? "SFT '$sft', precomputed '$pre'"

# refusals and hostile data: the message, and nothing written
refused() { # refused NAME PATTERN ARGS...: exit 2 or 1 with PATTERN on stderr, no output folder filled
    local name=$1 pattern=$2; shift 2
    rm -rf "$TMP/refused"
    "$@" --output_dir "$TMP/refused" >"$TMP/refused.log" 2>&1
    local rc=$?
    [ $rc -ne 0 ] && grep -qE -e "$pattern" "$TMP/refused.log" && ! ls "$TMP/refused"/*.safetensors >/dev/null 2>&1
    check "$name" $? "exit $rc: $(tail -2 "$TMP/refused.log")"
}
refused "SFT on preference pairs" "holds preference pairs .* --objective dpo or orpo" "$BIN" "${ARGS[@]}" --max_steps 1
refused "DPO on SFT data" "--objective dpo trains on preference pairs: .* format text" "$BIN" "${ARGS[@]}" --data $FIX/data.jsonl --objective dpo
printf '{"prompt": "a", "chosen": " b", "rejected": " c"}\n{"text": "a b c"}\n' >"$TMP/mixed.jsonl"
refused "a plain record among pairs names file:line" "mixed.jsonl:2: missing field \"prompt\"" "$BIN" "${ARGS[@]}" --data "$TMP/mixed.jsonl" --objective dpo
printf '{"prompt": "a", "chosen": " b"}\n' >"$TMP/nokey.jsonl"
refused "a pair without its rejected response" "nokey.jsonl:1: missing field \"rejected\"" "$BIN" "${ARGS[@]}" --data "$TMP/nokey.jsonl" \
    --data_format preference --objective dpo
refused "DPO resumed from a changed --model" "DPO's reference is the model the run started from, and --model's weights .* have changed" \
    "$BIN" "${ARGS[@]}" --model "$TMP/model" "${LORA[@]}" --batch_size 2 --max_steps 4 --resume "$TMP/moved/checkpoint-2"
refused "--precompute_ref_log_probs without DPO" "--precompute_ref_log_probs is DPO's" "$BIN" "${ARGS[@]}" --objective orpo \
    --precompute_ref_log_probs 1
# both forms: the same responses and a prompt over max_seq_len are skips listed by line, an empty
# response trains (TRL's: its end token); mixing the forms, a missing key or an empty completion
# is an error naming file:line
u() { printf '{"role": "user", "content": "%s"}' "$1"; }
a() { printf '{"role": "assistant", "content": "%s"}' "$1"; }
long="a prompt much longer than the limit of the rows, with many more words"
printf '{"prompt": "a", "chosen": " b", "rejected": " c"}\n{"prompt": "x", "chosen": " s", "rejected": " s"}\n{"prompt": "%s", "chosen": " b", "rejected": " c"}\n{"prompt": "a", "chosen": "", "rejected": " c"}\n' \
    "$long" >"$TMP/plain_skips.jsonl"
printf '{"prompt": [%s], "chosen": [%s], "rejected": [%s]}\n' "$(u a)" "$(a b)" "$(a c)" "$(u x)" "$(a s)" "$(a s)" "$(u "$long")" "$(a b)" "$(a c)" \
    "$(u a)" "$(a "")" "$(a c)" >"$TMP/chat_skips.jsonl"
for form in plain chat; do
    run "$TMP/skips_$form" 1 --objective dpo --batch_size 2 --data "$TMP/${form}_skips.jsonl" --max_seq_len 20
    [ $? -eq 0 ] && grep -q "skipped 2 samples: line 2: chosen and rejected are the same; line 3: no response token within max_seq_len" "$TMP/skips_$form.log" &&
        grep -q "2 samples of 4 records" "$TMP/skips_$form.log"
    check "$form pairs: the same responses and a long prompt are skips listed by line, an empty response trains" $? "$(grep -E "^data|error" "$TMP/skips_$form.log")"
done
printf '{"prompt": "a", "chosen": " b", "rejected": " c"}\n{"prompt": [%s], "chosen": [%s], "rejected": [%s]}\n' "$(u a)" "$(a b)" "$(a c)" >"$TMP/mixed_forms.jsonl"
refused "a conversational pair among plain ones names file:line" "mixed_forms.jsonl:2: a conversational \(lists of messages\) pair among plain ones" \
    "$BIN" "${ARGS[@]}" --data "$TMP/mixed_forms.jsonl" --objective dpo
printf '{"chosen": [%s, %s], "rejected": [%s, %s]}\n{"prompt": [%s], "chosen": [%s]}\n' "$(u a)" "$(a b)" "$(u a)" "$(a c)" "$(u a)" "$(a b)" >"$TMP/chat_nokey.jsonl"
refused "a conversational pair without its rejected messages" "chat_nokey.jsonl:2: missing field \"rejected\"" "$BIN" "${ARGS[@]}" --data "$TMP/chat_nokey.jsonl" --objective dpo
printf '{"prompt": [%s], "chosen": [], "rejected": [%s]}\n' "$(u a)" "$(a c)" >"$TMP/chat_empty.jsonl"
refused "an empty completion" "chat_empty.jsonl:1: field \"chosen\" is an empty list" "$BIN" "${ARGS[@]}" --data "$TMP/chat_empty.jsonl" --objective dpo
refused "--dpo_loss_type without DPO" "--dpo_loss_type is DPO's" "$BIN" "${ARGS[@]}" --objective orpo --dpo_loss_type ipo
refused "packing" "give --batching padding" "$BIN" "${ARGS[@]}" --objective dpo --batching packing
refused "--shared_prompt with SFT" "--shared_prompt is preference tuning's" "$BIN" "${ARGS[@]}" --data $FIX/data.jsonl --shared_prompt on
refused "--shared_prompt on with prefix tuning" "--shared_prompt on with --peft_method prefix is not supported" "$BIN" "${ARGS[@]}" \
    --objective dpo --peft_method prefix --shared_prompt on
refused "--shared_prompt: a choice" "--shared_prompt: 'yes' is not one of auto, on, off" "$BIN" "${ARGS[@]}" --objective dpo --shared_prompt yes
[ $fails -eq 0 ]
