/* serve.c: `dhsa serve`, an OpenAI-compatible HTTP server over one model
 * (docs/server.md): POST /v1/chat/completions and /v1/completions (JSON,
 * or server-sent events with stream: true, ending in "data: [DONE]"),
 * GET /v1/models, /health, /metrics (Prometheus text), POST /tokenize and
 * /detokenize.
 *
 * HTTP is libmicrohttpd's (one thread per connection), JSON jansson's
 * (request bodies in tools/serve_req.c); libdhsa knows neither. N slots,
 * each a session, serve requests; a request waits in a FIFO queue for a
 * free slot (--queue-timeout). With --batch on (the default for N > 1)
 * the slots share one ctx and a batcher thread runs the decode steps of
 * all of them as one pass, sampling each one's next token right after it
 * (the connection threads only send the text); --batch off gives each
 * slot its own ctx and its own steps. The
 * prompt cache: each slot keeps its last request's tokens in its KV cache
 * and routing index; a request goes to the free slot whose cache shares
 * the longest prefix with its prompt, which is kept (dhsa_session_truncate)
 * while only the rest is evaluated. A client that goes away (its socket
 * reads EOF, or a write fails) stops its generation and frees its slot.
 * SIGINT / SIGTERM: no new connections, queued requests a 503, running
 * ones end with an error event and [DONE] or a 503; once every answer is
 * out (at most --timeout, 30 s) the daemon stops and everything is freed;
 * a second signal stops at once. --mem-limit also bounds the requests:
 * each reserves what it will allocate from what the slots' plan leaves
 * (mem_take), before allocating it.
 *
 * Built with DHSA_HAVE_SERVE only (the Makefile sets it when pkg-config
 * finds libmicrohttpd and jansson); otherwise `dhsa serve` refuses, naming
 * the packages. Tested by tests/test_serve.c (HTTP, load, curl) and
 * python/tests/test_serve_openai.py (the openai package as the client).
 */
#include "cli.h"

#ifndef DHSA_HAVE_SERVE
#include <stdio.h>

const char dhsa_cli_serve_usage[] =
    "usage: dhsa serve [-m MODEL] [--host 127.0.0.1] [--port 8080] [--slots N] [options]\n"
    "\n"
    "This build of dhsa has no HTTP server: `dhsa serve` needs libmicrohttpd and\n"
    "jansson (Debian: apt-get install libmicrohttpd-dev libjansson-dev pkg-config;\n"
    ".ci/run installs them), then make clean && make. docs/server.md says more.\n";

int dhsa_cli_serve(int argc, char **argv) {
    (void)argc;
    (void)argv;
    dhsa_cli_set_command("serve", NULL);
    dhsa_cli_die(DHSA_EXIT_RUN, "this build has no HTTP server: it needs libmicrohttpd and jansson (Debian: "
                 "apt-get install libmicrohttpd-dev libjansson-dev pkg-config), then make clean && make");
}
#else

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "serve.h"

#define EXIT_RUN DHSA_EXIT_RUN
#define EXIT_USAGE DHSA_EXIT_USAGE

const char dhsa_cli_serve_usage[] =
    "usage: dhsa serve [-m MODEL] [--host 127.0.0.1] [--port 8080] [--slots N] [options]\n"
    "\n"
    "An OpenAI-compatible HTTP server (docs/server.md): POST /v1/chat/completions,\n"
    "/v1/completions (stream: true sends server-sent events), GET /v1/models,\n"
    "/health, /metrics (Prometheus), POST /tokenize, /detokenize. Ctrl-C or\n"
    "SIGTERM stops it cleanly.\n"
    "  -m MODEL            GGUF file (default: the shipped models/" DHSA_DEFAULT_MODEL ")\n"
    "  --host ADDR         IPv4 address to listen on (default 127.0.0.1)\n"
    "  --port N            (default 8080; 0 = any free port, printed)\n"
    "  --slots N           requests served at once, each with its own KV cache\n"
    "                      (default 1); more wait in a queue\n"
    "  -c, --ctx N         KV cache of each slot (default: the trained context)\n"
    "  --kv f32|f16|q8_0   KV cache type (default f16, as llama.cpp)\n"
    "  --attn M            dense|dhsa|block|stream|oracle (default dense); a request's\n"
    "                      \"attn\" and \"density\" override it for that request\n"
    "  --density F         keys per query block of the sparse methods (default 0.0625)\n"
    "  --mem-limit SIZE    the most the process may hold: the memory plan of all\n"
    "                      slots is checked against it at start (K/M/G suffix)\n"
    "  --batch on|off      on (default): the slots share one ctx of --threads threads\n"
    "                      and their decode steps run as one batch (one pass over\n"
    "                      the weights); off: each slot has its own threads\n"
    "  -t, --threads T     threads (default: online CPUs - 1 for the shared ctx, >= 1;\n"
    "                      with --batch off, per slot: online CPUs / slots, >= 1)\n"
    "  --template NAME     chat format: llama3 chatml qwen2.5 smollm2 gemma mistral\n"
    "                      llama2 phi3, or plain (/v1/chat/completions off); default:\n"
    "                      the model's own template when dhsa renders it exactly,\n"
    "                      else refused (docs/chat.md)\n"
    "  --max-tokens N      the most tokens one request may generate (default 4096)\n"
    "  --max-body SIZE     the largest request body (default 8M)\n"
    "  --timeout S         a connection idle this long is closed (default 60)\n"
    "  --queue-timeout S   a request waits at most this long for a slot (default 60)\n"
    "  --max-queue N       requests that may wait for a slot (default 64)\n"
    "  --max-connections N open connections (default 128); when full, the one idle\n"
    "                      the longest (1 s at least) is closed for a new one\n"
    "  --max-connections-per-ip N  open connections of one IPv4 address (default 0:\n"
    "                      no limit of its own; loopback clients share 127.0.0.1)\n"
    "  --verbose           one line per request on stderr\n";

/* ------------------------------------------------------------ state --- */

typedef struct {
    int id;
    dhsa_ctx *ctx;
    dhsa_session *s;
    dhsa_session_params sp;  /* how s was made (attn, density) */
    int32_t *tokens;         /* [n_ctx + 1]: what the cache holds, then the next sampled id */
    int64_t n_cached;        /* = dhsa_session_length(s) */
    float *logits, *scratch; /* [n_vocab] */
    /* the generation whose own prefill or decode step wrote logits; NULL
     * when they are no one's (a request ended, an eval failed). Sampling
     * from logits that are not the sampling request's own is refused
     * (sample_next): a request never continues from another's state. */
    const struct gen *logits_of;
    int32_t *counts;         /* [n_vocab]: generated ids, for presence/frequency penalties */
    uint64_t last_used;
    int busy;
    /* --batch on: the generation whose steps the batcher runs (under S.mu) */
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
 * one in. Under S.conn_mu. */
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
    uint64_t n_requests[5], n_errors, n_disconnects, n_cache_hits;
    uint64_t prompt_tokens, cached_tokens, gen_tokens;
    double prefill_s, decode_s;
    atomic_uint_fast64_t id_counter;
    time_t started;
} server;

static server S;

/* ---------------------------------------------------------- helpers --- */

static double now_s(void) { return dhsa_cli_now(); }

/* UTF-8: the length of the valid sequence at s[0..n), 0 when invalid, -1
 * when s is a valid but incomplete start (more bytes may complete it). */
static int utf8_seq(const unsigned char *s, int64_t n) {
    unsigned c = s[0];
    int len;
    unsigned min;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) len = 2, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF) len = 3, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4) len = 4, min = 0x10000;
    else return 0;
    unsigned cp = c & (0x3Fu >> (len - 1));
    for (int i = 1; i < len; i++) {
        if (i >= n) return -1;
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
        /* reject overlong / surrogate / > U+10FFFF as soon as they show */
        if (i == 1 && ((len == 3 && c == 0xE0 && s[1] < 0xA0) || (len == 3 && c == 0xED && s[1] > 0x9F) ||
                       (len == 4 && c == 0xF0 && s[1] < 0x90) || (len == 4 && c == 0xF4 && s[1] > 0x8F)))
            return 0;
    }
    return cp >= min ? len : 0;
}

/* Valid UTF-8 of s[0..n) into a malloc'd string: invalid bytes become
 * U+FFFD. An incomplete sequence at the end is left out when keep_tail is
 * 0 and *used says how many input bytes were taken. */
static char *utf8_clean(const char *s, int64_t n, int final, int64_t *used, int64_t *out_len) {
    char *o = malloc((size_t)n * 3 + 1);
    int64_t i = 0, k = 0;
    if (!o) return NULL;
    while (i < n) {
        int l = utf8_seq((const unsigned char *)s + i, n - i);
        if (l < 0 && !final) break;
        if (l <= 0) {
            memcpy(o + k, "\xEF\xBF\xBD", 3);
            k += 3;
            i++;
            continue;
        }
        memcpy(o + k, s + i, (size_t)l);
        k += l;
        i += l;
    }
    o[k] = 0;
    if (used) *used = i;
    if (out_len) *out_len = k;
    return o;
}

static json_t *json_text(const char *s, int64_t n) {
    int64_t len = 0;
    char *c = utf8_clean(s, n, 1, NULL, &len);
    json_t *j = c ? json_stringn(c, (size_t)len) : NULL;
    free(c);
    return j ? j : json_string("");
}

/* --------------------------------------------------------- responses --- */

typedef struct {
    char *body;
    size_t len, cap;
    int too_large;            /* the body went over --max-body or the memory pool: its status */
    unsigned refused;         /* 413 / 503 from the memory pool while the body came */
    int handled;
    double t0;
    size_t reserved;          /* bytes taken from S.mem_pool, given back in request_done */
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

/* Takes bytes from the memory pool for request r before it allocates them.
 * Returns 0; 413 when the request would need more than the whole pool
 * (it can never be served under --mem-limit); 503 when other requests hold
 * the pool now (it may be retried). msg says which, with the numbers. */
static unsigned mem_take(request_ctx *r, size_t bytes, const char *what, char *msg, size_t cap) {
    if (!S.mem_pool) return 0;
    char a[32], b[32], c[32];
    pthread_mutex_lock(&S.mu);
    unsigned st = 0;
    if (bytes > S.mem_pool || r->reserved > S.mem_pool - bytes) {
        st = 413;
        snprintf(msg, cap, "%s needs about %s of memory; --mem-limit leaves %s for requests (docs/server.md, Memory)",
                 what, dhsa_cli_bytes((double)(r->reserved + bytes), a, sizeof a),
                 dhsa_cli_bytes((double)S.mem_pool, b, sizeof b));
    } else if (S.mem_used + bytes > S.mem_pool) {
        st = 503;
        snprintf(msg, cap, "%s needs about %s of memory and other requests hold %s of the %s --mem-limit leaves for "
                 "requests: retry later", what, dhsa_cli_bytes((double)bytes, a, sizeof a),
                 dhsa_cli_bytes((double)S.mem_used, b, sizeof b), dhsa_cli_bytes((double)S.mem_pool, c, sizeof c));
    } else {
        S.mem_used += bytes;
        if (S.mem_used > S.mem_peak) S.mem_peak = S.mem_used;
        r->reserved += bytes;
    }
    if (st) S.n_mem_refused++;
    pthread_mutex_unlock(&S.mu);
    return st;
}

static void mem_give(size_t *reserved) {
    if (!*reserved) return;
    pthread_mutex_lock(&S.mu);
    S.mem_used -= *reserved;
    pthread_mutex_unlock(&S.mu);
    *reserved = 0;
}

/* close_after: the connection ends after this response (a request whose framing
 * cannot be trusted). */
static enum MHD_Result send_text_opt(struct MHD_Connection *c, unsigned code, const char *type, char *body, size_t len,
                                     int close_after) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    /* while the server stops, no connection is kept for another request */
    if (close_after || atomic_load(&S.stopping)) MHD_add_response_header(r, "Connection", "close");
    enum MHD_Result ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result send_text(struct MHD_Connection *c, unsigned code, const char *type, char *body, size_t len) {
    return send_text_opt(c, code, type, body, len, 0);
}

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned code, json_t *j) {
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!s) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}";
        return send_text(c, 500, "application/json", strdup(oom), sizeof oom - 1);
    }
    return send_text(c, code, "application/json", s, strlen(s));
}

