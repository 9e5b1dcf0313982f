/* test_attn.c: dhsa_attention against the double oracle of attn_t.h: the
 * numeric cases (grid of shapes, Lq != Lk, masks and polarities,
 * positions, all-masked rows, types and strides, long sequences, split-K
 * decode) on every ISA the machine has, the comparator and the oracles
 * shown to fail on wrong data, bitwise equality across thread counts.
 *
 * Run: make build/tests/test_attn && build/tests/test_attn
 * (or `make test`). Ends with "test_attn: P passed, F failed, S skipped".
 */

#include "attn_t.h"

/* ------------------------------------------------------------------------ */
/* The comparator must be able to fail (STYLE 7). */

static void test_comparator_fails(void) {
    spec sp = {.tag = "comparator", .B = 2, .Hq = 2, .Lq = 20, .Lk = 20, .d = 8,
               .km = KM_B0ALL, .pol = DHSA_MASK_TRUE_IGNORES};
    inst I;
    inst_init(&I, &sp);
    oracle(&I, EXACT, I.ref_o, I.ref_lse);
    int64_t n = I.s.B * I.s.Hq * I.R * I.s.dv, nr = I.s.B * I.s.Hq * I.R;
    tol_t t = tol_o(DHSA_BACKEND_TILED, DHSA_F32);
    T_CHECK(count_masked_rows(&I) == I.s.Hq * I.R, "batch 0 fully ignored should mask %lld rows",
            (long long)(I.s.Hq * I.R));

    memcpy(I.got_o, I.ref_o, (size_t)n * sizeof(double));
    cmp_t c = compare(I.got_o, I.ref_o, I.ref_lse, 2, 2, I.R, I.s.dv, I.rows, t);
    T_CHECK(c.ok, "comparator rejects the oracle's own output");

    /* one element of a live row (batch 1) off by 1e-3 */
    int64_t x = ((1 * 2 + 1) * I.R + 13) * I.s.dv + 5;
    I.got_o[x] += 1e-3;
    c = compare(I.got_o, I.ref_o, I.ref_lse, 2, 2, I.R, I.s.dv, I.rows, t);
    T_CHECK(!c.ok && c.n_bad == 1, "comparator misses a 1e-3 error in one element");
    T_CHECK(c.at[0] == 1 && c.at[1] == 1 && c.at[2] == 13 && c.at[3] == 5,
            "comparator reports the worst element at (%lld,%lld,%lld,%lld), want (1,1,13,5)",
            (long long)c.at[0], (long long)c.at[1], (long long)c.at[2], (long long)c.at[3]);
    I.got_o[x] = NAN;
    c = compare(I.got_o, I.ref_o, I.ref_lse, 2, 2, I.R, I.s.dv, I.rows, t);
    T_CHECK(!c.ok, "comparator accepts a NaN");
    I.got_o[x] = I.ref_o[x];
    /* a masked row (batch 0) that is tiny but not exactly 0 */
    I.got_o[3 * I.s.dv + 2] = 1e-30;
    c = compare(I.got_o, I.ref_o, I.ref_lse, 2, 2, I.R, I.s.dv, I.rows, t);
    T_CHECK(!c.ok, "comparator accepts o = 1e-30 on a row with no allowed key");
    I.got_o[3 * I.s.dv + 2] = 0;
    /* lse: finite where -inf is due, and -inf where a finite value is due */
    memcpy(I.got_lse, I.ref_lse, (size_t)nr * sizeof(double));
    I.got_lse[0] = -1e30;
    c = compare(I.got_lse, I.ref_lse, NULL, 2, 2, I.R, 1, I.rows, tol_lse(DHSA_BACKEND_TILED));
    T_CHECK(!c.ok, "comparator accepts a finite lse where -inf is due");
    I.got_lse[0] = -INFINITY;
    I.got_lse[nr - 1] = -INFINITY;
    c = compare(I.got_lse, I.ref_lse, NULL, 2, 2, I.R, 1, I.rows, tol_lse(DHSA_BACKEND_TILED));
    T_CHECK(!c.ok, "comparator accepts lse = -inf where a finite value is due");
    /* NMSE alone: every element within a loose bound but the total too large */
    memcpy(I.got_o, I.ref_o, (size_t)n * sizeof(double));
    for (int64_t k = n / 2; k < n; k++) I.got_o[k] *= 1.001;
    tol_t loose = {1, 1, 1e-12};
    c = compare(I.got_o, I.ref_o, I.ref_lse, 2, 2, I.R, I.s.dv, I.rows, loose);
    T_CHECK(!c.ok && c.n_bad == 0, "comparator ignores the NMSE bound");
    inst_free(&I);
}

/* Library output against deliberately wrong oracles: must NOT match. This
 * also proves the cases are sensitive to what they claim to test. */
static void test_wrong_oracles(void) {
    spec sp = {.tag = "wrong-oracle", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 100, .Lk = 100, .d = 64,
               .km = KM_RANDOM, .pol = DHSA_MASK_TRUE_IGNORES, .causal = 1, .softcap = 5,
               .sigma = 2.5};
    inst I;
    inst_init(&I, &sp);
    oracle(&I, EXACT, I.ref_o, I.ref_lse);
    if (!check_backend(&I, g_ctx, DHSA_BACKEND_TILED)) { inst_free(&I); return; }
    int64_t no = I.s.B * I.s.Hq * I.R * I.s.dv;
    double *wrong_o = xcalloc((size_t)no, sizeof(double));
    double *wrong_lse = xcalloc((size_t)(I.s.B * I.s.Hq * I.R), sizeof(double));
    tol_t t = tol_o(DHSA_BACKEND_TILED, DHSA_F32);
    static const struct { oracle_opts op; const char *what; } wrong[] = {
        {{1, 1.0, 0}, "the opposite mask polarity"},
        {{0, 1.01, 0}, "a scale 1% off"},
        {{0, 1.0, 1}, "no softcap (softcap 5 must matter at these scores)"},
    };
    for (size_t w = 0; w < sizeof wrong / sizeof wrong[0]; w++) {
        oracle(&I, wrong[w].op, wrong_o, wrong_lse);
        cmp_t c = compare(I.got_o, wrong_o, wrong_lse, I.s.B, I.s.Hq, I.R, I.s.dv, I.rows, t);
        T_CHECK(!c.ok, "TILED output matches an oracle with %s [%s]", wrong[w].what, I.desc);
    }
    free(wrong_o);
    free(wrong_lse);
    inst_free(&I);
}

