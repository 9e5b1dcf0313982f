/* test_kv_q8.c: the Q8_0 KV cache (include/dhsa.h, DHSA_Q8_0; issue 11).
 *
 *   - Q8_0 bytes: the library's quantizer (dhsa_q8_0_quantize_row) gives
 *     the bytes of the GGUF definition, computed here (d = max|x| / 127
 *     rounded to F16, q = round(x / d)), and the values this test decodes
 *     from them by the definition (d * q, the F16 scale decoded by its IEEE
 *     definition) are what dhsa_q8_0_dequantize_row returns.
 *   - Attention over a Q8_0 K/V view equals attention over an F32 view of
 *     the values it stands for, BITWISE: dequantizing is exact in F32 (an
 *     11-bit scale times a 7-bit code), and the kernels run the same F32
 *     arithmetic on the widened rows (block buffer, or in registers for
 *     narrow tiles on AVX-512). Dense and sparse (layout), causal, GQA
 *     ratios 1/2/4, Lk = 300 and 130 (not multiples of the 64-key block),
 *     decode (Lq = 1 and 2), a chunked prefill and a full prefill, bhld and blhd
 *     views, d = 64 and dv = 32; TILED and REFERENCE; every ISA. The TILED
 *     output is also held to the REFERENCE (double) over the same view
 *     with test_attn's F32 tolerances (atol 3e-5, rtol 2e-5).
 *   - The exact workspace: a budget one byte short is refused, the exact
 *     one runs.
 *   - Refusals, each with a sentence and nothing written: d % 32 != 0, a
 *     non-unit dim stride, a row stride that is not whole blocks, Q8_0 as q
 *     or as o.
 *   - The comparison can fail: one code changed by one step in the F32
 *     copy makes the outputs differ.
 *   - Sessions on the shipped default model (models/dhsa-retrieval-8m.gguf)
 *     with kv_type Q8_0: the plan counts 34 bytes per 32 values; the
 *     logits after the shipped test vectors' 221- and 1006-token prompts
 *     stay close to the F32 cache's (max |diff| <= 0.15; measured 0.044 and
 *     0.038 with logits up to 15, printed with the F16 cache's for scale);
 *     greedy ids agree with the F32 cache's on at least the first 24 of 32
 *     tokens (measured: all 32); the passkey is still answered, dense and
 *     with DHSA routing; with DHSA routing the session's index routes every
 *     call (prefill and decode) exactly as a mirror index fed the keys as
 *     the Q8_0 cache holds them (and a mirror fed Q8_0-rounded keys of an
 *     F32 cache does not: the check can fail); the plan counts 34 bytes per
 *     32 values; context parallel refuses Q8_0 with a sentence;
 *     `dhsa run --kv q8_0` runs and `--kv q4_0` is refused (DHSA_CLI).
 *
 * Run: make build/tests/test_kv_q8 && build/tests/test_kv_q8
 * Ends with "test_kv_q8: P passed, F failed, S skipped".
 */
#include "cli_run.h"
#include "dhsa.h"
#include "llm_ref.h"
#include "t.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static dhsa_ctx *g_ctx;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ------------------------------------------------------------------------ */
/* Deterministic inputs (splitmix64, Box-Muller) */

#include "rng.h"

/* ------------------------------------------------------------------------ */
/* Q8_0 by its definition (GGUF block_q8_0: F16 d, then int8 qs[32]) */

static double f16_decode(uint16_t h) {
    int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp((double)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp((double)(m + 1024), e - 25);
    return sign ? -v : v;
}

static void q8_encode(const float *x, unsigned char *out, int64_t n) {
    for (int64_t b = 0; b < n / 32; b++, x += 32, out += 34) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
        uint16_t h = dhsa_f32_to_f16(amax / 127.0f);
        memcpy(out, &h, 2);
        float d = (float)f16_decode(h);
        for (int j = 0; j < 32; j++) {
            long q = d != 0.0f ? lrintf(x[j] / d) : 0;
            out[2 + j] = (unsigned char)(int8_t)(q < -127 ? -127 : q > 127 ? 127 : q);
        }
    }
}

static void q8_decode(const unsigned char *in, float *x, int64_t n) {
    for (int64_t b = 0; b < n / 32; b++, in += 34, x += 32) {
        uint16_t h;
        memcpy(&h, in, 2);
        double d = f16_decode(h);
        for (int j = 0; j < 32; j++) x[j] = (float)(d * (double)(int8_t)in[2 + j]); /* exact */
    }
}

static void test_codec(void) {
    const int64_t n = 32 * 64;
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float)), *z = malloc(n * sizeof(float));
    unsigned char *a = malloc(n / 32 * 34), *b = malloc(n / 32 * 34);
    rng_t r = {7};
    for (int64_t i = 0; i < n; i++) x[i] = (float)(rng_normal(&r) * (i % 97 == 0 ? 40.0 : 1.0));
    for (int j = 0; j < 32; j++) x[64 + j] = 0.0f; /* an all-zero block: d = 0 */
    x[200] = 1e-6f;                                 /* a tiny scale (F16 subnormal) */
    q8_encode(x, a, n);
    T_CHECK(dhsa_q8_0_quantize_row(x, b, n) == DHSA_OK && memcmp(a, b, (size_t)(n / 32 * 34)) == 0,
            "dhsa_q8_0_quantize_row gives the GGUF Q8_0 bytes of the definition");
    q8_decode(a, y, n);
    T_CHECK(dhsa_q8_0_dequantize_row(a, z, n) == DHSA_OK && memcmp(y, z, (size_t)n * sizeof(float)) == 0,
            "dhsa_q8_0_dequantize_row gives d * q exactly");
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, a + i / 32 * 34, 2);
        double e = fabs((double)y[i] - (double)x[i]) / (f16_decode(h) > 0 ? f16_decode(h) : 1.0);
        worst = e > worst ? e : worst;
    }
    /* round to nearest: half a step of d, plus the F16 rounding of d (up to
     * 127 * 2^-11 steps at the block's extreme) */
    T_CHECK(worst <= 0.5 + 127.0 * 0x1p-11 + 1e-6, "Q8_0 error %.4f steps of d (<= 0.562)", worst);
    float bad[32] = {0};
    bad[5] = NAN;
    T_CHECK(dhsa_q8_0_quantize_row(bad, b, 32) == DHSA_ERR_NONFINITE, "quantizing NaN is refused");
    T_CHECK(dhsa_q8_0_quantize_row(x, b, 48) != DHSA_OK, "a row of 48 values is refused (not whole blocks)");
    T_CHECK(dhsa_type_row_bytes(DHSA_Q8_0, 64) == 68 && dhsa_type_row_bytes(DHSA_Q8_0, 40) == 0 &&
                dhsa_type_row_bytes(DHSA_F16, 40) == 80 && strcmp(dhsa_type_name(DHSA_Q8_0), "q8_0") == 0,
            "row bytes and type name of Q8_0");
    free(x); free(y); free(z); free(a); free(b);
}

