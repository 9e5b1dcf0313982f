/* llm_ref.h: the independent reference the model runner is tested against.
 *
 * A naive transformer forward pass in double precision, written from
 * docs/model.md alone (plain loops, no KV cache, every weight dequantized to
 * double once), plus what the tests around it need:
 *
 *   - llmref_dequant / llmref_quantize: the ggml block formats F32, F16,
 *     BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K,
 *     Q6_K, IQ4_XS, decoded here from the byte layouts (f16 included), and a
 *     simple encoder for fixtures;
 *   - llmref_model: hyperparameters and weights from an open dhsa_gguf
 *     (architectures llama, qwen2, gemma2, qwen3, gemma3, phi3, with every
 *     optional tensor of docs/model.md: biases, fused QKV, rope_freqs,
 *     LongRoPE factors, output.bias; a tensor
 *     it does not read is an error naming it) or from a llama2.c
 *     checkpoint; every field is plain data, so a test can build a model
 *     by hand or change one field to make a deliberately wrong variant;
 *   - llmref_forward / llmref_forward_ex: logits [n][n_vocab] of a sequence;
 *   - llmref_fixture_build: tiny random GGUF models (test fixtures) for any
 *     architecture and weight type, deterministic for a seed;
 *   - llmref_compare: float logits against double reference logits,
 *     |a-b| <= atol + rtol*|ref| per element and NMSE overall, printing the
 *     worst element on failure.
 *
 * Independence is the point: this file uses only include/dhsa.h's public
 * GGUF reader/writer (and nothing of src/model/), so a bug in the runner or
 * in its quantization kernels cannot hide in a shared helper.
 *
 * Header-only: every function is `static inline`, so a test that includes it
 * and uses a part compiles without unused-function warnings. Errors are
 * return values (0 = ok, -1 = failed) with a sentence in llmref_error().
 * Not thread-safe (one error buffer). Not fast: a forward is
 * O(n^2 d + n P) with P the parameter count, fine for fixtures and the
 * 260K-parameter real model.
 *
 * Validated by tests/test_llm_ref.c:
 *   make build/tests/test_llm_ref && build/tests/test_llm_ref
 */
#ifndef DHSA_TESTS_LLM_REF_H
#define DHSA_TESTS_LLM_REF_H

#include "dhsa.h"

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

/* --------------------------------------------------------------------- */
/* The model                                                              */

typedef enum {
    LLMREF_ARCH_LLAMA = 1,
    LLMREF_ARCH_QWEN2 = 2,
    LLMREF_ARCH_GEMMA2 = 3,
    LLMREF_ARCH_QWEN3 = 4,
    LLMREF_ARCH_GEMMA3 = 5,
    LLMREF_ARCH_PHI3 = 6
} llmref_arch;

static inline int llmref__gemma(llmref_arch a) { return a == LLMREF_ARCH_GEMMA2 || a == LLMREF_ARCH_GEMMA3; }

/* One block. Matrices are row-major [n_out][n_in] (a GGUF [n_in, n_out]
 * tensor as stored); NULL = absent. */
typedef struct {
    double *attn_norm;      /* [n_embd] */
    double *wq;             /* [n_head*hd_k][n_embd] */
    double *wk;             /* [n_head_kv*hd_k][n_embd] */
    double *wv;             /* [n_head_kv*hd_v][n_embd] */
    double *bq, *bk, *bv;   /* [n_head*hd_k], [n_head_kv*hd_k], [n_head_kv*hd_v]; NULL = no bias */
    double *wo;             /* [n_embd][n_head*hd_v] */
    double *bo;             /* [n_embd] attn_output.bias; NULL = none */
    double *post_attn_norm; /* [n_embd]; NULL = none (gemma2 has it) */
    double *ffn_norm;       /* [n_embd] */
    double *w_gate, *w_up;  /* [n_ff][n_embd] */
    double *w_down;         /* [n_embd][n_ff] */
    double *b_gate, *b_up;  /* [n_ff] ffn_gate.bias, ffn_up.bias; NULL = none */
    double *b_down;         /* [n_embd] ffn_down.bias; NULL = none */
    double *post_ffw_norm;  /* [n_embd]; NULL = none (gemma2 has it) */
    double *q_norm, *k_norm; /* [hd_k]: each head of q and k is RMS-normed with it before RoPE; NULL = none */
} llmref_layer;

/* The whole model. The loader sets every field from the file and
 * docs/model.md; a test may change any of them (e.g. rope_neox = 1 on a
 * llama model) to get a deliberately wrong or an equivalent variant. */
typedef struct {
    llmref_arch arch;
    int64_t n_vocab, n_ctx_train, n_embd, n_layer, n_ff;
    int64_t n_head, n_head_kv, hd_k, hd_v, n_rot;
    double rms_eps;
    double rope_base;       /* theta */
    double rope_factor;     /* linear scaling: positions are divided by it (1 = none) */
    int rope_neox;          /* 0: pairs (2i, 2i+1) (llama); 1: (i, i + n_rot/2) (qwen2, gemma2) */
    double embd_scale;      /* x = token_embd[t] * embd_scale (gemma2 sqrt(n_embd), else 1) */
    double attn_scale;      /* scores = q.k * attn_scale (1/sqrt(hd_k); gemma2 with 46 layers
                               1/sqrt(n_embd / n_head)) */
    double attn_softcap;    /* s = cap tanh(s / cap); 0 = none */
    double final_softcap;   /* same on the logits; 0 = none */
    int64_t sliding_window; /* > 0: the sliding layers (below) see keys at p' > p - window */
    int64_t swa_pattern;    /* which layers slide, as llama.cpp's pattern n: l % n < n - 1 (0: all,
                               -1: none); gemma2 2 (the even layers), gemma3 6 (5 in 6) */
    uint8_t *swa;           /* or one flag per layer [n_layer] (NULL: the pattern decides) */
    double rope_base_swa;   /* theta of the sliding layers (gemma2: rope_base; gemma3: 10000) */
    double rope_factor_swa; /* their linear factor (gemma2: rope_factor; gemma3: 1) */
    double rope_attn_factor; /* rotated q, k values are multiplied by it (rope.scaling.attn_factor; 1 = none) */
    int64_t n_ctx_orig;     /* rope.scaling.original_context_length (LongRoPE: above it, the long factors) */
    int gelu;               /* FFN activation: 1 GELU (tanh form, gemma2/3), 0 SiLU */
    /* Which optional arrays llmref_model_alloc allocates. */
    int has_biases;         /* bq, bk, bv in every layer */
    int has_mlp_biases;     /* bo, b_gate, b_up, b_down in every layer */
    int has_output_bias;    /* output_bias */
    int has_post_norms;     /* post_attn_norm, post_ffw_norm in every layer */
    int has_rope_freqs;     /* rope_freqs */
    int has_qk_norm;        /* q_norm, k_norm in every layer (qwen3, gemma3) */
    int tied;               /* output == tok_embd */
    double *tok_embd;       /* [n_vocab][n_embd] */
    double *output_norm;    /* [n_embd] */
    double *output;         /* [n_vocab][n_embd]; the tok_embd pointer when tied */
    double *output_bias;    /* [n_vocab] output.bias; NULL = none */
    double *rope_freqs;     /* [n_rot/2]: theta_i is divided by it; NULL = none */
    double *rope_long, *rope_short; /* [n_rot/2] rope_factors_long/short; NULL = none */
    const double *rope_factors; /* the LongRoPE factors in use, divided like rope_freqs (when that is
                               NULL): rope_short as loaded; llmref_model_set_ctx picks by context */
    llmref_layer *layers;   /* [n_layer] */
} llmref_model;

/* Frees every array of m (NULL pointers are skipped) and zeroes m. The
 * arrays must come from malloc (llmref_model_alloc, or a test's own). */
static inline void llmref_model_free(llmref_model *m) {
    if (!m) return;
    if (m->layers) {
        for (int64_t l = 0; l < m->n_layer; l++) {
            llmref_layer *L = &m->layers[l];
            double *arrs[] = {L->attn_norm, L->wq, L->wk,       L->wv,     L->bq,     L->bk,
                              L->bv,        L->wo, L->post_attn_norm, L->ffn_norm, L->w_gate, L->w_up,
                              L->w_down,    L->post_ffw_norm, L->bo, L->b_gate, L->b_up, L->b_down,
                              L->q_norm,    L->k_norm};
            for (size_t i = 0; i < sizeof arrs / sizeof arrs[0]; i++) free(arrs[i]);
        }
        free(m->layers);
    }
    if (m->output != m->tok_embd) free(m->output);
    free(m->tok_embd);
    free(m->output_norm);
    free(m->output_bias);
    free(m->rope_freqs);
    free(m->rope_long);
    free(m->rope_short);
    free(m->swa);
    memset(m, 0, sizeof *m);
}

static inline double *llmref__zeros(int64_t n, int *ok) {
    double *p = calloc((size_t)(n > 0 ? n : 1), sizeof *p);
    if (!p) *ok = 0;
    return p;
}

/* Allocates every weight array the hyperparameters and has_* / tied flags
 * of m call for, zero-filled (norms too; rope_freqs filled with 1), and
 * overwrites the pointers (whatever they held is not freed). -1 when out
 * of memory (m is freed then). */
static inline int llmref_model_alloc(llmref_model *m) {
    int ok = 1;
    int64_t E = m->n_embd, F = m->n_ff, dq = m->n_head * m->hd_k, dk = m->n_head_kv * m->hd_k,
            dv = m->n_head_kv * m->hd_v, da = m->n_head * m->hd_v;
    m->layers = NULL;
    m->rope_freqs = NULL;
    m->rope_long = m->rope_short = NULL;
    m->rope_factors = NULL;
    m->swa = NULL;
    m->tok_embd = llmref__zeros(m->n_vocab * E, &ok);
    m->output_norm = llmref__zeros(E, &ok);
    m->output = m->tied ? m->tok_embd : llmref__zeros(m->n_vocab * E, &ok);
    m->output_bias = m->has_output_bias ? llmref__zeros(m->n_vocab, &ok) : NULL;
    if (m->has_rope_freqs) {
        m->rope_freqs = llmref__zeros(m->n_rot / 2, &ok);
        if (m->rope_freqs)
            for (int64_t i = 0; i < m->n_rot / 2; i++) m->rope_freqs[i] = 1;
    }
    m->layers = calloc((size_t)(m->n_layer > 0 ? m->n_layer : 1), sizeof *m->layers);
    if (!m->layers) ok = 0;
    for (int64_t l = 0; ok && l < m->n_layer; l++) {
        llmref_layer *L = &m->layers[l];
        L->attn_norm = llmref__zeros(E, &ok);
        L->wq = llmref__zeros(dq * E, &ok);
        L->wk = llmref__zeros(dk * E, &ok);
        L->wv = llmref__zeros(dv * E, &ok);
        if (m->has_biases) {
            L->bq = llmref__zeros(dq, &ok);
            L->bk = llmref__zeros(dk, &ok);
            L->bv = llmref__zeros(dv, &ok);
        }
        L->wo = llmref__zeros(E * da, &ok);
        L->ffn_norm = llmref__zeros(E, &ok);
        L->w_gate = llmref__zeros(F * E, &ok);
        L->w_up = llmref__zeros(F * E, &ok);
        L->w_down = llmref__zeros(E * F, &ok);
        if (m->has_mlp_biases) {
            L->bo = llmref__zeros(E, &ok);
            L->b_gate = llmref__zeros(F, &ok);
            L->b_up = llmref__zeros(F, &ok);
            L->b_down = llmref__zeros(E, &ok);
        }
        if (m->has_post_norms) {
            L->post_attn_norm = llmref__zeros(E, &ok);
            L->post_ffw_norm = llmref__zeros(E, &ok);
        }
        if (m->has_qk_norm) {
            L->q_norm = llmref__zeros(m->hd_k, &ok);
            L->k_norm = llmref__zeros(m->hd_k, &ok);
        }
    }
    if (!ok) {
        llmref_model_free(m);
        return llmref__fail("model: out of memory");
    }
    return 0;
}

