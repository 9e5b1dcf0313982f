/* test_exact_rows.c: a session's last rows rank chunks by their exact
 * attention (dhsa_router_params.exact_rows; src/route/carry.h,
 * dhsa__exact_mass; src/route/kv_index.c, dhsa_kv_index_route_exact;
 * docs/dhsa.md "The prompt's last rows ranked by their exact attention").
 *
 * 1. dhsa__exact_mass against a double-precision reference written here:
 *    random calls of several rows (G = 1, 3 and 8 query heads per KV
 *    head, d = 40 and 64, F32, F16 and Q8_0 keys as stored, causal with a
 *    query offset, with and without softcap and a window), random chunks
 *    and an open tail: each chunk's mass is the mean over the rows and the
 *    group's heads of the share of the row's softmax over every key it may
 *    see. Within 2e-6 + 1e-4 relative; the comparison is shown to fail on
 *    a mass moved by 1e-3.
 *    dhsa__exact_part (context parallelism, src/dist): the keys dealt
 *    to 3 "ranks" in stripes of 32 positions, each rank's largest score
 *    and sum merged, then each rank's masses summed: the same reference,
 *    same tolerance, for rows [0, Lq) (no window: the ranks run no
 *    sliding-window layer), softcap on for G = 3.
 * 2. dhsa_kv_index_route_exact: a chunk whose one key matches the query
 *    while its other keys turn away (its mean key scores below the
 *    haystack's, so the estimate ranks it low) holds most of the exact
 *    mass; the exact route reads it in every group, and the estimate's
 *    route (dhsa_kv_index_route) does not (the check can fail). share_heads
 *    is refused. dhsa__kv_index_route_mass given dhsa__exact_mass's block
 *    mean reads what the exact route reads, range for range; a row that
 *    is not a block's start is refused.
 * 3. Sessions (the shipped default model, routing active, ubatches of 32,
 *    blocks of 16; every layer's attention output recorded by the layer
 *    hook): an answering eval (the last row's logits) with exact_rows 20
 *    and with 0 give the same outputs bit for bit on the rows before the
 *    tail's query block (the split falls on a block's start) and other
 *    outputs on some tail row (the checks can fail); exact_rows 40
 *    reaches back into the previous ubatch alike; a layer attending in two
 *    calls counts as one layer call; an eval with every row's logits
 *    (logits_all) or with none (a prefill part) ranks no row exactly. A
 *    dense session and an oracle one report exact_rows 0; a DHSA one the
 *    value given.
 * 4. The parameter: dhsa_router_params_for gives 64, the primitives' 0; -1
 *    and DHSA_EXACT_ROWS_MAX + 1 are refused by dhsa_route with a sentence.
 *
 * Run: make build/tests/test_exact_rows && build/tests/test_exact_rows
 * Ends with "test_exact_rows: P passed, F failed, S skipped".
 */
