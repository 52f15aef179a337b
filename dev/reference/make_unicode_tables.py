#!/usr/bin/env python3
# Regenerate (from the repo root):
#   pip install unicodedata2==16.0.0
#   python3 dev/reference/make_unicode_tables.py
#
# Writes support/unicode_tables.h: the character classes the pre-tokenizer
# regexes of tokenizer.json (Llama-3's and GPT-2's, tokenizer.h) use, as sorted
# inclusive code point ranges:
#   \p{L}  letters: general category L* (Lu Ll Lt Lm Lo)
#   \p{N}  numbers: general category N* (Nd Nl No)
#   \s     White_Space: categories Zs Zl Zp, plus U+0009..U+000D and U+0085
#          (Unicode's White_Space property; Python's str.isspace() differs:
#          it also takes U+001C..U+001F)
#   and, for Llama-3's case-insensitive (?i:'s|'t|'re|'ve|'m|'ll|'d), every
#   code point whose case folding is one of those ASCII letters.
#
# Which Unicode version: the one of the regex engine the `tokenizers` library
# runs these patterns with (Oniguruma, in the PyPI wheels), which is Unicode
# 16.0 for tokenizers 0.23.3. Python 3.11's own `unicodedata` is Unicode 14.0,
# whose tables miss 9272 letters and 120 numbers the engine knows (CJK Extension
# H and I, Garay, Kawi, ...), so the tables come from `unicodedata2` (PyPI: the
# same module as the standard library's, for a newer Unicode version), pinned
# below. When the `tokenizers` library is installed, every table is checked
# against what its engine matches, for every code point; a mismatch stops the
# script. (dev/reference/make_bpe_fixtures.py also tests characters of
# Unicode 15 and 16 against the library end to end.)
import sys

UNICODE_VERSION = "16.0.0"
OUT = "support/unicode_tables.h"

try:
    import unicodedata2 as ud
except ImportError:
    sys.exit("needs unicodedata2 %s (pip install unicodedata2==%s)" % (UNICODE_VERSION, UNICODE_VERSION))
if ud.unidata_version != UNICODE_VERSION:
    sys.exit("unicodedata2 has Unicode %s, want %s" % (ud.unidata_version, UNICODE_VERSION))

ALL = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]  # surrogates are no characters of a str
FOLD_LETTERS = "dlmrstve"  # the letters after ' in Llama-3's contractions


def classes():
    cat = {c: ud.category(chr(c)) for c in ALL}
    letter = {c for c in ALL if cat[c][0] == "L"}
    number = {c for c in ALL if cat[c][0] == "N"}
    space = {c for c in ALL if cat[c] in ("Zs", "Zl", "Zp")} | set(range(0x09, 0x0E)) | {0x85}
    folds = {x: sorted(c for c in ALL if chr(c).casefold() == x) for x in FOLD_LETTERS}
    return letter, number, space, folds


def ranges(s):
    out = []
    for c in sorted(s):
        if out and out[-1][1] == c - 1:
            out[-1][1] = c
        else:
            out.append([c, c])
    return out


def check_against_engine(letter, number, space, folds):
    """what the tokenizers library's regex engine matches, every code point"""
    try:
        from tokenizers import Regex, pre_tokenizers
    except ImportError:
        print("tokenizers not installed: tables not checked against its regex engine")
        return

    def engine(pattern):
        split = pre_tokenizers.Split(Regex(pattern), behavior="removed", invert=False)
        matched = set()
        for i in range(0, len(ALL), 50000):
            chunk = ALL[i:i + 50000]
            left = set()  # the pieces "removed" leaves are the characters that did not match
            for _, (a, b) in split.pre_tokenize_str("".join(map(chr, chunk))):
                left.update(chunk[a:b])
            matched |= set(chunk) - left
        return matched

    bad = []
    for name, pattern, ours in [("letter", r"\p{L}", letter), ("number", r"\p{N}", number), ("space", r"\s", space)] + \
            [("fold " + x, "(?i:%s)" % x, set(folds[x])) for x in FOLD_LETTERS]:
        theirs = engine(pattern)
        if theirs != ours:
            bad.append("%s: engine only %s, ours only %s" % (name, sorted(theirs - ours)[:8], sorted(ours - theirs)[:8]))
    if bad:
        sys.exit("tables differ from the tokenizers library's regex engine:\n  " + "\n  ".join(bad))
    import tokenizers
    print("tables equal what tokenizers %s's regex engine matches, every code point" % tokenizers.__version__)


def table(name, rs):
    lines = ["static const uint32_t %s[][2] = { // %d ranges" % (name, len(rs))]
    row = []
    for a, b in rs:
        row.append("{0x%X,0x%X}," % (a, b))
        if len(row) == 6:
            lines.append("    " + "".join(row))
            row = []
    if row:
        lines.append("    " + "".join(row))
    lines.append("};")
    return "\n".join(lines)


def main():
    letter, number, space, folds = classes()
    check_against_engine(letter, number, space, folds)
    pairs = sorted((c, x) for x in FOLD_LETTERS for c in folds[x])
    fold_lines = ["// (?i:x) for the letters x of Llama-3's contractions: {code point, the ASCII letter it",
                  "// case-folds to}, every code point that folds to one of them, sorted",
                  "static const uint32_t uni_fold[][2] = {%s};" % ", ".join("{0x%X,'%s'}" % (c, x) for c, x in pairs)]
    text = """// unicode_tables.h: Unicode character classes for the pre-tokenizer regexes of
// tokenizer.h's tokenizer.json path. GENERATED by dev/reference/make_unicode_tables.py
// from unicodedata2 %s (Unicode %s); do not edit.
//
// Unicode %s is what the regex engine of the `tokenizers` library (Oniguruma,
// tokenizers 0.23.3) matches; the script checked these tables against that
// engine for every code point. Python 3.11's own unicodedata (Unicode 14.0)
// would miss 9272 letters and 120 numbers. A later tokenizers release whose
// engine moves to a newer Unicode would differ on characters assigned since.
//
// Each table is sorted, inclusive [first, last] code point ranges.
#ifndef UNICODE_TABLES_H
#define UNICODE_TABLES_H
#include <stdint.h>

// \\p{L}: general category L (Lu, Ll, Lt, Lm, Lo)
%s

// \\p{N}: general category N (Nd, Nl, No)
%s

// \\s: the White_Space property (categories Zs, Zl, Zp, and U+0009..U+000D, U+0085)
%s

%s

#endif // UNICODE_TABLES_H
""" % (UNICODE_VERSION, UNICODE_VERSION, UNICODE_VERSION,
       table("uni_letter", ranges(letter)), table("uni_number", ranges(number)), table("uni_space", ranges(space)),
       "\n".join(fold_lines))
    with open(OUT, "w") as f:
        f.write(text)
    print("wrote %s: %d letter, %d number, %d space ranges" % (OUT, len(ranges(letter)), len(ranges(number)), len(ranges(space))))


if __name__ == "__main__":
    main()
