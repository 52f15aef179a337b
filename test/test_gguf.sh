#!/usr/bin/env bash
# --export_gguf and --export_gguf_adapter (docs/export.md), end to end, no Python:
# 1. the CPU trainer trains the fixture run of dev/reference/check_gguf.py (tiny_gqa, LoRA
#    all-linear, 4 steps) and writes both GGUF files (f32); test/test_gguf reads them back:
#    the structure, every key against the committed file (== llama.cpp's converter's), and
#    our forward on their weights against the committed logits of transformers and llama.cpp;
# 2. --resume CHECKPOINT alone exports that checkpoint (and trains nothing): the same bytes
#    as the end of the run; with the emulated CUDA trainer (train_llama2cu_emu) the same bytes
#    as the CPU trainer's, for LoRA (q8_0) and full fine-tuning (tiny_tied, bf16; f32 and q8_0
#    read back in small blocks of rows: LLAMA2TUNE_STAGING_BYTES); the types
#    of --gguf_type; QLoRA's export (the 4-bit base dequantized) writes every weight, and
#    its --merge_adapter folder exports to the same bytes; the k-quants (q4_k_m; q5_k_m and
#    q6_k with the emulated trainer): the end of a run == its checkpoint == 2 threads == the
#    emulated CUDA trainer;
# 3. refusals: --export_gguf_adapter with DoRA and with full fine-tuning, an unknown
#    --gguf_type, a tokenizer.json (byte-level BPE or not), QLoRA's --merge_adapter over 2
#    ranks, each with its message.
set -u
cd "$(dirname "$0")/.."
SUITE=gguf
source test/train_helpers.sh # BIN, TMP, FIX, check, fails
EMU_BIN=${EMU_BIN-./train_llama2cu_emu} # set empty (make test): none, its exports skipped
TEST_GGUF="$(dirname "$BIN")/test/test_gguf"
export OMP_NUM_THREADS=1
# the flags of check_gguf.py's fixture run (GGUF_FIX_FLAGS)
FIXRUN=(--model $FIX/tiny_gqa --data $FIX/data.jsonl --max_seq_len 24 --max_steps 4 --batch_size 2 --lr 2e-2 --threads 1
        --seed 7 --lora_target_modules all-linear --lora_dropout 0 --data_cache_dir "$TMP")

"$BIN" "${FIXRUN[@]}" --output_dir "$TMP/run" --gguf_type f32 --export_gguf "$TMP/run.gguf" \
    --export_gguf_adapter "$TMP/run.adapter.gguf" >"$TMP/run.log" 2>&1
check "train + --export_gguf + --export_gguf_adapter (f32)" $? "$(tail -3 "$TMP/run.log")"
"$TEST_GGUF" "$TMP/run.gguf" "$TMP/run.adapter.gguf" | sed 's/^\(ok\|FAIL\|SKIP\) /\1 gguf: /'
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "FAIL gguf: test_gguf exited non-zero"; fails=$((fails + 1)); }

# --resume alone: the checkpoint's export, nothing trained
"$BIN" "${FIXRUN[@]}" --output_dir "$TMP/run" --resume "$TMP/run/checkpoint-4" --gguf_type f32 \
    --export_gguf "$TMP/resumed.gguf" --export_gguf_adapter "$TMP/resumed.adapter.gguf" >"$TMP/resumed.log" 2>&1
rc=$?
[ $rc -eq 0 ] && ! grep -q "^step " "$TMP/resumed.log" && cmp -s "$TMP/run.gguf" "$TMP/resumed.gguf" &&
    cmp -s "$TMP/run.adapter.gguf" "$TMP/resumed.adapter.gguf"
check "--resume CHECKPOINT --export_gguf: the run's files, byte for byte, no step trained" $? "exit $rc: $(tail -2 "$TMP/resumed.log")"

