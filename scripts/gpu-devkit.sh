#!/bin/bash
# SPDX-License-Identifier: MIT
# scripts/gpu-devkit.sh [DIR] - pack what a GPU machine without Check,
# Autotools or network needs to configure and build flashgrad from source
# there (faster than building the CUDA code on a small machine):
#
#   DIR/src       the tracked sources plus the generated Autotools files
#   DIR/check     Check's headers and static libraries (libcheck_pic.a,
#                 libsubunit.a) for --enable-static-check
#   DIR/build.sh  configure + make there:  bash DIR/build.sh BUILDDIR [ARCH]
#                 The installed layout: libflashgrad.so without CUDA, and
#                 the CUDA module libflashgrad-cuda.so (with NCCL when the
#                 machine has it) that it loads at the first CUDA call.
#                 BUILDDIR/libflashgrad-bench.so links to the library, with
#                 the module beside it, for bench/compare_variants.py
#                 through ctypes (--lib BUILDDIR/libflashgrad-bench.so).
#
#   DIR/data      tinyshakespeare.txt, where ../shared/data has it (the
#                 trainer phases of scripts/gpu-phases.sh read it)
#
#   DIR/trees/C   with FG_KIT_COMMITS="C1 C2 ...": each commit's tree with
#                 its generated Autotools files, for the modules and cells
#                 phases of gpu-phases.sh (bisecting a speed change on the
#                 GPU in one call); about 5 MB each
#   DIR/ref       with FG_KIT_REF=C: commit C's tree likewise, for the
#                 buildref phase (a whole second build to A/B against,
#                 e.g. FG_KIT_REF=HEAD with a changed working tree)
#
# DIR defaults to .devkit (keep it out of git: .git/info/exclude). On the
# GPU machine, bash DIR/src/scripts/gpu-phases.sh build suites ... runs a
# whole device call's work (its header lists the phases).
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$src/.devkit}
cd "$src"
# Regenerate when configure is missing or older than what makes it (a
# branch switch that touched configure.ac or a Makefile.am: the machine
# there has no Autotools to catch up).
if [ ! -x configure ] || [ configure.ac -nt configure ] ||
    [ -n "$(find . -name Makefile.am -not -path './.devkit/*' -newer Makefile.in -print -quit)" ]; then
    autoreconf -fi
fi
rm -rf "$out"
mkdir -p "$out/src" "$out/check/include" "$out/check/lib"
# pack_tree DEST [GIT_LS_FILES_OPTIONS]: the files git lists in the current
# directory (tracked by default) plus the generated build files git ignores.
pack_tree() {
    local dest=$1
    shift
    { git ls-files "$@"; ls configure config.h.in aclocal.m4; find build-aux m4 -type f; } |
        sort -u | while read -r f; do
        [ -f "$f" ] || continue
        mkdir -p "$dest/$(dirname "$f")"
        cp -p "$f" "$dest/$f"
    done
    find . -name Makefile.in -not -path './.devkit/*' -not -path './b*/*' |
        while read -r f; do cp -p "$f" "$dest/$f"; done
}
# Tracked and new (untracked, not ignored) files.
pack_tree "$out/src" --cached --others --exclude-standard
# Which packing this is: gpu-phases.sh's build phase rebuilds a build
# folder made from another one (a machine kept warm between calls keeps
# /tmp, and with it the last call's build).
echo "$(git rev-parse HEAD) $(date +%s%N)" >"$out/src/.kit-stamp"
cp /usr/include/check.h /usr/include/check_stdint.h "$out/check/include/"
for a in libcheck_pic.a libsubunit.a; do
    cp "$(gcc -print-file-name=$a)" "$out/check/lib/"
done
corpus=$src/../shared/data/tinyshakespeare.txt
if [ -f "$corpus" ]; then
    mkdir -p "$out/data"
    cp "$corpus" "$out/data/"
fi
# pack_commit C DEST: commit C's tree with its generated Autotools files
pack_commit() {
    local wt
    wt=$(mktemp -d)
    git worktree add --detach "$wt" "$1" >/dev/null
    (cd "$wt" && autoreconf -fi >/dev/null 2>&1 && pack_tree "$2")
    git worktree remove --force "$wt"
}
for c in ${FG_KIT_COMMITS:-}; do
    pack_commit "$c" "$out/trees/$c"
    echo "trees/$c: $(git log -1 --format=%s "$c" | cut -c1-70)"
done
if [ -n "${FG_KIT_REF:-}" ]; then
    pack_commit "$FG_KIT_REF" "$out/ref"
    # its own stamp: without one, every kit's ref matched a kept ref build
    # (session 45's first trainab kept the last call's ref)
    echo "$(git rev-parse "$FG_KIT_REF") $(date +%s%N)" >"$out/ref/.kit-stamp"
    echo "ref: $FG_KIT_REF $(git log -1 --format=%s "$FG_KIT_REF" | cut -c1-60)"
fi
cat >"$out/build.sh" <<'EOF'
#!/bin/bash
# Configure and build flashgrad with CUDA and statically linked Check.
set -euo pipefail
kit=$(cd "$(dirname "$0")" && pwd)
bdir=$1
arch=${2:-90}
mkdir -p "$bdir"
cd "$bdir"
export LIBRARY_PATH="$kit/check/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
"$kit/src/configure" --enable-silent-rules --enable-static-check \
    --with-cuda --with-cuda-arch="$arch" \
    --without-blas CHECK_CFLAGS="-I$kit/check/include -pthread" \
    CHECK_LIBS="$kit/check/lib/libcheck_pic.a $kit/check/lib/libsubunit.a -pthread -lrt -lm" \
    >configure.log 2>&1 || { tail -30 configure.log; exit 1; }
grep -q '^FG_CUDA_BACKEND_MODE = module' Makefile ||
    { echo "build.sh: configure chose no CUDA module:"; tail -15 configure.log; exit 1; }
make -j"$(nproc)" >make.log 2>&1 || { grep -v '^  [A-Z]' make.log | head -60; exit 1; }
make -j"$(nproc)" check TESTS= >>make.log 2>&1 || { tail -40 make.log; exit 1; }
# The library loads the module from the folder it was itself loaded from,
# so both links sit side by side.
ln -sf .libs/libflashgrad.so libflashgrad-bench.so
ln -sf .libs/libflashgrad-cuda.so libflashgrad-cuda.so
sed -n '/^configure:$/,$p' configure.log
echo "built in $bdir"
# The tests link the library statically and find the module through
# FG_CUDA_BACKEND, which make check sets.
echo "tests: make -C $bdir check TESTS='tests/check-packaging.sh tests/test_gpu_attention ...'"
echo "  or by hand: FG_CUDA_BACKEND=$bdir/.libs/libflashgrad-cuda.so $bdir/tests/test_gpu_ops"
EOF
chmod +x "$out/build.sh"
du -sh "$out"
