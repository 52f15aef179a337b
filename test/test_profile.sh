#!/usr/bin/env bash
# --profile_dir in both trainers: each trace checked by test/test_profile (support/json.h's
# parser; the checks themselves are tried on broken traces by test/test_profile alone):
# exactly the --profile_steps, every event inside its step, each layer's forward and backward
# per chunk and the head present, spans nested per track, durations >= 0; the CPU trainer's
# model spans cover its steps; sharded runs' gathers carry their bytes, one trace per rank;
# the emulated CUDA trainer's gather of layer i+1 starts on the collectives' stream before
# layer i's forward ends on the compute stream. The emulated build runs one stream's work at
# a time, so there this shows the order the work is issued in (what lets a GPU overlap the
# two), not the overlap itself, which only a GPU can show. A run that ends inside the window
# writes the steps it ran; a folder that cannot be written stops the run before its first step.
set -u
cd "$(dirname "$0")/.."
SUITE=profile
source test/train_helpers.sh # BIN, TMP, FIX; check, run
EMU=${EMU_TRAINER-./train_llama2cu_emu}
CHECKER=$(dirname "$BIN")/test/test_profile
# tiny_gqa: 2 layers; packed rows of 24 tokens, in chunks of 8 (3) or 12 (2)
ARGS=(--model $FIX/tiny_gqa --data $FIX/data.jsonl --max_seq_len 24 --batching packing --batch_size 2 --threads 1)
trace_ok() { # trace_ok NAME TRACE CHECKER-ARGS...: the checker's lines as this suite's
    local name=$1 trace=$2
    shift 2
    "$CHECKER" --check "$trace" "$@" | sed "s/^\(ok\|FAIL\) /\1 $SUITE: $name: /"
    [ "${PIPESTATUS[0]}" -eq 0 ]
    check "$name's trace checks out" $? ""
}

run "$TMP/cpu" 7 --chunk_size 8 --profile_dir "$TMP/cpu.prof" --profile_steps 2-6
check "train_llama2 with --profile_dir runs and says where the trace went" \
    $(grep -q "wrote the trace of steps 2-6 to $TMP/cpu.prof/" "$TMP/cpu.log"; echo $?) "$(tail -3 "$TMP/cpu.log")"
trace_ok train_llama2 "$TMP/cpu.prof/trace.json" 2 6 2 3 --coverage

run "$TMP/short" 3 --chunk_size 8 --profile_dir "$TMP/short.prof" --profile_steps 2-5
trace_ok "a run that ends at step 3 of 2-5" "$TMP/short.prof/trace.json" 2 3 2 3

timeout 300 dev/launch.sh 2 "$BIN" "${ARGS[@]}" --batch_size 1 --chunk_size 12 --max_steps 3 --output_dir "$TMP/w2" \
    --profile_dir "$TMP/w2.prof" --profile_steps 2-3 >"$TMP/w2.log" 2>&1
check "train_llama2 on 2 ranks with --profile_dir runs, a trace per rank" \
    $([ -f "$TMP/w2.prof/trace.rank0.json" ] && [ -f "$TMP/w2.prof/trace.rank1.json" ] && [ ! -e "$TMP/w2.prof/trace.json" ]; echo $?) \
    "$(ls "$TMP/w2.prof" 2>&1; tail -3 "$TMP/w2.log")"
for r in 0 1; do trace_ok "train_llama2 rank $r of 2" "$TMP/w2.prof/trace.rank$r.json" 2 3 2 2 --sharded; done

if [ -n "$EMU" ] && [ -x "$EMU" ]; then
    timeout 600 dev/launch.sh 2 "$EMU" "${ARGS[@]}" --batch_size 1 --chunk_size 12 --max_steps 3 --sharding_strategy FULL_SHARD \
        --collectives host --output_dir "$TMP/emu" --profile_dir "$TMP/emu.prof" --profile_steps 2-3 >"$TMP/emu.log" 2>&1
    check "the emulated CUDA trainer on 2 ranks with --profile_dir runs" $? "$(tail -3 "$TMP/emu.log")"
    for r in 0 1; do trace_ok "train_llama2cu_emu rank $r of 2" "$TMP/emu.prof/trace.rank$r.json" 2 3 2 2 --sharded --overlap; done
else
    echo "SKIP $SUITE: no emulated CUDA trainer in this configuration"
fi

touch "$TMP/afile"
run "$TMP/bad" 5 --profile_dir "$TMP/afile/prof"
[ $? -eq 1 ] && grep -q "error: --profile_dir '$TMP/afile/prof': cannot write there" "$TMP/bad.log" && ! grep -q "^step 1/" "$TMP/bad.log"
check "a --profile_dir that cannot be written stops the run before its first step" $? "$(tail -2 "$TMP/bad.log")"
exit $((fails > 0))
