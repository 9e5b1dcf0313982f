/* niah.h: the library side of `dhsa eval niah` (tools/eval.c): scoring an
 * answer against the needle's number, and placing the needle at a depth.
 * Internal: not in the public header. How the evaluation works:
 * docs/eval.md.
 *
 * Contract:
 *   - Pure functions: no allocation, no I/O, deterministic.
 *   - dhsa__niah_answer_has reads exactly len bytes of answer (NULs are
 *     ordinary bytes; answer may be NULL when len is 0).
 * Tested by tests/test_eval.c (crafted answers, placements).
 */
#ifndef DHSA_EVAL_NIAH_H
#define DHSA_EVAL_NIAH_H

#include <stddef.h>
#include <stdint.h>

#include "dhsa.h"

/* Whether the answer states the needle's number. `number` is the needle's
 * value as ASCII decimal digits (1..32 of them, NUL-terminated; anything
 * else returns -1).
 *
 * The answer is read as a sequence of numbers: a number is a maximal run
 * of ASCII digits that may hold thousands separators (a ',' followed by
 * exactly three digits and then a non-digit, as in "4,821" or
 * "1,234,567") and may end in a decimal part ('.' followed by digits).
 * The answer has the needle when one number without a decimal part has
 * exactly the needle's digits, separators removed. So:
 *   "4821", "is 4821.", "(4821)", "x4821y", "4,821", "-4821" -> 1
 *   "48210", "14821", "482", "4821.5", "4 8 2 1", "48 21", "" -> 0
 * Digits spelled apart by spaces do not count: tokenizers of the models
 * evaluated here write digits without spaces, and "12 4821" must not read
 * as a longer number. Leading zeros are part of the run ("04821" is not
 * 4821). Returns 1 or 0. */
int dhsa__niah_answer_has(const char *answer, int64_t len, const char *number);

/* Where the needle goes: with a haystack of n sentences whose token counts
 * are tokens[0..n), the index k in [0, n] of the sentence boundary
 * (before sentence k; k = n is the end) whose token offset is nearest to
 * depth x (total tokens); ties go to the earlier boundary. depth is
 * clamped to [0, 1]; n = 0 gives 0. */
int64_t dhsa__niah_boundary(const int64_t *tokens, int64_t n, double depth);

/* A growing NUL-terminated text (the prompt builders of niah_prompt.c,
 * ruler.c). Start from {0}; after an allocation failure bad is 1, p is
 * NULL, n is 0 and further calls do nothing. The caller frees p. */
typedef struct {
    char *p;
    size_t n, cap;
    int bad;
} dhsa__text;

void dhsa__text_put(dhsa__text *b, const char *s, size_t k);
void dhsa__text_add(dhsa__text *b, const char *s);

/* Sentences of a text: split after '.', '!' or '?' followed by white
 * space (or the end), and at blank lines; trimmed, white space inside a
 * sentence turned into spaces, empty ones dropped. The sentences point
 * into text, which is modified (NULs written). *out (malloc'd, the caller
 * frees it) holds them; returns their count, or -1 when out of memory
 * (*out NULL then). */
int64_t dhsa__split_sentences(char *text, int64_t len, char ***out);

/* The ids that end an answer to a prompt in format tmpl: EOS, then the
 * template's end-of-turn ids, or BOS for a plain prompt (DHSA_CHAT_NONE: a
 * base model starts a new document). stop has room for 16. */
dhsa_status dhsa__answer_stop_ids(const dhsa_tokenizer *tok, dhsa_chat_template tmpl, int32_t *stop, int *n_stop);

/* The share of the key ranges [lo[s], hi[s]), s < n, that the layout
 * selects for query row `row` of KV head g: 1 with layout NULL (a layer
 * that reads every key), 0 for no keys. dhsa_task_selected's rule, and
 * dhsa_eval_ruler's on a RULER prompt's spans. */
double dhsa__spans_selected(const dhsa_layout *layout, int64_t g, int64_t row, int n, const int64_t *lo,
                            const int64_t *hi);
#endif
