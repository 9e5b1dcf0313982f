/* tokenizer.c: tokenizers built from GGUF metadata (tokenizer.ggml.*).
 *
 *   - "llama" (SentencePiece style, DHSA_TOKENIZER_SPM): spaces become
 *     U+2581 '▁', a '▁' is prepended when add_space_prefix, then adjacent
 *     symbols (UTF-8 characters at first) are merged greedily, always the
 *     pair whose concatenation is a vocab token of the highest score
 *     (ties: leftmost); a final symbol that is not a token becomes its
 *     bytes' <0xXX> tokens (or unk).
 *   - "gpt2" (byte-level BPE, DHSA_TOKENIZER_BPE): the text is split into
 *     words by the pre-tokenizer named by tokenizer.ggml.pre
 *     (src/model/pretokenize.c: hand-written matchers of the published
 *     regexes, run as a list where llama.cpp has several), each word's
 *     bytes are mapped to printable code points (the GPT-2 byte-to-unicode
 *     table), and adjacent symbols are merged by the lowest merge rank
 *     (ties: leftmost).
 *   - Both merge in one loop (merge_symbols), a heap of adjacent pairs
 *     keyed by score or rank; only the pair function and the fallback for
 *     a symbol no token covers (emit_symbols) differ.
 *   - Both: USER_DEFINED tokens (and CONTROL tokens with
 *     DHSA_TOKENIZE_PARSE_SPECIAL) are cut out of the text first, longest
 *     match at the leftmost position.
 *
 * Contract: the API is the "Tokenizer" block of include/dhsa.h; errors are
 * values with a sentence, never an abort; sizes are checked before they
 * are allocated. Tests: tests/test_tokenizer.c (every vector of
 * ../shared/vocab, round trips, malformed input); docs/tokenizer.md.
 */
#include "model/tokenizer.h"
#include "core/internal.h"
#include "core/procmem.h"
#include "dhsa.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* --------------------------------------------------------------------- */
/* UTF-8                                                                  */

/* Strict UTF-8 decode of one code point at s[0..left): *n = bytes used.
 * An invalid or truncated sequence decodes as one byte, code point
 * 0xFFFD (category OTHER), so every byte lands in exactly one word. */
static uint32_t utf8_decode(const uint8_t *s, int64_t left, int64_t *n) {
    uint8_t b = s[0];
    *n = 1;
    if (b < 0x80) return b;
    int len = b >= 0xF0 && b <= 0xF4 ? 4 : b >= 0xE0 ? 3 : b >= 0xC2 && b < 0xE0 ? 2 : 0;
    if (len == 0 || len > left || (len == 4 && b > 0xF4)) return 0xFFFD;
    uint32_t cp = b & (0x7F >> len);
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0xFFFD;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0xFFFD;
    *n = len;
    return cp;
}

/* Bytes of the character at s: its UTF-8 length when valid, else 1. (llama.cpp
 * trusts the lead byte, so an invalid lead byte swallows the '▁' of a
 * following space and the round trip loses it; strict splitting keeps it:
 * the two agree on valid UTF-8.) */
static int64_t spm_char_len(const char *s, int64_t left) {
    int64_t n;
    (void)utf8_decode((const uint8_t *)s, left, &n);
    return n;
}

static int utf8_encode(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* --------------------------------------------------------------------- */
/* String table: (text, len) -> index, open addressing                    */

typedef struct {
    const char *arena;
    const int64_t *off; /* (n,) start of string i in arena */
    const int32_t *len; /* (n,) */
    int64_t n;
    int32_t *slots; /* (mask+1,) index+1, 0 = empty */
    uint64_t mask;
} strtab;

static uint64_t hash_bytes(const char *s, int64_t n) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (int64_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

/* last_wins: a duplicate string maps to its last index (the token map of
 * llama.cpp) or to its first (merge ranks). */
static dhsa_status strtab_build(strtab *st, int last_wins) {
    uint64_t cap = 16;
    while (cap < (uint64_t)st->n * 2) cap <<= 1;
    st->slots = calloc(cap, sizeof *st->slots);
    if (!st->slots) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "tokenizer: out of memory for a %llu-slot table",
                                      (unsigned long long)cap);
    st->mask = cap - 1;
    for (int64_t i = 0; i < st->n; i++) {
        const char *s = st->arena + st->off[i];
        uint64_t h = hash_bytes(s, st->len[i]) & st->mask;
        for (;; h = (h + 1) & st->mask) {
            int32_t k = st->slots[h];
            if (k == 0) {
                st->slots[h] = (int32_t)(i + 1);
                break;
            }
            if (st->len[k - 1] == st->len[i] && memcmp(st->arena + st->off[k - 1], s, (size_t)st->len[i]) == 0) {
                if (last_wins) st->slots[h] = (int32_t)(i + 1);
                break;
            }
        }
    }
    return DHSA_OK;
}

static int32_t strtab_find(const strtab *st, const char *s, int64_t n) {
    if (!st->slots) return -1;
    for (uint64_t h = hash_bytes(s, n) & st->mask;; h = (h + 1) & st->mask) {
        int32_t k = st->slots[h];
        if (k == 0) return -1;
        if (st->len[k - 1] == n && memcmp(st->arena + st->off[k - 1], s, (size_t)n) == 0) return k - 1;
    }
}

/* --------------------------------------------------------------------- */
/* The tokenizer                                                          */

struct dhsa_tokenizer {
    dhsa_tokenizer_kind kind;
    dhsa_tok_pre pre;
    unsigned pre_flags; /* DHSA_TOK_PRE_IGNORE_MERGES, ... */
    int64_t n_vocab;
    char *tok_arena;  /* all token texts, each NUL-terminated */
    int64_t *tok_off; /* (n_vocab,) */
    int32_t *tok_len; /* (n_vocab,) */
    float *scores;    /* (n_vocab,) SPM merge priority; 0 when absent */
    uint8_t *types;   /* (n_vocab,) dhsa_token_type */
    strtab tokens;
    /* BPE merges "left right", rank = index */
    char *merge_arena;
    int64_t *merge_off;
    int32_t *merge_len;
    strtab merges;
    int32_t bos, eos, unk;
    int add_bos, add_eos, add_space_prefix;
    int32_t byte_tok[256]; /* SPM: id of <0xXX>, -1 when absent */
    uint8_t cp_to_byte[512]; /* BPE: inverse byte-to-unicode map (cp < 512) */
    uint8_t cp_is_byte[512];
    uint16_t byte_to_cp[256];
    uint8_t *attr; /* (n_vocab,) ATTR_* bits: the type, then the rules of llama.cpp (docs/tokenizer.md) */
    /* Special tokens (attr CONTROL, USER_DEFINED or UNKNOWN, text not
     * empty), in the order they are cut out of a text: longest first, ties
     * by id; and the same tokens in byte order of their texts (indices into
     * specials), to find which of them a text holds. */
    int32_t *specials;   /* (n_specials,) ids */
    int32_t *special_lex; /* (n_specials,) */
    int64_t n_specials;
};

/* Token attributes: what llama.cpp calls llama_token_attr (its bit values
 * are not stored anywhere, so these are dhsa's own). */
enum {
    ATTR_UNKNOWN = 1,
    ATTR_UNUSED = 2,
    ATTR_NORMAL = 4,
    ATTR_CONTROL = 8,
    ATTR_USER_DEFINED = 16,
    ATTR_BYTE = 32,
    ATTR_LSTRIP = 64, /* cutting the token out also drops the whitespace before it */
    ATTR_RSTRIP = 128 /* ... and after it */
};
#define ATTR_SPECIAL (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN) /* cut out before the model's algorithm */
#define ATTR_PARSE_ONLY (ATTR_CONTROL | ATTR_UNKNOWN) /* ... only with DHSA_TOKENIZE_PARSE_SPECIAL */

static void gpt2_byte_map(dhsa_tokenizer *t) {
    /* Printable bytes map to themselves; the rest to 256, 257, ... */
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        uint16_t cp = (uint16_t)(printable ? b : 256 + n++);
        t->byte_to_cp[b] = cp;
        t->cp_to_byte[cp] = (uint8_t)b;
        t->cp_is_byte[cp] = 1;
    }
}