/* ------------------------------------------------------------------------ */
/* Attention over Q8_0 views vs F32 views of their values */

/* A K or V buffer [B, H, L, D] in bhld or blhd order: rows of D values. */
typedef struct {
    int64_t rows, D;
    unsigned char *q8; /* rows x D/32 blocks */
    float *f32;        /* the values q8 stands for */
} kvbuf;

static void kv_make(kvbuf *kb, int64_t rows, int64_t D, rng_t *r) {
    kb->rows = rows;
    kb->D = D;
    float *x = malloc((size_t)(rows * D) * sizeof(float));
    for (int64_t i = 0; i < rows * D; i++) x[i] = (float)(rng_normal(r) * (rng_unif(r) < 0.02 ? 8.0 : 1.0));
    kb->q8 = malloc((size_t)(rows * D / 32 * 34));
    kb->f32 = malloc((size_t)(rows * D) * sizeof(float));
    q8_encode(x, kb->q8, rows * D);
    q8_decode(kb->q8, kb->f32, rows * D);
    free(x);
}
static void kv_free(kvbuf *kb) { free(kb->q8); free(kb->f32); }

static dhsa_tensor view(void *data, dhsa_type t, int blhd, int64_t B, int64_t H, int64_t L, int64_t D) {
    return blhd ? dhsa_tensor_blhd(data, t, B, L, H, D) : dhsa_tensor_bhld(data, t, B, H, L, D);
}

/* A sparse layout: per block sinks [0, 16), one 40-key chunk that moves
 * with (b, g, qb), and the 48 keys before the block's last row. */
static dhsa_layout *make_layout(int64_t B, int64_t Hkv, int64_t Lq, int64_t Lk, int64_t q_pos0) {
    dhsa_layout *lay = NULL;
    if (dhsa_layout_create(g_ctx, B, Hkv, Lq, Lk, 64, 3, &lay)) return NULL;
    for (int64_t b = 0; b < B; b++)
        for (int64_t g = 0; g < Hkv; g++)
            for (int64_t qb = 0; qb * 64 < Lq; qb++) {
                int64_t last = q_pos0 + (qb * 64 + 63 < Lq ? qb * 64 + 63 : Lq - 1);
                int64_t c0 = (37 * (b + 1) + 53 * g + 71 * qb) % (Lk > 40 ? Lk - 40 : 1);
                int64_t hi = last + 1 < Lk ? last + 1 : Lk, lo = hi - 48 > 0 ? hi - 48 : 0;
                int64_t rg[6] = {0, 16 < Lk ? 16 : Lk, c0, c0 + 40 < Lk ? c0 + 40 : Lk, lo, hi};
                dhsa_layout_set(lay, b, g, qb, rg, 3);
            }
    return lay;
}

typedef struct {
    int64_t B, Hq, Hkv, Lq, Lk, d, dv, q_pos0;
    int sparse, blhd;
} kcase;

static void describe(const kcase *c, char *buf, size_t n) {
    snprintf(buf, n, "B=%lld Hq=%lld Hkv=%lld Lq=%lld Lk=%lld d=%lld dv=%lld q_pos0=%lld %s %s %s",
             (long long)c->B, (long long)c->Hq, (long long)c->Hkv, (long long)c->Lq, (long long)c->Lk,
             (long long)c->d, (long long)c->dv, (long long)c->q_pos0, c->sparse ? "sparse" : "dense",
             c->blhd ? "blhd" : "bhld", dhsa_isa_name(dhsa_active_isa()));
}

/* worst |a - b| / (atol + rtol |b|) over n values */
static double worst_ratio(const float *a, const float *b, int64_t n, double atol, double rtol) {
    double w = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]) / (atol + rtol * fabs((double)b[i]));
        if (!(e <= w)) w = e; /* NaN wins */
    }
    return w;
}

