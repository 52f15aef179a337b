#!/usr/bin/env bash
# Checkpoints and resume: a run that is killed (at chosen points, in the middle
# of writing a checkpoint, and at random moments) and resumed ends with exactly
# the weights and the loss trajectory of a run that was never interrupted, bit
# for bit (LoRA, full fine-tuning, QLoRA, DoRA, IA3, llama_adapter, prefix, --trainable_params); SIGTERM finishes the step, saves and
# exits 0; a resume with changed options or data is refused.
set -u
SUITE=resume
source test/train_helpers.sh # BIN, TMP, FIX; check, run, start, trajectory, same_result
# checkpoints write and read the optimizer state through a staging buffer: 1000 bytes (250
# floats) makes every state tensor here cross many pieces, one of them short
export LLAMA2TUNE_STAGING_BYTES=1000

# LoRA with dropout, shuffling over several epochs and gradient accumulation:
# everything a resume has to restore
ARGS=(--model $FIX/tiny_gqa --data $FIX/data.jsonl --max_seq_len 24 --batch_size 2 --gradient_accumulation_steps 2
      --lr 5e-3 --warmup_steps 2 --lora_dropout 0.1 --lora_target_modules all-linear --save_every 3 --keep_checkpoints 2
      --threads 1) # tiny matrices: one thread, and no spinning OpenMP threads when the machine is busy
run "$TMP/ref" 12
check "an uninterrupted run finishes" $? "$(tail -3 "$TMP/ref.log")"

# killed right after step 7 (checkpoint 6 is the newest), resumed from the output folder
LLAMA2TUNE_FAULT=step:7 run "$TMP/a" 12
rc=$?
[ $rc -eq 137 ] && [ -d "$TMP/a/checkpoint-6" ] && [ -d "$TMP/a/checkpoint-3" ] && [ "$(ls "$TMP/ref" | grep -c '^checkpoint-')" -eq 2 ]
check "SIGKILL after step 7 leaves checkpoints 3 and 6 (a finished run keeps only 2)" $? "exit $rc; $(ls "$TMP/a"); $(ls "$TMP/ref")"
run "$TMP/a" 12 --resume "$TMP/a"
check "resume after a kill exits 0" $? "$(tail -3 "$TMP/a.log")"
same_result "killed after step 7 and resumed == uninterrupted, bit for bit" "$TMP/ref" "$TMP/a" adapter_model.safetensors

# killed halfway through writing checkpoint 9: checkpoint 6 stays valid
LLAMA2TUNE_FAULT=checkpoint:9 run "$TMP/b" 12
[ -d "$TMP/b/checkpoint-9.tmp" ] && [ ! -e "$TMP/b/checkpoint-9" ] && [ -f "$TMP/b/checkpoint-6/trainer_state.json" ]
check "a kill inside a checkpoint leaves only a .tmp folder" $? "$(ls "$TMP/b")"
run "$TMP/b" 12 --resume "$TMP/b"
check "resume after a kill inside a checkpoint exits 0" $? "$(tail -3 "$TMP/b.log")"
[ ! -e "$TMP/b/checkpoint-9.tmp" ] && grep -q "resumed from $TMP/b/checkpoint-6 at step 6" "$TMP/b.log"
check "the resume starts from checkpoint 6 and clears the .tmp" $? "$(grep resumed "$TMP/b.log"; ls "$TMP/b")"
same_result "killed inside a checkpoint and resumed == uninterrupted" "$TMP/ref" "$TMP/b" adapter_model.safetensors

# SIGKILL at random moments (sometimes during a checkpoint), resuming each time
run "$TMP/long" 300 --save_every 4
for i in $(seq 1 40); do
    resume=() # killed before its first checkpoint: start again
    if ls "$TMP/c" 2>/dev/null | grep -q '^checkpoint-[0-9]*$'; then resume=(--resume "$TMP/c"); fi
    start "$TMP/c" 300 --save_every 4 "${resume[@]}"
    sleep "0.$(( (RANDOM % 25) + 5 ))"
    kill -9 $pid 2>/dev/null
    wait $pid 2>/dev/null
    [ -f "$TMP/c/adapter_model.safetensors" ] && break
done
kills=$i
[ -f "$TMP/c/adapter_model.safetensors" ] || { run "$TMP/c" 300 --save_every 4 --resume "$TMP/c"; }
same_result "$kills runs killed at random moments and resumed == uninterrupted (300 steps)" "$TMP/long" "$TMP/c" adapter_model.safetensors

