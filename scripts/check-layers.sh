#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# scripts/check-layers.sh - checks that no source file includes a header of a
# higher layer (doc/design.md, section 1). Run by `make check`; also by hand:
#   bash scripts/check-layers.sh [SRCDIR]
#
# Layers, lowest first; a file may include headers of its own layer and of
# lower ones (the rank below), plus the public headers (include/flashgrad):
#   0 lib/core            errors, dtypes, strided overlap, Philox, BLAS
#   1 kernels/runtime     CUDA context, allocator, device checks (C API:
#                         kernels/runtime/device.h)
#   2 lib/attention       attention API validation and the tiled CPU oracle
#     kernels/attention   the CUDA attention kernels (general, sm80, sm90)
#   3 lib/autograd        tensors, arena, tape, engine, hooks, gradcheck
#   4 lib/ops             differentiable ops (CPU) ...
#     kernels/ops         ... and their CUDA kernels
#   5 lib/train           nn layers, GPT, optimiser, checkpoints, data
#   6 lib/dist            communicator (MPI), data parallel, ring attention
#     kernels/dist        ... and the NCCL backend and its CUDA kernels
#   7 kernels/backend     the seam to the CUDA module libflashgrad-cuda.so:
#                         its entry table, the library's trampolines and
#                         loader, the module's export (above every layer
#                         whose CUDA entry points it carries)
#   8 tools, examples,    programs: public headers only (and headers of
#     bench               their own folder)
# Tests may include anything.
#
# No library layer includes kernels/backend: a layer calls its CUDA entry
# points through its own header (kernels/runtime/device.h,
# lib/ops/cuda_ops_*.h, ...), and in a shared CUDA build the functions
# those headers declare are the trampolines of kernels/backend/loader.c.
#
# Where a lower layer needs something only a higher one can provide, the
# lower layer declares it and the higher one implements it (for example the
# tensor layer's fg_cuda_accumulate in lib/autograd/cuda_backend.h is
# defined by kernels/ops/ops_ew.cu), so includes still point downwards.
#
# Circles inside one folder are allowed and intrinsic: a tensor records the
# tape node that made it and a node holds tensors (lib/autograd), and the
# elementwise, reduction and shape ops call each other's helpers for
# broadcasting gradients (lib/ops). A folder is one layer, not a stack.
set -euo pipefail

src=${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
cd "$src"

rank_of() {
    case $1 in
    lib/core/*) echo 0 ;;
    kernels/runtime/*) echo 1 ;;
    lib/attention/* | kernels/attention/*) echo 2 ;;
    lib/autograd/*) echo 3 ;;
    lib/ops/* | kernels/ops/*) echo 4 ;;
    lib/train/*) echo 5 ;;
    lib/dist/* | kernels/dist/*) echo 6 ;;
    kernels/backend/*) echo 7 ;;
    tools/* | examples/* | bench/*) echo 8 ;;
    include/flashgrad/*) echo public ;;
    *) echo unknown ;;
    esac
}

bad=0
checked=0
dirs=()
for d in lib kernels tools examples bench; do [[ -d $d ]] && dirs+=("$d"); done
files=$(find "${dirs[@]}" -type f \
    \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \
    -o -name '*.inc' \) | LC_ALL=C sort)
for f in $files; do
    from=$(rank_of "$f")
    if [[ $from == unknown ]]; then
        echo "check-layers: $f: not in any layer folder" >&2
        bad=$((bad + 1))
        continue
    fi
    dir=$(dirname "$f")
    lineno=0
    while IFS= read -r line; do
        lineno=$((lineno + 1))
        [[ $line =~ ^[[:space:]]*#[[:space:]]*include[[:space:]]*[\"\<]([^\"\>]+)[\"\>] ]] ||
            continue
        inc=${BASH_REMATCH[1]}
        # Resolve as the compiler does: the including file's folder, then
        # -I$(top_srcdir), then -I$(top_srcdir)/include; anything else is a
        # system or generated header (config.h) and is not ours to rank.
        if [[ -f $dir/$inc ]]; then
            target=$dir/$inc
        elif [[ -f $inc && $inc == */* ]]; then
            target=$inc
        elif [[ -f include/$inc ]]; then
            target=include/$inc
        else
            continue
        fi
        target=$(realpath -m --relative-to=. "$target")
        checked=$((checked + 1))
        to=$(rank_of "$target")
        [[ $to == public ]] && continue
        # A program may split itself into files: its own folder's headers
        # are fine, any other non-public header is not.
        [[ $from == 8 && $(dirname "$target") == "$dir" ]] && continue
        if [[ $to == unknown ]] ||
            [[ $from == 8 ]] || ((to > from)); then
            echo "check-layers: $f:$lineno includes $target" \
                "(layer $to from layer $from)" >&2
            bad=$((bad + 1))
        fi
    done <"$f"
done

if ((checked == 0)); then
    echo "check-layers: no includes found under $src (wrong folder?)" >&2
    exit 1
fi
if ((bad > 0)); then
    echo "check-layers: $bad include(s) break the layer order" >&2
    echo "0 passed, 1 failed"
    exit 1
fi
echo "check-layers: $checked includes in $(wc -w <<<"$files") files respect the layer order"
