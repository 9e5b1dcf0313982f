/* f32_avx512.c: AVX-512 kernels of the weight products (contract and
 * summation order in f32.h). Compiled with -mavx512f/bw/dq/vl -mfma -mf16c
 * by the Makefile; elsewhere this file is empty and the scalar path runs.
 *
 * Dequantization in registers, exact (see formats.c's layout comment):
 *   Q4_0 / Q4_K  a 16-entry table per (sub-)block, (q-8)*d or (d*sc)*q - dmin*m,
 *                indexed by the nibbles with vpermps (which reads only the
 *                low 4 bits of each index, so no masking);
 *   Q6_K         the 6-bit codes of 64 values built with byte operations on
 *                one zmm, then widened 16 at a time and scaled;
 *   Q4_1, IQ4_NL, IQ4_XS  the same 16-entry tables, d*q + m or d*grid[q];
 *   Q5_0, Q5_1, Q5_K  a 32-entry table (two zmm, vpermt2ps); the fifth bit
 *                of each code comes from qh as a mask register;
 *   Q2_K, Q3_K   the 2- (3-) bit codes of 64 values built with byte
 *                operations on one zmm (as Q6_K), then widened 16 at a time
 *                and scaled (Q2_K: one FMA with the scale and min);
 *   Q8_0, F16, BF16  widen and convert.
 * Fused path (decode): 4 rows x up to 4 tokens of accumulators, each row
 * streamed once; 2-4 tokens reduce all 16 in one tree16 (tree512.h). Panel path (prefill): a 6 token x 4 row tile over
 * dequantized rows, 24 accumulators. Both sum lane j of a K block in column
 * order with FMA and reduce the 16 lanes by the same tree, so they agree
 * bitwise. Held to the scalar path by tests/test_quant.c.
 */
#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && \
    defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#include <string.h>

#include "matmul/f32.h"
#include "matmul/tree512.h"

#define INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 16")
#define R 4    /* rows per fused tile */
/* prefetch distance of the fused path, in row groups; into L2 (T1), so
 * that prefetches do not hold the L1 fill buffers the loads need */
#define PF_GROUPS 2
#define TMAX 4 /* tokens per fused tile */
#define MR 6   /* panel tile: tokens */
_Static_assert(R * TMAX == 16, "fused_tile reduces its R x TMAX accumulators with one tree16");
#define NR 4   /* panel tile: rows */

/* ------------------------------------------------------------- decoders --- */

/* vpbroadcastw from memory + vcvtph2ps: two instructions, where a scalar
 * conversion then a broadcast takes three */
INLINE __m512 bcast_half(const uint8_t *p) {
    int16_t h;
    memcpy(&h, p, 2);
    return _mm512_cvtph_ps(_mm256_set1_epi16(h));
}

INLINE __mmask16 tail_mask(int64_t n) { return (__mmask16)((1u << n) - 1u); }

INLINE __m512 load_f32(const uint8_t *row, int64_t k) { return _mm512_loadu_ps((const float *)row + k); }
INLINE __m512 load_f32_m(const uint8_t *row, int64_t k, __mmask16 m) {
    return _mm512_maskz_loadu_ps(m, (const float *)row + k);
}
INLINE __m512 load_f16(const uint8_t *row, int64_t k) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + 2 * k)));
}
INLINE __m512 load_f16_m(const uint8_t *row, int64_t k, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row + 2 * k));
}
INLINE __m512 widen_bf16(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
INLINE __m512 load_bf16(const uint8_t *row, int64_t k) {
    return widen_bf16(_mm256_loadu_si256((const __m256i *)(row + 2 * k)));
}
INLINE __m512 load_bf16_m(const uint8_t *row, int64_t k, __mmask16 m) {
    return widen_bf16(_mm256_maskz_loadu_epi16(m, row + 2 * k));
}

/* Q8_0 block (34 bytes) -> 32 values */
INLINE void dec_q8_0(const uint8_t *blk, __m512 w[2]) {
    __m512 d = bcast_half(blk);
    w[0] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2)))), d);
    w[1] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 18)))), d);
}

/* Q4_0 block (18 bytes) -> 32 values: table[q] = (q - 8) * d */
INLINE void dec_q4_0(const uint8_t *blk, __m512 w[2]) {
    const __m512 iota8 = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
    __m512 tab = _mm512_mul_ps(iota8, bcast_half(blk));
    __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2)));
    w[0] = _mm512_permutexvar_ps(v, tab);
    w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), tab);
}

