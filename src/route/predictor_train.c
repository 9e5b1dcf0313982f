/* predictor_train.c: training of the learned boundary predictor.
 *
 * - Labels (dhsa_boundary_mass_add, dhsa_boundary_labels): the attention
 *   mass later queries put on the keys on each side of a candidate, from a
 *   dense attention recomputed in double; soft target
 *   y = sigmoid(2 (log r - log 2)) with r = max / min of the two masses.
 * - The network (include/dhsa.h above dhsa_predictor_load) in double, one
 *   sample at a time, keeping its activations, and its backward written by
 *   hand for every parameter group (dhsa__predictor_pass).
 * - Focal BCE on soft targets, Adam, shuffled minibatches
 *   (dhsa_predictor_train). A minibatch is cut into a fixed number of
 *   shards whose gradients are summed in order, so the result does not
 *   depend on the number of threads.
 * Contract and recipe: docs/predictor.md. Tested by tests/test_train.c
 * (gradients against central finite differences, loss, Adam, labels on
 * crafted attention, a synthetic training run, bad inputs).
 */
#include "route/predictor_internal.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SHARDS 16        /* gradient shards per minibatch (fixed: thread-count independent) */
#define EVAL_CHUNK 256   /* samples per evaluation task */
#define TRAIN_SUBSET 8192 /* training samples in each progress point's train loss */
#define LOG_R_MAX 50.0   /* log r when one side has no mass */

/* ------------------------------------------------------------ params --- */

dhsa__pmap dhsa__predictor_pmap(int64_t C, int64_t w, int64_t hidden) {
    dhsa__pmap m;
    size_t c = (size_t)C, h = (size_t)hidden, f = 4 * c + 1, o = 0;
    m.C = C, m.w = w, m.H = hidden;
    m.wq = o, o += c * c;
    m.bq = o, o += c;
    m.wk = o, o += c * c;
    m.bk = o, o += c;
    m.wv = o, o += c * c;
    m.bv = o, o += c;
    m.gamma = o, o += c;
    m.beta = o, o += c;
    m.w1 = o, o += f * h;
    m.b1 = o, o += h;
    m.w2 = o, o += h;
    m.b2 = o, o += 1;
    m.n = o;
    return m;
}

void dhsa__predictor_get_params(const dhsa_predictor *pr, double *theta) {
    size_t n = dhsa__predictor_raw_floats(pr->C, pr->hidden);
    for (size_t i = 0; i + 1 < n; i++) theta[i] = pr->mem[i];
    theta[n - 1] = pr->b2;
}

void dhsa__predictor_set_params(dhsa_predictor *pr, const double *theta) {
    size_t n = dhsa__predictor_raw_floats(pr->C, pr->hidden);
    for (size_t i = 0; i + 1 < n; i++) pr->mem[i] = (float)theta[i];
    pr->b2 = (float)theta[n - 1];
    dhsa__predictor_pack(pr);
}

/* ------------------------------------------------------ loss and adam --- */

static double softplus(double x) { return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x)); }
static double sigmoid(double x) { return x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x)); }

double dhsa__focal_loss(double s, double y, double gamma, double pos_weight, double *dlds) {
    double p = sigmoid(s), q = sigmoid(-s); /* q = 1 - p without cancellation */
    double logp = -softplus(-s), logq = -softplus(s);
    double qg = pow(q, gamma), pg = pow(p, gamma);
    double loss = -(pos_weight * y * qg * logp + (1 - y) * pg * logq);
    /* d/ds of q^g log p = q^g (q - g p log p); of p^g log q = p^g (g q log q - p) */
    if (dlds) *dlds = -(pos_weight * y * qg * (q - gamma * p * logp) + (1 - y) * pg * (gamma * q * logq - p));
    return loss;
}

void dhsa__adam_step(double *theta, const double *g, double *m, double *v, size_t n, int64_t t, double lr,
                     double beta1, double beta2, double eps) {
    double c1 = 1.0 - pow(beta1, (double)t), c2 = 1.0 - pow(beta2, (double)t);
    for (size_t i = 0; i < n; i++) {
        m[i] = beta1 * m[i] + (1 - beta1) * g[i];
        v[i] = beta2 * v[i] + (1 - beta2) * g[i] * g[i];
        theta[i] -= lr * (m[i] / c1) / (sqrt(v[i] / c2) + eps);
    }
}

/* ---------------------------------------------------- forward/backward --- */

size_t dhsa__predictor_pass_ws(const dhsa__pmap *m) {
    size_t W2 = 2 * (size_t)m->w, C = (size_t)m->C, F = 4 * C + 1, H = (size_t)m->H;
    return 14 * W2 * C + 3 * W2 * W2 + 2 * W2 + 6 * C + 2 * F + 3 * H;
}

