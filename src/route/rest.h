/* rest.h: the keys a sparse layout leaves out, summarised per chunk
 * (dhsa_router_params.rest, include/dhsa/route.h; docs/dhsa.md, "The rest
 * of the keys, summarised").
 *
 * Why: a routed call reads its budget's keys exactly and drops the rest, so
 * each head's softmax is renormalised over the keys it kept. A head whose
 * attention is spread over the whole context (gemma-3's global layers)
 * then puts on the kept keys the weight the dropped ones held, and the
 * model's answer derails though the needle was read. Here every chunk a
 * query block does not read is one more key: its mean key, its mean value,
 * and a bias of log(its keys), so that it weighs e^(q.mean) per key, the
 * first-order estimate of what its keys held (Jensen: a lower bound of
 * their sum). The attention over these summaries and the sparse attention
 * are merged exactly through their log-sum-exp (dhsa_attn_merge).
 *
 * A session keeps one dhsa__rest per routed layer, in step with the
 * layer's decode index (dhsa__rest_sync before each routed call of an eval
 * of more than one token), and after such a call's attention (which wrote
 * its lse) merges the summaries of the chunks its blocks left out
 * (dhsa__rest_attend). Decode steps do not (the choice and what was
 * measured of it: docs/dhsa.md, "The rest of the keys, summarised").
 * Tested by tests/test_rest.c.
 */
#ifndef DHSA_ROUTE_REST_H
#define DHSA_ROUTE_REST_H

#include "core/internal.h"

typedef struct dhsa__rest dhsa__rest;

/* The most chunks an index over `capacity` keys may close with rp (the
 * index's own bound: capacity / its shortest chunk + 2). */
int64_t dhsa__rest_max_chunks(const dhsa_router_params *rp, int64_t capacity);

/* Exact bytes dhsa__rest_create allocates for max_chunks chunks of Hkv
 * heads (keys of dk, values of dv dims); summaries in F32 when f32, else
 * F16. */
size_t dhsa__rest_bytes(int64_t Hkv, int64_t dk, int64_t dv, int64_t max_chunks, int f32);

/* An empty summary store, allocated from ctx (held to its budget). */
dhsa_status dhsa__rest_create(dhsa_ctx *ctx, int64_t Hkv, int64_t dk, int64_t dv, int64_t max_chunks, int f32,
                              dhsa__rest **out);
void dhsa__rest_free(dhsa__rest *r);

/* Brings the summaries in step with the chunks [starts[c], starts[c + 1])
 * for c < nc (an index's closed chunks, dhsa_kv_index_chunks): chunks whose
 * bounds are unchanged keep their summaries, the others (new chunks, or
 * chunks a truncation reopened) are made from the keys k and values v
 * ([1, Hkv, >= starts[nc], dk|dv], the session's cache, any type
 * dhsa_attention reads), means summed in double. O(keys of the new
 * chunks x Hkv x (dk + dv)). */
dhsa_status dhsa__rest_sync(dhsa__rest *r, const int64_t *starts, int64_t nc, const dhsa_tensor *k,
                            const dhsa_tensor *v);

/* The first of the chunks [starts[c], starts[c + 1]), c < nc, whose
 * summary dhsa__rest_sync would make again (new, or its bounds moved);
 * nc when none. */
int64_t dhsa__rest_stale(const dhsa__rest *r, const int64_t *starts, int64_t nc);

/* dhsa__rest_sync's summaries of chunks [from, to) (from <=
 * dhsa__rest_stale, to <= nc) from the sums of their keys and values:
 * sums [to - from][Hkv][dk + dv] in double, keys first (src/dist: each
 * rank adds its own keys', the ranks' parts summed in rank order). The
 * summaries end at chunk to. */
dhsa_status dhsa__rest_set(dhsa__rest *r, const int64_t *starts, int64_t nc, int64_t from, int64_t to,
                           const double *sums);

/* Drops the summaries of chunks that reach past key len (a truncation or an
 * undone eval rewrites the keys from len on). */
void dhsa__rest_forget(dhsa__rest *r, int64_t len);

/* The summaries so far (chunks), for tests. */
int64_t dhsa__rest_chunks(const dhsa__rest *r);

/* After the routed call a (causal, its layout lay, its o and lse [1, Hq,
 * Lq, 1] F32 written by dhsa_attention): per (KV head, query block), the
 * chunks that end at or before the block's first row and share no key with
 * the block's ranges are attended as summaries, and the result is merged
 * into a's o and lse. o2 [Lq][Hq][dv] and lse2 [Lq][Hq] are the caller's
 * scratch (F32). Nothing is merged when no block leaves a chunk out.
 * *summaries (may be NULL) gets the summaries attended, summed over (KV
 * head, query row) as dhsa_attn_stats counts keys. */
dhsa_status dhsa__rest_attend(dhsa_ctx *ctx, const dhsa__rest *r, const dhsa_attn_desc *a, const dhsa_layout *lay,
                              float *o2, float *lse2, double *summaries);

#endif