/* Runs the case on Q8_0 and on F32 views, TILED and REFERENCE: 3 checks. */
static void run_case(const kcase *c, rng_t *r) {
    char what[256];
    describe(c, what, sizeof what);
    const int64_t B = c->B, Hq = c->Hq, Hkv = c->Hkv, Lq = c->Lq, Lk = c->Lk;
    float *q = malloc((size_t)(B * Hq * Lq * c->d) * sizeof(float));
    for (int64_t i = 0; i < B * Hq * Lq * c->d; i++) q[i] = (float)rng_normal(r);
    kvbuf K, V;
    kv_make(&K, B * Hkv * Lk, c->d, r);
    kv_make(&V, B * Hkv * Lk, c->dv, r);
    const int64_t no = B * Hq * Lq * c->dv, nl = B * Hq * Lq;
    float *o[4], *lse[4]; /* tiled q8, tiled f32, reference q8, reference f32 */
    for (int x = 0; x < 4; x++) {
        o[x] = malloc((size_t)no * sizeof(float));
        lse[x] = malloc((size_t)nl * sizeof(float));
    }
    dhsa_layout *lay = c->sparse ? make_layout(B, Hkv, Lq, Lk, c->q_pos0) : NULL;
    int ok = !c->sparse || lay;
    for (int x = 0; x < 4 && ok; x++) {
        const int q8 = x % 2 == 0;
        dhsa_attn_desc a = dhsa_attn_default_desc();
        a.q = view(q, DHSA_F32, c->blhd, B, Hq, Lq, c->d);
        a.k = view(q8 ? (void *)K.q8 : (void *)K.f32, q8 ? DHSA_Q8_0 : DHSA_F32, c->blhd, B, Hkv, Lk, c->d);
        a.v = view(q8 ? (void *)V.q8 : (void *)V.f32, q8 ? DHSA_Q8_0 : DHSA_F32, c->blhd, B, Hkv, Lk, c->dv);
        a.o = dhsa_tensor_bhld(o[x], DHSA_F32, B, Hq, Lq, c->dv);
        a.lse = dhsa_tensor_bhld(lse[x], DHSA_F32, B, Hq, Lq, 1);
        a.causal = 1;
        a.q_pos0 = c->q_pos0;
        a.layout = lay;
        a.backend = x < 2 ? DHSA_BACKEND_TILED : DHSA_BACKEND_REFERENCE;
        if (dhsa_attention(g_ctx, &a) != DHSA_OK) {
            fprintf(stderr, "%s: %s\n", what, dhsa_last_error());
            ok = 0;
        }
    }
    T_CHECK(ok && memcmp(o[0], o[1], (size_t)no * sizeof(float)) == 0 &&
                memcmp(lse[0], lse[1], (size_t)nl * sizeof(float)) == 0,
            "tiled over Q8_0 = tiled over F32 of its values, bitwise (%s)", what);
    T_CHECK(ok && memcmp(o[2], o[3], (size_t)no * sizeof(float)) == 0 &&
                memcmp(lse[2], lse[3], (size_t)nl * sizeof(float)) == 0,
            "reference over Q8_0 = reference over F32 of its values, bitwise (%s)", what);
    double wo = ok ? worst_ratio(o[0], o[2], no, 3e-5, 2e-5) : INFINITY;
    double wl = ok ? worst_ratio(lse[0], lse[2], nl, 3e-5, 1e-5) : INFINITY;
    T_CHECK(wo <= 1.0 && wl <= 1.0, "tiled over Q8_0 within test_attn's F32 tolerance of the reference "
            "(worst o %.3f, lse %.3f of the bound) (%s)", wo, wl, what);
    dhsa_layout_free(lay);
    for (int x = 0; x < 4; x++) {
        free(o[x]);
        free(lse[x]);
    }
    free(q);
    kv_free(&K);
    kv_free(&V);
}

static void attention_suite(void) {
    rng_t r = {2026};
    int k = 0;
    for (int G = 1; G <= 4; G *= 2)
        for (int mode = 0; mode < 4; mode++)
            for (int sparse = 0; sparse < 2; sparse++, k++) {
                /* decode Lq 1 and 2 (narrow tiles), a chunk after a prefix, a full
                 * prefill; no length a multiple of the 64-key block */
                const int64_t Lk = mode == 3 ? 130 : 300;
                const int64_t Lq = mode == 0 ? 1 : mode == 1 ? 2 : mode == 2 ? 37 : Lk;
                kcase c = {2, 2 * G, 2, Lq, Lk, 64, 32, Lk - Lq, sparse, k % 2};
                run_case(&c, &r);
            }
    /* d = dv = 128, MQA-like G = 8 decode (wide head dims through every block buffer) */
    kcase c = {1, 8, 1, 1, 200, 128, 128, 199, 0, 0};
    run_case(&c, &r);
}

/* ------------------------------------------------------------------------ */

static void test_wrong_input_fails(void) {
    rng_t r = {5};
    const int64_t Hq = 4, Hkv = 2, L = 100, d = 32;
    float q[4 * 32], o1[4 * 32], o2[4 * 32];
    for (int i = 0; i < Hq * d; i++) q[i] = (float)rng_normal(&r);
    kvbuf K, V;
    kv_make(&K, Hkv * L, d, &r);
    kv_make(&V, Hkv * L, d, &r);
    /* one value of the F32 copy moved by one step of its block's scale */
    uint16_t h;
    memcpy(&h, K.q8 + 34 * (37 * d / 32), 2);
    K.f32[37 * d + 3] += (float)f16_decode(h);
    int same = 1;
    for (int x = 0; x < 2; x++) {
        dhsa_attn_desc a = dhsa_attn_default_desc();
        a.q = dhsa_tensor_bhld(q, DHSA_F32, 1, Hq, 1, d);
        a.k = x ? dhsa_tensor_bhld(K.f32, DHSA_F32, 1, Hkv, L, d) : dhsa_tensor_bhld(K.q8, DHSA_Q8_0, 1, Hkv, L, d);
        a.v = x ? dhsa_tensor_bhld(V.f32, DHSA_F32, 1, Hkv, L, d) : dhsa_tensor_bhld(V.q8, DHSA_Q8_0, 1, Hkv, L, d);
        a.o = dhsa_tensor_bhld(x ? o2 : o1, DHSA_F32, 1, Hq, 1, d);
        same &= dhsa_attention(g_ctx, &a) == DHSA_OK;
    }
    T_CHECK(same && memcmp(o1, o2, sizeof o1) != 0,
            "the bitwise comparison fails when the F32 copy holds one code off by one step");
    kv_free(&K);
    kv_free(&V);
}

