/* main.c: `dhsa serve`, an OpenAI-compatible HTTP server over one model
 * (docs/server.md): POST /v1/chat/completions and /v1/completions (JSON,
 * or server-sent events with stream: true, ending in "data: [DONE]"),
 * GET /v1/models, /health, /metrics (Prometheus text), POST /tokenize and
 * /detokenize.
 *
 * The files (docs/architecture.md, tools/serve): engine.c the slots,
 * queue, prompt cache and batcher (no HTTP, no JSON); request.c the
 * request bodies; openai.c the OpenAI mapping; http.c libmicrohttpd; this
 * file the options, the model, the memory check and the clean stop.
 *
 * HTTP is libmicrohttpd's (one thread per connection), JSON jansson's;
 * libdhsa knows neither. N slots,
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
 * (serve_mem_take), before allocating it.
 *
 * Built with DHSA_HAVE_SERVE only (the Makefile sets it when pkg-config
 * finds libmicrohttpd and jansson); otherwise `dhsa serve` refuses, naming
 * the packages. Tested by tests/test_serve_engine.c (the engine, no
 * socket), tests/test_serve.c (HTTP, load, curl) and
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

#include "server.h"

server srv;

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

/* ------------------------------------------------------------ start --- */

static void parse_args(int argc, char **argv) {
    srv.host = "127.0.0.1";
    srv.port = 8080;
    srv.n_slots = 1;
    srv.max_tokens = 4096;
    srv.max_body = 8 << 20;
    srv.timeout = 60;
    srv.queue_timeout = 60;
    srv.max_queue = 64;
    srv.max_conn = 128;
    srv.batch = 1;
    srv.sp = dhsa_session_default_params();
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(dhsa_cli_serve_usage, stdout);
            exit(0);
        }
        if (strcmp(a, "--verbose") == 0 || strcmp(a, "-v") == 0) {
            srv.verbose = 1;
            continue;
        }
        if (i + 1 >= argc) dhsa_cli_die(EXIT_USAGE, "%s needs a value (or is unknown: see dhsa help serve)", a);
        const char *v = argv[++i];
        if (strcmp(a, "-m") == 0 || strcmp(a, "--model") == 0) srv.model_path = dhsa_cli_model_arg(v);
        else if (strcmp(a, "--host") == 0) srv.host = v;
        else if (strcmp(a, "--port") == 0) srv.port = dhsa_cli_int(a, v, 0, 65535, 0);
        else if (strcmp(a, "--slots") == 0) srv.n_slots = dhsa_cli_int(a, v, 1, 256, 0);
        else if (strcmp(a, "--ctx") == 0 || strcmp(a, "-c") == 0) srv.sp.n_ctx = dhsa_cli_int(a, v, 1, (int64_t)1 << 31, 1);
        else if (strcmp(a, "--threads") == 0 || strcmp(a, "-t") == 0) srv.threads = dhsa_cli_threads(a, v);
        else if (strcmp(a, "--mem-limit") == 0) srv.sp.mem_limit = (size_t)dhsa_cli_int(a, v, 1, INT64_MAX, 1);
        else if (strcmp(a, "--density") == 0) srv.sp.router.density = dhsa_cli_real(a, v, 1e-6, 1);
        else if (strcmp(a, "--template") == 0) srv.template_name = v;
        else if (strcmp(a, "--max-tokens") == 0) srv.max_tokens = dhsa_cli_int(a, v, 1, (int64_t)1 << 31, 1);
        else if (strcmp(a, "--max-body") == 0) srv.max_body = dhsa_cli_int(a, v, 64, (int64_t)1 << 32, 1);
        else if (strcmp(a, "--timeout") == 0) srv.timeout = dhsa_cli_int(a, v, 1, 86400, 0);
        else if (strcmp(a, "--queue-timeout") == 0) srv.queue_timeout = dhsa_cli_int(a, v, 0, 86400, 0);
        else if (strcmp(a, "--max-queue") == 0) srv.max_queue = dhsa_cli_int(a, v, 0, 1 << 20, 0);
        else if (strcmp(a, "--max-connections") == 0) srv.max_conn = dhsa_cli_int(a, v, 1, 65536, 0);
        else if (strcmp(a, "--max-connections-per-ip") == 0) srv.max_conn_ip = dhsa_cli_int(a, v, 0, 65536, 0);
        else if (strcmp(a, "--batch") == 0) {
            if (strcmp(v, "on") == 0) srv.batch = 1;
            else if (strcmp(v, "off") == 0) srv.batch = 0;
            else dhsa_cli_die(EXIT_USAGE, "--batch is on or off, not \"%s\"", v);
        }
        else if (strcmp(a, "--kv") == 0) {
            if (strcmp(v, "f32") == 0) srv.sp.kv_type = DHSA_F32;
            else if (strcmp(v, "f16") == 0) srv.sp.kv_type = DHSA_F16;
            else if (strcmp(v, "q8_0") == 0) srv.sp.kv_type = DHSA_Q8_0;
            else dhsa_cli_die(EXIT_USAGE, "--kv is f32, f16 or q8_0, not \"%s\"", v);
        } else if (strcmp(a, "--attn") == 0) {
            dhsa_attn_method m;
            for (m = DHSA_ATTN_DENSE; m <= DHSA_ATTN_ORACLE; m++)
                if (strcmp(v, dhsa_attn_method_name(m)) == 0) break;
            if (m > DHSA_ATTN_ORACLE) dhsa_cli_die(EXIT_USAGE, "--attn is dense, dhsa, block, stream or oracle, not \"%s\"", v);
            srv.sp.attn = m;
        } else dhsa_cli_die(EXIT_USAGE, "unknown option \"%s\" (see dhsa help serve)", a);
    }
    if (!srv.model_path) {
        char msg[512];
        srv.model_path = dhsa_cli_default_model(msg, sizeof msg);
        if (!srv.model_path) dhsa_cli_die(EXIT_USAGE, "%s", msg);
        fprintf(stderr, "dhsa serve: model %s (the default; -m MODEL for another)\n", srv.model_path);
    }
    if (srv.n_slots == 1) srv.batch = 0; /* nothing to batch with */
    if (!srv.threads) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        /* batched: one core is left to the connection threads (HTTP, JSON,
         * the streams' events) and the batcher's per-token work between
         * passes; on 2 cores a second ctx thread cost more than it gave
         * (docs/server.md, docs/notes/results-serve-dist.md) */
        srv.threads = cpus > 0 ? (srv.batch ? cpus - 1 : cpus / srv.n_slots) : 1;
        if (srv.threads < 1) srv.threads = 1;
    }
}

