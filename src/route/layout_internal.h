/* layout_internal.h: the layout object, shared by the router (route.c),
 * the baselines and the attention kernels. A layout is one ctx allocation:
 * this struct, then count[n], then ranges[n][max_ranges][2], where
 * n = B * Hkv * n_blocks, block index = (b * Hkv + g) * n_blocks + qb.
 */
#ifndef DHSA_LAYOUT_INTERNAL_H
#define DHSA_LAYOUT_INTERNAL_H

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

/* Shared by route.c and kv_index.c. */
/* ROWS chunk scores (dhsa.h, DHSA_SCORE_ROWS) of the block of rows [r0, r1)
 * for query heads [h0, h1) against chunks [c0, c1): kmean + c * ldk is
 * chunk c's mean key (d floats), starts[] the chunk starts. out[(c - c0) *
 * out_stride] = log of the sum over the scored rows and heads of the share
 * of that row's estimated attention one key of chunk c holds. Scratch: qt
 * [d][64] floats, S [c1 - c0][64] floats, acc [c1 - c0] doubles. Used by
 * dhsa_route and the decode index alike, so both score the same. */
void dhsa__rows_scores(const dhsa_attn_desc *a, int64_t b, int64_t h0, int64_t h1, int64_t r0, int64_t r1,
                       const dhsa_router_params *rp, float scale, const float *kmean, int64_t ldk,
                       const int64_t *starts, int64_t c0, int64_t c1, float *qt, float *S, double *acc, float *out,
                       int64_t out_stride);
void dhsa__block_span(const dhsa_attn_desc *a, int64_t Lk, int64_t r0, int64_t r1, int64_t *lo, int64_t *hi);
dhsa_status dhsa__route_check_params(const dhsa_router_params *rp);
void dhsa__route_limits(const dhsa_router_params *rp, int64_t Lk, int64_t *min_len, int64_t *max_chunks,
                        int64_t *max_ranges);
/* The sinks and local keys (before the diagonal) a block with this budget
 * reads: rp's counts, capped at budget / 8 and budget / 4 when
 * rp->scale_fixed. */
void dhsa__route_fixed_parts(const dhsa_router_params *rp, int64_t budget, int64_t *sink, int64_t *local);
/* Sinks where the model puts them (dhsa.h, sink_window): 1 when rp picks
 * them (sink_window > sink_tokens). */
int dhsa__sink_picked(const dhsa_router_params *rp);
/* The candidate sinks of a block, best first (route.c); scratch buf of 2 d
 * + sink_window floats, rank room for sink_window. */
int64_t dhsa__rank_sinks(const dhsa_router_params *rp, const dhsa_attn_desc *a, int64_t b, int64_t g, int64_t h0,
                         int64_t h1, int64_t r0, int64_t r1, int64_t alo, int64_t ahi, const float *kr, int64_t ldk,
                         float *buf, int64_t *rank);
/* sink_rank: NULL for the first sink keys, or dhsa__rank_sinks' n_rank
 * positions, of which the best-ranked sink count are read. causal: STREAM
 * then always reads the block's own rows (the diagonal), even past its
 * budget. */
int64_t dhsa__select_ranges(const dhsa_router_params *rp, int64_t max_ranges, int64_t min_len, int64_t Lk,
                            int64_t alo, int64_t ahi, int64_t pos0, int64_t pos1, const int64_t *starts,
                            int64_t nc_all, const float *score, int64_t stride, int64_t tail_lo,
                            const unsigned char *allowed, const int64_t *sink_rank, int64_t n_rank, int causal,
                            int64_t *order, int64_t *rg, int *dense);

/* LEARNED boundaries in their online form (kv_index.c), the rule the
 * decode index applies as keys arrive, run here over a whole sequence:
 * p [Lk] are dhsa_predictor_score's probabilities; the candidate at t is
 * judged once the scores up to t + nms_window are final (the key t +
 * nms_window + w - 1 has arrived). The keys after the last closed chunk,
 * which the index would still hold open, are split evenly into pieces of
 * at most max_chunk. Writes starts[0 .. n] (starts[n] = Lk; room for
 * Lk / min_chunk + 2 chunks) and returns n, or -1 with *err set. */
int64_t dhsa__learned_online_starts(const dhsa_router_params *rp, const float *p, int64_t Lk, int64_t *starts,
                                    dhsa_status *err);

#endif
