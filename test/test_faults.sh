#!/usr/bin/env bash
# Faults, and nothing lost to them:
#   - a disk that fills up while a checkpoint is written (a size-limited file:
#     `ulimit -f`, with SIGXFSZ ignored so that write() fails with EFBIG): the run
#     stops naming the file and the error, the previous checkpoint is intact, and
#     resuming from it gives the uninterrupted run bit for bit;
#   - a metrics file on a full disk (/dev/full) stops the run with a message;
#   - a checkpoint damaged after it was saved (flipped bytes, a truncated file)
#     is refused by --resume, naming the file;
#   - NaN gradients (injected with LLAMA2TUNE_FAULT=nan:<steps>): the step is
#     skipped with the weights, the AdamW moments and step count unchanged, and
#     reported; --max_bad_steps in a row stop the run, saving nothing; an
#     optimizer state that overflowed (gradients scaled by 1e30, injected) is not saved.
set -u
SUITE=faults
source test/train_helpers.sh # BIN, TMP, FIX; check, run, start, trajectory, same_result

cp $FIX/data.jsonl "$TMP/data.jsonl" # its token cache goes next to it, in TMP
ARGS=(--model $FIX/tiny_gqa --data "$TMP/data.jsonl" --max_seq_len 24 --batch_size 2 --lr 5e-3 --lora_dropout 0.1
      --lora_target_modules all-linear --save_every 3 --keep_checkpoints 2 --threads 1)

# --- a full disk during a checkpoint
run "$TMP/ref" 9
check "an uninterrupted run finishes" $? "$(tail -3 "$TMP/ref.log")"
LLAMA2TUNE_FAULT=step:4 run "$TMP/a" 9 # killed after step 4: checkpoint-3 is the run's first
cp -r "$TMP/a/checkpoint-3" "$TMP/checkpoint-3.saved"
# every file is limited to a size between the adapter's and the optimizer state's
# (twice as large), so the next checkpoint fails partway through optimizer.safetensors
adapter=$(stat -c %s "$TMP/a/checkpoint-3/adapter_model.safetensors")
optim=$(stat -c %s "$TMP/a/checkpoint-3/optimizer.safetensors")
blocks=$(( (adapter + optim) / 2 / 1024 )) # bash's ulimit -f counts 1024-byte blocks
( trap '' XFSZ; ulimit -f $blocks; run "$TMP/a" 9 --resume "$TMP/a" )
rc=$?
[ $rc -eq 1 ] && grep -q "optimizer.safetensors.*File too large" "$TMP/a.log" && grep -q "writing checkpoint step 6 failed" "$TMP/a.log"
check "a full disk during checkpoint 6 stops the run (exit 1), naming the file and the error" $? "exit $rc: $(grep error "$TMP/a.log")"
[ ! -e "$TMP/a/checkpoint-6" ] && [ ! -e "$TMP/a/checkpoint-6.tmp" ] && diff -r "$TMP/checkpoint-3.saved" "$TMP/a/checkpoint-3" >/dev/null
check "checkpoint 3 is intact and checkpoint 6 left nothing behind" $? "$(ls "$TMP/a")"
run "$TMP/a" 9 --resume "$TMP/a"
check "resume from checkpoint 3 after the full disk exits 0" $? "$(tail -3 "$TMP/a.log")"
grep -q "resumed from $TMP/a/checkpoint-3 at step 3" "$TMP/a.log"
check "the resume starts from checkpoint 3" $? "$(grep resumed "$TMP/a.log")"
same_result "full disk, then resumed == uninterrupted, bit for bit" "$TMP/ref" "$TMP/a" adapter_model.safetensors

# --- the metrics file on a full disk
"$BIN" "${ARGS[@]}" --max_steps 2 --output_dir "$TMP/full" --metrics_file /dev/full >"$TMP/full.log" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q "metrics_file '/dev/full': writing failed: No space left on device" "$TMP/full.log"
check "a metrics file on a full disk stops the run with a message" $? "exit $rc: $(tail -2 "$TMP/full.log")"

