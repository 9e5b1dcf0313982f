/* test_route_layout.c: sparse layouts (include/dhsa.h "Sparse layouts"),
 * the sparse kernel (the `layout` field of dhsa_attn_desc) and merging two
 * partial results by LSE (DESIGN.md section 4). Oracles (route_t.h):
 *   - layouts: a bitmap per (batch, KV head, query block) kept by the test;
 *     dhsa_layout_selects and the stats are checked against it key by key;
 *   - the sparse kernel: a naive attention in double precision over the
 *     canonical inputs, keys outside the block's selection at -inf; TILED
 *     and REFERENCE with the same layout are compared with it (|got - ref|
 *     <= atol + rtol |ref| per element, and NMSE), and a failure prints the
 *     case and the worst element;
 *   - merging by LSE: two disjoint layouts merged in double against one pass.
 * Every comparison is shown once to fail on deliberately wrong data. *
 * Run: make build/tests/test_route_layout && build/tests/test_route_layout
 * (or `make test`). Ends with "test_route_layout: P passed, F failed, S skipped".
 */

#include "route_t.h"

/* ======================================================================== */
/* 1. Layouts                                                               */

/* Exact size: create allocates exactly dhsa_layout_size() bytes from the ctx
 * (one allocation), free gives them back, and a budget one byte short
 * refuses the create. */
static void test_layout_size_create(void) {
    static const int64_t shapes[][6] = {/* B, Hkv, Lq, Lk, q_block, max_ranges */
                                        {1, 1, 1, 1, 1, 1},       {2, 3, 100, 77, 16, 5},
                                        {1, 2, 4096, 4096, 64, 40}, {3, 1, 37, 500, 100, 9},
                                        {1, 1, 5, 0, 64, 1}};
    dhsa_ctx *ctx = ctx_new(2, 0);
    if (!ctx) return;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t *x = shapes[s];
        size_t bytes = 0;
        dhsa_status st = dhsa_layout_size(x[0], x[1], x[2], x[3], x[4], x[5], &bytes);
        T_CHECK(st == DHSA_OK, "layout_size(shape %zu): %s %s", s, dhsa_status_str(st), dhsa_last_error());
        int64_t nb = (x[2] + x[4] - 1) / x[4];
        /* it must at least hold every block's max_ranges pairs */
        T_CHECK(bytes >= (size_t)(x[0] * x[1] * nb * x[5] * 16),
                "layout_size(shape %zu) = %zu cannot hold %lld blocks x %lld ranges", s, bytes,
                (long long)(x[0] * x[1] * nb), (long long)x[5]);
        dhsa_mem_stats m0 = dhsa_ctx_mem_stats(ctx);
        dhsa_layout *lay = NULL;
        st = dhsa_layout_create(ctx, x[0], x[1], x[2], x[3], x[4], x[5], &lay);
        T_CHECK(st == DHSA_OK && lay, "layout_create(shape %zu): %s %s", s, dhsa_status_str(st),
                dhsa_last_error());
        dhsa_mem_stats m1 = dhsa_ctx_mem_stats(ctx);
        T_CHECK(m1.in_use - m0.in_use == bytes && m1.n_allocs == m0.n_allocs + 1,
                "layout_create(shape %zu): in_use grew by %zu in %llu allocations, layout_size says %zu "
                "in 1", s, m1.in_use - m0.in_use, (unsigned long long)(m1.n_allocs - m0.n_allocs), bytes);
        if (lay) {
            dhsa_layout_stats ls;
            T_CHECK(dhsa_layout_get_stats(lay, &ls) == DHSA_OK && ls.n_blocks == nb &&
                        ls.max_ranges == x[5] && ls.q_block == x[4] && ls.B == x[0] &&
                        ls.Hkv == x[1] && ls.Lq == x[2] && ls.Lk == x[3],
                    "stats of a new layout (shape %zu) do not echo its sizes", s);
            /* a new layout selects nothing */
            int64_t nonempty = 0;
            for (int64_t b = 0; b < x[0]; b++)
                for (int64_t g = 0; g < x[1]; g++)
                    for (int64_t qb = 0; qb < nb; qb++) {
                        const int64_t *r = NULL;
                        int64_t n = -1;
                        if (dhsa_layout_get(lay, b, g, qb, &r, &n) != DHSA_OK || n != 0) nonempty++;
                    }
            T_CHECK(nonempty == 0, "a new layout (shape %zu) has %lld non-empty blocks", s,
                    (long long)nonempty);
        }
        dhsa_layout_free(lay);
        T_CHECK(dhsa_ctx_mem_stats(ctx).in_use == m0.in_use, "layout_free did not give back %zu bytes",
                bytes);

        /* budget: exactly enough works, one byte less refuses */
        T_CHECK(dhsa_ctx_set_budget(ctx, m0.in_use + bytes - 1) == DHSA_OK, "set_budget failed");
        plant_error();
        lay = (dhsa_layout *)&lay; /* must be reset to NULL on failure */
        st = dhsa_layout_create(ctx, x[0], x[1], x[2], x[3], x[4], x[5], &lay);
        T_CHECK(st == DHSA_ERR_MEMORY_BUDGET && lay == NULL && fresh_error(),
                "layout_create(shape %zu) under a budget 1 byte short: %s, out %s, sentence \"%s\"", s,
                dhsa_status_str(st), lay ? "not NULL" : "NULL", dhsa_last_error());
        T_CHECK(dhsa_ctx_mem_stats(ctx).in_use == m0.in_use, "a refused layout_create kept memory");
        T_CHECK(dhsa_ctx_set_budget(ctx, m0.in_use + bytes) == DHSA_OK, "set_budget failed");
        st = dhsa_layout_create(ctx, x[0], x[1], x[2], x[3], x[4], x[5], &lay);
        T_CHECK(st == DHSA_OK, "layout_create(shape %zu) with a budget of exactly its size: %s", s,
                dhsa_status_str(st));
        if (st == DHSA_OK) dhsa_layout_free(lay);
        T_CHECK(dhsa_ctx_set_budget(ctx, 0) == DHSA_OK, "set_budget(0) failed");
    }
    /* invalid sizes */
    static const int64_t bad[][6] = {{0, 1, 1, 1, 1, 1}, {1, 0, 1, 1, 1, 1}, {1, 1, 0, 1, 1, 1},
                                     {1, 1, 1, -1, 1, 1}, {1, 1, 1, 1, 0, 1}, {1, 1, 1, 1, 1, 0},
                                     {-2, 1, 1, 1, 1, 1}};
    for (size_t s = 0; s < sizeof bad / sizeof bad[0]; s++) {
        const int64_t *x = bad[s];
        size_t bytes = 12345;
        plant_error();
        dhsa_status st = dhsa_layout_size(x[0], x[1], x[2], x[3], x[4], x[5], &bytes);
        T_CHECK(st == DHSA_ERR_INVALID_ARG && fresh_error(),
                "layout_size(%lld,%lld,%lld,%lld,%lld,%lld): %s, want INVALID_ARG with a sentence",
                (long long)x[0], (long long)x[1], (long long)x[2], (long long)x[3], (long long)x[4],
                (long long)x[5], dhsa_status_str(st));
        dhsa_layout *lay = NULL;
        plant_error();
        st = dhsa_layout_create(ctx, x[0], x[1], x[2], x[3], x[4], x[5], &lay);
        T_CHECK(st == DHSA_ERR_INVALID_ARG && !lay && fresh_error(), "layout_create with bad size %zu: %s",
                s, dhsa_status_str(st));
    }
    size_t bytes;
    T_CHECK(dhsa_layout_size(1, 1, 1, 1, 1, 1, NULL) < 0, "layout_size(bytes = NULL) succeeded");
    dhsa_status st = dhsa_layout_size((int64_t)1 << 21, 1 << 10, (int64_t)1 << 30, 1, 1, 1 << 20, &bytes);
    T_CHECK(st == DHSA_ERR_TOO_LARGE, "layout_size of an absurd layout: %s, want TOO_LARGE",
            dhsa_status_str(st));
    dhsa_layout *lay = NULL;
    T_CHECK(dhsa_layout_create(NULL, 1, 1, 1, 1, 1, 1, &lay) < 0 && !lay, "layout_create(ctx NULL) succeeded");
    T_CHECK(dhsa_layout_create(ctx, 1, 1, 1, 1, 1, 1, NULL) < 0, "layout_create(out NULL) succeeded");
    dhsa_layout_free(NULL); /* allowed */
    dhsa_ctx_free(ctx);
}

