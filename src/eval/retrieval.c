/* retrieval.c: the long-context retrieval tasks (passkey, multikey,
 * multivalue) built to a token length, and their scoring. The strings are
 * exactly those train/tasks.py trains the default model on; the contract
 * is in include/dhsa.h (Retrieval tasks block), the method in
 * docs/eval.md. Used by `dhsa eval passkey|multikey|multivalue`
 * (tools/eval.c) and `dhsa demo`. Tested by tests/test_retrieval.c.
 *
 * Building: the filler is folded to single spaces once; a span of it
 * starting at a word boundary is chosen from the seed; the needles are put
 * at word boundaries of the span (the asked one nearest `depth`); the
 * prompt is tokenized whole and the span resized (a few rounds) until the
 * prompt has at most `length` tokens and at least 97% of them. The asked
 * numbers' token ranges are found by tokenizing the prompt's prefixes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "dhsa.h"
#include "eval/niah.h"

static const char passkey_pre[] =
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
    "I will quiz you about the important information there. ";
static const char magic_pre[] =
    "Some special magic numbers are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the numbers afterwards. ";

/* Built-in haystack: plain sentences written for dhsa (public
 * domain), about nothing in particular and free of numbers. */
static const char *const builtin_sentences[] = {
    "The morning market opened early, and the baker set out loaves of bread on a long wooden table.",
    "A light rain fell over the hills while the farmers checked the fences along the northern field.",
    "In the library, a quiet student turned the pages of an old atlas and traced the rivers with a finger.",
    "The harbor was busy with small boats that carried fish, rope and barrels of fresh water.",
    "Children ran along the path to the pond, where ducks waited for crumbs near the reeds.",
    "The old clock in the square rang at noon, and the shopkeepers stepped outside to talk.",
    "A gardener planted rows of beans and watered them slowly with a green can.",
    "On the train, a traveler watched the forests pass and wrote short notes in a small book.",
    "The kitchen smelled of onions and thyme as the soup warmed on the stove.",
    "Far to the west, the mountains held snow on their peaks even in the middle of summer.",
    "A painter mixed blue and yellow on a board and tried to catch the color of the sea.",
    "The postman rode his bicycle from house to house, ringing the bell at every gate.",
    "In the evening, the wind turned cool and the lamps along the street were lit one by one.",
    "A teacher drew a map of the village on the board and asked the class to name each road.",
    "The river bent around the mill, where a wheel turned slowly under the falling water.",
    "Two friends shared a pot of tea and talked about the books they wanted to read.",
    "The museum kept a collection of old coins, maps and tools behind tall glass cases.",
    "At the edge of the forest, a fox watched the road and then slipped back into the ferns.",
    "The carpenter measured the board twice before he cut it with a steady hand.",
    "Clouds gathered over the bay, and the sailors tied their boats more tightly to the dock.",
    "A choir practiced in the church hall, and their voices carried into the empty street.",
    "The orchard was full of apples, and the pickers filled their baskets before the sun was high.",
    "A cat slept on the warm stone steps while the town went about its business.",
    "The engineer checked the bridge after the storm and found that every beam still held.",
};

const char *const *dhsa_task_builtin_sentences(int64_t *n) {
    if (n) *n = (int64_t)(sizeof builtin_sentences / sizeof builtin_sentences[0]);
    return builtin_sentences;
}

/* Used when the caller gives no keyword list. */
static const char *const builtin_keywords[] = {
    "harbor", "lantern", "orchard", "pebble", "meadow", "violin", "compass", "saddle", "thimble", "quarry",
    "walnut", "beacon", "falcon", "ribbon", "kettle", "glacier", "tavern", "marble", "hammock", "parsley",
    "cobbler", "lagoon", "pilgrim", "mantel", "barley", "chimney", "ferret", "goblet", "juniper", "kestrel",
};

const char *dhsa_task_kind_name(dhsa_task_kind k) {
    switch (k) {
    case DHSA_TASK_PASSKEY: return "passkey";
    case DHSA_TASK_MULTIKEY: return "multikey";
    case DHSA_TASK_MULTIVALUE: return "multivalue";
    }
    return "?";
}

