/* session_plan.c: what a session will hold, before it holds it: the
 * memory plan (dhsa_session_plan, include/dhsa.h; dhsa_mem_plan) of the
 * session's buffers and of the rest of the process, the ubatch chosen to
 * fit --mem-limit and the sentence when nothing fits; a context-parallel
 * rank's plan adds what src/dist needs (dhsa__dist_plan). Also the
 * parameters' defaults and the choices the plan and src/model/session.c
 * both rest on (session_plan.h).
 * Tested by tests/test_memlimit.c, tests/test_model.c and tests/test_dist.c.
 */
#include "model/session_plan.h"
#include "route/rest.h"

#include "core/internal.h"
#include "core/procmem.h"
#include "dist/dist.h"
#include "model/gguf.h"
#include "model/tokenizer.h"

#include <stdio.h>
#include <string.h>

/* Rows per head of layer l's cache for a context of n_ctx in ubatches of ub. */
int64_t dhsa__session_layer_rows(const dhsa_model *m, const dhsa_session_params *p, int64_t l, int64_t n_ctx, int64_t ub) {
    const int64_t w = m->layers[l].window;
    if (w <= 0 || (p->dist && p->dist->size > 1)) return n_ctx;
    return w - 1 + ub < n_ctx ? w - 1 + ub : n_ctx;
}

/* Bytes of every layer's cache and backups. */
size_t dhsa__session_cache_bytes(const dhsa_model *m, const dhsa_session_params *p, int64_t n_ctx, int64_t ub) {
    const dhsa_model_info *in = &m->info;
    const size_t row = dhsa_type_row_bytes(p->kv_type, in->head_dim_k) + dhsa_type_row_bytes(p->kv_type, in->head_dim_v);
    size_t total = 0;
    for (int64_t l = 0; l < in->n_layer; l++) {
        int64_t r = dhsa__session_layer_rows(m, p, l, n_ctx, ub), b = r < n_ctx ? m->layers[l].window - 1 : 0;
        total += (size_t)in->n_head_kv * (size_t)(r + b) * row;
    }
    return total;
}

dhsa_session_params dhsa_session_default_params(void) {
    dhsa_session_params p;
    memset(&p, 0, sizeof p);
    p.kv_type = DHSA_F16; /* llama.cpp's default: half the cache of F32 (docs/model.md, "Defaults") */
    p.attn = DHSA_ATTN_DENSE;
    p.router = dhsa_router_params_for(0, 0.0625); /* scaled to n_ctx at plan and create */
    return p;
}

/* p with the router's unset fields scaled to the context (the defaults
 * plumbing: dhsa_router_scale), with or without ranks alike. */
dhsa_session_params dhsa__session_resolve(const dhsa_model *m, const dhsa_session_params *p) {
    dhsa_session_params q = *p;
    dhsa_router_scale(&q.router, q.n_ctx > 0 ? q.n_ctx : m->info.n_ctx_train);
    if (q.router.rest == DHSA_REST_HYBRID) q.router.rest = dhsa__model_hybrid(m) ? 1 : 0;
    const int64_t h = q.router.hybrid_max_chunk; /* finer chunks on hybrid models (route.h) */
    if (h > 0 && dhsa__model_hybrid(m)) {
        if (q.router.max_chunk > h) q.router.max_chunk = h;
        if (q.router.min_chunk > q.router.max_chunk) q.router.min_chunk = q.router.max_chunk;
    }
    return q;
}

/* A model that interleaves sliding-window layers with global ones
 * (gemma-2/3): DHSA_REST_HYBRID's summaries run in its global layers. */
int dhsa__model_hybrid(const dhsa_model *m) {
    return m->info.n_swa_layers > 0 && m->info.n_swa_layers < m->info.n_layer;
}

const char *dhsa_attn_method_name(dhsa_attn_method m) {
    switch (m) {
    case DHSA_ATTN_DENSE: return "dense";
    case DHSA_ATTN_DHSA: return "dhsa";
    case DHSA_ATTN_BLOCK: return "block";
    case DHSA_ATTN_STREAM: return "stream";
    case DHSA_ATTN_ORACLE: return "oracle";
    }
    return "?";
}

/* ------------------------------------------------------------- plan --- */

