/* dhsa/route.h: DHSA routing: prefill routing (dhsa_route and its
 * parameters), the learned boundary predictor and its training, and the
 * decode-time index beside the KV cache (src/route).
 *
 * A section of the public interface: users include <dhsa.h>, which
 * includes every section in order. This file includes the sections it
 * builds on, so it compiles alone too. The rules every call follows
 * (errors, threads, tensors) are at the top of dhsa.h and in dhsa/core.h.
 */
#ifndef DHSA_ROUTE_H
#define DHSA_ROUTE_H

#include "attn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* DHSA routing (prefill)                                                    */

typedef enum {
    DHSA_BOUNDARY_FIXED = 0,      /* chunks of `chunk` keys (block-sparse baseline) */
    DHSA_BOUNDARY_SIMILARITY = 1, /* training-free: change of the mean key (default) */
    DHSA_BOUNDARY_LEARNED = 2     /* the DHSA boundary predictor (dhsa_predictor) */
} dhsa_boundary;

typedef enum {
    DHSA_ROUTE_DHSA = 0,   /* chunks scored against the query block (score_mode),
                              budget filled by score;
                              with FIXED boundaries this is the block-sparse baseline */
    DHSA_ROUTE_STREAM = 1, /* sinks + the most recent keys (StreamingLLM) */
    DHSA_ROUTE_ORACLE = 2  /* chunks ranked by their true attention mass
                              (costs a dense pass: evaluation only) */
} dhsa_route_method;

/* How DHSA scores a chunk c (n keys, per KV head) for a query block (its
 * rows r and the group's query heads h; softmax scale s). */
typedef enum {
    DHSA_SCORE_POOLED = 0, /* q~ . k~: the block's queries summed, / sqrt(rows)
                              and averaged over heads, against the chunk's
                              keys summed / sqrt(n) (published) */
    DHSA_SCORE_MOMENTS = 1, /* s q_mean . k_mean + s^2/2 (q*q)_mean . k_var, means
                              over the block's rows and heads and the chunk's keys,
                              k_var the keys' variance per dimension: the second-
                              order (Gaussian) estimate of the rows' mean
                              log(mean over the chunk's keys of exp(s q.k)), the
                              attention weight per key that a key budget buys,
                              its variance term v capped at 2 sqrt(v ln 2n) for
                              a chunk of n keys (about the largest of 2n
                              Gaussian draws: docs/dhsa.md, "The variance
                              term, capped") (default) */
    DHSA_SCORE_HEADS = 2,  /* MOMENTS per query head of the group (the head's
                              mean row, not the heads' mean), turned into the
                              share of that head's estimated attention one key
                              of the chunk holds (a softmax over the block's
                              candidate chunks, weighted by their lengths),
                              summed over the group's heads: a head that
                              retrieves is not averaged away by the others.
                              G times MOMENTS' scoring work; not with
                              share_heads */
    DHSA_SCORE_BOUND = 3,  /* per query head h, the largest s q_h . k any key
                              of the chunk can reach, from the keys' per-
                              dimension range (sum over x of the larger of
                              q_x max_x and q_x min_x; Quest's page bound),
                              q_h the mean of the block's rows (exact for one
                              row: decode); then as HEADS, the heads' shares
                              of a softmax of the bounds over the block's
                              candidate chunks, summed: a chunk holding one
                              key a head wants is not diluted by the rest of
                              the chunk. Not with share_heads */
    DHSA_SCORE_ROWS = 4    /* per query head h and scored row r of the block,
                              e(c) = s q_hr . k_mean(c), turned into the share of
                              that row's estimated attention one key of chunk c
                              holds (a softmax over the block's candidate
                              chunks, weighted by their lengths), summed over
                              the rows and the group's heads (as a log): a row
                              that retrieves is not averaged away by the block's
                              other rows, nor a head by the group's other heads.
                              Scored rows: score_rows of them, the block's last
                              row and then every ceil(q_block / score_rows)-th
                              row before it (0: every row). On real pretrained
                              models the query rows of one block differ so much
                              that their mean row finds a needle that one row
                              wants in 0.52 of the cases that matter, these
                              shares in 0.98 (docs/dhsa.md, "Real pretrained
                              models"), but end to end at 4K it answered no
                              more pass keys and lost fidelity, so MOMENTS
                              stays the default. Not with share_heads */
} dhsa_chunk_score;

