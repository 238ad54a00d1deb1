#!/bin/bash
# SPDX-License-Identifier: MIT
# scripts/gpu-sanitize.sh BUILDDIR [TOOL...] - run every GPU suite of a
# built tree (BUILDDIR/tests/test_gpu_*) under compute-sanitizer, one run
# per (suite, tool), and print one summary table. TOOLs default to
# memcheck racecheck initcheck synccheck. The suites see FG_SANITIZE=1
# (a representative subset of their cases: the tools slow kernels 10-100x)
# and CK_FORK=no (so the tool follows the kernels into the test process).
# Logs go to $FG_SANITIZE_LOGS (default BUILDDIR/sanitize).
# FG_SANITIZE_JOBS=N runs N (suite, tool) pairs at once (default 1: the
# tools spend most of their time on the CPU, so on a many-core host a
# whole sweep fits one sitting); FG_SANITIZE_TIMEOUT caps each run
# (default 540 s); FG_SANITIZE_SUITES="a b" limits the suites;
# FG_SANITIZE_MODE overrides the FG_SANITIZE value the suites see.
# Exit status 1 when any run reports an error or hazard or times out.
set -uo pipefail
bdir=${1:?usage: gpu-sanitize.sh BUILDDIR [TOOL...]}
shift
tools=("$@")
[ ${#tools[@]} -gt 0 ] || tools=(memcheck racecheck initcheck synccheck)
logs=${FG_SANITIZE_LOGS:-$bdir/sanitize}
export FG_SAN_LIMIT=${FG_SANITIZE_TIMEOUT:-540} FG_SAN_LOGS=$logs
jobs=${FG_SANITIZE_JOBS:-1}
mkdir -p "$logs"
# A shared build's suites load the CUDA backend module through this.
if [ -z "${FG_CUDA_BACKEND:-}" ] && [ -f "$bdir/.libs/libflashgrad-cuda.so" ]; then
    export FG_CUDA_BACKEND=$bdir/.libs/libflashgrad-cuda.so
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | sed 's/^/GPU: /'
compute-sanitizer --version | tail -n 1
# NVTX on: the library marks what cuBLAS's kernels write (fg_cuda_mark_written),
# which initcheck does not see by itself.
export FG_SAN_NVTX=
compute-sanitizer --help 2>/dev/null | grep -q -- '--nvtx' && FG_SAN_NVTX='--nvtx yes'

# One (suite, tool) run; prints its table row.
run_one() {
    local t=$1 tool=$2 name log mode rc st checks summ t0=$SECONDS
    name=$(basename "$t")
    log="$FG_SAN_LOGS/$name.$tool.log"
    # racecheck (shared-memory hazards) is the slowest tool: the suites'
    # smallest subset (FG_SANITIZE=fast). NCCL probes for kernel images of
    # other architectures at init (cudaFuncGetAttributes fails inside
    # libnccl), which memcheck would count: the dist suite runs without
    # API-error reports (memory errors are still reported).
    mode=1
    [ "$tool" = racecheck ] && mode=fast
    mode=${FG_SANITIZE_MODE:-$mode} # e.g. det: test_gpu_attention's deterministic cases alone
    local api=()
    [ "$name" = test_gpu_dist ] && api=(--report-api-errors no)
    # shellcheck disable=SC2086 # FG_SAN_NVTX: two words or none
    timeout "$FG_SAN_LIMIT" env CK_FORK=no FG_SANITIZE=$mode NCCL_NVLS_ENABLE=0 \
        compute-sanitizer --tool "$tool" --error-exitcode 1 $FG_SAN_NVTX \
        "${api[@]}" --print-limit 20 "$t" >"$log" 2>&1
    rc=$?
    # racecheck reports hazards as warnings (exit 0): count them too.
    if grep -Eq 'RACECHECK SUMMARY: [1-9]' "$log"; then rc=3; fi
    case $rc in
    0) st=clean ;;
    77) st=skip ;;
    124) st=TIMEOUT ;;
    *) st="FAIL($rc)" ;;
    esac
    checks=$(grep -Eo '[0-9]+%: Checks: [0-9]+, Failures: [0-9]+, Errors: [0-9]+' "$log" | tail -n 1)
    summ=$(grep -Eo '(ERROR|RACECHECK) SUMMARY: .*' "$log" | tail -n 1)
    printf '%-20s %-10s %-9s %5ss  %s | %s\n' "$name" "$tool" "$st" \
        $((SECONDS - t0)) "$checks" "$summ"
}
export -f run_one

pairs=()
for t in "$bdir"/tests/test_gpu_*; do
    [ -x "$t" ] && [ -f "$t" ] || continue
    case $t in *.o | *.log | *.trs) continue ;; esac
    if [ -n "${FG_SANITIZE_SUITES:-}" ]; then
        case " $FG_SANITIZE_SUITES " in *" $(basename "$t") "*) ;; *) continue ;; esac
    fi
    for tool in "${tools[@]}"; do
        pairs+=("$t" "$tool")
    done
done
rows=$(printf '%s\n' "${pairs[@]}" | xargs -d '\n' -n 2 -P "$jobs" bash -c 'run_one "$0" "$1"' | tee /dev/stderr)
echo
printf '%-20s %-10s %-9s %6s  %s\n' suite tool result time 'checks | sanitizer summary'
printf '%s\n' "$rows" | sort
grep -qE '^\S+ +\S+ +(TIMEOUT|FAIL)' <<<"$rows" && exit 1
exit 0
