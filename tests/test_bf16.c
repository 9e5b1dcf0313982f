/* test_bf16.c: tests of the BF16 route of the weight products
 * (src/matmul/bf16.h: F16 and BF16 weights through vdpbf16ps, activations
 * rounded to BF16).
 *
 * Oracles:
 *   - the rounding re-derived here in double: of the two BF16 values around
 *     x, the nearer, a tie to the even one; NaN quieted with its sign, Inf
 *     kept, denormals to a signed zero, overflow to Inf; every kernel set's
 *     rounding of a vector (with a tail) bitwise equal to it; a truncating
 *     rounding is shown to disagree (the check can fail);
 *   - the product against the double product of the SAME BF16-rounded
 *     weights and activations: |y - ref| <= gamma_D sum |w x| (+1e-30), the
 *     worst case of the contract's order, D = 2 * 512/32 + 4 + K blocks;
 *     the reference with truncated activations instead is shown to fail it;
 *   - the product against the double product of the ORIGINAL weights and
 *     activations, per type: BF16 weights 2^-8 sum |w x| (the activations'
 *     rounding: BF16 keeps 8 significant bits), F16 weights (2^-7 + 2^-16)
 *     sum |w x| (both roundings), each plus the summation term; the worst
 *     seen is printed;
 *   - edge shapes: n_in 32, 37, 1000, 1056 and 2065 (tails of 5, 8, 17
 *     columns, up to 5 K blocks), n_out 5, 67, 130 (not multiples of the
 *     4-row tiles or the 64-row panel), 1..5, 7, 13 and 64 tokens, ldx >
 *     n_in and ldy > n_out with the padding checked untouched;
 *   - the fused route (n_tok <= 4) and the panel route bitwise equal, 1 and
 *     2 threads bitwise equal; the scalar kernels the same order written in
 *     C (within twice the bound of the SIMD ones);
 *   - a NaN activation makes its token's outputs NaN (and no other's), an
 *     Inf one its token's non-finite, on both routes;
 *   - dispatch: the probe gives one ratio per process; the fast route of
 *     F16/BF16 is "bf16 avx512-bf16" exactly when the CPU has AVX512-BF16,
 *     the ISA is AVX-512 and the mode is on, or auto with the probe at most
 *     2 FMA; otherwise the exact route, named with the reason (off, slower
 *     here); the AVX2 and the scalar ISA the exact route; dhsa__matmul_on
 *     runs what the name says (bitwise);
 *   - workspace: what dhsa__matmul_workspace_on says is what the ctx
 *     peaks at, and a budget a byte short fails before any work;
 *   - `dhsa bench matmul` (DHSA_CLI) times the route after its check, and
 *     a corrupted output fails the check (exit 1).
 * Parts on the AVX512-BF16 kernels are skipped (counted) on a CPU without.
 *
 * Run: make build/tests/test_bf16 && build/tests/test_bf16
 * (TEST_BF16_VERBOSE=1 prints the errors per type and shape).
 */
#include "cli_run.h"
#include "core/internal.h"
#include "dhsa.h"
#include "matmul/bf16.h"
#include "matmul/matmul.h"
#include "rng.h"
#include "t.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int verbose;

static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static double bf(uint16_t h) { return (double)u2f((uint32_t)h << 16); }

/* The kernel sets: the scalar one, then AVX512-BF16 where it runs here. */
#define N_KSETS 2
static const dhsa__bf16_kernels *kset(int i, int *runs) {
    *runs = 1;
    if (i == 0) return &dhsa__bf16_scalar;
#if defined(__x86_64__)
    *runs = dhsa__bf16_avx512bf16.name != NULL && dhsa__bf16_cpu_has();
    return &dhsa__bf16_avx512bf16;
#else
    *runs = 0;
    return NULL;
#endif
}

/* ------------------------------------------------------------ rounding --- */

/* The BF16 rounding of x derived in double: the nearer of the two
 * neighbours, a tie to the even one. */
static uint16_t round_ref(float x) {
    const uint32_t u = f2u(x);
    if (isnan(x)) return (uint16_t)((u >> 16) | 0x40);
    if (isinf(x)) return (uint16_t)(u >> 16);
    if (fabsf(x) < 0x1p-126f) return (uint16_t)((u >> 16) & 0x8000);
    const uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1); /* toward zero, and one step away */
    /* one step past the largest finite BF16 is Inf: as a value, 2^128 */
    const double vhi = (hi & 0x7fffu) == 0x7f80u ? copysign(ldexp(1.0, 128), (double)x) : bf(hi);
    const double dlo = fabs((double)x - bf(lo)), dhi = fabs(vhi - (double)x);
    return dhi < dlo || (dhi == dlo && (lo & 1)) ? hi : lo;
}

