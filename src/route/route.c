/* route.c: DHSA routing for prefill (DESIGN.md section 5) and the
 * streaming and oracle baselines, all producing a dhsa_layout.
 *
 * Per batch: (1) key chunk boundaries, shared by all KV heads (FIXED, or
 * SIMILARITY from the change of the mean key across a candidate, or
 * LEARNED from the predictor's probabilities, then NMS, min_chunk,
 * max_chunk; LEARNED with causal_boundaries runs the decode index's online
 * rule instead, kv_index.c); (2) pooling of each chunk's keys per KV head and
 * of each query block's queries (rows of the block, averaged over the query
 * heads of the group): POOLED, sum / sqrt(n); MOMENTS (default), the key
 * mean and per-dimension variance against the scaled mean query and half
 * the squared scale times the mean squared query (rp->score_mode,
 * include/dhsa.h); (3) chunk scores S[qb, c] = q~ . k~ with the tiled
 * attention's own qk micro-kernel (width d or 2d), 64 query blocks at a
 * time; (4) per block a token budget filled by sinks, the local
 * diagonal, then chunks in score order, never overwriting anything already
 * selected, merged into sorted disjoint ranges.
 *
 * Cost: O(L d Hkv) for boundaries and pooling, O((L / q_block) x chunks x d)
 * for the scores, O(chunks) per block for the selection (a heap: O(chunks)
 * to build, O(log chunks) per chunk taken). The
 * oracle baseline replaces the scores by the true attention mass of each
 * chunk, which costs two dense QK passes: evaluation only.
 *
 * Not looked at: key_mask, key_bias and attn_mask (routing sees raw q.k).
 * Tested by tests/test_route.c.
 */
#include "route/layout_internal.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "attn/attn_internal.h"
#include "attn/kern.h"

#define GROUP 64 /* query blocks scored together: one Qt tile of the qk kernel */

/* Row l of head h, batch b of a typed view as d floats: in place when the
 * view is F32 with unit dim stride, else converted into buf (exact: every
 * type widens to F32 without rounding). The loops below then read plain
 * floats; the values, and so every sum, are those of dhsa__load. */
static const float *row_f32(const dhsa_tensor *t, int64_t b, int64_t h, int64_t l, int64_t d, float *buf) {
    const void *row = dhsa__at(t, b, h, l);
    if (t->type == DHSA_F32 && t->stride[3] == 1) return row;
    for (int64_t x = 0; x < d; x++) buf[x] = dhsa__load(row, t->type, x * t->stride[3]);
    return buf;
}

/* sum[x] += q[x] and, with sq, sq[x] += q[x] * q[x], for x < d. Blocks of
 * 16 with a fixed trip count let -O2 vectorize it (no FMA: the build's
 * flags have none, and C11 mode does not contract), and every element
 * gets the same float operations in the same order as a plain loop. */
static void add_row(float *restrict sum, float *restrict sq, const float *restrict q, int64_t d) {
    int64_t x = 0;
    for (; x + 16 <= d; x += 16) {
        for (int k = 0; k < 16; k++) sum[x + k] += q[x + k];
        if (sq)
            for (int k = 0; k < 16; k++) sq[x + k] += q[x + k] * q[x + k];
    }
    for (; x < d; x++) {
        sum[x] += q[x];
        if (sq) sq[x] += q[x] * q[x];
    }
}

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
}

dhsa_router_params dhsa_router_params_for(int64_t n, double density) {
    dhsa_router_params rp = dhsa_router_default_params();
    rp.density = density;
    rp.score_mode = DHSA_SCORE_MOMENTS; /* ROWS measured and not taken: docs/dhsa.md */
    rp.sim_window = 8;
    rp.q_block = rp.sink_tokens = rp.local_tokens = rp.dense_below = -1;
    rp.min_chunk = rp.max_chunk = rp.chunk = rp.nms_window = rp.score_rows = rp.sink_window = -1;
    if (n > 0) dhsa_router_scale(&rp, n);
    return rp;
}

/* ------------------------------------------------------------ checking --- */

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

typedef struct {
    dhsa__attn_problem p;
    int64_t n_qb;        /* query blocks per (b, g) */
    int64_t max_chunks;  /* chunks per batch, at most */
    int64_t max_ranges;  /* per block */
    int64_t min_len;     /* shortest chunk boundaries can make */
    int64_t dk;          /* floats per pooled key: d (POOLED) or 2d (MOMENTS, HEADS, BOUND) */
    int per_head;        /* HEADS or BOUND: a per-thread sum [nc][64] */
    int similarity;      /* SIMILARITY boundaries: per-head score rows */
    int sinks;           /* sinks picked per block (dhsa__sink_picked) */
    int64_t sink_window;
} plan;

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
    if (!isfinite(rp->threshold))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "threshold must be finite");
    if (rp->budget_tokens < 0 || rp->sink_tokens < 0 || rp->local_tokens < 0 || rp->dense_below < 0)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "budget, sink, local and dense_below must be >= 0");
    if (rp->budget_tokens == 0 && !(rp->density > 0.0 && rp->density <= 1.0))
        return dhsa__fail(DHSA_ERR_INVALID_ARG,
                          "density = %g: give budget_tokens > 0 or a density in (0, 1]", rp->density);
    return DHSA_OK;
}

static dhsa_status check(const dhsa_router_params *rp, const dhsa_attn_desc *a, plan *pl) {
    if (!rp || !a) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_route: NULL params or descriptor");
    if (a->k_pos0)
        return dhsa__fail(DHSA_ERR_UNSUPPORTED, "dhsa_route: keys from k_pos0 = %lld (a window ring) are not routed; "
                          "route over keys from position 0", (long long)a->k_pos0);
    dhsa_status st = dhsa__route_check_params(rp);
    if (st) return st;
    /* The attention check wants v and o: route needs only q and k. */
    dhsa_attn_desc d = *a;
    d.v = a->k;
    d.o = a->q;
    d.o.shape[3] = a->k.shape[3];
    d.lse.data = NULL;
    d.layout = NULL;
    st = dhsa__attn_check(&d, &pl->p);
    if (st) return st;
    const dhsa__attn_problem *p = &pl->p;
    if (p->Lq < 1) return dhsa__fail(DHSA_ERR_SHAPE, "dhsa_route needs at least one query row");
    pl->n_qb = (p->Lq + rp->q_block - 1) / rp->q_block;
    pl->dk = rp->score_mode == DHSA_SCORE_POOLED ? p->d : 2 * p->d;
    pl->per_head = rp->score_mode == DHSA_SCORE_HEADS || rp->score_mode == DHSA_SCORE_BOUND ||
                   rp->score_mode == DHSA_SCORE_ROWS;
    pl->similarity = rp->boundary == DHSA_BOUNDARY_SIMILARITY;
    pl->sinks = dhsa__sink_picked(rp);
    pl->sink_window = rp->sink_window;
    dhsa__route_limits(rp, p->Lk, &pl->min_len, &pl->max_chunks, &pl->max_ranges);
    return DHSA_OK;
}

/* The boundary scores: [Lk] floats, then with SIMILARITY and several KV
 * heads one row [Lk] per head (similarity_scores). */
static size_t scores_head_bytes(const dhsa__attn_problem *p) {
    return dhsa__align_up((size_t)p->Lk * sizeof(float) + 64, 64);
}
static size_t scores_bytes(const plan *pl) {
    size_t parts = pl->similarity && pl->p.Hkv > 1 ? (size_t)pl->p.Hkv * (size_t)pl->p.Lk : 0;
    return scores_head_bytes(&pl->p) + dhsa__align_up(parts * sizeof(float), 64);
}

/* Picked sinks (dhsa__rank_sinks): the scratch floats and the ranking. */
static size_t sinks_bytes(const plan *pl) {
    if (!pl->sinks) return 0;
    return dhsa__align_up((size_t)(2 * pl->p.d + pl->sink_window) * sizeof(float), 64) +
           dhsa__align_up((size_t)pl->sink_window * sizeof(int64_t), 64);
}

/* Workspace, in bytes, laid out by carve(). */
typedef struct {
    size_t scores, starts, kp, pool, per_thread, total;
} ws_plan;

