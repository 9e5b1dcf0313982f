/* int8_vnni.c: AVX512-VNNI kernels of the integer path (contract in
 * int8.h). Compiled with the AVX-512 flags plus -mavx512vnni by the
 * Makefile (files named *_vnni.c); chosen at run time only where the CPU
 * has AVX512-VNNI; elsewhere this file is empty.
 *
 *   quant_act  max |x| over the scale group, then two zmm per block of
 *              32: one rounding multiply, vpmovdb; bitwise the scalar
 *              quantizer.
 *   unpack     Q8_0, Q4_K and Q6_K with byte operations here (64-byte
 *              stores); the other types by the AVX2 kernels' byte
 *              operations (int8_ymm.h).
 *   dot_rows   fused path, 4 rows x up to 4 tokens: per 64 codes one vpdpbusd (unsigned codes x
 *              signed activations) per token, its 16 lanes (4 or 2 per
 *              weight block) converted and scaled by a*xd per lane, the
 *              b*xs terms as a vector dot; lane order.
 *   dot_file   fused path from the file's blocks, no unpacked copy:
 *              Q8_0: one gather of 16 block scales, then per block a ymm
 *              load of the codes (flipped to q + 128 in the register) and
 *              one ymm vpdpbusd per token (decode 1.2-1.3x,
 *              docs/notes/results-models.md); Q4_K, Q5_K, Q6_K: codes from the nibbles
 *              in the registers, vpdpbusd, the lanes' integer sub-block
 *              scales by vpmaddwd / vpdpwssd, one float step per 256
 *              values (the activations' scale group, int8.h).
 *   tile       panel path: 6 tokens x 32 rows (two groups of 16 in the
 *              lanes), 12 vpdpbusd per four columns on a broadcast of four
 *              activation codes; per weight block the two FMA of the
 *              contract per lane, in block order: bitwise the scalar tile.
 *   ktile      the K types' super-block panel: the same products, each
 *              block's integer sums times its integer scales (vpmulld),
 *              floats once per 256 values: bitwise dhsa__qi_ktile_scalar.
 * Held to the scalar kernels by tests/test_qint.c.
 */
#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "matmul/int8.h"
#include "matmul/int8_kscale.h"

#define INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 16")
#define MR 6
#define NG 2
#define TMAX 4 /* fused path: tokens per pass over the unpacked rows */
#ifndef PF_FAR
#define PF_FAR 32 /* K types: the second, far prefetch into L2, in super-blocks */
#endif
#ifndef PF_FAR_Q8
#define PF_FAR_Q8 128
#endif
#define MAX_TOK_FUSED 4 /* fused path up to this many tokens (16 measured slower: 0.81x the exact path at n_in 576) */

static inline float half(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* ------------------------------------------------------- activations --- */

static void quant_act(const float *x, int64_t n, int bw, int sb, int8_t *q, float *xd, float *xs) {
    const __m512 zero = _mm512_setzero_ps();
    for (int64_t g = 0; g < n / sb; g++) {
        /* the group's max |x| and NaN/Inf probe (any order: a max is exact) */
        __m512 m = zero, pr = zero;
        for (int k = 0; k < sb / 16; k++) {
            __m512 v = _mm512_loadu_ps(x + sb * g + 16 * k);
            m = _mm512_max_ps(m, _mm512_abs_ps(v));
            pr = _mm512_add_ps(pr, _mm512_mul_ps(v, zero));
        }
        float amax = _mm512_reduce_max_ps(m), probe = _mm512_reduce_add_ps(pr);
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        const __m512 vid = _mm512_set1_ps(id);
        for (int64_t i = g * (sb / 32); i < (g + 1) * (sb / 32); i++) {
            if (probe != 0.0f) { /* NaN or Inf in the group (amax may not show it) */
                dhsa__qi_put_nan_block(q, xd, xs, i, bw);
                continue;
            }
            __m512 v0 = _mm512_loadu_ps(x + 32 * i), v1 = _mm512_loadu_ps(x + 32 * i + 16);
            __m512i q0 = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_mul_ps(v0, vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            __m512i q1 = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_mul_ps(v1, vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            _mm_storeu_si128((__m128i *)(q + 32 * i), _mm512_cvtepi32_epi8(q0));
            _mm_storeu_si128((__m128i *)(q + 32 * i + 16), _mm512_cvtepi32_epi8(q1));
            int s0 = _mm512_reduce_add_epi32(q0), s1 = _mm512_reduce_add_epi32(q1);
            dhsa__qi_put_block(xd, xs, i, bw, d, s0, s1);
        }
    }
}

/* ---------------------------------------------------------- unpacking --- */

static void unpack(uint32_t type, const uint8_t *row, int64_t k0, int64_t kn, uint8_t *c, float *a, float *b) {
    const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(3);
    switch (type) {
    case DHSA_GGML_Q8_0: {
        /* two blocks per 64-byte store: the products load 64 codes at a
         * time, and a load that spans two stores cannot be forwarded */
        const __m512i flip = _mm512_set1_epi8((char)0x80);
        int64_t i = 0;
        for (; i + 2 <= kn / 32; i += 2, c += 64) {
            const uint8_t *blk = row + (k0 / 32 + i) * 34;
            __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(blk + 2))),
                                           _mm256_loadu_si256((const __m256i *)(blk + 36)), 1);
            _mm512_storeu_si512(c, _mm512_xor_si512(v, flip));
            float d0 = half(blk), d1 = half(blk + 34);
            a[i] = d0;
            b[i] = -128.0f * d0;
            a[i + 1] = d1;
            b[i + 1] = -128.0f * d1;
        }
        if (i < kn / 32) {
            const uint8_t *blk = row + (k0 / 32 + i) * 34;
            _mm256_storeu_si256((__m256i *)c, _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk + 2)),
                                                               _mm512_castsi512_si256(flip)));
            float d = half(blk);
            a[i] = d;
            b[i] = -128.0f * d;
        }
        return;
    }
    case DHSA_GGML_Q4_K:
        for (int64_t i = 0; i < kn / 256; i++, c += 256, a += 8, b += 8) {
            const uint8_t *blk = row + (k0 / 256 + i) * 144;
            const __m256 d = _mm256_set1_ps(half(blk)), ndmin = _mm256_set1_ps(-half(blk + 2));
            for (int u = 0; u < 4; u++) { /* one 64-byte store per 64 codes (see Q8_0) */
                __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * u));
                _mm512_storeu_si512(c + 64 * u, _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(v, m4)),
                                                                   _mm256_and_si256(_mm256_srli_epi16(v, 4), m4), 1));
            }
            dhsa__qi_k_scales(blk + 4, d, ndmin, a, b);
        }
        return;
    case DHSA_GGML_Q6_K:
        for (int64_t i = 0; i < kn / 256; i++, c += 256, a += 16, b += 16) {
            const uint8_t *blk = row + (k0 / 256 + i) * 210;
            const int8_t *sc = (const int8_t *)(blk + 192);
            float d = half(blk + 208);
            for (int nh = 0; nh < 2; nh++) {
                __m256i l0 = _mm256_loadu_si256((const __m256i *)(blk + 64 * nh));
                __m256i l1 = _mm256_loadu_si256((const __m256i *)(blk + 64 * nh + 32));
                __m256i h = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * nh));
                uint8_t *cc = c + 128 * nh;
                __m256i p0 = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(h, m2), 4));
                __m256i p1 = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), m2), 4));
                __m256i p2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), m2), 4));
                __m256i p3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), m2), 4));
                _mm512_storeu_si512(cc, _mm512_inserti64x4(_mm512_castsi256_si512(p0), p1, 1));
                _mm512_storeu_si512(cc + 64, _mm512_inserti64x4(_mm512_castsi256_si512(p2), p3, 1));
            }
            for (int j = 0; j < 16; j++) {
                a[j] = d * (float)sc[j];
                b[j] = -32.0f * a[j];
            }
        }
        return;
    default:
        /* the 256-bit kernels' byte operations (int8_ymm.h; AVX2 is part
         * of every AVX512-VNNI CPU), else (a build without them) the
         * scalar unpacker */
        if (dhsa__qi_avx2.unpack) dhsa__qi_avx2.unpack(type, row, k0, kn, c, a, b);
        else dhsa__qi_unpack_scalar(type, row, k0, kn, c, a, b);
        return;
    }
}

