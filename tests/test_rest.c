/* test_rest.c: the keys a routed call leaves out, attended as one summary
 * per chunk (dhsa_router_params.rest; src/route/rest.h; docs/dhsa.md "The
 * rest of the keys, summarised").
 *
 * 1. dhsa__rest_sync + dhsa__rest_attend against a double-precision
 *    reference written here: random causal calls (G = 1 and 3 query heads
 *    per KV head, d = 40 and 64, F32 and F16 caches, all rows of a prompt
 *    and the last rows at a query offset), random chunks and an open
 *    tail, layouts of random ranges per (KV head, block). The reference
 *    is one softmax per row over the kept keys the row may see and, for
 *    every chunk ending at or before the block's first row that shares no
 *    key with the block's ranges, one key of score scale * q . mean key +
 *    log(keys) and value the mean value (rounded to F16 where the
 *    summaries are stored so). Within 1e-5 + 1e-4 relative; the sparse
 *    output without the
 *    summaries is shown to differ (the check can fail). Bounds changed
 *    after a truncation: dhsa__rest_forget and a new sync match the
 *    reference of the new keys; without the forget the stale summaries
 *    do not (the check can fail).
 * 2. Sessions (the shipped default model, F32 cache; Z differs from Y in
 *    its first token only, so that it closes chunks of Y's bounds over
 *    other keys):
 *    rest 1 and rest 0 give other logits (the summaries are attended); a
 *    budget that holds every key gives the same logits bit for bit (no
 *    chunk left out); prompt X, truncate to 100, Y gives the same logits
 *    bit for bit as X, truncate, Z, truncate, Y (the summaries of Z's
 *    chunks are forgotten). A dense session and an oracle one report rest
 *    0, a DHSA one 1. A prompt's eval attends summaries, a decode step
 *    (one token) none (dhsa_attn_stats.summaries).
 * 3. The parameter: dhsa_router_params_for gives 1, the primitives' 0; 2
 *    and -1 are refused by dhsa_route with a sentence.
 *
 * Run: make build/tests/test_rest && build/tests/test_rest
 * Ends with "test_rest: P passed, F failed, S skipped".
 */
#include "dhsa.h"
#include "llm_ref.h"
#include "route/rest.h"
#include "t.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;
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

/* A cache of Hkv heads x Lk rows x d in type t (bhld), and its values as
 * stored, widened (kf). */
static void *make_cache(dhsa_type t, int64_t Hkv, int64_t Lk, int64_t d, float *kf, double sd) {
    const size_t rb = dhsa_type_row_bytes(t, d);
    unsigned char *raw = malloc((size_t)(Hkv * Lk) * rb);
    for (int64_t row = 0; row < Hkv * Lk; row++) {
        float *src = kf + row * d;
        for (int64_t e = 0; e < d; e++) src[e] = (float)(sd * nrand());
        unsigned char *dst = raw + (size_t)row * rb;
        if (t == DHSA_F32) memcpy(dst, src, (size_t)d * sizeof(float));
        else
            for (int64_t e = 0; e < d; e++) {
                uint16_t h = dhsa_f32_to_f16(src[e]);
                memcpy(dst + 2 * e, &h, 2);
                src[e] = dhsa_f16_to_f32(h);
            }
    }
    return raw;
}

typedef struct {
    int64_t Hq, Hkv, G, d, Lk, Lq, q_pos0, qb, nc;
    const float *q, *kf, *vf; /* q [Lq][Hq][d]; kf, vf [Hkv][Lk][d] */
    const int64_t *starts;
    const dhsa_layout *lay;
    float scale;
    int f16; /* the summaries are stored in F16: the reference rounds its means alike */
} ref_call;

/* o [Lq][Hq][d] of the reference (double, rounded at the end); with_rest 0:
 * the kept keys alone. */