void dhsa_tokenizer_free(dhsa_tokenizer *t) {
    if (!t) return;
    free(t->tok_arena);
    free(t->tok_off);
    free(t->tok_len);
    free(t->scores);
    free(t->types);
    free(t->attr);
    free(t->tokens.slots);
    free(t->merge_arena);
    free(t->merge_off);
    free(t->merge_len);
    free(t->merges.slots);
    free(t->specials);
    free(t->special_lex);
    free(t);
}

/* Copies n GGUF strings into one arena (NUL after each). */
static dhsa_status copy_strings(const dhsa_gguf_str *src, int64_t n, const char *key, char **arena, int64_t **off,
                                int32_t **len) {
    uint64_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        if (src[i].len < 0 || src[i].len > DHSA_TOKENIZER_MAX_TOKEN_BYTES)
            return dhsa__fail(DHSA_ERR_TOO_LARGE, "tokenizer: %s[%lld] is %lld bytes long (limit %d)", key,
                              (long long)i, (long long)src[i].len, DHSA_TOKENIZER_MAX_TOKEN_BYTES);
        total += (uint64_t)src[i].len + 1;
    }
    *arena = malloc(total ? total : 1);
    *off = malloc(sizeof **off * (size_t)(n ? n : 1));
    *len = malloc(sizeof **len * (size_t)(n ? n : 1));
    if (!*arena || !*off || !*len)
        return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "tokenizer: out of memory copying %s", key);
    uint64_t pos = 0;
    for (int64_t i = 0; i < n; i++) {
        (*off)[i] = (int64_t)pos;
        (*len)[i] = (int32_t)src[i].len;
        if (src[i].len) memcpy(*arena + pos, src[i].str, (size_t)src[i].len);
        (*arena)[pos + (uint64_t)src[i].len] = 0;
        pos += (uint64_t)src[i].len + 1;
    }
    return DHSA_OK;
}

/* An optional id key: absent -> def; a value outside the vocab -> -1
 * (files write 0xFFFFFFFF for "none"). */
static dhsa_status opt_id(const dhsa_gguf *g, const char *key, int64_t n_vocab, int32_t def, int32_t *out) {
    *out = def;
    if (dhsa_gguf_find_kv(g, key) < 0) return DHSA_OK;
    int64_t v;
    uint64_t u;
    if (dhsa_gguf_get_i64(g, key, &v) == DHSA_OK) {
        *out = v >= 0 && v < n_vocab ? (int32_t)v : -1;
        return DHSA_OK;
    }
    if (dhsa_gguf_get_u64(g, key, &u) == DHSA_OK) {
        *out = u < (uint64_t)n_vocab ? (int32_t)u : -1;
        return DHSA_OK;
    }
    return dhsa__fail(DHSA_ERR_FORMAT, "tokenizer: %s is not an integer", key);
}

static dhsa_status opt_bool(const dhsa_gguf *g, const char *key, int def, int *out) {
    *out = def;
    if (dhsa_gguf_find_kv(g, key) < 0) return DHSA_OK;
    return dhsa_gguf_get_bool(g, key, out);
}

dhsa_status dhsa_tok__set_pre(dhsa_tokenizer *t, const char *pre, int file_sets_add_bos) {
    const char *why = NULL;
    dhsa_tok_pre kind;
    unsigned flags;
    int known = dhsa_tok__pre_lookup(pre, &kind, &flags, &why);
    if (kind == DHSA_TOK_PRE_NONE) {
        char runs[1024];
        dhsa_tok__pre_supported_names(runs, sizeof runs);
        return dhsa__fail(DHSA_ERR_UNSUPPORTED,
                          "tokenizer: pre-tokenizer tokenizer.ggml.pre = '%s' is not implemented (%s%s); dhsa runs: %s",
                          dhsa__esc(pre), known ? "llama.cpp knows it: " : "", why, runs);
    }
    t->pre = kind;
    t->pre_flags = flags;
    /* llama.cpp: llama-bpe and tekken vocabularies add BOS unless the file says no */
    if ((flags & DHSA_TOK_PRE_ADD_BOS) && !file_sets_add_bos) t->add_bos = 1;
    return DHSA_OK;
}

/* --------------------------------------------------------------------- */
/* Token attributes: the file's types, then llama.cpp's rules by token text
 * and model name (llama_vocab::impl::load in its src/llama-vocab.cpp; the
 * lists of texts below are those it has). docs/tokenizer.md says why each
 * matters. */

static uint8_t attr_of_type(uint8_t type) {
    switch (type) {
    case DHSA_TOKEN_NORMAL: return ATTR_NORMAL;
    case DHSA_TOKEN_UNKNOWN: return ATTR_UNKNOWN;
    case DHSA_TOKEN_CONTROL: return ATTR_CONTROL;
    case DHSA_TOKEN_USER_DEFINED: return ATTR_USER_DEFINED;
    case DHSA_TOKEN_UNUSED: return ATTR_UNUSED;
    case DHSA_TOKEN_BYTE: return ATTR_BYTE;
    default: return 0;
    }
}

/* Texts that end a generation in some model family: llama.cpp makes each
 * one a CONTROL token whatever the file says (phi-3's "</s>" is
 * USER_DEFINED in its file), so plain text never turns into them. */
