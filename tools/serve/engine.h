/* engine.h: the engine of `dhsa serve` (docs/server.md, docs/architecture.md):
 * N slots over one model, each a session whose KV cache keeps its last
 * request's tokens (the prompt cache), a FIFO queue for a free slot, and,
 * with batching on, a batcher thread that runs the decode steps of every
 * running generation as one pass over the weights. No HTTP, no JSON, no
 * global: everything hangs off a serve_engine, so tests/test_serve_engine.c
 * drives it without a socket.
 *
 * A request is submitted with its prompt's ids and its sampling; submit
 * waits for a slot (the free one whose cache shares the longest prefix with
 * the prompt), evaluates the rest of the prompt and returns a generation.
 * The caller then calls serve_gen_next until it returns 0: with batching
 * off each call runs one decode step on the caller's thread, with it on it
 * waits for the batcher; the generated text, the finish reason or the error
 * come through the callbacks, always on the caller's thread, inside
 * serve_gen_next. serve_gen_cancel (any thread) stops a generation at its
 * next token; serve_gen_free gives its slot to the next waiter.
 */
#ifndef DHSA_TOOLS_SERVE_ENGINE_H
#define DHSA_TOOLS_SERVE_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "dhsa.h"

typedef struct serve_engine serve_engine;
typedef struct serve_gen serve_gen;

#define SERVE_ENGINE_MAX_STOP_IDS 20
#define SERVE_ENGINE_MAX_STOP 4
#define SERVE_ENGINE_ATTN_UNSET (-1)

typedef struct {
    int64_t n_slots;          /* requests served at once, each a session */
    int batch;                /* 1: the slots share one ctx and their decode steps run as one batch (n_slots > 1) */
    int n_threads;            /* threads of each ctx (of the one shared ctx with batch) */
    dhsa_session_params sp;   /* every slot's session (a request may ask for another attn / density) */
    int64_t max_queue;        /* requests that may wait for a slot; one more is refused at once */
    double queue_timeout_s;   /* a request waits at most this long for a slot */
} serve_engine_params;

/* Makes the engine's ctxs (no session yet: serve_engine_plan, then
 * serve_engine_open). The model stays the caller's and must outlive the
 * engine. Returns 0, or -1 with msg; *out is then NULL. */
int serve_engine_create(dhsa_model *m, const serve_engine_params *p, serve_engine **out, char *msg, size_t cap);

/* The memory plan of one slot's session with the engine's params, on the
 * first slot's ctx (what dhsa_session_plan says). */
dhsa_status serve_engine_plan(serve_engine *e, dhsa_mem_plan *pl);

/* Makes every slot's session with sp (the params of create, with n_ctx and
 * n_ubatch as the plan fixed them) and its buffers. Returns 0, or -1 with
 * msg. */
int serve_engine_open(serve_engine *e, const dhsa_session_params *sp, char *msg, size_t cap);

/* Starts the batcher thread (batch only; a no-op otherwise). The thread
 * inherits the caller's signal mask. Returns 0, or -1 with msg. */
int serve_engine_start(serve_engine *e, char *msg, size_t cap);

/* Stops taking requests: queued ones leave with SERVE_STOPPING, running
 * generations end with an error at their next token. Any thread. */
void serve_engine_stop(serve_engine *e);

/* Joins the batcher and frees everything. Every generation must have been
 * freed before. NULL is a no-op. */
void serve_engine_free(serve_engine *e);

/* The tokens of each slot's context (as the plan fixed them). */
int64_t serve_engine_n_ctx(const serve_engine *e);

typedef struct {
    int64_t n_slots, n_busy, n_queued;
    uint64_t n_cache_hits, prompt_tokens, cached_tokens, gen_tokens;
    double prefill_s, decode_s;
    uint64_t n_batches, n_batch_rows;   /* batched passes, and the decode steps in them */
    double batch_eval_s, batch_sample_s; /* in dhsa_session_eval_batch; in the rows' per-token work */
} serve_engine_stats;

void serve_engine_get_stats(serve_engine *e, serve_engine_stats *out);

/* ------------------------------------------------------- generations --- */

