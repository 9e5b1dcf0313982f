/* dhsa/attn.h: attention (dhsa_attention, dhsa_attn_merge), sparse layouts
 * (the sparse kernel's input), and the synthetic workloads and fidelity
 * measure that the benchmarks and tests run attention on (src/attn,
 * src/route/layout.c, src/eval/synth.c).
 *
 * A section of the public interface: users include <dhsa.h>, which
 * includes every section in order. This file includes the sections it
 * builds on, so it compiles alone too. The rules every call follows
 * (errors, threads, tensors) are at the top of dhsa.h and in dhsa/core.h.
 */
#ifndef DHSA_ATTN_H
#define DHSA_ATTN_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Attention                                                                 */

/* Polarity of a boolean key mask. There is no default: a mask given with
 * DHSA_MASK_NO_POLARITY is an error, because mixing the two conventions
 * silently corrupts outputs. */
typedef enum {
    DHSA_MASK_NO_POLARITY = 0,
    DHSA_MASK_TRUE_IGNORES = 1, /* nonzero = padding, ignore the key
                                   (PyTorch nn.MultiheadAttention key_padding_mask) */
    DHSA_MASK_TRUE_KEEPS = 2    /* nonzero = the key takes part
                                   (F.scaled_dot_product_attention bool attn_mask) */
} dhsa_mask_polarity;

typedef enum {
    DHSA_BACKEND_AUTO = 0,      /* = TILED; env DHSA_ATTN=tiled|reference overrides */
    DHSA_BACKEND_TILED = 1,     /* online softmax over tiles, O(threads x tile) memory */
    DHSA_BACKEND_REFERENCE = 2  /* materialises scores, double accumulation (oracle) */
} dhsa_backend;

/* A sparse layout (see "Sparse layouts" below): per (batch, KV head, query
 * block) a sorted list of disjoint key ranges. */
typedef struct dhsa_layout dhsa_layout;

/* One attention call. Shapes (logical order):
 *   q    [B, Hq, Lq, d]      F32 / F16 / BF16
 *   k    [B, Hkv, Lk, d]     Hq % Hkv == 0 (GQA/MQA: query head h reads
 *                            K/V head h / (Hq / Hkv); nothing is copied)
 *   v    [B, Hkv, Lk, dv]    dv may differ from d; k and v are F32 / F16 /
 *                            BF16 / Q8_0 (d, dv multiples of 32, rows whole
 *                            blocks: see dhsa_type), read in place
 *   o    [B, Hq, Lq, dv]     output, F32 / F16 / BF16
 *   lse  [B, Hq, Lq, 1]      optional F32 output: natural-log sum of exp of
 *                            the final scores; -inf for rows with no key
 * Scores: s = scale * q.k; if softcap > 0, s = softcap * tanh(s / softcap);
 * then s += key_bias[b, j] + attn_mask[b, h, i, j]; keys excluded by the key
 * mask, causality or the window get s = -inf.
 * Positions: query i sits at q_pos0 + i, key j at k_pos0 + j (k_pos0 = 0
 * unless the keys are the tail of a longer sequence, e.g. a sliding-window
 * ring). causal keeps k_pos0 + j <= q_pos0 + i; window > 0 keeps
 * k_pos0 + j > q_pos0 + i - window.
 * A row with no allowed key gets o = 0 and lse = -inf (never NaN). */
typedef struct {
    dhsa_tensor q, k, v, o;
    dhsa_tensor lse;               /* optional (data NULL) */

    float scale;                   /* 0 = 1/sqrt(d) */
    float softcap;                 /* 0 = none */
    int causal;
    int64_t q_pos0;                /* absolute position of query row 0 */
    int64_t window;                /* 0 = none */

    /* Boolean key mask [B, Lk] (bytes, nonzero = true), REQUIRED polarity. */
    const uint8_t *key_mask;
    int64_t key_mask_batch_stride; /* elements between batches; 0 = broadcast */
    dhsa_mask_polarity key_mask_polarity;

    /* Additive per-key bias [B, Lk] (0 / -inf, ALiBi-like terms). */
    const float *key_bias;
    int64_t key_bias_batch_stride;

    /* Optional dense additive mask, F32, shape [B|1, Hq|1, Lq, Lk]
     * (a dimension of 1 broadcasts). Caller-given for compatibility; the
     * library never builds one. */
    dhsa_tensor attn_mask;

    /* Sparse attention: NULL = dense. Otherwise each query row attends only
     * to the keys in the ranges of its (batch, KV head, query block), with
     * every rule above still applied (causal, window, masks); cost is
     * proportional to the selected keys. The layout must have been made for
     * these B, Hkv, Lq and Lk. The REFERENCE backend honours it too (keys
     * outside the ranges get -inf), so it remains the oracle. */
    const dhsa_layout *layout;

    dhsa_backend backend;
    /* Nonzero: scan q, k, v first and fail with DHSA_ERR_NONFINITE (naming
     * the element) on NaN or Inf. Costs one extra read of the inputs. */
    int check_finite;
    /* REFERENCE refuses calls whose score matrix needs more than this many
     * bytes (0 = default 1 GiB). */
    size_t reference_max_bytes;
    /* Absolute position of key row 0 (default 0): 0 <= k_pos0 <= q_pos0.
     * Masks, layouts and key_bias index key rows, not positions. */
    int64_t k_pos0;
} dhsa_attn_desc;

