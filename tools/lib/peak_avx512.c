/* peak_avx512.c: the AVX-512 loops of the peak microbenchmarks (peak.h).
 * Compiled with -mavx512f ... -mfma by the Makefile; elsewhere the body is a
 * stub so that the symbols exist and the file is never empty.
 *
 * 24 zmm accumulators: enough independent chains to cover FMA latency x
 * throughput on every AVX-512 core we know (4 cycles x 2 pipes = 8 on
 * Intel, fewer on double-pumped Zen 4), with 8 of the 32 registers spare so
 * nothing spills. Run: build/dhsa peak.
 */
#include "lib/peak.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__FMA__)
#include <immintrin.h>

float dhsa__peak_fma_loop_avx512(int64_t n_iter, float a, float b) {
    const __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b);
    /* Each accumulator starts at a slightly different value so that no two
     * chains are provably equal. */
    __m512 c00 = _mm512_set1_ps(1.00f), c01 = _mm512_set1_ps(1.01f), c02 = _mm512_set1_ps(1.02f);
    __m512 c03 = _mm512_set1_ps(1.03f), c04 = _mm512_set1_ps(1.04f), c05 = _mm512_set1_ps(1.05f);
    __m512 c06 = _mm512_set1_ps(1.06f), c07 = _mm512_set1_ps(1.07f), c08 = _mm512_set1_ps(1.08f);
    __m512 c09 = _mm512_set1_ps(1.09f), c10 = _mm512_set1_ps(1.10f), c11 = _mm512_set1_ps(1.11f);
    __m512 c12 = _mm512_set1_ps(1.12f), c13 = _mm512_set1_ps(1.13f), c14 = _mm512_set1_ps(1.14f);
    __m512 c15 = _mm512_set1_ps(1.15f), c16 = _mm512_set1_ps(1.16f), c17 = _mm512_set1_ps(1.17f);
    __m512 c18 = _mm512_set1_ps(1.18f), c19 = _mm512_set1_ps(1.19f), c20 = _mm512_set1_ps(1.20f);
    __m512 c21 = _mm512_set1_ps(1.21f), c22 = _mm512_set1_ps(1.22f), c23 = _mm512_set1_ps(1.23f);
    for (int64_t it = 0; it < n_iter; it++) {
#define STEP(c) c = _mm512_fmadd_ps(c, va, vb)
        STEP(c00); STEP(c01); STEP(c02); STEP(c03); STEP(c04); STEP(c05);
        STEP(c06); STEP(c07); STEP(c08); STEP(c09); STEP(c10); STEP(c11);
        STEP(c12); STEP(c13); STEP(c14); STEP(c15); STEP(c16); STEP(c17);
        STEP(c18); STEP(c19); STEP(c20); STEP(c21); STEP(c22); STEP(c23);
#undef STEP
    }
    /* Pairwise sums: every chain reaches the result. */
    c00 = _mm512_add_ps(c00, c01); c02 = _mm512_add_ps(c02, c03); c04 = _mm512_add_ps(c04, c05);
    c06 = _mm512_add_ps(c06, c07); c08 = _mm512_add_ps(c08, c09); c10 = _mm512_add_ps(c10, c11);
    c12 = _mm512_add_ps(c12, c13); c14 = _mm512_add_ps(c14, c15); c16 = _mm512_add_ps(c16, c17);
    c18 = _mm512_add_ps(c18, c19); c20 = _mm512_add_ps(c20, c21); c22 = _mm512_add_ps(c22, c23);
    c00 = _mm512_add_ps(c00, c02); c04 = _mm512_add_ps(c04, c06); c08 = _mm512_add_ps(c08, c10);
    c12 = _mm512_add_ps(c12, c14); c16 = _mm512_add_ps(c16, c18); c20 = _mm512_add_ps(c20, c22);
    c00 = _mm512_add_ps(c00, c04); c08 = _mm512_add_ps(c08, c12); c16 = _mm512_add_ps(c16, c20);
    __m512 s = _mm512_add_ps(_mm512_add_ps(c00, c08), c16);
    return _mm512_reduce_add_ps(s);
}

float dhsa__peak_sum_avx512(const float *p, size_t n) {
    /* 8 accumulators: 128 floats (two cache lines x 4) per round, enough to
     * hide add latency so that only memory limits the loop. */
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0, s7 = s0;
    size_t i = 0;
    for (; i + 128 <= n; i += 128) {
        s0 = _mm512_add_ps(s0, _mm512_loadu_ps(p + i));
        s1 = _mm512_add_ps(s1, _mm512_loadu_ps(p + i + 16));
        s2 = _mm512_add_ps(s2, _mm512_loadu_ps(p + i + 32));
        s3 = _mm512_add_ps(s3, _mm512_loadu_ps(p + i + 48));
        s4 = _mm512_add_ps(s4, _mm512_loadu_ps(p + i + 64));
        s5 = _mm512_add_ps(s5, _mm512_loadu_ps(p + i + 80));
        s6 = _mm512_add_ps(s6, _mm512_loadu_ps(p + i + 96));
        s7 = _mm512_add_ps(s7, _mm512_loadu_ps(p + i + 112));
    }
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)),
                             _mm512_add_ps(_mm512_add_ps(s4, s5), _mm512_add_ps(s6, s7)));
    float r = _mm512_reduce_add_ps(s);
    for (; i < n; i++) r += p[i];
    return r;
}

#else /* not built for AVX-512: never selected (dhsa_active_isa says so) */

float dhsa__peak_fma_loop_avx512(int64_t n_iter, float a, float b) {
    (void)n_iter; (void)a; (void)b;
    return 0.0f;
}

float dhsa__peak_sum_avx512(const float *p, size_t n) {
    (void)p; (void)n;
    return 0.0f;
}

#endif
