#!/usr/bin/env bash
# The trainer sharded over real ranks (DESIGN section 5): under mpirun -np 1, 2,
# 3 (and 4 for HYBRID_SHARD with two groups of two), every strategy, LoRA
# (whole sequences, dropout, all-linear) and full fine-tuning (tied embeddings,
# chunks of 7 with a KV carry): with the same global batch (12 rows = W ranks x
# 12/W, 2 micro-batches a step) the 10-step trajectory and the final trainable
# weights equal one process's. Then a checkpoint saved at W = 3 resumed at W = 2
# and W = 1 (and one process's at W = 3) continues the uninterrupted trajectory;
# --export_hf; a corrupt shard
# is refused; and faults: a rank with bad input, a rank that dies, SIGTERM to
# one rank. Without mpirun or an MPI build it says SKIP.
#
# Tolerances. Sums over ranks run in rank order (fsdp.h), so a W-rank run differs
# from one process only where fp32 rounding falls: each rank sums its own rows'
# gradients (one gemm over its tokens) before the ranks' partial sums are added,
# where one process sums all rows at once; the loss likewise. Measured: losses
# and gradient norms within 2.3e-7 relative at every step; weights after 10 AdamW
# steps within 2.1e-5 of their scale, because AdamW divides by sqrt(v): an element
# whose gradient is near zero moves by about lr whatever its rounding, so a
# rounding-sized difference in it becomes a step-sized one (LoRA's B, which
# starts at zero, shows it most). Hence 1e-6 for the trajectory and 2e-4 for the
# weights: a real error (a row dropped, a unit misplaced, a wrong mask or scale)
# moves the loss by 1e-3 or more and the weights by whole steps.
set -u
cd "$(dirname "$0")/.."
BIN=${BIN:-./train_llama2}
dir_of_bin=$(dirname "$BIN")
compare="$dir_of_bin/test/st_compare"
if ! command -v mpirun >/dev/null || ! "$dir_of_bin/test/test_fsdp" --mpi-build 2>/dev/null; then
    echo "SKIP sharded training: $(command -v mpirun >/dev/null && echo "the trainer was built without MPI" || echo "no mpirun (install OpenMPI: libopenmpi-dev openmpi-bin)")"
    exit 0
