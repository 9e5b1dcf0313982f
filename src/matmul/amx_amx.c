/* amx_amx.c: the AMX kernels of the AMX path (contract in amx.h).
 * Compiled with the AVX-512, AVX512-BF16 and AMX flags by the Makefile
 * where the compiler knows them; elsewhere this file leaves the kernels'
 * name NULL and prefill keeps the other paths. Chosen at run time
 * (dhsa__amx_active: CPUID, XCR0, the kernel's grant of the tile data).
 *
 *   pack16  16 rows of BF16 into the B layout: per 32 columns a 16 x 16
 *           transpose of 32-bit pairs (unpack 32, unpack 64, two lane
 *           shuffles).
 *   tile    32 tokens x 32 rows: tiles 0-3 the four 16 x 16 F32 sums,
 *           4-5 the activations of 16 tokens each, 6-7 the weights of 16
 *           rows each; per 32 columns 4 tile loads and 4 TDPBF16PS. The
 *           configuration is loaded and released by every call, so a call
 *           leaves no tile state behind.
 * Held to a double reference by tests/test_amx.c.
 */
#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AMX_TILE__) && \
    defined(__AMX_BF16__)
#include <immintrin.h>
#include <string.h>

#include "matmul/amx.h"
#include "matmul/amx_cfg.h"

static void pack16(const uint16_t *rows, int64_t ldr, int64_t kp, uint16_t *dst) {
    for (int64_t k = 0; k < kp; k += 32) {
        __m512i v[16], t[16], u[16];
        for (int r = 0; r < 16; r++) v[r] = _mm512_loadu_si512((const void *)(rows + r * ldr + k));
        for (int i = 0; i < 16; i += 2) {
            t[i] = _mm512_unpacklo_epi32(v[i], v[i + 1]);
            t[i + 1] = _mm512_unpackhi_epi32(v[i], v[i + 1]);
        }
        /* u[4g + c], 128-bit lane L: element 4L + c of rows 4g .. 4g + 3 */
        for (int g = 0; g < 16; g += 4) {
            u[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
            u[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
            u[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
            u[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
        }
        uint16_t *d = dst + k * 16; /* pair k/2 + e at d + 32 e */
        for (int c = 0; c < 4; c++) {
            const __m512i xl = _mm512_shuffle_i32x4(u[c], u[4 + c], _MM_SHUFFLE(2, 0, 2, 0));
            const __m512i xh = _mm512_shuffle_i32x4(u[c], u[4 + c], _MM_SHUFFLE(3, 1, 3, 1));
            const __m512i yl = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], _MM_SHUFFLE(2, 0, 2, 0));
            const __m512i yh = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], _MM_SHUFFLE(3, 1, 3, 1));
            _mm512_storeu_si512((void *)(d + 32 * c), _mm512_shuffle_i32x4(xl, yl, _MM_SHUFFLE(2, 0, 2, 0)));
            _mm512_storeu_si512((void *)(d + 32 * (4 + c)), _mm512_shuffle_i32x4(xh, yh, _MM_SHUFFLE(2, 0, 2, 0)));
            _mm512_storeu_si512((void *)(d + 32 * (8 + c)), _mm512_shuffle_i32x4(xl, yl, _MM_SHUFFLE(3, 1, 3, 1)));
            _mm512_storeu_si512((void *)(d + 32 * (12 + c)), _mm512_shuffle_i32x4(xh, yh, _MM_SHUFFLE(3, 1, 3, 1)));
        }
    }
}

static void tile(const uint16_t *pw, int64_t kp, const uint16_t *xb, int64_t ldxb, int nt, float *out, int64_t ldo) {
    dhsa__tile_cfg c;
    dhsa__tile_cfg_16x64(&c);
    _tile_loadconfig(&c);
    const uint16_t *w0 = pw, *w1 = pw + kp * 16;
    const size_t sx = (size_t)ldxb * 2, so = (size_t)ldo * 4;
    _tile_zero(0);
    _tile_zero(1);
    if (nt > 16) {
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t k = 0; k < kp; k += 32) {
            _tile_loadd(4, xb + k, sx);
            _tile_loadd(5, xb + 16 * ldxb + k, sx);
            _tile_loadd(6, w0 + k * 16, 64);
            _tile_loadd(7, w1 + k * 16, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
        _tile_stored(2, out + 16 * ldo, so);
        _tile_stored(3, out + 16 * ldo + 16, so);
    } else {
        for (int64_t k = 0; k < kp; k += 32) {
            _tile_loadd(4, xb + k, sx);
            _tile_loadd(6, w0 + k * 16, 64);
            _tile_loadd(7, w1 + k * 16, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
        }
    }
    _tile_stored(0, out, so);
    _tile_stored(1, out + 16, so);
    _tile_release();
}

const dhsa__amx_kernels dhsa__amx_tiles = {"amx", pack16, tile};

#elif defined(__x86_64__)
#include "matmul/amx.h"
/* Built without the AMX flags: no kernels (dhsa__amx_kernels_active sees the NULL name). */
const dhsa__amx_kernels dhsa__amx_tiles = {NULL, NULL, NULL};
#else
typedef int dhsa__amx_unused; /* ISO C forbids an empty file */
#endif
