/* bf16_avx512bf16.c: the AVX512-BF16 kernels of the BF16 path (contract
 * and summation order in bf16.h). Compiled with the AVX-512 flags and
 * -mavx512bf16 by the Makefile where the compiler knows it; elsewhere this
 * file leaves the kernels' name NULL and F16/BF16 weights take the exact
 * path. Chosen at run time (dhsa__bf16_isa_ok: CPUID, the active ISA; and
 * whether they pay here, bf16.c).
 *
 * One vdpbf16ps multiplies 32 adjacent weights of a row, as pairs (k, k+1),
 * with 32 activations: a row's bytes are already in the order it wants, so
 * BF16 weights are used as stored, and F16 weights take two vcvtph2ps and
 * one vcvtne2ps2bf16 per 32 (once per load, shared by every token).
 *   rounding  activations: vcvtne2ps2bf16 on 32 values at a time (the
 *             padding past n_in from masked loads: zeros);
 *   fused     (decode) 4 rows x up to 4 tokens of accumulators, each row
 *             streamed once per 4 tokens and prefetched 2 row groups ahead
 *             into L2, as the exact path's fused kernels;
 *   panel     (prefill) a 6 token x 4 row tile over a panel of BF16 rows:
 *             per 32 columns 4 weight loads, 6 activation loads and 24
 *             vdpbf16ps (24 accumulators, 29 of the 32 zmm).
 * Both reduce each K block's lanes with tree512.h's tree, so they
 * agree bitwise. The probe (below) tells bf16.c whether they pay on this
 * core. Held to a double reference and to the scalar kernels by
 * tests/test_bf16.c.
 */
#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && \
    defined(__AVX512BF16__) && defined(__F16C__)
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <x86intrin.h> /* __rdtsc */

#include "matmul/bf16.h"
#include "matmul/tree512.h"

#define INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 16")
#define R 4         /* rows per fused tile */
#define TMAX 4      /* tokens per fused tile */
#define PF_GROUPS 2 /* fused prefetch distance, in row groups */
#define MR 6        /* panel tile: tokens */
#define NR 4        /* panel tile: rows */

INLINE __m512bh as_bh(__m512i v) { return (__m512bh)v; }
INLINE __mmask16 mask16(int64_t n) { return n >= 16 ? (__mmask16)0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1u); }
INLINE __mmask32 mask32(int64_t n) { return n >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << n) - 1u); }

/* 32 F32 values -> 32 BF16 (lo in the low half), to nearest even */
INLINE __m512i pack_bf16(__m512 lo, __m512 hi) { return (__m512i)_mm512_cvtne2ps_pbh(hi, lo); }

/* 32 weights of an F16 or BF16 row from column k; n < 32: the first n, zeros after */
INLINE __m512i load_w(uint32_t type, const uint8_t *row, int64_t k) {
    if (type == DHSA_GGML_BF16) return _mm512_loadu_si512((const void *)(row + 2 * k));
    return pack_bf16(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + 2 * k))),
                     _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + 2 * k + 32))));
}
INLINE __m512i load_w_n(uint32_t type, const uint8_t *row, int64_t k, int64_t n) {
    if (type == DHSA_GGML_BF16) return _mm512_maskz_loadu_epi16(mask32(n), row + 2 * k);
    return pack_bf16(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask16(n), row + 2 * k)),
                     _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask16(n - 16), row + 2 * k + 32)));
}

/* ----------------------------------------------------------- rounding --- */

static void round_act(const float *x, int64_t n, int64_t npad, uint16_t *xb) {
    int64_t k = 0;
    for (; k + 32 <= n; k += 32)
        _mm512_storeu_si512((void *)(xb + k), pack_bf16(_mm512_loadu_ps(x + k), _mm512_loadu_ps(x + k + 16)));
    for (; k < npad; k += 32)
        _mm512_storeu_si512((void *)(xb + k), pack_bf16(_mm512_maskz_loadu_ps(mask16(n - k), x + k),
                                                        _mm512_maskz_loadu_ps(mask16(n - k - 16), x + k + 16)));
}

static void to_bf16(uint32_t type, const uint8_t *row, int64_t k0, int64_t kn, uint16_t *dst) {
    int64_t k = 0;
    for (; k + 32 <= kn; k += 32) _mm512_storeu_si512((void *)(dst + k), load_w(type, row, k0 + k));
    if (k < kn) _mm512_storeu_si512((void *)(dst + k), load_w_n(type, row, k0 + k, kn - k));
}

/* ---------------------------------------------------------- fused tile --- */

/* R rows (w[r]; rows >= nr repeat the last one) x T tokens (xb rows at
 * ldxb), every K block; y[t * ldy + r] for r < nr. pf: bytes to the same
 * place PF_GROUPS row groups on. */
