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
#    emulated CUDA trainer == 2 ranks, for full fine-tuning and LoRA merged;
# 3. a byte-level BPE vocabulary (tiny_llama3_bpe, Llama-3's tokenizer.json): the fixture run of
#    check_gguf.py (BPE_FIX_FLAGS) read back by test_gguf --bpe (the vocabulary keys against the
#    committed ones, == the converter's; our forward against llama.cpp's and transformers' logits);
#    --resume's export the same bytes; the emulated CUDA trainer's too; LoRA merged: the same vocabulary;
# 4. chat templates: a folder's tokenizer_config.json's (sentencepiece) byte for byte, and with
#    --data_format chat and none in the folder, the run's family's (Llama-2, Llama-3);
# 5. refusals, before training and leaving no file: --export_gguf_adapter with DoRA and with full
#    fine-tuning, an unknown --gguf_type, a tokenizer.json that is not a byte-level BPE, a
#    pre-tokenizer regex llama.cpp does not know, ignore_merges against llama.cpp's, no merges, added
#    tokens that collide in the GGUF, a chat template that is not a string (or a list of named ones),
#    tokenizer_config.json not JSON, add_prefix_space not a boolean, QLoRA's --merge_adapter over 2
#    ranks; each with its message.
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
KQ1=(--model "$TMP/k256" --data $FIX/data.jsonl --max_seq_len 24 --threads 1 --full_finetune --max_steps 1
     --data_cache_dir "$TMP" --output_dir "$TMP/k256run")
KQ=("${KQ1[@]}" --batch_size 2)
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
# over 2 ranks (FULL_SHARD, the weights gathered to rank 0 a block of rows at a time): the same bytes
LAUNCH_GRACE=10 dev/launch.sh 2 "$BIN" "${KQ1[@]}" --batch_size 1 --resume "$TMP/k256run/checkpoint-1" \
    --gguf_type q4_k_m --export_gguf "$TMP/k256.w2.gguf" >"$TMP/k256.w2.log" 2>&1 && cmp -s "$TMP/k256.end.gguf" "$TMP/k256.w2.gguf"
check "k-quants: 2 ranks export the bytes of one process (q4_k_m)" $? "$(grep -m2 error "$TMP/k256.w2.log")"
# LoRA merged: the fine-tuned folder as the base of a LoRA run; its q4_k_m export (the adapter merged
# in) the same from the end of the run, from its checkpoint by both trainers, and over 2 ranks
KL=(--model "$TMP/k256run" --data $FIX/data.jsonl --max_seq_len 24 --threads 1 --lora_target_modules all-linear --max_steps 1
    --data_cache_dir "$TMP" --output_dir "$TMP/k256lora")
"$BIN" "${KL[@]}" --batch_size 2 --gguf_type q4_k_m --export_gguf "$TMP/k256lora.end.gguf" >"$TMP/k256lora.log" 2>&1
check "k-quants: a LoRA run exports q4_k_m with the adapter merged in" $? "$(tail -2 "$TMP/k256lora.log")"
export_both kquant_lora q4_k_m "$TMP/k256lora/checkpoint-1" "${KL[@]}" --batch_size 2
cmp -s "$TMP/k256lora.end.gguf" "$TMP/kquant_lora.cpu.gguf"
check "k-quants: LoRA merged, q4_k_m from --resume CHECKPOINT == the end of the run's" $? "$(cmp "$TMP/k256lora.end.gguf" "$TMP/kquant_lora.cpu.gguf" 2>&1)"
LAUNCH_GRACE=10 dev/launch.sh 2 "$BIN" "${KL[@]}" --batch_size 1 --resume "$TMP/k256lora/checkpoint-1" --gguf_type q4_k_m \
    --export_gguf "$TMP/k256lora.w2.gguf" >"$TMP/k256lora.w2.log" 2>&1 && cmp -s "$TMP/k256lora.end.gguf" "$TMP/k256lora.w2.gguf"
check "k-quants: LoRA merged over 2 ranks, the bytes of one process" $? "$(grep -m2 error "$TMP/k256lora.w2.log")"

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

# a byte-level BPE vocabulary: the fixture run of check_gguf.py (BPE_FIX_FLAGS)
BPE=(--model $FIX/tiny_llama3_bpe --data $FIX/data.jsonl --max_seq_len 24 --max_steps 4 --batch_size 2 --lr 2e-2 --threads 1
     --seed 7 --full_finetune --data_cache_dir "$TMP")