/* Q4_K super-block header -> cf[0..8) = d*sc_j, cf[8..16) = -(dmin*m_j) */
INLINE void prep_q4_k(const uint8_t *blk, float *cf) {
    uint32_t s[3];
    memcpy(s, blk + 4, 12);
    uint32_t sc_lo = s[0] & 0x3f3f3f3fu, m_lo = s[1] & 0x3f3f3f3fu;
    uint32_t sc_hi = (s[2] & 0x0f0f0f0fu) | ((s[0] >> 2) & 0x30303030u);
    uint32_t m_hi = ((s[2] >> 4) & 0x0f0f0f0fu) | ((s[1] >> 2) & 0x30303030u);
    __m128i b = _mm_set_epi32((int)m_hi, (int)m_lo, (int)sc_hi, (int)sc_lo);
    uint16_t h[2];
    memcpy(h, blk, 4);
    __m512 dd = _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(_cvtsh_ss(h[0])), _mm512_set1_ps(-_cvtsh_ss(h[1])));
    _mm512_storeu_ps(cf, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b)), dd));
}

/* Q4_K unit u (values 64u .. 64u+63) from the prepared header */
INLINE void dec_q4_k(const uint8_t *blk, const float *cf, int u, __m512 w[4]) {
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const uint8_t *qs = blk + 16 + 32 * u;
    __m512 ta = _mm512_fmadd_ps(iota, _mm512_set1_ps(cf[2 * u]), _mm512_set1_ps(cf[8 + 2 * u]));
    __m512 tb = _mm512_fmadd_ps(iota, _mm512_set1_ps(cf[2 * u + 1]), _mm512_set1_ps(cf[9 + 2 * u]));
    __m512i v0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)qs));
    __m512i v1 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(qs + 16)));
    w[0] = _mm512_permutexvar_ps(v0, ta);
    w[1] = _mm512_permutexvar_ps(v1, ta);
    w[2] = _mm512_permutexvar_ps(_mm512_srli_epi32(v0, 4), tb);
    w[3] = _mm512_permutexvar_ps(_mm512_srli_epi32(v1, 4), tb);
}

/* Q6_K super-block header -> ds[j] = d * scales[j] */
INLINE void prep_q6_k(const uint8_t *blk, float *ds) {
    __m512 s = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 192))));
    _mm512_storeu_ps(ds, _mm512_mul_ps(s, bcast_half(blk + 208)));
}

/* Q6_K unit u (values 64u .. 64u+63): n = u/2 picks the 128-value half, u&1
 * the low (parts 0, 1) or high (parts 2, 3) nibbles of ql; byte b of the
 * 64-byte code vector is value 64u + b, so 16-byte lane k is sub-block 4u+k. */
INLINE void dec_q6_k(const uint8_t *blk, const float *ds, int u, __m512 w[4]) {
    const int n = u >> 1;
    __m512i ql = _mm512_loadu_si512((const void *)(blk + 64 * n));
    __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * n)));
    const __m512i lo4 = _mm512_set1_epi8(0x0f);
    __m512i z;
    if (!(u & 1)) {
        /* parts 0 | 1: high bits (qh & 3) << 4 | (qh & 12) << 2 */
        __m512i m = _mm512_mask_blend_epi64(0xf0, _mm512_set1_epi8(0x03), _mm512_set1_epi8(0x0c));
        __m512i sh = _mm512_mask_blend_epi64(0xf0, _mm512_set1_epi16(4), _mm512_set1_epi16(2));
        __m512i hi = _mm512_sllv_epi16(_mm512_and_si512(qh, m), sh);
        z = _mm512_ternarylogic_epi32(ql, hi, lo4, 0xec); /* (ql & 15) | hi */
    } else {
        /* parts 2 | 3: qh & 0x30 | (qh & 0xc0) >> 2 */
        __m512i m = _mm512_mask_blend_epi64(0xf0, _mm512_set1_epi8(0x30), _mm512_set1_epi8((char)0xc0));
        __m512i sh = _mm512_mask_blend_epi64(0xf0, _mm512_set1_epi16(0), _mm512_set1_epi16(2));
        __m512i hi = _mm512_srlv_epi16(_mm512_and_si512(qh, m), sh);
        z = _mm512_ternarylogic_epi32(_mm512_srli_epi16(ql, 4), hi, lo4, 0xec);
    }
    z = _mm512_sub_epi8(z, _mm512_set1_epi8(32));
    w[0] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm512_castsi512_si128(z))),
                         _mm512_set1_ps(ds[4 * u]));
    w[1] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(z, 1))),
                         _mm512_set1_ps(ds[4 * u + 1]));
    w[2] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(z, 2))),
                         _mm512_set1_ps(ds[4 * u + 2]));
    w[3] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(z, 3))),
                         _mm512_set1_ps(ds[4 * u + 3]));
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