static void test_layout_set_get(void) {
    dhsa_layout *lay = NULL;
    /* B=2, Hkv=3, Lq=50 (q_block 7: 8 blocks, the last of 1 row), Lk=100 */
    if (dhsa_layout_create(g_ctx, 2, 3, 50, 100, 7, 4, &lay) != DHSA_OK) {
        T_CHECK(0, "layout_create: %s", dhsa_last_error());
        return;
    }
    /* normalisation: unsorted, overlapping, adjacent, nested, empty ranges */
    static const struct {
        int64_t in[16], n, out[8], m;
    } cases[] = {
        {{50, 60, 10, 20, 15, 30, 30, 35, 70, 70, 0, 5}, 6, {0, 5, 10, 35, 50, 60}, 3},
        {{40, 50, 0, 10, 10, 20}, 3, {0, 20, 40, 50}, 2},
        {{0, 100, 10, 20}, 2, {0, 100}, 1},
        {{5, 5, 9, 9}, 2, {0}, 0},
        {{99, 100, 0, 1, 98, 99, 2, 3, 50, 51, 1, 2}, 6, {0, 3, 50, 51, 98, 100}, 3},
        {{20, 30, 20, 30, 20, 30}, 3, {20, 30}, 1},
        {{60, 70, 10, 20, 40, 50, 80, 90}, 4, {10, 20, 40, 50, 60, 70, 80, 90}, 4},
        {{0}, 0, {0}, 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        dhsa_status st = dhsa_layout_set(lay, 1, 2, 3, cases[c].in, cases[c].n);
        T_CHECK(st == DHSA_OK, "layout_set case %zu: %s %s", c, dhsa_status_str(st), dhsa_last_error());
        T_CHECK(block_equals(lay, 1, 2, 3, cases[c].out, cases[c].m),
                "layout_set case %zu: ranges not sorted and merged as expected (%lld ranges wanted)", c,
                (long long)cases[c].m);
    }
    /* the comparison can fail: a block compared with a wrong expectation */
    static const int64_t wrong[] = {10, 20, 40, 50, 60, 70, 80, 91};
    T_CHECK(!block_equals(lay, 1, 2, 3, wrong, 4) && !block_equals(lay, 1, 2, 3, wrong, 3),
            "block_equals accepts a wrong expectation");
    /* only that block changed */
    T_CHECK(block_equals(lay, 0, 0, 0, NULL, 0) && block_equals(lay, 1, 2, 2, NULL, 0) &&
                block_equals(lay, 1, 1, 3, NULL, 0),
            "layout_set changed another block");

    /* errors: a code, a sentence, and the block left as it was */
    static const int64_t keep[] = {3, 8, 30, 40};
    T_CHECK(dhsa_layout_set(lay, 0, 1, 7, keep, 2) == DHSA_OK, "layout_set on the last block failed");
    static const struct {
        int64_t r[12], n;
        const char *what;
    } bad[] = {
        {{-1, 5}, 1, "start < 0"},
        {{90, 101}, 1, "end > Lk"},
        {{30, 20}, 1, "start > end"},
        {{0, 10, 105, 105}, 2, "an empty range beyond Lk"},
        {{0, 10, 20, 30, 40, 50, 60, 70, 80, 90}, 5, "5 disjoint ranges with max_ranges 4"},
        {{0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 30, 20}, 6, "a bad range after good ones"},
    };
    for (size_t c = 0; c < sizeof bad / sizeof bad[0]; c++) {
        plant_error();
        dhsa_status st = dhsa_layout_set(lay, 0, 1, 7, bad[c].r, bad[c].n);
        T_CHECK(st == DHSA_ERR_INVALID_ARG && fresh_error(),
                "layout_set with %s: %s (want INVALID_ARG), sentence \"%s\"", bad[c].what,
                dhsa_status_str(st), dhsa_last_error());
        T_CHECK(block_equals(lay, 0, 1, 7, keep, 2), "layout_set with %s changed the block", bad[c].what);
    }
    plant_error();
    T_CHECK(dhsa_layout_set(lay, 0, 1, 7, NULL, 2) == DHSA_ERR_INVALID_ARG && fresh_error(),
            "layout_set(ranges NULL, n 2) accepted");
    plant_error();
    T_CHECK(dhsa_layout_set(lay, 0, 1, 7, keep, -1) == DHSA_ERR_INVALID_ARG && fresh_error(),
            "layout_set(n -1) accepted");
    T_CHECK(block_equals(lay, 0, 1, 7, keep, 2), "a refused layout_set changed the block");
    /* 6 ranges that merge into 4 fit max_ranges 4 */
    static const int64_t merge4[] = {0, 10, 10, 20, 30, 40, 50, 60, 60, 65, 80, 90};
    static const int64_t merged4[] = {0, 20, 30, 40, 50, 65, 80, 90};
    T_CHECK(dhsa_layout_set(lay, 0, 1, 6, merge4, 6) == DHSA_OK && block_equals(lay, 0, 1, 6, merged4, 4),
            "6 ranges merging into 4 rejected or misread with max_ranges 4: %s", dhsa_last_error());

    /* bad (b, g, qb) for set, get and selects */
    static const int64_t blk[][3] = {{-1, 0, 0}, {2, 0, 0}, {0, -1, 0}, {0, 3, 0}, {0, 0, -1}, {0, 0, 8}};
    for (size_t c = 0; c < sizeof blk / sizeof blk[0]; c++) {
        const int64_t *x = blk[c];
        const int64_t *r = NULL;
        int64_t n = 0;
        plant_error();
        dhsa_status st = dhsa_layout_set(lay, x[0], x[1], x[2], keep, 2);
        T_CHECK(st == DHSA_ERR_INVALID_ARG && fresh_error(), "layout_set(b=%lld, g=%lld, qb=%lld): %s",
                (long long)x[0], (long long)x[1], (long long)x[2], dhsa_status_str(st));
        plant_error();
        st = dhsa_layout_get(lay, x[0], x[1], x[2], &r, &n);
        T_CHECK(st == DHSA_ERR_INVALID_ARG && fresh_error(), "layout_get(b=%lld, g=%lld, qb=%lld): %s",
                (long long)x[0], (long long)x[1], (long long)x[2], dhsa_status_str(st));
        if (x[2] == 0) {
            int sel = dhsa_layout_selects(lay, x[0], x[1], 0, 5);
            T_CHECK(sel < 0, "layout_selects(b=%lld, g=%lld) returned %d, want a negative status",
                    (long long)x[0], (long long)x[1], sel);
        }
    }
    T_CHECK(dhsa_layout_selects(lay, 0, 1, -1, 5) < 0 && dhsa_layout_selects(lay, 0, 1, 50, 5) < 0,
            "layout_selects accepts rows -1 or Lq");
    T_CHECK(dhsa_layout_selects(NULL, 0, 0, 0, 0) < 0, "layout_selects(NULL) did not fail");
    {
        const int64_t *r = NULL;
        int64_t n = 0;
        T_CHECK(dhsa_layout_get(lay, 0, 0, 0, NULL, &n) < 0 && dhsa_layout_get(lay, 0, 0, 0, &r, NULL) < 0,
                "layout_get with a NULL output succeeded");
        T_CHECK(dhsa_layout_set(NULL, 0, 0, 0, keep, 2) < 0 && dhsa_layout_get(NULL, 0, 0, 0, &r, &n) < 0,
                "layout_set/get on a NULL layout succeeded");
    }
    dhsa_layout_stats ls;
    T_CHECK(dhsa_layout_get_stats(lay, NULL) < 0 && dhsa_layout_get_stats(NULL, &ls) < 0,
            "layout_get_stats with NULL succeeded");
    dhsa_layout_free(lay);
}

/* selects and stats against a bitmap kept by the test. */
static void test_layout_selects_stats(void) {
    const int64_t B = 2, Hkv = 3, Lq = 50, Lk = 77, qbk = 7, nb = (Lq + qbk - 1) / qbk, MR = 6;
    dhsa_layout *lay = NULL;
    if (dhsa_layout_create(g_ctx, B, Hkv, Lq, Lk, qbk, MR, &lay) != DHSA_OK) {
        T_CHECK(0, "layout_create: %s", dhsa_last_error());
        return;
    }
    uint8_t *bits = xcalloc((size_t)(B * Hkv * nb * Lk), 1);
    rng_t r = {4242};
    int64_t want_ranges = 0, set_fail = 0;
    for (int64_t blk = 0; blk < B * Hkv * nb; blk++) {
        int64_t in[2 * 8], n = rng_range(&r, 9); /* 0..8 random ranges, merged to <= MR */
        uint8_t *row = bits + blk * Lk;
        for (int64_t i = 0; i < n; i++) {
            int64_t s = rng_range(&r, Lk + 1), len = rng_range(&r, 15);
            in[2 * i] = s, in[2 * i + 1] = s + len > Lk ? Lk : s + len;
        }
        int64_t tmp[2 * 8];
        memcpy(tmp, in, sizeof tmp);
        int64_t m = norm_ranges(tmp, n);
        if (m > MR) n = 0; /* keep the test about valid input here */
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = in[2 * i]; j < in[2 * i + 1]; j++) row[j] = 1;
        if (blk == 5) { /* one block selects everything, one nothing */
            in[0] = 0, in[1] = Lk, n = 1;
            memset(row, 1, (size_t)Lk);
        }
        int64_t b = blk / (Hkv * nb), g = blk / nb % Hkv, qb = blk % nb;
        set_fail += dhsa_layout_set(lay, b, g, qb, in, n) != DHSA_OK;
        int64_t runs[2 * 80];
        want_ranges += runs_of(row, Lk, runs);
    }
    T_CHECK(set_fail == 0, "%lld layout_set calls failed", (long long)set_fail);

    /* selects, for every (b, g, row, key), and keys -1 and Lk (never 1) */
    viol v = {0, 0, ""}, wrong = {0, 0, ""};
    double selected = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t g = 0; g < Hkv; g++)
            for (int64_t i = 0; i < Lq; i++) {
                const uint8_t *row = bits + ((b * Hkv + g) * nb + i / qbk) * Lk;
                for (int64_t j = -1; j <= Lk; j++) {
                    int want = j >= 0 && j < Lk && row[j];
                    int got = dhsa_layout_selects(lay, b, g, i, j);
                    selected += want;
                    if (j < 0 || j == Lk) {
                        VIOL_IF(v, got == 1, "key %lld (outside [0, Lk)) selected for (b %lld, g %lld, row %lld)",
                                (long long)j, (long long)b, (long long)g, (long long)i);
                        continue;
                    }
                    VIOL_IF(v, got != want, "(b %lld, g %lld, row %lld, key %lld): selects %d, bitmap %d",
                            (long long)b, (long long)g, (long long)i, (long long)j, got, want);
                    /* deliberately wrong reference: ranges read as [start, end] */
                    int wrong_want = want || (j > 0 && row[j - 1]);
                    VIOL_IF(wrong, got != wrong_want, "-");
                }
            }
    VIOL_REPORT(v, "layout_selects vs brute force", "%s", "B=2 Hkv=3 Lq=50 Lk=77 q_block=7");
    T_CHECK(wrong.bad > 0, "layout_selects also agrees with an inclusive-end reference: the check cannot fail");

    dhsa_layout_stats st;
    T_CHECK(dhsa_layout_get_stats(lay, &st) == DHSA_OK, "get_stats: %s", dhsa_last_error());
    double available = (double)(B * Hkv * Lq * Lk);
    T_CHECK(st.selected == selected && st.available == available,
            "stats of a hand-made layout: selected %.0f available %.0f, brute force %.0f and %.0f",
            st.selected, st.available, selected, available);
    /* counts are integers held exactly in doubles: only the one division
     * rounds (1e-15 is a few ulp of a density <= 1) */
    T_CHECK(fabs(st.density - selected / available) <= 1e-15, "stats density %.17g, want %.17g", st.density,
            selected / available);
    T_CHECK(st.ranges == want_ranges, "stats ranges %lld, want %lld", (long long)st.ranges,
            (long long)want_ranges);
    T_CHECK(st.q_pos0 == 0 && st.causal == 0 && st.window == 0 && st.dense_blocks == 0 && st.chunks == 0 &&
                st.chunk_min == 0 && st.chunk_max == 0 && st.chunk_mean == 0,
            "stats of a hand-made layout: q_pos0 %lld causal %d window %lld dense %lld chunks %lld "
            "(all should be 0)",
            (long long)st.q_pos0, st.causal, (long long)st.window, (long long)st.dense_blocks,
            (long long)st.chunks);
    T_CHECK(st.B == B && st.Hkv == Hkv && st.Lq == Lq && st.Lk == Lk && st.q_block == qbk &&
                st.n_blocks == nb && st.max_ranges == MR,
            "stats do not echo the layout's sizes");
    /* an empty layout has density 0 (available > 0) */
    dhsa_layout *empty = NULL;
    if (dhsa_layout_create(g_ctx, 1, 1, 3, 10, 2, 1, &empty) == DHSA_OK) {
        T_CHECK(dhsa_layout_get_stats(empty, &st) == DHSA_OK && st.selected == 0 && st.available == 30 &&
                    st.density == 0,
                "empty layout: selected %.0f available %.0f density %g, want 0, 30, 0", st.selected,
                st.available, st.density);
        dhsa_layout_free(empty);
    }
    free(bits);
    dhsa_layout_free(lay);
}