"$BIN" "${BPE[@]}" --output_dir "$TMP/bpe" --gguf_type f32 --export_gguf "$TMP/bpe.gguf" >"$TMP/bpe.log" 2>&1
check "tiny_llama3_bpe (tokenizer.json): train + --export_gguf (f32)" $? "$(tail -3 "$TMP/bpe.log")"
"$TEST_GGUF" --bpe "$TMP/bpe.gguf" | sed 's/^\(ok\|FAIL\|SKIP\) /\1 gguf: /'
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "FAIL gguf: test_gguf --bpe exited non-zero"; fails=$((fails + 1)); }
"$BIN" "${BPE[@]}" --output_dir "$TMP/bpe" --resume "$TMP/bpe/checkpoint-4" --gguf_type f32 --export_gguf "$TMP/bpe.resumed.gguf" >"$TMP/bpe.resumed.log" 2>&1
rc=$?
[ $rc -eq 0 ] && cmp -s "$TMP/bpe.gguf" "$TMP/bpe.resumed.gguf"
check "tiny_llama3_bpe: --resume CHECKPOINT --export_gguf: the run's file, byte for byte" $? "exit $rc: $(tail -2 "$TMP/bpe.resumed.log")"
export_both bpe q8_0 "$TMP/bpe/checkpoint-4" "${BPE[@]}" --output_dir "$TMP/bpe"
"$TEST_GGUF" --bpe-vocab "$TMP/bpe.cpu.gguf" | sed 's/^\(ok\|FAIL\) /\1 gguf: bpe q8_0: /'
[ "${PIPESTATUS[0]}" -eq 0 ] || fails=$((fails + 1))
"$BIN" "${BPE[@]/--full_finetune/--lora_target_modules=all-linear}" --max_steps 1 --output_dir "$TMP/bpe_lora" --export_gguf "$TMP/bpe_lora.gguf" >"$TMP/bpe_lora.log" 2>&1
check "tiny_llama3_bpe: LoRA, merged into --export_gguf (f16)" $? "$(tail -2 "$TMP/bpe_lora.log")"
"$TEST_GGUF" --bpe-vocab "$TMP/bpe_lora.gguf" | sed 's/^\(ok\|FAIL\) /\1 gguf: bpe LoRA: /'
[ "${PIPESTATUS[0]}" -eq 0 ] || fails=$((fails + 1))

# chat templates
model_copy() { rm -rf "$TMP/m"; cp -r "$FIX/$1" "$TMP/m"; }
CHAT=(--data $FIX/chat/chat.jsonl --data_format chat --max_seq_len 64 --max_steps 1 --batch_size 1 --threads 1 --full_finetune --data_cache_dir "$TMP")
model_copy tiny_gqa
printf '{"add_bos_token": true, "chat_template": "{%%- for m in messages -%%}{{ m[\x27content\x27] }}\\u00e9\\u0000\\n{%%- endfor -%%}"}\n' >"$TMP/m/tokenizer_config.json"
"$BIN" --model "$TMP/m" "${CHAT[@]}" --output_dir "$TMP/chat_sp" --export_gguf "$TMP/chat_sp.gguf" >"$TMP/chat_sp.log" 2>&1
check "a sentencepiece folder with a chat template: --data_format chat + --export_gguf" $? "$(tail -2 "$TMP/chat_sp.log")"
"$TEST_GGUF" --template "$TMP/chat_sp.gguf" "$TMP/m/tokenizer_config.json" | sed 's/^\(ok\|FAIL\) /\1 gguf: sentencepiece: /'
[ "${PIPESTATUS[0]}" -eq 0 ] || fails=$((fails + 1))
"$BIN" --model $FIX/tiny_gqa "${CHAT[@]}" --output_dir "$TMP/chat2" --export_gguf "$TMP/chat2.gguf" >"$TMP/chat2.log" 2>&1
check "Llama-2 (tiny_gqa, no template): --data_format chat + --export_gguf" $? "$(tail -2 "$TMP/chat2.log")"
"$TEST_GGUF" --chat "$TMP/chat2.gguf" llama2 | sed 's/^\(ok\|FAIL\) /\1 gguf: Llama-2: /'
[ "${PIPESTATUS[0]}" -eq 0 ] || fails=$((fails + 1))
model_copy tiny_llama3_bpe
sed -i '/"chat_template"/d' "$TMP/m/tokenizer_config.json"
"$BIN" --model "$TMP/m" "${CHAT[@]}" --output_dir "$TMP/chat3" --export_gguf "$TMP/chat3.gguf" >"$TMP/chat3.log" 2>&1
check "Llama-3 (tiny_llama3_bpe, no template): --data_format chat + --export_gguf" $? "$(tail -2 "$TMP/chat3.log")"
"$TEST_GGUF" --chat "$TMP/chat3.gguf" llama3 | sed 's/^\(ok\|FAIL\) /\1 gguf: Llama-3: /'
[ "${PIPESTATUS[0]}" -eq 0 ] || fails=$((fails + 1))

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
printf '{"model": {"type": "WordPiece", "vocab": {"[UNK]": 0, "a": 1}}}\n' >"$TMP/wordpiece.json"
expect_error "a tokenizer.json that is not byte-level BPE" "wordpiece.json: pre_tokenizer is null; only Llama-3's .* and GPT-2's" \
    "${RUN[@]}" --tokenizer "$TMP/wordpiece.json" --export_gguf "$TMP/x.gguf"