/* The memory of all slots against --mem-limit: the first session's plan
 * counts the process and one slot; each further slot adds its buffers and
 * its threads' stacks (their caches are not resident yet when the next
 * plan measures the process, so that plan would not count them). */
static void check_memory(void) {
    dhsa_mem_plan pl;
    if (serve_engine_plan(srv.engine, &pl)) dhsa_cli_die(EXIT_RUN, "memory plan: %s", dhsa_last_error());
    size_t per_slot = pl.kv_cache + pl.activations + pl.attn_workspace + pl.matmul_workspace + pl.routing + pl.stacks +
                      (pl.slack > DHSA_PLAN_HEAP_MARGIN ? pl.slack - DHSA_PLAN_HEAP_MARGIN : 0);
    size_t total = pl.total + (size_t)(srv.n_slots - 1) * per_slot;
    char a[32], b[32], c2[32];
    fprintf(stderr, "dhsa serve: memory plan: %s for %lld slot%s of %lld tokens (%s each beyond the first; the weights "
            "and the process once)\n", dhsa_cli_bytes((double)total, a, sizeof a), (long long)srv.n_slots,
            srv.n_slots == 1 ? "" : "s", (long long)pl.n_ctx, dhsa_cli_bytes((double)per_slot, b, sizeof b));
    if (srv.sp.mem_limit && total > srv.sp.mem_limit)
        dhsa_cli_die(EXIT_RUN, "%lld slots need %s but --mem-limit is %s: fewer --slots, a smaller --ctx, --kv f16 or "
                     "a larger limit (one slot needs %s)", (long long)srv.n_slots, dhsa_cli_bytes((double)total, a, sizeof a),
                     dhsa_cli_bytes((double)srv.sp.mem_limit, c2, sizeof c2), dhsa_cli_bytes((double)pl.total, b, sizeof b));
    srv.n_ctx = pl.n_ctx;
    srv.sp.n_ubatch = pl.n_ubatch; /* every slot the same */
    if (!srv.sp.mem_limit) return;
    /* what requests may hold at once: the limit less the plan, the
     * server's own buffers (each slot's tokens, logits, scratch and counts;
     * the batcher's rows) and an allowance per connection */
    const size_t V = (size_t)srv.in->n_vocab;
    const size_t own = (size_t)srv.n_slots * ((size_t)(srv.n_ctx + 1) * 4 + V * 12 + (srv.batch ? V * 4 + 64 : 0));
    const size_t conns = (size_t)srv.max_conn * CONNECTION_ALLOWANCE;
    const size_t need = total + own + conns + ((size_t)1 << 20);
    if (need > srv.sp.mem_limit)
        dhsa_cli_die(EXIT_RUN, "--mem-limit %s leaves less than 1 MiB for requests: the slots' plan is %s, the server's "
                     "buffers %s and --max-connections %lld x %s KiB: a larger limit, fewer --max-connections or --slots, "
                     "or a smaller --ctx", dhsa_cli_bytes((double)srv.sp.mem_limit, a, sizeof a),
                     dhsa_cli_bytes((double)total, b, sizeof b), dhsa_cli_bytes((double)own, c2, sizeof c2),
                     (long long)srv.max_conn, "64");
    srv.mem_pool = srv.sp.mem_limit - total - own - conns;
    fprintf(stderr, "dhsa serve: --mem-limit leaves %s for requests (bodies, parsing, tokenizing, answers: "
            "docs/server.md)\n", dhsa_cli_bytes((double)srv.mem_pool, a, sizeof a));
}