INLINE __m512 iq4_grid(void) {
    return _mm512_setr_ps(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
}

/* Q4_1 (20 bytes): table[q] = d*q + m (one rounding: d*q is exact) */
INLINE void dec_q4_1(const uint8_t *blk, __m512 w[2]) {
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 tab = _mm512_fmadd_ps(iota, bcast_half(blk), bcast_half(blk + 2));
    __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + 4)));
    w[0] = _mm512_permutexvar_ps(v, tab);
    w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), tab);
}

/* IQ4_NL (18 bytes): table[q] = d*grid[q] */
INLINE void dec_iq4_nl(const uint8_t *blk, __m512 w[2]) {
    __m512 tab = _mm512_mul_ps(iq4_grid(), bcast_half(blk));
    __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2)));
    w[0] = _mm512_permutexvar_ps(v, tab);
    w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), tab);
}

/* Q5_0 (22) / Q5_1 (24): 32-entry table lo | hi, d*(q-16) or d*q + m; the
 * index is the nibble with bit 4 set where qh has the value's bit */
INLINE void dec_q5_01(const uint8_t *blk, int one, __m512 w[2]) {
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 d = bcast_half(blk), lo, hi;
    if (one) {
        __m512 m = bcast_half(blk + 2);
        lo = _mm512_fmadd_ps(iota, d, m);
        hi = _mm512_fmadd_ps(_mm512_add_ps(iota, _mm512_set1_ps(16.0f)), d, m);
    } else {
        lo = _mm512_mul_ps(_mm512_sub_ps(iota, _mm512_set1_ps(16.0f)), d);
        hi = _mm512_mul_ps(iota, d);
    }
    uint32_t qh;
    memcpy(&qh, blk + (one ? 4 : 2), 4);
    __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + (one ? 8 : 6))));
    const __m512i c15 = _mm512_set1_epi32(15), c16 = _mm512_set1_epi32(16);
    __m512i i0 = _mm512_and_si512(v, c15), i1 = _mm512_srli_epi32(v, 4);
    i0 = _mm512_mask_or_epi32(i0, (__mmask16)qh, i0, c16);
    i1 = _mm512_mask_or_epi32(i1, (__mmask16)(qh >> 16), i1, c16);
    w[0] = _mm512_permutex2var_ps(lo, i0, hi);
    w[1] = _mm512_permutex2var_ps(lo, i1, hi);
}

/* Q2_K header -> cf[0..16) = d*(sc&15), cf[16..32) = -(dmin*(sc>>4)) */
INLINE void prep_q2_k(const uint8_t *blk, float *cf) {
    __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)blk));
    uint16_t h[2];
    memcpy(h, blk + 80, 4);
    __m512 sc = _mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(15)));
    __m512 mn = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
    _mm512_storeu_ps(cf, _mm512_mul_ps(sc, _mm512_set1_ps(_cvtsh_ss(h[0]))));
    _mm512_storeu_ps(cf + 16, _mm512_mul_ps(mn, _mm512_set1_ps(-_cvtsh_ss(h[1]))));
}

/* Q2_K / Q3_K unit u: group g (values 64u + 16g ..) is sub-block 4u + g, its
 * 2-bit codes at bits 2j of qs[32n + 16h + l] (n = u/2, j = 2(u&1) + g/2,
 * h = g&1); Q3_K's third bit is bit 4n + j of hmask[16h + l] */
