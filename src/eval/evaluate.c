/* evaluate.c: the measurements of `dhsa eval` as library calls (contract
 * in include/dhsa.h, "Evaluation" block; the method in docs/eval.md):
 * fidelity against dense over windows of a text, a greedy answer under a
 * method, and a retrieval task's answer scored with the per-miss
 * explanation (which layers' layouts selected the needle's keys at the row
 * that went wrong). The layer hook is src/eval/probe.c. The CLI
 * (tools/eval.c) and the Python binding (python/dhsa/_eval.py) print or
 * return these numbers. Tested by tests/test_eval_lib.c (independent
 * computations), tests/test_eval.c (the CLI) and
 * python/tests/test_eval_lib.py (the binding against the CLI).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "dhsa.h"
#include "eval/niah.h"
#include "eval/probe.h"

dhsa_router_params dhsa_eval_router_params(int64_t L, double density) {
    return dhsa_router_params_for(L, density); /* one set of defaults for every entry point */
}

dhsa_eval_fidelity_params dhsa_eval_fidelity_default_params(void) {
    dhsa_eval_fidelity_params p;
    memset(&p, 0, sizeof p);
    p.max_windows = 8;
    p.recall = 1;
    return p;
}

dhsa_eval_answer_params dhsa_eval_answer_default_params(void) {
    dhsa_eval_answer_params p;
    memset(&p, 0, sizeof p);
    p.method.attn = DHSA_ATTN_DENSE;
    p.method.router = dhsa_eval_router_params(0, 0.125);
    return p;
}

/* ------------------------------------------------------------- helpers --- */

/* Session parameters of a method for a cache of n_ctx tokens. */
static dhsa_session_params method_session(const dhsa_eval_method *me, int64_t n_ctx, int logits_all,
                                          int (*hook)(void *, int64_t, const dhsa_attn_desc *), void *user) {
    dhsa_session_params sp = dhsa_session_default_params();
    sp.n_ctx = n_ctx;
    sp.attn = me->attn;
    sp.router = me->router;
    sp.logits_all = logits_all;
    sp.layer_hook = hook;
    sp.layer_hook_user = user;
    return sp;
}

/* log-softmax of one row into lp (double). */
static void log_softmax(const float *x, int64_t V, double *lp) {
    double mx = -INFINITY;
    for (int64_t i = 0; i < V; i++)
        if (x[i] > mx) mx = x[i];
    double s = 0;
    for (int64_t i = 0; i < V; i++) s += exp((double)x[i] - mx);
    double lse = mx + log(s);
    for (int64_t i = 0; i < V; i++) lp[i] = (double)x[i] - lse;
}

