/* bf16.h: the BF16 path of the weight products (src/matmul/bf16.c,
 * bf16_avx512bf16.c): F16 and BF16 weights multiplied with vdpbf16ps
 * (AVX512-BF16), activations rounded to BF16. Private to the library; the
 * fast path of F16/BF16 weights where the CPU has the instruction, the
 * exact F32 path (f32.h) staying the reference and the `exact` option.
 * Numbers and the choice for F16 in docs/quant.md ("The BF16 path").
 *
 * Activations: every value of a row is rounded to BF16 once per product
 * (dhsa__bf16_round: to nearest even; NaN stays NaN, quieted, Inf stays
 * Inf; a denormal F32 becomes a zero of its sign, as vcvtne2ps2bf16 does),
 * into the ctx's scratch.
 *
 * Weights: BF16 as stored. F16 rounded to BF16 by the same rule as they are
 * read (vcvtph2ps, then vcvtne2ps2bf16, once per load of a row segment,
 * shared by every token of the call): F16 has 11 significant bits, BF16 8,
 * so this path changes each F16 weight by up to 2^-8 of itself; F16 values
 * are all in BF16's range, so nothing overflows or flushes.
 *
 * Summation order (the same on both paths below, so they agree bitwise,
 * whatever the thread count): the columns are cut into K blocks of
 * DHSA_QK_KC (512); in a block, lane j (of 16) starts at 0 and, for
 * m = 0, 1, ..., with k = k0 + 32 m + 2 j, does
 *     acc = acc + w[k+1] x[k+1];  acc = acc + w[k] x[k]
 * (one vdpbf16ps per 32 columns: each product of two BF16 values is exact
 * in F32, each sum rounded to nearest even; the instruction treats
 * denormal inputs and results as zero). Columns past n_in are zeros. The
 * 16 lanes are summed by f32.h's tree (halves, then quarters, ...), and
 * y = s_0 + s_1 + ... over the blocks in order.
 *
 * Error against the double product of the path's own BF16 inputs: F32
 * summation, at most gamma_D sum |w x| with D = 2 * 512/32 + 4 + blocks
 * (tests/test_bf16.c). Against the double product of the original F32
 * activations and weights: the rounding of each activation (BF16 keeps 8
 * significant bits: at most 2^-8 of the value) and, for F16 weights, of
 * each weight (2^-8): |y - ref| <= (2^-7 + 2^-16) sum |w x| for F16 and
 * 2^-8 sum |w x| for BF16, plus the summation term.
 *
 * When it runs (dhsa__bf16_kernels_active): where the CPU has AVX512-BF16,
 * the ISA is AVX-512, and the path pays. One vdpbf16ps does 32
 * multiply-adds, an F32 FMA 16, so the path is the faster one when the
 * first costs at most twice the second; that is measured once per process
 * (dhsa__bf16_probe, about 0.2 ms). Measured on an Intel Xeon (Emerald
 * Rapids) it costs 4 FMA (half the F32 rate, not twice): there the fast
 * path of F16/BF16 stays the exact one and its name says why. The
 * environment's DHSA_BF16 (read once) overrides the choice: on (wherever
 * the CPU and the ISA allow), off, auto (the default).
 */
#ifndef DHSA_MODEL_QBF16_H
#define DHSA_MODEL_QBF16_H

#include <stddef.h>
#include <stdint.h>

#include "matmul/f32.h"

/* 1 for the weight types the path covers: F16 and BF16. */
int dhsa__bf16_type(uint32_t type);

/* x rounded to BF16 by the path's rule (above). */
uint16_t dhsa__bf16_round(float x);

/* Whether the fast path takes the kernels (see above); tests set it. */
typedef enum { DHSA__BF16_OFF = 0, DHSA__BF16_ON = 1, DHSA__BF16_AUTO = 2 } dhsa__bf16_mode;
/* Sets the mode, returns the one before (the first call reads DHSA_BF16). */
dhsa__bf16_mode dhsa__set_bf16_mode(dhsa__bf16_mode m);
/* The time of one vdpbf16ps over that of one vfmadd231ps (zmm, 12
 * independent accumulators, the least of 9 interleaved timings of each),
 * measured on the first call; 0 where the kernels cannot run. */
