/* test_train.c: training of the learned boundary predictor
 * (src/route/predictor_train.c).
 *   - the hand-written backward of every parameter group against central
 *     finite differences of the double forward (tiny predictor: C = 4,
 *     w = 2, hidden 3), and the checker's own sensitivity: a gradient with
 *     one element of any group off by 1e-4 of the group's scale fails it;
 *   - the focal loss against its formula and its derivative against finite
 *     differences, with soft targets;
 *   - one Adam step against the formula worked by hand, and convergence
 *     on a quadratic;
 *   - the attention mass against a brute-force softmax written here
 *     (GQA, softcap, window, two ubatches), labels on crafted attention (a
 *     sharp boundary gives y near 1, a flat region sigmoid(-2 log 2) = 0.2);
 *   - the trainer's double forward agrees with dhsa_predictor_score;
 *   - training on a synthetic problem with real boundaries lowers the
 *     validation loss below the best constant; same result on 1 and 2
 *     threads; a trained predictor survives save/load;
 *   - bad inputs are refused with a sentence;
 *   - `dhsa train-boundary` (env DHSA_CLI, which make test sets) on a short
 *     text stories260K writes itself: a predictor of C = 32, w = 4 that
 *     loads, the same bytes on 1 and 2 threads, usage errors exit 2.
 * Run: make build/tests/test_train && build/tests/test_train
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dhsa.h"
#include "route/predictor_internal.h"
#include "t.h"

static uint64_t rng = 777;
static double drand(void) { /* uniform in [-1, 1) */
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

/* ------------------------------------------------------ gradient check --- */

typedef struct {
    const char *name;
    size_t off, len;
} group;

static int groups_of(const dhsa__pmap *m, group *g) {
    size_t c = (size_t)m->C, h = (size_t)m->H, f = 4 * c + 1;
    group all[] = {{"Wq", m->wq, c * c}, {"bq", m->bq, c},       {"Wk", m->wk, c * c},   {"bk", m->bk, c},
                   {"Wv", m->wv, c * c}, {"bv", m->bv, c},       {"gamma", m->gamma, c}, {"beta", m->beta, c},
                   {"W1", m->w1, f * h}, {"b1", m->b1, h},       {"w2", m->w2, h},       {"b2", m->b2, 1}};
    memcpy(g, all, sizeof all);
    return (int)(sizeof all / sizeof all[0]);
}

typedef struct {
    const double *X;
    double y, gamma, pw;
} sample_in;

/* Summed loss of the samples at theta. */
static double loss_at(const dhsa__pmap *m, const double *theta, const sample_in *s, int ns, double *ws) {
    double l = 0;
    for (int i = 0; i < ns; i++)
        l += dhsa__predictor_pass(m, theta, s[i].X, s[i].y, s[i].gamma, s[i].pw, 0, NULL, ws, NULL);
    return l;
}

/* Compares grad with central differences (step h) group by group: each
 * element must satisfy |g - fd| <= 1e-6 * scale, scale = max(1, max |fd|
 * of its group). Truncation of the central difference is O(h^2 f''') ~
 * 1e-10 at h = 1e-5 and the roundoff O(1e-16 / h) ~ 1e-11 for losses of
 * order 1: 1e-6 leaves four orders of margin, yet a wrong term in the
 * backward is off by O(its size). Returns the number of failing groups;
 * with quiet = 0 prints the worst element of a failing group. */
static int grad_check(const dhsa__pmap *m, double *theta, const double *grad, const sample_in *s, int ns,
                      double *ws, int quiet, double *worst_rel) {
    group g[12];
    int ng = groups_of(m, g), bad = 0;
    const double h = 1e-5;
    *worst_rel = 0;
    double *fd = malloc(m->n * sizeof(double));
    for (size_t i = 0; i < m->n; i++) {
        double t0 = theta[i];
        theta[i] = t0 + h;
        double lp = loss_at(m, theta, s, ns, ws);
        theta[i] = t0 - h;
        double lm = loss_at(m, theta, s, ns, ws);
        theta[i] = t0;
        fd[i] = (lp - lm) / (2 * h);
    }
    for (int k = 0; k < ng; k++) {
        double scale = 1, err = 0;
        size_t at = g[k].off;
        for (size_t i = g[k].off; i < g[k].off + g[k].len; i++) scale = fmax(scale, fabs(fd[i]));
        for (size_t i = g[k].off; i < g[k].off + g[k].len; i++)
            if (fabs(grad[i] - fd[i]) > err) err = fabs(grad[i] - fd[i]), at = i;
        if (err / scale > *worst_rel) *worst_rel = err / scale;
        if (err > 1e-6 * scale) {
            bad++;
            if (!quiet)
                fprintf(stderr, "  group %s: element %zu: backward %.12g, finite difference %.12g (scale %g)\n",
                        g[k].name, at - g[k].off, grad[at], fd[at], scale);
        }
    }
    free(fd);
    return bad;
}

