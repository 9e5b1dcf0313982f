/* tree512.h: the lane tree of the AVX-512 weight products (f32.h's
 * summation order: the 16 lanes of an accumulator summed by halves, then
 * quarters, ...), shared by f32_avx512.c and bf16_avx512bf16.c so that
 * the exact and the BF16 paths reduce alike. Include only from a file
 * compiled with the AVX-512 flags (-mavx512f -mavx512dq).
 */
#ifndef DHSA_MODEL_QUANT_TREE512_H
#define DHSA_MODEL_QUANT_TREE512_H

#include <immintrin.h>

/* s = ((v[j] + v[j+8]) for j < 8) -> (a[j] + a[j+4]) -> (b0 + b2, b1 + b3) -> c0 + c1 */
static inline __attribute__((always_inline)) float tree1(__m512 v) {
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
}

/* The same tree for four vectors at once: [tree1(v0), ..., tree1(v3)]. */
static inline __attribute__((always_inline)) __m128 tree4(__m512 v0, __m512 v1, __m512 v2, __m512 v3) {
    __m256 a0 = _mm256_add_ps(_mm512_castps512_ps256(v0), _mm512_extractf32x8_ps(v0, 1));
    __m256 a1 = _mm256_add_ps(_mm512_castps512_ps256(v1), _mm512_extractf32x8_ps(v1, 1));
    __m256 a2 = _mm256_add_ps(_mm512_castps512_ps256(v2), _mm512_extractf32x8_ps(v2, 1));
    __m256 a3 = _mm256_add_ps(_mm512_castps512_ps256(v3), _mm512_extractf32x8_ps(v3, 1));
    /* b01 = [b0 | b1], b_k[j] = a_k[j] + a_k[j+4] */
    __m256 b01 = _mm256_add_ps(_mm256_permute2f128_ps(a0, a1, 0x20), _mm256_permute2f128_ps(a0, a1, 0x31));
    __m256 b23 = _mm256_add_ps(_mm256_permute2f128_ps(a2, a3, 0x20), _mm256_permute2f128_ps(a2, a3, 0x31));
    /* c = [c0[0] c0[1] c2[0] c2[1] | c1[0] c1[1] c3[0] c3[1]], c_k[i] = b_k[i] + b_k[i+2] */
    __m256 c = _mm256_add_ps(_mm256_shuffle_ps(b01, b23, _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(b01, b23, _MM_SHUFFLE(3, 2, 3, 2)));
    /* g = [r0 r2 r0 r2 | r1 r3 r1 r3] */
    __m256 g = _mm256_add_ps(_mm256_shuffle_ps(c, c, _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm256_shuffle_ps(c, c, _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm_unpacklo_ps(_mm256_castps256_ps128(g), _mm256_extractf128_ps(g, 1));
}

/* The same tree for sixteen vectors at once, as a transpose-and-add: lane
 * i of the result is tree1(v[4 * (i % 4) + i / 4]). Each stage adds the
 * same pairs of lanes as tree1 does (halves, quarters, pairs, then the two
 * last), with four or eight vectors' partial sums side by side in a zmm, so
 * the results are bitwise tree1's; 30 shuffles and 15 adds where four
 * tree4 take about twice that. v is [16] (acc[r][t] in row-major order
 * gives lane t * 4 + r). */
static inline __attribute__((always_inline)) __m512 tree16(const __m512 *v) {
    __m512 p[8], q[4], r[2];
    /* p[k] = [v_2k[j] + v_2k[j+8] | v_2k+1[j] + v_2k+1[j+8]], j < 8 */
    for (int k = 0; k < 8; k++)
        p[k] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* q[k]: four vectors' a[j] + a[j+4], j < 4, one per 128-bit lane */
    for (int k = 0; k < 4; k++)
        q[k] = _mm512_add_ps(_mm512_shuffle_f32x4(p[2 * k], p[2 * k + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(p[2 * k], p[2 * k + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    /* r[k]: per 128-bit lane [b0 + b2, b1 + b3] of q[2k]'s vector, then q[2k+1]'s */
    for (int k = 0; k < 2; k++)
        r[k] = _mm512_add_ps(_mm512_shuffle_ps(q[2 * k], q[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(q[2 * k], q[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* c0 + c1 */
    return _mm512_add_ps(_mm512_shuffle_ps(r[0], r[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_ps(r[0], r[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

#endif
