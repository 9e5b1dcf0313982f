/* test_attn_api.c: dhsa_attention's contract outside the numbers:
 * every error path (a code, a sentence, nothing written to o),
 * workspace queries and memory budgets, the finite check, the REFERENCE
 * size cap, descriptors and backend choice (AUTO = TILED bitwise).
 * Harness: attn_t.h.
 *
 * Run: make build/tests/test_attn_api && build/tests/test_attn_api
 * (or `make test`). Ends with "test_attn_api: P passed, F failed, S skipped".
 */

#include "attn_t.h"

/* ------------------------------------------------------------------------ */
/* Errors: a code, a sentence, and nothing written. */

static void expect_error(inst *I, const dhsa_attn_desc *a, dhsa_status want, const char *what) {
    memset(I->o.buf, 0xA5, I->o.nbytes);
    if (I->lse.buf) memset(I->lse.buf, 0xA5, I->lse.nbytes);
    dhsa_status st = dhsa_attention(g_ctx, a);
    if (want != DHSA_OK)
        T_CHECK(st == want, "%s: dhsa_attention returned %s, want %s", what, dhsa_status_str(st),
                dhsa_status_str(want));
    else
        T_CHECK(st < 0, "%s: dhsa_attention returned %s, want an error", what, dhsa_status_str(st));
    T_CHECK(dhsa_last_error()[0] != '\0', "%s: no error sentence", what);
    T_CHECK(all_bytes(I->o.buf, I->o.nbytes, 0xA5) &&
                (!I->lse.buf || all_bytes(I->lse.buf, I->lse.nbytes, 0xA5)),
            "%s: o or lse written although the call failed", what);
    size_t ws = 12345;
    dhsa_status st2 = dhsa_attn_workspace_size(g_ctx, a, &ws);
    T_CHECK(st2 == st, "%s: workspace_size returned %s but dhsa_attention %s", what,
            dhsa_status_str(st2), dhsa_status_str(st));
}

