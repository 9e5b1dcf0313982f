/* f32_avx2.c: AVX2 + FMA + F16C kernels of the weight products, for x86
 * machines without AVX-512 (contract and summation order in f32.h).
 * Compiled with -mavx2 -mfma -mf16c by the Makefile; elsewhere this file is
 * empty and the scalar path runs.
 *
 * 8 lanes. Codes are widened to int32 and converted; Q4_K's scale and min
 * go in with one FMA, (d*sc)*q - dmin*m, whose product is exact, so the
 * values are the format's exactly (the sign of zero included); so do
 * Q4_1/Q5_1's d*q + m and Q2_K/Q5_K's. IQ4_NL / IQ4_XS look their grid up
 * with pshufb on int8, then widen and scale (exact products). Fused path:
 * 4 rows x up to 2 tokens of accumulators (16 ymm registers). Panel path:
 * 3 tokens x 4 rows. Both reduce the 8 lanes by the tree of f32.c's
 * scalar tile, so they agree bitwise with each other; they differ from the
 * scalar path only by FMA rounding.
 * Held to the scalar path by tests/test_quant.c.
 */
#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#include <string.h>

#include "matmul/f32.h"

#define INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 16")
#define R 4
/* prefetch distance of the fused path, in row groups; into L2 (T1), so
 * that prefetches do not hold the L1 fill buffers the loads need */
#define PF_GROUPS 2
#define TMAX 2
#define MR 3
#define NR 4

/* ----------------------------------------------------------- lane tree --- */

/* (v[j] + v[j+4]) -> (a0 + a2, a1 + a3) -> c0 + c1 */
INLINE __m128 tree4(__m256 v0, __m256 v1, __m256 v2, __m256 v3) {
    __m256 a01 = _mm256_add_ps(_mm256_permute2f128_ps(v0, v1, 0x20), _mm256_permute2f128_ps(v0, v1, 0x31));
    __m256 a23 = _mm256_add_ps(_mm256_permute2f128_ps(v2, v3, 0x20), _mm256_permute2f128_ps(v2, v3, 0x31));
    __m256 c = _mm256_add_ps(_mm256_shuffle_ps(a01, a23, _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(a01, a23, _MM_SHUFFLE(3, 2, 3, 2)));
    __m256 g = _mm256_add_ps(_mm256_shuffle_ps(c, c, _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm256_shuffle_ps(c, c, _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm_unpacklo_ps(_mm256_castps256_ps128(g), _mm256_extractf128_ps(g, 1));
}

/* ------------------------------------------------------------- decoders --- */

INLINE float half(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

INLINE __m256i tail_mask(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* 8 values of an F32/F16/BF16 row at column k; n < 8 reads only n (rest 0) */
INLINE __m256 load_float(uint32_t type, const uint8_t *row, int64_t k, int64_t n) {
    if (type == DHSA_GGML_F32) {
        if (n >= 8) return _mm256_loadu_ps((const float *)row + k);
        return _mm256_maskload_ps((const float *)row + k, tail_mask(n));
    }
    __m128i h;
    if (n >= 8) {
        h = _mm_loadu_si128((const __m128i *)(row + 2 * k));
    } else {
        uint16_t tmp[8] = {0};
        memcpy(tmp, row + 2 * k, (size_t)n * 2);
        h = _mm_loadu_si128((const __m128i *)tmp);
    }
    if (type == DHSA_GGML_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

INLINE __m256i bytes8(const uint8_t *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }
INLINE __m256i sbytes8(const uint8_t *p) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)); }

/* Q8_0 block -> 32 values */
INLINE void dec_q8_0(const uint8_t *blk, __m256 w[4]) {
    __m256 d = _mm256_set1_ps(half(blk));
    UNROLL for (int j = 0; j < 4; j++) w[j] = _mm256_mul_ps(_mm256_cvtepi32_ps(sbytes8(blk + 2 + 8 * j)), d);
}

/* Q4_0 block -> 32 values, (q - 8) * d: d*q - 8d would give +0 where the
 * format's formula gives -0 (d < 0, q = 8) */
INLINE void dec_q4_0(const uint8_t *blk, __m256 w[4]) {
    __m256 d = _mm256_set1_ps(half(blk));
    const __m256i m = _mm256_set1_epi32(15), c8 = _mm256_set1_epi32(8);
    __m256i va = bytes8(blk + 2), vb = bytes8(blk + 10);
    w[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(va, m), c8)), d);
    w[1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(vb, m), c8)), d);
    w[2] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(va, 4), c8)), d);
    w[3] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(vb, 4), c8)), d);
}

