/* test_route.c: tests of the sparse side of dhsa (include/dhsa.h "Sparse
 * layouts", the `layout` field of dhsa_attn_desc, "DHSA routing" and
 * "Synthetic workloads and fidelity"; DESIGN.md sections 4-7).
 *
 * Oracles, all written here from the header's contract:
 *   - layouts: a bitmap per (batch, KV head, query block) kept by the test;
 *     dhsa_layout_selects and the stats are checked against it key by key;
 *   - the sparse kernel: a naive attention in double precision over the
 *     canonical (stored, rounded) inputs, where keys outside the block's
 *     selection get -inf; both TILED and REFERENCE with the same layout are
 *     compared with it (|got - ref| <= atol + rtol |ref| per element, and
 *     NMSE), and a failure prints the case and the worst element;
 *   - merging by LSE: two disjoint layouts merged in double against one pass;
 *   - routing: every block's span of keys is recomputed from the positions
 *     (causal, window, q_pos0), and the ranges are checked against the rules
 *     of DESIGN.md section 5 (sinks, the local diagonal, budget accounting,
 *     dense blocks, chunk boundaries); the FIXED (block-sparse) selection is
 *     re-derived in double from the design text (pooling sum / sqrt(n),
 *     scores q~ . k~; or the MOMENTS score from key means and variances;
 *     chunks in score order until the budget is met, with
 *     docs/dhsa.md's pass-over rule for chunks that would overshoot by more
 *     than half) and must match range for range; SIMILARITY boundaries are
 *     checked on crafted sequences whose true boundaries are known;
 *   - fidelity: attention recall against a brute-force double computation of
 *     the selected softmax mass.
 * Every comparison is shown once to fail on deliberately wrong data.
 *
 * Run: make build/tests/test_route && build/tests/test_route
 * (or `make test`). Ends with "test_route: P passed, F failed".
 */
#include "dhsa.h"
#include "t.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TWO_PI 6.283185307179586476925286766559

/* The sinks and local keys a block with this budget reads (dhsa.h,
 * scale_fixed: at most budget / 8 and budget / 4), written here from the
 * header's words, independently of route.c. */
static int64_t rule_sink(const dhsa_router_params *rp, int64_t budget) {
    return rp->scale_fixed && rp->sink_tokens > budget / 8 ? budget / 8 : rp->sink_tokens;
}
static int64_t rule_local(const dhsa_router_params *rp, int64_t budget) {
    return rp->scale_fixed && rp->local_tokens > budget / 4 ? budget / 4 : rp->local_tokens;
}

static dhsa_ctx *g_ctx; /* default ctx: n_threads = 0 (online CPUs) */

/* ------------------------------------------------------------------------ */
/* Deterministic inputs: splitmix64, Box-Muller normals (as in test_attn.c) */

#include "rng.h"
static int64_t rng_range(rng_t *r, int64_t n) { return n > 0 ? (int64_t)(rng_u64(r) % (uint64_t)n) : 0; }

static void *xcalloc(size_t n, size_t sz) {
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p) { fprintf(stderr, "out of memory\n"); exit(2); }
    return p;
}

/* ------------------------------------------------------------------------ */
/* Element storage. F16 decoding is written here (IEEE definition), so the
 * oracle does not trust the library's converters for what it reads. */

static double f16_decode(uint16_t h) {
    int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 0) v = ldexp((double)m, -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = ldexp((double)(m + 1024), e - 25);
    return sign ? -v : v;
}
static size_t elem_size(dhsa_type t) { return t == DHSA_F32 ? 4 : 2; }
static const char *tname(dhsa_type t) { return t == DHSA_F32 ? "f32" : t == DHSA_F16 ? "f16" : "bf16"; }
/* Stores x rounded to t (F32 or F16) at element off; returns the stored value. */
static double store_elem(void *base, dhsa_type t, int64_t off, double x) {
    if (t == DHSA_F32) {
        float f = (float)x;
        memcpy((char *)base + off * 4, &f, 4);
        return f;
    }
    uint16_t h = dhsa_f32_to_f16((float)x);
    memcpy((char *)base + off * 2, &h, 2);
    return f16_decode(h);
}

/* ------------------------------------------------------------------------ */
/* Error sentences. Before a call that must fail, plant a known sentence
 * (from an unrelated call); afterwards the sentence must be non-empty and
 * different, so a stale sentence from an earlier failure cannot pass. */

static char g_planted[256];
static void plant_error(void) {
    dhsa_set_isa((dhsa_isa)99); /* "unknown ISA 99" */
    snprintf(g_planted, sizeof g_planted, "%s", dhsa_last_error());
}
static int fresh_error(void) {
    const char *e = dhsa_last_error();
    return e && e[0] && strcmp(e, g_planted) != 0;
}

/* Property violations: count them, keep the first for the message, and make
 * one T_CHECK per property (not thousands of lines). */
typedef struct {
    int64_t bad, n;
    char first[400];
} viol;
#define VIOL_IF(v, cond, ...)                                                            \
    do {                                                                                 \
        (v).n++;                                                                         \
        if (cond) {                                                                      \
            if (!(v).bad++) snprintf((v).first, sizeof (v).first, __VA_ARGS__);          \
        }                                                                                \
    } while (0)
#define VIOL_REPORT(v, what, ctxfmt, ...)                                                \
    T_CHECK((v).bad == 0, "%s [" ctxfmt "]: %lld of %lld checks violate it; first: %s", \
            what, __VA_ARGS__, (long long)(v).bad, (long long)(v).n, (v).first)

static dhsa_ctx *ctx_new(int threads, size_t budget) {
    dhsa_ctx_params p = dhsa_ctx_default_params();
    p.n_threads = threads;
    p.mem_budget = budget;
    dhsa_ctx *c = NULL;
    dhsa_status st = dhsa_ctx_create(&p, &c);
    T_CHECK(st == DHSA_OK && c, "ctx_create(%d threads, budget %zu): %s", threads, budget,
            dhsa_last_error());
    return st == DHSA_OK ? c : NULL;
}

/* Sorts n pairs and merges overlapping/adjacent ones, dropping empty ones:
 * written here (insertion sort) so the test does not share the library's. */
static int64_t norm_ranges(int64_t *r, int64_t n) {
    int64_t w = 0;
    for (int64_t i = 0; i < n; i++)
        if (r[2 * i + 1] > r[2 * i]) r[2 * w] = r[2 * i], r[2 * w + 1] = r[2 * i + 1], w++;
    for (int64_t i = 1; i < w; i++)
        for (int64_t j = i; j > 0 && (r[2 * j] < r[2 * j - 2] ||
                                      (r[2 * j] == r[2 * j - 2] && r[2 * j + 1] < r[2 * j - 1]));
             j--) {
            int64_t s = r[2 * j], e = r[2 * j + 1];
            r[2 * j] = r[2 * j - 2], r[2 * j + 1] = r[2 * j - 1];
            r[2 * j - 2] = s, r[2 * j - 1] = e;
        }
    int64_t m = 0;
    for (int64_t i = 0; i < w; i++) {
        if (m > 0 && r[2 * i] <= r[2 * m - 1]) {
            if (r[2 * i + 1] > r[2 * m - 1]) r[2 * m - 1] = r[2 * i + 1];
        } else {
            r[2 * m] = r[2 * i], r[2 * m + 1] = r[2 * i + 1], m++;
        }
    }
    return m;
}

/* Maximal runs of ones in bits[0, n) as pairs; returns the count. */
static int64_t runs_of(const uint8_t *bits, int64_t n, int64_t *out) {
    int64_t k = 0;
    for (int64_t j = 0; j < n;) {
        if (!bits[j]) { j++; continue; }
        int64_t s = j;
        while (j < n && bits[j]) j++;
        out[2 * k] = s, out[2 * k + 1] = j, k++;
    }
    return k;
}

/* Keys a query at absolute position pos may attend to: [*lo, *hi), from the
 * header (causal keeps j <= pos; window keeps j > pos - window). Empty when
 * *hi <= *lo. */
static void key_span(int64_t Lk, int causal, int64_t window, int64_t pos, int64_t *lo, int64_t *hi) {
    *lo = 0, *hi = Lk;
    if (causal && pos + 1 < *hi) *hi = pos + 1;
    if (window > 0 && pos - window + 1 > *lo) *lo = pos - window + 1;
}

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

/* Reads block (b, g, qb) into want-comparable form; 1 iff it equals exp[n]. */
static int block_equals(const dhsa_layout *lay, int64_t b, int64_t g, int64_t qb, const int64_t *exp,
                        int64_t n) {
    const int64_t *r = NULL;
    int64_t m = -1;
    if (dhsa_layout_get(lay, b, g, qb, &r, &m) != DHSA_OK || m != n) return 0;
    return n == 0 || memcmp(r, exp, (size_t)n * 2 * sizeof(int64_t)) == 0;
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

enum { SEL_ALL, SEL_BLOCKS, SEL_RANGES, SEL_HALF };
static const char *sel_name[] = {"all", "64-key-blocks", "random-ranges", "half-32-runs"};
enum { KM_NONE, KM_RANDOM };

typedef struct {
    const char *tag;
    int64_t B, Hq, Hkv, Lq, Lk, d, q_block; /* B 0 -> 1, Hkv 0 -> Hq */
    dhsa_type tin;                          /* q, k, v: F32 or F16 */
    int causal;
    int64_t q_pos0, window;
    float softcap;
    double sigma; /* std of q and k entries; 0 -> 1.2 */
    int km;       /* KM_* */
    dhsa_mask_polarity pol;
    int sel; /* SEL_* */
    uint64_t seed;
} scase;

typedef struct {
    scase s;
    char desc[600];
    int64_t nqb;
    void *q, *k, *v;        /* contiguous [B, H, L, d] of type s.tin */
    float *o, *lse;         /* [B, Hq, Lq, d], [B, Hq, Lq] */
    size_t o_bytes, lse_bytes;
    double *cq, *ck, *cv;   /* canonical copies (the stored values) */
    uint8_t *km;            /* [B, Lk] */
    uint8_t *sel;           /* [B, Hkv, nqb, Lk]: 1 = the block selects the key */
    dhsa_layout *lay;
    double *ref_o, *ref_lse, *got_o, *got_lse;
    dhsa_attn_desc a;
} sinst;

static void fill_typed(void *buf, double *canon, dhsa_type t, int64_t n, double sigma, rng_t *r) {
    for (int64_t x = 0; x < n; x++) canon[x] = store_elem(buf, t, x, sigma * rng_normal(r));
}

/* Layout made from a bitmap. split64: hand every selected 64-key block over
 * as its own pair (adjacent pairs must be merged by dhsa_layout_set, and the
 * count may exceed max_ranges before merging). */
static dhsa_layout *layout_from_bits(dhsa_ctx *ctx, int64_t B, int64_t Hkv, int64_t Lq, int64_t Lk,
                                     int64_t q_block, const uint8_t *sel, int split64) {
    int64_t nqb = (Lq + q_block - 1) / q_block, maxr = 1;
    int64_t *pairs = xcalloc((size_t)(Lk + 2) * 2, sizeof(int64_t));
    for (int64_t x = 0; x < B * Hkv * nqb; x++) {
        int64_t n = runs_of(sel + x * Lk, Lk, pairs);
        if (n > maxr) maxr = n;
    }
    dhsa_layout *lay = NULL;
    dhsa_status st = dhsa_layout_create(ctx, B, Hkv, Lq, Lk, q_block, maxr, &lay);
    T_CHECK(st == DHSA_OK, "layout_create: %s", dhsa_last_error());
    if (st) { free(pairs); return NULL; }
    int64_t fails = 0;
    for (int64_t x = 0; x < B * Hkv * nqb; x++) {
        const uint8_t *bits = sel + x * Lk;
        int64_t n = 0;
        if (split64) {
            for (int64_t j0 = 0; j0 < Lk; j0 += 64)
                if (bits[j0]) pairs[2 * n] = j0, pairs[2 * n + 1] = j0 + 64 < Lk ? j0 + 64 : Lk, n++;
        } else {
            n = runs_of(bits, Lk, pairs);
        }
        fails += dhsa_layout_set(lay, x / (Hkv * nqb), x / nqb % Hkv, x % nqb, pairs, n) != DHSA_OK;
    }
    T_CHECK(fails == 0, "%lld layout_set calls failed: %s", (long long)fails, dhsa_last_error());
    free(pairs);
    return lay;
}

static void gen_selection(uint8_t *bits, int64_t Lk, int kind, rng_t *r) {
    memset(bits, 0, (size_t)Lk);
    if (kind == SEL_ALL) { memset(bits, 1, (size_t)Lk); return; }
    if (kind == SEL_BLOCKS) {
        double u = rng_unif(r);
        if (u < 0.125) return;                                      /* nothing */
        if (u < 0.25) { memset(bits, 1, (size_t)Lk); return; }      /* everything */
        for (int64_t j0 = 0; j0 < Lk; j0 += 64)
            if (rng_unif(r) < 0.5)
                memset(bits + j0, 1, (size_t)(j0 + 64 < Lk ? 64 : Lk - j0));
        return;
    }
    if (kind == SEL_HALF) {
        for (int64_t j0 = 0; j0 < Lk; j0 += 32)
            if (rng_unif(r) < 0.5)
                memset(bits + j0, 1, (size_t)(j0 + 32 < Lk ? 32 : Lk - j0));
        return;
    }
    /* SEL_RANGES: 1..4 ranges at arbitrary (unaligned) places */
    int64_t n = 1 + rng_range(r, 4);
    for (int64_t i = 0; i < n; i++) {
        int64_t s = rng_range(r, Lk), len = 1 + rng_range(r, Lk / 3 + 1);
        for (int64_t j = s; j < s + len && j < Lk; j++) bits[j] = 1;
    }
}

static void s_describe(sinst *I) {
    const scase *s = &I->s;
    snprintf(I->desc, sizeof I->desc,
             "%s: B=%lld Hq=%lld Hkv=%lld Lq=%lld Lk=%lld d=%lld q_block=%lld in=%s causal=%d "
             "q_pos0=%lld window=%lld softcap=%g sigma=%g key_mask=%s pol=%d selection=%s seed=%llu isa=%s",
             s->tag, (long long)s->B, (long long)s->Hq, (long long)s->Hkv, (long long)s->Lq,
             (long long)s->Lk, (long long)s->d, (long long)s->q_block, tname(s->tin), s->causal,
             (long long)s->q_pos0, (long long)s->window, (double)s->softcap, s->sigma,
             s->km ? "random" : "none", (int)s->pol, sel_name[s->sel], (unsigned long long)s->seed,
             dhsa_isa_name(dhsa_active_isa()));
}

static void s_init(sinst *I, const scase *sp) {
    memset(I, 0, sizeof *I);
    I->s = *sp;
    scase *s = &I->s;
    if (!s->B) s->B = 1;
    if (!s->Hkv) s->Hkv = s->Hq;
    if (s->sigma == 0) s->sigma = 1.2;
    if (!s->seed) s->seed = 0x5EED;
    rng_t r = {s->seed * 0x2545F4914F6CDD1Dull + (uint64_t)(s->Lq * 131 + s->d)};
    const int64_t B = s->B, Hq = s->Hq, Hkv = s->Hkv, Lq = s->Lq, Lk = s->Lk, d = s->d;
    const size_t es = elem_size(s->tin);
    I->nqb = (Lq + s->q_block - 1) / s->q_block;
    I->q = xcalloc((size_t)(B * Hq * Lq * d), es);
    I->k = xcalloc((size_t)(B * Hkv * Lk * d), es);
    I->v = xcalloc((size_t)(B * Hkv * Lk * d), es);
    I->cq = xcalloc((size_t)(B * Hq * Lq * d), sizeof(double));
    I->ck = xcalloc((size_t)(B * Hkv * Lk * d), sizeof(double));
    I->cv = xcalloc((size_t)(B * Hkv * Lk * d), sizeof(double));
    fill_typed(I->q, I->cq, s->tin, B * Hq * Lq * d, s->sigma, &r);
    fill_typed(I->k, I->ck, s->tin, B * Hkv * Lk * d, s->sigma, &r);
    fill_typed(I->v, I->cv, s->tin, B * Hkv * Lk * d, 1.0, &r);
    I->o_bytes = (size_t)(B * Hq * Lq * d) * sizeof(float);
    I->lse_bytes = (size_t)(B * Hq * Lq) * sizeof(float);
    I->o = xcalloc(I->o_bytes, 1);
    I->lse = xcalloc(I->lse_bytes, 1);
    if (s->km == KM_RANDOM) {
        I->km = xcalloc((size_t)(B * Lk), 1);
        for (int64_t x = 0; x < B * Lk; x++) I->km[x] = rng_unif(&r) < 0.3 ? (uint8_t)(1 + (x & 3)) : 0;
    }
    I->sel = xcalloc((size_t)(B * Hkv * I->nqb * Lk), 1);
    for (int64_t x = 0; x < B * Hkv * I->nqb; x++) gen_selection(I->sel + x * Lk, Lk, s->sel, &r);
    I->lay = layout_from_bits(g_ctx, B, Hkv, Lq, Lk, s->q_block, I->sel, s->sel == SEL_BLOCKS);
    size_t no = (size_t)(B * Hq * Lq);
    I->ref_o = xcalloc(no * (size_t)d, sizeof(double));
    I->got_o = xcalloc(no * (size_t)d, sizeof(double));
    I->ref_lse = xcalloc(no, sizeof(double));
    I->got_lse = xcalloc(no, sizeof(double));

    dhsa_attn_desc *a = &I->a;
    *a = dhsa_attn_default_desc();
    a->q = dhsa_tensor_bhld(I->q, s->tin, B, Hq, Lq, d);
    a->k = dhsa_tensor_bhld(I->k, s->tin, B, Hkv, Lk, d);
    a->v = dhsa_tensor_bhld(I->v, s->tin, B, Hkv, Lk, d);
    a->o = dhsa_tensor_bhld(I->o, DHSA_F32, B, Hq, Lq, d);
    a->lse = dhsa_tensor_bhld(I->lse, DHSA_F32, B, Hq, Lq, 1);
    a->softcap = s->softcap;
    a->causal = s->causal;
    a->q_pos0 = s->q_pos0;
    a->window = s->window;
    a->key_mask = I->km;
    a->key_mask_batch_stride = I->km ? Lk : 0;
    a->key_mask_polarity = s->pol;
    a->layout = I->lay;
    a->backend = DHSA_BACKEND_TILED;
    s_describe(I);
}

static void s_free(sinst *I) {
    dhsa_layout_free(I->lay);
    free(I->q), free(I->k), free(I->v), free(I->o), free(I->lse);
    free(I->cq), free(I->ck), free(I->cv), free(I->km), free(I->sel);
    free(I->ref_o), free(I->ref_lse), free(I->got_o), free(I->got_lse);
}

/* The oracle: naive attention in double from the header's contract, with
 * the keys a block does not select (sel, [B, Hkv, nqb, Lk]) at -inf; sel
 * NULL = dense. A row with no allowed key: o = 0, lse = -inf. */
static void s_oracle(const sinst *I, const uint8_t *sel, double *o, double *lse) {
    const scase *s = &I->s;
    const int64_t B = s->B, Hq = s->Hq, Hkv = s->Hkv, Lq = s->Lq, Lk = s->Lk, d = s->d, G = Hq / Hkv;
    const double scale = 1.0 / sqrt((double)d), cap = s->softcap;
    double *sc = xcalloc((size_t)Lk, sizeof(double));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++) {
            int64_t g = h / G;
            for (int64_t i = 0; i < Lq; i++) {
                int64_t pos = s->q_pos0 + i, lo, hi;
                key_span(Lk, s->causal, s->window, pos, &lo, &hi);
                const uint8_t *bits = sel ? sel + ((b * Hkv + g) * I->nqb + i / s->q_block) * Lk : NULL;
                const double *qi = I->cq + ((b * Hq + h) * Lq + i) * d;
                double m = -INFINITY;
                for (int64_t j = 0; j < Lk; j++) {
                    int keep = j >= lo && j < hi && (!bits || bits[j]);
                    if (keep && I->km) {
                        int truth = I->km[b * Lk + j] != 0;
                        keep = s->pol == DHSA_MASK_TRUE_IGNORES ? !truth : truth;
                    }
                    if (!keep) { sc[j] = -INFINITY; continue; }
                    const double *kj = I->ck + ((b * Hkv + g) * Lk + j) * d;
                    double dot = 0;
                    for (int64_t c = 0; c < d; c++) dot += qi[c] * kj[c];
                    double x = scale * dot;
                    if (cap > 0) x = cap * tanh(x / cap);
                    sc[j] = x;
                    if (x > m) m = x;
                }
                double *oi = o + ((b * Hq + h) * Lq + i) * d;
                for (int64_t c = 0; c < d; c++) oi[c] = 0;
                if (m == -INFINITY) {
                    lse[(b * Hq + h) * Lq + i] = -INFINITY;
                    continue;
                }
                double sum = 0;
                for (int64_t j = 0; j < Lk; j++) {
                    if (sc[j] == -INFINITY) continue;
                    double p = exp(sc[j] - m);
                    const double *vj = I->cv + ((b * Hkv + g) * Lk + j) * d;
                    sum += p;
                    for (int64_t c = 0; c < d; c++) oi[c] += p * vj[c];
                }
                for (int64_t c = 0; c < d; c++) oi[c] /= sum;
                lse[(b * Hq + h) * Lq + i] = m + log(sum);
            }
        }
    free(sc);
}

