#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# tests/test_train_mpi.sh - flashgrad-train under mpirun -np 2 (CPU):
#  - two ranks with --batch 8 log the same losses, validation losses and
#    gradient norms (to the printed digits) as one process with --batch 8
#    --accum 2 (bitwise equal parameters, doc/distributed.md);
#  - buckets of one parameter each (--bucket-mb 0.001) log the same;
#  - ZeRO-1: 10 steps, then --resume to 20, logs what a straight 20-step
#    run logs;
#  - only rank 0 prints and writes a run folder;
#  - a setup step that fails on rank 0 only (its run folder) stops every
#    rank with an error, and FG_DIST_CHECK set on one rank only is agreed
#    on: neither hangs (both once did, until the timeout);
#  - ranks given other settings (--steps) all refuse to start;
#  - SIGTERM to one rank stops both, with rank 0's checkpoint;
#  - --loss-scale 1024 (fg_dp_train_step_scaled) logs the unscaled run's
#    columns, with and without ZeRO-1.
# Skipped (77) when configure found no MPI.
set -u
mpirun=${FG_MPIRUN-}
if [[ -z $mpirun ]]; then
    echo "skipped: configure found no MPI"
    exit 77
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
train=$PWD/tools/train/flashgrad-train
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
args=(--batch 8 --sort-len 4 --sort-digits 5 --threads 1 --dropout 0
      --eval-interval 10 --print-interval 5 --eval-examples 64
      --final-examples 64 --plot none --device cpu)
np2=(timeout 120 "$mpirun" --oversubscribe --allow-run-as-root -np 2)
fail=0
check() { # what, condition...
    local what=$1
    shift
    if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; fail=1; fi
}
# The sort task ends with exit 3 (accuracy below 99%) after so few steps.
runs=0
run() {
    runs=$((runs + 1))
    "$@" >"$work/out.$runs" 2>&1
    local rc=$?
    [[ $rc -eq 0 || $rc -eq 3 ]]
}
cols() { cut -d, -f1-5 "$1/log.csv"; }

check "2 ranks run" run "${np2[@]}" "$train" --steps 20 "${args[@]}" --out-dir dp
check "1 process, accum 2, runs" run "$train" --steps 20 "${args[@]}" --accum 2 --out-dir one
check "2 ranks = 1 process with accum 2" cmp -s <(cols dp) <(cols one)
check "one run folder, rank 0's" test "$(ls -d "$work"/*/ | wc -l)" -eq 2
"${np2[@]}" "$train" --steps 4 "${args[@]}" --print-interval 2 --out-dir quiet \
    --ckpt none --log none >quiet.out 2>&1
check "only rank 0 prints" test "$(grep -c '^step ' quiet.out)" -eq 2
# buckets of about 1 KiB (a parameter or a few each): other collectives,
# the same sums
check "2 ranks, --bucket-mb 0.001" run "${np2[@]}" "$train" --steps 20 "${args[@]}" --bucket-mb 0.001 --out-dir bk
check "... logs what the default buckets log" cmp -s <(cols dp) <(cols bk)

check "ZeRO-1, 20 steps" run "${np2[@]}" "$train" --steps 20 "${args[@]}" --zero1 1 --out-dir z20
check "ZeRO-1, 10 steps" run "${np2[@]}" "$train" --steps 10 "${args[@]}" --zero1 1 --out-dir z10
check "ZeRO-1, resumed to 20" run "${np2[@]}" "$train" --resume z10/last.ckpt --steps 20
check "ZeRO-1 resume = straight run" cmp -s <(cols z10) <(cols z20)
# loss scaling through the data-parallel step: a power-of-two scale
# changes no bit, with and without ZeRO-1
check "2 ranks, --loss-scale 1024" run "${np2[@]}" "$train" --steps 20 "${args[@]}" --loss-scale 1024 --out-dir ls
check "... logs what the unscaled run logs" cmp -s <(cols dp) <(cols ls)
check "ZeRO-1, --loss-scale 1024" run "${np2[@]}" "$train" --steps 20 "${args[@]}" --zero1 1 --loss-scale 1024 --out-dir zls
check "... logs what the unscaled ZeRO-1 run logs" cmp -s <(cols z20) <(cols zls)
# rank 0's run folder already holds a run: every rank exits, not 124
"${np2[@]}" "$train" --steps 2 "${args[@]}" --out-dir dp >setup.out 2>&1
rc=$?
check "a rank-0-only setup error ends every rank" test $rc -ne 0 -a $rc -ne 124
check "... rank 0 says why" grep -q "already holds a run" setup.out
check "... rank 1 says it stops" grep -q "rank 1: stopping, 1 other rank" setup.out
timeout 120 "$mpirun" --oversubscribe --allow-run-as-root \
    -np 1 env FG_DIST_CHECK=1 "$train" --steps 4 "${args[@]}" --out-dir chk : \
    -np 1 "$train" --steps 4 "${args[@]}" --out-dir chk >chk.out 2>&1
rc=$?
check "FG_DIST_CHECK on one rank: agreed, trains" test $rc -eq 0 -o $rc -eq 3
# ranks with other settings (here --steps) would issue other collectives
timeout 120 "$mpirun" --oversubscribe --allow-run-as-root \
    -np 1 "$train" --steps 4 "${args[@]}" --out-dir diff : \
    -np 1 "$train" --steps 5 "${args[@]}" --out-dir diff >diff.out 2>&1
rc=$?
check "other settings on rank 1: every rank stops" test $rc -ne 0 -a $rc -ne 124
check "... rank 1 says why" grep -q "rank 1: its settings differ from rank 0's" diff.out
check "... nothing trained" test ! -e diff/log.csv
# SIGTERM to rank 1 alone: it travels in the next step's reduction and
# both ranks stop at one step, rank 0 writing the checkpoint.
timeout 120 "$mpirun" --oversubscribe --allow-run-as-root -np 1 "$train" \
    --steps 1000000 "${args[@]}" --eval-interval 100000 --ckpt-interval 0 \
    --out-dir sig : -np 1 env FG_SIG_RANK=1 "$train" --steps 1000000 \
    "${args[@]}" --eval-interval 100000 --ckpt-interval 0 \
    --out-dir sig >sig.out 2>&1 &
mpid=$!
for ((i = 0; i < 400; i++)); do # the first progress row
    [[ -f sig/log.csv && $(wc -l <sig/log.csv) -ge 2 ]] && break
    sleep 0.05
done
r1=$(for p in $(pgrep -f "flashgrad-train --steps 1000000"); do
    grep -qz '^FG_SIG_RANK=1$' /proc/$p/environ 2>/dev/null && echo $p
done | head -n 1)
[[ -n $r1 ]] && kill -TERM "$r1"
wait $mpid
rc=$?
check "SIGTERM to rank 1: both ranks stop (not the timeout)" test -n "$r1" -a $rc -ne 124 -a $rc -ne 0
check "... rank 0 saves the checkpoint" grep -q "^checkpoint (SIGTERM).*last.ckpt" sig.out
check "... which exists" test -s sig/last.ckpt
if [[ $fail -ne 0 ]]; then
    for f in "$work"/out.* quiet.out setup.out chk.out diff.out sig.out; do
        echo "== $f"; tail -n 20 "$f"
    done
    for d in dp one z10 z20; do echo "== $d/log.csv"; cat "$d/log.csv"; done
fi
exit $fail
