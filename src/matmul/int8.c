/* int8.c: the integer path of the weight products (contract in int8.h,
 * numbers in docs/quant.md): the scalar definitions (unpacking each type
 * into codes and block scales, quantizing activations, the block-ordered
 * product), the scalar kernels that are the reference of the per-ISA ones
 * (int8_vnni.c, int8_avxvnni.c, int8_avx2.c), their choice, and the
 * driver: activations quantized once per call (in parallel over tokens),
 * then either
 *   fused  n_tok <= max_tok_fused: a task unpacks each of its rows into an
 *          L1 buffer and multiplies it with every token (decode);
 *   panel  otherwise: a task unpacks a panel of 16 ng rows, all columns, in
 *          the VNNI layout (four codes of one row side by side, sixteen
 *          rows per 64 bytes) into an L2 buffer and runs the mr x 16 ng
 *          tile over every token (prefill); the K types on kernels with a
 *          ktile take the super-block panel instead (kpanel: integer
 *          sub-block scales and mins, int8.h).
 *
 * Run: make build/tests/test_qint && build/tests/test_qint.
 */
#include "matmul/int8.h"
#include "matmul/path.h"

#include "core/internal.h"

#include <math.h>
#include <string.h>

/* ------------------------------------------------------------ formats --- */

/* The integer path's reading of each weight type, by dhsa__wt_index (the
 * order of DHSA_QK_TYPE_LIST): bw, the weight block of the path (0: not
 * covered), sb, the activations' scale group, cmax, the largest code. */
static const struct {
    uint8_t bw;
    uint16_t sb;
    uint8_t cmax;
} i8_types[DHSA_QK_N_TYPES] = {
    /* F32 */ {0, 0, 0},       /* F16 */ {0, 0, 0},       /* BF16 */ {0, 0, 0},
    /* Q8_0 */ {32, 32, 255},  /* Q4_0 */ {32, 32, 15},   /* Q4_K */ {32, 256, 15},
    /* Q6_K */ {16, 256, 63},  /* Q4_1 */ {32, 32, 15},   /* Q5_0 */ {32, 32, 31},
    /* Q5_1 */ {32, 32, 31},   /* Q2_K */ {16, 256, 3},   /* Q3_K */ {16, 256, 7},
    /* Q5_K */ {32, 256, 31},  /* IQ4_NL */ {32, 32, 255}, /* IQ4_XS */ {32, 32, 255},
};

int dhsa__qi_type(uint32_t type) { return dhsa__qi_bw(type) != 0; }

int dhsa__qi_bw(uint32_t type) {
    const int i = dhsa__wt_index(type);
    return i < 0 ? 0 : i8_types[i].bw;
}

int dhsa__qi_code_max(uint32_t type) {
    const int i = dhsa__wt_index(type);
    return i < 0 ? 0 : i8_types[i].cmax;
}

int dhsa__qi_sb(uint32_t type) {
    const int i = dhsa__wt_index(type);
    return i < 0 ? 0 : i8_types[i].sb;
}

