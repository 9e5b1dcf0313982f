/* test_qint.c: tests of the integer route of the weight products
 * (src/matmul/int8.h: 8-bit activations, integer dot products).
 *
 * Oracles:
 *   - the unpacked form a*c + b of every quantized type against the
 *     weights dhsa__dequantize_row gives (itself held to an independent
 *     decoder by test_quant.c), within one F32 rounding of the weight;
 *   - the activation codes re-derived here in double (nearest x / xd, xd =
 *     max|x| / 127), every code;
 *   - the product against the double product of the true weights and the
 *     true activations: |y - ref| <= sum_i |w_i| (xd_i / 2) (the
 *     activations' rounding, the route's only approximation) + 1e-6
 *     sum_i |w_i x_i| (F32 sums); a deliberately wrong product fails it;
 *   - every SIMD kernel set this CPU runs (avx2, avx-vnni, avx512-vnni),
 *     each against the scalar kernels: activations and unpacking bitwise,
 *     the panel route bitwise (the contract: the integer sums are exact on
 *     every kernel, vpmaddubsw's included, and the float steps the same),
 *     the fused route within 1e-6 of sum |terms|; 1 and 2 threads bitwise;
 *     NaN and Inf in an activation block make its outputs NaN; edge shapes
 *     (n_in = 32, a 32-value tail, n_out not a multiple of 16 or 32, 1 to 9
 *     tokens and token tails, chunks past 256 blocks);
 *   - the K types' super-block panel (ktile) called directly: bitwise its
 *     scalar reference, which is held to the double product of the
 *     weights it reads; through the route, within 1e-6 of the scalar
 *     route and within the bound of the double product;
 *   - the kernels called directly on codes at the saturation edge of
 *     vpmaddubsw (every code 255 or 129 against activations of +-127):
 *     bitwise the scalar tile; and the AVX2 kernels told a wrong (narrow)
 *     largest code on such codes do differ (the test can fail);
 *   - the dispatch: avx512-vnni > avx-vnni > avx2 under the caps
 *     (dhsa__set_idot_cap, the ISA), and the route names.
 *
 * Run: make build/tests/test_qint && build/tests/test_qint
 * Ends with "test_qint: P passed, F failed".
 */
#include "core/internal.h"
#include "dhsa.h"
#include "matmul/int8.h"
#include "matmul/matmul.h"
#include "matmul/path.h"
#include "t.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_QTYPES 12
static const uint32_t qtypes[N_QTYPES] = {DHSA_GGML_Q8_0, DHSA_GGML_Q4_0, DHSA_GGML_Q4_K,  DHSA_GGML_Q6_K,
                                          DHSA_GGML_Q4_1, DHSA_GGML_Q5_0, DHSA_GGML_Q5_1,  DHSA_GGML_IQ4_NL,
                                          DHSA_GGML_Q2_K, DHSA_GGML_Q3_K, DHSA_GGML_Q5_K, DHSA_GGML_IQ4_XS};
static const char *const qnames[N_QTYPES] = {"Q8_0", "Q4_0",   "Q4_K", "Q6_K", "Q4_1", "Q5_0",
                                             "Q5_1", "IQ4_NL", "Q2_K", "Q3_K", "Q5_K", "IQ4_XS"};

#include "rng.h"

/* A quantized matrix of n_out rows of n_in values from N(0, 1), and its
 * dequantized weights. */
typedef struct {
    dhsa_wmat W;
    uint8_t *data;
    float *w; /* [n_out][n_in] */
} qmat;

static int qmat_make(qmat *m, uint32_t type, int64_t n_in, int64_t n_out, uint64_t seed) {
    rng_t r = {seed};
    int64_t rb = dhsa__wt_row_bytes(type, n_in);
    m->data = malloc((size_t)(rb * n_out));
    m->w = malloc(sizeof(float) * (size_t)(n_in * n_out));
    float *src = malloc(sizeof(float) * (size_t)n_in);
    if (!m->data || !m->w || !src) return -1;
    for (int64_t o = 0; o < n_out; o++) {
        for (int64_t i = 0; i < n_in; i++) src[i] = (float)rng_normal(&r);
        if (dhsa__quantize_row(type, src, m->data + o * rb, n_in) != DHSA_OK) return -1;
        if (dhsa__dequantize_row(type, m->data + o * rb, m->w + o * n_in, n_in) != DHSA_OK) return -1;
    }
    free(src);
    m->W.type = type;
    m->W.data = m->data;
    m->W.n_in = n_in;
    m->W.n_out = n_out;
    m->W.row_bytes = rb;
    return 0;
}

static void qmat_free(qmat *m) {
    free(m->data);
    free(m->w);
}

static float *rand_x(int64_t n, uint64_t seed) {
    rng_t r = {seed};
    float *x = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) x[i] = (float)(rng_normal(&r) * (1.0 + 3.0 * (i % 97 == 0)));
    return x;
}

/* The SIMD kernel sets of this build, and whether this CPU runs them. */
#define N_KSETS 4
static const dhsa__qi_kernels *kset(int i, int *runs) {
    *runs = 0;
#if defined(__x86_64__)
    static const dhsa__idot level[N_KSETS] = {DHSA__IDOT_AVX2, DHSA__IDOT_AVXVNNI, DHSA__IDOT_AVX512VNNI,
                                              DHSA__IDOT_AVX512VNNI};
    if (i == 3) { /* dhsa__qi_amxi8 builds its set in AVX-512 code: call it only where that runs */
        if (!dhsa__idot_cpu_has(level[i])) return &dhsa__qi_vnni; /* runs stays 0 */
        const dhsa__qi_kernels *a = dhsa__qi_amxi8();
        *runs = a->name != NULL && dhsa__amx_int8_active();
        return a;
    }
    const dhsa__qi_kernels *k[3] = {&dhsa__qi_avx2, &dhsa__qi_avxvnni, &dhsa__qi_vnni};
    *runs = k[i]->name != NULL && dhsa__idot_cpu_has(level[i]);
    return k[i];
#else
    (void)i;
    return NULL;
#endif
}
static const char *const kset_names[N_KSETS] = {"avx2", "avx-vnni", "avx512-vnni", "avx512-vnni amx-int8"};

/* Kernel set ki where this CPU runs it; else a skip ("WHAT: no SET here")
 * and NULL. */
static const dhsa__qi_kernels *kset_or_skip(int ki, const char *what) {
    int runs;
    const dhsa__qi_kernels *k = kset(ki, &runs);
    if (runs) return k;
    T_SKIP(1, "%s: no %s here", what, kset_names[ki]);
    return NULL;
}

/* ------------------------------------------------------------ unpack --- */

static void test_unpack(void) {
    const int64_t n = 512;
    for (int ti = 0; ti < N_QTYPES; ti++) {
        const uint32_t type = qtypes[ti];
        const int bw = dhsa__qi_bw(type);
        qmat m;
        T_CHECK(qmat_make(&m, type, n, 3, 11 + (uint64_t)ti) == 0, "%s: fixture", qnames[ti]);
        uint8_t c[512], c2[512];
        float a[32], b[32], a2[32], b2[32];
        double worst = 0.0;
        int same = 1;
        for (int64_t o = 0; o < 3; o++) {
            const uint8_t *row = m.data + o * m.W.row_bytes;
            dhsa__qi_unpack_scalar(type, row, 0, n, c, a, b);
            for (int64_t i = 0; i < n; i++) {
                double v = (double)a[i / bw] * c[i] + (double)b[i / bw], ref = m.w[o * n + i];
                double e = fabs(v - ref) / (fabs(ref) + 1e-30);
                if (ref != 0.0 && e > worst) worst = e;
                if (ref == 0.0 && v != 0.0 && fabs(v) > 1e-6 * fabs(a[i / bw])) worst = 1.0;
            }
            /* a column range, as the kernels take it */
            const int64_t blk = dhsa__wt_block(type), k0 = blk, kn = n - blk;
            dhsa__qi_unpack_scalar(type, row, k0, kn, c2, a2, b2);
            same &= memcmp(c2, c + k0, (size_t)kn) == 0 && memcmp(a2, a + k0 / bw, sizeof(float) * (size_t)(kn / bw)) == 0;
            for (int ki = 0; ki < N_KSETS; ki++) {
                int runs;
                const dhsa__qi_kernels *k = kset(ki, &runs);
                if (!runs) continue;
                memset(c2, 0xAA, sizeof c2);
                k->unpack(type, row, 0, n, c2, a2, b2);
                same &= memcmp(c2, c, (size_t)n) == 0 && memcmp(a2, a, sizeof(float) * (size_t)(n / bw)) == 0 &&
                        memcmp(b2, b, sizeof(float) * (size_t)(n / bw)) == 0;
                int cmax_ok = 1;
                for (int64_t i = 0; i < n; i++) cmax_ok &= c[i] <= dhsa__qi_code_max(type);
                same &= cmax_ok;
            }
        }
        /* a*c + b is the weight to within one F32 rounding of it */
        T_CHECK(worst <= 0x1p-24, "%s: a*c + b = the dequantized weight (worst relative %.3g)", qnames[ti], worst);
        T_CHECK(same, "%s: unpacking a column range and every SIMD unpacking give the scalar codes, all <= %d",
                qnames[ti], dhsa__qi_code_max(type));
        qmat_free(&m);
    }
}

