/* test_attn_kern.c: the attention micro-kernels of attn/kern.h on their
 * own, on every ISA: decode over an F16 / BF16 cache read in place
 * bitwise equal to the same values widened to F32, the GLU (SiLU, GELU)
 * and the exp-weight kernels against double references, the score kernel
 * (qk) at every tile width. Harness: attn_t.h.
 *
 * Run: make build/tests/test_attn_kern && build/tests/test_attn_kern
 * (or `make test`). Ends with "test_attn_kern: P passed, F failed, S skipped".
 */

#include "attn_t.h"

/* Decode over an F16 / BF16 cache reads its rows in place (kern.h,
 * qk_rows16): the output must be bitwise the output over an F32 cache
 * holding the same (exactly widened) values, on every ISA. */
static void cache16_bitwise(int64_t Hq, int64_t Hkv, int64_t d, int64_t dv) {
    const int64_t L = 300;
    float *q = malloc(sizeof(float) * (size_t)(Hq * d)), *k32 = malloc(sizeof(float) * (size_t)(Hkv * L * d)),
          *v32 = malloc(sizeof(float) * (size_t)(Hkv * L * dv)), *o1 = malloc(sizeof(float) * (size_t)(Hq * dv)),
          *o2 = malloc(sizeof(float) * (size_t)(Hq * dv));
    uint16_t *k16 = malloc(2 * (size_t)(Hkv * L * d)), *v16 = malloc(2 * (size_t)(Hkv * L * dv));
    rng_t seed = {99};
    for (int64_t i = 0; i < Hq * d; i++) q[i] = (float)rng_normal(&seed);
    for (int bf = 0; bf < 2; bf++) {
        for (int64_t i = 0; i < Hkv * L * d; i++) {
            float x = (float)rng_normal(&seed);
            k16[i] = bf ? dhsa_f32_to_bf16(x) : dhsa_f32_to_f16(x);
            k32[i] = bf ? dhsa_bf16_to_f32(k16[i]) : dhsa_f16_to_f32(k16[i]);
        }
        for (int64_t i = 0; i < Hkv * L * dv; i++) {
            float x = (float)rng_normal(&seed);
            v16[i] = bf ? dhsa_f32_to_bf16(x) : dhsa_f32_to_f16(x);
            v32[i] = bf ? dhsa_bf16_to_f32(v16[i]) : dhsa_f16_to_f32(v16[i]);
        }
        const dhsa_type t16 = bf ? DHSA_BF16 : DHSA_F16;
        const dhsa_isa best = dhsa_active_isa();
        for (int isa = DHSA_ISA_SCALAR; isa <= (int)best; isa++) {
            if (dhsa_set_isa((dhsa_isa)isa) != DHSA_OK) continue;
            int same = 1;
            for (int wide = 0; wide < 2; wide++) {
                dhsa_attn_desc a = dhsa_attn_default_desc();
                a.q = dhsa_tensor_bhld(q, DHSA_F32, 1, Hq, 1, d);
                a.k = wide ? dhsa_tensor_bhld(k32, DHSA_F32, 1, Hkv, L, d) : dhsa_tensor_bhld(k16, t16, 1, Hkv, L, d);
                a.v = wide ? dhsa_tensor_bhld(v32, DHSA_F32, 1, Hkv, L, dv) : dhsa_tensor_bhld(v16, t16, 1, Hkv, L, dv);
                a.o = dhsa_tensor_bhld(wide ? o2 : o1, DHSA_F32, 1, Hq, 1, dv);
                a.causal = 1;
                a.q_pos0 = L - 1;
                same &= dhsa_attention(g_ctx, &a) == DHSA_OK;
            }
            same &= memcmp(o1, o2, sizeof(float) * (size_t)(Hq * dv)) == 0;
            T_CHECK(same, "decode over a %s cache = over the F32 cache of its values, bitwise (%s)", bf ? "BF16" : "F16",
                    dhsa_isa_name((dhsa_isa)isa));
        }
        dhsa_set_isa(best);
    }
    free(q); free(k32); free(v32); free(o1); free(o2); free(k16); free(v16);
}

/* Shapes: a d the kernels handle in general, and d = 64 with 4, 2 and 1
 * queries per KV head (kern_avx512.c keeps those queries in registers). */
static void test_cache16_bitwise(void) {
    cache16_bitwise(8, 2, 72, 40);
    cache16_bitwise(8, 2, 64, 64);
    cache16_bitwise(4, 2, 64, 64);
    cache16_bitwise(2, 2, 64, 48);
}

