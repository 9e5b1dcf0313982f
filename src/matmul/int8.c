/* int8.c: the integer route of the weight products (contract in int8.h,
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
 *          tile over every token (prefill).
 *
 * Run: make build/tests/test_qint && build/tests/test_qint.
 */
#include "matmul/int8.h"

#include "core/internal.h"

#include <math.h>
#include <string.h>

/* ------------------------------------------------------------ formats --- */

static inline float half(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return dhsa_f16_to_f32(h);
}

static const int8_t iq4_grid[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

static inline void q4k_scale_min(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

static inline int q3k_scale(const uint8_t *s, int j) {
    int lo = j < 8 ? s[j] & 15 : s[j - 8] >> 4;
    return lo | ((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4;
}

static inline int iq4xs_scale(const uint8_t *blk, int ib) {
    unsigned sh = (unsigned)blk[2] | (unsigned)blk[3] << 8;
    return ((blk[4 + ib / 2] >> (4 * (ib % 2))) & 15) | ((sh >> (2 * ib)) & 3) << 4;
}

int dhsa__qi_type(uint32_t type) { return dhsa__qi_bw(type) != 0; }

int dhsa__qi_bw(uint32_t type) {
    switch (type) {
    case DHSA_GGML_Q8_0:
    case DHSA_GGML_Q4_0:
    case DHSA_GGML_Q4_1:
    case DHSA_GGML_Q5_0:
    case DHSA_GGML_Q5_1:
    case DHSA_GGML_IQ4_NL:
    case DHSA_GGML_IQ4_XS:
    case DHSA_GGML_Q4_K:
    case DHSA_GGML_Q5_K: return 32;
    case DHSA_GGML_Q2_K:
    case DHSA_GGML_Q3_K:
    case DHSA_GGML_Q6_K: return 16;
    default: return 0;
    }
}

int dhsa__qi_code_max(uint32_t type) {
    switch (type) {
    case DHSA_GGML_Q8_0:
    case DHSA_GGML_IQ4_NL:
    case DHSA_GGML_IQ4_XS: return 255;
    case DHSA_GGML_Q6_K: return 63;
    case DHSA_GGML_Q5_0:
    case DHSA_GGML_Q5_1:
    case DHSA_GGML_Q5_K: return 31;
    case DHSA_GGML_Q4_0:
    case DHSA_GGML_Q4_1:
    case DHSA_GGML_Q4_K: return 15;
    case DHSA_GGML_Q3_K: return 7;
    case DHSA_GGML_Q2_K: return 3;
    default: return 0;
    }
}

/* Block layouts: quant.c's comment above dequant_scalar. */
void dhsa__qi_unpack_scalar(uint32_t type, const uint8_t *row, int64_t k0, int64_t kn, uint8_t *c, float *a,
                            float *b) {
    switch (type) {
    case DHSA_GGML_Q8_0:
        for (int64_t i = 0; i < kn / 32; i++, c += 32) {
            const uint8_t *blk = row + (k0 / 32 + i) * 34;
            float d = half(blk);
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
            float d = half(blk);
            uint32_t qh = 0;
            if (type == DHSA_GGML_Q5_0) memcpy(&qh, blk + 2, 4);
            if (type == DHSA_GGML_Q5_1) memcpy(&qh, blk + 4, 4);
            const uint8_t *qs = blk + (type == DHSA_GGML_Q5_0   ? 6
                                       : type == DHSA_GGML_Q5_1 ? 8
                                       : type == DHSA_GGML_Q4_1 ? 4
                                                                : 2);
            for (int j = 0; j < 32; j++) {
                int q = (j < 16 ? qs[j] & 15 : qs[j - 16] >> 4) | (int)((qh >> j) & 1u) << 4;
                c[j] = (uint8_t)(type == DHSA_GGML_IQ4_NL ? iq4_grid[q] + 128 : q);
            }
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
    case DHSA_GGML_Q4_K:
    case DHSA_GGML_Q5_K: {
        const int five = type == DHSA_GGML_Q5_K;
        for (int64_t i = 0; i < kn / 256; i++, c += 256, a += 8, b += 8) {
            const uint8_t *blk = row + (k0 / 256 + i) * (five ? 176 : 144);
            float d = half(blk), dmin = half(blk + 2);
            const uint8_t *qh = blk + 16, *qs = blk + (five ? 48 : 16);
            for (int u = 0; u < 4; u++)
                for (int h = 0; h < 2; h++) {
                    int sc, m;
                    q4k_scale_min(blk + 4, 2 * u + h, &sc, &m);
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
            float d = half(blk + 208);
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
            float d = half(blk + (q2 ? 80 : 108)), dmin = q2 ? half(blk + 82) : 0.0f;
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
                    a[j] = d * (float)(q3k_scale(blk + 96, j) - 32);
                    b[j] = -4.0f * a[j];
                }
            }
        }
        return;
    case DHSA_GGML_IQ4_XS:
        for (int64_t i = 0; i < kn / 256; i++, c += 256, a += 8, b += 8) {
            const uint8_t *blk = row + (k0 / 256 + i) * 136;
            float d = half(blk);
            for (int ib = 0; ib < 8; ib++) {
                const uint8_t *qs = blk + 8 + 16 * ib;
                for (int j = 0; j < 16; j++) {
                    c[32 * ib + j] = (uint8_t)(iq4_grid[qs[j] & 15] + 128);
                    c[32 * ib + 16 + j] = (uint8_t)(iq4_grid[qs[j] >> 4] + 128);
                }
                a[ib] = d * (float)(iq4xs_scale(blk, ib) - 32);
                b[ib] = -128.0f * a[ib];
            }
        }
        return;
    default: return;
    }
}

int dhsa__qi_sb(uint32_t type) {
    switch (type) {
    case DHSA_GGML_Q2_K:
    case DHSA_GGML_Q3_K:
    case DHSA_GGML_Q4_K:
    case DHSA_GGML_Q5_K:
    case DHSA_GGML_Q6_K: return 256;
    default: return dhsa__qi_bw(type) ? 32 : 0;
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
                                          dot_rows_scalar, tile_scalar, NULL};

const dhsa__qi_kernels *dhsa__qi_kernels_active(void) {
#if defined(__x86_64__)
    /* the best the level allows and the build has (a kernel file built
     * without its flags leaves a NULL name) */
    const dhsa__idot d = dhsa__idot_active();
    if (d >= DHSA__IDOT_AVX512VNNI && dhsa__qi_vnni.name) return &dhsa__qi_vnni;
    if (d >= DHSA__IDOT_AVXVNNI && dhsa__qi_avxvnni.name) return &dhsa__qi_avxvnni;
    if (d >= DHSA__IDOT_AVX2 && dhsa__qi_avx2.name) return &dhsa__qi_avx2;
#endif
    return NULL;
}

int dhsa__qi_fused_exact(const dhsa__qi_kernels *k, uint32_t type) {
#if defined(__x86_64__)
    if (k == &dhsa__qi_vnni)
        return !(k->dot_file && k->dot_file(type, NULL, 0, 0, 0, NULL, 0, NULL, 0, 0));
#endif
    (void)k;
    (void)type;
    return 0;
}

const char *dhsa__qi_route_name(const dhsa__qi_kernels *k) {
#if defined(__x86_64__)
    if (k == &dhsa__qi_vnni) return "int8 avx512-vnni";
    if (k == &dhsa__qi_avxvnni) return "int8 avx-vnni";
    if (k == &dhsa__qi_avx2) return "int8 avx2";
#endif
    return k == &dhsa__qi_scalar ? "int8 scalar" : "int8";
}

/* ------------------------------------------------------------- driver --- */


/* Task sizes. Fused (decode): 512 KB of weights a task where the product
 * is large, so that a thread's stream of rows (and the kernels' prefetch
 * far ahead, int8_vnni.c) runs on across few task boundaries (Q4_K 2048 x
 * 131072, 2 threads: 77-79% of a plain read with 128 KB tasks, 85-88% with
 * 512 KB); small products still cut into up to 4 tasks per thread of at
 * least 128 KB, as before. Panel: as the exact route's (quant.c). */
#define QI_FUSED_TASK_BYTES (512 * 1024)
#define QI_FUSED_TASK_MIN (128 * 1024)
#define QI_PANEL_TASK_FLOPS (4.0e6)

typedef struct {
    int fused;
    int64_t ldq, nxd, nxs;  /* activation row: codes (bytes), scales, block sums */
    size_t act_bytes;       /* all tokens' activations */
    int64_t rows;           /* rows per unit: 1 (fused) or 16 ng (panel) */
    int64_t unit_rows, n_units, n_tasks;
    size_t per_thread, ws;
} qi_plan;

static qi_plan qi_make_plan(const dhsa__qi_kernels *k, uint32_t type, int64_t n_in, int64_t n_out, int64_t n_tok,
                            int n_threads) {
    qi_plan p;
    memset(&p, 0, sizeof p);
    const int bw = dhsa__qi_bw(type);
    p.fused = n_tok <= k->max_tok_fused;
    p.ldq = round_up(n_in, 64);
    p.nxd = round_up(n_in / 32, 16);
    p.nxs = round_up(n_in / 16, 16); /* the most a type needs: workspace alike for every type */
    p.act_bytes = (size_t)n_tok * ((size_t)p.ldq + (size_t)(p.nxd + p.nxs) * sizeof(float));
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
        /* the panel (codes, a, b), one row's unpacked codes/a/b, the out tile */
        p.per_thread = (size_t)p.unit_rows * (size_t)n_in + 2 * (size_t)p.unit_rows * (size_t)nb * sizeof(float) +
                       (size_t)round_up(n_in, 64) + 2 * (size_t)round_up(nb, 16) * sizeof(float) +
                       (size_t)k->mr * (size_t)p.unit_rows * sizeof(float) + 64;
    }
    p.per_thread = (size_t)round_up((int64_t)p.per_thread, 64);
    int users = p.n_tasks == 1 || n_threads <= 1 ? 1 : n_threads;
    p.ws = round_up((int64_t)p.act_bytes, 64) + (size_t)users * p.per_thread;
    return p;
}

typedef struct {
    const dhsa__qi_kernels *k;
    const dhsa_wmat *W;
    const float *x;
    int64_t ldx, n_tok;
    float *y;
    int64_t ldy;
    int bw, sb, cmax;
    qi_plan p;
    char *ws;
    int8_t *q; /* [n_tok][ldq] */
    float *xd; /* [n_tok][nxd] */
    float *xs; /* [n_tok][nxs] */
    int own_buf; /* each thread its own buffer even with one task (several products in one job) */
} qi_job;

static dhsa_qi_act act_of(const qi_job *j, int64_t t) {
    dhsa_qi_act a = {j->q + t * j->p.ldq, j->xd + t * j->p.nxd, j->xs + t * j->p.nxs};
    return a;
}

static void quant_task(void *arg, int64_t task, int thread) {
    (void)thread;
    const qi_job *j = arg;
    int64_t t0 = task * j->n_tok / 64, t1 = (task + 1) * j->n_tok / 64;
    if (j->n_tok < 64) {
        t0 = task;
        t1 = task + 1;
    }
    for (int64_t t = t0; t < t1; t++)
        j->k->quant_act(j->x + t * j->ldx, j->W->n_in, j->bw, j->sb, j->q + t * j->p.ldq, j->xd + t * j->p.nxd,
                        j->xs + t * j->p.nxs);
}

/* The fused route works on column chunks of QI_FUSED_KC: the rows of a
 * group are unpacked and multiplied a chunk at a time, so that the loads of
 * the weights and the arithmetic interleave at a fine grain (a whole row
 * unpacked first leaves the memory system idle during its products). */
#define QI_FUSED_KC 1024

static void fused_rows(const qi_job *j, int64_t o0, int64_t o1, char *buf) {
    const dhsa_wmat *W = j->W;
    const int64_t n = W->n_in, nb = n / j->bw, ldc = round_up(n, 64), ldab = round_up(nb, 16);
    const int R = j->k->fused_rows;
    const int64_t blk = dhsa__wt_block(W->type), blk_bytes = dhsa__wt_block_bytes(W->type);
    uint8_t *c = (uint8_t *)buf;
    float *a = (float *)(buf + R * ldc), *b = a + R * ldab;
    const int nt = (int)j->n_tok;
    if (j->k->dot_file) { /* whole rows from the file's blocks, no unpacked copy (int8.h): all of them in one call */
        dhsa_qi_act x[64];
        for (int t = 0; t < nt; t++) x[t] = act_of(j, t);
        if (j->k->dot_file(W->type, (const uint8_t *)W->data + o0 * W->row_bytes, W->row_bytes, (int)(o1 - o0), n, x,
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
                x[t].xs += k0 / j->bw;
            }
            for (int r = 0; r < R; r++) /* past the last row: the last row again, its results dropped */
                j->k->unpack(W->type, row + (r < nr ? r : nr - 1) * W->row_bytes, k0, kn, c + r * ldc,
                             a + r * ldab, b + r * ldab);
            j->k->dot_rows(c, ldc, a, b, ldab, nr, kn, j->bw, j->cmax, x, nt, j->y + o, j->ldy, k0 > 0);
        }
    }
}

/* Rows [o0, o0 + np) (np <= 16 ng; the rest of the panel is zero) into the
 * VNNI layout, then every token tile. */
static void panel(const qi_job *j, int64_t o0, int64_t np, char *buf) {
    const dhsa__qi_kernels *k = j->k;
    const dhsa_wmat *W = j->W;
    const int64_t n = W->n_in, nb = n / j->bw, rows = j->p.unit_rows;
    uint8_t *pw = (uint8_t *)buf;                     /* [ng][n/4][16][4] */
    float *pa = (float *)(buf + rows * n), *pb = pa + rows * nb; /* [ng][nb][16] */
    uint8_t *rc = (uint8_t *)(pb + rows * nb);
    float *ra = (float *)(rc + round_up(n, 64)), *rb = ra + round_up(nb, 16);
    float *out = rb + round_up(nb, 16);
    for (int64_t r = 0; r < rows; r++) {
        const int64_t g = r / 16, rr = r % 16;
        uint8_t *wg = pw + g * n * 16;
        float *ag = pa + g * nb * 16, *bg = pb + g * nb * 16;
        if (r < np) {
            k->unpack(W->type, (const uint8_t *)W->data + (o0 + r) * W->row_bytes, 0, n, rc, ra, rb);
        } else {
            memset(rc, 0, (size_t)n);
            memset(ra, 0, (size_t)nb * sizeof(float));
            memset(rb, 0, (size_t)nb * sizeof(float));
        }
        for (int64_t qd = 0; qd < n / 4; qd++) memcpy(wg + qd * 64 + rr * 4, rc + 4 * qd, 4);
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
        k->tile(pw, pa, pb, n, j->bw, j->cmax, x, out);
        for (int t = 0; t < nt; t++) memcpy(j->y + (t0 + t) * j->ldy + o0, out + t * rows, (size_t)np * sizeof(float));
    }
}

static void mm_task(void *arg, int64_t task, int thread) {
    const qi_job *j = arg;
    int64_t u0 = task * j->p.n_units / j->p.n_tasks, u1 = (task + 1) * j->p.n_units / j->p.n_tasks;
    char *buf = j->ws + round_up((int64_t)j->p.act_bytes, 64) + (size_t)thread * j->p.per_thread;
    if (j->p.n_tasks == 1 && !j->own_buf) buf = j->ws + round_up((int64_t)j->p.act_bytes, 64);
    for (int64_t u = u0; u < u1; u++) {
        int64_t o0 = u * j->p.unit_rows;
        int64_t np = j->W->n_out - o0 < j->p.unit_rows ? j->W->n_out - o0 : j->p.unit_rows;
        if (j->p.fused)
            fused_rows(j, o0, o0 + np, buf);
        else
            panel(j, o0, np, buf);
    }
}

size_t dhsa__qi_workspace(const dhsa__qi_kernels *k, uint32_t type, int64_t n_in, int64_t n_out, int64_t n_tok,
                          int n_threads) {
    if (!k || !dhsa__qi_type(type) || n_in <= 0 || n_out <= 0 || n_tok <= 0 || n_in % 32) return 0;
    if (k->max_tok_fused > 64) return 0; /* the fused route keeps its token list on the stack */
    return qi_make_plan(k, type, n_in, n_out, n_tok, n_threads).ws;
}

dhsa_status dhsa__qi_matmul(dhsa_ctx *ctx, const dhsa__qi_kernels *k, const dhsa_wmat *W, const float *x, int64_t ldx,
                            int64_t n_tok, float *y, int64_t ldy) {
    if (!ctx || !k || !W || !x || !y || !W->data)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa__qi_matmul: ctx, k, W, W->data, x and y must not be NULL");
    if (!dhsa__qi_type(W->type))
        return dhsa__fail(DHSA_ERR_UNSUPPORTED, "dhsa__qi_matmul: weight type %u has no integer route", W->type);
    if (n_tok == 0) return DHSA_OK;
    qi_job j;
    memset(&j, 0, sizeof j);
    j.k = k;
    j.W = W;
    j.x = x;
    j.ldx = ldx;
    j.n_tok = n_tok;
    j.y = y;
    j.ldy = ldy;
    j.bw = dhsa__qi_bw(W->type);
    j.sb = dhsa__qi_sb(W->type);
    j.cmax = dhsa__qi_code_max(W->type);
    j.p = qi_make_plan(k, W->type, W->n_in, W->n_out, n_tok, dhsa_ctx_n_threads(ctx));
    dhsa_status st = DHSA_OK;
    dhsa__ctx_lock(ctx);
    j.ws = dhsa__scratch(ctx, j.p.ws, &st);
    if (!j.ws) {
        dhsa__ctx_unlock(ctx);
        return st;
    }
    j.q = (int8_t *)j.ws;
    j.xd = (float *)(j.ws + (size_t)n_tok * (size_t)j.p.ldq);
    j.xs = j.xd + n_tok * j.p.nxd;
    /* few tokens: quantized here (about a microsecond a row), sparing a
     * second wake-up of the threads; many: in parallel over tokens */
    if (n_tok <= 8)
        for (int64_t t = 0; t < n_tok; t++) quant_task(&j, t, 0);
    else
        dhsa_parallel_for(ctx, n_tok < 64 ? n_tok : 64, quant_task, &j);
    dhsa_parallel_for(ctx, j.p.n_tasks, mm_task, &j);
    dhsa__ctx_unlock(ctx);
    return DHSA_OK;
}

/* Several products of one activation in one parallel job (the products of
 * a layer that read the same x: q, k, v; gate, up). A decode step is made
 * of small products: one job each costs a wake-up and a barrier each, and
 * a product under two tasks' worth (k and v of a small model) ran on the
 * calling thread alone while the others waited. Here the tasks of all the
 * products form one list and x is quantized once. Each product's tasks,
 * rows and sums are those of its own call, so every y is bitwise what
 * dhsa__qi_matmul gives. */
#define QI_MULTI_MAX 4
typedef struct {
    qi_job j[QI_MULTI_MAX];
    int64_t first[QI_MULTI_MAX + 1]; /* product i has tasks [first[i], first[i + 1]) */
    int nw;
} qi_multi_job;

static void multi_task(void *arg, int64_t task, int thread) {
    qi_multi_job *m = arg;
    int i = 0;
    while (task >= m->first[i + 1]) i++;
    mm_task(&m->j[i], task - m->first[i], thread);
}

int dhsa__qi_matmul_multi(dhsa_ctx *ctx, const dhsa__qi_kernels *k, const dhsa_wmat *const *W, int nw, const float *x,
                          int64_t ldx, int64_t n_tok, float *const *y, dhsa_status *st) {
    *st = DHSA_OK;
    if (!ctx || !k || nw < 1 || nw > QI_MULTI_MAX || n_tok < 1 || n_tok > k->max_tok_fused) return 0;
    const int nth = dhsa_ctx_n_threads(ctx);
    qi_multi_job m;
    memset(&m, 0, sizeof m);
    m.nw = nw;
    size_t per_thread = 0, single_ws = 0;
    for (int i = 0; i < nw; i++) {
        if (!W[i] || !W[i]->data || !y[i] || W[i]->type != W[0]->type || W[i]->n_in != W[0]->n_in ||
            !dhsa__qi_type(W[i]->type))
            return 0;
        qi_job *j = &m.j[i];
        j->k = k;
        j->W = W[i];
        j->x = x;
        j->ldx = ldx;
        j->n_tok = n_tok;
        j->y = y[i];
        j->ldy = W[i]->n_out;
        j->bw = dhsa__qi_bw(W[i]->type);
        j->sb = dhsa__qi_sb(W[i]->type);
        j->cmax = dhsa__qi_code_max(W[i]->type);
        j->p = qi_make_plan(k, W[i]->type, W[i]->n_in, W[i]->n_out, n_tok, nth);
        j->own_buf = 1;
        if (j->p.per_thread > per_thread) per_thread = j->p.per_thread;
        if (j->p.ws > single_ws) single_ws = j->p.ws;
        m.first[i + 1] = m.first[i] + j->p.n_tasks;
    }
    /* the session planned its scratch for the single products: beyond it,
     * make them one at a time */
    const size_t act = (size_t)round_up((int64_t)m.j[0].p.act_bytes, 64);
    const size_t ws = act + (size_t)nth * per_thread;
    if (ws > single_ws || m.first[nw] < 2) return 0;
    dhsa__ctx_lock(ctx);
    char *buf = dhsa__scratch(ctx, ws, st);
    if (!buf) {
        dhsa__ctx_unlock(ctx);
        return 1;
    }
    for (int i = 0; i < nw; i++) {
        qi_job *j = &m.j[i];
        j->ws = buf;
        j->p.per_thread = per_thread;
        j->q = (int8_t *)buf;
        j->xd = (float *)(buf + (size_t)n_tok * (size_t)j->p.ldq);
        j->xs = j->xd + n_tok * j->p.nxd;
    }
    for (int64_t t = 0; t < n_tok; t++) quant_task(&m.j[0], t, 0);
    dhsa_parallel_for(ctx, m.first[nw], multi_task, &m);
    dhsa__ctx_unlock(ctx);
    return 1;
}