/* -------------------------------------------------------- activations --- */

static void test_quant_act(void) {
    const int64_t n = 256;
    float *x = rand_x(n, 5);
    x[40] = 0.0f;
    for (int j = 64; j < 96; j++) x[j] = 0.0f; /* an all-zero block */
    x[100] = 1e-30f;
    int8_t q[256], q2[256];
    float xd[8], xs[16], xd2[8], xs2[16];
    for (int bw = 16; bw <= 32; bw += 16)
        for (int sb = 32; sb <= 256; sb *= 8) {
            dhsa__qi_quant_act_scalar(x, n, bw, sb, q, xd, xs);
            int ok = 1;
            for (int64_t i = 0; i < n / 32; i++) {
                double amax = 0.0;
                const int64_t g0 = i / (sb / 32) * sb;
                for (int j = 0; j < sb; j++) amax = fmax(amax, fabs(x[g0 + j]));
                double d = amax / 127.0;
                if (fabs(xd[i] - d) > 1e-7 * d) ok = 0;
                for (int j = 0; j < 32; j++) {
                    double v = d > 0 ? x[32 * i + j] / d : 0.0;
                    if (fabs(v - q[32 * i + j]) > 0.5 + 1e-5 || abs(q[32 * i + j]) > 127) ok = 0;
                }
            }
            for (int64_t j = 0; j < n / bw; j++) {
                int s = 0;
                for (int l = 0; l < bw; l++) s += q[j * bw + l];
                if (fabs(xs[j] - xd[j * bw / 32] * (double)s) > 1e-6 * fabs(xd[j * bw / 32] * (double)s)) ok = 0;
            }
            T_CHECK(ok, "activations (bw %d, sb %d): codes within 0.5 of x / xd, xd = max|x| / 127 over the group, block sums",
                    bw, sb);
            for (int ki = 0; ki < N_KSETS; ki++) {
                const dhsa__qi_kernels *k = kset_or_skip(ki, "activations");
                if (!k) continue;
                k->quant_act(x, n, bw, sb, q2, xd2, xs2);
                T_CHECK(memcmp(q, q2, sizeof q) == 0 && memcmp(xd, xd2, sizeof xd) == 0 &&
                            memcmp(xs, xs2, sizeof(float) * (size_t)(n / bw)) == 0,
                        "activations (bw %d, sb %d): %s bitwise the scalar quantizer", bw, sb, k->name);
            }
        }
    /* NaN and Inf make their block's scale NaN */
    x[10] = NAN;
    x[200] = INFINITY;
    dhsa__qi_quant_act_scalar(x, n, 32, 32, q, xd, xs);
    T_CHECK(isnan(xd[0]) && isnan(xd[6]) && !isnan(xd[1]), "activations: a NaN or Inf block has xd = NaN, others not");
    {
        int8_t qg[512];
        float xg[512], xdg[16], xsg[16];
        for (int j = 0; j < 512; j++) xg[j] = j < 256 ? x[j] : 0.5f;
        dhsa__qi_quant_act_scalar(xg, 512, 32, 256, qg, xdg, xsg);
        int all = 1;
        for (int i = 0; i < 8; i++) all &= isnan(xdg[i]) && isnan(xsg[i]) && !isnan(xdg[8 + i]);
        T_CHECK(all, "activations (sb 256): NaN and Inf make the whole group's xd NaN, the next group not");
    }
    for (int ki = 0; ki < N_KSETS; ki++) {
        const dhsa__qi_kernels *k = kset_or_skip(ki, "activations");
        if (!k) continue;
        k->quant_act(x, n, 32, 32, q2, xd2, xs2);
        T_CHECK(isnan(xd2[0]) && isnan(xd2[6]) && !isnan(xd2[1]) && xd2[1] == xd[1] &&
                    memcmp(q2, q, sizeof q) == 0,
                "activations: %s NaN and Inf as scalar", k->name);
    }
    free(x);
}

/* ----------------------------------------------------------- products --- */

static double g_worst = 0.0;

/* Largest |y - ref| / bound over the outputs (> 1 fails); ref and bound
 * from the true weights and activations in double. */
static double check_vs_double(const qmat *m, const float *x, int64_t n_tok, const float *y) {
    const int64_t n = m->W.n_in;
    double worst = 0.0;
    for (int64_t t = 0; t < n_tok; t++) {
        const float *xt = x + t * n;
        for (int64_t o = 0; o < m->W.n_out; o++) {
            const float *w = m->w + o * n;
            double ref = 0.0, bound = 0.0, mag = 0.0;
            const int sb = dhsa__qi_sb(m->W.type); /* the activations' scale group */
            for (int64_t b = 0; b < n / sb; b++) {
                double amax = 0.0;
                for (int j = 0; j < sb; j++) amax = fmax(amax, fabs(xt[sb * b + j]));
                for (int j = 0; j < sb; j++) {
                    int64_t i = sb * b + j;
                    ref += (double)w[i] * xt[i];
                    bound += fabs(w[i]) * amax / 127.0 * 0.5 * (1 + 1e-6);
                    mag += fabs((double)w[i] * xt[i]);
                }
            }
            bound += 1e-6 * mag + 1e-30;
            double r = fabs(y[t * m->W.n_out + o] - ref) / bound;
            if (!(r <= worst)) worst = r; /* NaN counts as a failure */
        }
    }
    return worst;
}

static int run_route(dhsa_ctx *ctx, const dhsa__qi_kernels *k, const qmat *m, const float *x, int64_t n_tok,
                     float *y) {
    return dhsa__qi_matmul(ctx, k, &m->W, x, m->W.n_in, n_tok, y, m->W.n_out) == DHSA_OK;
}

/* Largest |a - b| / sum_i |w_i x_i| over the outputs. */
static double rel_diff(const qmat *m, const float *x, int64_t n_tok, const float *a, const float *b) {
    const int64_t n = m->W.n_in;
    double worst = 0.0;
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t o = 0; o < m->W.n_out; o++) {
            double mag = 1e-30;
            for (int64_t i = 0; i < n; i++) mag += fabs((double)m->w[o * n + i] * x[t * n + i]);
            int64_t e = t * m->W.n_out + o;
            double d = fabs((double)a[e] - b[e]) / mag;
            if (!(d <= worst)) worst = d;
        }
    return worst;
}