/* Sets the fields docs/model.md derives from the architecture and the
 * sizes (call after n_embd, n_head, n_layer and hd_k are set): RoPE
 * pairing, embedding scale, activation, attention scale, q/k norms, which
 * layers slide, and the RoPE of the sliding layers (rope_base_swa = 10000
 * for gemma3, else rope_base; call after rope_base and rope_factor are
 * set) and an attn_factor of 1. The scale is 1/sqrt(hd_k), except for a
 * gemma2 of 46 layers and a gemma3 of 62 (Gemma 2 and 3 27B, whose
 * query_pre_attn_scalar is n_embd / n_head, integer division, not the head
 * dim): 1/sqrt(n_embd / n_head). Does not touch eps, caps or window. */
static inline void llmref_model_derive(llmref_model *m) {
    int gemma = llmref__gemma(m->arch);
    m->rope_neox = m->arch != LLMREF_ARCH_LLAMA;
    m->embd_scale = gemma ? sqrt((double)m->n_embd) : 1.0;
    m->gelu = gemma;
    m->has_qk_norm = m->arch == LLMREF_ARCH_QWEN3 || m->arch == LLMREF_ARCH_GEMMA3;
    int big = (m->arch == LLMREF_ARCH_GEMMA2 && m->n_layer == 46) || (m->arch == LLMREF_ARCH_GEMMA3 && m->n_layer == 62);
    m->attn_scale = 1.0 / sqrt((double)(big ? m->n_embd / m->n_head : m->hd_k));
    m->swa_pattern = m->arch == LLMREF_ARCH_GEMMA2 ? 2 : m->arch == LLMREF_ARCH_GEMMA3 ? 6 : -1;
    m->rope_base_swa = m->arch == LLMREF_ARCH_GEMMA3 ? 10000.0 : m->rope_base;
    m->rope_factor_swa = m->arch == LLMREF_ARCH_GEMMA3 ? 1.0 : m->rope_factor;
    m->rope_attn_factor = 1.0;
}

/* Whether layer l slides (given a window). */
static inline int llmref_layer_slides(const llmref_model *m, int64_t l) {
    if (m->sliding_window <= 0) return 0;
    if (m->swa) return m->swa[l] != 0;
    int64_t n = m->swa_pattern;
    return n == 0 || (n > 0 && l % n < n - 1);
}

/* LongRoPE: the factors a session of n_ctx tokens uses, as llama.cpp
 * picks them: rope_long above n_ctx_orig, else rope_short. */
static inline void llmref_model_set_ctx(llmref_model *m, int64_t n_ctx) {
    m->rope_factors = n_ctx > m->n_ctx_orig ? m->rope_long : m->rope_short;
}

/* ---- reading GGUF metadata ---- */

static inline int llmref__kv_int(const dhsa_gguf *g, const char *key, int64_t def, int required, int64_t *out) {
    int64_t i = dhsa_gguf_find_kv(g, key);
    if (i < 0) {
        if (required) return llmref__fail("model: required key %s is absent", key);
        *out = def;
        return 0;
    }
    const dhsa_gguf_kv *kv = dhsa_gguf_kv_at(g, i);
    switch (kv->type) {
    case DHSA_GGUF_UINT8: case DHSA_GGUF_UINT16: case DHSA_GGUF_UINT32: case DHSA_GGUF_UINT64:
        if (kv->u > (uint64_t)INT64_MAX) return llmref__fail("model: %s = %llu is too large", key, (unsigned long long)kv->u);
        *out = (int64_t)kv->u;
        return 0;
    case DHSA_GGUF_INT8: case DHSA_GGUF_INT16: case DHSA_GGUF_INT32: case DHSA_GGUF_INT64:
        if (kv->i < 0) return llmref__fail("model: %s = %lld is negative", key, (long long)kv->i);
        *out = kv->i;
        return 0;
    default:
        return llmref__fail("model: %s is %s, not an integer", key, dhsa_gguf_type_name(kv->type));
    }
}

static inline int llmref__kv_float(const dhsa_gguf *g, const char *key, double def, double *out) {
    int64_t i = dhsa_gguf_find_kv(g, key);
    if (i < 0) {
        *out = def;
        return 0;
    }
    const dhsa_gguf_kv *kv = dhsa_gguf_kv_at(g, i);
    if (kv->type != DHSA_GGUF_FLOAT32 && kv->type != DHSA_GGUF_FLOAT64)
        return llmref__fail("model: %s is %s, not a float", key, dhsa_gguf_type_name(kv->type));
    *out = kv->f;
    return 0;
}

/* Marks of the tensors the loader read ([n_tensors], set while
 * llmref_model_load runs), so that one it did not read is an error. */
static uint8_t *llmref__used;

/* A file's string for a message: bytes outside printable ASCII as \xNN
 * (the reference's own rule, simpler than the library's: tests print these
 * sentences, and a name may hold ESC). */
static inline const char *llmref__printable(const char *s, char *buf, size_t cap) {
    size_t o = 0;
    for (; *s && o + 5 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c >= 0x20 && c < 0x7f && c != '\\') buf[o++] = (char)c;
        else o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
    }
    buf[o] = '\0';
    return buf;
}

/* Dequantizes tensor `name` into dst after checking it is [d0] (d1 = 0) or
 * [d0, d1]. Absent: -1, or 0 with *found = 0 when found is not NULL. */
static inline int llmref__load_tensor(const dhsa_gguf *g, const char *name, int64_t d0, int64_t d1, double *dst,
                                      int *found) {
    int64_t i = dhsa_gguf_find_tensor(g, name);
    if (found) *found = i >= 0;
    if (i < 0) return found ? 0 : llmref__fail("model: tensor %s is absent", name);
    if (llmref__used) llmref__used[i] = 1;
    const dhsa_gguf_tensor *t = dhsa_gguf_tensor_at(g, i);
    int64_t want_n = d1 ? d0 * d1 : d0;
    if (t->dims[0] != d0 || (d1 && t->dims[1] != d1) || t->n_elements != want_n)
        return llmref__fail("model: %s is [%lld, %lld, %lld, %lld], expected [%lld, %lld]", name,
                            (long long)t->dims[0], (long long)t->dims[1], (long long)t->dims[2],
                            (long long)t->dims[3], (long long)d0, (long long)(d1 ? d1 : 1));
    int64_t bytes = llmref_type_bytes(t->type, t->n_elements);
    if (bytes < 0)
        return llmref__fail("model: %s has type %u (%s), which the reference does not read, or a ragged row", name,
                            t->type, llmref_type_name(t->type));
    if (!t->data || t->bytes != bytes)
        return llmref__fail("model: %s holds %lld bytes, expected %lld", name, (long long)t->bytes, (long long)bytes);
    return llmref_dequant(t->type, t->data, t->n_elements, dst);
}

/* An optional tensor of d0 values (d1 = 0) or [d0, d1]: *dst is a new
 * array when the file has it, NULL when not. -1 on a bad tensor or no
 * memory. */
static inline int llmref__load_optional(const dhsa_gguf *g, const char *name, int64_t d0, int64_t d1, double **dst) {
    *dst = NULL;
    if (dhsa_gguf_find_tensor(g, name) < 0) return 0;
    int ok = 1;
    double *buf = llmref__zeros(d1 ? d0 * d1 : d0, &ok);
    if (!ok) return llmref__fail("model: out of memory");
    int found = 0;
    if (llmref__load_tensor(g, name, d0, d1, buf, &found)) {
        free(buf);
        return -1;
    }
    *dst = buf;
    return 0;
}

/* Fills m from an open GGUF by docs/model.md (architectures llama, qwen2,
 * gemma2; missing keys take the table's defaults). Every tensor is checked
 * for shape and dequantized to double; g may be closed after. Where the
 * table is silent, llama.cpp's rule is taken: a rope.scaling.factor
 * applies unless rope.scaling.type says "none" (an absent type counts as
 * linear). Returns 0, or -1 with llmref_error() (m is then zeroed). */
