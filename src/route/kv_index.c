/* kv_index.c: DHSA at decode time (DESIGN.md section 6). An index beside
 * one sequence's KV cache: appending keys scores boundaries in the causal
 * form, decides them online with a fixed delay of nms_window keys, and keeps
 * each closed chunk's pooled key (POOLED: sum / sqrt(n); MOMENTS: the mean
 * and the per-dimension variance of its keys); routing a query block costs
 * O(chunks x d) per KV head and reads no keys. Contract in include/dhsa.h.
 *
 * The online decision for a candidate at t is made when key t + nms_window
 * arrives and uses only scores up to then, so the boundaries do not depend
 * on how the keys were split into appends; chunks carry the position at
 * which they were closed, and a query block only sees chunks closed at or
 * before its last position: routing after each ubatch equals routing once.
 *
 * LEARNED boundaries run the predictor incrementally: each appended key is
 * projected once (Q, K, V), and the candidate t - w + 1 is scored when key
 * t arrives, from the window [t - 2w + 1, t + 1) of 2w keys that
 * dhsa_predictor_score reads for it; only the last 2w - 1 keys' rows are
 * kept. Appends are processed in pieces of up to PIECE keys so that the
 * products go through the same micro-kernels in batches. The decisions are
 * the same online rule on a delay of w - 1 more keys, with the fixed
 * threshold learned_threshold (dhsa__decide, boundaries.c);
 * dhsa__learned_online_starts runs that rule over dhsa_predictor_score's
 * probabilities of a whole sequence, which is
 * what dhsa_route does for LEARNED with causal_boundaries = 1: both give the
 * same chunks, bit for bit, because the probabilities are the same bits
 * (predictor_internal.h).
 *
 * Truncation (dhsa_kv_index_truncate; a session's prompt cache and the
 * undoing of a failed eval, dhsa__kv_index_mark / dhsa__kv_index_rewind)
 * rests on one rule: a closed chunk, its boundary and its summary are final,
 * functions of the keys before the one that closed it (decided[c]). So
 * the index at n keys is: the chunks decided before key n, the open chunk
 * from the last of them (its sums, the ring of recent keys and LEARNED's
 * predictor rows recomputed from the cache's keys, in the appends' order),
 * and the online rule's state after candidates 1 .. n - 1 - delay. That
 * state is the last 2 nms_window + 1 scores and a running mean / variance
 * (Welford), which cannot be undone; the index keeps every candidate's
 * score (4 bytes per key of capacity) and replays the running statistics
 * from them, with the same operations in the same order. Cost: O(n)
 * scalar updates plus O((open chunk + ring) x Hkv d) key reads, against
 * O(n) appends for a rebuild (8.5 us per key and layer on the default model).
 * An append or truncation refuses to overlap any other call on the index
 * (DHSA_ERR_BUSY, through `users`); routes may overlap each other.
 * Tested by tests/test_kv_index*.c, tests/test_session_fail.c and
 * tests/test_threads.c.
 */
#include "route/kv_index_internal.h"

#include "attn/attn_internal.h"
#include "attn/layout.h"
#include "route/boundaries.h"
#include "route/carry.h"
#include "route/params.h"
#include "route/predictor_internal.h"
#include "route/select.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PIECE 64 /* keys of an append scored together (LEARNED) */

struct dhsa_kv_index {
    dhsa_ctx *ctx;
    dhsa_router_params rp;
    int64_t Hkv, d, capacity, len;
    int64_t max_chunks, min_len, max_ranges_cap;
    /* closed chunks: [starts[c], starts[c + 1]); starts[n_chunks] = start of
     * the open tail. decided[c] = position of the key that closed chunk c. */
    int64_t n_chunks;
    int64_t *starts;  /* [max_chunks + 1] */
    int64_t *decided; /* [max_chunks] */
    float *pooled;    /* [max_chunks][Hkv][d]: sum / sqrt(n); MOMENTS, HEADS:
                         sum / n; BOUND: the keys' maximum per dimension */
    float *spread;    /* [max_chunks][Hkv][d]: MOMENTS, HEADS: variance of the
                         keys per dimension; BOUND: their minimum (NULL with
                         POOLED) */
    int bound;        /* BOUND: tail_sum / tail_sq are the maximum / minimum
                         of the open chunk's keys that have left the ring */
    /* the open tail: sum (and MOMENTS: sum of squares) of its keys per head
     * (double), and the recent keys kept for the similarity window and the
     * delayed split */
    double *tail_sum; /* [Hkv][d] */
    double *later;    /* [Hkv][d] scratch of close_chunk */
    double *tail_sq, *later_sq; /* [Hkv][d] each, MOMENTS (NULL otherwise) */
    int64_t ring_len; /* keys kept: max(sim_window, nms_window) + 1;
                         LEARNED: nms_window + w */
    float *ring;      /* [ring_len][Hkv][d], key t at t % ring_len */
    dhsa__decider dc; /* the scores and the online rule's state */
    float *score_hist; /* [capacity]: score of candidate s at s (s >= 1), what
                          truncation replays the running statistics from */
    int64_t delay;    /* keys after a candidate that its score needs:
                         LEARNED w - 1, else 0 */
    /* LEARNED: the predictor's rows of the last 2w - 1 keys (positions
     * len - 2w + 1 .., zero keys before 0), then those of the piece being
     * appended; C = Hkv * d */
    const dhsa_predictor *pr;
    int64_t hist;            /* 2w - 1 */
    float *px, *pq, *pk, *pv; /* [hist + PIECE][C] each: keys, Q, K, V */
    float *pfe;              /* [PIECE][4C + 1] features */
    float *ppn;              /* [DHSA_BC][64] panel output */
    float *pws;              /* window kernel scratch */
    float *pz;               /* [PIECE] probability of the candidate each
                                key of the piece completes */
    int64_t sink_n;    /* picked sinks (dhsa__sink_picked): the first sink_n keys are kept */
    float *sinkk;      /* [sink_n][Hkv][d]: those keys, the sink candidates every route ranks
                          (the index's own copy: a distributed rank may not hold them) */
    int64_t mark_len;  /* dhsa__kv_index_mark: the length to rewind to */
    int64_t append_from; /* the length before the last append (a delta carries the scores it made) */
    atomic_int users;  /* -1: an append runs; n > 0: n routes run */
};

/* sum a[x] * b[x] in double over 8 independent partial sums (added in a
 * fixed order): decode routes every chunk of every layer, and one serial
 * chain of double adds made this the index's largest cost at 32K. */