static int64_t argmax_f(const float *x, int64_t V) {
    int64_t b = 0;
    for (int64_t i = 1; i < V; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static dhsa_status check_methods(const dhsa_eval_method *methods, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (methods[i].attn < DHSA_ATTN_DENSE || methods[i].attn > DHSA_ATTN_ORACLE)
            return dhsa__fail(DHSA_ERR_INVALID_ARG, "method %lld: attn %d is not a dhsa_attn_method", (long long)i,
                              (int)methods[i].attn);
    return DHSA_OK;
}

/* ------------------------------------------------------------ fidelity --- */

dhsa_status dhsa_eval_fidelity(dhsa_ctx *ctx, dhsa_model *m, const int32_t *ids, int64_t n_ids,
                               const dhsa_eval_fidelity_params *p, const dhsa_eval_method *methods,
                               int64_t n_methods, dhsa_eval_fidelity_result *results,
                               dhsa_eval_fidelity_info *info) {
    if (!ctx || !m || !p || (n_methods > 0 && (!methods || !results)) || (n_ids > 0 && !ids))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_eval_fidelity: ctx, model, params, ids and (with methods) "
                          "methods and results must not be NULL");
    if (n_methods < 0 || n_ids < 0)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_eval_fidelity: %lld methods, %lld ids: negative",
                          (long long)n_methods, (long long)n_ids);
    dhsa_status st = check_methods(methods, n_methods);
    if (st) return st;
    const dhsa_model_info *in = dhsa_model_get_info(m);
    const dhsa_tokenizer *tok = dhsa_model_tokenizer(m);
    const int64_t V = in->n_vocab, NL = in->n_layer;
    if (p->window < 0 || p->window == 1 || p->max_windows < 1)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "fidelity windows of %lld tokens, at most %lld of them: the window "
                          "must be >= 2 (0: the trained context) and max_windows >= 1", (long long)p->window,
                          (long long)p->max_windows);
    for (int64_t i = 0; i < n_ids; i++)
        if (ids[i] < 0 || ids[i] >= V)
            return dhsa__fail(DHSA_ERR_INVALID_ARG, "ids[%lld] = %d is not a token of the model's %lld", (long long)i,
                              (int)ids[i], (long long)V);
    int32_t bos = tok ? dhsa_tokenizer_bos(tok) : -1;
    const int64_t W = p->window ? p->window : in->n_ctx_train, body = bos >= 0 ? W - 1 : W;
    int64_t n_win = n_ids / body;
    if (n_win > p->max_windows) n_win = p->max_windows;
    if (n_win == 0)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "the text has %lld tokens: fewer than one window of %lld",
                          (long long)n_ids, (long long)W);
    for (int64_t vi = 0; vi < n_methods; vi++) {
        double *rec = results[vi].recall;
        memset(&results[vi], 0, sizeof results[vi]);
        results[vi].recall = rec;
        if (rec)
            for (int64_t l = 0; l < NL; l++) rec[l] = p->recall ? 0.0 : NAN;
    }
    /* dense and every method run side by side over the window, one
     * ubatch at a time (the step each session takes anyway: the same
     * results as one call over the window), so only one ubatch of logits
     * per side is held: 2 x U x V floats, not 2 x W x V (a 16K window of a
     * 262K vocabulary would be 34 GB) */
    const int64_t U = W < 512 ? W : 512;
    float *ld = malloc((size_t)U * (size_t)V * sizeof(float)), *lm = malloc((size_t)U * (size_t)V * sizeof(float));
    double *pd = malloc((size_t)V * sizeof(double)), *pm = malloc((size_t)V * sizeof(double));
    int32_t *win = malloc((size_t)W * sizeof(int32_t));
    /* per method: sums over predicted positions (the means at the end) */
    double *sums = calloc((size_t)(n_methods > 0 ? n_methods : 1) * 9, sizeof(double));
    dhsa__probe *acc = calloc((size_t)(n_methods > 0 ? n_methods : 1), sizeof *acc);
    dhsa_session **sm = calloc((size_t)(n_methods + 1), sizeof *sm);
    if (!ld || !lm || !pd || !pm || !win || !sums || !acc || !sm) {
        st = dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory for fidelity's logits (2 x %lld x %lld floats)",
                        (long long)U, (long long)V);
        goto done;
    }
    for (int64_t vi = 0; vi < n_methods && !st; vi++) st = dhsa__probe_init(&acc[vi], ctx, NL, p->recall);
    if (st) goto done;
    double dense_nll = 0, dense_n = 0;
    for (int64_t w = 0; w < n_win && !st; w++) {
        int64_t n = 0;
        if (bos >= 0) win[n++] = bos;
        memcpy(win + n, ids + w * body, (size_t)body * sizeof(int32_t));
        n += body;
        /* sm[0] dense, sm[1 + vi] method vi */
        dhsa_eval_method dense = {DHSA_ATTN_DENSE, dhsa_eval_router_params(W, 1.0)};
        dhsa_session_params sp = method_session(&dense, W, 1, NULL, NULL);
        sp.n_ubatch = U;
        st = dhsa_session_create(ctx, m, &sp, &sm[0]);
        for (int64_t vi = 0; vi < n_methods && !st; vi++) {
            dhsa__probe_clear(&acc[vi]);
            acc[vi].late_from = n / 2;
            sp = method_session(&methods[vi], W, 1, dhsa__probe_hook, &acc[vi]);
            sp.n_ubatch = U;
            st = dhsa_session_create(ctx, m, &sp, &sm[1 + vi]);
        }
        for (int64_t t0 = 0; t0 < n && !st; t0 += U) {
            const int64_t u = n - t0 < U ? n - t0 : U;
            st = dhsa_session_eval(sm[0], win + t0, u, ld);
            if (st) break;
            for (int64_t t = t0; t < t0 + u && t + 1 < n; t++) {
                log_softmax(ld + (t - t0) * V, V, pd);
                dense_nll -= pd[win[t + 1]];
                dense_n += 1;
            }
            for (int64_t vi = 0; vi < n_methods && !st; vi++) {
                double *r = sums + vi * 9; /* kl top1 nll nll_dense n kl2 top1_2 n2 (unused) */
                st = dhsa_session_eval(sm[1 + vi], win + t0, u, lm);
                if (st) {
                    st = dhsa__probe_fail(&acc[vi], st);
                    break;
                }
                for (int64_t t = t0; t < t0 + u && t + 1 < n; t++) {
                    const float *xd = ld + (t - t0) * V, *xm = lm + (t - t0) * V;
                    log_softmax(xd, V, pd);
                    log_softmax(xm, V, pm);
                    double kl = 0;
                    for (int64_t v = 0; v < V; v++) kl += exp(pd[v]) * (pd[v] - pm[v]);
                    int agree = argmax_f(xd, V) == argmax_f(xm, V);
                    r[0] += kl;
                    r[1] += agree;
                    r[2] -= pm[win[t + 1]];
                    r[3] -= pd[win[t + 1]];
                    r[4] += 1;
                    if (t >= n / 2) {
                        r[5] += kl;
                        r[6] += agree;
                        r[7] += 1;
                    }
                }
            }
        }
        for (int64_t i = 0; i <= n_methods; i++) {
            dhsa_session_free(sm[i]);
            sm[i] = NULL;
        }
        if (st) break;
        /* density and recall: means over windows */
        for (int64_t vi = 0; vi < n_methods; vi++) {
            dhsa_eval_fidelity_result *res = &results[vi];
            res->density_used += dhsa__probe_density(&acc[vi]) / (double)n_win;
            res->density_used_late += dhsa__probe_late_density(&acc[vi]) / (double)n_win;
            if (res->recall && p->recall)
                for (int64_t l = 0; l < NL; l++) res->recall[l] += dhsa__probe_recall(&acc[vi], l) / (double)n_win;
        }
    }
    if (st) goto done;
    for (int64_t vi = 0; vi < n_methods; vi++) {
        const double *r = sums + vi * 9;
        dhsa_eval_fidelity_result *res = &results[vi];
        res->kl = r[0] / r[4];
        res->top1 = r[1] / r[4];
        res->ppl = exp(r[2] / r[4]);
        res->ppl_dense = exp(r[3] / r[4]);
        res->kl_late = r[5] / r[7];
        res->top1_late = r[6] / r[7];
        res->n_predicted = (int64_t)r[4];
        res->n_predicted_late = (int64_t)r[7];
    }
    if (info) {
        info->window = W;
        info->n_windows = n_win;
        info->n_text = n_ids;
        info->n_predicted = (int64_t)dense_n;
        info->ppl_dense = exp(dense_nll / dense_n);
    }
