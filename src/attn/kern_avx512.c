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
#define INLINE static inline __attribute__((always_inline))
#ifndef PF
#define PF 8
#endif

#include "core/exp_avx512.h"

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

/* MR rows of S (row stride W) for the 16 columns at Qt / S: the other
 * widths (32, 48: the ROWS chunk score's tiles), each strip of 16 columns
 * with the same sums in the same order as the blocks above */
#define QK_STRIP(MR)                                                             \
    static inline void qks_##MR(const float *K, int64_t ldk, int d,             \
                                const float *Qt, int W, float *S) {              \
        __m512 acc[MR];                                                          \
        UNROLL for (int r = 0; r < MR; r++) acc[r] = _mm512_setzero_ps();        \
        for (int c = 0; c < d; c++) {                                            \
            __m512 q = _mm512_loadu_ps(Qt + (int64_t)c * W);                     \
            UNROLL for (int r = 0; r < MR; r++) acc[r] =                         \
                _mm512_fmadd_ps(_mm512_set1_ps(K[r * ldk + c]), q, acc[r]);      \
        }                                                                        \
        UNROLL for (int r = 0; r < MR; r++) _mm512_storeu_ps(S + (int64_t)r * W, acc[r]); \
    }

QK_STRIP(4)
QK_STRIP(1)

/* W: a multiple of 16 (kern.h) */
static void qk(const float *K, int64_t ldk, int n, int d, const float *Qt, int W, float *S) {
    int j = 0;
    if (W == 64) {
        for (; j + 6 <= n; j += 6) qk_6_4(K + j * ldk, ldk, d, Qt, S + (int64_t)j * W);
        if (j + 4 <= n) qk_4_4(K + j * ldk, ldk, d, Qt, S + (int64_t)j * W), j += 4;
        if (j + 2 <= n) qk_2_4(K + j * ldk, ldk, d, Qt, S + (int64_t)j * W), j += 2;
        if (j < n) qk_1_4(K + j * ldk, ldk, d, Qt, S + (int64_t)j * W);
    } else if (W == 16) {
        for (; j + 12 <= n; j += 12) qk_12_1(K + j * ldk, ldk, d, Qt, S + (int64_t)j * W);
        for (; j + 4 <= n; j += 4) qk_4_1(K + j * ldk, ldk, d, Qt, S + (int64_t)j * W);
        for (; j < n; j++) qk_1_1(K + j * ldk, ldk, d, Qt, S + (int64_t)j * W);
    } else {
        for (int x = 0; x < W; x += 16) {
            for (j = 0; j + 4 <= n; j += 4) qks_4(K + j * ldk, ldk, d, Qt + x, W, S + (int64_t)j * W + x);
            for (; j < n; j++) qks_1(K + j * ldk, ldk, d, Qt + x, W, S + (int64_t)j * W + x);
        }
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

/* Rows of K and V are F32 (KIND 0), F16 (1), BF16 (2) or Q8_0 (3): 16
 * values widened in registers (exact), so the 16-bit cache is read at half
 * the bytes, and the Q8_0 one at 17/64, with the F32 kernels' arithmetic,
 * bitwise. Q8_0: c is a multiple of 16, so the 16 values are one half of
 * the block at c / 32; d * q is exact in F32. */
INLINE __m512 load16(const void *p, int64_t c, __mmask16 mk, const int KIND) {
    if (KIND == 0) return _mm512_maskz_loadu_ps(mk, (const float *)p + c);
    if (KIND == 3) {
        const unsigned char *blk = (const unsigned char *)p + c / 32 * 34;
        uint16_t h;
        memcpy(&h, blk, 2);
        __m128i q8 = _mm_maskz_loadu_epi8(mk, blk + 2 + c % 32);
        return _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(h)), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q8)));
    }
    __m256i h = _mm256_maskz_loadu_epi16(mk, (const uint16_t *)p + c);
    if (KIND == 1) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