static uint16_t round_trunc(float x) { return (uint16_t)(f2u(x) >> 16); }

/* Values that probe the rounding: ties both ways, near-ties, large and
 * small exponents, zeros, denormals, the largest floats, NaN and Inf. */
static int64_t probe_values(float *v, int64_t cap, uint64_t seed) {
    rng_t r = {seed};
    int64_t n = 0;
    const uint32_t fixed[] = {0x3f808000u, 0x3f818000u, 0xbf808000u, 0xbf818000u, 0x3f807fffu, 0x3f808001u,
                              0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x00800000u, 0x7f7fffffu,
                              0xff7fffffu, 0x7f7f8000u, 0x7f7f7fffu, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                              0xffc00001u, 0x7f800001u, 0x3380ffffu, 0x4b7fffffu};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) v[n++] = u2f(fixed[i]);
    while (n < cap) {
        uint32_t u = (uint32_t)rng_u64(&r);
        if (n % 3 == 0) u = (u & 0xffff0000u) | 0x8000u;     /* an exact tie */
        if (n % 5 == 1) u = (u & 0x807fffffu) | (127u << 23); /* near 1 */
        v[n++] = u2f(u);
    }
    return n;
}

static void test_rounding(void) {
    float v[1000];
    const int64_t n = probe_values(v, 1000, 1);
    int64_t bad = -1, trunc_diff = 0;
    for (int64_t i = 0; i < n; i++) {
        if (dhsa__bf16_round(v[i]) != round_ref(v[i]) && bad < 0) bad = i;
        trunc_diff += round_trunc(v[i]) != round_ref(v[i]);
    }
    T_CHECK(bad < 0, "dhsa__bf16_round(%a = 0x%08x) = 0x%04x, derived 0x%04x", bad < 0 ? 0.0 : (double)v[bad],
            bad < 0 ? 0u : f2u(v[bad]), bad < 0 ? 0u : dhsa__bf16_round(v[bad]), bad < 0 ? 0u : round_ref(v[bad]));
    T_CHECK(trunc_diff > n / 4, "truncation instead of rounding differs from the derived rounding (at %lld of %lld)",
            (long long)trunc_diff, (long long)n);
    T_CHECK(dhsa__bf16_round(u2f(0x3f808000u)) == 0x3f80 && dhsa__bf16_round(u2f(0x3f818000u)) == 0x3f82 &&
                dhsa__bf16_round(u2f(0x3f808001u)) == 0x3f81 && dhsa__bf16_round(u2f(0x7f7fffffu)) == 0x7f80 &&
                dhsa__bf16_round(u2f(0x807fffffu)) == 0x8000 && dhsa__bf16_round(u2f(0xffc00001u)) == 0xffc0 &&
                dhsa__bf16_round(u2f(0x7f800001u)) == 0x7fc0,
            "written-out cases: ties to even, above a tie, overflow to Inf, a denormal to -0, NaN quieted with its sign");
    /* every kernel set's rounding of a row with a tail (n = 1000 -> 1024) */
    for (int ki = 0; ki < N_KSETS; ki++) {
        int runs;
        const dhsa__bf16_kernels *k = kset(ki, &runs);
        if (!runs) {
            T_SKIP(2, "rounding: the %s kernels do not run here", ki ? "avx512-bf16" : "scalar");
            continue;
        }
        uint16_t xb[1056];
        memset(xb, 0xAA, sizeof xb);
        k->round_act(v, n, 1024, xb);
        int64_t first = -1;
        for (int64_t i = 0; i < n && first < 0; i++)
            if (xb[i] != round_ref(v[i])) first = i;
        int pad = 1;
        for (int64_t i = n; i < 1024; i++) pad &= xb[i] == 0;
        for (int64_t i = 1024; i < 1056; i++) pad &= xb[i] == 0xAAAA;
        T_CHECK(first < 0, "%s rounding: value %lld (0x%08x) gave 0x%04x, derived 0x%04x", k->name, (long long)first,
                first < 0 ? 0u : f2u(v[first]), first < 0 ? 0u : xb[first], first < 0 ? 0u : round_ref(v[first]));
        T_CHECK(pad, "%s rounding: zeros from n to npad, nothing written past npad", k->name);
    }
}

/* to_bf16: F16 weights rounded by the same rule, BF16 copied; a column
 * range with a tail, zero padded to 32. */
