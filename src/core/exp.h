/* exp.h: exp(x) as every kernel computes it, the scalar reference of the
 * vector forms in exp_avx2.h and exp_avx512.h: the attention kernels
 * (src/attn: softmax, GELU), the boundary predictor (src/route) and the
 * sampler all use it, so an exp gives the same bits wherever it runs.
 */
#ifndef DHSA_CORE_EXP_H
#define DHSA_CORE_EXP_H

#include <stdint.h>
#include <string.h>

/* exp(x) as every kernel computes it: range reduction x = n ln2 + r,
 * |r| <= ln2/2, degree-7 Taylor polynomial (relative error < 1e-8 before
 * rounding), times 2^n. exp(-inf) = 0 exactly; inputs below -104 give 0. */
#define DHSA_EXP_LO (-104.0f)
/* The vector kernels give 0 below -87.3 instead of a subnormal (no effect
 * on a softmax whose largest term is 1): a subnormal or underflowing result
 * costs a microcode assist per vector on x86 (measured: two thirds of the
 * oracle's time at 8K went to them before). */
#define DHSA_EXP_VLO (-87.3f)
#define DHSA_EXP_HI (88.0f)
#define DHSA_LN2_HI 0.693145751953125f
#define DHSA_LN2_LO 1.428606765330187e-06f
#define DHSA_LOG2E 1.44269504088896341f
#define DHSA_EXP_C2 (1.0f / 2)
#define DHSA_EXP_C3 (1.0f / 6)
#define DHSA_EXP_C4 (1.0f / 24)
#define DHSA_EXP_C5 (1.0f / 120)
#define DHSA_EXP_C6 (1.0f / 720)
#define DHSA_EXP_C7 (1.0f / 5040)

static inline float dhsa__pow2i(int n) { /* 2^n for n in [-126, 127] */
    uint32_t u = (uint32_t)(n + 127) << 23;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float dhsa__expf(float x) {
    if (!(x > DHSA_EXP_LO)) return x != x ? x : 0.0f; /* NaN stays NaN */
    if (x > DHSA_EXP_HI) x = DHSA_EXP_HI;
    float t = x * DHSA_LOG2E;
    int n = (int)(t + (t >= 0 ? 0.5f : -0.5f));
    float r = x - (float)n * DHSA_LN2_HI;
    r = r - (float)n * DHSA_LN2_LO;
    float p = DHSA_EXP_C7;
    p = p * r + DHSA_EXP_C6;
    p = p * r + DHSA_EXP_C5;
    p = p * r + DHSA_EXP_C4;
    p = p * r + DHSA_EXP_C3;
    p = p * r + DHSA_EXP_C2;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    if (n < -126) return p * dhsa__pow2i(n + 64) * dhsa__pow2i(-64);
    return p * dhsa__pow2i(n);
}

#endif