/* The router parameters a method runs with. */
dhsa_router_params dhsa__session_router(const dhsa_session_params *p) {
    dhsa_router_params rp = p->router;
    switch (p->attn) {
    case DHSA_ATTN_BLOCK:
        rp.method = DHSA_ROUTE_DHSA;
        rp.boundary = DHSA_BOUNDARY_FIXED;
        break;
    case DHSA_ATTN_STREAM: rp.method = DHSA_ROUTE_STREAM; break;
    case DHSA_ATTN_ORACLE: rp.method = DHSA_ROUTE_ORACLE; break;
    default:
        rp.method = DHSA_ROUTE_DHSA;
        if (rp.boundary == DHSA_BOUNDARY_FIXED) rp.boundary = DHSA_BOUNDARY_SIMILARITY;
        break;
    }
    rp.causal_boundaries = 1;
    return rp;
}

/* Whether the method routes through per-layer indexes. */
/* Whether a session with p stores centred keys (the note above). */
int dhsa__session_keys_centred(const dhsa_model *m, const dhsa_session_params *p) {
    const dhsa_model_info *in = &m->info;
    if (p->kv_type != DHSA_Q8_0 || in->attn_softcap > 0 || in->head_dim_k > DHSA__KOFF_MAX_HD) return 0;
    if (p->dist && p->dist->size > 1) return 0; /* a Q8_0 cache is not split between ranks */
    for (int64_t l = 0; l < in->n_layer; l++)
        if (m->layers[l].bk) return 1;
    return 0;
}

/* The offsets' bytes after a cache of cache_bytes (64-byte aligned). */
static size_t koff_bytes(const dhsa_model *m, const dhsa_session_params *p, size_t cache_bytes) {
    if (!dhsa__session_keys_centred(m, p)) return 0;
    const dhsa_model_info *in = &m->info;
    return dhsa__align_up(cache_bytes, 64) - cache_bytes +
           (size_t)in->n_layer * (size_t)in->n_head_kv * (size_t)in->head_dim_k * sizeof(float);
}

int dhsa__session_uses_index(const dhsa_session_params *p) {
    return p->attn == DHSA_ATTN_DHSA || p->attn == DHSA_ATTN_BLOCK;
}

size_t dhsa__session_act_floats(const dhsa_model_info *in, int64_t ub) {
    return (size_t)ub * (size_t)(2 * in->n_embd + in->n_head * in->head_dim_k + in->n_head_kv * in->head_dim_k +
                                 in->n_head_kv * in->head_dim_v + in->n_head * in->head_dim_v + 2 * in->n_ff +
                                 2 * in->n_rot) +
           (size_t)in->n_rot + 16 * 12;
}

static float plan_dummy[16];

/* An attention descriptor of the shapes a layer call has: ub queries at
 * position n_ctx - ub over n_ctx keys (the largest call). Data pointers
 * are placeholders: only sizes are asked of it. */
static dhsa_attn_desc shape_desc(const dhsa_model_info *in, dhsa_type kv_type, int64_t n_ctx, int64_t ub) {
    dhsa_attn_desc a = dhsa_attn_default_desc();
    a.q = dhsa_tensor_blhd(plan_dummy, DHSA_F32, 1, ub, in->n_head, in->head_dim_k);
    a.k = dhsa_tensor_bhld(plan_dummy, kv_type, 1, in->n_head_kv, n_ctx, in->head_dim_k);
    a.v = dhsa_tensor_bhld(plan_dummy, kv_type, 1, in->n_head_kv, n_ctx, in->head_dim_v);
    a.o = dhsa_tensor_blhd(plan_dummy, DHSA_F32, 1, ub, in->n_head, in->head_dim_v);
    a.causal = 1;
    a.q_pos0 = n_ctx - ub;
    a.softcap = in->attn_softcap;
    return a;
}

/* What the process holds besides the session's buffers: the same for
 * every ubatch one plan tries, so measured once per plan. */
typedef struct {
    size_t model_file, model_heap, code, other, stacks;
    int measured, thp_always;
} process_part;

