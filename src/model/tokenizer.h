/* tokenizer.h: the tokenizers (src/model/tokenizer.c): SentencePiece-style
 * ("llama") and byte-level BPE ("gpt2") built from GGUF metadata. Kept out
 * of include/dhsa.h for now (it can move there as one block: everything
 * above the "private" banner); docs/tokenizer.md describes the algorithms.
 * Tested by tests/test_tokenizer.c.
 */
#ifndef DHSA_MODEL_TOKENIZER_H
#define DHSA_MODEL_TOKENIZER_H

#include "dhsa.h"

#include <stdint.h>

/* ------------------------------------------------------------------------ */
/* Tokenizers (src/model/tokenizer.c, docs/tokenizer.md)                    */

/* Which algorithm a vocabulary uses (tokenizer.ggml.model). */
typedef enum {
    DHSA_TOKENIZER_SPM = 1, /* "llama": SentencePiece BPE by score, byte fallback */
    DHSA_TOKENIZER_BPE = 2  /* "gpt2": byte-level BPE by merge rank */
} dhsa_tokenizer_kind;

/* Token types (tokenizer.ggml.token_type; the ids GGUF stores). */
typedef enum {
    DHSA_TOKEN_NORMAL = 1,
    DHSA_TOKEN_UNKNOWN = 2,
    DHSA_TOKEN_CONTROL = 3,      /* <s>, </s>, <|endoftext|>: never from plain text */
    DHSA_TOKEN_USER_DEFINED = 4, /* added tokens: matched whole in any text */
    DHSA_TOKEN_UNUSED = 5,
    DHSA_TOKEN_BYTE = 6          /* <0xXX> byte fallback */
} dhsa_token_type;

/* Flags of dhsa_tokenize. */
#define DHSA_TOKENIZE_ADD_BOS 1u       /* prepend the BOS id (if the vocab has one) */
#define DHSA_TOKENIZE_ADD_EOS 2u       /* append the EOS id (if the vocab has one) */
#define DHSA_TOKENIZE_PARSE_SPECIAL 4u /* match CONTROL token texts ("<s>") in text */
/* Flags of dhsa_detokenize / dhsa_token_to_piece. */
#define DHSA_DETOKENIZE_SPECIAL 1u     /* render CONTROL tokens as their text */
#define DHSA_DETOKENIZE_KEEP_SPACE 2u  /* keep the space an SPM prefix added */

/* Limits (DHSA_ERR_TOO_LARGE above them). */
#define DHSA_TOKENIZER_MAX_VOCAB (1 << 24)
#define DHSA_TOKENIZER_MAX_TOKEN_BYTES 65536
#define DHSA_TOKENIZER_MAX_TEXT ((int64_t)1 << 30)

typedef struct dhsa_tokenizer dhsa_tokenizer;

/* Builds a tokenizer from the tokenizer.ggml.* metadata of g: model
 * ("llama" or "gpt2"), tokens, scores, token_type, merges, pre (gpt2 only:
 * "default" and "gpt-2" (GPT-2 regex), "starcoder", "llama-bpe"/"llama3",
 * "qwen2"; any other name is DHSA_ERR_UNSUPPORTED, naming it), bos / eos /
 * unknown ids, add_bos_token, add_eos_token, add_space_prefix. Everything
 * needed is copied: g may be closed after. A malformed key is
 * DHSA_ERR_FORMAT naming the key. *out is NULL on failure; free with
 * dhsa_tokenizer_free. */
dhsa_status dhsa_tokenizer_from_gguf(const dhsa_gguf *g, dhsa_tokenizer **out);
/* NULL is allowed. */
void dhsa_tokenizer_free(dhsa_tokenizer *t);