double dhsa__predictor_pass(const dhsa__pmap *m, const double *th, const double *X, double y, double gamma,
                            double pos_weight, double gscale, double *grad, double *ws, double *p_out) {
    const int64_t C = m->C, w = m->w, W2 = 2 * w, F = 4 * C + 1, H = m->H;
    const double *wq = th + m->wq, *bq = th + m->bq, *wk = th + m->wk, *bk = th + m->bk, *wv = th + m->wv,
                 *bv = th + m->bv, *ga = th + m->gamma, *be = th + m->beta, *w1 = th + m->w1, *b1 = th + m->b1,
                 *w2 = th + m->w2;
    const double inv = 1.0 / sqrt((double)C);
    /* activations kept for the backward */
    double *Q = ws, *K = Q + W2 * C, *V = K + W2 * C; /* [2w][C] */
    double *A = V + W2 * C;                            /* [2w][2w] softmax rows */
    double *N = A + W2 * W2;                           /* [2w][C] normalised rows */
    double *rstd = N + W2 * C;                         /* [2w] */
    double *l = rstd + W2, *r = l + C;                 /* [C] each */
    double *f = r + C;                                 /* [F] */
    double *u = f + F;                                 /* [H] pre-ReLU */
    /* gradient scratch */
    double *du = u + H, *df = du + H, *dl = df + F, *dr = dl + C, *dN = dr + C; /* dN [2w][C] */
    double *dO = dN + W2 * C, *dQ = dO + W2 * C, *dK = dQ + W2 * C, *dV = dK + W2 * C; /* [2w][C] */
    double *dA = dV + W2 * C;                          /* [2w][2w] */

    /* Q, K, V = X W + b   (X [2w][C] @ W [C][C]) */
    for (int64_t i = 0; i < W2; i++) {
        double *q = Q + i * C, *k = K + i * C, *v = V + i * C;
        for (int64_t o = 0; o < C; o++) q[o] = bq[o], k[o] = bk[o], v[o] = bv[o];
        for (int64_t c = 0; c < C; c++) {
            double x = X[i * C + c];
            if (x == 0) continue;
            const double *a = wq + c * C, *b = wk + c * C, *d = wv + c * C;
            for (int64_t o = 0; o < C; o++) q[o] += x * a[o], k[o] += x * b[o], v[o] += x * d[o];
        }
    }
    /* A = softmax(Q K^T / sqrt(C)) per row */
    for (int64_t i = 0; i < W2; i++) {
        double mx = -INFINITY, sum = 0, *a = A + i * W2;
        for (int64_t j = 0; j < W2; j++) {
            double s = 0;
            for (int64_t c = 0; c < C; c++) s += Q[i * C + c] * K[j * C + c];
            a[j] = s * inv;
            if (a[j] > mx) mx = a[j];
        }
        for (int64_t j = 0; j < W2; j++) sum += a[j] = exp(a[j] - mx);
        for (int64_t j = 0; j < W2; j++) a[j] /= sum;
    }
    /* H = LayerNorm(X + A V); l, r = means of its two halves */
    for (int64_t c = 0; c < C; c++) l[c] = r[c] = 0;
    for (int64_t i = 0; i < W2; i++) {
        double *n = N + i * C, mean = 0, var = 0;
        for (int64_t c = 0; c < C; c++) {
            double s = X[i * C + c];
            for (int64_t j = 0; j < W2; j++) s += A[i * W2 + j] * V[j * C + c];
            n[c] = s;
            mean += s;
        }
        mean /= (double)C;
        for (int64_t c = 0; c < C; c++) var += (n[c] - mean) * (n[c] - mean);
        rstd[i] = 1.0 / sqrt(var / (double)C + 1e-5);
        double *side = i < w ? l : r;
        for (int64_t c = 0; c < C; c++) {
            n[c] = (n[c] - mean) * rstd[i];
            side[c] += (n[c] * ga[c] + be[c]) / (double)w;
        }
    }
    /* f = [l, r, |l - r|, l * r, cos(l, r)] */
    double ll = 0, rr = 0, lr = 0;
    for (int64_t c = 0; c < C; c++) {
        f[c] = l[c], f[C + c] = r[c], f[2 * C + c] = fabs(l[c] - r[c]), f[3 * C + c] = l[c] * r[c];
        ll += l[c] * l[c], rr += r[c] * r[c], lr += l[c] * r[c];
    }
    const int has_cos = ll > 0 && rr > 0;
    const double nlr = has_cos ? sqrt(ll) * sqrt(rr) : 0, cs = has_cos ? lr / nlr : 0;
    f[4 * C] = cs;
    /* s = ReLU(f W1 + b1) . w2 + b2 */
    for (int64_t h = 0; h < H; h++) u[h] = b1[h];
    for (int64_t k = 0; k < F; k++) {
        double fk = f[k];
        const double *row = w1 + k * H;
        for (int64_t h = 0; h < H; h++) u[h] += fk * row[h];
    }
    double s = th[m->b2];
    for (int64_t h = 0; h < H; h++)
        if (u[h] > 0) s += u[h] * w2[h];
    double dlds;
    double loss = dhsa__focal_loss(s, y, gamma, pos_weight, &dlds);
    if (p_out) *p_out = sigmoid(s);
    if (!grad) return loss;

    /* ---- backward ---- */
    double ds = dlds * gscale;
    grad[m->b2] += ds;
    for (int64_t h = 0; h < H; h++) {
        double z = u[h] > 0 ? u[h] : 0;
        grad[m->w2 + (size_t)h] += ds * z;
        du[h] = u[h] > 0 ? ds * w2[h] : 0;
        grad[m->b1 + (size_t)h] += du[h];
    }
    for (int64_t k = 0; k < F; k++) {
        double fk = f[k], acc = 0;
        const double *row = w1 + k * H;
        double *g = grad + m->w1 + (size_t)(k * H);
        for (int64_t h = 0; h < H; h++) g[h] += fk * du[h], acc += row[h] * du[h];
        df[k] = acc;
    }
    for (int64_t c = 0; c < C; c++) {
        double diff = l[c] - r[c], sg = diff > 0 ? 1 : diff < 0 ? -1 : 0; /* |x|' = 0 at 0 */
        dl[c] = df[c] + sg * df[2 * C + c] + r[c] * df[3 * C + c];
        dr[c] = df[C + c] - sg * df[2 * C + c] + l[c] * df[3 * C + c];
        if (has_cos) {
            dl[c] += df[4 * C] * (r[c] / nlr - cs * l[c] / ll);
            dr[c] += df[4 * C] * (l[c] / nlr - cs * r[c] / rr);
        }
    }
    /* LayerNorm: dH = d(l or r) / w; gamma, beta; dN = dH gamma;
     * d(pre) = rstd (dN - mean(dN) - N mean(dN N)) */
    for (int64_t i = 0; i < W2; i++) {
        const double *dside = i < w ? dl : dr, *n = N + i * C;
        double *dn = dN + i * C, m1 = 0, m2 = 0;
        for (int64_t c = 0; c < C; c++) {
            double dh = dside[c] / (double)w;
            grad[m->gamma + (size_t)c] += dh * n[c];
            grad[m->beta + (size_t)c] += dh;
            dn[c] = dh * ga[c];
            m1 += dn[c], m2 += dn[c] * n[c];
        }
        m1 /= (double)C, m2 /= (double)C;
        for (int64_t c = 0; c < C; c++) dO[i * C + c] = rstd[i] * (dn[c] - m1 - n[c] * m2);
    }
    /* O = A V: dA = dO V^T, dV = A^T dO; the residual's dX is not needed */
    for (int64_t i = 0; i < W2; i++)
        for (int64_t j = 0; j < W2; j++) {
            double acc = 0;
            for (int64_t c = 0; c < C; c++) acc += dO[i * C + c] * V[j * C + c];
            dA[i * W2 + j] = acc;
        }
    for (int64_t j = 0; j < W2; j++)
        for (int64_t c = 0; c < C; c++) {
            double acc = 0;
            for (int64_t i = 0; i < W2; i++) acc += A[i * W2 + j] * dO[i * C + c];
            dV[j * C + c] = acc;
        }
    /* softmax: dS = A (dA - sum_k A dA), scaled by 1/sqrt(C) into dQ, dK */
    for (int64_t i = 0; i < W2; i++) {
        double dot = 0;
        for (int64_t j = 0; j < W2; j++) dot += A[i * W2 + j] * dA[i * W2 + j];
        for (int64_t j = 0; j < W2; j++) dA[i * W2 + j] = A[i * W2 + j] * (dA[i * W2 + j] - dot) * inv;
    }
    for (int64_t i = 0; i < W2; i++)
        for (int64_t c = 0; c < C; c++) {
            double aq = 0, ak = 0;
            for (int64_t j = 0; j < W2; j++) {
                aq += dA[i * W2 + j] * K[j * C + c];
                ak += dA[j * W2 + i] * Q[j * C + c];
            }
            dQ[i * C + c] = aq, dK[i * C + c] = ak;
        }
    /* projections: dW[c][o] = sum_i X[i][c] dY[i][o], db = sum_i dY[i] */
    for (int64_t i = 0; i < W2; i++) {
        const double *gq = dQ + i * C, *gk = dK + i * C, *gv = dV + i * C;
        for (int64_t o = 0; o < C; o++) {
            grad[m->bq + (size_t)o] += gq[o];
            grad[m->bk + (size_t)o] += gk[o];
            grad[m->bv + (size_t)o] += gv[o];
        }
        for (int64_t c = 0; c < C; c++) {
            double x = X[i * C + c];
            if (x == 0) continue;
            double *a = grad + m->wq + (size_t)(c * C), *b = grad + m->wk + (size_t)(c * C),
                   *d = grad + m->wv + (size_t)(c * C);
            for (int64_t o = 0; o < C; o++) a[o] += x * gq[o], b[o] += x * gk[o], d[o] += x * gv[o];
        }
    }
    return loss;
}

