/* session.c: one sequence through a loaded model: the memory plan, the KV
 * cache, prefill in ubatches and decode, with dense or routed attention.
 *
 * Buffers (per ubatch of n <= n_ubatch tokens, row-major, F32):
 *   x   [n][n_embd]        residual stream
 *   xb  [n][n_embd]        normed input / branch output
 *   q   [n][n_head][hd_k]  queries (post-RoPE)
 *   kt  [n][n_head_kv][hd_k], vt [n][n_head_kv][hd_v]  new keys / values
 *   att [n][n_head][hd_v]  attention output
 *   hb, hb2 [n][n_ff]      FFN gate / up
 *   rc, rs [2][n][n_rot/2] RoPE cos / sin of the ubatch's positions, for the
 *                          global layers [0] and the sliding ones [1] (gemma)
 * KV cache per layer, head-major so that decode streams each head's keys:
 *   K [n_head_kv][n_ctx][hd_k], V [n_head_kv][n_ctx][hd_v]   (F32 or F16)
 * Sparse methods route each layer's queries over its cache: DHSA (with
 * similarity or learned boundaries) and BLOCK through a dhsa_kv_index per
 * layer (O(chunks) per query block, online boundaries, so ubatch and
 * decode see the same chunks; the learned predictor scores each key once,
 * as it is appended), STREAM and ORACLE through dhsa_route over the cache.
 * Sliding-window layers (gemma2, gemma3) always run dense within their window.
 * What the session holds is planned first (src/model/session_plan.c:
 * dhsa_mem_plan, so that mem_limit bounds the peak RSS); a session split
 * between ranks hands each layer's cache and attention to src/dist
 * (dhsa__dist_layer, docs/dist.md).
 * Tested by tests/test_model.c, tests/test_session_*.c and tests/test_memlimit.c.
 */
#include "attn/kern.h"
#include "attn/stats.h"
#include "core/internal.h"
#include "dist/dist.h"
#include "model/model_internal.h"
#include "model/session_plan.h"
#include "route/carry.h"
#include "route/kv_index_internal.h"
#include "route/rest.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --------------------------------------------- sliding-window rings --- */

/* A sliding-window layer (gemma2, gemma3: window w) reads only the keys of
 * the last w positions, so its cache holds w - 1 + ubatch rows per head,
 * not the context: the w - 1 keys before a ubatch and the ubatch's own.
 * The rows hold positions [base, base + rows); when a ubatch would not
 * fit, the w - 1 keys it needs move to the front (a memmove of w - 1 rows,
 * once every ubatch + 1 tokens in decode) and base advances. Attention
 * gets the rows with k_pos0 = base, so its masks see true positions.
 * A failed eval must leave the committed keys: the first move of an eval
 * that drops any of the w - 1 keys before its start copies them to a
 * backup of w - 1 rows, which a roll-back puts back. A truncate to n needs
 * the keys of [n - w + 1, n): it is refused (nothing changed) when the
 * ring has moved past them; n = 0 always works. docs/model.md. */
struct layer_cache {
    int64_t rows;            /* positions per head: the context, or w - 1 + ubatch */
    int64_t backup;          /* rows per head of the backup (w - 1), 0 when not a ring */
    int64_t base;            /* position of row 0 */
    size_t k, v, bk, bv;     /* byte offsets in s->kv: K, V, and their backups */
    int saved;               /* the backup holds [saved_from, saved_from + saved_n) for this eval */
    int64_t saved_from, saved_n;
};

struct dhsa_session {
    dhsa_ctx *ctx;
    const dhsa_model *m;
    dhsa_session_params p;
    dhsa_mem_plan plan;
    int64_t len;                /* tokens in the cache */
    void *kv;                   /* dhsa_buffer_alloc: every layer's K then V */
    size_t k_layer, v_layer;    /* bytes of one layer's K / V */
    float *x, *xb, *q, *kt, *vt, *att, *hb, *hb2, *rc, *rs, *inv_freq; /* one ctx allocation */
    dhsa_kv_index **ix;         /* [n_layer] or NULL */
    dhsa__rest **rest;          /* [n_layer] or NULL: the summaries of the keys left out (rp.rest) */
    float *rest_buf;            /* [n_ubatch][n_head][head_dim_v + 2]: their output and both log-sum-exps */
    dhsa_router_params rp;      /* routing of the sparse methods */
    int broken;                 /* a failed eval could not be undone: reset first */
    atomic_int busy;            /* 1 while an eval or a reset runs on it */
    dhsa_attn_stats st_last, st_total; /* what attention really did (dhsa_session_get_stats) */
    int64_t cap;                /* positions per head in the cache: plan.n_ctx, or this rank's share */
    dhsa__dist *dist;           /* context parallelism (src/dist, docs/dist.md); NULL: one process */
    const int64_t *rowpos;      /* [n] the running context-parallel forward's rows' positions, else NULL */
    float *koff;                /* [n_layer][n_head_kv][hd_k] Q8_0 keys' offsets (key_offsets), after the cache; or NULL */
    struct layer_cache *lc;     /* [n_layer] where each layer's K / V live (a sliding layer's: a ring) */
    int64_t len0_eval;          /* the committed length when the running eval began */
    int64_t *carry;             /* [2][n_layer][n_head_kv][DHSA_CARRY_MAX]: the chunks the last one-token
                                   eval carries to the next (0) and the running one's (1), -1 = none; NULL:
                                   rp.carry off (route/carry.h) */
    int carry_ok;               /* carry[0] is the last eval's: it had one token and succeeded */
    int dist_decode;            /* a context-parallel eval of one token is running */
    int rest_now;               /* the eval being run attends the summaries (rp.rest: evals of more than
                                   one token; decode steps do not) */
    int64_t exact_from;         /* rows of the ubatch being run from which chunks are ranked by their
                                   exact attention (rp.exact_rows: the eval's last rows); INT64_MAX: none */
    int exact_next;             /* the last eval answered with exact rows: the next one-token eval (the
                                   first decode step) ranks its chunks exactly too */
};

/* Layer l's key offsets [n_head_kv][hd_k], or NULL (keys stored as they are). */
static const float *key_offset(const dhsa_session *s, int64_t l) {
    if (!s->koff) return NULL;
    return s->koff + (size_t)l * (size_t)(s->m->info.n_head_kv * s->m->info.head_dim_k);
}

/* Fills s->koff (the note above): the K bias on the channels RoPE turns by
 * at most DHSA__KOFF_MAX_TURN over the cache's positions, else 0. */
static void fill_key_offsets(dhsa_session *s) {
    const dhsa_model_info *in = &s->m->info;
    const int64_t hk = in->head_dim_k, half = in->n_rot / 2;
    for (int64_t l = 0; l < in->n_layer; l++) {
        const dhsa__layer *L = &s->m->layers[l];
        float *c = s->koff + (size_t)l * (size_t)(in->n_head_kv * hk);
        for (int64_t h = 0; h < in->n_head_kv; h++)
            for (int64_t i = 0; i < hk; i++) {
                int slow = 1;
                if (i < in->n_rot) {
                    int64_t pair = in->rope_neox ? i % half : i / 2;
                    double turn = (double)s->inv_freq[L->rope_set * half + pair] * (double)(s->plan.n_ctx - 1);
                    slow = turn <= DHSA__KOFF_MAX_TURN;
                }
                c[h * hk + i] = slow && L->bk ? L->bk[h * hk + i] : 0.0f;
            }
    }
}

/* ----------------------------------------------------------- create --- */

static void free_indexes(dhsa_session *s) {
    if (s->rest) {
        for (int64_t l = 0; l < s->m->info.n_layer; l++) dhsa__rest_free(s->rest[l]);
        free(s->rest);
        s->rest = NULL;
    }
    if (s->rest_buf) dhsa_ctx_release(s->ctx, s->rest_buf);
    s->rest_buf = NULL;
    if (!s->ix) return;
    for (int64_t l = 0; l < s->m->info.n_layer; l++) dhsa_kv_index_free(s->ix[l]);
    free(s->ix);
    s->ix = NULL;
}