double dhsa__bf16_probe(void);
/* Why the fast path does not take the kernels though the CPU and the ISA
 * have them: "avx512-bf16 slower here" or "DHSA_BF16=off"; NULL when it
 * takes them, or when they cannot run here. */
const char *dhsa__bf16_off_reason(void);

/* ---- Kernels (private to bf16.c and bf16_*.c) ---- */
typedef struct {
    const char *name;
    int max_tok_fused; /* n_tok up to which the fused path runs */
    int mr, nr;        /* panel tile: tokens x rows */
    /* xb[0..npad) = x[0..n) rounded (dhsa__bf16_round), then zeros up to
     * npad (a multiple of 32, >= n) */
    void (*round_act)(const float *x, int64_t n, int64_t npad, uint16_t *xb);
    /* Fused path: y[t * ldy + r] for rows r < nrows at w + r * row_bytes
     * (F16 or BF16), tokens t < n_tok (<= max_tok_fused), activation rows
     * xb + t * ldxb (zero padded to a multiple of 32); every K block. */
    void (*gemv)(uint32_t type, const uint8_t *w, int64_t row_bytes, int64_t nrows, int64_t n_in, const uint16_t *xb,
                 int64_t ldxb, int64_t n_tok, float *y, int64_t ldy);
    /* dst[0..kp) = columns [k0, k0 + kn) of an F16 or BF16 row as BF16,
     * zeros from kn up to kp (kp = kn rounded up to 32) */
    void (*to_bf16)(uint32_t type, const uint8_t *row, int64_t k0, int64_t kn, uint16_t *dst);
    /* Panel path, one K block: out[t * nr + r] = the lane-tree sum over
     * kp columns (a multiple of 32) of W[r] . X[t], t < mr (mr <= 16),
     * r < nr (mr * nr <= 64); W rows at W + r * ldw, token rows X[t] (BF16). */
    void (*tile)(const uint16_t *W, int64_t ldw, const uint16_t *const *X, int64_t kp, float *out);
    /* dhsa__bf16_probe's measurement (NULL: none) */
    double (*probe)(void);
} dhsa__bf16_kernels;

/* The scalar kernels: the order above written out in C (float sums, no
 * flushing of denormals), the reference of the SIMD ones for tests and
 * `dhsa bench matmul`. */
extern const dhsa__bf16_kernels dhsa__bf16_scalar;
#if defined(__x86_64__)
/* name NULL where the compiler could not build it */
extern const dhsa__bf16_kernels dhsa__bf16_avx512bf16;
#endif
/* The AVX512-BF16 kernels when the build has them, dhsa__bf16_isa_ok()
 * (core/internal.h: the CPU has them, the active ISA is AVX-512) and the
 * mode says so (above); NULL otherwise: F16 and BF16 weights then take the
 * exact path on the fast path too, and dhsa__matmul_path_name says so. */
const dhsa__bf16_kernels *dhsa__bf16_kernels_active(void);
/* "bf16 " and the kernels' name (static storage). */
const char *dhsa__bf16_path_name(const dhsa__bf16_kernels *k);

/* The BF16 path of dhsa__matmul (same contract, matmul.h; the arguments
 * checked by the caller), with the given kernels. Workspace from the ctx's
 * scratch: dhsa__bf16_workspace bytes. */
dhsa_status dhsa__bf16_matmul(dhsa_ctx *ctx, const dhsa__bf16_kernels *k, const dhsa_wmat *W, const float *x,
                              int64_t ldx, int64_t n_tok, float *y, int64_t ldy);
size_t dhsa__bf16_workspace(const dhsa__bf16_kernels *k, uint32_t type, int64_t n_in, int64_t n_out, int64_t n_tok,
                            int n_threads);
/* 1 when dhsa__bf16_matmul takes the fused path for n_tok. */
int dhsa__bf16_fused(const dhsa__bf16_kernels *k, int64_t n_tok);

#endif
