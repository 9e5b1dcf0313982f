/* test_quant.c: tests of the weight types and products (src/matmul/formats.h, matmul.h).
 *
 * Oracle: a slow decoder written here from the format description, reading
 * every code and scale by bit position (bits()), with its own f16/bf16
 * decoding; it works in double, where every format's value is exact, and
 * rounds once to float, as the format's F32 formula does. Against it:
 *   - dequantization, every ISA: bit-exact on random valid blocks, and
 *     hand-made blocks whose values are written out by hand;
 *   - quantize -> dequantize error bounds (docs/quant.md gives the rules);
 *   - dhsa__matmul vs the double product of the decoded weights, per element
 *     |got - ref| <= tol = gamma_D * sum_i |w_i x_i| (the worst-case bound of
 *     a summation tree of depth D, Higham 2002, sec. 4.2; D counts the
 *     longest chain of roundings of the kernels' order, quant.h), and NMSE;
 *     the worst element is printed on failure, and a deliberately wrong
 *     product is shown to fail;
 *   - every ISA, thread counts 1/2/3 bitwise, the fused (few tokens) and panel
 *     (many tokens) routes bitwise, edge shapes, ldx > n_in, ldy > n_out
 *     (padding untouched), workspace and budget;
 *   - dhsa__wt_check_finite (NaN value, NaN/Inf block scales) and bad
 *     arguments (errors with a sentence, never a crash).
 *
 * Run: make build/tests/test_quant && build/tests/test_quant
 * Ends with "test_quant: P passed, F failed".
 */
#include "dhsa.h"
#include "llm_ref.h"
#include "matmul/matmul.h"
#include "t.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#define N_TYPES 15
static const uint32_t all_types[N_TYPES] = {
    DHSA_GGML_F32,  DHSA_GGML_F16,  DHSA_GGML_BF16, DHSA_GGML_Q8_0, DHSA_GGML_Q4_0,   DHSA_GGML_Q4_K,
    DHSA_GGML_Q6_K, DHSA_GGML_Q4_1, DHSA_GGML_Q5_0, DHSA_GGML_Q5_1, DHSA_GGML_IQ4_NL, DHSA_GGML_Q2_K,
    DHSA_GGML_Q3_K, DHSA_GGML_Q5_K, DHSA_GGML_IQ4_XS};

/* ------------------------------------------------------------------ rng --- */

#include "rng.h"

/* -------------------------------------------- the independent decoder --- */

/* n bits (n <= 8) of a little-endian byte string starting at bit `pos`. */
static unsigned bits(const uint8_t *p, int pos, int n) {
    unsigned v = 0;
    for (int b = 0; b < n; b++) v |= (unsigned)((p[(pos + b) / 8] >> ((pos + b) % 8)) & 1) << b;
    return v;
}