/* Each bad view: an error with a sentence that names the rule, o untouched. */
static void test_refusals(void) {
    static unsigned char kq[34 * 64 * 8];
    static float q[8 * 64], o[8 * 64], f[64 * 64];
    struct {
        const char *what, *needle;
        dhsa_status want;
    } cases[] = {
        {"d = 48 (not whole blocks)", "multiple of 32", DHSA_ERR_SHAPE},
        {"dim stride 2", "stride[3] == 1", DHSA_ERR_SHAPE},
        {"row stride 48 elements", "multiples of 32", DHSA_ERR_SHAPE},
        {"q as Q8_0", "only k and v", DHSA_ERR_INVALID_ARG},
        {"o as Q8_0", "only k and v", DHSA_ERR_INVALID_ARG},
    };
    for (int i = 0; i < 5; i++) {
        int64_t d = i == 0 ? 48 : 32;
        dhsa_attn_desc a = dhsa_attn_default_desc();
        a.q = dhsa_tensor_bhld(q, DHSA_F32, 1, 2, 1, d);
        a.k = dhsa_tensor_bhld(kq, DHSA_Q8_0, 1, 2, 8, d);
        a.v = dhsa_tensor_bhld(kq, DHSA_Q8_0, 1, 2, 8, d);
        a.o = dhsa_tensor_bhld(o, DHSA_F32, 1, 2, 1, d);
        if (i == 1) a.k.stride[3] = 2;
        if (i == 2) a.v.stride[2] = 48;
        if (i == 3) a.q = dhsa_tensor_bhld(kq, DHSA_Q8_0, 1, 2, 1, d);
        if (i == 4) {
            a.k = a.v = dhsa_tensor_bhld(f, DHSA_F32, 1, 2, 8, d);
            a.o = dhsa_tensor_bhld(kq, DHSA_Q8_0, 1, 2, 1, d);
        }
        memset(o, 0x5A, sizeof o);
        unsigned char save[34 * 4];
        memcpy(save, kq, sizeof save);
        size_t ws = 0;
        dhsa_status s1 = dhsa_attn_workspace_size(g_ctx, &a, &ws);
        dhsa_status s2 = dhsa_attention(g_ctx, &a);
        const char *msg = dhsa_last_error();
        int untouched = memcmp(save, kq, sizeof save) == 0;
        for (size_t j = 0; j < sizeof o; j++) untouched &= ((unsigned char *)o)[j] == 0x5A;
        T_CHECK(s1 == cases[i].want && s2 == cases[i].want && strstr(msg, cases[i].needle) && untouched,
                "%s: refused with %s (want %s), \"%s\", outputs untouched %d", cases[i].what, dhsa_status_str(s2),
                dhsa_status_str(cases[i].want), msg, untouched);
    }
}

/* A budget one byte below the queried workspace is refused; exactly it runs. */
static void test_workspace(void) {
    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = 2;
    dhsa_ctx *ctx = NULL;
    if (dhsa_ctx_create(&cp, &ctx)) {
        T_CHECK(0, "ctx: %s", dhsa_last_error());
        return;
    }
    rng_t r = {11};
    const int64_t Hq = 8, Hkv = 2, L = 260, d = 64;
    float *q = malloc(sizeof(float) * (size_t)(Hq * L * d)), *o = malloc(sizeof(float) * (size_t)(Hq * L * d));
    for (int64_t i = 0; i < Hq * L * d; i++) q[i] = (float)rng_normal(&r);
    kvbuf K;
    kv_make(&K, Hkv * L, d, &r);
    for (int lq = 0; lq < 2; lq++) {
        const int64_t Lq = lq ? L : 1;
        dhsa_attn_desc a = dhsa_attn_default_desc();
        a.q = dhsa_tensor_bhld(q, DHSA_F32, 1, Hq, Lq, d);
        a.k = a.v = dhsa_tensor_bhld(K.q8, DHSA_Q8_0, 1, Hkv, L, d);
        a.o = dhsa_tensor_bhld(o, DHSA_F32, 1, Hq, Lq, d);
        a.causal = 1;
        a.q_pos0 = L - Lq;
        dhsa_ctx_trim(ctx);
        size_t base = dhsa_ctx_mem_stats(ctx).in_use, ws = 0;
        dhsa_status st = dhsa_attn_workspace_size(ctx, &a, &ws);
        dhsa_ctx_set_budget(ctx, base + ws - 1);
        dhsa_status short_by_one = dhsa_attention(ctx, &a);
        dhsa_ctx_set_budget(ctx, base + ws);
        dhsa_ctx_reset_peak(ctx);
        dhsa_status exact = dhsa_attention(ctx, &a);
        dhsa_mem_stats ms = dhsa_ctx_mem_stats(ctx);
        T_CHECK(st == DHSA_OK && ws > 0 && short_by_one == DHSA_ERR_MEMORY_BUDGET && exact == DHSA_OK &&
                    ms.peak == base + ws,
                "Lq=%lld over Q8_0: workspace %zu exact (one byte less refused: %s; exactly: %s; peak %zu = %zu)",
                (long long)Lq, ws, dhsa_status_str(short_by_one), dhsa_status_str(exact), ms.peak, base + ws);
        dhsa_ctx_set_budget(ctx, 0);
    }
    kv_free(&K);
    free(q);
    free(o);
    dhsa_ctx_free(ctx);
}

/* ------------------------------------------------------------------------ */
/* Sessions on the shipped default model */

#define MODEL "models/dhsa-retrieval-8m.gguf"
#define VECTORS "models/dhsa-retrieval-8m.vectors.txt"
#define NGEN 32

/* The prompt ids of case `name` in the vectors file; n = 0 when absent. */
static int64_t read_prompt(const char *name, int32_t *ids, int64_t cap) {
    FILE *f = fopen(VECTORS, "r");
    if (!f) return 0;
    static char line[1 << 16];
    int in_case = 0;
    int64_t n = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "case ", 5) == 0) in_case = strncmp(line + 5, name, strlen(name)) == 0;
        else if (in_case && strncmp(line, "prompt ", 7) == 0) {
            char *s = line + 7, *end;
            for (;;) {
                long v = strtol(s, &end, 10);
                if (end == s || n == cap) break;
                ids[n++] = (int32_t)v;
                s = end;
            }
            break;
        }
    }
    fclose(f);
    return n;
}

