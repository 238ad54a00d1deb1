/* SPDX-License-Identifier: MIT */
/* lib/core/byteorder.h - the library's files (checkpoints) are
 * little-endian on every host, tensor payloads included, so a checkpoint
 * written on one machine loads on any other. On little-endian hosts (x86,
 * arm64) the conversions are no-ops; big-endian ones (s390x, ppc64)
 * reverse each element's bytes. */
#ifndef FG_CORE_BYTEORDER_H
#define FG_CORE_BYTEORDER_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline int fg_host_big_endian(void)
{
    const uint16_t one = 1;
    unsigned char first;
    memcpy(&first, &one, 1);
    return first == 0;
}

/* Reverses the bytes of each width-byte element of p[0, nbytes): width 1,
 * 2, 4 or 8 (a dtype's size), nbytes a multiple of it. */
static inline void fg_swap_elems(void *p, size_t nbytes, size_t width)
{
    unsigned char *b = (unsigned char *)p;
    if (width < 2)
        return;
    for (size_t at = 0; at + width <= nbytes; at += width)
        for (size_t i = 0, j = width - 1; i < j; i++, j--) {
            const unsigned char t = b[at + i];
            b[at + i] = b[at + j];
            b[at + j] = t;
        }
}

/* Host order <-> little-endian, in place (its own inverse). */
static inline void fg_le_elems(void *p, size_t nbytes, size_t width)
{
    if (fg_host_big_endian())
        fg_swap_elems(p, nbytes, width);
}

#endif /* FG_CORE_BYTEORDER_H */
