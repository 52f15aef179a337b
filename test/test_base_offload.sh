#!/usr/bin/env bash
# --cpu_offload 1 with an adapter (train_llama2cu; docs/memory.md "The frozen base streamed"):
# the frozen base's decoder layers in pinned host memory, each copied up a layer ahead of its
# use into a ring of two slots (sharded: each rank's shards of them, copied up into a ring of
# two shard buffers and gathered from there into the slots), give the same results as the run
# without it, bit for bit: every step's loss and gradient norm, the adapter's file and the
# final checkpoint's optimizer state, byte for byte. Tolerance 0: the layers reach the
# products with the bytes d.weights would hold (converted to bf16 on the GPU as they load, or
# QLoRA's runs as packed), only from elsewhere. Run by the emulated build ($EMU_BIN, default
# ./train_llama2cu_emu; without it this says SKIP), whose streams run lazily
# (dev/emu/README.md): a copy up that the compute (sharded: the gather) does not wait for reads
# stale bytes there (without the gather's wait for the shard's copy, every loss is NaN).
#
# A model of 5 decoder layers (tiny_tied's shapes; its weights drawn once by the CPU trainer),
# so that the ring's two slots take every layer in turn: LoRA on all linear layers whole, in
# chunks of 8 kept, recomputed and with activation checkpointing, fp32; QLoRA nf4 with double
# quantization (whole; chunks recomputed) and fp4 without; DoRA; IA3; resumed from a checkpoint
# with the offload == the uninterrupted run without it. The plan, with a bigger model (8 layers
# of dim 512): the GPU's part shrinks by the layers less the ring, the host's grows by them (what
# the run pins, LLAMA2TUNE_OFFLOAD_LOG), to the plan's 0.1 MiB; the GPU plan's total against the
# peak the emulated GPU saw (less cuBLASLt's 32 MiB workspace, which no plan counts) within 3%,
# with and without the offload. QLoRA's plan, whose dequantize scratch holds one projection, against
# the emulated peak the same way: one process and two ranks FULL_SHARD (its two slots), within 3%.
# Sharded, 2 ranks (dev/launch.sh, --collectives host): LoRA FULL_SHARD whole, QLoRA nf4 SHARD_GRAD_OP
# (every layer kept gathered) in chunks of 8 recomputed with activation checkpointing, each == the
# same sharded run without the offload; the plan of 4 layers of dim 256 on 2 ranks FULL_SHARD: the
# GPU plan's total within 3% of the emulated peak less the workspace, and against the plan without
# the offload (a dry run) the GPU's part less 2 of the rank's layer shards (4 less the shard ring's
# 2), the host's more the 4 it pins; a --host_memory_limit between the two host plans refuses the
# run with the offload.
# --quick: the LoRA chunked-recompute, QLoRA and 2 ranks' LoRA FULL_SHARD cases.
set -u
cd "$(dirname "$0")/.."
SUITE="base offload"
source test/train_helpers.sh # TMP, check, trajectory
need_emu "--cpu_offload with an adapter"
export OMP_NUM_THREADS=1 LLAMA2TUNE_TIMEOUT=60
QUICK=0
[ "${1:-}" = --quick ] && QUICK=1
# the 5-layer model: tiny_tied's config and tokenizer, weights drawn once
mkdir -p "$TMP/shape"
cp "$FIX/tiny_tied/config.json" "$FIX/tiny_tied/tokenizer.model" "$TMP/shape/"
sed -i 's/"num_hidden_layers": *2/"num_hidden_layers": 5/' "$TMP/shape/config.json"
./train_llama2 --model "$TMP/shape" --random_init --full_finetune --data "$FIX/data.jsonl" --max_seq_len 24 --max_steps 1 \
    --lr 0 --threads 1 --output_dir "$TMP/m5" >"$TMP/m5.log" 2>&1 || { echo "FAIL $SUITE: the 5-layer model: $(tail -2 "$TMP/m5.log")"; exit 1; }