static double dot_f64(const float *a, const float *b, int64_t n) {
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t x = 0;
    for (; x + 8 <= n; x += 8)
        for (int k = 0; k < 8; k++) acc[k] += (double)a[x + k] * b[x + k];
    for (; x < n; x++) acc[0] += (double)a[x] * b[x];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* BOUND: the open chunk's range of keys outside the ring, empty. */
static void reset_range(dhsa_kv_index *ix) {
    for (int64_t x = 0; x < ix->Hkv * ix->d; x++) {
        ix->tail_sum[x] = -INFINITY;
        ix->tail_sq[x] = INFINITY;
    }
}

/* BOUND: key row k (position t) of the open chunk leaves the ring. */
static void fold_range(dhsa_kv_index *ix, const float *k) {
    for (int64_t x = 0; x < ix->Hkv * ix->d; x++) {
        ix->tail_sum[x] = k[x] > ix->tail_sum[x] ? k[x] : ix->tail_sum[x];
        ix->tail_sq[x] = k[x] < ix->tail_sq[x] ? k[x] : ix->tail_sq[x];
    }
}

static float *ring_key(const dhsa_kv_index *ix, int64_t t) {
    return ix->ring + (t % ix->ring_len) * ix->Hkv * ix->d;
}

/* Sizes of an index's arrays (one allocation, laid out in create). */
typedef struct {
    int64_t min_len, max_chunks, ring_len, score_size, delay, sink_n;
    size_t pred_offset; /* LEARNED: bytes before the predictor's buffers */
    size_t pred_floats[7]; /* px, pq, pk, pv, pfe, ppn + pws, pz (each a multiple of 16) */
    size_t bytes;
} ix_sizes;

static dhsa_status index_sizes(const dhsa_router_params *rp, int64_t Hkv, int64_t d, int64_t capacity,
                               ix_sizes *z) {
    dhsa_status st = dhsa__route_check_params(rp);
    if (st) return st;
    if (rp->method != DHSA_ROUTE_DHSA)
        return dhsa__fail(DHSA_ERR_UNSUPPORTED, "the decode index routes with the DHSA method only");
    if (Hkv < 1 || Hkv > 65536 || d < 1 || d > 65536 || capacity < 1 || capacity > ((int64_t)1 << 34))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "index sizes Hkv=%lld d=%lld capacity=%lld",
                          (long long)Hkv, (long long)d, (long long)capacity);
    const int learned = rp->boundary == DHSA_BOUNDARY_LEARNED;
    if (learned && dhsa_predictor_width(rp->predictor) != Hkv * d)
        return dhsa__fail(DHSA_ERR_SHAPE,
                          "the predictor reads C = %lld features per token but the index holds %lld KV heads x "
                          "%lld dims = %lld: one predictor per model (KV heads x head dim)",
                          (long long)dhsa_predictor_width(rp->predictor), (long long)Hkv, (long long)d,
                          (long long)(Hkv * d));
    /* online closing can cut at min_len or at max_chunk: chunks >= min_len
     * except the FIXED/max cut, which is exactly max_chunk */
    z->min_len = rp->boundary == DHSA_BOUNDARY_FIXED ? rp->chunk : rp->min_chunk;
    z->max_chunks = capacity / z->min_len + 2;
    z->delay = learned ? dhsa_predictor_window(rp->predictor) - 1 : 0;
    /* close_chunk re-reads the keys [t, now]: now - t <= nms_window + delay */
    z->ring_len = learned ? rp->nms_window + z->delay + 1
                          : (rp->sim_window + 1 > rp->nms_window + 1 ? rp->sim_window + 1 : rp->nms_window + 1);
    z->score_size = 2 * rp->nms_window + 1;
    size_t hd = (size_t)Hkv * (size_t)d;
    z->bytes = (size_t)(z->max_chunks + 1) * 8 + (size_t)z->max_chunks * 8 + (size_t)z->max_chunks * hd * 4 +
               hd * 8 + (size_t)z->ring_len * hd * 4 + (size_t)z->score_size * 4 + (size_t)capacity * 4 + hd * 8 +
               64 * 7;
    if (rp->score_mode != DHSA_SCORE_POOLED) /* MOMENTS, HEADS: spread, tail_sq, later_sq */
        z->bytes += (size_t)z->max_chunks * hd * 4 + 2 * hd * 8;
    z->sink_n = dhsa__sink_picked(rp) ? (rp->sink_window < capacity ? rp->sink_window : capacity) : 0;
    z->bytes += (size_t)z->sink_n * hd * 4;
    memset(z->pred_floats, 0, sizeof z->pred_floats);
    z->pred_offset = 0;
    if (learned) {
        const dhsa_predictor *pr = rp->predictor;
        size_t C = hd, rows = (size_t)(2 * dhsa_predictor_window(pr) - 1 + PIECE);
        for (int i = 0; i < 4; i++) z->pred_floats[i] = dhsa__align_up(rows * C, 16);
        z->pred_floats[4] = dhsa__align_up((size_t)PIECE * (4 * C + 1), 16);
        z->pred_floats[5] = dhsa__align_up((size_t)DHSA_BC * 64, 16) + dhsa__align_up(dhsa__predictor_window_ws(pr), 16);
        z->pred_floats[6] = dhsa__align_up(PIECE, 16);
        z->pred_offset = dhsa__align_up(z->bytes, 64);
        z->bytes = z->pred_offset;
        for (int i = 0; i < 7; i++) z->bytes += z->pred_floats[i] * sizeof(float);
    }
    return DHSA_OK;
}

dhsa_status dhsa_kv_index_size(const dhsa_router_params *rp, int64_t Hkv, int64_t d, int64_t capacity,
                               size_t *bytes) {
    if (!rp || !bytes) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_kv_index_size: NULL argument");
    ix_sizes z;
    dhsa_status st = index_sizes(rp, Hkv, d, capacity, &z);
    if (st) return st;
    *bytes = z.bytes;
    return DHSA_OK;
}

dhsa_status dhsa_kv_index_create(dhsa_ctx *ctx, const dhsa_router_params *rp, int64_t Hkv, int64_t d,
                                 int64_t capacity, dhsa_kv_index **out) {
    if (!ctx || !out) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_kv_index_create: NULL argument");
    *out = NULL;
    if (!rp) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_kv_index_create: params are NULL");
    ix_sizes z;
    dhsa_status st = index_sizes(rp, Hkv, d, capacity, &z);
    if (st) return st;
    dhsa_kv_index *ix = calloc(1, sizeof *ix);
    if (!ix) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory");
    ix->ctx = ctx;
    ix->rp = *rp;
    ix->rp.causal_boundaries = 1;
    ix->Hkv = Hkv;
    ix->d = d;
    ix->capacity = capacity;
    ix->min_len = z.min_len;
    ix->max_chunks = z.max_chunks;
    ix->ring_len = z.ring_len;
    size_t hd = (size_t)Hkv * (size_t)d, bytes = z.bytes;
    char *m = dhsa__alloc(ctx, bytes, &st);
    if (!m) {
        free(ix);
        return st;
    }
    memset(m, 0, bytes);
    ix->starts = (int64_t *)m;
    ix->decided = ix->starts + ix->max_chunks + 1;
    ix->tail_sum = (double *)(ix->decided + ix->max_chunks);
    ix->later = ix->tail_sum + hd;
    int moments = rp->score_mode != DHSA_SCORE_POOLED; /* MOMENTS and HEADS keep [mean, variance] */
    ix->tail_sq = moments ? ix->later + hd : NULL;
    ix->later_sq = moments ? ix->later + 2 * hd : NULL;
    ix->pooled = (float *)(ix->later + (moments ? 3 : 1) * hd);
    ix->spread = moments ? ix->pooled + (size_t)ix->max_chunks * hd : NULL;
    ix->ring = ix->pooled + (size_t)(moments ? 2 : 1) * (size_t)ix->max_chunks * hd;
    ix->bound = rp->score_mode == DHSA_SCORE_BOUND;
    if (ix->bound) reset_range(ix);
    ix->dc.rp = &ix->rp;
    ix->dc.learned = rp->boundary == DHSA_BOUNDARY_LEARNED;
    ix->dc.score = ix->ring + (size_t)ix->ring_len * hd;
    ix->dc.score_size = z.score_size;
    ix->score_hist = ix->dc.score + z.score_size;
    ix->sink_n = z.sink_n;
    ix->sinkk = ix->sink_n ? ix->score_hist + capacity : NULL;
    ix->delay = z.delay;
    atomic_init(&ix->users, 0);
    if (ix->dc.learned) {
        float *f = (float *)(m + z.pred_offset);
        ix->pr = rp->predictor;
        ix->hist = 2 * dhsa_predictor_window(ix->pr) - 1;
        ix->px = f, f += z.pred_floats[0];
        ix->pq = f, f += z.pred_floats[1];
        ix->pk = f, f += z.pred_floats[2];
        ix->pv = f, f += z.pred_floats[3];
        ix->pfe = f, f += z.pred_floats[4];
        ix->ppn = f;
        ix->pws = f + dhsa__align_up((size_t)DHSA_BC * 64, 16), f += z.pred_floats[5];
        ix->pz = f;
        /* the rows before the first key are zero keys, as
         * dhsa_predictor_score pads the sequence: their Q, K, V once */
        dhsa__predictor_project(ix->pr, dhsa__attn_kernels(), ix->px, ix->hist, ix->pq, ix->pk, ix->pv, ix->ppn);
    }
    *out = ix;
    return DHSA_OK;
}

void dhsa_kv_index_free(dhsa_kv_index *ix) {
    if (!ix) return;
    dhsa_ctx_release(ix->ctx, ix->starts);
    free(ix);
}

int64_t dhsa_kv_index_length(const dhsa_kv_index *ix) { return ix ? ix->len : 0; }

int64_t dhsa_kv_index_chunks(const dhsa_kv_index *ix, const int64_t **starts) {
    if (!ix) return 0;
    if (starts) *starts = ix->starts;
    return ix->n_chunks;
}

/* Closes the open tail at position t (a chunk [start, t)), decided when key
 * `now` arrived: the keys [t, now] leave the tail sum for the new tail. */