#include "dhsa.h"
#include "route/carry.h"
#include "route/kv_index_internal.h"
#include "t.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static double urand(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) / 9007199254740992.0;
}
static double nrand(void) {
    double u = urand() + 1e-12, v = urand();
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

/* The reference: mass per chunk of KV head g for rows [r0, r1) (double),
 * keys kf as stored [Hkv][Lk][d], queries q [Lq][Hq][d] (BLHD). */
static void ref_mass(const float *q, const float *kf, int64_t Hq, int64_t G, int64_t Lk, int64_t d, float scale,
                     float softcap, int64_t window, int64_t q_pos0, int64_t g, int64_t r0, int64_t r1,
                     const int64_t *starts, int64_t nc, double *mass) {
    for (int64_t c = 0; c < nc; c++) mass[c] = 0;
    double *lg = malloc((size_t)Lk * sizeof(double));
    for (int64_t row = r0; row < r1; row++) {
        const int64_t pos = q_pos0 + row;
        int64_t lo = 0, hi = pos + 1 < Lk ? pos + 1 : Lk;
        if (window > 0 && pos - window + 1 > lo) lo = pos - window + 1;
        for (int64_t h = g * G; h < (g + 1) * G; h++) {
            double m = -INFINITY, z = 0;
            for (int64_t t = lo; t < hi; t++) {
                double x = 0;
                for (int64_t e = 0; e < d; e++) x += (double)q[(row * Hq + h) * d + e] * (double)kf[(g * Lk + t) * d + e];
                x *= scale;
                if (softcap > 0) x = softcap * tanh(x / softcap);
                lg[t] = x;
                m = x > m ? x : m;
            }
            for (int64_t t = lo; t < hi; t++) z += exp(lg[t] - m);
            for (int64_t t = lo, c = 0; t < hi && t < starts[nc]; t++) {
                while (starts[c + 1] <= t) c++;
                mass[c] += exp(lg[t] - m) / z / (double)(G * (r1 - r0));
            }
        }
    }
    free(lg);
}

/* 1 when got equals want within the tolerance; why: the first difference. */
static int same_mass(const double *got, const double *want, int64_t nc, char *why, size_t cap) {
    for (int64_t c = 0; c < nc; c++)
        if (!(fabs(got[c] - want[c]) <= 2e-6 + 1e-4 * fabs(want[c])))
            return snprintf(why, cap, "chunk %lld: %.9f, reference %.9f", (long long)c, got[c], want[c]), 0;
    return 1;
}

static void test_mass(void) {
    const int64_t Gs[] = {1, 3, 8}, ds[] = {40, 64};
    const dhsa_type types[] = {DHSA_F32, DHSA_F16, DHSA_Q8_0};
    int judged = 0, judged_parts = 0, failed_shown = 0;
    for (int gi = 0; gi < 3; gi++)
        for (int di = 0; di < 2; di++)
            for (int ti = 0; ti < 3; ti++)
                for (int variant = 0; variant < 2; variant++) {
                    const int64_t G = Gs[gi], d = ds[di], Hkv = 2, Hq = Hkv * G, Lk = 300, Lq = 24;
                    const int64_t q_pos0 = Lk - Lq - 5; /* the last rows see every key; 5 later keys unseen */
                    const dhsa_type kt = types[ti];
                    if (kt == DHSA_Q8_0 && d % 32) continue; /* Q8_0 rows are whole blocks of 32 */
                    float *q = malloc((size_t)(Lq * Hq * d) * sizeof(float));
                    float *kf = malloc((size_t)(Hkv * Lk * d) * sizeof(float));
                    const size_t rb = dhsa_type_row_bytes(kt, d);
                    unsigned char *kraw = malloc((size_t)(Hkv * Lk) * rb);
                    for (int64_t x = 0; x < Lq * Hq * d; x++) q[x] = (float)nrand();
                    for (int64_t x = 0; x < Hkv * Lk * d; x++) kf[x] = (float)(0.8 * nrand());
                    for (int64_t g = 0; g < Hkv; g++) /* a planted key: some chunk holds real mass */
                        for (int64_t e = 0; e < d; e++) kf[(g * Lk + 77) * d + e] = 0.6f * q[((Lq - 1) * Hq + g * G) * d + e];
                    for (int64_t row = 0; row < Hkv * Lk; row++) {
                        float *src = kf + row * d;
                        unsigned char *dst = kraw + (size_t)row * rb;
                        if (kt == DHSA_F32) memcpy(dst, src, (size_t)d * sizeof(float));
                        else if (kt == DHSA_F16)
                            for (int64_t e = 0; e < d; e++) {
                                uint16_t h = dhsa_f32_to_f16(src[e]);
                                memcpy(dst + 2 * e, &h, 2);
                                src[e] = dhsa_f16_to_f32(h);
                            }
                        else {
                            dhsa_q8_0_quantize_row(src, dst, d);
                            dhsa_q8_0_dequantize_row(dst, src, d);
                        }
                    }
                    int64_t starts[200], nc = 0;
                    starts[0] = 0;
                    while (starts[nc] + 30 < Lk - 12) {
                        starts[nc + 1] = starts[nc] + 5 + (int64_t)(urand() * 26);
                        nc++;
                    }
                    dhsa_attn_desc a = dhsa_attn_default_desc();
                    a.q = dhsa_tensor_blhd(q, DHSA_F32, 1, Lq, Hq, d);
                    a.k = dhsa_tensor_bhld(kraw, kt, 1, Hkv, Lk, d);
                    a.causal = 1;
                    a.q_pos0 = q_pos0;
                    a.scale = 1.0f / (float)sqrt((double)d);
                    a.softcap = variant ? 6.0f : 0.0f;
                    a.window = variant ? 120 : 0;
                    const int64_t spans[][2] = {{0, Lq}, {7, 8}, {16, Lq}};
                    for (int si = 0; si < 3; si++)
                        for (int64_t g = 0; g < Hkv; g++) {
                            double got[200], want[200];
                            dhsa_status st = dhsa__exact_mass(&a, g, spans[si][0], spans[si][1], starts, nc, got);
                            T_CHECK(st == DHSA_OK, "exact_mass: %s", dhsa_last_error());
                            ref_mass(q, kf, Hq, G, Lk, d, a.scale, a.softcap, a.window, q_pos0, g, spans[si][0],
                                     spans[si][1], starts, nc, want);
                            char why[256] = "";
                            T_CHECK(same_mass(got, want, nc, why, sizeof why),
                                    "G %lld d %lld %s variant %d rows [%lld, %lld) group %lld: %s", (long long)G,
                                    (long long)d, dhsa_type_name(kt), variant, (long long)spans[si][0],
                                    (long long)spans[si][1], (long long)g, why);
                            judged++;
                            if (!failed_shown) { /* the comparator can fail */
                                got[nc / 2] += 1e-3;
                                T_CHECK(!same_mass(got, want, nc, why, sizeof why), "a mass moved by 1e-3 is told apart");
                                failed_shown = 1;
                            }
                        }
                    if (!variant) { /* the ranks' parts, merged (softcap on for G = 3) */
                        const int64_t R = 3, S = 32, rows = Lq;
                        a.window = 0;
                        a.softcap = G == 3 ? 6.0f : 0.0f;
                        int64_t runs[3][16][3], nr[3] = {0, 0, 0};
                        for (int64_t p = 0; p < Lk; p += S) { /* slot = position: a.k holds every key */
                            int64_t r = (p / S) % R, *x = runs[r][nr[r]++];
                            x[0] = p;
                            x[1] = Lk - p < S ? Lk - p : S;
                            x[2] = p;
                        }
                        for (int64_t g = 0; g < Hkv; g++) {
                            double got[200] = {0}, want[200], mz[3][8][2], norm[8][2];
                            dhsa_status st = DHSA_OK;
                            for (int64_t row = 0; row < rows && !st; row++) {
                                for (int64_t r = 0; r < R && !st; r++)
                                    st = dhsa__exact_part(&a, g, row, q_pos0 + row, &runs[r][0][0], nr[r], starts, nc,
                                                          NULL, &mz[r][0][0], NULL);
                                for (int64_t h = 0; h < G; h++) {
                                    double M = -INFINITY, Z = 0;
                                    for (int64_t r = 0; r < R; r++) M = mz[r][h][0] > M ? mz[r][h][0] : M;
                                    for (int64_t r = 0; r < R; r++)
                                        if (mz[r][h][1] > 0) Z += mz[r][h][1] * exp(mz[r][h][0] - M);
                                    norm[h][0] = M;
                                    norm[h][1] = Z;
                                }
                                for (int64_t r = 0; r < R && !st; r++)
                                    st = dhsa__exact_part(&a, g, row, q_pos0 + row, &runs[r][0][0], nr[r], starts, nc,
                                                          &norm[0][0], NULL, got);
                            }
                            T_CHECK(st == DHSA_OK, "exact_part: %s", dhsa_last_error());
                            for (int64_t c = 0; c < nc; c++) got[c] /= (double)rows;
                            ref_mass(q, kf, Hq, G, Lk, d, a.scale, a.softcap, 0, q_pos0, g, 0, rows, starts, nc, want);
                            char why[256] = "";
                            T_CHECK(same_mass(got, want, nc, why, sizeof why), "parts: G %lld d %lld %s group %lld: %s",
                                    (long long)G, (long long)d, dhsa_type_name(kt), (long long)g, why);
                            judged_parts++;
                        }
                    }
                    free(q);
                    free(kf);
                    free(kraw);
                }
    T_CHECK(judged == (3 * 2 * 3 - 3) * 2 * 3 * 2, "masses judged: %d", judged);
    T_CHECK(judged_parts == (3 * 2 * 3 - 3) * 2, "merged parts judged: %d", judged_parts);
}

/* FIXED chunks of `seg` keys; chunk `hid` holds one key along the query
 * and seg - 1 keys against it. */
static void test_route(void) {
    dhsa_ctx *ctx = NULL;
    T_CHECK(dhsa_ctx_create(NULL, &ctx) == DHSA_OK, "ctx");
    if (!ctx) return;
    const int64_t Hkv = 2, G = 2, Hq = 4, d = 32, L = 2048, seg = 16, hid = 40, Lq = 16;
    dhsa_router_params rp = dhsa_router_params_for(L, 0.0625);
    rp.boundary = DHSA_BOUNDARY_FIXED;
    rp.chunk = seg;
    dhsa_kv_index *ix = NULL;
    T_CHECK(dhsa_kv_index_create(ctx, &rp, Hkv, d, L + 1, &ix) == DHSA_OK, "index: %s", dhsa_last_error());
    float *k = malloc((size_t)(Hkv * L * d) * sizeof(float)), *q = malloc((size_t)(Lq * Hq * d) * sizeof(float));
    float u[32];
    double nu = 0;
    for (int64_t e = 0; e < d; e++) {
        u[e] = (float)nrand();
        nu += (double)u[e] * (double)u[e];
    }
    for (int64_t e = 0; e < d; e++) u[e] = (float)(u[e] / sqrt(nu)); /* unit */
    for (int64_t g = 0; g < Hkv; g++)
        for (int64_t t = 0; t < L; t++)
            for (int64_t e = 0; e < d; e++) {
                float x = 0.3f * (float)nrand();
                if (t / seg == hid) x = (t % seg == 0 ? 6.0f : -3.0f) * u[e];
                k[(g * L + t) * d + e] = x;
            }
    /* |q| = sqrt(d) along u: s q . k = 6 on the matching key, -3 on the others */
    for (int64_t r = 0; r < Lq; r++)
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t e = 0; e < d; e++) q[(r * Hq + h) * d + e] = u[e] * (float)d;
    dhsa_tensor kt = dhsa_tensor_bhld(k, DHSA_F32, 1, Hkv, L, d);
    T_CHECK(dhsa_kv_index_append(ix, &kt) == DHSA_OK, "append: %s", dhsa_last_error());
    dhsa_attn_desc a = dhsa_attn_default_desc();
    a.q = dhsa_tensor_blhd(q, DHSA_F32, 1, Lq, Hq, d);
    a.k = kt;
    a.v = kt;
    a.causal = 1;
    a.q_pos0 = L - Lq;
    a.scale = 1.0f / (float)sqrt((double)d);
    dhsa_layout *plain = NULL, *ex = NULL;
    T_CHECK(dhsa_kv_index_route(ctx, ix, &a, &plain) == DHSA_OK, "route: %s", dhsa_last_error());
    T_CHECK(dhsa_kv_index_route_exact(ctx, ix, &a, &ex) == DHSA_OK, "route exact: %s", dhsa_last_error());
    if (plain && ex) {
        for (int64_t g = 0; g < Hkv; g++) {
            const int64_t *r0, *r1;
            int64_t n0, n1;
            dhsa_layout_get(plain, 0, g, 0, &r0, &n0);
            dhsa_layout_get(ex, 0, g, 0, &r1, &n1);
            int has0 = 0, has1 = 0;
            for (int64_t i = 0; i < n0; i++) has0 |= r0[2 * i] <= hid * seg && r0[2 * i + 1] >= (hid + 1) * seg;
            for (int64_t i = 0; i < n1; i++) has1 |= r1[2 * i] <= hid * seg && r1[2 * i + 1] >= (hid + 1) * seg;
            T_CHECK(!has0, "group %lld: the estimate does not read the hidden chunk (the test can fail)", (long long)g);
            T_CHECK(has1, "group %lld: the exact ranking reads it", (long long)g);
            int64_t k0 = 0, k1 = 0;
            for (int64_t i = 0; i < n0; i++) k0 += r0[2 * i + 1] - r0[2 * i];
            for (int64_t i = 0; i < n1; i++) k1 += r1[2 * i + 1] - r1[2 * i];
            T_CHECK(k1 <= k0 + seg / 2 + 1, "group %lld: the same budget (%lld keys against %lld)", (long long)g,
                    (long long)k1, (long long)k0);
        }
    }
    /* a caller's masses (context parallelism's merged parts): the block mean
     * of dhsa__exact_mass routes as the exact route */
    {
        const int64_t *starts;
        const int64_t nc = dhsa_kv_index_chunks(ix, &starts);
        double *mass = calloc((size_t)(Hkv * (nc + 1)), sizeof(double));
        dhsa_layout *em = NULL;
        T_CHECK(rp.q_block >= Lq, "one query block (q_block %lld)", (long long)rp.q_block);
        for (int64_t g = 0; mass && g < Hkv; g++)
            T_CHECK(dhsa__exact_mass(&a, g, 0, Lq, starts, nc, mass + g * (nc + 1)) == DHSA_OK, "mass");
        T_CHECK(mass && dhsa__kv_index_route_mass(ctx, ix, &a, NULL, 0, mass, 1, NULL, &em) == DHSA_OK,
                "route_mass: %s", dhsa_last_error());
        int same = em && ex;
        for (int64_t g = 0; same && g < Hkv; g++) {
            const int64_t *r0, *r1;
            int64_t n0, n1;
            dhsa_layout_get(ex, 0, g, 0, &r0, &n0);
            dhsa_layout_get(em, 0, g, 0, &r1, &n1);
            same = n0 == n1 && memcmp(r0, r1, (size_t)(2 * n0) * sizeof(int64_t)) == 0;
        }
        T_CHECK(same, "route_mass with the exact masses reads the exact route's ranges");
        dhsa_layout_free(em);
        em = NULL;
        T_CHECK(mass && dhsa__kv_index_route_mass(ctx, ix, &a, NULL, 3, mass, 1, NULL, &em) == DHSA_ERR_INVALID_ARG &&
                    !em,
                "route_mass from row 3 (not a block's start) refused");
        free(mass);
    }
    dhsa_layout_free(plain);
    dhsa_layout_free(ex);
    dhsa_kv_index_free(ix);
    rp.share_heads = 1;
    rp.score_mode = DHSA_SCORE_POOLED;
    ix = NULL;
    T_CHECK(dhsa_kv_index_create(ctx, &rp, Hkv, d, L + 1, &ix) == DHSA_OK, "index: %s", dhsa_last_error());
    T_CHECK(dhsa_kv_index_append(ix, &kt) == DHSA_OK, "append: %s", dhsa_last_error());
    ex = NULL;
    T_CHECK(dhsa_kv_index_route_exact(ctx, ix, &a, &ex) == DHSA_ERR_UNSUPPORTED && !ex, "share_heads refused");
    dhsa_kv_index_free(ix);
    free(k);
    free(q);
    (void)G;
    dhsa_ctx_free(ctx);
}

