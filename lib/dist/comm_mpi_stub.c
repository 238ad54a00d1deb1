/* SPDX-License-Identifier: MIT */
/* lib/dist/comm_mpi_stub.c - the MPI backend of a build without MPI: the
 * constructors report FG_ERR_UNSUPPORTED ("built without MPI"), so callers
 * get a status, not a link error. */
#include "comm_internal.h"

fg_status fg_mpi_comm_create(int *argc, char ***argv, const void *mpi_comm,
                             fg_comm **out)
{
    (void)argc; (void)argv; (void)mpi_comm; (void)out;
    return FG_NO_MPI("fg_comm_init_mpi");
}

fg_status fg_mpi_finalize(void) { return FG_OK; }

fg_status fg_mpi_args_range(fg_comm *c, const int64_t *sig, int n,
                            int64_t *hi, int64_t *lo)
{
    (void)c; (void)sig; (void)n; (void)hi; (void)lo;
    return FG_NO_MPI("fg_comm_set_check_args");
}
