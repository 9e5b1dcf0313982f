/* formats.c: the weight types (contract in formats.h, numbers in
 * docs/quant.md): the type table, the scalar dequantization by each
 * format's formulas (the reference every SIMD dequantizer is held to), the
 * quantizers used for conversion and test fixtures, and the finite check.
 * Includes nothing else of src/matmul.
 *
 * Run: make build/tests/test_quant && build/tests/test_quant.
 */
#include "matmul/formats.h"

#include "core/internal.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* ---------------------------------------------------------------- types --- */

typedef struct {
    uint32_t type;
    const char *name;
    int64_t block, bytes;
} type_info;

/* The order of DHSA_QK_TYPE_LIST (formats.h). */
static const type_info types[DHSA_QK_N_TYPES] = {
    {DHSA_GGML_F32, "F32", 1, 4},         {DHSA_GGML_F16, "F16", 1, 2},
    {DHSA_GGML_BF16, "BF16", 1, 2},       {DHSA_GGML_Q8_0, "Q8_0", 32, 34},
    {DHSA_GGML_Q4_0, "Q4_0", 32, 18},     {DHSA_GGML_Q4_K, "Q4_K", 256, 144},
    {DHSA_GGML_Q6_K, "Q6_K", 256, 210},   {DHSA_GGML_Q4_1, "Q4_1", 32, 20},
    {DHSA_GGML_Q5_0, "Q5_0", 32, 22},     {DHSA_GGML_Q5_1, "Q5_1", 32, 24},
    {DHSA_GGML_Q2_K, "Q2_K", 256, 84},    {DHSA_GGML_Q3_K, "Q3_K", 256, 110},
    {DHSA_GGML_Q5_K, "Q5_K", 256, 176},   {DHSA_GGML_IQ4_NL, "IQ4_NL", 32, 18},
    {DHSA_GGML_IQ4_XS, "IQ4_XS", 256, 136},
};

static const type_info *info(uint32_t type) {
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (types[i].type == type) return &types[i];
    return NULL;
}

int dhsa__wt_index(uint32_t type) { return info(type) ? (int)(info(type) - types) : -1; }
const char *dhsa__wt_name(uint32_t type) { return info(type) ? info(type)->name : NULL; }

int dhsa__wt_supported(uint32_t type) { return info(type) != NULL; }
int64_t dhsa__wt_block(uint32_t type) { return info(type) ? info(type)->block : 0; }
int64_t dhsa__wt_block_bytes(uint32_t type) { return info(type) ? info(type)->bytes : 0; }

int64_t dhsa__wt_row_bytes(uint32_t type, int64_t n) {
    const type_info *ti = info(type);
    if (!ti || n < 0 || n % ti->block) return -1;
    if (n / ti->block > INT64_MAX / ti->bytes) return -1;
    return n / ti->block * ti->bytes;
}

/* "Q4_K" or "type 17" for error sentences. */
static const char *type_label(uint32_t type, char *buf, size_t n) {
    const type_info *ti = info(type);
    if (ti) return ti->name;
    const char *g = dhsa_ggml_type_name(type);
    if (g && strcmp(g, "?") != 0) snprintf(buf, n, "%s (ggml type %u)", g, (unsigned)type);
    else snprintf(buf, n, "ggml type %u", (unsigned)type);
    return buf;
}

dhsa_status dhsa__wt_unsupported(const char *fn, uint32_t type) {
    char b[48];
    return dhsa__fail(DHSA_ERR_UNSUPPORTED,
                      "%s: weights of type %s are not supported (" DHSA_QK_TYPE_LIST " are)", fn,
                      type_label(type, b, sizeof b));
}

static inline uint32_t rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* ------------------------------------------------------ scalar dequant --- */

