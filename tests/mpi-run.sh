#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# tests/mpi-run.sh NP - runs the MPI test programs on NP ranks of this
# machine (make check runs it through tests/mpi-np2.sh and mpi-np4.sh).
# Skipped (exit 77) when configure found no MPI. Ranks are oversubscribed
# (CI has 2 cores) and single-threaded; root is allowed, as CI runs as root.
set -u
np=${1:?usage: mpi-run.sh NP}
mpirun=${FG_MPIRUN-}
if [[ -z $mpirun ]]; then
    echo "skipped: configure found no MPI (install libopenmpi-dev openmpi-bin, reconfigure)"
    exit 77
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMP_NUM_THREADS=1
# Vader's shared memory is enough on one host; keep Open MPI from probing
# networks (slow, noisy in containers).
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
status=0
for prog in tests/test_dist_comm tests/test_dist_dp tests/test_dist_ring; do
    [[ -x $prog ]] || continue
    echo "== $mpirun -np $np $prog"
    start=$(date +%s%N)
    timeout 120 "$mpirun" --oversubscribe --allow-run-as-root -np "$np" \
        "$prog"
    rc=$?
    ms=$((($(date +%s%N) - start) / 1000000))
    echo "   ($prog: exit $rc, $ms ms)"
    [[ $rc -eq 0 ]] || status=1
done
exit $status