/* ------------------------------------------------------------------------ */
/* Shapes: L x d x GQA grid at small L, long sequences, Lq != Lk */

static void test_grid(void) {
    static const int64_t Ls[] = {1, 7, 63, 64, 65};
    static const int64_t ds[] = {8, 64, 80, 128};
    static const int64_t gs[] = {1, 2, 4, 8};
    int n = 0;
    for (size_t a = 0; a < 5; a++)
        for (size_t b = 0; b < 4; b++)
            for (size_t g = 0; g < 4; g++, n++) {
                int64_t hkv = gs[g] == 8 ? 1 : 2;
                spec sp = {.tag = "grid", .B = n % 3 == 0 ? 2 : 1, .Hq = hkv * gs[g], .Hkv = hkv,
                           .Lq = Ls[a], .Lk = Ls[a], .d = ds[b], .causal = n & 1,
                           .lse = n % 5 == 0 ? LSE_BLHD : LSE_BHLD, .seed = 1000 + (uint64_t)n};
                run_spec(&sp);
            }
    /* d and dv that no vector width divides */
    static const int64_t odd[][2] = {{1, 1}, {3, 5}, {17, 17}, {33, 7}};
    for (int k = 0; k < 4; k++) {
        spec sp = {.tag = "odd-d", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 70, .Lk = 70, .d = odd[k][0],
                   .dv = odd[k][1], .causal = k & 1, .seed = 77 + (uint64_t)k};
        run_spec(&sp);
    }
}

static void test_long(void) {
    /* L = 1000 and 4097: the oracle only on sampled rows (it is O(L^2 d)). */
    run_spec(&(spec){.tag = "L1000", .Hq = 2, .Hkv = 2, .Lq = 1000, .Lk = 1000, .d = 80,
                     .km = KM_RANDOM, .pol = DHSA_MASK_TRUE_IGNORES, .rows = 64});
    run_spec(&(spec){.tag = "L4097", .Hq = 1, .Lq = 4097, .Lk = 4097, .d = 8, .kb = KB_ALIBI,
                     .rows = 64});
    run_spec(&(spec){.tag = "L1000", .Hq = 4, .Hkv = 1, .Lq = 1000, .Lk = 1000, .d = 64,
                     .causal = 1, .rows = 96, .noref = 1});
    run_spec(&(spec){.tag = "L1000", .Hq = 8, .Hkv = 2, .Lq = 1000, .Lk = 1000, .d = 128,
                     .causal = 1, .window = 100, .rows = 32, .noref = 1});
    run_spec(&(spec){.tag = "L4097", .Hq = 1, .Lq = 4097, .Lk = 4097, .d = 64, .causal = 1,
                     .rows = 64, .noref = 1});
}

static void test_lq_ne_lk(void) {
    /* decode: one query at the end of a 1000-key cache */
    run_spec(&(spec){.tag = "decode", .B = 2, .Hq = 8, .Hkv = 2, .Lq = 1, .Lk = 1000,
                     .q_pos0 = 999, .d = 128, .causal = 1, .km = KM_RANDOM,
                     .pol = DHSA_MASK_TRUE_IGNORES});
    run_spec(&(spec){.tag = "decode-window", .Hq = 4, .Hkv = 4, .Lq = 1, .Lk = 1000,
                     .q_pos0 = 999, .d = 64, .causal = 1, .window = 100});
    run_spec(&(spec){.tag = "decode-noncausal", .Hq = 4, .Hkv = 1, .Lq = 1, .Lk = 1000,
                     .q_pos0 = 999, .d = 80});
    /* chunked prefill: 37 new queries after 163 cached keys */
    run_spec(&(spec){.tag = "chunked-prefill", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 37, .Lk = 200,
                     .q_pos0 = 163, .d = 64, .causal = 1});
    run_spec(&(spec){.tag = "chunked-prefill", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 37, .Lk = 200,
                     .q_pos0 = 163, .d = 64, .causal = 1, .window = 16, .km = KM_SUFFIX,
                     .pol = DHSA_MASK_TRUE_IGNORES});
    /* Decode-sized tiles (Lq * Hq/Hkv <= 8 queries) take their own narrow
     * kernels: F16/BF16 caches, strided views, dv != d, masks there too. */
    run_spec(&(spec){.tag = "decode-f16-cache", .B = 2, .Hq = 8, .Hkv = 2, .Lq = 1, .Lk = 777,
                     .q_pos0 = 776, .d = 128, .dv = 80, .tk = DHSA_F16, .tv = DHSA_F16,
                     .causal = 1, .km = KM_RANDOM, .pol = DHSA_MASK_TRUE_KEEPS});
    run_spec(&(spec){.tag = "decode-bf16-strided", .Hq = 6, .Hkv = 2, .Lq = 2, .Lk = 300,
                     .q_pos0 = 298, .d = 80, .dv = 50, .tq = DHSA_BF16, .tk = DHSA_BF16,
                     .tv = DHSA_BF16, .lk = LAY_DIM2, .lv = LAY_PAD, .lo = LAY_PAD, .causal = 1,
                     .softcap = 20, .kb = KB_ALIBI});
    run_spec(&(spec){.tag = "decode-f16-5-queries-wide", .Hq = 10, .Hkv = 2, .Lq = 1, .Lk = 333, .q_pos0 = 332,
                     .d = 200, .dv = 70, .tk = DHSA_F16, .tv = DHSA_F16, .causal = 1});
    run_spec(&(spec){.tag = "decode-bf16-contiguous", .Hq = 12, .Hkv = 4, .Lq = 2, .Lk = 130, .q_pos0 = 128,
                     .d = 40, .dv = 24, .tk = DHSA_BF16, .tv = DHSA_BF16, .causal = 1});
    run_spec(&(spec){.tag = "decode-wide-d", .Hq = 4, .Hkv = 2, .Lq = 1, .Lk = 500, .q_pos0 = 499,
                     .d = 160, .dv = 50, .causal = 1});
    run_spec(&(spec){.tag = "decode-f16-d64-4-queries", .B = 2, .Hq = 8, .Hkv = 2, .Lq = 1, .Lk = 777,
                     .q_pos0 = 776, .d = 64, .tk = DHSA_F16, .tv = DHSA_F16, .causal = 1});
    run_spec(&(spec){.tag = "decode-bf16-d64-2-queries", .Hq = 4, .Hkv = 2, .Lq = 1, .Lk = 517, .q_pos0 = 516,
                     .d = 64, .tk = DHSA_BF16, .tv = DHSA_BF16, .lk = LAY_DIM2, .causal = 1, .window = 200});
    run_spec(&(spec){.tag = "decode-f16-d64-1-query", .Hq = 3, .Hkv = 3, .Lq = 1, .Lk = 401, .q_pos0 = 400,
                     .d = 64, .tk = DHSA_F16, .tv = DHSA_F16, .causal = 1, .km = KM_RANDOM,
                     .pol = DHSA_MASK_TRUE_KEEPS});
    run_spec(&(spec){.tag = "decode-mqa", .Hq = 8, .Hkv = 1, .Lq = 1, .Lk = 1000, .q_pos0 = 999,
                     .d = 64, .causal = 1, .window = 300, .am = AM_FULL, .to = DHSA_F16});
    run_spec(&(spec){.tag = "decode-8-columns", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 4, .Lk = 129,
                     .q_pos0 = 125, .d = 17, .dv = 33, .causal = 1, .km = KM_B0ALL,
                     .pol = DHSA_MASK_TRUE_IGNORES});
    run_spec(&(spec){.tag = "decode-3-rows", .Hq = 1, .Lq = 3, .Lk = 64, .q_pos0 = 61, .d = 8,
                     .causal = 1, .kb = KB_SHIFT});
    run_spec(&(spec){.tag = "Lq>Lk", .Hq = 2, .Lq = 100, .Lk = 7, .d = 8});
    run_spec(&(spec){.tag = "Lq>Lk-causal", .Hq = 2, .Lq = 130, .Lk = 65, .d = 64, .causal = 1});
    run_spec(&(spec){.tag = "Lq<Lk-window", .Hq = 2, .Hkv = 1, .Lq = 65, .Lk = 130, .q_pos0 = 65,
                     .d = 80, .causal = 1, .window = 64});
}

