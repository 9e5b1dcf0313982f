/* dist.c: context parallelism (docs/dist.md): one rank's part of a
 * sequence split over R ranks, behind the per-layer interface of
 * dist/dist.h. The session runs the weight products of this rank's rows;
 * here: which positions are whose, every rank's share of each layer's
 * cache and routing, the exchanges through the dhsa_dist transport, and
 * the exact merge of partial attentions (dhsa_attn_merge).
 *
 * Positions: p belongs to rank (p / S) % R, local slot (p / (S R)) S +
 * p % S, so a rank's cache is its positions' keys in position order.
 * Prefill (more than one token): each rank runs its own positions through
 * every layer at once; per layer it stores their K/V, attends its own keys
 * causally, then the other ranks' (dense: the ring; DHSA and BLOCK: the
 * relayed routing index, then the selected ranges fetched by all-to-all),
 * merging the partials through their LSE. Decode (one token): every rank
 * runs the row, the owner stores its K/V, every rank attends its own keys
 * and the partials are all-gathered and merged in rank order.
 *
 * Buffers (cap = the most positions one rank holds, the session's ubatch):
 *   o2 [cap][Hq][hv], lse1, lse2 [cap][Hq]  a partial output and the LSEs
 *   krow [Hkv][hk]                          a decode key as F16 rounds it
 *   rowpos [cap], own [cap]                 the eval's rows: positions, ids
 *   pieces [max_pieces][3]                  runs of consecutive positions
 *   dbuf[2]                                 shard buffers, one layer's K+V of cap
 *   xq, xmz.., xm..                         the exact ranking's rows, norms, masses
 * The rows ranked exactly and the carried chunks: dist_route.c.
 * Tested by tests/test_dist.c (mpirun: the same ids and logits as one
 * process) and tests/test_attn_merge.c (the merge).
 */
#include "dist/dist_internal.h"

#include "attn/layout.h"
#include "attn/stats.h"
#include "core/internal.h"
#include "core/procmem.h"
#include "route/kv_index_internal.h"
#include "route/params.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Position p belongs to rank (p / S) % R, where it is local slot
 * (p / (S R)) S + p % S: each rank's positions in order, so a rank's cache
 * is its positions' keys in position order. */
static int64_t dist_count_before(int64_t S, int64_t R, int64_t q, int64_t p) {
    int64_t cyc = p / (S * R), rem = p % (S * R) - q * S;
    return cyc * S + (rem < 0 ? 0 : rem > S ? S : rem);
}

/* The stripe a session with these params deals positions in. */
static int64_t dist_stripe_of(const dhsa_session_params *p, int64_t n_ctx) {
    int64_t R = p->dist->size;
    if (p->dist_stripe > 0) return p->dist_stripe;
    int64_t S = (n_ctx + R - 1) / R;
    return (S + 63) / 64 * 64; /* whole query blocks */
}

static int uses_index(const dhsa_session_params *p) {
    return p->attn == DHSA_ATTN_DHSA || p->attn == DHSA_ATTN_BLOCK;
}

/* Whether a session of p carries chunks between decode steps (route.h,
 * carry): as one process, the same sessions as exact_on's. */
static int carry_on(const dhsa_session_params *p, const dhsa_router_params *rp) {
    return uses_index(p) && rp->method == DHSA_ROUTE_DHSA && !rp->share_heads && rp->carry > 0;
}

/* Whether a session of p ranks an answering eval's last rows by their
 * exact attention (include/dhsa/route.h, exact_rows): as one process, the
 * sessions whose index ranks chunks by score, one routing per KV group. */
static int exact_on(const dhsa_session_params *p, const dhsa_router_params *rp) {
    return uses_index(p) && rp->method == DHSA_ROUTE_DHSA && !rp->share_heads && rp->exact_rows > 0;
}

/* -------------------------------------------------------- plan, create --- */

dhsa_status dhsa__dist_check(const dhsa_model_info *in, const dhsa_session_params *p, int64_t n_ctx, int64_t *cap) {
    const dhsa_dist *d = p->dist;
    (void)in; /* every architecture the runner reads splits (sliding windows too) */
    if (d->rank < 0 || d->rank >= d->size || !d->allgather || !d->bcast || !d->alltoallv || !d->ring_start ||
        !d->ring_wait)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "context parallel: rank %d of %d, or a transport function missing",
                          d->rank, d->size);
    if (p->attn != DHSA_ATTN_DENSE && p->attn != DHSA_ATTN_DHSA && p->attn != DHSA_ATTN_BLOCK)
        return dhsa__fail(DHSA_ERR_UNSUPPORTED, "context parallel runs dense, dhsa and block attention; %s is not "
                          "distributed (docs/dist.md)", dhsa_attn_method_name(p->attn));
    if (p->attn == DHSA_ATTN_DHSA && p->router.boundary == DHSA_BOUNDARY_LEARNED)
        return dhsa__fail(DHSA_ERR_UNSUPPORTED, "context parallel: learned boundaries are not relayed between ranks "
                          "yet (docs/dist.md); use similarity boundaries");
    if (p->logits_all) return dhsa__fail(DHSA_ERR_UNSUPPORTED, "context parallel: logits for every token are not kept");
    if (p->kv_type == DHSA_Q8_0)
        return dhsa__fail(DHSA_ERR_UNSUPPORTED, "context parallel: a Q8_0 KV cache is not split between ranks yet "
                          "(shards and fetched ranges are packed per element); use --kv f16 or f32");
    if (p->layer_hook) return dhsa__fail(DHSA_ERR_UNSUPPORTED, "context parallel: no layer hook (a rank sees part of a layer)");
    if (p->dist_stripe < 0 || p->dist_stripe % 64)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "context parallel: a stripe of %lld tokens (a multiple of 64, the "
                          "query block; 0 = contiguous)", (long long)p->dist_stripe);
    if (p->attn != DHSA_ATTN_DENSE && p->router.q_block > 0 && 64 % p->router.q_block)
        return dhsa__fail(DHSA_ERR_UNSUPPORTED, "context parallel: query blocks of %lld rows (16, 32 or 64 and the "
                          "like: blocks that divide 64, so that every stripe holds whole blocks)",
                          (long long)p->router.q_block);
    if (p->dist_fetch_share > 0 && !uses_index(p))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "context parallel: dist_fetch_share %g budgets what dhsa and block "
                          "attention fetch; %s attention passes every key round the ring", p->dist_fetch_share,
                          dhsa_attn_method_name(p->attn));
    *cap = dist_count_before(dist_stripe_of(p, n_ctx), d->size, 0, n_ctx);
    if (*cap > 65536)
        return dhsa__fail(DHSA_ERR_TOO_LARGE, "context parallel: %lld positions per rank (more than 65536: use more "
                          "ranks)", (long long)*cap);
    return DHSA_OK;
}

typedef struct {
    double w;
    int64_t c;
} chunk_weight;

/* The shapes dhsa__dist_create sizes its buffers by: every bound below is
 * what one prefill or decode step of n_ctx positions can need, so that no
 * eval allocates. */
typedef struct {
    int64_t R, Hq, Hkv, hk, hv, cap, pieces, nl, rmax, tmp_cap, groups, max_chunks;
    int64_t xmax, xbmax, ncmax, runs; /* the exact ranking (dist_exact) */
    int64_t wruns;                    /* sliding windows: the tails of a rank's stripes */
    int index;
} dist_dims;

static dist_dims dims_of(const dhsa_model_info *in, const dhsa_session_params *p, const dhsa_router_params *rp,
                         int64_t n_ctx, int64_t cap) {
    dist_dims m;
    memset(&m, 0, sizeof m);
    const int64_t S = dist_stripe_of(p, n_ctx);
    m.R = p->dist->size;
    m.Hq = in->n_head;
    m.Hkv = in->n_head_kv;
    m.hk = in->head_dim_k;
    m.hv = in->head_dim_v;
    m.cap = cap;
    m.pieces = n_ctx / S + 3; /* a prefill of n tokens: at most n / S + 2 runs of one rank */
    m.wruns = in->n_swa_layers > 0 ? cap / S + 2 : 0; /* a rank's stripes */
    m.index = uses_index(p);
    if (!m.index) return m;
    m.nl = p->dist_fetch_share > 0 ? m.Hkv : 1;
    m.rmax = cap / 2 + 1; /* disjoint ranges that do not touch, of cap slots */
    int64_t min_len, max_chunks, max_ranges;
    dhsa__route_limits(rp, n_ctx, &min_len, &max_chunks, &max_ranges);
    /* a block's ranges, each split where it crosses another rank's stripes */
    m.tmp_cap = 2 * max_ranges + n_ctx / (S * m.R) + 4;
    if (p->dist_fetch_share > 0) {
        m.groups = rp->share_heads ? 1 : m.Hkv;
        m.max_chunks = max_chunks;
    }
    if (exact_on(p, rp) || carry_on(p, rp)) {
        /* the last X rows from each piece's block holding the first: at
         * most X / 64 + 2 pieces (stripes >= 64), each adding < qb rows
         * and up to 2 blocks; the index's chunks as kv_index.c bounds them */
        const int64_t X = rp->exact_rows, seg = X / 64 + 2, qb = rp->q_block > 0 ? rp->q_block : 1;
        m.xmax = X + (qb - 1) * seg < n_ctx ? X + (qb - 1) * seg : n_ctx; /* >= 1: a decode row */
        if (m.xmax < 1) m.xmax = 1;
        m.xbmax = X / qb + 2 * seg;
        m.ncmax = n_ctx / (rp->boundary == DHSA_BOUNDARY_FIXED ? rp->chunk : rp->min_chunk) + 2;
        m.runs = cap / S + 2;
    }
    return m;
}