/* A descriptor with defaults: nothing set but backend AUTO. */
DHSA_API dhsa_attn_desc dhsa_attn_default_desc(void);

/* Exact bytes of workspace the call will allocate from the ctx (for the
 * backend it will use). Checks the descriptor first. */
DHSA_API dhsa_status dhsa_attn_workspace_size(const dhsa_ctx *ctx, const dhsa_attn_desc *a, size_t *bytes);

/* Computes attention. Validates everything first; on error nothing is
 * written. */
DHSA_API dhsa_status dhsa_attention(dhsa_ctx *ctx, const dhsa_attn_desc *a);

/* Merges n_parts >= 1 partial attentions of the same queries over disjoint
 * key sets into the attention over their union, exactly: part k is the
 * softmax output o_parts[k] [B, H, L, dv] of its keys with their
 * log-sum-exp lse_parts[k] [B, H, L, 1] (as dhsa_attention writes o and
 * lse), and the result is o = sum_k e^lse_k o_k / sum_k e^lse_k, lse =
 * log sum_k e^lse_k, written to o and lse. All views F32, same shapes.
 * A part whose row has lse = -inf (no allowed key) weighs nothing; a row
 * no part has keys for keeps part 0's (o = 0, lse = -inf from
 * dhsa_attention). The weights are in double, relative to the larger LSE;
 * parts are merged left to right into the running result, rounded to F32
 * after each, so merge(A, B, C) gives the same bits as merge(merge(A, B),
 * C): parts may be merged as they arrive. o and lse may be part 0's own
 * views (merging in place); no other part may share their memory. Nothing
 * is allocated. Context parallelism merges its ranks' partials with it
 * (docs/dist.md). */
DHSA_API dhsa_status dhsa_attn_merge(const dhsa_tensor *o_parts, const dhsa_tensor *lse_parts, int64_t n_parts,
                                     const dhsa_tensor *o, const dhsa_tensor *lse);

/* The backend AUTO resolves to in this process (after DHSA_ATTN). */
DHSA_API dhsa_backend dhsa_attn_resolve_backend(dhsa_backend b);
DHSA_API const char *dhsa_backend_name(dhsa_backend b);

/* ------------------------------------------------------------------------ */
/* Sparse layouts                                                            */

/* Query rows are cut into blocks of q_block rows (the last may be shorter):
 * block qb holds rows [qb * q_block, min((qb + 1) * q_block, Lq)). For each
 * (batch b, KV head g, block qb) the layout holds at most max_ranges sorted,
 * disjoint, non-adjacent key ranges [start, end) within [0, Lk). */

/* Exact bytes dhsa_layout_create allocates from the ctx for these sizes. */
DHSA_API dhsa_status dhsa_layout_size(int64_t B, int64_t Hkv, int64_t Lq, int64_t Lk, int64_t q_block,
                                      int64_t max_ranges, size_t *bytes);
/* An empty layout (every block selects nothing) owned by the caller,
 * allocated from ctx (held to its budget). */
DHSA_API dhsa_status dhsa_layout_create(dhsa_ctx *ctx, int64_t B, int64_t Hkv, int64_t Lq, int64_t Lk,
                                        int64_t q_block, int64_t max_ranges, dhsa_layout **out);
DHSA_API void dhsa_layout_free(dhsa_layout *layout);
/* Sets the ranges of one block (not while another call reads the layout:
 * "Threads"): `ranges` holds n pairs (start, end). They are
 * sorted and merged here (overlapping or adjacent ranges join), then checked
 * against [0, Lk) and max_ranges; on error the block is left unchanged. */
