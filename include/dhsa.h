/* dhsa.h: the one public header of dhsa, a C11 library for long-context LLM
 * inference on a memory budget.
 *
 * Contract, in short:
 *   - Every fallible call returns dhsa_status (0 = DHSA_OK, negative = error);
 *     dhsa_last_error() then holds a sentence for humans (thread-local).
 *     The library never exits or aborts.
 *   - A dhsa_ctx owns the thread pool, the memory arena and its statistics,
 *     and an optional memory budget. Kernels allocate only through it, and
 *     every kernel has an exact workspace query, so an over-budget call fails
 *     with DHSA_ERR_MEMORY_BUDGET before doing any work.
 *   - Tensors are strided views in logical order [batch, heads, seq, dim]
 *     (PyTorch SDPA order); strides are in elements, so a batch-first buffer
 *     [batch, seq, heads, dim] is passed without a copy.
 *   - Results do not depend on the number of threads.
 *   - Objects may be shared by threads under the rules of "Threads" below:
 *     a ctx serialises the calls made on it, a session refuses a second
 *     concurrent eval (DHSA_ERR_BUSY), read-only objects are shared freely.
 *   - A failed call leaves its objects as they were before it: a session
 *     keeps the tokens committed before a failed eval, for every attention
 *     method (dhsa_session_eval).
 *
 * Tests: make test (tests/test_*.c); see README.md.
 */
#ifndef DHSA_H
#define DHSA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DHSA_VERSION "0.1.0"

/* DHSA_API marks the functions libdhsa.so exports. The library is compiled
 * with -fvisibility=hidden, so the functions declared here are its whole
 * binary interface; the internals (dhsa__*, src/ headers) stay inside it and
 * reach tests and tools only through the static library libdhsa.a
 * (docs/architecture.md, "The library's face"). tests/test_exports.c checks
 * that `nm -D --defined-only libdhsa.so` lists exactly these functions. */
#ifndef DHSA_API
#if defined(__GNUC__) || defined(__clang__)
#define DHSA_API __attribute__((visibility("default")))
#else
#define DHSA_API
#endif
#endif

/* ------------------------------------------------------------------------ */
/* Status codes                                                              */

typedef enum {
    DHSA_OK = 0,
    DHSA_ERR_INVALID_ARG = -1,   /* a parameter is out of its domain */
    DHSA_ERR_SHAPE = -2,         /* tensor shapes or strides disagree */
    DHSA_ERR_OUT_OF_MEMORY = -3, /* the system allocator refused */
    DHSA_ERR_MEMORY_BUDGET = -4, /* the call would exceed the ctx budget */
    DHSA_ERR_UNSUPPORTED = -5,   /* valid request this build cannot do */
    DHSA_ERR_TOO_LARGE = -6,     /* size above a safety cap (raise it) */
    DHSA_ERR_IO = -7,            /* a file could not be read or written */
    DHSA_ERR_FORMAT = -8,        /* a file or string is malformed */
    DHSA_ERR_NONFINITE = -9,     /* NaN or Inf where a finite value is due */
    DHSA_ERR_INTERNAL = -10,     /* a bug in dhsa: please report it */
    DHSA_ERR_BUSY = -11          /* the object is in use by another call (another
                                    thread, or a callback of this one): see
                                    "Threads" below; nothing was done */
} dhsa_status;

/* Name of a status ("DHSA_ERR_SHAPE"); never NULL. */
DHSA_API const char *dhsa_status_str(dhsa_status s);
/* The last error sentence set on this thread ("" if none). The pointer stays
 * valid until the next failing dhsa call on the same thread. */
DHSA_API const char *dhsa_last_error(void);

/* ------------------------------------------------------------------------ */
/* Threads (docs/dhsa.md, "Threads and failed calls"; tests/test_threads.c)  */

/* Any object may be used from any thread. What may overlap:
 *   dhsa_ctx       shared freely. Its thread pool and its scratch serve one
 *                  call at a time under the ctx's lock: dhsa_attention and
 *                  each weight product of dhsa_session_eval hold it for the
 *                  whole call, the routing, predictor and training calls for
 *                  each parallel job, dhsa_parallel_for for its job,
 *                  dhsa_ctx_trim while it frees. So results are those of the
 *                  same calls made one after another, each with all of the
 *                  ctx's threads. The cost: that work never runs at the same
 *                  time on one ctx (threads sharing a ctx take turns); to run
 *                  in parallel, give each thread its own ctx. The allocator,
 *                  statistics and budget calls never wait for the lock.
 *   dhsa_model, dhsa_tokenizer, dhsa_gguf (read), dhsa_predictor
 *                  read-only once made: any number of threads and sessions
 *                  may use one at once (dhsa_predictor_train writes its
 *                  predictor: nothing else may use that one meanwhile).
 *   dhsa_session   one eval or reset at a time: one that would overlap
 *                  another on the same session (from another thread, or
 *                  from the running eval's layer hook or progress callback)
 *                  is refused with DHSA_ERR_BUSY ("the session is in use by
 *                  another thread ...") and does nothing. Two sessions (on
 *                  one model, on one ctx or not) may run at once.
 *   dhsa_kv_index  routes may overlap each other; an append refuses to
 *                  overlap any other call on the index, and a route an
 *                  append (DHSA_ERR_BUSY).
 *   dhsa_layout    any number of readers at once (dhsa_attention with it,
 *                  dhsa_layout_get, _get_stats, _selects); dhsa_layout_set
 *                  must not overlap any other use of that layout.
 *   dhsa_sampler, dhsa_gguf_writer, dhsa_task: one thread at a time.
 * What the list says "must not" is not detected: it is undefined, like
 * freeing an object (or its ctx, or the model of a session) while another
 * call uses it, and calling the library on a ctx from inside one of that
 * ctx's dhsa_parallel_for tasks. The other calls on a session (length,
 * plan, stats, free) must not overlap an eval or reset of it. */

/* ------------------------------------------------------------------------ */
/* CPU features and kernels                                                  */

typedef enum {
    DHSA_ISA_SCALAR = 0,
    DHSA_ISA_AVX2 = 1,   /* AVX2 + FMA */
    DHSA_ISA_AVX512 = 2  /* AVX-512 F */
} dhsa_isa;

/* The ISA the kernels use: the best this CPU and build support, or SCALAR
 * when the environment variable DHSA_FORCE_SCALAR=1 is set, or at most
 * DHSA_FORCE_ISA=scalar|avx2|avx-vnni|avx512 (read once; avx2 also keeps
 * the fast route's integer kernels off VNNI, as on an AVX2-only CPU). */
DHSA_API dhsa_isa dhsa_active_isa(void);
DHSA_API const char *dhsa_isa_name(dhsa_isa isa);
/* Override the ISA for this process (tests, benchmarks). Returns
 * DHSA_ERR_UNSUPPORTED if the CPU or build lacks it. Not thread-safe with
 * running kernels. */
DHSA_API dhsa_status dhsa_set_isa(dhsa_isa isa);

/* ------------------------------------------------------------------------ */
/* Context: threads, memory arena, statistics, budget                        */

typedef struct dhsa_ctx dhsa_ctx;

typedef struct {
    int n_threads;     /* 0 = number of online CPUs */
    size_t mem_budget; /* bytes the ctx may hold at once; 0 = unlimited */
} dhsa_ctx_params;

typedef struct {
    size_t in_use;       /* bytes currently allocated through the ctx */
    size_t peak;         /* highest in_use since creation or reset */
    size_t largest;      /* largest single allocation */
    uint64_t n_allocs;   /* allocations made */
    size_t budget;       /* 0 = unlimited */
} dhsa_mem_stats;

DHSA_API dhsa_ctx_params dhsa_ctx_default_params(void);
/* Creates a context; *out is NULL on failure. */
DHSA_API dhsa_status dhsa_ctx_create(const dhsa_ctx_params *p, dhsa_ctx **out);
/* Frees the context and its arena. NULL is allowed. Only once no call on
 * it runs, and after everything allocated from it (sessions, layouts,
 * indexes) was freed. */
DHSA_API void dhsa_ctx_free(dhsa_ctx *ctx);
DHSA_API int dhsa_ctx_n_threads(const dhsa_ctx *ctx);
DHSA_API dhsa_mem_stats dhsa_ctx_mem_stats(const dhsa_ctx *ctx);
/* Sets peak = in_use. */
DHSA_API void dhsa_ctx_reset_peak(dhsa_ctx *ctx);
/* 0 = unlimited. Fails with DHSA_ERR_MEMORY_BUDGET if in_use already
 * exceeds the new budget (the budget is left unchanged). */
DHSA_API dhsa_status dhsa_ctx_set_budget(dhsa_ctx *ctx, size_t bytes);
/* Tracked allocation, 64-byte aligned, counted in the statistics and held to
 * the budget. Returns NULL and sets the last error on failure. */
DHSA_API void *dhsa_ctx_alloc(dhsa_ctx *ctx, size_t bytes);
DHSA_API void dhsa_ctx_release(dhsa_ctx *ctx, void *ptr);
/* Kernels keep their workspace in a grow-only scratch arena between calls
 * (it counts in in_use); trim gives it back, waiting for a call that works
 * in it on another thread. */
DHSA_API void dhsa_ctx_trim(dhsa_ctx *ctx);

/* Runs fn(arg, task, thread) for task in [0, n_tasks) on the ctx's threads;
 * tasks are handed out in increasing order; thread is in [0, n_threads).
 * Returns when all tasks are done. Jobs from several threads on one ctx run
 * one after another. Not reentrant: fn must not call the library on the
 * same ctx. */
typedef void (*dhsa_task_fn)(void *arg, int64_t task, int thread);
DHSA_API void dhsa_parallel_for(dhsa_ctx *ctx, int64_t n_tasks, dhsa_task_fn fn, void *arg);

/* ------------------------------------------------------------------------ */
/* Tensors                                                                   */

