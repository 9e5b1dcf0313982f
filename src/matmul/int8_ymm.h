/* int8_ymm.h: the 256-bit kernels of the integer path (contract in
 * int8.h), written once and compiled twice: by int8_avx2.c (-mavx2 -mfma
 * -mf16c: the dot of four unsigned codes with four signed activations is
 * vpmaddubsw + vpmaddwd) and by int8_avxvnni.c (plus -mavxvnni: one
 * vpdpbusd on ymm). Each of them defines QI_YMM_VNNI (0 or 1) and
 * QI_YMM_KERNELS (the table to define), then includes this file; nothing
 * else does.
 *
 * Exactness of vpmaddubsw (AVX2 only; vpdpbusd sums in 32 bits). It
 * multiplies unsigned bytes by signed bytes and adds adjacent pairs into
 * int16 WITH SATURATION, and a pair of codes c <= 255 with activations
 * |q| <= 127 reaches 2 * 255 * 127 = 64770 > 32767. So:
 *   narrow types (largest code <= 129; all but Q8_0, IQ4_NL and IQ4_XS,
 *     whose largest code is 63, Q6_K's): |c0 q0 + c1 q1| <= 2 * 129 * 127
 *     = 32766: the codes go in as they are, exact;
 *   wide types (codes up to 255): with s = c - 128 in [-128, 127],
 *     sum c q = sum s q + 128 sum q, and s q = |s| (sign(s) q), |s| <= 128
 *     read unsigned (vpabsb of -128 is 0x80 = 128) and sign(s) q (vpsignb)
 *     in [-127, 127] (q is never -128, the value vpsignb cannot negate):
 *     |pair| <= 2 * 128 * 127 = 32512, exact; 128 sum q is added in 32 bits.
 * Which form runs follows the type's largest code (dhsa__qi_code_max, the
 * kernels' cmax argument). Every lane then holds the exact integer the
 * scalar kernel forms, and the float steps are the scalar kernels': the
 * panel tile is bitwise the scalar tile. tests/test_qint.c checks that, and
 * that a wide type pushed through the narrow form (a wrong cmax) fails.
 *
 *   quant_act  max |x| over the scale group, then four ymm per block of
 *              32: one rounding multiply, packs; bitwise the scalar
 *              quantizer.
 *   unpack     every type with byte operations (bitwise the scalar
 *              unpacker, which any other type would call).
 *   dot_rows   fused path, 4 rows x up to 2 tokens per pass: per 32 codes
 *              one dot per row and token, its 8 lanes (8 or 4 per weight
 *              block) converted and scaled by a*xd per lane; lane order.
 *   tile       panel path: 3 tokens x 16 rows (two ymm of 8 rows x 4
 *              codes per four columns) on a broadcast of four activation
 *              codes; per weight block the contract's two FMA per lane, in
 *              block order.
 *   ktile      the K types' super-block panel: 3 tokens x 16 rows, integer
 *              sums per 256 values, one float step per super-block;
 *              bitwise dhsa__qi_ktile_scalar (docs/quant.md).
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "matmul/int8.h"
#include "matmul/int8_kscale.h"

#define INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 16")
#define MR 3 /* panel tile tokens: with 4 the float sums spilled (16 ymm); 3 is 1.17x (docs/notes/results-models.md) */
#define NG 1
#if QI_YMM_VNNI
#define GROUP_UNROLL UNROLL
#else
#define GROUP_UNROLL _Pragma("GCC unroll 1")
#endif

#define R 4             /* fused path: rows per call */
#define TMAX 2          /* fused path: tokens per pass over the unpacked rows (16 ymm) */
#define MAX_TOK_FUSED 4 /* as the AVX512-VNNI kernels */
#define NARROW_MAX 129  /* the largest code whose pairs cannot saturate vpmaddubsw */
#define WIDE_OF(cmax) (!QI_YMM_VNNI && (cmax) > NARROW_MAX)

static inline float half(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

INLINE int hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

INLINE float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

INLINE float hmax_ps(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* ------------------------------------------------- integer dot product --- */

/* A weight vector of 32 codes as the dot takes it: the codes (narrow, and
 * every type with VNNI), or s = c - 128 and |s| (wide). */
typedef struct {
    __m256i s, u;
} wvec;

INLINE wvec wprep(__m256i c, const int WIDE) {
    wvec w;
    w.s = c;
    w.u = c;
    if (WIDE) {
        w.s = _mm256_xor_si256(c, _mm256_set1_epi8((char)0x80));
        w.u = _mm256_abs_epi8(w.s);
    }
    return w;
}

/* acc + per lane l (8) the sum over k < 4 of code[4l + k] * q[4l + k]
 * (narrow, VNNI), or of (code - 128) * q (wide: see the top; wide_fix adds
 * the rest). */
INLINE __m256i dot(__m256i acc, wvec w, __m256i q, const int WIDE) {
#if QI_YMM_VNNI
    (void)WIDE;
    return _mm256_dpbusd_avx_epi32(acc, w.s, q);
#else
    __m256i p = WIDE ? _mm256_maddubs_epi16(w.u, _mm256_sign_epi8(q, w.s)) : _mm256_maddubs_epi16(w.s, q);
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
#endif
}

/* What the wide dot leaves out, per lane: 128 * (the lane's four codes). */
INLINE __m256i wide_fix(__m256i q) {
    __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q), _mm256_set1_epi16(1));
    return _mm256_slli_epi32(p, 7);
}