/* ------------------------------------------------------------------------ */
/* Comparison (the comparator of test_attn.c). Tolerances, u = 2^-24:
 * inputs are unit scale (v ~ N(0,1), q, k ~ N(0, 1.2^2), so scores have std
 * ~1.4; the softcap cases use sigma 2.5, |s| up to ~30).
 * TILED vs the double oracle: atol 3e-5, rtol 2e-5, NMSE 1e-9 (o); atol
 *   3e-5, rtol 1e-5 (lse). A layout changes only which keys a row visits,
 *   not the arithmetic per key, so test_attn.c's bounds carry over: the fp32
 *   dot over d <= 128 terms rounds a score by ~(u/2)|s|sqrt(d/2) (4e-7 RMS,
 *   2e-6 at |s| ~ 30), which moves o by at most ~4x that (|v_j - o| <= ~4);
 *   fp32 accumulation over <= 1000 keys adds ~sqrt(Lk) u |o| relative; so
 *   atol 3e-5 covers the worst case and rtol 2e-5 the relative part. LSE is
 *   m + log(sum): the same score error plus fp32 rounding of |lse| <= ~30.
 * REFERENCE vs the oracle: atol 1e-5, rtol 1e-5, NMSE 1e-12 (o); atol
 *   1e-5, rtol 1e-6 (lse): it accumulates in double; left are the fp32
 *   rounding of o and lse (u/2 relative) and scale/softcap held as float
 *   (|ds| <= |s| u/2).
 * F16 inputs need no extra tolerance: the oracle reads the very same rounded
 * values, and the library computes in F32 from them.
 * Rows with no allowed key must give exactly o = 0 and lse = -inf. */

typedef struct { double atol, rtol, nmse; } tol_t;

static tol_t tol_o(dhsa_backend be) {
    return be == DHSA_BACKEND_REFERENCE ? (tol_t){1e-5, 1e-5, 1e-12} : (tol_t){3e-5, 2e-5, 1e-9};
}
static tol_t tol_lse(dhsa_backend be) {
    return be == DHSA_BACKEND_REFERENCE ? (tol_t){1e-5, 1e-6, 1e-12} : (tol_t){3e-5, 1e-5, 1e-9};
}

typedef struct {
    int ok;
    int64_t n_bad, n;
    double nmse;
    int64_t at[4];
    double got, ref, bound;
} cmp_t;

/* got/ref are [B, H, R, C]. Where mask_lse ([B, H, R]) is -inf the row has
 * no allowed key and got must be exactly 0; an infinite ref must be matched
 * exactly; NaN never passes. */
static cmp_t compare(const double *got, const double *ref, const double *mask_lse, int64_t B, int64_t H,
                     int64_t R, int64_t C, tol_t t) {
    cmp_t c;
    memset(&c, 0, sizeof c);
    double num = 0, den = 0, worst = -1;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t r = 0; r < R; r++)
                for (int64_t k = 0; k < C; k++) {
                    int64_t x = ((b * H + h) * R + r) * C + k;
                    double g = got[x], f = ref[x], bound, excess;
                    int bad;
                    if (mask_lse && mask_lse[(b * H + h) * R + r] == -INFINITY) {
                        bound = 0;
                        bad = !(g == 0);
                        excess = bad ? INFINITY : 0;
                    } else if (isinf(f)) {
                        bound = 0;
                        bad = !(g == f);
                        excess = bad ? INFINITY : 0;
                    } else {
                        bound = t.atol + t.rtol * fabs(f);
                        double err = fabs(g - f);
                        bad = !(err <= bound);
                        excess = bad && !isfinite(err) ? INFINITY : err / bound;
                        if (isfinite(err)) num += err * err, den += f * f;
                    }
                    c.n++;
                    c.n_bad += bad;
                    if (excess > worst) {
                        worst = excess;
                        c.at[0] = b, c.at[1] = h, c.at[2] = r, c.at[3] = k;
                        c.got = g, c.ref = f, c.bound = bound;
                    }
                }
    c.nmse = den > 0 ? num / den : (num > 0 ? INFINITY : 0);
    c.ok = c.n_bad == 0 && c.nmse <= t.nmse;
    return c;
}

static int report_cmp(const char *what, const char *desc, cmp_t c, tol_t t) {
    T_CHECK(c.ok,
            "%s [%s]: %lld of %lld elements out of tolerance (atol %.1e rtol %.1e), NMSE %.3e (max %.1e); "
            "worst at (b=%lld,h=%lld,i=%lld,c=%lld): got %.9g ref %.9g |diff| %.3e bound %.3e",
            what, desc, (long long)c.n_bad, (long long)c.n, t.atol, t.rtol, c.nmse, t.nmse,
            (long long)c.at[0], (long long)c.at[1], (long long)c.at[2], (long long)c.at[3], c.got, c.ref,
            fabs(c.got - c.ref), c.bound);
    return c.ok;
}

/* Runs the library (o and lse pre-filled with 0xA5 bytes) and gathers the
 * results into got_o/got_lse. */
static dhsa_status s_run(sinst *I, dhsa_ctx *ctx, dhsa_backend be, const dhsa_layout *lay) {
    memset(I->o, 0xA5, I->o_bytes);
    memset(I->lse, 0xA5, I->lse_bytes);
    dhsa_attn_desc a = I->a;
    a.backend = be;
    a.layout = lay;
    dhsa_status st = dhsa_attention(ctx, &a);
    if (st == DHSA_OK) {
        size_t n = (size_t)(I->s.B * I->s.Hq * I->s.Lq);
        for (size_t x = 0; x < n * (size_t)I->s.d; x++) I->got_o[x] = I->o[x];
        for (size_t x = 0; x < n; x++) I->got_lse[x] = I->lse[x];
    }
    return st;
}

/* One backend with I's layout against ref_o/ref_lse. */
static int s_check(sinst *I, dhsa_ctx *ctx, dhsa_backend be) {
    const char *bn = dhsa_backend_name(be);
    s_describe(I);
    dhsa_status st = s_run(I, ctx, be, I->lay);
    T_CHECK(st == DHSA_OK, "%s with a layout [%s]: %s %s", bn, I->desc, dhsa_status_str(st), dhsa_last_error());
    if (st != DHSA_OK) return 0;
    const scase *s = &I->s;
    char what[64];
    snprintf(what, sizeof what, "%s sparse o", bn);
    int ok = report_cmp(what, I->desc,
                        compare(I->got_o, I->ref_o, I->ref_lse, s->B, s->Hq, s->Lq, s->d, tol_o(be)), tol_o(be));
    snprintf(what, sizeof what, "%s sparse lse", bn);
    ok &= report_cmp(what, I->desc, compare(I->got_lse, I->ref_lse, NULL, s->B, s->Hq, s->Lq, 1, tol_lse(be)),
                     tol_lse(be));
    return ok;
}

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

/* ======================================================================== */
/* 4. Routing                                                               */

/* Q and K (and V for the fidelity runs) of one layer, contiguous F32
 * [B, H, L, d], and a descriptor (o absent unless a test adds it: the
 * header says routing reads only q, k, causal, window and q_pos0). */
typedef struct {
    int64_t B, Hq, Hkv, Lq, Lk, d;
    float *q, *k, *v;
    dhsa_attn_desc a;
} rdata;

static void rdata_alloc(rdata *R, int64_t B, int64_t Hq, int64_t Hkv, int64_t Lq, int64_t Lk, int64_t d) {
    memset(R, 0, sizeof *R);
    R->B = B, R->Hq = Hq, R->Hkv = Hkv, R->Lq = Lq, R->Lk = Lk, R->d = d;
    R->q = xcalloc((size_t)(B * Hq * Lq * d), sizeof(float));
    R->k = xcalloc((size_t)(B * Hkv * Lk * d), sizeof(float));
    R->v = xcalloc((size_t)(B * Hkv * Lk * d), sizeof(float));
    R->a = dhsa_attn_default_desc();
    R->a.q = dhsa_tensor_bhld(R->q, DHSA_F32, B, Hq, Lq, d);
    R->a.k = dhsa_tensor_bhld(R->k, DHSA_F32, B, Hkv, Lk, d);
}

static void rdata_free(rdata *R) { free(R->q), free(R->k), free(R->v); }

static void rdata_random(rdata *R, int64_t B, int64_t Hq, int64_t Hkv, int64_t Lq, int64_t Lk, int64_t d,
                         uint64_t seed) {
    rdata_alloc(R, B, Hq, Hkv, Lq, Lk, d);
    rng_t r = {seed};
    for (int64_t x = 0; x < B * Hq * Lq * d; x++) R->q[x] = (float)rng_normal(&r);
    for (int64_t x = 0; x < B * Hkv * Lk * d; x++) R->k[x] = (float)rng_normal(&r);
    for (int64_t x = 0; x < B * Hkv * Lk * d; x++) R->v[x] = (float)rng_normal(&r);
}

static int rdata_synth(rdata *R, const dhsa_synth_params *sp, dhsa_synth_needle *needles) {
    rdata_alloc(R, sp->B, sp->Hq, sp->Hkv, sp->L, sp->L, sp->d);
    dhsa_status st = dhsa_synth_generate(sp, R->q, R->k, R->v, needles);
    T_CHECK(st == DHSA_OK, "synth_generate(L=%lld): %s %s", (long long)sp->L, dhsa_status_str(st),
            dhsa_last_error());
    return st == DHSA_OK;
}

/* Keys of segment `seg` of KV head g point along basis vector (seg*Hkv + g)
 * mod d (orthogonal topics), plus noise of std `noise`; Lq = Lk. Queries
 * are small random vectors, except the last query block (q_block rows),
 * whose queries point at segment `target`'s topic. */
static void rdata_segments(rdata *R, const int64_t *lens, int nseg, int64_t Hq, int64_t Hkv, int64_t d,
                           double noise, int target, int64_t q_block, uint64_t seed) {
    int64_t L = 0;
    for (int s = 0; s < nseg; s++) L += lens[s];
    rdata_alloc(R, 1, Hq, Hkv, L, L, d);
    rng_t r = {seed};
    int64_t last0 = (L - 1) / q_block * q_block;
    for (int64_t g = 0; g < Hkv; g++) {
        int64_t t = 0;
        for (int s = 0; s < nseg; s++)
            for (int64_t e = t + lens[s]; t < e; t++)
                for (int64_t c = 0; c < d; c++)
                    R->k[(g * L + t) * d + c] =
                        (float)((c == (s * Hkv + g) % d ? 1.0 : 0.0) + noise * rng_normal(&r));
    }
    for (int64_t h = 0; h < Hq; h++) {
        int64_t g = h / (Hq / Hkv);
        for (int64_t t = 0; t < L; t++)
            for (int64_t c = 0; c < d; c++)
                R->q[(h * L + t) * d + c] =
                    t >= last0 ? (float)((c == (target * Hkv + g) % d ? 1.0 : 0.0) + noise * rng_normal(&r))
                               : (float)(0.05 * rng_normal(&r));
    }
}

