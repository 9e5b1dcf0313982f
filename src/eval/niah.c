/* niah.c: needle-in-a-haystack scoring and needle placement (contract in
 * niah.h). Used by `dhsa eval niah` (tools/eval.c); tested by
 * tests/test_eval.c.
 */
#include "eval/niah.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

static int is_digit(char c) { return c >= '0' && c <= '9'; }

int dhsa__niah_answer_has(const char *answer, int64_t len, const char *number) {
    if (!number) return -1;
    int64_t nl = 0;
    while (number[nl]) {
        if (!is_digit(number[nl]) || nl >= 32) return -1;
        nl++;
    }
    if (nl == 0) return -1;
    if (!answer || len <= 0) return 0;
    int64_t i = 0;
    while (i < len) {
        if (!is_digit(answer[i])) {
            i++;
            continue;
        }
        /* a number starts at i: digits, then ",ddd" groups, then ".d+" */
        char digits[33];
        int64_t nd = 0, overflow = 0;
        for (;;) {
            while (i < len && is_digit(answer[i])) {
                if (nd < 32) digits[nd] = answer[i];
                else overflow = 1;
                nd++;
                i++;
            }
            if (i + 3 < len && answer[i] == ',' && is_digit(answer[i + 1]) && is_digit(answer[i + 2]) &&
                is_digit(answer[i + 3]) && (i + 4 >= len || !is_digit(answer[i + 4]))) {
                i++; /* a thousands separator: the group joins the number */
                continue;
            }
            break;
        }
        int decimal = 0;
        if (i + 1 < len && answer[i] == '.' && is_digit(answer[i + 1])) {
            decimal = 1;
            i++;
            while (i < len && is_digit(answer[i])) i++;
        }
        if (!decimal && !overflow && nd == nl) {
            int same = 1;
            for (int64_t k = 0; k < nl && same; k++) same = digits[k] == number[k];
            if (same) return 1;
        }
    }
    return 0;
}

int64_t dhsa__niah_boundary(const int64_t *tokens, int64_t n, double depth) {
    if (n <= 0 || !tokens) return 0;
    if (!(depth >= 0)) depth = 0; /* NaN too */
    if (depth > 1) depth = 1;
    double total = 0;
    for (int64_t i = 0; i < n; i++) total += (double)tokens[i];
    double target = depth * total, off = 0, best_d = INFINITY;
    int64_t best = 0;
    for (int64_t k = 0; k <= n; k++) {
        double d = fabs(off - target);
        if (d < best_d) {
            best_d = d;
            best = k;
        }
        if (k < n) off += (double)tokens[k];
    }
    return best;
}

void dhsa__text_put(dhsa__text *b, const char *s, size_t k) {
    if (b->bad) return;
    if (b->n + k + 1 > b->cap) {
        size_t cap = (b->n + k + 1) * 2;
        char *np = realloc(b->p, cap);
        if (!np) {
            free(b->p);
            b->p = NULL;
            b->n = b->cap = 0;
            b->bad = 1;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, k);
    b->n += k;
    b->p[b->n] = 0;
}

void dhsa__text_add(dhsa__text *b, const char *s) { dhsa__text_put(b, s, strlen(s)); }

static int is_blank(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

int64_t dhsa__split_sentences(char *text, int64_t len, char ***out) {
    int64_t cap = 256, n = 0;
    char **s = malloc((size_t)cap * sizeof(char *));
    *out = NULL;
    if (!s) return -1;
    int64_t start = 0;
    for (int64_t i = 0; i <= len; i++) {
        int end = i == len;
        if (!end && (text[i] == '.' || text[i] == '!' || text[i] == '?') &&
            (i + 1 == len || text[i + 1] == ' ' || text[i + 1] == '\n' || text[i + 1] == '\t')) {
            i++;
            end = 1;
        } else if (!end && text[i] == '\n' && i + 1 < len && text[i + 1] == '\n') {
            end = 1;
        }
        if (!end) continue;
        int64_t a = start, b = i;
        while (a < b && is_blank(text[a])) a++;
        while (b > a && is_blank(text[b - 1])) b--;
        if (b > a) {
            if (n == cap) {
                cap *= 2;
                char **ns = realloc(s, (size_t)cap * sizeof(char *));
                if (!ns) {
                    free(s);
                    return -1;
                }
                s = ns;
            }
            for (int64_t k = a; k < b; k++) /* one line per sentence */
                if (text[k] == '\n' || text[k] == '\t' || text[k] == '\r') text[k] = ' ';
            s[n++] = text + a;
        }
        if (i < len) text[i] = 0;
        start = i + 1;
    }
    *out = s;
    return n;
}

dhsa_status dhsa__answer_stop_ids(const dhsa_tokenizer *tok, dhsa_chat_template tmpl, int32_t *stop, int *n_stop) {
    *n_stop = 0;
    int32_t eos = dhsa_tokenizer_eos(tok), bos = dhsa_tokenizer_bos(tok);
    if (eos >= 0) stop[(*n_stop)++] = eos;
    if (tmpl != DHSA_CHAT_NONE) {
        int extra = 0;
        dhsa_status st = dhsa_chat_stop_ids(tmpl, tok, stop + *n_stop, 16 - *n_stop, &extra);
        if (st) return st;
        *n_stop += extra;
    } else if (bos >= 0) {
        stop[(*n_stop)++] = bos;
    }
    return DHSA_OK;
}