/* Logits after the prompt, then NGEN greedy ids. 0 on success. */
static int run_session(const dhsa_model *m, dhsa_type kv, dhsa_attn_method attn, const int32_t *ids, int64_t n,
                       float *logits, int32_t *gen) {
    const dhsa_model_info *in = dhsa_model_get_info(m);
    dhsa_session_params sp = dhsa_session_default_params();
    sp.n_ctx = n + NGEN + 8;
    sp.kv_type = kv;
    sp.attn = attn;
    if (attn == DHSA_ATTN_DHSA) {
        sp.router.dense_below = 0;
        sp.router.density = 0.25;
    }
    dhsa_session *s = NULL;
    float *lg = malloc((size_t)in->n_vocab * sizeof(float));
    int rc = !lg || dhsa_session_create(g_ctx, m, &sp, &s) || dhsa_session_eval(s, ids, n, lg);
    if (!rc) memcpy(logits, lg, (size_t)in->n_vocab * sizeof(float));
    for (int64_t t = 0; !rc && t < NGEN; t++) {
        int32_t best = 0;
        for (int64_t i = 1; i < in->n_vocab; i++)
            if (lg[i] > lg[best]) best = (int32_t)i;
        gen[t] = best;
        rc = dhsa_session_eval(s, &best, 1, lg) != DHSA_OK;
    }
    if (rc) fprintf(stderr, "session (kv %s): %s\n", dhsa_type_name(kv), dhsa_last_error());
    dhsa_session_free(s);
    free(lg);
    return rc;
}

static int detok_has(const dhsa_model *m, const int32_t *ids, int64_t n, const char *want) {
    char text[1024];
    int64_t len = 0;
    if (dhsa_detokenize(dhsa_model_tokenizer(m), ids, n, 0, text, sizeof text - 1, &len)) return 0;
    text[len] = 0;
    return strstr(text, want) != NULL;
}

/* The routing index must see what attention sees. A mirror index per
 * layer, fed in the layer hook with the ubatch's new keys as the cache
 * holds them (a->k), routes each call again: its layout must be the
 * session's, block for block. With requant set (on an F32 cache) the
 * mirror is fed Q8_0-rounded keys instead, which should route some blocks
 * differently: the check can fail. */
typedef struct {
    dhsa_ctx *ctx;
    dhsa_kv_index *ix[8];
    int requant, failed;
    int64_t calls, blocks, differ;
    float *tmp;              /* [Hkv][n][hd] requantized keys */
    unsigned char blk[4096]; /* one Q8_0 row */
} mirror;

static int mirror_hook(void *user, int64_t l, const dhsa_attn_desc *a) {
    mirror *mr = user;
    if (!a->layout || l >= 8 || !mr->ix[l] || mr->failed) return 0;
    const int64_t n = a->q.shape[2], pos0 = a->q_pos0, Hkv = a->k.shape[1], hd = a->k.shape[3];
    dhsa_tensor kn = a->k;
    kn.data = (char *)kn.data + dhsa_type_row_bytes(kn.type, pos0 * kn.stride[2]);
    kn.shape[2] = n;
    if (mr->requant) {
        for (int64_t h = 0; h < Hkv; h++)
            for (int64_t r = 0; r < n; r++) {
                const float *src = (const float *)a->k.data + h * a->k.stride[1] + (pos0 + r) * a->k.stride[2];
                float *dst = mr->tmp + (h * n + r) * hd;
                if (dhsa_q8_0_quantize_row(src, mr->blk, hd) || dhsa_q8_0_dequantize_row(mr->blk, dst, hd))
                    mr->failed = 1;
            }
        kn = dhsa_tensor_bhld(mr->tmp, DHSA_F32, 1, Hkv, n, hd);
    }
    dhsa_layout *lay = NULL;
    if (dhsa_kv_index_append(mr->ix[l], &kn) || dhsa_kv_index_route(mr->ctx, mr->ix[l], a, &lay)) {
        fprintf(stderr, "mirror index: %s\n", dhsa_last_error());
        mr->failed = 1;
        return 0;
    }
    dhsa_layout_stats ls;
    dhsa_layout_get_stats(a->layout, &ls);
    mr->calls++;
    for (int64_t g = 0; g < Hkv; g++)
        for (int64_t qb = 0; qb < ls.n_blocks; qb++) {
            const int64_t *r1, *r2;
            int64_t n1 = -1, n2 = -2;
            dhsa_layout_get(a->layout, 0, g, qb, &r1, &n1);
            dhsa_layout_get(lay, 0, g, qb, &r2, &n2);
            mr->blocks++;
            mr->differ += n1 != n2 || memcmp(r1, r2, (size_t)(2 * n1) * sizeof(int64_t)) != 0;
        }
    dhsa_layout_free(lay);
    return 0;
}

/* A DHSA session over the prompt and NGEN greedy steps with the mirror
 * hook; fills mr's counts. 0 on success. */
