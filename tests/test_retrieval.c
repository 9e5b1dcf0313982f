/* test_retrieval.c: the retrieval task builders and scoring
 * (src/eval/retrieval.c, dhsa.h Retrieval tasks block), with the shipped
 * default model's tokenizer (models/, part of the repo; DHSA_TEST_MODEL
 * overrides the path).
 *
 * Checks: the exact strings of each task (preamble, needle sentences,
 * question), the length contract (n_ids <= length, >= 97% of it), the
 * asked numbers' token spans (their tokens detokenize to the digits), the
 * depth, held-out numbers (an independent table-driven CRC-32, itself
 * checked on "123456789"), the answer order for multivalue, determinism,
 * scoring of answers, selection of the needle's keys from a hand-made
 * layout, and refusals of bad input.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dhsa.h"
#include "t.h"

#define MODEL_DEFAULT "models/dhsa-retrieval-8m.gguf"

static uint32_t crc_table[256];

static uint32_t ref_crc32(const char *s, size_t n) {
    if (!crc_table[1])
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            crc_table[i] = c;
        }
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) c = crc_table[(c ^ (unsigned char)s[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

static int count_sub(const char *s, const char *sub) {
    int n = 0;
    for (const char *p = strstr(s, sub); p; p = strstr(p + 1, sub)) n++;
    return n;
}

static char filler[400000];

static void make_filler(void) {
    static const char *const words[] = {"the", "river", "bends", "slowly", "past", "an", "old", "mill", "where",
                                        "farmers", "bring", "grain", "in", "autumn", "and", "children", "watch",
                                        "boats", "carry", "rope", "to", "harbor."};
    size_t n = 0;
    uint64_t s = 7;
    while (n < sizeof filler - 32) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        const char *w = words[(s >> 33) % (sizeof words / sizeof words[0])];
        n += (size_t)snprintf(filler + n, sizeof filler - n, "%s%s", n ? "  " : "", w); /* double spaces fold */
    }
}

static void check_span_digits(const dhsa_tokenizer *tok, const dhsa_task *t, int k, uint64_t number) {
    char buf[256], want[32];
    int64_t len = 0;
    int64_t lo = t->span_lo[k], hi = t->span_hi[k];
    T_CHECK(lo > 0 && hi > lo && hi <= t->n_ids, "span %d [%lld, %lld) of %lld", k, (long long)lo, (long long)hi,
            (long long)t->n_ids);
    if (!(lo > 0 && hi > lo && hi <= t->n_ids)) return;
    dhsa_detokenize(tok, t->ids + lo, hi - lo, DHSA_DETOKENIZE_KEEP_SPACE, buf, sizeof buf - 1, &len);
    buf[len < (int64_t)sizeof buf ? len : (int64_t)sizeof buf - 1] = 0;
    snprintf(want, sizeof want, " %llu", (unsigned long long)number);
    T_CHECK(strcmp(buf, want) == 0, "span %d detokenizes to \"%s\", want \"%s\"", k, buf, want);
}

static int held_out(uint64_t v) {
    char b[24];
    int n = snprintf(b, sizeof b, "%llu", (unsigned long long)v);
    return ref_crc32(b, (size_t)n) % 10 == 0;
}