static void test_errors(void) {
    spec sp = {.tag = "errors", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 16, .Lk = 16, .d = 8,
               .km = KM_RANDOM, .pol = DHSA_MASK_TRUE_IGNORES, .am = AM_FULL, .kb = KB_RANDOM};
    inst I;
    inst_init(&I, &sp);
    dhsa_attn_desc a;

    /* the base descriptor is valid */
    dhsa_status st = lib_run(&I, g_ctx, DHSA_BACKEND_TILED);
    T_CHECK(st == DHSA_OK, "error-test base case fails: %s %s", dhsa_status_str(st), dhsa_last_error());

    a = I.a; a.key_mask_polarity = DHSA_MASK_NO_POLARITY;
    expect_error(&I, &a, DHSA_ERR_INVALID_ARG, "key_mask with DHSA_MASK_NO_POLARITY");
    a = I.a; a.key_mask_polarity = (dhsa_mask_polarity)7;
    expect_error(&I, &a, DHSA_ERR_INVALID_ARG, "key_mask polarity 7");
    a = I.a; a.window = -1;
    expect_error(&I, &a, DHSA_ERR_INVALID_ARG, "window -1");
    a = I.a; a.q.data = NULL;
    expect_error(&I, &a, DHSA_ERR_INVALID_ARG, "q.data NULL");
    a = I.a; a.k.data = NULL;
    expect_error(&I, &a, DHSA_ERR_INVALID_ARG, "k.data NULL");
    a = I.a; a.v.data = NULL;
    expect_error(&I, &a, DHSA_ERR_INVALID_ARG, "v.data NULL");
    a = I.a; a.o.data = NULL;
    expect_error(&I, &a, DHSA_ERR_INVALID_ARG, "o.data NULL");
    a = I.a; a.k.shape[3] = 4; a.k.stride[2] = 4;
    expect_error(&I, &a, DHSA_ERR_SHAPE, "k d=4 vs q d=8");
    a = I.a; a.v.shape[2] = 15;
    expect_error(&I, &a, DHSA_ERR_SHAPE, "v Lk=15 vs k Lk=16");
    a = I.a; a.k.shape[0] = 1; a.v.shape[0] = 1;
    expect_error(&I, &a, DHSA_ERR_SHAPE, "k/v batch 1 vs q batch 2");
    a = I.a; a.o.shape[2] = 15;
    expect_error(&I, &a, DHSA_ERR_SHAPE, "o Lq=15 vs q Lq=16");
    a = I.a; a.o.shape[3] = 7;
    expect_error(&I, &a, DHSA_ERR_SHAPE, "o dv=7 vs v dv=8");
    a = I.a; a.o.shape[1] = 2;
    expect_error(&I, &a, DHSA_ERR_SHAPE, "o heads 2 vs q heads 4");
    a = I.a; a.lse.shape[2] = 15;
    expect_error(&I, &a, DHSA_ERR_SHAPE, "lse Lq=15 vs q Lq=16");
    a = I.a; a.lse.type = DHSA_F16;
    expect_error(&I, &a, DHSA_OK, "lse of type F16 (F32 only)");
    a = I.a; a.attn_mask.shape[3] = 15;
    expect_error(&I, &a, DHSA_ERR_SHAPE, "attn_mask Lk=15 vs 16");
    a = I.a; a.attn_mask.shape[1] = 2; a.attn_mask.stride[1] = 0;
    expect_error(&I, &a, DHSA_ERR_SHAPE, "attn_mask heads 2 vs Hq 4 (neither 1 nor Hq)");
    a = I.a; a.attn_mask.type = DHSA_F16;
    expect_error(&I, &a, DHSA_OK, "attn_mask of type F16 (F32 only)");
    a = I.a; a.q.shape[2] = -1; a.o.shape[2] = -1;
    expect_error(&I, &a, DHSA_OK, "negative Lq");
    a = I.a; a.q.type = (dhsa_type)7;
    expect_error(&I, &a, DHSA_OK, "q of type 7");
    a = I.a; a.backend = (dhsa_backend)9;
    expect_error(&I, &a, DHSA_OK, "backend 9");
    /* out of their domains (the header gives no code: any error will do) */
    a = I.a; a.softcap = -1;
    expect_error(&I, &a, DHSA_OK, "softcap -1");
    a = I.a; a.scale = NAN;
    expect_error(&I, &a, DHSA_OK, "scale NaN");
    a = I.a; a.q_pos0 = -1;
    expect_error(&I, &a, DHSA_OK, "q_pos0 -1");
    a = I.a; a.key_mask_batch_stride = -16;
    expect_error(&I, &a, DHSA_OK, "key_mask_batch_stride -16");
    a = I.a; a.key_bias_batch_stride = -16;
    expect_error(&I, &a, DHSA_OK, "key_bias_batch_stride -16");

    /* Lq = 0 is a valid call with nothing to do: OK, nothing written */
    a = I.a; a.q.shape[2] = 0; a.o.shape[2] = 0; a.lse.shape[2] = 0; a.attn_mask.shape[2] = 0;
    memset(I.o.buf, 0xA5, I.o.nbytes);
    memset(I.lse.buf, 0xA5, I.lse.nbytes);
    st = dhsa_attention(g_ctx, &a);
    T_CHECK(st == DHSA_OK, "Lq=0 returned %s: %s", dhsa_status_str(st), dhsa_last_error());
    T_CHECK(all_bytes(I.o.buf, I.o.nbytes, 0xA5) && all_bytes(I.lse.buf, I.lse.nbytes, 0xA5),
            "Lq=0 wrote o or lse");
    inst_free(&I);

    /* Hq not a multiple of Hkv, and Hkv > Hq */
    spec bad = {.tag = "errors-gqa", .Hq = 4, .Hkv = 3, .Lq = 8, .Lk = 8, .d = 8};
    inst_init(&I, &bad);
    expect_error(&I, &I.a, DHSA_ERR_SHAPE, "Hq=4 with Hkv=3");
    inst_free(&I);
    bad.Hq = 2, bad.Hkv = 4;
    inst_init(&I, &bad);
    expect_error(&I, &I.a, DHSA_ERR_SHAPE, "Hq=2 with Hkv=4");
    inst_free(&I);
}

/* ------------------------------------------------------------------------ */
/* Workspace queries and memory budgets */