static size_t rest_buf_floats(const dhsa_session *s) {
    const dhsa_model_info *in = &s->m->info;
    return (size_t)s->plan.n_ubatch * (size_t)in->n_head * (size_t)(in->head_dim_v + 2);
}

/* The summaries of the keys left out, one store per routed layer (rest.h). */
static dhsa_status make_rest(dhsa_session *s) {
    const dhsa_model_info *in = &s->m->info;
    s->rest = calloc((size_t)in->n_layer, sizeof *s->rest);
    dhsa_status st = DHSA_OK;
    if (!s->rest) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory");
    if (!s->dist) { /* the ranks merge the summaries in src/dist's buffers */
        s->rest_buf = dhsa__alloc(s->ctx, rest_buf_floats(s) * sizeof(float), &st);
        if (!s->rest_buf) return st;
    }
    const int64_t cap = dhsa__rest_max_chunks(&s->rp, s->plan.n_ctx);
    for (int64_t l = s->rp.rest - 1; l < in->n_layer && !st; l++) /* the layers that attend them */
        if (s->ix[l])
            st = dhsa__rest_create(s->ctx, in->n_head_kv, in->head_dim_k, in->head_dim_v, cap,
                                   s->p.kv_type == DHSA_F32, &s->rest[l]);
    return st;
}

static dhsa_status make_indexes(dhsa_session *s) {
    const dhsa_model_info *in = &s->m->info;
    s->ix = calloc((size_t)in->n_layer, sizeof *s->ix);
    if (!s->ix) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory");
    for (int64_t l = 0; l < in->n_layer; l++) {
        if (s->m->layers[l].window) continue;
        dhsa_status st = dhsa_kv_index_create(s->ctx, &s->rp, in->n_head_kv, in->head_dim_k, s->plan.n_ctx, &s->ix[l]);
        if (st) {
            free_indexes(s);
            return st;
        }
    }
    if (s->rp.rest) {
        dhsa_status st = make_rest(s);
        if (st) {
            free_indexes(s);
            return st;
        }
    }
    return DHSA_OK;
}

dhsa_status dhsa_session_create(dhsa_ctx *ctx, const dhsa_model *m, const dhsa_session_params *p,
                                dhsa_session **out) {
    if (!out) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_session_create: out is NULL");
    *out = NULL;
    if (!ctx || !m) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_session_create: NULL argument");
    dhsa_session_params dp = dhsa_session_default_params();
    if (!p) p = &dp;
    const dhsa_session_params rq = dhsa__session_resolve(m, p);
    p = &rq;
    dhsa_mem_plan plan;
    dhsa_status st = dhsa_session_plan(ctx, m, p, &plan);
    if (st) return st;
    const dhsa_model_info *in = &m->info;
    dhsa_session *s = calloc(1, sizeof *s);
    if (!s) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory");
    s->ctx = ctx;
    s->m = m;
    atomic_init(&s->busy, 0);
    s->st_last.density = s->st_total.density = 1.0;
    s->p = *p;
    s->plan = plan;
    s->rp = dhsa__session_router(p);
    if (p->mem_limit) {
        /* what the ctx may hold besides the weights, the cache and the rest of the process */
        size_t room = p->mem_limit - plan.weights - plan.kv_cache - plan.process;
        dhsa_mem_stats ms = dhsa_ctx_mem_stats(ctx);
        if ((ms.budget == 0 || ms.budget > ms.in_use + room) && (st = dhsa_ctx_set_budget(ctx, ms.in_use + room)))
            goto fail;
    }
    s->cap = plan.n_ctx;
    if (dhsa__dist_on(p) && (st = dhsa__dist_check(in, p, plan.n_ctx, &s->cap))) goto fail;
    s->k_layer = (size_t)in->n_head_kv * (size_t)s->cap * dhsa_type_row_bytes(p->kv_type, in->head_dim_k);
    s->v_layer = (size_t)in->n_head_kv * (size_t)s->cap * dhsa_type_row_bytes(p->kv_type, in->head_dim_v);
    s->kv = dhsa_buffer_alloc(plan.kv_cache > 0 ? plan.kv_cache : 64);
    s->lc = calloc((size_t)in->n_layer, sizeof *s->lc);
    if (!s->kv || !s->lc) {
        st = dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory for the KV cache");
        goto fail;
    }
    {
        const size_t rk = dhsa_type_row_bytes(p->kv_type, in->head_dim_k), rv = dhsa_type_row_bytes(p->kv_type, in->head_dim_v);
        const size_t H = (size_t)in->n_head_kv;
        size_t at = 0;
        for (int64_t l = 0; l < in->n_layer; l++) {
            struct layer_cache *c = &s->lc[l];
            c->rows = dhsa__dist_on(p) ? s->cap : dhsa__session_layer_rows(m, p, l, plan.n_ctx, plan.n_ubatch);
            c->backup = c->rows < plan.n_ctx && !dhsa__dist_on(p) ? m->layers[l].window - 1 : 0;
            c->k = at;
            at += H * (size_t)c->rows * rk;
        }
        for (int64_t l = 0; l < in->n_layer; l++) {
            s->lc[l].v = at;
            at += H * (size_t)s->lc[l].rows * rv;
        }
        for (int64_t l = 0; l < in->n_layer; l++) {
            struct layer_cache *c = &s->lc[l];
            c->bk = at;
            at += H * (size_t)c->backup * rk;
            c->bv = at;
            at += H * (size_t)c->backup * rv;
        }
    }
    const int64_t ub = plan.n_ubatch;
    float *a = dhsa__alloc(ctx, dhsa__session_act_floats(in, ub) * sizeof(float) + 64 * 16, &st);
    if (!a) goto fail;
    /* carve, each buffer 64-byte aligned */
#define CARVE(ptr, count)                                  \
    do {                                                   \
        (ptr) = a;                                         \
        a += dhsa__align_up((size_t)(count), 16);          \
    } while (0)
    CARVE(s->x, ub * in->n_embd);
    CARVE(s->xb, ub * in->n_embd);
    CARVE(s->q, ub * in->n_head * in->head_dim_k);
    CARVE(s->kt, ub * in->n_head_kv * in->head_dim_k);
    CARVE(s->vt, ub * in->n_head_kv * in->head_dim_v);
    CARVE(s->att, ub * in->n_head * in->head_dim_v);
    CARVE(s->hb, ub * in->n_ff);
    CARVE(s->hb2, ub * in->n_ff);
    CARVE(s->rc, 2 * ub * (in->n_rot / 2));
    CARVE(s->rs, 2 * ub * (in->n_rot / 2));
    CARVE(s->inv_freq, in->n_rot);
#undef CARVE
    if (dhsa__dist_on(p)) {
        const dhsa__dist_buffers db = {s->q, s->kt, s->vt, s->att, s->kv};
        if ((st = dhsa__dist_create(ctx, in, p, &s->rp, plan.n_ctx, &db, &s->dist))) goto fail;
    }
    /* Frequency factors: rope_freqs, or LongRoPE's by the context, as
     * llama.cpp chooses them: the long ones when the session's context is
     * above rope.scaling.original_context_length. */
    const float *ff = m->rope_freqs ? m->rope_freqs : plan.n_ctx > in->n_ctx_orig ? m->rope_long : m->rope_short;
    const int64_t half = in->n_rot / 2;
    for (int set = 0; set < 2; set++) {
        double base = set ? in->rope_base_swa : in->rope_base;
        double lin = set ? in->rope_linear_factor_swa : in->rope_linear_factor;
        for (int64_t i = 0; i < half; i++) {
            double f = pow(base, -2.0 * (double)i / (double)in->n_rot);
            if (ff) f /= (double)ff[i];
            s->inv_freq[set * half + i] = (float)(f / lin);
        }
    }
    if (dhsa__session_keys_centred(m, p)) {
        size_t cache = dhsa__session_cache_bytes(m, p, plan.n_ctx, plan.n_ubatch);
        s->koff = (float *)((char *)s->kv + dhsa__align_up(cache, 64));
        fill_key_offsets(s);
    }
    /* the keys left out, summarised: sessions routing DHSA through an index in one process
     * (a rank holds part of the keys) */
    if (s->rp.method != DHSA_ROUTE_DHSA || p->attn == DHSA_ATTN_DENSE || !dhsa__session_uses_index(p))
        s->rp.rest = 0;
    if (p->attn != DHSA_ATTN_DENSE && dhsa__session_uses_index(p) && (st = make_indexes(s))) goto fail;
    /* chunks carried between decode steps: the sessions whose index ranks
     * chunks by score, one routing per KV group (with ranks too: src/dist
     * merges their parts, dist_route.c) */
    if (s->rp.share_heads || s->rp.method != DHSA_ROUTE_DHSA) s->rp.carry = 0;
    /* the eval's last rows ranked by exact attention: the same sessions */
    if (s->rp.share_heads || s->rp.method != DHSA_ROUTE_DHSA || !s->ix) s->rp.exact_rows = 0;
    s->exact_from = INT64_MAX;
    if (s->ix && s->rp.carry > 0) {
        s->carry = malloc((size_t)(2 * in->n_layer * in->n_head_kv * DHSA_CARRY_MAX) * sizeof(int64_t));
        if (!s->carry) {
            st = dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory (the chunks decode steps carry)");
            goto fail;
        }
    }
    *out = s;
    return DHSA_OK;
fail:
    dhsa_session_free(s);
    return st;
}

