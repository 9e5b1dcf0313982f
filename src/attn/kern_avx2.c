/* kern_avx2.c: AVX2 + FMA micro-kernels of the tiled attention (contracts
 * in kern.h). With 16 ymm registers the blocks are 4 rows x 16 columns
 * (8 accumulators), walked over the W columns in slices of 16. exp differs
 * from dhsa__expf only below -87.3, where it returns 0 instead of a
 * subnormal (no effect on a softmax whose largest term is 1).
 * Held to the double reference by tests/test_attn.c.
 */
#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#include "attn/kern.h"
#include "dhsa.h"

#define UNROLL _Pragma("GCC unroll 16")

#include "core/exp_avx2.h"

/* rows [0, MR) of a 16-column slice: S[r][0..16) = K[r] . Qt[:, 0..16) */
#define QK_BLOCK(MR)                                                             \
    static inline void qk_##MR(const float *K, int64_t ldk, int d, const float *Qt, \
                               int W, float *S) {                                \
        __m256 acc[MR][2];                                                       \
        UNROLL for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps(); \
        for (int c = 0; c < d; c++) {                                            \
            __m256 q0 = _mm256_loadu_ps(Qt + (int64_t)c * W);                    \
            __m256 q1 = _mm256_loadu_ps(Qt + (int64_t)c * W + 8);                \
            UNROLL for (int r = 0; r < MR; r++) {                                \
                __m256 kb = _mm256_broadcast_ss(K + r * ldk + c);                \
                acc[r][0] = _mm256_fmadd_ps(kb, q0, acc[r][0]);                  \
                acc[r][1] = _mm256_fmadd_ps(kb, q1, acc[r][1]);                  \
            }                                                                    \
        }                                                                        \
        UNROLL for (int r = 0; r < MR; r++) {                                    \
            _mm256_storeu_ps(S + (int64_t)r * W, acc[r][0]);                     \
            _mm256_storeu_ps(S + (int64_t)r * W + 8, acc[r][1]);                 \
        }                                                                        \
    }

QK_BLOCK(4)
QK_BLOCK(1)

static void qk(const float *K, int64_t ldk, int n, int d, const float *Qt, int W, float *S) {
    for (int x = 0; x < W; x += 16) {
        int j = 0;
        for (; j + 4 <= n; j += 4) qk_4(K + j * ldk, ldk, d, Qt + x, W, S + (int64_t)j * W + x);
        for (; j < n; j++) qk_1(K + j * ldk, ldk, d, Qt + x, W, S + (int64_t)j * W + x);
    }
}

static void softmax(float *S, int n, int W, float *m, float *l, float *alpha) {
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    for (int x = 0; x < W; x += 8) {
        __m256 mold = _mm256_loadu_ps(m + x), mx = mold;
        for (int j = 0; j < n; j++) mx = _mm256_max_ps(mx, _mm256_loadu_ps(S + (int64_t)j * W + x));
        __m256 none = _mm256_cmp_ps(mx, ninf, _CMP_EQ_OQ);
        __m256 base = _mm256_andnot_ps(none, mx);
        __m256 al = exp256(_mm256_sub_ps(mold, base));
        __m256 sum = _mm256_setzero_ps();
        for (int j = 0; j < n; j++) {
            float *s = S + (int64_t)j * W + x;
            __m256 p = exp256(_mm256_sub_ps(_mm256_loadu_ps(s), base));
            _mm256_storeu_ps(s, p);
            sum = _mm256_add_ps(sum, p);
        }
        _mm256_storeu_ps(l + x, _mm256_fmadd_ps(_mm256_loadu_ps(l + x), al, sum));
        _mm256_storeu_ps(m + x, mx);
        _mm256_storeu_ps(alpha + x, al);
    }
}

