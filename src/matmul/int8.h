/* int8.h: the integer path of the weight products (src/matmul/int8.c,
 * int8_vnni.c, int8_avx2.c, int8_avxvnni.c, int8_ymm.h): activations
 * quantized to 8 bits per block, integer dot products against the
 * weights' own codes. Private to the library; the exact F32 path
 * (f32.h) stays the reference and the `exact` option.
 *
 * Weights, every quantized type: a row is read as blocks of bw values
 * (bw = 32, or 16 for Q2_K, Q3_K and Q6_K, whose scales are per 16), each
 * with unsigned 8-bit codes c (0..255) and two floats a, b such that the
 * weight is exactly a*c + b:
 *   Q8_0      c = q + 128, a = d, b = -128 d      Q4_0  c = q, a = d, b = -8 d
 *   Q4_1      c = q, a = d, b = m                 Q5_0  c = q, a = d, b = -16 d
 *   Q5_1      c = q, a = d, b = m                 IQ4_NL c = grid[q] + 128, a = d, b = -128 d
 *   IQ4_XS    c = grid[q] + 128, a = d (ls - 32), b = -128 a
 *   Q4_K, Q5_K  c = q, a = d sc, b = -dmin m      Q6_K  c = q, a = d sc, b = -32 a
 *   Q3_K      c = q + 4, a = d (sc - 32), b = -4 a
 *   Q2_K      c = q, a = d (sc & 15), b = -dmin (sc >> 4)
 * (a and b are rounded to F32 once; the codes are the file's, unchanged).
 *
 * Activations: a row of n_in values (a multiple of 32) is cut into scale
 * groups of sb values (dhsa__qi_sb: 256 for the K types Q2_K..Q6_K, whose
 * super-blocks have one float scale, 32 for the others), each stored as
 * int8 codes q = nearest(x / xd) in [-127, 127] with xd = max|x| / 127
 * over the group (dhsa's own block form: like ggml's Q8_0 with an F32
 * scale for sb = 32, like its Q8_K for sb = 256); xd is kept once per 32
 * values (repeated over a group of 256). A group holding NaN or Inf gets
 * xd = NaN, so the products it feeds are NaN, as on the exact path.
 * xs[j] = xd * (sum of the codes of weight block j) is kept per weight
 * block. One scale per 256 lets a K-type kernel apply the super-block's
 * integer sub-block scales to integer sums and touch floats once per 256
 * values (int8_vnni.c's dot_file); it costs precision where a group's
 * values differ much in size (the bound below uses the group's xd).
 *
 * The product of a weight row and an activation row is then
 *   y = sum over weight blocks j, in order, of
 *         fl(a_j * xd_j) * isum_j  +  b_j * xs_j
 * with isum_j = sum of c*q over the block, an exact integer (at most
 * 32 * 255 * 127 < 2^31). The scalar path and the panel path (many
 * tokens) evaluate this with two FMA per block, in block order, and agree
 * bitwise (except the K types' super-block panel, ktile below, on the
 * kernel sets that have one: integer sums per 256 values, within float
 * rounding); the fused path (few tokens) sums the blocks in its lanes
 * first and differs from them by float rounding only (tests bound it at
 * 1e-6 relative to the sum of |terms|). Its error against the double
 * product of the same weights is the activations' rounding: at most
 * 0.5 xd per value.
 */
#ifndef DHSA_MODEL_QINT_H
#define DHSA_MODEL_QINT_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "matmul/formats.h"

#define DHSA_QI_XBLOCK 32 /* activation block */
#define DHSA_QI_GROUP 16  /* rows per VNNI group of the panel path */

/* A row of activations, quantized. */
typedef struct {
    const int8_t *q;   /* [n_in] codes */
    const float *xd;   /* [n_in / 32] scales */
    const float *xs;   /* [n_in / bw] xd * (sum of codes of weight block j) */
    /* the K types' super-block panel only (NULL elsewhere): per weight
     * block j, the sum of its codes (qs) and -z times it (qz; z the
     * type's code offset, dhsa__qi_kform) */
    const int32_t *qz; /* [n_in / bw] */
    const int16_t *qs; /* [n_in / bw] */
} dhsa_qi_act;

/* 1 when the integer path covers this weight type (every quantized type;
 * F32, F16 and BF16 weights take the exact path). */
int dhsa__qi_type(uint32_t type);
/* The weight block of the integer path: 16 or 32 (0 if not covered). */
int dhsa__qi_bw(uint32_t type);
/* The largest code the type's unpacking can give: 255 for Q8_0, IQ4_NL and
 * IQ4_XS (signed values + 128), 2^bits - 1 for the others (63 for Q6_K).
 * The AVX2 kernels' 16-bit pair sums depend on it (int8_avx2.h). */