/* -------------------------------------------------------------- labels --- */

/* Query rows are cut into at most MASS_BLOCKS blocks (a count that does not
 * depend on the threads); each block sums its rows' mass into its own
 * [Lk][2w] partial, and the partials are added in block order: the same
 * sums in the same order for any thread count. */
#define MASS_BLOCKS 16

typedef struct {
    const double *Q, *K; /* [Hq][Lq][hd], [Hkv][Lk][hd] */
    double *part;        /* [blocks][Lk][2w] */
    double *row;         /* [threads][Lk] */
    int64_t Hq, Hkv, Lq, Lk, hd, q_pos0, window, w, rows_per_block;
    int causal;
    double scale, softcap;
} mass_job;

/* One block of query rows: per (row, head) an explicit softmax over the
 * keys the row may see, in double; what it puts on each earlier key goes
 * to the slot of the key's distance. */
static void mass_task(void *arg, int64_t blk, int thread) {
    const mass_job *j = arg;
    const int64_t W2 = 2 * j->w, hd = j->hd, group = j->Hq / j->Hkv;
    double *part = j->part + (size_t)blk * (size_t)(j->Lk * W2), *e = j->row + (size_t)thread * (size_t)j->Lk;
    memset(part, 0, (size_t)(j->Lk * W2) * sizeof(double));
    int64_t r0 = blk * j->rows_per_block, r1 = r0 + j->rows_per_block < j->Lq ? r0 + j->rows_per_block : j->Lq;
    for (int64_t i = r0; i < r1; i++) {
        const int64_t pos = j->q_pos0 + i;
        const int64_t hi = j->causal ? (pos + 1 < j->Lk ? pos + 1 : j->Lk) : j->Lk;
        const int64_t lo = j->window > 0 && pos - j->window + 1 > 0 ? pos - j->window + 1 : 0;
        const int64_t top = hi < pos ? hi : pos; /* keys before the query's position */
        if (lo >= hi || lo >= top) continue;
        for (int64_t h = 0; h < j->Hq; h++) {
            const double *q = j->Q + (h * j->Lq + i) * hd, *K = j->K + (h / group) * j->Lk * hd;
            double mx = -INFINITY, sum = 0;
            for (int64_t k = lo; k < hi; k++) {
                const double *kk = K + k * hd;
                double sc = 0;
                for (int64_t c = 0; c < hd; c++) sc += q[c] * kk[c];
                sc *= j->scale;
                if (j->softcap > 0) sc = j->softcap * tanh(sc / j->softcap);
                e[k] = sc;
                if (sc > mx) mx = sc;
            }
            for (int64_t k = lo; k < hi; k++) sum += e[k] = exp(e[k] - mx);
            const double inv = 1.0 / sum;
            for (int64_t k = lo; k < top; k++) {
                int64_t d = pos - k;
                part[k * W2 + (d < W2 ? d : W2) - 1] += e[k] * inv;
            }
        }
    }
}