/* DHSA_Q8_0 is a block type (GGUF/ggml Q8_0): each run of 32 values along
 * dim is one 34-byte block, an F16 scale d = max|x| / 127 then 32 int8
 * codes q = round(x / d), value = d * q. It is for K and V only (a
 * quantized KV cache; never q, o, lse or a mask). A Q8_0 view keeps strides
 * in elements, like every other type, under three rules, each refused with
 * a sentence (DHSA_ERR_SHAPE) where a call reads one: dim is a multiple of
 * 32, stride[3] == 1, and stride[0..2] are multiples of 32 (so every row is
 * whole blocks and element offset e lives at byte e / 32 * 34). */
typedef enum { DHSA_F32 = 0, DHSA_F16 = 1, DHSA_BF16 = 2, DHSA_Q8_0 = 3 } dhsa_type;

/* A strided view. shape and stride are in logical order
 * [batch, heads, seq, dim]; strides are in elements and may be 0 (broadcast)
 * where a call says so (Q8_0: see above). data == NULL means "absent" for
 * optional tensors. */
typedef struct {
    void *data;
    dhsa_type type;
    int64_t shape[4];
    int64_t stride[4];
} dhsa_tensor;

/* Bytes per element: 4 or 2; 0 for the block type Q8_0 (use
 * dhsa_type_row_bytes). */
DHSA_API size_t dhsa_type_size(dhsa_type t);
/* Bytes of n consecutive elements: n * dhsa_type_size, or n / 32 * 34 for
 * Q8_0 (n a multiple of 32; 0 otherwise, and for an unknown type). */
DHSA_API size_t dhsa_type_row_bytes(dhsa_type t, int64_t n);
/* "f32", "f16", "bf16", "q8_0"; "unknown" otherwise. */
DHSA_API const char *dhsa_type_name(dhsa_type t);
/* A contiguous [B, H, L, D] view. */
DHSA_API dhsa_tensor dhsa_tensor_bhld(void *data, dhsa_type t, int64_t B, int64_t H, int64_t L, int64_t D);
/* A view of a contiguous batch-first buffer [B, L, H, D] (no copy). */
DHSA_API dhsa_tensor dhsa_tensor_blhd(void *data, dhsa_type t, int64_t B, int64_t L, int64_t H, int64_t D);
/* Large tensor buffers (K/V caches, activations), owned by the caller and
 * not tracked by any ctx: 64-byte aligned, and from 2 MiB up 2 MiB aligned
 * and advised as transparent huge pages on Linux, so that streaming long
 * K/V does not thrash the TLB. NULL (last error set) on failure; free with
 * dhsa_buffer_free (NULL allowed). */
DHSA_API void *dhsa_buffer_alloc(size_t bytes);
DHSA_API void dhsa_buffer_free(void *p);
/* Q8_0 rows (n values, n a multiple of 32) to and from F32: the nearest
 * encoding by ggml's reference rule (d = max|x| / 127 rounded to F16, codes
 * round to nearest), and the exact values it stands for. Quantizing
 * refuses NaN/Inf (DHSA_ERR_NONFINITE) and n not a multiple of 32. */
DHSA_API dhsa_status dhsa_q8_0_quantize_row(const float *src, void *dst, int64_t n);
DHSA_API dhsa_status dhsa_q8_0_dequantize_row(const void *src, float *dst, int64_t n);
/* Conversions (round to nearest even). */
DHSA_API uint16_t dhsa_f32_to_f16(float x);
DHSA_API float dhsa_f16_to_f32(uint16_t h);
DHSA_API uint16_t dhsa_f32_to_bf16(float x);
DHSA_API float dhsa_bf16_to_f32(uint16_t h);

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
                              attention weight per key that a key budget buys
                              (default) */
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

/* ---- Predictor training block begin (src/route/predictor_train.c, docs/predictor.md) ---- */
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
/* ---- Predictor training block end ---- */

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
    int scale_fixed;       /* 1: a block reads at most budget / 8 sinks and
                              budget / 4 local keys before its diagonal (its
                              own budget: density x the keys it may see), so
                              the routed chunks always keep part of the
                              budget; 0: sink_tokens and local_tokens as
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
} dhsa_router_params;

/* The neutral defaults of the routing primitives (dhsa_route, the decode
 * index), listed field by field above; not what sessions and tools run,
 * which is dhsa_router_params_for. */
DHSA_API dhsa_router_params dhsa_router_default_params(void);
/* The routing every entry point runs by default (sessions, `dhsa run`,
 * `serve`, `eval`, `bench`, `demo`, Python), for a context of n tokens at
 * a density: dhsa_router_default_params() (MOMENTS chunk scores), then
 * the length-scaled fields of dhsa_router_scale(n). n = 0 leaves those
 * fields unset (-1): a session scales them to its n_ctx when it is planned
 * or created (dhsa_session_default_params uses this). Chosen on
 * development prompts of real pretrained models (docs/dhsa.md, "One set
 * of routing defaults"). */
DHSA_API dhsa_router_params dhsa_router_params_for(int64_t n, double density);
/* Gives each length-scaled field of rp that is unset (negative) its value
 * for a context of n tokens (n rounded to the nearest power of two, nb;
 * B = budget_tokens or density x nb); fields already set are kept:
 * q_block 16 (nb <= 8K), 32 (16K), 64 (longer); sink_tokens 4;
 * local_tokens B / 8 rounded to 16, within [16, 256]; dense_below 0;
 * min_chunk / max_chunk / chunk / nms_window 8 / 32 / 16 / 4 up to 8K,
 * 16 / 64 / 32 / 8 beyond; score_rows 4; sink_window 64. */
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
/* Closed chunks so far; with starts != NULL, their first positions. */
DHSA_API int64_t dhsa_kv_index_chunks(const dhsa_kv_index *ix, const int64_t **starts);
/* Routes the queries of `a` (q [1, Hq, Lq, d] at positions q_pos0 ..;
 * routes of one index may run at once; one that would overlap an append is
 * DHSA_ERR_BUSY;
 * k [1, Hkv, Lk, d] must be the cache the index describes: Lk = length)
 * into a new layout (free with dhsa_layout_free). Only causal attention
 * (a->causal = 1) is supported. */
DHSA_API dhsa_status dhsa_kv_index_route(dhsa_ctx *ctx, const dhsa_kv_index *ix, const dhsa_attn_desc *a,
                                         dhsa_layout **out);

/* Whether query row `row` of (batch b, KV head g) may attend to key `key`
 * under the layout (its block's ranges; causality/window not applied).
 * Returns 1, 0, or a negative status on bad arguments. */
DHSA_API int dhsa_layout_selects(const dhsa_layout *layout, int64_t b, int64_t g, int64_t row, int64_t key);

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

/* ------------------------------------------------------------------------ */
/* Process memory (Linux /proc; 0 elsewhere)                                 */

/* Peak resident set in bytes: max(VmHWM, VmRSS), or 0 if unknown. */
DHSA_API size_t dhsa_proc_peak_rss(void);
/* Current resident set (VmRSS) in bytes, or 0 if unknown. */
DHSA_API size_t dhsa_proc_rss(void);
/* Resets VmHWM to the current RSS (writes 5 to /proc/self/clear_refs). */
DHSA_API dhsa_status dhsa_proc_reset_peak_rss(void);

/* ------------------------------------------------------------------------ */
/* GGUF files (src/model/gguf.c, docs/gguf.md)                              */
/* ---- GGUF block begin ---- */

/* Value types of GGUF metadata (the ids the file stores). */
typedef enum {
    DHSA_GGUF_UINT8 = 0,
    DHSA_GGUF_INT8 = 1,
    DHSA_GGUF_UINT16 = 2,
    DHSA_GGUF_INT16 = 3,
    DHSA_GGUF_UINT32 = 4,
    DHSA_GGUF_INT32 = 5,
    DHSA_GGUF_FLOAT32 = 6,
    DHSA_GGUF_BOOL = 7,
    DHSA_GGUF_STRING = 8,
    DHSA_GGUF_ARRAY = 9,
    DHSA_GGUF_UINT64 = 10,
    DHSA_GGUF_INT64 = 11,
    DHSA_GGUF_FLOAT64 = 12
} dhsa_gguf_type;

/* Tensor types (ggml ids) whose sizes dhsa knows. Other ids are kept, with
 * an unknown size. */
typedef enum {
    DHSA_GGML_F32 = 0,
    DHSA_GGML_F16 = 1,
    DHSA_GGML_Q4_0 = 2,
    DHSA_GGML_Q4_1 = 3,
    DHSA_GGML_Q5_0 = 6,
    DHSA_GGML_Q5_1 = 7,
    DHSA_GGML_Q8_0 = 8,
    DHSA_GGML_Q2_K = 10,
    DHSA_GGML_Q3_K = 11,
    DHSA_GGML_Q4_K = 12,
    DHSA_GGML_Q5_K = 13,
    DHSA_GGML_Q6_K = 14,
    DHSA_GGML_IQ4_NL = 20,
    DHSA_GGML_IQ4_XS = 23,
    DHSA_GGML_BF16 = 30
} dhsa_ggml_type;

/* "UINT32", "STRING", ...; "?" for an id outside the enum. */
DHSA_API const char *dhsa_gguf_type_name(dhsa_gguf_type t);
/* "F32", "Q4_K", ...; "?" for an id dhsa does not know. */
DHSA_API const char *dhsa_ggml_type_name(uint32_t ggml_type);
/* Bytes of a tensor of n_dims dims (fastest first) of a known type; dims[0]
 * must be a multiple of the type's block. DHSA_ERR_UNSUPPORTED for an
 * unknown type, DHSA_ERR_SHAPE / DHSA_ERR_TOO_LARGE for bad dims. */
DHSA_API dhsa_status dhsa_ggml_tensor_bytes(uint32_t ggml_type, int n_dims, const int64_t *dims, int64_t *bytes);

/* A string from a GGUF file: a NUL-terminated copy owned by the dhsa_gguf;
 * len is authoritative (the bytes may hold a NUL). */