static void test_gradients(void) {
    const int64_t C = 4, w = 2, H = 3;
    dhsa__pmap m = dhsa__predictor_pmap(C, w, H);
    double *theta = malloc(m.n * sizeof(double)), *grad = calloc(m.n, sizeof(double));
    double *ws = malloc(dhsa__predictor_pass_ws(&m) * sizeof(double));
    for (size_t i = 0; i < m.n; i++) theta[i] = 0.7 * drand();
    for (int64_t c = 0; c < C; c++) theta[m.gamma + (size_t)c] = 1 + 0.3 * drand();
    /* five samples: soft, hard and edge targets; one window with zero rows
     * (a candidate at the start of a sequence); both focal settings */
    double X[5][16];
    for (int s = 0; s < 5; s++)
        for (int i = 0; i < 16; i++) X[s][i] = 1.5 * drand();
    for (int i = 0; i < 8; i++) X[3][i] = 0;
    sample_in in[5] = {{X[0], 0.37, 2, 1.3}, {X[1], 1.0, 2, 1.3}, {X[2], 0.0, 2, 1.3}, {X[3], 0.81, 2, 1.3},
                       {X[4], 0.55, 0, 1.0}};
    for (int s = 0; s < 5; s++)
        dhsa__predictor_pass(&m, theta, in[s].X, in[s].y, in[s].gamma, in[s].pw, 1.0, grad, ws, NULL);
    double rel;
    int bad = grad_check(&m, theta, grad, in, 5, ws, 0, &rel);
    T_CHECK(bad == 0, "backward vs central differences: %d of 12 parameter groups off (worst relative %.3g)", bad, rel);
    printf("gradient check, C=4 w=2 hidden=3, 5 samples: worst |backward - fd| / scale = %.3g (bound 1e-6)\n", rel);

    /* the checker must catch one wrong element in any group */
    group g[12];
    int ng = groups_of(&m, g), caught = 0;
    double *wrong = malloc(m.n * sizeof(double));
    for (int k = 0; k < ng; k++) {
        memcpy(wrong, grad, m.n * sizeof(double));
        double scale = 1;
        for (size_t i = g[k].off; i < g[k].off + g[k].len; i++) scale = fmax(scale, fabs(grad[i]));
        wrong[g[k].off + g[k].len / 2] += 1e-4 * scale;
        double r2;
        caught += grad_check(&m, theta, wrong, in, 5, ws, 1, &r2) == 1;
    }
    T_CHECK(caught == ng, "a gradient with one element off by 1e-4 of its group's scale was caught in %d of %d groups",
            caught, ng);
    /* a missing term (one row of Wq's gradient zeroed) fails it too */
    memcpy(wrong, grad, m.n * sizeof(double));
    for (int64_t o = 0; o < C; o++) wrong[m.wq + (size_t)o] = 0;
    T_CHECK(grad_check(&m, theta, wrong, in, 5, ws, 1, &rel) >= 1, "a zeroed gradient row passed the checker");
    free(wrong);
    free(theta);
    free(grad);
    free(ws);
}

/* ----------------------------------------------------------- focal loss --- */

static void test_focal(void) {
    const double ss[] = {-9, -2.5, -0.3, 0, 0.7, 3, 8};
    const double ys[] = {0, 0.2, 0.5, 0.83, 1};
    const double gs[][2] = {{0, 1}, {2, 1.3}, {1.5, 0.7}};
    double worst_l = 0, worst_d = 0;
    for (size_t a = 0; a < sizeof ss / sizeof ss[0]; a++)
        for (size_t b = 0; b < sizeof ys / sizeof ys[0]; b++)
            for (size_t c = 0; c < sizeof gs / sizeof gs[0]; c++) {
                double s = ss[a], y = ys[b], g = gs[c][0], pw = gs[c][1], d;
                double l = dhsa__focal_loss(s, y, g, pw, &d);
                double p = 1 / (1 + exp(-s));
                double ref = -(pw * y * pow(1 - p, g) * log(p) + (1 - y) * pow(p, g) * log(1 - p));
                double h = 1e-5;
                double fd =
                    (dhsa__focal_loss(s + h, y, g, pw, NULL) - dhsa__focal_loss(s - h, y, g, pw, NULL)) / (2 * h);
                worst_l = fmax(worst_l, fabs(l - ref) / (1 + fabs(ref)));
                worst_d = fmax(worst_d, fabs(d - fd) / (1 + fabs(fd)));
                if (g == 0 && pw == 1)
                    T_CHECK(fabs(d - (p - y)) < 1e-14, "plain BCE: dL/ds %.17g != p - y %.17g", d, p - y);
            }
    T_CHECK(worst_l < 1e-12, "focal loss vs its formula: worst relative %.3g", worst_l);
    T_CHECK(worst_d < 1e-8, "focal loss derivative vs finite differences: worst relative %.3g", worst_d);
    /* stable where the formula is not: s = -40, y = 1 (log p = -40) */
    double d, l = dhsa__focal_loss(-40, 1, 2, 1.3, &d);
    T_CHECK(fabs(l - 1.3 * 40) < 1e-9 && isfinite(d), "focal loss at s = -40: %g (want 52)", l);
}

