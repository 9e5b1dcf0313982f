/* params.c: the router's parameters: the defaults, the length-scaled
 * values every command uses (dhsa_router_params_for), the check every
 * routing call makes, and the sizes they imply (chunks, ranges). Contract
 * in include/dhsa.h; tested by tests/test_route*.c.
 */
#include "route/params.h"

#include <math.h>
#include <string.h>

dhsa_router_params dhsa_router_default_params(void) {
    dhsa_router_params r;
    memset(&r, 0, sizeof r);
    r.method = DHSA_ROUTE_DHSA;
    r.boundary = DHSA_BOUNDARY_SIMILARITY;
    r.chunk = 64;
    r.sim_window = 8;
    r.threshold = 1.0f;
    r.learned_threshold = 0.5f;
    r.nms_window = 8;
    r.min_chunk = 16;
    r.max_chunk = 256;
    r.q_block = 64;
    r.density = 0.0625;
    r.sink_tokens = 64;
    r.local_tokens = 256;
    r.dense_below = 2048;
    r.scale_fixed = 1;
    r.score_mode = DHSA_SCORE_MOMENTS;
    return r;
}

/* The length-scaled routing (dhsa.h, dhsa_router_scale; the choice and its
 * measurements in docs/dhsa.md, "One set of routing defaults"). n is
 * rounded to the nearest power of two first, so that a prompt of 4,078
 * tokens plus its answer and an evaluation at 4K get the same values. */
void dhsa_router_scale(dhsa_router_params *rp, int64_t n) {
    if (!rp) return;
    int64_t nb = 64;
    while (nb < ((int64_t)1 << 40) && (double)nb * 1.4142135623730951 < (double)n) nb *= 2;
    const int longer = nb > 8192, longest = nb > 16384;
    double budget = rp->budget_tokens > 0 ? (double)rp->budget_tokens : rp->density * (double)nb;
    int64_t local = (int64_t)(budget / 8.0 / 16.0 + 0.5) * 16;
#define SCALED(f, v) if (rp->f < 0) rp->f = (v)
    SCALED(q_block, longest ? 64 : longer ? 32 : 16);
    SCALED(sink_tokens, 4);
    SCALED(local_tokens, local < 16 ? 16 : local > 256 ? 256 : local);
    SCALED(dense_below, 0);
    SCALED(min_chunk, longer ? 16 : 8);
    SCALED(max_chunk, longer ? 64 : 32);
    SCALED(chunk, longer ? 32 : 16);
    SCALED(nms_window, longer ? 8 : 4);
    SCALED(score_rows, 4);
    SCALED(sink_window, 64);
#undef SCALED
    /* rest's rule (DHSA_REST_HYBRID) turns the summaries on in every model
     * from 32K: docs/dhsa.md, "The rest of the keys, summarised" */
    if (rp->rest == DHSA_REST_HYBRID && longest) rp->rest = DHSA_REST_LONG;
}

dhsa_router_params dhsa_router_params_for(int64_t n, double density) {
    dhsa_router_params rp = dhsa_router_default_params();
    rp.density = density;
    rp.score_mode = DHSA_SCORE_MOMENTS; /* ROWS measured and not taken: docs/dhsa.md */
    rp.carry = 0.1; /* docs/dhsa.md, "Chunks carried from one decode step to the next" */
    rp.exact_rows = 64; /* docs/dhsa.md, "The prompt's last rows ranked by their exact attention" */
    rp.rest = DHSA_REST_HYBRID; /* the global layers of hybrid models only: docs/dhsa.md, "The rest of the
                                   keys, summarised" */
    rp.hybrid_max_chunk = 16; /* docs/dhsa.md, "Finer chunks on hybrid models" */
    rp.sim_window = 8;
    rp.q_block = rp.sink_tokens = rp.local_tokens = rp.dense_below = -1;
    rp.min_chunk = rp.max_chunk = rp.chunk = rp.nms_window = rp.score_rows = rp.sink_window = -1;
    if (n > 0) dhsa_router_scale(&rp, n);
    return rp;
}

void dhsa__route_limits(const dhsa_router_params *rp, int64_t Lk, int64_t *min_len, int64_t *max_chunks,
                        int64_t *max_ranges) {
    *min_len = rp->boundary == DHSA_BOUNDARY_FIXED ? rp->chunk : rp->min_chunk;
    int64_t smallest = *min_len;
    /* SIMILARITY chunks are >= min_chunk, except that splitting a long span
     * evenly by max_chunk can give pieces down to max_chunk / 2. */
    if (rp->boundary == DHSA_BOUNDARY_SIMILARITY && rp->max_chunk / 2 < smallest)
        smallest = rp->max_chunk / 2 > 0 ? rp->max_chunk / 2 : 1;
    *max_chunks = Lk / smallest + 2;
    if (Lk < rp->dense_below) {
        *max_ranges = 1;
    } else {
        double budget = rp->budget_tokens > 0 ? (double)rp->budget_tokens : ceil(rp->density * (double)Lk);
        /* + sink (one range per picked sink), local, two clipped chunks, one overshoot */
        const int64_t picked = dhsa__sink_picked(rp) ? rp->sink_tokens : 0;
        double r = budget / (double)smallest + 5.0 + (double)picked;
        /* never more than every chunk, the sinks and the local keys */
        *max_ranges = r > (double)(*max_chunks + 2 + picked) ? *max_chunks + 2 + picked : (int64_t)r;
    }
}