static int mirror_run(const dhsa_model *m, dhsa_type kv, int requant, const int32_t *ids, int64_t n, mirror *mr) {
    const dhsa_model_info *in = dhsa_model_get_info(m);
    memset(mr, 0, sizeof *mr);
    mr->requant = requant;
    dhsa_session_params sp = dhsa_session_default_params();
    sp.n_ctx = n + NGEN + 8;
    sp.kv_type = kv;
    sp.attn = DHSA_ATTN_DHSA;
    sp.router.dense_below = 0;
    sp.router.density = 0.25;
    /* the mirror routes each call alone (dhsa_kv_index_route): decode steps
     * that carry chunks from the step before (docs/dhsa.md) would differ
     * by those, and a prefill's last rows ranked by their exact attention
     * (exact_rows) by theirs; this checks the index's keys, so without
     * either */
    sp.router.carry = 0;
    sp.router.exact_rows = 0;
    sp.layer_hook = mirror_hook;
    sp.layer_hook_user = mr;
    /* session.c's method_router for DHSA, the unset fields scaled to n_ctx as the session does */
    dhsa_router_params rp = sp.router;
    dhsa_router_scale(&rp, sp.n_ctx);
    rp.method = DHSA_ROUTE_DHSA;
    if (rp.boundary == DHSA_BOUNDARY_FIXED) rp.boundary = DHSA_BOUNDARY_SIMILARITY;
    rp.causal_boundaries = 1;
    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = 1;
    int rc = in->n_layer > 8 || dhsa_ctx_create(&cp, &mr->ctx);
    for (int64_t l = 0; !rc && l < in->n_layer; l++)
        rc = dhsa_kv_index_create(mr->ctx, &rp, in->n_head_kv, in->head_dim_k, sp.n_ctx, &mr->ix[l]) != DHSA_OK;
    mr->tmp = malloc((size_t)(in->n_head_kv * sp.n_ctx * in->head_dim_k) * sizeof(float));
    float *lg = malloc((size_t)in->n_vocab * sizeof(float));
    dhsa_session *s = NULL;
    rc = rc || !mr->tmp || !lg || dhsa_session_create(g_ctx, m, &sp, &s) || dhsa_session_eval(s, ids, n, lg);
    for (int t = 0; !rc && t < 8; t++) {
        int32_t best = 0;
        for (int64_t i = 1; i < in->n_vocab; i++)
            if (lg[i] > lg[best]) best = (int32_t)i;
        rc = dhsa_session_eval(s, &best, 1, lg) != DHSA_OK;
    }
    if (rc) fprintf(stderr, "mirror run (kv %s): %s\n", dhsa_type_name(kv), dhsa_last_error());
    dhsa_session_free(s);
    for (int l = 0; l < 8; l++) dhsa_kv_index_free(mr->ix[l]);
    dhsa_ctx_free(mr->ctx);
    free(mr->tmp);
    free(lg);
    return rc || mr->failed;
}

static int stub_allgather(void *u, const void *s, size_t n, void *r, char *why) {
    (void)u, (void)s, (void)n, (void)r, (void)why;
    return 1;
}
static int stub_bcast(void *u, void *b, size_t n, int root, char *why) {
    (void)u, (void)b, (void)n, (void)root, (void)why;
    return 1;
}
static int stub_alltoallv(void *u, const void *s, const size_t *sb, void *r, const size_t *rb, char *why) {
    (void)u, (void)s, (void)sb, (void)r, (void)rb, (void)why;
    return 1;
}
static int stub_ring_start(void *u, const void *s, size_t sb, void *r, size_t rb, char *why) {
    (void)u, (void)s, (void)sb, (void)r, (void)rb, (void)why;
    return 1;
}
static int stub_ring_wait(void *u, char *why) {
    (void)u, (void)why;
    return 1;
}

