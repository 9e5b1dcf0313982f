/* dhsa/session.h: a session: one sequence through a model (KV cache, routing
 * per layer, eval, batched decode, truncate, reset), its memory plan,
 * context parallelism's transport, and saved state (src/model/session*.c,
 * src/dist; docs/model.md, docs/dist.md, docs/prompt-cache.md).
 *
 * A section of the public interface: users include <dhsa.h>, which
 * includes every section in order. This file includes the sections it
 * builds on, so it compiles alone too. The rules every call follows
 * (errors, threads, tensors) are at the top of dhsa.h and in dhsa/core.h.
 */
#ifndef DHSA_SESSION_H
#define DHSA_SESSION_H

#include "route.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How a session attends. */
typedef enum {
    DHSA_ATTN_DENSE = 0,  /* every causal key */
    DHSA_ATTN_DHSA = 1,   /* content chunks routed by pooled scores */
    DHSA_ATTN_BLOCK = 2,  /* fixed chunks routed the same way (baseline) */
    DHSA_ATTN_STREAM = 3, /* sinks + recent keys (baseline) */
    DHSA_ATTN_ORACLE = 4  /* chunks by their true mass (evaluation only) */
} dhsa_attn_method;
/* "dense", "dhsa", ...; "?" otherwise. */
DHSA_API const char *dhsa_attn_method_name(dhsa_attn_method m);

