/* test_kv_index_state.c: the index's errors, memory and truncation,
 * parts 5, 6 and 7 of kv_index_t.h: failing calls leave the index
 * unchanged with a fresh sentence; the index lives in the ctx's
 * statistics and is given back; an index cut back to n keys equals, field
 * for field, one fed n keys, and appending again equals one fed all.
 *
 * Run: make build/tests/test_kv_index_state && build/tests/test_kv_index_state
 * (or `make test`). Ends with "test_kv_index_state: P passed, F failed, S skipped".
 */

#include "kv_index_t.h"

/* ------------------------------------------------------------------------ */
/* 5. Errors */

#define EXPECT_STATUS(call, want, ...)                                                                    \
    do {                                                                                                  \
        plant_error();                                                                                    \
        dhsa_status st_ = (call);                                                                         \
        int fr_ = fresh_error();                                                                          \
        T_CHECK(st_ == (want) && fr_, "%s: got %s (\"%s\"), want %s with a fresh sentence",                \
                (snprintf(g_what, sizeof g_what, __VA_ARGS__), g_what), dhsa_status_str(st_), dhsa_last_error(), \
                dhsa_status_str(want));                                                                   \
    } while (0)
static char g_what[200];

static void test_errors(void) {
    dhsa_router_params rp = dhsa_router_default_params();
    dhsa_kv_index *ix = (dhsa_kv_index *)&rp; /* must be overwritten with NULL */

    /* create */
    EXPECT_STATUS(dhsa_kv_index_create(NULL, &rp, 2, 16, 100, &ix), DHSA_ERR_INVALID_ARG, "create with NULL ctx");
    EXPECT_STATUS(dhsa_kv_index_create(g_ctx, &rp, 2, 16, 100, NULL), DHSA_ERR_INVALID_ARG, "create with NULL out");
    ix = (dhsa_kv_index *)&rp;
    EXPECT_STATUS(dhsa_kv_index_create(g_ctx, NULL, 2, 16, 100, &ix), DHSA_ERR_INVALID_ARG, "create with NULL params");
    T_CHECK(ix == NULL, "create with NULL params leaves *out set");
    const int64_t sizes[][3] = {{0, 16, 100}, {-1, 16, 100}, {2, 0, 100}, {2, -3, 100}, {2, 16, 0},
                                {2, 16, -7},  {65537, 16, 100}, {2, 65537, 100}, {2, 16, (int64_t)1 << 40}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        ix = (dhsa_kv_index *)&rp;
        EXPECT_STATUS(dhsa_kv_index_create(g_ctx, &rp, sizes[i][0], sizes[i][1], sizes[i][2], &ix),
                      DHSA_ERR_INVALID_ARG, "create Hkv=%lld d=%lld capacity=%lld", (long long)sizes[i][0],
                      (long long)sizes[i][1], (long long)sizes[i][2]);
        T_CHECK(ix == NULL, "create Hkv=%lld d=%lld capacity=%lld: *out not NULL", (long long)sizes[i][0],
                (long long)sizes[i][1], (long long)sizes[i][2]);
    }
    struct {
        const char *name;
        dhsa_status want;
        dhsa_router_params p;
    } bad[14];
    int nb = 0;
    for (int i = 0; i < 14; i++) bad[i].p = dhsa_router_default_params();
    /* LEARNED: without a predictor the params are invalid; a predictor
     * for another width of keys (here 2 x 16 + 1) is refused */
    dhsa_predictor *pred = NULL;
    T_CHECK(dhsa_predictor_create_random(2 * 16 + 1, 4, 8, 1, &pred) == DHSA_OK && pred,
            "predictor_create_random: %s", dhsa_last_error());
    bad[nb].name = "LEARNED boundary without a predictor", bad[nb].want = DHSA_ERR_INVALID_ARG;
    bad[nb++].p.boundary = DHSA_BOUNDARY_LEARNED;
    bad[nb].name = "LEARNED boundary with a predictor of width 33 for keys of 2 x 16";
    bad[nb].want = DHSA_ERR_SHAPE;
    bad[nb].p.predictor = pred;
    bad[nb++].p.boundary = DHSA_BOUNDARY_LEARNED;
    bad[nb].name = "STREAM method", bad[nb].want = DHSA_ERR_UNSUPPORTED;
    bad[nb++].p.method = DHSA_ROUTE_STREAM;
    bad[nb].name = "ORACLE method", bad[nb].want = DHSA_ERR_UNSUPPORTED;
    bad[nb++].p.method = DHSA_ROUTE_ORACLE;
    bad[nb].name = "boundary 7", bad[nb].want = DHSA_ERR_INVALID_ARG;
    bad[nb++].p.boundary = (dhsa_boundary)7;
    bad[nb].name = "method 9", bad[nb].want = DHSA_ERR_INVALID_ARG;
    bad[nb++].p.method = (dhsa_route_method)9;
    bad[nb].name = "min_chunk 0", bad[nb].want = DHSA_ERR_INVALID_ARG;
    bad[nb++].p.min_chunk = 0;
    bad[nb].name = "max_chunk < min_chunk", bad[nb].want = DHSA_ERR_INVALID_ARG;
    bad[nb++].p.max_chunk = 8;
    bad[nb].name = "q_block 0", bad[nb].want = DHSA_ERR_INVALID_ARG;
    bad[nb++].p.q_block = 0;
    bad[nb].name = "chunk 0 (FIXED)", bad[nb].want = DHSA_ERR_INVALID_ARG;
    bad[nb].p.boundary = DHSA_BOUNDARY_FIXED;
    bad[nb++].p.chunk = 0;
    bad[nb].name = "density 0 without a budget", bad[nb].want = DHSA_ERR_INVALID_ARG;
    bad[nb++].p.density = 0;
    bad[nb].name = "threshold NaN", bad[nb].want = DHSA_ERR_INVALID_ARG;
    bad[nb++].p.threshold = NAN;
    bad[nb].name = "sim_window 0", bad[nb].want = DHSA_ERR_INVALID_ARG;
    bad[nb++].p.sim_window = 0;
    for (int i = 0; i < nb; i++) {
        ix = (dhsa_kv_index *)&rp;
        EXPECT_STATUS(dhsa_kv_index_create(g_ctx, &bad[i].p, 2, 16, 100, &ix), bad[i].want, "create with %s",
                      bad[i].name);
        T_CHECK(ix == NULL, "create with %s: *out not NULL", bad[i].name);
        if (ix && ix != (dhsa_kv_index *)&rp) dhsa_kv_index_free(ix);
    }
    dhsa_predictor_free(pred);
    /* causal_boundaries = 0 is not an error: the index is always causal */
    dhsa_router_params nc = rp;
    nc.causal_boundaries = 0;
    ix = NULL;
    T_CHECK(dhsa_kv_index_create(g_ctx, &nc, 2, 16, 100, &ix) == DHSA_OK && ix,
            "create with causal_boundaries = 0 (the index is always causal): %s", dhsa_last_error());
    dhsa_kv_index_free(ix);

    /* append */
    work W;
    if (!work_synth(&W, 3000, 4, 2, 32, 55)) return;
    ix = ix_new(g_ctx, &rp, 2, 32, 2500, "errors");
    dhsa_kv_index *clean = ix_new(g_ctx, &rp, 2, 32, 2500, "errors");
    if (!ix || !clean) {
        dhsa_kv_index_free(ix);
        dhsa_kv_index_free(clean);
        work_free(&W);
        return;
    }
    T_CHECK(ix_append(ix, &W, 0, 2100) == DHSA_OK, "errors: append 2100 keys: %s", dhsa_last_error());
    const int64_t len0 = dhsa_kv_index_length(ix);
    const int64_t *s0;
    const int64_t ch0 = dhsa_kv_index_chunks(ix, &s0);
    int64_t *starts0 = xcalloc((size_t)ch0 + 1, sizeof(int64_t));
    memcpy(starts0, s0, (size_t)ch0 * sizeof(int64_t));
#define UNCHANGED(what)                                                                                      \
    do {                                                                                                     \
        const int64_t *s_;                                                                                   \
        int64_t c_ = dhsa_kv_index_chunks(ix, &s_);                                                          \
        T_CHECK(dhsa_kv_index_length(ix) == len0 && c_ == ch0 && memcmp(s_, starts0, (size_t)ch0 * 8) == 0, \
                "%s changed the index: length %lld (was %lld), %lld chunks (was %lld)", what,                \
                (long long)dhsa_kv_index_length(ix), (long long)len0, (long long)c_, (long long)ch0);        \
    } while (0)
    dhsa_tensor k = rows_view(W.k, 2, W.L, 32, 2100, 10);
    dhsa_tensor kb = k;
    kb.shape[1] = 1;
    EXPECT_STATUS(dhsa_kv_index_append(ix, &kb), DHSA_ERR_SHAPE, "append with Hkv 1 to an index of Hkv 2");
    UNCHANGED("append with the wrong Hkv");
    kb = k;
    kb.shape[3] = 31;
    EXPECT_STATUS(dhsa_kv_index_append(ix, &kb), DHSA_ERR_SHAPE, "append with d 31 to an index of d 32");
    UNCHANGED("append with the wrong d");
    kb = k;
    kb.shape[0] = 2;
    EXPECT_STATUS(dhsa_kv_index_append(ix, &kb), DHSA_ERR_SHAPE, "append with B 2");
    UNCHANGED("append with B 2");
    kb = k;
    kb.data = NULL;
    EXPECT_STATUS(dhsa_kv_index_append(ix, &kb), DHSA_ERR_INVALID_ARG, "append with NULL data");
    EXPECT_STATUS(dhsa_kv_index_append(ix, NULL), DHSA_ERR_INVALID_ARG, "append with NULL keys");
    EXPECT_STATUS(dhsa_kv_index_append(NULL, &k), DHSA_ERR_INVALID_ARG, "append to a NULL index");
    kb = k;
    kb.type = (dhsa_type)9;
    EXPECT_STATUS(dhsa_kv_index_append(ix, &kb), DHSA_ERR_INVALID_ARG, "append with type 9");
    UNCHANGED("append with an unknown type");
    kb = rows_view(W.k, 2, W.L, 32, 2100, 401);
    EXPECT_STATUS(dhsa_kv_index_append(ix, &kb), DHSA_ERR_TOO_LARGE, "append 401 keys to 2100 of capacity 2500");
    UNCHANGED("append beyond capacity");
    kb = rows_view(W.k, 2, W.L, 32, 2100, 0);
    T_CHECK(dhsa_kv_index_append(ix, &kb) == DHSA_OK, "append of 0 keys: %s", dhsa_last_error());
    UNCHANGED("append of 0 keys");

    /* route */
    dhsa_layout *lay = (dhsa_layout *)&rp;
    dhsa_attn_desc a = rows_desc(&W, 2036, 64, 2100, 0);
    a.causal = 0;
    EXPECT_STATUS(dhsa_kv_index_route(g_ctx, ix, &a, &lay), DHSA_ERR_UNSUPPORTED, "route non-causal");
    T_CHECK(lay == NULL, "route non-causal: *out not NULL");
    a = rows_desc(&W, 2036, 64, 2099, 0);
    lay = (dhsa_layout *)&rp;
    EXPECT_STATUS(dhsa_kv_index_route(g_ctx, ix, &a, &lay), DHSA_ERR_SHAPE, "route with k of 2099 keys, index 2100");
    T_CHECK(lay == NULL, "route with a short k: *out not NULL");
    a = rows_desc(&W, 2036, 64, 2101, 0);
    EXPECT_STATUS(dhsa_kv_index_route(g_ctx, ix, &a, &lay), DHSA_ERR_SHAPE, "route with k of 2101 keys, index 2100");
    a = rows_desc(&W, 2036, 64, 2100, 0);
    a.k.shape[1] = 1, a.v.shape[1] = 1;
    EXPECT_STATUS(dhsa_kv_index_route(g_ctx, ix, &a, &lay), DHSA_ERR_SHAPE, "route with k of 1 KV head, index 2");
    a = rows_desc(&W, 2036, 64, 2100, 0);
    a.q.shape[3] = 16, a.k.shape[3] = 16, a.v.shape[3] = 16;
    EXPECT_STATUS(dhsa_kv_index_route(g_ctx, ix, &a, &lay), DHSA_ERR_SHAPE, "route with d 16, index d 32");
    a = rows_desc(&W, 2036, 64, 2100, 0);
    EXPECT_STATUS(dhsa_kv_index_route(NULL, ix, &a, &lay), DHSA_ERR_INVALID_ARG, "route with NULL ctx");
    EXPECT_STATUS(dhsa_kv_index_route(g_ctx, NULL, &a, &lay), DHSA_ERR_INVALID_ARG, "route with NULL index");
    EXPECT_STATUS(dhsa_kv_index_route(g_ctx, ix, NULL, &lay), DHSA_ERR_INVALID_ARG, "route with NULL desc");
    EXPECT_STATUS(dhsa_kv_index_route(g_ctx, ix, &a, NULL), DHSA_ERR_INVALID_ARG, "route with NULL out");
    UNCHANGED("failed routes");

    /* the index after its failures continues exactly like a clean one */
    T_CHECK(ix_append(ix, &W, 2100, 400) == DHSA_OK, "append up to capacity after failures: %s", dhsa_last_error());
    T_CHECK(dhsa_kv_index_length(ix) == 2500, "length %lld after filling, want 2500",
            (long long)dhsa_kv_index_length(ix));
    kb = rows_view(W.k, 2, W.L, 32, 2500, 1);
    EXPECT_STATUS(dhsa_kv_index_append(ix, &kb), DHSA_ERR_TOO_LARGE, "append 1 key to a full index");
    T_CHECK(dhsa_kv_index_length(ix) == 2500, "a full index grew to %lld", (long long)dhsa_kv_index_length(ix));
    ix_append(clean, &W, 0, 2500);
    T_CHECK(same_starts(ix, clean), "an index that saw failed calls has other chunk starts than a clean one");
    {
        dhsa_layout *x = ix_route(g_ctx, ix, &W, 0, 2500, 2500, 0, "errors"),
                    *y = ix_route(g_ctx, clean, &W, 0, 2500, 2500, 0, "errors");
        if (x && y)
            T_CHECK(blocks_differ(x, 0, y, 0, (2500 + 63) / 64, 2, "after failures vs clean", 1) == 0,
                    "an index that saw failed calls routes differently from a clean one");
        dhsa_layout_free(x);
        dhsa_layout_free(y);
    }
    free(starts0);
#undef UNCHANGED

    /* memory budget: too small for the index; then, with the index in the
     * ctx, room for a decode layout but not for a 2500-row one */
    dhsa_ctx *small = ctx_new(1, 64 * 1024);
    if (small) {
        dhsa_mem_stats m0 = dhsa_ctx_mem_stats(small);
        dhsa_kv_index *big = (dhsa_kv_index *)&rp;
        EXPECT_STATUS(dhsa_kv_index_create(small, &rp, 2, 128, 1 << 20, &big), DHSA_ERR_MEMORY_BUDGET,
                      "create an index of capacity 2^20 in a ctx of 64 KiB");
        T_CHECK(big == NULL, "create over budget: *out not NULL");
        dhsa_mem_stats m1 = dhsa_ctx_mem_stats(small);
        T_CHECK(m1.in_use == m0.in_use, "create over budget left %zu bytes in use (was %zu)", m1.in_use, m0.in_use);
        dhsa_ctx_set_budget(small, 0);
        dhsa_kv_index *fits = ix_new(small, &rp, 2, 32, 2500, "budget");
        size_t one_row = 0, all_rows = 0;
        if (fits && ix_append(fits, &W, 0, 2500) == DHSA_OK) {
            /* a decode layout has at most chunks + 4 ranges per block (sinks,
             * local, every chunk, spare); a 2500-row one at least 2 */
            dhsa_layout_size(1, 2, 1, 2500, 64, dhsa_kv_index_chunks(fits, NULL) + 4, &one_row);
            dhsa_layout_size(1, 2, 2500, 2500, 64, 2, &all_rows);
        }
        T_CHECK(all_rows > one_row, "budget: a 2500-row layout (%zu) should need more than a 1-row one (%zu)",
                all_rows, one_row);
        if (fits && all_rows > one_row &&
            dhsa_ctx_set_budget(small, dhsa_ctx_mem_stats(small).in_use + one_row) == DHSA_OK) {
            a = rows_desc(&W, 0, 2500, 2500, 0);
            lay = (dhsa_layout *)&rp;
            EXPECT_STATUS(dhsa_kv_index_route(small, fits, &a, &lay), DHSA_ERR_MEMORY_BUDGET,
                          "route 2500 rows with room for %zu bytes", one_row);
            T_CHECK(lay == NULL, "route over budget: *out not NULL");
            a = rows_desc(&W, 2499, 1, 2500, 0);
            lay = NULL;
            T_CHECK(dhsa_kv_index_route(small, fits, &a, &lay) == DHSA_OK && lay,
                    "a decode route fits in %zu bytes: %s", one_row, dhsa_last_error());
            dhsa_layout_free(lay);
        } else {
            T_CHECK(0, "budget: setting up the index: %s", dhsa_last_error());
        }
        dhsa_kv_index_free(fits);
        dhsa_mem_stats m2 = dhsa_ctx_mem_stats(small);
        T_CHECK(m2.in_use == m0.in_use, "budget ctx: %zu bytes in use at the end (was %zu)", m2.in_use, m0.in_use);
        dhsa_ctx_free(small);
    }
    dhsa_kv_index_free(ix);
    dhsa_kv_index_free(clean);
    work_free(&W);
}