static void test_products(void) {
    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = 2;
    dhsa_ctx *ctx2 = NULL, *ctx1 = NULL;
    T_CHECK(dhsa_ctx_create(&cp, &ctx2) == DHSA_OK, "ctx with 2 threads");
    cp.n_threads = 1;
    T_CHECK(dhsa_ctx_create(&cp, &ctx1) == DHSA_OK, "ctx with 1 thread");
    if (!ctx1 || !ctx2) return;
    /* n_in: one block, a few, a 32-value tail past 64, a second fused chunk
     * (1536 > 1024); n_out: tails of the 4-row fused group and of the 16-
     * and 32-row panels; n_tok: 1 to 9 (fused up to 4, panel tails of 4 and
     * 6 tokens), 13 and 20 */
    struct { int64_t n_in, n_out, n_tok; } shapes[] = {
        {256, 40, 1},  {512, 33, 3},  {768, 64, 9}, {256, 70, 13}, {512, 17, 8}, {1024, 96, 20}, {32, 5, 2},
        {96, 19, 4},   {64, 7, 5},    {288, 9, 1},  {256, 3, 6},   {512, 21, 7}, {1536, 10, 3}, {1536, 18, 2}};
    int ks_checks[N_KSETS] = {0}; /* checks each kernel set made, for the skips of those this CPU lacks */
    for (int ti = 0; ti < N_QTYPES; ti++) {
        const uint32_t type = qtypes[ti];
        const int64_t blk = dhsa__wt_block(type);
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            int64_t n_in = shapes[si].n_in, n_out = shapes[si].n_out, n_tok = shapes[si].n_tok;
            if (n_in % blk) continue;
            qmat m;
            if (qmat_make(&m, type, n_in, n_out, 100 + (uint64_t)(ti * 10) + si) != 0) {
                T_CHECK(0, "%s: fixture", qnames[ti]);
                continue;
            }
            float *x = rand_x(n_in * n_tok, 7 + si);
            size_t ny = (size_t)(n_out * n_tok);
            float *ys = malloc(ny * sizeof(float)), *ys2 = malloc(ny * sizeof(float)), *yv = malloc(ny * sizeof(float)),
                  *yv2 = malloc(ny * sizeof(float));
            int ok = run_route(ctx2, &dhsa__qi_scalar, &m, x, n_tok, ys);
            double r = check_vs_double(&m, x, n_tok, ys);
            if (r > g_worst) g_worst = r;
            T_CHECK(ok && r <= 1.0, "%s %lldx%lld, %lld tokens: scalar route vs double within the bound (%.3f of it)",
                    qnames[ti], (long long)n_out, (long long)n_in, (long long)n_tok, r);
            /* the scalar route's fused and panel forms are both block ordered */
            if (n_tok > 1) {
                int same = 1;
                for (int64_t t = 0; t < n_tok && same; t++) {
                    ok = run_route(ctx1, &dhsa__qi_scalar, &m, x + t * n_in, 1, ys2);
                    same = ok && memcmp(ys2, ys + t * n_out, sizeof(float) * (size_t)n_out) == 0;
                }
                T_CHECK(same, "%s %lld tokens: scalar route, one token at a time = all at once, bitwise", qnames[ti],
                        (long long)n_tok);
            }
            for (int ki = 0; ki < N_KSETS; ki++) {
                int runs;
                const dhsa__qi_kernels *simd = kset(ki, &runs);
                if (!runs) continue;
                const int before = t_checks();
                ok = run_route(ctx2, simd, &m, x, n_tok, yv) && run_route(ctx1, simd, &m, x, n_tok, yv2);
                T_CHECK(ok && memcmp(yv, yv2, ny * sizeof(float)) == 0, "%s %lld tokens: %s, 1 and 2 threads bitwise",
                        qnames[ti], (long long)n_tok, simd->name);
                int panel = n_tok > simd->max_tok_fused, kz, kmin;
                int kpanel = panel && simd->ktile && dhsa__qi_kform(type, &kz, &kmin) && n_in % 256 == 0;
                double d = rel_diff(&m, x, n_tok, yv, ys);
                if (kpanel) /* the super-block form (int8.h, ktile): integer sums, other float steps */
                    T_CHECK(d <= 1e-6, "%s %lldx%lld, %lld tokens: %s K panel within 1e-6 sum|w x| of the scalar (%.2g)",
                            qnames[ti], (long long)n_out, (long long)n_in, (long long)n_tok, simd->name, d);
                else if (panel)
                    T_CHECK(memcmp(yv, ys, ny * sizeof(float)) == 0, "%s %lldx%lld, %lld tokens: %s panel route bitwise the scalar",
                            qnames[ti], (long long)n_out, (long long)n_in, (long long)n_tok, simd->name);
                else
                    T_CHECK(d <= 1e-6, "%s %lldx%lld, %lld tokens: %s fused route within 1e-6 sum|w x| of the scalar (%.2g)",
                            qnames[ti], (long long)n_out, (long long)n_in, (long long)n_tok, simd->name, d);
                r = check_vs_double(&m, x, n_tok, yv);
                if (r > g_worst) g_worst = r;
                T_CHECK(r <= 1.0, "%s: %s vs double within the bound (%.3f of it)", qnames[ti], simd->name, r);
                ks_checks[ki] += t_checks() - before;
            }
            free(x);
            free(ys);
            free(ys2);
            free(yv);
            free(yv2);
            qmat_free(&m);
        }
    }
    int ran = 0;
    for (int ki = 0; ki < N_KSETS; ki++) ran = ks_checks[ki] > ran ? ks_checks[ki] : ran;
    for (int ki = 0; ki < N_KSETS; ki++) {
        int runs;
        kset(ki, &runs);
        if (!runs)
            T_SKIP(ran > 0 ? ran : 1, "no %s on this CPU or build: its integer route is not tested here", kset_names[ki]);
    }
    /* a wrong product fails the comparison */
    {
        qmat m;
        qmat_make(&m, DHSA_GGML_Q4_K, 256, 8, 9);
        float *x = rand_x(256, 3), y[8];
        run_route(ctx1, &dhsa__qi_scalar, &m, x, 1, y);
        const double r0 = check_vs_double(&m, x, 1, y);
        y[3] += 12.0f; /* the bound here is about 5 (one activation scale per 256 values) */
        const double r1 = check_vs_double(&m, x, 1, y);
        T_CHECK(r0 <= 1.0 && r1 > 1.0, "a product 12 off fails the bound (%.2f of it; right: %.2f)", r1, r0);
        /* NaN in the activations gives NaN outputs on every route */
        x[17] = NAN;
        int all_nan = run_route(ctx1, &dhsa__qi_scalar, &m, x, 1, y);
        for (int o = 0; o < 8; o++) all_nan &= isnan(y[o]);
        for (int ki = 0; ki < N_KSETS; ki++) {
            int runs;
            const dhsa__qi_kernels *simd = kset(ki, &runs);
            if (!runs) continue;
            float yb[8 * 9];
            float *x9 = malloc(sizeof(float) * 256 * 9);
            for (int t = 0; t < 9; t++) memcpy(x9 + 256 * t, x, sizeof(float) * 256);
            all_nan &= run_route(ctx1, simd, &m, x9, 1, yb) && run_route(ctx1, simd, &m, x9, 9, yb);
            for (int o = 0; o < 8 * 9; o++) all_nan &= isnan(yb[o]);
            free(x9);
        }
        T_CHECK(all_nan, "a NaN activation makes every output of its token NaN (scalar, fused and panel, every kernel)");
        free(x);
        qmat_free(&m);
    }
    dhsa_ctx_free(ctx1);
    dhsa_ctx_free(ctx2);
}

/* The K types' fused kernels pack each lane's sum of 4 code x activation
 * products to 16 bits (int8_vnni.c): at the largest codes (15, 31, 63),
 * the largest scales and activations of +-127 in runs of one sign the
 * lanes reach 4 * 63 * 127 = 32004; every kernel set against the scalar
 * route there (a saturated lane would be far off). */