/* -------------------------------------------------------- fused path --- */

/* R rows x NT tokens, weight blocks of BW (compile-time constants, so that
 * the R * NT accumulators live in registers and are independent chains). */
#define R 4
INLINE void dot_nt(const uint8_t *c, int64_t ldc, const float *a, const float *b, int64_t ldab, int64_t n,
                   const int BW, const dhsa_qi_act *x, const int NT, float *y, int64_t ldy, int nr, int accumulate) {
    const int64_t nb = n / BW;
    float ax[R][TMAX][256 + 16]; /* ax[r][t][j] = a_rj * xd_t (block j of this chunk) */
    const __m512i idx32 = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i idx16 = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    const __m512i dup = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    float res[R][TMAX];
    for (int64_t j0 = 0; j0 < nb; j0 += 256) {
        const int64_t jn = nb - j0 < 256 ? nb - j0 : 256;
        __m512 acc[R][TMAX];
        /* the scales of this chunk, and the b * xs terms into the accumulators */
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < NT; t++) {
            acc[r][t] = _mm512_setzero_ps();
            const dhsa_qi_act *xt = &x[t];
            const float *ar = a + r * ldab + j0, *br = b + r * ldab + j0;
            for (int64_t j = 0; j < jn; j += 16) {
                const __mmask16 m = jn - j >= 16 ? 0xFFFF : (__mmask16)((1u << (jn - j)) - 1);
                __m512 xdv;
                if (BW == 32) {
                    xdv = _mm512_maskz_loadu_ps(m, xt->xd + j0 + j);
                } else { /* block j uses xd[j / 2]; the lanes past the row are masked */
                    __m256 h = _mm256_loadu_ps(xt->xd + (j0 + j) / 2);
                    xdv = _mm512_maskz_permutexvar_ps(m, dup, _mm512_castps256_ps512(h));
                }
                _mm512_storeu_ps(ax[r][t] + j, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, ar + j), xdv));
                acc[r][t] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, br + j), _mm512_maskz_loadu_ps(m, xt->xs + j0 + j),
                                            acc[r][t]);
            }
        }
        const int64_t v0 = j0 * BW, v1 = (j0 + jn) * BW;
        int64_t v = v0, jl = 0;
        for (; v + 64 <= v1; v += 64, jl += 64 / BW) {
            __m512i xv[TMAX];
            UNROLL for (int t = 0; t < NT; t++) xv[t] = _mm512_loadu_si512(x[t].q + v);
            UNROLL for (int r = 0; r < R; r++) {
                const __m512i cv = _mm512_loadu_si512(c + r * ldc + v);
                UNROLL for (int t = 0; t < NT; t++) {
                    __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), cv, xv[t]);
                    __m512 s = BW == 32 ? _mm512_permutexvar_ps(idx32, _mm512_castps128_ps512(_mm_castsi128_ps(
                                                                          _mm_loadl_epi64((const __m128i *)(ax[r][t] + jl)))))
                                        : _mm512_permutexvar_ps(idx16, _mm512_castps128_ps512(_mm_loadu_ps(ax[r][t] + jl)));
                    acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), s, acc[r][t]);
                }
            }
        }
        if (v < v1) { /* 32 values left (n is a multiple of 32) */
            const __mmask64 m = 0xFFFFFFFFull;
            UNROLL for (int r = 0; r < R; r++) {
                const __m512i cv = _mm512_maskz_loadu_epi8(m, c + r * ldc + v);
                UNROLL for (int t = 0; t < NT; t++) {
                    __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), cv, _mm512_maskz_loadu_epi8(m, x[t].q + v));
                    __m512 s = BW == 32
                                   ? _mm512_maskz_permutexvar_ps(0x00FF, idx32, _mm512_set1_ps(ax[r][t][jl]))
                                   : _mm512_maskz_permutexvar_ps(0x00FF, idx16, _mm512_castps128_ps512(_mm_loadu_ps(ax[r][t] + jl)));
                    acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), s, acc[r][t]);
                }
            }
        }
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < NT; t++) {
            float sum = _mm512_reduce_add_ps(acc[r][t]);
            res[r][t] = j0 == 0 ? sum : res[r][t] + sum;
        }
    }
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < NT; t++) y[t * ldy + r] = accumulate ? y[t * ldy + r] + res[r][t] : res[r][t];
}

#define DOT_CASE(NT)                                                                                                 \
    case NT:                                                                                                         \
        if (bw == 32) dot_nt(c, ldc, a, b, ldab, n, 32, x + t0, NT, y + t0 * ldy, ldy, nr, accumulate);                          \
        else dot_nt(c, ldc, a, b, ldab, n, 16, x + t0, NT, y + t0 * ldy, ldy, nr, accumulate);                                   \
        break;

static void dot_rows(const uint8_t *c, int64_t ldc, const float *a, const float *b, int64_t ldab, int nr, int64_t n,
                     int bw, int cmax, const dhsa_qi_act *x, int n_tok, float *y, int64_t ldy, int accumulate) {
    (void)cmax; /* vpdpbusd sums in 32 bits: every code is exact */
    for (int t0 = 0; t0 < n_tok; t0 += TMAX) {
        switch (n_tok - t0 < TMAX ? n_tok - t0 : TMAX) {
            DOT_CASE(1)
            DOT_CASE(2)
            DOT_CASE(3)
            DOT_CASE(4)
        default: break;
        }
    }
}

