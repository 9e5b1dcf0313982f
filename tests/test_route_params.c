/* test_route_params.c: dhsa_route's parameter checks, dhsa_route_sizes
 * against what a routed layout holds and the ctx budget it needs, and
 * sinks where the model puts them (sink_window), for every method and the
 * decode index (include/dhsa.h "DHSA routing"). Harness: route_t.h. *
 * Run: make build/tests/test_route_params && build/tests/test_route_params
 * (or `make test`). Ends with "test_route_params: P passed, F failed, S skipped".
 */

#include "route_t.h"

/* ======================================================================== */
/* 7. Parameter checks, sizes and budgets of dhsa_route                     */

static void test_route_params(void) {
    rdata R;
    rdata_random(&R, 1, 4, 2, 300, 300, 32, 71);
    R.a.causal = 1;
    dhsa_ctx *ctx = ctx_new(2, 0);
    if (!ctx) { rdata_free(&R); return; }
    const dhsa_router_params base = rparams(DHSA_ROUTE_DHSA, DHSA_BOUNDARY_SIMILARITY, 64, 0);
    {
        dhsa_layout *lay = route(ctx, &base, &R.a, "params base case");
        T_CHECK(lay != NULL, "the base case of the parameter checks fails");
        dhsa_layout_free(lay);
        dhsa_router_params dp = dhsa_router_default_params();
        lay = route(ctx, &dp, &R.a, "default params");
        T_CHECK(lay != NULL, "dhsa_router_default_params() is refused");
        dhsa_layout_free(lay);
    }
    struct {
        const char *what;
        dhsa_router_params rp;
        dhsa_status want;
    } bad[24];
    int n = 0;
#define BAD(desc, field_set, code)                                                        \
    do {                                                                                  \
        bad[n].what = desc;                                                               \
        bad[n].rp = base;                                                                 \
        { dhsa_router_params *p_ = &bad[n].rp; field_set; }                               \
        bad[n].want = code;                                                               \
        n++;                                                                              \
    } while (0)
    BAD("q_block 0", p_->q_block = 0, DHSA_ERR_INVALID_ARG);
    BAD("q_block -5", p_->q_block = -5, DHSA_ERR_INVALID_ARG);
    BAD("min_chunk > max_chunk", (p_->min_chunk = 64, p_->max_chunk = 32), DHSA_ERR_INVALID_ARG);
    BAD("min_chunk 0", p_->min_chunk = 0, DHSA_ERR_INVALID_ARG);
    BAD("chunk 0 (fixed)", (p_->boundary = DHSA_BOUNDARY_FIXED, p_->chunk = 0), DHSA_ERR_INVALID_ARG);
    BAD("sim_window 0", p_->sim_window = 0, DHSA_ERR_INVALID_ARG);
    BAD("nms_window -1", p_->nms_window = -1, DHSA_ERR_INVALID_ARG);
    BAD("threshold NaN", p_->threshold = NAN, DHSA_ERR_INVALID_ARG);
    BAD("threshold inf", p_->threshold = INFINITY, DHSA_ERR_INVALID_ARG);
    BAD("density 0 with budget 0", (p_->budget_tokens = 0, p_->density = 0), DHSA_ERR_INVALID_ARG);
    BAD("density 1.5 with budget 0", (p_->budget_tokens = 0, p_->density = 1.5), DHSA_ERR_INVALID_ARG);
    BAD("density -0.1 with budget 0", (p_->budget_tokens = 0, p_->density = -0.1), DHSA_ERR_INVALID_ARG);
    BAD("density NaN with budget 0", (p_->budget_tokens = 0, p_->density = NAN), DHSA_ERR_INVALID_ARG);
    BAD("budget -1", p_->budget_tokens = -1, DHSA_ERR_INVALID_ARG);
    BAD("sink_tokens -1", p_->sink_tokens = -1, DHSA_ERR_INVALID_ARG);
    BAD("score_mode 7", p_->score_mode = (dhsa_chunk_score)7, DHSA_ERR_INVALID_ARG);
    BAD("local_tokens -1", p_->local_tokens = -1, DHSA_ERR_INVALID_ARG);
    BAD("dense_below -1", p_->dense_below = -1, DHSA_ERR_INVALID_ARG);
    BAD("method 7", p_->method = (dhsa_route_method)7, DHSA_ERR_INVALID_ARG);
    BAD("method -1", p_->method = (dhsa_route_method)-1, DHSA_ERR_INVALID_ARG);
    BAD("boundary 7", p_->boundary = (dhsa_boundary)7, DHSA_ERR_INVALID_ARG);
    BAD("LEARNED boundary without a predictor", (p_->boundary = DHSA_BOUNDARY_LEARNED, p_->predictor = NULL),
        DHSA_ERR_INVALID_ARG);
#undef BAD
    for (int c = 0; c < n; c++) {
        dhsa_mem_stats m0 = dhsa_ctx_mem_stats(ctx);
        dhsa_layout *lay = (dhsa_layout *)&lay;
        plant_error();
        dhsa_status st = dhsa_route(ctx, &bad[c].rp, &R.a, &lay);
        T_CHECK(st == bad[c].want && fresh_error(), "dhsa_route with %s: %s (want %s), sentence \"%s\"", bad[c].what,
                dhsa_status_str(st), dhsa_status_str(bad[c].want), dhsa_last_error());
        T_CHECK(lay == NULL, "dhsa_route with %s left *out set", bad[c].what);
        dhsa_mem_stats m1 = dhsa_ctx_mem_stats(ctx);
        T_CHECK(m1.in_use == m0.in_use && m1.n_allocs == m0.n_allocs, "dhsa_route with %s allocated from the ctx",
                bad[c].what);
        size_t lb = 1, wb = 1;
        plant_error();
        dhsa_status st2 = dhsa_route_sizes(ctx, &bad[c].rp, &R.a, &lb, &wb);
        T_CHECK(st2 == st && fresh_error(), "dhsa_route_sizes with %s: %s, dhsa_route %s", bad[c].what,
                dhsa_status_str(st2), dhsa_status_str(st));
    }
    /* a density > 1 is ignored when a budget is given (the header: density
     * applies when budget_tokens = 0) */
    {
        dhsa_router_params rp = base;
        rp.density = 5.0;
        dhsa_layout *lay = NULL;
        dhsa_status st = dhsa_route(ctx, &rp, &R.a, &lay);
        T_CHECK(st == DHSA_OK, "density 5 with budget 64 refused: %s", dhsa_last_error());
        dhsa_layout_free(lay);
    }
    /* descriptor and argument errors */
    {
        dhsa_layout *lay = NULL;
        dhsa_attn_desc a = R.a;
        a.q.data = NULL;
        plant_error();
        T_CHECK(dhsa_route(ctx, &base, &a, &lay) < 0 && !lay && fresh_error(), "dhsa_route with q.data NULL succeeded");
        a = R.a;
        a.k.shape[1] = 3;
        plant_error();
        T_CHECK(dhsa_route(ctx, &base, &a, &lay) == DHSA_ERR_SHAPE && !lay && fresh_error(),
                "dhsa_route with Hq 4 over Hkv 3: not SHAPE");
        a = R.a;
        a.k.shape[3] = 16;
        plant_error();
        T_CHECK(dhsa_route(ctx, &base, &a, &lay) == DHSA_ERR_SHAPE && !lay && fresh_error(),
                "dhsa_route with k dim 16 vs q dim 32: not SHAPE");
        a = R.a;
        a.q.shape[2] = 0;
        plant_error();
        T_CHECK(dhsa_route(ctx, &base, &a, &lay) < 0 && !lay && fresh_error(), "dhsa_route with Lq 0 succeeded");
        a = R.a;
        a.window = -1;
        plant_error();
        T_CHECK(dhsa_route(ctx, &base, &a, &lay) < 0 && !lay && fresh_error(), "dhsa_route with window -1 succeeded");
        plant_error();
        T_CHECK(dhsa_route(ctx, NULL, &R.a, &lay) < 0 && !lay && fresh_error(), "dhsa_route(rp NULL) succeeded");
        plant_error();
        T_CHECK(dhsa_route(ctx, &base, NULL, &lay) < 0 && !lay && fresh_error(), "dhsa_route(a NULL) succeeded");
        T_CHECK(dhsa_route(NULL, &base, &R.a, &lay) < 0 && !lay, "dhsa_route(ctx NULL) succeeded");
        T_CHECK(dhsa_route(ctx, &base, &R.a, NULL) < 0, "dhsa_route(out NULL) succeeded");
        size_t lb, wb;
        T_CHECK(dhsa_route_sizes(NULL, &base, &R.a, &lb, &wb) < 0, "dhsa_route_sizes(ctx NULL) succeeded");
    }
    dhsa_ctx_free(ctx);
    rdata_free(&R);
}

