#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# scripts/license-notice.sh - gives every tracked source and script file a
# one-line SPDX notice (the license is in LICENSE):
#   bash scripts/license-notice.sh           add it where it is missing
#   bash scripts/license-notice.sh --check   list files without it; exit 1
# The notice goes on the first line, or after a #! line (and a Python coding
# line). Files that already name an SPDX-License-Identifier in their first
# three lines are left alone, so running it twice changes nothing.
# Generated files get it too: their generator should print it (e.g.
# scripts/gen_wgmma.py for kernels/attention/wgmma_ops.inc).
set -euo pipefail

SPDX=MIT
check=0
case ${1-} in
--check) check=1 ;;
'') ;;
*) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac
cd "$(git -C "$(dirname "${BASH_SOURCE[0]}")" rev-parse --show-toplevel)"

# The comment syntax for a path; empty: not a source or script file.
style_of() {
    case $1 in
    *.c | *.h | *.cu | *.cuh | *.inc) echo c ;;
    *.[1-9] | *.[1-9].in) echo roff ;;
    *.sh | *.py | *.am | *.pc.in | .ci/* | build-aux/*) echo hash ;;
    *.ac | *.m4) echo dnl ;;
    *) echo ;;
    esac
}

missing=0
changed=0
while IFS= read -r -d '' f; do
    style=$(style_of "$f")
    [[ -n $style && -f $f ]] || continue
    head -n 3 -- "$f" | grep -q 'SPDX-License-Identifier:' && continue
    missing=$((missing + 1))
    if ((check)); then
        echo "$f"
        continue
    fi
    case $style in
    c) line="/* SPDX-License-Identifier: $SPDX */" ;;
    roff) line=".\\\" SPDX-License-Identifier: $SPDX" ;;
    hash) line="# SPDX-License-Identifier: $SPDX" ;;
    dnl) line="dnl SPDX-License-Identifier: $SPDX" ;;
    esac
    # After a #! line, and after a Python coding line that follows it.
    skip=0
    if [[ $(head -c 2 -- "$f") == '#!' ]]; then
        skip=1
        sed -n 2p -- "$f" | grep -Eq '^#.*coding[:=]' && skip=2
    fi
    tmp=$(mktemp "$f.XXXXXX")
    { head -n "$skip" -- "$f"; printf '%s\n' "$line"; tail -n +$((skip + 1)) -- "$f"; } >"$tmp"
    chmod --reference="$f" "$tmp"
    mv -f -- "$tmp" "$f"
    changed=$((changed + 1))
done < <(git ls-files -z)

if ((check)); then
    ((missing == 0)) || { echo "license-notice: $missing file(s) without an SPDX notice" >&2; exit 1; }
    echo "license-notice: every source and script file has an SPDX notice"
else
    echo "license-notice: added the notice to $changed file(s)"
fi
