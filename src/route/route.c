/* route.c: DHSA routing for prefill (DESIGN.md section 5) and the
 * streaming and oracle baselines, all producing a dhsa_layout (attn/layout.h).
 * It drives the two halves below it: chunking (boundaries.c) and selection
 * (select.c); the decode index (kv_index.c) is its sibling over the same two.
 *
 * Per batch: (1) key chunk boundaries, shared by all KV heads (FIXED, or
 * SIMILARITY from the change of the mean key across a candidate, or
 * LEARNED from the predictor's probabilities, then NMS, min_chunk,
 * max_chunk; LEARNED with causal_boundaries runs the decode index's online
 * rule instead: boundaries.c); (2) pooling of each chunk's keys per KV head and
 * of each query block's queries (rows of the block, averaged over the query
 * heads of the group): POOLED, sum / sqrt(n); MOMENTS (default), the key
 * mean and per-dimension variance against the scaled mean query and half
 * the squared scale times the mean squared query (rp->score_mode,
 * include/dhsa.h); (3) chunk scores S[qb, c] = q~ . k~ with the tiled
 * attention's own qk micro-kernel (width d or 2d), 64 query blocks at a
 * time; (4) per block a token budget filled by sinks, the local
 * diagonal, then chunks in score order, never overwriting anything already
 * selected, merged into sorted disjoint ranges (select.c).
 *
 * Cost: O(L d Hkv) for boundaries and pooling, O((L / q_block) x chunks x d)
 * for the scores, O(chunks) per block for the selection (a heap: O(chunks)
 * to build, O(log chunks) per chunk taken). The
 * oracle baseline replaces the scores by the true attention mass of each
 * chunk, which costs two dense QK passes: evaluation only.
 *
 * Not looked at: key_mask, key_bias and attn_mask (routing sees raw q.k).
 * Tested by tests/test_route*.c (route_t.h says which part tests what).
 */

#include "attn/attn_internal.h"
#include "attn/kern.h"
#include "attn/layout.h"
#include "route/boundaries.h"
#include "route/params.h"
#include "route/rows.h"
#include "route/select.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>

#define GROUP DHSA__SCORE_COLS /* query blocks scored together: one Qt tile of the qk kernel */

typedef struct {
    dhsa__attn_problem p;
    int64_t n_qb;        /* query blocks per (b, g) */
    int64_t max_chunks;  /* chunks per batch, at most */
    int64_t max_ranges;  /* per block */
    int64_t min_len;     /* shortest chunk boundaries can make */
    int64_t dk;          /* floats per pooled key: d (POOLED) or 2d (MOMENTS, HEADS, BOUND) */
    int per_head;        /* HEADS or BOUND: a per-thread sum [nc][64] */
    int var_cap;         /* MOMENTS or HEADS: the variance terms apart, [nc][64] (dhsa__var_term) */
    int similarity;      /* SIMILARITY boundaries: per-head score rows */
    int sinks;           /* sinks picked per block (dhsa__sink_picked) */
    int64_t sink_window;
} plan;

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
    pl->var_cap = rp->score_mode == DHSA_SCORE_MOMENTS || rp->score_mode == DHSA_SCORE_HEADS;
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

