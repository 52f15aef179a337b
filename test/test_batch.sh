#!/usr/bin/env bash
# The batch options on one process (test/test_sharded.sh runs --global_batch_size
# over W = 1, 2 and 4 ranks). --batch_size auto --memory_limit: the batch it
# picks trains with a measured peak (the trainer's peak resident memory) under
# the limit, and is the largest whose plan fits (one more row's plan, printed by
# a --dry_run of that batch, does not); with --global_batch_size it is the
# largest of those dividing it, gradient accumulation making up the rest.
# --global_batch_size G: --gradient_accumulation_steps = G / --batch_size, so
# any split of G rows trains the trajectory one batch of them trains, and a
# checkpoint resumes under another split of the same G.
#
# Tolerance for "the same trajectory": 1e-6 relative on every step's loss and
# gradient norm, 2e-4 of their scale on the final weights, as test_sharded.sh
# states why (a different split sums the same rows' gradients in another order:
# fp32 rounding, amplified on the weights by AdamW's division by sqrt(v)).
set -u
SUITE=batch
source test/train_helpers.sh # BIN, TMP, FIX, check, trajectory_diff
dir_of_bin=$(dirname "$BIN")
compare="$dir_of_bin/test/st_compare"
COMMON=(--data $FIX/data.jsonl --max_seq_len 24 --lr 5e-3 --warmup_steps 2 --weight_decay 0.01 --threads 1)
FULL=(--model $FIX/tiny_tied --full_finetune --chunk_size 7)
go() { # go OUT [args]: one run, output in OUT, metrics in OUT.jsonl, log in OUT.log
    local out=$1; shift
    "$BIN" "${COMMON[@]}" --output_dir "$out" --metrics_file "$out.jsonl" "$@" >"$out.log" 2>&1
}
auto_line() { grep -- "^--batch_size auto:" "$1"; }
chosen() { auto_line "$1" | sed -E 's/^--batch_size auto: ([0-9]+) rows.*/\1/'; }
budget() { auto_line "$1" | sed -E 's/.* of the ([0-9.]+) MiB .*/\1/'; }
plan_total() { sed -n 's/^  total  *\([0-9.]*\) MiB$/\1/p' "$1"; }
peak() { sed -n 's/^peak resident memory \([0-9.]*\) MiB.*/\1/p' "$1"; }

# --batch_size auto measures peaks against a limit: under SANITIZE=1 ASan's shadow memory and
# quarantine are resident memory that no plan counts, so these checks belong to the plain build
if [ -n "${ASAN_OPTIONS:-}" ]; then
    echo "SKIP batch: --batch_size auto --memory_limit under SANITIZE=1 (ASan's shadow memory is resident memory no plan counts)"
else
    # --batch_size auto under --memory_limit, in three memory shapes (LoRA whole sequences; full
    # fine-tuning in recomputed chunks; LoRA all-linear with activation checkpointing), two limits each
    i=0
    for cfg in "--model $FIX/tiny_gqa" "${FULL[*]} --chunk_memory recompute" \
               "--model $FIX/tiny_mistral --lora_target_modules all-linear --activation_checkpointing"; do
        for limit in 0.03 0.06; do
            i=$((i + 1)); out="$TMP/auto$i"
            go "$out" $cfg --batch_size auto --memory_limit $limit --max_steps 3
            rc=$?
            b=$(chosen "$out.log") p=$(peak "$out.log") mib=$(awk -v g=$limit 'BEGIN { print g * 1024 }')
            # the limit binds (a batch well inside [2, 65536)), and the measured peak stays under it
            [ $rc -eq 0 ] && [ -n "$b" ] && [ "$b" -gt 1 ] && [ "$b" -lt 65536 ] && [ -n "$p" ] &&
                awk -v p="$p" -v m="$mib" 'BEGIN { exit !(p < m) }'
            check "--batch_size auto --memory_limit $limit ($cfg): $b rows, measured peak $p MiB < $mib MiB" $? "$(tail -3 "$out.log")"
            # the largest: the plan the run printed for its batch fits the budget, one more row's does not
            # (both printed to 0.1 MiB: the budget's rounding may hide the last 0.1)
            "$BIN" "${COMMON[@]}" $cfg --batch_size $((b + 1)) --max_steps 3 --dry_run --output_dir "$TMP/dry" >"$out.dry" 2>&1
            awk -v mine="$(plan_total "$out.log")" -v more="$(plan_total "$out.dry")" -v budget="$(budget "$out.log")" \
                'BEGIN { exit !(mine != "" && more != "" && mine <= budget && more > budget - 0.1) }'
            rc=$? # before the command substitutions below, which would reset $?
            check "  ... and it is the largest: $((b + 1)) rows plan $(plan_total "$out.dry") MiB, over the $(budget "$out.log") MiB budget" $rc \
                "$(auto_line "$out.log")"
        done
    done

    # with --global_batch_size: the largest divisor of it that fits, and accumulation for the rest
    go "$TMP/fit" "${FULL[@]}" --batch_size auto --memory_limit 0.012 --max_steps 1
    fit=$(chosen "$TMP/fit.log") # about 32 rows: less than 48 and 41
    for G in 48 41; do # 24 rows of 48 (2 micro-batches); 41 is prime: 41 micro-batches of 1
        go "$TMP/autog$G" "${FULL[@]}" --batch_size auto --memory_limit 0.012 --global_batch_size $G --max_steps 1
        b=$(chosen "$TMP/autog$G.log") want=1
        for d in $(seq 1 $G); do [ $((G % d)) -eq 0 ] && [ "$d" -le "${fit:-0}" ] && want=$d; done
        grep -q "steps of $((G / want)) x 1 x $want rows" "$TMP/autog$G.log" && grep -qE "(^| )batch_size +$want( |$)" "$TMP/autog$G.log"
        check "--batch_size auto --global_batch_size $G: $b rows x $((G / ${b:-1})) micro-batches (the largest divisor of $G within the $fit that fit), in the table" $? \
            "$(auto_line "$TMP/autog$G.log"); $(grep "steps of" "$TMP/autog$G.log")"
    done