/* The sum of BW (16 or 32) activation codes: sad of q + 128 against 0. */
INLINE int qsum(const int8_t *q, const int BW) {
    if (BW == 32) {
        __m256i v = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)q), _mm256_set1_epi8((char)0x80));
        __m256i s = _mm256_sad_epu8(v, _mm256_setzero_si256());
        __m128i t = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        t = _mm_add_epi64(t, _mm_unpackhi_epi64(t, t));
        return _mm_cvtsi128_si32(t) - 128 * 32;
    }
    __m128i v = _mm_xor_si128(_mm_loadu_si128((const __m128i *)q), _mm_set1_epi8((char)0x80));
    __m128i s = _mm_sad_epu8(v, _mm_setzero_si128());
    s = _mm_add_epi64(s, _mm_unpackhi_epi64(s, s));
    return _mm_cvtsi128_si32(s) - 128 * 16;
}

/* ------------------------------------------------------- activations --- */

static void quant_act(const float *x, int64_t n, int bw, int sb, int8_t *q, float *xd, float *xs) {
    const __m256 zero = _mm256_setzero_ps(), sign = _mm256_set1_ps(-0.0f);
    const __m256i order = _mm256_set_epi32(7, 3, 6, 2, 5, 1, 4, 0); /* undo the packs' lane interleave */
    for (int64_t g = 0; g < n / sb; g++) {
        /* the group's max |x| and NaN/Inf probe (any order: a max is exact) */
        __m256 m = zero, pr = zero;
        for (int k = 0; k < sb / 8; k++) {
            __m256 v = _mm256_loadu_ps(x + sb * g + 8 * k);
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v));
            pr = _mm256_add_ps(pr, _mm256_mul_ps(v, zero));
        }
        float amax = hmax_ps(m), probe = hsum_ps(pr);
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        const __m256 vid = _mm256_set1_ps(id);
        for (int64_t i = g * (sb / 32); i < (g + 1) * (sb / 32); i++) {
            if (probe != 0.0f) { /* NaN or Inf in the group (amax may not show it) */
                dhsa__qi_put_nan_block(q, xd, xs, i, bw);
                continue;
            }
            __m256i qi[4];
            for (int k = 0; k < 4; k++)
                qi[k] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 32 * i + 8 * k), vid),
                                                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
            _mm256_storeu_si256((__m256i *)(q + 32 * i), _mm256_permutevar8x32_epi32(p, order));
            int s0 = hsum_i32(_mm256_add_epi32(qi[0], qi[1])), s1 = hsum_i32(_mm256_add_epi32(qi[2], qi[3]));
            dhsa__qi_put_block(xd, xs, i, bw, d, s0, s1);
        }
    }
}

/* ---------------------------------------------------------- unpacking --- */

/* 16 bytes of nibbles -> 32 codes: the low nibbles, then the high ones. */
INLINE __m256i nibbles(const uint8_t *qs) {
    const __m128i v = _mm_loadu_si128((const __m128i *)qs), m4 = _mm_set1_epi8(15);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m4), _mm_and_si128(v, m4));
}

/* Per byte of v: val where bit (a one-bit mask) is set, else 0. */
INLINE __m256i bit_as(__m256i v, int bit, int val) {
    const __m256i m = _mm256_set1_epi8((char)bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, m), m), _mm256_set1_epi8((char)val));
}

/* Q3_K's 6-bit scale j (int8.c's q3k_scale). */
static inline int q3k_scale(const uint8_t *s, int j) {
    int lo = j < 8 ? s[j] & 15 : s[j - 8] >> 4;
    return lo | ((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4;
}

/* 32 bits -> 32 bytes of 16 (bit set) or 0: the fifth bit of Q5_0 / Q5_1. */
INLINE __m256i high_bits(const uint8_t *qh) {
    uint32_t h;
    memcpy(&h, qh, 4);
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h), _mm256_set_epi64x(0x0303030303030303ll, 0x0202020202020202ll,
                                                                                           0x0101010101010101ll, 0));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(16));
}

