/* rest.c: the keys a sparse layout leaves out, summarised per chunk
 * (rest.h; docs/dhsa.md, "The rest of the keys, summarised").
 * Tested by tests/test_rest.c against the attention, in double, over the
 * kept keys and the summaries written out as keys.
 */
#include "route/rest.h"

#include "attn/layout.h"
#include "route/rows.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct dhsa__rest {
    dhsa_ctx *ctx;
    int64_t Hkv, dk, dv, cap, n;
    int f32;         /* summaries in F32 (else F16) */
    int64_t *starts; /* [cap + 1]: the chunk bounds the n summaries were made from */
    float *bias;     /* [cap]: log(keys of chunk c) */
    void *k;         /* [cap][Hkv][dk]: each chunk's mean key per KV head */
    void *v;         /* [cap][Hkv][dv]: its mean value */
    double *acc;     /* [dk + dv]: sums of one chunk and head */
    float *row;      /* [max(dk, dv)]: one widened cache row */
};

int64_t dhsa__rest_max_chunks(const dhsa_router_params *rp, int64_t capacity) {
    const int64_t min_len = rp->boundary == DHSA_BOUNDARY_FIXED ? rp->chunk : rp->min_chunk;
    return capacity / (min_len > 0 ? min_len : 1) + 2;
}

static size_t elem(int f32) { return f32 ? sizeof(float) : sizeof(uint16_t); }

size_t dhsa__rest_bytes(int64_t Hkv, int64_t dk, int64_t dv, int64_t max_chunks, int f32) {
    const size_t c = (size_t)max_chunks, e = elem(f32);
    return dhsa__align_up((c + 1) * sizeof(int64_t) + c * sizeof(float), 64) +
           dhsa__align_up(c * (size_t)Hkv * (size_t)(dk + dv) * e, 64) + (size_t)(dk + dv) * sizeof(double) +
           (size_t)(dk > dv ? dk : dv) * sizeof(float);
}

dhsa_status dhsa__rest_create(dhsa_ctx *ctx, int64_t Hkv, int64_t dk, int64_t dv, int64_t max_chunks, int f32,
                              dhsa__rest **out) {
    *out = NULL;
    if (Hkv < 1 || dk < 1 || dv < 1 || max_chunks < 1 || max_chunks > ((int64_t)1 << 34))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "rest sizes Hkv=%lld dk=%lld dv=%lld chunks=%lld", (long long)Hkv,
                          (long long)dk, (long long)dv, (long long)max_chunks);
    dhsa__rest *r = calloc(1, sizeof *r);
    if (!r) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory (the summaries of the keys left out)");
    dhsa_status st = DHSA_OK;
    const size_t bytes = dhsa__rest_bytes(Hkv, dk, dv, max_chunks, f32);
    char *m = dhsa__alloc(ctx, bytes, &st);
    if (!m) {
        free(r);
        return st;
    }
    memset(m, 0, bytes);
    const size_t c = (size_t)max_chunks;
    r->ctx = ctx;
    r->Hkv = Hkv;
    r->dk = dk;
    r->dv = dv;
    r->cap = max_chunks;
    r->f32 = f32;
    r->starts = (int64_t *)m;
    r->bias = (float *)(r->starts + c + 1);
    r->k = m + dhsa__align_up((c + 1) * sizeof(int64_t) + c * sizeof(float), 64);
    r->v = (char *)r->k + c * (size_t)Hkv * (size_t)dk * elem(f32);
    r->acc = (double *)(m + bytes - (size_t)(dk > dv ? dk : dv) * sizeof(float) - (size_t)(dk + dv) * sizeof(double));
    r->row = (float *)(r->acc + dk + dv);
    *out = r;
    return DHSA_OK;
}

void dhsa__rest_free(dhsa__rest *r) {
    if (!r) return;
    dhsa_ctx_release(r->ctx, r->starts);
    free(r);
}

void dhsa__rest_forget(dhsa__rest *r, int64_t len) {
    if (!r) return;
    int64_t c = 0;
    while (c < r->n && r->starts[c + 1] <= len) c++;
    r->n = c;
}

