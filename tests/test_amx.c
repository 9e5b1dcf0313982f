/* test_amx.c: tests of the AMX route of the weight products
 * (src/matmul/amx.h: prefill of quantized, F16 and BF16 weights on the AMX
 * tiles, BF16 products, F32 sums).
 *
 * Oracles:
 *   - the packing: every BF16 value of 16 rows lands where the tiles' B
 *     layout says (pair k/2 of row r at 32 (k/2) + 2 r + k % 2), by index
 *     arithmetic written here;
 *   - one tile against the double product of the same BF16 values: within
 *     kp 2^-23 sum |a b| (F32 sums of exact products), at 16 and 32 tokens
 *     and 32 .. 2048 columns; a tile with one weight changed is shown to
 *     fail it (the check can fail);
 *   - the route against the double product of the ORIGINAL weights (as the
 *     exact route reads them) and activations, every covered type: within
 *     (2^-8 + 2^-16 + n_in 2^-23) sum |w x| (amx.h); shapes with token
 *     tails (16, 17, 40, 100 tokens: tiles of 16 and 32 and partial ones),
 *     row tails (n_out 200, 37) and ldx > n_in, ldy > n_out with the
 *     padding untouched; n_in 8192 (32-row units);
 *   - 1 and 2 threads bitwise equal; dhsa__matmul_on runs the route
 *     bitwise;
 *   - a NaN activation makes its token's outputs NaN and no other's;
 *   - the choice: F32 never, below 16 tokens never, off with the cap;
 *     dhsa__matmul_prefill_name says "bf16 amx" exactly when it runs;
 *   - workspace: what dhsa__matmul_workspace_on says is what the ctx
 *     peaks at, and a budget a byte short fails before any work.
 * Everything but the choice is skipped (counted) where the AMX route does
 * not run (no AMX, the OS or the build without it, DHSA_FORCE_ISA).
 *
 * Run: make build/tests/test_amx && build/tests/test_amx
 */
#include "core/internal.h"
#include "dhsa.h"
#include "matmul/amx.h"
#include "matmul/matmul.h"
#include "rng.h"
#include "t.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double bf(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static dhsa_ctx *make_ctx(int threads) {
    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = threads;
    dhsa_ctx *c = NULL;
    dhsa_ctx_create(&cp, &c);
    return c;
}

static const dhsa__amx_kernels *kernels_or_skip(int n, const char *what) {
    const dhsa__amx_kernels *k = dhsa__amx_kernels_active();
    if (!k) T_SKIP(n, "%s: the AMX route does not run here (CPU, OS, build or DHSA_FORCE_ISA)", what);
    return k;
}

/* random normal BF16 values, a few large ones */
static uint16_t rand_bf(rng_t *r) {
    float v = (float)rng_normal(r);
    if (rng_u64(r) % 37 == 0) v *= 30.0f;
    return dhsa_f32_to_bf16(v);
}

static void test_pack(void) {
    const dhsa__amx_kernels *k = kernels_or_skip(2, "packing");
    if (!k) return;
    for (int64_t kp = 32; kp <= 256; kp *= 8) {
        const int64_t ldr = kp + 32;
        uint16_t *rows = malloc(sizeof(uint16_t) * (size_t)(16 * ldr)), *dst = malloc(sizeof(uint16_t) * (size_t)(16 * kp));
        for (int64_t i = 0; i < 16 * ldr; i++) rows[i] = (uint16_t)(i * 2654435761u >> 7);
        k->pack16(rows, ldr, kp, dst);
        int bad = 0;
        for (int r = 0; r < 16; r++)
            for (int64_t c = 0; c < kp; c++) bad += dst[32 * (c / 2) + 2 * r + c % 2] != rows[r * ldr + c];
        T_CHECK(bad == 0, "pack16, %lld columns: %d values out of place", (long long)kp, bad);
        free(rows);
        free(dst);
    }
}