static void unpack(uint32_t type, const uint8_t *row, int64_t k0, int64_t kn, uint8_t *c, float *a, float *b) {
    const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(3);
    /* iq4_grid + 128 (int8.c), looked up per nibble */
    const __m256i grid = _mm256_setr_epi8(1, 24, 45, 63, 79, 93, 106, 118, (char)129, (char)141, (char)153, (char)166,
                                          (char)181, (char)197, (char)217, (char)241, 1, 24, 45, 63, 79, 93, 106, 118,
                                          (char)129, (char)141, (char)153, (char)166, (char)181, (char)197, (char)217,
                                          (char)241);
    switch (type) {
    case DHSA_GGML_Q4_0:
    case DHSA_GGML_Q4_1:
    case DHSA_GGML_Q5_0:
    case DHSA_GGML_Q5_1:
    case DHSA_GGML_IQ4_NL: {
        const int64_t bb = dhsa__wt_block_bytes(type);
        const int qs_at = type == DHSA_GGML_Q5_0 ? 6 : type == DHSA_GGML_Q5_1 ? 8 : type == DHSA_GGML_Q4_1 ? 4 : 2;
        for (int64_t i = 0; i < kn / 32; i++, c += 32) {
            const uint8_t *blk = row + (k0 / 32 + i) * bb;
            __m256i v = nibbles(blk + qs_at);
            if (type == DHSA_GGML_Q5_0) v = _mm256_or_si256(v, high_bits(blk + 2));
            if (type == DHSA_GGML_Q5_1) v = _mm256_or_si256(v, high_bits(blk + 4));
            if (type == DHSA_GGML_IQ4_NL) v = _mm256_shuffle_epi8(grid, v);
            _mm256_storeu_si256((__m256i *)c, v);
            const float d = half(blk);
            a[i] = d;
            switch (type) {
            case DHSA_GGML_Q4_0: b[i] = -8.0f * d; break;
            case DHSA_GGML_Q5_0: b[i] = -16.0f * d; break;
            case DHSA_GGML_IQ4_NL: b[i] = -128.0f * d; break;
            default: b[i] = half(blk + 2); break; /* Q4_1, Q5_1: m */
            }
        }
        return;
    }
    case DHSA_GGML_IQ4_XS:
        for (int64_t i = 0; i < kn / 256; i++, c += 256, a += 8, b += 8) {
            const uint8_t *blk = row + (k0 / 256 + i) * 136;
            const float d = half(blk);
            const unsigned sh = (unsigned)blk[2] | (unsigned)blk[3] << 8;
            for (int ib = 0; ib < 8; ib++) {
                _mm256_storeu_si256((__m256i *)(c + 32 * ib), _mm256_shuffle_epi8(grid, nibbles(blk + 8 + 16 * ib)));
                const int ls = ((blk[4 + ib / 2] >> (4 * (ib % 2))) & 15) | ((sh >> (2 * ib)) & 3) << 4;
                a[ib] = d * (float)(ls - 32);
                b[ib] = -128.0f * a[ib];
            }
        }
        return;
    case DHSA_GGML_Q8_0: {
        const __m256i flip = _mm256_set1_epi8((char)0x80);
        for (int64_t i = 0; i < kn / 32; i++, c += 32) {
            const uint8_t *blk = row + (k0 / 32 + i) * 34;
            _mm256_storeu_si256((__m256i *)c, _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk + 2)), flip));
            float d = half(blk);
            a[i] = d;
            b[i] = -128.0f * d;
        }
        return;
    }
    case DHSA_GGML_Q4_K:
    case DHSA_GGML_Q5_K:
        for (int64_t i = 0; i < kn / 256; i++, c += 256, a += 8, b += 8) {
            const int five = type == DHSA_GGML_Q5_K;
            const uint8_t *blk = row + (k0 / 256 + i) * (five ? 176 : 144);
            const __m256 d = _mm256_set1_ps(half(blk)), ndmin = _mm256_set1_ps(-half(blk + 2));
            const __m256i qh = five ? _mm256_loadu_si256((const __m256i *)(blk + 16)) : _mm256_setzero_si256();
            for (int u = 0; u < 4; u++) {
                __m256i v = _mm256_loadu_si256((const __m256i *)(blk + (five ? 48 : 16) + 32 * u));
                __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                if (five) { /* bit 2u (low nibbles) and 2u + 1 (high) of qh[l]: the fifth bit */
                    lo = _mm256_or_si256(lo, bit_as(qh, 1 << (2 * u), 16));
                    hi = _mm256_or_si256(hi, bit_as(qh, 1 << (2 * u + 1), 16));
                }
                _mm256_storeu_si256((__m256i *)(c + 64 * u), lo);
                _mm256_storeu_si256((__m256i *)(c + 64 * u + 32), hi);
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
                _mm256_storeu_si256((__m256i *)cc, p0);
                _mm256_storeu_si256((__m256i *)(cc + 32), p1);
                _mm256_storeu_si256((__m256i *)(cc + 64), p2);
                _mm256_storeu_si256((__m256i *)(cc + 96), p3);
            }
            for (int j = 0; j < 16; j++) {
                a[j] = d * (float)sc[j];
                b[j] = -32.0f * a[j];
            }
        }
        return;
    case DHSA_GGML_Q2_K:
    case DHSA_GGML_Q3_K:
        for (int64_t i = 0; i < kn / 256; i++, c += 256, a += 16, b += 16) {
            const int q2 = type == DHSA_GGML_Q2_K;
            const uint8_t *blk = row + (k0 / 256 + i) * (q2 ? 84 : 110);
            const float d = half(blk + (q2 ? 80 : 108)), dmin = q2 ? half(blk + 82) : 0.0f;
            const __m256i hm = q2 ? _mm256_setzero_si256() : _mm256_loadu_si256((const __m256i *)blk);
            /* value 128 n + 32 j + k (k < 32): bits 2j of qs[32 n + k], plus
             * 4 where bit 4n + j of hmask[k] is set (Q3_K) */
            for (int n = 0; n < 2; n++) {
                const __m256i x = _mm256_loadu_si256((const __m256i *)(blk + (q2 ? 16 : 32) + 32 * n));
                for (int j = 0; j < 4; j++) {
                    __m256i v = _mm256_and_si256(_mm256_srli_epi16(x, 2 * j), m2);
                    if (!q2) v = _mm256_or_si256(v, bit_as(hm, 1 << (4 * n + j), 4));
                    _mm256_storeu_si256((__m256i *)(c + 128 * n + 32 * j), v);
                }
            }
            for (int j = 0; j < 16; j++) {
                if (q2) {
                    a[j] = d * (float)(blk[j] & 15);
                    b[j] = -(dmin * (float)(blk[j] >> 4));
                } else {
                    a[j] = d * (float)(q3k_scale(blk + 96, j) - 32);
                    b[j] = -4.0f * a[j];
                }
            }
        }
        return;
    default: dhsa__qi_unpack_scalar(type, row, k0, kn, c, a, b); return;
    }
}