/* Q4_K header -> cf[0..8) = d*sc_j, cf[8..16) = -(dmin*m_j) */
INLINE void prep_q4_k(const uint8_t *blk, float *cf) {
    uint32_t s[3];
    memcpy(s, blk + 4, 12);
    uint32_t sc_lo = s[0] & 0x3f3f3f3fu, m_lo = s[1] & 0x3f3f3f3fu;
    uint32_t sc_hi = (s[2] & 0x0f0f0f0fu) | ((s[0] >> 2) & 0x30303030u);
    uint32_t m_hi = ((s[2] >> 4) & 0x0f0f0f0fu) | ((s[1] >> 2) & 0x30303030u);
    __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_set_epi32(0, 0, (int)sc_hi, (int)sc_lo)));
    __m256 mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_set_epi32(0, 0, (int)m_hi, (int)m_lo)));
    _mm256_storeu_ps(cf, _mm256_mul_ps(sc, _mm256_set1_ps(half(blk))));
    _mm256_storeu_ps(cf + 8, _mm256_mul_ps(mn, _mm256_set1_ps(-half(blk + 2))));
}

/* Q4_K unit u (values 64u .. 64u+63) -> 8 vectors */
INLINE void dec_q4_k(const uint8_t *blk, const float *cf, int u, __m256 w[8]) {
    const uint8_t *qs = blk + 16 + 32 * u;
    __m256 da = _mm256_set1_ps(cf[2 * u]), oa = _mm256_set1_ps(cf[8 + 2 * u]);
    __m256 db = _mm256_set1_ps(cf[2 * u + 1]), ob = _mm256_set1_ps(cf[9 + 2 * u]);
    const __m256i m = _mm256_set1_epi32(15);
    UNROLL for (int j = 0; j < 4; j++) {
        __m256i v = bytes8(qs + 8 * j);
        w[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v, m)), da, oa);
        w[4 + j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4)), db, ob);
    }
}

/* Q6_K header -> ds[j] = d * scales[j] */
INLINE void prep_q6_k(const uint8_t *blk, float *ds) {
    __m256 d = _mm256_set1_ps(half(blk + 208));
    _mm256_storeu_ps(ds, _mm256_mul_ps(_mm256_cvtepi32_ps(sbytes8(blk + 192)), d));
    _mm256_storeu_ps(ds + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(sbytes8(blk + 200)), d));
}

/* Q6_K unit u (values 64u .. 64u+63) -> 8 vectors; see formats.c for the layout */
INLINE void dec_q6_k(const uint8_t *blk, const float *ds, int u, __m256 w[8]) {
    const int n = u >> 1;
    __m256i ql0 = _mm256_loadu_si256((const __m256i *)(blk + 64 * n));
    __m256i ql1 = _mm256_loadu_si256((const __m256i *)(blk + 64 * n + 32));
    __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * n));
    const __m256i lo4 = _mm256_set1_epi8(0x0f);
    __m256i z0, z1;
    if (!(u & 1)) {
        z0 = _mm256_or_si256(_mm256_and_si256(ql0, lo4),
                             _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(0x03)), 4));
        z1 = _mm256_or_si256(_mm256_and_si256(ql1, lo4),
                             _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(0x0c)), 2));
    } else {
        z0 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), lo4),
                             _mm256_and_si256(qh, _mm256_set1_epi8(0x30)));
        z1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), lo4),
                             _mm256_srli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8((char)0xc0)), 2));
    }
    const __m256i c32 = _mm256_set1_epi8(32);
    z0 = _mm256_sub_epi8(z0, c32);
    z1 = _mm256_sub_epi8(z1, c32);
    __m128i q[4] = {_mm256_castsi256_si128(z0), _mm256_extracti128_si256(z0, 1), _mm256_castsi256_si128(z1),
                    _mm256_extracti128_si256(z1, 1)};
    UNROLL for (int j = 0; j < 4; j++) {
        __m256 s = _mm256_set1_ps(ds[4 * u + j]);
        w[2 * j] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q[j])), s);
        w[2 * j + 1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(q[j], q[j]))), s);
    }
}