static void test_to_bf16(void) {
    rng_t r = {2};
    uint16_t row[300], ref[96], got[96];
    for (int i = 0; i < 300; i++) row[i] = (uint16_t)rng_u64(&r);
    for (int i = 0; i < 300; i++) /* finite F16 and BF16 (the loader refuses others) */
        if ((row[i] & 0x7c00u) == 0x7c00u || (row[i] & 0x7f80u) == 0x7f80u) row[i] &= 0x83ffu;
    for (int ki = 0; ki < N_KSETS; ki++) {
        int runs;
        const dhsa__bf16_kernels *k = kset(ki, &runs);
        if (!runs) {
            T_SKIP(2, "to_bf16: the avx512-bf16 kernels do not run here");
            continue;
        }
        for (int ti = 0; ti < 2; ti++) {
            const uint32_t type = ti ? DHSA_GGML_BF16 : DHSA_GGML_F16;
            const int64_t k0 = 37, kn = 70; /* 70 -> 96 */
            for (int64_t i = 0; i < 96; i++)
                ref[i] = i >= kn ? 0 : type == DHSA_GGML_BF16 ? row[k0 + i] : round_ref(dhsa_f16_to_f32(row[k0 + i]));
            memset(got, 0xAA, sizeof got);
            k->to_bf16(type, (const uint8_t *)row, k0, kn, got);
            T_CHECK(memcmp(got, ref, sizeof ref) == 0, "%s to_bf16 of %s columns [37, 107): as derived, zero padded",
                    k->name, ti ? "BF16" : "F16");
        }
    }
}

/* ------------------------------------------------------------ products --- */

typedef struct {
    dhsa_wmat W;
    uint16_t *data;
    double *w;  /* [n_out][n_in] the stored weights */
    double *wb; /* [n_out][n_in] as the route reads them (BF16) */
} mat;

static void mat_make(mat *m, uint32_t type, int64_t n_in, int64_t n_out, uint64_t seed) {
    rng_t r = {seed};
    m->data = malloc((size_t)(n_in * n_out) * 2);
    m->w = malloc(sizeof(double) * (size_t)(n_in * n_out));
    m->wb = malloc(sizeof(double) * (size_t)(n_in * n_out));
    for (int64_t i = 0; i < n_in * n_out; i++) {
        float v = (float)(rng_normal(&r) * 0.1);
        if (i % 53 == 0) v *= 40.0f; /* a few large weights */
        if (type == DHSA_GGML_F16) {
            m->data[i] = dhsa_f32_to_f16(v);
            m->w[i] = dhsa_f16_to_f32(m->data[i]);
            m->wb[i] = bf(round_ref((float)m->w[i]));
        } else {
            m->data[i] = dhsa_f32_to_bf16(v);
            m->w[i] = m->wb[i] = bf(m->data[i]);
        }
    }
    m->W.type = type;
    m->W.data = m->data;
    m->W.n_in = n_in;
    m->W.n_out = n_out;
    m->W.row_bytes = 2 * n_in;
}

static void mat_free(mat *m) {
    free(m->data);
    free(m->w);
    free(m->wb);
}

static float *make_x(int64_t n_tok, int64_t ldx, uint64_t seed) {
    rng_t r = {seed};
    float *x = malloc(sizeof(float) * (size_t)(n_tok * ldx));
    for (int64_t i = 0; i < n_tok * ldx; i++) x[i] = (float)(rng_normal(&r) * (1.0 + 5.0 * (i % 61 == 0)));
    return x;
}

static dhsa_ctx *make_ctx(int threads) {
    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = threads;
    dhsa_ctx *c = NULL;
    dhsa_ctx_create(&cp, &c);
    return c;
}

/* Worst |y - ref| / bound over a product, and where. */
typedef struct {
    double worst;
    int64_t t, o;
    double rel_seen; /* worst |y - ref| / sum |w x| */
} cmp_t;

/* y against the double product of x (rounded by `rnd`) and weights w:
 * bound = rel * sum |w x| + gamma * sum |w' x'| + 1e-30. */
