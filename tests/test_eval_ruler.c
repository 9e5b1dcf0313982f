/* test_eval_ruler.c: the RULER-style suite (src/eval/ruler.c, dhsa.h
 * dhsa_ruler_*; `dhsa eval ruler`, docs/eval.md "eval ruler").
 *
 *   - prompt construction with the shipped model's tokenizer: every preset
 *     within 3% under the target length, the ids those of the prompt's
 *     text, the needle at the depth (measured here from the text), the
 *     expected strings where the task says (needle sentences, CWE and FWE
 *     counts recounted from the list), deterministic by seed;
 *   - disjoint DEV / TEST pools (word keys and values, CWE words, noise,
 *     prose), on enough draws that pools mixed would collide;
 *   - scoring: RULER's string_match_all with partial credit, on crafted
 *     answers;
 *   - bad input refused;
 *   - end to end through the CLI on the shipped default model: the TSV of
 *     every answer, scores recomputed here, resume after a finished run and
 *     after one cut mid-line, another run's file refused.
 * Prose and CWE parts need the Debian packages gnu-standards and wamerican
 * (.ci/run installs them) and skip without them.
 * Run: make build/tests/test_eval_ruler && DHSA_CLI=build/dhsa build/tests/test_eval_ruler
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "cli_run.h"
#include "dhsa.h"
#include "t.h"

#define MODEL "models/dhsa-retrieval-8m.gguf"

static const char *const noise_presets[] = {"single_noise", "single_word", "multikey_needles", "multikey_uuid", "vt",
                                            "fwe"};
static const char *const prose_presets[] = {"single_prose", "single_uuid", "multikey", "multivalue", "multiquery"};

static char *prose[2], *words;
static int64_t prose_len[2], words_len;

static int64_t n_tokens(const dhsa_tokenizer *tok, const char *s, int64_t len, unsigned flags) {
    int64_t n = 0;
    dhsa_tokenize(tok, s, len, flags, NULL, 0, &n);
    return n;
}

static dhsa_ruler_params params_for(const char *name, int64_t L, double depth, uint64_t seed, int split) {
    dhsa_ruler_params p = dhsa_ruler_default_params();
    dhsa_ruler_preset(name, &p);
    p.length = L;
    p.depth = depth;
    p.seed = seed;
    p.split = (dhsa_ruler_split)split;
    p.prose = prose[split];
    p.prose_len = prose_len[split];
    p.words = words;
    p.words_len = words_len;
    return p;
}

/* Occurrences of " w " (or at the ends) among the list's space-separated items. */
static int64_t count_word(const char *text, const char *w) {
    int64_t n = 0, k = (int64_t)strlen(w);
    for (const char *s = strstr(text, w); s; s = strstr(s + 1, w))
        if ((s == text || s[-1] == ' ') && (s[k] == ' ' || s[k] == '\n' || s[k] == 0)) n++;
    return n;
}

/* Length, ids, expected strings of one built prompt. */
/* The spans (where the needles state the expected strings): NIAH and VT,
 * every expected string has one, and each span's tokens, detokenized,
 * hold its string, inside a needle sentence of the text; CWE / FWE none. */
static void check_spans(const dhsa_tokenizer *tok, const char *name, const dhsa_ruler_params *p,
                        const dhsa_ruler_prompt *pr) {
    if (p->task == DHSA_RULER_CWE || p->task == DHSA_RULER_FWE) {
        T_CHECK(pr->n_spans == 0, "%s: %d spans for a word-list task", name, pr->n_spans);
        return;
    }
    int ok = pr->n_spans > 0 && pr->n_spans <= DHSA_RULER_MAX_SPANS, has[DHSA_RULER_MAX_EXPECTED] = {0};
    char why[256] = "";
    for (int s = 0; ok && s < pr->n_spans; s++) {
        int k = pr->span_of[s];
        if (k < 0 || k >= pr->n_expected || pr->span_lo[s] < 0 || pr->span_hi[s] <= pr->span_lo[s] ||
            pr->span_hi[s] > pr->n_ids || (s > 0 && pr->span_lo[s] < pr->span_lo[s - 1])) {
            snprintf(why, sizeof why, "span %d out of order or range", s);
            ok = 0;
            break;
        }
        has[k] = 1;
        char text[512];
        int64_t len = 0;
        if (dhsa_detokenize(tok, pr->ids + pr->span_lo[s], pr->span_hi[s] - pr->span_lo[s], DHSA_DETOKENIZE_KEEP_SPACE,
                            text, (int64_t)sizeof text - 1, &len) != DHSA_OK) {
            snprintf(why, sizeof why, "span %d does not detokenize", s);
            ok = 0;
            break;
        }
        text[len] = 0;
        /* the span is the fewest tokens holding the string: no more than a token on each side */
        int64_t el = (int64_t)strlen(pr->expected[k]);
        if (!strstr(text, pr->expected[k]) || len > el + 24) {
            snprintf(why, sizeof why, "span %d is \"%.100s\", not %s", s, text, pr->expected[k]);
            ok = 0;
        }
    }
    for (int k = 0; ok && k < pr->n_expected; k++)
        if (!has[k]) {
            snprintf(why, sizeof why, "no span for %s", pr->expected[k]);
            ok = 0;
        }
    T_CHECK(ok, "%s (template %d): %d spans: %s", name, (int)p->tmpl, pr->n_spans, why);
}

