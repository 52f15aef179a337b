# Sourced by dev/plan_*.sh (train_llama2cu --dry_run plans on real configs): checks the
# binary, makes $work (removed on exit) with $work/long.jsonl, 12 rows of $1 random words
# (text enough for packed rows of the longest T; the tiny test tokenizer's ids fit every
# vocabulary), and defines gib MIB (MiB as GiB, one decimal).
[ -x ./train_llama2cu ] || { echo "error: build train_llama2cu first (make train_llama2cu)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$work/long.jsonl" "$1" <<'PY'
import json, random, sys
random.seed(0)
words = "the cat sat on a mat and then it went home to sleep".split()
with open(sys.argv[1], "w") as f:
    for _ in range(12):
        f.write(json.dumps({"text": " ".join(random.choice(words) for _ in range(int(sys.argv[2])))}) + "\n")
PY
gib() { awk -v m="$1" 'BEGIN { printf "%.1f", m / 1024 }'; }
