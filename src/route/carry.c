/* carry.c: the chunks a decode step carries to the next (carry.h).
 *
 * Why: a model copies a number token by token, each decode step reading
 * the needle's next token. A step routes on its own chunk scores, and a
 * chunk the previous step read with most of its attention can fall out of
 * the next step's budget; the copy then derails after a few digits
 * ("27560." for 2756021). The attention a step actually paid is exact
 * where the scores are estimates, so the session hands the chunks that
 * held a share of it to the next step first.
 */
#include "route/carry.h"

#include "attn/attn_internal.h"
#include "attn/kern.h"
#include "route/rows.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The scores of heads [h0, h0 + nq) (nq <= DHSA_NARROW) against keys [j0,
 * j0 + n) of KV head g (n <= DHSA_BC): Sr [nq][DHSA_BC], Qr the scaled
 * queries [nq][dq]. */
static void tile_scores(const dhsa_attn_kernels *kern, const dhsa_attn_desc *a, int64_t g, int64_t j0, int n,
                        int64_t d, const float *Qr, int64_t dq, int nq, float *Kbuf, float *Sr) {
    const dhsa_tensor *k = &a->k;
    if (k->type == DHSA_Q8_0 && kern->qk_rows_q8) {
        kern->qk_rows_q8(dhsa__at(k, 0, g, j0), k->stride[2], n, (int)d, Qr, dq, nq, Sr);
    } else if ((k->type == DHSA_F16 || k->type == DHSA_BF16) && k->stride[3] == 1 && kern->qk_rows16) {
        kern->qk_rows16(dhsa__at(k, 0, g, j0), k->type == DHSA_BF16, k->stride[2], n, (int)d, Qr, dq, nq, Sr);
    } else if (k->type == DHSA_F32 && k->stride[3] == 1) {
        kern->qk_rows(dhsa__at(k, 0, g, j0), k->stride[2], n, (int)d, Qr, dq, nq, Sr);
    } else if ((k->type == DHSA_F16 || k->type == DHSA_BF16) && k->stride[3] == 1) {
        for (int j = 0; j < n; j++) /* widened in vectors, then the F32 kernel */
            kern->widen(dhsa__at(k, 0, g, j0 + j), k->type == DHSA_BF16, d, Kbuf + (size_t)j * (size_t)d);
        kern->qk_rows(Kbuf, d, n, (int)d, Qr, dq, nq, Sr);
    } else if (k->type == DHSA_Q8_0) {
        for (int j = 0; j < n; j++) kern->widen_q8(dhsa__at(k, 0, g, j0 + j), d, Kbuf + (size_t)j * (size_t)d);
        kern->qk_rows(Kbuf, d, n, (int)d, Qr, dq, nq, Sr);
    } else {
        for (int j = 0; j < n; j++) {
            const float *row = dhsa__row_f32(k, 0, g, j0 + j, d, Kbuf + (size_t)j * (size_t)d);
            if (row != Kbuf + (size_t)j * (size_t)d) memcpy(Kbuf + (size_t)j * (size_t)d, row, (size_t)d * sizeof(float));
        }
        kern->qk_rows(Kbuf, d, n, (int)d, Qr, dq, nq, Sr);
    }
    if (a->softcap > 0) kern->softcap(Sr, (int64_t)nq * DHSA_BC, a->softcap);
}

/* lg[0, n) <- exp(lg - max) through the attention's own exp; returns their
 * sum (double), 0 when no score is finite (lg then untouched). */
static double exp_row(const dhsa_attn_kernels *kern, float *lg, int64_t n) {
    float m = -INFINITY;
    for (int64_t k = 0; k < n; k++) m = lg[k] > m ? lg[k] : m;
    if (!(m > -INFINITY) || !isfinite(m)) return 0;
    kern->expw(lg, n, m, 1.0f, lg);
    double z = 0;
    for (int64_t k = 0; k < n; k++) z += lg[k];
    return z;
}

/* The chunk holding key t, searching from c (starts ascending); nc when t
 * lies past the last closed chunk. */
static int64_t chunk_of(const int64_t *starts, int64_t nc, int64_t c, int64_t t) {
    if (t >= starts[nc]) return nc;
    while (c + 1 <= nc && starts[c + 1] <= t) c++;
    return c;
}