static ws_plan workspace(const dhsa_ctx *ctx, const plan *pl) {
    const dhsa__attn_problem *p = &pl->p;
    ws_plan w;
    size_t nt = (size_t)dhsa_ctx_n_threads(ctx);
    size_t nc = (size_t)pl->max_chunks;
    w.scores = scores_bytes(pl);
    w.starts = dhsa__align_up((nc + 1) * sizeof(int64_t), 64);
    w.kp = dhsa__align_up((size_t)p->Hkv * nc * (size_t)pl->dk * sizeof(float), 64);
    /* per thread: Qt [dk][64], S [nc][64], the HEADS/BOUND sum [nc][64],
     * candidate order [nc], one block's scores [nc], ranges, the oracle's score tile [BC][64] and
     * keys [BC][d] */
    w.per_thread = dhsa__align_up((size_t)(pl->dk > p->d ? pl->dk : p->d) * GROUP * sizeof(float), 64) +
                   dhsa__align_up(nc * GROUP * sizeof(float), 64) +
                   (pl->per_head ? dhsa__align_up(nc * GROUP * sizeof(float), 64) : 0) +
                   dhsa__align_up(nc * sizeof(int64_t), 64) + dhsa__align_up(nc * sizeof(float), 64) +
                   dhsa__align_up((size_t)(pl->max_ranges + 8) * 2 * sizeof(int64_t), 64) +
                   dhsa__align_up((size_t)DHSA_BC * GROUP * sizeof(float), 64) +
                   dhsa__align_up((size_t)DHSA_BC * (size_t)p->d * sizeof(float), 64) +
                   sinks_bytes(pl);
    /* pooling: [Hkv][2d] doubles, then a row buffer [Hkv][d] (floats in double slots) */
    w.pool = dhsa__align_up((size_t)p->Hkv * 3 * (size_t)p->d * sizeof(double), 64);
    w.total = w.scores + w.starts + w.kp + w.pool + nt * w.per_thread;
    return w;
}

dhsa_status dhsa_route_sizes(const dhsa_ctx *ctx, const dhsa_router_params *rp, const dhsa_attn_desc *a,
                             size_t *layout_bytes, size_t *workspace_bytes) {
    if (!ctx) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_route_sizes: ctx is NULL");
    plan pl;
    dhsa_status st = check(rp, a, &pl);
    if (st) return st;
    size_t lb;
    st = dhsa_layout_size(pl.p.B, pl.p.Hkv, pl.p.Lq, pl.p.Lk, rp->q_block, pl.max_ranges, &lb);
    if (st) return st;
    if (layout_bytes) *layout_bytes = lb;
    if (workspace_bytes) *workspace_bytes = workspace(ctx, &pl).total;
    return DHSA_OK;
}

/* ---------------------------------------------------------- boundaries --- */

/* Cosine of two d-vectors given as double sums (scale does not matter). */
static double cosine(const double *x, const double *y, int64_t d) {
    double xy = 0, xx = 0, yy = 0;
    for (int64_t c = 0; c < d; c++) {
        xy += x[c] * y[c];
        xx += x[c] * x[c];
        yy += y[c] * y[c];
    }
    return xx > 0 && yy > 0 ? xy / sqrt(xx * yy) : 1.0;
}

/* The sliding sums' steps, in blocks of 16 as add_row: L[c] += x[c] and
 * R[c] -= x[c] (R may be NULL), or L[c] += sign * x[c] for sign +-1, in
 * double. */
static void slide_row(double *restrict L, double *restrict R, const float *restrict x, int64_t d) {
    int64_t c = 0;
    for (; c + 16 <= d; c += 16)
        for (int k = 0; k < 16; k++) {
            double v = x[c + k];
            L[c + k] += v;
            R[c + k] -= v;
        }
    for (; c < d; c++) {
        double v = x[c];
        L[c] += v;
        R[c] -= v;
    }
}
static void add_row_d(double *restrict L, const float *restrict x, int64_t d, int sub) {
    int64_t c = 0;
    if (sub) {
        for (; c + 16 <= d; c += 16)
            for (int k = 0; k < 16; k++) L[c + k] -= x[c + k];
        for (; c < d; c++) L[c] -= x[c];
    } else {
        for (; c + 16 <= d; c += 16)
            for (int k = 0; k < 16; k++) L[c + k] += x[c + k];
        for (; c < d; c++) L[c] += x[c];
    }
}

/* v[c] += (x[c] - m[c])^2 in double, blocks of 16 as add_row. */
static void add_dev2(double *restrict v, const double *restrict m, const float *restrict x, int64_t d) {
    int64_t c = 0;
    for (; c + 16 <= d; c += 16)
        for (int k = 0; k < 16; k++) {
            double u = x[c + k] - m[c + k];
            v[c + k] += u * u;
        }
    for (; c < d; c++) {
        double u = x[c] - m[c];
        v[c] += u * u;
    }
}

typedef struct {
    const dhsa_router_params *rp;
    const dhsa_attn_desc *a;
    const dhsa__attn_problem *p;
    int64_t b;
    float *out; /* [Hkv][Lk], or [Lk] with one KV head */
    double *buf; /* [Hkv][3d]: L, R, a row */
} sim_job;

/* out[g][t] = (1 - cos(L, R)) / Hkv for KV head g (out[g][0] = 0). */
static void similarity_head(void *arg, int64_t g, int thread) {
    (void)thread;
    const sim_job *j = arg;
    const dhsa_router_params *rp = j->rp;
    const dhsa_attn_desc *a = j->a;
    const int64_t Lk = j->p->Lk, d = j->p->d, w = rp->sim_window, b = j->b;
    double *L = j->buf + g * 3 * d, *R = L + d;
    float *rowbuf = (float *)(R + d), *out = j->out + g * Lk;
    memset(L, 0, (size_t)(2 * d) * sizeof(double));
    out[0] = 0.0f;
    /* L = sum k[t-w, t), R = sum k[t, t+w) (or k[t]) as t slides */
    for (int64_t k = 0; k < w && k < Lk; k++)
        if (!rp->causal_boundaries || k == 0) add_row_d(R, row_f32(&a->k, b, g, k, d, rowbuf), d, 0);
    for (int64_t t = 1; t < Lk; t++) {
        slide_row(L, R, row_f32(&a->k, b, g, t - 1, d, rowbuf), d); /* leaves R, enters L */
        if (t - 1 - w >= 0) add_row_d(L, row_f32(&a->k, b, g, t - 1 - w, d, rowbuf), d, 1);
        int64_t enter = rp->causal_boundaries ? t : t + w - 1;
        if (enter < Lk && (rp->causal_boundaries || enter >= w))
            add_row_d(R, row_f32(&a->k, b, g, enter, d, rowbuf), d, 0);
        out[t] = (float)((1.0 - cosine(L, R, d)) / (double)j->p->Hkv);
    }
}

/* score[t], t in [1, Lk): how much the keys change between t-1 and t:
 * mean over KV heads of 1 - cos(mean of k[t-w, t), mean of k[t, t+w)) (the
 * right window is k[t] alone when causal). score[0] = 0. Sliding sums in
 * double keep this O(Lk d Hkv); the KV heads run in parallel, each into
 * its own row of part (scores_bytes), and add up in head order, so
 * score is the same float sum as a loop over the heads. */
static dhsa_status similarity_scores(dhsa_ctx *ctx, const dhsa_router_params *rp, const dhsa_attn_desc *a,
                                     const dhsa__attn_problem *p, int64_t b, float *score, float *part) {
    const int64_t Lk = p->Lk, d = p->d;
    double *buf = calloc((size_t)(3 * d * p->Hkv), sizeof(double));
    if (!buf) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory in the boundary scorer");
    sim_job j = {rp, a, p, b, p->Hkv > 1 ? part : score, buf};
    dhsa_parallel_for(ctx, p->Hkv, similarity_head, &j);
    if (p->Hkv > 1) {
        for (int64_t t = 0; t < Lk; t++) {
            float s = 0.0f;
            for (int64_t g = 0; g < p->Hkv; g++) s += part[g * Lk + t];
            score[t] = s;
        }
    }
    free(buf);
    return DHSA_OK;
}

typedef struct {
    float s;
    int64_t t;
} cand;

static int cmp_cand_desc(const void *x, const void *y) {
    const cand *a = x, *b = y;
    if (a->s != b->s) return a->s > b->s ? -1 : 1;
    return a->t < b->t ? -1 : a->t > b->t; /* ties: earlier first, deterministic */
}

/* Chunk starts of batch b: starts[0] = 0 < starts[1] < ... < starts[n] = Lk.
 * Returns n (the chunk count) or -1 (last error set). */