done:
    for (int64_t vi = 0; acc && vi < n_methods; vi++) dhsa__probe_free(&acc[vi]);
    free(acc);
    free(sm);
    free(ld);
    free(lm);
    free(pd);
    free(pm);
    free(win);
    free(sums);
    return st;
}

/* -------------------------------------------------------------- answers --- */

/* What the retrieval hook records besides the probe: for the query rows
 * that produce the answer (from = the prompt's last, then each token fed
 * back), the share of the asked numbers' keys each layer's layout selects,
 * averaged over KV heads; per layer the least over those rows (sel) and
 * the share at each of the first DHSA_EVAL_ANSWER_ROWS of them (at). */
typedef struct {
    dhsa__probe *acc;
    /* the needle: key ranges [span_lo, span_hi) of the prompt (n_spans 0:
     * none, dhsa_eval_generate) */
    int n_spans;
    const int64_t *span_lo, *span_hi;
    int64_t from, n_layer;
    /* chunk lengths: the method's boundaries over the prompt's keys, at the
     * call holding the prompt's last row (rp NULL: no chunks, dense,
     * stream or oracle) */
    dhsa_ctx *ctx;
    const dhsa_router_params *rp;
    double chunk_keys, chunks;
    double sel[DHSA_EVAL_MAX_LAYERS];
    double at[DHSA_EVAL_MAX_LAYERS][DHSA_EVAL_ANSWER_ROWS];
    int routed[DHSA_EVAL_MAX_LAYERS]; /* a layout was seen: the layer routes */
} answer_hook;