/* Block layouts (byte offsets), ggml's:
 *   Q8_0 [34]:  d f16 @0, qs int8[32] @2                 x = d*q
 *   Q4_0 [18]:  d f16 @0, qs u8[16] @2                   x[j] = d*((qs[j]&15)-8), x[j+16] = d*((qs[j]>>4)-8)
 *   Q4_K [144]: d @0, dmin @2, scales[12] @4, qs[128] @16; value i = 64u + 32h + l (u < 4, h < 2, l < 32)
 *               is nibble h of qs[32u + l], sub-block 2u + h: x = (d*sc)*q - dmin*m
 *   Q6_K [210]: ql[128] @0, qh[64] @128, scales int8[16] @192, d @208; value i = 128n + 32p + l
 *               (n < 2, p < 4, l < 32): low 4 bits = nibble p>>1 of ql[64n + 32(p&1) + l], high 2 bits =
 *               bits 2p..2p+1 of qh[32n + l]; x = (d*scales[i/16])*(q-32)
 *   Q4_1 [20]:  d @0, m @2, qs u8[16] @4                 x[j] = d*q + m, q the low (j < 16) or high nibble of qs[j%16]
 *   Q5_0 [22]:  d @0, qh u32 @2, qs u8[16] @6            q = nibble | bit j of qh << 4 (j < 32), x = d*(q-16)
 *   Q5_1 [24]:  d @0, m @2, qh u32 @4, qs u8[16] @8      as Q5_0, x = d*q + m
 *   IQ4_NL [18]: d @0, qs u8[16] @2                      nibbles as Q4_0, x = d*grid[q]
 *   Q2_K [84]:  scales u8[16] @0, qs u8[64] @16, d @80, dmin @82; value i = 128n + 32j + 16h + l (n < 2,
 *               j < 4, h < 2, l < 16): q = bits 2j, 2j+1 of qs[32n + 16h + l], sub-block i/16 with scale
 *               byte sc: x = (d*(sc&15))*q - dmin*(sc>>4)
 *   Q3_K [110]: hmask u8[32] @0, qs u8[64] @32, scales u8[12] @96, d @108; i as in Q2_K: low 2 bits as Q2_K,
 *               bit 2 = bit 4n+j of hmask[16h + l]; x = (d*(sc-32))*(q-4), sc of dhsa__q3k_scale()
 *   Q5_K [176]: d @0, dmin @2, scales[12] @4, qh u8[32] @16, qs u8[128] @48; as Q4_K, plus bit 2u+h of
 *               qh[l] as bit 4 of q: x = (d*sc)*q - dmin*m
 *   IQ4_XS [136]: d @0, scales_h u16 @2, scales_l u8[4] @4, qs u8[128] @8; sub-block ib of 32 as IQ4_NL
 *               on qs[16ib ..], x = (d*(ls-32))*grid[q], ls of dhsa__iq4xs_scale()
 * Every product here is exact in F32 (at most 24 significant bits; IQ4_XS
 * 11 + 5 + 7 = 23), and the types with an additive min round once (the
 * product before it is exact), so these formulas give the same floats
 * whatever the order or FMA. */
