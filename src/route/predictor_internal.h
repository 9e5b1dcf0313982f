/* predictor_internal.h: the learned boundary predictor's struct and the
 * pieces its trainer shares with the inference code (never installed).
 *
 * predictor.c owns the struct, the file format and the F32 inference;
 * predictor_train.c holds the double-precision training forward, its
 * hand-written backward, the focal loss, Adam and the label recipe. The
 * training functions below are exported here (not in dhsa.h) so that
 * tests/test_train.c can check them against finite differences.
 */
#ifndef DHSA_PREDICTOR_INTERNAL_H
#define DHSA_PREDICTOR_INTERNAL_H

#include "core/internal.h"
#include "attn/kern.h"

#include <stddef.h>
#include <stdint.h>

struct dhsa_predictor {
    int64_t C, w, hidden;
    /* raw weights, as in the file */
    float *wq, *bq, *wk, *bk, *wv, *bv, *gamma, *beta, *w1, *b1, *w2;
    float b2;
    /* packed panels: proj [3][tilesC][C][64], mlp [tilesH][4C+1][64] */
    float *proj, *mlp;
    int64_t tiles_c, tiles_h;
    float *mem; /* one allocation for everything above; mem[0 .. raw - 1)
                   holds the raw weights in file order (b2's slot unused) */
};

/* Floats of the raw weights for (C, hidden), b2 included: the file's body. */
size_t dhsa__predictor_raw_floats(int64_t C, int64_t hidden);
/* A zeroed predictor of these sizes (DHSA_ERR_FORMAT outside the file's
 * ranges). */
dhsa_status dhsa__predictor_alloc(int64_t C, int64_t w, int64_t hidden, dhsa_predictor **out);
/* Rebuilds the packed panels from the raw weights (after they change). */
void dhsa__predictor_pack(dhsa_predictor *pr);

/* ---- inference pieces (predictor.c), shared with the decode index ----
 * dhsa_predictor_score (a whole sequence, in slabs) and dhsa_kv_index (keys
 * as they arrive, kv_index.c) run the same three steps on the same rows, so
 * a candidate's probability has the same bits in both: every step computes
 * a row from that row's inputs only, in a fixed order, whatever the number
 * of rows in the call.
 *   1. dhsa__predictor_project: Q, K, V of each token;
 *   2. the window kernel: the features f [4C + 1] of one candidate from its
 *      2w rows of X, Q, K, V (per ISA: predictor_avx2.c, predictor_avx512.c;
 *      the scalar one here is their reference);
 *   3. dhsa__predictor_mlp, then dhsa__predictor_prob. */

/* Q, K, V [T][C] = X [T][C] Wq + bq, X Wk + bk, X Wv + bv through the qk
 * micro-kernel of kern against the packed panels. Pn: [DHSA_BC][64] floats
 * of scratch. */
void dhsa__predictor_project(const dhsa_predictor *pr, const dhsa_attn_kernels *kern, const float *X, int64_t T,
                             float *Q, float *K, float *V, float *Pn);

/* f [4C + 1] <- the features of one candidate (window attention, residual,
 * LayerNorm, the two means, [l, r, |l - r|, l * r, cos(l, r)]). X, Q, K, V
 * point at the window's first row: [2w][C] each, rows C floats apart.
 * ws: dhsa__predictor_window_ws(pr) floats, 64-byte aligned. */
typedef void (*dhsa__predictor_window_fn)(const dhsa_predictor *pr, const float *X, const float *Q, const float *K,
                                          const float *V, float *ws, float *f);
size_t dhsa__predictor_window_ws(const dhsa_predictor *pr);
void dhsa__predictor_window_scalar(const dhsa_predictor *pr, const float *X, const float *Q, const float *K,
                                   const float *V, float *ws, float *f);
#if defined(__x86_64__)
void dhsa__predictor_window_avx2(const dhsa_predictor *pr, const float *X, const float *Q, const float *K,
                                 const float *V, float *ws, float *f);
void dhsa__predictor_window_avx512(const dhsa_predictor *pr, const float *X, const float *Q, const float *K,
                                   const float *V, float *ws, float *f);
#endif
/* The window kernel of an ISA: pass dhsa_active_isa() (the CPU must have
 * the ISA; DHSA_FORCE_SCALAR=1 and dhsa_set_isa choose it). */
dhsa__predictor_window_fn dhsa__predictor_window_kernel(dhsa_isa isa);

/* z [n] = ReLU(Fe [n][4C + 1] W1 + b1) . w2 + b2 (the logits); Pn as in
 * dhsa__predictor_project. */
void dhsa__predictor_mlp(const dhsa_predictor *pr, const dhsa_attn_kernels *kern, const float *Fe, int64_t n,
                         float *Pn, float *z);
/* sigmoid(z) as dhsa_predictor_score computes it. */
float dhsa__predictor_prob(float z);

/* ---- training (predictor_train.c) ---- */

/* Offsets of each parameter group in a flat vector theta in file order
 * (the order of dhsa_predictor_save's body), n of them in all. */
typedef struct {
    int64_t C, w, H;
    size_t wq, bq, wk, bk, wv, bv, gamma, beta, w1, b1, w2, b2, n;
} dhsa__pmap;

dhsa__pmap dhsa__predictor_pmap(int64_t C, int64_t w, int64_t hidden);
/* theta [n] <- the predictor's F32 weights; and back (rounded to F32,
 * panels repacked). */
void dhsa__predictor_get_params(const dhsa_predictor *pr, double *theta);
void dhsa__predictor_set_params(dhsa_predictor *pr, const double *theta);

/* Focal BCE of logit s against soft target y in [0, 1] (p = sigmoid(s)):
 *   loss = -(pos_weight * y * (1-p)^gamma * log p + (1-y) * p^gamma * log(1-p))
 * computed from s with log p = -softplus(-s); *dlds (may be NULL) gets
 * d loss / d s. */
double dhsa__focal_loss(double s, double y, double gamma, double pos_weight, double *dlds);

/* Doubles of workspace dhsa__predictor_pass needs. */
size_t dhsa__predictor_pass_ws(const dhsa__pmap *m);

/* One sample through the network in double: X [2w][C] the input window,
 * theta [m->n] the parameters. Returns the focal loss against y and sets
 * *p (may be NULL) to the predicted probability. With grad != NULL, adds
 * gscale * d loss / d theta to grad [m->n] (every parameter group, by the
 * hand-written backward). ws: dhsa__predictor_pass_ws(m) doubles. */
double dhsa__predictor_pass(const dhsa__pmap *m, const double *theta, const double *X, double y, double gamma,
                            double pos_weight, double gscale, double *grad, double *ws, double *p);

/* One Adam step (t counts from 1): m = b1 m + (1 - b1) g, v = b2 v + (1 -
 * b2) g^2, theta -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps). */
void dhsa__adam_step(double *theta, const double *g, double *m, double *v, size_t n, int64_t t, double lr,
                     double beta1, double beta2, double eps);

#endif