#define MODEL "models/dhsa-retrieval-8m.gguf"
#define N_P 200

static dhsa_session_params sparams(int64_t exact_rows) {
    dhsa_session_params sp = dhsa_session_default_params();
    sp.n_ctx = 256;
    sp.n_ubatch = 32;
    sp.kv_type = DHSA_F32;
    sp.attn = DHSA_ATTN_DHSA;
    sp.router.dense_below = 0;
    sp.router.budget_tokens = 48;
    sp.router.sink_tokens = 4;
    sp.router.local_tokens = 16;
    sp.router.q_block = 16;
    sp.router.min_chunk = 8;
    sp.router.nms_window = 4;
    sp.router.exact_rows = exact_rows;
    return sp;
}

/* The layer hook's record: every layer's attention output per position. */
typedef struct {
    int64_t n_layer, width; /* width = n_head x hd_v */
    float *o;               /* [n_layer][N_P][width] */
} outs;

static int hook(void *user, int64_t layer, const dhsa_attn_desc *a) {
    outs *h = user;
    const int64_t n = a->q.shape[2];
    for (int64_t i = 0; i < n; i++) {
        const int64_t pos = a->q_pos0 + i;
        if (pos < N_P) memcpy(h->o + (layer * N_P + pos) * h->width, (const float *)a->o.data + i * h->width,
                              (size_t)h->width * sizeof(float));
    }
    return 0;
}