static dhsa_status close_chunk(dhsa_kv_index *ix, int64_t t, int64_t now) {
    if (ix->n_chunks >= ix->max_chunks)
        return dhsa__fail(DHSA_ERR_INTERNAL, "decode index: chunk table full (%lld)", (long long)ix->max_chunks);
    const int64_t Hkv = ix->Hkv, d = ix->d, c = ix->n_chunks;
    int64_t start = ix->starts[c], n = t - start;
    float *out = ix->pooled + c * Hkv * d;
    if (ix->bound) { /* the range of the keys that left the ring, and of those still in it before t */
        float *mn = ix->spread + c * Hkv * d;
        for (int64_t x = 0; x < Hkv * d; x++) {
            out[x] = (float)ix->tail_sum[x];
            mn[x] = (float)ix->tail_sq[x];
        }
        int64_t u0 = now + 1 - ix->ring_len > start ? now + 1 - ix->ring_len : start;
        for (int64_t u = u0; u < t; u++) {
            const float *k = ring_key(ix, u);
            for (int64_t x = 0; x < Hkv * d; x++) {
                out[x] = k[x] > out[x] ? k[x] : out[x];
                mn[x] = k[x] < mn[x] ? k[x] : mn[x];
            }
        }
        reset_range(ix);
        ix->decided[c] = now;
        ix->n_chunks = c + 1;
        ix->starts[c + 1] = t;
        return DHSA_OK;
    }
    double *later = ix->later, *later_sq = ix->later_sq;
    memset(later, 0, (size_t)(Hkv * d) * sizeof(double));
    if (later_sq) memset(later_sq, 0, (size_t)(Hkv * d) * sizeof(double));
    for (int64_t u = t; u <= now; u++) {
        const float *k = ring_key(ix, u);
        for (int64_t x = 0; x < Hkv * d; x++) later[x] += k[x];
        if (later_sq)
            for (int64_t x = 0; x < Hkv * d; x++) later_sq[x] += (double)k[x] * k[x];
    }
    if (ix->spread) { /* MOMENTS: mean and variance (sums in double) */
        float *var = ix->spread + c * Hkv * d;
        for (int64_t x = 0; x < Hkv * d; x++) {
            double m = (ix->tail_sum[x] - later[x]) / (double)n, v = (ix->tail_sq[x] - later_sq[x]) / (double)n - m * m;
            out[x] = (float)m;
            var[x] = (float)(v > 0.0 ? v : 0.0);
            ix->tail_sum[x] = later[x];
            ix->tail_sq[x] = later_sq[x];
        }
    } else {
        double norm = 1.0 / sqrt((double)n);
        for (int64_t x = 0; x < Hkv * d; x++) {
            out[x] = (float)((ix->tail_sum[x] - later[x]) * norm);
            ix->tail_sum[x] = later[x];
        }
    }
    ix->decided[c] = now;
    ix->n_chunks = c + 1;
    ix->starts[c + 1] = t;
    return DHSA_OK;
}

/* Score of key t (t >= 1): mean over heads of 1 - cos(mean of the keys
 * [t - w, t), k[t]). */
static float causal_score(const dhsa_kv_index *ix, int64_t t) {
    const int64_t w = ix->rp.sim_window < t ? ix->rp.sim_window : t, d = ix->d;
    double total = 0;
    for (int64_t g = 0; g < ix->Hkv; g++) {
        const float *kt = ring_key(ix, t) + g * d;
        double xy = 0, xx = 0, yy = 0;
        for (int64_t x = 0; x < d; x++) {
            double m = 0;
            for (int64_t u = t - w; u < t; u++) m += ring_key(ix, u)[g * d + x];
            xy += m * kt[x];
            xx += m * m;
            yy += (double)kt[x] * kt[x];
        }
        total += xx > 0 && yy > 0 ? 1.0 - xy / sqrt(xx * yy) : 0.0;
    }
    return (float)(total / (double)ix->Hkv);
}

/* Key `now` has just entered the ring and the tail sum: decide. learned:
 * LEARNED, the probability of candidate now - delay (0 before key w). */
static dhsa_status step(dhsa_kv_index *ix, int64_t now, float learned) {
    const dhsa_router_params *rp = &ix->rp;
    int64_t open = ix->starts[ix->n_chunks];
    if (rp->boundary == DHSA_BOUNDARY_FIXED) {
        if (now + 1 - open == rp->chunk) return close_chunk(ix, now + 1, now);
        return DHSA_OK;
    }
    int64_t s = now - ix->delay; /* the newest candidate whose score is final */
    if (s < 0) return DHSA_OK;
    float score = 0.0f;
    if (s >= 1) score = ix->pr ? learned : causal_score(ix, now);
    if (s >= 1) ix->score_hist[s] = score;
    int64_t cut = dhsa__decide(&ix->dc, open, s, score);
    return cut >= 0 ? close_chunk(ix, cut, now) : DHSA_OK;
}

/* LEARNED: keys [j0, j0 + np) of k (np <= PIECE), about to be appended at
 * positions len ..: their rows go into px/pq/pk/pv after the hist rows
 * kept, and pz[r] gets the probability of candidate len + r - delay, whose
 * window is rows [r, r + 2w) (0 for a candidate before position 1). */
static void learned_piece(dhsa_kv_index *ix, const dhsa_tensor *k, int64_t j0, int64_t np) {
    const dhsa_predictor *pr = ix->pr;
    const int64_t C = ix->Hkv * ix->d, F = 4 * C + 1, w = dhsa_predictor_window(pr), h = ix->hist;
    const dhsa_attn_kernels *kern = dhsa__attn_kernels();
    dhsa__predictor_window_fn window = dhsa__predictor_window_kernel(dhsa_active_isa());
    for (int64_t r = 0; r < np; r++) {
        float *x = ix->px + (h + r) * C;
        for (int64_t g = 0; g < ix->Hkv; g++) {
            const void *row = dhsa__at(k, 0, g, j0 + r);
            for (int64_t c = 0; c < ix->d; c++) x[g * ix->d + c] = dhsa__load(row, k->type, c * k->stride[3]);
        }
    }
    dhsa__predictor_project(pr, kern, ix->px + h * C, np, ix->pq + h * C, ix->pk + h * C, ix->pv + h * C, ix->ppn);
    int64_t r0 = w - ix->len > 0 ? w - ix->len : 0; /* candidates >= 1 only */
    if (r0 > np) r0 = np;
    for (int64_t r = 0; r < r0; r++) ix->pz[r] = 0.0f;
    for (int64_t r = r0; r < np; r++)
        window(pr, ix->px + r * C, ix->pq + r * C, ix->pk + r * C, ix->pv + r * C, ix->pws, ix->pfe + r * F);
    if (r0 < np) dhsa__predictor_mlp(pr, kern, ix->pfe + r0 * F, np - r0, ix->ppn, ix->pz + r0);
    for (int64_t r = r0; r < np; r++) ix->pz[r] = dhsa__predictor_prob(ix->pz[r]);
}

/* LEARNED, after a piece of np keys: keep the last hist rows. */
static void learned_shift(dhsa_kv_index *ix, int64_t np) {
    const size_t C = (size_t)(ix->Hkv * ix->d), bytes = (size_t)ix->hist * C * sizeof(float);
    float *buf[4] = {ix->px, ix->pq, ix->pk, ix->pv};
    for (int i = 0; i < 4; i++) memmove(buf[i], buf[i] + (size_t)np * C, bytes);
}

static dhsa_status busy(void) {
    return dhsa__fail(DHSA_ERR_BUSY, "the decode index is in use by another thread: an append may not overlap "
                      "any other call on the same index");
}

