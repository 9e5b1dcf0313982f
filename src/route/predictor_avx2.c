/* predictor_avx2.c: the learned predictor's window kernel in AVX2 + FMA,
 * for x86 machines without AVX-512 (contract in predictor_internal.h).
 * Compiled with -mavx2 -mfma by the Makefile and chosen at run time
 * (dhsa_active_isa); elsewhere this file is empty and the scalar kernel of
 * predictor.c runs.
 *
 * The structure of predictor_avx512.c on 8 lanes (masked loads for the
 * last vector of C): four key rows per query row for the scores, the
 * attention kernels' exp (below -87.3 it gives 0 instead of a subnormal),
 * one FMA chain per vector for A V and the residual, LayerNorm statistics,
 * the centring and the cosine in double. Held to the scalar kernel by
 * tests/test_predictor.c (probabilities within 2e-6).
 */
#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#include <math.h>

#include "route/predictor_internal.h"


#include "core/exp_avx2.h" /* exp256: x < -87.3 gives 0 */

/* lanes [0, n) of an 8-lane vector as a mask, n >= 0 */
static inline __m256i lanes(int64_t n) {
    int k = n >= 8 ? 8 : (int)n;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline __m256d mask_lo(__m256i m) { return _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm256_castsi256_si128(m))); }
static inline __m256d mask_hi(__m256i m) { return _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm256_extracti128_si256(m, 1))); }
static inline __m256d widen_lo(__m256 v) { return _mm256_cvtps_pd(_mm256_castps256_ps128(v)); }
static inline __m256d widen_hi(__m256 v) { return _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)); }

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline float hmax(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline double hsum_pd(__m256d v) {
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

static inline void dot4(const float *q, const float *k, int64_t C, float *out) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t c = 0; c < C; c += 8) {
        __m256i m = lanes(C - c);
        __m256 x = _mm256_maskload_ps(q + c, m);
        a0 = _mm256_fmadd_ps(x, _mm256_maskload_ps(k + c, m), a0);
        a1 = _mm256_fmadd_ps(x, _mm256_maskload_ps(k + C + c, m), a1);
        a2 = _mm256_fmadd_ps(x, _mm256_maskload_ps(k + 2 * C + c, m), a2);
        a3 = _mm256_fmadd_ps(x, _mm256_maskload_ps(k + 3 * C + c, m), a3);
    }
    out[0] = hsum(a0);
    out[1] = hsum(a1);
    out[2] = hsum(a2);
    out[3] = hsum(a3);
}

static inline float dot1(const float *q, const float *k, int64_t C) {
    __m256 a = _mm256_setzero_ps();
    for (int64_t c = 0; c < C; c += 8) {
        __m256i m = lanes(C - c);
        a = _mm256_fmadd_ps(_mm256_maskload_ps(q + c, m), _mm256_maskload_ps(k + c, m), a);
    }
    return hsum(a);
}