INLINE void fused_tile(const uint32_t type, const int T, const uint8_t *const *w, const uint16_t *xb, int64_t ldxb,
                       int64_t n_in, int64_t pf, float *y, int64_t ldy, int nr) {
    for (int64_t k0 = 0; k0 < n_in; k0 += DHSA_QK_KC) {
        const int64_t kn = n_in - k0 < DHSA_QK_KC ? n_in - k0 : DHSA_QK_KC;
        __m512 acc[R][TMAX];
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < TMAX; t++) acc[r][t] = _mm512_setzero_ps();
        int64_t k = k0;
        for (; k + 32 <= k0 + kn; k += 32) {
            __m512i xv[TMAX];
            UNROLL for (int t = 0; t < T; t++) xv[t] = _mm512_loadu_si512((const void *)(xb + t * ldxb + k));
            UNROLL for (int r = 0; r < R; r++) {
                __m512i wv = load_w(type, w[r], k);
                _mm_prefetch((const char *)(w[r] + pf + 2 * k), _MM_HINT_T1);
                UNROLL for (int t = 0; t < T; t++) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], as_bh(wv), as_bh(xv[t]));
            }
        }
        if (k < k0 + kn) { /* the tail: weights masked, activations zero padded */
            __m512i xv[TMAX];
            UNROLL for (int t = 0; t < T; t++) xv[t] = _mm512_loadu_si512((const void *)(xb + t * ldxb + k));
            UNROLL for (int r = 0; r < R; r++) {
                __m512i wv = load_w_n(type, w[r], k, k0 + kn - k);
                UNROLL for (int t = 0; t < T; t++) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], as_bh(wv), as_bh(xv[t]));
            }
        }
        UNROLL for (int t = 0; t < T; t++) {
            float s[4];
            _mm_storeu_ps(s, tree4(acc[0][t], acc[1][t], acc[2][t], acc[3][t]));
            float *yt = y + t * ldy;
            for (int r = 0; r < nr; r++) yt[r] = k0 == 0 ? s[r] : yt[r] + s[r];
        }
    }
}

typedef void (*fused_fn)(const uint8_t *const *w, const uint16_t *xb, int64_t ldxb, int64_t n_in, int64_t pf,
                         float *y, int64_t ldy, int nr);

#define FUSED(NAME, TYPE, T)                                                                                      \
    static void NAME(const uint8_t *const *w, const uint16_t *xb, int64_t ldxb, int64_t n_in, int64_t pf, float *y, \
                     int64_t ldy, int nr) {                                                                       \
        fused_tile(TYPE, T, w, xb, ldxb, n_in, pf, y, ldy, nr);                                                   \
    }
FUSED(f_bf16_1, DHSA_GGML_BF16, 1)
FUSED(f_bf16_2, DHSA_GGML_BF16, 2)
FUSED(f_bf16_3, DHSA_GGML_BF16, 3)
FUSED(f_bf16_4, DHSA_GGML_BF16, 4)
FUSED(f_f16_1, DHSA_GGML_F16, 1)
FUSED(f_f16_2, DHSA_GGML_F16, 2)
FUSED(f_f16_3, DHSA_GGML_F16, 3)
FUSED(f_f16_4, DHSA_GGML_F16, 4)
static const fused_fn f_bf16[TMAX + 1] = {NULL, f_bf16_1, f_bf16_2, f_bf16_3, f_bf16_4};
static const fused_fn f_f16[TMAX + 1] = {NULL, f_f16_1, f_f16_2, f_f16_3, f_f16_4};

static void gemv(uint32_t type, const uint8_t *w, int64_t row_bytes, int64_t nrows, int64_t n_in, const uint16_t *xb,
                 int64_t ldxb, int64_t n_tok, float *y, int64_t ldy) {
    const fused_fn *f = type == DHSA_GGML_F16 ? f_f16 : f_bf16;
    for (int64_t r0 = 0; r0 < nrows; r0 += R) {
        const int nr = nrows - r0 < R ? (int)(nrows - r0) : R;
        const uint8_t *rows[R];
        for (int r = 0; r < R; r++) rows[r] = w + (r0 + (r < nr ? r : nr - 1)) * row_bytes;
        for (int64_t t0 = 0; t0 < n_tok; t0 += TMAX) {
            const int T = n_tok - t0 < TMAX ? (int)(n_tok - t0) : TMAX;
            f[T](rows, xb + t0 * ldxb, ldxb, n_in, PF_GROUPS * R * row_bytes, y + t0 * ldy + r0, ldy, nr);
        }
    }
}

/* ---------------------------------------------------------- panel tile --- */

