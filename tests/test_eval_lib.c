/* test_eval_lib.c: the evaluation library calls (include/dhsa.h
 * "Evaluation" block, src/eval/evaluate.c) and their layer hook
 * (src/eval/probe.c), each against a computation of its own here:
 *   - the probe on one hand-made attention call: the density it reports
 *     against the layout's ranges counted by hand (every row, and the late
 *     rows under causality), the recall against the softmax mass on the
 *     selected keys in double precision, a dense call as recall 1; a
 *     wrong layout gives a recall the check tells apart;
 *   - dhsa_eval_fidelity over a window of two ubatches (run a step at a
 *     time) scored as whole-window sessions;
 *   - dhsa_eval_fidelity on the shipped default model: dense against itself
 *     is KL 0, top-1 1, recall 1, density 1; a sparse method's KL, top-1,
 *     perplexities (whole and second half) against sessions run and scored
 *     here (windows cut by hand, double log-softmax); a method whose KL the
 *     test did not compute does not match;
 *   - dhsa_eval_generate / dhsa_eval_retrieval: the greedy answer against
 *     a decode loop here; dense selects the needle everywhere; a sparse
 *     method's shares are in [0, 1] and a miss is classified by them;
 *   - dhsa_niah_build: the prompt's ids against the text assembled here
 *     (the needle at the nearest boundary found by a scan of our own), the
 *     length bound, the stop ids, a chat template's markers;
 *   - the copy measurement: the sequence against one laid out by hand, the
 *     losses of the piecewise eval against one logits_all eval over the
 *     whole sequence scored here (dense and block: the same numbers),
 *     dense keeping all of its own mass; sampled filler without BOS/EOS,
 *     the same for a seed; the passage vocabulary;
 *   - refusals: NULLs, a window of 1, a text shorter than a window, an
 *     id outside the vocabulary, an unknown method, a depth outside [0, 1].
 * Run: make test (or make build/tests/test_eval_lib && build/tests/test_eval_lib; a few seconds).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dhsa.h"
#include "eval/probe.h"
#include "t.h"

#define MODEL_DEFAULT "models/dhsa-retrieval-8m.gguf"

static uint64_t rng_state = 12345;
static float frand(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* ------------------------------------------------------------- probe --- */

static void test_probe(dhsa_ctx *ctx) {
    enum { Hq = 4, Hkv = 2, L = 40, D = 8, QB = 16 };
    static float q[Hq * L * D], k[Hkv * L * D], v[Hkv * L * D], o[Hq * L * D];
    for (int i = 0; i < Hq * L * D; i++) q[i] = 2 * frand();
    for (int i = 0; i < Hkv * L * D; i++) k[i] = 2 * frand(), v[i] = frand();
    dhsa_attn_desc a = dhsa_attn_default_desc();
    a.q = dhsa_tensor_bhld(q, DHSA_F32, 1, Hq, L, D);
    a.k = dhsa_tensor_bhld(k, DHSA_F32, 1, Hkv, L, D);
    a.v = dhsa_tensor_bhld(v, DHSA_F32, 1, Hkv, L, D);
    a.o = dhsa_tensor_bhld(o, DHSA_F32, 1, Hq, L, D);
    a.causal = 1;
    /* per (g, block): the first 3 keys and the block's own rows */
    const int64_t nb = (L + QB - 1) / QB;
    int64_t rng[Hkv][3][4];
    dhsa_layout *lay = NULL, *wrong = NULL;
    T_CHECK(dhsa_layout_create(ctx, 1, Hkv, L, L, QB, 2, &lay) == DHSA_OK, "layout: %s", dhsa_last_error());
    T_CHECK(dhsa_layout_create(ctx, 1, Hkv, L, L, QB, 2, &wrong) == DHSA_OK, "layout: %s", dhsa_last_error());
    if (!lay || !wrong) return;
    double sel_hand = 0;
    for (int g = 0; g < Hkv; g++)
        for (int64_t b = 0; b < nb; b++) {
            int64_t lo = b * QB, hi = lo + QB < L ? lo + QB : L;
            int64_t r[4] = {0, 3, lo + 3 * g, hi}; /* head 1 skips 3 of its own diagonal keys */
            if (r[2] <= r[1]) r[2] = r[1];
            memcpy(rng[g][b], r, sizeof r);
            dhsa_layout_set(lay, 0, g, b, r, 2);
            int64_t w[2] = {0, 1};
            dhsa_layout_set(wrong, 0, g, b, w, 1);
            const int64_t *got;
            int64_t n;
            dhsa_layout_get(lay, 0, g, b, &got, &n);
            int64_t keys = 0;
            for (int64_t j = 0; j < n; j++) keys += got[2 * j + 1] - got[2 * j];
            sel_hand += (double)keys * (double)(hi - lo);
        }
    a.layout = lay;
    dhsa__probe p;
    T_CHECK(dhsa__probe_init(&p, ctx, 2, 1) == DHSA_OK, "probe init");
    p.late_from = 20;
    T_CHECK(dhsa__probe_hook(&p, 1, &a) == 0, "probe hook: %s", p.err);
    /* a hand-made layout records no causality: every key counts as available */
    double want_density = sel_hand / ((double)Hkv * L * L);
    T_CHECK(fabs(dhsa__probe_density(&p) - want_density) < 1e-12, "density %g, by hand %g",
            dhsa__probe_density(&p), want_density);
    /* late rows (>= 20): selected keys among the visible [0, pos] */
    double ls = 0, la = 0, mass = 0;
    for (int g = 0; g < Hkv; g++)
        for (int64_t i = 0; i < L; i++) {
            const int64_t *r = rng[g][i / QB];
            int64_t s = 0;
            for (int j = 0; j < 2; j++) {
                int64_t e = r[2 * j + 1] < i + 1 ? r[2 * j + 1] : i + 1;
                if (e > r[2 * j]) s += e - r[2 * j];
            }
            if (i >= 20) {
                ls += (double)s;
                la += (double)(i + 1);
            }
        }
    T_CHECK(fabs(dhsa__probe_late_density(&p) - ls / la) < 1e-12, "late density %g, by hand %g",
            dhsa__probe_late_density(&p), ls / la);
    /* recall: softmax mass on the selected visible keys, double precision */
    for (int h = 0; h < Hq; h++) {
        int g = h / (Hq / Hkv);
        for (int64_t i = 0; i < L; i++) {
            const int64_t *r = rng[g][i / QB];
            double mx = -INFINITY, s[L], all = 0, in = 0;
            for (int64_t j = 0; j <= i; j++) {
                double dot = 0;
                for (int d = 0; d < D; d++) dot += (double)q[(h * L + i) * D + d] * k[(g * L + j) * D + d];
                s[j] = dot / sqrt((double)D);
                if (s[j] > mx) mx = s[j];
            }
            for (int64_t j = 0; j <= i; j++) {
                double e = exp(s[j] - mx);
                all += e;
                if ((j >= r[0] && j < r[1]) || (j >= r[2] && j < r[3])) in += e;
            }
            mass += in / all;
        }
    }
    mass /= (double)(Hq * L);
    double rec = dhsa__probe_recall(&p, 1);
    T_CHECK(fabs(rec - mass) < 1e-5 && rec < 0.99, "recall %.7f, materialised %.7f", rec, mass);
    T_CHECK(isnan(dhsa__probe_recall(&p, 0)), "a layer never called has no recall (NaN)");
    /* the same check tells a wrong layout apart */
    dhsa__probe_clear(&p);
    a.layout = wrong;
    T_CHECK(dhsa__probe_hook(&p, 1, &a) == 0 && fabs(dhsa__probe_recall(&p, 1) - mass) > 1e-2,
            "a wrong layout's recall %g differs from %g", dhsa__probe_recall(&p, 1), mass);
    /* a dense call: everything selected, recall 1 */
    dhsa__probe_clear(&p);
    a.layout = NULL;
    T_CHECK(dhsa__probe_hook(&p, 0, &a) == 0 && dhsa__probe_recall(&p, 0) == 1 && dhsa__probe_density(&p) == 1,
            "dense call: recall %g, density %g", dhsa__probe_recall(&p, 0), dhsa__probe_density(&p));
    T_CHECK(dhsa__probe_hook(&p, 2, &a) != 0, "a layer past n_layer stops the eval");
    dhsa__probe_free(&p);
    dhsa_layout_free(lay);
    dhsa_layout_free(wrong);
}