/* SIMILARITY's per-head rows, after the scores [Lk]. */
static float *boundary_part(const plan *pl, float *score) {
    return (float *)((char *)score + scores_head_bytes(&pl->p));
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
    /* per thread: Qt [dk][64], S [nc][64], the HEADS/BOUND sum [nc][64], the variance terms [nc][64],
     * candidate order [nc], one block's scores [nc], ranges, the oracle's score tile [BC][64] and
     * keys [BC][d] */
    w.per_thread = dhsa__align_up((size_t)(pl->dk > p->d ? pl->dk : p->d) * GROUP * sizeof(float), 64) +
                   dhsa__align_up(nc * GROUP * sizeof(float), 64) +
                   (pl->per_head ? dhsa__align_up(nc * GROUP * sizeof(float), 64) : 0) +
                   (pl->var_cap ? dhsa__align_up(nc * GROUP * sizeof(float), 64) : 0) +
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
                const float *k = dhsa__row_f32(K, j->b, g, t, d, rowbuf);
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
                for (int64_t t = s; t < e; t++) dhsa__add_row_d(m, dhsa__row_f32(K, j->b, h, t, d, rowbuf), d, 0);
                for (int64_t x = 0; x < d; x++) m[x] /= len;
                for (int64_t t = s; t < e; t++) add_dev2(v, m, dhsa__row_f32(K, j->b, h, t, d, rowbuf), d);
                for (int64_t x = 0; x < d; x++) {
                    out[x] += (float)(m[x] / heads);
                    out[d + x] += (float)(v[x] / (len * heads));
                }
            }
            continue;
        }
        for (int64_t h = h0; h < h1; h++)
            for (int64_t t = s; t < e; t++) {
                const float *k = dhsa__row_f32(K, j->b, h, t, d, rowbuf);
                for (int64_t x = 0; x < d; x++) out[x] += k[x];
            }
        float norm = (float)(1.0 / (sqrt((double)(e - s)) * (double)(h1 - h0)));
        for (int64_t x = 0; x < d; x++) out[x] *= norm;
    }
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
    float *qt, *S, *acc, *var, *sblk, *kbuf, *col, *sbuf;
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
    t.var = pl->var_cap ? (float *)w : NULL;
    if (pl->var_cap) w += dhsa__align_up(nc * GROUP * sizeof(float), 64);
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

/* S[c][i] = s q . k_mean(c) + dhsa__var_term(s^2/2 q^2 . k_var(c), n(c))
 * for the chunks c < ncg and the GROUP pooled queries in t->qt ([q, q^2]
 * rows, already scaled), kp the chunks' [mean, variance] rows: the two
 * halves as two products (the same flops as one over 2d), then the cap. */
static void qk_capped(sel_job *j, thread_bufs *t, const float *kp, int64_t ncg) {
    const int64_t d = j->pl->p.d, dk = j->pl->dk;
    j->kern->qk(kp, dk, (int)ncg, (int)d, t->qt, GROUP, t->S);
    j->kern->qk(kp + d, dk, (int)ncg, (int)d, t->qt + d * GROUP, GROUP, t->var);
    for (int64_t c = 0; c < ncg; c++) {
        const double ln2n = log(2.0 * (double)(j->starts[c + 1] - j->starts[c]));
        for (int64_t i = 0; i < GROUP; i++)
            t->S[c * GROUP + i] += (float)dhsa__var_term_l((double)t->var[c * GROUP + i], ln2n);
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
                    dhsa__add_row(sum, sum + d, dhsa__row_f32(&j->a->q, j->b, h, r, d, rowbuf), d);
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
        /* S[c][i] = e_h(c) for block qb0 + i (HEADS: the mean and the
         * capped variance terms, qk_capped) */
        if (bound) j->kern->qk(j->kp + g * nc * dk, dk, (int)ncg, (int)dk, t->qt, GROUP, t->S);
        else qk_capped(j, t, j->kp + g * nc * dk, ncg);
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
                        dhsa__add_row(sum, moments ? sum + d : NULL, dhsa__row_f32(&j->a->q, j->b, h, r, d, rowbuf), d);
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
        if (moments) qk_capped(j, &t, j->kp + (rp->share_heads ? 0 : g) * j->nc * dk, ncg);
        else j->kern->qk(j->kp + (rp->share_heads ? 0 : g) * j->nc * dk, dk, (int)ncg, (int)dk, t.qt, GROUP, t.S);
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
        int64_t nc = dhsa__boundaries(ctx, rp, a, &pl.p, b, score, boundary_part(&pl, score), starts, &st);
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
    int64_t nc = dhsa__boundaries(ctx, rp, a, &pl.p, b, (float *)ws, boundary_part(&pl, (float *)ws), all, &st);
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
