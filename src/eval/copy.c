/* copy.c: `dhsa eval copy` as library calls (contract in include/dhsa.h,
 * "Evaluation" block: dhsa_eval_copy_sequence, dhsa_eval_copy,
 * dhsa_eval_sample_tokens, dhsa_eval_passage_tokens; the method in
 * docs/eval.md, "eval copy"): a passage, filler, the passage again; the
 * loss on both copies and, through the layer hook (src/eval/probe.c), the
 * attention of the repetition's queries on the first copy. Tested by
 * tests/test_eval_lib.c (the sequence by hand, the losses against a full
 * logits_all eval scored in the test, dense keeping all of its own mass)
 * and, through the CLI, by tests/test_eval.c.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "dhsa.h"
#include "eval/probe.h"

dhsa_status dhsa_eval_sample_tokens(dhsa_ctx *ctx, dhsa_model *m, int64_t n, uint64_t seed, int32_t *out) {
    if (!ctx || !m || (n > 0 && !out) || n < 0)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_eval_sample_tokens: ctx, model and out must be given, n >= 0");
    const dhsa_model_info *in = dhsa_model_get_info(m);
    const dhsa_tokenizer *tok = dhsa_model_tokenizer(m);
    const int64_t piece = 256, V = in->n_vocab;
    int32_t bos = tok ? dhsa_tokenizer_bos(tok) : -1, eos = tok ? dhsa_tokenizer_eos(tok) : -1;
    dhsa_sampler_params smp = dhsa_sampler_default_params();
    smp.temperature = 1.0f;
    float *lg = malloc((size_t)V * sizeof(float));
    if (!lg) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory for %lld logits", (long long)V);
    dhsa_status st = DHSA_OK;
    int64_t got = 0, empty_rounds = 0;
    for (uint64_t round = 0; got < n && !st; round++) {
        smp.seed = seed * 1000003u + round;
        dhsa_sampler *s = NULL;
        dhsa_session *ses = NULL;
        dhsa_session_params sp = dhsa_session_default_params();
        sp.n_ctx = piece + 1;
        st = dhsa_sampler_create(&smp, V, &s);
        if (!st) st = dhsa_session_create(ctx, m, &sp, &ses);
        int32_t cur = bos >= 0 ? bos : 0;
        int64_t before = got;
        for (int64_t i = 0; i < piece && got < n && !st; i++) {
            st = dhsa_session_eval(ses, &cur, 1, lg);
            if (!st) st = dhsa_sampler_sample(s, lg, NULL, 0, &cur);
            if (!st && cur != bos && cur != eos) out[got++] = cur;
        }
        dhsa_session_free(ses);
        dhsa_sampler_free(s);
        /* a model that only ever says BOS / EOS would loop for ever */
        empty_rounds = got == before ? empty_rounds + 1 : 0;
        if (!st && empty_rounds >= 16)
            st = dhsa__fail(DHSA_ERR_INVALID_ARG, "the model sampled only BOS / EOS in 16 pieces of %lld tokens: no "
                            "text to sample", (long long)piece);
    }
    free(lg);
    return st;
}

dhsa_status dhsa_eval_passage_tokens(const dhsa_tokenizer *tok, int words, int32_t *out, int64_t cap, int64_t *n) {
    if (!tok || !n || (cap > 0 && !out) || cap < 0)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_eval_passage_tokens: tokenizer and n must be given, cap >= 0");
    const int64_t V = dhsa_tokenizer_n_vocab(tok);
    int64_t c = 0;
    for (int32_t id = 0; id < V; id++) {
        if (dhsa_tokenizer_type(tok, id) != DHSA_TOKEN_NORMAL) continue;
        if (words) { /* whole words: an SPM piece "\u2581" + 2 or more letters */
            int64_t tl = 0;
            const char *t = dhsa_tokenizer_text(tok, id, &tl);
            if (!t || tl < 5 || memcmp(t, "\xe2\x96\x81", 3) != 0) continue;
            int letters = 1;
            for (int64_t k = 3; k < tl; k++)
                letters &= (t[k] >= 'a' && t[k] <= 'z') || (t[k] >= 'A' && t[k] <= 'Z');
            if (!letters) continue;
        }
        if (c < cap) out[c] = id;
        c++;
    }
    *n = c;
    return c > cap ? dhsa__fail(DHSA_ERR_INVALID_ARG, "%lld passage tokens, room for %lld", (long long)c,
                                (long long)cap)
                   : DHSA_OK;
}

dhsa_status dhsa_eval_copy_sequence(const int32_t *filler, int64_t n_filler, const int32_t *passage, int64_t P,
                                    int64_t L, double depth, int32_t bos, int32_t *ids, dhsa_eval_copy_layout *at) {
    if (!filler || !passage || !ids || !at)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_eval_copy_sequence: filler, passage, ids and at must be given");
    const int64_t head = bos >= 0 ? 1 : 0;
    if (P < 2 || L < 2 * P + 2)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "length %lld is too short for two passages of %lld tokens",
                          (long long)L, (long long)P);
    if (!(depth >= 0 && depth <= 1)) return dhsa__fail(DHSA_ERR_INVALID_ARG, "copy depth %g is not in [0, 1]", depth);
    const int64_t fill = L - head - 2 * P, f1 = (int64_t)llround(depth * (double)fill);
    if (n_filler < fill)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "%lld filler tokens for a copy sequence that needs %lld",
                          (long long)n_filler, (long long)fill);
    int64_t n = 0;
    if (bos >= 0) ids[n++] = bos;
    memcpy(ids + n, filler, (size_t)f1 * sizeof(int32_t));
    n += f1;
    at->first = n;
    memcpy(ids + n, passage, (size_t)P * sizeof(int32_t));
    n += P;
    memcpy(ids + n, filler + f1, (size_t)(fill - f1) * sizeof(int32_t));
    n += fill - f1;
    at->second = n;
    memcpy(ids + n, passage, (size_t)P * sizeof(int32_t));
    n += P;
    at->passage = P;
    at->n_ids = n;
    /* control: filler keys as far from the repetition, after the copy (else before) */
    at->control = at->second - at->first - P >= P ? at->first + P : at->first >= P ? at->first - P : 0;
    return DHSA_OK;
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