/* ----------------------------------------------------------------- adam --- */

static void test_adam(void) {
    /* f(x) = 0.5 sum a_i (x_i - c_i)^2, g = a (x - c) */
    const double a[3] = {1, 10, 0.1}, c[3] = {1, -2, 3};
    double x[3] = {0, 0, 0}, mm[3] = {0}, vv[3] = {0}, g[3];
    const double lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-8;
    for (int i = 0; i < 3; i++) g[i] = a[i] * (x[i] - c[i]);
    dhsa__adam_step(x, g, mm, vv, 3, 1, lr, b1, b2, eps);
    int ok = 1;
    for (int i = 0; i < 3; i++) ok &= fabs(x[i] - (-lr * g[i] / (fabs(g[i]) + eps))) < 1e-15;
    T_CHECK(ok, "Adam step 1: x = %.17g %.17g %.17g (want -lr sign(g))", x[0], x[1], x[2]);
    /* step 2 by hand */
    double x1[3], g2[3];
    memcpy(x1, x, sizeof x);
    for (int i = 0; i < 3; i++) g2[i] = a[i] * (x[i] - c[i]);
    dhsa__adam_step(x, g2, mm, vv, 3, 2, lr, b1, b2, eps);
    ok = 1;
    for (int i = 0; i < 3; i++) {
        double m2 = 0.9 * 0.1 * g[i] + 0.1 * g2[i], v2 = 0.999 * 0.001 * g[i] * g[i] + 0.001 * g2[i] * g2[i];
        double want = x1[i] - lr * (m2 / (1 - 0.81)) / (sqrt(v2 / (1 - 0.998001)) + eps);
        ok &= fabs(x[i] - want) < 1e-14;
    }
    T_CHECK(ok, "Adam step 2 differs from the formula worked by hand");
    for (int64_t t = 3; t <= 4000; t++) {
        for (int i = 0; i < 3; i++) g[i] = a[i] * (x[i] - c[i]);
        dhsa__adam_step(x, g, mm, vv, 3, t, lr, b1, b2, eps);
    }
    double err = 0;
    for (int i = 0; i < 3; i++) err = fmax(err, fabs(x[i] - c[i]));
    T_CHECK(err < 1e-2, "Adam on a quadratic: |x - c| = %.3g after 4000 steps", err);
}

/* --------------------------------------------------------------- labels --- */

/* Brute-force mass: softmax per (row, head) in double, over keys the row may see. */
static void mass_ref(const float *q, const float *k, int64_t Hq, int64_t Hkv, int64_t L, int64_t d, double scale,
                     double softcap, int64_t window, int64_t w, double *mass) {
    memset(mass, 0, (size_t)(L * 2 * w) * sizeof(double));
    double *s = malloc((size_t)L * sizeof(double));
    for (int64_t i = 0; i < L; i++)
        for (int64_t h = 0; h < Hq; h++) {
            int64_t g = h / (Hq / Hkv), lo = window > 0 && i - window + 1 > 0 ? i - window + 1 : 0;
            double mx = -INFINITY, sum = 0;
            for (int64_t j = lo; j <= i; j++) {
                double acc = 0;
                for (int64_t c = 0; c < d; c++) acc += (double)q[(h * L + i) * d + c] * k[(g * L + j) * d + c];
                acc *= scale;
                if (softcap > 0) acc = softcap * tanh(acc / softcap);
                s[j] = acc;
                mx = fmax(mx, acc);
            }
            for (int64_t j = lo; j <= i; j++) sum += exp(s[j] - mx);
            for (int64_t j = lo; j < i; j++) {
                int64_t dist = i - j < 2 * w ? i - j : 2 * w;
                mass[j * 2 * w + dist - 1] += exp(s[j] - mx) / sum;
            }
        }
    free(s);
}

static dhsa_attn_desc desc_of(float *q, float *k, int64_t Hq, int64_t Hkv, int64_t L, int64_t d) {
    dhsa_attn_desc a = dhsa_attn_default_desc();
    a.q = dhsa_tensor_bhld(q, DHSA_F32, 1, Hq, L, d);
    a.k = dhsa_tensor_bhld(k, DHSA_F32, 1, Hkv, L, d);
    a.causal = 1;
    return a;
}

