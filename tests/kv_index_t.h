/* kv_index_t.h: the harness test_kv_index*.c share: tests of the
 * decode-time index (include/dhsa.h "DHSA at decode time: an index beside
 * the KV cache", dhsa_kv_index_*; DESIGN.md section 6), with the routing
 * rules of section 5: deterministic inputs (work), an index fed and routed
 * (ix_new, ix_append, ix_route), layouts compared block for block, the
 * routing rules re-derived from the header (check_rules).
 *
 * What is checked, and against what:
 *   1. Incremental equals whole. The same keys appended in one call, one key
 *      at a time and in random ubatches give the same chunk starts and the
 *      same routed layouts, range for range. Routing each ubatch right after
 *      appending it (q_pos0 = ubatch start, k = the first u0 + n keys) gives,
 *      block for block, the layout of routing the whole prefill at once.
 *      A decode step (one key appended, one query row routed) gives, at
 *      every row, the layout of a whole prefill routed with q_block = 1;
 *      a chunk becomes a candidate exactly at the row whose key closes it.
 *   2. Boundaries. FIXED: chunks of exactly `chunk` keys, closed when the
 *      last key arrives. SIMILARITY: on crafted keys (segments of constant
 *      random direction, tiny noise) the chunk starts are exactly the true
 *      segment starts, plus the max_chunk cuts predicted by a model written
 *      here; on random and synthetic keys the starts equal, exactly, a
 *      double-precision re-implementation of the header's online rule;
 *      chunk lengths stay in [min_chunk, max_chunk]; a boundary at t is
 *      decided when key t + nms_window arrives (a max_chunk cut: when its
 *      last key arrives). LEARNED (the predictor run inside the index):
 *      at ubatches 1, 3, 64, 65, 500 and L, lengths 1 to 2000, four
 *      parameter sets (w = 1, 4, 5), F16 keys and every ISA, the chunk
 *      starts equal exactly those of dhsa_route_boundaries on the whole
 *      sequence (causal_boundaries = 1) and of a model of the online rule
 *      written here over dhsa_predictor_score's probabilities; decisions
 *      come w - 1 keys later; a higher threshold gives other starts.
 *   3. Routing rules re-derived from the header and DESIGN.md 5-6: sorted
 *      disjoint ranges in [0, Lk), causality (and the window), sinks, the
 *      local diagonal and the open tail read, dense blocks, budget
 *      accounting, share_heads, the dense_blocks stat.
 *   4. The sparse kernel on the index's layout: TILED against REFERENCE
 *      (same layout) and against a double-precision oracle written here
 *      that reads the layout only through dhsa_layout_selects; recall from
 *      dhsa_fidelity_compare in [0, 1]; planted needles selected.
 *   5. Errors: every failing call returns the right status with a fresh
 *      sentence, and leaves the index unchanged.
 *   6. Memory: the index lives in the ctx's statistics, does not grow while
 *      keys are appended, is far smaller than the keys, and is given back.
 *   7. Truncation (dhsa_kv_index_truncate): an index of L keys cut back to
 *      n equals, field for field (dhsa__kv_index_diff: chunk starts,
 *      decisions, pooled keys, the open chunk's sums, the ring of recent
 *      keys, the score ring and statistics, LEARNED's predictor rows), a
 *      fresh index fed only the first n keys, for n on and around every
 *      kind of edge (0, 1, the ring's length, chunk starts, the keys that
 *      closed chunks, random points, L); appending keys [n, L) again in
 *      other ubatches then equals, field for field and layout for layout
 *      (prefill and decode routes), an index fed all L keys; a second cut
 *      after that still equals a fresh one. FIXED, SIMILARITY and LEARNED
 *      boundaries, every chunk score. Bad arguments are refused and leave
 *      the index as it was.
 *   8. Masked routing (context parallelism's fetch budget): every chunk
 *      allowed routes as dhsa_kv_index_route, range for range; none
 *      allowed reads a subset of that (the fixed parts); half allowed
 *      reads no key of a chunk left out but the fixed ones; the blocks'
 *      summed chunk weights are finite and add up over calls.
 * Each comparator is shown once to fail on deliberately different data.
 *
 * The parts: test_kv_index.c (1, 3), test_kv_index_boundaries.c (2),
 * test_kv_index_sparse.c (4, 8), test_kv_index_state.c (5, 6, 7).
 */