void dhsa__wt_dequant_scalar(uint32_t type, const uint8_t *row, int64_t k0, int64_t kn, float *dst) {
    switch (type) {
    case DHSA_GGML_F32: memcpy(dst, (const float *)row + k0, (size_t)kn * sizeof(float)); return;
    case DHSA_GGML_F16: {
        const uint8_t *p = row + 2 * k0;
        for (int64_t i = 0; i < kn; i++) dst[i] = dhsa__wt_f16(p + 2 * i);
        return;
    }
    case DHSA_GGML_BF16: {
        const uint8_t *p = row + 2 * k0;
        for (int64_t i = 0; i < kn; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = dhsa_bf16_to_f32(h);
        }
        return;
    }
    case DHSA_GGML_Q8_0:
        for (int64_t b = 0; b < kn / 32; b++, dst += 32) {
            const uint8_t *blk = row + (k0 / 32 + b) * 34;
            float d = dhsa__wt_f16(blk);
            for (int j = 0; j < 32; j++) dst[j] = d * (float)(int8_t)blk[2 + j];
        }
        return;
    case DHSA_GGML_Q4_0:
        for (int64_t b = 0; b < kn / 32; b++, dst += 32) {
            const uint8_t *blk = row + (k0 / 32 + b) * 18;
            float d = dhsa__wt_f16(blk);
            for (int j = 0; j < 16; j++) {
                dst[j] = d * (float)((blk[2 + j] & 15) - 8);
                dst[j + 16] = d * (float)((blk[2 + j] >> 4) - 8);
            }
        }
        return;
    case DHSA_GGML_Q4_K:
        for (int64_t b = 0; b < kn / 256; b++, dst += 256) {
            const uint8_t *blk = row + (k0 / 256 + b) * 144;
            float d = dhsa__wt_f16(blk), dmin = dhsa__wt_f16(blk + 2);
            const uint8_t *qs = blk + 16;
            for (int u = 0; u < 4; u++)
                for (int h = 0; h < 2; h++) {
                    int sc, m;
                    dhsa__q4k_scale_min(blk + 4, 2 * u + h, &sc, &m);
                    float d1 = d * (float)sc, m1 = dmin * (float)m;
                    for (int l = 0; l < 32; l++) {
                        int q = h ? qs[32 * u + l] >> 4 : qs[32 * u + l] & 15;
                        dst[64 * u + 32 * h + l] = d1 * (float)q - m1;
                    }
                }
        }
        return;
    case DHSA_GGML_Q6_K:
        for (int64_t b = 0; b < kn / 256; b++, dst += 256) {
            const uint8_t *blk = row + (k0 / 256 + b) * 210;
            const uint8_t *ql = blk, *qh = blk + 128;
            const int8_t *sc = (const int8_t *)(blk + 192);
            float d = dhsa__wt_f16(blk + 208);
            for (int n = 0; n < 2; n++)
                for (int p = 0; p < 4; p++)
                    for (int l = 0; l < 32; l++) {
                        int i = 128 * n + 32 * p + l;
                        int lo = ql[64 * n + 32 * (p & 1) + l] >> (4 * (p >> 1)) & 15;
                        int hi = qh[32 * n + l] >> (2 * p) & 3;
                        dst[i] = d * (float)sc[i / 16] * (float)((lo | hi << 4) - 32);
                    }
        }
        return;
    case DHSA_GGML_Q4_1:
    case DHSA_GGML_Q5_0:
    case DHSA_GGML_Q5_1:
    case DHSA_GGML_IQ4_NL: {
        const int64_t bb = dhsa__wt_block_bytes(type);
        for (int64_t b = 0; b < kn / 32; b++, dst += 32) {
            const uint8_t *blk = row + (k0 / 32 + b) * bb;
            float d = dhsa__wt_f16(blk);
            float m = type == DHSA_GGML_Q4_1 || type == DHSA_GGML_Q5_1 ? dhsa__wt_f16(blk + 2) : 0.0f;
            uint32_t qh = type == DHSA_GGML_Q5_0 ? rd32(blk + 2) : type == DHSA_GGML_Q5_1 ? rd32(blk + 4) : 0;
            const uint8_t *qs = blk + (type == DHSA_GGML_Q5_0 ? 6 : type == DHSA_GGML_Q5_1 ? 8 : type == DHSA_GGML_Q4_1 ? 4 : 2);
            for (int j = 0; j < 32; j++) {
                int q = (j < 16 ? qs[j] & 15 : qs[j - 16] >> 4) | (int)((qh >> j) & 1u) << 4;
                switch (type) {
                case DHSA_GGML_Q4_1:
                case DHSA_GGML_Q5_1: dst[j] = d * (float)q + m; break;
                case DHSA_GGML_Q5_0: dst[j] = d * (float)(q - 16); break;
                default: dst[j] = d * (float)dhsa__iq4_grid[q]; break;
                }
            }
        }
        return;
    }
    case DHSA_GGML_Q2_K:
    case DHSA_GGML_Q3_K:
        for (int64_t b = 0; b < kn / 256; b++, dst += 256) {
            const int q2 = type == DHSA_GGML_Q2_K;
            const uint8_t *blk = row + (k0 / 256 + b) * (q2 ? 84 : 110);
            const uint8_t *qs = blk + (q2 ? 16 : 32), *hm = blk;
            float d = dhsa__wt_f16(blk + (q2 ? 80 : 108)), dmin = q2 ? dhsa__wt_f16(blk + 82) : 0.0f;
            for (int i = 0; i < 256; i++) {
                int n = i / 128, j = i % 128 / 32, h = i % 32 / 16, l = i % 16;
                int q = qs[32 * n + 16 * h + l] >> (2 * j) & 3;
                if (q2) {
                    int sc = blk[i / 16];
                    dst[i] = d * (float)(sc & 15) * (float)q - dmin * (float)(sc >> 4);
                } else {
                    q -= (hm[16 * h + l] >> (4 * n + j) & 1) ? 0 : 4;
                    dst[i] = d * (float)(dhsa__q3k_scale(blk + 96, i / 16) - 32) * (float)q;
                }
            }
        }
        return;
    case DHSA_GGML_Q5_K:
        for (int64_t b = 0; b < kn / 256; b++, dst += 256) {
            const uint8_t *blk = row + (k0 / 256 + b) * 176;
            float d = dhsa__wt_f16(blk), dmin = dhsa__wt_f16(blk + 2);
            const uint8_t *qh = blk + 16, *qs = blk + 48;
            for (int u = 0; u < 4; u++)
                for (int h = 0; h < 2; h++) {
                    int sc, m;
                    dhsa__q4k_scale_min(blk + 4, 2 * u + h, &sc, &m);
                    float d1 = d * (float)sc, m1 = dmin * (float)m;
                    for (int l = 0; l < 32; l++) {
                        int q = (h ? qs[32 * u + l] >> 4 : qs[32 * u + l] & 15) | (qh[l] >> (2 * u + h) & 1) << 4;
                        dst[64 * u + 32 * h + l] = d1 * (float)q - m1;
                    }
                }
        }
        return;
    case DHSA_GGML_IQ4_XS:
        for (int64_t b = 0; b < kn / 256; b++, dst += 256) {
            const uint8_t *blk = row + (k0 / 256 + b) * 136;
            float d = dhsa__wt_f16(blk);
            for (int ib = 0; ib < 8; ib++) {
                float dl = d * (float)(dhsa__iq4xs_scale(blk, ib) - 32);
                const uint8_t *qs = blk + 8 + 16 * ib;
                for (int j = 0; j < 16; j++) {
                    dst[32 * ib + j] = dl * (float)dhsa__iq4_grid[qs[j] & 15];
                    dst[32 * ib + 16 + j] = dl * (float)dhsa__iq4_grid[qs[j] >> 4];
                }
            }
        }
        return;
    default: return;
    }
}