static inline int llmref_model_load(const dhsa_gguf *g, llmref_model *m) {
    memset(m, 0, sizeof *m);
    const char *arch = NULL;
    if (dhsa_gguf_get_str(g, "general.architecture", &arch, NULL) != DHSA_OK)
        return llmref__fail("model: general.architecture is absent or not a string");
    if (strcmp(arch, "llama") == 0) m->arch = LLMREF_ARCH_LLAMA;
    else if (strcmp(arch, "qwen2") == 0) m->arch = LLMREF_ARCH_QWEN2;
    else if (strcmp(arch, "gemma2") == 0) m->arch = LLMREF_ARCH_GEMMA2;
    else if (strcmp(arch, "qwen3") == 0) m->arch = LLMREF_ARCH_QWEN3;
    else if (strcmp(arch, "gemma3") == 0) m->arch = LLMREF_ARCH_GEMMA3;
    else if (strcmp(arch, "phi3") == 0) m->arch = LLMREF_ARCH_PHI3;
    else {
        char pb[200];
        return llmref__fail("model: architecture '%s' is not llama, qwen2, gemma2, qwen3, gemma3 or phi3",
                            llmref__printable(arch, pb, sizeof pb));
    }
    int gemma = llmref__gemma(m->arch);
    char key[160];
#define LLMREF_KEY(suffix) (snprintf(key, sizeof key, "%s.%s", arch, suffix), key)
    if (llmref__kv_int(g, LLMREF_KEY("context_length"), 0, 1, &m->n_ctx_train) ||
        llmref__kv_int(g, LLMREF_KEY("embedding_length"), 0, 1, &m->n_embd) ||
        llmref__kv_int(g, LLMREF_KEY("block_count"), 0, 1, &m->n_layer) ||
        llmref__kv_int(g, LLMREF_KEY("feed_forward_length"), 0, 1, &m->n_ff) ||
        llmref__kv_int(g, LLMREF_KEY("attention.head_count"), 0, 1, &m->n_head))
        return -1;
    if (m->n_embd < 1 || m->n_layer < 1 || m->n_ff < 1 || m->n_head < 1)
        return llmref__fail("model: a size is 0 (n_embd %lld, n_layer %lld, n_ff %lld, n_head %lld)",
                            (long long)m->n_embd, (long long)m->n_layer, (long long)m->n_ff, (long long)m->n_head);
    if (llmref__kv_int(g, LLMREF_KEY("attention.head_count_kv"), m->n_head, 0, &m->n_head_kv) ||
        llmref__kv_int(g, LLMREF_KEY("attention.key_length"), m->n_embd / m->n_head, 0, &m->hd_k) ||
        llmref__kv_int(g, LLMREF_KEY("attention.value_length"), m->hd_k, 0, &m->hd_v) ||
        llmref__kv_int(g, LLMREF_KEY("rope.dimension_count"), m->hd_k, 0, &m->n_rot) ||
        llmref__kv_float(g, LLMREF_KEY("attention.layer_norm_rms_epsilon"), gemma ? 1e-6 : 1e-5, &m->rms_eps) ||
        llmref__kv_float(g, LLMREF_KEY("rope.freq_base"), 10000.0, &m->rope_base) ||
        llmref__kv_float(g, LLMREF_KEY("rope.scaling.factor"), 1.0, &m->rope_factor))
        return -1;
    if (m->n_head_kv < 1 || m->n_head % m->n_head_kv)
        return llmref__fail("model: %lld query heads do not split into %lld KV heads", (long long)m->n_head,
                            (long long)m->n_head_kv);
    if (m->hd_k < 1 || m->hd_v < 1 || m->n_rot < 0 || m->n_rot > m->hd_k || m->n_rot % 2)
        return llmref__fail("model: head dims %lld/%lld with n_rot %lld", (long long)m->hd_k, (long long)m->hd_v,
                            (long long)m->n_rot);
    if (dhsa_gguf_find_kv(g, LLMREF_KEY("rope.scaling.type")) >= 0) {
        const char *type = NULL;
        if (dhsa_gguf_get_str(g, key, &type, NULL) != DHSA_OK) return llmref__fail("model: %s is not a string", key);
        if (strcmp(type, "none") == 0) m->rope_factor = 1.0;
        else if (strcmp(type, "linear") != 0)
            return llmref__fail("model: rope scaling '%.32s' is not supported (none, linear)", type);
    }
    if (m->rope_factor == 0) m->rope_factor = 1.0; /* llama.cpp: 0 = unset */
    if (!(m->rope_factor > 0) || !(m->rope_base > 0))
        return llmref__fail("model: rope base %g / factor %g", m->rope_base, m->rope_factor);
    if (m->arch == LLMREF_ARCH_GEMMA2) {
        if (llmref__kv_float(g, "gemma2.attn_logit_softcapping", 50.0, &m->attn_softcap) ||
            llmref__kv_float(g, "gemma2.final_logit_softcapping", 30.0, &m->final_softcap) ||
            llmref__kv_int(g, "gemma2.attention.sliding_window", 4096, 0, &m->sliding_window))
            return -1;
    }
    /* gemma3: no attention cap; a final cap and a window only when given */
    if (m->arch == LLMREF_ARCH_GEMMA3 &&
        (llmref__kv_float(g, "gemma3.final_logit_softcapping", 0.0, &m->final_softcap) ||
         llmref__kv_int(g, "gemma3.attention.sliding_window", 0, 0, &m->sliding_window)))
        return -1;
    double attn_factor = 1;
    if (llmref__kv_float(g, LLMREF_KEY("rope.scaling.attn_factor"), 1.0, &attn_factor) ||
        llmref__kv_int(g, LLMREF_KEY("rope.scaling.original_context_length"), m->n_ctx_train, 0, &m->n_ctx_orig))
        return -1;
#undef LLMREF_KEY
    int64_t ti = dhsa_gguf_find_tensor(g, "token_embd.weight");
    if (ti < 0) return llmref__fail("model: tensor token_embd.weight is absent");
    m->n_vocab = dhsa_gguf_tensor_at(g, ti)->dims[1];
    if (m->n_vocab < 1) return llmref__fail("model: token_embd.weight has no rows");
    m->tied = dhsa_gguf_find_tensor(g, "output.weight") < 0;
    m->has_rope_freqs = dhsa_gguf_find_tensor(g, "rope_freqs.weight") >= 0;
    m->has_post_norms = gemma;
    m->has_biases = 0; /* biases are loaded one by one below */
    m->has_mlp_biases = 0;
    m->has_output_bias = 0;
    llmref_model_derive(m);
    m->rope_attn_factor = attn_factor;
    /* the sliding layers (gemma2, and gemma3 with a window): their RoPE
     * base and which ones; phi3's sliding_window is not read (llama.cpp
     * disables it) */
    uint8_t *swa = NULL;
    if (m->arch == LLMREF_ARCH_GEMMA2 || (m->arch == LLMREF_ARCH_GEMMA3 && m->sliding_window > 0)) {
        char k2[96];
        snprintf(k2, sizeof k2, "%s.rope.freq_base_swa", arch);
        if (llmref__kv_float(g, k2, m->rope_base_swa, &m->rope_base_swa)) return -1;
        snprintf(k2, sizeof k2, "%s.attention.sliding_window_pattern", arch);
        int64_t pi = dhsa_gguf_find_kv(g, k2);
        const dhsa_gguf_kv *pkv = pi >= 0 ? dhsa_gguf_kv_at(g, pi) : NULL;
        if (pkv && pkv->type == DHSA_GGUF_ARRAY) {
            if (pkv->arr.type != DHSA_GGUF_BOOL || pkv->arr.n != m->n_layer)
                return llmref__fail("model: %s is not one BOOL per layer", k2);
            swa = malloc((size_t)m->n_layer);
            if (!swa) return llmref__fail("model: out of memory");
            memcpy(swa, pkv->arr.data, (size_t)m->n_layer);
        } else if (pkv && llmref__kv_int(g, k2, 0, 1, &m->swa_pattern)) {
            return -1;
        }
    }
    if (llmref_model_alloc(m)) {
        free(swa);
        return -1;
    }
    m->swa = swa;
    int64_t n_tensors = dhsa_gguf_n_tensors(g);
    llmref__used = calloc((size_t)(n_tensors > 0 ? n_tensors : 1), 1);
    if (!llmref__used) {
        llmref_model_free(m);
        return llmref__fail("model: out of memory");
    }

    int64_t E = m->n_embd, F = m->n_ff, dq = m->n_head * m->hd_k, dk = m->n_head_kv * m->hd_k,
            dv = m->n_head_kv * m->hd_v, da = m->n_head * m->hd_v;
    char name[96];
    if (llmref__load_tensor(g, "token_embd.weight", E, m->n_vocab, m->tok_embd, NULL) ||
        llmref__load_tensor(g, "output_norm.weight", E, 0, m->output_norm, NULL) ||
        (!m->tied && llmref__load_tensor(g, "output.weight", E, m->n_vocab, m->output, NULL)) ||
        (m->rope_freqs && llmref__load_tensor(g, "rope_freqs.weight", m->n_rot / 2, 0, m->rope_freqs, NULL)) ||
        llmref__load_optional(g, "output.bias", m->n_vocab, 0, &m->output_bias) ||
        llmref__load_optional(g, "rope_factors_long.weight", m->n_rot / 2, 0, &m->rope_long) ||
        llmref__load_optional(g, "rope_factors_short.weight", m->n_rot / 2, 0, &m->rope_short))
        goto fail;
    if (m->rope_freqs && (m->rope_long || m->rope_short)) {
        llmref__fail("model: rope_freqs.weight and rope_factors_long/short.weight are two sets of factors");
        goto fail;
    }
    m->rope_factors = m->rope_short; /* a context up to n_ctx_orig; llmref_model_set_ctx changes it */
    for (int64_t l = 0; l < m->n_layer; l++) {
        llmref_layer *L = &m->layers[l];
#define LLMREF_T(suffix) (snprintf(name, sizeof name, "blk.%lld.%s", (long long)l, suffix), name)
        /* Q, K, V: three matrices, or one fused [n_embd, dq + dk + dv] whose
         * rows are Q's, then K's, then V's */
        if (dhsa_gguf_find_tensor(g, LLMREF_T("attn_qkv.weight")) >= 0) {
            int ok = 1;
            double *f = llmref__zeros((dq + dk + dv) * E, &ok);
            if (!ok || llmref__load_tensor(g, name, E, dq + dk + dv, f, NULL)) {
                if (!ok) llmref__fail("model: out of memory");
                free(f);
                goto fail;
            }
            memcpy(L->wq, f, (size_t)(dq * E) * sizeof *f);
            memcpy(L->wk, f + dq * E, (size_t)(dk * E) * sizeof *f);
            memcpy(L->wv, f + (dq + dk) * E, (size_t)(dv * E) * sizeof *f);
            free(f);
        } else if (llmref__load_tensor(g, LLMREF_T("attn_q.weight"), E, dq, L->wq, NULL) ||
                   llmref__load_tensor(g, LLMREF_T("attn_k.weight"), E, dk, L->wk, NULL) ||
                   llmref__load_tensor(g, LLMREF_T("attn_v.weight"), E, dv, L->wv, NULL)) {
            goto fail;
        }
        if (llmref__load_tensor(g, LLMREF_T("attn_norm.weight"), E, 0, L->attn_norm, NULL) ||
            llmref__load_tensor(g, LLMREF_T("attn_output.weight"), da, E, L->wo, NULL) ||
            llmref__load_tensor(g, LLMREF_T("ffn_norm.weight"), E, 0, L->ffn_norm, NULL) ||
            llmref__load_tensor(g, LLMREF_T("ffn_down.weight"), F, E, L->w_down, NULL))
            goto fail;
        if (m->has_qk_norm && (llmref__load_tensor(g, LLMREF_T("attn_q_norm.weight"), m->hd_k, 0, L->q_norm, NULL) ||
                               llmref__load_tensor(g, LLMREF_T("attn_k_norm.weight"), m->hd_k, 0, L->k_norm, NULL)))
            goto fail;
        if (m->arch == LLMREF_ARCH_PHI3) {
            /* one ffn_up [n_embd, 2 n_ff]: rows 0..n_ff-1 the gate, the rest up;
             * its optional bias [2 n_ff] the same */
            int ok = 1;
            double *f = llmref__zeros(2 * F * E, &ok), *fb = NULL;
            if (!ok || llmref__load_tensor(g, LLMREF_T("ffn_up.weight"), E, 2 * F, f, NULL) ||
                llmref__load_optional(g, LLMREF_T("ffn_up.bias"), 2 * F, 0, &fb)) {
                if (!ok) llmref__fail("model: out of memory");
                free(f);
                goto fail;
            }
            memcpy(L->w_gate, f, (size_t)(F * E) * sizeof *f);
            memcpy(L->w_up, f + F * E, (size_t)(F * E) * sizeof *f);
            free(f);
            if (fb) {
                L->b_gate = llmref__zeros(F, &ok);
                L->b_up = llmref__zeros(F, &ok);
                if (ok) {
                    memcpy(L->b_gate, fb, (size_t)F * sizeof *fb);
                    memcpy(L->b_up, fb + F, (size_t)F * sizeof *fb);
                }
                free(fb);
                if (!ok) {
                    llmref__fail("model: out of memory");
                    goto fail;
                }
            }
        } else if (llmref__load_tensor(g, LLMREF_T("ffn_gate.weight"), E, F, L->w_gate, NULL) ||
                   llmref__load_tensor(g, LLMREF_T("ffn_up.weight"), E, F, L->w_up, NULL) ||
                   llmref__load_optional(g, LLMREF_T("ffn_gate.bias"), F, 0, &L->b_gate) ||
                   llmref__load_optional(g, LLMREF_T("ffn_up.bias"), F, 0, &L->b_up)) {
            goto fail;
        }
        if (gemma && (llmref__load_tensor(g, LLMREF_T("post_attention_norm.weight"), E, 0, L->post_attn_norm, NULL) ||
                      llmref__load_tensor(g, LLMREF_T("post_ffw_norm.weight"), E, 0, L->post_ffw_norm, NULL)))
            goto fail;
        /* optional biases of the output projection and the MLP (any architecture) */
        if (llmref__load_optional(g, LLMREF_T("attn_output.bias"), E, 0, &L->bo) ||
            llmref__load_optional(g, LLMREF_T("ffn_down.bias"), E, 0, &L->b_down))
            goto fail;
        /* Q/K/V biases: a fused [dq + dk + dv] cut like the fused matrix, or
         * one by one */
        if (dhsa_gguf_find_tensor(g, LLMREF_T("attn_qkv.bias")) >= 0) {
            double *fb = NULL;
            int ok = 1;
            if (llmref__load_optional(g, name, dq + dk + dv, 0, &fb)) goto fail;
            L->bq = llmref__zeros(dq, &ok);
            L->bk = llmref__zeros(dk, &ok);
            L->bv = llmref__zeros(dv, &ok);
            if (!ok) {
                free(fb);
                llmref__fail("model: out of memory");
                goto fail;
            }
            memcpy(L->bq, fb, (size_t)dq * sizeof *fb);
            memcpy(L->bk, fb + dq, (size_t)dk * sizeof *fb);
            memcpy(L->bv, fb + dq + dk, (size_t)dv * sizeof *fb);
            free(fb);
            continue;
        }
        const char *bname[3] = {"attn_q.bias", "attn_k.bias", "attn_v.bias"};
        int64_t bn[3] = {dq, dk, dv};
        double **bdst[3] = {&L->bq, &L->bk, &L->bv};
        for (int b = 0; b < 3; b++) {
            int ok = 1, found = 0;
            double *buf = llmref__zeros(bn[b], &ok);
            if (!ok) {
                llmref__fail("model: out of memory");
                goto fail;
            }
            if (llmref__load_tensor(g, LLMREF_T(bname[b]), bn[b], 0, buf, &found)) {
                free(buf);
                goto fail;
            }
            if (!found) {
                free(buf);
                if (m->arch == LLMREF_ARCH_QWEN2) {
                    llmref__fail("model: qwen2 needs %s", name);
                    goto fail;
                }
                continue;
            }
            *bdst[b] = buf;
        }
#undef LLMREF_T
    }
    /* every tensor of the file was read: one the reference does not know
     * would change what the model computes */
    for (int64_t i = 0; i < n_tensors; i++)
        if (!llmref__used[i]) {
            char pb[200];
            llmref__fail("model: tensor %s is not one docs/model.md lists for %s",
                         llmref__printable(dhsa_gguf_tensor_at(g, i)->name, pb, sizeof pb), arch);
            goto fail;
        }
    free(llmref__used);
    llmref__used = NULL;
    return 0;
fail:
    free(llmref__used);
    llmref__used = NULL;
    llmref_model_free(m);
    return -1;
}