static dhsa_layout *route(dhsa_ctx *ctx, const dhsa_router_params *rp, const dhsa_attn_desc *a, const char *what) {
    dhsa_layout *lay = NULL;
    dhsa_status st = dhsa_route(ctx, rp, a, &lay);
    T_CHECK(st == DHSA_OK && lay, "dhsa_route (%s): %s %s", what, dhsa_status_str(st), dhsa_last_error());
    return st == DHSA_OK ? lay : NULL;
}

/* The block's span: keys at least one of its rows may attend to. Rows of a
 * block are consecutive positions, so the union of their spans is one
 * interval [*lo, *hi) (empty: *lo = *hi = 0). Also returns the sum over its
 * rows of their own span lengths. */
static void block_span(const dhsa_attn_desc *a, int64_t Lq, int64_t Lk, int64_t q_block, int64_t qb,
                       int64_t *lo, int64_t *hi, double *row_avail) {
    int64_t r0 = qb * q_block, r1 = r0 + q_block < Lq ? r0 + q_block : Lq, L = INT64_MAX, H = INT64_MIN;
    *row_avail = 0;
    for (int64_t i = r0; i < r1; i++) {
        int64_t l, h;
        key_span(Lk, a->causal, a->window, a->q_pos0 + i, &l, &h);
        if (h <= l) continue;
        *row_avail += (double)(h - l);
        if (l < L) L = l;
        if (h > H) H = h;
    }
    if (L == INT64_MAX) L = H = 0;
    *lo = L, *hi = H;
}

static int64_t max_chunk_len(const dhsa_router_params *rp) {
    return rp->boundary == DHSA_BOUNDARY_FIXED ? rp->chunk : rp->max_chunk;
}

/* "selected >= budget" over every routed block of the whole run, reported
 * once at the end (see check_routed: docs/dhsa.md's pass-over rule). */
static viol g_budget_strict;

/* Checks a routed layout against DESIGN.md section 5 and the header. */
static void check_routed(const char *what, const dhsa_layout *lay, const dhsa_router_params *rp,
                         const dhsa_attn_desc *a) {
    if (!lay) return;
    const int64_t B = a->q.shape[0], Lq = a->q.shape[2], Hkv = a->k.shape[1], Lk = a->k.shape[2];
    const int64_t qbk = rp->q_block, nqb = (Lq + qbk - 1) / qbk, maxc = max_chunk_len(rp);
    dhsa_layout_stats st;
    if (dhsa_layout_get_stats(lay, &st) != DHSA_OK) {
        T_CHECK(0, "%s: get_stats: %s", what, dhsa_last_error());
        return;
    }
    T_CHECK(st.B == B && st.Hkv == Hkv && st.Lq == Lq && st.Lk == Lk && st.q_block == qbk && st.n_blocks == nqb,
            "%s: routed layout sizes B %lld Hkv %lld Lq %lld Lk %lld q_block %lld, want %lld %lld %lld %lld %lld",
            what, (long long)st.B, (long long)st.Hkv, (long long)st.Lq, (long long)st.Lk, (long long)st.q_block,
            (long long)B, (long long)Hkv, (long long)Lq, (long long)Lk, (long long)qbk);
    T_CHECK(st.q_pos0 == a->q_pos0 && st.causal == (a->causal != 0) && st.window == a->window,
            "%s: the layout records q_pos0 %lld causal %d window %lld, routed for %lld %d %lld", what,
            (long long)st.q_pos0, st.causal, (long long)st.window, (long long)a->q_pos0, a->causal,
            (long long)a->window);
    viol structure = {0, 0, ""}, causal = {0, 0, ""}, dense = {0, 0, ""}, sinks = {0, 0, ""},
         local = {0, 0, ""}, budget_half = {0, 0, ""}, budget_hi = {0, 0, ""},
         stream = {0, 0, ""},
         density = {0, 0, ""}, edges = {0, 0, ""};
    int64_t want_dense = 0, total_ranges = 0;
    double sel_rows = 0, avail_rows = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t g = 0; g < Hkv; g++)
            for (int64_t qb = 0; qb < nqb; qb++) {
                const int64_t *r = NULL;
                int64_t n = 0, alo, ahi;
                double ra;
                if (dhsa_layout_get(lay, b, g, qb, &r, &n) != DHSA_OK) {
                    VIOL_IF(structure, 1, "get failed at (%lld, %lld, %lld)", (long long)b, (long long)g,
                            (long long)qb);
                    continue;
                }
                total_ranges += n;
                block_span(a, Lq, Lk, qbk, qb, &alo, &ahi, &ra);
                avail_rows += ra;
                int64_t r0 = qb * qbk, r1 = r0 + qbk < Lq ? r0 + qbk : Lq;
                int64_t pos0 = a->q_pos0 + r0, pos1 = a->q_pos0 + r1;
                for (int64_t i = r0; i < r1; i++) { /* selected keys per row, for the stats */
                    int64_t l, h;
                    key_span(Lk, a->causal, a->window, a->q_pos0 + i, &l, &h);
                    for (int64_t x = 0; x < n; x++) {
                        int64_t s = r[2 * x] > l ? r[2 * x] : l, e = r[2 * x + 1] < h ? r[2 * x + 1] : h;
                        if (e > s) sel_rows += (double)(e - s);
                    }
                }
                /* sorted, disjoint, non-adjacent, inside [0, Lk), <= max_ranges */
                int ok = n <= st.max_ranges;
                for (int64_t x = 0; x < n; x++)
                    ok &= r[2 * x] >= 0 && r[2 * x] < r[2 * x + 1] && r[2 * x + 1] <= Lk &&
                          (x == 0 || r[2 * x] > r[2 * x - 1]);
                VIOL_IF(structure, !ok, "block (%lld, %lld, %lld) has %lld ranges that are not sorted, disjoint and "
                        "inside [0, Lk)", (long long)b, (long long)g, (long long)qb, (long long)n);
                /* causality and window: every selected key is allowed for some row */
                int64_t sel = 0;
                for (int64_t x = 0; x < n; x++) {
                    sel += r[2 * x + 1] - r[2 * x];
                    VIOL_IF(causal, r[2 * x] < alo || r[2 * x + 1] > ahi,
                            "block (%lld, %lld, %lld) selects [%lld, %lld) outside its span [%lld, %lld)",
                            (long long)b, (long long)g, (long long)qb, (long long)r[2 * x], (long long)r[2 * x + 1],
                            (long long)alo, (long long)ahi);
                }
                int64_t avail = ahi - alo;
                if (avail == 0) {
                    VIOL_IF(causal, n != 0, "block (%lld, %lld, %lld) has no allowed key but %lld ranges",
                            (long long)b, (long long)g, (long long)qb, (long long)n);
                    continue;
                }
                int64_t budget = rp->budget_tokens > 0 ? rp->budget_tokens
                                                       : (int64_t)ceil(rp->density * (double)avail);
                if (avail < rp->dense_below || budget >= avail) { /* dense: one range, the whole span */
                    want_dense++;
                    VIOL_IF(dense, !(n == 1 && r[0] == alo && r[1] == ahi),
                            "block (%lld, %lld, %lld) (budget %lld, available %lld, dense_below %lld: dense) is not "
                            "dense: %lld ranges, first [%lld, %lld), span [%lld, %lld)",
                            (long long)b, (long long)g, (long long)qb, (long long)budget, (long long)avail,
                            (long long)rp->dense_below, (long long)n, (long long)(n ? r[0] : -1),
                            (long long)(n ? r[1] : -1), (long long)alo, (long long)ahi);
                    continue;
                }
                /* the visible sinks: [0, sink_tokens) clipped to the span */
                int64_t s0 = alo, s1 = rule_sink(rp, budget) < ahi ? rule_sink(rp, budget) : ahi;
                if (s1 < s0) s1 = s0;
                if (rp->method == DHSA_ROUTE_STREAM) {
                    /* sinks + the most recent keys, exactly the budget (budget >= sinks here) */
                    int64_t recent = budget - (s1 - s0), want[4] = {s0, s1, ahi - recent, ahi};
                    /* causal: the block's own rows (the diagonal) always, even past the budget */
                    int64_t p0 = a->q_pos0 + qb * rp->q_block;
                    if (a->causal && p0 < want[2]) want[2] = p0 > alo ? p0 : alo;
                    int64_t m = norm_ranges(want, 2);
                    int eq = m == n && memcmp(want, r, (size_t)(2 * m) * sizeof(int64_t)) == 0;
                    int64_t want_n = (s1 - s0) + (ahi - want[2]);
                    VIOL_IF(stream, budget >= s1 - s0 && (!eq || sel != want_n),
                            "stream block (%lld, %lld, %lld): %lld keys in %lld ranges, want sinks [%lld, %lld) + "
                            "recent [%lld, %lld) = %lld keys", (long long)b, (long long)g, (long long)qb,
                            (long long)sel, (long long)n, (long long)s0, (long long)s1,
                            (long long)want[2], (long long)ahi, (long long)want_n);
                    continue;
                }
                /* the local diagonal: [pos0 - local_tokens, block end) clipped to the span */
                int64_t l0 = pos0 - rule_local(rp, budget) > alo ? pos0 - rule_local(rp, budget) : alo;
                int64_t l1 = pos1 < ahi ? pos1 : ahi;
                if (l0 > l1) l0 = l1;
                int64_t miss_s = 0, miss_l = 0;
                for (int64_t j = s0; j < s1; j++) miss_s += dhsa_layout_selects(lay, b, g, r0, j) != 1;
                for (int64_t j = l0; j < l1; j++) miss_l += dhsa_layout_selects(lay, b, g, r0, j) != 1;
                VIOL_IF(sinks, miss_s > 0, "block (%lld, %lld, %lld): %lld of the sink keys [%lld, %lld) not selected",
                        (long long)b, (long long)g, (long long)qb, (long long)miss_s, (long long)s0, (long long)s1);
                VIOL_IF(local, miss_l > 0, "block (%lld, %lld, %lld): %lld of the local keys [%lld, %lld) not selected",
                        (long long)b, (long long)g, (long long)qb, (long long)miss_l, (long long)l0, (long long)l1);
                /* Budget. The brief (and DESIGN.md 5, "chunks in score order
                 * until the budget is met") wants at least the budget (it is
                 * below the span here). docs/dhsa.md adds: a chunk that would
                 * overshoot by more than half of its new keys is passed over,
                 * so the overshoot stays within half a chunk; then the
                 * budget can also be missed by up to half a chunk, which the
                 * second, looser check bounds. Above: at most half a chunk
                 * (rounded up) beyond max(budget, sinks + local), the
                 * mandatory keys being kept even when they exceed it. */
                int64_t mand = (s1 - s0) + (l1 - l0);
                {
                    int64_t i0 = s0 > l0 ? s0 : l0, i1 = s1 < l1 ? s1 : l1;
                    if (i1 > i0) mand -= i1 - i0;
                }
                /* over: by less than one chunk (the fallback pass may take a
                 * chunk the first pass found too large) */
                int64_t cap = (budget > mand ? budget : mand) + maxc;
                VIOL_IF(g_budget_strict, sel < budget,
                        "%s: block (%lld, %lld, %lld) selects %lld keys, below its budget %lld (available %lld)", what,
                        (long long)b, (long long)g, (long long)qb, (long long)sel, (long long)budget, (long long)avail);
                VIOL_IF(budget_half, sel <= budget - (maxc + 1) / 2,
                        "block (%lld, %lld, %lld) selects %lld keys, half a chunk (%lld) or more below its budget "
                        "%lld (available %lld)", (long long)b, (long long)g, (long long)qb, (long long)sel,
                        (long long)((maxc + 1) / 2), (long long)budget, (long long)avail);
                VIOL_IF(budget_hi, sel > cap,
                        "block (%lld, %lld, %lld) selects %lld keys: more than max(budget %lld, sinks+local %lld) + "
                        "a chunk (%lld)", (long long)b, (long long)g, (long long)qb, (long long)sel,
                        (long long)budget, (long long)mand, (long long)maxc);
                if (rp->budget_tokens == 0 && budget >= mand) {
                    /* density: the budget is ceil(density x available), so
                     * selected/available lies within half a chunk (over the
                     * available keys) of it, either side */
                    double ratio = (double)sel / (double)avail, slack = (double)((maxc + 1) / 2) / (double)avail;
                    double over = (double)maxc / (double)avail;
                    VIOL_IF(density, ratio <= rp->density - slack || ratio >= rp->density + over + 1.0 / (double)avail,
                            "block (%lld, %lld, %lld): selected/available = %lld/%lld = %.4f, want within %.4f of %.4f",
                            (long long)b, (long long)g, (long long)qb, (long long)sel, (long long)avail, ratio, slack,
                            rp->density);
                }
                if (rp->boundary == DHSA_BOUNDARY_FIXED) { /* range ends on chunk edges or clip points */
                    for (int64_t x = 0; x < 2 * n; x++) {
                        int64_t e = r[x];
                        int okk = e % rp->chunk == 0 || e == alo || e == ahi || e == s1 || e == l0 || e == l1 || e == Lk;
                        VIOL_IF(edges, !okk,
                                "block (%lld, %lld, %lld): range edge %lld is neither a multiple of chunk %lld nor a "
                                "clip point (span %lld..%lld, sinks ..%lld, local %lld..%lld)",
                                (long long)b, (long long)g, (long long)qb, (long long)e, (long long)rp->chunk,
                                (long long)alo, (long long)ahi, (long long)s1, (long long)l0, (long long)l1);
                    }
                }
            }
    VIOL_REPORT(structure, "layout structure", "%s", what);
    VIOL_REPORT(causal, "causality/window: selected keys outside the block's span", "%s", what);
    VIOL_REPORT(dense, "dense blocks", "%s", what);
    VIOL_REPORT(sinks, "sink keys always selected", "%s", what);
    VIOL_REPORT(local, "local diagonal always selected", "%s", what);
    VIOL_REPORT(budget_half, "within half a chunk below the budget", "%s", what);
    VIOL_REPORT(budget_hi, "less than a chunk over the budget", "%s", what);
    VIOL_REPORT(stream, "streaming = sinks + recent, exactly the budget", "%s", what);
    VIOL_REPORT(density, "density per block within half a chunk", "%s", what);
    VIOL_REPORT(edges, "FIXED range edges on chunk boundaries", "%s", what);
    T_CHECK(st.dense_blocks == want_dense, "%s: stats.dense_blocks %lld, want %lld", what,
            (long long)st.dense_blocks, (long long)want_dense);
    T_CHECK(st.ranges == total_ranges, "%s: stats.ranges %lld, counted %lld", what, (long long)st.ranges,
            (long long)total_ranges);
    T_CHECK(st.selected == sel_rows && st.available == avail_rows,
            "%s: stats selected %.0f available %.0f, brute force %.0f and %.0f", what, st.selected, st.available,
            sel_rows, avail_rows);
    /* integer counts, exact in doubles; the division rounds once */
    double dens = avail_rows > 0 ? sel_rows / avail_rows : 1.0;
    T_CHECK(fabs(st.density - dens) <= 1e-12, "%s: stats density %.15g, brute force %.15g", what, st.density, dens);
    if (Lk > 0) {
        int64_t lo_len = rp->boundary == DHSA_BOUNDARY_FIXED ? 1 : rp->min_chunk;
        if (rp->boundary == DHSA_BOUNDARY_SIMILARITY && rp->max_chunk / 2 < lo_len) lo_len = rp->max_chunk / 2;
        if (Lk < lo_len) lo_len = Lk;
        T_CHECK(st.chunks >= 1 && st.chunk_min >= lo_len && st.chunk_max <= maxc && st.chunk_min <= st.chunk_max &&
                    st.chunk_mean >= (double)st.chunk_min && st.chunk_mean <= (double)st.chunk_max,
                "%s: chunk stats: %lld chunks, lengths min %lld max %lld mean %.2f; want lengths in [%lld, %lld]",
                what, (long long)st.chunks, (long long)st.chunk_min, (long long)st.chunk_max, st.chunk_mean,
                (long long)lo_len, (long long)maxc);
    }
}

