#!/usr/bin/env bash
# The trainer on the seeds' real data (../shared/data: SAMSum as JSONL,
# Alpaca as a JSON array), through the whole data path: format detection, the
# templates, prompt masking, padding and packing, the validation split and
# periodic evaluation. The model is the tiny test fixture (vocab 512), so the
# text is tokenized with its tokenizer; token ids against Meta's tokenizer are
# checked in test_dataloader. Skips, saying so, when ../shared is absent.
#
# "The loss falls": the mean of the last 5 steps is below the mean of the
# first 3 by at least 0.3 nats (measured ~0.8-1.0; a run that does not learn
# stays within ~0.1 of where it starts).
set -u
BIN=${BIN:-./train_llama2}
SHARED=../shared/data
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0
if [ ! -f "$SHARED/samsum/samsum_test_300.jsonl" ] || [ ! -f "$SHARED/alpaca/alpaca_1000.json" ]; then
    echo "SKIP real data: $SHARED/samsum/samsum_test_300.jsonl or $SHARED/alpaca/alpaca_1000.json is absent (a fresh clone has no ../shared)"
    exit 0
fi

# train NAME DATA [args]: 30 LoRA steps, evaluating every 15; checks the loss and the metrics
train() {
    local name=$1 data=$2; shift 2
    "$BIN" --model test/fixtures/tiny_gqa --data "$data" --data_cache_dir "$TMP" --max_seq_len 512 --batch_size 4 \
        --max_steps 30 --lr 1e-2 --lora_r 16 --lora_target_modules all-linear --threads 2 --eval_every 15 \
        --output_dir "$TMP/$name" --metrics_file "$TMP/$name.jsonl" "$@" >"$TMP/$name.log" 2>&1
    local rc=$?
    local verdict
    verdict=$(awk -F'"loss": ' '/"loss"/ { split($2, a, ","); l[++n] = a[1] }
        /"val_loss"/ { v++ }
        END { if (n < 30) { print "only " n " steps"; exit }
              first = (l[1] + l[2] + l[3]) / 3; last = (l[n-4] + l[n-3] + l[n-2] + l[n-1] + l[n]) / 5
              printf "%s: loss %.3f -> %.3f, %d evaluations", (first - last >= 0.3 && v == 2) ? "ok" : "bad", first, last, v }' "$TMP/$name.jsonl")
    if [ $rc -eq 0 ] && [ "${verdict%%:*}" = ok ]; then
        echo "ok real data: $name: the loss falls (${verdict#ok: })"
    else
        echo "FAIL real data: $name: exit $rc, ${verdict}; $(tail -3 "$TMP/$name.log")"
        fails=$((fails + 1))
    fi
}

train samsum_padding "$SHARED/samsum/samsum_test_300.jsonl" --val_split 0.1
grep -q "format samsum" "$TMP/samsum_padding.log" || { echo "FAIL real data: SAMSum not detected as samsum"; fails=$((fails + 1)); }
train alpaca_packing "$SHARED/alpaca/alpaca_1000.json" --batching packing --max_seq_len 256 --val_split 0.05
grep -q "format alpaca" "$TMP/alpaca_packing.log" || { echo "FAIL real data: Alpaca not detected as alpaca"; fails=$((fails + 1)); }
train alpaca_on_prompt "$SHARED/alpaca/alpaca_1000.json" --train_on_prompt 1 --data_slice "[:50%]" --val_split 0.05
exit $((fails > 0))
