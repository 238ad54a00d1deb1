#!/bin/bash
# SPDX-License-Identifier: MIT
# scripts/gpu-phases.sh PHASE... - one device call's work on a GPU machine,
# run from a kit made by scripts/gpu-devkit.sh (KIT = the kit folder):
#
#   bash KIT/src/scripts/gpu-phases.sh build suites san:initcheck
#
# The machine gives itself back when idle, so a call builds, checks and
# measures in one go; each phase prints a few lines, longer output goes
# to $OUT (the device tool brings back only a few files) or /tmp/fg-out.
#
# Phases, run in the order given:
#   build        configure + make KIT/src in /tmp/fg-b (FG_ARCH, default 90;
#                with NCCL when the machine has it, e.g. PyTorch's; more
#                configure options in FG_CONFIGURE_EXTRA, e.g.
#                --enable-cuda-lineinfo)
#   buildref     the same for KIT/ref, a second tree to compare with
#                (gpu-devkit.sh with FG_KIT_REF=COMMIT packs it), in
#                /tmp/fg-ref (build and buildref can run at once, in the
#                background: session 37's A/B did)
#   modules      the CUDA module alone of each KIT/trees/C (gpu-devkit.sh
#                FG_KIT_COMMITS), in /tmp/fg-m/C, all at once: minutes,
#                not a full build each
#   cells        bench_attention of the build, one cell at a time, with
#                its module swapped through FG_CUDA_BACKEND for ref's
#                (if built) and each tree's, interleaved over two rounds:
#                a speed change bisected in one call. FG_CELLS: cells
#                separated by ';' (default "--d 128 --N 8192 --causal 0;
#                --d 64 --N 8192 --causal 0"; "--dropout 0.1" times the
#                dropout kernels); FG_CELLS_ENV="VAR=v": each module
#                also with that environment; $OUT/cells.txt
#   ncu          Nsight Compute on one kernel of one cell (FG_NCU_CELL,
#                default "--d 128 --N 8192 --causal 0"; FG_NCU_KERNEL, a
#                regex, default attn_bwd_wgmma_kernel; FG_NCU_CMD another
#                program of the build, e.g. "bench/bench_layernorm --cols
#                768 --reps 3" with FG_NCU_KERNEL=ln_bwd_reg) with each module as
#                in cells: $OUT/ncu-NAME.txt (speed of light, scheduler and
#                warp-state sections) and $OUT/ncu-NAME-sass.csv (stall
#                samples per SASS instruction); clocks untouched; NAME is
#                the module's, plus -FG_NCU_TAG when set (several kernels
#                in one call: FG_NCU_TAG=bwd ... ncu, then FG_NCU_TAG=fwd)
#   ktimes       each attention kernel of one forward and backward of each
#                cell (FG_KT_CELLS, ';'-separated, default "--d 128 --N
#                1024 --causal 0"; FG_KT_ENV="VAR=v ..." for the runs):
#                ncu's duration and DRAM bytes read / written per kernel
#                (--cache-control none, clocks untouched), to say where a
#                call's time goes; $OUT/ktimes.txt. FG_KT_CMD="python3
#                KIT/src/bench/compare_modes.py --lib B/libflashgrad-bench.so
#                --once" instead: every attention launch of that command,
#                in order (one forward and backward per cell)
#   suites       every GPU suite at once (make -j check), one line each;
#                FG_SUITES="ops train" runs only test_gpu_ops, test_gpu_train;
#                FG_CK_CASE=NAME only that Check test case of each;
#                FG_TEST_ONLY=test_variants:14-15 (tests/test_util.h) only
#                those tests and iterations (with FG_SUITES: a suite it
#                matches nothing in fails)
#   san:TOOL     compute-sanitizer TOOL over every suite (gpu-sanitize.sh)
#   sweep        all four tools over every suite in one parallel run
#                (doc/reliability.md; about 8 minutes on 16 cores)
#   variants     bench/compare_variants.py --quick, build then ref, twice
#                (variants, det, modes, torch: the build's runs with
#                FG_AB_BUILD_ENV, so FG_REF=/tmp/fg-b makes them an A/B
#                of a switch, e.g. FG_AB_BUILD_ENV=FG_ATTN_BWD_WIDE=0)
#   det          bench/compare_det.py (the deterministic backward against
#                the default one, bitwise reruns), likewise
#   detsan       the four compute-sanitizer tools over the deterministic
#                cases alone (FG_SANITIZE=det) of test_gpu_attention and
#                test_gpu_bias, in parallel; test_gpu_attention's racecheck
#                one process per case (det:<i>; H200, session 50: 78-262 s
#                each); FG_DETSAN_TOOLS="memcheck synccheck" picks tools
#   modes        bench/compare_modes.py (variant kernels against the plain
#                ones on equal work), likewise
#   torch        bench/compare_torch.py --quick (FG_TORCH_ARGS), likewise;
#                scripts/torch-table.py turns $OUT/torch.txt into the
#                markdown table of doc/performance.md
#   rcseed       racecheck (FG_SANITIZE=fast) of FG_RC_SUITES (default
#                "test_gpu_attention test_gpu_varlen") with the test seed
#                FG_RC_SEED (default: each run its own), once per setting
#                of FG_RC_ENVS (';'-separated "VAR=v ...", "" the default;
#                default just ""), all in parallel; hazard lines (with
#                source lines when built with FG_CONFIGURE_EXTRA=
#                --enable-cuda-lineinfo) in $OUT/rcseed.txt
#   envs         bench/compare_env.py: the build's attention under each
#                setting of FG_ENVS (';'-separated, e.g. "FG_ATTN_BWD_EPI=0";
#                the default always first) in one process, with cuDNN,
#                over FG_ENV_CELLS ("d,N,causal;...", default d 128 N 1k,
#                2k, 8k), FG_ENV_ARGS more options (--dropout 0.1); run
#                twice, the second time in the reverse order (the side
#                timed first in a round can gain ~5%); $OUT/envs.txt
#   bias         compare_variants.py --bias-only: the default (the bias
#                by TMA where it applies), then the per-element path
#                (FG_ATTN_BIAS_TMA=0), twice, interleaved
#   train        issue 22 side by side (flashgrad-train prints every step
#                and its line ends with the median of steps 11.., the
#                twin's statistic): flashgrad-train, the PyTorch twin
#                (bench/train_gpt_torch.py --both: eager, torch.compile),
#                flashgrad-train again (FG_TWIN_ROUNDS=2: twin and
#                flashgrad-train once more); the baby GPT, then a GPT-2-small
#                shape (batch FG_G2_BATCH, default 16), and that shape's
#                --profile-steps table (other kernels by operation);
#                $OUT/train.txt. FG_TRAIN_DTYPE=fp16 (or bf16, fp32):
#                --dtype for both sides (fp16: loss scaling on both)
#   quality      the baby GPT for 2000 steps, validation loss every 500
#                (issue 22's bar: <= 1.48 at 2000); $OUT/quality.txt;
#                FG_TRAIN_DTYPE likewise
#   trainab      the build's flashgrad-train against ref's (buildref;
#                FG_AB_BUILD_ENV="VAR=1 ..." set for the build's runs only),
#                interleaved over two rounds, then each one's profiled
#                GPT-2-small step: a training-side change A/B in one call;
#                $OUT/trainab.txt. FG_REF=/tmp/fg-b (no buildref): the
#                build against itself, FG_AB_BUILD_ENV the only difference
#   batches      issue 22's GPT-2-small shape at several batch sizes
#                (FG_BATCHES, default "16 32 64 128"): flashgrad-train and
#                the twin's torch.compile (--bench-only --compile) in turn
#                per batch, ms/step, tokens/s and each side's device memory
#                peak; $OUT/batches.txt
#   gemms        the GPT-2-small step's GEMM shapes timed by the autotune
#                (FG_GEMM_AUTOTUNE=2): each shape's heuristic first choice
#                and its best of eight, with TFLOP/s; $OUT/gemms.txt
#   benchab      FG_AB_CMD (e.g. "bench/bench_layernorm --reps 10") in the
#                build tree and in ref's, two rounds; $OUT/benchab.txt
#   dpspeed      flashgrad-train data parallel over --rendezvous, 1, 2, 4
#                and 8 GPUs as there are: the baby GPT and a GPT-2-small
#                shape, tokens/s (doc/distributed.md); FG_DP_ARGS adds
#                trainer options (e.g. "--bucket-mb 1")
#   dpeq         W GPUs against one GPU with --accum W, dropout 0
#   dpbuckets    the bucket size on every GPU count there is: both models
#                with each --bucket-mb of FG_DP_BUCKETS (default "4 25
#                64"; 0 = the library's default) against one GPU, two
#                rounds, tokens/s of the last two progress lines;
#                $OUT/dpbuckets.txt (session 38 did 2 GPUs by hand)
#   rings        bench/bench_ring at 128k (--check), 512k and 1M tokens
# The text corpus is KIT/data/tinyshakespeare.txt (gpu-devkit.sh copies it
# when it finds ../shared/data/tinyshakespeare.txt).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 # NVLink multicast stays off (the device notes)
K=$(cd "$(dirname "$0")/../.." && pwd)
B=${FG_B:-/tmp/fg-b}
R=${FG_REF:-/tmp/fg-ref} # FG_REF=/tmp/fg-b: trainab / benchab against the build itself (an A/B of FG_AB_BUILD_ENV alone)
W=/tmp/fg-out
OUT=${OUT:-$W}
mkdir -p "$W" "$OUT"
ARCH=${FG_ARCH:-90}
NG=$(nvidia-smi -L 2>/dev/null | wc -l)
log() { echo "== $(date +%T) $*"; }
gpus() { local n; for n in "$@"; do [ "$n" -gt "$NG" ] || echo "$n"; done; } # the counts this host has