static cmp_t compare(const mat *m, const double *w, const float *x, int64_t ldx, int64_t n_tok, const float *y,
                     int64_t ldy, uint16_t (*rnd)(float), double rel, double gamma) {
    cmp_t c = {0, -1, -1, 0};
    const int64_t n = m->W.n_in;
    double *xr = malloc(sizeof(double) * (size_t)n);
    for (int64_t t = 0; t < n_tok; t++) {
        const float *xt = x + t * ldx;
        for (int64_t i = 0; i < n; i++) xr[i] = rnd ? bf(rnd(xt[i])) : (double)xt[i];
        for (int64_t o = 0; o < m->W.n_out; o++) {
            const double *wo = w + o * n, *wt = m->w + o * n;
            double ref = 0, s_abs = 0, s_abs_orig = 0;
            for (int64_t i = 0; i < n; i++) {
                ref += wo[i] * xr[i];
                s_abs += fabs(wo[i] * xr[i]);
                s_abs_orig += fabs(wt[i] * (double)xt[i]);
            }
            const double err = fabs((double)y[t * ldy + o] - ref);
            const double bound = rel * s_abs_orig + gamma * s_abs + 1e-30;
            const double q = isfinite(y[t * ldy + o]) ? err / bound : INFINITY;
            if (q > c.worst || c.t < 0) {
                c.worst = q;
                c.t = t;
                c.o = o;
            }
            if (err / (s_abs_orig + 1e-300) > c.rel_seen) c.rel_seen = err / (s_abs_orig + 1e-300);
        }
    }
    free(xr);
    return c;
}

/* gamma_D of the contract's order over n_in columns */
static double gamma_of(int64_t n_in) {
    const double u = 0x1p-24;
    const double D = 2.0 * DHSA_QK_KC / 32 + 4 + (double)((n_in + DHSA_QK_KC - 1) / DHSA_QK_KC);
    return D * u / (1 - D * u);
}

static double g_rel_seen[2]; /* F16, BF16: worst |y - ref| / sum |w x| against the original inputs */

/* One kernel set on every shape and token count: 4 checks per (type,
 * shape). Returns the checks made. */
static int products_on(const dhsa__bf16_kernels *k) {
    static const int64_t shapes[][2] = {{32, 5}, {37, 67}, {1000, 130}, {1056, 9}, {2065, 5}};
    static const int64_t toks[] = {1, 2, 3, 4, 5, 7, 13, 64};
    const int c0 = t_checks();
    dhsa_ctx *ctx = make_ctx(2);
    for (int ti = 0; ti < 2; ti++) {
        const uint32_t type = ti ? DHSA_GGML_BF16 : DHSA_GGML_F16;
        const char *tn = ti ? "BF16" : "F16";
        /* BF16 keeps 8 significant bits: each rounding moves a value by at most 2^-8 of it */
        const double rel = ti ? 0x1p-8 : 0x1p-7 + 0x1p-16;
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const int64_t n_in = shapes[si][0], n_out = shapes[si][1], ldx = n_in + 3, ldy = n_out + 2;
            mat m;
            mat_make(&m, type, n_in, n_out, 100 + si + 10 * (uint64_t)ti);
            cmp_t same = {0, -1, -1, 0}, orig = same;
            int status_ok = 1, pad_ok = 1, fused_panel = 1;
            float *ytok4 = NULL;
            for (size_t qi = 0; qi < sizeof toks / sizeof toks[0]; qi++) {
                const int64_t nt = toks[qi];
                if (n_in > 1500 && nt > 13) continue; /* keep the double references short */
                float *x = make_x(nt, ldx, 200 + qi + 1000 * si);
                float *y = malloc(sizeof(float) * (size_t)(nt * ldy));
                for (int64_t i = 0; i < nt * ldy; i++) y[i] = -7.0f;
                status_ok &= dhsa__bf16_matmul(ctx, k, &m.W, x, ldx, nt, y, ldy) == DHSA_OK;
                for (int64_t t = 0; t < nt; t++)
                    for (int64_t o = n_out; o < ldy; o++) pad_ok &= y[t * ldy + o] == -7.0f;
                cmp_t a = compare(&m, m.wb, x, ldx, nt, y, ldy, dhsa__bf16_round, 0.0, gamma_of(n_in));
                cmp_t b = compare(&m, m.w, x, ldx, nt, y, ldy, NULL, rel, gamma_of(n_in));
                if (a.worst > same.worst || same.t < 0) same = a;
                if (b.worst > orig.worst || orig.t < 0) orig = b;
                if (b.rel_seen > g_rel_seen[ti]) g_rel_seen[ti] = b.rel_seen;
                if (verbose)
                    printf("  %s %s n_in %lld n_out %lld tok %lld: vs same inputs %.3g of bound, vs original %.3g "
                           "of bound (%.2g of sum |w x|)\n", k->name, tn, (long long)n_in, (long long)n_out,
                           (long long)nt, a.worst, b.worst, b.rel_seen);
                /* the 4-token result (fused) against the first 4 tokens of 13 (panel) */
                if (nt == 4) {
                    ytok4 = y;
                    y = NULL;
                } else if (nt == 13 && ytok4) {
                    float *x4 = make_x(4, ldx, 200 + 3 + 1000 * si); /* the nt = 4 input */
                    float *y4 = malloc(sizeof(float) * (size_t)(13 * ldy));
                    memcpy(x, x4, sizeof(float) * (size_t)(4 * ldx));
                    status_ok &= dhsa__bf16_matmul(ctx, k, &m.W, x, ldx, 13, y4, ldy) == DHSA_OK;
                    for (int64_t t = 0; t < 4; t++)
                        fused_panel &= memcmp(y4 + t * ldy, ytok4 + t * ldy, sizeof(float) * (size_t)n_out) == 0;
                    free(x4);
                    free(y4);
                }
                free(x);
                free(y);
            }
            T_CHECK(status_ok && pad_ok, "%s %s %lldx%lld: every call ran, padding of y untouched", k->name, tn,
                    (long long)n_out, (long long)n_in);
            T_CHECK(same.worst <= 1.0, "%s %s %lldx%lld vs the double product of the same BF16 inputs: %.3g of the "
                    "bound gamma_D sum |w x| (token %lld, row %lld)", k->name, tn, (long long)n_out, (long long)n_in,
                    same.worst, (long long)same.t, (long long)same.o);
            T_CHECK(orig.worst <= 1.0, "%s %s %lldx%lld vs the double product of the original inputs: %.3g of the "
                    "bound %s sum |w x| (token %lld, row %lld)", k->name, tn, (long long)n_out, (long long)n_in,
                    orig.worst, ti ? "2^-8" : "(2^-7 + 2^-16)", (long long)orig.t, (long long)orig.o);
            T_CHECK(fused_panel, "%s %s %lldx%lld: 4 tokens alone (fused) = the same 4 in a call of 13 (panel), "
                    "bitwise", k->name, tn, (long long)n_out, (long long)n_in);
            free(ytok4);
            mat_free(&m);
        }
    }
    dhsa_ctx_free(ctx);
    return t_checks() - c0;
}