static void test_mass(dhsa_ctx *ctx, dhsa_ctx *ctx1) {
    const int64_t Hq = 4, Hkv = 2, L = 37, d = 3, w = 3, W2 = 2 * w;
    float *q = malloc((size_t)(Hq * L * d) * sizeof(float)), *k = malloc((size_t)(Hkv * L * d) * sizeof(float));
    for (int64_t i = 0; i < Hq * L * d; i++) q[i] = (float)(2 * drand());
    for (int64_t i = 0; i < Hkv * L * d; i++) k[i] = (float)(2 * drand());
    double *ref = malloc((size_t)(L * W2) * sizeof(double)), *got = malloc((size_t)(L * W2) * sizeof(double));
    const struct { double softcap; int64_t window; } cases[] = {{0, 0}, {1.5, 0}, {0, 5}};
    for (int ci = 0; ci < 3; ci++) {
        mass_ref(q, k, Hq, Hkv, L, d, (double)0.4f, cases[ci].softcap, cases[ci].window, w, ref);
        /* two ubatches: rows [0, 16) with keys [0, 16), rows [16, 37) with all keys */
        memset(got, 0, (size_t)(L * W2) * sizeof(double));
        dhsa_attn_desc a = desc_of(q, k, Hq, Hkv, L, d);
        a.scale = 0.4f, a.softcap = (float)cases[ci].softcap, a.window = cases[ci].window;
        a.q.shape[2] = 16, a.k.shape[2] = 16;
        dhsa_status st = dhsa_boundary_mass_add(ctx, &a, w, got, L);
        a.q.data = q + 16 * d, a.q.shape[2] = L - 16, a.k.shape[2] = L, a.q_pos0 = 16;
        st = st ? st : dhsa_boundary_mass_add(ctx, &a, w, got, L);
        T_CHECK(st == DHSA_OK, "mass_add: %s", dhsa_last_error());
        double err = 0;
        int64_t at = 0;
        for (int64_t i = 0; i < L * W2; i++)
            if (fabs(got[i] - ref[i]) > err) err = fabs(got[i] - ref[i]), at = i;
        T_CHECK(err < 1e-12, "mass (softcap %g, window %lld) vs brute force: key %lld slot %lld: %.17g vs %.17g",
                cases[ci].softcap, (long long)cases[ci].window, (long long)(at / W2), (long long)(at % W2), got[at],
                ref[at]);
        /* the same sums on one thread, bit for bit */
        memset(ref, 0, (size_t)(L * W2) * sizeof(double));
        a.q.data = q, a.q.shape[2] = L, a.q_pos0 = 0;
        dhsa_attn_desc a2 = a;
        a2.q.shape[2] = 16, a2.k.shape[2] = 16;
        st = dhsa_boundary_mass_add(ctx1, &a2, w, ref, L);
        a2.q.data = q + 16 * d, a2.q.shape[2] = L - 16, a2.k.shape[2] = L, a2.q_pos0 = 16;
        st = st ? st : dhsa_boundary_mass_add(ctx1, &a2, w, ref, L);
        T_CHECK(st == DHSA_OK && memcmp(ref, got, (size_t)(L * W2) * sizeof(double)) == 0,
                "mass on 1 thread differs from %d threads", dhsa_ctx_n_threads(ctx));
    }
    free(q), free(k), free(ref), free(got);
}

static void test_labels(dhsa_ctx *ctx) {
    /* one head, d = 1, all queries 1; keys before 20 are -3, from 20 on +3:
     * every later query puts e^6 times more mass on each key after 20 */
    const int64_t L = 40, w = 4, c0 = 20;
    float q[40], k[40], y[40], lr[40];
    double mass[40 * 8];
    for (int64_t i = 0; i < L; i++) q[i] = 1, k[i] = i < c0 ? -3.0f : 3.0f;
    dhsa_attn_desc a = desc_of(q, k, 1, 1, L, 1);
    a.scale = 1;
    memset(mass, 0, sizeof mass);
    dhsa_status st = dhsa_boundary_mass_add(ctx, &a, w, mass, L);
    st = st ? st : dhsa_boundary_labels(mass, L, w, 1, y, lr);
    T_CHECK(st == DHSA_OK, "labels: %s", dhsa_last_error());
    double flat = 1 / (1 + exp(2 * log(2.0)));
    T_CHECK(fabs(lr[c0] - 6) < 1e-5 && y[c0] > 0.9999f, "sharp boundary: log r %g, y %g (want 6, ~1)", lr[c0], y[c0]);
    T_CHECK(fabs(y[10] - flat) < 1e-6 && fabs(y[28] - flat) < 1e-6, "flat regions: y %g, %g (want %g)", y[10], y[28],
            flat);
    /* candidates near the boundary see part of it: 0.2 < y < 1, rising towards it */
    T_CHECK(y[17] > (float)flat && y[18] > y[17] && y[19] > y[18] && y[c0] > y[19],
            "y does not rise towards the boundary");
    int none_ok = 1;
    for (int64_t c = 0; c < L; c++)
        if (c - w < 1 || c + 2 * w > L) none_ok &= y[c] == -1.0f;
        else none_ok &= y[c] > 0 && y[c] < 1.0f + 1e-6f;
    T_CHECK(none_ok, "unlabelled candidates (c < w + sink, c + 2w > n) must be -1, the rest in (0, 1]");
    /* a sliding window of 2: queries at >= c + w never see [c - w, c): log r = 50 */
    memset(mass, 0, sizeof mass);
    a.window = 2;
    for (int64_t i = 0; i < L; i++) k[i] = 0;
    st = dhsa_boundary_mass_add(ctx, &a, w, mass, L);
    st = st ? st : dhsa_boundary_labels(mass, L, w, 1, y, lr);
    T_CHECK(st == DHSA_OK && lr[15] == 50.0f && y[15] == 1.0f, "one-sided zero mass: log r %g y %g", lr[15], y[15]);
}