/* Block layouts: formats.c's comment above dhsa__wt_dequant_scalar. */
void dhsa__qi_unpack_scalar(uint32_t type, const uint8_t *row, int64_t k0, int64_t kn, uint8_t *c, float *a,
                            float *b) {
    switch (type) {
    case DHSA_GGML_Q8_0:
        for (int64_t i = 0; i < kn / 32; i++, c += 32) {
            const uint8_t *blk = row + (k0 / 32 + i) * 34;
            float d = dhsa__wt_f16(blk);
            for (int j = 0; j < 32; j++) c[j] = (uint8_t)(blk[2 + j] ^ 0x80); /* int8 q + 128 */
            a[i] = d;
            b[i] = -128.0f * d;
        }
        return;
    case DHSA_GGML_Q4_0:
    case DHSA_GGML_Q4_1:
    case DHSA_GGML_Q5_0:
    case DHSA_GGML_Q5_1:
    case DHSA_GGML_IQ4_NL: {
        const int64_t bb = dhsa__wt_block_bytes(type);
        for (int64_t i = 0; i < kn / 32; i++, c += 32) {
            const uint8_t *blk = row + (k0 / 32 + i) * bb;
            float d = dhsa__wt_f16(blk);
            uint32_t qh = 0;
            if (type == DHSA_GGML_Q5_0) memcpy(&qh, blk + 2, 4);
            if (type == DHSA_GGML_Q5_1) memcpy(&qh, blk + 4, 4);
            const uint8_t *qs = blk + (type == DHSA_GGML_Q5_0   ? 6
                                       : type == DHSA_GGML_Q5_1 ? 8
                                       : type == DHSA_GGML_Q4_1 ? 4
                                                                : 2);
            for (int j = 0; j < 32; j++) {
                int q = (j < 16 ? qs[j] & 15 : qs[j - 16] >> 4) | (int)((qh >> j) & 1u) << 4;
                c[j] = (uint8_t)(type == DHSA_GGML_IQ4_NL ? dhsa__iq4_grid[q] + 128 : q);
            }
            a[i] = d;
            switch (type) {
            case DHSA_GGML_Q4_0: b[i] = -8.0f * d; break;
            case DHSA_GGML_Q5_0: b[i] = -16.0f * d; break;
            case DHSA_GGML_IQ4_NL: b[i] = -128.0f * d; break;
            default: b[i] = dhsa__wt_f16(blk + 2); break; /* Q4_1, Q5_1: m */
            }
        }
        return;
    }
    case DHSA_GGML_Q4_K:
    case DHSA_GGML_Q5_K: {
        const int five = type == DHSA_GGML_Q5_K;
        for (int64_t i = 0; i < kn / 256; i++, c += 256, a += 8, b += 8) {
            const uint8_t *blk = row + (k0 / 256 + i) * (five ? 176 : 144);
            float d = dhsa__wt_f16(blk), dmin = dhsa__wt_f16(blk + 2);
            const uint8_t *qh = blk + 16, *qs = blk + (five ? 48 : 16);
            for (int u = 0; u < 4; u++)
                for (int h = 0; h < 2; h++) {
                    int sc, m;
                    dhsa__q4k_scale_min(blk + 4, 2 * u + h, &sc, &m);
                    a[2 * u + h] = d * (float)sc;
                    b[2 * u + h] = -(dmin * (float)m);
                    for (int l = 0; l < 32; l++) {
                        int q = h ? qs[32 * u + l] >> 4 : qs[32 * u + l] & 15;
                        if (five) q |= (qh[l] >> (2 * u + h) & 1) << 4;
                        c[64 * u + 32 * h + l] = (uint8_t)q;
                    }
                }
        }
        return;
    }
    case DHSA_GGML_Q6_K:
        for (int64_t i = 0; i < kn / 256; i++, c += 256, a += 16, b += 16) {
            const uint8_t *blk = row + (k0 / 256 + i) * 210;
            const uint8_t *ql = blk, *qh = blk + 128;
            const int8_t *sc = (const int8_t *)(blk + 192);
            float d = dhsa__wt_f16(blk + 208);
            for (int n = 0; n < 2; n++)
                for (int p = 0; p < 4; p++)
                    for (int l = 0; l < 32; l++) {
                        int lo = ql[64 * n + 32 * (p & 1) + l] >> (4 * (p >> 1)) & 15;
                        int hi = qh[32 * n + l] >> (2 * p) & 3;
                        c[128 * n + 32 * p + l] = (uint8_t)(lo | hi << 4);
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
            const uint8_t *qs = blk + (q2 ? 16 : 32), *hm = blk;
            float d = dhsa__wt_f16(blk + (q2 ? 80 : 108)), dmin = q2 ? dhsa__wt_f16(blk + 82) : 0.0f;
            for (int v = 0; v < 256; v++) {
                int n = v / 128, j = v % 128 / 32, h = v % 32 / 16, l = v % 16;
                int q = qs[32 * n + 16 * h + l] >> (2 * j) & 3;
                if (!q2 && (hm[16 * h + l] >> (4 * n + j) & 1)) q += 4;
                c[v] = (uint8_t)q; /* Q3_K: low 2 bits + 4 * high bit = q3 + 4 */
            }
            for (int j = 0; j < 16; j++) {
                if (q2) {
                    a[j] = d * (float)(blk[j] & 15);
                    b[j] = -(dmin * (float)(blk[j] >> 4));
                } else {
                    a[j] = d * (float)(dhsa__q3k_scale(blk + 96, j) - 32);
                    b[j] = -4.0f * a[j];
                }
            }
        }
        return;
    case DHSA_GGML_IQ4_XS:
        for (int64_t i = 0; i < kn / 256; i++, c += 256, a += 8, b += 8) {
            const uint8_t *blk = row + (k0 / 256 + i) * 136;
            float d = dhsa__wt_f16(blk);
            for (int ib = 0; ib < 8; ib++) {
                const uint8_t *qs = blk + 8 + 16 * ib;
                for (int j = 0; j < 16; j++) {
                    c[32 * ib + j] = (uint8_t)(dhsa__iq4_grid[qs[j] & 15] + 128);
                    c[32 * ib + 16 + j] = (uint8_t)(dhsa__iq4_grid[qs[j] >> 4] + 128);
                }
                a[ib] = d * (float)(dhsa__iq4xs_scale(blk, ib) - 32);
                b[ib] = -128.0f * a[ib];
            }
        }
        return;
    default: return;
    }
}

void dhsa__qi_quant_act_scalar(const float *x, int64_t n, int bw, int sb, int8_t *q, float *xd, float *xs) {
    for (int64_t g = 0; g < n / sb; g++) {
        const float *v = x + sb * g;
        float amax = 0.0f, probe = 0.0f;
        for (int j = 0; j < sb; j++) {
            float m = fabsf(v[j]);
            amax = m > amax ? m : amax;
            probe += v[j] * 0.0f; /* NaN when a value is NaN or Inf */
        }
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int64_t i = g * (sb / 32); i < (g + 1) * (sb / 32); i++) {
            int s[2] = {0, 0};
            for (int j = 0; j < 32; j++) {
                float r = nearbyintf(x[32 * i + j] * id);
                int qi = probe == 0.0f ? (int)r : 0;
                q[32 * i + j] = (int8_t)qi;
                s[j / 16] += qi;
            }
            xd[i] = probe == 0.0f ? d : NAN;
            if (bw == 32) {
                xs[i] = xd[i] * (float)(s[0] + s[1]);
            } else {
                xs[2 * i] = xd[i] * (float)s[0];
                xs[2 * i + 1] = xd[i] * (float)s[1];
            }
        }
    }
}