static void test_products(void) {
    int made = 0;
    for (int ki = 0; ki < N_KSETS; ki++) {
        int runs;
        const dhsa__bf16_kernels *k = kset(ki, &runs);
        if (!runs) {
            T_SKIP(made, "products: the avx512-bf16 kernels do not run here (no AVX512-BF16 or a build without it)");
            continue;
        }
        made = products_on(k);
    }
    printf("test_bf16: worst |y - ref| / sum |w x| against the original inputs: F16 %.3g (bound 2^-7 + 2^-16 = %.3g), "
           "BF16 %.3g (bound 2^-8 = %.3g)\n", g_rel_seen[0], 0x1p-7 + 0x1p-16, g_rel_seen[1], 0x1p-8);
}

/* The checks can fail: the reference with truncated activations, a
 * changed output; and the SIMD kernels against the scalar ones. */
static int cross_on(const dhsa__bf16_kernels *k) {
    const int c0 = t_checks();
    dhsa_ctx *ctx = make_ctx(1);
    mat m;
    mat_make(&m, DHSA_GGML_F16, 1000, 67, 7);
    float *x = make_x(9, 1000, 8), *y = malloc(sizeof(float) * 9 * 67), *ys = malloc(sizeof(float) * 9 * 67);
    T_CHECK(dhsa__bf16_matmul(ctx, k, &m.W, x, 1000, 9, y, 67) == DHSA_OK &&
                dhsa__bf16_matmul(ctx, &dhsa__bf16_scalar, &m.W, x, 1000, 9, ys, 67) == DHSA_OK,
            "%s and scalar ran", k->name);
    cmp_t tr = compare(&m, m.wb, x, 1000, 9, y, 67, round_trunc, 0.0, gamma_of(1000));
    T_CHECK(tr.worst > 1.0, "%s: a reference with truncated activations fails the bound (%.3g of it)", k->name,
            tr.worst);
    y[5 * 67 + 40] *= 1.0f + 0x1p-12f;
    cmp_t ch = compare(&m, m.wb, x, 1000, 9, y, 67, dhsa__bf16_round, 0.0, gamma_of(1000));
    T_CHECK(ch.worst > 1.0 && ch.t == 5 && ch.o == 40, "%s: an output changed by 2^-12 of itself fails (token %lld, "
            "row %lld, %.3g of the bound)", k->name, (long long)ch.t, (long long)ch.o, ch.worst);
    y[5 * 67 + 40] /= 1.0f + 0x1p-12f;
    /* against the scalar kernels: each within gamma_D of the exact sum */
    double worst = 0, bitwise = 1;
    for (int64_t t = 0; t < 9; t++)
        for (int64_t o = 0; o < 67; o++) {
            double s = 0;
            for (int64_t i = 0; i < 1000; i++) s += fabs(m.wb[o * 1000 + i] * bf(dhsa__bf16_round(x[t * 1000 + i])));
            const double q = fabs((double)y[t * 67 + o] - ys[t * 67 + o]) / (2 * gamma_of(1000) * s + 1e-30);
            worst = fmax(worst, q);
            bitwise = bitwise && y[t * 67 + o] == ys[t * 67 + o];
        }
    T_CHECK(worst <= 1.0, "%s against the scalar kernels: %.3g of twice the bound", k->name, worst);
    if (verbose) printf("  %s vs scalar: %s\n", k->name, bitwise ? "bitwise equal" : "not bitwise equal");
    free(x);
    free(y);
    free(ys);
    mat_free(&m);
    dhsa_ctx_free(ctx);
    return t_checks() - c0;
}