/* dhsa_route_sizes: the layout it announces is what the routed layout
 * holds (ctx in_use delta), and routing fits a budget of exactly layout +
 * workspace above what the ctx holds, but not one byte less. */
static void test_route_sizes_budget(void) {
    rdata R;
    rdata_random(&R, 2, 4, 2, 2200, 2200, 64, 81);
    R.a.causal = 1;
    struct {
        const char *what;
        dhsa_router_params rp;
    } cs[] = {
        {"dhsa/similarity budget 300", rparams(DHSA_ROUTE_DHSA, DHSA_BOUNDARY_SIMILARITY, 300, 0)},
        {"dhsa/fixed density 0.1", rparams(DHSA_ROUTE_DHSA, DHSA_BOUNDARY_FIXED, 0, 0.1)},
        {"stream budget 300", rparams(DHSA_ROUTE_STREAM, DHSA_BOUNDARY_SIMILARITY, 300, 0)},
        {"oracle/similarity budget 300", rparams(DHSA_ROUTE_ORACLE, DHSA_BOUNDARY_SIMILARITY, 300, 0)},
        {"dense (dense_below 4096)", rparams(DHSA_ROUTE_DHSA, DHSA_BOUNDARY_SIMILARITY, 300, 0)},
        {"dhsa/similarity share_heads, max_chunk 20", rparams(DHSA_ROUTE_DHSA, DHSA_BOUNDARY_SIMILARITY, 300, 0)},
    };
    cs[4].rp.dense_below = 4096;
    cs[5].rp.share_heads = 1, cs[5].rp.max_chunk = 20;
    for (int threads = 1; threads <= 3; threads += 2)
        for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
            dhsa_ctx *ctx = ctx_new(threads, 0);
            if (!ctx) continue;
            /* something already held by the ctx */
            void *held = dhsa_ctx_alloc(ctx, 1000);
            size_t lb = 0, wb = 0;
            dhsa_status st = dhsa_route_sizes(ctx, &cs[c].rp, &R.a, &lb, &wb);
            T_CHECK(st == DHSA_OK && lb > 0 && wb > 0, "%s: route_sizes %s (layout %zu, workspace %zu)", cs[c].what,
                    dhsa_status_str(st), lb, wb);
            size_t base = dhsa_ctx_mem_stats(ctx).in_use;
            /* one byte short: refused, nothing kept */
            T_CHECK(dhsa_ctx_set_budget(ctx, base + lb + wb - 1) == DHSA_OK, "set_budget failed");
            dhsa_layout *lay = (dhsa_layout *)&lay;
            plant_error();
            st = dhsa_route(ctx, &cs[c].rp, &R.a, &lay);
            T_CHECK(st == DHSA_ERR_MEMORY_BUDGET && lay == NULL && fresh_error(),
                    "%s, %d threads: budget 1 byte below layout %zu + workspace %zu: %s", cs[c].what, threads, lb, wb,
                    dhsa_status_str(st));
            T_CHECK(dhsa_ctx_mem_stats(ctx).in_use == base, "%s: a refused route kept %zu bytes", cs[c].what,
                    dhsa_ctx_mem_stats(ctx).in_use - base);
            /* exactly enough: works; the layout holds lb; the peak is lb + wb */
            T_CHECK(dhsa_ctx_set_budget(ctx, base + lb + wb) == DHSA_OK, "set_budget failed");
            dhsa_ctx_reset_peak(ctx);
            st = dhsa_route(ctx, &cs[c].rp, &R.a, &lay);
            T_CHECK(st == DHSA_OK && lay, "%s, %d threads: budget of exactly layout %zu + workspace %zu: %s %s",
                    cs[c].what, threads, lb, wb, dhsa_status_str(st), dhsa_last_error());
            dhsa_mem_stats m = dhsa_ctx_mem_stats(ctx);
            T_CHECK(m.in_use - base == lb, "%s: the routed layout holds %zu bytes, route_sizes said %zu", cs[c].what,
                    m.in_use - base, lb);
            T_CHECK(m.peak - base == lb + wb, "%s: routing peaked at %zu bytes above the base, want layout %zu + "
                    "workspace %zu", cs[c].what, m.peak - base, lb, wb);
            if (lay) {
                dhsa_layout_stats ls;
                size_t exact = 0;
                dhsa_layout_get_stats(lay, &ls);
                dhsa_layout_size(ls.B, ls.Hkv, ls.Lq, ls.Lk, ls.q_block, ls.max_ranges, &exact);
                T_CHECK(exact == lb, "%s: layout_size of the routed layout's shape %zu, route_sizes %zu", cs[c].what,
                        exact, lb);
                check_routed(cs[c].what, lay, &cs[c].rp, &R.a);
                dhsa_layout_free(lay);
            }
            T_CHECK(dhsa_ctx_mem_stats(ctx).in_use == base, "%s: in_use not back to the base after free", cs[c].what);
            dhsa_ctx_release(ctx, held);
            dhsa_ctx_free(ctx);
        }
    rdata_free(&R);
}