/* ======================================================================== */
/* 2. The sparse kernel                                                     */

static int64_t count_inf(const double *lse, int64_t n) {
    int64_t k = 0;
    for (int64_t x = 0; x < n; x++) k += lse[x] == -INFINITY;
    return k;
}

/* The usual case: oracle with the selection, then TILED and REFERENCE. */
static void run_sparse(const scase *sp) {
    sinst I;
    s_init(&I, sp);
    if (!I.lay) { s_free(&I); return; }
    s_oracle(&I, I.sel, I.ref_o, I.ref_lse);
    s_check(&I, g_ctx, DHSA_BACKEND_TILED);
    s_check(&I, g_ctx, DHSA_BACKEND_REFERENCE);
    s_free(&I);
}

/* A layout selecting [0, Lk) everywhere is dense: compared with the DENSE
 * oracle (no selection), and with the library's own dense call. */
static void run_select_all(const scase *sp) {
    sinst I;
    s_init(&I, sp);
    if (!I.lay) { s_free(&I); return; }
    s_oracle(&I, NULL, I.ref_o, I.ref_lse);
    s_check(&I, g_ctx, DHSA_BACKEND_TILED);
    s_check(&I, g_ctx, DHSA_BACKEND_REFERENCE);
    /* against the dense tiled call, both within TILED tolerance of the
     * oracle: the difference is bounded by twice that */
    const scase *s = &I.s;
    size_t n = (size_t)(s->B * s->Hq * s->Lq);
    if (s_run(&I, g_ctx, DHSA_BACKEND_TILED, I.lay) == DHSA_OK) {
        double *so = xcalloc(n * (size_t)s->d, sizeof(double)), *sl = xcalloc(n, sizeof(double));
        memcpy(so, I.got_o, n * (size_t)s->d * sizeof(double));
        memcpy(sl, I.got_lse, n * sizeof(double));
        dhsa_status st = s_run(&I, g_ctx, DHSA_BACKEND_TILED, NULL);
        T_CHECK(st == DHSA_OK, "dense call failed: %s", dhsa_last_error());
        tol_t t2 = {6e-5, 4e-5, 4e-9}, l2 = {6e-5, 2e-5, 4e-9};
        report_cmp("select-all layout vs dense TILED o", I.desc,
                   compare(so, I.got_o, I.ref_lse, s->B, s->Hq, s->Lq, s->d, t2), t2);
        report_cmp("select-all layout vs dense TILED lse", I.desc,
                   compare(sl, I.got_lse, NULL, s->B, s->Hq, s->Lq, 1, l2), l2);
        free(so), free(sl);
    }
    s_free(&I);
}