#ifndef DHSA_TEST_KV_INDEX_T_H
#define DHSA_TEST_KV_INDEX_T_H

#include "dhsa.h"
#include "route/kv_index_internal.h"
#include "route_rules.h"
#include "t.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TWO_PI 6.283185307179586476925286766559

/* rule_sink, rule_local: tests/route_rules.h */

static dhsa_ctx *g_ctx; /* n_threads = 0 (online CPUs) */

/* ------------------------------------------------------------------------ */
/* Deterministic inputs: splitmix64, Box-Muller normals */

#include "rng.h"
static inline int64_t rng_range(rng_t *r, int64_t n) { return n > 0 ? (int64_t)(rng_u64(r) % (uint64_t)n) : 0; }

static inline void *xcalloc(size_t n, size_t sz) {
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p) {
        fprintf(stderr, "test_kv_index: out of memory\n");
        exit(2);
    }
    return p;
}

static inline int cmp_float(const void *x, const void *y) {
    float a = *(const float *)x, b = *(const float *)y;
    return (a > b) - (a < b);
}

/* The q-quantile of p[1 .. L) (a threshold that some candidates reach). */
static inline float quantile(const float *p, int64_t L, double q) {
    if (L < 2) return 0.5f;
    float *c = xcalloc((size_t)L, sizeof(float));
    memcpy(c, p + 1, (size_t)(L - 1) * sizeof(float));
    qsort(c, (size_t)(L - 1), sizeof(float), cmp_float);
    float v = c[(int64_t)(q * (double)(L - 2))];
    free(c);
    return v;
}

/* ------------------------------------------------------------------------ */
/* Error sentences: before a call that must fail, an unrelated failure plants
 * a known sentence; afterwards the sentence must be non-empty and different,
 * so a stale sentence from an earlier failure cannot pass. */

static char g_planted[256];
static inline void plant_error(void) {
    dhsa_set_isa((dhsa_isa)99);
    snprintf(g_planted, sizeof g_planted, "%s", dhsa_last_error());
}
static inline int fresh_error(void) {
    const char *e = dhsa_last_error();
    return e && e[0] && strcmp(e, g_planted) != 0;
}

/* Property violations: count them, keep the first for the message, one
 * T_CHECK per property. */
typedef struct {
    int64_t bad, n;
    char first[1024];
} viol;
#define VIOL_IF(v, cond, ...)                                                            \
    do {                                                                                 \
        (v).n++;                                                                         \
        if (cond) {                                                                      \
            if (!(v).bad++) snprintf((v).first, sizeof (v).first, __VA_ARGS__);          \
        }                                                                                \
    } while (0)
#define VIOL_REPORT(v, what, label)                                                      \
    T_CHECK((v).bad == 0, "%s [%s]: %lld of %lld checks violate it; first: %s", what,    \
            label, (long long)(v).bad, (long long)(v).n, (v).first)

static inline dhsa_ctx *ctx_new(int threads, size_t budget) {
    dhsa_ctx_params p = dhsa_ctx_default_params();
    p.n_threads = threads;
    p.mem_budget = budget;
    dhsa_ctx *c = NULL;
    dhsa_status st = dhsa_ctx_create(&p, &c);
    T_CHECK(st == DHSA_OK && c, "ctx_create(%d threads, budget %zu): %s", threads, budget, dhsa_last_error());
    return st == DHSA_OK ? c : NULL;
}

/* ------------------------------------------------------------------------ */
/* A workload: q [1, Hq, L, d], k and v [1, Hkv, L, d], contiguous F32 */

typedef struct {
    int64_t Hq, Hkv, L, d;
    float *q, *k, *v;
    dhsa_synth_needle needles[DHSA_SYNTH_MAX_NEEDLES];
    int n_needles;
} work;