dhsa_tokenizer_kind dhsa_tokenizer_kind_of(const dhsa_tokenizer *t);
int64_t dhsa_tokenizer_n_vocab(const dhsa_tokenizer *t);
/* Ids from the metadata; -1 when the vocab has none. */
int32_t dhsa_tokenizer_bos(const dhsa_tokenizer *t);
int32_t dhsa_tokenizer_eos(const dhsa_tokenizer *t);
int32_t dhsa_tokenizer_unk(const dhsa_tokenizer *t);
/* DHSA_TOKENIZE_ADD_BOS / _ADD_EOS as tokenizer.ggml.add_bos_token /
 * add_eos_token say (defaults: SPM adds BOS, BPE nothing). */
unsigned dhsa_tokenizer_default_flags(const dhsa_tokenizer *t);
/* The vocabulary text of id as stored ('▁' for SPM spaces, the byte-to-
 * unicode mapping for BPE), NUL-terminated, owned by t; NULL when id is
 * out of range. len may be NULL. */
const char *dhsa_tokenizer_text(const dhsa_tokenizer *t, int32_t id, int64_t *len);
/* Type of id (dhsa_token_type); 0 when id is out of range. */
int dhsa_tokenizer_type(const dhsa_tokenizer *t, int32_t id);

/* Upper bound on the ids dhsa_tokenize can produce for len bytes. */
int64_t dhsa_tokenize_max_ids(int64_t len);
/* Tokenizes text[0..len) (any bytes: invalid UTF-8 becomes byte tokens in
 * SPM and mapped bytes in BPE; NUL is an ordinary byte). Writes at most
 * cap ids; *n_ids is always the full count, so ids = NULL, cap = 0 sizes
 * the buffer; a count above cap is DHSA_ERR_INVALID_ARG (the ids that fit
 * are written). Not a hot path: scratch comes from malloc for the call. */
dhsa_status dhsa_tokenize(const dhsa_tokenizer *t, const char *text, int64_t len, unsigned flags, int32_t *ids,
                          int64_t cap, int64_t *n_ids);
/* The bytes of one token: SPM '▁' becomes ' ' and <0xXX> the byte; BPE
 * text is mapped back to bytes; CONTROL tokens are empty unless
 * DHSA_DETOKENIZE_SPECIAL. Writes at most cap bytes (no NUL); *len is the
 * full length; more than cap is DHSA_ERR_INVALID_ARG. */
dhsa_status dhsa_token_to_piece(const dhsa_tokenizer *t, int32_t id, unsigned flags, char *out, int64_t cap,
                                int64_t *len);
/* The bytes of ids[0..n) concatenated; when the vocab adds a space prefix
 * (SPM), the leading space of the first non-empty piece is removed unless
 * DHSA_DETOKENIZE_KEEP_SPACE, so detokenize(tokenize(x)) == x. Same cap /
 * len contract as dhsa_token_to_piece; an id out of range is
 * DHSA_ERR_INVALID_ARG. */
dhsa_status dhsa_detokenize(const dhsa_tokenizer *t, const int32_t *ids, int64_t n, unsigned flags, char *out,
                            int64_t cap, int64_t *len);


/* ------------------------------------------------------------------------ */
/* Private: exposed for the tests                                            */

/* Pre-tokenizers of byte-level BPE vocabularies (tokenizer.ggml.pre). */
typedef enum {
    DHSA_TOK_PRE_NONE = 0,
    DHSA_TOK_PRE_GPT2 = 1,      /* "gpt-2", "default" */
    DHSA_TOK_PRE_STARCODER = 2, /* digits split off, then GPT-2 */
    DHSA_TOK_PRE_LLAMA3 = 3,    /* "llama-bpe": Llama 3 regex, whole-word tokens first */
    DHSA_TOK_PRE_QWEN2 = 4      /* Llama 3 regex with single digits */
} dhsa_tok_pre;

/* Splits text[0..len) into words: ends[i] is the byte offset where word i
 * ends (word 0 starts at 0). Writes at most cap ends; *n_words is the full
 * count. scratch is NULL (or the tokenizer's internal work buffers).
 * Exposed for tests. */
dhsa_status dhsa_tok__pretokenize(dhsa_tok_pre pre, const char *text, int64_t len, int64_t *ends, int64_t cap,
                                  int64_t *n_words, void *scratch);

#endif
