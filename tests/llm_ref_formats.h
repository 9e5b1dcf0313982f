/* llm_ref_formats.h: the bottom of the independent reference (llm_ref.h):
 * its error sentence, IEEE half and bfloat16 from their bits, the ggml
 * block formats decoded from their byte layouts (llmref_dequant) and a
 * simple encoder for fixtures (llmref_quantize), and the deterministic
 * random numbers the fixtures draw. Uses nothing of dhsa. Included by
 * llm_ref.h (which tests include); the contract is llm_ref.h's.
 */
#ifndef DHSA_TESTS_LLM_REF_FORMATS_H
#define DHSA_TESTS_LLM_REF_FORMATS_H

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --------------------------------------------------------------------- */
/* Errors                                                                 */

static char llmref_errbuf[512];

/* The sentence of the last failure of an llmref_* call. */
static inline const char *llmref_error(void) { return llmref_errbuf; }

static inline int llmref__fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(llmref_errbuf, sizeof llmref_errbuf, fmt, ap);
    va_end(ap);
    return -1;
}

/* --------------------------------------------------------------------- */
/* Scalars: IEEE half and bfloat16, decoded from their bits               */

/* f16: 1 sign, 5 exponent (bias 15), 10 mantissa bits. Exact in double. */
static inline double llmref_f16_to_double(uint16_t h) {
    int e = (h >> 10) & 31, f = h & 1023;
    double v;
    if (e == 0) v = ldexp((double)f, -24); /* zero and subnormals: f * 2^-24 */
    else if (e == 31) v = f ? NAN : INFINITY;
    else v = ldexp((double)(f + 1024), e - 25); /* (1 + f/1024) * 2^(e-15) */
    return (h >> 15) ? -v : v;
}