/* ------------------------------------------------------------------------ */
/* Masks, biases, positions */

static void test_masks(void) {
    const dhsa_mask_polarity IG = DHSA_MASK_TRUE_IGNORES, KE = DHSA_MASK_TRUE_KEEPS;
#define MASK_BASE .B = 2, .Hq = 4, .Hkv = 2, .Lq = 130, .Lk = 130, .d = 64
    run_spec(&(spec){.tag = "key-mask", MASK_BASE, .km = KM_RANDOM, .pol = IG});
    run_spec(&(spec){.tag = "key-mask", MASK_BASE, .km = KM_RANDOM, .pol = KE});
    /* whole leading tiles ignored: the online softmax starts from -inf */
    run_spec(&(spec){.tag = "key-mask", MASK_BASE, .km = KM_PREFIX, .pol = IG});
    run_spec(&(spec){.tag = "key-mask", MASK_BASE, .km = KM_PREFIX, .pol = KE});
    run_spec(&(spec){.tag = "key-mask", MASK_BASE, .km = KM_SUFFIX, .pol = IG, .causal = 1});
    run_spec(&(spec){.tag = "key-mask-bcast", MASK_BASE, .km = KM_RANDOM, .pol = IG, .km_bstride = -1});
    run_spec(&(spec){.tag = "key-mask-bcast", MASK_BASE, .km = KM_PREFIX, .pol = KE, .km_bstride = -1});
    run_spec(&(spec){.tag = "key-mask-stride", MASK_BASE, .km = KM_RANDOM, .pol = KE, .km_bstride = 3});

    run_spec(&(spec){.tag = "key-bias", MASK_BASE, .kb = KB_RANDOM});
    run_spec(&(spec){.tag = "key-bias", MASK_BASE, .kb = KB_ALIBI, .causal = 1});
    run_spec(&(spec){.tag = "key-bias", MASK_BASE, .kb = KB_SHIFT});
    run_spec(&(spec){.tag = "key-bias-bcast", MASK_BASE, .kb = KB_ALIBI, .kb_bstride = -1});
    run_spec(&(spec){.tag = "key-bias-stride", MASK_BASE, .kb = KB_RANDOM, .kb_bstride = 5});

    run_spec(&(spec){.tag = "attn-mask", MASK_BASE, .am = AM_FULL});
    run_spec(&(spec){.tag = "attn-mask", MASK_BASE, .am = AM_B1, .am_rowinf = 1});
    run_spec(&(spec){.tag = "attn-mask", MASK_BASE, .am = AM_H1, .causal = 1});
    run_spec(&(spec){.tag = "attn-mask", MASK_BASE, .am = AM_B1H1, .am_rowinf = 1});
    run_spec(&(spec){.tag = "attn-mask", .B = 3, .Hq = 2, .Lq = 37, .Lk = 200, .q_pos0 = 163,
                     .d = 8, .am = AM_FULL, .causal = 1});

    /* everything at once */
    run_spec(&(spec){.tag = "all-features", .B = 3, .Hq = 8, .Hkv = 2, .Lq = 150, .Lk = 170,
                     .q_pos0 = 20, .d = 80, .dv = 48, .causal = 1, .window = 50, .softcap = 20,
                     .scale = 0.15f, .km = KM_RANDOM, .pol = KE, .km_bstride = 2,
                     .kb = KB_ALIBI, .am = AM_H1, .am_rowinf = 1, .lse = LSE_BLHD});
#undef MASK_BASE
}

/* A mask m read as TRUE_IGNORES keeps exactly the keys that !m read as
 * TRUE_KEEPS keeps: outputs are bitwise equal. m as TRUE_KEEPS differs. */