/* The learned boundary predictor (DHSA). Input: the keys of all KV heads
 * of one token concatenated (C = Hkv * d), over a window of 2w tokens
 * [t - w, t + w) around a candidate boundary t (a chunk would start at t;
 * rows outside the sequence are zeros). Network, all F32:
 *   Q, K, V = X Wq + bq, X Wk + bk, X Wv + bv          X, Q, K, V [2w][C]
 *   H = LayerNorm(X + softmax(Q K^T / sqrt(C)) V)      gamma, beta [C], eps 1e-5
 *   l = mean of H[0, w), r = mean of H[w, 2w)
 *   f = [l, r, |l - r|, l * r, cos(l, r)]              [4C + 1]
 *   p = sigmoid(ReLU(f W1 + b1) . w2 + b2)              W1 [4C+1][hidden]
 * The file format (docs/predictor.md): "DHSAPRD1", u32 version 1, u32 C,
 * u32 w, u32 hidden, u32 reserved 0, then Wq [C][C] (row = input), bq,
 * Wk, bk, Wv, bv, gamma, beta, W1 [4C+1][hidden], b1 [hidden], w2 [hidden],
 * b2 [1] as little-endian F32, then a u32 CRC-32 of every byte before it. */
typedef struct dhsa_predictor dhsa_predictor;

/* Reads a predictor file; every size is checked against the file before
 * use, every weight must be finite, the CRC must match. */
DHSA_API dhsa_status dhsa_predictor_load(const char *path, dhsa_predictor **out);
DHSA_API dhsa_status dhsa_predictor_load_memory(const void *data, size_t size, dhsa_predictor **out);
/* Writes the file through a temporary in path's folder, renamed over path
 * when complete (docs/files.md): a reader of the old file keeps it, and a
 * failure leaves the old file untouched. */
DHSA_API dhsa_status dhsa_predictor_save(const dhsa_predictor *pr, const char *path);
/* Random weights (Xavier-like, fixed seed): tests and training starts. */
DHSA_API dhsa_status dhsa_predictor_create_random(int64_t C, int64_t w, int64_t hidden, uint64_t seed,
                                                  dhsa_predictor **out);
DHSA_API void dhsa_predictor_free(dhsa_predictor *pr);
DHSA_API int64_t dhsa_predictor_width(const dhsa_predictor *pr);  /* C */
DHSA_API int64_t dhsa_predictor_window(const dhsa_predictor *pr); /* w */
/* Boundary probabilities p[t] for t in [0, L) of batch b of k [B, Hkv, L, d]
 * (p[0] = 0: nothing starts before the first key). Hkv * d must equal C. */
DHSA_API dhsa_status dhsa_predictor_score(dhsa_ctx *ctx, const dhsa_predictor *pr, const dhsa_tensor *k, int64_t b,
                                          float *p);

/* ------------------------------------------------------------------------ */
/* Predictor training (src/route/predictor_train.c, docs/predictor.md)      */

/* Soft boundary labels from dense attention (the published recipe). For a
 * candidate c with window w, compare the attention mass that the queries
 * at positions >= c + w put on the keys [c - w, c) with the mass on
 * [c, c + w), summed over query heads: r = max / min, and
 * y = sigmoid(2 * (log r - log 2)) (r = 1 gives 0.2, r = 2 gives 0.5).
 *
 * Step 1, once per attention call (e.g. from a session's layer_hook, per
 * ubatch): adds the mass that a's queries put on each key, by the query's
 * distance, to mass [n_keys][2w]: mass[j * 2w + d - 1] for d in 1 .. 2w - 1
 * is the mass the query at position j + d puts on key j, mass[j * 2w +
 * 2w - 1] that of all queries at j + 2w or later (queries at or before j
 * are not counted). a: q [1, Hq, Lq, hd] at positions q_pos0 .., k [1,
 * Hkv, Lk, hd] (any type and strides), scale (0 = 1/sqrt(hd)), softcap,
 * causal, window as in dhsa_attn_desc; dense attention is recomputed here
 * in double with an explicit softmax per query row (a->layout is ignored;
 * masks and biases are refused). Lk and q_pos0 + Lq must be <= n_keys.
 * The result does not depend on the ctx's threads. Workspace from ctx:
 * (Hq * Lq * hd + Hkv * Lk * hd + (min(16, Lq) * 2w + threads) * Lk)
 * doubles. */
