#!/bin/bash
# scripts/gpu-devkit.sh [DIR] - pack what a GPU machine without Check,
# Autotools or network needs to configure and build flashgrad from source
# there (faster than building the CUDA code on a small machine):
#
#   DIR/src       the tracked sources plus the generated Autotools files
#   DIR/check     Check's headers and static libraries (libcheck_pic.a,
#                 libsubunit.a) for --enable-static-check
#   DIR/build.sh  configure + make there:  bash DIR/build.sh BUILDDIR [ARCH]
#                 (static, position-independent; BUILDDIR/libflashgrad-bench.so
#                 is the same library linked as a shared object, for
#                 bench/compare_variants.py through ctypes)
#
# DIR defaults to .devkit (keep it out of git: .git/info/exclude).
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$src/.devkit}
cd "$src"
[ -x configure ] || autoreconf -fi
rm -rf "$out"
mkdir -p "$out/src" "$out/check/include" "$out/check/lib"
# Tracked and new (untracked, not ignored) files, plus the generated build
# files git ignores.
{ git ls-files; git ls-files --others --exclude-standard; ls configure config.h.in aclocal.m4; find build-aux m4 -type f; } |
    sort -u | while read -r f; do
    [ -f "$f" ] || continue
    mkdir -p "$out/src/$(dirname "$f")"
    cp -p "$f" "$out/src/$f"
done
find . -name Makefile.in -not -path './.devkit/*' -not -path './b*/*' |
    while read -r f; do cp -p "$f" "$out/src/$f"; done
cp /usr/include/check.h /usr/include/check_stdint.h "$out/check/include/"
for a in libcheck_pic.a libsubunit.a; do
    cp "$(gcc -print-file-name=$a)" "$out/check/lib/"
done
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
"$kit/src/configure" --enable-silent-rules --disable-shared --with-pic \
    --enable-static-check --with-cuda --with-cuda-arch="$arch" \
    --without-blas CHECK_CFLAGS="-I$kit/check/include -pthread" \
    CHECK_LIBS="$kit/check/lib/libcheck_pic.a $kit/check/lib/libsubunit.a -pthread -lrt -lm" \
    >configure.log 2>&1 || { tail -30 configure.log; exit 1; }
make -j"$(nproc)" >make.log 2>&1 || { grep -v '^  [A-Z]' make.log | head -60; exit 1; }
make -j"$(nproc)" check TESTS= >>make.log 2>&1 || { tail -40 make.log; exit 1; }
cudalib=$(dirname "$(command -v nvcc)")/../lib64
# The libraries the library itself links (NCCL, MPI, BLAS when configured),
# as libtool recorded them; -z defs fails here, not in ctypes, if one lacks.
deps=()
for w in $(sed -n "s/^dependency_libs='\(.*\)'\$/\1/p" libflashgrad.la); do
    case $w in *.la) ;; *) deps+=("$w") ;; esac
done
gcc -shared -o libflashgrad-bench.so -Wl,-z,defs \
    -Wl,--whole-archive .libs/libflashgrad.a -Wl,--no-whole-archive \
    ${deps[@]+"${deps[@]}"} -L"$cudalib" -lcudart -lcublas -fopenmp -lstdc++ -lm
echo "built in $bdir"
EOF
chmod +x "$out/build.sh"
du -sh "$out"
