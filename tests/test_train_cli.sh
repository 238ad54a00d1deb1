#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# tests/test_train_cli.sh - flashgrad-train's command line, end to end, on
# tiny models in a temporary folder (about 20 s on 2 cores): options, the
# run folder, checkpoints (periodic, best, SIGINT/SIGTERM), resume, data
# fingerprints, input and path checks. Run by `make check` from the build
# folder; FG_TRAIN overrides the program. Needs no gnuplot (the plot is
# checked when it is installed).
if [ -z "${BASH_VERSION:-}" ]; then exec bash "$0" "$@"; fi
set -u

train=${FG_TRAIN:-$PWD/tools/train/flashgrad-train}
[[ -x $train ]] || { echo "no $train (build first)"; echo "0 passed, 1 failed"; exit 1; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/fg-train-cli.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1

passed=0
failed=0
ok() { passed=$((passed + 1)); echo "ok   $*"; }
bad() {
    failed=$((failed + 1))
    echo "FAIL $*"
    sed 's/^/     | /' out | tail -n 15
}

# t NAME RC PATTERN [ARGS...]: runs the trainer; wants exit status RC and
# a line of stdout+stderr matching the extended regex PATTERN ('' = any).
t() {
    local name=$1 want=$2 pat=$3
    shift 3
    "$train" "$@" >out 2>&1
    local rc=$?
    if [[ $rc -ne $want ]]; then
        bad "$name: exit $rc, want $want"
    elif [[ -n $pat ]] && ! grep -Eq -- "$pat" out; then
        bad "$name: no line matches /$pat/"
    else
        ok "$name"
    fi
}
check() { # NAME COMMAND...: a test of its own
    local name=$1
    shift
    if "$@"; then ok "$name"; else bad "$name"; fi
}

# A tiny model and a short text: each run takes a fraction of a second.
TINY=(--layers 1 --heads 2 --width 16 --batch 4 --eval-batches 2 --warmup 2)
awk 'BEGIN { srand(7); split("the a fox dog runs over under sun rain sea " \
     "kings sing of old ships and", w, " ");
     for (l = 0; l < 200; l++) { s = ""; for (i = 0; i < 8; i++)
         s = s w[int(rand() * 18) + 1] " "; print s } }' >text.txt
sed 's/fox/dog/' text.txt >other.txt # same characters, other text
{ cat text.txt; echo 'Zebra!'; } >newchars.txt
TEXT=(--data text.txt --ctx 16 --samples 1 --sample-len 20 "${TINY[@]}")

# ---- options ----------------------------------------------------------------
t "--steps 0 is refused" 2 "^flashgrad-train: --steps: 0 is out of range" --steps 0
t "--batch 0 is refused" 2 "--batch: 0 is out of range" --batch 0
t "--steps abc is refused" 2 "--steps: 'abc' is not a whole number" --steps abc
t "--steps 1.5e2 is refused" 2 "--steps: '1.5e2' is not a whole number" --steps 1.5e2
t "--steps=12x is refused" 2 "--steps: '12x' is not a whole number" --steps=12x
t "--lr -1 is refused" 2 "--lr: -1 is out of range" --lr -1
t "--dropout 1 is refused" 2 "--dropout: 1 is out of range \[0, 1\)" --dropout 1
t "--bucket-mb -1 is refused" 2 "--bucket-mb: -1 is out of range" --bucket-mb -1
t "--bucket-mb 2000 is refused" 2 "--bucket-mb: 2000 is out of range" --bucket-mb 2000
t "--seed overflow is refused" 2 "--seed: .* is out of range" --seed 99999999999999999999
t "--device gpu is refused" 2 "--device: 'gpu' is not one of cpu\|cuda\|auto" --device gpu
t "--bogus is an unknown option" 2 "unknown option --bogus" --bogus
t "--bogus with a value too" 2 "unknown option --bogus" --bogus 3
t "--steps without a value" 2 "--steps needs a value" --steps
t "a stray argument" 2 "unexpected argument 'foo'" foo
t "text options in sort mode" 2 "--samples applies to text mode only" --samples 3
# Several GPU processes without MPI: the options go together, and a
# machine that cannot join GPU ranks says so before training anything.
t "--world-size without --rendezvous" 2 "--rendezvous and --world-size go together" --world-size 2
t "--rendezvous without --world-size" 2 "--rendezvous and --world-size go together" --rendezvous rz.id
t "--rank without the others" 2 "--rank goes with --rendezvous" --rank 1
t "--rank past --world-size" 2 "--rank 2 is not below --world-size 2" \
    --rendezvous rz.id --world-size 2 --rank 2