fi

# --global_batch_size: 24 rows a step as 2 x 12 (the reference), 8 x 3, 6 x 4 and 1 x 24
go "$TMP/ref" "${FULL[@]}" --batch_size 12 --gradient_accumulation_steps 2 --max_steps 10
check "reference run: 2 micro-batches of 12 rows" $? "$(tail -3 "$TMP/ref.log")"
same() { # same NAME REF OUT [FROM]: trajectory and final weights of OUT within tolerance of REF
    local t w rc
    t=$(trajectory_diff "$3.jsonl" "$2.jsonl" "${4:-1}")
    w=$("$compare" "$3/model.safetensors" "$2/model.safetensors" 2e-4 2>&1)
    rc=$?
    awk -v t="$t" 'BEGIN { exit !(t <= 1e-6) }' && [ $rc -eq 0 ]
    check "$1 (trajectory within $t, $w)" $? "$(tail -3 "$3.log")"
}
for b in 3 4 24; do
    go "$TMP/g$b" "${FULL[@]}" --batch_size $b --global_batch_size 24 --max_steps 10
    grep -q "10 steps of $((24 / b)) x 1 x $b rows" "$TMP/g$b.log"
    check "--global_batch_size 24 --batch_size $b: $((24 / b)) micro-batches a step" $? "$(grep "steps of" "$TMP/g$b.log")"
    same "--global_batch_size 24 as $((24 / b)) x $b rows == 2 x 12" "$TMP/ref" "$TMP/g$b"
done
go "$TMP/gexplicit" "${FULL[@]}" --batch_size 4 --gradient_accumulation_steps 6 --global_batch_size 24 --max_steps 1
check "--global_batch_size with the --gradient_accumulation_steps it implies is taken" $? "$(tail -2 "$TMP/gexplicit.log")"

# a checkpoint of 8 x 3 rows resumes as 4 x 6 (the same 24 rows a step); another global batch is refused
go "$TMP/save" "${FULL[@]}" --batch_size 3 --global_batch_size 24 --max_steps 10 --save_every 5 --keep_checkpoints 0
mkdir -p "$TMP/resume" && cp -r "$TMP/save/checkpoint-5" "$TMP/resume/" && head -5 "$TMP/save.jsonl" >"$TMP/resume.jsonl"
"$BIN" "${COMMON[@]}" "${FULL[@]}" --batch_size 6 --global_batch_size 24 --max_steps 10 --resume "$TMP/resume" \
    --output_dir "$TMP/resume" --metrics_file "$TMP/resume.jsonl" >"$TMP/resume.log" 2>&1
grep -q "resumed from $TMP/resume/checkpoint-5 at step 5" "$TMP/resume.log"
check "a checkpoint of 8 x 3 rows resumes as 4 x 6" $? "$(tail -3 "$TMP/resume.log")"
same "  ... and continues the uninterrupted run (steps 6-10, final weights)" "$TMP/save" "$TMP/resume" 6
go "$TMP/other" "${FULL[@]}" --batch_size 6 --global_batch_size 12 --max_steps 10 --resume "$TMP/save/checkpoint-5"
[ $? -ne 0 ] && grep -q "the global batch was 24 rows in the checkpoint (1 rank(s) x 8 micro-batches x 3 rows) and is 12 now" "$TMP/other.log"
check "a resume with another global batch is refused" $? "$(tail -2 "$TMP/other.log")"

exit $((fails > 0))