/* Carves the buffers of dims m out of base (64-byte aligned each) into s;
 * with s NULL only counts. Returns the bytes. */
static size_t carve(dhsa__dist *s, char *base, const dist_dims *m) {
    size_t at = 0;
#define TAKE(field, count, type)                                            \
    do {                                                                    \
        if (s) s->field = (void *)(base + at);                              \
        at += dhsa__align_up((size_t)(count) * sizeof(type), 64);           \
    } while (0)
    const int64_t lists = m->R * m->nl, cap = m->cap;
    TAKE(o2, cap * m->Hq * m->hv, float);
    TAKE(lse1, cap * m->Hq, float);
    TAKE(lse2, cap * m->Hq, float);
    TAKE(krow, m->Hkv * m->hk, float);
    TAKE(gather, m->R * m->Hq * (m->hv + 1), float);
    TAKE(rowpos, cap, int64_t);
    TAKE(own, cap, int32_t);
    TAKE(pieces, m->pieces, int64_t[3]);
    TAKE(wrg, m->wruns, int64_t[2]);
    if (m->index) {
        TAKE(gl, m->pieces, dhsa_layout *);
        TAKE(nreq, lists, int64_t);
        TAKE(ngot, lists, int64_t);
        TAKE(req, lists, int64_t *);
        TAKE(pre, lists, int64_t *);
        TAKE(reqs, lists * m->rmax * 2, int64_t);
        TAKE(pres, lists * (m->rmax + 1), int64_t);
        TAKE(inbox, lists * m->rmax * 2, int64_t);
        TAKE(sb, m->R, size_t);
        TAKE(rb, m->R, size_t);
        TAKE(nh, m->Hkv, int64_t);
        TAKE(marks, cap + 1, int32_t);
        TAKE(tmp, m->tmp_cap * 2, int64_t);
    }
    if (m->groups) {
        const int64_t gc = m->groups * m->max_chunks, gr = m->groups * m->R;
        TAKE(allowed, gc, unsigned char);
        TAKE(none, gc, unsigned char);
        TAKE(agg, gc, double);
        TAKE(order, m->max_chunks * (int64_t)sizeof(chunk_weight), char);
        TAKE(fmarks, gr * (cap + 1), int32_t);
        TAKE(fixed, gr * m->rmax * 2, int64_t);
        TAKE(nfixed, gr, int64_t);
        TAKE(left, 2 * m->R, int64_t);
    }
    if (m->xmax) {
        const int64_t nm = m->Hkv * m->xbmax * (m->ncmax + 1);
        TAKE(xq, m->xmax * m->Hq * m->hk, float);
        TAKE(xpos, m->xmax, int64_t);
        TAKE(xblk, m->xbmax, int64_t[2]);
        TAKE(xseg, m->xbmax, int64_t[5]);
        TAKE(xruns, m->runs, int64_t[3]);
        TAKE(xmz, m->xmax * m->Hq * 2, double);
        TAKE(xmz_all, m->R * m->xmax * m->Hq * 2, double);
        TAKE(xm, nm, double);
        TAKE(xm_all, (m->R + 1) * nm, double);
        TAKE(xlist, m->Hkv * (m->ncmax + 1), int64_t);
    }
#undef TAKE
    return at;
}

/* The shard buffers' bytes: one layer's K and V of cap positions. */
static size_t shard_buffer_bytes(const dhsa_model_info *in, const dhsa_session_params *p, int64_t cap) {
    return (size_t)in->n_head_kv * (size_t)cap * (size_t)(in->head_dim_k + in->head_dim_v) * dhsa_type_size(p->kv_type);
}

dhsa_status dhsa__dist_plan(const dhsa_model_info *in, const dhsa_session_params *p, const dhsa_router_params *rp,
                            int64_t n_ctx, size_t *routing, size_t *work) {
    int64_t cap;
    dhsa_status st = dhsa__dist_check(in, p, n_ctx, &cap);
    if (st) return st;
    if (uses_index(p)) {
        size_t ix_loc, ix_all;
        if ((st = dhsa_kv_index_size(rp, in->n_head_kv, in->head_dim_k, cap, &ix_loc)) ||
            (st = dhsa_kv_index_size(rp, in->n_head_kv, in->head_dim_k, n_ctx, &ix_all)))
            return st;
        *routing += (size_t)in->n_layer * (ix_all - ix_loc);
    }
    const dist_dims m = dims_of(in, p, rp, n_ctx, cap);
    *work += 2 * dhsa__align_up(shard_buffer_bytes(in, p, cap), DHSA__PAGE) + carve(NULL, NULL, &m);
    return DHSA_OK;
}

dhsa_status dhsa__dist_create(dhsa_ctx *ctx, const dhsa_model_info *in, const dhsa_session_params *p,
                              const dhsa_router_params *rp, int64_t n_ctx, const dhsa__dist_buffers *buf,
                              dhsa__dist **out) {
    *out = NULL;
    int64_t cap;
    dhsa_status st = dhsa__dist_check(in, p, n_ctx, &cap);
    if (st) return st;
    dhsa__dist *s = calloc(1, sizeof *s);
    if (!s) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory");
    s->ctx = ctx;
    s->in = in;
    s->dist = p->dist;
    s->kv_type = p->kv_type;
    s->fetch_share = p->dist_fetch_share;
    s->n_ctx = n_ctx;
    s->cap = cap;
    s->stripe = dist_stripe_of(p, n_ctx);
    s->q = buf->q;
    s->kt = buf->kt;
    s->vt = buf->vt;
    s->att = buf->att;
    s->kv = buf->kv;
    const dist_dims m = dims_of(in, p, rp, n_ctx, cap);
    const size_t block = carve(NULL, NULL, &m);
    char *a = dhsa__alloc(ctx, block, &st);
    if (!a) goto fail;
    s->block = a;
    carve(s, a, &m);
    /* the marks and the fetch budget's "none" start (and stay) zero */
    if (m.index) memset(s->marks, 0, (size_t)(cap + 1) * sizeof *s->marks);
    if (m.groups) {
        memset(s->none, 0, (size_t)(m.groups * m.max_chunks));
        memset(s->fmarks, 0, (size_t)(m.groups * m.R) * (size_t)(cap + 1) * sizeof *s->fmarks);
    }
    s->max_pieces = m.pieces;
    s->nl = m.nl;
    s->rmax = m.rmax;
    s->tmp_cap = m.tmp_cap;
    s->groups = m.groups;
    s->max_chunks = m.max_chunks;
    s->exact_rows = exact_on(p, rp) ? rp->exact_rows : 0;
    s->q_block = rp->q_block > 0 ? rp->q_block : 64;
    s->xmax = m.xmax;
    s->xbmax = m.xbmax;
    s->ncmax = m.ncmax;
    s->dbuf_bytes = shard_buffer_bytes(in, p, cap);
    for (int i = 0; i < 2; i++)
        if (!(s->dbuf[i] = dhsa_buffer_alloc(s->dbuf_bytes))) {
            st = dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory for the shard buffers");
            goto fail;
        }
    *out = s;
    return DHSA_OK;
fail:
    dhsa__dist_free(s);
    return st;
}

void dhsa__dist_free(dhsa__dist *s) {
    if (!s) return;
    if (s->block) dhsa_ctx_release(s->ctx, s->block);
    dhsa_buffer_free(s->dbuf[0]);
    dhsa_buffer_free(s->dbuf[1]);
    free(s);
}

void dhsa__dist_reset(dhsa__dist *s) {
    s->len = 0;
    s->len_loc = 0;
    memset(&s->dst, 0, sizeof s->dst);
}

const dhsa_dist_stats *dhsa__dist_stats(const dhsa__dist *s) { return &s->dst; }

/* ------------------------------------------------------- layer helpers --- */