static int64_t boundaries(dhsa_ctx *ctx, const dhsa_router_params *rp, const dhsa_attn_desc *a,
                          const plan *pl, int64_t b, float *score, int64_t *starts, dhsa_status *err) {
    *err = DHSA_OK;
    const int64_t Lk = pl->p.Lk;
    int64_t n = 0;
    if (Lk == 0) {
        starts[0] = 0;
        return 0;
    }
    if (rp->boundary == DHSA_BOUNDARY_FIXED) {
        for (int64_t s = 0; s < Lk; s += rp->chunk) starts[n++] = s;
        starts[n] = Lk;
        return n;
    }
    double cut;
    if (rp->boundary == DHSA_BOUNDARY_LEARNED) {
        if ((*err = dhsa_predictor_score(ctx, rp->predictor, &a->k, b, score))) return -1;
        /* streaming: the decode index's online rule, so that a session
         * (which routes through the index) and this call cut alike */
        if (rp->causal_boundaries) return dhsa__learned_online_starts(rp, score, Lk, starts, err);
        /* candidates: local maxima of the boundary probability >= threshold */
        cut = rp->learned_threshold;
    } else {
        if ((*err = similarity_scores(ctx, rp, a, &pl->p, b, score,
                                      (float *)((char *)score + scores_head_bytes(&pl->p)))))
            return -1;
        /* candidates: local maxima at or above mean + threshold * std */
        double mean = 0, var = 0;
        for (int64_t t = 1; t < Lk; t++) mean += score[t];
        mean /= (double)(Lk > 1 ? Lk - 1 : 1);
        for (int64_t t = 1; t < Lk; t++) var += (score[t] - mean) * (score[t] - mean);
        cut = mean + rp->threshold * sqrt(var / (double)(Lk > 1 ? Lk - 1 : 1));
    }
    cand *c = malloc((size_t)Lk * sizeof(cand));
    int64_t *kept = malloc((size_t)(Lk + 2) * sizeof(int64_t));
    if (!c || !kept) {
        free(c);
        free(kept);
        *err = dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory in NMS");
        return -1;
    }
    int64_t nc = 0;
    for (int64_t t = 1; t < Lk; t++) {
        float s = score[t];
        if (s < cut) continue;
        if ((t > 1 && score[t - 1] > s) || (t + 1 < Lk && score[t + 1] > s)) continue;
        c[nc].s = s;
        c[nc].t = t;
        nc++;
    }
    qsort(c, (size_t)nc, sizeof *c, cmp_cand_desc);
    /* NMS in score order: keep t if it is more than nms_window from every
     * kept boundary and at least min_chunk from every kept boundary and from
     * both ends. kept[] stays sorted (insertion). */
    int64_t nk = 0, gap = rp->nms_window + 1 > rp->min_chunk ? rp->nms_window + 1 : rp->min_chunk;
    for (int64_t i = 0; i < nc; i++) {
        int64_t t = c[i].t;
        if (t < rp->min_chunk || Lk - t < rp->min_chunk) continue;
        int64_t lo = 0, hi = nk; /* first kept >= t */
        while (lo < hi) {
            int64_t mid = (lo + hi) / 2;
            if (kept[mid] < t) lo = mid + 1;
            else hi = mid;
        }
        if (lo < nk && kept[lo] - t < gap) continue;
        if (lo > 0 && t - kept[lo - 1] < gap) continue;
        memmove(kept + lo + 1, kept + lo, (size_t)(nk - lo) * sizeof(int64_t));
        kept[lo] = t;
        nk++;
    }
    free(c);
    /* chunks, with spans longer than max_chunk split evenly */
    int64_t prev = 0;
    for (int64_t i = 0; i <= nk; i++) {
        int64_t end = i < nk ? kept[i] : Lk;
        int64_t len = end - prev, parts = (len + rp->max_chunk - 1) / rp->max_chunk;
        for (int64_t k = 0; k < parts; k++) starts[n++] = prev + len * k / parts;
        prev = end;
    }
    starts[n] = Lk;
    free(kept);
    return n;
}

/* ------------------------------------------------------------- pooling --- */

typedef struct {
    const dhsa_router_params *rp;
    const dhsa_attn_desc *a;
    const plan *pl;
    int64_t b, nc;
    const int64_t *starts;
    float *kp;       /* [Hkv or 1][nc][dk] */
    double *scratch; /* [Hkv][2d] (MOMENTS) */
} pool_job;

/* kp[g][c] = sum of the chunk's keys / sqrt(len) (KV head g, or the mean
 * over KV heads when heads are shared); MOMENTS: kp[g][c] = [mean key (d),
 * per-dimension variance of the keys about that mean (d)], both averaged
 * over KV heads when shared, so that a shared score is the mean of the
 * per-head scores. The variance is a second pass over the keys in double
 * (no cancellation), with scratch[g] [2d] doubles. */
static void pool_keys_task(void *arg, int64_t g, int thread) {
    (void)thread;
    const pool_job *j = arg;
    const dhsa__attn_problem *p = &j->pl->p;
    const dhsa_tensor *K = &j->a->k;
    const int64_t d = p->d, dk = j->pl->dk;
    int shared = j->rp->share_heads;
    int64_t h0 = shared ? 0 : g, h1 = shared ? p->Hkv : g + 1;
    float *rowbuf = (float *)(j->scratch + p->Hkv * 2 * d + g * d);
    for (int64_t c = 0; c < j->nc; c++) {
        float *out = j->kp + (g * j->nc + c) * dk;
        int64_t s = j->starts[c], e = j->starts[c + 1];
        for (int64_t x = 0; x < dk; x++) out[x] = 0.0f;
        if (j->rp->score_mode == DHSA_SCORE_BOUND) { /* [max (d), min (d)] of the keys (never shared) */
            for (int64_t x = 0; x < d; x++) {
                out[x] = -INFINITY;
                out[d + x] = INFINITY;
            }
            for (int64_t t = s; t < e; t++) {
                const float *k = row_f32(K, j->b, g, t, d, rowbuf);
                for (int64_t x = 0; x < d; x++) {
                    float v = k[x];
                    out[x] = v > out[x] ? v : out[x];
                    out[d + x] = v < out[d + x] ? v : out[d + x];
                }
            }
            continue;
        }
        if (j->rp->score_mode != DHSA_SCORE_POOLED) {
            double *m = j->scratch + g * 2 * d, *v = m + d, len = (double)(e - s), heads = (double)(h1 - h0);
            for (int64_t h = h0; h < h1; h++) {
                for (int64_t x = 0; x < 2 * d; x++) m[x] = 0.0;
                for (int64_t t = s; t < e; t++) add_row_d(m, row_f32(K, j->b, h, t, d, rowbuf), d, 0);
                for (int64_t x = 0; x < d; x++) m[x] /= len;
                for (int64_t t = s; t < e; t++) add_dev2(v, m, row_f32(K, j->b, h, t, d, rowbuf), d);
                for (int64_t x = 0; x < d; x++) {
                    out[x] += (float)(m[x] / heads);
                    out[d + x] += (float)(v[x] / (len * heads));
                }
            }
            continue;
        }
        for (int64_t h = h0; h < h1; h++)
            for (int64_t t = s; t < e; t++) {
                const float *k = row_f32(K, j->b, h, t, d, rowbuf);
                for (int64_t x = 0; x < d; x++) out[x] += k[x];
            }
        float norm = (float)(1.0 / (sqrt((double)(e - s)) * (double)(h1 - h0)));
        for (int64_t x = 0; x < d; x++) out[x] *= norm;
    }
}

/* ----------------------------------------------------------- selection --- */

/* Size of [s, e) minus the parts in the two intervals A and B. */
static int64_t uncovered(int64_t s, int64_t e, int64_t a0, int64_t a1, int64_t b0, int64_t b1) {
    if (e <= s) return 0;
    int64_t n = e - s;
    int64_t ia0 = s > a0 ? s : a0, ia1 = e < a1 ? e : a1;
    int64_t ib0 = s > b0 ? s : b0, ib1 = e < b1 ? e : b1;
    int64_t ia = ia1 > ia0 ? ia1 - ia0 : 0, ib = ib1 > ib0 ? ib1 - ib0 : 0;
    int64_t i0 = ia0 > ib0 ? ia0 : ib0, i1 = ia1 < ib1 ? ia1 : ib1;
    int64_t iab = (ia && ib && i1 > i0) ? i1 - i0 : 0;
    return n - ia - ib + iab;
}

/* Picked sinks in [s, e) outside the local keys [l0, l1). */
static int64_t picked_in(const int64_t *picked, int64_t n, int64_t s, int64_t e, int64_t l0, int64_t l1) {
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++) c += picked[i] >= s && picked[i] < e && (picked[i] < l0 || picked[i] >= l1);
    return c;
}

