/* ruler.c: the RULER-style task suite of `dhsa eval ruler` (contract in
 * include/dhsa.h, "Evaluation" block: dhsa_ruler_*; the method in
 * docs/eval.md, "eval ruler"). Task definitions and the metric follow
 * NVIDIA's RULER (needle kinds, multi-key / multi-value / multi-query,
 * variable tracking, common and frequent words; string_match_all); the
 * prompts, word lists, noise sentences and code are dhsa's own.
 *
 * Building: a prompt is haystack units (noise or prose sentences,
 * distractor needles, list items, coded words) with the task's needles at
 * the unit boundaries nearest their depths (dhsa__niah_boundary over the
 * units' token counts), then the question and the answer prefix, plain or
 * through a chat template. The number of units is the largest that keeps
 * the prompt within `length` tokens (binary search, whole prompts
 * tokenized). Everything random comes from the seed (splitmix64), and every
 * key, value, variable and word is drawn from the split's pool only (a hash
 * of its text picks the pool). Tested by tests/test_eval_ruler.c.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "dhsa.h"
#include "eval/niah.h"

/* ------------------------------------------------------------- pools --- */

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The pool (0 DEV, 1 TEST) a string belongs to: a bit of its FNV-1a hash,
 * mixed. Applied to every key, value, variable and word, so the two pools
 * are disjoint by construction. */
static int pool_of(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    uint64_t m = h;
    return (int)(splitmix(&m) >> 63);
}

/* Adjectives and nouns of the word keys and values ("quiet-harbor"),
 * written for dhsa (public domain). */
static const char *const adjectives[] = {
    "amber", "ancient", "autumn", "bitter", "blazing", "bold", "brave", "brisk", "bronze", "calm", "careful",
    "cheerful", "chilly", "clever", "cloudy", "coastal", "copper", "cosmic", "crimson", "crisp", "curious",
    "dapper", "daring", "dusty", "eager", "early", "electric", "elegant", "emerald", "fancy", "feathered",
    "fierce", "fluffy", "foggy", "frozen", "gentle", "giant", "gilded", "glassy", "golden", "graceful", "grumpy",
    "hasty", "hidden", "hollow", "humble", "icy", "idle", "ivory", "jolly", "keen", "lively", "lonely", "lucky",
    "marble", "mellow", "merry", "misty", "modest", "mossy", "muddy", "narrow", "noble", "nimble", "odd", "olive",
    "patient", "pearly", "plain", "polite", "proud", "purple", "quick", "quiet", "rapid", "rocky", "rosy",
    "rusty", "sandy", "scarlet", "shady", "silent", "silver", "sleepy", "slender", "smoky", "snowy", "solemn",
    "sturdy", "sunny", "swift", "tidy", "tiny", "velvet", "vivid", "wandering", "wary", "windy", "wise", "witty",
    "wooden", "young", "zealous",
};
static const char *const nouns[] = {
    "acorn", "anchor", "apron", "arrow", "badger", "balloon", "basket", "beacon", "beetle", "bell", "bicycle",
    "blanket", "bottle", "bridge", "bucket", "cabin", "camel", "candle", "canyon", "carpet", "castle", "cellar",
    "chariot", "cherry", "clock", "cloud", "comet", "compass", "cottage", "crayon", "cricket", "crown", "dolphin",
    "donkey", "dragon", "drum", "eagle", "easel", "falcon", "feather", "fiddle", "forest", "fountain", "garden",
    "giraffe", "glacier", "goblet", "harbor", "harp", "hedgehog", "helmet", "island", "jacket", "kettle", "kite",
    "ladder", "lantern", "lemon", "lighthouse", "lizard", "magnet", "mango", "meadow", "mirror", "mitten",
    "monkey", "mountain", "needle", "nest", "oasis", "octopus", "orchard", "otter", "owl", "paddle", "parrot",
    "pebble", "pencil", "penguin", "pepper", "piano", "pillow", "planet", "pumpkin", "puzzle", "quarry", "quilt",
    "rabbit", "raft", "ribbon", "river", "rocket", "saddle", "sailboat", "scarf", "shovel", "spoon", "squirrel",
    "statue", "stove", "teapot", "temple", "thimble", "tiger", "tractor", "trumpet", "tulip", "turtle", "umbrella",
    "valley", "violin", "wagon", "walnut", "whale", "window", "wizard", "zebra",
};

#define N_ADJ ((uint64_t)(sizeof adjectives / sizeof adjectives[0]))
#define N_NOUN ((uint64_t)(sizeof nouns / sizeof nouns[0]))

/* Noise sentences, one set per split (written for dhsa, public domain). */
static const char *const noise_dev[] = {
    "The stars are bright tonight.", "The road is long and dusty.", "The bread is warm.",
    "Here we are again.", "Onward and upward we go.",
};
static const char *const noise_test[] = {
    "The lake is calm.", "The trees are tall and green.", "The kettle sings on the stove.",
    "Over the hill we go.", "Back and forth it swings.",
};

/* One value of a kind from the split's pool, into buf (48 bytes). */
static void draw_value(uint64_t *rs, dhsa_ruler_kind kind, int split, char *buf) {
    do {
        uint64_t r = splitmix(rs);
        if (kind == DHSA_RULER_NUMBERS) {
            snprintf(buf, 48, "%u", (unsigned)(1000000 + r % 9000000));
        } else if (kind == DHSA_RULER_WORDS) {
            snprintf(buf, 48, "%s-%s", adjectives[r % N_ADJ], nouns[(r >> 32) % N_NOUN]);
        } else {
            uint64_t r2 = splitmix(rs);
            /* version 4, variant 10xx */
            snprintf(buf, 48, "%08x-%04x-4%03x-%x%03x-%012llx", (unsigned)(r >> 32), (unsigned)(r >> 16) & 0xffffu,
                     (unsigned)r & 0xfffu, 8u + (unsigned)((r2 >> 60) & 3u), (unsigned)(r2 >> 48) & 0xfffu,
                     (unsigned long long)(r2 & 0xffffffffffffull));
        }
    } while (pool_of(buf) != split);
}

/* k random lowercase (or uppercase) letters from the split's pool. */
static void draw_letters(uint64_t *rs, int k, int upper, int split, char *buf) {
    do {
        for (int i = 0; i < k; i++) buf[i] = (char)((upper ? 'A' : 'a') + (int)(splitmix(rs) % 26));
        buf[k] = 0;
    } while (pool_of(buf) != split);
}

static void draw_vt_value(uint64_t *rs, int split, char *buf) {
    do snprintf(buf, 48, "%u", (unsigned)(10000 + splitmix(rs) % 90000));
    while (pool_of(buf) != split);
}

