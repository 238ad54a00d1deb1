#!/bin/bash
# SPDX-License-Identifier: MIT
# scripts/sass-compare.sh OLD NEW CONFIG_DIR [FILE.cu ...] - static SASS
# comparison of two source trees without a GPU (doc/performance.md,
# session 20): compiles each kernel file (default: the wgmma forward and
# backward mode files) of both trees to an sm_90a cubin, two at a time, and
# runs scripts/sass-loops.py --old on each pair: registers, stack bytes and
# the main loop's instructions and spills, kernel by kernel; kernels whose
# wgmmas ptxas serialised (C7510-C7515) are named first.
#
#   OLD, NEW     source trees (e.g. a `git worktree add /tmp/old REV` and .)
#   CONFIG_DIR   a configured build directory (its config.h)
#   FG_ARCH      the nvcc -arch (default sm_90a; sm_90 or sm_80 for the
#                TF32 and sm80 files)
#   FG_MATCH     only kernels whose demangled name matches (sass-loops --match)
#
# Needs nvcc; without cuobjdump on PATH (sass-loops.py says where to get
# it) each kernel's ptxas registers and spill bytes stand in for the loop
# counts. Output cubins and logs go to ${TMPDIR:-/tmp}/fg-sass.
set -euo pipefail
if [ $# -lt 3 ]; then
    sed -n 3,17p "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
old=$(cd "$1" && pwd) new=$(cd "$2" && pwd) cfg=$(cd "$3" && pwd)
shift 3
arch=${FG_ARCH:-sm_90a}
out=${TMPDIR:-/tmp}/fg-sass
mkdir -p "$out/old" "$out/new"
files=("$@")
if [ ${#files[@]} -eq 0 ]; then
    mapfile -t files < <(cd "$new" && ls kernels/attention/attn_bwd_wgmma_mode*.cu kernels/attention/attn_fwd_wgmma_mode*.cu)
fi
here=$(cd "$(dirname "$0")" && pwd)
cc() { # TREE TAG FILE
    (cd "$1" && nvcc -std=c++17 -O3 -Iinclude -I. -I"$cfg" -DHAVE_CONFIG_H -DFG_BUILDING_LIBRARY \
        -cubin -arch="$arch" -Xptxas -v "$3" -o "$out/$2/$(basename "$3" .cu).cubin" \
        >"$out/$2/$(basename "$3" .cu).log" 2>&1) || { echo "nvcc failed: $1/$3 (see $out/$2)"; return 1; }
}
for f in "${files[@]}"; do
    cc "$old" old "$f" &
    cc "$new" new "$f"
    wait
    b=$(basename "$f" .cu)
    echo "== $f"
    # ptxas C7510-C7515: the kernel's wgmmas serialised (each waits for
    # the one before; C7512 for want of registers, C7511 / C7515 for a
    # runtime choice between wgmma shapes): session 39's ALiBi backward
    # lost 20% to it, session 50's half-width forward 30%, which the loop
    # counts below do not show.
    for side in old new; do
        { grep -oE "\(C751[0-9]\) Potential Performance Loss: wgmma[^']*function '[^']*'" \
            "$out/$side/$b.log" || true; } |
            sed -E "s/^\((C751[0-9])\).*function '(.*)'/\1 \2/" | sort -u |
            while read -r code fn; do
                echo "$side: wgmma serialised (ptxas $code): $(echo "$fn" | c++filt)"
            done
    done
    if command -v cuobjdump >/dev/null; then
        python3 "$here/sass-loops.py" --match "${FG_MATCH:-}" --old "$out/old/$b.cubin" "$out/new/$b.cubin"
    else # ptxas -v alone: registers and spill bytes per kernel, old -> new
        python3 - "$out/old/$b.log" "$out/new/$b.log" <<'PY'
import re, subprocess, sys
def stats(path):
    r, fn = {}, None
    for line in open(path):
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            fn = m.group(1)
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and fn:
            r.setdefault(fn, {})["spill"] = f"{m.group(1)}/{m.group(2)}"
        m = re.search(r"Used (\d+) registers", line)
        if m and fn:
            r.setdefault(fn, {})["regs"] = m.group(1)
    return r
old, new = stats(sys.argv[1]), stats(sys.argv[2])
for fn in sorted(set(old) | set(new)):
    name = subprocess.run(["c++filt", fn], capture_output=True, text=True).stdout.strip()
    o, n = old.get(fn, {}), new.get(fn, {})
    print(f"  {name.split('(')[0]}: registers {o.get('regs', '-')} -> {n.get('regs', '-')}, "
          f"spill stores/loads {o.get('spill', '-')} -> {n.get('spill', '-')}")
PY
    fi
done