ARGS=(--model "$TMP/m5" --data "$FIX/data.jsonl" --max_seq_len 24 --lr 5e-3 --warmup_steps 1 --threads 1)
ALL=(--lora_target_modules all-linear) # (LoRA's; IA3 takes its own targets)
LAUNCH=() # (sharded: dev/launch.sh 2)
emu() { # emu OUT [args]: the emulated trainer, metrics OUT.jsonl, log OUT.log
    local out=$1
    shift
    timeout 600 "${LAUNCH[@]}" "$EMU_BIN" "${ARGS[@]}" --output_dir "$out" --metrics_file "$out.jsonl" "$@" >"$out.log" 2>&1
}
# pair NAME [args]: 4 steps with --cpu_offload 1 == without, bit for bit (the final checkpoint's optimizer state too)
pair() {
    local name=$1 tag rc=0
    shift
    tag=$(echo "$name" | tr -c 'A-Za-z0-9\n' _)
    emu "$TMP/$tag-dev" --max_steps 4 "$@" || rc=1
    LLAMA2TUNE_OFFLOAD_LOG=1 emu "$TMP/$tag-host" --max_steps 4 "$@" --cpu_offload 1 || rc=1
    grep -q '"step": *4' "$TMP/$tag-host.jsonl" 2>/dev/null || rc=1
    grep -q "^base offload: [0-9]* bytes pinned" "$TMP/$tag-host.log" || rc=1
    diff -q <(trajectory "$TMP/$tag-host.jsonl") <(trajectory "$TMP/$tag-dev.jsonl") >/dev/null 2>&1 || rc=1
    cmp -s "$TMP/$tag-host/adapter_model.safetensors" "$TMP/$tag-dev/adapter_model.safetensors" || rc=1
    cmp -s "$TMP/$tag-host/checkpoint-4/optimizer.safetensors" "$TMP/$tag-dev/checkpoint-4/optimizer.safetensors" || rc=1
    check "$name: --cpu_offload 1 == without, bit for bit" $rc \
        "$(tail -2 "$TMP/$tag-host.log"; diff <(trajectory "$TMP/$tag-host.jsonl") <(trajectory "$TMP/$tag-dev.jsonl") 2>&1 | head -4)"
}
pair "LoRA, chunks of 8 recomputed, activation checkpointing" "${ALL[@]}" --chunk_size 8 --chunk_memory recompute --activation_checkpointing
pair "QLoRA nf4 double quantization, chunks of 8 recomputed" "${ALL[@]}" --quantize nf4 --chunk_size 8 --chunk_memory recompute
LAUNCH=(dev/launch.sh 2)
pair "2 ranks FULL_SHARD, LoRA, whole sequences" "${ALL[@]}" --collectives host --sharding_strategy FULL_SHARD --batch_size 2
[ $QUICK = 0 ] && pair "2 ranks SHARD_GRAD_OP, QLoRA nf4, chunks of 8 recomputed, activation checkpointing" "${ALL[@]}" \
    --collectives host --sharding_strategy SHARD_GRAD_OP --batch_size 2 --quantize nf4 --chunk_size 8 --chunk_memory recompute --activation_checkpointing