static void test_tile(void) {
    const dhsa__amx_kernels *k = kernels_or_skip(9, "one tile");
    if (!k) return;
    rng_t r = {7};
    for (int64_t kp = 32; kp <= 2048; kp *= 4) {
        for (int nt = 16; nt <= 32; nt += 16) {
            uint16_t *w = malloc(sizeof(uint16_t) * (size_t)(32 * kp)), *pw = malloc(sizeof(uint16_t) * (size_t)(32 * kp));
            uint16_t *x = malloc(sizeof(uint16_t) * (size_t)(32 * kp));
            float out[32 * 40];
            for (int64_t i = 0; i < 32 * kp; i++) {
                w[i] = rand_bf(&r);
                x[i] = rand_bf(&r);
            }
            k->pack16(w, kp, kp, pw);
            k->pack16(w + 16 * kp, kp, kp, pw + 16 * kp);
            for (int i = 0; i < 32 * 40; i++) out[i] = -7.0f;
            k->tile(pw, kp, x, kp, nt, out, 40);
            double worst = 0;
            int pad = 0;
            for (int t = 0; t < 32; t++)
                for (int o = 0; o < 40; o++) {
                    if (o >= 32 || t >= nt) {
                        pad += out[t * 40 + o] != -7.0f;
                        continue;
                    }
                    double ref = 0, a = 0;
                    for (int64_t c = 0; c < kp; c++) {
                        const double p = bf(w[o * kp + c]) * bf(x[t * kp + c]);
                        ref += p;
                        a += fabs(p);
                    }
                    const double e = fabs(out[t * 40 + o] - ref) / ((double)kp * 0x1p-23 * a + 1e-30);
                    if (!(e <= worst)) worst = e;
                }
            T_CHECK(worst <= 1.0 && pad == 0, "tile, %d tokens, %lld columns: worst error %.3g of kp 2^-23 sum |a b|, "
                    "%d values outside the tile written", nt, (long long)kp, worst, pad);
            if (kp == 512 && nt == 32) { /* a wrong weight fails the same check */
                pw[5 * 32 + 2 * 3] = dhsa_f32_to_bf16(bf(pw[5 * 32 + 2 * 3]) < 0 ? 8.0f : -8.0f);
                k->tile(pw, kp, x, kp, nt, out, 40);
                double ref = 0, a = 0;
                for (int64_t c = 0; c < kp; c++) {
                    ref += bf(w[3 * kp + c]) * bf(x[c]);
                    a += fabs(bf(w[3 * kp + c]) * bf(x[c]));
                }
                T_CHECK(fabs(out[3] - ref) > (double)kp * 0x1p-23 * a,
                        "tile: a changed weight is caught (error %.3g of the bound)",
                        fabs(out[3] - ref) / ((double)kp * 0x1p-23 * a));
            }
            free(w);
            free(pw);
            free(x);
        }
    }
}

static const uint32_t types[] = {DHSA_GGML_Q8_0, DHSA_GGML_Q4_0, DHSA_GGML_Q4_1, DHSA_GGML_Q5_0, DHSA_GGML_Q5_1,
                                 DHSA_GGML_IQ4_NL, DHSA_GGML_Q2_K, DHSA_GGML_Q3_K, DHSA_GGML_Q4_K, DHSA_GGML_Q5_K,
                                 DHSA_GGML_Q6_K, DHSA_GGML_IQ4_XS, DHSA_GGML_F16, DHSA_GGML_BF16};
#define N_TYPES ((int)(sizeof types / sizeof types[0]))

typedef struct {
    dhsa_wmat W;
    uint8_t *data;
    float *w; /* [n_out][n_in] as the exact route reads them */
} mat;

static void mat_make(mat *m, uint32_t type, int64_t n_in, int64_t n_out, uint64_t seed) {
    rng_t r = {seed};
    const int64_t rb = dhsa__wt_row_bytes(type, n_in);
    m->data = malloc((size_t)(rb * n_out));
    m->w = malloc(sizeof(float) * (size_t)(n_in * n_out));
    float *src = malloc(sizeof(float) * (size_t)n_in);
    for (int64_t o = 0; o < n_out; o++) {
        for (int64_t i = 0; i < n_in; i++) {
            src[i] = (float)(rng_normal(&r) * 0.05);
            if (i % 61 == 0) src[i] *= 20.0f;
        }
        dhsa__quantize_row(type, src, m->data + o * rb, n_in);
        dhsa__dequantize_row(type, m->data + o * rb, m->w + o * n_in, n_in);
    }
    free(src);
    m->W.type = type;
    m->W.data = m->data;
    m->W.n_in = n_in;
    m->W.n_out = n_out;
    m->W.row_bytes = rb;
}

static void mat_free(mat *m) {
    free(m->data);
    free(m->w);
}

static float *make_x(int64_t n_tok, int64_t ldx, uint64_t seed) {
    rng_t r = {seed};
    float *x = malloc(sizeof(float) * (size_t)(n_tok * ldx));
    for (int64_t i = 0; i < n_tok * ldx; i++) x[i] = (float)rng_normal(&r);
    return x;
}

/* worst |y - ref| / ((2^-8 + 2^-16 + n 2^-23) sum |w x|) over the product;
 * padding columns of y (o >= n_out) must still hold `fill` */
