/* dhsa/core.h: the base of the interface: the export macro, status codes,
 * the threading rules, CPU features, the context (threads, memory arena,
 * budget), tensors and the process memory readers. Every other section
 * header builds on it.
 *
 * A section of the public interface: users include <dhsa.h>, which
 * includes every section in order. This file includes the sections it
 * builds on, so it compiles alone too. The rules every call follows
 * (errors, threads, tensors) are at the top of dhsa.h and in dhsa/core.h.
 */
#ifndef DHSA_CORE_H
#define DHSA_CORE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* DHSA_API marks the functions libdhsa.so exports. The library is compiled
 * with -fvisibility=hidden, so the functions declared in dhsa.h's sections
 * are its whole binary interface; the internals (dhsa__*, src/ headers)
 * stay inside it and reach tests and tools only through the static library
 * libdhsa.a (docs/architecture.md, "The library's face").
 * tests/test_exports.c checks that `nm -D --defined-only libdhsa.so` lists
 * exactly these functions. */
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
/* Process memory (Linux /proc; 0 elsewhere)                                 */

/* Peak resident set in bytes: max(VmHWM, VmRSS), or 0 if unknown. */
DHSA_API size_t dhsa_proc_peak_rss(void);
/* Current resident set (VmRSS) in bytes, or 0 if unknown. */
DHSA_API size_t dhsa_proc_rss(void);
/* Resets VmHWM to the current RSS (writes 5 to /proc/self/clear_refs). */
DHSA_API dhsa_status dhsa_proc_reset_peak_rss(void);

#ifdef __cplusplus
}
#endif
#endif /* DHSA_CORE_H */