/* ------------------------------------------------ fused path, Q8_0 --- */

/* The fused kernels from the file's blocks take whole rows and prefetch
 * ahead themselves (Q8_0: per 8 blocks the 8 that are 32 ahead, 1.05-1.07x
 * over 16 per 16 on a 264 MB matrix; the K types: per super-block the
 * one 8 ahead, 1.1x over 4 every 4 on a 141 MB matrix, 1.02-1.05x over 2
 * every 2): bytes [off, off + len) of each of the R rows, and past
 * a row's end the same bytes of the next group's rows (rows are
 * contiguous; a prefetch never faults, so one past the task's rows or
 * the matrix costs a line of bandwidth at most). Whole rows spare the
 * per-chunk setup and final sums: 1.16x on Q4_K rows of 4096. */
INLINE void pf_rows_l2(const uint8_t *const *row, int64_t row_bytes, int64_t off, int64_t len) {
    for (int r = 0; r < R; r++) {
        const uint8_t *p = off < row_bytes ? row[r] + off : row[r] + R * row_bytes + (off - row_bytes);
        for (int64_t e = 0; e < len; e += 64) _mm_prefetch((const char *)(p + e), _MM_HINT_T1);
    }
}
INLINE void pf_rows(const uint8_t *const *row, int64_t row_bytes, int64_t off, int64_t len) {
    for (int r = 0; r < R; r++) {
        const uint8_t *p = off < row_bytes ? row[r] + off : row[r] + R * row_bytes + (off - row_bytes);
        for (int64_t e = 0; e < len; e += 64) _mm_prefetch((const char *)(p + e), _MM_HINT_T0);
    }
}

/* R rows x NT tokens straight from Q8_0 blocks (34 bytes: f16 d, 32 int8
 * codes). Per 16 blocks of a row the scales come in with one gather (d and
 * the first two codes as a 32-bit word; the low half is d) and a*xd goes
 * into a small L1 table; then per block one 32-byte load of the codes,
 * flipped to q + 128 in the register, and per token one ymm vpdpbusd, its
 * 8 lanes converted and scaled by a broadcast of a*xd. ymm rather than
 * zmm: the 34-byte stride puts two blocks' codes 36 bytes apart, and a
 * ymm load per block costs no shuffle. The b*xs terms (b = -128 d) are a
 * vector dot per 16 blocks, folded into the lanes. Order: lanes (8 per
 * row and token) over the blocks, then the lanes' tree. */
INLINE void q8_nt(const uint8_t *w, int64_t row_bytes, int nr, int64_t n, const dhsa_qi_act *x, const int NT,
                  float *y, int64_t ldy, int accumulate) {
    const int64_t nb = n / 32;
    const uint8_t *row[R];
    for (int r = 0; r < R; r++) row[r] = w + (r < nr ? r : nr - 1) * row_bytes;
    const __m512i idx = _mm512_set_epi32(15 * 34, 14 * 34, 13 * 34, 12 * 34, 11 * 34, 10 * 34, 9 * 34, 8 * 34, 7 * 34,
                                         6 * 34, 5 * 34, 4 * 34, 3 * 34, 2 * 34, 34, 0);
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    const __m512 m128 = _mm512_set1_ps(-128.0f);
    float ax[R][TMAX][16];
    __m256 acc[R][TMAX];
    UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < NT; t++) acc[r][t] = _mm256_setzero_ps();
    for (int64_t j0 = 0; j0 < nb; j0 += 16) {
        const int jn = nb - j0 < 16 ? (int)(nb - j0) : 16;
        const __mmask16 m = (__mmask16)((1u << jn) - 1u);

        UNROLL for (int r = 0; r < R; r++) {
            const __m512i raw = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, idx, row[r] + j0 * 34, 1);
            const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(raw));
            const __m512 b = _mm512_mul_ps(d, m128); /* exact */
            UNROLL for (int t = 0; t < NT; t++) {
                _mm512_storeu_ps(ax[r][t], _mm512_mul_ps(d, _mm512_maskz_loadu_ps(m, x[t].xd + j0)));
                const __m512 bx = _mm512_mul_ps(b, _mm512_maskz_loadu_ps(m, x[t].xs + j0));
                acc[r][t] = _mm256_add_ps(acc[r][t], _mm256_add_ps(_mm512_castps512_ps256(bx),
                                                                   _mm512_extractf32x8_ps(bx, 1)));
            }
        }
        for (int j = 0; j < jn; j++) {
            if (j % 8 == 0) {
                pf_rows(row, row_bytes, (j0 + j + 32) * 34, 8 * 34);
                pf_rows_l2(row, row_bytes, (j0 + j + PF_FAR_Q8) * 34, 8 * 34);
            }
            __m256i xv[TMAX];
            UNROLL for (int t = 0; t < NT; t++) xv[t] = _mm256_loadu_si256((const __m256i *)(x[t].q + (j0 + j) * 32));
            UNROLL for (int r = 0; r < R; r++) {
                const __m256i cv =
                    _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(row[r] + (j0 + j) * 34 + 2)), flip);
                UNROLL for (int t = 0; t < NT; t++) {
                    const __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), cv, xv[t]);
                    acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcast_ss(&ax[r][t][j]), acc[r][t]);
                }
            }
        }
    }
    float res[R][TMAX]; /* all R rows unrolled: a run-time index into acc would keep it in memory */
    UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < NT; t++) {
        __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc[r][t]), _mm256_extractf128_ps(acc[r][t], 1));
        h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        h = _mm_add_ss(h, _mm_movehdup_ps(h));
        res[r][t] = _mm_cvtss_f32(h);
    }
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < NT; t++) y[t * ldy + r] = accumulate ? y[t * ldy + r] + res[r][t] : res[r][t];
}

/* ------------------------------------------- fused path, K types --- */

/* The K types straight from the file's super-blocks (256 values, one
 * activation scale xd per 256: int8.h's sb), R rows x NT tokens: per 64
 * codes one zmm of unsigned codes and, per token, one vpdpbusd (lanes of 4
 * codes: |sum| <= 4 * 63 * 127 = 32004 < 2^15); two such products packed
 * to 16 bits (vpackssdw) and multiplied by the lanes' integer sub-block
 * scales (vpermw of the 8 or 16 scales) with vpmaddwd / vpdpwssd: the
 * super-block's sum of sc_j * isum_j, exact in 32 bits (at most 256 * 63
 * * 127 * 128 < 2^31); then one float step, fl(d * xd) * that, and the
 * min terms b_j * xs_j as a vector FMA. Within float rounding of
 * dot_rows' per-block a_j * xd (tests/test_qint.c). */