/* ---------------------------------------------------------- fidelity --- */

static void log_softmax(const float *x, int64_t V, double *lp) {
    double mx = -INFINITY, s = 0;
    for (int64_t i = 0; i < V; i++) mx = x[i] > mx ? x[i] : mx;
    for (int64_t i = 0; i < V; i++) s += exp((double)x[i] - mx);
    for (int64_t i = 0; i < V; i++) lp[i] = (double)x[i] - mx - log(s);
}

static int64_t argmax(const float *x, int64_t V) {
    int64_t b = 0;
    for (int64_t i = 1; i < V; i++) b = x[i] > x[b] ? i : b;
    return b;
}

/* Logits of every position of ids[0..n) under a method. */
static int run_logits(dhsa_ctx *ctx, dhsa_model *m, const dhsa_eval_method *me, const int32_t *ids, int64_t n,
                      float *out) {
    dhsa_session_params sp = dhsa_session_default_params();
    sp.n_ctx = n;
    sp.attn = me->attn;
    sp.router = me->router;
    sp.logits_all = 1;
    dhsa_session *s;
    if (dhsa_session_create(ctx, m, &sp, &s)) return 1;
    int bad = dhsa_session_eval(s, ids, n, out) != DHSA_OK;
    dhsa_session_free(s);
    return bad;
}

/* A window longer than one step (600 tokens: 512 + 88): the evaluation
 * runs dense and the method side by side a step at a time, holding one
 * step of logits; the scores must be those of whole-window sessions. */