# NCCL: the toolkit's, else the one PyTorch's wheels carry.
nccl=/usr/local/cuda
if [ ! -f "$nccl/include/nccl.h" ]; then
    nccl=$(python3 -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])" 2>/dev/null)
    if [ -n "$nccl" ] && [ ! -f "$nccl/lib/libnccl.so" ]; then
        ln -sf "$(find "$nccl/lib" -name 'libnccl.so.*' | head -n 1)" "$nccl/lib/libnccl.so"
    fi
fi
export LD_LIBRARY_PATH=${nccl:+$nccl/lib:}${LD_LIBRARY_PATH:-}

# cfg SRC: configure SRC in the current directory
cfg() {
    # shellcheck disable=SC2086 # FG_CONFIGURE_EXTRA: words
    LIBRARY_PATH="$K/check/lib" "$1/configure" --enable-silent-rules --enable-static-check \
        --with-cuda --with-cuda-arch="$ARCH" --without-blas ${nccl:+--with-nccl=$nccl} \
        ${FG_CONFIGURE_EXTRA:-} CHECK_CFLAGS="-I$K/check/include -pthread" \
        CHECK_LIBS="$K/check/lib/libcheck_pic.a $K/check/lib/libsubunit.a -pthread -lrt -lm" \
        >configure.log 2>&1 || { tail -n 30 configure.log; return 1; }
}
# bld SRC BUILDDIR JOBS (a subshell: its cd stays inside)
bld() (
    src=$1 bd=$2 jobs=$3
    # kept only when built from this kit with the same FG_CONFIGURE_EXTRA
    # and FG_ARCH (session 40 lost a call to a kept default build that was
    # meant to be --enable-attn-tf32x3)
    stamp="$(cat "$src/.kit-stamp" 2>/dev/null) | ${FG_CONFIGURE_EXTRA:-} | $ARCH"
    if [ -x "$bd/tools/train/flashgrad-train" ] && [ -f "$bd/.kit-stamp" ] &&
        [ "$(cat "$bd/.kit-stamp")" = "$stamp" ]; then
        echo "$bd: kept (built from this kit, same options)"
        exit 0
    fi
    rm -rf "$bd" # another kit's build, or a partial one
    mkdir -p "$bd" && cd "$bd" || exit 1
    cfg "$src" || exit 1
    export LIBRARY_PATH="$K/check/lib"
    if ! make -j"$jobs" >make.log 2>&1 || ! make -j"$jobs" check TESTS= >>make.log 2>&1; then
        grep -v '^  [A-Z]' make.log | head -n 40
        exit 1
    fi
    # The library looks for its CUDA module beside the path it was loaded
    # from (or FG_CUDA_BACKEND): the benchmarks load the link.
    ln -sf .libs/libflashgrad.so libflashgrad-bench.so
    ln -sf .libs/libflashgrad-cuda.so libflashgrad-cuda.so
    printf '%s\n' "$stamp" >.kit-stamp
    echo "$bd: built, module $(stat -c %s .libs/libflashgrad-cuda.so) bytes"
)
build() { log "build $K/src -> $B (arch $ARCH)"; bld "$K/src" "$B" "$(nproc)"; }
buildref() { log "build $K/ref -> $R (arch $ARCH)"; bld "$K/ref" "$R" "$(nproc)"; }