# SIGTERM: finish the step, save, exit 0
start "$TMP/d" 100000 --save_every 0
# after a step has ended, not after a fixed time: on a loaded machine (CI runs two tests at a
# time) the trainer may not have installed its handler yet, and the default action would kill it
wait_steps "$TMP/d.jsonl" 1
kill -TERM $pid
wait $pid
rc=$?
steps=$(ls "$TMP/d" | grep -c '^checkpoint-[0-9]*$')
[ $rc -eq 0 ] && [ "$steps" -eq 1 ] && grep -q "stopped by a signal" "$TMP/d.log"
check "SIGTERM saves a checkpoint and exits 0" $? "exit $rc, $steps checkpoints, $(tail -2 "$TMP/d.log")"

# full fine-tuning: the model and the moments round-trip exactly too
run "$TMP/fref" 6 --full_finetune
LLAMA2TUNE_FAULT=step:4 run "$TMP/f" 6 --full_finetune
run "$TMP/f" 6 --full_finetune --resume "$TMP/f"
same_result "full fine-tuning killed and resumed == uninterrupted" "$TMP/fref" "$TMP/f" model.safetensors

# a resume that would not continue the same run is refused, naming the reason
run "$TMP/e" 12 --resume "$TMP/ref/checkpoint-12" --lr 1e-3
rc=$?
[ $rc -eq 1 ] && grep -q -- "--lr was '0.00499999989' in the checkpoint but is '0.00100000005' now" "$TMP/e.log"
check "resume with another --lr is refused" $? "exit $rc: $(tail -2 "$TMP/e.log")"
cp $FIX/data.jsonl "$TMP/data.jsonl"
LLAMA2TUNE_FAULT=step:4 run "$TMP/g" 6 --data "$TMP/data.jsonl"
echo '{"text": "one more line"}' >>"$TMP/data.jsonl"
run "$TMP/g" 6 --data "$TMP/data.jsonl" --resume "$TMP/g"
rc=$?
[ $rc -eq 1 ] && grep -q "data file '$TMP/data.jsonl' has changed since the checkpoint" "$TMP/g.log"
check "resume after the data changed is refused" $? "exit $rc: $(tail -2 "$TMP/g.log")"
run "$TMP/h" 3 --resume "$TMP/nothing_here"
rc=$?
[ $rc -eq 1 ] && grep -q "neither a checkpoint" "$TMP/h.log"
check "resume from a folder without checkpoints is refused" $? "exit $rc: $(tail -2 "$TMP/h.log")"
printf '{"step": 3, "optimizer_step": 3' >"$TMP/g/checkpoint-3/trainer_state.json"
run "$TMP/i" 6 --data "$TMP/data.jsonl" --resume "$TMP/g/checkpoint-3"
rc=$?
[ $rc -eq 1 ] && grep -q "trainer_state.json" "$TMP/i.log"
check "a corrupt trainer_state.json is refused, naming the file" $? "exit $rc: $(tail -2 "$TMP/i.log")"

# SGD: the momentum buffer round-trips exactly (a buffer lost or zeroed changes the steps after the resume),
# LoRA with Nesterov momentum and full fine-tuning with momentum; plain SGD keeps no state at all
for sgd in "lora nesterov" "full momentum" "full plain"; do
    set -- $sgd
    opts=(--optimizer sgd --lr 0.1 --weight_decay 0.01)
    [ "$2" != plain ] && opts+=(--momentum 0.9)
    [ "$2" = nesterov ] && opts+=(--nesterov 1)
    [ "$1" = full ] && opts+=(--full_finetune)
    weights=$([ "$1" = full ] && echo model.safetensors || echo adapter_model.safetensors)
    out="$TMP/sgd-$1-$2"
    run "$out-ref" 9 "${opts[@]}"
    LLAMA2TUNE_FAULT=step:5 run "$out" 9 "${opts[@]}"
    run "$out" 9 "${opts[@]}" --resume "$out"
    same_result "SGD ($1, $2) killed after step 5 and resumed == uninterrupted, bit for bit" "$out-ref" "$out" $weights
done
tensors() { head -c 4096 "$1" | grep -ao '"[a-z_]*":{"dtype"' | cut -d'"' -f2 | tr '\n' ' '; } # the names in a safetensors header
[ "$(tensors "$TMP/sgd-lora-nesterov/checkpoint-9/optimizer.safetensors")" = "momentum_buffer " ] &&
    [ -z "$(tensors "$TMP/sgd-full-plain/checkpoint-9/optimizer.safetensors")" ]
