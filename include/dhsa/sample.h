/* dhsa/sample.h: choosing the next token: the sampler and sampling
 * constrained to JSON (src/model/sample.c, json_constraint.c;
 * docs/server.md).
 *
 * A section of the public interface: users include <dhsa.h>, which
 * includes every section in order. This file includes the sections it
 * builds on, so it compiles alone too. The rules every call follows
 * (errors, threads, tensors) are at the top of dhsa.h and in dhsa/core.h.
 */
#ifndef DHSA_SAMPLE_H
#define DHSA_SAMPLE_H

#include "tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Sampling (src/model/sample.c)                                            */

/* Sampling. Order: repetition penalty, temperature (0 = greedy: argmax,
 * lowest id on ties), top-k, top-p, min-p, then a draw from the seeded
 * generator. */
typedef struct {
    float temperature;      /* default 0.8; 0 = greedy */
    int64_t top_k;          /* default 40; 0 = off */
    float top_p;            /* default 0.95; 1 = off */
    float min_p;            /* default 0.05; 0 = off */
    float repeat_penalty;   /* default 1.0 (off) */
    int64_t repeat_last_n;  /* tokens of history it looks at (default 64) */
    uint64_t seed;
} dhsa_sampler_params;

typedef struct dhsa_sampler dhsa_sampler;
DHSA_API dhsa_sampler_params dhsa_sampler_default_params(void);
DHSA_API dhsa_status dhsa_sampler_create(const dhsa_sampler_params *p, int64_t n_vocab, dhsa_sampler **out);
DHSA_API void dhsa_sampler_free(dhsa_sampler *s);
/* Picks the next id from logits[n_vocab] (not modified); history is the
 * sequence so far (for the repetition penalty; may be NULL with n = 0).
 * A NaN or +Inf logit, or every logit -Inf, is DHSA_ERR_NONFINITE with a
 * sentence saying which (greedy included): there is no token to pick. */
DHSA_API dhsa_status dhsa_sampler_sample(dhsa_sampler *s, const float *logits, const int32_t *history, int64_t n_history,
                                         int32_t *out);

/* ------------------------------------------------------------------------ */
/* Structured output (src/model/json_constraint.c, docs/server.md)          */

/* Sampling constrained to JSON: a character-level pushdown automaton over
 * JSON text, narrowed by a compiled JSON Schema (a subset, below), and a
 * per-vocabulary table of each token's bytes, so that a token's logit is
 * masked to -Inf when its bytes cannot continue a valid value. What the
 * automaton accepts is always a complete, valid JSON value that validates
 * against the schema once it has ended.
 *
 * Schema subset: type (object, array, string, number, integer, boolean,
 * null, or a list of them), properties, required, additionalProperties
 * (false, true or a schema; with properties only the listed ones are
 * written), items (one schema), minItems, maxItems, minLength, maxLength,
 * enum, const, anyOf and oneOf whose branches begin with different
 * characters (a string and null, say), the boolean schema true, and the
 * annotations title, description, default, examples, $schema, $id,
 * $comment. Any other keyword (pattern, format, minimum, $ref, ...) is
 * refused with DHSA_ERR_UNSUPPORTED naming it and where it is: never
 * ignored. At most 64 properties per object, values nested at most 32
 * deep.
 *
 * The text it accepts: object members in any order, each property at most
 * once, required ones before the closing brace; between tokens at most
 * one whitespace run: " ", "\t", or "\n" and then at most 4 spaces or
 * tabs per object or array open (pretty-printed indentation), nothing
 * after the value's end; numbers with at most 16
 * digits before and after the point and 3 in the exponent; strings valid
 * UTF-8 without control bytes, the escapes of RFC 8259 but \u escapes of
 * surrogates. An enum or const value is written as its compact JSON text
 * (a number as the schema writes it). */
typedef struct dhsa_json_schema dhsa_json_schema;
/* Compiles schema[0..len) (JSON text of a JSON Schema); schema = NULL is
 * "any JSON object" (OpenAI's json_object mode). Bad JSON is
 * DHSA_ERR_FORMAT, a keyword or form outside the subset
 * DHSA_ERR_UNSUPPORTED, a schema no value satisfies (required names not in
 * properties, minItems > maxItems, an empty enum) DHSA_ERR_INVALID_ARG;
 * the error sentence names the keyword and its JSON pointer. At most 1 MiB
 * of text. The result is read-only: share it between constraints. */
DHSA_API dhsa_status dhsa_json_schema_compile(const char *schema, int64_t len, dhsa_json_schema **out);
DHSA_API void dhsa_json_schema_free(dhsa_json_schema *s);

/* Each token's bytes (dhsa_token_to_piece without flags: CONTROL tokens
 * are empty and never allowed), indexed by first byte, made once per
 * tokenizer; read-only, shared by any number of constraints. */
typedef struct dhsa_json_vocab dhsa_json_vocab;
DHSA_API dhsa_status dhsa_json_vocab_create(const dhsa_tokenizer *t, dhsa_json_vocab **out);
DHSA_API void dhsa_json_vocab_free(dhsa_json_vocab *v);

/* One generation's state. s and v must outlive it; v may be NULL for a
 * constraint fed bytes only (then _mask and _accept are
 * DHSA_ERR_INVALID_ARG). One thread at a time. */
typedef struct dhsa_json_constraint dhsa_json_constraint;
DHSA_API dhsa_status dhsa_json_constraint_create(const dhsa_json_schema *s, const dhsa_json_vocab *v,
                                                 dhsa_json_constraint **out);
DHSA_API void dhsa_json_constraint_free(dhsa_json_constraint *c);
/* Back to the start (no text). */
DHSA_API void dhsa_json_constraint_reset(dhsa_json_constraint *c);
/* Advances by bytes[0..n): DHSA_ERR_FORMAT, and the state as it was before
 * the call, when they cannot continue a valid value (the sentence says at
 * which byte). */
DHSA_API dhsa_status dhsa_json_constraint_feed(dhsa_json_constraint *c, const char *bytes, int64_t n);
/* 1 when the text so far is a complete value (ending here is valid). */
DHSA_API int dhsa_json_constraint_can_end(const dhsa_json_constraint *c);
/* 1 when the value is complete and no byte may follow (the generation is
 * over: a caller stops without sampling an end token). */
DHSA_API int dhsa_json_constraint_finished(const dhsa_json_constraint *c);
/* Sets logits[id] = -Inf (logits: [n_vocab] of v) for every id whose bytes
 * cannot continue the text; end_ids[0..n_end) (EOS, end of turn) keep their
 * logits only when dhsa_json_constraint_can_end. *n_allowed (may be NULL):
 * the ids left. No id allowed is DHSA_ERR_UNSUPPORTED (the vocabulary has
 * no token to go on with: nothing to sample). Allocates nothing. */
DHSA_API dhsa_status dhsa_json_constraint_mask(dhsa_json_constraint *c, float *logits, const int32_t *end_ids, int64_t n_end,
                                               int64_t *n_allowed);
/* 1 when token id may come next (what _mask keeps), without the end ids. */
DHSA_API int dhsa_json_constraint_allows(dhsa_json_constraint *c, int32_t id);
/* Advances by the bytes of token id: as _feed (DHSA_ERR_FORMAT when the
 * mask would have removed it; an empty piece is refused too). */
DHSA_API dhsa_status dhsa_json_constraint_accept(dhsa_json_constraint *c, int32_t id);

#ifdef __cplusplus
}
#endif
#endif /* DHSA_SAMPLE_H */