/* 1 iff two layouts hold the same blocks and stats. */
static int layouts_equal(const dhsa_layout *x, const dhsa_layout *y) {
    dhsa_layout_stats a, b;
    if (!x || !y || dhsa_layout_get_stats(x, &a) || dhsa_layout_get_stats(y, &b)) return 0;
    if (a.B != b.B || a.Hkv != b.Hkv || a.n_blocks != b.n_blocks || a.chunks != b.chunks ||
        a.chunk_min != b.chunk_min || a.chunk_max != b.chunk_max || a.chunk_mean != b.chunk_mean ||
        a.dense_blocks != b.dense_blocks || a.selected != b.selected || a.max_ranges != b.max_ranges)
        return 0;
    for (int64_t bb = 0; bb < a.B; bb++)
        for (int64_t g = 0; g < a.Hkv; g++)
            for (int64_t qb = 0; qb < a.n_blocks; qb++) {
                const int64_t *r1, *r2;
                int64_t n1, n2;
                dhsa_layout_get(x, bb, g, qb, &r1, &n1);
                dhsa_layout_get(y, bb, g, qb, &r2, &n2);
                if (n1 != n2 || (n1 && memcmp(r1, r2, (size_t)(2 * n1) * sizeof(int64_t)))) return 0;
            }
    return 1;
}

/* The block-sparse (FIXED) selection re-derived in double from DESIGN.md
 * section 5 and docs/dhsa.md "Budget": chunks [c*chunk, ...); pooled key k~(g, c) = sum of the chunk's
 * keys / sqrt(len) (share_heads: also averaged over KV heads); pooled query
 * q~(g, qb) = sum of the block's rows / sqrt(rows), averaged over the query
 * heads of the group (share_heads: all heads); score = q~ . k~ (MOMENTS,
 * include/dhsa.h: s mean(q) . mean(k) + s^2/2 mean(q*q) . var(k), the
 * variance about each head's own mean, both averaged over the KV heads
 * when shared; s = 1/sqrt(d); HEADS: the MOMENTS score of each query head
 * of the group alone, e_h(c), and score = log sum over heads of
 * exp(e_h(c)) / sum over the block's candidate chunks c' of len(c')
 * exp(e_h(c')); BOUND: e_h(c) = s (q_h+ . max(k) + q_h- . min(k)) with the
 * keys' per-dimension maximum and minimum, q+ / q- the positive / negative
 * parts of the head's mean row, and weight 1 per chunk in the sum); keep the
 * sinks and the local diagonal, then chunks overlapping the span in
 * descending score (ties: lower index) until the budget is met, a chunk
 * that adds no new key, or that would overshoot the budget by more than half
 * of its new keys, being passed over. order = -1 ranks ascending instead (a
 * deliberately wrong router, which must not match). Returns the number of
 * blocks whose key sets differ from the library's; *first describes one. */
static int64_t fixed_selection_mismatches(const dhsa_layout *lay, const dhsa_router_params *rp, const rdata *R,
                                          int order, char *first, size_t first_len) {
    const dhsa_attn_desc *a = &R->a;
    const int64_t B = R->B, Hq = R->Hq, Hkv = R->Hkv, Lq = R->Lq, Lk = R->Lk, d = R->d, G = Hq / Hkv;
    const int64_t C = rp->chunk, nc = (Lk + C - 1) / C, qbk = rp->q_block, nqb = (Lq + qbk - 1) / qbk;
    const int64_t heads = rp->share_heads ? 1 : Hkv;
    const int moments = rp->score_mode != DHSA_SCORE_POOLED, bound = rp->score_mode == DHSA_SCORE_BOUND;
    const int rowsm = rp->score_mode == DHSA_SCORE_ROWS;
    const int per_head = rp->score_mode == DHSA_SCORE_HEADS || bound || rowsm;
    const int64_t dk = moments ? 2 * d : d;
    const double sc = 1.0 / sqrt((double)d);
    double *kp = xcalloc((size_t)(heads * nc * dk), sizeof(double)), *qp = xcalloc((size_t)dk, sizeof(double));
    double *score = xcalloc((size_t)nc, sizeof(double)), *eh = xcalloc((size_t)nc, sizeof(double));
    int64_t *idx = xcalloc((size_t)nc, sizeof(int64_t)), *want = xcalloc((size_t)(Lk + 2) * 2, sizeof(int64_t));
    uint8_t *cov = xcalloc((size_t)Lk + 1, 1);
    int64_t mism = 0;
    first[0] = 0;
    for (int64_t b = 0; b < B; b++) {
        memset(kp, 0, (size_t)(heads * nc * dk) * sizeof(double));
        for (int64_t hg = 0; hg < heads; hg++)
            for (int64_t c = 0; c < nc; c++) {
                int64_t s = c * C, e = s + C < Lk ? s + C : Lk;
                int64_t h0 = rp->share_heads ? 0 : hg, h1 = rp->share_heads ? Hkv : hg + 1;
                double *out = kp + (hg * nc + c) * dk, n = (double)(e - s), nh = (double)(h1 - h0);
                if (bound) {
                    for (int64_t x = 0; x < d; x++) {
                        out[x] = -INFINITY, out[d + x] = INFINITY;
                        for (int64_t t = s; t < e; t++) {
                            double v = R->k[((b * Hkv + hg) * Lk + t) * d + x];
                            out[x] = v > out[x] ? v : out[x];
                            out[d + x] = v < out[d + x] ? v : out[d + x];
                        }
                    }
                    continue;
                }
                for (int64_t h = h0; h < h1; h++)
                    for (int64_t x = 0; x < d; x++) {
                        double m = 0, v = 0;
                        for (int64_t t = s; t < e; t++) m += R->k[((b * Hkv + h) * Lk + t) * d + x];
                        out[x] += m / (moments ? n * nh : sqrt(n) * nh);
                        if (!moments) continue;
                        for (int64_t t = s; t < e; t++) {
                            double u = R->k[((b * Hkv + h) * Lk + t) * d + x] - m / n;
                            v += u * u;
                        }
                        out[d + x] += v / (n * nh);
                    }
            }
        for (int64_t g = 0; g < Hkv; g++)
            for (int64_t qb = 0; qb < nqb; qb++) {
                int64_t r0 = qb * qbk, r1 = r0 + qbk < Lq ? r0 + qbk : Lq, alo, ahi;
                double ra;
                block_span(a, Lq, Lk, qbk, qb, &alo, &ahi, &ra);
                int64_t avail = ahi - alo, n = 0;
                int64_t budget = rp->budget_tokens > 0 ? rp->budget_tokens : (int64_t)ceil(rp->density * (double)avail);
                if (avail <= 0) {
                    n = 0;
                } else if (avail < rp->dense_below || budget >= avail) {
                    want[0] = alo, want[1] = ahi, n = 1;
                } else {
                    int64_t h0 = rp->share_heads ? 0 : g * G, h1 = rp->share_heads ? Hq : (g + 1) * G;
                    const double *kg = kp + (rp->share_heads ? 0 : g) * nc * dk;
                    int64_t m = 0;
                    if (per_head) {
                        for (int64_t c = 0; c < nc; c++) score[c] = 0;
                        /* ROWS: each scored row of each head alone (the block's last
                         * row, then every ceil(q_block / score_rows)-th before it),
                         * s q_r . mean(k), the same shares */
                        int64_t step = rp->score_rows > 0 ? (qbk + rp->score_rows - 1) / rp->score_rows : 1;
                        for (int64_t hr = h0 * Lq; rowsm && hr < h1 * Lq; hr++) {
                            int64_t h = hr / Lq, r = hr % Lq, j = (r1 - 1 - r) / step;
                            if (r < r0 || r >= r1 || (r1 - 1 - r) % step || (rp->score_rows > 0 && j >= rp->score_rows))
                                continue;
                            double z = 0;
                            for (int64_t c = 0; c < nc; c++) {
                                int64_t s = c * C, e = s + C < Lk ? s + C : Lk;
                                if (e <= alo || s >= ahi) continue;
                                eh[c] = 0;
                                for (int64_t x = 0; x < d; x++) eh[c] += sc * R->q[((b * Hq + h) * Lq + r) * d + x] * kg[c * dk + x];
                                z += (double)(e - s) * exp(eh[c]);
                            }
                            for (int64_t c = 0; c < nc; c++) {
                                int64_t s = c * C, e = s + C < Lk ? s + C : Lk;
                                if (e <= alo || s >= ahi) continue;
                                score[c] += exp(eh[c]) / z;
                            }
                        }
                        for (int64_t h = h0; h < h1 && !rowsm; h++) {
                            memset(qp, 0, (size_t)dk * sizeof(double));
                            for (int64_t i = r0; i < r1; i++)
                                for (int64_t x = 0; x < d; x++) {
                                    double v = R->q[((b * Hq + h) * Lq + i) * d + x];
                                    qp[x] += v * sc / (double)(r1 - r0);
                                    qp[d + x] += v * v * 0.5 * sc * sc / (double)(r1 - r0);
                                }
                            for (int64_t x = 0; x < d && bound; x++) {
                                qp[d + x] = qp[x] < 0 ? qp[x] : 0;
                                qp[x] = qp[x] > 0 ? qp[x] : 0;
                            }
                            double z = 0;
                            for (int64_t c = 0; c < nc; c++) {
                                int64_t s = c * C, e = s + C < Lk ? s + C : Lk;
                                if (e <= alo || s >= ahi) continue;
                                eh[c] = 0;
                                for (int64_t x = 0; x < dk; x++) eh[c] += qp[x] * kg[c * dk + x];
                                z += (bound ? 1.0 : (double)(e - s)) * exp(eh[c]);
                            }
                            for (int64_t c = 0; c < nc; c++) {
                                int64_t s = c * C, e = s + C < Lk ? s + C : Lk;
                                if (e <= alo || s >= ahi) continue;
                                score[c] += exp(eh[c]) / z;
                            }
                        }
                        for (int64_t c = 0; c < nc; c++) {
                            int64_t s = c * C, e = s + C < Lk ? s + C : Lk;
                            if (e <= alo || s >= ahi) continue;
                            score[c] = log(score[c]) * order;
                            idx[m++] = c;
                        }
                    }
                    memset(qp, 0, (size_t)dk * sizeof(double));
                    for (int64_t h = h0; h < h1 && !per_head; h++)
                        for (int64_t i = r0; i < r1; i++)
                            for (int64_t x = 0; x < d; x++) {
                                double v = R->q[((b * Hq + h) * Lq + i) * d + x];
                                qp[x] += v;
                                if (moments) qp[d + x] += v * v;
                            }
                    double rows = (double)(r1 - r0), nh = (double)(h1 - h0);
                    for (int64_t x = 0; x < d; x++) qp[x] *= moments ? sc / (rows * nh) : 1.0 / (sqrt(rows) * nh);
                    for (int64_t x = d; x < dk; x++) qp[x] *= 0.5 * sc * sc / (rows * nh);
                    for (int64_t c = 0; c < nc && !per_head; c++) {
                        int64_t s = c * C, e = s + C < Lk ? s + C : Lk;
                        if (e <= alo || s >= ahi) continue;
                        double dot = 0;
                        for (int64_t x = 0; x < dk; x++) dot += qp[x] * kg[c * dk + x];
                        score[c] = dot * order;
                        idx[m++] = c;
                    }
                    for (int64_t u = 1; u < m; u++) /* insertion sort: score desc, index asc */
                        for (int64_t w = u; w > 0 && (score[idx[w]] > score[idx[w - 1]] ||
                                                      (score[idx[w]] == score[idx[w - 1]] && idx[w] < idx[w - 1]));
                             w--) {
                            int64_t t = idx[w];
                            idx[w] = idx[w - 1], idx[w - 1] = t;
                        }
                    memset(cov, 0, (size_t)Lk);
                    int64_t pos0 = a->q_pos0 + r0, pos1 = a->q_pos0 + r1, used = 0;
                    int64_t s1 = rule_sink(rp, budget) < ahi ? rule_sink(rp, budget) : ahi;
                    int64_t l0 = pos0 - rule_local(rp, budget) > alo ? pos0 - rule_local(rp, budget) : alo, l1 = pos1 < ahi ? pos1 : ahi;
                    for (int64_t j = alo; j < s1; j++) used += !cov[j], cov[j] = 1;
                    for (int64_t j = l0; j < l1; j++) used += !cov[j], cov[j] = 1;
                    for (int pass = 0; pass < 2; pass++)
                        for (int64_t u = 0; u < m && used < budget; u++) {
                            int64_t s = idx[u] * C, e = s + C < Lk ? s + C : Lk, fresh = 0;
                            if (s < alo) s = alo;
                            if (e > ahi) e = ahi;
                            for (int64_t j = s; j < e; j++) fresh += !cov[j];
                            if (fresh == 0) continue; /* taken already, or inside sinks/local */
                            /* docs/dhsa.md: passed over (first pass) if it would
                             * overshoot by more than half of its new keys; the
                             * second pass fills what is left in rank order */
                            if (pass == 0 && used + fresh > budget && budget - used < fresh / 2) continue;
                            for (int64_t j = s; j < e; j++) used += !cov[j], cov[j] = 1;
                        }
                    n = runs_of(cov, Lk, want);
                }
                const int64_t *r = NULL;
                int64_t gn = -1;
                dhsa_layout_get(lay, b, g, qb, &r, &gn);
                if (gn != n || (n && memcmp(r, want, (size_t)(2 * n) * sizeof(int64_t)))) {
                    if (!mism++) {
                        int len = snprintf(first, first_len, "block (%lld, %lld, %lld): library %lld ranges:",
                                           (long long)b, (long long)g, (long long)qb, (long long)gn);
                        for (int64_t x = 0; x < gn && x < 6 && len > 0 && (size_t)len < first_len; x++)
                            len += snprintf(first + len, first_len - (size_t)len, " [%lld,%lld)", (long long)r[2 * x],
                                            (long long)r[2 * x + 1]);
                        if (len > 0 && (size_t)len < first_len)
                            len += snprintf(first + len, first_len - (size_t)len, "; expected %lld:", (long long)n);
                        for (int64_t x = 0; x < n && x < 6 && len > 0 && (size_t)len < first_len; x++)
                            len += snprintf(first + len, first_len - (size_t)len, " [%lld,%lld)", (long long)want[2 * x],
                                            (long long)want[2 * x + 1]);
                    }
                }
            }
    }
    free(kp), free(qp), free(score), free(eh), free(idx), free(want), free(cov);
    return mism;
}

/* Routing with FIXED boundaries equals the re-derived block-sparse
 * selection exactly (the library scores in float with SIMD; the margins
 * between neighbouring chunk scores on these random inputs are far above
 * float rounding, so no tie breaks differently). */
static void check_fixed_exact(const char *what, const dhsa_layout *lay, const dhsa_router_params *rp,
                              const rdata *R, int also_wrong) {
    if (!lay) return;
    char first[600];
    int64_t m = fixed_selection_mismatches(lay, rp, R, 1, first, sizeof first);
    T_CHECK(m == 0, "%s: %lld blocks differ from the re-derived block-sparse selection; first: %s", what,
            (long long)m, first);
    if (also_wrong) {
        m = fixed_selection_mismatches(lay, rp, R, -1, first, sizeof first);
        T_CHECK(m > 0, "%s: the layout also matches a router ranking chunks by ASCENDING score: the exact "
                "selection check cannot fail", what);
    }
}

static dhsa_router_params rparams(dhsa_route_method m, dhsa_boundary bd, int64_t budget, double density) {
    dhsa_router_params rp = dhsa_router_default_params();
    rp.method = m;
    rp.boundary = bd;
    rp.budget_tokens = budget;
    rp.density = density;
    rp.chunk = 64;
    rp.sim_window = 8;
    rp.threshold = 1.0f;
    rp.nms_window = 16;
    rp.min_chunk = 16;
    rp.max_chunk = 256;
    rp.q_block = 64;
    rp.sink_tokens = 64;
    rp.local_tokens = 256;
    rp.dense_below = 0; /* tests that need it set it */
    rp.share_heads = 0;
    return rp;
}