check "SGD checkpoints hold the momentum buffer (torch's name), plain SGD's none" $? \
    "$(tensors "$TMP/sgd-lora-nesterov/checkpoint-9/optimizer.safetensors"); $(tensors "$TMP/sgd-full-plain/checkpoint-9/optimizer.safetensors")"
refused() { # refused NAME EXPECT [args]: a resume of the SGD LoRA run with these options is refused, saying EXPECT
    local name=$1 expect=$2; shift 2
    run "$TMP/sgd-refused" 12 --resume "$TMP/sgd-lora-nesterov-ref/checkpoint-9" "$@"
    local rc=$?
    [ $rc -eq 1 ] && grep -q -- "$expect" "$TMP/sgd-refused.log"
    check "$name" $? "exit $rc: $(tail -2 "$TMP/sgd-refused.log")"
}
refused "resume of an SGD checkpoint with AdamW is refused" "--optimizer was 'sgd' in the checkpoint but is 'adamw' now" \
    --lr 0.1 --weight_decay 0.01
refused "resume with another --momentum is refused" "--momentum was '0.899999976' in the checkpoint but is '0.5' now" \
    --optimizer sgd --lr 0.1 --weight_decay 0.01 --momentum 0.5 --nesterov 1
refused "resume with another --nesterov is refused" "--nesterov was '1' in the checkpoint but is '0' now" \
    --optimizer sgd --lr 0.1 --weight_decay 0.01 --momentum 0.9
# a checkpoint from before --optimizer, --momentum and --nesterov existed lacks them: it resumes as their defaults (AdamW)
mkdir -p "$TMP/old"
cp -r "$TMP/ref/checkpoint-9" "$TMP/old/checkpoint-9" && cp "$TMP/ref.jsonl" "$TMP/old.jsonl" # steps 1-9 as before the resume
sed -i '/"optimizer": \|"momentum": \|"nesterov": /d' "$TMP/old/checkpoint-9/trainer_state.json"
! grep -q '"optimizer": ' "$TMP/old/checkpoint-9/trainer_state.json" && run "$TMP/old" 12 --resume "$TMP/old/checkpoint-9"
check "a checkpoint without the options added since resumes with their defaults" $? "$(tail -2 "$TMP/old.log")"
same_result "  and ends as the uninterrupted run, bit for bit" "$TMP/ref" "$TMP/old" adapter_model.safetensors
# An adapter's run of ARGS killed after step 4 and resumed == uninterrupted (what names it, dir
# its folders under $TMP); then its checkpoint 3 resumed with the options after message, which
# must be refused with that message
killed_resumed_refused() {
    local what=$1 dir=$2 message=$3 weights=adapter_model.safetensors; shift 3
    [[ " ${ARGS[*]} " == *" --full_finetune "* ]] && weights=model.safetensors
    run "$TMP/$dir-ref" 6
    LLAMA2TUNE_FAULT=step:4 run "$TMP/$dir" 6
    run "$TMP/$dir" 6 --resume "$TMP/$dir"
    same_result "$what killed after step 4 and resumed == uninterrupted" "$TMP/$dir-ref" "$TMP/$dir" "$weights"
    run "$TMP/$dir-changed" 6 --resume "$TMP/$dir-ref/checkpoint-3" "$@"
    local rc=$?
    [ $rc -eq 1 ] && grep -q -- "$message" "$TMP/$dir-changed.log"
    check "$what: its checkpoint resumed with $* is refused" $? "exit $rc: $(tail -2 "$TMP/$dir-changed.log")"
}
# QLoRA: the 4-bit base is quantized again from --model at the resume, the same bytes
ARGS=(--model $FIX/tiny_qlora --data $FIX/data.jsonl --max_seq_len 24 --batch_size 2 --lr 5e-3 --lora_dropout 0.1
      --lora_target_modules all-linear --quantize nf4 --save_every 3 --threads 1)
killed_resumed_refused QLoRA q "--double_quant was '1' in the checkpoint but is '0' now" --double_quant 0
# DoRA: the magnitude vectors are saved with A and B (peft's lora_magnitude_vector) and the AdamW
# state with them; the row norms they start from are not state (recomputed from the base each step)
ARGS=(--model $FIX/tiny_gqa --data $FIX/data.jsonl --max_seq_len 24 --batch_size 2 --lr 5e-3 --lora_dropout 0.1
      --lora_target_modules all-linear --save_every 3 --threads 1 --use_dora)