static const char *const eog_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\xEF\xBD\x9C" "end\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>", "[e~[", NULL};

/* Fill-in-the-middle texts, each kind with the keys that name its id: when
 * the file names none, llama.cpp finds the token by text and makes it
 * CONTROL. */
typedef struct {
    const char *keys[2];
    const char *texts[9];
} fim_kind;
static const fim_kind fim_kinds[] = {
    {{"tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id"},
     {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "begin\xEF\xBD\x9C>", "<PRE>",
      "\xE2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>", NULL}},
    {{"tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id"},
     {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "hole\xEF\xBD\x9C>", "<SUF>",
      "\xE2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>", NULL}},
    {{"tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id"},
     {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "end\xEF\xBD\x9C>", "<MID>",
      "\xE2\x96\x81<MID>", "<|code_middle|>", "<|middle|>", NULL}},
    {{"tokenizer.ggml.fim_pad_token_id", NULL}, {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", NULL}},
    {{"tokenizer.ggml.fim_rep_token_id", NULL},
     {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", NULL}},
    {{"tokenizer.ggml.fim_sep_token_id", NULL}, {"<|file_sep|>", NULL}},
};

static int32_t find_text(const dhsa_tokenizer *t, const char *text) {
    return strtab_find(&t->tokens, text, (int64_t)strlen(text));
}

static void attr_set(dhsa_tokenizer *t, const char *text, uint8_t bits, int on) {
    int32_t id = find_text(t, text);
    if (id < 0) return; /* llama.cpp refuses the file here (phi-3 without "</s>"); dhsa goes on */
    t->attr[id] = (uint8_t)(on ? t->attr[id] | bits : t->attr[id] & ~bits);
}

/* An id key that names a token of the vocabulary (as llama.cpp reads it). */
static int has_valid_id(const dhsa_gguf *g, const char *key, int64_t n_vocab) {
    int64_t v;
    uint64_t u;
    if (!key || dhsa_gguf_find_kv(g, key) < 0) return 0;
    if (dhsa_gguf_get_i64(g, key, &v) == DHSA_OK) return v >= 0 && v < n_vocab;
    if (dhsa_gguf_get_u64(g, key, &u) == DHSA_OK) return u < (uint64_t)n_vocab;
    return 0;
}

static const char *opt_string(const dhsa_gguf *g, const char *key) {
    const char *v = NULL;
    if (dhsa_gguf_find_kv(g, key) < 0 || dhsa_gguf_get_str(g, key, &v, NULL) != DHSA_OK) return "";
    return v;
}

/* Case-insensitive (ASCII) substring test, as llama.cpp lowercases
 * general.name before it looks for a family in it. */
static int contains_icase(const char *s, const char *lower) {
    size_t m = strlen(lower);
    for (; *s; s++) {
        size_t k = 0;
        while (k < m && s[k] && (char)(s[k] >= 'A' && s[k] <= 'Z' ? s[k] + 32 : s[k]) == lower[k]) k++;
        if (k == m) return 1;
    }
    return 0;
}

/* In llama.cpp's order: control-looking texts become CONTROL; gpt-oss's
 * channel markers are USER_DEFINED only; harmony's and solar-open's <|end|>
 * is not an end of generation (USER_DEFINED) when <|return|>/<|call|> or
 * <|calls|>/<|flush|> are; a gemma4 or plamo </s> is NORMAL. */
static void apply_text_rules(dhsa_tokenizer *t, const dhsa_gguf *g) {
    for (const fim_kind *f = fim_kinds; f < fim_kinds + sizeof fim_kinds / sizeof fim_kinds[0]; f++) {
        if (has_valid_id(g, f->keys[0], t->n_vocab) || has_valid_id(g, f->keys[1], t->n_vocab)) continue;
        for (const char *const *x = f->texts; *x; x++) attr_set(t, *x, ATTR_CONTROL, 1);
    }
    for (const char *const *x = eog_texts; *x; x++) attr_set(t, *x, ATTR_CONTROL, 1);
    static const char *const gpt_oss[] = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>", NULL};
    for (const char *const *x = gpt_oss; *x; x++) {
        int32_t id = find_text(t, *x);
        if (id >= 0) t->attr[id] = ATTR_USER_DEFINED;
    }
    int has_call = find_text(t, "<|call|>") >= 0 || find_text(t, "<|calls|>") >= 0;
    int32_t end = find_text(t, "<|end|>");
    if (end >= 0 && has_call && (find_text(t, "<|return|>") >= 0 || find_text(t, "<|flush|>") >= 0))
        t->attr[end] = ATTR_USER_DEFINED;
    /* "<|plamo:eos|>" ends a generation only as the file's EOS */
    int32_t plamo = find_text(t, "<|plamo:eos|>"), s_end = find_text(t, "</s>");
    if (s_end >= 0 && (find_text(t, "<|tool_response>") >= 0 || (plamo >= 0 && plamo == t->eos)))
        t->attr[s_end] = ATTR_NORMAL;
}

/* Per-token strip rules, set after the special tokens are known: phi-3
 * (general.name) strips the whitespace after every special token but
 * <unk>, <s> and <|endoftext|>; a few BERT-like vocabularies strip it
 * before their mask token. */
static void apply_strip_rules(dhsa_tokenizer *t, const dhsa_gguf *g) {
    const char *name = opt_string(g, "general.name"), *arch = opt_string(g, "general.architecture");
    const char *pre = opt_string(g, "tokenizer.ggml.pre");
    if (strstr(pre, "jina-v2-de") || strstr(pre, "jina-v2-es") || strstr(pre, "jina-v2-code") ||
        strstr(arch, "nomic-bert-moe") || strstr(arch, "jina-bert-v3")) {
        attr_set(t, "<mask>", ATTR_LSTRIP, 1);
    } else if (contains_icase(name, "phi-3") || contains_icase(name, "phi3")) {
        for (int64_t k = 0; k < t->n_specials; k++) t->attr[t->specials[k]] |= ATTR_RSTRIP;
        attr_set(t, "</s>", ATTR_RSTRIP, 1);
        static const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>", NULL};
        for (const char *const *x = keep; *x; x++) attr_set(t, *x, ATTR_RSTRIP, 0);
    } else if (contains_icase(name, "modern-bert")) {
        attr_set(t, "[MASK]", ATTR_LSTRIP, 1);
    }
}

/* Sort keys that carry what their comparison needs (qsort has no context). */
typedef struct {
    const char *text;
    int32_t len, id, index;
} special_key;

static int special_priority(const void *pa, const void *pb) { /* longest first, ties by id */
    const special_key *a = pa, *b = pb;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

static int special_bytes(const void *pa, const void *pb) { /* byte order, a prefix first */
    const special_key *a = pa, *b = pb;
    int c = memcmp(a->text, b->text, (size_t)(a->len < b->len ? a->len : b->len));
    if (c) return c;
    if (a->len != b->len) return a->len < b->len ? -1 : 1;
    return (a->index > b->index) - (a->index < b->index);
}

/* Builds specials (cut-out order) and special_lex (byte order). */
static dhsa_status build_specials(dhsa_tokenizer *t) {
    int64_t ns = 0;
    for (int64_t i = 0; i < t->n_vocab; i++) ns += (t->attr[i] & ATTR_SPECIAL) && t->tok_len[i] > 0;
    special_key *keys = malloc(sizeof *keys * (size_t)(ns ? ns : 1));
    t->specials = malloc(sizeof *t->specials * (size_t)(ns ? ns : 1));
    t->special_lex = malloc(sizeof *t->special_lex * (size_t)(ns ? ns : 1));
    if (!keys || !t->specials || !t->special_lex) {
        free(keys);
        return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    }
    ns = 0;
    for (int64_t i = 0; i < t->n_vocab; i++)
        if ((t->attr[i] & ATTR_SPECIAL) && t->tok_len[i] > 0)
            keys[ns++] = (special_key){t->tok_arena + t->tok_off[i], t->tok_len[i], (int32_t)i, 0};
    qsort(keys, (size_t)ns, sizeof *keys, special_priority);
    for (int64_t k = 0; k < ns; k++) {
        t->specials[k] = keys[k].id;
        keys[k].index = (int32_t)k;
    }
    qsort(keys, (size_t)ns, sizeof *keys, special_bytes);
    for (int64_t k = 0; k < ns; k++) t->special_lex[k] = keys[k].index;
    t->n_specials = ns;
    free(keys);
    return DHSA_OK;
}

dhsa_status dhsa_tokenizer_from_gguf(const dhsa_gguf *g, dhsa_tokenizer **out) {
    if (!out) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_tokenizer_from_gguf: out is NULL");
    *out = NULL;
    if (!g) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_tokenizer_from_gguf: g is NULL");
    const char *model;
    dhsa_status st = dhsa_gguf_get_str(g, "tokenizer.ggml.model", &model, NULL);
    if (st) return st;
    dhsa_tokenizer_kind kind;
    if (strcmp(model, "llama") == 0) kind = DHSA_TOKENIZER_SPM;
    else if (strcmp(model, "gpt2") == 0) kind = DHSA_TOKENIZER_BPE;
    else
        return dhsa__fail(DHSA_ERR_UNSUPPORTED,
                          "tokenizer: tokenizer.ggml.model is '%s'; dhsa knows 'llama' (SentencePiece) and "
                          "'gpt2' (byte-level BPE)",
                          dhsa__esc(model));
    dhsa_gguf_array toks;
    if ((st = dhsa_gguf_get_arr(g, "tokenizer.ggml.tokens", &toks))) return st;
    if (toks.type != DHSA_GGUF_STRING || toks.n < 1)
        return dhsa__fail(DHSA_ERR_FORMAT, "tokenizer: tokenizer.ggml.tokens must be a non-empty array of strings");
    if (toks.n > DHSA_TOKENIZER_MAX_VOCAB)
        return dhsa__fail(DHSA_ERR_TOO_LARGE, "tokenizer: %lld tokens (limit %d)", (long long)toks.n,
                          DHSA_TOKENIZER_MAX_VOCAB);
    dhsa_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    t->kind = kind;
    t->n_vocab = toks.n;
    int64_t n = toks.n;
    if ((st = copy_strings(toks.data, n, "tokenizer.ggml.tokens", &t->tok_arena, &t->tok_off, &t->tok_len))) goto fail;
    t->scores = calloc((size_t)n, sizeof *t->scores);
    t->types = malloc((size_t)n);
    if (!t->scores || !t->types) {
        st = dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
        goto fail;
    }
    memset(t->types, DHSA_TOKEN_NORMAL, (size_t)n);
    if (dhsa_gguf_find_kv(g, "tokenizer.ggml.scores") >= 0) {
        dhsa_gguf_array a;
        if ((st = dhsa_gguf_get_arr(g, "tokenizer.ggml.scores", &a))) goto fail;
        if (a.n != n || (a.type != DHSA_GGUF_FLOAT32 && a.type != DHSA_GGUF_FLOAT64)) {
            st = dhsa__fail(DHSA_ERR_FORMAT, "tokenizer: tokenizer.ggml.scores must be %lld floats (has %lld %s)",
                            (long long)n, (long long)a.n, dhsa_gguf_type_name(a.type));
            goto fail;
        }
        for (int64_t i = 0; i < n; i++)
            t->scores[i] = a.type == DHSA_GGUF_FLOAT32 ? ((const float *)a.data)[i] : (float)((const double *)a.data)[i];
    } else if (kind == DHSA_TOKENIZER_SPM) {
        st = dhsa__fail(DHSA_ERR_FORMAT, "tokenizer: a 'llama' vocabulary needs tokenizer.ggml.scores");
        goto fail;
    }
    if (dhsa_gguf_find_kv(g, "tokenizer.ggml.token_type") >= 0) {
        dhsa_gguf_array a;
        if ((st = dhsa_gguf_get_arr(g, "tokenizer.ggml.token_type", &a))) goto fail;
        if (a.n != n || (a.type != DHSA_GGUF_INT32 && a.type != DHSA_GGUF_UINT32)) {
            st = dhsa__fail(DHSA_ERR_FORMAT, "tokenizer: tokenizer.ggml.token_type must be %lld INT32 (has %lld %s)",
                            (long long)n, (long long)a.n, dhsa_gguf_type_name(a.type));
            goto fail;
        }
        for (int64_t i = 0; i < n; i++) {
            int32_t v = ((const int32_t *)a.data)[i];
            t->types[i] = (uint8_t)(v >= DHSA_TOKEN_NORMAL && v <= DHSA_TOKEN_BYTE ? v : DHSA_TOKEN_NORMAL);
        }
    }
    t->tokens = (strtab){t->tok_arena, t->tok_off, t->tok_len, n, NULL, 0};
    if ((st = strtab_build(&t->tokens, 1))) goto fail;

    int spm = kind == DHSA_TOKENIZER_SPM;
    if ((st = opt_id(g, "tokenizer.ggml.bos_token_id", n, spm ? 1 : -1, &t->bos))) goto fail;
    if ((st = opt_id(g, "tokenizer.ggml.eos_token_id", n, spm ? 2 : -1, &t->eos))) goto fail;
    if ((st = opt_id(g, "tokenizer.ggml.unknown_token_id", n, spm ? 0 : -1, &t->unk))) goto fail;
    if ((st = opt_bool(g, "tokenizer.ggml.add_bos_token", spm, &t->add_bos))) goto fail;
    if ((st = opt_bool(g, "tokenizer.ggml.add_eos_token", 0, &t->add_eos))) goto fail;
    if ((st = opt_bool(g, "tokenizer.ggml.add_space_prefix", spm, &t->add_space_prefix))) goto fail;

    if (spm) {
        for (int b = 0; b < 256; b++) {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", b);
            t->byte_tok[b] = strtab_find(&t->tokens, name, 6);
        }
    } else {
        const char *pre = "default";
        if (dhsa_gguf_find_kv(g, "tokenizer.ggml.pre") >= 0 &&
            (st = dhsa_gguf_get_str(g, "tokenizer.ggml.pre", &pre, NULL)))
            goto fail;
        if ((st = dhsa_tok__set_pre(t, pre, dhsa_gguf_find_kv(g, "tokenizer.ggml.add_bos_token") >= 0))) goto fail;
        dhsa_gguf_array m;
        if ((st = dhsa_gguf_get_arr(g, "tokenizer.ggml.merges", &m))) goto fail;
        if (m.type != DHSA_GGUF_STRING) {
            st = dhsa__fail(DHSA_ERR_FORMAT, "tokenizer: tokenizer.ggml.merges must be an array of strings");
            goto fail;
        }
        if (m.n > DHSA_TOKENIZER_MAX_VOCAB) {
            st = dhsa__fail(DHSA_ERR_TOO_LARGE, "tokenizer: %lld merges (limit %d)", (long long)m.n,
                            DHSA_TOKENIZER_MAX_VOCAB);
            goto fail;
        }
        if ((st = copy_strings(m.data, m.n, "tokenizer.ggml.merges", &t->merge_arena, &t->merge_off,
                               &t->merge_len)))
            goto fail;
        t->merges = (strtab){t->merge_arena, t->merge_off, t->merge_len, m.n, NULL, 0};
        if ((st = strtab_build(&t->merges, 0))) goto fail;
        gpt2_byte_map(t);
    }

    /* Attributes, then the special tokens, then the strip rules (which
     * llama.cpp sets on the special tokens once it knows them). */
    t->attr = malloc((size_t)n);
    if (!t->attr) {
        st = dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
        goto fail;
    }
    for (int64_t i = 0; i < n; i++) t->attr[i] = attr_of_type(t->types[i]);
    apply_text_rules(t, g);
    if ((st = build_specials(t))) goto fail;
    apply_strip_rules(t, g);
    *out = t;
    return DHSA_OK;
fail:
    dhsa_tokenizer_free(t);
    return st;
}

/* The bytes of one string table's arena, offsets, lengths and slots. */
static size_t strtab_heap(const strtab *st) {
    size_t n = st->n > 0 ? (size_t)st->n : 1;
    size_t arena = st->n > 0 ? (size_t)st->off[st->n - 1] + (size_t)st->len[st->n - 1] + 1 : 1;
    return dhsa__heap_block(arena) + dhsa__heap_block(n * sizeof *st->off) + dhsa__heap_block(n * sizeof *st->len) +
           (st->slots ? dhsa__heap_block((size_t)(st->mask + 1) * sizeof *st->slots) : 0);
}

size_t dhsa__tokenizer_heap_bytes(const dhsa_tokenizer *t) {
    if (!t) return 0;
    size_t n = t->n_vocab > 0 ? (size_t)t->n_vocab : 1, ns = t->n_specials > 0 ? (size_t)t->n_specials : 1;
    return dhsa__heap_block(sizeof *t) + strtab_heap(&t->tokens) + dhsa__heap_block(n * sizeof *t->scores) +
           2 * dhsa__heap_block(n) + (t->merge_arena ? strtab_heap(&t->merges) : 0) +
           2 * dhsa__heap_block(ns * sizeof *t->specials);
}

dhsa_tokenizer_kind dhsa_tokenizer_kind_of(const dhsa_tokenizer *t) { return t->kind; }
int64_t dhsa_tokenizer_n_vocab(const dhsa_tokenizer *t) { return t->n_vocab; }
int32_t dhsa_tokenizer_bos(const dhsa_tokenizer *t) { return t->bos; }
int32_t dhsa_tokenizer_eos(const dhsa_tokenizer *t) { return t->eos; }
int32_t dhsa_tokenizer_unk(const dhsa_tokenizer *t) { return t->unk; }
unsigned dhsa_tokenizer_default_flags(const dhsa_tokenizer *t) {
    return (t->add_bos ? DHSA_TOKENIZE_ADD_BOS : 0u) | (t->add_eos ? DHSA_TOKENIZE_ADD_EOS : 0u);
}
const char *dhsa_tokenizer_text(const dhsa_tokenizer *t, int32_t id, int64_t *len) {
    if (!t || id < 0 || id >= t->n_vocab) return NULL;
    if (len) *len = t->tok_len[id];
    return t->tok_arena + t->tok_off[id];
}
int32_t dhsa_tok__find(const dhsa_tokenizer *t, const char *text, int64_t len) {
    if (!t || (!text && len > 0) || len < 0) return -1;
    return strtab_find(&t->tokens, text, len);
}
int dhsa_tokenizer_type(const dhsa_tokenizer *t, int32_t id) {
    if (!t || id < 0 || id >= t->n_vocab) return 0;
    return t->types[id];
}

/* --------------------------------------------------------------------- */
/* Growable arrays and the merge queue                                    */

typedef struct {
    int32_t *v;
    int64_t n, cap;
} ivec;

static int ivec_push(ivec *a, int32_t x) {
    if (a->n == a->cap) {
        int64_t c = a->cap ? a->cap * 2 : 64;
        int32_t *p = realloc(a->v, sizeof *p * (size_t)c);
        if (!p) return -1;
        a->v = p;
        a->cap = c;
    }
    a->v[a->n++] = x;
    return 0;
}

typedef struct {
    int64_t start, n; /* bytes of the symbol in the (normalised) word */
    int32_t prev, next;
} symbol;

typedef struct {
    double key; /* higher merges first: SPM score, or -rank for BPE */
    int32_t left, right;
    int64_t size;
} bigram;

typedef struct {
    bigram *h;
    int64_t n, cap;
} heap;

static int bigram_before(const bigram *a, const bigram *b) {
    return a->key > b->key || (a->key == b->key && a->left < b->left);
}

static void heap_push(heap *q, bigram b) { /* cap is sized by the caller */
    int64_t i = q->n++;
    while (i > 0) {
        int64_t p = (i - 1) / 2;
        if (!bigram_before(&b, &q->h[p])) break;
        q->h[i] = q->h[p];
        i = p;
    }
    q->h[i] = b;
}

static bigram heap_pop(heap *q) {
    bigram top = q->h[0], last = q->h[--q->n];
    int64_t i = 0;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= q->n) break;
        if (c + 1 < q->n && bigram_before(&q->h[c + 1], &q->h[c])) c++;
        if (!bigram_before(&q->h[c], &last)) break;
        q->h[i] = q->h[c];
        i = c;
    }
    if (q->n > 0) q->h[i] = last;
    return top;
}

/* Work buffers of one tokenize call, grown as needed. */
typedef struct {
    const dhsa_tokenizer *t;
    ivec *out;
    char *buf; /* normalised / byte-mapped word */
    int64_t buf_cap;
    symbol *sym;
    int64_t sym_cap;
    heap q;
    char *key; /* BPE merge key "left right" */
    int64_t key_cap;
    dhsa_tok_pre_scratch pre; /* the pre-tokenizer's buffers */
} work;

static int grow(void **p, int64_t *cap, int64_t need, size_t elem) {
    if (need <= *cap) return 0;
    int64_t c = need < 64 ? 64 : need + need / 2;
    void *q = realloc(*p, (size_t)c * elem);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

static void work_free(work *w) {
    free(w->buf);
    free(w->sym);
    free(w->q.h);
    free(w->key);
    dhsa_tok__pre_scratch_free(&w->pre);
}

#define OOM() dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "tokenizer: out of memory")

/* Splits w->buf[0..len) into one symbol per character (SPM rule) and
 * sizes the queue: every merge adds at most two bigrams. */
static dhsa_status symbols_init(work *w, int64_t len, int64_t *n_sym) {
    if (grow((void **)&w->sym, &w->sym_cap, len + 1, sizeof *w->sym)) return OOM();
    int64_t n = 0;
    for (int64_t i = 0; i < len;) {
        int64_t c = spm_char_len(w->buf + i, len - i);
        w->sym[n] = (symbol){i, c, (int32_t)(n - 1), (int32_t)(n + 1)};
        n++;
        i += c;
    }
    if (n > 0) w->sym[n - 1].next = -1;
    int64_t qcap = w->q.cap;
    if (grow((void **)&w->q.h, &qcap, 3 * n + 1, sizeof *w->q.h)) return OOM();
    w->q.cap = qcap;
    w->q.n = 0;
    *n_sym = n;
    return DHSA_OK;
}

static dhsa_status push_id(work *w, int32_t id) { return ivec_push(w->out, id) ? OOM() : DHSA_OK; }

/* --------------------------------------------------------------------- */
/* The merge loop (both algorithms)                                       */

/* Queues the pair of adjacent symbols l, r when the vocabulary merges it,
 * keyed by its priority (SPM: the merged token's score; BPE: minus the
 * merge's rank); l or r < 0 (no neighbour) is nothing. */
typedef void (*pair_fn)(work *w, int32_t l, int32_t r);

/* Splits w->buf[0..len) into characters (symbols_init), offers every
 * adjacent pair to try_pair, then merges the best queued pair (highest
 * key, ties: leftmost) and offers its new neighbours, until the queue is
 * empty. A pair whose symbols changed since it was queued (a size that no
 * longer adds up) is stale and skipped. *n_sym: the symbols before the
 * merges; the survivors are the list from w->sym[0] along next. */
static dhsa_status merge_symbols(work *w, int64_t len, pair_fn try_pair, int64_t *n_sym) {
    int64_t n = 0;
    dhsa_status st = symbols_init(w, len, &n);
    if (st) return st;
    for (int64_t i = 1; i < n; i++) try_pair(w, (int32_t)(i - 1), (int32_t)i);
    while (w->q.n > 0) {
        bigram b = heap_pop(&w->q);
        symbol *L = &w->sym[b.left], *R = &w->sym[b.right];
        if (L->n == 0 || R->n == 0 || L->n + R->n != b.size) continue; /* stale */
        L->n += R->n;
        R->n = 0;
        L->next = R->next;
        if (R->next >= 0) w->sym[R->next].prev = b.left;
        try_pair(w, L->prev, b.left);
        try_pair(w, b.left, L->next);
    }
    *n_sym = n;
    return DHSA_OK;
}

/* Pushes the token of each symbol left after merge_symbols (n: its
 * *n_sym), in order. A symbol no token covers falls back to its bytes:
 * SPM: each byte's <0xXX> token, else unk, else nothing; BPE: each byte
 * looked up as a one-byte token and dropped when it is none (never unk),
 * as llama.cpp does. */
static dhsa_status emit_symbols(work *w, int64_t n) {
    const dhsa_tokenizer *t = w->t;
    dhsa_status st;
    for (int32_t i = n > 0 ? 0 : -1; i >= 0; i = w->sym[i].next) {
        const symbol *s = &w->sym[i];
        int32_t id = strtab_find(&t->tokens, w->buf + s->start, s->n);
        if (id >= 0) {
            if ((st = push_id(w, id))) return st;
            continue;
        }
        for (int64_t j = 0; j < s->n; j++) {
            if (t->kind == DHSA_TOKENIZER_SPM) {
                id = t->byte_tok[(uint8_t)w->buf[s->start + j]];
                if (id < 0) id = t->unk;
            } else {
                id = strtab_find(&t->tokens, w->buf + s->start + j, 1);
            }
            if (id >= 0 && (st = push_id(w, id))) return st;
        }
    }
    return DHSA_OK;
}

/* --------------------------------------------------------------------- */
/* SentencePiece                                                          */

static void spm_try_bigram(work *w, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    int64_t size = w->sym[l].n + w->sym[r].n;
    int32_t id = strtab_find(&w->t->tokens, w->buf + w->sym[l].start, size);
    if (id < 0) return;
    heap_push(&w->q, (bigram){w->t->scores[id], l, r, size});
}

/* One fragment: spaces become U+2581 (one before the text when
 * add_prefix), then merges over UTF-8 characters by score. */
static dhsa_status spm_encode(work *w, const char *text, int64_t len, int add_prefix) {
    int64_t blen = 0;
    if (grow((void **)&w->buf, &w->buf_cap, 3 * len + 3, 1)) return OOM();
    if (add_prefix) {
        memcpy(w->buf, "\xE2\x96\x81", 3);
        blen = 3;
    }
    for (int64_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(w->buf + blen, "\xE2\x96\x81", 3);
            blen += 3;
        } else {
            w->buf[blen++] = text[i];
        }
    }
    int64_t n = 0;
    dhsa_status st = merge_symbols(w, blen, spm_try_bigram, &n);
    return st ? st : emit_symbols(w, n);
}

/* --------------------------------------------------------------------- */
/* Byte-level BPE                                                         */

static void bpe_try_bigram(work *w, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const symbol *L = &w->sym[l], *R = &w->sym[r];
    int64_t kl = L->n + 1 + R->n;
    memcpy(w->key, w->buf + L->start, (size_t)L->n);
    w->key[L->n] = ' ';
    memcpy(w->key + L->n + 1, w->buf + R->start, (size_t)R->n);
    int32_t rank = strtab_find(&w->t->merges, w->key, kl);
    if (rank < 0) return;
    heap_push(&w->q, (bigram){-(double)rank, l, r, L->n + R->n});
}

/* One pre-tokenized word: its code points (bpe_decode: invalid UTF-8 is
 * U+FFFD, as in llama.cpp) as UTF-8, each byte as its GPT-2 code point,
 * then merges. */
static dhsa_status bpe_word(work *w, const char *text, int64_t len) {
    const dhsa_tokenizer *t = w->t;
    /* a byte becomes at most 3 (U+FFFD), each of those at most 2 */
    if (grow((void **)&w->buf, &w->buf_cap, 6 * len + 1, 1) || grow((void **)&w->key, &w->key_cap, 12 * len + 2, 1))
        return OOM();
    int64_t blen = 0;
    for (int64_t i = 0; i < len;) {
        int64_t k;
        char u[4];
        int nu = utf8_encode(dhsa_tok__bpe_decode((const uint8_t *)text + i, len - i, &k), u);
        for (int j = 0; j < nu; j++) blen += utf8_encode(t->byte_to_cp[(uint8_t)u[j]], w->buf + blen);
        i += k;
    }
    dhsa_status st;
    if (t->pre_flags & DHSA_TOK_PRE_IGNORE_MERGES) { /* llama.cpp's ignore_merges: a whole-word token wins */
        int32_t id = strtab_find(&t->tokens, w->buf, blen);
        if (id >= 0) return push_id(w, id);
    }
    int64_t n = 0;
    if ((st = merge_symbols(w, blen, bpe_try_bigram, &n))) return st;
    return emit_symbols(w, n);
}

static dhsa_status bpe_encode(work *w, const char *text, int64_t len) {
    int64_t n_words;
    dhsa_status st = dhsa_tok__pretokenize(w->t->pre, text, len, NULL, 0, &n_words, &w->pre);
    if (st) return st;
    int64_t *ends = malloc(sizeof *ends * (size_t)(n_words ? n_words : 1));
    if (!ends) return OOM();
    st = dhsa_tok__pretokenize(w->t->pre, text, len, ends, n_words, &n_words, &w->pre);
    for (int64_t i = 0, start = 0; st == DHSA_OK && i < n_words; start = ends[i++])
        st = bpe_word(w, text + start, ends[i] - start);
    free(ends);
    return st;
}

/* --------------------------------------------------------------------- */
/* Tokenize                                                               */

/* Special tokens are cut out of the text first, as llama.cpp's
 * tokenizer_st_partition does it: token by token in the order of
 * t->specials (longest first), each one's leftmost non-overlapping
 * occurrences in the text that is still raw, and each cut drops the ASCII
 * whitespace (C isspace) before it (LSTRIP) or after it (RSTRIP). A CONTROL
 * or UNKNOWN token is cut only with DHSA_TOKENIZE_PARSE_SPECIAL and only
 * where it does not touch a plain span (chat contents). Only the tokens the
 * text holds at all take a pass over it: a walk down the byte-sorted list
 * from each position finds them. */

typedef struct {
    int64_t off, len; /* bytes of the text */
    int32_t id;       /* the token, or -1: raw text */
} frag;

typedef struct {
    frag *v;
    int64_t n, cap;
} fragvec;

static int frag_push(fragvec *f, int64_t off, int64_t len, int32_t id) {
    if (f->n == f->cap && grow((void **)&f->v, &f->cap, f->n + 1, sizeof *f->v)) return -1;
    f->v[f->n++] = (frag){off, len, id};
    return 0;
}

static int c_isspace(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

/* Does [m, m + n) touch one of the plain spans (sorted, disjoint, [2k, 2k+1))? */
static int in_plain(const int64_t *plain, int64_t n_plain, int64_t m, int64_t n) {
    int64_t lo = 0, hi = n_plain;
    while (lo < hi) { /* the first span that ends after m */
        int64_t mid = lo + (hi - lo) / 2;
        if (plain[2 * mid + 1] <= m) lo = mid + 1;
        else hi = mid;
    }
    return lo < n_plain && plain[2 * lo] < m + n;
}

/* Marks seen[k] for every special token k (index into t->specials) that
 * occurs in text[0..len) and may be cut (CONTROL and UNKNOWN only when
 * parse). */
static void find_present(const dhsa_tokenizer *t, const char *text, int64_t len, int parse, uint8_t *seen) {
    const int32_t *lex = t->special_lex;
    for (int64_t p = 0; p < len; p++) {
        int64_t lo = 0, hi = t->n_specials;
        for (int64_t d = 0;; d++) {
            /* [lo, hi) share the first d bytes, text[p..p+d) included */
            while (lo < hi && t->tok_len[t->specials[lex[lo]]] == d) {
                int32_t id = t->specials[lex[lo]];
                if (parse || !(t->attr[id] & ATTR_PARSE_ONLY)) seen[lex[lo]] = 1;
                lo++;
            }
            if (lo >= hi || p + d >= len) break;
            uint8_t c = (uint8_t)text[p + d];
            int64_t a = lo, b = hi; /* first entry whose byte d is >= c */
            while (a < b) {
                int64_t mid = a + (b - a) / 2;
                int32_t id = t->specials[lex[mid]];
                if ((uint8_t)t->tok_arena[t->tok_off[id] + d] < c) a = mid + 1;
                else b = mid;
            }
            int64_t e = a, f = hi; /* first entry whose byte d is > c */
            while (e < f) {
                int64_t mid = e + (f - e) / 2;
                int32_t id = t->specials[lex[mid]];
                if ((uint8_t)t->tok_arena[t->tok_off[id] + d] <= c) e = mid + 1;
                else f = mid;
            }
            lo = a;
            hi = e;
        }
    }
}

/* The leftmost occurrence of token id in text[from..end) that may be cut,
 * or -1. */
static int64_t find_cut(const dhsa_tokenizer *t, int32_t id, const char *text, int64_t from, int64_t end,
                        const int64_t *plain, int64_t n_plain) {
    const char *s = t->tok_arena + t->tok_off[id];
    int64_t n = t->tok_len[id];
    int check = (t->attr[id] & ATTR_PARSE_ONLY) && n_plain > 0;
    while (end - from >= n) {
        const char *hit = memmem(text + from, (size_t)(end - from), s, (size_t)n);
        if (!hit) return -1;
        int64_t m = hit - text;
        if (!check || !in_plain(plain, n_plain, m, n)) return m;
        from = m + 1;
    }
    return -1;
}

/* One special token's pass over the raw fragments of cur, into next. */
static int cut_token(const dhsa_tokenizer *t, int32_t id, const char *text, const fragvec *cur, fragvec *next,
                     const int64_t *plain, int64_t n_plain) {
    const int64_t n = t->tok_len[id];
    const uint8_t attr = t->attr[id];
    next->n = 0;
    for (int64_t i = 0; i < cur->n; i++) {
        frag f = cur->v[i];
        if (f.id >= 0) {
            if (frag_push(next, f.off, f.len, f.id)) return -1;
            continue;
        }
        int64_t base = f.off, end = f.off + f.len;
        for (;;) {
            int64_t m = find_cut(t, id, text, base, end, plain, n_plain);
            if (m < 0) {
                if (end > base && frag_push(next, base, end - base, -1)) return -1;
                break;
            }
            int64_t left_end = m;
            if (attr & ATTR_LSTRIP)
                while (left_end > base && c_isspace(text[left_end - 1])) left_end--;
            if (left_end > base && frag_push(next, base, left_end - base, -1)) return -1;
            if (frag_push(next, m, n, id)) return -1;
            base = m + n;
            if (attr & ATTR_RSTRIP)
                while (base < end && c_isspace(text[base])) base++;
        }
    }
    return 0;
}

static dhsa_status partition(const dhsa_tokenizer *t, const char *text, int64_t len, int parse, const int64_t *plain,
                             int64_t n_plain, fragvec *out) {
    fragvec other = {0};
    out->n = 0;
    if (len > 0 && frag_push(out, 0, len, -1)) return OOM();
    if (len == 0 || t->n_specials == 0) return DHSA_OK;
    uint8_t *seen = calloc((size_t)t->n_specials, 1);
    if (!seen) return OOM();
    find_present(t, text, len, parse, seen);
    dhsa_status st = DHSA_OK;
    for (int64_t k = 0; k < t->n_specials && st == DHSA_OK; k++) {
        if (!seen[k]) continue;
        if (cut_token(t, t->specials[k], text, out, &other, plain, n_plain)) {
            st = OOM();
            break;
        }
        fragvec tmp = *out;
        *out = other;
        other = tmp;
    }
    free(other.v);
    free(seen);
    return st;
}

static dhsa_status encode_fragment(work *w, const char *text, int64_t len, int prev_special) {
    if (w->t->kind == DHSA_TOKENIZER_SPM) return spm_encode(w, text, len, w->t->add_space_prefix && prev_special);
    return bpe_encode(w, text, len);
}

int64_t dhsa_tokenize_max_ids(int64_t len) { return len < 0 ? 0 : 3 * len + 5; }

static dhsa_status tokenize_spans(const char *fn, const dhsa_tokenizer *t, const char *text, int64_t len,
                                  unsigned flags, const int64_t *plain, int64_t n_plain, int32_t *ids, int64_t cap,
                                  int64_t *n_ids) {
    if (!t || !n_ids || len < 0 || (!text && len > 0) || cap < 0 || (!ids && cap > 0))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "%s: t, n_ids and text must be given, len and cap >= 0", fn);
    *n_ids = 0;
    if (len > DHSA_TOKENIZER_MAX_TEXT)
        return dhsa__fail(DHSA_ERR_TOO_LARGE, "%s: %lld bytes of text (limit %lld)", fn, (long long)len,
                          (long long)DHSA_TOKENIZER_MAX_TEXT);
    ivec out = {0};
    work w = {0};
    fragvec frags = {0};
    w.t = t;
    w.out = &out;
    dhsa_status st = DHSA_OK;
    if ((flags & DHSA_TOKENIZE_ADD_BOS) && t->bos >= 0) st = push_id(&w, t->bos);
    if (st == DHSA_OK)
        st = partition(t, text, len, (flags & DHSA_TOKENIZE_PARSE_SPECIAL) != 0, plain, n_plain, &frags);
    int prev_special = 1; /* the SPM space prefix: at the start and after each special token */
    for (int64_t i = 0; st == DHSA_OK && i < frags.n; i++) {
        const frag *f = &frags.v[i];
        if (f->id >= 0) {
            st = push_id(&w, f->id);
            prev_special = 1;
        } else {
            st = encode_fragment(&w, text + f->off, f->len, prev_special);
            prev_special = 0;
        }
    }
    if (st == DHSA_OK && (flags & DHSA_TOKENIZE_ADD_EOS) && t->eos >= 0) st = push_id(&w, t->eos);
    work_free(&w);
    free(frags.v);
    if (st == DHSA_OK) {
        *n_ids = out.n;
        if (out.n && cap > 0) memcpy(ids, out.v, sizeof *ids * (size_t)(out.n < cap ? out.n : cap));
        if (out.n > cap)
            st = dhsa__fail(DHSA_ERR_INVALID_ARG, "%s: the text needs %lld ids, cap is %lld", fn, (long long)out.n,
                            (long long)cap);
    }
    free(out.v);
    return st;
}

dhsa_status dhsa_tokenize(const dhsa_tokenizer *t, const char *text, int64_t len, unsigned flags, int32_t *ids,
                          int64_t cap, int64_t *n_ids) {
    return tokenize_spans("dhsa_tokenize", t, text, len, flags, NULL, 0, ids, cap, n_ids);
}

dhsa_status dhsa_tok__tokenize_plain_spans(const dhsa_tokenizer *t, const char *text, int64_t len, unsigned flags,
                                          const int64_t *plain, int64_t n_plain, int32_t *ids, int64_t cap,
                                          int64_t *n_ids) {
    if (n_plain < 0 || (n_plain > 0 && !plain))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_tok__tokenize_plain_spans: n_plain < 0 or plain NULL");
    for (int64_t k = 0; k < n_plain; k++)
        if (plain[2 * k] < (k ? plain[2 * k - 1] : 0) || plain[2 * k + 1] < plain[2 * k] || plain[2 * k + 1] > len)
            return dhsa__fail(DHSA_ERR_INVALID_ARG,
                              "dhsa_tok__tokenize_plain_spans: span %lld [%lld, %lld) is not sorted, disjoint "
                              "and inside the %lld bytes",
                              (long long)k, (long long)plain[2 * k], (long long)plain[2 * k + 1], (long long)len);
    return tokenize_spans("dhsa_tokenize", t, text, len, flags | DHSA_TOKENIZE_PARSE_SPECIAL, plain, n_plain, ids,
                          cap, n_ids);
}

/* --------------------------------------------------------------------- */
/* Detokenize                                                             */

typedef struct {
    char *out;
    int64_t cap, len;
    int strip; /* drop the next byte if it is a space */
} sink;

static void put(sink *s, const char *p, int64_t n) {
    if (n > 0 && s->strip) {
        s->strip = 0;
        if (p[0] == ' ') {
            p++;
            n--;
        }
    }
    for (int64_t i = 0; i < n; i++, s->len++)
        if (s->len < s->cap) s->out[s->len] = p[i];
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

static void piece(const dhsa_tokenizer *t, int32_t id, unsigned flags, sink *s) {
    const char *p = t->tok_arena + t->tok_off[id];
    int64_t n = t->tok_len[id];
    int type = t->types[id];
    if (t->attr[id] & ATTR_CONTROL) { /* phi-3's USER_DEFINED "</s>" too: it is CONTROL here */
        if (flags & DHSA_DETOKENIZE_SPECIAL) put(s, p, n);
        return;
    }
    if (t->attr[id] & ATTR_USER_DEFINED) {
        put(s, p, n);
        return;
    }
    if (t->kind == DHSA_TOKENIZER_SPM) {
        if (type == DHSA_TOKEN_BYTE && n == 6 && p[0] == '<' && p[1] == '0' && p[2] == 'x' && p[5] == '>' &&
            hexval(p[3]) >= 0 && hexval(p[4]) >= 0) {
            char b = (char)(hexval(p[3]) * 16 + hexval(p[4]));
            put(s, &b, 1);
            return;
        }
        if (type == DHSA_TOKEN_UNKNOWN) {
            put(s, " \xE2\x81\x87 ", 5); /* " ⁇ ", as SentencePiece renders unk */
            return;
        }
        for (int64_t i = 0; i < n;) {
            if (n - i >= 3 && memcmp(p + i, "\xE2\x96\x81", 3) == 0) {
                put(s, " ", 1);
                i += 3;
            } else {
                put(s, p + i, 1);
                i++;
            }
        }
        return;
    }
    for (int64_t i = 0; i < n;) { /* BPE: code points back to bytes */
        int64_t k;
        uint32_t c = utf8_decode((const uint8_t *)p + i, n - i, &k);
        if (c < 512 && t->cp_is_byte[c]) {
            char b = (char)t->cp_to_byte[c];
            put(s, &b, 1);
        } else {
            put(s, p + i, k);
        }
        i += k;
    }
}

dhsa_status dhsa_token_to_piece(const dhsa_tokenizer *t, int32_t id, unsigned flags, char *out, int64_t cap,
                                int64_t *len) {
    if (!t || !len || cap < 0 || (!out && cap > 0))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_token_to_piece: t and len must be given, cap >= 0");
    *len = 0;
    if (id < 0 || id >= t->n_vocab)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_token_to_piece: id %d is outside the vocab (%lld tokens)",
                          (int)id, (long long)t->n_vocab);
    sink s = {out, cap, 0, 0};
    piece(t, id, flags, &s);
    *len = s.len;
    if (s.len > cap)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_token_to_piece: the piece is %lld bytes, cap is %lld",
                          (long long)s.len, (long long)cap);
    return DHSA_OK;
}

dhsa_status dhsa_detokenize(const dhsa_tokenizer *t, const int32_t *ids, int64_t n, unsigned flags, char *out,
                            int64_t cap, int64_t *len) {
    if (!t || !len || n < 0 || (!ids && n > 0) || cap < 0 || (!out && cap > 0))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_detokenize: t, ids and len must be given, n and cap >= 0");
    *len = 0;
    const int strip = t->add_space_prefix && !(flags & DHSA_DETOKENIZE_KEEP_SPACE);
    sink s = {out, cap, 0, strip};
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab)
            return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_detokenize: ids[%lld] = %d is outside the vocab (%lld)",
                              (long long)i, (int)ids[i], (long long)t->n_vocab);
        if (t->attr[ids[i]] & (ATTR_CONTROL | ATTR_USER_DEFINED)) {
            /* dhsa_tokenize gives the text after a special token a space
             * prefix of its own, as at the start: the special piece keeps
             * its bytes, and the next piece loses that space again */
            s.strip = 0;
            piece(t, ids[i], flags, &s);
            s.strip = strip;
        } else {
            piece(t, ids[i], flags, &s);
        }
    }
    *len = s.len;
    if (s.len > cap)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_detokenize: the text is %lld bytes, cap is %lld",
                          (long long)s.len, (long long)cap);
    return DHSA_OK;
}
