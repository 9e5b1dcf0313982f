/* test_session_truncate.c: dhsa_session_truncate (include/dhsa.h), what the
 * prompt cache of `dhsa serve` rests on: a session cut back to a prefix
 * continues exactly as a session that only ever evaluated that prefix.
 *
 * On the default model (models/dhsa-retrieval-8m.gguf), for dense, dhsa
 * (similarity boundaries), block, stream and oracle, with routing really
 * active (dense_below 0, a budget of 48 keys, blocks of 16 rows): the
 * reference session evaluates a prompt A and then a continuation B; the
 * other evaluates A, then 150 other tokens and 5 decode steps, is cut back
 * to A's length, then evaluates B and decodes greedily. Its logits must
 * equal the reference's bit for bit (the routing indexes are cut back with
 * dhsa_kv_index_truncate, so a stale chunk or pooled key would show). Also: cutting
 * to the length does nothing, beyond it is refused, cutting to 0 and
 * evaluating A again gives A's logits.
 *
 * Run: make build/tests/test_session_truncate && build/tests/test_session_truncate
 * (from the repository root, where models/ is). Ends with
 * "test_session_truncate: P passed, F failed, S skipped".
 */
#include "dhsa.h"
#include "t.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MODEL "models/dhsa-retrieval-8m.gguf"
#define N_A 100
#define N_C 150
#define N_B 40
#define N_DECODE 6

static int64_t make_ids(const dhsa_model *m, int32_t *ids, int64_t n) {
    int64_t ns = 0;
    const char *const *sent = dhsa_task_builtin_sentences(&ns);
    char text[16384] = "";
    size_t len = 0;
    for (int64_t i = 0; len + 512 < sizeof text && ns > 0; i++) {
        int w = snprintf(text + len, sizeof text - len, "%s ", sent[(i * 7 + 3) % ns]);
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

static int same_bits(const char *what, const float *a, const float *b, int64_t n) {
    if (memcmp(a, b, (size_t)n * sizeof(float)) == 0) return 1;
    int64_t at = 0;
    double worst = -1;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= worst)) {
            worst = d;
            at = i;
        }
    }
    fprintf(stderr, "  %s: largest difference %.3g at logit %lld (%.9g vs %.9g)\n", what, worst, (long long)at,
            (double)a[at], (double)b[at]);
    return 0;
}

static int32_t argmax(const float *x, int64_t n) {
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return (int32_t)b;
}