static json_t *error_object(unsigned code, const char *message, const char *param, const char *err_code) {
    const char *type = code == 400 || code == 404 || code == 405 || code == 413 ? "invalid_request_error"
                       : code == 503                                          ? "server_busy"
                                                                              : "server_error";
    json_t *e = json_object();
    json_object_set_new(e, "message", json_text(message, (int64_t)strlen(message)));
    json_object_set_new(e, "type", json_string(type));
    json_object_set_new(e, "param", param && param[0] ? json_string(param) : json_null());
    json_object_set_new(e, "code", err_code ? json_string(err_code) : json_null());
    json_t *o = json_object();
    json_object_set_new(o, "error", e);
    return o;
}

static enum MHD_Result send_error(struct MHD_Connection *c, unsigned code, const char *message, const char *param,
                                  const char *err_code) {
    pthread_mutex_lock(&S.mu);
    S.n_errors++;
    pthread_mutex_unlock(&S.mu);
    if (S.verbose) fprintf(stderr, "dhsa serve: %u %s\n", code, message);
    return send_json(c, code, error_object(code, message, param, err_code));
}

/* ------------------------------------------------------------ slots --- */

static int64_t common_prefix(const int32_t *a, int64_t na, const int32_t *b, int64_t nb) {
    int64_t n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

/* The free slot for a prompt: the longest cached prefix, then the least
 * recently used. Under S.mu. */
static slot *best_free(const int32_t *prompt, int64_t n) {
    slot *best = NULL;
    int64_t best_p = -1;
    for (int64_t i = 0; i < S.n_slots; i++) {
        slot *sl = &S.slots[i];
        if (sl->busy) continue;
        int64_t p = common_prefix(sl->tokens, sl->n_cached, prompt, n);
        if (p > best_p || (p == best_p && sl->last_used < best->last_used)) {
            best = sl;
            best_p = p;
        }
    }
    return best;
}

/* Waits (FIFO) for a slot. Returns it busy, or NULL: *why says why. */
static slot *acquire(const int32_t *prompt, int64_t n, const char **why) {
    pthread_mutex_lock(&S.mu);
    slot *sl = NULL;
    if (!S.q_head && (sl = best_free(prompt, n))) {
        sl->busy = 1;
        S.n_busy++;
        pthread_mutex_unlock(&S.mu);
        return sl;
    }
    if (S.n_queued >= S.max_queue) {
        pthread_mutex_unlock(&S.mu);
        *why = "queue";
        return NULL;
    }
    waiter w = {0};
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w.cv, &ca);
    pthread_condattr_destroy(&ca);
    w.prompt = prompt;
    w.n_prompt = n;
    if (S.q_tail) S.q_tail->next = &w;
    else S.q_head = &w;
    S.q_tail = &w;
    S.n_queued++;
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += (time_t)S.queue_timeout;
    while (!w.granted && !atomic_load(&S.stopping)) {
        if (pthread_cond_timedwait(&w.cv, &S.mu, &dl) == ETIMEDOUT) break;
    }
    if (!w.granted) { /* leave the queue */
        waiter **pp = &S.q_head, *prev = NULL;
        while (*pp && *pp != &w) {
            prev = *pp;
            pp = &(*pp)->next;
        }
        if (*pp) {
            *pp = w.next;
            if (S.q_tail == &w) S.q_tail = prev;
        }
        S.n_queued--;
        *why = atomic_load(&S.stopping) ? "stopping" : "timeout";
    }
    sl = w.granted;
    pthread_mutex_unlock(&S.mu);
    pthread_cond_destroy(&w.cv);
    return sl;
}

/* Gives the slot to the first waiter, or frees it. */
static void release(slot *sl) {
    pthread_mutex_lock(&S.mu);
    sl->logits_of = NULL; /* the next request starts from its own prefill */
    sl->last_used = ++S.use_clock;
    if (S.q_head && !atomic_load(&S.stopping)) { /* stopping: the waiters leave with a 503 */
        waiter *w = S.q_head;
        S.q_head = w->next;
        if (!S.q_head) S.q_tail = NULL;
        S.n_queued--;
        w->granted = sl; /* stays busy */
        pthread_cond_signal(&w->cv);
    } else {
        sl->busy = 0;
        S.n_busy--;
    }
    pthread_mutex_unlock(&S.mu);
}

/* The slot's session for a request's attention (the server's unless the
 * request names its own); a change makes the session anew (its cache is
 * then empty). Returns 0, or -1 with msg. */
static int slot_prepare(slot *sl, int attn, double density, char *msg, size_t cap) {
    dhsa_session_params sp = S.sp;
    if (attn != SERVE_ATTN_UNSET) sp.attn = (dhsa_attn_method)attn;
    if (density > 0) sp.router.density = density;
    if (sl->s && sp.attn == sl->sp.attn && sp.router.density == sl->sp.router.density) return 0;
    dhsa_session_free(sl->s);
    sl->s = NULL;
    sl->n_cached = 0;
    if (dhsa_session_create(sl->ctx, S.m, &sp, &sl->s)) {
        snprintf(msg, cap, "no session for attn %s, density %g: %s", dhsa_attn_method_name(sp.attn),
                 sp.router.density, dhsa_last_error());
        /* back to the server's own, which fitted at start */
        if (dhsa_session_create(sl->ctx, S.m, &S.sp, &sl->s) == DHSA_OK) sl->sp = S.sp;
        return -1;
    }
    sl->sp = sp;
    return 0;
}

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
 * safe_len change under S.mu, where the connection thread copies
 * out[0..safe_len) into its view. It reads the rest only after the
 * batcher has let go (joined = 0, under S.mu). */