INLINE void dec_q2_k(const uint8_t *blk, const float *cf, int u, __m512 w[4]) {
    /* byte b of the code vector is value 64u + b (as in dec_q3_k) */
    const int n = u >> 1, j0 = 2 * (u & 1);
    __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * n)));
    __m512i qsh = _mm512_mask_blend_epi64(0xf0, _mm512_set1_epi16((short)(2 * j0)), _mm512_set1_epi16((short)(2 * j0 + 2)));
    q = _mm512_and_si512(_mm512_srlv_epi16(q, qsh), _mm512_set1_epi8(3));
    __m128i g[4] = {_mm512_castsi512_si128(q), _mm512_extracti32x4_epi32(q, 1), _mm512_extracti32x4_epi32(q, 2),
                    _mm512_extracti32x4_epi32(q, 3)};
    UNROLL for (int k = 0; k < 4; k++)
        w[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(g[k])), _mm512_set1_ps(cf[4 * u + k]),
                               _mm512_set1_ps(cf[16 + 4 * u + k]));
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
    __m512i c = _mm512_cvtepu8_epi32(q3k_codes(blk + 96));
    __m512 sc = _mm512_cvtepi32_ps(_mm512_sub_epi32(c, _mm512_set1_epi32(32)));
    _mm512_storeu_ps(cf, _mm512_mul_ps(sc, bcast_half(blk + 108)));
}

INLINE void dec_q3_k(const uint8_t *blk, const float *cf, int u, __m512 w[4]) {
    /* byte b of the 64-byte code vector is value 64u + b: j = j0 + b/32, h =
     * b%32/16, so both halves read the same 32 code bytes (and the same 32
     * hmask bytes), shifted by their own j */
    const int n = u >> 1, j0 = 2 * (u & 1);
    __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 32 + 32 * n)));
    __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)blk));
    __m512i qsh = _mm512_mask_blend_epi64(0xf0, _mm512_set1_epi16((short)(2 * j0)), _mm512_set1_epi16((short)(2 * j0 + 2)));
    __m512i hsh = _mm512_mask_blend_epi64(0xf0, _mm512_set1_epi16((short)(4 * n + j0)),
                                          _mm512_set1_epi16((short)(4 * n + j0 + 1)));
    q = _mm512_and_si512(_mm512_srlv_epi16(q, qsh), _mm512_set1_epi8(3));
    h = _mm512_and_si512(_mm512_srlv_epi16(h, hsh), _mm512_set1_epi8(1));
    __m512i z = _mm512_sub_epi8(_mm512_or_si512(q, _mm512_slli_epi16(h, 2)), _mm512_set1_epi8(4)); /* -4 .. 3 */
    w[0] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm512_castsi512_si128(z))), _mm512_set1_ps(cf[4 * u]));
    w[1] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(z, 1))),
                         _mm512_set1_ps(cf[4 * u + 1]));
    w[2] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(z, 2))),
                         _mm512_set1_ps(cf[4 * u + 2]));
    w[3] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(z, 3))),
                         _mm512_set1_ps(cf[4 * u + 3]));
}

/* Q5_K unit u (header as Q4_K's, prep_q4_k): 32-entry tables per sub-block;
 * bit 4 of value 64u + 32h + l is bit 2u + h of qh[l] */
INLINE void dec_q5_k(const uint8_t *blk, const float *cf, int u, __m512 w[4]) {
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512 i16 = _mm512_add_ps(iota, _mm512_set1_ps(16.0f));
    const uint8_t *qs = blk + 48 + 32 * u, *qh = blk + 16;
    __m512 da = _mm512_set1_ps(cf[2 * u]), oa = _mm512_set1_ps(cf[8 + 2 * u]);
    __m512 db = _mm512_set1_ps(cf[2 * u + 1]), ob = _mm512_set1_ps(cf[9 + 2 * u]);
    __m512 ta0 = _mm512_fmadd_ps(iota, da, oa), ta1 = _mm512_fmadd_ps(i16, da, oa);
    __m512 tb0 = _mm512_fmadd_ps(iota, db, ob), tb1 = _mm512_fmadd_ps(i16, db, ob);
    __m128i h0 = _mm_loadu_si128((const __m128i *)qh), h1 = _mm_loadu_si128((const __m128i *)(qh + 16));
    const __m128i ba = _mm_set1_epi8((char)(1 << (2 * u))), bb = _mm_set1_epi8((char)(2 << (2 * u)));
    const __m512i c15 = _mm512_set1_epi32(15), c16 = _mm512_set1_epi32(16);
    __m512i v0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)qs));
    __m512i v1 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(qs + 16)));
    __m512i a0 = _mm512_and_si512(v0, c15), a1 = _mm512_and_si512(v1, c15);
    __m512i b0 = _mm512_srli_epi32(v0, 4), b1 = _mm512_srli_epi32(v1, 4);
    a0 = _mm512_mask_or_epi32(a0, _mm_test_epi8_mask(h0, ba), a0, c16);
    a1 = _mm512_mask_or_epi32(a1, _mm_test_epi8_mask(h1, ba), a1, c16);
    b0 = _mm512_mask_or_epi32(b0, _mm_test_epi8_mask(h0, bb), b0, c16);
    b1 = _mm512_mask_or_epi32(b1, _mm_test_epi8_mask(h1, bb), b1, c16);
    w[0] = _mm512_permutex2var_ps(ta0, a0, ta1);
    w[1] = _mm512_permutex2var_ps(ta0, a1, ta1);
    w[2] = _mm512_permutex2var_ps(tb0, b0, tb1);
    w[3] = _mm512_permutex2var_ps(tb0, b1, tb1);
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
    _mm256_storeu_ps(cf, _mm256_mul_ps(iq4xs_scales(blk), _mm512_castps512_ps256(bcast_half(blk))));
}