/* llmref_model_load over a file's bytes (opened and closed here). */
static inline int llmref_model_load_memory(const void *bytes, size_t size, llmref_model *m) {
    dhsa_gguf *g = NULL;
    memset(m, 0, sizeof *m);
    if (dhsa_gguf_open_memory(bytes, size, &g) != DHSA_OK) return llmref__fail("model: %s", dhsa_last_error());
    int rc = llmref_model_load(g, m);
    dhsa_gguf_close(g);
    return rc;
}

static inline int llmref_model_load_file(const char *path, llmref_model *m) {
    dhsa_gguf *g = NULL;
    memset(m, 0, sizeof *m);
    if (dhsa_gguf_open(path, &g) != DHSA_OK) return llmref__fail("model: %s", dhsa_last_error());
    int rc = llmref_model_load(g, m);
    dhsa_gguf_close(g);
    return rc;
}

/* A llama2.c checkpoint (run.c's format, read here independently of the
 * library's converter): a header of 7 int32 (dim, hidden_dim, n_layers,
 * n_heads, n_kv_heads, vocab_size (negative = separate classifier),
 * seq_len), then F32 weights in llama2.c order: token embedding, attention
 * RMS weights, wq, wk, wv, wo, FFN RMS weights, w1 (gate), w2 (down), w3
 * (up), final RMS weight, two RoPE tables (skipped), classifier. Read as a
 * llama: eps 1e-5 (rounded to F32, as GGUF files store it), theta 10000,
 * adjacent pairs. */
static inline int llmref_model_load_llama2c(const char *path, llmref_model *m) {
    memset(m, 0, sizeof *m);
    FILE *f = fopen(path, "rb");
    if (!f) return llmref__fail("llama2.c: cannot open %s", path);
    int32_t h[7];
    if (fread(h, 4, 7, f) != 7) {
        fclose(f);
        return llmref__fail("llama2.c: %s is shorter than its header", path);
    }
    for (int i = 0; i < 7; i++)
        if (i != 5 && h[i] <= 0) {
            fclose(f);
            return llmref__fail("llama2.c: header field %d is %d", i, h[i]);
        }
    m->arch = LLMREF_ARCH_LLAMA;
    m->n_embd = h[0];
    m->n_ff = h[1];
    m->n_layer = h[2];
    m->n_head = h[3];
    m->n_head_kv = h[4];
    m->tied = h[5] > 0;
    m->n_vocab = h[5] > 0 ? h[5] : -(int64_t)h[5];
    m->n_ctx_train = h[6];
    m->hd_k = m->hd_v = m->n_rot = m->n_embd / m->n_head;
    m->rms_eps = (double)1e-5f; /* as a GGUF stores it (F32) */
    m->rope_base = 10000;
    m->rope_factor = 1;
    llmref_model_derive(m);
    if (m->n_vocab < 1 || m->n_head % m->n_head_kv || m->n_embd % m->n_head) {
        fclose(f);
        memset(m, 0, sizeof *m);
        return llmref__fail("llama2.c: inconsistent header");
    }
    if (llmref_model_alloc(m)) {
        fclose(f);
        return -1;
    }
    int64_t E = m->n_embd, F = m->n_ff, dk = m->n_head_kv * m->hd_k, NL = m->n_layer;
    float *buf = NULL;
    int ok = 1;
    /* Reads n floats into dst (skips them when dst is NULL). */
#define LLMREF_RD(dst, n)                                                                    \
    do {                                                                                     \
        int64_t n_ = (n);                                                                    \
        float *b_ = ok ? realloc(buf, (size_t)(n_ > 0 ? n_ : 1) * sizeof *b_) : NULL;        \
        if (!b_ || fread(b_, sizeof *b_, (size_t)n_, f) != (size_t)n_) ok = 0;                \
        if (b_) buf = b_;                                                                    \
        if (ok && (dst))                                                                     \
            for (int64_t i_ = 0; i_ < n_; i_++) ((double *)(dst))[i_] = b_[i_];               \
    } while (0)
    LLMREF_RD(m->tok_embd, m->n_vocab * E);
    for (int64_t l = 0; l < NL; l++) LLMREF_RD(m->layers[l].attn_norm, E);
    for (int64_t l = 0; l < NL; l++) LLMREF_RD(m->layers[l].wq, E * E);
    for (int64_t l = 0; l < NL; l++) LLMREF_RD(m->layers[l].wk, dk * E);
    for (int64_t l = 0; l < NL; l++) LLMREF_RD(m->layers[l].wv, dk * E);
    for (int64_t l = 0; l < NL; l++) LLMREF_RD(m->layers[l].wo, E * E);
    for (int64_t l = 0; l < NL; l++) LLMREF_RD(m->layers[l].ffn_norm, E);
    for (int64_t l = 0; l < NL; l++) LLMREF_RD(m->layers[l].w_gate, F * E);
    for (int64_t l = 0; l < NL; l++) LLMREF_RD(m->layers[l].w_down, E * F);
    for (int64_t l = 0; l < NL; l++) LLMREF_RD(m->layers[l].w_up, F * E);
    LLMREF_RD(m->output_norm, E);
    LLMREF_RD((double *)NULL, m->n_ctx_train * m->hd_k); /* freq_cis_real, freq_cis_imag */
    if (!m->tied) LLMREF_RD(m->output, m->n_vocab * E);
#undef LLMREF_RD
    free(buf);
    fclose(f);
    if (!ok) {
        llmref_model_free(m);
        return llmref__fail("llama2.c: %s is truncated (or out of memory)", path);
    }
    return 0;
}

/* --------------------------------------------------------------------- */
/* The forward pass                                                       */

/* out[0..n) = v / sqrt(mean(v^2) + eps) * w   (out may alias v) */
static inline void llmref_rmsnorm(double *out, const double *v, const double *w, int64_t n, double eps) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += v[i] * v[i];
    double r = 1.0 / sqrt(ss / (double)n + eps);
    for (int64_t i = 0; i < n; i++) out[i] = v[i] * r * w[i];
}