#define PV_BLOCK(MR)                                                             \
    static inline void pv_##MR(const float *V, int64_t ldv, int n, const float *S, \
                               int W, const float *alpha, float *Ot) {           \
        __m256 acc[MR][2];                                                       \
        __m256 a0 = _mm256_loadu_ps(alpha), a1 = _mm256_loadu_ps(alpha + 8);     \
        UNROLL for (int r = 0; r < MR; r++) {                                    \
            acc[r][0] = _mm256_mul_ps(_mm256_loadu_ps(Ot + (int64_t)r * W), a0); \
            acc[r][1] = _mm256_mul_ps(_mm256_loadu_ps(Ot + (int64_t)r * W + 8), a1); \
        }                                                                        \
        for (int j = 0; j < n; j++) {                                            \
            __m256 p0 = _mm256_loadu_ps(S + (int64_t)j * W);                     \
            __m256 p1 = _mm256_loadu_ps(S + (int64_t)j * W + 8);                 \
            const float *v = V + j * ldv;                                        \
            UNROLL for (int r = 0; r < MR; r++) {                                \
                __m256 vb = _mm256_broadcast_ss(v + r);                          \
                acc[r][0] = _mm256_fmadd_ps(vb, p0, acc[r][0]);                  \
                acc[r][1] = _mm256_fmadd_ps(vb, p1, acc[r][1]);                  \
            }                                                                    \
        }                                                                        \
        UNROLL for (int r = 0; r < MR; r++) {                                    \
            _mm256_storeu_ps(Ot + (int64_t)r * W, acc[r][0]);                    \
            _mm256_storeu_ps(Ot + (int64_t)r * W + 8, acc[r][1]);                \
        }                                                                        \
    }

PV_BLOCK(4)
PV_BLOCK(1)

static void pv(const float *V, int64_t ldv, int n, int dv, const float *S, int W, const float *alpha,
               float *Ot) {
    for (int x = 0; x < W; x += 16) {
        int c = 0;
        for (; c + 4 <= dv; c += 4) pv_4(V + c, ldv, n, S + x, W, alpha + x, Ot + (int64_t)c * W + x);
        for (; c < dv; c++) pv_1(V + c, ldv, n, S + x, W, alpha + x, Ot + (int64_t)c * W + x);
    }
}

static void softcap(float *S, int64_t count, float cap) {
    const __m256 inv2 = _mm256_set1_ps(2.0f / cap), vc = _mm256_set1_ps(cap);
    const __m256 one = _mm256_set1_ps(1.0f), two = _mm256_set1_ps(2.0f);
    int64_t t = 0;
    for (; t + 8 <= count; t += 8) {
        __m256 e = exp256(_mm256_mul_ps(_mm256_loadu_ps(S + t), inv2));
        __m256 th = _mm256_sub_ps(one, _mm256_div_ps(two, _mm256_add_ps(e, one)));
        _mm256_storeu_ps(S + t, _mm256_mul_ps(vc, th));
    }
    for (; t < count; t++) {
        float e = dhsa__expf(S[t] * (2.0f / cap));
        S[t] = cap * (1.0f - 2.0f / (e + 1.0f));
    }
}

/* ------------------------------------------------------- narrow tiles --- */

/* Loads the first `left` (< 8) floats of p, zeros elsewhere. */
static inline __m256 load_tail(const float *p, int64_t left) {
    if (left >= 8) return _mm256_loadu_ps(p);
    __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(left > 0 ? left : 0)), idx);
    return _mm256_maskload_ps(p, m);
}

static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static void qk_rows(const float *K, int64_t ldk, int n, int d, const float *Qr, int64_t dq, int nq,
                    float *Sr) {
    for (int i = 0; i < nq; i++) {
        const float *q = Qr + (int64_t)i * dq;
        for (int j = 0; j < n; j++) {
            const float *k = K + j * ldk;
            __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
            int c = 0;
            for (; c + 16 <= d; c += 16) {
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(k + c), _mm256_loadu_ps(q + c), a0);
                a1 = _mm256_fmadd_ps(_mm256_loadu_ps(k + c + 8), _mm256_loadu_ps(q + c + 8), a1);
            }
            for (; c < d; c += 8) a0 = _mm256_fmadd_ps(load_tail(k + c, d - c), _mm256_loadu_ps(q + c), a0);
            Sr[i * DHSA_BC + j] = hsum256(_mm256_add_ps(a0, a1));
        }
    }
}

static void pv_rows(const float *V, int64_t ldv, int n, int dv, const float *Sr, int nq,
                    const float *alpha, float *Or) {
    for (int i = 0; i < nq; i++) {
        __m256 al = _mm256_set1_ps(alpha[i]);
        for (int c0 = 0; c0 < dv; c0 += 32) {
            float *o = Or + (int64_t)i * dv + c0;
            int64_t left = dv - c0;
            __m256 acc[4];
            UNROLL for (int x = 0; x < 4; x++) acc[x] = _mm256_mul_ps(load_tail(o + 8 * x, left - 8 * x), al);
            for (int j = 0; j < n; j++) {
                __m256 p = _mm256_set1_ps(Sr[i * DHSA_BC + j]);
                const float *v = V + j * ldv + c0;
                UNROLL for (int x = 0; x < 4; x++) acc[x] =
                    _mm256_fmadd_ps(p, load_tail(v + 8 * x, left - 8 * x), acc[x]);
            }
            float tmp[32];
            UNROLL for (int x = 0; x < 4; x++) _mm256_storeu_ps(tmp + 8 * x, acc[x]);
            memcpy(o, tmp, (size_t)(left < 32 ? left : 32) * sizeof(float));
        }
    }
}