void dhsa_session_free(dhsa_session *s) {
    if (!s) return;
    free_indexes(s);
    dhsa_ctx_release(s->ctx, s->x);
    dhsa__dist_free(s->dist);
    dhsa_buffer_free(s->kv);
    free(s->lc);
    free(s->carry);
    free(s);
}

const dhsa_mem_plan *dhsa_session_get_plan(const dhsa_session *s) { return s ? &s->plan : NULL; }
int64_t dhsa_session_length(const dhsa_session *s) { return s ? s->len : 0; }

dhsa_status dhsa_session_get_router(const dhsa_session *s, dhsa_router_params *out) {
    if (!s || !out) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_session_get_router: NULL argument");
    *out = s->rp;
    return DHSA_OK;
}

dhsa_status dhsa_session_get_stats(const dhsa_session *s, dhsa_attn_stats *last_eval, dhsa_attn_stats *total) {
    if (!s) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_session_get_stats: NULL session");
    if (last_eval) *last_eval = s->st_last;
    if (total) *total = s->st_total;
    return DHSA_OK;
}

/* One eval or reset at a time: a second, from another thread or from a
 * callback of the running eval, is refused rather than let corrupt the
 * cache. */
static int enter(dhsa_session *s) {
    int idle = 0;
    return atomic_compare_exchange_strong(&s->busy, &idle, 1);
}

static void leave(dhsa_session *s) { atomic_store(&s->busy, 0); }

static dhsa_status session_busy(const char *call) {
    return dhsa__fail(DHSA_ERR_BUSY, "%s: the session is in use by another thread (or by a callback of its own "
                      "eval): one eval or reset at a time", call);
}

dhsa_status dhsa_session_reset(dhsa_session *s) {
    if (!s) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_session_reset: NULL session");
    if (!enter(s)) return session_busy("dhsa_session_reset");
    dhsa_status st = DHSA_OK;
    s->len = 0;
    for (int64_t l = 0; l < s->m->info.n_layer; l++) s->lc[l].base = 0;
    if (s->dist) dhsa__dist_reset(s->dist);
    s->broken = 0;
    s->carry_ok = 0;
    s->exact_next = 0;
    memset(&s->st_last, 0, sizeof s->st_last);
    memset(&s->st_total, 0, sizeof s->st_total);
    s->st_last.density = s->st_total.density = 1.0;
    if (s->ix) {
        free_indexes(s);
        st = make_indexes(s); /* on failure s->ix is NULL: eval refuses too */
    }
    leave(s);
    return st;
}

/* ---------------------------------------------------------- forward --- */

/* out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w, rows of n. The sum of
 * squares is in double over 8 interleaved partial sums: independent add
 * chains (one chain waits an add's latency per element), and in double the
 * order changes the float result only when a sum lands within 1e-16 of a
 * rounding boundary. */
static void rmsnorm(float *out, const float *x, const float *w, int64_t rows, int64_t n, float eps) {
    for (int64_t t = 0; t < rows; t++) {
        const float *xr = x + t * n;
        float *o = out + t * n;
        double p0 = 0, p1 = 0, p2 = 0, p3 = 0, p4 = 0, p5 = 0, p6 = 0, p7 = 0;
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) {
            const float *v = xr + i;
            p0 += (double)v[0] * v[0], p1 += (double)v[1] * v[1], p2 += (double)v[2] * v[2];
            p3 += (double)v[3] * v[3], p4 += (double)v[4] * v[4], p5 += (double)v[5] * v[5];
            p6 += (double)v[6] * v[6], p7 += (double)v[7] * v[7];
        }
        for (; i < n; i++) p0 += (double)xr[i] * xr[i];
        double ss = ((p0 + p4) + (p2 + p6)) + ((p1 + p5) + (p3 + p7));
        float r = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
        for (i = 0; i < n; i++) o[i] = xr[i] * r * w[i];
    }
}

static void add_bias(float *y, const float *b, int64_t rows, int64_t n) {
    if (!b) return;
    for (int64_t t = 0; t < rows; t++)
        for (int64_t i = 0; i < n; i++) y[t * n + i] += b[i];
}

/* Rotates heads [rows][heads][hd] by the ubatch's cos/sin [rows][n_rot/2]. */
static void rope(float *x, int64_t rows, int64_t heads, int64_t hd, int64_t n_rot, int neox, const float *rc,
                 const float *rs) {
    const int64_t half = n_rot / 2;
    for (int64_t t = 0; t < rows; t++)
        for (int64_t h = 0; h < heads; h++) {
            float *v = x + (t * heads + h) * hd;
            const float *c = rc + t * half, *s = rs + t * half;
            for (int64_t i = 0; i < half; i++) {
                int64_t i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
                float a = v[i0], b = v[i1];
                v[i0] = a * c[i] - b * s[i];
                v[i1] = a * s[i] + b * c[i];
            }
        }
}

/* Copies rows [rows][heads][hd] into the head-major cache at pos. */
/* Stores rows [pos, pos + rows) of a layer's cache [heads][n_ctx][hd]
 * from src [rows][heads][hd] (F32), rounded to the cache's type: F16 to
 * nearest even, Q8_0 by the weight quantizer (dhsa_q8_0_quantize_row,
 * which refuses NaN/Inf: a non-finite key or value fails the eval with
 * DHSA_ERR_NONFINITE instead of poisoning its block's scale). */
static dhsa_status store_cache(void *cache, dhsa_type t, int64_t n_ctx, const float *src, int64_t rows, int64_t heads,
                               int64_t hd, int64_t pos, const float *koff) {
    float centred[DHSA__KOFF_MAX_HD];
    for (int64_t h = 0; h < heads; h++)
        for (int64_t r = 0; r < rows; r++) {
            const float *s = src + (r * heads + h) * hd;
            size_t off = ((size_t)h * (size_t)n_ctx + (size_t)(pos + r)) * (size_t)hd;
            if (t == DHSA_F32) {
                memcpy((float *)cache + off, s, (size_t)hd * sizeof(float));
            } else if (t == DHSA_Q8_0) {
                if (koff) {
                    for (int64_t i = 0; i < hd; i++) centred[i] = s[i] - koff[h * hd + i];
                    s = centred;
                }
                dhsa_status st = dhsa_q8_0_quantize_row(s, (char *)cache + dhsa__byte_off(t, (int64_t)off), hd);
                if (st) return st;
            } else {
                uint16_t *d = (uint16_t *)cache + off;
                for (int64_t i = 0; i < hd; i++) d[i] = dhsa_f32_to_f16(s[i]);
            }
        }
    return DHSA_OK;
}

