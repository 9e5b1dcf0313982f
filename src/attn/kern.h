/* kern.h: the per-ISA micro-kernels of the tiled attention and the scalar
 * exp they all approximate the same way.
 *
 * Layout (see attn_tiled.c): a tile holds W query columns (W = 16 or 64;
 * queries of one KV group, stacked). Buffers, all F32 and row-major:
 *   Qt [d][W]    scaled queries, transposed (column i = one query)
 *   K  [n][ldk]  key rows of the current block (n <= BC)
 *   V  [n][ldv]  value rows
 *   S  [n][W]    scores, then probabilities, of the block
 *   Ot [dv][W]   unnormalised output, transposed
 *   m, l, alpha [W]  running max, running sum, rescale of this block
 * Every kernel works column-wise, so lanes never interact: results per
 * query do not depend on the tile a query lands in.
 * Scalar versions are the reference for the SIMD ones (tests/test_attn.c
 * runs every ISA against the double-precision reference).
 */
#ifndef DHSA_KERN_H
#define DHSA_KERN_H

#include "core/exp.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#define DHSA_BC 64 /* keys per block */

typedef struct {
    /* S[j][i] = sum_k K[j][k] * Qt[k][i],  j < n, i < W (a multiple of 16) */
    void (*qk)(const float *K, int64_t ldk, int n, int d, const float *Qt, int W, float *S);
    /* Online-softmax step over S (n rows): per column i, m_new =
     * max(m[i], max_j S[j][i]); alpha[i] = exp(m[i] - m_new);
     * S[j][i] = exp(S[j][i] - m_new); l[i] = l[i]*alpha[i] + sum_j S[j][i];
     * m[i] = m_new. A column whose scores are all -inf keeps m = -inf and
     * gets zeros, never NaN. */
    void (*softmax)(float *S, int n, int W, float *m, float *l, float *alpha);
    /* Ot[c][i] = Ot[c][i] * alpha[i] + sum_j V[j][c] * S[j][i] */
    void (*pv)(const float *V, int64_t ldv, int n, int dv, const float *S, int W,
               const float *alpha, float *Ot);
    /* S = cap * tanh(S / cap) over n*W values */
    void (*softcap)(float *S, int64_t count, float cap);

    /* Narrow tiles (at most DHSA_NARROW queries: decode) keep queries,
     * scores and outputs as rows, so K and V rows stream through full-width
     * vector loads and the softmax works on keys, not on mostly idle lanes:
     *   Qr [nq][dq]  scaled queries, dq = d rounded up to 16, zero padded
     *   Sr [nq][BC]  scores of the block, one row per query
     *   Or [nq][dv]  unnormalised outputs
     * qk_rows:      Sr[i][j] = K[j] . Qr[i]
     * softmax_rows: as softmax, per row i over j < n
     * pv_rows:      Or[i][c] = Or[i][c] * alpha[i] + sum_j Sr[i][j] V[j][c] */
    void (*qk_rows)(const float *K, int64_t ldk, int n, int d, const float *Qr, int64_t dq, int nq,
                    float *Sr);
    void (*softmax_rows)(float *Sr, int n, int nq, float *m, float *l, float *alpha);
    void (*pv_rows)(const float *V, int64_t ldv, int n, int dv, const float *Sr, int nq,
                    const float *alpha, float *Or);

    /* dst[c] = (float)src[c] for c < n; src is F16 (is_bf16 = 0) or BF16
     * (is_bf16 = 1), contiguous. Exact: both widen without rounding. */
    void (*widen)(const uint16_t *src, int is_bf16, int64_t n, float *dst);

    /* qk_rows and pv_rows on F16 (is_bf16 = 0) or BF16 rows read in place
     * (ldk, ldv in elements), widened in registers: the same arithmetic as
     * widen followed by the F32 kernels, bitwise, at half the bytes. NULL
     * where an ISA has none (the rows are then widened into a buffer). */
    void (*qk_rows16)(const uint16_t *K, int is_bf16, int64_t ldk, int n, int d, const float *Qr, int64_t dq, int nq,
                      float *Sr);
    void (*pv_rows16)(const uint16_t *V, int is_bf16, int64_t ldv, int n, int dv, const float *Sr, int nq,
                      const float *alpha, float *Or);

    /* dst[c] = the value of element c of a Q8_0 row (n a multiple of 32,
     * src at a block boundary): d * q, exact in F32. */
    void (*widen_q8)(const void *src, int64_t n, float *dst);
    /* qk_rows and pv_rows on Q8_0 rows read in place (row j at element
     * offset j * ld, a multiple of 32; d, dv multiples of 32), dequantized
     * in registers: bitwise widen_q8 followed by the F32 kernels. NULL
     * where an ISA has none (rows then go through widen_q8 into a buffer). */
    void (*qk_rows_q8)(const void *K, int64_t ldk, int n, int d, const float *Qr, int64_t dq, int nq, float *Sr);
    void (*pv_rows_q8)(const void *V, int64_t ldv, int n, int dv, const float *Sr, int nq, const float *alpha,
                       float *Or);

    /* The gated FFN's activation (not attention, but the same exp), n
     * values: out[i] = act(g[i]) * u[i], act = SiLU z * sigmoid(z)
     * (gelu = 0) or GELU's tanh form (gelu = 1), computed as
     * z * sigmoid(2 c (z + 0.044715 z^3)), c = sqrt(2/pi): equal to
     * 0.5 z (1 + tanh(c (...))) and free of its cancellation for z < 0.
     * Both are z / (1 + exp(a)) with dhsa__expf's exp. out may be g or u.
     * Errors against double: tests/test_attn_kern.c ("glu"). */
    void (*glu)(const float *g, const float *u, int64_t n, int gelu, float *out);

    /* The sampler's weights (not attention, the same exp): out[i] =
     * exp((x[i] - sub) * mul) for n values, dhsa__expf's exp, so -inf
     * gives 0, as do arguments below DHSA_EXP_VLO in the vector kernels (at
     * or below -104 in the scalar one). x has no NaN (the sampler refused
     * it). Errors against double: tests/test_attn_kern.c ("expw"). */
    void (*expw)(const float *x, int64_t n, float sub, float mul, float *out);
} dhsa_attn_kernels;

#define DHSA_NARROW 8

extern const dhsa_attn_kernels dhsa__kern_scalar;
/* The kernels of the active ISA (dhsa_active_isa). */
const dhsa_attn_kernels *dhsa__attn_kernels(void);
#if defined(__x86_64__)
extern const dhsa_attn_kernels dhsa__kern_avx2;
extern const dhsa_attn_kernels dhsa__kern_avx512;
#endif

#define DHSA_GELU_K1 (-1.5957691216057308f) /* -2 sqrt(2/pi): the glu kernels' exp argument */
#define DHSA_GELU_K3 0.044715f

#endif