/* -------------------------------------------------------- fused path --- */

/* R rows x NT tokens, weight blocks of BW, narrow or WIDE (compile-time
 * constants: the R * NT accumulators stay in registers). */
INLINE void dot_nt(const uint8_t *c, int64_t ldc, const float *a, const float *b, int64_t ldab, int64_t n,
                   const int BW, const int WIDE, const dhsa_qi_act *x, const int NT, float *y, int64_t ldy, int nr,
                   int accumulate) {
    const int64_t nb = n / BW;
    float ax[R][TMAX][256]; /* ax[r][t][j] = a_rj * xd_t (block j of this chunk) */
    const __m256i dup = _mm256_set_epi32(3, 3, 2, 2, 1, 1, 0, 0), idx16 = _mm256_set_epi32(1, 1, 1, 1, 0, 0, 0, 0);
    float res[R][TMAX];
    for (int64_t j0 = 0; j0 < nb; j0 += 256) {
        const int64_t jn = nb - j0 < 256 ? nb - j0 : 256;
        __m256 acc[R][TMAX];
        float tail[R][TMAX];
        /* the scales of this chunk, and the b * xs terms */
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < NT; t++) {
            const float *ar = a + r * ldab + j0, *br = b + r * ldab + j0, *xs = x[t].xs + j0;
            __m256 bx = _mm256_setzero_ps();
            int64_t j = 0;
            for (; j + 8 <= jn; j += 8) {
                __m256 xdv = BW == 32 ? _mm256_loadu_ps(x[t].xd + j0 + j)
                                      : _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(x[t].xd + (j0 + j) / 2)), dup);
                _mm256_storeu_ps(ax[r][t] + j, _mm256_mul_ps(_mm256_loadu_ps(ar + j), xdv));
                bx = _mm256_fmadd_ps(_mm256_loadu_ps(br + j), _mm256_loadu_ps(xs + j), bx);
            }
            float tl = 0.0f;
            for (; j < jn; j++) {
                ax[r][t][j] = ar[j] * x[t].xd[(j0 + j) * BW / 32];
                tl = fmaf(br[j], xs[j], tl);
            }
            acc[r][t] = bx;
            tail[r][t] = tl;
        }
        const int64_t v1 = (j0 + jn) * BW;
        int64_t jl = 0;
        for (int64_t v = j0 * BW; v < v1; v += 32, jl += 32 / BW) {
            __m256i xv[TMAX], fix[TMAX];
            UNROLL for (int t = 0; t < NT; t++) {
                xv[t] = _mm256_loadu_si256((const __m256i *)(x[t].q + v));
                fix[t] = WIDE ? wide_fix(xv[t]) : _mm256_setzero_si256();
            }
            UNROLL for (int r = 0; r < R; r++) {
                const wvec w = wprep(_mm256_loadu_si256((const __m256i *)(c + r * ldc + v)), WIDE);
                UNROLL for (int t = 0; t < NT; t++) {
                    __m256i p = dot(fix[t], w, xv[t], WIDE);
                    __m256 s = BW == 32 ? _mm256_broadcast_ss(ax[r][t] + jl)
                                        : _mm256_permutevar8x32_ps(
                                              _mm256_castps128_ps256(_mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)(ax[r][t] + jl)))),
                                              idx16);
                    acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), s, acc[r][t]);
                }
            }
        }
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < NT; t++) {
            float sum = hsum_ps(acc[r][t]) + tail[r][t];
            res[r][t] = j0 == 0 ? sum : res[r][t] + sum;
        }
    }
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < NT; t++) y[t * ldy + r] = accumulate ? y[t * ldy + r] + res[r][t] : res[r][t];
}

#define DOT_CASE(NT)                                                                                               \
    case NT:                                                                                                       \
        if (bw == 32 && wide) dot_nt(c, ldc, a, b, ldab, n, 32, 1, x + t0, NT, y + t0 * ldy, ldy, nr, accumulate); \
        else if (bw == 32) dot_nt(c, ldc, a, b, ldab, n, 32, 0, x + t0, NT, y + t0 * ldy, ldy, nr, accumulate);   \
        else if (wide) dot_nt(c, ldc, a, b, ldab, n, 16, 1, x + t0, NT, y + t0 * ldy, ldy, nr, accumulate);       \
        else dot_nt(c, ldc, a, b, ldab, n, 16, 0, x + t0, NT, y + t0 * ldy, ldy, nr, accumulate);                  \
        break;

static void dot_rows(const uint8_t *c, int64_t ldc, const float *a, const float *b, int64_t ldab, int nr, int64_t n,
                     int bw, int cmax, const dhsa_qi_act *x, int n_tok, float *y, int64_t ldy, int accumulate) {
    const int wide = WIDE_OF(cmax);
    for (int t0 = 0; t0 < n_tok; t0 += TMAX) {
        switch (n_tok - t0 < TMAX ? n_tok - t0 : TMAX) {
            DOT_CASE(1)
            DOT_CASE(2)
        default: break;
        }
    }
}