static void ref_attend(const ref_call *c, int with_rest, double *o) {
    const int64_t d = c->d;
    double *s = malloc((size_t)(c->Lk + c->nc) * sizeof(double));
    double *val = malloc((size_t)c->nc * (size_t)(2 * d) * sizeof(double));
    char *kept = malloc((size_t)c->Lk);
    for (int64_t i = 0; i < c->Lq; i++) {
        const int64_t p = c->q_pos0 + i, b = i / c->qb, first = c->q_pos0 + b * c->qb;
        for (int64_t h = 0; h < c->Hq; h++) {
            const int64_t g = h / c->G;
            const int64_t *rg;
            int64_t nr;
            dhsa_layout_get(c->lay, 0, g, b, &rg, &nr);
            memset(kept, 0, (size_t)c->Lk);
            for (int64_t r = 0; r < nr; r++)
                for (int64_t j = rg[2 * r]; j < rg[2 * r + 1]; j++) kept[j] = 1;
            const float *q = c->q + (i * c->Hq + h) * d;
            double m = -INFINITY;
            int64_t n = 0;
            for (int64_t j = 0; j <= p && j < c->Lk; j++) {
                if (!kept[j]) continue;
                double x = 0;
                for (int64_t e = 0; e < d; e++) x += (double)q[e] * c->kf[(g * c->Lk + j) * d + e];
                s[j] = x * c->scale;
                m = s[j] > m ? s[j] : m;
                n++;
            }
            int64_t ns = 0;
            for (int64_t ch = 0; with_rest && ch < c->nc && c->starts[ch + 1] <= first; ch++) {
                int touched = 0;
                for (int64_t j = c->starts[ch]; j < c->starts[ch + 1]; j++) touched |= kept[j];
                if (touched) continue;
                const int64_t len = c->starts[ch + 1] - c->starts[ch];
                double *mk = val + ns * 2 * d, *mv = mk + d, x = 0;
                for (int64_t e = 0; e < d; e++) {
                    mk[e] = mv[e] = 0;
                    for (int64_t j = c->starts[ch]; j < c->starts[ch + 1]; j++) {
                        mk[e] += c->kf[(g * c->Lk + j) * d + e];
                        mv[e] += c->vf[(g * c->Lk + j) * d + e];
                    }
                    mk[e] /= (double)len;
                    mv[e] /= (double)len;
                    if (c->f16) {
                        mk[e] = dhsa_f16_to_f32(dhsa_f32_to_f16((float)mk[e]));
                        mv[e] = dhsa_f16_to_f32(dhsa_f32_to_f16((float)mv[e]));
                    }
                    x += (double)q[e] * mk[e];
                }
                s[c->Lk + ns] = x * c->scale + log((double)len);
                m = s[c->Lk + ns] > m ? s[c->Lk + ns] : m;
                ns++;
            }
            double z = 0, *out = o + (i * c->Hq + h) * d;
            for (int64_t e = 0; e < d; e++) out[e] = 0;
            for (int64_t j = 0; n && j <= p && j < c->Lk; j++) {
                if (!kept[j]) continue;
                const double w = exp(s[j] - m);
                z += w;
                for (int64_t e = 0; e < d; e++) out[e] += w * c->vf[(g * c->Lk + j) * d + e];
            }
            for (int64_t t = 0; t < ns; t++) {
                const double w = exp(s[c->Lk + t] - m);
                z += w;
                for (int64_t e = 0; e < d; e++) out[e] += w * val[t * 2 * d + d + e];
            }
            for (int64_t e = 0; z > 0 && e < d; e++) out[e] /= z;
        }
    }
    free(s);
    free(val);
    free(kept);
}

/* The worst |got - want| / (atol + rtol |want|) over the call's outputs. */
static double worst(const float *got, const double *want, int64_t n, double atol, double rtol) {
    double w = 0;
    for (int64_t x = 0; x < n; x++) {
        const double e = fabs((double)got[x] - want[x]) / (atol + rtol * fabs(want[x]));
        w = e > w ? e : w;
    }
    return w;
}

/* Random chunks from 0 with an open tail of 1-10 keys before Lk. */
static int64_t make_chunks(int64_t Lk, int64_t *starts) {
    int64_t nc = 0;
    starts[0] = 0;
    while (starts[nc] + 13 < Lk - 10) {
        starts[nc + 1] = starts[nc] + 3 + (int64_t)(urand() * 10);
        nc++;
    }
    return nc;
}

/* Per (KV head, block): two sinks, the block's own rows and the 8 before,
 * and a few random ranges before the block. */
static void make_layout(dhsa_layout *lay, int64_t Hkv, int64_t Lq, int64_t q_pos0, int64_t qb) {
    for (int64_t g = 0; g < Hkv; g++)
        for (int64_t b = 0; b * qb < Lq; b++) {
            const int64_t first = q_pos0 + b * qb, last = q_pos0 + (b + 1) * qb < q_pos0 + Lq ? q_pos0 + (b + 1) * qb : q_pos0 + Lq;
            int64_t r[2 * 8], n = 0;
            r[2 * n] = 0, r[2 * n + 1] = 2, n++;
            r[2 * n] = first > 8 ? first - 8 : 0, r[2 * n + 1] = last, n++;
            for (int k = 0; k < 3 && first > 20; k++) {
                const int64_t a = 2 + (int64_t)(urand() * (double)(first - 20));
                r[2 * n] = a, r[2 * n + 1] = a + 1 + (int64_t)(urand() * 9), n++;
            }
            dhsa_layout_set(lay, 0, g, b, r, n);
        }
}