/* ------------------------------------------------ inference agreement --- */

static void test_agreement(dhsa_ctx *ctx) {
    const int64_t Hkv = 2, d = 4, C = 8, w = 3, H = 5, L = 20;
    dhsa_predictor *pr;
    T_CHECK(dhsa_predictor_create_random(C, w, H, 5, &pr) == DHSA_OK, "create_random");
    float k[2 * 20 * 4], p[20], keys[20 * 8];
    for (int i = 0; i < 2 * 20 * 4; i++) k[i] = (float)(1.5 * drand());
    for (int64_t t = 0; t < L; t++)
        for (int64_t g = 0; g < Hkv; g++)
            for (int64_t c = 0; c < d; c++) keys[t * C + g * d + c] = k[(g * L + t) * d + c];
    dhsa_tensor kt = dhsa_tensor_bhld(k, DHSA_F32, 1, Hkv, L, d);
    T_CHECK(dhsa_predictor_score(ctx, pr, &kt, 0, p) == DHSA_OK, "score: %s", dhsa_last_error());
    dhsa__pmap m = dhsa__predictor_pmap(C, w, H);
    double *theta = malloc(m.n * sizeof(double)), *ws = malloc(dhsa__predictor_pass_ws(&m) * sizeof(double));
    dhsa__predictor_get_params(pr, theta);
    double X[6 * 8], worst = 0;
    for (int64_t t = 1; t < L; t++) {
        for (int64_t i = 0; i < 2 * w; i++)
            for (int64_t c = 0; c < C; c++) {
                int64_t tok = t - w + i;
                X[i * C + c] = tok < 0 || tok >= L ? 0 : keys[tok * C + c];
            }
        double pt;
        dhsa__predictor_pass(&m, theta, X, 0.5, 2, 1.3, 0, NULL, ws, &pt);
        worst = fmax(worst, fabs(pt - p[t]));
    }
    T_CHECK(worst < 1e-5, "training forward vs dhsa_predictor_score: worst |dp| = %.3g", worst);
    free(theta), free(ws);
    dhsa_predictor_free(pr);
}

/* ------------------------------------------------------------- training --- */

/* Sequences of segments (8..24 keys) with a random direction each per head:
 * keys = direction + 0.35 noise; y = 1 at a segment's first key, 0
 * elsewhere. */
typedef struct {
    float *keys, *y;
    dhsa_train_seq *seqs;
    int n;
} synth;

static synth make_synth(int n_seqs, int64_t L, int64_t C, uint64_t seed) {
    synth s;
    rng = seed;
    s.n = n_seqs;
    s.keys = malloc((size_t)(n_seqs * L * C) * sizeof(float));
    s.y = malloc((size_t)(n_seqs * L) * sizeof(float));
    s.seqs = calloc((size_t)n_seqs, sizeof(dhsa_train_seq));
    float dir[64];
    for (int q = 0; q < n_seqs; q++) {
        int64_t next = 0;
        for (int64_t t = 0; t < L; t++) {
            int start = t == next;
            if (start) {
                for (int64_t c = 0; c < C; c++) dir[c] = (float)drand();
                next = t + 8 + (int64_t)((drand() + 1) * 8);
            }
            for (int64_t c = 0; c < C; c++) s.keys[(q * L + t) * C + c] = dir[c] + 0.35f * (float)drand();
            s.y[q * L + t] = t < 3 || t + 3 > L ? -1.0f : start ? 1.0f : 0.0f;
        }
        s.seqs[q] = (dhsa_train_seq){s.keys + q * L * C, s.y + q * L, L, L * 3 / 4};
    }
    return s;
}

static void free_synth(synth *s) { free(s->keys), free(s->y), free(s->seqs); }

static int n_points;
static void count_points(void *user, const dhsa_train_point *pt) {
    (void)user, (void)pt;
    n_points++;
}