static void test_cross(void) {
    int made = 0;
    for (int ki = 0; ki < N_KSETS; ki++) {
        int runs;
        const dhsa__bf16_kernels *k = kset(ki, &runs);
        if (!runs) {
            T_SKIP(made, "cross checks: the avx512-bf16 kernels do not run here");
            continue;
        }
        made = cross_on(k);
    }
}

/* NaN and Inf activations; 1 and 2 threads bitwise. */
static int special_on(const dhsa__bf16_kernels *k) {
    const int c0 = t_checks();
    dhsa_ctx *c1 = make_ctx(1), *c2 = make_ctx(2);
    for (int ti = 0; ti < 2; ti++) {
        mat m;
        mat_make(&m, ti ? DHSA_GGML_BF16 : DHSA_GGML_F16, 1056, 130, 9);
        for (int route = 0; route < 2; route++) {
            const int64_t nt = route ? 9 : 3;
            float *x = make_x(nt, 1056, 10), *y = malloc(sizeof(float) * (size_t)(nt * 130)),
                  *y2 = malloc(sizeof(float) * (size_t)(nt * 130));
            x[1 * 1056 + 1040] = NAN;     /* token 1, in the last K block */
            x[2 * 1056 + 5] = INFINITY;   /* token 2 */
            T_CHECK(dhsa__bf16_matmul(c1, k, &m.W, x, 1056, nt, y, 130) == DHSA_OK &&
                        dhsa__bf16_matmul(c2, k, &m.W, x, 1056, nt, y2, 130) == DHSA_OK,
                    "%s: ran", k->name);
            int nan1 = 1, inf2 = 1, others = 1;
            for (int64_t o = 0; o < 130; o++) {
                nan1 &= isnan(y[130 + o]);
                inf2 &= !isfinite(y[260 + o]);
                others &= isfinite(y[o]);
                for (int64_t t = 3; t < nt; t++) others &= isfinite(y[t * 130 + o]);
            }
            T_CHECK(nan1 && inf2 && others, "%s %s, %s route: a NaN activation gives NaN outputs (%d), an Inf one "
                    "non-finite ones (%d), the other tokens finite (%d)", k->name, ti ? "BF16" : "F16",
                    route ? "panel" : "fused", nan1, inf2, others);
            T_CHECK(memcmp(y, y2, sizeof(float) * (size_t)(nt * 130)) == 0, "%s %s, %s route: 1 and 2 threads bitwise",
                    k->name, ti ? "BF16" : "F16", route ? "panel" : "fused");
            free(x);
            free(y);
            free(y2);
        }
        mat_free(&m);
    }
    dhsa_ctx_free(c1);
    dhsa_ctx_free(c2);
    return t_checks() - c0;
}

static void test_special(void) {
    int made = 0;
    for (int ki = 0; ki < N_KSETS; ki++) {
        int runs;
        const dhsa__bf16_kernels *k = kset(ki, &runs);
        if (!runs) {
            T_SKIP(made, "NaN, Inf and threads: the avx512-bf16 kernels do not run here");
            continue;
        }
        made = special_on(k);
    }
}

/* ------------------------------------------------------ dispatch, memory --- */