static void check_prompt(const dhsa_tokenizer *tok, const char *name, const dhsa_ruler_params *p) {
    dhsa_ruler_prompt pr;
    dhsa_status st = dhsa_ruler_build(tok, p, &pr);
    T_CHECK(st == DHSA_OK, "%s at %lld: %s", name, (long long)p->length, dhsa_last_error());
    if (st) return;
    int64_t L = p->length;
    /* within 3% under, or one haystack unit (a UUID needle is about 60 tokens) */
    int64_t tol = L * 3 / 100 > 64 ? L * 3 / 100 : 64;
    T_CHECK(pr.n_ids <= L && pr.n_ids >= L - tol, "%s: %lld ids for a length %lld (want within %lld under)", name,
            (long long)pr.n_ids, (long long)L, (long long)tol);
    /* the ids are the text's (plain prompt: tokenized whole, BOS as the tokenizer says) */
    int64_t tl = (int64_t)strlen(pr.text);
    unsigned flags = dhsa_tokenizer_default_flags(tok) & DHSA_TOKENIZE_ADD_BOS;
    int32_t *ids = malloc((size_t)(pr.n_ids + 16) * sizeof(int32_t));
    int64_t n = 0;
    dhsa_tokenize(tok, pr.text, tl, flags, ids, pr.n_ids + 16, &n);
    T_CHECK(n == pr.n_ids && memcmp(ids, pr.ids, (size_t)n * sizeof(int32_t)) == 0, "%s: ids differ from the text's",
            name);
    free(ids);
    T_CHECK(pr.n_expected >= 1, "%s: nothing expected", name);
    if (p->task == DHSA_RULER_CWE || p->task == DHSA_RULER_FWE) {
        /* recount the list: the expected words are the most frequent */
        const char *list = strchr(pr.text, '\n') && p->task == DHSA_RULER_CWE ? strchr(pr.text, '\n') : pr.text;
        int64_t least = INT64_MAX;
        for (int i = 0; i < pr.n_expected; i++) {
            int64_t c = count_word(list, pr.expected[i]);
            if (c < least) least = c;
        }
        int freq_ok = p->task == DHSA_RULER_FWE || least == (L < 4096 ? 6 : 30);
        T_CHECK(least > 0 && freq_ok, "%s: an expected word occurs %lld times", name, (long long)least);
        /* no other item as frequent: scan the list's words */
        char *copy = strdup(list);
        int64_t worst = 0;
        char worst_w[64] = "";
        for (char *tk = strtok(copy, " \n"); tk; tk = strtok(NULL, " \n")) {
            size_t k = strlen(tk);
            if (k < 3 || tk[k - 1] == '.' || strchr(tk, '?') || strchr(tk, ':')) continue; /* numbers, question */
            int expected = 0;
            for (int i = 0; i < pr.n_expected; i++) expected |= strcmp(tk, pr.expected[i]) == 0;
            if (expected || strcmp(tk, "....") == 0) continue;
            int64_t c = count_word(list, tk);
            if (c > worst) {
                worst = c;
                snprintf(worst_w, sizeof worst_w, "%s", tk);
            }
        }
        free(copy);
        T_CHECK(worst < least, "%s: \"%s\" occurs %lld times, an expected word %lld", name, worst_w, (long long)worst,
                (long long)least);
    } else {
        int all = 1;
        for (int i = 0; i < pr.n_expected; i++) {
            char needle[160];
            if (p->task == DHSA_RULER_VT) snprintf(needle, sizeof needle, "VAR %s = ", pr.expected[i]);
            else snprintf(needle, sizeof needle, "is: %s.", pr.expected[i]);
            all &= strstr(pr.text, needle) != NULL;
        }
        T_CHECK(all, "%s: an expected value's needle is not in the prompt", name);
    }
    check_spans(tok, name, p, &pr);
    /* deterministic: the same params give the same ids */
    dhsa_ruler_prompt again;
    st = dhsa_ruler_build(tok, p, &again);
    T_CHECK(st == DHSA_OK && again.n_ids == pr.n_ids &&
                memcmp(again.ids, pr.ids, (size_t)pr.n_ids * sizeof(int32_t)) == 0,
            "%s: two builds with one seed differ", name);
    dhsa_ruler_free(&again);
    dhsa_ruler_free(&pr);
}