#define TK 2 /* tokens per pass: 4 activation zmm per token stay in registers */

/* vpermw indices: per 64 codes, the scale of each 16-bit pair */
static const int16_t q4k_sc_idx[2][32] = {
    /* word w of packs(pL, pH) of two 64-code products (lanes of 4 codes):
     * 128-bit lane k = w / 8, words 0-3 from pL (sub-block 0 for k < 2, 2
     * after), 4-7 from pH (1, 3); +4 for the second 128 codes */
    {0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 2, 2, 2, 2, 3, 3, 3, 3},
    {4, 4, 4, 4, 5, 5, 5, 5, 4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7, 6, 6, 6, 6, 7, 7, 7, 7}};
static const int16_t q6k_sc_idx[2][32] = {
    /* word w of packs(pA, pB) of two 64-code products (codes 0-63 and
     * 64-127 of a half; lanes of 4 codes): 128-bit lane k = w / 8, words 0-3
     * sub-block (of 16) k, words 4-7 sub-block 4 + k; +8 for the second half */
    {0, 0, 0, 0, 4, 4, 4, 4, 1, 1, 1, 1, 5, 5, 5, 5, 2, 2, 2, 2, 6, 6, 6, 6, 3, 3, 3, 3, 7, 7, 7, 7},
    {8, 8, 8, 8, 12, 12, 12, 12, 9, 9, 9, 9, 13, 13, 13, 13, 10, 10, 10, 10, 14, 14, 14, 14, 11, 11, 11, 11, 15, 15, 15, 15}};

/* A super-block's sum of sc_j * isum_j, exact in 32-bit lanes: the four
 * 64-code products c_i . x_i (lanes of 4 codes, |sum| < 2^15), packed by
 * pairs to 16 bits and multiplied by the lanes' scales SC0, SC1. (By
 * value: arrays passed by address were kept in memory, 1.1-1.15x slower.) */
INLINE __m512i sb_isum(__m512i c0, __m512i c1, __m512i c2, __m512i c3, __m512i x0, __m512i x1, __m512i x2, __m512i x3,
                       __m512i SC0, __m512i SC1) {
    const __m512i z = _mm512_setzero_si512();
    const __m512i ai =
        _mm512_madd_epi16(_mm512_packs_epi32(_mm512_dpbusd_epi32(z, c0, x0), _mm512_dpbusd_epi32(z, c1, x1)), SC0);
    return _mm512_dpwssd_epi32(ai, _mm512_packs_epi32(_mm512_dpbusd_epi32(z, c2, x2), _mm512_dpbusd_epi32(z, c3, x3)),
                               SC1);
}


/* Q4_K (FIVE 0, 144-byte blocks) and Q5_K (FIVE 1, 176): c[64u + 32h + l] is
 * the low (h 0) or high (h 1) nibble of qs[32u + l] (+ 16 for Q5_K's qh
 * bit 2u + h). A zmm of 64 qs bytes gives codes 0-31 and 64-95 (low
 * nibbles) and 32-63, 96-127 (high): the activations are shuffled to
 * match, once per token and super-block. */