static void check_method(dhsa_ctx *ctx, const dhsa_model *m, const char *nm, dhsa_attn_method attn,
                         const int32_t *ids) {
    const int64_t V = dhsa_model_get_info(m)->n_vocab;
    dhsa_session_params sp = dhsa_session_default_params();
    sp.kv_type = DHSA_F32; /* compared with F32 references (the default is F16) */
    sp.n_ctx = 512;
    sp.n_ubatch = 64;
    sp.attn = attn;
    sp.logits_all = 1;
    sp.router.dense_below = 0;
    sp.router.budget_tokens = 48;
    sp.router.sink_tokens = 4;
    sp.router.local_tokens = 16;
    sp.router.q_block = 16;
    sp.router.min_chunk = 8;
    sp.router.nms_window = 4;
    dhsa_session *ref = NULL, *s = NULL;
    dhsa_status st = dhsa_session_create(ctx, m, &sp, &ref);
    if (!st) st = dhsa_session_create(ctx, m, &sp, &s);
    float *want = malloc((size_t)(N_C * V) * sizeof(float)), *got = malloc((size_t)(N_C * V) * sizeof(float));
    T_CHECK(st == DHSA_OK && want && got, "%s: two sessions: %s", nm, dhsa_last_error());
    if (st || !want || !got) goto done;
    st = dhsa_session_eval(ref, ids, N_A, want);
    if (!st) st = dhsa_session_eval(s, ids, N_A, got);
    if (!st) st = dhsa_session_eval(s, ids + N_A, N_C, got);
    int32_t t = argmax(got + (N_C - 1) * V, V);
    for (int i = 0; i < 5 && !st; i++) {
        st = dhsa_session_eval(s, &t, 1, got);
        t = argmax(got, V);
    }
    T_CHECK(st == DHSA_OK && dhsa_session_length(s) == N_A + N_C + 5, "%s: A, 150 tokens, 5 decode steps: %s", nm,
            dhsa_last_error());
    if (st) goto done;
    T_CHECK(dhsa_session_truncate(s, N_A + N_C + 6) == DHSA_ERR_INVALID_ARG &&
                dhsa_session_length(s) == N_A + N_C + 5,
            "%s: truncating beyond the length is refused and changes nothing", nm);
    T_CHECK(dhsa_session_truncate(s, N_A + N_C + 5) == DHSA_OK && dhsa_session_length(s) == N_A + N_C + 5,
            "%s: truncating to the length does nothing: %s", nm, dhsa_last_error());
    st = dhsa_session_truncate(s, N_A);
    T_CHECK(st == DHSA_OK && dhsa_session_length(s) == N_A, "%s: truncate to %d: %s, length %lld", nm, N_A,
            dhsa_last_error(), (long long)dhsa_session_length(s));
    if (st) goto done;
    st = dhsa_session_eval(ref, ids + N_A, N_B, want);
    if (!st) st = dhsa_session_eval(s, ids + N_A, N_B, got);
    T_CHECK(st == DHSA_OK && same_bits(nm, got, want, N_B * V),
            "%s: the continuation after the cut: %s, logits equal to those of a session that only saw the prefix",
            nm, st ? dhsa_last_error() : "ran");
    if (st) goto done;
    int32_t tr = argmax(want + (N_B - 1) * V, V), ts = argmax(got + (N_B - 1) * V, V);
    int same = 1, ok = 1;
    for (int i = 0; i < N_DECODE && ok; i++) {
        ok = dhsa_session_eval(ref, &tr, 1, want) == DHSA_OK && dhsa_session_eval(s, &ts, 1, got) == DHSA_OK;
        if (ok && !same_bits(nm, got, want, V)) same = 0;
        tr = argmax(want, V);
        ts = argmax(got, V);
    }
    T_CHECK(ok && same, "%s: greedy decoding after the cut: %s, logits %s", nm, ok ? "runs" : dhsa_last_error(),
            same ? "the same" : "differ");
    /* to 0, then A again: A's logits */
    st = dhsa_session_truncate(s, 0);
    if (!st) st = dhsa_session_eval(s, ids, N_A, got);
    dhsa_session_reset(ref);
    if (!st) st = dhsa_session_eval(ref, ids, N_A, want);
    T_CHECK(st == DHSA_OK && same_bits(nm, got, want, N_A * V), "%s: truncate to 0, then the prompt again: %s", nm,
            st ? dhsa_last_error() : "logits differ");
done:
    dhsa_session_free(ref);
    dhsa_session_free(s);
    free(want);
    free(got);
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
    T_CHECK(dhsa_session_truncate(NULL, 0) == DHSA_ERR_INVALID_ARG, "a NULL session is refused");
    int32_t ids[N_A + N_C];
    if (m && ctx && make_ids(m, ids, N_A + N_C) == N_A + N_C) {
        check_method(ctx, m, "dense", DHSA_ATTN_DENSE, ids);
        check_method(ctx, m, "dhsa", DHSA_ATTN_DHSA, ids);
        check_method(ctx, m, "block", DHSA_ATTN_BLOCK, ids);
        check_method(ctx, m, "stream", DHSA_ATTN_STREAM, ids);
        check_method(ctx, m, "oracle", DHSA_ATTN_ORACLE, ids);
    } else {
        T_CHECK(0, "%d prompt ids from the model's tokenizer", N_A + N_C);
    }
    dhsa_ctx_free(ctx);
    dhsa_model_free(m);
    return t_report("test_session_truncate");
}
