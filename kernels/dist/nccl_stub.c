/* SPDX-License-Identifier: MIT */
/* kernels/dist/nccl_stub.c - the NCCL backend of a build without NCCL: the
 * constructors report FG_ERR_UNSUPPORTED ("built without NCCL"). */
#include "lib/dist/comm_internal.h"

fg_status fg_nccl_unique_id(unsigned char id[FG_NCCL_ID_BYTES])
{
    (void)id;
    return FG_NO_NCCL("NCCL unique id");
}

fg_status fg_nccl_comm_create(const unsigned char id[FG_NCCL_ID_BYTES],
                              int rank, int size, int device, fg_comm **out)
{
    (void)id; (void)rank; (void)size; (void)device; (void)out;
    return FG_NO_NCCL("NCCL communicator");
}

fg_status fg_nccl_comm_create_all(const int *devices, int n, fg_comm **comms)
{
    (void)devices; (void)n; (void)comms;
    return FG_NO_NCCL("fg_comm_init_nccl_devices");
}

fg_status fg_nccl_device_count(int *n)
{
    *n = 0;
    return FG_NO_NCCL("NCCL device count");
}

fg_status fg_nccl_group(int start)
{
    (void)start;
    return FG_NO_NCCL(start ? "fg_comm_group_start" : "fg_comm_group_end");
}

void *fg_nccl_stream(const fg_comm *c)
{
    (void)c;
    return NULL;
}