/* ----------------------------------------------------------- presets --- */

dhsa_ruler_params dhsa_ruler_default_params(void) {
    dhsa_ruler_params p;
    memset(&p, 0, sizeof p);
    p.task = DHSA_RULER_SINGLE;
    p.length = 4096;
    p.depth = 0.5;
    p.seed = 1;
    p.split = DHSA_RULER_TEST;
    p.key_kind = DHSA_RULER_WORDS;
    p.value_kind = DHSA_RULER_NUMBERS;
    p.haystack = DHSA_RULER_NOISE;
    p.tmpl = DHSA_CHAT_NONE;
    return p;
}

typedef struct {
    const char *name;
    dhsa_ruler_task task;
    dhsa_ruler_kind key, value;
    dhsa_ruler_haystack hay;
    int n_keys, n_values, n_queries;
} preset;

static const preset presets[] = {
    {"single_noise", DHSA_RULER_SINGLE, DHSA_RULER_WORDS, DHSA_RULER_NUMBERS, DHSA_RULER_NOISE, 1, 1, 1},
    {"single_prose", DHSA_RULER_SINGLE, DHSA_RULER_WORDS, DHSA_RULER_NUMBERS, DHSA_RULER_PROSE, 1, 1, 1},
    {"single_uuid", DHSA_RULER_SINGLE, DHSA_RULER_WORDS, DHSA_RULER_UUIDS, DHSA_RULER_PROSE, 1, 1, 1},
    {"single_word", DHSA_RULER_SINGLE, DHSA_RULER_WORDS, DHSA_RULER_WORDS, DHSA_RULER_NOISE, 1, 1, 1},
    {"multikey", DHSA_RULER_MULTIKEY, DHSA_RULER_WORDS, DHSA_RULER_NUMBERS, DHSA_RULER_PROSE, 4, 1, 1},
    {"multikey_needles", DHSA_RULER_MULTIKEY, DHSA_RULER_WORDS, DHSA_RULER_NUMBERS, DHSA_RULER_NEEDLES, 1, 1, 1},
    {"multikey_uuid", DHSA_RULER_MULTIKEY, DHSA_RULER_UUIDS, DHSA_RULER_UUIDS, DHSA_RULER_NEEDLES, 1, 1, 1},
    {"multivalue", DHSA_RULER_MULTIVALUE, DHSA_RULER_WORDS, DHSA_RULER_NUMBERS, DHSA_RULER_PROSE, 1, 4, 1},
    {"multiquery", DHSA_RULER_MULTIQUERY, DHSA_RULER_WORDS, DHSA_RULER_NUMBERS, DHSA_RULER_PROSE, 4, 1, 4},
    {"vt", DHSA_RULER_VT, DHSA_RULER_NUMBERS, DHSA_RULER_NUMBERS, DHSA_RULER_NOISE, 0, 0, 0},
    {"cwe", DHSA_RULER_CWE, DHSA_RULER_WORDS, DHSA_RULER_WORDS, DHSA_RULER_NOISE, 0, 0, 0},
    {"fwe", DHSA_RULER_FWE, DHSA_RULER_WORDS, DHSA_RULER_WORDS, DHSA_RULER_NOISE, 0, 0, 0},
};

dhsa_status dhsa_ruler_preset(const char *name, dhsa_ruler_params *p) {
    if (!name || !p) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_ruler_preset: NULL argument");
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        const preset *q = &presets[i];
        if (strcmp(name, q->name) != 0) continue;
        p->task = q->task;
        p->key_kind = q->key;
        p->value_kind = q->value;
        p->haystack = q->hay;
        p->n_keys = q->n_keys;
        p->n_values = q->n_values;
        p->n_queries = q->n_queries;
        return DHSA_OK;
    }
    return dhsa__fail(DHSA_ERR_INVALID_ARG, "unknown RULER task \"%s\": single_noise, single_prose, single_uuid, "
                      "single_word, multikey, multikey_needles, multikey_uuid, multivalue, multiquery, vt, cwe, fwe",
                      name);
}

void dhsa_ruler_free(dhsa_ruler_prompt *pr) {
    if (!pr) return;
    free(pr->ids);
    free(pr->text);
    memset(pr, 0, sizeof *pr);
}

/* ------------------------------------------------------------- score --- */

static char lower(char c) { return c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c; }

static int contains_ci(const char *hay, int64_t n, const char *needle) {
    int64_t k = (int64_t)strlen(needle);
    if (k == 0) return 1;
    for (int64_t i = 0; i + k <= n; i++) {
        int64_t j = 0;
        while (j < k && lower(hay[i + j]) == lower(needle[j])) j++;
        if (j == k) return 1;
    }
    return 0;
}

double dhsa_ruler_score(const dhsa_ruler_prompt *pr, const char *answer, int64_t len) {
    if (!pr || pr->n_expected <= 0 || (!answer && len > 0) || len < 0) return 0;
    int hit = 0, n = pr->n_expected < DHSA_RULER_MAX_EXPECTED ? pr->n_expected : DHSA_RULER_MAX_EXPECTED;
    for (int i = 0; i < n; i++) hit += contains_ci(answer, len, pr->expected[i]);
    return (double)hit / (double)n;
}

/* ------------------------------------------------------------- files --- */

static dhsa_status oom(void) { return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory building a RULER prompt"); }

static dhsa_status slurp(const char *path, const char *package, char **text, int64_t *len) {
    *text = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return dhsa__fail(DHSA_ERR_IO, "cannot read %s: install the Debian package %s (apt-get install %s)", path,
                          package, package);
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return dhsa__fail(DHSA_ERR_IO, "cannot seek in %s", path);
    }
    long n = ftell(f);
    if (n < 0 || n > (1L << 28)) {
        fclose(f);
        return dhsa__fail(DHSA_ERR_TOO_LARGE, "%s: %ld bytes, the most read is 256 MiB", path, n);
    }
    rewind(f);
    char *b = malloc((size_t)n + 1);
    if (!b) {
        fclose(f);
        return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory for %s (%ld bytes)", path, n);
    }
    size_t got = fread(b, 1, (size_t)n, f);
    fclose(f);
    if (got != (size_t)n) {
        free(b);
        return dhsa__fail(DHSA_ERR_IO, "short read of %s", path);
    }
    b[n] = 0;
    *text = b;
    *len = n;
    return DHSA_OK;
}

void dhsa_ruler_text_free(char *text) { free(text); }

dhsa_status dhsa_ruler_load_words(const char *path, char **text, int64_t *len) {
    if (!text || !len) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_ruler_load_words: NULL output");
    return slurp(path ? path : "/usr/share/dict/words", "wamerican", text, len);
}