t "--rendezvous on the CPU" 2 "--rendezvous joins GPU processes" \
    --rendezvous rz.id --world-size 2 --device cpu
check "... and leaves no file" test ! -e rz.id
t "--rendezvous with --world-size 1 is one process" 0 "trained 4 steps" \
    "${TEXT[@]}" --steps 4 --rendezvous rz.id --world-size 1 --device cpu \
    --ckpt none --out-dir rz1
t "--version" 0 "^flashgrad-train \(flashgrad [0-9]+\.[0-9]+\.[0-9]+\)$" --version
t "--help: exit codes" 0 "^  143|130  stopped by SIGINT" --help
check "--help: defaults and modes" grep -Eq -- "--steps N .*\[sort 800, text 2000\]" out
check "--help: fits 80 columns" eval '! awk "length > 79" out | grep -q .'

# ---- a text run: the run folder, progress, evaluation, samples, MFU ----------
t "text run" 0 "^final: train loss" "${TEXT[@]}" --steps 10 --print-interval 2 \
    --eval-interval 5 --sample-interval 4 --ckpt-interval 4 --peak-tflops 1 \
    --out-dir run1
cp out run1.out
check "run folder holds config, log, samples, checkpoints" \
    test -s run1/config -a -s run1/log.csv -a -s run1/samples.txt \
    -a -s run1/last.ckpt -a -s run1/best.ckpt
check "progress every 2 steps, evaluations every 5" \
    test "$(grep -c '^step ' run1.out) $(grep -c '^eval at' run1.out)" = "6 2"
check "MFU with --peak-tflops" grep -q "| MFU [0-9.]*% |" run1.out
check "header: FLOPs per token and step, the peak" grep -Eq \
    "[0-9.]+ MFLOP per token \(6N \+ 12 L C T\), [0-9.]+ GFLOP per step \| MFU of 1 TFLOP/s" run1.out
# tokens_per_s > 0, and mfu = tokens_per_s x FLOPs per token / 1e12 (4 digits
# in the CSV, the per-token count from the header).
fpt=$(sed -nE 's/.*\| ([0-9.e+]+) MFLOP per token.*/\1/p' run1.out)
check "CSV: tokens_per_s and mfu columns, consistent and sane" awk -F, -v fpt="$fpt" '
    NR == 1 { ok = $8 == "tokens_per_s" && $9 == "mfu"; next }
    { n++; m = $8 * fpt * 1e6 / 1e12
      if (!($8 > 0) || !($9 > 0 && $9 < 1) || ($9 - m) > 1e-4 * m + 1e-6 ||
          (m - $9) > 1e-4 * m + 1e-6) ok = 0 }
    END { exit !(ok && n == 6 && fpt > 0) }' run1/log.csv
check "periodic checkpoints" \
    test "$(grep -c '^checkpoint (periodic).*at step [48]$' run1.out)" = 2
check "samples during training" grep -q "^---- sample 1 at step 4 " run1/samples.txt
check "generation speed after each sample" \
    grep -Eq "^\(generated 20 tokens in [0-9.]+ s: [0-9]+ tok/s, cache\)$" run1.out
t "--sample-mode recompute" 0 "tok/s, recompute\)" "${TEXT[@]}" --steps 3 \
    --sample-mode recompute --out-dir runrc
t "--sample-mode cache (the default)" 0 "tok/s, cache\)" "${TEXT[@]}" --steps 3 \
    --out-dir runkv
check "... the same text (past the context of 16)" cmp -s runrc/samples.txt runkv/samples.txt
t "--sample-mode shift" 0 "tok/s, shift\)" "${TEXT[@]}" --steps 3 \
    --sample-mode shift --temperature 0 --out-dir runsh
t "--sample-mode bogus is refused" 2 "--sample-mode: 'bogus' is not one of" \
    "${TEXT[@]}" --sample-mode bogus

# ---- --profile-steps: a table per kernel family, results unchanged --------
t "--profile-steps 3" 0 "^profile of steps 2\.\.4 \(wall-clock" "${TEXT[@]}" --steps 6 \
    --print-interval 2 --dropout 0.1 --profile-steps 3 --out-dir runp1