static void softmax_rows(float *Sr, int n, int nq, float *m, float *l, float *alpha) {
    for (int i = 0; i < nq; i++) {
        float *s = Sr + i * DHSA_BC;
        float mx = m[i];
        for (int j = 0; j < n; j++) mx = s[j] > mx ? s[j] : mx;
        float base = mx == -INFINITY ? 0.0f : mx; /* all -inf: exp gives 0, not NaN */
        __m256 vb = _mm256_set1_ps(base), sum = _mm256_setzero_ps();
        int j = 0;
        for (; j + 8 <= n; j += 8) {
            __m256 p = exp256(_mm256_sub_ps(_mm256_loadu_ps(s + j), vb));
            _mm256_storeu_ps(s + j, p);
            sum = _mm256_add_ps(sum, p);
        }
        float tail = 0.0f;
        for (; j < n; j++) {
            s[j] = dhsa__expf(s[j] - base);
            tail += s[j];
        }
        alpha[i] = dhsa__expf(m[i] - base);
        l[i] = l[i] * alpha[i] + hsum256(sum) + tail;
        m[i] = mx;
    }
}

static void widen(const uint16_t *src, int is_bf16, int64_t n, float *dst) {
    int64_t c = 0;
    for (; c + 8 <= n; c += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(src + c));
        __m256 f = is_bf16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
                           : _mm256_cvtph_ps(h);
        _mm256_storeu_ps(dst + c, f);
    }
    for (; c < n; c++) dst[c] = is_bf16 ? dhsa_bf16_to_f32(src[c]) : dhsa_f16_to_f32(src[c]);
}

/* Q8_0 rows: per block of 34 bytes, 4 x 8 codes sign-extended, converted
 * (exact) and scaled by the block's F16 scale (exact product). */
static void widen_q8(const void *src, int64_t n, float *dst) {
    const unsigned char *blk = src;
    for (int64_t b = 0; b < n / 32; b++, blk += 34, dst += 32) {
        uint16_t h;
        memcpy(&h, blk, 2);
        __m256 d = _mm256_set1_ps(_cvtsh_ss(h));
        UNROLL for (int x = 0; x < 4; x++) {
            __m128i q8 = _mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * x));
            __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8));
            _mm256_storeu_ps(dst + 8 * x, _mm256_mul_ps(d, q));
        }
    }
}

/* as kern_scalar.c's glu, 8 values a step; the tail (n % 8) scalar */
static void glu(const float *g, const float *u, int64_t n, int gelu, float *out) {
    const __m256 one = _mm256_set1_ps(1.0f), k1 = _mm256_set1_ps(DHSA_GELU_K1), k3 = _mm256_set1_ps(DHSA_GELU_K3);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 z = _mm256_loadu_ps(g + i);
        __m256 a = gelu ? _mm256_mul_ps(k1, _mm256_fmadd_ps(_mm256_mul_ps(k3, z), _mm256_mul_ps(z, z), z))
                        : _mm256_sub_ps(_mm256_setzero_ps(), z);
        __m256 r = _mm256_div_ps(z, _mm256_add_ps(one, exp256(a)));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(r, _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++) {
        float z = g[i], a = gelu ? DHSA_GELU_K1 * (z + DHSA_GELU_K3 * z * z * z) : -z;
        out[i] = z / (1.0f + dhsa__expf(a)) * u[i];
    }
}

/* as kern_scalar.c's expw, 8 values a step; the tail (n % 8) scalar */
static void expw(const float *x, int64_t n, float sub, float mul, float *out) {
    const __m256 vs = _mm256_set1_ps(sub), vm = _mm256_set1_ps(mul);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, exp256(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vs), vm)));
    for (; i < n; i++) out[i] = dhsa__expf((x[i] - sub) * mul);
}

const dhsa_attn_kernels dhsa__kern_avx2 = {qk, softmax, pv, softcap, qk_rows, softmax_rows, pv_rows, widen,
                                          NULL, NULL, widen_q8, NULL, NULL, glu, expw};

#else
typedef int dhsa__kern_avx2_unused; /* ISO C forbids an empty file */
#endif