dhsa_task_params dhsa_task_default_params(void) {
    dhsa_task_params p;
    memset(&p, 0, sizeof p);
    p.kind = DHSA_TASK_PASSKEY;
    p.length = 1024;
    p.depth = 0.5;
    p.seed = 1;
    p.n_keys = 0; /* per kind: 4 keys, 3 values */
    p.n_distract = 1;
    p.heldout_numbers = 1;
    return p;
}

void dhsa_task_free(dhsa_task *t) {
    if (!t) return;
    free(t->ids);
    free(t->prompt);
    memset(t, 0, sizeof *t);
}

/* ------------------------------------------------------------ helpers --- */

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double uniform(uint64_t *s) { return (double)(splitmix(s) >> 11) * (1.0 / 9007199254740992.0); }

/* zlib's CRC-32 (the held-out rule of train/corpus.py: zlib.crc32). */
static uint32_t crc32_of(const char *s) {
    uint32_t c = 0xFFFFFFFFu;
    for (; *s; s++) {
        c ^= (unsigned char)*s;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    }
    return c ^ 0xFFFFFFFFu;
}

static uint64_t draw_number(uint64_t *rs, int digits, int heldout) {
    uint64_t lo = 1;
    for (int i = 1; i < digits; i++) lo *= 10;
    for (;;) {
        uint64_t n = lo + splitmix(rs) % (9 * lo);
        char buf[24];
        snprintf(buf, sizeof buf, "%llu", (unsigned long long)n);
        if ((crc32_of(buf) % 10 == 0) == (heldout != 0)) return n;
    }
}

/* Texts grow in a dhsa__text (src/eval/niah.h). */

static int is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\f' || c == '\v'; }

/* The filler with every whitespace run as one space, trimmed. */
static char *fold(const char *s, int64_t len, int64_t *out_len) {
    char *o = malloc((size_t)len + 1);
    if (!o) return NULL;
    int64_t n = 0;
    for (int64_t i = 0; i < len; i++) {
        if (is_space(s[i])) {
            if (n > 0 && o[n - 1] != ' ') o[n++] = ' ';
        } else {
            o[n++] = s[i];
        }
    }
    while (n > 0 && o[n - 1] == ' ') n--;
    o[n] = 0;
    *out_len = n;
    return o;
}

/* One needle to insert: its sentence, the fraction of the span it goes to,
 * and whether its number is asked (then its digits' byte range is kept). */
typedef struct {
    char text[160];
    double pos;
    int asked;
    int num_off, num_len; /* the number's bytes inside text */
    int64_t at;           /* byte offset of the number in the prompt */
} needle;

static int cmp_needle(const void *a, const void *b) {
    const needle *x = a, *y = b;
    return x->pos < y->pos ? -1 : x->pos > y->pos ? 1 : 0;
}

/* prompt = pre + span-with-needles + question; records each needle's
 * number offset. The span [a, a + n) of f is cut at word boundaries. */
