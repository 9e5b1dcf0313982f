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
 * sum (double), 0 when no score is finite (lg then untouched); *max the
 * max (NULL: not wanted). */
static double exp_row(const dhsa_attn_kernels *kern, float *lg, int64_t n, float *max) {
    float m = -INFINITY;
    for (int64_t k = 0; k < n; k++) m = lg[k] > m ? lg[k] : m;
    if (max) *max = m;
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

/* The scratch of one row's scores: logit [G][ld], the group's scaled
 * queries, a tile's scores, widened keys, a query row. */
typedef struct {
    float *logit, *Qr, *Sr, *Kbuf, *qbuf;
    int64_t dq, ld;
} row_scratch;

static void scratch_free(row_scratch *w) {
    free(w->logit);
    free(w->Qr);
    free(w->Sr);
    free(w->Kbuf);
    free(w->qbuf);
}

/* For G heads of d dims and rows of ld scores; 0 when out of memory (all
 * freed). */
static int scratch_get(row_scratch *w, int64_t G, int64_t d, int64_t ld) {
    w->dq = (int64_t)dhsa__align_up((size_t)d, 16);
    w->ld = ld;
    w->logit = malloc((size_t)(G * ld) * sizeof(float));
    w->Qr = calloc((size_t)(DHSA_NARROW * w->dq), sizeof(float));
    w->Sr = malloc((size_t)(DHSA_NARROW * DHSA_BC) * sizeof(float));
    w->Kbuf = malloc((size_t)(DHSA_BC * d) * sizeof(float));
    w->qbuf = malloc((size_t)d * sizeof(float));
    if (w->logit && w->Qr && w->Sr && w->Kbuf && w->qbuf) return 1;
    scratch_free(w);
    return 0;
}

/* w->logit[h ld + k] <- the score of head g G + h (h < G) of row `row` of
 * a against the k-th key of the spans [sp[2 i], sp[2 i + 1]), i < n_sp,
 * in order (keys of KV head g, a's slots). */
static void span_scores(const dhsa_attn_kernels *kern, const dhsa_attn_desc *a, int64_t g, int64_t G, int64_t row,
                        const int64_t *sp, int64_t n_sp, row_scratch *w) {
    const int64_t d = a->q.shape[3];
    for (int64_t h0 = 0; h0 < G; h0 += DHSA_NARROW) {
        const int nq = (int)(G - h0 < DHSA_NARROW ? G - h0 : DHSA_NARROW);
        for (int i = 0; i < nq; i++) {
            const float *q = dhsa__row_f32(&a->q, 0, g * G + h0 + i, row, d, w->qbuf);
            for (int64_t x = 0; x < d; x++) w->Qr[i * w->dq + x] = q[x] * a->scale;
        }
        int64_t at = 0;
        for (int64_t i = 0; i < n_sp; i++)
            for (int64_t j0 = sp[2 * i]; j0 < sp[2 * i + 1]; j0 += DHSA_BC) {
                int n = (int)(sp[2 * i + 1] - j0 < DHSA_BC ? sp[2 * i + 1] - j0 : DHSA_BC);
                tile_scores(kern, a, g, j0, n, d, w->Qr, w->dq, nq, w->Kbuf, w->Sr);
                for (int h = 0; h < nq; h++)
                    memcpy(w->logit + (size_t)(h0 + h) * (size_t)w->ld + at, w->Sr + (size_t)h * DHSA_BC,
                           (size_t)n * sizeof(float));
                at += n;
            }
    }
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
    const int64_t Lk = a->k.shape[2];
    const dhsa_attn_kernels *kern = dhsa__attn_kernels();
    row_scratch w;
    double *mass = malloc((size_t)(nc + 1) * sizeof(double));
    if (!mass || !scratch_get(&w, G, d, Lk)) {
        free(mass);
        return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory finding the chunks a decode step carries");
    }
    for (int64_t g = 0; g < Hkv; g++) {
        const int64_t *r;
        int64_t nr;
        if (dhsa_layout_get(lay, 0, g, 0, &r, &nr) || nr <= 0) continue;
        int64_t n_sel = 0;
        for (int64_t i = 0; i < nr; i++) n_sel += r[2 * i + 1] - r[2 * i];
        span_scores(kern, a, g, G, 0, r, nr, &w); /* logit[h][k]: head h of the group, the k-th key read */
        for (int64_t c = 0; c <= nc; c++) mass[c] = 0;
        for (int64_t h = 0; h < G; h++) {
            float *lg = w.logit + (size_t)h * (size_t)Lk;
            if (a->key_mask) { /* keys the mask leaves out take no share */
                const int keeps = a->key_mask_polarity == DHSA_MASK_TRUE_KEEPS;
                int64_t k = 0;
                for (int64_t i = 0; i < nr; i++)
                    for (int64_t t = r[2 * i]; t < r[2 * i + 1]; t++, k++)
                        if ((a->key_mask[t] != 0) != keeps) lg[k] = -INFINITY;
            }
            const double z = exp_row(kern, lg, n_sel, NULL);
            if (!(z > 0)) continue;
            const double wz = 1.0 / (z * (double)G);
            int64_t k = 0, c = 0;
            for (int64_t i = 0; i < nr; i++)
                for (int64_t t = r[2 * i]; t < r[2 * i + 1]; t++, k++) {
                    c = chunk_of(starts, nc, c, t);
                    mass[c] += (double)lg[k] * wz;
                }
        }
        dhsa__carry_pick(mass, nc, share, out + g * DHSA_CARRY_MAX);
    }
    scratch_free(&w);
    free(mass);
    return DHSA_OK;
}

dhsa_status dhsa__exact_mass(const dhsa_attn_desc *a, int64_t g, int64_t r0, int64_t r1, const int64_t *starts,
                             int64_t nc, double *mass) {
    const int64_t Hq = a->q.shape[1], Hkv = a->k.shape[1], d = a->q.shape[3], G = Hq / Hkv;
    for (int64_t c = 0; c < nc; c++) mass[c] = 0;
    if (nc <= 0 || r1 <= r0) return DHSA_OK;
    const int64_t Lk = a->k.shape[2];
    const dhsa_attn_kernels *kern = dhsa__attn_kernels();
    row_scratch w;
    if (!scratch_get(&w, G, d, Lk))
        return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory ranking chunks by their exact attention");
    const double w_row = 1.0 / ((double)(r1 - r0) * (double)G);
    for (int64_t row = r0; row < r1; row++) {
        int64_t sp[2];
        dhsa__attn_key_range(a, Lk, a->q_pos0 + row, &sp[0], &sp[1]);
        const int64_t lo = sp[0], hi = sp[1], nk = hi - lo;
        if (hi <= lo) continue;
        span_scores(kern, a, g, G, row, sp, 1, &w); /* logit[h][k - lo]: head h of the group against key k */
        for (int64_t h = 0; h < G; h++) {
            float *lg = w.logit + (size_t)h * (size_t)Lk;
            const double z = exp_row(kern, lg, nk, NULL);
            if (!(z > 0)) continue;
            const double wz = w_row / z;
            for (int64_t c = chunk_of(starts, nc, 0, lo); c < nc && starts[c] < hi; c++) {
                int64_t k0 = starts[c] > lo ? starts[c] : lo, k1 = starts[c + 1] < hi ? starts[c + 1] : hi;
                double sum = 0;
                for (int64_t k = k0; k < k1; k++) sum += lg[k - lo];
                mass[c] += sum * wz;
            }
        }
    }
    scratch_free(&w);
    return DHSA_OK;
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
    /* the slots the row sees here (positions <= pos), as spans */
    int64_t *sp = malloc((size_t)(2 * n_runs + 2) * sizeof(int64_t)), nk = 0;
    row_scratch w;
    if (!sp) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory ranking chunks by their exact attention");
    for (int64_t i = 0; i < n_runs; i++) {
        const int64_t n = runs[3 * i + 1], p0 = runs[3 * i + 2], seen = p0 > pos ? 0 : pos - p0 + 1 < n ? pos - p0 + 1 : n;
        sp[2 * i] = runs[3 * i];
        sp[2 * i + 1] = runs[3 * i] + seen;
        nk += seen;
    }
    if (nk == 0 || !scratch_get(&w, G, d, nk)) {
        free(sp);
        return nk == 0 ? DHSA_OK : dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory ranking chunks by their exact attention");
    }
    const dhsa_attn_kernels *kern = dhsa__attn_kernels();
    span_scores(kern, a, g, G, row, sp, n_runs, &w); /* logit[h][k]: head h of the group, the k-th key seen */
    for (int64_t h = 0; h < G; h++) {
        float *lg = w.logit + (size_t)h * (size_t)nk;
        if (!norm) {
            float m;
            const double z = exp_row(kern, lg, nk, &m);
            if (z > 0) {
                mz[2 * h] = m;
                mz[2 * h + 1] = z;
            }
            continue;
        }
        const double M = norm[2 * h], Z = norm[2 * h + 1];
        if (!(Z > 0) || !isfinite(M)) continue;
        kern->expw(lg, nk, (float)M, 1.0f, lg);
        const double wz = 1.0 / (Z * (double)G);
        int64_t k = 0, c = 0;
        for (int64_t i = 0; i < n_runs; i++) /* span i's keys are at positions runs[3 i + 2].. */
            for (int64_t t = runs[3 * i + 2]; t < runs[3 * i + 2] + sp[2 * i + 1] - sp[2 * i]; t++, k++) {
                c = chunk_of(starts, nc, c, t);
                if (c < nc) mass[c] += (double)lg[k] * wz;
            }
    }
    scratch_free(&w);
    free(sp);
    return DHSA_OK;
}