DHSA_API dhsa_status dhsa_layout_set(dhsa_layout *layout, int64_t b, int64_t g, int64_t qb,
                                     const int64_t *ranges, int64_t n);
/* The ranges of one block: *ranges points to n pairs inside the layout
 * (valid until the layout is changed or freed). */
DHSA_API dhsa_status dhsa_layout_get(const dhsa_layout *layout, int64_t b, int64_t g, int64_t qb,
                                     const int64_t **ranges, int64_t *n);

typedef struct {
    int64_t B, Hkv, Lq, Lk, q_block, n_blocks, max_ranges;
    int64_t q_pos0;        /* positions the layout was routed for (0 if set by hand) */
    int causal;            /* routed for causal attention */
    int64_t window;
    double selected;       /* sum over (b, g, query row) of selected keys the
                              row may attend to (after causality/window) */
    double available;      /* same sum over all keys the row may attend to */
    double density;        /* selected / available (1 when available is 0) */
    int64_t ranges;        /* total ranges */
    int64_t dense_blocks;  /* blocks that ended up dense */
    /* chunks of the routing, when a router made the layout (else 0) */
    int64_t chunks;
    double chunk_mean;
    int64_t chunk_min, chunk_max;
} dhsa_layout_stats;

/* Statistics; density counts, for every query row, the keys it could attend
 * to under the layout's causal/window/q_pos0 (as recorded by the router, or
 * none for a hand-made layout: then every key is available). */
DHSA_API dhsa_status dhsa_layout_get_stats(const dhsa_layout *layout, dhsa_layout_stats *st);

/* ------------------------------------------------------------------------ */
/* Synthetic workloads and fidelity                                          */

#define DHSA_SYNTH_MAX_NEEDLES 64

/* Q/K/V with segment structure: the sequence is cut into segments of
 * [seg_min, seg_max] tokens; every segment has a random topic direction per
 * KV head; keys are their segment's topic plus noise, so real boundaries
 * exist. Each query mixes its own segment's topic with the topic of one
 * earlier segment (a retrieval), so attention mass sits on the diagonal and
 * on chunks far back. Needles: a passage of needle_len keys starting at
 * depth * L carries a unique direction per KV head; the deepest needle is
 * asked for by every query row of the last query block (blocks of q_block
 * rows), the next deepest by the block before it, and so on; their
 * queries mix that direction into their own topic: a question about a fact
 * far back. Values carry their segment's own direction plus noise. */
typedef struct {
    int64_t B, Hq, Hkv, L, d;
    int64_t seg_min, seg_max;      /* default 32, 512 */
    int n_needles;                 /* default 4 */
    double depths[DHSA_SYNTH_MAX_NEEDLES]; /* default 0.1, 0.35, 0.6, 0.85 */
    int64_t needle_len;            /* keys per needle passage (default 16) */
    int64_t q_block;               /* default 64 */
    uint64_t seed;
} dhsa_synth_params;

typedef struct {
    int64_t key;   /* first key of the needle passage */
    int64_t len;   /* its length */
    int64_t row;   /* first query row of the block that asks for it */
    int64_t rows;  /* rows in that block */
} dhsa_synth_needle;

DHSA_API dhsa_synth_params dhsa_synth_default_params(void);
/* Fills q [B, Hq, L, d], k and v [B, Hkv, L, d] (contiguous F32, caller
 * allocated) and needles[n_needles]. Deterministic for a seed. */
DHSA_API dhsa_status dhsa_synth_generate(const dhsa_synth_params *sp, float *q, float *k, float *v,
                                         dhsa_synth_needle *needles);

typedef struct {
    double recall;      /* mean over rows and heads of the dense softmax mass on
                           the keys the sparse call attended to: exp(lse_sparse
                           - lse_dense), computed from the two LSE outputs */
    double recall_min;  /* the worst row */
    double rel_err;     /* ||o_sparse - o_dense||_F / ||o_dense||_F */
    int64_t rows;       /* rows counted (rows with no allowed key are not) */
} dhsa_fidelity;

/* Compares a sparse result with the dense one: o [B, H, L, dv] F32 views,
 * lse [B, H, L, 1] F32 views, from dhsa_attention with and without a
 * layout. */
DHSA_API dhsa_status dhsa_fidelity_compare(const dhsa_tensor *o_dense, const dhsa_tensor *lse_dense,
                                           const dhsa_tensor *o_sparse, const dhsa_tensor *lse_sparse,
                                           dhsa_fidelity *out);

#ifdef __cplusplus
}
#endif
#endif /* DHSA_ATTN_H */