static void test_attend(void) {
    dhsa_ctx *ctx = NULL;
    dhsa_ctx_create(NULL, &ctx);
    const int64_t Gs[] = {1, 3}, ds[] = {40, 64};
    const dhsa_type types[] = {DHSA_F32, DHSA_F16};
    int judged = 0, shown = 0;
    for (int gi = 0; gi < 2; gi++)
        for (int di = 0; di < 2; di++)
            for (int ti = 0; ti < 2; ti++)
                for (int off = 0; off < 2; off++) {
                    const int64_t G = Gs[gi], d = ds[di], Hkv = 2, Hq = Hkv * G, Lk = 260, qb = 8;
                    const int64_t Lq = off ? 21 : Lk, q_pos0 = Lk - Lq;
                    const dhsa_type t = types[ti];
                    float *q = malloc((size_t)(Lq * Hq * d) * sizeof(float));
                    float *kf = malloc((size_t)(Hkv * Lk * d) * sizeof(float));
                    float *vf = malloc((size_t)(Hkv * Lk * d) * sizeof(float));
                    for (int64_t x = 0; x < Lq * Hq * d; x++) q[x] = (float)nrand();
                    void *kraw = make_cache(t, Hkv, Lk, d, kf, 0.4), *vraw = make_cache(t, Hkv, Lk, d, vf, 1.0);
                    int64_t starts[128];
                    const int64_t nc = make_chunks(Lk, starts);
                    float *o = malloc((size_t)(Lq * Hq * d) * sizeof(float)), *lse = malloc((size_t)(Lq * Hq) * sizeof(float));
                    float *o2 = malloc((size_t)(Lq * Hq * (d + 2)) * sizeof(float));
                    double *want = malloc((size_t)(Lq * Hq * d) * sizeof(double));
                    dhsa_layout *lay = NULL;
                    dhsa__rest *r = NULL;
                    dhsa_status st = dhsa_layout_create(ctx, 1, Hkv, Lq, Lk, qb, 8, &lay);
                    if (!st) st = dhsa__rest_create(ctx, Hkv, d, d, dhsa__rest_max_chunks(&(dhsa_router_params){.boundary = DHSA_BOUNDARY_SIMILARITY, .min_chunk = 3}, Lk), t == DHSA_F32, &r);
                    T_CHECK(st == DHSA_OK, "create: %s", dhsa_last_error());
                    if (st) goto next;
                    make_layout(lay, Hkv, Lq, q_pos0, qb);
                    dhsa_attn_desc a = dhsa_attn_default_desc();
                    a.q = dhsa_tensor_blhd(q, DHSA_F32, 1, Lq, Hq, d);
                    a.k = dhsa_tensor_bhld(kraw, t, 1, Hkv, Lk, d);
                    a.v = dhsa_tensor_bhld(vraw, t, 1, Hkv, Lk, d);
                    a.o = dhsa_tensor_blhd(o, DHSA_F32, 1, Lq, Hq, d);
                    a.lse = dhsa_tensor_blhd(lse, DHSA_F32, 1, Lq, Hq, 1);
                    a.causal = 1;
                    a.q_pos0 = q_pos0;
                    a.scale = 1.0f / (float)sqrt((double)d);
                    a.layout = lay;
                    const ref_call rc = {Hq, Hkv, G, d, Lk, Lq, q_pos0, qb, nc, q, kf, vf, starts, lay, a.scale, t == DHSA_F16};
                    const double rtol = 1e-4;
                    st = dhsa__rest_sync(r, starts, nc, &a.k, &a.v);
                    if (!st) st = dhsa_attention(ctx, &a);
                    if (!st && !shown) { /* the sparse output alone is not the reference: the check can fail */
                        ref_attend(&rc, 1, want);
                        T_CHECK(worst(o, want, Lq * Hq * d, 1e-5, rtol) > 1, "the kept keys alone differ from the "
                                "reference with the summaries");
                        shown = 1;
                    }
                    double summaries = -1, want_summaries = 0;
                    if (!st) st = dhsa__rest_attend(ctx, r, &a, lay, o2, o2 + Lq * Hq * d, &summaries);
                    T_CHECK(st == DHSA_OK && dhsa__rest_chunks(r) == nc, "sync and attend: %s", dhsa_last_error());
                    for (int64_t g = 0; g < Hkv; g++) /* the chunks each row's summaries stood for, counted here */
                        for (int64_t i = 0; i < Lq; i++) {
                            const int64_t b = i / qb, first = q_pos0 + b * qb;
                            const int64_t *rg;
                            int64_t nr;
                            dhsa_layout_get(lay, 0, g, b, &rg, &nr);
                            for (int64_t ch = 0; ch < nc && starts[ch + 1] <= first; ch++) {
                                int touched = 0;
                                for (int64_t x = 0; x < nr; x++) touched |= rg[2 * x] < starts[ch + 1] && rg[2 * x + 1] > starts[ch];
                                want_summaries += !touched;
                            }
                        }
                    T_CHECK(summaries == want_summaries && summaries > 0, "summaries attended: %.0f, want %.0f", summaries,
                            want_summaries);
                    if (st) goto next;
                    ref_attend(&rc, 1, want);
                    double w = worst(o, want, Lq * Hq * d, 1e-5, rtol);
                    T_CHECK(w <= 1, "G %lld d %lld %s rows %lld from %lld: worst error %.3g of the tolerance",
                            (long long)G, (long long)d, dhsa_type_name(t), (long long)Lq, (long long)q_pos0, w);
                    judged++;
                    /* a truncation at key 150 and other keys from there, closed into chunks of the same bounds */
                    for (int64_t row = 0; row < Hkv * Lk; row++) {
                        if (row % Lk < 150) continue;
                        for (int64_t e = 0; e < d; e++) {
                            float x = (float)(0.4 * nrand()), y = (float)nrand();
                            if (t == DHSA_F16) x = dhsa_f16_to_f32(dhsa_f32_to_f16(x)), y = dhsa_f16_to_f32(dhsa_f32_to_f16(y));
                            kf[row * d + e] = x;
                            vf[row * d + e] = y;
                            if (t == DHSA_F32) ((float *)kraw)[row * d + e] = x, ((float *)vraw)[row * d + e] = y;
                            else ((uint16_t *)kraw)[row * d + e] = dhsa_f32_to_f16(x), ((uint16_t *)vraw)[row * d + e] = dhsa_f32_to_f16(y);
                        }
                    }
                    for (int stale = 1; stale >= 0; stale--) {
                        if (!stale) dhsa__rest_forget(r, 150);
                        st = dhsa__rest_sync(r, starts, nc, &a.k, &a.v);
                        if (!st) st = dhsa_attention(ctx, &a);
                        if (!st) st = dhsa__rest_attend(ctx, r, &a, lay, o2, o2 + Lq * Hq * d, NULL);
                        T_CHECK(st == DHSA_OK, "after the truncation: %s", dhsa_last_error());
                        if (st) break;
                        if (stale) { /* the reference of the new keys tells the stale summaries apart */
                            ref_attend(&rc, 1, want);
                            T_CHECK(worst(o, want, Lq * Hq * d, 1e-5, rtol) > 1, "stale summaries differ");
                        } else {
                            T_CHECK(worst(o, want, Lq * Hq * d, 1e-5, rtol) <= 1, "G %lld d %lld %s: after forget "
                                    "and sync, worst error %.3g", (long long)G, (long long)d, dhsa_type_name(t),
                                    worst(o, want, Lq * Hq * d, 1e-5, rtol));
                        }
                    }
                next:
                    dhsa__rest_free(r);
                    dhsa_layout_free(lay);
                    free(q);
                    free(kf);
                    free(vf);
                    free(kraw);
                    free(vraw);
                    free(o);
                    free(lse);
                    free(o2);
                    free(want);
                }
    T_CHECK(judged == 16, "calls judged: %d", judged);
    dhsa_ctx_free(ctx);
}