/* ---- the types added for llama-quantize's mixes (layouts in formats.c) ---- */

INLINE int64_t blk_bytes(uint32_t type) {
    switch (type) {
    case DHSA_GGML_Q8_0: return 34;
    case DHSA_GGML_Q4_0: return 18;
    case DHSA_GGML_Q4_1: return 20;
    case DHSA_GGML_Q5_0: return 22;
    case DHSA_GGML_Q5_1: return 24;
    case DHSA_GGML_IQ4_NL: return 18;
    case DHSA_GGML_Q2_K: return 84;
    case DHSA_GGML_Q3_K: return 110;
    case DHSA_GGML_Q4_K: return 144;
    case DHSA_GGML_Q5_K: return 176;
    case DHSA_GGML_Q6_K: return 210;
    case DHSA_GGML_IQ4_XS: return 136;
    default: return 0;
    }
}

/* bit j (8k <= j < 8k + 8) of qh as bit 4 of lane j - 8k */
INLINE __m256i qh_bits8(uint32_t qh, int k) {
    __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32((int)(qh >> (8 * k))), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    return _mm256_slli_epi32(_mm256_and_si256(v, _mm256_set1_epi32(1)), 4);
}

/* Q4_1 / Q5_0 / Q5_1: 32 values; Q5's fifth bit from qh */
INLINE void dec_q4_5(uint32_t type, const uint8_t *blk, __m256 w[4]) {
    const int five = type != DHSA_GGML_Q4_1, one = type != DHSA_GGML_Q5_0;
    __m256 d = _mm256_set1_ps(half(blk));
    __m256 m = one ? _mm256_set1_ps(half(blk + 2)) : _mm256_setzero_ps();
    const uint8_t *qs = blk + (type == DHSA_GGML_Q4_1 ? 4 : type == DHSA_GGML_Q5_0 ? 6 : 8);
    uint32_t qh = 0;
    if (five) memcpy(&qh, blk + (one ? 4 : 2), 4);
    const __m256i c15 = _mm256_set1_epi32(15), c16 = _mm256_set1_epi32(16);
    __m256i va = bytes8(qs), vb = bytes8(qs + 8);
    __m256i q[4] = {_mm256_and_si256(va, c15), _mm256_and_si256(vb, c15), _mm256_srli_epi32(va, 4),
                    _mm256_srli_epi32(vb, 4)};
    UNROLL for (int k = 0; k < 4; k++) {
        if (five) q[k] = _mm256_or_si256(q[k], qh_bits8(qh, k));
        if (one) w[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q[k]), d, m);
        else w[k] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q[k], c16)), d);
    }
}

/* 16 code bytes -> grid values of the low nibbles (lo) and high nibbles (hi), int8 */
INLINE void iq4_lookup(const uint8_t *qs, __m128i *lo, __m128i *hi) {
    const __m128i grid = _mm_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
    const __m128i m4 = _mm_set1_epi8(0x0f);
    __m128i v = _mm_loadu_si128((const __m128i *)qs);
    *lo = _mm_shuffle_epi8(grid, _mm_and_si128(v, m4));
    *hi = _mm_shuffle_epi8(grid, _mm_and_si128(_mm_srli_epi16(v, 4), m4));
}

/* 32 values of the grid, scaled by s: w[0..4) */
INLINE void iq4_scale32(const uint8_t *qs, __m256 s, __m256 w[4]) {
    __m128i lo, hi;
    iq4_lookup(qs, &lo, &hi);
    w[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), s);
    w[1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(lo, lo))), s);
    w[2] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), s);
    w[3] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(hi, hi))), s);
}

INLINE void dec_iq4_nl(const uint8_t *blk, __m256 w[4]) { iq4_scale32(blk + 2, _mm256_set1_ps(half(blk)), w); }

