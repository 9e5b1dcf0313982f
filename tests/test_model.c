/* test_model.c: the model runner (src/model/model.c, session.c, sample.c).
 *
 *   - the real stories260K model (../shared/models; skipped where absent):
 *     greedy decoding from "Once upon a time" is the peer's (llama2.c run.c)
 *     exact token sequence; the GGUF and the llama2.c files give identical
 *     logits; KV-cached decode equals recomputing the whole sequence;
 *     chunked prefill (any ubatch) equals whole prefill; F16 K/V stays close;
 *     DHSA with a budget covering everything equals dense;
 *   - the memory plan: totals add up, --mem-limit picks a smaller ubatch or
 *     refuses with a sentence that says what would fit;
 *   - the sampler on hand-made logits (greedy ties, top-k/top-p/min-p sets,
 *     temperature, seeds, repetition penalty), and draw for draw against a
 *     plain reference (qsort of every candidate; id order when nothing is
 *     cut) on random logits with ties, -0 and +0, -inf, every parameter;
 *   - bad input: ids out of range, too many tokens, a session after a
 *     failed eval and after reset (every method: test_session_fail.c);
 *   - the CLI (env DHSA_CLI): dhsa run text and --ids against the peer,
 *     summary line, plan, --mem-limit refusal, usage errors, gen-model +
 *     run + bench model on a generated model.
 * Fixture models of every architecture and weight type against the naive
 * double-precision forward of tests/llm_ref.h are in test_model_ref.c.
 */
#include "dhsa.h"
#include "t.h"
#include "cli_run.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MODEL "../shared/models/stories260K.gguf"
#define MODEL_BIN "../shared/models/stories260K.bin"
#define MODEL_TOK "../shared/models/tok512.bin"

static dhsa_ctx *ctx;

static int exists(const char *p) {
    FILE *f = fopen(p, "rb");
    if (f) fclose(f);
    return f != NULL;
}

/* max |a - b| / (1 + max |b|) over n values. */
static double rel_diff(const float *a, const float *b, int64_t n) {
    double md = 0, mb = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= md)) md = d; /* NaN propagates */
        if (fabs((double)b[i]) > mb) mb = fabs((double)b[i]);
    }
    return md / (1.0 + mb);
}

static int32_t argmax(const float *x, int64_t n) {
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return (int32_t)b;
}

/* Evaluates ids with a fresh session, logits of every position. */
static dhsa_status eval_all(const dhsa_model *m, dhsa_session_params sp, const int32_t *ids, int64_t n,
                            float *logits) {
    sp.logits_all = 1;
    dhsa_session *s;
    dhsa_status st = dhsa_session_create(ctx, m, &sp, &s);
    if (st) return st;
    st = dhsa_session_eval(s, ids, n, logits);
    dhsa_session_free(s);
    return st;
}

/* Greedy decoding of n_gen tokens after ids[0..n_prompt) (ids has room). */
static dhsa_status greedy(const dhsa_model *m, dhsa_session_params sp, int32_t *ids, int64_t n_prompt,
                          int64_t n_gen, float *step_logits /* [n_gen][V] or NULL */) {
    int64_t V = dhsa_model_get_info(m)->n_vocab;
    float *lg = malloc((size_t)V * sizeof(float));
    dhsa_session *s;
    dhsa_status st = dhsa_session_create(ctx, m, &sp, &s);
    if (st) {
        free(lg);
        return st;
    }
    st = dhsa_session_eval(s, ids, n_prompt, lg);
    for (int64_t i = 0; i < n_gen && !st; i++) {
        if (step_logits) memcpy(step_logits + i * V, lg, (size_t)V * sizeof(float));
        ids[n_prompt + i] = argmax(lg, V);
        if (i + 1 < n_gen) st = dhsa_session_eval(s, ids + n_prompt + i, 1, lg);
    }
    dhsa_session_free(s);
    free(lg);
    return st;
}

typedef struct {
    int calls, bad, with_layout, stop_at;
    int64_t last_pos0;
} hook_state;

static int hook(void *user, int64_t layer, const dhsa_attn_desc *a) {
    hook_state *h = user;
    h->calls++;
    if (a->q.shape[1] != 8 || a->k.shape[1] != 4 || a->k.shape[2] != a->q_pos0 + a->q.shape[2] || layer < 0 ||
        layer >= 5 || !a->causal)
        h->bad++;
    if (a->layout) h->with_layout++;
    h->last_pos0 = a->q_pos0;
    return h->stop_at && h->calls == h->stop_at;
}