/* W [n_out][n_in] @ x [n_in] (+ b [n_out]) -> y [n_out] */
static inline void llmref_matvec(double *y, const double *W, const double *x, const double *b, int64_t n_out,
                                 int64_t n_in) {
    for (int64_t o = 0; o < n_out; o++) {
        const double *w = W + o * n_in;
        double s = 0;
        for (int64_t i = 0; i < n_in; i++) s += w[i] * x[i];
        y[o] = s + (b ? b[o] : 0.0);
    }
}

/* Rotates one head vector v [hd_k] for position pos: pair i < n_rot/2 turns
 * by theta_i = (pos / rope_factor) * base^(-2i/n_rot) / ff_i (ff: rope_freqs,
 * else the LongRoPE factors in use, else 1) and both its values are then
 * multiplied by rope_attn_factor (llama.cpp's mscale on cos and sin); dims
 * at or above n_rot stay. A sliding layer uses rope_base_swa and
 * rope_factor_swa instead. */
static inline void llmref_rope_layer(const llmref_model *m, double *v, int64_t pos, int sliding) {
    int64_t half = m->n_rot / 2;
    double p = (double)pos / (sliding ? m->rope_factor_swa : m->rope_factor);
    double base = sliding ? m->rope_base_swa : m->rope_base;
    const double *ff = m->rope_freqs ? m->rope_freqs : m->rope_factors;
    for (int64_t i = 0; i < half; i++) {
        double theta = p * pow(base, -2.0 * (double)i / (double)m->n_rot);
        if (ff) theta /= ff[i];
        double c = cos(theta) * m->rope_attn_factor, s = sin(theta) * m->rope_attn_factor;
        int64_t ia = m->rope_neox ? i : 2 * i, ib = m->rope_neox ? i + half : 2 * i + 1;
        double a = v[ia], b = v[ib];
        v[ia] = a * c - b * s;
        v[ib] = a * s + b * c;
    }
}

/* The global layers' rotation. */
static inline void llmref_rope(const llmref_model *m, double *v, int64_t pos) { llmref_rope_layer(m, v, pos, 0); }

/* Each of the heads [heads][hd] of v RMS-normed with w [hd] (q/k norm). */
static inline void llmref_head_norm(double *v, const double *w, int64_t heads, int64_t hd, double eps) {
    for (int64_t h = 0; h < heads; h++) llmref_rmsnorm(v + h * hd, v + h * hd, w, hd, eps);
}

static inline double llmref_silu(double z) { return z / (1.0 + exp(-z)); }
static inline double llmref_gelu_tanh(double z) {
    const double k = 0.79788456080286535588; /* sqrt(2/pi) */
    return 0.5 * z * (1.0 + tanh(k * (z + 0.044715 * z * z * z)));
}

/* Options of llmref_forward_ex; zeros are the defaults. */
typedef struct {
    int64_t pos0;   /* position of ids[0] (no tokens before it): RoPE and the window see pos0 + t */
    int64_t row0;   /* logits only for rows row0..n-1: logits is [n - row0][n_vocab] */
    double *hidden; /* optional [n][n_embd]: the residual stream after the last layer (before output_norm) */
} llmref_opts;

/* Full causal forward of ids[0..n), no cache: logits [n - row0][n_vocab]
 * for rows row0..n-1 (logits may be NULL to get only o->hidden). Every
 * intermediate is double. -1 for an id out of range, a bad option or no
 * memory. */
static inline int llmref_forward_ex(const llmref_model *m, const int32_t *ids, int64_t n, const llmref_opts *o,
                                    double *logits) {
    llmref_opts def = {0, 0, NULL};
    if (!o) o = &def;
    if (n < 1 || o->row0 < 0 || o->row0 > n || o->pos0 < 0)
        return llmref__fail("forward: n = %lld, row0 = %lld, pos0 = %lld", (long long)n, (long long)o->row0,
                            (long long)o->pos0);
    for (int64_t t = 0; t < n; t++)
        if (ids[t] < 0 || ids[t] >= m->n_vocab)
            return llmref__fail("forward: id %d at %lld is outside [0, %lld)", ids[t], (long long)t,
                                (long long)m->n_vocab);
    const int64_t E = m->n_embd, F = m->n_ff, H = m->n_head, Hkv = m->n_head_kv, dk = m->hd_k, dv = m->hd_v;
    const int64_t group = H / Hkv;
    double *x = malloc((size_t)(n * E) * sizeof *x);         /* [n][E] residual */
    double *h = malloc((size_t)E * sizeof *h);               /* [E] normed input of a sublayer */
    double *q = malloc((size_t)(n * H * dk) * sizeof *q);    /* [n][H*dk] */
    double *k = malloc((size_t)(n * Hkv * dk) * sizeof *k);  /* [n][Hkv*dk] */
    double *v = malloc((size_t)(n * Hkv * dv) * sizeof *v);  /* [n][Hkv*dv] */
    double *a = malloc((size_t)(H * dv) * sizeof *a);        /* [H*dv] attention output of one token */
    double *ob = malloc((size_t)(n * E) * sizeof *ob);       /* [n][E] sublayer outputs */
    double *gt = malloc((size_t)F * sizeof *gt);             /* [F] gate */
    double *up = malloc((size_t)F * sizeof *up);             /* [F] up */
    double *w = malloc((size_t)n * sizeof *w);               /* [n] scores of one query */
    int rc = 0;
    if (!x || !h || !q || !k || !v || !a || !ob || !gt || !up || !w) {
        rc = llmref__fail("forward: out of memory");
        goto done;
    }
    for (int64_t t = 0; t < n; t++)
        for (int64_t i = 0; i < E; i++) x[t * E + i] = m->tok_embd[(int64_t)ids[t] * E + i] * m->embd_scale;

    for (int64_t il = 0; il < m->n_layer; il++) {
        const llmref_layer *L = &m->layers[il];
        int sliding = llmref_layer_slides(m, il);
        /* attention: q, k, v of every token, (q/k-normed per head,) rotated */
        for (int64_t t = 0; t < n; t++) {
            llmref_rmsnorm(h, x + t * E, L->attn_norm, E, m->rms_eps);
            llmref_matvec(q + t * H * dk, L->wq, h, L->bq, H * dk, E);
            llmref_matvec(k + t * Hkv * dk, L->wk, h, L->bk, Hkv * dk, E);
            llmref_matvec(v + t * Hkv * dv, L->wv, h, L->bv, Hkv * dv, E);
            if (L->q_norm) llmref_head_norm(q + t * H * dk, L->q_norm, H, dk, m->rms_eps);
            if (L->k_norm) llmref_head_norm(k + t * Hkv * dk, L->k_norm, Hkv, dk, m->rms_eps);
            for (int64_t hh = 0; hh < H; hh++) llmref_rope_layer(m, q + (t * H + hh) * dk, o->pos0 + t, sliding);
            for (int64_t hh = 0; hh < Hkv; hh++) llmref_rope_layer(m, k + (t * Hkv + hh) * dk, o->pos0 + t, sliding);
        }
        for (int64_t t = 0; t < n; t++) {
            int64_t p = o->pos0 + t;
            for (int64_t hh = 0; hh < H; hh++) {
                const double *qh = q + (t * H + hh) * dk;
                int64_t kvh = hh / group;
                double smax = -INFINITY;
                for (int64_t j = 0; j <= t; j++) {
                    int64_t pj = o->pos0 + j;
                    if (sliding && !(pj > p - m->sliding_window)) {
                        w[j] = -INFINITY;
                        continue;
                    }
                    const double *kj = k + (j * Hkv + kvh) * dk;
                    double s = 0;
                    for (int64_t d = 0; d < dk; d++) s += qh[d] * kj[d];
                    s *= m->attn_scale;
                    if (m->attn_softcap > 0) s = m->attn_softcap * tanh(s / m->attn_softcap);
                    w[j] = s;
                    if (s > smax) smax = s;
                }
                double sum = 0;
                for (int64_t j = 0; j <= t; j++) {
                    w[j] = w[j] == -INFINITY ? 0.0 : exp(w[j] - smax);
                    sum += w[j];
                }
                double *ah = a + hh * dv;
                for (int64_t d = 0; d < dv; d++) ah[d] = 0;
                for (int64_t j = 0; j <= t; j++) {
                    if (w[j] == 0) continue;
                    const double *vj = v + (j * Hkv + kvh) * dv;
                    double pw = w[j] / sum;
                    for (int64_t d = 0; d < dv; d++) ah[d] += pw * vj[d];
                }
            }
            llmref_matvec(ob + t * E, L->wo, a, L->bo, E, H * dv);
        }
        for (int64_t t = 0; t < n; t++) {
            if (L->post_attn_norm) llmref_rmsnorm(ob + t * E, ob + t * E, L->post_attn_norm, E, m->rms_eps);
            for (int64_t i = 0; i < E; i++) x[t * E + i] += ob[t * E + i];
        }
        /* feed-forward */
        for (int64_t t = 0; t < n; t++) {
            llmref_rmsnorm(h, x + t * E, L->ffn_norm, E, m->rms_eps);
            llmref_matvec(gt, L->w_gate, h, L->b_gate, F, E); /* biases before the activation */
            llmref_matvec(up, L->w_up, h, L->b_up, F, E);
            for (int64_t i = 0; i < F; i++) gt[i] = (m->gelu ? llmref_gelu_tanh(gt[i]) : llmref_silu(gt[i])) * up[i];
            double *f = ob + t * E;
            llmref_matvec(f, L->w_down, gt, L->b_down, E, F);
            if (L->post_ffw_norm) llmref_rmsnorm(f, f, L->post_ffw_norm, E, m->rms_eps);
            for (int64_t i = 0; i < E; i++) x[t * E + i] += f[i];
        }
    }
    if (o->hidden) memcpy(o->hidden, x, (size_t)(n * E) * sizeof *x);
    if (logits)
        for (int64_t t = o->row0; t < n; t++) {
            double *lg = logits + (t - o->row0) * m->n_vocab;
            llmref_rmsnorm(h, x + t * E, m->output_norm, E, m->rms_eps);
            llmref_matvec(lg, m->output, h, m->output_bias, m->n_vocab, E);
            if (m->final_softcap > 0)
                for (int64_t i = 0; i < m->n_vocab; i++) lg[i] = m->final_softcap * tanh(lg[i] / m->final_softcap);
        }
done:
    free(x);
    free(h);
    free(q);
    free(k);
    free(v);
    free(a);
    free(ob);
    free(gt);
    free(up);
    free(w);
    return rc;
}

/* logits [n][n_vocab] of ids[0..n) at positions 0..n-1. */
static inline int llmref_forward(const llmref_model *m, const int32_t *ids, int64_t n, double *logits) {
    return llmref_forward_ex(m, ids, n, NULL, logits);
}

