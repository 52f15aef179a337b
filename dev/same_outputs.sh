#!/usr/bin/env bash
# dev/same_outputs.sh OUT: a fixed set of runs of both trainers (the CPU trainer $BIN, default
# ./train_llama2; the emulated CUDA trainer $EMU_BIN, default ./train_llama2cu_emu), one process
# and sharded, whose every output file and log is hashed into OUT/manifest.txt. A change that
# should change no result (a file moved, code reordered, host code shared) is shown by
# running this before and after it and comparing the two manifests:
#   git worktree add ../before HEAD && make -C ../before train_llama2 train_llama2cu_emu
#   (cd ../before && dev/same_outputs.sh /tmp/before) && dev/same_outputs.sh /tmp/after
#   diff /tmp/before/manifest.txt /tmp/after/manifest.txt && echo same
# What differs from run to run by nature is left out of the hashes: each metrics record's
# times and memory (from "ms" on), a log's timings and memory readings, this folder's path. Everything else is compared byte for byte: weights, adapters, optimizer state,
# checkpoints, GGUF files, plans, --help, refusals. Runs single-threaded: ~4 min on 2 cores.
set -u
if [ $# -ne 1 ]; then echo "usage: $0 OUT" >&2; exit 2; fi
cd "$(dirname "$0")/.."
out=$(mkdir -p "$1" && cd "$1" && pwd)
BIN=${BIN:-./train_llama2}
EMU_BIN=${EMU_BIN:-./train_llama2cu_emu}
BIN_ABS=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
export OMP_NUM_THREADS=1 LAUNCH_GRACE=20 LLAMA2TUNE_TIMEOUT=60
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
R="$out/runs"
rm -rf "$R" && mkdir -p "$R"
FIX=test/fixtures
# the data as a copy with a fixed time: its fingerprint (in checkpoints and the token cache's
# name) holds the file's modification time, which differs between checkouts
cp $FIX/data.jsonl "$R/data.jsonl" && touch -d '2026-01-01 00:00:00 UTC' "$R/data.jsonl"
DATA=(--data "$R/data.jsonl" --data_cache_dir "$R/cache" --max_seq_len 24 --lr 5e-3 --warmup_steps 1 --weight_decay 0.01 --threads 1 --seed 7)
LORA=(--model $FIX/tiny_gqa --lora_r 4 --lora_target_modules all-linear --lora_dropout 0.1)
FULL=(--model $FIX/tiny_tied --full_finetune)

run() { # run NAME LAUNCH... -- ARGS...: the log in runs/NAME.log, outputs in runs/NAME/
    local name=$1; shift
    local launch=()
    while [ "$1" != -- ]; do launch+=("$1"); shift; done
    shift
    mkdir -p "$R/$name"
    timeout 600 "${launch[@]}" "$@" --output_dir "$R/$name" --metrics_file "$R/$name/metrics.jsonl" \
        >"$R/$name.log" 2>&1
    echo "exit $?" >>"$R/$name.log"
}
say() { # say NAME PROGRAM ARGS...: what a program prints, with its exit status (refusals, plans, --help)
    local name=$1; shift
    timeout 120 "$@" >"$R/$name.log" 2>&1
    echo "exit $?" >>"$R/$name.log"
}

# the CPU trainer, one process
run cpu_lora "$BIN" -- "${LORA[@]}" "${DATA[@]}" --max_steps 4 --batch_size 2 --chunk_size 7 --val_data "$R/data.jsonl" \
    --eval_every 2 --save_every 2 --export_gguf "$R/cpu_lora/m.gguf" --gguf_type q8_0
run cpu_full "$BIN" -- "${FULL[@]}" "${DATA[@]}" --max_steps 3 --batch_size 2 --chunk_size 7 --chunk_memory recompute \
    --activation_checkpointing --export_gguf "$R/cpu_full/m.gguf"
run cpu_resume "$BIN" -- "${LORA[@]}" "${DATA[@]}" --max_steps 5 --batch_size 2 --resume "$R/cpu_lora/checkpoint-4"
run cpu_qlora "$BIN" -- --model $FIX/tiny_gqa --quantize nf4 --lora_r 4 "${DATA[@]}" --max_steps 3 --batch_size 2
run cpu_dora "$BIN" -- "${LORA[@]}" --use_dora "${DATA[@]}" --max_steps 3 --batch_size 2 --chunk_size 7
run cpu_ia3 "$BIN" -- --model $FIX/tiny_gqa --peft_method ia3 "${DATA[@]}" --max_steps 3 --batch_size 2
run cpu_adapter "$BIN" -- --model $FIX/tiny_gqa --peft_method llama_adapter --adapter_layers 1 --adapter_len 3 "${DATA[@]}" --max_steps 3 --batch_size 2
run cpu_prefix "$BIN" -- --model $FIX/tiny_gqa --peft_method prefix "${DATA[@]}" --max_steps 3 --batch_size 2 --chunk_size 7
run cpu_trainable "$BIN" -- --model $FIX/tiny_gqa --trainable_params embed,norm --s2_attn 1 --batching packing "${DATA[@]}" --max_steps 2 \
    --batch_size 2 --optimizer adamw8bit
# (in the runs' folder: the default run makes its model and data in out/default/ where it starts)
(cd "$R" && run cpu_default "$BIN_ABS" -- --max_steps 30 --sample_every 15)
# sharded: ranks by the environment (TCP) and, where the trainer has MPI, by mpirun; context parallelism
run cpu_fsdp2 dev/launch.sh 2 "$BIN" -- "${FULL[@]}" "${DATA[@]}" --max_steps 3 --batch_size 4 --chunk_size 7 --save_every 3
run cpu_hybrid4 dev/launch.sh 4 "$BIN" -- "${LORA[@]}" "${DATA[@]}" --max_steps 3 --batch_size 4 \
    --sharding_strategy HYBRID_SHARD --shard_group 2
run cpu_cp2 dev/launch.sh 2 "$BIN" -- "${LORA[@]}" "${DATA[@]}" --max_steps 3 --batch_size 2 --chunk_size 7 --context_parallel 2
if command -v mpirun >/dev/null; then
    run cpu_mpi3 mpirun -np 3 "$BIN" -- "${FULL[@]}" "${DATA[@]}" --max_steps 3 --batch_size 6 --sharding_strategy SHARD_GRAD_OP
fi
say cpu_help "$BIN" --help
say cpu_plan "$BIN" --model $FIX/configs/llama-2-7b --random_init --tokenizer $FIX/tiny_gqa/tokenizer.model --data "$R/data.jsonl" --dry_run --max_seq_len 4096 --batch_size 2 --quantize nf4
say cpu_refuse "$BIN" --model $FIX/tiny_gqa --data "$R/data.jsonl" --full_finetune --lora_r 8 --quantize nf4

# the emulated CUDA trainer
if [ -x "$EMU_BIN" ]; then
    run cu_lora "$EMU_BIN" -- "${LORA[@]}" "${DATA[@]}" --max_steps 3 --batch_size 2 --chunk_size 7 --precision bf16 \
        --save_every 3 --export_gguf "$R/cu_lora/m.gguf"
    run cu_full "$EMU_BIN" -- "${FULL[@]}" "${DATA[@]}" --max_steps 3 --batch_size 2 --chunk_size 7 --precision fp32 \
        --chunk_memory recompute --export_gguf "$R/cu_full/m.gguf" --gguf_type q8_0
    run cu_qlora "$EMU_BIN" -- --model $FIX/tiny_gqa --quantize nf4 --lora_r 4 "${DATA[@]}" --max_steps 2 --batch_size 2 --precision bf16
    run cu_resume "$EMU_BIN" -- "${LORA[@]}" "${DATA[@]}" --max_steps 4 --batch_size 2 --precision bf16 --resume "$R/cu_lora/checkpoint-3"
    run cu_dora "$EMU_BIN" -- "${LORA[@]}" --use_dora "${DATA[@]}" --max_steps 2 --batch_size 2 --chunk_size 7 --precision fp32
    run cu_ia3 "$EMU_BIN" -- --model $FIX/tiny_gqa --peft_method ia3 "${DATA[@]}" --max_steps 2 --batch_size 2 --precision fp16
    run cu_adapter "$EMU_BIN" -- --model $FIX/tiny_gqa --peft_method llama_adapter --adapter_layers 1 --adapter_len 3 "${DATA[@]}" \
        --max_steps 2 --batch_size 2 --precision fp32
    run cu_prefix "$EMU_BIN" -- --model $FIX/tiny_gqa --peft_method prefix "${DATA[@]}" --max_steps 2 --batch_size 2 --chunk_size 7 \
        --precision fp32
    run cu_trainable "$EMU_BIN" -- --model $FIX/tiny_gqa --trainable_params embed,norm --s2_attn 1 --batching packing "${DATA[@]}" --max_steps 2 \
        --batch_size 2 --precision fp32
    run cu_pure_bf16 "$EMU_BIN" -- "${FULL[@]}" "${DATA[@]}" --max_steps 2 --batch_size 2 --pure_bf16 1 --optimizer anyprecision \
        --kahan_summation 1 --freeze_layers 1
    run cu_offload "$EMU_BIN" -- "${FULL[@]}" "${DATA[@]}" --max_steps 3 --batch_size 2 --chunk_size 7 --precision bf16 \
        --cpu_offload 1 --grad_clip 0
    run cu_fsdp2 dev/launch.sh 2 "$EMU_BIN" -- "${FULL[@]}" "${DATA[@]}" --max_steps 3 --batch_size 4 --chunk_size 7 \
        --precision fp32 --collectives host --save_every 3
    run cu_cp2 dev/launch.sh 2 "$EMU_BIN" -- "${LORA[@]}" "${DATA[@]}" --max_steps 2 --batch_size 2 --chunk_size 7 \
        --precision fp32 --collectives host --context_parallel 2
    say cu_help "$EMU_BIN" --help
    say cu_plan "$EMU_BIN" --model $FIX/configs/llama-3.1-8b --random_init --tokenizer $FIX/tiny_gqa/tokenizer.model --data "$R/data.jsonl" --dry_run --max_seq_len 8192 --batch_size 1 \
        --quantize nf4 --lora_r 32 --lora_target_modules all-linear --chunk_size 2048 --chunk_memory recompute
    say cu_plan_full "$EMU_BIN" --model $FIX/configs/llama-2-7b --random_init --tokenizer $FIX/tiny_gqa/tokenizer.model --data "$R/data.jsonl" --dry_run --full_finetune --max_seq_len 2048 \
        --batch_size 1 --pure_bf16 1 --optimizer anyprecision --cpu_offload 1 --host_memory_limit 100
else
    echo "no emulated trainer at $EMU_BIN: its runs left out" >"$R/cu_missing.log"
fi

# the manifest: a hash per output file (metrics without their times; JSON without this
# folder's path and the data's modification time, which a generated default dataset has anew;
# the token cache by a name without its hash of the data's path); each log as
# out/logs/NAME.log without what differs between runs by nature (times, rates, memory
# readings, paths), hashed there too, so that a difference can be read
mkdir -p "$out/logs"
cd "$R"
for f in $(find . -type f | LC_ALL=C sort); do
    case $f in
    ./out/default/*.tokcache) ;; # (left out: it holds the generated data's time)
    *.log) sed -E -f "$OLDPWD/dev/same_outputs.sed" -e "s#$R#RUNS#g" "$f" >"$out/logs/$(basename "$f")" || exit 1
           sha256sum <"$out/logs/$(basename "$f")" | sed "s#-#$f#" ;;
    */metrics.jsonl) sed -E 's/, "ms".*//' "$f" | sha256sum | sed "s#-#$f#" ;;
    *.json) sed -E -e "s#$R#RUNS#g" -e 's/"data_fingerprint": "([0-9]+):[0-9]+:/"data_fingerprint": "\1:MTIME:/' "$f" |
            sha256sum | sed "s#-#$f#" ;;
    *) sha256sum <"$f" | sed "s#-#$f#" ;;
    esac | sed -E 's/\.[0-9a-f]{16}\.tokcache$/.H.tokcache/'
done >"$out/manifest.txt"
echo "$(wc -l <"$out/manifest.txt") files hashed into $out/manifest.txt"