static void sparse_suite(void) {
    const dhsa_mask_polarity IG = DHSA_MASK_TRUE_IGNORES, KE = DHSA_MASK_TRUE_KEEPS;
    /* select-all == dense */
    run_select_all(&(scase){.tag = "select-all", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 150, .Lk = 150, .d = 64,
                            .q_block = 64, .causal = 1, .sel = SEL_ALL});
    run_select_all(&(scase){.tag = "select-all", .Hq = 4, .Hkv = 1, .Lq = 130, .Lk = 130, .d = 80,
                            .q_block = 16, .window = 40, .sel = SEL_ALL, .km = KM_RANDOM, .pol = KE});
    run_select_all(&(scase){.tag = "select-all-decode", .Hq = 8, .Hkv = 2, .Lq = 1, .Lk = 700, .q_pos0 = 699,
                            .d = 64, .q_block = 64, .causal = 1, .sel = SEL_ALL});
    /* fixed 64-key blocks: GQA 1/2/4, q_block 1/16/64/100, d 64/80 */
    run_sparse(&(scase){.tag = "blocks-g1", .B = 2, .Hq = 2, .Lq = 300, .Lk = 300, .d = 64, .q_block = 64,
                        .causal = 1, .sel = SEL_BLOCKS});
    run_sparse(&(scase){.tag = "blocks-g2-window", .Hq = 4, .Hkv = 2, .Lq = 300, .Lk = 300, .d = 80,
                        .q_block = 100, .causal = 1, .window = 120, .sel = SEL_BLOCKS});
    run_sparse(&(scase){.tag = "blocks-g4-qpos0-mask", .B = 2, .Hq = 8, .Hkv = 2, .Lq = 200, .Lk = 260,
                        .q_pos0 = 60, .d = 64, .q_block = 16, .causal = 1, .km = KM_RANDOM, .pol = IG,
                        .sel = SEL_BLOCKS});
    run_sparse(&(scase){.tag = "blocks-q_block1-mask-keeps", .Hq = 4, .Hkv = 2, .Lq = 70, .Lk = 70, .d = 64,
                        .q_block = 1, .km = KM_RANDOM, .pol = KE, .sel = SEL_BLOCKS});
    run_sparse(&(scase){.tag = "blocks-softcap", .Hq = 4, .Hkv = 2, .Lq = 130, .Lk = 130, .d = 64,
                        .q_block = 64, .causal = 1, .softcap = 5, .sigma = 2.5, .sel = SEL_BLOCKS});
    run_sparse(&(scase){.tag = "blocks-f16", .Hq = 8, .Hkv = 2, .Lq = 130, .Lk = 130, .d = 80, .q_block = 100,
                        .tin = DHSA_F16, .causal = 1, .sel = SEL_BLOCKS});
    run_sparse(&(scase){.tag = "blocks-noncausal-window", .B = 2, .Hq = 2, .Hkv = 1, .Lq = 190, .Lk = 190,
                        .d = 80, .q_block = 64, .window = 70, .sel = SEL_BLOCKS});
    /* decode: one query at the end of the cache (narrow tiles) */
    run_sparse(&(scase){.tag = "decode", .B = 2, .Hq = 8, .Hkv = 2, .Lq = 1, .Lk = 1000, .q_pos0 = 999, .d = 64,
                        .q_block = 1, .causal = 1, .sel = SEL_BLOCKS});
    run_sparse(&(scase){.tag = "decode-mask-f16", .Hq = 4, .Hkv = 1, .Lq = 1, .Lk = 777, .q_pos0 = 776,
                        .d = 80, .q_block = 64, .causal = 1, .tin = DHSA_F16, .km = KM_RANDOM, .pol = KE,
                        .sel = SEL_RANGES});
    run_sparse(&(scase){.tag = "decode-2-rows", .Hq = 4, .Hkv = 2, .Lq = 2, .Lk = 300, .q_pos0 = 298,
                        .d = 64, .q_block = 1, .causal = 1, .softcap = 20, .sel = SEL_RANGES});
    /* chunked prefill: 37 new queries after 463 cached keys */
    run_sparse(&(scase){.tag = "chunked-prefill", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 37, .Lk = 500,
                        .q_pos0 = 463, .d = 64, .q_block = 16, .causal = 1, .sel = SEL_BLOCKS});
    run_sparse(&(scase){.tag = "chunked-prefill-window", .Hq = 8, .Hkv = 2, .Lq = 37, .Lk = 500,
                        .q_pos0 = 463, .d = 80, .q_block = 64, .causal = 1, .window = 100, .km = KM_RANDOM,
                        .pol = IG, .sel = SEL_RANGES});
    /* unaligned ranges */
    run_sparse(&(scase){.tag = "ranges", .Hq = 4, .Hkv = 2, .Lq = 200, .Lk = 200, .d = 64, .q_block = 64,
                        .causal = 1, .sel = SEL_RANGES});
    run_sparse(&(scase){.tag = "ranges-noncausal", .Hq = 2, .Hkv = 2, .Lq = 250, .Lk = 180, .d = 80,
                        .q_block = 100, .window = 50, .q_pos0 = 10, .sel = SEL_RANGES});
}