/* The view of the running layer's cache holding its first n keys. */
dhsa_tensor dhsa__dist_cache_view(const dhsa__dist *s, int is_v, int64_t n) {
    dhsa_tensor t = is_v ? s->io->v : s->io->k;
    t.shape[2] = n;
    return t;
}

static void count_attention(dhsa__dist *s, const dhsa_attn_desc *a) {
    dhsa__attn_count(s->io->stats, 2, a);
}

/* Stores rows [slot, slot + rows) of a cache view [1][heads][cap][hd] (F32
 * or F16, rounded to nearest even) from src [rows][heads][hd] (F32). */
static void store_rows(const dhsa_tensor *cache, const float *src, int64_t rows, int64_t slot) {
    const int64_t heads = cache->shape[1], hd = cache->shape[3];
    for (int64_t h = 0; h < heads; h++)
        for (int64_t r = 0; r < rows; r++) {
            const float *x = src + (r * heads + h) * hd;
            size_t off = (size_t)(h * cache->stride[1] + (slot + r) * cache->stride[2]);
            if (cache->type == DHSA_F32) {
                memcpy((float *)cache->data + off, x, (size_t)hd * sizeof(float));
            } else {
                uint16_t *d = (uint16_t *)cache->data + off;
                for (int64_t i = 0; i < hd; i++) d[i] = dhsa_f32_to_f16(x[i]);
            }
        }
}

/* (o1, l1) <- the exact merge of two partial attentions over disjoint key
 * sets, (o1, l1) and (o2, l2), for rows x heads: o [rows][H][dv], l
 * [rows][H] (dhsa_attn_merge, in place). */
static dhsa_status lse_merge(float *o1, float *l1, float *o2, float *l2, int64_t rows, int64_t H, int64_t dv) {
    dhsa_tensor o[2] = {dhsa_tensor_blhd(o1, DHSA_F32, 1, rows, H, dv), dhsa_tensor_blhd(o2, DHSA_F32, 1, rows, H, dv)};
    dhsa_tensor l[2] = {dhsa_tensor_blhd(l1, DHSA_F32, 1, rows, H, 1), dhsa_tensor_blhd(l2, DHSA_F32, 1, rows, H, 1)};
    return dhsa_attn_merge(o, l, 2, &o[0], &l[0]);
}

dhsa_status dhsa__dist_fail(const char *what, const char *why) {
    return dhsa__fail(DHSA_ERR_INTERNAL, "context parallel, %s: %s", what, why);
}

/* The call of the forward's query rows [r0, r0 + m) over the keys k / v
 * (views), output rows into o [ub][Hq][hv] and lse [ub][Hq] at r0; not
 * causal, no layout. */
static dhsa_attn_desc call_desc(const dhsa__dist *s, int64_t r0, int64_t m, dhsa_tensor k, dhsa_tensor v, float *o,
                                float *lse) {
    const dhsa_model_info *in = s->in;
    const int64_t Hq = in->n_head, hk = in->head_dim_k, hv = in->head_dim_v;
    dhsa_attn_desc a = dhsa_attn_default_desc();
    a.q = dhsa_tensor_blhd(s->q + r0 * Hq * hk, DHSA_F32, 1, m, Hq, hk);
    a.k = k;
    a.v = v;
    a.o = dhsa_tensor_blhd(o + r0 * Hq * hv, DHSA_F32, 1, m, Hq, hv);
    a.lse = dhsa_tensor_blhd(lse + r0 * Hq, DHSA_F32, 1, m, Hq, 1);
    a.softcap = in->attn_softcap;
    a.scale = in->attn_scale;
    return a;
}

/* One partial attention (call_desc), causal at q_pos0 or not, with an
 * optional layout. */
static dhsa_status dist_call(dhsa__dist *s, int64_t r0, int64_t m, dhsa_tensor k, dhsa_tensor v, int causal,
                             int64_t q_pos0, const dhsa_layout *lay, float *o, float *lse) {
    dhsa_attn_desc a = call_desc(s, r0, m, k, v, o, lse);
    a.causal = causal;
    a.q_pos0 = q_pos0;
    a.layout = lay;
    return dhsa_attention(s->ctx, &a);
}

/* Key rows [from, from + n) of a [1][Hkv][len][d] view. */
static dhsa_tensor key_rows(dhsa_tensor t, int64_t from, int64_t n) {
    t.data = (char *)t.data + (size_t)(from * t.stride[2]) * dhsa_type_size(t.type);
    t.shape[2] = n;
    return t;
}

/* The rows a sliding-window layer (window w) passes of a rank's n keys:
 * of each of its stripes, the last w - 1 at most (a later position's
 * window reaches no further back). */
static int64_t window_rows(int64_t S, int64_t n, int64_t w) {
    int64_t rows = 0;
    for (int64_t t0 = 0; t0 < n; t0 += S) {
        const int64_t c = n - t0 < S ? n - t0 : S;
        rows += c < w - 1 ? c : w - 1;
    }
    return rows;
}

/* A sliding-window layer (the running layer's window w): rows [r0, r0 + m)
 * at positions g0.. over the keys of rank q's first n slots that any row's
 * window holds, one call per stripe of q's (consecutive positions there:
 * k_pos0), in position order. k / v hold those n slots, or (tails) only
 * each stripe's last w - 1 keys at most, packed (window_rows). The first
 * call writes (o, lse) at r0, the next ones (o2, lse2) at r0, merged into
 * (o, lse). *calls counts the calls (0: o and lse untouched). */
static dhsa_status window_part(dhsa__dist *s, int64_t r0, int64_t m, int64_t g0, int64_t q, dhsa_tensor k,
                               dhsa_tensor v, int64_t n, int tails, float *o, float *lse, float *o2, float *lse2,
                               int *calls) {
    const int64_t S = s->stripe, R = s->dist->size, w = s->io->window, Hq = s->in->n_head, hv = s->in->head_dim_v;
    const int64_t last = g0 + m - 1; /* the last row's position */
    dhsa_status st = DHSA_OK;
    for (int64_t t0 = 0, row = 0; t0 < n && !st; t0 += S) {
        const int64_t c = n - t0 < S ? n - t0 : S, kept = tails && c > w - 1 ? w - 1 : c;
        const int64_t p0 = (t0 / S * R + q) * S + c - kept, at = tails ? row : t0; /* first key held, its row */
        row += kept;
        if (p0 > last) break;
        if (p0 + kept - 1 <= g0 - w) continue; /* before every row's window (the first row's reaches furthest) */
        const int64_t cnt = p0 + kept - 1 > last ? last - p0 + 1 : kept;
        const int first = *calls == 0;
        dhsa_attn_desc a = call_desc(s, r0, m, key_rows(k, at, cnt), key_rows(v, at, cnt), first ? o : o2, first ? lse : lse2);
        a.causal = 1;
        a.q_pos0 = g0;
        a.k_pos0 = p0;
        a.window = w;
        st = dhsa_attention(s->ctx, &a);
        if (!st && !first) st = lse_merge(o + r0 * Hq * hv, lse + r0 * Hq, o2 + r0 * Hq * hv, lse2 + r0 * Hq, m, Hq, hv);
        ++*calls;
    }
    return st;
}

/* Views of a packed shard of n keys: K [Hkv][n][hk] then V [Hkv][n][hv]. */
static void shard_views(const dhsa__dist *s, char *buf, int64_t n, dhsa_tensor *k, dhsa_tensor *v) {
    const dhsa_model_info *in = s->in;
    const size_t es = dhsa_type_size(s->kv_type);
    *k = dhsa_tensor_bhld(buf, s->kv_type, 1, in->n_head_kv, n, in->head_dim_k);
    *v = dhsa_tensor_bhld(buf + (size_t)(in->n_head_kv * n * in->head_dim_k) * es, s->kv_type, 1, in->n_head_kv, n,
                          in->head_dim_v);
}

static size_t shard_bytes(const dhsa__dist *s, int64_t n) {
    const dhsa_model_info *in = s->in;
    return (size_t)(in->n_head_kv * n * (in->head_dim_k + in->head_dim_v)) * dhsa_type_size(s->kv_type);
}

/* Packs the local keys of layer l in nl lists of ranges (local slots),
 * list h of n[h] ranges at rg after lists 0 .. h - 1, into buf: K of every
 * KV head, then V, head-major, head g taking list g (nl = Hkv) or the one
 * list (nl = 1: a shard of its total length). Returns the key rows packed
 * (summed over the KV heads). */
