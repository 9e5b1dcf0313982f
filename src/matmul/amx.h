/* amx.h: the AMX path of the weight products (src/matmul/amx.c,
 * amx_amx.c): prefill (n_tok >= DHSA__AMX_MIN_TOK) of quantized, F16 and
 * BF16 weights on the AMX tiles with BF16 products (TDPBF16PS), where the
 * CPU, the OS and the build have them. Private to the library; part of the
 * fast path (decode stays on the integer or BF16 kernels), the exact F32
 * path staying the reference and the `exact` option. Why BF16 and not the
 * tiles' int8 products, and the numbers: docs/quant.md ("The AMX path").
 *
 * Activations: every value rounded to BF16 once per product, by the BF16
 * path's rule (bf16.h: to nearest even, denormals to zero, NaN stays
 * NaN, Inf stays Inf).
 * Weights: a panel of rows at a time, each row's values as the exact path
 * reads them (dhsa__dequantize_row, bitwise), rounded to BF16 by the same
 * rule (F16/BF16 rows as the BF16 path converts them), laid out for the
 * tiles (pairs of adjacent columns of 16 rows side by side); every weight
 * is read and converted once per call, whatever the token count.
 * Products: one TDPBF16PS per 32 columns, 16 tokens and 16 rows: products
 * of BF16 values, F32 sums inside the tile (the hardware's order, the same
 * for every call, so results do not depend on the thread count).
 *
 * Error against the double product of the original F32 values: each
 * activation and each weight changes by at most 2^-9 of itself (2^-8
 * together), plus the F32 summation: |y - ref| <= (2^-8 + 2^-16 + n_in
 * 2^-23) sum |w x| (tests/test_amx.c). Quantized weights are otherwise
 * exact on the integer path; here they lose up to 2^-9 each, while the
 * activations keep more than on the integer path (2^-9 of each value
 * against 1/254 of the block's largest): the per-type errors of the model
 * are in docs/quant.md.
 */
#ifndef DHSA_MODEL_QAMX_H
#define DHSA_MODEL_QAMX_H

#include <stddef.h>
#include <stdint.h>

#include "matmul/formats.h"

/* Calls of at least this many tokens take the AMX path: every call
 * above the few-token (decode) kernels' 4, so that a prompt gives the same
 * rows whether it is evaluated in one piece or in pieces (Q4_K 2048 x
 * 8192, 2 threads: 0.93x the integer panel at 5 tokens, 1.0x at 8, 1.16x
 * at 16, 2.4x at 512; docs/quant.md). */
#define DHSA__AMX_MIN_TOK 5

/* ---- Kernels (private to amx.c and amx_amx.c) ---- */
typedef struct {
    const char *name;
    /* dst [kp/2][16][2] (the tiles' B layout: per pair of columns, the
     * pair of each of 16 rows side by side) from 16 BF16 rows of kp values
     * (a multiple of 32) at rows + r * ldr */
    void (*pack16)(const uint16_t *rows, int64_t ldr, int64_t kp, uint16_t *dst);
    /* out[t * ldo + r] = the product of activation row t (BF16, kp values
     * at xb + t * ldxb) with weight row r of a panel of 32 rows (two packs
     * of 16 at pw and pw + 16 kp), t < nt (16 or 32), r < 32 */
    void (*tile)(const uint16_t *pw, int64_t kp, const uint16_t *xb, int64_t ldxb, int nt, float *out, int64_t ldo);
} dhsa__amx_kernels;

#if defined(__x86_64__)
/* name NULL where the compiler could not build them */
extern const dhsa__amx_kernels dhsa__amx_tiles;
#endif

/* The kernels where dhsa__amx_active() (core/internal.h) and the build
 * allow, NULL otherwise. */
const dhsa__amx_kernels *dhsa__amx_kernels_active(void);
/* 1 for the weight types the path covers: every quantized type, F16 and
 * BF16 (F32 weights keep the exact path). */
int dhsa__amx_type(uint32_t type);
/* 1 when a fast-path call of this type and token count takes the path. */
int dhsa__amx_takes(uint32_t type, int64_t n_tok);

/* The path (the dhsa__matmul contract, matmul.h; arguments checked by the
 * caller). Workspace from the ctx's scratch: dhsa__amx_workspace bytes. */
dhsa_status dhsa__amx_matmul(dhsa_ctx *ctx, const dhsa__amx_kernels *k, const dhsa_wmat *W, const float *x,
                             int64_t ldx, int64_t n_tok, float *y, int64_t ldy);
size_t dhsa__amx_workspace(uint32_t type, int64_t n_in, int64_t n_out, int64_t n_tok, int n_threads);

#endif