/* The gated FFN's activation in place, hb = act(hb) * hb2 over n rows of
 * F (the ISA's glu kernel, kern.h). A prefill ubatch is split over the
 * ctx's threads in chunks of GLU_CHUNK values (a multiple of 16, so every
 * chunk but the last is whole vectors: the results do not depend on the
 * split); a decode step's few rows are not worth the fork. */
#define GLU_CHUNK 16384
typedef struct {
    const dhsa_attn_kernels *k;
    float *g;       /* [count] gate in, activation times up out */
    const float *u; /* [count] up */
    int64_t count;
    int gelu;
} glu_job;

static void glu_task(void *arg, int64_t task, int thread) {
    (void)thread;
    const glu_job *j = arg;
    int64_t i0 = task * GLU_CHUNK, m = j->count - i0 < GLU_CHUNK ? j->count - i0 : GLU_CHUNK;
    j->k->glu(j->g + i0, j->u + i0, m, j->gelu, j->g + i0);
}

static void ffn_activation(dhsa_session *s, int64_t n, int64_t F, int gelu) {
    glu_job j = {dhsa__attn_kernels(), s->hb, s->hb2, n * F, gelu};
    int64_t tasks = (j.count + GLU_CHUNK - 1) / GLU_CHUNK;
    if (tasks < 4 || dhsa_ctx_n_threads(s->ctx) < 2) j.k->glu(j.g, j.u, j.count, gelu, j.g);
    else dhsa_parallel_for(s->ctx, tasks, glu_task, &j);
}

/* The view of layer l's cache holding its first n keys. */
static dhsa_tensor cache_view(const dhsa_session *s, int64_t l, int is_v, int64_t n) {
    const dhsa_model_info *in = &s->m->info;
    int64_t hd = is_v ? in->head_dim_v : in->head_dim_k;
    char *base = (char *)s->kv + (is_v ? s->lc[l].v : s->lc[l].k);
    dhsa_tensor t = dhsa_tensor_bhld(base, s->p.kv_type, 1, in->n_head_kv, s->lc[l].rows, hd);
    t.shape[2] = n;
    return t;
}

/* Adds one layer call to the session's statistics: with a layout, its
 * selected and available keys; without one (dense, or a sliding-window
 * layer), every key each row may see. Sums run over query rows x KV heads,
 * as in dhsa_layout_stats. */
static void count_attention(dhsa_session *s, const dhsa_attn_desc *a) {
    dhsa_attn_stats *const t[2] = {&s->st_last, &s->st_total};
    dhsa__attn_count(t, 2, a);
}

/* Per head of layer l (K then V): copies n rows from row `from` of the
 * cache (or of the backup, back=1 reading it) to row `to` of the other
 * (or of the same, move=1, which may overlap). */
static void copy_rows(dhsa_session *s, int64_t l, int dir /* 0 cache->cache, 1 cache->backup, 2 backup->cache */,
                      int64_t from, int64_t to, int64_t n) {
    const dhsa_model_info *in = &s->m->info;
    const struct layer_cache *c = &s->lc[l];
    for (int is_v = 0; is_v < 2; is_v++) {
        const size_t rb = dhsa_type_row_bytes(s->p.kv_type, is_v ? in->head_dim_v : in->head_dim_k);
        char *cache = (char *)s->kv + (is_v ? c->v : c->k), *bak = (char *)s->kv + (is_v ? c->bv : c->bk);
        for (int64_t h = 0; h < in->n_head_kv; h++) {
            char *ch = cache + (size_t)h * (size_t)c->rows * rb, *bh = bak + (size_t)h * (size_t)c->backup * rb;
            char *src = dir == 2 ? bh : ch, *dst = dir == 1 ? bh : ch;
            memmove(dst + (size_t)to * rb, src + (size_t)from * rb, (size_t)n * rb);
        }
    }
}

/* Room in layer l's ring for n rows at positions pos.. (the note on
 * sliding-window rings); nothing to do for a full-length cache. */
static void ring_room(dhsa_session *s, int64_t l, int64_t pos, int64_t n) {
    struct layer_cache *c = &s->lc[l];
    if (!c->backup || pos + n - c->base <= c->rows) return;
    const int64_t keep = s->m->layers[l].window - 1, nb = pos - keep;
    const int64_t from = s->len0_eval > keep ? s->len0_eval - keep : 0;
    if (!c->saved && nb > from && s->len0_eval > from) { /* committed keys about to go */
        copy_rows(s, l, 1, from - c->base, 0, s->len0_eval - from);
        c->saved = 1;
        c->saved_from = from;
        c->saved_n = s->len0_eval - from;
    }
    copy_rows(s, l, 0, nb - c->base, 0, pos - nb);
    c->base = nb;
}

/* The eval that began at len0_eval failed: sliding layers get the keys
 * they had then. */
static void ring_restore(dhsa_session *s) {
    for (int64_t l = 0; l < s->m->info.n_layer; l++) {
        struct layer_cache *c = &s->lc[l];
        if (!c->saved) continue;
        copy_rows(s, l, 2, 0, 0, c->saved_n);
        c->base = c->saved_from;
        c->saved = 0;
    }
}

/* A new eval begins at the committed length. */
static void ring_begin(dhsa_session *s) {
    s->len0_eval = s->len;
    for (int64_t l = 0; l < s->m->info.n_layer; l++) s->lc[l].saved = 0;
}

/* Rows [r0, r0 + n) of the ubatch at pos0 of n_all rows attend the keys
 * up to its end (causal); exact: their chunks ranked by exact attention. */