static int64_t pack_lists(const dhsa__dist *s, const int64_t *rg, const int64_t *n, int64_t nl,
                          char *buf) {
    const dhsa_model_info *in = s->in;
    const int64_t Hkv = in->n_head_kv;
    const size_t es = dhsa_type_size(s->kv_type);
    int64_t rows = 0;
    for (int64_t g = 0; g < Hkv; g++) {
        const int64_t *r = rg;
        for (int64_t h = 0; h < (nl == 1 ? 0 : g); h++) r += 2 * n[h];
        for (int64_t i = 0; i < n[nl == 1 ? 0 : g]; i++) rows += r[2 * i + 1] - r[2 * i];
    }
    for (int is_v = 0; is_v < 2; is_v++) {
        const int64_t hd = is_v ? in->head_dim_v : in->head_dim_k;
        const char *c = (const char *)dhsa__dist_cache_view(s, is_v, s->cap).data;
        char *dst = buf + (is_v ? (size_t)(rows * in->head_dim_k) * es : 0);
        const int64_t *r = rg;
        for (int64_t g = 0; g < Hkv; g++) {
            const int64_t ng = n[nl == 1 ? 0 : g];
            for (int64_t i = 0; i < ng; i++) {
                size_t len = (size_t)(r[2 * i + 1] - r[2 * i]) * (size_t)hd * es;
                memcpy(dst, c + ((size_t)g * (size_t)s->cap + (size_t)r[2 * i]) * (size_t)hd * es, len);
                dst += len;
            }
            if (nl > 1) r += 2 * ng;
        }
    }
    return rows;
}

/* A shard received with n[g] keys for KV head g, packed (K heads, then V
 * heads), spread in place to the strides of a shard of N = max n[g] keys
 * per head (shard_views): every segment moves right, the last first. */
static void spread_heads(const dhsa__dist *s, char *buf, const int64_t *n, int64_t N) {
    const dhsa_model_info *in = s->in;
    const int64_t Hkv = in->n_head_kv;
    const size_t es = dhsa_type_size(s->kv_type);
    int64_t rows = 0;
    for (int64_t g = 0; g < Hkv; g++) rows += n[g];
    for (int is_v = 1; is_v >= 0; is_v--) {
        const size_t row = (size_t)(is_v ? in->head_dim_v : in->head_dim_k) * es;
        const size_t from0 = is_v ? (size_t)rows * (size_t)in->head_dim_k * es : 0;
        const size_t to0 = is_v ? (size_t)(Hkv * N) * (size_t)in->head_dim_k * es : 0;
        int64_t before = rows;
        for (int64_t g = Hkv - 1; g >= 0; g--) {
            before -= n[g];
            memmove(buf + to0 + (size_t)(g * N) * row, buf + from0 + (size_t)before * row, (size_t)n[g] * row);
        }
    }
}

/* The part of the n global ranges rg that rank q holds, in q's local
 * slots, into out (NULL: only counted); returns the count. A range crosses
 * at most len / (S R) + 1 of q's stripes. */
static int64_t map_ranges(int64_t S, int64_t R, int64_t q, const int64_t *rg, int64_t n, int64_t *out) {
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t a = rg[2 * i], b = rg[2 * i + 1];
        /* q's first stripe at or after a's stripe */
        int64_t st = a / S;
        st += ((q - st % R) % R + R) % R;
        for (; st * S < b; st += R) {
            int64_t x0 = st * S > a ? st * S : a, x1 = (st + 1) * S < b ? (st + 1) * S : b;
            if (x0 >= x1) continue;
            if (out) {
                out[2 * k] = dist_count_before(S, R, q, x0);
                out[2 * k + 1] = out[2 * k] + (x1 - x0);
            }
            k++;
        }
    }
    return k;
}

/* Where local slot x of a requested list req (n sorted disjoint ranges,
 * prefix[i] = keys before range i) sits in the packed shard. */
static int64_t compact_of(const int64_t *req, const int64_t *prefix, int64_t n, int64_t x) {
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (req[2 * mid] <= x) lo = mid;
        else hi = mid - 1;
    }
    return prefix[lo] + (x - req[2 * lo]);
}

/* The layout, over rank q's keys, of a piece's routed layout gl (global
 * positions): with req == NULL in q's local slots (Lk = lk), else in the
 * packed shard of the requested lists: KV head g's list req[g] (nl = Hkv)
 * or req[0] (nl = 1), n_req ranges, prefix its keys before each; lk keys
 * per head. */
static dhsa_status sub_layout(dhsa__dist *s, const dhsa_layout *gl, int64_t q, int64_t *const *req,
                              int64_t *const *prefix, const int64_t *n_req, int64_t nl, int64_t lk,
                              dhsa_layout **out) {
    const int64_t S = s->stripe, R = s->dist->size;
    int64_t maxr = 1, maxin = 0;
    for (int64_t g = 0; g < gl->Hkv; g++)
        for (int64_t qb = 0; qb < gl->n_blocks; qb++) {
            const int64_t *rg;
            int64_t n;
            dhsa_layout_get(gl, 0, g, qb, &rg, &n);
            int64_t c = map_ranges(S, R, q, rg, n, NULL);
            if (c > maxr) maxr = c;
            if (n > maxin) maxin = n;
        }
    int64_t *tmp = s->tmp;
    if (maxr > s->tmp_cap) /* dims_of's bound: a bug if it is passed */
        return dhsa__fail(DHSA_ERR_INTERNAL, "context parallel: a block's %lld ranges on rank %lld exceed the %lld "
                          "planned", (long long)maxr, (long long)q, (long long)s->tmp_cap);
    dhsa_status st = dhsa_layout_create(s->ctx, 1, gl->Hkv, gl->Lq, lk, gl->q_block, maxr, out);
    for (int64_t g = 0; !st && g < gl->Hkv; g++)
        for (int64_t qb = 0; !st && qb < gl->n_blocks; qb++) {
            const int64_t *rg;
            int64_t n;
            dhsa_layout_get(gl, 0, g, qb, &rg, &n);
            int64_t c = map_ranges(S, R, q, rg, n, tmp), h = nl == 1 ? 0 : g;
            if (req)
                for (int64_t i = 0; i < 2 * c; i += 2) {
                    int64_t len = tmp[i + 1] - tmp[i];
                    tmp[i] = compact_of(req[h], prefix[h], n_req[h], tmp[i]);
                    tmp[i + 1] = tmp[i] + len;
                }
            st = dhsa_layout_set(*out, 0, g, qb, tmp, c);
        }
    if (st) {
        dhsa_layout_free(*out);
        *out = NULL;
    }
    return st;
}

/* A scratch of at least bytes: shard buffer i when it is large enough,
 * else *own (malloc, the caller frees): a routing-index delta larger than
 * one layer's K and V of a rank, which needs chunks of a key or two. */
void *dhsa__dist_scratch(dhsa__dist *s, int i, size_t bytes, void **own) {
    *own = NULL;
    if (bytes <= s->dbuf_bytes) return s->dbuf[i];
    return *own = malloc(bytes);
}

/* DHSA: every rank's copy of layer l's index takes the prefill's keys in
 * position order, stripe piece by stripe piece: the piece's rank appends
 * them from its cache and broadcasts what changed (the chunks it closed,
 * the open chunk's sums, the rings). */
static dhsa_status dist_relay(dhsa__dist *s, int64_t from, int64_t to) {
    const dhsa_dist *d = s->dist;
    const int64_t S = s->stripe, R = d->size, me = d->rank;
    const int64_t hk = s->in->head_dim_k;
    dhsa_kv_index *ix = s->io->ix;
    char why[256] = "";
    for (int64_t g = from; g < to;) {
        int64_t g1 = (g / S + 1) * S < to ? (g / S + 1) * S : to, owner = (g / S) % R;
        int64_t c0 = dhsa_kv_index_chunks(ix, NULL);
        uint64_t bytes = 0;
        dhsa_status st;
        if (owner == me) {
            int64_t l0 = dist_count_before(S, R, me, g);
            dhsa_tensor kn = dhsa__dist_cache_view(s, 0, s->cap);
            kn.data = (char *)kn.data + (size_t)l0 * (size_t)hk * dhsa_type_size(s->kv_type);
            kn.shape[2] = g1 - g;
            if ((st = dhsa_kv_index_append(ix, &kn))) return st;
            bytes = dhsa__kv_index_delta_bytes(ix, c0);
        }
        if (d->bcast(d->user, &bytes, sizeof bytes, (int)owner, why)) return dhsa__dist_fail("relaying the routing index", why);
        void *own, *buf = dhsa__dist_scratch(s, 0, (size_t)bytes, &own);
        if (!buf) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory for a routing-index delta");
        if (owner == me) dhsa__kv_index_delta_write(ix, c0, buf);
        int bad = d->bcast(d->user, buf, (size_t)bytes, (int)owner, why);
        st = DHSA_OK;
        if (!bad && owner != me) {
            st = dhsa__kv_index_delta_read(ix, buf, (size_t)bytes);
            s->dst.index += (double)bytes + sizeof bytes;
        }
        free(own);
        if (bad) return dhsa__dist_fail("relaying the routing index", why);
        if (st) return st;
        g = g1;
    }
    return DHSA_OK;
}

