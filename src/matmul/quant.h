/* quant.h: weight types of the model runner (ggml block formats) and the
 * matrix products over them (src/matmul/quant.c, f32_avx2.c,
 * f32_avx512.c). Private to the library.
 *
 * Types are ggml ids (dhsa_ggml_type): F32, F16, BF16, Q8_0, Q4_0, Q4_1,
 * Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, with ggml's
 * exact block layouts, so GGUF files from llama.cpp load as they are. Dequantization is exact (the float each weight stands for);
 * products dequantize into F32 and accumulate in F32 with FMA, so the only
 * difference from a double-precision reference is F32 summation.
 *
 * Every SIMD path is compared with the scalar one (tests/test_quant.c), and
 * results do not depend on the number of threads: each output element is
 * one fixed-order reduction, whatever thread computes it.
 * DHSA_FORCE_SCALAR=1 / dhsa_set_isa() choose the path, as for attention.
 */
#ifndef DHSA_MODEL_QUANT_H
#define DHSA_MODEL_QUANT_H

#include "dhsa.h"

#include <stddef.h>
#include <stdint.h>

/* Sizes of the product drivers' plans (quant.c, int8.c, bf16.c). */
static inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static inline int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

/* The supported types, in the order of max_tok_fused[] below. */
#define DHSA_QK_N_TYPES 15
#define DHSA_QK_TYPE_LIST "F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q5_K, IQ4_NL, IQ4_XS"

/* 1 when dhsa runs products over this ggml type (the fifteen above). */
int dhsa__wt_supported(uint32_t type);
/* Values per block (1 for F32/F16/BF16, 32 for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1
 * and IQ4_NL, 256 for the K types and IQ4_XS) and bytes per block. 0 for an
 * unsupported type. */
int64_t dhsa__wt_block(uint32_t type);
int64_t dhsa__wt_block_bytes(uint32_t type);
/* Bytes of a row of n values (n a multiple of the block); -1 otherwise. */
int64_t dhsa__wt_row_bytes(uint32_t type, int64_t n);

/* dst[0..n) = the values of a row of n weights (n a multiple of the block). */
dhsa_status dhsa__dequantize_row(uint32_t type, const void *src, float *dst, int64_t n);
/* The inverse, for conversion and test fixtures: the nearest encoding by
 * ggml's reference rules (round to nearest, scales from the block's
 * maximum). F32/F16/BF16 round to nearest even. */
dhsa_status dhsa__quantize_row(uint32_t type, const float *src, void *dst, int64_t n);
/* DHSA_ERR_NONFINITE (naming the first bad row) when a value or block scale
 * is NaN or Inf. Linear in the size; the loader runs it once per tensor. */
dhsa_status dhsa__wt_check_finite(uint32_t type, const void *data, int64_t n_rows, int64_t n_cols);

/* A weight matrix as a GGUF tensor stores it: n_out rows of n_in values,
 * row r at data + r * row_bytes (GGUF dims [n_in, n_out]). */
typedef struct {
    uint32_t type;
    const void *data;
    int64_t n_in, n_out;
    int64_t row_bytes;
} dhsa_wmat;

/* y[t][o] = sum_i W[o][i] * x[t][i]   for t < n_tok, o < W.n_out
 *   x: [n_tok][n_in] F32, row t at x + t * ldx
 *   y: [n_tok][n_out] F32, row t at y + t * ldy
 * Runs on the ctx's threads (split over output rows); workspace from the
 * ctx's scratch (dhsa__matmul_workspace bytes at most). n_tok = 1 (decode)
 * streams each weight once; larger n_tok dequantizes a panel of rows once
 * and reuses it for every token. x and y must not overlap. */
dhsa_status dhsa__matmul(dhsa_ctx *ctx, const dhsa_wmat *W, const float *x, int64_t ldx, int64_t n_tok, float *y,
                         int64_t ldy);
/* Exact upper bound of the scratch dhsa__matmul takes for these sizes with
 * n_threads threads. */
size_t dhsa__matmul_workspace(uint32_t type, int64_t n_in, int64_t n_out, int64_t n_tok, int n_threads);

/* The route of a product: EXACT is dhsa__matmul above; FAST is the
 * integer route of int8.h (8-bit activations, integer dot products) where
 * the weight type is quantized and the CPU has its kernels (AVX512-VNNI,
 * AVX-VNNI or AVX2), the BF16 route of bf16.h (vdpbf16ps) for F16 and
 * BF16 weights where the CPU has AVX512-BF16 and it pays, and the exact
 * route otherwise (dhsa__matmul_route_name says which ran, and why not). */
typedef enum { DHSA_MM_EXACT = 0, DHSA_MM_FAST = 1 } dhsa__mm_route;
dhsa_status dhsa__matmul_on(dhsa_ctx *ctx, dhsa__mm_route route, const dhsa_wmat *W, const float *x, int64_t ldx,
                            int64_t n_tok, float *y, int64_t ldy);