#define MODEL "models/dhsa-retrieval-8m.gguf"
#define N_P 200

static dhsa_session_params sparams(int64_t rest, int64_t budget) {
    dhsa_session_params sp = dhsa_session_default_params();
    sp.n_ctx = 256;
    sp.n_ubatch = 32;
    sp.kv_type = DHSA_F32;
    sp.attn = DHSA_ATTN_DHSA;
    sp.router.dense_below = 0;
    sp.router.budget_tokens = budget;
    sp.router.sink_tokens = 4;
    sp.router.local_tokens = 16;
    sp.router.q_block = 16;
    sp.router.rest = rest;
    return sp;
}

/* Evals of `parts` pieces (ids, length, truncate to before it or -1);
 * the last eval's last logits to lg. */
static dhsa_status run(dhsa_ctx *ctx, const dhsa_model *m, dhsa_session_params p, const int32_t *const *ids,
                       const int64_t *lens, const int64_t *cut, int parts, float *lg, double *summaries) {
    dhsa_session *s = NULL;
    dhsa_status st = dhsa_session_create(ctx, m, &p, &s);
    dhsa_attn_stats last;
    for (int i = 0; i < parts && !st; i++) {
        if (cut[i] >= 0) st = dhsa_session_truncate(s, cut[i]);
        if (!st) st = dhsa_session_eval(s, ids[i], lens[i], lg);
        if (!st && summaries) st = dhsa_session_get_stats(s, &last, NULL);
        if (!st && summaries) summaries[i] = last.summaries;
    }
    dhsa_session_free(s);
    return st;
}