static dhsa_status append_keys(dhsa_kv_index *ix, const dhsa_tensor *k) {
    if (k->shape[0] != 1 || k->shape[1] != ix->Hkv || k->shape[3] != ix->d || k->shape[2] < 0)
        return dhsa__fail(DHSA_ERR_SHAPE, "keys are [%lld, %lld, %lld, %lld], the index wants [1, %lld, n, %lld]",
                          (long long)k->shape[0], (long long)k->shape[1], (long long)k->shape[2],
                          (long long)k->shape[3], (long long)ix->Hkv, (long long)ix->d);
    dhsa_status vst = dhsa__check_view_type("keys", k);
    if (vst) return vst;
    if (k->shape[2] > ix->capacity - ix->len)
        return dhsa__fail(DHSA_ERR_TOO_LARGE, "appending %lld keys to %lld exceeds the capacity %lld",
                          (long long)k->shape[2], (long long)ix->len, (long long)ix->capacity);
    const int64_t n = k->shape[2], piece = ix->pr ? PIECE : (n > 0 ? n : 1);
    for (int64_t j0 = 0; j0 < n; j0 += piece) {
        const int64_t np = n - j0 < piece ? n - j0 : piece;
        if (ix->pr) learned_piece(ix, k, j0, np);
        for (int64_t j = j0; j < j0 + np; j++) {
            int64_t t = ix->len;
            float *slot = ring_key(ix, t);
            if (ix->bound) { /* key t - ring_len leaves the ring: into the open chunk's range if it belongs */
                if (t - ix->ring_len >= 0 && t - ix->ring_len >= ix->starts[ix->n_chunks]) fold_range(ix, slot);
                for (int64_t g = 0; g < ix->Hkv; g++) {
                    const void *row = dhsa__at(k, 0, g, j);
                    for (int64_t x = 0; x < ix->d; x++) slot[g * ix->d + x] = dhsa__load(row, k->type, x * k->stride[3]);
                }
            } else
            for (int64_t g = 0; g < ix->Hkv; g++) {
                const void *row = dhsa__at(k, 0, g, j);
                for (int64_t x = 0; x < ix->d; x++) {
                    float v = dhsa__load(row, k->type, x * k->stride[3]);
                    slot[g * ix->d + x] = v;
                    ix->tail_sum[g * ix->d + x] += v;
                    if (ix->tail_sq) ix->tail_sq[g * ix->d + x] += (double)v * v;
                }
            }
            if (t < ix->sink_n) memcpy(ix->sinkk + (size_t)t * (size_t)(ix->Hkv * ix->d), slot,
                                       (size_t)(ix->Hkv * ix->d) * sizeof(float));
            ix->len = t + 1;
            dhsa_status st = step(ix, t, ix->pr ? ix->pz[j - j0] : 0.0f);
            if (st) return st;
        }
        if (ix->pr) learned_shift(ix, np);
    }
    return DHSA_OK;
}

dhsa_status dhsa_kv_index_append(dhsa_kv_index *ix, const dhsa_tensor *k) {
    if (!ix || !k || !k->data) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_kv_index_append: NULL argument");
    int idle = 0;
    if (!atomic_compare_exchange_strong(&ix->users, &idle, -1)) return busy();
    ix->append_from = ix->len;
    dhsa_status st = append_keys(ix, k);
    atomic_store(&ix->users, 0);
    return st;
}

void dhsa__kv_index_mark(dhsa_kv_index *ix) { ix->mark_len = ix->len; }

/* Key t of k [1, Hkv, n, d] into row [Hkv][d]. */
static void load_key(const dhsa_kv_index *ix, const dhsa_tensor *k, int64_t t, float *row) {
    for (int64_t g = 0; g < ix->Hkv; g++) {
        const void *src = dhsa__at(k, 0, g, t);
        for (int64_t x = 0; x < ix->d; x++) row[g * ix->d + x] = dhsa__load(src, k->type, x * k->stride[3]);
    }
}

/* The index as it was after its first n keys (the rule at the top of the
 * file); k [1, Hkv, >= n, d] holds them. Checked by the callers. */
static void truncate_keys(dhsa_kv_index *ix, const dhsa_tensor *k, int64_t n) {
    const int64_t hd = ix->Hkv * ix->d;
    /* the chunks decided before key n arrived; decided[] only grows */
    int64_t nc = ix->n_chunks;
    while (nc > 0 && ix->decided[nc - 1] >= n) nc--;
    ix->n_chunks = nc; /* starts[nc], the open chunk's start, was set when chunk nc - 1 closed */
    ix->len = n;
    for (int64_t t = n; t < ix->sink_n; t++) memset(ix->sinkk + t * hd, 0, (size_t)hd * sizeof(float));
    const int64_t open = ix->starts[nc];
    if (ix->rp.boundary != DHSA_BOUNDARY_FIXED) { /* candidates 1 .. n - 1 - delay had their scores */
        dhsa__decider *dc = &ix->dc;
        dc->s_n = dc->s_mean = dc->s_m2 = 0;
        memset(dc->score, 0, (size_t)dc->score_size * sizeof(float));
        for (int64_t s = 1; s <= n - 1 - ix->delay; s++) dhsa__decider_record(dc, s, ix->score_hist[s]);
    }
    /* the ring: keys n - ring_len .. n - 1, zero where an index of n keys
     * has written none */
    for (int64_t t = n - ix->ring_len > 0 ? n - ix->ring_len : 0; t < n; t++) load_key(ix, k, t, ring_key(ix, t));
    for (int64_t t = n; t < ix->ring_len; t++) memset(ring_key(ix, t), 0, (size_t)hd * sizeof(float));
    /* the open chunk's sums, from zero in key order as the appends and
     * close_chunk added them */
    memset(ix->tail_sum, 0, (size_t)hd * sizeof(double));
    if (ix->tail_sq) memset(ix->tail_sq, 0, (size_t)hd * sizeof(double));
    float *row = (float *)ix->later; /* close_chunk's scratch of hd doubles: room for a key */
    if (ix->bound) { /* the range of the open chunk's keys no longer in the ring */
        reset_range(ix);
        for (int64_t t = open; t < n - ix->ring_len; t++) {
            load_key(ix, k, t, row);
            fold_range(ix, row);
        }
    }
    for (int64_t t = open; t < n && !ix->bound; t++) {
        load_key(ix, k, t, row);
        for (int64_t x = 0; x < hd; x++) {
            ix->tail_sum[x] += row[x];
            if (ix->tail_sq) ix->tail_sq[x] += (double)row[x] * row[x];
        }
    }
    memset(ix->later, 0, (size_t)hd * sizeof(double));
    if (ix->later_sq) memset(ix->later_sq, 0, (size_t)hd * sizeof(double));
    if (ix->pr) { /* rows of the keys n - hist .. n - 1, zero keys before 0 */
        for (int64_t i = 0; i < ix->hist; i++) {
            int64_t t = n - ix->hist + i;
            if (t >= 0)
                load_key(ix, k, t, ix->px + i * hd);
            else
                memset(ix->px + i * hd, 0, (size_t)hd * sizeof(float));
        }
        dhsa__predictor_project(ix->pr, dhsa__attn_kernels(), ix->px, ix->hist, ix->pq, ix->pk, ix->pv, ix->ppn);
    }
}

static dhsa_status check_keys(const dhsa_kv_index *ix, const dhsa_tensor *k, int64_t n, const char *fn) {
    if (!k || !k->data) return dhsa__fail(DHSA_ERR_INVALID_ARG, "%s: the keys are NULL", fn);
    if (k->shape[0] != 1 || k->shape[1] != ix->Hkv || k->shape[3] != ix->d || k->shape[2] < n)
        return dhsa__fail(DHSA_ERR_SHAPE, "%s to %lld keys: keys are [%lld, %lld, %lld, %lld], it needs [1, %lld, "
                          ">= %lld, %lld] (the keys the index was given)", fn, (long long)n, (long long)k->shape[0],
                          (long long)k->shape[1], (long long)k->shape[2], (long long)k->shape[3], (long long)ix->Hkv,
                          (long long)n, (long long)ix->d);
    return dhsa__check_view_type("keys", k);
}

dhsa_status dhsa_kv_index_truncate(dhsa_kv_index *ix, const dhsa_tensor *k, int64_t n) {
    if (!ix) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_kv_index_truncate: NULL index");
    if (n < 0 || n > ix->len)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_kv_index_truncate: %lld keys asked, the index holds %lld",
                          (long long)n, (long long)ix->len);
    dhsa_status st = check_keys(ix, k, n, "dhsa_kv_index_truncate");
    if (st) return st;
    int idle = 0;
    if (!atomic_compare_exchange_strong(&ix->users, &idle, -1)) return busy();
    if (n < ix->len) truncate_keys(ix, k, n);
    atomic_store(&ix->users, 0);
    return DHSA_OK;
}

dhsa_status dhsa__kv_index_rewind(dhsa_kv_index *ix, const dhsa_tensor *k) {
    if (ix->mark_len > ix->len || check_keys(ix, k, ix->mark_len, "rewinding the decode index"))
        return dhsa__fail(DHSA_ERR_INTERNAL, "rewinding the decode index to %lld keys needs them",
                          (long long)ix->mark_len);
    truncate_keys(ix, k, ix->mark_len);
    return DHSA_OK;
}

static int differ(const void *x, const void *y, size_t bytes, const char *what, int64_t at, char *why, size_t cap) {
    if (memcmp(x, y, bytes) == 0) return 0;
    if (why && cap) snprintf(why, cap, "%s differ (at %lld)", what, (long long)at);
    return 1;
}

