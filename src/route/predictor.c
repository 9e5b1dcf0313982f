/* predictor.c: the learned DHSA boundary predictor: its file format
 * (reader with every size checked before use, writer), random
 * initialisation, and batched inference. The network and the format are
 * described in include/dhsa.h and docs/predictor.md.
 *
 * Inference runs positions in slabs of SLAB candidates (plus w tokens of
 * halo on each side): the two large products, the Q/K/V projections of each
 * token and the first MLP layer of each window's features, go through the
 * tiled attention's qk micro-kernel against weights packed once at load
 * into [tiles][rows][64] column panels; the 2w x 2w window attention,
 * LayerNorm and pooling of each candidate are the window kernel, one per
 * ISA (scalar here, the reference; predictor_avx2.c, predictor_avx512.c),
 * chosen at run time (DHSA_FORCE_SCALAR=1 forces the scalar one). Slabs run
 * in parallel. The three steps are shared with the decode index
 * (kv_index.c), which runs them on keys as they arrive: every step computes
 * a row from that row alone, so both give a candidate the same bits.
 * The struct is in predictor_internal.h, shared with the trainer
 * (predictor_train.c, which keeps its own double-precision forward).
 * Tested by tests/test_predictor.c (naive double forward, every ISA's window
 * kernel against the scalar one, parser fuzzing) and tests/test_train.c (the
 * trainer's forward agrees with this one).
 */
#include "route/predictor_internal.h"
#include "util/outfile.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn/kern.h"

#define MAGIC "DHSAPRD1"
#define HEADER 28 /* magic 8 + 5 x u32 */
#define PANEL 64
#define SLAB 512

/* ---------------------------------------------------------------- crc32 --- */

static uint32_t crc32_update(uint32_t crc, const unsigned char *p, size_t n) {
    crc = ~crc;
    for (size_t i = 0; i < n; i++) {
        crc ^= p[i];
        for (int k = 0; k < 8; k++) crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1u)));
    }
    return ~crc;
}

/* ------------------------------------------------------------- layout --- */

size_t dhsa__predictor_raw_floats(int64_t C, int64_t hidden) {
    size_t c = (size_t)C, h = (size_t)hidden, f = 4 * c + 1;
    return 3 * (c * c + c) + 2 * c + f * h + h + h + 1;
}

dhsa_status dhsa__predictor_alloc(int64_t C, int64_t w, int64_t hidden, dhsa_predictor **out) {
    *out = NULL;
    if (C < 1 || C > 8192 || w < 1 || w > 64 || hidden < 1 || hidden > 4096)
        return dhsa__fail(DHSA_ERR_FORMAT,
                          "predictor sizes C=%lld w=%lld hidden=%lld: need 1 <= C <= 8192, 1 <= w <= 64, "
                          "1 <= hidden <= 4096",
                          (long long)C, (long long)w, (long long)hidden);
    dhsa_predictor *pr = calloc(1, sizeof *pr);
    if (!pr) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory");
    pr->C = C;
    pr->w = w;
    pr->hidden = hidden;
    pr->tiles_c = (C + PANEL - 1) / PANEL;
    pr->tiles_h = (hidden + PANEL - 1) / PANEL;
    size_t c = (size_t)C, f = 4 * c + 1;
    size_t packed = 3 * (size_t)pr->tiles_c * c * PANEL + (size_t)pr->tiles_h * f * PANEL;
    pr->mem = calloc(dhsa__predictor_raw_floats(C, hidden) + packed, sizeof(float));
    if (!pr->mem) {
        free(pr);
        return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory for a predictor of C = %lld", (long long)C);
    }
    float *m = pr->mem;
    pr->wq = m, m += c * c;
    pr->bq = m, m += c;
    pr->wk = m, m += c * c;
    pr->bk = m, m += c;
    pr->wv = m, m += c * c;
    pr->bv = m, m += c;
    pr->gamma = m, m += c;
    pr->beta = m, m += c;
    pr->w1 = m, m += f * (size_t)hidden;
    pr->b1 = m, m += (size_t)hidden;
    pr->w2 = m, m += (size_t)hidden;
    m += 1; /* b2 slot (kept in the struct) */
    pr->proj = m, m += 3 * (size_t)pr->tiles_c * c * PANEL;
    pr->mlp = m;
    *out = pr;
    return DHSA_OK;
}