typedef struct {
    const char *str;
    int64_t len;
} dhsa_gguf_str;

/* An array value. data holds n elements as C types (uint8_t ... double;
 * BOOL as uint8_t 0/1; STRING as dhsa_gguf_str), decoded from little endian
 * and 8-byte aligned. An array of arrays is listed (type ARRAY, n) but its
 * elements are not kept: data is NULL. */
typedef struct {
    dhsa_gguf_type type;
    int64_t n;
    const void *data;
} dhsa_gguf_array;

/* One metadata key/value, read-only, owned by the dhsa_gguf. Which value
 * field holds the value depends on type: u (UINT8/16/32/64, BOOL as 0/1),
 * i (INT8/16/32/64), f (FLOAT32, FLOAT64), str (STRING), arr (ARRAY). */
typedef struct {
    const char *key;
    int64_t key_len;
    dhsa_gguf_type type;
    uint64_t u;
    int64_t i;
    double f;
    dhsa_gguf_str str;
    dhsa_gguf_array arr;
    uint64_t offset; /* byte offset of the key/value in the file */
} dhsa_gguf_kv;

/* One tensor, read-only, owned by the dhsa_gguf. */
typedef struct {
    const char *name;
    uint32_t type;       /* ggml type id (dhsa_ggml_type or another id) */
    int n_dims;          /* 0..4 */
    int64_t dims[4];     /* fastest-varying first (GGUF order); unused = 1 */
    int64_t n_elements;
    uint64_t offset;     /* from the start of the data section */
    int64_t bytes;       /* -1 when the type's size is unknown */
    const void *data;    /* inside the file, aligned as the file says;
                            NULL when bytes = -1 */
} dhsa_gguf_tensor;

typedef struct dhsa_gguf dhsa_gguf;

/* Opens a GGUF v2/v3 file read-only (mmap; read() when mmap fails). Every
 * count, length, offset, type and alignment is checked against the file
 * size before use; a malformed file gives DHSA_ERR_FORMAT and a sentence
 * naming what is wrong and at which byte. *out is NULL on failure. */
DHSA_API dhsa_status dhsa_gguf_open(const char *path, dhsa_gguf **out);
/* The same over a caller's buffer, which is borrowed: it must outlive the
 * dhsa_gguf (tensor data pointers point into it). */
DHSA_API dhsa_status dhsa_gguf_open_memory(const void *data, size_t size, dhsa_gguf **out);
/* Unmaps and frees; every pointer obtained from g dies. NULL is allowed. */
DHSA_API void dhsa_gguf_close(dhsa_gguf *g);

DHSA_API uint32_t dhsa_gguf_version(const dhsa_gguf *g);
DHSA_API uint64_t dhsa_gguf_alignment(const dhsa_gguf *g);
/* Byte offset of the (aligned) data section in the file. */
DHSA_API uint64_t dhsa_gguf_data_offset(const dhsa_gguf *g);
DHSA_API uint64_t dhsa_gguf_file_size(const dhsa_gguf *g);

/* Metadata, in file order (every key, known to dhsa or not). */
DHSA_API int64_t dhsa_gguf_n_kv(const dhsa_gguf *g);
/* NULL when i is out of range. */
DHSA_API const dhsa_gguf_kv *dhsa_gguf_kv_at(const dhsa_gguf *g, int64_t i);
/* Index of key, or -1 when absent. */
DHSA_API int64_t dhsa_gguf_find_kv(const dhsa_gguf *g, const char *key);

/* Typed getters. They fail with DHSA_ERR_FORMAT (sentence names the key)
 * when the key is absent or its type does not fit: the integer getters take
 * any integer type whose value fits the result; get_f32 takes FLOAT32 (and
 * FLOAT64, rounded); get_bool only BOOL; get_str only STRING (*len may be
 * NULL); get_arr only ARRAY. */
DHSA_API dhsa_status dhsa_gguf_get_u32(const dhsa_gguf *g, const char *key, uint32_t *out);
DHSA_API dhsa_status dhsa_gguf_get_u64(const dhsa_gguf *g, const char *key, uint64_t *out);
DHSA_API dhsa_status dhsa_gguf_get_i64(const dhsa_gguf *g, const char *key, int64_t *out);
DHSA_API dhsa_status dhsa_gguf_get_f32(const dhsa_gguf *g, const char *key, float *out);
DHSA_API dhsa_status dhsa_gguf_get_bool(const dhsa_gguf *g, const char *key, int *out);
DHSA_API dhsa_status dhsa_gguf_get_str(const dhsa_gguf *g, const char *key, const char **out, int64_t *len);
DHSA_API dhsa_status dhsa_gguf_get_arr(const dhsa_gguf *g, const char *key, dhsa_gguf_array *out);

/* Tensors, in file order. */
DHSA_API int64_t dhsa_gguf_n_tensors(const dhsa_gguf *g);
/* NULL when i is out of range. */
DHSA_API const dhsa_gguf_tensor *dhsa_gguf_tensor_at(const dhsa_gguf *g, int64_t i);
/* Index of the tensor, or -1 when absent. */
DHSA_API int64_t dhsa_gguf_find_tensor(const dhsa_gguf *g, const char *name);
/* The tensor's bytes; DHSA_ERR_UNSUPPORTED (sentence names the tensor and
 * the type id) when its type's size is unknown. */
DHSA_API dhsa_status dhsa_gguf_tensor_data(const dhsa_gguf *g, int64_t i, const void **data, int64_t *bytes);

/* Writer: a builder of a GGUF v3 file (alignment 32, or general.alignment
 * when set as a UINT32 power of two). Keys and tensor names must be unique
 * (a second set of the same key fails); values are copied at once; tensor
 * data is borrowed until the write. */
typedef struct dhsa_gguf_writer dhsa_gguf_writer;

DHSA_API dhsa_status dhsa_gguf_writer_create(dhsa_gguf_writer **out);
DHSA_API void dhsa_gguf_writer_free(dhsa_gguf_writer *w);
DHSA_API dhsa_status dhsa_gguf_writer_set_u8(dhsa_gguf_writer *w, const char *key, uint8_t v);
DHSA_API dhsa_status dhsa_gguf_writer_set_i8(dhsa_gguf_writer *w, const char *key, int8_t v);
DHSA_API dhsa_status dhsa_gguf_writer_set_u16(dhsa_gguf_writer *w, const char *key, uint16_t v);
DHSA_API dhsa_status dhsa_gguf_writer_set_i16(dhsa_gguf_writer *w, const char *key, int16_t v);
DHSA_API dhsa_status dhsa_gguf_writer_set_u32(dhsa_gguf_writer *w, const char *key, uint32_t v);
DHSA_API dhsa_status dhsa_gguf_writer_set_i32(dhsa_gguf_writer *w, const char *key, int32_t v);
DHSA_API dhsa_status dhsa_gguf_writer_set_u64(dhsa_gguf_writer *w, const char *key, uint64_t v);
DHSA_API dhsa_status dhsa_gguf_writer_set_i64(dhsa_gguf_writer *w, const char *key, int64_t v);
DHSA_API dhsa_status dhsa_gguf_writer_set_f32(dhsa_gguf_writer *w, const char *key, float v);
DHSA_API dhsa_status dhsa_gguf_writer_set_f64(dhsa_gguf_writer *w, const char *key, double v);
DHSA_API dhsa_status dhsa_gguf_writer_set_bool(dhsa_gguf_writer *w, const char *key, int v);
/* A NUL-terminated string. */
DHSA_API dhsa_status dhsa_gguf_writer_set_str(dhsa_gguf_writer *w, const char *key, const char *s);
/* A string of len bytes (may hold NULs). */
DHSA_API dhsa_status dhsa_gguf_writer_set_strn(dhsa_gguf_writer *w, const char *key, const char *s, int64_t len);
/* An array of n numeric or BOOL elements of type elem, packed as C types
 * (BOOL as uint8_t). */
DHSA_API dhsa_status dhsa_gguf_writer_set_arr(dhsa_gguf_writer *w, const char *key, dhsa_gguf_type elem,
                                              const void *data, int64_t n);
/* An array of n NUL-terminated strings. */
DHSA_API dhsa_status dhsa_gguf_writer_set_arr_str(dhsa_gguf_writer *w, const char *key, const char *const *strs,
                                                  int64_t n);
/* A tensor of a known ggml type; bytes must equal dhsa_ggml_tensor_bytes. */
DHSA_API dhsa_status dhsa_gguf_writer_add_tensor(dhsa_gguf_writer *w, const char *name, uint32_t ggml_type, int n_dims,
                                                 const int64_t *dims, const void *data, int64_t bytes);
/* Exact size of the file the writer would write. */
DHSA_API dhsa_status dhsa_gguf_writer_size(const dhsa_gguf_writer *w, size_t *bytes);
/* Writes the file into buf (cap >= dhsa_gguf_writer_size). */
DHSA_API dhsa_status dhsa_gguf_writer_write_memory(const dhsa_gguf_writer *w, void *buf, size_t cap);
/* Writes the file at path (removed again if writing fails). */
/* The file goes to a temporary in path's folder (PATH.part.PID.N), is
 * flushed, fsync'ed and renamed over path only when complete: a process
 * that has the old file mapped keeps its bytes, and a failure removes the
 * temporary and leaves the old file untouched (docs/files.md). */
DHSA_API dhsa_status dhsa_gguf_writer_write_file(const dhsa_gguf_writer *w, const char *path);

/* ---- GGUF block end ---- */

/* ---- Tokenizer block begin ---- */
/* ------------------------------------------------------------------------ */
/* Tokenizers (src/model/tokenizer.c, docs/tokenizer.md)                    */

/* Which algorithm a vocabulary uses (tokenizer.ggml.model). */
typedef enum {
    DHSA_TOKENIZER_SPM = 1, /* "llama": SentencePiece BPE by score, byte fallback */
    DHSA_TOKENIZER_BPE = 2  /* "gpt2": byte-level BPE by merge rank */
} dhsa_tokenizer_kind;