/* The needle's depth measured from the text: tokens of the haystack
 * before the needle sentence over the haystack's tokens. */
static void check_depth(const dhsa_tokenizer *tok) {
    double worst = 0, worst_d = 0;
    for (int k = 0; k <= 8; k++) {
        double depth = k / 8.0;
        dhsa_ruler_params p = params_for("single_noise", 2048, depth, 11 + (uint64_t)k, DHSA_RULER_TEST);
        dhsa_ruler_prompt pr;
        if (dhsa_ruler_build(tok, &p, &pr)) {
            T_CHECK(0, "single_noise depth %g: %s", depth, dhsa_last_error());
            return;
        }
        const char *t = pr.text, *body = strchr(t, '\n') + 1, *q = strstr(t, "\nWhat is the secret");
        char pat[96];
        snprintf(pat, sizeof pat, "The secret number for");
        const char *nd = strstr(body, pat);
        const char *nd_end = strchr(nd, '\n');
        int64_t before = n_tokens(tok, body, nd - body, 0);
        int64_t after = n_tokens(tok, nd_end ? nd_end + 1 : q, q - (nd_end ? nd_end + 1 : q), 0);
        double measured = (double)before / (double)(before + after);
        double err = fabs(measured - depth);
        if (err > worst) {
            worst = err;
            worst_d = depth;
        }
        T_CHECK(fabs(pr.depth_used - measured) < 0.01, "depth %g: depth_used %.4f, measured %.4f", depth,
                pr.depth_used, measured);
        dhsa_ruler_free(&pr);
    }
    /* one noise sentence is about 8 tokens of about 1900: a boundary is within 0.5% */
    T_CHECK(worst < 0.01, "the needle is %.4f away from depth %g", worst, worst_d);
}

/* Values seen over many prompts of each split: the two sets never meet. */
static void check_pools(const dhsa_tokenizer *tok) {
    enum { N = 150 };
    static char seen[2][N * 2][48];
    int n_seen[2] = {0, 0};
    for (int split = 0; split < 2; split++)
        for (int s = 0; s < N; s++) {
            dhsa_ruler_params p = params_for("single_word", 128, 0.5, 1000 + (uint64_t)s, split);
            dhsa_ruler_prompt pr;
            if (dhsa_ruler_build(tok, &p, &pr)) {
                T_CHECK(0, "single_word: %s", dhsa_last_error());
                return;
            }
            memcpy(seen[split][n_seen[split]++], pr.expected[0], 48);
            /* the key: "for KEY is:" */
            const char *f = strstr(pr.text, "secret word for ");
            if (f) sscanf(f + 16, "%47[a-z-]", seen[split][n_seen[split]++]);
            dhsa_ruler_free(&pr);
        }
    int common = 0;
    for (int i = 0; i < n_seen[0]; i++)
        for (int j = 0; j < n_seen[1]; j++) common += strcmp(seen[0][i], seen[1][j]) == 0;
    /* 300 draws a split from 12,600 pairs: mixed pools would share about 7 */
    T_CHECK(common == 0 && n_seen[0] == 2 * N, "dev and test word keys/values share %d strings", common);
    /* within a split, repeats do happen: the pool is the split's half, not a list of N */
    int repeats = 0;
    for (int i = 0; i < n_seen[1]; i++)
        for (int j = i + 1; j < n_seen[1]; j++) repeats += strcmp(seen[1][i], seen[1][j]) == 0;
    T_CHECK(repeats > 0, "no repeated draw within a split (the check above would be weak)");
    /* the noise differs */
    dhsa_ruler_params pd = params_for("single_noise", 256, 0.5, 1, DHSA_RULER_DEV);
    dhsa_ruler_params pt = params_for("single_noise", 256, 0.5, 1, DHSA_RULER_TEST);
    dhsa_ruler_prompt a, b;
    if (dhsa_ruler_build(tok, &pd, &a) == DHSA_OK && dhsa_ruler_build(tok, &pt, &b) == DHSA_OK) {
        const char *la = strchr(a.text, '\n') + 1, *lb = strchr(b.text, '\n') + 1;
        char sa[64], sb[64];
        sscanf(la, "%63[^\n]", sa);
        sscanf(lb, "%63[^\n]", sb);
        T_CHECK(strstr(b.text, sa) == NULL && strstr(a.text, sb) == NULL, "dev and test noise share \"%s\"", sa);
    } else {
        T_CHECK(0, "noise prompts: %s", dhsa_last_error());
    }
    dhsa_ruler_free(&a);
    dhsa_ruler_free(&b);
    /* CWE words */
    if (!words) {
        T_SKIP(1, "no /usr/share/dict/words (Debian package wamerican; .ci/run installs it): CWE pools unchecked");
    } else {
        static char cw[2][400][48];
        int nc[2] = {0, 0};
        for (int split = 0; split < 2; split++)
            for (int s = 0; s < 40; s++) {
                dhsa_ruler_params p = params_for("cwe", 1024, 0, 500 + (uint64_t)s, split);
                dhsa_ruler_prompt pr;
                if (dhsa_ruler_build(tok, &p, &pr)) break;
                for (int i = 0; i < pr.n_expected && nc[split] < 400; i++) memcpy(cw[split][nc[split]++], pr.expected[i], 48);
                dhsa_ruler_free(&pr);
            }
        int cc = 0;
        for (int i = 0; i < nc[0]; i++)
            for (int j = 0; j < nc[1]; j++) cc += strcmp(cw[0][i], cw[1][j]) == 0;
        T_CHECK(cc == 0 && nc[0] == 400 && nc[1] == 400, "dev and test CWE words share %d (of %d, %d)", cc, nc[0],
                nc[1]);
    }
    if (!prose[0] || !prose[1]) {
        T_SKIP(1, "no /usr/share/doc/gnu-standards (Debian package gnu-standards; .ci/run installs it): prose split "
               "unchecked");
    } else {
        /* no paragraph of the dev text is in the test text */
        int shared = 0;
        char *copy = strdup(prose[0]);
        for (char *ln = strtok(copy, "\n"); ln; ln = strtok(NULL, "\n")) shared += strlen(ln) > 80 && strstr(prose[1], ln);
        free(copy);
        T_CHECK(shared == 0 && strcmp(prose[0], prose[1]) != 0, "dev and test prose share %d paragraphs", shared);
    }
}