INLINE const void *row_at(const void *base, int64_t r, int64_t ld, const int KIND) {
    if (KIND == 3) return (const unsigned char *)base + r * ld / 32 * 34;
    return KIND == 0 ? (const void *)((const float *)base + r * ld) : (const void *)((const uint16_t *)base + r * ld);
}

/* 16 keys at a time. Each K vector is loaded (and widened) once and
 * multiplied with every query: per (query, key) one accumulator over d,
 * kept in acc[][] (L1) between K rows, then one transpose-reduce per query
 * gives its 16 scores. The sum per (query, key) is the same FMA chain over
 * d as one register would hold, so the F32 results do not depend on nq. */
INLINE void qk_rows_t(const void *K, int64_t ldk, int n, int d, const float *Qr, int64_t dq, int nq, float *Sr,
                      const int KIND) {
    int j = 0;
    __m512 acc[DHSA_NARROW][16];
    for (; j + 16 <= n; j += 16) {
        /* K is read row by row (a sequential stream for the memory system;
         * column-wise reads across 16 rows halve the bandwidth), up to 128
         * values of a row in registers. */
        for (int c0 = 0; c0 < d; c0 += 128) {
            int left = d - c0;
            UNROLL for (int r = 0; r < 16; r++) {
                const void *kr = row_at(K, j + r, ldk, KIND);
                __m512 kv[8];
                UNROLL for (int x = 0; x < 8; x++) kv[x] =
                    16 * x < left ? load16(kr, c0 + 16 * x, tail_mask(left - 16 * x), KIND) : _mm512_setzero_ps();
                for (int i = 0; i < nq; i++) {
                    const float *q = Qr + (int64_t)i * dq + c0; /* zero padded to dq */
                    __m512 a = c0 == 0 ? _mm512_setzero_ps() : acc[i][r];
                    UNROLL for (int x = 0; x < 8; x++) if (16 * x < left) a =
                        _mm512_fmadd_ps(kv[x], _mm512_loadu_ps(q + 16 * x), a);
                    acc[i][r] = a;
                }
            }
        }
        for (int i = 0; i < nq; i++) _mm512_storeu_ps(Sr + i * DHSA_BC + j, reduce16(acc[i]));
    }
    for (; j < n; j++) {
        const void *k = row_at(K, j, ldk, KIND);
        for (int i = 0; i < nq; i++) {
            const float *q = Qr + (int64_t)i * dq;
            __m512 a = _mm512_setzero_ps();
            for (int c = 0; c < d; c += 16)
                a = _mm512_fmadd_ps(load16(k, c, tail_mask(d - c), KIND), _mm512_loadu_ps(q + c), a);
            Sr[i * DHSA_BC + j] = _mm512_reduce_add_ps(a);
        }
    }
}

/* qk_rows_t for d = 64 and NQ (1, 2 or 4) queries, the decode shape of a
 * 64-dim model with up to 4 query heads per KV head: the queries stay in
 * registers (NQ x 4 vectors) and no bound is tested per vector. The same
 * FMA chain per (query, key) as qk_rows_t: bitwise the same scores. */
INLINE void qk_rows_64(const void *K, int64_t ldk, int n, const float *Qr, int64_t dq, float *Sr, const int KIND,
                       const int NQ) {
    __m512 q[4][4], acc[4][16];
    UNROLL for (int t = 0; t < NQ; t++) UNROLL for (int x = 0; x < 4; x++) q[t][x] =
        _mm512_loadu_ps(Qr + (int64_t)t * dq + 16 * x);
    int j = 0;
    for (; j + 16 <= n; j += 16) {
        UNROLL for (int r = 0; r < 16; r++) {
            const void *kr = row_at(K, j + r, ldk, KIND);
            __m512 kv[4];
            UNROLL for (int x = 0; x < 4; x++) kv[x] = load16(kr, 16 * x, (__mmask16)0xffff, KIND);
            UNROLL for (int t = 0; t < NQ; t++) {
                __m512 a = _mm512_setzero_ps();
                UNROLL for (int x = 0; x < 4; x++) a = _mm512_fmadd_ps(kv[x], q[t][x], a);
                acc[t][r] = a;
            }
        }
        UNROLL for (int t = 0; t < NQ; t++) _mm512_storeu_ps(Sr + t * DHSA_BC + j, reduce16(acc[t]));
    }
    if (j < n) qk_rows_t(row_at(K, j, ldk, KIND), ldk, n - j, 64, Qr, dq, NQ, Sr + j, KIND);
}