/* Token types (tokenizer.ggml.token_type; the ids GGUF stores). */
typedef enum {
    DHSA_TOKEN_NORMAL = 1,
    DHSA_TOKEN_UNKNOWN = 2,
    DHSA_TOKEN_CONTROL = 3,      /* <s>, </s>, <|endoftext|>: never from plain text */
    DHSA_TOKEN_USER_DEFINED = 4, /* added tokens: matched whole in any text */
    DHSA_TOKEN_UNUSED = 5,
    DHSA_TOKEN_BYTE = 6          /* <0xXX> byte fallback */
} dhsa_token_type;

/* Flags of dhsa_tokenize. */
#define DHSA_TOKENIZE_ADD_BOS 1u       /* prepend the BOS id (if the vocab has one) */
#define DHSA_TOKENIZE_ADD_EOS 2u       /* append the EOS id (if the vocab has one) */
#define DHSA_TOKENIZE_PARSE_SPECIAL 4u /* also match CONTROL and UNKNOWN token texts ("<s>", "<unk>") */
/* Flags of dhsa_detokenize / dhsa_token_to_piece. */
#define DHSA_DETOKENIZE_SPECIAL 1u     /* render CONTROL tokens as their text */
#define DHSA_DETOKENIZE_KEEP_SPACE 2u  /* keep the space an SPM prefix added */

/* Limits (DHSA_ERR_TOO_LARGE above them). */
#define DHSA_TOKENIZER_MAX_VOCAB (1 << 24)
#define DHSA_TOKENIZER_MAX_TOKEN_BYTES 65536
#define DHSA_TOKENIZER_MAX_TEXT ((int64_t)1 << 30)

typedef struct dhsa_tokenizer dhsa_tokenizer;

/* Builds a tokenizer from the tokenizer.ggml.* metadata of g: model
 * ("llama" or "gpt2"), tokens, scores, token_type, merges, pre (gpt2 only:
 * "default" and "gpt-2" (GPT-2 regex), "starcoder", "llama-bpe"/"llama3",
 * "qwen2"; any other name is DHSA_ERR_UNSUPPORTED, naming it), bos / eos /
 * unknown ids, add_bos_token, add_eos_token, add_space_prefix. Everything
 * needed is copied: g may be closed after. A malformed key is
 * DHSA_ERR_FORMAT naming the key. *out is NULL on failure; free with
 * dhsa_tokenizer_free. */
DHSA_API dhsa_status dhsa_tokenizer_from_gguf(const dhsa_gguf *g, dhsa_tokenizer **out);
/* NULL is allowed. */
DHSA_API void dhsa_tokenizer_free(dhsa_tokenizer *t);

DHSA_API dhsa_tokenizer_kind dhsa_tokenizer_kind_of(const dhsa_tokenizer *t);
DHSA_API int64_t dhsa_tokenizer_n_vocab(const dhsa_tokenizer *t);
/* Ids from the metadata; -1 when the vocab has none. */
DHSA_API int32_t dhsa_tokenizer_bos(const dhsa_tokenizer *t);
DHSA_API int32_t dhsa_tokenizer_eos(const dhsa_tokenizer *t);
DHSA_API int32_t dhsa_tokenizer_unk(const dhsa_tokenizer *t);
/* DHSA_TOKENIZE_ADD_BOS / _ADD_EOS as tokenizer.ggml.add_bos_token /
 * add_eos_token say (defaults: SPM adds BOS, BPE nothing). */
DHSA_API unsigned dhsa_tokenizer_default_flags(const dhsa_tokenizer *t);
/* The vocabulary text of id as stored ('▁' for SPM spaces, the byte-to-
 * unicode mapping for BPE), NUL-terminated, owned by t; NULL when id is
 * out of range. len may be NULL. */
DHSA_API const char *dhsa_tokenizer_text(const dhsa_tokenizer *t, int32_t id, int64_t *len);
/* Type of id (dhsa_token_type); 0 when id is out of range. */
DHSA_API int dhsa_tokenizer_type(const dhsa_tokenizer *t, int32_t id);

/* Upper bound on the ids dhsa_tokenize can produce for len bytes. */
DHSA_API int64_t dhsa_tokenize_max_ids(int64_t len);
/* Tokenizes text[0..len) as llama.cpp does (docs/tokenizer.md). Special
 * tokens are cut out first, longest first: USER_DEFINED ones always, CONTROL
 * and UNKNOWN ones only with DHSA_TOKENIZE_PARSE_SPECIAL. Token types are
 * the file's, corrected as llama.cpp corrects them: every end-of-generation
 * text (</s>, <|endoftext|>, <|im_end|>, <|eot_id|>, ...) and, where the
 * file names no id for them, fill-in-the-middle texts are CONTROL, so plain
 * text never becomes them; a phi-3 vocabulary (general.name) drops the
 * whitespace after its special tokens but <unk>, <s> and <|endoftext|>.
 * Any bytes: invalid UTF-8 becomes byte tokens in SPM and U+FFFD in BPE
 * (as in llama.cpp); a byte a BPE vocabulary has no token for is dropped,
 * never unk; NUL is an ordinary byte. Writes at most
 * cap ids; *n_ids is always the full count, so ids = NULL, cap = 0 sizes
 * the buffer; a count above cap is DHSA_ERR_INVALID_ARG (the ids that fit
 * are written). Not a hot path: scratch comes from malloc for the call. */
DHSA_API dhsa_status dhsa_tokenize(const dhsa_tokenizer *t, const char *text, int64_t len, unsigned flags, int32_t *ids,
                                   int64_t cap, int64_t *n_ids);
/* The bytes of one token: SPM '▁' becomes ' ' and <0xXX> the byte; BPE
 * text is mapped back to bytes; CONTROL tokens are empty unless
 * DHSA_DETOKENIZE_SPECIAL. Writes at most cap bytes (no NUL); *len is the
 * full length; more than cap is DHSA_ERR_INVALID_ARG. */
DHSA_API dhsa_status dhsa_token_to_piece(const dhsa_tokenizer *t, int32_t id, unsigned flags, char *out, int64_t cap,
                                         int64_t *len);
/* The bytes of ids[0..n) concatenated; when the vocab adds a space prefix
 * (SPM), the leading space of the first non-empty piece, and of the first
 * piece after each CONTROL or USER_DEFINED token (where dhsa_tokenize adds
 * a prefix too), is removed unless DHSA_DETOKENIZE_KEEP_SPACE, so
 * detokenize(tokenize(x)) == x. Same cap /
 * len contract as dhsa_token_to_piece; an id out of range is
 * DHSA_ERR_INVALID_ARG. */
DHSA_API dhsa_status dhsa_detokenize(const dhsa_tokenizer *t, const int32_t *ids, int64_t n, unsigned flags, char *out,
                                     int64_t cap, int64_t *len);
/* ---- Tokenizer block end ---- */

/* ---- Chat block begin ---- */
/* ------------------------------------------------------------------------ */
/* Chat templates (src/model/chat.c, docs/chat.md)                          */

/* The prompt formats dhsa writes itself (no Jinja). */
typedef enum {
    DHSA_CHAT_NONE = 0,    /* no known format */
    DHSA_CHAT_LLAMA3 = 1,  /* <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|> */
    DHSA_CHAT_CHATML = 2,  /* <|im_start|>role\ncontent<|im_end|>\n (Qwen2, ...) */
    DHSA_CHAT_GEMMA = 3,   /* <start_of_turn>user\n...<end_of_turn>\n; assistant is "model" */
    DHSA_CHAT_MISTRAL = 4, /* [INST] user [/INST] answer</s> */
    DHSA_CHAT_LLAMA2 = 5,  /* [INST] <<SYS>>\nsystem\n<</SYS>>\n\nuser [/INST] answer </s><s>... */
    DHSA_CHAT_PHI3 = 6,    /* <|user|>\ncontent<|end|>\n ... <|assistant|>\n (Phi-3, Phi-3.5) */
    DHSA_CHAT_QWEN25 = 7,  /* CHATML, first a system turn: the given one, else Qwen2.5-Instruct's default */
    DHSA_CHAT_SMOLLM2 = 8  /* CHATML, SmolLM2-Instruct's default system turn when none is given first */
} dhsa_chat_template;

/* One message: role "system", "user" or "assistant" (Llama 3 also takes
 * "ipython"); content is UTF-8 text. Both NUL-terminated, borrowed. */
typedef struct {
    const char *role;
    const char *content;
} dhsa_chat_message;

/* The format a model's metadata names, unchecked (dhsa_chat_choose below
 * refuses what is not checked): a checked template (dhsa_chat_choose) its
 * format, else tokenizer.chat_template's markers, in llama.cpp's order (<|im_start|> -> CHATML; [INST] -> LLAMA2
 * when the template also has <<SYS>>, NONE with Mistral's v3/v7 markers
 * [AVAILABLE_TOOLS] or [SYSTEM_PROMPT], else MISTRAL; <start_of_turn> ->
 * GEMMA; <|start_header_id|> and <|end_header_id|> -> LLAMA3); a template
 * with none of them is NONE (a format dhsa does not write is not guessed
 * over). Without a template,
 * general.architecture: qwen/qwen2/qwen2moe/qwen3/qwen3moe -> CHATML,
 * gemma/gemma2/gemma3 -> GEMMA, llama -> LLAMA3 when the vocabulary has a
 * <|start_header_id|> token, else MISTRAL when general.name says
 * "mistral", else LLAMA2. Anything else (or g = NULL) is NONE. */
DHSA_API dhsa_chat_template dhsa_chat_detect(const dhsa_gguf *g);
/* The format to write a model's conversations in, as the CLI and the
 * Python binding choose it: when the file has a tokenizer.chat_template,
 * only a template dhsa renders byte for byte as jinja2 does (known by the
 * SHA-256 of its text; the list and how it is checked: docs/chat.md) is
 * taken (QWEN25 for Qwen2.5-Instruct's, SMOLLM2 for SmolLM2-Instruct's);
 * any other template is DHSA_ERR_UNSUPPORTED, *out set to the closest
 * format dhsa_chat_detect finds (NONE when none), and the error says so
 * and asks for --template NAME or --template plain. Without a template,
 * dhsa_chat_detect's choice by architecture (DHSA_ERR_UNSUPPORTED when it
 * is NONE). On success *how is a static sentence saying which way the
 * format was chosen. */