# --- damaged checkpoints are refused (each a fresh copy of the good checkpoint 9)
flip() { # flip FILE OFFSET: inverts one byte in place
    local b
    b=$(od -An -tu1 -j "$2" -N1 "$1" | tr -d ' ')
    printf "\\$(printf %o $((255 - b)))" | dd of="$1" bs=1 seek="$2" conv=notrunc status=none
}
damaged() { # damaged NAME FILE COMMAND...: COMMAND damages FILE in a copy of checkpoint 9; the resume must refuse it
    local name=$1 file=$2; shift 2
    rm -rf "$TMP/bad"; cp -r "$TMP/ref/checkpoint-9" "$TMP/bad"
    "$@" "$TMP/bad/$file"
    run "$TMP/badrun" 12 --resume "$TMP/bad"
    local rc=$?
    [ $rc -eq 1 ] && grep -q "error: $TMP/bad/$file: .*damaged or changed since\|error: $TMP/bad/$file: cannot read" "$TMP/badrun.log" &&
        ! grep -q "^step" "$TMP/badrun.log"
    check "$name is refused, naming the file" $? "exit $rc: $(grep error "$TMP/badrun.log")"
}
mid() { echo $(( $(stat -c %s "$1") / 2 )); }
flip_mid() { flip "$1" "$(mid "$1")"; }
truncate_mid() { truncate -s "$(mid "$1")" "$1"; }
damaged "a flipped byte in the AdamW moments (optimizer.safetensors)" optimizer.safetensors flip_mid
damaged "a truncated optimizer.safetensors" optimizer.safetensors truncate_mid
damaged "a flipped byte in the adapter weights" adapter_model.safetensors flip_mid
damaged "a missing adapter_config.json" adapter_config.json rm
run "$TMP/badrun" 12 --resume "$TMP/ref/checkpoint-9"
check "the undamaged checkpoint 9 resumes" $? "$(tail -3 "$TMP/badrun.log")"

# --- NaN gradients: one is skipped
ARGS=(--model $FIX/tiny_gqa --data "$TMP/data.jsonl" --max_seq_len 24 --batch_size 2 --lr 5e-3 --save_every 1 --keep_checkpoints 0 --threads 1)
LLAMA2TUNE_FAULT=nan:4 run "$TMP/n" 8
check "a run with a NaN gradient at step 4 finishes (exit 0)" $? "$(tail -3 "$TMP/n.log")"
cmp -s "$TMP/n/checkpoint-3/adapter_model.safetensors" "$TMP/n/checkpoint-4/adapter_model.safetensors" &&
    cmp -s "$TMP/n/checkpoint-3/optimizer.safetensors" "$TMP/n/checkpoint-4/optimizer.safetensors"
check "step 4 changed neither the weights nor the AdamW moments" $? "checkpoints 3 and 4 differ"
grep -q '"optimizer_step": 3,' "$TMP/n/checkpoint-4/trainer_state.json" && grep -q '"optimizer_step": 4,' "$TMP/n/checkpoint-5/trainer_state.json"
check "step 4 did not advance AdamW's step count; step 5 did" $? "$(grep optimizer_step "$TMP/n"/checkpoint-[45]/trainer_state.json)"
! cmp -s "$TMP/n/checkpoint-4/adapter_model.safetensors" "$TMP/n/checkpoint-5/adapter_model.safetensors" &&
    [ "$(grep -c '"loss": [0-9]' "$TMP/n.jsonl")" -eq 8 ]