dhsa_status dhsa__wt_check_n(const char *fn, uint32_t type, int64_t n) {
    const type_info *ti = info(type);
    if (!ti) return dhsa__wt_unsupported(fn, type);
    if (n < 0 || n % ti->block)
        return dhsa__fail(DHSA_ERR_SHAPE, "%s: n = %lld is not a non-negative multiple of the %s block (%lld values)",
                          fn, (long long)n, ti->name, (long long)ti->block);
    if (dhsa__wt_row_bytes(type, n) < 0)
        return dhsa__fail(DHSA_ERR_TOO_LARGE, "%s: a row of %lld values is too large", fn, (long long)n);
    return DHSA_OK;
}

/* ----------------------------------------------------------- quantize --- */

static inline void put_half(uint8_t *p, float x) {
    uint16_t h = dhsa_f32_to_f16(x);
    memcpy(p, &h, 2);
}

/* The f16 value a scale is stored as (clamped to the largest finite half). */
static inline float as_half(float x) {
    if (x > 65504.0f) x = 65504.0f;
    if (x < -65504.0f) x = -65504.0f;
    return dhsa_f16_to_f32(dhsa_f32_to_f16(x));
}

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Nearest q in [lo, hi] with x ~ s*q + o (s of either sign), or q0 when s == 0. */
static inline int nearest_q(float x, float s, float o, int lo, int hi, int q0) {
    if (!(s != 0.0f)) return q0;
    return clampi((int)lrintf((x - o) / s), lo, hi);
}

/* Q8_0 / Q4_0: one scale per block of 32 from the block's extreme value. */
static void quant_q8_0(const float *x, uint8_t *blk) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    float d = as_half(amax / 127.0f);
    put_half(blk, d);
    for (int j = 0; j < 32; j++) blk[2 + j] = (uint8_t)(int8_t)nearest_q(x[j], d, 0.0f, -127, 127, 0);
}

static void quant_q4_0(const float *x, uint8_t *blk) {
    /* the value of largest magnitude maps to -8 exactly, the other side to
     * at most +7 (ggml's rule), so d carries the sign of -extreme */
    float ext = 0.0f;
    for (int j = 0; j < 32; j++)
        if (fabsf(x[j]) > fabsf(ext)) ext = x[j];
    float d = as_half(ext / -8.0f);
    put_half(blk, d);
    for (int j = 0; j < 16; j++) {
        int lo = 8 + (d != 0.0f ? clampi((int)lrintf(x[j] / d), -8, 7) : 0);
        int hi = 8 + (d != 0.0f ? clampi((int)lrintf(x[j + 16] / d), -8, 7) : 0);
        blk[2 + j] = (uint8_t)(lo | hi << 4);
    }
}

/* Squared error of a sub-block of n values coded as s*q + o, q in [lo, hi]. */
static double sub_err(const float *x, int n, float s, float o, int lo, int hi, int q0) {
    double e = 0.0;
    for (int j = 0; j < n; j++) {
        float v = s * (float)nearest_q(x[j], s, o, lo, hi, q0) + o;
        e += ((double)x[j] - v) * ((double)x[j] - v);
    }
    return e;
}

/* The K types with a min (Q4_K, Q5_K, Q2_K): per sub-block of len values,
 * x ~ sc*d*q - m*dmin with q in [0, qmax] and 0 <= sc, m <= cmax; the
 * unrounded sub-block scale is (max - min)/qmax and the min is -min(0, min
 * x); d and dmin take the largest of each over cmax; each rounded (sc, m) is
 * then moved by -1..+1 if that lowers the sub-block's squared error. Writes
 * *d, *dmin (as stored), sc[], m[] and the codes q[256]. */
static void quant_k_affine(const float *x, int n_sub, int len, int qmax, int cmax, float *d_out, float *dmin_out,
                           int *sc, int *m, uint8_t *q) {
    float scale[16], mn[16], smax = 0.0f, mmax = 0.0f;
    for (int j = 0; j < n_sub; j++) {
        float lo = 0.0f, hi = -INFINITY;
        for (int l = 0; l < len; l++) {
            lo = fminf(lo, x[len * j + l]);
            hi = fmaxf(hi, x[len * j + l]);
        }
        scale[j] = (hi - lo) / (float)qmax;
        mn[j] = -lo;
        smax = fmaxf(smax, scale[j]);
        mmax = fmaxf(mmax, mn[j]);
    }
    float d = as_half(smax / (float)cmax), dmin = as_half(mmax / (float)cmax);
    for (int j = 0; j < n_sub; j++) {
        int sc0 = d > 0.0f ? clampi((int)lrintf(scale[j] / d), 0, cmax) : 0;
        int m0 = dmin > 0.0f ? clampi((int)lrintf(mn[j] / dmin), 0, cmax) : 0;
        double best = INFINITY;
        sc[j] = sc0;
        m[j] = m0;
        for (int a = sc0 - 1; a <= sc0 + 1; a++)
            for (int b = m0 - 1; b <= m0 + 1; b++) {
                if (a < 0 || a > cmax || b < 0 || b > cmax) continue;
                double e = sub_err(x + len * j, len, d * (float)a, -(dmin * (float)b), 0, qmax, 0);
                if (e < best) {
                    best = e;
                    sc[j] = a;
                    m[j] = b;
                }
            }
    }
    for (int i = 0; i < 256; i++) {
        int j = i / len;
        q[i] = (uint8_t)nearest_q(x[i], d * (float)sc[j], -(dmin * (float)m[j]), 0, qmax, 0);
    }
    *d_out = d;
    *dmin_out = dmin;
}