static process_part measure_process(const dhsa_ctx *ctx, const dhsa_model *m) {
    process_part pp;
    memset(&pp, 0, sizeof pp);
    const void *map;
    size_t mapped, owned, gguf_heap;
    dhsa_gguf__memory(m->g, &map, &mapped, &owned, &gguf_heap);
    /* the file's pages (mapped) or the copy's block (owned) hold the tensors and the rest */
    size_t file = mapped ? dhsa__align_up(mapped, DHSA__PAGE) : owned ? dhsa__heap_block(owned) : 0;
    size_t weights = (size_t)m->info.weight_bytes;
    pp.model_file = file > weights ? file - weights : 0;
    pp.model_heap = gguf_heap + dhsa__tokenizer_heap_bytes(m->tok) + dhsa__heap_block(sizeof *m) +
                    dhsa__heap_block((size_t)m->info.n_layer * sizeof *m->layers) +
                    dhsa__heap_block((size_t)m->n_vector_floats * sizeof(float));
    /* what of the anonymous memory is the model's: its heap and an owned copy */
    size_t model_anon = pp.model_heap + (owned ? file : 0);
    dhsa__proc_mem pm;
    dhsa__proc_measure(map, mapped, &pm);
    pp.measured = pm.measured;
    pp.thp_always = pm.thp_always;
    pp.code = pm.measured ? pm.mapped_files : DHSA_PLAN_CODE_FALLBACK;
    pp.other = pm.anon > model_anon ? pm.anon - model_anon : 0;
    pp.stacks = (size_t)dhsa_ctx_n_threads(ctx) * DHSA_PLAN_STACK_ALLOWANCE;
    return pp;
}

static dhsa_status plan_for(const dhsa_ctx *ctx, const dhsa_model *m, const dhsa_session_params *p,
                            const process_part *pp, int64_t n_ctx, int64_t ub, dhsa_mem_plan *pl) {
    const dhsa_model_info *in = &m->info;
    memset(pl, 0, sizeof *pl);
    pl->n_ctx = n_ctx;
    pl->n_ubatch = ub;
    pl->weights = (size_t)in->weight_bytes;
    pl->kv_cache = dhsa__session_cache_bytes(m, p, n_ctx, ub);
    pl->kv_cache += koff_bytes(m, p, pl->kv_cache);
    pl->activations = dhsa__session_act_floats(in, ub) * sizeof(float) + 64 * 16;
    dhsa_attn_desc a = shape_desc(in, p->kv_type, n_ctx, ub);
    dhsa_status st = dhsa_attn_workspace_size(ctx, &a, &pl->attn_workspace);
    if (st) return st;
    /* calls of at most 16 query columns (decode, a short last ubatch) may
     * split their keys across threads and keep partials (attn_tiled.c,
     * split-K): the largest of those too */
    for (int64_t n = 1; n <= 16 && n < ub; n++) {
        size_t w;
        dhsa_attn_desc d = shape_desc(in, p->kv_type, n_ctx, n);
        if ((st = dhsa_attn_workspace_size(ctx, &d, &w))) return st;
        if (w > pl->attn_workspace) pl->attn_workspace = w;
    }
    int nt = dhsa_ctx_n_threads(ctx);
    size_t mw = 0;
    const dhsa__layer *L = &m->layers[0];
    const dhsa_wmat *mats[8] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down, &m->output};
    for (int i = 0; i < 8; i++) {
        const dhsa__mm_path path = p->exact ? DHSA_MM_EXACT : DHSA_MM_FAST;
        size_t w = dhsa__matmul_workspace_on(path, mats[i]->type, mats[i]->n_in, mats[i]->n_out, i == 7 ? 1 : ub, nt);
        if (p->logits_all && i == 7)
            w = dhsa__matmul_workspace_on(path, mats[i]->type, mats[i]->n_in, mats[i]->n_out, ub, nt);
        if (w > mw) mw = w;
    }
    pl->matmul_workspace = mw;
    if (p->attn != DHSA_ATTN_DENSE) {
        dhsa_router_params rp = dhsa__session_router(p);
        size_t layout_bytes = 0, route_ws = 0;
        if ((st = dhsa_route_sizes(ctx, &rp, &a, &layout_bytes, &route_ws))) return st;
        if (dhsa__session_uses_index(p)) {
            size_t ixb;
            if ((st = dhsa_kv_index_size(&rp, in->n_head_kv, in->head_dim_k, n_ctx, &ixb))) return st;
            int64_t routed = 0, rest_layers = 0; /* sliding-window layers keep no index (session.c, make_indexes) */
            for (int64_t l = 0; l < in->n_layer; l++) {
                routed += !m->layers[l].window;
                rest_layers += !m->layers[l].window && rp.rest > 0 && l >= rp.rest - 1; /* make_rest */
            }
            pl->routing = (size_t)routed * ixb + layout_bytes;
            if (rp.rest && rp.method == DHSA_ROUTE_DHSA && !dhsa__dist_on(p)) /* rest.h: summaries, their scratch, a layout */
                pl->routing += (size_t)rest_layers * (dhsa__rest_bytes(in->n_head_kv, in->head_dim_k, in->head_dim_v,
                                                                      dhsa__rest_max_chunks(&rp, n_ctx),
                                                                      p->kv_type == DHSA_F32) +
                                                     DHSA__PAGE + 64) +
                               (size_t)ub * (size_t)in->n_head * (size_t)(in->head_dim_v + 2) * sizeof(float) +
                               layout_bytes;
        } else {
            pl->routing = layout_bytes + route_ws;
        }
    }
    /* The allocator's rounding: dhsa_buffer_alloc gives the cache whole
     * 2 MiB pages (advised as huge pages: touched, each is resident whole)
     * and a page for glibc's header before it; every ctx block (the
     * activations, the scratch, a layout, an index and its struct) may take
     * a page more than it asked for. Routed methods also malloc temporaries
     * of up to 40 bytes per key while they route (chunk candidates, scores).
     * With transparent huge pages "always", a buffer's own range is still
     * all it can make resident, but the cache's header page and the heap's
     * top may each fault in a whole 2 MiB page. */
    size_t buffers = 3 + (dhsa__session_uses_index(p) ? 2 * (size_t)in->n_layer : 0) + (p->attn != DHSA_ATTN_DENSE ? 2 : 0);
    size_t kv_round = pl->kv_cache >= DHSA__HUGE_PAGE ? dhsa__align_up(pl->kv_cache, DHSA__HUGE_PAGE) - pl->kv_cache : 0;
    pl->slack = kv_round + buffers * (DHSA__PAGE + 64) + DHSA_PLAN_HEAP_MARGIN +
                (p->attn != DHSA_ATTN_DENSE ? (size_t)n_ctx * 40 : 0) + (pp->thp_always ? 2 * DHSA__HUGE_PAGE : 0);
    pl->model_file = pp->model_file;
    pl->model_heap = pp->model_heap;
    pl->code = pp->code;
    pl->other = pp->other;
    pl->stacks = pp->stacks;
    pl->measured = pp->measured;
    pl->process = pl->model_file + pl->model_heap + pl->code + pl->other + pl->stacks + pl->slack;
    pl->total = pl->weights + pl->kv_cache + pl->activations + pl->attn_workspace + pl->matmul_workspace +
                pl->routing + pl->process;
    return DHSA_OK;
}