static void test_hook(const dhsa_model *m) {
    hook_state h = {0};
    dhsa_session_params sp = dhsa_session_default_params();
    sp.kv_type = DHSA_F32; /* compared with F32 references (the default is F16) */
    sp.layer_hook = hook;
    sp.layer_hook_user = &h;
    sp.n_ubatch = 4;
    sp.attn = DHSA_ATTN_DHSA;
    sp.router.dense_below = 0;
    int32_t ids[10] = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376};
    float *lg = malloc(512 * sizeof(float));
    dhsa_session *s;
    dhsa_status st = dhsa_session_create(ctx, m, &sp, &s);
    if (!st) st = dhsa_session_eval(s, ids, 10, lg);
    T_CHECK(st == DHSA_OK && h.calls == 15 && h.bad == 0 && h.with_layout == 15 && h.last_pos0 == 8,
            "layer hook: %d calls (15), %d bad, %d with a layout, last q_pos0 %lld", h.calls, h.bad, h.with_layout,
            (long long)h.last_pos0);
    if (!st) dhsa_session_free(s);
    hook_state h2 = {.stop_at = 7};
    sp.layer_hook_user = &h2;
    st = dhsa_session_create(ctx, m, &sp, &s);
    if (!st) {
        st = dhsa_session_eval(s, ids, 10, lg);
        T_CHECK(st == DHSA_ERR_INVALID_ARG && h2.calls == 7 && dhsa_session_length(s) == 0,
                "a hook that stops: status %d after %d calls, length %lld (0: the call's first ubatch is not kept)",
                st, h2.calls, (long long)dhsa_session_length(s));
        h2.stop_at = 0;
        T_CHECK(dhsa_session_eval(s, ids, 10, lg) == DHSA_OK, "after a failed eval the next one runs");
        T_CHECK(dhsa_session_reset(s) == DHSA_OK && dhsa_session_eval(s, ids, 10, lg) == DHSA_OK,
                "after reset it runs");
        dhsa_session_free(s);
    }
    free(lg);
}

/* ------------------------------------------------------------- real --- */

static const int32_t prompt_ids[] = {1, 403, 407, 261, 378}; /* BOS "Once upon a time" */

/* The peer: llama2.c run.c (karpathy/llama2.c 350e04fe, gcc -O3), greedy
 * (-t 0 -n 256 -i "Once upon a time") on stories260K.bin + tok512.bin,
 * with a print of each id added: BOS, the prompt, 252 generated ids. */
static const int32_t peer_ids[257] = {
    1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267, 337, 410,
    408, 419, 292, 411, 322, 265, 282, 295, 433, 426, 385, 328, 432, 358, 394, 261, 370, 432, 352, 266, 268,
    388, 426, 338, 391, 266, 267, 337, 335, 312, 432, 398, 312, 286, 267, 414, 270, 333, 415, 426, 13, 438,
    310, 439, 419, 357, 336, 432, 313, 438, 310, 432, 278, 316, 439, 419, 298, 414, 267, 265, 282, 295, 433,
    426, 436, 317, 286, 296, 418, 269, 279, 292, 416, 439, 413, 409, 416, 327, 263, 415, 294, 267, 400, 426,
    338, 336, 432, 313, 442, 391, 267, 337, 335, 364, 420, 268, 388, 432, 398, 359, 280, 303, 439, 413, 272,
    417, 264, 312, 426, 436, 13, 438, 310, 286, 296, 418, 269, 279, 292, 416, 439, 413, 409, 416, 327, 263,
    415, 294, 267, 400, 426, 338, 336, 432, 313, 442, 439, 423, 262, 304, 420, 422, 432, 317, 426, 359, 279,
    292, 416, 439, 413, 409, 416, 327, 263, 415, 294, 267, 400, 426, 436, 13, 438, 310, 279, 292, 416, 439,
    413, 391, 267, 281, 421, 427, 311, 357, 432, 384, 358, 336, 432, 313, 442, 439, 423, 262, 304, 420, 422,
    432, 357, 426, 359, 279, 292, 416, 439, 413, 409, 416, 327, 263, 415, 294, 267, 400, 426, 436, 320, 285,
    357, 336, 432, 313, 455, 289, 439, 413, 263, 304, 420, 422, 432, 317, 426, 410, 448, 411, 280, 303, 281,
    421, 427, 364, 426};

/* Greedy decoding of 252 tokens equals the peer's ids, token for token. */
static void test_peer(const dhsa_model *m, const char *what) {
    int32_t ids[257];
    memcpy(ids, prompt_ids, sizeof prompt_ids);
    dhsa_session_params sp = dhsa_session_default_params();
    sp.kv_type = DHSA_F32; /* compared with F32 references (the default is F16) */
    dhsa_status st = greedy(m, sp, ids, 5, 252, NULL);
    int64_t first_bad = -1;
    for (int64_t i = 0; i < 257 && first_bad < 0; i++)
        if (ids[i] != peer_ids[i]) first_bad = i;
    T_CHECK(st == DHSA_OK && first_bad < 0, "%s: greedy ids equal llama2.c run.c's for 252 tokens (first "
            "difference at %lld: %d vs %d)", what, (long long)first_bad, first_bad >= 0 ? ids[first_bad] : 0,
            first_bad >= 0 ? peer_ids[first_bad] : 0);
}

