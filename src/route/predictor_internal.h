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