/* ------------------------------------------------------------------------ */
/* 6. Memory */

static void test_memory(void) {
    dhsa_ctx *ctx = ctx_new(1, 0);
    if (!ctx) return;
    work W;
    if (!work_synth(&W, 8192, 8, 2, 128, 66)) {
        dhsa_ctx_free(ctx);
        return;
    }
    dhsa_router_params rp = dhsa_router_default_params();
    const int64_t Hkv = 2, d = 128;
    size_t delta[2] = {0, 0};
    const int64_t caps[2] = {8192, 65536};
    for (int ci = 0; ci < 2; ci++) {
        const int64_t cap = caps[ci];
        char label[80];
        snprintf(label, sizeof label, "memory capacity %lld", (long long)cap);
        dhsa_mem_stats m0 = dhsa_ctx_mem_stats(ctx);
        dhsa_kv_index *ix = ix_new(ctx, &rp, Hkv, d, cap, label);
        if (!ix) continue;
        dhsa_mem_stats m1 = dhsa_ctx_mem_stats(ctx);
        delta[ci] = m1.in_use - m0.in_use;
        /* the pooled keys of capacity / min_chunk chunks must fit (the
         * index allocates nothing while appending), and the index must not
         * hold the keys themselves: it lives beside the cache */
        size_t pooled = (size_t)(cap / rp.min_chunk) * (size_t)(Hkv * d) * sizeof(float);
        size_t keys = (size_t)cap * (size_t)(Hkv * d) * sizeof(float);
        T_CHECK(m1.in_use > m0.in_use && delta[ci] >= pooled && delta[ci] <= keys / 4 && m1.n_allocs > m0.n_allocs &&
                    m1.peak >= m1.in_use,
                "%s: create took %zu bytes in the ctx (want >= %zu for the pooled chunks, <= %zu = a quarter of "
                "the keys), allocations %llu -> %llu",
                label, delta[ci], pooled, keys / 4, (unsigned long long)m0.n_allocs,
                (unsigned long long)m1.n_allocs);
        T_CHECK(ix_append(ix, &W, 0, W.L) == DHSA_OK, "%s: append: %s", label, dhsa_last_error());
        dhsa_mem_stats m2 = dhsa_ctx_mem_stats(ctx);
        T_CHECK(m2.in_use == m1.in_use && m2.n_allocs == m1.n_allocs,
                "%s: appending %lld keys changed the ctx: in use %zu -> %zu, allocations %llu -> %llu", label,
                (long long)W.L, m1.in_use, m2.in_use, (unsigned long long)m1.n_allocs,
                (unsigned long long)m2.n_allocs);
        /* a routed layout is counted while held, exactly its size */
        dhsa_layout *lay = ix_route(ctx, ix, &W, 0, W.L, W.L, 0, label);
        if (lay) {
            dhsa_mem_stats m3 = dhsa_ctx_mem_stats(ctx);
            dhsa_layout_stats ls;
            dhsa_layout_get_stats(lay, &ls);
            size_t lb = 0;
            dhsa_layout_size(1, Hkv, W.L, W.L, rp.q_block, ls.max_ranges, &lb);
            T_CHECK(m3.in_use - m2.in_use == lb, "%s: a layout holds %zu bytes of the ctx, dhsa_layout_size says %zu",
                    label, m3.in_use - m2.in_use, lb);
            dhsa_layout_free(lay);
            dhsa_mem_stats m4 = dhsa_ctx_mem_stats(ctx);
            T_CHECK(m4.in_use == m2.in_use, "%s: layout_free left %zu bytes (want %zu)", label, m4.in_use, m2.in_use);
        }
        dhsa_kv_index_free(ix);
        dhsa_mem_stats m5 = dhsa_ctx_mem_stats(ctx);
        T_CHECK(m5.in_use == m0.in_use, "%s: after kv_index_free %zu bytes in use, want %zu", label, m5.in_use,
                m0.in_use);
        dhsa_kv_index_free(NULL); /* allowed */
    }
    /* growth with capacity: at least the extra pooled chunks */
    size_t extra = (size_t)((caps[1] - caps[0]) / rp.min_chunk) * (size_t)(Hkv * d) * sizeof(float);
    T_CHECK(delta[1] >= delta[0] + extra, "memory: capacity %lld takes %zu bytes, %lld takes %zu (want >= %zu more)",
            (long long)caps[0], delta[0], (long long)caps[1], delta[1], extra);
    work_free(&W);
    dhsa_ctx_free(ctx);
}