typedef struct gen {
    struct MHD_Connection *conn;
    int fd;                  /* the connection's socket, for client_gone_fd (-1: unknown) */
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
    /* --batch on, under S.mu */
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

/* 1 when the peer of socket fd has gone (EOF or an error; bytes waiting,
 * a pipelined request, are not read). */
static int client_gone_fd(int fd) {
    if (fd < 0) return 0;
    char b;
    ssize_t r = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

static int connection_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

static int client_gone(struct MHD_Connection *c) { return client_gone_fd(connection_fd(c)); }

static int append_out(gen *g, const char *p, int64_t n) {
    if (g->out_len + n + 1 > g->out_cap) {
        int64_t cap = (g->out_cap ? g->out_cap * 2 : 1024);
        while (cap < g->out_len + n + 1) cap *= 2;
        char *o = realloc(g->out, (size_t)cap);
        if (!o) return -1;
        g->out = o;
        g->out_cap = cap;
    }
    memcpy(g->out + g->out_len, p, (size_t)n);
    g->out_len += n;
    return 0;
}

/* Samples one id from logits [n_vocab] with the penalties of OpenAI (over
 * the ids generated so far). With ignore_eos the stop ids' logits are -Inf
 * (as llama.cpp's ignore_eos): the sampler never draws one, so none ends
 * the reply and none is in its text or the slot's cache; their probability
 * goes to the other ids, as a top-k / top-p cut's does. */
static int sample_next(gen *g, const float *logits, int32_t *next) {
    slot *sl = g->sl;
    const float *lg = logits;
    if (logits == sl->logits && sl->logits_of != g) {
        snprintf(g->err_msg, sizeof g->err_msg, "internal error: the slot's logits are not this request's own "
                 "(its prompt was not evaluated); nothing was sampled");
        return -1;
    }
    const int penalties = g->touched_count && (g->rq.presence_penalty != 0 || g->rq.frequency_penalty != 0);
    if (penalties || g->rq.ignore_eos || g->jc) {
        memcpy(sl->scratch, logits, (size_t)S.in->n_vocab * sizeof(float));
        for (int32_t i = 0; penalties && i < g->touched_count; i++) {
            int32_t id = g->touched[i];
            sl->scratch[id] -= (float)(g->rq.frequency_penalty * sl->counts[id] + g->rq.presence_penalty);
        }
        for (int i = 0; g->rq.ignore_eos && i < g->n_stop_ids; i++) sl->scratch[g->stop_ids[i]] = -INFINITY;
        lg = sl->scratch;
        /* JSON: only the ids that continue the value; the stop ids only
         * once it is complete */
        if (g->jc && dhsa_json_constraint_mask(g->jc, sl->scratch, g->stop_ids, g->rq.ignore_eos ? 0 : g->n_stop_ids,
                                               NULL)) {
            snprintf(g->err_msg, sizeof g->err_msg, "response_format: %s", dhsa_last_error());
            return -1;
        }
    }
    if (dhsa_sampler_sample(g->smp, lg, sl->tokens, sl->n_cached, next)) {
        snprintf(g->err_msg, sizeof g->err_msg, "sampling: %s", dhsa_last_error());
        return -1;
    }
    if (sl->counts[*next]++ == 0) g->touched[g->touched_count++] = *next;
    return 0;
}

/* A step's per-token work, first half (no lock: only the step's thread
 * touches what it writes), on the logits [n_vocab] of the decode step or
 * prefill before: ends the generation at max_tokens, a stopping server or
 * a stop id, or samples next_id and puts its text in piece. Returns 1
 * with a piece to publish, 0 when the generation ended (finish or error). */
static int pick(gen *g, const float *logits) {
    slot *sl = g->sl;
    g->piece_len = 0;
    if (g->n_gen >= g->max_gen) {
        g->finish = "length";
        return 0;
    }
    if (atomic_load(&S.stopping)) {
        g->error = 1;
        snprintf(g->err_msg, sizeof g->err_msg, "the server is shutting down");
        return 0;
    }
    int32_t next;
    if (sample_next(g, logits, &next)) {
        g->error = 1;
        return 0;
    }
    if (g->n_gen == 0) g->t_first = now_s();
    for (int i = 0; i < g->n_stop_ids; i++) /* never true with ignore_eos: sample_next masked them */
        if (next == g->stop_ids[i]) {
            g->finish = "stop";
            return 0;
        }
    if (g->jc && dhsa_json_constraint_accept(g->jc, next)) { /* the mask let it through: a bug if refused */
        g->error = 1;
        snprintf(g->err_msg, sizeof g->err_msg, "internal error: response_format: %s", dhsa_last_error());
        return 0;
    }
    g->n_gen++;
    int64_t len = 0;
    if (dhsa_token_to_piece(S.tok, next, 0, g->piece, sizeof g->piece, &len) != DHSA_OK) len = 0;
    if (g->first_piece && len > 0) {
        /* a chat reply: SentencePiece's word-start space is not the reply's text */
        if (g->chat && g->piece[0] == ' ' && dhsa_tokenizer_kind_of(S.tok) == DHSA_TOKENIZER_SPM) {
            memmove(g->piece, g->piece + 1, (size_t)len - 1);
            len--;
        }
        g->first_piece = 0;
    }
    g->piece_len = len;
    g->next_id = next;
    sl->tokens[sl->n_cached] = next;
    return 1;
}

/* Second half, under S.mu: appends the piece (picked: pick returned 1),
 * ends the text before a stop string (finish "stop"), ends the generation
 * at max_tokens or a full context (finish "length"), and moves safe_len up
 * to all but a tail that could begin a stop string (all of it once the
 * generation ended). Returns 1 when next_id is to be evaluated, 0 when the
 * generation ended. */
static int publish(gen *g, int picked) {
    slot *sl = g->sl;
    if (picked) {
        if (append_out(g, g->piece, g->piece_len)) {
            g->error = 1;
            snprintf(g->err_msg, sizeof g->err_msg, "out of memory");
        } else {
            /* a stop string can only begin in the held-back tail (one
             * wholly before it would have ended the generation already) */
            const char *u = g->out + g->safe_len;
            int64_t n = g->out_len - g->safe_len, cut = -1;
            for (int i = 0; i < g->rq.n_stop; i++) {
                const char *hit = memmem(u, (size_t)n, g->rq.stop[i], (size_t)g->rq.stop_len[i]);
                if (hit && (cut < 0 || hit - u < cut)) cut = hit - u;
            }
            if (cut >= 0) {
                g->out_len = g->safe_len + cut;
                g->finish = "stop";
            } else if (g->jc && dhsa_json_constraint_finished(g->jc)) {
                g->finish = "stop"; /* the JSON value closed: nothing may follow */
            } else if (g->n_gen >= g->max_gen || sl->n_cached >= dhsa_session_get_plan(sl->s)->n_ctx) {
                g->finish = "length";
            }
        }
    }
    if (g->finish || g->error) {
        g->safe_len = g->out_len;
        return 0;
    }
    const char *u = g->out + g->safe_len;
    int64_t n = g->out_len - g->safe_len, hold = 0;
    for (int i = 0; i < g->rq.n_stop; i++)
        for (int64_t k = g->rq.stop_len[i] - 1; k > hold; k--)
            if (k <= n && memcmp(u + n - k, g->rq.stop[i], (size_t)k) == 0) {
                hold = k;
                break;
            }
    g->safe_len = g->out_len - hold;
    return 1;
}

/* Both halves on the connection's thread (before the generation joins
 * the batcher, or with --batch off). Returns publish's answer. */
static int advance(gen *g, const float *logits) {
    int picked = pick(g, logits);
    pthread_mutex_lock(&S.mu);
    int more = publish(g, picked);
    pthread_mutex_unlock(&S.mu);
    return more;
}

/* --batch off: one whole step on the connection's thread, the per-token
 * work and then the sampled id's decode step. */
static void step_alone(gen *g) {
    slot *sl = g->sl;
    if (!advance(g, sl->logits)) return;
    double t = now_s();
    sl->logits_of = NULL;
    if (dhsa_session_eval(sl->s, &g->next_id, 1, sl->logits)) {
        g->error = 1;
        snprintf(g->err_msg, sizeof g->err_msg, "decode: %s", dhsa_last_error());
        sl->n_cached = dhsa_session_length(sl->s);
        return;
    }
    sl->logits_of = g;
    g->t_decode += now_s() - t;
    sl->n_cached++;
}

/* ---------------------------------------------------------- batcher --- */

/* Hands a generation whose first token is published (next_id waiting for
 * its decode step) to the batcher. */
static void join(gen *g) {
    pthread_mutex_lock(&S.mu);
    g->joined = 1;
    g->sl->joined = g;
    pthread_cond_signal(&S.cv_work);
    pthread_mutex_unlock(&S.mu);
}

/* The batcher lets go of a generation (under S.mu); it never touches it
 * again. */
static void detach(gen *g) {
    g->joined = 0;
    g->sl->joined = NULL;
    pthread_cond_signal(&g->cv);
}

/* The connection takes its generation back (its stream ended or failed):
 * the batcher lets go after the pass it may be running. */
static void leave(gen *g) {
    pthread_mutex_lock(&S.mu);
    if (g->joined) {
        g->cancel = 1;
        while (g->joined) pthread_cond_wait(&g->cv, &S.mu);
    }
    pthread_mutex_unlock(&S.mu);
}

/* The batcher: runs the pending decode steps of every joined generation
 * as one dhsa_session_eval_batch, then each row's per-token work, and
 * starts the next pass at once; it waits only when no generation is
 * joined. A failed batch is run again one slot at a time, so that each
 * slot gets its own outcome. */
static void *batcher_main(void *arg) {
    (void)arg;
    const int64_t V = S.in->n_vocab;
    pthread_mutex_lock(&S.mu);
    for (;;) {
        int64_t k = 0;
        for (int64_t i = 0; i < S.n_slots; i++) {
            gen *g = S.slots[i].joined;
            if (!g) continue;
            if (g->cancel) {
                detach(g);
                continue;
            }
            S.batch_sl[k] = &S.slots[i];
            S.batch_g[k] = g;
            S.batch_ss[k] = S.slots[i].s;
            S.batch_ids[k++] = g->next_id;
        }
        if (!k) {
            if (S.batcher_quit) break;
            pthread_cond_wait(&S.cv_work, &S.mu);
            continue;
        }
        pthread_mutex_unlock(&S.mu);
        const double t_eval = now_s();
        dhsa_status st = dhsa_session_eval_batch(S.batch_ss, k, S.batch_ids, S.batch_logits);
        const double t_evaluated = now_s();
        for (int64_t t = 0; t < k; t++) {
            slot *sl = S.batch_sl[t];
            gen *g = S.batch_g[t];
            const float *lg = S.batch_logits + t * V;
            S.batch_next[t] = -1; /* ended without a piece to publish */
            if (st != DHSA_OK) {
                lg = sl->logits;
                sl->logits_of = NULL;
                if (dhsa_session_eval(sl->s, &S.batch_ids[t], 1, sl->logits)) {
                    g->error = 1;
                    snprintf(g->err_msg, sizeof g->err_msg, "decode: %s", dhsa_last_error());
                    sl->n_cached = dhsa_session_length(sl->s);
                    continue;
                }
                sl->logits_of = g;
            }
            sl->n_cached++;
            g->t_decode += t_evaluated - t_eval;
            if (client_gone_fd(g->fd)) {
                g->gone = 1;
                continue;
            }
            S.batch_next[t] = pick(g, lg);
        }
        pthread_mutex_lock(&S.mu);
        for (int64_t t = 0; t < k; t++) {
            gen *g = S.batch_g[t];
            int more = S.batch_next[t] >= 0 && publish(g, S.batch_next[t]);
            if (!more || g->cancel) detach(g);
            else if (g->rq.stream) pthread_cond_signal(&g->cv);
        }
        S.n_batches++;
        S.n_batch_rows += (uint64_t)k;
        S.batch_eval_s += t_evaluated - t_eval;
        S.batch_sample_s += now_s() - t_evaluated;
    }
    pthread_mutex_unlock(&S.mu);
    return NULL;
}

/* ------------------------------------------------------ the replies --- */

/* The connection thread's view of its generation brought up to date:
 * with --batch on, waits until the batcher has published more text or
 * let go. Sets over when the generation has ended. Returns 0, or -1 out
 * of memory. */
static int gen_sync(gen *g) {
    int rc = 0;
    pthread_mutex_lock(&S.mu);
    while (g->joined && g->safe_len == g->view_len) pthread_cond_wait(&g->cv, &S.mu);
    int64_t n = g->safe_len - g->view_len;
    if (n > 0 && g->view_len + n + 1 > g->view_cap) {
        int64_t cap = g->out_cap > g->view_len + n + 1 ? g->out_cap : g->view_len + n + 1;
        char *v = realloc(g->view, (size_t)cap);
        if (v) {
            g->view = v;
            g->view_cap = cap;
        } else {
            rc = -1;
        }
    }
    if (!rc && n > 0) {
        memcpy(g->view + g->view_len, g->out + g->view_len, (size_t)n);
        g->view_len += n;
    }
    g->over = !g->joined && (g->finish || g->error || g->gone);
    pthread_mutex_unlock(&S.mu);
    return rc;
}

static void gen_free(gen *g) {
    if (!g) return;
    leave(g);
    if (g->sl) {
        slot *sl = g->sl;
        for (int32_t i = 0; i < g->touched_count; i++) sl->counts[g->touched[i]] = 0;
        release(sl);
    }
    dhsa_sampler_free(g->smp);
    dhsa_json_constraint_free(g->jc);
    serve_request_free(&g->rq);
    pthread_cond_destroy(&g->cv);
    free(g->out);
    free(g->view);
    free(g->touched);
    free(g->pend);
    mem_give(&g->reserved);
    free(g);
}

static json_t *usage_json(const gen *g) {
    json_t *u = json_object();
    json_object_set_new(u, "prompt_tokens", json_integer(g->n_prompt));
    json_object_set_new(u, "completion_tokens", json_integer(g->n_gen));
    json_object_set_new(u, "total_tokens", json_integer(g->n_prompt + g->n_gen));
    json_t *d = json_object();
    json_object_set_new(d, "cached_tokens", json_integer(g->n_reused));
    json_object_set_new(u, "prompt_tokens_details", d);
    return u;
}

static json_t *envelope(const gen *g, int chunk) {
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(g->id));
    json_object_set_new(o, "object", json_string(g->chat ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                                         : "text_completion"));
    json_object_set_new(o, "created", json_integer((json_int_t)g->created));
    json_object_set_new(o, "model", json_string(S.model_name));
    json_object_set_new(o, "system_fingerprint", json_string("dhsa-" DHSA_VERSION));
    return o;
}

/* The choice of a stream chunk (text may be NULL) or of the whole reply. */
static json_t *choice(const gen *g, const char *text, int64_t n, int chunk, const char *finish) {
    json_t *c = json_object();
    json_object_set_new(c, "index", json_integer(0));
    if (g->chat) {
        json_t *m = json_object();
        if (!chunk || !g->role_sent) json_object_set_new(m, "role", json_string("assistant"));
        if (text) json_object_set_new(m, "content", json_text(text, n));
        json_object_set_new(c, chunk ? "delta" : "message", m);
    } else {
        json_object_set_new(c, "text", json_text(text ? text : "", text ? n : 0));
    }
    json_object_set_new(c, "logprobs", json_null());
    json_object_set_new(c, "finish_reason", finish ? json_string(finish) : json_null());
    return c;
}

/* Adds "data: <json>\n\n" to the stream's pending bytes. */
static int push_event(gen *g, json_t *j) {
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!s) return -1;
    size_t n = strlen(s), need = g->pend_len + n + 8;
    char *p = realloc(g->pend, need + 1);
    if (!p) {
        free(s);
        return -1;
    }
    g->pend = p;
    memcpy(p + g->pend_len, "data: ", 6);
    memcpy(p + g->pend_len + 6, s, n);
    memcpy(p + g->pend_len + 6 + n, "\n\n", 2);
    g->pend_len += n + 8;
    free(s);
    return 0;
}

static void note_done(gen *g) {
    leave(g);
    pthread_mutex_lock(&S.mu);
    S.gen_tokens += (uint64_t)g->n_gen;
    S.decode_s += g->t_decode;
    pthread_mutex_unlock(&S.mu);
    if (S.verbose)
        fprintf(stderr, "dhsa serve: %s slot %d: prompt %lld (%lld cached), %lld generated, %s, ttft %.3f s\n", g->id,
                g->sl ? g->sl->id : -1, (long long)g->n_prompt, (long long)g->n_reused, (long long)g->n_gen,
                g->error ? "error" : g->finish ? g->finish : "-", g->t_first > 0 ? g->t_first - g->t_start : 0.0);
}

/* Stream reader: each call sends what is pending, else makes the next
 * event from the text the generation has added (--batch off: after
 * running the next step here; on: after waiting for the batcher's). */
static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    gen *g = cls;
    for (;;) {
        if (g->pend_off < g->pend_len) {
            size_t n = g->pend_len - g->pend_off;
            if (n > max) n = max;
            memcpy(buf, g->pend + g->pend_off, n);
            g->pend_off += n;
            if (g->pend_off == g->pend_len) g->pend_off = g->pend_len = 0;
            return (ssize_t)n;
        }
        if (g->done_sent) return MHD_CONTENT_READER_END_OF_STREAM;
        if (!g->over) {
            if (!S.batch) {
                if (client_gone(g->conn)) return MHD_CONTENT_READER_END_WITH_ERROR; /* stream_free counts it */
                step_alone(g);
            }
            if (gen_sync(g)) return MHD_CONTENT_READER_END_WITH_ERROR;
            if (g->over && g->gone) return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        const char *finish = g->over ? g->finish : NULL;
        int rc = 0;
        if (g->over && g->error) {
            json_t *e = error_object(500, g->err_msg, NULL, NULL);
            rc = push_event(g, e);
            g->finish = finish = "error";
        } else {
            int64_t n = g->view_len - g->sent;
            if (n > 0 || (g->chat && !g->role_sent)) {
                int64_t used = n;
                char *clean = NULL;
                int64_t clen = 0;
                if (n > 0) {
                    clean = utf8_clean(g->view + g->sent, n, finish != NULL, &used, &clen);
                    if (!clean) return MHD_CONTENT_READER_END_WITH_ERROR;
                }
                if (used > 0 || (g->chat && !g->role_sent)) {
                    json_t *o = envelope(g, 1), *ch = json_array();
                    json_array_append_new(ch, choice(g, clean ? clean : "", clen, 1, NULL));
                    json_object_set_new(o, "choices", ch);
                    rc = push_event(g, o);
                    g->role_sent = 1;
                    g->sent += used;
                }
                free(clean);
            }
            if (!rc && finish) {
                json_t *o = envelope(g, 1), *ch = json_array();
                /* the last piece's remaining bytes (an incomplete UTF-8 tail) go with the finish */
                int64_t left = g->view_len - g->sent;
                json_array_append_new(ch, left > 0 ? choice(g, g->view + g->sent, left, 1, finish)
                                                   : choice(g, NULL, 0, 1, finish));
                g->sent = g->view_len;
                json_object_set_new(o, "choices", ch);
                if (!g->rq.include_usage) json_object_set_new(o, "usage", usage_json(g));
                rc = push_event(g, o);
                if (!rc && g->rq.include_usage) {
                    o = envelope(g, 1);
                    json_object_set_new(o, "choices", json_array());
                    json_object_set_new(o, "usage", usage_json(g));
                    rc = push_event(g, o);
                }
            }
        }
        if (rc) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (finish) {
            static const char done[] = "data: [DONE]\n\n";
            char *p = realloc(g->pend, g->pend_len + sizeof done);
            if (!p) return MHD_CONTENT_READER_END_WITH_ERROR;
            g->pend = p;
            memcpy(p + g->pend_len, done, sizeof done - 1);
            g->pend_len += sizeof done - 1;
            g->done_sent = 1;
            note_done(g);
        }
    }
}