modules() {
    log "CUDA modules of $K/trees/*"
    local t n jobs
    n=$(find "$K/trees" -mindepth 1 -maxdepth 1 -type d 2>/dev/null | wc -l)
    [ "$n" -gt 0 ] || { echo "no trees (gpu-devkit.sh FG_KIT_COMMITS)"; return 1; }
    jobs=$(( ($(nproc) + n - 1) / n ))
    for t in "$K"/trees/*/; do
        t=$(basename "$t")
        (mkdir -p "/tmp/fg-m/$t" && cd "/tmp/fg-m/$t" && cfg "$K/trees/$t" &&
            make -j"$jobs" libflashgrad-cuda.la >make.log 2>&1
         echo "$t: exit $?") &
    done
    wait
}
# modlist: the CUDA modules to compare (ref's, the trees', the build's) in
# the array mods; modname MODULE: its tree's name
modlist() {
    local m
    mods=()
    [ -e "$R/.libs/libflashgrad-cuda.so" ] && mods+=("$R/.libs/libflashgrad-cuda.so")
    for m in /tmp/fg-m/*/.libs/libflashgrad-cuda.so; do [ -e "$m" ] && mods+=("$m"); done
    mods+=("$B/.libs/libflashgrad-cuda.so")
}
modname() { basename "$(dirname "$(dirname "$1")")"; }
cells() {
    local cell round m mods cl
    log "cells: bench_attention of $B with each module"
    modlist
    IFS=';' read -ra cl <<<"${FG_CELLS:---d 128 --N 8192 --causal 0;--d 64 --N 8192 --causal 0}"
    # FG_CELLS_ENV="VAR=v ...": each module also run with it (a switch A/B)
    local envs=("") e
    [ -n "${FG_CELLS_ENV:-}" ] && envs+=("$FG_CELLS_ENV")
    : >"$OUT/cells.txt"
    for round in 1 2; do
        for m in "${mods[@]}"; do
            for e in "${envs[@]}"; do
                for cell in "${cl[@]}"; do
                    # shellcheck disable=SC2086 # a cell, an environment: words
                    echo "$round $(modname "$m")${e:+ [$e]} $cell: $(env $e FG_CUDA_BACKEND="$m" \
                        "$B/bench/bench_attention" $cell 2>&1 | grep -Ev '^(#|flashgrad|dtype)' |
                        awk '{printf "%s fwd %s bwd %s  ", $1, $9, $10}')" | tee -a "$OUT/cells.txt"
                done
            done
        done
    done
}

ktimes() {
    local cell cl cmd all=0
    log "ktimes: attention kernels of $B, one call each"
    IFS=';' read -ra cl <<<"${FG_KT_CELLS:---d 128 --N 1024 --causal 0}"
    # FG_KT_CMD: profile that command instead (every launch, in order)
    [ -n "${FG_KT_CMD:-}" ] && { cl=("$FG_KT_CMD"); all=1; }
    : >"$OUT/ktimes.txt"
    for cell in "${cl[@]}"; do
        echo "-- $cell${FG_KT_ENV:+ [$FG_KT_ENV]}" | tee -a "$OUT/ktimes.txt"
        if [ "$all" = 1 ]; then cmd=$cell; else cmd="$B/bench/bench_attention $cell --reps 3"; fi
        # shellcheck disable=SC2086 # a command, an environment: words
        env ${FG_KT_ENV:-} timeout 180 ncu --clock-control none --cache-control none \
            -k "regex:attn_" --csv --page raw \
            --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
            $cmd >"$W/ktimes.csv" 2>&1 ||
            { echo "ncu failed"; tail -n 5 "$W/ktimes.csv"; continue; }
        grep -E '^"' "$W/ktimes.csv" | KT_ALL=$all python3 -c '
import csv, os, sys
rows = list(csv.reader(sys.stdin))
head, units = rows[0], rows[1]
ks = ["gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum"]
scale = {"ns": 1e-3, "us": 1, "usecond": 1, "msecond": 1e3, "byte": 1e-6, "Kbyte": 1e-3,
         "Mbyte": 1, "Gbyte": 1e3}
last = {}  # each kernel: its last launch (the last call, after the warm-ups)
for i, r in enumerate(rows[2:]):  # KT_ALL=1: every launch
    last[i if os.environ.get("KT_ALL") == "1" else r[head.index("Kernel Name")]] = (i, dict(zip(head, r)))
for _, r in sorted(last.values(), key=lambda x: x[0]):
    v = [float(r[k].replace(",", "")) * scale.get(units[head.index(k)], 1) for k in ks]
    print("%-44s %9.1f us  read %8.1f MB  written %8.1f MB" % (r["Kernel Name"][:44], *v))
' | tee -a "$OUT/ktimes.txt"
    done
}

ncu_phase() {
    local m n mods cell=${FG_NCU_CELL:---d 128 --N 8192 --causal 0}
    # FG_NCU_CMD: another program of the build tree and its arguments
    # (e.g. "bench/bench_layernorm --cols 768 --reps 3" with
    # FG_NCU_KERNEL=ln_bwd_reg); default bench_attention on the cell
    local cmd=${FG_NCU_CMD:-bench/bench_attention $cell --reps 3}
    log "ncu: ${FG_NCU_KERNEL:-attn_bwd_wgmma_kernel} of $cmd with each module"
    modlist
    for m in "${mods[@]}"; do
        # FG_NCU_TAG: a suffix of this run's files, so that several ncu
        # runs of one call (one kernel each) keep their reports apart
        n=$(modname "$m")${FG_NCU_TAG:+-$FG_NCU_TAG}
        # shellcheck disable=SC2086 # a command: words
        FG_CUDA_BACKEND=$m timeout 240 ncu --clock-control none \
            -k "regex:${FG_NCU_KERNEL:-attn_bwd_wgmma_kernel}" -s 2 -c 1 --set full \
            --import-source no -o "$W/ncu-$n" -f "$B"/$cmd \
            >"$W/ncu-$n.log" 2>&1 || { echo "$n: ncu failed"; tail -n 5 "$W/ncu-$n.log"; continue; }
        ncu -i "$W/ncu-$n.ncu-rep" --page details --section SpeedOfLight --section Occupancy \
            --section SchedulerStats --section WarpStateStats --section InstructionStats \
            >"$OUT/ncu-$n.txt" 2>&1
        ncu -i "$W/ncu-$n.ncu-rep" --page source --print-source sass --csv \
            >"$OUT/ncu-$n-sass.csv" 2>&1
        echo "$n: $(grep -E 'Duration|Issue Slots Busy|No Eligible' "$OUT/ncu-$n.txt" | awk '{$1=$1; print}' | tr '\n' ';')"
    done
}

