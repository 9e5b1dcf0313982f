/* pretokenize.c: the pre-tokenizers of byte-level BPE vocabularies, the
 * regex sets of llama.cpp's llm_tokenizer_bpe, and the tokenizer.ggml.pre
 * names that select them.
 *
 * A text is decoded to code points (dhsa_tok__bpe_decode, as llama.cpp
 * does), each classed (letter, number, space, other: the Unicode tables of
 * unicode_tables.c, generated), then split by each regex of the set in
 * turn; the words go to the BPE merges (src/model/tokenizer.c).
 *
 * Contract: src/model/tokenizer.h (dhsa_tok__pretokenize,
 * dhsa_tok__pre_lookup, dhsa_tok__pre_name); errors are values. Tests:
 * tests/test_tokenizer.c (every pre-tokenizer against its regex's peer
 * splits, the names against llama.cpp's list); docs/tokenizer.md.
 */
#include "core/internal.h"
#include "dhsa.h"
#include "model/tokenizer.h"
#include "model/unicode_tables.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OOM() dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "tokenizer: out of memory")

/* --------------------------------------------------------------------- */
/* Character classes: letter, number, space, other for every code point
 * (\p{L} and \p{N} from the generated tables of unicode_tables.c, \s as
 * llama.cpp has it), and the classes single regexes name. */

/* deepseek-llm's letter class (the Lu/Ll/Lt letters its tokenizer.json lists, copied
 * as code points, not glyphs: several have look-alikes): 84 ranges, sorted. */
static const uint32_t ds_letter[][2] = {
    {0x41, 0x5A}, {0x61, 0x7A}, {0xB5, 0xB5}, {0xC0, 0xD6}, {0xD8, 0xF6}, {0xF8, 0x1BA}, {0x1BC, 0x1BF},
    {0x1C4, 0x293}, {0x295, 0x2AF}, {0x370, 0x373}, {0x376, 0x377}, {0x37B, 0x37D}, {0x37F, 0x37F},
    {0x386, 0x386}, {0x388, 0x38A}, {0x38C, 0x38C}, {0x38E, 0x3A1}, {0x3A3, 0x3F5}, {0x3F7, 0x481},
    {0x48A, 0x52F}, {0x531, 0x556}, {0x10A0, 0x10C5}, {0x13A0, 0x13F5}, {0x13F8, 0x13FD}, {0x1C90, 0x1CBA},
    {0x1CBD, 0x1CBF}, {0x1D00, 0x1D2B}, {0x1D6B, 0x1D77}, {0x1D79, 0x1D9A}, {0x1E00, 0x1F15}, {0x1F18, 0x1F1D},
    {0x1F20, 0x1F45}, {0x1F48, 0x1F4D}, {0x1F50, 0x1F57}, {0x1F59, 0x1F59}, {0x1F5B, 0x1F5B}, {0x1F5D, 0x1F5D},
    {0x1F5F, 0x1F7D}, {0x1F80, 0x1FB4}, {0x1FB6, 0x1FBC}, {0x1FBE, 0x1FBE}, {0x1FC2, 0x1FC4}, {0x1FC6, 0x1FCC},
    {0x1FD0, 0x1FD3}, {0x1FD6, 0x1FDB}, {0x1FE0, 0x1FEC}, {0x1FF2, 0x1FF4}, {0x1FF6, 0x1FFC}, {0x2102, 0x2102},
    {0x2107, 0x2107}, {0x210A, 0x2113}, {0x2115, 0x2115}, {0x2119, 0x211D}, {0x2124, 0x2124}, {0x2126, 0x2126},
    {0x2128, 0x2128}, {0x212A, 0x212D}, {0x212F, 0x2134}, {0x2139, 0x2139}, {0x213C, 0x213F}, {0x2145, 0x2149},
    {0x214E, 0x214E}, {0x2183, 0x2184}, {0x2C00, 0x2C7B}, {0x2C7E, 0x2CE4}, {0x2CEB, 0x2CEE}, {0x2CF2, 0x2CF3},
    {0xA640, 0xA66D}, {0xA680, 0xA69B}, {0xA722, 0xA76F}, {0xA771, 0xA787}, {0xA78B, 0xA78E}, {0xAB70, 0xABBF},
    {0xFB00, 0xFB06}, {0xFB13, 0xFB17}, {0xFF21, 0xFF3A}, {0xFF41, 0xFF5A}, {0x10400, 0x1044F},
    {0x104B0, 0x104D3}, {0x104D8, 0x104FB}, {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF},
    {0x1E900, 0x1E943},
};

static int in_ranges(const uint32_t (*r)[2], size_t n, uint32_t cp) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp < r[mid][0]) hi = mid;
        else if (cp > r[mid][1]) lo = mid + 1;
        else return 1;
    }
    return 0;
}

enum { CAT_OTHER = 0, CAT_LETTER = 1, CAT_NUMBER = 2, CAT_SPACE = 3 };