int64_t dhsa__rest_chunks(const dhsa__rest *r) { return r ? r->n : 0; }

static void put(void *base, int f32, size_t i, double x) {
    if (f32) ((float *)base)[i] = (float)x;
    else ((uint16_t *)base)[i] = dhsa_f32_to_f16((float)x);
}

/* Chunk c's summary for KV head g from the sums acc [dk + dv] of its keys
 * [j0, j1) and values. */
static void set_summary(dhsa__rest *r, int64_t c, int64_t g, int64_t j0, int64_t j1, const double *acc) {
    const int64_t dk = r->dk, dv = r->dv;
    const double inv = j1 > j0 ? 1.0 / (double)(j1 - j0) : 0.0;
    const size_t at = (size_t)(c * r->Hkv + g);
    for (int64_t e = 0; e < dk; e++) put(r->k, r->f32, at * (size_t)dk + (size_t)e, acc[e] * inv);
    for (int64_t e = 0; e < dv; e++) put(r->v, r->f32, at * (size_t)dv + (size_t)e, acc[dk + e] * inv);
    r->bias[c] = j1 > j0 ? logf((float)(j1 - j0)) : -INFINITY;
    r->starts[c] = j0;
    r->starts[c + 1] = j1;
}

int64_t dhsa__rest_stale(const dhsa__rest *r, const int64_t *starts, int64_t nc) {
    int64_t keep = 0; /* summaries whose chunk kept its bounds */
    while (keep < r->n && keep < nc && r->starts[keep] == starts[keep] && r->starts[keep + 1] == starts[keep + 1])
        keep++;
    return keep;
}

dhsa_status dhsa__rest_sync(dhsa__rest *r, const int64_t *starts, int64_t nc, const dhsa_tensor *k,
                            const dhsa_tensor *v) {
    if (nc > r->cap)
        return dhsa__fail(DHSA_ERR_INTERNAL, "the index closed %lld chunks, the summaries hold %lld", (long long)nc,
                          (long long)r->cap);
    if (nc > 0 && (starts[nc] > k->shape[2] || starts[nc] > v->shape[2]))
        return dhsa__fail(DHSA_ERR_INTERNAL, "chunks up to key %lld, the cache holds %lld", (long long)starts[nc],
                          (long long)k->shape[2]);
    const int64_t dk = r->dk, dv = r->dv;
    for (int64_t c = dhsa__rest_stale(r, starts, nc); c < nc; c++) {
        const int64_t j0 = starts[c], j1 = starts[c + 1];
        for (int64_t g = 0; g < r->Hkv; g++) {
            memset(r->acc, 0, (size_t)(dk + dv) * sizeof(double));
            for (int64_t j = j0; j < j1; j++) {
                const float *kr = dhsa__row_f32(k, 0, g, j, dk, r->row);
                for (int64_t e = 0; e < dk; e++) r->acc[e] += kr[e];
                const float *vr = dhsa__row_f32(v, 0, g, j, dv, r->row);
                for (int64_t e = 0; e < dv; e++) r->acc[dk + e] += vr[e];
            }
            set_summary(r, c, g, j0, j1, r->acc);
        }
    }
    r->n = nc;
    return DHSA_OK;
}

dhsa_status dhsa__rest_set(dhsa__rest *r, const int64_t *starts, int64_t nc, int64_t from, int64_t to,
                           const double *sums) {
    if (to > r->cap || from < 0 || from > to || to > nc || from > r->n)
        return dhsa__fail(DHSA_ERR_INTERNAL, "rest: chunks %lld..%lld of %lld set, %lld held, room for %lld",
                          (long long)from, (long long)to, (long long)nc, (long long)r->n, (long long)r->cap);
    const int64_t per = r->dk + r->dv;
    for (int64_t c = from; c < to; c++)
        for (int64_t g = 0; g < r->Hkv; g++)
            set_summary(r, c, g, starts[c], starts[c + 1], sums + ((c - from) * r->Hkv + g) * per);
    r->n = to;
    return DHSA_OK;
}