static dhsa_status attend_part(dhsa_session *s, int64_t l, int64_t r0, int64_t n, int64_t pos0, int64_t n_all,
                               int exact) {
    const dhsa_model_info *in = &s->m->info;
    const dhsa__layer *L = &s->m->layers[l];
    dhsa_attn_desc a = dhsa_attn_default_desc();
    a.q = dhsa_tensor_blhd(s->q + r0 * in->n_head * in->head_dim_k, DHSA_F32, 1, n, in->n_head, in->head_dim_k);
    const int64_t base = s->lc[l].base;
    a.k = cache_view(s, l, 0, pos0 + n_all - base);
    a.v = cache_view(s, l, 1, pos0 + n_all - base);
    a.o = dhsa_tensor_blhd(s->att + r0 * in->n_head * in->head_dim_v, DHSA_F32, 1, n, in->n_head, in->head_dim_v);
    a.causal = 1;
    a.q_pos0 = pos0 + r0;
    a.k_pos0 = base;
    a.window = L->window;
    a.softcap = in->attn_softcap;
    a.scale = in->attn_scale; /* 1/sqrt(hd_k); gemma2 27B 1/sqrt(n_embd / n_head) */
    dhsa_layout *lay = NULL;
    dhsa_status st = DHSA_OK;
    dhsa__rest *rest = s->rest && s->rest_now && l + 1 >= s->rp.rest && s->p.attn != DHSA_ATTN_DENSE && !L->window
                           ? s->rest[l]
                           : NULL;
    float *o2 = rest ? s->rest_buf : NULL, *lse2 = o2 ? o2 + n * in->n_head * in->head_dim_v : NULL;
    if (rest) { /* the summaries in step with the index's chunks, the call's lse for the merge */
        const int64_t *starts;
        const int64_t nc = dhsa_kv_index_chunks(s->ix[l], &starts);
        if ((st = dhsa__rest_sync(rest, starts, nc, &a.k, &a.v))) return st;
        a.lse = dhsa_tensor_blhd(lse2 + n * in->n_head, DHSA_F32, 1, n, in->n_head, 1);
    }
    if (s->p.attn != DHSA_ATTN_DENSE && !L->window) {
        if (s->ix) {
            if (!s->ix[l]) return dhsa__fail(DHSA_ERR_INTERNAL, "routing index of layer %lld missing", (long long)l);
            const int64_t per = in->n_head_kv * DHSA_CARRY_MAX;
            st = exact ? dhsa_kv_index_route_exact(s->ctx, s->ix[l], &a, &lay)
                 : n_all == 1 && s->carry && s->carry_ok
                     ? dhsa_kv_index_route_keep(s->ctx, s->ix[l], &a, s->carry + l * per, &lay)
                     : dhsa_kv_index_route(s->ctx, s->ix[l], &a, &lay);
        } else {
            st = dhsa_route(s->ctx, &s->rp, &a, &lay);
        }
        if (st) return st;
        a.layout = lay;
    }
    st = dhsa_attention(s->ctx, &a);
    double summaries = 0;
    if (!st && rest && lay) st = dhsa__rest_attend(s->ctx, rest, &a, lay, o2, lse2, &summaries);
    s->st_last.summaries += summaries;
    s->st_total.summaries += summaries;
    a.lse = dhsa_attn_default_desc().lse;
    if (!st && n_all == 1 && s->carry && lay) { /* what this step hands the next (carry.h) */
        const int64_t *starts;
        const int64_t nc = dhsa_kv_index_chunks(s->ix[l], &starts), per = in->n_head_kv * DHSA_CARRY_MAX;
        st = dhsa__carry_chunks(&a, lay, starts, nc, s->rp.carry, s->carry + (in->n_layer + l) * per);
    }
    if (!st) count_attention(s, &a);
    if (!st && s->p.layer_hook && s->p.layer_hook(s->p.layer_hook_user, l, &a))
        st = dhsa__fail(DHSA_ERR_INVALID_ARG, "the layer hook stopped the eval at layer %lld", (long long)l);
    dhsa_layout_free(lay);
    return st;
}

/* A ubatch's attention in layer l: one call, or two where its last rows
 * rank chunks by their exact attention (exact_from, rp.exact_rows). The
 * split falls on a query block's start, so the rows before it route in
 * the same blocks as without it. */
static dhsa_status attend(dhsa_session *s, int64_t l, int64_t n, int64_t pos0) {
    const int64_t qb = s->rp.q_block > 0 ? s->rp.q_block : 1;
    const int64_t r = s->exact_from > 0 ? s->exact_from - s->exact_from % qb : 0;
    if (r >= n || !s->ix || !s->ix[l]) return attend_part(s, l, 0, n, pos0, n, 0);
    if (r == 0) return attend_part(s, l, 0, n, pos0, n, 1);
    dhsa_status st = attend_part(s, l, 0, r, pos0, n, 0);
    if (!st) st = attend_part(s, l, r, n - r, pos0, n, 1);
    if (!st) { /* one layer's attention in two calls counts as one */
        s->st_last.layer_calls--;
        s->st_total.layer_calls--;
    }
    return st;
}

static dhsa_status matmul(dhsa_session *s, const dhsa_wmat *W, const float *x, int64_t n, float *y) {
    return dhsa__matmul_on(s->ctx, s->p.exact ? DHSA_MM_EXACT : DHSA_MM_FAST, W, x, W->n_in, n, y, W->n_out);
}

/* Products of one x with several weights (q, k, v; gate, up): one
 * parallel job where the fast path can (matmul.h), same results. */
static dhsa_status matmul_multi(dhsa_session *s, const dhsa_wmat *const *W, int nw, const float *x, int64_t n,
                                float *const *y) {
    return dhsa__matmul_multi_on(s->ctx, s->p.exact ? DHSA_MM_EXACT : DHSA_MM_FAST, W, nw, x, W[0]->n_in, n, y);
}

/* The cache, index and attention of rows [t0, t0 + n) of a forward pass
 * at layer l, all of session o at positions pos..: the new keys and values
 * (host's kt / vt rows) go into o's cache, o's index takes the keys, and
 * o attends; for o other than the host its query rows are copied into its
 * own buffer and its output back into the host's. */
static dhsa_status attend_rows(dhsa_session *host, dhsa_session *o, int64_t l, int64_t t0, int64_t n, int64_t pos) {
    const dhsa_model_info *in = &host->m->info;
    const int64_t hk = in->head_dim_k, hv = in->head_dim_v;
    const size_t qrow = (size_t)(in->n_head * hk), orow = (size_t)(in->n_head * hv);
    ring_room(o, l, pos, n);
    const int64_t rows = o->lc[l].rows, slot = pos - o->lc[l].base;
    if (slot < 0 || slot + n > rows) /* a bug: never write outside the layer's rows */
        return dhsa__fail(DHSA_ERR_INTERNAL, "layer %lld: positions %lld.. fall outside its cache rows (from %lld, %lld "
                          "rows)", (long long)l, (long long)pos, (long long)o->lc[l].base, (long long)rows);
    dhsa_tensor kv = cache_view(o, l, 0, rows);
    dhsa_tensor vv = cache_view(o, l, 1, rows);
    dhsa_status st;
    if ((st = store_cache(kv.data, o->p.kv_type, rows, host->kt + (size_t)t0 * (size_t)(in->n_head_kv * hk), n,
                          in->n_head_kv, hk, slot, key_offset(o, l))) ||
        (st = store_cache(vv.data, o->p.kv_type, rows, host->vt + (size_t)t0 * (size_t)(in->n_head_kv * hv), n,
                          in->n_head_kv, hv, slot, NULL)))
        return st;
    if (o->ix && o->ix[l]) {
        /* the index reads the keys back from the cache: it routes on the
         * values attention sees (F16- or Q8_0-rounded), so a decode step
         * and a prefill of the same tokens route alike */
        dhsa_tensor kn = cache_view(o, l, 0, pos + n);
        kn.data = (char *)kn.data + dhsa__byte_off(o->p.kv_type, pos * hk);
        kn.shape[2] = n;
        if ((st = dhsa_kv_index_append(o->ix[l], &kn))) return st;
    }
    if (o != host) memcpy(o->q, host->q + (size_t)t0 * qrow, (size_t)n * qrow * sizeof(float));
    if ((st = attend(o, l, n, pos))) return st;
    if (o != host) memcpy(host->att + (size_t)t0 * orow, o->att, (size_t)n * orow * sizeof(float));
    return DHSA_OK;
}


/* Layer l of a context-parallel forward: src/dist stores this rank's keys
 * and values of the rows and attends them (dist/dist.h). */
static dhsa_status attend_dist(dhsa_session *s, int64_t l) {
    const int64_t cap = s->lc[l].rows, per = s->m->info.n_head_kv * DHSA_CARRY_MAX;
    const int decode = s->dist_decode && s->carry && s->ix && s->ix[l];
    const dhsa__dist_layer_io io = {cache_view(s, l, 0, cap),
                                    cache_view(s, l, 1, cap),
                                    s->ix ? s->ix[l] : NULL,
                                    {&s->st_last, &s->st_total},
                                    decode && s->carry_ok ? s->carry + l * per : NULL,
                                    decode ? s->carry + (s->m->info.n_layer + l) * per : NULL,
                                    s->rp.carry,
                                    s->m->layers[l].window,
                                    s->rest && s->rest_now && l + 1 >= s->rp.rest ? s->rest[l] : NULL};
    return dhsa__dist_layer(s->dist, &io);
}