static inline int work_synth(work *W, int64_t L, int64_t Hq, int64_t Hkv, int64_t d, uint64_t seed) {
    memset(W, 0, sizeof *W);
    dhsa_synth_params sp = dhsa_synth_default_params();
    sp.L = L, sp.Hq = Hq, sp.Hkv = Hkv, sp.d = d, sp.seed = seed;
    W->Hq = Hq, W->Hkv = Hkv, W->L = L, W->d = d;
    W->n_needles = sp.n_needles;
    W->q = xcalloc((size_t)(Hq * L * d), sizeof(float));
    W->k = xcalloc((size_t)(Hkv * L * d), sizeof(float));
    W->v = xcalloc((size_t)(Hkv * L * d), sizeof(float));
    dhsa_status st = dhsa_synth_generate(&sp, W->q, W->k, W->v, W->needles);
    T_CHECK(st == DHSA_OK, "synth L=%lld Hq=%lld Hkv=%lld d=%lld: %s", (long long)L, (long long)Hq,
            (long long)Hkv, (long long)d, dhsa_last_error());
    return st == DHSA_OK;
}

static inline void work_free(work *W) {
    free(W->q);
    free(W->k);
    free(W->v);
    memset(W, 0, sizeof *W);
}

/* Rows [r0, r0 + n) of a contiguous [1, H, L, D] buffer, as a view. */
static inline dhsa_tensor rows_view(float *buf, int64_t H, int64_t L, int64_t D, int64_t r0, int64_t n) {
    dhsa_tensor t = dhsa_tensor_bhld(buf + r0 * D, DHSA_F32, 1, H, n, D);
    t.stride[0] = H * L * D;
    t.stride[1] = L * D;
    return t;
}

/* ------------------------------------------------------------------------ */
/* Index helpers */

static inline dhsa_kv_index *ix_new(dhsa_ctx *ctx, const dhsa_router_params *rp, int64_t Hkv, int64_t d, int64_t cap,
                             const char *what) {
    dhsa_kv_index *ix = NULL;
    dhsa_status st = dhsa_kv_index_create(ctx, rp, Hkv, d, cap, &ix);
    T_CHECK(st == DHSA_OK && ix, "%s: kv_index_create(Hkv=%lld, d=%lld, cap=%lld): %s (%s)", what,
            (long long)Hkv, (long long)d, (long long)cap, dhsa_status_str(st), dhsa_last_error());
    return st == DHSA_OK ? ix : NULL;
}

/* Appends keys [u0, u0 + n) of the workload. */
static inline dhsa_status ix_append(dhsa_kv_index *ix, const work *W, int64_t u0, int64_t n) {
    dhsa_tensor k = rows_view(W->k, W->Hkv, W->L, W->d, u0, n);
    return dhsa_kv_index_append(ix, &k);
}

/* The causal descriptor for query rows [r0, r0 + n) at positions r0.. and
 * the first Lk keys. */
static inline dhsa_attn_desc rows_desc(const work *W, int64_t r0, int64_t n, int64_t Lk, int64_t window) {
    dhsa_attn_desc a = dhsa_attn_default_desc();
    a.q = rows_view(W->q, W->Hq, W->L, W->d, r0, n);
    a.k = rows_view(W->k, W->Hkv, W->L, W->d, 0, Lk);
    a.v = rows_view(W->v, W->Hkv, W->L, W->d, 0, Lk);
    a.causal = 1;
    a.q_pos0 = r0;
    a.window = window;
    return a;
}

static inline dhsa_layout *ix_route(dhsa_ctx *ctx, const dhsa_kv_index *ix, const work *W, int64_t r0, int64_t n,
                             int64_t Lk, int64_t window, const char *what) {
    dhsa_attn_desc a = rows_desc(W, r0, n, Lk, window);
    dhsa_layout *lay = NULL;
    dhsa_status st = dhsa_kv_index_route(ctx, ix, &a, &lay);
    T_CHECK(st == DHSA_OK && lay, "%s: kv_index_route(rows %lld+%lld, Lk %lld): %s (%s)", what, (long long)r0,
            (long long)n, (long long)Lk, dhsa_status_str(st), dhsa_last_error());
    return st == DHSA_OK ? lay : NULL;
}