DHSA_API dhsa_status dhsa_boundary_mass_add(dhsa_ctx *ctx, const dhsa_attn_desc *a, int64_t w, double *mass,
                                            int64_t n_keys);
/* Step 2, once all n_keys queries were added: y[c] for c in [0, n_keys)
 * (and log r in log_ratio[c], may be NULL). A candidate is labelled when
 * its windows hold no key before `sink` (the first keys draw attention
 * whatever the content: sink 1 leaves out BOS) and at least w queries
 * follow it: c - w >= sink and c + 2w <= n_keys; others get y = -1. A zero
 * mass on one side (a sliding window) gives log r = 50; on both sides 0. */
DHSA_API dhsa_status dhsa_boundary_labels(const double *mass, int64_t n_keys, int64_t w, int64_t sink, float *y,
                                          float *log_ratio);

/* One sequence of training data for one layer. */
typedef struct {
    const float *keys; /* [n][C]: token t's post-RoPE keys, KV heads
                          concatenated (head g at g * hd), as
                          dhsa_predictor_score reads them */
    const float *y;    /* [n]: label of candidate t in [0, 1]; < 0 = none */
    int64_t n;
    int64_t split;     /* candidates with t + w <= split train, those with
                          t - w >= split validate, the rest (their window
                          crosses the split) are left out */
} dhsa_train_seq;

typedef struct {
    int64_t step;
    double train_loss; /* mean focal loss over a fixed subset of at most
                          8192 training samples */
    double val_loss;   /* mean over all validation samples */
} dhsa_train_point;

typedef struct {
    double lr;                /* Adam step (default 1e-4) */
    double beta1, beta2, eps; /* Adam (0.9, 0.999, 1e-8) */
    double gamma;             /* focal exponent (default 2) */
    double pos_weight;        /* weight of the positive term (default 1.3) */
    int64_t batch;            /* samples per step (default 64) */
    int64_t steps;            /* (default 2000) */
    int64_t eval_every;       /* a progress point every N steps (default 100;
                                 0 = only before and after) */
    uint64_t seed;            /* minibatch order (shuffled epochs) */
    void (*progress)(void *user, const dhsa_train_point *pt);
    void *progress_user;
} dhsa_train_params;

typedef struct {
    int64_t n_train, n_val;      /* samples */
    double train_pos, val_pos;   /* share of samples with y >= 0.5 */
    double val_y_mean;
    dhsa_train_point first;      /* before the first step */
    dhsa_train_point last;       /* after the last, with the F32 weights
                                    the predictor now holds */
    double const_p;              /* the best constant prediction on the
                                    training samples, */
    double val_loss_const;       /* and its validation loss: the floor a
                                    predictor that learned nothing reaches */
    double val_loss_floor;       /* the validation loss of a predictor that
                                    knew every label (the best p for each
                                    y): the part no predictor removes */
    int64_t tp, fp, fn, tn;      /* validation, (p >= 0.5) vs (y >= 0.5) */
    double precision, recall, f1; /* 0 where undefined */
    double auc;                  /* ROC AUC of p for y >= 0.5 (validation) */
    double seconds;
} dhsa_train_report;

