/* int8_amxi8.c: the K panel of Q4_K and Q5_K on the AMX tiles' integer
 * products (contract in int8.h: ktile, ksplit). Compiled with the
 * AVX512-VNNI flags plus -mamx-tile -mamx-int8 by the Makefile (files
 * named *_amxi8.c) where the compiler knows them; elsewhere this file
 * leaves the kernels' name NULL. Chosen at run time by
 * dhsa__qi_kernels_active where the AVX512-VNNI kernels would run and the
 * CPU has AMX-INT8 with the tile data granted (dhsa__amx_int8_active).
 *
 * The kernel set is the AVX512-VNNI one (int8_vnni.c) with one change:
 * the K panel of the types whose sub-block scales S are 6-bit and
 * unsigned with an unsigned code (Q4_K: c <= 15, Q5_K: c <= 31; bw 32,
 * no code offset, a min) runs 16 tokens at a time on the tiles. A tile
 * product (TDPBSUD: signed activation bytes times unsigned weight bytes,
 * 32-bit sums) cannot scale each block of 32 by its row's S on the way,
 * so the panel holds the codes times S in two digits,
 *   w_lo = c (S & 7), w_hi = c (S >> 3)   (each <= 31 x 7 = 217: a byte),
 * and a super-block's integer sum I = sum_j S_j sum_i c_i q_i is
 *   I = sum_i w_lo,i q_i + 8 sum_i w_hi,i q_i,
 * the same integer the VNNI kernel forms block by block (exact: |I| <=
 * 256 x 127 x 31 x 63 < 2^31). The mins' sum and every float step are the
 * VNNI ktile's, in its order, so the outputs are bitwise
 * dhsa__qi_ktile_scalar's and the VNNI kernels' (tests/test_qint.c):
 * turning the tiles on changes no bit of any result. Per super-block of
 * 256 values and 16 tokens x 32 rows: 16 TDPBSUD (tiles 0-3 the four 16 x
 * 16 sums: low and high digit of each group of 16 rows; 4 the
 * activations; 5-7 the weights), then the float steps per token and
 * group. The configuration is loaded and released by every call, so a
 * call leaves no tile state behind. The other K types (Q6_K, Q3_K: signed
 * scales; Q2_K) take the VNNI ktile, six tokens at a time.
 */
#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && \
    defined(__AMX_TILE__) && defined(__AMX_INT8__)
#include <immintrin.h>
#include <pthread.h>
#include <string.h>

#include "matmul/amx_cfg.h"
#include "matmul/int8.h"

#define KMR 16 /* tokens per tile: the rows of an A tile */

/* w (a group's codes, [n/4][16][4]) times its blocks' scales S ([n/32][16]),
 * in place the low digit, into wh the high digit. Per line of 64 bytes
 * (four codes of each of the 16 rows, one block): the even and the odd
 * bytes as 16-bit lanes, each times its row's digit (vpmullw), packed
 * back. */
static void ksplit(uint8_t *w, const int32_t *S, int64_t n, uint8_t *wh) {
    const __m512i lo8 = _mm512_set1_epi16(0x00FF), seven = _mm512_set1_epi32(7);
    for (int64_t j = 0; j < n / 32; j++) {
        const __m512i s = _mm512_loadu_si512(S + j * 16);
        const __m512i sl = _mm512_and_si512(s, seven), sh = _mm512_srli_epi32(s, 3);
        /* each row's digit in both of its 16-bit lanes */
        const __m512i dl = _mm512_or_si512(sl, _mm512_slli_epi32(sl, 16)), dh = _mm512_or_si512(sh, _mm512_slli_epi32(sh, 16));
        for (int u = 0; u < 8; u++) {
            uint8_t *p = w + (j * 8 + u) * 64;
            const __m512i c = _mm512_loadu_si512(p);
            const __m512i ev = _mm512_and_si512(c, lo8), od = _mm512_srli_epi16(c, 8);
            const __m512i l = _mm512_or_si512(_mm512_mullo_epi16(ev, dl), _mm512_slli_epi16(_mm512_mullo_epi16(od, dl), 8));
            const __m512i h = _mm512_or_si512(_mm512_mullo_epi16(ev, dh), _mm512_slli_epi16(_mm512_mullo_epi16(od, dh), 8));
            _mm512_storeu_si512(p, l);
            _mm512_storeu_si512(wh + (j * 8 + u) * 64, h);
        }
    }
}