/* The routing call of piece i at layer l: its query rows over the whole
 * context's keys (the index holds them all; the key tensors only carry
 * the shape). */
static dhsa_attn_desc piece_desc(const dhsa__dist *s, int64_t i) {
    const dhsa_model_info *in = s->in;
    const int64_t Hq = in->n_head, hk = in->head_dim_k, hv = in->head_dim_v, Lk = dhsa_kv_index_length(s->io->ix);
    dhsa_attn_desc a = dhsa_attn_default_desc();
    a.q = dhsa_tensor_blhd(s->q + s->pieces[i][0] * Hq * hk, DHSA_F32, 1, s->pieces[i][1], Hq, hk);
    a.k = dhsa_tensor_bhld(s->kv, s->kv_type, 1, in->n_head_kv, Lk, hk);
    a.v = dhsa_tensor_bhld(s->kv, s->kv_type, 1, in->n_head_kv, Lk, hv);
    a.o = dhsa_tensor_blhd(s->att, DHSA_F32, 1, s->pieces[i][1], Hq, hv);
    a.causal = 1;
    a.q_pos0 = s->pieces[i][2];
    a.softcap = in->attn_softcap;
    a.scale = in->attn_scale;
    return a;
}

/* The keys another rank q holds that this rank's prefill queries could
 * see: those before its last position. */
static int64_t dist_visible(const dhsa__dist *s, int64_t q) {
    if (s->n_pieces == 0) return 0;
    const int64_t *last = s->pieces[s->n_pieces - 1];
    return dist_count_before(s->stripe, s->dist->size, q, last[2] + last[1]);
}

/* ------------------------------------------------ a fetch budget per rank --- */

/* Marks on marks [cap + 1] the part of the n global ranges rg that rank q
 * holds, in q's local slots (map_ranges' pieces): +1 where a piece starts,
 * -1 where it ends. */
static void mark_ranges(int64_t S, int64_t R, int64_t q, const int64_t *rg, int64_t n, int32_t *marks) {
    for (int64_t i = 0; i < n; i++) {
        int64_t a = rg[2 * i], b = rg[2 * i + 1];
        int64_t st = a / S;
        st += ((q - st % R) % R + R) % R;
        for (; st * S < b; st += R) {
            int64_t x0 = st * S > a ? st * S : a, x1 = (st + 1) * S < b ? (st + 1) * S : b;
            if (x0 >= x1) continue;
            const int64_t y0 = dist_count_before(S, R, q, x0);
            marks[y0]++;
            marks[y0 + (x1 - x0)]--;
        }
    }
}

/* The union of what marks [n + 1] covers as sorted disjoint ranges, those
 * that touch joined (dhsa__ranges_normalise's form), into out; marks is
 * zero again after. Returns the count (at most n / 2 + 1). */
static int64_t collect_ranges(int32_t *marks, int64_t n, int64_t *out) {
    int64_t k = 0, c = 0;
    for (int64_t x = 0; x <= n; x++) {
        if (!marks[x]) continue;
        const int64_t was = c;
        c += marks[x];
        marks[x] = 0;
        if (!was && c) out[2 * k] = x;
        else if (was && !c) out[2 * k++ + 1] = x;
    }
    return k;
}

/* How many of the keys [x0, x1) the sorted disjoint ranges r [n] cover. */
static int64_t covered(const int64_t *r, int64_t n, int64_t x0, int64_t x1) {
    int64_t lo = 0, hi = n; /* the first range ending after x0 */
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (r[2 * mid + 1] <= x0) lo = mid + 1;
        else hi = mid;
    }
    int64_t c = 0;
    for (int64_t i = lo; i < n && r[2 * i] < x1; i++) {
        int64_t a = r[2 * i] > x0 ? r[2 * i] : x0, b = r[2 * i + 1] < x1 ? r[2 * i + 1] : x1;
        c += b > a ? b - a : 0;
    }
    return c;
}

static int cmp_weight_desc(const void *x, const void *y) {
    const chunk_weight *a = x, *b = y;
    if (a->w != b->w) return a->w > b->w ? -1 : 1;
    return a->c < b->c ? -1 : a->c > b->c;
}

/* dist_fetch_share F > 0 (docs/dist.md, "A fetch budget per rank"): which
 * of layer l's chunks this rank's blocks may select, *out = allowed
 * [groups][n_chunks] (s->allowed). Every piece is routed once with
 * no chunk a candidate, which gives the ranges its blocks read whatever
 * they select (sinks, local keys, open tail, dense blocks) and sums each
 * chunk's estimated attention weight per key over the blocks. Then, per
 * routed group, the chunks in order of that sum: a chunk is allowed when
 * the keys it adds on every other rank q (those not read anyway) fit what
 * is left of q's budget, floor(F x q's visible keys) less the keys read
 * anyway; a chunk that does not fit is passed over for smaller ones; a
 * chunk held by this rank alone costs nothing. */
static dhsa_status fetch_plan(dhsa__dist *s, unsigned char **out) {
    const dhsa_kv_index *ix = s->io->ix;
    const int64_t S = s->stripe, R = s->dist->size, me = s->dist->rank, G = dhsa__kv_index_groups(ix);
    const int64_t *starts;
    const int64_t nc = dhsa_kv_index_chunks(ix, &starts);
    const double F = s->fetch_share;
    *out = NULL;
    if (G > s->groups || nc > s->max_chunks) /* dims_of's bounds: a bug if they are passed */
        return dhsa__fail(DHSA_ERR_INTERNAL, "context parallel: %lld chunks in %lld groups, %lld in %lld planned",
                          (long long)nc, (long long)G, (long long)s->max_chunks, (long long)s->groups);
    unsigned char *allowed = s->allowed, *none = s->none;
    double *agg = s->agg;
    chunk_weight *order = s->order;
    int64_t *left = s->left, *need = left + R;
    dhsa_status st = DHSA_OK;
    for (int64_t x = 0; x < G * nc; x++) agg[x] = -INFINITY;
    /* what each group reads anyway of each other rank: the union over the
     * pieces' blocks, marked per (group, rank), then collected */
    for (int64_t i = 0; i < s->n_pieces && !st; i++) {
        dhsa_attn_desc a = piece_desc(s, i);
        dhsa_layout *fx = NULL;
        if ((st = dhsa__kv_index_route_masked(s->ctx, ix, &a, none, agg, &fx))) break;
        for (int64_t g = 0; g < G; g++)
            for (int64_t qb = 0; qb < fx->n_blocks; qb++) {
                const int64_t *rg;
                int64_t n;
                dhsa_layout_get(fx, 0, g, qb, &rg, &n); /* G = 1: head 0 routes for all */
                for (int64_t q = 0; q < R; q++)
                    if (q != me) mark_ranges(S, R, q, rg, n, s->fmarks + (size_t)(g * R + q) * (size_t)(s->cap + 1));
            }
        dhsa_layout_free(fx);
    }
    for (int64_t x = 0; x < G * R; x++) /* always: the marks are zero again after */
        s->nfixed[x] = collect_ranges(s->fmarks + (size_t)x * (size_t)(s->cap + 1), s->cap, s->fixed + 2 * x * s->rmax);
    for (int64_t g = 0; g < G && !st; g++) {
        for (int64_t q = 0; q < R; q++) {
            const int64_t vis = dist_visible(s, q);
            int64_t budget = (int64_t)floor(F * (double)vis);
            while (budget > 0 && (double)budget / (double)vis > F) budget--; /* the share, as counted, <= F */
            const int64_t *f = s->fixed + 2 * (g * R + q) * s->rmax, nf = s->nfixed[g * R + q];
            left[q] = budget;
            for (int64_t k = 0; k < nf; k++) left[q] -= f[2 * k + 1] - f[2 * k];
        }
        int64_t n = 0;
        for (int64_t c = 0; c < nc; c++) {
            allowed[g * nc + c] = 0;
            if (agg[g * nc + c] > -INFINITY) { /* a block could see it */
                order[n].w = agg[g * nc + c];
                order[n++].c = c;
            }
        }
        qsort(order, (size_t)n, sizeof *order, cmp_weight_desc);
        for (int64_t k = 0; k < n; k++) {
            const int64_t c = order[k].c, a = starts[c], b = starts[c + 1];
            for (int64_t q = 0; q < R; q++) need[q] = 0;
            for (int64_t p = a / S; p * S < b; p++) { /* the chunk's pieces, stripe by stripe */
                const int64_t q = p % R, x0 = p * S > a ? p * S : a, x1 = (p + 1) * S < b ? (p + 1) * S : b;
                if (q == me || x0 >= x1) continue;
                const int64_t y0 = dist_count_before(S, R, q, x0), y1 = y0 + (x1 - x0);
                need[q] += (y1 - y0) - covered(s->fixed + 2 * (g * R + q) * s->rmax, s->nfixed[g * R + q], y0, y1);
            }
            int fits = 1;
            for (int64_t q = 0; q < R; q++) fits &= need[q] == 0 || need[q] <= left[q];
            if (!fits) continue;
            for (int64_t q = 0; q < R; q++) left[q] -= need[q];
            allowed[g * nc + c] = 1;
        }
    }
    if (!st) *out = allowed;
    return st;
}

