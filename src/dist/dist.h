/* dist.h: context parallelism (docs/dist.md) as the session sees it: one
 * rank's part of a sequence split over R ranks that talk through the
 * dhsa_dist transport (include/dhsa.h), behind a per-layer call.
 *
 * The session (src/model/session.c) owns the weights' forward pass and the
 * KV cache; this module owns who holds which position, the exchanges, the
 * merge of partial attentions (dhsa_attn_merge) and every buffer they use,
 * sized at create from the plan (dhsa__dist_plan) and never grown.
 *
 * An eval:
 *   dhsa__dist_begin(d, len, ids, n, ...)  -> the rows this rank runs
 *   for each layer: q, k, v of those rows into the session's buffers, then
 *     dhsa__dist_layer(d, &layer)           (stores this rank's K/V, attends)
 *   dhsa__dist_end(d, logits)              (shares the logits)
 * A rank may have no rows in a prefill: it still calls dhsa__dist_layer for
 * every layer (the exchanges need every rank).
 * Tested by tests/test_dist.c (mpirun) and tests/test_attn_merge.c.
 */
#ifndef DHSA_DIST_H
#define DHSA_DIST_H

#include "dhsa.h"
#include "route/rest.h"

typedef struct dhsa__dist dhsa__dist;

/* Whether params p split the sequence between ranks. */
static inline int dhsa__dist_on(const dhsa_session_params *p) { return p->dist && p->dist->size > 1; }

/* Checks p for context parallelism over a context of n_ctx tokens (the
 * transport, what is distributed) and gives this rank's positions: *cap
 * (the most any rank holds, which every rank's cache is sized for). */
dhsa_status dhsa__dist_check(const dhsa_model_info *in, const dhsa_session_params *p, int64_t n_ctx, int64_t *cap);

/* What a rank needs beyond a one-process session of cap positions (the
 * caller's plan of cap tokens in one ubatch): *routing grows by the
 * routing index of the whole context (each rank keeps all of it), *work by
 * the buffers of dhsa__dist_create. rp: the method's router parameters. */
dhsa_status dhsa__dist_plan(const dhsa_model_info *in, const dhsa_session_params *p, const dhsa_router_params *rp,
                            int64_t n_ctx, size_t *routing, size_t *work);

/* The session's forward buffers this module reads and writes (each of the
 * plan's ubatch = cap rows): q [cap][Hq][hk] (post-RoPE), kt [cap][Hkv][hk],
 * vt [cap][Hkv][hv] the rows' new keys and values, att [cap][Hq][hv] the
 * attention output. kv: the cache's base (a placeholder data pointer for
 * routing calls, which read only shapes). */
typedef struct {
    float *q, *kt, *vt, *att;
    void *kv;
} dhsa__dist_buffers;

/* One rank's state for a session of params p (dhsa__dist_on) over n_ctx
 * positions, rp the method's router parameters: every buffer an eval uses
 * (dhsa__dist_plan counted them) comes from one ctx allocation and two
 * page-aligned shard buffers, made here and freed by dhsa__dist_free. */
dhsa_status dhsa__dist_create(dhsa_ctx *ctx, const dhsa_model_info *in, const dhsa_session_params *p,
                              const dhsa_router_params *rp, int64_t n_ctx, const dhsa__dist_buffers *buf,
                              dhsa__dist **out);
void dhsa__dist_free(dhsa__dist *d);
/* An empty sequence again (the session's reset); the statistics too. */
void dhsa__dist_reset(dhsa__dist *d);
const dhsa_dist_stats *dhsa__dist_stats(const dhsa__dist *d);

/* The rows this rank runs for an eval of n tokens ids at positions len..:
 * one token runs on every rank; more are a prefill, each rank running its
 * own positions. exact: the eval ranks its last rows' chunks by their
 * exact attention (the session's call, as in one process: an answering
 * eval's last exact_rows rows, or the decode step right after it). */
typedef struct {
    const int32_t *ids;   /* [n] this rank's tokens */
    const int64_t *pos;   /* [n] their positions */
    int64_t n;            /* 0: none of this prefill's positions are this rank's */
    int logits;           /* this rank computes the last position's logits */
} dhsa__dist_rows;
dhsa_status dhsa__dist_begin(dhsa__dist *d, int64_t len, const int32_t *ids, int64_t n, int want_logits, int exact,
                             dhsa__dist_rows *rows);

/* The next layer of the running eval: its rows (dhsa__dist_rows.n) with
 * q, kt, vt in the buffers. k, v: the layer's cache, [1][Hkv][cap][hd]
 * views; ix: its routing index (DHSA, BLOCK) or NULL (dense). Writes att
 * and adds every attention call to the statistics stats[0] (the eval's)
 * and stats[1]. */
typedef struct {
    dhsa_tensor k, v;
    dhsa_kv_index *ix;
    dhsa_attn_stats *stats[2];
    /* a decode step's carried chunks (route/carry.h; NULL: none): keep
     * [Hkv][DHSA_CARRY_MAX] the previous step's, routed first; carry the
     * same for the next step, the chunks holding carry_share of this one */
    const int64_t *keep;
    int64_t *carry;
    double carry_share;
    /* a sliding-window layer's window (0: none): it attends dense within
     * it, whatever the method (as one process) */
    int64_t window;
    /* the summaries of the chunks a prefill's blocks leave out (route/
     * rest.h; NULL: none): kept in step with ix across the ranks */
    dhsa__rest *rest;
} dhsa__dist_layer_io;
dhsa_status dhsa__dist_layer(dhsa__dist *d, const dhsa__dist_layer_io *io);

/* After the forward pass: st its status. On success every rank gets the
 * logits [n_vocab] (logits: the begin's want_logits) and the positions are
 * committed; a failure cannot be undone across the ranks. */
dhsa_status dhsa__dist_end(dhsa__dist *d, dhsa_status st, float *logits);

#endif