static inline void print_ranges(char *buf, size_t cap, const int64_t *r, int64_t n) {
    size_t used = 0;
    buf[0] = 0;
    for (int64_t i = 0; i < n && used + 40 < cap; i++)
        used += (size_t)snprintf(buf + used, cap - used, "[%lld,%lld)", (long long)r[2 * i],
                                 (long long)r[2 * i + 1]);
    if (n == 0) snprintf(buf, cap, "(none)");
}

/* Blocks (g, xa0 + i) of x against (g, ya0 + i) of y for i < n and every KV
 * head: how many differ; the first difference is printed (`what`). */
static inline int64_t blocks_differ(const dhsa_layout *x, int64_t xa0, const dhsa_layout *y, int64_t ya0, int64_t n,
                             int64_t Hkv, const char *what, int print) {
    int64_t bad = 0;
    for (int64_t g = 0; g < Hkv; g++)
        for (int64_t i = 0; i < n; i++) {
            const int64_t *rx, *ry;
            int64_t nx = -1, ny = -2;
            dhsa_status sx = dhsa_layout_get(x, 0, g, xa0 + i, &rx, &nx);
            dhsa_status sy = dhsa_layout_get(y, 0, g, ya0 + i, &ry, &ny);
            int same = sx == DHSA_OK && sy == DHSA_OK && nx == ny &&
                       memcmp(rx, ry, (size_t)(2 * nx) * sizeof(int64_t)) == 0;
            if (same) continue;
            if (!bad++ && print) {
                char bx[400] = "(error)", by[400] = "(error)";
                if (sx == DHSA_OK) print_ranges(bx, sizeof bx, rx, nx);
                if (sy == DHSA_OK) print_ranges(by, sizeof by, ry, ny);
                fprintf(stderr, "  %s: first difference at KV head %lld, block %lld vs %lld:\n    %s\n    %s\n",
                        what, (long long)g, (long long)(xa0 + i), (long long)(ya0 + i), bx, by);
            }
        }
    return bad;
}

/* Start of the open tail (= end of the closed chunks), which
 * dhsa_kv_index_chunks does not list: from the stats of a layout routed for
 * one zero query at the last position (chunk_mean x chunks). k: the cache,
 * contiguous [1, Hkv, L, d]. -1 on failure. */
static inline int64_t open_tail_start(const dhsa_kv_index *ix, const float *k, int64_t Hkv, int64_t L, int64_t d) {
    float *q = xcalloc((size_t)(Hkv * d), sizeof(float));
    dhsa_attn_desc a = dhsa_attn_default_desc();
    a.q = dhsa_tensor_bhld(q, DHSA_F32, 1, Hkv, 1, d);
    a.k = dhsa_tensor_bhld((void *)k, DHSA_F32, 1, Hkv, L, d);
    a.v = a.k;
    a.causal = 1;
    a.q_pos0 = L - 1;
    dhsa_layout *lay = NULL;
    int64_t t0 = -1;
    dhsa_layout_stats ls;
    if (dhsa_kv_index_route(g_ctx, ix, &a, &lay) == DHSA_OK && dhsa_layout_get_stats(lay, &ls) == DHSA_OK &&
        ls.chunks == dhsa_kv_index_chunks(ix, NULL))
        t0 = llround(ls.chunk_mean * (double)ls.chunks);
    T_CHECK(t0 >= 0, "open tail: routing a zero query: %s", dhsa_last_error());
    dhsa_layout_free(lay);
    free(q);
    return t0;
}

/* Chunk starts of two indexes: 1 if identical. */
static inline int same_starts(const dhsa_kv_index *x, const dhsa_kv_index *y) {
    const int64_t *sx, *sy;
    int64_t nx = dhsa_kv_index_chunks(x, &sx), ny = dhsa_kv_index_chunks(y, &sy);
    return nx == ny && (nx == 0 || memcmp(sx, sy, (size_t)nx * sizeof(int64_t)) == 0);
}

/* ------------------------------------------------------------------------ */
/* Routing rules (header "DHSA routing", DESIGN.md section 5), re-derived per
 * block from the positions. Violations are counted by property. */

/* What the index knew when: cnt[m] = chunks closed after m keys (m = 0..L),
 * E[c] = end of chunk c (its successor's start; the open tail's start for
 * the last). A block whose last position is `last` sees the cnt[last + 1]
 * chunks closed by then; the keys after them (the open tail, and chunks
 * closed later) are read whole (DESIGN.md 6: "the kernel reads only the
 * selected ranges plus the open tail chunk"). */