/* The DHSA part of a sharded prefill at layer l: relay the index, route
 * each piece over the whole context's chunks (with dist_fetch_share, over
 * this rank's chunks and those fetch_plan allows), attend the local part
 * of the selection, ask each other rank for the keys it holds of the
 * union of this rank's selections (with dist_fetch_share, one union per
 * KV head: each head fetches its own), and attend those as they arrive. */
static dhsa_status dist_prefill_dhsa(dhsa__dist *s) {
    const dhsa_model_info *in = s->in;
    const dhsa_dist *d = s->dist;
    const int64_t S = s->stripe, R = d->size, me = d->rank, Hq = in->n_head, hv = in->head_dim_v;
    const int64_t Hkv = in->n_head_kv, nl = s->fetch_share > 0 ? Hkv : 1; /* request lists per rank */
    const size_t row_bytes = (size_t)(in->head_dim_k + hv) * dhsa_type_size(s->kv_type);
    char why[256] = "";
    dhsa_status st = dist_relay(s, s->len, s->dist_end);
    if (st) return st;
    const int64_t np = s->n_pieces;
    dhsa_layout **gl = s->gl;
    int64_t *nreq = s->nreq, *ngot = s->ngot, **req = s->req, **pre = s->pre;
    size_t *sb = s->sb, *rb = s->rb;
    int64_t *inbox = s->inbox, *outbox = s->reqs, *nh = s->nh;
    const unsigned char *allowed = NULL;
    for (int64_t i = 0; i < np; i++) gl[i] = NULL;
    for (int64_t x = 0; x < R * nl; x++) { /* list x: rank x / nl, its KV head x % nl (nl = Hkv) */
        nreq[x] = ngot[x] = 0;
        req[x] = s->reqs;
        pre[x] = s->pres + x;
        pre[x][0] = 0;
    }
    if (s->fetch_share > 0) {
        unsigned char *al = NULL;
        st = fetch_plan(s, &al);
        allowed = al;
    }
    /* the last rows' exact masses (every rank takes part) */
    const int64_t *starts;
    const int64_t nc = dhsa_kv_index_chunks(s->io->ix, &starts);
    if (s->io->rest) { /* the summaries of the chunks left out, in step with the index (every rank takes part) */
        dhsa_status rs = dhsa__dist_rest(s, s->len_loc + s->n_rows, starts, nc);
        if (!st) st = rs;
        if (rs && rs != DHSA_ERR_INTERNAL) return rs; /* the transport failed, or out of memory */
    }
    if (s->nx > 0) {
        dhsa_status xs = dhsa__dist_exact(s, s->len_loc + s->n_rows, starts, nc);
        if (!st) st = xs;
        if (xs && xs != DHSA_ERR_OUT_OF_MEMORY && xs != DHSA_ERR_INTERNAL) return xs; /* the transport failed */
    }
    /* route every piece over the whole context (the index holds it all) */
    for (int64_t i = 0; i < np && !st; i++) {
        dhsa_attn_desc a = piece_desc(s, i);
        const int64_t *sg = NULL;
        for (int64_t x = 0; x < s->nxs; x++)
            if (s->xseg[x][0] >= a.q_pos0 && s->xseg[x][0] < a.q_pos0 + s->pieces[i][1]) sg = s->xseg[x];
        if (sg) st = dhsa__kv_index_route_mass(s->ctx, s->io->ix, &a, allowed, sg[0] - a.q_pos0,
                                               s->xm + sg[4] * (nc + 1), s->nxb, NULL, &gl[i]);
        else st = dhsa__kv_index_route_masked(s->ctx, s->io->ix, &a, allowed, NULL, &gl[i]);
        if (st) break;
        a.layout = gl[i];
        count_attention(s, &a);
    }
    /* the local part, causal in local slots */
    for (int64_t i = 0; i < np && !st; i++) {
        int64_t r0 = s->pieces[i][0], m = s->pieces[i][1], l0 = s->len_loc + r0;
        dhsa_layout *ll = NULL;
        if ((st = sub_layout(s, gl[i], me, NULL, NULL, NULL, 1, l0 + m, &ll))) break;
        st = dist_call(s, r0, m, dhsa__dist_cache_view(s, 0, l0 + m), dhsa__dist_cache_view(s, 1, l0 + m), 1, l0, ll, s->att, s->lse1);
        dhsa_layout_free(ll);
    }
    /* what to ask of each rank: the union of the pieces' selections it
     * holds, over the KV heads (nl = 1) or per head (nl = Hkv) */
    for (int64_t x = 0, at = 0; x < R * nl && !st; x++) { /* back to back in the outbox, in rank order */
        const int64_t q = x / nl, h = x % nl, g0 = nl == 1 ? 0 : h, g1 = nl == 1 ? Hkv : h + 1;
        req[x] = s->reqs + 2 * at;
        pre[x] = s->pres + at + x;
        pre[x][0] = 0;
        if (q == me) continue;
        for (int64_t i = 0; i < np; i++)
            for (int64_t g = g0; g < g1; g++)
                for (int64_t qb = 0; qb < gl[i]->n_blocks; qb++) {
                    const int64_t *rg;
                    int64_t n;
                    dhsa_layout_get(gl[i], 0, g, qb, &rg, &n);
                    mark_ranges(S, R, q, rg, n, s->marks);
                }
        nreq[x] = collect_ranges(s->marks, s->cap, req[x]);
        for (int64_t j = 0; j < nreq[x]; j++) pre[x][j + 1] = pre[x][j] + req[x][2 * j + 1] - req[x][2 * j];
        at += nreq[x];
    }
    /* A failure above still takes part in the exchanges (with nothing
     * asked), so that the other ranks are not left waiting. */
    for (int64_t q = 0; q < R; q++) sb[q] = rb[q] = (size_t)nl * sizeof(int64_t);
    if (d->alltoallv(d->user, nreq, sb, ngot, rb, why)) {
        st = dhsa__dist_fail("exchanging the key requests", why);
        goto done;
    }
    int64_t n_out = 0, n_in = 0;
    for (int64_t x = 0; x < R * nl; x++) {
        n_out += x / nl == me ? 0 : nreq[x];
        n_in += x / nl == me ? 0 : ngot[x];
    }
    (void)n_out;
    if (n_in > R * nl * s->rmax) { /* each list is normalised in this rank's cap slots: a bug if passed */
        st = dhsa__fail(DHSA_ERR_INTERNAL, "context parallel: %lld key ranges asked of rank %lld, %lld planned",
                        (long long)n_in, (long long)me, (long long)(R * nl * s->rmax));
        goto done;
    }
    for (int64_t q = 0; q < R; q++) {
        int64_t n_q = 0, g_q = 0;
        for (int64_t h = 0; q != me && h < nl; h++) {
            n_q += nreq[q * nl + h];
            g_q += ngot[q * nl + h];
        }
        sb[q] = (size_t)n_q * 2 * sizeof(int64_t);
        rb[q] = (size_t)g_q * 2 * sizeof(int64_t);
        s->dst.index += (double)rb[q] + (q == me ? 0 : (double)nl * sizeof(int64_t));
    }
    if (d->alltoallv(d->user, outbox, sb, inbox, rb, why)) {
        st = dhsa__dist_fail("exchanging the key requests", why);
        goto done;
    }
    /* R - 1 rounds: in round k this rank serves rank me + k and is served
     * by rank me - k, one shard buffer each way */
    for (int64_t k = 1; k < R; k++) {
        int64_t to = (me + k) % R, from = (me - k + R) % R;
        int64_t off = 0;
        for (int64_t x = 0; x < to * nl; x++) off += x / nl == me ? 0 : ngot[x];
        int64_t rows_out = pack_lists(s, inbox + 2 * off, ngot + to * nl, nl, s->dbuf[0]);
        for (int64_t q = 0; q < R; q++) sb[q] = rb[q] = 0;
        sb[to] = (size_t)rows_out * row_bytes;
        /* the keys coming from `from`, per KV head, and the most of one head */
        int64_t rows_in = 0, n_most = 0;
        for (int64_t g = 0; g < Hkv; g++) {
            const int64_t x = from * nl + (nl == 1 ? 0 : g);
            nh[g] = from == me ? 0 : pre[x][nreq[x]];
            rows_in += nh[g];
            n_most = nh[g] > n_most ? nh[g] : n_most;
        }
        rb[from] = (size_t)rows_in * row_bytes;
        if (d->alltoallv(d->user, s->dbuf[0], sb, s->dbuf[1], rb, why)) {
            st = dhsa__dist_fail("fetching the selected keys", why);
            goto done;
        }
        const int64_t vis = dist_visible(s, from);
        s->dst.kv += (double)rb[from];
        s->dst.kv_keys += (double)rows_in / (double)Hkv;
        s->dst.kv_visible += (double)vis;
        if (vis > 0 && (double)rows_in / ((double)Hkv * (double)vis) > s->dst.kv_share_max)
            s->dst.kv_share_max = (double)rows_in / ((double)Hkv * (double)vis);
        if (st || n_most == 0) continue;
        if (nl > 1) spread_heads(s, s->dbuf[1], nh, n_most);
        dhsa_tensor kk, vv;
        shard_views(s, s->dbuf[1], n_most, &kk, &vv);
        for (int64_t i = 0; i < np && !st; i++) {
            int64_t r0 = s->pieces[i][0], m = s->pieces[i][1];
            dhsa_layout *fl = NULL;
            if ((st = sub_layout(s, gl[i], from, req + from * nl, pre + from * nl, nreq + from * nl, nl, n_most, &fl)))
                break;
            st = dist_call(s, r0, m, kk, vv, 0, 0, fl, s->o2, s->lse2);
            dhsa_layout_free(fl);
            if (!st) st = lse_merge(s->att + r0 * Hq * hv, s->lse1 + r0 * Hq, s->o2 + r0 * Hq * hv, s->lse2 + r0 * Hq, m, Hq, hv);
        }
    }
    /* the chunks each block left out, summarised, merged in (route/rest.h: as one process) */
    for (int64_t i = 0; i < np && !st && s->io->rest; i++) {
        const int64_t r0 = s->pieces[i][0], m = s->pieces[i][1];
        dhsa_attn_desc a = call_desc(s, r0, m, dhsa__dist_cache_view(s, 0, 1), dhsa__dist_cache_view(s, 1, 1), s->att, s->lse1);
        a.causal = 1;
        a.q_pos0 = s->pieces[i][2];
        double summaries = 0;
        st = dhsa__rest_attend(s->ctx, s->io->rest, &a, gl[i], s->o2 + r0 * Hq * hv, s->lse2 + r0 * Hq, &summaries);
        s->io->stats[0]->summaries += summaries;
        s->io->stats[1]->summaries += summaries;
    }
done:
    for (int64_t i = 0; i < np; i++) dhsa_layout_free(gl[i]);
    return st;
}