/* IQ4_XS unit u: sub-blocks 2u, 2u+1, tables d_ib*grid[q] */
INLINE void dec_iq4_xs(const uint8_t *blk, const float *cf, int u, __m512 w[4]) {
    UNROLL for (int k = 0; k < 2; k++) {
        const int ib = 2 * u + k;
        __m512 tab = _mm512_mul_ps(iq4_grid(), _mm512_set1_ps(cf[ib]));
        __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + 8 + 16 * ib)));
        w[2 * k] = _mm512_permutexvar_ps(v, tab);
        w[2 * k + 1] = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), tab);
    }
}

/* A block of 32: values 0..15 in w[0], 16..31 in w[1]. */
INLINE void dec32(uint32_t type, const uint8_t *blk, __m512 w[2]) {
    switch (type) {
    case DHSA_GGML_Q8_0: dec_q8_0(blk, w); return;
    case DHSA_GGML_Q4_0: dec_q4_0(blk, w); return;
    case DHSA_GGML_Q4_1: dec_q4_1(blk, w); return;
    case DHSA_GGML_Q5_0: dec_q5_01(blk, 0, w); return;
    case DHSA_GGML_Q5_1: dec_q5_01(blk, 1, w); return;
    default: dec_iq4_nl(blk, w); return;
    }
}

/* A super-block of 256: the header into cf[32], then unit u (values 64u ..
 * 64u + 63) into w[0..4). */
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

INLINE void dec256(uint32_t type, const uint8_t *blk, const float *cf, int u, __m512 w[4]) {
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
    __m512 w[4];
    switch (type) {
    case DHSA_GGML_F32:
    case DHSA_GGML_F16:
    case DHSA_GGML_BF16:
        for (; k + 16 <= kn; k += 16)
            _mm512_storeu_ps(dst + k, type == DHSA_GGML_F32   ? load_f32(row, k0 + k)
                                      : type == DHSA_GGML_F16 ? load_f16(row, k0 + k)
                                                              : load_bf16(row, k0 + k));
        if (k < kn) {
            __mmask16 m = tail_mask(kn - k);
            _mm512_mask_storeu_ps(dst + k, m, type == DHSA_GGML_F32   ? load_f32_m(row, k0 + k, m)
                                              : type == DHSA_GGML_F16 ? load_f16_m(row, k0 + k, m)
                                                                      : load_bf16_m(row, k0 + k, m));
        }
        return;
    CASES_32:
        for (; k < kn; k += 32) {
            dec32(type, row + (k0 + k) / 32 * blk_bytes(type), w);
            _mm512_storeu_ps(dst + k, w[0]);
            _mm512_storeu_ps(dst + k + 16, w[1]);
        }
        return;
    CASES_256: {
        float cf[32];
        for (; k < kn; k += 256) {
            const uint8_t *blk = row + (k0 + k) / 256 * blk_bytes(type);
            prep256(type, blk, cf);
            for (int u = 0; u < 4; u++) {
                dec256(type, blk, cf, u, w);
                for (int v = 0; v < 4; v++) _mm512_storeu_ps(dst + k + 64 * u + 16 * v, w[v]);
            }
        }
        return;
    }
    default: return;
    }
}

/* ---------------------------------------------------------- panel tile --- */

