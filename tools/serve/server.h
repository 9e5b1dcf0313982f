/* server.h: what the HTTP side of `dhsa serve` shares (main.c, http.c,
 * openai.c; docs/server.md, docs/architecture.md): the server's options,
 * model and counters (one value, srv), the connection, request and reply
 * records, and the functions one file calls in another. The engine
 * (engine.h) knows none of it. Built with DHSA_HAVE_SERVE only.
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
#include "engine.h"
#include "serve.h"

#define EXIT_RUN DHSA_EXIT_RUN
#define EXIT_USAGE DHSA_EXIT_USAGE

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
    int verbose, batch;
    /* model */
    dhsa_model *m;
    const dhsa_model_info *in;
    const dhsa_tokenizer *tok;
    dhsa_chat_template tmpl;
    const char *tmpl_how; /* why this format (dhsa_cli_chat_template) */
    int32_t chat_stop[16];
    int n_chat_stop;
    /* slots, queue, prompt cache, batcher */
    serve_engine *engine;
    atomic_int stopping;
    pthread_mutex_t mu;
    /* --mem-limit for requests (docs/server.md, "Memory"): what the plan of
     * the slots, the server's own buffers and the connections leave
     * (mem_pool, 0: no limit); mem_used is reserved by requests now (under
     * mu). max_piece: the most bytes of text one token covers. */
    size_t mem_pool, mem_used, mem_peak;
    int64_t n_active;              /* requests between their first call and request_done (under mu) */
    /* connections (under conn_mu) */
    pthread_mutex_t conn_mu;
    conn_rec *conns;
    int64_t n_conns;
    uint64_t n_conn_evicted, n_conn_refused;
    uint64_t n_mem_refused;
    int64_t max_piece;
    /* metrics (under mu) */
    uint64_t n_requests[5], n_errors, n_disconnects;
    atomic_uint_fast64_t id_counter;
    time_t started;
} server;

extern server srv;

typedef struct {
    char *body;
    size_t len, cap;
    int too_large;            /* the body went over --max-body or the memory pool: its status */
    unsigned refused;         /* 413 / 503 from the memory pool while the body came */
    int handled;
    double t0;
    size_t reserved;          /* bytes taken from srv.mem_pool, given back in request_done */
} request_ctx;

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

/* One chat or completion request on its connection: the parsed request,
 * the engine's generation, and the text the engine has passed on (view,
 * grown by the text callback on the connection's thread), of which
 * view[0..sent) is sent. */
typedef struct reply {
    struct MHD_Connection *conn;
    int fd;                  /* the connection's socket, for the gone callback (-1: unknown) */
    serve_request rq;
    serve_gen *g;            /* NULL until submitted */
    int chat;
    char id[48];
    time_t created;
    double t_start;
    char *view;
    int64_t view_len, view_cap, sent;
    int view_oom;            /* the text callback could not grow view */
    int over;                /* the engine said the end: info holds the counts, finish or error is final */
    serve_gen_info info;
    const char *finish;      /* from the finish callback; "error" once an error event went out */
    int error;               /* from the error callback: err_msg */
    char err_msg[512];
    int done_sent;           /* stream: [DONE] written */
    int role_sent;
    /* stream: bytes waiting to go out */
    char *pend;
    size_t pend_len, pend_off;
    size_t reserved;         /* a stream's memory, taken over from its request_ctx */
} reply;

/* openai.c: the OpenAI mapping */
double serve_now_s(void);
char *serve_utf8_clean(const char *s, int64_t n, int final, int64_t *used, int64_t *out_len);
json_t *serve_json_text(const char *s, int64_t n);
json_t *serve_error_object(unsigned code, const char *message, const char *param, const char *err_code);
json_t *serve_usage_json(const reply *r);
json_t *serve_envelope(const reply *r, int chunk);
json_t *serve_choice(const reply *r, const char *text, int64_t n, int chunk, const char *finish);
int serve_push_event(reply *r, json_t *j);
unsigned serve_prompt_ids(const serve_request *r, int32_t **ids, int64_t *n, char *msg, size_t cap,
                          const char **param, const char **code);
/* The engine's params of a parsed request: sampling (a request without a
 * seed gets its own), stops (EOS, a chat turn's end, the stop strings),
 * response_format, attention. The strings point into rq. */
void serve_gen_params_of(const serve_request *rq, int chat, const int32_t *ids, int64_t n, int64_t max_gen,
                         serve_gen_params *p);

/* http.c: the HTTP layer */
unsigned serve_mem_take(request_ctx *r, size_t bytes, const char *what, char *msg, size_t cap);
void serve_mem_give(size_t *reserved);
void serve_on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                         enum MHD_ConnectionNotificationCode toe);
enum MHD_Result serve_on_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen);
void serve_request_done(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode t);
enum MHD_Result serve_on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                 const char *version, const char *upload, size_t *upload_size, void **con_cls);

#endif