/* The comparator and the sparse cases can fail (STYLE 7): a one-element
 * error, a NaN, o != 0 on a row with no key; the library's sparse output
 * against the dense oracle, and against the oracle of another selection. */
static void test_sparse_can_fail(void) {
    sinst I;
    s_init(&I, &(scase){.tag = "can-fail", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 150, .Lk = 150, .d = 64,
                        .q_block = 64, .causal = 1, .sel = SEL_BLOCKS, .seed = 99});
    if (!I.lay) { s_free(&I); return; }
    const scase *s = &I.s;
    int64_t n = s->B * s->Hq * s->Lq;
    s_oracle(&I, I.sel, I.ref_o, I.ref_lse);
    if (!s_check(&I, g_ctx, DHSA_BACKEND_TILED)) { s_free(&I); return; }
    tol_t t = tol_o(DHSA_BACKEND_TILED);
    T_CHECK(count_inf(I.ref_lse, n) > 0 && count_inf(I.ref_lse, n) < n,
            "can-fail case has %lld of %lld rows without a key: want some, not all",
            (long long)count_inf(I.ref_lse, n), (long long)n);
    int64_t live = 0;
    while (live < n && I.ref_lse[live] == -INFINITY) live++;
    int64_t dead = 0;
    while (dead < n && I.ref_lse[dead] != -INFINITY) dead++;
    I.got_o[live * s->d + 3] += 1e-3;
    cmp_t c = compare(I.got_o, I.ref_o, I.ref_lse, s->B, s->Hq, s->Lq, s->d, t);
    T_CHECK(!c.ok && c.n_bad == 1, "comparator misses a 1e-3 error in one element");
    I.got_o[live * s->d + 3] = NAN;
    T_CHECK(!compare(I.got_o, I.ref_o, I.ref_lse, s->B, s->Hq, s->Lq, s->d, t).ok, "comparator accepts NaN");
    I.got_o[live * s->d + 3] = I.ref_o[live * s->d + 3];
    if (dead < n) {
        I.got_o[dead * s->d] = 1e-30;
        T_CHECK(!compare(I.got_o, I.ref_o, I.ref_lse, s->B, s->Hq, s->Lq, s->d, t).ok,
                "comparator accepts o = 1e-30 on a row with no allowed key");
    }
    /* the sparse result is not the dense one, nor another selection's */
    double *wo = xcalloc((size_t)(n * s->d), sizeof(double)), *wl = xcalloc((size_t)n, sizeof(double));
    s_run(&I, g_ctx, DHSA_BACKEND_TILED, I.lay);
    s_oracle(&I, NULL, wo, wl);
    T_CHECK(!compare(I.got_o, wo, wl, s->B, s->Hq, s->Lq, s->d, t).ok,
            "sparse TILED output matches the DENSE oracle: the selection does not matter [%s]", I.desc);
    uint8_t *other = xcalloc((size_t)(s->B * s->Hkv * I.nqb * s->Lk), 1);
    memcpy(other, I.sel, (size_t)(s->B * s->Hkv * I.nqb * s->Lk));
    for (int64_t x = 0; x < s->B * s->Hkv * I.nqb; x++) /* flip one 64-key block per block */
        for (int64_t j = 64; j < 128 && j < s->Lk; j++) other[x * s->Lk + j] ^= 1;
    s_oracle(&I, other, wo, wl);
    T_CHECK(!compare(I.got_o, wo, wl, s->B, s->Hq, s->Lq, s->d, t).ok,
            "sparse TILED output matches the oracle of another selection [%s]", I.desc);
    /* the oracle of a selection shared by all KV heads: the per-head layout must matter */
    for (int64_t b = 0; b < s->B; b++)
        for (int64_t g = 0; g < s->Hkv; g++)
            memcpy(other + (b * s->Hkv + g) * I.nqb * s->Lk, I.sel + b * s->Hkv * I.nqb * s->Lk,
                   (size_t)(I.nqb * s->Lk));
    s_oracle(&I, other, wo, wl);
    T_CHECK(!compare(I.got_o, wo, wl, s->B, s->Hq, s->Lq, s->d, t).ok,
            "sparse TILED output matches an oracle that uses KV head 0's selection for all heads [%s]", I.desc);
    free(other), free(wo), free(wl);
    s_free(&I);
}

