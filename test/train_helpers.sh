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
run() { # run DIR STEPS [extra args]: output in DIR, metrics in DIR.jsonl, log in DIR.log
    local dir=$1 steps=$2; shift 2
    "$BIN" "${ARGS[@]}" --max_steps "$steps" --output_dir "$dir" --metrics_file "$dir.jsonl" "$@" >"$dir.log" 2>&1
}
start() { # start DIR STEPS [extra args]: like run, in the background; $pid is the trainer's
    local dir=$1 steps=$2; shift 2
    "$BIN" "${ARGS[@]}" --max_steps "$steps" --output_dir "$dir" --metrics_file "$dir.jsonl" "$@" >"$dir.log" 2>&1 &
    pid=$!
}
# the deterministic part of each metrics record (times and memory differ between runs)
trajectory() { sed -E 's/, "ms".*//' "$1"; }
same_result() { # same_result NAME REF DIR WEIGHTS_FILE
    cmp -s "$2/$4" "$3/$4" && diff -q <(trajectory "$2.jsonl") <(trajectory "$3.jsonl") >/dev/null
    check "$1" $? "$(cmp "$2/$4" "$3/$4" 2>&1 | head -1); $(diff <(trajectory "$2.jsonl") <(trajectory "$3.jsonl") | head -4)"
}
