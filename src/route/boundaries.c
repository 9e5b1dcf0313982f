/* boundaries.c: chunking, the first half of routing: where the keys are
 * cut into chunks. FIXED every `chunk` keys; SIMILARITY where the mean key
 * changes (1 - cos of the windows before and after each candidate, over
 * the KV heads); LEARNED where the predictor (predictor.c) gives a
 * boundary probability over learned_threshold; then non-maximum
 * suppression, min_chunk and max_chunk (dhsa__boundaries, a whole
 * sequence). The online rule (dhsa__decide) is the same decision made as
 * keys arrive, with a fixed delay: the decode index (kv_index.c) runs it
 * per append, and dhsa__learned_online_starts over a whole sequence (what
 * dhsa_route does for LEARNED with causal_boundaries), so both cut alike.
 * Tested by tests/test_route*.c and tests/test_kv_index*.c.
 */
#include "route/boundaries.h"

#include <math.h>
#include <stdlib.h>

#include "route/rows.h"

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
        if (!rp->causal_boundaries || k == 0) dhsa__add_row_d(R, dhsa__row_f32(&a->k, b, g, k, d, rowbuf), d, 0);
    for (int64_t t = 1; t < Lk; t++) {
        slide_row(L, R, dhsa__row_f32(&a->k, b, g, t - 1, d, rowbuf), d); /* leaves R, enters L */
        if (t - 1 - w >= 0) dhsa__add_row_d(L, dhsa__row_f32(&a->k, b, g, t - 1 - w, d, rowbuf), d, 1);
        int64_t enter = rp->causal_boundaries ? t : t + w - 1;
        if (enter < Lk && (rp->causal_boundaries || enter >= w))
            dhsa__add_row_d(R, dhsa__row_f32(&a->k, b, g, enter, d, rowbuf), d, 0);
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

/* A whole sequence's chunks (boundaries.h). */
int64_t dhsa__boundaries(dhsa_ctx *ctx, const dhsa_router_params *rp, const dhsa_attn_desc *a,
                         const dhsa__attn_problem *p, int64_t b, float *score, float *part, int64_t *starts,
                         dhsa_status *err) {
    *err = DHSA_OK;
    const int64_t Lk = p->Lk;
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
        if ((*err = similarity_scores(ctx, rp, a, p, b, score, part)))
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

/* The online rule (include/dhsa.h, dhsa_kv_index; boundaries.h). */
void dhsa__decider_record(dhsa__decider *dc, int64_t s, float score) {
    dc->score[s % dc->score_size] = score;
    dc->s_n += 1;
    double delta = score - dc->s_mean;
    dc->s_mean += delta / dc->s_n;
    dc->s_m2 += delta * (score - dc->s_mean);
}

int64_t dhsa__decide(dhsa__decider *dc, int64_t open, int64_t s, float score) {
    const dhsa_router_params *rp = dc->rp;
    if (s >= 1) dhsa__decider_record(dc, s, score);
    /* the candidate nms_window scores back can now be judged */
    int64_t t = s - rp->nms_window;
    if (t >= 1) {
        float sc = dc->score[t % dc->score_size];
        int keep;
        if (dc->learned) {
            keep = sc >= rp->learned_threshold;
        } else {
            double sd = dc->s_n > 1 ? sqrt(dc->s_m2 / dc->s_n) : 0.0;
            keep = sc >= dc->s_mean + rp->threshold * sd;
        }
        keep = keep && t - open >= rp->min_chunk && t - open >= rp->nms_window + 1 && t - open <= rp->max_chunk;
        for (int64_t u = t - rp->nms_window; keep && u <= s; u++) {
            if (u < 1 || u == t) continue;
            float su = dc->score[u % dc->score_size];
            if (su > sc || (su == sc && u < t)) keep = 0; /* not the (earliest) maximum */
        }
        if (keep) return t;
    }
    /* A chunk longer than max_chunk is cut at max_chunk, but only once every
     * candidate inside it has been judged (nms_window scores later): cutting
     * at once could split a boundary about to be decided (seen at 128K: a
     * 16-key needle passage starting 3 keys before the cut was lost). */
    if (s + 1 - open >= rp->max_chunk + rp->nms_window) return open + rp->max_chunk;
    return -1;
}

int64_t dhsa__learned_online_starts(const dhsa_router_params *rp, const float *p, int64_t Lk, int64_t *starts,
                                    dhsa_status *err) {
    *err = DHSA_OK;
    dhsa__decider dc = {rp, 1, malloc((size_t)(2 * rp->nms_window + 1) * sizeof(float)), 2 * rp->nms_window + 1, 0, 0, 0};
    if (!dc.score) {
        *err = dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory for the online boundaries");
        return -1;
    }
    const int64_t delay = dhsa_predictor_window(rp->predictor) - 1;
    int64_t n = 0, open = 0;
    starts[0] = 0;
    for (int64_t now = 0; now < Lk; now++) {
        int64_t s = now - delay;
        if (s < 0) continue;
        int64_t cut = dhsa__decide(&dc, open, s, s >= 1 ? p[s] : 0.0f);
        if (cut >= 0) starts[++n] = open = cut;
    }
    free(dc.score);
    /* the keys the index would still hold open: pieces of at most max_chunk */
    int64_t len = Lk - open, parts = (len + rp->max_chunk - 1) / rp->max_chunk;
    for (int64_t k = 1; k < parts; k++) starts[++n] = open + len * k / parts;
    starts[++n] = Lk;
    return n;
}
