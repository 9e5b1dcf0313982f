/* serve.h: `dhsa serve`'s request parser (tools/serve_req.c), apart from
 * the server (tools/serve.c) so that tests/test_serve.c and
 * fuzz/serve_fuzz.c can drive it without a socket.
 *
 * serve_request_parse reads one JSON body (jansson) of the endpoint kind
 * into a serve_request, checking every field against its range and the
 * limits; whatever is wrong comes back as an OpenAI-style error (message,
 * param) for a 400. Unknown fields, and known ones asking for what dhsa
 * does not do (n > 1, logprobs, tools, logit_bias, ...), are refused, never
 * ignored (docs/server.md lists them). Built only with DHSA_HAVE_SERVE
 * (libmicrohttpd and jansson present, see the Makefile).
 */
#ifndef DHSA_TOOLS_SERVE_H
#define DHSA_TOOLS_SERVE_H

#include <stddef.h>
#include <stdint.h>

#include "dhsa.h"

typedef enum {
    SERVE_REQ_CHAT = 1,       /* POST /v1/chat/completions */
    SERVE_REQ_COMPLETION = 2, /* POST /v1/completions */
    SERVE_REQ_TOKENIZE = 3,   /* POST /tokenize {"content": "...", "add_special": true, "with_pieces": false} */
    SERVE_REQ_DETOKENIZE = 4  /* POST /detokenize {"tokens": [1, 2, 3]} */
} serve_req_kind;

#define SERVE_MAX_STOP 4          /* stop strings, as OpenAI */
#define SERVE_MAX_STOP_BYTES 256  /* bytes of one stop string */
#define SERVE_MAX_MESSAGES 4096
#define SERVE_ATTN_UNSET (-1)

typedef struct {
    int64_t max_tokens;  /* the most max_tokens a request may ask */
    int64_t max_ids;     /* the most token ids in a prompt or /detokenize */
    int64_t n_vocab;     /* ids must be in [0, n_vocab) */
} serve_limits;

typedef struct {
    char *role, *content; /* NUL-terminated, owned */
} serve_message;

typedef struct {
    serve_req_kind kind;
    serve_message *messages;  /* chat: [n_messages] */
    int64_t n_messages;
    char *text;               /* completion prompt / tokenize content (owned, NUL-terminated) */
    int64_t text_len;
    int32_t *ids;             /* completion prompt as ids / detokenize tokens (owned) */
    int64_t n_ids;
    int has_ids;              /* the prompt was given as ids */
    int add_special;          /* tokenize: add BOS as the vocabulary wants (default 1) */
    int with_pieces;          /* tokenize: each id with its piece */
    int stream, include_usage;
    int64_t max_tokens;       /* -1: not given */
    int ignore_eos;           /* EOS (chat: and the end-of-turn ids) neither ends the reply nor is sampled */
    /* sampling: the CLI's defaults unless given */
    double temperature, top_p, min_p, repeat_penalty;
    int64_t top_k, repeat_last_n;
    double presence_penalty, frequency_penalty;
    uint64_t seed;
    int seed_set;
    char *stop[SERVE_MAX_STOP];
    int64_t stop_len[SERVE_MAX_STOP];
    int n_stop;
    int attn;                 /* dhsa_attn_method, or SERVE_ATTN_UNSET: the server's */
    double density;           /* 0: the server's */
    int json;                 /* response_format json_object or json_schema: constrained sampling */
    dhsa_json_schema *json_schema; /* json_schema's schema, compiled (owned); NULL with json: any object */
    char model[128];          /* as asked (any name is accepted: one model is served) */
} serve_request;

typedef struct {
    char message[512];
    char param[64];           /* "" when no one parameter is at fault */
} serve_error;

/* Parses body[0..len) (need not be NUL-terminated) as a request of kind.
 * Returns 0 with *out filled (free it with serve_request_free), or -1 with
 * *err set and *out empty (freeing it is harmless). */
int serve_request_parse(serve_req_kind kind, const char *body, size_t len, const serve_limits *lim,
                        serve_request *out, serve_error *err);
void serve_request_free(serve_request *r);

/* An upper bound of the bytes that parsing body[0..len) takes while it
 * runs (jansson's tree and lexer) and of serve_request_parse's copies out
 * of it, from one pass over the bytes that allocates nothing: the server
 * reserves it against --mem-limit before it parses (docs/server.md).
 * Counts every string, number, array, object and member (n_values covers a
 * member's slot whatever its value); malformed JSON costs no more than the
 * parser's work up to its error, which the same counts bound. */
size_t serve_json_cost(const char *body, size_t len);

#endif