check "profile: every family timed and called" awk '
    /^  step \(wall\)/ { wall = $NF; done = 1 }
    !done && /^  (GEMM|attention|layernorm|softmax-xent|optimizer|other kernels) / {
        n++; if (!($(NF - 2) > 0 && $NF >= 1)) bad = 1
        if ($0 ~ /^  other kernels/) other = $NF }
    /^  the other families by operation:/ { rest = 1 }
    done && !rest && /^    [^ ]/ { ops++; calls += $NF }
    rest && /^    [^ ]/ && $NF ~ /^(GEMM|attention|layernorm|softmax-xent|optimizer)$/ { fam++ }
    END { d = calls - other; if (d < 0) d = -d
          exit !(n == 6 && !bad && wall > 0 && ops > 0 && fam >= 3 &&
                 (ops == 12 || d <= 0.05 * ops)) }' out
check "profile: the other kernels by operation" grep -q "^  other kernels by operation:" out
t "... the same run without it" 0 "" "${TEXT[@]}" --steps 6 --print-interval 2 \
    --dropout 0.1 --out-dir runp0
check "... gives the same losses and gradient norms" eval \
    'test "$(cut -d, -f1-5 runp1/log.csv)" = "$(cut -d, -f1-5 runp0/log.csv)"'
t "--profile-steps past the end: the steps there are" 0 "^profile of steps 2\.\.3 " \
    "${TEXT[@]}" --steps 3 --profile-steps 10 --out-dir runp2

# ---- loss scaling: fp16 needs a GPU; on fp32 a power-of-two scale changes no bit
t "--dtype fp16 needs cuda" 2 "--dtype fp16 needs --device cuda" "${TEXT[@]}" \
    --device cpu --dtype fp16
t "bad --loss-scale" 2 "--loss-scale" "${TEXT[@]}" --loss-scale -1
t "--loss-scale on fp32" 0 "\| loss scale 1024 \(0 skipped\) \|" "${TEXT[@]}" \
    --steps 6 --print-interval 2 --dropout 0.1 --loss-scale 1024 --out-dir runls
check "... gives the unscaled run's losses and gradient norms" eval \
    'test "$(cut -d, -f1-5 runls/log.csv)" = "$(cut -d, -f1-5 runp0/log.csv)"'
check "... and its checkpoint keeps the scaler (scale, good steps, skipped)" \
    grep -aq "^@loss-scale 0x1p+10 6 0$" runls/last.ckpt
t "... which a resumed run takes up" 0 "^step +8/8 .*\| loss scale 1024 \(0 skipped\) \|" \
    --resume runls/last.ckpt --steps 8

# ---- attention variants: window, ALiBi (no learned positions), softcap ------
t "attention variants train" 0 "^final: train loss" "${TEXT[@]}" --steps 6 \
    --window 4 --alibi 1 --softcap 5 --out-dir runv
check "variants in the config print" grep -q -- "--window 4 --alibi 1 --softcap 5" out
t "bad --window" 2 "--window" "${TEXT[@]}" --window -1
t "bad --softcap" 2 "--softcap" "${TEXT[@]}" --softcap nan
check "config print: device, threads, no sort flags" eval \
    'grep -q -- "--device auto" run1.out && grep -q -- "--threads 1" run1.out &&
     grep -q "| cpu, fp32, 1 thread |" run1.out && ! grep -q -- "--sort-len" run1.out'
check "CSV: header and one row per progress line" \
    test "$(head -1 run1/log.csv | cut -d, -f1-4) $(wc -l <run1/log.csv)" = \
    "step,loss,val_loss,accuracy 7"
if command -v gnuplot >/dev/null 2>&1; then
    check "loss.png is a PNG" eval 'head -c 4 run1/loss.png | grep -q PNG'
else
    check "no gnuplot: a note, no failure" grep -q "gnuplot is not installed" run1.out
fi
t "no MFU on the CPU by default" 0 "MFU needs --peak-tflops" "${TEXT[@]}" --steps 2 --out-dir run0
check "... and none on the progress line" eval '! grep -q "MFU [0-9]" out'
check "... nor in the CSV" awk -F, 'NR > 1 && $9 != "" { exit 1 }' run0/log.csv
t "--peak-tflops -0.5 is refused" 2 "--peak-tflops: -1 \(auto\), 0 \(off\)" "${TEXT[@]}" --peak-tflops -0.5
t "an existing run folder is not overwritten" 2 "already holds a run" \
    "${TEXT[@]}" --steps 2 --out-dir run1
