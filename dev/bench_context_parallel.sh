#!/usr/bin/env bash
# Context parallelism on the CPU trainer (docs/long_context.md): one row of T tokens (LoRA,
# NO_SHARD, so that the only collectives in the layers are the context group's) at P = 1, 2
# and 4, launched by dev/launch.sh (TCP), one thread a rank. Per rank: the step's time (the
# Perfetto trace of step 3, --profile_dir; rank 0's CPU time from its metrics) and the bytes
# the context collectives moved in it (the trace's "bytes": each all-gather and
# reduce-scatter counts its whole buffer, P pieces, of which a rank receives P - 1), against
# the estimate of docs/long_context.md: per layer and group j (of G = 2), K and V gathered in
# the forward and again in the backward, and dK and dV reduce-scattered, 6 collectives of
# B (j + 1) n NKV hd floats a rank (its pieces of groups 0 .. j), n = T / 2P. The model:
# train_helpers.sh's aligned_model (hidden size 256, 2 layers, 4 heads, 2 KV heads of 64),
# made in a temporary folder. Prints dev/bench_context_parallel.md's table.
set -euo pipefail
cd "$(dirname "$0")/.."
make -s train_llama2
T=${T:-2048}
SUITE=bench_context_parallel
source test/train_helpers.sh # TMP (removed at exit), aligned_model
dir=$TMP
aligned_model "$dir/model" >/dev/null # hidden size 256, 2 layers, 4 heads, 2 KV heads of 64
L=2 KV=128 B=1
# one row of T tokens (--batching packing cuts the words' tokens into rows of T)
awk -v n=$((T * 2)) 'BEGIN { split("the cat sat on a mat while an old dog ran far away from the green hill", w, " "); x = 7
    printf "{\"text\": \""; for (j = 0; j < n; j++) { x = (x * 1103 + 12345) % 65536; printf "%s%s", j ? " " : "", w[1 + x % 17] }; print "\"}" }' >"$dir/data.jsonl"
export OMP_NUM_THREADS=1
echo "| P | rank | step ms | step CPU ms (rank 0) | in context collectives ms | their buffers | received | estimate received |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
for P in 1 2 4; do
    rm -rf "$dir/prof"
    dev/launch.sh $P ./train_llama2 --model "$dir/model" --tokenizer test/fixtures/tiny_gqa/tokenizer.model \
        --data "$dir/data.jsonl" --batching packing --max_seq_len $T --batch_size 1 --max_steps 3 --threads 1 \
        --sharding_strategy NO_SHARD --context_parallel $P --profile_dir "$dir/prof" --profile_steps 3-3 \
        --output_dir "$dir/out" --metrics_file "$dir/m.jsonl" >"$dir/log" 2>&1 || { tail -3 "$dir/log"; exit 1; }
    n=$(( (T + 2 * P - 1) / (2 * P) )) # a piece: T padded to 2P pieces
    est=$(( P > 1 ? 6 * 3 * L * (P - 1) * B * n * KV * 4 : 0 )) # 6 collectives x (1 + 2) pieces a rank per layer
    for ((r = 0; r < P; r++)); do
        cpu=""; if [ $r = 0 ]; then cpu=$(sed -n '3s/.*"cpu_ms": \([0-9.]*\).*/\1/p' "$dir/m.jsonl"); fi
        awk -v P=$P -v r=$r -v est=$est -v cpu="$cpu" 'function arg(k,   m) { return match($0, "\"" k "\": [0-9.]+") ? substr($0, RSTART + length(k) + 4, RLENGTH - length(k) - 4) + 0 : 0 }
            /"cat": "step"/ { ms = arg("dur") / 1e3 }
            /"cat": "context / { b += arg("bytes"); t += arg("dur") / 1e3 }
            END { printf "| %d | %d | %.0f | %s | %.0f | %.2f MiB | %.2f MiB | %.2f MiB |\n", P, r, ms, cpu == "" ? "" : sprintf("%.0f", cpu), t, b / 1048576, b * (P - 1) / P / 1048576, est / 1048576 }' \
            "$dir/prof/$([ $P = 1 ] && echo trace.json || echo trace.rank$r.json)"
    done
done