static void test_sessions(void) {
    dhsa_model *m = NULL;
    dhsa_model_params mp = dhsa_model_default_params();
    T_CHECK(dhsa_model_load(MODEL, &mp, &m) == DHSA_OK, "load %s: %s", MODEL, dhsa_last_error());
    if (!m) return;
    const dhsa_model_info *in = dhsa_model_get_info(m);

    /* the plan: 34 bytes per 32 values */
    dhsa_session_params sp = dhsa_session_default_params();
    sp.n_ctx = 4096;
    dhsa_mem_plan p32, p8;
    sp.kv_type = DHSA_F32;
    dhsa_status s1 = dhsa_session_plan(g_ctx, m, &sp, &p32);
    sp.kv_type = DHSA_Q8_0;
    dhsa_status s2 = dhsa_session_plan(g_ctx, m, &sp, &p8);
    size_t want = (size_t)(in->n_layer * 4096 * in->n_head_kv * (in->head_dim_k + in->head_dim_v) / 32 * 34);
    T_CHECK(s1 == DHSA_OK && s2 == DHSA_OK && p8.kv_cache == want && p32.kv_cache * 17 == p8.kv_cache * 64,
            "plan: a Q8_0 cache of 4096 tokens is %zu bytes (want %zu; F32 %zu)", p8.kv_cache, want, p32.kv_cache);

    static int32_t ids[4096];
    const int64_t V = in->n_vocab;
    float *l32 = malloc((size_t)V * sizeof(float)), *l16 = malloc((size_t)V * sizeof(float)),
          *l8 = malloc((size_t)V * sizeof(float));
    int32_t g32[NGEN], g16[NGEN], g8[NGEN];
    int64_t n = 0;
    int rc = 0;
    for (int c = 0; c < 2; c++) {
        const char *name = c ? "passkey" : "text";
        n = read_prompt(name, ids, 4096);
        rc = n < 100 || run_session(m, DHSA_F32, DHSA_ATTN_DENSE, ids, n, l32, g32) ||
             run_session(m, DHSA_F16, DHSA_ATTN_DENSE, ids, n, l16, g16) ||
             run_session(m, DHSA_Q8_0, DHSA_ATTN_DENSE, ids, n, l8, g8);
        double d16 = 0, d8 = 0, range = 0;
        int agree = 0, agree16 = 0;
        if (!rc) {
            for (int64_t i = 0; i < V; i++) {
                d16 = fmax(d16, fabs((double)l16[i] - l32[i]));
                d8 = fmax(d8, fabs((double)l8[i] - l32[i]));
                range = fmax(range, fabs((double)l32[i]));
            }
            for (int t = 0; t < NGEN && g8[t] == g32[t]; t++) agree++;
            for (int t = 0; t < NGEN && g16[t] == g32[t]; t++) agree16++;
        }
        printf("test_kv_q8: %s, %lld-token prompt, logits vs the F32 cache: max |diff| Q8_0 %.4g, F16 %.4g (max "
               "|logit| %.3g); greedy prefix agreeing with F32 over %d tokens: Q8_0 %d, F16 %d\n",
               name, (long long)n, d8, d16, range, NGEN, agree, agree16);
        T_CHECK(!rc && d8 > 0 && d8 <= 0.15, "%s: Q8_0 cache logits within 0.15 of the F32 cache's (max |diff| %.4g)",
                name, d8);
        T_CHECK(!rc && agree >= 24, "%s: Q8_0 cache greedy text agrees with the F32 cache's on the first %d of %d "
                "tokens (want >= 24)", name, agree, NGEN);
    }
    T_CHECK(!rc && detok_has(m, g8, NGEN, "62319"), "passkey answered over a Q8_0 cache, dense");

    /* the passkey, with DHSA routing over the Q8_0 cache */
    rc = n < 100 || run_session(m, DHSA_Q8_0, DHSA_ATTN_DHSA, ids, n, l8, g8);
    T_CHECK(!rc && detok_has(m, g8, NGEN, "62319"), "passkey answered over a Q8_0 cache with DHSA routing");
    mirror mr;
    rc = n < 100 || mirror_run(m, DHSA_Q8_0, 0, ids, n, &mr);
    printf("test_kv_q8: DHSA over a Q8_0 cache: %lld of %lld routed blocks differ from a mirror index fed the "
           "cached keys (%lld calls)\n", (long long)mr.differ, (long long)mr.blocks, (long long)mr.calls);
    T_CHECK(!rc && mr.calls > 0 && mr.blocks > 0 && mr.differ == 0,
            "Q8_0 + DHSA: the session's index routes exactly as one fed the cached keys (%lld of %lld blocks differ)",
            (long long)mr.differ, (long long)mr.blocks);
    rc = n < 100 || mirror_run(m, DHSA_F32, 1, ids, n, &mr);
    printf("test_kv_q8: DHSA over an F32 cache: %lld of %lld routed blocks differ from a mirror index fed "
           "Q8_0-rounded keys\n", (long long)mr.differ, (long long)mr.blocks);
    T_CHECK(!rc && mr.differ > 0, "the mirror check can fail: Q8_0-rounded keys route %lld of %lld blocks of an "
            "F32-cache session differently", (long long)mr.differ, (long long)mr.blocks);
    /* context parallel refuses it with a sentence (the plan of rank 0 of 2;
     * the transport is never called) */
    dhsa_dist dist = {0, 2, NULL, stub_allgather, stub_bcast, stub_alltoallv, stub_ring_start, stub_ring_wait};
    sp = dhsa_session_default_params();
    sp.n_ctx = 1024;
    sp.kv_type = DHSA_Q8_0;
    sp.dist = &dist;
    dhsa_status sd = dhsa_session_plan(g_ctx, m, &sp, &p8);
    T_CHECK(sd == DHSA_ERR_UNSUPPORTED && strstr(dhsa_last_error(), "Q8_0"),
            "context parallel refuses a Q8_0 cache with a sentence: %s, \"%s\"", dhsa_status_str(sd),
            dhsa_last_error());
    dhsa_model_free(m);
    free(l32);
    free(l16);
    free(l8);
}

/* ------------------------------------------- real-model-like shapes --- */

/* KL(p || q) of softmax(a) against softmax(b) over n logits, in nats. */
static double kl_logits(const float *a, const float *b, int64_t n) {
    double ma = -INFINITY, mb = -INFINITY, za = 0, zb = 0, kl = 0;
    for (int64_t i = 0; i < n; i++) {
        if (a[i] > ma) ma = a[i];
        if (b[i] > mb) mb = b[i];
    }
    for (int64_t i = 0; i < n; i++) {
        za += exp(a[i] - ma);
        zb += exp(b[i] - mb);
    }
    for (int64_t i = 0; i < n; i++) {
        double la = a[i] - ma - log(za), lb = b[i] - mb - log(zb);
        kl += exp(la) * (la - lb);
    }
    return kl;
}

/* Every position's logits of ids through one session (logits_all). */
static dhsa_status qwen_logits(const dhsa_model *m, dhsa_type kv, int exact, int64_t ub, const int32_t *ids,
                               int64_t n, float *out) {
    dhsa_session_params p = dhsa_session_default_params();
    p.kv_type = kv;
    p.exact = exact;
    p.n_ubatch = ub;
    p.logits_all = 1;
    dhsa_session *s;
    dhsa_status st = dhsa_session_create(g_ctx, m, &p, &s);
    if (st) return st;
    st = dhsa_session_eval(s, ids, n, out);
    dhsa_session_free(s);
    return st;
}

/* Qwen2.5's shapes (14 query heads on 2 KV heads of 64, q/k/v biases,
 * RoPE base 1e6, NeoX) with its trait that broke the Q8_0 cache: a K bias
 * of +-150 on the channel pair RoPE turns slowest (Qwen2.5-0.5B: 120-220
 * there), which alone set the Q8_0 step of its block to ~1.2 while the
 * other keys are O(1). Every KV type, both weight routes and ubatches 1,
 * 3, 16 and 64 are held to the F32 cache on the exact route by the KL of
 * every position's next-token distribution (< 0.05 nats; the real model's
 * first token was 6.9 before the keys were centred). Before the fix this
 * fixture measured a worst KL of 0.089-0.092 for Q8_0 (every route and
 * ubatch), which fails; measured after: printed. */