/* Q2_K header -> cf[0..16) = d*(sc&15), cf[16..32) = -(dmin*(sc>>4)) */
INLINE void prep_q2_k(const uint8_t *blk, float *cf) {
    __m256 d = _mm256_set1_ps(half(blk + 80)), nm = _mm256_set1_ps(-half(blk + 82));
    const __m256i c15 = _mm256_set1_epi32(15);
    UNROLL for (int k = 0; k < 2; k++) {
        __m256i v = bytes8(blk + 8 * k);
        _mm256_storeu_ps(cf + 8 * k, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v, c15)), d));
        _mm256_storeu_ps(cf + 16 + 8 * k, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4)), nm));
    }
}

/* Q2_K / Q3_K unit u: group g (values 64u + 16g ..) is sub-block 4u + g, its
 * 2-bit codes at bits 2j of qs[32n + 16h + l] (n = u/2, j = 2(u&1) + g/2,
 * h = g&1); Q3_K's third bit is bit 4n + j of hmask[16h + l] */
INLINE void dec_q2_k(const uint8_t *blk, const float *cf, int u, __m256 w[8]) {
    const int n = u >> 1;
    const __m256i c3 = _mm256_set1_epi32(3);
    UNROLL for (int g = 0; g < 4; g++) {
        const int j = 2 * (u & 1) + (g >> 1), h = g & 1, s = 4 * u + g;
        __m256 sc = _mm256_set1_ps(cf[s]), mn = _mm256_set1_ps(cf[16 + s]);
        UNROLL for (int e = 0; e < 2; e++) {
            __m256i q = _mm256_and_si256(_mm256_srli_epi32(bytes8(blk + 16 + 32 * n + 16 * h + 8 * e), 2 * j), c3);
            w[2 * g + e] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), sc, mn);
        }
    }
}

/* Q3_K: the 16 six-bit scale codes (byte s = code of sub-block s), four
 * at a time in 32-bit words: low 4 bits from the nibbles of bytes 0-7,
 * high 2 bits from bit pair s/4 of bytes 8-11 */
INLINE __m128i q3k_codes(const uint8_t *s) {
    uint32_t w[3];
    memcpy(w, s, 12);
    const uint32_t lo4 = 0x0f0f0f0fu, lo2 = 0x03030303u;
    return _mm_setr_epi32((int)((w[0] & lo4) | (w[2] & lo2) << 4), (int)((w[1] & lo4) | ((w[2] >> 2) & lo2) << 4),
                          (int)(((w[0] >> 4) & lo4) | ((w[2] >> 4) & lo2) << 4),
                          (int)(((w[1] >> 4) & lo4) | ((w[2] >> 6) & lo2) << 4));
}

/* Q3_K header -> cf[s] = d*(sc_s - 32) */
INLINE void prep_q3_k(const uint8_t *blk, float *cf) {
    __m128i c = _mm_sub_epi8(q3k_codes(blk + 96), _mm_set1_epi8(32));
    __m256 d = _mm256_set1_ps(half(blk + 108));
    _mm256_storeu_ps(cf, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c)), d));
    _mm256_storeu_ps(cf + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(c, c))), d));
}

INLINE void dec_q3_k(const uint8_t *blk, const float *cf, int u, __m256 w[8]) {
    const int n = u >> 1;
    const __m256i c3 = _mm256_set1_epi32(3), c1 = _mm256_set1_epi32(1), c4 = _mm256_set1_epi32(4);
    UNROLL for (int g = 0; g < 4; g++) {
        const int j = 2 * (u & 1) + (g >> 1), h = g & 1, s = 4 * u + g;
        __m256 sc = _mm256_set1_ps(cf[s]);
        UNROLL for (int e = 0; e < 2; e++) {
            __m256i q = _mm256_and_si256(_mm256_srli_epi32(bytes8(blk + 32 + 32 * n + 16 * h + 8 * e), 2 * j), c3);
            __m256i hb = _mm256_and_si256(_mm256_srli_epi32(bytes8(blk + 16 * h + 8 * e), 4 * n + j), c1);
            q = _mm256_sub_epi32(_mm256_or_si256(q, _mm256_slli_epi32(hb, 2)), c4);
            w[2 * g + e] = _mm256_mul_ps(_mm256_cvtepi32_ps(q), sc);
        }
    }
}

/* Q5_K unit u (header as Q4_K's, prep_q4_k): bit 4 of value 64u + 32h + l is
 * bit 2u + h of qh[l] */
