/* test_session_batch.c: dhsa_session_eval_batch (include/dhsa.h): one
 * decode step for several sessions in one pass over the weights, as dhsa
 * serve batches its slots.
 *
 * On the default model: four sessions with prompts of 10, 37, 64 and 150
 * tokens, attending dense, dhsa, block and stream (routing active:
 * dense_below 0, a budget of 48 keys), each with a twin that decodes
 * alone (dhsa_session_eval of one token). Eight batched steps, each
 * feeding every session its twin's greedy token: every session's logits
 * must match its twin's within 1e-4 + 1e-4 |ref| (the weight products over
 * four rows round differently from one row) with the same argmax, and
 * lengths must advance by one. Then the failures: the same session twice,
 * an id out of range (nothing added to any session; the next batch still
 * matches), more sessions than the first one's ubatch, a NULL session.
 *
 * Run: make build/tests/test_session_batch && build/tests/test_session_batch
 * (from the repository root). Ends with "test_session_batch: P passed, F failed, S skipped".
 */
#include "dhsa.h"
#include "t.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MODEL "models/dhsa-retrieval-8m.gguf"
#define NS 4
#define STEPS 8

static int64_t make_ids(const dhsa_model *m, int32_t *ids, int64_t n) {
    int64_t ns = 0;
    const char *const *sent = dhsa_task_builtin_sentences(&ns);
    char text[16384] = "";
    size_t len = 0;
    for (int64_t i = 0; len + 512 < sizeof text && ns > 0; i++) {
        int w = snprintf(text + len, sizeof text - len, "%s ", sent[(i * 3 + 1) % ns]);
        if (w < 0) break;
        len += (size_t)w;
    }
    const dhsa_tokenizer *tok = dhsa_model_tokenizer(m);
    int64_t got = 0;
    dhsa_tokenize(tok, text, (int64_t)len, dhsa_tokenizer_default_flags(tok), NULL, 0, &got);
    int32_t *all = malloc((size_t)(got > 0 ? got : 1) * sizeof(int32_t));
    if (!all || got < n ||
        dhsa_tokenize(tok, text, (int64_t)len, dhsa_tokenizer_default_flags(tok), all, got, &got) != DHSA_OK) {
        free(all);
        return 0;
    }
    memcpy(ids, all, (size_t)n * sizeof(int32_t));
    free(all);
    return n;
}

static int32_t argmax(const float *x, int64_t n) {
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return (int32_t)b;
}

/* 1 if got is within 1e-4 + 1e-4 |ref| of ref everywhere; else prints the worst. */
static int close_to(const float *got, const float *ref, int64_t n, const char *what) {
    double worst = 0;
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - (double)ref[i]) - (1e-4 + 1e-4 * fabs((double)ref[i]));
        if (!(e <= worst)) {
            worst = e;
            at = i;
        }
    }
    if (worst <= 0) return 1;
    fprintf(stderr, "  %s: logit %lld is %.9g, alone %.9g\n", what, (long long)at, (double)got[at], (double)ref[at]);
    return 0;
}