/* The first position whose output differs in some layer, or N_P. */
static int64_t first_diff(const outs *x, const outs *y) {
    for (int64_t r = 0; r < N_P; r++)
        for (int64_t l = 0; l < x->n_layer; l++)
            if (memcmp(x->o + (l * N_P + r) * x->width, y->o + (l * N_P + r) * x->width, (size_t)x->width * sizeof(float)))
                return r;
    return N_P;
}

/* One prompt eval of ids under exact_rows; mode 0: the last row's logits
 * (an answering eval), 1: logits_all, 2: no logits (a prefill part). */
static dhsa_status run(dhsa_ctx *ctx, const dhsa_model *m, const int32_t *ids, int64_t rows, int mode, outs *h,
                       float *logits, dhsa_attn_stats *last, int64_t *reported) {
    dhsa_session *s = NULL;
    dhsa_session_params p = sparams(rows);
    p.logits_all = mode == 1;
    p.layer_hook = hook;
    p.layer_hook_user = h;
    dhsa_status st = dhsa_session_create(ctx, m, &p, &s);
    if (!st) st = dhsa_session_eval(s, ids, N_P, mode == 2 ? NULL : logits);
    dhsa_router_params got;
    if (!st) st = dhsa_session_get_router(s, &got);
    if (!st) *reported = got.exact_rows;
    if (!st) st = dhsa_session_get_stats(s, last, NULL);
    dhsa_session_free(s);
    return st;
}