/* Results with a layout do not depend on the thread count (bitwise). */
static void test_sparse_threads(void) {
    static const scase cases[] = {
        {.tag = "threads", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 300, .Lk = 300, .d = 80, .q_block = 100,
         .causal = 1, .window = 120, .softcap = 20, .km = KM_RANDOM, .pol = DHSA_MASK_TRUE_IGNORES,
         .sel = SEL_BLOCKS},
        {.tag = "threads-decode", .B = 3, .Hq = 8, .Hkv = 2, .Lq = 1, .Lk = 1000, .q_pos0 = 999, .d = 64,
         .q_block = 1, .causal = 1, .tin = DHSA_F16, .sel = SEL_RANGES},
        {.tag = "threads-q_block16", .Hq = 4, .Hkv = 1, .Lq = 200, .Lk = 200, .d = 64, .q_block = 16,
         .causal = 1, .sel = SEL_RANGES},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        sinst I;
        s_init(&I, &cases[k]);
        if (!I.lay) { s_free(&I); continue; }
        unsigned char *o1 = xcalloc(I.o_bytes, 1), *l1 = xcalloc(I.lse_bytes, 1);
        for (int nt = 1; nt <= 3; nt += 2) {
            dhsa_ctx *ctx = ctx_new(nt, 0);
            if (!ctx) continue;
            dhsa_status st = s_run(&I, ctx, DHSA_BACKEND_TILED, I.lay);
            T_CHECK(st == DHSA_OK, "%d threads: %s", nt, dhsa_last_error());
            if (nt == 1) {
                memcpy(o1, I.o, I.o_bytes);
                memcpy(l1, I.lse, I.lse_bytes);
            } else {
                T_CHECK(memcmp(o1, I.o, I.o_bytes) == 0 && memcmp(l1, I.lse, I.lse_bytes) == 0,
                        "TILED with a layout: 3 threads differ bitwise from 1 [%s]", I.desc);
            }
            dhsa_ctx_free(ctx);
        }
        free(o1), free(l1);
        s_free(&I);
    }
}