/* Q4_K / Q5_K: sub-blocks of 32, 6-bit (sc, m) packed in 12 bytes, 4- or
 * 5-bit codes (Q5_K: the fifth bit in qh). */
static void quant_q45_k(const float *x, uint8_t *blk, int five) {
    float d, dmin;
    int sc[8], m[8];
    uint8_t q[256];
    quant_k_affine(x, 8, 32, five ? 31 : 15, 63, &d, &dmin, sc, m, q);
    put_half(blk, d);
    put_half(blk + 2, dmin);
    uint8_t *s = blk + 4;
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)((sc[j] & 63) | (sc[j + 4] >> 4) << 6);
        s[j + 4] = (uint8_t)((m[j] & 63) | (m[j + 4] >> 4) << 6);
        s[j + 8] = (uint8_t)((sc[j + 4] & 15) | (m[j + 4] & 15) << 4);
    }
    uint8_t *qs = blk + (five ? 48 : 16), *qh = blk + 16;
    if (five) memset(qh, 0, 32);
    for (int u = 0; u < 4; u++)
        for (int l = 0; l < 32; l++) {
            int a = q[64 * u + l], b = q[64 * u + 32 + l];
            qs[32 * u + l] = (uint8_t)((a & 15) | (b & 15) << 4);
            if (five) qh[l] |= (uint8_t)((a >> 4) << (2 * u) | (b >> 4) << (2 * u + 1));
        }
}

/* Q2_K: 16 sub-blocks of 16, 4-bit (sc, m), 2-bit codes. */
static void quant_q2_k(const float *x, uint8_t *blk) {
    float d, dmin;
    int sc[16], m[16];
    uint8_t q[256];
    quant_k_affine(x, 16, 16, 3, 15, &d, &dmin, sc, m, q);
    for (int j = 0; j < 16; j++) blk[j] = (uint8_t)(sc[j] | m[j] << 4);
    memset(blk + 16, 0, 64);
    for (int i = 0; i < 256; i++) {
        int n = i / 128, j = i % 128 / 32, h = i % 32 / 16, l = i % 16;
        blk[16 + 32 * n + 16 * h + l] |= (uint8_t)(q[i] << (2 * j));
    }
    put_half(blk + 80, d);
    put_half(blk + 82, dmin);
}

/* Q3_K: per sub-block of 16, x ~ d*(sc-32)*q with q in [-4, 3]; the value
 * of largest magnitude maps to -4 (scale = extreme / -4), the scale of
 * largest magnitude to code -32 (d = that scale / -32), each rounded code
 * is moved by -1..+1 if that lowers the squared error; codes nearest. */
static void quant_q3_k(const float *x, uint8_t *blk) {
    float scale[16], smax = 0.0f;
    for (int j = 0; j < 16; j++) {
        float ext = 0.0f;
        for (int l = 0; l < 16; l++)
            if (fabsf(x[16 * j + l]) > fabsf(ext)) ext = x[16 * j + l];
        scale[j] = ext / -4.0f;
        if (fabsf(scale[j]) > fabsf(smax)) smax = scale[j];
    }
    float d = as_half(smax / -32.0f);
    int sc[16];
    for (int j = 0; j < 16; j++) {
        int s0 = d != 0.0f ? clampi((int)lrintf(scale[j] / d), -32, 31) : 0;
        double best = INFINITY;
        sc[j] = s0;
        for (int a = s0 - 1; a <= s0 + 1; a++) {
            if (a < -32 || a > 31) continue;
            double e = sub_err(x + 16 * j, 16, d * (float)a, 0.0f, -4, 3, 0);
            if (e < best) {
                best = e;
                sc[j] = a;
            }
        }
    }
    memset(blk, 0, 108);
    for (int j = 0; j < 16; j++) {
        int c = sc[j] + 32;
        blk[96 + (j < 8 ? j : j - 8)] |= (uint8_t)((c & 15) << (j < 8 ? 0 : 4));
        blk[96 + 8 + j % 4] |= (uint8_t)((c >> 4) << (2 * (j / 4)));
    }
    for (int i = 0; i < 256; i++) {
        int n = i / 128, j = i % 128 / 32, h = i % 32 / 16, l = i % 16;
        int q = (d * (float)sc[i / 16]) != 0.0f ? nearest_q(x[i], d * (float)sc[i / 16], 0.0f, -4, 3, 0) + 4 : 4;
        blk[32 + 32 * n + 16 * h + l] |= (uint8_t)((q & 3) << (2 * j));
        blk[16 * h + l] |= (uint8_t)((q >> 2) << (4 * n + j));
    }
    put_half(blk + 108, d);
}