/* The shipped default model and a context, or 0 (skipped with `skips`
 * checks, or failed) when it cannot be loaded. */
static int open_model(int skips, dhsa_ctx **ctx, dhsa_model **m) {
    FILE *f = fopen(MODEL, "rb");
    if (!f) {
        T_SKIP(skips, MODEL " absent (run from the repository root)");
        return 0;
    }
    fclose(f);
    *ctx = NULL;
    *m = NULL;
    dhsa_ctx_create(NULL, ctx);
    if (dhsa_model_load(MODEL, NULL, m) != DHSA_OK) {
        T_CHECK(0, "load %s: %s", MODEL, dhsa_last_error());
        dhsa_ctx_free(*ctx);
        return 0;
    }
    return 1;
}

static void test_session(void) {
    dhsa_ctx *ctx;
    dhsa_model *m;
    if (!open_model(9, &ctx, &m)) return;
    const dhsa_model_info *in = dhsa_model_get_info(m);
    const int64_t V = in->n_vocab;
    int32_t ids[N_P];
    for (int i = 0; i < N_P; i++) ids[i] = (int32_t)(1 + (int64_t)(urand() * (double)(V - 1)));
    outs h[6];
    float *lg[6];
    for (int i = 0; i < 6; i++) {
        h[i].n_layer = in->n_layer;
        h[i].width = in->n_head * in->head_dim_v;
        h[i].o = calloc((size_t)(in->n_layer * N_P * h[i].width), sizeof(float));
        lg[i] = malloc((size_t)(N_P * V) * sizeof(float));
    }
    /* 0: off, 1: 20 rows, 2: 40 rows (answering evals); 3 / 4: logits_all
     * off / 64; 5: no logits, 64 */
    const int64_t rows[6] = {0, 20, 40, 0, 64, 64};
    const int mode[6] = {0, 0, 0, 1, 1, 2};
    dhsa_attn_stats last[6];
    int64_t rep[6] = {0};
    dhsa_status st = DHSA_OK;
    for (int i = 0; i < 6 && !st; i++) st = run(ctx, m, ids, rows[i], mode[i], &h[i], lg[i], &last[i], &rep[i]);
    T_CHECK(st == DHSA_OK, "sessions: %s", dhsa_last_error());
    if (!st) {
        /* 200 = 6 x 32 + 8; exact_rows 20: rows 180.., split at the block
         * start 176 of the ubatch at 160; 40: rows 160.., all of it */
        int64_t d20 = first_diff(&h[0], &h[1]), d40 = first_diff(&h[0], &h[2]);
        T_CHECK(d20 >= 176 && d20 < N_P, "exact_rows 20: every layer's output before row 176 as without, a later "
                                         "one not (first difference at %lld)", (long long)d20);
        T_CHECK(d40 >= 160 && d40 < N_P, "exact_rows 40: before row 160 as without, a later one not (first "
                                         "difference at %lld)", (long long)d40);
        T_CHECK(rep[1] == 20 && rep[2] == 40, "a DHSA session reports exact_rows as given (%lld, %lld)",
                (long long)rep[1], (long long)rep[2]);
        T_CHECK(last[1].layer_calls == 7 * in->n_layer && last[2].layer_calls == 7 * in->n_layer,
                "a layer attending in two calls counts once: %lld and %lld layer calls (want 7 ubatches x %lld)",
                (long long)last[1].layer_calls, (long long)last[2].layer_calls, (long long)in->n_layer);
        T_CHECK(first_diff(&h[3], &h[4]) == N_P && memcmp(lg[3], lg[4], (size_t)(N_P * V) * sizeof(float)) == 0,
                "an eval with every row's logits (logits_all) ranks no row exactly");
        T_CHECK(first_diff(&h[0], &h[5]) == N_P, "an eval without logits (a prefill part) ranks no row exactly");
    }
    for (int i = 0; i < 6; i++) {
        free(h[i].o);
        free(lg[i]);
    }
    const dhsa_attn_method other[] = {DHSA_ATTN_DENSE, DHSA_ATTN_ORACLE};
    for (int i = 0; i < 2; i++) {
        dhsa_session *s = NULL;
        dhsa_session_params p = sparams(64);
        p.attn = other[i];
        dhsa_router_params got;
        T_CHECK(dhsa_session_create(ctx, m, &p, &s) == DHSA_OK && dhsa_session_get_router(s, &got) == DHSA_OK &&
                    got.exact_rows == 0,
                "a %s session reports exact_rows 0 (it routes without the index)", dhsa_attn_method_name(other[i]));
        dhsa_session_free(s);
    }
    dhsa_model_free(m);
    dhsa_ctx_free(ctx);
}

