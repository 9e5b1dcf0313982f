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

/* Pre-tokenizers of byte-level BPE vocabularies (tokenizer.ggml.pre). */
typedef enum {
    DHSA_TOK_PRE_NONE = 0,
    DHSA_TOK_PRE_GPT2 = 1,      /* "gpt-2", "default" */
    DHSA_TOK_PRE_STARCODER = 2, /* digits split off, then GPT-2 */
    DHSA_TOK_PRE_LLAMA3 = 3,    /* "llama-bpe": Llama 3 regex, whole-word tokens first */
    DHSA_TOK_PRE_QWEN2 = 4,     /* Llama 3 regex with single digits */
    DHSA_TOK_PRE_DEEPSEEK_LLM = 5, /* "deepseek-llm": six regexes in turn (docs/tokenizer.md) */
    DHSA_TOK_PRE_FALCON = 6     /* "falcon": punctuation runs, GPT-2, then digit triples */
} dhsa_tok_pre;

/* Splits text[0..len) into words: ends[i] is the byte offset where word i
 * ends (word 0 starts at 0). Writes at most cap ends; *n_words is the full
 * count. scratch is NULL (or the tokenizer's internal work buffers).
 * Exposed for tests. */
dhsa_status dhsa_tok__pretokenize(dhsa_tok_pre pre, const char *text, int64_t len, int64_t *ends, int64_t cap,
                                  int64_t *n_words, void *scratch);

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