/* ------------------------------------------------------------------------ */

/* ------------------------------------------------------------------------ */
/* 7. Truncation: cut back to n keys = fed n keys */

/* A fresh index fed keys [0, n) of W in random ubatches of 1 to 97 keys. */
static dhsa_kv_index *ix_fed(const dhsa_router_params *rp, const work *W, int64_t n, rng_t *r, const char *label) {
    dhsa_kv_index *ix = ix_new(g_ctx, rp, W->Hkv, W->d, W->L, label);
    for (int64_t u0 = 0; ix && u0 < n;) {
        int64_t m = 1 + rng_range(r, 97);
        if (m > n - u0) m = n - u0;
        if (ix_append(ix, W, u0, m) != DHSA_OK) {
            T_CHECK(0, "%s: append %lld+%lld: %s", label, (long long)u0, (long long)m, dhsa_last_error());
            dhsa_kv_index_free(ix);
            return NULL;
        }
        u0 += m;
    }
    return ix;
}

/* Layouts of x and y for query rows [r0, L) and for the last row alone
 * (a decode step): how many blocks differ. */
static int64_t routes_differ(const dhsa_kv_index *x, const dhsa_kv_index *y, const work *W, int64_t r0,
                             const char *label) {
    int64_t bad = 0;
    const int64_t rows[2][2] = {{r0, W->L - r0}, {W->L - 1, 1}};
    for (int i = 0; i < 2; i++) {
        if (rows[i][1] < 1) continue;
        dhsa_layout *lx = ix_route(g_ctx, x, W, rows[i][0], rows[i][1], W->L, 0, label);
        dhsa_layout *ly = ix_route(g_ctx, y, W, rows[i][0], rows[i][1], W->L, 0, label);
        if (!lx || !ly)
            bad++;
        else
            bad += blocks_differ(lx, 0, ly, 0, (rows[i][1] + 15) / 16, W->Hkv, label, bad == 0);
        dhsa_layout_free(lx);
        dhsa_layout_free(ly);
    }
    return bad;
}