/* A layout made for other sizes: DHSA_ERR_SHAPE with a sentence, nothing
 * written, and the workspace query agrees. */
static void test_layout_mismatch(void) {
    sinst I;
    s_init(&I, &(scase){.tag = "mismatch", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 40, .Lk = 50, .d = 64,
                        .q_block = 16, .causal = 1, .sel = SEL_ALL});
    static const struct {
        int64_t B, Hkv, Lq, Lk;
        const char *what;
    } other[] = {{2, 2, 40, 51, "Lk 51 for 50"}, {2, 2, 41, 50, "Lq 41 for 40"},
                 {1, 2, 40, 50, "B 1 for 2"},    {2, 1, 40, 50, "Hkv 1 for 2"},
                 {2, 4, 40, 50, "Hkv 4 for 2"},  {2, 2, 40, 49, "Lk 49 for 50"}};
    for (size_t c = 0; c < sizeof other / sizeof other[0]; c++) {
        dhsa_layout *lay = NULL;
        if (dhsa_layout_create(g_ctx, other[c].B, other[c].Hkv, other[c].Lq, other[c].Lk, 16, 1, &lay) != DHSA_OK)
            continue;
        for (int e = 0; e < 2; e++) {
            dhsa_backend be = e ? DHSA_BACKEND_REFERENCE : DHSA_BACKEND_TILED;
            plant_error();
            memset(I.o, 0xA5, I.o_bytes);
            memset(I.lse, 0xA5, I.lse_bytes);
            dhsa_attn_desc a = I.a;
            a.backend = be;
            a.layout = lay;
            dhsa_status st = dhsa_attention(g_ctx, &a);
            T_CHECK(st == DHSA_ERR_SHAPE && fresh_error(),
                    "%s with a layout built for %s: %s (want SHAPE), sentence \"%s\"", dhsa_backend_name(be),
                    other[c].what, dhsa_status_str(st), dhsa_last_error());
            int untouched = 1;
            for (size_t x = 0; x < I.o_bytes; x++) untouched &= ((unsigned char *)I.o)[x] == 0xA5;
            for (size_t x = 0; x < I.lse_bytes; x++) untouched &= ((unsigned char *)I.lse)[x] == 0xA5;
            T_CHECK(untouched, "%s refused a mismatched layout but wrote o or lse", dhsa_backend_name(be));
            size_t ws = 0;
            T_CHECK(dhsa_attn_workspace_size(g_ctx, &a, &ws) == DHSA_ERR_SHAPE,
                    "workspace_size accepts a layout built for %s", other[c].what);
        }
        dhsa_layout_free(lay);
    }
    /* the matching layout is accepted (the base case is valid) */
    T_CHECK(s_run(&I, g_ctx, DHSA_BACKEND_TILED, I.lay) == DHSA_OK, "the matching layout is refused: %s",
            dhsa_last_error());
    s_free(&I);
}

/* ======================================================================== */
/* 3. Merging two partial results by LSE equals one pass                    */

/* o = (e^lseA oA + e^lseB oB) / (e^lseA + e^lseB), lse = logaddexp, in
 * double, with a side at -inf contributing nothing (and both at -inf giving
 * o = 0, lse = -inf). wrong = 1: plain average of the two sides instead
 * (must fail). */
static void merge_lse(const float *oA, const float *lA, const float *oB, const float *lB, int64_t rows,
                      int64_t d, int wrong, double *o, double *lse) {
    for (int64_t r = 0; r < rows; r++) {
        double a = lA[r], b = lB[r], m = a > b ? a : b;
        if (m == -INFINITY) {
            for (int64_t c = 0; c < d; c++) o[r * d + c] = 0;
            lse[r] = -INFINITY;
            continue;
        }
        double wa = exp(a - m), wb = exp(b - m);
        if (wrong) wa = wb = 0.5;
        for (int64_t c = 0; c < d; c++)
            o[r * d + c] = (wa * oA[r * d + c] + wb * oB[r * d + c]) / (wa + wb);
        lse[r] = m + log(wa + wb);
    }
}