float dhsa__qi_dot_scalar(const uint8_t *c, const float *a, const float *b, int64_t n, int bw, const dhsa_qi_act *x,
                          float y) {
    for (int64_t j = 0; j < n / bw; j++) {
        int32_t isum = 0;
        for (int l = 0; l < bw; l++) isum += (int32_t)c[j * bw + l] * (int32_t)x->q[j * bw + l];
        float s = a[j] * x->xd[j * bw / 32];
        y = fmaf((float)isum, s, y);
        y = fmaf(b[j], x->xs[j], y);
    }
    return y;
}

/* ------------------------------------------- K types, super-block form --- */

int dhsa__qi_kform(uint32_t type, int *z, int *has_min) {
    switch (type) {
    case DHSA_GGML_Q4_K:
    case DHSA_GGML_Q5_K:
    case DHSA_GGML_Q2_K: *z = 0, *has_min = 1; return 1;
    case DHSA_GGML_Q6_K: *z = 32, *has_min = 0; return 1;
    case DHSA_GGML_Q3_K: *z = 4, *has_min = 0; return 1;
    default: return 0;
    }
}

void dhsa__qi_kunpack_scalar(uint32_t type, const uint8_t *row, int64_t n, int32_t *S, int32_t *M, float *d,
                             float *dmin) {
    for (int64_t i = 0; i < n / 256; i++) {
        switch (type) {
        case DHSA_GGML_Q4_K:
        case DHSA_GGML_Q5_K: {
            const uint8_t *blk = row + i * (type == DHSA_GGML_Q5_K ? 176 : 144);
            d[i] = dhsa__wt_f16(blk);
            dmin[i] = dhsa__wt_f16(blk + 2);
            for (int j = 0; j < 8; j++) {
                int sc, m;
                dhsa__q4k_scale_min(blk + 4, j, &sc, &m);
                S[8 * i + j] = sc;
                M[8 * i + j] = m;
            }
            break;
        }
        case DHSA_GGML_Q6_K: {
            const uint8_t *blk = row + i * 210;
            d[i] = dhsa__wt_f16(blk + 208);
            dmin[i] = 0.0f;
            for (int j = 0; j < 16; j++) {
                S[16 * i + j] = (int8_t)blk[192 + j];
                M[16 * i + j] = 0;
            }
            break;
        }
        case DHSA_GGML_Q2_K:
        case DHSA_GGML_Q3_K: {
            const int q2 = type == DHSA_GGML_Q2_K;
            const uint8_t *blk = row + i * (q2 ? 84 : 110);
            d[i] = dhsa__wt_f16(blk + (q2 ? 80 : 108));
            dmin[i] = q2 ? dhsa__wt_f16(blk + 82) : 0.0f;
            for (int j = 0; j < 16; j++) {
                S[16 * i + j] = q2 ? blk[j] & 15 : dhsa__q3k_scale(blk + 96, j) - 32;
                M[16 * i + j] = q2 ? blk[j] >> 4 : 0;
            }
            break;
        }
        default: return;
        }
    }
}

void dhsa__qi_ktile_scalar(const uint8_t *w, const int32_t *S, const int32_t *M2, const float *D, const float *Dm,
                           int64_t n, int bw, int z, int has_min, const dhsa_qi_act *x, int mr, int ng, float *out,
                           int64_t ldo, int accumulate) {
    (void)z; /* in x[t].qz */
    const int64_t nb = n / bw, ns = n / 256, bps = 256 / bw;
    for (int t = 0; t < mr; t++)
        for (int r = 0; r < 16 * ng; r++) {
            const int64_t g = r / 16, rr = r % 16;
            const uint8_t *wg = w + g * n * 16;
            const int32_t *Sg = S + g * nb * 16, *Mg = M2 + g * (nb / 2) * 16;
            const float *Dg = D + g * ns * 16, *Dmg = Dm + g * ns * 16;
            float y = accumulate ? out[t * ldo + r] : 0.0f;
            for (int64_t s = 0; s < ns; s++) {
                int32_t I = 0, Mq = 0;
                for (int64_t j = s * bps; j < (s + 1) * bps; j++) {
                    int32_t isum = x[t].qz[j];
                    for (int l = 0; l < bw; l++) {
                        int64_t k = j * bw + l;
                        isum += (int32_t)wg[(k / 4) * 64 + rr * 4 + k % 4] * (int32_t)x[t].q[k];
                    }
                    I += Sg[j * 16 + rr] * isum;
                    if (has_min) { /* M_j from its 16-bit half */
                        const uint32_t m2 = (uint32_t)Mg[j / 2 * 16 + rr];
                        Mq += (int32_t)(int16_t)(uint16_t)(j % 2 ? m2 >> 16 : m2) * x[t].qs[j];
                    }
                }
                const float xd = x[t].xd[s * 8];
                y = fmaf((float)I, Dg[s * 16 + rr] * xd, y);
                if (has_min) y = fmaf((float)Mq, Dmg[s * 16 + rr] * xd, y);
            }
            out[t * ldo + r] = y;
        }
}

/* ------------------------------------------------------ scalar kernels --- */

#define S_MR 4
#define S_NG 1

static void unpack_scalar(uint32_t type, const uint8_t *row, int64_t k0, int64_t kn, uint8_t *c, float *a, float *b) {
    dhsa__qi_unpack_scalar(type, row, k0, kn, c, a, b);
}