static size_t ws_for(dhsa_ctx *ctx, dhsa_backend be, void *qb, void *kb, void *vb, void *ob,
                     int64_t Lq, int64_t Lk) {
    dhsa_attn_desc a = dhsa_attn_default_desc();
    a.q = dhsa_tensor_bhld(qb, DHSA_F32, 1, 4, Lq, 64);
    a.k = dhsa_tensor_bhld(kb, DHSA_F32, 1, 2, Lk, 64);
    a.v = dhsa_tensor_bhld(vb, DHSA_F32, 1, 2, Lk, 64);
    a.o = dhsa_tensor_bhld(ob, DHSA_F32, 1, 4, Lq, 64);
    a.causal = 1;
    a.backend = be;
    size_t ws = 0;
    dhsa_status st = dhsa_attn_workspace_size(ctx, &a, &ws);
    T_CHECK(st == DHSA_OK, "workspace_size(%s, Lq=%lld, Lk=%lld): %s %s", dhsa_backend_name(be),
            (long long)Lq, (long long)Lk, dhsa_status_str(st), dhsa_last_error());
    return ws;
}

static void test_memory(void) {
    /* 1. A tiny budget refuses the call before any work. */
    dhsa_ctx_params p = dhsa_ctx_default_params();
    p.n_threads = 2;
    p.mem_budget = 1024;
    dhsa_ctx *tiny = NULL;
    if (dhsa_ctx_create(&p, &tiny) != DHSA_OK) {
        T_CHECK(0, "ctx_create(budget 1024): %s", dhsa_last_error());
        return;
    }
    spec sp = {.tag = "budget", .B = 1, .Hq = 4, .Hkv = 2, .Lq = 256, .Lk = 256, .d = 64,
               .causal = 1, .rows = 32};
    inst I;
    inst_init(&I, &sp);
    for (int e = 0; e < 2; e++) {
        dhsa_backend be = e ? DHSA_BACKEND_REFERENCE : DHSA_BACKEND_TILED;
        dhsa_attn_desc a = I.a;
        a.backend = be;
        size_t ws = 0;
        dhsa_status st = dhsa_attn_workspace_size(tiny, &a, &ws);
        T_CHECK(st == DHSA_OK, "workspace_size on a small-budget ctx: %s", dhsa_status_str(st));
        dhsa_mem_stats s0 = dhsa_ctx_mem_stats(tiny);
        T_CHECK(s0.in_use + ws > 1024, "%s workspace %zu bytes fits 1024 bytes: no budget test",
                dhsa_backend_name(be), ws);
        memset(I.o.buf, 0xA5, I.o.nbytes);
        memset(I.lse.buf, 0xA5, I.lse.nbytes);
        st = dhsa_attention(tiny, &a);
        T_CHECK(st == DHSA_ERR_MEMORY_BUDGET, "%s under a 1024-byte budget returned %s",
                dhsa_backend_name(be), dhsa_status_str(st));
        T_CHECK(dhsa_last_error()[0] != '\0', "budget refusal set no sentence");
        T_CHECK(all_bytes(I.o.buf, I.o.nbytes, 0xA5) && all_bytes(I.lse.buf, I.lse.nbytes, 0xA5),
                "%s refused by the budget but wrote o or lse", dhsa_backend_name(be));
        dhsa_mem_stats s1 = dhsa_ctx_mem_stats(tiny);
        T_CHECK(s1.in_use == s0.in_use && s1.n_allocs == s0.n_allocs,
                "a refused call allocated (in_use %zu -> %zu, n_allocs %llu -> %llu)", s0.in_use,
                s1.in_use, (unsigned long long)s0.n_allocs, (unsigned long long)s1.n_allocs);
    }
    dhsa_ctx_free(tiny);

    /* 2. TILED workspace does not depend on Lq or Lk; REFERENCE's grows with Lk. */
    float *qb = xcalloc((size_t)4 * 4096 * 64, sizeof(float));
    float *kvb = xcalloc((size_t)2 * 4097 * 64, sizeof(float));
    float *vb = xcalloc((size_t)2 * 4097 * 64, sizeof(float));
    float *ob = xcalloc((size_t)4 * 4096 * 64, sizeof(float));
    size_t w1 = ws_for(g_ctx, DHSA_BACKEND_TILED, qb, kvb, vb, ob, 64, 1000);
    size_t w2 = ws_for(g_ctx, DHSA_BACKEND_TILED, qb, kvb, vb, ob, 64, 4097);
    size_t w3 = ws_for(g_ctx, DHSA_BACKEND_TILED, qb, kvb, vb, ob, 4096, 1000);
    size_t w4 = ws_for(g_ctx, DHSA_BACKEND_TILED, qb, kvb, vb, ob, 4096, 4097);
    T_CHECK(w1 == w2 && w1 == w3 && w1 == w4,
            "TILED workspace depends on L: %zu (Lq 64, Lk 1000), %zu (64, 4097), %zu (4096, 1000), "
            "%zu (4096, 4097)", w1, w2, w3, w4);
    size_t r1 = ws_for(g_ctx, DHSA_BACKEND_REFERENCE, qb, kvb, vb, ob, 64, 1000);
    size_t r2 = ws_for(g_ctx, DHSA_BACKEND_REFERENCE, qb, kvb, vb, ob, 64, 4097);
    T_CHECK(r2 > r1, "REFERENCE workspace does not grow with Lk: %zu (1000) vs %zu (4097)", r1, r2);
    free(qb), free(kvb), free(vb), free(ob);

    /* 3. A budget of exactly the workspace is enough; one byte less is not.
     *    Kernels keep their workspace in the ctx's grow-only scratch arena
     *    (counted in in_use) until dhsa_ctx_trim, so each backend starts from
     *    a trimmed ctx: then the call's peak is exactly the workspace, in_use
     *    stays at it, a second call allocates nothing, and trim gives it back. */
    p.mem_budget = 0;
    dhsa_ctx *ctx = NULL;
    if (dhsa_ctx_create(&p, &ctx) != DHSA_OK) {
        T_CHECK(0, "ctx_create: %s", dhsa_last_error());
        inst_free(&I);
        return;
    }
    oracle(&I, EXACT, I.ref_o, I.ref_lse);
    for (int e = 0; e < 2; e++) {
        dhsa_backend be = e ? DHSA_BACKEND_REFERENCE : DHSA_BACKEND_TILED;
        const char *bn = dhsa_backend_name(be);
        dhsa_attn_desc a = I.a;
        a.backend = be;
        dhsa_ctx_trim(ctx);
        size_t base = dhsa_ctx_mem_stats(ctx).in_use;
        T_CHECK(base == 0, "a ctx with nothing allocated holds %zu bytes after trim", base);
        size_t ws = 0;
        T_CHECK(dhsa_attn_workspace_size(ctx, &a, &ws) == DHSA_OK, "workspace_size failed");
        T_CHECK(ws > 0, "%s reports a zero workspace for Lq=Lk=256", bn);
        if (ws > 0) {
            T_CHECK(dhsa_ctx_set_budget(ctx, base + ws - 1) == DHSA_OK, "set_budget failed");
            uint64_t n0 = dhsa_ctx_mem_stats(ctx).n_allocs;
            dhsa_status st = lib_run(&I, ctx, be);
            T_CHECK(st == DHSA_ERR_MEMORY_BUDGET,
                    "%s with a budget one byte below its workspace (%zu) returned %s", bn, ws,
                    dhsa_status_str(st));
            T_CHECK(all_bytes(I.o.buf, I.o.nbytes, 0xA5), "%s refused but wrote o", bn);
            dhsa_mem_stats s1 = dhsa_ctx_mem_stats(ctx);
            T_CHECK(s1.in_use == base && s1.n_allocs == n0,
                    "%s refused by the budget but allocated (in_use %zu, n_allocs +%llu)", bn,
                    s1.in_use, (unsigned long long)(s1.n_allocs - n0));
        }
        T_CHECK(dhsa_ctx_set_budget(ctx, base + ws) == DHSA_OK, "set_budget failed");
        dhsa_ctx_reset_peak(ctx);
        uint64_t n0 = dhsa_ctx_mem_stats(ctx).n_allocs;
        check_backend(&I, ctx, be); /* must succeed with exactly the workspace */
        dhsa_mem_stats s = dhsa_ctx_mem_stats(ctx);
        T_CHECK(s.peak >= base + ws, "%s: peak %zu below in_use %zu + workspace %zu", bn, s.peak,
                base, ws);
        T_CHECK(s.peak <= base + ws, "%s: peak %zu above in_use %zu + workspace %zu", bn, s.peak,
                base, ws);
        T_CHECK(s.in_use == base + ws, "%s: in_use %zu after the call, want %zu + %zu (scratch kept)",
                bn, s.in_use, base, ws);
        T_CHECK(ws == 0 || s.n_allocs > n0, "%s: workspace not allocated through the ctx", bn);
        /* the same call again reuses the arena */
        check_backend(&I, ctx, be);
        dhsa_mem_stats s2 = dhsa_ctx_mem_stats(ctx);
        T_CHECK(s2.in_use == s.in_use && s2.peak == s.peak && s2.n_allocs == s.n_allocs,
                "%s: a repeated call grew the ctx (in_use %zu -> %zu, n_allocs %llu -> %llu)", bn,
                s.in_use, s2.in_use, (unsigned long long)s.n_allocs,
                (unsigned long long)s2.n_allocs);
        dhsa_ctx_trim(ctx);
        T_CHECK(dhsa_ctx_mem_stats(ctx).in_use == base, "%s: in_use %zu after trim, want %zu", bn,
                dhsa_ctx_mem_stats(ctx).in_use, base);
        T_CHECK(dhsa_ctx_set_budget(ctx, 0) == DHSA_OK, "set_budget(0) failed");
    }
    dhsa_ctx_free(ctx);
    inst_free(&I);
}