typedef struct {
    int64_t n_ctx;          /* tokens the KV cache holds; 0 = the trained context */
    int64_t n_ubatch;       /* tokens per prefill step; 0 = the largest <= 512 that
                               fits mem_limit */
    dhsa_type kv_type;      /* DHSA_F16 (default, as llama.cpp), DHSA_F32 or DHSA_Q8_0 (K/V
                               rows quantized to 8-bit blocks of 32 on
                               store, read in place by attention; head
                               dims multiples of 32; not context parallel) */
    size_t mem_limit;       /* the most the process may hold: its peak RSS
                               (VmHWM) stays under it when the plan's total
                               fits (dhsa_mem_plan says what is counted);
                               0 = none */
    dhsa_attn_method attn;  /* default DENSE */
    /* Routing of the sparse methods: budget/density, sinks, local,
     * dense_below, q_block, boundary detection (method and boundary are
     * set from attn: DHSA = SIMILARITY or LEARNED, BLOCK = FIXED). */
    dhsa_router_params router; /* dhsa_router_params_for(0, 0.0625): the length-scaled
                              fields left unset (-1) are scaled to n_ctx when the
                              session is planned or created (dhsa_router_scale);
                              a field set by the caller is kept */
    int logits_all;         /* eval writes logits for every token (default: last) */
    /* Weight products: 0 (default) the fast route, 1 the exact one. Fast:
     * quantized weights (Q8_0 ... IQ4_XS) multiply activations quantized to
     * 8-bit blocks of 32 with integer dot products where the CPU has the
     * kernels (AVX512-VNNI, AVX-VNNI or AVX2); F16/BF16 weights multiply
     * activations rounded to BF16 with vdpbf16ps where the CPU has
     * AVX512-BF16 and a probe finds it pays (DHSA_BF16=on|off|auto); F32
     * weights, and CPUs without the kernels, take the exact route. Exact:
     * weights dequantized to F32, F32 sums (the reference).
     * dhsa_model_routes says what each weight type runs; docs/quant.md the
     * fast route's measured error. */
    int exact;
    /* Called after each ubatch of a prefill (done tokens of total). */
    void (*progress)(void *user, int64_t done, int64_t total);
    void *progress_user;
    /* Called for every layer of every ubatch right after its attention
     * ran, with the call it made: a->q the ubatch's post-RoPE queries
     * [1, n_head, n, hd_k], a->k / a->v the layer's cache up to the last
     * of them [1, n_head_kv, q_pos0 + n - k_pos0, hd] (k_pos0 > 0 only in
     * a sliding-window layer, whose cache is a ring of its last window - 1
     * + n_ubatch positions: row j is position k_pos0 + j), a->o the output
     * (the summaries of the chunks left out merged in: router.rest),
     * a->layout the routing (NULL when dense), a->q_pos0, window, softcap,
     * scale as used. Where a ubatch's last rows rank chunks by their exact
     * attention (router.exact_rows) a routed layer attends in two calls,
     * rows before and the tail, and the hook sees each (a->q the call's
     * rows, a->q_pos0 its first; a->k / a->v up to the ubatch's end).
     * Everything is read-only and valid during the call only. For
     * evaluation and training (attention recall, boundary labels, layout
     * pictures); a nonzero return stops the eval with DHSA_ERR_INVALID_ARG. */
    int (*layer_hook)(void *user, int64_t layer, const dhsa_attn_desc *a);
    void *layer_hook_user;
    /* Context parallelism (docs/dist.md): with dist != NULL and dist->size
     * > 1 the session is one rank of a job; every rank creates its session
     * with the same model and params and makes the same evals with the same
     * ids. Positions are dealt to ranks in stripes of dist_stripe tokens
     * (position p belongs to rank (p / stripe) % size; 0 = contiguous:
     * stripe = ceil(n_ctx / size)); each rank's KV cache holds its own
     * positions only (n_ctx / size of them, rounded up to stripes), and the
     * plan and mem_limit are per rank. A prefill runs each rank's positions
     * through every layer at once (the ubatch is the rank's share); an eval
     * of one token (decode) runs on every rank and merges the ranks'
     * partial attention through the LSE, so the logits are identical on
     * every rank. Dense passes K/V around a ring; DHSA keeps every layer's
     * routing index on every rank (relayed as chunk summaries) and fetches
     * only the selected key ranges. The transport is the caller's
     * (dhsa_dist); no thread of the session calls it. */
    const struct dhsa_dist *dist;
    int64_t dist_stripe;
    /* DHSA and BLOCK, context parallel: a fetch budget per rank, 0 < F <= 1
     * (0, the default: none; the ranks route exactly as one process).
     * Per layer, KV head and other rank q, the rank first chooses which
     * of q's chunks it may fetch: those with the largest estimated
     * attention weight per key summed over its query blocks, while the
     * keys fetched from q (the sinks, local keys and open tail its blocks
     * read anyway included) stay within F x the keys q holds before the
     * rank's last position; then each block routes as before over its
     * own rank's chunks and the chosen ones only. The K/V fetched from q
     * is then at most F of what the rank could see of q's (more only
     * where the fixed parts alone exceed it; dhsa_dist_stats.kv_share_max
     * says), and each KV head fetches its own ranges. F = 1 routes as
     * one process does. Decode moves no K/V and is unchanged. Refused
     * (DHSA_ERR_INVALID_ARG) outside [0, 1], with dense attention, and
     * without dist (one process fetches nothing). docs/dist.md. */
    double dist_fetch_share;
} dhsa_session_params;

DHSA_API dhsa_session_params dhsa_session_default_params(void);

/* The transport of a context-parallel session (dhsa_session_params.dist),
 * implemented by the caller (the CLI's over MPI: tools/dist_mpi.c). Every
 * function is called by every rank in the same order (collective); each
 * returns 0, or nonzero after writing a sentence (at most 255 bytes) into
 * why, and the session's eval then fails with DHSA_ERR_INTERNAL and that
 * sentence (a rank that fails leaves the others waiting: the transport
 * bounds its waits, docs/dist.md "Faults"). Sizes are bytes. */
