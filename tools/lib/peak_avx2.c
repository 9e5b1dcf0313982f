/* peak_avx2.c: the AVX2 + FMA loops of the peak microbenchmarks (peak.h).
 * Compiled with -mavx2 -mfma by the Makefile; elsewhere the body is a stub
 * so that the symbols exist and the file is never empty.
 *
 * 12 ymm accumulators cover FMA latency x throughput (4-5 cycles x 2 pipes)
 * and leave 4 of the 16 registers for the constants, so nothing spills.
 * Run: DHSA_FORCE_SCALAR=0 build/dhsa peak on an AVX2-only machine.
 */
#include "lib/peak.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

static float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

float dhsa__peak_fma_loop_avx2(int64_t n_iter, float a, float b) {
    const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b);
    __m256 c00 = _mm256_set1_ps(1.00f), c01 = _mm256_set1_ps(1.01f), c02 = _mm256_set1_ps(1.02f);
    __m256 c03 = _mm256_set1_ps(1.03f), c04 = _mm256_set1_ps(1.04f), c05 = _mm256_set1_ps(1.05f);
    __m256 c06 = _mm256_set1_ps(1.06f), c07 = _mm256_set1_ps(1.07f), c08 = _mm256_set1_ps(1.08f);
    __m256 c09 = _mm256_set1_ps(1.09f), c10 = _mm256_set1_ps(1.10f), c11 = _mm256_set1_ps(1.11f);
    for (int64_t it = 0; it < n_iter; it++) {
#define STEP(c) c = _mm256_fmadd_ps(c, va, vb)
        STEP(c00); STEP(c01); STEP(c02); STEP(c03); STEP(c04); STEP(c05);
        STEP(c06); STEP(c07); STEP(c08); STEP(c09); STEP(c10); STEP(c11);
#undef STEP
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(c00, c01), _mm256_add_ps(c02, c03)),
                             _mm256_add_ps(_mm256_add_ps(c04, c05), _mm256_add_ps(c06, c07)));
    s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(c08, c09), _mm256_add_ps(c10, c11)));
    return hsum256(s);
}

float dhsa__peak_sum_avx2(const float *p, size_t n) {
    /* 8 accumulators, 64 floats (4 cache lines) per round. */
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0, s7 = s0;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        s0 = _mm256_add_ps(s0, _mm256_loadu_ps(p + i));
        s1 = _mm256_add_ps(s1, _mm256_loadu_ps(p + i + 8));
        s2 = _mm256_add_ps(s2, _mm256_loadu_ps(p + i + 16));
        s3 = _mm256_add_ps(s3, _mm256_loadu_ps(p + i + 24));
        s4 = _mm256_add_ps(s4, _mm256_loadu_ps(p + i + 32));
        s5 = _mm256_add_ps(s5, _mm256_loadu_ps(p + i + 40));
        s6 = _mm256_add_ps(s6, _mm256_loadu_ps(p + i + 48));
        s7 = _mm256_add_ps(s7, _mm256_loadu_ps(p + i + 56));
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)),
                             _mm256_add_ps(_mm256_add_ps(s4, s5), _mm256_add_ps(s6, s7)));
    float r = hsum256(s);
    for (; i < n; i++) r += p[i];
    return r;
}

#else /* not built for AVX2: never selected (dhsa_active_isa says so) */

float dhsa__peak_fma_loop_avx2(int64_t n_iter, float a, float b) {
    (void)n_iter; (void)a; (void)b;
    return 0.0f;
}

float dhsa__peak_sum_avx2(const float *p, size_t n) {
    (void)p; (void)n;
    return 0.0f;
}

#endif