static double route_error(const mat *m, const float *x, int64_t ldx, int64_t n_tok, const float *y, int64_t ldy,
                          float fill, int *pad_bad) {
    const int64_t n = m->W.n_in;
    const double rel = 0x1p-8 + 0x1p-16 + (double)n * 0x1p-23;
    double worst = 0;
    for (int64_t t = 0; t < n_tok; t++) {
        for (int64_t o = 0; o < ldy; o++) {
            if (o >= m->W.n_out) {
                *pad_bad += y[t * ldy + o] != fill;
                continue;
            }
            double ref = 0, a = 0;
            for (int64_t i = 0; i < n; i++) {
                const double p = (double)m->w[o * n + i] * x[t * ldx + i];
                ref += p;
                a += fabs(p);
            }
            const double e = fabs(y[t * ldy + o] - ref) / (rel * a + 1e-30);
            if (!(e <= worst)) worst = e;
        }
    }
    return worst;
}

static void test_route(void) {
    const dhsa__amx_kernels *k = kernels_or_skip(4 * N_TYPES + 2, "the route");
    if (!k) return;
    dhsa_ctx *c1 = make_ctx(1), *c2 = make_ctx(2);
    const int64_t toks[4] = {16, 17, 40, 100};
    double worst_all = 0;
    for (int ti = 0; ti < N_TYPES; ti++) {
        const uint32_t type = types[ti];
        const int64_t n_in = 512, n_out = ti % 2 ? 200 : 37, ldx = n_in + 8, ldy = n_out + 3;
        mat m;
        mat_make(&m, type, n_in, n_out, 100 + (uint64_t)ti);
        for (int q = 0; q < 4; q++) {
            const int64_t nt = toks[q];
            float *x = make_x(nt, ldx, 200 + (uint64_t)(ti * 4 + q));
            float *y1 = malloc(sizeof(float) * (size_t)(nt * ldy)), *y2 = malloc(sizeof(float) * (size_t)(nt * ldy));
            for (int64_t i = 0; i < nt * ldy; i++) y1[i] = y2[i] = 3.5f;
            dhsa_status st = dhsa__amx_matmul(c1, k, &m.W, x, ldx, nt, y1, ldy);
            dhsa_status st2 = dhsa__matmul_on(c2, DHSA_MM_FAST, &m.W, x, ldx, nt, y2, ldy);
            int pad = 0;
            const double e = st ? INFINITY : route_error(&m, x, ldx, nt, y1, ldy, 3.5f, &pad);
            if (e > worst_all) worst_all = e;
            T_CHECK(st == DHSA_OK && st2 == DHSA_OK && e <= 1.0 && pad == 0 && memcmp(y1, y2, sizeof(float) * (size_t)(nt * ldy)) == 0,
                    "%s, %lld tokens, n_out %lld: worst error %.3g of the bound, %d padding values written, 1 thread "
                    "direct vs 2 threads through dhsa__matmul_on %s", dhsa_ggml_type_name(type), (long long)nt,
                    (long long)n_out, e, pad, memcmp(y1, y2, sizeof(float) * (size_t)(nt * ldy)) ? "differ" : "bitwise equal");
            free(x);
            free(y1);
            free(y2);
        }
        mat_free(&m);
    }
    /* long rows: 32-row units */
    {
        mat m;
        mat_make(&m, DHSA_GGML_Q4_K, 8192, 70, 5);
        float *x = make_x(33, 8192, 6), *y = malloc(sizeof(float) * 33 * 70);
        dhsa_status st = dhsa__matmul_on(c2, DHSA_MM_FAST, &m.W, x, 8192, 33, y, 70);
        int pad = 0;
        const double e = st ? INFINITY : route_error(&m, x, 8192, 33, y, 70, 0, &pad);
        T_CHECK(st == DHSA_OK && e <= 1.0, "Q4_K, n_in 8192, 33 tokens: worst error %.3g of the bound", e);
        free(x);
        free(y);
        mat_free(&m);
    }
    /* NaN: its token only */
    {
        mat m;
        mat_make(&m, DHSA_GGML_Q8_0, 256, 40, 8);
        float *x = make_x(20, 256, 9), *y = malloc(sizeof(float) * 20 * 40);
        x[7 * 256 + 100] = NAN;
        dhsa_status st = dhsa__amx_matmul(c2, k, &m.W, x, 256, 20, y, 40);
        int nan_here = 0, nan_else = 0;
        for (int64_t t = 0; t < 20; t++)
            for (int64_t o = 0; o < 40; o++) {
                if (t == 7) nan_here += isnan(y[t * 40 + o]) != 0;
                else nan_else += !isfinite(y[t * 40 + o]);
            }
        T_CHECK(st == DHSA_OK && nan_here == 40 && nan_else == 0,
                "a NaN activation: %d of 40 outputs of its token NaN, %d others non-finite", nan_here, nan_else);
        free(x);
        free(y);
        mat_free(&m);
    }
    printf("test_amx: route vs double, worst error %.3g of the bound\n", worst_all);
    dhsa_ctx_free(c1);
    dhsa_ctx_free(c2);
}