/* Sinks where the model puts them (dhsa.h, sink_window): keys at 13, 20
 * and 30 made to score high against every query (as the chat template's
 * delimiters of Qwen2.5 do) must be the sinks of every block that sees
 * them, for every method and for the decode index; the ranking is
 * re-derived here in double from the block's mean query. With
 * sink_window 0 the sinks are the first keys (and 13, 20, 30 are not all
 * read by the last block of STREAM). */
static void test_picked_sinks(void) {
    const int64_t L = 1024, d = 32, Hq = 4, Hkv = 2, G = Hq / Hkv;
    float *q = malloc((size_t)(L * Hq * d) * sizeof(float)), *k = malloc((size_t)(L * Hkv * d) * sizeof(float));
    rng_t rs = {99};
    for (int64_t i = 0; i < L * Hq * d; i++) q[i] = (float)(rng_unif(&rs) - 0.5) + (i % d == 0 ? 1.0f : 0.0f);
    for (int64_t i = 0; i < L * Hkv * d; i++) k[i] = (float)(rng_unif(&rs) - 0.5);
    const int64_t sink_pos[3] = {13, 20, 30};
    for (int s = 0; s < 3; s++)
        for (int64_t g = 0; g < Hkv; g++) k[(sink_pos[s] * Hkv + g) * d] = 8.0f; /* along the queries' common part */
    dhsa_attn_desc a = dhsa_attn_default_desc();
    a.q = dhsa_tensor_blhd(q, DHSA_F32, 1, L, Hq, d);
    a.k = dhsa_tensor_blhd(k, DHSA_F32, 1, L, Hkv, d);
    a.v = a.k;
    a.o = a.q;
    a.causal = 1;
    const dhsa_route_method methods[3] = {DHSA_ROUTE_DHSA, DHSA_ROUTE_STREAM, DHSA_ROUTE_ORACLE};
    for (int mi = 0; mi < 4; mi++) {
        dhsa_router_params rp = dhsa_router_params_for(L, 0.125);
        rp.sink_tokens = 4;
        rp.method = mi < 3 ? methods[mi] : DHSA_ROUTE_DHSA;
        dhsa_layout *lay = NULL;
        dhsa_kv_index *ix = NULL;
        if (mi == 3) { /* the decode index, routed over the whole prompt */
            T_CHECK(dhsa_kv_index_create(g_ctx, &rp, Hkv, d, L, &ix) == DHSA_OK, "index: %s", dhsa_last_error());
            if (!ix) continue;
            T_CHECK(dhsa_kv_index_append(ix, &a.k) == DHSA_OK, "append: %s", dhsa_last_error());
            T_CHECK(dhsa_kv_index_route(g_ctx, ix, &a, &lay) == DHSA_OK, "index route: %s", dhsa_last_error());
        } else {
            T_CHECK(dhsa_route(g_ctx, &rp, &a, &lay) == DHSA_OK, "route: %s", dhsa_last_error());
        }
        if (!lay) {
            dhsa_kv_index_free(ix);
            continue;
        }
        int64_t bad = 0, blocks = 0, sinks_read = 0;
        for (int64_t g = 0; g < Hkv; g++)
            for (int64_t qb = 0; qb * rp.q_block < L; qb++) {
                int64_t r0 = qb * rp.q_block, r1 = r0 + rp.q_block < L ? r0 + rp.q_block : L;
                int64_t budget = (int64_t)ceil(rp.density * (double)r1);
                if (budget >= r1 || budget / 8 < 3 || r0 < 64) continue; /* dense, too few sinks, or all local */
                /* the block's mean query over its rows and the group's heads, in double */
                double qm[32] = {0}, sc[64];
                for (int64_t h = g * G; h < (g + 1) * G; h++)
                    for (int64_t r = r0; r < r1; r++)
                        for (int64_t x = 0; x < d; x++) qm[x] += q[(r * Hq + h) * d + x];
                for (int64_t j = 0; j < 64; j++) {
                    sc[j] = 0;
                    for (int64_t x = 0; x < d; x++) sc[j] += qm[x] * k[(j * Hkv + g) * d + x];
                }
                int64_t want = budget / 8 < rp.sink_tokens ? budget / 8 : rp.sink_tokens;
                const int64_t *rg;
                int64_t n;
                dhsa_layout_get(lay, 0, g, qb, &rg, &n);
                for (int64_t t = 0; t < want; t++) { /* the t-th best of the first 64 keys */
                    int64_t best = -1;
                    for (int64_t j = 0; j < 64; j++) {
                        int taken = 0;
                        for (int64_t u = 0; u < 64; u++)
                            if (u != j && (sc[u] > sc[j] || (sc[u] == sc[j] && u < j))) taken++;
                        if (taken == t) best = j;
                    }
                    int in = 0;
                    for (int64_t i = 0; i < n; i++) in |= best >= rg[2 * i] && best < rg[2 * i + 1];
                    bad += !in;
                    sinks_read += in && (best == 13 || best == 20 || best == 30);
                }
                blocks++;
            }
        T_CHECK(blocks > 10 && bad == 0 && sinks_read == 3 * blocks,
                "picked sinks (%s): %lld of the blocks' best-ranked keys not read, %lld of %lld planted sinks read "
                "over %lld blocks", mi == 3 ? "decode index" : mi == 1 ? "stream" : mi == 2 ? "oracle" : "dhsa",
                (long long)bad, (long long)sinks_read, (long long)(3 * blocks), (long long)blocks);
        dhsa_layout_free(lay);
        dhsa_kv_index_free(ix);
    }
    /* sink_window 0: the first keys, and the last STREAM block reads key 0..3 but not 13, 20, 30 */
    dhsa_router_params rp = dhsa_router_params_for(L, 0.125);
    rp.method = DHSA_ROUTE_STREAM;
    rp.sink_window = 0;
    dhsa_layout *lay = NULL;
    T_CHECK(dhsa_route(g_ctx, &rp, &a, &lay) == DHSA_OK, "route: %s", dhsa_last_error());
    if (lay) {
        const int64_t *rg;
        int64_t n, qb = (L - 1) / rp.q_block, hit = 0;
        dhsa_layout_get(lay, 0, 0, qb, &rg, &n);
        for (int s = 0; s < 3; s++)
            for (int64_t i = 0; i < n; i++) hit += sink_pos[s] >= rg[2 * i] && sink_pos[s] < rg[2 * i + 1];
        T_CHECK(hit == 0 && n >= 1 && rg[0] == 0, "sink_window 0: the first keys are the sinks (%lld planted read)",
                (long long)hit);
        dhsa_layout_free(lay);
    }
    rp.sink_window = 5000;
    T_CHECK(dhsa_route(g_ctx, &rp, &a, &lay) == DHSA_ERR_INVALID_ARG, "sink_window 5000 refused");
    /* more picked sinks than chunks (L 54, fixed chunks of 37, 36 sinks
     * unscaled): the block keeps its ranges */
    {
        float *q2 = q, *k2 = k;
        dhsa_attn_desc a2 = a;
        a2.q = dhsa_tensor_blhd(q2, DHSA_F32, 1, 54, Hq, d);
        a2.k = dhsa_tensor_blhd(k2, DHSA_F32, 1, 54, Hkv, d);
        a2.v = a2.k;
        a2.o = a2.q;
        rp = dhsa_router_params_for(54, 0.9);
        rp.boundary = DHSA_BOUNDARY_FIXED;
        rp.chunk = 37;
        rp.sink_tokens = 36;
        rp.scale_fixed = 0;
        rp.q_block = 16;
        lay = NULL;
        T_CHECK(dhsa_route(g_ctx, &rp, &a2, &lay) == DHSA_OK, "36 sinks, 54 keys: %s", dhsa_last_error());
        int64_t empty = 0;
        for (int64_t g = 0; lay && g < Hkv; g++)
            for (int64_t qb = 0; qb * 16 < 54; qb++) {
                const int64_t *rg;
                int64_t n;
                dhsa_layout_get(lay, 0, g, qb, &rg, &n);
                empty += n == 0;
            }
        T_CHECK(lay && empty == 0, "36 picked sinks over 54 keys: %lld empty blocks", (long long)empty);
        dhsa_layout_free(lay);
    }
    /* many picked sinks, many small chunks: every block still holds its
     * diagonal (the picked sinks' ranges count against max_ranges) */
    for (int mi = 0; mi < 2; mi++) {
        rp = dhsa_router_params_for(L, 0.25);
        rp.sink_tokens = 48;
        rp.min_chunk = 8;
        rp.max_chunk = 8;
        lay = NULL;
        dhsa_kv_index *ix = NULL;
        if (mi) {
            if (dhsa_kv_index_create(g_ctx, &rp, Hkv, d, L, &ix) || dhsa_kv_index_append(ix, &a.k) ||
                dhsa_kv_index_route(g_ctx, ix, &a, &lay))
                T_CHECK(0, "index with 48 picked sinks: %s", dhsa_last_error());
        } else {
            T_CHECK(dhsa_route(g_ctx, &rp, &a, &lay) == DHSA_OK, "48 picked sinks: %s", dhsa_last_error());
        }
        int64_t empty = 0;
        for (int64_t g = 0; lay && g < Hkv; g++)
            for (int64_t qb = 0; qb * rp.q_block < L; qb++) {
                const int64_t *rg;
                int64_t n, last = (qb + 1) * rp.q_block < L ? (qb + 1) * rp.q_block - 1 : L - 1, in = 0;
                dhsa_layout_get(lay, 0, g, qb, &rg, &n);
                for (int64_t i = 0; i < n; i++) in |= last >= rg[2 * i] && last < rg[2 * i + 1];
                empty += !in;
            }
        T_CHECK(lay && empty == 0, "48 picked sinks (%s): %lld blocks without their diagonal",
                mi ? "decode index" : "dhsa_route", (long long)empty);
        dhsa_layout_free(lay);
        dhsa_kv_index_free(ix);
    }
    free(q);
    free(k);
}