INLINE void qk_rows_k(const void *K, int64_t ldk, int n, int d, const float *Qr, int64_t dq, int nq, float *Sr,
                      const int KIND) {
    if (d == 64 && nq == 4) qk_rows_64(K, ldk, n, Qr, dq, Sr, KIND, 4);
    else if (d == 64 && nq == 2) qk_rows_64(K, ldk, n, Qr, dq, Sr, KIND, 2);
    else if (d == 64 && nq == 1) qk_rows_64(K, ldk, n, Qr, dq, Sr, KIND, 1);
    else qk_rows_t(K, ldk, n, d, Qr, dq, nq, Sr, KIND);
}

static void qk_rows(const float *K, int64_t ldk, int n, int d, const float *Qr, int64_t dq, int nq, float *Sr) {
    qk_rows_k(K, ldk, n, d, Qr, dq, nq, Sr, 0);
}

static void qk_rows16(const uint16_t *K, int is_bf16, int64_t ldk, int n, int d, const float *Qr, int64_t dq, int nq,
                      float *Sr) {
    if (is_bf16) qk_rows_k(K, ldk, n, d, Qr, dq, nq, Sr, 2);
    else qk_rows_k(K, ldk, n, d, Qr, dq, nq, Sr, 1);
}

static void qk_rows_q8(const void *K, int64_t ldk, int n, int d, const float *Qr, int64_t dq, int nq, float *Sr) {
    qk_rows_k(K, ldk, n, d, Qr, dq, nq, Sr, 3);
}

/* Four queries at a time, 64 output columns at a time: 16 accumulators,
 * and each V vector loaded (and widened) once for the four. V is read row
 * by row, a sequential stream. Per output the sum over keys is the same
 * FMA chain whatever the grouping. */
INLINE void pv_rows_t(const void *V, int64_t ldv, int n, int dv, const float *Sr, int nq, const float *alpha,
                      float *Or, const int KIND) {
    for (int c0 = 0; c0 < dv; c0 += 64) {
        int left = dv - c0;
        __mmask16 mk[4];
        UNROLL for (int x = 0; x < 4; x++) mk[x] = 16 * x < left ? tail_mask(left - 16 * x) : 0;
        for (int i = 0; i < nq; i += 4) {
            int nt = nq - i < 4 ? nq - i : 4;
            float *o[4];
            const float *sr[4];
            __m512 a[4][4];
            UNROLL for (int t = 0; t < 4; t++) {
                int it = i + (t < nt ? t : nt - 1); /* past the last query: the last again, not stored */
                o[t] = Or + (int64_t)it * dv + c0;
                sr[t] = Sr + it * DHSA_BC;
                __m512 al = _mm512_set1_ps(alpha[it]);
                UNROLL for (int x = 0; x < 4; x++) a[t][x] = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk[x], o[t] + 16 * x), al);
            }
            for (int j = 0; j < n; j++) {
                const void *v = row_at(V, j, ldv, KIND);
                __m512 vv[4];
                UNROLL for (int x = 0; x < 4; x++) vv[x] = 16 * x < left ? load16(v, c0 + 16 * x, mk[x], KIND) : _mm512_setzero_ps();
                UNROLL for (int t = 0; t < 4; t++) {
                    __m512 p = _mm512_set1_ps(sr[t][j]);
                    UNROLL for (int x = 0; x < 4; x++) a[t][x] = _mm512_fmadd_ps(p, vv[x], a[t][x]);
                }
            }
            for (int t = nt - 1; t >= 0; t--)
                UNROLL for (int x = 0; x < 4; x++) if (16 * x < left) _mm512_mask_storeu_ps(o[t] + 16 * x, mk[x], a[t][x]);
        }
    }
}