suites() {
    log "GPU suites of $B"
    local s list=
    for s in "$B"/tests/test_gpu_*; do
        case $s in *.o | *.log | *.trs) continue ;; esac
        # FG_SUITES: only these (names without test_gpu_, e.g. "ops train")
        if [ -n "${FG_SUITES:-}" ]; then
            case " $FG_SUITES " in *" ${s##*/test_gpu_} "*) ;; *) continue ;; esac
        fi
        [ -x "$s" ] && list="$list tests/$(basename "$s")"
    done
    # Check's XML report beside each suite's log (tests/NAME.xml; the
    # harness's $log): the time of every test
    # FG_CK_CASE: only that test case of each suite (Check's CK_RUN_CASE,
    # e.g. FG_SUITES=attention FG_CK_CASE=wide)
    # shellcheck disable=SC2016 # expanded by the harness's shell, not here
    (cd "$B" && if [ -n "${FG_CK_CASE:-}" ]; then export CK_RUN_CASE=$FG_CK_CASE; fi &&
        timeout "${FG_SUITE_TIMEOUT:-540}" make -j12 check TESTS="$list" \
        TESTS_ENVIRONMENT='CK_XML_LOG_FILE_NAME=$${log%.log}.xml; export CK_XML_LOG_FILE_NAME;' \
        >"$W/suites.log" 2>&1)
    echo "make check: exit $?"
    for s in $list; do
        printf '%-28s %s %s\n' "$s" "$(sed -n 's/^:test-result: //p' "$B/$s.trs" 2>/dev/null | head -n 1)" \
            "$(grep -Eo 'Checks: [0-9]+, Failures: [0-9]+, Errors: [0-9]+' "$B/$s.log" | tail -n 1)"
    done
    # where the device time went: each suite's summed test time and its
    # three slowest tests (all iterations of a loop test together)
    for s in $list; do
        awk -v name="${s#tests/}" '
            /<id>/ { gsub(/.*<id>|<\/id>.*/, ""); id = $0 }
            /<test / { intest = 1 }
            intest && /<duration>/ { gsub(/.*<duration>|<\/duration>.*/, "")
                t[id] += $0; n[id]++; tot += $0; intest = 0 }
            END { if (!tot) exit
                printf "%-22s %6.1f s:", name, tot
                for (k = 0; k < 3; k++) { b = ""; for (i in t) if (b == "" || t[i] > t[b]) b = i
                    if (b == "") break
                    printf " %s %.1f s (%d)", b, t[b], n[b]; delete t[b] }
                printf "\n" }' "$B/$s.xml" 2>/dev/null
    done | tee "$OUT/suite-times.txt"
    # the suites without Check's summary (test_gpu_dist) and any failure:
    # their logs come back in $OUT/suites/
    mkdir -p "$OUT/suites"
    for s in $list; do
        if ! grep -q 'Checks: ' "$B/$s.log" 2>/dev/null ||
            ! grep -q '^:test-result: PASS' "$B/$s.trs" 2>/dev/null; then
            tail -c 20000 "$B/$s.log" >"$OUT/suites/$(basename "$s").log" 2>/dev/null
        fi
    done
}

san() { # TOOL
    log "compute-sanitizer $1 over every suite"
    FG_SANITIZE_LOGS=$W/san FG_SANITIZE_JOBS=${FG_SANITIZE_JOBS:-12} \
        FG_SANITIZE_TIMEOUT=${FG_SANITIZE_TIMEOUT:-480} \
        bash "$K/src/scripts/gpu-sanitize.sh" "$B" "$1" >"$W/san-$1.txt" 2>&1
    echo "exit $?"
    sed -n '/^suite /,$p' "$W/san-$1.txt"
}