/* 16 tokens x 32 rows of a Q4_K / Q5_K panel split by ksplit: lows of
 * group g at w + g n 16, highs at w + 2 n 16 + g n 16. */
static void ktile_amx(const uint8_t *w, const int32_t *M2, const float *D, const float *Dm, int64_t n,
                      const dhsa_qi_act *x, float *out, int64_t ldo, int accumulate) {
    const int64_t nb = n / 32, ns = n / 256;
    const uint8_t *wl0 = w, *wl1 = w + n * 16, *wh0 = w + 2 * n * 16, *wh1 = w + 3 * n * 16;
    const int32_t *M0 = M2, *M1 = M2 + (nb / 2) * 16;
    const float *D0 = D, *D1 = D + ns * 16, *Dm0 = Dm, *Dm1 = Dm + ns * 16;
    /* the activations as one strided matrix where the tokens are (a tile
     * whose last tokens repeat one is gathered per step) */
    const int64_t lda = x[1].q - x[0].q;
    int strided = lda >= 64;
    for (int t = 2; t < KMR && strided; t++) strided = x[t].q - x[t - 1].q == lda;
    _Alignas(64) int8_t A[KMR * 64];
    _Alignas(64) int32_t C[4][KMR * 16];
    dhsa__tile_cfg cfg;
    dhsa__tile_cfg_16x64(&cfg);
    _tile_loadconfig(&cfg);
    for (int64_t s = 0; s < ns; s++) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int u = 0; u < 4; u++) {
            const int64_t c0 = s * 256 + u * 64, line = c0 / 4 * 64;
            if (strided) {
                _tile_loadd(4, x[0].q + c0, lda);
            } else {
                for (int t = 0; t < KMR; t++) memcpy(A + t * 64, x[t].q + c0, 64);
                _tile_loadd(4, A, 64);
            }
            _tile_loadd(5, wl0 + line, 64);
            _tile_loadd(6, wh0 + line, 64);
            _tile_loadd(7, wl1 + line, 64);
            _tile_dpbsud(0, 4, 5);
            _tile_dpbsud(1, 4, 6);
            _tile_loadd(5, wh1 + line, 64);
            _tile_dpbsud(2, 4, 7);
            _tile_dpbsud(3, 4, 5);
        }
        _tile_stored(0, C[0], 64);
        _tile_stored(1, C[1], 64);
        _tile_stored(2, C[2], 64);
        _tile_stored(3, C[3], 64);
        const __m512 d0 = _mm512_loadu_ps(D0 + s * 16), d1 = _mm512_loadu_ps(D1 + s * 16);
        const __m512 dm0 = _mm512_loadu_ps(Dm0 + s * 16), dm1 = _mm512_loadu_ps(Dm1 + s * 16);
        for (int t = 0; t < KMR; t++) {
            /* the VNNI ktile's float steps, in its order */
            const __m512i I0 = _mm512_add_epi32(_mm512_load_si512(C[0] + t * 16),
                                                _mm512_slli_epi32(_mm512_load_si512(C[1] + t * 16), 3));
            const __m512i I1 = _mm512_add_epi32(_mm512_load_si512(C[2] + t * 16),
                                                _mm512_slli_epi32(_mm512_load_si512(C[3] + t * 16), 3));
            const __m512 xdv = _mm512_set1_ps(x[t].xd[s * 8]);
            float *o = out + t * ldo;
            const int rd = s > 0 || accumulate;
            const __m512 o0 = rd ? _mm512_loadu_ps(o) : _mm512_setzero_ps(), o1 = rd ? _mm512_loadu_ps(o + 16) : o0;
            __m512 f0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I0), _mm512_mul_ps(d0, xdv), o0);
            __m512 f1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I1), _mm512_mul_ps(d1, xdv), o1);
            __m512i m0 = _mm512_setzero_si512(), m1 = _mm512_setzero_si512();
            for (int64_t p = s * 4; p < (s + 1) * 4; p++) {
                int32_t pair;
                memcpy(&pair, x[t].qs + 2 * p, 4);
                const __m512i qp = _mm512_set1_epi32(pair);
                m0 = _mm512_dpwssd_epi32(m0, _mm512_loadu_si512(M0 + p * 16), qp);
                m1 = _mm512_dpwssd_epi32(m1, _mm512_loadu_si512(M1 + p * 16), qp);
            }
            f0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(m0), _mm512_mul_ps(dm0, xdv), f0);
            f1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(m1), _mm512_mul_ps(dm1, xdv), f1);
            _mm512_storeu_ps(o, f0);
            _mm512_storeu_ps(o + 16, f1);
        }
    }
    _tile_release();
}