/* A block never loses its sink (dhsa.h, scale_fixed): at density 0.0625 a
 * block that may see fewer than 128 keys has a budget under 8, so budget /
 * 8 sinks would be none; it must still read one, for DHSA, block and
 * STREAM routing and for the decode index, with the first key as the sink
 * (sink_window 0) and with picked sinks (the key at 5 scores highest
 * against every query, so it is the one picked). Each non-dense block of
 * the first 128 rows must read its sink key. */
static void test_early_sink(void) {
    const int64_t L = 256, d = 32, Hq = 2, Hkv = 1;
    float *q = malloc((size_t)(L * Hq * d) * sizeof(float)), *k = malloc((size_t)(L * Hkv * d) * sizeof(float));
    rng_t rs = {7};
    for (int64_t i = 0; i < L * Hq * d; i++) q[i] = (float)(rng_unif(&rs) - 0.5) + (i % d == 0 ? 1.0f : 0.0f);
    for (int64_t i = 0; i < L * Hkv * d; i++) k[i] = (float)(rng_unif(&rs) - 0.5);
    k[5 * Hkv * d] = 8.0f;
    dhsa_attn_desc a = dhsa_attn_default_desc();
    a.q = dhsa_tensor_blhd(q, DHSA_F32, 1, L, Hq, d);
    a.k = dhsa_tensor_blhd(k, DHSA_F32, 1, L, Hkv, d);
    a.v = a.k;
    a.o = a.q;
    a.causal = 1;
    int64_t checked = 0;
    for (int variant = 0; variant < 8; variant++) {
        dhsa_router_params rp = dhsa_router_params_for(4096, 0.0625); /* q_block 16, sink 4, local 32 */
        rp.dense_below = 0;
        rp.boundary = variant & 1 ? DHSA_BOUNDARY_FIXED : DHSA_BOUNDARY_SIMILARITY;
        rp.sink_window = variant & 2 ? 64 : 0;
        const int index = (variant & 4) != 0;
        const int64_t sink_key = rp.sink_window ? 5 : 0;
        dhsa_layout *lay = NULL;
        dhsa_kv_index *ix = NULL;
        if (index) {
            T_CHECK(dhsa_kv_index_create(g_ctx, &rp, Hkv, d, L, &ix) == DHSA_OK, "index: %s", dhsa_last_error());
            if (!ix) continue;
            T_CHECK(dhsa_kv_index_append(ix, &a.k) == DHSA_OK, "append: %s", dhsa_last_error());
            T_CHECK(dhsa_kv_index_route(g_ctx, ix, &a, &lay) == DHSA_OK, "index route: %s", dhsa_last_error());
        } else {
            T_CHECK(dhsa_route(g_ctx, &rp, &a, &lay) == DHSA_OK, "route: %s", dhsa_last_error());
        }
        if (!lay) {
            dhsa_kv_index_free(ix);
            continue;
        }
        int64_t missing = 0, blocks = 0;
        for (int64_t qb = 0; qb * rp.q_block < 128; qb++) {
            const int64_t r0 = qb * rp.q_block;
            const int64_t *rg;
            int64_t n;
            dhsa_layout_get(lay, 0, 0, qb, &rg, &n);
            int64_t keys = 0;
            int has = 0;
            for (int64_t i = 0; i < n; i++) {
                keys += rg[2 * i + 1] - rg[2 * i];
                has |= rg[2 * i] <= sink_key && sink_key < rg[2 * i + 1];
            }
            if (keys >= r0 + rp.q_block || r0 - rp.local_tokens <= sink_key) continue; /* dense, or local reaches it */
            blocks++;
            missing += !has;
        }
        T_CHECK(blocks >= 4 && missing == 0, "variant %d (%s, %s sinks, %s): %lld of %lld early blocks without their sink",
                variant, variant & 1 ? "fixed" : "similarity", rp.sink_window ? "picked" : "first",
                index ? "decode index" : "dhsa_route", (long long)missing, (long long)blocks);
        checked += blocks;
        dhsa_layout_free(lay);
        dhsa_kv_index_free(ix);
    }
    T_CHECK(checked > 0, "no early block checked");
    free(q);
    free(k);
}

int main(void) {
    if (!open_ctx("test_route_params")) return t_report("test_route_params");
    test_route_params();
    test_route_sizes_budget();
    test_picked_sinks();
    test_early_sink();
    /* Counted once, in test_route.c; reported here only when the routes
     * of this part break it. */
    if (g_budget_strict.bad)
        VIOL_REPORT(g_budget_strict, "budget met (selected >= budget) in every routed non-dense block", "%s",
                    "test_route_params' routes");
    dhsa_ctx_free(g_ctx);
    return t_report("test_route_params");
}