static void test_training(dhsa_ctx *ctx, dhsa_ctx *ctx1) {
    const int64_t C = 8, w = 2, H = 16, L = 200;
    synth s = make_synth(40, L, C, 99);
    dhsa_predictor *pr, *pr1;
    dhsa_predictor_create_random(C, w, H, 3, &pr);
    dhsa_predictor_create_random(C, w, H, 3, &pr1);
    dhsa_train_params tp = dhsa_train_default_params();
    tp.lr = 3e-3, tp.steps = 3000, tp.batch = 32, tp.eval_every = 1000, tp.seed = 11;
    tp.progress = count_points;
    dhsa_train_report r, r1;
    n_points = 0;
    dhsa_status st = dhsa_predictor_train(ctx, pr, s.seqs, s.n, &tp, &r);
    T_CHECK(st == DHSA_OK, "train: %s", dhsa_last_error());
    printf("synthetic: %lld train / %lld val samples, %.3f positive; val loss %.4f -> %.4f (constant %.4f), "
           "precision %.3f recall %.3f AUC %.4f, %.2f s\n",
           (long long)r.n_train, (long long)r.n_val, r.val_pos, r.first.val_loss, r.last.val_loss, r.val_loss_const,
           r.precision, r.recall, r.auc, r.seconds);
    T_CHECK(n_points == 4, "progress points: %d (want steps 0, 1000, 2000, 3000)", n_points);
    T_CHECK(r.last.val_loss < 0.5 * r.first.val_loss && r.last.val_loss < 0.7 * r.val_loss_const,
            "validation loss %g -> %g, constant %g: training did not learn the boundaries", r.first.val_loss,
            r.last.val_loss, r.val_loss_const);
    T_CHECK(r.precision > 0.8 && r.recall > 0.8 && r.auc > 0.95, "precision %g recall %g AUC %g", r.precision, r.recall,
            r.auc);
    T_CHECK(r.tp + r.fp + r.fn + r.tn == r.n_val, "confusion counts do not add up to the validation samples");
    T_CHECK(r.val_loss_floor >= 0 && r.val_loss_floor < 1e-6, "hard labels: the loss floor is %g, want ~0",
            r.val_loss_floor);
    /* the same on one thread */
    tp.progress = NULL;
    st = dhsa_predictor_train(ctx1, pr1, s.seqs, s.n, &tp, &r1);
    float p[200], p1[200];
    dhsa_tensor kt = dhsa_tensor_blhd(s.keys, DHSA_F32, 1, L, 1, C);
    dhsa_predictor_score(ctx, pr, &kt, 0, p);
    dhsa_predictor_score(ctx, pr1, &kt, 0, p1);
    T_CHECK(st == DHSA_OK && r1.last.val_loss == r.last.val_loss && memcmp(p, p1, sizeof p) == 0,
            "1 thread and %d threads trained different predictors (val loss %.17g vs %.17g)", dhsa_ctx_n_threads(ctx),
            r1.last.val_loss, r.last.val_loss);
    /* save / load round trip: the loaded predictor scores bit for bit the same */
    char path[64];
    snprintf(path, sizeof path, "/tmp/dhsa_test_train_%d.prd", (int)getpid());
    dhsa_predictor *back = NULL;
    st = dhsa_predictor_save(pr, path);
    st = st ? st : dhsa_predictor_load(path, &back);
    T_CHECK(st == DHSA_OK, "save/load: %s", dhsa_last_error());
    if (back) {
        dhsa_predictor_score(ctx, back, &kt, 0, p1);
        T_CHECK(memcmp(p, p1, sizeof p) == 0 && dhsa_predictor_width(back) == C && dhsa_predictor_window(back) == w,
                "the loaded predictor scores differently");
    }
    unlink(path);
    dhsa_predictor_free(back);
    dhsa_predictor_free(pr);
    dhsa_predictor_free(pr1);
    free_synth(&s);
}

/* ---------------------------------------------------------- bad inputs --- */

#define REFUSED(call, want, what)                                                                          \
    do {                                                                                                     \
        dhsa_status st_ = (call);                                                                            \
        T_CHECK(st_ == (want) && dhsa_last_error()[0], "%s: got %s (%s), want %s", what, dhsa_status_str(st_), \
                dhsa_last_error(), dhsa_status_str(want));                                                   \
    } while (0)