int dhsa__qi_code_max(uint32_t type);

/* Scalar definitions, the reference of the per-ISA kernels:
 * codes[0..kn), a[0..kn/bw), b[0..kn/bw) of columns [k0, k0 + kn) of a
 * weight row (k0, kn multiples of the type's block). */
void dhsa__qi_unpack_scalar(uint32_t type, const uint8_t *row, int64_t k0, int64_t kn, uint8_t *codes, float *a,
                            float *b);
/* The activations' scale group of the weight type: 256 for Q2_K, Q3_K,
 * Q4_K, Q5_K and Q6_K, 32 for the others (0 if not covered). Their n_in is
 * a multiple of it (of the type's block). */
int dhsa__qi_sb(uint32_t type);
/* x[0..n) -> q[0..n), xd[0..n/32), xs[0..n/bw), one scale per sb values
 * (32 or 256; n a multiple of sb). */
void dhsa__qi_quant_act_scalar(const float *x, int64_t n, int bw, int sb, int8_t *q, float *xd, float *xs);
/* The per-ISA quantizers' stores for block i of 32 activations: its scale
 * and block sums (s0, s1: the sums of its two halves of 16 codes), or a
 * block of a NaN/Inf group (codes 0, xd and xs NaN). */
static inline void dhsa__qi_put_block(float *xd, float *xs, int64_t i, int bw, float d, int s0, int s1) {
    xd[i] = d;
    if (bw == 32) {
        xs[i] = d * (float)(s0 + s1);
    } else {
        xs[2 * i] = d * (float)s0;
        xs[2 * i + 1] = d * (float)s1;
    }
}
static inline void dhsa__qi_put_nan_block(int8_t *q, float *xd, float *xs, int64_t i, int bw) {
    for (int j = 0; j < 32; j++) q[32 * i + j] = 0;
    xd[i] = (float)NAN;
    if (bw == 32) xs[i] = (float)NAN;
    else xs[2 * i] = xs[2 * i + 1] = (float)NAN;
}
/* The block-ordered product of one unpacked row and one activation row,
 * starting from y0 (the contract's two FMA per block). */
float dhsa__qi_dot_scalar(const uint8_t *codes, const float *a, const float *b, int64_t n, int bw,
                          const dhsa_qi_act *x, float y0);

/* The K types' super-block panel (ktile below). Q2_K..Q6_K read as
 *   w = d S_j (c - z) - dmin M_j
 * with the file's integers: the sub-block scale S_j (Q6_K: its int8 sc;
 * Q3_K: sc - 32; Q4_K, Q5_K: the 6-bit sc; Q2_K: sc & 15), the min M_j
 * (Q4_K, Q5_K: the 6-bit m; Q2_K: sc >> 4; 0 for Q3_K and Q6_K), the
 * unpacked codes c (as above), the code offset z (Q6_K 32, Q3_K 4, 0 for
 * the others) and the super-block's F16 d and dmin. A super-block's
 * product with a token's codes q (one scale xd per 256, sb) is then
 *   fl(d xd) * I + fl(-dmin xd) * Mq,
 *   I  = sum_j S_j (sum_{k in j} c_k q_k - z qsum_j),  Mq = sum_j M_j qsum_j
 * (qsum_j the sum of the block's codes), both exact in 32 bits (|I| <
 * 16 * 127 * 16 * 32 * 127 < 2^31 for Q6_K, the largest). The tile adds
 * y = fma((float)I, fl(d xd), y), then, where the type has a min,
 * y = fma((float)Mq, fl(-dmin xd), y), per super-block in order: two float
 * steps per 256 values instead of two per block of 16 or 32, and integer
 * sums the per-block form rounds (within float rounding of it; the fused
 * dot_file's reading, int8_vnni.c). Returns 1 and sets *z, *has_min for
 * Q2_K..Q6_K, 0 for the others. */
int dhsa__qi_kform(uint32_t type, int *z, int *has_min);
/* S[0..n/bw), M[0..n/bw) (the 16-bit pairs the tile reads are packed by
 * the driver), d[0..n/256), dmin[0..n/256) of a whole K-type row of n
 * values. */
void dhsa__qi_kunpack_scalar(uint32_t type, const uint8_t *row, int64_t n, int32_t *S, int32_t *M, float *d,
                             float *dmin);
/* The reference of the kernels' ktile (below), bitwise: mr tokens x 16 ng
 * rows. */
void dhsa__qi_ktile_scalar(const uint8_t *w, const int32_t *S, const int32_t *M2, const float *D, const float *Dm,
                           int64_t n, int bw, int z, int has_min, const dhsa_qi_act *x, int mr, int ng, float *out,
                           int64_t ldo, int accumulate);