static void test_qwen_shapes(void) {
    llmref_spec sp = llmref_spec_default("qwen2", LLMREF_Q8_0);
    sp.n_head = 14;
    sp.n_head_kv = 2;
    sp.head_dim = sp.head_dim_v = sp.n_rot = 64;
    sp.n_embd = 896;
    sp.n_ff = 256;
    sp.n_ctx_train = 4096;
    sp.rope_base = 1e6;
    sp.k_bias_big = 150;
    uint8_t *bytes = NULL;
    dhsa_model *m = NULL;
    if (llmref_fixture_model(&sp, &bytes, &m)) {
        T_CHECK(0, "qwen2-shaped fixture: %s / %s", llmref_error(), dhsa_last_error());
        return;
    }
    enum { N = 40 };
    int32_t ids[N];
    uint64_t r = 7;
    for (int i = 0; i < N; i++) ids[i] = 3 + (int32_t)(llmref_rand_u64(&r) % 300);
    const int64_t V = dhsa_model_get_info(m)->n_vocab;
    float *ref = malloc((size_t)(N * V) * sizeof(float)), *got = malloc((size_t)(N * V) * sizeof(float));
    if (!ref || !got || qwen_logits(m, DHSA_F32, 1, 64, ids, N, ref)) {
        T_CHECK(0, "qwen2-shaped fixture: the F32 reference: %s", dhsa_last_error());
    } else {
        static const dhsa_type kvs[3] = {DHSA_F32, DHSA_F16, DHSA_Q8_0};
        static const char *const names[3] = {"f32", "f16", "q8_0"};
        static const int64_t ubs[4] = {1, 3, 16, 64};
        double worst_of[3] = {0, 0, 0};
        for (int k = 0; k < 3; k++)
            for (int exact = 0; exact < 2; exact++)
                for (int u = 0; u < 4; u++) {
                    dhsa_status st = qwen_logits(m, kvs[k], exact, ubs[u], ids, N, got);
                    double worst = 0, first = 0;
                    int64_t at = 0;
                    for (int64_t t = 0; !st && t < N; t++) {
                        double kl = kl_logits(ref + t * V, got + t * V, V);
                        if (t == 0) first = kl;
                        if (!(kl <= worst)) {
                            worst = kl;
                            at = t;
                        }
                    }
                    if (worst > worst_of[k]) worst_of[k] = worst;
                    T_CHECK(!st && worst < 0.05,
                            "qwen2 shapes, KV %s, %s route, ubatch %lld: KL to the F32 cache <= 0.05 at every "
                            "position (first %.2e, worst %.2e at %lld)%s%s",
                            names[k], exact ? "exact" : "fast", (long long)ubs[u], first, worst, (long long)at,
                            st ? ": " : "", st ? dhsa_last_error() : "");
                }
        printf("test_kv_q8: qwen2 shapes (K bias 150 on the slowest pair), worst KL to the F32 cache over both "
               "routes, ubatch 1/3/16/64 and 40 positions: f32 %.2e, f16 %.2e, q8_0 %.2e\n",
               worst_of[0], worst_of[1], worst_of[2]);
    }
    free(ref);
    free(got);
    dhsa_model_free(m);
    free(bytes);
}

int main(void) {
    dhsa_ctx_params p = dhsa_ctx_default_params();
    if (dhsa_ctx_create(&p, &g_ctx) != DHSA_OK) {
        T_CHECK(0, "ctx_create: %s", dhsa_last_error());
        return t_report("test_kv_q8");
    }
    const dhsa_isa best = dhsa_active_isa();
    const double t_start = now_s();
    printf("test_kv_q8: %d threads, active ISA %s\n", dhsa_ctx_n_threads(g_ctx), dhsa_isa_name(best));
    test_codec();
    test_refusals();
    test_workspace();
    test_wrong_input_fails();
    int before = t_checks();
    attention_suite();
    const int n_suite = t_checks() - before;
    for (int isa = DHSA_ISA_SCALAR; isa <= DHSA_ISA_AVX512; isa++) {
        if ((dhsa_isa)isa == best) continue;
        if (dhsa_set_isa((dhsa_isa)isa) != DHSA_OK) {
            T_SKIP(n_suite, "ISA %s unsupported here", dhsa_isa_name((dhsa_isa)isa));
            continue;
        }
        attention_suite();
    }
    dhsa_set_isa(best);
    double t0 = now_s();
    test_qwen_shapes();
    test_sessions();
    printf("test_kv_q8: sessions %.1f s, attention over every ISA %.1f s\n", now_s() - t0, t0 - t_start);
    if (getenv("DHSA_CLI")) {
        char *out = NULL;
        int rc = cli_run("run -p 'The pass key is' -n 8 --temp 0 --threads 1 --kv q8_0 -v", 0, &out);
        T_CHECK(rc == 0 && out && strstr(out, "KV q8_0") && strstr(out, "decode: "),
                "dhsa run --kv q8_0 runs and says so: exit %d, \"%s\"", rc, out ? out : "");
        free(out);
        rc = cli_run("run -p 'x' -n 1 --kv q4_0", 0, &out);
        T_CHECK(rc != 0 && out && strstr(out, "f32, f16 or q8_0"), "dhsa run --kv q4_0 is refused: \"%s\"",
                out ? out : "");
        free(out);
        rc = cli_run("bench attn --L 1K --Lq 1 --heads 4 --kv-heads 2 --dim 64 --kv-dtype q8_0 --runs 3 --json "
                     "--peak-seconds 0.02 --peak-bytes 16M", 1, &out);
        T_CHECK(rc == 0 && out && strstr(out, "\"kv_dtype\": \"q8_0\"") && strstr(out, "\"max_abs_err\""),
                "dhsa bench attn --kv-dtype q8_0 checks and times decode over a Q8_0 K/V: exit %d, \"%s\"", rc,
                out ? out : "");
        free(out);
    } else {
        T_SKIP(3, "DHSA_CLI unset: the CLI checks are skipped (make test sets it)");
    }
    dhsa_ctx_free(g_ctx);
    return t_report("test_kv_q8");
}