/* The response is done with: sent whole, or the connection closed (a
 * client that went away while its stream ran counts as a disconnect). */
static void stream_free(void *cls) {
    gen *g = cls;
    if (!g->done_sent) {
        pthread_mutex_lock(&S.mu);
        S.n_disconnects++;
        pthread_mutex_unlock(&S.mu);
        note_done(g);
    }
    gen_free(g);
}

/* Builds the prompt's ids for a chat or completion request. Returns 0 or
 * an HTTP status with msg/param/code. */
static unsigned prompt_ids(gen *g, int32_t **ids, int64_t *n, char *msg, size_t cap, const char **param,
                           const char **code) {
    serve_request *r = &g->rq;
    unsigned flags = dhsa_tokenizer_default_flags(S.tok) & DHSA_TOKENIZE_ADD_BOS;
    *param = NULL;
    *code = NULL;
    if (r->kind == SERVE_REQ_COMPLETION && r->has_ids) {
        *ids = malloc((size_t)(r->n_ids + 1) * sizeof(int32_t));
        if (!*ids) return snprintf(msg, cap, "out of memory"), 500;
        memcpy(*ids, r->ids, (size_t)r->n_ids * sizeof(int32_t));
        *n = r->n_ids;
        if (*n < 1) { /* serve_request_parse refuses it already */
            *param = "prompt";
            return snprintf(msg, cap, "prompt is empty: a completion needs at least one token of its own"), 400;
        }
        return 0;
    }
    if (r->kind == SERVE_REQ_CHAT) {
        if (S.tmpl == DHSA_CHAT_NONE)
            return snprintf(msg, cap, "dhsa serve runs without a chat template (--template plain): start it "
                            "with --template llama3|chatml|qwen2.5|smollm2|gemma|mistral|llama2|phi3, or use "
                            "/v1/completions"), 400;
        dhsa_chat_message *cm = malloc((size_t)r->n_messages * sizeof *cm);
        if (!cm) return snprintf(msg, cap, "out of memory"), 500;
        for (int64_t i = 0; i < r->n_messages; i++) cm[i] = (dhsa_chat_message){r->messages[i].role, r->messages[i].content};
        /* the template's markers are special tokens, the messages plain
         * text: a client cannot forge a turn (docs/chat.md) */
        int64_t cnt = 0;
        *ids = NULL;
        dhsa_status st = dhsa_chat_tokenize(S.tmpl, S.tok, cm, r->n_messages, 1, flags, NULL, 0, &cnt);
        if (st == DHSA_OK || (st == DHSA_ERR_INVALID_ARG && cnt > 0)) {
            *ids = malloc((size_t)(cnt + 1) * sizeof(int32_t));
            st = *ids ? dhsa_chat_tokenize(S.tmpl, S.tok, cm, r->n_messages, 1, flags, *ids, cnt, n)
                      : DHSA_ERR_OUT_OF_MEMORY;
        }
        free(cm);
        if (st) {
            snprintf(msg, cap, "%s", st == DHSA_ERR_OUT_OF_MEMORY && !*ids ? "out of memory" : dhsa_last_error());
            free(*ids);
            *ids = NULL;
            *param = "messages";
            return st == DHSA_ERR_OUT_OF_MEMORY ? 500 : 400;
        }
        if (*n == 0) {
            *param = "messages";
            return snprintf(msg, cap, "the messages render to no tokens"), 400;
        }
        return 0;
    }
    const char *t = r->text;
    int64_t tl = r->text_len;
    int64_t cnt = 0;
    dhsa_status st = dhsa_tokenize(S.tok, t, tl, flags, NULL, 0, &cnt);
    if (st != DHSA_OK && st != DHSA_ERR_INVALID_ARG) {
        snprintf(msg, cap, "tokenize: %s", dhsa_last_error());
        return 400;
    }
    *ids = malloc((size_t)(cnt + 1) * sizeof(int32_t));
    if (!*ids || dhsa_tokenize(S.tok, t, tl, flags, *ids, cnt, n)) {
        snprintf(msg, cap, "tokenize: %s", *ids ? dhsa_last_error() : "out of memory");
        free(*ids);
        *ids = NULL;
        return 500;
    }
    /* the BOS the server adds is not a token of the client's own */
    const int bos_added = (flags & DHSA_TOKENIZE_ADD_BOS) && *n > 0 && (*ids)[0] == dhsa_tokenizer_bos(S.tok);
    if (*n - bos_added < 1) {
        *param = "prompt";
        return snprintf(msg, cap, "the prompt tokenizes to nothing: a completion needs at least one token of its own"),
               400;
    }
    return 0;
}

/* Evaluates the prompt into the slot: the cached prefix is kept, the rest
 * goes in pieces, with a check for a departed client between them.
 * Returns 0, or an HTTP status with msg. */
static unsigned prefill(gen *g, const int32_t *ids, int64_t n, char *msg, size_t cap) {
    slot *sl = g->sl;
    sl->logits_of = NULL;
    if (n < 1) /* handle_generate refuses such a request: this is the last line */
        return snprintf(msg, cap, "internal error: a request with no prompt tokens reached the prefill"), 500;
    int64_t keep = common_prefix(sl->tokens, sl->n_cached, ids, n);
    if (keep >= n) keep = n - 1; /* the last prompt token runs again for its logits */
    if (dhsa_session_truncate(sl->s, keep)) {
        /* a session that could not rebuild its indexes: start it anew */
        snprintf(msg, cap, "prompt cache: %s", dhsa_last_error());
        sl->n_cached = 0;
        if (dhsa_session_reset(sl->s)) return 500;
        keep = 0;
    }
    sl->n_cached = keep;
    g->n_reused = keep;
    memcpy(sl->tokens + keep, ids + keep, (size_t)(n - keep) * sizeof(int32_t));
    const int64_t piece = 4 * dhsa_session_get_plan(sl->s)->n_ubatch;
    double t = now_s();
    for (int64_t at = keep; at < n;) {
        int64_t k = n - at < piece ? n - at : piece;
        if (dhsa_session_eval(sl->s, ids + at, k, at + k == n ? sl->logits : NULL)) {
            snprintf(msg, cap, "prefill: %s", dhsa_last_error());
            sl->n_cached = dhsa_session_length(sl->s);
            return 500;
        }
        at += k;
        sl->n_cached = at;
        if (at == n) sl->logits_of = g;
        if (at < n && (client_gone(g->conn) || atomic_load(&S.stopping))) {
            snprintf(msg, cap, "%s", atomic_load(&S.stopping) ? "the server is shutting down" : "the client went away");
            return 499;
        }
    }
    double dt = now_s() - t;
    pthread_mutex_lock(&S.mu);
    S.prompt_tokens += (uint64_t)n;
    S.cached_tokens += (uint64_t)keep;
    if (keep > 0) S.n_cache_hits++;
    S.prefill_s += dt;
    pthread_mutex_unlock(&S.mu);
    g->t_prefill = dt;
    return 0;
}

static enum MHD_Result handle_generate(struct MHD_Connection *c, request_ctx *rc, serve_req_kind kind) {
    serve_limits lim = {S.max_tokens, 2 * S.n_ctx + 16, S.in->n_vocab}; /* a longer prompt is refused below, naming --ctx */
    gen *g = calloc(1, sizeof *g);
    if (!g) return send_error(c, 500, "out of memory", NULL, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->fd = -1;
    serve_error e;
    if (serve_request_parse(kind, rc->body, rc->len, &lim, &g->rq, &e)) {
        gen_free(g);
        return send_error(c, 400, e.message, e.param, NULL);
    }
    free(rc->body); /* parsed: its bytes stay reserved until the answer is sent */
    rc->body = NULL;
    g->conn = c;
    g->fd = connection_fd(c);
    g->chat = kind == SERVE_REQ_CHAT;
    g->first_piece = 1;
    g->created = time(NULL);
    g->t_start = now_s();
    snprintf(g->id, sizeof g->id, "%s-%" PRIu64, g->chat ? "chatcmpl" : "cmpl", (uint64_t)atomic_fetch_add(&S.id_counter, 1));
    char msg[600];
    const char *param = NULL, *code = NULL;
    int32_t *ids = NULL;
    int64_t n = 0;
    /* a text that cannot fit the context is refused before it is
     * tokenized: a token covers at most max_piece bytes of it */
    int64_t text_bytes = g->chat ? 0 : g->rq.text_len;
    for (int64_t i = 0; i < g->rq.n_messages; i++) text_bytes += (int64_t)strlen(g->rq.messages[i].content);
    unsigned status = 0;
    if ((text_bytes + S.max_piece - 1) / S.max_piece > S.n_ctx) {
        snprintf(msg, sizeof msg, "the prompt's %lld bytes of text are at least %lld tokens (a token covers at most %lld "
                 "bytes here); a slot's context holds %lld (--ctx)", (long long)text_bytes,
                 (long long)((text_bytes + S.max_piece - 1) / S.max_piece), (long long)S.max_piece, (long long)S.n_ctx);
        status = 400;
        param = g->chat ? "messages" : "prompt";
        code = "context_length_exceeded";
    }
    /* the tokenizer's work (the template's markers: 64 bytes a message) */
    if (!status)
        status = mem_take(rc, (size_t)(text_bytes + 64 * g->rq.n_messages) * TOKENIZE_WORK_PER_BYTE + 4096,
                          "tokenizing the prompt", msg, sizeof msg);
    if (!status) status = prompt_ids(g, &ids, &n, msg, sizeof msg, &param, &code);
    if (!status && n > S.n_ctx) {
        snprintf(msg, sizeof msg, "the prompt has %lld tokens; a slot's context holds %lld (--ctx)", (long long)n,
                 (long long)S.n_ctx);
        status = 400;
        param = g->chat ? "messages" : "prompt";
        code = "context_length_exceeded";
    }
    int64_t room = S.n_ctx - n;
    int64_t want = g->rq.max_tokens >= 0 ? g->rq.max_tokens : (g->chat ? room : 16); /* OpenAI's defaults */
    if (!status && g->rq.max_tokens > room) {
        snprintf(msg, sizeof msg, "the prompt's %lld tokens and max_tokens %lld do not fit a slot's context of %lld "
                 "tokens (--ctx); max_tokens may be at most %lld here", (long long)n, (long long)g->rq.max_tokens,
                 (long long)S.n_ctx, (long long)room);
        status = 400;
        param = "max_tokens";
        code = "context_length_exceeded";
    }
    if (status) {
        free(ids);
        gen_free(g);
        return send_error(c, status, msg, param, code);
    }
    g->max_gen = want < S.max_tokens ? want : S.max_tokens;
    g->n_prompt = n;
    /* the generation's own memory: the penalties' ids, the sampler (its
     * arrays over the vocabulary), the text and its copies (the
     * connection's view, UTF-8 cleaning, JSON escaping: 20 bytes a byte) */
    status = mem_take(rc, (size_t)(g->max_gen + 1) * 4 + (size_t)S.in->n_vocab * (32 + (g->rq.json ? 1 : 0)) +
                              (size_t)g->max_gen * (size_t)S.max_piece * 20 + ((size_t)64 << 10),
                      "the generation", msg, sizeof msg);
    if (status) {
        free(ids);
        gen_free(g);
        return send_error(c, status, msg, NULL, NULL);
    }
    /* stops: EOS, and the chat format's end-of-turn ids (with ignore_eos
     * they are masked instead: sample_next) */
    if (dhsa_tokenizer_eos(S.tok) >= 0) g->stop_ids[g->n_stop_ids++] = dhsa_tokenizer_eos(S.tok);
    if (g->chat)
        for (int i = 0; i < S.n_chat_stop && g->n_stop_ids < 20; i++) g->stop_ids[g->n_stop_ids++] = S.chat_stop[i];
    dhsa_sampler_params sp = dhsa_sampler_default_params();
    sp.temperature = (float)g->rq.temperature;
    sp.top_p = (float)g->rq.top_p;
    sp.min_p = (float)g->rq.min_p;
    sp.top_k = g->rq.top_k;
    sp.repeat_penalty = (float)g->rq.repeat_penalty;
    sp.repeat_last_n = g->rq.repeat_last_n;
    if (g->rq.seed_set) sp.seed = g->rq.seed;
    else { /* as OpenAI: a request without a seed gets its own */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        sp.seed = ((uint64_t)ts.tv_sec * 1000000007u) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)atomic_load(&S.id_counter) << 32);
    }
    g->touched = malloc((size_t)(g->max_gen + 1) * sizeof(int32_t));
    if (!g->touched || dhsa_sampler_create(&sp, S.in->n_vocab, &g->smp) ||
        (g->rq.json && dhsa_json_constraint_create(g->rq.json_schema ? g->rq.json_schema : S.json_object, S.jvocab,
                                                   &g->jc))) {
        snprintf(msg, sizeof msg, "sampler: %s", g->touched ? dhsa_last_error() : "out of memory");
        free(ids);
        gen_free(g);
        return send_error(c, 500, msg, NULL, NULL);
    }
    const char *why = NULL;
    g->sl = acquire(ids, n, &why);
    if (!g->sl) {
        free(ids);
        gen_free(g);
        if (strcmp(why, "stopping") == 0) return send_error(c, 503, "the server is shutting down", NULL, NULL);
        snprintf(msg, sizeof msg, strcmp(why, "queue") == 0
                                      ? "all %lld slots are busy and %lld requests wait already (--max-queue): retry later"
                                      : "all %lld slots stayed busy for --queue-timeout %lld s: retry later",
                 (long long)S.n_slots, strcmp(why, "queue") == 0 ? (long long)S.max_queue : (long long)S.queue_timeout);
        return send_error(c, 503, msg, NULL, NULL);
    }
    if (atomic_load(&S.stopping)) { /* granted as the server began to stop: still a queued request */
        free(ids);
        gen_free(g);
        return send_error(c, 503, "the server is shutting down", NULL, NULL);
    }
    if (slot_prepare(g->sl, g->rq.attn, g->rq.density, msg, sizeof msg)) {
        free(ids);
        gen_free(g);
        return send_error(c, 400, msg, g->rq.attn != SERVE_ATTN_UNSET ? "attn" : "density", NULL);
    }
    status = prefill(g, ids, n, msg, sizeof msg);
    free(ids);
    if (status == 499) { /* nobody to answer */
        pthread_mutex_lock(&S.mu);
        S.n_disconnects++;
        pthread_mutex_unlock(&S.mu);
        gen_free(g);
        return atomic_load(&S.stopping) ? send_error(c, 503, msg, NULL, NULL) : MHD_NO;
    }
    if (status) {
        gen_free(g);
        return send_error(c, status, msg, NULL, NULL);
    }
    /* --batch on: the first token here, the rest in the batcher's passes */
    if (S.batch && advance(g, g->sl->logits)) join(g);
    if (g->rq.stream) {
        /* the stream outlives the request's handler: its memory goes with it (gen_free) */
        pthread_mutex_lock(&S.mu);
        g->reserved = rc->reserved;
        rc->reserved = 0;
        pthread_mutex_unlock(&S.mu);
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, g, stream_free);
        if (!r) {
            gen_free(g);
            return MHD_NO;
        }
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        if (atomic_load(&S.stopping)) MHD_add_response_header(r, "Connection", "close");
        enum MHD_Result ret = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r); /* stream_free runs when the response is done with */
        return ret;
    }
    /* whole reply */
    if (S.batch) {
        pthread_mutex_lock(&S.mu);
        while (g->joined) pthread_cond_wait(&g->cv, &S.mu);
        pthread_mutex_unlock(&S.mu);
    } else {
        while (!g->finish && !g->error && !g->gone) {
            if (client_gone(c)) g->gone = 1;
            else step_alone(g);
        }
    }
    if (g->gone) {
        pthread_mutex_lock(&S.mu);
        S.n_disconnects++;
        pthread_mutex_unlock(&S.mu);
        note_done(g);
        gen_free(g);
        return MHD_NO;
    }
    note_done(g);
    if (g->error) {
        snprintf(msg, sizeof msg, "%s", g->err_msg);
        gen_free(g);
        return send_error(c, atomic_load(&S.stopping) ? 503 : 500, msg, NULL, NULL);
    }
    json_t *o = envelope(g, 0), *ch = json_array();
    json_array_append_new(ch, choice(g, g->out ? g->out : "", g->out_len, 0, g->finish));
    json_object_set_new(o, "choices", ch);
    json_object_set_new(o, "usage", usage_json(g));
    gen_free(g);
    return send_json(c, 200, o);
}