/* One forward pass over n rows: ids[0..n) of session s at positions
 * pos0.. (a ubatch of a prefill, or a decode step), or, with batch != NULL,
 * row t the next token of session batch[t] at its length
 * (dhsa_session_eval_batch). The weight products run once over all rows
 * in s's buffers and on s's ctx (s = batch[0]); each row's cache, index
 * and attention are its own session's. out_rows: logits rows to produce
 * (the last `out_rows` rows) into logits. */
static dhsa_status forward(dhsa_session *s, dhsa_session *const *batch, const int32_t *ids, int64_t n, int64_t pos0,
                           float *logits, int64_t out_rows) {
    const dhsa_model *m = s->m;
    const dhsa_model_info *in = &m->info;
    const int64_t E = in->n_embd, F = in->n_ff, hk = in->head_dim_k, hv = in->head_dim_v, half = in->n_rot / 2;
    const int gemma = in->arch == DHSA_ARCH_GEMMA2 || in->arch == DHSA_ARCH_GEMMA3;
    const int64_t sets = in->n_swa_layers > 0 ? 2 : 1, set_stride = s->plan.n_ubatch * half;
    const double af = (double)in->rope_attn_factor;
    dhsa_status st;
    if (n == 0) { /* a rank without rows in this prefill still takes its part in every layer's exchange */
        for (int64_t l = 0; l < in->n_layer; l++)
            if ((st = attend_dist(s, l))) return st;
        return DHSA_OK;
    }
    for (int64_t t = 0; t < n; t++) {
        if ((st = dhsa__wmat_row(&m->tok_embd, ids[t], s->x + t * E))) return st;
        if (gemma) {
            float sc = sqrtf((float)E);
            for (int64_t i = 0; i < E; i++) s->x[t * E + i] *= sc;
        }
        /* each row's own session's frequencies: LongRoPE's depend on its context */
        const float *inv = (batch ? batch[t] : s)->inv_freq;
        const double pos = (double)(batch ? batch[t]->len : s->rowpos ? s->rowpos[t] : pos0 + t);
        for (int64_t set = 0; set < sets; set++)
            for (int64_t i = 0; i < half; i++) {
                double ang = pos * (double)inv[set * half + i];
                s->rc[set * set_stride + t * half + i] = (float)(cos(ang) * af);
                s->rs[set * set_stride + t * half + i] = (float)(sin(ang) * af);
            }
    }
    for (int64_t l = 0; l < in->n_layer; l++) {
        const dhsa__layer *L = &m->layers[l];
        rmsnorm(s->xb, s->x, L->attn_norm, n, E, in->rms_eps);
        {
            const dhsa_wmat *w3[3] = {&L->wq, &L->wk, &L->wv};
            float *y3[3] = {s->q, s->kt, s->vt};
            if ((st = matmul_multi(s, w3, 3, s->xb, n, y3))) return st;
        }
        add_bias(s->q, L->bq, n, in->n_head * hk);
        add_bias(s->kt, L->bk, n, in->n_head_kv * hk);
        add_bias(s->vt, L->bv, n, in->n_head_kv * hv);
        if (L->q_norm) rmsnorm(s->q, s->q, L->q_norm, n * in->n_head, hk, in->rms_eps); /* per head */
        if (L->k_norm) rmsnorm(s->kt, s->kt, L->k_norm, n * in->n_head_kv, hk, in->rms_eps);
        const float *rc = s->rc + L->rope_set * set_stride, *rs = s->rs + L->rope_set * set_stride;
        rope(s->q, n, in->n_head, hk, in->n_rot, in->rope_neox, rc, rs);
        rope(s->kt, n, in->n_head_kv, hk, in->n_rot, in->rope_neox, rc, rs);
        if (s->rowpos) {
            if ((st = attend_dist(s, l))) return st;
        } else if (!batch) {
            if ((st = attend_rows(s, s, l, 0, n, pos0))) return st;
        } else {
            for (int64_t t = 0; t < n; t++)
                if ((st = attend_rows(s, batch[t], l, t, 1, batch[t]->len))) return st;
        }
        if ((st = matmul(s, &L->wo, s->att, n, s->xb))) return st;
        add_bias(s->xb, L->bo, n, E);
        if (L->post_attn_norm) rmsnorm(s->xb, s->xb, L->post_attn_norm, n, E, in->rms_eps);
        for (int64_t i = 0; i < n * E; i++) s->x[i] += s->xb[i];
        rmsnorm(s->xb, s->x, L->ffn_norm, n, E, in->rms_eps);
        {
            const dhsa_wmat *w2[2] = {&L->w_gate, &L->w_up};
            float *y2[2] = {s->hb, s->hb2};
            if ((st = matmul_multi(s, w2, 2, s->xb, n, y2))) return st;
        }
        add_bias(s->hb, L->b_gate, n, F); /* before the activation, as llama.cpp's build_ffn */
        add_bias(s->hb2, L->b_up, n, F);
        ffn_activation(s, n, F, gemma);
        if ((st = matmul(s, &L->w_down, s->hb, n, s->xb))) return st;
        add_bias(s->xb, L->b_down, n, E);
        if (L->post_ffw_norm) rmsnorm(s->xb, s->xb, L->post_ffw_norm, n, E, in->rms_eps);
        for (int64_t i = 0; i < n * E; i++) s->x[i] += s->xb[i];
    }
    if (!logits || out_rows == 0) return DHSA_OK;
    const float *last = s->x + (n - out_rows) * E;
    rmsnorm(s->xb, last, m->output_norm, out_rows, E, in->rms_eps);
    if ((st = matmul(s, &m->output, s->xb, out_rows, logits))) return st;
    add_bias(logits, m->output_bias, out_rows, in->n_vocab);
    if (in->final_softcap > 0) {
        float cap = in->final_softcap;
        for (int64_t i = 0; i < out_rows * in->n_vocab; i++) logits[i] = cap * tanhf(logits[i] / cap);
    }
    return DHSA_OK;
}

/* After an eval that succeeded: a one-token eval's carried chunks become
 * the next step's; any other eval leaves none (its rows were routed as a
 * prefill). A failed eval changes nothing. */
static void carry_commit(dhsa_session *s, int one_token) {
    if (!s->carry) return;
    const int64_t per = s->m->info.n_layer * s->m->info.n_head_kv * DHSA_CARRY_MAX;
    if (one_token) memcpy(s->carry, s->carry + per, (size_t)per * sizeof(int64_t));
    s->carry_ok = one_token;
}

/* Undoes a failed eval (include/dhsa.h, dhsa_session_eval): the length and
 * every layer's index go back to len0. The keys and values the failed
 * ubatches wrote past len0 are never read, and the next eval overwrites
 * them. */
static void roll_back(dhsa_session *s, int64_t len0) {
    s->len = len0;
    ring_restore(s);
    if (!s->ix) return;
    char why[384];
    snprintf(why, sizeof why, "%s", dhsa_last_error());
    for (int64_t l = 0; l < s->m->info.n_layer && !s->broken; l++) {
        if (!s->ix[l]) continue;
        if (s->rest) dhsa__rest_forget(s->rest[l], len0);
        dhsa_tensor k = cache_view(s, l, 0, len0);
        if (dhsa__kv_index_rewind(s->ix[l], &k) != DHSA_OK) s->broken = 1;
    }
    if (s->broken) /* the eval's own sentence first */
        (void)dhsa__fail(DHSA_ERR_INTERNAL, "%s; undoing it failed (%.100s): dhsa_session_reset first", why,
                         dhsa_last_error());
}

/* A context-parallel eval (include/dhsa.h, dhsa_session_params.dist):
 * src/dist says which rows this rank runs (one decode token: every rank;
 * a prefill: its own positions) and shares the logits. A failure leaves
 * the session broken (the ranks cannot undo it together):
 * dhsa_session_reset first. */