/* Q4_1 / Q5_1: x ~ d*q + m over the block's range, m = min x, d = (max -
 * min) / qmax (ggml's rule), both rounded to f16 first; codes nearest. */
static void quant_q451(const float *x, uint8_t *blk, int five) {
    const int qmax = five ? 31 : 15;
    float lo = x[0], hi = x[0];
    for (int j = 1; j < 32; j++) {
        lo = fminf(lo, x[j]);
        hi = fmaxf(hi, x[j]);
    }
    float d = as_half((hi - lo) / (float)qmax), m = as_half(lo);
    put_half(blk, d);
    put_half(blk + 2, m);
    uint8_t *qs = blk + (five ? 8 : 4);
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        int a = nearest_q(x[j], d, m, 0, qmax, 0), b = nearest_q(x[j + 16], d, m, 0, qmax, 0);
        qs[j] = (uint8_t)((a & 15) | (b & 15) << 4);
        qh |= (uint32_t)(a >> 4) << j | (uint32_t)(b >> 4) << (j + 16);
    }
    if (five) memcpy(blk + 4, &qh, 4);
}

/* Q5_0: as Q4_0 with 5-bit codes: the extreme maps to -16 exactly. */
static void quant_q5_0(const float *x, uint8_t *blk) {
    float ext = 0.0f;
    for (int j = 0; j < 32; j++)
        if (fabsf(x[j]) > fabsf(ext)) ext = x[j];
    float d = as_half(ext / -16.0f);
    put_half(blk, d);
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        int a = 16 + (d != 0.0f ? clampi((int)lrintf(x[j] / d), -16, 15) : 0);
        int b = 16 + (d != 0.0f ? clampi((int)lrintf(x[j + 16] / d), -16, 15) : 0);
        blk[6 + j] = (uint8_t)((a & 15) | (b & 15) << 4);
        qh |= (uint32_t)(a >> 4) << j | (uint32_t)(b >> 4) << (j + 16);
    }
    memcpy(blk + 2, &qh, 4);
}

/* Index of the grid value nearest v (the grid is increasing). */
static int iq4_nearest(float v) {
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (v < (float)dhsa__iq4_grid[mid]) hi = mid;
        else lo = mid;
    }
    return fabsf(v - (float)dhsa__iq4_grid[lo]) <= fabsf(v - (float)dhsa__iq4_grid[hi]) ? lo : hi;
}

/* Squared error of n values coded on the grid with scale s (codes nearest). */
static double iq4_err(const float *x, int n, float s, uint8_t *q) {
    double e = 0.0;
    for (int j = 0; j < n; j++) {
        int k = s != 0.0f ? iq4_nearest(x[j] / s) : 8;
        if (q) q[j] = (uint8_t)k;
        double v = (double)(s * (float)dhsa__iq4_grid[k]);
        e += ((double)x[j] - v) * ((double)x[j] - v);
    }
    return e;
}

/* The scale of n values on the IQ4 grid (unrounded): of the extreme mapped
 * to -127 or to 113, each then refitted once by least squares on its codes,
 * the candidate with the least squared error (a short form of ggml's search). */
static float iq4_scale(const float *x, int n) {
    float ext = 0.0f;
    for (int j = 0; j < n; j++)
        if (fabsf(x[j]) > fabsf(ext)) ext = x[j];
    if (ext == 0.0f) return 0.0f;
    float best_s = ext / -127.0f;
    double best = iq4_err(x, n, best_s, NULL);
    const float starts[2] = {ext / -127.0f, ext / 113.0f};
    for (int c = 0; c < 2; c++) {
        uint8_t q[32];
        double e = iq4_err(x, n, starts[c], q), sxq = 0.0, sqq = 0.0;
        if (e < best) {
            best = e;
            best_s = starts[c];
        }
        for (int j = 0; j < n; j++) {
            sxq += (double)x[j] * dhsa__iq4_grid[q[j]];
            sqq += (double)dhsa__iq4_grid[q[j]] * dhsa__iq4_grid[q[j]];
        }
        float s = (float)(sxq / sqq);
        e = iq4_err(x, n, s, NULL);
        if (e < best) {
            best = e;
            best_s = s;
        }
    }
    return best_s;
}

/* IQ4_NL: one f16 scale per block of 32 (iq4_scale, rounded), codes nearest. */
static void quant_iq4_nl(const float *x, uint8_t *blk) {
    float d = as_half(iq4_scale(x, 32));
    put_half(blk, d);
    uint8_t q[32];
    iq4_err(x, 32, d, q);
    for (int j = 0; j < 16; j++) blk[2 + j] = (uint8_t)(q[j] | q[j + 16] << 4);
}