static void check_score(void) {
    dhsa_ruler_prompt pr;
    memset(&pr, 0, sizeof pr);
    const char *exp4[] = {"1234567", "2345678", "3456789", "4567890"};
    pr.n_expected = 4;
    for (int i = 0; i < 4; i++) snprintf(pr.expected[i], 48, "%s", exp4[i]);
    const char *a = "The numbers are 1234567 and 2345678.";
    T_CHECK(dhsa_ruler_score(&pr, a, (int64_t)strlen(a)) == 0.5, "two of four: %g", dhsa_ruler_score(&pr, a, (int64_t)strlen(a)));
    a = "4567890, 3456789, 2345678, 1234567";
    T_CHECK(dhsa_ruler_score(&pr, a, (int64_t)strlen(a)) == 1.0, "all four in any order");
    a = "none here 123456";
    T_CHECK(dhsa_ruler_score(&pr, a, (int64_t)strlen(a)) == 0.0, "none");
    /* substrings count, as in RULER */
    a = "x12345678"; /* holds 1234567 and 2345678 */
    T_CHECK(dhsa_ruler_score(&pr, a, (int64_t)strlen(a)) == 0.5, "substrings count");
    /* only len bytes are read */
    a = "1234567 2345678";
    T_CHECK(dhsa_ruler_score(&pr, a, 7) == 0.25, "len bounds the answer");
    pr.n_expected = 1;
    snprintf(pr.expected[0], 48, "quiet-harbor");
    a = "It is QUIET-Harbor.";
    T_CHECK(dhsa_ruler_score(&pr, a, (int64_t)strlen(a)) == 1.0, "case-insensitive");
    a = "quiet harbor";
    T_CHECK(dhsa_ruler_score(&pr, a, (int64_t)strlen(a)) == 0.0, "a different string does not count");
    pr.n_expected = 0;
    T_CHECK(dhsa_ruler_score(&pr, "x", 1) == 0.0 && dhsa_ruler_score(NULL, "x", 1) == 0.0, "nothing expected: 0");
}