# the two trainers export the same bytes (the emulated CUDA build runs the CUDA trainer's host code)
export_both() { # export_both NAME TYPE CHECKPOINT ARGS...: both trainers export CHECKPOINT; same bytes
    local name=$1 type=$2 ckpt=$3
    shift 3
    local extra=()
    [ "$name" = lora ] && extra=(--export_gguf_adapter "$TMP/$name.cpu.adapter.gguf")
    "$BIN" "$@" --resume "$ckpt" --gguf_type "$type" --export_gguf "$TMP/$name.cpu.gguf" "${extra[@]}" >"$TMP/$name.cpu.log" 2>&1
    check "$name: --export_gguf --gguf_type $type from a checkpoint" $? "$(tail -2 "$TMP/$name.cpu.log")"
    "$TEST_GGUF" --types "$TMP/$name.cpu.gguf" "$type" | sed "s/^\(ok\|FAIL\) /\1 gguf: $name: /"
    [ "${PIPESTATUS[0]}" -eq 0 ] || fails=$((fails + 1))
    if [ ! -x "$EMU_BIN" ]; then
        echo "SKIP gguf: $name: the emulated CUDA trainer's export: no ${EMU_BIN:-emulated trainer in this configuration} (make train_llama2cu_emu)"
        return
    fi
    [ "$name" = lora ] && extra=(--export_gguf_adapter "$TMP/$name.emu.adapter.gguf")
    LLAMA2TUNE_STAGING_BYTES=${STAGING:-0} "$EMU_BIN" "$@" --precision fp32 --resume "$ckpt" --gguf_type "$type" \
        --export_gguf "$TMP/$name.emu.gguf" "${extra[@]}" >"$TMP/$name.emu.log" 2>&1
    local rc=$?
    [ $rc -eq 0 ] && cmp -s "$TMP/$name.cpu.gguf" "$TMP/$name.emu.gguf" &&
        { [ "$name" != lora ] || cmp -s "$TMP/$name.cpu.adapter.gguf" "$TMP/$name.emu.adapter.gguf"; }
    check "$name: train_llama2 and train_llama2cu_emu export the same GGUF bytes ($type)" $? "exit $rc: $(tail -2 "$TMP/$name.emu.log")"
}
export_both lora q8_0 "$TMP/run/checkpoint-4" "${FIXRUN[@]}" --output_dir "$TMP/run"
FULL=(--model $FIX/tiny_tied --data $FIX/data.jsonl --max_seq_len 24 --batch_size 2 --threads 1 --full_finetune --data_cache_dir "$TMP")
"$BIN" "${FULL[@]}" --max_steps 1 --output_dir "$TMP/full" >"$TMP/full.log" 2>&1
check "full fine-tuning (tied) run" $? "$(tail -2 "$TMP/full.log")"
export_both full bf16 "$TMP/full/checkpoint-1" "${FULL[@]}" --max_steps 1 --output_dir "$TMP/full"
# the CUDA trainer reads its weights back a staging buffer of rows a fill (support/gguf.h's fill_bytes):
# 1000 bytes is 5 rows of 48 (3 of 80), so the blocks end mid-tensor and q/k's within a head, whose rows
# GGUF permutes, fall back to a row a fill; 3072 is a head's 16 rows of 48, so q/k's blocks are whole heads
STAGING=1000 export_both full_f32 f32 "$TMP/full/checkpoint-1" "${FULL[@]}" --max_steps 1 --output_dir "$TMP/full"
STAGING=3072 export_both full_q8_0 q8_0 "$TMP/full/checkpoint-1" "${FULL[@]}" --max_steps 1 --output_dir "$TMP/full"

# the k-quants: a model whose rows are multiples of 256 (random weights, one step of full fine-tuning),
# exported as q4_k_m at the end of the run, from its checkpoint (the same bytes), with 2 threads
# (the same bytes: rows are encoded on their own), by both trainers (the same bytes; the emulated
# one reads its weights back 64 rows a fill, a head of q/k: blocks of rows encoded in parallel);
# in the full suite (the emulated trainer) q5_k_m and q6_k too, 16 rows a fill (q/k a row a fill). The types are gguf_kquant_type's, which test_gguf checks against llama-quantize's.
mkdir -p "$TMP/k256"
sed -e 's/"hidden_size": 64/"hidden_size": 256/' -e 's/"intermediate_size": 96/"intermediate_size": 512/' \
    -e 's/"head_dim": 16/"head_dim": 64/' $FIX/tiny_gqa/config.json >"$TMP/k256/config.json"
cp $FIX/tiny_gqa/tokenizer.model "$TMP/k256/"
KQ=(--model "$TMP/k256" --data $FIX/data.jsonl --max_seq_len 24 --batch_size 2 --threads 1 --full_finetune --max_steps 1
    --data_cache_dir "$TMP" --output_dir "$TMP/k256run")
"$BIN" "${KQ[@]}" --random_init --gguf_type q4_k_m --export_gguf "$TMP/k256.end.gguf" >"$TMP/k256.log" 2>&1
check "k-quants: a run with rows of 256 exports q4_k_m" $? "$(tail -2 "$TMP/k256.log")"
STAGING=65536 export_both kquant q4_k_m "$TMP/k256run/checkpoint-1" "${KQ[@]}"
cmp -s "$TMP/k256.end.gguf" "$TMP/kquant.cpu.gguf"
check "k-quants: q4_k_m from --resume CHECKPOINT == the end of the run's, byte for byte" $? "$(cmp "$TMP/k256.end.gguf" "$TMP/kquant.cpu.gguf" 2>&1)"
OMP_NUM_THREADS=2 "$BIN" "${KQ[@]}" --threads 2 --resume "$TMP/k256run/checkpoint-1" --gguf_type q4_k_m \
    --export_gguf "$TMP/k256.t2.gguf" >"$TMP/k256.t2.log" 2>&1 && cmp -s "$TMP/k256.end.gguf" "$TMP/k256.t2.gguf"
