/* kv_index_internal.h: what a session needs of the decode index beyond
 * include/dhsa.h (never installed): undoing the appends of a failed eval,
 * the deltas that relay an index between the ranks of a context-parallel
 * session, and routing with a chunk mask (a rank's fetch budget).
 *
 * A session marks each layer's index before an eval and, when the eval
 * fails, rewinds it to the mark, so that the index describes exactly the
 * keys committed before the call (include/dhsa.h, dhsa_session_eval); and
 * a state comparison for the tests of truncation.
 * Tested by tests/test_session_fail.c, tests/test_kv_index*.c and
 * tests/test_dist.c.
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

/* Context parallelism with a rank-level fetch budget (docs/dist.md, "A
 * fetch budget per rank"): dhsa_kv_index_route with two additions.
 * allowed [groups][n_chunks] (NULL: every chunk): only the chunks c with
 * allowed[g * n_chunks + c] != 0 are candidates of routed group g; the
 * sinks, the local keys, the open tail and a dense block's keys are read
 * all the same, so an all-zero mask gives exactly the ranges every block
 * reads whatever the candidates. agg [groups][n_chunks] (NULL: none): for
 * every query block and every chunk it may see, agg[g * n_chunks + c] <-
 * log(exp(agg) + w), w the block's estimated attention weight per key of
 * the chunk (the softmax of the same scores the selection ranks by,
 * weighted by the chunks' lengths); start it at -INFINITY, and a chunk no
 * block could see stays there. groups = 1 with share_heads, else Hkv
 * (dhsa__kv_index_groups). */
int64_t dhsa__kv_index_groups(const dhsa_kv_index *ix);
dhsa_status dhsa__kv_index_route_masked(dhsa_ctx *ctx, const dhsa_kv_index *ix, const dhsa_attn_desc *a,
                                        const unsigned char *allowed, double *agg, dhsa_layout **out);

/* For tests: 0 when the two indexes (same parameters and sizes) hold the
 * same state, every field a later append or route reads (length, chunk
 * starts, decisions and summaries, the open chunk's sums, the ring of recent
 * keys, the score ring and running statistics, LEARNED's predictor rows),
 * bit for bit; otherwise 1 and the first difference in why. */
int dhsa__kv_index_diff(const dhsa_kv_index *a, const dhsa_kv_index *b, char *why, size_t cap);

/* dhsa__kv_index_route_masked (agg NULL) with keep as
 * dhsa_kv_index_route_keep's, where the query blocks from row `from` (a
 * block's start) on rank their chunks by a mass the caller worked out:
 * block qb of KV group g by mass[(g gstride + qb - from / q_block)
 * (n_chunks + 1) + c] for chunk c (context parallelism's exact ranking,
 * src/dist: the ranks' parts of dhsa__exact_mass merged). Not share_heads. */
dhsa_status dhsa__kv_index_route_mass(dhsa_ctx *ctx, const dhsa_kv_index *ix, const dhsa_attn_desc *a,
                                      const unsigned char *allowed, int64_t from, const double *mass,
                                      int64_t gstride, const int64_t *keep, dhsa_layout **out);

#endif