static int answer_hook_fn(void *user, int64_t layer, const dhsa_attn_desc *a) {
    answer_hook *h = user;
    if (dhsa__probe_hook(h->acc, layer, a)) return 1;
    const int64_t Lk = a->k.shape[2];
    /* sliding-window layers (gemma's) are not routed: no chunks to count,
     * and their keys may start past position 0 (a ring) */
    if (h->rp && !a->window && a->q_pos0 <= h->from && h->from < a->q_pos0 + a->q.shape[2] && Lk > 0) {
        int64_t nc = 0;
        if (dhsa_route_boundaries(h->ctx, h->rp, a, 0, NULL, 0, &nc)) return 1;
        h->chunk_keys += (double)Lk;
        h->chunks += (double)nc;
    }
    if (!h->n_spans || layer < 0 || layer >= h->n_layer || layer >= DHSA_EVAL_MAX_LAYERS) return 0;
    const int64_t n = a->q.shape[2], Hkv = a->k.shape[1];
    if (a->layout && a->q_pos0 + n > h->from) h->routed[layer] = 1;
    for (int64_t i = 0; i < n; i++) {
        if (a->q_pos0 + i < h->from) continue;
        double s = 0;
        for (int64_t g = 0; g < Hkv; g++) s += dhsa__spans_selected(a->layout, g, i, h->n_spans, h->span_lo, h->span_hi);
        s /= (double)Hkv;
        if (s < h->sel[layer]) h->sel[layer] = s;
        int64_t k = a->q_pos0 + i - h->from;
        if (k < DHSA_EVAL_ANSWER_ROWS) h->at[layer][k] = s;
    }
    return 0;
}

/* Index of the first answer token whose text leaves the expected answer
 * (the row that produced it is the one whose routing explains a miss);
 * n when the n tokens all agree with it. */
static int64_t first_wrong_token(const dhsa_tokenizer *tok, const int32_t *ans, int64_t n, const char *want) {
    char text[512];
    int64_t len = 0, wl = (int64_t)strlen(want);
    for (int64_t k = 0; k < n; k++) {
        int64_t pl = 0;
        if (dhsa_detokenize(tok, ans + k, 1, DHSA_DETOKENIZE_KEEP_SPACE, text + len, (int64_t)sizeof text - 1 - len,
                            &pl) || len + pl >= (int64_t)sizeof text - 1)
            return k;
        int64_t cmp = len + pl < wl ? len + pl : wl;
        if (memcmp(text, want, (size_t)cmp) != 0) return k;
        len += pl;
        if (len >= wl) return n;
    }
    return n;
}

/* The greedy answer of dhsa_eval_generate / _retrieval / _ruler; with a
 * task (its numbers' spans) or a RULER prompt (its spans), the needle's
 * selection per layer and the score. */