/* ------------------------------------------------------ other calls --- */

/* Appends s[0..n) to the growing buffer b (*len used of *cap, which the
 * caller reserved: it never grows past it). Returns 0, or -1 when it would. */
static int put_bytes(char *b, size_t *len, size_t cap, const char *s, size_t n) {
    if (*len + n + 1 > cap) return -1;
    memcpy(b + *len, s, n);
    *len += n;
    b[*len] = 0;
    return 0;
}

/* /tokenize and /detokenize. The tokenizer's work, the ids and the answer
 * are reserved against the memory pool before they are allocated; the
 * answer is written as text (a jansson array would cost some 50 bytes an
 * id), each piece escaped by jansson. */
static enum MHD_Result handle_tokenize(struct MHD_Connection *c, request_ctx *rc, serve_req_kind kind) {
    serve_limits lim = {S.max_tokens, S.n_ctx, S.in->n_vocab};
    serve_request r;
    serve_error e;
    char msg[600];
    if (serve_request_parse(kind, rc->body, rc->len, &lim, &r, &e)) return send_error(c, 400, e.message, e.param, NULL);
    free(rc->body); /* parsed: its bytes stay reserved until the answer is sent */
    rc->body = NULL;
    if (kind == SERVE_REQ_DETOKENIZE) {
        /* the text (at most max_piece bytes an id), its UTF-8 cleaning (3x) and JSON (6x) */
        const size_t text = (size_t)r.n_ids * (size_t)S.max_piece + 16;
        unsigned st = mem_take(rc, 10 * text + 4096, "detokenizing", msg, sizeof msg);
        if (st) {
            serve_request_free(&r);
            return send_error(c, st, msg, NULL, NULL);
        }
        int64_t n = 0;
        dhsa_detokenize(S.tok, r.ids, r.n_ids, 0, NULL, 0, &n);
        char *t = malloc((size_t)n + 1);
        if (!t || dhsa_detokenize(S.tok, r.ids, r.n_ids, 0, t, n, &n)) {
            free(t);
            serve_request_free(&r);
            return send_error(c, 400, dhsa_last_error(), "tokens", NULL);
        }
        json_t *o = json_object();
        json_object_set_new(o, "content", json_text(t, n));
        free(t);
        serve_request_free(&r);
        return send_json(c, 200, o);
    }
    unsigned flags = r.add_special ? (dhsa_tokenizer_default_flags(S.tok) & DHSA_TOKENIZE_ADD_BOS) : 0;
    unsigned st = mem_take(rc, (size_t)r.text_len * TOKENIZE_WORK_PER_BYTE + 4096, "tokenizing the content", msg,
                           sizeof msg);
    if (st) {
        serve_request_free(&r);
        return send_error(c, st, msg, "content", NULL);
    }
    int64_t n = 0;
    dhsa_status ts = dhsa_tokenize(S.tok, r.text, r.text_len, flags, NULL, 0, &n); /* the count (cap 0) */
    if (ts == DHSA_ERR_INVALID_ARG && n > 0) ts = DHSA_OK;
    int32_t *ids = ts == DHSA_OK ? malloc((size_t)(n + 1) * sizeof(int32_t)) : NULL;
    if (!ids || dhsa_tokenize(S.tok, r.text, r.text_len, flags, ids, n, &n)) {
        snprintf(msg, sizeof msg, "%s", ts == DHSA_OK && !ids ? "out of memory" : dhsa_last_error());
        free(ids);
        serve_request_free(&r);
        return send_error(c, ts == DHSA_OK && !ids ? 500 : 400, msg, "content", NULL);
    }
    const int with_pieces = r.with_pieces;
    serve_request_free(&r); /* the text is done with */
    /* an id is at most 10 digits and a comma; with pieces, {"id":..,"piece":".."} with the piece's
     * bytes escaped (U+FFFD for a bad byte: 3 bytes, or \uXXXX: 6) */
    const size_t per = with_pieces ? 32 + 6 * (size_t)S.max_piece : 12;
    const size_t cap = (size_t)n * per + 64;
    st = mem_take(rc, cap, "the answer", msg, sizeof msg);
    char *b = st ? NULL : malloc(cap);
    if (!b) {
        free(ids);
        return st ? send_error(c, st, msg, NULL, NULL) : send_error(c, 500, "out of memory", NULL, NULL);
    }
    size_t len = 0;
    int bad = put_bytes(b, &len, cap, "{\"tokens\":[", 11);
    for (int64_t i = 0; i < n && !bad; i++) {
        char num[48];
        if (!with_pieces) {
            int k = snprintf(num, sizeof num, "%s%d", i ? "," : "", ids[i]);
            bad = put_bytes(b, &len, cap, num, (size_t)k);
            continue;
        }
        char piece[512];
        int64_t pl = 0;
        if (dhsa_token_to_piece(S.tok, ids[i], DHSA_DETOKENIZE_SPECIAL, piece, sizeof piece, &pl)) pl = 0;
        json_t *pj = json_text(piece, pl);
        char *ps = pj ? json_dumps(pj, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
        json_decref(pj);
        int k = snprintf(num, sizeof num, "%s{\"id\":%d,\"piece\":", i ? "," : "", ids[i]);
        bad = !ps || put_bytes(b, &len, cap, num, (size_t)k) || put_bytes(b, &len, cap, ps, strlen(ps)) ||
              put_bytes(b, &len, cap, "}", 1);
        free(ps);
    }
    if (!bad) bad = put_bytes(b, &len, cap, "]}", 2);
    free(ids);
    if (bad) {
        free(b);
        return send_error(c, 500, "internal error: the answer outgrew its reserved size", NULL, NULL);
    }
    return send_text(c, 200, "application/json", b, len);
}

static enum MHD_Result handle_models(struct MHD_Connection *c) {
    json_t *m = json_object();
    json_object_set_new(m, "id", json_string(S.model_name));
    json_object_set_new(m, "object", json_string("model"));
    json_object_set_new(m, "created", json_integer((json_int_t)S.started));
    json_object_set_new(m, "owned_by", json_string("dhsa"));
    json_t *meta = json_object();
    json_object_set_new(meta, "n_ctx", json_integer(S.n_ctx));
    json_object_set_new(meta, "n_ctx_train", json_integer(S.in->n_ctx_train));
    json_object_set_new(meta, "n_vocab", json_integer(S.in->n_vocab));
    json_object_set_new(meta, "n_params", json_integer(S.in->n_params));
    json_object_set_new(meta, "slots", json_integer(S.n_slots));
    json_object_set_new(meta, "attn", json_string(dhsa_attn_method_name(S.sp.attn)));
    json_object_set_new(meta, "chat_template", json_string(dhsa_chat_template_name(S.tmpl)));
    json_object_set_new(m, "meta", meta);
    json_t *d = json_array();
    json_array_append_new(d, m);
    json_t *o = json_object();
    json_object_set_new(o, "object", json_string("list"));
    json_object_set_new(o, "data", d);
    return send_json(c, 200, o);
}

static enum MHD_Result handle_health(struct MHD_Connection *c) {
    pthread_mutex_lock(&S.mu);
    int64_t busy = S.n_busy, queued = S.n_queued;
    pthread_mutex_unlock(&S.mu);
    int stopping = atomic_load(&S.stopping);
    json_t *o = json_object();
    json_object_set_new(o, "status", json_string(stopping ? "stopping" : "ok"));
    json_object_set_new(o, "slots_idle", json_integer(S.n_slots - busy));
    json_object_set_new(o, "slots_busy", json_integer(busy));
    json_object_set_new(o, "requests_queued", json_integer(queued));
    return send_json(c, stopping ? 503 : 200, o);
}

static enum MHD_Result handle_metrics(struct MHD_Connection *c) {
    pthread_mutex_lock(&S.mu);
    server m = S; /* a copy of the counters */
    pthread_mutex_unlock(&S.mu);
    size_t cap = 12288;
    char *b = malloc(cap);
    if (!b) return send_error(c, 500, "out of memory", NULL, NULL);
    static const char *names[5] = {"chat", "completions", "tokenize", "detokenize", "other"};
    size_t k = 0;
#define OUT(...) k += (size_t)snprintf(b + k, k < cap ? cap - k : 0, __VA_ARGS__)
    OUT("# HELP dhsa_requests_total Requests received, by endpoint.\n# TYPE dhsa_requests_total counter\n");
    for (int i = 0; i < 5; i++) OUT("dhsa_requests_total{endpoint=\"%s\"} %" PRIu64 "\n", names[i], m.n_requests[i]);
    OUT("# HELP dhsa_request_errors_total Requests answered with an error.\n# TYPE dhsa_request_errors_total counter\n"
        "dhsa_request_errors_total %" PRIu64 "\n", m.n_errors);
    OUT("# HELP dhsa_client_disconnects_total Generations stopped because the client went away.\n"
        "# TYPE dhsa_client_disconnects_total counter\ndhsa_client_disconnects_total %" PRIu64 "\n", m.n_disconnects);
    OUT("# HELP dhsa_prompt_tokens_total Prompt tokens of the requests (cached ones included).\n"
        "# TYPE dhsa_prompt_tokens_total counter\ndhsa_prompt_tokens_total %" PRIu64 "\n", m.prompt_tokens);
    OUT("# HELP dhsa_prompt_tokens_cached_total Prompt tokens taken from a slot's cache.\n"
        "# TYPE dhsa_prompt_tokens_cached_total counter\ndhsa_prompt_tokens_cached_total %" PRIu64 "\n", m.cached_tokens);
    OUT("# HELP dhsa_cache_hits_total Requests that reused a cached prefix.\n# TYPE dhsa_cache_hits_total counter\n"
        "dhsa_cache_hits_total %" PRIu64 "\n", m.n_cache_hits);
    OUT("# HELP dhsa_generated_tokens_total Tokens generated.\n# TYPE dhsa_generated_tokens_total counter\n"
        "dhsa_generated_tokens_total %" PRIu64 "\n", m.gen_tokens);
    OUT("# HELP dhsa_prefill_seconds_total Time in prompt evaluation.\n# TYPE dhsa_prefill_seconds_total counter\n"
        "dhsa_prefill_seconds_total %.6f\n", m.prefill_s);
    OUT("# HELP dhsa_decode_seconds_total Time in decode steps.\n# TYPE dhsa_decode_seconds_total counter\n"
        "dhsa_decode_seconds_total %.6f\n", m.decode_s);
    uint64_t evaluated = m.prompt_tokens - m.cached_tokens;
    OUT("# HELP dhsa_prefill_tokens_per_second Evaluated prompt tokens per second of prefill, since start.\n"
        "# TYPE dhsa_prefill_tokens_per_second gauge\ndhsa_prefill_tokens_per_second %.3f\n",
        m.prefill_s > 0 ? (double)evaluated / m.prefill_s : 0.0);
    OUT("# HELP dhsa_decode_tokens_per_second Decode steps per second of one slot, since start.\n"
        "# TYPE dhsa_decode_tokens_per_second gauge\ndhsa_decode_tokens_per_second %.3f\n",
        m.decode_s > 0 ? (double)m.gen_tokens / m.decode_s : 0.0);
    OUT("# HELP dhsa_decode_batches_total Batched decode passes (--batch on).\n# TYPE dhsa_decode_batches_total counter\n"
        "dhsa_decode_batches_total %" PRIu64 "\n", m.n_batches);
    OUT("# HELP dhsa_decode_batch_rows_total Decode steps run in those passes (rows / passes = mean batch).\n"
        "# TYPE dhsa_decode_batch_rows_total counter\ndhsa_decode_batch_rows_total %" PRIu64 "\n", m.n_batch_rows);
    OUT("# HELP dhsa_decode_batch_eval_seconds_total Time of those passes in dhsa_session_eval_batch.\n"
        "# TYPE dhsa_decode_batch_eval_seconds_total counter\ndhsa_decode_batch_eval_seconds_total %.6f\n",
        m.batch_eval_s);
    OUT("# HELP dhsa_decode_batch_sample_seconds_total Time the batcher spent between those passes on the rows' "
        "per-token work (sampling, stop checks, text).\n"
        "# TYPE dhsa_decode_batch_sample_seconds_total counter\ndhsa_decode_batch_sample_seconds_total %.6f\n",
        m.batch_sample_s);
    OUT("# HELP dhsa_slots Slots (sessions served at once).\n# TYPE dhsa_slots gauge\ndhsa_slots %lld\n",
        (long long)m.n_slots);
    OUT("# HELP dhsa_slots_busy Slots serving a request.\n# TYPE dhsa_slots_busy gauge\ndhsa_slots_busy %lld\n",
        (long long)m.n_busy);
    OUT("# HELP dhsa_requests_queued Requests waiting for a slot.\n# TYPE dhsa_requests_queued gauge\n"
        "dhsa_requests_queued %lld\n", (long long)m.n_queued);
    OUT("# HELP dhsa_request_memory_pool_bytes What --mem-limit leaves for requests (0: no limit).\n"
        "# TYPE dhsa_request_memory_pool_bytes gauge\ndhsa_request_memory_pool_bytes %zu\n", m.mem_pool);
    OUT("# HELP dhsa_request_memory_reserved_bytes Memory the requests in flight have reserved from it.\n"
        "# TYPE dhsa_request_memory_reserved_bytes gauge\ndhsa_request_memory_reserved_bytes %zu\n", m.mem_used);
    OUT("# HELP dhsa_request_memory_reserved_peak_bytes The most reserved at once since start.\n"
        "# TYPE dhsa_request_memory_reserved_peak_bytes gauge\ndhsa_request_memory_reserved_peak_bytes %zu\n", m.mem_peak);
    OUT("# HELP dhsa_request_memory_refused_total Requests refused (413 or 503) because the pool could not hold them.\n"
        "# TYPE dhsa_request_memory_refused_total counter\ndhsa_request_memory_refused_total %" PRIu64 "\n",
        m.n_mem_refused);
    pthread_mutex_lock(&S.conn_mu);
    const int64_t n_conns = S.n_conns;
    const uint64_t n_evicted = S.n_conn_evicted, n_conn_refused = S.n_conn_refused;
    pthread_mutex_unlock(&S.conn_mu);
    OUT("# HELP dhsa_connections Open connections.\n# TYPE dhsa_connections gauge\ndhsa_connections %lld\n",
        (long long)n_conns);
    OUT("# HELP dhsa_connections_evicted_total Idle connections closed to let a new one in (the server was full).\n"
        "# TYPE dhsa_connections_evicted_total counter\ndhsa_connections_evicted_total %" PRIu64 "\n", n_evicted);
    OUT("# HELP dhsa_connections_refused_total New connections closed at once: full, and none idle.\n"
        "# TYPE dhsa_connections_refused_total counter\ndhsa_connections_refused_total %" PRIu64 "\n", n_conn_refused);
    OUT("# HELP dhsa_resident_bytes Resident memory of the process.\n# TYPE dhsa_resident_bytes gauge\n"
        "dhsa_resident_bytes %zu\n", dhsa_proc_rss());
#undef OUT
    if (k >= cap) {
        free(b);
        return send_error(c, 500, "metrics: buffer too small", NULL, NULL);
    }
    return send_text(c, 200, "text/plain; version=0.0.4", b, k);
}

/* ------------------------------------------------------ connections --- */

static conn_rec *conn_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? (conn_rec *)ci->socket_context : NULL;
}