static void test_choice(void) {
    const int on = dhsa__amx_kernels_active() != NULL;
    T_CHECK(!dhsa__amx_takes(DHSA_GGML_F32, 64) && !dhsa__amx_takes(DHSA_GGML_Q4_K, DHSA__AMX_MIN_TOK - 1) &&
                dhsa__amx_takes(DHSA_GGML_Q4_K, DHSA__AMX_MIN_TOK) == on && dhsa__amx_takes(DHSA_GGML_F16, 512) == on,
            "the route takes quantized/F16 calls of >= %d tokens exactly where it runs (%s here), never F32",
            DHSA__AMX_MIN_TOK, on ? "it runs" : "it does not run");
    const char *pn = dhsa__matmul_prefill_name(DHSA_MM_FAST, DHSA_GGML_Q6_K);
    T_CHECK((pn != NULL) == on && (!pn || strcmp(pn, "bf16 amx") == 0) &&
                dhsa__matmul_prefill_name(DHSA_MM_EXACT, DHSA_GGML_Q6_K) == NULL &&
                dhsa__matmul_prefill_name(DHSA_MM_FAST, DHSA_GGML_F32) == NULL,
            "the prefill route's name: %s", pn ? pn : "(none)");
    const int before = dhsa__set_amx_cap(0);
    T_CHECK(!dhsa__amx_takes(DHSA_GGML_Q4_K, 512) && dhsa__amx_kernels_active() == NULL &&
                dhsa__matmul_prefill_name(DHSA_MM_FAST, DHSA_GGML_Q4_K) == NULL,
            "the cap turns the route off");
    dhsa__set_amx_cap(before);
    const dhsa_isa isa = dhsa_active_isa();
    if (isa == DHSA_ISA_AVX512 && dhsa_set_isa(DHSA_ISA_AVX2) == DHSA_OK) {
        T_CHECK(!dhsa__amx_takes(DHSA_GGML_Q4_K, 512), "the AVX2 ISA turns the route off");
        dhsa_set_isa(isa);
    } else {
        T_SKIP(1, "the AVX2 ISA and the route: not the AVX-512 ISA here");
    }
}

static void test_workspace(void) {
    if (!kernels_or_skip(4, "workspace")) return;
    for (int64_t nt = 16; nt <= 300; nt += 284) {
        dhsa_ctx *ctx = make_ctx(2);
        mat m;
        mat_make(&m, DHSA_GGML_Q4_K, 1024, 300, 13);
        float *x = make_x(nt, 1024, 14), *y = malloc(sizeof(float) * (size_t)(nt * 300));
        const size_t ws = dhsa__matmul_workspace_on(DHSA_MM_FAST, DHSA_GGML_Q4_K, 1024, 300, nt, dhsa_ctx_n_threads(ctx));
        dhsa_status st = dhsa__matmul_on(ctx, DHSA_MM_FAST, &m.W, x, 1024, nt, y, 300);
        dhsa_mem_stats ms = dhsa_ctx_mem_stats(ctx);
        T_CHECK(st == DHSA_OK && ws > 0 && ms.peak == ws, "n_tok %lld: workspace says %zu bytes, the ctx peaked at %zu",
                (long long)nt, ws, ms.peak);
        dhsa_ctx_trim(ctx);
        dhsa_ctx_set_budget(ctx, ws - 1);
        st = dhsa__matmul_on(ctx, DHSA_MM_FAST, &m.W, x, 1024, nt, y, 300);
        T_CHECK(st == DHSA_ERR_MEMORY_BUDGET && dhsa_last_error()[0], "a budget below the workspace: %s",
                dhsa_status_str(st));
        free(x);
        free(y);
        mat_free(&m);
        dhsa_ctx_free(ctx);
    }
}

int main(void) {
    /* off by default (cpu.c: DHSA_AMX=1 opts in); on here wherever it can run */
    const char *on = getenv("DHSA_AMX"), *isa = getenv("DHSA_FORCE_ISA");
    T_CHECK((on && strcmp(on, "1") == 0) || dhsa__amx_kernels_active() == NULL,
            "the AMX route runs without DHSA_AMX=1");
    if (!(isa && strcmp(isa, "avx512-vnni") == 0)) dhsa__set_amx_cap(1);
    test_pack();
    test_tile();
    test_route();
    test_choice();
    test_workspace();
    return t_report("test_amx");
}