static void test_k_extremes(void) {
    static const uint32_t kt[3] = {DHSA_GGML_Q4_K, DHSA_GGML_Q5_K, DHSA_GGML_Q6_K};
    static const char *const kn[3] = {"Q4_K", "Q5_K", "Q6_K"};
    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = 1;
    dhsa_ctx *ctx = NULL;
    if (dhsa_ctx_create(&cp, &ctx) != DHSA_OK) {
        T_CHECK(0, "ctx");
        return;
    }
    const int64_t n_in = 512, n_out = 6, n_tok = 3;
    for (int ti = 0; ti < 3; ti++) {
        qmat m;
        const int64_t rb = dhsa__wt_row_bytes(kt[ti], n_in), bb = dhsa__wt_block_bytes(kt[ti]);
        m.data = malloc((size_t)(rb * n_out));
        m.w = malloc(sizeof(float) * (size_t)(n_in * n_out));
        float *x = malloc(sizeof(float) * (size_t)(n_in * n_tok));
        float *ys = malloc(sizeof(float) * (size_t)(n_out * n_tok)), *yv = malloc(sizeof(float) * (size_t)(n_out * n_tok));
        if (!m.data || !m.w || !x || !ys || !yv) {
            T_CHECK(0, "%s extremes: allocation", kn[ti]);
            return;
        }
        memset(m.data, 0xFF, (size_t)(rb * n_out)); /* every code, scale and min at its largest */
        for (int64_t o = 0; o < n_out; o++)
            for (int64_t b = 0; b < n_in / 256; b++) {
                uint8_t *blk = m.data + o * rb + b * bb;
                const uint8_t one[2] = {0x00, 0x3C}; /* f16 1.0 */
                if (kt[ti] == DHSA_GGML_Q6_K) {
                    memcpy(blk + 208, one, 2);
                    for (int j = 0; j < 16; j++) blk[192 + j] = (uint8_t)(j % 2 ? 0x80 : 0x7F); /* -128, 127 */
                    if (o % 2) memset(blk, 0x00, 128); /* low bits 0: codes 48 */
                } else {
                    memcpy(blk, one, 2);
                    memcpy(blk + 2, one, 2);
                    if (o % 2) memset(blk + bb - 128, 0xF0, 128); /* low nibbles 0 */
                }
            }
        int ok = 1;
        for (int64_t o = 0; o < n_out; o++)
            ok &= dhsa__dequantize_row(kt[ti], m.data + o * rb, m.w + o * n_in, n_in) == DHSA_OK;
        m.W.type = kt[ti];
        m.W.data = m.data;
        m.W.n_in = n_in;
        m.W.n_out = n_out;
        m.W.row_bytes = rb;
        for (int64_t t = 0; t < n_tok; t++)
            for (int64_t i = 0; i < n_in; i++)
                x[t * n_in + i] = t == 0 ? 1.0f : t == 1 ? -1.0f : ((i / 4) % 2 ? 2.0f : -2.0f);
        ok &= run_route(ctx, &dhsa__qi_scalar, &m, x, n_tok, ys);
        char what[32];
        snprintf(what, sizeof what, "%s extremes", kn[ti]);
        for (int ki = 0; ki < N_KSETS; ki++) {
            const dhsa__qi_kernels *k = kset_or_skip(ki, what);
            if (!k) continue;
            int okk = ok && run_route(ctx, k, &m, x, n_tok, yv);
            double d = rel_diff(&m, x, n_tok, yv, ys);
            T_CHECK(okk && d <= 1e-6, "%s at its largest codes and scales, activations +-127: %s fused within 1e-6 of "
                    "the scalar route (%.2g)", kn[ti], k->name, d);
        }
        free(x);
        free(ys);
        free(yv);
        qmat_free(&m);
    }
    dhsa_ctx_free(ctx);
}

/* ------------------------------------------------- kernels, directly --- */

/* Rows of codes at the edge of vpmaddubsw's int16 pairs, against
 * activations of +-127 (every |x| of a block equal): the kernels called
 * directly, each output against the scalar block-ordered product of its
 * row (dhsa__qi_dot_scalar, which the scalar tile is, value for value).
 *   fill 0: random codes in [0, cmax];
 *   fill 1: every code cmax, activations +-127 in pairs of one sign (the
 *           largest pair sums, 2 cmax 127);
 * cmax 255 (wide), 129 (the largest narrow one: pairs 32766), 63 (Q6_K).
 * n = 300 blocks of 32 (600 of 16): two chunks of the fused kernels (256
 * blocks each). Returns 1 when every output matches (panel: bitwise;
 * fused: 1e-6 of sum |terms|); cmax_told is what the kernel is told. */
enum { DK_N = 9600, DK_ROWS = 32 };
static int direct_kernels(const dhsa__qi_kernels *k, int bw, int cmax, int cmax_told, int fill, int n_tok, int nr,
                          uint64_t seed) {
    const int64_t n = DK_N, nb = n / bw;
    rng_t rg = {seed};
    /* the panel 64-byte aligned, as the driver's (the AVX512-VNNI tile loads it aligned) */
    uint8_t *c = malloc((size_t)(DK_ROWS * n)), *w = aligned_alloc(64, (size_t)(DK_ROWS * n) + 64);
    float *a = malloc(sizeof(float) * (size_t)(DK_ROWS * nb)), *b = malloc(sizeof(float) * (size_t)(DK_ROWS * nb));
    float *pa = malloc(sizeof(float) * (size_t)(DK_ROWS * nb)), *pb = malloc(sizeof(float) * (size_t)(DK_ROWS * nb));
    float *xf = malloc(sizeof(float) * (size_t)n);
    int8_t *q = malloc((size_t)(16 * n));
    float *xd = malloc(sizeof(float) * (size_t)(16 * n / 32)), *xs = malloc(sizeof(float) * (size_t)(16 * n / 16));
    int ok = c && w && a && b && pa && pb && xf && q && xd && xs;
    dhsa_qi_act x[16];
    for (int t = 0; t < 16 && ok; t++) {
        for (int64_t i = 0; i < n; i++) {
            double v = rng_normal(&rg);
            if (fill == 1) v = ((i / 2 + t) % 3 ? 1.0 : -1.0) * (1.0 + (double)(i / 32 % 5)); /* |x| equal per block */
            xf[i] = (float)v;
        }
        dhsa__qi_quant_act_scalar(xf, n, bw, 32, q + t * n, xd + t * n / 32, xs + t * n / 16);
        x[t].q = q + t * n;
        x[t].xd = xd + t * n / 32;
        x[t].xs = xs + t * n / 16;
    }
    for (int64_t r = 0; r < DK_ROWS && ok; r++) {
        for (int64_t i = 0; i < n; i++)
            c[r * n + i] = (uint8_t)(fill == 1 ? cmax : (int)(rng_u64(&rg) % (uint64_t)(cmax + 1)));
        for (int64_t j = 0; j < nb; j++) {
            a[r * nb + j] = (float)(rng_normal(&rg) * 1e-3);
            b[r * nb + j] = (float)(rng_normal(&rg) * 1e-3);
        }
    }
    /* the panel: groups of 16 rows in the VNNI layout */
    for (int64_t r = 0; r < DK_ROWS && ok; r++) {
        const int64_t g = r / 16, rr = r % 16;
        for (int64_t qd = 0; qd < n / 4; qd++) memcpy(w + g * n * 16 + qd * 64 + rr * 4, c + r * n + 4 * qd, 4);
        for (int64_t j = 0; j < nb; j++) {
            pa[g * nb * 16 + j * 16 + rr] = a[r * nb + j];
            pb[g * nb * 16 + j * 16 + rr] = b[r * nb + j];
        }
    }
    int same = ok;
    if (ok) {
        /* panel: one tile of mr tokens x 16 ng rows, out starting at 0.5 */
        const int rows = 16 * k->ng, mr = k->mr;
        float out[16 * 32];
        for (int e = 0; e < mr * rows; e++) out[e] = 0.5f;
        k->tile(w, pa, pb, n, bw, cmax_told, x, out);
        for (int t = 0; t < mr; t++)
            for (int r = 0; r < rows; r++) {
                float ref = dhsa__qi_dot_scalar(c + r * n, a + r * nb, b + r * nb, n, bw, &x[t], 0.5f);
                same &= memcmp(&ref, &out[t * rows + r], sizeof ref) == 0;
            }
        /* fused: nr rows (fused_rows readable), n_tok tokens */
        float y[16 * 4];
        k->dot_rows(c, n, a, b, nb, nr, n, bw, cmax_told, x, n_tok, y, nr, 0);
        for (int t = 0; t < n_tok; t++)
            for (int r = 0; r < nr; r++) {
                double ref = dhsa__qi_dot_scalar(c + r * n, a + r * nb, b + r * nb, n, bw, &x[t], 0.0f), mag = 1e-30;
                for (int64_t j = 0; j < nb; j++) {
                    int64_t is = 0;
                    for (int l = 0; l < bw; l++) is += (int64_t)c[r * n + j * bw + l] * x[t].q[j * bw + l];
                    mag += fabs((double)a[r * nb + j] * x[t].xd[j * bw / 32] * (double)is) +
                           fabs((double)b[r * nb + j] * x[t].xs[j]);
                }
                same &= fabs(y[t * nr + r] - ref) <= 1e-6 * mag;
            }
    }
    free(c);
    free(w);
    free(a);
    free(b);
    free(pa);
    free(pb);
    free(xf);
    free(q);
    free(xd);
    free(xs);
    return same;
}