static char *compose(const char *f, int64_t flen, int64_t a, int64_t n, const char *pre, needle *nd, int nn,
                     const char *question) {
    dhsa__text b = {0};
    dhsa__text_add(&b, pre);
    if (a + n > flen) n = flen - a;
    int64_t last = a, end = a + n;
    for (int i = 0; i < nn; i++) {
        int64_t cut = a + (int64_t)(nd[i].pos * (double)n);
        if (cut < last) cut = last;
        while (cut < end && f[cut] != ' ') cut++;
        if (cut > last) dhsa__text_put(&b, f + last, (size_t)(cut - last));
        if (b.n > 0 && b.p[b.n - 1] != ' ') dhsa__text_add(&b, " ");
        nd[i].at = (int64_t)b.n + nd[i].num_off;
        dhsa__text_add(&b, nd[i].text);
        last = cut;
        while (last < end && f[last] == ' ') last++;
        if (last < end) dhsa__text_add(&b, " ");
    }
    if (end > last) dhsa__text_put(&b, f + last, (size_t)(end - last));
    while (b.n > 0 && b.p[b.n - 1] == ' ') b.p[--b.n] = 0;
    dhsa__text_add(&b, question);
    if (b.bad) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

static int64_t count_tokens(const dhsa_tokenizer *tok, const char *s, int64_t len, unsigned flags) {
    int64_t n = 0;
    if (dhsa_tokenize(tok, s, len, flags, NULL, 0, &n) != DHSA_OK && n == 0) return -1;
    return n;
}

/* ------------------------------------------------------------- build --- */

dhsa_status dhsa_task_build(const dhsa_tokenizer *tok, const dhsa_task_params *p, dhsa_task *out) {
    if (!out) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_task_build: NULL output");
    memset(out, 0, sizeof *out);
    if (!tok || !p || (!p->filler && p->filler_len))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_task_build: NULL argument");
    if (p->kind < DHSA_TASK_PASSKEY || p->kind > DHSA_TASK_MULTIVALUE)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_task_build: unknown task kind %d", (int)p->kind);
    if (p->length < 64 || p->length > ((int64_t)1 << 26))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_task_build: length %lld is outside [64, 2^26]",
                          (long long)p->length);
    if (!(p->depth >= 0 && p->depth <= 1))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_task_build: depth %g is outside [0, 1]", p->depth);
    int n_keys = p->n_keys > 0 ? p->n_keys : p->kind == DHSA_TASK_MULTIVALUE ? 3 : 4;
    int n_distract = p->kind == DHSA_TASK_MULTIVALUE ? (p->n_distract > 0 ? p->n_distract : 0) : 0;
    if (p->kind == DHSA_TASK_PASSKEY) n_keys = 1;
    if (n_keys + n_distract > DHSA_TASK_MAX_NEEDLES)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_task_build: %d needles, at most %d", n_keys + n_distract,
                          DHSA_TASK_MAX_NEEDLES);
    const char *const *kw = p->keywords ? p->keywords : builtin_keywords;
    int64_t n_kw = p->keywords ? p->n_keywords : (int64_t)(sizeof builtin_keywords / sizeof builtin_keywords[0]);
    int kw_needed = p->kind == DHSA_TASK_MULTIKEY ? n_keys : p->kind == DHSA_TASK_MULTIVALUE ? 1 + n_distract : 0;
    if (kw_needed > n_kw)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_task_build: %d keywords needed, %lld given", kw_needed,
                          (long long)n_kw);
    for (int64_t i = 0; i < n_kw && kw_needed; i++)
        if (!kw[i] || !kw[i][0] || strlen(kw[i]) > 64)
            return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_task_build: keyword %lld is empty or over 64 bytes",
                              (long long)i);
    int64_t flen = 0;
    char *f;
    if (p->filler) {
        f = fold(p->filler, p->filler_len, &flen);
    } else { /* the built-in sentences, in a seeded order, about 6 bytes per wanted token */
        dhsa__text fb = {0};
        uint64_t fs = p->seed ^ 0x5DEECE66Dull;
        const int64_t ns = (int64_t)(sizeof builtin_sentences / sizeof builtin_sentences[0]);
        while ((int64_t)fb.n < 6 * p->length + 4096 && !fb.bad) {
            if (fb.n) dhsa__text_add(&fb, " ");
            dhsa__text_add(&fb, builtin_sentences[splitmix(&fs) % (uint64_t)ns]);
        }
        f = fb.bad ? NULL : fold(fb.p, (int64_t)fb.n, &flen);
        free(fb.p);
    }
    if (!f) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "dhsa_task_build: out of memory");
    uint64_t rs = p->seed * 0x2545F4914F6CDD1Dull + (uint64_t)p->kind;
    /* the needles */
    needle nd[DHSA_TASK_MAX_NEEDLES];
    memset(nd, 0, sizeof nd);
    int nn = 0;
    int64_t picked[DHSA_TASK_MAX_NEEDLES];
    int n_picked = 0;
    char question[512];
    const char *pre = magic_pre;
    if (p->kind == DHSA_TASK_PASSKEY) {
        uint64_t k = draw_number(&rs, 5, p->heldout_numbers);
        snprintf(nd[0].text, sizeof nd[0].text, "The pass key is %llu. Remember it. %llu is the pass key.",
                 (unsigned long long)k, (unsigned long long)k);
        nd[0].num_off = 16;
        nd[0].num_len = 5;
        nd[0].pos = p->depth;
        nd[0].asked = 1;
        nn = 1;
        pre = passkey_pre;
        snprintf(question, sizeof question, " What is the pass key? The pass key is");
    } else {
        for (int i = 0; i < kw_needed; i++) { /* distinct keywords */
            int64_t j;
            int again;
            do {
                j = (int64_t)(splitmix(&rs) % (uint64_t)n_kw);
                again = 0;
                for (int q = 0; q < n_picked; q++) again |= picked[q] == j || strcmp(kw[picked[q]], kw[j]) == 0;
            } while (again);
            picked[n_picked++] = j;
        }
        int n_items = p->kind == DHSA_TASK_MULTIKEY ? n_keys : n_keys + n_distract;
        int asked = p->kind == DHSA_TASK_MULTIKEY ? (int)(splitmix(&rs) % (uint64_t)n_keys) : 0;
        for (int i = 0; i < n_items; i++) {
            const char *w = p->kind == DHSA_TASK_MULTIKEY ? kw[picked[i]] : i < n_keys ? kw[picked[0]]
                                                                                       : kw[picked[1 + i - n_keys]];
            uint64_t v = draw_number(&rs, 7, p->heldout_numbers);
            int len = snprintf(nd[i].text, sizeof nd[i].text, "One of the special magic numbers for %s is: %llu.", w,
                               (unsigned long long)v);
            nd[i].num_len = 7;
            nd[i].num_off = len - 8;
            nd[i].pos = uniform(&rs);
            nd[i].asked = p->kind == DHSA_TASK_MULTIKEY ? i == asked : i < n_keys;
        }
        nd[p->kind == DHSA_TASK_MULTIKEY ? asked : 0].pos = p->depth;
        nn = n_items;
        const char *w = kw[picked[p->kind == DHSA_TASK_MULTIKEY ? asked : 0]];
        if (p->kind == DHSA_TASK_MULTIKEY)
            snprintf(question, sizeof question,
                     " What is the special magic number for %s mentioned in the provided text? The special magic "
                     "number for %s mentioned in the provided text is", w, w);
        else
            snprintf(question, sizeof question,
                     " What are all the special magic numbers for %s mentioned in the provided text? The special "
                     "magic numbers for %s mentioned in the provided text are", w, w);
    }
    qsort(nd, (size_t)nn, sizeof nd[0], cmp_needle); /* stable enough: positions are distinct reals */
    /* the answer, in the order of appearance */
    size_t an = 0;
    for (int i = 0; i < nn; i++)
        if (nd[i].asked) {
            out->numbers[out->n_numbers++] = strtoull(nd[i].text + nd[i].num_off, NULL, 10);
            an += (size_t)snprintf(out->answer + an, sizeof out->answer - an, "%s%.*s", an ? ", " : " ",
                                   nd[i].num_len, nd[i].text + nd[i].num_off);
        }
    /* size the filler span */
    unsigned flags = DHSA_TOKENIZE_ADD_BOS;
    dhsa_status st = DHSA_OK;
    char *prompt = NULL;
    int64_t n_tok = 0;
    double cpt = 3.0;
    int64_t span = (int64_t)((double)p->length * cpt), a0 = 0;
    uint64_t off_seed = splitmix(&rs);
    /* The span's start is fixed before the rounds (room left for a span of up
     * to 8 bytes a token), so only its end moves and the token count grows
     * with the span: the rounds converge. */
    int64_t room = 8 * p->length < flen ? 8 * p->length : flen;
    a0 = flen > room ? (int64_t)(off_seed % (uint64_t)(flen - room + 1)) : 0;
    while (a0 > 0 && a0 < flen && f[a0 - 1] != ' ') a0++; /* a word start */
    for (int round = 0; round < 24; round++) {
        if (span > flen) span = flen;
        if (a0 + span > flen) { /* near the end: start earlier, at a word */
            a0 = flen - span;
            while (a0 > 0 && f[a0 - 1] != ' ') a0--;
        }
        int64_t n = span;
        while (a0 + n < flen && n > 0 && f[a0 + n] != ' ') n--; /* a word end */
        free(prompt);
        prompt = compose(f, flen, a0, n, pre, nd, nn, question);
        if (!prompt) {
            st = dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "dhsa_task_build: out of memory");
            break;
        }
        n_tok = count_tokens(tok, prompt, (int64_t)strlen(prompt), flags);
        if (n_tok < 0) {
            st = DHSA_ERR_INVALID_ARG;
            break;
        }
        if (n_tok <= p->length && (n_tok >= p->length - p->length / 32 || span >= flen)) break;
        double ratio = (double)p->length / (double)n_tok;
        int64_t next = (int64_t)((double)span * (ratio < 1 ? ratio * 0.995 : 1 + (ratio - 1) * 0.9));
        if (next == span) next = n_tok > p->length ? span - 8 : span + 8;
        span = next > 0 ? next : 1;
    }
    if (!st && n_tok > p->length)
        st = dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_task_build: could not fit the %s task in %lld tokens",
                        dhsa_task_kind_name(p->kind), (long long)p->length);
    if (!st && n_tok < p->length - p->length / 32)
        st = dhsa__fail(DHSA_ERR_INVALID_ARG,
                        "dhsa_task_build: the filler (%lld bytes) is too short for a %lld-token %s task (%lld tokens)",
                        (long long)flen, (long long)p->length, dhsa_task_kind_name(p->kind), (long long)n_tok);
    if (!st) {
        out->ids = malloc((size_t)(n_tok + 1) * sizeof(int32_t));
        if (!out->ids) st = dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "dhsa_task_build: out of memory");
    }
    if (!st) st = dhsa_tokenize(tok, prompt, (int64_t)strlen(prompt), flags, out->ids, n_tok + 1, &out->n_ids);
    /* the asked numbers' token ranges: " N" starts where the prefix before the space ends */
    for (int i = 0; i < nn && !st; i++) {
        if (!nd[i].asked) continue;
        int64_t lo = count_tokens(tok, prompt, nd[i].at - 1, flags);
        int64_t hi = count_tokens(tok, prompt, nd[i].at + nd[i].num_len, flags);
        if (lo < 0 || hi < lo) {
            st = dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_task_build: could not place needle %d", i);
            break;
        }
        out->span_lo[out->n_spans] = lo;
        out->span_hi[out->n_spans++] = hi > out->n_ids ? out->n_ids : hi;
    }
    free(f);
    if (st) {
        free(prompt);
        dhsa_task_free(out);
        return st;
    }
    out->prompt = prompt;
    /* depth as the needle sentence's place between the preamble and the question */
    /* (filler tokens before it / all filler tokens; needle tokens not counted) */
    int64_t pl = (int64_t)strlen(prompt), before = -1, needles = 0, needles_before = 0;
    int64_t t0 = count_tokens(tok, prompt, (int64_t)strlen(pre), flags);
    int64_t t1 = count_tokens(tok, prompt, pl - (int64_t)strlen(question), flags);
    for (int i = 0; i < nn; i++) {
        int64_t k = count_tokens(tok, nd[i].text, (int64_t)strlen(nd[i].text), 0);
        if (before < 0 && nd[i].asked) {
            before = count_tokens(tok, prompt, nd[i].at - nd[i].num_off, flags) - t0;
            needles_before = needles;
        }
        needles += k;
    }
    int64_t fill = t1 - t0 - needles;
    out->depth_used = fill > 0 ? (double)(before - needles_before) / (double)fill : 0;
    if (out->depth_used < 0) out->depth_used = 0;
    if (out->depth_used > 1) out->depth_used = 1;
    return DHSA_OK;
}