static void tile(const uint16_t *W, int64_t ldw, const uint16_t *const *X, int64_t kp, float *out) {
    __m512 acc[MR][NR];
    UNROLL for (int t = 0; t < MR; t++) UNROLL for (int r = 0; r < NR; r++) acc[t][r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < kp; k += 32) {
        __m512i wv[NR];
        UNROLL for (int r = 0; r < NR; r++) wv[r] = _mm512_loadu_si512((const void *)(W + r * ldw + k));
        UNROLL for (int t = 0; t < MR; t++) {
            __m512i xv = _mm512_loadu_si512((const void *)(X[t] + k));
            UNROLL for (int r = 0; r < NR; r++) acc[t][r] = _mm512_dpbf16_ps(acc[t][r], as_bh(wv[r]), as_bh(xv));
        }
    }
    UNROLL for (int t = 0; t < MR; t++) _mm_storeu_ps(out + t * NR, tree4(acc[t][0], acc[t][1], acc[t][2], acc[t][3]));
}

/* --------------------------------------------------------------- probe --- */

/* Whether the path pays here is a property of the core, not of ISA flags:
 * vdpbf16ps does 32 multiply-adds where vfmadd231ps does 16, but measured
 * on an Intel Xeon (Emerald Rapids) it issues once every 1.65 TSC ticks
 * against 0.41 for the FMA (half the F32 rate), where AMD documents Zen 4's
 * at the FMA's issue rate (twice the F32 rate). So: the time of each on 12
 * independent accumulators (their latency hidden), the least of 9
 * interleaved timings (an interruption only lengthens one), after a
 * warm-up that wakes the 512-bit units. About 0.2 ms, once per process. */
#define PROBE_ITERS 1024 /* about 2 us of FMA: the reads of the clock are noise */
#define PROBE_ACC 12

__attribute__((noinline)) static uint64_t time_fma(float seed) {
    __m512 a[PROBE_ACC], b = _mm512_set1_ps(0.5f), c = _mm512_set1_ps(seed);
    UNROLL for (int i = 0; i < PROBE_ACC; i++) a[i] = _mm512_set1_ps(seed * (float)i);
    const uint64_t t0 = __rdtsc();
    for (int it = 0; it < PROBE_ITERS; it++) UNROLL for (int i = 0; i < PROBE_ACC; i++) a[i] = _mm512_fmadd_ps(a[i], b, c);
    const uint64_t t = __rdtsc() - t0;
    __m512 s = a[0];
    UNROLL for (int i = 1; i < PROBE_ACC; i++) s = _mm512_add_ps(s, a[i]);
    volatile float sink = _mm512_reduce_add_ps(s);
    (void)sink;
    return t;
}

__attribute__((noinline)) static uint64_t time_dpbf16(float seed) {
    __m512 a[PROBE_ACC];
    const __m512i b = pack_bf16(_mm512_set1_ps(0.5f), _mm512_set1_ps(seed));
    UNROLL for (int i = 0; i < PROBE_ACC; i++) a[i] = _mm512_set1_ps(seed * (float)i);
    const uint64_t t0 = __rdtsc();
    for (int it = 0; it < PROBE_ITERS; it++)
        UNROLL for (int i = 0; i < PROBE_ACC; i++) a[i] = _mm512_dpbf16_ps(a[i], as_bh(b), as_bh(b));
    const uint64_t t = __rdtsc() - t0;
    __m512 s = a[0];
    UNROLL for (int i = 1; i < PROBE_ACC; i++) s = _mm512_add_ps(s, a[i]);
    volatile float sink = _mm512_reduce_add_ps(s);
    (void)sink;
    return t;
}

static double probe(void) {
    volatile float seed = 0.25f; /* not a constant the compiler could fold */
    uint64_t best_f = UINT64_MAX, best_d = UINT64_MAX;
    for (int r = 0; r < 16; r++) time_fma(seed); /* warm-up: the 512-bit units wake in some 10 us */
    for (int r = 0; r < 9; r++) {
        const uint64_t f = time_fma(seed), d = time_dpbf16(seed);
        best_f = f < best_f ? f : best_f;
        best_d = d < best_d ? d : best_d;
    }
    return best_f > 0 ? (double)best_d / (double)best_f : 0.0;
}

const dhsa__bf16_kernels dhsa__bf16_avx512bf16 = {"avx512-bf16", TMAX, MR, NR, round_act, gemv, to_bf16, tile, probe};

#else
#include "matmul/bf16.h"
#if defined(__x86_64__)
/* built without -mavx512bf16: no kernels (the name NULL says so) */
const dhsa__bf16_kernels dhsa__bf16_avx512bf16 = {NULL, 0, 0, 0, NULL, NULL, NULL, NULL, NULL};
#else
typedef int dhsa__bf16_avx512bf16_unused; /* ISO C forbids an empty file */
#endif
#endif
