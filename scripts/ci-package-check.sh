#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# scripts/ci-package-check.sh [BUILD_DIR] - the packaging half of
# `make distcheck`, in about a minute instead of several: run it in a
# configured and built tree (default: build/, as quickstart.sh makes it;
# a CUDA build checks the module too). doc/releasing.md says how the two
# compare. It checks that
#  1. `make distdir` ships every tracked file (but the few listed below);
#  2. `make install DESTDIR=...` installs the library, headers,
#     flashgrad.pc, man pages and their per-function links, docs (with the
#     image training.md shows), the trainer, and in a shared CUDA build the
#     module in $(pkglibdir); the installed libflashgrad.so needs no CUDA
#     library;
#  3. a program built with pkg-config against the installed tree runs, and
#     sees the module when it is installed and "not installed" when it is
#     not (a CPU-only package of a CUDA build);
#  4. `make uninstall` leaves no file behind;
#  5. every tracked source and script has its SPDX notice.
# Prints "N passed, N failed"; exits non-zero on any failure.
set -uo pipefail

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bdir=${1:-$src/build}
cd "$bdir" || exit 1
[[ -f Makefile ]] || { echo "ci-package-check: $bdir is not configured" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0
fail=0
ok() { echo "ok: $*"; pass=$((pass + 1)); }
bad() { echo "FAIL: $*" >&2; fail=$((fail + 1)); }
mkvar() { sed -n "s/^$1 = //p" Makefile | head -n 1; }
prefix=$(mkvar prefix)
mode=$(mkvar FG_CUDA_BACKEND_MODE)

# 1. The tarball's contents.
make -s distdir distdir="$tmp/dist" >/dev/null 2>"$tmp/distdir.err" ||
    { cat "$tmp/distdir.err" >&2; bad "make distdir"; }
if [[ -d $tmp/dist ]] && git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
    # Tracked but deliberately not shipped.
    not_shipped='^(\.gitignore|m4/\.keep)$'
    missing=$(git -C "$src" ls-files | grep -Ev "$not_shipped" |
        while read -r f; do [[ -e $tmp/dist/$f ]] || echo "$f"; done)
    [[ -z $missing ]] && ok "make distdir ships every tracked file" ||
        bad "not in the tarball (add to EXTRA_DIST or a _SOURCES): $missing"
    # Every tracked source and script carries the license notice.
    if nolicense=$(bash "$src/scripts/license-notice.sh" --check 2>&1); then
        ok "every source and script file has an SPDX notice"
    else
        bad "files without an SPDX notice (bash scripts/license-notice.sh adds it): $nolicense"
    fi
fi

# 2. Install.
dest=$tmp/inst
root=$dest$prefix
make -s install DESTDIR="$dest" >"$tmp/install.log" 2>&1 ||
    { tail -n 20 "$tmp/install.log" >&2; bad "make install"; }
libdir=$dest$(make -s -f Makefile -f - print-libdir <<<'print-libdir: ; @echo $(libdir)' 2>/dev/null)
[[ -d $libdir ]] || libdir=$root/lib
expect=(
    "$libdir/libflashgrad.so" "$libdir/pkgconfig/flashgrad.pc"
    "$root/include/flashgrad/flashgrad.h" "$root/bin/flashgrad-train"
    "$root/share/man/man1/flashgrad-train.1" "$root/share/man/man3/flashgrad.3"
    "$root/share/man/man3/fg_tensor.3" "$root/share/man/man3/fg_tensor_zeros.3"
    "$root/share/man/man3/fg_dist.3" "$root/share/man/man3/fg_comm_allreduce.3"
    "$root/share/doc/flashgrad/LICENSE" "$root/share/doc/flashgrad/releasing.md"
    "$root/share/doc/flashgrad/training.md"
    "$root/share/doc/flashgrad/img/babygpt-h100.png")
[[ $mode == module ]] && expect+=("$libdir/flashgrad/libflashgrad-cuda.so")
f0=$fail
for f in "${expect[@]}"; do
    [[ -e $f ]] || bad "not installed: ${f#"$dest"}"
done
for h in "$src"/include/flashgrad/*.h; do
    [[ -e $root/include/flashgrad/${h##*/} ]] || bad "header not installed: ${h##*/}"
done
((fail == f0)) && ok "make install: library, headers, .pc, man pages, docs"
if [[ -e $libdir/libflashgrad.so ]]; then
    cudalibs=$(ldd "$libdir/libflashgrad.so" | grep -Ei 'libcuda|libcudart|libcublas|libnccl|libnv' || true)
    [[ -z $cudalibs ]] && ok "installed libflashgrad.so needs no CUDA library" ||
        bad "installed libflashgrad.so links CUDA: $cudalibs"
fi

# 3. A program built against the installed tree.
if [[ -e $libdir/pkgconfig/flashgrad.pc ]]; then
    pc() { PKG_CONFIG_PATH=$libdir/pkgconfig pkg-config \
        --define-variable=prefix="$root" --define-variable=libdir="$libdir" "$@"; }
    for field in URL Description; do
        [[ -n $(grep "^$field: ." "$libdir/pkgconfig/flashgrad.pc") ]] ||
            bad "flashgrad.pc has an empty $field"
    done
    cat >"$tmp/app.c" <<'EOF'
#include <stdio.h>
#include <flashgrad/flashgrad.h>
int main(void)
{
    int avail = fg_cuda_available();
    printf("%s|%d|%s\n", fg_version(), avail, avail ? "" : fg_last_error());
    fg_tensor *t;
    double v = 0;
    if (fg_tensor_scalar(FG_FP64, FG_DEVICE_CPU, 3.0, &t) != FG_OK ||
        fg_tensor_item(t, &v) != FG_OK || v != 3.0)
        return 1;
    fg_tensor_free(t);
    return 0;
}
EOF
    # shellcheck disable=SC2046
    if cc -o "$tmp/app" "$tmp/app.c" $(pc --cflags --libs flashgrad) 2>"$tmp/cc.err"; then
        run() { env -u FG_CUDA_BACKEND LD_LIBRARY_PATH="$libdir" "$tmp/app"; }
        out=$(run) && ok "pkg-config program runs: $out" || bad "pkg-config program: $out"
        if [[ $mode == module ]]; then
            grep -Eq '\|1\||driver|device' <<<"$out" &&
                ok "the installed module is found next to the library" ||
                bad "installed module not found: $out"
            mv "$libdir/flashgrad/libflashgrad-cuda.so" "$tmp/"
            out=$(run) && grep -q 'not installed' <<<"$out" &&
                ok "without the module (CPU-only package): $out" ||
                bad "without the module: $out"
            mv "$tmp/libflashgrad-cuda.so" "$libdir/flashgrad/"
        fi
    else
        cat "$tmp/cc.err" >&2
        bad "cannot build a program with pkg-config --cflags --libs flashgrad"
    fi
fi

# 4. Uninstall.
make -s uninstall DESTDIR="$dest" >"$tmp/uninstall.log" 2>&1 ||
    { tail -n 20 "$tmp/uninstall.log" >&2; bad "make uninstall"; }
left=$(find "$dest" -type f -o -type l 2>/dev/null)
[[ -z $left ]] && ok "make uninstall leaves nothing" ||
    bad "left after make uninstall: $left"

echo "$pass passed, $fail failed"
((fail == 0))
