#!/bin/bash
# SPDX-License-Identifier: MIT
# scripts/gpu-closeout.sh CALL - the measurements an open issue still
# needs on a GPU kind where they were never (or long ago) taken, in device
# calls of under ten minutes each (A-C about 25 of a session's 30 minutes;
# D and E when a second session has the kind), from a kit made by
# scripts/gpu-devkit.sh:
#
#   bash KIT/src/scripts/gpu-closeout.sh A   the bf16 grid beside cuDNN,
#                                            FA2 and SDPA-efficient without
#                                            and with dropout (issue 18),
#                                            the deterministic backward,
#                                            rates over kept pairs (16)
#   bash KIT/src/scripts/gpu-closeout.sh B   fp32 / TF32 (19); variants and
#                                            packed batches against
#                                            FlexAttention (16, 17)
#   bash KIT/src/scripts/gpu-closeout.sh C   training beside the PyTorch
#                                            twin, GPT-2-small at batch
#                                            FG_G2_BATCH (default 16, as in
#                                            sessions 10-11 on the H100), the
#                                            baby GPT's quality bar (22)
#   bash KIT/src/scripts/gpu-closeout.sh D   the GPU suites of the
#                                            attention family
#   bash KIT/src/scripts/gpu-closeout.sh E   GPT-2-small at batches
#                                            FG_BATCHES (default "64 128
#                                            256") beside torch.compile,
#                                            each side's device memory:
#                                            the largest batch that fits
#
# Rounds: as many as contenders (four with bf16, three with fp32), so
# that with bench/fg_ctypes.py's rotation each takes every position.
# Each call builds first unless the machine still holds a build of the
# same kit (scripts/gpu-phases.sh). Written for the H100: issues 16-19 and
# 22 list H100 figures last taken in sessions 10-19 (doc/performance.md,
# "Where the issue targets stand"); any sm_90 GPU runs it. Every kernel
# benchmark runs twice (gpu-phases.sh's bench: two processes, one after
# the other). Files in $OUT (the device tool brings them back):
# torch-bf16.txt, torch-drop.txt, torch-fp32.txt, det.txt, variants.txt,
# modes.txt, train.txt, quality.txt, batches.txt; summary lines on
# stdout.
set -uo pipefail
K=$(cd "$(dirname "$0")/../.." && pwd)
P=$K/src/scripts/gpu-phases.sh
export OUT=${OUT:-/tmp/fg-out}
mkdir -p "$OUT"
phases() { bash "$P" "$@"; }
# torch NAME ARGS: compare_torch.py through gpu-phases.sh (two runs), kept
# as $OUT/torch-NAME.txt
torch() {
    local name=$1
    shift
    FG_TORCH_ARGS="$*" phases torch | tail -n 1
    cp "$OUT/torch.txt" "$OUT/torch-$name.txt"
}
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv,noheader
case ${1:-} in
A)
    phases build | tail -n 1
    torch bf16 --dtypes bf16 --rounds 4 --ds 64,128,256 --ns 1024,2048,4096,8192,16384
    torch drop --dtypes bf16 --rounds 4 --dropout 0.1 --ds 64,128 --ns 2048,4096,8192
    phases det modes | grep -E '^(det|modes):'
    ;;
B)
    phases build | tail -n 1
    torch fp32 --dtypes fp32,tf32 --rounds 3 --ds 32,64,128,256 --ns 1024,4096
    phases variants | grep -E '^variants:'
    ;;
C)
    phases build | tail -n 1
    FG_G2_BATCH=${FG_G2_BATCH:-16} phases train | grep -E 'ms/step|FAILED' | head -n 16
    phases quality | tail -n 3
    ;;
D)
    phases build | tail -n 1
    FG_SUITES="attention varlen bias fp32 kvcache" FG_SUITE_TIMEOUT=480 phases suites | head -n 8
    ;;
E)
    phases build | tail -n 1
    FG_BATCHES=${FG_BATCHES:-64 128 256} phases batches | grep -E '^(flashgrad|torch|batch)'
    ;;
*)
    echo "usage: gpu-closeout.sh A|B|C|D|E (see its header)" >&2
    exit 2
    ;;
esac
