#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# tests/check-packaging.sh - what a distribution package relies on, checked
# in the build folder (make check):
#  - libflashgrad.so needs no CUDA or NCCL library (ldd) and exports only fg_
#    symbols (nm -D); the CUDA module, when built, exports only
#    fg_cuda_backend_get (no C++ template instances);
#  - a program linked against the library, with no CUDA module to load,
#    sees fg_cuda_available() == 0 with "not installed" as the reason, gets
#    FG_ERR_UNSUPPORTED with that reason for a CUDA tensor, and the CPU
#    still works; with the build's module (no GPU on this machine) the
#    reason is no driver or no device instead.
# FG_CUDA_BACKEND_MODE (module, static or none) comes from the Makefile.
set -uo pipefail

mode=${FG_CUDA_BACKEND_MODE:-none}
probe=./tests/cuda_probe
pass=0
fail=0
ok() { echo "ok: $*"; pass=$((pass + 1)); }
bad() { echo "FAIL: $*" >&2; fail=$((fail + 1)); }
field() { sed -n "s/^$1=//p" <<<"$2"; }

so=.libs/libflashgrad.so
if [[ -f $so ]]; then
    cudalibs=$(ldd "$so" | grep -Ei 'libcuda|libcudart|libcublas|libnccl|libnv' || true)
    [[ -z $cudalibs ]] && ok "ldd $so: no CUDA library" ||
        bad "ldd $so shows CUDA libraries: $cudalibs"
    others=$(nm -D --defined-only "$so" | awk 'NF == 3 && $3 !~ /^fg_/ {print $3}')
    [[ -z $others ]] && ok "nm -D $so: only fg_ symbols" ||
        bad "$so exports non-fg_ symbols: $others"
else
    echo "no $so (static-only build): library checks skipped"
fi

mod=.libs/libflashgrad-cuda.so
if [[ $mode == module ]]; then
    syms=$(nm -D --defined-only "$mod" | awk 'NF == 3 {print $3}' | tr '\n' ' ')
    [[ $syms == 'fg_cuda_backend_get ' ]] &&
        ok "nm -D $mod: only fg_cuda_backend_get" ||
        bad "$mod exports: $syms"
fi

# No module: what a CPU-only installation of a CUDA build sees.
out=$(FG_CUDA_BACKEND=/nonexistent/libflashgrad-cuda.so "$probe")
rc=$?
[[ $rc == 0 && $(field cpu "$out") == ok ]] && ok "CPU works without CUDA" ||
    bad "cuda_probe (rc $rc): $out"
[[ $(field available "$out") == 0 ]] && ok "fg_cuda_available() is 0" ||
    bad "fg_cuda_available() is not 0 without a backend: $out"
case $mode in
module) want='not installed' ;;
static) want='driver|device' ;;
*) want='without CUDA' ;;
esac
reason=$(field reason "$out")
grep -Eq "$want" <<<"$reason" && ok "reason: $reason" ||
    bad "reason '$reason' does not say '$want'"
msg=$(field message "$out")
[[ $(field tensor "$out") != ok ]] && grep -Eq "$want" <<<"$msg" &&
    ok "CUDA tensor: $(field tensor "$out"): $msg" ||
    bad "CUDA tensor: $(field tensor "$out"): '$msg' does not say '$want'"

if [[ $mode == module ]]; then
    # The build's module, found through FG_CUDA_BACKEND and, with it unset,
    # next to libflashgrad.so (dladdr).
    for how in env dladdr; do
        if [[ $how == env ]]; then
            out=$(FG_CUDA_BACKEND=$PWD/$mod "$probe")
        else
            out=$(env -u FG_CUDA_BACKEND "$probe")
        fi
        reason=$(field reason "$out")
        if [[ $(field available "$out") == 1 ]]; then
            ok "module via $how: a GPU is usable"
        elif grep -Eq 'driver|device' <<<"$reason"; then
            ok "module via $how: $reason"
        else
            bad "module via $how: $out"
        fi
    done
fi

echo "$pass passed, $fail failed"
((fail == 0))