/* The chunks of r that end at or before `end` and share no key with the
 * sorted, disjoint ranges rg[0, nr): as runs of chunk indices into out
 * (pairs); returns their count (at most nr + 1). */
static int64_t left_out(const dhsa__rest *r, const int64_t *rg, int64_t nr, int64_t end, int64_t *out) {
    int64_t runs = 0, i = 0, open = -1;
    for (int64_t c = 0; c < r->n && r->starts[c + 1] <= end; c++) {
        while (i < nr && rg[2 * i + 1] <= r->starts[c]) i++;
        const int free_chunk = !(i < nr && rg[2 * i] < r->starts[c + 1]);
        if (free_chunk && open < 0) open = c;
        if (!free_chunk && open >= 0) {
            out[2 * runs] = open;
            out[2 * runs + 1] = c;
            runs++;
            open = -1;
        }
        if (free_chunk) out[2 * runs + 1] = c + 1;
    }
    if (open >= 0) {
        out[2 * runs] = open;
        runs++;
    }
    return runs;
}

dhsa_status dhsa__rest_attend(dhsa_ctx *ctx, const dhsa__rest *r, const dhsa_attn_desc *a, const dhsa_layout *lay,
                              float *o2, float *lse2, double *summaries) {
    if (summaries) *summaries = 0;
    if (!r || r->n == 0) return DHSA_OK;
    if (!a->lse.data || !a->causal || a->window || a->k_pos0)
        return dhsa__fail(DHSA_ERR_INTERNAL, "rest: the routed call needs its lse, causal, no window, keys from 0");
    const int64_t Lq = a->q.shape[2], Hq = a->q.shape[1], qb = lay->q_block, nb = lay->n_blocks;
    dhsa_layout *l2 = NULL;
    dhsa_status st = dhsa_layout_create(ctx, 1, r->Hkv, Lq, r->n, qb, lay->max_ranges + 1, &l2);
    if (st) return st;
    int64_t *runs = malloc((size_t)(lay->max_ranges + 1) * 2 * sizeof(int64_t));
    if (!runs) {
        dhsa_layout_free(l2);
        return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory (the chunks left out)");
    }
    int any = 0;
    for (int64_t g = 0; g < r->Hkv && !st; g++)
        for (int64_t b = 0; b < nb && !st; b++) {
            const int64_t *rg;
            int64_t nr;
            if ((st = dhsa_layout_get(lay, 0, g, b, &rg, &nr))) break;
            const int64_t n = left_out(r, rg, nr, a->q_pos0 + b * qb, runs);
            if (n && !(st = dhsa_layout_set(l2, 0, g, b, runs, n))) any = 1;
            for (int64_t i = 0; summaries && i < n; i++) /* x the block's rows */
                *summaries += (double)(runs[2 * i + 1] - runs[2 * i]) * (double)((b + 1) * qb < Lq ? qb : Lq - b * qb);
        }
    free(runs);
    if (!st && any) {
        const int64_t dv = a->o.shape[3];
        const dhsa_type t = r->f32 ? DHSA_F32 : DHSA_F16;
        dhsa_attn_desc s = dhsa_attn_default_desc();
        s.q = a->q;
        s.k = dhsa_tensor_blhd(r->k, t, 1, r->n, r->Hkv, r->dk);
        s.v = dhsa_tensor_blhd(r->v, t, 1, r->n, r->Hkv, r->dv);
        s.o = dhsa_tensor_blhd(o2, DHSA_F32, 1, Lq, Hq, dv);
        s.lse = dhsa_tensor_blhd(lse2, DHSA_F32, 1, Lq, Hq, 1);
        s.scale = a->scale;
        s.softcap = a->softcap;
        s.key_bias = r->bias;
        s.layout = l2;
        if (!(st = dhsa_attention(ctx, &s))) {
            const dhsa_tensor op[2] = {a->o, s.o}, lp[2] = {a->lse, s.lse};
            st = dhsa_attn_merge(op, lp, 2, &a->o, &a->lse);
        }
    }
    dhsa_layout_free(l2);
    return st;
}