static dhsa_status answer(dhsa_ctx *ctx, dhsa_model *m, const int32_t *ids, int64_t n_ids, const dhsa_task *task,
                          const dhsa_ruler_prompt *pr, const dhsa_eval_answer_params *p, unsigned detok_flags,
                          int64_t cap, dhsa_eval_answer *out) {
    const dhsa_model_info *in = dhsa_model_get_info(m);
    const dhsa_tokenizer *tok = dhsa_model_tokenizer(m);
    const int64_t V = in->n_vocab, NL = in->n_layer;
    memset(out, 0, sizeof *out);
    out->hit = -1;
    if (n_ids < 1 || !ids) return dhsa__fail(DHSA_ERR_INVALID_ARG, "an answer needs a prompt of at least one token");
    if (cap < 1 || cap > (int64_t)1 << 20)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "max_tokens %lld: an answer has 1 .. %lld tokens", (long long)cap,
                          (long long)1 << 20);
    if (p->n_stop < 0 || (p->n_stop > 0 && !p->stop))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "%d stop ids given without an array", p->n_stop);
    dhsa_status st = check_methods(&p->method, 1);
    if (st) return st;
    int32_t eos = tok ? dhsa_tokenizer_eos(tok) : -1;
    const int32_t *stop = p->stop ? p->stop : &eos;
    int n_stop = p->stop ? p->n_stop : 1;
    float *lg = malloc((size_t)V * sizeof(float));
    int32_t *ans = malloc((size_t)cap * sizeof(int32_t));
    answer_hook *rh = calloc(1, sizeof *rh);
    dhsa__probe acc;
    memset(&acc, 0, sizeof acc);
    dhsa_session *s = NULL;
    if (!lg || !ans || !rh) {
        st = dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory for an answer of %lld tokens", (long long)cap);
        goto done;
    }
    st = dhsa__probe_init(&acc, ctx, NL, 0);
    if (st) goto done;
    rh->acc = &acc;
    if (task) {
        rh->n_spans = task->n_spans;
        rh->span_lo = task->span_lo;
        rh->span_hi = task->span_hi;
    } else if (pr) {
        rh->n_spans = pr->n_spans;
        rh->span_lo = pr->span_lo;
        rh->span_hi = pr->span_hi;
    }
    rh->n_layer = NL;
    rh->from = n_ids - 1;
    /* the boundaries the session's indexes cut (session.c method_router) */
    dhsa_router_params crp = p->method.router;
    crp.causal_boundaries = 1;
    if (p->method.attn == DHSA_ATTN_BLOCK) crp.boundary = DHSA_BOUNDARY_FIXED;
    else if (crp.boundary == DHSA_BOUNDARY_FIXED) crp.boundary = DHSA_BOUNDARY_SIMILARITY;
    if (p->method.attn == DHSA_ATTN_DHSA || p->method.attn == DHSA_ATTN_BLOCK) {
        rh->ctx = ctx;
        rh->rp = &crp;
    }
    for (int64_t l = 0; l < NL && l < DHSA_EVAL_MAX_LAYERS; l++) rh->sel[l] = 1.0;
    dhsa_session_params sp = method_session(&p->method, p->n_ctx > 0 ? p->n_ctx : n_ids + cap, 0, answer_hook_fn, rh);
    st = dhsa_session_create(ctx, m, &sp, &s);
    if (st) goto done;
    st = dhsa_session_eval(s, ids, n_ids, lg);
    if (st) {
        st = dhsa__probe_fail(&acc, st);
        goto done;
    }
    int64_t na = 0;
    while (na < cap) {
        int32_t next = (int32_t)argmax_f(lg, V);
        int stopped = 0;
        for (int k = 0; k < n_stop; k++) stopped |= next == stop[k];
        if (stopped) break;
        ans[na++] = next;
        if (na == cap) break;
        st = dhsa_session_eval(s, &next, 1, lg);
        if (st) {
            st = dhsa__probe_fail(&acc, st);
            goto done;
        }
    }
    int64_t alen = 0;
    if (dhsa_detokenize(tok, ans, na, detok_flags, out->text, (int64_t)sizeof out->text - 1, &alen)) alen = 0;
    if (alen > (int64_t)sizeof out->text - 1) alen = (int64_t)sizeof out->text - 1;
    out->text[alen] = 0;
    out->n_tokens = na;
    out->density_used = dhsa__probe_density(&acc);
    out->mean_chunk = rh->chunks > 0 ? rh->chunk_keys / rh->chunks : 0.0;
    if (task || pr) {
        /* RULER: scored by its own rule; explained at the prompt's last row */
        out->hit = task ? dhsa_task_check(task, out->text, alen) : dhsa_ruler_score(pr, out->text, alen) >= 1.0;
        out->first_wrong = task ? first_wrong_token(tok, ans, na, task->answer) : 0;
        int64_t k = out->first_wrong < DHSA_EVAL_ANSWER_ROWS ? out->first_wrong : DHSA_EVAL_ANSWER_ROWS - 1;
        out->n_layer = NL < DHSA_EVAL_MAX_LAYERS ? NL : DHSA_EVAL_MAX_LAYERS;
        double smin = 1, smax = 0;
        for (int64_t l = 0; l < out->n_layer; l++) {
            if (!rh->n_spans) { /* nothing to explain by (CWE, FWE) */
                out->needle_selected[l] = out->selected_at_wrong[l] = 1;
                continue;
            }
            out->needle_selected[l] = rh->sel[l];
            out->selected_at_wrong[l] = rh->at[l][k];
            if (!rh->routed[l]) continue; /* a layer that reads all it may: not the routing's doing */
            smin = rh->at[l][k] < smin ? rh->at[l][k] : smin;
            smax = rh->at[l][k] > smax ? rh->at[l][k] : smax;
        }
        out->needle = smin >= 1.0 ? DHSA_EVAL_NEEDLE_EVERYWHERE : smax > 0 ? DHSA_EVAL_NEEDLE_PARTLY
                                                                           : DHSA_EVAL_NEEDLE_NOWHERE;
    }
