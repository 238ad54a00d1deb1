/* SPDX-License-Identifier: MIT */
/* lib/autograd/tensor_arena.c - where tensor memory comes from: the heap or an arena.
 *
 * An arena is a bump allocator over chunks with exact-size free lists: a
 * block released during a step (a temporary whose last reference went) is
 * handed to the next request of the same size, so backward temporaries
 * reuse the memory of dead ones. fg_arena_reset() forgets everything at
 * once; if the step needed several chunks it merges them into one, so a
 * step that repeats the same allocation sequence (a training step) then
 * never calls malloc again. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lib/core/error.h"
#include "tensor_internal.h"

#define FL_SLOTS 64
#define FL_PROBE 8
#define STACK_MAX 16
#define DEFAULT_CHUNK ((size_t)1 << 20)

typedef struct fg_chunk {
    struct fg_chunk *next;
    size_t cap, used;
} fg_chunk;

/* Chunk payload starts one alignment unit after the header. */
#define CHUNK_HDR FG_ALIGN

struct fg_arena {
    fg_chunk *chunks; /* head is the one being filled */
    size_t initial;
    size_t capacity, used, high_water;
    uint64_t chunk_allocs, resets;
    size_t live_objects;
    int resetting;
    fg_obj live; /* sentinel of the live-object list */
    struct {
        size_t size;
        void *head; /* singly linked through the first word */
    } fl[FL_SLOTS];
};

static _Thread_local fg_arena *tls_stack[STACK_MAX];
static _Thread_local int tls_depth;

static size_t round_up(size_t n, size_t a)
{
    return (n + a - 1) / a * a;
}

/* ---- heap ---------------------------------------------------------------- */

static void *heap_alloc(size_t bytes)
{
    void *p = aligned_alloc(FG_ALIGN, bytes);
    if (p)
        fg_memstat_alloc(bytes);
    return p;
}

static void heap_free(void *p, size_t bytes)
{
    if (!p)
        return;
    fg_memstat_free(bytes);
    free(p);
}

/* ---- arena blocks ---------------------------------------------------- */

static int fl_slot(fg_arena *a, size_t size, int create)
{
    size_t h = (size / FG_ALIGN) % FL_SLOTS;
    for (int i = 0; i < FL_PROBE; i++) {
        size_t s = (h + (size_t)i) % FL_SLOTS;
        if (a->fl[s].size == size)
            return (int)s;
        if (a->fl[s].size == 0) {
            if (!create)
                return -1;
            a->fl[s].size = size;
            return (int)s;
        }
    }
    return -1;
}

static fg_chunk *chunk_new(fg_arena *a, size_t cap)
{
    if (cap > SIZE_MAX / 2) /* CHUNK_HDR + cap would wrap */
        return NULL;
    fg_chunk *c = heap_alloc(CHUNK_HDR + cap);
    if (!c)
        return NULL;
    c->cap = cap;
    c->used = 0;
    c->next = NULL;
    a->chunk_allocs++;
    return c;
}

static void *arena_alloc(fg_arena *a, size_t bytes)
{
    int s = fl_slot(a, bytes, 0);
    if (s >= 0 && a->fl[s].head) {
        void *p = a->fl[s].head;
        a->fl[s].head = *(void **)p;
        return p;
    }
    fg_chunk *c = a->chunks;
    if (!c || c->cap - c->used < bytes) {
        /* Grow geometrically: the new chunk is at least what we have. */
        size_t cap = a->capacity > a->initial ? a->capacity : a->initial;
        if (cap < bytes)
            cap = bytes > SIZE_MAX / 2 ? bytes : round_up(bytes, FG_ALIGN);
        fg_chunk *n = chunk_new(a, cap);
        if (!n)
            return NULL;
        n->next = a->chunks;
        a->chunks = n;
        a->capacity += cap;
        c = n;
    }
    void *p = (char *)c + CHUNK_HDR + c->used;
    c->used += bytes;
    a->used += bytes;
    return p;
}

static void arena_release(fg_arena *a, void *p, size_t bytes)
{
    int s = fl_slot(a, bytes, 1);
    if (s < 0)
        return; /* table full: the block idles until the reset */
    *(void **)p = a->fl[s].head;
    a->fl[s].head = p;
}

void *fg_mem_alloc(fg_arena *a, size_t bytes)
{
    bytes = round_up(bytes ? bytes : 1, FG_ALIGN);
    return a ? arena_alloc(a, bytes) : heap_alloc(bytes);
}

void fg_mem_free(fg_arena *a, void *p, size_t bytes)
{
    if (!p)
        return;
    bytes = round_up(bytes ? bytes : 1, FG_ALIGN);
    if (a) {
        if (!a->resetting)
            arena_release(a, p, bytes);
    } else {
        heap_free(p, bytes);
    }
}

