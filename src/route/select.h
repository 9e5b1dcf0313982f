/* select.h: selection (select.c), shared by prefill routing (route.c) and
 * the decode index (kv_index.c): per query block, the keys it may see,
 * its sinks and local keys, then chunks in score order within its budget;
 * and the ROWS chunk score.
 */
#ifndef DHSA_ROUTE_SELECT_H
#define DHSA_ROUTE_SELECT_H

#include <math.h>

#include "core/internal.h"

/* Columns of one qk tile (attn/kern.h): the query blocks, or ROWS' scored
 * rows, scored together. */
#define DHSA__SCORE_COLS 64

/* The variance term of a MOMENTS or HEADS estimate of a chunk of n keys
 * (dhsa__var_term_l: with ln 2n computed once per chunk):
 * v = s^2/2 q^2 . var(k), the Gaussian correction log E exp(X) - E X of
 * the keys' scaled scores X, capped at 2 sqrt(v ln 2n) = sigma sqrt(2 ln
 * 2n), about the largest of 2n Gaussian draws above their mean: a
 * chunk's mean of exp(X) over its n keys never exceeds its largest, and
 * keys that spread widely along a few dimensions would otherwise outrank
 * the chunk the query reads (SmolLM2's layer 18: v = 67, an estimate 54
 * nats above the chunk's best key; docs/dhsa.md, "The variance term,
 * capped"). */
static inline double dhsa__var_term_l(double v, double ln2n) {
    /* v <= 2 sqrt(v ln 2n) exactly when v <= 4 ln 2n: the square root
     * only where the cap binds (a few % of chunk scores) */
    return v <= 4.0 * ln2n ? v : 2.0 * sqrt(v * ln2n);
}
static inline double dhsa__var_term(double v, int64_t n) {
    return n < 1 ? v : dhsa__var_term_l(v, log(2.0 * (double)n));
}

/* Keys the rows [r0, r1) may attend to, together: [*lo, *hi) within [0, Lk). */
void dhsa__block_span(const dhsa_attn_desc *a, int64_t Lk, int64_t r0, int64_t r1, int64_t *lo, int64_t *hi);
/* The sinks and local keys (before the diagonal) a block with this budget
 * reads: rp's counts, capped at budget / 8 and budget / 4 when
 * rp->scale_fixed. */
void dhsa__route_fixed_parts(const dhsa_router_params *rp, int64_t budget, int64_t *sink, int64_t *local);
/* The candidate sinks of a block, best first; scratch buf of 2 d +
 * sink_window floats, rank room for sink_window. */
int64_t dhsa__rank_sinks(const dhsa_router_params *rp, const dhsa_attn_desc *a, int64_t b, int64_t g, int64_t h0,
                         int64_t h1, int64_t r0, int64_t r1, int64_t alo, int64_t ahi, const float *kr, int64_t ldk,
                         float *buf, int64_t *rank);
/* One block's ranges (select.c says how). sink_rank: NULL for the first
 * sink keys, or dhsa__rank_sinks' n_rank positions, of which the
 * best-ranked sink count are read. causal: STREAM then always reads the
 * block's own rows (the diagonal), even past its budget. */
int64_t dhsa__select_ranges(const dhsa_router_params *rp, int64_t max_ranges, int64_t min_len, int64_t Lk,
                            int64_t alo, int64_t ahi, int64_t pos0, int64_t pos1, const int64_t *starts,
                            int64_t nc_all, const float *score, int64_t stride, int64_t tail_lo,
                            const unsigned char *allowed, const int64_t *sink_rank, int64_t n_rank, int causal,
                            int64_t *order, int64_t *rg, int *dense);
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

#endif
