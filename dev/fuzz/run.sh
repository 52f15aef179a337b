#!/usr/bin/env bash
# Runs libFuzzer targets built by `make fuzz` (build-fuzz/fuzz_<target>), each for
# FUZZ_SECONDS seconds, FUZZ_JOBS of them at a time (default: one per CPU).
#   dev/fuzz/run.sh json cli ...
# Each target starts from its committed seeds (dev/fuzz/corpus/<target>/) plus
# what earlier runs found (build-fuzz/corpus/<target>/, not committed). A crash,
# leak, timeout or out-of-memory is minimised and saved as a regression input in
# test/fuzz_regress/<target>/ (which `make test` replays); the run then fails.
# Prints one "ok"/"FAIL" line per target with executions and coverage
# (libFuzzer's cov: edges and ft: features); full logs in build-fuzz/logs/.
set -u
cd "$(dirname "$0")/../.."
secs=${FUZZ_SECONDS:-60}
jobs=${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 1)}
# the targets write their temp files per input: keep that in memory when we can,
# in a folder of this run's own (libFuzzer's time limit exits without atexit cleanup)
base=${TMPDIR:-/tmp}
if [ -z "${TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ]; then base=/dev/shm; fi
TMPDIR=$(mktemp -d "$base/llama2tune_fuzz_run.XXXXXX") || exit 1
export TMPDIR
trap 'rm -rf "$TMPDIR"' EXIT
mkdir -p build-fuzz/logs

dict_for() {
    case $1 in
        json|safetensors|st_index|config|model|meta|adapter|data|checkpoint|fsdp_index) echo dev/fuzz/dict/json.dict ;;
        tokcache) echo dev/fuzz/dict/tokcache.dict ;;
        cli) echo dev/fuzz/dict/cli.dict ;;
        tokenizer_load) echo dev/fuzz/dict/tokenizer.dict ;;
        tokenizer_json|gguf_vocab) echo dev/fuzz/dict/tokenizer_json.dict ;;
    esac
}

run_one() {
    local t=$1 bin=build-fuzz/fuzz_$1 log=build-fuzz/logs/$1.log
    local work=build-fuzz/corpus/$t art=build-fuzz/artifacts/$t/ dict
    dict=$(dict_for "$t")
    mkdir -p "$work" "$art"
    rm -f "$art"*
    "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -close_fd_mask=3 -print_final_stats=1 \
        -artifact_prefix="$art" ${dict:+-dict=$dict} "$work" "dev/fuzz/corpus/$t" >"$log" 2>&1
    local rc=$?
    local execs cov ft corp
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
    ft=$(grep -o 'ft: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
    corp=$(grep -o 'corp: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
    local found=0 a
    for a in "$art"*; do
        [ -f "$a" ] || continue
        found=1
        mkdir -p "test/fuzz_regress/$t"
        local name dest
        name=$(basename "$a")
        dest="test/fuzz_regress/$t/$name"
        # minimise it (crashes and leaks; timeouts and OOMs are kept as found)
        if ! "$bin" -minimize_crash=1 -max_total_time=60 -timeout=10 -close_fd_mask=3 \
                -exact_artifact_path="$dest" "$a" >>"$log" 2>&1 || [ ! -s "$dest" ]; then
            cp "$a" "$dest"
        fi
        echo "FAIL fuzz $t: $name saved as $dest ($(wc -c <"$dest") bytes); see $log"
    done
    if [ $rc -ne 0 ] && [ $found -eq 0 ]; then
        echo "FAIL fuzz $t: exit status $rc and no artifact; see $log"
    elif [ $found -eq 0 ]; then
        echo "ok fuzz $t: ${execs:-?} executions in ${secs} s, cov ${cov:-?} ft ${ft:-?}, corpus ${corp:-?}"
    fi
}

status=0
rm -f build-fuzz/logs/*.summary
for t in "$@"; do
    if [ ! -x "build-fuzz/fuzz_$t" ]; then echo "FAIL fuzz $t: build-fuzz/fuzz_$t not built (make fuzz)"; status=1; continue; fi
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
    run_one "$t" > "build-fuzz/logs/$t.summary" &
done
wait
for t in "$@"; do
    [ -f "build-fuzz/logs/$t.summary" ] || continue
    cat "build-fuzz/logs/$t.summary"
    grep -q '^FAIL' "build-fuzz/logs/$t.summary" && status=1
    rm -f "build-fuzz/logs/$t.summary"
done
exit $status
