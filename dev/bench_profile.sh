#!/usr/bin/env bash
# What --profile_dir costs, on the CPU trainer's built-in default run (support/default_model.h:
# 4 layers, dim 128, LoRA on all-linear, 16 rows of 64 tokens a step), one thread: ROUNDS
# rounds, each a run with neither option, one with --profile_dir whose steps lie past the
# run's end (every span is then one branch on a flag: support/profile.h), and one that
# records every step from the 11th; the median step time (the metrics file's ms, the first
# 10 steps left out) of each run, and each kind's median over the rounds. The kinds take
# turns, so that a machine's slow minute falls on all three. Results: dev/bench_profile.md.
#   dev/bench_profile.sh            (make train_llama2 first; STEPS=100 ROUNDS=5 by default)
set -eu
cd "$(dirname "$0")/.."
BIN=${BIN:-./train_llama2} STEPS=${STEPS:-100} ROUNDS=${ROUNDS:-5}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
median() { sort -g | awk '{v[NR] = $1} END {printf "%.3f", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
step_ms() { # the median step of a metrics file, from step 11
    grep -o '"step": [0-9]*\|"ms": [0-9.]*' "$1" | paste - - | awk '$2 > 10 {print $4}' | median
}
kinds=(none outside recording)
for r in $(seq "$ROUNDS"); do
    for k in "${kinds[@]}"; do
        case $k in
        none) extra=() ;;
        outside) extra=(--profile_dir "$TMP/prof" --profile_steps 100000-100001) ;;
        recording) extra=(--profile_dir "$TMP/prof" --profile_steps 11-$STEPS) ;;
        esac
        "$BIN" --max_steps "$STEPS" --threads 1 --sample_every 0 --output_dir "$TMP/out" --metrics_file "$TMP/$k.$r.jsonl" \
            "${extra[@]}" >"$TMP/$k.log" 2>&1
        echo "$(step_ms "$TMP/$k.$r.jsonl")" >>"$TMP/$k.ms"
        echo "round $r, $k: $(tail -1 "$TMP/$k.ms") ms a step"
    done
done
echo "median over $ROUNDS rounds, ms a step: $(for k in "${kinds[@]}"; do printf '%s %s  ' "$k" "$(median <"$TMP/$k.ms")"; done)"