typedef struct {
    int64_t *cnt, *E;
    int64_t L;
} chunk_info;

static inline void ci_init(chunk_info *ci, int64_t L) {
    ci->L = L;
    ci->cnt = xcalloc((size_t)L + 1, sizeof(int64_t));
    ci->E = NULL;
}
static inline void ci_free(chunk_info *ci) {
    free(ci->cnt);
    free(ci->E);
    memset(ci, 0, sizeof *ci);
}
/* Chunk ends from an index holding all L keys of k [1, Hkv, L, d]. */
static inline void ci_ends(chunk_info *ci, const dhsa_kv_index *ix, const float *k, int64_t Hkv, int64_t d) {
    const int64_t *S;
    int64_t n = dhsa_kv_index_chunks(ix, &S);
    free(ci->E);
    ci->E = xcalloc((size_t)n + 1, sizeof(int64_t));
    for (int64_t c = 0; c + 1 < n; c++) ci->E[c] = S[c + 1];
    if (n) ci->E[n - 1] = open_tail_start(ix, k, Hkv, ci->L, d);
}
/* Appends keys [0, L) of W one at a time, recording cnt; then the ends. */
static inline int ci_append(chunk_info *ci, dhsa_kv_index *ix, const work *W) {
    ci_init(ci, W->L);
    for (int64_t t = 0; t < W->L; t++) {
        if (ix_append(ix, W, t, 1) != DHSA_OK) {
            T_CHECK(0, "append key %lld: %s", (long long)t, dhsa_last_error());
            return 0;
        }
        ci->cnt[t + 1] = dhsa_kv_index_chunks(ix, NULL);
    }
    ci_ends(ci, ix, W->k, W->Hkv, W->d);
    return 1;
}

typedef struct {
    viol valid, causal, windowed, dense, sinks, local, tail, budget_lo, budget_hi, shared, dense_stat;
    int64_t blocks, dense_blocks;
    int64_t with_chunks; /* sparse blocks that selected keys beyond sinks and local */
} rules;

static inline int64_t max_chunk_len(const dhsa_router_params *rp) {
    return rp->boundary == DHSA_BOUNDARY_FIXED ? rp->chunk : rp->max_chunk;
}

/* 1 if [s, e) is inside the union of the sorted ranges r[0..n). */
static inline int covered(const int64_t *r, int64_t n, int64_t s, int64_t e) {
    for (int64_t i = 0; i < n && s < e; i++) {
        if (r[2 * i + 1] <= s) continue;
        if (r[2 * i] > s) return 0;
        s = r[2 * i + 1];
    }
    return s >= e;
}

/* Checks every block of a layout routed for rows q_pos0 .. q_pos0 + Lq - 1
 * against Lk keys, causal, with `window`; ci: what the index knew (NULL for
 * a layout not made by the index: no open tail). */