/* An HTML entity at s (after '&'), written as UTF-8 into o; returns the
 * bytes consumed after '&' (0: not one we know, the '&' is kept). */
static int entity(const char *s, const char *end, dhsa__text *o) {
    static const struct {
        const char *name, *utf8;
    } known[] = {{"amp;", "&"},     {"lt;", "<"},           {"gt;", ">"},           {"quot;", "\""},
                 {"nbsp;", " "},    {"rsquo;", "\xE2\x80\x99"}, {"lsquo;", "\xE2\x80\x98"}, {"ldquo;", "\xE2\x80\x9C"},
                 {"rdquo;", "\xE2\x80\x9D"}, {"hellip;", "..."}, {"ndash;", "\xE2\x80\x93"}, {"mdash;", "\xE2\x80\x94"},
                 {"copy;", "\xC2\xA9"}, {"apos;", "'"}};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        size_t k = strlen(known[i].name);
        if ((size_t)(end - s) >= k && memcmp(s, known[i].name, k) == 0) {
            dhsa__text_add(o, known[i].utf8);
            return (int)k;
        }
    }
    if (s < end && *s == '#') { /* &#NNN; or &#xHH; (ASCII only; others dropped) */
        int i = 1, hex = s + 1 < end && (s[1] == 'x' || s[1] == 'X');
        long v = 0;
        if (hex) i++;
        int digits = 0;
        while (s + i < end && digits < 7) {
            char c = s[i];
            int d = c >= '0' && c <= '9' ? c - '0' : hex && c >= 'a' && c <= 'f' ? c - 'a' + 10
                                                    : hex && c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
            if (d < 0) break;
            v = v * (hex ? 16 : 10) + d;
            i++;
            digits++;
        }
        if (digits && s + i < end && s[i] == ';') {
            if (v >= 32 && v < 127) {
                char c[2] = {(char)v, 0};
                dhsa__text_add(o, c);
            }
            return i + 1;
        }
    }
    return 0;
}

/* The text of every <p> element of html (tags removed, entities decoded,
 * white space folded), one paragraph a line; navigation lines and
 * paragraphs under 40 bytes (headings) left out. NULL when out of memory. */
static char *html_paragraphs(const char *html, int64_t n, int64_t *len) {
    dhsa__text o = {0};
    dhsa__text_add(&o, "");
    const char *end = html + n;
    for (const char *s = html; s < end;) {
        const char *p = strstr(s, "<p>");
        if (!p) break;
        p += 3;
        const char *q = strstr(p, "</p>");
        if (!q) q = end;
        int space = 0;
        size_t para_start = o.n;
        for (const char *c = p; c < q;) {
            if (*c == '<') { /* a tag: dropped */
                const char *gt = memchr(c, '>', (size_t)(q - c));
                c = gt ? gt + 1 : q;
                continue;
            }
            if (*c == ' ' || *c == '\n' || *c == '\t' || *c == '\r') {
                space = 1;
                c++;
                continue;
            }
            if (space && o.n > para_start) dhsa__text_add(&o, " ");
            space = 0;
            if (*c == '&') {
                int k = entity(c + 1, q, &o);
                if (k) {
                    c += 1 + k;
                    continue;
                }
            }
            dhsa__text_put(&o, c, 1);
            c++;
        }
        const char *para = o.p ? o.p + para_start : "";
        if (o.n - para_start < 40 || strncmp(para, "Next:", 5) == 0 || strncmp(para, "Previous:", 9) == 0 ||
            strncmp(para, "Up:", 3) == 0) {
            o.n = para_start;
            if (o.p) o.p[o.n] = 0;
        } else {
            dhsa__text_add(&o, "\n");
        }
        s = q;
    }
    *len = (int64_t)o.n;
    return o.p;
}

static uint64_t hash_line(const char *s, const char *e) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; s < e; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

dhsa_status dhsa_ruler_load_prose(const char *dir, dhsa_ruler_split split, char **text, int64_t *len) {
    if (!text || !len) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_ruler_load_prose: NULL output");
    *text = NULL;
    *len = 0;
    if (split != DHSA_RULER_DEV && split != DHSA_RULER_TEST)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_ruler_load_prose: split %d is not DEV or TEST", (int)split);
    /* both documents: a paragraph the other one has too (the licence,
     * boilerplate) is left out, so the two splits share no paragraph */
    char *para[2] = {NULL, NULL};
    int64_t plen[2] = {0, 0};
    dhsa_status st = DHSA_OK;
    for (int s = 0; s < 2 && !st; s++) {
        char path[4096];
        int w = snprintf(path, sizeof path, "%s/%s", dir ? dir : "/usr/share/doc/gnu-standards",
                         s == DHSA_RULER_DEV ? "maintain.html" : "standards.html");
        if (w < 0 || (size_t)w >= sizeof path) {
            st = dhsa__fail(DHSA_ERR_INVALID_ARG, "prose directory path too long");
            break;
        }
        char *html;
        int64_t n;
        st = slurp(path, "gnu-standards", &html, &n);
        if (st) break;
        para[s] = html_paragraphs(html, n, &plen[s]);
        free(html);
        if (!para[s]) st = dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory for the prose of %s", path);
        else if (plen[s] < 1000) st = dhsa__fail(DHSA_ERR_FORMAT, "%s has no prose paragraphs (<p> elements)", path);
    }
    uint64_t *other = NULL;
    int64_t n_other = 0;
    dhsa__text o = {0};
    if (!st) { /* the other document's paragraph hashes, sorted */
        const char *t = para[1 - split], *end = t + plen[1 - split];
        for (const char *s = t; s < end; s++) n_other += *s == '\n';
        other = malloc((size_t)(n_other + 1) * sizeof(uint64_t));
        if (!other) st = oom();
        int64_t k = 0;
        for (const char *s = t; other && s < end;) {
            const char *e = memchr(s, '\n', (size_t)(end - s));
            if (!e) e = end;
            other[k++] = hash_line(s, e);
            s = e + 1;
        }
        n_other = k;
        if (other) qsort(other, (size_t)n_other, sizeof other[0], cmp_u64);
    }
    if (!st) {
        dhsa__text_add(&o, "");
        const char *t = para[split], *end = t + plen[split];
        for (const char *s = t; s < end;) {
            const char *e = memchr(s, '\n', (size_t)(end - s));
            if (!e) e = end;
            uint64_t h = hash_line(s, e);
            if (!bsearch(&h, other, (size_t)n_other, sizeof h, cmp_u64)) {
                dhsa__text_put(&o, s, (size_t)(e - s));
                dhsa__text_add(&o, "\n");
            }
            s = e + 1;
        }
        if (o.bad) st = oom();
    }
    free(other);
    free(para[0]);
    free(para[1]);
    if (st) {
        free(o.p);
        return st;
    }
    *text = o.p;
    *len = (int64_t)o.n;
    return DHSA_OK;
}