static void test_session(void) {
    FILE *f = fopen(MODEL, "rb");
    if (!f) {
        T_SKIP(8, MODEL " absent (run from the repository root)");
        return;
    }
    fclose(f);
    dhsa_ctx *ctx = NULL;
    dhsa_model *m = NULL;
    dhsa_ctx_create(NULL, &ctx);
    if (dhsa_model_load(MODEL, NULL, &m) != DHSA_OK) {
        T_CHECK(0, "load %s: %s", MODEL, dhsa_last_error());
        dhsa_ctx_free(ctx);
        return;
    }
    const int64_t V = dhsa_model_get_info(m)->n_vocab;
    int32_t x[N_P], y[N_P], z[N_P];
    for (int i = 0; i < N_P; i++) {
        x[i] = (int32_t)(1 + (int64_t)(urand() * (double)(V - 1)));
        y[i] = (int32_t)(1 + (int64_t)(urand() * (double)(V - 1)));
    }
    /* Z: Y but its first token, so that its keys close chunks of the
     * same bounds as Y's with other values (the summaries to forget) */
    memcpy(z, y, sizeof z);
    z[100] = y[100] % (int32_t)(V - 1) + 1;
    float *lg[6];
    for (int i = 0; i < 6; i++) lg[i] = malloc((size_t)V * sizeof(float));
    const int32_t *one[1] = {x};
    const int64_t n_one[1] = {N_P}, no_cut[1] = {-1};
    dhsa_status st = run(ctx, m, sparams(1, 48), one, n_one, no_cut, 1, lg[0], NULL);
    if (!st) st = run(ctx, m, sparams(0, 48), one, n_one, no_cut, 1, lg[1], NULL);
    if (!st) st = run(ctx, m, sparams(1, 256), one, n_one, no_cut, 1, lg[2], NULL);
    if (!st) st = run(ctx, m, sparams(0, 256), one, n_one, no_cut, 1, lg[3], NULL);
    const int32_t *xy[2] = {x, y + 100}, *xzy[3] = {x, z + 100, y + 100};
    const int64_t n_xy[2] = {150, 100}, c_xy[2] = {-1, 100}, n_xzy[3] = {150, 50, 100}, c_xzy[3] = {-1, 100, 100};
    if (!st) st = run(ctx, m, sparams(1, 48), xy, n_xy, c_xy, 2, lg[4], NULL);
    if (!st) st = run(ctx, m, sparams(1, 48), xzy, n_xzy, c_xzy, 3, lg[5], NULL);
    const int32_t *pd[2] = {x, y};
    const int64_t n_pd[2] = {N_P, 1}, c_pd[2] = {-1, -1};
    double sums[2] = {-1, -1};
    if (!st) st = run(ctx, m, sparams(1, 48), pd, n_pd, c_pd, 2, lg[0], sums);
    T_CHECK(st == DHSA_OK, "sessions: %s", dhsa_last_error());
    if (!st) {
        const size_t b = (size_t)V * sizeof(float);
        T_CHECK(memcmp(lg[0], lg[1], b) != 0, "rest 1 and rest 0 give other logits (the summaries are attended)");
        T_CHECK(memcmp(lg[2], lg[3], b) == 0, "a budget holding every key: rest changes nothing, bit for bit");
        T_CHECK(sums[0] > 0 && sums[1] == 0, "a prompt attends summaries (%.0f), a decode step none (%.0f)", sums[0],
                sums[1]);
        T_CHECK(memcmp(lg[4], lg[5], b) == 0, "X, truncate, Y as X, truncate, Z, truncate, Y: bit for bit (Z's "
                                              "summaries forgotten)");
    }
    for (int i = 0; i < 6; i++) free(lg[i]);
    const dhsa_attn_method meth[] = {DHSA_ATTN_DENSE, DHSA_ATTN_ORACLE, DHSA_ATTN_DHSA};
    for (int i = 0; i < 3; i++) {
        dhsa_session *s = NULL;
        dhsa_session_params p = sparams(1, 48);
        p.attn = meth[i];
        dhsa_router_params got;
        T_CHECK(dhsa_session_create(ctx, m, &p, &s) == DHSA_OK && dhsa_session_get_router(s, &got) == DHSA_OK &&
                    got.rest == (i == 2),
                "a %s session reports rest %d", dhsa_attn_method_name(meth[i]), i == 2);
        dhsa_session_free(s);
    }
    dhsa_model_free(m);
    dhsa_ctx_free(ctx);
}

