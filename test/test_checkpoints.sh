#!/usr/bin/env bash
# The checkpoint formats users download (docs/model.md, "Checkpoint formats"), read
# by support/weights.h: each folder holds the same weights as a safetensors
# fixture, so a run from it must equal the run from safetensors bit for bit (the
# same floats reach the same code: no tolerance). Meta's original layout
# (test/fixtures/meta/tiny_gqa: 2 model-parallel files, wq and wk rows in Meta's
# order; dev/reference/make_meta_fixtures.py) against tiny_gqa, with LoRA, full
# fine-tuning, 2 ranks reading their own shards of the reassembled tensors, and the
# emulated CUDA trainer; pytorch_model.bin folders (dev/reference/make_torch_fixtures.py)
# against the same weights in safetensors. Then folders that do not add up are
# refused with a message naming the file and the problem.
set -u
cd "$(dirname "$0")/.."
SUITE=checkpoints
source test/train_helpers.sh # BIN, TMP, FIX; check, run, same_result
EMU=${EMU_TRAINER-./train_llama2cu_emu} # empty (SANITIZE=1 builds no emulated trainer): skipped
ARGS=(--data $FIX/data.jsonl --max_seq_len 24 --batch_size 2 --lr 5e-3 --threads 1)
LORA=(--lora_target_modules all-linear)

# Meta's layout
run "$TMP/hf" 4 --model $FIX/tiny_gqa "${LORA[@]}"
check "LoRA from tiny_gqa's safetensors runs" $? "$(tail -3 "$TMP/hf.log")"
run "$TMP/meta" 4 --model $FIX/meta/tiny_gqa "${LORA[@]}"
check "LoRA from Meta's layout runs" $? "$(tail -3 "$TMP/meta.log")"
same_result "LoRA from Meta's layout (2 files) == from safetensors, bit for bit" "$TMP/hf" "$TMP/meta" adapter_model.safetensors
run "$TMP/hf_full" 3 --model $FIX/tiny_gqa --full_finetune
run "$TMP/meta_full" 3 --model $FIX/meta/tiny_gqa --full_finetune
same_result "full fine-tuning from Meta's layout == from safetensors, bit for bit" "$TMP/hf_full" "$TMP/meta_full" model.safetensors
# a saved model from Meta's layout is a Hugging Face folder: its config.json is written,
# and the saved model is read back as the same weights
run "$TMP/meta_full2" 3 --model "$TMP/meta_full" --full_finetune --lr 0
cmp -s "$TMP/meta_full/model.safetensors" "$TMP/meta_full2/model.safetensors"
check "full fine-tuning's output from Meta's layout is a Hugging Face folder that loads" $? "$(tail -3 "$TMP/meta_full2.log")"

# a GGUF export from Meta's layout writes the config.json its converter would (docs/export.md):
# the same keys and tensors as from the safetensors folder, one value apart (context_length:
# 4096 for Meta's Llama-2, tiny_gqa's config.json says 128)
run "$TMP/hf_gguf" 1 --model $FIX/tiny_gqa "${LORA[@]}" --export_gguf "$TMP/hf.gguf" --gguf_type f32
run "$TMP/meta_gguf" 1 --model $FIX/meta/tiny_gqa "${LORA[@]}" --export_gguf "$TMP/meta.gguf" --gguf_type f32
[ -s "$TMP/meta.gguf" ] && [ "$(cmp -l "$TMP/hf.gguf" "$TMP/meta.gguf" 2>&1 | wc -l)" -le 2 ]
check "GGUF from Meta's layout == from safetensors but for context_length" $? "$(tail -2 "$TMP/meta_gguf.log"); $(cmp -l "$TMP/hf.gguf" "$TMP/meta.gguf" 2>&1 | head -3)"

# two ranks (dev/launch.sh: no MPI needed), each reading its shards of the reassembled tensors
for m in tiny_gqa meta/tiny_gqa; do
    d="$TMP/w2_${m//\//_}"
    timeout 120 dev/launch.sh 2 "$BIN" "${ARGS[@]}" "${LORA[@]}" --model $FIX/$m --max_steps 3 --output_dir "$d" \
        --metrics_file "$d.jsonl" >"$d.log" 2>&1
    check "2 ranks from $m" $? "$(tail -3 "$d.log")"
done
same_result "2 ranks from Meta's layout == 2 ranks from safetensors, bit for bit" "$TMP/w2_tiny_gqa" "$TMP/w2_meta_tiny_gqa" adapter_model.safetensors

# the emulated CUDA trainer reads the same way (the loading is the host's)
if [ -n "$EMU" ] && [ -x "$EMU" ]; then
    BIN=$EMU run "$TMP/emu_hf" 2 --model $FIX/tiny_gqa "${LORA[@]}"
    BIN=$EMU run "$TMP/emu_meta" 2 --model $FIX/meta/tiny_gqa "${LORA[@]}"
    same_result "the CUDA trainer (emulated): Meta's layout == safetensors, bit for bit" "$TMP/emu_hf" "$TMP/emu_meta" adapter_model.safetensors
    # its LoRA base goes from the files to the GPU a piece at a time (model_stream_base), so it
    # checks a tied model's stored lm_head on the way, as a load into host memory does
    rm -rf "$TMP/tied_lie"; cp -r $FIX/tiny_gqa "$TMP/tied_lie"
    sed -i 's/"tie_word_embeddings": false/"tie_word_embeddings": true/' "$TMP/tied_lie/config.json"
    BIN=$EMU run "$TMP/emu_tied_lie" 1 --model "$TMP/tied_lie" "${LORA[@]}"
    rc=$?
    [ $rc -eq 1 ] && grep -q "tied_lie/model.safetensors: tensor 'lm_head.weight' differs from model.embed_tokens.weight" "$TMP/emu_tied_lie.log"
    check "the CUDA trainer (emulated), LoRA: a tied config whose stored lm_head differs is refused as its base streams in" $? \
        "exit $rc: $(tail -2 "$TMP/emu_tied_lie.log")"