static void tile(const float *W, int64_t ldw, const float *X, int64_t ldxp, int64_t kp, float *out) {
    __m512 acc[MR][NR];
    UNROLL for (int t = 0; t < MR; t++) UNROLL for (int r = 0; r < NR; r++) acc[t][r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < kp; k += 16) {
        __m512 w[NR];
        UNROLL for (int r = 0; r < NR; r++) w[r] = _mm512_loadu_ps(W + r * ldw + k);
        UNROLL for (int t = 0; t < MR; t++) {
            __m512 xv = _mm512_loadu_ps(X + t * ldxp + k);
            UNROLL for (int r = 0; r < NR; r++) acc[t][r] = _mm512_fmadd_ps(w[r], xv, acc[t][r]);
        }
    }
    UNROLL for (int t = 0; t < MR; t++) _mm_storeu_ps(out + t * NR, tree4(acc[t][0], acc[t][1], acc[t][2], acc[t][3]));
}

/* ---------------------------------------------------------- fused tile --- */

/* Prefetch of the bytes [p, p + n) of a later row group (pf bytes ahead):
 * a row of a quantized matrix is only a few KiB, too short for the hardware
 * prefetcher to ramp up on four interleaved streams. */
INLINE void prefetch(const uint8_t *p, int n) {
    for (int b = 0; b < n; b += 64) _mm_prefetch((const char *)(p + b), _MM_HINT_T1);
}

/* acc[r][t] += W_r[k0 .. k0+kn) . x_t[k0 .. k0+kn) in unit order; xk = x + k0;
 * pf = PF_GROUPS * R * row_bytes (the same place in a later row group) */
INLINE void fused_block(const uint32_t type, const int T, const uint8_t *const *w, const float *xk, int64_t ldx,
                        int64_t k0, int64_t kn, int64_t pf, __m512 acc[R][TMAX]) {
    switch (type) {
    case DHSA_GGML_F32:
    case DHSA_GGML_F16:
    case DHSA_GGML_BF16: {
        int64_t k = 0;
        for (; k + 16 <= kn; k += 16) {
            __m512 xv[TMAX];
            UNROLL for (int t = 0; t < T; t++) xv[t] = _mm512_loadu_ps(xk + t * ldx + k);
            UNROLL for (int r = 0; r < R; r++) {
                __m512 wv = type == DHSA_GGML_F32   ? load_f32(w[r], k0 + k)
                            : type == DHSA_GGML_F16 ? load_f16(w[r], k0 + k)
                                                    : load_bf16(w[r], k0 + k);
                /* one prefetch per 64-byte line: every other step for F16 and BF16 */
                if (type == DHSA_GGML_F32 || (k & 31) == 0) prefetch(w[r] + pf + (type == DHSA_GGML_F32 ? 4 : 2) * (k0 + k), 1);
                UNROLL for (int t = 0; t < T; t++) acc[r][t] = _mm512_fmadd_ps(wv, xv[t], acc[r][t]);
            }
        }
        if (k < kn) {
            __mmask16 m = tail_mask(kn - k);
            __m512 xv[TMAX];
            UNROLL for (int t = 0; t < T; t++) xv[t] = _mm512_maskz_loadu_ps(m, xk + t * ldx + k);
            UNROLL for (int r = 0; r < R; r++) {
                __m512 wv = type == DHSA_GGML_F32   ? load_f32_m(w[r], k0 + k, m)
                            : type == DHSA_GGML_F16 ? load_f16_m(w[r], k0 + k, m)
                                                    : load_bf16_m(w[r], k0 + k, m);
                UNROLL for (int t = 0; t < T; t++) acc[r][t] = _mm512_fmadd_ps(wv, xv[t], acc[r][t]);
            }
        }
        return;
    }
    CASES_32: {
        const int64_t bb = blk_bytes(type);
        for (int64_t k = 0; k < kn; k += 32) {
            const int64_t off = (k0 + k) / 32 * bb;
            __m512 xv[TMAX][2];
            UNROLL for (int t = 0; t < T; t++) {
                xv[t][0] = _mm512_loadu_ps(xk + t * ldx + k);
                xv[t][1] = _mm512_loadu_ps(xk + t * ldx + k + 16);
            }
            UNROLL for (int r = 0; r < R; r++) {
                __m512 wv[2];
                prefetch(w[r] + off + pf, 1);
                dec32(type, w[r] + off, wv);
                UNROLL for (int t = 0; t < T; t++) {
                    acc[r][t] = _mm512_fmadd_ps(wv[0], xv[t][0], acc[r][t]);
                    acc[r][t] = _mm512_fmadd_ps(wv[1], xv[t][1], acc[r][t]);
                }
            }
        }
        return;
    }
    CASES_256: {
        const int64_t bb = blk_bytes(type);
        for (int64_t k = 0; k < kn; k += 256) {
            const int64_t off = (k0 + k) / 256 * bb;
            float cf[R][32] __attribute__((aligned(64)));
            UNROLL for (int r = 0; r < R; r++) {
                prefetch(w[r] + off + pf, (int)bb);
                prep256(type, w[r] + off, cf[r]);
            }
            /* the scales are broadcast from memory (load ports): without
             * this the compiler broadcasts them from registers with vpermd,
             * on the shuffle pipes the codes need */
            __asm__ volatile("" ::: "memory");
            UNROLL for (int u = 0; u < 4; u++) {
                const float *xu = xk + k + 64 * u;
                UNROLL for (int r = 0; r < R; r++) {
                    __m512 wv[4];
                    dec256(type, w[r] + off, cf[r], u, wv);
                    UNROLL for (int t = 0; t < T; t++) UNROLL for (int v = 0; v < 4; v++)
                        acc[r][t] = _mm512_fmadd_ps(wv[v], _mm512_loadu_ps(xu + t * ldx + 16 * v), acc[r][t]);
                }
            }
        }
        return;
    }
    default: return;
    }
}