/* A size for a sentence: bytes below 1 KiB, KiB below 1 MiB, then MiB
 * and GiB (a 4 KiB limit is not "0.0 MiB"). */
static const char *size_text(size_t b, char *buf, size_t cap) {
    if (b < 1024) snprintf(buf, cap, "%zu byte%s", b, b == 1 ? "" : "s");
    else if (b < ((size_t)1 << 20)) snprintf(buf, cap, "%.1f KiB", (double)b / 1024.0);
    else if (b < ((size_t)1 << 30)) snprintf(buf, cap, "%.1f MiB", (double)b / (1024.0 * 1024.0));
    else snprintf(buf, cap, "%.2f GiB", (double)b / (1024.0 * 1024.0 * 1024.0));
    return buf;
}

/* "X (weights A, KV cache B for N tokens, buffers C, the rest of the
 * process D)": what a plan needs, for the refusals. */
static const char *plan_text(const dhsa_mem_plan *pl, char *buf, size_t cap) {
    char t[5][32];
    snprintf(buf, cap, "%s (weights %s, KV cache %s for %lld tokens, buffers %s, the rest of the process %s)",
             size_text(pl->total, t[0], 32), size_text(pl->weights, t[1], 32), size_text(pl->kv_cache, t[2], 32),
             (long long)pl->n_ctx,
             size_text(pl->activations + pl->attn_workspace + pl->matmul_workspace + pl->routing, t[3], 32),
             size_text(pl->process, t[4], 32));
    return buf;
}

/* A context-parallel rank's plan: that of one process over its share of
 * the positions in one ubatch (every rank runs its positions through each
 * layer at once), plus what src/dist adds (dhsa__dist_plan). n_ctx in the
 * plan is the job's context; kv_cache is this rank's. */