static void conn_mark(struct MHD_Connection *c, int in_request) {
    conn_rec *k = conn_of(c);
    if (!k) return;
    pthread_mutex_lock(&S.conn_mu);
    k->in_request = in_request;
    if (!in_request) k->idle_since = now_s();
    pthread_mutex_unlock(&S.conn_mu);
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe) {
    (void)cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        conn_rec *k = calloc(1, sizeof *k);
        if (!k) return; /* not tracked: never evicted, not counted */
        k->fd = connection_fd(c);
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        if (ci && ci->client_addr && ci->client_addr->sa_family == AF_INET)
            k->ip = ((const struct sockaddr_in *)(const void *)ci->client_addr)->sin_addr.s_addr;
        k->idle_since = now_s();
        pthread_mutex_lock(&S.conn_mu);
        k->next = S.conns;
        if (S.conns) S.conns->prev = k;
        S.conns = k;
        S.n_conns++;
        pthread_mutex_unlock(&S.conn_mu);
        *socket_context = k;
        return;
    }
    conn_rec *k = *socket_context;
    if (!k) return;
    pthread_mutex_lock(&S.conn_mu);
    if (k->prev) k->prev->next = k->next;
    else S.conns = k->next;
    if (k->next) k->next->prev = k->prev;
    S.n_conns--;
    pthread_mutex_unlock(&S.conn_mu);
    free(k);
    *socket_context = NULL;
}

/* A new connection (libmicrohttpd's accept policy). Under the limits it is
 * let in. At --max-connections (or --max-connections-per-ip for its
 * address) the connection that has been idle the longest, with no request
 * in flight for at least FULL_IDLE_S (the server's short idle timeout
 * while it is full), of that address when the address is at its limit,
 * is shut down and the new one let in; when there is none, the new one is
 * closed at once (the client sees its connection end, not a minute's
 * hang). */
static enum MHD_Result on_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen) {
    (void)cls;
    uint32_t ip = 0;
    if (addr && addrlen >= (socklen_t)sizeof(struct sockaddr_in) && addr->sa_family == AF_INET)
        ip = ((const struct sockaddr_in *)(const void *)addr)->sin_addr.s_addr;
    const double now = now_s();
    enum MHD_Result ok = MHD_YES;
    pthread_mutex_lock(&S.conn_mu);
    int64_t same = 0, live = 0;
    for (conn_rec *k = S.conns; k; k = k->next) {
        live += !k->evicted;
        same += !k->evicted && k->ip == ip;
    }
    const int ip_full = S.max_conn_ip > 0 && same >= S.max_conn_ip, full = live >= S.max_conn;
    if (full || ip_full) {
        conn_rec *victim = NULL;
        for (conn_rec *k = S.conns; k; k = k->next)
            if (!k->in_request && !k->evicted && k->fd >= 0 && (!ip_full || k->ip == ip) &&
                now - k->idle_since >= FULL_IDLE_S && (!victim || k->idle_since < victim->idle_since))
                victim = k;
        if (victim) {
            shutdown(victim->fd, SHUT_RDWR); /* its thread sees the end and closes it */
            victim->evicted = 1;
            S.n_conn_evicted++;
        } else {
            ok = MHD_NO;
            S.n_conn_refused++;
        }
    }
    pthread_mutex_unlock(&S.conn_mu);
    if (S.verbose && (full || ip_full))
        fprintf(stderr, "dhsa serve: %s: %s\n", ip_full ? "--max-connections-per-ip reached" : "--max-connections reached",
                ok == MHD_YES ? "the longest idle connection closed for a new one" : "no idle connection: a new one refused");
    return ok;
}

/* ---------------------------------------------------------- routing --- */

static void request_done(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode t) {
    (void)cls;
    (void)t;
    request_ctx *r = *con_cls;
    if (r) {
        conn_mark(c, 0);
        free(r->body);
        mem_give(&r->reserved);
        free(r);
        *con_cls = NULL;
        pthread_mutex_lock(&S.mu);
        S.n_active--;
        pthread_mutex_unlock(&S.mu);
    }
}

/* Malformed headers that libmicrohttpd lets through to the handler (it
 * rejects others itself, docs/server.md): a name that is not an RFC 9110
 * token (empty, a space before the colon), a NUL in a value, a second
 * Content-Length, Content-Length with Transfer-Encoding (the two framings
 * a proxy in front could read differently), HTTP/1.1 without Host. */
typedef struct {
    char why[200];
    int n_length, n_host, n_te;
} header_check;

static int is_tchar(unsigned char ch) {
    return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
           (ch && strchr("!#$%&'*+-.^_`|~", ch) != NULL);
}

static enum MHD_Result check_header(void *cls, enum MHD_ValueKind kind, const char *key, size_t key_size,
                                    const char *value, size_t value_size) {
    (void)kind;
    header_check *h = cls;
    size_t i = 0;
    while (i < key_size && is_tchar((unsigned char)key[i])) i++;
    if (key_size == 0 || i < key_size) {
        snprintf(h->why, sizeof h->why, "malformed HTTP: the header name \"%.60s\" is not a token", key ? key : "");
        return MHD_NO;
    }
    if (value && memchr(value, 0, value_size)) {
        snprintf(h->why, sizeof h->why, "malformed HTTP: the header %.60s holds a NUL byte", key);
        return MHD_NO;
    }
    h->n_length += strcasecmp(key, "Content-Length") == 0;
    h->n_host += strcasecmp(key, "Host") == 0;
    h->n_te += strcasecmp(key, "Transfer-Encoding") == 0;
    return MHD_YES;
}