/* -------------------------------------------------------- panel path --- */

INLINE void tile_bw(const uint8_t *w, const float *a, const float *b, int64_t n, const int BW, const int WIDE,
                    const dhsa_qi_act *x, float *out) {
    const int64_t nb = n / BW, qpb = BW / 4;
    __m256 f[MR][2];
    UNROLL for (int t = 0; t < MR; t++) {
        f[t][0] = _mm256_loadu_ps(out + t * 16);
        f[t][1] = _mm256_loadu_ps(out + t * 16 + 8);
    }
    for (int64_t j = 0; j < nb; j++) {
        __m256i s[MR][2];
        UNROLL for (int t = 0; t < MR; t++) s[t][0] = s[t][1] = _mm256_setzero_si256();
        /* AVX-VNNI: unrolled over the block (qpb is a constant); as a loop
         * GCC copied the integer sums every group (as in int8_vnni.c).
         * AVX2 keeps the loop: unrolled, its wider dot spilled (0.7x). */
        GROUP_UNROLL for (int64_t u = 0; u < qpb; u++) {
            const int64_t qd = j * qpb + u;
            const wvec w0 = wprep(_mm256_loadu_si256((const __m256i *)(w + qd * 64)), WIDE);
            const wvec w1 = wprep(_mm256_loadu_si256((const __m256i *)(w + qd * 64 + 32)), WIDE);
            UNROLL for (int t = 0; t < MR; t++) {
                int32_t four;
                memcpy(&four, x[t].q + 4 * qd, 4);
                const __m256i xb = _mm256_set1_epi32(four);
                s[t][0] = dot(s[t][0], w0, xb, WIDE);
                s[t][1] = dot(s[t][1], w1, xb, WIDE);
            }
        }
        const __m256 A0 = _mm256_loadu_ps(a + j * 16), A1 = _mm256_loadu_ps(a + j * 16 + 8);
        const __m256 B0 = _mm256_loadu_ps(b + j * 16), B1 = _mm256_loadu_ps(b + j * 16 + 8);
        const int64_t jd = j * BW / 32;
        UNROLL for (int t = 0; t < MR; t++) {
            if (WIDE) {
                const __m256i fix = _mm256_set1_epi32(128 * qsum(x[t].q + j * BW, BW));
                s[t][0] = _mm256_add_epi32(s[t][0], fix);
                s[t][1] = _mm256_add_epi32(s[t][1], fix);
            }
            const __m256 xdv = _mm256_set1_ps(x[t].xd[jd]), xsv = _mm256_set1_ps(x[t].xs[j]);
            f[t][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t][0]), _mm256_mul_ps(A0, xdv), f[t][0]);
            f[t][0] = _mm256_fmadd_ps(B0, xsv, f[t][0]);
            f[t][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t][1]), _mm256_mul_ps(A1, xdv), f[t][1]);
            f[t][1] = _mm256_fmadd_ps(B1, xsv, f[t][1]);
        }
    }
    UNROLL for (int t = 0; t < MR; t++) {
        _mm256_storeu_ps(out + t * 16, f[t][0]);
        _mm256_storeu_ps(out + t * 16 + 8, f[t][1]);
    }
}

static void tile(const uint8_t *w, const float *a, const float *b, int64_t n, int bw, int cmax, const dhsa_qi_act *x,
                 float *out) {
    const int wide = WIDE_OF(cmax);
    if (bw == 32 && wide) tile_bw(w, a, b, n, 32, 1, x, out);
    else if (bw == 32) tile_bw(w, a, b, n, 32, 0, x, out);
    else if (wide) tile_bw(w, a, b, n, 16, 1, x, out);
    else tile_bw(w, a, b, n, 16, 0, x, out);
}

/* -------------------------------------- fused path, Q4_K and Q5_K --- */

/* Q4_K / Q5_K rows straight from the file's super-blocks (activations with
 * one scale per 256 values, int8.h), one row at a time, up to KT tokens
 * per pass: per 32 codes (the low or high nibbles of 32 qs bytes, in the
 * activations' order) one vpmaddubsw against the activation codes (pairs
 * in 16 bits: at most 2 * 31 * 127, no saturation) and the pairs times
 * the sub-block's integer scale into 32-bit lanes (vpmaddwd and an add;
 * AVX-VNNI: vpdpwssd), the super-block's sum of sc_j * isum_j exact; then
 * one float step by fl(d * xd), and the mins b_j * xs_j as one FMA. The
 * scales come from memory as broadcasts (loads, off the vector ports).
 * Within float rounding of dot_rows (tests/test_qint.c). */
#define KT 2

INLINE __m256i kdot(__m256i acc, __m256i c, const int8_t *x, __m256i sc) {
    const __m256i p = _mm256_maddubs_epi16(c, _mm256_loadu_si256((const __m256i *)x));
#if QI_YMM_VNNI
    return _mm256_dpwssd_avx_epi32(acc, p, sc);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, sc));
#endif
}