/* Ranking of chunks by score, descending; ties go to the lower index, so
 * the order (and the layout) is deterministic. */
typedef struct {
    const float *s;
    int64_t stride;
} scores;

static int before(scores sc, int64_t a, int64_t b) {
    float sa = sc.s[a * sc.stride], sb = sc.s[b * sc.stride];
    return sa != sb ? sa > sb : a < b;
}

/* The candidates in rank order, lazily: a binary max-heap by `before` in
 * idx[0, m). Ranking all candidates (or a generous top slice, as before)
 * cost most of the routing once chunks got short (1095 chunks at 32K
 * with 16-row blocks: a block consumes a few dozen); building the heap is
 * O(n) and each candidate consumed O(log n). `before` is a strict total
 * order (ties by index), so the candidates come out in exactly the order
 * a full sort gives. */
static void sift_down(int64_t *idx, int64_t m, int64_t at, scores sc) {
    const int64_t x = idx[at];
    for (;;) {
        int64_t c = 2 * at + 1;
        if (c >= m) break;
        if (c + 1 < m && before(sc, idx[c + 1], idx[c])) c++;
        if (!before(sc, idx[c], x)) break;
        idx[at] = idx[c];
        at = c;
    }
    idx[at] = x;
}

static void heapify(int64_t *idx, int64_t m, scores sc) {
    for (int64_t at = m / 2 - 1; at >= 0; at--) sift_down(idx, m, at, sc);
}

/* Takes the best of idx[0, *m) out: it goes to idx[*m - 1], the heap
 * shrinks by one. Returns it. */
static int64_t heap_pop(int64_t *idx, int64_t *m, scores sc) {
    const int64_t best = idx[0], last = --*m;
    idx[0] = idx[last];
    idx[last] = best;
    if (last > 1) sift_down(idx, last, 0, sc);
    return best;
}

typedef struct {
    const dhsa_router_params *rp;
    const dhsa_attn_desc *a;
    const plan *pl;
    const dhsa_attn_kernels *kern;
    dhsa_layout *lay;
    int64_t b, nc;
    const int64_t *starts;
    const float *kp;
    char *ws;
    size_t ws_per_thread;
    int64_t n_groups; /* ceil(n_qb / GROUP) */
    int64_t dense_blocks[1024]; /* per thread */
} sel_job;

typedef struct {
    float *qt, *S, *acc, *sblk, *kbuf, *col, *sbuf;
    int64_t *order, *rg, *srank;
} thread_bufs;

static thread_bufs bufs_of(const sel_job *j, int thread) {
    const plan *pl = j->pl;
    size_t nc = (size_t)pl->max_chunks;
    char *w = j->ws + (size_t)thread * j->ws_per_thread;
    thread_bufs t;
    t.qt = (float *)w;
    w += dhsa__align_up((size_t)(pl->dk > pl->p.d ? pl->dk : pl->p.d) * GROUP * sizeof(float), 64);
    t.S = (float *)w;
    w += dhsa__align_up(nc * GROUP * sizeof(float), 64);
    t.acc = pl->per_head ? (float *)w : NULL;
    if (pl->per_head) w += dhsa__align_up(nc * GROUP * sizeof(float), 64);
    t.order = (int64_t *)w;
    w += dhsa__align_up(nc * sizeof(int64_t), 64);
    t.col = (float *)w;
    w += dhsa__align_up(nc * sizeof(float), 64);
    t.rg = (int64_t *)w;
    w += dhsa__align_up((size_t)(pl->max_ranges + 8) * 2 * sizeof(int64_t), 64);
    t.sblk = (float *)w;
    w += dhsa__align_up((size_t)DHSA_BC * GROUP * sizeof(float), 64);
    t.kbuf = (float *)w;
    w += dhsa__align_up((size_t)DHSA_BC * (size_t)pl->p.d * sizeof(float), 64);
    t.sbuf = NULL;
    t.srank = NULL;
    if (pl->sinks) {
        t.sbuf = (float *)w;
        w += dhsa__align_up((size_t)(2 * pl->p.d + pl->sink_window) * sizeof(float), 64);
        t.srank = (int64_t *)w;
    }
    return t;
}

/* Keys the rows [r0, r1) may attend to, together: [lo, hi) within
 * [0, Lk) (empty when lo >= hi). The first row has the lowest window start
 * and the last row the highest causal end; rows that see nothing (placed
 * beyond the keys with a window) do not widen it. */
void dhsa__block_span(const dhsa_attn_desc *a, int64_t Lk, int64_t r0, int64_t r1, int64_t *lo, int64_t *hi) {
    int64_t first = a->q_pos0 + r0, last = a->q_pos0 + r1 - 1;
    int64_t l = a->window > 0 && first - a->window + 1 > 0 ? first - a->window + 1 : 0;
    int64_t h = a->causal && last + 1 < Lk ? last + 1 : Lk;
    if (l > Lk) l = Lk;
    if (h < l) h = l;
    *lo = l;
    *hi = h;
}

/* Selection for one query block (see the file comment and dhsa.h): the
 * block may see keys [alo, ahi) and sits at positions [pos0, pos1); chunks
 * c < nc are [starts[c], starts[c + 1]) with scores sc.s[c * sc.stride];
 * with allowed != NULL only the chunks with allowed[c] != 0 are candidates
 * (the sinks, the local keys and the tail are read all the same).
 * Writes up to max_ranges pairs to rg (unsorted, may overlap: the layout
 * normalises them); returns their count; *dense = 1 if the block is dense.
 * order has room for nc indices. */
void dhsa__route_fixed_parts(const dhsa_router_params *rp, int64_t budget, int64_t *sink, int64_t *local) {
    *sink = rp->sink_tokens;
    *local = rp->local_tokens;
    if (!rp->scale_fixed) return;
    if (*sink > budget / 8) *sink = budget / 8;
    if (*local > budget / 4) *local = budget / 4;
}

int dhsa__sink_picked(const dhsa_router_params *rp) { return rp->sink_window > rp->sink_tokens; }

/* Sinks where the model puts them (dhsa.h, sink_window): the keys [alo,
 * alo + sink_window) of KV head g (clipped to ahi), ranked by their dot
 * product with the block's mean query (rows [r0, r1), heads [h0, h1) of
 * batch b), best first, ties to the lower position; keys from a->k, or
 * with kr != NULL from F32 rows kr + position x ldk (the decode index's
 * copy of its first keys). Writes the ranked
 * positions to rank (room for sink_window) and returns their count.
 * Scratch: buf, 2 d floats + sink_window floats. */
int64_t dhsa__rank_sinks(const dhsa_router_params *rp, const dhsa_attn_desc *a, int64_t b, int64_t g, int64_t h0,
                         int64_t h1, int64_t r0, int64_t r1, int64_t alo, int64_t ahi, const float *kr, int64_t ldk,
                         float *buf, int64_t *rank) {
    const int64_t d = a->q.shape[3];
    int64_t w = ahi - alo < rp->sink_window ? ahi - alo : rp->sink_window;
    if (w <= 0 || r1 <= r0 || h1 <= h0) return 0;
    float *qm = buf, *row = buf + d, *sc = buf + 2 * d;
    for (int64_t x = 0; x < d; x++) qm[x] = 0.0f;
    for (int64_t h = h0; h < h1; h++)
        for (int64_t r = r0; r < r1; r++) add_row(qm, NULL, row_f32(&a->q, b, h, r, d, row), d);
    for (int64_t j = 0; j < w; j++) {
        const float *k = kr ? kr + (alo + j) * ldk : row_f32(&a->k, b, g, alo + j - a->k_pos0, d, row);
        double t = 0;
        for (int64_t x = 0; x < d; x++) t += (double)qm[x] * (double)k[x];
        sc[j] = (float)t;
    }
    /* insertion into a ranked list: w is small (sink_window <= 4096, 64 by default) */
    for (int64_t j = 0; j < w; j++) {
        int64_t at = j;
        while (at > 0 && sc[rank[at - 1] - alo] < sc[j]) {
            rank[at] = rank[at - 1];
            at--;
        }
        rank[at] = alo + j;
    }
    return w;
}