/* ------------------------------------------------------------------------ */
/* The FFN activation kernel (kern.h, glu): act(g) * u against double,
 * on every ISA. SiLU z / (1 + e^-z); GELU in its tanh form as written in
 * the papers, 0.5 z (1 + tanh(sqrt(2/pi) (z + 0.044715 z^3))). Bounds:
 * relative GLU_RTOL (SiLU) and GELU_RTOL (GELU, whose exp argument a
 * carries the rounding of z^3, a relative error of about |a| u for
 * |a| <= 88: largest near z = -9, where the value is ~1e-27) past an
 * absolute 1e-30 (where the true value underflows, the kernels give about
 * z / e^88). Measured here (test output): SiLU 1.9e-7; GELU 9.8e-6, and
 * 1.3e-6 over |z| <= 4. */
#define GLU_RTOL 4e-7
#define GELU_RTOL 1.6e-5
#define GLU_ATOL 1e-30

static double glu_ref(double z, double u, int gelu) {
    if (!gelu) return z / (1.0 + exp(-z)) * u;
    /* 0.5 (1 + tanh y) = 1 / (1 + e^-2y); in double the tanh form loses
     * every digit for y < -19 (1 + tanh y cancels), this one none */
    double y = 0.79788456080286535588 * (z + 0.044715 * z * z * z);
    return z / (1.0 + exp(-2.0 * y)) * u;
}

/* Largest |got - ref| / |ref| where |ref| > atol; *bad counts elements past
 * atol + rtol |ref|, *worst is the index of the largest excess. */
static double glu_compare(const float *g, const float *u, const float *got, int64_t n, int gelu, double rtol,
                          double zmax, int64_t *bad, int64_t *worst) {
    double max_rel = 0, max_ex = -1;
    *bad = 0;
    *worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double ref = glu_ref(g[i], u[i], gelu), e = fabs((double)got[i] - ref);
        if (!(e <= GLU_ATOL + rtol * fabs(ref))) (*bad)++;
        double ex = e - (GLU_ATOL + rtol * fabs(ref));
        if (!(ex <= max_ex)) max_ex = ex, *worst = i;
        if (fabs(ref) > GLU_ATOL && fabs(g[i]) <= zmax && e / fabs(ref) > max_rel) max_rel = e / fabs(ref);
    }
    return max_rel;
}

static int test_glu_isa(const dhsa_attn_kernels *k, const char *isa) {
    const int before = t_checks();
    enum { N = 20000 };
    float *g = malloc(N * sizeof(float)), *u = malloc(N * sizeof(float)), *o = malloc(N * sizeof(float)),
          *o2 = malloc(N * sizeof(float));
    rng_t r = {7};
    for (int gelu = 0; gelu < 2; gelu++) {
        /* a dense grid over where the activation bends, then normals of
         * several scales; up values normal */
        const double lo = gelu ? -12 : -100, hi = gelu ? 12 : 40;
        for (int64_t i = 0; i < N; i++) {
            g[i] = i < N / 2 ? (float)(lo + (hi - lo) * (double)i / (N / 2 - 1))
                             : (float)(rng_normal(&r) * (i % 3 == 0 ? 0.1 : i % 3 == 1 ? 2.0 : 8.0));
            u[i] = (float)rng_normal(&r);
        }
        double rtol = gelu ? GELU_RTOL : GLU_RTOL;
        int ok = 1;
        /* every length 1..40 (vector tails), then the whole array */
        for (int64_t n = 1; n <= 40; n++) {
            k->glu(g + 3 * n, u + 3 * n, n, gelu, o);
            int64_t bad, w;
            glu_compare(g + 3 * n, u + 3 * n, o, n, gelu, rtol, INFINITY, &bad, &w);
            ok &= bad == 0;
        }
        k->glu(g, u, N, gelu, o);
        int64_t bad, w;
        double rel4 = glu_compare(g, u, o, N, gelu, rtol, 4.0, &bad, &w);
        double rel = glu_compare(g, u, o, N, gelu, rtol, INFINITY, &bad, &w);
        printf("test_attn: glu %s %s: max relative error %.2e against double (bound %.1e), %.2e over |z| <= 4\n",
               gelu ? "gelu" : "silu", isa, rel, rtol, rel4);
        T_CHECK(ok && bad == 0, "glu %s (%s): %lld elements past %g + %g |ref|; worst at %lld: z = %.9g u = %.9g got %.9g, "
                "want %.9g", gelu ? "gelu" : "silu", isa, (long long)bad, GLU_ATOL, rtol, (long long)w, (double)g[w],
                (double)u[w], (double)o[w], glu_ref(g[w], u[w], gelu));
        /* in place (out = g, as the session calls it) gives the same bits */
        memcpy(o2, g, N * sizeof(float));
        k->glu(o2, u, N, gelu, o2);
        T_CHECK(memcmp(o, o2, N * sizeof(float)) == 0, "glu %s (%s) in place differs", gelu ? "gelu" : "silu", isa);
        /* NaN in, NaN out; huge |z| (z^3 overflows) gives the limits z and 0 */
        float gz[4] = {NAN, 1e30f, -1e30f, 0.0f}, uz[4] = {1, 1, 1, 1}, oz[4];
        k->glu(gz, uz, 4, gelu, oz);
        T_CHECK(isnan(oz[0]) && oz[1] == 1e30f && fabsf(oz[2]) < 1e-7f && oz[3] == 0.0f,
                "glu %s (%s) edges: NaN -> %g, 1e30 -> %g, -1e30 -> %g, 0 -> %g", gelu ? "gelu" : "silu", isa,
                (double)oz[0], (double)oz[1], (double)oz[2], (double)oz[3]);
        /* the comparator catches the other activation (a test that can fail) */
        glu_compare(g, u, o, N, !gelu, rtol, INFINITY, &bad, &w);
        T_CHECK(bad > 0, "glu comparator accepts %s as %s", gelu ? "gelu" : "silu", gelu ? "silu" : "gelu");
    }
    free(g); free(u); free(o); free(o2);
    return t_checks() - before;
}