/* Routing on the synthetic workload and on random data: every property of
 * check_routed, for DHSA (similarity and fixed), streaming and the oracle,
 * causal, windowed, chunked prefill, decode, non-causal. */
static void test_route_properties(void) {
    dhsa_synth_params sp = dhsa_synth_default_params();
    sp.B = 1, sp.Hq = 8, sp.Hkv = 2, sp.L = 4096, sp.d = 64, sp.seed = 11;
    dhsa_synth_needle nd[DHSA_SYNTH_MAX_NEEDLES];
    rdata S;
    if (rdata_synth(&S, &sp, nd)) {
        S.a.causal = 1;
        struct {
            const char *what;
            dhsa_router_params rp;
        } cs[] = {
            {"synth L=4096 dhsa/similarity budget 512", rparams(DHSA_ROUTE_DHSA, DHSA_BOUNDARY_SIMILARITY, 512, 0)},
            {"synth L=4096 dhsa/fixed (block) budget 512", rparams(DHSA_ROUTE_DHSA, DHSA_BOUNDARY_FIXED, 512, 0)},
            {"synth L=4096 stream budget 512", rparams(DHSA_ROUTE_STREAM, DHSA_BOUNDARY_SIMILARITY, 512, 0)},
            {"synth L=4096 dhsa/similarity density 1/16", rparams(DHSA_ROUTE_DHSA, DHSA_BOUNDARY_SIMILARITY, 0, 0.0625)},
            {"synth L=4096 dhsa/fixed density 0.2", rparams(DHSA_ROUTE_DHSA, DHSA_BOUNDARY_FIXED, 0, 0.2)},
            {"synth L=4096 oracle/similarity budget 512", rparams(DHSA_ROUTE_ORACLE, DHSA_BOUNDARY_SIMILARITY, 512, 0)},
            {"synth L=4096 dhsa/similarity causal-boundaries budget 700",
             rparams(DHSA_ROUTE_DHSA, DHSA_BOUNDARY_SIMILARITY, 700, 0)},
            {"synth L=4096 dhsa/fixed (block) budget 512, pooled score",
             rparams(DHSA_ROUTE_DHSA, DHSA_BOUNDARY_FIXED, 512, 0)},
            {"synth L=4096 dhsa/fixed (block) budget 512, heads score",
             rparams(DHSA_ROUTE_DHSA, DHSA_BOUNDARY_FIXED, 512, 0)},
            {"synth L=4096 dhsa/similarity density 1/16, heads score",
             rparams(DHSA_ROUTE_DHSA, DHSA_BOUNDARY_SIMILARITY, 0, 0.0625)},
            {"synth L=4096 dhsa/fixed (block) budget 512, bound score",
             rparams(DHSA_ROUTE_DHSA, DHSA_BOUNDARY_FIXED, 512, 0)},
            {"synth L=4096 dhsa/similarity density 1/16, bound score",
             rparams(DHSA_ROUTE_DHSA, DHSA_BOUNDARY_SIMILARITY, 0, 0.0625)},
            {"synth L=4096 dhsa/fixed (block) budget 512, rows score (every row)",
             rparams(DHSA_ROUTE_DHSA, DHSA_BOUNDARY_FIXED, 512, 0)},
            {"synth L=4096 dhsa/fixed (block) budget 512, rows score (4 rows of 48)",
             rparams(DHSA_ROUTE_DHSA, DHSA_BOUNDARY_FIXED, 512, 0)},
            {"synth L=4096 dhsa/similarity density 1/16, rows score",
             rparams(DHSA_ROUTE_DHSA, DHSA_BOUNDARY_SIMILARITY, 0, 0.0625)},
        };
        cs[0].rp.dense_below = 2048; /* the default: blocks seeing fewer keys run dense */
        cs[6].rp.causal_boundaries = 1;
        cs[6].rp.q_block = 128;
        cs[7].rp.score_mode = DHSA_SCORE_POOLED;
        cs[8].rp.score_mode = DHSA_SCORE_HEADS;
        cs[9].rp.score_mode = DHSA_SCORE_HEADS;
        cs[10].rp.score_mode = DHSA_SCORE_BOUND;
        cs[11].rp.score_mode = DHSA_SCORE_BOUND;
        cs[12].rp.score_mode = cs[13].rp.score_mode = cs[14].rp.score_mode = DHSA_SCORE_ROWS;
        cs[13].rp.score_rows = 4;
        cs[13].rp.q_block = 48;
        for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
            dhsa_layout *lay = route(g_ctx, &cs[c].rp, &S.a, cs[c].what);
            check_routed(cs[c].what, lay, &cs[c].rp, &S.a);
            if (cs[c].rp.boundary == DHSA_BOUNDARY_FIXED && cs[c].rp.method == DHSA_ROUTE_DHSA)
                check_fixed_exact(cs[c].what, lay, &cs[c].rp, &S, c == 1 || c == 7 || c == 8 || c == 10 || c == 12 || c == 13);
            dhsa_layout_free(lay);
        }
        /* the density test has blocks held to it: check the counts */
        rdata_free(&S);
    }

    /* random data: window, odd chunk and q_block, B = 2, chunked prefill,
     * decode, non-causal */
    struct {
        const char *what;
        int64_t B, Hq, Hkv, Lq, Lk, q_pos0, window;
        int causal;
        dhsa_router_params rp;
    } rc[] = {
        {"random causal window 1024, fixed chunk 100, q_block 48", 2, 4, 2, 3000, 3000, 0, 1024, 1,
         rparams(DHSA_ROUTE_DHSA, DHSA_BOUNDARY_FIXED, 450, 0)},
        {"random causal window 700, similarity, q_block 48", 2, 4, 2, 3000, 3000, 0, 700, 1,
         rparams(DHSA_ROUTE_DHSA, DHSA_BOUNDARY_SIMILARITY, 450, 0)},
        {"random chunked prefill Lq 300 after 3700 keys, similarity", 2, 4, 2, 300, 4000, 3700, 0, 1,
         rparams(DHSA_ROUTE_DHSA, DHSA_BOUNDARY_SIMILARITY, 600, 0)},
        {"random chunked prefill, fixed", 1, 8, 2, 300, 4000, 3700, 0, 1,
         rparams(DHSA_ROUTE_DHSA, DHSA_BOUNDARY_FIXED, 600, 0)},
        {"random decode Lq 1, similarity", 2, 8, 2, 1, 4096, 4095, 0, 1,
         rparams(DHSA_ROUTE_DHSA, DHSA_BOUNDARY_SIMILARITY, 512, 0)},
        {"random decode Lq 1, stream", 1, 8, 2, 1, 4096, 4095, 0, 1,
         rparams(DHSA_ROUTE_STREAM, DHSA_BOUNDARY_FIXED, 512, 0)},
        {"random non-causal, fixed chunk 64, sink 0 local 0", 1, 4, 4, 2500, 2500, 0, 0, 0,
         rparams(DHSA_ROUTE_DHSA, DHSA_BOUNDARY_FIXED, 700, 0)},
        {"random non-causal window 600, similarity", 1, 4, 1, 2500, 2500, 0, 600, 0,
         rparams(DHSA_ROUTE_DHSA, DHSA_BOUNDARY_SIMILARITY, 300, 0)},
        {"random non-causal stream", 1, 2, 1, 2100, 2100, 0, 0, 0,
         rparams(DHSA_ROUTE_STREAM, DHSA_BOUNDARY_SIMILARITY, 300, 0)},
        {"random causal fixed chunk 100 q_block 64 budget 190 sink 0 local 0", 1, 4, 2, 4000, 4000, 0, 0, 1,
         rparams(DHSA_ROUTE_DHSA, DHSA_BOUNDARY_FIXED, 190, 0)},
        {"random causal oracle/fixed budget 400", 1, 4, 2, 2048, 2048, 0, 0, 1,
         rparams(DHSA_ROUTE_ORACLE, DHSA_BOUNDARY_FIXED, 400, 0)},
        {"random Lk < dense_below: all dense", 2, 4, 2, 1000, 1000, 0, 0, 1,
         rparams(DHSA_ROUTE_DHSA, DHSA_BOUNDARY_SIMILARITY, 128, 0)},
        {"random budget >= L: all dense", 1, 4, 2, 2500, 2500, 0, 0, 1,
         rparams(DHSA_ROUTE_DHSA, DHSA_BOUNDARY_SIMILARITY, 2500, 0)},
        {"random density 1: all dense", 1, 4, 2, 2100, 2100, 0, 0, 1,
         rparams(DHSA_ROUTE_DHSA, DHSA_BOUNDARY_FIXED, 0, 1.0)},
        {"random dense_below 1500 (per block)", 1, 4, 2, 3000, 3000, 0, 0, 1,
         rparams(DHSA_ROUTE_DHSA, DHSA_BOUNDARY_FIXED, 400, 0)},
    };
    rc[0].rp.chunk = 100, rc[0].rp.q_block = 48;
    rc[1].rp.q_block = 48, rc[1].rp.sink_tokens = 100;
    rc[3].rp.q_block = 32, rc[3].rp.chunk = 48;
    rc[6].rp.sink_tokens = 0, rc[6].rp.local_tokens = 0;
    rc[7].rp.max_chunk = 24; /* max_chunk < 2 min_chunk: pieces down to 12 */
    rc[9].rp.chunk = 100, rc[9].rp.sink_tokens = 0, rc[9].rp.local_tokens = 0;
    rc[11].rp.dense_below = 2048;
    rc[14].rp.dense_below = 1500;
    for (size_t c = 0; c < sizeof rc / sizeof rc[0]; c++) {
        rdata R;
        rdata_random(&R, rc[c].B, rc[c].Hq, rc[c].Hkv, rc[c].Lq, rc[c].Lk, 64, 100 + c);
        R.a.causal = rc[c].causal, R.a.q_pos0 = rc[c].q_pos0, R.a.window = rc[c].window;
        dhsa_layout *lay = route(g_ctx, &rc[c].rp, &R.a, rc[c].what);
        check_routed(rc[c].what, lay, &rc[c].rp, &R.a);
        if (rc[c].rp.boundary == DHSA_BOUNDARY_FIXED && rc[c].rp.method == DHSA_ROUTE_DHSA)
            check_fixed_exact(rc[c].what, lay, &rc[c].rp, &R, 0);
        dhsa_layout_stats st;
        if (lay && dhsa_layout_get_stats(lay, &st) == DHSA_OK && c >= 11 && c <= 13)
            T_CHECK(st.dense_blocks == rc[c].B * rc[c].Hkv * st.n_blocks && st.density == 1.0,
                    "%s: %lld dense blocks of %lld, density %g", rc[c].what, (long long)st.dense_blocks,
                    (long long)(rc[c].B * rc[c].Hkv * st.n_blocks), st.density);
        dhsa_layout_free(lay);
        rdata_free(&R);
    }
}

/* share_heads: one routing for every KV head; and the dense-block count. */
static void test_route_share_heads(void) {
    rdata R;
    rdata_random(&R, 2, 8, 2, 2600, 2600, 64, 77);
    R.a.causal = 1;
    static const dhsa_boundary bds[2] = {DHSA_BOUNDARY_SIMILARITY, DHSA_BOUNDARY_FIXED};
    for (int k = 0; k < 2; k++) {
        dhsa_router_params rp = rparams(DHSA_ROUTE_DHSA, bds[k], 512, 0);
        rp.share_heads = 1;
        char what[96];
        snprintf(what, sizeof what, "share_heads B=2 Hkv=2 %s", k ? "fixed" : "similarity");
        dhsa_layout *lay = route(g_ctx, &rp, &R.a, what);
        check_routed(what, lay, &rp, &R.a);
        if (k == 1) check_fixed_exact(what, lay, &rp, &R, 0);
        if (lay) {
            dhsa_layout_stats st;
            dhsa_layout_get_stats(lay, &st);
            int64_t diff = 0;
            for (int64_t b = 0; b < R.B; b++)
                for (int64_t qb = 0; qb < st.n_blocks; qb++) {
                    const int64_t *r0, *r1;
                    int64_t n0, n1;
                    dhsa_layout_get(lay, b, 0, qb, &r0, &n0);
                    dhsa_layout_get(lay, b, 1, qb, &r1, &n1);
                    diff += n0 != n1 || (n0 && memcmp(r0, r1, (size_t)(2 * n0) * sizeof(int64_t)));
                }
            T_CHECK(diff == 0, "%s: %lld blocks differ between KV heads 0 and 1", what, (long long)diff);
        }
        dhsa_layout_free(lay);
        /* without share_heads the two heads are routed apart: they differ */
        rp.share_heads = 0;
        lay = route(g_ctx, &rp, &R.a, "per-group");
        if (lay) {
            int64_t diff = 0;
            dhsa_layout_stats st;
            dhsa_layout_get_stats(lay, &st);
            for (int64_t qb = 0; qb < st.n_blocks; qb++) {
                const int64_t *r0, *r1;
                int64_t n0, n1;
                dhsa_layout_get(lay, 0, 0, qb, &r0, &n0);
                dhsa_layout_get(lay, 0, 1, qb, &r1, &n1);
                diff += n0 != n1 || (n0 && memcmp(r0, r1, (size_t)(2 * n0) * sizeof(int64_t)));
            }
            T_CHECK(diff > 0, "per-group routing gives identical heads on random data: the share_heads check "
                    "cannot fail");
        }
        dhsa_layout_free(lay);
    }
    rdata_free(&R);
}

/* Determinism: the same call twice, and with 1 vs 3 threads. */
static void test_route_determinism(void) {
    dhsa_synth_params sp = dhsa_synth_default_params();
    sp.B = 2, sp.Hq = 4, sp.Hkv = 2, sp.L = 3000, sp.d = 64, sp.seed = 5;
    dhsa_synth_needle nd[DHSA_SYNTH_MAX_NEEDLES];
    rdata S;
    if (!rdata_synth(&S, &sp, nd)) return;
    S.a.causal = 1;
    dhsa_ctx *c1 = ctx_new(1, 0), *c3 = ctx_new(3, 0);
    static const dhsa_route_method ms[3] = {DHSA_ROUTE_DHSA, DHSA_ROUTE_ORACLE, DHSA_ROUTE_STREAM};
    for (int m = 0; m < 3 && c1 && c3; m++)
        for (int bd = 0; bd < 2; bd++) {
            dhsa_router_params rp = rparams(ms[m], bd ? DHSA_BOUNDARY_FIXED : DHSA_BOUNDARY_SIMILARITY, 400, 0);
            rp.q_block = 32;
            dhsa_layout *a = route(c3, &rp, &S.a, "det 3 threads"), *b = route(c3, &rp, &S.a, "det again"),
                        *c = route(c1, &rp, &S.a, "det 1 thread");
            T_CHECK(layouts_equal(a, b), "method %d boundary %d: routing twice gives different layouts", m, bd);
            T_CHECK(layouts_equal(a, c), "method %d boundary %d: 1 and 3 threads give different layouts", m, bd);
            dhsa_layout_free(a), dhsa_layout_free(b), dhsa_layout_free(c);
        }
    /* layouts_equal can fail: two different budgets */
    dhsa_router_params r1 = rparams(DHSA_ROUTE_DHSA, DHSA_BOUNDARY_SIMILARITY, 400, 0), r2 = r1;
    r2.budget_tokens = 464;
    dhsa_layout *a = route(g_ctx, &r1, &S.a, "budget 400"), *b = route(g_ctx, &r2, &S.a, "budget 464");
    T_CHECK(a && b && !layouts_equal(a, b), "layouts_equal does not tell budgets 400 and 464 apart");
    dhsa_layout_free(a), dhsa_layout_free(b);
    dhsa_ctx_free(c1), dhsa_ctx_free(c3);
    rdata_free(&S);
}

/* The router reads F32 rows with unit dim stride in place and converts
 * any other view row by row (route.c, row_f32), sums with vectorised loops
 * and scores the KV heads' boundaries in parallel: none of it may change a
 * layout. The same values as a contiguous F32 view, as an F32 view with
 * dim stride 2, and (rounded to F16 first) as F16 vs F32 views give equal
 * layouts, for every chunk score, shared heads, one and two KV heads, and
 * d = 72 (loop tails). layouts_equal can fail (test_route_determinism). */
