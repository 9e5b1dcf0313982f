/* server.h: what the files of `dhsa serve` (tools/serve/) share: the
 * server's state (one value, srv), the slot, queue, connection, request and
 * generation records, and the functions one file calls in another
 * (docs/server.md). Built with DHSA_HAVE_SERVE only.
 */
#ifndef DHSA_TOOLS_SERVE_SERVER_H
#define DHSA_TOOLS_SERVE_SERVER_H

#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <time.h>

#include "cli.h"
#include "serve.h"

#define EXIT_RUN DHSA_EXIT_RUN
#define EXIT_USAGE DHSA_EXIT_USAGE

/* ------------------------------------------------------------ state --- */

typedef struct {
    int id;
    dhsa_ctx *ctx;
    dhsa_session *s;
    dhsa_session_params sp;  /* how s was made (attn, density) */
    int32_t *tokens;         /* [n_ctx + 1]: what the cache holds, then the next sampled id */
    int64_t n_cached;        /* = dhsa_session_length(s) */
    float *logits, *scratch; /* [n_vocab] */
    /* the generation whose own serve_prefill or decode step wrote logits; NULL
     * when they are no one's (a request ended, an eval failed). Sampling
     * from logits that are not the sampling request's own is refused
     * (serve_sample_next): a request never continues from another's state. */
    const struct gen *logits_of;
    int32_t *counts;         /* [n_vocab]: generated ids, for presence/frequency penalties */
    uint64_t last_used;
    int busy;
    /* --batch on: the generation whose steps the batcher runs (under srv.mu) */
    struct gen *joined;
} slot;

typedef struct waiter {
    struct waiter *next;
    pthread_cond_t cv;
    slot *granted;
    const int32_t *prompt;
    int64_t n_prompt;
} waiter;

/* An open connection (MHD_OPTION_NOTIFY_CONNECTION), for the limits on
 * connections: while the server is full, the connection idle the longest
 * (no request in flight for at least FULL_IDLE_S) is closed to let a new
 * one in. Under srv.conn_mu. */
typedef struct conn_rec {
    struct conn_rec *prev, *next;
    int fd;                  /* valid until its CLOSED notification, which comes before libmicrohttpd closes it */
    uint32_t ip;             /* IPv4, network order */
    double idle_since;       /* connected, or its last request answered */
    int in_request;          /* headers received, answer not yet sent whole */
    int evicted;             /* shut down by the policy; closing */
} conn_rec;

#define FULL_IDLE_S 1.0

typedef struct {
    /* options */
    const char *model_path, *host, *template_name;
    char model_name[128];
    int64_t port, n_slots, n_ctx, threads, max_tokens, max_body, timeout, queue_timeout, max_queue, max_conn, max_conn_ip;
    dhsa_session_params sp; /* the server's session params */
    int verbose;
    /* model */
    dhsa_model *m;
    const dhsa_model_info *in;
    const dhsa_tokenizer *tok;
    dhsa_chat_template tmpl;
    const char *tmpl_how; /* why this format (dhsa_cli_chat_template) */
    int32_t chat_stop[16];
    int n_chat_stop;
    /* response_format json_object / json_schema (docs/server.md,
     * "Structured output"): each token's bytes, and the schema of any
     * object */
    dhsa_json_vocab *jvocab;
    dhsa_json_schema *json_object;
    /* slots and queue */
    slot *slots;
    pthread_mutex_t mu;
    waiter *q_head, *q_tail;
    int64_t n_queued, n_busy;
    /* --batch on: every slot's session on one ctx; the batcher thread runs
     * the posted decode steps of all slots as one dhsa_session_eval_batch */
    int batch;
    dhsa_ctx *shared_ctx;
    pthread_t batcher;
    int batcher_started, batcher_quit;
    pthread_cond_t cv_work;        /* a generation joined the batcher */
    dhsa_session **batch_ss;
    slot **batch_sl;
    struct gen **batch_g;
    int32_t *batch_ids;
    int *batch_next;               /* [n_slots]: the row's generation goes on (1) or ended (0) */
    float *batch_logits;
    uint64_t n_batches, n_batch_rows;
    double batch_eval_s, batch_sample_s; /* batcher: in dhsa_session_eval_batch; in the rows' per-token work */
    uint64_t use_clock;
    atomic_int stopping;
    /* --mem-limit for requests (docs/server.md, "Memory"): what the plan of
     * the slots, the server's own buffers and the connections serve_leave
     * (mem_pool, 0: no limit); mem_used is reserved by requests now (under
     * mu). max_piece: the most bytes of text one token covers. */
    size_t mem_pool, mem_used, mem_peak;
    int64_t n_active;              /* requests between their first call and serve_request_done (under mu) */
    /* connections (under conn_mu) */
    pthread_mutex_t conn_mu;
    conn_rec *conns;
    int64_t n_conns;
    uint64_t n_conn_evicted, n_conn_refused;
    uint64_t n_mem_refused;
    int64_t max_piece;
    /* metrics (under mu) */
    uint64_t n_requests[5], n_errors, n_disconnects, n_cache_hits;
    uint64_t prompt_tokens, cached_tokens, gen_tokens;
    double prefill_s, decode_s;
    atomic_uint_fast64_t id_counter;
    time_t started;
} server;

extern server srv;

/* --------------------------------------------------------- responses --- */

typedef struct {
    char *body;
    size_t len, cap;
    int too_large;            /* the body went over --max-body or the memory pool: its status */
    unsigned refused;         /* 413 / 503 from the memory pool while the body came */
    int handled;
    double t0;
    size_t reserved;          /* bytes taken from srv.mem_pool, given back in serve_request_done */
} request_ctx;