/* ---- Per-ISA kernels (private to int8.c and int8_*.c) ---- */
typedef struct {
    const char *name;
    int mr;        /* panel tile: tokens */
    int ng;        /* panel tile: row groups of 16 */
    int max_tok_fused; /* n_tok up to which the fused path runs */
    int fused_rows;    /* rows per dot_rows call */
    /* as dhsa__qi_quant_act_scalar, bitwise */
    void (*quant_act)(const float *x, int64_t n, int bw, int sb, int8_t *q, float *xd, float *xs);
    /* as dhsa__qi_unpack_scalar, bitwise (types the kernel has no SIMD
     * unpacking for call the scalar one) */
    void (*unpack)(uint32_t type, const uint8_t *row, int64_t k0, int64_t kn, uint8_t *codes, float *a, float *b);
    /* Fused path: y[t * ldy + r] (t < n_tok, r < nr <= fused_rows) = the
     * product of unpacked row r (codes at codes + r * ldc, a and b at
     * a / b + r * ldab; fused_rows rows are readable) with activation row
     * x[t], plus y's value when accumulate is set (the scalar kernel
     * continues its block-ordered sum from it); lane order (see above).
     * Every code is at most cmax (dhsa__qi_code_max of the type). */
    void (*dot_rows)(const uint8_t *codes, int64_t ldc, const float *a, const float *b, int64_t ldab, int nr, int64_t n,
                     int bw, int cmax, const dhsa_qi_act *x, int n_tok, float *y, int64_t ldy, int accumulate);
    /* Panel path, one tile: out[t][r] (t < mr, r < 16 ng) starts from its
     * value and adds the block-ordered product of n values of rows in
     * VNNI layout (per group g: codes [n/4][16][4] at w + g * n * 16, a and b
     * [n/bw][16] at a + g * (n/bw) * 16) with activation rows x[t]; codes
     * at most cmax. */
    void (*tile)(const uint8_t *w, const float *a, const float *b, int64_t n, int bw, int cmax, const dhsa_qi_act *x,
                 float *out);
    /* Fused path straight from the file's blocks, for the types the
     * kernel set has it for (returns 0 and does nothing for the others:
     * unpack, then dot_rows): as dot_rows for whole rows r < nr (any
     * count: the kernels take them fused_rows at a time, every token per
     * group; n values, the row's length, at w + r * row_bytes; rows past
     * nr are not read,
     * though the kernel prefetches ahead past the rows it was given,
     * which never faults), with the codes, a and b the unpacking would
     * give; within
     * float rounding of dot_rows (the K types sum a super-block's integer
     * products with its integer sub-block scales first: one float step per
     * 256 values, which needs sb = 256). Decode streams every weight once:
     * an unpacked copy was a second pass over it. NULL: none. Called with
     * nr <= 0 it reads nothing and only says whether it covers the type. */
    int (*dot_file)(uint32_t type, const uint8_t *w, int64_t row_bytes, int nr, int64_t n, const dhsa_qi_act *x,
                    int n_tok, float *y, int64_t ldy, int accumulate);
    /* The K types' super-block panel (dhsa__qi_kform), one tile of kmr
     * tokens x 16 ng rows: out[t * ldo + r] = the product of n values (a multiple of 256) of rows in the VNNI layout,
     * per group g of 16 rows: codes [n/4][16][4] at w + g * n * 16, S
     * [n/bw][16] at S + g * (n/bw) * 16, M2 [n/bw/2][16] at M2 + g *
     * (n/bw/2) * 16 (M_2i in the low 16 bits, M_2i+1 in the high; read only
     * where has_min), d [n/256][16] at D + g * (n/256) * 16 and -dmin
     * likewise at Dm; x[t].qz and x[t].qs set; with accumulate, added to
     * out's value (after its own super-blocks, as one more super-block
     * step each), else written (out is not read). Bitwise
     * dhsa__qi_ktile_scalar. NULL: the K types take tile. */
    void (*ktile)(const uint8_t *w, const int32_t *S, const int32_t *M2, const float *D, const float *Dm, int64_t n,
                  int bw, int z, int has_min, const dhsa_qi_act *x, float *out, int64_t ldo, int accumulate);
    int kmr; /* ktile's tokens (at most 16) */
    /* A group's 16 unpacked rows of n codes (row rr at rc + rr * ldr) into
     * the panel's VNNI layout at wg ([n/4][16][4]), as dhsa__qi_pack16
     * does (bitwise: a copy). NULL: dhsa__qi_pack16. */
    void (*pack16)(const uint8_t *rc, int64_t ldr, int64_t n, uint8_t *wg);
    /* The K panel of Q4_K and Q5_K (kform: bw 32, z 0, a min) with the
     * scales in the codes: a group's codes w ([n/4][16][4], after pack16)
     * times their block's scale S ([n/32][16], 0..63) in two digits, in
     * place c (S & 7), into wh (the same layout) c (S >> 3); the driver
     * puts the highs of group g at w + 16 ng n + g 16 n, after every
     * group's lows, and ktile reads that panel for these types (and the
     * codes as above for the others). NULL: the panel holds the codes. */
    void (*ksplit)(uint8_t *w, const int32_t *S, int64_t n, uint8_t *wh);
} dhsa__qi_kernels;