fi
if [ -n "${ASAN_OPTIONS:-}" ]; then # SANITIZE=1: leaks are checked, except OpenMPI's own (see the file)
    export ASAN_OPTIONS="$ASAN_OPTIONS:fast_unwind_on_malloc=0" LSAN_OPTIONS="${LSAN_OPTIONS:-}:suppressions=$PWD/test/lsan_mpi.supp"
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1
TMP=$(mktemp -d /tmp/test_sharded.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
TRAJ_TOL=1e-6
WEIGHT_TOL=2e-4
TIMEOUT=120 # seconds for one run: a hang fails
fails=0
check() { # check NAME STATUS DETAIL
    if [ "$2" -eq 0 ]; then echo "ok sharded: $1"; else echo "FAIL sharded: $1: $3"; fails=$((fails + 1)); fi
}
LORA=(--model test/fixtures/tiny_gqa --lora_dropout 0.1 --lora_target_modules all-linear)
FULL=(--model test/fixtures/tiny_tied --full_finetune --chunk_size 7)
COMMON=(--data test/fixtures/data.jsonl --max_seq_len 24 --gradient_accumulation_steps 2 --max_steps 10 --lr 5e-3
        --warmup_steps 2 --weight_decay 0.01 --threads 1)
run() { # run W OUT [args]: W ranks (0: one process, no mpirun), output in OUT, metrics in OUT.jsonl, log in OUT.log
    local w=$1 out=$2; shift 2
    local launch=(timeout $TIMEOUT)
    [ "$w" -gt 0 ] && launch+=(mpirun -np "$w")
    "${launch[@]}" "$BIN" "${COMMON[@]}" --output_dir "$out" --metrics_file "$out.jsonl" "$@" >"$out.log" 2>&1
}
# the largest relative difference of loss and grad_norm over the steps two metrics files share (steps >= FROM)
trajectory_diff() {
    awk -v from="${3:-1}" 'function num(line, key,   m) { return match(line, "\"" key "\": [^,}]*") ? substr(line, RSTART + length(key) + 4, RLENGTH - length(key) - 4) + 0 : "x" }
        function rel(a, b,   d, m) { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b; return m > 0 ? d / m : d }
        FNR == NR { if (index($0, "\"loss\"")) { loss[num($0, "step")] = num($0, "loss"); norm[num($0, "step")] = num($0, "grad_norm") } next }
        index($0, "\"loss\"") { s = num($0, "step"); if (s < from) next; n++
            if (!(s in loss)) { worst = 1e9; next }
            e = rel(loss[s], num($0, "loss")); if (e > worst) worst = e
            e = rel(norm[s], num($0, "grad_norm")); if (e > worst) worst = e }
        END { if (n == 0) worst = 1e9; printf "%.3g", worst + 0 }' "$1" "$2"
}
same_run() { # same_run NAME REF OUT WEIGHTS_FILE [FROM]: trajectory and weights of OUT within tolerance of REF
    local t w rc
    t=$(trajectory_diff "$3.jsonl" "$2.jsonl" "${5:-1}")
    w=$("$compare" "$3/$4" "$2/$4" $WEIGHT_TOL 2>&1)
    rc=$?
    awk -v t="$t" -v tol=$TRAJ_TOL 'BEGIN { exit !(t <= tol) }' && [ $rc -eq 0 ]
    check "$1 (trajectory within $t of one process's, $w)" $? "$(tail -3 "$3.log")"
}

# one process: the references
run 0 "$TMP/lora1" "${LORA[@]}" --batch_size 12
check "LoRA reference run (one process)" $? "$(tail -3 "$TMP/lora1.log")"
run 0 "$TMP/full1" "${FULL[@]}" --batch_size 12
check "full fine-tuning reference run (one process)" $? "$(tail -3 "$TMP/full1.log")"

for w in 1 2 3; do
    for s in FULL_SHARD SHARD_GRAD_OP NO_SHARD HYBRID_SHARD; do
        run $w "$TMP/lora-$w-$s" "${LORA[@]}" --batch_size $((12 / w)) --sharding_strategy $s
        same_run "LoRA, W = $w, $s == one process" "$TMP/lora1" "$TMP/lora-$w-$s" adapter_model.safetensors
        run $w "$TMP/full-$w-$s" "${FULL[@]}" --batch_size $((12 / w)) --sharding_strategy $s
        same_run "full fine-tuning, W = $w, $s == one process" "$TMP/full1" "$TMP/full-$w-$s" model.safetensors
    done
done
run 4 "$TMP/lora-4-hybrid" "${LORA[@]}" --batch_size 3 --sharding_strategy HYBRID_SHARD --shard_group 2
same_run "LoRA, W = 4, HYBRID_SHARD in two groups of two == one process" "$TMP/lora1" "$TMP/lora-4-hybrid" adapter_model.safetensors
run 4 "$TMP/full-4-hybrid" "${FULL[@]}" --batch_size 3 --sharding_strategy HYBRID_SHARD --shard_group 2
same_run "full fine-tuning, W = 4, HYBRID_SHARD in two groups of two == one process" "$TMP/full1" "$TMP/full-4-hybrid" model.safetensors
grep -q "4 ranks, HYBRID_SHARD: shard groups of 2, 2 replica(s)" "$TMP/full-4-hybrid.log"
check "W = 4 HYBRID_SHARD says its groups" $? "$(head -3 "$TMP/full-4-hybrid.log")"

# a checkpoint saved at W = 3 (full fine-tuning: each rank its shards) resumed at W = 2 and W = 1
run 3 "$TMP/save3" "${FULL[@]}" --batch_size 4 --save_every 5 --keep_checkpoints 0
[ $? -eq 0 ] && [ -f "$TMP/save3/checkpoint-5/fsdp_index.json" ] && [ -f "$TMP/save3/checkpoint-5/fsdp-00002-of-00003.safetensors" ]
check "W = 3 writes a sharded checkpoint (three shards and the index)" $? "$(ls "$TMP/save3/checkpoint-5" 2>&1)"
for w in 2 1; do
    out="$TMP/resume$w"
    mkdir -p "$out" && cp -r "$TMP/save3/checkpoint-5" "$out/"
    head -5 "$TMP/save3.jsonl" >"$out.jsonl"
    run $w "$out" "${FULL[@]}" --batch_size $((12 / w)) --resume "$out"
    grep -q "resumed from $out/checkpoint-5 at step 5" "$out.log"
    check "the W = 3 checkpoint resumes at W = $w" $? "$(tail -3 "$out.log")"
    same_run "resumed at W = $w == the uninterrupted W = 3 run (steps 6-10, final weights)" "$TMP/save3" "$out" model.safetensors 6
done
run 0 "$TMP/save1" "${FULL[@]}" --batch_size 12 --save_every 5 --keep_checkpoints 0 # an unsharded checkpoint
out="$TMP/resume-sharded"
mkdir -p "$out" && cp -r "$TMP/save1/checkpoint-5" "$out/" && head -5 "$TMP/save1.jsonl" >"$out.jsonl"
run 3 "$out" "${FULL[@]}" --batch_size 4 --resume "$out"
same_run "one process's checkpoint resumed sharded at W = 3 == uninterrupted (steps 6-10, final weights)" "$TMP/save1" "$out" model.safetensors 6
run 3 "$TMP/lora-save3" "${LORA[@]}" --batch_size 4 --save_every 5 --keep_checkpoints 0
out="$TMP/lora-resume2"
mkdir -p "$out" && cp -r "$TMP/lora-save3/checkpoint-5" "$out/" && head -5 "$TMP/lora-save3.jsonl" >"$out.jsonl"
run 2 "$out" "${LORA[@]}" --batch_size 6 --resume "$out"
same_run "LoRA saved at W = 3, resumed at W = 2 == uninterrupted (steps 6-10, final adapter)" "$TMP/lora-save3" "$out" adapter_model.safetensors 6
run 2 "$TMP/badbatch" "${FULL[@]}" --batch_size 4 --resume "$TMP/save3/checkpoint-5"
[ $? -ne 0 ] && grep -q "the global batch was 3 rank(s) x 4 rows" "$TMP/badbatch.log"
check "a resume with another global batch is refused" $? "$(tail -3 "$TMP/badbatch.log")"

# --export_hf: the consolidated model of a sharded checkpoint, at any world size, is the run's own final model
for w in 2 0; do
    run $w "$TMP/export$w" "${FULL[@]}" --batch_size $((w ? 12 / w : 12)) --resume "$TMP/save3/checkpoint-10" --export_hf "$TMP/export$w/hf"
    cmp -s "$TMP/export$w/hf/model.safetensors" "$TMP/save3/model.safetensors" && [ -f "$TMP/export$w/hf/config.json" ]
    check "--export_hf of the W = 3 checkpoint at W = ${w/0/1} == the run's final model, bit for bit" $? "$(tail -3 "$TMP/export$w.log")"
done

# a corrupt shard is refused, naming the file, on every rank
out="$TMP/corrupt"
mkdir -p "$out" && cp -r "$TMP/save3/checkpoint-5" "$out/"
shard="$out/checkpoint-5/fsdp-00001-of-00003.safetensors"
size=$(stat -c %s "$shard")
printf '\x7f' | dd of="$shard" bs=1 seek=$((size - 100)) conv=notrunc 2>/dev/null
run 2 "$out" "${FULL[@]}" --batch_size 6 --resume "$out"
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "fsdp-00001-of-00003.safetensors: its size or contents are not what" "$out.log"
check "a corrupt shard is refused (every rank exits, the file named)" $? "status $rc; $(tail -3 "$out.log")"

# faults: every rank ends, non-zero, within the timeout, with a message; nothing is left running
fault() { # fault NAME EXPECT MPIRUN-ARGS...: runs mpirun with the given app contexts
    local name=$1 expect=$2 start rc
    shift 2
    start=$(date +%s)
    timeout 60 mpirun "$@" >"$TMP/fault.log" 2>&1
    rc=$?
    [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q -- "$expect" "$TMP/fault.log" && ! pgrep -f "$TMP/fault-out" >/dev/null
    check "$name: every rank exits non-zero ($(( $(date +%s) - start )) s), saying '$expect'" $? "status $rc (124: hung); $(tail -5 "$TMP/fault.log")"
}
ARGS=("${COMMON[@]}" "${FULL[@]}" --batch_size 4 --output_dir "$TMP/fault-out")
fault "a data file only rank 2 cannot read" "stopping every rank: another rank failed" \
    -np 2 "$BIN" "${ARGS[@]}" : -np 1 "$BIN" "${ARGS[@]}" --data "$TMP/missing.jsonl"
grep -q "missing.jsonl" "$TMP/fault.log"
check "the failing rank names the file it cannot read" $? "$(tail -5 "$TMP/fault.log")"
fault "rank 2 killed (SIGKILL) after step 3" "" \
    -np 2 "$BIN" "${ARGS[@]}" : -np 1 env LLAMA2TUNE_FAULT=step:3 "$BIN" "${ARGS[@]}"

# SIGTERM to one rank: every rank finishes the step, they save together and exit 0
timeout 120 mpirun -np 3 "$BIN" "${COMMON[@]}" "${FULL[@]}" --batch_size 4 --max_steps 100000 --output_dir "$TMP/term" \
    --metrics_file "$TMP/term.jsonl" >"$TMP/term.log" 2>&1 &
launcher=$!
for _ in $(seq 600); do [ -f "$TMP/term.jsonl" ] && [ "$(wc -l <"$TMP/term.jsonl")" -ge 2 ] && break; sleep 0.1; done
kill -TERM "$(pgrep -P $launcher | tail -1)"
wait $launcher
rc=$?
last=$(ls -d "$TMP/term"/checkpoint-* 2>/dev/null | tail -1)
[ $rc -eq 0 ] && [ -f "$last/fsdp_index.json" ] && grep -q "stopped by a signal" "$TMP/term.log"
check "SIGTERM to one of 3 ranks: all save ($(basename "${last:-none}")) and exit 0" $? "status $rc; $(tail -3 "$TMP/term.log")"
exit $((fails > 0))