/* The other K forms on the VNNI ktile, six tokens at a time (the last
 * four through a buffer, their tokens repeated to six). */
static void ktile_vnni16(const uint8_t *w, const int32_t *S, const int32_t *M2, const float *D, const float *Dm,
                         int64_t n, int bw, int z, int has_min, const dhsa_qi_act *x, float *out, int64_t ldo,
                         int accumulate) {
    const dhsa__qi_kernels *v = &dhsa__qi_vnni;
    const int mr = v->kmr, rows = 16 * v->ng;
    for (int t0 = 0; t0 < KMR; t0 += mr) {
        if (t0 + mr <= KMR) {
            v->ktile(w, S, M2, D, Dm, n, bw, z, has_min, x + t0, out + t0 * ldo, ldo, accumulate);
            continue;
        }
        dhsa_qi_act xs[16];
        float buf[16 * 32];
        const int nt = KMR - t0;
        for (int t = 0; t < mr; t++) xs[t] = x[t0 + (t < nt ? t : nt - 1)];
        for (int t = 0; t < nt && accumulate; t++) memcpy(buf + t * rows, out + (t0 + t) * ldo, sizeof(float) * (size_t)rows);
        v->ktile(w, S, M2, D, Dm, n, bw, z, has_min, xs, buf, rows, accumulate);
        for (int t = 0; t < nt; t++) memcpy(out + (t0 + t) * ldo, buf + t * rows, sizeof(float) * (size_t)rows);
    }
}

static void ktile(const uint8_t *w, const int32_t *S, const int32_t *M2, const float *D, const float *Dm, int64_t n,
                  int bw, int z, int has_min, const dhsa_qi_act *x, float *out, int64_t ldo, int accumulate) {
    if (bw == 32 && z == 0 && has_min) /* Q4_K, Q5_K: split by ksplit */
        ktile_amx(w, M2, D, Dm, n, x, out, ldo, accumulate);
    else
        ktile_vnni16(w, S, M2, D, Dm, n, bw, z, has_min, x, out, ldo, accumulate);
}

static dhsa__qi_kernels set;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void build(void) {
    if (!dhsa__qi_vnni.name || !dhsa__qi_vnni.ktile || dhsa__qi_vnni.ng != 2) return; /* name stays NULL */
    set = dhsa__qi_vnni;
    set.name = "avx512-vnni amx-int8";
    set.ktile = ktile;
    set.kmr = KMR;
    set.ksplit = ksplit;
}

const dhsa__qi_kernels *dhsa__qi_amxi8(void) {
    pthread_once(&once, build);
    return &set;
}

#elif defined(__x86_64__)
#include "matmul/int8.h"
/* Built without AMX-INT8: a set without a name (dhsa__qi_kernels_active passes it by). */
static const dhsa__qi_kernels none = {NULL, 0, 0, 0, 0, NULL, NULL, NULL, NULL, NULL, NULL, 0, NULL, NULL};
const dhsa__qi_kernels *dhsa__qi_amxi8(void) { return &none; }
#else
typedef int dhsa__qi_amxi8_unused; /* ISO C forbids an empty file */
#endif