/* The first decode step after an answering eval: the hook routes each
 * one-row call itself on an index built from the call's keys with the
 * session's parameters (exactly, and by the estimate) and records which
 * of the two the session's layout equals, layer by layer. */
typedef struct {
    dhsa_ctx *ctx;
    dhsa_router_params rp;
    int64_t n_layer;
    int *as_exact, *as_estimate; /* [n_layer]: the session's layout is the exact route's / the estimate's */
    int armed, failed;
} step_rec;

static int same_layout(const dhsa_layout *x, const dhsa_layout *y, int64_t Hkv) {
    for (int64_t g = 0; g < Hkv; g++) {
        const int64_t *r1, *r2;
        int64_t n1, n2;
        if (dhsa_layout_get(x, 0, g, 0, &r1, &n1) || dhsa_layout_get(y, 0, g, 0, &r2, &n2)) return 0;
        if (n1 != n2 || memcmp(r1, r2, (size_t)(2 * n1) * sizeof(int64_t))) return 0;
    }
    return 1;
}

static int step_hook(void *user, int64_t layer, const dhsa_attn_desc *a) {
    step_rec *r = user;
    if (!r->armed || a->q.shape[2] != 1 || !a->layout) return 0;
    const int64_t Hkv = a->k.shape[1], d = a->k.shape[3], Lk = a->k.shape[2];
    dhsa_kv_index *ix = NULL;
    dhsa_layout *ex = NULL, *es = NULL;
    if (dhsa_kv_index_create(r->ctx, &r->rp, Hkv, d, Lk, &ix) || dhsa_kv_index_append(ix, &a->k) ||
        dhsa_kv_index_route_exact(r->ctx, ix, a, &ex) || dhsa_kv_index_route(r->ctx, ix, a, &es))
        r->failed = 1;
    else {
        r->as_exact[layer] = same_layout(a->layout, ex, Hkv);
        r->as_estimate[layer] = same_layout(a->layout, es, Hkv);
    }
    dhsa_layout_free(ex);
    dhsa_layout_free(es);
    dhsa_kv_index_free(ix);
    return 0;
}

