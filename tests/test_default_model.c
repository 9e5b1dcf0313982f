/* test_default_model.c: the shipped default model (models/, part of the
 * repo; needs nothing from ../shared).
 *
 *   - greedy decoding of every case in models/NAME.vectors.txt (F16) and
 *     models/NAME-q8_0.vectors.txt, token for token, against the PyTorch
 *     forward on the same file's weights (train/vectors.py wrote them), at 1
 *     and 2 threads and with ubatch 64 (prefill split across calls);
 *   - the passkey and multikey cases (held-out filler and keys) answered
 *     right by the greedy continuation: the shipped model retrieves
 *     (multivalue is held to PyTorch's ids only: the model does not answer
 *     it reliably, models/README.md);
 *   - the same passkey case with DHSA routing (dense_below 0, density
 *     0.25): routing really active (the hook sees layouts) and the answer
 *     right;
 *   - `dhsa run` without -m finds the default model (DHSA_CLI).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_run.h"
#include "dhsa.h"
#include "t.h"

#define NAME "models/dhsa-retrieval-8m"
#define MAX_CASES 8
#define MAX_IDS 4096

typedef struct {
    char name[32];
    int32_t prompt[MAX_IDS], expect[64];
    int64_t n_prompt, n_expect;
    char answer[256];
} vcase;

static int64_t parse_ids(const char *s, int32_t *out, int64_t cap) {
    int64_t n = 0;
    char *end;
    for (;;) {
        long v = strtol(s, &end, 10);
        if (end == s || n == cap) break;
        out[n++] = (int32_t)v;
        s = end;
    }
    return n;
}

static int read_vectors(const char *path, vcase *c, int cap) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    static char line[1 << 16];
    int n = -1;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (strncmp(line, "case ", 5) == 0 && n + 1 < cap) {
            n++;
            memset(&c[n], 0, sizeof c[n]);
            snprintf(c[n].name, sizeof c[n].name, "%.31s", line + 5);
        } else if (n >= 0 && strncmp(line, "prompt ", 7) == 0) {
            c[n].n_prompt = parse_ids(line + 7, c[n].prompt, MAX_IDS);
        } else if (n >= 0 && strncmp(line, "expect ", 7) == 0) {
            c[n].n_expect = parse_ids(line + 7, c[n].expect, 64);
        } else if (n >= 0 && strncmp(line, "answer ", 7) == 0) {
            snprintf(c[n].answer, sizeof c[n].answer, "%.255s", line + 7);
        }
    }
    fclose(f);
    return n + 1;
}

typedef struct {
    int64_t layouts, calls;
} hook_count;

static int count_hook(void *user, int64_t layer, const dhsa_attn_desc *a) {
    (void)layer;
    hook_count *h = user;
    h->calls++;
    h->layouts += a->layout != NULL;
    return 0;
}

/* Greedy ids after the prompt (stops at EOS, which is kept). */
static int64_t greedy(dhsa_ctx *ctx, const dhsa_model *m, const dhsa_session_params *sp, const vcase *c, int32_t *out,
                      int64_t n_max) {
    const dhsa_model_info *in = dhsa_model_get_info(m);
    int32_t eos = dhsa_tokenizer_eos(dhsa_model_tokenizer(m));
    dhsa_session *s = NULL;
    float *lg = malloc((size_t)in->n_vocab * sizeof(float));
    int64_t n = -1;
    if (lg && dhsa_session_create(ctx, m, sp, &s) == DHSA_OK && dhsa_session_eval(s, c->prompt, c->n_prompt, lg) == 0) {
        n = 0;
        while (n < n_max) {
            int32_t best = 0;
            for (int64_t i = 1; i < in->n_vocab; i++)
                if (lg[i] > lg[best]) best = (int32_t)i;
            out[n++] = best;
            if (best == eos || n == n_max) break;
            if (dhsa_session_eval(s, &best, 1, lg)) {
                n = -1;
                break;
            }
        }
    }
    if (n < 0) fprintf(stderr, "greedy %s: %s\n", c->name, dhsa_last_error());
    dhsa_session_free(s);
    free(lg);
    return n;
}

static int answer_right(const dhsa_model *m, const vcase *c, const int32_t *ids, int64_t n) {
    char text[512];
    int64_t len = 0;
    int32_t eos = dhsa_tokenizer_eos(dhsa_model_tokenizer(m));
    while (n > 0 && ids[n - 1] == eos) n--;
    if (dhsa_detokenize(dhsa_model_tokenizer(m), ids, n, 0, text, sizeof text - 1, &len)) return 0;
    text[len] = 0;
    const char *t = text;
    while (*t == ' ') t++;
    return strncmp(t, c->answer, strlen(c->answer)) == 0;
}

