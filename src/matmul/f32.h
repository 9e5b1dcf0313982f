/* f32.h: the exact path of the weight products (src/matmul/f32.c,
 * f32_avx2.c, f32_avx512.c): weights dequantized into F32 and multiplied
 * in F32 with FMA, so the only difference from a double-precision
 * reference is F32 summation. The reference of every other path and the
 * `exact` option. Private to the library.
 *
 * Every SIMD kernel set is compared with the scalar one (tests/test_quant.c),
 * and results do not depend on the number of threads: each output element
 * is one fixed-order reduction, whatever thread computes it.
 * DHSA_FORCE_SCALAR=1 / dhsa_set_isa() choose the kernels, as for attention.
 *
 * Summation order, the same for both forms of one ISA: the n_in columns are
 * cut into K blocks of DHSA_QK_KC; within a block, lane j of one vector
 * accumulator (16 lanes AVX-512, 8 AVX2 and scalar) sums w*x over columns
 * j, j + lanes, ... in increasing order with FMA (scalar: multiply, then
 * add); the lanes are then summed by a fixed tree, and y = s_0 + s_1 + ...
 * over the blocks in order. So the fused form (few tokens) and the panel
 * form (many) give bitwise the same y, and so does any thread count.
 */
#ifndef DHSA_MATMUL_F32_H
#define DHSA_MATMUL_F32_H

#include "matmul/formats.h"

#define DHSA_QK_KC 512

typedef struct {
    const char *name;
    /* Panel form micro-tile: mr tokens x nr rows. */
    int mr, nr;
    /* n_tok up to which the fused form runs (0: never), per type in the
     * order of DHSA_QK_TYPE_LIST: where it beats the panel form (docs/quant.md
     * says which were measured). */
    int max_tok_fused[DHSA_QK_N_TYPES];
    /* dst[0..kn) = columns [k0, k0 + kn) of a row, bitwise
     * dhsa__wt_dequant_scalar. k0 and kn are multiples of the block (k0 of
     * 16 as well); writes exactly kn floats. */
    void (*dequant)(uint32_t type, const uint8_t *row, int64_t k0, int64_t kn, float *dst);
    /* Fused form: y[t][r] for rows r < nrows at w + r * row_bytes, tokens
     * t < n_tok (<= max_tok_fused); weights dequantized in registers. */
    void (*gemv)(uint32_t type, const uint8_t *w, int64_t row_bytes, int64_t nrows, int64_t n_in,
                 const float *x, int64_t ldx, int64_t n_tok, float *y, int64_t ldy);
    /* Panel form: out[t * nr + r] = lane-tree sum over k < kp (a multiple of
     * 16, zero padded) of W[r][k] * X[t][k], t < mr, r < nr. */
    void (*tile)(const float *W, int64_t ldw, const float *X, int64_t ldxp, int64_t kp, float *out);
} dhsa__f32_kernels;

extern const dhsa__f32_kernels dhsa__f32_scalar;
#if defined(__x86_64__)
extern const dhsa__f32_kernels dhsa__f32_avx2;
extern const dhsa__f32_kernels dhsa__f32_avx512;
#endif
/* The kernels of dhsa_active_isa(). */
const dhsa__f32_kernels *dhsa__f32_kernels_active(void);
/* "f32 avx512", "f32 avx2" or "f32 scalar": the active kernels' path name. */
const char *dhsa__f32_path_name(void);
/* 1 when the exact path takes the fused form for this type and n_tok with
 * the active ISA (for benchmarks and tests). */
int dhsa__matmul_fused(uint32_t type, int64_t n_tok);

/* dst[0..n) = the values of a row of n weights (n a multiple of the block),
 * with the active ISA's dequantizer (bitwise the scalar one). */
dhsa_status dhsa__dequantize_row(uint32_t type, const void *src, float *dst, int64_t n);
/* dst[0..n_in) = row r of W, dequantized (embedding lookup). */
dhsa_status dhsa__wmat_row(const dhsa_wmat *W, int64_t r, float *dst);

#endif