static void test_route_views(void) {
    for (int hk = 1; hk <= 2; hk++) {
        dhsa_synth_params sp = dhsa_synth_default_params();
        sp.B = 1, sp.Hq = 4 * hk, sp.Hkv = hk, sp.L = 3000, sp.d = 72, sp.seed = 17 + (uint64_t)hk;
        dhsa_synth_needle nd[DHSA_SYNTH_MAX_NEEDLES];
        rdata S;
        if (!rdata_synth(&S, &sp, nd)) continue;
        const int64_t nq = sp.Hq * sp.L * sp.d, nk = sp.Hkv * sp.L * sp.d, d = sp.d, L = sp.L;
        float *q2 = xcalloc((size_t)(2 * nq), sizeof(float)), *k2 = xcalloc((size_t)(2 * nk), sizeof(float));
        float *qr = xcalloc((size_t)nq, sizeof(float)), *kr = xcalloc((size_t)nk, sizeof(float));
        uint16_t *qh = xcalloc((size_t)nq, 2), *kh = xcalloc((size_t)nk, 2);
        for (int64_t x = 0; x < nq; x++) {
            q2[2 * x] = S.q[x];
            qh[x] = dhsa_f32_to_f16(S.q[x]);
            qr[x] = dhsa_f16_to_f32(qh[x]);
        }
        for (int64_t x = 0; x < nk; x++) {
            k2[2 * x] = S.k[x];
            kh[x] = dhsa_f32_to_f16(S.k[x]);
            kr[x] = dhsa_f16_to_f32(kh[x]);
        }
        dhsa_attn_desc strided = S.a, half = S.a, rounded = S.a;
        strided.q.data = q2, strided.k.data = k2;
        for (int i = 0; i < 4; i++) strided.q.stride[i] *= 2, strided.k.stride[i] *= 2;
        half.q = dhsa_tensor_bhld(qh, DHSA_F16, 1, sp.Hq, L, d);
        half.k = dhsa_tensor_bhld(kh, DHSA_F16, 1, sp.Hkv, L, d);
        rounded.q = dhsa_tensor_bhld(qr, DHSA_F32, 1, sp.Hq, L, d);
        rounded.k = dhsa_tensor_bhld(kr, DHSA_F32, 1, sp.Hkv, L, d);
        S.a.causal = strided.causal = half.causal = rounded.causal = 1;
        static const dhsa_chunk_score modes[4] = {DHSA_SCORE_MOMENTS, DHSA_SCORE_POOLED, DHSA_SCORE_HEADS,
                                                 DHSA_SCORE_BOUND};
        for (int m = 0; m < 6; m++) {
            dhsa_router_params rp = rparams(DHSA_ROUTE_DHSA, m == 5 ? DHSA_BOUNDARY_FIXED : DHSA_BOUNDARY_SIMILARITY,
                                            0, 0.0625);
            rp.dense_below = 1024;
            rp.score_mode = modes[m < 4 ? m : 0];
            rp.share_heads = m == 4;
            char what[96];
            snprintf(what, sizeof what, "views Hkv %d score %d%s%s", hk, (int)rp.score_mode, m == 4 ? " shared" : "",
                     m == 5 ? " fixed" : "");
            dhsa_layout *a = route(g_ctx, &rp, &S.a, what), *b = route(g_ctx, &rp, &strided, what),
                        *c = route(g_ctx, &rp, &half, what), *e = route(g_ctx, &rp, &rounded, what);
            T_CHECK(layouts_equal(a, b), "%s: a contiguous and a dim-stride-2 F32 view route differently", what);
            T_CHECK(layouts_equal(c, e), "%s: an F16 view and the F32 view of its values route differently", what);
            dhsa_layout_free(a), dhsa_layout_free(b), dhsa_layout_free(c), dhsa_layout_free(e);
        }
        free(q2), free(k2), free(qr), free(kr), free(qh), free(kh);
        rdata_free(&S);
    }
}

/* SIMILARITY boundaries on crafted sequences with known true boundaries:
 * segments of orthogonal constant directions plus noise 1e-3 (the score,
 * 1 - cos of the mean key left and right of t, is 1 exactly at a segment
 * start and below 0.9 one step away, so the true boundary is the maximum). */
/* chunk_mean is a sum of integer lengths over a count: 1e-9 allows only the
 * rounding of that division. */
static void expect_chunks(const char *what, const dhsa_layout *lay, int64_t chunks, int64_t cmin, int64_t cmax,
                          double cmean) {
    dhsa_layout_stats st;
    if (!lay || dhsa_layout_get_stats(lay, &st) != DHSA_OK) return;
    T_CHECK(st.chunks == chunks && st.chunk_min == cmin && st.chunk_max == cmax && fabs(st.chunk_mean - cmean) < 1e-9,
            "%s: %lld chunks, lengths min %lld max %lld mean %.3f; want %lld, %lld, %lld, %.3f", what,
            (long long)st.chunks, (long long)st.chunk_min, (long long)st.chunk_max, st.chunk_mean, (long long)chunks,
            (long long)cmin, (long long)cmax, cmean);
}

static int block_is(const dhsa_layout *lay, int64_t g, int64_t qb, const int64_t *want, int64_t n) {
    return lay && block_equals(lay, 0, g, qb, want, n);
}

static void test_similarity_boundaries(void) {
    static const int64_t seg4[4] = {300, 500, 200, 400}; /* L = 1400, starts 0 300 800 1000 */
    rdata R;
    rdata_segments(&R, seg4, 4, 4, 2, 64, 1e-3, 1, 64, 31); /* last block asks for segment 1 = [300, 800) */
    R.a.causal = 1;
    dhsa_router_params rp = rparams(DHSA_ROUTE_DHSA, DHSA_BOUNDARY_SIMILARITY, 0, 0);
    rp.min_chunk = 16, rp.max_chunk = 1024, rp.threshold = 1.0f, rp.nms_window = 16, rp.sim_window = 8;
    rp.dense_below = 0, rp.sink_tokens = 0, rp.local_tokens = 0;
    /* last block: rows [1344, 1400) = 56 keys of its own diagonal, plus the
     * 500 keys of segment 1 that its queries point at: exactly the budget */
    rp.budget_tokens = 56 + 500;
    const int64_t lastqb = (1400 - 1) / 64, want_last[4] = {300, 800, 1344, 1400};
    for (int causal_b = 0; causal_b < 2; causal_b++) {
        rp.causal_boundaries = causal_b;
        char what[128];
        snprintf(what, sizeof what, "segments 300/500/200/400, threshold 1, nms 16%s",
                 causal_b ? ", causal boundaries" : "");
        dhsa_layout *lay = route(g_ctx, &rp, &R.a, what);
        expect_chunks(what, lay, 4, 200, 500, 350.0);
        check_routed(what, lay, &rp, &R.a);
        for (int64_t g = 0; g < 2; g++)
            T_CHECK(block_is(lay, g, lastqb, want_last, 2),
                    "%s: the last block (KV head %lld) should select exactly segment 1 [300, 800) and its own rows "
                    "[1344, 1400)", what, (long long)g);
        dhsa_layout_free(lay);
    }
    rp.causal_boundaries = 0;
    /* deliberately wrong expectation: the segment shifted by one key */
    {
        dhsa_layout *lay = route(g_ctx, &rp, &R.a, "segments, shifted expectation");
        const int64_t shifted[4] = {301, 800, 1344, 1400};
        T_CHECK(lay && !block_is(lay, 0, lastqb, shifted, 2), "a boundary off by one also matches");
        dhsa_layout_free(lay);
    }
    /* max_chunk 256 splits spans evenly: 300 -> 150+150, 500 -> 250+250,
     * 200, 400 -> 200+200: 7 chunks, 150..250, mean 200 */
    rp.max_chunk = 256;
    dhsa_layout *lay = route(g_ctx, &rp, &R.a, "segments, max_chunk 256");
    expect_chunks("segments, max_chunk 256", lay, 7, 150, 250, 200.0);
    check_routed("segments, max_chunk 256", lay, &rp, &R.a);
    dhsa_layout_free(lay);
    /* a threshold no score reaches: no boundary; max_chunk 1024 cuts 1400
     * into two halves of 700 */
    rp.max_chunk = 1024, rp.threshold = 100.0f;
    lay = route(g_ctx, &rp, &R.a, "segments, threshold 100");
    expect_chunks("segments, threshold 100", lay, 2, 700, 700, 700.0);
    dhsa_layout_free(lay);
    /* FIXED ignores the content: chunks = ceil(1400 / 64) = 22, the last 56 */
    rp.boundary = DHSA_BOUNDARY_FIXED, rp.chunk = 64;
    lay = route(g_ctx, &rp, &R.a, "segments, fixed 64");
    expect_chunks("segments, fixed 64", lay, 22, 56, 64, 1400.0 / 22);
    dhsa_layout_free(lay);
    rp.chunk = 100;
    lay = route(g_ctx, &rp, &R.a, "segments, fixed 100");
    expect_chunks("segments, fixed 100", lay, 14, 100, 100, 100.0);
    dhsa_layout_free(lay);
    rdata_free(&R);

    /* NMS: segments 300, 5, 300 have true boundaries at 300 and 305, 5 apart.
     * With nms_window 16 only one survives (2 chunks, both >= 300); with no
     * NMS and min_chunk 1 both do (3 chunks, one of 5 keys: the check can
     * fail); with no NMS but min_chunk 16 the 5-key chunk is refused. */
    static const int64_t seg3[3] = {300, 5, 300};
    rdata_segments(&R, seg3, 3, 2, 1, 64, 1e-3, 0, 64, 32);
    R.a.causal = 1;
    rp = rparams(DHSA_ROUTE_DHSA, DHSA_BOUNDARY_SIMILARITY, 200, 0);
    rp.min_chunk = 16, rp.max_chunk = 1024, rp.threshold = 1.0f, rp.nms_window = 16, rp.dense_below = 0;
    lay = route(g_ctx, &rp, &R.a, "segments 300/5/300, nms 16");
    {
        dhsa_layout_stats st;
        if (lay && dhsa_layout_get_stats(lay, &st) == DHSA_OK)
            T_CHECK(st.chunks == 2 && st.chunk_min >= 300 && st.chunk_max <= 305,
                    "segments 300/5/300 with nms_window 16: %lld chunks, min %lld max %lld; want 2 chunks of 300/305",
                    (long long)st.chunks, (long long)st.chunk_min, (long long)st.chunk_max);
    }
    check_routed("segments 300/5/300, nms 16", lay, &rp, &R.a);
    dhsa_layout_free(lay);
    rp.nms_window = 0, rp.min_chunk = 1;
    lay = route(g_ctx, &rp, &R.a, "segments 300/5/300, no nms, min_chunk 1");
    expect_chunks("segments 300/5/300, no NMS, min_chunk 1 (must show both boundaries)", lay, 3, 5, 300, 605.0 / 3);
    dhsa_layout_free(lay);
    rp.nms_window = 0, rp.min_chunk = 16;
    lay = route(g_ctx, &rp, &R.a, "segments 300/5/300, no nms, min_chunk 16");
    {
        dhsa_layout_stats st;
        if (lay && dhsa_layout_get_stats(lay, &st) == DHSA_OK)
            T_CHECK(st.chunks == 2 && st.chunk_min >= 300,
                    "segments 300/5/300, no NMS, min_chunk 16: %lld chunks, min %lld; want 2 chunks >= 300",
                    (long long)st.chunks, (long long)st.chunk_min);
    }
    dhsa_layout_free(lay);
    /* nms_window larger than a real segment: 300/40/300 with nms 50 keeps
     * one boundary; with nms 30 both (40 > 30) */
    rdata_free(&R);
    static const int64_t seg3b[3] = {300, 40, 300};
    rdata_segments(&R, seg3b, 3, 2, 1, 64, 1e-3, 0, 64, 33);
    R.a.causal = 1;
    rp.min_chunk = 16, rp.nms_window = 50;
    lay = route(g_ctx, &rp, &R.a, "segments 300/40/300, nms 50");
    {
        dhsa_layout_stats st;
        if (lay && dhsa_layout_get_stats(lay, &st) == DHSA_OK)
            T_CHECK(st.chunks == 2, "segments 300/40/300 with nms_window 50: %lld chunks, want 2", (long long)st.chunks);
    }
    dhsa_layout_free(lay);
    rp.nms_window = 30;
    lay = route(g_ctx, &rp, &R.a, "segments 300/40/300, nms 30");
    expect_chunks("segments 300/40/300, nms 30", lay, 3, 40, 300, 640.0 / 3);
    dhsa_layout_free(lay);
    rdata_free(&R);
}

/* Edge shapes: no keys, fewer keys than a window, queries placed beyond the
 * keys (rows that see nothing next to rows that see some). */
static void test_route_edges(void) {
    struct {
        const char *what;
        int64_t Lq, Lk, q_pos0, window;
        int causal;
        dhsa_route_method m;
        dhsa_boundary bd;
        int64_t dense_below, budget;
    } ec[] = {
        {"Lk = 0", 10, 0, 0, 0, 1, DHSA_ROUTE_DHSA, DHSA_BOUNDARY_SIMILARITY, 0, 16},
        {"Lk = 5 < sim_window, dense_below 0", 5, 5, 0, 0, 1, DHSA_ROUTE_DHSA, DHSA_BOUNDARY_SIMILARITY, 0, 2},
        {"Lk = 1, fixed", 3, 1, 0, 0, 0, DHSA_ROUTE_DHSA, DHSA_BOUNDARY_FIXED, 0, 1},
        {"queries beyond the keys, window 16 (dense)", 31, 100, 90, 16, 1, DHSA_ROUTE_DHSA,
         DHSA_BOUNDARY_SIMILARITY, 2048, 16},
        {"queries beyond the keys, window 16 (routed)", 31, 100, 90, 16, 1, DHSA_ROUTE_DHSA, DHSA_BOUNDARY_FIXED,
         0, 8},
        {"all queries beyond keys + window", 8, 40, 60, 16, 1, DHSA_ROUTE_DHSA, DHSA_BOUNDARY_SIMILARITY, 2048, 16},
        {"non-causal window, queries beyond the keys", 40, 50, 30, 20, 0, DHSA_ROUTE_STREAM,
         DHSA_BOUNDARY_SIMILARITY, 0, 6},
    };
    for (size_t c = 0; c < sizeof ec / sizeof ec[0]; c++) {
        rdata R;
        rdata_random(&R, 1, 2, 1, ec[c].Lq, ec[c].Lk, 16, 500 + c);
        R.a.causal = ec[c].causal, R.a.q_pos0 = ec[c].q_pos0, R.a.window = ec[c].window;
        dhsa_router_params rp = rparams(ec[c].m, ec[c].bd, ec[c].budget, 0);
        rp.q_block = 64, rp.dense_below = ec[c].dense_below, rp.sink_tokens = 2, rp.local_tokens = 4, rp.chunk = 8;
        dhsa_layout *lay = route(g_ctx, &rp, &R.a, ec[c].what);
        check_routed(ec[c].what, lay, &rp, &R.a);
        if (lay && c == 3) {
            /* every block is dense here (it sees 25 < dense_below keys): the
             * routed layout must give the dense result, row for row */
            dhsa_attn_desc a = R.a;
            float *od = xcalloc((size_t)(2 * R.Lq * 16), 4), *ld = xcalloc((size_t)(2 * R.Lq), 4);
            float *os = xcalloc((size_t)(2 * R.Lq * 16), 4), *ls = xcalloc((size_t)(2 * R.Lq), 4);
            a.v = dhsa_tensor_bhld(R.v, DHSA_F32, 1, 1, R.Lk, 16);
            a.o = dhsa_tensor_bhld(od, DHSA_F32, 1, 2, R.Lq, 16);
            a.lse = dhsa_tensor_bhld(ld, DHSA_F32, 1, 2, R.Lq, 1);
            dhsa_status st = dhsa_attention(g_ctx, &a);
            a.o.data = os, a.lse.data = ls, a.layout = lay;
            st |= dhsa_attention(g_ctx, &a);
            int64_t lost = 0, live = 0;
            for (int64_t x = 0; x < 2 * R.Lq; x++) {
                live += ld[x] != -INFINITY;
                lost += ld[x] != -INFINITY && ls[x] == -INFINITY;
            }
            T_CHECK(st == DHSA_OK && live > 0 && lost == 0,
                    "%s: with the routed (dense) layout %lld of the %lld rows that see keys get none (lse -inf, o 0)",
                    ec[c].what, (long long)lost, (long long)live);
            free(od), free(ld), free(os), free(ls);
        }
        dhsa_layout_free(lay);
        rdata_free(&R);
    }
}