/* check_finite: NaN/Inf in q, k or v fail with DHSA_ERR_NONFINITE, nothing
 * written; the NaN padding outside the views must not count. */
static void test_check_finite(void) {
    static const dhsa_type types[2] = {DHSA_F32, DHSA_F16};
    for (int t = 0; t < 2; t++) {
        spec sp = {.tag = "check-finite", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 40, .Lk = 50, .d = 64,
                   .tq = types[t], .tk = types[t], .tv = types[t], .lq = LAY_PAD, .lk = LAY_DIM2,
                   .lv = LAY_PAD, .causal = 1};
        inst I;
        inst_init(&I, &sp);
        oracle(&I, EXACT, I.ref_o, I.ref_lse);
        I.a.check_finite = 1;
        check_backend(&I, g_ctx, DHSA_BACKEND_TILED); /* padding is NaN: must pass */
        check_backend(&I, g_ctx, DHSA_BACKEND_REFERENCE);
        static const struct { int which; double bad; const char *what; } planted[] = {
            {0, NAN, "NaN in q"}, {1, INFINITY, "+inf in k"}, {2, -INFINITY, "-inf in v"}};
        for (int k = 0; k < 3; k++) {
            tbuf *tb = planted[k].which == 0 ? &I.q : planted[k].which == 1 ? &I.k : &I.v;
            int64_t off = tb_off(tb, 1, 1, 7, 3);
            unsigned char save[4];
            size_t es = elem_size(tb->t.type);
            memcpy(save, tb->buf + off * (int64_t)es, es);
            store_elem(tb->buf, tb->t.type, off, planted[k].bad);
            for (int e = 0; e < 2; e++) {
                dhsa_backend be = e ? DHSA_BACKEND_REFERENCE : DHSA_BACKEND_TILED;
                dhsa_status st = lib_run(&I, g_ctx, be);
                T_CHECK(st == DHSA_ERR_NONFINITE, "%s %s (%s) with check_finite: %s, want NONFINITE",
                        dhsa_backend_name(be), planted[k].what, tname(types[t]), dhsa_status_str(st));
                T_CHECK(dhsa_last_error()[0] != '\0', "NONFINITE without a sentence");
                T_CHECK(all_bytes(I.o.buf, I.o.nbytes, 0xA5) && all_bytes(I.lse.buf, I.lse.nbytes, 0xA5),
                        "%s: %s rejected but o or lse written", dhsa_backend_name(be), planted[k].what);
            }
            memcpy(tb->buf + off * (int64_t)es, save, es);
        }
        inst_free(&I);
    }
}

