/* select.c: selection, the second half of routing: per query block, the
 * keys it may see (dhsa__block_span), the sinks (the first keys, or those
 * ranked by the block's mean query), the local diagonal, then chunks in
 * score order until the budget is spent (dhsa__select_ranges), and the
 * ROWS chunk score. Shared by prefill routing (route.c) and the decode
 * index (kv_index.c), so that both select alike. Tested by
 * tests/test_route*.c and tests/test_kv_index*.c.
 */
#include "route/select.h"

#include <float.h>
#include <math.h>

#include "attn/kern.h"
#include "route/params.h"
#include "route/rows.h"

#define GROUP DHSA__SCORE_COLS

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

void dhsa__route_fixed_parts(const dhsa_router_params *rp, int64_t budget, int64_t *sink, int64_t *local) {
    *sink = rp->sink_tokens;
    *local = rp->local_tokens;
    if (!rp->scale_fixed) return;
    /* a block never loses its sink: below a budget of 8 keys, one sink
     * key stays (real models put most of an early row's attention on it;
     * without it a needle in the first rows is read wrongly, docs/dhsa.md
     * "A block never loses its sink") */
    if (*sink > budget / 8) *sink = budget / 8 > 0 ? budget / 8 : 1;
    if (*local > budget / 4) *local = budget / 4;
}

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
        for (int64_t r = r0; r < r1; r++) dhsa__add_row(qm, NULL, dhsa__row_f32(&a->q, b, h, r, d, row), d);
    for (int64_t j = 0; j < w; j++) {
        const float *k = kr ? kr + (alo + j) * ldk : dhsa__row_f32(&a->k, b, g, alo + j - a->k_pos0, d, row);
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

/* Selection for one query block (see the file comment and dhsa.h): the
 * block may see keys [alo, ahi) and sits at positions [pos0, pos1); chunks
 * c < nc are [starts[c], starts[c + 1]) with scores sc.s[c * sc.stride];
 * with allowed != NULL only the chunks with allowed[c] != 0 are candidates
 * (the sinks, the local keys and the tail are read all the same).
 * Writes up to max_ranges pairs to rg (unsorted, may overlap: the layout
 * normalises them); returns their count; *dense = 1 if the block is dense.
 * order has room for nc indices. */
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

/* DHSA_SCORE_ROWS (select.h): the scored rows' queries, scaled, go
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