typedef struct dhsa_dist {
    int rank, size;
    void *user;
    /* recv [size][bytes] = every rank's send [bytes], in rank order */
    int (*allgather)(void *user, const void *send, size_t bytes, void *recv, char *why);
    /* buf [bytes] from rank root to every rank */
    int (*bcast)(void *user, void *buf, size_t bytes, int root, char *why);
    /* send holds send_bytes[q] for rank q, one after another in rank order;
     * recv gets recv_bytes[q] from rank q likewise */
    int (*alltoallv)(void *user, const void *send, const size_t *send_bytes, void *recv, const size_t *recv_bytes,
                     char *why);
    /* starts sending send [send_bytes] to rank + 1 and receiving recv
     * [recv_bytes] from rank - 1 (mod size); ring_wait completes both.
     * Between the two the session computes (the overlap). */
    int (*ring_start)(void *user, const void *send, size_t send_bytes, void *recv, size_t recv_bytes, char *why);
    int (*ring_wait)(void *user, char *why);
} dhsa_dist;

/* Bytes a rank of a context-parallel session received, by kind, summed
 * over its evals since create or reset (zero without dist); the sum over
 * the ranks is what crossed the wire. */
typedef struct {
    double kv;        /* keys and values: the dense ring's shards, DHSA's
                         fetched ranges */
    double index;     /* DHSA: routing-index deltas (chunk summaries) and the
                         range requests; an answering eval's rows ranked
                         exactly: their queries and the merged masses */
    double partial;   /* decode: partial outputs and their LSE; the
                         carried chunks' merged shares */
    double logits;    /* the last row's logits from its rank after a prefill */
    int64_t prefill_layers, decode_layers; /* layer steps that sent them */
    double kv_keys;   /* keys whose K and V were sent (a key: its K and V
                         in every KV head; DHSA with dist_fetch_share, where
                         each head fetches its own, kv / those bytes) */
    /* DHSA prefill: the keys the other ranks held before this rank's last
     * prefill position (what its queries could see of theirs), summed over
     * the other ranks and the prefill layers, and the largest share of
     * them fetched from one rank in one layer (kv bytes from it / its
     * visible keys' bytes: at most dist_fetch_share when that is set and
     * the fixed parts fit) */
    double kv_visible;
    double kv_share_max;
    /* sliding-window layers (gemma2/3): the keys of other ranks' stripes
     * their windows reach (each stripe's last window - 1 at most), in kv
     * and not in kv_keys */
    double kv_window;
} dhsa_dist_stats;

/* Memory of a session and of the process around it, computed before the
 * session allocates anything: total bounds the process's peak resident
 * set (VmHWM) while the session runs, so that a plan whose total fits
 * mem_limit keeps the process under it (tests/test_memlimit.c measures
 * it; docs/model.md, "Memory plan"). What is counted:
 *   - the session's buffers (kv_cache .. routing), as allocated;
 *   - weights: the tensor bytes, counted whole: the mapping's pages become
 *     resident as they are read (check_finite reads them all at load);
 *   - process: everything else the process holds or will hold, the sum of
 *     model_file .. slack below. code and other are measured when the plan
 *     is made (Linux /proc/self); where /proc is missing (measured = 0)
 *     code is a fixed DHSA_PLAN_CODE_FALLBACK and other is 0 (nothing the
 *     caller holds is known).
 * Not counted (so not bounded): memory the caller allocates after the plan
 * beyond the slack's margin, memory it allocated but has not yet written
 * (not resident when the plan measures it), and a model opened over the
 * caller's own buffer is counted twice (weights, and other or code). */