static void test_dispatch(void) {
    const dhsa_isa isa = dhsa_active_isa();
    int runs;
    kset(1, &runs);
    const int here = runs && isa == DHSA_ISA_AVX512; /* the kernels can run under this ISA */
    /* the probe: a time ratio, measured once, and the automatic choice follows it */
    const double ratio = dhsa__bf16_probe();
    T_CHECK(here ? ratio > 0.05 && ratio < 50.0 && dhsa__bf16_probe() == ratio : ratio == 0.0,
            "probe: a vdpbf16ps takes %.2f FMA here (measured once)", ratio);
    printf("test_bf16: the probe says a vdpbf16ps costs %.2f FMA here: the BF16 route %s by default\n", ratio,
           here && ratio <= 2.0 ? "runs" : "does not run");
    const dhsa__bf16_mode mode0 = dhsa__set_bf16_mode(DHSA__BF16_AUTO);
    for (int m = DHSA__BF16_OFF; m <= DHSA__BF16_AUTO; m++) {
        dhsa__set_bf16_mode((dhsa__bf16_mode)m);
        const int on = here && (m == DHSA__BF16_ON || (m == DHSA__BF16_AUTO && ratio <= 2.0));
        const char *want = on ? "bf16 avx512-bf16"
                           : !here ? NULL
                           : m == DHSA__BF16_OFF ? "f32 avx512 (DHSA_BF16=off)" : "f32 avx512 (avx512-bf16 slower here)";
        for (int ti = 0; ti < 2; ti++) {
            const char *got = dhsa__matmul_path_name(DHSA_MM_FAST, ti ? DHSA_GGML_BF16 : DHSA_GGML_F16);
            T_CHECK(want ? strcmp(got, want) == 0 : strncmp(got, "f32 ", 4) == 0 && !strchr(got, '('),
                    "mode %d, %s fast route (ISA %s): %s (want %s)", m, ti ? "BF16" : "F16", dhsa_isa_name(isa), got,
                    want ? want : "f32 and no reason");
        }
        T_CHECK((dhsa__bf16_kernels_active() != NULL) == on && (dhsa__bf16_off_reason() != NULL) == (here && !on),
                "mode %d: the kernels are active (%d) and a reason given (%d) as the name says", m,
                dhsa__bf16_kernels_active() != NULL, dhsa__bf16_off_reason() != NULL);
    }
    dhsa__set_bf16_mode(DHSA__BF16_ON);
    T_CHECK(strncmp(dhsa__matmul_path_name(DHSA_MM_EXACT, DHSA_GGML_F16), "f32 ", 4) == 0 &&
                strncmp(dhsa__matmul_path_name(DHSA_MM_EXACT, DHSA_GGML_BF16), "f32 ", 4) == 0 &&
                strncmp(dhsa__matmul_path_name(DHSA_MM_FAST, DHSA_GGML_F32), "f32 ", 4) == 0,
            "the exact route stays F32, and F32 weights take it");
    if (dhsa_set_isa(DHSA_ISA_AVX2) == DHSA_OK) {
        T_CHECK(strcmp(dhsa__matmul_path_name(DHSA_MM_FAST, DHSA_GGML_BF16), "f32 avx2") == 0,
                "ISA avx2, BF16 on: BF16 weights take the exact AVX2 route (%s)",
                dhsa__matmul_path_name(DHSA_MM_FAST, DHSA_GGML_BF16));
    } else {
        T_SKIP(1, "no AVX2 here: the AVX2 ISA's route");
    }
    dhsa_set_isa(DHSA_ISA_SCALAR);
    T_CHECK(strcmp(dhsa__matmul_path_name(DHSA_MM_FAST, DHSA_GGML_F16), "f32 scalar") == 0,
            "ISA scalar, BF16 on: F16 weights take the exact scalar route");
    dhsa_set_isa(isa);

    /* dhsa__matmul_on runs what the name says, bitwise (the AMX tiles
     * off: calls of 5 tokens take them where they run, tests/test_amx.c) */
    const int amx0 = dhsa__set_amx_cap(0);
    dhsa_ctx *ctx = make_ctx(2);
    mat m;
    mat_make(&m, DHSA_GGML_F16, 600, 70, 11);
    float *x = make_x(5, 600, 12), *y = malloc(sizeof(float) * 5 * 70), *yr = malloc(sizeof(float) * 5 * 70);
    int same = 1;
    for (int nt = 1; nt <= 5; nt += 4) {
        dhsa__matmul_on(ctx, DHSA_MM_FAST, &m.W, x, 600, nt, y, 70);
        const dhsa__bf16_kernels *k = dhsa__bf16_kernels_active();
        if (k) dhsa__bf16_matmul(ctx, k, &m.W, x, 600, nt, yr, 70);
        else dhsa__matmul(ctx, &m.W, x, 600, nt, yr, 70);
        same &= memcmp(y, yr, sizeof(float) * (size_t)(nt * 70)) == 0;
        dhsa__matmul_on(ctx, DHSA_MM_EXACT, &m.W, x, 600, nt, y, 70);
        dhsa__matmul(ctx, &m.W, x, 600, nt, yr, 70);
        same &= memcmp(y, yr, sizeof(float) * (size_t)(nt * 70)) == 0;
    }
    T_CHECK(same, "dhsa__matmul_on: the fast route runs %s, the exact one dhsa__matmul (bitwise, 1 and 5 tokens)",
            dhsa__matmul_path_name(DHSA_MM_FAST, DHSA_GGML_F16));
    free(x);
    free(y);
    free(yr);
    mat_free(&m);
    dhsa_ctx_free(ctx);
    dhsa__set_amx_cap(amx0);
    dhsa__set_bf16_mode(mode0);
}

