/* kern_avx512.c: AVX-512 micro-kernels of the tiled attention (contracts in
 * kern.h; compiled with -mavx512f... and used only when the CPU has it).
 * Register blocking: scores and P.V keep a 6 x 64 (W = 64) or 12 x 16
 * (W = 16) block of accumulators in zmm registers; each K or V element is
 * broadcast once per block and each Qt / S vector loaded once per row
 * group. Held to the scalar kernels and the double reference by
 * tests/test_attn.c.
 */
#if defined(__x86_64__) && defined(__AVX512F__)
#include <immintrin.h>

#include "attn/kern.h"
#include "dhsa.h"

#define UNROLL _Pragma("GCC unroll 16")
#ifndef PF
#define PF 8
#endif

/* exp as in dhsa__expf: x <= -104 (and -inf) gives 0 through scalef. */
static inline __m512 exp512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(DHSA_EXP_LO));
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
    return _mm512_scalef_ps(p, n);
}

/* ------------------------------------------------------------- scores --- */

/* S[j0..j0+MR) = K rows . Qt, NV vectors (16*NV columns) */
#define QK_BLOCK(MR, NV)                                                         \
    static inline void qk_##MR##_##NV(const float *K, int64_t ldk, int d,        \
                                      const float *Qt, float *S) {               \
        __m512 acc[MR][NV];                                                      \
        UNROLL for (int r = 0; r < MR; r++) UNROLL for (int x = 0; x < NV; x++)  \
            acc[r][x] = _mm512_setzero_ps();                                     \
        for (int c = 0; c < d; c++) {                                            \
            __m512 q[NV];                                                        \
            UNROLL for (int x = 0; x < NV; x++) q[x] =                           \
                _mm512_loadu_ps(Qt + (int64_t)c * 16 * NV + 16 * x);             \
            UNROLL for (int r = 0; r < MR; r++) {                                \
                __m512 kb = _mm512_set1_ps(K[r * ldk + c]);                      \
                UNROLL for (int x = 0; x < NV; x++) acc[r][x] =                  \
                    _mm512_fmadd_ps(kb, q[x], acc[r][x]);                        \
            }                                                                    \
        }                                                                        \
        UNROLL for (int r = 0; r < MR; r++) UNROLL for (int x = 0; x < NV; x++)  \
            _mm512_storeu_ps(S + (int64_t)r * 16 * NV + 16 * x, acc[r][x]);      \
    }

QK_BLOCK(6, 4)
QK_BLOCK(4, 4)
QK_BLOCK(2, 4)
QK_BLOCK(1, 4)
QK_BLOCK(12, 1)
QK_BLOCK(4, 1)
QK_BLOCK(1, 1)

static void qk(const float *K, int64_t ldk, int n, int d, const float *Qt, int W, float *S) {
    int j = 0;
    if (W == 64) {
        for (; j + 6 <= n; j += 6) qk_6_4(K + j * ldk, ldk, d, Qt, S + (int64_t)j * W);
        if (j + 4 <= n) qk_4_4(K + j * ldk, ldk, d, Qt, S + (int64_t)j * W), j += 4;
        if (j + 2 <= n) qk_2_4(K + j * ldk, ldk, d, Qt, S + (int64_t)j * W), j += 2;
        if (j < n) qk_1_4(K + j * ldk, ldk, d, Qt, S + (int64_t)j * W);
    } else {
        for (; j + 12 <= n; j += 12) qk_12_1(K + j * ldk, ldk, d, Qt, S + (int64_t)j * W);
        for (; j + 4 <= n; j += 4) qk_4_1(K + j * ldk, ldk, d, Qt, S + (int64_t)j * W);
        for (; j < n; j++) qk_1_1(K + j * ldk, ldk, d, Qt, S + (int64_t)j * W);
    }
}

/* ------------------------------------------------------------ softmax --- */