DHSA_API dhsa_status dhsa_chat_choose(const dhsa_gguf *g, dhsa_chat_template *out, const char **how);
/* "llama3", "chatml" (or "qwen2"), "qwen2.5", "smollm2", "gemma",
 * "mistral", "llama2", "phi3", "none";
 * another name is DHSA_ERR_UNSUPPORTED listing these. */
DHSA_API dhsa_status dhsa_chat_template_from_name(const char *name, dhsa_chat_template *out);
/* "llama3", "chatml", ...; "none" for NONE; "?" outside the enum. */
DHSA_API const char *dhsa_chat_template_name(dhsa_chat_template t);

/* Writes msgs[0..n) in format t, then, with add_generation_prompt, the
 * opening of the assistant's turn (LLAMA3, CHATML, GEMMA; MISTRAL and
 * LLAMA2 have none: a user turn already ends in [/INST]).
 * BOS: the text never starts with it; the tokenizer adds it once where
 * the vocabulary wants it (dhsa_tokenizer_default_flags). To feed a model,
 * use dhsa_chat_tokenize below: it parses the special texts (<|eot_id|>,
 * </s>, the <s> that opens each later LLAMA2 turn, ...) of the template
 * only. Content is copied as is, so tokenizing this text with
 * DHSA_TOKENIZE_PARSE_SPECIAL would turn a special text inside a message
 * into that token too.
 * Contents are trimmed where the model's own template trims (LLAMA3,
 * GEMMA, LLAMA2). Roles: see docs/chat.md; GEMMA, MISTRAL and LLAMA2 take
 * one optional system message first, then user and assistant in turn from
 * user. A role or order the format does not allow, NONE, or a NULL role or
 * content is DHSA_ERR_INVALID_ARG naming the message. Writes at most cap
 * bytes (no NUL); *len is the full length; more than cap is
 * DHSA_ERR_INVALID_ARG (out = NULL, cap = 0 sizes the buffer). */
DHSA_API dhsa_status dhsa_chat_apply(dhsa_chat_template t, const dhsa_chat_message *msgs, int64_t n,
                                     int add_generation_prompt, char *out, int64_t cap, int64_t *len);

/* The tokens of msgs in format t (the text dhsa_chat_apply writes) with
 * vocabulary tok: the template's own markers (<|im_start|>, <|eot_id|>,
 * </s>, ...) become their special tokens, the messages' text is plain text
 * (a "<|im_end|>" or "<s>" a user typed stays text, so a message cannot
 * open or close a turn). The text between special tokens is encoded whole,
 * so a conversation whose messages hold no special text gets the ids of
 * its whole text tokenized with DHSA_TOKENIZE_PARSE_SPECIAL (llama.cpp's).
 * flags: DHSA_TOKENIZE_ADD_BOS / _ADD_EOS only (usually
 * dhsa_tokenizer_default_flags(tok)); any other flag is
 * DHSA_ERR_INVALID_ARG. Messages as dhsa_chat_apply takes them (same
 * errors). Writes at most cap ids; *n_ids is the full count; more than cap
 * is DHSA_ERR_INVALID_ARG (ids = NULL, cap = 0 sizes the buffer). */
DHSA_API dhsa_status dhsa_chat_tokenize(dhsa_chat_template t, const dhsa_tokenizer *tok, const dhsa_chat_message *msgs,
                                        int64_t n, int add_generation_prompt, unsigned flags, int32_t *ids, int64_t cap,
                                        int64_t *n_ids);

/* The ids that end a model's turn in format t with vocabulary tok: the
 * vocabulary's EOS, then those of the format's end-of-turn texts that are
 * tokens of tok (LLAMA3: <|eot_id|>, <|eom_id|>, <|end_of_text|>; CHATML:
 * <|im_end|>, <|endoftext|>; GEMMA: <end_of_turn>, <eos>; MISTRAL,
 * LLAMA2, NONE: </s>), each once. Writes at most cap ids; *n is the full
 * count; more than cap is DHSA_ERR_INVALID_ARG. */
DHSA_API dhsa_status dhsa_chat_stop_ids(dhsa_chat_template t, const dhsa_tokenizer *tok, int32_t *ids, int cap, int *n);
/* ---- Chat block end ---- */

/* ---- llama2.c block begin ---- */
/* ------------------------------------------------------------------------ */
/* llama2.c checkpoints (src/model/llama2c.c, docs/llama2c.md)              */

/* The header of a llama2.c checkpoint (run.c's Config: 7 int32), checked
 * against the file: every field positive, n_heads divides dim, n_kv_heads
 * divides n_heads, the head size even, 3 <= vocab_size <= 2^24, and the
 * file exactly as long as the header implies. */
typedef struct {
    int32_t dim, hidden_dim, n_layers, n_heads, n_kv_heads;
    int32_t vocab_size;     /* |vocab_size| of the file */
    int32_t seq_len;        /* the trained context (llama.context_length) */
    int shared_classifier;  /* 1 (vocab_size > 0 in the file): the output
                               projection is token_embd; 0: its own weights
                               at the end of the file */
    int32_t head_size;      /* dim / n_heads */
    uint64_t file_size;     /* bytes of the checkpoint, header included */
    int64_t n_params;       /* floats of the weights the model uses (the
                               RoPE tables the file also holds excluded) */
} dhsa_llama2c_config;

/* Reads and checks the header of the checkpoint at bin_path (only the
 * header is read; the size comes from the file system). A GGUF file, a
 * llama2.c "ak42" export (version 1/2) and a malformed header are
 * DHSA_ERR_FORMAT with a sentence naming the field; missing files
 * DHSA_ERR_IO. */
DHSA_API dhsa_status dhsa_llama2c_read_config(const char *bin_path, dhsa_llama2c_config *out);
/* The same over the checkpoint's bytes. */
DHSA_API dhsa_status dhsa_llama2c_config_from_memory(const void *bin, size_t size, dhsa_llama2c_config *out);

/* Converts a llama2.c checkpoint and its tokenizer file (tok*.bin: int32
 * max_token_length, then per token float score, int32 length, bytes) into
 * a GGUF image in memory (architecture llama, F32 tensors, llama.cpp
 * names; docs/llama2c.md) and opens it: *out is an ordinary dhsa_gguf that
 * owns the image (dhsa_gguf_close frees it). Both files are checked
 * completely before anything is built: the header as above, every token's
 * length within the file and <= max_token_length, finite scores, no NUL
 * in a token's text, and exactly vocab_size tokens in the tokenizer file.
 * A bad file is DHSA_ERR_FORMAT (DHSA_ERR_TOO_LARGE above a limit) with a
 * sentence that starts with the file's path. Memory: the checkpoint is
 * mapped, the image is about its size. *out is NULL on failure. */
DHSA_API dhsa_status dhsa_llama2c_open(const char *bin_path, const char *tok_path, dhsa_gguf **out);
/* The same over the files' bytes, which are only read during the call.
 * name is general.name (NULL: "llama2.c"). */
DHSA_API dhsa_status dhsa_llama2c_open_memory(const void *bin, size_t bin_size, const void *tok, size_t tok_size,
                                              const char *name, dhsa_gguf **out);
/* Writes the GGUF file dhsa_llama2c_open would build at out_gguf_path
 * (with dhsa_gguf_writer_write_file: a temporary renamed when complete, so
 * a failure leaves no partial file and the old one untouched);
 * general.name is the checkpoint's file name without directory and
 * extension. The output may not be either input. A NaN or infinite weight
 * is DHSA_ERR_NONFINITE, naming the tensor, before anything is written. */
DHSA_API dhsa_status dhsa_convert_llama2c(const char *bin_path, const char *tok_path, const char *out_gguf_path);
/* ---- llama2.c block end ---- */

/* ---- Model block begin ---- */
/* ------------------------------------------------------------------------ */
/* Model runner (src/model/model.c, docs/model.md)                          */

typedef enum {
    DHSA_ARCH_LLAMA = 1,
    DHSA_ARCH_QWEN2 = 2,
    DHSA_ARCH_GEMMA2 = 3,
    DHSA_ARCH_QWEN3 = 4,  /* qwen2 without required biases, plus per-head RMSNorm of q and k */
    DHSA_ARCH_GEMMA3 = 5, /* gemma2 plus q/k norms, 5 sliding layers in 6, no softcaps by default */
    DHSA_ARCH_PHI3 = 6    /* fused attn_qkv and gate/up (ffn_up holds 2 n_ff rows), LongRoPE factors */
} dhsa_arch;

/* Hyperparameters read from the GGUF metadata (docs/model.md). */
typedef struct {
    dhsa_arch arch;
    const char *arch_name;      /* "llama", "qwen2", "gemma2", "qwen3", "gemma3", "phi3" */
    int64_t n_vocab, n_ctx_train, n_embd, n_layer, n_ff;
    int64_t n_head, n_head_kv, head_dim_k, head_dim_v, n_rot;
    float rms_eps, rope_base, rope_linear_factor;
    int rope_neox;              /* 1: split-half pairs (all but llama) */
    int has_rope_freqs;         /* rope_freqs.weight present */
    float rope_base_swa, rope_linear_factor_swa; /* RoPE of the sliding-window layers (gemma2: the
                                   global ones'; gemma3: rope.freq_base_swa or 10000, no scaling) */
    float rope_attn_factor;     /* rope.scaling.attn_factor: rotated q/k values scaled by it (1 = none) */
    int has_rope_factors;       /* rope_factors_long/short.weight present (LongRoPE, phi3) */
    int64_t n_ctx_orig;         /* rope.scaling.original_context_length: a session with a longer
                                   context uses rope_factors_long, else rope_factors_short */
    int qk_norm;                /* per-head RMSNorm of q and k before RoPE (qwen3, gemma3) */
    int fused_ffn;              /* gate and up in one ffn_up.weight of 2 n_ff rows (phi3) */
    float attn_softcap, final_softcap; /* 0 = none */
    float attn_scale;           /* scores = q.k * attn_scale: 1/sqrt(head_dim_k), but gemma2 with
                                   46 layers and gemma3 with 62 (27B) 1/sqrt(n_embd / n_head), as
                                   llama.cpp */
    int64_t sliding_window;     /* window of the sliding layers (gemma2, gemma3); 0 = none */
    int64_t n_swa_layers;       /* how many layers slide (gemma2: the even ones; gemma3: 5 in 6) */
    int tied_output;            /* output.weight absent: token_embd used */
    uint32_t weight_type;       /* ggml type of most matrix bytes */
    int64_t n_params;           /* values in all tensors */
    int64_t weight_bytes;       /* bytes of all tensors */
} dhsa_model_info;

