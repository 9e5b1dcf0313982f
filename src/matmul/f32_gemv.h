/* f32_gemv.h: the fused form's entry points of the exact path, one per
 * weight type and token count, and the gemv that picks among them: shared
 * by f32_avx2.c and f32_avx512.c, which include it after defining
 *   R          rows per call of fused_tile
 *   TMAX       the most tokens per call (2 or 4)
 *   PF_GROUPS  prefetch distance, in groups of R rows
 *   fused_tile(type, T, w, x, ldx, n, pf, y, ldy, nr)  always inlined, so
 *              that each entry point is compiled for one type and T.
 * Include only from a file compiled with that ISA's flags.
 */
#ifndef DHSA_MATMUL_F32_GEMV_H
#define DHSA_MATMUL_F32_GEMV_H

#include "matmul/f32.h"

typedef void (*fused_fn)(const uint8_t *const *w, const float *x, int64_t ldx, int64_t n_in, int64_t pf, float *y,
                         int64_t ldy, int nr);

#define FUSED_T(NAME, TYPE, T)                                                                                    \
    static void NAME##_##T(const uint8_t *const *w, const float *x, int64_t ldx, int64_t n, int64_t pf, float *y, \
                           int64_t ldy, int nr) {                                                                  \
        fused_tile(TYPE, T, w, x, ldx, n, pf, y, ldy, nr);                                                        \
    }
#if TMAX == 2
#define FUSED(NAME, TYPE)                                                                                         \
    FUSED_T(NAME, TYPE, 1)                                                                                        \
    FUSED_T(NAME, TYPE, 2)                                                                                        \
    static const fused_fn NAME[TMAX + 1] = {NULL, NAME##_1, NAME##_2};
#elif TMAX == 4
#define FUSED(NAME, TYPE)                                                                                         \
    FUSED_T(NAME, TYPE, 1)                                                                                        \
    FUSED_T(NAME, TYPE, 2)                                                                                        \
    FUSED_T(NAME, TYPE, 3)                                                                                        \
    FUSED_T(NAME, TYPE, 4)                                                                                        \
    static const fused_fn NAME[TMAX + 1] = {NULL, NAME##_1, NAME##_2, NAME##_3, NAME##_4};
#else
#error "f32_gemv.h: TMAX must be 2 or 4"
#endif

FUSED(f_f32, DHSA_GGML_F32)
FUSED(f_f16, DHSA_GGML_F16)
FUSED(f_bf16, DHSA_GGML_BF16)
FUSED(f_q8_0, DHSA_GGML_Q8_0)
FUSED(f_q4_0, DHSA_GGML_Q4_0)
FUSED(f_q4_k, DHSA_GGML_Q4_K)
FUSED(f_q6_k, DHSA_GGML_Q6_K)
FUSED(f_q4_1, DHSA_GGML_Q4_1)
FUSED(f_q5_0, DHSA_GGML_Q5_0)
FUSED(f_q5_1, DHSA_GGML_Q5_1)
FUSED(f_q2_k, DHSA_GGML_Q2_K)
FUSED(f_q3_k, DHSA_GGML_Q3_K)
FUSED(f_q5_k, DHSA_GGML_Q5_K)
FUSED(f_iq4_nl, DHSA_GGML_IQ4_NL)
FUSED(f_iq4_xs, DHSA_GGML_IQ4_XS)

/* The entry points by dhsa__wt_index (the order of DHSA_QK_TYPE_LIST). */
static const fused_fn *const fused_by_type[DHSA_QK_N_TYPES] = {
    f_f32, f_f16, f_bf16, f_q8_0, f_q4_0, f_q4_k, f_q6_k, f_q4_1, f_q5_0, f_q5_1, f_q2_k, f_q3_k, f_q5_k, f_iq4_nl, f_iq4_xs,
};

static void gemv(uint32_t type, const uint8_t *w, int64_t row_bytes, int64_t nrows, int64_t n_in, const float *x,
                 int64_t ldx, int64_t n_tok, float *y, int64_t ldy) {
    const int ti = dhsa__wt_index(type);
    if (ti < 0) return;
    const fused_fn *f = fused_by_type[ti];
    for (int64_t r0 = 0; r0 < nrows; r0 += R) {
        const int nr = nrows - r0 < R ? (int)(nrows - r0) : R;
        const uint8_t *rows[R];
        for (int r = 0; r < R; r++) rows[r] = w + (r0 + (r < nr ? r : nr - 1)) * row_bytes;
        for (int64_t t0 = 0; t0 < n_tok; t0 += TMAX) {
            const int T = n_tok - t0 < TMAX ? (int)(n_tok - t0) : TMAX;
            f[T](rows, x + t0 * ldx, ldx, n_in, PF_GROUPS * R * row_bytes, y + t0 * ldy + r0, ldy, nr);
        }
    }
}

#undef FUSED
#undef FUSED_T
#endif