/* The scalar form of pack16 (above). */
void dhsa__qi_pack16(const uint8_t *rc, int64_t ldr, int64_t n, uint8_t *wg);

extern const dhsa__qi_kernels dhsa__qi_scalar;
#if defined(__x86_64__)
/* name NULL where the compiler could not build them */
extern const dhsa__qi_kernels dhsa__qi_vnni;    /* AVX512-VNNI: vpdpbusd on zmm */
extern const dhsa__qi_kernels dhsa__qi_avxvnni; /* AVX-VNNI: vpdpbusd on ymm */
extern const dhsa__qi_kernels dhsa__qi_avx2;    /* AVX2: vpmaddubsw + vpmaddwd */
/* AVX512-VNNI with the K panel of Q4_K and Q5_K on the AMX tiles' integer
 * products (int8_amxi8.c; bitwise dhsa__qi_vnni): built on first use, its
 * name NULL where the build or the VNNI set lacks it. Its first call runs
 * AVX-512 code: call it only on a CPU with AVX512-VNNI (int8.c calls it
 * where AMX-INT8 is active). */
const dhsa__qi_kernels *dhsa__qi_amxi8(void);
#endif
/* The integer kernels for the active ISA: avx512-vnni > avx-vnni > avx2 as
 * dhsa__idot_active allows (core/internal.h: the CPU, the active ISA,
 * DHSA_FORCE_ISA); NULL when it allows none (the scalar ISA, a CPU without
 * AVX2): the fast path is then the exact path, and
 * dhsa__matmul_path_name says so. */
const dhsa__qi_kernels *dhsa__qi_kernels_active(void);
/* 1 when the fused path (n_tok <= max_tok_fused) of this type on these
 * kernels is not used because the exact path's fused kernels are faster:
 * on AVX512-VNNI, the types its dot_file does not read from the file
 * (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS, Q2_K, Q3_K: the unpacked path
 * measured 0.45-0.9x the exact one at 1 and 4 tokens, docs/notes/results-models.md).
 * The 256-bit sets keep theirs (mixed there, and not measured on an
 * AVX2-only CPU). matmul.c's path choice asks this; dhsa__qi_matmul
 * itself runs whatever it is given. */
int dhsa__qi_fused_exact(const dhsa__qi_kernels *k, uint32_t type);
/* "int8 " and the kernels' name (static storage): the path's name for
 * the weight type (a set with ksplit names the tiles only for the types
 * whose prefill runs on them, Q4_K and Q5_K). */
const char *dhsa__qi_path_name(const dhsa__qi_kernels *k, uint32_t type);

/* The integer path of dhsa__matmul (same contract, matmul.h), with the
 * given kernels (tests pass &dhsa__qi_scalar). Workspace from the ctx's
 * scratch: dhsa__qi_workspace bytes. */
dhsa_status dhsa__qi_matmul(dhsa_ctx *ctx, const dhsa__qi_kernels *k, const dhsa_wmat *W, const float *x, int64_t ldx,
                            int64_t n_tok, float *y, int64_t ldy);
/* The products of one x with nw (at most 4) weights of one type and n_in,
 * y[i] [n_tok][W[i]->n_out], in one parallel job: each y bitwise what
 * dhsa__qi_matmul gives. Only on the fused path, and only where the
 * scratch that dhsa__qi_workspace of the largest product asks is enough;
 * elsewhere it does nothing and returns 0 (make the products one by one).
 * Returns 1 when it ran them, *st the result. */
int dhsa__qi_matmul_multi(dhsa_ctx *ctx, const dhsa__qi_kernels *k, const dhsa_wmat *const *W, int nw, const float *x,
                          int64_t ldx, int64_t n_tok, float *const *y, dhsa_status *st);
size_t dhsa__qi_workspace(const dhsa__qi_kernels *k, uint32_t type, int64_t n_in, int64_t n_out, int64_t n_tok,
                          int n_threads);

#endif
