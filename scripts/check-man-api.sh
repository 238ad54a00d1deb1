#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# scripts/check-man-api.sh - the section-3 man pages (man/*.3) document the
# public API and stay in step with it. Run by `make check`; by hand:
#   bash scripts/check-man-api.sh [SRCDIR]
# Fails when
#  - an FG_API function of include/flashgrad/*.h is in no page's SYNOPSIS
#    (.Fn / .Fo), or a SYNOPSIS names a function no header declares;
#  - a SYNOPSIS function is missing from its page's NAME (.Nm), which is
#    what apropos and the per-function links (man fg_tensor_zeros) use;
#  - an .Xr to one of our pages names none;
#  - mandoc is installed and `mandoc -Tlint` reports anything (its notes
#    that a referenced page is not installed on this machine aside).
set -euo pipefail

src=${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
cd "$src"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bad=0

# Declared: the name before the first '(' after FG_API, comments and
# preprocessor lines (export.h's #define FG_API) removed.
perl -0777 -ne 's{/\*.*?\*/}{}gs; s{^\s*#.*$}{}mg;
    print "$1\n" while /\bFG_API\b[^;]*?\b(\w+)\s*\(/g' \
    include/flashgrad/*.h | LC_ALL=C sort -u >"$tmp/declared"

# Documented: per page, the SYNOPSIS functions and the NAME entries.
for page in man/*.3; do
    perl -ne '$s = $1 if /^\.Sh\s+(\S+)/;
        print "$1\n" if $s eq "SYNOPSIS" && /^\.F[no]\s+(\w+)/' "$page" |
        LC_ALL=C sort -u >"$tmp/syn"
    perl -ne '$s = $1 if /^\.Sh\s+(\S+)/;
        print "$1\n" if $s eq "NAME" && /^\.Nm\s+(\w+)/' "$page" |
        LC_ALL=C sort -u >"$tmp/name"
    for f in $(LC_ALL=C comm -23 "$tmp/syn" "$tmp/name"); do
        echo "check-man-api: $page: $f is in the SYNOPSIS but not in NAME" >&2
        bad=$((bad + 1))
    done
    cat "$tmp/syn" >>"$tmp/documented"
    basename "$page" .3 >>"$tmp/pages"
done
LC_ALL=C sort -u -o "$tmp/documented" "$tmp/documented"

for f in $(LC_ALL=C comm -23 "$tmp/declared" "$tmp/documented"); do
    echo "check-man-api: $f (include/flashgrad) is in no man/*.3 SYNOPSIS" >&2
    bad=$((bad + 1))
done
for f in $(LC_ALL=C comm -13 "$tmp/declared" "$tmp/documented"); do
    echo "check-man-api: $f is documented in man/ but declared nowhere" >&2
    bad=$((bad + 1))
done

# Cross references to our pages: a page, or a function (installed as a
# link to its page).
for f in man/*.1; do
    [ -e "$f" ] && basename "$f" .1
done >>"$tmp/pages"
cat "$tmp/pages" "$tmp/documented" | LC_ALL=C sort -u >"$tmp/known"
perl -ne 'print "$ARGV: $1\n" while /^\.Xr\s+((?:fg_|flashgrad)\S*)\s+\d/g' \
    man/*.[13] | while read -r where name; do
    if ! grep -qx -- "$name" "$tmp/known"; then
        echo "check-man-api: ${where} .Xr $name: no such page" >&2
        echo x >>"$tmp/xr"
    fi
done
[[ -f $tmp/xr ]] && bad=$((bad + $(wc -l <"$tmp/xr")))

if command -v mandoc >/dev/null 2>&1; then
    # Findings go to stdout, notes about this machine's mandoc.db to
    # stderr: kept apart, so the two streams cannot interleave.
    mandoc -Tlint -W style man/*.[13] >"$tmp/lint.out" 2>"$tmp/lint.err" ||
        true
    cat "$tmp/lint.out" "$tmp/lint.err" |
        grep -v -e 'referenced manual not found' -e 'mandoc\.db' \
            >"$tmp/lint" || true
    if [[ -s $tmp/lint ]]; then
        cat "$tmp/lint" >&2
        bad=$((bad + $(wc -l <"$tmp/lint")))
    fi
    lint="mandoc -Tlint clean"
else
    lint="mandoc not installed: lint skipped"
fi

if ((bad > 0)); then
    echo "check-man-api: $bad problem(s)" >&2
    exit 1
fi
echo "check-man-api: $(wc -l <"$tmp/declared") FG_API functions documented" \
    "in $(ls man/*.3 | wc -l) pages; $lint"