typedef struct dhsa_model dhsa_model;

typedef struct {
    /* A llama2.c checkpoint (a file without the GGUF magic) needs its
     * tokenizer file (tok*.bin); it is converted in memory. */
    const char *tokenizer_path;
    int check_finite;           /* scan every weight for NaN/Inf (default 1) */
} dhsa_model_params;

DHSA_API dhsa_model_params dhsa_model_default_params(void);
/* A model is read-only once loaded: any number of sessions, on any threads
 * and ctxs, may use one at once ("Threads"). */
/* Loads a GGUF model (mmap; weights are used in place) or a llama2.c
 * checkpoint. Every tensor the architecture needs is checked for presence,
 * type and shape before anything runs; the optional ones it knows (biases,
 * fused QKV, rope_freqs, output.weight: docs/model.md) are applied when
 * present; a tensor it does not use is DHSA_ERR_UNSUPPORTED naming it (as
 * llama.cpp refuses such a file), since ignoring it would give wrong
 * results. Names from the file are escaped in every sentence. *out is
 * NULL on failure. */
DHSA_API dhsa_status dhsa_model_load(const char *path, const dhsa_model_params *p, dhsa_model **out);
/* The same from an open GGUF, which the model takes over (it is closed
 * with the model, or at once on failure). */
DHSA_API dhsa_status dhsa_model_from_gguf(dhsa_gguf *g, const dhsa_model_params *p, dhsa_model **out);
/* NULL is allowed. */
DHSA_API void dhsa_model_free(dhsa_model *m);
DHSA_API const dhsa_model_info *dhsa_model_get_info(const dhsa_model *m);
/* Writes to buf (NUL-terminated, cut to n bytes) what the weight products
 * of a session with this `exact` setting run, per weight type of the
 * model's matrices, e.g. "Q4_K, Q6_K: int8 avx512-vnni; F32: f32 avx512". */
DHSA_API dhsa_status dhsa_model_routes(const dhsa_model *m, int exact, char *buf, size_t n);
DHSA_API const dhsa_gguf *dhsa_model_gguf(const dhsa_model *m);
/* The model's tokenizer (owned by the model). */
DHSA_API const dhsa_tokenizer *dhsa_model_tokenizer(const dhsa_model *m);

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
     * + n_ubatch positions: row j is position k_pos0 + j), a->o the output,
     * a->layout the routing (NULL when dense), a->q_pos0, window, softcap,
     * scale as used. Everything is read-only and valid during the call only. For
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
                         range requests */
    double partial;   /* decode: partial outputs and their LSE */
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
 * tokens been evaluated. n = length does nothing; n outside [0, length] is
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
/* ---- Model block end ---- */

/* ---- Structured output block begin (src/model/json_constraint.c, docs/server.md) ---- */
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
/* ---- Structured output block end ---- */

/* ---- Retrieval tasks block begin (src/eval/retrieval.c, docs/eval.md) ---- */
/* The long-context retrieval tasks the default model was trained on
 * (train/tasks.py writes the same strings), built to a token length with
 * the asked needle at a depth, and their scoring:
 *   passkey     "There is an important info hidden inside a lot of irrelevant
 *               text. Find it and memorize it. I will quiz you about the
 *               important information there. " FILLER " The pass key is N.
 *               Remember it. N is the pass key. " FILLER " What is the pass
 *               key? The pass key is"                        -> " N" (5 digits)
 *   multikey    "Some special magic numbers are hidden within the following
 *               text. Make sure to memorize it. I will quiz you about the
 *               numbers afterwards. " FILLER with n_keys sentences "One of
 *               the special magic numbers for KW is: N." (distinct keywords)
 *               " What is the special magic number for KW mentioned in the
 *               provided text? The special magic number for KW mentioned in
 *               the provided text is"                        -> " N" (7 digits)
 *   multivalue  the same with n_keys values for one keyword and n_distract
 *               other keywords; " What are all the special magic numbers for
 *               KW mentioned in the provided text? The special magic numbers
 *               for KW mentioned in the provided text are" -> " N1, N2, N3"
 *               (in the order they appear)
 * Numbers come from the held-out set (crc32 of the decimal text = 0 mod
 * 10) or its complement (the training set), so an evaluation never asks a
 * key the model was trained on. */
typedef enum { DHSA_TASK_PASSKEY = 1, DHSA_TASK_MULTIKEY = 2, DHSA_TASK_MULTIVALUE = 3 } dhsa_task_kind;
/* "passkey", "multikey", "multivalue"; "?" otherwise. */
DHSA_API const char *dhsa_task_kind_name(dhsa_task_kind k);
/* Built-in filler: *n plain sentences written for dhsa (public domain),
 * free of numbers; a task built with filler NULL uses them, repeated in an
 * order drawn from its seed. */
DHSA_API const char *const *dhsa_task_builtin_sentences(int64_t *n);

#define DHSA_TASK_MAX_NEEDLES 16

typedef struct {
    dhsa_task_kind kind;
    int64_t length;          /* most prompt tokens, BOS included (>= 64) */
    double depth;            /* 0..1: where the asked needle sits in the filler */
    uint64_t seed;           /* filler offset, keys, other needles' places */
    int n_keys;              /* multikey: needles (default 4); multivalue: values (3) */
    int n_distract;          /* multivalue: other keywords (default 1) */
    const char *filler;      /* filler text (whitespace runs count as one space);
                                NULL: the built-in sentences */
    int64_t filler_len;
    const char *const *keywords; /* multikey / multivalue; NULL = a built-in list */
    int64_t n_keywords;
    int heldout_numbers;     /* 1 (default): held-out numbers; 0: the training set */
} dhsa_task_params;

typedef struct {
    int32_t *ids;            /* [n_ids] the prompt's tokens, BOS first (owned) */
    int64_t n_ids;
    char *prompt;            /* the prompt's text, NUL-terminated (owned) */
    char answer[192];        /* the expected continuation, e.g. " 48213" */
    int n_numbers;           /* numbers the answer must state, in order */
    uint64_t numbers[DHSA_TASK_MAX_NEEDLES];
    int n_spans;             /* token ranges [lo, hi) of the asked numbers in ids */
    int64_t span_lo[DHSA_TASK_MAX_NEEDLES], span_hi[DHSA_TASK_MAX_NEEDLES];
    double depth_used;       /* where the first asked needle starts: its token
                                offset between the preamble and the question, 0..1 */
} dhsa_task;

DHSA_API dhsa_task_params dhsa_task_default_params(void);
/* Builds one task with the tokenizer's BOS; the filler span is cut at
 * word boundaries and sized so that n_ids <= length (and close to it).
 * A filler too short for the length is DHSA_ERR_INVALID_ARG. Free with
 * dhsa_task_free (also after a failure: *out is then empty). */
DHSA_API dhsa_status dhsa_task_build(const dhsa_tokenizer *tok, const dhsa_task_params *p, dhsa_task *out);
DHSA_API void dhsa_task_free(dhsa_task *t);
/* 1 when the first numbers (maximal digit runs) of text[0..len) are the
 * task's numbers in order, 0 otherwise. */
DHSA_API int dhsa_task_check(const dhsa_task *t, const char *text, int64_t len);
/* The share of the task's asked-number keys [span_lo, span_hi) that the
 * layout selects for query row `row` of KV head g (1 with layout NULL). */
DHSA_API double dhsa_task_selected(const dhsa_task *t, const dhsa_layout *layout, int64_t g, int64_t row);
/* ---- Retrieval tasks block end ---- */

/* ---- Evaluation block begin (src/eval/evaluate.c, docs/eval.md) ---- */
/* The measurements behind `dhsa eval` (tools/eval.c prints them; the
 * Python binding returns them: dhsa.eval_fidelity, dhsa.eval_retrieval,
 * dhsa.eval_generate). Each runs the model through fresh sessions on the
 * given context and model; the model and context are only read and may
 * be shared with other sessions (not concurrently with them). Nothing is
 * printed. Buffers: the functions allocate what they need (logits,
 * per-layer sums, the recall reruns' outputs) and free it before they
 * return; these are evaluation calls, not inference hot paths. On an
 * error the results are unspecified and dhsa_last_error() says why (a
 * failure inside a layer's measurement is named after the session's
 * sentence). */

/* The routing an evaluation at L tokens runs with by default:
 * dhsa_router_params_for(L, density), the routing every entry point runs
 * (docs/dhsa.md, "One set of routing defaults"). */
DHSA_API dhsa_router_params dhsa_eval_router_params(int64_t L, double density);

/* A method as evaluated: the session's attn and its routing (the block
 * baseline is DHSA_ATTN_BLOCK; learned boundaries are DHSA_ATTN_DHSA with
 * router.boundary LEARNED and router.predictor set). */
typedef struct {
    dhsa_attn_method attn;
    dhsa_router_params router;
} dhsa_eval_method;