int64_t dhsa__select_ranges(const dhsa_router_params *rp, int64_t max_ranges, int64_t min_len, int64_t Lk,
                            int64_t alo, int64_t ahi, int64_t pos0, int64_t pos1, const int64_t *starts,
                            int64_t nc_all, const float *score, int64_t stride, int64_t tail_lo,
                            const unsigned char *allowed, const int64_t *sink_rank, int64_t n_rank, int causal,
                            int64_t *order, int64_t *rg, int *dense) {
    scores sc = {score, stride};
    int64_t n = 0;
    int64_t avail = ahi - alo;
    *dense = 0;
    if (avail <= 0) return 0;
    int64_t budget = rp->budget_tokens > 0 ? rp->budget_tokens : (int64_t)ceil(rp->density * (double)avail);
    (void)Lk;
    if (avail < rp->dense_below || budget >= avail) {
        rg[0] = alo;
        rg[1] = ahi;
        *dense = 1;
        return 1;
    }
    /* sinks and the local diagonal, clipped to what the block may see;
     * with scale_fixed, at most an eighth / a quarter of this block's
     * budget, so that routed chunks always keep part of it */
    int64_t sink = rp->sink_tokens, local = rp->local_tokens;
    dhsa__route_fixed_parts(rp, budget, &sink, &local);
    int64_t s0 = alo, s1 = sink < ahi ? sink : ahi;
    if (s1 < s0) s1 = s0;
    /* picked sinks: the best-ranked sink_rank[0 .. sink) as single keys
     * (the range [s0, s1) is then empty) */
    const int64_t *picked = NULL;
    int64_t n_picked = 0;
    if (sink_rank) {
        picked = sink_rank;
        n_picked = sink < n_rank ? sink : n_rank;
        s1 = s0;
    }
    int64_t l0 = pos0 - local > alo ? pos0 - local : alo;
    int64_t l1 = pos1 < ahi ? pos1 : ahi;
    /* the decode index's open tail (keys not in a closed chunk yet) is
     * always read: it extends the local diagonal back to its start */
    if (tail_lo >= 0 && tail_lo < l0) l0 = tail_lo > alo ? tail_lo : alo;
    if (l0 > l1) l0 = l1;
    for (int64_t i = 0; i < n_picked; i++) {
        rg[n++] = picked[i];
        rg[n++] = picked[i] + 1;
    }
    if (rp->method == DHSA_ROUTE_STREAM) {
        /* sinks + the most recent keys: the block's own rows (the
         * diagonal) always, then back from it while the budget lasts */
        int64_t ns = s1 - s0 + n_picked, recent = budget - ns > 0 ? budget - ns : 0;
        int64_t r0 = ahi - recent > alo ? ahi - recent : alo;
        if (causal && pos0 < r0) r0 = pos0 > alo ? pos0 : alo; /* each row sees itself */
        rg[n++] = s0;
        rg[n++] = s1;
        rg[n++] = r0;
        rg[n++] = ahi;
        return n / 2;
    }
    rg[n++] = s0;
    rg[n++] = s1;
    rg[n++] = l0;
    rg[n++] = l1;
    int64_t used = (s1 - s0) + (l1 - l0);
    {
        int64_t i0 = s0 > l0 ? s0 : l0, i1 = s1 < l1 ? s1 : l1;
        if (i1 > i0) used -= i1 - i0;
    }
    for (int64_t i = 0; i < n_picked; i++) used += picked[i] < l0 || picked[i] >= l1;
    /* candidate chunks: those overlapping [alo, ahi) (and allowed) */
    int64_t nc = 0;
    for (int64_t c = 0; c < nc_all; c++) {
        if (starts[c + 1] <= alo || starts[c] >= ahi || (allowed && !allowed[c])) continue;
        order[nc++] = c;
    }
    int64_t cap = max_ranges - 2 - n_picked; /* ranges left for chunks (after sinks, local, picked sinks) */
    (void)min_len;
    /* candidates best first (heap_pop): the i-th best is then at
     * order[nc - 1 - i] */
    int64_t taken = 0, i = 0, m = nc;
    heapify(order, m, sc);
    while (used < budget && i < nc && taken < cap) {
        int64_t c = heap_pop(order, &m, sc);
        i++;
        int64_t cs = starts[c] > alo ? starts[c] : alo;
        int64_t ce = starts[c + 1] < ahi ? starts[c + 1] : ahi;
        int64_t fresh = uncovered(cs, ce, s0, s1, l0, l1) - picked_in(picked, n_picked, cs, ce, l0, l1);
        if (fresh == 0) continue;
        /* a chunk that would overshoot the budget by more than half of
         * itself is passed over for lower-ranked ones that fit better, so
         * long content chunks do not buy extra density */
        if (used + fresh > budget && budget - used < fresh / 2) continue;
        order[nc - i] = -1; /* taken */
        rg[n++] = cs;
        rg[n++] = ce;
        used += fresh;
        taken++;
    }
    /* budget still not met: the best-ranked chunks passed over fill it */
    for (int64_t i2 = 0; used < budget && i2 < i && taken < cap; i2++) {
        int64_t c = order[nc - 1 - i2];
        if (c < 0) continue;
        int64_t cs = starts[c] > alo ? starts[c] : alo;
        int64_t ce = starts[c + 1] < ahi ? starts[c + 1] : ahi;
        int64_t fresh = uncovered(cs, ce, s0, s1, l0, l1) - picked_in(picked, n_picked, cs, ce, l0, l1);
        if (fresh == 0) continue;
        rg[n++] = cs;
        rg[n++] = ce;
        used += fresh;
        taken++;
    }
    return n / 2;
}

/* Fills block (b, g, qb) from the chunk scores sc[c * GROUP] (column of
 * this block). */
static void select_block(sel_job *j, thread_bufs *t, int64_t g, int64_t qb, const float *sc, int thread) {
    const dhsa_router_params *rp = j->rp;
    const dhsa__attn_problem *p = &j->pl->p;
    int64_t r0 = qb * rp->q_block, r1 = r0 + rp->q_block < p->Lq ? r0 + rp->q_block : p->Lq;
    int64_t alo, ahi;
    dhsa__block_span(j->a, p->Lk, r0, r1, &alo, &ahi);
    int dense;
    /* the block's column of scores, contiguous: the ranking compares
     * scores O(nc log nc) times, each a cache miss at a stride of GROUP */
    /* (chunks from ncb on start at or after ahi: never candidates) */
    int64_t ncb = j->nc;
    while (ncb > 0 && j->starts[ncb - 1] >= ahi) ncb--;
    for (int64_t c = 0; c < ncb; c++) t->col[c] = sc[c * GROUP];
    int64_t n_rank = 0;
    if (t->srank) {
        int64_t h0 = rp->share_heads ? 0 : g * p->G, h1 = rp->share_heads ? p->Hq : (g + 1) * p->G;
        n_rank = dhsa__rank_sinks(rp, j->a, j->b, rp->share_heads ? 0 : g, h0, h1, r0, r1, alo, ahi, NULL, 0, t->sbuf,
                                  t->srank);
    }
    int64_t n = dhsa__select_ranges(rp, j->pl->max_ranges, j->pl->min_len, p->Lk, alo, ahi, j->a->q_pos0 + r0,
                                    j->a->q_pos0 + r1, j->starts, ncb, t->col, 1, -1, NULL, t->srank, n_rank,
                                    j->a->causal, t->order, t->rg, &dense);
    j->dense_blocks[thread] += dense;
    dhsa_layout_set(j->lay, j->b, g, qb, t->rg, n);
}

/* Keys [j0, j0 + n) of KV head g as F32 rows [n][d]: contiguous F32 copied,
 * F16/BF16 widened by the kernel (exact), anything else element by element. */
static void oracle_keys(const sel_job *j, int64_t g, int64_t j0, int n, int64_t d, float *kb) {
    const dhsa_attn_desc *a = j->a;
    for (int r = 0; r < n; r++) {
        const void *k = dhsa__at(&a->k, j->b, g, j0 + r);
        if (a->k.stride[3] == 1 && a->k.type == DHSA_F32)
            memcpy(kb + r * d, k, (size_t)d * sizeof(float));
        else if (a->k.stride[3] == 1 && (a->k.type == DHSA_F16 || a->k.type == DHSA_BF16))
            j->kern->widen((const uint16_t *)k, a->k.type == DHSA_BF16, d, kb + r * d);
        else
            for (int64_t x = 0; x < d; x++) kb[r * d + x] = dhsa__load(k, a->k.type, x * a->k.stride[3]);
    }
}