static dhsa_status check_view(const dhsa_tensor *t, const char *name) {
    if (!t->data) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_boundary_mass_add: %s has no data", name);
    if (t->type != DHSA_F32 && t->type != DHSA_F16 && t->type != DHSA_BF16 && t->type != DHSA_Q8_0)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_boundary_mass_add: %s has an unknown type", name);
    dhsa_status st = dhsa__check_view_type(name, t);
    if (st) return st;
    for (int i = 0; i < 4; i++)
        if (t->shape[i] < 0) return dhsa__fail(DHSA_ERR_SHAPE, "dhsa_boundary_mass_add: %s has a negative size", name);
    return DHSA_OK;
}

/* dst [H][L][d] doubles <- the view t [1, H, L, d]. */
static void load_heads(const dhsa_tensor *t, double *dst) {
    for (int64_t h = 0; h < t->shape[1]; h++)
        for (int64_t l = 0; l < t->shape[2]; l++) {
            const void *row = dhsa__at(t, 0, h, l);
            double *o = dst + (h * t->shape[2] + l) * t->shape[3];
            for (int64_t c = 0; c < t->shape[3]; c++) o[c] = dhsa__load(row, t->type, c * t->stride[3]);
        }
}

dhsa_status dhsa_boundary_mass_add(dhsa_ctx *ctx, const dhsa_attn_desc *a, int64_t w, double *mass,
                                   int64_t n_keys) {
    if (!ctx || !a || !mass) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_boundary_mass_add: NULL argument");
    if (w < 1 || w > 64)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "label window w = %lld: need 1 <= w <= 64", (long long)w);
    dhsa_status st;
    if ((st = check_view(&a->q, "q")) || (st = check_view(&a->k, "k"))) return st;
    if (a->key_mask || a->key_bias || a->attn_mask.data)
        return dhsa__fail(DHSA_ERR_UNSUPPORTED, "dhsa_boundary_mass_add: masks and key biases are not supported");
    const int64_t Hq = a->q.shape[1], Lq = a->q.shape[2], hd = a->q.shape[3];
    const int64_t Hkv = a->k.shape[1], Lk = a->k.shape[2];
    if (a->q.shape[0] != 1 || a->k.shape[0] != 1)
        return dhsa__fail(DHSA_ERR_SHAPE, "dhsa_boundary_mass_add: batch must be 1 (q has %lld, k %lld)",
                          (long long)a->q.shape[0], (long long)a->k.shape[0]);
    if (a->k.shape[3] != hd || Hkv < 1 || Hq % Hkv != 0)
        return dhsa__fail(DHSA_ERR_SHAPE,
                          "dhsa_boundary_mass_add: q [1, %lld, %lld, %lld] and k [1, %lld, %lld, %lld] disagree "
                          "(head dims must match, Hq a multiple of Hkv)",
                          (long long)Hq, (long long)Lq, (long long)hd, (long long)Hkv, (long long)Lk,
                          (long long)a->k.shape[3]);
    if (a->q_pos0 < 0 || a->window < 0 || !(a->scale >= 0) || !(a->softcap >= 0))
        return dhsa__fail(DHSA_ERR_INVALID_ARG,
                          "dhsa_boundary_mass_add: q_pos0, window, scale and softcap must be >= 0");
    if (Lk > n_keys || a->q_pos0 + Lq > n_keys)
        return dhsa__fail(DHSA_ERR_SHAPE,
                          "dhsa_boundary_mass_add: the call has %lld keys and queries up to position %lld but "
                          "mass holds %lld keys",
                          (long long)Lk, (long long)(a->q_pos0 + Lq), (long long)n_keys);
    if (Lq == 0 || Lk == 0 || Hq == 0) return DHSA_OK;
    const int64_t W2 = 2 * w, blocks = Lq < MASS_BLOCKS ? Lq : MASS_BLOCKS;
    const int threads = dhsa_ctx_n_threads(ctx);
    size_t nq = (size_t)(Hq * Lq * hd), nk = (size_t)(Hkv * Lk * hd), np = (size_t)(blocks * Lk * W2);
    double *buf = dhsa__alloc(ctx, (nq + nk + np + (size_t)threads * (size_t)Lk) * sizeof(double), &st);
    if (!buf) return st;
    mass_job j = {buf, buf + nq, buf + nq + nk, buf + nq + nk + np, Hq, Hkv, Lq, Lk, hd, a->q_pos0, a->window, w,
                  (Lq + blocks - 1) / blocks, a->causal, a->scale > 0 ? (double)a->scale : 1.0 / sqrt((double)hd),
                  (double)a->softcap};
    load_heads(&a->q, buf);
    load_heads(&a->k, buf + nq);
    dhsa_parallel_for(ctx, blocks, mass_task, &j);
    for (int64_t b = 0; b < blocks; b++) {
        const double *part = j.part + (size_t)(b * Lk * W2);
        for (int64_t i = 0; i < Lk * W2; i++) mass[i] += part[i];
    }
    dhsa_ctx_release(ctx, buf);
    return DHSA_OK;
}