/* The sampler's weights (kern.h, expw): exp((x - sub) * mul) against
 * double exp of the same float argument, on every ISA: relative
 * EXPW_RTOL past an absolute 1e-37 (AVX2 flushes below e^-87.3, the
 * others below e^-104); -inf gives 0 and x = sub gives 1 exactly. */
#define EXPW_RTOL 4e-7

static int test_expw_isa(const dhsa_attn_kernels *k, const char *isa) {
    const int before = t_checks();
    enum { N = 20000 };
    float *x = malloc(N * sizeof(float)), *o = malloc(N * sizeof(float));
    rng_t r = {11};
    const float subs[3] = {0.0f, 3.5f, -20.0f}, muls[3] = {1.0f, 1.0f / 0.7f, 0.25f};
    double worst = 0;
    int64_t bad = 0;
    for (int c = 0; c < 3; c++) {
        for (int64_t i = 0; i < N; i++)
            x[i] = i < N / 2 ? (float)(subs[c] - 130.0 / muls[c] + (140.0 / muls[c]) * (double)i / (N / 2 - 1))
                             : (float)(subs[c] + rng_normal(&r) * 8.0);
        x[5] = -INFINITY;
        x[6] = subs[c];
        /* every length 1..40 (vector tails), then the whole array */
        for (int64_t n = 1; n <= 41; n++) {
            const int64_t off = n <= 40 ? 3 * n : 0, len = n <= 40 ? n : N;
            k->expw(x + off, len, subs[c], muls[c], o);
            for (int64_t i = 0; i < len; i++) {
                float a = (x[off + i] - subs[c]) * muls[c];
                double ref = exp((double)a), e = fabs((double)o[i] - ref);
                if (!(e <= 1e-37 + EXPW_RTOL * ref)) bad++;
                if (ref > 1e-37 && e / ref > worst) worst = e / ref;
            }
        }
        k->expw(x, N, subs[c], muls[c], o);
        T_CHECK(o[5] == 0.0f && o[6] == 1.0f, "expw (%s): exp(-inf) = %g, exp(0) = %.9g", isa, (double)o[5],
                (double)o[6]);
    }
    printf("test_attn: expw %s: max relative error %.2e against double (bound %.1e)\n", isa, worst, EXPW_RTOL);
    T_CHECK(bad == 0, "expw (%s): %lld values past 1e-37 + %g exp", isa, (long long)bad, EXPW_RTOL);
    /* the comparison can fail: a weight off by 1e-6 relative is caught */
    x[0] = 1.0f;
    k->expw(x, 1, 0.0f, 1.0f, o);
    T_CHECK(fabs((double)o[0] * (1 + 1e-6) - exp(1.0)) > EXPW_RTOL * exp(1.0), "expw comparator too loose");
    free(x);
    free(o);
    return t_checks() - before;
}

/* f on the scalar kernels, then on every ISA's the CPU has (skipped,
 * said, where it has not); the active ISA restored. */