static void test_bad(dhsa_ctx *ctx) {
    const int64_t C = 4, w = 2, L = 30;
    synth s = make_synth(2, L, C, 5);
    dhsa_predictor *pr;
    dhsa_predictor_create_random(C, w, 3, 1, &pr);
    dhsa_train_params tp = dhsa_train_default_params();
    tp.steps = 2;
    REFUSED(dhsa_predictor_train(NULL, pr, s.seqs, 2, &tp, NULL), DHSA_ERR_INVALID_ARG, "NULL ctx");
    REFUSED(dhsa_predictor_train(ctx, NULL, s.seqs, 2, &tp, NULL), DHSA_ERR_INVALID_ARG, "NULL predictor");
    REFUSED(dhsa_predictor_train(ctx, pr, s.seqs, 2, NULL, NULL), DHSA_ERR_INVALID_ARG, "NULL params");
    tp.batch = 0;
    REFUSED(dhsa_predictor_train(ctx, pr, s.seqs, 2, &tp, NULL), DHSA_ERR_INVALID_ARG, "batch 0");
    tp.batch = 8, tp.lr = 0;
    REFUSED(dhsa_predictor_train(ctx, pr, s.seqs, 2, &tp, NULL), DHSA_ERR_INVALID_ARG, "lr 0");
    tp.lr = 1e-3, tp.gamma = NAN;
    REFUSED(dhsa_predictor_train(ctx, pr, s.seqs, 2, &tp, NULL), DHSA_ERR_INVALID_ARG, "gamma NaN");
    tp.gamma = 2;
    s.keys[7] = NAN;
    REFUSED(dhsa_predictor_train(ctx, pr, s.seqs, 2, &tp, NULL), DHSA_ERR_NONFINITE, "a NaN key");
    s.keys[7] = 0;
    s.y[12] = 1.5f;
    REFUSED(dhsa_predictor_train(ctx, pr, s.seqs, 2, &tp, NULL), DHSA_ERR_INVALID_ARG, "a label of 1.5");
    s.y[12] = 0.05f;
    s.seqs[0].split = s.seqs[1].split = L; /* everything trains */
    REFUSED(dhsa_predictor_train(ctx, pr, s.seqs, 2, &tp, NULL), DHSA_ERR_INVALID_ARG, "no validation samples");
    s.seqs[0].split = s.seqs[1].split = 0;
    REFUSED(dhsa_predictor_train(ctx, pr, s.seqs, 2, &tp, NULL), DHSA_ERR_INVALID_ARG, "no training samples");
    s.seqs[0].split = s.seqs[1].split = 20;
    T_CHECK(dhsa_predictor_train(ctx, pr, s.seqs, 2, &tp, NULL) == DHSA_OK, "a valid call after the refusals: %s",
            dhsa_last_error());

    float q[2 * 10 * 3], k[2 * 10 * 3];
    memset(q, 0, sizeof q), memset(k, 0, sizeof k);
    double mass[10 * 4];
    float y[10];
    dhsa_attn_desc a = desc_of(q, k, 2, 2, 10, 3);
    REFUSED(dhsa_boundary_mass_add(ctx, &a, 0, mass, 10), DHSA_ERR_INVALID_ARG, "w = 0");
    REFUSED(dhsa_boundary_mass_add(ctx, &a, 2, mass, 9), DHSA_ERR_SHAPE, "mass shorter than the keys");
    REFUSED(dhsa_boundary_mass_add(ctx, NULL, 2, mass, 10), DHSA_ERR_INVALID_ARG, "NULL desc");
    a.k.shape[3] = 2;
    REFUSED(dhsa_boundary_mass_add(ctx, &a, 2, mass, 10), DHSA_ERR_SHAPE, "head dims differ");
    a.k.shape[3] = 3, a.q.shape[1] = 3;
    REFUSED(dhsa_boundary_mass_add(ctx, &a, 2, mass, 10), DHSA_ERR_SHAPE, "Hq not a multiple of Hkv");
    a.q.shape[1] = 2;
    uint8_t km[10] = {0};
    a.key_mask = km, a.key_mask_polarity = DHSA_MASK_TRUE_KEEPS;
    REFUSED(dhsa_boundary_mass_add(ctx, &a, 2, mass, 10), DHSA_ERR_UNSUPPORTED, "a key mask");
    REFUSED(dhsa_boundary_labels(mass, 10, 0, 1, y, NULL), DHSA_ERR_INVALID_ARG, "labels with w = 0");
    REFUSED(dhsa_boundary_labels(NULL, 10, 2, 1, y, NULL), DHSA_ERR_INVALID_ARG, "labels of NULL mass");
    for (int i = 0; i < 40; i++) mass[i] = 1;
    mass[5 * 4 + 1] = NAN;
    REFUSED(dhsa_boundary_labels(mass, 10, 2, 1, y, NULL), DHSA_ERR_NONFINITE, "a NaN mass");
    dhsa_predictor_free(pr);
    free_synth(&s);
}

/* ------------------------------------------------------------------ CLI --- */

#define MODEL "../shared/models/stories260K.gguf"

/* Runs `$DHSA_CLI args 2>&1`; exit status (-1 abnormal), output in out. */
static int cli_run(const char *args, char *out, size_t cap) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", getenv("DHSA_CLI"), args);
    FILE *p = popen(cmd, "r");
    size_t n = 0, got;
    out[0] = 0;
    if (!p) return -1;
    while (n + 1 < cap && (got = fread(out + n, 1, cap - n - 1, p)) > 0) n += got;
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    unsigned char *b = malloc(1 << 20);
    *n = b ? fread(b, 1, 1 << 20, f) : 0;
    fclose(f);
    return b;
}