/* A routed layout through the kernel: equals the oracle restricted to the
 * keys the layout selects (dhsa_layout_selects), TILED and REFERENCE. */
static void test_routed_attention(void) {
    sinst I;
    /* build the inputs with an all-selecting layout, then swap in a routed one */
    s_init(&I, &(scase){.tag = "routed", .Hq = 4, .Hkv = 2, .Lq = 2100, .Lk = 2100, .d = 32, .q_block = 64,
                        .causal = 1, .sel = SEL_ALL, .seed = 21});
    if (!I.lay) { s_free(&I); return; }
    dhsa_layout_free(I.lay);
    dhsa_router_params rp = rparams(DHSA_ROUTE_DHSA, DHSA_BOUNDARY_SIMILARITY, 300, 0);
    rp.sink_tokens = 16, rp.local_tokens = 64;
    I.lay = route(g_ctx, &rp, &I.a, "routed attention");
    I.a.layout = I.lay;
    if (!I.lay) { s_free(&I); return; }
    const scase *s = &I.s;
    for (int64_t b = 0; b < s->B; b++)
        for (int64_t g = 0; g < s->Hkv; g++)
            for (int64_t qb = 0; qb < I.nqb; qb++)
                for (int64_t j = 0; j < s->Lk; j++)
                    I.sel[((b * s->Hkv + g) * I.nqb + qb) * s->Lk + j] =
                        (uint8_t)(dhsa_layout_selects(I.lay, b, g, qb * s->q_block, j) == 1);
    s_oracle(&I, I.sel, I.ref_o, I.ref_lse);
    s_check(&I, g_ctx, DHSA_BACKEND_TILED);
    s_check(&I, g_ctx, DHSA_BACKEND_REFERENCE);
    s_free(&I);
}

/* ======================================================================== */
/* 5. The oracle method: recall upper bound and needles                     */

typedef struct {
    float *o, *lse;
    dhsa_tensor to, tl;
} outbuf;

static void outbuf_make(outbuf *ob, int64_t B, int64_t Hq, int64_t L, int64_t d) {
    ob->o = xcalloc((size_t)(B * Hq * L * d), sizeof(float));
    ob->lse = xcalloc((size_t)(B * Hq * L), sizeof(float));
    ob->to = dhsa_tensor_bhld(ob->o, DHSA_F32, B, Hq, L, d);
    ob->tl = dhsa_tensor_bhld(ob->lse, DHSA_F32, B, Hq, L, 1);
}

/* Attention of R (its own causal/window) with a layout (NULL = dense) into ob. */
static int attend(const rdata *R, const dhsa_layout *lay, outbuf *ob, dhsa_backend be) {
    dhsa_attn_desc a = R->a;
    a.v = dhsa_tensor_bhld(R->v, DHSA_F32, R->B, R->Hkv, R->Lk, R->d);
    a.o = ob->to;
    a.lse = ob->tl;
    a.layout = lay;
    a.backend = be;
    dhsa_status st = dhsa_attention(g_ctx, &a);
    T_CHECK(st == DHSA_OK, "attention (%s, %s): %s", lay ? "sparse" : "dense", dhsa_backend_name(be),
            dhsa_last_error());
    return st == DHSA_OK;
}

static double recall_of(const rdata *R, const dhsa_router_params *rp, const outbuf *dense, const char *what,
                        dhsa_layout **keep) {
    dhsa_layout *lay = route(g_ctx, rp, &R->a, what);
    double rec = -1;
    if (lay) {
        outbuf sp;
        outbuf_make(&sp, R->B, R->Hq, R->Lq, R->d);
        dhsa_fidelity f;
        if (attend(R, lay, &sp, DHSA_BACKEND_TILED) &&
            dhsa_fidelity_compare(&dense->to, &dense->tl, &sp.to, &sp.tl, &f) == DHSA_OK)
            rec = f.recall;
        free(sp.o), free(sp.lse);
    }
    if (keep) *keep = lay;
    else dhsa_layout_free(lay);
    return rec;
}

/* The oracle's ranking against masses computed here in double: with fixed
 * chunks (all one size) the oracle must select, for every query block,
 * chunks whose true attention mass (the block's rows and the group's
 * heads, causal and window applied) is at least that of every chunk it
 * left out. Chunks that meet the sinks or the local window, that a row of
 * the block cannot see whole, or that the budget cut are not compared.
 * Shapes: a block's columns (q_block x G) fewer than, equal to and more
 * than the 64 scored together, a last partial block, a window, and
 * chunked prefill (q_pos0 > 0). The same check on another block's masses
 * must fail somewhere, so the check can see a wrong oracle. */
static double oracle_mass(const rdata *R, int64_t g, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    int64_t d = R->d, G = R->Hq / R->Hkv;
    double scale = 1.0 / sqrt((double)d), mass = 0.0;
    double *s = xcalloc((size_t)R->Lk, sizeof(double));
    for (int64_t h = g * G; h < (g + 1) * G; h++)
        for (int64_t r = r0; r < r1; r++) {
            int64_t pos = R->a.q_pos0 + r, hi = pos + 1 < R->Lk ? pos + 1 : R->Lk;
            int64_t lo = R->a.window > 0 && pos - R->a.window + 1 > 0 ? pos - R->a.window + 1 : 0;
            double mx = -INFINITY, z = 0.0, in = 0.0;
            for (int64_t j = lo; j < hi; j++) {
                double v = 0.0;
                for (int64_t x = 0; x < d; x++)
                    v += (double)R->q[(h * R->Lq + r) * d + x] * (double)R->k[(g * R->Lk + j) * d + x];
                s[j] = v * scale;
                if (s[j] > mx) mx = s[j];
            }
            for (int64_t j = lo; j < hi; j++) {
                double e = exp(s[j] - mx);
                z += e;
                if (j >= c0 && j < c1) in += e;
            }
            if (z > 0) mass += in / z;
        }
    free(s);
    return mass;
}

static void test_oracle_masses(void) {
    struct {
        const char *what;
        int64_t Hq, Hkv, Lq, Lk, q_pos0, window, q_block;
    } cs[] = {
        {"G 2, q_block 16 (32 columns: two blocks a tile), L 1000", 4, 2, 1000, 1000, 0, 0, 16},
        {"G 8, q_block 16 (128 columns: two tiles a block), window 300", 8, 1, 700, 700, 0, 300, 16},
        {"G 1, q_block 5 (12 blocks and a part a tile), chunked prefill 300 of 900", 4, 4, 300, 900, 600, 0, 5},
        {"G 4, q_block 16 (64 columns), L 777", 8, 2, 777, 777, 0, 0, 16},
    };
    int64_t wrong_seen = 0;
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
        rdata R;
        rdata_random(&R, 1, cs[ci].Hq, cs[ci].Hkv, cs[ci].Lq, cs[ci].Lk, 32, 40 + ci);
        for (int64_t x = 0; x < R.Hq * R.Lq * R.d; x++) R.q[x] *= 0.6f; /* peaked, not flat */
        R.a = dhsa_attn_default_desc();
        R.a.q = dhsa_tensor_bhld(R.q, DHSA_F32, 1, R.Hq, R.Lq, R.d);
        R.a.k = dhsa_tensor_bhld(R.k, DHSA_F32, 1, R.Hkv, R.Lk, R.d);
        R.a.causal = 1, R.a.q_pos0 = cs[ci].q_pos0, R.a.window = cs[ci].window;
        dhsa_router_params rp = rparams(DHSA_ROUTE_ORACLE, DHSA_BOUNDARY_FIXED, 128, 0);
        rp.chunk = 16, rp.sink_tokens = 16, rp.local_tokens = 32, rp.q_block = cs[ci].q_block;
        dhsa_layout *lay = route(g_ctx, &rp, &R.a, cs[ci].what);
        if (!lay) {
            rdata_free(&R);
            continue;
        }
        int64_t compared = 0, bad = 0, wrong = 0, nqb = (R.Lq + rp.q_block - 1) / rp.q_block;
        for (int64_t g = 0; g < R.Hkv; g++)
            for (int64_t qb = 1; qb < nqb; qb++) {
                int64_t r0 = qb * rp.q_block, r1 = r0 + rp.q_block < R.Lq ? r0 + rp.q_block : R.Lq;
                int64_t first = R.a.q_pos0 + r0, last = R.a.q_pos0 + r1 - 1;
                int64_t vis_lo = R.a.window > 0 && last - R.a.window + 1 > 0 ? last - R.a.window + 1 : 0;
                double min_in = INFINITY, max_out = -INFINITY, wmin_in = INFINITY, wmax_out = -INFINITY;
                int n_in = 0, n_out = 0;
                for (int64_t c0 = 0; c0 + 16 <= first + 1; c0 += 16) {
                    /* whole for every row, away from the sinks and the local keys */
                    if (c0 < rp.sink_tokens || c0 < vis_lo || c0 + 16 > first + 1 - rp.local_tokens) continue;
                    int sel = 0;
                    for (int64_t j = c0; j < c0 + 16; j++) sel += dhsa_layout_selects(lay, 0, g, r0, j) == 1;
                    if (sel != 0 && sel != 16) continue;
                    double ms = oracle_mass(&R, g, r0, r1, c0, c0 + 16);
                    double mw = oracle_mass(&R, g, r0 - rp.q_block, r0, c0, c0 + 16); /* the block before */
                    if (sel == 16) {
                        min_in = ms < min_in ? ms : min_in, wmin_in = mw < wmin_in ? mw : wmin_in, n_in++;
                    } else {
                        max_out = ms > max_out ? ms : max_out, wmax_out = mw > wmax_out ? mw : wmax_out, n_out++;
                    }
                }
                if (n_in == 0 || n_out == 0) continue;
                compared++;
                if (max_out > min_in * (1 + 1e-4) + 1e-9) {
                    if (bad++ < 3)
                        T_CHECK(0, "oracle (%s): KV head %lld block %lld left out a chunk of mass %.6g above a "
                                "selected one's %.6g", cs[ci].what, (long long)g, (long long)qb, max_out, min_in);
                }
                wrong += wmax_out > wmin_in * (1 + 1e-4) + 1e-9;
            }
        T_CHECK(bad == 0, "oracle (%s): %lld of %lld blocks out of mass order", cs[ci].what, (long long)bad,
                (long long)compared);
        T_CHECK(compared >= nqb / 2, "oracle (%s): only %lld of %lld blocks could be compared", cs[ci].what,
                (long long)compared, (long long)nqb);
        wrong_seen += wrong;
        dhsa_layout_free(lay);
        rdata_free(&R);
    }
    T_CHECK(wrong_seen > 0, "the mass-order check passes the previous block's masses too: it cannot see a wrong oracle");
}

static void test_oracle(void) {
    dhsa_synth_params sp = dhsa_synth_default_params();
    sp.B = 1, sp.Hq = 4, sp.Hkv = 2, sp.L = 2048, sp.d = 64, sp.seed = 3;
    dhsa_synth_needle nd[DHSA_SYNTH_MAX_NEEDLES];
    rdata S;
    if (!rdata_synth(&S, &sp, nd)) return;
    S.a.causal = 1;
    outbuf dense;
    outbuf_make(&dense, S.B, S.Hq, S.Lq, S.d);
    if (attend(&S, NULL, &dense, DHSA_BACKEND_TILED)) {
        /* Recalls compared at the same budget (512 of 2048 keys, sinks 64,
         * local 128). The oracle ranks the same chunks by their true mass,
         * so it must do at least as well; the slack 1e-6 covers only float
         * rounding of the LSEs the recalls come from (exp(lse_s - lse_d)
         * with |lse| < ~40: a few ulp, ~1e-6 relative at worst per row,
         * averaging far below that). */
        dhsa_router_params rp = rparams(DHSA_ROUTE_DHSA, DHSA_BOUNDARY_SIMILARITY, 512, 0);
        rp.dense_below = 0, rp.local_tokens = 128;
        double dhsa_sim = recall_of(&S, &rp, &dense, "dhsa/similarity", NULL);
        rp.boundary = DHSA_BOUNDARY_FIXED;
        double block = recall_of(&S, &rp, &dense, "block (fixed 64)", NULL);
        rp.method = DHSA_ROUTE_ORACLE;
        double oracle_fixed = recall_of(&S, &rp, &dense, "oracle/fixed", NULL);
        rp.boundary = DHSA_BOUNDARY_SIMILARITY;
        double oracle_sim = recall_of(&S, &rp, &dense, "oracle/similarity", NULL);
        rp.method = DHSA_ROUTE_STREAM;
        double stream = recall_of(&S, &rp, &dense, "stream", NULL);
        printf("test_route: L=2048 budget 512 recall: dhsa %.4f, block %.4f, stream %.4f, oracle/similarity %.4f, "
               "oracle/fixed %.4f\n", dhsa_sim, block, stream, oracle_sim, oracle_fixed);
        T_CHECK(dhsa_sim > 0 && block > 0 && stream > 0 && oracle_sim > 0 && oracle_fixed > 0,
                "a recall could not be computed");
        T_CHECK(oracle_sim >= dhsa_sim - 1e-6, "oracle/similarity recall %.6f below DHSA's %.6f at the same budget",
                oracle_sim, dhsa_sim);
        T_CHECK(oracle_sim >= block - 1e-6, "oracle/similarity recall %.6f below block's %.6f at the same budget",
                oracle_sim, block);
        T_CHECK(oracle_fixed >= block - 1e-6, "oracle/fixed recall %.6f below block's %.6f (same chunks)",
                oracle_fixed, block);
        T_CHECK(oracle_sim >= stream - 1e-6 && oracle_fixed >= stream - 1e-6,
                "oracle recall (%.6f, %.6f) below streaming's %.6f", oracle_sim, oracle_fixed, stream);
        T_CHECK(oracle_sim < 1.0 && dhsa_sim < oracle_sim + 0.5, "recalls are degenerate (oracle %.6f)", oracle_sim);

        /* needles: a generous budget (1024) makes the oracle select every
         * key of every needle passage for the block that asks for it, for
         * every KV head */
        rp.method = DHSA_ROUTE_ORACLE, rp.budget_tokens = 1024;
        dhsa_layout *lay = NULL;
        recall_of(&S, &rp, &dense, "oracle, needles", &lay);
        if (lay) {
            for (int i = 0; i < sp.n_needles; i++)
                for (int64_t g = 0; g < S.Hkv; g++) {
                    int64_t missed = 0;
                    for (int64_t j = nd[i].key; j < nd[i].key + nd[i].len; j++)
                        missed += dhsa_layout_selects(lay, 0, g, nd[i].row, j) != 1;
                    T_CHECK(nd[i].len > 0 && missed == 0,
                            "oracle (budget 1024) misses %lld of the %lld keys of needle %d (passage at %lld) for "
                            "row %lld, KV head %lld", (long long)missed, (long long)nd[i].len, i,
                            (long long)nd[i].key, (long long)nd[i].row, (long long)g);
                }
            dhsa_layout_free(lay);
        }
        /* the needle check can fail: a streaming layout of 256 recent keys
         * misses the early needles */
        rp.method = DHSA_ROUTE_STREAM, rp.budget_tokens = 256;
        lay = route(g_ctx, &rp, &S.a, "stream, needles");
        if (lay) {
            int missed = 0;
            for (int i = 0; i < sp.n_needles; i++)
                for (int64_t j = nd[i].key; j < nd[i].key + nd[i].len; j++)
                    missed += dhsa_layout_selects(lay, 0, 0, nd[i].row, j) != 1;
            T_CHECK(missed > 0, "a 256-key streaming layout selects every needle: the needle check cannot fail");
            dhsa_layout_free(lay);
        }
    }
    free(dense.o), free(dense.lse);
    rdata_free(&S);
}

