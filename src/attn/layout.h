/* layout.h: the sparse kernel's input format (never installed). A layout
 * says, per (batch, KV head, query block), which key ranges the block
 * reads: a sorted list of disjoint [start, end) pairs. The router
 * (src/route) and the context-parallel pieces (src/dist) fill it; the
 * attention backends (attn.c, attn_ref.c, attn_tiled.c) read it.
 *
 * A layout is one ctx allocation: this struct, then count[n], then
 * ranges[n][max_ranges][2], where n = B * Hkv * n_blocks, block index =
 * (b * Hkv + g) * n_blocks + qb. The functions on it are public
 * (include/dhsa.h, dhsa_layout_*; layout.c); tested by
 * tests/test_route*.c and tests/test_attn*.c.
 */
#ifndef DHSA_ATTN_LAYOUT_H
#define DHSA_ATTN_LAYOUT_H

#include "core/internal.h"

struct dhsa_layout {
    dhsa_ctx *ctx;
    int64_t B, Hkv, Lq, Lk, q_block, n_blocks, max_ranges;
    int64_t q_pos0;
    int causal;
    int64_t window;
    int64_t dense_blocks;
    int64_t chunks, chunk_min, chunk_max;
    double chunk_mean;
    int64_t *count;  /* [B*Hkv*n_blocks] */
    int64_t *ranges; /* [B*Hkv*n_blocks][max_ranges][2] */
};

static inline int64_t dhsa__layout_index(const dhsa_layout *l, int64_t b, int64_t g, int64_t qb) {
    return (b * l->Hkv + g) * l->n_blocks + qb;
}

/* Sorts n pairs in place and merges overlapping/adjacent ones; returns the
 * new count. Empty ranges are dropped. */
int64_t dhsa__ranges_normalise(int64_t *r, int64_t n);

#endif