/* Rows of logits kept at once (rounded to the query block). */
#define COPY_ROWS 64

dhsa_status dhsa_eval_copy(dhsa_ctx *ctx, dhsa_model *m, const dhsa_eval_method *me, const int32_t *ids,
                           const dhsa_eval_copy_layout *at, dhsa_eval_copy_result *r) {
    if (!ctx || !m || !me || !ids || !at || !r)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_eval_copy: ctx, model, method, ids, at and r must be given");
    const int64_t n = at->n_ids, P = at->passage;
    if (P < 2 || at->first < 0 || at->first + P > at->second || at->second + P > n || at->control < 0 ||
        at->control + P > n)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "copy spans: passage %lld at %lld and %lld, control %lld, in %lld ids: "
                          "the copies must not overlap and every span must lie in the sequence", (long long)P,
                          (long long)at->first, (long long)at->second, (long long)at->control, (long long)n);
    if (me->attn < DHSA_ATTN_DENSE || me->attn > DHSA_ATTN_ORACLE)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "attn %d is not a dhsa_attn_method", (int)me->attn);
    const int64_t V = dhsa_model_get_info(m)->n_vocab, NL = dhsa_model_get_info(m)->n_layer;
    memset(r, 0, sizeof *r);
    dhsa__probe acc;
    dhsa_status st = dhsa__probe_init(&acc, ctx, NL, 0);
    if (st) return st;
    acc.copy_at1 = at->first;
    acc.copy_at2 = at->second;
    acc.copy_len = P;
    acc.copy_ctl = at->control;
    dhsa_session_params sp = dhsa_session_default_params();
    sp.n_ctx = n;
    sp.attn = me->attn;
    sp.router = me->router;
    sp.logits_all = 1;
    sp.layer_hook = dhsa__probe_hook;
    sp.layer_hook_user = &acc;
    dhsa_session *s = NULL;
    float *lg = NULL;
    double *lp = malloc((size_t)V * sizeof(double));
    st = lp ? dhsa_session_create(ctx, m, &sp, &s) : dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory");
    if (st) goto done;
    /* The logits of rows [at_c, at_c + P - 1) only, in pieces of COPY_ROWS
     * rows (whole query blocks), the rest without the output projection.
     * The pieces keep a single eval's partition: they never cross one of
     * its ubatch boundaries and start at one of its query blocks, so every
     * block is routed as in one dhsa_session_eval over ids. The oracle's
     * chunk boundaries depend on the whole ubatch: it runs in whole
     * ubatches. */
    const int64_t U = dhsa_session_get_plan(s)->n_ubatch, pos_at[2] = {at->first, at->second};
    int64_t qb = sp.router.q_block > 0 ? sp.router.q_block : 1, rows = qb >= COPY_ROWS ? qb : COPY_ROWS / qb * qb;
    if (sp.attn == DHSA_ATTN_ORACLE) qb = rows = U;
    lg = malloc((size_t)rows * (size_t)V * sizeof(float));
    if (!lg) {
        st = dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory for %lld rows of logits", (long long)rows);
        goto done;
    }
    double loss[2] = {0, 0};
    for (int64_t pos = 0; pos < n;) {
        int64_t ub0 = pos / U * U, ub_end = ub0 + U < n ? ub0 + U : n, next = n;
        for (int c = 0; c < 2; c++) { /* the first row >= pos whose logits a loss reads */
            int64_t lo = pos_at[c] > pos ? pos_at[c] : pos;
            if (lo < pos_at[c] + P - 1 && lo < next) next = lo;
        }
        int64_t start = next >= ub_end ? ub_end : ub0 + (next - ub0) / qb * qb;
        if (start > pos) { /* no row read here: no logits */
            st = dhsa_session_eval(s, ids + pos, start - pos, NULL);
            if (st) {
                st = dhsa__probe_fail(&acc, st);
                goto done;
            }
            pos = start;
            continue;
        }
        int64_t end = pos + rows < ub_end ? pos + rows : ub_end;
        st = dhsa_session_eval(s, ids + pos, end - pos, lg);
        if (st) {
            st = dhsa__probe_fail(&acc, st);
            goto done;
        }
        for (int64_t row = pos; row < end; row++) /* row predicts token row + 1 */
            for (int c = 0; c < 2; c++)
                if (row >= pos_at[c] && row < pos_at[c] + P - 1) {
                    log_softmax(lg + (row - pos) * V, V, lp);
                    loss[c] -= lp[ids[row + 1]];
                }
        pos = end;
    }
    r->first_loss = loss[0] / (double)(P - 1);
    r->rep_loss = loss[1] / (double)(P - 1);
    r->score = r->first_loss - r->rep_loss;
    r->density_used = dhsa__probe_density(&acc);
    r->copy_keys_selected = acc.copy_cover / acc.copy_cover_n;
    r->copy_mass = acc.copy_mass / acc.copy_rows;
    r->copy_mass_kept = acc.copy_mass > 0 ? acc.copy_kept / acc.copy_mass : 1.0;
    r->control_mass = acc.copy_ctl_mass / acc.copy_rows;
done:
    dhsa_session_free(s);
    dhsa__probe_free(&acc);
    free(lg);
    free(lp);
    return st;
}