static void run_merge(const scase *sp, int need_one_sided) {
    sinst I;
    s_init(&I, sp);
    if (!I.lay) { s_free(&I); return; }
    const scase *s = &I.s;
    const int64_t nsel = s->B * s->Hkv * I.nqb * s->Lk, rows = s->B * s->Hq * s->Lq;
    uint8_t *selB = xcalloc((size_t)nsel, 1);
    for (int64_t x = 0; x < nsel; x++) selB[x] = !I.sel[x]; /* B = the complement: A u B = all, disjoint */
    dhsa_layout *layB = layout_from_bits(g_ctx, s->B, s->Hkv, s->Lq, s->Lk, s->q_block, selB, 0);
    float *oA = xcalloc(I.o_bytes, 1), *lA = xcalloc(I.lse_bytes, 1);
    double *mo = xcalloc((size_t)(rows * s->d), sizeof(double)), *ml = xcalloc((size_t)rows, sizeof(double));
    s_oracle(&I, NULL, I.ref_o, I.ref_lse); /* one dense pass */
    dhsa_status st = s_run(&I, g_ctx, DHSA_BACKEND_TILED, I.lay);
    T_CHECK(st == DHSA_OK, "merge: layout A: %s", dhsa_last_error());
    memcpy(oA, I.o, I.o_bytes);
    memcpy(lA, I.lse, I.lse_bytes);
    st |= s_run(&I, g_ctx, DHSA_BACKEND_TILED, layB);
    T_CHECK(st == DHSA_OK, "merge: layout B: %s", dhsa_last_error());
    if (st == DHSA_OK && layB) {
        /* the case must contain rows where exactly one side has no key */
        int64_t onlyA = 0, onlyB = 0;
        for (int64_t r = 0; r < rows; r++) {
            onlyB += lA[r] == -INFINITY && I.lse[r] != -INFINITY;
            onlyA += I.lse[r] == -INFINITY && lA[r] != -INFINITY;
        }
        T_CHECK(!need_one_sided || (onlyA > 0 && onlyB > 0),
                "merge case has %lld rows with keys only in A and %lld only in B: want both [%s]",
                (long long)onlyA, (long long)onlyB, I.desc);
        merge_lse(oA, lA, I.o, I.lse, rows, s->d, 0, mo, ml);
        /* Tolerance: each side is within TILED's bound of its exact value;
         * the merge weight sigmoid(lseA - lseB) moves by at most 1/4 of the
         * two LSE errors (<= 2 x 3e-5), times |oA - oB| <= ~2: another
         * ~3e-5. So twice TILED's atol for o; lse = logaddexp carries the
         * sides' LSE errors (at most the larger, 3e-5 + 1e-5 |lse|), doubled
         * for safety. NMSE 4x TILED's. */
        tol_t to = {6e-5, 4e-5, 4e-9}, tl = {6e-5, 2e-5, 4e-9};
        report_cmp("LSE-merged A+B vs one dense pass (oracle) o", I.desc,
                   compare(mo, I.ref_o, I.ref_lse, s->B, s->Hq, s->Lq, s->d, to), to);
        report_cmp("LSE-merged A+B vs one dense pass (oracle) lse", I.desc,
                   compare(ml, I.ref_lse, NULL, s->B, s->Hq, s->Lq, 1, tl), tl);
        /* and against the library's own dense pass */
        double *mo2 = xcalloc((size_t)(rows * s->d), sizeof(double)), *ml2 = xcalloc((size_t)rows, sizeof(double));
        memcpy(mo2, mo, (size_t)(rows * s->d) * sizeof(double));
        memcpy(ml2, ml, (size_t)rows * sizeof(double));
        if (s_run(&I, g_ctx, DHSA_BACKEND_TILED, NULL) == DHSA_OK) {
            /* the merged bound above plus the dense TILED pass's own
             * (3e-5 + 2e-5 |o|): their sum */
            tol_t t3 = {9e-5, 6e-5, 9e-9};
            report_cmp("LSE-merged A+B vs the dense TILED pass o", I.desc,
                       compare(mo2, I.got_o, I.ref_lse, s->B, s->Hq, s->Lq, s->d, t3), t3);
            report_cmp("LSE-merged A+B vs the dense TILED pass lse", I.desc,
                       compare(ml2, I.got_lse, NULL, s->B, s->Hq, s->Lq, 1, t3), t3);
        }
        free(mo2), free(ml2);
        /* deliberately wrong merge rule: must fail */
        s_run(&I, g_ctx, DHSA_BACKEND_TILED, layB);
        merge_lse(oA, lA, I.o, I.lse, rows, s->d, 1, mo, ml);
        T_CHECK(!compare(mo, I.ref_o, I.ref_lse, s->B, s->Hq, s->Lq, s->d, to).ok,
                "an unweighted average of the two sides also matches one pass: the merge test cannot fail [%s]",
                I.desc);
    }
    dhsa_layout_free(layB);
    free(selB), free(oA), free(lA), free(mo), free(ml);
    s_free(&I);
}

static void test_merge(void) {
    run_merge(&(scase){.tag = "merge", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 200, .Lk = 200, .d = 64, .q_block = 64,
                       .causal = 1, .sel = SEL_BLOCKS, .seed = 7}, 1);
    run_merge(&(scase){.tag = "merge-ranges-window", .Hq = 8, .Hkv = 2, .Lq = 150, .Lk = 150, .d = 80,
                       .q_block = 16, .causal = 1, .window = 60, .sel = SEL_RANGES, .seed = 8}, 0);
    run_merge(&(scase){.tag = "merge-chunked", .Hq = 4, .Hkv = 1, .Lq = 37, .Lk = 500, .q_pos0 = 463,
                       .d = 64, .q_block = 1, .causal = 1, .km = KM_RANDOM, .pol = DHSA_MASK_TRUE_KEEPS,
                       .sel = SEL_BLOCKS, .seed = 9}, 1);
}

/* The ISA-dependent parts: the kernels on every ISA. */
static void isa_suite(void) {
    sparse_suite();
    test_sparse_can_fail();
    test_merge();
}

int main(void) {
    if (!open_ctx("test_route_layout")) return t_report("test_route_layout");
    test_layout_size_create();
    test_layout_set_get();
    test_layout_selects_stats();
    test_sparse_threads();
    test_layout_mismatch();
    each_isa(isa_suite, 1);
    dhsa_ctx_free(g_ctx);
    return t_report("test_route_layout");
}