static void test_kernels_direct(void) {
    static const int cmaxes[3] = {255, 129, 63};
    for (int ki = 0; ki < N_KSETS; ki++) {
        int runs;
        const dhsa__qi_kernels *k = kset(ki, &runs);
        if (!runs) {
            T_SKIP(12, "kernels directly: no %s here", kset_names[ki]);
            continue;
        }
        for (int bw = 16; bw <= 32; bw += 16)
            for (int ci = 0; ci < 3; ci++)
                for (int fill = 0; fill < 2; fill++) {
                    int n_tok = 1 + (ci * 2 + fill + bw / 16) % 7, nr = 1 + (ci + fill + bw / 16) % k->fused_rows;
                    int ok = direct_kernels(k, bw, cmaxes[ci], cmaxes[ci], fill, n_tok, nr, 1000 + (uint64_t)(ci * 7 + fill));
                    T_CHECK(ok, "%s directly, bw %d, codes %s %d, %d tokens, %d rows: panel tile bitwise the scalar, "
                            "fused within 1e-6", k->name, bw, fill ? "all" : "up to", cmaxes[ci], n_tok, nr);
                }
    }
    /* told that codes of 255 are narrow, vpmaddubsw saturates: the
     * comparison sees it (only the AVX2 kernels have 16-bit pairs) */
    int runs;
    const dhsa__qi_kernels *k = kset(0, &runs);
    if (!runs) {
        T_SKIP(1, "kernels directly: no avx2 here (the saturation check)");
        return;
    }
    T_CHECK(!direct_kernels(k, 32, 255, 63, 1, 2, 4, 77), "avx2 told a wrong largest code (63 for codes of 255): "
            "its saturated sums fail the comparison");
}

/* The K types' super-block panel (int8.h, ktile) called directly: each
 * kernel set that has one against dhsa__qi_ktile_scalar, bitwise, and
 * that against the double product of the weights d S_j (c - z) - dmin M_j
 * it reads with the activation codes (1e-6 of sum |terms|: one rounding
 * of each super-block's integer sums and the float steps). Readings: Q4_K /
 * Q5_K (bw 32, a min), Q6_K (bw 16, z 32), Q3_K (bw 16, z 4), Q2_K (bw 16, a
 * min); fill 0: random codes, scales, mins; fill 1: the largest codes,
 * scales and mins against activations of +127 (the integer sums at
 * their largest: |I| near 2^27 for Q6_K); fill 2: as 1 with -128 scales
 * (Q6_K's int8 sc) and activations of -127. n = 2560 (10 super-blocks).
 * Each also with an output stride past the rows and a second call adding
 * to the first's outputs (the driver's sub-panels). */
enum { KT_N = 2560 };
static int direct_ktile(const dhsa__qi_kernels *k, int bw, int z, int has_min, int cmax, int smin, int smax, int mmax,
                        int fill, uint64_t seed, double *worst) {
    const int64_t n = KT_N, nb = n / bw, ns = n / 256, rows = 16 * (int64_t)k->ng, ng = k->ng;
    rng_t rg = {seed};
    uint8_t *c = malloc((size_t)(rows * n)), *w = aligned_alloc(64, (size_t)(rows * n) + 64);
    int32_t *S = malloc(sizeof(int32_t) * (size_t)(rows * nb)), *M = malloc(sizeof(int32_t) * (size_t)(rows * nb));
    float *d = malloc(sizeof(float) * (size_t)(rows * ns)), *dm = malloc(sizeof(float) * (size_t)(rows * ns));
    int32_t *pS = malloc(sizeof(int32_t) * (size_t)(rows * nb)), *pM = malloc(sizeof(int32_t) * (size_t)(rows * nb / 2));
    float *pD = malloc(sizeof(float) * (size_t)(rows * ns)), *pDm = malloc(sizeof(float) * (size_t)(rows * ns));
    float *xf = malloc(sizeof(float) * (size_t)n), *xd = malloc(sizeof(float) * (size_t)(16 * n / 32)),
          *xs = malloc(sizeof(float) * (size_t)(16 * n / 16));
    int8_t *q = malloc((size_t)(16 * n));
    int32_t *qz = malloc(sizeof(int32_t) * (size_t)(16 * nb));
    int16_t *qs = malloc(sizeof(int16_t) * (size_t)(16 * nb));
    int ok = c && w && S && M && d && dm && pS && pM && pD && pDm && xf && xd && xs && q && qz && qs;
    dhsa_qi_act x[16];
    for (int t = 0; t < 16 && ok; t++) {
        for (int64_t i = 0; i < n; i++)
            xf[i] = fill == 0 ? (float)rng_normal(&rg) : fill == 1 ? 1.0f : -1.0f;
        dhsa__qi_quant_act_scalar(xf, n, bw, 256, q + t * n, xd + t * n / 32, xs + t * n / 16);
        for (int64_t j = 0; j < nb; j++) {
            int32_t sum = 0;
            for (int l = 0; l < bw; l++) sum += q[t * n + j * bw + l];
            qs[t * nb + j] = (int16_t)sum;
            qz[t * nb + j] = -z * sum;
        }
        x[t] = (dhsa_qi_act){q + t * n, xd + t * n / 32, xs + t * n / 16, qz + t * nb, qs + t * nb};
    }
    for (int64_t r = 0; r < rows && ok; r++) {
        for (int64_t i = 0; i < n; i++)
            c[r * n + i] = (uint8_t)(fill ? cmax : (int)(rng_u64(&rg) % (uint64_t)(cmax + 1)));
        for (int64_t j = 0; j < nb; j++) {
            S[r * nb + j] = fill == 1 ? smax : fill == 2 ? smin : smin + (int)(rng_u64(&rg) % (uint64_t)(smax - smin + 1));
            M[r * nb + j] = has_min ? (fill ? mmax : (int)(rng_u64(&rg) % (uint64_t)(mmax + 1))) : 0;
        }
        for (int64_t s = 0; s < ns; s++) {
            d[r * ns + s] = (float)(1e-3 * (1.0 + 0.1 * rng_normal(&rg)));
            dm[r * ns + s] = has_min ? (float)(1e-3 * (1.0 + 0.1 * rng_normal(&rg))) : 0.0f;
        }
        const int64_t g = r / 16, rr = r % 16;
        for (int64_t qd = 0; qd < n / 4; qd++) memcpy(w + g * n * 16 + qd * 64 + rr * 4, c + r * n + 4 * qd, 4);
        for (int64_t j = 0; j < nb; j++) pS[(g * nb + j) * 16 + rr] = S[r * nb + j];
        for (int64_t j = 0; j < nb / 2; j++)
            pM[(g * nb / 2 + j) * 16 + rr] =
                (int32_t)((uint32_t)(uint16_t)M[r * nb + 2 * j] | (uint32_t)M[r * nb + 2 * j + 1] << 16);
        for (int64_t s = 0; s < ns; s++) {
            pD[(g * ns + s) * 16 + rr] = d[r * ns + s];
            pDm[(g * ns + s) * 16 + rr] = -dm[r * ns + s];
        }
    }
    /* a kernel set that splits the scales into the codes (int8.h: ksplit)
     * reads the lows, then the highs, for Q4_K and Q5_K */
    const int split = ok && k->ksplit && bw == 32 && z == 0 && has_min;
    uint8_t *wk = split ? aligned_alloc(64, (size_t)(2 * rows * n) + 64) : w;
    if (split && wk) {
        memcpy(wk, w, (size_t)(rows * n));
        for (int64_t g = 0; g < ng; g++) k->ksplit(wk + g * n * 16, pS + g * nb * 16, n, wk + rows * n + g * n * 16);
    }
    ok &= wk != NULL;
    int same = ok;
    if (ok) {
        const int mr = k->kmr;
        float out[16 * 64], ref[16 * 64];
        for (int e = 0; e < mr * (int)rows; e++) out[e] = ref[e] = 0.5f; /* overwritten */
        k->ktile(wk, pS, pM, pD, pDm, n, bw, z, has_min, x, out, rows, 0);
        dhsa__qi_ktile_scalar(w, pS, pM, pD, pDm, n, bw, z, has_min, x, mr, (int)ng, ref, rows, 0);
        same = memcmp(out, ref, sizeof(float) * (size_t)(mr * rows)) == 0;
        /* a tile whose last tokens repeat one (the driver's last tile) */
        dhsa_qi_act xr[16];
        float outr[16 * 64], refr[16 * 64];
        for (int t = 0; t < 16; t++) xr[t] = x[t < mr - 3 ? t : mr - 4 > 0 ? mr - 4 : 0];
        k->ktile(wk, pS, pM, pD, pDm, n, bw, z, has_min, xr, outr, rows, 0);
        dhsa__qi_ktile_scalar(w, pS, pM, pD, pDm, n, bw, z, has_min, xr, mr, (int)ng, refr, rows, 0);
        same &= memcmp(outr, refr, sizeof(float) * (size_t)(mr * rows)) == 0;
        /* a stride past the rows, and a second call adding to the first's outputs */
        const int64_t ldo = rows + 3;
        float out2[16 * 67], ref2[16 * 67];
        for (int e = 0; e < 16 * 67; e++) out2[e] = ref2[e] = 0.25f;
        k->ktile(wk, pS, pM, pD, pDm, n, bw, z, has_min, x, out2, ldo, 0);
        k->ktile(wk, pS, pM, pD, pDm, n, bw, z, has_min, x, out2, ldo, 1);
        dhsa__qi_ktile_scalar(w, pS, pM, pD, pDm, n, bw, z, has_min, x, mr, (int)ng, ref2, ldo, 0);
        dhsa__qi_ktile_scalar(w, pS, pM, pD, pDm, n, bw, z, has_min, x, mr, (int)ng, ref2, ldo, 1);
        same &= memcmp(out2, ref2, sizeof out2) == 0;
        for (int t = 0; t < mr; t++)
            for (int64_t r = 0; r < rows; r++) {
                double y = 0.0, mag = 1e-30;
                for (int64_t i = 0; i < n; i++) {
                    const int64_t j = i / bw, s = i / 256;
                    double wv = (double)d[r * ns + s] * S[r * nb + j] * (c[r * n + i] - z) - (double)dm[r * ns + s] * M[r * nb + j];
                    double term = wv * q[t * n + i] * xd[t * n / 32 + i / 32];
                    y += term;
                    mag += fabs(term);
                }
                double e = fabs(ref[t * rows + r] - y) / (1e-6 * mag);
                if (!(e <= *worst)) *worst = e;
            }
    }
    if (wk != w) free(wk);
    free(c), free(w), free(S), free(M), free(d), free(dm), free(pS), free(pM), free(pD), free(pDm);
    free(xf), free(xd), free(xs), free(q), free(qz), free(qs);
    return same;
}