static void test_real(void) {
    if (!exists(MODEL)) {
        T_SKIP(36, "%s is absent: real-model checks skipped", MODEL);
        return;
    }
    dhsa_model *m;
    dhsa_status st = dhsa_model_load(MODEL, NULL, &m);
    T_CHECK(st == DHSA_OK, "load %s: %s", MODEL, dhsa_last_error());
    if (st) return;
    const dhsa_model_info *in = dhsa_model_get_info(m);
    T_CHECK(in->arch == DHSA_ARCH_LLAMA && in->n_layer == 5 && in->n_embd == 64 && in->n_head == 8 &&
                in->n_head_kv == 4 && in->head_dim_k == 8 && in->n_vocab == 512 && in->n_ff == 172 &&
                !in->rope_neox,
            "stories260K hyperparameters");
    const int64_t V = in->n_vocab, NP = 5, NG = 60, N = NP + NG;

    /* tokenizer agrees with the ids the peer uses */
    int32_t tk[16];
    int64_t nt = 0;
    st = dhsa_tokenize(dhsa_model_tokenizer(m), "Once upon a time", 16, DHSA_TOKENIZE_ADD_BOS, tk, 16, &nt);
    T_CHECK(st == DHSA_OK && nt == NP && memcmp(tk, prompt_ids, sizeof prompt_ids) == 0, "prompt ids");

    test_peer(m, "GGUF");
    test_hook(m);

    /* greedy decoding: the text (an F32 cache: the checks below compare
     * with recomputation to 1e-5 and count F32 cache bytes; the default
     * is F16) */
    dhsa_session_params sp = dhsa_session_default_params();
    sp.kv_type = DHSA_F32;
    int32_t ids[64 + 8];
    memcpy(ids, prompt_ids, sizeof prompt_ids);
    float *step = malloc((size_t)NG * V * sizeof(float));
    st = greedy(m, sp, ids, NP, NG, step);
    T_CHECK(st == DHSA_OK, "greedy: %s", dhsa_last_error());
    char text[4096];
    int64_t tl = 0;
    st = dhsa_detokenize(dhsa_model_tokenizer(m), ids + NP, NG, 0, text, sizeof text - 1, &tl);
    text[st == DHSA_OK ? tl : 0] = 0;
    const char *want = ", there was a little girl named Lily. She loved to play outside in the park.";
    T_CHECK(strncmp(text, want, strlen(want)) == 0, "greedy continuation is \"%.120s\"", text);

    /* KV-cached decode == recomputing the whole sequence at once */
    float *all = malloc((size_t)N * V * sizeof(float));
    st = eval_all(m, sp, ids, N, all);
    T_CHECK(st == DHSA_OK, "whole eval: %s", dhsa_last_error());
    double worst = 0;
    int agree = 1;
    for (int64_t i = 0; i < NG; i++) {
        double d = rel_diff(step + i * V, all + (NP - 1 + i) * V, V);
        if (d > worst) worst = d;
        agree &= argmax(all + (NP - 1 + i) * V, V) == ids[NP + i];
    }
    T_CHECK(worst < 1e-5 && agree, "cached decode vs recompute: rel diff %.3g, argmax agree %d", worst, agree);

    /* chunked prefill == whole prefill, for several ubatch sizes */
    float *chunk = malloc((size_t)N * V * sizeof(float));
    int64_t ubs[] = {1, 3, 16, 64};
    for (int u = 0; u < 4; u++) {
        dhsa_session_params cp = sp;
        cp.n_ubatch = ubs[u];
        st = eval_all(m, cp, ids, N, chunk);
        double d = st ? 1 : rel_diff(chunk, all, N * V);
        T_CHECK(st == DHSA_OK && d < 1e-5, "ubatch %lld vs whole: %s rel diff %.3g", (long long)ubs[u],
                st ? dhsa_last_error() : "", d);
    }

    /* F16 K/V: close, same greedy tokens over this stretch */
    dhsa_session_params hp = sp;
    hp.kv_type = DHSA_F16;
    st = eval_all(m, hp, ids, N, chunk);
    double dh = st ? 1 : rel_diff(chunk, all, N * V);
    T_CHECK(st == DHSA_OK && dh < 2e-2, "F16 K/V vs F32: rel diff %.3g", dh);

    /* sparse methods with a budget covering every key: identical to dense */
    dhsa_attn_method methods[] = {DHSA_ATTN_DHSA, DHSA_ATTN_BLOCK, DHSA_ATTN_STREAM};
    for (int k = 0; k < 3; k++) {
        dhsa_session_params dp = sp;
        dp.attn = methods[k];
        dp.router.dense_below = 0;
        dp.router.budget_tokens = 1 << 20;
        dp.router.q_block = 16;
        st = eval_all(m, dp, ids, N, chunk);
        double d = st ? 1 : rel_diff(chunk, all, N * V);
        T_CHECK(st == DHSA_OK && d == 0.0, "%s with a full budget vs dense: %s rel diff %.3g",
                dhsa_attn_method_name(methods[k]), st ? dhsa_last_error() : "", d);
    }
    /* a small budget changes the result (the routing is live) */
    {
        dhsa_session_params dp = sp;
        dp.attn = DHSA_ATTN_STREAM;
        dp.router.dense_below = 0;
        dp.router.budget_tokens = 8;
        dp.router.sink_tokens = 2;
        dp.router.local_tokens = 4;
        dp.router.q_block = 4;
        st = eval_all(m, dp, ids, N, chunk);
        double d = st ? 0 : rel_diff(chunk, all, N * V);
        T_CHECK(st == DHSA_OK && d > 1e-3, "stream with 8 keys differs from dense: %s rel diff %.3g",
                st ? dhsa_last_error() : "", d);
    }

    /* the llama2.c files: identical logits */
    if (exists(MODEL_BIN) && exists(MODEL_TOK)) {
        dhsa_model_params mp = dhsa_model_default_params();
        mp.tokenizer_path = MODEL_TOK;
        dhsa_model *mb;
        st = dhsa_model_load(MODEL_BIN, &mp, &mb);
        T_CHECK(st == DHSA_OK, "load %s: %s", MODEL_BIN, dhsa_last_error());
        if (!st) {
            st = eval_all(mb, sp, ids, N, chunk);
            T_CHECK(st == DHSA_OK && memcmp(chunk, all, (size_t)N * V * sizeof(float)) == 0,
                    "llama2.c checkpoint logits identical to the GGUF's");
            test_peer(mb, "llama2.c checkpoint");
            dhsa_model_free(mb);
        }
        /* without the tokenizer: a clear error */
        st = dhsa_model_load(MODEL_BIN, NULL, &mb);
        T_CHECK(st == DHSA_ERR_FORMAT && mb == NULL && strstr(dhsa_last_error(), "tokenizer"),
                "llama2.c without a tokenizer: %s", dhsa_last_error());
    } else {
        T_SKIP(4, "%s or %s absent: llama2.c comparison skipped", MODEL_BIN, MODEL_TOK);
    }

    /* errors: ids out of range, context overflow, refusal after failure */
    {
        dhsa_session_params ep = sp;
        ep.n_ctx = 8;
        dhsa_session *s;
        st = dhsa_session_create(ctx, m, &ep, &s);
        T_CHECK(st == DHSA_OK, "session n_ctx 8");
        if (!st) {
            int32_t bad[2] = {1, 512};
            T_CHECK(dhsa_session_eval(s, bad, 2, chunk) == DHSA_ERR_INVALID_ARG && dhsa_session_length(s) == 0,
                    "id 512 refused before running");
            T_CHECK(dhsa_session_eval(s, ids, 9, chunk) == DHSA_ERR_TOO_LARGE && dhsa_session_length(s) == 0,
                    "9 tokens in a cache of 8 refused");
            T_CHECK(dhsa_session_eval(s, ids, 8, chunk) == DHSA_OK && dhsa_session_length(s) == 8, "8 tokens fit");
            T_CHECK(dhsa_session_eval(s, ids, 1, chunk) == DHSA_ERR_TOO_LARGE, "a 9th token refused");
            dhsa_session_reset(s);
            T_CHECK(dhsa_session_length(s) == 0 && dhsa_session_eval(s, ids, NP, chunk) == DHSA_OK &&
                        rel_diff(chunk, all + (NP - 1) * V, V) < 1e-5,
                    "after reset the cache starts over");
            dhsa_session_free(s);
        }
    }

    /* memory plan */
    {
        dhsa_session_params pp = sp;
        pp.n_ctx = 4096;
        dhsa_mem_plan pl;
        st = dhsa_session_plan(ctx, m, &pp, &pl);
        size_t kv = (size_t)5 * 4096 * 4 * (8 + 8) * 4;
        T_CHECK(st == DHSA_OK && pl.n_ubatch == 512 && pl.kv_cache == kv &&
                    pl.total == pl.weights + pl.kv_cache + pl.activations + pl.attn_workspace +
                                    pl.matmul_workspace + pl.routing + pl.process &&
                    pl.weights == (size_t)in->weight_bytes,
                "plan at 4096: ubatch %lld kv %zu (want %zu) total %zu", (long long)pl.n_ubatch, pl.kv_cache, kv,
                pl.total);
        dhsa_mem_plan small;
        pp.mem_limit = pl.total - pl.activations / 2;
        st = dhsa_session_plan(ctx, m, &pp, &small);
        T_CHECK(st == DHSA_OK && small.n_ubatch < 512 && small.total <= pp.mem_limit,
                "a tighter limit picks ubatch %lld (%zu <= %zu)", (long long)small.n_ubatch, small.total,
                pp.mem_limit);
        pp.mem_limit = pl.weights + pl.kv_cache / 4;
        st = dhsa_session_plan(ctx, m, &pp, &small);
        T_CHECK(st == DHSA_ERR_MEMORY_BUDGET && strstr(dhsa_last_error(), "would fit"),
                "a limit below the cache is refused with a hint: %s", dhsa_last_error());
        dhsa_session *s = NULL;
        T_CHECK(dhsa_session_create(ctx, m, &pp, &s) == DHSA_ERR_MEMORY_BUDGET && s == NULL,
                "session refused under the same limit");
        /* the session's real allocations stay within its plan */
        dhsa_ctx_trim(ctx);
        dhsa_mem_stats before = dhsa_ctx_mem_stats(ctx);
        dhsa_ctx_reset_peak(ctx);
        pp.mem_limit = 0;
        pp.n_ctx = 256;
        st = dhsa_session_create(ctx, m, &pp, &s);
        if (!st) {
            st = dhsa_session_eval(s, ids, N, chunk);
            dhsa_mem_stats after = dhsa_ctx_mem_stats(ctx);
            const dhsa_mem_plan *sp2 = dhsa_session_get_plan(s);
            size_t tracked = sp2->activations + sp2->attn_workspace + sp2->matmul_workspace + sp2->routing;
            T_CHECK(st == DHSA_OK && after.peak - before.in_use <= tracked,
                    "ctx peak during eval %zu <= planned %zu", after.peak - before.in_use, tracked);
            dhsa_session_free(s);
        }
        dhsa_ctx_set_budget(ctx, 0);
    }
    free(chunk);
    free(all);
    free(step);
    dhsa_model_free(m);
}