typedef struct {
    const int32_t *prompt;    /* [n_prompt] ids, read during submit only */
    int64_t n_prompt;         /* >= 1, <= serve_engine_n_ctx */
    int64_t max_gen;          /* the most tokens generated (the context may end it first) */
    dhsa_sampler_params sampler;
    double presence_penalty, frequency_penalty; /* OpenAI's, over the ids generated so far */
    int ignore_eos;           /* the stop ids are never sampled (their logits -Inf) */
    int32_t stop_ids[SERVE_ENGINE_MAX_STOP_IDS]; /* ids that end the generation (EOS, a chat turn's end) */
    int n_stop_ids;
    const char *stop[SERVE_ENGINE_MAX_STOP];     /* stop strings (copied): the text ends before the first */
    int64_t stop_len[SERVE_ENGINE_MAX_STOP];
    int n_stop;
    int json;                 /* constrained to one JSON value: json_schema's, or any object when NULL */
    const dhsa_json_schema *json_schema; /* must outlive the generation */
    int attn;                 /* dhsa_attn_method, or SERVE_ENGINE_ATTN_UNSET: the engine's */
    double density;           /* 0: the engine's */
    int strip_first_space;    /* SentencePiece's word-start space is not the first piece's text (a chat reply) */
    int wake_on_text;         /* with batching: serve_gen_next returns at each new text (a stream), else at the end */
} serve_gen_params;

/* Called on the thread that calls serve_gen_next (text, finish, error) or
 * on the engine's (gone); text is called under the engine's lock: copy the
 * bytes and return. Any may be NULL. */
typedef struct {
    void (*text)(void *user, const char *bytes, int64_t n); /* more of the reply (stop strings already cut) */
    void (*finish)(void *user, const char *reason);         /* "stop" or "length": the reply is whole */
    void (*error)(void *user, const char *message);         /* the generation failed (or the engine stops) */
    int (*gone)(void *user);  /* 1: nobody waits for the answer any more (polled between prefill pieces and tokens) */
} serve_gen_callbacks;

typedef enum {
    SERVE_OK = 0,
    SERVE_QUEUE_FULL,         /* every slot busy and max_queue requests wait */
    SERVE_QUEUE_TIMEOUT,      /* no slot within queue_timeout_s */
    SERVE_STOPPING,           /* the engine stops */
    SERVE_BAD_ATTN,           /* no session for the attn / density asked (msg) */
    SERVE_GONE,               /* the prefill was cut: cancelled, gone, or the engine stops (msg says which) */
    SERVE_FAILED              /* out of memory, a failed eval (msg) */
} serve_status;

/* Submits a request: makes its sampler, waits for a slot, evaluates the
 * prompt (the cached prefix is kept) and, with batching, samples the first
 * token and hands the rest to the batcher. Returns SERVE_OK with *out (free
 * it with serve_gen_free), or another status with msg and *out NULL. user
 * goes to the callbacks. */
serve_status serve_engine_submit(serve_engine *e, const serve_gen_params *p, const serve_gen_callbacks *cb,
                                 void *user, serve_gen **out, char *msg, size_t cap);

/* Brings the generation on: runs a decode step (batching off) or waits for
 * the batcher's (on), then passes the new text, and at the end the finish
 * or the error, to the callbacks. Returns 1 while it goes on, 0 once it is
 * over (then and afterwards at once). */
int serve_gen_next(serve_gen *g);

/* Stops the generation at its next token (or between prefill pieces); its
 * end is reported as gone (the error callback says "cancelled") and no
 * text callback comes after it. Any thread (a callback included), any
 * time before serve_gen_free. */
void serve_gen_cancel(serve_gen *g);

typedef struct {
    int slot;                 /* the slot's index */
    int64_t n_prompt, n_reused, n_gen; /* prompt ids, of which taken from the cache; generated ids */
    const char *finish;       /* "stop", "length", or NULL */
    int error;                /* failed: message */
    const char *message;
    int gone;                 /* cancelled, or the gone callback said so */
    double t_start, t_first, t_prefill, t_decode; /* seconds: submit, first token (0: none), prefill, decode steps */
} serve_gen_info;

/* What the generation has done so far (complete once serve_gen_next
 * returned 0); the strings live as long as g. */
void serve_gen_get_info(const serve_gen *g, serve_gen_info *out);

/* Lets the batcher go, gives the slot to the next waiter and frees g.
 * NULL is a no-op. */
void serve_gen_free(serve_gen *g);

#endif