static double dec_f16(const uint8_t *p) { /* IEEE binary16 */
    unsigned h = p[0] | (unsigned)p[1] << 8;
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

static double dec_bf16(const uint8_t *p) { /* the top half of a binary32 */
    unsigned h = p[0] | (unsigned)p[1] << 8;
    int s = h >> 15, e = (h >> 7) & 255, m = h & 127;
    double v = e == 0 ? ldexp(m, -133) : e == 255 ? (m ? NAN : INFINITY) : ldexp(128 + m, e - 134);
    return s ? -v : v;
}

/* Value i of a row, exact (double), per the format description:
 * Q8_0 [d f16, q int8 x32]; Q4_0 [d f16, 16 bytes: value j in the low nibble
 * of byte j (j < 16) or the high nibble of byte j-16], x = d(q-8);
 * Q4_K [d, dmin, 12 bytes of 6-bit (sc, m) for 8 sub-blocks of 32, 128 bytes
 * of nibbles: sub-block s uses byte 32*(s/2) + l, nibble s%2], x = d sc q - dmin m;
 * Q6_K [128 bytes of low nibbles, 64 bytes of 2-bit high parts, int8 scale per
 * 16 values, d], x = d sc (q - 32);
 * Q4_1 [d, m, 16 bytes of nibbles as Q4_0], x = d q + m;
 * Q5_0 [d, 32-bit qh, 16 bytes of nibbles]: bit j of qh is bit 4 of value j, x = d (q - 16);
 * Q5_1 [d, m, qh, nibbles], x = d q + m;
 * IQ4_NL [d, nibbles as Q4_0], x = d grid[q], grid the fixed 16 values below;
 * Q2_K [16 bytes (sc | m << 4) per 16 values, 64 bytes of 2-bit codes, d, dmin]:
 *   value e = 128n + 32j + 16h + l uses bits 2j.. of byte 32n + 16h + l, x = d sc q - dmin m;
 * Q3_K [32 bytes of high bits, 64 bytes of 2-bit codes as Q2_K, 12 bytes of 6-bit scales, d]:
 *   the high bit of e is bit 4n + j of byte 16h + l; q = low - 4 when it is 0;
 *   scale s: low 4 bits in nibble s/8 of byte s%8, high 2 at bit 2(s/4) of byte 8 + s%4; x = d (sc-32) q;
 * Q5_K [d, dmin, 12 bytes of (sc, m) as Q4_K, 32 bytes qh, 128 bytes of nibbles as Q4_K]:
 *   bit 4 of value 32 sb + l is bit sb of qh[l];
 * IQ4_XS [d, 16-bit scales_h, 4 bytes scales_l, 128 bytes of nibbles]: sub-block ib of 32 has
 *   ls = nibble ib%2 of scales_l[ib/2] | bits 2ib.. of scales_h << 4, its nibbles as IQ4_NL at
 *   byte 16 ib; x = d (ls - 32) grid[q]. */
static const int iq4_grid_ref[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

static double ref_value(uint32_t type, const uint8_t *row, int64_t i) {
    switch (type) {
    case DHSA_GGML_F32: {
        float f;
        memcpy(&f, row + 4 * i, 4);
        return f;
    }
    case DHSA_GGML_F16: return dec_f16(row + 2 * i);
    case DHSA_GGML_BF16: return dec_bf16(row + 2 * i);
    case DHSA_GGML_Q8_0: {
        const uint8_t *b = row + i / 32 * 34;
        int q = (int)bits(b + 2, 8 * (int)(i % 32), 8);
        return dec_f16(b) * (q >= 128 ? q - 256 : q);
    }
    case DHSA_GGML_Q4_0: {
        const uint8_t *b = row + i / 32 * 18;
        int j = (int)(i % 32);
        int q = (int)bits(b + 2, 8 * (j % 16) + 4 * (j / 16), 4);
        return dec_f16(b) * (q - 8);
    }
    case DHSA_GGML_Q4_K: {
        const uint8_t *b = row + i / 256 * 144, *s = b + 4;
        int e = (int)(i % 256), sb = e / 32, l = e % 32;
        unsigned sc, m;
        if (sb < 4) {
            sc = bits(s, 8 * sb, 6);
            m = bits(s, 8 * (sb + 4), 6);
        } else { /* low 4 bits in byte 8+(sb-4), high 2 in the top bits of bytes sb-4 / sb */
            sc = bits(s, 8 * (sb + 4), 4) | bits(s, 8 * (sb - 4) + 6, 2) << 4;
            m = bits(s, 8 * (sb + 4) + 4, 4) | bits(s, 8 * sb + 6, 2) << 4;
        }
        unsigned q = bits(b + 16, 8 * (32 * (sb / 2) + l) + 4 * (sb % 2), 4);
        return dec_f16(b) * sc * q - dec_f16(b + 2) * m;
    }
    case DHSA_GGML_Q6_K: {
        const uint8_t *b = row + i / 256 * 210;
        int e = (int)(i % 256), n = e / 128, p = e % 128 / 32, l = e % 32;
        unsigned lo = bits(b, 8 * (64 * n + 32 * (p % 2) + l) + 4 * (p / 2), 4);
        unsigned hi = bits(b + 128, 8 * (32 * n + l) + 2 * p, 2);
        int sc = (int)bits(b + 192, 8 * (e / 16), 8);
        return dec_f16(b + 208) * (sc >= 128 ? sc - 256 : sc) * ((int)(lo | hi << 4) - 32);
    }
    case DHSA_GGML_Q4_1: {
        const uint8_t *b = row + i / 32 * 20;
        int j = (int)(i % 32);
        unsigned q = bits(b + 4, 8 * (j % 16) + 4 * (j / 16), 4);
        return dec_f16(b) * q + dec_f16(b + 2);
    }
    case DHSA_GGML_Q5_0: {
        const uint8_t *b = row + i / 32 * 22;
        int j = (int)(i % 32);
        int q = (int)(bits(b + 6, 8 * (j % 16) + 4 * (j / 16), 4) | bits(b + 2, j, 1) << 4);
        return dec_f16(b) * (q - 16);
    }
    case DHSA_GGML_Q5_1: {
        const uint8_t *b = row + i / 32 * 24;
        int j = (int)(i % 32);
        unsigned q = bits(b + 8, 8 * (j % 16) + 4 * (j / 16), 4) | bits(b + 4, j, 1) << 4;
        return dec_f16(b) * q + dec_f16(b + 2);
    }
    case DHSA_GGML_IQ4_NL: {
        const uint8_t *b = row + i / 32 * 18;
        int j = (int)(i % 32);
        return dec_f16(b) * iq4_grid_ref[bits(b + 2, 8 * (j % 16) + 4 * (j / 16), 4)];
    }
    case DHSA_GGML_Q2_K:
    case DHSA_GGML_Q3_K: {
        int q2 = type == DHSA_GGML_Q2_K;
        const uint8_t *b = row + i / 256 * (q2 ? 84 : 110);
        int e = (int)(i % 256), n = e / 128, j = e % 128 / 32, h = e % 32 / 16, l = e % 16, s = e / 16;
        int q = (int)bits(b + (q2 ? 16 : 32), 8 * (32 * n + 16 * h + l) + 2 * j, 2);
        if (q2) return dec_f16(b + 80) * bits(b, 8 * s, 4) * q - dec_f16(b + 82) * bits(b, 8 * s + 4, 4);
        if (!bits(b, 8 * (16 * h + l) + 4 * n + j, 1)) q -= 4;
        int sc = (int)(bits(b + 96, s < 8 ? 8 * s : 8 * (s - 8) + 4, 4) | bits(b + 104, 8 * (s % 4) + 2 * (s / 4), 2) << 4);
        return dec_f16(b + 108) * (sc - 32) * q;
    }
    case DHSA_GGML_Q5_K: {
        const uint8_t *b = row + i / 256 * 176, *s = b + 4;
        int e = (int)(i % 256), sb = e / 32, l = e % 32;
        unsigned sc, m;
        if (sb < 4) {
            sc = bits(s, 8 * sb, 6);
            m = bits(s, 8 * (sb + 4), 6);
        } else {
            sc = bits(s, 8 * (sb + 4), 4) | bits(s, 8 * (sb - 4) + 6, 2) << 4;
            m = bits(s, 8 * (sb + 4) + 4, 4) | bits(s, 8 * sb + 6, 2) << 4;
        }
        unsigned q = bits(b + 48, 8 * (32 * (sb / 2) + l) + 4 * (sb % 2), 4) | bits(b + 16, 8 * l + sb, 1) << 4;
        return dec_f16(b) * sc * q - dec_f16(b + 2) * m;
    }
    case DHSA_GGML_IQ4_XS: {
        const uint8_t *b = row + i / 256 * 136;
        int e = (int)(i % 256), ib = e / 32, j = e % 32;
        int ls = (int)(bits(b + 4, 8 * (ib / 2) + 4 * (ib % 2), 4) | bits(b + 2, 2 * ib, 2) << 4);
        unsigned q = bits(b + 8, 8 * (16 * ib + j % 16) + 4 * (j / 16), 4);
        return dec_f16(b) * (ls - 32) * iq4_grid_ref[q];
    }
    }
    return NAN;
}

/* The float the format's F32 formula yields: the exact value rounded once. */
static float ref_float(uint32_t type, const uint8_t *row, int64_t i) { return (float)ref_value(type, row, i); }

/* --------------------------------------------------------------- helpers --- */

static const char *tname(uint32_t t) { return dhsa_ggml_type_name(t); }

static int isa_ok(dhsa_isa isa) {
    dhsa_isa cur = dhsa_active_isa();
    int ok = dhsa_set_isa(isa) == DHSA_OK;
    dhsa_set_isa(cur);
    return ok;
}

static dhsa_ctx *make_ctx(int threads) {
    dhsa_ctx_params p = dhsa_ctx_default_params();
    p.n_threads = threads;
    dhsa_ctx *c = NULL;
    if (dhsa_ctx_create(&p, &c) != DHSA_OK) {
        fprintf(stderr, "dhsa_ctx_create: %s\n", dhsa_last_error());
        exit(1);
    }
    return c;
}

/* A weight matrix of the type, quantized from normal values (scale varies by
 * row and by block so that scales differ); caller frees m.data. */
static dhsa_wmat make_w(uint32_t type, int64_t n_out, int64_t n_in, uint64_t seed) {
    rng_t r = {seed};
    dhsa_wmat W;
    W.type = type;
    W.n_in = n_in;
    W.n_out = n_out;
    W.row_bytes = dhsa__wt_row_bytes(type, n_in);
    uint8_t *data = malloc((size_t)(W.row_bytes * n_out));
    float *row = malloc((size_t)n_in * sizeof(float));
    for (int64_t o = 0; o < n_out; o++) {
        double rs = 0.05 * (1.0 + (double)(o % 7));
        for (int64_t i = 0; i < n_in; i++) row[i] = (float)(rs * (1.0 + 0.5 * ((i / 32) % 3)) * rng_normal(&r));
        if (dhsa__quantize_row(type, row, data + o * W.row_bytes, n_in) != DHSA_OK) {
            fprintf(stderr, "quantize_row: %s\n", dhsa_last_error());
            exit(1);
        }
    }
    free(row);
    W.data = data;
    return W;
}

static float *make_x(int64_t n_tok, int64_t ldx, uint64_t seed) {
    rng_t r = {seed};
    float *x = malloc((size_t)(n_tok * ldx) * sizeof(float));
    for (int64_t i = 0; i < n_tok * ldx; i++) x[i] = (float)rng_normal(&r);
    return x;
}

/* ------------------------------------------------------------ comparator --- */

typedef struct {
    int64_t bad, worst_t, worst_o;
    double worst_ratio, got, want, tol, nmse;
} cmp_t;

/* Compares y (ldy) with the double product of the decoded weights. Tolerance
 * per element: gamma_D * sum_i |w_i x_i| + 1e-30, D = the depth of the
 * kernels' summation tree (quant.h): a chain of KC/8 FMAs per lane (8 lanes
 * is the narrowest ISA), 3 levels of the lane tree, one add per K block, and
 * one rounding of the product (the scalar path multiplies, then adds). */
static cmp_t compare(const dhsa_wmat *W, const float *x, int64_t ldx, int64_t n_tok, const float *y, int64_t ldy) {
    const int64_t n = W->n_in;
    const int depth = DHSA_QK_KC / 8 + 3 + (int)((n + DHSA_QK_KC - 1) / DHSA_QK_KC) + 1;
    const double u = 0x1p-24, gamma = depth * u / (1.0 - depth * u);
    double *w = malloc((size_t)n * sizeof(double));
    cmp_t c = {0, -1, -1, 0.0, 0.0, 0.0, 0.0, 0.0};
    double se = 0.0, sr = 0.0;
    for (int64_t o = 0; o < W->n_out; o++) {
        const uint8_t *row = (const uint8_t *)W->data + o * W->row_bytes;
        for (int64_t i = 0; i < n; i++) w[i] = ref_float(W->type, row, i);
        for (int64_t t = 0; t < n_tok; t++) {
            const float *xt = x + t * ldx;
            double s = 0.0, a = 0.0;
            for (int64_t i = 0; i < n; i++) {
                s += w[i] * xt[i];
                a += fabs(w[i] * xt[i]);
            }
            double got = y[t * ldy + o], tol = gamma * a + 1e-30, err = fabs(got - s);
            se += err * err;
            sr += s * s;
            double ratio = isfinite(got) ? err / tol : INFINITY;
            if (ratio > 1.0) c.bad++;
            if (ratio > c.worst_ratio || c.worst_t < 0) {
                c.worst_ratio = ratio;
                c.worst_t = t;
                c.worst_o = o;
                c.got = got;
                c.want = s;
                c.tol = tol;
            }
        }
    }
    c.nmse = sr > 0 ? se / sr : se;
    free(w);
    return c;
}

/* Largest error / tolerance and NMSE seen over the passing products. */
static double g_worst_ratio, g_worst_nmse;

/* NMSE bound: F32 sums of n terms have relative errors around sqrt(n) u. */
#define NMSE_MAX 1e-10
/* quantizer bounds of the new types (docs/quant.md) */
#define QUANT_IQ4_BOUND 0.13
#define QUANT_Q3K_NMSE 5e-2
#define QUANT_Q2K_NMSE 0.15

static int cmp_ok(const cmp_t *c) { return c->bad == 0 && c->nmse <= NMSE_MAX; }

static void cmp_check(const cmp_t *c, const char *what) {
    if (cmp_ok(c)) {
        g_worst_ratio = fmax(g_worst_ratio, c->worst_ratio);
        g_worst_nmse = fmax(g_worst_nmse, c->nmse);
    }
    T_CHECK(cmp_ok(c),
            "%s: %lld elements over tolerance, NMSE %.3g; worst at token %lld, row %lld: got %.9g, reference %.9g, "
            "|diff| %.3g, tolerance %.3g (%.2fx)",
            what, (long long)c->bad, c->nmse, (long long)c->worst_t, (long long)c->worst_o, c->got, c->want,
            fabs(c->got - c->want), c->tol, c->worst_ratio);
}

/* ------------------------------------------------------ dequantization --- */

/* Random valid blocks: random codes, finite random scales (normal and
 * subnormal halves). Returns a row of n values. */
static uint8_t *random_row(uint32_t type, int64_t n, rng_t *r) {
    int64_t rb = dhsa__wt_row_bytes(type, n);
    uint8_t *p = malloc((size_t)rb);
    for (int64_t i = 0; i < rb; i++) p[i] = (uint8_t)rng_u64(r);
    int64_t blk = dhsa__wt_block(type), bb = dhsa__wt_block_bytes(type);
    for (int64_t b = 0; b < n / blk; b++) {
        uint8_t *q = p + b * bb;
        int offs[2] = {-1, -1};
        switch (type) {
        case DHSA_GGML_Q8_0:
        case DHSA_GGML_Q4_0:
        case DHSA_GGML_Q5_0:
        case DHSA_GGML_IQ4_NL:
        case DHSA_GGML_IQ4_XS: offs[0] = 0; break;
        case DHSA_GGML_Q4_K:
        case DHSA_GGML_Q5_K:
        case DHSA_GGML_Q4_1:
        case DHSA_GGML_Q5_1: offs[0] = 0; offs[1] = 2; break;
        case DHSA_GGML_Q6_K: offs[0] = 208; break;
        case DHSA_GGML_Q2_K: offs[0] = 80; offs[1] = 82; break;
        case DHSA_GGML_Q3_K: offs[0] = 108; break;
        default: break;
        }
        for (int k = 0; k < 2; k++) {
            if (offs[k] < 0) continue;
            uint16_t h = (uint16_t)rng_u64(r);
            unsigned e = (h >> 10) & 31;
            if (e == 31) h &= 0xbfff; /* Inf/NaN -> a finite half */
            if (b % 5 == 4) h &= 0x83ff; /* a subnormal (or zero) scale now and then */
            q[offs[k]] = (uint8_t)h;
            q[offs[k] + 1] = (uint8_t)(h >> 8);
        }
    }
    if (type == DHSA_GGML_F16 || type == DHSA_GGML_BF16) /* finite values only */
        for (int64_t i = 0; i < n; i++)
            if ((type == DHSA_GGML_F16 && (p[2 * i + 1] & 0x7c) == 0x7c) ||
                (type == DHSA_GGML_BF16 && (p[2 * i + 1] & 0x7f) == 0x7f))
                p[2 * i + 1] ^= 0x40;
    if (type == DHSA_GGML_F32)
        for (int64_t i = 0; i < n; i++) {
            float f = (float)rng_normal(r);
            memcpy(p + 4 * i, &f, 4);
        }
    return p;
}

static void test_dequant_random(void) {
    static const dhsa_isa isas[3] = {DHSA_ISA_SCALAR, DHSA_ISA_AVX2, DHSA_ISA_AVX512};
    dhsa_isa cur = dhsa_active_isa();
    for (int ti = 0; ti < N_TYPES; ti++) {
        uint32_t type = all_types[ti];
        rng_t r = {100 + (uint64_t)ti};
        int64_t n = dhsa__wt_block(type) == 1 ? 1000 : 8 * 256; /* 1000: a tail after 16-wide vectors */
        uint8_t *row = random_row(type, n, &r);
        float *got = malloc((size_t)n * sizeof(float));
        for (int k = 0; k < 3; k++) {
            if (!isa_ok(isas[k])) {
                T_SKIP(2, "dequant %s: ISA %s not available here", tname(type), dhsa_isa_name(isas[k]));
                continue;
            }
            dhsa_set_isa(isas[k]);
            for (int64_t i = 0; i < n; i++) got[i] = NAN;
            T_CHECK(dhsa__dequantize_row(type, row, got, n) == DHSA_OK, "dequantize_row %s", tname(type));
            int64_t bad = -1;
            for (int64_t i = 0; i < n && bad < 0; i++) {
                float want = ref_float(type, row, i);
                if (memcmp(&want, &got[i], 4) != 0) bad = i;
            }
            T_CHECK(bad < 0, "dequant %s (%s): value %lld is %.9g, the format says %.9g", tname(type),
                    dhsa_isa_name(isas[k]), (long long)bad, bad >= 0 ? got[bad] : 0.0,
                    bad >= 0 ? ref_value(type, row, bad) : 0.0);
        }
        dhsa_set_isa(cur);
        free(got);
        free(row);
    }
}

static void put16(uint8_t *p, uint16_t h) {
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

/* Blocks built by hand, with the values they stand for written out. */
static void test_dequant_known(void) {
    float got[256];
    /* Q8_0: d = 0.5 (0x3800), q = -128, -127, ..., -97 */
    uint8_t q8[34];
    put16(q8, 0x3800);
    for (int j = 0; j < 32; j++) q8[2 + j] = (uint8_t)(int8_t)(-128 + j);
    T_CHECK(dhsa__dequantize_row(DHSA_GGML_Q8_0, q8, got, 32) == DHSA_OK, "Q8_0 known");
    int ok = 1;
    for (int j = 0; j < 32; j++) ok &= got[j] == 0.5f * (float)(-128 + j);
    T_CHECK(ok && got[0] == -64.0f && got[31] == -48.5f, "Q8_0 known block: got[0] %g got[31] %g", got[0], got[31]);

    /* Q4_0: d = 2 (0x4000), byte j = j | (15 - j) << 4: x[j] = 2 (j - 8), x[j+16] = 2 (7 - j) */
    uint8_t q4[18];
    put16(q4, 0x4000);
    for (int j = 0; j < 16; j++) q4[2 + j] = (uint8_t)(j | (15 - j) << 4);
    T_CHECK(dhsa__dequantize_row(DHSA_GGML_Q4_0, q4, got, 32) == DHSA_OK, "Q4_0 known");
    ok = 1;
    for (int j = 0; j < 16; j++) ok &= got[j] == 2.0f * (float)(j - 8) && got[j + 16] == 2.0f * (float)(7 - j);
    T_CHECK(ok && got[0] == -16.0f && got[16] == 14.0f, "Q4_0 known block: got[0] %g got[16] %g", got[0], got[16]);

    /* Q4_K: d = 1 (0x3c00), dmin = 0.5 (0x3800); sub-block s has sc = 10 + 7s
     * and m = 60 - 5s (so s >= 4 needs the high bits: sc 38..59, m 40..25);
     * every code byte = 0x53: low nibble 3 (even sub-blocks), high 5 (odd). */
    uint8_t qk[144];
    memset(qk, 0, sizeof qk);
    put16(qk, 0x3c00);
    put16(qk + 2, 0x3800);
    int sc[8], mn[8];
    for (int s = 0; s < 8; s++) {
        sc[s] = 10 + 7 * s;
        mn[s] = 60 - 5 * s;
    }
    for (int s = 0; s < 4; s++) { /* the packing, written out bit by bit */
        qk[4 + s] = (uint8_t)(sc[s] | (sc[s + 4] >> 4) << 6);
        qk[8 + s] = (uint8_t)(mn[s] | (mn[s + 4] >> 4) << 6);
        qk[12 + s] = (uint8_t)((sc[s + 4] & 15) | (mn[s + 4] & 15) << 4);
    }
    memset(qk + 16, 0x53, 128);
    T_CHECK(dhsa__dequantize_row(DHSA_GGML_Q4_K, qk, got, 256) == DHSA_OK, "Q4_K known");
    ok = 1;
    for (int i = 0; i < 256; i++) {
        int s = i / 32, q = s % 2 ? 5 : 3;
        ok &= got[i] == (float)(sc[s] * q) - 0.5f * (float)mn[s];
    }
    /* e.g. sub-block 0: 10*3 - 30 = 0; sub-block 7: 59*5 - 12.5 = 282.5 */
    T_CHECK(ok && got[0] == 0.0f && got[255] == 282.5f, "Q4_K known block: got[0] %g got[255] %g", got[0],
            got[255]);

    /* Q6_K: d = 0.25 (0x3400), scales[j] = j - 8, q(i) = i % 64 (all 6 bits) */
    uint8_t q6[210];
    memset(q6, 0, sizeof q6);
    put16(q6 + 208, 0x3400);
    for (int j = 0; j < 16; j++) q6[192 + j] = (uint8_t)(int8_t)(j - 8);
    for (int i = 0; i < 256; i++) { /* the layout, written out */
        int n = i / 128, p = i % 128 / 32, l = i % 32, q = i % 64;
        q6[64 * n + 32 * (p % 2) + l] |= (uint8_t)((q & 15) << (4 * (p / 2)));
        q6[128 + 32 * n + l] |= (uint8_t)((q >> 4) << (2 * p));
    }
    T_CHECK(dhsa__dequantize_row(DHSA_GGML_Q6_K, q6, got, 256) == DHSA_OK, "Q6_K known");
    ok = 1;
    for (int i = 0; i < 256; i++) ok &= got[i] == 0.25f * (float)(i / 16 - 8) * (float)(i % 64 - 32);
    /* value 0: 0.25 * -8 * -32 = 64; value 255: 0.25 * 7 * 31 = 54.25 */
    T_CHECK(ok && got[0] == 64.0f && got[255] == 54.25f, "Q6_K known block: got[0] %g got[255] %g", got[0],
            got[255]);

    /* The added types: blocks built by hand, each checked three ways: dhsa
     * (the active ISA), this file's decoder (ref_value) and tests/llm_ref.h's
     * (llmref_dequant), against the values written out here. */
    {
        static uint8_t blk[176];
        float want[256];
        int n;
        double back[256];
#define KNOWN(TYPE, N, WHAT)                                                                                          \
    do {                                                                                                              \
        int bad_ = -1;                                                                                                \
        T_CHECK(dhsa__dequantize_row(TYPE, blk, got, N) == DHSA_OK && llmref_dequant(TYPE, blk, N, back) == 0,         \
                "%s known", WHAT);                                                                                    \
        for (int i_ = 0; i_ < (N) && bad_ < 0; i_++)                                                                  \
            if (got[i_] != want[i_] || back[i_] != want[i_] || ref_float(TYPE, blk, i_) != want[i_]) bad_ = i_;      \
        T_CHECK(bad_ < 0, "%s known block: value %d: dhsa %g, test decoder %g, llm_ref %g, written out %g", WHAT,    \
                bad_, bad_ >= 0 ? got[bad_] : 0.0, bad_ >= 0 ? ref_value(TYPE, blk, bad_) : 0.0,                      \
                bad_ >= 0 ? back[bad_] : 0.0, bad_ >= 0 ? want[bad_] : 0.0);                                          \
    } while (0)
        /* Q4_1: d = 0.5, m = -3, byte j = j | (15 - j) << 4: x[j] = j/2 - 3, x[j+16] = (15-j)/2 - 3 */
        memset(blk, 0, sizeof blk);
        put16(blk, 0x3800);
        put16(blk + 2, 0xc200);
        for (int j = 0; j < 16; j++) blk[4 + j] = (uint8_t)(j | (15 - j) << 4);
        for (int j = 0; j < 16; j++) {
            want[j] = 0.5f * (float)j - 3.0f;
            want[j + 16] = 0.5f * (float)(15 - j) - 3.0f;
        }
        KNOWN(DHSA_GGML_Q4_1, 32, "Q4_1");
        T_CHECK(got[0] == -3.0f && got[16] == 4.5f, "Q4_1: x0 %g x16 %g", got[0], got[16]);
        /* Q5_0: d = 1, qh = 0xaaaa5555 (bit j: fifth bit of value j), nibbles as above */
        memset(blk, 0, sizeof blk);
        put16(blk, 0x3c00);
        blk[2] = 0x55, blk[3] = 0x55, blk[4] = 0xaa, blk[5] = 0xaa;
        for (int j = 0; j < 16; j++) blk[6 + j] = (uint8_t)(j | (15 - j) << 4);
        for (int j = 0; j < 16; j++) {
            want[j] = (float)((j | (j % 2 == 0) << 4) - 16);
            want[j + 16] = (float)(((15 - j) | (j % 2 == 1) << 4) - 16);
        }
        KNOWN(DHSA_GGML_Q5_0, 32, "Q5_0");
        T_CHECK(got[0] == 0.0f && got[1] == -15.0f && got[16] == -1.0f && got[17] == 14.0f, "Q5_0 literal values");
        /* Q5_1: the same codes, d = 0.25, m = 1: x = q/4 + 1 */
        memset(blk, 0, sizeof blk);
        put16(blk, 0x3400);
        put16(blk + 2, 0x3c00);
        blk[4] = 0x55, blk[5] = 0x55, blk[6] = 0xaa, blk[7] = 0xaa;
        for (int j = 0; j < 16; j++) blk[8 + j] = (uint8_t)(j | (15 - j) << 4);
        for (int j = 0; j < 32; j++) want[j] = 0.25f * (want[j] + 16.0f) + 1.0f;
        KNOWN(DHSA_GGML_Q5_1, 32, "Q5_1");
        /* IQ4_NL: d = 2, nibbles as Q4_1: x[j] = 2 grid[j], x[j+16] = 2 grid[15-j] */
        static const int grid[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
        memset(blk, 0, sizeof blk);
        put16(blk, 0x4000);
        for (int j = 0; j < 16; j++) blk[2 + j] = (uint8_t)(j | (15 - j) << 4);
        for (int j = 0; j < 16; j++) {
            want[j] = 2.0f * (float)grid[j];
            want[j + 16] = 2.0f * (float)grid[15 - j];
        }
        KNOWN(DHSA_GGML_IQ4_NL, 32, "IQ4_NL");
        T_CHECK(got[0] == -254.0f && got[16] == 226.0f, "IQ4_NL: x0 %g x16 %g", got[0], got[16]);
        /* Q2_K: d = 1, dmin = 0.5; scale byte s = s | (15 - s) << 4; every code
         * byte 0xe4 (codes 0, 1, 2, 3 at bits 0, 2, 4, 6): value i has code
         * j = i % 128 / 32 and sub-block s = i / 16: x = s j - (15 - s)/2 */
        memset(blk, 0, sizeof blk);
        for (int s16 = 0; s16 < 16; s16++) blk[s16] = (uint8_t)(s16 | (15 - s16) << 4);
        memset(blk + 16, 0xe4, 64);
        put16(blk + 80, 0x3c00);
        put16(blk + 82, 0x3800);
        for (int i = 0; i < 256; i++) want[i] = (float)(i / 16 * (i % 128 / 32)) - 0.5f * (float)(15 - i / 16);
        KNOWN(DHSA_GGML_Q2_K, 256, "Q2_K");
        T_CHECK(got[0] == -7.5f && got[255] == 45.0f, "Q2_K: x0 %g x255 %g", got[0], got[255]);
        /* Q3_K: d = 0.5; scale code of sub-block s = 2s + 1 (scale 2s - 31),
         * low 4 bits in nibble s/8 of byte s%8, high 2 bits at 2(s/4) of byte
         * 8 + s%4; codes bytes 0xe4 (low 2 bits = j); hmask bytes 0..15 = 0x0f,
         * 16..31 = 0xf0: the third bit is set in the first half (n = 0) for
         * h = 0 and in the second (n = 1) for h = 1; q = j, or j - 4 without it */
        memset(blk, 0, sizeof blk);
        memset(blk, 0x0f, 16);
        memset(blk + 16, 0xf0, 16);
        memset(blk + 32, 0xe4, 64);
        for (int s16 = 0; s16 < 16; s16++) {
            int c = 2 * s16 + 1;
            blk[96 + s16 % 8] |= (uint8_t)((c & 15) << (s16 < 8 ? 0 : 4));
            blk[104 + s16 % 4] |= (uint8_t)((c >> 4) << (2 * (s16 / 4)));
        }
        put16(blk + 108, 0x3800);
        for (int i = 0; i < 256; i++) {
            int nn = i / 128, j = i % 128 / 32, hh = i % 32 / 16, q = (nn == hh) ? j : j - 4;
            want[i] = 0.5f * (float)(2 * (i / 16) - 31) * (float)q;
        }
        KNOWN(DHSA_GGML_Q3_K, 256, "Q3_K");
        /* value 16: sub-block 1 (scale -29), n 0, h 1: no third bit, q = -4: 0.5 * -29 * -4 = 58 */
        T_CHECK(got[16] == 58.0f && got[0] == 0.0f, "Q3_K: x16 %g x0 %g", got[16], got[0]);
        /* Q5_K: Q4_K's known header (d 1, dmin 0.5, sc 10 + 7s, m 60 - 5s), code
         * bytes 0x53, qh bytes 0x55: the fifth bit is set for even sub-blocks,
         * so q = 3 + 16 (even) or 5 (odd) */
        memset(blk, 0, sizeof blk);
        memcpy(blk, qk, 16);
        memset(blk + 16, 0x55, 32);
        memset(blk + 48, 0x53, 128);
        for (int i = 0; i < 256; i++) {
            int s8 = i / 32;
            want[i] = (float)(sc[s8] * (s8 % 2 ? 5 : 19)) - 0.5f * (float)mn[s8];
        }
        KNOWN(DHSA_GGML_Q5_K, 256, "Q5_K");
        /* IQ4_XS: d = 0.25, ls of sub-block ib = 8 ib + 3 (low 4 bits in nibble
         * ib%2 of byte 4 + ib/2, high 2 at bits 2ib of scales_h); code bytes
         * 0x69: low nibble 9 (grid 13), high 6 (grid -22) */
        memset(blk, 0, sizeof blk);
        put16(blk, 0x3400);
        n = 0;
        for (int ib = 0; ib < 8; ib++) {
            int ls = 8 * ib + 3;
            blk[4 + ib / 2] |= (uint8_t)((ls & 15) << (4 * (ib % 2)));
            n |= (ls >> 4) << (2 * ib);
        }
        put16(blk + 2, (uint16_t)n);
        memset(blk + 8, 0x69, 128);
        for (int i = 0; i < 256; i++) want[i] = 0.25f * (float)(8 * (i / 32) + 3 - 32) * (float)(i % 32 < 16 ? 13 : -22);
        KNOWN(DHSA_GGML_IQ4_XS, 256, "IQ4_XS");
        T_CHECK(got[0] == -94.25f && got[255] == -148.5f, "IQ4_XS: x0 %g x255 %g", got[0], got[255]);
#undef KNOWN
    }

    /* F16 / BF16 corner values */
    uint8_t h[8];
    put16(h, 0x3c00);     /* 1 */
    put16(h + 2, 0xc000); /* -2 */
    put16(h + 4, 0x0001); /* 2^-24 */
    put16(h + 6, 0x7bff); /* 65504 */
    T_CHECK(dhsa__dequantize_row(DHSA_GGML_F16, h, got, 4) == DHSA_OK, "F16 known");
    T_CHECK(got[0] == 1.0f && got[1] == -2.0f && got[2] == 0x1p-24f && got[3] == 65504.0f, "F16 known values");
    put16(h, 0x3f80);     /* 1 */
    put16(h + 2, 0xc040); /* -3 */
    put16(h + 4, 0x0001); /* smallest subnormal */
    put16(h + 6, 0x7f7f); /* largest finite */
    T_CHECK(dhsa__dequantize_row(DHSA_GGML_BF16, h, got, 4) == DHSA_OK, "BF16 known");
    T_CHECK(got[0] == 1.0f && got[1] == -3.0f && got[2] == 0x1p-133f && got[3] == 0x1.fep127f, "BF16 known values");
}

/* quantize -> dequantize: per block, error bounds from the rules (docs/quant.md) */
static void test_quant_error(void) {
    rng_t r = {7};
    const int64_t n = 4096;
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    uint8_t *q = malloc((size_t)dhsa__wt_row_bytes(DHSA_GGML_F32, n));
    for (int ti = 0; ti < N_TYPES; ti++) {
        uint32_t type = all_types[ti];
        for (int dist = 0; dist < 3; dist++) {
            for (int64_t i = 0; i < n; i++) {
                double v = dist == 0 ? rng_normal(&r) : dist == 1 ? 2.0 * rng_unif(&r) - 0.5 : rng_normal(&r) * 1e-3;
                if (dist == 2 && i % 97 == 0) v = 0.5; /* an outlier per few blocks */
                x[i] = (float)v;
            }
            T_CHECK(dhsa__quantize_row(type, x, q, n) == DHSA_OK, "quantize %s: %s", tname(type), dhsa_last_error());
            T_CHECK(dhsa__dequantize_row(type, q, y, n) == DHSA_OK, "dequantize %s", tname(type));
            int64_t blk = type == DHSA_GGML_F32 || type == DHSA_GGML_F16 || type == DHSA_GGML_BF16 ? 32
                          : dhsa__wt_block(type);
            double worst = 0.0, se = 0.0, sx = 0.0;
            int64_t worst_i = 0;
            for (int64_t b = 0; b < n / blk; b++) {
                double amax = 0.0, lo = 0.0, hi = 0.0;
                for (int64_t i = b * blk; i < (b + 1) * blk; i++) {
                    amax = fmax(amax, fabs(x[i]));
                    lo = fmin(lo, x[i]);
                    hi = fmax(hi, x[i]);
                }
                /* the allowed error per value, relative to the block */
                for (int64_t i = b * blk; i < (b + 1) * blk; i++) {
                    double e = fabs((double)y[i] - x[i]), bound;
                    switch (type) {
                    case DHSA_GGML_F32: bound = 0.0; break;
                    case DHSA_GGML_F16: bound = fabs(x[i]) * 0x1p-11 + 0x1p-25; break;
                    case DHSA_GGML_BF16: bound = fabs(x[i]) * 0x1p-8; break;
                    /* half a step of amax/127, the step itself rounded to f16 */
                    case DHSA_GGML_Q8_0: bound = amax / 127.0 * 0.5 * 1.002 + 1e-12; break;
                    /* the extreme maps to -8 exactly; the other side may clip to +7: one step */
                    case DHSA_GGML_Q4_0: bound = amax / 8.0 * 1.002 + 1e-12; break;
                    /* 6-bit scales of the sub-blocks, 4-bit codes: within one step
                     * (hi - lo)/15 of the super-block's widest sub-block, plus the
                     * rounding of the 6-bit min */
                    case DHSA_GGML_Q4_K: bound = (hi - lo) / 15.0 * 1.1 + 1e-12; break;
                    /* 8-bit scales, 6-bit codes: one step amax/32 of the widest sub-block */
                    case DHSA_GGML_Q6_K: bound = amax / 32.0 * 1.05 + 1e-12; break;
                    /* the min types: one step of the block's range */
                    case DHSA_GGML_Q4_1: bound = (hi - lo) / 15.0 * 1.01 + 1e-12; break;
                    case DHSA_GGML_Q5_1: bound = (hi - lo) / 31.0 * 1.01 + 1e-12; break;
                    case DHSA_GGML_Q5_0: bound = amax / 16.0 * 1.002 + 1e-12; break;
                    case DHSA_GGML_Q5_K: bound = (hi - lo) / 31.0 * 1.1 + 1e-12; break;
                    case DHSA_GGML_Q2_K: bound = (hi - lo) / 3.0 * 1.1 + 1e-12; break;
                    /* 6-bit scales, 3-bit codes: one step amax/4 */
                    case DHSA_GGML_Q3_K: bound = amax / 4.0 * 1.05 + 1e-12; break;
                    /* the grid's widest gap is 24 of its 127: half of it, and the scale's rounding */
                    default: bound = amax * QUANT_IQ4_BOUND + 1e-12; break;
                    }
                    if (e > bound && e - bound > worst) {
                        worst = e - bound;
                        worst_i = i;
                    }
                    se += e * e;
                    sx += (double)x[i] * x[i];
                }
            }
            double nmse = se / sx;
            /* typical NMSE of each rule on these inputs, with margin */
            double nmse_max = type == DHSA_GGML_F32    ? 0.0
                              : type == DHSA_GGML_F16  ? 1e-7
                              : type == DHSA_GGML_BF16 ? 1e-5
                              : type == DHSA_GGML_Q8_0 ? 1e-4
                              : type == DHSA_GGML_Q6_K ? 1e-3
                              : type == DHSA_GGML_Q5_0 || type == DHSA_GGML_Q5_1 || type == DHSA_GGML_Q5_K ? 5e-3
                              : type == DHSA_GGML_Q3_K ? QUANT_Q3K_NMSE
                              : type == DHSA_GGML_Q2_K ? QUANT_Q2K_NMSE
                                                       : 2e-2;
            if (dist == 2) nmse_max *= 10.0; /* outliers set the scale of their blocks */
            if (getenv("TEST_QUANT_VERBOSE"))
                printf("quantize %s inputs %d: NMSE %.3g (max %.3g), worst excess %.3g\n", tname(type), dist, nmse,
                       nmse_max, worst);
            T_CHECK(worst == 0.0 && nmse <= nmse_max,
                    "quantize %s (inputs %d): value %lld: %.9g -> %.9g, %.3g over its bound; NMSE %.3g (max %.1g)",
                    tname(type), dist, (long long)worst_i, x[worst_i], y[worst_i], worst, nmse, nmse_max);
        }
    }
    /* an all-zero block stays zero */
    for (int ti = 0; ti < N_TYPES; ti++) {
        memset(x, 0, 256 * sizeof(float));
        dhsa__quantize_row(all_types[ti], x, q, 256);
        dhsa__dequantize_row(all_types[ti], q, y, 256);
        int z = 1;
        for (int i = 0; i < 256; i++) z &= y[i] == 0.0f;
        T_CHECK(z, "%s: zeros do not round-trip to zeros", tname(all_types[ti]));
    }
    free(x);
    free(y);
    free(q);
}

/* --------------------------------------------------------------- matmul --- */

static const dhsa_isa isas[3] = {DHSA_ISA_SCALAR, DHSA_ISA_AVX2, DHSA_ISA_AVX512};

/* One case: every available ISA against the double reference, and the ISAs'
 * results against each other (within twice the tolerance: each is within it). */
static void mm_case(dhsa_ctx *ctx, uint32_t type, int64_t n_in, int64_t n_out, int64_t n_tok, int64_t ldx_pad,
                    int64_t ldy_pad, uint64_t seed) {
    dhsa_wmat W = make_w(type, n_out, n_in, seed);
    int64_t ldx = n_in + ldx_pad, ldy = n_out + ldy_pad;
    float *x = make_x(n_tok, ldx, seed + 1);
    float *y = malloc((size_t)(n_tok * ldy) * sizeof(float));
    dhsa_isa cur = dhsa_active_isa();
    char what[160];
    for (int k = 0; k < 3; k++) {
        if (!isa_ok(isas[k])) continue;
        dhsa_set_isa(isas[k]);
        for (int64_t i = 0; i < n_tok * ldy; i++) y[i] = -777.0f; /* padding sentinel */
        dhsa_status st = dhsa__matmul(ctx, &W, x, ldx, n_tok, y, ldy);
        snprintf(what, sizeof what, "matmul %s %s n_in %lld n_out %lld n_tok %lld ldx %lld ldy %lld", tname(type),
                 dhsa_isa_name(isas[k]), (long long)n_in, (long long)n_out, (long long)n_tok, (long long)ldx,
                 (long long)ldy);
        T_CHECK(st == DHSA_OK, "%s: %s", what, dhsa_last_error());
        cmp_t c = compare(&W, x, ldx, n_tok, y, ldy);
        cmp_check(&c, what);
        int pad_ok = 1;
        for (int64_t t = 0; t < n_tok; t++)
            for (int64_t o = n_out; o < ldy; o++) pad_ok &= y[t * ldy + o] == -777.0f;
        T_CHECK(pad_ok, "%s: wrote into y's padding (columns >= n_out)", what);
    }
    dhsa_set_isa(cur);
    free((void *)W.data);
    free(x);
    free(y);
}

static void test_matmul_shapes(void) {
    dhsa_ctx *ctx = make_ctx(2);
    for (int ti = 0; ti < N_TYPES; ti++) {
        uint32_t type = all_types[ti];
        int kq = dhsa__wt_block(type) == 256;
        int64_t n_in = kq ? 768 : dhsa__wt_block(type) == 32 ? 576 : 600; /* 2 K blocks; 600: F32 tail */
        static const int64_t toks[] = {1, 2, 3, 5, 9, 17, 64, 100};
        for (size_t k = 0; k < sizeof toks / sizeof toks[0]; k++)
            mm_case(ctx, type, n_in, 67, toks[k], k % 2 ? 5 : 0, k % 3 ? 0 : 3, 1000 + 10 * (uint64_t)ti + k);
        /* small: the tiny model's shapes */
        mm_case(ctx, type, kq ? 256 : 64, 64, 1, 0, 0, 2000 + (uint64_t)ti);
        mm_case(ctx, type, kq ? 256 : 64, 172, 7, 0, 0, 2100 + (uint64_t)ti);
        /* 513 tokens, a long row (several K blocks and panels) */
        mm_case(ctx, type, kq ? 1280 : 1056, 130, 513, 0, 1, 2200 + (uint64_t)ti);
    }
    /* F32/F16/BF16 rows of any length */
    mm_case(ctx, DHSA_GGML_F32, 1, 5, 3, 0, 0, 3000);
    mm_case(ctx, DHSA_GGML_F16, 37, 9, 20, 2, 0, 3001);
    mm_case(ctx, DHSA_GGML_BF16, 72, 70, 1, 0, 0, 3002);
    dhsa_ctx_free(ctx);
}

/* Bitwise: thread counts, and the fused route (one token at a time) against
 * the panel route (many tokens), for every ISA. */
static void test_matmul_bitwise(void) {
    dhsa_ctx *c1 = make_ctx(1), *c2 = make_ctx(2), *c3 = make_ctx(3);
    dhsa_isa cur = dhsa_active_isa();
    for (int ti = 0; ti < N_TYPES; ti++) {
        uint32_t type = all_types[ti];
        int kq = dhsa__wt_block(type) == 256;
        const int64_t n_in = kq ? 1024 : dhsa__wt_block(type) == 32 ? 1056 : 1000, n_out = 300, n_tok = 40;
        dhsa_wmat W = make_w(type, n_out, n_in, 4000 + (uint64_t)ti);
        float *x = make_x(n_tok, n_in, 4100 + (uint64_t)ti);
        size_t ybytes = (size_t)(n_tok * n_out) * sizeof(float);
        float *y1 = malloc(ybytes), *y2 = malloc(ybytes), *y3 = malloc(ybytes), *yd = malloc(ybytes);
        for (int k = 0; k < 3; k++) {
            if (!isa_ok(isas[k])) continue;
            dhsa_set_isa(isas[k]);
            const char *in = dhsa_isa_name(isas[k]);
            /* both routes are exercised: 1 and 3 tokens fused (SIMD), 40 by panels */
            T_CHECK(!dhsa__matmul_fused(type, n_tok) && (isas[k] == DHSA_ISA_SCALAR || dhsa__matmul_fused(type, 3)),
                    "%s %s: the route test does not cover both routes", tname(type), in);
            /* panel route, then the fused route's first token */
            for (int64_t nt = n_tok; nt >= 1; nt = nt == n_tok ? 1 : 0) {
                dhsa__matmul(c1, &W, x, n_in, nt, y1, n_out);
                dhsa__matmul(c2, &W, x, n_in, nt, y2, n_out);
                dhsa__matmul(c3, &W, x, n_in, nt, y3, n_out);
                size_t nb = (size_t)(nt * n_out) * sizeof(float);
                T_CHECK(memcmp(y1, y2, nb) == 0 && memcmp(y1, y3, nb) == 0,
                        "%s %s n_tok %lld: results differ between 1, 2 and 3 threads", tname(type), in, (long long)nt);
                if (nt == 1) break;
            }
            /* token by token (fused) vs all at once (panel) */
            dhsa__matmul(c2, &W, x, n_in, n_tok, y1, n_out);
            for (int64_t t = 0; t < n_tok; t++) dhsa__matmul(c2, &W, x + t * n_in, n_in, 1, yd + t * n_out, n_out);
            /* and 3 tokens at a time (fused with several tokens where it can) */
            for (int64_t t = 0; t < n_tok; t += 3) {
                int64_t nt = n_tok - t < 3 ? n_tok - t : 3;
                dhsa__matmul(c2, &W, x + t * n_in, n_in, nt, y2 + t * n_out, n_out);
            }
            int64_t diff = -1;
            for (int64_t i = 0; i < n_tok * n_out && diff < 0; i++)
                if (memcmp(&y1[i], &yd[i], 4) != 0 || memcmp(&y1[i], &y2[i], 4) != 0) diff = i;
            T_CHECK(diff < 0, "%s %s: one token at a time differs from %lld at once at token %lld row %lld (%.9g %.9g %.9g)",
                    tname(type), in, (long long)n_tok, (long long)(diff / n_out), (long long)(diff % n_out),
                    diff >= 0 ? y1[diff] : 0.0, diff >= 0 ? yd[diff] : 0.0, diff >= 0 ? y2[diff] : 0.0);
        }
        dhsa_set_isa(cur);
        free((void *)W.data);
        free(x);
        free(y1);
        free(y2);
        free(y3);
        free(yd);
    }
    dhsa_ctx_free(c1);
    dhsa_ctx_free(c2);
    dhsa_ctx_free(c3);
}

/* The comparator can fail: a wrong element, and a wrong weight. */
static void test_comparator_fails(void) {
    dhsa_ctx *ctx = make_ctx(1);
    dhsa_wmat W = make_w(DHSA_GGML_Q4_K, 16, 512, 5000);
    float *x = make_x(4, 512, 5001), *y = malloc(4 * 16 * sizeof(float));
    T_CHECK(dhsa__matmul(ctx, &W, x, 512, 4, y, 16) == DHSA_OK, "matmul for the comparator check");
    cmp_t c = compare(&W, x, 512, 4, y, 16);
    T_CHECK(cmp_ok(&c), "the right product passes (worst %.2fx of tolerance)", c.worst_ratio);
    float keep = y[2 * 16 + 5];
    y[2 * 16 + 5] += (float)(3.0 * compare(&W, x, 512, 4, y, 16).tol + 1e-3 * fabs(keep));
    c = compare(&W, x, 512, 4, y, 16);
    T_CHECK(!cmp_ok(&c) && c.worst_t == 2 && c.worst_o == 5, "one wrong element (token 2, row 5) is caught");
    y[2 * 16 + 5] = keep;
    /* one weight code changed: the product no longer matches the weights */
    ((uint8_t *)W.data)[3 * W.row_bytes + 100] ^= 0x11;
    c = compare(&W, x, 512, 4, y, 16);
    T_CHECK(!cmp_ok(&c) && c.worst_o == 3, "a changed weight (row 3) is caught (worst row %lld)", (long long)c.worst_o);
    free((void *)W.data);
    free(x);
    free(y);
    dhsa_ctx_free(ctx);
}

/* Workspace: exact on a fresh ctx, zero for the fused route, and a budget
 * below it fails before any work. */
static void test_workspace(void) {
    for (int64_t nt = 1; nt <= 64; nt *= 64) {
        dhsa_ctx *ctx = make_ctx(2);
        dhsa_wmat W = make_w(DHSA_GGML_Q8_0, 256, 512, 6000);
        float *x = make_x(nt, 512, 6001), *y = malloc((size_t)(nt * 256) * sizeof(float));
        size_t ws = dhsa__matmul_workspace(W.type, W.n_in, W.n_out, nt, dhsa_ctx_n_threads(ctx));
        T_CHECK(dhsa__matmul(ctx, &W, x, 512, nt, y, 256) == DHSA_OK, "workspace run");
        dhsa_mem_stats ms = dhsa_ctx_mem_stats(ctx);
        T_CHECK(ms.peak <= ws && (ws == 0 || ms.peak == ws),
                "n_tok %lld: workspace says %zu bytes, the ctx peaked at %zu", (long long)nt, ws, ms.peak);
        if (ws > 0) {
            dhsa_ctx_trim(ctx);
            dhsa_ctx_set_budget(ctx, ws - 1);
            dhsa_status st = dhsa__matmul(ctx, &W, x, 512, nt, y, 256);
            T_CHECK(st == DHSA_ERR_MEMORY_BUDGET && dhsa_last_error()[0], "a budget below the workspace: %s",
                    dhsa_status_str(st));
        }
        free((void *)W.data);
        free(x);
        free(y);
        dhsa_ctx_free(ctx);
    }
    T_CHECK(dhsa__matmul_workspace(DHSA_GGML_Q4_K, 100, 10, 1, 2) == 0, "workspace of a bad shape is 0");
}

/* ----------------------------------------------------- finite and errors --- */

static void test_check_finite(void) {
    for (int ti = 0; ti < N_TYPES; ti++) {
        uint32_t type = all_types[ti];
        const int64_t rows = 6, cols = dhsa__wt_block(type) == 256 ? 512 : 64;
        dhsa_wmat W = make_w(type, rows, cols, 7000 + (uint64_t)ti);
        uint8_t *d = (uint8_t *)W.data;
        T_CHECK(dhsa__wt_check_finite(type, d, rows, cols) == DHSA_OK, "%s: clean weights pass: %s", tname(type),
                dhsa_last_error());
        /* the thing to poison: a value (float types) or a block scale */
        uint8_t *row4 = d + 4 * W.row_bytes, save[4];
        int64_t off = 0, len = 2;
        switch (type) {
        case DHSA_GGML_F32: off = 4 * 9; len = 4; break;
        case DHSA_GGML_F16:
        case DHSA_GGML_BF16: off = 2 * 9; break;
        case DHSA_GGML_Q8_0: off = 34; break;               /* second block's d */
        case DHSA_GGML_Q4_0: off = 18; break;
        case DHSA_GGML_Q4_K: off = 144 + 2; break;          /* second super-block's dmin */
        case DHSA_GGML_Q6_K: off = 210 + 208; break;        /* second super-block's d */
        case DHSA_GGML_Q4_1: off = 20 + 2; break;           /* second block's m */
        case DHSA_GGML_Q5_0: off = 22; break;
        case DHSA_GGML_Q5_1: off = 24 + 2; break;
        case DHSA_GGML_IQ4_NL: off = 18; break;
        case DHSA_GGML_Q2_K: off = 84 + 82; break;          /* second super-block's dmin */
        case DHSA_GGML_Q3_K: off = 110 + 108; break;
        case DHSA_GGML_Q5_K: off = 176 + 2; break;
        default: off = 136; break;                          /* IQ4_XS: second super-block's d */
        }
        memcpy(save, row4 + off, (size_t)len);
        if (len == 4) {
            float nan = NAN;
            memcpy(row4 + off, &nan, 4);
        } else if (type == DHSA_GGML_BF16) {
            put16(row4 + off, 0x7fc1);
        } else {
            int inf = type == DHSA_GGML_Q4_K || type == DHSA_GGML_Q5_K || type == DHSA_GGML_Q2_K || type == DHSA_GGML_Q5_1;
            put16(row4 + off, inf ? 0xfc00 /* -Inf */ : 0x7e01 /* NaN */);
        }
        dhsa_status st = dhsa__wt_check_finite(type, d, rows, cols);
        const char *e = dhsa_last_error();
        T_CHECK(st == DHSA_ERR_NONFINITE && strstr(e, "row 4") != NULL, "%s: a NaN/Inf %s in row 4: %s (%s)",
                tname(type), len == 4 || dhsa__wt_block(type) == 1 ? "value" : "block scale", dhsa_status_str(st), e);
        memcpy(row4 + off, save, (size_t)len);
        free(d);
    }
}

static int err_ok(dhsa_status st, dhsa_status want) {
    const char *e = dhsa_last_error();
    return st == want && e && strlen(e) > 10;
}

static void test_bad_args(void) {
    dhsa_ctx *ctx = make_ctx(1);
    dhsa_wmat W = make_w(DHSA_GGML_Q4_K, 8, 256, 8000);
    float x[2 * 300], y[2 * 16];
    memset(x, 0, sizeof x);
    dhsa_wmat B = W;
    B.n_in = 100; /* not a multiple of 256 */
    T_CHECK(err_ok(dhsa__matmul(ctx, &B, x, 300, 1, y, 16), DHSA_ERR_SHAPE), "n_in 100 with Q4_K: %s",
            dhsa_last_error());
    B = W;
    B.type = 16; /* IQ2_XXS: known to ggml, not supported */
    T_CHECK(err_ok(dhsa__matmul(ctx, &B, x, 300, 1, y, 16), DHSA_ERR_UNSUPPORTED) && strstr(dhsa_last_error(), "IQ2_XXS"),
            "IQ2_XXS: %s", dhsa_last_error());
    B.type = 999;
    T_CHECK(err_ok(dhsa__matmul(ctx, &B, x, 300, 1, y, 16), DHSA_ERR_UNSUPPORTED), "type 999: %s", dhsa_last_error());
    T_CHECK(err_ok(dhsa__matmul(ctx, NULL, x, 300, 1, y, 16), DHSA_ERR_INVALID_ARG), "W NULL");
    T_CHECK(err_ok(dhsa__matmul(ctx, &W, NULL, 300, 1, y, 16), DHSA_ERR_INVALID_ARG), "x NULL");
    T_CHECK(err_ok(dhsa__matmul(ctx, &W, x, 300, 1, NULL, 16), DHSA_ERR_INVALID_ARG), "y NULL");
    T_CHECK(err_ok(dhsa__matmul(NULL, &W, x, 300, 1, y, 16), DHSA_ERR_INVALID_ARG), "ctx NULL");
    B = W;
    B.data = NULL;
    T_CHECK(err_ok(dhsa__matmul(ctx, &B, x, 300, 1, y, 16), DHSA_ERR_INVALID_ARG), "W->data NULL");
    T_CHECK(err_ok(dhsa__matmul(ctx, &W, x, 200, 1, y, 16), DHSA_ERR_SHAPE), "ldx < n_in: %s", dhsa_last_error());
    T_CHECK(err_ok(dhsa__matmul(ctx, &W, x, 300, 1, y, 4), DHSA_ERR_SHAPE), "ldy < n_out: %s", dhsa_last_error());
    T_CHECK(err_ok(dhsa__matmul(ctx, &W, x, 300, -1, y, 16), DHSA_ERR_SHAPE), "n_tok < 0");
    B = W;
    B.row_bytes = 100;
    T_CHECK(err_ok(dhsa__matmul(ctx, &B, x, 300, 1, y, 16), DHSA_ERR_SHAPE), "row_bytes too small: %s",
            dhsa_last_error());
    T_CHECK(err_ok(dhsa__matmul(ctx, &W, x, 300, 2, x + 100, 16), DHSA_ERR_INVALID_ARG), "x and y overlap: %s",
            dhsa_last_error());
    y[0] = 12345.0f;
    T_CHECK(dhsa__matmul(ctx, &W, x, 300, 0, y, 16) == DHSA_OK && y[0] == 12345.0f, "n_tok = 0 does nothing");
    float buf[256];
    T_CHECK(err_ok(dhsa__dequantize_row(DHSA_GGML_Q8_0, W.data, buf, 40), DHSA_ERR_SHAPE), "dequantize 40 of Q8_0");
    T_CHECK(err_ok(dhsa__dequantize_row(15, W.data, buf, 256), DHSA_ERR_UNSUPPORTED), "dequantize type 15 (Q8_K)");
    T_CHECK(err_ok(dhsa__dequantize_row(DHSA_GGML_Q8_0, NULL, buf, 32), DHSA_ERR_INVALID_ARG), "dequantize NULL");
    for (int i = 0; i < 256; i++) buf[i] = (float)i;
    buf[17] = NAN;
    uint8_t qb[210];
    T_CHECK(err_ok(dhsa__quantize_row(DHSA_GGML_Q6_K, buf, qb, 256), DHSA_ERR_NONFINITE), "quantize a NaN: %s",
            dhsa_last_error());
    T_CHECK(err_ok(dhsa__quantize_row(DHSA_GGML_Q4_0, buf, qb, 31), DHSA_ERR_SHAPE), "quantize 31 of Q4_0");
    T_CHECK(err_ok(dhsa__wt_check_finite(DHSA_GGML_Q4_K, W.data, 8, 100), DHSA_ERR_SHAPE), "check_finite bad cols");
    T_CHECK(err_ok(dhsa__wmat_row(&W, 8, buf), DHSA_ERR_INVALID_ARG), "wmat_row 8 of 8: %s", dhsa_last_error());
    T_CHECK(err_ok(dhsa__wmat_row(&W, -1, buf), DHSA_ERR_INVALID_ARG), "wmat_row -1");
    /* wmat_row is the dequantized row */
    float a[256], b[256];
    T_CHECK(dhsa__wmat_row(&W, 5, a) == DHSA_OK &&
                dhsa__dequantize_row(W.type, (const uint8_t *)W.data + 5 * W.row_bytes, b, 256) == DHSA_OK &&
                memcmp(a, b, sizeof a) == 0,
            "wmat_row 5 is row 5 dequantized");
    /* sizes */
    T_CHECK(dhsa__wt_row_bytes(DHSA_GGML_Q4_K, 4096) == 16 * 144 && dhsa__wt_row_bytes(DHSA_GGML_Q6_K, 256) == 210 &&
                dhsa__wt_row_bytes(DHSA_GGML_Q4_0, 64) == 36 && dhsa__wt_row_bytes(DHSA_GGML_Q8_0, 32) == 34 &&
                dhsa__wt_row_bytes(DHSA_GGML_BF16, 3) == 6 && dhsa__wt_row_bytes(DHSA_GGML_Q8_0, 33) == -1 &&
                dhsa__wt_row_bytes(16, 256) == -1 && dhsa__wt_row_bytes(DHSA_GGML_Q5_K, 512) == 352 &&
                dhsa__wt_row_bytes(DHSA_GGML_Q2_K, 256) == 84 && dhsa__wt_row_bytes(DHSA_GGML_Q3_K, 256) == 110 &&
                dhsa__wt_row_bytes(DHSA_GGML_IQ4_XS, 256) == 136 && dhsa__wt_row_bytes(DHSA_GGML_Q4_1, 64) == 40 &&
                dhsa__wt_row_bytes(DHSA_GGML_Q5_0, 32) == 22 && dhsa__wt_row_bytes(DHSA_GGML_Q5_1, 32) == 24 &&
                dhsa__wt_row_bytes(DHSA_GGML_IQ4_NL, 32) == 18,
            "row sizes");
    T_CHECK(dhsa__wt_supported(DHSA_GGML_Q6_K) && !dhsa__wt_supported(16) && dhsa__wt_supported(DHSA_GGML_Q5_K) && dhsa__wt_block(DHSA_GGML_Q4_K) == 256 &&
                dhsa__wt_block_bytes(DHSA_GGML_Q4_0) == 18 && dhsa__wt_block(99) == 0,
            "type table");
    free((void *)W.data);
    dhsa_ctx_free(ctx);
}

/* The benchmark checks before it times: a small run passes, and one wrong
 * output (the --corrupt hook) fails with exit 1 and no timing. Needs the CLI
 * (DHSA_CLI, set by tests/run.sh). */
static void test_bench_cli(void) {
    const char *cli = getenv("DHSA_CLI");
    if (!cli) {
        T_SKIP(3, "bench matmul: DHSA_CLI is not set (make test sets it)");
        return;
    }
    char cmd[512];
    const char *args = "bench matmul --type Q4_K --n-in 512 --n-out 70 --tok 3 --runs 1 --threads 2";
    snprintf(cmd, sizeof cmd, "%s %s > /dev/null 2>&1", cli, args);
    int rc = system(cmd);
    T_CHECK(rc == 0, "`dhsa %s` exits 0 (status %d)", args, rc);
    snprintf(cmd, sizeof cmd, "%s %s --corrupt 2>&1 | grep -q 'check FAILED'", cli, args);
    T_CHECK(system(cmd) == 0, "`dhsa %s --corrupt` reports a failed check", args);
    snprintf(cmd, sizeof cmd, "%s %s --corrupt > /dev/null 2>&1", cli, args);
    rc = system(cmd);
    T_CHECK(rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) == 1, "`dhsa %s --corrupt` exits 1 (status %d)", args, rc);
}

int main(void) {
    printf("test_quant: active ISA %s\n", dhsa_isa_name(dhsa_active_isa()));
    test_dequant_known();
    test_dequant_random();
    test_quant_error();
    test_bad_args();
    test_check_finite();
    test_comparator_fails();
    test_workspace();
    test_matmul_bitwise();
    test_matmul_shapes();
    test_bench_cli();
    printf("test_quant: products vs double: largest error %.3f of its tolerance, largest NMSE %.2g\n", g_worst_ratio,
           g_worst_nmse);
    return t_report("test_quant");
}
