/* route_t.h: the harness test_route*.c share (tests of the sparse side:
 * include/dhsa.h "Sparse layouts", the `layout` field of dhsa_attn_desc,
 * "DHSA routing" and "Synthetic workloads and fidelity"; DESIGN.md
 * sections 4-7), written here from the header's contract:
 *   - deterministic inputs, typed stores, planted error sentences,
 *     property violations counted per property (VIOL_IF / VIOL_REPORT);
 *   - the sparse kernel's oracle: a naive attention in double precision
 *     over the canonical (stored, rounded) inputs, where keys outside the
 *     block's selection get -inf (scase / sinst, s_oracle, s_check);
 *   - routing: Q/K data (rdata), every block's span of keys recomputed from
 *     the positions, and the rules of DESIGN.md section 5 (check_routed),
 *     the FIXED selection re-derived in double (check_fixed_exact);
 *   - each_isa: a suite on every ISA this CPU has.
 * The parts: test_route_layout.c (layouts, the sparse kernel, the LSE
 * merge), test_route.c (routing), test_route_oracle.c (the oracle method,
 * fidelity, synthetic workloads), test_route_params.c (parameter checks,
 * sizes and budgets, picked sinks).
 */
#ifndef DHSA_TEST_ROUTE_T_H
#define DHSA_TEST_ROUTE_T_H

#include "dhsa.h"
#include "route_rules.h"
#include "t.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TWO_PI 6.283185307179586476925286766559

/* rule_sink, rule_local: tests/route_rules.h */

static dhsa_ctx *g_ctx; /* default ctx: n_threads = 0 (online CPUs) */

/* ------------------------------------------------------------------------ */
/* Deterministic inputs: splitmix64, Box-Muller normals (as in test_attn.c) */

#include "rng.h"
static inline int64_t rng_range(rng_t *r, int64_t n) { return n > 0 ? (int64_t)(rng_u64(r) % (uint64_t)n) : 0; }

static inline void *xcalloc(size_t n, size_t sz) {
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p) { fprintf(stderr, "out of memory\n"); exit(2); }
    return p;
}

/* ------------------------------------------------------------------------ */
/* Element storage. F16 decoding is written here (IEEE definition), so the
 * oracle does not trust the library's converters for what it reads. */