/* the reference as a kernel set (4 tokens x 16 rows), for CPUs without one */
static void kref_tile(const uint8_t *w, const int32_t *S, const int32_t *M2, const float *D, const float *Dm, int64_t n,
                      int bw, int z, int has_min, const dhsa_qi_act *x, float *out, int64_t ldo, int accumulate) {
    dhsa__qi_ktile_scalar(w, S, M2, D, Dm, n, bw, z, has_min, x, 4, 1, out, ldo, accumulate);
}

static void test_ktile_direct(void) {
    static const struct {
        const char *name;
        int bw, z, has_min, cmax, smin, smax, mmax;
    } rd[5] = {{"Q4_K", 32, 0, 1, 15, 0, 63, 63}, {"Q5_K", 32, 0, 1, 31, 0, 63, 63}, {"Q6_K", 16, 32, 0, 63, -128, 127, 0},
               {"Q3_K", 16, 4, 0, 7, -32, 31, 0},  {"Q2_K", 16, 0, 1, 3, 0, 15, 15}};
    double worst = 0.0;
    int any = 0;
    for (int ki = 0; ki < N_KSETS; ki++) {
        int runs;
        const dhsa__qi_kernels *k = kset(ki, &runs);
        if (!runs || !k->ktile) continue;
        any = 1;
        for (int i = 0; i < 5; i++)
            for (int fill = 0; fill < 3; fill++) {
                int ok = direct_ktile(k, rd[i].bw, rd[i].z, rd[i].has_min, rd[i].cmax, rd[i].smin, rd[i].smax, rd[i].mmax,
                                      fill, 500 + (uint64_t)(i * 3 + fill), &worst);
                T_CHECK(ok, "%s K panel directly, %s reading, %s: bitwise dhsa__qi_ktile_scalar", k->name, rd[i].name,
                        fill == 0 ? "random codes" : fill == 1 ? "largest codes, scales, mins, x +127"
                                                               : "largest codes, smallest scales, x -127");
            }
    }
    if (!any) {
        T_SKIP(15, "K panel directly: no kernel set with one on this CPU or build (avx512-vnni)");
        /* the scalar reference is still held to the double product */
        dhsa__qi_kernels kref = dhsa__qi_scalar;
        kref.ng = 1;
        kref.ktile = kref_tile;
        kref.kmr = 4;
        direct_ktile(&kref, 32, 0, 1, 15, 0, 63, 63, 0, 9, &worst);
        direct_ktile(&kref, 16, 32, 0, 63, -128, 127, 0, 2, 10, &worst);
    }
    T_CHECK(worst <= 1.0, "K panel reference vs the double product of the weights it reads: within 1e-6 sum|terms| (%.3f of it)",
            worst);
}

/* Which products take the K panel: on a kernel set with a ktile, every K
 * type past the fused route's tokens (not Q8_0, not decode), so the
 * route's checks above ran it and a plan that dropped it would show. */
static void test_kpanel_taken(void) {
    static const uint32_t kt[5] = {DHSA_GGML_Q4_K, DHSA_GGML_Q5_K, DHSA_GGML_Q6_K, DHSA_GGML_Q3_K, DHSA_GGML_Q2_K};
    for (int ki = 0; ki < N_KSETS; ki++) {
        int runs;
        const dhsa__qi_kernels *k = kset(ki, &runs);
        if (!runs) continue;
        int all = 1, none = 1;
        for (int i = 0; i < 5; i++) {
            all &= dhsa__mm_plan_with(&dhsa__path_int8, k, k->name, kt[i], 1536, 256, 16, 2).kpanel == (k->ktile != NULL);
            none &= !dhsa__mm_plan_with(&dhsa__path_int8, k, k->name, kt[i], 1536, 256, k->max_tok_fused, 2).kpanel;
        }
        none &= !dhsa__mm_plan_with(&dhsa__path_int8, k, k->name, DHSA_GGML_Q8_0, 1536, 256, 16, 2).kpanel;
        T_CHECK(all && none, "%s: the K types' prefill takes the K panel %s; decode and Q8_0 never", k->name,
                k->ktile ? "(it has one)" : "nowhere (it has none)");
    }
}

/* The K panel on the AMX tiles (int8_amxi8.c) against the AVX512-VNNI
 * kernels through the whole route: bitwise equal for Q4_K and Q5_K (the
 * split panel) and Q6_K (the VNNI ktile six tokens at a time), token
 * counts with and without a last partial tile of 16, rows past the last
 * panel, 1 and 2 threads; and ksplit's digits times their scale. */