void dhsa__carry_pick(const double *mass, int64_t nc, double share, int64_t *o) {
    int64_t n_out = 0;
    for (int64_t c = 0; c < nc; c++) {
        if (!(mass[c] >= share)) continue;
        int64_t at = n_out < DHSA_CARRY_MAX ? n_out++ : DHSA_CARRY_MAX;
        if (at == DHSA_CARRY_MAX && !(mass[c] > mass[o[DHSA_CARRY_MAX - 1]])) continue;
        if (at == DHSA_CARRY_MAX) at = DHSA_CARRY_MAX - 1;
        while (at > 0 && mass[c] > mass[o[at - 1]]) {
            o[at] = o[at - 1];
            at--;
        }
        o[at] = c;
    }
}

dhsa_status dhsa__carry_chunks(const dhsa_attn_desc *a, const dhsa_layout *lay, const int64_t *starts, int64_t nc,
                               double share, int64_t *out) {
    const int64_t Hq = a->q.shape[1], Hkv = a->k.shape[1], d = a->q.shape[3], G = Hq / Hkv;
    for (int64_t x = 0; x < Hkv * DHSA_CARRY_MAX; x++) out[x] = -1;
    if (nc <= 0 || !(share > 0)) return DHSA_OK;
    const int64_t Lk = a->k.shape[2], dq = (int64_t)dhsa__align_up((size_t)d, 16);
    const dhsa_attn_kernels *kern = dhsa__attn_kernels();
    float *logit = malloc((size_t)(G * Lk) * sizeof(float)), *Qr = calloc((size_t)(DHSA_NARROW * dq), sizeof(float));
    float *Sr = malloc((size_t)(DHSA_NARROW * DHSA_BC) * sizeof(float)), *Kbuf = malloc((size_t)(DHSA_BC * d) * sizeof(float));
    float *qbuf = malloc((size_t)d * sizeof(float));
    double *mass = malloc((size_t)(nc + 1) * sizeof(double));
    dhsa_status st = DHSA_OK;
    if (!logit || !Qr || !Sr || !Kbuf || !qbuf || !mass) {
        st = dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory finding the chunks a decode step carries");
        goto out;
    }
    for (int64_t g = 0; g < Hkv; g++) {
        const int64_t *r;
        int64_t nr;
        if (dhsa_layout_get(lay, 0, g, 0, &r, &nr) || nr <= 0) continue;
        int64_t n_sel = 0;
        for (int64_t i = 0; i < nr; i++) n_sel += r[2 * i + 1] - r[2 * i];
        /* logit[h][k]: head h of the group, the k-th key read */
        for (int64_t h0 = 0; h0 < G; h0 += DHSA_NARROW) {
            const int nq = (int)(G - h0 < DHSA_NARROW ? G - h0 : DHSA_NARROW);
            for (int i = 0; i < nq; i++) {
                const float *q = dhsa__row_f32(&a->q, 0, g * G + h0 + i, 0, d, qbuf);
                for (int64_t x = 0; x < d; x++) Qr[i * dq + x] = q[x] * a->scale;
            }
            int64_t at = 0;
            for (int64_t i = 0; i < nr; i++)
                for (int64_t j0 = r[2 * i]; j0 < r[2 * i + 1]; j0 += DHSA_BC) {
                    int n = (int)(r[2 * i + 1] - j0 < DHSA_BC ? r[2 * i + 1] - j0 : DHSA_BC);
                    tile_scores(kern, a, g, j0, n, d, Qr, dq, nq, Kbuf, Sr);
                    for (int h = 0; h < nq; h++)
                        memcpy(logit + (size_t)(h0 + h) * (size_t)Lk + at, Sr + (size_t)h * DHSA_BC,
                               (size_t)n * sizeof(float));
                    at += n;
                }
        }
        for (int64_t c = 0; c <= nc; c++) mass[c] = 0;
        for (int64_t h = 0; h < G; h++) {
            float *lg = logit + (size_t)h * (size_t)Lk;
            if (a->key_mask) { /* keys the mask leaves out take no share */
                const int keeps = a->key_mask_polarity == DHSA_MASK_TRUE_KEEPS;
                int64_t k = 0;
                for (int64_t i = 0; i < nr; i++)
                    for (int64_t t = r[2 * i]; t < r[2 * i + 1]; t++, k++)
                        if ((a->key_mask[t] != 0) != keeps) lg[k] = -INFINITY;
            }
            const double z = exp_row(kern, lg, n_sel);
            if (!(z > 0)) continue;
            const double w = 1.0 / (z * (double)G);
            int64_t k = 0, c = 0;
            for (int64_t i = 0; i < nr; i++)
                for (int64_t t = r[2 * i]; t < r[2 * i + 1]; t++, k++) {
                    c = chunk_of(starts, nc, c, t);
                    mass[c] += (double)lg[k] * w;
                }
        }
        dhsa__carry_pick(mass, nc, share, out + g * DHSA_CARRY_MAX);
    }
out:
    free(logit);
    free(Qr);
    free(Sr);
    free(Kbuf);
    free(qbuf);
    free(mass);
    return st;
}