static void dot_rows_scalar(const uint8_t *c, int64_t ldc, const float *a, const float *b, int64_t ldab, int nr,
                            int64_t n, int bw, int cmax, const dhsa_qi_act *x, int n_tok, float *y, int64_t ldy,
                            int accumulate) {
    (void)cmax;
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < n_tok; t++)
            y[t * ldy + r] = dhsa__qi_dot_scalar(c + r * ldc, a + r * ldab, b + r * ldab, n, bw, &x[t],
                                                 accumulate ? y[t * ldy + r] : 0.0f);
}

static void tile_scalar(const uint8_t *w, const float *a, const float *b, int64_t n, int bw, int cmax,
                        const dhsa_qi_act *x, float *out) {
    (void)cmax;
    const int64_t nb = n / bw;
    for (int t = 0; t < S_MR; t++)
        for (int r = 0; r < 16 * S_NG; r++) {
            const int g = r / 16, rr = r % 16;
            const uint8_t *wg = w + (int64_t)g * n * 16;
            const float *ag = a + (int64_t)g * nb * 16, *bg = b + (int64_t)g * nb * 16;
            float y = out[t * 16 * S_NG + r];
            for (int64_t j = 0; j < nb; j++) {
                int32_t isum = 0;
                for (int l = 0; l < bw; l++) {
                    int64_t k = j * bw + l;
                    isum += (int32_t)wg[(k / 4) * 64 + rr * 4 + k % 4] * (int32_t)x[t].q[k];
                }
                float s = ag[j * 16 + rr] * x[t].xd[j * bw / 32];
                y = fmaf((float)isum, s, y);
                y = fmaf(bg[j * 16 + rr], x[t].xs[j], y);
            }
            out[t * 16 * S_NG + r] = y;
        }
}

const dhsa__qi_kernels dhsa__qi_scalar = {"scalar", S_MR, S_NG, 4, 1, dhsa__qi_quant_act_scalar, unpack_scalar,
                                          dot_rows_scalar, tile_scalar, NULL, NULL, 0, NULL, NULL};

const dhsa__qi_kernels *dhsa__qi_kernels_active(void) {
#if defined(__x86_64__)
    /* the best the level allows and the build has (a kernel file built
     * without its flags leaves a NULL name) */
    const dhsa__idot d = dhsa__idot_active();
    if (d >= DHSA__IDOT_AVX512VNNI && dhsa__qi_vnni.name) {
        /* the K panel on the tiles where they are: bitwise the same results */
        const dhsa__qi_kernels *a = dhsa__amx_int8_active() ? dhsa__qi_amxi8() : NULL;
        return a && a->name ? a : &dhsa__qi_vnni;
    }
    if (d >= DHSA__IDOT_AVXVNNI && dhsa__qi_avxvnni.name) return &dhsa__qi_avxvnni;
    if (d >= DHSA__IDOT_AVX2 && dhsa__qi_avx2.name) return &dhsa__qi_avx2;
#endif
    return NULL;
}

int dhsa__qi_fused_exact(const dhsa__qi_kernels *k, uint32_t type) {
#if defined(__x86_64__)
    if (k == &dhsa__qi_vnni || (k && k->ksplit))
        return !(k->dot_file && k->dot_file(type, NULL, 0, 0, 0, NULL, 0, NULL, 0, 0));
#endif
    (void)k;
    (void)type;
    return 0;
}

const char *dhsa__qi_path_name(const dhsa__qi_kernels *k, uint32_t type) {
#if defined(__x86_64__)
    if (k == &dhsa__qi_vnni) return "int8 avx512-vnni";
    if (k && k->ksplit)
        return type == DHSA_GGML_Q4_K || type == DHSA_GGML_Q5_K ? "int8 avx512-vnni amx-int8" : "int8 avx512-vnni";
    if (k == &dhsa__qi_avxvnni) return "int8 avx-vnni";
    if (k == &dhsa__qi_avx2) return "int8 avx2";
#else
    (void)type;
#endif
    return k == &dhsa__qi_scalar ? "int8 scalar" : "int8";
}

/* --------------------------------------------------------- the path --- */

/* Task sizes. Fused (decode): 512 KB of weights a task where the product
 * is large, so that a thread's stream of rows (and the kernels' prefetch
 * far ahead, int8_vnni.c) runs on across few task boundaries (Q4_K 2048 x
 * 131072, 2 threads: 77-79% of a plain read with 128 KB tasks, 85-88% with
 * 512 KB); small products still cut into up to 4 tasks per thread of at
 * least 128 KB, as before. Panel: as the exact path's (f32.c). */
#define QI_FUSED_TASK_BYTES (512 * 1024)
#define QI_FUSED_TASK_MIN (128 * 1024)
#define QI_PANEL_TASK_FLOPS (4.0e6)

/* Scratch: the activations of every token (codes [n_tok][lda], scales
 * [n_tok][nxd], block sums [n_tok][nxs]), then each thread's buffer: the
 * fused form's fused_rows rows unpacked, or the panel form's panel. */