/* Oracle scores of query blocks [qb0, qb1) of KV head g: S[c][qb - qb0] =
 * the attention mass chunk c receives from the block's rows and the group's
 * heads. The blocks' columns (a column is one row of one head) are laid
 * side by side, GROUP to a tile (several blocks when q_block x G < GROUP),
 * and take two QK passes over the keys, both through the attention
 * kernels' online softmax: the first finds each column's log-sum-exp, the
 * second, started at the LSE (no score exceeds it), gives each key's
 * probability exp(s - LSE); a chunk's mass sums its keys and the block's
 * columns. Keys outside a column's range score -inf; padding columns start
 * the second pass at +inf and add 0. */
static void oracle_scores(sel_job *j, thread_bufs *t, int64_t g, int64_t qb0, int64_t qb1) {
    const dhsa__attn_problem *p = &j->pl->p;
    const dhsa_attn_desc *a = j->a;
    const dhsa_router_params *rp = j->rp;
    const int64_t d = p->d, G = p->G, nb = qb1 - qb0;
    int64_t first[GROUP + 1]; /* block qb0 + b owns columns [first[b], first[b + 1]) */
    first[0] = 0;
    for (int64_t b = 0; b < nb; b++) {
        int64_t r0 = (qb0 + b) * rp->q_block, r1 = r0 + rp->q_block < p->Lq ? r0 + rp->q_block : p->Lq;
        first[b + 1] = first[b] + (r1 - r0) * G;
    }
    for (int64_t x = 0; x < j->nc * GROUP; x++) t->S[x] = 0.0f;
    float m[GROUP], l[GROUP], alpha[GROUP], acc[GROUP];
    float *sb = t->sblk; /* [BC][GROUP] */
    for (int64_t u0 = 0, b0 = 0; u0 < first[nb]; u0 += GROUP) {
        int64_t w = first[nb] - u0 < GROUP ? first[nb] - u0 : GROUP;
        int64_t lo[GROUP], hi[GROUP], jlo = p->Lk, jhi = 0, in_lo = 0, in_hi = p->Lk;
        while (first[b0 + 1] <= u0) b0++; /* the block of the tile's first column */
        for (int64_t i = 0, b = b0; i < GROUP; i++) {
            m[i] = -INFINITY;
            l[i] = 0.0f;
            if (i >= w) {
                for (int64_t x = 0; x < d; x++) t->qt[x * GROUP + i] = 0.0f;
                continue;
            }
            int64_t u = u0 + i;
            while (first[b + 1] <= u) b++;
            int64_t v = u - first[b], row = (qb0 + b) * rp->q_block + v / G, hq = g * G + v % G;
            const void *q = dhsa__at(&a->q, j->b, hq, row);
            for (int64_t x = 0; x < d; x++)
                t->qt[x * GROUP + i] = p->scale * dhsa__load(q, a->q.type, x * a->q.stride[3]);
            dhsa__attn_key_range(a, p->Lk, a->q_pos0 + row, &lo[i], &hi[i]);
            if (lo[i] < jlo) jlo = lo[i];
            if (hi[i] > jhi) jhi = hi[i];
            if (lo[i] > in_lo) in_lo = lo[i]; /* [in_lo, in_hi): in every column's range */
            if (hi[i] < in_hi) in_hi = hi[i];
        }
        for (int pass = 0; pass < 2; pass++) {
            int64_t c = 0;
            if (pass == 1)
                for (int64_t i = 0; i < GROUP; i++) /* LSE; padding or no keys: +inf (exp 0) */
                    m[i] = i < w && l[i] > 0.0f ? m[i] + logf(l[i]) : INFINITY;
            for (int64_t j0 = jlo; j0 < jhi; j0 += DHSA_BC) {
                int n = (int)(jhi - j0 < DHSA_BC ? jhi - j0 : DHSA_BC);
                oracle_keys(j, g, j0, n, d, t->kbuf);
                j->kern->qk(t->kbuf, d, n, (int)d, t->qt, GROUP, sb);
                if (j0 < in_lo || j0 + n > in_hi)
                    for (int r = 0; r < n; r++)
                        for (int64_t i = 0; i < w; i++)
                            if (j0 + r < lo[i] || j0 + r >= hi[i]) sb[r * GROUP + i] = -INFINITY;
                j->kern->softmax(sb, n, GROUP, m, l, alpha); /* pass 1: m stays the LSE */
                if (pass == 0) continue;
                for (int r = 0; r < n;) { /* the tile's rows, chunk by chunk */
                    while (j->starts[c + 1] <= j0 + r) c++;
                    int re = j->starts[c + 1] - j0 < n ? (int)(j->starts[c + 1] - j0) : n;
                    for (int64_t i = 0; i < GROUP; i++) acc[i] = 0.0f;
                    for (; r < re; r++)
                        for (int64_t i = 0; i < GROUP; i++) acc[i] += sb[r * GROUP + i];
                    for (int64_t b = b0; b < nb && first[b] < u0 + w; b++) { /* the tile's blocks */
                        int64_t i0 = first[b] > u0 ? first[b] - u0 : 0;
                        int64_t i1 = first[b + 1] < u0 + w ? first[b + 1] - u0 : w;
                        double sum = 0.0;
                        for (int64_t i = i0; i < i1; i++) sum += acc[i];
                        t->S[c * GROUP + b] += (float)sum;
                    }
                }
            }
        }
    }
}

/* HEADS and BOUND scores of blocks [qb0, qb1) of KV head g into t->S[c][i]: for each
 * query head h of the group, e_h(c) = s q_h . k_mean(c) + s^2/2 (q_h*q_h) .
 * k_var(c) (q_h the mean of the block's rows of head h: MOMENTS for one
 * head), then the share of head h's estimated attention that one key of
 * chunk c holds, exp(e_h(c)) / sum over the block's candidate chunks c' of
 * n(c') exp(e_h(c')), summed over the heads, as a log. A head whose
 * attention sits on one chunk gives it a share near 1, a head spread over
 * everything gives every chunk little, so the retrieving head of a group
 * is not averaged away by the others (MOMENTS means the queries of the
 * heads first). BOUND: e_h(c) = s (q_h+ . k_max(c) + q_h- . k_min(c)), q+
 * and q- the positive and negative parts of the mean row, and every chunk
 * weighs 1 in the softmax (a bound says what one key may reach). */
static void heads_scores(sel_job *j, thread_bufs *t, int64_t g, int64_t qb0, int64_t qb1) {
    const dhsa__attn_problem *p = &j->pl->p;
    const dhsa_router_params *rp = j->rp;
    const int64_t d = p->d, dk = j->pl->dk, nc = j->nc;
    const int bound = rp->score_mode == DHSA_SCORE_BOUND;
    int64_t lo[GROUP], hi[GROUP]; /* candidate chunks [lo, hi) of each block */
    for (int64_t i = 0; i < GROUP; i++) {
        lo[i] = hi[i] = 0;
        int64_t qb = qb0 + i;
        if (qb >= qb1) continue;
        int64_t r0 = qb * rp->q_block, r1 = r0 + rp->q_block < p->Lq ? r0 + rp->q_block : p->Lq;
        int64_t alo, ahi;
        dhsa__block_span(j->a, p->Lk, r0, r1, &alo, &ahi);
        while (lo[i] < nc && j->starts[lo[i] + 1] <= alo) lo[i]++;
        hi[i] = lo[i];
        while (hi[i] < nc && j->starts[hi[i]] < ahi) hi[i]++;
    }
    /* rows c >= ncg (chunks after every block's span) are never read:
     * not computed (each row of qk is its own dot products) */
    int64_t ncg = 0;
    for (int64_t i = 0; i < GROUP; i++) ncg = hi[i] > ncg ? hi[i] : ncg;
    for (int64_t x = 0; x < nc * GROUP; x++) t->acc[x] = -INFINITY;
    for (int64_t h = g * p->G; h < (g + 1) * p->G; h++) {
        float *sum = t->kbuf, *rowbuf = t->kbuf + dk; /* as in select_task */
        for (int64_t i = 0; i < GROUP; i++) {
            int64_t qb = qb0 + i;
            for (int64_t x = 0; x < dk; x++) sum[x] = 0.0f;
            if (qb < qb1) {
                int64_t r0 = qb * rp->q_block, r1 = r0 + rp->q_block < p->Lq ? r0 + rp->q_block : p->Lq;
                for (int64_t r = r0; r < r1; r++) {
                    add_row(sum, sum + d, row_f32(&j->a->q, j->b, h, r, d, rowbuf), d);
                }
            }
            for (int64_t x = 0; x < dk; x++) t->qt[x * GROUP + i] = sum[x];
            if (qb >= qb1) continue;
            int64_t r0 = qb * rp->q_block, r1 = r0 + rp->q_block < p->Lq ? r0 + rp->q_block : p->Lq;
            double rows = (double)(r1 - r0), sc = p->scale;
            float n1 = (float)(sc / rows), n2 = (float)(0.5 * sc * sc / rows);
            for (int64_t x = 0; x < d; x++) t->qt[x * GROUP + i] *= n1;
            for (int64_t x = d; x < dk; x++) t->qt[x * GROUP + i] *= n2;
            if (bound)
                for (int64_t x = 0; x < d; x++) { /* [s q+, s q-] */
                    float v = t->qt[x * GROUP + i];
                    t->qt[x * GROUP + i] = v > 0.0f ? v : 0.0f;
                    t->qt[(d + x) * GROUP + i] = v < 0.0f ? v : 0.0f;
                }
        }
        /* S[c][i] = e_h(c) for block qb0 + i */
        j->kern->qk(j->kp + g * nc * dk, dk, (int)ncg, (int)dk, t->qt, GROUP, t->S);
        for (int64_t i = 0; i < GROUP && qb0 + i < qb1; i++) {
            double m = -INFINITY, z = 0;
            for (int64_t c = lo[i]; c < hi[i]; c++) m = t->S[c * GROUP + i] > m ? t->S[c * GROUP + i] : m;
            if (!(m > -INFINITY)) continue;
            for (int64_t c = lo[i]; c < hi[i]; c++)
                z += (bound ? 1.0 : (double)(j->starts[c + 1] - j->starts[c])) * exp((double)t->S[c * GROUP + i] - m);
            double lz = m + log(z);
            for (int64_t c = lo[i]; c < hi[i]; c++) {
                double e = (double)t->S[c * GROUP + i] - lz, a = t->acc[c * GROUP + i];
                double hi2 = a > e ? a : e;
                t->acc[c * GROUP + i] = (float)(hi2 + log(exp(a - hi2) + exp(e - hi2)));
            }
        }
    }
    for (int64_t x = 0; x < nc * GROUP; x++) t->S[x] = t->acc[x];
}