/* 1 with a sentence in why when the request's headers are malformed. */
static int malformed_headers(struct MHD_Connection *c, const char *version, char *why, size_t cap) {
    header_check h;
    memset(&h, 0, sizeof h);
    MHD_get_connection_values_n(c, MHD_HEADER_KIND, check_header, &h);
    if (!h.why[0] && h.n_length > 1)
        snprintf(h.why, sizeof h.why, "malformed HTTP: %d Content-Length headers", h.n_length);
    if (!h.why[0] && h.n_length && h.n_te)
        snprintf(h.why, sizeof h.why, "malformed HTTP: both Content-Length and Transfer-Encoding");
    if (!h.why[0] && h.n_host != 1 && version && strcmp(version, "HTTP/1.1") == 0)
        snprintf(h.why, sizeof h.why, "malformed HTTP: an HTTP/1.1 request needs exactly one Host header (%d)",
                 h.n_host);
    if (!h.why[0]) return 0;
    snprintf(why, cap, "%s", h.why);
    return 1;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)cls;
    request_ctx *r = *con_cls;
    if (!r) {
        r = calloc(1, sizeof *r);
        if (!r) return MHD_NO;
        r->t0 = now_s();
        *con_cls = r;
        pthread_mutex_lock(&S.mu);
        S.n_active++;
        pthread_mutex_unlock(&S.mu);
        conn_mark(c, 1);
        char why[400];
        unsigned early = 0;
        const char *ecode = NULL;
        if (malformed_headers(c, version, why, sizeof why)) {
            early = 400;
            ecode = "malformed_http";
        } else {
            /* the body's size from the headers, before a byte of it is
             * read: over --max-body or the memory pool it is answered at
             * once (and not read) */
            const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
            if (cl) {
                char *end = NULL;
                errno = 0;
                unsigned long long n = strtoull(cl, &end, 10); /* libmicrohttpd has checked the digits */
                if (errno || end == cl || n > (unsigned long long)S.max_body) {
                    early = 413;
                    snprintf(why, sizeof why, "the request body of %s bytes is larger than --max-body %lld bytes", cl,
                             (long long)S.max_body);
                } else if (n > 0) {
                    early = mem_take(r, (size_t)n + 1, "the request body", why, sizeof why);
                    if (!early) {
                        r->body = malloc((size_t)n + 1);
                        if (!r->body) return MHD_NO;
                        r->cap = (size_t)n + 1;
                    }
                }
            }
        }
        if (!early) return MHD_YES;
        r->handled = 1; /* answered before the body; the connection is closed after it */
        pthread_mutex_lock(&S.mu);
        S.n_errors++;
        pthread_mutex_unlock(&S.mu);
        if (S.verbose) fprintf(stderr, "dhsa serve: %u %s\n", early, why);
        json_t *e = error_object(early, why, NULL, ecode);
        char *js = e ? json_dumps(e, JSON_COMPACT) : NULL;
        json_decref(e);
        if (!js) return MHD_NO;
        return send_text_opt(c, early, "application/json", js, strlen(js), 1);
    }
    if (*upload_size) { /* a piece of the body */
        if (!r->too_large && !r->handled) {
            if (r->len + *upload_size > (size_t)S.max_body) {
                r->too_large = 413;
            } else if (r->len + *upload_size + 1 > r->cap) {
                /* chunked (no Content-Length), or more than it said: the
                 * buffer grows, each growth taken from the pool first */
                size_t cap = r->cap ? r->cap : 4096;
                while (cap < r->len + *upload_size + 1) cap *= 2;
                if (cap > (size_t)S.max_body + 1) cap = (size_t)S.max_body + 1;
                char msg[400];
                unsigned st = mem_take(r, cap - r->cap, "the request body", msg, sizeof msg);
                char *b = st ? NULL : realloc(r->body, cap);
                if (st) {
                    r->too_large = (int)st;
                } else if (!b) {
                    return MHD_NO;
                } else {
                    r->body = b;
                    r->cap = cap;
                }
            }
            if (r->too_large) { /* the rest is read and dropped */
                free(r->body);
                r->body = NULL;
                r->len = r->cap = 0;
            } else {
                memcpy(r->body + r->len, upload, *upload_size);
                r->len += *upload_size;
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (r->handled) return MHD_YES;
    r->handled = 1;
    int post = strcmp(method, "POST") == 0, get = strcmp(method, "GET") == 0;
    int ep = strcmp(url, "/v1/chat/completions") == 0 ? 0
             : strcmp(url, "/v1/completions") == 0    ? 1
             : strcmp(url, "/tokenize") == 0          ? 2
             : strcmp(url, "/detokenize") == 0        ? 3
                                                      : 4;
    pthread_mutex_lock(&S.mu);
    S.n_requests[ep]++;
    pthread_mutex_unlock(&S.mu);
    if (atomic_load(&S.stopping) && ep < 4) return send_error(c, 503, "the server is shutting down", NULL, NULL);
    if (r->too_large) {
        char msg[300];
        if (r->too_large == 413)
            snprintf(msg, sizeof msg, "the request body is larger than --max-body %lld bytes", (long long)S.max_body);
        else
            snprintf(msg, sizeof msg, "the request body did not fit the memory other requests leave under --mem-limit "
                     "now: retry later");
        return send_error(c, (unsigned)r->too_large, msg, NULL, NULL);
    }
    if (ep < 4 && !post) return send_error(c, 405, "this endpoint takes POST", NULL, NULL);
    if (ep <= 3) { /* what parsing the body takes, before it is parsed */
        char msg[400];
        unsigned st = mem_take(r, serve_json_cost(r->body, r->len), "parsing the request body", msg, sizeof msg);
        if (st) return send_error(c, st, msg, NULL, NULL);
    }
    if (ep == 0 || ep == 1) return handle_generate(c, r, ep == 0 ? SERVE_REQ_CHAT : SERVE_REQ_COMPLETION);
    if (ep == 2 || ep == 3) return handle_tokenize(c, r, ep == 2 ? SERVE_REQ_TOKENIZE : SERVE_REQ_DETOKENIZE);
    int known_get = strcmp(url, "/health") == 0 || strcmp(url, "/metrics") == 0 || strcmp(url, "/v1/models") == 0;
    if (known_get && !get) return send_error(c, 405, "this endpoint takes GET", NULL, NULL);
    if (strcmp(url, "/health") == 0) return handle_health(c);
    if (strcmp(url, "/metrics") == 0) return handle_metrics(c);
    if (strcmp(url, "/v1/models") == 0) return handle_models(c);
    char msg[400];
    snprintf(msg, sizeof msg, "no endpoint %.200s (POST /v1/chat/completions, /v1/completions, /tokenize, "
             "/detokenize; GET /v1/models, /health, /metrics)", url);
    return send_error(c, 404, msg, NULL, NULL);
}

/* ------------------------------------------------------------ start --- */

static void parse_args(int argc, char **argv) {
    S.host = "127.0.0.1";
    S.port = 8080;
    S.n_slots = 1;
    S.max_tokens = 4096;
    S.max_body = 8 << 20;
    S.timeout = 60;
    S.queue_timeout = 60;
    S.max_queue = 64;
    S.max_conn = 128;
    S.batch = 1;
    S.sp = dhsa_session_default_params();
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(dhsa_cli_serve_usage, stdout);
            exit(0);
        }
        if (strcmp(a, "--verbose") == 0 || strcmp(a, "-v") == 0) {
            S.verbose = 1;
            continue;
        }
        if (i + 1 >= argc) dhsa_cli_die(EXIT_USAGE, "%s needs a value (or is unknown: see dhsa help serve)", a);
        const char *v = argv[++i];
        if (strcmp(a, "-m") == 0 || strcmp(a, "--model") == 0) S.model_path = dhsa_cli_model_arg(v);
        else if (strcmp(a, "--host") == 0) S.host = v;
        else if (strcmp(a, "--port") == 0) S.port = dhsa_cli_int(a, v, 0, 65535, 0);
        else if (strcmp(a, "--slots") == 0) S.n_slots = dhsa_cli_int(a, v, 1, 256, 0);
        else if (strcmp(a, "--ctx") == 0 || strcmp(a, "-c") == 0) S.sp.n_ctx = dhsa_cli_int(a, v, 1, (int64_t)1 << 31, 1);
        else if (strcmp(a, "--threads") == 0 || strcmp(a, "-t") == 0) S.threads = dhsa_cli_threads(a, v);
        else if (strcmp(a, "--mem-limit") == 0) S.sp.mem_limit = (size_t)dhsa_cli_int(a, v, 1, INT64_MAX, 1);
        else if (strcmp(a, "--density") == 0) S.sp.router.density = dhsa_cli_real(a, v, 1e-6, 1);
        else if (strcmp(a, "--template") == 0) S.template_name = v;
        else if (strcmp(a, "--max-tokens") == 0) S.max_tokens = dhsa_cli_int(a, v, 1, (int64_t)1 << 31, 1);
        else if (strcmp(a, "--max-body") == 0) S.max_body = dhsa_cli_int(a, v, 64, (int64_t)1 << 32, 1);
        else if (strcmp(a, "--timeout") == 0) S.timeout = dhsa_cli_int(a, v, 1, 86400, 0);
        else if (strcmp(a, "--queue-timeout") == 0) S.queue_timeout = dhsa_cli_int(a, v, 0, 86400, 0);
        else if (strcmp(a, "--max-queue") == 0) S.max_queue = dhsa_cli_int(a, v, 0, 1 << 20, 0);
        else if (strcmp(a, "--max-connections") == 0) S.max_conn = dhsa_cli_int(a, v, 1, 65536, 0);
        else if (strcmp(a, "--max-connections-per-ip") == 0) S.max_conn_ip = dhsa_cli_int(a, v, 0, 65536, 0);
        else if (strcmp(a, "--batch") == 0) {
            if (strcmp(v, "on") == 0) S.batch = 1;
            else if (strcmp(v, "off") == 0) S.batch = 0;
            else dhsa_cli_die(EXIT_USAGE, "--batch is on or off, not \"%s\"", v);
        }
        else if (strcmp(a, "--kv") == 0) {
            if (strcmp(v, "f32") == 0) S.sp.kv_type = DHSA_F32;
            else if (strcmp(v, "f16") == 0) S.sp.kv_type = DHSA_F16;
            else if (strcmp(v, "q8_0") == 0) S.sp.kv_type = DHSA_Q8_0;
            else dhsa_cli_die(EXIT_USAGE, "--kv is f32, f16 or q8_0, not \"%s\"", v);
        } else if (strcmp(a, "--attn") == 0) {
            dhsa_attn_method m;
            for (m = DHSA_ATTN_DENSE; m <= DHSA_ATTN_ORACLE; m++)
                if (strcmp(v, dhsa_attn_method_name(m)) == 0) break;
            if (m > DHSA_ATTN_ORACLE) dhsa_cli_die(EXIT_USAGE, "--attn is dense, dhsa, block, stream or oracle, not \"%s\"", v);
            S.sp.attn = m;
        } else dhsa_cli_die(EXIT_USAGE, "unknown option \"%s\" (see dhsa help serve)", a);
    }
    if (!S.model_path) {
        char msg[512];
        S.model_path = dhsa_cli_default_model(msg, sizeof msg);
        if (!S.model_path) dhsa_cli_die(EXIT_USAGE, "%s", msg);
        fprintf(stderr, "dhsa serve: model %s (the default; -m MODEL for another)\n", S.model_path);
    }
    if (S.n_slots == 1) S.batch = 0; /* nothing to batch with */
    if (!S.threads) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        /* batched: one core is left to the connection threads (HTTP, JSON,
         * the streams' events) and the batcher's per-token work between
         * passes; on 2 cores a second ctx thread cost more than it gave
         * (docs/server.md, docs/notes/results-serve-dist.md) */
        S.threads = cpus > 0 ? (S.batch ? cpus - 1 : cpus / S.n_slots) : 1;
        if (S.threads < 1) S.threads = 1;
    }
}

/* The memory of all slots against --mem-limit: the first session's plan
 * counts the process and one slot; each further slot adds its buffers and
 * its threads' stacks (their caches are not resident yet when the next
 * plan measures the process, so that plan would not count them). */