void dhsa__predictor_window_avx2(const dhsa_predictor *pr, const float *X, const float *Q, const float *K,
                                 const float *V, float *ws, float *f) {
    const int64_t C = pr->C, w = pr->w, W2 = 2 * w;
    float *A = ws;                                        /* [2w][2w] */
    float *l = A + dhsa__align_up((size_t)(W2 * W2), 16); /* [C] */
    float *r = l + dhsa__align_up((size_t)C, 16);         /* [C] */
    float *h = r + dhsa__align_up((size_t)C, 16);         /* [C]: one H row at a time */
    const float inv = (float)(1.0 / sqrt((double)C));
    for (int64_t i = 0; i < W2; i++) {
        float *a = A + i * W2;
        int64_t k2 = 0;
        for (; k2 + 4 <= W2; k2 += 4) dot4(Q + i * C, K + k2 * C, C, a + k2);
        for (; k2 < W2; k2++) a[k2] = dot1(Q + i * C, K + k2 * C, C);
        __m256 mx = _mm256_set1_ps(-INFINITY);
        for (int64_t x = 0; x < W2; x += 8) {
            __m256i m = lanes(W2 - x);
            __m256 s = _mm256_mul_ps(_mm256_maskload_ps(a + x, m), _mm256_set1_ps(inv));
            _mm256_maskstore_ps(a + x, m, s);
            mx = _mm256_max_ps(mx, _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), s, _mm256_castsi256_ps(m)));
        }
        __m256 mxv = _mm256_set1_ps(hmax(mx));
        __m256 sum = _mm256_setzero_ps();
        for (int64_t x = 0; x < W2; x += 8) {
            __m256i m = lanes(W2 - x);
            __m256 e = _mm256_and_ps(exp256(_mm256_sub_ps(_mm256_maskload_ps(a + x, m), mxv)), _mm256_castsi256_ps(m));
            _mm256_maskstore_ps(a + x, m, e);
            sum = _mm256_add_ps(sum, e);
        }
        __m256 sv = _mm256_set1_ps(hsum(sum));
        for (int64_t x = 0; x < W2; x += 8) {
            __m256i m = lanes(W2 - x);
            _mm256_maskstore_ps(a + x, m, _mm256_div_ps(_mm256_maskload_ps(a + x, m), sv));
        }
    }
    for (int64_t c = 0; c < C; c++) l[c] = r[c] = 0.0f;
    const __m256 wv = _mm256_set1_ps((float)w);
    for (int64_t i = 0; i < W2; i++) {
        __m256d s0 = _mm256_setzero_pd(), s1 = s0;
        for (int64_t c = 0; c < C; c += 8) {
            __m256i m = lanes(C - c);
            __m256 acc = _mm256_maskload_ps(X + i * C + c, m);
            for (int64_t k2 = 0; k2 < W2; k2++)
                acc = _mm256_fmadd_ps(_mm256_set1_ps(A[i * W2 + k2]), _mm256_maskload_ps(V + k2 * C + c, m), acc);
            _mm256_maskstore_ps(h + c, m, acc);
            s0 = _mm256_add_pd(s0, widen_lo(acc));
            s1 = _mm256_add_pd(s1, widen_hi(acc));
        }
        double mean = hsum_pd(_mm256_add_pd(s0, s1)) / (double)C;
        const __m256d mv = _mm256_set1_pd(mean);
        __m256d v0 = _mm256_setzero_pd(), v1 = v0;
        for (int64_t c = 0; c < C; c += 8) {
            __m256i m = lanes(C - c);
            __m256 x = _mm256_maskload_ps(h + c, m);
            __m256d d0 = _mm256_and_pd(_mm256_sub_pd(widen_lo(x), mv), mask_lo(m));
            __m256d d1 = _mm256_and_pd(_mm256_sub_pd(widen_hi(x), mv), mask_hi(m));
            v0 = _mm256_fmadd_pd(d0, d0, v0);
            v1 = _mm256_fmadd_pd(d1, d1, v1);
        }
        double var = hsum_pd(_mm256_add_pd(v0, v1));
        const __m256 rstd = _mm256_set1_ps((float)(1.0 / sqrt(var / (double)C + 1e-5)));
        float *dst = i < w ? l : r;
        for (int64_t c = 0; c < C; c += 8) {
            __m256i m = lanes(C - c);
            __m256 x = _mm256_maskload_ps(h + c, m);
            __m128 c0 = _mm256_cvtpd_ps(_mm256_sub_pd(widen_lo(x), mv));
            __m128 c1 = _mm256_cvtpd_ps(_mm256_sub_pd(widen_hi(x), mv));
            __m256 y = _mm256_insertf128_ps(_mm256_castps128_ps256(c0), c1, 1);
            y = _mm256_mul_ps(_mm256_mul_ps(y, rstd), _mm256_maskload_ps(pr->gamma + c, m));
            y = _mm256_div_ps(_mm256_add_ps(y, _mm256_maskload_ps(pr->beta + c, m)), wv);
            _mm256_maskstore_ps(dst + c, m, _mm256_add_ps(_mm256_maskload_ps(dst + c, m), y));
        }
    }
    __m256d ll0 = _mm256_setzero_pd(), ll1 = ll0, rr0 = ll0, rr1 = ll0, lr0 = ll0, lr1 = ll0;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t c = 0; c < C; c += 8) {
        __m256i m = lanes(C - c);
        __m256 lv = _mm256_maskload_ps(l + c, m), rv = _mm256_maskload_ps(r + c, m);
        _mm256_maskstore_ps(f + c, m, lv);
        _mm256_maskstore_ps(f + C + c, m, rv);
        _mm256_maskstore_ps(f + 2 * C + c, m, _mm256_andnot_ps(sign, _mm256_sub_ps(lv, rv)));
        _mm256_maskstore_ps(f + 3 * C + c, m, _mm256_mul_ps(lv, rv));
        __m256d la = widen_lo(lv), lb = widen_hi(lv), ra = widen_lo(rv), rb = widen_hi(rv);
        ll0 = _mm256_fmadd_pd(la, la, ll0);
        ll1 = _mm256_fmadd_pd(lb, lb, ll1);
        rr0 = _mm256_fmadd_pd(ra, ra, rr0);
        rr1 = _mm256_fmadd_pd(rb, rb, rr1);
        lr0 = _mm256_fmadd_pd(la, ra, lr0);
        lr1 = _mm256_fmadd_pd(lb, rb, lr1);
    }
    double ll = hsum_pd(_mm256_add_pd(ll0, ll1)), rr = hsum_pd(_mm256_add_pd(rr0, rr1)),
           lrr = hsum_pd(_mm256_add_pd(lr0, lr1));
    f[4 * C] = ll > 0 && rr > 0 ? (float)(lrr / sqrt(ll * rr)) : 0.0f;
}

#else
typedef int dhsa__predictor_avx2_unused; /* ISO C forbids an empty file */
#endif
