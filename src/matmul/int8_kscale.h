/* int8_kscale.h: the eight 6-bit scales and mins of a Q4_K/Q5_K super-block
 * (int8.c's q4k_scale_min, four at a time in 32-bit words) as the fast
 * path's a and b, shared by the SIMD unpackers (int8_ymm.h's AVX2 /
 * AVX-VNNI kernels and int8_vnni.c's AVX512-VNNI ones). Needs AVX2; include
 * only from files compiled with it. Tested through tests/test_qint.c
 * (unpacking bitwise = the scalar unpacker). */
#ifndef DHSA_QINT_KSCALE_H
#define DHSA_QINT_KSCALE_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* s: the block's 12 scale bytes (block + 4); a[8] = d sc[j], b[8] = -(dmin m[j]) */
static inline void dhsa__qi_k_scales(const uint8_t *s, __m256 d, __m256 ndmin, float *a, float *b) {
    uint32_t u0, u1, u2;
    memcpy(&u0, s, 4);
    memcpy(&u1, s + 4, 4);
    memcpy(&u2, s + 8, 4);
    uint64_t sc = (uint64_t)(u0 & 0x3f3f3f3fu) | (uint64_t)((u2 & 0x0f0f0f0fu) | ((u0 >> 6) & 0x03030303u) << 4) << 32;
    uint64_t mn = (uint64_t)(u1 & 0x3f3f3f3fu) |
                  (uint64_t)(((u2 >> 4) & 0x0f0f0f0fu) | ((u1 >> 6) & 0x03030303u) << 4) << 32;
    __m256 scf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc)));
    __m256 mnf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)mn)));
    _mm256_storeu_ps(a, _mm256_mul_ps(d, scf));
    _mm256_storeu_ps(b, _mm256_mul_ps(ndmin, mnf)); /* -(dmin m), exactly */
}

#endif
