/* test_session_fail.c: a session after a failed eval (include/dhsa.h,
 * dhsa_session_eval): the tokens committed before the failed call stay,
 * the failed call's tokens are not added, and the next eval works, for
 * every attention method.
 *
 * On the default model (models/dhsa-retrieval-8m.gguf), for dense, dhsa
 * (similarity boundaries, and learned ones with a random predictor), block,
 * stream and oracle, with routing really active (dense_below 0, a budget
 * of 48 keys, blocks of 16 rows): a session evaluates a prompt, then sees
 * failed calls: a layer hook that stops the eval in its second ubatch of
 * three, then in its first layer, an id out of range, more tokens than the
 * cache holds; then it goes on with a continuation and greedy decoding, with
 * one more failed single-token eval in the middle of the decoding. Every
 * logit it gives after the failures equals, bit for bit, that of a session
 * that never saw them, and its length is the committed one after each.
 *
 * Run: make build/tests/test_session_fail && build/tests/test_session_fail
 * (or `make test`; from the repository root, where models/ is). Ends with
 * "test_session_fail: P passed, F failed".
 */
#include "dhsa.h"
#include "t.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MODEL "models/dhsa-retrieval-8m.gguf"
#define N_A 100      /* the prompt */
#define N_FAIL 150   /* the failed call: three ubatches of 64 */
#define N_B 40       /* the continuation */
#define N_DECODE 8

/* Stops the eval at the stop_at-th layer call after it is armed. */
typedef struct {
    int armed, calls, stop_at;
} stopper;

static int stop_hook(void *user, int64_t layer, const dhsa_attn_desc *a) {
    (void)layer;
    (void)a;
    stopper *h = user;
    if (!h->armed) return 0;
    return ++h->calls == h->stop_at;
}

static void arm(stopper *h, int stop_at) {
    h->armed = 1;
    h->calls = 0;
    h->stop_at = stop_at;
}