killed_resumed_refused DoRA dora "--use_dora was '1' in the checkpoint but is '0' now" --use_dora=0
# IA3: the vectors are saved as peft's ia3_l with adapter_config.json's targets and feedforward
# modules, and the AdamW state with them
ARGS=(--model $FIX/tiny_gqa --data $FIX/data.jsonl --max_seq_len 24 --batch_size 2 --lr 5e-3 --save_every 3 --threads 1
      --peft_method ia3 --ia3_target_modules all-linear --ia3_feedforward_modules gate_proj,down_proj)
killed_resumed_refused IA3 ia3 "--ia3_feedforward_modules was 'gate_proj,down_proj' in the checkpoint but is 'down_proj' now" \
    --ia3_feedforward_modules down_proj
# llama_adapter: the prompts and gates are saved as peft's adaption_prompt and adaption_gate with
# adapter_config.json's adapter_len and adapter_layers, the AdamW state with them; in chunks
ARGS=(--model $FIX/tiny_gqa --data $FIX/data.jsonl --max_seq_len 24 --batch_size 2 --lr 5e-3 --save_every 3 --threads 1
      --peft_method llama_adapter --adapter_len 4 --adapter_layers 2 --chunk_size 7)
killed_resumed_refused llama_adapter la "--adapter_len was '4' in the checkpoint but is '5' now" --adapter_len 5
# prefix: its keys and values are saved as peft's prompt_embeddings with adapter_config.json's
# num_virtual_tokens, the AdamW state with them; in chunks (the prefix is refilled at each first chunk)
ARGS=(--model $FIX/tiny_gqa --data $FIX/data.jsonl --max_seq_len 24 --batch_size 2 --lr 5e-3 --save_every 3 --threads 1
      --peft_method prefix --num_virtual_tokens 4 --chunk_size 7)
killed_resumed_refused prefix pre "--num_virtual_tokens was '4' in the checkpoint but is '5' now" --num_virtual_tokens 5
# --trainable_params embed,norm (LongLoRA's): the embedding and every norm are saved whole beside
# A and B (peft's modules_to_save), their AdamW state with the adapter's; on the tied model, whose
# head is the embedding
ARGS=(--model $FIX/tiny_tied --data $FIX/data.jsonl --max_seq_len 24 --batch_size 2 --lr 5e-3 --lora_dropout 0.1
      --save_every 3 --threads 1 --trainable_params embed,norm)
killed_resumed_refused "--trainable_params embed,norm" tp "--trainable_params norm: .*checkpoint-3 trains \\[\"embed_tokens\"" \
    --trainable_params norm
# AdamW8bit, full fine-tuning: the checkpoint holds the 8-bit tensors' codes and block absmax and
# the other tensors' fp32 moments, so the state comes back exactly
ARGS=(--model $FIX/tiny_gqa --data $FIX/data.jsonl --max_seq_len 24 --batch_size 2 --lr 2e-3 --full_finetune
      --optimizer adamw8bit --save_every 3 --threads 1)
run "$TMP/a8-ref" 6
LLAMA2TUNE_FAULT=step:4 run "$TMP/a8" 6
run "$TMP/a8" 6 --resume "$TMP/a8"
same_result "AdamW8bit full fine-tuning killed after step 4 and resumed == uninterrupted" "$TMP/a8-ref" "$TMP/a8" model.safetensors
cmp -s "$TMP/a8-ref/checkpoint-6/optimizer.safetensors" "$TMP/a8/checkpoint-6/optimizer.safetensors"
check "... and its final optimizer state (codes, absmax, fp32 moments) is the same bytes" $? "$(ls "$TMP/a8/checkpoint-6")"

# --pure_bf16 with AnyPrecisionAdamW and Kahan summation, gradient accumulation: the checkpoint
# holds the bf16 weights and the bf16 moments and compensation, so the state comes back exactly
ARGS=(--model $FIX/tiny_gqa --data $FIX/data.jsonl --max_seq_len 24 --batch_size 2 --gradient_accumulation_steps 2 --lr 2e-3
      --full_finetune --pure_bf16 1 --optimizer anyprecision --kahan_summation 1 --save_every 3 --threads 1)
killed_resumed_refused "pure bf16 (AnyPrecisionAdamW, Kahan)" pb "--kahan_summation was '1' in the checkpoint but is '0' now" \
    --kahan_summation 0
cmp -s "$TMP/pb-ref/checkpoint-6/optimizer.safetensors" "$TMP/pb/checkpoint-6/optimizer.safetensors"
check "... and its final optimizer state (bf16 moments, compensation) is the same bytes" $? "$(ls "$TMP/pb/checkpoint-6")"
exit $((fails > 0))