/* bf16: the top 16 bits of an IEEE float. */
static inline double llmref_bf16_to_double(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Nearest f16 (ties to even; overflow to inf). For the fixture encoder. */
static inline uint16_t llmref_double_to_f16(double x) {
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    double a = fabs(x);
    if (isnan(x)) return 0x7e00;
    if (a >= 65520.0) return sign | 0x7c00; /* half-way above 65504 rounds up */
    if (a < 0x1p-14) return sign | (uint16_t)nearbyint(a * 0x1p24); /* 1024 = smallest normal */
    int e;
    double f = frexp(a, &e); /* a = f * 2^e, f in [0.5, 1) */
    double mant = nearbyint((2.0 * f - 1.0) * 1024.0);
    int E = e - 1 + 15;
    if (mant == 1024.0) {
        mant = 0;
        E++;
    }
    if (E >= 31) return sign | 0x7c00;
    return (uint16_t)(sign | (E << 10) | (int)mant);
}

/* Nearest bf16 of (float)x (ties to even). */
static inline uint16_t llmref_double_to_bf16(double x) {
    float f = (float)x;
    uint32_t b;
    memcpy(&b, &f, 4);
    if (isnan(f)) return (uint16_t)((b >> 16) | 0x40);
    b += 0x7fffu + ((b >> 16) & 1u);
    return (uint16_t)(b >> 16);
}

static inline uint16_t llmref__rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline void llmref__wr16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

/* --------------------------------------------------------------------- */
/* Weight types: the ggml block formats                                   */

enum {
    LLMREF_F32 = 0,
    LLMREF_F16 = 1,
    LLMREF_Q4_0 = 2,
    LLMREF_Q4_1 = 3,
    LLMREF_Q5_0 = 6,
    LLMREF_Q5_1 = 7,
    LLMREF_Q8_0 = 8,
    LLMREF_Q2_K = 10,
    LLMREF_Q3_K = 11,
    LLMREF_Q4_K = 12,
    LLMREF_Q5_K = 13,
    LLMREF_Q6_K = 14,
    LLMREF_IQ4_NL = 20,
    LLMREF_IQ4_XS = 23,
    LLMREF_BF16 = 30
};

/* Values per block (1 for the float types); 0 for a type not known here. */
static inline int64_t llmref_type_block(uint32_t type) {
    switch (type) {
    case LLMREF_F32: case LLMREF_F16: case LLMREF_BF16: return 1;
    case LLMREF_Q8_0: case LLMREF_Q4_0: case LLMREF_Q4_1: case LLMREF_Q5_0: case LLMREF_Q5_1: case LLMREF_IQ4_NL:
        return 32;
    case LLMREF_Q2_K: case LLMREF_Q3_K: case LLMREF_Q4_K: case LLMREF_Q5_K: case LLMREF_Q6_K: case LLMREF_IQ4_XS:
        return 256;
    default: return 0;
    }
}

/* Bytes per block; 0 for a type not known here.
 *   Q8_0 (34): f16 d, int8 qs[32]                    x = d q
 *   Q4_0 (18): f16 d, uint8 qs[16]                   x[j] = d (lo4 - 8), x[j+16] = d (hi4 - 8)
 *   Q4_K (144): f16 d, f16 dmin, scales[12], qs[128] x = d sc q - dmin m (8 sub-blocks of 32)
 *   Q6_K (210): ql[128], qh[64], int8 scales[16], f16 d   x = d sc (q - 32) (16 sub-blocks of 16)
 *   Q4_1 (20): f16 d, f16 m, qs[16] (nibbles as Q4_0)  x = d q + m
 *   Q5_0 (22): f16 d, uint32 qh, qs[16]: bit j of qh is the fifth bit of value j   x = d (q - 16)
 *   Q5_1 (24): f16 d, f16 m, uint32 qh, qs[16]        x = d q + m
 *   IQ4_NL (18): f16 d, qs[16] (nibbles as Q4_0)       x = d grid[q] (llmref__iq4_grid)
 *   Q2_K (84): scales[16] (sc low nibble, m high), qs[64] 2-bit codes, f16 d, f16 dmin
 *              x = d sc q - dmin m (16 sub-blocks of 16; see llmref__k2_where)
 *   Q3_K (110): hmask[32], qs[64] 2-bit codes, scales[12] (6-bit, biased by 32), f16 d
 *              x = d (sc - 32) (q - 4 + 4 hbit)
 *   Q5_K (176): f16 d, f16 dmin, scales[12] as Q4_K, qh[32], qs[128]   x = d sc q - dmin m
 *   IQ4_XS (136): f16 d, uint16 scales_h, scales_l[4], qs[128]   x = d (ls - 32) grid[q] (8 sub-blocks of 32) */
static inline int64_t llmref_type_block_bytes(uint32_t type) {
    switch (type) {
    case LLMREF_F32: return 4;
    case LLMREF_F16: case LLMREF_BF16: return 2;
    case LLMREF_Q8_0: return 34;
    case LLMREF_Q4_0: return 18;
    case LLMREF_Q4_K: return 144;
    case LLMREF_Q6_K: return 210;
    case LLMREF_Q4_1: return 20;
    case LLMREF_Q5_0: return 22;
    case LLMREF_Q5_1: return 24;
    case LLMREF_IQ4_NL: return 18;
    case LLMREF_Q2_K: return 84;
    case LLMREF_Q3_K: return 110;
    case LLMREF_Q5_K: return 176;
    case LLMREF_IQ4_XS: return 136;
    default: return 0;
    }
}

/* Bytes of n values; -1 when the type is unknown or n not a whole number of
 * blocks. */
static inline int64_t llmref_type_bytes(uint32_t type, int64_t n) {
    int64_t blk = llmref_type_block(type);
    if (!blk || n < 0 || n % blk) return -1;
    return n / blk * llmref_type_block_bytes(type);
}

static inline const char *llmref_type_name(uint32_t type) {
    switch (type) {
    case LLMREF_F32: return "F32";
    case LLMREF_F16: return "F16";
    case LLMREF_BF16: return "BF16";
    case LLMREF_Q8_0: return "Q8_0";
    case LLMREF_Q4_0: return "Q4_0";
    case LLMREF_Q4_K: return "Q4_K";
    case LLMREF_Q6_K: return "Q6_K";
    case LLMREF_Q4_1: return "Q4_1";
    case LLMREF_Q5_0: return "Q5_0";
    case LLMREF_Q5_1: return "Q5_1";
    case LLMREF_IQ4_NL: return "IQ4_NL";
    case LLMREF_Q2_K: return "Q2_K";
    case LLMREF_Q3_K: return "Q3_K";
    case LLMREF_Q5_K: return "Q5_K";
    case LLMREF_IQ4_XS: return "IQ4_XS";
    default: return "?";
    }
}

/* Q4_K packs 8 six-bit scales and 8 six-bit mins in 12 bytes: bytes 0-3
 * hold scales 0-3 (low 6 bits) and the top 2 bits of scales 4-7; bytes
 * 4-7 the same for the mins; bytes 8-11 the low 4 bits of scale 4-7 (low
 * nibble) and min 4-7 (high nibble). */
static inline void llmref__q4k_scale_min(const uint8_t *s, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Q6_K: value v (0..255) of a block: which bytes and bits hold it. The
 * block is two halves of 128; in a half, value r = 32 quarter + l takes
 * the low (quarters 0, 1) or high (2, 3) nibble of ql[64 half + l +
 * 32 (quarter & 1)] and bits 2 quarter, 2 quarter + 1 of qh[32 half + l]. */
static inline void llmref__q6k_where(int v, int *ql_i, int *ql_shift, int *qh_i, int *qh_shift) {
    int half = v / 128, r = v % 128, quarter = r / 32, l = r % 32;
    *ql_i = 64 * half + l + 32 * (quarter & 1);
    *ql_shift = quarter >= 2 ? 4 : 0;
    *qh_i = 32 * half + l;
    *qh_shift = 2 * quarter;
}

/* IQ4_NL / IQ4_XS: the value each 4-bit code stands for (a fixed grid). */
static const int llmref__iq4_grid[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* Q2_K / Q3_K: value v (0..255) of a block: the byte of the 64 code bytes
 * and the bit holding its 2-bit code, and (Q3_K) the byte of the 32 hmask
 * bytes and the bit holding its high bit. The block is two halves of 128;
 * in a half, value r = 32 j + 16 h + l takes bits 2j, 2j+1 of byte 32 half
 * + 16 h + l, and its high bit is bit 4 half + j of hmask[16 h + l]. */
static inline void llmref__k2_where(int v, int *qi, int *qshift, int *hi, int *hshift) {
    int half = v / 128, r = v % 128, j = r / 32, h = r % 32 / 16, l = r % 16;
    *qi = 32 * half + 16 * h + l;
    *qshift = 2 * j;
    *hi = 16 * h + l;
    *hshift = 4 * half + j;
}

/* Q3_K: the 6-bit code of scale j (0..15) from the 12 scale bytes: low 4
 * bits in the low (j < 8) or high (j >= 8) nibble of byte j % 8, high 2
 * bits at bits 2 (j / 4), 2 (j / 4) + 1 of byte 8 + j % 4. */
static inline int llmref__q3k_scale(const uint8_t *s, int j) {
    int lo = (s[j % 8] >> (j < 8 ? 0 : 4)) & 15;
    int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    return lo | (hi << 4);
}

static inline uint32_t llmref__rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* out[0..n) = the values of n weights stored as ggml type `type` at src (n
 * a whole number of blocks). Exact: every product of f16 scales and small
 * integers is representable in double. -1 for an unknown type or a ragged
 * n. */
static inline int llmref_dequant(uint32_t type, const void *src, int64_t n, double *out) {
    const uint8_t *p = src;
    if (llmref_type_bytes(type, n) < 0)
        return llmref__fail("dequant: %lld values of type %u (%s): unknown type or not whole blocks", (long long)n,
                            type, llmref_type_name(type));
    switch (type) {
    case LLMREF_F32:
        for (int64_t i = 0; i < n; i++) {
            uint32_t b = (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 | (uint32_t)p[4 * i + 2] << 16 |
                         (uint32_t)p[4 * i + 3] << 24;
            float f;
            memcpy(&f, &b, 4);
            out[i] = f;
        }
        return 0;
    case LLMREF_F16:
        for (int64_t i = 0; i < n; i++) out[i] = llmref_f16_to_double(llmref__rd16(p + 2 * i));
        return 0;
    case LLMREF_BF16:
        for (int64_t i = 0; i < n; i++) out[i] = llmref_bf16_to_double(llmref__rd16(p + 2 * i));
        return 0;
    case LLMREF_Q8_0:
        for (int64_t b = 0; b < n / 32; b++, p += 34) {
            double d = llmref_f16_to_double(llmref__rd16(p));
            for (int j = 0; j < 32; j++) out[32 * b + j] = d * (double)(int8_t)p[2 + j];
        }
        return 0;
    case LLMREF_Q4_0:
        for (int64_t b = 0; b < n / 32; b++, p += 18) {
            double d = llmref_f16_to_double(llmref__rd16(p));
            for (int j = 0; j < 16; j++) {
                out[32 * b + j] = d * ((p[2 + j] & 15) - 8);
                out[32 * b + j + 16] = d * ((p[2 + j] >> 4) - 8);
            }
        }
        return 0;
    case LLMREF_Q4_K:
        for (int64_t b = 0; b < n / 256; b++, p += 144) {
            double d = llmref_f16_to_double(llmref__rd16(p)), dmin = llmref_f16_to_double(llmref__rd16(p + 2));
            const uint8_t *qs = p + 16;
            for (int j = 0; j < 8; j++) { /* sub-block j: nibble j&1 of bytes 32 (j/2) .. +32 */
                int sc, mn;
                llmref__q4k_scale_min(p + 4, j, &sc, &mn);
                for (int l = 0; l < 32; l++) {
                    int q = (qs[32 * (j / 2) + l] >> (4 * (j & 1))) & 15;
                    out[256 * b + 32 * j + l] = d * sc * q - dmin * mn;
                }
            }
        }
        return 0;
    case LLMREF_Q6_K:
        for (int64_t b = 0; b < n / 256; b++, p += 210) {
            const uint8_t *ql = p, *qh = p + 128;
            const int8_t *sc = (const int8_t *)(p + 192);
            double d = llmref_f16_to_double(llmref__rd16(p + 208));
            for (int v = 0; v < 256; v++) {
                int qli, qls, qhi, qhs;
                llmref__q6k_where(v, &qli, &qls, &qhi, &qhs);
                int q = ((ql[qli] >> qls) & 15) | (((qh[qhi] >> qhs) & 3) << 4);
                out[256 * b + v] = d * sc[v / 16] * (q - 32);
            }
        }
        return 0;
    case LLMREF_Q4_1: case LLMREF_Q5_0: case LLMREF_Q5_1: case LLMREF_IQ4_NL: {
        const int64_t bb = llmref_type_block_bytes(type);
        for (int64_t b = 0; b < n / 32; b++, p += bb) {
            double d = llmref_f16_to_double(llmref__rd16(p));
            double m = type == LLMREF_Q4_1 || type == LLMREF_Q5_1 ? llmref_f16_to_double(llmref__rd16(p + 2)) : 0;
            uint32_t qh = type == LLMREF_Q5_0 ? llmref__rd32(p + 2) : type == LLMREF_Q5_1 ? llmref__rd32(p + 4) : 0;
            const uint8_t *qs = p + bb - 16; /* the nibbles close every one of these blocks */
            for (int j = 0; j < 32; j++) {
                int q = ((qs[j % 16] >> (j < 16 ? 0 : 4)) & 15) | (int)((qh >> j) & 1) << 4;
                out[32 * b + j] = type == LLMREF_IQ4_NL ? d * llmref__iq4_grid[q]
                                  : type == LLMREF_Q5_0 ? d * (q - 16)
                                                        : d * q + m;
            }
        }
        return 0;
    }
    case LLMREF_Q2_K: case LLMREF_Q3_K: {
        const int q2 = type == LLMREF_Q2_K;
        for (int64_t b = 0; b < n / 256; b++, p += q2 ? 84 : 110) {
            double d = llmref_f16_to_double(llmref__rd16(p + (q2 ? 80 : 108)));
            double dmin = q2 ? llmref_f16_to_double(llmref__rd16(p + 82)) : 0;
            const uint8_t *qs = p + (q2 ? 16 : 32);
            for (int v = 0; v < 256; v++) {
                int qi, qsh, hi, hsh;
                llmref__k2_where(v, &qi, &qsh, &hi, &hsh);
                int q = (qs[qi] >> qsh) & 3;
                if (q2) {
                    out[256 * b + v] = d * (p[v / 16] & 15) * q - dmin * (p[v / 16] >> 4);
                } else {
                    q += ((p[hi] >> hsh) & 1) ? 0 : -4;
                    out[256 * b + v] = d * (llmref__q3k_scale(p + 96, v / 16) - 32) * q;
                }
            }
        }
        return 0;
    }
    case LLMREF_Q5_K:
        for (int64_t b = 0; b < n / 256; b++, p += 176) {
            double d = llmref_f16_to_double(llmref__rd16(p)), dmin = llmref_f16_to_double(llmref__rd16(p + 2));
            const uint8_t *qh = p + 16, *qs = p + 48;
            for (int j = 0; j < 8; j++) { /* sub-block j: nibble j&1 of bytes 32 (j/2) .., bit j of qh */
                int sc, mn;
                llmref__q4k_scale_min(p + 4, j, &sc, &mn);
                for (int l = 0; l < 32; l++) {
                    int q = ((qs[32 * (j / 2) + l] >> (4 * (j & 1))) & 15) | ((qh[l] >> j) & 1) << 4;
                    out[256 * b + 32 * j + l] = d * sc * q - dmin * mn;
                }
            }
        }
        return 0;
    case LLMREF_IQ4_XS:
        for (int64_t b = 0; b < n / 256; b++, p += 136) {
            double d = llmref_f16_to_double(llmref__rd16(p));
            unsigned sh = llmref__rd16(p + 2);
            for (int ib = 0; ib < 8; ib++) {
                int ls = ((p[4 + ib / 2] >> (4 * (ib % 2))) & 15) | (int)((sh >> (2 * ib)) & 3) << 4;
                const uint8_t *qs = p + 8 + 16 * ib;
                for (int j = 0; j < 32; j++)
                    out[256 * b + 32 * ib + j] = d * (ls - 32) * llmref__iq4_grid[(qs[j % 16] >> (j < 16 ? 0 : 4)) & 15];
            }
        }
        return 0;
    default:
        return -1;
    }
}

static inline int llmref__clampi(double v, int lo, int hi) {
    double r = nearbyint(v);
    return r < lo ? lo : r > hi ? hi : (int)r;
}

/* dst = an encoding of src[0..n) as ggml type `type` (n a whole number of
 * blocks; dst holds llmref_type_bytes(type, n) bytes). Simple rules, not
 * ggml's: a block's scale from its largest magnitude, values rounded to
 * the nearest code. Any valid block serves a fixture: the reference reads
 * back whatever bytes were written. */
static inline int llmref_quantize(uint32_t type, const double *src, int64_t n, void *dst) {
    uint8_t *p = dst;
    if (llmref_type_bytes(type, n) < 0)
        return llmref__fail("quantize: %lld values of type %u: unknown type or not whole blocks", (long long)n, type);
    switch (type) {
    case LLMREF_F32:
        for (int64_t i = 0; i < n; i++) {
            float f = (float)src[i];
            uint32_t b;
            memcpy(&b, &f, 4);
            for (int k = 0; k < 4; k++) p[4 * i + k] = (uint8_t)(b >> (8 * k));
        }
        return 0;
    case LLMREF_F16:
        for (int64_t i = 0; i < n; i++) llmref__wr16(p + 2 * i, llmref_double_to_f16(src[i]));
        return 0;
    case LLMREF_BF16:
        for (int64_t i = 0; i < n; i++) llmref__wr16(p + 2 * i, llmref_double_to_bf16(src[i]));
        return 0;
    case LLMREF_Q8_0:
        for (int64_t b = 0; b < n / 32; b++, p += 34) {
            const double *x = src + 32 * b;
            double amax = 0;
            for (int j = 0; j < 32; j++) amax = fmax(amax, fabs(x[j]));
            uint16_t dh = llmref_double_to_f16(amax / 127);
            double d = llmref_f16_to_double(dh);
            llmref__wr16(p, dh);
            for (int j = 0; j < 32; j++) p[2 + j] = (uint8_t)(int8_t)(d > 0 ? llmref__clampi(x[j] / d, -127, 127) : 0);
        }
        return 0;
    case LLMREF_Q4_0:
        for (int64_t b = 0; b < n / 32; b++, p += 18) {
            const double *x = src + 32 * b;
            double amax = 0;
            for (int j = 0; j < 32; j++) amax = fmax(amax, fabs(x[j]));
            uint16_t dh = llmref_double_to_f16(amax / 7);
            double d = llmref_f16_to_double(dh);
            llmref__wr16(p, dh);
            for (int j = 0; j < 16; j++) {
                int lo = d > 0 ? llmref__clampi(x[j] / d, -8, 7) + 8 : 8;
                int hi = d > 0 ? llmref__clampi(x[j + 16] / d, -8, 7) + 8 : 8;
                p[2 + j] = (uint8_t)(lo | (hi << 4));
            }
        }
        return 0;
    case LLMREF_Q4_K:
        for (int64_t b = 0; b < n / 256; b++, p += 144) {
            const double *x = src + 256 * b;
            double scale[8], minv[8], smax = 0, mmax = 0;
            for (int j = 0; j < 8; j++) { /* sub-block j covers [lo, hi] with lo <= 0 */
                double lo = 0, hi = 0;
                for (int l = 0; l < 32; l++) {
                    lo = fmin(lo, x[32 * j + l]);
                    hi = fmax(hi, x[32 * j + l]);
                }
                scale[j] = (hi - lo) / 15;
                minv[j] = -lo;
                smax = fmax(smax, scale[j]);
                mmax = fmax(mmax, minv[j]);
            }
            uint16_t dh = llmref_double_to_f16(smax / 63), mh = llmref_double_to_f16(mmax / 63);
            double d = llmref_f16_to_double(dh), dmin = llmref_f16_to_double(mh);
            int sc[8], mn[8];
            for (int j = 0; j < 8; j++) {
                sc[j] = d > 0 ? llmref__clampi(scale[j] / d, 0, 63) : 0;
                mn[j] = dmin > 0 ? llmref__clampi(minv[j] / dmin, 0, 63) : 0;
            }
            llmref__wr16(p, dh);
            llmref__wr16(p + 2, mh);
            uint8_t *s = p + 4;
            for (int j = 0; j < 4; j++) {
                s[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
                s[j + 4] = (uint8_t)((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
                s[j + 8] = (uint8_t)((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
            }
            uint8_t *qs = p + 16;
            memset(qs, 0, 128);
            for (int j = 0; j < 8; j++) {
                double step = d * sc[j], off = dmin * mn[j];
                for (int l = 0; l < 32; l++) {
                    int q = step > 0 ? llmref__clampi((x[32 * j + l] + off) / step, 0, 15) : 0;
                    qs[32 * (j / 2) + l] |= (uint8_t)(q << (4 * (j & 1)));
                }
            }
        }
        return 0;
    case LLMREF_Q6_K:
        for (int64_t b = 0; b < n / 256; b++, p += 210) {
            const double *x = src + 256 * b;
            double scale[16], smax = 0;
            for (int j = 0; j < 16; j++) {
                double amax = 0;
                for (int l = 0; l < 16; l++) amax = fmax(amax, fabs(x[16 * j + l]));
                scale[j] = amax / 31;
                smax = fmax(smax, scale[j]);
            }
            uint16_t dh = llmref_double_to_f16(smax / 127);
            double d = llmref_f16_to_double(dh);
            int8_t *sc = (int8_t *)(p + 192);
            for (int j = 0; j < 16; j++) sc[j] = (int8_t)(d > 0 ? llmref__clampi(scale[j] / d, -128, 127) : 0);
            llmref__wr16(p + 208, dh);
            memset(p, 0, 192);
            for (int v = 0; v < 256; v++) {
                double step = d * sc[v / 16];
                int q = step > 0 ? llmref__clampi(x[v] / step, -32, 31) + 32 : 32;
                int qli, qls, qhi, qhs;
                llmref__q6k_where(v, &qli, &qls, &qhi, &qhs);
                p[qli] |= (uint8_t)((q & 15) << qls);
                p[128 + qhi] |= (uint8_t)((q >> 4) << qhs);
            }
        }
        return 0;
    case LLMREF_Q4_1: case LLMREF_Q5_1: case LLMREF_Q5_0: case LLMREF_IQ4_NL: {
        const int64_t bb = llmref_type_block_bytes(type);
        for (int64_t b = 0; b < n / 32; b++, p += bb) {
            const double *x = src + 32 * b;
            double lo = x[0], hi = x[0], amax = 0;
            for (int j = 0; j < 32; j++) {
                lo = fmin(lo, x[j]);
                hi = fmax(hi, x[j]);
                amax = fmax(amax, fabs(x[j]));
            }
            int qmax = type == LLMREF_Q4_1 ? 15 : 31;
            double scale = type == LLMREF_Q5_0 ? amax / 15 : type == LLMREF_IQ4_NL ? amax / 113 : (hi - lo) / qmax;
            uint16_t dh = llmref_double_to_f16(scale), mh = llmref_double_to_f16(lo);
            double d = llmref_f16_to_double(dh), m = llmref_f16_to_double(mh);
            memset(p, 0, (size_t)bb);
            llmref__wr16(p, dh);
            if (type == LLMREF_Q4_1 || type == LLMREF_Q5_1) llmref__wr16(p + 2, mh);
            uint32_t qh = 0;
            uint8_t *qs = p + bb - 16;
            for (int j = 0; j < 32; j++) {
                int q = 0;
                if (type == LLMREF_Q5_0) q = d > 0 ? llmref__clampi(x[j] / d, -16, 15) + 16 : 16;
                else if (type == LLMREF_IQ4_NL) {
                    for (int k = 1; k < 16; k++)
                        if (d > 0 && fabs(x[j] - d * llmref__iq4_grid[k]) < fabs(x[j] - d * llmref__iq4_grid[q])) q = k;
                } else q = d > 0 ? llmref__clampi((x[j] - m) / d, 0, qmax) : 0;
                qs[j % 16] |= (uint8_t)((q & 15) << (j < 16 ? 0 : 4));
                qh |= (uint32_t)(q >> 4) << j;
            }
            if (type == LLMREF_Q5_0 || type == LLMREF_Q5_1)
                for (int k = 0; k < 4; k++) p[(type == LLMREF_Q5_0 ? 2 : 4) + k] = (uint8_t)(qh >> (8 * k));
        }
        return 0;
    }
    case LLMREF_Q2_K: case LLMREF_Q3_K: {
        const int q2 = type == LLMREF_Q2_K;
        for (int64_t b = 0; b < n / 256; b++, p += q2 ? 84 : 110) {
            const double *x = src + 256 * b;
            double scale[16], minv[16], smax = 0, mmax = 0;
            for (int j = 0; j < 16; j++) { /* Q2_K: [lo, hi] with lo <= 0; Q3_K: the largest magnitude */
                double lo = 0, hi = 0, amax = 0;
                for (int l = 0; l < 16; l++) {
                    lo = fmin(lo, x[16 * j + l]);
                    hi = fmax(hi, x[16 * j + l]);
                    amax = fmax(amax, fabs(x[16 * j + l]));
                }
                scale[j] = q2 ? (hi - lo) / 3 : amax / 4;
                minv[j] = -lo;
                smax = fmax(smax, scale[j]);
                mmax = fmax(mmax, minv[j]);
            }
            uint16_t dh = llmref_double_to_f16(smax / (q2 ? 15 : 31)), mh = llmref_double_to_f16(mmax / 15);
            double d = llmref_f16_to_double(dh), dmin = llmref_f16_to_double(mh);
            memset(p, 0, q2 ? 84 : 110);
            int sc[16], mn[16];
            for (int j = 0; j < 16; j++) {
                sc[j] = d > 0 ? llmref__clampi(scale[j] / d, q2 ? 0 : -32, q2 ? 15 : 31) : 0;
                mn[j] = q2 && dmin > 0 ? llmref__clampi(minv[j] / dmin, 0, 15) : 0;
                if (q2) {
                    p[j] = (uint8_t)(sc[j] | (mn[j] << 4));
                } else {
                    int c = sc[j] + 32;
                    p[96 + j % 8] |= (uint8_t)((c & 15) << (j < 8 ? 0 : 4));
                    p[104 + j % 4] |= (uint8_t)((c >> 4) << (2 * (j / 4)));
                }
            }
            llmref__wr16(p + (q2 ? 80 : 108), dh);
            if (q2) llmref__wr16(p + 82, mh);
            uint8_t *qs = p + (q2 ? 16 : 32);
            for (int v = 0; v < 256; v++) {
                double step = d * sc[v / 16];
                int q;
                if (q2) q = step > 0 ? llmref__clampi((x[v] + dmin * mn[v / 16]) / step, 0, 3) : 0;
                else q = step != 0 ? llmref__clampi(x[v] / step, -4, 3) + 4 : 4;
                int qi, qsh, hi, hsh;
                llmref__k2_where(v, &qi, &qsh, &hi, &hsh);
                qs[qi] |= (uint8_t)((q & 3) << qsh);
                if (!q2) p[hi] |= (uint8_t)((q >> 2) << hsh);
            }
        }
        return 0;
    }
    case LLMREF_Q5_K:
        for (int64_t b = 0; b < n / 256; b++, p += 176) {
            const double *x = src + 256 * b;
            double scale[8], minv[8], smax = 0, mmax = 0;
            for (int j = 0; j < 8; j++) {
                double lo = 0, hi = 0;
                for (int l = 0; l < 32; l++) {
                    lo = fmin(lo, x[32 * j + l]);
                    hi = fmax(hi, x[32 * j + l]);
                }
                scale[j] = (hi - lo) / 31;
                minv[j] = -lo;
                smax = fmax(smax, scale[j]);
                mmax = fmax(mmax, minv[j]);
            }
            uint16_t dh = llmref_double_to_f16(smax / 63), mh = llmref_double_to_f16(mmax / 63);
            double d = llmref_f16_to_double(dh), dmin = llmref_f16_to_double(mh);
            int sc[8], mn[8];
            for (int j = 0; j < 8; j++) {
                sc[j] = d > 0 ? llmref__clampi(scale[j] / d, 0, 63) : 0;
                mn[j] = dmin > 0 ? llmref__clampi(minv[j] / dmin, 0, 63) : 0;
            }
            memset(p, 0, 176);
            llmref__wr16(p, dh);
            llmref__wr16(p + 2, mh);
            uint8_t *s = p + 4;
            for (int j = 0; j < 4; j++) {
                s[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
                s[j + 4] = (uint8_t)((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
                s[j + 8] = (uint8_t)((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
            }
            for (int j = 0; j < 8; j++) {
                double step = d * sc[j], off = dmin * mn[j];
                for (int l = 0; l < 32; l++) {
                    int q = step > 0 ? llmref__clampi((x[32 * j + l] + off) / step, 0, 31) : 0;
                    p[48 + 32 * (j / 2) + l] |= (uint8_t)((q & 15) << (4 * (j & 1)));
                    p[16 + l] |= (uint8_t)((q >> 4) << j);
                }
            }
        }
        return 0;
    case LLMREF_IQ4_XS:
        for (int64_t b = 0; b < n / 256; b++, p += 136) {
            const double *x = src + 256 * b;
            double scale[8], smax = 0;
            for (int ib = 0; ib < 8; ib++) {
                double amax = 0;
                for (int l = 0; l < 32; l++) amax = fmax(amax, fabs(x[32 * ib + l]));
                scale[ib] = amax / 113;
                smax = fmax(smax, scale[ib]);
            }
            uint16_t dh = llmref_double_to_f16(smax / 31);
            double d = llmref_f16_to_double(dh);
            memset(p, 0, 136);
            llmref__wr16(p, dh);
            unsigned sh = 0;
            for (int ib = 0; ib < 8; ib++) {
                int ls = d > 0 ? llmref__clampi(scale[ib] / d, -32, 31) + 32 : 32;
                p[4 + ib / 2] |= (uint8_t)((ls & 15) << (4 * (ib % 2)));
                sh |= (unsigned)(ls >> 4) << (2 * ib);
                double step = d * (ls - 32);
                for (int j = 0; j < 32; j++) {
                    int q = 0;
                    for (int k = 1; k < 16; k++)
                        if (fabs(x[32 * ib + j] - step * llmref__iq4_grid[k]) < fabs(x[32 * ib + j] - step * llmref__iq4_grid[q]))
                            q = k;
                    p[8 + 16 * ib + j % 16] |= (uint8_t)(q << (j < 16 ? 0 : 4));
                }
            }
            llmref__wr16(p + 2, (uint16_t)sh);
        }
        return 0;
    default:
        return -1;
    }
}

/* --------------------------------------------------------------------- */
/* Deterministic random numbers (splitmix64; no libm, so the same bits on */
/* every platform)                                                        */

static inline uint64_t llmref_rand_u64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
/* Uniform in [0, 1). */
static inline double llmref_rand_uniform(uint64_t *s) { return (double)(llmref_rand_u64(s) >> 11) * 0x1p-53; }
/* Mean 0, variance 1, bounded by +-2 sqrt(3): the sum of four uniforms. */
static inline double llmref_rand_normal(uint64_t *s) {
    double u = 0;
    for (int i = 0; i < 4; i++) u += llmref_rand_uniform(s);
    return (u - 2.0) * sqrt(3.0);
}
static inline uint64_t llmref__hash(uint64_t seed, const char *name) { /* FNV-1a, then mixed */
    uint64_t h = 0xcbf29ce484222325ull ^ seed;
    for (; *name; name++) h = (h ^ (uint8_t)*name) * 0x100000001b3ull;
    return llmref_rand_u64(&h);
}

#endif
