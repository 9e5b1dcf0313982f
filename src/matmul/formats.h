/* formats.h: the weight types of the model runner (ggml block formats) and
 * their scalar reference: what each stored weight stands for, the
 * quantizers that make them, the finite check. The bottom of src/matmul:
 * it includes nothing else of it, and every path (f32.h, int8.h, bf16.h,
 * amx.h) reads weights through what it defines. Private to the library.
 *
 * Types are ggml ids (dhsa_ggml_type): F32, F16, BF16, Q8_0, Q4_0, Q4_1,
 * Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, with ggml's
 * exact block layouts (formats.c lists them), so GGUF files from llama.cpp
 * load as they are. Dequantization is exact (the float each weight stands
 * for). Tests: tests/test_quant.c (round trips, every SIMD dequantizer
 * bitwise against dhsa__wt_dequant_scalar, the finite check).
 */
#ifndef DHSA_MATMUL_FORMATS_H
#define DHSA_MATMUL_FORMATS_H

#include "dhsa.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The supported types, in the order of every per-type table of the paths
 * (dhsa__wt_index). */
#define DHSA_QK_N_TYPES 15
#define DHSA_QK_TYPE_LIST "F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q5_K, IQ4_NL, IQ4_XS"

/* 1 when dhsa runs products over this ggml type (the fifteen above). */
int dhsa__wt_supported(uint32_t type);
/* The type's place in DHSA_QK_TYPE_LIST (the row of the paths' per-type
 * tables), -1 for an unsupported type. */
int dhsa__wt_index(uint32_t type);
/* "Q4_K" (static storage), NULL for an unsupported type. */
const char *dhsa__wt_name(uint32_t type);
/* Values per block (1 for F32/F16/BF16, 32 for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1
 * and IQ4_NL, 256 for the K types and IQ4_XS) and bytes per block. 0 for an
 * unsupported type. */
int64_t dhsa__wt_block(uint32_t type);
int64_t dhsa__wt_block_bytes(uint32_t type);
/* Bytes of a row of n values (n a multiple of the block); -1 otherwise. */
int64_t dhsa__wt_row_bytes(uint32_t type, int64_t n);
/* DHSA_ERR_UNSUPPORTED naming the type and the supported ones, said by fn. */
dhsa_status dhsa__wt_unsupported(const char *fn, uint32_t type);
/* The checks of a row length n for fn: a supported type, n a non-negative
 * multiple of its block, a row size that fits 64 bits. */
dhsa_status dhsa__wt_check_n(const char *fn, uint32_t type, int64_t n);

/* dst[0..kn) = columns [k0, k0 + kn) of a row (k0, kn multiples of the
 * block): the format's formulas in plain C, the reference of every SIMD
 * dequantizer (which must agree bitwise). Writes exactly kn floats. */
void dhsa__wt_dequant_scalar(uint32_t type, const uint8_t *row, int64_t k0, int64_t kn, float *dst);
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

/* ---- Pieces of the block layouts, shared by the scalar readers of every
 * path (formats.c, int8.c) ---- */

/* An F16 stored at p (any alignment). */
static inline float dhsa__wt_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return dhsa_f16_to_f32(h);
}

/* IQ4_NL / IQ4_XS: the 16 values a 4-bit code stands for (ggml's
 * kvalues_iq4nl, a fixed non-linear grid). */
static const int8_t dhsa__iq4_grid[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* Q3_K sub-block j (0..15): its 6-bit scale code (0..63; the scale is code - 32).
 * Low 4 bits: low nibble of scales[j] (j < 8) or high nibble of scales[j-8];
 * high 2 bits: bits 2(j/4), 2(j/4)+1 of scales[8 + j%4]. */
static inline int dhsa__q3k_scale(const uint8_t *s, int j) {
    int lo = j < 8 ? s[j] & 15 : s[j - 8] >> 4;
    return lo | ((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4;
}

/* IQ4_XS sub-block ib (0..7): 6-bit scale code (the scale is code - 32):
 * low 4 bits nibble ib%2 of scales_l[ib/2], high 2 bits 2ib.. of scales_h. */
static inline int dhsa__iq4xs_scale(const uint8_t *blk, int ib) {
    unsigned sh = (unsigned)blk[2] | (unsigned)blk[3] << 8;
    return ((blk[4 + ib / 2] >> (4 * (ib % 2))) & 15) | ((sh >> (2 * ib)) & 3) << 4;
}

/* Q4_K / Q5_K sub-block j (0..7): 6-bit scale and min from the 12 packed bytes. */
static inline void dhsa__q4k_scale_min(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

#endif