mkdir -p deadend && : >deadend/config
t "a run folder without last.ckpt says so" 2 "left no last.ckpt to resume from" \
    "${TEXT[@]}" --steps 2 --out-dir deadend
t "--log on the run's config is refused" 2 "config and --log would both be" \
    "${TEXT[@]}" --steps 2 --out-dir same1 --log same1/config
check "... and the config is not written" test ! -e same1/config
t "--ckpt on the best checkpoint is refused" 2 "--ckpt and the best checkpoint would both be" \
    "${TEXT[@]}" --steps 2 --out-dir same2 --ckpt same2/best.ckpt
t "--log on --ckpt is refused" 2 "--ckpt and --log would both be" \
    "${TEXT[@]}" --steps 2 --out-dir same3 --log ck.bin --ckpt ck.bin
t "a softcap attention cannot take fails before the run folder" 2 "attn_softcap 1e-39" \
    "${TEXT[@]}" --steps 2 --out-dir cap --softcap 1e-39
check "... which is never made" test ! -e cap

# ---- resume ------------------------------------------------------------------
t "resume: more steps" 0 "resumed from .* at step 10" --resume run1/last.ckpt --steps 14
cp out resume.out
check "resume keeps the run's settings" eval \
    'grep -q -- "--eval-interval 5" resume.out && grep -q -- "--print-interval 2" resume.out &&
     grep -q -- "--sample-len 20" resume.out && grep -q -- "--peak-tflops 1" resume.out'
check "resume appends to the CSV under one header" eval \
    'test "$(grep -c ^step, run1/log.csv) $(cut -d, -f1 run1/log.csv | tr "\n" " ")" = \
     "1 step 2 4 5 6 8 10 12 14 "'
check "elapsed time goes on" awk -F, 'NR > 1 { if ($10 < last) exit 1; last = $10 }' run1/log.csv
echo "99,9,,,0,0,0,0,,0" >>run1/log.csv # a row from after the checkpoint
t "resume cuts the CSV back to the checkpoint" 0 "" --resume run1/last.ckpt --steps 16
check "... the stale row is gone" eval '! grep -q "^99," run1/log.csv && tail -1 run1/log.csv | grep -q "^16,"'
mkdir -p elsewhere
(cd elsewhere && "$train" --resume ../run1/last.ckpt --steps 17 \
    --out-dir ../run1b >../out 2>&1)
check "resume from another directory (paths kept absolute)" eval \
    'grep -q "resumed from ../run1/last.ckpt at step 16" out && test -s run1b/last.ckpt'
t "resume on other text is refused" 2 "is not the text .* was trained on" \
    --resume run1/last.ckpt --data other.txt --steps 18
t "... unless --allow-new-data" 0 "resumed from" --resume run1/last.ckpt \
    --data other.txt --steps 18 --allow-new-data --out-dir run2
t "new characters are refused even then" 2 "character 0x21 \('!'\) that the vocabulary" \
    --resume run1/last.ckpt --data newchars.txt --steps 18 --allow-new-data
t "--allow-new-data without --resume" 2 "goes with --resume" "${TEXT[@]}" --allow-new-data
t "resume: a directory" 2 "is a directory, not a checkpoint" --resume run1
t "resume: a missing file" 2 "No such file or directory" --resume nothing.ckpt

# ---- signals -----------------------------------------------------------------
# A long run stopped by a signal saves last.ckpt and dies of the signal.
sig_run() { # SIGNAL DIR WANT
    "$train" "${TINY[@]}" --sort-len 4 --sort-digits 4 --steps 1000000 \
        --print-interval 5 --eval-interval 1000 --ckpt-interval 0 \
        --out-dir "$2" >"$2.out" 2>&1 &
    local pid=$! i
    for ((i = 0; i < 200; i++)); do # wait for the first progress row
        [[ -f $2/log.csv && $(wc -l <"$2/log.csv") -ge 2 ]] && break
        sleep 0.05
    done
    kill "-$1" "$pid"
    wait "$pid"
    local rc=$?
    cp "$2.out" out
    if [[ $rc -eq $3 ]] && grep -q "^checkpoint (SIG$1).*last.ckpt" out &&
        [[ -s $2/last.ckpt ]]; then ok "$1: checkpoint, exit $rc"; else
        bad "$1: exit $rc, want $3 and a checkpoint"; fi
}
sig_run TERM sigterm 143
sig_run INT sigint 130
at=$(tail -1 sigterm/log.csv | cut -d, -f1)
"$train" --resume sigterm/last.ckpt --steps $((at + 7)) --final-examples 10 \
    >out 2>&1
