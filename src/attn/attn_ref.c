/* attn_ref.c: the reference attention, the oracle every other path is held
 * to. For each (batch, query head) it materialises the whole Lq x Lk score
 * matrix in double precision, applies softcap, biases and masks, and
 * accumulates softmax(S) V in double. Deliberately simple and serial; its
 * memory is Lq*Lk*8 bytes, so it refuses calls above a cap (attn.c).
 * Elements are read one by one through dhsa__load, which knows every
 * type (a Q8_0 K/V element is d * q of its block, exact in F32).
 */
#include "attn/attn_internal.h"
#include "attn/layout.h"

size_t dhsa__attn_ref_workspace(const dhsa__attn_problem *p) {
    return (size_t)(p->Lq * p->Lk + p->dv) * sizeof(double);
}

dhsa_status dhsa__attn_ref_run(dhsa_ctx *ctx, const dhsa_attn_desc *a, const dhsa__attn_problem *p,
                               void *ws) {
    (void)ctx;
    double *S = ws;              /* [Lq][Lk] */
    double *acc = S + p->Lq * p->Lk; /* [dv] */
    const double scale = p->scale, cap = a->softcap;
    for (int64_t b = 0; b < p->B; b++) {
        for (int64_t h = 0; h < p->Hq; h++) {
            int64_t g = h / p->G;
            for (int64_t i = 0; i < p->Lq; i++) {
                const void *q = dhsa__at(&a->q, b, h, i);
                int64_t lo, hi;
                dhsa__attn_key_range(a, p->Lk, a->q_pos0 + i, &lo, &hi);
                const float *mrow = a->attn_mask.data
                                        ? (const float *)a->attn_mask.data + b * p->mstride[0] +
                                              h * p->mstride[1] + i * p->mstride[2]
                                        : NULL;
                const int64_t *rg = NULL;
                int64_t nrg = 0, ri = 0;
                if (a->layout) dhsa_layout_get(a->layout, b, g, i / a->layout->q_block, &rg, &nrg);
                for (int64_t j = 0; j < p->Lk; j++) {
                    double s = -INFINITY;
                    int selected = 1;
                    if (a->layout) { /* ranges are sorted: walk them with j */
                        while (ri < nrg && rg[2 * ri + 1] <= j) ri++;
                        selected = ri < nrg && rg[2 * ri] <= j;
                    }
                    if (selected && j >= lo && j < hi) {
                        const void *k = dhsa__at(&a->k, b, g, j);
                        double dot = 0.0;
                        for (int64_t c = 0; c < p->d; c++)
                            dot += (double)dhsa__load(q, a->q.type, c * a->q.stride[3]) *
                                   (double)dhsa__load(k, a->k.type, c * a->k.stride[3]);
                        s = scale * dot;
                        if (cap > 0) s = cap * tanh(s / cap);
                        s += (double)dhsa__attn_key_add(a, b, j);
                        if (mrow) s += (double)mrow[j * p->mstride[3]];
                    }
                    S[i * p->Lk + j] = s;
                }
            }
            for (int64_t i = 0; i < p->Lq; i++) {
                double *s = S + i * p->Lk;
                double mx = -INFINITY;
                for (int64_t j = 0; j < p->Lk; j++)
                    if (s[j] > mx) mx = s[j];
                double sum = 0.0;
                for (int64_t c = 0; c < p->dv; c++) acc[c] = 0.0;
                if (mx != -INFINITY) {
                    for (int64_t j = 0; j < p->Lk; j++) {
                        double e = exp(s[j] - mx);
                        if (e == 0.0) continue;
                        sum += e;
                        const void *v = dhsa__at(&a->v, b, g, j);
                        for (int64_t c = 0; c < p->dv; c++)
                            acc[c] += e * (double)dhsa__load(v, a->v.type, c * a->v.stride[3]);
                    }
                }
                void *o = dhsa__at(&a->o, b, h, i);
                for (int64_t c = 0; c < p->dv; c++)
                    dhsa__store(o, a->o.type, c * a->o.stride[3], sum > 0 ? (float)(acc[c] / sum) : 0.0f);
                if (a->lse.data)
                    *(float *)dhsa__at(&a->lse, b, h, i) = sum > 0 ? (float)(mx + log(sum)) : -INFINITY;
            }
        }
    }
    return DHSA_OK;
}