static void check_errors(const dhsa_tokenizer *tok) {
    dhsa_ruler_prompt pr;
    dhsa_ruler_params p = params_for("single_noise", 32, 0.5, 1, 1);
    T_CHECK(dhsa_ruler_build(tok, &p, &pr) == DHSA_ERR_INVALID_ARG && pr.ids == NULL, "length 32 refused");
    p = params_for("single_noise", 1024, 1.5, 1, 1);
    T_CHECK(dhsa_ruler_build(tok, &p, &pr) == DHSA_ERR_INVALID_ARG, "depth 1.5 refused");
    p = params_for("single_prose", 1024, 0.5, 1, 1);
    p.prose = NULL;
    p.prose_len = 0;
    T_CHECK(dhsa_ruler_build(tok, &p, &pr) == DHSA_ERR_INVALID_ARG && strstr(dhsa_last_error(), "prose"),
            "prose haystack without prose refused: %s", dhsa_last_error());
    p = params_for("single_noise", 1024, 0.5, 1, 1);
    p.haystack = DHSA_RULER_NEEDLES;
    T_CHECK(dhsa_ruler_build(tok, &p, &pr) == DHSA_ERR_INVALID_ARG, "a needle haystack for SINGLE refused");
    p = params_for("cwe", 1024, 0.5, 1, 1);
    p.words = NULL;
    p.words_len = 0;
    T_CHECK(dhsa_ruler_build(tok, &p, &pr) == DHSA_ERR_INVALID_ARG, "cwe without words refused");
    p = params_for("multivalue", 1024, 0.5, 1, 1);
    p.n_values = 40;
    p.prose = "A sentence of prose. Another one.";
    p.prose_len = (int64_t)strlen(p.prose);
    T_CHECK(dhsa_ruler_build(tok, &p, &pr) == DHSA_ERR_INVALID_ARG, "40 values refused");
    T_CHECK(dhsa_ruler_preset("nope", &p) == DHSA_ERR_INVALID_ARG && strstr(dhsa_last_error(), "single_noise"),
            "unknown preset refused, naming the tasks");
    char *t;
    int64_t n;
    T_CHECK(dhsa_ruler_load_prose("/nonexistent", DHSA_RULER_TEST, &t, &n) == DHSA_ERR_IO &&
                strstr(dhsa_last_error(), "gnu-standards"),
            "missing prose names the package: %s", dhsa_last_error());
    T_CHECK(dhsa_ruler_load_words("/nonexistent/words", &t, &n) == DHSA_ERR_IO &&
                strstr(dhsa_last_error(), "wamerican"),
            "missing words name the package");
}

/* Spans through chat templates: the user turn wraps the text, the spans
 * still land on the values. */
static void check_template_spans(const dhsa_tokenizer *tok) {
    const dhsa_chat_template tm[] = {DHSA_CHAT_CHATML, DHSA_CHAT_GEMMA, DHSA_CHAT_LLAMA3};
    for (int t = 0; t < 3; t++)
        for (int k = 0; k < 2; k++) {
            const char *name = k ? "vt" : "multikey_uuid";
            dhsa_ruler_params p = params_for(name, 1024, 0.4, 5, DHSA_RULER_TEST);
            p.tmpl = tm[t];
            dhsa_ruler_prompt pr;
            dhsa_status st = dhsa_ruler_build(tok, &p, &pr);
            T_CHECK(st == DHSA_OK, "%s, template %d: %s", name, (int)tm[t], dhsa_last_error());
            if (!st) check_spans(tok, name, &p, &pr);
            dhsa_ruler_free(&pr);
        }
}

/* dhsa_eval_ruler on the shipped model: the answer is dhsa_eval_generate's
 * (same ids, stops and budget), hit is RULER's full score; a dense answer
 * is explained as EVERYWHERE, a streaming one (sinks and local keys only)
 * with the needle mid-prompt as NOWHERE; bad spans refused. */