static void test_polarity(void) {
    static const uint8_t nonzero[4] = {1, 7, 0x80, 0xFF};
    spec sp = {.tag = "polarity", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 150, .Lk = 150, .d = 64,
               .km = KM_RANDOM, .pol = DHSA_MASK_TRUE_IGNORES, .causal = 1};
    inst I;
    inst_init(&I, &sp);
    int64_t n = (I.s.B - 1) * I.km_bs + I.s.Lk;
    uint8_t *m = malloc((size_t)n);
    memcpy(m, I.km, (size_t)n);
    size_t ob = I.o.nbytes, lb = I.lse.nbytes;
    unsigned char *o1 = malloc(ob), *l1 = malloc(lb);
    static const dhsa_backend bes[2] = {DHSA_BACKEND_TILED, DHSA_BACKEND_REFERENCE};
    for (int e = 0; e < 2; e++) {
        const char *bn = dhsa_backend_name(bes[e]);
        memcpy(I.km, m, (size_t)n);
        I.s.pol = I.a.key_mask_polarity = DHSA_MASK_TRUE_IGNORES;
        oracle(&I, EXACT, I.ref_o, I.ref_lse);
        if (!check_backend(&I, g_ctx, bes[e])) continue;
        memcpy(o1, I.o.buf, ob);
        memcpy(l1, I.lse.buf, lb);

        for (int64_t x = 0; x < n; x++) I.km[x] = m[x] ? 0 : nonzero[x & 3];
        I.s.pol = I.a.key_mask_polarity = DHSA_MASK_TRUE_KEEPS;
        dhsa_status st = lib_run(&I, g_ctx, bes[e]);
        T_CHECK(st == DHSA_OK && memcmp(o1, I.o.buf, ob) == 0 && memcmp(l1, I.lse.buf, lb) == 0,
                "%s: mask m with TRUE_IGNORES and !m with TRUE_KEEPS differ (status %s) [%s]", bn,
                dhsa_status_str(st), I.desc);

        memcpy(I.km, m, (size_t)n);
        st = lib_run(&I, g_ctx, bes[e]);
        T_CHECK(st == DHSA_OK && memcmp(o1, I.o.buf, ob) != 0,
                "%s: the same mask bytes with TRUE_KEEPS give the TRUE_IGNORES result [%s]", bn,
                I.desc);
        oracle(&I, EXACT, I.ref_o, I.ref_lse);
        check_backend(&I, g_ctx, bes[e]);
    }
    free(m), free(o1), free(l1);
    inst_free(&I);
}

static void test_positions(void) {
    /* causal, q_pos0 > 0, windows 1 / 16 / 100 / > L, with and without causal */
    run_spec(&(spec){.tag = "causal", .B = 2, .Hq = 2, .Lq = 200, .Lk = 200, .d = 64, .causal = 1});
    run_spec(&(spec){.tag = "causal-qpos0", .Hq = 4, .Hkv = 2, .Lq = 100, .Lk = 100,
                     .q_pos0 = 10, .d = 64, .causal = 1});
    static const int64_t wins[] = {1, 16, 100, 5000};
    for (int w = 0; w < 4; w++)
        for (int causal = 0; causal < 2; causal++)
            run_spec(&(spec){.tag = "window", .Hq = 2, .Hkv = 1, .Lq = 200, .Lk = 200,
                             .d = w & 1 ? 8 : 64, .causal = causal, .window = wins[w],
                             .q_pos0 = causal ? 0 : 30});
    /* softcap: scores with std ~6 (sigma 2.5), so both caps matter */
    run_spec(&(spec){.tag = "softcap", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 130, .Lk = 130, .d = 64,
                     .softcap = 30, .sigma = 2.5});
    run_spec(&(spec){.tag = "softcap", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 130, .Lk = 130, .d = 64,
                     .softcap = 5, .sigma = 2.5, .causal = 1});
    run_spec(&(spec){.tag = "softcap+bias", .Hq = 2, .Lq = 65, .Lk = 65, .d = 8, .softcap = 5,
                     .sigma = 2.5, .kb = KB_RANDOM, .am = AM_FULL});
    /* custom scale */
    run_spec(&(spec){.tag = "scale", .Hq = 2, .Lq = 100, .Lk = 100, .d = 64, .scale = 0.05f});
    run_spec(&(spec){.tag = "scale", .Hq = 2, .Lq = 100, .Lk = 100, .d = 64, .scale = 0.3f,
                     .causal = 1});
    run_spec(&(spec){.tag = "scale+softcap", .Hq = 2, .Lq = 100, .Lk = 100, .d = 80,
                     .scale = 1.0f, .softcap = 5, .sigma = 0.6});
}

/* Rows with no allowed key: o exactly 0, lse = -inf, no NaN. */
static void test_all_masked(void) {
    static const spec cases[] = {
        {.tag = "masked:key-mask-batch0", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 70, .Lk = 70, .d = 64,
         .km = KM_B0ALL, .pol = DHSA_MASK_TRUE_IGNORES},
        {.tag = "masked:key-mask-batch0", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 70, .Lk = 70, .d = 64,
         .km = KM_B0ALL, .pol = DHSA_MASK_TRUE_KEEPS, .causal = 1},
        {.tag = "masked:key-bias-batch0", .B = 2, .Hq = 2, .Lq = 70, .Lk = 70, .d = 8,
         .kb = KB_B0INF},
        {.tag = "masked:attn-mask-row", .B = 2, .Hq = 2, .Lq = 70, .Lk = 140, .d = 64,
         .am = AM_B1H1, .am_rowinf = 1},
        {.tag = "masked:window-beyond-keys", .Hq = 2, .Lq = 8, .Lk = 40, .q_pos0 = 60, .d = 64,
         .causal = 1, .window = 16},
        {.tag = "masked:window-partly", .B = 2, .Hq = 2, .Lq = 12, .Lk = 40, .q_pos0 = 50,
         .d = 80, .causal = 1, .window = 16, .lse = LSE_BLHD},
        {.tag = "masked:f16-out", .B = 2, .Hq = 2, .Lq = 20, .Lk = 70, .d = 8, .to = DHSA_F16,
         .km = KM_B0ALL, .pol = DHSA_MASK_TRUE_IGNORES},
        /* an empty key set (decode with an empty cache): every row has no key */
        {.tag = "masked:Lk=0", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 5, .Lk = 0, .d = 64},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        inst I;
        inst_init(&I, &cases[c]);
        oracle(&I, EXACT, I.ref_o, I.ref_lse);
        T_CHECK(count_masked_rows(&I) > 0, "[%s] has no fully masked row", I.desc);
        check_backend(&I, g_ctx, DHSA_BACKEND_TILED);
        check_backend(&I, g_ctx, DHSA_BACKEND_REFERENCE);
        inst_free(&I);
    }
}