INLINE void k45_nt(const uint8_t *w, int64_t row_bytes, int nr, int64_t n, const dhsa_qi_act *x, const int NT,
                   const int FIVE, float *y, int64_t ldy, int accumulate) {
    const int64_t ns = n / 256, bb = FIVE ? 176 : 144;
    const uint8_t *row[R];
    for (int r = 0; r < R; r++) row[r] = w + (r < nr ? r : nr - 1) * row_bytes;
    const __m512i m4 = _mm512_set1_epi8(15), bit4 = _mm512_set1_epi8(16);
    /* sub-block scales: words of row r at 16 (r & 1) of its pair's zmm */
    const __m512i idx0 = _mm512_loadu_si512(q4k_sc_idx[0]), idx1 = _mm512_loadu_si512(q4k_sc_idx[1]);
    const __m512i w16 = _mm512_set1_epi16(16), idx0o = _mm512_add_epi16(idx0, w16), idx1o = _mm512_add_epi16(idx1, w16);
    /* the four rows' 16-byte heads (d, dmin, 12 scale bytes), one per 128-bit lane: per lane
     * P = [s0-3, s8-11, s4-7, s8-11], Q = [0, s0-3, 0, s4-7] (s = the scale bytes at 4) */
    const __m512i shufP = _mm512_broadcast_i32x4(_mm_setr_epi8(4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15));
    const __m512i shufQ = _mm512_broadcast_i32x4(_mm_setr_epi8(-1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11));
    const __m512i mlow = _mm512_broadcast_i32x4(_mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15));
    const __m512i m30 = _mm512_set1_epi8(0x30);
    const __m512i dd_idx = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i mb_idx = _mm512_setr_epi64(1, 3, 5, 7, 1, 3, 5, 7);
    const __m512i dmin01 = _mm512_setr_epi32(1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m512i dmin23 = _mm512_setr_epi32(5, 5, 5, 5, 5, 5, 5, 5, 7, 7, 7, 7, 7, 7, 7, 7);
    __m512 acc[R][TK], am[2][TK]; /* am: the min terms, rows 0-1 and 2-3 (8 lanes each) */
    UNROLL for (int t = 0; t < NT; t++) {
        UNROLL for (int r = 0; r < R; r++) acc[r][t] = _mm512_setzero_ps();
        am[0][t] = am[1][t] = _mm512_setzero_ps();
    }
    for (int64_t s = 0; s < ns; s++) {
        pf_rows(row, row_bytes, (s + 8) * bb, bb);
        pf_rows_l2(row, row_bytes, (s + PF_FAR) * bb, bb);
        __m512i X[TK][4];
        __m512 xd[TK], xs[TK];
        UNROLL for (int t = 0; t < NT; t++) {
            const int8_t *xq = x[t].q + 256 * s;
            const __m512i a = _mm512_loadu_si512(xq), b = _mm512_loadu_si512(xq + 64);
            const __m512i c = _mm512_loadu_si512(xq + 128), d = _mm512_loadu_si512(xq + 192);
            X[t][0] = _mm512_shuffle_i64x2(a, b, 0x44); /* codes 0-31, 64-95 */
            X[t][1] = _mm512_shuffle_i64x2(a, b, 0xEE); /* 32-63, 96-127 */
            X[t][2] = _mm512_shuffle_i64x2(c, d, 0x44);
            X[t][3] = _mm512_shuffle_i64x2(c, d, 0xEE);
            xd[t] = _mm512_set1_ps(x[t].xd[8 * s]);
            xs[t] = _mm512_broadcast_f32x8(_mm256_loadu_ps(x[t].xs + 8 * s)); /* both halves */
        }
        /* the scales and mins of the four rows (int8.c's q4k_scale_min) as bytes
         * [sc0..7, m0..7] per lane: sc0-3 = s0-3 & 63, m0-3 = s4-7 & 63,
         * sc4-7 = (s8-11 & 15) | (s0-3 >> 6) << 4, m4-7 = (s8-11 >> 4) | (s4-7 >> 6) << 4 */
        __m512i H = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(row[0] + s * bb)));
        H = _mm512_inserti32x4(H, _mm_loadu_si128((const __m128i *)(row[1] + s * bb)), 1);
        H = _mm512_inserti32x4(H, _mm_loadu_si128((const __m128i *)(row[2] + s * bb)), 2);
        H = _mm512_inserti32x4(H, _mm_loadu_si128((const __m128i *)(row[3] + s * bb)), 3);
        const __m512i P = _mm512_shuffle_epi8(H, shufP), Q = _mm512_shuffle_epi8(H, shufQ);
        __m512i S = _mm512_and_si512(_mm512_mask_blend_epi8(0xF000F000F000F000ull, P, _mm512_srli_epi16(P, 4)), mlow);
        S = _mm512_ternarylogic_epi32(S, _mm512_srli_epi16(Q, 2), m30, 0xF8); /* S | (Q >> 2 & 0x30) */
        const __m512i W01 = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(S));
        const __m512i W23 = _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(S, 1));
        /* d, dmin of the rows: [d0, dmin0, d1, dmin1, ...] */
        const __m512 dv = _mm512_castps256_ps512(
            _mm256_cvtph_ps(_mm512_castsi512_si128(_mm512_permutexvar_epi32(dd_idx, H))));
        __m512 dx[TK]; /* d_r * xd_t in lane 2r, once per token */
        UNROLL for (int t = 0; t < NT; t++) dx[t] = _mm512_mul_ps(dv, xd[t]);
        /* the min terms: fl(dmin m_j) (= -b_j) xs_j, two rows per zmm */
        const __m512i MB = _mm512_permutexvar_epi64(mb_idx, S); /* m bytes of rows 0-3 */
        const __m512 bm01 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm512_castsi512_si128(MB))),
                                          _mm512_permutexvar_ps(dmin01, dv));
        const __m512 bm23 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(MB, 1))),
                                          _mm512_permutexvar_ps(dmin23, dv));
        UNROLL for (int t = 0; t < NT; t++) {
            am[0][t] = _mm512_fmadd_ps(bm01, xs[t], am[0][t]);
            am[1][t] = _mm512_fmadd_ps(bm23, xs[t], am[1][t]);
        }
        UNROLL for (int r = 0; r < R; r++) {
            const uint8_t *qs = row[r] + s * bb + (FIVE ? 48 : 16);
            const __m512i v0 = _mm512_loadu_si512(qs), v1 = _mm512_loadu_si512(qs + 64);
            __m512i c[4];
            c[0] = _mm512_and_si512(v0, m4);
            c[1] = _mm512_and_si512(_mm512_srli_epi16(v0, 4), m4);
            c[2] = _mm512_and_si512(v1, m4);
            c[3] = _mm512_and_si512(_mm512_srli_epi16(v1, 4), m4);
            if (FIVE) { /* qh bit 2u + h of byte l: bits 0, 1 (u 0), 2, 3 (u 1), 4-7 (u 2, 3) */
                const __m256i qh = _mm256_loadu_si256((const __m256i *)(row[r] + s * bb + 16));
                const __m512i hz = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
                const __m512i hz4 = _mm512_srli_epi16(hz, 4);
                /* a | (b & bit4): ternary logic 0xF8 */
                c[0] = _mm512_ternarylogic_epi32(c[0], _mm512_slli_epi16(hz, 4), bit4, 0xF8);
                c[1] = _mm512_ternarylogic_epi32(c[1], _mm512_slli_epi16(hz, 3), bit4, 0xF8);
                c[2] = _mm512_ternarylogic_epi32(c[2], _mm512_slli_epi16(hz4, 4), bit4, 0xF8);
                c[3] = _mm512_ternarylogic_epi32(c[3], _mm512_slli_epi16(hz4, 3), bit4, 0xF8);
            }
            const __m512i Wr = r < 2 ? W01 : W23;
            const __m512i SC0 = _mm512_permutexvar_epi16(r & 1 ? idx0o : idx0, Wr);
            const __m512i SC1 = _mm512_permutexvar_epi16(r & 1 ? idx1o : idx1, Wr);
            const __m512i lane = _mm512_set1_epi32(2 * r);
            UNROLL for (int t = 0; t < NT; t++) {
                const __m512i ai = sb_isum(c[0], c[1], c[2], c[3], X[t][0], X[t][1], X[t][2], X[t][3], SC0, SC1);
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ai), _mm512_permutexvar_ps(lane, dx[t]), acc[r][t]);
            }
        }
    }
    float res[R][TK]; /* all R rows unrolled: a run-time index into acc would keep it in memory */
    UNROLL for (int t = 0; t < NT; t++) {
        UNROLL for (int r = 0; r < R; r++) res[r][t] = _mm512_reduce_add_ps(acc[r][t]);
        res[0][t] -= _mm512_mask_reduce_add_ps(0x00FF, am[0][t]);
        res[1][t] -= _mm512_mask_reduce_add_ps(0xFF00, am[0][t]);
        res[2][t] -= _mm512_mask_reduce_add_ps(0x00FF, am[1][t]);
        res[3][t] -= _mm512_mask_reduce_add_ps(0xFF00, am[1][t]);
    }
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < NT; t++) y[t * ldy + r] = accumulate ? y[t * ldy + r] + res[r][t] : res[r][t];
}

/* Q6_K (210-byte blocks: ql[128], qh[64], int8 scales[16], d): per half
 * nh of 128 codes, c[128 nh + 32 p + l] = (ql[64 nh + 32 (p & 1) + l] >>
 * 4 (p >> 1)) & 15 | ((qh[32 nh + l] >> 2p) & 3) << 4: a zmm of 64 ql
 * bytes and the 32 qh bytes (and them >> 2) give codes 0-63 (low nibbles)
 * and 64-127 (high) of the half, in order. b_j = -32 a_j. */