check "training goes on after it (step 5 updates the weights; every loss is finite)" $? "$(cat "$TMP/n.jsonl" | cut -c1-80)"
grep -q '"step": 4, .*"grad_norm": null, .*"skipped": 1, "skipped_total": 1,' "$TMP/n.jsonl" &&
    grep -q '"step": 8, .*"skipped": 0, "skipped_total": 1,' "$TMP/n.jsonl" && grep -q '"step": 3, .*"skipped": 0, "skipped_total": 0,' "$TMP/n.jsonl" &&
    grep -q '^step 4/8 .*skipped: NaN or inf loss or grad norm (1 skipped so far)' "$TMP/n.log"
check "the skipped step is reported in the step line and the metrics file, with a running count" $? "$(grep -h '"step": [48],\|^step 4/' "$TMP/n.jsonl" "$TMP/n.log")"
# the data moves on over a skipped step: steps 5-8 see what they see in a run without the fault
run "$TMP/nref" 8
diff <(sed -n 's/.*"step": \([5-8]\), "loss": [^,]*, "lr": \([^,]*\), .*"tokens": \([0-9]*\),.*/\1 \2 \3/p' "$TMP/n.jsonl") \
     <(sed -n 's/.*"step": \([5-8]\), "loss": [^,]*, "lr": \([^,]*\), .*"tokens": \([0-9]*\),.*/\1 \2 \3/p' "$TMP/nref.jsonl") >/dev/null
check "the learning rate schedule and the data position advance over a skipped step" $? "$(diff "$TMP/n.jsonl" "$TMP/nref.jsonl" | head -4)"

# --- NaN gradients: too many in a row stop the run
LLAMA2TUNE_FAULT=nan:5-100 run "$TMP/m" 8 --save_every 2 --max_bad_steps 3
rc=$?
[ $rc -eq 1 ] && grep -q "error: 3 steps in a row (up to step 7) had a NaN or infinite loss or gradient norm" "$TMP/m.log" &&
    grep -q "learning rate too high" "$TMP/m.log" && grep -q "bad data" "$TMP/m.log" && ! grep -q "^step 8/" "$TMP/m.log"
check "3 bad steps in a row (--max_bad_steps 3) stop the run at step 7 (exit 1) naming likely causes" $? "exit $rc: $(grep error "$TMP/m.log")"
[ "$(ls "$TMP/m" | tr '\n' ' ')" = "checkpoint-2 checkpoint-4 checkpoint-6 " ] &&
    cmp -s "$TMP/m/checkpoint-4/adapter_model.safetensors" "$TMP/m/checkpoint-6/adapter_model.safetensors" &&
    cmp -s "$TMP/m/checkpoint-4/adapter_model.safetensors" "$TMP/nref/checkpoint-4/adapter_model.safetensors"
check "nothing is saved after the bad steps: the newest checkpoint (6) holds step 4's good weights (those of a run without faults)" $? "$(ls "$TMP/m")"
run "$TMP/m" 8 --save_every 2 --max_bad_steps 3 --resume "$TMP/m"
rc=$?
[ $rc -eq 0 ] && grep -q "resumed from $TMP/m/checkpoint-6 at step 6" "$TMP/m.log" && [ -f "$TMP/m/adapter_model.safetensors" ]
check "the last checkpoint resumes and finishes once the fault is gone" $? "exit $rc: $(tail -3 "$TMP/m.log")"

# --- gradients scaled by 1e30 without clipping: AdamW's second moment (g^2) overflows to inf, which is never saved
LLAMA2TUNE_FAULT=huge:3 run "$TMP/w" 6 --grad_clip 0
rc=$?
[ $rc -eq 1 ] && grep -q "error: not saving checkpoint 3: the trainable weights or the optimizer state hold NaN or inf" "$TMP/w.log" &&
    [ "$(ls "$TMP/w" | tr '\n' ' ')" = "checkpoint-1 checkpoint-2 " ]
check "an overflowed AdamW state is not saved: the run stops at step 3 (exit 1), checkpoints 1-2 intact" $? "exit $rc: $(grep error "$TMP/w.log"); $(ls "$TMP/w")"
exit $((fails > 0))
