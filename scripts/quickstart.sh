#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# scripts/quickstart.sh - one command from a fresh checkout to a result.
#
#   scripts/quickstart.sh run [ARGS...]   build, then run the main job
#   scripts/quickstart.sh test            build, then run `make check`
#
# Both modes first make sure the Debian build dependencies are installed
# (using apt-get, through sudo when not root), regenerate the Autotools
# files when they are missing or stale, configure once (extra ./configure
# arguments come from the FG_CONFIGURE_FLAGS environment variable) and build
# with one make job per CPU.
#
# Environment:
#   FG_CONFIGURE_FLAGS  extra ./configure arguments, e.g. "--without-cuda";
#                       only used when the tree is not configured yet
#                       (delete config.status to reconfigure)
#   FG_SKIP_DEPS=1      do not check or install system packages
set -euo pipefail

# ---------------------------------------------------------------------------
# THE MAIN JOB. `run` executes this command (plus any extra arguments given
# after `run`): the trainer, flashgrad-train, which trains a small GPT on its
# built-in task (or a text file with --data FILE). It runs in the caller's
# directory, so relative paths in the arguments mean what they say and the
# run's output folder lands there.
MAIN_JOB=(tools/train/flashgrad-train) # relative to the build folder
# ---------------------------------------------------------------------------

DEPS=(build-essential autoconf automake libtool pkg-config check
      libsubunit-dev libopenblas-dev libopenmpi-dev openmpi-bin)

say() { printf '==> %s\n' "$*"; }
die() { printf 'quickstart: %s\n' "$*" >&2; exit 1; }

usage() {
    cat >&2 <<'EOF'
usage: scripts/quickstart.sh run|test
  run    install build deps if needed, build, run the main job
  test   install build deps if needed, build, run the test suite (make check)
EOF
    exit 2
}

[[ $# -ge 1 ]] || usage
mode=$1
shift
case $mode in
run) ;;
test) [[ $# -eq 0 ]] || usage ;;
-h | --help | help) usage ;;
*) usage ;;
esac

# Work from the repository root wherever we are called from; the main job
# goes back to the caller's directory.
caller=$PWD
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

jobs=$(nproc 2>/dev/null || echo 1)

# ---- (a) build dependencies ------------------------------------------------
pkg_installed() {
    # dpkg -s also succeeds for removed packages that left config files
    # behind, so look at the Status line as well. (No pipe into grep -q:
    # with pipefail an early-closing grep could fail the test.)
    local st
    st=$(dpkg -s "$1" 2>/dev/null) || return 1
    [[ $st == *"Status: install ok installed"* ]]
}

install_deps() {
    if [[ ${FG_SKIP_DEPS:-0} == 1 ]]; then
        say "FG_SKIP_DEPS=1: not checking system packages"
        return 0
    fi
    if ! command -v dpkg >/dev/null 2>&1; then
        say "dpkg not found (not a Debian-like system): make sure these are" \
            "installed or equivalent: ${DEPS[*]}"
        return 0
    fi
    local missing=() p
    for p in "${DEPS[@]}"; do
        pkg_installed "$p" || missing+=("$p")
    done
    if [[ ${#missing[@]} -eq 0 ]]; then
        return 0
    fi
    say "installing missing build dependencies: ${missing[*]}"

    local sudo=()
    if [[ $(id -u) -ne 0 ]]; then
        if command -v sudo >/dev/null 2>&1; then
            sudo=(sudo)
        else
            die "these packages are missing and I am neither root nor able to" \
                "use sudo: ${missing[*]}
Install them (as root: apt-get install ${DEPS[*]}) and run me again."
        fi
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        die "apt-get not found; please install: ${missing[*]}"
    fi
    if ! ${sudo[@]+"${sudo[@]}"} env DEBIAN_FRONTEND=noninteractive \
            apt-get update ||
        ! ${sudo[@]+"${sudo[@]}"} env DEBIAN_FRONTEND=noninteractive \
            apt-get install -y --no-install-recommends "${missing[@]}"; then
        die "could not install the build dependencies. Install them by hand:
    apt-get install ${DEPS[*]}"
    fi
}

# ---- (b) (c) (d) configure and build ----------------------------------------
# Out of tree, in $FG_BUILD_DIR (default build/), so the source tree stays
# clean and other build folders (scripts/gpu-bundle.sh) can sit beside it.
# A source tree that was configured in place is built in place instead.
build() {
    if [[ ! -e configure || configure.ac -nt configure ||
          Makefile.am -nt configure ]]; then
        say "autoreconf -fi"
        mkdir -p m4 # a fresh clone may lack it; aclocal is told -I m4
        autoreconf -fi
    fi
    local builddir=${FG_BUILD_DIR:-$root/build}
    [[ -e $root/config.status ]] && builddir=$root
    mkdir -p "$builddir"
    cd "$builddir"
    if [[ ! -e config.status ]]; then
        local extra=()
        read -r -a extra <<<"${FG_CONFIGURE_FLAGS:-}"
        say "configure ${extra[*]+${extra[*]}} (in $builddir)"
        "$root/configure" ${extra[@]+"${extra[@]}"}
    elif [[ ! -e Makefile ]]; then
        ./config.status
    fi
    say "make -j$jobs"
    local t0=$SECONDS
    make -j"$jobs"
    say "built in $((SECONDS - t0)) s"
}

# ---- test-failure report ------------------------------------------------------
show_failures() {
    local shown=0 trs log
    if [[ -f tests/test-suite.log ]]; then
        printf '\n===== tests/test-suite.log =====\n'
        cat tests/test-suite.log
    fi
    # Automake's parallel harness records each test's verdict in a .trs file.
    for trs in tests/*.trs; do
        [[ -e $trs ]] || continue
        if grep -Eq '^:test-result: (FAIL|ERROR|XPASS)' "$trs"; then
            log=${trs%.trs}.log
            if [[ -f $log ]]; then
                printf '\n===== %s =====\n' "$log"
                cat "$log"
                shown=1
            fi
        fi
    done
    # No verdicts (e.g. the harness itself broke): fall back to the logs'
    # own words, as printed by Check ("Failures: 1", "Errors: 2").
    if [[ $shown -eq 0 ]]; then
        for log in tests/*.log; do
            [[ -e $log && $log != tests/test-suite.log ]] || continue
            if grep -Eq '(Failures|Errors): [1-9]|^(FAIL|ERROR)' "$log"; then
                printf '\n===== %s =====\n' "$log"
                cat "$log"
                shown=1
            fi
        done
    fi
    if [[ $shown -eq 0 && ! -f tests/test-suite.log ]]; then
        printf 'No test logs were written: the failure happened while building\n'
        printf 'the tests; see the compiler output above.\n'
    fi
}

install_deps
build

case $mode in
run)
    job=("$PWD/${MAIN_JOB[0]}" "${MAIN_JOB[@]:1}") # build folder: $PWD
    cd "$caller"
    say "running: ${job[*]} $* (in $caller)"
    exec "${job[@]}" "$@"
    ;;
test)
    say "make -j$jobs check"
    if make -j"$jobs" check; then
        say "all tests passed"
    else
        status=$?
        show_failures
        printf '\nquickstart: make check failed (exit %d)\n' "$status" >&2
        exit "$status"
    fi
    ;;
esac