/* REFERENCE refuses above reference_max_bytes (DHSA_ERR_TOO_LARGE). */
static void test_reference_cap(void) {
    spec sp = {.tag = "ref-cap", .Hq = 2, .Lq = 64, .Lk = 64, .d = 8};
    inst I;
    inst_init(&I, &sp);
    oracle(&I, EXACT, I.ref_o, I.ref_lse);
    I.a.reference_max_bytes = 64;
    dhsa_status st = lib_run(&I, g_ctx, DHSA_BACKEND_REFERENCE);
    T_CHECK(st == DHSA_ERR_TOO_LARGE, "REFERENCE with reference_max_bytes=64 returned %s",
            dhsa_status_str(st));
    T_CHECK(dhsa_last_error()[0] != '\0', "TOO_LARGE without a sentence");
    T_CHECK(all_bytes(I.o.buf, I.o.nbytes, 0xA5) && all_bytes(I.lse.buf, I.lse.nbytes, 0xA5),
            "REFERENCE refused by its cap but wrote o or lse");
    check_backend(&I, g_ctx, DHSA_BACKEND_TILED); /* the cap is REFERENCE's only */
    I.a.reference_max_bytes = (size_t)1 << 30;
    check_backend(&I, g_ctx, DHSA_BACKEND_REFERENCE);
    I.a.reference_max_bytes = 0; /* default 1 GiB */
    check_backend(&I, g_ctx, DHSA_BACKEND_REFERENCE);
    inst_free(&I);
}