/* IQ4_XS: per sub-block of 32 the iq4_scale; the one of largest magnitude
 * maps to code -32 (d = it / -32), the others to the nearest 6-bit code, each
 * moved by -1..+1 if that lowers the squared error; codes nearest. */
static void quant_iq4_xs(const float *x, uint8_t *blk) {
    float scale[8], smax = 0.0f;
    for (int ib = 0; ib < 8; ib++) {
        scale[ib] = iq4_scale(x + 32 * ib, 32);
        if (fabsf(scale[ib]) > fabsf(smax)) smax = scale[ib];
    }
    float d = as_half(smax / -32.0f);
    put_half(blk, d);
    unsigned sh = 0;
    memset(blk + 4, 0, 4);
    for (int ib = 0; ib < 8; ib++) {
        int l0 = d != 0.0f ? clampi((int)lrintf(scale[ib] / d), -32, 31) : 0, l = l0;
        double best = INFINITY;
        for (int a = l0 - 1; a <= l0 + 1; a++) {
            if (a < -32 || a > 31) continue;
            double e = iq4_err(x + 32 * ib, 32, d * (float)a, NULL);
            if (e < best) {
                best = e;
                l = a;
            }
        }
        int c = l + 32;
        blk[4 + ib / 2] |= (uint8_t)((c & 15) << (4 * (ib % 2)));
        sh |= (unsigned)(c >> 4) << (2 * ib);
        uint8_t q[32];
        iq4_err(x + 32 * ib, 32, d * (float)l, q);
        for (int j = 0; j < 16; j++) blk[8 + 16 * ib + j] = (uint8_t)(q[j] | q[j + 16] << 4);
    }
    blk[2] = (uint8_t)sh;
    blk[3] = (uint8_t)(sh >> 8);
}

/* Q6_K: per sub-block of 16, x ~ sc*d*(q-32) with q in [0, 63]; the value
 * of largest magnitude maps to -32 exactly (scale = extreme / -32), d is the
 * largest |scale| over 127, and each rounded int8 scale is moved by -1..+1
 * if that lowers the sub-block's squared error. */
static void quant_q6_k(const float *x, uint8_t *blk) {
    float scale[16], amax = 0.0f;
    for (int j = 0; j < 16; j++) {
        float ext = 0.0f;
        for (int l = 0; l < 16; l++)
            if (fabsf(x[16 * j + l]) > fabsf(ext)) ext = x[16 * j + l];
        scale[j] = ext / -32.0f;
        amax = fmaxf(amax, fabsf(scale[j]));
    }
    float d = as_half(amax / 127.0f);
    put_half(blk + 208, d);
    int sc[16];
    for (int j = 0; j < 16; j++) {
        int s0 = d > 0.0f ? clampi((int)lrintf(scale[j] / d), -127, 127) : 0;
        double best = INFINITY;
        sc[j] = s0;
        for (int a = s0 - 1; a <= s0 + 1; a++) {
            if (a < -127 || a > 127) continue;
            double e = sub_err(x + 16 * j, 16, d * (float)a, 0.0f, -32, 31, 0);
            if (e < best) {
                best = e;
                sc[j] = a;
            }
        }
        blk[192 + j] = (uint8_t)(int8_t)sc[j];
    }
    uint8_t q[256];
    for (int i = 0; i < 256; i++) q[i] = (uint8_t)(nearest_q(x[i], d * (float)sc[i / 16], 0.0f, -32, 31, 0) + 32);
    for (int n = 0; n < 2; n++)
        for (int l = 0; l < 32; l++) {
            const uint8_t *v = q + 128 * n + l; /* v[0], v[32], v[64], v[96] */
            blk[64 * n + l] = (uint8_t)((v[0] & 15) | (v[64] & 15) << 4);
            blk[64 * n + 32 + l] = (uint8_t)((v[32] & 15) | (v[96] & 15) << 4);
            blk[128 + 32 * n + l] = (uint8_t)(v[0] >> 4 | (v[32] >> 4) << 2 | (v[64] >> 4) << 4 | (v[96] >> 4) << 6);
        }
}