static dhsa_status dist_plan(const dhsa_ctx *ctx, const dhsa_model *m, const dhsa_session_params *p, int64_t n_ctx,
                             dhsa_mem_plan *out) {
    int64_t cap;
    dhsa_status st = dhsa__dist_check(&m->info, p, n_ctx, &cap);
    if (st) return st;
    dhsa_session_params lp = *p;
    lp.dist = NULL;
    lp.dist_fetch_share = 0;
    lp.n_ctx = cap;
    lp.n_ubatch = cap;
    lp.mem_limit = 0;
    if ((st = dhsa_session_plan(ctx, m, &lp, out))) return st;
    const dhsa_router_params rp = dhsa__session_router(p), lrp = dhsa__session_router(&lp);
    if ((st = dhsa__dist_plan(&m->info, p, &rp, n_ctx, &out->routing, &out->activations))) return st;
    if (lrp.rest && lrp.method == DHSA_ROUTE_DHSA && p->attn != DHSA_ATTN_DENSE && dhsa__session_uses_index(p)) {
        /* the summaries: the whole context's chunks on every rank, and none of one process's
         * scratch of ub rows (src/dist merges them in its own buffers) */
        const dhsa_model_info *in = &m->info;
        const int f32 = p->kv_type == DHSA_F32;
        int64_t layers = 0;
        for (int64_t l = 0; l < in->n_layer; l++) layers += !m->layers[l].window && l >= lrp.rest - 1;
        const size_t loc = dhsa__rest_bytes(in->n_head_kv, in->head_dim_k, in->head_dim_v,
                                            dhsa__rest_max_chunks(&lrp, cap), f32),
                     all = dhsa__rest_bytes(in->n_head_kv, in->head_dim_k, in->head_dim_v,
                                            dhsa__rest_max_chunks(&rp, n_ctx), f32);
        out->routing += (size_t)layers * (all - loc);
        out->routing -= (size_t)cap * (size_t)in->n_head * (size_t)(in->head_dim_v + 2) * sizeof(float);
    }
    out->n_ctx = n_ctx;
    out->total = out->weights + out->kv_cache + out->activations + out->attn_workspace + out->matmul_workspace +
                 out->routing + out->process;
    if (p->mem_limit && out->total > p->mem_limit) {
        char need[256], lim[32];
        return dhsa__fail(DHSA_ERR_MEMORY_BUDGET, "rank %d of %d (%lld of the %lld positions) needs %s, above "
                          "--mem-limit %s (per rank); more ranks would each hold less", p->dist->rank, p->dist->size,
                          (long long)cap, (long long)n_ctx, plan_text(out, need, sizeof need),
                          size_text(p->mem_limit, lim, sizeof lim));
    }
    return DHSA_OK;
}