/* ------------------------------------------------------------- build --- */

#define MAX_NEEDLES 64

typedef struct {
    char text[192];
    double pos;   /* 0..1 in the haystack */
    int order;    /* ties at one boundary: in this order */
    int primary;  /* the needle placed at params.depth */
    int64_t at;   /* boundary index for the current unit count */
} needle;

/* Everything one build works with. */
typedef struct {
    const dhsa_tokenizer *tok;
    const dhsa_ruler_params *p;
    unsigned flags;
    /* haystack units */
    const char **unit;      /* [n_cap] */
    char **owned;           /* distractor needles / words this build allocated */
    int64_t n_owned;
    int64_t *utok;          /* [n_cap] tokens of each unit */
    int64_t n_cap;
    int64_t tail;           /* PROSE: words of unit[n] after the n whole units (a cut sentence
                               fills the length, as RULER cuts its essays at a word) */
    const char *sep;        /* between units */
    needle nd[MAX_NEEDLES];
    int n_nd;
    char pre[512], question[1024], prefix[512];
    /* CWE / FWE: the words and their counts */
    const char **words;
    int64_t n_words;
    int64_t *counts;
} builder;

static int cmp_needle(const void *a, const void *b) {
    const needle *x = a, *y = b;
    if (x->pos != y->pos) return x->pos < y->pos ? -1 : 1;
    return x->order - y->order;
}

/* Tokens of the prompt whose task text is `text`; ids (cap) may be NULL. */
static dhsa_status prompt_tokens(const builder *b, const char *text, int32_t *ids, int64_t cap, int64_t *n) {
    const dhsa_ruler_params *p = b->p;
    if (p->tmpl == DHSA_CHAT_NONE) {
        dhsa__text t = {0};
        dhsa__text_add(&t, text);
        dhsa__text_add(&t, b->prefix);
        if (t.bad) return oom();
        dhsa_status st = dhsa_tokenize(b->tok, t.p, (int64_t)t.n, b->flags, ids, cap, n);
        free(t.p);
        return ids ? st : DHSA_OK; /* sizing (NULL, 0): *n is the count */
    }
    dhsa_chat_message msg = {"user", text};
    int64_t n1 = 0, n2 = 0;
    dhsa_status st = dhsa_chat_tokenize(p->tmpl, b->tok, &msg, 1, 1, b->flags, ids, cap, &n1);
    if (st && ids) return st;
    const char *pf = b->prefix[0] == ' ' ? b->prefix + 1 : b->prefix; /* the turn opens on a new line */
    st = dhsa_tokenize(b->tok, pf, (int64_t)strlen(pf), 0, ids ? ids + n1 : NULL, ids ? cap - n1 : 0, &n2);
    if (st && ids) return st;
    *n = n1 + n2;
    return DHSA_OK;
}

static int64_t count_text(const dhsa_tokenizer *tok, const char *s) {
    int64_t n = 0;
    dhsa_tokenize(tok, s, (int64_t)strlen(s), 0, NULL, 0, &n);
    return n > 0 ? n : 1;
}

/* The task text with the first n units (NIAH / VT): preamble, units with
 * the needles at their boundaries, question. NULL when out of memory. */
static char *compose_units(builder *b, int64_t n) {
    for (int i = 0; i < b->n_nd; i++) b->nd[i].at = dhsa__niah_boundary(b->utok, n, b->nd[i].pos);
    dhsa__text t = {0};
    dhsa__text_add(&t, b->pre);
    dhsa__text_add(&t, "\n");
    int first = 1, k = 0; /* needles are sorted by position, so by boundary */
    for (int64_t i = 0; i <= n; i++) {
        while (k < b->n_nd && b->nd[k].at == i) {
            if (!first) dhsa__text_add(&t, b->sep);
            dhsa__text_add(&t, b->nd[k++].text);
            first = 0;
        }
        if (i == n) break;
        if (!first) dhsa__text_add(&t, b->sep);
        dhsa__text_add(&t, b->unit[i]);
        first = 0;
    }
    if (b->tail > 0 && n < b->n_cap) {
        const char *s = b->unit[n], *e = s;
        for (int64_t w = 0; w < b->tail && *e; w++) {
            while (*e == ' ') e++;
            while (*e && *e != ' ') e++;
        }
        if (!first) dhsa__text_add(&t, b->sep);
        dhsa__text_put(&t, s, (size_t)(e - s));
    }
    dhsa__text_add(&t, "\n");
    dhsa__text_add(&t, b->question);
    return t.p;
}

/* CWE's numbered list with n uncommon words; FWE's coded text of n words. */
static char *compose_words(builder *b, int64_t n) {
    const dhsa_ruler_params *p = b->p;
    uint64_t rs = p->seed * 0x9E3779B97F4A7C15ull + 77;
    int64_t total = 0;
    int64_t *list = NULL;
    if (p->task == DHSA_RULER_CWE) {
        int64_t nc = b->counts[2]; /* counts: freq_common, freq_uncommon, n_common */
        total = nc * b->counts[0] + n * b->counts[1];
        list = malloc((size_t)(total > 0 ? total : 1) * sizeof(int64_t));
        if (!list) return NULL;
        int64_t m = 0;
        for (int64_t w = 0; w < nc + n; w++)
            for (int64_t r = 0; r < (w < nc ? b->counts[0] : b->counts[1]); r++) list[m++] = w;
    } else { /* FWE: Zipf counts over the vocabulary for n words */
        double z = 0;
        double a = p->alpha > 0 ? p->alpha : 2.0;
        for (int64_t k = 1; k <= 100000; k++) z += pow((double)k, -a);
        z += pow(100000.0, 1 - a) / (a - 1); /* the tail */
        int64_t *cnt = b->counts;
        for (int64_t k = 0; k < b->n_words; k++) {
            cnt[k] = (int64_t)floor((double)n * pow((double)(k + 1), -a) / z);
            total += cnt[k];
        }
        list = malloc((size_t)(total > 0 ? total : 1) * sizeof(int64_t));
        if (!list) return NULL;
        int64_t m = 0;
        for (int64_t k = 0; k < b->n_words; k++)
            for (int64_t r = 0; r < cnt[k]; r++) list[m++] = k;
    }
    for (int64_t i = total - 1; i > 0; i--) { /* Fisher-Yates */
        int64_t j = (int64_t)(splitmix(&rs) % (uint64_t)(i + 1)), t = list[i];
        list[i] = list[j];
        list[j] = t;
    }
    dhsa__text t = {0};
    dhsa__text_add(&t, b->pre);
    dhsa__text_add(&t, p->task == DHSA_RULER_CWE ? "\n" : " ");
    char num[32];
    for (int64_t i = 0; i < total; i++) {
        if (i) dhsa__text_add(&t, " ");
        if (p->task == DHSA_RULER_CWE) {
            snprintf(num, sizeof num, "%lld. ", (long long)(i + 1));
            dhsa__text_add(&t, num);
        }
        dhsa__text_add(&t, b->words[list[i]]);
    }
    dhsa__text_add(&t, "\n");
    dhsa__text_add(&t, b->question);
    free(list);
    return t.p;
}