/* eval fidelity: ids (the text's tokens, no BOS) are cut into windows of
 * `window` tokens, the tokenizer's BOS first (window - 1 text tokens; a
 * tokenizer without BOS: window text tokens), at most max_windows of them.
 * Each window runs once dense and once per method, with logits for every
 * position; over the predicted positions 0 .. window - 2:
 *   kl         mean KL(p_dense || p_method) of the next-token
 *              distributions, nats (double-precision log-softmax)
 *   top1       share of positions where both argmaxes agree (the first
 *              maximal logit on ties)
 *   ppl, ppl_dense  exp of the mean negative log-likelihood of the actual
 *              next token, under the method and under dense
 *   kl_late, top1_late  the same over positions >= window / 2
 *   density_used       selected / available keys over rows, KV heads and
 *              layers (dhsa_layout_get_stats; a dense call counts all),
 *              mean over windows; density_used_late: the rows at
 *              positions >= window / 2
 *   recall[l]  (when the caller gives the array, [n_layer]) the mean over
 *              rows and heads of exp(lse_sparse - lse_dense) of layer l:
 *              each routed call rerun dense and with its layout
 *              (dhsa_fidelity_compare), over the method's own q/k/v;
 *              dense calls count 1; mean over windows. NaN with
 *              params.recall 0.
 * Cost: two extra attention calls per routed layer call (recall), and
 * 2 x window x n_vocab floats of logits. A text shorter than one window
 * is DHSA_ERR_INVALID_ARG. */
typedef struct {
    int64_t window;       /* tokens per window, BOS included (>= 2); 0 = the trained context */
    int64_t max_windows;  /* default 8 */
    int recall;           /* 1 (default): measure the per-layer recall */
} dhsa_eval_fidelity_params;

DHSA_API dhsa_eval_fidelity_params dhsa_eval_fidelity_default_params(void);

typedef struct {
    double kl, top1, ppl, ppl_dense;
    double kl_late, top1_late;
    double density_used, density_used_late;
    int64_t n_predicted, n_predicted_late;
    double *recall;       /* in: the caller's [n_layer] array, or NULL (not measured then) */
} dhsa_eval_fidelity_result;

typedef struct {
    int64_t window, n_windows;  /* as run */
    int64_t n_text;             /* the ids given */
    int64_t n_predicted;        /* dense's predicted positions, all windows */
    double ppl_dense;           /* dense perplexity over them */
} dhsa_eval_fidelity_info;

/* results[n_methods] (each result's recall pointer set by the caller or
 * NULL); info may be NULL. */
DHSA_API dhsa_status dhsa_eval_fidelity(dhsa_ctx *ctx, dhsa_model *m, const int32_t *ids, int64_t n_ids,
                                        const dhsa_eval_fidelity_params *p, const dhsa_eval_method *methods,
                                        int64_t n_methods, dhsa_eval_fidelity_result *results,
                                        dhsa_eval_fidelity_info *info);

/* A greedy answer: the prompt ids[0..n) in a fresh session of the method
 * (cache n_ctx, 0 = n + max_tokens), then argmax tokens until a stop id
 * (not part of the answer) or max_tokens, detokenized with detok_flags.
 * eval niah and the retrieval tasks run this. */
typedef struct {
    dhsa_eval_method method;
    int64_t max_tokens;     /* 0: 12 (dhsa_eval_retrieval: 40 when the task asks
                               several numbers, as multivalue does) */
    int64_t n_ctx;          /* 0: prompt + max_tokens */
    const int32_t *stop;    /* ids that end the answer; NULL: the tokenizer's EOS */
    int n_stop;
    unsigned detok_flags;   /* dhsa_detokenize flags (retrieval: KEEP_SPACE is added) */
} dhsa_eval_answer_params;

DHSA_API dhsa_eval_answer_params dhsa_eval_answer_default_params(void);

#define DHSA_EVAL_MAX_LAYERS 64   /* layers whose needle selection is reported */
#define DHSA_EVAL_ANSWER_ROWS 64  /* answer rows whose needle selection is kept */

/* Why a retrieval miss happened, at the row that produced its first wrong
 * token: the needle's keys selected in every reported layer (the model's
 * error, not the routing's; dense is always this), in some only, or in
 * none. */
typedef enum {
    DHSA_EVAL_NEEDLE_EVERYWHERE = 0,
    DHSA_EVAL_NEEDLE_PARTLY = 1,
    DHSA_EVAL_NEEDLE_NOWHERE = 2
} dhsa_eval_needle;

typedef struct {
    char text[4096];        /* the answer, NUL-terminated (cut to 4095 bytes) */
    int64_t n_tokens;       /* answer tokens generated */
    double density_used;    /* selected / available keys, prompt and answer rows */
    double mean_chunk;      /* dhsa and block: keys per chunk of the boundaries
                               the method cut over the prompt (prompt keys /
                               chunks, summed over layers); 0 for the others */
    /* dhsa_eval_retrieval only (dhsa_eval_generate: hit -1, the rest 0): */
    int hit;                /* dhsa_task_check of text */
    int64_t first_wrong;    /* the first answer token whose text leaves the
                               expected answer; n_tokens when none does */
    int64_t n_layer;        /* layers reported: min(n_layer, DHSA_EVAL_MAX_LAYERS) */
    /* per layer, the share of the asked numbers' keys the layout selects
     * (dhsa_task_selected, mean over KV heads) for the rows that produce
     * the answer (the prompt's last, then each answer token fed back):
     * the least over those rows, and at the row that produced answer token
     * min(first_wrong, DHSA_EVAL_ANSWER_ROWS - 1) (0 for a row never run:
     * the last token is not fed back) */
    double needle_selected[DHSA_EVAL_MAX_LAYERS];
    double selected_at_wrong[DHSA_EVAL_MAX_LAYERS];
    dhsa_eval_needle needle; /* from selected_at_wrong (meaningful for a miss) */
} dhsa_eval_answer;

DHSA_API dhsa_status dhsa_eval_generate(dhsa_ctx *ctx, dhsa_model *m, const int32_t *ids, int64_t n_ids,
                                        const dhsa_eval_answer_params *p, dhsa_eval_answer *out);
/* The task's prompt through dhsa_eval_generate, scored and explained. */
DHSA_API dhsa_status dhsa_eval_retrieval(dhsa_ctx *ctx, dhsa_model *m, const dhsa_task *t,
                                         const dhsa_eval_answer_params *p, dhsa_eval_answer *out);
/* eval niah's prompts: a haystack of `sentences` (NULL: the built-in
 * ones, dhsa_task_builtin_sentences) taken in order, cycling, as many as
 * fit `length` tokens, with `needle` (e.g. "The secret number is 4821.")
 * at the sentence boundary whose token offset is nearest depth x the
 * haystack's tokens, then the question: with tmpl NONE the plain
 * completion prompt "HAYSTACK\n\nQuestion: What is the secret number
 * mentioned in the text above?\nAnswer: The secret number is"; with a chat
 * template one user turn "HAYSTACK\n\nWhat is the secret number mentioned
 * in the text above? Answer with the number only." and the assistant's
 * turn opened (dhsa_chat_tokenize, markers parsed as special). The
 * tokenizer's BOS as its default flags say. Sentences are dropped from the
 * end until n_ids <= length (a prompt is at least the question: a length
 * below that gives the question with the needle alone). stop holds the ids
 * that end an answer: EOS, then the template's end-of-turn ids, or BOS for
 * the plain prompt (a base model starts a new document). Free with
 * dhsa_niah_free (also after a failure). */
typedef struct {
    int64_t length;                 /* most prompt tokens (default 1024) */
    double depth;                   /* 0..1 (default 0.5) */
    const char *needle;             /* the needle sentence (required) */
    const char *const *sentences;   /* the haystack; NULL: built-in */
    int64_t n_sentences;
    dhsa_chat_template tmpl;        /* DHSA_CHAT_NONE (default): plain prompt */
} dhsa_niah_params;

typedef struct {
    int32_t *ids;                   /* [n_ids] (owned) */
    int64_t n_ids;
    double depth_used;              /* the needle's token offset in the haystack, 0..1 */
    int64_t n_sentences;            /* haystack sentences used */
    int32_t stop[16];
    int n_stop;
} dhsa_niah_prompt;

DHSA_API dhsa_niah_params dhsa_niah_default_params(void);
DHSA_API dhsa_status dhsa_niah_build(const dhsa_tokenizer *tok, const dhsa_niah_params *p, dhsa_niah_prompt *out);
DHSA_API void dhsa_niah_free(dhsa_niah_prompt *pr);
/* 1 when the answer's text answer[0..len) states the needle's number
 * (`number`: 1..32 ASCII digits), 0 when not, -1 for a bad number. A
 * number is a maximal run of digits with optional ",ddd" thousands groups
 * and no decimal part: "4821", "is 4821.", "4,821", "x4821y" state 4821;
 * "48210", "14821", "4821.5", "04821", "4 8 2 1" do not. */
DHSA_API int dhsa_niah_answer_has(const char *answer, int64_t len, const char *number);
/* eval copy: a sequence [BOS] filler[0, f1) PASSAGE filler[f1, F)
 * PASSAGE of exactly L tokens (F = L - BOS - 2P, f1 = round(depth x F));
 * the spans it puts where (dhsa_eval_copy_sequence fills it in):
 *   first, second  where the two copies of the passage start
 *   control        P filler keys right after the first copy (or before it
 *                  when the filler between the copies is shorter than P)
 * ids has room for L. A length under 2P + 2 or a filler shorter than F is
 * DHSA_ERR_INVALID_ARG. */
typedef struct {
    int64_t first, second, control, passage, n_ids;
} dhsa_eval_copy_layout;

DHSA_API dhsa_status dhsa_eval_copy_sequence(const int32_t *filler, int64_t n_filler, const int32_t *passage, int64_t P,
                                             int64_t L, double depth, int32_t bos, int32_t *ids, dhsa_eval_copy_layout *at);