DHSA_API dhsa_train_params dhsa_train_default_params(void);
/* Trains pr in place (from its current weights, e.g. those of
 * dhsa_predictor_create_random) on the candidates of seqs[0 .. n_seqs):
 * each sample is the window of 2w keys around t (as in
 * dhsa_predictor_score) and its label; focal BCE (docs/predictor.md),
 * Adam on shuffled minibatches, hand-written backprop in double; the
 * weights are rounded to F32 at the end. Needs at least one training and
 * one validation sample; keys must be finite, labels <= 1. Deterministic
 * for a seed, whatever the ctx's threads. report may be NULL. Nothing else
 * may use pr during the call (an index, a session, a score). */
DHSA_API dhsa_status dhsa_predictor_train(dhsa_ctx *ctx, dhsa_predictor *pr, const dhsa_train_seq *seqs, int64_t n_seqs,
                                          const dhsa_train_params *p, dhsa_train_report *report);

/* ------------------------------------------------------------------------ */
/* The router: its parameters and dhsa_route                                */

typedef struct {
    dhsa_route_method method;
    dhsa_boundary boundary;
    const dhsa_predictor *predictor; /* LEARNED: the predictor (not owned) */
    float learned_threshold;         /* LEARNED: candidates need p >= this (default 0.5) */
    int64_t chunk;         /* FIXED chunk length (default 64) */
    int64_t sim_window;    /* SIMILARITY: keys on each side of a candidate (default 8) */
    float threshold;       /* SIMILARITY: a candidate boundary needs a score of at
                              least mean + threshold * stddev of the sequence (default 1) */
    int64_t nms_window;    /* kept boundaries are more than this apart (default 8) */
    int64_t min_chunk;     /* no chunk shorter (default 16) */
    int64_t max_chunk;     /* longer spans are split evenly (default 256) */
    int causal_boundaries; /* streaming boundaries, as the decode index cuts:
                              SIMILARITY compares each key with the mean of the
                              w keys before it only; LEARNED (same scores) is
                              decided by the index's online rule (dhsa_kv_index
                              below), so dhsa_route gives exactly the index's
                              chunks, the keys after its last closed chunk split
                              evenly into pieces of at most max_chunk */
    int64_t q_block;       /* query rows per block (default 64) */
    int64_t budget_tokens; /* > 0: keys per query block, sinks and local included */
    double density;        /* when budget_tokens = 0: share of the keys available to
                              the block (default 0.0625) */
    int64_t sink_tokens;   /* always the first keys (default 64) */
    int64_t local_tokens;  /* always the keys just before the block, and the
                              block's own (the diagonal) (default 256) */
    int64_t dense_below;   /* a block that may see fewer keys is dense (default
                              2048): short sequences run dense; 0 routes
                              every block whose budget is below its keys */
    int share_heads;       /* one routing for all heads (published) instead of
                              one per KV group (default 0) */
    dhsa_chunk_score score_mode; /* DHSA chunk score (default MOMENTS; a zeroed
                              struct gets POOLED) */
    int scale_fixed;       /* 1: a block reads at most budget / 8 sinks (but
                              never fewer than one, when sink_tokens > 0: an
                              early block keeps its sink) and budget / 4
                              local keys before its diagonal (its own budget:
                              density x the keys it may see), so the routed
                              chunks always keep part of the budget; 0: sink_tokens and local_tokens as
                              given, which at 64 + 256 fill a 4K block's
                              whole budget at density 0.0625 (default 1; a
                              zeroed struct gets 0) */
    int64_t score_rows;    /* ROWS: query rows scored per block and head (the
                              last, then evenly back; 0 = every row) */
    int64_t sink_window;   /* > sink_tokens: the sinks are the sink_tokens keys
                              among the first sink_window the block may see
                              whose keys score highest against the block's
                              mean query (its rows and the group's heads);
                              real models' sinks are the first delimiters of
                              a chat template, not position 0 (docs/dhsa.md,
                              "Sinks where the model puts them"). <=
                              sink_tokens: the first sink_tokens keys
                              (default 0 here; 64 in dhsa_router_params_for) */
    double carry;          /* > 0: a session's decode step (a one-token eval)
                              reads again the chunks that held at least this
                              share of the previous step's attention (mean
                              over a KV group's query heads; at most
                              DHSA_CARRY_MAX per group, the largest first),
                              before the chunks its score ranks, and then
                              the chunk after each of them: a number copied
                              token by token keeps its chunk from one step
                              to the next and reads on into the next chunk
                              (docs/dhsa.md, "Chunks carried from one decode
                              step to the next"). Only a
                              session applies it (it knows the previous
                              step); dhsa_route and dhsa_kv_index_route, which
                              see one call, ignore it. 0: off. In [0, 1]
                              (default 0 here; 0.1 in dhsa_router_params_for) */
    int64_t exact_rows;    /* > 0: a session's answering eval (more than one
                              token, the last row's logits asked for; not
                              logits_all, not an eval without logits) ranks
                              the chunks for its last exact_rows rows (a
                              prompt's question and the row that answers)
                              by the exact attention mass each chunk holds
                              for them, not by the estimate, and so does the
                              one-token eval right after it (the first
                              decode step, the row that writes the answer's
                              second token): the scores read every key for
                              those rows (exact_rows x L per head, O(L));
                              the keys attended stay the budget's
                              (docs/dhsa.md, "The prompt's last rows ranked
                              by their exact attention"). Only a session
                              applies it (it knows which rows end a call);
                              dhsa_route and dhsa_kv_index_route ignore it.
                              0: off. At most 4096 (default 0 here; 64 in
                              dhsa_router_params_for) */
    int64_t rest;          /* n > 0: in layers n - 1 and after (counting
                              from 0), a session's eval of more than one
                              token (a prompt, a chat turn, a prefill part;
                              not a decode step) also attends, per query
                              block of each routed call, every earlier chunk
                              it left out as one summary (the chunk's mean key and mean
                              value, weighed by its key count), merged with
                              the kept keys through their log-sum-exp: heads
                              whose attention is spread over the whole
                              context keep the weight the dropped keys held
                              (docs/dhsa.md, "The rest of the keys,
                              summarised"). Costs one key per chunk left out
                              (O(L / chunk) per row) and the summaries'
                              store (chunks x KV heads x (dk + dv)). Only a
                              session applies it (it keeps the summaries in
                              step with its cache); dhsa_route and
                              dhsa_kv_index_route ignore it. Sliding-window
                              layers never attend them. DHSA_REST_HYBRID
                              (-1): in every global layer of a model that
                              interleaves sliding-window layers with global
                              ones (gemma-2/3: their few global layers hold
                              every long-range read, and spread it), off in
                              other models (their held-out answers did not
                              gain at 4K), and from 32K (dhsa_router_scale)
                              DHSA_REST_LONG in every model (a head spread
                              over the 94% of keys dropped). 0: off; n at most DHSA_REST_MAX
                              (default 0 here; DHSA_REST_HYBRID in
                              dhsa_router_params_for) */
    int64_t hybrid_max_chunk; /* n > 0: a session on a model that
                              interleaves sliding-window layers with global
                              ones (gemma-2/3) cuts its chunks at most n keys
                              long: max_chunk is lowered to n and min_chunk
                              to at most max_chunk when the session resolves
                              its routing (dhsa_session_get_router reports
                              the values run). Those few global layers carry
                              every read beyond the window; finer chunks
                              choose among them more precisely (docs/dhsa.md,
                              "Finer chunks on hybrid models"). Other models
                              and dhsa_route ignore it. 0: off; at most
                              2^40 (default 0 here; 16 in
                              dhsa_router_params_for) */
} dhsa_router_params;

