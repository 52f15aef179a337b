#!/usr/bin/env bash
# Peak resident memory per rank of a 220 M-parameter model (440 MB of BF16, 880
# MB as fp32) at W = 1, 2, 4: loading it rank-locally (dev/bench_fsdp), then the
# trainer itself, FULL_SHARD, LoRA and full fine-tuning: a --dry_run (loading
# and the memory plan) and two training steps. Prints the tables of
# dev/bench_fsdp.md. The model is made in a temporary folder (MODEL_DIR to keep
# one) and is not committed. Then the collectives' speed under mpirun and under
# dev/launch.sh (TCP).
set -euo pipefail
cd "$(dirname "$0")/.."
make -s dev/bench_fsdp train_llama2
dir=${MODEL_DIR:-$(mktemp -d /tmp/bench_fsdp.XXXXXX)}
[ -f "$dir/config.json" ] || dev/bench_fsdp make "$dir"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1
echo "| W | rank | shard MB (fp32) | RSS before MB | peak RSS MB | peak - before MB | load s |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
dev/bench_fsdp whole "$dir"
for w in 1 2 4; do mpirun -np $w dev/bench_fsdp load "$dir"; done

# The trainer: the same global batch at every W (4 rows of up to 32 tokens),
# FULL_SHARD. The plan is rank 0's (weights, trainable state, activations and the
# rest); the --dry_run's peak per rank (loading and the plan) comes from GNU time
# (%M, KiB); the training peak per rank is what the trainer reports after its 2
# steps, before the end-of-run save (which gathers the whole model on rank 0 to
# write one Hugging Face file).
out=$(mktemp -d /tmp/bench_fsdp_train.XXXXXX)
ARGS=(--model "$dir" --tokenizer test/fixtures/tiny_gqa/tokenizer.model --data test/fixtures/data.jsonl --max_seq_len 32
      --threads 1 --lora_target_modules all-linear --output_dir "$out/run")
echo
echo "| training | W | plan (rank 0) MiB: weights + trainable + activations + rest = total | peak RSS per rank, --dry_run MiB | peak RSS per rank, 2 steps MiB | s per step |"
echo "| --- | --- | --- | --- | --- | --- |"
for mode in lora qlora full; do
    extra=(--batch_size 4); [ $mode = full ] && extra+=(--full_finetune); [ $mode = qlora ] && extra+=(--quantize nf4)
    for w in 1 2 4; do
        extra[1]=$((4 / w))
        mpirun -np $w sh -c '/usr/bin/time -f %M -o "$0.$OMPI_COMM_WORLD_RANK" "$@"' "$out/dry" ./train_llama2 "${ARGS[@]}" \
            "${extra[@]}" --dry_run >"$out/dry.log" 2>&1
        plan=$(awk '/^  [a-zA-Z]/ && / MiB/ { v = $0; sub(/ MiB.*/, "", v); sub(/.* /, "", v); n++; x[n] = v }
                    END { printf "%s + %s + %s + %.1f = %s", x[1], x[2], x[3], x[n] - x[1] - x[2] - x[3], x[n] }' "$out/dry.log")
        dry=$(for ((r = 0; r < w; r++)); do awk '/^[0-9]+$/ { printf "%.0f ", $1 / 1024 }' "$out/dry.$r"; done)
        mpirun -np $w ./train_llama2 "${ARGS[@]}" "${extra[@]}" --max_steps 2 --metrics_file "$out/m.jsonl" >"$out/train.log" 2>&1
        train=$(grep -o "per rank, MiB: .*\|^peak resident memory [0-9.]*" "$out/train.log" | tail -1 | sed 's/.*: //; s/peak resident memory //')
        step_s=$(awk -F'"ms": ' 'NR == 2 { split($2, a, ","); printf "%.1f", a[1] / 1000 }' "$out/m.jsonl")
        name=("LoRA r=8, all-linear" "QLoRA (nf4) r=8, all-linear" "full fine-tuning")
        echo "| ${name[$([ $mode = lora ] && echo 0 || ([ $mode = qlora ] && echo 1) || echo 2)]} | $w | $plan | $dry | $train | $step_s |"
    done
done
rm -rf "$out"
[ -n "${MODEL_DIR:-}" ] || rm -rf "$dir"

# The collectives' speed launched both ways: MPI (shared memory between the ranks of a node)
# and the TCP backend of a launch by environment (loopback sockets, every communicator a star)
echo
echo "| launch | W | collective | MiB per rank | ms | GB/s |"
echo "| --- | --- | --- | --- | --- | --- |"
for w in 2 4; do
    mpirun -np $w dev/bench_fsdp collectives
    dev/launch.sh $w dev/bench_fsdp collectives
done