static inline void check_rules(rules *R, const dhsa_layout *lay, const dhsa_router_params *rp, int64_t Hkv, int64_t Lq,
                        int64_t Lk, int64_t q_pos0, int64_t window, const chunk_info *ci) {
    const int64_t qbk = rp->q_block, n_qb = (Lq + qbk - 1) / qbk, maxlen = max_chunk_len(rp);
    int64_t dense_here = 0;
    for (int64_t g = 0; g < Hkv; g++)
        for (int64_t qb = 0; qb < n_qb; qb++) {
            const int64_t *r;
            int64_t n;
            dhsa_status st = dhsa_layout_get(lay, 0, g, qb, &r, &n);
            VIOL_IF(R->valid, st != DHSA_OK, "layout_get(g %lld, qb %lld): %s", (long long)g, (long long)qb,
                    dhsa_last_error());
            if (st != DHSA_OK) continue;
            R->blocks++;
            const int64_t pos0 = q_pos0 + qb * qbk;
            const int64_t last = q_pos0 + (qb + 1) * qbk < q_pos0 + Lq ? q_pos0 + (qb + 1) * qbk - 1 : q_pos0 + Lq - 1;
            const int64_t ahi = last + 1 < Lk ? last + 1 : Lk;
            const int64_t alo = window > 0 && pos0 - window + 1 > 0 ? pos0 - window + 1 : 0;
            const int64_t avail = ahi - alo;
            /* sorted, disjoint, non-adjacent, non-empty, inside [0, Lk) */
            int ok = n >= 0;
            for (int64_t i = 0; i < n; i++) {
                if (r[2 * i] < 0 || r[2 * i + 1] > Lk || r[2 * i] >= r[2 * i + 1]) ok = 0;
                if (i > 0 && r[2 * i] <= r[2 * i - 1]) ok = 0;
            }
            char buf[300];
            print_ranges(buf, sizeof buf, r, n);
            VIOL_IF(R->valid, !ok, "g %lld qb %lld (Lk %lld): %s", (long long)g, (long long)qb, (long long)Lk, buf);
            VIOL_IF(R->causal, n > 0 && r[2 * n - 1] > last + 1,
                    "g %lld qb %lld: last position %lld, ranges %s", (long long)g, (long long)qb, (long long)last, buf);
            if (window > 0)
                VIOL_IF(R->windowed, n > 0 && r[0] < alo, "g %lld qb %lld: window starts at %lld, ranges %s",
                        (long long)g, (long long)qb, (long long)alo, buf);
            int64_t budget = rp->budget_tokens > 0 ? rp->budget_tokens : (int64_t)ceil(rp->density * (double)avail);
            int want_dense = avail < rp->dense_below || budget >= avail;
            if (want_dense) {
                dense_here++;
                R->dense_blocks++;
                VIOL_IF(R->dense, !(n == 1 && r[0] == alo && r[1] == ahi),
                        "g %lld qb %lld sees [%lld, %lld) (%lld keys, budget %lld, dense_below %lld): want it "
                        "dense, got %s",
                        (long long)g, (long long)qb, (long long)alo, (long long)ahi, (long long)avail,
                        (long long)budget, (long long)rp->dense_below, buf);
                continue;
            }
            VIOL_IF(R->dense, n == 1 && r[0] == alo && r[1] == ahi,
                    "g %lld qb %lld (%lld keys, budget %lld) is dense but should be sparse", (long long)g,
                    (long long)qb, (long long)avail, (long long)budget);
            int64_t s1 = rule_sink(rp, budget) < ahi ? rule_sink(rp, budget) : ahi;
            if (s1 > alo)
                VIOL_IF(R->sinks, !covered(r, n, alo, s1), "g %lld qb %lld: sinks [%lld, %lld) not all in %s",
                        (long long)g, (long long)qb, (long long)alo, (long long)s1, buf);
            int64_t l0 = pos0 - rule_local(rp, budget) > alo ? pos0 - rule_local(rp, budget) : alo;
            VIOL_IF(R->local, !covered(r, n, l0, ahi), "g %lld qb %lld: local [%lld, %lld) not all in %s",
                    (long long)g, (long long)qb, (long long)l0, (long long)ahi, buf);
            if (ci) {
                const int64_t v = ci->cnt[last + 1], tail_lo = v ? ci->E[v - 1] : 0;
                const int64_t t0 = tail_lo > alo ? tail_lo : alo;
                VIOL_IF(R->tail, !covered(r, n, t0, ahi),
                        "g %lld qb %lld (last position %lld, %lld chunks closed): the keys after them [%lld, %lld) "
                        "not all in %s",
                        (long long)g, (long long)qb, (long long)last, (long long)v, (long long)t0, (long long)ahi,
                        buf);
                if (t0 < l0) l0 = t0; /* read like the local span */
            }
            int64_t sel = 0;
            for (int64_t i = 0; i < n; i++) {
                int64_t s = r[2 * i] > alo ? r[2 * i] : alo, e = r[2 * i + 1] < ahi ? r[2 * i + 1] : ahi;
                if (e > s) sel += e - s;
            }
            int64_t used0 = (s1 > alo ? s1 - alo : 0) + (ahi - l0);
            if (s1 > l0) used0 -= s1 - l0; /* sinks and local overlap */
            R->with_chunks += sel > used0;
            /* Budget accounting (header, DESIGN.md 5, docs/dhsa.md
             * "Selection"): sinks and local first; chunks only while the
             * budget is not met, so with used0 >= budget nothing else is
             * taken. Otherwise chunks until the budget is met (a chunk that
             * would overshoot by more than half is first passed over, then
             * used to fill if the budget is still short), so the selection
             * reaches min(budget, available) and the last chunk, added
             * while short of the budget, overshoots by less than a chunk. */
            if (used0 >= budget) {
                VIOL_IF(R->budget_hi, sel != used0,
                        "g %lld qb %lld: sinks + local (%lld keys) meet the budget %lld, yet %lld are selected: %s",
                        (long long)g, (long long)qb, (long long)used0, (long long)budget, (long long)sel, buf);
                continue;
            }
            VIOL_IF(R->budget_lo, sel < (budget < avail ? budget : avail),
                    "g %lld qb %lld: %lld keys selected, want >= min(budget %lld, available %lld); ranges %s",
                    (long long)g, (long long)qb, (long long)sel, (long long)budget, (long long)avail, buf);
            VIOL_IF(R->budget_hi, sel >= budget + maxlen,
                    "g %lld qb %lld: %lld keys selected, want < budget %lld + longest chunk %lld; ranges %s",
                    (long long)g, (long long)qb, (long long)sel, (long long)budget, (long long)maxlen, buf);
        }
    if (rp->share_heads) {
        /* every KV head g against head 0, block by block */
        for (int64_t g = 1; g < Hkv; g++)
            for (int64_t qb = 0; qb < n_qb; qb++) {
                const int64_t *r0, *rg;
                int64_t n0, ng;
                dhsa_layout_get(lay, 0, 0, qb, &r0, &n0);
                dhsa_layout_get(lay, 0, g, qb, &rg, &ng);
                VIOL_IF(R->shared, n0 != ng || memcmp(r0, rg, (size_t)(2 * n0) * sizeof(int64_t)) != 0,
                        "share_heads: KV head %lld block %lld differs from head 0", (long long)g, (long long)qb);
            }
    }
    dhsa_layout_stats ls;
    if (dhsa_layout_get_stats(lay, &ls) == DHSA_OK)
        VIOL_IF(R->dense_stat, ls.dense_blocks != dense_here,
                "layout stats say %lld dense blocks, %lld of the %lld (KV head, block) pairs are dense",
                (long long)ls.dense_blocks, (long long)dense_here, (long long)(Hkv * n_qb));
}

