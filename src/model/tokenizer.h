/* tokenizer.h: private parts of the tokenizers (src/model/tokenizer.c).
 * The public API is the tokenizer block of include/dhsa.h;
 * docs/tokenizer.md describes the algorithms. Tested by
 * tests/test_tokenizer.c.
 */
#ifndef DHSA_MODEL_TOKENIZER_H
#define DHSA_MODEL_TOKENIZER_H

#include "dhsa.h"

#include <stddef.h>
#include <stdint.h>

/* ------------------------------------------------------------------------ */
/* Private: exposed for the tests                                            */

/* Pre-tokenizers of byte-level BPE vocabularies: the regex sets of
 * llama.cpp's llm_tokenizer_bpe (src/llama-vocab.cpp). tokenizer.ggml.pre
 * names one of its ~90 names; dhsa_tok__pre_lookup maps each to its set.
 * docs/tokenizer.md lists every name and what it runs. */
typedef enum {
    DHSA_TOK_PRE_NONE = 0,
    DHSA_TOK_PRE_GPT2 = 1,      /* "gpt-2": the GPT-2 regex */
    DHSA_TOK_PRE_STARCODER = 2, /* digits split off, then GPT-2 */
    DHSA_TOK_PRE_LLAMA3 = 3,    /* "llama-bpe": Llama 3 regex (\p{N}{1,3}) */
    DHSA_TOK_PRE_QWEN2 = 4,     /* Llama 3 regex with single digits */
    DHSA_TOK_PRE_DEEPSEEK_LLM = 5, /* "deepseek-llm": six regexes in turn (docs/tokenizer.md) */
    DHSA_TOK_PRE_FALCON = 6,    /* "falcon": punctuation runs, GPT-2, then digit triples */
    DHSA_TOK_PRE_DEFAULT = 7,   /* "default": punctuation runs (no backtick), GPT-2, \p{N}+, digit triples */
    DHSA_TOK_PRE_DEEPSEEK_CODER = 8, /* [\r\n], \s?\p{L}+, \s?\p{P}+, [CJK]+, \p{N} */
    DHSA_TOK_PRE_BLOOM = 9,     /* " ?[^(\s|.,!?…。，、।۔،)]+" */
    DHSA_TOK_PRE_VIKING = 10,   /* bloom's, then \p{N} */
    DHSA_TOK_PRE_UFAKZEKA = 11, /* Qwen2 without the contractions */
    DHSA_TOK_PRE_MINICPM5 = 12, /* \p{N}{1,3}, then Llama 3 with \p{N}+ */
    DHSA_TOK_PRE_SEED_CODER = 13, /* Qwen2 without [\r\n]* after punctuation */
    DHSA_TOK_PRE_LAGUNA = 14,   /* newline runs split off, then Qwen2 */
    DHSA_TOK_PRE_JAIS2 = 15,    /* Llama 3 with whitespace in runs of 512, 256, ..., 4, 2, 1 */
    DHSA_TOK_PRE_GPT4O = 16,    /* "gpt-4o", "llama4": cased letter runs, \p{N}{1,3} */
    DHSA_TOK_PRE_TEKKEN = 17,   /* "tekken": cased letter runs, \p{N}, no contractions */
    DHSA_TOK_PRE_QWEN35 = 18,   /* Qwen2 with \p{M} joining letters */
    DHSA_TOK_PRE_GRANITE_MULTI = 19 /* gpt-4o's cased runs with \p{M} in their look-aheads */
} dhsa_tok_pre;

/* Flags of a pre-tokenizer name, as llama.cpp's loader sets them. */
enum {
    DHSA_TOK_PRE_IGNORE_MERGES = 1, /* a word that is a whole token is that token */
    DHSA_TOK_PRE_ADD_BOS = 2        /* BOS added unless the file says otherwise */
};

/* What tokenizer.ggml.pre = name runs: *pre (DHSA_TOK_PRE_NONE for a name
 * dhsa refuses) and *flags; returns 1 when llama.cpp knows the name, 0
 * when nobody does. *why says, for a refused name, what it would need. */
int dhsa_tok__pre_lookup(const char *name, dhsa_tok_pre *pre, unsigned *flags, const char **why);