/* Column panels: dst[t][r][i] = src[r][t * 64 + i] (0 beyond cols). */
static void pack(const float *src, int64_t rows, int64_t cols, float *dst) {
    int64_t tiles = (cols + PANEL - 1) / PANEL;
    for (int64_t t = 0; t < tiles; t++)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t i = 0; i < PANEL; i++) {
                int64_t c = t * PANEL + i;
                dst[(t * rows + r) * PANEL + i] = c < cols ? src[r * cols + c] : 0.0f;
            }
}

void dhsa__predictor_pack(dhsa_predictor *pr) {
    int64_t C = pr->C, tc = pr->tiles_c;
    pack(pr->wq, C, C, pr->proj);
    pack(pr->wk, C, C, pr->proj + tc * C * PANEL);
    pack(pr->wv, C, C, pr->proj + 2 * tc * C * PANEL);
    pack(pr->w1, 4 * C + 1, pr->hidden, pr->mlp);
}

void dhsa_predictor_free(dhsa_predictor *pr) {
    if (!pr) return;
    free(pr->mem);
    free(pr);
}

int64_t dhsa_predictor_width(const dhsa_predictor *pr) { return pr ? pr->C : 0; }
int64_t dhsa_predictor_window(const dhsa_predictor *pr) { return pr ? pr->w : 0; }

/* ------------------------------------------------------------ file i/o --- */

static uint32_t rd32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void wr32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

dhsa_status dhsa_predictor_load_memory(const void *data, size_t size, dhsa_predictor **out) {
    if (!out) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_predictor_load_memory: out is NULL");
    *out = NULL;
    const unsigned char *p = data;
    if (!p && size) return dhsa__fail(DHSA_ERR_INVALID_ARG, "predictor data is NULL");
    if (size < HEADER + 4)
        return dhsa__fail(DHSA_ERR_FORMAT, "predictor file of %zu bytes is shorter than its %d-byte header",
                          size, HEADER + 4);
    if (memcmp(p, MAGIC, 8) != 0) return dhsa__fail(DHSA_ERR_FORMAT, "not a predictor file (magic is not DHSAPRD1)");
    uint32_t version = rd32(p + 8), C = rd32(p + 12), w = rd32(p + 16), hidden = rd32(p + 20),
             reserved = rd32(p + 24);
    if (version != 1) return dhsa__fail(DHSA_ERR_FORMAT, "predictor file version %u (this build reads 1)", version);
    if (reserved != 0) return dhsa__fail(DHSA_ERR_FORMAT, "predictor header field 6 must be 0, is %u", reserved);
    if (C < 1 || C > 8192 || w < 1 || w > 64 || hidden < 1 || hidden > 4096)
        return dhsa__fail(DHSA_ERR_FORMAT,
                          "predictor sizes C=%u w=%u hidden=%u: need 1 <= C <= 8192, 1 <= w <= 64, "
                          "1 <= hidden <= 4096",
                          C, w, hidden);
    size_t n = dhsa__predictor_raw_floats(C, hidden), want = HEADER + 4 * n + 4;
    if (size != want)
        return dhsa__fail(DHSA_ERR_FORMAT,
                          "predictor file is %zu bytes; C=%u, hidden=%u need exactly %zu (truncated or "
                          "trailing data)",
                          size, C, hidden, want);
    uint32_t crc = crc32_update(0, p, size - 4), stored = rd32(p + size - 4);
    if (crc != stored)
        return dhsa__fail(DHSA_ERR_FORMAT, "predictor file is corrupt: CRC-32 %08x, stored %08x", crc, stored);
    dhsa_predictor *pr;
    dhsa_status st = dhsa__predictor_alloc(C, w, hidden, &pr);
    if (st) return st;
    const unsigned char *q = p + HEADER;
    for (size_t i = 0; i < n; i++) {
        uint32_t u = rd32(q + 4 * i);
        float f;
        memcpy(&f, &u, 4);
        if (!isfinite(f)) {
            dhsa_predictor_free(pr);
            return dhsa__fail(DHSA_ERR_NONFINITE, "predictor weight %zu of %zu is not finite (%g)", i, n, (double)f);
        }
        if (i + 1 == n) pr->b2 = f;
        else pr->mem[i] = f;
    }
    dhsa__predictor_pack(pr);
    *out = pr;
    return DHSA_OK;
}