static void test_workspace(void) {
    const dhsa__bf16_mode mode0 = dhsa__set_bf16_mode(DHSA__BF16_ON);
    if (!dhsa__bf16_kernels_active()) {
        T_SKIP(4, "workspace of the BF16 route: it does not run here");
        dhsa__set_bf16_mode(mode0);
        return;
    }
    for (int64_t nt = 1; nt <= 64; nt *= 64) {
        dhsa_ctx *ctx = make_ctx(2);
        mat m;
        mat_make(&m, DHSA_GGML_BF16, 512, 256, 13);
        float *x = make_x(nt, 512, 14), *y = malloc(sizeof(float) * (size_t)(nt * 256));
        const size_t ws = dhsa__matmul_workspace_on(DHSA_MM_FAST, DHSA_GGML_BF16, 512, 256, nt, dhsa_ctx_n_threads(ctx));
        dhsa_status st = dhsa__matmul_on(ctx, DHSA_MM_FAST, &m.W, x, 512, nt, y, 256);
        dhsa_mem_stats ms = dhsa_ctx_mem_stats(ctx);
        T_CHECK(st == DHSA_OK && ws > 0 && ms.peak == ws, "n_tok %lld: workspace says %zu bytes, the ctx peaked at %zu",
                (long long)nt, ws, ms.peak);
        dhsa_ctx_trim(ctx);
        dhsa_ctx_set_budget(ctx, ws - 1);
        st = dhsa__matmul_on(ctx, DHSA_MM_FAST, &m.W, x, 512, nt, y, 256);
        T_CHECK(st == DHSA_ERR_MEMORY_BUDGET && dhsa_last_error()[0], "a budget below the workspace: %s",
                dhsa_status_str(st));
        free(x);
        free(y);
        mat_free(&m);
        dhsa_ctx_free(ctx);
    }
    dhsa__set_bf16_mode(mode0);
}

/* `dhsa bench matmul` times the BF16 route (where it runs) after checking
 * it against the scalar kernels, and a wrong output fails that check. */
static void test_bench_cli(void) {
    if (!getenv("DHSA_CLI")) {
        T_SKIP(3, "bench matmul: DHSA_CLI is not set (make test sets it)");
        return;
    }
    int runs;
    kset(1, &runs);
    const char *mode = getenv("DHSA_BF16"); /* the CLI reads it too: off keeps the route off */
    const int here = runs && dhsa_active_isa() == DHSA_ISA_AVX512 && !(mode && strcmp(mode, "off") == 0);
    const char *args = "bench matmul --type BF16 --n-in 100 --n-out 70 --tok 3 --runs 1 --threads 1 --clock cpu";
    char *out = NULL;
    int rc = cli_run(args, 0, &out);
    T_CHECK(rc == 0 && out && strstr(out, here ? "bf16 fused" : "(exact"), "`dhsa %s`: status %d, %s row:\n%.600s",
            args, rc, here ? "a bf16 fused" : "an (exact)", out ? out : "");
    free(out);
    args = "bench matmul --type F16 --n-in 100 --n-out 70 --tok 9 --runs 1 --threads 1 --route fast --corrupt";
    rc = cli_run(args, 0, &out);
    T_CHECK(out && strstr(out, "check FAILED") && strstr(out, here ? "fast route" : "exact route"),
            "`dhsa %s` reports the failed check of the %s route:\n%.600s", args, here ? "fast" : "exact", out ? out : "");
    T_CHECK(rc == 1, "`dhsa %s` exits 1 (status %d)", args, rc);
    free(out);
}

int main(void) {
    verbose = getenv("TEST_BF16_VERBOSE") != NULL;
    test_rounding();
    test_to_bf16();
    test_products();
    test_cross();
    test_special();
    test_dispatch();
    test_workspace();
    test_bench_cli();
    return t_report("test_bf16");
}