#ifndef YPF_FAR
#define YPF_FAR 64 /* super-blocks */
#endif
INLINE void k45_row(const uint8_t *rw, int64_t n, const dhsa_qi_act *x, const int NT, const int FIVE, float *y,
                    int64_t ldy, int accumulate) {
    const int64_t ns = n / 256, bb = FIVE ? 176 : 144;
    const __m256i m4 = _mm256_set1_epi8(15);
    __m256 acc[KT];
    UNROLL for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t s = 0; s < ns; s++) {
        const uint8_t *blk = rw + s * bb;
        if (s % 2 == 0) { /* 2 super-blocks, 16 ahead (past the row: the next row's), and into L2 YPF_FAR ahead */
            for (int64_t e = 0; e < 2 * bb; e += 64) _mm_prefetch((const char *)(blk + 16 * bb + e), _MM_HINT_T0);
            for (int64_t e = 0; e < 2 * bb; e += 64) _mm_prefetch((const char *)(blk + YPF_FAR * bb + e), _MM_HINT_T1);
        }
        uint32_t u0, u1, u2;
        memcpy(&u0, blk + 4, 4);
        memcpy(&u1, blk + 8, 4);
        memcpy(&u2, blk + 12, 4);
        const uint64_t sc = (uint64_t)(u0 & 0x3f3f3f3fu) | (uint64_t)((u2 & 0x0f0f0f0fu) | ((u0 >> 6) & 0x03030303u) << 4) << 32;
        const uint64_t mn =
            (uint64_t)(u1 & 0x3f3f3f3fu) | (uint64_t)(((u2 >> 4) & 0x0f0f0f0fu) | ((u1 >> 6) & 0x03030303u) << 4) << 32;
        /* each scale as a 16-bit pair in a 32-bit word, broadcast from memory below */
        int32_t scd[8];
        const __m256i sw = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc));
        _mm256_storeu_si256((__m256i *)scd, _mm256_or_si256(sw, _mm256_slli_epi32(sw, 16)));
        const float d = half(blk), dmin = half(blk + 2);
        /* b_j = -(dmin m_j), as the unpacking's */
        const __m256 bm = _mm256_mul_ps(_mm256_set1_ps(-dmin),
                                        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)mn))));
        const __m256i qh = FIVE ? _mm256_loadu_si256((const __m256i *)(blk + 16)) : _mm256_setzero_si256();
        __m256i ai[KT];
        UNROLL for (int t = 0; t < NT; t++) ai[t] = _mm256_setzero_si256();
        UNROLL for (int u = 0; u < 4; u++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + (FIVE ? 48 : 16) + 32 * u));
            __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            if (FIVE) { /* bit 2u (low nibbles) and 2u + 1 (high) of qh[l]: the fifth bit */
                lo = _mm256_or_si256(lo, bit_as(qh, 1 << (2 * u), 16));
                hi = _mm256_or_si256(hi, bit_as(qh, 1 << (2 * u + 1), 16));
            }
            const __m256i sl = _mm256_set1_epi32(scd[2 * u]), sh = _mm256_set1_epi32(scd[2 * u + 1]);
            UNROLL for (int t = 0; t < NT; t++) {
                const int8_t *xq = x[t].q + 256 * s + 64 * u;
                ai[t] = kdot(ai[t], lo, xq, sl);
                ai[t] = kdot(ai[t], hi, xq + 32, sh);
            }
        }
        UNROLL for (int t = 0; t < NT; t++) {
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ai[t]), _mm256_set1_ps(d * x[t].xd[8 * s]), acc[t]);
            acc[t] = _mm256_fmadd_ps(bm, _mm256_loadu_ps(x[t].xs + 8 * s), acc[t]);
        }
    }
    UNROLL for (int t = 0; t < NT; t++) {
        const float v = hsum_ps(acc[t]);
        y[t * ldy] = accumulate ? y[t * ldy] + v : v;
    }
}

/* Q6_K rows (210-byte blocks: ql[128], qh[64], int8 scales[16], d),
 * one at a time as k45_row: per 32 codes c[128 nh + 32 p + l] =
 * (ql[64 nh + 32 (p & 1) + l] >> 4 (p >> 1)) & 15 | ((qh[32 nh + l] >> 2p)
 * & 3) << 4 (at most 63: pairs of at most 2 * 63 * 127, no saturation),
 * whose 16 pairs are two sub-blocks of 16: the scale vector holds one
 * scale per 128-bit half. b_j = -32 a_j. */