dhsa_status dhsa_predictor_load(const char *path, dhsa_predictor **out) {
    if (!path || !out) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_predictor_load: NULL argument");
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return dhsa__fail(DHSA_ERR_IO, "cannot open predictor file %s: %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return dhsa__fail(DHSA_ERR_IO, "cannot seek in %s", path);
    }
    long len = ftell(f);
    if (len < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return dhsa__fail(DHSA_ERR_IO, "cannot size %s", path);
    }
    /* the largest legal file: C = 8192, hidden = 4096 */
    if ((unsigned long)len > HEADER + 4 * dhsa__predictor_raw_floats(8192, 4096) + 4) {
        fclose(f);
        return dhsa__fail(DHSA_ERR_FORMAT, "%s is %ld bytes, larger than any predictor file", path, len);
    }
    unsigned char *buf = malloc((size_t)len + 1);
    if (!buf) {
        fclose(f);
        return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory reading %s", path);
    }
    size_t got = fread(buf, 1, (size_t)len, f);
    fclose(f);
    if (got != (size_t)len) {
        free(buf);
        return dhsa__fail(DHSA_ERR_IO, "short read of %s", path);
    }
    dhsa_status st = dhsa_predictor_load_memory(buf, (size_t)len, out);
    free(buf);
    if (st) { /* the sentence names the file */
        char msg[400];
        snprintf(msg, sizeof msg, "%s", dhsa_last_error());
        return dhsa__fail(st, "predictor file %s: %s", path, msg);
    }
    return DHSA_OK;
}

dhsa_status dhsa_predictor_save(const dhsa_predictor *pr, const char *path) {
    if (!pr || !path) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_predictor_save: NULL argument");
    size_t n = dhsa__predictor_raw_floats(pr->C, pr->hidden), size = HEADER + 4 * n + 4;
    unsigned char *buf = malloc(size);
    if (!buf) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory");
    memcpy(buf, MAGIC, 8);
    wr32(buf + 8, 1);
    wr32(buf + 12, (uint32_t)pr->C);
    wr32(buf + 16, (uint32_t)pr->w);
    wr32(buf + 20, (uint32_t)pr->hidden);
    wr32(buf + 24, 0);
    for (size_t i = 0; i < n; i++) {
        float f = i + 1 == n ? pr->b2 : pr->mem[i];
        uint32_t u;
        memcpy(&u, &f, 4);
        wr32(buf + HEADER + 4 * i, u);
    }
    wr32(buf + size - 4, crc32_update(0, buf, size - 4));
    dhsa_outfile o; /* a temporary renamed into place (util/outfile.h) */
    dhsa_status st = dhsa_outfile_open(&o, path);
    if (st == DHSA_OK) {
        fwrite(buf, 1, size, o.f); /* a short write shows in the stream's error flag */
        st = dhsa_outfile_commit(&o);
    }
    free(buf);
    return st;
}

