#!/bin/bash
# SPDX-License-Identifier: MIT
# scripts/gpu-bundle.sh [OUTDIR] - build the test, benchmark and example
# programs into a small self-contained folder that runs on any GPU machine
# without a build: static libflashgrad, Check and subunit linked statically,
# and a run-all.sh that runs everything and prints one summary table.
#
#   FG_CUDA_ARCH=90 scripts/gpu-bundle.sh gpu-bundle
#   (copy gpu-bundle/, or the smaller gpu-bundle.tgz, to the GPU machine)
#   gpu-bundle/run-all.sh                # every suite, table at the end
#   gpu-bundle/run-all.sh --sanitize     # GPU suites under compute-sanitizer
#                                        # (memcheck and racecheck)
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$src/gpu-bundle}
arch=${FG_CUDA_ARCH:-90}
bdir=${FG_BUILD_DIR:-$src/build-gpu}

[ -x "$src/configure" ] || (cd "$src" && autoreconf -fi)
mkdir -p "$bdir"
cd "$bdir"
if [ ! -f config.status ]; then
    "$src/configure" --disable-shared --enable-static-check --with-cuda \
        --with-cuda-arch="$arch" --disable-cuda-ptx --enable-cuda-lineinfo \
        --without-blas \
        ${FG_CONFIGURE_FLAGS:-}
fi
make -j"$(nproc)"
make -j"$(nproc)" check TESTS=

rm -rf "$out"
mkdir -p "$out"
for dir in tests bench examples tools/train; do
    [ -d "$dir" ] || continue
    for f in "$dir"/*; do
        case $f in *.o | *.lo | *.la | *.log | *.trs | *.a) continue ;; esac
        if [ -f "$f" ] && [ -x "$f" ] && file "$f" | grep -q ELF; then
            cp "$f" "$out/"
        fi
    done
done

cat > "$out/run-all.sh" <<'RUNALL'
#!/bin/bash
# run-all.sh [--sanitize] - run every test_* program here; exit 77 = skip.
# With --sanitize, the GPU suites (test_gpu_*) run under compute-sanitizer
# memcheck and racecheck (Check's fork mode off so the tool sees the kernels).
cd "$(dirname "$0")"
sanitize=0
[ "${1:-}" = --sanitize ] && sanitize=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null |
    sed 's/^/GPU: /'
rows=()
fail=0
run() { # name, command...
    local name=$1 t0 t1 rc status
    shift
    t0=$(date +%s.%N)
    "$@" >"$name.out" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    # racecheck reports hazards as warnings, which do not change its exit
    # code: any hazard fails the run here.
    if grep -Eq 'RACECHECK SUMMARY: [1-9]' "$name.out"; then rc=3; fi
    case $rc in 0) status=PASS ;; 77) status=SKIP ;; *) status="FAIL($rc)"; fail=1 ;; esac
    [ $rc -ne 0 ] && [ $rc -ne 77 ] && tail -n 30 "$name.out"
    local summary
    summary=$(grep -E '^[0-9]+%: Checks|ERROR SUMMARY|RACECHECK SUMMARY' "$name.out" |
        sed 's/^========= //' | tr '\n' ' ')
    rows+=("$(printf '%-34s %-9s %7.1fs  %s' "$name" "$status" \
        "$(awk "BEGIN{print $t1 - $t0}")" "$summary")")
}
for t in ./test_*; do
    [ -x "$t" ] || continue
    run "$(basename "$t")" "$t"
done
if [ $sanitize = 1 ]; then
    for t in ./test_gpu_*; do
        [ -x "$t" ] || continue
        for tool in memcheck racecheck; do
            run "$(basename "$t")[$tool]" env CK_FORK=no FG_SANITIZE=1 \
                compute-sanitizer --tool $tool --error-exitcode 1 "$t"
        done
    done
fi
echo
printf '%-34s %-9s %8s  %s\n' program status time summary
printf '%s\n' "${rows[@]}"
exit $fail
RUNALL
chmod +x "$out/run-all.sh"
strip "$out"/test_* "$out"/bench_* "$out"/attention_demo 2>/dev/null || true
du -sh "$out"
ls "$out"
# Every program embeds all kernels (~30 MB each, mostly GPU code that
# compresses ~15x): ship the compressed archive when space or transfer
# size matters (tar xzf gpu-bundle.tgz -C DIR on the GPU machine).
tar czf "$out.tgz" -C "$out" .
du -sh "$out.tgz"