INLINE void q6k_nt(const uint8_t *w, int64_t row_bytes, int nr, int64_t n, const dhsa_qi_act *x, const int NT,
                   float *y, int64_t ldy, int accumulate) {
    const int64_t ns = n / 256;
    const uint8_t *row[R];
    for (int r = 0; r < R; r++) row[r] = w + (r < nr ? r : nr - 1) * row_bytes;
    const __m512i m4 = _mm512_set1_epi8(15), m33 = _mm512_set1_epi8(0x33);
    const __m512i idx0 = _mm512_loadu_si512(q6k_sc_idx[0]), idx1 = _mm512_loadu_si512(q6k_sc_idx[1]);
    __m512 acc[R][TK];
    UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < NT; t++) acc[r][t] = _mm512_setzero_ps();
    for (int64_t s = 0; s < ns; s++) {
        pf_rows(row, row_bytes, (s + 8) * 210, 210);
        pf_rows_l2(row, row_bytes, (s + PF_FAR) * 210, 210);
        __m512i X[TK][4];
        float xd[TK];
        UNROLL for (int t = 0; t < NT; t++) {
            UNROLL for (int i = 0; i < 4; i++) X[t][i] = _mm512_loadu_si512(x[t].q + 256 * s + 64 * i);
            xd[t] = x[t].xd[8 * s];
        }
        UNROLL for (int r = 0; r < R; r++) {
            const uint8_t *blk = row[r] + s * 210;
            const __m128i sc8 = _mm_loadu_si128((const __m128i *)(blk + 192));
            const __m512i scw = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(sc8));
            uint16_t dh;
            memcpy(&dh, blk + 208, 2);
            const float d = _cvtsh_ss(dh);
            /* b_j = -32 a_j, a_j = d sc_j, as the unpacking's */
            const __m512 b = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc8))),
                                           _mm512_set1_ps(-32.0f));
            __m512i c[4];
            UNROLL for (int nh = 0; nh < 2; nh++) {
                const __m512i l = _mm512_loadu_si512(blk + 64 * nh);
                const __m256i h = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * nh));
                /* bits 0, 1 and 4, 5 of each byte: the high bits of p 0 (p 1 in the upper half) and p 2 (p 3) */
                const __m512i h2 = _mm512_and_si512(
                    _mm512_inserti64x4(_mm512_castsi256_si512(h), _mm256_srli_epi16(h, 2), 1), m33);
                /* m4 ? a : b, ternary logic 0xCA */
                c[2 * nh] = _mm512_ternarylogic_epi32(m4, l, _mm512_slli_epi16(h2, 4), 0xCA);
                c[2 * nh + 1] = _mm512_ternarylogic_epi32(m4, _mm512_srli_epi16(l, 4), h2, 0xCA);
            }
            const __m512i SC0 = _mm512_permutexvar_epi16(idx0, scw), SC1 = _mm512_permutexvar_epi16(idx1, scw);
            UNROLL for (int t = 0; t < NT; t++) {
                const __m512i ai = sb_isum(c[0], c[1], c[2], c[3], X[t][0], X[t][1], X[t][2], X[t][3], SC0, SC1);
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ai), _mm512_set1_ps(d * xd[t]), acc[r][t]);
                acc[r][t] = _mm512_fmadd_ps(b, _mm512_loadu_ps(x[t].xs + 16 * s), acc[r][t]);
            }
        }
    }
    float res[R][TK];
    UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < NT; t++) res[r][t] = _mm512_reduce_add_ps(acc[r][t]);
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < NT; t++) y[t * ldy + r] = accumulate ? y[t * ldy + r] + res[r][t] : res[r][t];
}

/* one function per form (each its own registers; named for profiles) */
#define K_FORM(NAME, CALL)                                                                                           \
    static void NAME(const uint8_t *w0, int64_t row_bytes, int nr_all, int64_t n, const dhsa_qi_act *x, float *y0,    \
                     int64_t ldy, int accumulate) {                                                                  \
        for (int g = 0; g < nr_all; g += R) {                                                                        \
            const uint8_t *w = w0 + g * row_bytes;                                                                   \
            const int nr = nr_all - g < R ? nr_all - g : R;                                                          \
            float *y = y0 + g;                                                                                       \
            CALL;                                                                                                    \
        }                                                                                                            \
    }
K_FORM(k4_1, k45_nt(w, row_bytes, nr, n, x, 1, 0, y, ldy, accumulate))
K_FORM(k4_2, k45_nt(w, row_bytes, nr, n, x, 2, 0, y, ldy, accumulate))
K_FORM(k5_1, k45_nt(w, row_bytes, nr, n, x, 1, 1, y, ldy, accumulate))
K_FORM(k5_2, k45_nt(w, row_bytes, nr, n, x, 2, 1, y, ldy, accumulate))
K_FORM(k6_1, q6k_nt(w, row_bytes, nr, n, x, 1, y, ldy, accumulate))
K_FORM(k6_2, q6k_nt(w, row_bytes, nr, n, x, 2, y, ldy, accumulate))
K_FORM(q8_1, q8_nt(w, row_bytes, nr, n, x, 1, y, ldy, accumulate))
K_FORM(q8_2, q8_nt(w, row_bytes, nr, n, x, 2, y, ldy, accumulate))
K_FORM(q8_3, q8_nt(w, row_bytes, nr, n, x, 3, y, ldy, accumulate))
K_FORM(q8_4, q8_nt(w, row_bytes, nr, n, x, 4, y, ldy, accumulate))

static int dot_file(uint32_t type, const uint8_t *w, int64_t row_bytes, int nr, int64_t n, const dhsa_qi_act *x,
                    int n_tok, float *y, int64_t ldy, int accumulate) {
    if (nr <= 0) /* a probe (int8.h) */
        return type == DHSA_GGML_Q8_0 || type == DHSA_GGML_Q4_K || type == DHSA_GGML_Q5_K || type == DHSA_GGML_Q6_K;
    if (type == DHSA_GGML_Q8_0) {
        /* up to TMAX tokens: every group of rows in one function; more: per
         * group of R rows every pass over the tokens (each row read once) */
        if (n_tok <= TMAX) {
            (n_tok == 1 ? q8_1 : n_tok == 2 ? q8_2 : n_tok == 3 ? q8_3 : q8_4)(w, row_bytes, nr, n, x, y, ldy, accumulate);
            return 1;
        }
        for (int g = 0; g < nr; g += R)
            for (int t0 = 0; t0 < n_tok; t0 += TMAX) {
                const int m = n_tok - t0 < TMAX ? n_tok - t0 : TMAX, ng = nr - g < R ? nr - g : R;
                (m == 1 ? q8_1 : m == 2 ? q8_2 : m == 3 ? q8_3 : q8_4)(w + g * row_bytes, row_bytes, ng, n, x + t0,
                                                                    y + t0 * ldy + g, ldy, accumulate);
            }
        return 1;
    }
    if (type != DHSA_GGML_Q4_K && type != DHSA_GGML_Q5_K && type != DHSA_GGML_Q6_K) return 0;
    for (int g = 0; g < nr; g += (n_tok <= TK ? nr : R)) { /* as Q8_0's */
        const int ng = n_tok <= TK ? nr : nr - g < R ? nr - g : R;
        for (int t0 = 0; t0 < n_tok; t0 += TK) {
            const dhsa_qi_act *xt = x + t0;
            float *yt = y + t0 * ldy + g;
            const uint8_t *wg = w + g * row_bytes;
            const int two = n_tok - t0 >= 2;
            if (type == DHSA_GGML_Q4_K) (two ? k4_2 : k4_1)(wg, row_bytes, ng, n, xt, yt, ldy, accumulate);
            else if (type == DHSA_GGML_Q5_K) (two ? k5_2 : k5_1)(wg, row_bytes, ng, n, xt, yt, ldy, accumulate);
            else (two ? k6_2 : k6_1)(wg, row_bytes, ng, n, xt, yt, ldy, accumulate);
        }
    }
    return 1;
}