dhsa_status dhsa__exact_mass(const dhsa_attn_desc *a, int64_t g, int64_t r0, int64_t r1, const int64_t *starts,
                             int64_t nc, double *mass) {
    const int64_t Hq = a->q.shape[1], Hkv = a->k.shape[1], d = a->q.shape[3], G = Hq / Hkv;
    for (int64_t c = 0; c < nc; c++) mass[c] = 0;
    if (nc <= 0 || r1 <= r0) return DHSA_OK;
    const int64_t Lk = a->k.shape[2], dq = (int64_t)dhsa__align_up((size_t)d, 16);
    const dhsa_attn_kernels *kern = dhsa__attn_kernels();
    float *logit = malloc((size_t)(G * Lk) * sizeof(float)), *Qr = calloc((size_t)(DHSA_NARROW * dq), sizeof(float));
    float *Sr = malloc((size_t)(DHSA_NARROW * DHSA_BC) * sizeof(float));
    float *Kbuf = malloc((size_t)(DHSA_BC * d) * sizeof(float)), *qbuf = malloc((size_t)d * sizeof(float));
    dhsa_status st = DHSA_OK;
    if (!logit || !Qr || !Sr || !Kbuf || !qbuf) {
        st = dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory ranking chunks by their exact attention");
        goto out;
    }
    const double w_row = 1.0 / ((double)(r1 - r0) * (double)G);
    for (int64_t row = r0; row < r1; row++) {
        int64_t lo, hi;
        dhsa__attn_key_range(a, Lk, a->q_pos0 + row, &lo, &hi);
        if (hi <= lo) continue;
        /* logit[h][k - lo]: head h of the group against key k */
        for (int64_t h0 = 0; h0 < G; h0 += DHSA_NARROW) {
            const int nq = (int)(G - h0 < DHSA_NARROW ? G - h0 : DHSA_NARROW);
            for (int i = 0; i < nq; i++) {
                const float *q = dhsa__row_f32(&a->q, 0, g * G + h0 + i, row, d, qbuf);
                for (int64_t x = 0; x < d; x++) Qr[i * dq + x] = q[x] * a->scale;
            }
            for (int64_t j0 = lo; j0 < hi; j0 += DHSA_BC) {
                int n = (int)(hi - j0 < DHSA_BC ? hi - j0 : DHSA_BC);
                tile_scores(kern, a, g, j0, n, d, Qr, dq, nq, Kbuf, Sr);
                for (int h = 0; h < nq; h++)
                    memcpy(logit + (size_t)(h0 + h) * (size_t)Lk + (j0 - lo), Sr + (size_t)h * DHSA_BC,
                           (size_t)n * sizeof(float));
            }
        }
        const int64_t nk = hi - lo;
        for (int64_t h = 0; h < G; h++) {
            float *lg = logit + (size_t)h * (size_t)Lk;
            const double z = exp_row(kern, lg, nk);
            if (!(z > 0)) continue;
            const double w = w_row / z;
            for (int64_t c = chunk_of(starts, nc, 0, lo); c < nc && starts[c] < hi; c++) {
                int64_t k0 = starts[c] > lo ? starts[c] : lo, k1 = starts[c + 1] < hi ? starts[c + 1] : hi;
                double sum = 0;
                for (int64_t k = k0; k < k1; k++) sum += lg[k - lo];
                mass[c] += sum * w;
            }
        }
    }
out:
    free(logit);
    free(Qr);
    free(Sr);
    free(Kbuf);
    free(qbuf);
    return st;
}