INLINE void dec_q5_k(const uint8_t *blk, const float *cf, int u, __m256 w[8]) {
    const uint8_t *qs = blk + 48 + 32 * u, *qh = blk + 16;
    __m256 da = _mm256_set1_ps(cf[2 * u]), oa = _mm256_set1_ps(cf[8 + 2 * u]);
    __m256 db = _mm256_set1_ps(cf[2 * u + 1]), ob = _mm256_set1_ps(cf[9 + 2 * u]);
    const __m256i m = _mm256_set1_epi32(15), c1 = _mm256_set1_epi32(1);
    UNROLL for (int j = 0; j < 4; j++) {
        __m256i v = bytes8(qs + 8 * j), h = bytes8(qh + 8 * j);
        __m256i ha = _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(h, 2 * u), c1), 4);
        __m256i hb = _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(h, 2 * u + 1), c1), 4);
        w[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_or_si256(_mm256_and_si256(v, m), ha)), da, oa);
        w[4 + j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_or_si256(_mm256_srli_epi32(v, 4), hb)), db, ob);
    }
}

/* IQ4_XS: the 8 scales ls - 32 as floats. Sub-block ib's low 4 bits are
 * nibble ib of the 32-bit scales_l, its high 2 bits bit pair ib of
 * scales_h: variable shifts in registers (a byte array read back as a
 * vector would stall on store forwarding). */