static void i8_plan(dhsa__mm_plan *pp, uint32_t type, int64_t n_in, int64_t n_out, int64_t n_tok, int n_threads) {
    const dhsa__qi_kernels *k = pp->k;
    dhsa__mm_plan p = *pp;
    const int bw = dhsa__qi_bw(type);
    p.bw = bw;
    p.sb = dhsa__qi_sb(type);
    p.cmax = dhsa__qi_code_max(type);
    p.fused = n_tok <= k->max_tok_fused;
    p.lda = round_up(n_in, 64);
    p.nxd = round_up(n_in / 32, 16);
    p.nxs = round_up(n_in / 16, 16); /* the most a type needs: workspace alike for every type */
    p.kpanel = !p.fused && k->ktile && dhsa__qi_kform(type, &p.kz, &p.kmin) && n_in % 256 == 0;
    p.ksplit = p.kpanel && k->ksplit && bw == 32 && p.kz == 0 && p.kmin; /* Q4_K, Q5_K: int8.h */
    /* the K panel's integer block sums qz, qs after the scales */
    const size_t ksums = p.kpanel ? (size_t)p.nxs * (sizeof(int32_t) + sizeof(int16_t)) : 0;
    p.act_bytes = (size_t)round_up(
        (int64_t)((size_t)n_tok * ((size_t)p.lda + (size_t)(p.nxd + p.nxs) * sizeof(float) + ksums)), 64);
    p.prep_tok = n_tok;
    p.prep_inline = n_tok <= 8;
    p.n_prep = n_tok <= 8 ? n_tok : n_tok < 64 ? n_tok : 64;
    const int64_t nb = n_in / bw;
    int64_t row_bytes = dhsa__wt_row_bytes(type, n_in);
    if (p.fused) {
        p.unit_rows = round_up(ceil_div(64 * 1024, row_bytes), 4);
        p.n_units = ceil_div(n_out, p.unit_rows);
        const double bytes = (double)row_bytes * (double)n_out, small = bytes / QI_FUSED_TASK_MIN;
        double t = bytes / QI_FUSED_TASK_BYTES;
        if (t < 4.0 * n_threads) t = small < 4.0 * n_threads ? small : 4.0 * n_threads;
        p.n_tasks = t < 1.0 ? 1 : t > (double)p.n_units ? p.n_units : (int64_t)t;
        /* fused_rows rows' codes, a and b */
        p.per_thread = (size_t)k->fused_rows * ((size_t)round_up(n_in, 64) + 2 * (size_t)round_up(nb, 16) * sizeof(float));
    } else {
        p.unit_rows = 16 * k->ng;
        p.n_units = ceil_div(n_out, p.unit_rows);
        double t = 2.0 * (double)n_in * (double)n_out * (double)n_tok / QI_PANEL_TASK_FLOPS;
        p.n_tasks = t < 1.0 ? 1 : t > (double)p.n_units ? p.n_units : (int64_t)t;
        /* the panel (codes, twice with ksplit's digits; a, b; the K
         * panel's S, M2, d, -dmin fit in a and b's room), a group's 16
         * unpacked rows of codes, one row's a/b (and the K panel's d,
         * dmin), the out tile */
        const int64_t tmr = p.kpanel && k->kmr > k->mr ? k->kmr : k->mr;
        p.per_thread = (size_t)(p.ksplit ? 2 : 1) * (size_t)p.unit_rows * (size_t)n_in +
                       2 * (size_t)p.unit_rows * (size_t)nb * sizeof(float) + 16 * (size_t)round_up(n_in, 64) +
                       2 * (size_t)round_up(nb, 16) * sizeof(float) +
                       (p.kpanel ? 2 * (size_t)round_up(n_in / 256, 16) * sizeof(float) : 0) +
                       (size_t)tmr * (size_t)p.unit_rows * sizeof(float) + 64;
    }
    p.per_thread = (size_t)round_up((int64_t)p.per_thread, 64);
    int users = p.n_tasks == 1 || n_threads <= 1 ? 1 : n_threads;
    p.ws = p.act_bytes + (size_t)users * p.per_thread;
    *pp = p;
}

static const dhsa__qi_kernels *K(const dhsa__mm_job *j) { return j->p->k; }

static inline __attribute__((always_inline)) dhsa_qi_act act_of(const dhsa__mm_job *j, int64_t t) {
    const dhsa__mm_plan *p = j->p;
    const int8_t *q = (const int8_t *)j->act;
    const float *xd = (const float *)(j->act + (size_t)j->n_tok * (size_t)p->lda), *xs = xd + j->n_tok * p->nxd;
    dhsa_qi_act a = {q + t * p->lda, xd + t * p->nxd, xs + t * p->nxs, NULL, NULL};
    if (p->kpanel) {
        const int32_t *qz = (const int32_t *)(xs + j->n_tok * p->nxs);
        const int16_t *qs = (const int16_t *)(qz + j->n_tok * p->nxs);
        a.qz = qz + t * p->nxs;
        a.qs = qs + t * p->nxs;
    }
    return a;
}

/* The sum of 8 int8 codes, eight at a time in a 64-bit word: biased to
 * unsigned (q + 128), summed by pairs into 16-bit lanes, the four lanes
 * by one multiply (at most 8 * 255 < 2^16). */
static inline int32_t sum8(const int8_t *q) {
    uint64_t v;
    memcpy(&v, q, 8);
    const uint64_t u = v ^ 0x8080808080808080ull, m = 0x00FF00FF00FF00FFull;
    const uint64_t pairs = (u & m) + (u >> 8 & m);
    return (int32_t)((pairs * 0x0001000100010001ull) >> 48) - 8 * 128;
}