/* A 5-layer gemma3 fixture whose layers 0, 2, 4 slide (window 16) when
 * hybrid, with no sliding layer otherwise; NULL (a failed check) when it
 * cannot be built. *bytes is freed after dhsa_model_free. */
static dhsa_model *gemma3_fixture(uint64_t seed, int hybrid, uint8_t **bytes) {
    llmref_spec sp = llmref_spec_default("gemma3", LLMREF_F32);
    sp.n_layer = 5;
    sp.sliding_window = hybrid ? 16 : 0;
    sp.seed = seed;
    dhsa_model *m = NULL;
    if (llmref_fixture_model(&sp, bytes, &m))
        T_CHECK(0, "gemma3 fixture (window %lld): %s %s", (long long)sp.sliding_window, llmref_error(),
                dhsa_last_error());
    return m;
}

/* DHSA_REST_HYBRID, the default: a gemma3 model whose layers 0, 2, 4
 * slide (window 16) and 1, 3 do not runs as rest 1, the same model
 * without a window as rest 0: the logits bit for bit, the summaries
 * attended, the reported routing and the memory plan. */
static void test_hybrid(void) {
    int32_t x[N_P];
    for (int i = 0; i < N_P; i++) x[i] = (int32_t)(3 + (int64_t)(urand() * 300.0));
    dhsa_ctx *ctx = NULL;
    dhsa_ctx_create(NULL, &ctx);
    for (int hybrid = 1; hybrid >= 0; hybrid--) {
        const int64_t win = hybrid ? 16 : 0;
        uint8_t *bytes = NULL;
        dhsa_model *m = gemma3_fixture(71, hybrid, &bytes);
        if (!m) continue;
        const int64_t V = dhsa_model_get_info(m)->n_vocab, want = hybrid;
        T_CHECK(dhsa_model_get_info(m)->n_swa_layers == (hybrid ? 3 : 0), "sliding layers: %lld",
                (long long)dhsa_model_get_info(m)->n_swa_layers);
        float *lg[2] = {malloc((size_t)V * sizeof(float)), malloc((size_t)V * sizeof(float))};
        double sums[2] = {-1, -1};
        const int32_t *one[1] = {x};
        const int64_t n_one[1] = {N_P}, no_cut[1] = {-1};
        dhsa_status st = run(ctx, m, sparams(DHSA_REST_HYBRID, 48), one, n_one, no_cut, 1, lg[0], &sums[0]);
        if (!st) st = run(ctx, m, sparams(want, 48), one, n_one, no_cut, 1, lg[1], &sums[1]);
        T_CHECK(st == DHSA_OK, "window %lld: %s", (long long)win, dhsa_last_error());
        if (!st) {
            T_CHECK(memcmp(lg[0], lg[1], (size_t)V * sizeof(float)) == 0 && sums[0] == sums[1] &&
                        (sums[0] > 0) == hybrid,
                    "window %lld: rest hybrid runs as rest %lld (summaries %.0f and %.0f)",
                    (long long)win, (long long)want, sums[0], sums[1]);
        }
        dhsa_session_params p = sparams(DHSA_REST_HYBRID, 48), q = sparams(want, 48), r = sparams(0, 48);
        dhsa_session *s = NULL;
        /* the session's allocations stay within its plan (sliding-window
         * layers keep no index and no summaries, and the plan counts none) */
        dhsa_ctx_trim(ctx);
        dhsa_mem_stats before = dhsa_ctx_mem_stats(ctx);
        dhsa_ctx_reset_peak(ctx);
        if (dhsa_session_create(ctx, m, &p, &s) == DHSA_OK) {
            st = dhsa_session_eval(s, x, N_P, lg[0]);
            dhsa_mem_stats after = dhsa_ctx_mem_stats(ctx);
            const dhsa_mem_plan *pl = dhsa_session_get_plan(s);
            size_t tracked = pl->activations + pl->attn_workspace + pl->matmul_workspace + pl->routing;
            T_CHECK(st == DHSA_OK && after.peak - before.in_use <= tracked,
                    "window %lld: the ctx peaked %zu bytes above its base, the plan holds %zu", (long long)win,
                    after.peak - before.in_use, tracked);
        }
        dhsa_session_free(s);
        s = NULL;
        dhsa_router_params got;
        T_CHECK(dhsa_session_create(ctx, m, &p, &s) == DHSA_OK && dhsa_session_get_router(s, &got) == DHSA_OK &&
                    got.rest == want,
                "window %lld: the session reports rest %lld, want %lld", (long long)win,
                (long long)got.rest, (long long)want);
        dhsa_session_free(s);
        dhsa_mem_plan a, b, c; /* (process: the RSS around the call, which moves) */
        T_CHECK(dhsa_session_plan(ctx, m, &p, &a) == DHSA_OK && dhsa_session_plan(ctx, m, &q, &b) == DHSA_OK &&
                    dhsa_session_plan(ctx, m, &r, &c) == DHSA_OK &&
                    a.total - a.process == b.total - b.process && a.routing == b.routing &&
                    (a.routing > c.routing) == hybrid,
                "window %lld: the plan of rest hybrid %zu, of rest %lld %zu, of rest 0 %zu",
                (long long)win, a.routing, (long long)want, b.routing, c.routing);
        free(lg[0]);
        free(lg[1]);
        dhsa_model_free(m); /* and its GGUF view */
        free(bytes);
    }
    dhsa_ctx_free(ctx);
}