static void check_memory(void) {
    dhsa_mem_plan pl;
    if (dhsa_session_plan(S.slots[0].ctx, S.m, &S.sp, &pl)) dhsa_cli_die(EXIT_RUN, "memory plan: %s", dhsa_last_error());
    size_t per_slot = pl.kv_cache + pl.activations + pl.attn_workspace + pl.matmul_workspace + pl.routing + pl.stacks +
                      (pl.slack > DHSA_PLAN_HEAP_MARGIN ? pl.slack - DHSA_PLAN_HEAP_MARGIN : 0);
    size_t total = pl.total + (size_t)(S.n_slots - 1) * per_slot;
    char a[32], b[32], c2[32];
    fprintf(stderr, "dhsa serve: memory plan: %s for %lld slot%s of %lld tokens (%s each beyond the first; the weights "
            "and the process once)\n", dhsa_cli_bytes((double)total, a, sizeof a), (long long)S.n_slots,
            S.n_slots == 1 ? "" : "s", (long long)pl.n_ctx, dhsa_cli_bytes((double)per_slot, b, sizeof b));
    if (S.sp.mem_limit && total > S.sp.mem_limit)
        dhsa_cli_die(EXIT_RUN, "%lld slots need %s but --mem-limit is %s: fewer --slots, a smaller --ctx, --kv f16 or "
                     "a larger limit (one slot needs %s)", (long long)S.n_slots, dhsa_cli_bytes((double)total, a, sizeof a),
                     dhsa_cli_bytes((double)S.sp.mem_limit, c2, sizeof c2), dhsa_cli_bytes((double)pl.total, b, sizeof b));
    S.n_ctx = pl.n_ctx;
    S.sp.n_ubatch = pl.n_ubatch; /* every slot the same */
    if (!S.sp.mem_limit) return;
    /* what requests may hold at once: the limit less the plan, the
     * server's own buffers (each slot's tokens, logits, scratch and counts;
     * the batcher's rows) and an allowance per connection */
    const size_t V = (size_t)S.in->n_vocab;
    const size_t own = (size_t)S.n_slots * ((size_t)(S.n_ctx + 1) * 4 + V * 12 + (S.batch ? V * 4 + 64 : 0));
    const size_t conns = (size_t)S.max_conn * CONNECTION_ALLOWANCE;
    const size_t need = total + own + conns + ((size_t)1 << 20);
    if (need > S.sp.mem_limit)
        dhsa_cli_die(EXIT_RUN, "--mem-limit %s leaves less than 1 MiB for requests: the slots' plan is %s, the server's "
                     "buffers %s and --max-connections %lld x %s KiB: a larger limit, fewer --max-connections or --slots, "
                     "or a smaller --ctx", dhsa_cli_bytes((double)S.sp.mem_limit, a, sizeof a),
                     dhsa_cli_bytes((double)total, b, sizeof b), dhsa_cli_bytes((double)own, c2, sizeof c2),
                     (long long)S.max_conn, "64");
    S.mem_pool = S.sp.mem_limit - total - own - conns;
    fprintf(stderr, "dhsa serve: --mem-limit leaves %s for requests (bodies, parsing, tokenizing, answers: "
            "docs/server.md)\n", dhsa_cli_bytes((double)S.mem_pool, a, sizeof a));
}

/* The most bytes of text one token covers (its piece, as plain text or as
 * a special token's text): a prompt of B bytes is at least B / max_piece
 * tokens. */
static void find_max_piece(void) {
    S.max_piece = 1;
    for (int32_t id = 0; id < S.in->n_vocab; id++) {
        char piece[1024];
        int64_t a = 0, b = 0;
        if (dhsa_token_to_piece(S.tok, id, 0, piece, sizeof piece, &a)) a = (int64_t)sizeof piece;
        if (dhsa_token_to_piece(S.tok, id, DHSA_DETOKENIZE_SPECIAL, piece, sizeof piece, &b)) b = (int64_t)sizeof piece;
        if (a > S.max_piece) S.max_piece = a;
        if (b > S.max_piece) S.max_piece = b;
    }
}

static void setup(void) {
    dhsa_model_params mp = dhsa_model_default_params();
    if (dhsa_model_load(S.model_path, &mp, &S.m)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
    S.in = dhsa_model_get_info(S.m);
    S.tok = dhsa_model_tokenizer(S.m);
    const char *base = strrchr(S.model_path, '/');
    snprintf(S.model_name, sizeof S.model_name, "%s", base ? base + 1 : S.model_path);
    char *dot = strrchr(S.model_name, '.');
    if (dot && strcmp(dot, ".gguf") == 0) *dot = 0;
    S.tmpl = dhsa_cli_chat_template(dhsa_model_gguf(S.m), S.template_name, &S.tmpl_how);
    if (S.tmpl != DHSA_CHAT_NONE && dhsa_chat_stop_ids(S.tmpl, S.tok, S.chat_stop, 16, &S.n_chat_stop))
        dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
    if (S.sp.n_ctx == 0) S.sp.n_ctx = S.in->n_ctx_train;
    S.slots = calloc((size_t)S.n_slots, sizeof *S.slots);
    if (!S.slots) dhsa_cli_die(EXIT_RUN, "out of memory");
    for (int64_t i = 0; i < S.n_slots; i++) {
        dhsa_ctx_params cp = dhsa_ctx_default_params();
        cp.n_threads = (int)S.threads;
        if (S.batch && i > 0) {
            S.slots[i].ctx = S.shared_ctx;
            continue;
        }
        if (dhsa_ctx_create(&cp, &S.slots[i].ctx)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
        if (S.batch) S.shared_ctx = S.slots[i].ctx;
    }
    find_max_piece();
    if (dhsa_json_vocab_create(S.tok, &S.jvocab) || dhsa_json_schema_compile(NULL, 0, &S.json_object))
        dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
    check_memory();
    size_t V = (size_t)S.in->n_vocab;
    for (int64_t i = 0; i < S.n_slots; i++) {
        slot *sl = &S.slots[i];
        sl->id = (int)i;
        sl->tokens = malloc((size_t)(S.n_ctx + 1) * sizeof(int32_t));
        sl->logits = malloc(V * sizeof(float));
        sl->scratch = malloc(V * sizeof(float));
        sl->counts = calloc(V, sizeof(int32_t));
        if (!sl->tokens || !sl->logits || !sl->scratch || !sl->counts) dhsa_cli_die(EXIT_RUN, "out of memory");
        if (dhsa_session_create(sl->ctx, S.m, &S.sp, &sl->s)) dhsa_cli_die(EXIT_RUN, "slot %lld: %s", (long long)i, dhsa_last_error());
        sl->sp = S.sp;
    }
    if (S.batch) {
        S.batch_ss = malloc((size_t)S.n_slots * sizeof *S.batch_ss);
        S.batch_sl = malloc((size_t)S.n_slots * sizeof *S.batch_sl);
        S.batch_g = malloc((size_t)S.n_slots * sizeof *S.batch_g);
        S.batch_next = malloc((size_t)S.n_slots * sizeof *S.batch_next);
        S.batch_ids = malloc((size_t)S.n_slots * sizeof *S.batch_ids);
        S.batch_logits = malloc((size_t)S.n_slots * V * sizeof(float));
        if (!S.batch_ss || !S.batch_sl || !S.batch_g || !S.batch_next || !S.batch_ids || !S.batch_logits) dhsa_cli_die(EXIT_RUN, "out of memory");
    }
}

static void teardown(void) {
    for (int64_t i = 0; i < S.n_slots; i++) dhsa_session_free(S.slots[i].s); /* before any ctx: they may share one */
    for (int64_t i = 0; i < S.n_slots; i++) {
        slot *sl = &S.slots[i];
        if (!S.batch || i == 0) dhsa_ctx_free(sl->ctx);
        free(sl->tokens);
        free(sl->logits);
        free(sl->scratch);
        free(sl->counts);
    }
    free(S.slots);
    free(S.batch_ss);
    free(S.batch_sl);
    free(S.batch_g);
    free(S.batch_next);
    free(S.batch_ids);
    free(S.batch_logits);
    dhsa_json_vocab_free(S.jvocab);
    dhsa_json_schema_free(S.json_object);
    dhsa_model_free(S.m);
}

int dhsa_cli_serve(int argc, char **argv) {
    dhsa_cli_set_command("serve", "(see dhsa help serve)\n");
    memset(&S, 0, sizeof S);
    parse_args(argc, argv);
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)S.port);
    if (inet_pton(AF_INET, S.host, &addr.sin_addr) != 1)
        dhsa_cli_die(EXIT_USAGE, "--host %s: an IPv4 address is needed (127.0.0.1, 0.0.0.0, ...)", S.host);
    setup();
    pthread_mutex_init(&S.mu, NULL);
    pthread_mutex_init(&S.conn_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&S.cv_work, &ca);
    pthread_condattr_destroy(&ca);
    atomic_init(&S.stopping, 0);
    atomic_init(&S.id_counter, 1);
    S.started = time(NULL);
    /* the signals go to this thread's sigwait only: every thread made from
     * here on inherits the mask */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (S.batch) {
        if (pthread_create(&S.batcher, NULL, batcher_main, NULL)) dhsa_cli_die(EXIT_RUN, "cannot start the batcher thread");
        S.batcher_started = 1;
    }
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ITC | (S.verbose ? MHD_USE_ERROR_LOG : 0),
        0, on_accept, NULL, on_request,
        NULL, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)S.timeout,
        /* libmicrohttpd's own limit stops accepting (connects then hang in
         * the backlog): it is kept above ours, which on_accept applies */
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)(S.max_conn + 64), MHD_OPTION_NOTIFY_COMPLETED, request_done, NULL,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, NULL, MHD_OPTION_END);
    if (!d) dhsa_cli_die(EXIT_RUN, "cannot listen on %s:%lld: %s", S.host, (long long)S.port, strerror(errno));
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    int port = di ? (int)di->port : (int)S.port;
    fprintf(stderr, "dhsa serve: %s, %lld slot%s x %lld tokens, attention %s, %lld threads %s, chat template %s (%s)\n",
            S.model_name, (long long)S.n_slots, S.n_slots == 1 ? "" : "s", (long long)S.n_ctx,
            dhsa_attn_method_name(S.sp.attn), (long long)S.threads,
            S.batch ? "shared, decode steps batched" : "each", dhsa_chat_template_name(S.tmpl), S.tmpl_how);
    fprintf(stderr, "dhsa serve: listening on http://%s:%d\n", S.host, port);
    fflush(stderr);
    int sig = 0;
    while (sigwait(&sigs, &sig) != 0) {
    }
    fprintf(stderr, "dhsa serve: %s: stopping (a second signal stops at once)\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    fflush(stderr);
    /* A clean stop: no new connection (the listening socket stops
     * listening: connects are refused), queued requests answered 503,
     * running generations end at their next token (a stream with an error
     * event and [DONE], a whole reply with a 503), then every answer is
     * let out before the daemon closes the connections. */
    atomic_store(&S.stopping, 1);
    MHD_socket lfd = MHD_quiesce_daemon(d);
    if (lfd != MHD_INVALID_SOCKET) shutdown(lfd, SHUT_RDWR); /* closed after MHD_stop_daemon, as its manual asks */
    pthread_mutex_lock(&S.mu);
    for (waiter *w = S.q_head; w; w = w->next) pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&S.mu);
    const double drain_s = S.timeout < 30 ? (double)S.timeout : 30.0, drain_until = now_s() + drain_s;
    int64_t active = 1;
    int again = 0;
    for (;;) {
        pthread_mutex_lock(&S.mu);
        active = S.n_active;
        pthread_mutex_unlock(&S.mu);
        if (active == 0 || now_s() > drain_until) break;
        struct timespec tick = {0, 50 * 1000 * 1000};
        if (sigtimedwait(&sigs, NULL, &tick) > 0) {
            again = 1;
            break;
        }
    }
    if (active > 0)
        fprintf(stderr, "dhsa serve: %s: %lld request%s cut off\n", again ? "a second signal" : "the drain time is over",
                (long long)active, active == 1 ? "" : "s");
    else
        fprintf(stderr, "dhsa serve: every request answered (%g s at most are waited for)\n", drain_s);
    MHD_stop_daemon(d); /* joins every connection's thread */
    if (lfd != MHD_INVALID_SOCKET) close(lfd);
    if (S.batcher_started) {
        pthread_mutex_lock(&S.mu);
        S.batcher_quit = 1;
        pthread_cond_signal(&S.cv_work);
        pthread_mutex_unlock(&S.mu);
        pthread_join(S.batcher, NULL);
    }
    teardown();
    pthread_mutex_destroy(&S.mu);
    fprintf(stderr, "dhsa serve: stopped\n");
    return again ? 1 : 0;
}
#endif
