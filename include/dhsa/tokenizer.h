/* dhsa/tokenizer.h: tokenizers (a GGUF vocabulary's BPE or SentencePiece)
 * and chat templates (src/model/tokenizer.c, chat.c; docs/tokenizer.md,
 * docs/chat.md).
 *
 * A section of the public interface: users include <dhsa.h>, which
 * includes every section in order. This file includes the sections it
 * builds on, so it compiles alone too. The rules every call follows
 * (errors, threads, tensors) are at the top of dhsa.h and in dhsa/core.h.
 */
#ifndef DHSA_TOKENIZER_H
#define DHSA_TOKENIZER_H

#include "gguf.h"

#ifdef __cplusplus
extern "C" {
#endif

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
#define DHSA_TOKENIZE_PARSE_SPECIAL 4u /* also match CONTROL and UNKNOWN token texts ("<s>", "<unk>") */
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
DHSA_API dhsa_status dhsa_tokenizer_from_gguf(const dhsa_gguf *g, dhsa_tokenizer **out);
/* NULL is allowed. */
DHSA_API void dhsa_tokenizer_free(dhsa_tokenizer *t);

DHSA_API dhsa_tokenizer_kind dhsa_tokenizer_kind_of(const dhsa_tokenizer *t);
DHSA_API int64_t dhsa_tokenizer_n_vocab(const dhsa_tokenizer *t);
/* Ids from the metadata; -1 when the vocab has none. */
DHSA_API int32_t dhsa_tokenizer_bos(const dhsa_tokenizer *t);
DHSA_API int32_t dhsa_tokenizer_eos(const dhsa_tokenizer *t);
DHSA_API int32_t dhsa_tokenizer_unk(const dhsa_tokenizer *t);
/* DHSA_TOKENIZE_ADD_BOS / _ADD_EOS as tokenizer.ggml.add_bos_token /
 * add_eos_token say (defaults: SPM adds BOS, BPE nothing). */
DHSA_API unsigned dhsa_tokenizer_default_flags(const dhsa_tokenizer *t);
/* The vocabulary text of id as stored ('▁' for SPM spaces, the byte-to-
 * unicode mapping for BPE), NUL-terminated, owned by t; NULL when id is
 * out of range. len may be NULL. */
DHSA_API const char *dhsa_tokenizer_text(const dhsa_tokenizer *t, int32_t id, int64_t *len);
/* Type of id (dhsa_token_type); 0 when id is out of range. */
DHSA_API int dhsa_tokenizer_type(const dhsa_tokenizer *t, int32_t id);

/* Upper bound on the ids dhsa_tokenize can produce for len bytes. */
DHSA_API int64_t dhsa_tokenize_max_ids(int64_t len);
/* Tokenizes text[0..len) as llama.cpp does (docs/tokenizer.md). Special
 * tokens are cut out first, longest first: USER_DEFINED ones always, CONTROL
 * and UNKNOWN ones only with DHSA_TOKENIZE_PARSE_SPECIAL. Token types are
 * the file's, corrected as llama.cpp corrects them: every end-of-generation
 * text (</s>, <|endoftext|>, <|im_end|>, <|eot_id|>, ...) and, where the
 * file names no id for them, fill-in-the-middle texts are CONTROL, so plain
 * text never becomes them; a phi-3 vocabulary (general.name) drops the
 * whitespace after its special tokens but <unk>, <s> and <|endoftext|>.
 * Any bytes: invalid UTF-8 becomes byte tokens in SPM and U+FFFD in BPE
 * (as in llama.cpp); a byte a BPE vocabulary has no token for is dropped,
 * never unk; NUL is an ordinary byte. Writes at most
 * cap ids; *n_ids is always the full count, so ids = NULL, cap = 0 sizes
 * the buffer; a count above cap is DHSA_ERR_INVALID_ARG (the ids that fit
 * are written). Not a hot path: scratch comes from malloc for the call. */
DHSA_API dhsa_status dhsa_tokenize(const dhsa_tokenizer *t, const char *text, int64_t len, unsigned flags, int32_t *ids,
                                   int64_t cap, int64_t *n_ids);
/* The bytes of one token: SPM '▁' becomes ' ' and <0xXX> the byte; BPE
 * text is mapped back to bytes; CONTROL tokens are empty unless
 * DHSA_DETOKENIZE_SPECIAL. Writes at most cap bytes (no NUL); *len is the
 * full length; more than cap is DHSA_ERR_INVALID_ARG. */
DHSA_API dhsa_status dhsa_token_to_piece(const dhsa_tokenizer *t, int32_t id, unsigned flags, char *out, int64_t cap,
                                         int64_t *len);
/* The bytes of ids[0..n) concatenated; when the vocab adds a space prefix
 * (SPM), the leading space of the first non-empty piece, and of the first
 * piece after each CONTROL or USER_DEFINED token (where dhsa_tokenize adds
 * a prefix too), is removed unless DHSA_DETOKENIZE_KEEP_SPACE, so
 * detokenize(tokenize(x)) == x. Same cap /
 * len contract as dhsa_token_to_piece; an id out of range is
 * DHSA_ERR_INVALID_ARG. */
DHSA_API dhsa_status dhsa_detokenize(const dhsa_tokenizer *t, const int32_t *ids, int64_t n, unsigned flags, char *out,
                                     int64_t cap, int64_t *len);

/* ------------------------------------------------------------------------ */
/* Chat templates (src/model/chat.c, docs/chat.md)                          */

/* The prompt formats dhsa writes itself (no Jinja). */
typedef enum {
    DHSA_CHAT_NONE = 0,    /* no known format */
    DHSA_CHAT_LLAMA3 = 1,  /* <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|> */
    DHSA_CHAT_CHATML = 2,  /* <|im_start|>role\ncontent<|im_end|>\n (Qwen2, ...) */
    DHSA_CHAT_GEMMA = 3,   /* <start_of_turn>user\n...<end_of_turn>\n; assistant is "model" */
    DHSA_CHAT_MISTRAL = 4, /* [INST] user [/INST] answer</s> */
    DHSA_CHAT_LLAMA2 = 5,  /* [INST] <<SYS>>\nsystem\n<</SYS>>\n\nuser [/INST] answer </s><s>... */
    DHSA_CHAT_PHI3 = 6,    /* <|user|>\ncontent<|end|>\n ... <|assistant|>\n (Phi-3, Phi-3.5) */
    DHSA_CHAT_QWEN25 = 7,  /* CHATML, first a system turn: the given one, else Qwen2.5-Instruct's default */
    DHSA_CHAT_SMOLLM2 = 8  /* CHATML, SmolLM2-Instruct's default system turn when none is given first */
} dhsa_chat_template;

/* One message: role "system", "user" or "assistant" (Llama 3 also takes
 * "ipython"); content is UTF-8 text. Both NUL-terminated, borrowed. */
typedef struct {
    const char *role;
    const char *content;
} dhsa_chat_message;

/* The format a model's metadata names, unchecked (dhsa_chat_choose below
 * refuses what is not checked): a checked template (dhsa_chat_choose) its
 * format, else tokenizer.chat_template's markers, in llama.cpp's order (<|im_start|> -> CHATML; [INST] -> LLAMA2
 * when the template also has <<SYS>>, NONE with Mistral's v3/v7 markers
 * [AVAILABLE_TOOLS] or [SYSTEM_PROMPT], else MISTRAL; <start_of_turn> ->
 * GEMMA; <|start_header_id|> and <|end_header_id|> -> LLAMA3); a template
 * with none of them is NONE (a format dhsa does not write is not guessed
 * over). Without a template,
 * general.architecture: qwen/qwen2/qwen2moe/qwen3/qwen3moe -> CHATML,
 * gemma/gemma2/gemma3 -> GEMMA, llama -> LLAMA3 when the vocabulary has a
 * <|start_header_id|> token, else MISTRAL when general.name says
 * "mistral", else LLAMA2. Anything else (or g = NULL) is NONE. */
DHSA_API dhsa_chat_template dhsa_chat_detect(const dhsa_gguf *g);
/* The format to write a model's conversations in, as the CLI and the
 * Python binding choose it: when the file has a tokenizer.chat_template,
 * only a template dhsa renders byte for byte as jinja2 does (known by the
 * SHA-256 of its text; the list and how it is checked: docs/chat.md) is
 * taken (QWEN25 for Qwen2.5-Instruct's, SMOLLM2 for SmolLM2-Instruct's);
 * any other template is DHSA_ERR_UNSUPPORTED, *out set to the closest
 * format dhsa_chat_detect finds (NONE when none), and the error says so
 * and asks for --template NAME or --template plain. Without a template,
 * dhsa_chat_detect's choice by architecture (DHSA_ERR_UNSUPPORTED when it
 * is NONE). On success *how is a static sentence saying which way the
 * format was chosen. */
DHSA_API dhsa_status dhsa_chat_choose(const dhsa_gguf *g, dhsa_chat_template *out, const char **how);
/* "llama3", "chatml" (or "qwen2"), "qwen2.5", "smollm2", "gemma",
 * "mistral", "llama2", "phi3", "none";
 * another name is DHSA_ERR_UNSUPPORTED listing these. */
DHSA_API dhsa_status dhsa_chat_template_from_name(const char *name, dhsa_chat_template *out);
/* "llama3", "chatml", ...; "none" for NONE; "?" outside the enum. */
DHSA_API const char *dhsa_chat_template_name(dhsa_chat_template t);

/* Writes msgs[0..n) in format t, then, with add_generation_prompt, the
 * opening of the assistant's turn (LLAMA3, CHATML, GEMMA; MISTRAL and
 * LLAMA2 have none: a user turn already ends in [/INST]).
 * BOS: the text never starts with it; the tokenizer adds it once where
 * the vocabulary wants it (dhsa_tokenizer_default_flags). To feed a model,
 * use dhsa_chat_tokenize below: it parses the special texts (<|eot_id|>,
 * </s>, the <s> that opens each later LLAMA2 turn, ...) of the template
 * only. Content is copied as is, so tokenizing this text with
 * DHSA_TOKENIZE_PARSE_SPECIAL would turn a special text inside a message
 * into that token too.
 * Contents are trimmed where the model's own template trims (LLAMA3,
 * GEMMA, LLAMA2). Roles: see docs/chat.md; GEMMA, MISTRAL and LLAMA2 take
 * one optional system message first, then user and assistant in turn from
 * user. A role or order the format does not allow, NONE, or a NULL role or
 * content is DHSA_ERR_INVALID_ARG naming the message. Writes at most cap
 * bytes (no NUL); *len is the full length; more than cap is
 * DHSA_ERR_INVALID_ARG (out = NULL, cap = 0 sizes the buffer). */
DHSA_API dhsa_status dhsa_chat_apply(dhsa_chat_template t, const dhsa_chat_message *msgs, int64_t n,
                                     int add_generation_prompt, char *out, int64_t cap, int64_t *len);

/* The tokens of msgs in format t (the text dhsa_chat_apply writes) with
 * vocabulary tok: the template's own markers (<|im_start|>, <|eot_id|>,
 * </s>, ...) become their special tokens, the messages' text is plain text
 * (a "<|im_end|>" or "<s>" a user typed stays text, so a message cannot
 * open or close a turn). The text between special tokens is encoded whole,
 * so a conversation whose messages hold no special text gets the ids of
 * its whole text tokenized with DHSA_TOKENIZE_PARSE_SPECIAL (llama.cpp's).
 * flags: DHSA_TOKENIZE_ADD_BOS / _ADD_EOS only (usually
 * dhsa_tokenizer_default_flags(tok)); any other flag is
 * DHSA_ERR_INVALID_ARG. Messages as dhsa_chat_apply takes them (same
 * errors). Writes at most cap ids; *n_ids is the full count; more than cap
 * is DHSA_ERR_INVALID_ARG (ids = NULL, cap = 0 sizes the buffer). */
DHSA_API dhsa_status dhsa_chat_tokenize(dhsa_chat_template t, const dhsa_tokenizer *tok, const dhsa_chat_message *msgs,
                                        int64_t n, int add_generation_prompt, unsigned flags, int32_t *ids, int64_t cap,
                                        int64_t *n_ids);

/* The ids that end a model's turn in format t with vocabulary tok: the
 * vocabulary's EOS, then those of the format's end-of-turn texts that are
 * tokens of tok (LLAMA3: <|eot_id|>, <|eom_id|>, <|end_of_text|>; CHATML:
 * <|im_end|>, <|endoftext|>; GEMMA: <end_of_turn>, <eos>; MISTRAL,
 * LLAMA2, NONE: </s>), each once. Writes at most cap ids; *n is the full
 * count; more than cap is DHSA_ERR_INVALID_ARG. */
DHSA_API dhsa_status dhsa_chat_stop_ids(dhsa_chat_template t, const dhsa_tokenizer *tok, int32_t *ids, int cap, int *n);

#ifdef __cplusplus
}
#endif
#endif /* DHSA_TOKENIZER_H */
