#!/usr/bin/env bash
# --export_gguf's seconds and peak memory for a Llama-2-7B-shaped model (dim 4096, hidden 11008,
# vocab 32000, LAYERS of its 32 layers, default 1; --random_init, full fine-tuning, no step
# trained) by --gguf_type and --threads, and llama.cpp's quantizer on our f32 file of the same
# weights for comparison (with /tmp/venv's llama_cpp, if there). Prints dev/bench_export.md's
# table. The export's seconds are its file's modification time less that of the folder the
# run saves just before it (OUTPUT/tokenizer.model); the peak is the process's (GNU time's %M).
set -euo pipefail
cd "$(dirname "$0")/.."
make -s train_llama2
LAYERS=${LAYERS:-1}
dir=$(mktemp -d /tmp/bench_export.XXXXXX)
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir/model"
sed "s/\"num_hidden_layers\": 32/\"num_hidden_layers\": $LAYERS/" test/fixtures/configs/llama-2-7b/config.json >"$dir/model/config.json"
cp test/fixtures/tokenizer/tok4000.model "$dir/model/tokenizer.model"
run() { # run TYPE THREADS: one export; prints a table row
    local type=$1 threads=$2
    OMP_NUM_THREADS=$threads /usr/bin/time -f "%e %M" -o "$dir/time" ./train_llama2 --model "$dir/model" --random_init \
        --full_finetune --data test/fixtures/data.jsonl --max_seq_len 24 --batch_size 1 --max_steps 0 --threads "$threads" \
        --data_cache_dir "$dir" --output_dir "$dir/out" --gguf_type "$type" --export_gguf "$dir/$type.gguf" >/dev/null
    read -r wall rss <"$dir/time"
    local s=$(python3 -c "import os; print('%.1f' % (os.stat('$dir/$type.gguf').st_mtime - os.stat('$dir/out/tokenizer.model').st_mtime))")
    echo "| $type | $threads | $s | $wall | $((rss / 1024)) | $(($(stat -c %s "$dir/$type.gguf") / 1048576)) |"
}
echo "| --gguf_type | --threads | export s | run s (init, save, export) | peak RSS MiB | file MiB |"
echo "| --- | --- | --- | --- | --- | --- |"
for threads in 1 2; do for type in ${TYPES:-f16 q8_0 q4_k_m q6_k}; do run "$type" "$threads"; done; done
if [ -x /tmp/venv/bin/python ] && /tmp/venv/bin/python -c "import llama_cpp" 2>/dev/null; then
    run f32 2 >/dev/null
    for ft in 15 18; do for threads in 1 2; do
        /tmp/venv/bin/python - "$dir/f32.gguf" "$dir/lq.gguf" $ft $threads <<'PY'
import ctypes, sys, time, llama_cpp
quiet = llama_cpp.llama_log_callback(lambda *a: None)  # (kept referenced while llama.cpp holds it)
llama_cpp.llama_log_set(quiet, None)
p = llama_cpp.llama_model_quantize_default_params()
p.ftype, p.nthread = int(sys.argv[3]), int(sys.argv[4])
t = time.time()
assert llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(p)) == 0
print(f"| llama_model_quantize of our f32 ({'q4_k_m' if sys.argv[3] == '15' else 'q6_k'}) | {sys.argv[4]} | {time.time() - t:.1f} | | | |")
PY
    done; done
fi
