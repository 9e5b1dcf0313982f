/* predictor_avx512.c: the learned predictor's window kernel in AVX-512
 * (contract in predictor_internal.h: the features f [4C + 1] of one
 * candidate from its 2w rows of X, Q, K, V). Compiled with -mavx512f ...
 * by the Makefile and chosen at run time (dhsa_active_isa); elsewhere this
 * file is empty and the scalar kernel of predictor.c runs.
 *
 * 16 lanes over the C features, the last vector masked (C need not be a
 * multiple of 16). The 2w x 2w scores take four key rows per query row at
 * a time; the softmax uses the attention kernels' exp (dhsa__expf's
 * polynomial, within 1e-8 relative of libm's expf); A V and the residual
 * are one FMA chain per vector in the scalar kernel's order; LayerNorm
 * statistics, the centring and the cosine stay in double as in the scalar
 * kernel. It differs from the scalar kernel by FMA rounding, the exp and
 * the order of the dot products' sums: tests/test_predictor.c holds the
 * probabilities to 2e-6 of the scalar kernel's.
 */
#if defined(__x86_64__) && defined(__AVX512F__)
#include <immintrin.h>
#include <math.h>

#include "route/predictor_internal.h"

#include "core/exp_avx512.h" /* exp512: x < -87.3 gives 0 */

/* lanes [0, n) of a 16-lane vector, n >= 0 */
static inline __mmask16 lanes(int64_t n) { return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u); }

/* sum of v's 16 lanes in double */
static inline __m512d widen_lo(__m512 v) { return _mm512_cvtps_pd(_mm512_castps512_ps256(v)); }
static inline __m512d widen_hi(__m512 v) { return _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1)); }

/* dots of q [C] with four rows k0..k3 [C] (rows C apart) */
static inline void dot4(const float *q, const float *k, int64_t C, float *out) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t c = 0; c < C; c += 16) {
        __mmask16 m = lanes(C - c);
        __m512 x = _mm512_maskz_loadu_ps(m, q + c);
        a0 = _mm512_fmadd_ps(x, _mm512_maskz_loadu_ps(m, k + c), a0);
        a1 = _mm512_fmadd_ps(x, _mm512_maskz_loadu_ps(m, k + C + c), a1);
        a2 = _mm512_fmadd_ps(x, _mm512_maskz_loadu_ps(m, k + 2 * C + c), a2);
        a3 = _mm512_fmadd_ps(x, _mm512_maskz_loadu_ps(m, k + 3 * C + c), a3);
    }
    out[0] = _mm512_reduce_add_ps(a0);
    out[1] = _mm512_reduce_add_ps(a1);
    out[2] = _mm512_reduce_add_ps(a2);
    out[3] = _mm512_reduce_add_ps(a3);
}

static inline float dot1(const float *q, const float *k, int64_t C) {
    __m512 a = _mm512_setzero_ps();
    for (int64_t c = 0; c < C; c += 16) {
        __mmask16 m = lanes(C - c);
        a = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + c), _mm512_maskz_loadu_ps(m, k + c), a);
    }
    return _mm512_reduce_add_ps(a);
}