int dhsa__kv_index_diff(const dhsa_kv_index *a, const dhsa_kv_index *b, char *why, size_t cap) {
    if (why && cap) why[0] = 0;
    if (a->Hkv != b->Hkv || a->d != b->d || a->ring_len != b->ring_len || a->dc.score_size != b->dc.score_size ||
        a->rp.boundary != b->rp.boundary || a->rp.score_mode != b->rp.score_mode || a->hist != b->hist) {
        if (why && cap) snprintf(why, cap, "the indexes have different parameters");
        return 1;
    }
    if (a->len != b->len || a->n_chunks != b->n_chunks) {
        if (why && cap)
            snprintf(why, cap, "length %lld vs %lld, closed chunks %lld vs %lld", (long long)a->len,
                     (long long)b->len, (long long)a->n_chunks, (long long)b->n_chunks);
        return 1;
    }
    const size_t hd = (size_t)(a->Hkv * a->d), nc = (size_t)a->n_chunks;
    int spread = a->spread != NULL, sq = a->tail_sq != NULL;
    if (differ(a->starts, b->starts, (nc + 1) * 8, "chunk starts", 0, why, cap) ||
        differ(a->decided, b->decided, nc * 8, "chunk decisions", 0, why, cap) ||
        differ(a->pooled, b->pooled, nc * hd * 4, "pooled keys", 0, why, cap) ||
        (spread && differ(a->spread, b->spread, nc * hd * 4, "chunk spreads", 0, why, cap)) ||
        differ(a->tail_sum, b->tail_sum, hd * 8, "open chunk sums", a->starts[nc], why, cap) ||
        (sq && differ(a->tail_sq, b->tail_sq, hd * 8, "open chunk squares", a->starts[nc], why, cap)) ||
        differ(a->ring, b->ring, (size_t)a->ring_len * hd * 4, "rings of recent keys", a->len, why, cap) ||
        differ(a->dc.score, b->dc.score, (size_t)a->dc.score_size * 4, "score rings", a->len, why, cap) ||
        differ(&a->dc.s_n, &b->dc.s_n, 8, "score counts", a->len, why, cap) ||
        differ(&a->dc.s_mean, &b->dc.s_mean, 8, "score means", a->len, why, cap) ||
        differ(&a->dc.s_m2, &b->dc.s_m2, 8, "score variances", a->len, why, cap))
        return 1;
    if (a->sink_n != b->sink_n ||
        (a->sink_n && differ(a->sinkk, b->sinkk, (size_t)a->sink_n * hd * 4, "kept first keys (sinks)", 0, why, cap)))
        return 1;
    /* the scores of the candidates an index of len keys has scored */
    int64_t last = a->len - 1 - a->delay;
    if (a->rp.boundary != DHSA_BOUNDARY_FIXED && last >= 1 &&
        differ(a->score_hist + 1, b->score_hist + 1, (size_t)last * 4, "kept scores", last, why, cap))
        return 1;
    if (a->pr) {
        const size_t rows = (size_t)a->hist * hd * 4;
        if (differ(a->px, b->px, rows, "predictor keys", a->len, why, cap) ||
            differ(a->pq, b->pq, rows, "predictor Q rows", a->len, why, cap) ||
            differ(a->pk, b->pk, rows, "predictor K rows", a->len, why, cap) ||
            differ(a->pv, b->pv, rows, "predictor V rows", a->len, why, cap))
            return 1;
    }
    return 0;
}

/* qp[x] += q[x] and qp[d + x] += q[x]^2 over the rows [r0, r1) of query
 * head h, row by row. */
static void add_rows(const dhsa_attn_desc *a, int64_t h, int64_t r0, int64_t r1, int64_t d, float *qp) {
    for (int64_t r = r0; r < r1; r++) {
        const void *q = dhsa__at(&a->q, 0, h, r);
        for (int64_t x = 0; x < d; x++) {
            float v = dhsa__load(q, a->q.type, x * a->q.stride[3]);
            qp[x] += v;
            qp[d + x] += v * v;
        }
    }
}

/* HEADS and BOUND (route.c heads_scores, the same estimates): sc[c] for the visible
 * chunks = log of the sum over query heads [h0, h1) of the share of head
 * h's estimated attention that one key of chunk c holds. qp [2d] and eh
 * [visible] are scratch. */
static void heads_scores(const dhsa_kv_index *ix, const dhsa_attn_desc *a, int64_t G, double scale, int64_t h0,
                         int64_t h1, int64_t r0, int64_t r1, int64_t visible, float *qp, double *eh, float *sc) {
    const int64_t d = ix->d, Hkv = ix->Hkv;
    for (int64_t c = 0; c < visible; c++) sc[c] = -INFINITY;
    for (int64_t h = h0; h < h1; h++) {
        const int64_t g = h / G;
        for (int64_t x = 0; x < 2 * d; x++) qp[x] = 0.0f;
        add_rows(a, h, r0, r1, d, qp);
        double rows = (double)(r1 - r0);
        float n1 = (float)(scale / rows), n2 = (float)(0.5 * scale * scale / rows);
        for (int64_t x = 0; x < d; x++) {
            qp[x] *= n1;
            qp[d + x] *= n2;
            if (ix->bound) { /* [s q+, s q-] against [max, min] */
                qp[d + x] = qp[x] < 0.0f ? qp[x] : 0.0f;
                qp[x] = qp[x] > 0.0f ? qp[x] : 0.0f;
            }
        }
        double m = -INFINITY, z = 0;
        for (int64_t c = 0; c < visible; c++) {
            eh[c] = dot_f64(qp, ix->pooled + (c * Hkv + g) * d, d);
            double v = dot_f64(qp + d, ix->spread + (c * Hkv + g) * d, d);
            eh[c] += ix->bound ? v : dhsa__var_term(v, ix->starts[c + 1] - ix->starts[c]);
            m = eh[c] > m ? eh[c] : m;
        }
        if (!(m > -INFINITY)) continue;
        for (int64_t c = 0; c < visible; c++)
            z += (ix->bound ? 1.0 : (double)(ix->starts[c + 1] - ix->starts[c])) * exp(eh[c] - m);
        double lz = m + log(z);
        for (int64_t c = 0; c < visible; c++) {
            double e = eh[c] - lz, s = (double)sc[c], top = s > e ? s : e;
            sc[c] = (float)(top + log(exp(s - top) + exp(e - top)));
        }
    }
}

/* MOMENTS and POOLED: sc[c] for the visible chunks from the block's rows
 * [r0, r1) and query heads [h0, h1) against KV heads [k0, k1). qp [2d] is
 * scratch. */
static void pooled_scores(const dhsa_kv_index *ix, const dhsa_attn_desc *a, double scale, int moments, int64_t h0,
                          int64_t h1, int64_t k0, int64_t k1, int64_t r0, int64_t r1, int64_t visible, float *qp,
                          float *sc) {
    const int64_t d = ix->d, Hkv = ix->Hkv;
    /* pooled query of the block: POOLED, the rows' sum / sqrt(rows)
     * averaged over heads; MOMENTS, qp[x] = scale x the mean row and
     * qp[d + x] = scale^2 / 2 x the mean of the rows' squares (as in
     * route.c) */
    for (int64_t x = 0; x < 2 * d; x++) qp[x] = 0.0f;
    for (int64_t h = h0; h < h1; h++) add_rows(a, h, r0, r1, d, qp);
    double rows = (double)(r1 - r0), hq = (double)(h1 - h0);
    float norm = (float)(1.0 / (sqrt(rows) * hq)); /* POOLED: applied to the score */
    if (moments) {
        float n1 = (float)(scale / (rows * hq)), n2 = (float)(0.5 * scale * scale / (rows * hq));
        for (int64_t x = 0; x < d; x++) {
            qp[x] *= n1;
            qp[d + x] *= n2;
        }
    }
    /* score = mean over the KV heads routed together of qp . pooled
     * (MOMENTS: + the capped variance term of the mean of qp[d..] . spread,
     * dhsa__var_term, as route.c caps the heads' averaged variance) */
    for (int64_t c = 0; c < visible; c++) {
        double s = 0, v = 0;
        for (int64_t gg = k0; gg < k1; gg++) {
            s += dot_f64(qp, ix->pooled + (c * Hkv + gg) * d, d);
            if (moments) v += dot_f64(qp + d, ix->spread + (c * Hkv + gg) * d, d);
        }
        s /= (double)(k1 - k0);
        if (moments) s += dhsa__var_term(v / (double)(k1 - k0), ix->starts[c + 1] - ix->starts[c]);
        sc[c] = (float)(moments ? s : s * norm);
    }
}