/* How the first one-token eval after a prompt eval routed, per layer:
 * prompt mode 0: an answering eval (the last row's logits), 2: no logits
 * (a prefill part); batch: the step through dhsa_session_eval_batch. */
static dhsa_status first_step(dhsa_ctx *ctx, const dhsa_model *m, const int32_t *ids, int64_t rows, int mode,
                              int batch, step_rec *r, float *logits) {
    dhsa_session *s = NULL;
    dhsa_session_params p = sparams(rows);
    p.layer_hook = step_hook;
    p.layer_hook_user = r;
    r->ctx = ctx;
    dhsa_status st = dhsa_session_create(ctx, m, &p, &s);
    if (!st) st = dhsa_session_eval(s, ids, N_P - 1, mode == 2 ? NULL : logits);
    if (!st) st = dhsa_session_get_router(s, &r->rp);
    if (!st) {
        r->armed = 1; /* the step only */
        st = batch ? dhsa_session_eval_batch(&s, 1, ids + N_P - 1, logits)
                   : dhsa_session_eval(s, ids + N_P - 1, 1, logits);
    }
    dhsa_session_free(s);
    return st;
}

static void test_first_step(void) {
    dhsa_ctx *ctx;
    dhsa_model *m;
    if (!open_model(9, &ctx, &m)) return;
    const dhsa_model_info *in = dhsa_model_get_info(m);
    int32_t ids[N_P];
    for (int i = 0; i < N_P; i++) ids[i] = (int32_t)(1 + (int64_t)(urand() * (double)(in->n_vocab - 1)));
    float *lg = malloc((size_t)in->n_vocab * sizeof(float));
    /* answering eval + one step, alone and batched; exact_rows 0; a prefill part */
    const int64_t rows[4] = {20, 20, 0, 20};
    const int mode[4] = {0, 0, 0, 2}, batch[4] = {0, 1, 0, 0};
    int ex[4] = {0}, es[4] = {0}, differ = 0;
    for (int i = 0; i < 4; i++) {
        step_rec r = {0};
        r.n_layer = in->n_layer;
        r.as_exact = calloc((size_t)in->n_layer, sizeof(int));
        r.as_estimate = calloc((size_t)in->n_layer, sizeof(int));
        dhsa_status st = first_step(ctx, m, ids, rows[i], mode[i], batch[i], &r, lg);
        T_CHECK(st == DHSA_OK && !r.failed, "case %d: %s", i, dhsa_last_error());
        for (int64_t l = 0; l < in->n_layer; l++) {
            ex[i] += r.as_exact[l];
            es[i] += r.as_estimate[l];
            if (i == 0) differ += !(r.as_exact[l] && r.as_estimate[l]);
        }
        free(r.as_exact);
        free(r.as_estimate);
    }
    const int L = (int)in->n_layer;
    T_CHECK(ex[0] == L, "the first decode step after an answering eval ranks its chunks exactly in every layer "
                        "(%d of %d)", ex[0], L);
    T_CHECK(ex[1] == L, "the same step through dhsa_session_eval_batch (%d of %d)", ex[1], L);
    T_CHECK(differ > 0, "in some layer the exact ranking and the estimate route the step differently (so the "
                        "checks can fail)");
    T_CHECK(es[2] == L, "with exact_rows 0 the step routes by the estimate (%d of %d layers)", es[2], L);
    T_CHECK(es[3] == L, "after an eval without logits (a prefill part) it routes by the estimate (%d of %d)", es[3],
            L);
    free(lg);
    dhsa_model_free(m);
    dhsa_ctx_free(ctx);
}

