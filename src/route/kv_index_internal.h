/* kv_index_internal.h: what a session needs of the decode index beyond
 * include/dhsa.h (never installed): undoing the appends of a failed eval.
 *
 * A session marks each layer's index before an eval and, when the eval
 * fails, rewinds it to the mark, so that the index describes exactly the
 * keys committed before the call (include/dhsa.h, dhsa_session_eval); and
 * a state comparison for the tests of truncation.
 * Tested by tests/test_session_fail.c and tests/test_kv_index.c.
 */
#ifndef DHSA_KV_INDEX_INTERNAL_H
#define DHSA_KV_INDEX_INTERNAL_H

#include "core/internal.h"

/* Remembers the index's current length. */
void dhsa__kv_index_mark(dhsa_kv_index *ix);

/* Back to the marked length, as if nothing had been appended since:
 * dhsa_kv_index_truncate to it (without the busy check: the session owns
 * the index). k [1, Hkv, >= marked length, d] are the keys appended before
 * the mark (the session's cache): the recent keys, the open chunk's sums
 * and, LEARNED, the predictor's rows of the last 2w - 1 keys are recomputed
 * from them, with the bits the appends gave them (each is a function of its
 * own keys, in a fixed order), so later appends and routes give what they
 * would have given without the undone appends. */
dhsa_status dhsa__kv_index_rewind(dhsa_kv_index *ix, const dhsa_tensor *k);

/* Context parallelism (docs/dist.md): the rank that appended keys sends
 * the others what changed, so that every rank holds the same index. A
 * delta from chunk c0 (the chunk count before the append) holds the
 * scalars, the chunks closed since c0 (starts, decided, pooled, spread),
 * the open chunk's sums, the recent-keys ring, the score ring and the
 * scores the append made (kept for truncation): O(new chunks x Hkv x d +
 * ring + appended keys), no cached keys. Reading it into an index
 * that held the same state at c0 gives, bit for bit, the index that
 * made it. LEARNED boundaries are not carried (their predictor rows are
 * not in the delta): the session refuses them. */
size_t dhsa__kv_index_delta_bytes(const dhsa_kv_index *ix, int64_t c0);
void dhsa__kv_index_delta_write(const dhsa_kv_index *ix, int64_t c0, void *buf);
dhsa_status dhsa__kv_index_delta_read(dhsa_kv_index *ix, const void *buf, size_t bytes);

/* For tests: 0 when the two indexes (same parameters and sizes) hold the
 * same state, every field a later append or route reads (length, chunk
 * starts, decisions and summaries, the open chunk's sums, the ring of recent
 * keys, the score ring and running statistics, LEARNED's predictor rows),
 * bit for bit; otherwise 1 and the first difference in why. */
int dhsa__kv_index_diff(const dhsa_kv_index *a, const dhsa_kv_index *b, char *why, size_t cap);

#endif