int main(void) {
    dhsa_model *m = NULL;
    dhsa_model_params mp = dhsa_model_default_params();
    T_CHECK(dhsa_model_load(MODEL, &mp, &m) == DHSA_OK, "load %s (run from the repository root): %s", MODEL,
            dhsa_last_error());
    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = 2;
    dhsa_ctx *ctx = NULL;
    T_CHECK(dhsa_ctx_create(&cp, &ctx) == DHSA_OK, "ctx: %s", dhsa_last_error());
    int32_t ids[160];
    if (!m || !ctx || make_ids(m, ids, 160) != 160) {
        T_CHECK(0, "a model, a ctx and 160 prompt ids");
        return t_report("test_session_batch");
    }
    const int64_t V = dhsa_model_get_info(m)->n_vocab;
    const int64_t plen[NS] = {10, 37, 64, 150};
    const dhsa_attn_method meth[NS] = {DHSA_ATTN_DENSE, DHSA_ATTN_DHSA, DHSA_ATTN_BLOCK, DHSA_ATTN_STREAM};
    dhsa_session *s[NS] = {0}, *twin[NS] = {0};
    float *lg = malloc((size_t)(NS * V) * sizeof(float)), *ref = malloc((size_t)(NS * V) * sizeof(float));
    int ok = lg && ref;
    for (int i = 0; i < NS && ok; i++) {
        dhsa_session_params sp = dhsa_session_default_params();
        sp.kv_type = DHSA_F32; /* compared with F32 references (the default is F16) */
        sp.n_ctx = 256;
        sp.n_ubatch = 64;
        sp.attn = meth[i];
        sp.router.dense_below = 0;
        sp.router.budget_tokens = 48;
        sp.router.sink_tokens = 4;
        sp.router.local_tokens = 16;
        sp.router.q_block = 16;
        ok = dhsa_session_create(ctx, m, &sp, &s[i]) == DHSA_OK && dhsa_session_create(ctx, m, &sp, &twin[i]) == DHSA_OK &&
             dhsa_session_eval(s[i], ids, plen[i], ref + i * V) == DHSA_OK &&
             dhsa_session_eval(twin[i], ids, plen[i], ref + i * V) == DHSA_OK;
    }
    T_CHECK(ok, "four sessions and their twins, prompts evaluated: %s", dhsa_last_error());
    if (ok) {
        int32_t next[NS];
        for (int i = 0; i < NS; i++) next[i] = argmax(ref + i * V, V);
        int same = 1, lens = 1, argmaxes = 1, run = 1;
        for (int step = 0; step < STEPS && run; step++) {
            run = dhsa_session_eval_batch(s, NS, next, lg) == DHSA_OK;
            for (int i = 0; i < NS && run; i++) run = dhsa_session_eval(twin[i], &next[i], 1, ref + i * V) == DHSA_OK;
            for (int i = 0; i < NS && run; i++) {
                char what[64];
                snprintf(what, sizeof what, "session %d (%s), step %d", i, dhsa_attn_method_name(meth[i]), step);
                if (!close_to(lg + i * V, ref + i * V, V, what)) same = 0;
                if (argmax(lg + i * V, V) != argmax(ref + i * V, V)) argmaxes = 0;
                if (dhsa_session_length(s[i]) != plen[i] + step + 1) lens = 0;
                next[i] = argmax(ref + i * V, V);
            }
        }
        T_CHECK(run, "eight batched steps run: %s", dhsa_last_error());
        T_CHECK(same, "every session's batched logits match its twin's alone within 1e-4 + 1e-4 |ref|");
        T_CHECK(argmaxes, "the same greedy tokens");
        T_CHECK(lens, "each session's length advances by one per step");
        /* failures */
        dhsa_session *dup[2] = {s[0], s[0]};
        int32_t two[2] = {next[0], next[0]};
        T_CHECK(dhsa_session_eval_batch(dup, 2, two, lg) == DHSA_ERR_INVALID_ARG, "the same session twice is refused");
        int32_t bad[NS] = {next[0], next[1], (int32_t)V, next[3]};
        dhsa_status st = dhsa_session_eval_batch(s, NS, bad, lg);
        int unchanged = 1;
        for (int i = 0; i < NS; i++) unchanged &= dhsa_session_length(s[i]) == plen[i] + STEPS;
        T_CHECK(st == DHSA_ERR_INVALID_ARG && unchanged, "an id out of range: %s, no session changed",
                dhsa_status_str(st));
        run = dhsa_session_eval_batch(s, NS, next, lg) == DHSA_OK;
        same = run;
        for (int i = 0; i < NS && run; i++) {
            run = dhsa_session_eval(twin[i], &next[i], 1, ref + i * V) == DHSA_OK;
            if (run && !close_to(lg + i * V, ref + i * V, V, "after the refused batch")) same = 0;
        }
        T_CHECK(run && same, "the next batch after a refused one still matches");
        dhsa_session *with_null[2] = {s[0], NULL};
        T_CHECK(dhsa_session_eval_batch(with_null, 2, two, lg) == DHSA_ERR_INVALID_ARG, "a NULL session is refused");
        dhsa_session_params sp = dhsa_session_default_params();
        sp.kv_type = DHSA_F32; /* compared with F32 references (the default is F16) */
        sp.n_ctx = 64;
        sp.n_ubatch = 2;
        dhsa_session *small = NULL;
        st = dhsa_session_create(ctx, m, &sp, &small);
        dhsa_session *three[3] = {small, s[1], s[2]};
        int32_t ids3[3] = {5, 6, 7};
        T_CHECK(st == DHSA_OK && dhsa_session_eval_batch(three, 3, ids3, NULL) == DHSA_ERR_TOO_LARGE &&
                    dhsa_session_length(small) == 0,
                "more sessions than the first one's ubatch: DHSA_ERR_TOO_LARGE");
        dhsa_session_free(small);
    }
    for (int i = 0; i < NS; i++) {
        dhsa_session_free(s[i]);
        dhsa_session_free(twin[i]);
    }
    free(lg);
    free(ref);
    dhsa_ctx_free(ctx);
    dhsa_model_free(m);
    return t_report("test_session_batch");
}
