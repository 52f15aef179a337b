#!/usr/bin/env bash
# The repository explains itself: every docs/ chapter a file names exists, every relative
# link in the Markdown resolves (anchors aside), nothing cites a design document outside
# the repository, and the README stays a front door (at most 400 lines; the rest is in docs/).
set -u
SUITE=docs
source test/train_helpers.sh # check
# the files of the repository: git's list in a checkout, else every file outside the build folders
if git rev-parse --git-dir >/dev/null 2>&1; then
    mapfile -t files < <(git ls-files --cached --others --exclude-standard)
else
    mapfile -t files < <(find . -type f ! -path './.git/*' ! -path './build*' ! -path './out/*' | sed 's|^\./||')
fi
text=()
for f in "${files[@]}"; do
    case $f in test/fixtures/*|*.safetensors|*.model|*.bin) continue ;; esac
    [ -f "$f" ] && text+=("$f")
done

missing=$(grep -hoE 'docs/[A-Za-z0-9_-]+\.md' "${text[@]}" | sort -u | while read -r c; do [ -f "$c" ] || echo "$c"; done)
check "every docs/ chapter named in the code and the notes exists" "$([ -z "$missing" ]; echo $?)" "missing: $missing"

broken=""
for md in $(printf '%s\n' "${text[@]}" | grep '\.md$'); do
    dir=$(dirname "$md")
    for link in $(grep -oE '\]\([^)[:space:]]+\)' "$md" | sed -E 's/^\]\((.*)\)$/\1/'); do
        case $link in http://*|https://*|mailto:*|\#*) continue ;; esac
        [ -e "$dir/${link%%#*}" ] || broken="$broken $md:$link"
    done
done
check "every relative link in the Markdown resolves" "$([ -z "$broken" ]; echo $?)" "broken:$broken"

outside=$(grep -lE 'DESIGN section|shared/DESIGN' "${text[@]}" | grep -v '^test/test_docs.sh$')
check "no file cites a design document outside the repository" "$([ -z "$outside" ]; echo $?)" "in: $outside"

# the top level shows the design card (issue 48): at most 14 source files, each one idea that
# README's map and Layout name; the rest lives in peft/, trainer/, support/
top=$(printf '%s\n' "${files[@]}" | grep -E '^[^/]+\.(c|h|cu|cuh)$')
unnamed=$(for f in $top; do grep -q "\`$f\`" README.md || printf ' %s' "$f"; done)
check "the top level holds $(echo "$top" | wc -w) source files, at most 14, each named in README.md" \
    "$([ "$(echo "$top" | wc -w)" -le 14 ] && [ -z "$unnamed" ]; echo $?)" "unnamed:$unnamed; move one into a folder of its idea"

lines=$(wc -l <README.md)
check "README.md is a front door: $lines lines, at most 400" "$([ "$lines" -le 400 ]; echo $?)" "move the long parts to docs/"
exit $((fails > 0))