/* dhsa_router_params.rest: summaries in the global layers of a model with
 * sliding-window layers, none in other models; from 32K (dhsa_router_scale)
 * DHSA_REST_LONG in every model. */
#define DHSA_REST_HYBRID (-1)
/* The rest dhsa_router_scale gives DHSA_REST_HYBRID for contexts that round
 * to 32K or more: summaries in layers 2 and after of every model. */
#define DHSA_REST_LONG 3
/* The largest dhsa_router_params.rest (a layer number + 1). */
#define DHSA_REST_MAX 65536
/* The most chunks a decode step carries per KV group (dhsa_router_params.carry). */
#define DHSA_CARRY_MAX 16
/* The most rows dhsa_router_params.exact_rows may name. */
#define DHSA_EXACT_ROWS_MAX 4096

/* The neutral defaults of the routing primitives (dhsa_route, the decode
 * index), listed field by field above; not what sessions and tools run,
 * which is dhsa_router_params_for. */
DHSA_API dhsa_router_params dhsa_router_default_params(void);
/* The routing every entry point runs by default (sessions, `dhsa run`,
 * `serve`, `eval`, `bench`, `demo`, Python), for a context of n tokens at
 * a density: dhsa_router_default_params() (MOMENTS chunk scores), then
 * the length-scaled fields of dhsa_router_scale(n). n = 0 leaves those
 * fields unset (-1): a session scales them to its n_ctx when it is planned
 * or created (dhsa_session_default_params uses this), then applies the
 * rules that depend on the model (rest, hybrid_max_chunk). Chosen on
 * development prompts of real pretrained models (docs/dhsa.md, "One set
 * of routing defaults"). */