static void test_cli(void) {
    const char *cli = getenv("DHSA_CLI");
    if (!cli || strchr(cli, '\'')) {
        T_SKIP(10, "DHSA_CLI unset: train-boundary CLI checks skipped (make test sets it)");
        return;
    }
    if (access(MODEL, R_OK) != 0) {
        T_SKIP(10, "%s absent: train-boundary CLI checks skipped", MODEL);
        return;
    }
    static char out[1 << 16];
    char args[1024], txt[64], p1[64], p2[64];
    int pid = (int)getpid();
    snprintf(txt, sizeof txt, "/tmp/dhsa_tt_%d.txt", pid);
    snprintf(p1, sizeof p1, "/tmp/dhsa_tt_%d_1.prd", pid);
    snprintf(p2, sizeof p2, "/tmp/dhsa_tt_%d_2.prd", pid);
    /* the model's own text: two samples of 300 tokens */
    snprintf(args, sizeof args,
             "run -m %s --temp 1 --seed 1 -n 300 --ctx 512 2>/dev/null > %s && "
             "'%s' run -m %s --temp 1 --seed 2 -n 300 --ctx 512 >> %s",
             MODEL, txt, cli, MODEL, txt);
    int rc = cli_run(args, out, sizeof out);
    T_CHECK(rc == 0, "dhsa run for the text: rc %d: %.300s", rc, out);
    snprintf(args, sizeof args, "train-boundary -m %s --text %s --ctx 256 --steps 40 --eval-every 20 --threads 2 -o %s",
             MODEL, txt, p1);
    rc = cli_run(args, out, sizeof out);
    T_CHECK(rc == 0 && strstr(out, "step     20") && strstr(out, "precision") && strstr(out, "validation ROC AUC"),
            "train-boundary: rc %d: %.2000s", rc, out);
    dhsa_predictor *pr = NULL;
    T_CHECK(dhsa_predictor_load(p1, &pr) == DHSA_OK && dhsa_predictor_width(pr) == 32 &&
                dhsa_predictor_window(pr) == 4,
            "the written predictor: %s (C %lld, w %lld; want 32, 4)", dhsa_last_error(),
            (long long)dhsa_predictor_width(pr), (long long)dhsa_predictor_window(pr));
    dhsa_predictor_free(pr);
    snprintf(args, sizeof args, "train-boundary -m %s --text %s --ctx 256 --steps 40 --eval-every 20 --threads 1 -o %s",
             MODEL, txt, p2);
    rc = cli_run(args, out, sizeof out);
    size_t n1 = 0, n2 = 0;
    unsigned char *b1 = slurp(p1, &n1), *b2 = slurp(p2, &n2);
    T_CHECK(rc == 0 && b1 && b2 && n1 == n2 && n1 > 0 && memcmp(b1, b2, n1) == 0,
            "train-boundary on 1 and 2 threads wrote different files (%zu, %zu bytes)", n1, n2);
    free(b1), free(b2);
    const struct { const char *args; int rc; } bad[] = {
        {"train-boundary -m " MODEL " --text /dev/null", 2},          /* no -o */
        {"train-boundary -m " MODEL " -o /tmp/x.prd", 2},             /* no --text */
        {"train-boundary -m " MODEL " --text /dev/null --window 0 -o /tmp/x.prd", 2},
        {"train-boundary -m " MODEL " --text /dev/null --layers 7 -o /tmp/x.prd", 2},
        {"train-boundary -m " MODEL " --text /nonexistent -o /tmp/x.prd", 1},
        {"train-boundary -m " MODEL " --text /dev/null --bogus 1 -o /tmp/x.prd", 2},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rc = cli_run(bad[i].args, out, sizeof out);
        T_CHECK(rc == bad[i].rc && strstr(out, "train-boundary"), "`dhsa %s`: rc %d (want %d): %.300s", bad[i].args, rc,
                bad[i].rc, out);
    }
    unlink(txt), unlink(p1), unlink(p2);
}

int main(void) {
    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = 2;
    dhsa_ctx *ctx, *ctx1;
    if (dhsa_ctx_create(&cp, &ctx)) return 1;
    cp.n_threads = 1;
    if (dhsa_ctx_create(&cp, &ctx1)) return 1;
    test_gradients();
    test_focal();
    test_adam();
    test_mass(ctx, ctx1);
    test_labels(ctx);
    test_agreement(ctx);
    test_training(ctx, ctx1);
    test_bad(ctx);
    test_cli();
    dhsa_ctx_free(ctx);
    dhsa_ctx_free(ctx1);
    return t_report("test_train");
}