LAUNCH=()
if [ $QUICK = 0 ]; then
    pair "LoRA, whole sequences" "${ALL[@]}" --batch_size 2
    pair "LoRA, chunks of 8 kept" "${ALL[@]}" --chunk_size 8
    pair "LoRA, fp32" "${ALL[@]}" --precision fp32 --chunk_size 8
    pair "QLoRA nf4 double quantization, whole" "${ALL[@]}" --quantize nf4
    pair "QLoRA fp4, no double quantization, activation checkpointing" "${ALL[@]}" --quantize fp4 --double_quant 0 --activation_checkpointing
    pair "DoRA, chunks of 8 kept" "${ALL[@]}" --use_dora --chunk_size 8
    pair "IA3, chunks of 8 recomputed" --peft_method ia3 --chunk_size 8 --chunk_memory recompute

    # resumed: 4 steps without the offload == 2 with it, saved, and 2 more resumed with it
    rc=0
    emu "$TMP/res-ref" --max_steps 4 --chunk_size 8 --quantize nf4 "${ALL[@]}" || rc=1
    emu "$TMP/res" --max_steps 4 --save_every 2 --chunk_size 8 --quantize nf4 "${ALL[@]}" --cpu_offload 1 || rc=1
    emu "$TMP/res2" --max_steps 4 --chunk_size 8 --quantize nf4 "${ALL[@]}" --cpu_offload 1 --resume "$TMP/res/checkpoint-2" || rc=1
    diff -q <(trajectory "$TMP/res-ref.jsonl" | sed -n 3,4p) <(trajectory "$TMP/res2.jsonl" | grep -E '"step": *[34],') >/dev/null 2>&1 || rc=1
    cmp -s "$TMP/res-ref/adapter_model.safetensors" "$TMP/res2/adapter_model.safetensors" || rc=1
    check "QLoRA resumed from checkpoint 2 with the offload == uninterrupted without it" $rc "$(tail -2 "$TMP/res2.log")"

    # the plan, with a bigger model (8 layers of dim 512): the GPU's part less the layers but the
    # ring's two, the host's more the layers (what the run pins); and the GPU plan's total against
    # the peak the emulated GPU saw, less cuBLASLt's workspace
    shaped() { # shaped DIR L D H NH TIED: tiny_tied's tokenizer and config, L layers of dim D, MLP width H, NH heads of 64
        mkdir -p "$1" && cp "$FIX/tiny_tied/tokenizer.model" "$1/" &&
            sed -e "s/\"num_hidden_layers\": *2/\"num_hidden_layers\": $2/" -e "s/\"hidden_size\": *48/\"hidden_size\": $3/" \
                -e "s/\"intermediate_size\": *80/\"intermediate_size\": $4/" -e 's/"head_dim": *16/"head_dim": 64/' \
                -e "s/\"num_attention_heads\": *3/\"num_attention_heads\": $5/" -e "s/\"num_key_value_heads\": *3/\"num_key_value_heads\": $5/" \
                -e "s/\"tie_word_embeddings\": *true/\"tie_word_embeddings\": $6/" "$FIX/tiny_tied/config.json" >"$1/config.json"
    }
    gpu() { awk '/^memory plan/ { on = 1 } on && $1 == "total" { print $2; exit }' "$1"; }
    host() { awk '/^host memory plan/ { on = 1 } on && $1 == "total" { print $2; exit }' "$1"; }
    peak() { sed -n 's/^peak GPU memory \([0-9.]*\) MiB.*/\1/p' "$1"; } # (rank 0's)
    near_peak() { # near_peak LOG WHAT RC: checks the run of LOG (RC 0: it went well) and its GPU plan's total against
        local plan=$(gpu "$1") rc=$3 # the peak the emulated GPU saw, less cuBLASLt's 32 MiB workspace (which no plan counts)
        awk -v p="${plan:-0}" -v k="$(peak "$1")" 'BEGIN { m = k - 32; exit !(p > 0 && m > 0 && p >= 0.97 * m && p <= 1.03 * m) }' || rc=1
        check "the GPU plan within 3% of the emulated peak less the 32 MiB workspace ($2)" $rc \
            "plan ${plan:-none} MiB, peak $(peak "$1") MiB: $(grep scratch "$1"; tail -2 "$1")"
    }
    moved() { # moved WITHOUT WITH PINNED BYTES OFF: WITH's GPU plan OFF x BYTES less than WITHOUT's, its host plan PINNED
        awk -v d="$(gpu "$1")" -v h="$(gpu "$2")" -v dh="$(host "$1")" -v hh="$(host "$2")" -v p="${3:-0}" -v l="$4" -v off="$5" \
            'BEGIN { MiB = 1048576; exit !((d - h) * MiB >= off * l - 0.1 * MiB && (d - h) * MiB <= off * l + 0.1 * MiB &&
                                          (hh - dh) * MiB >= p - 0.1 * MiB && (hh - dh) * MiB <= p + 0.1 * MiB) }' # (the plan prints 0.1 MiB)
    }
    shaped "$TMP/big" 8 512 1376 8 true
    ARGS=(--model "$TMP/big" --random_init --data "$FIX/data.jsonl" --max_seq_len 24 --threads 1)
    for o in 0 1; do
        rc=0
        LLAMA2TUNE_OFFLOAD_LOG=1 emu "$TMP/big$o" --max_steps 1 --chunk_size 8 "${ALL[@]}" --cpu_offload $o || rc=1
        near_peak "$TMP/big$o.log" "8 layers of dim 512, --cpu_offload $o" $rc
    done
    rc=0
    pinned=$(sed -n 's/^base offload: \([0-9]*\) bytes pinned/\1/p' "$TMP/big1.log")
    layer=$(( (4 * 512 * 512 + 3 * 512 * 1376 + 2 * 512) * 2 )) # a layer's bf16 bytes: q, k, v, o, gate, up, down, two norms
    [ "${pinned:-0}" = $((8 * layer)) ] && moved "$TMP/big0.log" "$TMP/big1.log" "$pinned" $layer 6 || rc=1
    check "the plan: 6 layers off the GPU (8 less the ring), 8 pinned on the host (what the run pinned)" $rc \
        "GPU $(gpu "$TMP/big0.log") -> $(gpu "$TMP/big1.log") MiB, host $(host "$TMP/big0.log") -> $(host "$TMP/big1.log") MiB, pinned ${pinned:-none}, a layer $layer bytes"

    # QLoRA's plan against the peak, on a model whose layers outweigh the rest (2 layers of dim 256 and
    # (688, 256) MLP weights, vocabulary 512, untied), so that the scratch and the slots are much of its
    # 6 MiB (a whole layer's scratch would be 1.6 MB, the biggest projection's is 0.35): the plan's line
    # says one projection, and what the run allocated is what the plan counted; one process, and two
    # ranks FULL_SHARD (the two slots)
    shaped "$TMP/q" 2 256 688 4 false
    ARGS=(--model "$TMP/q" --random_init --data "$FIX/data.jsonl" --max_seq_len 24 --threads 1)
    for w in 1 2; do
        rc=0
        launch=(); [ $w = 2 ] && launch=(dev/launch.sh 2)
        timeout 600 "${launch[@]}" "$EMU_BIN" "${ARGS[@]}" --max_steps 1 "${ALL[@]}" --quantize nf4 --collectives host \
            --output_dir "$TMP/q$w" >"$TMP/q$w.log" 2>&1 || rc=1
        grep -qE "of which dequantize scratch +0\.3 MiB +\(one projection, bf16\)" "$TMP/q$w.log" || rc=1
        near_peak "$TMP/q$w.log" "QLoRA, its plan's scratch one projection, $w rank(s)" $rc
    done
    # sharded, 2 ranks FULL_SHARD, 4 layers of dim 256: the GPU plan's total against the emulated peak
    # (each rank's), and against the plan without the offload (a dry run) the rank's layer shards
    shaped "$TMP/sh" 4 256 688 4 true
    ARGS=(--model "$TMP/sh" --random_init --data "$FIX/data.jsonl" --max_seq_len 16 --batch_size 1 --threads 1 --collectives host
          --sharding_strategy FULL_SHARD "${ALL[@]}")
    LAUNCH=(dev/launch.sh 2)
    rc=0
    LLAMA2TUNE_OFFLOAD_LOG=1 emu "$TMP/sh1" --max_steps 1 --cpu_offload 1 || rc=1
    emu "$TMP/sh0" --dry_run || rc=1
    peaks=$(sed -n 's/^peak GPU memory .*per rank, MiB: \([0-9 ]*\)$/\1/p' "$TMP/sh1.log") # (each rank's in whole MiB)
    [ "$(tr ' ' '\n' <<<"$peaks" | grep -c .)" = 2 ] && [ "$(tr ' ' '\n' <<<"$peaks" | grep . | sort -u)" = "$(printf %.0f "$(peak "$TMP/sh1.log")")" ] || rc=1
    near_peak "$TMP/sh1.log" "sharded, the same on both ranks (${peaks:-none} MiB; 4 layers of dim 256, 2 ranks FULL_SHARD)" $rc
    rc=0
    pinned=$(sed -n 's/^base offload: \([0-9]*\) bytes pinned/\1/p' "$TMP/sh1.log" | sort -u)
    shard=$(( (4 * 256 * 256 + 3 * 256 * 688 + 2 * 256) / 2 * 2 )) # a rank's bf16 bytes of a layer: half its elements
    [ "${pinned:-0}" = $((4 * shard)) ] && moved "$TMP/sh0.log" "$TMP/sh1.log" "$pinned" $shard 2 || rc=1
    check "sharded: 2 of a rank's layer shards off the GPU (4 less the shard ring), 4 pinned on the host (what each rank pinned)" $rc \
        "GPU $(gpu "$TMP/sh0.log") -> $(gpu "$TMP/sh1.log") MiB, host $(host "$TMP/sh0.log") -> $(host "$TMP/sh1.log") MiB, pinned ${pinned:-none}, a shard $shard bytes"
    # --host_memory_limit between the host plans without and with the offload: the run refused before it loads
    rc=0
    limit=$(awk -v h="$(host "$TMP/sh0.log")" -v p="${pinned:-0}" 'BEGIN { printf "%.6f", (h + p / 2 / 1048576) / 1024 }')
    emu "$TMP/shl" --max_steps 1 --cpu_offload 1 --host_memory_limit "$limit" && rc=1
    grep -q "error: the host memory plan (.*) exceeds the .* GiB of --host_memory_limit" "$TMP/shl.log" || rc=1
    check "sharded: a --host_memory_limit the pinned shards pass refuses the run, saying how much it needs" $rc "$(tail -2 "$TMP/shl.log")"
    LAUNCH=()
    ARGS=(--model "$TMP/m5" --data "$FIX/data.jsonl" --max_seq_len 24 --lr 5e-3 --warmup_steps 1 --threads 1)
fi

[ "$fails" -eq 0 ]