DHSA_API dhsa_router_params dhsa_router_params_for(int64_t n, double density);
/* Gives each length-scaled field of rp that is unset (negative) its value
 * for a context of n tokens (n rounded to the nearest power of two, nb;
 * B = budget_tokens or density x nb); fields already set are kept:
 * q_block 16 (nb <= 8K), 32 (16K), 64 (longer); sink_tokens 4;
 * local_tokens B / 8 rounded to 16, within [16, 256]; dense_below 0;
 * min_chunk / max_chunk / chunk / nms_window 8 / 32 / 16 / 4 up to 8K,
 * 16 / 64 / 32 / 8 beyond; score_rows 4; sink_window 64; rest
 * DHSA_REST_HYBRID becomes DHSA_REST_LONG from 32K (nb >= 32768). */
DHSA_API void dhsa_router_scale(dhsa_router_params *rp, int64_t n);

/* Checks the params and gives the exact layout size and routing workspace
 * (both allocated from the ctx by dhsa_route) for the call described by `a`
 * (q, k, causal, window and q_pos0 are used; v and o are not). */
DHSA_API dhsa_status dhsa_route_sizes(const dhsa_ctx *ctx, const dhsa_router_params *rp,
                                      const dhsa_attn_desc *a, size_t *layout_bytes, size_t *workspace_bytes);

/* Routes one layer: builds a layout for `a` (q, k post-RoPE) that
 * dhsa_attention then uses through a->layout. The caller frees it with
 * dhsa_layout_free. */
DHSA_API dhsa_status dhsa_route(dhsa_ctx *ctx, const dhsa_router_params *rp, const dhsa_attn_desc *a,
                                dhsa_layout **out);

/* The chunk starts dhsa_route uses for batch b of the call `a` (rp's
 * boundary method, windows and chunk limits; q and k as for dhsa_route):
 * starts[0] = 0 < starts[1] < ... < starts[*n - 1] < Lk, *n = the chunk
 * count (0 when Lk = 0). A layout keeps only the selected ranges, so this
 * is how a picture or an evaluation gets the boundaries. Writes at most cap
 * starts; more chunks than cap is DHSA_ERR_INVALID_ARG with *n set;
 * starts = NULL with cap = 0 only sizes (DHSA_OK). Scratch comes from the
 * ctx and is given back before the call returns. */
DHSA_API dhsa_status dhsa_route_boundaries(dhsa_ctx *ctx, const dhsa_router_params *rp, const dhsa_attn_desc *a,
                                           int64_t b, int64_t *starts, int64_t cap, int64_t *n);

/* ------------------------------------------------------------------------ */
/* DHSA at decode time: an index beside the KV cache                         */