static inline double f16_decode(uint16_t h) {
    int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 0) v = ldexp((double)m, -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = ldexp((double)(m + 1024), e - 25);
    return sign ? -v : v;
}
static inline size_t elem_size(dhsa_type t) { return t == DHSA_F32 ? 4 : 2; }
static inline const char *tname(dhsa_type t) { return t == DHSA_F32 ? "f32" : t == DHSA_F16 ? "f16" : "bf16"; }
/* Stores x rounded to t (F32 or F16) at element off; returns the stored value. */
static inline double store_elem(void *base, dhsa_type t, int64_t off, double x) {
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
static inline void plant_error(void) {
    dhsa_set_isa((dhsa_isa)99); /* "unknown ISA 99" */
    snprintf(g_planted, sizeof g_planted, "%s", dhsa_last_error());
}
static inline int fresh_error(void) {
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

static inline dhsa_ctx *ctx_new(int threads, size_t budget) {
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
static inline int64_t norm_ranges(int64_t *r, int64_t n) {
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
static inline int64_t runs_of(const uint8_t *bits, int64_t n, int64_t *out) {
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
static inline void key_span(int64_t Lk, int causal, int64_t window, int64_t pos, int64_t *lo, int64_t *hi) {
    *lo = 0, *hi = Lk;
    if (causal && pos + 1 < *hi) *hi = pos + 1;
    if (window > 0 && pos - window + 1 > *lo) *lo = pos - window + 1;
}

/* Reads block (b, g, qb) into want-comparable form; 1 iff it equals exp[n]. */
static inline int block_equals(const dhsa_layout *lay, int64_t b, int64_t g, int64_t qb, const int64_t *exp,
                        int64_t n) {
    const int64_t *r = NULL;
    int64_t m = -1;
    if (dhsa_layout_get(lay, b, g, qb, &r, &m) != DHSA_OK || m != n) return 0;
    return n == 0 || memcmp(r, exp, (size_t)n * 2 * sizeof(int64_t)) == 0;
}

/* ------------------------------------------------------------------------ */
/* The sparse kernel's harness (test_route_layout.c, 2)                     */

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

static inline void fill_typed(void *buf, double *canon, dhsa_type t, int64_t n, double sigma, rng_t *r) {
    for (int64_t x = 0; x < n; x++) canon[x] = store_elem(buf, t, x, sigma * rng_normal(r));
}

/* Layout made from a bitmap. split64: hand every selected 64-key block over
 * as its own pair (adjacent pairs must be merged by dhsa_layout_set, and the
 * count may exceed max_ranges before merging). */
static inline dhsa_layout *layout_from_bits(dhsa_ctx *ctx, int64_t B, int64_t Hkv, int64_t Lq, int64_t Lk,
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

static inline void gen_selection(uint8_t *bits, int64_t Lk, int kind, rng_t *r) {
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

static inline void s_describe(sinst *I) {
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

static inline void s_init(sinst *I, const scase *sp) {
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

static inline void s_free(sinst *I) {
    dhsa_layout_free(I->lay);
    free(I->q), free(I->k), free(I->v), free(I->o), free(I->lse);
    free(I->cq), free(I->ck), free(I->cv), free(I->km), free(I->sel);
    free(I->ref_o), free(I->ref_lse), free(I->got_o), free(I->got_lse);
}

/* The oracle: naive attention in double from the header's contract, with
 * the keys a block does not select (sel, [B, Hkv, nqb, Lk]) at -inf; sel
 * NULL = dense. A row with no allowed key: o = 0, lse = -inf. */
static inline void s_oracle(const sinst *I, const uint8_t *sel, double *o, double *lse) {
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

static inline tol_t tol_o(dhsa_backend be) {
    return be == DHSA_BACKEND_REFERENCE ? (tol_t){1e-5, 1e-5, 1e-12} : (tol_t){3e-5, 2e-5, 1e-9};
}
static inline tol_t tol_lse(dhsa_backend be) {
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
static inline cmp_t compare(const double *got, const double *ref, const double *mask_lse, int64_t B, int64_t H,
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

static inline int report_cmp(const char *what, const char *desc, cmp_t c, tol_t t) {
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
static inline dhsa_status s_run(sinst *I, dhsa_ctx *ctx, dhsa_backend be, const dhsa_layout *lay) {
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
static inline int s_check(sinst *I, dhsa_ctx *ctx, dhsa_backend be) {
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

/* ------------------------------------------------------------------------ */
/* The routing harness (test_route.c, 4)                                    */

/* Q and K (and V for the fidelity runs) of one layer, contiguous F32
 * [B, H, L, d], and a descriptor (o absent unless a test adds it: the
 * header says routing reads only q, k, causal, window and q_pos0). */
typedef struct {
    int64_t B, Hq, Hkv, Lq, Lk, d;
    float *q, *k, *v;
    dhsa_attn_desc a;
} rdata;

static inline void rdata_alloc(rdata *R, int64_t B, int64_t Hq, int64_t Hkv, int64_t Lq, int64_t Lk, int64_t d) {
    memset(R, 0, sizeof *R);
    R->B = B, R->Hq = Hq, R->Hkv = Hkv, R->Lq = Lq, R->Lk = Lk, R->d = d;
    R->q = xcalloc((size_t)(B * Hq * Lq * d), sizeof(float));
    R->k = xcalloc((size_t)(B * Hkv * Lk * d), sizeof(float));
    R->v = xcalloc((size_t)(B * Hkv * Lk * d), sizeof(float));
    R->a = dhsa_attn_default_desc();
    R->a.q = dhsa_tensor_bhld(R->q, DHSA_F32, B, Hq, Lq, d);
    R->a.k = dhsa_tensor_bhld(R->k, DHSA_F32, B, Hkv, Lk, d);
}

static inline void rdata_free(rdata *R) { free(R->q), free(R->k), free(R->v); }

static inline void rdata_random(rdata *R, int64_t B, int64_t Hq, int64_t Hkv, int64_t Lq, int64_t Lk, int64_t d,
                         uint64_t seed) {
    rdata_alloc(R, B, Hq, Hkv, Lq, Lk, d);
    rng_t r = {seed};
    for (int64_t x = 0; x < B * Hq * Lq * d; x++) R->q[x] = (float)rng_normal(&r);
    for (int64_t x = 0; x < B * Hkv * Lk * d; x++) R->k[x] = (float)rng_normal(&r);
    for (int64_t x = 0; x < B * Hkv * Lk * d; x++) R->v[x] = (float)rng_normal(&r);
}

static inline int rdata_synth(rdata *R, const dhsa_synth_params *sp, dhsa_synth_needle *needles) {
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
static inline void rdata_segments(rdata *R, const int64_t *lens, int nseg, int64_t Hq, int64_t Hkv, int64_t d,
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

static inline dhsa_layout *route(dhsa_ctx *ctx, const dhsa_router_params *rp, const dhsa_attn_desc *a, const char *what) {
    dhsa_layout *lay = NULL;
    dhsa_status st = dhsa_route(ctx, rp, a, &lay);
    T_CHECK(st == DHSA_OK && lay, "dhsa_route (%s): %s %s", what, dhsa_status_str(st), dhsa_last_error());
    return st == DHSA_OK ? lay : NULL;
}

/* The block's span: keys at least one of its rows may attend to. Rows of a
 * block are consecutive positions, so the union of their spans is one
 * interval [*lo, *hi) (empty: *lo = *hi = 0). Also returns the sum over its
 * rows of their own span lengths. */
static inline void block_span(const dhsa_attn_desc *a, int64_t Lq, int64_t Lk, int64_t q_block, int64_t qb,
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

static inline int64_t max_chunk_len(const dhsa_router_params *rp) {
    return rp->boundary == DHSA_BOUNDARY_FIXED ? rp->chunk : rp->max_chunk;
}

/* "selected >= budget" over every routed block of the whole run, reported
 * once at the end (see check_routed: docs/dhsa.md's pass-over rule). */
static viol g_budget_strict;

/* Checks a routed layout against DESIGN.md section 5 and the header. */
static inline void check_routed(const char *what, const dhsa_layout *lay, const dhsa_router_params *rp,
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
static inline int layouts_equal(const dhsa_layout *x, const dhsa_layout *y) {
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
 * include/dhsa.h: s mean(q) . mean(k) + cap(s^2/2 mean(q*q) . var(k)), the
 * variance about each head's own mean, both averaged over the KV heads
 * when shared, cap(v) = min(v, 2 sqrt(v ln 2n)) for a chunk of n keys; s =
 * 1/sqrt(d); HEADS: the MOMENTS score of each query head
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
/* The variance term's cap, from its definition (docs/dhsa.md, "The
 * variance term, capped"): min(v, sigma sqrt(2 ln 2n)) with sigma^2 = 2v. */
static inline double ref_var_cap(double v, int64_t n) {
    if (v <= 0) return v;
    double sigma = sqrt(2.0 * v), cap = sigma * sqrt(2.0 * log(2.0 * (double)n));
    return v < cap ? v : cap;
}

static inline int64_t fixed_selection_mismatches(const dhsa_layout *lay, const dhsa_router_params *rp, const rdata *R,
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
                                double mt = 0, vt = 0;
                                for (int64_t x = 0; x < d; x++) mt += qp[x] * kg[c * dk + x];
                                for (int64_t x = d; x < dk; x++) vt += qp[x] * kg[c * dk + x];
                                eh[c] = mt + (bound ? vt : ref_var_cap(vt, e - s));
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
                        double dot = 0, vt = 0;
                        for (int64_t x = 0; x < d; x++) dot += qp[x] * kg[c * dk + x];
                        for (int64_t x = d; x < dk; x++) vt += qp[x] * kg[c * dk + x];
                        score[c] = (dot + (moments ? ref_var_cap(vt, e - s) : 0.0)) * order;
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
static inline void check_fixed_exact(const char *what, const dhsa_layout *lay, const dhsa_router_params *rp,
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

static inline dhsa_router_params rparams(dhsa_route_method m, dhsa_boundary bd, int64_t budget, double density) {
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

/* ------------------------------------------------------------------------ */
/* Runs suite on the active ISA, then on every other ISA this CPU has (SIMD
 * qk in the scores, the kernels), and goes back to the best. counted: the
 * switches are counted checks (test_route_layout.c); elsewhere a switch
 * that fails still fails, but one that works is not counted again, so the
 * parts add up to the checks of the one test they were. */
static inline void each_isa(void (*suite)(void), int counted) {
    const dhsa_isa best = dhsa_active_isa();
    const int before = t_checks();
    suite();
    const int n_suite = t_checks() - before; /* the checks of an ISA that is skipped, below */
    for (int isa = DHSA_ISA_SCALAR; isa <= DHSA_ISA_AVX512; isa++) {
        if ((dhsa_isa)isa == best) continue; /* done above */
        dhsa_status st = dhsa_set_isa((dhsa_isa)isa);
        if (st == DHSA_ERR_UNSUPPORTED) {
            T_SKIP(counted + n_suite, "ISA %s unsupported here", dhsa_isa_name((dhsa_isa)isa));
            continue;
        }
        int ok = st == DHSA_OK && dhsa_active_isa() == (dhsa_isa)isa;
        if (counted || !ok)
            T_CHECK(ok, "dhsa_set_isa(%s): %s", dhsa_isa_name((dhsa_isa)isa), dhsa_status_str(st));
        if (st != DHSA_OK) continue;
        suite();
    }
    int ok = dhsa_set_isa(best) == DHSA_OK && dhsa_active_isa() == best;
    if (counted || !ok) T_CHECK(ok, "could not restore ISA %s", dhsa_isa_name(best));
}

/* A default ctx (n_threads = 0: online CPUs) into g_ctx; 0 on failure
 * (a failed check). */
static inline int open_ctx(const char *name) {
    dhsa_ctx_params p = dhsa_ctx_default_params();
    if (dhsa_ctx_create(&p, &g_ctx) != DHSA_OK || !g_ctx) {
        T_CHECK(0, "ctx_create(defaults): %s", dhsa_last_error());
        return 0;
    }
    printf("%s: %d threads, active ISA %s\n", name, dhsa_ctx_n_threads(g_ctx), dhsa_isa_name(dhsa_active_isa()));
    return 1;
}

#endif