dhsa_status dhsa__exact_part(const dhsa_attn_desc *a, int64_t g, int64_t row, int64_t pos, const int64_t *runs,
                             int64_t n_runs, const int64_t *starts, int64_t nc, const double *norm, double *mz,
                             double *mass) {
    const int64_t Hq = a->q.shape[1], Hkv = a->k.shape[1], d = a->q.shape[3], G = Hq / Hkv;
    if (!norm)
        for (int64_t h = 0; h < G; h++) {
            mz[2 * h] = -INFINITY;
            mz[2 * h + 1] = 0;
        }
    int64_t nk = 0; /* the keys the row sees here */
    for (int64_t i = 0; i < n_runs; i++) {
        int64_t n = runs[3 * i + 1], p0 = runs[3 * i + 2];
        nk += p0 > pos ? 0 : pos - p0 + 1 < n ? pos - p0 + 1 : n;
    }
    if (nk == 0) return DHSA_OK;
    const int64_t dq = (int64_t)dhsa__align_up((size_t)d, 16);
    const dhsa_attn_kernels *kern = dhsa__attn_kernels();
    float *logit = malloc((size_t)(G * nk) * sizeof(float)), *Qr = calloc((size_t)(DHSA_NARROW * dq), sizeof(float));
    float *Sr = malloc((size_t)(DHSA_NARROW * DHSA_BC) * sizeof(float));
    float *Kbuf = malloc((size_t)(DHSA_BC * d) * sizeof(float)), *qbuf = malloc((size_t)d * sizeof(float));
    dhsa_status st = DHSA_OK;
    if (!logit || !Qr || !Sr || !Kbuf || !qbuf) {
        st = dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory ranking chunks by their exact attention");
        goto out;
    }
    /* logit[h][k]: head h of the group, the k-th key seen, in run order */
    for (int64_t h0 = 0; h0 < G; h0 += DHSA_NARROW) {
        const int nq = (int)(G - h0 < DHSA_NARROW ? G - h0 : DHSA_NARROW);
        for (int i = 0; i < nq; i++) {
            const float *q = dhsa__row_f32(&a->q, 0, g * G + h0 + i, row, d, qbuf);
            for (int64_t x = 0; x < d; x++) Qr[i * dq + x] = q[x] * a->scale;
        }
        int64_t at = 0;
        for (int64_t i = 0; i < n_runs; i++) {
            const int64_t j = runs[3 * i], p0 = runs[3 * i + 2];
            const int64_t n = p0 > pos ? 0 : pos - p0 + 1 < runs[3 * i + 1] ? pos - p0 + 1 : runs[3 * i + 1];
            for (int64_t j0 = j; j0 < j + n; j0 += DHSA_BC) {
                int m = (int)(j + n - j0 < DHSA_BC ? j + n - j0 : DHSA_BC);
                tile_scores(kern, a, g, j0, m, d, Qr, dq, nq, Kbuf, Sr);
                for (int h = 0; h < nq; h++)
                    memcpy(logit + (size_t)(h0 + h) * (size_t)nk + at, Sr + (size_t)h * DHSA_BC, (size_t)m * sizeof(float));
                at += m;
            }
        }
    }
    for (int64_t h = 0; h < G; h++) {
        float *lg = logit + (size_t)h * (size_t)nk;
        if (!norm) {
            float m = -INFINITY;
            for (int64_t k = 0; k < nk; k++) m = lg[k] > m ? lg[k] : m;
            if (!(m > -INFINITY) || !isfinite(m)) continue;
            kern->expw(lg, nk, m, 1.0f, lg);
            double z = 0;
            for (int64_t k = 0; k < nk; k++) z += lg[k];
            mz[2 * h] = m;
            mz[2 * h + 1] = z;
            continue;
        }
        const double M = norm[2 * h], Z = norm[2 * h + 1];
        if (!(Z > 0) || !isfinite(M)) continue;
        kern->expw(lg, nk, (float)M, 1.0f, lg);
        const double w = 1.0 / (Z * (double)G);
        int64_t k = 0, c = 0;
        for (int64_t i = 0; i < n_runs; i++) {
            const int64_t p0 = runs[3 * i + 2];
            const int64_t n = p0 > pos ? 0 : pos - p0 + 1 < runs[3 * i + 1] ? pos - p0 + 1 : runs[3 * i + 1];
            for (int64_t t = p0; t < p0 + n; t++, k++) {
                c = chunk_of(starts, nc, c, t);
                if (c < nc) mass[c] += (double)lg[k] * w;
            }
        }
    }
out:
    free(logit);
    free(Qr);
    free(Sr);
    free(Kbuf);
    free(qbuf);
    return st;
}