INLINE void k6_row(const uint8_t *rw, int64_t n, const dhsa_qi_act *x, const int NT, float *y, int64_t ldy,
                   int accumulate) {
    const int64_t ns = n / 256;
    const __m256i m4 = _mm256_set1_epi8(15), m30 = _mm256_set1_epi8(0x30), lo16 = _mm256_set1_epi32(0xFFFF);
    const __m256i halves = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    __m256 acc[KT];
    UNROLL for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t s = 0; s < ns; s++) {
        const uint8_t *blk = rw + s * 210;
        if (s % 2 == 0) { /* 2 super-blocks, 16 ahead (past the row: the next row's), and into L2 YPF_FAR ahead */
            for (int64_t e = 0; e < 2 * 210; e += 64) _mm_prefetch((const char *)(blk + 16 * 210 + e), _MM_HINT_T0);
            for (int64_t e = 0; e < 2 * 210; e += 64) _mm_prefetch((const char *)(blk + YPF_FAR * 210 + e), _MM_HINT_T1);
        }
        /* each scale as a 16-bit pair in a 32-bit word, in memory */
        int32_t scd[16];
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)(blk + 192));
        const __m256i s0 = _mm256_cvtepi8_epi32(sc8), s1 = _mm256_cvtepi8_epi32(_mm_srli_si128(sc8, 8));
        _mm256_storeu_si256((__m256i *)scd, _mm256_or_si256(_mm256_and_si256(s0, lo16), _mm256_slli_epi32(s0, 16)));
        _mm256_storeu_si256((__m256i *)(scd + 8), _mm256_or_si256(_mm256_and_si256(s1, lo16), _mm256_slli_epi32(s1, 16)));
        const float d = half(blk + 208);
        /* b_j = -32 a_j, a_j = d sc_j, as the unpacking's */
        const __m256 dv = _mm256_set1_ps(d), m32 = _mm256_set1_ps(-32.0f);
        const __m256 b0 = _mm256_mul_ps(_mm256_mul_ps(dv, _mm256_cvtepi32_ps(s0)), m32);
        const __m256 b1 = _mm256_mul_ps(_mm256_mul_ps(dv, _mm256_cvtepi32_ps(s1)), m32);
        __m256i ai[KT];
        UNROLL for (int t = 0; t < NT; t++) ai[t] = _mm256_setzero_si256();
        UNROLL for (int nh = 0; nh < 2; nh++) {
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)(blk + 64 * nh));
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(blk + 64 * nh + 32));
            const __m256i h = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * nh));
            __m256i c[4];
            c[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(h, 4), m30));
            c[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(h, 2), m30));
            c[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(h, m30));
            c[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                   _mm256_and_si256(_mm256_srli_epi16(h, 2), m30));
            UNROLL for (int p = 0; p < 4; p++) {
                const int j = 8 * nh + 2 * p; /* the sub-blocks j, j + 1 */
                const __m256i sv =
                    _mm256_permutevar8x32_epi32(_mm256_castsi128_si256(_mm_loadl_epi64((const __m128i *)(scd + j))), halves);
                UNROLL for (int t = 0; t < NT; t++) ai[t] = kdot(ai[t], c[p], x[t].q + 256 * s + 128 * nh + 32 * p, sv);
            }
        }
        UNROLL for (int t = 0; t < NT; t++) {
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ai[t]), _mm256_set1_ps(d * x[t].xd[8 * s]), acc[t]);
            acc[t] = _mm256_fmadd_ps(b0, _mm256_loadu_ps(x[t].xs + 16 * s), acc[t]);
            acc[t] = _mm256_fmadd_ps(b1, _mm256_loadu_ps(x[t].xs + 16 * s + 8), acc[t]);
        }
    }
    UNROLL for (int t = 0; t < NT; t++) {
        const float v = hsum_ps(acc[t]);
        y[t * ldy] = accumulate ? y[t * ldy] + v : v;
    }
}

static void k45_1(const uint8_t *rw, int64_t n, const dhsa_qi_act *x, int five, float *y, int64_t ldy, int acc) {
    if (five) k45_row(rw, n, x, 1, 1, y, ldy, acc);
    else k45_row(rw, n, x, 1, 0, y, ldy, acc);
}
static void k45_2(const uint8_t *rw, int64_t n, const dhsa_qi_act *x, int five, float *y, int64_t ldy, int acc) {
    if (five) k45_row(rw, n, x, 2, 1, y, ldy, acc);
    else k45_row(rw, n, x, 2, 0, y, ldy, acc);
}

static void k6_1(const uint8_t *rw, int64_t n, const dhsa_qi_act *x, int five, float *y, int64_t ldy, int acc) {
    (void)five;
    k6_row(rw, n, x, 1, y, ldy, acc);
}
static void k6_2(const uint8_t *rw, int64_t n, const dhsa_qi_act *x, int five, float *y, int64_t ldy, int acc) {
    (void)five;
    k6_row(rw, n, x, 2, y, ldy, acc);
}

static int dot_file(uint32_t type, const uint8_t *w, int64_t row_bytes, int nr, int64_t n, const dhsa_qi_act *x,
                    int n_tok, float *y, int64_t ldy, int accumulate) {
    if (nr <= 0) /* a probe (int8.h) */
        return type == DHSA_GGML_Q4_K || type == DHSA_GGML_Q5_K || type == DHSA_GGML_Q6_K;
    if (type == DHSA_GGML_Q6_K) {
        for (int r = 0; r < nr; r++)
            for (int t0 = 0; t0 < n_tok; t0 += KT)
                (n_tok - t0 >= 2 ? k6_2 : k6_1)(w + r * row_bytes, n, x + t0, 0, y + t0 * ldy + r, ldy, accumulate);
        return 1;
    }
    if (type != DHSA_GGML_Q4_K && type != DHSA_GGML_Q5_K) return 0;
    const int five = type == DHSA_GGML_Q5_K;
    for (int r = 0; r < nr; r++)
        for (int t0 = 0; t0 < n_tok; t0 += KT)
            (n_tok - t0 >= 2 ? k45_2 : k45_1)(w + r * row_bytes, n, x + t0, five, y + t0 * ldy + r, ldy, accumulate);
    return 1;
}

/* ------------------------------------ the K types' super-block panel --- */