/* ======================================================================== */
/* 6. Fidelity                                                              */

static void test_fidelity(void) {
    sinst I;
    s_init(&I, &(scase){.tag = "fidelity-half", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 300, .Lk = 300, .d = 64,
                        .q_block = 64, .causal = 1, .sel = SEL_HALF, .seed = 61});
    if (!I.lay) { s_free(&I); return; }
    const scase *s = &I.s;
    const int64_t rows = s->B * s->Hq * s->Lq;
    outbuf dn, sp;
    outbuf_make(&dn, s->B, s->Hq, s->Lq, s->d);
    outbuf_make(&sp, s->B, s->Hq, s->Lq, s->d);
    dhsa_attn_desc a = I.a;
    a.o = dn.to, a.lse = dn.tl, a.layout = NULL;
    dhsa_status st = dhsa_attention(g_ctx, &a);
    a.o = sp.to, a.lse = sp.tl, a.layout = I.lay;
    st |= dhsa_attention(g_ctx, &a);
    T_CHECK(st == DHSA_OK, "fidelity: attention failed: %s", dhsa_last_error());
    dhsa_fidelity f;
    memset(&f, 0xFF, sizeof f);
    /* identical inputs: recall exactly 1 (exp(0)), rel_err exactly 0 */
    T_CHECK(dhsa_fidelity_compare(&dn.to, &dn.tl, &dn.to, &dn.tl, &f) == DHSA_OK && f.recall == 1.0 &&
                f.recall_min == 1.0 && f.rel_err == 0.0 && f.rows == rows,
            "fidelity of a result with itself: recall %.17g min %.17g rel_err %g rows %lld (want 1, 1, 0, %lld)",
            f.recall, f.recall_min, f.rel_err, (long long)f.rows, (long long)rows);
    /* half the keys: recall against the selected softmax mass in double.
     * Tolerance 1e-5: the recall comes from exp(lse_sparse - lse_dense) of
     * two TILED LSEs, each within ~1e-6 of exact here (scores |s| < ~8, lse
     * < ~10: a few fp32 ulp); the mean over 2400 rows stays well inside. */
    double mass_sum = 0, mass_min = 1, num = 0, den = 0;
    int64_t counted = 0;
    const int64_t G = s->Hq / s->Hkv;
    double *sc = xcalloc((size_t)s->Lk, sizeof(double));
    for (int64_t b = 0; b < s->B; b++)
        for (int64_t h = 0; h < s->Hq; h++)
            for (int64_t i = 0; i < s->Lq; i++) {
                int64_t lo, hi, x = (b * s->Hq + h) * s->Lq + i;
                key_span(s->Lk, 1, 0, i, &lo, &hi);
                const uint8_t *bits = I.sel + ((b * s->Hkv + h / G) * I.nqb + i / s->q_block) * s->Lk;
                double m = -INFINITY, tot = 0, sel = 0;
                for (int64_t j = lo; j < hi; j++) {
                    double dot = 0;
                    for (int64_t c = 0; c < s->d; c++)
                        dot += I.cq[x * s->d + c] * I.ck[((b * s->Hkv + h / G) * s->Lk + j) * s->d + c];
                    sc[j] = dot / sqrt((double)s->d);
                    if (sc[j] > m) m = sc[j];
                }
                for (int64_t j = lo; j < hi; j++) {
                    double p = exp(sc[j] - m);
                    tot += p;
                    if (bits[j]) sel += p;
                }
                mass_sum += sel / tot;
                if (sel / tot < mass_min) mass_min = sel / tot;
                counted++;
                for (int64_t c = 0; c < s->d; c++) {
                    double dd = dn.o[x * s->d + c], ss = sp.o[x * s->d + c];
                    num += (dd - ss) * (dd - ss), den += dd * dd;
                }
            }
    free(sc);
    double bf = mass_sum / (double)counted;
    st = dhsa_fidelity_compare(&dn.to, &dn.tl, &sp.to, &sp.tl, &f);
    T_CHECK(st == DHSA_OK, "fidelity_compare: %s", dhsa_last_error());
    T_CHECK(fabs(f.recall - bf) <= 1e-5, "half-key layout: recall %.9f, brute-force selected mass %.9f (|diff| %.2e)",
            f.recall, bf, fabs(f.recall - bf));
    T_CHECK(fabs(f.recall_min - mass_min) <= 1e-5, "half-key layout: recall_min %.9f, brute force %.9f", f.recall_min,
            mass_min);
    T_CHECK(f.rows == counted, "fidelity rows %lld, want %lld", (long long)f.rows, (long long)counted);
    /* rel_err: both sides sum the same float values in double; only the order may differ */
    double rel = sqrt(num / den);
    T_CHECK(fabs(f.rel_err - rel) <= 1e-9 * rel, "rel_err %.12g, brute force %.12g", f.rel_err, rel);
    T_CHECK(bf > 0.2 && bf < 0.9, "half-key layout keeps %.3f of the mass: not a meaningful test", bf);
    /* the recall check can fail: against the mass of the complement */
    T_CHECK(fabs(f.recall - (1 - bf)) > 1e-3, "recall also matches the complement's mass");
    /* errors */
    dhsa_tensor bad = sp.to;
    bad.shape[2] = s->Lq - 1;
    plant_error();
    T_CHECK(dhsa_fidelity_compare(&dn.to, &dn.tl, &bad, &sp.tl, &f) == DHSA_ERR_SHAPE && fresh_error(),
            "fidelity_compare with a shorter sparse o: not SHAPE");
    plant_error();
    T_CHECK(dhsa_fidelity_compare(&dn.to, &dn.tl, &sp.to, NULL, &f) < 0 && fresh_error(),
            "fidelity_compare with lse NULL succeeded");
    bad = sp.to;
    bad.type = DHSA_F16;
    plant_error();
    T_CHECK(dhsa_fidelity_compare(&dn.to, &dn.tl, &bad, &sp.tl, &f) < 0 && fresh_error(),
            "fidelity_compare with an F16 view succeeded");
    free(dn.o), free(dn.lse), free(sp.o), free(sp.lse);
    s_free(&I);
}

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

/* ======================================================================== */
/* 8. Synthetic workloads                                                   */

static void test_synth(void) {
    dhsa_synth_params sp = dhsa_synth_default_params();
    sp.B = 2, sp.Hq = 4, sp.Hkv = 2, sp.L = 2000, sp.d = 32, sp.seed = 17;
    const size_t nq = (size_t)(sp.B * sp.Hq * sp.L * sp.d), nk = (size_t)(sp.B * sp.Hkv * sp.L * sp.d);
    float *q1 = xcalloc(nq, 4), *k1 = xcalloc(nk, 4), *v1 = xcalloc(nk, 4);
    float *q2 = xcalloc(nq, 4), *k2 = xcalloc(nk, 4), *v2 = xcalloc(nk, 4);
    dhsa_synth_needle n1[DHSA_SYNTH_MAX_NEEDLES], n2[DHSA_SYNTH_MAX_NEEDLES];
    memset(n1, 0, sizeof n1), memset(n2, 0, sizeof n2);
    dhsa_status st = dhsa_synth_generate(&sp, q1, k1, v1, n1);
    T_CHECK(st == DHSA_OK, "synth_generate: %s", dhsa_last_error());
    st = dhsa_synth_generate(&sp, q2, k2, v2, n2);
    T_CHECK(st == DHSA_OK && !memcmp(q1, q2, nq * 4) && !memcmp(k1, k2, nk * 4) && !memcmp(v1, v2, nk * 4) &&
                !memcmp(n1, n2, sizeof n1),
            "synth_generate is not deterministic for a seed");
    int finite = 1;
    for (size_t x = 0; x < nq; x++) finite &= isfinite(q1[x]) != 0;
    for (size_t x = 0; x < nk; x++) finite &= isfinite(k1[x]) && isfinite(v1[x]);
    T_CHECK(finite, "synth_generate wrote a non-finite value");
    sp.seed = 18;
    st = dhsa_synth_generate(&sp, q2, k2, v2, n2);
    T_CHECK(st == DHSA_OK && memcmp(q1, q2, nq * 4) && memcmp(k1, k2, nk * 4) && memcmp(v1, v2, nk * 4),
            "synth_generate gives the same data for seeds 17 and 18");
    /* needles: the passage [key, key + len) within [0, L), at depth x L;
     * asked for by query block (last - i), rows [row, row + rows); the
     * question comes after the passage (DESIGN.md 7: "a key that a later
     * query matches strongly"; the header: "a fact far back") */
    const int64_t nqb = (sp.L + sp.q_block - 1) / sp.q_block;
    for (int i = 0; i < sp.n_needles; i++) {
        const dhsa_synth_needle *x = &n1[i];
        int rank = 0; /* the deepest needle is asked by the last block (dhsa.h) */
        for (int o = 0; o < sp.n_needles; o++)
            rank += sp.depths[o] > sp.depths[i] || (sp.depths[o] == sp.depths[i] && o < i);
        int64_t r0 = (nqb - 1 - rank) * sp.q_block, r1 = r0 + sp.q_block < sp.L ? r0 + sp.q_block : sp.L;
        T_CHECK(x->key == (int64_t)(sp.depths[i] * (double)sp.L) && x->len == sp.needle_len && x->key >= 0 &&
                    x->key + x->len <= sp.L,
                "needle %d: passage [%lld, +%lld), want [%lld, +%lld) inside L=%lld", i, (long long)x->key,
                (long long)x->len, (long long)(int64_t)(sp.depths[i] * (double)sp.L), (long long)sp.needle_len,
                (long long)sp.L);
        T_CHECK(x->row == r0 && x->rows == r1 - r0, "needle %d: asked by rows [%lld, +%lld), want block %lld = [%lld, +%lld)",
                i, (long long)x->row, (long long)x->rows, (long long)(nqb - 1 - rank), (long long)r0, (long long)(r1 - r0));
        T_CHECK(x->row >= x->key + x->len, "needle %d: its question rows start at %lld, before the passage ends at %lld",
                i, (long long)x->row, (long long)(x->key + x->len));
    }
    /* a deep needle (depth 0.99, L = 1000): its question (block last - 1 =
     * rows 896..959) would come before the passage, which no causal query
     * could read: refused with a sentence naming the depth */
    sp.seed = 17, sp.L = 1000, sp.n_needles = 2, sp.depths[0] = 0.5, sp.depths[1] = 0.99;
    st = dhsa_synth_generate(&sp, q2, k2, v2, n2);
    T_CHECK(st == DHSA_ERR_INVALID_ARG && strstr(dhsa_last_error(), "0.99"),
            "synth_generate with an unreadable needle: %s, %s", dhsa_status_str(st), dhsa_last_error());
    sp.depths[1] = 0.8; /* [800, 816) is before rows 896..: accepted */
    st = dhsa_synth_generate(&sp, q2, k2, v2, n2);
    T_CHECK(st == DHSA_OK, "synth_generate with needles at 0.5, 0.8, L=1000: %s", dhsa_last_error());
    for (int i = 0; st == DHSA_OK && i < 2; i++)
        T_CHECK(n2[i].row >= n2[i].key + n2[i].len, "needle %d: question rows from %lld, passage ends at %lld", i,
                (long long)n2[i].row, (long long)(n2[i].key + n2[i].len));
    /* bad parameters: an error with a sentence */
    const dhsa_synth_params good = sp;
    struct {
        const char *what;
        dhsa_synth_params p;
    } bad[16];
    int n = 0;
#define SBAD(desc, set)                                  \
    do {                                                 \
        bad[n].what = desc;                              \
        bad[n].p = good;                                 \
        { dhsa_synth_params *p_ = &bad[n].p; set; }      \
        n++;                                             \
    } while (0)
    SBAD("B 0", p_->B = 0);
    SBAD("Hq 3 over Hkv 2", p_->Hq = 3);
    SBAD("Hkv 0", p_->Hkv = 0);
    SBAD("L 0", p_->L = 0);
    SBAD("d 0", p_->d = 0);
    SBAD("seg_min 0", p_->seg_min = 0);
    SBAD("seg_max < seg_min", (p_->seg_min = 50, p_->seg_max = 40));
    SBAD("n_needles -1", p_->n_needles = -1);
    SBAD("n_needles 65", p_->n_needles = DHSA_SYNTH_MAX_NEEDLES + 1);
    SBAD("q_block 0", p_->q_block = 0);
    SBAD("depth 1.0", p_->depths[1] = 1.0);
    SBAD("depth -0.1", p_->depths[0] = -0.1);
    SBAD("depth NaN", p_->depths[0] = NAN);
    SBAD("needle_len 0", p_->needle_len = 0);
    SBAD("2 needles with 1 query block", (p_->L = 60, p_->q_block = 64));
#undef SBAD
    for (int c = 0; c < n; c++) {
        plant_error();
        st = dhsa_synth_generate(&bad[c].p, q2, k2, v2, n2);
        T_CHECK(st < 0 && fresh_error(), "synth_generate with %s: %s, sentence \"%s\"", bad[c].what,
                dhsa_status_str(st), dhsa_last_error());
    }
    plant_error();
    T_CHECK(dhsa_synth_generate(&good, NULL, k2, v2, n2) < 0 && fresh_error(), "synth_generate(q NULL) succeeded");
    plant_error();
    T_CHECK(dhsa_synth_generate(&good, q2, k2, v2, NULL) < 0 && fresh_error(),
            "synth_generate(needles NULL, 2 needles) succeeded");
    T_CHECK(dhsa_synth_generate(NULL, q2, k2, v2, n2) < 0, "synth_generate(params NULL) succeeded");
    free(q1), free(k1), free(v1), free(q2), free(k2), free(v2);
}

/* ======================================================================== */

/* The ISA-dependent parts: kernels and routing scores (SIMD qk). */
static void isa_suite(void) {
    sparse_suite();
    test_sparse_can_fail();
    test_merge();
    test_route_properties();
    test_similarity_boundaries();
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

int main(void) {
    dhsa_ctx_params p = dhsa_ctx_default_params();
    if (dhsa_ctx_create(&p, &g_ctx) != DHSA_OK || !g_ctx) {
        T_CHECK(0, "ctx_create(defaults): %s", dhsa_last_error());
        return t_report("test_route");
    }
    dhsa_isa best = dhsa_active_isa();
    printf("test_route: %d threads, active ISA %s\n", dhsa_ctx_n_threads(g_ctx), dhsa_isa_name(best));

    test_layout_size_create();
    test_layout_set_get();
    test_layout_selects_stats();
    test_sparse_threads();
    test_layout_mismatch();
    test_route_share_heads();
    test_route_determinism();
    test_route_views();
    test_route_edges();
    test_routed_attention();
    test_oracle();
    test_oracle_masses();
    test_fidelity();
    test_route_params();
    test_route_sizes_budget();
    test_synth();
    test_picked_sinks();

    const int before = t_checks();
    isa_suite();
    const int n_suite = t_checks() - before; /* the checks of an ISA that is skipped, below */
    for (int isa = DHSA_ISA_SCALAR; isa <= DHSA_ISA_AVX512; isa++) {
        if ((dhsa_isa)isa == best) continue; /* done above */
        dhsa_status st = dhsa_set_isa((dhsa_isa)isa);
        if (st == DHSA_ERR_UNSUPPORTED) {
            T_SKIP(1 + n_suite, "ISA %s unsupported here", dhsa_isa_name((dhsa_isa)isa));
            continue;
        }
        T_CHECK(st == DHSA_OK && dhsa_active_isa() == (dhsa_isa)isa, "dhsa_set_isa(%s): %s",
                dhsa_isa_name((dhsa_isa)isa), dhsa_status_str(st));
        if (st != DHSA_OK) continue;
        isa_suite();
    }
    T_CHECK(dhsa_set_isa(best) == DHSA_OK && dhsa_active_isa() == best, "could not restore ISA %s",
            dhsa_isa_name(best));
    /* The brief and DESIGN.md 5 ("chunks in score order until the budget is
     * met"): a non-dense block selects at least its budget. */
    VIOL_REPORT(g_budget_strict, "budget met (selected >= budget) in every routed non-dense block", "%s",
                "all routing cases, all ISAs");

    dhsa_ctx_free(g_ctx);
    return t_report("test_route");
}