static void softmax(float *S, int n, int W, float *m, float *l, float *alpha) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    for (int x = 0; x < W; x += 16) {
        __m512 mold = _mm512_loadu_ps(m + x);
        __m512 mx = mold;
        for (int j = 0; j < n; j++) mx = _mm512_max_ps(mx, _mm512_loadu_ps(S + (int64_t)j * W + x));
        /* columns still all -inf subtract 0 so that exp gives 0, not NaN */
        __mmask16 none = _mm512_cmp_ps_mask(mx, ninf, _CMP_EQ_OQ);
        __m512 base = _mm512_mask_mov_ps(mx, none, _mm512_setzero_ps());
        __m512 al = exp512(_mm512_sub_ps(mold, base));
        __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
        int j = 0;
        for (; j + 2 <= n; j += 2) {
            float *s0 = S + (int64_t)j * W + x, *s1 = s0 + W;
            __m512 p0 = exp512(_mm512_sub_ps(_mm512_loadu_ps(s0), base));
            __m512 p1 = exp512(_mm512_sub_ps(_mm512_loadu_ps(s1), base));
            _mm512_storeu_ps(s0, p0);
            _mm512_storeu_ps(s1, p1);
            sum0 = _mm512_add_ps(sum0, p0);
            sum1 = _mm512_add_ps(sum1, p1);
        }
        if (j < n) {
            float *s0 = S + (int64_t)j * W + x;
            __m512 p0 = exp512(_mm512_sub_ps(_mm512_loadu_ps(s0), base));
            _mm512_storeu_ps(s0, p0);
            sum0 = _mm512_add_ps(sum0, p0);
        }
        __m512 lv = _mm512_fmadd_ps(_mm512_loadu_ps(l + x), al, _mm512_add_ps(sum0, sum1));
        _mm512_storeu_ps(l + x, lv);
        _mm512_storeu_ps(m + x, mx);
        _mm512_storeu_ps(alpha + x, al);
    }
}

/* ---------------------------------------------------------------- P.V --- */

#define PV_BLOCK(MR, NV)                                                         \
    static inline void pv_##MR##_##NV(const float *V, int64_t ldv, int n,        \
                                      const float *S, const float *alpha,        \
                                      float *Ot) {                               \
        __m512 acc[MR][NV], al[NV];                                              \
        UNROLL for (int x = 0; x < NV; x++) al[x] = _mm512_loadu_ps(alpha + 16 * x); \
        UNROLL for (int r = 0; r < MR; r++) UNROLL for (int x = 0; x < NV; x++)  \
            acc[r][x] = _mm512_mul_ps(                                           \
                _mm512_loadu_ps(Ot + (int64_t)r * 16 * NV + 16 * x), al[x]);     \
        for (int j = 0; j < n; j++) {                                            \
            __m512 p[NV];                                                        \
            UNROLL for (int x = 0; x < NV; x++) p[x] =                           \
                _mm512_loadu_ps(S + (int64_t)j * 16 * NV + 16 * x);              \
            const float *v = V + j * ldv;                                        \
            UNROLL for (int r = 0; r < MR; r++) {                                \
                __m512 vb = _mm512_set1_ps(v[r]);                                \
                UNROLL for (int x = 0; x < NV; x++) acc[r][x] =                  \
                    _mm512_fmadd_ps(vb, p[x], acc[r][x]);                        \
            }                                                                    \
        }                                                                        \
        UNROLL for (int r = 0; r < MR; r++) UNROLL for (int x = 0; x < NV; x++)  \
            _mm512_storeu_ps(Ot + (int64_t)r * 16 * NV + 16 * x, acc[r][x]);     \
    }

PV_BLOCK(6, 4)
PV_BLOCK(4, 4)
PV_BLOCK(2, 4)
PV_BLOCK(1, 4)
PV_BLOCK(12, 1)
PV_BLOCK(4, 1)
PV_BLOCK(1, 1)

static void pv(const float *V, int64_t ldv, int n, int dv, const float *S, int W, const float *alpha,
               float *Ot) {
    int c = 0;
    if (W == 64) {
        for (; c + 6 <= dv; c += 6) pv_6_4(V + c, ldv, n, S, alpha, Ot + (int64_t)c * W);
        if (c + 4 <= dv) pv_4_4(V + c, ldv, n, S, alpha, Ot + (int64_t)c * W), c += 4;
        if (c + 2 <= dv) pv_2_4(V + c, ldv, n, S, alpha, Ot + (int64_t)c * W), c += 2;
        if (c < dv) pv_1_4(V + c, ldv, n, S, alpha, Ot + (int64_t)c * W);
    } else {
        for (; c + 12 <= dv; c += 12) pv_12_1(V + c, ldv, n, S, alpha, Ot + (int64_t)c * W);
        for (; c + 4 <= dv; c += 4) pv_4_1(V + c, ldv, n, S, alpha, Ot + (int64_t)c * W);
        for (; c < dv; c++) pv_1_1(V + c, ldv, n, S, alpha, Ot + (int64_t)c * W);
    }
}