static void check_eval_ruler(const dhsa_tokenizer *tok) {
    dhsa_model *m = NULL;
    dhsa_ctx *ctx = NULL;
    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = 2;
    if (dhsa_model_load(MODEL, NULL, &m) || dhsa_ctx_create(&cp, &ctx)) {
        T_CHECK(0, "model / ctx: %s", dhsa_last_error());
        dhsa_model_free(m);
        return;
    }
    dhsa_ruler_params p = params_for("single_noise", 1024, 0.5, 3, DHSA_RULER_TEST);
    dhsa_ruler_prompt pr;
    if (dhsa_ruler_build(tok, &p, &pr)) {
        T_CHECK(0, "build: %s", dhsa_last_error());
        dhsa_ctx_free(ctx);
        dhsa_model_free(m);
        return;
    }
    const dhsa_attn_method meth[2] = {DHSA_ATTN_DENSE, DHSA_ATTN_STREAM};
    for (int i = 0; i < 2; i++) {
        dhsa_eval_answer_params ap = dhsa_eval_answer_default_params();
        ap.method.attn = meth[i];
        ap.method.router = dhsa_eval_router_params(1024, 0.0625);
        ap.max_tokens = 8;
        dhsa_eval_answer *a = calloc(1, sizeof *a), *g = calloc(1, sizeof *g);
        dhsa_status st = dhsa_eval_ruler(ctx, m, &pr, &ap, a);
        T_CHECK(st == DHSA_OK, "dhsa_eval_ruler (%d): %s", i, dhsa_last_error());
        ap.stop = pr.stop;
        ap.n_stop = pr.n_stop;
        st = dhsa_eval_generate(ctx, m, pr.ids, pr.n_ids, &ap, g);
        T_CHECK(st == DHSA_OK && strcmp(a->text, g->text) == 0 && a->n_tokens == g->n_tokens,
                "method %d: the answer \"%s\" is not dhsa_eval_generate's \"%s\"", i, a->text, g->text);
        double sc = dhsa_ruler_score(&pr, a->text, (int64_t)strlen(a->text));
        T_CHECK(a->hit == (sc >= 1.0) && a->first_wrong == 0 && a->n_layer > 0, "method %d: hit %d for score %g", i,
                a->hit, sc);
        double lo = 1, hi = 0;
        for (int64_t l = 0; l < a->n_layer; l++) {
            lo = a->selected_at_wrong[l] < lo ? a->selected_at_wrong[l] : lo;
            hi = a->selected_at_wrong[l] > hi ? a->selected_at_wrong[l] : hi;
        }
        if (i == 0)
            T_CHECK(a->needle == DHSA_EVAL_NEEDLE_EVERYWHERE && lo == 1.0, "dense: needle %d, least share %g",
                    (int)a->needle, lo);
        else
            T_CHECK(a->needle == DHSA_EVAL_NEEDLE_NOWHERE && hi == 0.0, "stream: needle %d, most share %g",
                    (int)a->needle, hi);
        free(a);
        free(g);
    }
    dhsa_eval_answer_params ap = dhsa_eval_answer_default_params();
    dhsa_eval_answer *a = calloc(1, sizeof *a);
    dhsa_ruler_prompt bad = pr;
    bad.span_hi[0] = pr.n_ids + 1;
    T_CHECK(dhsa_eval_ruler(ctx, m, &bad, &ap, a) == DHSA_ERR_INVALID_ARG, "a span past the prompt refused");
    bad = pr;
    bad.n_spans = DHSA_RULER_MAX_SPANS + 1;
    T_CHECK(dhsa_eval_ruler(ctx, m, &bad, &ap, a) == DHSA_ERR_INVALID_ARG, "too many spans refused");
    T_CHECK(dhsa_eval_ruler(ctx, m, NULL, &ap, a) == DHSA_ERR_INVALID_ARG, "NULL prompt refused");
    free(a);
    dhsa_ruler_free(&pr);
    dhsa_ctx_free(ctx);
    dhsa_model_free(m);
}

/* --------------------------------------------------------------- CLI --- */

static int count_lines(const char *path, int *complete) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    int n = 0, c, last = '\n';
    while ((c = fgetc(f)) != EOF) {
        if (c == '\n') n++;
        last = c;
    }
    fclose(f);
    *complete = last == '\n';
    return n;
}

/* RULER's score recomputed from a TSV row's expected and got fields. */
static double rescore(char *expected, const char *got) {
    int n = 0, hit = 0;
    for (char *e = strtok(expected, "|"); e; e = strtok(NULL, "|")) {
        n++;
        size_t k = strlen(e);
        for (const char *s = got; *s && !0; s++) {
            size_t j = 0;
            while (j < k && s[j] && tolower((unsigned char)s[j]) == tolower((unsigned char)e[j])) j++;
            if (j == k) {
                hit++;
                break;
            }
        }
    }
    return n ? (double)hit / n : -1;
}