void dhsa__predictor_window_avx512(const dhsa_predictor *pr, const float *X, const float *Q, const float *K,
                                   const float *V, float *ws, float *f) {
    const int64_t C = pr->C, w = pr->w, W2 = 2 * w;
    float *A = ws;                                        /* [2w][2w] */
    float *l = A + dhsa__align_up((size_t)(W2 * W2), 16); /* [C] */
    float *r = l + dhsa__align_up((size_t)C, 16);         /* [C] */
    float *h = r + dhsa__align_up((size_t)C, 16);         /* [C]: one H row at a time */
    const float inv = (float)(1.0 / sqrt((double)C));
    /* A = softmax(Q K^T / sqrt(C)) by rows */
    for (int64_t i = 0; i < W2; i++) {
        float *a = A + i * W2;
        int64_t k2 = 0;
        for (; k2 + 4 <= W2; k2 += 4) dot4(Q + i * C, K + k2 * C, C, a + k2);
        for (; k2 < W2; k2++) a[k2] = dot1(Q + i * C, K + k2 * C, C);
        __m512 mx = _mm512_set1_ps(-INFINITY);
        for (int64_t x = 0; x < W2; x += 16) {
            __mmask16 m = lanes(W2 - x);
            __m512 s = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, a + x), _mm512_set1_ps(inv));
            _mm512_mask_storeu_ps(a + x, m, s);
            mx = _mm512_mask_max_ps(mx, m, mx, s);
        }
        __m512 mxv = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
        __m512 sum = _mm512_setzero_ps();
        for (int64_t x = 0; x < W2; x += 16) {
            __mmask16 m = lanes(W2 - x);
            __m512 e = _mm512_maskz_mov_ps(m, exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, a + x), mxv)));
            _mm512_mask_storeu_ps(a + x, m, e);
            sum = _mm512_add_ps(sum, e);
        }
        __m512 sv = _mm512_set1_ps(_mm512_reduce_add_ps(sum));
        for (int64_t x = 0; x < W2; x += 16) {
            __mmask16 m = lanes(W2 - x);
            _mm512_mask_storeu_ps(a + x, m, _mm512_div_ps(_mm512_maskz_loadu_ps(m, a + x), sv));
        }
    }
    for (int64_t c = 0; c < C; c++) l[c] = r[c] = 0.0f;
    const __m512 wv = _mm512_set1_ps((float)w);
    for (int64_t i = 0; i < W2; i++) {
        /* h = X[i] + A[i] V, then its mean and variance in double */
        __m512d s0 = _mm512_setzero_pd(), s1 = s0;
        for (int64_t c = 0; c < C; c += 16) {
            __mmask16 m = lanes(C - c);
            __m512 acc = _mm512_maskz_loadu_ps(m, X + i * C + c);
            for (int64_t k2 = 0; k2 < W2; k2++)
                acc = _mm512_fmadd_ps(_mm512_set1_ps(A[i * W2 + k2]), _mm512_maskz_loadu_ps(m, V + k2 * C + c), acc);
            _mm512_mask_storeu_ps(h + c, m, acc);
            s0 = _mm512_add_pd(s0, widen_lo(acc));
            s1 = _mm512_add_pd(s1, widen_hi(acc));
        }
        double mean = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1)) / (double)C;
        const __m512d mv = _mm512_set1_pd(mean);
        __m512d v0 = _mm512_setzero_pd(), v1 = v0;
        for (int64_t c = 0; c < C; c += 16) {
            __mmask16 m = lanes(C - c);
            __m512 x = _mm512_maskz_loadu_ps(m, h + c);
            __m512d d0 = _mm512_maskz_sub_pd((__mmask8)(m & 0xFF), widen_lo(x), mv);
            __m512d d1 = _mm512_maskz_sub_pd((__mmask8)(m >> 8), widen_hi(x), mv);
            v0 = _mm512_fmadd_pd(d0, d0, v0);
            v1 = _mm512_fmadd_pd(d1, d1, v1);
        }
        double var = _mm512_reduce_add_pd(_mm512_add_pd(v0, v1));
        const __m512 rstd = _mm512_set1_ps((float)(1.0 / sqrt(var / (double)C + 1e-5)));
        float *dst = i < w ? l : r;
        for (int64_t c = 0; c < C; c += 16) {
            __mmask16 m = lanes(C - c);
            __m512 x = _mm512_maskz_loadu_ps(m, h + c);
            /* (float)(h - mean), the centring in double as the scalar kernel */
            __m256 c0 = _mm512_cvtpd_ps(_mm512_sub_pd(widen_lo(x), mv));
            __m256 c1 = _mm512_cvtpd_ps(_mm512_sub_pd(widen_hi(x), mv));
            __m512 y = _mm512_insertf32x8(_mm512_castps256_ps512(c0), c1, 1);
            y = _mm512_mul_ps(_mm512_mul_ps(y, rstd), _mm512_maskz_loadu_ps(m, pr->gamma + c));
            y = _mm512_div_ps(_mm512_add_ps(y, _mm512_maskz_loadu_ps(m, pr->beta + c)), wv);
            _mm512_mask_storeu_ps(dst + c, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, dst + c), y));
        }
    }
    /* f = [l, r, |l - r|, l * r, cos(l, r)] */
    __m512d ll0 = _mm512_setzero_pd(), ll1 = ll0, rr0 = ll0, rr1 = ll0, lr0 = ll0, lr1 = ll0;
    const __m512 sign = _mm512_set1_ps(-0.0f);
    for (int64_t c = 0; c < C; c += 16) {
        __mmask16 m = lanes(C - c);
        __m512 lv = _mm512_maskz_loadu_ps(m, l + c), rv = _mm512_maskz_loadu_ps(m, r + c);
        _mm512_mask_storeu_ps(f + c, m, lv);
        _mm512_mask_storeu_ps(f + C + c, m, rv);
        _mm512_mask_storeu_ps(f + 2 * C + c, m, _mm512_andnot_ps(sign, _mm512_sub_ps(lv, rv)));
        _mm512_mask_storeu_ps(f + 3 * C + c, m, _mm512_mul_ps(lv, rv));
        __m512d la = widen_lo(lv), lb = widen_hi(lv), ra = widen_lo(rv), rb = widen_hi(rv);
        ll0 = _mm512_fmadd_pd(la, la, ll0);
        ll1 = _mm512_fmadd_pd(lb, lb, ll1);
        rr0 = _mm512_fmadd_pd(ra, ra, rr0);
        rr1 = _mm512_fmadd_pd(rb, rb, rr1);
        lr0 = _mm512_fmadd_pd(la, ra, lr0);
        lr1 = _mm512_fmadd_pd(lb, rb, lr1);
    }
    double ll = _mm512_reduce_add_pd(_mm512_add_pd(ll0, ll1)), rr = _mm512_reduce_add_pd(_mm512_add_pd(rr0, rr1)),
           lrr = _mm512_reduce_add_pd(_mm512_add_pd(lr0, lr1));
    f[4 * C] = ll > 0 && rr > 0 ? (float)(lrr / sqrt(ll * rr)) : 0.0f;
}

#else
typedef int dhsa__predictor_avx512_unused; /* ISO C forbids an empty file */
#endif