static void test_fidelity_steps(dhsa_ctx *ctx, dhsa_model *m) {
    const dhsa_model_info *in = dhsa_model_get_info(m);
    const dhsa_tokenizer *tok = dhsa_model_tokenizer(m);
    const int64_t V = in->n_vocab, W = 600;
    static const char text[] =
        "The keeper of the lighthouse wrote every evening in a thick book: the wind, the ships that passed, "
        "the colour of the water and the birds that rested on the rail. ";
    char *buf = malloc(100 * sizeof text);
    buf[0] = 0;
    for (int i = 0; i < 100; i++) strcat(buf, text);
    int64_t n = 0;
    dhsa_tokenize(tok, buf, (int64_t)strlen(buf), 0, NULL, 0, &n);
    int32_t *ids = malloc((size_t)n * sizeof(int32_t));
    T_CHECK(ids && dhsa_tokenize(tok, buf, (int64_t)strlen(buf), 0, ids, n, &n) == DHSA_OK && n >= W,
            "text: %lld tokens", (long long)n);
    free(buf);
    if (n < W) {
        free(ids);
        return;
    }
    dhsa_eval_method me[2] = {{DHSA_ATTN_DENSE, dhsa_eval_router_params(W, 1.0)},
                              {DHSA_ATTN_DHSA, dhsa_eval_router_params(W, 0.125)}};
    dhsa_eval_fidelity_result res[2] = {{0}};
    dhsa_eval_fidelity_params fp = dhsa_eval_fidelity_default_params();
    fp.window = W;
    fp.max_windows = 1;
    fp.recall = 0;
    dhsa_status st = dhsa_eval_fidelity(ctx, m, ids, n, &fp, me, 2, res, NULL);
    T_CHECK(st == DHSA_OK, "fidelity over two steps: %s", dhsa_last_error());
    float *ld = malloc((size_t)(W * V) * sizeof(float)), *lm = malloc((size_t)(W * V) * sizeof(float));
    double *pd = malloc((size_t)V * sizeof(double)), *pm = malloc((size_t)V * sizeof(double));
    int32_t *win = malloc((size_t)W * sizeof(int32_t));
    win[0] = dhsa_tokenizer_bos(tok);
    memcpy(win + 1, ids, (size_t)(W - 1) * sizeof(int32_t));
    double kl = 0, top = 0, cnt = 0;
    if (!st && run_logits(ctx, m, &me[0], win, W, ld) == 0 && run_logits(ctx, m, &me[1], win, W, lm) == 0) {
        for (int64_t t = 0; t + 1 < W; t++) {
            log_softmax(ld + t * V, V, pd);
            log_softmax(lm + t * V, V, pm);
            for (int64_t x = 0; x < V; x++) kl += exp(pd[x]) * (pd[x] - pm[x]);
            top += argmax(ld + t * V, V) == argmax(lm + t * V, V);
            cnt++;
        }
        T_CHECK(res[0].kl == 0 && res[0].top1 == 1, "two steps: dense against itself KL %g", res[0].kl);
        T_CHECK(fabs(res[1].kl - kl / cnt) <= 1e-9 * kl / cnt && res[1].kl > 0 && res[1].top1 == top / cnt &&
                    res[1].n_predicted == W - 1,
                "two steps: dhsa KL %.12g (whole-window sessions %.12g), top-1 %g (%g)", res[1].kl, kl / cnt,
                res[1].top1, top / cnt);
    } else {
        T_CHECK(0, "reference sessions: %s", dhsa_last_error());
    }
    free(ld);
    free(lm);
    free(pd);
    free(pm);
    free(win);
    free(ids);
}