/* -------------------------------------------------------- panel path --- */

/* One weight block of QPB four-column groups, unrolled: with a run-time
 * trip count GCC 12 kept the 12 integer sums in a rotating set of registers
 * and copied each one twice per group (24 zmm moves per 12 vpdpbusd: a
 * third of the tile's issue slots, docs/notes/results-models.md). */
INLINE void tile_bw(const uint8_t *w, const float *a, const float *b, int64_t n, const int bw,
                    const dhsa_qi_act *x, float *out) {
    const int qpb = bw / 4;
    const int64_t nb = n / bw;
    const uint8_t *w0 = w, *w1 = w + n * 16;
    const float *a0 = a, *a1 = a + nb * 16, *b0 = b, *b1 = b + nb * 16;
    __m512 f[MR][NG];
    UNROLL for (int t = 0; t < MR; t++) {
        f[t][0] = _mm512_loadu_ps(out + t * 16 * NG);
        f[t][1] = _mm512_loadu_ps(out + t * 16 * NG + 16);
    }
    const int8_t *xq[MR];
    for (int t = 0; t < MR; t++) xq[t] = x[t].q;
    for (int64_t j = 0; j < nb; j++) {
        __m512i s[MR][NG];
        UNROLL for (int t = 0; t < MR; t++) s[t][0] = s[t][1] = _mm512_setzero_si512();
        const uint8_t *wj0 = w0 + j * qpb * 64, *wj1 = w1 + j * qpb * 64;
        const int64_t xo = j * bw;
        UNROLL for (int u = 0; u < qpb; u++) {
            const __m512i v0 = _mm512_load_si512(wj0 + u * 64), v1 = _mm512_load_si512(wj1 + u * 64);
            UNROLL for (int t = 0; t < MR; t++) {
                int32_t four;
                memcpy(&four, xq[t] + xo + 4 * u, 4);
                const __m512i xb = _mm512_set1_epi32(four);
                s[t][0] = _mm512_dpbusd_epi32(s[t][0], v0, xb);
                s[t][1] = _mm512_dpbusd_epi32(s[t][1], v1, xb);
            }
        }
        const __m512 A0 = _mm512_loadu_ps(a0 + j * 16), A1 = _mm512_loadu_ps(a1 + j * 16);
        const __m512 B0 = _mm512_loadu_ps(b0 + j * 16), B1 = _mm512_loadu_ps(b1 + j * 16);
        const int64_t jd = j * bw / 32;
        UNROLL for (int t = 0; t < MR; t++) {
            const __m512 xdv = _mm512_set1_ps(x[t].xd[jd]), xsv = _mm512_set1_ps(x[t].xs[j]);
            f[t][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[t][0]), _mm512_mul_ps(A0, xdv), f[t][0]);
            f[t][0] = _mm512_fmadd_ps(B0, xsv, f[t][0]);
            f[t][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[t][1]), _mm512_mul_ps(A1, xdv), f[t][1]);
            f[t][1] = _mm512_fmadd_ps(B1, xsv, f[t][1]);
        }
    }
    UNROLL for (int t = 0; t < MR; t++) {
        _mm512_storeu_ps(out + t * 16 * NG, f[t][0]);
        _mm512_storeu_ps(out + t * 16 * NG + 16, f[t][1]);
    }
}

static void tile(const uint8_t *w, const float *a, const float *b, int64_t n, int bw, int cmax, const dhsa_qi_act *x,
                 float *out) {
    (void)cmax;
    if (bw == 32)
        tile_bw(w, a, b, n, 32, x, out);
    else
        tile_bw(w, a, b, n, 16, x, out);
}

/* ------------------------------------------------------- K panel --- */

/* The K types' super-block panel (int8.h, ktile): KMR tokens x 32 rows.
 * Per weight block: the 16-lane integer sums start from the token's
 * -z qsum_j (Q6_K, Q3_K), take qpb vpdpbusd per token and group as the
 * tile's, and are multiplied by the block's integer scales (vpmulld) into
 * the super-block's sum I; per super-block one conversion and FMA with
 * fl(d xd) per token and group, and for the types with a min its integer
 * sum of M_j qsum_j (vpdpwssd on pairs of blocks) likewise. vpdpbusd,
 * vpmulld, vpdpwssd and FMA share two pipes on Zen 4 and vpaddd does not
 * (docs/quant.md, "The K types' super-block panel"):
 * the float steps of the per-block tile (a conversion, a multiply and two
 * FMA per block of 32 or 16) become one vpmulld per block. Bitwise
 * dhsa__qi_ktile_scalar. */
#define KMR 6