static void i8_prepare(const dhsa__mm_job *j, int64_t t0, int64_t t1) {
    const int bw = j->p->bw;
    for (int64_t t = t0; t < t1; t++) {
        dhsa_qi_act a = act_of(j, t);
        K(j)->quant_act(j->x + t * j->ldx, j->W->n_in, bw, j->p->sb, (int8_t *)a.q, (float *)a.xd, (float *)a.xs);
        if (j->p->kpanel)
            for (int64_t b = 0; b < j->W->n_in / bw; b++) {
                int32_t sum = 0;
                for (int l = 0; l < bw; l += 8) sum += sum8(a.q + b * bw + l);
                ((int16_t *)a.qs)[b] = (int16_t)sum; /* |sum| <= 32 * 127 */
                ((int32_t *)a.qz)[b] = -j->p->kz * sum;
            }
    }
}

/* The fused path works on column chunks of QI_FUSED_KC: the rows of a
 * group are unpacked and multiplied a chunk at a time, so that the loads of
 * the weights and the arithmetic interleave at a fine grain (a whole row
 * unpacked first leaves the memory system idle during its products). */
#define QI_FUSED_KC 1024

static void fused_rows(const dhsa__mm_job *j, int64_t o0, int64_t o1, char *buf) {
    const dhsa_wmat *W = j->W;
    const int64_t n = W->n_in, nb = n / j->p->bw, ldc = round_up(n, 64), ldab = round_up(nb, 16);
    const int R = K(j)->fused_rows;
    const int64_t blk = dhsa__wt_block(W->type), blk_bytes = dhsa__wt_block_bytes(W->type);
    uint8_t *c = (uint8_t *)buf;
    float *a = (float *)(buf + R * ldc), *b = a + R * ldab;
    const int nt = (int)j->n_tok;
    if (K(j)->dot_file) { /* whole rows from the file's blocks, no unpacked copy (int8.h): all of them in one call */
        dhsa_qi_act x[64];
        for (int t = 0; t < nt; t++) x[t] = act_of(j, t);
        if (K(j)->dot_file(W->type, (const uint8_t *)W->data + o0 * W->row_bytes, W->row_bytes, (int)(o1 - o0), n, x,
                           nt, j->y + o0, j->ldy, 0))
            return;
    }
    for (int64_t o = o0; o < o1; o += R) {
        const int nr = o1 - o < R ? (int)(o1 - o) : R;
        const uint8_t *row = (const uint8_t *)W->data + o * W->row_bytes;
        for (int64_t k0 = 0; k0 < n; k0 += QI_FUSED_KC) {
            const int64_t kn = n - k0 < QI_FUSED_KC ? n - k0 : QI_FUSED_KC;
            /* the next chunk of these rows (or the first of the next group)
             * while this one computes: the loads stay in flight */
            {
                int64_t nk0 = k0 + QI_FUSED_KC, no = o;
                if (nk0 >= n) {
                    nk0 = 0;
                    no = o + R;
                }
                if (no < o1) {
                    const int64_t nkn = n - nk0 < QI_FUSED_KC ? n - nk0 : QI_FUSED_KC;
                    const int64_t off = nk0 / blk * blk_bytes, len = nkn / blk * blk_bytes;
                    const int nrn = o1 - no < R ? (int)(o1 - no) : R;
                    for (int r = 0; r < nrn; r++) {
                        const uint8_t *p = (const uint8_t *)W->data + (no + r) * W->row_bytes + off;
                        for (int64_t e = 0; e < len; e += 64) __builtin_prefetch(p + e, 0, 3);
                    }
                }
            }
            dhsa_qi_act x[64];
            for (int t = 0; t < nt; t++) {
                x[t] = act_of(j, t);
                x[t].q += k0;
                x[t].xd += k0 / 32;
                x[t].xs += k0 / j->p->bw;
            }
            for (int r = 0; r < R; r++) /* past the last row: the last row again, its results dropped */
                K(j)->unpack(W->type, row + (r < nr ? r : nr - 1) * W->row_bytes, k0, kn, c + r * ldc,
                             a + r * ldab, b + r * ldab);
            K(j)->dot_rows(c, ldc, a, b, ldab, nr, kn, j->p->bw, j->p->cmax, x, nt, j->y + o, j->ldy, k0 > 0);
        }
    }
}

/* A group's 16 unpacked rows of codes (row rr at rc + rr * ldr) into the
 * VNNI layout at wg: per four columns 64 contiguous bytes, written in
 * order (row by row, each store went to another line of the panel: 53%
 * of building a K panel in a 32K prefill's profile); the kernels' own
 * where they have one (AVX512-VNNI: 16 x 16 transposes of 32-bit words). */
void dhsa__qi_pack16(const uint8_t *rc, int64_t ldr, int64_t n, uint8_t *wg) {
    for (int64_t qd = 0; qd < n / 4; qd++)
        for (int rr = 0; rr < 16; rr++) memcpy(wg + qd * 64 + rr * 4, rc + rr * ldr + 4 * qd, 4);
}

static void pack16(const dhsa__qi_kernels *k, const uint8_t *rc, int64_t ldr, int64_t n, uint8_t *wg) {
    (k->pack16 ? k->pack16 : dhsa__qi_pack16)(rc, ldr, n, wg);
}