/* agg[c] <- log(exp(agg[c]) + w[c]) for the visible chunks, w[c] the
 * block's estimated attention weight per key of chunk c: a softmax of its
 * scores weighted by the chunks' lengths (MOMENTS scores a key's mean log
 * weight; HEADS and BOUND a head's share per key, renormalised here to
 * the mean over the group's heads). In the log domain, so that a chunk
 * far below the others still counts as visible (finite). */
static void add_shares(const dhsa_kv_index *ix, const float *sc, int64_t visible, double *agg) {
    double m = -INFINITY, z = 0;
    for (int64_t c = 0; c < visible; c++) m = sc[c] > m ? sc[c] : m;
    if (!(m > -INFINITY)) return;
    for (int64_t c = 0; c < visible; c++) z += (double)(ix->starts[c + 1] - ix->starts[c]) * exp((double)sc[c] - m);
    const double lz = m + log(z);
    for (int64_t c = 0; c < visible; c++) {
        double e = (double)sc[c] - lz, s = agg[c], top = s > e ? s : e;
        if (top > -INFINITY) agg[c] = top + log(exp(s - top) + exp(e - top));
    }
}

/* Exact ranking: each row's mass per chunk (dhsa__exact_mass), one task
 * per KV group and row, so every thread works even with one KV head. */
typedef struct {
    const dhsa_attn_desc *a;
    const int64_t *starts;
    int64_t nc, Lq;
    double *mass; /* [Hkv][Lq][nc + 1] */
    atomic_int failed; /* a task ran out of memory */
} exact_job;

static void exact_task(void *arg, int64_t task, int thread) {
    exact_job *j = arg;
    (void)thread;
    const int64_t g = task / j->Lq, r = task % j->Lq;
    if (dhsa__exact_mass(j->a, g, r, r + 1, j->starts, j->nc, j->mass + (size_t)task * (size_t)(j->nc + 1)))
        atomic_store(&j->failed, 1);
}

/* Checks a call that gives only q and k (what routing reads): *dd is a
 * with v and o shaped from k and q, no lse or layout, as the attention's
 * check wants a full call; *p its sizes. */
static dhsa_status qk_check(const dhsa_attn_desc *a, dhsa_attn_desc *dd, dhsa__attn_problem *p) {
    *dd = *a;
    dd->v = a->k;
    dd->o = a->q;
    dd->o.shape[3] = a->k.shape[3];
    dd->lse.data = NULL;
    dd->layout = NULL;
    return dhsa__attn_check(dd, p);
}

/* dhsa_kv_index_route, and dhsa__kv_index_route_masked with allowed / agg
 * (kv_index_internal.h). */
/* ext (NULL: none): the blocks from row ext_from (a block's start) on rank
 * by ext[(g ext_gstride + qb - ext_from / q_block) (n_chunks + 1) + c], a
 * mass worked out by the caller (dhsa__kv_index_route_mass). */
typedef struct {
    int64_t from, gstride;
    const double *mass;
} ext_mass;

static dhsa_status route_index(dhsa_ctx *ctx, const dhsa_kv_index *ix, const dhsa_attn_desc *a,
                               const unsigned char *allowed, double *agg, const int64_t *keep, int exact,
                               const ext_mass *ext, dhsa_layout **out) {
    if (!a->causal) return dhsa__fail(DHSA_ERR_UNSUPPORTED, "the decode index routes causal attention only");
    dhsa_attn_desc dd;
    dhsa__attn_problem p;
    dhsa_status st = qk_check(a, &dd, &p);
    if (st) return st;
    if (p.B != 1 || p.Hkv != ix->Hkv || p.d != ix->d || p.Lk != ix->len)
        return dhsa__fail(DHSA_ERR_SHAPE,
                          "the index holds %lld keys of [1, %lld, *, %lld]; the call has B=%lld Hkv=%lld "
                          "Lk=%lld d=%lld",
                          (long long)ix->len, (long long)ix->Hkv, (long long)ix->d, (long long)p.B,
                          (long long)p.Hkv, (long long)p.Lk, (long long)p.d);
    const dhsa_router_params *rp = &ix->rp;
    int64_t min_len, max_chunks, max_ranges;
    dhsa__route_limits(rp, p.Lk, &min_len, &max_chunks, &max_ranges);
    /* chunks closed at max_chunk can be shorter than the split pieces the
     * whole-sequence router assumes: size by the index's own count */
    if (max_ranges > ix->n_chunks + 4 && p.Lk >= rp->dense_below) max_ranges = ix->n_chunks + 4;
    dhsa_layout *lay;
    st = dhsa_layout_create(ctx, 1, p.Hkv, p.Lq, p.Lk, rp->q_block, max_ranges, &lay);
    if (st) return st;
    lay->q_pos0 = a->q_pos0;
    lay->causal = 1;
    lay->window = a->window;
    const int64_t d = p.d, nc = ix->n_chunks, n_qb = (p.Lq + rp->q_block - 1) / rp->q_block;
    const int moments = rp->score_mode == DHSA_SCORE_MOMENTS,
              heads_mode = rp->score_mode == DHSA_SCORE_HEADS || rp->score_mode == DHSA_SCORE_BOUND;
    const int rows_mode = rp->score_mode == DHSA_SCORE_ROWS;
    float *qp = malloc((size_t)(rows_mode ? 64 * d : 2 * d) * sizeof(float));
    float *sc = malloc((size_t)(nc + 1) * sizeof(float));
    double *eh = heads_mode || rows_mode ? malloc((size_t)(nc + 1) * sizeof(double)) : NULL;
    float *tile = rows_mode ? malloc((size_t)(nc + 1) * 64 * sizeof(float)) : NULL;
    int64_t *order = malloc((size_t)(nc + 1) * sizeof(int64_t));
    double *mass = exact ? malloc((size_t)(p.Hkv * p.Lq) * (size_t)(nc + 1) * sizeof(double)) : NULL;
    int64_t *rg = malloc((size_t)(max_ranges + 8) * 2 * sizeof(int64_t));
    const int picks = dhsa__sink_picked(rp);
    float *sbuf = picks ? malloc((size_t)(2 * d + rp->sink_window) * sizeof(float)) : NULL;
    int64_t *srank = picks ? malloc((size_t)rp->sink_window * sizeof(int64_t)) : NULL;
    if (!qp || !sc || !order || !rg || ((heads_mode || rows_mode) && !eh) || (rows_mode && !tile) ||
        (picks && (!sbuf || !srank)) || (exact && !mass)) {
        free(mass);
        free(sbuf);
        free(srank);
        free(tile);
        free(eh);
        free(qp);
        free(sc);
        free(order);
        free(rg);
        dhsa_layout_free(lay);
        return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory routing with the index");
    }
    if (exact) {
        dhsa_attn_desc ax = *a; /* the scale the attention applies: 0 = 1/sqrt(d) */
        if (!(ax.scale > 0)) ax.scale = 1.0f / sqrtf((float)p.d);
        exact_job ej = {&ax, ix->starts, nc, p.Lq, mass, 0};
        dhsa_parallel_for(ctx, p.Hkv * p.Lq, exact_task, &ej);
        if (atomic_load(&ej.failed)) st = dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory ranking chunks by their exact attention");
    }
    int64_t heads = rp->share_heads ? 1 : p.Hkv;
    for (int64_t g = 0; g < heads && !st; g++) {
        int64_t h0 = rp->share_heads ? 0 : g * p.G, h1 = rp->share_heads ? p.Hq : (g + 1) * p.G;
        int64_t k0 = rp->share_heads ? 0 : g, k1 = rp->share_heads ? p.Hkv : g + 1;
        for (int64_t qb = 0; qb < n_qb; qb++) {
            int64_t r0 = qb * rp->q_block, r1 = r0 + rp->q_block < p.Lq ? r0 + rp->q_block : p.Lq;
            int64_t last = a->q_pos0 + r1 - 1;
            /* chunks this block may know: closed at or before its last position */
            int64_t visible = nc;
            while (visible > 0 && ix->decided[visible - 1] > last) visible--;
            if (ext && r0 >= ext->from) {
                const double *em = ext->mass + (size_t)(g * ext->gstride + qb - ext->from / rp->q_block) * (size_t)(nc + 1);
                for (int64_t c = 0; c < visible; c++) sc[c] = (float)em[c];
            } else if (exact) { /* the block's mean over its rows of their true mass per chunk */
                for (int64_t c = 0; c < visible; c++) {
                    double m = 0;
                    for (int64_t r = r0; r < r1; r++) m += mass[(size_t)(g * p.Lq + r) * (size_t)(nc + 1) + (size_t)c];
                    sc[c] = (float)(m / (double)(r1 - r0));
                }
            } else if (rows_mode)
                dhsa__rows_scores(a, 0, h0, h1, r0, r1, rp, p.scale, ix->pooled + g * d, ix->Hkv * d, ix->starts, 0,
                                  visible, qp, tile, eh, sc, 1);
            else if (heads_mode) heads_scores(ix, a, p.G, p.scale, h0, h1, r0, r1, visible, qp, eh, sc);
            else pooled_scores(ix, a, p.scale, moments, h0, h1, k0, k1, r0, r1, visible, qp, sc);
            if (agg) add_shares(ix, sc, visible, agg + g * nc);
            /* carried chunks first, in their order, then the chunk after
             * each (a copy reads on into it; include/dhsa/route.h):
             * distinct finite scores above any estimate */
            for (int64_t i = 0; keep && i < DHSA_CARRY_MAX; i++) {
                int64_t c = keep[g * DHSA_CARRY_MAX + i];
                if (c >= 0 && c < visible) sc[c] = 1e30f * (float)(2 * DHSA_CARRY_MAX + 1 - i);
            }
            for (int64_t i = 0; keep && i < DHSA_CARRY_MAX; i++) {
                int64_t c = keep[g * DHSA_CARRY_MAX + i] + 1;
                if (c >= 1 && c < visible && sc[c] < 1e30f) sc[c] = 1e30f * (float)(DHSA_CARRY_MAX + 1 - i);
            }
            int64_t alo, ahi;
            dhsa__block_span(a, p.Lk, r0, r1, &alo, &ahi);
            int dense;
            int64_t n_rank = 0;
            if (picks) {
                int64_t w = ahi - alo < rp->sink_window ? ahi - alo : rp->sink_window;
                const float *kr = alo + w <= ix->sink_n ? ix->sinkk + (size_t)k0 * (size_t)d : NULL;
                n_rank = dhsa__rank_sinks(rp, a, 0, k0, h0, h1, r0, r1, alo, ahi, kr, ix->Hkv * d, sbuf, srank);
            }
            /* keys after the last visible chunk (the open tail, and chunks
             * closed after this block) are always read */
            int64_t n = dhsa__select_ranges(rp, max_ranges, min_len, p.Lk, alo, ahi, a->q_pos0 + r0, last + 1,
                                            ix->starts, visible, sc, 1, ix->starts[visible],
                                            allowed ? allowed + g * nc : NULL, srank, n_rank, 1, order, rg, &dense);
            lay->dense_blocks += rp->share_heads ? dense * p.Hkv : dense;
            st = dhsa_layout_set(lay, 0, g, qb, rg, n);
            if (st) break;
        }
        if (st) break;
    }
    if (!st && rp->share_heads)
        for (int64_t g = 1; g < p.Hkv && !st; g++)
            for (int64_t qb = 0; qb < n_qb && !st; qb++) {
                const int64_t *r;
                int64_t n;
                dhsa_layout_get(lay, 0, 0, qb, &r, &n);
                st = dhsa_layout_set(lay, 0, g, qb, r, n);
            }
    lay->chunks = nc;
    if (nc) {
        lay->chunk_min = INT64_MAX;
        for (int64_t c = 0; c < nc; c++) {
            int64_t l = ix->starts[c + 1] - ix->starts[c];
            if (l < lay->chunk_min) lay->chunk_min = l;
            if (l > lay->chunk_max) lay->chunk_max = l;
        }
        lay->chunk_mean = (double)ix->starts[nc] / (double)nc;
    }
    free(mass);
    free(sbuf);
    free(srank);
    free(tile);
    free(eh);
    free(qp);
    free(sc);
    free(order);
    free(rg);
    if (st) {
        dhsa_layout_free(lay);
        return st;
    }
    *out = lay;
    return DHSA_OK;
}

