# Helpers for the shell tests that train and compare runs (sourced, not run).
# The caller sets SUITE (the name in its ok/FAIL lines) before, and ARGS (the
# options every run shares) after sourcing; this sets BIN (the trainer, from the
# environment or ./train_llama2), TMP (a scratch folder, removed at exit), FIX
# (the fixtures) and fails (the count of failed checks).
BIN=${BIN:-./train_llama2}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
FIX=test/fixtures
fails=0
check() { # check NAME CONDITION-EXIT-CODE DETAIL
    if [ "$2" -eq 0 ]; then echo "ok $SUITE: $1"; else echo "FAIL $SUITE: $1: $3"; fails=$((fails + 1)); fi
}
need_emu() { # need_emu WHAT: EMU_BIN, the emulated CUDA trainer (default ./train_llama2cu_emu), or SKIP WHAT and exit 0
    EMU_BIN=${EMU_BIN:-./train_llama2cu_emu}
    if [ ! -x "$EMU_BIN" ]; then
        echo "SKIP $1: no emulated build at $EMU_BIN (make train_llama2cu_emu; or set EMU_BIN)"
        exit 0
    fi
}
run() { # run DIR STEPS [extra args]: output in DIR, metrics in DIR.jsonl, log in DIR.log
    local dir=$1 steps=$2; shift 2
    "$BIN" "${ARGS[@]}" --max_steps "$steps" --output_dir "$dir" --metrics_file "$dir.jsonl" "$@" >"$dir.log" 2>&1
}
start() { # start DIR STEPS [extra args]: like run, in the background; $pid is the trainer's
    local dir=$1 steps=$2; shift 2
    "$BIN" "${ARGS[@]}" --max_steps "$steps" --output_dir "$dir" --metrics_file "$dir.jsonl" "$@" >"$dir.log" 2>&1 &
    pid=$!
}
wait_steps() { # wait_steps METRICS N: until METRICS holds N records (steps ended), at most 60 s
    for _ in $(seq 600); do [ -f "$1" ] && [ "$(wc -l <"$1")" -ge "$2" ] && return 0; sleep 0.1; done
    return 1
}
# the deterministic part of each metrics record (times and memory differ between runs)
trajectory() { sed -E 's/, "ms".*//' "$1"; }
same_result() { # same_result NAME REF DIR WEIGHTS_FILE
    cmp -s "$2/$4" "$3/$4" && diff -q <(trajectory "$2.jsonl") <(trajectory "$3.jsonl") >/dev/null
    check "$1" $? "$(cmp "$2/$4" "$3/$4" 2>&1 | head -1); $(diff <(trajectory "$2.jsonl") <(trajectory "$3.jsonl") | head -4)"
}
# the largest relative difference of loss and grad_norm over the steps two metrics files share
# (steps >= FROM, default 1); 1e9 when the second has a step the first lacks, or none at all
trajectory_diff() { # trajectory_diff METRICS REF-METRICS [FROM]
    awk -v from="${3:-1}" 'function num(line, key,   m) { return match(line, "\"" key "\": [^,}]*") ? substr(line, RSTART + length(key) + 4, RLENGTH - length(key) - 4) + 0 : "x" }
        function rel(a, b,   d, m) { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b; return m > 0 ? d / m : d }
        FNR == NR { if (index($0, "\"loss\"")) { loss[num($0, "step")] = num($0, "loss"); norm[num($0, "step")] = num($0, "grad_norm") } next }
        index($0, "\"loss\"") { s = num($0, "step"); if (s < from) next; n++
            if (!(s in loss)) { worst = 1e9; next }
            e = rel(loss[s], num($0, "loss")); if (e > worst) worst = e
            e = rel(norm[s], num($0, "grad_norm")); if (e > worst) worst = e }
        END { if (n == 0) worst = 1e9; printf "%.3g", worst + 0 }' "$1" "$2"
}
# aligned_model DIR: a model of hidden size 256 (2 layers, GQA, untied, the fixtures' vocabulary of
# 512) whose 8-bit AdamW8bit tensors start at multiples of 256 in their units, as sharded AdamW8bit
# needs (model.h's model_align_blocks) and no tiny fixture has: random weights, written by one
# step of the CPU trainer at lr 0 (--random_init does not resume; a folder of weights does)
aligned_model() {
    mkdir -p "$1.config"
    cat >"$1.config/config.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
 "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false,
 "initializer_range": 0.02, "hidden_act": "silu"}
JSON
    "$BIN" --model "$1.config" --random_init --tokenizer $FIX/tiny_gqa/tokenizer.model --data $FIX/data.jsonl --max_seq_len 24 \
        --max_steps 1 --lr 0 --full_finetune --batch_size 1 --threads 1 --output_dir "$1" >"$1.log" 2>&1
    check "a model of hidden size 256 made (random weights, one step at lr 0)" $? "$(tail -2 "$1.log")"
}