static char *compose(builder *b, int64_t n) {
    return b->p->task == DHSA_RULER_CWE || b->p->task == DHSA_RULER_FWE ? compose_words(b, n) : compose_units(b, n);
}

static int add_owned(builder *b, char *s) {
    if (!s) return 0;
    if ((b->n_owned & (b->n_owned - 1)) == 0) { /* grow at powers of two */
        char **no = realloc(b->owned, (size_t)(b->n_owned ? 2 * b->n_owned : 1) * sizeof(char *));
        if (!no) {
            free(s);
            return 0;
        }
        b->owned = no;
    }
    b->owned[b->n_owned++] = s;
    return 1;
}

static const char *kind_one(dhsa_ruler_kind k) {
    return k == DHSA_RULER_NUMBERS ? "number" : k == DHSA_RULER_WORDS ? "word" : "UUID";
}

static int in_list(char (*list)[48], int n, const char *s) {
    for (int i = 0; i < n; i++)
        if (strcmp(list[i], s) == 0) return 1;
    return 0;
}

/* NIAH needles, question and expected answers. */
static dhsa_status setup_niah(builder *b, uint64_t *rs, dhsa_ruler_prompt *out) {
    const dhsa_ruler_params *p = b->p;
    int split = (int)p->split;
    int nk = p->n_keys, nv = p->n_values, nq = p->n_queries;
    if (p->task == DHSA_RULER_MULTIKEY && nk <= 0) nk = p->haystack == DHSA_RULER_NEEDLES ? 1 : 4;
    if (p->task == DHSA_RULER_MULTIVALUE && nv <= 0) nv = 4;
    if (p->task == DHSA_RULER_MULTIQUERY && nk <= 0) nk = 4;
    if (p->task == DHSA_RULER_MULTIQUERY && nq <= 0) nq = nk;
    if (nk <= 0) nk = 1;
    if (nv <= 0) nv = 1;
    if (nq <= 0) nq = 1;
    if (p->task == DHSA_RULER_SINGLE) nk = nv = nq = 1;
    if (nq > nk) nk = nq;
    if (nk * nv > MAX_NEEDLES || nq * nv > DHSA_RULER_MAX_EXPECTED)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "RULER task: %d keys x %d values (at most %d needles, %d asked)", nk,
                          nv, MAX_NEEDLES, DHSA_RULER_MAX_EXPECTED);
    char keys[MAX_NEEDLES][48], vals[MAX_NEEDLES][48];
    for (int k = 0; k < nk; k++)
        do draw_value(rs, p->key_kind, split, keys[k]);
        while (in_list(keys, k, keys[k]));
    for (int i = 0; i < nk * nv; i++)
        do draw_value(rs, p->value_kind, split, vals[i]);
        while (in_list(vals, i, vals[i]));
    /* which keys are asked: the first nq of a seeded permutation */
    int perm[MAX_NEEDLES];
    for (int k = 0; k < nk; k++) perm[k] = k;
    for (int k = nk - 1; k > 0; k--) {
        int j = (int)(splitmix(rs) % (uint64_t)(k + 1)), t = perm[k];
        perm[k] = perm[j];
        perm[j] = t;
    }
    const char *kind = kind_one(p->value_kind);
    int primary = perm[0] * nv; /* the first value of the first asked key sits at the depth */
    for (int k = 0; k < nk; k++)
        for (int v = 0; v < nv; v++) {
            needle *n = &b->nd[b->n_nd];
            snprintf(n->text, sizeof n->text, "The secret %s for %.47s is: %.47s.", kind, keys[k], vals[k * nv + v]);
            n->pos = k * nv + v == primary ? p->depth : (double)(splitmix(rs) >> 11) * (1.0 / 9007199254740992.0);
            n->primary = k * nv + v == primary;
            n->order = b->n_nd++;
        }
    char query[MAX_NEEDLES * 48 + 64] = "";
    for (int q = 0; q < nq; q++) {
        size_t l = strlen(query);
        snprintf(query + l, sizeof query - l, "%s%s", q == 0 ? "" : q + 1 == nq ? " and " : ", ", keys[perm[q]]);
        for (int v = 0; v < nv; v++) snprintf(out->expected[out->n_expected++], 48, "%s", vals[perm[q] * nv + v]);
    }
    int many = nq * nv > 1;
    snprintf(b->pre, sizeof b->pre,
             "Below, some secret %ss are hidden in a long text, each one given for a key. Memorize them: you will "
             "be asked about them afterwards.", kind);
    /* the query's length bounded to what each buffer holds (gcc at -O1,
     * make asan, refuses a possible cut otherwise) */
    snprintf(b->question, sizeof b->question, "What %s the secret %s%s for %.900s in the text above?",
             many ? "are all" : "is", kind, many ? "s" : "", query);
    snprintf(b->prefix, sizeof b->prefix, " The secret %s%s for %.400s %s:", kind, many ? "s" : "", query,
             many ? "are" : "is");
    /* distractor needles as the haystack: other keys, other values */
    if (p->haystack == DHSA_RULER_NEEDLES) {
        uint64_t ds = p->seed * 0xD1B54A32D192ED03ull + 5;
        for (int64_t i = 0; i < b->n_cap; i++) {
            char k[48], v[48];
            do draw_value(&ds, p->key_kind, split, k);
            while (in_list(keys, nk, k));
            do draw_value(&ds, p->value_kind, split, v);
            while (in_list(vals, nk * nv, v));
            char *s = malloc(192);
            if (!add_owned(b, s)) return oom();
            snprintf(s, 192, "The secret %s for %s is: %s.", kind, k, v);
            b->unit[i] = s;
        }
    }
    return DHSA_OK;
}