dhsa_status dhsa_boundary_labels(const double *mass, int64_t n_keys, int64_t w, int64_t sink, float *y,
                                 float *log_ratio) {
    if (!mass || !y) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_boundary_labels: NULL argument");
    if (w < 1 || w > 64 || n_keys < 0 || sink < 0)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_boundary_labels: need 1 <= w <= 64, n_keys >= 0, sink >= 0");
    const int64_t W2 = 2 * w;
    for (int64_t c = 0; c < n_keys; c++) {
        y[c] = -1.0f;
        if (log_ratio) log_ratio[c] = 0.0f;
        if (c - w < sink || c + W2 > n_keys) continue;
        /* queries at positions >= c + w: for key j that is distance d >= c + w - j */
        double left = 0, right = 0;
        for (int64_t j = c - w; j < c + w; j++) {
            const double *slot = mass + j * W2;
            double s = 0;
            for (int64_t d = c + w - j; d <= W2; d++) s += slot[d - 1];
            if (j < c) left += s;
            else right += s;
        }
        double hi = left > right ? left : right, lo = left > right ? right : left, lr;
        if (!(hi >= 0 && lo >= 0) || !isfinite(hi))
            return dhsa__fail(DHSA_ERR_NONFINITE, "dhsa_boundary_labels: the mass near key %lld is %g / %g",
                              (long long)c, left, right);
        lr = hi == 0 ? 0.0 : lo == 0 ? LOG_R_MAX : log(hi) - log(lo);
        if (lr > LOG_R_MAX) lr = LOG_R_MAX;
        y[c] = (float)sigmoid(2.0 * (lr - log(2.0)));
        if (log_ratio) log_ratio[c] = (float)lr;
    }
    return DHSA_OK;
}

/* ------------------------------------------------------------ training --- */

dhsa_train_params dhsa_train_default_params(void) {
    dhsa_train_params p;
    memset(&p, 0, sizeof p);
    p.lr = 1e-4;
    p.beta1 = 0.9;
    p.beta2 = 0.999;
    p.eps = 1e-8;
    p.gamma = 2.0;
    p.pos_weight = 1.3;
    p.batch = 64;
    p.steps = 2000;
    p.eval_every = 100;
    p.seed = 1;
    return p;
}

typedef struct {
    int64_t seq, t;
} sample;

typedef struct {
    const dhsa__pmap *m;
    const dhsa_train_seq *seqs;
    const double *theta;
    double gamma, pos_weight;
    double *ws;       /* per thread: pass workspace + the input window */
    size_t ws_stride;
    /* gradient step */
    const sample *batch;
    int64_t batch_n;
    double *grads;    /* [SHARDS][n] */
    /* evaluation */
    const sample *eval;
    int64_t eval_n;
    double *eval_p;    /* [eval_n] */
    double *chunk_loss;
} train_job;

static uint64_t mix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void shuffle(sample *a, int64_t n, uint64_t *s) {
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t k = (int64_t)(mix64(s) % (uint64_t)(i + 1));
        sample t = a[i];
        a[i] = a[k];
        a[k] = t;
    }
}

/* X [2w][C] <- the keys around candidate t of its sequence (zeros outside). */
static void gather(const dhsa__pmap *m, const dhsa_train_seq *sq, int64_t t, double *X) {
    const int64_t C = m->C, w = m->w;
    for (int64_t i = 0; i < 2 * w; i++) {
        int64_t tok = t - w + i;
        double *x = X + i * C;
        if (tok < 0 || tok >= sq->n) {
            for (int64_t c = 0; c < C; c++) x[c] = 0;
            continue;
        }
        const float *k = sq->keys + tok * C;
        for (int64_t c = 0; c < C; c++) x[c] = k[c];
    }
}