else
    echo "SKIP $SUITE: the emulated CUDA trainer is not built in this configuration"
fi

# pytorch_model.bin: tiny_gqa's weights (all exact in F16 and BF16) in each dtype, and
# tiny_tied's (BF16) in 2 shards with an index, its tied lm_head stored beside the embedding
for v in f32 f16 bf16; do
    run "$TMP/bin_$v" 4 --model $FIX/torch/tiny_gqa_$v "${LORA[@]}"
    same_result "LoRA from pytorch_model.bin ($v) == from safetensors, bit for bit" "$TMP/hf" "$TMP/bin_$v" adapter_model.safetensors
done
run "$TMP/tied_st" 3 --model $FIX/tiny_tied --full_finetune
run "$TMP/tied_bin" 3 --model $FIX/torch/tiny_tied_sharded --full_finetune
same_result "full fine-tuning from pytorch_model.bin shards == from safetensors shards, bit for bit" "$TMP/tied_st" "$TMP/tied_bin" model.safetensors
rm -rf "$TMP/bad"; mkdir "$TMP/bad"; cp $FIX/torch/tiny_tied_sharded/* "$TMP/bad/"; rm "$TMP/bad/pytorch_model-00002-of-00002.bin"
run "$TMP/bad_out" 1 --model "$TMP/bad" --full_finetune
[ $? -eq 1 ] && grep -qF 'cannot open shard "pytorch_model-00002-of-00002.bin"' "$TMP/bad_out.log"
check "refused: an index naming a missing .bin shard" $? "$(tail -2 "$TMP/bad_out.log")"
cp $FIX/torch/refused/os_system.bin "$TMP/bad/pytorch_model-00002-of-00002.bin" # names posix.system (os.system)
run "$TMP/bad_out" 1 --model "$TMP/bad" --full_finetune
[ $? -eq 1 ] && grep -qF 'pytorch_model-00002-of-00002.bin: refused: pickle global posix.system is not part of a state_dict' "$TMP/bad_out.log"
check "refused: a shard whose pickle names a global beyond a state_dict's" $? "$(tail -2 "$TMP/bad_out.log")"

# refusals: a copy of the Meta folder with one thing wrong
meta_copy() { rm -rf "$TMP/bad"; mkdir "$TMP/bad"; cp $FIX/meta/tiny_gqa/* "$TMP/bad/"; }
refused() { # refused NAME EXPECTED-MESSAGE: a run on $TMP/bad fails, saying it
    run "$TMP/bad_out" 1 --model "$TMP/bad" "${LORA[@]}"
    local rc=$?
    [ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -qF -- "$2" "$TMP/bad_out.log"
    check "refused: $1" $? "exit $rc; $(tail -2 "$TMP/bad_out.log")"
}
meta_copy; sed -i 's/"ffn_dim_multiplier": 0.5/"ffn_dim_multiplier": 0.6/' "$TMP/bad/params.json"
refused "an FFN formula other than w1's rows" "give an FFN width of 128, but layers.0.feed_forward.w1 has 96 rows"
meta_copy; sed -i 's/"vocab_size": -1/"vocab_size": 32000/' "$TMP/bad/params.json"
refused "a vocab_size other than the embedding's" "vocab_size 32000 and dim 64, but tok_embeddings is 512 x 64"
meta_copy; sed -i 's/}$/, "use_scaled_rope": true}/' "$TMP/bad/params.json"
refused "a key Llama-2's params.json has not" "key \"use_scaled_rope\" is not one of Llama-2's"
meta_copy; sed -i 's/"n_heads": 4/"n_heads": 3/' "$TMP/bad/params.json"
refused "heads that do not divide dim" "dim a multiple of n_heads"
meta_copy; rm "$TMP/bad/consolidated.00.pth"
refused "a missing rank's file" "consolidated.NN.pth files are not numbered 00 to 00 without a gap"
meta_copy; cp "$TMP/bad/consolidated.01.pth" "$TMP/bad/consolidated.02.pth"
refused "three files where the tensors split in two" "give an FFN width of 96, but layers.0.feed_forward.w1 has 144 rows"
meta_copy; printf 'IQ== 0\nIg== 1\n' > "$TMP/bad/tokenizer.model"
refused "Llama-3's original folder (a tiktoken tokenizer.model)" "tokenizer.model: a tiktoken vocabulary (Llama-3's original download) is not read"
meta_copy; head -c 100000 $FIX/meta/tiny_gqa/consolidated.01.pth > "$TMP/bad/consolidated.01.pth"
refused "a truncated rank's file" "consolidated.01.pth"

exit $((fails > 0))