static void test_amxi8_route(void) {
    int runs;
    const dhsa__qi_kernels *a = kset(3, &runs);
    if (!runs) {
        T_SKIP(2, "no AMX-INT8 here (or not in this build): the K panel on the tiles");
        return;
    }
    static const uint32_t types[3] = {DHSA_GGML_Q4_K, DHSA_GGML_Q5_K, DHSA_GGML_Q6_K};
    static const int64_t toks[4] = {5, 16, 21, 40};
    int same = 1, cases = 0;
    for (int th = 1; th <= 2; th++) {
        dhsa_ctx_params cp = dhsa_ctx_default_params();
        cp.n_threads = th;
        dhsa_ctx *ctx = NULL;
        if (dhsa_ctx_create(&cp, &ctx) != DHSA_OK) {
            same = 0;
            break;
        }
        for (int ti = 0; ti < 3; ti++)
            for (int ni = 0; ni < 2; ni++) {
                const int64_t n_in = ni ? 768 : 512, n_out = 70;
                qmat m;
                if (qmat_make(&m, types[ti], n_in, n_out, 900 + (uint64_t)(ti * 2 + ni))) {
                    same = 0;
                    continue;
                }
                for (int k = 0; k < 4; k++) {
                    const int64_t nt = toks[k];
                    float *x = rand_x(n_in * nt, 910 + (uint64_t)k), *ya = malloc(sizeof(float) * (size_t)(nt * n_out)),
                          *yb = malloc(sizeof(float) * (size_t)(nt * n_out));
                    same &= x && ya && yb && dhsa__qi_matmul(ctx, a, &m.W, x, n_in, nt, ya, n_out) == DHSA_OK &&
                            dhsa__qi_matmul(ctx, &dhsa__qi_vnni, &m.W, x, n_in, nt, yb, n_out) == DHSA_OK &&
                            memcmp(ya, yb, sizeof(float) * (size_t)(nt * n_out)) == 0;
                    cases++;
                    free(x), free(ya), free(yb);
                }
                qmat_free(&m);
            }
        dhsa_ctx_free(ctx);
    }
    T_CHECK(same && cases == 48, "avx512-vnni amx-int8 route bitwise avx512-vnni: Q4_K, Q5_K, Q6_K, n_in 512 / 768, "
            "5 / 16 / 21 / 40 tokens, 70 rows, 1 and 2 threads (%d cases)", cases);
    /* ksplit: lows and highs of every code and scale the types can hold */
    _Alignas(64) uint8_t w[64 * 8], wl[64 * 8], wh[64 * 8];
    int32_t S[16];
    int digits = 1;
    for (int rep = 0; rep < 4; rep++) {
        for (int i = 0; i < 64 * 8; i++) w[i] = (uint8_t)((i * 7 + rep * 13) % 32);
        for (int r = 0; r < 16; r++) S[r] = (r * 5 + rep * 17) % 64;
        memcpy(wl, w, sizeof w);
        a->ksplit(wl, S, 32, wh);
        for (int i = 0; i < 64 * 8; i++) {
            const int r = (i % 64) / 4;
            digits &= wl[i] == w[i] * (S[r] & 7) && wh[i] == w[i] * (S[r] >> 3);
        }
    }
    T_CHECK(digits, "ksplit: codes 0..31 times scales 0..63 in two digits, c (S & 7) and c (S >> 3)");
}

/* Each kernel set's pack16 (the panel's VNNI layout) against the scalar
 * copy, bitwise, with widths past the 64-column transposes' step. */
static void test_pack16(void) {
    static const int64_t widths[4] = {32, 96, 1536, 8960 + 32};
    for (int ki = 0; ki < N_KSETS; ki++) {
        int runs;
        const dhsa__qi_kernels *k = kset(ki, &runs);
        if (!runs || !k->pack16) continue;
        for (int wi = 0; wi < 4; wi++) {
            const int64_t n = widths[wi], ldr = n + 64;
            uint8_t *rc = malloc((size_t)(16 * ldr)), *a = malloc((size_t)(16 * n)), *b = malloc((size_t)(16 * n));
            rng_t rg = {(uint64_t)(40 + wi)};
            for (int64_t i = 0; i < 16 * ldr; i++) rc[i] = (uint8_t)rng_u64(&rg);
            memset(a, 1, (size_t)(16 * n));
            memset(b, 2, (size_t)(16 * n));
            k->pack16(rc, ldr, n, a);
            dhsa__qi_pack16(rc, ldr, n, b);
            T_CHECK(memcmp(a, b, (size_t)(16 * n)) == 0, "%s pack16, 16 rows of %lld codes: bitwise the scalar copy",
                    k->name, (long long)n);
            free(rc), free(a), free(b);
        }
    }
}

/* ------------------------------------------------ several products --- */

/* dhsa__qi_matmul_multi (q, k, v and gate, up of a decode step in one job):
 * each y bitwise the single call's, with 1 and 2 threads and every kernel
 * set; it declines (returns 0) past the fused route, for mixed types or
 * n_in, and where the single products' scratch would not hold it. */
static void test_multi(void) {
    dhsa_ctx_params cp = dhsa_ctx_default_params();
    dhsa_ctx *ctx[2] = {NULL, NULL};
    for (int c = 0; c < 2; c++) {
        cp.n_threads = c + 1;
        T_CHECK(dhsa_ctx_create(&cp, &ctx[c]) == DHSA_OK, "ctx with %d threads", c + 1);
    }
    /* SmolLM-135M's q, k, v (576 -> 576, 192, 192) and a 1536-wide pair
     * (two column chunks), Q8_0 (the direct kernel) and Q4_K (unpacked) */
    struct { uint32_t type; const char *name; int64_t n_in, n_out[3]; int nw; } cases[] = {
        {DHSA_GGML_Q8_0, "Q8_0", 576, {576, 192, 192}, 3}, {DHSA_GGML_Q8_0, "Q8_0", 1536, {300, 260, 0}, 2},
        {DHSA_GGML_Q4_K, "Q4_K", 512, {1024, 256, 256}, 3}, {DHSA_GGML_Q6_K, "Q6_K", 1536, {300, 260, 0}, 2}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        qmat m[3];
        const dhsa_wmat *W[3];
        for (int i = 0; i < cases[ci].nw; i++) {
            if (qmat_make(&m[i], cases[ci].type, cases[ci].n_in, cases[ci].n_out[i], 500 + ci * 3 + (uint64_t)i)) {
                T_CHECK(0, "multi: fixture");
                return;
            }
            W[i] = &m[i].W;
        }
        for (int ki = -1; ki < N_KSETS; ki++) {
            int runs = 1;
            const dhsa__qi_kernels *k = ki < 0 ? &dhsa__qi_scalar : kset(ki, &runs);
            if (!runs) continue;
            for (int64_t n_tok = 1; n_tok <= k->max_tok_fused; n_tok++)
                for (int c = 0; c < 2; c++) {
                    float *x = rand_x(cases[ci].n_in * n_tok, 77 + (uint64_t)n_tok);
                    float *y1[3], *y2[3];
                    for (int i = 0; i < cases[ci].nw; i++) {
                        y1[i] = malloc(sizeof(float) * (size_t)(n_tok * cases[ci].n_out[i]));
                        y2[i] = malloc(sizeof(float) * (size_t)(n_tok * cases[ci].n_out[i]));
                        run_route(ctx[c], k, &m[i], x, n_tok, y1[i]);
                    }
                    dhsa_status st = DHSA_ERR_INTERNAL;
                    int ran = dhsa__qi_matmul_multi(ctx[c], k, W, cases[ci].nw, x, cases[ci].n_in, n_tok, y2, &st);
                    int same = ran && st == DHSA_OK;
                    for (int i = 0; i < cases[ci].nw && same; i++)
                        same = memcmp(y1[i], y2[i], sizeof(float) * (size_t)(n_tok * cases[ci].n_out[i])) == 0;
                    T_CHECK(same, "multi %s n_in %lld, %d products, %lld tokens, %d threads, %s: ran, each bitwise "
                            "the single call", cases[ci].name, (long long)cases[ci].n_in,
                            cases[ci].nw, (long long)n_tok, c + 1, k->name);
                    for (int i = 0; i < cases[ci].nw; i++) {
                        free(y1[i]);
                        free(y2[i]);
                    }
                    free(x);
                }
            /* past the fused route it declines */
            float *x = rand_x(cases[ci].n_in * (k->max_tok_fused + 1), 5), *y[3] = {NULL, NULL, NULL};
            dhsa_status st = DHSA_OK;
            T_CHECK(!dhsa__qi_matmul_multi(ctx[1], k, W, cases[ci].nw, x, cases[ci].n_in, k->max_tok_fused + 1, y, &st),
                    "multi declines %d tokens (panel route), %s", k->max_tok_fused + 1, k->name);
            free(x);
        }
        for (int i = 0; i < cases[ci].nw; i++) qmat_free(&m[i]);
    }
    /* mixed types decline */
    {
        qmat a, b;
        qmat_make(&a, DHSA_GGML_Q8_0, 256, 64, 1);
        qmat_make(&b, DHSA_GGML_Q4_0, 256, 64, 2);
        const dhsa_wmat *W[2] = {&a.W, &b.W};
        float *x = rand_x(256, 3), y0[64], y1[64], *y[2] = {y0, y1};
        dhsa_status st = DHSA_OK;
        T_CHECK(!dhsa__qi_matmul_multi(ctx[1], &dhsa__qi_scalar, W, 2, x, 256, 1, y, &st), "multi declines mixed types");
        free(x);
        qmat_free(&a);
        qmat_free(&b);
    }
    dhsa_ctx_free(ctx[0]);
    dhsa_ctx_free(ctx[1]);
}

