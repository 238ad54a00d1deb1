#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# scripts/check-man-train.sh - man/flashgrad-train.1 documents exactly the
# options `flashgrad-train --help` prints: an option of --help missing from
# the page, or one on the page that --help no longer has, fails. Run by
# `make check` from the build folder (skipped, exit 77, when the program is
# not built); by hand:
#   bash scripts/check-man-train.sh [PROGRAM]
set -euo pipefail

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
page=$src/man/flashgrad-train.1
bin=${1:-${FG_TRAIN:-}}
if [[ -z $bin ]]; then
    for p in tools/train/flashgrad-train examples/flashgrad-train; do
        [[ -x $p ]] && { bin=$p; break; }
    done
fi
if [[ -z $bin || ! -x $bin ]]; then
    echo "check-man-train: flashgrad-train is not built here: skipped"
    exit 77
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Some versions print --help to stderr or exit non-zero after it.
"$bin" --help >"$tmp/help" 2>&1 || true
# Options are the lines that start with --, up to the description (two
# spaces); prose that mentions an option (--name=value) is not one.
perl -ne 'next unless /^\s*(--\S.*?)(?:\s{2,}|$)/;
    my $spec = $1; print "$1\n" while $spec =~ /(--[a-z][a-z0-9-]*)/g' \
    "$tmp/help" | LC_ALL=C sort -u >"$tmp/help.opts"
if [[ ! -s $tmp/help.opts ]]; then
    echo "check-man-train: $bin --help printed no options:" >&2
    cat "$tmp/help" >&2
    exit 1
fi
# Options on the page: every `Fl \-name` (mdoc), spelled as on the command line.
perl -ne 'while (/\bFl\s+\\-((?:[a-z0-9]|\\-)+)/g) {
        (my $o = $1) =~ s/\\-/-/g; print "--$o\n" }' "$page" |
    LC_ALL=C sort -u >"$tmp/page.opts"

# comm -3: options only in --help in column 1, only on the page in 2.
bad=0
while IFS= read -r line; do
    if [[ $line == $'\t'* ]]; then
        echo "check-man-train: ${line#$'\t'} is in man/flashgrad-train.1 but not in --help" >&2
    else
        echo "check-man-train: $line is in --help but not in man/flashgrad-train.1" >&2
    fi
    bad=$((bad + 1))
done < <(LC_ALL=C comm -3 "$tmp/help.opts" "$tmp/page.opts")
if ((bad > 0)); then
    echo "check-man-train: $bad option(s) differ: update man/flashgrad-train.1" >&2
    exit 1
fi
echo "check-man-train: the $(wc -l <"$tmp/help.opts") options of --help are documented"