dhsa_status dhsa__route_check_params(const dhsa_router_params *rp) {
    if (!rp) return dhsa__fail(DHSA_ERR_INVALID_ARG, "router params are NULL");
    if (rp->method != DHSA_ROUTE_DHSA && rp->method != DHSA_ROUTE_STREAM && rp->method != DHSA_ROUTE_ORACLE)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "unknown routing method %d", (int)rp->method);
    if (rp->boundary == DHSA_BOUNDARY_LEARNED && !rp->predictor)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "learned boundaries need a predictor (router params .predictor)");
    if (rp->boundary == DHSA_BOUNDARY_LEARNED && !(rp->learned_threshold >= 0.0f && rp->learned_threshold <= 1.0f))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "learned_threshold must be a probability in [0, 1]");
    if (rp->boundary != DHSA_BOUNDARY_FIXED && rp->boundary != DHSA_BOUNDARY_SIMILARITY &&
        rp->boundary != DHSA_BOUNDARY_LEARNED)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "unknown boundary method %d", (int)rp->boundary);
    if (rp->score_mode != DHSA_SCORE_POOLED && rp->score_mode != DHSA_SCORE_MOMENTS &&
        rp->score_mode != DHSA_SCORE_HEADS && rp->score_mode != DHSA_SCORE_BOUND &&
        rp->score_mode != DHSA_SCORE_ROWS)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "unknown chunk score %d", (int)rp->score_mode);
    if ((rp->score_mode == DHSA_SCORE_HEADS || rp->score_mode == DHSA_SCORE_BOUND ||
         rp->score_mode == DHSA_SCORE_ROWS) && rp->share_heads)
        return dhsa__fail(DHSA_ERR_INVALID_ARG,
                          "the %s chunk score weighs each query head against its own KV head's chunks: "
                          "it cannot share one routing over all heads (share_heads = 1)",
                          rp->score_mode == DHSA_SCORE_HEADS ? "HEADS" : rp->score_mode == DHSA_SCORE_BOUND ? "BOUND" : "ROWS");
    if (rp->sink_window < 0 || rp->sink_window > 4096)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "sink_window = %lld: use 0 (the first sink_tokens keys) .. 4096",
                          (long long)rp->sink_window);
    if (rp->score_rows < 0 || rp->score_rows > (1 << 20))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "score_rows = %lld: use 0 (every row) .. 2^20",
                          (long long)rp->score_rows);
    if (rp->q_block < 1 || rp->q_block > (1 << 20))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "q_block = %lld: use 1..2^20", (long long)rp->q_block);
    if (rp->chunk < 1 || rp->min_chunk < 1 || rp->max_chunk < rp->min_chunk || rp->sim_window < 1 ||
        rp->nms_window < 0 || rp->max_chunk > ((int64_t)1 << 40))
        return dhsa__fail(DHSA_ERR_INVALID_ARG,
                          "chunk sizes: need chunk >= 1, 1 <= min_chunk <= max_chunk, sim_window >= 1, "
                          "nms_window >= 0 (got chunk %lld, min %lld, max %lld, w %lld, nms %lld)",
                          (long long)rp->chunk, (long long)rp->min_chunk, (long long)rp->max_chunk,
                          (long long)rp->sim_window, (long long)rp->nms_window);
    if (!(rp->carry >= 0.0 && rp->carry <= 1.0))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "carry = %g: use a share of attention in [0, 1] (0: off)", rp->carry);
    if (rp->exact_rows < 0 || rp->exact_rows > DHSA_EXACT_ROWS_MAX)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "exact_rows = %lld: use 0 (off) to %d rows", (long long)rp->exact_rows,
                          DHSA_EXACT_ROWS_MAX);
    if (rp->rest < DHSA_REST_HYBRID || rp->rest > DHSA_REST_MAX)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "rest = %lld: use 0 (off), n in [1, %d] (summaries from layer n - 1) "
                          "or DHSA_REST_HYBRID (-1)",
                          (long long)rp->rest, DHSA_REST_MAX);
    if (rp->hybrid_max_chunk < 0 || rp->hybrid_max_chunk > ((int64_t)1 << 40))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "hybrid_max_chunk = %lld: use 0 (off) .. 2^40 keys",
                          (long long)rp->hybrid_max_chunk);
    if (!isfinite(rp->threshold))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "threshold must be finite");
    if (rp->budget_tokens < 0 || rp->sink_tokens < 0 || rp->local_tokens < 0 || rp->dense_below < 0)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "budget, sink, local and dense_below must be >= 0");
    if (rp->budget_tokens == 0 && !(rp->density > 0.0 && rp->density <= 1.0))
        return dhsa__fail(DHSA_ERR_INVALID_ARG,
                          "density = %g: give budget_tokens > 0 or a density in (0, 1]", rp->density);
    return DHSA_OK;
}

int dhsa__sink_picked(const dhsa_router_params *rp) { return rp->sink_window > rp->sink_tokens; }