/* The products of one x [n_tok][ldx] with nw weights, y[i] [n_tok][W[i]->n_out]:
 * each y bitwise what dhsa__matmul_on gives; where the fast route's
 * integer kernels run them (decode) they are one parallel job
 * (dhsa__qi_matmul_multi), elsewhere one call each. */
dhsa_status dhsa__matmul_multi_on(dhsa_ctx *ctx, dhsa__mm_route route, const dhsa_wmat *const *W, int nw,
                                  const float *x, int64_t ldx, int64_t n_tok, float *const *y);
size_t dhsa__matmul_workspace_on(dhsa__mm_route route, uint32_t type, int64_t n_in, int64_t n_out, int64_t n_tok,
                                 int n_threads);
/* "int8 avx512-vnni" (also avx-vnni, avx2), "bf16 avx512-bf16" or
 * "f32 avx512" (the exact route and its ISA; F16/BF16 where the BF16
 * kernels could run but do not: "f32 avx512 (avx512-bf16 slower here)" or
 * "(DHSA_BF16=off)"): what dhsa__matmul_on runs for this route and type. */
const char *dhsa__matmul_route_name(dhsa__mm_route route, uint32_t type);
/* "bf16 amx" when the route's calls of this type with at least
 * DHSA__AMX_MIN_TOK (5) tokens take the AMX tiles instead (matmul/amx.h),
 * NULL otherwise. */
const char *dhsa__matmul_prefill_name(dhsa__mm_route route, uint32_t type);

/* dst[0..n_in) = row r of W, dequantized (embedding lookup). */
dhsa_status dhsa__wmat_row(const dhsa_wmat *W, int64_t r, float *dst);

/* ---- Per-ISA kernels (private to quant.c, f32_avx2.c, f32_avx512.c) ----
 *
 * Summation order, the same for every route of one ISA: the n_in columns are
 * cut into K blocks of DHSA_QK_KC; within a block, lane j of one vector
 * accumulator (16 lanes AVX-512, 8 AVX2 and scalar) sums w*x over columns
 * j, j + lanes, ... in increasing order with FMA (scalar: multiply, then
 * add); the lanes are then summed by a fixed tree, and y = s_0 + s_1 + ...
 * over the blocks in order. So the fused route (few tokens) and the panel
 * route (many) give bitwise the same y, and so does any thread count. */
#define DHSA_QK_KC 512

typedef struct {
    const char *name;
    /* Panel route micro-tile: mr tokens x nr rows. */
    int mr, nr;
    /* n_tok up to which the fused route runs (0: never), per type in the
     * order of DHSA_QK_TYPE_LIST: where it beats the panel route (docs/quant.md
     * says which were measured). */
    int max_tok_fused[DHSA_QK_N_TYPES];
    /* dst[0..kn) = columns [k0, k0 + kn) of a row. k0 and kn are multiples
     * of the block (k0 of 16 as well); writes exactly kn floats. */
    void (*dequant)(uint32_t type, const uint8_t *row, int64_t k0, int64_t kn, float *dst);
    /* Fused route: y[t][r] for rows r < nrows at w + r * row_bytes, tokens
     * t < n_tok (<= max_tok_fused); weights dequantized in registers. */
    void (*gemv)(uint32_t type, const uint8_t *w, int64_t row_bytes, int64_t nrows, int64_t n_in,
                 const float *x, int64_t ldx, int64_t n_tok, float *y, int64_t ldy);
    /* Panel route: out[t * nr + r] = lane-tree sum over k < kp (a multiple of
     * 16, zero padded) of W[r][k] * X[t][k], t < mr, r < nr. */
    void (*tile)(const float *W, int64_t ldw, const float *X, int64_t ldxp, int64_t kp, float *out);
} dhsa__quant_kernels;

extern const dhsa__quant_kernels dhsa__quant_scalar;
#if defined(__x86_64__)
extern const dhsa__quant_kernels dhsa__quant_avx2;
extern const dhsa__quant_kernels dhsa__quant_avx512;
#endif
/* The kernels of dhsa_active_isa(). */
const dhsa__quant_kernels *dhsa__quant_kernels_active(void);
/* 1 when dhsa__matmul takes the fused route for this type and n_tok with the
 * active ISA (for benchmarks and tests). */
int dhsa__matmul_fused(uint32_t type, int64_t n_tok);
/* 1 when the fast route runs its own kernels (integer or BF16) for a call
 * of this type and n_tok tokens, 0 when it takes the exact route there
 * (a type it does not cover, or decode of a type whose integer fused
 * route is slower: dhsa__qi_fused_exact). */
int dhsa__matmul_fast_covers(uint32_t type, int64_t n_tok);

#endif