/* DHSA_SCORE_ROWS (layout_internal.h): the scored rows' queries, scaled, go
 * as columns of qt (at most GROUP at a time, padded to 16) through the qk
 * micro-kernel against the chunks' mean keys; per column the exponentials
 * relative to its largest score (the softmax micro-kernel with m preset
 * to that maximum, so its alpha is 1), normalised by the length-weighted
 * sum, are each chunk's share per key; acc sums them in double. */
void dhsa__rows_scores(const dhsa_attn_desc *a, int64_t b, int64_t h0, int64_t h1, int64_t r0, int64_t r1,
                       const dhsa_router_params *rp, float scale, const float *kmean, int64_t ldk,
                       const int64_t *starts, int64_t c0, int64_t c1, float *qt, float *S, double *acc, float *out,
                       int64_t out_stride) {
    const dhsa_attn_kernels *kern = dhsa__attn_kernels();
    const int64_t d = a->q.shape[3], n = c1 - c0;
    for (int64_t c = 0; c < n; c++) acc[c] = 0.0;
    if (n <= 0) return;
    const int64_t step = rp->score_rows > 0 ? (rp->q_block + rp->score_rows - 1) / rp->score_rows : 1;
    int64_t nrows = 0; /* rows r1 - 1, r1 - 1 - step, ... >= r0, at most score_rows */
    for (int64_t r = r1 - 1; r >= r0 && (rp->score_rows == 0 || nrows < rp->score_rows); r -= step) nrows++;
    const int64_t cols = nrows * (h1 - h0);
    float m[GROUP], l[GROUP], alpha[GROUP];
    for (int64_t col0 = 0; col0 < cols; col0 += GROUP) {
        int64_t w = cols - col0 < GROUP ? cols - col0 : GROUP, W = (w + 15) / 16 * 16;
        for (int64_t i = 0; i < W; i++) {
            for (int64_t x = 0; x < d; x++) qt[x * W + i] = 0.0f;
            if (i >= w) continue;
            int64_t col = col0 + i, h = h0 + col / nrows, r = r1 - 1 - (col % nrows) * step;
            const void *q = dhsa__at(&a->q, b, h, r);
            for (int64_t x = 0; x < d; x++) qt[x * W + i] = scale * dhsa__load(q, a->q.type, x * a->q.stride[3]);
        }
        kern->qk(kmean + c0 * ldk, ldk, (int)n, (int)d, qt, (int)W, S);
        for (int64_t i = 0; i < W; i++) {
            m[i] = -INFINITY;
            l[i] = 0.0f;
        }
        for (int64_t c = 0; c < n; c++)
            for (int64_t i = 0; i < W; i++) m[i] = S[c * W + i] > m[i] ? S[c * W + i] : m[i];
        for (int64_t c = 0; c < n; c += DHSA_BC) /* m stays: exp(S - max) in place */
            kern->softmax(S + c * W, (int)(n - c < DHSA_BC ? n - c : DHSA_BC), (int)W, m, l, alpha);
        double z[GROUP];
        for (int64_t i = 0; i < W; i++) z[i] = 0.0;
        for (int64_t c = 0; c < n; c++) {
            double len = (double)(starts[c0 + c + 1] - starts[c0 + c]);
            for (int64_t i = 0; i < w; i++) z[i] += len * (double)S[c * W + i];
        }
        for (int64_t i = 0; i < w; i++) z[i] = z[i] > 0.0 ? 1.0 / z[i] : 0.0;
        for (int64_t c = 0; c < n; c++) {
            double t = 0.0;
            for (int64_t i = 0; i < w; i++) t += (double)S[c * W + i] * z[i];
            acc[c] += t;
        }
    }
    for (int64_t c = 0; c < n; c++) out[c * out_stride] = acc[c] > 0.0 ? (float)log(acc[c]) : -FLT_MAX;
}

/* One task: GROUP consecutive query blocks of one KV head (g), or of the
 * shared routing (g = 0, copied to every head afterwards). */