/* The most bytes of text one token covers (its piece, as plain text or as
 * a special token's text): a prompt of B bytes is at least B / max_piece
 * tokens. */
static void find_max_piece(void) {
    srv.max_piece = 1;
    for (int32_t id = 0; id < srv.in->n_vocab; id++) {
        char piece[1024];
        int64_t a = 0, b = 0;
        if (dhsa_token_to_piece(srv.tok, id, 0, piece, sizeof piece, &a)) a = (int64_t)sizeof piece;
        if (dhsa_token_to_piece(srv.tok, id, DHSA_DETOKENIZE_SPECIAL, piece, sizeof piece, &b)) b = (int64_t)sizeof piece;
        if (a > srv.max_piece) srv.max_piece = a;
        if (b > srv.max_piece) srv.max_piece = b;
    }
}

static void setup(void) {
    dhsa_model_params mp = dhsa_model_default_params();
    if (dhsa_model_load(srv.model_path, &mp, &srv.m)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
    srv.in = dhsa_model_get_info(srv.m);
    srv.tok = dhsa_model_tokenizer(srv.m);
    const char *base = strrchr(srv.model_path, '/');
    snprintf(srv.model_name, sizeof srv.model_name, "%s", base ? base + 1 : srv.model_path);
    char *dot = strrchr(srv.model_name, '.');
    if (dot && strcmp(dot, ".gguf") == 0) *dot = 0;
    srv.tmpl = dhsa_cli_chat_template(dhsa_model_gguf(srv.m), srv.template_name, &srv.tmpl_how);
    if (srv.tmpl != DHSA_CHAT_NONE && dhsa_chat_stop_ids(srv.tmpl, srv.tok, srv.chat_stop, 16, &srv.n_chat_stop))
        dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
    if (srv.sp.n_ctx == 0) srv.sp.n_ctx = srv.in->n_ctx_train;
    serve_engine_params ep = {srv.n_slots, srv.batch, (int)srv.threads, srv.sp, srv.max_queue, (double)srv.queue_timeout};
    char msg[600];
    if (serve_engine_create(srv.m, &ep, &srv.engine, msg, sizeof msg)) dhsa_cli_die(EXIT_RUN, "%s", msg);
    find_max_piece();
    check_memory();
    if (serve_engine_open(srv.engine, &srv.sp, msg, sizeof msg)) dhsa_cli_die(EXIT_RUN, "%s", msg);
}

static void teardown(void) {
    serve_engine_free(srv.engine);
    srv.engine = NULL;
    dhsa_model_free(srv.m);
}

int dhsa_cli_serve(int argc, char **argv) {
    dhsa_cli_set_command("serve", "(see dhsa help serve)\n");
    memset(&srv, 0, sizeof srv);
    parse_args(argc, argv);
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)srv.port);
    if (inet_pton(AF_INET, srv.host, &addr.sin_addr) != 1)
        dhsa_cli_die(EXIT_USAGE, "--host %s: an IPv4 address is needed (127.0.0.1, 0.0.0.0, ...)", srv.host);
    setup();
    pthread_mutex_init(&srv.mu, NULL);
    pthread_mutex_init(&srv.conn_mu, NULL);
    atomic_init(&srv.stopping, 0);
    atomic_init(&srv.id_counter, 1);
    srv.started = time(NULL);
    /* the signals go to this thread's sigwait only: every thread made from
     * here on inherits the mask */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    char msg[200];
    if (serve_engine_start(srv.engine, msg, sizeof msg)) dhsa_cli_die(EXIT_RUN, "%s", msg);
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ITC | (srv.verbose ? MHD_USE_ERROR_LOG : 0),
        0, serve_on_accept, NULL, serve_on_request,
        NULL, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)srv.timeout,
        /* libmicrohttpd's own limit stops accepting (connects then hang in
         * the backlog): it is kept above ours, which serve_on_accept applies */
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)(srv.max_conn + 64), MHD_OPTION_NOTIFY_COMPLETED, serve_request_done, NULL,
        MHD_OPTION_NOTIFY_CONNECTION, serve_on_connection, NULL, MHD_OPTION_END);
    if (!d) dhsa_cli_die(EXIT_RUN, "cannot listen on %s:%lld: %s", srv.host, (long long)srv.port, strerror(errno));
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    int port = di ? (int)di->port : (int)srv.port;
    fprintf(stderr, "dhsa serve: %s, %lld slot%s x %lld tokens, attention %s, %lld threads %s, chat template %s (%s)\n",
            srv.model_name, (long long)srv.n_slots, srv.n_slots == 1 ? "" : "s", (long long)srv.n_ctx,
            dhsa_attn_method_name(srv.sp.attn), (long long)srv.threads,
            srv.batch ? "shared, decode steps batched" : "each", dhsa_chat_template_name(srv.tmpl), srv.tmpl_how);
    fprintf(stderr, "dhsa serve: listening on http://%s:%d\n", srv.host, port);
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
    atomic_store(&srv.stopping, 1);
    MHD_socket lfd = MHD_quiesce_daemon(d);
    if (lfd != MHD_INVALID_SOCKET) shutdown(lfd, SHUT_RDWR); /* closed after MHD_stop_daemon, as its manual asks */
    serve_engine_stop(srv.engine); /* queued requests leave (503), running ones end at their next token */
    const double drain_s = srv.timeout < 30 ? (double)srv.timeout : 30.0, drain_until = serve_now_s() + drain_s;
    int64_t active = 1;
    int again = 0;
    for (;;) {
        pthread_mutex_lock(&srv.mu);
        active = srv.n_active;
        pthread_mutex_unlock(&srv.mu);
        if (active == 0 || serve_now_s() > drain_until) break;
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
    teardown();
    pthread_mutex_destroy(&srv.mu);
    fprintf(stderr, "dhsa serve: stopped\n");
    return again ? 1 : 0;
}
#endif