dhsa_status dhsa__quantize_row(uint32_t type, const float *src, void *dst, int64_t n) {
    dhsa_status st = dhsa__wt_check_n("dhsa__quantize_row", type, n);
    if (st != DHSA_OK) return st;
    if (n && (!src || !dst)) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa__quantize_row: src or dst is NULL");
    uint8_t *out = dst;
    switch (type) {
    case DHSA_GGML_F32: memcpy(dst, src, (size_t)n * sizeof(float)); return DHSA_OK;
    case DHSA_GGML_F16:
        for (int64_t i = 0; i < n; i++) put_half(out + 2 * i, src[i]);
        return DHSA_OK;
    case DHSA_GGML_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = dhsa_f32_to_bf16(src[i]);
            memcpy(out + 2 * i, &h, 2);
        }
        return DHSA_OK;
    default: break;
    }
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(src[i]))
            return dhsa__fail(DHSA_ERR_NONFINITE, "dhsa__quantize_row: value %lld is %s; a %s block needs finite values",
                              (long long)i, isnan(src[i]) ? "NaN" : "infinite", info(type)->name);
    int64_t blk = info(type)->block, bytes = info(type)->bytes;
    for (int64_t b = 0; b < n / blk; b++) {
        const float *x = src + b * blk;
        uint8_t *o = out + b * bytes;
        switch (type) {
        case DHSA_GGML_Q8_0: quant_q8_0(x, o); break;
        case DHSA_GGML_Q4_0: quant_q4_0(x, o); break;
        case DHSA_GGML_Q4_K: quant_q45_k(x, o, 0); break;
        case DHSA_GGML_Q5_K: quant_q45_k(x, o, 1); break;
        case DHSA_GGML_Q6_K: quant_q6_k(x, o); break;
        case DHSA_GGML_Q2_K: quant_q2_k(x, o); break;
        case DHSA_GGML_Q3_K: quant_q3_k(x, o); break;
        case DHSA_GGML_Q4_1: quant_q451(x, o, 0); break;
        case DHSA_GGML_Q5_1: quant_q451(x, o, 1); break;
        case DHSA_GGML_Q5_0: quant_q5_0(x, o); break;
        case DHSA_GGML_IQ4_NL: quant_iq4_nl(x, o); break;
        case DHSA_GGML_IQ4_XS: quant_iq4_xs(x, o); break;
        default: break;
        }
    }
    return DHSA_OK;
}

/* ------------------------------------------------------- finite check --- */

static inline int half_bad(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return (h & 0x7c00u) == 0x7c00u;
}

/* Column of the first non-finite value or block scale of a row, -1 if none. */
static int64_t row_bad(uint32_t type, const uint8_t *row, int64_t n, const char **what) {
    *what = "value";
    switch (type) {
    case DHSA_GGML_F32: {
        uint32_t acc = 0;
        for (int64_t i = 0; i < n; i++) { /* branch-free scan first: rows are long */
            uint32_t u;
            memcpy(&u, row + 4 * i, 4);
            acc |= (uint32_t)((u & 0x7f800000u) == 0x7f800000u);
        }
        if (!acc) return -1;
        for (int64_t i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, row + 4 * i, 4);
            if ((u & 0x7f800000u) == 0x7f800000u) return i;
        }
        return -1;
    }
    case DHSA_GGML_F16:
    case DHSA_GGML_BF16: {
        uint16_t mask = type == DHSA_GGML_F16 ? 0x7c00u : 0x7f80u;
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, row + 2 * i, 2);
            if ((h & mask) == mask) return i;
        }
        return -1;
    }
    default: break;
    }
    *what = "block scale";
    int64_t blk = info(type)->block, bytes = info(type)->bytes;
    for (int64_t b = 0; b < n / blk; b++) {
        const uint8_t *p = row + b * bytes;
        int bad = 0;
        switch (type) {
        case DHSA_GGML_Q8_0:
        case DHSA_GGML_Q4_0: bad = half_bad(p); break;
        case DHSA_GGML_Q4_K:
        case DHSA_GGML_Q5_K:
        case DHSA_GGML_Q4_1:
        case DHSA_GGML_Q5_1: bad = half_bad(p) || half_bad(p + 2); break; /* d, dmin or m */
        case DHSA_GGML_Q5_0:
        case DHSA_GGML_IQ4_NL:
        case DHSA_GGML_IQ4_XS: bad = half_bad(p); break;
        case DHSA_GGML_Q6_K: bad = half_bad(p + 208); break;
        case DHSA_GGML_Q2_K: bad = half_bad(p + 80) || half_bad(p + 82); break;
        case DHSA_GGML_Q3_K: bad = half_bad(p + 108); break;
        default: break;
        }
        if (bad) return b * blk;
    }
    return -1;
}

dhsa_status dhsa__wt_check_finite(uint32_t type, const void *data, int64_t n_rows, int64_t n_cols) {
    dhsa_status st = dhsa__wt_check_n("dhsa__wt_check_finite", type, n_cols);
    if (st != DHSA_OK) return st;
    if (n_rows < 0) return dhsa__fail(DHSA_ERR_SHAPE, "dhsa__wt_check_finite: n_rows = %lld", (long long)n_rows);
    if (n_rows && n_cols && !data) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa__wt_check_finite: data is NULL");
    int64_t rb = dhsa__wt_row_bytes(type, n_cols);
    for (int64_t r = 0; r < n_rows; r++) {
        const char *what;
        int64_t c = row_bad(type, (const uint8_t *)data + r * rb, n_cols, &what);
        if (c >= 0)
            return dhsa__fail(DHSA_ERR_NONFINITE, "%s weights: row %lld of %lld has a NaN or infinite %s at column %lld",
                              info(type)->name, (long long)r, (long long)n_rows, what, (long long)c);
    }
    return DHSA_OK;
}