/* ------------------------------------------------------------------------ */
/* Types, strides, batches */

static void test_types_strides(void) {
    const dhsa_type F32 = DHSA_F32, F16 = DHSA_F16, B16 = DHSA_BF16;
    /* dv != d */
    run_spec(&(spec){.tag = "dv", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 100, .Lk = 100, .d = 64, .dv = 32,
                     .causal = 1});
    run_spec(&(spec){.tag = "dv", .Hq = 2, .Lq = 100, .Lk = 100, .d = 8, .dv = 80,
                     .km = KM_RANDOM, .pol = DHSA_MASK_TRUE_KEEPS});
    /* F16 / BF16 inputs and outputs */
    run_spec(&(spec){.tag = "f16-in", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 130, .Lk = 130, .d = 80,
                     .tq = F16, .tk = F16, .tv = F16, .causal = 1});
    run_spec(&(spec){.tag = "bf16-in", .B = 2, .Hq = 4, .Hkv = 1, .Lq = 65, .Lk = 65, .d = 64,
                     .tq = B16, .tk = B16, .tv = B16, .km = KM_RANDOM,
                     .pol = DHSA_MASK_TRUE_IGNORES});
    run_spec(&(spec){.tag = "mixed-in", .Hq = 2, .Lq = 70, .Lk = 70, .d = 128, .tq = F16,
                     .tk = B16, .tv = F32, .kb = KB_RANDOM});
    run_spec(&(spec){.tag = "f16-out", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 130, .Lk = 130, .d = 64,
                     .to = F16, .causal = 1});
    run_spec(&(spec){.tag = "bf16-out", .Hq = 2, .Lq = 65, .Lk = 65, .d = 8, .to = B16});
    run_spec(&(spec){.tag = "f16-all", .Hq = 4, .Hkv = 2, .Lq = 37, .Lk = 200, .q_pos0 = 163,
                     .d = 64, .tq = F16, .tk = F16, .tv = F16, .to = F16, .causal = 1,
                     .km = KM_RANDOM, .pol = DHSA_MASK_TRUE_IGNORES});
    run_spec(&(spec){.tag = "bf16-all", .Hq = 2, .Lq = 100, .Lk = 100, .d = 80, .dv = 32,
                     .tq = B16, .tk = B16, .tv = B16, .to = B16, .softcap = 5, .sigma = 2.5});
    /* strided views */
    run_spec(&(spec){.tag = "batch-first", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 100, .Lk = 100,
                     .d = 64, .lq = LAY_BLHD, .lk = LAY_BLHD, .lv = LAY_BLHD, .lo = LAY_BLHD,
                     .lse = LSE_BLHD, .causal = 1});
    run_spec(&(spec){.tag = "padded", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 100, .Lk = 120,
                     .q_pos0 = 20, .d = 80, .lq = LAY_PAD, .lk = LAY_PAD, .lv = LAY_DIM2,
                     .lo = LAY_PAD, .causal = 1, .km = KM_RANDOM, .pol = DHSA_MASK_TRUE_IGNORES});
    run_spec(&(spec){.tag = "dim-stride-2", .B = 2, .Hq = 2, .Hkv = 1, .Lq = 65, .Lk = 65, .d = 64,
                     .dv = 32, .lq = LAY_DIM2, .lk = LAY_DIM2, .lv = LAY_PAD, .lo = LAY_DIM2});
    run_spec(&(spec){.tag = "strided-f16", .B = 2, .Hq = 4, .Hkv = 1, .Lq = 70, .Lk = 70, .d = 64,
                     .tq = F16, .tk = B16, .tv = F16, .to = F16, .lq = LAY_BLHD, .lk = LAY_DIM2,
                     .lv = LAY_PAD, .lo = LAY_PAD, .lse = LSE_BLHD});
    /* B > 1 with per-batch key masks */
    run_spec(&(spec){.tag = "batches", .B = 3, .Hq = 4, .Hkv = 2, .Lq = 90, .Lk = 90, .d = 64,
                     .km = KM_SUFFIX, .pol = DHSA_MASK_TRUE_IGNORES});
    run_spec(&(spec){.tag = "batches", .B = 3, .Hq = 2, .Lq = 90, .Lk = 90, .d = 8,
                     .km = KM_PREFIX, .pol = DHSA_MASK_TRUE_KEEPS, .kb = KB_RANDOM, .causal = 1});
}

/* ------------------------------------------------------------------------ */
/* Results do not depend on the number of threads (bitwise). */

static void test_thread_invariance(void) {
    static const spec cases[] = {
        {.tag = "threads", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 300, .Lk = 300, .d = 64, .causal = 1,
         .softcap = 20, .km = KM_RANDOM, .pol = DHSA_MASK_TRUE_IGNORES, .kb = KB_RANDOM,
         .rows = 64},
        {.tag = "threads-decode", .B = 3, .Hq = 8, .Hkv = 2, .Lq = 1, .Lk = 1000, .q_pos0 = 999,
         .d = 128, .causal = 1, .tk = DHSA_F16, .tv = DHSA_F16},
    };
    static const dhsa_backend bes[2] = {DHSA_BACKEND_TILED, DHSA_BACKEND_REFERENCE};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        inst I;
        inst_init(&I, &cases[k]);
        oracle(&I, EXACT, I.ref_o, I.ref_lse);
        unsigned char *o1 = xcalloc(I.o.nbytes, 1), *l1 = xcalloc(I.lse.nbytes, 1);
        for (int e = 0; e < 2; e++)
            for (int nt = 1; nt <= 3; nt++) {
                dhsa_ctx_params p = dhsa_ctx_default_params();
                p.n_threads = nt;
                dhsa_ctx *ctx = NULL;
                if (dhsa_ctx_create(&p, &ctx) != DHSA_OK) {
                    T_CHECK(0, "ctx_create(%d threads): %s", nt, dhsa_last_error());
                    continue;
                }
                if (check_backend(&I, ctx, bes[e]) && nt == 1) {
                    memcpy(o1, I.o.buf, I.o.nbytes);
                    memcpy(l1, I.lse.buf, I.lse.nbytes);
                } else if (nt > 1) {
                    T_CHECK(memcmp(o1, I.o.buf, I.o.nbytes) == 0 &&
                                memcmp(l1, I.lse.buf, I.lse.nbytes) == 0,
                            "%s with %d threads differs bitwise from 1 thread [%s]",
                            dhsa_backend_name(bes[e]), nt, I.desc);
                }
                dhsa_ctx_free(ctx);
            }
        free(o1), free(l1);
        inst_free(&I);
    }
}