/* ---------------------------------------------------------- sampler --- */

static void test_sampler(void) {
    float lg[6] = {1.0f, 3.0f, 3.0f, 0.5f, -2.0f, 2.9f};
    dhsa_sampler_params p = dhsa_sampler_default_params();
    p.temperature = 0;
    dhsa_sampler *s;
    T_CHECK(dhsa_sampler_create(&p, 6, &s) == DHSA_OK, "greedy sampler");
    int32_t id = -1;
    T_CHECK(dhsa_sampler_sample(s, lg, NULL, 0, &id) == DHSA_OK && id == 1, "greedy: lowest id on ties (%d)", id);
    dhsa_sampler_free(s);
    /* repetition penalty: id 1 and 2 seen, both divided: 5 wins */
    p.repeat_penalty = 2.0f;
    dhsa_sampler_create(&p, 6, &s);
    int32_t hist[3] = {1, 2, 1};
    T_CHECK(dhsa_sampler_sample(s, lg, hist, 3, &id) == DHSA_OK && id == 5, "penalty moves to id 5 (%d)", id);
    dhsa_sampler_free(s);
    /* top-k 2 at high temperature: only ids 1 and 2 ever */
    p = dhsa_sampler_default_params();
    p.temperature = 100.0f;
    p.top_k = 2;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    dhsa_sampler_create(&p, 6, &s);
    int counts[6] = {0};
    for (int i = 0; i < 2000; i++) {
        dhsa_sampler_sample(s, lg, NULL, 0, &id);
        counts[id]++;
    }
    T_CHECK(counts[1] + counts[2] == 2000 && counts[1] > 800 && counts[2] > 800, "top-k 2: %d %d", counts[1],
            counts[2]);
    dhsa_sampler_free(s);
    /* temperature 1, no filters: frequencies follow softmax */
    p.temperature = 1.0f;
    p.top_k = 0;
    dhsa_sampler_create(&p, 6, &s);
    memset(counts, 0, sizeof counts);
    const int N = 20000;
    for (int i = 0; i < N; i++) {
        dhsa_sampler_sample(s, lg, NULL, 0, &id);
        counts[id]++;
    }
    double z = 0;
    for (int i = 0; i < 6; i++) z += exp(lg[i]);
    int ok = 1;
    for (int i = 0; i < 6; i++) {
        double pr = exp(lg[i]) / z, sd = sqrt(pr * (1 - pr) / N);
        if (fabs((double)counts[i] / N - pr) > 5 * sd + 1e-4) ok = 0;
    }
    T_CHECK(ok, "softmax frequencies within 5 sigma");
    dhsa_sampler_free(s);
    /* top-p 0.5: the smallest set reaching half the mass: ids 1, 2 */
    p.top_p = 0.5f;
    dhsa_sampler_create(&p, 6, &s);
    memset(counts, 0, sizeof counts);
    for (int i = 0; i < 2000; i++) {
        dhsa_sampler_sample(s, lg, NULL, 0, &id);
        counts[id]++;
    }
    T_CHECK(counts[1] + counts[2] == 2000, "top-p 0.5 keeps ids 1, 2 (%d %d %d)", counts[1], counts[2], counts[5]);
    dhsa_sampler_free(s);
    /* min-p 0.5: ids with p >= half of the best: 1, 2, 5 */
    p.top_p = 1.0f;
    p.min_p = 0.5f;
    dhsa_sampler_create(&p, 6, &s);
    memset(counts, 0, sizeof counts);
    for (int i = 0; i < 3000; i++) {
        dhsa_sampler_sample(s, lg, NULL, 0, &id);
        counts[id]++;
    }
    T_CHECK(counts[1] + counts[2] + counts[5] == 3000 && counts[5] > 500, "min-p 0.5 keeps 1, 2, 5");
    dhsa_sampler_free(s);
    /* seeds: same seed same sequence, different seed differs */
    int32_t a[64], b[64], c[64];
    for (int r = 0; r < 3; r++) {
        dhsa_sampler_params q = dhsa_sampler_default_params();
        q.temperature = 1.5f;
        q.top_k = 0;
        q.min_p = 0;
        q.top_p = 1;
        q.seed = r == 2 ? 7 : 3;
        dhsa_sampler_create(&q, 6, &s);
        for (int i = 0; i < 64; i++) dhsa_sampler_sample(s, lg, NULL, 0, r == 0 ? &a[i] : r == 1 ? &b[i] : &c[i]);
        dhsa_sampler_free(s);
    }
    T_CHECK(memcmp(a, b, sizeof a) == 0 && memcmp(a, c, sizeof a) != 0, "seeded sequences");
    /* bad input */
    p = dhsa_sampler_default_params();
    p.top_p = 0;
    T_CHECK(dhsa_sampler_create(&p, 6, &s) == DHSA_ERR_INVALID_ARG && s == NULL, "top-p 0 refused");
    p = dhsa_sampler_default_params();
    p.temperature = NAN;
    T_CHECK(dhsa_sampler_create(&p, 6, &s) == DHSA_ERR_INVALID_ARG, "NaN temperature refused");
    p = dhsa_sampler_default_params();
    dhsa_sampler_create(&p, 6, &s);
    float bad[6] = {0, 1, NAN, 0, 0, 0};
    T_CHECK(dhsa_sampler_sample(s, bad, NULL, 0, &id) == DHSA_ERR_NONFINITE, "NaN logit refused");
    dhsa_sampler_free(s);
}