typedef struct {
    int64_t n_ctx, n_ubatch;
    size_t weights;          /* tensor bytes (mapped from the file) */
    size_t kv_cache;         /* K and V of every layer for n_ctx tokens */
    size_t activations;      /* per-ubatch buffers and logits */
    size_t attn_workspace;   /* attention scratch at n_ctx */
    size_t matmul_workspace; /* weight-product scratch */
    size_t routing;          /* indexes and layouts of the sparse methods */
    size_t process;          /* model_file + model_heap + code + other + stacks + slack */
    size_t model_file;       /* the model's file besides its tensors (header,
                                metadata, tensor table, padding, to the page),
                                mapped or copied: resident once read */
    size_t model_heap;       /* the model's heap, counted by the library: the
                                tokenizer's tables, the GGUF index and
                                strings, the model and its F32 vectors, each
                                block as glibc's malloc rounds it */
    size_t code;             /* every other mapped file at its whole mapped
                                size: the program, the C library, other
                                models (measured; a mapping's resident pages
                                cannot exceed its size) */
    size_t other;            /* anonymous memory resident when the plan is
                                made besides the model's heap: the caller's
                                buffers, other sessions, stacks so far
                                (measured: RssAnon + RssShmem - model_heap) */
    size_t stacks;           /* the ctx's threads, caller included, times
                                DHSA_PLAN_STACK_ALLOWANCE: the stack and the
                                malloc arena each may touch during an eval */
    size_t slack;            /* the allocator's rounding of the session's
                                buffers (a page each; the KV cache to 2 MiB,
                                whole huge pages) + DHSA_PLAN_HEAP_MARGIN for
                                small allocations after the plan (stdio
                                buffers, sentences, routing temporaries); with
                                transparent huge pages "always", 4 MiB more
                                (the cache's header page and the heap's top
                                may each become a whole huge page) */
    int measured;            /* 1: code and other were read from /proc/self */
    size_t total;            /* the sum of the session's buffers, weights and
                                process: the peak RSS the plan allows */
} dhsa_mem_plan;

/* The allowances of dhsa_mem_plan (bytes). */
#define DHSA_PLAN_STACK_ALLOWANCE ((size_t)128 << 10)
#define DHSA_PLAN_HEAP_MARGIN ((size_t)256 << 10)
#define DHSA_PLAN_CODE_FALLBACK ((size_t)16 << 20)

/* Plans a session for the ctx's threads. With n_ubatch = 0 it picks the
 * largest ubatch (a power of two <= 512) that fits mem_limit; when nothing
 * fits it fails with DHSA_ERR_MEMORY_BUDGET and a sentence saying what
 * would (a smaller ubatch or --ctx, F16 K/V, a larger limit). A context
 * longer than the trained one is allowed (the caller warns). The measured
 * parts make two plans differ when the process's memory changed between
 * them; dhsa_session_create plans again and checks that one. */
DHSA_API dhsa_status dhsa_session_plan(const dhsa_ctx *ctx, const dhsa_model *m, const dhsa_session_params *p,
                                       dhsa_mem_plan *out);

typedef struct dhsa_session dhsa_session;

/* One sequence: KV cache, activations and routing state, allocated from
 * ctx (whose budget is set from mem_limit minus the weights when that is
 * tighter). The model must outlive the session. One eval or reset at a
 * time: one that would overlap another on the same session (another
 * thread's, or a call from the eval's own layer hook or progress callback)
 * is DHSA_ERR_BUSY and does nothing; sessions on one model or one ctx may
 * run at once ("Threads"). */
DHSA_API dhsa_status dhsa_session_create(dhsa_ctx *ctx, const dhsa_model *m, const dhsa_session_params *p,
                                         dhsa_session **out);
DHSA_API void dhsa_session_free(dhsa_session *s);
DHSA_API const dhsa_mem_plan *dhsa_session_get_plan(const dhsa_session *s);
/* Tokens in the cache. */
DHSA_API int64_t dhsa_session_length(const dhsa_session *s);
/* Empties the cache (and the routing indexes, made anew). DHSA_ERR_BUSY
 * while an eval runs on it (nothing done); DHSA_ERR_OUT_OF_MEMORY or
 * _MEMORY_BUDGET when the indexes could not be made again (the cache is
 * empty, and evals are refused until a reset succeeds). */