static void test_fidelity(dhsa_ctx *ctx, dhsa_model *m) {
    const dhsa_model_info *in = dhsa_model_get_info(m);
    const dhsa_tokenizer *tok = dhsa_model_tokenizer(m);
    const int64_t V = in->n_vocab, NL = in->n_layer, W = 128, NW = 2;
    static const char text[] =
        "The keeper of the lighthouse wrote every evening in a thick book: the wind, the ships that passed, "
        "the colour of the water and the birds that rested on the rail. ";
    char buf[8192] = "";
    for (int i = 0; i < 20; i++) strcat(buf, text);
    int64_t n = 0;
    dhsa_tokenize(tok, buf, (int64_t)strlen(buf), 0, NULL, 0, &n);
    int32_t *ids = malloc((size_t)n * sizeof(int32_t));
    T_CHECK(ids && dhsa_tokenize(tok, buf, (int64_t)strlen(buf), 0, ids, n, &n) == DHSA_OK && n > 3 * W,
            "text: %lld tokens", (long long)n);
    dhsa_eval_method me[3] = {{DHSA_ATTN_DENSE, dhsa_eval_router_params(W, 1.0)},
                              {DHSA_ATTN_DHSA, dhsa_eval_router_params(W, 0.125)},
                              {DHSA_ATTN_STREAM, dhsa_eval_router_params(W, 0.125)}};
    double rec[3][64];
    dhsa_eval_fidelity_result res[3];
    for (int i = 0; i < 3; i++) res[i].recall = rec[i];
    dhsa_eval_fidelity_params fp = dhsa_eval_fidelity_default_params();
    T_CHECK(fp.max_windows == 8 && fp.recall == 1 && fp.window == 0, "fidelity defaults");
    fp.window = W;
    fp.max_windows = NW;
    dhsa_eval_fidelity_info info;
    dhsa_status st = dhsa_eval_fidelity(ctx, m, ids, n, &fp, me, 3, res, &info);
    T_CHECK(st == DHSA_OK, "fidelity: %s", dhsa_last_error());
    if (st) {
        free(ids);
        return;
    }
    T_CHECK(info.window == W && info.n_windows == NW && info.n_text == n && info.n_predicted == NW * (W - 1),
            "info: window %lld, %lld windows, %lld predicted", (long long)info.window, (long long)info.n_windows,
            (long long)info.n_predicted);
    int ones = 1;
    for (int64_t l = 0; l < NL; l++) ones &= rec[0][l] == 1;
    T_CHECK(res[0].kl == 0 && res[0].top1 == 1 && res[0].kl_late == 0 && res[0].top1_late == 1 &&
                res[0].density_used == 1 && res[0].density_used_late == 1 && ones,
            "dense against itself: KL %g, top-1 %g, density %g, recall all 1: %d", res[0].kl, res[0].top1,
            res[0].density_used, ones);
    /* the sparse method and dense, scored here */
    float *ld = malloc((size_t)(W * V) * sizeof(float)), *lm = malloc((size_t)(W * V) * sizeof(float));
    double *pd = malloc((size_t)V * sizeof(double)), *pm = malloc((size_t)V * sizeof(double));
    int32_t *win = malloc((size_t)W * sizeof(int32_t));
    double kl = 0, top = 0, nll = 0, nlld = 0, cnt = 0, kl2 = 0, top2 = 0, cnt2 = 0;
    int32_t bos = dhsa_tokenizer_bos(tok);
    for (int64_t w = 0; w < NW; w++) {
        win[0] = bos;
        memcpy(win + 1, ids + w * (W - 1), (size_t)(W - 1) * sizeof(int32_t));
        T_CHECK(run_logits(ctx, m, &me[0], win, W, ld) == 0 && run_logits(ctx, m, &me[1], win, W, lm) == 0,
                "reference sessions: %s", dhsa_last_error());
        for (int64_t t = 0; t + 1 < W; t++) {
            log_softmax(ld + t * V, V, pd);
            log_softmax(lm + t * V, V, pm);
            double k1 = 0;
            for (int64_t x = 0; x < V; x++) k1 += exp(pd[x]) * (pd[x] - pm[x]);
            int ag = argmax(ld + t * V, V) == argmax(lm + t * V, V);
            kl += k1, top += ag, nll -= pm[win[t + 1]], nlld -= pd[win[t + 1]], cnt++;
            if (t >= W / 2) kl2 += k1, top2 += ag, cnt2++;
        }
    }
    const dhsa_eval_fidelity_result *r = &res[1];
    double tol = 1e-9;
    T_CHECK(fabs(r->kl - kl / cnt) <= tol * kl / cnt && r->kl > 0, "dhsa KL %.12g, here %.12g", r->kl, kl / cnt);
    T_CHECK(r->top1 == top / cnt && r->top1 < 1, "dhsa top-1 %g, here %g", r->top1, top / cnt);
    T_CHECK(fabs(r->ppl - exp(nll / cnt)) <= tol * r->ppl && fabs(r->ppl_dense - exp(nlld / cnt)) <= tol * r->ppl_dense &&
                fabs(info.ppl_dense - r->ppl_dense) <= tol * r->ppl_dense,
            "ppl %g (here %g), dense %g (here %g, info %g)", r->ppl, exp(nll / cnt), r->ppl_dense, exp(nlld / cnt),
            info.ppl_dense);
    T_CHECK(fabs(r->kl_late - kl2 / cnt2) <= tol * kl2 / cnt2 && r->top1_late == top2 / cnt2 &&
                r->n_predicted == (int64_t)cnt && r->n_predicted_late == (int64_t)cnt2,
            "second half: KL %g (here %g), top-1 %g (here %g)", r->kl_late, kl2 / cnt2, r->top1_late, top2 / cnt2);
    /* the comparison can fail: stream's KL is not the one computed for dhsa */
    T_CHECK(fabs(res[2].kl - kl / cnt) > 1e-3, "stream's KL %g differs from dhsa's %g", res[2].kl, kl / cnt);
    int in01 = 1;
    for (int64_t l = 0; l < NL; l++) in01 &= rec[1][l] > 0 && rec[1][l] < 1;
    T_CHECK(in01 && r->density_used > 0.1 && r->density_used < 0.5 && r->density_used_late < r->density_used,
            "dhsa recall in (0, 1) per layer, density used %g (late %g)", r->density_used, r->density_used_late);
    /* no recall asked: NaN, the rest as before */
    fp.recall = 0;
    dhsa_eval_fidelity_result one = {0};
    double rec1[64];
    one.recall = rec1;
    T_CHECK(dhsa_eval_fidelity(ctx, m, ids, n, &fp, &me[1], 1, &one, NULL) == DHSA_OK && isnan(rec1[0]) &&
                one.kl == r->kl,
            "recall 0: NaN recall, same KL (%g vs %g)", one.kl, r->kl);
    fp.recall = 1;
    /* refusals */
    fp.window = 1;
    T_CHECK(dhsa_eval_fidelity(ctx, m, ids, n, &fp, me, 1, res, NULL) == DHSA_ERR_INVALID_ARG &&
                strstr(dhsa_last_error(), "window"),
            "window 1: %s", dhsa_last_error());
    fp.window = W;
    T_CHECK(dhsa_eval_fidelity(ctx, m, ids, W - 2, &fp, me, 1, res, NULL) == DHSA_ERR_INVALID_ARG &&
                strstr(dhsa_last_error(), "fewer than one window"),
            "short text: %s", dhsa_last_error());
    int32_t keep = ids[5];
    ids[5] = (int32_t)V;
    T_CHECK(dhsa_eval_fidelity(ctx, m, ids, n, &fp, me, 1, res, NULL) == DHSA_ERR_INVALID_ARG &&
                strstr(dhsa_last_error(), "ids[5]"),
            "id outside the vocabulary: %s", dhsa_last_error());
    ids[5] = keep;
    dhsa_eval_method bad = me[1];
    bad.attn = (dhsa_attn_method)99;
    T_CHECK(dhsa_eval_fidelity(ctx, m, ids, n, &fp, &bad, 1, res, NULL) == DHSA_ERR_INVALID_ARG,
            "unknown method: %s", dhsa_last_error());
    T_CHECK(dhsa_eval_fidelity(ctx, m, ids, n, NULL, me, 1, res, NULL) == DHSA_ERR_INVALID_ARG, "NULL params");
    free(ld);
    free(lm);
    free(pd);
    free(pm);
    free(win);
    free(ids);
}

/* ----------------------------------------------------------- answers --- */