static dhsa_status dist_eval(dhsa_session *s, const int32_t *ids, int64_t n, float *logits) {
    dhsa__dist_rows rows;
    /* the last rows ranked exactly: as one process's eval_tokens says */
    const int exact = n > 1 ? s->rp.exact_rows > 0 && logits : s->exact_next;
    dhsa_status st = dhsa__dist_begin(s->dist, s->len, ids, n, logits != NULL, exact, &rows);
    if (st) return st;
    s->rowpos = rows.pos;
    s->dist_decode = n == 1;
    s->rest_now = n > 1; /* as eval_tokens: a prefill attends the summaries (src/dist keeps them alike) */
    st = forward(s, NULL, rows.ids, rows.n, 0, rows.logits ? logits : NULL, rows.logits ? 1 : 0);
    s->rowpos = NULL;
    s->dist_decode = 0;
    s->rest_now = 0;
    if ((st = dhsa__dist_end(s->dist, st, logits))) return st;
    s->len += n;
    s->exact_next = n > 1 && s->rp.exact_rows > 0 && logits;
    carry_commit(s, n == 1);
    if (n > 1 && s->p.progress) s->p.progress(s->p.progress_user, n, n);
    return DHSA_OK;
}

dhsa_status dhsa_session_get_dist_stats(const dhsa_session *s, dhsa_dist_stats *out) {
    if (!s || !out) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_session_get_dist_stats: NULL argument");
    if (s->dist) *out = *dhsa__dist_stats(s->dist);
    else memset(out, 0, sizeof *out);
    return DHSA_OK;
}

static dhsa_status eval_tokens(dhsa_session *s, const int32_t *ids, int64_t n, float *logits) {
    if (n < 0) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_session_eval: n = %lld", (long long)n);
    /* logits after no token would be whatever an earlier eval (or another
     * request on a shared session) left: never hand those out */
    if (n == 0 && logits)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_session_eval: 0 tokens give no logits (pass logits = NULL to "
                          "evaluate nothing)");
    if (n == 0) return DHSA_OK;
    const dhsa_model_info *in = &s->m->info;
    memset(&s->st_last, 0, sizeof s->st_last);
    s->st_last.density = 1.0;
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= in->n_vocab)
            return dhsa__fail(DHSA_ERR_INVALID_ARG, "token %lld is id %d, outside [0, %lld)", (long long)i, ids[i],
                              (long long)in->n_vocab);
    if (n > s->plan.n_ctx - s->len)
        return dhsa__fail(DHSA_ERR_TOO_LARGE, "%lld more tokens do not fit: the cache holds %lld of %lld",
                          (long long)n, (long long)s->len, (long long)s->plan.n_ctx);
    if (s->broken)
        return dhsa__fail(DHSA_ERR_INTERNAL, "an earlier failed eval could not be undone: dhsa_session_reset first");
    if (s->p.attn != DHSA_ATTN_DENSE && dhsa__session_uses_index(&s->p) && !s->ix)
        return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "the routing indexes could not be rebuilt after a reset");
    if (s->dist) {
        dhsa_status st = dist_eval(s, ids, n, logits);
        if (st) s->broken = 1;
        return st;
    }
    const int64_t len0 = s->len;
    const dhsa_attn_stats total0 = s->st_total;
    ring_begin(s);
    if (s->ix)
        for (int64_t l = 0; l < in->n_layer; l++)
            if (s->ix[l]) dhsa__kv_index_mark(s->ix[l]);
    for (int64_t done = 0; done < n;) {
        int64_t step = n - done < s->plan.n_ubatch ? n - done : s->plan.n_ubatch;
        float *out = NULL;
        int64_t rows = 0;
        if (logits && s->p.logits_all) {
            out = logits + done * in->n_vocab;
            rows = step;
        } else if (logits && done + step == n) {
            out = logits;
            rows = 1;
        }
        /* the last rp.exact_rows rows of an eval that answers (more than one
         * token, the last row's logits asked for): not a decode step's one
         * row, not a scoring eval's every row, not a prefill part's */
        s->exact_from = n > 1 && s->rp.exact_rows > 0 && logits && !s->p.logits_all ? n - s->rp.exact_rows - done
                        : n == 1 && s->exact_next                                 ? 0
                                                                                  : INT64_MAX;
        s->rest_now = n > 1;
        dhsa_status st = forward(s, NULL, ids + done, step, s->len, out, rows);
        s->exact_from = INT64_MAX;
        s->rest_now = 0;
        if (st) {
            /* the call's earlier ubatches are undone too, and this one may
             * have reached some layers' indexes: all of it goes */
            roll_back(s, len0);
            s->st_total = total0; /* the statistics too */
            memset(&s->st_last, 0, sizeof s->st_last);
            s->st_last.density = 1.0;
            return st;
        }
        s->len += step;
        done += step;
        if (s->p.progress) s->p.progress(s->p.progress_user, done, n);
    }
    carry_commit(s, n == 1);
    s->exact_next = n > 1 && s->rp.exact_rows > 0 && logits && !s->p.logits_all;
    return DHSA_OK;
}

/* ------------------------------------------------------------ batch --- */

static dhsa_status batch_eval(dhsa_session *const *ss, int64_t n, const int32_t *ids, float *logits,
                              int64_t *len0, dhsa_attn_stats *total0) {
    dhsa_session *h = ss[0];
    const dhsa_model_info *in = &h->m->info;
    for (int64_t t = 0; t < n; t++) {
        dhsa_session *o = ss[t];
        if (o->m != h->m)
            return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_session_eval_batch: session %lld runs another model",
                              (long long)t);
        if (ids[t] < 0 || ids[t] >= in->n_vocab)
            return dhsa__fail(DHSA_ERR_INVALID_ARG, "token %lld is id %d, outside [0, %lld)", (long long)t, ids[t],
                              (long long)in->n_vocab);
        if (o->len >= o->plan.n_ctx)
            return dhsa__fail(DHSA_ERR_TOO_LARGE, "session %lld: its cache is full (%lld tokens)", (long long)t,
                              (long long)o->plan.n_ctx);
        if (o->broken)
            return dhsa__fail(DHSA_ERR_INTERNAL, "session %lld: an earlier failed eval could not be undone: "
                              "dhsa_session_reset first", (long long)t);
        if (o->p.attn != DHSA_ATTN_DENSE && dhsa__session_uses_index(&o->p) && !o->ix)
            return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "session %lld: the routing indexes could not be rebuilt "
                              "after a reset", (long long)t);
    }
    for (int64_t t = 0; t < n; t++) {
        dhsa_session *o = ss[t];
        len0[t] = o->len;
        ring_begin(o);
        total0[t] = o->st_total;
        memset(&o->st_last, 0, sizeof o->st_last);
        o->st_last.density = 1.0;
        o->exact_from = o->exact_next ? 0 : INT64_MAX; /* a first decode step ranks exactly */
        if (o->ix)
            for (int64_t l = 0; l < in->n_layer; l++)
                if (o->ix[l]) dhsa__kv_index_mark(o->ix[l]);
    }
    dhsa_status st = forward(h, ss, ids, n, 0, logits, logits ? n : 0);
    for (int64_t t = 0; t < n; t++) {
        dhsa_session *o = ss[t];
        o->exact_from = INT64_MAX;
        if (!st) o->exact_next = 0;
        if (st) {
            roll_back(o, len0[t]);
            o->st_total = total0[t];
            memset(&o->st_last, 0, sizeof o->st_last);
            o->st_last.density = 1.0;
        } else {
            o->len++;
            carry_commit(o, 1);
        }
    }
    return st;
}