static void test_param(void) {
    T_CHECK(dhsa_router_params_for(4096, 0.0625).exact_rows == 64, "dhsa_router_params_for: exact_rows 64");
    T_CHECK(dhsa_router_default_params().exact_rows == 0, "dhsa_router_default_params: exact_rows 0");
    dhsa_ctx *ctx = NULL;
    dhsa_ctx_create(NULL, &ctx);
    float q[4 * 8] = {0}, k[4 * 8] = {0};
    dhsa_attn_desc a = dhsa_attn_default_desc();
    a.q = dhsa_tensor_bhld(q, DHSA_F32, 1, 1, 4, 8);
    a.k = a.v = dhsa_tensor_bhld(k, DHSA_F32, 1, 1, 4, 8);
    const int64_t bad[] = {-1, DHSA_EXACT_ROWS_MAX + 1};
    for (int i = 0; i < 2; i++) {
        dhsa_router_params rp = dhsa_router_params_for(4, 0.5);
        rp.exact_rows = bad[i];
        dhsa_layout *lay = NULL;
        dhsa_status st = dhsa_route(ctx, &rp, &a, &lay);
        T_CHECK(st == DHSA_ERR_INVALID_ARG && strstr(dhsa_last_error(), "exact_rows"), "exact_rows %lld refused: %s",
                (long long)bad[i], dhsa_last_error());
        dhsa_layout_free(lay);
    }
    dhsa_ctx_free(ctx);
}

int main(void) {
    test_param();
    test_mass();
    test_route();
    test_session();
    test_first_step();
    return t_report("test_exact_rows");
}