static void test_answers(dhsa_ctx *ctx, dhsa_model *m) {
    const dhsa_model_info *in = dhsa_model_get_info(m);
    const dhsa_tokenizer *tok = dhsa_model_tokenizer(m);
    const int64_t V = in->n_vocab;
    dhsa_task_params tp = dhsa_task_default_params();
    tp.kind = DHSA_TASK_PASSKEY;
    tp.length = 256;
    tp.depth = 0.25;
    tp.seed = 1000003u * 1;
    dhsa_task t;
    T_CHECK(dhsa_task_build(tok, &tp, &t) == DHSA_OK, "task: %s", dhsa_last_error());
    dhsa_eval_answer *a = malloc(sizeof *a), *b = malloc(sizeof *b);
    dhsa_eval_answer_params ap = dhsa_eval_answer_default_params();
    T_CHECK(ap.method.attn == DHSA_ATTN_DENSE && ap.max_tokens == 0 && ap.stop == NULL, "answer defaults");
    T_CHECK(dhsa_eval_retrieval(ctx, m, &t, &ap, a) == DHSA_OK, "dense retrieval: %s", dhsa_last_error());
    /* the greedy answer, decoded here */
    dhsa_session_params sp = dhsa_session_default_params();
    sp.n_ctx = t.n_ids + 12;
    dhsa_session *s;
    float *lg = malloc((size_t)V * sizeof(float));
    int32_t ans[12];
    int64_t na = 0;
    T_CHECK(dhsa_session_create(ctx, m, &sp, &s) == DHSA_OK && dhsa_session_eval(s, t.ids, t.n_ids, lg) == DHSA_OK,
            "reference session");
    while (na < 12) {
        int32_t nx = (int32_t)argmax(lg, V);
        if (nx == dhsa_tokenizer_eos(tok)) break;
        ans[na++] = nx;
        if (na == 12 || dhsa_session_eval(s, &nx, 1, lg)) break;
    }
    dhsa_session_free(s);
    char text[512];
    int64_t tl = 0;
    dhsa_detokenize(tok, ans, na, DHSA_DETOKENIZE_KEEP_SPACE, text, sizeof text - 1, &tl);
    text[tl] = 0;
    T_CHECK(strcmp(a->text, text) == 0 && a->n_tokens == na, "dense answer \"%s\", here \"%s\"", a->text, text);
    T_CHECK(a->hit == dhsa_task_check(&t, text, tl) && a->density_used == 1, "hit %d, density %g", a->hit,
            a->density_used);
    int all = a->n_layer == in->n_layer;
    for (int64_t l = 0; l < a->n_layer; l++) all &= a->needle_selected[l] == 1;
    T_CHECK(all && a->needle == DHSA_EVAL_NEEDLE_EVERYWHERE, "dense selects the needle in every layer");
    /* the same prompt through dhsa_eval_generate (spaces kept) */
    ap.detok_flags = DHSA_DETOKENIZE_KEEP_SPACE;
    T_CHECK(dhsa_eval_generate(ctx, m, t.ids, t.n_ids, &ap, b) == DHSA_OK && strcmp(a->text, b->text) == 0 &&
                b->hit == -1,
            "generate: \"%s\"", b->text);
    /* sparse, at a density where the needle is mostly out of budget */
    ap.method.attn = DHSA_ATTN_STREAM;
    ap.method.router = dhsa_eval_router_params(256, 0.05);
    T_CHECK(dhsa_eval_retrieval(ctx, m, &t, &ap, b) == DHSA_OK, "stream retrieval: %s", dhsa_last_error());
    int ok = b->density_used < 0.5 && b->first_wrong >= 0 && b->first_wrong <= b->n_tokens;
    double smin = 1, smax = 0;
    for (int64_t l = 0; l < b->n_layer; l++) {
        ok &= b->needle_selected[l] >= 0 && b->needle_selected[l] <= 1 &&
              b->needle_selected[l] <= b->selected_at_wrong[l] + 1e-12;
        smin = fmin(smin, b->selected_at_wrong[l]);
        smax = fmax(smax, b->selected_at_wrong[l]);
    }
    dhsa_eval_needle want = smin >= 1 ? DHSA_EVAL_NEEDLE_EVERYWHERE : smax > 0 ? DHSA_EVAL_NEEDLE_PARTLY
                                                                               : DHSA_EVAL_NEEDLE_NOWHERE;
    T_CHECK(ok && b->needle == want, "stream: \"%s\" hit %d, density %g, first wrong %lld, class %d (want %d)",
            b->text, b->hit, b->density_used, (long long)b->first_wrong, b->needle, want);
    T_CHECK(a->mean_chunk == 0 && b->mean_chunk == 0, "dense and stream cut no chunks: %g, %g", a->mean_chunk,
            b->mean_chunk);
    /* chunk lengths: block's fixed chunks of 16 over the prompt's keys; dhsa's
     * within its chunk limits */
    ap.method.attn = DHSA_ATTN_BLOCK;
    ap.method.router = dhsa_eval_router_params(256, 0.125);
    T_CHECK(dhsa_eval_retrieval(ctx, m, &t, &ap, b) == DHSA_OK, "block retrieval: %s", dhsa_last_error());
    double want_chunk = (double)t.n_ids / (double)((t.n_ids + 15) / 16);
    T_CHECK(fabs(b->mean_chunk - want_chunk) < 1e-9, "block: %g keys per chunk, want %g (%lld keys)", b->mean_chunk,
            want_chunk, (long long)t.n_ids);
    ap.method.attn = DHSA_ATTN_DHSA;
    T_CHECK(dhsa_eval_retrieval(ctx, m, &t, &ap, b) == DHSA_OK, "dhsa retrieval: %s", dhsa_last_error());
    T_CHECK(b->mean_chunk >= (double)ap.method.router.min_chunk * 0.5 &&
                b->mean_chunk <= (double)ap.method.router.max_chunk,
            "dhsa: %g keys per chunk, within its limits", b->mean_chunk);
    /* refusals */
    ap.max_tokens = -1;
    T_CHECK(dhsa_eval_retrieval(ctx, m, &t, &ap, b) == DHSA_ERR_INVALID_ARG, "max_tokens -1");
    ap.max_tokens = 0;
    ap.n_stop = 2;
    T_CHECK(dhsa_eval_generate(ctx, m, t.ids, t.n_ids, &ap, b) == DHSA_ERR_INVALID_ARG, "stop count without ids");
    ap.n_stop = 0;
    T_CHECK(dhsa_eval_generate(ctx, m, t.ids, 0, &ap, b) == DHSA_ERR_INVALID_ARG, "empty prompt");
    T_CHECK(dhsa_eval_retrieval(ctx, m, NULL, &ap, b) == DHSA_ERR_INVALID_ARG, "NULL task");
    dhsa_task_free(&t);
    free(lg);
    free(a);
    free(b);
}