dhsa_status dhsa_session_eval_batch(dhsa_session *const *ss, int64_t n, const int32_t *ids, float *logits) {
    if (!ss || !ids || n < 1) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_session_eval_batch: NULL argument or n < 1");
    for (int64_t t = 0; t < n; t++) {
        if (!ss[t]) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_session_eval_batch: session %lld is NULL", (long long)t);
        for (int64_t u = 0; u < t; u++)
            if (ss[u] == ss[t])
                return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_session_eval_batch: sessions %lld and %lld are the same",
                                  (long long)u, (long long)t);
    }
    if (n > ss[0]->plan.n_ubatch)
        return dhsa__fail(DHSA_ERR_TOO_LARGE, "dhsa_session_eval_batch: %lld sessions, but the first one's buffers "
                          "hold %lld rows (its ubatch)", (long long)n, (long long)ss[0]->plan.n_ubatch);
    int64_t *len0 = malloc((size_t)n * sizeof *len0);
    dhsa_attn_stats *total0 = malloc((size_t)n * sizeof *total0);
    if (!len0 || !total0) {
        free(len0);
        free(total0);
        return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory");
    }
    int64_t entered = 0;
    dhsa_status st = DHSA_OK;
    for (; entered < n; entered++)
        if (!enter(ss[entered])) {
            st = session_busy("dhsa_session_eval_batch");
            break;
        }
    if (!st) st = batch_eval(ss, n, ids, logits, len0, total0);
    for (int64_t t = 0; t < entered; t++) leave(ss[t]);
    free(len0);
    free(total0);
    return st;
}

/* Keeps the first n tokens (include/dhsa.h, dhsa_session_truncate). The
 * cache's keys and values up to n are already right; each layer's index is
 * cut back to n keys (dhsa_kv_index_truncate: the state it had after n
 * keys, from its kept boundary scores and the cache's keys), which is what
 * the evals that wrote them left, whatever their ubatches. */
static dhsa_status truncate_tokens(dhsa_session *s, int64_t n) {
    if (n < 0 || n > s->len)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_session_truncate: %lld tokens asked, the cache holds %lld",
                          (long long)n, (long long)s->len);
    if (s->broken)
        return dhsa__fail(DHSA_ERR_INTERNAL, "an earlier failed eval could not be undone: dhsa_session_reset first");
    /* even to its own length: what follows a truncation routes as after a
     * prefill, whatever evals came before (a server's next request starts
     * here; no request's carried chunks reach another) */
    s->carry_ok = 0;
    s->exact_next = 0;
    if (n == s->len) return DHSA_OK;
    for (int64_t l = 0; l < s->m->info.n_layer && n > 0; l++) {
        const struct layer_cache *c = &s->lc[l];
        const int64_t need = n - (s->m->layers[l].window - 1);
        if (c->backup && c->base > need)
            return dhsa__fail(DHSA_ERR_UNSUPPORTED, "dhsa_session_truncate: sliding layer %lld keeps the keys from "
                              "position %lld on (a ring of %lld), and %lld tokens need them from %lld: reset and "
                              "evaluate the prompt again", (long long)l, (long long)c->base, (long long)c->rows,
                              (long long)n, (long long)(need > 0 ? need : 0));
    }
    if (n == 0)
        for (int64_t l = 0; l < s->m->info.n_layer; l++) s->lc[l].base = 0;
    memset(&s->st_last, 0, sizeof s->st_last);
    s->st_last.density = 1.0;
    for (int64_t l = 0; s->ix && l < s->m->info.n_layer; l++) {
        if (!s->ix[l]) continue;
        if (s->rest) dhsa__rest_forget(s->rest[l], n);
        dhsa_tensor k = cache_view(s, l, 0, s->len);
        dhsa_status st = dhsa_kv_index_truncate(s->ix[l], &k, n);
        if (st) { /* as a failed reset: empty, and evals refused until a reset succeeds */
            st = dhsa__fail(st, "cutting the routing index of layer %lld back: %s", (long long)l, dhsa_last_error());
            free_indexes(s);
            s->len = 0;
            return st;
        }
    }
    s->len = n;
    return DHSA_OK;
}

dhsa_status dhsa_session_truncate(dhsa_session *s, int64_t n) {
    if (!s) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_session_truncate: NULL session");
    if (!enter(s)) return session_busy("dhsa_session_truncate");
    dhsa_status st = truncate_tokens(s, n);
    leave(s);
    return st;
}

dhsa_status dhsa_session_eval(dhsa_session *s, const int32_t *ids, int64_t n, float *logits) {
    if (!s || (!ids && n > 0)) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_session_eval: NULL argument");
    if (!enter(s)) return session_busy("dhsa_session_eval");
    dhsa_status st = eval_tokens(s, ids, n, logits);
    leave(s);
    return st;
}

/* ------------------------------------- saved state (session_state.c) --- */

/* What src/model/session_state.c reads and writes of a session
 * (model_internal.h). */
dhsa_status dhsa__session_state_enter(dhsa_session *s, const char *call) {
    if (!s) return dhsa__fail(DHSA_ERR_INVALID_ARG, "%s: NULL session", call);
    if (s->dist) return dhsa__fail(DHSA_ERR_UNSUPPORTED, "%s: a context-parallel session holds one rank's share of "
                                    "the cache: its state is not saved or loaded", call);
    if (!enter(s)) return session_busy(call);
    if (s->broken) {
        leave(s);
        return dhsa__fail(DHSA_ERR_INTERNAL, "%s: an earlier failed eval could not be undone: dhsa_session_reset "
                          "first", call);
    }
    return DHSA_OK;
}

void dhsa__session_state_leave(dhsa_session *s) { leave(s); }

void dhsa__session_state_info(const dhsa_session *s, dhsa__state_info *out) {
    const dhsa_model_info *in = &s->m->info;
    out->m = s->m;
    out->p = &s->p;
    out->rp = &s->rp;
    out->plan = &s->plan;
    out->len = s->len;
    out->inv_freq = s->inv_freq;
    out->n_inv_freq = in->n_rot;
    out->koff = s->koff;
    out->n_koff = s->koff ? in->n_layer * in->n_head_kv * in->head_dim_k : 0;
}

void dhsa__session_state_layer(const dhsa_session *s, int64_t l, dhsa__state_layer *out) {
    const dhsa_model_info *in = &s->m->info;
    const struct layer_cache *c = &s->lc[l];
    out->k = (char *)s->kv + c->k;
    out->v = (char *)s->kv + c->v;
    out->row_k = dhsa_type_row_bytes(s->p.kv_type, in->head_dim_k);
    out->row_v = dhsa_type_row_bytes(s->p.kv_type, in->head_dim_v);
    out->rows = c->rows;
    out->base = c->base;
    out->ring = c->backup > 0;
}

/* An empty cache, as after a reset (the busy flag is the caller's). */
static dhsa_status state_clear(dhsa_session *s) {
    s->len = 0;
    s->carry_ok = 0;
    s->exact_next = 0;
    for (int64_t l = 0; l < s->m->info.n_layer; l++) {
        s->lc[l].base = 0;
        s->lc[l].saved = 0;
    }
    memset(&s->st_last, 0, sizeof s->st_last);
    memset(&s->st_total, 0, sizeof s->st_total);
    s->st_last.density = s->st_total.density = 1.0;
    if (!dhsa__session_uses_index(&s->p)) return DHSA_OK;
    free_indexes(s);
    return make_indexes(s);
}

void dhsa__session_state_clear(dhsa_session *s) { (void)state_clear(s); }

dhsa_status dhsa__session_state_commit(dhsa_session *s, int64_t len, const int64_t *base) {
    dhsa_status st = state_clear(s);
    for (int64_t l = 0; l < s->m->info.n_layer; l++) s->lc[l].base = base[l];
    for (int64_t l = 0; !st && s->ix && l < s->m->info.n_layer; l++) {
        if (!s->ix[l] || len == 0) continue;
        /* the keys as the evals gave them to the index: read back from the cache */
        dhsa_tensor k = cache_view(s, l, 0, len);
        if ((st = dhsa_kv_index_append(s->ix[l], &k)))
            st = dhsa__fail(st, "rebuilding the routing index of layer %lld: %s", (long long)l, dhsa_last_error());
    }
    if (st) {
        (void)state_clear(s);
        return st;
    }
    s->len = len;
    return DHSA_OK;
}