INLINE __m256 iq4xs_scales(const uint8_t *blk) {
    uint32_t l;
    uint16_t h;
    memcpy(&h, blk + 2, 2);
    memcpy(&l, blk + 4, 4);
    __m256i lo = _mm256_srlv_epi32(_mm256_set1_epi32((int)l), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
    __m256i hi = _mm256_srlv_epi32(_mm256_set1_epi32((int)h), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
    __m256i ls = _mm256_or_si256(_mm256_and_si256(lo, _mm256_set1_epi32(15)),
                                 _mm256_slli_epi32(_mm256_and_si256(hi, _mm256_set1_epi32(3)), 4));
    return _mm256_cvtepi32_ps(_mm256_sub_epi32(ls, _mm256_set1_epi32(32)));
}

/* IQ4_XS header -> cf[ib] = d*(ls_ib - 32) */
INLINE void prep_iq4_xs(const uint8_t *blk, float *cf) {
    _mm256_storeu_ps(cf, _mm256_mul_ps(iq4xs_scales(blk), _mm256_set1_ps(half(blk))));
}

INLINE void dec_iq4_xs(const uint8_t *blk, const float *cf, int u, __m256 w[8]) {
    iq4_scale32(blk + 8 + 32 * u, _mm256_set1_ps(cf[2 * u]), w);
    iq4_scale32(blk + 8 + 32 * u + 16, _mm256_set1_ps(cf[2 * u + 1]), w + 4);
}

/* A block of 32 values: w[0..4). */
INLINE void dec32(uint32_t type, const uint8_t *blk, __m256 w[4]) {
    switch (type) {
    case DHSA_GGML_Q8_0: dec_q8_0(blk, w); return;
    case DHSA_GGML_Q4_0: dec_q4_0(blk, w); return;
    case DHSA_GGML_IQ4_NL: dec_iq4_nl(blk, w); return;
    default: dec_q4_5(type, blk, w); return;
    }
}

/* A super-block of 256: the header into cf[32], then unit u (values 64u ..
 * 64u + 63) into w[0..8). */
INLINE void prep256(uint32_t type, const uint8_t *blk, float *cf) {
    switch (type) {
    case DHSA_GGML_Q4_K:
    case DHSA_GGML_Q5_K: prep_q4_k(blk, cf); return;
    case DHSA_GGML_Q6_K: prep_q6_k(blk, cf); return;
    case DHSA_GGML_Q2_K: prep_q2_k(blk, cf); return;
    case DHSA_GGML_Q3_K: prep_q3_k(blk, cf); return;
    default: prep_iq4_xs(blk, cf); return;
    }
}

INLINE void dec256(uint32_t type, const uint8_t *blk, const float *cf, int u, __m256 w[8]) {
    switch (type) {
    case DHSA_GGML_Q4_K: dec_q4_k(blk, cf, u, w); return;
    case DHSA_GGML_Q5_K: dec_q5_k(blk, cf, u, w); return;
    case DHSA_GGML_Q6_K: dec_q6_k(blk, cf, u, w); return;
    case DHSA_GGML_Q2_K: dec_q2_k(blk, cf, u, w); return;
    case DHSA_GGML_Q3_K: dec_q3_k(blk, cf, u, w); return;
    default: dec_iq4_xs(blk, cf, u, w); return;
    }
}

#define CASES_32 \
    case DHSA_GGML_Q8_0: case DHSA_GGML_Q4_0: case DHSA_GGML_Q4_1: case DHSA_GGML_Q5_0: case DHSA_GGML_Q5_1: \
    case DHSA_GGML_IQ4_NL
#define CASES_256 \
    case DHSA_GGML_Q4_K: case DHSA_GGML_Q5_K: case DHSA_GGML_Q6_K: case DHSA_GGML_Q2_K: case DHSA_GGML_Q3_K: \
    case DHSA_GGML_IQ4_XS

/* ------------------------------------------------------------- dequant --- */

static void dequant(uint32_t type, const uint8_t *row, int64_t k0, int64_t kn, float *dst) {
    int64_t k = 0;
    __m256 w[8];
    switch (type) {
    case DHSA_GGML_F32:
    case DHSA_GGML_F16:
    case DHSA_GGML_BF16:
        for (; k + 8 <= kn; k += 8) _mm256_storeu_ps(dst + k, load_float(type, row, k0 + k, 8));
        if (k < kn) _mm256_maskstore_ps(dst + k, tail_mask(kn - k), load_float(type, row, k0 + k, kn - k));
        return;
    CASES_32:
        for (; k < kn; k += 32) {
            dec32(type, row + (k0 + k) / 32 * blk_bytes(type), w);
            for (int v = 0; v < 4; v++) _mm256_storeu_ps(dst + k + 8 * v, w[v]);
        }
        return;
    CASES_256: {
        float cf[32];
        for (; k < kn; k += 256) {
            const uint8_t *blk = row + (k0 + k) / 256 * blk_bytes(type);
            prep256(type, blk, cf);
            for (int u = 0; u < 4; u++) {
                dec256(type, blk, cf, u, w);
                for (int v = 0; v < 8; v++) _mm256_storeu_ps(dst + k + 64 * u + 8 * v, w[v]);
            }
        }
        return;
    }
    default: return;
    }
}

/* ---------------------------------------------------------- panel tile --- */

static void tile(const float *W, int64_t ldw, const float *X, int64_t ldxp, int64_t kp, float *out) {
    __m256 acc[MR][NR];
    UNROLL for (int t = 0; t < MR; t++) UNROLL for (int r = 0; r < NR; r++) acc[t][r] = _mm256_setzero_ps();
    for (int64_t k = 0; k < kp; k += 8) {
        __m256 xv[MR];
        UNROLL for (int t = 0; t < MR; t++) xv[t] = _mm256_loadu_ps(X + t * ldxp + k);
        UNROLL for (int r = 0; r < NR; r++) {
            __m256 wv = _mm256_loadu_ps(W + r * ldw + k);
            UNROLL for (int t = 0; t < MR; t++) acc[t][r] = _mm256_fmadd_ps(wv, xv[t], acc[t][r]);
        }
    }
    UNROLL for (int t = 0; t < MR; t++) _mm_storeu_ps(out + t * NR, tree4(acc[t][0], acc[t][1], acc[t][2], acc[t][3]));
}

/* ---------------------------------------------------------- fused tile --- */

/* Prefetch of [p, p + n) in the next row group (see f32_avx512.c). */
INLINE void prefetch(const uint8_t *p, int n) {
    for (int b = 0; b < n; b += 64) _mm_prefetch((const char *)(p + b), _MM_HINT_T1);
}

INLINE void fused_block(const uint32_t type, const int T, const uint8_t *const *w, const float *xk, int64_t ldx,
                        int64_t k0, int64_t kn, int64_t pf, __m256 acc[R][TMAX]) {
    switch (type) {
    case DHSA_GGML_F32:
    case DHSA_GGML_F16:
    case DHSA_GGML_BF16: {
        int64_t k = 0;
        for (; k + 8 <= kn; k += 8) {
            __m256 xv[TMAX];
            UNROLL for (int t = 0; t < T; t++) xv[t] = _mm256_loadu_ps(xk + t * ldx + k);
            UNROLL for (int r = 0; r < R; r++) {
                __m256 wv = load_float(type, w[r], k0 + k, 8);
                if (type == DHSA_GGML_F32 || !(k & 8)) prefetch(w[r] + pf + (type == DHSA_GGML_F32 ? 4 : 2) * (k0 + k), 1);
                UNROLL for (int t = 0; t < T; t++) acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
            }
        }
        if (k < kn) { /* the last 1..7 columns, zero padded (no read past the row) */
            __m256 xv[TMAX];
            UNROLL for (int t = 0; t < T; t++) xv[t] = _mm256_maskload_ps(xk + t * ldx + k, tail_mask(kn - k));
            UNROLL for (int r = 0; r < R; r++) {
                __m256 wv = load_float(type, w[r], k0 + k, kn - k);
                UNROLL for (int t = 0; t < T; t++) acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
            }
        }
        return;
    }
    CASES_32: {
        const int64_t bb = blk_bytes(type);
        for (int64_t k = 0; k < kn; k += 32) {
            const int64_t off = (k0 + k) / 32 * bb;
            UNROLL for (int r = 0; r < R; r++) {
                __m256 wv[4];
                prefetch(w[r] + off + pf, 1);
                dec32(type, w[r] + off, wv);
                UNROLL for (int t = 0; t < T; t++) UNROLL for (int v = 0; v < 4; v++)
                    acc[r][t] = _mm256_fmadd_ps(wv[v], _mm256_loadu_ps(xk + t * ldx + k + 8 * v), acc[r][t]);
            }
        }
        return;
    }
    CASES_256: {
        const int64_t bb = blk_bytes(type);
        for (int64_t k = 0; k < kn; k += 256) {
            const int64_t off = (k0 + k) / 256 * bb;
            float cf[R][32] __attribute__((aligned(32)));
            UNROLL for (int r = 0; r < R; r++) {
                prefetch(w[r] + off + pf, (int)bb);
                prep256(type, w[r] + off, cf[r]);
            }
            __asm__ volatile("" ::: "memory"); /* scales broadcast from memory, not by shuffles */
            for (int u = 0; u < 4; u++) {
                const float *xu = xk + k + 64 * u;
                UNROLL for (int r = 0; r < R; r++) {
                    __m256 wv[8];
                    dec256(type, w[r] + off, cf[r], u, wv);
                    UNROLL for (int t = 0; t < T; t++) UNROLL for (int v = 0; v < 8; v++)
                        acc[r][t] = _mm256_fmadd_ps(wv[v], _mm256_loadu_ps(xu + t * ldx + 8 * v), acc[r][t]);
                }
            }
        }
        return;
    }
    default: return;
    }
}

INLINE void fused_tile(const uint32_t type, const int T, const uint8_t *const *w, const float *x, int64_t ldx,
                       int64_t n_in, int64_t pf, float *y, int64_t ldy, int nr) {
    for (int64_t k0 = 0; k0 < n_in; k0 += DHSA_QK_KC) {
        const int64_t kn = n_in - k0 < DHSA_QK_KC ? n_in - k0 : DHSA_QK_KC;
        __m256 acc[R][TMAX];
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < TMAX; t++) acc[r][t] = _mm256_setzero_ps();
        fused_block(type, T, w, x + k0, ldx, k0, kn, pf, acc);
        UNROLL for (int t = 0; t < T; t++) {
            float s[4];
            _mm_storeu_ps(s, tree4(acc[0][t], acc[1][t], acc[2][t], acc[3][t]));
            float *yt = y + t * ldy;
            for (int r = 0; r < nr; r++) yt[r] = k0 == 0 ? s[r] : yt[r] + s[r];
        }
    }
}

#include "matmul/f32_gemv.h"

/* fused-path limits in the order of DHSA_QK_TYPE_LIST (docs/quant.md): the
 * first seven measured, the others set by analogy (4, as for every 4- and
 * 6-bit type measured) */
const dhsa__f32_kernels dhsa__f32_avx2 = {
    "avx2", MR, NR, {8, 4, 4, 8, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4}, dequant, gemv, tile};

#else
typedef int dhsa__f32_avx2_unused; /* ISO C forbids an empty file */
#endif