static void check_cli(void) {
    const char *cli = getenv("DHSA_CLI");
    if (!cli || access(cli, X_OK) != 0) {
        T_SKIP(12, "DHSA_CLI unset or not executable (make test sets it): eval ruler CLI checks skipped");
        return;
    }
    char tsv[] = "/tmp/dhsa_test_ruler_XXXXXX";
    int fd = mkstemp(tsv);
    if (fd < 0) {
        T_CHECK(0, "mkstemp");
        return;
    }
    close(fd);
    unlink(tsv); /* the CLI starts the file */
    char args[1024], *out;
    snprintf(args, sizeof args,
             "eval ruler -m " MODEL " --tasks single_noise,vt,fwe --lengths 512 --depths 0.5 --samples 1 "
             "--attn dense,dhsa --density 0.125 --answer-tokens 8 --threads 2 --out %s --json", tsv);
    int rc = cli_run(args, 1, &out);
    T_CHECK(rc == 0 && strstr(out, "\"new_answers\": 6"), "eval ruler: rc %d: %.400s", rc, out);
    free(out);
    /* the TSV: settings, header, 3 tasks x 2 methods */
    FILE *f = fopen(tsv, "r");
    int rows = 0, good = 0;
    char line[8192];
    while (f && fgets(line, sizeof line, f)) {
        if (line[0] == '#' || strncmp(line, "task\t", 5) == 0) continue;
        rows++;
        char *fld[14];
        int k = 0;
        line[strcspn(line, "\n")] = 0;
        for (char *p = line; p && k < 14; k++) {
            fld[k] = p;
            p = strchr(p, '\t');
            if (p) *p++ = 0;
        }
        if (k != 14) continue;
        double score = strtod(fld[9], NULL);
        long long plen = strtoll(fld[6], NULL, 10);
        /* the needle column: "-" for dense, a full score and fwe (nothing to explain by), else a word */
        int explained = strcmp(fld[13], "everywhere") == 0 || strcmp(fld[13], "partly") == 0 ||
                        strcmp(fld[13], "nowhere") == 0;
        int want_dash = strcmp(fld[4], "dense") == 0 || score >= 1.0 || strcmp(fld[0], "fwe") == 0;
        double again = rescore(fld[10], fld[11]);
        good += plen <= 512 && plen >= 490 && fabs(again - score) < 1e-4 && score >= 0 && score <= 1 &&
                (want_dash ? strcmp(fld[13], "-") == 0 : explained);
    }
    if (f) fclose(f);
    T_CHECK(rows == 6 && good == 6, "TSV: %d rows, %d with prompt <= 512, score as recomputed, needle column as "
            "the method and score say", rows, good);
    /* resume: nothing left */
    rc = cli_run(args, 1, &out);
    T_CHECK(rc == 0 && strstr(out, "\"new_answers\": 0"), "rerun: rc %d: %.300s", rc, out);
    free(out);
    int complete;
    T_CHECK(count_lines(tsv, &complete) == 8, "rerun left %d lines", count_lines(tsv, &complete));
    /* cut the last row mid-line: that answer is redone, the cut part dropped */
    f = fopen(tsv, "rb");
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fclose(f);
    T_CHECK(truncate(tsv, size - 5) == 0, "truncate");
    rc = cli_run(args, 1, &out);
    T_CHECK(rc == 0 && strstr(out, "\"new_answers\": 1"), "after a cut line: rc %d: %.300s", rc, out);
    free(out);
    int nl = count_lines(tsv, &complete);
    T_CHECK(nl == 8 && complete, "after a cut line: %d lines, complete %d", nl, complete);
    /* the table form has a row per task; --svg a heat map with a panel per method, from the file's answers */
    char svg[sizeof tsv + 8];
    snprintf(svg, sizeof svg, "%s.svg", tsv);
    snprintf(args, sizeof args,
             "eval ruler -m " MODEL " --tasks single_noise,vt,fwe --lengths 512 --depths 0.5 --samples 1 "
             "--attn dense,dhsa --density 0.125 --answer-tokens 8 --threads 2 --out %s --svg %s", tsv, svg);
    rc = cli_run(args, 1, &out);
    T_CHECK(rc == 0 && strstr(out, "| vt |") && strstr(out, "| fwe |") && strstr(out, "mean of tasks") &&
                strstr(out, "wrote "),
            "table: %.300s", out);
    free(out);
    {
        FILE *sf = fopen(svg, "r");
        char head[8] = "", body[65536];
        size_t got = sf ? fread(body, 1, sizeof body - 1, sf) : 0;
        body[got] = 0;
        if (sf) fclose(sf);
        memcpy(head, body, 4);
        T_CHECK(strcmp(head, "<svg") == 0 && strstr(body, ">dense<") && strstr(body, ">dhsa<") &&
                    strstr(body, "tasks single_noise, vt;") == NULL && strstr(body, "tasks single_noise, vt"),
                "heat map: %zu bytes, a panel per method, the depth tasks named", got);
        unlink(svg);
    }
    /* a file written before the needle column (13 fields a line) resumes: nothing redone, its misses
       counted as not explained */
    {
        FILE *in = fopen(tsv, "r");
        char old[sizeof tsv + 8];
        snprintf(old, sizeof old, "%s.13", tsv);
        FILE *o13 = fopen(old, "w");
        char ln[8192];
        int n = 0;
        while (in && o13 && fgets(ln, sizeof ln, in)) {
            if (++n > 2) {
                char *t = strrchr(ln, '\t');
                if (t) strcpy(t, "\n");
            }
            fputs(ln, o13);
        }
        if (in) fclose(in);
        if (o13) fclose(o13);
        snprintf(args, sizeof args,
                 "eval ruler -m " MODEL " --tasks single_noise,vt,fwe --lengths 512 --depths 0.5 --samples 1 "
                 "--attn dense,dhsa --density 0.125 --answer-tokens 8 --threads 2 --out %s --json", old);
        rc = cli_run(args, 1, &out);
        T_CHECK(rc == 0 && strstr(out, "\"new_answers\": 0") && strstr(out, "\"misses_unexplained\""),
                "a 13-column file resumed: rc %d: %.300s", rc, out);
        free(out);
        unlink(old);
    }
    /* a file another run is writing (holding its lock) is refused, untouched */
    {
        FILE *held = fopen(tsv, "r+b");
        T_CHECK(held && flock(fileno(held), LOCK_EX | LOCK_NB) == 0, "lock %s: %s", tsv, strerror(errno));
        snprintf(args, sizeof args,
                 "eval ruler -m " MODEL " --tasks single_noise,vt,fwe --lengths 512 --depths 0.5 --samples 1 "
                 "--attn dense,dhsa --density 0.125 --answer-tokens 8 --threads 2 --out %s", tsv);
        rc = cli_run(args, 0, &out);
        T_CHECK(rc != 0 && strstr(out, "another run (it holds the file's lock)"), "a locked --out: rc %d: %.300s", rc,
                out);
        free(out);
        T_CHECK(count_lines(tsv, &complete) == 8, "the refused run left the locked file as it was");
        if (held) fclose(held);
    }
    /* another run's file is refused, untouched */
    snprintf(args, sizeof args,
             "eval ruler -m " MODEL " --tasks single_noise --lengths 512 --depths 0.5 --samples 1 --attn dense "
             "--answer-tokens 8 --seed 2 --out %s", tsv);
    rc = cli_run(args, 0, &out);
    T_CHECK(rc == 2 && strstr(out, "another run"), "other settings: rc %d: %.300s", rc, out);
    free(out);
    T_CHECK(count_lines(tsv, &complete) == 8, "the refused run left the file as it was");
    unlink(tsv);
    /* usage errors */
    rc = cli_run("eval ruler -m " MODEL " --tasks nope", 0, &out);
    T_CHECK(rc == 2 && strstr(out, "single_noise"), "unknown task: rc %d: %.300s", rc, out);
    free(out);
    rc = cli_run("eval ruler -m " MODEL " --split train", 0, &out);
    T_CHECK(rc == 2 && strstr(out, "dev or test"), "bad split: rc %d: %.300s", rc, out);
    free(out);
}

