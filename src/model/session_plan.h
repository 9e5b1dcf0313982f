/* session_plan.h: a session's memory plan and the choices it rests on
 * (src/model/session_plan.c), for src/model/session.c, which allocates
 * what the plan counts.
 */
#ifndef DHSA_SESSION_PLAN_H
#define DHSA_SESSION_PLAN_H

#include "model/model_internal.h"

/* The largest ubatch an automatic plan tries. */
#define DHSA__MAX_UBATCH 512

/* A Q8_0 block stores 32 values as codes of one step, max|x| / 127. The
 * keys of real models have a few channels far larger than the rest
 * (Qwen2.5-0.5B: 120-220 in channels 27-31 and 59-63 of several layers,
 * most of it the K bias, where the other channels are |k| < 10): one such
 * value sets a step of ~1.1 for its whole block and the scores lose ~2
 * logits (first-token KL 6.9 nats against an F32 cache on a 5-token
 * prompt). Those channels are the ones RoPE turns slowest, so they are
 * nearly the same in every key. A Q8_0 cache therefore stores k - c, c a
 * fixed vector per layer and KV head: every score of a query moves by the
 * same q.c, which softmax cancels exactly (attention, and DHSA's chunk
 * ranking, see the same thing). c is the K bias on the channel pairs that
 * RoPE turns by at most KOFF_MAX_TURN radians over the cache (and on
 * channels past n_rot, which it never turns); elsewhere 0. The bias is
 * the model's, so c does not depend on the tokens: a prompt gives the
 * same cache in one ubatch or many, and a failed eval has nothing to undo.
 * Not used with a score softcap (tanh is not shift-invariant) or where
 * the model has no K bias. docs/model.md "KV cache types". */
#define DHSA__KOFF_MAX_HD 1024
#define DHSA__KOFF_MAX_TURN 0.5


/* p with the router's unset fields scaled to the context (the defaults
 * plumbing: dhsa_router_scale) and rest DHSA_REST_HYBRID made 1 (a
 * hybrid model: dhsa__model_hybrid) or 0. Context parallelism runs query blocks of
 * 64 rows. */
dhsa_session_params dhsa__session_resolve(const dhsa_model *m, const dhsa_session_params *p);
/* Whether m interleaves sliding-window layers with global ones. */
int dhsa__model_hybrid(const dhsa_model *m);
/* The router parameters a method runs with. */
dhsa_router_params dhsa__session_router(const dhsa_session_params *p);
/* Whether the method routes through per-layer indexes (DHSA, BLOCK). */
int dhsa__session_uses_index(const dhsa_session_params *p);
/* Whether a session with p stores centred keys (the note above). */
int dhsa__session_keys_centred(const dhsa_model *m, const dhsa_session_params *p);
/* Rows per head of layer l's cache for a context of n_ctx in ubatches of
 * ub (a sliding-window layer's ring: w - 1 + ub; session.c's note). */
int64_t dhsa__session_layer_rows(const dhsa_model *m, const dhsa_session_params *p, int64_t l, int64_t n_ctx, int64_t ub);
/* Bytes of every layer's cache and the rings' backups. */
size_t dhsa__session_cache_bytes(const dhsa_model *m, const dhsa_session_params *p, int64_t n_ctx, int64_t ub);
/* Floats of the forward buffers for a ubatch of ub (session.c's list). */
size_t dhsa__session_act_floats(const dhsa_model_info *in, int64_t ub);

#endif
