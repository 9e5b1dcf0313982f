/* matmul.h: the weight products as the model runner calls them
 * (src/matmul/matmul.c): the one plan (which path, which kernels, what
 * workspace) and the calls that run it. Private to the library.
 *
 * A call asks for a path:
 *   DHSA_MM_EXACT  the exact path (f32.h): weights dequantized to F32, F32
 *                  products with FMA; the reference, the `exact` option;
 *   DHSA_MM_FAST   the fastest path this CPU has for the weight type:
 *                  int8 (int8.h: 8-bit activations, integer dot products;
 *                  quantized weights, AVX512-VNNI, AVX-VNNI or AVX2), BF16
 *                  (bf16.h: vdpbf16ps; F16/BF16 weights where the CPU has
 *                  AVX512-BF16 and it pays), AMX (amx.h: calls of at least
 *                  DHSA__AMX_MIN_TOK tokens where the CPU has the tiles),
 *                  the exact path otherwise (dhsa__matmul_path_name says
 *                  which runs, and why not).
 * The rules that pick a path are all in dhsa__matmul_plan.
 *
 * y[t][o] = sum_i W[o][i] * x[t][i]   for t < n_tok, o < W.n_out
 *   x: [n_tok][n_in] F32, row t at x + t * ldx
 *   y: [n_tok][n_out] F32, row t at y + t * ldy
 * Runs on the ctx's threads (split over output rows); workspace from the
 * ctx's scratch (dhsa__matmul_workspace_on bytes at most). x and y must not
 * overlap. Results do not depend on the number of threads.
 */
#ifndef DHSA_MATMUL_MATMUL_H
#define DHSA_MATMUL_MATMUL_H

#include "matmul/f32.h"
#include "matmul/formats.h"
#include "matmul/path.h"

typedef enum { DHSA_MM_EXACT = 0, DHSA_MM_FAST = 1 } dhsa__mm_path;

/* The plan of a call: the path's kernel set, the name of what runs (e.g.
 * "int8 avx2", "f32 avx512", "bf16 amx") and the workspace, for this
 * shape and thread count. A shape dhsa__matmul refuses gives path NULL
 * and ws 0. */
dhsa__mm_plan dhsa__matmul_plan(dhsa__mm_path path, uint32_t type, int64_t n_in, int64_t n_out, int64_t n_tok,
                                int n_threads);

/* The product on the path asked for (the contract above). */
dhsa_status dhsa__matmul_on(dhsa_ctx *ctx, dhsa__mm_path path, const dhsa_wmat *W, const float *x, int64_t ldx,
                            int64_t n_tok, float *y, int64_t ldy);
/* The products of one x [n_tok][ldx] with nw weights, y[i] [n_tok][W[i]->n_out]:
 * each y bitwise what dhsa__matmul_on gives; where the path lets products
 * share a job (int8, decode) they are one parallel job (dhsa__mm_run_multi),
 * elsewhere one call each. */
dhsa_status dhsa__matmul_multi_on(dhsa_ctx *ctx, dhsa__mm_path path, const dhsa_wmat *const *W, int nw,
                                  const float *x, int64_t ldx, int64_t n_tok, float *const *y);
/* Exact upper bound of the scratch dhsa__matmul_on takes for these sizes
 * with n_threads threads (the plan's ws). */
size_t dhsa__matmul_workspace_on(dhsa__mm_path path, uint32_t type, int64_t n_in, int64_t n_out, int64_t n_tok,
                                 int n_threads);
/* The exact path: dhsa__matmul_on(DHSA_MM_EXACT) and its workspace. */
dhsa_status dhsa__matmul(dhsa_ctx *ctx, const dhsa_wmat *W, const float *x, int64_t ldx, int64_t n_tok, float *y,
                         int64_t ldy);
size_t dhsa__matmul_workspace(uint32_t type, int64_t n_in, int64_t n_out, int64_t n_tok, int n_threads);

/* "int8 avx512-vnni" (also avx-vnni, avx2), "bf16 avx512-bf16" or
 * "f32 avx512" (the exact path and its ISA; F16/BF16 where the BF16
 * kernels could run but do not: "f32 avx512 (avx512-bf16 slower here)" or
 * "(DHSA_BF16=off)"; quantized types whose decode takes the exact path:
 * "int8 avx512-vnni, decode f32 avx512 (faster here)"): what
 * dhsa__matmul_on runs for this path and type. */
const char *dhsa__matmul_path_name(dhsa__mm_path path, uint32_t type);
/* "bf16 amx" when the path's calls of this type with at least
 * DHSA__AMX_MIN_TOK (5) tokens take the AMX tiles instead (amx.h), NULL
 * otherwise. */
const char *dhsa__matmul_prefill_name(dhsa__mm_path path, uint32_t type);
/* 1 when the fast path runs kernels of its own (int8, BF16 or AMX) for a
 * call of this type and n_tok tokens, 0 when it takes the exact path there
 * (a type it does not cover, or decode of a type whose integer fused form
 * is slower: dhsa__qi_fused_exact). */
int dhsa__matmul_fast_covers(uint32_t type, int64_t n_tok);

#endif