/* ------------------------------------------------------------------------ */
/* Split-K decode (attn_tiled.c): few query rows over long keys are cut into
 * pieces by key count and merged by LSE. Hkv = 1 (gemma-3-270m's one KV
 * head) and 2, Lq = 1..4, 4100 keys (pieces of 512 keys and a short last
 * one), F32 / F16 / Q8_0 K and V, dense and with a layout of random ranges;
 * against the double reference here (its inputs are the values the library
 * reads: F16 and Q8_0 decoded by their definitions), and bitwise the same
 * with 1, 2 and 3 threads. */

typedef struct {
    int64_t Hq, Hkv, Lq, Lk, d, dv, window;
    float softcap;
    dhsa_type tkv;
    int layout; /* random key ranges per (KV head) */
} split_case;

/* Q8_0 by its definition: F16 d, then 32 int8 codes per block */
static double q8_value(const unsigned char *row, int64_t c) {
    const unsigned char *blk = row + c / 32 * 34;
    uint16_t h = (uint16_t)(blk[0] | blk[1] << 8);
    return f16_decode(h) * (double)(int8_t)blk[2 + c % 32];
}

/* x [H][L][D] random normal -> the typed buffer and the values it holds */
static void *split_fill(dhsa_type t, int64_t H, int64_t L, int64_t D, rng_t *r, double *canon) {
    const int64_t n = H * L * D;
    float *f = xcalloc((size_t)n, sizeof(float));
    for (int64_t i = 0; i < n; i++) f[i] = (float)(1.2 * rng_normal(r));
    if (t == DHSA_F32) {
        for (int64_t i = 0; i < n; i++) canon[i] = f[i];
        return f;
    }
    if (t == DHSA_F16) {
        uint16_t *h = xcalloc((size_t)n, 2);
        for (int64_t i = 0; i < n; i++) h[i] = dhsa_f32_to_f16(f[i]), canon[i] = f16_decode(h[i]);
        free(f);
        return h;
    }
    const size_t rb = dhsa_type_row_bytes(DHSA_Q8_0, D);
    unsigned char *q = xcalloc((size_t)(H * L), rb);
    for (int64_t row = 0; row < H * L; row++) {
        dhsa_q8_0_quantize_row(f + row * D, q + (size_t)row * rb, D);
        for (int64_t c = 0; c < D; c++) canon[row * D + c] = q8_value(q + (size_t)row * rb, c);
    }
    free(f);
    return q;
}

/* o [Hq][Lq][dv], lse [Hq][Lq] in double; keys allowed by causality at
 * q_pos0 = Lk - Lq, the window and sel[g][key] (NULL: all). */
static void split_oracle(const split_case *c, const double *q, const double *k, const double *v,
                         const unsigned char *sel, double *o, double *lse) {
    const int64_t G = c->Hq / c->Hkv, pos0 = c->Lk - c->Lq;
    const double scale = (double)(float)(1.0 / sqrt((double)c->d));
    double *s = xcalloc((size_t)c->Lk, sizeof(double));
    for (int64_t h = 0; h < c->Hq; h++)
        for (int64_t r = 0; r < c->Lq; r++) {
            const int64_t g = h / G, pos = pos0 + r;
            const double *qr = q + (h * c->Lq + r) * c->d;
            double mx = -INFINITY;
            for (int64_t j = 0; j < c->Lk; j++) {
                int ok = j <= pos && (c->window == 0 || j > pos - c->window) && (!sel || sel[g * c->Lk + j]);
                s[j] = -INFINITY;
                if (!ok) continue;
                double x = 0;
                for (int64_t e = 0; e < c->d; e++) x += qr[e] * k[(g * c->Lk + j) * c->d + e];
                x *= scale;
                if (c->softcap > 0) x = c->softcap * tanh(x / c->softcap);
                s[j] = x;
                if (x > mx) mx = x;
            }
            double sum = 0;
            double *orow = o + (h * c->Lq + r) * c->dv;
            for (int64_t e = 0; e < c->dv; e++) orow[e] = 0;
            for (int64_t j = 0; j < c->Lk; j++) {
                if (s[j] == -INFINITY) continue;
                double p = exp(s[j] - mx);
                sum += p;
                for (int64_t e = 0; e < c->dv; e++) orow[e] += p * v[(g * c->Lk + j) * c->dv + e];
            }
            for (int64_t e = 0; e < c->dv; e++) orow[e] = sum > 0 ? orow[e] / sum : 0;
            lse[h * c->Lq + r] = sum > 0 ? mx + log(sum) : -INFINITY;
        }
    free(s);
}

/* got (float) vs ref (double), n values: |a - b| <= atol + rtol |ref| */
static int split_close(const float *got, const double *ref, int64_t n, double atol, double rtol, int64_t *worst) {
    double we = -1;
    int ok = 1;
    for (int64_t i = 0; i < n; i++) {
        double err = isinf(ref[i]) ? (got[i] == ref[i] ? 0 : INFINITY) : fabs(got[i] - ref[i]);
        double ex = err / (atol + rtol * fabs(ref[i]));
        if (!(ex <= 1)) ok = 0;
        if (!(ex <= we)) we = ex, *worst = i;
    }
    return ok;
}

/* One case on the active ISA: 3 checks (the reference with 1 thread;
 * 2 and 3 threads bitwise equal to 1). Returns whether all passed. */