INLINE void ktile_bw(const uint8_t *w, const int32_t *S, const int32_t *M2, const float *D, const float *Dm,
                     int64_t n, const int bw, const int Z, const int MIN, const dhsa_qi_act *x, float *out, int64_t ldo,
                     int accumulate) {
    const int qpb = bw / 4, bps = 256 / bw;
    const int64_t nb = n / bw, ns = n / 256;
    const uint8_t *w0 = w, *w1 = w + n * 16;
    const int32_t *S0 = S, *S1 = S + nb * 16, *M0 = M2, *M1 = M2 + (nb / 2) * 16;
    const float *D0 = D, *D1 = D + ns * 16, *Dm0 = Dm, *Dm1 = Dm + ns * 16;
    for (int64_t s = 0; s < ns; s++) {
        __m512i I[KMR][NG];
        UNROLL for (int t = 0; t < KMR; t++) I[t][0] = I[t][1] = _mm512_setzero_si512();
        for (int64_t j = s * bps; j < (s + 1) * bps; j++) {
            __m512i a[KMR][NG];
            UNROLL for (int t = 0; t < KMR; t++) a[t][0] = a[t][1] = Z ? _mm512_set1_epi32(x[t].qz[j]) : _mm512_setzero_si512();
            const uint8_t *wj0 = w0 + j * qpb * 64, *wj1 = w1 + j * qpb * 64;
            const int64_t xo = j * bw;
            UNROLL for (int u = 0; u < qpb; u++) {
                const __m512i v0 = _mm512_load_si512(wj0 + u * 64), v1 = _mm512_load_si512(wj1 + u * 64);
                UNROLL for (int t = 0; t < KMR; t++) {
                    int32_t four;
                    memcpy(&four, x[t].q + xo + 4 * u, 4);
                    const __m512i xb = _mm512_set1_epi32(four);
                    a[t][0] = _mm512_dpbusd_epi32(a[t][0], v0, xb);
                    a[t][1] = _mm512_dpbusd_epi32(a[t][1], v1, xb);
                }
            }
            const __m512i s0 = _mm512_loadu_si512(S0 + j * 16), s1 = _mm512_loadu_si512(S1 + j * 16);
            UNROLL for (int t = 0; t < KMR; t++) {
                I[t][0] = _mm512_add_epi32(I[t][0], _mm512_mullo_epi32(a[t][0], s0));
                I[t][1] = _mm512_add_epi32(I[t][1], _mm512_mullo_epi32(a[t][1], s1));
            }
        }
        const __m512 d0 = _mm512_loadu_ps(D0 + s * 16), d1 = _mm512_loadu_ps(D1 + s * 16);
        UNROLL for (int t = 0; t < KMR; t++) {
            const __m512 xdv = _mm512_set1_ps(x[t].xd[s * 8]);
            float *o = out + t * ldo;
            const int rd = s > 0 || accumulate;
            const __m512 o0 = rd ? _mm512_loadu_ps(o) : _mm512_setzero_ps(), o1 = rd ? _mm512_loadu_ps(o + 16) : o0;
            __m512 f0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I[t][0]), _mm512_mul_ps(d0, xdv), o0);
            __m512 f1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I[t][1]), _mm512_mul_ps(d1, xdv), o1);
            if (MIN) {
                __m512i m0 = _mm512_setzero_si512(), m1 = _mm512_setzero_si512();
                for (int64_t p = s * bps / 2; p < (s + 1) * bps / 2; p++) {
                    int32_t pair;
                    memcpy(&pair, x[t].qs + 2 * p, 4);
                    const __m512i qp = _mm512_set1_epi32(pair);
                    m0 = _mm512_dpwssd_epi32(m0, _mm512_loadu_si512(M0 + p * 16), qp);
                    m1 = _mm512_dpwssd_epi32(m1, _mm512_loadu_si512(M1 + p * 16), qp);
                }
                f0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(m0), _mm512_mul_ps(_mm512_loadu_ps(Dm0 + s * 16), xdv), f0);
                f1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(m1), _mm512_mul_ps(_mm512_loadu_ps(Dm1 + s * 16), xdv), f1);
            }
            _mm512_storeu_ps(o, f0);
            _mm512_storeu_ps(o + 16, f1);
        }
    }
}

/* dhsa__qi_pack16 by 16 x 16 transposes of 32-bit words: per 64 columns
 * one zmm load per row, two rounds of unpacks and two of 128-bit lane
 * shuffles, one zmm store per four columns (their 16 rows); columns past
 * the last 64 by the scalar copy. */
static void pack16(const uint8_t *rc, int64_t ldr, int64_t n, uint8_t *wg) {
    int64_t c0 = 0;
    for (; c0 + 64 <= n; c0 += 64) {
        __m512i r[16], t[16];
        UNROLL for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512(rc + i * ldr + c0);
        /* words (row i, column group q) -> out[q] lane i */
        UNROLL for (int i = 0; i < 16; i += 2) {
            t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
            t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
        }
        UNROLL for (int i = 0; i < 16; i += 4) {
            r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
            r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
            r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
            r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
        }
        /* r[4b + k] holds, per 128-bit lane L, rows 4b..4b+3 of column group 4L + k */
        UNROLL for (int k = 0; k < 4; k++) {
            t[k] = _mm512_shuffle_i32x4(r[k], r[4 + k], 0x88);      /* lanes 0, 2 of rows 0-3 and 4-7 */
            t[4 + k] = _mm512_shuffle_i32x4(r[k], r[4 + k], 0xDD);  /* lanes 1, 3 */
            t[8 + k] = _mm512_shuffle_i32x4(r[8 + k], r[12 + k], 0x88);
            t[12 + k] = _mm512_shuffle_i32x4(r[8 + k], r[12 + k], 0xDD);
        }
        UNROLL for (int k = 0; k < 4; k++) {
            /* column group 4L + k: rows 0-7 from t[k] / t[4 + k], rows 8-15 from t[8 + k] / t[12 + k] */
            const __m512i g0 = _mm512_shuffle_i32x4(t[k], t[8 + k], 0x88);      /* L 0 */
            const __m512i g2 = _mm512_shuffle_i32x4(t[k], t[8 + k], 0xDD);      /* L 2 */
            const __m512i g1 = _mm512_shuffle_i32x4(t[4 + k], t[12 + k], 0x88); /* L 1 */
            const __m512i g3 = _mm512_shuffle_i32x4(t[4 + k], t[12 + k], 0xDD); /* L 3 */
            uint8_t *o = wg + (c0 / 4) * 64;
            _mm512_storeu_si512(o + (0 + k) * 64, g0);
            _mm512_storeu_si512(o + (4 + k) * 64, g1);
            _mm512_storeu_si512(o + (8 + k) * 64, g2);
            _mm512_storeu_si512(o + (12 + k) * 64, g3);
        }
    }
    if (c0 < n) dhsa__qi_pack16(rc + c0, ldr, n - c0, wg + (c0 / 4) * 64);
}

/* the three readings of dhsa__qi_kform */
static void ktile(const uint8_t *w, const int32_t *S, const int32_t *M2, const float *D, const float *Dm, int64_t n,
                  int bw, int z, int has_min, const dhsa_qi_act *x, float *out, int64_t ldo, int accumulate) {
    (void)has_min;
    if (bw == 32) /* Q4_K, Q5_K: z 0, a min */
        ktile_bw(w, S, M2, D, Dm, n, 32, 0, 1, x, out, ldo, accumulate);
    else if (z) /* Q6_K, Q3_K: no min */
        ktile_bw(w, S, M2, D, Dm, n, 16, 1, 0, x, out, ldo, accumulate);
    else /* Q2_K: z 0, a min */
        ktile_bw(w, S, M2, D, Dm, n, 16, 0, 1, x, out, ldo, accumulate);
}

const dhsa__qi_kernels dhsa__qi_vnni = {"avx512-vnni", MR, NG, MAX_TOK_FUSED, R, quant_act, unpack, dot_rows, tile,
                                        dot_file, ktile, KMR, pack16, NULL};

#elif defined(__x86_64__)
#include "matmul/int8.h"
/* Built without AVX512-VNNI: no kernels (dhsa__qi_kernels_active sees the NULL name). */
const dhsa__qi_kernels dhsa__qi_vnni = {NULL, 0, 0, 0, 0, NULL, NULL, NULL, NULL, NULL, NULL, 0, NULL, NULL};
#else
typedef int dhsa__qi_vnni_unused; /* ISO C forbids an empty file */
#endif