/* Routes only read the index: they may overlap each other, not an append. */
static dhsa_status read_begin(const dhsa_kv_index *ix) {
    atomic_int *users = (atomic_int *)&ix->users;
    int v = atomic_load(users);
    do {
        if (v < 0) return busy();
    } while (!atomic_compare_exchange_weak(users, &v, v + 1));
    return DHSA_OK;
}

static void read_end(const dhsa_kv_index *ix) { atomic_fetch_sub((atomic_int *)&ix->users, 1); }

static dhsa_status route_shared(dhsa_ctx *ctx, const dhsa_kv_index *ix, const dhsa_attn_desc *a,
                                const unsigned char *allowed, double *agg, const int64_t *keep, int exact,
                                const ext_mass *ext, dhsa_layout **out) {
    dhsa_status st = read_begin(ix);
    if (st) return st;
    st = route_index(ctx, ix, a, allowed, agg, keep, exact, ext, out);
    read_end(ix);
    return st;
}

dhsa_status dhsa_kv_index_route(dhsa_ctx *ctx, const dhsa_kv_index *ix, const dhsa_attn_desc *a,
                                dhsa_layout **out) {
    if (!ctx || !ix || !a || !out) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_kv_index_route: NULL argument");
    *out = NULL;
    return route_shared(ctx, ix, a, NULL, NULL, NULL, 0, NULL, out);
}

dhsa_status dhsa_kv_index_route_keep(dhsa_ctx *ctx, const dhsa_kv_index *ix, const dhsa_attn_desc *a,
                                     const int64_t *keep, dhsa_layout **out) {
    if (!ctx || !ix || !a || !out) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_kv_index_route_keep: NULL argument");
    *out = NULL;
    return route_shared(ctx, ix, a, NULL, NULL, keep, 0, NULL, out);
}

dhsa_status dhsa_kv_index_carry(const dhsa_kv_index *ix, const dhsa_attn_desc *a, const dhsa_layout *lay,
                                double share, int64_t *out) {
    if (!ix || !a || !lay || !out) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_kv_index_carry: NULL argument");
    if (!(share >= 0 && share <= 1))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_kv_index_carry: share %g is not in [0, 1]", share);
    if (ix->rp.share_heads)
        return dhsa__fail(DHSA_ERR_UNSUPPORTED, "dhsa_kv_index_carry: chunks are carried per KV group (not "
                                                "share_heads)");
    if (a->key_bias || a->attn_mask.data || a->window > 0)
        return dhsa__fail(DHSA_ERR_UNSUPPORTED, "dhsa_kv_index_carry: a key bias, dense mask or window is not "
                                                "supported (a decode step of a global layer has none)");
    dhsa_attn_desc dd;
    dhsa__attn_problem p;
    dhsa_status st = qk_check(a, &dd, &p);
    if (st) return st;
    if (p.B != 1 || p.Lq != 1 || p.Hkv != ix->Hkv || p.d != ix->d || p.Lk != ix->len)
        return dhsa__fail(DHSA_ERR_SHAPE,
                          "dhsa_kv_index_carry: one row of one sequence over the index's %lld keys of "
                          "[1, %lld, *, %lld]; the call has B=%lld Lq=%lld Hkv=%lld Lk=%lld d=%lld",
                          (long long)ix->len, (long long)ix->Hkv, (long long)ix->d, (long long)p.B,
                          (long long)p.Lq, (long long)p.Hkv, (long long)p.Lk, (long long)p.d);
    if (lay->B != 1 || lay->Hkv != p.Hkv || lay->Lq != 1 || lay->Lk != p.Lk)
        return dhsa__fail(DHSA_ERR_SHAPE,
                          "dhsa_kv_index_carry: the layout is for B=%lld Hkv=%lld Lq=%lld Lk=%lld, the call "
                          "B=1 Hkv=%lld Lq=1 Lk=%lld",
                          (long long)lay->B, (long long)lay->Hkv, (long long)lay->Lq, (long long)lay->Lk,
                          (long long)p.Hkv, (long long)p.Lk);
    if (!(dd.scale > 0)) dd.scale = 1.0f / sqrtf((float)p.d);
    if ((st = read_begin(ix))) return st; /* reads the chunks: not during an append */
    st = dhsa__carry_chunks(&dd, lay, ix->starts, ix->n_chunks, share, out);
    read_end(ix);
    return st;
}

dhsa_status dhsa_kv_index_route_exact(dhsa_ctx *ctx, const dhsa_kv_index *ix, const dhsa_attn_desc *a,
                                      dhsa_layout **out) {
    if (!ctx || !ix || !a || !out)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_kv_index_route_exact: NULL argument");
    *out = NULL;
    if (ix->rp.share_heads)
        return dhsa__fail(DHSA_ERR_UNSUPPORTED, "exact chunk ranking routes each KV group alone (not share_heads)");
    return route_shared(ctx, ix, a, NULL, NULL, NULL, 1, NULL, out);
}