static void check_file(const char *model_path, const char *vec_path) {
    vcase *cs = calloc(MAX_CASES, sizeof(vcase));
    int nc = cs ? read_vectors(vec_path, cs, MAX_CASES) : -1;
    T_CHECK(nc >= 4, "%s: %d cases read", vec_path, nc);
    dhsa_model *m = NULL;
    dhsa_model_params mp = dhsa_model_default_params();
    T_CHECK(dhsa_model_load(model_path, &mp, &m) == DHSA_OK, "load %s: %s", model_path, dhsa_last_error());
    if (!m || nc < 1) {
        dhsa_model_free(m);
        free(cs);
        return;
    }
    for (int threads = 1; threads <= 2; threads++) {
        dhsa_ctx_params cp = dhsa_ctx_default_params();
        cp.n_threads = threads;
        dhsa_ctx *ctx = NULL;
        if (dhsa_ctx_create(&cp, &ctx)) continue;
        for (int k = 0; k < nc; k++) {
            const vcase *c = &cs[k];
            dhsa_session_params sp = dhsa_session_default_params();
            sp.n_ctx = c->n_prompt + 64;
            if (threads == 2) sp.n_ubatch = 64;
            int32_t got[64];
            int64_t n = greedy(ctx, m, &sp, c, got, c->n_expect);
            int same = n == c->n_expect;
            int64_t at = -1;
            for (int64_t i = 0; same && i < n; i++)
                if (got[i] != c->expect[i]) {
                    same = 0;
                    at = i;
                }
            T_CHECK(same, "%s %s, %d thread(s): greedy ids differ from PyTorch's (%lld of %lld tokens; first "
                    "difference at %lld: %d vs %d)", model_path, c->name, threads, (long long)n,
                    (long long)c->n_expect, (long long)at, at >= 0 ? got[at] : -1, at >= 0 ? c->expect[at] : -1);
            /* The shipped model finds pass keys (100% held out at 1K-8K) and multikey answers
             * (0.945 at 1K-8K); it does not answer multivalue reliably (models/README.md), so that
             * case is held to PyTorch's ids above only. */
            if ((strcmp(c->name, "passkey") == 0 || strcmp(c->name, "multikey") == 0) && threads == 1)
                T_CHECK(answer_right(m, c, got, n > 0 ? n : 0), "%s %s: the greedy answer is not \"%s\"", model_path,
                        c->name, c->answer);
            if (strcmp(c->name, "passkey") == 0 && threads == 1) {
                hook_count hc = {0, 0};
                sp.attn = DHSA_ATTN_DHSA;
                sp.router.dense_below = 0;
                sp.router.density = 0.25;
                sp.layer_hook = count_hook;
                sp.layer_hook_user = &hc;
                n = greedy(ctx, m, &sp, c, got, c->n_expect);
                T_CHECK(n > 0 && hc.layouts > 0 && hc.layouts == hc.calls, "dhsa routing active in every call "
                        "(%lld of %lld)", (long long)hc.layouts, (long long)hc.calls);
                T_CHECK(n > 0 && answer_right(m, c, got, n), "%s passkey with DHSA at density 0.25: wrong answer",
                        model_path);
            }
        }
        dhsa_ctx_free(ctx);
    }
    dhsa_model_free(m);
    free(cs);
}

int main(void) {
    check_file(NAME ".gguf", NAME ".vectors.txt");
    check_file(NAME "-q8_0.gguf", NAME "-q8_0.vectors.txt");
    if (getenv("DHSA_CLI")) {
        char *out = NULL;
        int rc = cli_run("run -p 'The pass key is' -n 8 --temp 0 --threads 1", 0, &out);
        T_CHECK(rc == 0 && out && strstr(out, "(the default; -m MODEL for another)") &&
                    strstr(out, "dhsa-retrieval-8m.gguf") && strstr(out, "decode: "),
                "dhsa run without -m uses the default model and says so: exit %d, \"%s\"", rc, out ? out : "");
        free(out);
    } else {
        T_SKIP(1, "DHSA_CLI unset: the CLI check is skipped (make test sets it)");
    }
    return t_report("test_default_model");
}