int main(void) {
    T_CHECK(ref_crc32("123456789", 9) == 0xCBF43926u, "reference CRC-32 of 123456789 = %08x",
            ref_crc32("123456789", 9));
    const char *path = getenv("DHSA_TEST_MODEL") ? getenv("DHSA_TEST_MODEL") : MODEL_DEFAULT;
    dhsa_gguf *g = NULL;
    dhsa_tokenizer *tok = NULL;
    if (dhsa_gguf_open(path, &g) || dhsa_tokenizer_from_gguf(g, &tok)) {
        T_CHECK(0, "the default model %s could not be read: %s", path, dhsa_last_error());
        dhsa_gguf_close(g);
        return t_report("test_retrieval");
    }
    dhsa_gguf_close(g);
    make_filler();
    dhsa_task t;
    dhsa_task_params p = dhsa_task_default_params();
    p.filler = filler;
    p.filler_len = (int64_t)strlen(filler);

    /* passkey at three depths and lengths */
    const int64_t lens[] = {256, 1024, 4096};
    const double depths[] = {0.0, 0.5, 1.0};
    for (int li = 0; li < 3; li++)
        for (int di = 0; di < 3; di++) {
            p.kind = DHSA_TASK_PASSKEY;
            p.length = lens[li];
            p.depth = depths[di];
            p.seed = (uint64_t)(li * 3 + di + 1);
            dhsa_status st = dhsa_task_build(tok, &p, &t);
            T_CHECK(st == DHSA_OK, "passkey L %lld depth %g: %s", (long long)p.length, p.depth, dhsa_last_error());
            if (st) continue;
            T_CHECK(t.n_ids <= p.length && t.n_ids >= p.length - p.length / 32, "passkey: %lld tokens for %lld",
                    (long long)t.n_ids, (long long)p.length);
            T_CHECK(t.ids[0] == dhsa_tokenizer_bos(tok), "BOS first");
            T_CHECK(strncmp(t.prompt, "There is an important info hidden inside a lot of irrelevant text. Find it "
                            "and memorize it. I will quiz you about the important information there. ", 143) == 0,
                    "passkey preamble");
            const char *q = " What is the pass key? The pass key is";
            size_t pl = strlen(t.prompt);
            T_CHECK(pl > strlen(q) && strcmp(t.prompt + pl - strlen(q), q) == 0, "passkey question at the end");
            T_CHECK(t.n_numbers == 1 && t.numbers[0] >= 10000 && t.numbers[0] <= 99999, "a 5-digit key");
            char needle[128];
            snprintf(needle, sizeof needle, " The pass key is %llu. Remember it. %llu is the pass key. ",
                     (unsigned long long)t.numbers[0], (unsigned long long)t.numbers[0]);
            if (p.depth == 1.0) needle[strlen(needle) - 1] = 0; /* the question follows with its own space */
            T_CHECK(count_sub(t.prompt, needle) == 1, "needle \"%s\" once in the prompt", needle);
            T_CHECK(!strstr(t.prompt, "  "), "single spaces only");
            char ans[32];
            snprintf(ans, sizeof ans, " %llu", (unsigned long long)t.numbers[0]);
            T_CHECK(strcmp(t.answer, ans) == 0, "answer \"%s\"", t.answer);
            T_CHECK(held_out(t.numbers[0]), "key %llu is held out", (unsigned long long)t.numbers[0]);
            check_span_digits(tok, &t, 0, t.numbers[0]);
            T_CHECK(t.depth_used >= p.depth - 0.06 && t.depth_used <= p.depth + 0.06, "depth %g used %.3f",
                    p.depth, t.depth_used);
            dhsa_task_free(&t);
        }
    /* training numbers when asked */
    p.kind = DHSA_TASK_PASSKEY;
    p.length = 256;
    p.heldout_numbers = 0;
    int train_ok = 1;
    for (uint64_t sd = 1; sd <= 20; sd++) {
        p.seed = sd;
        if (dhsa_task_build(tok, &p, &t) == DHSA_OK) {
            train_ok &= !held_out(t.numbers[0]);
            dhsa_task_free(&t);
        } else {
            train_ok = 0;
        }
    }
    T_CHECK(train_ok, "heldout_numbers = 0 draws training keys only");
    p.heldout_numbers = 1;

    /* multikey */
    static const char *const kws[] = {"apple", "birch", "cedar", "delta", "ember", "fjord"};
    p.kind = DHSA_TASK_MULTIKEY;
    p.length = 2048;
    p.depth = 0.3;
    p.keywords = kws;
    p.n_keywords = 6;
    p.n_keys = 5;
    T_CHECK(dhsa_task_build(tok, &p, &t) == DHSA_OK, "multikey: %s", dhsa_last_error());
    if (t.prompt) {
        T_CHECK(count_sub(t.prompt, "One of the special magic numbers for ") == 5, "5 magic-number needles");
        T_CHECK(strncmp(t.prompt, "Some special magic numbers are hidden within the following text. Make sure to "
                        "memorize it. I will quiz you about the numbers afterwards. ", 137) == 0, "magic preamble");
        const char *q = strstr(t.prompt, " What is the special magic number for ");
        T_CHECK(q != NULL, "multikey question");
        char kw[64] = {0}, want[320], nd[192];
        if (q) sscanf(q + 38, "%63s", kw);
        snprintf(want, sizeof want, " What is the special magic number for %s mentioned in the provided text? The "
                 "special magic number for %s mentioned in the provided text is", kw, kw);
        T_CHECK(q && strcmp(q, want) == 0, "question text: \"%s\"", q ? q : "");
        snprintf(nd, sizeof nd, "One of the special magic numbers for %s is: %llu.", kw,
                 (unsigned long long)t.numbers[0]);
        T_CHECK(count_sub(t.prompt, nd) == 1, "the asked keyword's needle holds the answer");
        T_CHECK(t.numbers[0] >= 1000000 && t.numbers[0] <= 9999999 && held_out(t.numbers[0]), "7-digit held-out");
        check_span_digits(tok, &t, 0, t.numbers[0]);
        T_CHECK(t.depth_used > 0.24 && t.depth_used < 0.36, "multikey depth 0.3 used %.3f", t.depth_used);
    }
    dhsa_task_free(&t);

    /* multivalue: the answer lists the values in the order they appear */
    p.kind = DHSA_TASK_MULTIVALUE;
    p.n_keys = 3;
    p.n_distract = 2;
    p.length = 1024;
    T_CHECK(dhsa_task_build(tok, &p, &t) == DHSA_OK, "multivalue: %s", dhsa_last_error());
    if (t.prompt) {
        T_CHECK(t.n_numbers == 3 && t.n_spans == 3, "3 values");
        T_CHECK(count_sub(t.prompt, "One of the special magic numbers for ") == 5, "3 values + 2 distractors");
        const char *prev = t.prompt;
        int ordered = 1;
        for (int k = 0; k < t.n_numbers; k++) {
            char num[24];
            snprintf(num, sizeof num, "%llu", (unsigned long long)t.numbers[k]);
            const char *at = strstr(t.prompt, num);
            ordered &= at != NULL && at >= prev;
            prev = at ? at : prev;
            check_span_digits(tok, &t, k, t.numbers[k]);
        }
        T_CHECK(ordered, "values in the order of appearance");
        char want[96];
        snprintf(want, sizeof want, " %llu, %llu, %llu", (unsigned long long)t.numbers[0],
                 (unsigned long long)t.numbers[1], (unsigned long long)t.numbers[2]);
        T_CHECK(strcmp(t.answer, want) == 0, "multivalue answer \"%s\"", t.answer);
        T_CHECK(strstr(t.prompt, " What are all the special magic numbers for ") != NULL &&
                    strstr(t.prompt, "mentioned in the provided text are") != NULL, "multivalue question");
        /* scoring */
        T_CHECK(dhsa_task_check(&t, want, (int64_t)strlen(want)) == 1, "the answer scores");
        char wrong[96];
        snprintf(wrong, sizeof wrong, " %llu, %llu", (unsigned long long)t.numbers[0], (unsigned long long)t.numbers[1]);
        T_CHECK(dhsa_task_check(&t, wrong, (int64_t)strlen(wrong)) == 0, "two of three values do not score");
        snprintf(wrong, sizeof wrong, " %llu, %llu, %llu", (unsigned long long)t.numbers[1],
                 (unsigned long long)t.numbers[0], (unsigned long long)t.numbers[2]);
        T_CHECK(dhsa_task_check(&t, wrong, (int64_t)strlen(wrong)) == 0, "the wrong order does not score");
    }
    dhsa_task_free(&t);
    /* passkey scoring */
    p.kind = DHSA_TASK_PASSKEY;
    p.length = 512;
    p.keywords = NULL;
    T_CHECK(dhsa_task_build(tok, &p, &t) == DHSA_OK, "passkey 512");
    if (t.prompt) {
        char a[64];
        snprintf(a, sizeof a, " %llu. What", (unsigned long long)t.numbers[0]);
        T_CHECK(dhsa_task_check(&t, a, (int64_t)strlen(a)) == 1, "\"%s\" scores", a);
        snprintf(a, sizeof a, " %llu1", (unsigned long long)t.numbers[0]);
        T_CHECK(dhsa_task_check(&t, a, (int64_t)strlen(a)) == 0, "a longer number does not score");
        T_CHECK(dhsa_task_check(&t, "", 0) == 0, "no answer does not score");
        /* determinism */
        dhsa_task t2;
        T_CHECK(dhsa_task_build(tok, &p, &t2) == DHSA_OK && t2.prompt && strcmp(t2.prompt, t.prompt) == 0 &&
                    t2.n_ids == t.n_ids, "same seed, same task");
        dhsa_task_free(&t2);
        p.seed++;
        T_CHECK(dhsa_task_build(tok, &p, &t2) == DHSA_OK && t2.prompt && strcmp(t2.prompt, t.prompt) != 0,
                "another seed, another task");
        dhsa_task_free(&t2);
        /* selection from a layout: the needle's keys selected or not */
        dhsa_ctx *ctx = NULL;
        dhsa_layout *lay = NULL;
        if (dhsa_ctx_create(NULL, &ctx) == DHSA_OK &&
            dhsa_layout_create(ctx, 1, 1, 16, t.n_ids, 16, 2, &lay) == DHSA_OK) {
            T_CHECK(dhsa_task_selected(&t, NULL, 0, 0) == 1.0, "dense selects everything");
            T_CHECK(dhsa_task_selected(&t, lay, 0, 3) == 0.0, "an empty layout selects nothing");
            int64_t r[2] = {t.span_lo[0], t.span_hi[0]};
            dhsa_layout_set(lay, 0, 0, 0, r, 1);
            T_CHECK(dhsa_task_selected(&t, lay, 0, 3) == 1.0, "the needle's range selected");
            r[1] = t.span_lo[0] + 1;
            dhsa_layout_set(lay, 0, 0, 0, r, 1);
            double part = dhsa_task_selected(&t, lay, 0, 3);
            T_CHECK(part > 0 && part < 1, "part of the needle selected: %g", part);
        }
        dhsa_layout_free(lay);
        dhsa_ctx_free(ctx);
    }
    dhsa_task_free(&t);
    /* A filler whose token density varies along it (plain words, then runs of
     * digit-and-letter junk that cost a token a byte): the span's token count
     * must still converge for every seed (it did not when each sizing round
     * moved the span's start). */
    {
        static char mixed[300000];
        size_t mn = 0;
        uint64_t s = 11;
        while (mn < sizeof mixed - 64) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            int junk = (mn / 4000) % 2;
            if (junk)
                mn += (size_t)snprintf(mixed + mn, sizeof mixed - mn, "%s%c%u%c", mn ? " " : "",
                                       'a' + (int)((s >> 40) % 26), (unsigned)((s >> 20) % 97), 'q');
            else
                mn += (size_t)snprintf(mixed + mn, sizeof mixed - mn, "%s%s", mn ? " " : "",
                                       (s >> 33) % 2 ? "the river bends" : "past the mill");
        }
        dhsa_task_params q = dhsa_task_default_params();
        q.filler = mixed;
        q.filler_len = (int64_t)mn;
        int built = 0, tried = 0;
        for (int kind = DHSA_TASK_PASSKEY; kind <= DHSA_TASK_MULTIVALUE; kind++)
            for (uint64_t sd = 0; sd < 30; sd++) {
                q.kind = (dhsa_task_kind)kind;
                q.length = sd % 2 ? 2048 : 1024;
                q.depth = (double)(sd % 5) / 4.0;
                q.seed = 1000003 + sd * 8192;
                tried++;
                if (dhsa_task_build(tok, &q, &t) == DHSA_OK) {
                    built += t.n_ids <= q.length && t.n_ids >= q.length - q.length / 32;
                    dhsa_task_free(&t);
                }
            }
        T_CHECK(built == tried, "uneven filler: %d of %d tasks built to length", built, tried);
    }
    /* refusals */
    p.length = 10;
    T_CHECK(dhsa_task_build(tok, &p, &t) == DHSA_ERR_INVALID_ARG && t.ids == NULL, "length 10 refused");
    p.length = 1024;
    p.depth = 1.5;
    T_CHECK(dhsa_task_build(tok, &p, &t) == DHSA_ERR_INVALID_ARG, "depth 1.5 refused");
    p.depth = 0.5;
    p.filler_len = 2000;
    T_CHECK(dhsa_task_build(tok, &p, &t) == DHSA_ERR_INVALID_ARG && strstr(dhsa_last_error(), "too short"),
            "a short filler refused: %s", dhsa_last_error());
    p.filler_len = (int64_t)strlen(filler);
    p.kind = DHSA_TASK_MULTIKEY;
    p.keywords = kws;
    p.n_keywords = 2;
    p.n_keys = 4;
    T_CHECK(dhsa_task_build(tok, &p, &t) == DHSA_ERR_INVALID_ARG, "too few keywords refused");
    p.kind = (dhsa_task_kind)9;
    T_CHECK(dhsa_task_build(tok, &p, &t) == DHSA_ERR_INVALID_ARG, "unknown kind refused");
    T_CHECK(dhsa_task_build(tok, NULL, &t) == DHSA_ERR_INVALID_ARG, "NULL params refused");
    dhsa_tokenizer_free(tok);
    return t_report("test_retrieval");
}