/* One copy sequence under a method, one session with the logits of the
 * copies' rows only (64 rows at a time; the numbers are those of one eval
 * over the whole sequence):
 *   first_loss, rep_loss  mean loss (nats/token) on passage tokens 1..P-1
 *                  at the first occurrence and at the repetition; score =
 *                  first_loss - rep_loss (the loss drop)
 *   density_used   selected / available keys, all rows and layers
 * and, for the repetition's queries (the P - 1 rows that predict passage
 * tokens), mean over rows, heads and layers, from each layer's call rerun
 * dense with LSE outputs over all keys, the first copy's keys, those of
 * them the layout selects, and the control span:
 *   copy_keys_selected  share of the first copy's keys the layout selects
 *   copy_mass      dense softmax mass on the first copy
 *   control_mass   the same on the control span
 *   copy_mass_kept (mass on the selected part) / copy_mass (1 when 0) */
typedef struct {
    double first_loss, rep_loss, score, density_used;
    double copy_keys_selected, copy_mass, control_mass, copy_mass_kept;
} dhsa_eval_copy_result;

DHSA_API dhsa_status dhsa_eval_copy(dhsa_ctx *ctx, dhsa_model *m, const dhsa_eval_method *method, const int32_t *ids,
                                    const dhsa_eval_copy_layout *at, dhsa_eval_copy_result *r);

/* Text the model writes itself, as eval copy's filler: n tokens from
 * stories sampled at temperature 1 (the sampler's other defaults), a fresh
 * session of 256 tokens per piece seeded seed x 1000003 + piece, BOS and
 * EOS dropped so the stories run on. */
DHSA_API dhsa_status dhsa_eval_sample_tokens(dhsa_ctx *ctx, dhsa_model *m, int64_t n, uint64_t seed, int32_t *out);

/* The ordinary tokens (DHSA_TOKEN_NORMAL) a passage is drawn from; with
 * words, only whole-word SPM pieces ("\u2581" and 2 or more ASCII
 * letters). *n is their count; more than cap is DHSA_ERR_INVALID_ARG
 * (cap 0 counts). */
DHSA_API dhsa_status dhsa_eval_passage_tokens(const dhsa_tokenizer *tok, int words, int32_t *out, int64_t cap, int64_t *n);
/* RULER-style tasks (src/eval/ruler.c; docs/eval.md "eval ruler"):
 * synthetic long-context tasks modelled on NVIDIA's RULER benchmark (task
 * definitions and scoring learned from it; every string is dhsa's own).
 *
 *   SINGLE      one needle "The secret <kind> for <key> is: <value>." in
 *               the haystack; asked for its value
 *   MULTIKEY    the asked needle among n_keys - 1 needles of other keys
 *               (with haystack NEEDLES, every filler sentence is such a
 *               distractor needle)
 *   MULTIVALUE  n_values needles of one key; asked for all of them
 *   MULTIQUERY  n_keys needles of different keys; asked for n_queries keys
 *   VT          variable tracking: chains "VAR A = 12345." "VAR B = VAR
 *               A." ... (n_chains chains of n_hops hops); asked which
 *               variables get the first chain's value
 *   CWE         common words: a numbered list where n_common words occur
 *               freq_common times and the others freq_uncommon times;
 *               asked for the n_common most frequent
 *   FWE         frequent words: coded words with Zipf counts (exponent
 *               alpha); asked for the three most frequent (the top rank is
 *               written as dots and not asked)
 *
 * Scoring is RULER's string_match_all: the share of expected strings that
 * occur in the answer, case-insensitively, as substrings (multi-value,
 * multi-query, VT and CWE get partial credit). Values, keys, variables and
 * words come from one of two disjoint pools (split DEV or TEST: a hash of
 * the string picks its pool), and so do the noise sentences and the prose,
 * so that parameters chosen on DEV prompts are measured on TEST prompts
 * they never saw. */
typedef enum {
    DHSA_RULER_SINGLE = 1,
    DHSA_RULER_MULTIKEY = 2,
    DHSA_RULER_MULTIVALUE = 3,
    DHSA_RULER_MULTIQUERY = 4,
    DHSA_RULER_VT = 5,
    DHSA_RULER_CWE = 6,
    DHSA_RULER_FWE = 7
} dhsa_ruler_task;
/* What the keys and values of the needles are: 7-digit numbers, words
 * (adjective-noun pairs such as "quiet-harbor") or UUIDs (version 4). */
typedef enum { DHSA_RULER_NUMBERS = 0, DHSA_RULER_WORDS = 1, DHSA_RULER_UUIDS = 2 } dhsa_ruler_kind;
/* The filler: repeated noise sentences (built in, one set per split),
 * sentences of real prose (params.prose, dhsa_ruler_load_prose), or
 * distractor needles (MULTIKEY only). */
typedef enum { DHSA_RULER_NOISE = 0, DHSA_RULER_PROSE = 1, DHSA_RULER_NEEDLES = 2 } dhsa_ruler_haystack;
typedef enum { DHSA_RULER_DEV = 0, DHSA_RULER_TEST = 1 } dhsa_ruler_split;

#define DHSA_RULER_MAX_EXPECTED 16

typedef struct {
    dhsa_ruler_task task;
    int64_t length;               /* most prompt tokens, template and BOS included (64 .. 2^24) */
    double depth;                 /* 0..1: where the first asked needle (VT: the chain's
                                     first line) sits in the haystack; CWE, FWE: unused */
    uint64_t seed;                /* everything random in the prompt */
    dhsa_ruler_split split;       /* which pools values and filler come from */
    dhsa_ruler_kind key_kind, value_kind;
    dhsa_ruler_haystack haystack;
    const char *prose;            /* PROSE: the text (its sentences are the units) */
    int64_t prose_len;
    const char *words;            /* CWE: the word list, one a line (dhsa_ruler_load_words);
                                     lowercase ASCII words of 3..12 letters of the split's pool are used */
    int64_t words_len;
    int n_keys, n_values, n_queries; /* 0: per task (MULTIKEY 4 keys, MULTIVALUE 4 values,
                                        MULTIQUERY 4 keys 4 queries, else 1) */
    int n_chains, n_hops;         /* VT: 0 = 1 chain, 4 hops */
    int n_common, freq_common, freq_uncommon; /* CWE: 0 = 10, 30, 3 (length < 4096: 10, 6, 1) */
    double alpha;                 /* FWE: 0 = 2.0 */
    dhsa_chat_template tmpl;      /* DHSA_CHAT_NONE: a plain completion prompt */
} dhsa_ruler_params;

/* A built prompt. With tmpl NONE: the text "<task text>\n<question><answer
 * prefix>" tokenized whole (the tokenizer's default BOS); with a template:
 * the task text and question as one user turn, the assistant's turn
 * opened, then the answer prefix tokenized after it (so the model's
 * answer continues "The secret number for X is:"). */
typedef struct {
    int32_t *ids;                 /* [n_ids] (owned) */
    int64_t n_ids;
    char *text;                   /* the prompt's text (plain) or the user turn's (owned) */
    int n_expected;               /* strings the answer should contain */
    char expected[DHSA_RULER_MAX_EXPECTED][48];
    double depth_used;            /* the first asked needle's token offset in the haystack,
                                     0..1; -1 for CWE and FWE */
    int64_t n_units;              /* haystack units used (sentences, list items, words) */
    int64_t answer_tokens;        /* RULER's answer budget: 128 NIAH, 30 VT, 120 CWE, 50 FWE */
    int32_t stop[16];             /* ids that end an answer (as dhsa_niah_build's) */
    int n_stop;
} dhsa_ruler_prompt;

DHSA_API dhsa_ruler_params dhsa_ruler_default_params(void);
/* The suite's named configurations (RULER's, without QA): single_noise,
 * single_prose, single_uuid, single_word, multikey, multikey_needles,
 * multikey_uuid, multivalue, multiquery, vt, cwe, fwe. Sets task, kinds,
 * haystack and counts of *p (the rest is kept); an unknown name is
 * DHSA_ERR_INVALID_ARG naming them all. */
DHSA_API dhsa_status dhsa_ruler_preset(const char *name, dhsa_ruler_params *p);
/* Builds one prompt of at most length tokens: the haystack units are
 * counted up (a binary search over their number) to the most that fit,
 * the needles at the unit boundaries nearest their depths. A haystack or
 * word list too short for the length is DHSA_ERR_INVALID_ARG. Free with
 * dhsa_ruler_free (also after a failure). */
DHSA_API dhsa_status dhsa_ruler_build(const dhsa_tokenizer *tok, const dhsa_ruler_params *p, dhsa_ruler_prompt *out);
DHSA_API void dhsa_ruler_free(dhsa_ruler_prompt *pr);
/* RULER's string_match_all of one answer: the share (0..1) of
 * pr->expected[0..n_expected) found in answer[0..len) as substrings,
 * ASCII case folded; 0 when n_expected is 0. */
DHSA_API double dhsa_ruler_score(const dhsa_ruler_prompt *pr, const char *answer, int64_t len);
/* The prose haystack from the Debian package gnu-standards (GFDL, in
 * main): the paragraphs (<p> elements, tags removed, entities decoded) of
 * dir/maintain.html for DEV and dir/standards.html for TEST, dir NULL =
 * /usr/share/doc/gnu-standards. *text (malloc'd, the caller frees it) holds
 * them one a line. A missing file is DHSA_ERR_IO whose sentence names the
 * package to install. */
DHSA_API dhsa_status dhsa_ruler_load_prose(const char *dir, dhsa_ruler_split split, char **text, int64_t *len);
/* CWE's word list: path NULL = /usr/share/dict/words (Debian package
 * wamerican); a missing file is DHSA_ERR_IO naming the package. */
DHSA_API dhsa_status dhsa_ruler_load_words(const char *path, char **text, int64_t *len);
/* Frees a text of dhsa_ruler_load_prose / _words (free() does too, from C
 * code linked against the same C library). NULL is fine. */
DHSA_API void dhsa_ruler_text_free(char *text);
/* ---- Evaluation block end ---- */

#ifdef __cplusplus
}
#endif
#endif /* DHSA_H */
