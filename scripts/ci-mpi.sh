#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# scripts/ci-mpi.sh - the distributed tests on CPU, for CI (Debian, as root
# or with sudo, no GPU needed):
#   1. installs Open MPI (libopenmpi-dev openmpi-bin) and the build
#      dependencies when missing;
#   2. builds flashgrad with MPI in $FG_BUILD_DIR (default build-mpi/;
#      configure flags from $FG_CONFIGURE_FLAGS, default --without-cuda);
#   3. runs the mpirun tests on 2 and 4 ranks of this machine
#      (tests/mpi-np2.sh, tests/mpi-np4.sh -> tests/mpi-run.sh): the
#      communicator's operations, data-parallel and ring-attention
#      equivalence; and flashgrad-train under mpirun -np 2
#      (tests/test_train_mpi.sh).
# Usage: bash scripts/ci-mpi.sh     (from anywhere). Exit status: the tests'.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
say() { printf '==> %s\n' "$*"; }

PKGS=(build-essential autoconf automake libtool pkg-config check
      libsubunit-dev libopenblas-dev libopenmpi-dev openmpi-bin)
missing=()
for p in "${PKGS[@]}"; do
    st=$(dpkg -s "$p" 2>/dev/null || true)
    [[ $st == *"Status: install ok installed"* ]] || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
    sudo=()
    if [[ $(id -u) -ne 0 ]]; then
        command -v sudo >/dev/null 2>&1 ||
            { echo "ci-mpi: need root or sudo to install ${missing[*]}" >&2; exit 1; }
        sudo=(sudo)
    fi
    say "installing ${missing[*]}"
    ${sudo[@]+"${sudo[@]}"} env DEBIAN_FRONTEND=noninteractive apt-get -q update >/dev/null
    ${sudo[@]+"${sudo[@]}"} env DEBIAN_FRONTEND=noninteractive \
        apt-get -q install -y --no-install-recommends "${missing[@]}" >/dev/null
fi
say "$(mpirun --version | head -n 1)"

if [[ ! -e configure || configure.ac -nt configure || Makefile.am -nt configure ]]; then
    say "autoreconf -fi"
    mkdir -p m4
    autoreconf -fi
fi
build=${FG_BUILD_DIR:-$root/build-mpi}
mkdir -p "$build"
cd "$build"
# A folder configured before Open MPI was installed is configured again.
if [[ ! -e config.status ]] || ! grep -q '^#define FG_HAVE_MPI' config.h 2>/dev/null; then
    read -r -a extra <<<"${FG_CONFIGURE_FLAGS:---without-cuda}"
    say "configure --with-mpi ${extra[*]} (in $build)"
    "$root/configure" --with-mpi "${extra[@]}" >/dev/null
fi
jobs=$(nproc 2>/dev/null || echo 1)
say "make -j$jobs"
make -j"$jobs" >/dev/null
tests="tests/mpi-np2.sh tests/mpi-np4.sh tests/test_train_mpi.sh"
say "make check TESTS=\"$tests\""
if ! make -j1 check TESTS="$tests"; then
    for log in tests/mpi-np2.log tests/mpi-np4.log tests/test_train_mpi.log; do
        [[ -f $log ]] && { printf '\n===== %s =====\n' "$log"; cat "$log"; }
    done
    exit 1
fi
cat tests/mpi-np2.log tests/mpi-np4.log tests/test_train_mpi.log
