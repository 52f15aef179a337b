#!/usr/bin/env bash
# Peak resident memory per rank while loading a 220 M-parameter model (440 MB
# of BF16, 880 MB as fp32) rank-locally at W = 1, 2, 4, and with the trainer's
# whole-model loader; prints the table of dev/bench_fsdp.md. The model is made
# in a temporary folder (MODEL_DIR to keep one) and is not committed.
set -euo pipefail
cd "$(dirname "$0")/.."
make -s dev/bench_fsdp
dir=${MODEL_DIR:-$(mktemp -d /tmp/bench_fsdp.XXXXXX)}
[ -f "$dir/config.json" ] || dev/bench_fsdp make "$dir"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1
echo "| W | rank | shard MB (fp32) | RSS before MB | peak RSS MB | peak - before MB | load s |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
dev/bench_fsdp whole "$dir"
for w in 1 2 4; do mpirun -np $w dev/bench_fsdp load "$dir"; done
[ -n "${MODEL_DIR:-}" ] || rm -rf "$dir"