static void grad_task(void *arg, int64_t shard, int thread) {
    const train_job *j = arg;
    const dhsa__pmap *m = j->m;
    double *ws = j->ws + (size_t)thread * j->ws_stride, *X = ws + dhsa__predictor_pass_ws(m);
    double *g = j->grads + (size_t)shard * m->n;
    memset(g, 0, m->n * sizeof(double));
    int64_t b0 = shard * j->batch_n / SHARDS, b1 = (shard + 1) * j->batch_n / SHARDS;
    for (int64_t b = b0; b < b1; b++) {
        const dhsa_train_seq *sq = &j->seqs[j->batch[b].seq];
        gather(m, sq, j->batch[b].t, X);
        dhsa__predictor_pass(m, j->theta, X, sq->y[j->batch[b].t], j->gamma, j->pos_weight, 1.0 / (double)j->batch_n,
                             g, ws, NULL);
    }
}

static void eval_task(void *arg, int64_t chunk, int thread) {
    const train_job *j = arg;
    const dhsa__pmap *m = j->m;
    double *ws = j->ws + (size_t)thread * j->ws_stride, *X = ws + dhsa__predictor_pass_ws(m), loss = 0;
    int64_t e0 = chunk * EVAL_CHUNK, e1 = e0 + EVAL_CHUNK < j->eval_n ? e0 + EVAL_CHUNK : j->eval_n;
    for (int64_t e = e0; e < e1; e++) {
        const dhsa_train_seq *sq = &j->seqs[j->eval[e].seq];
        gather(m, sq, j->eval[e].t, X);
        loss += dhsa__predictor_pass(m, j->theta, X, sq->y[j->eval[e].t], j->gamma, j->pos_weight, 0, NULL, ws,
                                     &j->eval_p[e]);
    }
    j->chunk_loss[chunk] = loss;
}

/* Mean loss over samples [0, n) (probabilities into j->eval_p). */
static double evaluate(dhsa_ctx *ctx, train_job *j, const sample *s, int64_t n) {
    j->eval = s;
    j->eval_n = n;
    int64_t chunks = (n + EVAL_CHUNK - 1) / EVAL_CHUNK;
    dhsa_parallel_for(ctx, chunks, eval_task, j);
    double sum = 0;
    for (int64_t c = 0; c < chunks; c++) sum += j->chunk_loss[c];
    return n ? sum / (double)n : 0;
}

static double label(const train_job *j, const sample *s) { return j->seqs[s->seq].y[s->t]; }

/* The logit in [-20, 20] that minimises f (unimodal) by golden section. */
static double golden_min(double (*f)(const void *, double), const void *arg) {
    const double g = (sqrt(5.0) - 1) / 2;
    double lo = -20, hi = 20, x1 = hi - g * (hi - lo), x2 = lo + g * (hi - lo), f1 = f(arg, x1), f2 = f(arg, x2);
    for (int it = 0; it < 70; it++) {
        if (f1 < f2) hi = x2, x2 = x1, f2 = f1, x1 = hi - g * (hi - lo), f1 = f(arg, x1);
        else lo = x1, x1 = x2, f1 = f2, x2 = lo + g * (hi - lo), f2 = f(arg, x2);
    }
    return 0.5 * (lo + hi);
}

typedef struct {
    const train_job *j;
    const sample *s;
    int64_t n;
    double y;
} loss_arg;

/* Mean focal loss of a constant logit over samples. */
static double const_loss(const train_job *j, const sample *s, int64_t n, double logit) {
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += dhsa__focal_loss(logit, label(j, &s[i]), j->gamma, j->pos_weight, NULL);
    return sum / (double)n;
}

static double const_loss_of(const void *arg, double logit) {
    const loss_arg *a = arg;
    return const_loss(a->j, a->s, a->n, logit);
}

static double one_loss_of(const void *arg, double logit) {
    const loss_arg *a = arg;
    return dhsa__focal_loss(logit, a->y, a->j->gamma, a->j->pos_weight, NULL);
}

typedef struct {
    double p;
    int pos;
} scored;

static int cmp_scored(const void *a, const void *b) {
    double x = ((const scored *)a)->p, y = ((const scored *)b)->p;
    return x < y ? -1 : x > y;
}

/* ROC AUC of the scores for the positives (Mann-Whitney, ties count half);
 * 0.5 when one class is empty. Sorts s. */