# QLoRA's merge over several ranks: refused before training (the 4-bit layers are not gathered)
LAUNCH_GRACE=10 dev/launch.sh 2 "$BIN" --model $FIX/tiny_qlora --data $FIX/data.jsonl --max_seq_len 24 --batch_size 2 \
    --threads 1 --max_steps 1 --quantize nf4 --merge_adapter --data_cache_dir "$TMP" --output_dir "$TMP/qlora2" >"$TMP/err.out" 2>"$TMP/err"
rc=$?
[ $rc -ne 0 ] && grep -q -- "--merge_adapter with --quantize over 2 ranks is not supported yet" "$TMP/err" && [ ! -e "$TMP/qlora2/merged" ]
check "refused: --merge_adapter with --quantize over 2 ranks" $? "exit $rc: $(head -c 300 "$TMP/err")"
# bad folders: tiny_llama3_bpe with one file changed (bpe_edit SED-EXPRESSION FILE)
BAD=(--model "$TMP/m" --data $FIX/data.jsonl --max_seq_len 24 --max_steps 1 --batch_size 2 --full_finetune --data_cache_dir "$TMP"
     --output_dir "$TMP/refused" --export_gguf "$TMP/x.gguf")
bpe_edit() { model_copy tiny_llama3_bpe; sed -i "$1" "$TMP/m/$2"; }
bpe_edit 's/\\\\p{N}{1,3}/\\\\p{N}+/' tokenizer.json
expect_error "a pre-tokenizer regex llama.cpp does not know, named whole" \
    "pattern.Regex is \"\\(\\?i:'s\\|.*\\|\\\\p\\{N\\}\\+\\| \\?.*\\\\s\\+\": not Llama-3's \\(llama.cpp's \"llama-bpe\"\\)" "${BAD[@]}"
bpe_edit 's/"ignore_merges": true/"ignore_merges": false/' tokenizer.json
expect_error "Llama-3's regex without ignore_merges" "tokenizer.json: model.ignore_merges is false with Llama-3's pre-tokenizer, but llama.cpp's llama-bpe" "${BAD[@]}"
bpe_edit '/"merges": \[/,/^    \]/c\    "merges": []' tokenizer.json
expect_error "no merges" "tokenizer.json: model.merges is missing or empty: llama.cpp cannot load a BPE vocabulary without merges" "${BAD[@]}"
bpe_edit 's/"content": "<tool>"/"content": "\\u0120zq"/' tokenizer.json # (written " zq" as the converter decodes it)
sed -i '0,/^  \],/s//    ,{"id": 412, "content": " zq", "single_word": false, "lstrip": false, "rstrip": false, "normalized": true, "special": false}\n  ],/' \
    "$TMP/m/tokenizer.json"
expect_error "added tokens that collide in the GGUF" 'tokens 411 and 412 are both " zq" in the GGUF vocabulary' "${BAD[@]}"
bpe_edit 's/"chat_template": ".*",$/"chat_template": 7,/' tokenizer_config.json
expect_error "a chat template that is not a string" "tokenizer_config.json: chat_template is number; only a string" "${BAD[@]}"
bpe_edit 's/"chat_template": ".*",$/"chat_template": [{"name": "default", "template": "x"}],/' tokenizer_config.json
expect_error "named chat templates" "tokenizer_config.json: chat_template is array; .*a list of named templates is not" "${BAD[@]}"
bpe_edit 's/"chat_template"/chat_template"/' tokenizer_config.json
expect_error "tokenizer_config.json not JSON" "tokenizer_config.json: invalid JSON" "${BAD[@]}"
bpe_edit 's/"model_max_length"/"add_prefix_space": "yes", "model_max_length"/' tokenizer_config.json
expect_error "add_prefix_space not a boolean" "tokenizer_config.json: add_prefix_space is not true or false" "${BAD[@]}"
[ ! -e "$TMP/x.gguf" ] && ! ls "$TMP"/x.gguf.tmp.* >/dev/null 2>&1 && [ ! -e "$TMP/refused/checkpoint-1" ]
check "a refused export leaves no file and trains nothing" $? "$(ls "$TMP" "$TMP/refused" 2>&1)"
exit $((fails > 0))