int main(void) {
    check_score();
    dhsa_gguf *g = NULL;
    dhsa_tokenizer *tok = NULL;
    if (dhsa_gguf_open(MODEL, &g) || dhsa_tokenizer_from_gguf(g, &tok)) {
        T_CHECK(0, "the shipped model %s: %s", MODEL, dhsa_last_error());
        return t_report("test_eval_ruler");
    }
    for (int s = 0; s < 2; s++)
        if (dhsa_ruler_load_prose(NULL, (dhsa_ruler_split)s, &prose[s], &prose_len[s])) prose[s] = NULL;
    if (dhsa_ruler_load_words(NULL, &words, &words_len)) words = NULL;
    check_errors(tok);
    for (size_t i = 0; i < sizeof noise_presets / sizeof noise_presets[0]; i++)
        for (int64_t L = 1024; L <= 4096; L *= 4) {
            dhsa_ruler_params p = params_for(noise_presets[i], L, 0.3, 7, DHSA_RULER_TEST);
            check_prompt(tok, noise_presets[i], &p);
        }
    const int per_niah = 7, per_words = 8; /* checks of one check_prompt */
    if (!prose[1]) {
        T_SKIP(per_niah * 10, "no /usr/share/doc/gnu-standards (Debian package gnu-standards; .ci/run installs "
               "it): prose prompts unchecked");
    } else {
        for (size_t i = 0; i < sizeof prose_presets / sizeof prose_presets[0]; i++)
            for (int64_t L = 1024; L <= 4096; L *= 4) {
                dhsa_ruler_params p = params_for(prose_presets[i], L, 0.6, 9, DHSA_RULER_TEST);
                check_prompt(tok, prose_presets[i], &p);
            }
    }
    if (!words) {
        T_SKIP(per_words * 2, "no /usr/share/dict/words (Debian package wamerican; .ci/run installs it): CWE "
               "prompts unchecked");
    } else {
        for (int64_t L = 1024; L <= 4096; L *= 4) {
            dhsa_ruler_params p = params_for("cwe", L, 0, 3, DHSA_RULER_TEST);
            check_prompt(tok, "cwe", &p);
        }
    }
    /* another seed, other ids */
    dhsa_ruler_params p1 = params_for("vt", 1024, 0.5, 1, 1), p2 = params_for("vt", 1024, 0.5, 2, 1);
    dhsa_ruler_prompt a, b;
    if (dhsa_ruler_build(tok, &p1, &a) == DHSA_OK && dhsa_ruler_build(tok, &p2, &b) == DHSA_OK)
        T_CHECK(strcmp(a.expected[0], b.expected[0]) != 0 && strcmp(a.text, b.text) != 0, "two seeds, one prompt");
    else
        T_CHECK(0, "vt: %s", dhsa_last_error());
    dhsa_ruler_free(&a);
    dhsa_ruler_free(&b);
    check_depth(tok);
    check_pools(tok);
    check_template_spans(tok);
    check_eval_ruler(tok);
    free(prose[0]);
    free(prose[1]);
    free(words);
    dhsa_tokenizer_free(tok);
    dhsa_gguf_close(g);
    check_cli();
    return t_report("test_eval_ruler");
}