/* The dense part of a sharded prefill at layer l: local keys causal, then
 * every other rank's shard as it comes round the ring, the next transfer
 * running while this one is attended. */
static dhsa_status dist_prefill_dense(dhsa__dist *s) {
    const dhsa_model_info *in = s->in;
    const dhsa_dist *d = s->dist;
    const int64_t S = s->stripe, R = d->size, me = d->rank, Hq = in->n_head, hv = in->head_dim_v;
    char why[256] = "";
    dhsa_status st = DHSA_OK;
    /* a sliding window of w keys (gemma2/3): each stripe's last w - 1 keys
     * at most, as far round the ring as a window reaches back,
     * ceil((w - 1) / S) stripes (every rank the same) */
    const int64_t w = s->io->window, steps = w > 0 && (w - 1 + S - 1) / S + 1 < R ? (w - 1 + S - 1) / S + 1 : R;
    const int64_t n_mine = dist_count_before(S, R, me, s->dist_end);
    int64_t mine[2] = {0, n_mine}, one = 1;
    if (w > 0 && steps > 1) {
        one = 0;
        for (int64_t t0 = 0; t0 < n_mine; t0 += S, one++) {
            const int64_t c = n_mine - t0 < S ? n_mine - t0 : S;
            s->wrg[one][0] = t0 + c - (c > w - 1 ? w - 1 : c);
            s->wrg[one][1] = t0 + c;
        }
        pack_lists(s, &s->wrg[0][0], &one, 1, s->dbuf[0]);
    } else if (steps > 1) {
        pack_lists(s, mine, &one, 1, s->dbuf[0]);
    }
    char *cur = s->dbuf[0], *nxt = s->dbuf[1];
    for (int64_t k = 1; k <= steps; k++) {
        int64_t held = (me - k + 1 + R) % R, coming = (me - k + R) % R; /* cur holds held's shard */
        int64_t n_held = dist_count_before(S, R, held, s->dist_end), n_coming = dist_count_before(S, R, coming, s->dist_end);
        int64_t rows_held = w > 0 ? window_rows(S, n_held, w) : n_held, rows_coming = w > 0 ? window_rows(S, n_coming, w) : n_coming;
        if (k < steps && d->ring_start(d->user, cur, shard_bytes(s, rows_held), nxt, shard_bytes(s, rows_coming), why))
            return dhsa__dist_fail("passing K/V round the ring", why);
        for (int64_t i = 0; i < s->n_pieces && !st; i++) {
            int64_t r0 = s->pieces[i][0], m = s->pieces[i][1], g0 = s->pieces[i][2];
            if (w > 0) { /* the stripes the window reaches: the local ones first (their first call writes) */
                const int64_t l1 = s->len_loc + r0 + m;
                dhsa_tensor kk = dhsa__dist_cache_view(s, 0, l1), vv = dhsa__dist_cache_view(s, 1, l1);
                int calls = k == 1 ? 0 : 1;
                if (k > 1) shard_views(s, cur, rows_held, &kk, &vv);
                st = window_part(s, r0, m, g0, held, kk, vv, k == 1 ? l1 : n_held, k > 1, s->att, s->lse1, s->o2,
                                 s->lse2, &calls);
                continue;
            }
            if (k == 1) { /* the local keys: every earlier slot, the piece's own causal */
                int64_t l0 = s->len_loc + r0;
                st = dist_call(s, r0, m, dhsa__dist_cache_view(s, 0, l0 + m), dhsa__dist_cache_view(s, 1, l0 + m), 1, l0, NULL, s->att,
                               s->lse1);
                continue;
            }
            int64_t cnt = dist_count_before(S, R, held, g0); /* held's keys before the piece */
            if (cnt == 0) continue;
            dhsa_tensor kk, vv;
            shard_views(s, cur, n_held, &kk, &vv);
            kk.shape[2] = vv.shape[2] = cnt;
            if (!(st = dist_call(s, r0, m, kk, vv, 0, 0, NULL, s->o2, s->lse2)))
                st = lse_merge(s->att + r0 * Hq * hv, s->lse1 + r0 * Hq, s->o2 + r0 * Hq * hv, s->lse2 + r0 * Hq, m, Hq, hv);
        }
        if (k < steps) { /* always completed, even after a failure: the peers are waiting on it */
            if (d->ring_wait(d->user, why)) return dhsa__dist_fail("passing K/V round the ring", why);
            s->dst.kv += (double)shard_bytes(s, rows_coming);
            if (w > 0) s->dst.kv_window += (double)rows_coming;
            else s->dst.kv_keys += (double)rows_coming;
            char *t = cur;
            cur = nxt;
            nxt = t;
        }
    }
    return st;
}

/* A decode row on every rank: the owner of its position caches its key and
 * value, every rank's index takes the key (every rank computed it), every
 * rank attends its own keys (DHSA: its part of the one routing every rank
 * computes alike), and the partials are gathered and merged in rank order,
 * so that every rank holds the same output. */
