/* niah_prompt.c: the prompts of `dhsa eval niah` (contract in
 * include/dhsa.h, "Evaluation" block: dhsa_niah_build; the method in
 * docs/eval.md, "eval niah"): a haystack of sentences taken in order
 * (cycling) while they fit, the needle at the sentence boundary nearest the
 * depth (dhsa__niah_boundary), the question as a plain completion prompt or
 * as the user turn of a chat template, then sentences dropped from the end
 * until the prompt fits the length. Tested by tests/test_eval_lib.c
 * (against a prompt assembled there) and, through the CLI, by
 * tests/test_eval.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "dhsa.h"
#include "eval/niah.h"

static const char niah_question[] = "What is the secret number mentioned in the text above?";

/* The prompt's text for a haystack: the whole plain prompt, or (with a
 * chat template) the user message that niah_tokens puts into it. */
static char *niah_text(dhsa_chat_template tmpl, const char *haystack) {
    dhsa__text b = {0};
    dhsa__text_add(&b, haystack);
    if (tmpl == DHSA_CHAT_NONE) {
        dhsa__text_add(&b, "\n\nQuestion: ");
        dhsa__text_add(&b, niah_question);
        dhsa__text_add(&b, "\nAnswer: The secret number is");
    } else {
        dhsa__text_add(&b, "\n\n");
        dhsa__text_add(&b, niah_question);
        dhsa__text_add(&b, " Answer with the number only.");
    }
    return b.p;
}

/* The ids of niah_text's text: plain, or as the user turn of the chat
 * template (its markers special, the haystack plain text). */
static dhsa_status niah_tokens(const dhsa_tokenizer *tok, dhsa_chat_template tmpl, unsigned flags, const char *text,
                               int32_t *ids, int64_t cap, int64_t *n) {
    if (tmpl == DHSA_CHAT_NONE) return dhsa_tokenize(tok, text, (int64_t)strlen(text), flags, ids, cap, n);
    dhsa_chat_message msg = {"user", text};
    return dhsa_chat_tokenize(tmpl, tok, &msg, 1, 1, flags, ids, cap, n);
}

dhsa_niah_params dhsa_niah_default_params(void) {
    dhsa_niah_params p;
    memset(&p, 0, sizeof p);
    p.length = 1024;
    p.depth = 0.5;
    p.tmpl = DHSA_CHAT_NONE;
    return p;
}

void dhsa_niah_free(dhsa_niah_prompt *pr) {
    if (!pr) return;
    free(pr->ids);
    memset(pr, 0, sizeof *pr);
}

dhsa_status dhsa_niah_build(const dhsa_tokenizer *tok, const dhsa_niah_params *p, dhsa_niah_prompt *out) {
    if (out) memset(out, 0, sizeof *out);
    if (!tok || !p || !out || !p->needle)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_niah_build: tokenizer, params, needle and out must not be NULL");
    if (p->length < 1 || p->length > (int64_t)1 << 26)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "niah prompt of %lld tokens: the length is 1 .. %lld",
                          (long long)p->length, (long long)1 << 26);
    if (!(p->depth >= 0 && p->depth <= 1))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "niah depth %g is not in [0, 1]", p->depth);
    const char *const *sent = p->sentences;
    int64_t n_sent = p->n_sentences;
    if (!sent) sent = dhsa_task_builtin_sentences(&n_sent);
    if (n_sent < 1) return dhsa__fail(DHSA_ERR_INVALID_ARG, "a niah haystack needs at least one sentence");
    for (int64_t i = 0; i < n_sent; i++)
        if (!sent[i]) return dhsa__fail(DHSA_ERR_INVALID_ARG, "haystack sentence %lld is NULL", (long long)i);
    const dhsa_chat_template tmpl = p->tmpl;
    const unsigned flags = dhsa_tokenizer_default_flags(tok) & DHSA_TOKENIZE_ADD_BOS;
    const int64_t L = p->length;
    /* the stop ids: EOS, then the template's end of turn, or BOS for a
     * plain prompt (a base model starts a new document) */
    dhsa_status st0 = dhsa__answer_stop_ids(tok, tmpl, out->stop, &out->n_stop);
    if (st0) return st0;
    int64_t *sent_tok = malloc((size_t)n_sent * sizeof(int64_t)), *counts = malloc(sizeof(int64_t) * (size_t)(L + 1));
    char *empty = niah_text(tmpl, p->needle), *text = NULL;
    dhsa_status st = DHSA_OK;
    if (!sent_tok || !counts || !empty) {
        st = dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory for a niah prompt of %lld tokens", (long long)L);
        goto done;
    }
    for (int64_t i = 0; i < n_sent; i++) {
        sent_tok[i] = 0;
        dhsa_tokenize(tok, sent[i], (int64_t)strlen(sent[i]), 0, NULL, 0, &sent_tok[i]);
        if (sent_tok[i] < 1) sent_tok[i] = 1;
    }
    int64_t overhead = 0;
    niah_tokens(tok, tmpl, flags, empty, NULL, 0, &overhead);
    int64_t budget = L - overhead, cnt = 0, total = 0;
    while (total + sent_tok[cnt % n_sent] <= budget && cnt < L) {
        counts[cnt] = sent_tok[cnt % n_sent];
        total += counts[cnt++];
    }
    for (;;) {
        int64_t k = dhsa__niah_boundary(counts, cnt, p->depth);
        dhsa__text b = {0};
        dhsa__text_add(&b, "");
        int64_t before = 0, all = 0;
        for (int64_t i = 0; i <= cnt; i++) {
            if (i == k) {
                if (b.n) dhsa__text_add(&b, " ");
                dhsa__text_add(&b, p->needle);
            }
            if (i == cnt) break;
            if (b.n) dhsa__text_add(&b, " ");
            dhsa__text_add(&b, sent[i % n_sent]);
            if (i < k) before += counts[i];
            all += counts[i];
        }
        text = b.p ? niah_text(tmpl, b.p) : NULL;
        free(b.p);
        if (!text) {
            st = dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory for a niah prompt of %lld tokens", (long long)L);
            goto done;
        }
        int64_t n = 0;
        niah_tokens(tok, tmpl, flags, text, NULL, 0, &n);
        if (n <= L || cnt == 0) {
            out->ids = malloc((size_t)(n + 1) * sizeof(int32_t));
            if (!out->ids) {
                st = dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory for %lld prompt ids", (long long)n);
                goto done;
            }
            st = niah_tokens(tok, tmpl, flags, text, out->ids, n + 1, &n);
            out->n_ids = n;
            out->depth_used = all > 0 ? (double)before / (double)all : 0;
            out->n_sentences = cnt;
            goto done;
        }
        free(text);
        text = NULL;
        cnt--; /* too long: one sentence fewer */
    }
done:
    free(sent_tok);
    free(counts);
    free(empty);
    free(text);
    if (st) {
        free(out->ids);
        out->ids = NULL;
        out->n_ids = 0;
    }
    return st;
}

int dhsa_niah_answer_has(const char *answer, int64_t len, const char *number) {
    return dhsa__niah_answer_has(answer, len, number);
}