/* The K types' super-block panel (int8.h, ktile): KMR tokens x 16 rows
 * (one group: two ymm of 8 rows). Per weight block the 8-lane integer
 * sums start from the token's -z qsum_j (Q6_K, Q3_K), take the tile's dot
 * (vpmaddubsw and vpmaddwd; AVX-VNNI vpdpbusd) and are multiplied by the
 * block's integer scales (vpmulld) into the super-block's sum I; per
 * super-block one conversion and FMA with fl(d xd) per token and half,
 * and for the types with a min its integer sum of M_j qsum_j (vpmaddwd on
 * pairs of blocks; AVX-VNNI vpdpwssd) likewise: the per-block float steps
 * of tile (a conversion, a multiply and two FMA per block of 32 or 16)
 * become one vpmulld per block, as int8_vnni.c's ktile. Every K type's
 * codes are narrow (at most 63: its pairs cannot saturate vpmaddubsw).
 * Bitwise dhsa__qi_ktile_scalar (tests/test_qint.c). KMR: 3 tokens keep
 * the 12 integer sums and the two weight vectors in the 16 ymm (2 tokens
 * measured 0.92-0.96x on AVX2: docs/eval-real/ktile_ymm_2026-12-07/). */
#define KMR 3

INLINE __m256i pair_dot(__m256i acc, __m256i m, __m256i q) {
#if QI_YMM_VNNI
    return _mm256_dpwssd_avx_epi32(acc, m, q);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(m, q));
#endif
}

INLINE void ktile_bw(const uint8_t *w, const int32_t *S, const int32_t *M2, const float *D, const float *Dm,
                     int64_t n, const int bw, const int Z, const int MIN, const dhsa_qi_act *x, float *out, int64_t ldo,
                     int accumulate) {
    const int qpb = bw / 4, bps = 256 / bw;
    const int64_t ns = n / 256;
    for (int64_t s = 0; s < ns; s++) {
        __m256i I[KMR][2];
        UNROLL for (int t = 0; t < KMR; t++) I[t][0] = I[t][1] = _mm256_setzero_si256();
        for (int64_t j = s * bps; j < (s + 1) * bps; j++) {
            __m256i a[KMR][2];
            UNROLL for (int t = 0; t < KMR; t++) a[t][0] = a[t][1] = Z ? _mm256_set1_epi32(x[t].qz[j]) : _mm256_setzero_si256();
            const uint8_t *wj = w + j * qpb * 64;
            const int64_t xo = j * bw;
            GROUP_UNROLL for (int u = 0; u < qpb; u++) {
                const wvec v0 = wprep(_mm256_loadu_si256((const __m256i *)(wj + u * 64)), 0);
                const wvec v1 = wprep(_mm256_loadu_si256((const __m256i *)(wj + u * 64 + 32)), 0);
                UNROLL for (int t = 0; t < KMR; t++) {
                    int32_t four;
                    memcpy(&four, x[t].q + xo + 4 * u, 4);
                    const __m256i xb = _mm256_set1_epi32(four);
                    a[t][0] = dot(a[t][0], v0, xb, 0);
                    a[t][1] = dot(a[t][1], v1, xb, 0);
                }
            }
            const __m256i s0 = _mm256_loadu_si256((const __m256i *)(S + j * 16));
            const __m256i s1 = _mm256_loadu_si256((const __m256i *)(S + j * 16 + 8));
            UNROLL for (int t = 0; t < KMR; t++) {
                I[t][0] = _mm256_add_epi32(I[t][0], _mm256_mullo_epi32(a[t][0], s0));
                I[t][1] = _mm256_add_epi32(I[t][1], _mm256_mullo_epi32(a[t][1], s1));
            }
        }
        const __m256 d0 = _mm256_loadu_ps(D + s * 16), d1 = _mm256_loadu_ps(D + s * 16 + 8);
        UNROLL for (int t = 0; t < KMR; t++) {
            const __m256 xdv = _mm256_set1_ps(x[t].xd[s * 8]);
            float *o = out + t * ldo;
            const int rd = s > 0 || accumulate;
            const __m256 o0 = rd ? _mm256_loadu_ps(o) : _mm256_setzero_ps(), o1 = rd ? _mm256_loadu_ps(o + 8) : o0;
            __m256 f0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I[t][0]), _mm256_mul_ps(d0, xdv), o0);
            __m256 f1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I[t][1]), _mm256_mul_ps(d1, xdv), o1);
            if (MIN) {
                __m256i m0 = _mm256_setzero_si256(), m1 = _mm256_setzero_si256();
                for (int64_t p = s * bps / 2; p < (s + 1) * bps / 2; p++) {
                    int32_t pair;
                    memcpy(&pair, x[t].qs + 2 * p, 4);
                    const __m256i qp = _mm256_set1_epi32(pair);
                    m0 = pair_dot(m0, _mm256_loadu_si256((const __m256i *)(M2 + p * 16)), qp);
                    m1 = pair_dot(m1, _mm256_loadu_si256((const __m256i *)(M2 + p * 16 + 8)), qp);
                }
                f0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m0), _mm256_mul_ps(_mm256_loadu_ps(Dm + s * 16), xdv), f0);
                f1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m1), _mm256_mul_ps(_mm256_loadu_ps(Dm + s * 16 + 8), xdv), f1);
            }
            _mm256_storeu_ps(o, f0);
            _mm256_storeu_ps(o + 8, f1);
        }
    }
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

const dhsa__qi_kernels QI_YMM_KERNELS = {QI_YMM_VNNI ? "avx-vnni" : "avx2", MR, NG, MAX_TOK_FUSED, R, quant_act, unpack,
                                         dot_rows, tile, dot_file, ktile, KMR, NULL, NULL};