static dhsa_status setup_vt(builder *b, uint64_t *rs, dhsa_ruler_prompt *out) {
    const dhsa_ruler_params *p = b->p;
    int split = (int)p->split;
    int nc = p->n_chains > 0 ? p->n_chains : 1, nh = p->n_hops > 0 ? p->n_hops : 4;
    if (nc * (nh + 1) > MAX_NEEDLES || nh + 1 > DHSA_RULER_MAX_EXPECTED)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "RULER vt: %d chains of %d hops (at most %d lines, %d variables a "
                          "chain)", nc, nh, MAX_NEEDLES, DHSA_RULER_MAX_EXPECTED - 1);
    char vars[MAX_NEEDLES][48], val0[48] = "";
    for (int i = 0; i < nc * (nh + 1); i++)
        do draw_letters(rs, 5, 1, split, vars[i]);
        while (in_list(vars, i, vars[i]));
    for (int c = 0; c < nc; c++) {
        char val[48];
        do draw_vt_value(rs, split, val);
        while (c > 0 && strcmp(val, val0) == 0);
        if (c == 0) memcpy(val0, val, sizeof val);
        /* chain c: its first line at the depth (chain 0) or a random place,
         * the hops at sorted random places after it */
        double start = c == 0 ? p->depth : (double)(splitmix(rs) >> 11) * (1.0 / 9007199254740992.0);
        double pos[MAX_NEEDLES];
        for (int h = 0; h < nh; h++) pos[h] = start + (1 - start) * (double)(splitmix(rs) >> 11) * (1.0 / 9007199254740992.0);
        for (int h = 1; h < nh; h++) /* insertion sort */
            for (int j = h; j > 0 && pos[j] < pos[j - 1]; j--) {
                double t = pos[j];
                pos[j] = pos[j - 1];
                pos[j - 1] = t;
            }
        for (int h = 0; h <= nh; h++) {
            needle *n = &b->nd[b->n_nd];
            const char *v = vars[c * (nh + 1) + h];
            if (h == 0) snprintf(n->text, sizeof n->text, "VAR %.47s = %.47s.", v, val);
            else snprintf(n->text, sizeof n->text, "VAR %.47s = VAR %.47s.", v, vars[c * (nh + 1) + h - 1]);
            n->pos = h == 0 ? start : pos[h - 1];
            n->primary = c == 0 && h == 0;
            n->order = b->n_nd++;
            if (c == 0) snprintf(out->expected[out->n_expected++], 48, "%.47s", v);
        }
    }
    snprintf(b->pre, sizeof b->pre,
             "Below, chains of variable assignments are hidden in a long text. Keep track of every variable and "
             "the value it gets.");
    snprintf(b->question, sizeof b->question,
             "Question: Which variables get the value %s, directly or through other variables, in the text above?",
             val0);
    snprintf(b->prefix, sizeof b->prefix, " Answer: The %d variables that get the value %s are:", nh + 1, val0);
    return DHSA_OK;
}

static int is_plain_word(const char *s, size_t n) {
    if (n < 3 || n > 12) return 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] < 'a' || s[i] > 'z') return 0;
    return 1;
}

static dhsa_status setup_cwe(builder *b, dhsa_ruler_prompt *out) {
    const dhsa_ruler_params *p = b->p;
    if (!p->words || p->words_len <= 0)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "RULER cwe needs a word list (params.words: dhsa_ruler_load_words)");
    /* the split's words: lowercase ASCII, 3..12 letters, one a line, each once */
    int64_t cap = 1024;
    b->words = malloc((size_t)cap * sizeof(char *));
    if (!b->words) return oom();
    const char *s = p->words, *end = p->words + p->words_len;
    while (s < end) {
        const char *e = memchr(s, '\n', (size_t)(end - s));
        if (!e) e = end;
        size_t n = (size_t)(e - s);
        if (n && s[n - 1] == '\r') n--;
        char tmp[16];
        if (is_plain_word(s, n)) {
            memcpy(tmp, s, n);
            tmp[n] = 0;
        }
        if (is_plain_word(s, n) && pool_of(tmp) == (int)p->split &&
            !(b->n_words > 0 && strcmp(b->words[b->n_words - 1], tmp) == 0)) {
            char *w = malloc(n + 1);
            if (!add_owned(b, w)) return oom();
            memcpy(w, tmp, n + 1);
            {
                if (b->n_words == cap) {
                    cap *= 2;
                    const char **nw = realloc(b->words, (size_t)cap * sizeof(char *));
                    if (!nw) return oom();
                    b->words = nw;
                }
                b->words[b->n_words++] = w;
            }
        }
        s = e + 1;
    }
    int nc = p->n_common > 0 ? p->n_common : 10;
    if (nc > DHSA_RULER_MAX_EXPECTED)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "RULER cwe: %d common words, at most %d", nc, DHSA_RULER_MAX_EXPECTED);
    if (b->n_words < nc + 1)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "RULER cwe: the word list has %lld usable words of the split",
                          (long long)b->n_words);
    uint64_t rs = p->seed * 0xA24BAED4963EE407ull + 3;
    for (int64_t i = b->n_words - 1; i > 0; i--) { /* the sample's words: a seeded order */
        int64_t j = (int64_t)(splitmix(&rs) % (uint64_t)(i + 1));
        const char *t = b->words[i];
        b->words[i] = b->words[j];
        b->words[j] = t;
    }
    b->counts = malloc(3 * sizeof(int64_t));
    if (!b->counts) return oom();
    int shortp = p->length < 4096;
    b->counts[0] = p->freq_common > 0 ? p->freq_common : shortp ? 6 : 30;
    b->counts[1] = p->freq_uncommon > 0 ? p->freq_uncommon : shortp ? 1 : 3;
    b->counts[2] = nc;
    if (b->counts[1] >= b->counts[0])
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "RULER cwe: common words must occur more often (%lld) than the others "
                          "(%lld)", (long long)b->counts[0], (long long)b->counts[1]);
    for (int i = 0; i < nc; i++) snprintf(out->expected[out->n_expected++], 48, "%s", b->words[i]);
    snprintf(b->pre, sizeof b->pre,
             "Below is a numbered list of words. Some words occur in it much more often than the others. Keep track "
             "of which words occur most often.");
    snprintf(b->question, sizeof b->question, "Question: What are the %d most frequent words in the list above?", nc);
    snprintf(b->prefix, sizeof b->prefix, " Answer: The %d most frequent words in the list are:", nc);
    return DHSA_OK;
}