/* ----------------------------------------------------------- memory --- */

/* The bytes a request may allocate beyond what it is told: the tokenizer's
 * work buffers and the ids per byte of text, allocated (src/model/
 * tokenizer.c, each buffer grown by half again): SPM, the normalised text
 * (3 bytes a byte), a 24-byte symbol a byte of it and 3 24-byte queue
 * entries a character, the ids doubling: 229; BPE, the pre-tokenizer's
 * 29 bytes a code point, and for its longest word the byte-mapped text
 * (6x), the merge key (12x), symbols and queue as SPM's, the word ends and
 * the ids: 267. Measured on 1 MB of text: 30-36 bytes a byte touched.
 * And what one connection costs while it is open
 * (its thread's stack and malloc arena as touched, libmicrohttpd's 32 KiB
 * pool: 20-30 KiB measured idle). */
#define TOKENIZE_WORK_PER_BYTE 288
#define CONNECTION_ALLOWANCE ((size_t)64 << 10)

/* ------------------------------------------------------- generation --- */

/* A generation's steps run on one thread at a time. With --batch off, its
 * connection's: sample, text, stop checks, decode step, send. With
 * --batch on the connection thread prefills and takes the first token,
 * then the generation joins the batcher, whose thread from then on runs
 * its decode steps together with the other joined slots' (one pass over
 * the weights) and, right after each pass, each row's per-token work
 * (client gone, sample, stop ids, text, stop strings, the limits), so that
 * the next pass starts at once; the connection thread only sends what the
 * text has grown by. While joined, the batcher alone writes the sampler,
 * the counts, n_gen, finish, error and the slot's cache; out, out_len and
 * safe_len change under srv.mu, where the connection thread copies
 * out[0..safe_len) into its view. It reads the rest only after the
 * batcher has let go (joined = 0, under srv.mu). */
typedef struct gen {
    struct MHD_Connection *conn;
    int fd;                  /* the connection's socket, for serve_client_gone_fd (-1: unknown) */
    serve_request rq;
    slot *sl;
    int chat;
    char id[48];
    time_t created;
    int64_t n_prompt, n_reused, n_gen, max_gen;
    dhsa_sampler *smp;
    dhsa_json_constraint *jc; /* response_format JSON: what may come next, else NULL */
    int32_t stop_ids[20];
    int n_stop_ids;
    int32_t next_id;         /* sampled: what the next decode step evaluates */
    char piece[512];         /* its text, until published */
    int64_t piece_len;
    /* text: out[0..out_len) generated bytes, of which out[0..safe_len) may
     * be sent (a tail that could begin a stop string is held back) */
    char *out;
    int64_t out_len, out_cap, safe_len;
    int first_piece;
    const char *finish;      /* NULL while generating */
    int error;               /* the generation failed: err_msg */
    char err_msg[512];
    int gone;                /* the client went away */
    /* --batch on, under srv.mu */
    int joined;              /* the batcher runs the steps */
    int cancel;              /* the connection asks the batcher to let go */
    pthread_cond_t cv;       /* the batcher published text (streams) or let go */
    /* the connection thread's side */
    char *view;              /* its copy of out[0..view_len) */
    int64_t view_len, view_cap, sent;
    int over;                /* the view is the whole text; finish / error are final */
    int done_sent;           /* stream: [DONE] written */
    int role_sent;
    double t_start, t_first, t_prefill, t_decode;
    int32_t touched_count;
    int32_t *touched;        /* ids with counts[id] > 0 */
    /* stream: bytes waiting to go out */
    char *pend;
    size_t pend_len, pend_off;
    size_t reserved;         /* a stream's memory, taken over from its request_ctx */
} gen;

/* openai.c */
double serve_now_s(void);
char *serve_utf8_clean(const char *s, int64_t n, int final, int64_t *used, int64_t *out_len);
json_t *serve_json_text(const char *s, int64_t n);
json_t *serve_error_object(unsigned code, const char *message, const char *param, const char *err_code);
json_t *serve_usage_json(const gen *g);
json_t *serve_envelope(const gen *g, int chunk);
json_t *serve_choice(const gen *g, const char *text, int64_t n, int chunk, const char *finish);
int serve_push_event(gen *g, json_t *j);
unsigned serve_prompt_ids(gen *g, int32_t **ids, int64_t *n, char *msg, size_t cap, const char **param,
                           const char **code);

/* engine.c */
slot *serve_acquire(const int32_t *prompt, int64_t n, const char **why);
int serve_slot_prepare(slot *sl, int attn, double density, char *msg, size_t cap);
int serve_client_gone_fd(int fd);
int serve_sample_next(gen *g, const float *logits, int32_t *next);
int serve_advance(gen *g, const float *logits);
void serve_step_alone(gen *g);
void serve_join(gen *g);
void serve_leave(gen *g);
void *serve_batcher_main(void *arg);
int serve_gen_sync(gen *g);
void serve_gen_free(gen *g);
void serve_note_done(gen *g);
unsigned serve_prefill(gen *g, const int32_t *ids, int64_t n, char *msg, size_t cap);

/* http.c */
unsigned serve_mem_take(request_ctx *r, size_t bytes, const char *what, char *msg, size_t cap);
void serve_mem_give(size_t *reserved);
int serve_client_gone(struct MHD_Connection *c);
enum MHD_Result serve_handle_generate(struct MHD_Connection *c, request_ctx *rc, serve_req_kind kind);
void serve_on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe);
enum MHD_Result serve_on_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen);
void serve_request_done(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode t);
enum MHD_Result serve_on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls);

#endif