/* -------------------------------------------------------------- niah --- */

static void test_niah(dhsa_model *m) {
    const dhsa_tokenizer *tok = dhsa_model_tokenizer(m);
    int64_t n_sent;
    const char *const *sent = dhsa_task_builtin_sentences(&n_sent);
    const char needle[] = "The secret number is 4821.";
    const int64_t Ls[2] = {300, 900};
    const double depths[3] = {0, 0.4, 1};
    for (int li = 0; li < 2; li++)
        for (int di = 0; di < 3; di++) {
            dhsa_niah_params np = dhsa_niah_default_params();
            np.length = Ls[li];
            np.depth = depths[di];
            np.needle = needle;
            dhsa_niah_prompt pr;
            dhsa_status st = dhsa_niah_build(tok, &np, &pr);
            T_CHECK(st == DHSA_OK && pr.n_ids <= Ls[li] && pr.n_ids > Ls[li] - 40 && pr.n_sentences > 2,
                    "niah L %lld depth %g: %lld ids, %lld sentences (%s)", (long long)Ls[li], depths[di],
                    (long long)pr.n_ids, (long long)pr.n_sentences, st ? dhsa_last_error() : "ok");
            if (st) continue;
            /* the text by hand: the needle at the boundary nearest depth x tokens */
            int64_t cnt = pr.n_sentences, total = 0, *tk = malloc((size_t)cnt * sizeof(int64_t));
            for (int64_t i = 0; i < cnt; i++) {
                const char *x = sent[i % n_sent];
                dhsa_tokenize(tok, x, (int64_t)strlen(x), 0, NULL, 0, &tk[i]);
                total += tk[i];
            }
            int64_t best = 0, off = 0;
            double bd = 1e300;
            for (int64_t k = 0; k <= cnt; k++) {
                double d = fabs((double)off - depths[di] * (double)total);
                if (d < bd) bd = d, best = k;
                if (k < cnt) off += tk[k];
            }
            static char text[65536];
            size_t n = 0;
            int64_t before = 0;
            for (int64_t i = 0; i <= cnt; i++) {
                if (i == best) n += (size_t)snprintf(text + n, sizeof text - n, "%s%s", n ? " " : "", needle);
                if (i == cnt) break;
                n += (size_t)snprintf(text + n, sizeof text - n, "%s%s", n ? " " : "", sent[i % n_sent]);
                if (i < best) before += tk[i];
            }
            snprintf(text + n, sizeof text - n, "\n\nQuestion: What is the secret number mentioned in the text "
                     "above?\nAnswer: The secret number is");
            int64_t nw = 0;
            unsigned fl = dhsa_tokenizer_default_flags(tok) & DHSA_TOKENIZE_ADD_BOS;
            dhsa_tokenize(tok, text, (int64_t)strlen(text), fl, NULL, 0, &nw);
            int32_t *want = malloc((size_t)nw * sizeof(int32_t));
            dhsa_tokenize(tok, text, (int64_t)strlen(text), fl, want, nw, &nw);
            T_CHECK(nw == pr.n_ids && memcmp(want, pr.ids, (size_t)nw * sizeof(int32_t)) == 0 &&
                        fabs(pr.depth_used - (double)before / (double)total) < 1e-12,
                    "niah L %lld depth %g: the prompt is the text assembled here (%lld vs %lld ids), depth %g",
                    (long long)Ls[li], depths[di], (long long)pr.n_ids, (long long)nw, pr.depth_used);
            T_CHECK(pr.n_stop == 2 && pr.stop[0] == dhsa_tokenizer_eos(tok) && pr.stop[1] == dhsa_tokenizer_bos(tok),
                    "plain prompt: stops at EOS and BOS");
            free(want);
            free(tk);
            dhsa_niah_free(&pr);
        }
    /* a chat template: the user turn and its end-of-turn stop */
    dhsa_niah_params np = dhsa_niah_default_params();
    np.length = 400;
    np.needle = needle;
    np.tmpl = DHSA_CHAT_CHATML;
    dhsa_niah_prompt pr;
    T_CHECK(dhsa_niah_build(tok, &np, &pr) == DHSA_OK && pr.n_ids <= 400 && pr.n_stop >= 2,
            "chatml niah: %s", dhsa_last_error());
    char buf[8192];
    int64_t bl = 0;
    dhsa_detokenize(tok, pr.ids, pr.n_ids, DHSA_DETOKENIZE_SPECIAL, buf, sizeof buf - 1, &bl);
    buf[bl < (int64_t)sizeof buf ? bl : (int64_t)sizeof buf - 1] = 0;
    T_CHECK(strstr(buf, "<|im_start|>user") && strstr(buf, "Answer with the number only.") &&
                strstr(buf, needle) && !strstr(buf, "Question:"),
            "chatml prompt: %.300s", buf);
    dhsa_niah_free(&pr);
    /* scoring and refusals */
    T_CHECK(dhsa_niah_answer_has(" is 4,821.", 10, "4821") == 1 && dhsa_niah_answer_has("48210", 5, "4821") == 0 &&
                dhsa_niah_answer_has("4821", 4, "48a1") == -1,
            "dhsa_niah_answer_has");
    np.tmpl = DHSA_CHAT_NONE;
    np.depth = 1.5;
    T_CHECK(dhsa_niah_build(tok, &np, &pr) == DHSA_ERR_INVALID_ARG && pr.ids == NULL, "depth 1.5 refused");
    np.depth = 0.5;
    np.needle = NULL;
    T_CHECK(dhsa_niah_build(tok, &np, &pr) == DHSA_ERR_INVALID_ARG, "no needle refused");
    dhsa_niah_free(&pr);
}