static dhsa_status setup_fwe(builder *b, uint64_t *rs, dhsa_ruler_prompt *out) {
    const dhsa_ruler_params *p = b->p;
    if (p->alpha != 0 && !(p->alpha > 1 && p->alpha < 10))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "RULER fwe: alpha %g is not in (1, 10)", p->alpha);
    int64_t V = p->length / 50 > 8 ? p->length / 50 : 8;
    b->words = malloc((size_t)V * sizeof(char *));
    b->counts = malloc((size_t)V * sizeof(int64_t));
    if (!b->words || !b->counts) return oom();
    for (int64_t k = 0; k < V; k++) {
        char *w = malloc(8);
        if (!add_owned(b, w)) return oom();
        int again;
        do { /* distinct coded words of the split */
            draw_letters(rs, 6, 0, (int)p->split, w);
            again = 0;
            for (int64_t j = 1; j < k && !again; j++) again = strcmp(b->words[j], w) == 0;
        } while (again);
        b->words[k] = k == 0 ? "...." : w; /* the most frequent is noise: dots */
    }
    b->n_words = V;
    for (int k = 1; k <= 3; k++) snprintf(out->expected[out->n_expected++], 48, "%s", b->words[k]);
    snprintf(b->pre, sizeof b->pre,
             "Read the coded text below and count how often each coded word occurs; you will be asked for the three "
             "most frequent coded words.");
    snprintf(b->question, sizeof b->question,
             "Question: Do not explain, and do not count the dots '....'. What are the three most frequent coded "
             "words in the text above?");
    snprintf(b->prefix, sizeof b->prefix, " Answer: The three most frequent coded words are:");
    return DHSA_OK;
}

/* The largest x in [lo, hi] whose prompt fits the length (lo must fit;
 * the token count grows with x): the number of whole units, or with tail
 * the words of the cut sentence after n whole units (left in b->tail). */
static dhsa_status most_that_fit(builder *b, int64_t lo, int64_t hi, int64_t n, int tail, int64_t *best) {
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2, k = 0;
        if (tail) b->tail = mid;
        char *text = compose(b, tail ? n : mid);
        if (!text) return oom();
        dhsa_status st = prompt_tokens(b, text, NULL, 0, &k);
        free(text);
        if (st) return st;
        if (k <= b->p->length) lo = mid;
        else hi = mid - 1;
    }
    if (tail) b->tail = lo;
    *best = lo;
    return DHSA_OK;
}

static void builder_free(builder *b) {
    for (int64_t i = 0; i < b->n_owned; i++) free(b->owned[i]);
    free(b->owned);
    free(b->unit);
    free(b->utok);
    free(b->words);
    free(b->counts);
}

/* The token of ids whose piece holds byte `at` of their concatenation
 * (off: each token's first byte, off[n] the end). */