static int split_run(const split_case *c, dhsa_ctx *const ctxs[3], int corrupt) {
    const int64_t Lq = c->Lq, Lk = c->Lk, d = c->d, dv = c->dv, Hq = c->Hq, Hkv = c->Hkv;
    rng_t r = {0x5417 + (uint64_t)(Lq * 131 + Hkv * 7 + c->tkv * 3 + c->layout)};
    double *cq = xcalloc((size_t)(Hq * Lq * d), sizeof(double)), *ck = xcalloc((size_t)(Hkv * Lk * d), sizeof(double)),
           *cv = xcalloc((size_t)(Hkv * Lk * dv), sizeof(double));
    float *q = split_fill(DHSA_F32, Hq, Lq, d, &r, cq);
    void *k = split_fill(c->tkv, Hkv, Lk, d, &r, ck), *v = split_fill(c->tkv, Hkv, Lk, dv, &r, cv);
    float *o[3], *lse[3];
    for (int t = 0; t < 3; t++) {
        o[t] = xcalloc((size_t)(Hq * Lq * dv), sizeof(float));
        lse[t] = xcalloc((size_t)(Hq * Lq), sizeof(float));
    }
    double *ro = xcalloc((size_t)(Hq * Lq * dv), sizeof(double)), *rl = xcalloc((size_t)(Hq * Lq), sizeof(double));
    /* a layout: a sink, random ranges of 1..300 keys, the last 200 keys */
    unsigned char *sel = NULL;
    dhsa_layout *lay = NULL;
    if (c->layout) {
        sel = xcalloc((size_t)(Hkv * Lk), 1);
        T_CHECK(dhsa_layout_create(ctxs[0], 1, Hkv, Lq, Lk, 64, 64, &lay) == DHSA_OK, "layout_create: %s",
                dhsa_last_error());
        for (int64_t g = 0; lay && g < Hkv; g++) {
            int64_t rg[2 * 24], n = 0;
            rg[n++] = 0, rg[n++] = 40;
            for (int i = 0; i < 21; i++) {
                int64_t s0 = 40 + (int64_t)(rng_unif(&r) * (double)(Lk - 600)), len = 1 + (int64_t)(rng_unif(&r) * 300);
                rg[n++] = s0, rg[n++] = s0 + len;
            }
            rg[n++] = Lk - 200, rg[n++] = Lk;
            T_CHECK(dhsa_layout_set(lay, 0, g, 0, rg, n / 2) == DHSA_OK, "layout_set: %s", dhsa_last_error());
            for (int64_t i = 0; i < n; i += 2)
                for (int64_t j = rg[i]; j < rg[i + 1]; j++) sel[g * Lk + j] = 1;
        }
    }
    if (corrupt == 1) cv[(Lk / 2) * dv + 3] += 0.5; /* one value in a middle piece */
    split_oracle(c, cq, ck, cv, corrupt == 2 ? NULL : sel, ro, rl);
    dhsa_attn_desc a = dhsa_attn_default_desc();
    a.q = dhsa_tensor_bhld(q, DHSA_F32, 1, Hq, Lq, d);
    a.k = dhsa_tensor_bhld(k, c->tkv, 1, Hkv, Lk, d);
    a.v = dhsa_tensor_bhld(v, c->tkv, 1, Hkv, Lk, dv);
    a.causal = 1;
    a.q_pos0 = Lk - Lq;
    a.window = c->window;
    a.softcap = c->softcap;
    a.layout = lay;
    char desc[200];
    snprintf(desc, sizeof desc, "split-K %s Hq %lld Hkv %lld Lq %lld Lk %lld d %lld window %lld softcap %g %s, %s",
             dhsa_type_name(c->tkv), (long long)Hq, (long long)Hkv, (long long)Lq, (long long)Lk, (long long)d,
             (long long)c->window, (double)c->softcap, c->layout ? "layout" : "dense", dhsa_isa_name(dhsa_active_isa()));
    int all = 1;
    for (int t = 0; t < 3; t++) {
        a.o = dhsa_tensor_bhld(o[t], DHSA_F32, 1, Hq, Lq, dv);
        a.lse = dhsa_tensor_bhld(lse[t], DHSA_F32, 1, Hq, Lq, 1);
        dhsa_status st = dhsa_attention(ctxs[t], &a);
        if (st != DHSA_OK) {
            if (!corrupt) T_CHECK(0, "%s, %d threads: %s %s", desc, t + 1, dhsa_status_str(st), dhsa_last_error());
            all = 0;
            continue;
        }
        if (t == 0) {
            int64_t wo = 0, wl = 0;
            int ok = split_close(o[0], ro, Hq * Lq * dv, 3e-5, 2e-5, &wo) &
                     split_close(lse[0], rl, Hq * Lq, 3e-5, 1e-5, &wl);
            if (!corrupt)
                T_CHECK(ok, "%s: against double, worst o[%lld] %.9g ref %.9g, lse[%lld] %.9g ref %.9g", desc,
                        (long long)wo, (double)o[0][wo], ro[wo], (long long)wl, (double)lse[0][wl], rl[wl]);
            all &= ok;
        } else {
            int same = memcmp(o[t], o[0], sizeof(float) * (size_t)(Hq * Lq * dv)) == 0 &&
                       memcmp(lse[t], lse[0], sizeof(float) * (size_t)(Hq * Lq)) == 0;
            if (!corrupt) T_CHECK(same, "%s: %d threads differ bitwise from 1 thread", desc, t + 1);
            all &= same;
        }
    }
    dhsa_layout_free(lay);
    free(sel), free(q), free(k), free(v), free(cq), free(ck), free(cv), free(ro), free(rl);
    for (int t = 0; t < 3; t++) free(o[t]), free(lse[t]);
    return all;
}

/* The partials are part of the workspace the query reports: a decode call
 * over 4100 keys needs more than one over 100 (no split), a budget one
 * byte below the reported size refuses the call, the size itself runs it. */