/* ---- live objects ---------------------------------------------------- */

void fg_arena_link(fg_arena *a, fg_obj *o)
{
    o->prev = &a->live;
    o->next = a->live.next;
    a->live.next->prev = o;
    a->live.next = o;
    a->live_objects++;
}

void fg_arena_unlink(fg_arena *a, fg_obj *o)
{
    o->prev->next = o->next;
    o->next->prev = o->prev;
    o->prev = o->next = NULL;
    a->live_objects--;
}

int fg_arena_resetting(const fg_arena *a) { return a && a->resetting; }

/* ---- public API ---------------------------------------------------------- */

fg_status fg_arena_create(size_t initial_bytes, fg_arena **out)
{
    if (!out)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "out is NULL");
    /* A chunk is CHUNK_HDR + the size rounded up: past this it wraps. */
    if (initial_bytes > SIZE_MAX / 2)
        return FG_FAIL(FG_ERR_OUT_OF_MEMORY,
                       "an arena of %zu bytes is not possible", initial_bytes);
    fg_arena *a = heap_alloc(round_up(sizeof *a, FG_ALIGN));
    if (!a)
        return FG_FAIL(FG_ERR_OUT_OF_MEMORY, "cannot allocate an arena");
    memset(a, 0, sizeof *a);
    a->initial = round_up(initial_bytes ? initial_bytes : DEFAULT_CHUNK,
                          FG_ALIGN);
    a->live.prev = a->live.next = &a->live;
    *out = a;
    return FG_OK;
}

fg_status fg_arena_reset(fg_arena *a)
{
    if (!a)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "arena is NULL");
    /* Objects of this arena are simply forgotten; only what they reference
     * elsewhere (heap tensors, nodes, hooks) is released. Releases of
     * objects of this arena are no-ops while `resetting` is set, so the
     * list is not modified under the walk. */
    a->resetting = 1;
    for (fg_obj *o = a->live.next; o != &a->live; o = o->next)
        fg_obj_drop_refs(o);
    a->live.prev = a->live.next = &a->live;
    a->live_objects = 0;
    memset(a->fl, 0, sizeof a->fl);
    if (a->used > a->high_water)
        a->high_water = a->used;

    if (a->chunks && a->chunks->next) {
        size_t need = 0;
        for (fg_chunk *c = a->chunks; c; c = c->next)
            need += c->used;
        need = round_up(need > a->initial ? need : a->initial, FG_ALIGN);
        fg_chunk *merged = chunk_new(a, need);
        if (merged) { /* else keep the old chunks: still correct */
            for (fg_chunk *c = a->chunks, *n; c; c = n) {
                n = c->next;
                heap_free(c, CHUNK_HDR + c->cap);
            }
            a->chunks = merged;
            a->capacity = need;
        }
    }
    for (fg_chunk *c = a->chunks; c; c = c->next)
        c->used = 0;
    a->used = 0;
    a->resets++;
    a->resetting = 0;
    return FG_OK;
}

void fg_arena_free(fg_arena *a)
{
    if (!a)
        return;
    fg_arena_reset(a);
    for (fg_chunk *c = a->chunks, *n; c; c = n) {
        n = c->next;
        heap_free(c, CHUNK_HDR + c->cap);
    }
    heap_free(a, round_up(sizeof *a, FG_ALIGN));
}

fg_status fg_arena_push(fg_arena *a)
{
    if (tls_depth >= STACK_MAX)
        return FG_FAIL(FG_ERR_STATE, "arena stack full (%d entries)",
                       STACK_MAX);
    tls_stack[tls_depth++] = a;
    return FG_OK;
}

fg_status fg_arena_pop(fg_arena *a)
{
    if (tls_depth == 0)
        return FG_FAIL(FG_ERR_STATE, "arena stack is empty");
    if (tls_stack[tls_depth - 1] != a)
        return FG_FAIL(FG_ERR_STATE,
                       "the top of the arena stack is not this arena");
    tls_depth--;
    return FG_OK;
}

fg_status fg_arena_get_stats(const fg_arena *a, fg_arena_stats *st)
{
    if (!a || !st)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "arena or stats is NULL");
    st->capacity = a->capacity;
    st->used = a->used;
    st->high_water = a->high_water > a->used ? a->high_water : a->used;
    st->chunk_allocs = a->chunk_allocs;
    st->resets = a->resets;
    st->live_objects = a->live_objects;
    return FG_OK;
}

fg_arena *fg_alloc_domain(fg_tensor *const *inputs, int n)
{
    if (tls_depth > 0)
        return tls_stack[tls_depth - 1];
    for (int i = 0; i < n; i++)
        if (inputs[i] && inputs[i]->obj.arena)
            return inputs[i]->obj.arena;
    return NULL;
}