/* The K panel (int8.h, ktile): rows [o0, o0 + np) into the VNNI layout
 * with each row's integer sub-block scales and mins and its super-blocks'
 * d and -dmin, then every token tile, its outputs straight into y (full
 * panels and token tiles; the rest through the thread's buffer).
 * Measured (Zen 4, 2 threads, 512 tokens, Q4_K and Q6_K at 1536 x 8960
 * and 8960 x 1536): cutting the panel along n_in into sub-panels that stay
 * in L1 over all the tokens (512 values) was slower than streaming the
 * whole panel from L2 for every tile, 0.8-0.95x. */
static void kpanel(const dhsa__mm_job *j, int64_t o0, int64_t np, char *buf) {
    const dhsa__qi_kernels *k = K(j);
    const dhsa_wmat *W = j->W;
    const int bw = j->p->bw;
    const int64_t n = W->n_in, nb = n / bw, ns = n / 256, rows = j->p->unit_rows;
    const int64_t wbytes = (j->p->ksplit ? 2 : 1) * rows * n; /* ksplit: the lows, then the highs */
    uint8_t *pw = (uint8_t *)buf; /* [ng][n/4][16][4] */
    int32_t *pS = (int32_t *)(buf + wbytes), *pM = pS + rows * nb; /* [ng][nb][16], [ng][nb/2][16] */
    float *pD = (float *)(pM + rows * (nb / 2)), *pDm = pD + rows * ns; /* [ng][ns][16] */
    const int64_t ldr = round_up(n, 64);
    uint8_t *rc16 = (uint8_t *)(buf + wbytes + 2 * rows * nb * (int64_t)sizeof(float)); /* [16][ldr] */
    float *ra = (float *)(rc16 + 16 * ldr), *rb = ra + round_up(nb, 16);
    int32_t *rS = (int32_t *)ra, *rM = (int32_t *)rb;
    float *rd = rb + round_up(nb, 16), *rdm = rd + round_up(ns, 16);
    float *out = rdm + round_up(ns, 16); /* [kmr][rows] */
    for (int64_t r = 0; r < rows; r++) {
        const int64_t g = r / 16, rr = r % 16;
        uint8_t *rc = rc16 + rr * ldr;
        if (r < np) {
            const uint8_t *row = (const uint8_t *)W->data + (o0 + r) * W->row_bytes;
            k->unpack(W->type, row, 0, n, rc, ra, rb); /* the codes (a and b are overwritten below) */
            dhsa__qi_kunpack_scalar(W->type, row, n, rS, rM, rd, rdm);
        } else {
            memset(rc, 0, (size_t)n);
            memset(rS, 0, (size_t)nb * sizeof(int32_t));
            memset(rM, 0, (size_t)nb * sizeof(int32_t));
            memset(rd, 0, (size_t)ns * sizeof(float));
            memset(rdm, 0, (size_t)ns * sizeof(float));
        }
        if (rr == 15) pack16(k, rc16, ldr, n, pw + g * n * 16);
        for (int64_t b = 0; b < nb; b++) pS[(g * nb + b) * 16 + rr] = rS[b];
        if (rr == 15 && j->p->ksplit) k->ksplit(pw + g * n * 16, pS + g * nb * 16, n, pw + rows * n + g * n * 16);
        for (int64_t b = 0; b < nb / 2; b++)
            pM[(g * (nb / 2) + b) * 16 + rr] = (int32_t)((uint32_t)(uint16_t)rM[2 * b] | (uint32_t)rM[2 * b + 1] << 16);
        for (int64_t s = 0; s < ns; s++) {
            pD[(g * ns + s) * 16 + rr] = rd[s];
            pDm[(g * ns + s) * 16 + rr] = -rdm[s];
        }
    }
    const int mr = k->kmr;
    dhsa_qi_act x[16];
    for (int64_t t0 = 0; t0 < j->n_tok; t0 += mr) {
        const int nt = j->n_tok - t0 < mr ? (int)(j->n_tok - t0) : mr;
        for (int t = 0; t < mr; t++) x[t] = act_of(j, t0 + (t < nt ? t : nt - 1));
        /* the next tile's output lines, for writing, while this one computes */
        for (int64_t t = t0 + mr; t < t0 + 2 * mr && t < j->n_tok; t++)
            for (int64_t e = 0; e < np; e += 16) __builtin_prefetch(j->y + t * j->ldy + o0 + e, 1, 3);
        if (np == rows && nt == mr) {
            k->ktile(pw, pS, pM, pD, pDm, n, bw, j->p->kz, j->p->kmin, x, j->y + t0 * j->ldy + o0, j->ldy, 0);
        } else {
            k->ktile(pw, pS, pM, pD, pDm, n, bw, j->p->kz, j->p->kmin, x, out, rows, 0);
            for (int t = 0; t < nt; t++)
                memcpy(j->y + (t0 + t) * j->ldy + o0, out + t * rows, (size_t)np * sizeof(float));
        }
    }
}

/* Rows [o0, o0 + np) (np <= 16 ng; the rest of the panel is zero) into the
 * VNNI layout, then every token tile. */