/* ids of a deterministic text: the built-in filler sentences. */
static int64_t make_ids(const dhsa_model *m, int32_t *ids, int64_t n) {
    int64_t ns = 0;
    const char *const *sent = dhsa_task_builtin_sentences(&ns);
    char text[16384] = "";
    size_t len = 0;
    for (int64_t i = 0; len + 512 < sizeof text && ns > 0; i++) {
        int w = snprintf(text + len, sizeof text - len, "%s ", sent[(i * 5 + 2) % ns]);
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

/* 1 if a[0..n) == b[0..n) bit for bit; else prints the largest difference. */
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

typedef struct {
    const char *name;
    dhsa_attn_method attn;
    int learned;
} method;

static void check_method(dhsa_ctx *ctx, const dhsa_model *m, const dhsa_predictor *pr, const method *me,
                         const int32_t *ids) {
    const int64_t V = dhsa_model_get_info(m)->n_vocab;
    const char *nm = me->name;
    dhsa_session_params sp = dhsa_session_default_params();
    sp.kv_type = DHSA_F32; /* compared with F32 references (the default is F16) */
    sp.n_ctx = 512;
    sp.n_ubatch = 64;
    sp.attn = me->attn;
    sp.logits_all = 1;
    sp.router.dense_below = 0;
    sp.router.budget_tokens = 48;
    sp.router.sink_tokens = 4;
    sp.router.local_tokens = 16;
    sp.router.q_block = 16;
    sp.router.min_chunk = 8;
    sp.router.nms_window = 4;
    if (me->learned) {
        sp.router.boundary = DHSA_BOUNDARY_LEARNED;
        sp.router.predictor = pr;
        sp.router.learned_threshold = 0.0f; /* a random predictor: the online rule decides */
    }
    stopper hr = {0, 0, 0}, hs = {0, 0, 0};
    sp.layer_hook = stop_hook;
    sp.layer_hook_user = &hr;
    dhsa_session *ref = NULL, *s = NULL;
    dhsa_status st = dhsa_session_create(ctx, m, &sp, &ref);
    sp.layer_hook_user = &hs;
    if (!st) st = dhsa_session_create(ctx, m, &sp, &s);
    float *want = malloc((size_t)(N_FAIL * V) * sizeof(float)), *got = malloc((size_t)(N_FAIL * V) * sizeof(float));
    T_CHECK(st == DHSA_OK && want && got, "%s: two sessions: %s", nm, dhsa_last_error());
    if (st || !want || !got) goto done;

    /* the prompt, in both */
    st = dhsa_session_eval(ref, ids, N_A, want);
    if (!st) st = dhsa_session_eval(s, ids, N_A, got);
    T_CHECK(st == DHSA_OK && same_bits(nm, got, want, N_A * V), "%s: the prompt: %s", nm, dhsa_last_error());
    if (st) goto done;
    const int64_t n_layer = dhsa_model_get_info(m)->n_layer;

    /* failed calls on s only */
    arm(&hs, (int)(n_layer + 3)); /* the second ubatch's third layer */
    st = dhsa_session_eval(s, ids + N_A, N_FAIL, got);
    hs.armed = 0;
    T_CHECK(st == DHSA_ERR_INVALID_ARG && dhsa_session_length(s) == N_A,
            "%s: an eval stopped in its second ubatch: %s (want DHSA_ERR_INVALID_ARG), length %lld (want %d: the "
            "call's first ubatch is not kept)",
            nm, dhsa_status_str(st), (long long)dhsa_session_length(s), N_A);
    arm(&hs, 1); /* the first layer of the first ubatch */
    st = dhsa_session_eval(s, ids + 3, N_FAIL, got);
    hs.armed = 0;
    T_CHECK(st == DHSA_ERR_INVALID_ARG && dhsa_session_length(s) == N_A,
            "%s: a second failed eval, at its first layer: %s, length %lld (want %d)", nm, dhsa_status_str(st),
            (long long)dhsa_session_length(s), N_A);
    int32_t bad[3] = {ids[0], (int32_t)V, ids[1]};
    st = dhsa_session_eval(s, bad, 3, got);
    T_CHECK(st == DHSA_ERR_INVALID_ARG && dhsa_session_length(s) == N_A, "%s: an id out of range: %s, length %lld",
            nm, dhsa_status_str(st), (long long)dhsa_session_length(s));
    int32_t many[512 - N_A + 1];
    for (int i = 0; i < 512 - N_A + 1; i++) many[i] = ids[i % N_A];
    st = dhsa_session_eval(s, many, 512 - N_A + 1, NULL);
    T_CHECK(st == DHSA_ERR_TOO_LARGE && dhsa_session_length(s) == N_A,
            "%s: more tokens than the cache holds: %s, length %lld", nm, dhsa_status_str(st),
            (long long)dhsa_session_length(s));

    /* the continuation: as if nothing had failed */
    st = dhsa_session_eval(ref, ids + N_A, N_B, want);
    T_CHECK(st == DHSA_OK, "%s: the reference's continuation: %s", nm, dhsa_last_error());
    st = dhsa_session_eval(s, ids + N_A, N_B, got);
    T_CHECK(st == DHSA_OK, "%s: the eval after the failed ones: %s (%s)", nm, dhsa_status_str(st),
            dhsa_last_error());
    if (st) goto done;
    T_CHECK(same_bits(nm, got, want, N_B * V) && dhsa_session_length(s) == N_A + N_B,
            "%s: after four failed evals the continuation's logits (%d tokens) differ from those of a session that "
            "never saw them",
            nm, N_B);

    /* greedy decoding, one failed single-token eval after the third token */
    int32_t tr = argmax(want + (N_B - 1) * V, V), ts = argmax(got + (N_B - 1) * V, V);
    int decode_same = 1, decode_ok = 1;
    for (int i = 0; i < N_DECODE && decode_ok; i++) {
        if (i == 3) {
            arm(&hs, (int)n_layer); /* its last layer */
            dhsa_status fst = dhsa_session_eval(s, &ts, 1, got);
            hs.armed = 0;
            T_CHECK(fst == DHSA_ERR_INVALID_ARG && dhsa_session_length(s) == N_A + N_B + 3,
                    "%s: a failed decode step: %s, length %lld", nm, dhsa_status_str(fst),
                    (long long)dhsa_session_length(s));
        }
        decode_ok = dhsa_session_eval(ref, &tr, 1, want) == DHSA_OK && dhsa_session_eval(s, &ts, 1, got) == DHSA_OK;
        if (decode_ok && !same_bits(nm, got, want, V)) decode_same = 0;
        tr = argmax(want, V);
        ts = argmax(got, V);
    }
    T_CHECK(decode_ok && decode_same, "%s: greedy decoding after a failed decode step: %s, logits %s", nm,
            decode_ok ? "runs" : dhsa_last_error(), decode_same ? "the same" : "differ");

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
    int32_t ids[N_A + N_FAIL];
    if (m && ctx && make_ids(m, ids, N_A + N_FAIL) == N_A + N_FAIL) {
        const dhsa_model_info *in = dhsa_model_get_info(m);
        dhsa_predictor *pr = NULL;
        T_CHECK(dhsa_predictor_create_random(in->n_head_kv * in->head_dim_k, 4, 32, 7, &pr) == DHSA_OK,
                "random predictor: %s", dhsa_last_error());
        const method ms[] = {
            {"dense", DHSA_ATTN_DENSE, 0},  {"dhsa", DHSA_ATTN_DHSA, 0},     {"dhsa-learned", DHSA_ATTN_DHSA, 1},
            {"block", DHSA_ATTN_BLOCK, 0}, {"stream", DHSA_ATTN_STREAM, 0}, {"oracle", DHSA_ATTN_ORACLE, 0},
        };
        for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
            if (!ms[i].learned || pr) check_method(ctx, m, pr, &ms[i], ids);
        /* issue 34: logits after 0 tokens are refused, never an earlier eval's */
        dhsa_session *s0 = NULL;
        float *lg = malloc((size_t)in->n_vocab * sizeof *lg);
        if (lg && dhsa_session_create(ctx, m, NULL, &s0) == DHSA_OK) {
            dhsa_status a = dhsa_session_eval(s0, ids, 4, lg);
            dhsa_status z = dhsa_session_eval(s0, ids, 0, lg);
            int said = strstr(dhsa_last_error(), "0 tokens give no logits") != NULL;
            dhsa_status zn = dhsa_session_eval(s0, ids, 0, NULL);
            T_CHECK(a == DHSA_OK && z == DHSA_ERR_INVALID_ARG && said && zn == DHSA_OK && dhsa_session_length(s0) == 4,
                    "an eval of 0 tokens with a logits buffer is refused (%d, said %d), without one does nothing (%d)",
                    (int)z, said, (int)zn);
        }
        dhsa_session_free(s0);
        free(lg);
        dhsa_predictor_free(pr);
    } else {
        T_CHECK(0, "%d prompt ids from the model's tokenizer", N_A + N_FAIL);
    }
    dhsa_ctx_free(ctx);
    dhsa_model_free(m);
    return t_report("test_session_fail");
}
