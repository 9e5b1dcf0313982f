/* exp_avx2.h: the kernels' vector exp on 8 lanes, shared by the
 * AVX2 files (src/attn/kern_avx2.c, src/route/predictor_avx2.c). Include
 * only from files compiled with -mavx2 -mfma (the scalar form and its
 * constants: exp.h). */
#ifndef DHSA_CORE_EXP_AVX2_H
#define DHSA_CORE_EXP_AVX2_H

#include <immintrin.h>

#include "core/exp.h"

/* exp as in dhsa__expf, except that x < DHSA_EXP_VLO (and -inf) gives 0 (exp.h). */
static inline __m256 exp256(__m256 x) {
    __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(DHSA_EXP_VLO), _CMP_LT_OQ);
    x = _mm256_max_ps(x, _mm256_set1_ps(DHSA_EXP_VLO));
    x = _mm256_min_ps(x, _mm256_set1_ps(DHSA_EXP_HI));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(DHSA_LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(DHSA_LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(DHSA_LN2_LO), r);
    __m256 p = _mm256_set1_ps(DHSA_EXP_C7);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(DHSA_EXP_C6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(DHSA_EXP_C5));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(DHSA_EXP_C4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(DHSA_EXP_C3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(DHSA_EXP_C2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(under, y);
}

#endif