# bench NAME SCRIPT ARGS...: the script on the build, then on ref if built,
# twice, interleaved; the tables go to $OUT/NAME.txt.
bench() {
    local name=$1 script=$2 round tree label order i
    shift 2
    : >"$OUT/$name.txt"
    for round in 1 2; do
        # round 2 runs in the other order: the first process of a round
        # tends to run a few percent faster (seen at d 128, where an
        # FG_ATTN_BWD_WIDE switch changes nothing)
        order="0 1"
        [ $round = 2 ] && order="1 0"
        for i in $order; do
            tree=$B
            [ "$i" = 1 ] && tree=$R
            [ -e "$tree/libflashgrad-bench.so" ] || continue
            # the build's run (also when FG_REF=/tmp/fg-b) with
            # FG_AB_BUILD_ENV: an A/B of a switch
            label=
            if [ -n "${FG_AB_BUILD_ENV:-}" ]; then
                label=" [without]"
                [ "$i" = 0 ] && label=" [$FG_AB_BUILD_ENV]" && ab_env on
            fi
            echo "== $tree$label, round $round" >>"$OUT/$name.txt"
            (cd "$K/src" && timeout 300 python3 "bench/$script" \
                --lib "$tree/libflashgrad-bench.so" "$@" 2>&1 |
                grep -v '^{' >>"$OUT/$name.txt")
            ab_env off
        done
    done
    echo "$name: $OUT/$name.txt"
}
sweep() {
    log "compute-sanitizer: memcheck, synccheck, initcheck, racecheck over every suite"
    FG_SANITIZE_LOGS=$W/san FG_SANITIZE_JOBS=${FG_SANITIZE_JOBS:-14} \
        FG_SANITIZE_TIMEOUT=${FG_SANITIZE_TIMEOUT:-450} \
        bash "$K/src/scripts/gpu-sanitize.sh" "$B" racecheck memcheck initcheck synccheck \
        >"$W/sweep.txt" 2>&1
    echo "exit $?"
    sed -n '/^suite /,$p' "$W/sweep.txt"
}
rcseed() {
    log "racecheck of ${FG_RC_SUITES:-test_gpu_attention test_gpu_varlen}, seed ${FG_RC_SEED:-any}, settings '${FG_RC_ENVS:-}'"
    local es=() e t i=0
    IFS=';' read -ra es <<<"${FG_RC_ENVS:-}"
    [ ${#es[@]} -gt 0 ] || es=("")
    rm -rf "$W/rc" && mkdir -p "$W/rc"
    for e in "${es[@]}"; do
        for t in ${FG_RC_SUITES:-test_gpu_attention test_gpu_varlen}; do
            i=$((i + 1))
            # shellcheck disable=SC2086 # $e: VAR=v words
            (echo "== $t ${e:-default}"
                timeout 480 env CK_FORK=no FG_SANITIZE=fast ${FG_RC_SEED:+FG_TEST_SEED=$FG_RC_SEED} $e \
                    FG_CUDA_BACKEND="$B/.libs/libflashgrad-cuda.so" compute-sanitizer --tool racecheck \
                    --print-limit 20 "$B/tests/$t" 2>&1 |
                    grep -E 'Error: Race|  and |SUMMARY|Checks:|seed' | cut -c1-400) >"$W/rc/$i.txt" &
        done
    done
    wait
    cat "$W"/rc/*.txt | tee "$OUT/rcseed.txt" | grep -E '^==|SUMMARY|Checks:'
}
variants() { log variants; bench variants compare_variants.py --quick --rounds 2; }
det() { log "deterministic backward"; bench det compare_det.py --rounds 2 --reps 8; }
detsan() {
    log "compute-sanitizer over the deterministic cases of test_gpu_attention and test_gpu_bias (FG_SANITIZE=det)"
    local tools rc=0 n i t to=${FG_SANITIZE_TIMEOUT:-480}
    read -ra tools <<<"${FG_DETSAN_TOOLS:-memcheck racecheck initcheck synccheck}"
    rm -f "$W"/detsan-*.txt
    # racecheck: one process per case (det:<i>; the whole subset ran past
    # 450 s, the slowest case alone took 262 s on an H200, session 50);
    # the test names the last index when given one past it
    n=$(FG_CUDA_BACKEND=$B/.libs/libflashgrad-cuda.so FG_SANITIZE=det:9999 \
        "$B/tests/test_gpu_attention" 2>&1 | sed -n 's/.*i in 0\.\.\([0-9]*\).*/\1/p')
    for t in "${tools[@]}"; do
        if [ "$t" = racecheck ] && [ -n "$n" ]; then
            for ((i = 0; i <= n; i++)); do
                FG_SANITIZE_MODE=det:$i FG_SANITIZE_SUITES=test_gpu_attention \
                    FG_SANITIZE_LOGS=$W/san/rc$i FG_SANITIZE_TIMEOUT=$to \
                    bash "$K/src/scripts/gpu-sanitize.sh" "$B" racecheck >"$W/detsan-rc$i.txt" 2>&1 &
            done
            # test_gpu_bias's deterministic cases (the bias kernel's kDet) in one
            FG_SANITIZE_MODE=det FG_SANITIZE_SUITES=test_gpu_bias FG_SANITIZE_LOGS=$W/san/rcbias \
                FG_SANITIZE_TIMEOUT=$to \
                bash "$K/src/scripts/gpu-sanitize.sh" "$B" racecheck >"$W/detsan-rcbias.txt" 2>&1 &
        else
            FG_SANITIZE_MODE=det FG_SANITIZE_SUITES="test_gpu_attention test_gpu_bias" \
                FG_SANITIZE_LOGS=$W/san/$t FG_SANITIZE_TIMEOUT=$to \
                bash "$K/src/scripts/gpu-sanitize.sh" "$B" "$t" >"$W/detsan-$t.txt" 2>&1 &
        fi
    done
    wait
    for t in "$W"/detsan-*.txt; do
        # one table row per suite (gpu-sanitize.sh prints the table twice)
        if grep -E '^test_gpu_' "$t" | grep -vq ' clean '; then rc=1; fi
        grep -q -E '^test_gpu_' "$t" || rc=1
        grep -E '^test_gpu_' "$t" | sort -u | sed "s/^/$(basename "$t" .txt): /"
    done
    echo "exit $rc"
}
bias() {
    log "bias cells: default, FG_ATTN_BIAS_TMA=0"
    local round v
    : >"$OUT/bias.txt"
    for round in 1 2; do
        for v in "" 0; do
            (cd "$K/src" && FG_ATTN_BIAS_TMA=$v timeout 200 python3 bench/compare_variants.py \
                --lib "$B/libflashgrad-bench.so" --bias-only --rounds 2 2>&1 |
                grep 'bias \[' | sed "s/^/round $round, FG_ATTN_BIAS_TMA=${v:-unset}: /" >>"$OUT/bias.txt")
        done
    done
    cat "$OUT/bias.txt"
}
# FG_MODES_ARGS: more options, e.g. "--d 64 --N 2048"
# shellcheck disable=SC2086
modes() { log modes; bench modes compare_modes.py --rounds 2 ${FG_MODES_ARGS:-}; }
envs() {
    log "compare_env: ${FG_ENVS:-} over ${FG_ENV_CELLS:-d 128 N 1k 2k 8k}"
    local e i es=() fwd=() rev=()
    IFS=';' read -ra es <<<"${FG_ENVS:-}"
    fwd=(--env "")
    for e in "${es[@]}"; do fwd+=(--env "$e"); done
    for ((i = ${#es[@]} - 1; i >= 0; i--)); do rev+=(--env "${es[i]}"); done
    rev+=(--env "")
    : >"$OUT/envs.txt"
    for i in 0 1; do
        local order=("${fwd[@]}")
        [ "$i" = 1 ] && order=("${rev[@]}")
        # shellcheck disable=SC2086 # FG_ENV_ARGS: options, words
        (cd "$K/src" && timeout 280 python3 bench/compare_env.py \
            --lib "$B/libflashgrad-bench.so" "${order[@]}" \
            --cells "${FG_ENV_CELLS:-128,1024,0;128,2048,0;128,8192,0}" \
            ${FG_ENV_ARGS:-} 2>&1 | tee -a "$OUT/envs.txt")
    done
}
torch() {
    log "compare_torch ${FG_TORCH_ARGS:---quick}"
    # shellcheck disable=SC2086
    bench torch compare_torch.py ${FG_TORCH_ARGS:---quick}
}

T=$B/tools/train/flashgrad-train
D=$K/data/tinyshakespeare.txt
BABY="--data $D --device cuda --layers 6 --heads 6 --width 384 --ctx 256 --lr 1e-3
  --min-lr 1e-4 --warmup 100 --beta2 0.99 --eval-interval 100000 --ckpt none --samples 0"
G2="--data $D --device cuda --layers 12 --heads 12 --width 768 --ctx 1024
  --eval-interval 100000 --ckpt none --samples 0"
# dp RANKS NAME ARGS...: one process (RANKS = 1) or RANKS over --rendezvous;
# rank 0's output in $W/NAME.log, its run folder $W/NAME.
dp() {
    local n=$1 name=$2 r
    shift 2
    rm -rf "${W:?}/${name:?}" "$W/rz.$name"
    if [ "$n" = 1 ]; then
        "$T" "$@" --out-dir "$W/$name" >"$W/$name.log" 2>&1
    else
        for ((r = 0; r < n; r++)); do
            "$T" "$@" --rendezvous "$W/rz.$name" --rank $r --world-size "$n" \
                --out-dir "$W/$name" >"$W/$name.r$r.log" 2>&1 &
        done
        wait
        cp "$W/$name.r0.log" "$W/$name.log"
        grep -h -i -m 2 'error\|fail\|refus' "$W/$name".r*.log | head -n 4
    fi
    echo "$name: $(grep '^step' "$W/$name.log" | tail -n 1)"
}
dpspeed() {
    log "data parallel, weak scaling"
    local n
    # shellcheck disable=SC2086
    for n in $(gpus 1 2 4 8); do
        dp $n baby$n $BABY --dropout 0.2 --batch 64 --steps 300 --print-interval 50 ${FG_DP_ARGS:-}
    done
    # shellcheck disable=SC2086
    for n in $(gpus 1 2 4 8); do
        dp $n g2s$n $G2 --dropout 0.1 --batch 16 --steps 40 --print-interval 20 ${FG_DP_ARGS:-}
    done
}
dpeq() {
    log "data parallel equivalence: W GPUs against one GPU with --accum W"
    local n
    for n in $(gpus 2 4 8); do
        # shellcheck disable=SC2086
        dp 1 eq1x$n $BABY --dropout 0 --batch 16 --accum $n --steps 60 --print-interval 10
        # shellcheck disable=SC2086
        dp $n eq${n}x1 $BABY --dropout 0 --batch 16 --steps 60 --print-interval 10
        python3 - "$W/eq1x$n/log.csv" "$W/eq${n}x1/log.csv" <<'PY'
import csv, sys
a, b = ({int(r["step"]): float(r["loss"]) for r in csv.DictReader(open(p)) if r.get("loss")}
        for p in sys.argv[1:3])
d = [abs(a[s] - b[s]) for s in sorted(set(a) & set(b))]
print(f"  {len(d)} logged losses, largest difference {max(d):.3g}, bitwise {all(x == 0 for x in d)}")
PY
    done
}
dpbuckets() {
    log "data parallel, bucket sizes ${FG_DP_BUCKETS:-4 25 64} on $(gpus 2 4 8 | tr '\n' ' ')GPUs"
    local round n b m args
    : >"$OUT/dpbuckets.txt"
    for round in 1 2; do
        for m in baby g2s; do
            if [ $m = baby ]; then
                args="$BABY --dropout 0.2 --batch 64 --steps 300 --print-interval 50"
            else
                args="$G2 --dropout 0.1 --batch 16 --steps 80 --print-interval 20"
            fi
            # shellcheck disable=SC2086
            dp 1 "bk-$m-1" $args >/dev/null
            for n in $(gpus 2 4 8); do
                for b in ${FG_DP_BUCKETS:-4 25 64}; do
                    # shellcheck disable=SC2086
                    dp "$n" "bk-$m-$n-$b" $args --bucket-mb "$b" >/dev/null
                    # tokens/s of the last two progress lines against one GPU's
                    echo "round $round $m $n GPUs bucket $b MiB: $(paste \
                        <(grep '^step' "$W/bk-$m-$n-$b.log" | tail -n 2 | sed 's/.*| *\([0-9]*\) tok\/s.*/\1/') \
                        <(grep '^step' "$W/bk-$m-1.log" | tail -n 2 | sed 's/.*| *\([0-9]*\) tok\/s.*/\1/') |
                        awk '{printf "%.2fx ", $1 / $2}')" | tee -a "$OUT/dpbuckets.txt"
                done
            done
        done
    done
}
# smi_on NAME / smi_off: nvidia-smi samples the SM clock, power and
# throttle reasons every 100 ms into $W/smi-NAME.csv; smi_off prints
# " | SM X MHz, Y W, power-capped k of n" over the loaded samples (> 300 W).
# The GPT-2-small step runs at the H200's 700 W cap (session 45), so the
# clock a run got is part of its figure.
smi_on() {
    SMI_F=$W/smi-$1.csv
    nvidia-smi --query-gpu=clocks.sm,power.draw,clocks_throttle_reasons.active \
        --format=csv,noheader,nounits -lms 100 >"$SMI_F" 2>/dev/null &
    SMI_P=$!
}
smi_off() {
    kill "$SMI_P" 2>/dev/null
    wait "$SMI_P" 2>/dev/null
    # bit 2 of the throttle reasons (0x4, SW power cap): the last hex digit
    awk -F', ' '$2 + 0 > 300 { n++; c += $1; p += $2; if ($3 ~ /[4-7c-fC-F]$/) k++ }
        END { if (n) printf " | SM %.0f MHz, %.0f W, power-capped %d of %d", c / n, p / n, k, n }' "$SMI_F"
}
# twin NAME ARGS...: bench/train_gpt_torch.py --bench-only --both (eager
# and torch.compile) with ARGS; its summary lines into $OUT/train.txt
twin() {
    local name=$1 clk
    shift
    smi_on "$name"
    (cd "$K/src" && timeout 540 python3 bench/train_gpt_torch.py --data "$D" --bench-only --both \
        "$@" >"$W/$name.log" 2>&1) || echo "$name: FAILED: $(tail -n 1 "$W/$name.log")" |
        tee -a "$OUT/train.txt"
    clk=$(smi_off)
    grep -E '^torch .*ms/step|compile / eager' "$W/$name.log" | sed "s/^/$name: /" |
        tee -a "$OUT/train.txt"
    echo "$name: eager and compiled together$clk" | tee -a "$OUT/train.txt"
}
# fgt NAME ARGS...: flashgrad-train, its last progress line into train.txt
fgt() {
    local name=$1
    shift
    local line clk
    smi_on "$name"
    dp 1 "$name" "$@" >/dev/null
    clk=$(smi_off)
    line=$(grep '^step' "$W/$name.log" | tail -n 1)
    [ -n "$line" ] || line="FAILED: $(tail -n 1 "$W/$name.log")"
    echo "$name: $line$(stepmed "$W/$name.log")$clk" | tee -a "$OUT/train.txt"
}
# stepmed LOG: " | median X ms/step (steps 11..n)" of a run printed every
# step (--print-interval 1), the twin's statistic: an interval's mean can
# land on one of the power cap's slow waves (session 45); empty otherwise
stepmed() {
    # steps 11.. when step 2 has a line of its own (mawk: no asort, so sort)
    awk -F'|' '/^step/ { split($1, a, "[ /]+"); n = a[2] + 0
        for (i = 2; i <= NF; i++) if ($i ~ /ms\/step/) { split($i, b, " "); ms[n] = b[1] } }
        END { if (2 in ms) for (s = 11; s in ms; s++) print ms[s] }' "$1" | sort -n |
        awk '{ v[NR] = $1 } END { if (NR >= 5) printf " | median %.2f ms/step (steps 11..%d)",
              NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2, 10 + NR }'
}
train() {
    log "training speed (issue 22): flashgrad-train, the PyTorch twin, flashgrad-train again"
    local g2b=${FG_G2_BATCH:-16} rounds=${FG_TWIN_ROUNDS:-1} i sfx
    local BABY="$BABY${FG_TRAIN_DTYPE:+ --dtype $FG_TRAIN_DTYPE}"
    local G2="$G2${FG_TRAIN_DTYPE:+ --dtype $FG_TRAIN_DTYPE}"
    : >"$OUT/train.txt"
    # FG_TWIN_ROUNDS=2: the twin twice, each between flashgrad runs (its
    # times vary more than flashgrad's between runs of one call)
    # shellcheck disable=SC2086
    fgt fg-baby-1 $BABY --dropout 0.2 --batch 64 --steps 300 --print-interval 1
    for i in $(seq 1 "$rounds"); do
        sfx=""
        if [ "$i" -gt 1 ]; then sfx="-$i"; fi
        # shellcheck disable=SC2086 # FG_TRAIN_DTYPE: two words or none
        twin "torch-baby$sfx" --layers 6 --heads 6 --width 384 --ctx 256 --batch 64 --dropout 0.2 \
            ${FG_TRAIN_DTYPE:+--dtype $FG_TRAIN_DTYPE}
        # shellcheck disable=SC2086
        fgt "fg-baby-$((i + 1))" $BABY --dropout 0.2 --batch 64 --steps 300 --print-interval 1
    done
    # shellcheck disable=SC2086
    fgt fg-g2s-1 $G2 --dropout 0.1 --batch "$g2b" --steps 60 --print-interval 1
    for i in $(seq 1 "$rounds"); do
        sfx=""
        if [ "$i" -gt 1 ]; then sfx="-$i"; fi
        # shellcheck disable=SC2086
        twin "torch-g2s$sfx" --layers 12 --heads 12 --width 768 --ctx 1024 --batch "$g2b" --dropout 0.1 \
            ${FG_TRAIN_DTYPE:+--dtype $FG_TRAIN_DTYPE}
        # shellcheck disable=SC2086
        fgt "fg-g2s-$((i + 1))" $G2 --dropout 0.1 --batch "$g2b" --steps 60 --print-interval 1
    done
    # where its step goes: the families and the other kernels by operation
    # shellcheck disable=SC2086
    fgt fg-g2s-prof $G2 --dropout 0.1 --batch "$g2b" --steps 30 --print-interval 30 \
        --profile-steps 10
    sed -n '/^profile of/,/^step/p' "$W/fg-g2s-prof.log" | grep -v '^step' | tee -a "$OUT/train.txt"
}
# quality: the baby GPT's validation loss at 2000 steps (issue 22's quality
# bar: <= 1.48), evaluated every 500 steps; $OUT/quality.txt
quality() {
    log "baby GPT, 2000 steps: validation loss (target <= 1.48)"
    dp 1 baby-q --data "$D" --device cuda --layers 6 --heads 6 --width 384 --ctx 256 \
        --lr 1e-3 --min-lr 1e-4 --warmup 100 --beta2 0.99 --dropout 0.2 --batch 64 \
        --steps 2000 --eval-interval 500 --print-interval 500 --ckpt none --samples 0 \
        ${FG_TRAIN_DTYPE:+--dtype $FG_TRAIN_DTYPE} >/dev/null
    grep -E '^(eval at|step .*2000/2000|final)' "$W/baby-q.log" | tee "$OUT/quality.txt"
}
# trainab: the build against ref (buildref) on the same GPU, interleaved
# over two rounds: the GPT-2-small shape and the baby GPT (ms/step), then
# each tree's profiled GPT-2-small step; $OUT/trainab.txt. A training-side
# change timed without the twin (whose times vary more between runs).
# ab_env on|off: FG_AB_BUILD_ENV's assignments (e.g. "FG_GEMM_AUTOTUNE=1")
# exported for the build's runs only, then unset (trainab)
ab_env() {
    local kv
    for kv in ${FG_AB_BUILD_ENV:-}; do
        if [ "$1" = on ]; then export "${kv?}"; else unset "${kv%%=*}"; fi
    done
}
trainab() {
    log "training, build against ref: GPT-2-small shape and baby GPT, two rounds"
    [ -x "$R/tools/train/flashgrad-train" ] || { echo "trainab: no ref build (buildref)"; return 1; }
    local round tree tag g2b=${FG_G2_BATCH:-16} keep=$T
    : >"$OUT/trainab.txt"
    for round in 1 2; do
        for tree in "$B" "$R"; do
            tag=$([ "$tree" = "$B" ] && echo build || echo ref)
            T=$tree/tools/train/flashgrad-train
            [ "$tag" = build ] && ab_env on
            # shellcheck disable=SC2086
            fgt "g2s-$tag-$round" $G2 --dropout 0.1 --batch "$g2b" --steps 60 \
                --print-interval 1 | tee -a "$OUT/trainab.txt"
            # shellcheck disable=SC2086
            fgt "baby-$tag-$round" $BABY --dropout 0.2 --batch 64 --steps 300 \
                --print-interval 1 | tee -a "$OUT/trainab.txt"
            ab_env off
        done
    done
    for tree in "$B" "$R"; do
        tag=$([ "$tree" = "$B" ] && echo build || echo ref)
        T=$tree/tools/train/flashgrad-train
        [ "$tag" = build ] && ab_env on
        # shellcheck disable=SC2086
        fgt "g2s-prof-$tag" $G2 --dropout 0.1 --batch "$g2b" --steps 30 --print-interval 30 \
            --profile-steps 10 >/dev/null
        ab_env off
        echo "== $tag" >>"$OUT/trainab.txt"
        sed -n '/^profile of/,/^step/p' "$W/g2s-prof-$tag.log" | grep -v '^step' >>"$OUT/trainab.txt"
    done
    T=$keep
    grep -A8 '^== ' "$OUT/trainab.txt"
}
# batches: GPT-2-small against torch.compile at each of FG_BATCHES (the
# issue's shape is "the largest batch that fits"); fewer steps at larger
# batches keep each run near 5 s
batches() {
    log "GPT-2-small by batch size: flashgrad-train and torch.compile"
    local b n line clk
    : >"$OUT/batches.txt"
    for b in ${FG_BATCHES:-16 32 64 128}; do
        n=$((b <= 32 ? 40 : 20 + 10 * (b <= 64)))
        # shellcheck disable=SC2086
        line=$(fgt "g2s-b$b" $G2 --dropout 0.1 --batch "$b" --steps "$n" \
            --print-interval 1)
        echo "flashgrad batch $b: ${line#*: }" | tee -a "$OUT/batches.txt"
        smi_on "tw-b$b"
        (cd "$K/src" && timeout 300 python3 bench/train_gpt_torch.py --data "$D" \
            --bench-only --compile --steps "$n" --warm-steps 10 --layers 12 \
            --heads 12 --width 768 --ctx 1024 --batch "$b" --dropout 0.1 \
            >"$W/tw-b$b.log" 2>&1)
        clk=$(smi_off)
        echo "torch.compile batch $b: $(grep -E '^torch .*ms/step' "$W/tw-b$b.log" ||
            tail -n 1 "$W/tw-b$b.log")$clk" | tee -a "$OUT/batches.txt"
        # what each side needed of the GPU: how far the largest batch that
        # fits (issue 22's GPT-2-small shape) is
        { grep -h '^device memory' "$W/g2s-b$b.log" | sed "s/^/flashgrad batch $b: /"
          grep -h 'device memory peak' "$W/tw-b$b.log" | sed "s/^/batch $b: /"
        } | tee -a "$OUT/batches.txt"
    done
}
# gemms: the autotune's per-shape medians of a short GPT-2-small run
gemms() {
    log "GEMM shapes of the GPT-2-small step (autotune timings)"
    # shellcheck disable=SC2086 # G2: words
    FG_GEMM_AUTOTUNE=2 fgt g2s-gemms $G2 --dropout 0.1 --batch "${FG_G2_BATCH:-16}" \
        --steps 3 --print-interval 1
    grep '^gemm_lt autotune' "$W/g2s-gemms.log" | awk '
        { key = $0; sub(/: candidate.*/, "", key); ms = $(NF - 1); c = $(NF - 2)
          sub(/:/, "", c)
          if (!(key in first)) { first[key] = ms; order[++n] = key }
          if (!(key in best) || ms < best[key]) best[key] = ms }
        END { for (i = 1; i <= n; i++) { k = order[i]; split(k, f, " ")
                fl = 2 * f[4] * f[6] * f[8]
                printf "%-60s first %.4f ms (%.0f TF/s) best %.4f ms (%.0f TF/s)\n",
                       k, first[k], fl / first[k] / 1e9, best[k], fl / best[k] / 1e9 } }' \
        | tee "$OUT/gemms.txt"
}
# benchab: FG_AB_CMD (a program of the build tree and its arguments, e.g.
# "bench/bench_layernorm --reps 10") on the build and on ref, two rounds
# interleaved; $OUT/benchab.txt.
benchab() {
    log "build against ref: ${FG_AB_CMD:?set FG_AB_CMD}"
    local round tree
    : >"$OUT/benchab.txt"
    for round in 1 2; do
        for tree in "$B" "$R"; do
            [ -d "$tree" ] || continue
            echo "== $tree, round $round" >>"$OUT/benchab.txt"
            # shellcheck disable=SC2086 # a command line: words
            (cd "$tree" && timeout 240 ./$FG_AB_CMD >>"$OUT/benchab.txt" 2>&1)
        done
    done
    cat "$OUT/benchab.txt"
}
ring() { # RANKS ARGS...
    local n=$1 r
    shift
    rm -f "$W/rr"
    for ((r = 0; r < n; r++)); do
        "$B/bench/bench_ring" --rendezvous "$W/rr" --rank $r --world-size "$n" "$@" &
    done
    wait
}
rings() {
    log "ring attention"
    local n
    for n in $(gpus 2 4 8); do
        ring "$n" --N 131072 --check --rounds 2 --reps 3
        ring "$n" --N 524288 --rounds 1 --reps 3
        ring "$n" --N 1048576 --rounds 1 --reps 2
    done
}

for ph in "$@"; do # every phase known before any runs
    case $ph in
    san:?* | build | buildref | modules | cells | ncu | ktimes | suites | sweep | rcseed | variants | det | detsan | bias | modes | envs | torch | train | quality | trainab | batches | gemms | benchab | dpspeed | dpeq | dpbuckets | rings) ;;
    *) echo "gpu-phases.sh: unknown phase '$ph'" >&2; exit 2 ;;
    esac
done
for ph in "$@"; do
    case $ph in
    san:*) san "${ph#san:}" ;;
    ncu) ncu_phase ;;
    *) $ph ;;
    esac 2>&1 | tee -a "$OUT/log"
done