static void truncate_case(dhsa_boundary bd, dhsa_chunk_score sm, uint64_t seed) {
    const int64_t L = 900, Hq = 4, Hkv = 2, d = 32;
    char label[160];
    snprintf(label, sizeof label, "truncate %s score %d seed %llu",
             bd == DHSA_BOUNDARY_FIXED ? "fixed" : bd == DHSA_BOUNDARY_LEARNED ? "learned" : "similarity", (int)sm,
             (unsigned long long)seed);
    work W;
    if (!work_synth(&W, L, Hq, Hkv, d, seed)) return;
    dhsa_router_params rp = dhsa_router_default_params();
    rp.boundary = bd;
    rp.score_mode = sm;
    rp.chunk = 24, rp.min_chunk = 12, rp.max_chunk = 60, rp.nms_window = 5, rp.sim_window = 7;
    rp.q_block = 16, rp.dense_below = 0, rp.budget_tokens = 96;
    dhsa_predictor *pred = NULL;
    if (bd == DHSA_BOUNDARY_LEARNED) {
        float *p = xcalloc((size_t)L, sizeof(float));
        dhsa_tensor kt = dhsa_tensor_bhld(W.k, DHSA_F32, 1, Hkv, L, d);
        T_CHECK(dhsa_predictor_create_random(Hkv * d, 4, 24, seed, &pred) == DHSA_OK &&
                    dhsa_predictor_score(g_ctx, pred, &kt, 0, p) == DHSA_OK,
                "%s: predictor: %s", label, dhsa_last_error());
        rp.predictor = pred;
        rp.learned_threshold = quantile(p, L, 0.7);
        free(p);
    }
    rng_t r = {seed * 131 + 17};
    const dhsa_tensor K = dhsa_tensor_bhld(W.k, DHSA_F32, 1, Hkv, L, d);
    dhsa_kv_index *full = ix_fed(&rp, &W, L, &r, label);
    if (!full) goto out;
    /* the cut points: edges of the ring, of chunks and of their decisions */
    int64_t cuts[64], nc = 0;
    const int64_t *st0;
    const int64_t chunks = dhsa_kv_index_chunks(full, &st0);
    T_CHECK(chunks >= 8, "%s: only %lld chunks closed", label, (long long)chunks);
    const int64_t fixed_pts[] = {0, 1, 2, 7, 8, 9, 13, 14, L - 1, L};
    for (size_t i = 0; i < sizeof fixed_pts / sizeof *fixed_pts; i++) cuts[nc++] = fixed_pts[i];
    for (int64_t c = 1; c < chunks && c < 9 && nc + 6 < 64; c += 2) {
        /* chunk c starts at st0[c] and was decided nms_window (+ delay) keys later */
        for (int64_t dd = -1; dd <= 1; dd++) cuts[nc++] = st0[c] + dd;
        int64_t late = st0[c] + rp.nms_window + (bd == DHSA_BOUNDARY_LEARNED ? 3 : 0);
        cuts[nc++] = late;
        cuts[nc++] = late + 1;
    }
    for (int i = 0; i < 6 && nc < 64; i++) cuts[nc++] = rng_range(&r, L + 1);
    int64_t bad_cut = 0, bad_again = 0, bad_route = 0, bad_second = 0;
    char why[200], first[320] = "";
    for (int64_t i = 0; i < nc; i++) {
        const int64_t n = cuts[i];
        if (n < 0 || n > L) continue;
        dhsa_kv_index *a = ix_fed(&rp, &W, L, &r, label), *f = ix_fed(&rp, &W, n, &r, label);
        if (!a || !f) {
            bad_cut++;
            dhsa_kv_index_free(a);
            dhsa_kv_index_free(f);
            continue;
        }
        dhsa_status st = dhsa_kv_index_truncate(a, &K, n);
        if (st || dhsa__kv_index_diff(a, f, why, sizeof why)) {
            if (!bad_cut++ && !first[0])
                snprintf(first, sizeof first, "cut to %lld: %s", (long long)n, st ? dhsa_last_error() : why);
        }
        /* the same keys again, in other ubatches */
        for (int64_t u0 = n; u0 < L;) {
            int64_t m = 1 + rng_range(&r, 61);
            if (m > L - u0) m = L - u0;
            if (ix_append(a, &W, u0, m) != DHSA_OK) break;
            u0 += m;
        }
        if (dhsa__kv_index_diff(a, full, why, sizeof why) && !bad_again++ && !first[0])
            snprintf(first, sizeof first, "cut to %lld, appended to %lld: %s", (long long)n, (long long)L, why);
        bad_route += routes_differ(a, full, &W, n < L ? n : L - 1, label) != 0;
        /* a second cut, from a state truncation made */
        const int64_t n2 = n / 2;
        dhsa_kv_index *f2 = ix_fed(&rp, &W, n2, &r, label);
        if (!f2 || dhsa_kv_index_truncate(a, &K, n2) || dhsa__kv_index_diff(a, f2, why, sizeof why)) {
            if (!bad_second++ && !first[0]) snprintf(first, sizeof first, "second cut to %lld: %s", (long long)n2, why);
        }
        dhsa_kv_index_free(f2);
        dhsa_kv_index_free(a);
        dhsa_kv_index_free(f);
    }
    T_CHECK(bad_cut == 0, "%s: %lld of %lld cuts differ from a fresh index; first %s", label, (long long)bad_cut,
            (long long)nc, first);
    T_CHECK(bad_again == 0, "%s: %lld of %lld re-appended indexes differ from the full one; %s", label,
            (long long)bad_again, (long long)nc, first);
    T_CHECK(bad_route == 0, "%s: %lld of %lld re-appended indexes route otherwise than the full one", label,
            (long long)bad_route, (long long)nc);
    T_CHECK(bad_second == 0, "%s: %lld of %lld second cuts differ; %s", label, (long long)bad_second, (long long)nc,
            first);
    /* the comparator sees a difference of one key, and one bit */
    {
        dhsa_kv_index *x = ix_fed(&rp, &W, 500, &r, label), *y = ix_fed(&rp, &W, 501, &r, label);
        T_CHECK(x && y && dhsa__kv_index_diff(x, y, why, sizeof why), "%s: 500 vs 501 keys not told apart", label);
        dhsa_kv_index_free(x);
        dhsa_kv_index_free(y);
        float saved = W.k[(1 * L + 499) * d + 3];
        x = ix_fed(&rp, &W, 500, &r, label);
        W.k[(1 * L + 499) * d + 3] = nextafterf(saved, INFINITY);
        y = ix_fed(&rp, &W, 500, &r, label);
        W.k[(1 * L + 499) * d + 3] = saved;
        T_CHECK(x && y && dhsa__kv_index_diff(x, y, why, sizeof why), "%s: a key one ulp apart not told apart",
                label);
        dhsa_kv_index_free(x);
        dhsa_kv_index_free(y);
    }
    /* bad arguments: refused, the index unchanged */
    {
        dhsa_kv_index *ref = ix_fed(&rp, &W, L, &r, label);
        dhsa_tensor shortk = rows_view(W.k, Hkv, L, d, 0, 100);
        dhsa_tensor badh = dhsa_tensor_bhld(W.k, DHSA_F32, 1, Hkv + 1, L / 4, d);
        plant_error();
        dhsa_status e1 = dhsa_kv_index_truncate(full, &K, L + 1);
        int f1 = fresh_error();
        plant_error();
        dhsa_status e2 = dhsa_kv_index_truncate(full, &shortk, 200);
        int f2 = fresh_error();
        plant_error();
        dhsa_status e3 = dhsa_kv_index_truncate(full, &badh, 10);
        int f3 = fresh_error();
        dhsa_status e4 = dhsa_kv_index_truncate(full, NULL, 10), e5 = dhsa_kv_index_truncate(NULL, &K, 0);
        dhsa_status e6 = dhsa_kv_index_truncate(full, &K, -1);
        T_CHECK(e1 == DHSA_ERR_INVALID_ARG && e2 == DHSA_ERR_SHAPE && e3 == DHSA_ERR_SHAPE &&
                    e4 == DHSA_ERR_INVALID_ARG && e5 == DHSA_ERR_INVALID_ARG && e6 == DHSA_ERR_INVALID_ARG &&
                    f1 && f2 && f3,
                "%s: bad truncations: %s %s %s %s %s %s, fresh sentences %d %d %d", label, dhsa_status_str(e1),
                dhsa_status_str(e2), dhsa_status_str(e3), dhsa_status_str(e4), dhsa_status_str(e5),
                dhsa_status_str(e6), f1, f2, f3);
        T_CHECK(ref && dhsa__kv_index_diff(full, ref, why, sizeof why) == 0 &&
                    dhsa_kv_index_truncate(full, &K, L) == DHSA_OK && dhsa__kv_index_diff(full, ref, why, sizeof why) == 0,
                "%s: a refused truncation (or one to the length) changed the index: %s", label, why);
        dhsa_kv_index_free(ref);
    }
    dhsa_kv_index_free(full);
out:
    dhsa_predictor_free(pred);
    work_free(&W);
}

static void test_truncate(void) {
    const dhsa_chunk_score modes[] = {DHSA_SCORE_MOMENTS, DHSA_SCORE_POOLED, DHSA_SCORE_HEADS, DHSA_SCORE_BOUND,
                                      DHSA_SCORE_ROWS};
    for (int m = 0; m < 5; m++) {
        truncate_case(DHSA_BOUNDARY_SIMILARITY, modes[m], 40 + (uint64_t)m);
        truncate_case(DHSA_BOUNDARY_FIXED, modes[m], 50 + (uint64_t)m);
    }
    truncate_case(DHSA_BOUNDARY_LEARNED, DHSA_SCORE_MOMENTS, 60);
    truncate_case(DHSA_BOUNDARY_LEARNED, DHSA_SCORE_BOUND, 61);
}

int main(void) {
    if (!open_ctx()) return t_report("test_kv_index_state");

    test_errors();
    test_memory();
    test_truncate();

    dhsa_ctx_free(g_ctx);
    return t_report("test_kv_index_state");
}
