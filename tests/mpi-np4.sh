#!/bin/sh
# SPDX-License-Identifier: MIT
# make check: the MPI tests on 4 ranks (tests/mpi-run.sh).
exec bash "${srcdir:-.}/tests/mpi-run.sh" 4