dhsa_status dhsa_session_plan(const dhsa_ctx *ctx, const dhsa_model *m, const dhsa_session_params *p,
                              dhsa_mem_plan *out) {
    if (!ctx || !m || !p || !out) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_session_plan: NULL argument");
    const dhsa_session_params rq = dhsa__session_resolve(m, p);
    p = &rq;
    const dhsa_model_info *in = &m->info;
    int64_t n_ctx = p->n_ctx > 0 ? p->n_ctx : in->n_ctx_train;
    if (n_ctx < 1 || n_ctx > ((int64_t)1 << 31))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "context of %lld tokens (1 .. 2^31)", (long long)n_ctx);
    if (p->kv_type != DHSA_F32 && p->kv_type != DHSA_F16 && p->kv_type != DHSA_Q8_0)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "the KV cache is F32, F16 or Q8_0");
    if (p->kv_type == DHSA_Q8_0 && (in->head_dim_k % 32 || in->head_dim_v % 32))
        return dhsa__fail(DHSA_ERR_UNSUPPORTED, "a Q8_0 KV cache stores rows as blocks of 32 values, but this model's "
                          "heads have %lld (K) and %lld (V) dims; use --kv f16",
                          (long long)in->head_dim_k, (long long)in->head_dim_v);
    if ((int)p->attn < DHSA_ATTN_DENSE || (int)p->attn > DHSA_ATTN_ORACLE)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "unknown attention method %d", (int)p->attn);
    if (p->n_ubatch < 0 || p->n_ubatch > 65536)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "ubatch of %lld tokens (0 = automatic, at most 65536)",
                          (long long)p->n_ubatch);
    if (p->attn == DHSA_ATTN_DHSA && p->router.boundary == DHSA_BOUNDARY_LEARNED) {
        if (!p->router.predictor)
            return dhsa__fail(DHSA_ERR_INVALID_ARG, "learned boundaries need a predictor");
        if (dhsa_predictor_width(p->router.predictor) != in->n_head_kv * in->head_dim_k)
            return dhsa__fail(DHSA_ERR_SHAPE, "the predictor reads %lld values per token; this model's keys have "
                              "%lld (KV heads x head dim)", (long long)dhsa_predictor_width(p->router.predictor),
                              (long long)(in->n_head_kv * in->head_dim_k));
    }
    if (!(p->dist_fetch_share >= 0.0 && p->dist_fetch_share <= 1.0))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dist_fetch_share = %g: a share of the keys in (0, 1], or 0 for no "
                          "fetch budget", p->dist_fetch_share);
    if (dhsa__dist_on(p)) return dist_plan(ctx, m, p, n_ctx, out);
    if (p->dist_fetch_share > 0)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dist_fetch_share %g budgets the keys a rank of a context-parallel "
                          "prefill fetches from the other ranks; one process fetches nothing (docs/dist.md)",
                          p->dist_fetch_share);
    const process_part pp = measure_process(ctx, m);
    char need[256], lim[32], alt[32], big[32];
    dhsa_status st;
    if (p->n_ubatch > 0) {
        int64_t ub = p->n_ubatch < n_ctx ? p->n_ubatch : n_ctx;
        if ((st = plan_for(ctx, m, p, &pp, n_ctx, ub, out))) return st;
        if (!p->mem_limit || out->total <= p->mem_limit) return DHSA_OK;
        /* the largest smaller ubatch that fits, if any */
        dhsa_mem_plan smaller;
        int64_t fit = 0;
        for (int64_t u = ub / 2; u >= 1 && !fit; u /= 2) {
            if ((st = plan_for(ctx, m, p, &pp, n_ctx, u, &smaller))) return st;
            if (smaller.total <= p->mem_limit) fit = u;
        }
        plan_text(out, need, sizeof need);
        size_text(p->mem_limit, lim, sizeof lim);
        if (fit)
            return dhsa__fail(DHSA_ERR_MEMORY_BUDGET,
                              "ubatch %lld needs %s, above --mem-limit %s; --ubatch %lld would fit (%s), or a limit "
                              "of %s", (long long)ub, need, lim, (long long)fit, size_text(smaller.total, alt, sizeof alt),
                              size_text(out->total, big, sizeof big));
        return dhsa__fail(DHSA_ERR_MEMORY_BUDGET, "ubatch %lld needs %s, above --mem-limit %s; a limit of %s would fit",
                          (long long)ub, need, lim, size_text(out->total, alt, sizeof alt));
    }
    int64_t ub = DHSA__MAX_UBATCH < n_ctx ? DHSA__MAX_UBATCH : n_ctx;
    for (;; ub /= 2) {
        if ((st = plan_for(ctx, m, p, &pp, n_ctx, ub, out))) return st;
        if (!p->mem_limit || out->total <= p->mem_limit) return DHSA_OK;
        if (ub == 1) break;
    }
    /* Nothing fits: say what would. */
    size_t per_tok = (size_t)in->n_layer * (size_t)in->n_head_kv *
                     (dhsa_type_row_bytes(p->kv_type, in->head_dim_k) + dhsa_type_row_bytes(p->kv_type, in->head_dim_v));
    size_t rest = out->total - out->kv_cache;
    char hint[256] = "";
    int64_t fit = p->mem_limit > rest ? (int64_t)((p->mem_limit - rest) / per_tok) * 9 / 10 : 0;
    if (fit > 0) {
        snprintf(hint, sizeof hint, "a context of about %lld tokens would fit%s", (long long)fit,
                 p->kv_type == DHSA_F32 ? " (twice that with --kv f16, 3.7x with --kv q8_0)"
                 : p->kv_type == DHSA_F16 ? " (1.9x that with --kv q8_0)" : "");
    } else {
        snprintf(hint, sizeof hint, "no context fits, as all but the KV cache needs %s; a limit of %s would fit this one",
                 size_text(rest, alt, sizeof alt), size_text(out->total, big, sizeof big));
    }
    return dhsa__fail(DHSA_ERR_MEMORY_BUDGET, "%s needed at ubatch 1 but --mem-limit is %s; %s",
                      plan_text(out, need, sizeof need), size_text(p->mem_limit, lim, sizeof lim), hint);
}