done:
    dhsa_session_free(s);
    dhsa__probe_free(&acc);
    free(lg);
    free(ans);
    free(rh);
    return st;
}

dhsa_status dhsa_eval_generate(dhsa_ctx *ctx, dhsa_model *m, const int32_t *ids, int64_t n_ids,
                               const dhsa_eval_answer_params *p, dhsa_eval_answer *out) {
    if (!ctx || !m || !p || !out)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_eval_generate: ctx, model, params and out must not be NULL");
    if (p->max_tokens < 0)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "max_tokens %lld: negative (0 = the default)", (long long)p->max_tokens);
    return answer(ctx, m, ids, n_ids, NULL, NULL, p, p->detok_flags, p->max_tokens > 0 ? p->max_tokens : 12, out);
}

dhsa_status dhsa_eval_retrieval(dhsa_ctx *ctx, dhsa_model *m, const dhsa_task *t, const dhsa_eval_answer_params *p,
                                dhsa_eval_answer *out) {
    if (!ctx || !m || !t || !p || !out)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_eval_retrieval: ctx, model, task, params and out must not be "
                          "NULL");
    if (!t->ids || t->n_ids < 1) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_eval_retrieval: the task is empty");
    if (p->max_tokens < 0)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "max_tokens %lld: negative (0 = the default)", (long long)p->max_tokens);
    int64_t cap = p->max_tokens > 0 ? p->max_tokens : t->n_numbers > 1 ? 40 : 12;
    return answer(ctx, m, t->ids, t->n_ids, t, NULL, p, p->detok_flags | DHSA_DETOKENIZE_KEEP_SPACE, cap, out);
}

dhsa_status dhsa_eval_ruler(dhsa_ctx *ctx, dhsa_model *m, const dhsa_ruler_prompt *pr, const dhsa_eval_answer_params *p,
                            dhsa_eval_answer *out) {
    if (!ctx || !m || !pr || !p || !out)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_eval_ruler: ctx, model, prompt, params and out must not be NULL");
    if (!pr->ids || pr->n_ids < 1) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_eval_ruler: the prompt is empty");
    if (pr->n_spans < 0 || pr->n_spans > DHSA_RULER_MAX_SPANS)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_eval_ruler: %d spans (0 .. %d)", pr->n_spans,
                          DHSA_RULER_MAX_SPANS);
    for (int s = 0; s < pr->n_spans; s++)
        if (pr->span_lo[s] < 0 || pr->span_hi[s] <= pr->span_lo[s] || pr->span_hi[s] > pr->n_ids)
            return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_eval_ruler: span %d [%lld, %lld) is outside the prompt's "
                              "%lld ids", s, (long long)pr->span_lo[s], (long long)pr->span_hi[s], (long long)pr->n_ids);
    if (p->max_tokens < 0)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "max_tokens %lld: negative (0 = the prompt's answer budget)",
                          (long long)p->max_tokens);
    dhsa_eval_answer_params q = *p;
    if (!q.stop) {
        q.stop = pr->stop;
        q.n_stop = pr->n_stop;
    }
    int64_t cap = q.max_tokens > 0 ? q.max_tokens : pr->answer_tokens > 0 ? pr->answer_tokens : 128;
    return answer(ctx, m, pr->ids, pr->n_ids, NULL, pr, &q, q.detok_flags, cap, out);
}