/* Index of the largest x[i]; the lowest index on ties. */
static inline int64_t llmref_argmax(const double *x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Greedy decoding: seq [n_prompt + n_gen] starts with the prompt; each new
 * id is the argmax of the last row of a full forward over seq so far. */
static inline int llmref_greedy(const llmref_model *m, int32_t *seq, int64_t n_prompt, int64_t n_gen) {
    double *lg = malloc((size_t)m->n_vocab * sizeof *lg);
    if (!lg) return llmref__fail("greedy: out of memory");
    for (int64_t i = 0; i < n_gen; i++) {
        int64_t n = n_prompt + i;
        llmref_opts o = {0, n - 1, NULL};
        if (llmref_forward_ex(m, seq, n, &o, lg)) {
            free(lg);
            return -1;
        }
        seq[n] = (int32_t)llmref_argmax(lg, m->n_vocab);
    }
    free(lg);
    return 0;
}

/* --------------------------------------------------------------------- */
/* Fixtures: tiny random GGUF models                                      */

/* What a fixture holds. Fields that name an optional key: 0 (or NULL)
 * leaves the key out, so the reader's default applies. */
typedef struct {
    const char *arch;          /* general.architecture: "llama", "qwen2", "gemma2", "qwen3", "gemma3",
                                  "phi3" (written as given); qwen3 and gemma3 get attn_q/k_norm, gemma2
                                  and gemma3 post norms, phi3 one ffn_up of 2 n_ff rows (no ffn_gate) */
    uint32_t wtype;            /* ggml type of the layer matrices */
    uint32_t embd_type;        /* token_embd.weight */
    uint32_t output_type;      /* output.weight (when not tied) */
    uint32_t norm_type;        /* norms and biases (F32; F16/BF16 also read) */
    int64_t n_vocab, n_embd, n_layer, n_head, n_ff, n_ctx_train;
    int64_t n_head_kv;         /* 0: key out (= n_head) */
    int64_t head_dim;          /* attention.key_length; 0: key out (= n_embd / n_head) */
    int64_t head_dim_v;        /* attention.value_length; 0: key out (= key length) */
    int64_t n_rot;             /* rope.dimension_count; 0: key out (= key length) */
    double rope_base;          /* rope.freq_base; 0: key out (10000) */
    const char *rope_scaling_type; /* rope.scaling.type; NULL: key out */
    double rope_scaling_factor;    /* rope.scaling.factor; 0: key out */
    int rope_freqs;            /* write rope_freqs.weight [n_rot/2], values in [1, 4) */
    int biases;                /* write attn_q/k/v.bias (qwen2 needs them) */
    int out_bias;              /* write attn_output.bias [n_embd] */
    int ffn_biases;            /* write ffn_gate.bias, ffn_up.bias [n_ff], ffn_down.bias [n_embd] */
    int output_bias;           /* write output.bias [n_vocab] */
    int fused_qkv;             /* one attn_qkv.weight (and attn_qkv.bias with biases) for q, k, v */
    double rms_eps;            /* attention.layer_norm_rms_epsilon; 0: key out */
    double attn_softcap;       /* gemma2.attn_logit_softcapping; 0: key out (50) */
    double final_softcap;      /* gemma2.final_logit_softcapping; 0: key out (30) */
    int64_t sliding_window;    /* A.attention.sliding_window; 0: key out (gemma2 4096, gemma3 none) */
    int64_t swa_pattern;       /* A.attention.sliding_window_pattern; 0: key out (gemma2 2, gemma3 6) */
    const uint8_t *swa_flags;  /* or that key as a BOOL array of n_swa_flags (when swa_pattern is 0) */
    int64_t n_swa_flags;
    double rope_base_swa;      /* A.rope.freq_base_swa; 0: key out */
    int rope_factors;          /* write rope_factors_long/short.weight [n_rot/2], values in [1, 4) */
    double rope_attn_factor;   /* A.rope.scaling.attn_factor; 0: key out (1) */
    int64_t n_ctx_orig;        /* A.rope.scaling.original_context_length; 0: key out (n_ctx_train) */
    int tied;                  /* 1: no output.weight */
    dhsa_gguf_type int_type;   /* type of the integer keys; 0 (UINT8, too small) means UINT32 */
    int f64_keys;              /* 1: float keys as FLOAT64 (else FLOAT32) */
    const char *omit_tensor;   /* leave this tensor out (loader tests); NULL: none */
    const char *extra_tensor;  /* add a tensor of this name, [n_embd] (loader tests); NULL: none */
    double k_bias_big;         /* with biases: attn_k.bias is this (alternating sign per KV head) on
                                  channels n_rot/2 - 1 and n_rot - 1 of each KV head, the pair NeoX
                                  RoPE turns slowest, as in Qwen2.5's (0: plain random biases) */
    uint64_t seed;
} llmref_spec;

/* A small spec for arch and matrix type. The float types and the 32-blocks
 * get n_embd 64, n_ff 96, 4 query heads of 16 on 2 KV heads; the K types
 * (rows must be multiples of 256) n_embd 256, n_ff 512, 4 heads of 64 on 2.
 * n_vocab 320 (3 control, 256 byte tokens, 61 pieces), 2 layers, separate
 * output, every optional key written except rope scaling; qwen2 gets
 * biases; gemma2 gets caps small enough to act (attn 5, final 3) and a
 * window of 5; gemma3 a window of 5 on every other layer (pattern 2, so
 * both kinds of layer are among the two) with a local RoPE base of 1000;
 * phi3 a fused attn_qkv. */
static inline llmref_spec llmref_spec_default(const char *arch, uint32_t wtype) {
    llmref_spec s;
    memset(&s, 0, sizeof s);
    int kq = llmref_type_block(wtype) == 256;
    s.arch = arch;
    s.wtype = s.embd_type = s.output_type = wtype;
    s.norm_type = LLMREF_F32;
    s.n_vocab = 320;
    s.n_embd = kq ? 256 : 64;
    s.n_ff = kq ? 512 : 96;
    s.n_layer = 2;
    s.n_head = 4;
    s.n_head_kv = 2;
    s.head_dim = kq ? 64 : 16;
    s.head_dim_v = s.head_dim;
    s.n_rot = s.head_dim;
    s.n_ctx_train = 256;
    s.rope_base = 10000;
    s.rms_eps = strcmp(arch, "gemma2") == 0 || strcmp(arch, "gemma3") == 0 ? 1e-6 : 1e-5;
    s.biases = strcmp(arch, "qwen2") == 0;
    if (strcmp(arch, "gemma2") == 0) {
        s.attn_softcap = 5;
        s.final_softcap = 3;
        s.sliding_window = 5;
    }
    if (strcmp(arch, "gemma3") == 0) {
        s.sliding_window = 5;
        s.swa_pattern = 2;
        s.rope_base_swa = 1000;
    }
    s.fused_qkv = strcmp(arch, "phi3") == 0;
    s.int_type = DHSA_GGUF_UINT32;
    s.seed = 1;
    return s;
}

/* The sizes a spec implies (defaults applied as the reader would). */
static inline void llmref__spec_dims(const llmref_spec *s, int64_t *n_kv, int64_t *hdk, int64_t *hdv, int64_t *rot) {
    *n_kv = s->n_head_kv ? s->n_head_kv : s->n_head;
    *hdk = s->head_dim ? s->head_dim : (s->n_head ? s->n_embd / s->n_head : 0);
    *hdv = s->head_dim_v ? s->head_dim_v : *hdk;
    *rot = s->n_rot ? s->n_rot : *hdk;
}

/* Token texts of a fixture vocabulary (n strings, malloc'd, and an array of
 * them): <unk>, <s>, </s>, <0x00>..<0xFF> when n >= 288, then
 * pieces: words ("▁the", ...), letters, "▁", ",", ".", then "▁w<i>". */
#define LLMREF_SPACE "\xe2\x96\x81" /* U+2581, the SentencePiece space */
static inline char **llmref__vocab(int64_t n, float *scores, int32_t *types) {
    static const char *const words[] = {
        LLMREF_SPACE "the",  LLMREF_SPACE "a",     LLMREF_SPACE "and",    LLMREF_SPACE "to",    LLMREF_SPACE "was",
        LLMREF_SPACE "he",   LLMREF_SPACE "she",   LLMREF_SPACE "it",     LLMREF_SPACE "of",    LLMREF_SPACE "in",
        LLMREF_SPACE "time", LLMREF_SPACE "once",  LLMREF_SPACE "upon",   LLMREF_SPACE "there", LLMREF_SPACE "little",
        LLMREF_SPACE "girl", LLMREF_SPACE "named", LLMREF_SPACE "play",   LLMREF_SPACE "park",  LLMREF_SPACE,
        ",",                ".",                 "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m",
        "n", "o", "p", "q", "r", "s", "t", "u", "v", "w", "x", "y", "z"};
    const int64_t n_words = (int64_t)(sizeof words / sizeof words[0]);
    char **tok = calloc((size_t)n, sizeof *tok);
    if (!tok) return NULL;
    int bytes = n >= 259 + 29;
    for (int64_t i = 0; i < n; i++) {
        char buf[32];
        int32_t type = DHSA_TOKEN_NORMAL;
        float score = 0;
        static const char *const special[3] = {"<unk>", "<s>", "</s>"};
        if (i < 3) {
            snprintf(buf, sizeof buf, "%s", special[i]);
            type = i == 0 ? DHSA_TOKEN_UNKNOWN : DHSA_TOKEN_CONTROL;
        } else if (bytes && i < 259) {
            snprintf(buf, sizeof buf, "<0x%02X>", (unsigned)(i - 3));
            type = DHSA_TOKEN_BYTE;
        } else {
            int64_t wi = i - (bytes ? 259 : 3);
            if (wi < n_words) snprintf(buf, sizeof buf, "%s", words[wi]);
            else snprintf(buf, sizeof buf, LLMREF_SPACE "w%lld", (long long)wi);
            score = -(float)wi;
        }
        tok[i] = malloc(strlen(buf) + 1);
        if (!tok[i]) {
            for (int64_t j = 0; j < i; j++) free(tok[j]);
            free(tok);
            return NULL;
        }
        strcpy(tok[i], buf);
        scores[i] = score;
        types[i] = type;
    }
    return tok;
}

/* Builder state: the writer borrows tensor bytes until the write. */
typedef struct {
    dhsa_gguf_writer *w;
    void **bufs;
    int64_t n_bufs, cap_bufs;
    const llmref_spec *s;
    int failed;
} llmref__fx;

static inline void llmref__fx_tensor(llmref__fx *fx, const char *name, uint32_t type, int64_t n_in, int64_t n_out,
                                     int kind /* 0 matrix, 1 norm, 2 bias, 3 rope_freqs */) {
    if (fx->failed) return;
    if (fx->s->omit_tensor && strcmp(fx->s->omit_tensor, name) == 0) return;
    int64_t n = n_in * (n_out ? n_out : 1);
    int64_t bytes = llmref_type_bytes(type, n);
    if (bytes < 0 || (n_in % llmref_type_block(type))) {
        fx->failed = llmref__fail("fixture: %s [%lld, %lld] cannot be stored as %s (rows of %lld values)", name,
                                  (long long)n_in, (long long)n_out, llmref_type_name(type),
                                  (long long)llmref_type_block(type));
        return;
    }
    double *val = malloc((size_t)n * sizeof *val);
    void *buf = malloc((size_t)(bytes ? bytes : 1));
    if (fx->n_bufs == fx->cap_bufs) {
        int64_t cap = fx->cap_bufs * 2 + 16;
        void **nb = realloc(fx->bufs, (size_t)cap * sizeof *nb);
        if (nb) {
            fx->bufs = nb;
            fx->cap_bufs = cap;
        }
    }
    if (!val || !buf || fx->n_bufs == fx->cap_bufs) {
        free(val);
        free(buf);
        fx->failed = llmref__fail("fixture: out of memory");
        return;
    }
    fx->bufs[fx->n_bufs++] = buf;
    uint64_t st = llmref__hash(fx->s->seed, name); /* per tensor: the others' presence changes nothing */
    double sd = 1.0 / sqrt((double)n_in);
    for (int64_t i = 0; i < n; i++) {
        switch (kind) {
        case 0: val[i] = sd * llmref_rand_normal(&st); break;
        case 1: val[i] = 0.8 + 0.4 * llmref_rand_uniform(&st); break;
        case 2: val[i] = 0.3 * (2.0 * llmref_rand_uniform(&st) - 1.0); break;
        default: val[i] = 1.0 + 3.0 * llmref_rand_uniform(&st); break;
        }
    }
    if (kind == 2 && fx->s->k_bias_big != 0 && strstr(name, "attn_k.bias")) {
        int64_t n_kv, hdk, hdv, rot;
        llmref__spec_dims(fx->s, &n_kv, &hdk, &hdv, &rot);
        for (int64_t h = 0; h < n_kv; h++) {
            double big = h % 2 ? -fx->s->k_bias_big : fx->s->k_bias_big;
            val[h * hdk + rot / 2 - 1] = big;
            val[h * hdk + rot - 1] = 0.8 * big;
        }
    }
    int rc = llmref_quantize(type, val, n, buf);
    free(val);
    if (rc) {
        fx->failed = -1;
        return;
    }
    int64_t dims[2] = {n_in, n_out};
    if (dhsa_gguf_writer_add_tensor(fx->w, name, type, n_out ? 2 : 1, dims, buf, bytes) != DHSA_OK)
        fx->failed = llmref__fail("fixture: add %s: %s", name, dhsa_last_error());
}

static inline void llmref__fx_int(llmref__fx *fx, const char *key, int64_t v) {
    if (fx->failed) return;
    dhsa_status st;
    switch (fx->s->int_type) {
    case DHSA_GGUF_UINT16: st = dhsa_gguf_writer_set_u16(fx->w, key, (uint16_t)v); break;
    case DHSA_GGUF_INT16: st = dhsa_gguf_writer_set_i16(fx->w, key, (int16_t)v); break;
    case DHSA_GGUF_INT32: st = dhsa_gguf_writer_set_i32(fx->w, key, (int32_t)v); break;
    case DHSA_GGUF_UINT64: st = dhsa_gguf_writer_set_u64(fx->w, key, (uint64_t)v); break;
    case DHSA_GGUF_INT64: st = dhsa_gguf_writer_set_i64(fx->w, key, v); break;
    default: st = dhsa_gguf_writer_set_u32(fx->w, key, (uint32_t)v); break;
    }
    if (st != DHSA_OK) fx->failed = llmref__fail("fixture: set %s: %s", key, dhsa_last_error());
}

static inline void llmref__fx_float(llmref__fx *fx, const char *key, double v) {
    if (fx->failed) return;
    dhsa_status st = fx->s->f64_keys ? dhsa_gguf_writer_set_f64(fx->w, key, v)
                                     : dhsa_gguf_writer_set_f32(fx->w, key, (float)v);
    if (st != DHSA_OK) fx->failed = llmref__fail("fixture: set %s: %s", key, dhsa_last_error());
}

static inline void llmref__fx_str(llmref__fx *fx, const char *key, const char *v) {
    if (fx->failed) return;
    if (dhsa_gguf_writer_set_str(fx->w, key, v) != DHSA_OK)
        fx->failed = llmref__fail("fixture: set %s: %s", key, dhsa_last_error());
}

/* Builds the GGUF file of spec s in memory: *bytes (malloc'd, the caller
 * frees) of *size bytes. Weights are random and deterministic for
 * (seed, tensor name): matrices ~ N(0, 1/n_in) (token_embd and output
 * too, so logits stay O(1)), norms uniform in [0.8, 1.2), biases in
 * [-0.3, 0.3), stored in the spec's types. Metadata: the architecture's
 * keys and a SentencePiece ("llama") vocabulary of n_vocab tokens with
 * scores, token types and bos 1 / eos 2 / unk 0. -1 with llmref_error()
 * when the spec cannot be written (e.g. a K type with rows not a multiple
 * of 256). */
static inline int llmref_fixture_build(const llmref_spec *s, uint8_t **bytes, size_t *size) {
    *bytes = NULL;
    *size = 0;
    int64_t n_kv, hdk, hdv, rot;
    llmref__spec_dims(s, &n_kv, &hdk, &hdv, &rot);
    if (!s->arch || s->n_vocab < 3 || s->n_embd < 1 || s->n_layer < 1 || s->n_head < 1 || s->n_ff < 1 ||
        hdk < 1 || hdv < 1 || rot < 0 || rot % 2)
        return llmref__fail("fixture: bad spec (arch %s, n_vocab %lld, n_embd %lld, n_head %lld, hd %lld, n_rot %lld)",
                            s->arch ? s->arch : "NULL", (long long)s->n_vocab, (long long)s->n_embd,
                            (long long)s->n_head, (long long)hdk, (long long)rot);
    llmref__fx fx;
    memset(&fx, 0, sizeof fx);
    fx.s = s;
    if (dhsa_gguf_writer_create(&fx.w) != DHSA_OK) return llmref__fail("fixture: %s", dhsa_last_error());
    const char *A = s->arch;
    char key[160], name[96];
#define LLMREF_K(suffix) (snprintf(key, sizeof key, "%s.%s", A, suffix), key)
    llmref__fx_str(&fx, "general.architecture", A);
    llmref__fx_str(&fx, "general.name", "llmref fixture");
    llmref__fx_int(&fx, LLMREF_K("context_length"), s->n_ctx_train);
    llmref__fx_int(&fx, LLMREF_K("embedding_length"), s->n_embd);
    llmref__fx_int(&fx, LLMREF_K("block_count"), s->n_layer);
    llmref__fx_int(&fx, LLMREF_K("feed_forward_length"), s->n_ff);
    llmref__fx_int(&fx, LLMREF_K("attention.head_count"), s->n_head);
    if (s->n_head_kv) llmref__fx_int(&fx, LLMREF_K("attention.head_count_kv"), s->n_head_kv);
    if (s->head_dim) llmref__fx_int(&fx, LLMREF_K("attention.key_length"), s->head_dim);
    if (s->head_dim_v) llmref__fx_int(&fx, LLMREF_K("attention.value_length"), s->head_dim_v);
    if (s->n_rot) llmref__fx_int(&fx, LLMREF_K("rope.dimension_count"), s->n_rot);
    if (s->rms_eps != 0) llmref__fx_float(&fx, LLMREF_K("attention.layer_norm_rms_epsilon"), s->rms_eps);
    if (s->rope_base != 0) llmref__fx_float(&fx, LLMREF_K("rope.freq_base"), s->rope_base);
    if (s->rope_scaling_type) llmref__fx_str(&fx, LLMREF_K("rope.scaling.type"), s->rope_scaling_type);
    if (s->rope_scaling_factor != 0) llmref__fx_float(&fx, LLMREF_K("rope.scaling.factor"), s->rope_scaling_factor);
    if (s->attn_softcap != 0) llmref__fx_float(&fx, LLMREF_K("attn_logit_softcapping"), s->attn_softcap);
    if (s->final_softcap != 0) llmref__fx_float(&fx, LLMREF_K("final_logit_softcapping"), s->final_softcap);
    if (s->sliding_window) llmref__fx_int(&fx, LLMREF_K("attention.sliding_window"), s->sliding_window);
    if (s->swa_pattern) llmref__fx_int(&fx, LLMREF_K("attention.sliding_window_pattern"), s->swa_pattern);
    if (!s->swa_pattern && s->swa_flags && !fx.failed &&
        dhsa_gguf_writer_set_arr(fx.w, LLMREF_K("attention.sliding_window_pattern"), DHSA_GGUF_BOOL, s->swa_flags,
                                 s->n_swa_flags) != DHSA_OK)
        fx.failed = llmref__fail("fixture: set %s: %s", key, dhsa_last_error());
    if (s->rope_base_swa != 0) llmref__fx_float(&fx, LLMREF_K("rope.freq_base_swa"), s->rope_base_swa);
    if (s->rope_attn_factor != 0) llmref__fx_float(&fx, LLMREF_K("rope.scaling.attn_factor"), s->rope_attn_factor);
    if (s->n_ctx_orig) llmref__fx_int(&fx, LLMREF_K("rope.scaling.original_context_length"), s->n_ctx_orig);
#undef LLMREF_K

    /* vocabulary */
    float *scores = malloc((size_t)s->n_vocab * sizeof *scores);
    int32_t *types = malloc((size_t)s->n_vocab * sizeof *types);
    char **tok = scores && types ? llmref__vocab(s->n_vocab, scores, types) : NULL;
    if (!tok && !fx.failed) fx.failed = llmref__fail("fixture: out of memory");
    llmref__fx_str(&fx, "tokenizer.ggml.model", "llama");
    if (!fx.failed &&
        (dhsa_gguf_writer_set_arr_str(fx.w, "tokenizer.ggml.tokens", (const char *const *)tok, s->n_vocab) ||
         dhsa_gguf_writer_set_arr(fx.w, "tokenizer.ggml.scores", DHSA_GGUF_FLOAT32, scores, s->n_vocab) ||
         dhsa_gguf_writer_set_arr(fx.w, "tokenizer.ggml.token_type", DHSA_GGUF_INT32, types, s->n_vocab) ||
         dhsa_gguf_writer_set_u32(fx.w, "tokenizer.ggml.bos_token_id", 1) ||
         dhsa_gguf_writer_set_u32(fx.w, "tokenizer.ggml.eos_token_id", 2) ||
         dhsa_gguf_writer_set_u32(fx.w, "tokenizer.ggml.unknown_token_id", 0)))
        fx.failed = llmref__fail("fixture: tokenizer keys: %s", dhsa_last_error());
    if (tok)
        for (int64_t i = 0; i < s->n_vocab; i++) free(tok[i]);
    free(tok);
    free(scores);
    free(types);

    /* tensors */
    int64_t E = s->n_embd;
    llmref__fx_tensor(&fx, "token_embd.weight", s->embd_type, E, s->n_vocab, 0);
    llmref__fx_tensor(&fx, "output_norm.weight", s->norm_type, E, 0, 1);
    if (!s->tied) llmref__fx_tensor(&fx, "output.weight", s->output_type, E, s->n_vocab, 0);
    if (s->output_bias) llmref__fx_tensor(&fx, "output.bias", s->norm_type, s->n_vocab, 0, 2);
    if (s->extra_tensor) llmref__fx_tensor(&fx, s->extra_tensor, LLMREF_F32, E, 0, 1);
    if (s->rope_freqs) llmref__fx_tensor(&fx, "rope_freqs.weight", LLMREF_F32, rot / 2, 0, 3);
    if (s->rope_factors) {
        llmref__fx_tensor(&fx, "rope_factors_long.weight", LLMREF_F32, rot / 2, 0, 3);
        llmref__fx_tensor(&fx, "rope_factors_short.weight", LLMREF_F32, rot / 2, 0, 3);
    }
    int gemma = strcmp(A, "gemma2") == 0 || strcmp(A, "gemma3") == 0;
    int qk_norm = strcmp(A, "qwen3") == 0 || strcmp(A, "gemma3") == 0, fused_ffn = strcmp(A, "phi3") == 0;
    for (int64_t l = 0; l < s->n_layer; l++) {
#define LLMREF_N(suffix) (snprintf(name, sizeof name, "blk.%lld.%s", (long long)l, suffix), name)
        llmref__fx_tensor(&fx, LLMREF_N("attn_norm.weight"), s->norm_type, E, 0, 1);
        if (s->fused_qkv) {
            llmref__fx_tensor(&fx, LLMREF_N("attn_qkv.weight"), s->wtype, E, (s->n_head + n_kv) * hdk + n_kv * hdv, 0);
        } else {
            llmref__fx_tensor(&fx, LLMREF_N("attn_q.weight"), s->wtype, E, s->n_head * hdk, 0);
            llmref__fx_tensor(&fx, LLMREF_N("attn_k.weight"), s->wtype, E, n_kv * hdk, 0);
            llmref__fx_tensor(&fx, LLMREF_N("attn_v.weight"), s->wtype, E, n_kv * hdv, 0);
        }
        if (s->biases && s->fused_qkv) {
            llmref__fx_tensor(&fx, LLMREF_N("attn_qkv.bias"), s->norm_type, (s->n_head + n_kv) * hdk + n_kv * hdv, 0, 2);
        } else if (s->biases) {
            llmref__fx_tensor(&fx, LLMREF_N("attn_q.bias"), s->norm_type, s->n_head * hdk, 0, 2);
            llmref__fx_tensor(&fx, LLMREF_N("attn_k.bias"), s->norm_type, n_kv * hdk, 0, 2);
            llmref__fx_tensor(&fx, LLMREF_N("attn_v.bias"), s->norm_type, n_kv * hdv, 0, 2);
        }
        if (qk_norm) {
            llmref__fx_tensor(&fx, LLMREF_N("attn_q_norm.weight"), s->norm_type, hdk, 0, 1);
            llmref__fx_tensor(&fx, LLMREF_N("attn_k_norm.weight"), s->norm_type, hdk, 0, 1);
        }
        llmref__fx_tensor(&fx, LLMREF_N("attn_output.weight"), s->wtype, s->n_head * hdv, E, 0);
        if (s->out_bias) llmref__fx_tensor(&fx, LLMREF_N("attn_output.bias"), s->norm_type, E, 0, 2);
        if (gemma) llmref__fx_tensor(&fx, LLMREF_N("post_attention_norm.weight"), s->norm_type, E, 0, 1);
        llmref__fx_tensor(&fx, LLMREF_N("ffn_norm.weight"), s->norm_type, E, 0, 1);
        if (fused_ffn) {
            llmref__fx_tensor(&fx, LLMREF_N("ffn_up.weight"), s->wtype, E, 2 * s->n_ff, 0);
        } else {
            llmref__fx_tensor(&fx, LLMREF_N("ffn_gate.weight"), s->wtype, E, s->n_ff, 0);
            llmref__fx_tensor(&fx, LLMREF_N("ffn_up.weight"), s->wtype, E, s->n_ff, 0);
        }
        llmref__fx_tensor(&fx, LLMREF_N("ffn_down.weight"), s->wtype, s->n_ff, E, 0);
        if (s->ffn_biases && fused_ffn) {
            llmref__fx_tensor(&fx, LLMREF_N("ffn_up.bias"), s->norm_type, 2 * s->n_ff, 0, 2);
            llmref__fx_tensor(&fx, LLMREF_N("ffn_down.bias"), s->norm_type, E, 0, 2);
        } else if (s->ffn_biases) {
            llmref__fx_tensor(&fx, LLMREF_N("ffn_gate.bias"), s->norm_type, s->n_ff, 0, 2);
            llmref__fx_tensor(&fx, LLMREF_N("ffn_up.bias"), s->norm_type, s->n_ff, 0, 2);
            llmref__fx_tensor(&fx, LLMREF_N("ffn_down.bias"), s->norm_type, E, 0, 2);
        }
        if (gemma) llmref__fx_tensor(&fx, LLMREF_N("post_ffw_norm.weight"), s->norm_type, E, 0, 1);
#undef LLMREF_N
    }

    if (!fx.failed) {
        size_t n = 0;
        if (dhsa_gguf_writer_size(fx.w, &n) != DHSA_OK || !(*bytes = malloc(n)) ||
            dhsa_gguf_writer_write_memory(fx.w, *bytes, n) != DHSA_OK) {
            fx.failed = llmref__fail("fixture: write: %s", dhsa_last_error());
            free(*bytes);
            *bytes = NULL;
        } else {
            *size = n;
        }
    }
    for (int64_t i = 0; i < fx.n_bufs; i++) free(fx.bufs[i]);
    free(fx.bufs);
    dhsa_gguf_writer_free(fx.w);
    return fx.failed ? -1 : 0;
}

/* The fixture of s written to path. */
static inline int llmref_fixture_write_file(const llmref_spec *s, const char *path) {
    uint8_t *b;
    size_t n;
    if (llmref_fixture_build(s, &b, &n)) return -1;
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(b, 1, n, f) == n;
    if (f && fclose(f) != 0) ok = 0;
    free(b);
    return ok ? 0 : llmref__fail("fixture: cannot write %s", path);
}

/* --------------------------------------------------------------------- */
/* Comparison                                                             */

typedef struct {
    int64_t n_bad;             /* elements with |a-b| > atol + rtol |ref| (NaN/Inf counts) */
    int64_t worst_row, worst_col; /* the element furthest over its bound */
    double worst_got, worst_ref, worst_ratio; /* |a-b| / (atol + rtol |ref|) there */
    double max_abs;            /* max |a-b| */
    double nmse;               /* sum (a-b)^2 / sum ref^2 */
} llmref_cmp;

static inline int llmref__compare(const char *what, const float *gf, const double *gd, const double *ref,
                                  int64_t rows, int64_t cols, double atol, double rtol, double nmse_max,
                                  llmref_cmp *out) {
    llmref_cmp c;
    memset(&c, 0, sizeof c);
    c.worst_ratio = -1;
    double se = 0, sr = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < cols; j++) {
            int64_t i = r * cols + j;
            double a = gf ? (double)gf[i] : gd[i], b = ref[i];
            double d = fabs(a - b), lim = atol + rtol * fabs(b);
            double ratio = isfinite(a) ? (lim > 0 ? d / lim : (d > 0 ? INFINITY : 0)) : INFINITY;
            if (!(d <= lim) || !isfinite(a)) c.n_bad++;
            if (ratio > c.worst_ratio) {
                c.worst_ratio = ratio;
                c.worst_row = r;
                c.worst_col = j;
                c.worst_got = a;
                c.worst_ref = b;
            }
            if (d > c.max_abs || !isfinite(a)) c.max_abs = isfinite(a) ? d : INFINITY;
            se += isfinite(a) ? d * d : INFINITY;
            sr += b * b;
        }
    c.nmse = sr > 0 ? se / sr : (se > 0 ? INFINITY : 0);
    int ok = c.n_bad == 0 && c.nmse <= nmse_max;
    if (!ok && c.n_bad == 0)
        fprintf(stderr, "%s: every element within atol %g + rtol %g * |ref|, but NMSE %.3g > %.3g (max |diff| %.3g)\n",
                what, atol, rtol, c.nmse, nmse_max, c.max_abs);
    else if (!ok)
        fprintf(stderr,
                "%s: %lld of %lld elements off; worst at (row %lld, col %lld): got %.9g, ref %.9g, |diff| %.3g > "
                "%.3g (atol %g + rtol %g * |ref|); max |diff| %.3g; NMSE %.3g (max %.3g)\n",
                what, (long long)c.n_bad, (long long)(rows * cols), (long long)c.worst_row, (long long)c.worst_col,
                c.worst_got, c.worst_ref, fabs(c.worst_got - c.worst_ref), atol + rtol * fabs(c.worst_ref), atol,
                rtol, c.max_abs, c.nmse, nmse_max);
    if (out) *out = c;
    return ok;
}

/* 1 when every element of got [rows][cols] (float: the runner's logits) is
 * within atol + rtol*|ref| of ref and the NMSE is <= nmse_max; else prints
 * "what", the worst element (row, col) and the NMSE to stderr and returns
 * 0. out (may be NULL) receives the statistics either way. */
static inline int llmref_compare(const char *what, const float *got, const double *ref, int64_t rows, int64_t cols,
                                 double atol, double rtol, double nmse_max, llmref_cmp *out) {
    return llmref__compare(what, got, NULL, ref, rows, cols, atol, rtol, nmse_max, out);
}

/* The same for double results (reference against reference). */
static inline int llmref_compare_d(const char *what, const double *got, const double *ref, int64_t rows, int64_t cols,
                                   double atol, double rtol, double nmse_max, llmref_cmp *out) {
    return llmref__compare(what, NULL, got, ref, rows, cols, atol, rtol, nmse_max, out);
}

#endif