static void select_task(void *arg, int64_t task, int thread) {
    sel_job *j = arg;
    const dhsa__attn_problem *p = &j->pl->p;
    const dhsa_router_params *rp = j->rp;
    const int64_t d = p->d;
    int64_t g = task / j->n_groups, grp = task % j->n_groups;
    int64_t qb0 = grp * GROUP, qb1 = qb0 + GROUP < j->pl->n_qb ? qb0 + GROUP : j->pl->n_qb;
    thread_bufs t = bufs_of(j, thread);

    if (rp->method == DHSA_ROUTE_DHSA && p->Lk >= rp->dense_below && rp->score_mode == DHSA_SCORE_ROWS) {
        for (int64_t x = 0; x < j->nc * GROUP; x++) t.S[x] = -INFINITY;
        for (int64_t qb = qb0; qb < qb1; qb++) {
            int64_t r0 = qb * rp->q_block, r1 = r0 + rp->q_block < p->Lq ? r0 + rp->q_block : p->Lq;
            int64_t alo, ahi, lo = 0, hi;
            dhsa__block_span(j->a, p->Lk, r0, r1, &alo, &ahi);
            while (lo < j->nc && j->starts[lo + 1] <= alo) lo++;
            hi = lo;
            while (hi < j->nc && j->starts[hi] < ahi) hi++;
            /* t.acc is the kernel's [chunks][64] tile, t.order (free until
             * the selection) the doubles */
            dhsa__rows_scores(j->a, j->b, g * p->G, (g + 1) * p->G, r0, r1, rp, p->scale, j->kp + g * j->nc * j->pl->dk,
                              j->pl->dk, j->starts, lo, hi, t.qt, t.acc, (double *)(void *)t.order,
                              t.S + lo * GROUP + (qb - qb0), GROUP);
        }
    } else if (rp->method == DHSA_ROUTE_DHSA && p->Lk >= rp->dense_below &&
        (rp->score_mode == DHSA_SCORE_HEADS || rp->score_mode == DHSA_SCORE_BOUND)) {
        heads_scores(j, &t, g, qb0, qb1);
    } else if (rp->method == DHSA_ROUTE_DHSA && p->Lk >= rp->dense_below) {
        /* pooled queries, transposed: qt[x][i] for block qb0 + i. POOLED:
         * the rows' sum / sqrt(rows), averaged over heads; MOMENTS: x < d
         * the scaled mean row, d + x half the squared scale times the mean
         * of the rows' squares, to meet [mean key, key variance] */
        const int64_t dk = j->pl->dk;
        const int moments = rp->score_mode == DHSA_SCORE_MOMENTS;
        int64_t h0 = rp->share_heads ? 0 : g * p->G, h1 = rp->share_heads ? p->Hq : (g + 1) * p->G;
        /* the sums in a contiguous [dk] (t.kbuf, the oracle's: free
         * here), in the order the transposed tile took them before */
        float *sum = t.kbuf, *rowbuf = t.kbuf + dk;
        for (int64_t i = 0; i < GROUP; i++) {
            int64_t qb = qb0 + i;
            for (int64_t x = 0; x < dk; x++) sum[x] = 0.0f;
            if (qb < qb1) {
                int64_t r0 = qb * rp->q_block, r1 = r0 + rp->q_block < p->Lq ? r0 + rp->q_block : p->Lq;
                for (int64_t h = h0; h < h1; h++)
                    for (int64_t r = r0; r < r1; r++) {
                        add_row(sum, moments ? sum + d : NULL, row_f32(&j->a->q, j->b, h, r, d, rowbuf), d);
                    }
            }
            for (int64_t x = 0; x < dk; x++) t.qt[x * GROUP + i] = sum[x];
            if (qb >= qb1) continue;
            int64_t r0 = qb * rp->q_block, r1 = r0 + rp->q_block < p->Lq ? r0 + rp->q_block : p->Lq;
            double rows = (double)(r1 - r0), heads = (double)(h1 - h0), sc = p->scale;
            float norm = (float)(moments ? sc / (rows * heads) : 1.0 / (sqrt(rows) * heads));
            float norm2 = (float)(0.5 * sc * sc / (rows * heads));
            for (int64_t x = 0; x < d; x++) t.qt[x * GROUP + i] *= norm;
            for (int64_t x = d; x < dk; x++) t.qt[x * GROUP + i] *= norm2;
        }
        /* S[c][i] = k~(c) . q~(qb0 + i), for the chunks c < ncg that start
         * before the end of some block's span (the others are never
         * candidates, select_block; each row of qk is its own dot
         * products, so the rows computed do not change) */
        int64_t ncg = 0;
        for (int64_t qb = qb0; qb < qb1; qb++) {
            int64_t r0 = qb * rp->q_block, r1 = r0 + rp->q_block < p->Lq ? r0 + rp->q_block : p->Lq, alo, ahi;
            dhsa__block_span(j->a, p->Lk, r0, r1, &alo, &ahi);
            while (ncg < j->nc && j->starts[ncg] < ahi) ncg++;
        }
        j->kern->qk(j->kp + (rp->share_heads ? 0 : g) * j->nc * dk, dk, (int)ncg, (int)dk, t.qt, GROUP, t.S);
    }
    if (rp->method == DHSA_ROUTE_ORACLE && p->Lk >= rp->dense_below) oracle_scores(j, &t, g, qb0, qb1);
    for (int64_t qb = qb0; qb < qb1; qb++) select_block(j, &t, g, qb, t.S + (qb - qb0), thread);
}

/* ---------------------------------------------------------------- route --- */

dhsa_status dhsa_route(dhsa_ctx *ctx, const dhsa_router_params *rp, const dhsa_attn_desc *a,
                       dhsa_layout **out) {
    if (!ctx || !out) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_route: NULL ctx or out");
    *out = NULL;
    plan pl;
    dhsa_status st = check(rp, a, &pl);
    if (st) return st;
    ws_plan wp = workspace(ctx, &pl);
    if (dhsa_ctx_n_threads(ctx) > 1024)
        return dhsa__fail(DHSA_ERR_UNSUPPORTED, "routing supports at most 1024 threads");
    dhsa_layout *lay;
    st = dhsa_layout_create(ctx, pl.p.B, pl.p.Hkv, pl.p.Lq, pl.p.Lk, rp->q_block, pl.max_ranges, &lay);
    if (st) return st;
    char *ws = dhsa__alloc(ctx, wp.total, &st);
    if (!ws) {
        dhsa_layout_free(lay);
        return st;
    }
    lay->q_pos0 = a->q_pos0;
    lay->causal = a->causal;
    lay->window = a->window;
    lay->chunk_min = INT64_MAX;
    float *score = (float *)ws;
    int64_t *starts = (int64_t *)(ws + wp.scores);
    float *kp = (float *)(ws + wp.scores + wp.starts);
    double chunk_sum = 0;
    sel_job *sj = calloc(1, sizeof *sj);
    if (!sj) {
        dhsa_ctx_release(ctx, ws);
        dhsa_layout_free(lay);
        return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory");
    }
    for (int64_t b = 0; b < pl.p.B; b++) {
        int64_t nc = boundaries(ctx, rp, a, &pl, b, score, starts, &st);
        if (nc < 0) break;
        lay->chunks += nc;
        for (int64_t c = 0; c < nc; c++) {
            int64_t len = starts[c + 1] - starts[c];
            chunk_sum += (double)len;
            if (len < lay->chunk_min) lay->chunk_min = len;
            if (len > lay->chunk_max) lay->chunk_max = len;
        }
        int64_t heads = rp->share_heads ? 1 : pl.p.Hkv;
        if (rp->method == DHSA_ROUTE_DHSA && pl.p.Lk >= rp->dense_below) {
            pool_job pj = {rp, a, &pl, b, nc, starts, kp, (double *)(ws + wp.scores + wp.starts + wp.kp)};
            dhsa_parallel_for(ctx, heads, pool_keys_task, &pj);
        }
        memset(sj, 0, sizeof *sj);
        sj->rp = rp;
        sj->a = a;
        sj->pl = &pl;
        sj->kern = dhsa__attn_kernels();
        sj->lay = lay;
        sj->b = b;
        sj->nc = nc;
        sj->starts = starts;
        sj->kp = kp;
        sj->ws = ws + wp.scores + wp.starts + wp.kp + wp.pool;
        sj->ws_per_thread = wp.per_thread;
        sj->n_groups = (pl.n_qb + GROUP - 1) / GROUP;
        dhsa_parallel_for(ctx, heads * sj->n_groups, select_task, sj);
        int64_t dense_b = 0;
        for (int t = 0; t < dhsa_ctx_n_threads(ctx); t++) dense_b += sj->dense_blocks[t];
        lay->dense_blocks += rp->share_heads ? dense_b * pl.p.Hkv : dense_b;
        if (rp->share_heads) {
            for (int64_t g = 1; g < pl.p.Hkv; g++)
                for (int64_t qb = 0; qb < pl.n_qb; qb++) {
                    const int64_t *r;
                    int64_t n;
                    dhsa_layout_get(lay, b, 0, qb, &r, &n);
                    dhsa_layout_set(lay, b, g, qb, r, n);
                }
        }
    }
    free(sj);
    dhsa_ctx_release(ctx, ws);
    if (st) {
        dhsa_layout_free(lay);
        return st;
    }
    lay->chunk_mean = lay->chunks ? chunk_sum / (double)lay->chunks : 0.0;
    if (lay->chunk_min == INT64_MAX) lay->chunk_min = 0;
    *out = lay;
    return DHSA_OK;
}

/* ----------------------------------------------------- boundaries only --- */

dhsa_status dhsa_route_boundaries(dhsa_ctx *ctx, const dhsa_router_params *rp, const dhsa_attn_desc *a, int64_t b,
                                  int64_t *starts, int64_t cap, int64_t *n) {
    if (!ctx || !n || cap < 0 || (cap > 0 && !starts))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_route_boundaries: NULL ctx or n, or starts NULL with cap %lld",
                          (long long)cap);
    *n = 0;
    plan pl;
    dhsa_status st = check(rp, a, &pl);
    if (st) return st;
    if (b < 0 || b >= pl.p.B)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_route_boundaries: batch %lld of %lld", (long long)b,
                          (long long)pl.p.B);
    /* the same buffers dhsa_route carves: scores [Lk], starts [max_chunks + 1] */
    size_t sb = scores_bytes(&pl);
    char *ws = dhsa__alloc(ctx, sb + (size_t)(pl.max_chunks + 1) * sizeof(int64_t), &st);
    if (!ws) return st;
    int64_t *all = (int64_t *)(ws + sb);
    int64_t nc = boundaries(ctx, rp, a, &pl, b, (float *)ws, all, &st);
    if (nc >= 0) {
        *n = nc;
        if (nc > cap && starts) /* starts NULL (cap 0) only sizes */
            st = dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_route_boundaries: %lld chunks do not fit cap %lld",
                            (long long)nc, (long long)cap);
        else if (nc > 0 && starts)
            memcpy(starts, all, (size_t)nc * sizeof(int64_t));
    }
    dhsa_ctx_release(ctx, ws);
    return st;
}
