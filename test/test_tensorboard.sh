#!/usr/bin/env bash
# --tensorboard_dir in both trainers: a run's event file read back by test/test_tensorboard's
# own reader (CRCs recomputed independently) holds the metrics file's values at every step,
# validation loss included, and the configuration; a folder that cannot be written stops
# the run before its first step, with a message. (TensorBoard's own reader:
# dev/reference/check_tensorboard.py.)
set -u
cd "$(dirname "$0")/.."
SUITE=tensorboard
source test/train_helpers.sh # BIN, TMP, FIX; check, run
EMU=${EMU_TRAINER-./train_llama2cu_emu}
CHECKER=$(dirname "$BIN")/test/test_tensorboard
ARGS=(--model $FIX/tiny_gqa --data $FIX/data.jsonl --max_seq_len 24 --batch_size 2 --val_split 0.25 --eval_every 2 --threads 1)
for bin in "$BIN" "$EMU"; do
    [ -n "$bin" ] && [ -x "$bin" ] || { echo "SKIP $SUITE: no emulated CUDA trainer in this configuration"; continue; }
    name=$(basename "$bin")
    BIN=$bin run "$TMP/$name" 5 --tensorboard_dir "$TMP/$name.tb"
    check "$name with --tensorboard_dir runs" $? "$(tail -3 "$TMP/$name.log")"
    "$CHECKER" --check "$TMP/$name.tb" "$TMP/$name.jsonl" | sed "s/^\(ok\|FAIL\) /\1 $SUITE: $name: /"
    [ "${PIPESTATUS[0]}" -eq 0 ]
    check "$name's event file checks out" $? ""
done
touch "$TMP/afile"
run "$TMP/bad" 5 --tensorboard_dir "$TMP/afile/tb"
[ $? -eq 1 ] && grep -q "error: --tensorboard_dir '$TMP/afile/tb': cannot write" "$TMP/bad.log" && ! grep -q "^step 1/" "$TMP/bad.log"
check "a --tensorboard_dir that cannot be written stops the run before its first step" $? "$(tail -2 "$TMP/bad.log")"
exit $((fails > 0))