DHSA_API dhsa_status dhsa_session_reset(dhsa_session *s);
/* Keeps the first n tokens of the cache (0 <= n <= length) and drops the
 * rest, so that the next eval continues from position n: a prompt cache
 * reuses a shared prefix this way (dhsa serve). The routing indexes are
 * rebuilt from the kept keys in the cache (no forward pass: O(n) per
 * layer), so evals after it give what they would give had only those n
 * tokens been evaluated. n = length keeps every token (and, as any n,
 * drops the chunks the last decode step carries, dhsa_router_params.carry:
 * the next eval routes as after a prefill); n outside [0, length] is
 * DHSA_ERR_INVALID_ARG; DHSA_ERR_BUSY while an eval runs on it (nothing
 * done). When the indexes cannot be made again (DHSA_ERR_OUT_OF_MEMORY or
 * _MEMORY_BUDGET) the cache is left empty and evals are refused until a
 * dhsa_session_reset succeeds, as after a failed reset. */
DHSA_API dhsa_status dhsa_session_truncate(dhsa_session *s, int64_t n);
/* Runs ids[0..n) at positions length .. length + n - 1 in ubatches and
 * appends them to the cache. logits: [n][n_vocab] when logits_all, else
 * [n_vocab] for the last token; NULL skips the output projection where it
 * can; n = 0 with logits != NULL is DHSA_ERR_INVALID_ARG (there are no
 * logits of this call to write: the buffer would keep an earlier call's).
 * Ids out of range are DHSA_ERR_INVALID_ARG, more than n_ctx tokens
 * DHSA_ERR_TOO_LARGE, both before anything runs.
 * A failed eval, wherever it fails (those checks, or in any ubatch: the
 * budget, a layer hook that stops it, ...), adds nothing, for every
 * attention method: the cache keeps the tokens committed before the call
 * (dhsa_session_length is unchanged), none of the call's tokens stay, not
 * even those of its ubatches that ran, and the routing indexes go back to
 * the committed tokens; the next eval works and gives, bit for bit, what
 * it would have given had the failed call never been made. What the
 * failed call wrote into logits and reported through progress means
 * nothing. (Only if that undoing itself failed, a bug, is the eval
 * DHSA_ERR_INTERNAL, and then evals are refused until dhsa_session_reset.) */
DHSA_API dhsa_status dhsa_session_eval(dhsa_session *s, const int32_t *ids, int64_t n, float *logits);

/* One decode step for n sessions at once: ids[t] is evaluated as the next
 * token of ss[t] (at its own length), and logits [n][n_vocab] (NULL: none)
 * row t is ss[t]'s. The weight products run once over the n rows (one
 * pass over the weights instead of n), in ss[0]'s buffers and on its ctx;
 * each session's cache, routing and attention are its own (on its own
 * ctx). The sessions must be distinct, on one model, n at most ss[0]'s
 * ubatch (DHSA_ERR_TOO_LARGE). Each session's logits equal those of its
 * own one-token eval up to the rounding of a product over more rows (the
 * weight products block by rows), not bit for bit. A failure adds nothing
 * to any of them (as dhsa_session_eval); one of them busy is DHSA_ERR_BUSY
 * and nothing is done. dhsa serve batches its slots' decode steps so. */
DHSA_API dhsa_status dhsa_session_eval_batch(dhsa_session *const *ss, int64_t n, const int32_t *ids, float *logits);

/* What attention really did: a sparse method is never dense without it
 * showing here. Sums over layer calls (layers x ubatches) and, for keys,
 * over query rows x KV heads as in dhsa_layout_stats. */