/* \s as the published regexes (and llama.cpp) use it. */
static int is_space_cp(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

static int cp_category(uint32_t cp) {
    if (cp < 0x80) {
        if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return CAT_LETTER;
        if (cp >= '0' && cp <= '9') return CAT_NUMBER;
        return is_space_cp(cp) ? CAT_SPACE : CAT_OTHER;
    }
    if (is_space_cp(cp)) return CAT_SPACE;
    if (in_ranges(dhsa__uni_letter, dhsa__uni_letter_n, cp)) return CAT_LETTER;
    if (in_ranges(dhsa__uni_number, dhsa__uni_number_n, cp)) return CAT_NUMBER;
    return CAT_OTHER;
}

/* --------------------------------------------------------------------- */
/* The names: tokenizer.ggml.pre -> a list of regexes                     */

/* Every tokenizer.ggml.pre name llama.cpp's loader knows (src/llama-vocab.cpp,
 * llama_vocab::impl::load, llama-cpp-python 0.3.36's vendored copy), in its
 * order, with the regex set it selects and the flags it sets. A set dhsa
 * has not written is NONE with the reason: those names are refused by name
 * (docs/tokenizer.md). */
#define IGN DHSA_TOK_PRE_IGNORE_MERGES
#define BOS DHSA_TOK_PRE_ADD_BOS
typedef struct {
    const char *name;
    dhsa_tok_pre pre;
    unsigned flags;
    const char *why; /* NONE: what the set needs */
} pre_entry;
static const char WHY_MARKS[] = "its regexes use \\p{M} or \\p{S} in rules dhsa has not written";
static const char WHY_SPM_BPE[] = "it is a SentencePiece-style BPE over raw UTF-8 (no byte mapping)";
static const pre_entry pre_table[] = {
    {"default", DHSA_TOK_PRE_DEFAULT, 0, NULL},
    {"minicpm5", DHSA_TOK_PRE_MINICPM5, IGN, NULL},
    {"llama3", DHSA_TOK_PRE_LLAMA3, IGN | BOS, NULL},
    {"llama-v3", DHSA_TOK_PRE_LLAMA3, IGN | BOS, NULL},
    {"llama-bpe", DHSA_TOK_PRE_LLAMA3, IGN | BOS, NULL},
    {"falcon3", DHSA_TOK_PRE_LLAMA3, IGN | BOS, NULL},
    {"falcon-h1", DHSA_TOK_PRE_LLAMA3, IGN | BOS, NULL},
    {"pixtral", DHSA_TOK_PRE_LLAMA3, IGN | BOS, NULL},
    {"midm-2.0", DHSA_TOK_PRE_LLAMA3, IGN | BOS, NULL},
    {"lfm2", DHSA_TOK_PRE_LLAMA3, IGN | BOS, NULL},
    {"jina-v5-nano", DHSA_TOK_PRE_LLAMA3, IGN | BOS, NULL},
    {"deepseek-llm", DHSA_TOK_PRE_DEEPSEEK_LLM, 0, NULL},
    {"deepseek-coder", DHSA_TOK_PRE_DEEPSEEK_CODER, 0, NULL},
    {"deepseek-v3", DHSA_TOK_PRE_NONE, 0, WHY_MARKS},
    {"spark2_5", DHSA_TOK_PRE_NONE, 0, WHY_MARKS},
    {"youtu", DHSA_TOK_PRE_NONE, 0, WHY_MARKS},
    {"falcon", DHSA_TOK_PRE_FALCON, 0, NULL},
    {"mpt", DHSA_TOK_PRE_GPT2, 0, NULL},
    {"starcoder", DHSA_TOK_PRE_STARCODER, 0, NULL},
    {"gpt-2", DHSA_TOK_PRE_GPT2, 0, NULL},
    {"phi-2", DHSA_TOK_PRE_GPT2, 0, NULL},
    {"jina-es", DHSA_TOK_PRE_GPT2, 0, NULL},
    {"jina-de", DHSA_TOK_PRE_GPT2, 0, NULL},
    {"gigachat", DHSA_TOK_PRE_GPT2, 0, NULL},
    {"jina-v2-es", DHSA_TOK_PRE_GPT2, 0, NULL},
    {"jina-v2-de", DHSA_TOK_PRE_GPT2, 0, NULL},
    {"a.x-4.0", DHSA_TOK_PRE_GPT2, 0, NULL},
    {"mellum", DHSA_TOK_PRE_GPT2, 0, NULL},
    {"modern-bert", DHSA_TOK_PRE_GPT2, 0, NULL},
    {"jais-2", DHSA_TOK_PRE_JAIS2, 0, NULL},
    {"gemma4", DHSA_TOK_PRE_NONE, 0, WHY_SPM_BPE},
    {"granite-embed-multi-311m", DHSA_TOK_PRE_NONE, 0, WHY_SPM_BPE},
    {"sarvam-moe", DHSA_TOK_PRE_NONE, 0, WHY_SPM_BPE},
    {"jina-v1-en", DHSA_TOK_PRE_NONE, 0, "it adds a SEP token after the text (a BERT-style encoder vocabulary)"},
    {"jina-v2-code", DHSA_TOK_PRE_NONE, 0, "it adds a SEP token after the text (a BERT-style encoder vocabulary)"},
    {"roberta-bpe", DHSA_TOK_PRE_NONE, 0, "it adds a SEP token after the text (a BERT-style encoder vocabulary)"},
    {"whitespace", DHSA_TOK_PRE_NONE, 0, "it splits on whitespace over raw UTF-8 (no byte mapping)"},
    {"refact", DHSA_TOK_PRE_STARCODER, 0, NULL},
    {"command-r", DHSA_TOK_PRE_STARCODER, 0, NULL},
    {"qwen2", DHSA_TOK_PRE_QWEN2, 0, NULL},
    {"deepseek-r1-qwen", DHSA_TOK_PRE_QWEN2, 0, NULL},
    {"kormo", DHSA_TOK_PRE_QWEN2, 0, NULL},
    {"f2llmv2", DHSA_TOK_PRE_QWEN2, 0, NULL},
    {"qwen35", DHSA_TOK_PRE_QWEN35, 0, NULL},
    {"stablelm2", DHSA_TOK_PRE_QWEN2, 0, NULL},
    {"olmo", DHSA_TOK_PRE_GPT2, 0, NULL},
    {"dbrx", DHSA_TOK_PRE_LLAMA3, 0, NULL},
    {"smaug-bpe", DHSA_TOK_PRE_LLAMA3, 0, NULL},
    {"poro-chat", DHSA_TOK_PRE_BLOOM, 0, NULL},
    {"chatglm-bpe", DHSA_TOK_PRE_LLAMA3, 0, NULL},
    {"glm4", DHSA_TOK_PRE_LLAMA3, IGN, NULL},
    {"glm5", DHSA_TOK_PRE_LLAMA3, IGN, NULL},
    {"viking", DHSA_TOK_PRE_VIKING, 0, NULL},
    {"jais", DHSA_TOK_PRE_GPT2, 0, NULL},
    {"tekken", DHSA_TOK_PRE_TEKKEN, IGN | BOS, NULL},
    {"smollm", DHSA_TOK_PRE_STARCODER, 0, NULL},
    {"codeshell", DHSA_TOK_PRE_STARCODER, 0, NULL},
    {"bloom", DHSA_TOK_PRE_BLOOM, 0, NULL},
    {"gpt3-finnish", DHSA_TOK_PRE_BLOOM, 0, NULL},
    {"exaone", DHSA_TOK_PRE_STARCODER, 0, NULL},
    {"exaone4", DHSA_TOK_PRE_GPT2, 0, NULL},
    {"exaone-moe", DHSA_TOK_PRE_NONE, 0, WHY_MARKS},
    {"chameleon", DHSA_TOK_PRE_NONE, 0, "its regexes cut image and sentinel tokens out of the text"},
    {"minerva-7b", DHSA_TOK_PRE_STARCODER, 0, NULL},
    {"megrez", DHSA_TOK_PRE_QWEN2, 0, NULL},
    {"gpt-4o", DHSA_TOK_PRE_GPT4O, 0, NULL},
    {"llama4", DHSA_TOK_PRE_GPT4O, 0, NULL},
    {"kanana2", DHSA_TOK_PRE_GPT4O, 0, NULL},
    {"talkie", DHSA_TOK_PRE_GPT4O, 0, NULL},
    {"granite-embed-multi-97m", DHSA_TOK_PRE_GRANITE_MULTI, IGN, NULL},
    {"tiny_aya", DHSA_TOK_PRE_NONE, 0, WHY_MARKS},
    {"cohere2moe", DHSA_TOK_PRE_NONE, 0, WHY_MARKS},
    {"superbpe", DHSA_TOK_PRE_NONE, 0, "its second regex is an empty-match lookahead ((?=(\\d{3})+(?!\\d)))"},
    {"trillion", DHSA_TOK_PRE_GPT2, 0, NULL},
    {"granite-docling", DHSA_TOK_PRE_GPT2, 0, NULL},
    {"bailingmoe", DHSA_TOK_PRE_QWEN2, 0, NULL},
    {"bailingmoe2", DHSA_TOK_PRE_QWEN2, 0, NULL},
    {"llada-moe", DHSA_TOK_PRE_QWEN2, 0, NULL},
    {"seed-coder", DHSA_TOK_PRE_SEED_CODER, 0, NULL},
    {"hunyuan", DHSA_TOK_PRE_QWEN2, 0, NULL},
    {"hunyuan-dense", DHSA_TOK_PRE_NONE, 0, WHY_MARKS},
    {"hy_v4", DHSA_TOK_PRE_NONE, 0, WHY_MARKS},
    {"joyai-llm", DHSA_TOK_PRE_NONE, 0, WHY_MARKS},
    {"kimi-k2", DHSA_TOK_PRE_NONE, 0, "its Han-script rules are a hand-written splitter in llama.cpp, not a regex"},
    {"ufakzeka", DHSA_TOK_PRE_UFAKZEKA, 0, NULL},
    {"grok-2", DHSA_TOK_PRE_QWEN2, 0, NULL},
    {"afmoe", DHSA_TOK_PRE_NONE, 0, WHY_MARKS},
    {"laguna", DHSA_TOK_PRE_LAGUNA, 0, NULL},
    {"minimax-m2", DHSA_TOK_PRE_GPT4O, 0, NULL},
    {"solar-open", DHSA_TOK_PRE_QWEN2, 0, NULL},
    {"mellum2", DHSA_TOK_PRE_STARCODER, 0, NULL},
};
#undef IGN
#undef BOS
#define N_PRE (sizeof pre_table / sizeof pre_table[0])

const char *dhsa_tok__pre_name(size_t i) { return i < N_PRE ? pre_table[i].name : NULL; }

int dhsa_tok__pre_lookup(const char *name, dhsa_tok_pre *pre, unsigned *flags, const char **why) {
    *pre = DHSA_TOK_PRE_NONE;
    *flags = 0;
    *why = "llama.cpp does not know it either";
    for (size_t i = 0; i < N_PRE; i++)
        if (strcmp(name, pre_table[i].name) == 0) {
            *pre = pre_table[i].pre;
            *flags = pre_table[i].flags;
            *why = pre_table[i].why;
            return 1;
        }
    return 0;
}

void dhsa_tok__pre_supported_names(char *buf, size_t cap) {
    size_t k = 0;
    buf[0] = 0;
    for (size_t i = 0; i < N_PRE && k + 1 < cap; i++) {
        if (pre_table[i].pre == DHSA_TOK_PRE_NONE) continue;
        int w = snprintf(buf + k, cap - k, "%s%s", k ? ", " : "", pre_table[i].name);
        if (w < 0 || (size_t)w >= cap - k) break;
        k += (size_t)w;
    }
}

/* --------------------------------------------------------------------- */
/* Pre-tokenizers. llama.cpp runs a list of regexes in turn: each one splits
 * every piece the previous one left, its matches becoming pieces and so the
 * text between two matches (leftmost-first, as std::regex searches). Here
 * each regex is a hand-written matcher, stage_fn: the length (in code
 * points) of its match at i, looking no further than the piece end n; 0 for
 * no match at i; -k when no match can start in [i, i + k) (so long runs are
 * skipped in one step and every stage stays linear). The GPT-2 and Llama 3
 * regexes cover all text (every position starts a word): their stages never
 * return 0. */

typedef int64_t (*stage_fn)(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n);

static int64_t run_of(const uint8_t *cat, int64_t i, int64_t n, int c) {
    while (i < n && cat[i] == c) i++;
    return i;
}

static int is_crlf(uint32_t c) { return c == '\r' || c == '\n'; }

/* 's|'t|'re|'ve|'m|'ll|'d, optionally case-insensitive. */
static int64_t contraction(const uint32_t *cp, int64_t i, int64_t n, int icase) {
    if (cp[i] != '\'' || i + 1 >= n) return 0;
    uint32_t a = cp[i + 1], b = i + 2 < n ? cp[i + 2] : 0;
    if (icase) {
        if (a < 128) a = (uint32_t)(a | 0x20);
        if (b < 128 && b) b = (uint32_t)(b | 0x20);
    }
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

/* \s+(?!\S)|\s+ at a whitespace character. */
static int64_t trailing_space(const uint8_t *cat, int64_t i, int64_t n) {
    int64_t k = run_of(cat, i, n, CAT_SPACE);
    if (k < n && k - i >= 2) return k - 1 - i;
    return k - i;
}

/* GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static int64_t stage_gpt2(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    int64_t m = contraction(cp, i, n, 0);
    if (m) return m;
    int64_t j = cp[i] == ' ' && i + 1 < n ? i + 1 : i;
    if (cat[j] == CAT_LETTER || cat[j] == CAT_NUMBER || cat[j] == CAT_OTHER) {
        if (j > i || cat[i] != CAT_SPACE) return run_of(cat, j, n, cat[j]) - i;
    }
    return trailing_space(cat, i, n);
}

/* The Llama 3 family: one regex of alternatives, tried in order at i,
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)       when contractions
 *   [^\r\n\p{L}\p{N}]?\p{L}+           (cased: the two rules below)
 *   \p{N}{1,max_digits}
 *    ?[^\s\p{L}\p{N}]+[\r\n]*          ([\r\n]* only when punct_newlines)
 *   \s*[\r\n]+
 *   \s+(?!\S)|\s+                      (jais2: \s{512}(?!\S)|...|\s{1,2}(?!\S)|\s{1})
 * Cased (gpt-4o, tekken): [^\r\n\p{L}\p{N}]?U*L+C?|[^\r\n\p{L}\p{N}]?U+L*C?
 * where U is a letter that is not a-z, L a letter that is not A-Z (a
 * letter above ASCII is both: llama.cpp's rewrite of \p{Lu}/\p{Ll} into
 * ASCII look-aheads) and C an optional contraction (gpt-4o). */
typedef struct {
    int contractions;     /* the contraction alternative comes first */
    int64_t max_digits;   /* \p{N}{1,max_digits} */
    int punct_newlines;   /* [\r\n]* after a punctuation run */
    int cased;            /* 1: gpt-4o's cased letter rules, 2: the same with no contraction suffix (tekken) */
    int jais_ws;          /* jais2's whitespace runs */
    int marks;            /* \p{M} joins \p{L} (qwen35: [\p{L}\p{M}]+, and no mark in punctuation runs;
                           * granite-embed-multi: the cased runs' look-aheads take marks) */
} l3_opts;

static int is_mark_cp(uint32_t c) {
    return c >= 0x300 && in_ranges(dhsa__uni_mark, dhsa__uni_mark_n, c);
}

static int is_upper_ascii(uint32_t c) { return c >= 'A' && c <= 'Z'; }
static int is_lower_ascii(uint32_t c) { return c >= 'a' && c <= 'z'; }

/* A letter, or with marks a letter or a combining mark. */
static int letter_like(const uint32_t *cp, const uint8_t *cat, int64_t i, int marks) {
    return cat[i] == CAT_LETTER || (marks && cat[i] == CAT_OTHER && is_mark_cp(cp[i]));
}

/* U*L+ (alt 1) or U+L* (alt 2) from j; the end, or -1. */
static int64_t cased_run(const uint32_t *cp, const uint8_t *cat, int64_t j, int64_t n, int alt, int marks) {
    int64_t u = j;
    while (u < n && letter_like(cp, cat, u, marks) && !is_lower_ascii(cp[u])) u++;
    if (alt == 2) {
        if (u == j) return -1;
    } else {
        /* U* gives back letters until L+ can start: the first L at or
         * before u, looking back from u (a letter above ASCII is both) */
        for (;; u--) {
            if (u < n && letter_like(cp, cat, u, marks) && !is_upper_ascii(cp[u])) break;
            if (u == j) return -1;
        }
    }
    while (u < n && letter_like(cp, cat, u, marks) && !is_upper_ascii(cp[u])) u++;
    return u;
}

static int64_t match_l3(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n, const l3_opts *o) {
    int64_t m;
    if (o->contractions && (m = contraction(cp, i, n, 1))) return m;
    int here = letter_like(cp, cat, i, o->marks);
    int prefix = !here && cat[i] != CAT_NUMBER && !is_crlf(cp[i]) && i + 1 < n && letter_like(cp, cat, i + 1, o->marks);
    if (o->cased) {
        int64_t e = -1;
        for (int alt = 1; alt <= 2 && e < 0; alt++) {
            if (prefix) e = cased_run(cp, cat, i + 1, n, alt, o->marks);
            if (e < 0 && here) e = cased_run(cp, cat, i, n, alt, o->marks);
        }
        if (e >= 0) {
            if (o->cased == 1 && (m = contraction(cp, e, n, 1))) e += m;
            return e - i;
        }
    } else if (here || prefix) {
        int64_t k = prefix ? i + 1 : i;
        while (k < n && letter_like(cp, cat, k, o->marks)) k++;
        return k - i;
    }
    if (cat[i] == CAT_NUMBER) {
        int64_t k = run_of(cat, i, n, CAT_NUMBER) - i;
        return k < o->max_digits ? k : o->max_digits;
    }
    int64_t j = cp[i] == ' ' && i + 1 < n ? i + 1 : i;
    if (cat[j] == CAT_OTHER && !(o->marks && !o->cased && is_mark_cp(cp[j]))) {
        int64_t k = j;
        while (k < n && cat[k] == CAT_OTHER && !(o->marks && !o->cased && is_mark_cp(cp[k]))) k++;
        if (o->punct_newlines)
            while (k < n && is_crlf(cp[k])) k++;
        return k - i;
    }
    /* cat[i] is whitespace here */
    int64_t k = run_of(cat, i, n, CAT_SPACE), last_nl = -1;
    for (int64_t x = i; x < k; x++)
        if (is_crlf(cp[x])) last_nl = x;
    if (last_nl >= 0) return last_nl + 1 - i;
    if (o->jais_ws) {
        /* \s{N}(?!\S) for N = 512, 256, ..., 4, then \s{1,2}(?!\S), \s{1} */
        int64_t r = k - i;
        for (int64_t len = 512; len >= 4; len /= 2)
            if (r > len || (r == len && k == n)) return len;
        if (r > 2 || (r == 2 && k == n)) return 2;
        return 1;
    }
    return trailing_space(cat, i, n);
}

static const l3_opts l3_llama3 = {1, 3, 1, 0, 0, 0}, l3_qwen2 = {1, 1, 1, 0, 0, 0}, l3_ufakzeka = {0, 1, 1, 0, 0, 0},
                     l3_minicpm5 = {1, INT64_MAX, 1, 0, 0, 0}, l3_seed_coder = {1, 1, 0, 0, 0, 0},
                     l3_jais2 = {1, 3, 1, 0, 1, 0}, l3_gpt4o = {0, 3, 1, 1, 0, 0}, l3_tekken = {0, 1, 1, 2, 0, 0},
                     l3_qwen35 = {1, 1, 1, 0, 0, 1}, l3_granite_multi = {0, 3, 1, 1, 0, 1};

static int64_t stage_llama3(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    return match_l3(cp, cat, i, n, &l3_llama3);
}
static int64_t stage_qwen2(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    return match_l3(cp, cat, i, n, &l3_qwen2);
}
static int64_t stage_ufakzeka(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    return match_l3(cp, cat, i, n, &l3_ufakzeka);
}
static int64_t stage_minicpm5(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    return match_l3(cp, cat, i, n, &l3_minicpm5);
}
static int64_t stage_seed_coder(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    return match_l3(cp, cat, i, n, &l3_seed_coder);
}
static int64_t stage_jais2(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    return match_l3(cp, cat, i, n, &l3_jais2);
}
static int64_t stage_gpt4o(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    return match_l3(cp, cat, i, n, &l3_gpt4o);
}
static int64_t stage_qwen35(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    return match_l3(cp, cat, i, n, &l3_qwen35);
}
static int64_t stage_granite_multi(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    return match_l3(cp, cat, i, n, &l3_granite_multi);
}
static int64_t stage_tekken(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    return match_l3(cp, cat, i, n, &l3_tekken);
}

/* \p{N}{1,3} alone (minicpm5's first regex). */
static int64_t stage_digits3(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    (void)cp;
    int64_t k = run_of(cat, i, n, CAT_NUMBER) - i;
    return k < 3 ? k : 3;
}

/* [^\n]+|[\n]+ (laguna's first regex): runs of newlines and of the rest. */
static int64_t stage_newline_runs(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    (void)cat;
    int64_t k = i;
    int nl = cp[i] == '\n';
    while (k < n && (cp[k] == '\n') == nl) k++;
    return k - i;
}

/* bloom:  ?[^(\s|.,!?…。，、।۔،)]+ (a character class, parentheses and bar included) */
static int bloom_word_char(uint32_t c) {
    if (is_space_cp(c)) return 0;
    switch (c) {
    case '(': case '|': case '.': case ',': case '!': case '?': case ')':
    case 0x2026: case 0x3002: case 0xFF0C: case 0x3001: case 0x0964: case 0x06D4: case 0x060C: return 0;
    default: return 1;
    }
}

static int64_t stage_bloom(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    (void)cat;
    int64_t j = cp[i] == ' ' && i + 1 < n && bloom_word_char(cp[i + 1]) ? i + 1 : i;
    if (!bloom_word_char(cp[j])) return 0;
    while (j < n && bloom_word_char(cp[j])) j++;
    return j - i;
}

/* \p{N}: each number character alone (starcoder). */
static int64_t stage_digit(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    (void)cp;
    (void)n;
    return cat[i] == CAT_NUMBER;
}

/* \p{N}+ (deepseek-llm's last regex). */
static int64_t stage_numbers(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    (void)cp;
    return run_of(cat, i, n, CAT_NUMBER) - i;
}

/* A class test for code points; whitespace never belongs to a class here:
 * llama.cpp hands a regex without \p{..} to std::wregex after replacing
 * every non-ASCII whitespace character by 0x0B, so only \s can match it. */
typedef int (*class_fn)(uint32_t c);

/* \s?[class]+, where the class holds no whitespace. */
static int64_t space_opt_run(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n, class_fn in) {
    int64_t j = i;
    if (cat[i] == CAT_SPACE) {
        if (i + 1 >= n || cat[i + 1] == CAT_SPACE || !in(cp[i + 1])) return 0;
        j = i + 1;
    } else if (!in(cp[i])) {
        return 0;
    }
    while (j < n && cat[j] != CAT_SPACE && in(cp[j])) j++;
    return j - i;
}

/* ---- falcon: [\p{P}\$\+<=>\^~\|`]+, then GPT-2, then [0-9][0-9][0-9] */

/* \p{P} or $+<=>^~|`: every ASCII punctuation or symbol character, and the
 * Unicode punctuation (not the symbols) above ASCII. */
static int falcon_punct(uint32_t c) {
    if (c < 0x80) return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
                          (c >= 0x7B && c <= 0x7E);
    return !is_space_cp(c) && in_ranges(dhsa__uni_punct, dhsa__uni_punct_n, c);
}

static int64_t stage_falcon_punct(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    (void)cat;
    int64_t j = i;
    while (j < n && falcon_punct(cp[j])) j++;
    return j - i;
}

/* "default": [\p{P}\$\+<=>\^~\|]+, falcon's class without the backtick. */
static int default_punct(uint32_t c) { return c != '`' && falcon_punct(c); }

static int64_t stage_default_punct(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    (void)cat;
    int64_t j = i;
    while (j < n && default_punct(cp[j])) j++;
    return j - i;
}

/* ---- deepseek-coder: [\r\n], \s?\p{L}+, \s?\p{P}+, [CJK]+, \p{N} */

static int is_letter_cp(uint32_t c) { return cp_category(c) == CAT_LETTER; }

/* \p{P} as llama.cpp matches it: the ASCII punctuation !-#%-*,-/:;?@[-]_{}
 * (not the symbols $+<=>^`|~) and Unicode punctuation above ASCII. */
static int is_punct_cp(uint32_t c) {
    if (c < 0x80) return c != '$' && c != '+' && c != '<' && c != '=' && c != '>' && c != '^' && c != '`' &&
                         c != '|' && c != '~' && falcon_punct(c);
    return falcon_punct(c);
}

static int64_t stage_space_letters(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    return space_opt_run(cp, cat, i, n, is_letter_cp);
}

static int64_t stage_space_punct(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    return space_opt_run(cp, cat, i, n, is_punct_cp);
}

static int64_t stage_three_digits(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    (void)cat;
    for (int64_t k = 0; k < 3; k++)
        if (i + k >= n || cp[i + k] < '0' || cp[i + k] > '9') return 0;
    return 3;
}

/* ---- deepseek-llm: [\r\n], \s?[letters]+, \s?[punctuation]+, \s+$,
 * [CJK]+, \p{N}+ (the classes are literal lists in its tokenizer.json) */

static int64_t stage_newline(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    (void)cat;
    (void)n;
    return is_crlf(cp[i]);
}

static int ds_is_letter(uint32_t c) {
    if (c < 0x80) return (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
    return in_ranges(ds_letter, sizeof ds_letter / sizeof ds_letter[0], c);
}

static int64_t stage_ds_letters(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    return space_opt_run(cp, cat, i, n, ds_is_letter);
}

/* [!-/:-~！-／：-～‘-‟　-。]: note :-~ holds the ASCII letters too (the
 * letters stage has isolated them already) and U+3000 is whitespace. */
static int ds_is_punct(uint32_t c) {
    return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x7E) || (c >= 0xFF01 && c <= 0xFF0F) ||
           (c >= 0xFF1A && c <= 0xFF5E) || (c >= 0x2018 && c <= 0x201F) || (c >= 0x3001 && c <= 0x3002);
}

static int64_t stage_ds_punct(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    return space_opt_run(cp, cat, i, n, ds_is_punct);
}

/* \s+$: the whitespace run at the end of the piece. */
static int64_t stage_trailing_ws(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    (void)cp;
    if (cat[i] != CAT_SPACE) return 0;
    int64_t k = run_of(cat, i, n, CAT_SPACE);
    return k == n ? k - i : -(k - i); /* no match starts inside an inner run */
}

/* [一-龥ࠀ-一가-퟿]: U+4E00-9FA5, U+0800-4E00, U+AC00-D7FF. */
static int ds_is_cjk(uint32_t c) {
    return (c >= 0x800 && c <= 0x9FA5) || (c >= 0xAC00 && c <= 0xD7FF);
}

static int64_t stage_ds_cjk(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    int64_t j = i;
    while (j < n && cat[j] != CAT_SPACE && ds_is_cjk(cp[j])) j++;
    return j - i;
}

/* The regexes of each pre-tokenizer, in order (NULL-terminated). */
static const stage_fn *pre_stages(dhsa_tok_pre pre) {
    static const stage_fn gpt2[] = {stage_gpt2, NULL};
    static const stage_fn starcoder[] = {stage_digit, stage_gpt2, NULL};
    static const stage_fn llama3[] = {stage_llama3, NULL};
    static const stage_fn qwen2[] = {stage_qwen2, NULL};
    static const stage_fn deepseek[] = {stage_newline, stage_ds_letters, stage_ds_punct, stage_trailing_ws,
                                        stage_ds_cjk,  stage_numbers,    NULL};
    static const stage_fn falcon[] = {stage_falcon_punct, stage_gpt2, stage_three_digits, NULL};
    static const stage_fn deflt[] = {stage_default_punct, stage_gpt2, stage_numbers, stage_three_digits, NULL};
    static const stage_fn ds_coder[] = {stage_newline, stage_space_letters, stage_space_punct, stage_ds_cjk,
                                        stage_digit, NULL};
    static const stage_fn bloom[] = {stage_bloom, NULL};
    static const stage_fn viking[] = {stage_bloom, stage_digit, NULL};
    static const stage_fn ufakzeka[] = {stage_ufakzeka, NULL};
    static const stage_fn minicpm5[] = {stage_digits3, stage_minicpm5, NULL};
    static const stage_fn seed_coder[] = {stage_seed_coder, NULL};
    static const stage_fn laguna[] = {stage_newline_runs, stage_qwen2, NULL};
    static const stage_fn jais2[] = {stage_jais2, NULL};
    static const stage_fn gpt4o[] = {stage_gpt4o, NULL};
    static const stage_fn tekken[] = {stage_tekken, NULL};
    static const stage_fn qwen35[] = {stage_qwen35, NULL};
    static const stage_fn granite_multi[] = {stage_granite_multi, NULL};
    switch (pre) {
    case DHSA_TOK_PRE_STARCODER: return starcoder;
    case DHSA_TOK_PRE_LLAMA3: return llama3;
    case DHSA_TOK_PRE_QWEN2: return qwen2;
    case DHSA_TOK_PRE_DEEPSEEK_LLM: return deepseek;
    case DHSA_TOK_PRE_FALCON: return falcon;
    case DHSA_TOK_PRE_DEFAULT: return deflt;
    case DHSA_TOK_PRE_DEEPSEEK_CODER: return ds_coder;
    case DHSA_TOK_PRE_BLOOM: return bloom;
    case DHSA_TOK_PRE_VIKING: return viking;
    case DHSA_TOK_PRE_UFAKZEKA: return ufakzeka;
    case DHSA_TOK_PRE_MINICPM5: return minicpm5;
    case DHSA_TOK_PRE_SEED_CODER: return seed_coder;
    case DHSA_TOK_PRE_LAGUNA: return laguna;
    case DHSA_TOK_PRE_JAIS2: return jais2;
    case DHSA_TOK_PRE_GPT4O: return gpt4o;
    case DHSA_TOK_PRE_TEKKEN: return tekken;
    case DHSA_TOK_PRE_QWEN35: return qwen35;
    case DHSA_TOK_PRE_GRANITE_MULTI: return granite_multi;
    default: return gpt2;
    }
}

/* One regex over every piece: in[0..n_in) are piece ends (code points);
 * writes the new ends to out (at most one per code point); returns their
 * count. */
static int64_t split_pieces(stage_fn f, const uint32_t *cp, const uint8_t *cat, const int64_t *in, int64_t n_in,
                            int64_t *out) {
    int64_t n_out = 0;
    for (int64_t p = 0, start = 0; p < n_in; start = in[p++]) {
        int64_t end = in[p], gap = start;
        for (int64_t i = start; i < end;) {
            int64_t m = f(cp, cat, i, end);
            if (m <= 0) {
                i += m < 0 ? -m : 1;
                continue;
            }
            if (i > gap) out[n_out++] = i;
            i += m;
            out[n_out++] = i;
            gap = i;
        }
        if (gap < end) out[n_out++] = end;
    }
    return n_out;
}

void dhsa_tok__pre_scratch_free(dhsa_tok_pre_scratch *s) {
    free(s->cp);
    free(s->cp_off);
    free(s->cat);
    free(s->piece[0]);
    free(s->piece[1]);
}

dhsa_status dhsa_tok__pretokenize(dhsa_tok_pre pre, const char *text, int64_t len, int64_t *ends, int64_t cap,
                                  int64_t *n_words, dhsa_tok_pre_scratch *scratch) {
    dhsa_tok_pre_scratch *w = scratch;
    dhsa_tok_pre_scratch local = {0};
    if (!w) w = &local;
    if (len + 1 > w->cap) {
        int64_t c = len + 1 + (len + 1) / 2;
        uint32_t *a = realloc(w->cp, sizeof *a * (size_t)c);
        if (a) w->cp = a;
        int64_t *b = realloc(w->cp_off, sizeof *b * (size_t)c);
        if (b) w->cp_off = b;
        uint8_t *d = realloc(w->cat, (size_t)c);
        if (d) w->cat = d;
        int64_t *e = realloc(w->piece[0], sizeof *e * (size_t)c);
        if (e) w->piece[0] = e;
        int64_t *f = realloc(w->piece[1], sizeof *f * (size_t)c);
        if (f) w->piece[1] = f;
        if (!a || !b || !d || !e || !f) {
            if (w == &local) dhsa_tok__pre_scratch_free(&local);
            return OOM();
        }
        w->cap = c;
    }
    int64_t n = 0;
    for (int64_t i = 0; i < len;) {
        int64_t k;
        uint32_t c = dhsa_tok__bpe_decode((const uint8_t *)text + i, len - i, &k);
        w->cp[n] = c;
        w->cat[n] = (uint8_t)cp_category(c);
        w->cp_off[n++] = i;
        i += k;
    }
    w->cp_off[n] = len;
    /* pieces ping-pong between the two buffers, one regex at a time */
    int64_t *cur = w->piece[0], *next = w->piece[1], n_cur = 0;
    if (n > 0) cur[n_cur++] = n;
    for (const stage_fn *s = pre_stages(pre); *s; s++) {
        n_cur = split_pieces(*s, w->cp, w->cat, cur, n_cur, next);
        int64_t *t = cur;
        cur = next;
        next = t;
    }
    for (int64_t i = 0; i < n_cur && i < cap; i++) ends[i] = w->cp_off[cur[i]];
    *n_words = n_cur;
    if (w == &local) dhsa_tok__pre_scratch_free(&local);
    return DHSA_OK;
}