static void panel(const dhsa__mm_job *j, int64_t o0, int64_t np, char *buf) {
    const dhsa__qi_kernels *k = K(j);
    const dhsa_wmat *W = j->W;
    const int64_t n = W->n_in, nb = n / j->p->bw, rows = j->p->unit_rows;
    uint8_t *pw = (uint8_t *)buf;                     /* [ng][n/4][16][4] */
    float *pa = (float *)(buf + rows * n), *pb = pa + rows * nb; /* [ng][nb][16] */
    const int64_t ldr = round_up(n, 64);
    uint8_t *rc16 = (uint8_t *)(pb + rows * nb); /* [16][ldr] */
    float *ra = (float *)(rc16 + 16 * ldr), *rb = ra + round_up(nb, 16);
    float *out = rb + round_up(nb, 16);
    for (int64_t r = 0; r < rows; r++) {
        const int64_t g = r / 16, rr = r % 16;
        uint8_t *rc = rc16 + rr * ldr;
        float *ag = pa + g * nb * 16, *bg = pb + g * nb * 16;
        if (r < np) {
            k->unpack(W->type, (const uint8_t *)W->data + (o0 + r) * W->row_bytes, 0, n, rc, ra, rb);
        } else {
            memset(rc, 0, (size_t)n);
            memset(ra, 0, (size_t)nb * sizeof(float));
            memset(rb, 0, (size_t)nb * sizeof(float));
        }
        if (rr == 15) pack16(k, rc16, ldr, n, pw + g * n * 16);
        for (int64_t b = 0; b < nb; b++) {
            ag[b * 16 + rr] = ra[b];
            bg[b * 16 + rr] = rb[b];
        }
    }
    const int mr = k->mr;
    dhsa_qi_act x[16];
    for (int64_t t0 = 0; t0 < j->n_tok; t0 += mr) {
        const int nt = j->n_tok - t0 < mr ? (int)(j->n_tok - t0) : mr;
        for (int t = 0; t < mr; t++) x[t] = act_of(j, t0 + (t < nt ? t : nt - 1));
        memset(out, 0, (size_t)mr * (size_t)rows * sizeof(float));
        k->tile(pw, pa, pb, n, j->p->bw, j->p->cmax, x, out);
        for (int t = 0; t < nt; t++) memcpy(j->y + (t0 + t) * j->ldy + o0, out + t * rows, (size_t)np * sizeof(float));
    }
}

static void i8_rows(dhsa__mm_job *j, int64_t o0, int64_t o1, char *buf) {
    if (j->p->fused)
        fused_rows(j, o0, o1, buf);
    else if (j->p->kpanel)
        kpanel(j, o0, o1 - o0, buf);
    else
        panel(j, o0, o1 - o0, buf);
}

/* Every quantized type (i8_types' bw); x quantized first. */
const dhsa__path_impl dhsa__path_int8 = {"dhsa__qi_matmul", {0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, i8_plan,
                                         i8_prepare, i8_rows, 1};

static dhsa__mm_plan plan_of(const dhsa__qi_kernels *k, uint32_t type, int64_t n_in, int64_t n_out, int64_t n_tok,
                             int n_threads) {
    return dhsa__mm_plan_with(&dhsa__path_int8, k, k ? dhsa__qi_path_name(k, type) : NULL, type, n_in, n_out, n_tok,
                              n_threads);
}

size_t dhsa__qi_workspace(const dhsa__qi_kernels *k, uint32_t type, int64_t n_in, int64_t n_out, int64_t n_tok,
                          int n_threads) {
    if (!k || n_in % 32) return 0;
    if (k->max_tok_fused > 64) return 0; /* the fused form keeps its token list on the stack */
    return plan_of(k, type, n_in, n_out, n_tok, n_threads).ws;
}

dhsa_status dhsa__qi_matmul(dhsa_ctx *ctx, const dhsa__qi_kernels *k, const dhsa_wmat *W, const float *x, int64_t ldx,
                            int64_t n_tok, float *y, int64_t ldy) {
    if (!ctx || !k || !W || !x || !y || !W->data)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa__qi_matmul: ctx, k, W, W->data, x and y must not be NULL");
    if (!dhsa__qi_type(W->type))
        return dhsa__fail(DHSA_ERR_UNSUPPORTED, "dhsa__qi_matmul: weight type %u has no integer path", W->type);
    if (n_tok == 0) return DHSA_OK;
    const dhsa__mm_plan p = plan_of(k, W->type, W->n_in, W->n_out, n_tok, dhsa_ctx_n_threads(ctx));
    return dhsa__mm_run(ctx, &p, W, x, ldx, n_tok, y, ldy);
}

int dhsa__qi_matmul_multi(dhsa_ctx *ctx, const dhsa__qi_kernels *k, const dhsa_wmat *const *W, int nw, const float *x,
                          int64_t ldx, int64_t n_tok, float *const *y, dhsa_status *st) {
    *st = DHSA_OK;
    if (!ctx || !k || nw < 1 || nw > 4 || n_tok < 1 || n_tok > k->max_tok_fused) return 0;
    dhsa__mm_plan p[4];
    for (int i = 0; i < nw; i++) {
        if (!W[i]) return 0;
        p[i] = plan_of(k, W[i]->type, W[i]->n_in, W[i]->n_out, n_tok, dhsa_ctx_n_threads(ctx));
    }
    return dhsa__mm_run_multi(ctx, p, W, nw, x, ldx, n_tok, y, st);
}