rc=$?
check "a run stopped by SIGTERM resumes" eval \
    'test $rc -eq 3 -o $rc -eq 0 && grep -q "resumed from sigterm/last.ckpt" out'

# ---- data checks ---------------------------------------------------------------
printf 'binary\0data\1\2\3 %.0s' $(seq 40) >binary.bin
t "binary input is refused" 2 "binary.bin does not look like text \(a NUL byte" \
    --data binary.bin --ctx 8 "${TINY[@]}"
t "... unless --bytes" 0 "raw bytes" --data binary.bin --bytes --ctx 8 --steps 2 \
    --samples 1 --sample-len 8 "${TINY[@]}" --out-dir bytes
check "... and samples show no raw control bytes" eval \
    '! grep -a -A1 "^---- sample" out | grep -aq "[[:cntrl:]]"'
printf '\xff\xfe broken utf-8 %.0s' $(seq 20) >latin.txt
t "invalid UTF-8 is refused" 2 "invalid UTF-8 at byte 0" --data latin.txt --ctx 8
t "a directory as data" 2 "--data .*: is a directory" --data "$tmp"
t "a missing data file" 2 "No such file or directory" --data nothing.txt
t "--ctx longer than the validation split" 2 "--ctx 900 needs windows of 901 characters, but the validation split" \
    --data text.txt --ctx 900
t "a sort task with an empty split" 2 "held-out split has no inputs" \
    --sort-len 2 --sort-digits 2

# ---- paths, devices ---------------------------------------------------------------
t "unwritable --ckpt: refused before step 1" 2 "--ckpt /dev/null/x.ckpt: cannot write in /dev/null: Not a directory" \
    "${TEXT[@]}" --ckpt /dev/null/x.ckpt --out-dir p1
check "... nothing trained" eval '! grep -q "^step" out'
t "unwritable --plot: refused before step 1" 2 "--plot /dev/null/x.png: .*Not a directory" \
    "${TEXT[@]}" --plot /dev/null/x.png --out-dir p2
t "unwritable --log" 2 "--log /dev/null/x.csv: Not a directory" \
    "${TEXT[@]}" --log /dev/null/x.csv --out-dir p3
t "unusable --out-dir" 2 "--out-dir text.txt/sub: Not a directory" \
    "${TEXT[@]}" --out-dir text.txt/sub
(cd elsewhere && "$train" --data ../text.txt --ctx 16 --samples 0 "${TINY[@]}" \
    --steps 2 --out-dir ../rel >../out 2>&1)
check "relative paths resolve against the working directory" \
    grep -q -- "--data $(pwd -P)/text.txt" rel/config
"$train" --device cuda "${TINY[@]}" --sort-len 4 --sort-digits 4 --steps 1 \
    --final-examples 10 --out-dir cuda >out 2>&1
rc=$?
if [[ $rc -eq 2 ]]; then
    check "--device cuda without a GPU says why" eval \
        'grep -q "^flashgrad-train: --device cuda: no CUDA device (.*)$" out &&
         ! grep -q "cudaMalloc\|\.cu:" out'
else
    check "--device cuda with a GPU trains" test "$rc" -eq 3 -o "$rc" -eq 0
fi
t "sort task below 99%: exit 3" 3 "held-out exact-match accuracy" \
    "${TINY[@]}" --sort-len 4 --sort-digits 4 --steps 3 --final-examples 50 \
    --out-dir sort1
t "resume: a sort run cannot become text" 2 "is a sort-task run: --data cannot change" \
    --resume sort1/last.ckpt --data text.txt
check "sort run: accuracy in the CSV" awk -F, 'NR == 2 { exit !($4 != "") }' sort1/log.csv

# Memory running out: exit 1, and the message names what needs less. A
# model of 0.8 GB under a 400 MB address-space limit (not in a sanitizer
# build, which cannot start under it).
(ulimit -v 400000 && exec "$train" --device cpu --layers 4 --heads 16 --width 2048 \
    --steps 1 --out-dir oom) >out 2>&1
rc=$?
if grep -q "Sanitizer" out; then
    echo "skip out of memory: a sanitizer build"
else
    check "out of memory: exit 1 with a hint" eval \
        '[[ $rc -eq 1 ]] && grep -q -- "memory ran out: a smaller --batch" out'
fi

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