int64_t dhsa__kv_index_groups(const dhsa_kv_index *ix) { return ix->rp.share_heads ? 1 : ix->Hkv; }

dhsa_status dhsa__kv_index_route_masked(dhsa_ctx *ctx, const dhsa_kv_index *ix, const dhsa_attn_desc *a,
                                        const unsigned char *allowed, double *agg, dhsa_layout **out) {
    if (!ctx || !ix || !a || !out)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa__kv_index_route_masked: NULL argument");
    *out = NULL;
    return route_shared(ctx, ix, a, allowed, agg, NULL, 0, NULL, out);
}

/* ------------------------------------------------------------ delta --- */

/* Delta layout (kv_index_internal.h): int64 [len, n_chunks, c0, bound,
 * from], double [s_n, s_mean, s_m2], int64 starts[c0 .. n_chunks], int64
 * decided[c0 .. n_chunks), float pooled[n_new][hd], float spread[n_new][hd]
 * (when kept), double tail_sum[hd], double tail_sq[hd] (when kept), float
 * ring[ring_len][hd], float score[score_size], float kept scores of the
 * candidates the append from length `from` scored (truncation replays
 * them). */
/* The sink rows an append from length `from` wrote: [from, *t1). */
static int64_t new_sinks(const dhsa_kv_index *ix, int64_t from, int64_t *t1) {
    *t1 = ix->len < ix->sink_n ? ix->len : ix->sink_n;
    return *t1 > from ? *t1 - from : 0;
}

static void new_scores(const dhsa_kv_index *ix, int64_t from, int64_t *s0, int64_t *n) {
    const int64_t lo = from - ix->delay > 1 ? from - ix->delay : 1, hi = ix->len - 1 - ix->delay;
    *s0 = lo;
    *n = ix->rp.boundary != DHSA_BOUNDARY_FIXED && hi >= lo ? hi - lo + 1 : 0;
}

size_t dhsa__kv_index_delta_bytes(const dhsa_kv_index *ix, int64_t c0) {
    const size_t hd = (size_t)(ix->Hkv * ix->d), n_new = (size_t)(ix->n_chunks - c0);
    const int sp = ix->spread != NULL;
    int64_t s0, ns, t1;
    new_scores(ix, ix->append_from, &s0, &ns);
    const size_t nk = (size_t)new_sinks(ix, ix->append_from, &t1);
    return 5 * 8 + 3 * 8 + (n_new + 1) * 8 + n_new * 8 + n_new * hd * 4 * (sp ? 2 : 1) + hd * 8 * (sp ? 2 : 1) +
           (size_t)ix->ring_len * hd * 4 + (size_t)ix->dc.score_size * 4 + (size_t)ns * 4 + nk * hd * 4;
}

void dhsa__kv_index_delta_write(const dhsa_kv_index *ix, int64_t c0, void *buf) {
    const size_t hd = (size_t)(ix->Hkv * ix->d), n_new = (size_t)(ix->n_chunks - c0);
    char *p = buf;
    int64_t hdr[5] = {ix->len, ix->n_chunks, c0, ix->bound, ix->append_from}, s0, ns;
    new_scores(ix, ix->append_from, &s0, &ns);
    double st[3] = {ix->dc.s_n, ix->dc.s_mean, ix->dc.s_m2};
#define PUT(src, bytes)                 \
    do {                                \
        memcpy(p, (src), (bytes));      \
        p += (bytes);                   \
    } while (0)
    PUT(hdr, sizeof hdr);
    PUT(st, sizeof st);
    PUT(ix->starts + c0, (n_new + 1) * 8);
    PUT(ix->decided + c0, n_new * 8);
    PUT(ix->pooled + (size_t)c0 * hd, n_new * hd * 4);
    if (ix->spread) PUT(ix->spread + (size_t)c0 * hd, n_new * hd * 4);
    PUT(ix->tail_sum, hd * 8);
    if (ix->spread) PUT(ix->tail_sq, hd * 8);
    PUT(ix->ring, (size_t)ix->ring_len * hd * 4);
    PUT(ix->dc.score, (size_t)ix->dc.score_size * 4);
    PUT(ix->score_hist + s0, (size_t)ns * 4);
    int64_t t1, nk = new_sinks(ix, ix->append_from, &t1);
    if (nk) PUT(ix->sinkk + (size_t)(t1 - nk) * hd, (size_t)nk * hd * 4);
#undef PUT
}

dhsa_status dhsa__kv_index_delta_read(dhsa_kv_index *ix, const void *buf, size_t bytes) {
    const size_t hd = (size_t)(ix->Hkv * ix->d);
    const char *p = buf;
    int64_t hdr[5];
    if (bytes < sizeof hdr) return dhsa__fail(DHSA_ERR_INTERNAL, "routing-index delta of %zu bytes: truncated", bytes);
    memcpy(hdr, p, sizeof hdr);
    if (ix->dc.learned)
        return dhsa__fail(DHSA_ERR_UNSUPPORTED, "a routing-index delta does not carry LEARNED boundaries");
    if (hdr[2] != ix->n_chunks || hdr[1] < hdr[2] || hdr[1] > ix->max_chunks || hdr[0] < ix->len ||
        hdr[0] > ix->capacity || hdr[3] != ix->bound || hdr[4] != ix->len)
        return dhsa__fail(DHSA_ERR_INTERNAL,
                          "routing-index delta from chunk %lld to %lld at length %lld does not follow this index "
                          "(%lld chunks, length %lld): the ranks' indexes have diverged",
                          (long long)hdr[2], (long long)hdr[1], (long long)hdr[0], (long long)ix->n_chunks,
                          (long long)ix->len);
    const int64_t c0 = hdr[2], len0 = ix->len, from0 = ix->append_from;
    ix->n_chunks = hdr[1];
    ix->len = hdr[0];
    ix->append_from = hdr[4];
    const size_t want = dhsa__kv_index_delta_bytes(ix, c0);
    if (want != bytes) {
        ix->n_chunks = c0;
        ix->len = len0;
        ix->append_from = from0;
        return dhsa__fail(DHSA_ERR_INTERNAL, "routing-index delta of %zu bytes, %zu expected", bytes, want);
    }
    const size_t n_new = (size_t)(ix->n_chunks - c0);
    p += sizeof hdr;
    double st[3];
#define GET(dst, nb)                    \
    do {                                \
        memcpy((dst), p, (nb));         \
        p += (nb);                      \
    } while (0)
    GET(st, sizeof st);
    ix->dc.s_n = st[0];
    ix->dc.s_mean = st[1];
    ix->dc.s_m2 = st[2];
    GET(ix->starts + c0, (n_new + 1) * 8);
    GET(ix->decided + c0, n_new * 8);
    GET(ix->pooled + (size_t)c0 * hd, n_new * hd * 4);
    if (ix->spread) GET(ix->spread + (size_t)c0 * hd, n_new * hd * 4);
    GET(ix->tail_sum, hd * 8);
    if (ix->spread) GET(ix->tail_sq, hd * 8);
    GET(ix->ring, (size_t)ix->ring_len * hd * 4);
    GET(ix->dc.score, (size_t)ix->dc.score_size * 4);
    int64_t s0, ns;
    new_scores(ix, ix->append_from, &s0, &ns);
    GET(ix->score_hist + s0, (size_t)ns * 4);
    int64_t t1, nk = new_sinks(ix, ix->append_from, &t1);
    if (nk) GET(ix->sinkk + (size_t)(t1 - nk) * hd, (size_t)nk * hd * 4);
#undef GET
    return DHSA_OK;
}

dhsa_status dhsa__kv_index_route_mass(dhsa_ctx *ctx, const dhsa_kv_index *ix, const dhsa_attn_desc *a,
                                      const unsigned char *allowed, int64_t from, const double *mass,
                                      int64_t gstride, const int64_t *keep, dhsa_layout **out) {
    if (!ctx || !ix || !a || !out || !mass)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa__kv_index_route_mass: NULL argument");
    *out = NULL;
    if (ix->rp.share_heads)
        return dhsa__fail(DHSA_ERR_UNSUPPORTED, "exact chunk ranking routes each KV group alone (not share_heads)");
    if (from < 0 || from % ix->rp.q_block)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa__kv_index_route_mass: row %lld is not a query block's start",
                          (long long)from);
    const ext_mass e = {from, gstride, mass};
    return route_shared(ctx, ix, a, allowed, NULL, keep, 0, &e, out);
}