static void split_workspace(dhsa_ctx *ctx) {
    const int64_t Lk = 4100, d = 64;
    float *q = xcalloc(4 * (size_t)d, sizeof(float)), *o = xcalloc(4 * (size_t)d, sizeof(float));
    float *k = xcalloc((size_t)(Lk * d), sizeof(float)), *v = xcalloc((size_t)(Lk * d), sizeof(float));
    for (int64_t i = 0; i < Lk * d; i++) k[i] = (float)(i % 7) * 0.1f, v[i] = (float)(i % 5);
    dhsa_attn_desc a = dhsa_attn_default_desc();
    a.q = dhsa_tensor_bhld(q, DHSA_F32, 1, 4, 1, d);
    a.k = dhsa_tensor_bhld(k, DHSA_F32, 1, 1, 100, d);
    a.v = dhsa_tensor_bhld(v, DHSA_F32, 1, 1, 100, d);
    a.o = dhsa_tensor_bhld(o, DHSA_F32, 1, 4, 1, d);
    a.causal = 1;
    a.q_pos0 = 99;
    size_t w_short = 0, w_long = 0;
    dhsa_status s1 = dhsa_attn_workspace_size(ctx, &a, &w_short);
    a.k.shape[2] = a.v.shape[2] = Lk;
    a.q_pos0 = Lk - 1;
    dhsa_status s2 = dhsa_attn_workspace_size(ctx, &a, &w_long);
    T_CHECK(!s1 && !s2 && w_long > w_short, "split-K workspace: %zu bytes over 4100 keys, %zu over 100 (%s)", w_long,
            w_short, dhsa_last_error());
    dhsa_ctx_trim(ctx);
    size_t base = dhsa_ctx_mem_stats(ctx).in_use;
    dhsa_ctx_set_budget(ctx, base + w_long - 1);
    T_CHECK(dhsa_attention(ctx, &a) == DHSA_ERR_MEMORY_BUDGET, "split-K decode ran under a budget one byte short");
    dhsa_ctx_set_budget(ctx, base + w_long);
    T_CHECK(dhsa_attention(ctx, &a) == DHSA_OK && dhsa_ctx_mem_stats(ctx).peak <= base + w_long,
            "split-K decode within its reported workspace: %s", dhsa_last_error());
    dhsa_ctx_set_budget(ctx, 0);
    free(q), free(o), free(k), free(v);
}

static void test_split_k(void) {
    dhsa_ctx *ctxs[3] = {NULL, NULL, NULL};
    for (int t = 0; t < 3; t++) {
        dhsa_ctx_params p = dhsa_ctx_default_params();
        p.n_threads = t + 1;
        if (dhsa_ctx_create(&p, &ctxs[t]) != DHSA_OK) ctxs[t] = NULL;
    }
    T_CHECK(ctxs[0] && ctxs[1] && ctxs[2], "ctx_create (1, 2, 3 threads): %s", dhsa_last_error());
    if (!ctxs[0] || !ctxs[1] || !ctxs[2]) {
        for (int t = 0; t < 3; t++) dhsa_ctx_free(ctxs[t]);
        return;
    }
    split_workspace(ctxs[1]);
    static const dhsa_type types[3] = {DHSA_F32, DHSA_F16, DHSA_Q8_0};
    for (int ty = 0; ty < 3; ty++)
        for (int lay = 0; lay < 2; lay++)
            for (int64_t lq = 1; lq <= 4; lq++) {
                split_case c = {4, 1, lq, 4100, 64, 64, 0, 0.0f, types[ty], lay};
                if (lq == 2) c.softcap = 30.0f;
                if (lq == 3 && !lay) c.window = 2500;
                split_run(&c, ctxs, 0);
            }
    /* two KV heads, d 128, dv 96 */
    for (int ty = 0; ty < 3; ty++) {
        split_case c = {6, 2, 1, 3000, 128, 96, 0, 0.0f, types[ty], ty == 1};
        split_run(&c, ctxs, 0);
    }
    /* it can fail: a value changed in the middle of the keys, or the
     * reference ignoring the layout */
    split_case c = {4, 1, 1, 4100, 64, 64, 0, 0.0f, DHSA_F32, 1};
    T_CHECK(!split_run(&c, ctxs, 1), "split-K test passes with one value of V changed in the reference");
    T_CHECK(!split_run(&c, ctxs, 2), "split-K test passes with a reference that ignores the layout");
    for (int t = 0; t < 3; t++) dhsa_ctx_free(ctxs[t]);
}

/* ------------------------------------------------------------------------ */

/* The numeric cases (about 3 s per ISA at -O2 on 2 cores). */
static void numeric_suite(void) {
    test_grid();
    test_lq_ne_lk();
    test_masks();
    test_polarity();
    test_positions();
    test_all_masked();
    test_types_strides();
    test_long();
    test_split_k();
}

int main(void) {
    dhsa_ctx_params p = dhsa_ctx_default_params();
    if (dhsa_ctx_create(&p, &g_ctx) != DHSA_OK || !g_ctx) {
        T_CHECK(0, "ctx_create(defaults): %s", dhsa_last_error());
        return t_report("test_attn");
    }
    dhsa_isa best = dhsa_active_isa();
    printf("test_attn: %d threads, active ISA %s\n", dhsa_ctx_n_threads(g_ctx), dhsa_isa_name(best));

    test_comparator_fails();
    int before = t_checks();
    test_wrong_oracles();
    const int n_oracles = t_checks() - before; /* the checks of an ISA that is skipped, below */
    test_thread_invariance();

    /* The numeric cases under every ISA this machine and build offer. */
    before = t_checks();
    numeric_suite();
    const int n_suite = t_checks() - before;
    for (int isa = DHSA_ISA_SCALAR; isa <= DHSA_ISA_AVX512; isa++) {
        if ((dhsa_isa)isa == best) continue; /* done above */
        dhsa_status st = dhsa_set_isa((dhsa_isa)isa);
        if (st == DHSA_ERR_UNSUPPORTED) {
            T_SKIP(1 + n_suite + n_oracles, "ISA %s unsupported here", dhsa_isa_name((dhsa_isa)isa));
            continue;
        }
        T_CHECK(st == DHSA_OK && dhsa_active_isa() == (dhsa_isa)isa, "dhsa_set_isa(%s): %s",
                dhsa_isa_name((dhsa_isa)isa), dhsa_status_str(st));
        if (st != DHSA_OK) continue;
        numeric_suite();
        test_wrong_oracles();
    }
    T_CHECK(dhsa_set_isa(best) == DHSA_OK && dhsa_active_isa() == best, "could not restore ISA %s",
            dhsa_isa_name(best));

    dhsa_ctx_free(g_ctx);
    return t_report("test_attn");
}