/* The sampler's contract written the plain way: repetition penalty,
 * argmax, every candidate sorted by qsort (value descending, ties by
 * ascending id, -0 == +0), top-k, softmax in that order, top-p, min-p,
 * the draw from xoshiro256** seeded by splitmix64 walking that order; when
 * nothing is cut (top-k off or >= V, top-p 1, min-p 0), softmax and the
 * walk in id order. src/model/sample.c sorts by radix, sorts only what
 * top-k can keep and nothing when nothing is cut; the draws must be the
 * same, id for id. */
static const float *ref_vals;

static int ref_before(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (ref_vals[x] != ref_vals[y]) return ref_vals[x] > ref_vals[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

static uint64_t ref_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t ref_next(uint64_t *s) {
    uint64_t r = ref_rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = ref_rotl(s[3], 45);
    return r;
}

static void ref_seed(uint64_t *s, uint64_t seed) {
    for (int i = 0; i < 4; i++) {
        uint64_t z = (seed += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        s[i] = z ^ (z >> 31);
    }
}

/* w, prob: [V]; order: [V] */
static int32_t ref_sample(uint64_t *rng, const dhsa_sampler_params *p, const float *logits, int64_t V,
                          const int32_t *hist, int64_t nh, float *w, int32_t *order, float *prob) {
    memcpy(w, logits, (size_t)V * sizeof(float));
    if (p->repeat_penalty != 1.0f && nh > 0) {
        int64_t from = nh > p->repeat_last_n ? nh - p->repeat_last_n : 0;
        for (int64_t j = from; j < nh; j++) {
            int seen = 0;
            for (int64_t k = from; k < j; k++) seen |= hist[k] == hist[j];
            if (!seen) w[hist[j]] = w[hist[j]] > 0 ? w[hist[j]] / p->repeat_penalty : w[hist[j]] * p->repeat_penalty;
        }
    }
    int64_t n = 0;
    for (int64_t i = 0; i < V; i++)
        if (w[i] > -INFINITY) order[n++] = (int32_t)i;
    ref_vals = w;
    qsort(order, (size_t)n, sizeof *order, ref_before);
    if (p->temperature == 0.0f) return order[0];
    if ((p->top_k == 0 || p->top_k >= V) && p->top_p >= 1.0f && p->min_p <= 0.0f) {
        double mx = w[order[0]], sum = 0, acc = 0;
        for (int64_t i = 0; i < V; i++) {
            prob[i] = w[i] > -INFINITY ? (float)exp(((double)w[i] - mx) / (double)p->temperature) : 0.0f;
            sum += prob[i];
        }
        double r = (double)(ref_next(rng) >> 11) * (1.0 / 9007199254740992.0) * sum;
        int32_t last = order[0];
        for (int64_t i = 0; i < V; i++) {
            if (prob[i] > 0) last = (int32_t)i;
            if (r < (acc += prob[i])) return (int32_t)i;
        }
        return last;
    }
    if (p->top_k > 0 && n > p->top_k) n = p->top_k;
    double mx = w[order[0]], sum = 0;
    for (int64_t i = 0; i < n; i++) {
        prob[i] = (float)exp(((double)w[order[i]] - mx) / (double)p->temperature);
        sum += prob[i];
    }
    if (p->top_p < 1.0f) {
        double acc = 0;
        for (int64_t i = 0; i < n; i++)
            if ((acc += (double)prob[i] / sum) >= (double)p->top_p) {
                n = i + 1;
                break;
            }
    }
    if (p->min_p > 0.0f) {
        int64_t keep = 1;
        while (keep < n && (double)prob[keep] >= (double)p->min_p * (double)prob[0]) keep++;
        n = keep;
    }
    sum = 0;
    for (int64_t i = 0; i < n; i++) sum += prob[i];
    double r = (double)(ref_next(rng) >> 11) * (1.0 / 9007199254740992.0) * sum, acc = 0;
    for (int64_t i = 0; i < n; i++)
        if (r < (acc += prob[i])) return order[i];
    return order[n - 1];
}

static void test_sampler_reference(void) {
    const int64_t sizes[] = {1, 7, 300, 2048};
    const int64_t top_ks[] = {0, 1, 3, 40, 299, 5000};
    const float temps[] = {0.0f, 0.5f, 1.0f, 1.7f};
    const float top_ps[] = {1.0f, 0.9f, 0.5f};
    const float min_ps[] = {0.0f, 0.05f};
    float *lg = malloc(2048 * sizeof(float)), *w = malloc(2048 * sizeof(float)), *prob = malloc(2048 * sizeof(float));
    int32_t *order = malloc(2048 * sizeof(int32_t)), hist[32];
    uint64_t gen[4]; /* the logits' generator */
    ref_seed(gen, 12345);
    int64_t draws = 0, differ = 0;
    char first[200] = "";
    for (size_t a = 0; a < sizeof sizes / sizeof *sizes; a++)
        for (size_t b = 0; b < sizeof top_ks / sizeof *top_ks; b++)
            for (size_t c = 0; c < sizeof temps / sizeof *temps; c++)
                for (size_t d = 0; d < sizeof top_ps / sizeof *top_ps; d++)
                    for (int e = 0; e < 4; e++) {
                        const int64_t V = sizes[a];
                        dhsa_sampler_params p = dhsa_sampler_default_params();
                        p.top_k = top_ks[b];
                        p.temperature = temps[c];
                        p.top_p = top_ps[d];
                        p.min_p = min_ps[e & 1];
                        p.repeat_penalty = e & 2 ? 1.3f : 1.0f;
                        p.seed = 1000 + (uint64_t)draws;
                        dhsa_sampler *s = NULL;
                        if (!lg || !w || !prob || !order || dhsa_sampler_create(&p, V, &s)) {
                            differ++;
                            continue;
                        }
                        uint64_t rng[4];
                        ref_seed(rng, p.seed);
                        for (int t = 0; t < 8; t++) {
                            /* t % 4: spread logits, ties of a few values (-0 and +0 among
                             * them), some -inf, nearly flat */
                            for (int64_t i = 0; i < V; i++) {
                                uint64_t u = ref_next(gen) >> 11;
                                double x = (double)u / 9007199254740992.0;
                                static const float few[5] = {0.0f, -0.0f, 1.0f, -1.0f, 0.5f};
                                lg[i] = t % 4 == 0   ? (float)(12.0 * x - 6.0)
                                        : t % 4 == 1 ? few[u % 5]
                                        : t % 4 == 2 ? (u % 3 == 0 ? -INFINITY : (float)(4.0 * x))
                                                     : (float)(1e-3 * x);
                            }
                            if (t % 4 == 2) lg[0] = 1.0f; /* never all -inf */
                            int64_t nh = V < 32 ? V : 32;
                            for (int64_t i = 0; i < nh; i++) hist[i] = (int32_t)((ref_next(gen) >> 11) % (uint64_t)V);
                            int32_t got = -1, want = ref_sample(rng, &p, lg, V, hist, nh, w, order, prob);
                            dhsa_sampler_sample(s, lg, hist, nh, &got);
                            draws++;
                            if (got != want && differ++ == 0)
                                snprintf(first, sizeof first, "V %lld top_k %lld temp %g top_p %g min_p %g penalty %g "
                                         "logits kind %d: %d, the reference %d", (long long)V, (long long)p.top_k,
                                         (double)p.temperature, (double)p.top_p, (double)p.min_p,
                                         (double)p.repeat_penalty, t % 4, got, want);
                        }
                        dhsa_sampler_free(s);
                    }
    T_CHECK(differ == 0 && draws > 9000, "the sampler draws the reference's ids: %lld of %lld differ (first: %s)",
            (long long)differ, (long long)draws, first);
    free(lg);
    free(w);
    free(prob);
    free(order);
}

/* -------------------------------------------------------------- CLI --- */


static void test_cli(void) {
    const char *cli = getenv("DHSA_CLI");
    if (!cli || strchr(cli, '\'')) {
        T_SKIP(13, "DHSA_CLI unset: run/plan/gen-model CLI checks skipped (make test sets it)");
        return;
    }
    char *out;
    int rc;
    if (exists(MODEL)) {
        rc = cli_run("run -m " MODEL " -p 'Once upon a time' -n 20 --temp 0", 1, &out);
        T_CHECK(rc == 0 && strncmp(out, "Once upon a time, there was a little girl named Lily.", 53) == 0,
                "dhsa run greedy text: rc %d \"%.100s\"", rc, out);
        free(out);
        rc = cli_run("run -m " MODEL " -p 'Once upon a time' -n 20 --temp 0 --ids", 1, &out);
        char want[512] = "";
        for (int i = 0; i < 25; i++) snprintf(want + strlen(want), sizeof want - strlen(want), "%s%d", i ? " " : "",
                                              peer_ids[i]);
        T_CHECK(rc == 0 && strncmp(out, want, strlen(want)) == 0, "dhsa run --ids: \"%.120s\"", out);
        free(out);
        rc = cli_run("run -m " MODEL " -p 'Once upon a time' -n 8 --temp 0 --attn dhsa --ubatch 2 --kv f16", 0, &out);
        T_CHECK(rc == 0 && strstr(out, "decode: 8 tokens") && strstr(out, "peak RSS"), "dhsa run summary: %.300s",
                out);
        free(out);
        rc = cli_run("plan -m " MODEL " --ctx 4K --kv f32", 1, &out);
        T_CHECK(rc == 0 && strstr(out, "KV cache") && strstr(out, "5.0 MiB") && strstr(out, "total"),
                "dhsa plan: %.400s", out);
        free(out);
        rc = cli_run("run -m " MODEL " -p x --mem-limit 2M", 0, &out);
        T_CHECK(rc == 1 && strstr(out, "mem-limit") && strstr(out, "would fit"), "--mem-limit too small: %.300s", out);
        free(out);
        rc = cli_run("run -m " MODEL " --attn sparse", 0, &out);
        T_CHECK(rc == 2 && strstr(out, "--attn"), "bad --attn is a usage error: %.200s", out);
        free(out);
        rc = cli_run("run -m " MODEL " --temp -1", 0, &out);
        T_CHECK(rc == 2, "negative temperature is a usage error: %.200s", out);
        free(out);
        rc = cli_run("run -m " MODEL " -p x --ctx 3000 -n 1", 0, &out);
        T_CHECK(rc == 0 && strstr(out, "longer than the model's trained context"), "long context warns: %.300s",
                out);
        free(out);
        if (exists(MODEL_BIN)) {
            rc = cli_run("run -m " MODEL_BIN " --tokenizer " MODEL_TOK " -p 'Once upon a time' -n 20 --temp 0", 1,
                         &out);
            T_CHECK(rc == 0 && strncmp(out, "Once upon a time, there was a little girl named Lily.", 53) == 0,
                    "dhsa run on the llama2.c files: \"%.100s\"", out);
            free(out);
        } else {
            T_SKIP(1, "%s is absent: dhsa run on the llama2.c files skipped", MODEL_BIN);
        }
    } else {
        T_SKIP(9, "%s is absent: CLI runs on the real model skipped", MODEL);
    }
    rc = cli_run("run -m /no/such/model.gguf", 0, &out);
    T_CHECK(rc == 1 && strstr(out, "/no/such/model.gguf"), "missing model: %.200s", out);
    free(out);
    /* gen-model writes a model that runs */
    char path[] = "/tmp/dhsa_test_genmodel_XXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0) {
        close(fd);
        char args[512];
        snprintf(args, sizeof args, "gen-model --preset tiny --type Q4_K --n-embd 256 --n-ff 512 -o %s", path);
        rc = cli_run(args, 0, &out);
        T_CHECK(rc == 0 && strstr(out, "wrote"), "gen-model: %.200s", out);
        free(out);
        snprintf(args, sizeof args, "run -m %s -p 'a b c' -n 4 --temp 0", path);
        rc = cli_run(args, 0, &out);
        T_CHECK(rc == 0 && strstr(out, "decode: 4 tokens"), "run on a generated model: %.300s", out);
        free(out);
        snprintf(args, sizeof args, "bench model -m %s --lengths 64 --attn dense,dhsa --decode 2", path);
        rc = cli_run(args, 0, &out);
        T_CHECK(rc == 0 && strstr(out, "dense") && strstr(out, "dhsa") && strstr(out, "1.00x"), "bench model: %.400s",
                out);
        free(out);
        remove(path);
    }
}

int main(void) {
    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = 2;
    if (dhsa_ctx_create(&cp, &ctx)) {
        printf("test_model: 0 passed, 1 failed\n");
        return 1;
    }
    test_sampler();
    test_sampler_reference();
    test_real();
    test_cli();
    dhsa_ctx_free(ctx);
    return t_report("test_model");
}