static inline void report_rules(const rules *R, const char *label, int windowed) {
    VIOL_REPORT(R->valid, "ranges sorted, disjoint, in [0, Lk)", label);
    VIOL_REPORT(R->causal, "nothing after the block's last position", label);
    if (windowed) VIOL_REPORT(R->windowed, "nothing before the window", label);
    VIOL_REPORT(R->dense, "dense iff fewer than dense_below keys or budget covers all", label);
    VIOL_REPORT(R->sinks, "sinks selected", label);
    VIOL_REPORT(R->local, "local diagonal selected", label);
    VIOL_REPORT(R->tail, "DESIGN.md 6: the open tail (keys after the chunks the block sees) read", label);
    VIOL_REPORT(R->budget_lo, "selected >= min(budget, available)", label);
    VIOL_REPORT(R->budget_hi, "selected = sinks + local when they meet the budget, else < budget + longest chunk",
                label);
    VIOL_REPORT(R->shared, "share_heads: same ranges for every KV head", label);
    VIOL_REPORT(R->dense_stat, "stats.dense_blocks counts the dense (KV head, block) pairs", label);
}

/* A default ctx (n_threads = 0: online CPUs) into g_ctx, for the parts
 * after the first: counted once (ctx_new in test_kv_index.c), here a
 * failure still fails. 0 on failure. */
static inline int open_ctx(void) {
    dhsa_ctx_params p = dhsa_ctx_default_params();
    if (dhsa_ctx_create(&p, &g_ctx) != DHSA_OK || !g_ctx) {
        T_CHECK(0, "ctx_create(defaults): %s", dhsa_last_error());
        return 0;
    }
    return 1;
}

#endif