/* ---------------------------------------------------------- dispatch --- */

static void test_dispatch(void) {
    const dhsa_isa isa = dhsa_active_isa();
    const char *qk_name = dhsa__matmul_path_name(DHSA_MM_FAST, DHSA_GGML_Q4_K);
    /* (F16 and BF16 weights: tests/test_bf16.c) */
    T_CHECK(strstr(dhsa__matmul_path_name(DHSA_MM_FAST, DHSA_GGML_F32), "f32") != NULL &&
                strstr(dhsa__matmul_path_name(DHSA_MM_EXACT, DHSA_GGML_Q4_K), "f32") != NULL,
            "F32 weights and the exact route name the F32 route");
    const dhsa__qi_kernels *act = dhsa__qi_kernels_active();
    T_CHECK(strcmp(qk_name, act ? dhsa__qi_path_name(act, DHSA_GGML_Q4_K) : qk_name) == 0 && (strstr(qk_name, "int8") != NULL) == (act != NULL),
            "fast route for Q4_K: %s", qk_name);
    /* each cap, at the best ISA: the best kernel set within it */
    dhsa_set_isa(DHSA_ISA_AVX512);
    dhsa__idot cap0 = dhsa__set_idot_cap(DHSA__IDOT_AVX512VNNI);
    const dhsa_isa best = dhsa_active_isa() == DHSA_ISA_AVX512 ? DHSA_ISA_AVX512 : isa;
    dhsa_set_isa(best);
    static const char *const want_name[4] = {NULL, "int8 avx2", "int8 avx-vnni", "int8 avx512-vnni"}; /* Q6_K's */
    for (int cap = DHSA__IDOT_NONE; cap <= DHSA__IDOT_AVX512VNNI; cap++) {
        dhsa__set_idot_cap((dhsa__idot)cap);
        const char *want = NULL;
        for (int l = cap; l >= 1 && !want; l--) {
            int runs;
            kset(l - 1, &runs);
            if (runs && (l < DHSA__IDOT_AVX512VNNI || best == DHSA_ISA_AVX512) && (l > DHSA__IDOT_AVX2 || best >= DHSA_ISA_AVX2))
                want = want_name[l];
        }
        const char *got = dhsa__matmul_path_name(DHSA_MM_FAST, DHSA_GGML_Q6_K);
        T_CHECK(want ? strcmp(got, want) == 0 : strncmp(got, "f32", 3) == 0,
                "cap %s at ISA %s: fast route for Q6_K %s (want %s)", dhsa__idot_name((dhsa__idot)cap),
                dhsa_isa_name(best), got, want ? want : "f32");
    }
    /* the AVX2 ISA: no AVX512-VNNI; the scalar ISA: the exact route */
    dhsa__set_idot_cap(DHSA__IDOT_AVX512VNNI);
    if (dhsa_set_isa(DHSA_ISA_AVX2) == DHSA_OK) {
        int vnni_runs;
        kset(1, &vnni_runs);
        const char *got = dhsa__matmul_path_name(DHSA_MM_FAST, DHSA_GGML_Q8_0);
        T_CHECK(strcmp(got, vnni_runs ? "int8 avx-vnni" : "int8 avx2") == 0, "ISA avx2: fast route for Q8_0 %s", got);
    } else {
        T_SKIP(1, "no AVX2 here: the AVX2 ISA's route");
    }
    dhsa_set_isa(DHSA_ISA_SCALAR);
    T_CHECK(strcmp(dhsa__matmul_path_name(DHSA_MM_FAST, DHSA_GGML_Q8_0), "f32 scalar") == 0,
            "ISA scalar: the fast route is the exact scalar one");
    dhsa_set_isa(isa);
    dhsa__set_idot_cap(cap0);
    T_CHECK(strcmp(dhsa__matmul_path_name(DHSA_MM_FAST, DHSA_GGML_Q4_K), qk_name) == 0, "ISA and cap restored: %s",
            qk_name);
    /* decode of the types AVX512-VNNI does not read from the file takes the
     * exact route (quant.c), said in the route name; prefill stays integer */
    if (act == &dhsa__qi_vnni || (act && act->ksplit)) {
        static const uint32_t slow[] = {DHSA_GGML_Q4_0, DHSA_GGML_Q4_1, DHSA_GGML_Q5_0, DHSA_GGML_Q5_1,
                                        DHSA_GGML_IQ4_NL, DHSA_GGML_IQ4_XS, DHSA_GGML_Q2_K, DHSA_GGML_Q3_K};
        static const uint32_t filed[] = {DHSA_GGML_Q8_0, DHSA_GGML_Q4_K, DHSA_GGML_Q5_K, DHSA_GGML_Q6_K};
        int ok = 1;
        for (size_t i = 0; i < sizeof slow / sizeof slow[0]; i++)
            ok &= dhsa__qi_fused_exact(act, slow[i]) && !dhsa__matmul_fast_covers(slow[i], 1) &&
                  !dhsa__matmul_fast_covers(slow[i], 4) && dhsa__matmul_fast_covers(slow[i], 5) &&
                  strstr(dhsa__matmul_path_name(DHSA_MM_FAST, slow[i]), "decode f32") != NULL;
        for (size_t i = 0; i < sizeof filed / sizeof filed[0]; i++)
            ok &= !dhsa__qi_fused_exact(act, filed[i]) && dhsa__matmul_fast_covers(filed[i], 1) &&
                  strstr(dhsa__matmul_path_name(DHSA_MM_FAST, filed[i]), "decode") == NULL;
        T_CHECK(ok, "avx512-vnni: decode of Q4_0 ... Q3_K on the exact route (named), of Q8_0 and Q4_K-Q6_K from the file");
        /* and the fast route's decode of Q4_0 is the exact route's, bitwise */
        dhsa_ctx_params cp = dhsa_ctx_default_params();
        cp.n_threads = 2;
        dhsa_ctx *ctx = NULL;
        qmat m;
        if (dhsa_ctx_create(&cp, &ctx) == DHSA_OK && qmat_make(&m, DHSA_GGML_Q4_0, 512, 40, 77) == 0) {
            float *x = rand_x(512 * 2, 78), ya[80], yb[80];
            int same = dhsa__matmul_on(ctx, DHSA_MM_FAST, &m.W, x, 512, 2, ya, 40) == DHSA_OK &&
                       dhsa__matmul(ctx, &m.W, x, 512, 2, yb, 40) == DHSA_OK && memcmp(ya, yb, sizeof ya) == 0;
            T_CHECK(same, "Q4_0, 2 tokens: the fast route's result is the exact route's, bitwise");
            free(x);
            qmat_free(&m);
        } else {
            T_CHECK(0, "Q4_0 fixture");
        }
        dhsa_ctx_free(ctx);
    } else {
        T_SKIP(2, "no AVX512-VNNI here: its decode route choice");
    }
}

int main(void) {
    const dhsa__qi_kernels *k = dhsa__qi_kernels_active();
    printf("test_qint: integer kernels of the fast route here: %s\n", k ? k->name : "none (scalar reference only)");
    printf("test_qint: kernel sets tested:");
    for (int ki = 0; ki < N_KSETS; ki++) {
        int runs;
        kset(ki, &runs);
        if (runs) printf(" %s", kset_names[ki]);
    }
    printf("\n");
    test_unpack();
    test_quant_act();
    test_k_extremes();
    test_products();
    test_kernels_direct();
    test_ktile_direct();
    test_pack16();
    test_kpanel_taken();
    test_amxi8_route();
    test_multi();
    test_dispatch();
    printf("test_qint: products vs double: largest error %.3f of the bound\n", g_worst);
    return t_report("test_qint");
}