static uint64_t mix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float uni(uint64_t *s, float a) { /* uniform in [-a, a] */
    return (float)(((double)(mix(s) >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0) * a);
}

dhsa_status dhsa_predictor_create_random(int64_t C, int64_t w, int64_t hidden, uint64_t seed,
                                         dhsa_predictor **out) {
    if (!out) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_predictor_create_random: out is NULL");
    dhsa_predictor *pr;
    dhsa_status st = dhsa__predictor_alloc(C, w, hidden, &pr);
    if (st) return st;
    uint64_t s = seed;
    size_t c = (size_t)C, f = 4 * c + 1, h = (size_t)hidden;
    float ac = (float)sqrt(3.0 / (double)C), af = (float)sqrt(6.0 / (double)(f + h)), ah = (float)sqrt(3.0 / (double)h);
    for (size_t i = 0; i < c * c; i++) pr->wq[i] = uni(&s, ac), pr->wk[i] = uni(&s, ac), pr->wv[i] = uni(&s, ac);
    for (size_t i = 0; i < c; i++) pr->gamma[i] = 1.0f;
    for (size_t i = 0; i < f * h; i++) pr->w1[i] = uni(&s, af);
    for (size_t i = 0; i < h; i++) pr->w2[i] = uni(&s, ah);
    pr->b2 = 0.0f;
    dhsa__predictor_pack(pr);
    *out = pr;
    return DHSA_OK;
}

/* ------------------------------------------------------------ inference --- */

void dhsa__predictor_project(const dhsa_predictor *pr, const dhsa_attn_kernels *kern, const float *X, int64_t T,
                             float *Q, float *K, float *V, float *Pn) {
    const int64_t C = pr->C;
    /* Y[r][o] = X[r] . W[:, o] + b[o], 64 output columns at a time */
    float *Y[3] = {Q, K, V};
    const float *bias[3] = {pr->bq, pr->bk, pr->bv};
    for (int m = 0; m < 3; m++)
        for (int64_t tile = 0; tile < pr->tiles_c; tile++) {
            const float *panel = pr->proj + ((int64_t)m * pr->tiles_c + tile) * C * PANEL;
            for (int64_t r0 = 0; r0 < T; r0 += DHSA_BC) {
                int rn = (int)(T - r0 < DHSA_BC ? T - r0 : DHSA_BC);
                kern->qk(X + r0 * C, C, rn, (int)C, panel, PANEL, Pn);
                for (int r = 0; r < rn; r++)
                    for (int64_t i = 0; i < PANEL && tile * PANEL + i < C; i++)
                        Y[m][(r0 + r) * C + tile * PANEL + i] = Pn[r * PANEL + i] + bias[m][tile * PANEL + i];
            }
        }
}

size_t dhsa__predictor_window_ws(const dhsa_predictor *pr) {
    /* A [2w][2w], then l, r, h [C] each; each piece 16-float aligned */
    return dhsa__align_up(4 * (size_t)pr->w * (size_t)pr->w, 16) + 3 * dhsa__align_up((size_t)pr->C, 16);
}

/* The reference window kernel: plain loops, LayerNorm statistics and the
 * cosine in double. */
void dhsa__predictor_window_scalar(const dhsa_predictor *pr, const float *X, const float *Q, const float *K,
                                   const float *V, float *ws, float *f) {
    const int64_t C = pr->C, w = pr->w, W2 = 2 * w;
    float *A = ws;                                           /* [2w][2w] */
    float *l = A + dhsa__align_up((size_t)(W2 * W2), 16);    /* [C] */
    float *r = l + dhsa__align_up((size_t)C, 16);            /* [C] */
    float *h = r + dhsa__align_up((size_t)C, 16);            /* [C]: one H row at a time */
    const float inv = (float)(1.0 / sqrt((double)C));
    for (int64_t i = 0; i < W2; i++) {
        float mx = -INFINITY;
        for (int64_t k2 = 0; k2 < W2; k2++) {
            const float *qi = Q + i * C, *kk = K + k2 * C;
            float s = 0;
            for (int64_t c = 0; c < C; c++) s += qi[c] * kk[c];
            A[i * W2 + k2] = s * inv;
            if (A[i * W2 + k2] > mx) mx = A[i * W2 + k2];
        }
        float sum = 0;
        for (int64_t k2 = 0; k2 < W2; k2++) sum += A[i * W2 + k2] = expf(A[i * W2 + k2] - mx);
        for (int64_t k2 = 0; k2 < W2; k2++) A[i * W2 + k2] /= sum;
    }
    memset(l, 0, (size_t)C * sizeof(float));
    memset(r, 0, (size_t)C * sizeof(float));
    for (int64_t i = 0; i < W2; i++) {
        const float *x = X + i * C;
        for (int64_t c = 0; c < C; c++) {
            float s = x[c];
            for (int64_t k2 = 0; k2 < W2; k2++) s += A[i * W2 + k2] * V[k2 * C + c];
            h[c] = s;
        }
        double mean = 0, var = 0;
        for (int64_t c = 0; c < C; c++) mean += h[c];
        mean /= (double)C;
        for (int64_t c = 0; c < C; c++) var += ((double)h[c] - mean) * ((double)h[c] - mean);
        float rstd = (float)(1.0 / sqrt(var / (double)C + 1e-5));
        float *dst = i < w ? l : r;
        for (int64_t c = 0; c < C; c++)
            dst[c] += (((float)(h[c] - mean)) * rstd * pr->gamma[c] + pr->beta[c]) / (float)w;
    }
    double ll = 0, rr = 0, lrr = 0;
    for (int64_t c = 0; c < C; c++) {
        f[c] = l[c];
        f[C + c] = r[c];
        f[2 * C + c] = fabsf(l[c] - r[c]);
        f[3 * C + c] = l[c] * r[c];
        ll += (double)l[c] * l[c];
        rr += (double)r[c] * r[c];
        lrr += (double)l[c] * r[c];
    }
    f[4 * C] = ll > 0 && rr > 0 ? (float)(lrr / sqrt(ll * rr)) : 0.0f;
}

dhsa__predictor_window_fn dhsa__predictor_window_kernel(dhsa_isa isa) {
    switch (isa) {
#if defined(__x86_64__)
    case DHSA_ISA_AVX512: return dhsa__predictor_window_avx512;
    case DHSA_ISA_AVX2: return dhsa__predictor_window_avx2;
#endif
    default: return dhsa__predictor_window_scalar;
    }
}

void dhsa__predictor_mlp(const dhsa_predictor *pr, const dhsa_attn_kernels *kern, const float *Fe, int64_t n,
                         float *Pn, float *z) {
    const int64_t F = 4 * pr->C + 1;
    for (int64_t c0 = 0; c0 < n; c0++) z[c0] = pr->b2;
    for (int64_t tile = 0; tile < pr->tiles_h; tile++) {
        const float *panel = pr->mlp + tile * F * PANEL;
        for (int64_t r0 = 0; r0 < n; r0 += DHSA_BC) {
            int rn = (int)(n - r0 < DHSA_BC ? n - r0 : DHSA_BC);
            kern->qk(Fe + r0 * F, F, rn, (int)F, panel, PANEL, Pn);
            for (int r2 = 0; r2 < rn; r2++) {
                float acc = 0;
                for (int64_t i = 0; i < PANEL && tile * PANEL + i < pr->hidden; i++) {
                    float zz = Pn[r2 * PANEL + i] + pr->b1[tile * PANEL + i];
                    if (zz > 0) acc += zz * pr->w2[tile * PANEL + i];
                }
                z[r0 + r2] += acc;
            }
        }
    }
}

float dhsa__predictor_prob(float z) { return 1.0f / (1.0f + expf(-z)); }

typedef struct {
    const dhsa_predictor *pr;
    const dhsa_tensor *k;
    int64_t b, L, d;
    float *p;
    char *ws;
    size_t ws_per_thread;
    const dhsa_attn_kernels *kern;
    dhsa__predictor_window_fn window;
} score_job;

static size_t slab_floats(const dhsa_predictor *pr) {
    size_t T = SLAB + 2 * (size_t)pr->w, C = (size_t)pr->C, F = 4 * C + 1;
    return dhsa__align_up(T * C, 16) * 4            /* X, Q, K, V */
           + dhsa__align_up((size_t)SLAB * F, 16)   /* features */
           + dhsa__align_up((size_t)DHSA_BC * PANEL, 16) /* panel output */
           + dhsa__predictor_window_ws(pr);         /* window scratch */
}

/* One slab: candidates t in [t0, t0 + SLAB) of the sequence. */
static void slab_task(void *arg, int64_t slab, int thread) {
    const score_job *j = arg;
    const dhsa_predictor *pr = j->pr;
    const int64_t C = pr->C, w = pr->w, F = 4 * C + 1, d = j->d, Hkv = C / d;
    const int64_t t0 = slab * SLAB, t1 = t0 + SLAB < j->L ? t0 + SLAB : j->L, n = t1 - t0;
    const int64_t T = n + 2 * w; /* tokens [t0 - w, t1 + w) */
    float *X = (float *)(j->ws + (size_t)thread * j->ws_per_thread);
    size_t tc = dhsa__align_up((size_t)(SLAB + 2 * w) * (size_t)C, 16);
    float *Q = X + tc, *K = Q + tc, *V = K + tc;                   /* [T][C] each */
    float *Fe = V + tc;                                            /* [n][F] */
    float *Pn = Fe + dhsa__align_up((size_t)SLAB * (size_t)F, 16); /* [BC][64] */
    float *wws = Pn + dhsa__align_up((size_t)DHSA_BC * PANEL, 16); /* window scratch */

    /* X: keys of all KV heads concatenated, zeros outside the sequence */
    for (int64_t r = 0; r < T; r++) {
        int64_t t = t0 - w + r;
        float *x = X + r * C;
        if (t < 0 || t >= j->L) {
            memset(x, 0, (size_t)C * sizeof(float));
            continue;
        }
        for (int64_t g = 0; g < Hkv; g++) {
            const void *row = dhsa__at(j->k, j->b, g, t);
            for (int64_t c = 0; c < d; c++) x[g * d + c] = dhsa__load(row, j->k->type, c * j->k->stride[3]);
        }
    }
    dhsa__predictor_project(pr, j->kern, X, T, Q, K, V, Pn);
    /* candidate t0 + c0: window rows [c0, c0 + 2w) of X/Q/K/V */
    for (int64_t c0 = 0; c0 < n; c0++)
        j->window(pr, X + c0 * C, Q + c0 * C, K + c0 * C, V + c0 * C, wws, Fe + c0 * F);
    dhsa__predictor_mlp(pr, j->kern, Fe, n, Pn, j->p + t0);
    for (int64_t c0 = 0; c0 < n; c0++)
        j->p[t0 + c0] = t0 + c0 == 0 ? 0.0f : dhsa__predictor_prob(j->p[t0 + c0]);
}

dhsa_status dhsa_predictor_score(dhsa_ctx *ctx, const dhsa_predictor *pr, const dhsa_tensor *k, int64_t b,
                                 float *p) {
    if (!ctx || !pr || !k || !k->data || !p) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_predictor_score: NULL argument");
    if (b < 0 || b >= k->shape[0]) return dhsa__fail(DHSA_ERR_INVALID_ARG, "batch %lld is outside k", (long long)b);
    if (k->shape[1] * k->shape[3] != pr->C)
        return dhsa__fail(DHSA_ERR_SHAPE,
                          "the predictor reads C = %lld features per token but k has %lld KV heads x %lld "
                          "dims = %lld: one predictor per model (KV heads x head dim)",
                          (long long)pr->C, (long long)k->shape[1], (long long)k->shape[3],
                          (long long)(k->shape[1] * k->shape[3]));
    dhsa_status vst = dhsa__check_view_type("k", k);
    if (vst) return vst;
    const int64_t L = k->shape[2];
    if (L == 0) return DHSA_OK;
    score_job j = {pr, k, b, L, k->shape[3], p, NULL, slab_floats(pr) * sizeof(float), dhsa__attn_kernels(),
                   dhsa__predictor_window_kernel(dhsa_active_isa())};
    int64_t slabs = (L + SLAB - 1) / SLAB;
    dhsa_status st;
    j.ws = dhsa__alloc(ctx, j.ws_per_thread * (size_t)dhsa_ctx_n_threads(ctx), &st);
    if (!j.ws) return st;
    dhsa_parallel_for(ctx, slabs, slab_task, &j);
    dhsa_ctx_release(ctx, j.ws);
    return DHSA_OK;
}