/* One sequence's index. As keys are appended it scores boundaries in the
 * causal form (each key against the mean of the sim_window keys before it;
 * or FIXED chunks; or LEARNED: the predictor's probability of each
 * candidate t, computed once, when key t + w - 1 arrives, from the same 2w
 * keys [t - w, t + w) and with the same bits as dhsa_predictor_score),
 * decides them online (a candidate is kept once the nms_window scores
 * after it are known: it must be the highest score within nms_window on
 * both sides, reach mean + threshold * stddev of the scores so far (LEARNED:
 * learned_threshold), and be min_chunk (and at most max_chunk) after the
 * previous boundary; a chunk that grows past max_chunk is cut at max_chunk
 * once the candidates inside it are judged, nms_window scores later; with
 * LEARNED every decision comes w - 1 keys later, the keys its scores
 * need), and keeps each closed chunk's summary per KV head (its pooled key
 * sum / sqrt(n), and with DHSA_SCORE_MOMENTS the keys' variance per
 * dimension). Routing a query block then costs O(chunks x d) per KV head,
 * not O(L d), and an append O(C^2 + w^2 C + C hidden) per key with LEARNED
 * (C = Hkv d). A chunk is a candidate for a query block only once it was
 * closed at or before the block's last position, so routing after every
 * ubatch and routing the whole prefill at once give the same layouts. With
 * LEARNED, the closed chunks are exactly those of dhsa_route_boundaries on
 * the same keys with causal_boundaries = 1, whatever the ubatches. */
typedef struct dhsa_kv_index dhsa_kv_index;

/* capacity: most keys the index will hold. rp: boundary (FIXED,
 * SIMILARITY or LEARNED, always causal; LEARNED's predictor must read
 * C = Hkv * d and outlive the index), windows, chunk limits, q_block,
 * budget, sinks, local, dense_below, share_heads, as for dhsa_route.
 * Memory comes from ctx (LEARNED adds the predictor's rows of the last
 * 2w - 1 keys and of a 64-key piece: about (4 (2w + 63) + 4 x 64) C
 * floats). */
DHSA_API dhsa_status dhsa_kv_index_create(dhsa_ctx *ctx, const dhsa_router_params *rp, int64_t Hkv, int64_t d,
                                          int64_t capacity, dhsa_kv_index **out);
DHSA_API void dhsa_kv_index_free(dhsa_kv_index *ix);
/* Exact bytes dhsa_kv_index_create allocates from the ctx (checks rp). */
DHSA_API dhsa_status dhsa_kv_index_size(const dhsa_router_params *rp, int64_t Hkv, int64_t d, int64_t capacity,
                                        size_t *bytes);
/* Appends keys k [1, Hkv, n, d] (any strides and type) at positions
 * length .. length + n - 1. Checked before anything is appended. An append
 * that would overlap another call on the index (another thread's append or
 * route) is refused with DHSA_ERR_BUSY, appending nothing. */
DHSA_API dhsa_status dhsa_kv_index_append(dhsa_kv_index *ix, const dhsa_tensor *k);
DHSA_API int64_t dhsa_kv_index_length(const dhsa_kv_index *ix);
/* Cuts the index back to its first n keys (0 <= n <= length): afterwards it
 * is, field for field, the index that was only ever given those n keys, and
 * later appends and routes give what they would have given there. k [1,
 * Hkv, >= n, d] (any strides and type) must hold the keys the index was
 * given (a session's cache), from which the open chunk's sums and the
 * recent keys are recomputed; closed chunks decided before key n are kept
 * as they are, the others dropped. Costs O(n) scalar steps plus the keys of
 * the chunk left open, not a rebuild. The index keeps every candidate's
 * boundary score for this (4 bytes per key of capacity, in
 * dhsa_kv_index_size). Refused with DHSA_ERR_BUSY while another call runs
 * on the index; on any error the index is unchanged. */
DHSA_API dhsa_status dhsa_kv_index_truncate(dhsa_kv_index *ix, const dhsa_tensor *k, int64_t n);
/* Closed chunks so far (n); with starts != NULL, their first positions and,
 * at starts[n], the end of the last closed chunk (the open tail's start). */