/* The longest chunk any routed layer's layout held (layer hook). */
static int widest_chunk(void *user, int64_t layer, const dhsa_attn_desc *a) {
    (void)layer;
    dhsa_layout_stats ls;
    if (a->layout && dhsa_layout_get_stats(a->layout, &ls) == DHSA_OK && ls.chunks > 0) {
        int64_t *w = user;
        if (ls.chunk_max > *w) *w = ls.chunk_max;
    }
    return 0;
}

/* hybrid_max_chunk (16 by default): a session on a gemma3 model whose
 * layers 0, 2, 4 slide cuts chunks of at most 16 keys (max_chunk 32 at
 * this length), reports the values it runs, and gives the logits of the
 * same chunk limits set by hand bit for bit; off (0) or on a model
 * without sliding layers, the chunks reach past 16 keys. */
static void test_hybrid_chunks(void) {
    int32_t x[N_P];
    for (int i = 0; i < N_P; i++) x[i] = (int32_t)(3 + (int64_t)(urand() * 300.0));
    dhsa_ctx *ctx = NULL;
    dhsa_ctx_create(NULL, &ctx);
    for (int hybrid = 1; hybrid >= 0; hybrid--) {
        const int64_t win = hybrid ? 16 : 0;
        uint8_t *bytes = NULL;
        dhsa_model *m = gemma3_fixture(73, hybrid, &bytes);
        if (!m) continue;
        const int64_t V = dhsa_model_get_info(m)->n_vocab;
        /* the default (16), off, by hand (max 16, rule off), a min_chunk above the limit */
        const int64_t hyb[4] = {16, 0, 0, 16}, max_hand[4] = {-1, -1, 16, -1}, min_hand[4] = {-1, -1, -1, 24};
        const int64_t want_max[4] = {hybrid ? 16 : 32, 32, 16, hybrid ? 16 : 32},
                      want_min[4] = {8, 8, 8, hybrid ? 16 : 24};
        float *lg[4];
        int64_t widest[4] = {0, 0, 0, 0};
        for (int c = 0; c < 4; c++) {
            lg[c] = malloc((size_t)V * sizeof(float));
            dhsa_session_params p = sparams(0, 48);
            p.router.hybrid_max_chunk = hyb[c];
            if (max_hand[c] > 0) p.router.max_chunk = max_hand[c];
            if (min_hand[c] > 0) p.router.min_chunk = min_hand[c];
            p.layer_hook = widest_chunk;
            p.layer_hook_user = &widest[c];
            dhsa_session *s = NULL;
            dhsa_router_params got;
            dhsa_status st = dhsa_session_create(ctx, m, &p, &s);
            if (!st) st = dhsa_session_get_router(s, &got);
            if (!st) st = dhsa_session_eval(s, x, N_P, lg[c]);
            T_CHECK(st == DHSA_OK && got.max_chunk == want_max[c] && got.min_chunk == want_min[c],
                    "window %lld, case %d: %s; the session reports chunks %lld-%lld, want %lld-%lld",
                    (long long)win, c, st ? dhsa_last_error() : "ran", (long long)got.min_chunk,
                    (long long)got.max_chunk, (long long)want_min[c], (long long)want_max[c]);
            T_CHECK(widest[c] > 0 && widest[c] <= want_max[c], "window %lld, case %d: a chunk of %lld keys (at most %lld)",
                    (long long)win, c, (long long)widest[c], (long long)want_max[c]);
            dhsa_session_free(s);
        }
        /* the limit binds: without it some chunk is longer than 16 keys */
        T_CHECK(widest[1] > 16, "window %lld: no chunk past 16 keys without the rule (%lld): the check cannot fail",
                (long long)win, (long long)widest[1]);
        T_CHECK(memcmp(lg[0], lg[hybrid ? 2 : 1], (size_t)V * sizeof(float)) == 0,
                "window %lld: the default's logits differ from those of its chunk limits set by hand",
                (long long)win);
        for (int c = 0; c < 4; c++) free(lg[c]);
        dhsa_model_free(m);
        free(bytes);
    }
    dhsa_ctx_free(ctx);
}