static double roc_auc(scored *s, int64_t n) {
    int64_t npos = 0;
    for (int64_t i = 0; i < n; i++) npos += s[i].pos;
    if (npos == 0 || npos == n) return 0.5;
    qsort(s, (size_t)n, sizeof *s, cmp_scored);
    double ranks = 0;
    for (int64_t i = 0; i < n;) {
        int64_t k = i;
        while (k < n && s[k].p == s[i].p) k++;
        double rank = 0.5 * (double)(i + 1 + k); /* mean of ranks i+1 .. k */
        for (int64_t e = i; e < k; e++)
            if (s[e].pos) ranks += rank;
        i = k;
    }
    double np = (double)npos, nn = (double)(n - npos);
    return (ranks - np * (np + 1) / 2) / (np * nn);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static dhsa_status check_train_args(const dhsa_predictor *pr, const dhsa_train_seq *seqs, int64_t n_seqs,
                                    const dhsa_train_params *p) {
    if (!pr || !p || (!seqs && n_seqs)) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_predictor_train: NULL argument");
    if (n_seqs < 0) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_predictor_train: n_seqs %lld < 0", (long long)n_seqs);
    if (!(p->lr > 0) || !isfinite(p->lr) || !(p->beta1 >= 0 && p->beta1 < 1) || !(p->beta2 >= 0 && p->beta2 < 1) ||
        !(p->eps > 0) || !(p->gamma >= 0 && p->gamma <= 16) || !(p->pos_weight > 0) || !isfinite(p->pos_weight))
        return dhsa__fail(DHSA_ERR_INVALID_ARG,
                          "dhsa_predictor_train: need lr > 0, 0 <= beta1, beta2 < 1, eps > 0, 0 <= gamma <= 16, "
                          "pos_weight > 0 (got lr %g, betas %g %g, eps %g, gamma %g, pos_weight %g)",
                          p->lr, p->beta1, p->beta2, p->eps, p->gamma, p->pos_weight);
    if (p->batch < 1 || p->batch > (1 << 20) || p->steps < 0 || p->eval_every < 0)
        return dhsa__fail(DHSA_ERR_INVALID_ARG,
                          "dhsa_predictor_train: need 1 <= batch <= 2^20, steps >= 0, eval_every >= 0");
    for (int64_t s = 0; s < n_seqs; s++) {
        const dhsa_train_seq *q = &seqs[s];
        if (q->n < 0 || (q->n && (!q->keys || !q->y)))
            return dhsa__fail(DHSA_ERR_INVALID_ARG, "training sequence %lld: n < 0 or NULL keys/labels", (long long)s);
        for (int64_t i = 0; i < q->n * pr->C; i++)
            if (!isfinite(q->keys[i]))
                return dhsa__fail(DHSA_ERR_NONFINITE,
                                  "training sequence %lld: key value %lld (token %lld) is not finite", (long long)s,
                                  (long long)i, (long long)(i / pr->C));
        for (int64_t t = 0; t < q->n; t++)
            if (!(q->y[t] <= 1.0f) || isnan(q->y[t]))
                return dhsa__fail(DHSA_ERR_INVALID_ARG,
                                  "training sequence %lld: label %lld is %g (need <= 1; < 0 = none)", (long long)s,
                                  (long long)t, (double)q->y[t]);
    }
    return DHSA_OK;
}

dhsa_status dhsa_predictor_train(dhsa_ctx *ctx, dhsa_predictor *pr, const dhsa_train_seq *seqs, int64_t n_seqs,
                                 const dhsa_train_params *p, dhsa_train_report *report) {
    double t_start = now_s();
    if (!ctx) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_predictor_train: ctx is NULL");
    dhsa_status st = check_train_args(pr, seqs, n_seqs, p);
    if (st) return st;
    const dhsa__pmap m = dhsa__predictor_pmap(pr->C, pr->w, pr->hidden);
    const int64_t w = pr->w;
    int64_t n_train = 0, n_val = 0;
    for (int64_t s = 0; s < n_seqs; s++)
        for (int64_t t = 0; t < seqs[s].n; t++)
            if (seqs[s].y[t] >= 0) {
                n_train += t + w <= seqs[s].split;
                n_val += t - w >= seqs[s].split;
            }
    if (n_train == 0 || n_val == 0)
        return dhsa__fail(DHSA_ERR_INVALID_ARG,
                          "dhsa_predictor_train: %lld training and %lld validation samples: need at least one of "
                          "each (labels y >= 0 on both sides of each sequence's split)",
                          (long long)n_train, (long long)n_val);
    const int threads = dhsa_ctx_n_threads(ctx);
    const size_t n = m.n, ws_stride = dhsa__align_up(dhsa__predictor_pass_ws(&m) + (size_t)(2 * w * pr->C), 8);
    const int64_t n_sub = n_train < TRAIN_SUBSET ? n_train : TRAIN_SUBSET, n_eval = n_val > n_sub ? n_val : n_sub;
    size_t doubles = 3 * n                                   /* theta, adam m, v */
                     + (size_t)SHARDS * n + n                /* shard gradients, sum */
                     + (size_t)threads * ws_stride + (size_t)n_eval /* ws, p */
                     + (size_t)(n_eval / EVAL_CHUNK + 1);    /* chunk losses */
    size_t bytes = doubles * sizeof(double) + (size_t)(2 * n_train + n_val) * sizeof(sample) +
                   (size_t)n_val * sizeof(scored);
    char *mem = dhsa__alloc(ctx, bytes, &st);
    if (!mem) return st;
    double *theta = (double *)mem, *am = theta + n, *av = am + n, *grads = av + n, *gsum = grads + SHARDS * n;
    double *ws = gsum + n, *eval_p = ws + (size_t)threads * ws_stride;
    double *chunk_loss = eval_p + n_eval;
    sample *train = (sample *)(chunk_loss + n_eval / EVAL_CHUNK + 1), *val = train + n_train, *sub = val + n_val;
    scored *sc = (scored *)(sub + n_train); /* sub: a shuffled copy of train; its first n_sub are the subset */

    int64_t a = 0, b = 0;
    for (int64_t s = 0; s < n_seqs; s++)
        for (int64_t t = 0; t < seqs[s].n; t++)
            if (seqs[s].y[t] >= 0) {
                if (t + w <= seqs[s].split) train[a++] = (sample){s, t};
                if (t - w >= seqs[s].split) val[b++] = (sample){s, t};
            }
    uint64_t rng = p->seed ^ 0x5eed5eed5eedull;
    memcpy(sub, train, (size_t)n_train * sizeof(sample));
    shuffle(sub, n_train, &rng);
    memset(am, 0, 2 * n * sizeof(double));
    dhsa__predictor_get_params(pr, theta);

    train_job j = {&m, seqs, theta, p->gamma, p->pos_weight, ws, ws_stride, NULL, 0, grads, NULL, 0, eval_p,
                   chunk_loss};
    dhsa_train_report rep;
    memset(&rep, 0, sizeof rep);
    rep.n_train = n_train, rep.n_val = n_val;
    double ysum = 0;
    for (int64_t i = 0; i < n_train; i++) rep.train_pos += label(&j, &train[i]) >= 0.5;
    for (int64_t i = 0; i < n_val; i++) rep.val_pos += label(&j, &val[i]) >= 0.5, ysum += label(&j, &val[i]);
    rep.train_pos /= (double)n_train, rep.val_pos /= (double)n_val, rep.val_y_mean = ysum / (double)n_val;

    dhsa_train_point pt = {0, evaluate(ctx, &j, sub, n_sub), evaluate(ctx, &j, val, n_val)};
    rep.first = pt;
    if (p->progress) p->progress(p->progress_user, &pt);
    memcpy(train, sub, (size_t)n_train * sizeof(sample)); /* epoch order starts from the shuffled copy */
    int64_t pos = 0;
    for (int64_t step = 1; step <= p->steps; step++) {
        /* the next batch of the epoch's order; a new shuffled epoch when it runs out */
        if (pos + p->batch > n_train) {
            shuffle(train, n_train, &rng);
            pos = 0;
        }
        int64_t bn = p->batch < n_train ? p->batch : n_train;
        j.batch = train + pos, j.batch_n = bn;
        pos += bn;
        dhsa_parallel_for(ctx, SHARDS, grad_task, &j);
        memcpy(gsum, grads, n * sizeof(double));
        for (int s = 1; s < SHARDS; s++) {
            const double *g = grads + (size_t)s * n;
            for (size_t i = 0; i < n; i++) gsum[i] += g[i];
        }
        dhsa__adam_step(theta, gsum, am, av, n, step, p->lr, p->beta1, p->beta2, p->eps);
        if (p->eval_every > 0 && step % p->eval_every == 0 && step < p->steps) {
            pt = (dhsa_train_point){step, evaluate(ctx, &j, sub, n_sub), evaluate(ctx, &j, val, n_val)};
            if (p->progress) p->progress(p->progress_user, &pt);
        }
    }
    /* the F32 weights the file will hold, evaluated as such */
    dhsa__predictor_set_params(pr, theta);
    dhsa__predictor_get_params(pr, theta);
    pt = (dhsa_train_point){p->steps, evaluate(ctx, &j, sub, n_sub), evaluate(ctx, &j, val, n_val)};
    rep.last = pt;
    if (p->progress) p->progress(p->progress_user, &pt);
    for (int64_t i = 0; i < n_val; i++) {
        int truth = label(&j, &val[i]) >= 0.5, pred = eval_p[i] >= 0.5;
        sc[i] = (scored){eval_p[i], truth};
        rep.tp += truth && pred, rep.fp += !truth && pred, rep.fn += truth && !pred, rep.tn += !truth && !pred;
    }
    rep.precision = rep.tp + rep.fp ? (double)rep.tp / (double)(rep.tp + rep.fp) : 0;
    rep.recall = rep.tp + rep.fn ? (double)rep.tp / (double)(rep.tp + rep.fn) : 0;
    rep.f1 = rep.precision + rep.recall > 0 ? 2 * rep.precision * rep.recall / (rep.precision + rep.recall) : 0;
    rep.auc = roc_auc(sc, n_val);
    /* the best constant on the training samples, and the floor: the best p
     * for each validation label (a function of y alone, so computed once per
     * distinct y in a row of equal labels) */
    loss_arg la = {&j, train, n_train, 0};
    double c = golden_min(const_loss_of, &la), floor_sum = 0, last_y = -1, last_l = 0;
    rep.const_p = sigmoid(c);
    rep.val_loss_const = const_loss(&j, val, n_val, c);
    for (int64_t i = 0; i < n_val; i++) {
        la.y = label(&j, &val[i]);
        if (la.y != last_y) last_y = la.y, last_l = one_loss_of(&la, golden_min(one_loss_of, &la));
        floor_sum += last_l;
    }
    rep.val_loss_floor = floor_sum / (double)n_val;
    rep.seconds = now_s() - t_start;
    dhsa_ctx_release(ctx, mem);
    if (report) *report = rep;
    return DHSA_OK;
}
