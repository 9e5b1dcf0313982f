/* boundaries.h: chunking (boundaries.c): where the keys are cut into
 * chunks, for a whole sequence (prefill routing, route.c) and online as
 * keys arrive (the decode index, kv_index.c), by one rule.
 */
#ifndef DHSA_ROUTE_BOUNDARIES_H
#define DHSA_ROUTE_BOUNDARIES_H

#include "attn/attn_internal.h"

/* Chunk starts of batch b of the keys a->k (p: the checked problem):
 * starts[0] = 0 < starts[1] < ... < starts[n] = Lk. score: [Lk] floats of
 * scratch (the boundary scores); part: SIMILARITY with several KV heads,
 * [Hkv][Lk] more. Returns n (the chunk count) or -1 with *err set. */
int64_t dhsa__boundaries(dhsa_ctx *ctx, const dhsa_router_params *rp, const dhsa_attn_desc *a,
                         const dhsa__attn_problem *p, int64_t b, float *score, float *part, int64_t *starts,
                         dhsa_status *err);

/* The online boundary rule's state (the decode index's, and
 * dhsa__learned_online_starts'): the last 2 nms_window + 1 scores and,
 * for SIMILARITY, their running mean and variance. */
typedef struct {
    const dhsa_router_params *rp;
    int learned;
    float *score; /* [2 * nms_window + 1] ring of scores, candidate s at s % size */
    int64_t score_size;
    double s_n, s_mean, s_m2; /* running score statistics (Welford) */
} dhsa__decider;

/* Records the final score of candidate s (s >= 1) into the ring and the
 * running statistics. */
void dhsa__decider_record(dhsa__decider *dc, int64_t s, float score);
/* The online rule (include/dhsa.h, dhsa_kv_index): the score of candidate
 * s (s >= 1; s = 0 has none) has just become final; open is the start of
 * the open chunk. Returns where to close it (a boundary, or the max_chunk
 * cut), or -1. */
int64_t dhsa__decide(dhsa__decider *dc, int64_t open, int64_t s, float score);

/* LEARNED boundaries in their online form, the rule the decode index
 * applies as keys arrive, run here over a whole sequence: p [Lk] are
 * dhsa_predictor_score's probabilities; the candidate at t is judged once
 * the scores up to t + nms_window are final (the key t + nms_window + w - 1
 * has arrived). The keys after the last closed chunk, which the index
 * would still hold open, are split evenly into pieces of at most
 * max_chunk. Writes starts[0 .. n] (starts[n] = Lk; room for Lk /
 * min_chunk + 2 chunks) and returns n, or -1 with *err set. */
int64_t dhsa__learned_online_starts(const dhsa_router_params *rp, const float *p, int64_t Lk, int64_t *starts,
                                    dhsa_status *err);

#endif