/* -------------------------------------------------------------- copy --- */

/* Mean loss on ids[at + 1 .. at + P) from the logits of one full eval. */
static double span_loss(const float *lg, int64_t V, const int32_t *ids, int64_t at, int64_t P) {
    double *lp = malloc((size_t)V * sizeof(double)), s = 0;
    for (int64_t r = at; r < at + P - 1; r++) {
        log_softmax(lg + r * V, V, lp);
        s -= lp[ids[r + 1]];
    }
    free(lp);
    return s / (double)(P - 1);
}

static void test_copy(dhsa_ctx *ctx, dhsa_model *m) {
    const dhsa_model_info *in = dhsa_model_get_info(m);
    const dhsa_tokenizer *tok = dhsa_model_tokenizer(m);
    const int64_t V = in->n_vocab, L = 200, P = 16;
    int32_t *fill = malloc(400 * sizeof(int32_t)), *again = malloc(400 * sizeof(int32_t));
    T_CHECK(dhsa_eval_sample_tokens(ctx, m, 400, 7, fill) == DHSA_OK &&
                dhsa_eval_sample_tokens(ctx, m, 400, 7, again) == DHSA_OK,
            "sampled filler: %s", dhsa_last_error());
    int clean = 1;
    for (int i = 0; i < 400; i++)
        clean &= fill[i] >= 0 && fill[i] < V && fill[i] != dhsa_tokenizer_bos(tok) && fill[i] != dhsa_tokenizer_eos(tok);
    T_CHECK(clean && memcmp(fill, again, 400 * sizeof(int32_t)) == 0, "filler: no BOS/EOS, the same for a seed");
    dhsa_eval_sample_tokens(ctx, m, 400, 8, again);
    T_CHECK(memcmp(fill, again, 400 * sizeof(int32_t)) != 0, "another seed, other filler");
    /* the passage vocabulary */
    int64_t n_all = 0, n_words = 0;
    int32_t *voc = malloc((size_t)V * sizeof(int32_t));
    T_CHECK(dhsa_eval_passage_tokens(tok, 0, voc, V, &n_all) == DHSA_OK &&
                dhsa_eval_passage_tokens(tok, 1, voc, V, &n_words) == DHSA_OK && n_words > 10 && n_words < n_all,
            "passage vocabulary: %lld tokens, %lld words", (long long)n_all, (long long)n_words);
    int words_ok = 1;
    for (int64_t i = 0; i < n_words; i++) {
        int64_t tl = 0;
        const char *t = dhsa_tokenizer_text(tok, voc[i], &tl);
        words_ok &= tl >= 5 && memcmp(t, "\xe2\x96\x81", 3) == 0 && dhsa_tokenizer_type(tok, voc[i]) == DHSA_TOKEN_NORMAL;
    }
    T_CHECK(words_ok, "whole-word passage tokens start with the SPM space");
    T_CHECK(dhsa_eval_passage_tokens(tok, 0, voc, 3, &n_all) == DHSA_ERR_INVALID_ARG, "cap too small refused");
    /* the sequence, by hand */
    int32_t passage[16], ids[200];
    for (int i = 0; i < P; i++) passage[i] = voc[(i * 37) % n_words];
    dhsa_eval_copy_layout at;
    int32_t bos = dhsa_tokenizer_bos(tok);
    T_CHECK(dhsa_eval_copy_sequence(fill, 400, passage, P, L, 0.25, bos, ids, &at) == DHSA_OK, "sequence: %s",
            dhsa_last_error());
    const int64_t F = L - 1 - 2 * P, f1 = (int64_t)llround(0.25 * (double)F);
    int laid = at.n_ids == L && at.first == 1 + f1 && at.second == 1 + f1 + P + (F - f1) && at.passage == P &&
               at.control == at.first + P && ids[0] == bos;
    for (int64_t i = 0; i < P; i++) laid &= ids[at.first + i] == passage[i] && ids[at.second + i] == passage[i];
    for (int64_t i = 0; i < f1; i++) laid &= ids[1 + i] == fill[i];
    for (int64_t i = 0; i < F - f1; i++) laid &= ids[at.first + P + i] == fill[f1 + i];
    T_CHECK(laid, "sequence laid out as [BOS] filler passage filler passage (first %lld, second %lld)",
            (long long)at.first, (long long)at.second);
    dhsa_eval_copy_layout late;
    dhsa_eval_copy_sequence(fill, 400, passage, P, L, 1.0, bos, ids, &late);
    T_CHECK(late.second == late.first + P && late.control == late.first - P, "depth 1: the control before the copy");
    T_CHECK(dhsa_eval_copy_sequence(fill, 400, passage, P, 2 * P + 1, 0.5, bos, ids, &late) == DHSA_ERR_INVALID_ARG &&
                dhsa_eval_copy_sequence(fill, 10, passage, P, L, 0.5, bos, ids, &late) == DHSA_ERR_INVALID_ARG,
            "too short a length or filler refused");
    dhsa_eval_copy_sequence(fill, 400, passage, P, L, 0.25, bos, ids, &at);
    /* the losses against one full eval */
    float *lg = malloc((size_t)(L * V) * sizeof(float));
    dhsa_eval_method me[2] = {{DHSA_ATTN_DENSE, dhsa_eval_router_params(L, 1.0)},
                              {DHSA_ATTN_BLOCK, dhsa_eval_router_params(L, 0.125)}};
    for (int k = 0; k < 2; k++) {
        dhsa_eval_copy_result r;
        T_CHECK(dhsa_eval_copy(ctx, m, &me[k], ids, &at, &r) == DHSA_OK, "copy: %s", dhsa_last_error());
        T_CHECK(run_logits(ctx, m, &me[k], ids, L, lg) == 0, "full eval");
        double l1 = span_loss(lg, V, ids, at.first, P), l2 = span_loss(lg, V, ids, at.second, P);
        /* the same routing; the products over pieces of rows round differently (~1e-8) */
        T_CHECK(fabs(r.first_loss - l1) <= 1e-6 * l1 && fabs(r.rep_loss - l2) <= 1e-6 * l2 &&
                    fabs(r.score - (l1 - l2)) <= 1e-6 * (l1 + l2),
                "%s: losses %.9g / %.9g, one eval %.9g / %.9g", k ? "block" : "dense", r.first_loss, r.rep_loss, l1,
                l2);
        if (k == 0)
            T_CHECK(r.copy_mass_kept == 1 && r.copy_keys_selected == 1 && r.density_used == 1 && r.copy_mass > 0 &&
                        r.copy_mass < 1 && r.control_mass > 0,
                    "dense keeps all its mass (%g), mass %g, control %g", r.copy_mass_kept, r.copy_mass,
                    r.control_mass);
        else
            T_CHECK(r.density_used < 0.5 && r.copy_mass_kept >= 0 && r.copy_mass_kept <= 1 + 1e-9 &&
                        r.copy_keys_selected >= 0 && r.copy_keys_selected <= 1,
                    "block: density %g, kept %g, keys %g", r.density_used, r.copy_mass_kept, r.copy_keys_selected);
    }
    /* the check tells a wrong span apart: the losses of the first copy read one row later */
    {
        dhsa_eval_copy_result r;
        dhsa_eval_copy_layout off = at;
        off.first += 1;
        dhsa_eval_copy(ctx, m, &me[0], ids, &off, &r);
        run_logits(ctx, m, &me[0], ids, L, lg);
        T_CHECK(fabs(r.first_loss - span_loss(lg, V, ids, at.first, P)) > 1e-6, "a shifted span gives other losses");
    }
    dhsa_eval_copy_layout bad = at;
    bad.second = bad.first + 3;
    dhsa_eval_copy_result r;
    T_CHECK(dhsa_eval_copy(ctx, m, &me[0], ids, &bad, &r) == DHSA_ERR_INVALID_ARG, "overlapping copies refused");
    free(lg);
    free(voc);
    free(fill);
    free(again);
}