static void each_isa(int (*f)(const dhsa_attn_kernels *, const char *), const char *what) {
    const dhsa_isa best = dhsa_active_isa();
    int n_checks = f(&dhsa__kern_scalar, "scalar");
    for (int isa = DHSA_ISA_AVX2; isa <= DHSA_ISA_AVX512; isa++) {
        if (dhsa_set_isa((dhsa_isa)isa) != DHSA_OK) {
            T_SKIP(n_checks, "%s: ISA %s unsupported here", what, dhsa_isa_name((dhsa_isa)isa));
            continue;
        }
        f(dhsa__attn_kernels(), dhsa_isa_name((dhsa_isa)isa));
    }
    T_CHECK(dhsa_set_isa(best) == DHSA_OK, "could not restore ISA %s", dhsa_isa_name(best));
}

static void test_expw(void) { each_isa(test_expw_isa, "expw"); }

/* The score micro-kernel (kern.h qk) at every width it takes (W = 16, 32,
 * 48, 64: the chunk scores' tiles of 1-4 strips) and row counts past each
 * blocking: against double sums, within 1e-5 relative to the sum of
 * |terms|, and every element the same bits as the same product at W = 16
 * (a strip's sums do not depend on the width: routing compares tiles of
 * other widths). Returns the checks made. */
static int test_qk_isa(const dhsa_attn_kernels *k, const char *isa) {
    const int d = 40, n = 29, Ws[4] = {16, 32, 48, 64};
    float *K = malloc(sizeof(float) * (size_t)(n * d)), *Qt = malloc(sizeof(float) * (size_t)(d * 64));
    float *S = malloc(sizeof(float) * (size_t)(n * 64)), *S16 = malloc(sizeof(float) * (size_t)(n * 16));
    float *Q16 = malloc(sizeof(float) * (size_t)(d * 16));
    rng_t seed = {7};
    for (int i = 0; i < n * d; i++) K[i] = (float)rng_normal(&seed);
    for (int i = 0; i < d * 64; i++) Qt[i] = (float)rng_normal(&seed);
    int checks = 0;
    for (int wi = 0; wi < 4; wi++) {
        const int W = Ws[wi];
        for (int i = 0; i < n * W; i++) S[i] = NAN;
        k->qk(K, d, n, d, Qt, W, S);
        double worst = 0;
        int same = 1;
        for (int x = 0; x < W; x += 16) {
            for (int c = 0; c < d; c++) memcpy(Q16 + c * 16, Qt + c * W + x, 16 * sizeof(float));
            k->qk(K, d, n, d, Q16, 16, S16);
            for (int j = 0; j < n; j++)
                for (int i = 0; i < 16; i++) {
                    double ref = 0, mag = 0;
                    for (int c = 0; c < d; c++) {
                        ref += (double)K[j * d + c] * Qt[c * W + x + i];
                        mag += fabs((double)K[j * d + c] * Qt[c * W + x + i]);
                    }
                    const double e = fabs(S[j * W + x + i] - ref) / (mag + 1e-30);
                    worst = e > worst || e != e ? e : worst;
                    same &= memcmp(&S[j * W + x + i], &S16[j * 16 + i], sizeof(float)) == 0;
                }
        }
        T_CHECK(worst <= 1e-5, "qk %s W %d: worst error %.3g of the terms' magnitude", isa, W, worst);
        T_CHECK(same, "qk %s W %d: every strip the bits of the same product at W 16", isa, W);
        checks += 2;
    }
    free(K); free(Qt); free(S); free(S16); free(Q16);
    return checks;
}

static void test_qk(void) { each_isa(test_qk_isa, "qk"); }

static void test_glu(void) {
    /* the reference's GELU against the tanh form where that is exact enough */
    double dmax = 0;
    for (double z = -4; z <= 8; z += 1.0 / 64) {
        double t = 0.5 * z * (1.0 + tanh(0.79788456080286535588 * (z + 0.044715 * z * z * z)));
        if (fabs(glu_ref(z, 1, 1) - t) > dmax) dmax = fabs(glu_ref(z, 1, 1) - t);
    }
    T_CHECK(dmax < 1e-14, "glu reference: GELU's sigmoid form differs from the tanh form by %g", dmax);
    each_isa(test_glu_isa, "glu");
}

int main(void) {
    dhsa_ctx_params p = dhsa_ctx_default_params();
    if (dhsa_ctx_create(&p, &g_ctx) != DHSA_OK || !g_ctx) {
        T_CHECK(0, "ctx_create(defaults): %s", dhsa_last_error());
        return t_report("test_attn_kern");
    }
    printf("test_attn_kern: %d threads, active ISA %s\n", dhsa_ctx_n_threads(g_ctx), dhsa_isa_name(dhsa_active_isa()));
    test_cache16_bitwise();
    test_glu();
    test_expw();
    test_qk();

    dhsa_ctx_free(g_ctx);
    return t_report("test_attn_kern");
}