/* R rows (w[r] = row r; rows >= nr repeat the last one) x T tokens, all K
 * blocks; y[t * ldy + r] for r < nr */
INLINE void fused_tile(const uint32_t type, const int T, const uint8_t *const *w, const float *x, int64_t ldx,
                       int64_t n_in, int64_t pf, float *y, int64_t ldy, int nr) {
    for (int64_t k0 = 0; k0 < n_in; k0 += DHSA_QK_KC) {
        const int64_t kn = n_in - k0 < DHSA_QK_KC ? n_in - k0 : DHSA_QK_KC;
        __m512 acc[R][TMAX];
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < TMAX; t++) acc[r][t] = _mm512_setzero_ps();
        fused_block(type, T, w, x + k0, ldx, k0, kn, pf, acc);
        if (T == 1) {
            float s[4];
            _mm_storeu_ps(s, tree4(acc[0][0], acc[1][0], acc[2][0], acc[3][0]));
            for (int r = 0; r < nr; r++) y[r] = k0 == 0 ? s[r] : y[r] + s[r];
            continue;
        }
        /* all (row, token) sums in one tree16 (tokens >= T are zero) */
        const __m512 s = tree16(&acc[0][0]);
        UNROLL for (int t = 0; t < T; t++) {
            __m128 st;
            switch (t) { /* the lane-group index must be a constant */
            case 0: st = _mm512_extractf32x4_ps(s, 0); break;
            case 1: st = _mm512_extractf32x4_ps(s, 1); break;
            case 2: st = _mm512_extractf32x4_ps(s, 2); break;
            default: st = _mm512_extractf32x4_ps(s, 3); break;
            }
            float *yt = y + t * ldy;
            if (nr == R) {
                _mm_storeu_ps(yt, k0 == 0 ? st : _mm_add_ps(_mm_loadu_ps(yt), st));
            } else {
                float sv[4];
                _mm_storeu_ps(sv, st);
                for (int r = 0; r < nr; r++) yt[r] = k0 == 0 ? sv[r] : yt[r] + sv[r];
            }
        }
    }
}

#include "matmul/f32_gemv.h"

/* fused-path limits in the order of DHSA_QK_TYPE_LIST (docs/quant.md): the
 * first seven measured, the others set by analogy (Q4_1, Q5_0, Q5_1, IQ4_NL
 * as Q4_0; Q5_K, IQ4_XS as Q4_K; Q2_K, Q3_K as Q6_K) */
const dhsa__f32_kernels dhsa__f32_avx512 = {
    "avx512", MR, NR, {16, 32, 32, 32, 32, 24, 12, 32, 32, 32, 12, 12, 24, 32, 24}, dequant, gemv, tile};

#else
typedef int dhsa__f32_avx512_unused; /* ISO C forbids an empty file */
#endif