typedef struct {
    int64_t layer_calls;  /* attention calls */
    int64_t dense_calls;  /* calls without a layout: every causal key (the
                             dense method, sliding-window layers) */
    int64_t blocks;       /* query blocks x KV heads of the routed calls */
    int64_t dense_blocks; /* of them, dense: the block sees fewer keys than
                             dense_below, or its budget covers them all */
    double selected;      /* keys attended */
    double available;     /* causal keys the rows could attend to */
    double density;       /* selected / available (1 when none) */
    double summaries;     /* chunk summaries attended besides the selected
                             keys (dhsa_router_params.rest: one per chunk a
                             block left out), summed like selected */
} dhsa_attn_stats;
/* last_eval: the most recent dhsa_session_eval (zero if it failed: a failed
 * eval adds nothing, here as in the cache); total: every eval since the
 * session was created or reset.
 * Either may be NULL. */
/* The routing the session runs (unset fields scaled to its n_ctx; method
 * and boundary set from attn), e.g. to print it. */
DHSA_API dhsa_status dhsa_session_get_router(const dhsa_session *s, dhsa_router_params *out);
DHSA_API dhsa_status dhsa_session_get_stats(const dhsa_session *s, dhsa_attn_stats *last_eval, dhsa_attn_stats *total);
/* Context parallelism: what this rank received (dhsa_dist_stats above). */
DHSA_API dhsa_status dhsa_session_get_dist_stats(const dhsa_session *s, dhsa_dist_stats *out);

/* Saved state (a prompt cache: docs/prompt-cache.md). dhsa_session_save
 * writes the session's state to path: the n_ids = dhsa_session_length ids
 * its evals took, in order (the caller keeps them: the session does not),
 * the logits after the last of them ([n_vocab], or NULL: not stored), the
 * K and V rows of those positions only, and what decides them: a hash of
 * the model file, the KV type, the attention method and router
 * parameters (a learned predictor's weights), --exact, the CPU kernels and
 * weight routes, the ubatch, the RoPE frequencies and Q8_0 key offsets
 * (these follow from the context: a session with another n_ctx loads the
 * state when they agree). The routing indexes are not stored: a load makes
 * them again from the keys (O(len) per layer, no forward pass). The file is
 * written to a temporary name next to path and renamed over it when
 * complete; on failure path is untouched. Context-parallel sessions are
 * refused (DHSA_ERR_UNSUPPORTED); DHSA_ERR_BUSY as dhsa_session_eval.
 *
 * dhsa_session_load reads such a file into s: on success s holds the
 * state, bit for bit as the saving session held it (its next evals give
 * what the saving session's would have), ids[0..*n_ids) are the tokens and,
 * when *has_logits, logits [n_vocab] the logits after the last (logits
 * NULL: not written). A file that does not fit the session (another model
 * or option) is DHSA_ERR_INVALID_ARG with the reason; more tokens than the
 * session's context or than cap is DHSA_ERR_TOO_LARGE (*n_ids says how
 * many); a file that is not a state, truncated, of another version or
 * corrupt (a checksum covers every byte) is DHSA_ERR_FORMAT
 * (_UNSUPPORTED for another version); a missing file DHSA_ERR_IO. Those
 * found in the header and sizes, checked before anything is read into
 * the session, leave it as it was; a corrupt payload or a read error
 * leaves it empty (as after dhsa_session_reset). To reuse a state for a
 * prompt that starts with its tokens: load, dhsa_session_truncate to the
 * common prefix when shorter, eval the rest. _memory reads the same bytes
 * from data [size]. */
DHSA_API dhsa_status dhsa_session_save(dhsa_session *s, const int32_t *ids, int64_t n_ids, const float *logits,
                                       const char *path);
DHSA_API dhsa_status dhsa_session_load(dhsa_session *s, const char *path, int32_t *ids, int64_t cap, int64_t *n_ids,
                                       float *logits, int *has_logits);
DHSA_API dhsa_status dhsa_session_load_memory(dhsa_session *s, const void *data, size_t size, int32_t *ids, int64_t cap,
                                              int64_t *n_ids, float *logits, int *has_logits);

#ifdef __cplusplus
}
#endif
#endif /* DHSA_SESSION_H */