/* Sets a BPE tokenizer's pre-tokenizer by name, as the loader does
 * (file_sets_add_bos: the file has tokenizer.ggml.add_bos_token, so a
 * name's default BOS does not apply); a refused name is
 * DHSA_ERR_UNSUPPORTED naming it, t unchanged. The loader's path, exposed
 * so tests can run one vocabulary under every pre-tokenizer. */
dhsa_status dhsa_tok__set_pre(dhsa_tokenizer *t, const char *pre, int file_sets_add_bos);

/* The i-th name llama.cpp knows, in its order; NULL past the last. */
const char *dhsa_tok__pre_name(size_t i);

/* The pre-tokenizer's buffers (src/model/pretokenize.c), grown as needed
 * and kept between calls by a tokenize call's work buffers: cap entries
 * each, for a text of up to cap - 1 code points. */
typedef struct {
    uint32_t *cp;      /* (cap,) code points of the text */
    int64_t *cp_off;   /* (cap,) byte offset of each, then the text's length */
    uint8_t *cat;      /* (cap,) class of each (letter, number, space, other) */
    int64_t *piece[2]; /* (cap,) piece ends, before / after a regex */
    int64_t cap;
} dhsa_tok_pre_scratch;

/* Frees the buffers of s (not s). */
void dhsa_tok__pre_scratch_free(dhsa_tok_pre_scratch *s);

/* Splits text[0..len) into words: ends[i] is the byte offset where word i
 * ends (word 0 starts at 0). Writes at most cap ends; *n_words is the full
 * count. scratch is NULL (buffers of this call only) or buffers kept by the
 * caller (a tokenize call's). Exposed for tests. */
dhsa_status dhsa_tok__pretokenize(dhsa_tok_pre pre, const char *text, int64_t len, int64_t *ends, int64_t cap,
                                  int64_t *n_words, dhsa_tok_pre_scratch *scratch);

/* "name, name, ..." of every tokenizer.ggml.pre name dhsa runs, cut to
 * cap bytes (NUL included): for the refusal of one it does not. */
void dhsa_tok__pre_supported_names(char *buf, size_t cap);

/* UTF-8 as llama.cpp decodes it for byte-level BPE (unicode_cpt_from_utf8,
 * and the U+FFFD unicode_cpts_from_utf8 puts for what that refuses): the
 * lead byte gives the length and only the continuation bytes are checked,
 * so overlong forms and surrogates pass as the code points they spell;
 * anything else is U+FFFD for one byte (*n = 1). Above U+10FFFF (leads F4
 * 90.. to F7), where llama.cpp fails when it encodes the word, U+FFFD too. */
static inline uint32_t dhsa_tok__bpe_decode(const uint8_t *s, int64_t left, int64_t *n) {
    uint8_t b = s[0];
    *n = 1;
    if (b < 0x80) return b;
    int len = (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 0;
    if (len == 0 || len > left) return 0xFFFD;
    uint32_t cp = b & (0xFFu >> (len + 1));
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0xFFFD;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp > 0x10FFFF) return 0xFFFD;
    *n = len;
    return cp;
}


/* Id of the token whose vocabulary text is text[0..len) (the last one when
 * the text repeats, as llama.cpp's map keeps it), or -1. For the chat
 * templates (src/model/chat.c), which look up <|eot_id|> and the like. */
int32_t dhsa_tok__find(const dhsa_tokenizer *t, const char *text, int64_t len);

/* dhsa_tokenize with special tokens parsed except inside plain spans:
 * plain[2k] .. plain[2k+1] (byte offsets, sorted, disjoint, inside the
 * text) are text no CONTROL or UNKNOWN token may touch (USER_DEFINED ones
 * are cut there as in any text). The raw text between special tokens is
 * encoded whole, spans or not, so a text whose plain spans hold no special
 * text gives the ids dhsa_tokenize gives it with PARSE_SPECIAL. For the
 * chat templates (dhsa_chat_tokenize): the messages are the plain spans. */
dhsa_status dhsa_tok__tokenize_plain_spans(const dhsa_tokenizer *t, const char *text, int64_t len, unsigned flags,
                                          const int64_t *plain, int64_t n_plain, int32_t *ids, int64_t cap,
                                          int64_t *n_ids);

/* The bytes the tokenizer's tables hold (texts, offsets, scores, types,
 * hash slots, merges, specials) as dhsa__heap_block counts them: for the
 * memory plan (src/model/session.c). 0 for NULL. */
size_t dhsa__tokenizer_heap_bytes(const dhsa_tokenizer *t);

#endif