static void softcap(float *S, int64_t count, float cap) {
    const __m512 inv2 = _mm512_set1_ps(2.0f / cap), vc = _mm512_set1_ps(cap);
    const __m512 one = _mm512_set1_ps(1.0f), two = _mm512_set1_ps(2.0f);
    int64_t t = 0;
    for (; t + 16 <= count; t += 16) {
        __m512 e = exp512(_mm512_mul_ps(_mm512_loadu_ps(S + t), inv2));
        __m512 th = _mm512_sub_ps(one, _mm512_div_ps(two, _mm512_add_ps(e, one)));
        _mm512_storeu_ps(S + t, _mm512_mul_ps(vc, th));
    }
    for (; t < count; t++) {
        float e = dhsa__expf(S[t] * (2.0f / cap));
        S[t] = cap * (1.0f - 2.0f / (e + 1.0f));
    }
}

/* ------------------------------------------------------- narrow tiles --- */

static inline __mmask16 tail_mask(int64_t left) {
    return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
}

/* Sums each of 16 vectors: lane r of the result = sum of a[r]'s lanes. A
 * transpose-and-add tree: 45 instructions for 16 sums instead of 16
 * horizontal reductions. */
static inline __m512 reduce16(__m512 *a) {
    __m512 s[8], u[4], v[2];
    UNROLL for (int k = 0; k < 8; k++) /* per 128-bit lane: (a0+a2, b0+b2, a1+a3, b1+b3) */
        s[k] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * k], a[2 * k + 1]),
                             _mm512_unpackhi_ps(a[2 * k], a[2 * k + 1]));
    UNROLL for (int k = 0; k < 4; k++) /* per 128-bit lane: one partial sum of 4 vectors */
        u[k] = _mm512_add_ps(_mm512_shuffle_ps(s[2 * k], s[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(s[2 * k], s[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    UNROLL for (int k = 0; k < 2; k++) /* add 128-bit lanes pairwise */
        v[k] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * k], u[2 * k + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(u[2 * k], u[2 * k + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(v[0], v[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(v[0], v[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/* 16 keys at a time: per query, 16 accumulators over d (each K element is
 * one load and one FMA; the 16 K rows stay in L1 across queries), then one
 * transpose-reduce gives the 16 scores. */
static void qk_rows(const float *K, int64_t ldk, int n, int d, const float *Qr, int64_t dq, int nq,
                    float *Sr) {
    int j = 0;
    for (; j + 16 <= n; j += 16) {
        const float *k = K + j * ldk;
        for (int i = 0; i < nq; i++) {
            const float *q = Qr + (int64_t)i * dq; /* zero padded to dq */
            __m512 acc[16];
            UNROLL for (int r = 0; r < 16; r++) acc[r] = _mm512_setzero_ps();
            /* K is read row by row (a sequential stream for the memory
             * system; column-wise reads across 16 rows halve the bandwidth),
             * with up to 128 floats of the query held in registers. */
            for (int c0 = 0; c0 < d; c0 += 128) {
                int left = d - c0;
                __m512 qv[8];
                UNROLL for (int x = 0; x < 8; x++) qv[x] =
                    16 * x < left ? _mm512_loadu_ps(q + c0 + 16 * x) : _mm512_setzero_ps();
                UNROLL for (int r = 0; r < 16; r++) {
                    const float *kr = k + r * ldk + c0;
                    UNROLL for (int x = 0; x < 8; x++) if (16 * x < left) acc[r] =
                        _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail_mask(left - 16 * x), kr + 16 * x), qv[x], acc[r]);
                }
            }
            _mm512_storeu_ps(Sr + i * DHSA_BC + j, reduce16(acc));
        }
    }
    for (; j < n; j++) {
        const float *k = K + j * ldk;
        for (int i = 0; i < nq; i++) {
            const float *q = Qr + (int64_t)i * dq;
            __m512 a = _mm512_setzero_ps();
            for (int c = 0; c < d; c += 16)
                a = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail_mask(d - c), k + c), _mm512_loadu_ps(q + c), a);
            Sr[i * DHSA_BC + j] = _mm512_reduce_add_ps(a);
        }
    }
}

/* Queries in pairs, 128 output columns at a time: 16 accumulators and one V
 * row (8 vectors) in registers. V is read row by row, a sequential stream. */
static void pv_rows(const float *V, int64_t ldv, int n, int dv, const float *Sr, int nq,
                    const float *alpha, float *Or) {
    for (int c0 = 0; c0 < dv; c0 += 128) {
        int left = dv - c0;
        __mmask16 mk[8];
        UNROLL for (int x = 0; x < 8; x++) mk[x] = 16 * x < left ? tail_mask(left - 16 * x) : 0;
        for (int i = 0; i < nq; i += 2) {
            int two = i + 1 < nq;
            float *o0 = Or + (int64_t)i * dv + c0, *o1 = two ? o0 + dv : o0;
            __m512 al0 = _mm512_set1_ps(alpha[i]), al1 = _mm512_set1_ps(alpha[two ? i + 1 : i]);
            __m512 a0[8], a1[8];
            UNROLL for (int x = 0; x < 8; x++) {
                a0[x] = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk[x], o0 + 16 * x), al0);
                a1[x] = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk[x], o1 + 16 * x), al1);
            }
            const float *s0 = Sr + i * DHSA_BC, *s1 = s0 + two * DHSA_BC;
            for (int j = 0; j < n; j++) {
                const float *v = V + j * ldv + c0;
                __m512 p0 = _mm512_set1_ps(s0[j]);
                __m512 p1 = _mm512_set1_ps(s1[j]);
                UNROLL for (int x = 0; x < 8; x++) if (16 * x < left) {
                    __m512 vv = _mm512_maskz_loadu_ps(mk[x], v + 16 * x);
                    a0[x] = _mm512_fmadd_ps(p0, vv, a0[x]);
                    a1[x] = _mm512_fmadd_ps(p1, vv, a1[x]);
                }
            }
            UNROLL for (int x = 0; x < 8; x++) if (16 * x < left) {
                if (two) _mm512_mask_storeu_ps(o1 + 16 * x, mk[x], a1[x]);
                _mm512_mask_storeu_ps(o0 + 16 * x, mk[x], a0[x]);
            }
        }
    }
}

static void softmax_rows(float *Sr, int n, int nq, float *m, float *l, float *alpha) {
    for (int i = 0; i < nq; i++) {
        float *s = Sr + i * DHSA_BC;
        __m512 mx = _mm512_set1_ps(m[i]);
        int j = 0;
        for (; j + 16 <= n; j += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(s + j));
        if (j < n) mx = _mm512_mask_max_ps(mx, tail_mask(n - j), mx, _mm512_loadu_ps(s + j));
        float mxs = _mm512_reduce_max_ps(mx);
        float base = mxs == -INFINITY ? 0.0f : mxs; /* all -inf: exp gives 0, not NaN */
        __m512 vb = _mm512_set1_ps(base), sum = _mm512_setzero_ps();
        for (j = 0; j < n; j += 16) {
            __mmask16 mk = tail_mask(n - j);
            __m512 p = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, s + j), vb));
            _mm512_mask_storeu_ps(s + j, mk, p);
            sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(mk, p));
        }
        alpha[i] = dhsa__expf(m[i] - base);
        l[i] = l[i] * alpha[i] + _mm512_reduce_add_ps(sum);
        m[i] = mxs;
    }
}

static void widen(const uint16_t *src, int is_bf16, int64_t n, float *dst) {
    int64_t c = 0;
    for (; c + 16 <= n; c += 16) {
        __m256i h = _mm256_loadu_si256((const __m256i *)(src + c));
        __m512 f = is_bf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
                           : _mm512_cvtph_ps(h);
        _mm512_storeu_ps(dst + c, f);
    }
    for (; c < n; c++) dst[c] = is_bf16 ? dhsa_bf16_to_f32(src[c]) : dhsa_f16_to_f32(src[c]);
}

const dhsa_attn_kernels dhsa__kern_avx512 = {qk, softmax, pv, softcap, qk_rows, softmax_rows, pv_rows, widen};

#else
typedef int dhsa__kern_avx512_unused; /* ISO C forbids an empty file */
#endif