static dhsa_status dist_decode(dhsa__dist *s) {
    const dhsa_model_info *in = s->in;
    const dhsa_dist *d = s->dist;
    const int64_t S = s->stripe, R = d->size, me = d->rank, Hq = in->n_head, hk = in->head_dim_k, hv = in->head_dim_v,
                  Hkv = in->n_head_kv;
    const int64_t p = s->rowpos[0], cnt = dist_count_before(S, R, me, p + 1);
    char why[256] = "";
    dhsa_status st = DHSA_OK;
    dhsa_layout *gl = NULL, *ll = NULL;
    dhsa_attn_desc a = dhsa_attn_default_desc();
    a.q = dhsa_tensor_blhd(s->q, DHSA_F32, 1, 1, Hq, hk);
    a.o = dhsa_tensor_blhd(s->att, DHSA_F32, 1, 1, Hq, hv);
    a.causal = 1;
    a.q_pos0 = p;
    a.window = s->io->window;
    a.softcap = in->attn_softcap;
    a.scale = in->attn_scale;
    if (s->io->ix) {
        const float *key = s->kt;
        if (s->kv_type == DHSA_F16) { /* the key as the owner's cache holds it */
            for (int64_t x = 0; x < Hkv * hk; x++) s->krow[x] = dhsa_f16_to_f32(dhsa_f32_to_f16(s->kt[x]));
            key = s->krow;
        }
        dhsa_tensor kn = dhsa_tensor_bhld((void *)key, DHSA_F32, 1, Hkv, 1, hk);
        if ((st = dhsa_kv_index_append(s->io->ix, &kn))) return st;
        a.k = dhsa_tensor_bhld(s->kv, s->kv_type, 1, Hkv, p + 1, hk);
        a.v = dhsa_tensor_bhld(s->kv, s->kv_type, 1, Hkv, p + 1, hv);
        if (s->nx > 0) { /* the first decode step after an answering eval: exact (every rank takes part) */
            const int64_t *starts;
            const int64_t nc = dhsa_kv_index_chunks(s->io->ix, &starts);
            if ((st = dhsa__dist_exact(s, cnt, starts, nc))) return st;
            st = dhsa__kv_index_route_mass(s->ctx, s->io->ix, &a, NULL, 0, s->xm, s->nxb, s->io->keep, &gl);
        } else {
            st = s->io->keep ? dhsa_kv_index_route_keep(s->ctx, s->io->ix, &a, s->io->keep, &gl)
                             : dhsa_kv_index_route(s->ctx, s->io->ix, &a, &gl);
        }
        if (st) return st;
        a.layout = gl;
        st = sub_layout(s, gl, me, NULL, NULL, NULL, 1, cnt, &ll);
    } else {
        a.k = dhsa_tensor_bhld(s->kv, s->kv_type, 1, Hkv, p + 1, hk);
        a.v = a.k;
    }
    if (!st) count_attention(s, &a);
    const int64_t row = Hq * (hv + 1);
    float *mine = s->o2; /* [Hq][hv] then lse [Hq] */
    int calls = 0;
    if (!st && cnt > 0 && a.window > 0) { /* a sliding window: this rank's stripes in it (att, lse1: scratch) */
        st = window_part(s, 0, 1, p, me, dhsa__dist_cache_view(s, 0, cnt), dhsa__dist_cache_view(s, 1, cnt), cnt, 0,
                         mine, mine + Hq * hv, s->att, s->lse1, &calls);
    } else if (!st && cnt > 0) {
        calls = 1;
        st = dist_call(s, 0, 1, dhsa__dist_cache_view(s, 0, cnt), dhsa__dist_cache_view(s, 1, cnt), 1, cnt - 1, ll, mine, mine + Hq * hv);
    }
    if (calls == 0) {
        for (int64_t x = 0; x < Hq * hv; x++) mine[x] = 0.0f;
        for (int64_t x = 0; x < Hq; x++) mine[Hq * hv + x] = -INFINITY;
    }
    dhsa_layout_free(ll);
    float *all = s->gather;
    if (d->allgather(d->user, mine, (size_t)row * sizeof(float), all, why)) {
        dhsa_layout_free(gl);
        return dhsa__dist_fail("gathering the decode partials", why);
    }
    s->dst.partial += (double)((R - 1) * row) * sizeof(float);
    memcpy(s->att, all, (size_t)(Hq * hv) * sizeof(float));
    memcpy(s->lse1, all + Hq * hv, (size_t)Hq * sizeof(float));
    for (int64_t q = 1; q < R; q++) {
        dhsa_status ms = lse_merge(s->att, s->lse1, all + q * row, all + q * row + Hq * hv, 1, Hq, hv);
        if (!st) st = ms;
    }
    if (s->io->carry && gl) { /* what this step hands the next (every rank takes part) */
        const int64_t *starts;
        const int64_t nc = dhsa_kv_index_chunks(s->io->ix, &starts);
        dhsa_status cs = dhsa__dist_carry(s, gl, p, cnt, starts, nc, s->io->carry_share, s->io->carry);
        if (!st) st = cs;
    }
    dhsa_layout_free(gl);
    return st;
}

/* ------------------------------------------------------------- an eval --- */

dhsa_status dhsa__dist_layer(dhsa__dist *s, const dhsa__dist_layer_io *io) {
    const int64_t n = s->n_rows, S = s->stripe, R = s->dist->size;
    s->io = io;
    if (s->mode == 2) {
        const int64_t p = s->rowpos[0];
        if ((p / S) % R == s->dist->rank) {
            store_rows(&io->k, s->kt, 1, s->len_loc);
            store_rows(&io->v, s->vt, 1, s->len_loc);
        }
        s->dst.decode_layers++;
        return dist_decode(s);
    }
    if (s->mode != 1) return dhsa__fail(DHSA_ERR_INTERNAL, "context parallel: a layer outside an eval");
    if (io->ix && io->window) return dhsa__fail(DHSA_ERR_INTERNAL, "context parallel: a routed sliding-window layer");
    if (n > 0) {
        store_rows(&io->k, s->kt, n, s->len_loc);
        store_rows(&io->v, s->vt, n, s->len_loc);
    }
    s->dst.prefill_layers++;
    if (io->ix) return dist_prefill_dhsa(s);
    if (n == 0) return dist_prefill_dense(s);
    const dhsa_model_info *in = s->in;
    dhsa_attn_desc a = dhsa_attn_default_desc(); /* for the statistics: the rows' causal keys */
    dhsa_status st = dist_prefill_dense(s);
    for (int64_t i = 0; !st && i < s->n_pieces; i++) {
        a.q = dhsa_tensor_blhd(s->q, DHSA_F32, 1, s->pieces[i][1], in->n_head, in->head_dim_k);
        a.k = dhsa_tensor_bhld(s->kv, s->kv_type, 1, in->n_head_kv, s->dist_end, in->head_dim_k);
        a.q_pos0 = s->pieces[i][2];
        a.window = io->window;
        count_attention(s, &a);
    }
    return st;
}

dhsa_status dhsa__dist_begin(dhsa__dist *s, int64_t len, const int32_t *ids, int64_t n, int want_logits, int exact,
                             dhsa__dist_rows *rows) {
    const int64_t S = s->stripe, R = s->dist->size, me = s->dist->rank;
    memset(rows, 0, sizeof *rows);
    s->len = len;
    dhsa__dist_exact_rows(s, len, len + n, exact);
    if (n == 1) {
        s->mode = 2;
        s->n_rows = 1;
        s->rowpos[0] = len;
        rows->ids = ids;
        rows->pos = s->rowpos;
        rows->n = 1;
        rows->logits = want_logits;
        return DHSA_OK;
    }
    const int64_t end = len + n, n_own = dist_count_before(S, R, me, end) - dist_count_before(S, R, me, len);
    if (n_own > s->cap)
        return dhsa__fail(DHSA_ERR_TOO_LARGE, "context parallel: %lld positions of this prefill are rank %lld's, its "
                          "buffers hold %lld", (long long)n_own, (long long)me, (long long)s->cap);
    if (n / S + 3 > s->max_pieces) /* n <= n_ctx - len: a bug if passed */
        return dhsa__fail(DHSA_ERR_INTERNAL, "context parallel: a prefill of %lld tokens in pieces of %lld",
                          (long long)n, (long long)S);
    s->n_pieces = 0;
    int64_t r = 0;
    for (int64_t g = len; g < end;) {
        int64_t g1 = (g / S + 1) * S < end ? (g / S + 1) * S : end;
        if ((g / S) % R == me) {
            s->pieces[s->n_pieces][0] = r;
            s->pieces[s->n_pieces][1] = g1 - g;
            s->pieces[s->n_pieces][2] = g;
            s->n_pieces++;
            for (int64_t x = g; x < g1; x++, r++) {
                s->own[r] = ids[x - len];
                s->rowpos[r] = x;
            }
        }
        g = g1;
    }
    s->mode = 1;
    s->dist_end = end;
    s->n_rows = n_own;
    rows->ids = s->own;
    rows->pos = s->rowpos;
    rows->n = n_own;
    rows->logits = want_logits && ((end - 1) / S) % R == me;
    return DHSA_OK;
}

dhsa_status dhsa__dist_end(dhsa__dist *s, dhsa_status st, float *logits) {
    const int64_t S = s->stripe, R = s->dist->size, me = s->dist->rank, V = s->in->n_vocab;
    const int mode = s->mode;
    s->mode = 0;
    s->io = NULL;
    if (mode == 2) {
        if (st) return st;
        if ((s->len / S) % R == me) s->len_loc++;
        s->len++;
        return DHSA_OK;
    }
    if (st) return st;
    char why[256] = "";
    const int64_t last_owner = ((s->dist_end - 1) / S) % R;
    if (logits) {
        if (s->dist->bcast(s->dist->user, logits, (size_t)V * sizeof(float), (int)last_owner, why))
            return dhsa__dist_fail("broadcasting the logits", why);
        if (last_owner != me) s->dst.logits += (double)V * sizeof(float);
    }
    s->len_loc += s->n_rows;
    s->len = s->dist_end;
    return DHSA_OK;
}