int main(void) {
    dhsa_ctx *ctx = NULL;
    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = 2;
    if (dhsa_ctx_create(&cp, &ctx)) {
        fprintf(stderr, "ctx: %s\n", dhsa_last_error());
        return 1;
    }
    dhsa_router_params rp = dhsa_eval_router_params(512, 0.125), rq = dhsa_eval_router_params(2048, 0.25);
    T_CHECK(rp.q_block == 16 && rp.sink_tokens == 4 && rp.local_tokens == 16 && rp.dense_below == 0 &&
                rp.min_chunk == 8 && rp.max_chunk == 32 && rp.chunk == 16 && rp.sim_window == 8 &&
                rp.nms_window == 4 && rp.density == 0.125 && rp.score_mode == DHSA_SCORE_MOMENTS &&
                rp.score_rows == 4 && rq.local_tokens == 64 && rq.density == 0.25,
            "the eval routing (dhsa_router_params_for: docs/dhsa.md, \"One set of routing defaults\")");
    test_probe(ctx);
    const char *path = getenv("DHSA_TEST_MODEL") ? getenv("DHSA_TEST_MODEL") : MODEL_DEFAULT;
    dhsa_model *m = NULL;
    dhsa_model_params mp = dhsa_model_default_params();
    if (dhsa_model_load(path, &mp, &m) == DHSA_OK) {
        test_fidelity(ctx, m);
        test_fidelity_steps(ctx, m);
        test_answers(ctx, m);
        test_niah(m);
        test_copy(ctx, m);
        dhsa_model_free(m);
    } else {
        T_CHECK(0, "the shipped model %s: %s", path, dhsa_last_error());
    }
    dhsa_ctx_free(ctx);
    return t_report("test_eval_lib");
}