/* -------------------------------------------------------------- score --- */

int dhsa_task_check(const dhsa_task *t, const char *text, int64_t len) {
    if (!t || t->n_numbers == 0 || (!text && len > 0)) return 0;
    int64_t i = 0;
    for (int k = 0; k < t->n_numbers; k++) {
        while (i < len && !(text[i] >= '0' && text[i] <= '9')) i++;
        if (i == len) return 0;
        uint64_t v = 0;
        int digits = 0;
        while (i < len && text[i] >= '0' && text[i] <= '9') {
            if (digits++ < 19) v = v * 10 + (uint64_t)(text[i] - '0');
            i++;
        }
        if (digits > 19 || v != t->numbers[k]) return 0;
    }
    return 1;
}

double dhsa__spans_selected(const dhsa_layout *layout, int64_t g, int64_t row, int n, const int64_t *lo,
                            const int64_t *hi) {
    if (!layout) return 1;
    int64_t all = 0, sel = 0;
    for (int s = 0; s < n; s++)
        for (int64_t k = lo[s]; k < hi[s]; k++) {
            all++;
            sel += dhsa_layout_selects(layout, 0, g, row, k) == 1;
        }
    return all ? (double)sel / (double)all : 0;
}

double dhsa_task_selected(const dhsa_task *t, const dhsa_layout *layout, int64_t g, int64_t row) {
    if (!t || t->n_spans == 0) return 0;
    return dhsa__spans_selected(layout, g, row, t->n_spans, t->span_lo, t->span_hi);
}