DHSA_API int64_t dhsa_kv_index_chunks(const dhsa_kv_index *ix, const int64_t **starts);
/* Routes the queries of `a` (q [1, Hq, Lq, d] at positions q_pos0 ..;
 * routes of one index may run at once; one that would overlap an append is
 * DHSA_ERR_BUSY;
 * k [1, Hkv, Lk, d] must be the cache the index describes: Lk = length)
 * into a new layout (free with dhsa_layout_free). Only causal attention
 * (a->causal = 1) is supported. */
DHSA_API dhsa_status dhsa_kv_index_route(dhsa_ctx *ctx, const dhsa_kv_index *ix, const dhsa_attn_desc *a,
                                         dhsa_layout **out);
/* dhsa_kv_index_route with each block's chunks ranked by the true attention
 * mass its rows and the KV group's heads put on them (exact scores, reading
 * every key the rows may see: rows x L per head) instead of the score's
 * estimate; the same candidates, budget, sinks and local keys. What a
 * session runs for an answering eval's last exact_rows rows
 * (dhsa_router_params.exact_rows; docs/dhsa.md, "The prompt's last rows
 * ranked by their exact attention"), for a caller that routes those rows
 * itself (dhsa.torch's transformers plug-in). The scores use a's scale
 * (0 = 1/sqrt(d)) and softcap, as the attention will. Refuses share_heads
 * (DHSA_ERR_UNSUPPORTED). */
DHSA_API dhsa_status dhsa_kv_index_route_exact(dhsa_ctx *ctx, const dhsa_kv_index *ix, const dhsa_attn_desc *a,
                                               dhsa_layout **out);
/* Decode steps that carry chunks (dhsa_router_params.carry; docs/dhsa.md,
 * "Chunks carried from one decode step to the next"), for a caller that
 * runs its own decode loop (a session does this itself; dhsa.torch's
 * transformers plug-in).
 *
 * dhsa_kv_index_carry: after a one-row call `a` (q [1, Hq, 1, d] at the
 * newest position, k the index's cache; scale 0 = 1/sqrt(d), softcap and a
 * key_mask as the attention applied them; no key_bias, dense mask or
 * window) that read the keys of lay (one block per KV head), the index's
 * closed chunks that held at least `share` of the row's attention (the
 * mean over each KV head's query heads of each head's softmax over the
 * keys it read; keys in the open tail belong to no chunk):
 * out[g * DHSA_CARRY_MAX + i] for KV head g, largest share first (ties:
 * the earlier chunk), at most DHSA_CARRY_MAX, the rest -1 (out holds
 * Hkv * DHSA_CARRY_MAX entries). share in [0, 1]; 0 carries nothing.
 * Refuses share_heads (DHSA_ERR_UNSUPPORTED); DHSA_ERR_BUSY during an
 * append.
 *
 * dhsa_kv_index_route_keep: dhsa_kv_index_route with the chunks keep[g *
 * DHSA_CARRY_MAX + i] (-1: none; what dhsa_kv_index_carry gave the step
 * before, over the same closed chunks: chunk numbers stay valid while
 * keys are only appended) ranked before every other candidate of KV head
 * g, in that order, then the chunk after each of them (c + 1: a copy
 * reads on into it), wherever they are candidates (closed before the
 * block's last row); they are then read like any chunk, within the
 * block's budget. keep = NULL: exactly dhsa_kv_index_route. */
DHSA_API dhsa_status dhsa_kv_index_carry(const dhsa_kv_index *ix, const dhsa_attn_desc *a, const dhsa_layout *lay,
                                         double share, int64_t *out);
DHSA_API dhsa_status dhsa_kv_index_route_keep(dhsa_ctx *ctx, const dhsa_kv_index *ix, const dhsa_attn_desc *a,
                                              const int64_t *keep, dhsa_layout **out);

/* Whether query row `row` of (batch b, KV head g) may attend to key `key`
 * under the layout (its block's ranges; causality/window not applied).
 * Returns 1, 0, or a negative status on bad arguments. */
DHSA_API int dhsa_layout_selects(const dhsa_layout *layout, int64_t b, int64_t g, int64_t row, int64_t key);

#ifdef __cplusplus
}
#endif
#endif /* DHSA_ROUTE_H */