static void test_param(void) {
    T_CHECK(dhsa_router_params_for(4096, 0.0625).rest == DHSA_REST_HYBRID, "dhsa_router_params_for: rest hybrid");
    T_CHECK(dhsa_router_default_params().rest == 0, "dhsa_router_default_params: rest 0");
    T_CHECK(dhsa_router_params_for(4096, 0.0625).hybrid_max_chunk == 16 &&
                dhsa_router_default_params().hybrid_max_chunk == 0,
            "hybrid_max_chunk: 16 in dhsa_router_params_for, 0 in dhsa_router_default_params");
    dhsa_ctx *ctx = NULL;
    dhsa_ctx_create(NULL, &ctx);
    float q[4 * 8] = {0}, k[4 * 8] = {0};
    dhsa_attn_desc a = dhsa_attn_default_desc();
    a.q = dhsa_tensor_bhld(q, DHSA_F32, 1, 1, 4, 8);
    a.k = a.v = dhsa_tensor_bhld(k, DHSA_F32, 1, 1, 4, 8);
    const int64_t bad[] = {-2, DHSA_REST_MAX + 1};
    for (int i = 0; i < 2; i++) {
        dhsa_router_params rp = dhsa_router_params_for(4, 0.5);
        rp.rest = bad[i];
        dhsa_layout *lay = NULL;
        dhsa_status st = dhsa_route(ctx, &rp, &a, &lay);
        T_CHECK(st == DHSA_ERR_INVALID_ARG && strstr(dhsa_last_error(), "rest"), "rest %lld refused: %s",
                (long long)bad[i], dhsa_last_error());
        dhsa_layout_free(lay);
    }
    const int64_t bad_h[] = {-1, ((int64_t)1 << 40) + 1};
    for (int i = 0; i < 2; i++) {
        dhsa_router_params rp = dhsa_router_params_for(4, 0.5);
        rp.hybrid_max_chunk = bad_h[i];
        dhsa_layout *lay = NULL;
        dhsa_status st = dhsa_route(ctx, &rp, &a, &lay);
        T_CHECK(st == DHSA_ERR_INVALID_ARG && strstr(dhsa_last_error(), "hybrid_max_chunk"),
                "hybrid_max_chunk %lld refused: %s", (long long)bad_h[i], dhsa_last_error());
        dhsa_layout_free(lay);
    }
    dhsa_ctx_free(ctx);
}

int main(void) {
    test_param();
    test_attend();
    test_session();
    test_hybrid();
    test_hybrid_chunks();
    return t_report("test_rest");
}