/* ------------------------------------------------------------------------ */
/* Descriptor defaults and backend selection */

static void test_desc_and_backends(void) {
    dhsa_attn_desc a = dhsa_attn_default_desc();
    T_CHECK(a.q.data == NULL && a.k.data == NULL && a.v.data == NULL && a.o.data == NULL &&
                a.lse.data == NULL && a.attn_mask.data == NULL && a.key_mask == NULL &&
                a.key_bias == NULL,
            "default descriptor has a tensor or mask set");
    T_CHECK(a.scale == 0 && a.softcap == 0 && a.causal == 0 && a.q_pos0 == 0 && a.window == 0 &&
                a.key_mask_polarity == DHSA_MASK_NO_POLARITY && a.reference_max_bytes == 0 &&
                a.key_mask_batch_stride == 0 && a.key_bias_batch_stride == 0 && a.check_finite == 0,
            "default descriptor sets a parameter");
    T_CHECK(a.backend == DHSA_BACKEND_AUTO, "default backend %d, want AUTO", (int)a.backend);

    const char *n0 = dhsa_backend_name(DHSA_BACKEND_AUTO), *n1 = dhsa_backend_name(DHSA_BACKEND_TILED),
               *n2 = dhsa_backend_name(DHSA_BACKEND_REFERENCE);
    T_CHECK(n0 && n1 && n2 && n0[0] && n1[0] && n2[0] && strcmp(n0, n1) && strcmp(n1, n2) &&
                strcmp(n0, n2),
            "backend names empty or not distinct");
    T_CHECK(dhsa_attn_resolve_backend(DHSA_BACKEND_TILED) == DHSA_BACKEND_TILED &&
                dhsa_attn_resolve_backend(DHSA_BACKEND_REFERENCE) == DHSA_BACKEND_REFERENCE,
            "explicit backends do not resolve to themselves");
    const char *env = getenv("DHSA_ATTN");
    if (env && env[0]) {
        T_SKIP(6, "DHSA_ATTN=%s set: AUTO resolution not checked", env);
        return;
    }
    T_CHECK(dhsa_attn_resolve_backend(DHSA_BACKEND_AUTO) == DHSA_BACKEND_TILED,
            "AUTO resolves to %s without DHSA_ATTN, want TILED",
            dhsa_backend_name(dhsa_attn_resolve_backend(DHSA_BACKEND_AUTO)));
    /* AUTO gives TILED's bytes */
    spec sp = {.tag = "auto", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 100, .Lk = 100, .d = 64, .causal = 1};
    inst I;
    inst_init(&I, &sp);
    oracle(&I, EXACT, I.ref_o, I.ref_lse);
    if (check_backend(&I, g_ctx, DHSA_BACKEND_TILED)) {
        unsigned char *o1 = malloc(I.o.nbytes);
        memcpy(o1, I.o.buf, I.o.nbytes);
        dhsa_status st = lib_run(&I, g_ctx, DHSA_BACKEND_AUTO);
        T_CHECK(st == DHSA_OK && memcmp(o1, I.o.buf, I.o.nbytes) == 0,
                "AUTO output differs from TILED (status %s)", dhsa_status_str(st));
        free(o1);
    }
    inst_free(&I);
}

int main(void) {
    dhsa_ctx_params p = dhsa_ctx_default_params();
    if (dhsa_ctx_create(&p, &g_ctx) != DHSA_OK || !g_ctx) {
        T_CHECK(0, "ctx_create(defaults): %s", dhsa_last_error());
        return t_report("test_attn_api");
    }
    printf("test_attn_api: %d threads, active ISA %s\n", dhsa_ctx_n_threads(g_ctx), dhsa_isa_name(dhsa_active_isa()));
    test_desc_and_backends();
    test_errors();
    test_reference_cap();
    test_memory();
    test_check_finite();

    dhsa_ctx_free(g_ctx);
    return t_report("test_attn_api");
}