/* dv = 64, the common head size, as a constant: the bounds fold away. */
INLINE void pv_rows_k(const void *V, int64_t ldv, int n, int dv, const float *Sr, int nq, const float *alpha,
                      float *Or, const int KIND) {
    if (dv == 64) pv_rows_t(V, ldv, n, 64, Sr, nq, alpha, Or, KIND);
    else pv_rows_t(V, ldv, n, dv, Sr, nq, alpha, Or, KIND);
}

static void pv_rows(const float *V, int64_t ldv, int n, int dv, const float *Sr, int nq, const float *alpha,
                    float *Or) {
    pv_rows_k(V, ldv, n, dv, Sr, nq, alpha, Or, 0);
}

static void pv_rows16(const uint16_t *V, int is_bf16, int64_t ldv, int n, int dv, const float *Sr, int nq,
                      const float *alpha, float *Or) {
    if (is_bf16) pv_rows_k(V, ldv, n, dv, Sr, nq, alpha, Or, 2);
    else pv_rows_k(V, ldv, n, dv, Sr, nq, alpha, Or, 1);
}

static void pv_rows_q8(const void *V, int64_t ldv, int n, int dv, const float *Sr, int nq, const float *alpha,
                       float *Or) {
    pv_rows_k(V, ldv, n, dv, Sr, nq, alpha, Or, 3);
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

/* Q8_0 rows: per block, two halves of 16 codes sign-extended, converted
 * (exact) and scaled by the block's F16 scale (exact product). */
static void widen_q8(const void *src, int64_t n, float *dst) {
    const unsigned char *blk = src;
    for (int64_t b = 0; b < n / 32; b++, blk += 34, dst += 32) {
        uint16_t h;
        memcpy(&h, blk, 2);
        __m512 d = _mm512_set1_ps(_cvtsh_ss(h));
        UNROLL for (int x = 0; x < 2; x++) {
            __m128i q8 = _mm_loadu_si128((const __m128i *)(blk + 2 + 16 * x));
            _mm512_storeu_ps(dst + 16 * x, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q8))));
        }
    }
}

/* as kern_scalar.c's glu, 16 values a step; the tail masked */
static void glu(const float *g, const float *u, int64_t n, int gelu, float *out) {
    const __m512 one = _mm512_set1_ps(1.0f), k1 = _mm512_set1_ps(DHSA_GELU_K1), k3 = _mm512_set1_ps(DHSA_GELU_K3);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 mk = tail_mask(n - i);
        __m512 z = _mm512_maskz_loadu_ps(mk, g + i);
        __m512 a = gelu ? _mm512_mul_ps(k1, _mm512_fmadd_ps(_mm512_mul_ps(k3, z), _mm512_mul_ps(z, z), z))
                        : _mm512_sub_ps(_mm512_setzero_ps(), z);
        __m512 r = _mm512_div_ps(z, _mm512_add_ps(one, exp512(a)));
        _mm512_mask_storeu_ps(out + i, mk, _mm512_mul_ps(r, _mm512_maskz_loadu_ps(mk, u + i)));
    }
}

/* as kern_scalar.c's expw, 16 values a step; the tail masked */
static void expw(const float *x, int64_t n, float sub, float mul, float *out) {
    const __m512 vs = _mm512_set1_ps(sub), vm = _mm512_set1_ps(mul);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 mk = tail_mask(n - i);
        __m512 a = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, x + i), vs), vm);
        _mm512_mask_storeu_ps(out + i, mk, exp512(a));
    }
}

const dhsa_attn_kernels dhsa__kern_avx512 = {qk, softmax, pv, softcap, qk_rows, softmax_rows, pv_rows, widen,
                                             qk_rows16, pv_rows16, widen_q8, qk_rows_q8, pv_rows_q8, glu, expw};

#else
typedef int dhsa__kern_avx512_unused; /* ISO C forbids an empty file */
#endif
