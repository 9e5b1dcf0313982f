/* exp_avx512.h: the kernels' vector exp on 16 lanes, shared by
 * the AVX-512 files (src/attn/kern_avx512.c, src/route/predictor_avx512.c).
 * Include only from files compiled with the AVX-512 flags (the
 * scalar form and its constants: exp.h). */
#ifndef DHSA_CORE_EXP_AVX512_H
#define DHSA_CORE_EXP_AVX512_H

#include <immintrin.h>

#include "core/exp.h"

/* exp as in dhsa__expf, except that x < DHSA_EXP_VLO (and -inf) gives 0 (exp.h). */
static inline __m512 exp512(__m512 x) {
    __mmask16 ok = _mm512_cmp_ps_mask(x, _mm512_set1_ps(DHSA_EXP_VLO), _CMP_NLT_UQ);
    x = _mm512_max_ps(x, _mm512_set1_ps(DHSA_EXP_VLO));
    x = _mm512_min_ps(x, _mm512_set1_ps(DHSA_EXP_HI));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(DHSA_LOG2E)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(DHSA_LN2_HI), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(DHSA_LN2_LO), r);
    __m512 p = _mm512_set1_ps(DHSA_EXP_C7);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(DHSA_EXP_C6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(DHSA_EXP_C5));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(DHSA_EXP_C4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(DHSA_EXP_C3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(DHSA_EXP_C2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_maskz_scalef_ps(ok, p, n); /* 2^n >= 2^-126: never subnormal */
}

#endif