check "k-quants: --threads 2 writes the bytes of --threads 1" $? "$(tail -2 "$TMP/k256.t2.log")"
if [ -x "$EMU_BIN" ]; then
    for type in q5_k_m q6_k; do STAGING=16384 export_both "kquant_$type" $type "$TMP/k256run/checkpoint-1" "${KQ[@]}"; done
fi

# QLoRA: the 4-bit base dequantized and the adapter merged in, as GGUF and as the merged folder
# (--merge_adapter): that folder, exported as it is, gives the bytes of the run's export
"$BIN" --model $FIX/tiny_qlora --data $FIX/data.jsonl --max_seq_len 24 --batch_size 2 --threads 1 --max_steps 1 \
    --quantize nf4 --data_cache_dir "$TMP" --output_dir "$TMP/qlora" --export_gguf "$TMP/qlora.gguf" --merge_adapter >"$TMP/qlora.log" 2>&1
check "QLoRA (nf4) run with --export_gguf and --merge_adapter" $? "$(tail -2 "$TMP/qlora.log")"
"$TEST_GGUF" --types "$TMP/qlora.gguf" f16 | sed "s/^\(ok\|FAIL\) /\1 gguf: qlora: /"
[ "${PIPESTATUS[0]}" -eq 0 ] || fails=$((fails + 1))
"$BIN" --model "$TMP/qlora/merged" --data $FIX/data.jsonl --max_seq_len 24 --batch_size 2 --threads 1 --max_steps 0 \
    --full_finetune --data_cache_dir "$TMP" --output_dir "$TMP/qlora_merged" --export_gguf "$TMP/qlora.merged.gguf" >"$TMP/qlora.merged.log" 2>&1
rc=$?
[ $rc -eq 0 ] && cmp -s "$TMP/qlora.gguf" "$TMP/qlora.merged.gguf"
check "QLoRA --merge_adapter: OUTPUT/merged exported == the run's GGUF (the dequantized base + the adapter)" $? "exit $rc: $(tail -2 "$TMP/qlora.merged.log")"

# refusals
expect_error() { # expect_error NAME PATTERN ARGS...: exit 1 or 2, stderr matching PATTERN
    local name=$1 pattern=$2
    shift 2
    "$BIN" "$@" >"$TMP/err.out" 2>"$TMP/err"
    local rc=$?
    [ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -qE -- "$pattern" "$TMP/err"
    check "refused: $name" $? "exit $rc: $(head -c 300 "$TMP/err")"
}
RUN=(--model $FIX/tiny_gqa --data $FIX/data.jsonl --max_seq_len 24 --max_steps 1 --batch_size 2 --data_cache_dir "$TMP" --output_dir "$TMP/refused")
expect_error "--export_gguf_adapter with DoRA" "DoRA cannot be expressed as a llama.cpp adapter" "${RUN[@]}" --use_dora --export_gguf_adapter "$TMP/x.gguf"
expect_error "--export_gguf_adapter with --full_finetune" "--export_gguf_adapter writes a LoRA adapter" "${RUN[@]}" --full_finetune --export_gguf_adapter "$TMP/x.gguf"
expect_error "unknown --gguf_type" "--gguf_type: 'q4_0' is not one of f32, f16, bf16, q8_0" "${RUN[@]}" --gguf_type q4_0 --export_gguf "$TMP/x.gguf"
expect_error "a byte-level BPE tokenizer.json" "is a tokenizer.json: the GGUF vocabulary is written from a sentencepiece tokenizer.model only" \
    "${RUN[@]}" --tokenizer $FIX/tokenizer/bpe_llama3.json --export_gguf "$TMP/x.gguf"
printf '{"model": {"type": "WordPiece", "vocab": {"[UNK]": 0, "a": 1}}}\n' >"$TMP/wordpiece.json"
expect_error "a tokenizer.json that is not byte-level BPE" "is a tokenizer.json: the GGUF vocabulary is written from a sentencepiece" \
    "${RUN[@]}" --tokenizer "$TMP/wordpiece.json" --export_gguf "$TMP/x.gguf"
# QLoRA's merge over several ranks: refused before training (the 4-bit layers are not gathered)
LAUNCH_GRACE=10 dev/launch.sh 2 "$BIN" --model $FIX/tiny_qlora --data $FIX/data.jsonl --max_seq_len 24 --batch_size 2 \
    --threads 1 --max_steps 1 --quantize nf4 --merge_adapter --data_cache_dir "$TMP" --output_dir "$TMP/qlora2" >"$TMP/err.out" 2>"$TMP/err"
rc=$?
[ $rc -ne 0 ] && grep -q -- "--merge_adapter with --quantize over 2 ranks is not supported yet" "$TMP/err" && [ ! -e "$TMP/qlora2/merged" ]
check "refused: --merge_adapter with --quantize over 2 ranks" $? "exit $rc: $(head -c 300 "$TMP/err")"
[ ! -e "$TMP/x.gguf" ] && ! ls "$TMP"/x.gguf.tmp.* >/dev/null 2>&1
check "a refused export leaves no file" $? "$(ls "$TMP")"
exit $((fails > 0))