static int64_t token_at(const int64_t *off, int64_t n, int64_t at) {
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (off[mid] <= at) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

static int word_char(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '-' || c == '_';
}

/* out->span_*: the needles found in order in the prompt's pieces (each
 * token detokenized alone, specials and leading spaces kept), and in each
 * needle sentence every whole-word occurrence of an expected string. A
 * needle whose text is not found (a template that rewrites text) adds
 * nothing; spans past DHSA_RULER_MAX_SPANS are dropped. */
static dhsa_status find_spans(const builder *b, dhsa_ruler_prompt *out) {
    const int64_t n = out->n_ids;
    int64_t *off = malloc((size_t)(n + 1) * sizeof(int64_t));
    size_t cap = (size_t)n * 8 + 64, len = 0;
    char *text = malloc(cap);
    if (!off || !text) {
        free(off);
        free(text);
        return oom();
    }
    for (int64_t i = 0; i < n; i++) {
        char piece[256];
        int64_t pl = 0;
        off[i] = (int64_t)len;
        if (dhsa_detokenize(b->tok, &out->ids[i], 1, DHSA_DETOKENIZE_SPECIAL | DHSA_DETOKENIZE_KEEP_SPACE, piece,
                            (int64_t)sizeof piece, &pl) != DHSA_OK || pl < 0 || pl > (int64_t)sizeof piece)
            pl = 0; /* a piece too long for the buffer: none of the values' tokens */
        if (len + (size_t)pl + 1 > cap) {
            size_t nc = 2 * cap + (size_t)pl;
            char *nt = realloc(text, nc);
            if (!nt) {
                free(off);
                free(text);
                return oom();
            }
            text = nt;
            cap = nc;
        }
        memcpy(text + len, piece, (size_t)pl);
        len += (size_t)pl;
    }
    off[n] = (int64_t)len;
    text[len] = 0;
    const char *cur = text;
    for (int i = 0; i < b->n_nd; i++) {
        const char *at = strstr(cur, b->nd[i].text);
        if (!at) continue;
        const char *end = at + strlen(b->nd[i].text);
        for (const char *x = at; x < end; x++)
            for (int k = 0; k < out->n_expected; k++) {
                size_t el = strlen(out->expected[k]);
                if (el == 0 || x + el > end || memcmp(x, out->expected[k], el) != 0) continue;
                if ((x > at && word_char(x[-1])) || (x + el < end && word_char(x[el]))) continue;
                if (out->n_spans == DHSA_RULER_MAX_SPANS) continue;
                int s = out->n_spans++;
                out->span_of[s] = k;
                out->span_lo[s] = token_at(off, n, (int64_t)(x - text));
                out->span_hi[s] = token_at(off, n, (int64_t)(x + el - 1 - text)) + 1;
            }
        cur = end;
    }
    free(off);
    free(text);
    return DHSA_OK;
}

dhsa_status dhsa_ruler_build(const dhsa_tokenizer *tok, const dhsa_ruler_params *p, dhsa_ruler_prompt *out) {
    if (out) memset(out, 0, sizeof *out);
    if (!tok || !p || !out) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_ruler_build: NULL argument");
    if (p->task < DHSA_RULER_SINGLE || p->task > DHSA_RULER_FWE)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_ruler_build: unknown task %d", (int)p->task);
    if (p->length < 64 || p->length > ((int64_t)1 << 24))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_ruler_build: length %lld is outside [64, 2^24]",
                          (long long)p->length);
    if (!(p->depth >= 0 && p->depth <= 1))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_ruler_build: depth %g is outside [0, 1]", p->depth);
    if (p->split != DHSA_RULER_DEV && p->split != DHSA_RULER_TEST)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_ruler_build: split %d is not DEV or TEST", (int)p->split);
    if ((unsigned)p->key_kind > DHSA_RULER_UUIDS || (unsigned)p->value_kind > DHSA_RULER_UUIDS ||
        (unsigned)p->haystack > DHSA_RULER_NEEDLES)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_ruler_build: unknown key, value or haystack kind");
    if (p->haystack == DHSA_RULER_NEEDLES && p->task != DHSA_RULER_MULTIKEY)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_ruler_build: a haystack of needles is for MULTIKEY only");
    if (p->haystack == DHSA_RULER_PROSE && (!p->prose || p->prose_len <= 0) && p->task != DHSA_RULER_CWE &&
        p->task != DHSA_RULER_FWE)
        return dhsa__fail(DHSA_ERR_INVALID_ARG,
                          "dhsa_ruler_build: a prose haystack needs params.prose (dhsa_ruler_load_prose)");
    builder b;
    memset(&b, 0, sizeof b);
    b.tok = tok;
    b.p = p;
    b.flags = dhsa_tokenizer_default_flags(tok) & DHSA_TOKENIZE_ADD_BOS;
    const int words_task = p->task == DHSA_RULER_CWE || p->task == DHSA_RULER_FWE;
    uint64_t rs = p->seed * 0x2545F4914F6CDD1Dull + (uint64_t)p->task * 131u + (uint64_t)p->split;
    char *prose = NULL, **sent = NULL, *text = NULL;
    dhsa_status st = dhsa__answer_stop_ids(tok, p->tmpl, out->stop, &out->n_stop);
    if (st) goto done;
    /* the haystack's units: at most one a token */
    if (!words_task) {
        b.n_cap = p->length;
        b.unit = malloc((size_t)b.n_cap * sizeof(char *));
        b.utok = malloc((size_t)b.n_cap * sizeof(int64_t));
        if (!b.unit || !b.utok) {
            st = oom();
            goto done;
        }
        b.sep = p->haystack == DHSA_RULER_PROSE ? " " : "\n";
        if (p->haystack == DHSA_RULER_NOISE) {
            const char *const *ns = p->split == DHSA_RULER_DEV ? noise_dev : noise_test;
            int64_t nn = (int64_t)(sizeof noise_dev / sizeof noise_dev[0]);
            for (int64_t i = 0; i < b.n_cap; i++) b.unit[i] = ns[i % nn];
        } else if (p->haystack == DHSA_RULER_PROSE) {
            prose = malloc((size_t)p->prose_len + 1);
            if (!prose) {
                st = oom();
                goto done;
            }
            memcpy(prose, p->prose, (size_t)p->prose_len);
            prose[p->prose_len] = 0;
            int64_t n_sent = dhsa__split_sentences(prose, p->prose_len, &sent);
            if (n_sent < 0) {
                st = oom();
                goto done;
            }
            if (n_sent < 1) {
                st = dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_ruler_build: the prose has no sentences");
                goto done;
            }
            /* a seeded start; the text is cycled when the length needs more */
            int64_t s0 = (int64_t)(splitmix(&rs) % (uint64_t)n_sent);
            for (int64_t i = 0; i < b.n_cap; i++) b.unit[i] = sent[(s0 + i) % n_sent];
        }
    }
    switch (p->task) {
    case DHSA_RULER_VT: st = setup_vt(&b, &rs, out); break;
    case DHSA_RULER_CWE: st = setup_cwe(&b, out); break;
    case DHSA_RULER_FWE: st = setup_fwe(&b, &rs, out); break;
    default: st = setup_niah(&b, &rs, out); break;
    }
    if (st) goto done;
    qsort(b.nd, (size_t)b.n_nd, sizeof b.nd[0], cmp_needle);
    /* the units' token counts, and an upper bound on how many can fit */
    int64_t hi;
    if (!words_task) {
        int64_t sum = 0;
        hi = b.n_cap;
        for (int64_t i = 0; i < b.n_cap; i++) {
            b.utok[i] = i >= 5 && p->haystack == DHSA_RULER_NOISE ? b.utok[i % 5] : count_text(tok, b.unit[i]);
            sum += b.utok[i];
            if (sum > p->length) {
                hi = i + 1;
                break;
            }
        }
    } else if (p->task == DHSA_RULER_CWE) {
        hi = b.n_words - b.counts[2];
        int64_t cap_items = p->length / b.counts[1] + 1; /* every item is at least a token */
        if (hi > cap_items) hi = cap_items;
    } else {
        hi = 2 * p->length;
    }
    /* the most units that fit: prompt_tokens grows with n */
    int64_t lo = 0, n_tok = 0;
    text = compose(&b, 0);
    if (!text) {
        st = oom();
        goto done;
    }
    st = prompt_tokens(&b, text, NULL, 0, &n_tok);
    if (st) goto done;
    if (n_tok > p->length) {
        st = dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_ruler_build: the task's text without a haystack is %lld tokens, "
                        "more than the length %lld", (long long)n_tok, (long long)p->length);
        goto done;
    }
    st = most_that_fit(&b, 0, hi, 0, 0, &lo);
    if (st) goto done;
    if (p->haystack == DHSA_RULER_PROSE && !words_task && lo < b.n_cap) {
        /* then the most words of the next sentence that fit */
        int64_t words_next = 0, w;
        for (const char *s = b.unit[lo]; *s; s++) words_next += *s == ' ';
        st = most_that_fit(&b, 0, words_next, lo, 1, &w);
        if (st) goto done;
    }
    free(text);
    text = compose(&b, lo);
    if (!text) {
        st = oom();
        goto done;
    }
    st = prompt_tokens(&b, text, NULL, 0, &n_tok);
    if (st) goto done;
    if (p->task == DHSA_RULER_CWE && lo == b.n_words - b.counts[2] && n_tok < p->length - p->length / 16) {
        st = dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_ruler_build: the word list's %lld words of the split fill only "
                        "%lld of %lld tokens", (long long)b.n_words, (long long)n_tok, (long long)p->length);
        goto done;
    }
    out->ids = malloc((size_t)(n_tok + 1) * sizeof(int32_t));
    if (!out->ids) {
        st = oom();
        goto done;
    }
    st = prompt_tokens(&b, text, out->ids, n_tok + 1, &out->n_ids);
    if (st) goto done;
    if (!words_task && (st = find_spans(&b, out))) goto done;
    out->n_units = lo;
    out->answer_tokens = p->task == DHSA_RULER_VT ? 30 : p->task == DHSA_RULER_CWE ? 120
                         : p->task == DHSA_RULER_FWE ? 50 : 128;
    out->depth_used = -1;
    if (!words_task) {
        int64_t before = 0, all = 0;
        for (int i = 0; i < b.n_nd; i++)
            if (b.nd[i].primary)
                for (int64_t u = 0; u < b.nd[i].at; u++) before += b.utok[u];
        for (int64_t u = 0; u < lo; u++) all += b.utok[u];
        out->depth_used = all > 0 ? (double)before / (double)all : 0;
    }
    if (p->tmpl == DHSA_CHAT_NONE) { /* the whole prompt's text */
        dhsa__text t = {0};
        dhsa__text_add(&t, text);
        dhsa__text_add(&t, b.prefix);
        if (t.bad) {
            st = oom();
            goto done;
        }
        free(text);
        text = t.p;
    }
    out->text = text;
    text = NULL;
done:
    free(text);
    free(sent);
    free(prose);
    builder_free(&b);
    if (st) {
        free(out->ids);
        free(out->text);
        memset(out, 0, sizeof *out);
    }
    return st;
}
