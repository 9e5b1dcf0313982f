/* test_serve.c: `dhsa serve` (tools/serve/, docs/server.md).
 *
 * Part 1, the request parser (tools/serve/request.c) without a socket: a table
 * of good bodies and what they parse to, and bad ones with the parameter
 * the 400 must name.
 * Part 2, the server over loopback, started from the built CLI on a free
 * port with the default model: health, models, tokenize / detokenize
 * round trip, greedy completions equal to `dhsa run --temp 0` (the first
 * time, and again from the prompt cache, and for a prompt that shares only
 * a prefix with the cache), streaming (SSE chunks, finish_reason, usage,
 * "data: [DONE]"), stop strings, chat, ignore_eos (a reply that meets EOS
 * runs to max_tokens, its text the library's greedy continuation with
 * EOS's logit -Inf), errors (malformed JSON, unknown
 * parameter, n > 1, too long a prompt, body over --max-body, 404, 405,
 * malformed HTTP), a client that disconnects mid-stream frees its slot,
 * curl as the client, a bounded load test (8 clients x 20 requests, mixed
 * lengths, every fifth one disconnecting early: no failed request, no
 * busy slot after, RSS within 5% of before; the slots' decode steps
 * batched, and two concurrent greedy requests each giving dhsa run's
 * text; seeded requests with penalties, streams and a stop string giving
 * the same text alone and all at once), --mem-limit refusing too
 * many slots, and SIGTERM during a stream stopping the server cleanly.
 * Part 3, nothing leaks between clients (issue 34), on --slots 1, 4
 * (batched) and 3 (--batch off): every form of an empty prompt right after
 * another client's request is a 400 (it was sampled from that request's
 * logits), and 24 concurrent clients with their own secrets, sharing a
 * cached prefix, never see another's.
 * Part 4, --mem-limit (skipped under sanitizers): serve_json_cost bounds
 * jansson's allocations for seven shapes of body; 8 concurrent 7 MB
 * bodies under --mem-limit 64M leave the server's VmHWM under 64 MiB,
 * each answered 4xx / 503; a 1 TiB Content-Length is a 413 unread.
 * Part 5, a clean stop: SIGTERM during 5 streams and 3 queued requests
 * (error event + [DONE] each, 503 each, exit 0, connects refused), and a
 * second signal ending the drain at once.
 * Part 6, connections: idle ones beyond --max-connections (and
 * --max-connections-per-ip) do not lock a client out; a running stream is
 * never the one closed.
 * Without libmicrohttpd and jansson both parts skip (saying so) and the
 * test checks that `dhsa serve` refuses, naming the packages.
 *
 * Run: make build/tests/test_serve && DHSA_CLI=build/dhsa build/tests/test_serve
 * (from the repository root). Ends with "test_serve: P passed, F failed, S skipped".
 */
#include "dhsa.h"
#include "t.h"
#include "cli_run.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* seconds, monotonic (the tests do not link tools/cli_base.c) */
static double dhsa_cli_now_test(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define N_PARSER_CHECKS 68
#define N_HTTP_CHECKS 67
#define N_LEAK_CHECKS 15 /* 5 per server */
#define N_MEM_CHECKS 6
#define N_STOP_CHECKS 5
#define N_CONN_CHECKS 4

#ifdef DHSA_HAVE_SERVE
#include "serve.h"

#include <jansson.h>
#include <microhttpd.h>

/* ------------------------------------------------------------ parser --- */

static int parses(serve_req_kind k, const char *body, serve_request *r) {
    serve_limits lim = {1000, 100, 2048};
    serve_error e;
    int rc = serve_request_parse(k, body, strlen(body), &lim, r, &e);
    if (rc) fprintf(stderr, "  parse error: %s (param %s)\n", e.message, e.param);
    return rc == 0;
}

/* 1 when body is refused naming param. */
static int refused(serve_req_kind k, const char *body, const char *param) {
    serve_limits lim = {1000, 100, 2048};
    serve_request r;
    serve_error e;
    int rc = serve_request_parse(k, body, strlen(body), &lim, &r, &e);
    serve_request_free(&r);
    if (rc == 0) {
        fprintf(stderr, "  accepted: %s\n", body);
        return 0;
    }
    if (strcmp(e.param, param) != 0 || !e.message[0]) {
        fprintf(stderr, "  %s: param \"%s\" (want \"%s\"): %s\n", body, e.param, param, e.message);
        return 0;
    }
    return 1;
}

static void test_parser(void) {
    serve_request r;
    T_CHECK(parses(SERVE_REQ_CHAT, "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                   "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"He\"},{\"type\":\"text\",\"text\":\"llo\"}]}],"
                   "\"model\":\"x\",\"stream\":true,\"stream_options\":{\"include_usage\":true},\"max_tokens\":7,"
                   "\"temperature\":0,\"top_p\":0.5,\"top_k\":3,\"min_p\":0.1,\"seed\":-5,\"stop\":[\"a\",\"bc\"],"
                   "\"presence_penalty\":0.5,\"frequency_penalty\":-1,\"repeat_penalty\":1.1,\"attn\":\"dhsa\","
                   "\"density\":0.125,\"n\":1,\"logprobs\":false,\"user\":\"u\"}", &r),
            "a full chat request parses");
    T_CHECK(r.n_messages == 2 && strcmp(r.messages[0].role, "system") == 0 && strcmp(r.messages[1].content, "Hello") == 0,
            "messages: roles and joined text parts");
    T_CHECK(r.stream == 1 && r.include_usage == 1 && r.max_tokens == 7, "stream, include_usage, max_tokens");
    T_CHECK(r.temperature == 0 && r.top_p == 0.5 && r.top_k == 3 && r.min_p == 0.1 && r.repeat_penalty == 1.1,
            "sampling parameters");
    T_CHECK(r.seed_set && r.seed == (uint64_t)(int64_t)-5, "seed");
    T_CHECK(r.n_stop == 2 && strcmp(r.stop[1], "bc") == 0 && r.stop_len[1] == 2, "stop strings");
    T_CHECK(r.presence_penalty == 0.5 && r.frequency_penalty == -1, "penalties");
    T_CHECK(r.attn == DHSA_ATTN_DHSA && r.density == 0.125 && strcmp(r.model, "x") == 0, "attn, density, model");
    serve_request_free(&r);
    T_CHECK(parses(SERVE_REQ_COMPLETION, "{\"prompt\":\"Once\"}", &r), "a minimal completion parses");
    dhsa_sampler_params sp = dhsa_sampler_default_params();
    T_CHECK(r.text_len == 4 && !r.has_ids && r.max_tokens == -1 && !r.stream && !r.seed_set &&
                r.temperature == sp.temperature && r.top_k == sp.top_k && r.attn == SERVE_ATTN_UNSET && !r.ignore_eos,
            "defaults: the CLI's sampling, no max_tokens, no stream, no seed, EOS stops");
    serve_request_free(&r);
    T_CHECK(parses(SERVE_REQ_COMPLETION, "{\"prompt\":\"Once\",\"ignore_eos\":true}", &r) && r.ignore_eos == 1,
            "ignore_eos: true");
    serve_request_free(&r);
    T_CHECK(parses(SERVE_REQ_COMPLETION, "{\"prompt\":[[1,2,3]],\"stop\":\"x\"}", &r) && r.has_ids && r.n_ids == 3 &&
                r.ids[2] == 3 && r.n_stop == 1,
            "a prompt of ids in an array, one stop string");
    serve_request_free(&r);
    T_CHECK(parses(SERVE_REQ_COMPLETION, "{\"prompt\":[\"ab\"],\"max_tokens\":2.0}", &r) && r.text_len == 2 &&
                r.max_tokens == 2,
            "a prompt in an array; an integral real as an integer");
    serve_request_free(&r);
    T_CHECK(parses(SERVE_REQ_TOKENIZE, "{\"content\":\"abc\",\"add_special\":false,\"with_pieces\":true}", &r) &&
                r.text_len == 3 && !r.add_special && r.with_pieces,
            "tokenize");
    serve_request_free(&r);
    T_CHECK(parses(SERVE_REQ_DETOKENIZE, "{\"tokens\":[5,6]}", &r) && r.n_ids == 2 && r.ids[1] == 6, "detokenize");
    serve_request_free(&r);
    /* refused, naming the parameter */
    T_CHECK(refused(SERVE_REQ_CHAT, "{bad", ""), "malformed JSON");
    T_CHECK(refused(SERVE_REQ_CHAT, "[1]", ""), "not an object");
    T_CHECK(refused(SERVE_REQ_CHAT, "", ""), "an empty body");
    T_CHECK(refused(SERVE_REQ_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"temperature\":1,\"temperature\":2}", ""),
            "a duplicate key");
    T_CHECK(refused(SERVE_REQ_CHAT, "{}", "messages"), "chat without messages");
    T_CHECK(refused(SERVE_REQ_CHAT, "{\"messages\":[]}", "messages"), "no messages");
    T_CHECK(refused(SERVE_REQ_CHAT, "{\"messages\":[{\"role\":\"tool\",\"content\":\"a\"}]}", "messages"), "a tool role");
    T_CHECK(refused(SERVE_REQ_CHAT, "{\"messages\":[{\"role\":\"user\"}]}", "messages"), "a message without content");
    T_CHECK(refused(SERVE_REQ_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\",\"name\":\"b\"}]}", "messages"),
            "a message with a name");
    T_CHECK(refused(SERVE_REQ_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", "messages"),
            "an image part");
    const char *m = "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],";
    char b[512];
#define BAD(field, param, what)                                           \
    do {                                                                  \
        snprintf(b, sizeof b, "%s%s}", m, field);                         \
        T_CHECK(refused(SERVE_REQ_CHAT, b, param), "%s", what);           \
    } while (0)
    BAD("\"temperature\":2.5", "temperature", "temperature above 2");
    BAD("\"temperature\":\"hot\"", "temperature", "temperature not a number");
    BAD("\"top_p\":0", "top_p", "top_p 0");
    BAD("\"top_k\":-1", "top_k", "top_k negative");
    BAD("\"max_tokens\":1001", "max_tokens", "max_tokens above the server's limit");
    BAD("\"max_tokens\":1.5", "max_tokens", "max_tokens not an integer");
    BAD("\"presence_penalty\":3", "presence_penalty", "presence_penalty above 2");
    BAD("\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]", "stop", "five stop strings");
    BAD("\"stop\":\"\"", "stop", "an empty stop string");
    BAD("\"stream\":1", "stream", "stream not a boolean");
    BAD("\"ignore_eos\":1", "ignore_eos", "ignore_eos not a boolean");
    BAD("\"ignore_eos\":\"true\"", "ignore_eos", "ignore_eos a string");
    BAD("\"stream_options\":{\"include_usage\":true}", "stream_options", "stream_options without stream");
    BAD("\"n\":2", "n", "n = 2");
    BAD("\"logprobs\":true", "logprobs", "logprobs");
    BAD("\"tools\":[{\"type\":\"function\"}]", "tools", "tools");
    BAD("\"response_format\":{\"type\":\"xml\"}", "response_format", "an unknown response_format type");
    BAD("\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\"}}", "response_format",
        "json_schema without its schema");
    BAD("\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":{\"type\":"
        "\"string\",\"pattern\":\"a\"}}}", "response_format", "a schema keyword outside the subset");
    BAD("\"response_format\":{\"type\":\"json_object\"},\"stop\":\"x\"", "stop", "a stop string with JSON");
    {
        serve_limits lim = {1000, 100, 2048};
        serve_error e;
        snprintf(b, sizeof b, "%s\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":"
                 "{\"properties\":{\"d\":{\"format\":\"date\"}}}}}}", m);
        int rc = serve_request_parse(SERVE_REQ_CHAT, b, strlen(b), &lim, &r, &e);
        serve_request_free(&r);
        T_CHECK(rc != 0 && strstr(e.message, "\"format\"") && strstr(e.message, "/properties/d"),
                "the 400 names the keyword and where: %s", e.message);
    }
    T_CHECK(parses(SERVE_REQ_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"response_format\":"
                   "{\"type\":\"json_object\"}}", &r) && r.json && !r.json_schema, "json_object");
    serve_request_free(&r);
    T_CHECK(parses(SERVE_REQ_COMPLETION, "{\"prompt\":\"a\",\"response_format\":{\"type\":\"json_schema\","
                   "\"json_schema\":{\"name\":\"n\",\"strict\":true,\"schema\":{\"type\":\"object\",\"properties\":"
                   "{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}}}}", &r) && r.json && r.json_schema,
            "json_schema");
    serve_request_free(&r);
    BAD("\"attn\":\"sparse\"", "attn", "an unknown attention method");
    BAD("\"density\":2", "density", "density above 1");
    BAD("\"frobnicate\":1", "frobnicate", "an unknown parameter");
#undef BAD
    T_CHECK(refused(SERVE_REQ_COMPLETION, "{\"prompt\":[\"a\",\"b\"]}", "prompt"), "two prompts");
    T_CHECK(refused(SERVE_REQ_COMPLETION, "{\"prompt\":[1,2048]}", "prompt"), "an id outside the vocabulary");
    T_CHECK(refused(SERVE_REQ_DETOKENIZE, "{\"tokens\":[-1]}", "tokens"), "a negative id");
    char *big = malloc(100 * 3 + 64);
    if (big) {
        int k = sprintf(big, "{\"tokens\":[");
        for (int i = 0; i < 101; i++) k += sprintf(big + k, "%s1", i ? "," : "");
        sprintf(big + k, "]}");
    }
    T_CHECK(big && refused(SERVE_REQ_DETOKENIZE, big, "tokens"), "more ids than the limit");
    free(big);
    /* no prompt of the request's own (issue 34: [[]] was sampled from the
     * slot's stale logits) */
    static const char *const empty[] = {"\"\"", "[]", "[[]]", "[\"\"]"};
    for (int i = 0; i < 4; i++) {
        snprintf(b, sizeof b, "{\"prompt\":%s,\"max_tokens\":5}", empty[i]);
        T_CHECK(refused(SERVE_REQ_COMPLETION, b, "prompt"), "an empty prompt %s", empty[i]);
    }
    T_CHECK(refused(SERVE_REQ_CHAT, "{\"messages\":[{\"role\":\"system\",\"content\":\"\"},{\"role\":\"user\","
                    "\"content\":[]}]}", "messages"),
            "messages that are all empty");
    T_CHECK(parses(SERVE_REQ_CHAT, "{\"messages\":[{\"role\":\"system\",\"content\":\"\"},{\"role\":\"user\","
                   "\"content\":\"a\"}]}", &r),
            "an empty system message with a user message parses");
    serve_request_free(&r);
}

/* serve_json_cost against what jansson allocates: its peak of live bytes
 * (each block counted with 16 bytes of the allocator's header) while
 * serve_request_parse runs, through json_set_alloc_funcs, for bodies of
 * every shape (a long string, escapes, many ids, many keys, nested
 * containers, many messages): the cost must bound it, and not by more
 * than 8x on the long string (a bound that refuses everything is no
 * bound). */
static size_t g_live, g_peak;
static void *count_malloc(size_t n) {
    size_t *p = malloc(n + 16);
    if (!p) return NULL;
    p[0] = n;
    g_live += n + 16;
    if (g_live > g_peak) g_peak = g_live;
    return (char *)p + 16;
}
static void count_free(void *q) {
    if (!q) return;
    size_t *p = (size_t *)((char *)q - 16);
    g_live -= p[0] + 16;
    free(p);
}

static void test_json_cost(void) {
    enum { N = 7 };
    char *body[N];
    size_t len[N];
    serve_req_kind kind[N] = {SERVE_REQ_TOKENIZE, SERVE_REQ_TOKENIZE, SERVE_REQ_COMPLETION, SERVE_REQ_COMPLETION,
                              SERVE_REQ_COMPLETION, SERVE_REQ_CHAT, SERVE_REQ_DETOKENIZE};
    const char *what[N] = {"a 200 KB string", "2000 \\u escapes", "20000 ids", "5000 keys", "nested [[{}]] x 3000",
                           "1000 messages", "[1,[2,[3,...]]] deep"};
    for (int i = 0; i < N; i++) {
        body[i] = malloc(1 << 20);
        size_t k = 0;
        char *b = body[i];
        if (!b) continue;
        switch (i) {
        case 0:
            k = (size_t)sprintf(b, "{\"content\":\"");
            memset(b + k, 'a', 200000);
            k += 200000;
            k += (size_t)sprintf(b + k, "\"}");
            break;
        case 1:
            k = (size_t)sprintf(b, "{\"content\":\"");
            for (int j = 0; j < 2000; j++) k += (size_t)sprintf(b + k, "\\u00e9\\n");
            k += (size_t)sprintf(b + k, "\"}");
            break;
        case 2:
            k = (size_t)sprintf(b, "{\"prompt\":[");
            for (int j = 0; j < 20000; j++) k += (size_t)sprintf(b + k, "%s7", j ? "," : "");
            k += (size_t)sprintf(b + k, "]}");
            break;
        case 3:
            k = (size_t)sprintf(b, "{\"prompt\":\"a\",\"x\":{");
            for (int j = 0; j < 5000; j++) k += (size_t)sprintf(b + k, "%s\"k%d\":%d", j ? "," : "", j, j);
            k += (size_t)sprintf(b + k, "}}");
            break;
        case 4:
            k = (size_t)sprintf(b, "{\"prompt\":\"a\",\"x\":[");
            for (int j = 0; j < 3000; j++) k += (size_t)sprintf(b + k, "%s[[{}]]", j ? "," : "");
            k += (size_t)sprintf(b + k, "]}");
            break;
        case 5:
            k = (size_t)sprintf(b, "{\"messages\":[");
            for (int j = 0; j < 1000; j++)
                k += (size_t)sprintf(b + k, "%s{\"role\":\"user\",\"content\":\"message %d\"}", j ? "," : "", j);
            k += (size_t)sprintf(b + k, "]}");
            break;
        default:
            k = (size_t)sprintf(b, "{\"tokens\":");
            for (int j = 0; j < 1000; j++) k += (size_t)sprintf(b + k, "[%d,", j);
            for (int j = 0; j < 1000; j++) k += (size_t)sprintf(b + k, "1]");
            k += (size_t)sprintf(b + k, "}");
        }
        len[i] = k;
    }
    json_set_alloc_funcs(count_malloc, count_free);
    for (int i = 0; i < N; i++) {
        if (!body[i]) {
            T_CHECK(0, "out of memory for a body");
            continue;
        }
        serve_limits lim = {1000, 100000, 2048};
        serve_request r;
        serve_error e;
        g_live = g_peak = 0;
        serve_request_parse(kind[i], body[i], len[i], &lim, &r, &e);
        serve_request_free(&r);
        size_t cost = serve_json_cost(body[i], len[i]);
        T_CHECK(g_peak > 0 && cost >= g_peak && (i != 0 || cost <= 8 * g_peak),
                "serve_json_cost bounds jansson's peak for %s (%zu bytes): cost %zu, peak %zu (%.2fx)", what[i], len[i],
                cost, g_peak, (double)cost / (double)(g_peak ? g_peak : 1));
        free(body[i]);
    }
    json_set_alloc_funcs(malloc, free);
}

/* ------------------------------------------------------------ client --- */

static int g_port;

static int connect_server(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)g_port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {60, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int send_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Decodes a chunked body in place (the headers stay); a truncated last
 * chunk keeps what came. */
static void dechunk(char *resp) {
    char *b = strstr(resp, "\r\n\r\n");
    if (!b || !strstr(resp, "Transfer-Encoding: chunked") || strstr(resp, "Transfer-Encoding: chunked") > b) return;
    b += 4;
    char *w = b, *r = b;
    for (;;) {
        char *end;
        unsigned long len = strtoul(r, &end, 16);
        if (end == r || strncmp(end, "\r\n", 2) != 0 || len == 0) break;
        r = end + 2;
        size_t have = strlen(r);
        if (len > have) len = have;
        memmove(w, r, len);
        w += len;
        r += len;
        if (strncmp(r, "\r\n", 2) != 0) break;
        r += 2;
    }
    *w = 0;
}

/* One request with Connection: close; returns the status (-1 on a socket
 * error) and the whole response (headers and body) in *out (caller frees).
 * With stop_after > 0, closes the socket once that many bytes came. */
static int http_raw(const char *req, size_t req_len, char **out, size_t stop_after) {
    *out = NULL;
    int fd = connect_server();
    if (fd < 0) return -1;
    if (send_all(fd, req, req_len)) {
        close(fd);
        return -1;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!buf) {
        close(fd);
        return -1;
    }
    for (;;) {
        if (cap - n < 4096) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) break;
            buf = nb;
            cap *= 2;
        }
        ssize_t r = recv(fd, buf + n, cap - n - 1, 0);
        if (r <= 0) break;
        n += (size_t)r;
        if (stop_after && n >= stop_after) break;
    }
    close(fd);
    buf[n] = 0;
    dechunk(buf);
    *out = buf;
    int code = -1;
    if (sscanf(buf, "HTTP/1.%*d %d", &code) != 1) code = -1;
    return code;
}

static int http(const char *method, const char *path, const char *body, char **out) {
    size_t bl = body ? strlen(body) : 0;
    char *req = malloc(bl + 512);
    if (!req) return -1;
    int k = snprintf(req, 512, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n", method, path, bl);
    if (body) memcpy(req + k, body, bl);
    int code = http_raw(req, (size_t)k + bl, out, 0);
    free(req);
    return code;
}

static const char *body_of(const char *resp) {
    const char *b = resp ? strstr(resp, "\r\n\r\n") : NULL;
    return b ? b + 4 : "";
}

/* The string value of "key":"..." in s (first one), unescaped for the
 * simple escapes; "" when absent. */
static void json_str(const char *s, const char *key, char *out, size_t cap) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":\"", key);
    const char *p = s ? strstr(s, pat) : NULL;
    size_t k = 0;
    if (p)
        for (p += strlen(pat); *p && *p != '"' && k + 1 < cap; p++) {
            if (*p == '\\' && p[1]) {
                p++;
                out[k++] = *p == 'n' ? '\n' : *p == 't' ? '\t' : *p;
            } else {
                out[k++] = *p;
            }
        }
    out[k] = 0;
}

static long json_int(const char *s, const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = s ? strstr(s, pat) : NULL;
    return p ? strtol(p + strlen(pat), NULL, 10) : -1;
}

/* The concatenated "text" (or "content") of every SSE data line. */
static void sse_text(const char *resp, const char *key, char *out, size_t cap) {
    size_t k = 0;
    out[0] = 0;
    for (const char *p = strstr(body_of(resp), "data: {"); p; p = strstr(p + 1, "data: {")) {
        char piece[1024];
        const char *end = strstr(p, "\n\n");
        size_t n = end ? (size_t)(end - p) : strlen(p);
        char *line = malloc(n + 1);
        if (!line) return;
        memcpy(line, p, n);
        line[n] = 0;
        json_str(line, key, piece, sizeof piece);
        free(line);
        size_t pl = strlen(piece);
        if (k + pl + 1 < cap) {
            memcpy(out + k, piece, pl + 1);
            k += pl;
        }
    }
}

/* ------------------------------------------------------------ server --- */

static pid_t g_pid;
static char g_log[64];

/* Starts `dhsa serve ARGS --port 0` with its stderr in a file; waits for
 * "listening on http://127.0.0.1:PORT". Returns 0 or -1. */
static int start_server(const char *args) {
    const char *cli = getenv("DHSA_CLI");
    if (!cli) return -1;
    snprintf(g_log, sizeof g_log, "/tmp/dhsa_test_serve_%d.log", (int)getpid());
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "exec '%s' serve %s --port 0 2>'%s' >/dev/null", cli, args, g_log);
    g_pid = fork();
    if (g_pid < 0) return -1;
    if (g_pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 600; i++) { /* 60 s */
        usleep(100000);
        FILE *f = fopen(g_log, "r");
        char line[512];
        while (f && fgets(line, sizeof line, f)) {
            const char *p = strstr(line, "listening on http://127.0.0.1:");
            if (p) {
                g_port = atoi(p + strlen("listening on http://127.0.0.1:"));
                fclose(f);
                return g_port > 0 ? 0 : -1;
            }
        }
        if (f) fclose(f);
        int st;
        if (waitpid(g_pid, &st, WNOHANG) == g_pid) {
            g_pid = 0;
            return -1;
        }
    }
    return -1;
}

/* SIGTERM, then waits up to secs; returns the exit status (-1: killed or hung). */
static int stop_server(int secs) {
    if (g_pid <= 0) return -1;
    kill(g_pid, SIGTERM);
    for (int i = 0; i < secs * 10; i++) {
        int st;
        if (waitpid(g_pid, &st, WNOHANG) == g_pid) {
            g_pid = 0;
            return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        }
        usleep(100000);
    }
    kill(g_pid, SIGKILL);
    waitpid(g_pid, NULL, 0);
    g_pid = 0;
    return -1;
}

static long slots_busy(void) {
    char *r;
    int code = http("GET", "/health", NULL, &r);
    long b = code == 200 ? json_int(body_of(r), "slots_busy") : -1;
    free(r);
    return b;
}

static double metric(const char *name) {
    char *r;
    double v = -1;
    if (http("GET", "/metrics", NULL, &r) == 200) {
        char pat[96];
        snprintf(pat, sizeof pat, "\n%s ", name);
        const char *p = strstr(r, pat);
        if (p) v = strtod(p + strlen(pat), NULL);
    }
    free(r);
    return v;
}

/* The greedy continuation of `dhsa run` for a prompt (its text, without
 * the final newline), into out. */
static int cli_greedy(const char *prompt, int n, char *out, size_t cap) {
    char args[1024], *o = NULL;
    snprintf(args, sizeof args, "run -p '%s' -n %d --temp 0 --no-echo --ctx 512", prompt, n);
    int rc = cli_run(args, 1, &o);
    snprintf(out, cap, "%s", o ? o : "");
    size_t l = strlen(out);
    if (l && out[l - 1] == '\n') out[l - 1] = 0;
    free(o);
    return rc;
}

#define PK "The pass key is 40913. Remember it. 40913 is the pass key. What is the pass key? The pass key is"
#define PK2 "The pass key is 40913. Remember it. 40913 is the pass key. What is the key? The key is"

typedef struct {
    int id, failed, disconnected;
    int n; /* requests (0: 20) */
} load_arg;

static void *load_client(void *p) {
    load_arg *a = p;
    for (int i = 0; i < (a->n ? a->n : 20); i++) {
        int k = a->id * 20 + i;
        char body[512], *r = NULL;
        int stream = k % 3 == 0, drop = k % 5 == 4;
        snprintf(body, sizeof body, "{\"prompt\":\"%s %d\",\"max_tokens\":%d,\"temperature\":0.7,\"seed\":%d%s}",
                 k % 2 ? PK : "Once upon a time", k, drop ? 200 : 1 + k % 16, k, stream || drop ? ",\"stream\":true" : "");
        if (drop) {
            char req[1024];
            int n = snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n%s",
                             strlen(body), body);
            http_raw(req, (size_t)n, &r, 400); /* the headers and a chunk or so, then away */
            a->disconnected++;
        } else {
            int code = http("POST", "/v1/completions", body, &r);
            int ok = code == 200 && (stream ? strstr(r, "data: [DONE]") != NULL : strstr(r, "\"usage\"") != NULL);
            if (!ok) {
                a->failed++;
                fprintf(stderr, "  load: request %d: %d %.200s\n", k, code, r ? body_of(r) : "");
            }
        }
        free(r);
    }
    return NULL;
}

typedef struct {
    const char *want;
    int ok;
} greedy_arg;

static void *greedy_client(void *p) {
    greedy_arg *a = p;
    char *r = NULL, text[4096];
    int code = http("POST", "/v1/completions", "{\"prompt\":\"" PK "\",\"max_tokens\":8,\"temperature\":0}", &r);
    json_str(body_of(r), "text", text, sizeof text);
    a->ok = code == 200 && strcmp(text, a->want) == 0;
    if (!a->ok) fprintf(stderr, "  concurrent greedy: %d \"%s\" (want \"%s\")\n", code, text, a->want);
    free(r);
    return NULL;
}

/* One completion on its own thread: its text (the concatenated events'
 * when streamed) and finish_reason. */
typedef struct {
    char body[512];
    int stream, code;
    char text[2048], finish[32];
} req_arg;

static void *req_client(void *p) {
    req_arg *a = p;
    char *r = NULL;
    a->code = http("POST", "/v1/completions", a->body, &r);
    if (a->stream) sse_text(r, "text", a->text, sizeof a->text);
    else json_str(body_of(r), "text", a->text, sizeof a->text);
    const char *f = r ? strstr(body_of(r), "\"finish_reason\":\"") : NULL;
    snprintf(a->finish, sizeof a->finish, "%s", "");
    if (f) sscanf(f + 17, "%31[a-z]", a->finish);
    free(r);
    return NULL;
}

/* Requests run alone, one after the other, then all at once (batched
 * with each other on the server's 2 slots, the rest queued and joining the
 * batcher while others decode): the batcher samples every row with the
 * row's own sampler and penalties, so the same seed gives the same text
 * either way; a stop string ends a streamed reply in a batch as alone. */
static void test_concurrent_seeds(const char *want, const char *stop) {
    enum { N = 5 };
    req_arg alone[N], together[N];
    memset(alone, 0, sizeof alone);
    snprintf(alone[0].body, sizeof alone[0].body,
             "{\"prompt\":\"Once upon a time\",\"max_tokens\":24,\"temperature\":0.9,\"seed\":11}");
    snprintf(alone[1].body, sizeof alone[1].body,
             "{\"prompt\":\"Once upon a time\",\"max_tokens\":24,\"temperature\":0.9,\"seed\":12,"
             "\"presence_penalty\":0.8,\"frequency_penalty\":0.6,\"stream\":true}");
    alone[1].stream = 1;
    snprintf(alone[2].body, sizeof alone[2].body,
             "{\"prompt\":\"" PK "\",\"max_tokens\":24,\"temperature\":0.8,\"top_k\":0,\"seed\":13,"
             "\"repeat_penalty\":1.3}");
    snprintf(alone[3].body, sizeof alone[3].body,
             "{\"prompt\":\"The pass key is\",\"max_tokens\":24,\"temperature\":1.0,\"seed\":14,\"stream\":true}");
    alone[3].stream = 1;
    snprintf(alone[4].body, sizeof alone[4].body,
             "{\"prompt\":\"" PK "\",\"max_tokens\":8,\"temperature\":0,\"stop\":[\"%s\"],\"stream\":true}", stop);
    alone[4].stream = 1;
    memcpy(together, alone, sizeof alone);
    for (int i = 0; i < N; i++) req_client(&alone[i]);
    pthread_t th[N];
    for (int i = 0; i < N; i++) pthread_create(&th[i], NULL, req_client, &together[i]);
    for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
    int same = 1;
    for (int i = 0; i < N; i++)
        if (alone[i].code != 200 || together[i].code != 200 || !alone[i].text[0] ||
            strcmp(alone[i].text, together[i].text) != 0 || strcmp(alone[i].finish, together[i].finish) != 0) {
            same = 0;
            fprintf(stderr, "  request %d: alone %d \"%s\" (%s), together %d \"%s\" (%s)\n", i, alone[i].code,
                    alone[i].text, alone[i].finish, together[i].code, together[i].text, together[i].finish);
        }
    T_CHECK(same, "seeded requests (penalties, a stream, a stop string) give the same text alone and all at once");
    T_CHECK(strncmp(together[4].text, want, 2) == 0 && strlen(together[4].text) == 2 &&
                strcmp(together[4].finish, "stop") == 0,
            "a streamed reply in a batch ends before its stop string \"%s\": \"%s\" (%s)", stop, together[4].text,
            together[4].finish);
}

/* The greedy continuation of prompt by the library itself (a session on
 * its own ctx, argmax over the logits, lowest id on ties), n tokens, with
 * EOS's logit taken as -Inf when mask_eos: the reference for ignore_eos.
 * Writes the pieces' text to out and returns how many tokens came before
 * the first EOS (n when none; with mask_eos always n), or -1 on a failure. */
static int lib_greedy(const char *prompt, int n, int mask_eos, char *out, size_t cap) {
    dhsa_model *m = NULL;
    dhsa_ctx *ctx = NULL;
    dhsa_session *s = NULL;
    dhsa_model_params mp = dhsa_model_default_params();
    dhsa_ctx_params cp = dhsa_ctx_default_params();
    dhsa_session_params sp = dhsa_session_default_params();
    sp.n_ctx = 512;
    int32_t ids[512];
    int64_t n_ids = 0;
    float *logits = NULL;
    int got = -1;
    out[0] = 0;
    if (dhsa_model_load("models/dhsa-retrieval-8m.gguf", &mp, &m) || dhsa_ctx_create(&cp, &ctx) ||
        dhsa_session_create(ctx, m, &sp, &s))
        goto done;
    const dhsa_tokenizer *tok = dhsa_model_tokenizer(m);
    const int64_t V = dhsa_model_get_info(m)->n_vocab;
    const int32_t eos = dhsa_tokenizer_eos(tok);
    logits = malloc((size_t)V * sizeof(float));
    if (!logits || eos < 0 ||
        dhsa_tokenize(tok, prompt, (int64_t)strlen(prompt), dhsa_tokenizer_default_flags(tok) & DHSA_TOKENIZE_ADD_BOS,
                      ids, 512, &n_ids) ||
        dhsa_session_eval(s, ids, n_ids, logits))
        goto done;
    size_t k = 0;
    got = n;
    for (int i = 0; i < n; i++) {
        if (mask_eos) logits[eos] = -INFINITY;
        int32_t best = 0;
        for (int32_t j = 1; j < V; j++)
            if (logits[j] > logits[best]) best = j;
        if (best == eos) {
            got = i;
            break;
        }
        char piece[256];
        int64_t len = 0;
        if (dhsa_token_to_piece(tok, best, 0, piece, sizeof piece, &len) == DHSA_OK && k + (size_t)len + 1 < cap) {
            memcpy(out + k, piece, (size_t)len);
            k += (size_t)len;
            out[k] = 0;
        }
        if (i + 1 < n && dhsa_session_eval(s, &best, 1, logits)) {
            got = -1;
            break;
        }
    }
done:
    free(logits);
    dhsa_session_free(s);
    dhsa_ctx_free(ctx);
    dhsa_model_free(m);
    return got;
}

/* The finish_reason of a reply (the last one of a stream) into out. */
static void finish_of(const char *resp, char *out, size_t cap) {
    const char *f = NULL;
    for (const char *p = strstr(body_of(resp), "\"finish_reason\":\""); p; p = strstr(p + 1, "\"finish_reason\":\""))
        f = p;
    snprintf(out, cap, "%s", "");
    if (f) sscanf(f + 17, "%31[a-z]", out);
}

/* ignore_eos (docs/server.md): PK's greedy continuation meets EOS after a
 * few tokens; with ignore_eos the reply runs to max_tokens ("length"), and
 * EOS is masked rather than emitted: the text is the library's greedy
 * continuation with EOS's logit -Inf. Whole and streamed completions, a
 * streamed chat (whose stop ids are EOS and the template's), a stop string
 * still ending it, and a non-boolean value refused. */
static void test_ignore_eos(void) {
    enum { N = 16 };
    char plain[1024], masked[1024], text[4096], fin[32], body[1024], *r = NULL;
    int stops_at = lib_greedy(PK, N, 0, plain, sizeof plain);
    int masked_n = lib_greedy(PK, N, 1, masked, sizeof masked);
    T_CHECK(stops_at > 0 && stops_at < N && masked_n == N && strncmp(masked, plain, strlen(plain)) == 0 &&
                strlen(masked) > strlen(plain),
            "the library's greedy continuation meets EOS after %d tokens (\"%s\"); with EOS masked %d tokens \"%s\"",
            stops_at, plain, masked_n, masked);
    snprintf(body, sizeof body, "{\"prompt\":\"" PK "\",\"max_tokens\":%d,\"temperature\":0}", N);
    int code = http("POST", "/v1/completions", body, &r);
    json_str(body_of(r), "text", text, sizeof text);
    finish_of(r, fin, sizeof fin);
    T_CHECK(code == 200 && strcmp(fin, "stop") == 0 && json_int(body_of(r), "completion_tokens") == stops_at &&
                strcmp(text, plain) == 0,
            "without ignore_eos the reply stops at EOS: %d %s", code, body_of(r));
    free(r);
    snprintf(body, sizeof body, "{\"prompt\":\"" PK "\",\"max_tokens\":%d,\"temperature\":0,\"ignore_eos\":true}", N);
    code = http("POST", "/v1/completions", body, &r);
    json_str(body_of(r), "text", text, sizeof text);
    finish_of(r, fin, sizeof fin);
    T_CHECK(code == 200 && strcmp(fin, "length") == 0 && json_int(body_of(r), "completion_tokens") == N &&
                strcmp(text, masked) == 0 && !strstr(text, "</s>"),
            "ignore_eos: max_tokens %d tokens, \"length\", the text with EOS masked \"%s\": %d %s", N, masked, code,
            body_of(r));
    free(r);
    snprintf(body, sizeof body,
             "{\"prompt\":\"" PK "\",\"max_tokens\":%d,\"temperature\":0,\"ignore_eos\":true,\"stream\":true}", N);
    code = http("POST", "/v1/completions", body, &r);
    sse_text(r, "text", text, sizeof text);
    finish_of(r, fin, sizeof fin);
    T_CHECK(code == 200 && strcmp(fin, "length") == 0 && json_int(body_of(r), "completion_tokens") == N &&
                strcmp(text, masked) == 0 && strstr(r, "data: [DONE]"),
            "ignore_eos streamed: the same text, \"length\": %d \"%s\" (%s)", code, text, fin);
    free(r);
    /* a stop string past where EOS was still ends the reply */
    char stop[8] = "";
    size_t pl = strlen(plain);
    if (strlen(masked) >= pl + 3) memcpy(stop, masked + pl + 1, 2);
    snprintf(body, sizeof body, "{\"prompt\":\"" PK "\",\"max_tokens\":%d,\"temperature\":0,\"ignore_eos\":true,"
             "\"stop\":\"%s\"}", N, stop);
    code = http("POST", "/v1/completions", body, &r);
    json_str(body_of(r), "text", text, sizeof text);
    finish_of(r, fin, sizeof fin);
    const char *hit = stop[0] ? strstr(masked, stop) : NULL; /* its first place is past the EOS */
    T_CHECK(code == 200 && hit && hit - masked > (ptrdiff_t)pl && strcmp(fin, "stop") == 0 && strlen(text) == (size_t)(hit - masked) &&
                strncmp(text, masked, strlen(text)) == 0,
            "ignore_eos with stop \"%s\": the text ends before it: %d \"%s\" (%s)", stop, code, text, fin);
    free(r);
    /* chat: the template's stop ids are masked too */
    const char *msg = "{\"messages\":[{\"role\":\"user\",\"content\":\"" PK "\"}],\"max_tokens\":16,\"temperature\":0";
    snprintf(body, sizeof body, "%s}", msg);
    code = http("POST", "/v1/chat/completions", body, &r);
    char reply[1024];
    json_str(body_of(r), "content", reply, sizeof reply);
    long n_stop = json_int(body_of(r), "completion_tokens");
    finish_of(r, fin, sizeof fin);
    free(r);
    snprintf(body, sizeof body, "%s,\"ignore_eos\":true,\"stream\":true}", msg);
    code = http("POST", "/v1/chat/completions", body, &r);
    sse_text(r, "content", text, sizeof text);
    char fin2[32];
    finish_of(r, fin2, sizeof fin2);
    T_CHECK(strcmp(fin, "stop") == 0 && n_stop < 16 && reply[0] && code == 200 && strcmp(fin2, "length") == 0 &&
                json_int(body_of(r), "completion_tokens") == 16 && strncmp(text, reply, strlen(reply)) == 0 &&
                strlen(text) > strlen(reply),
            "a chat that stops after %ld tokens (\"%s\", %s) runs to 16 with ignore_eos: %d \"%s\" (%s)", n_stop, reply,
            fin, code, text, fin2);
    free(r);
    code = http("POST", "/v1/completions", "{\"prompt\":\"a\",\"ignore_eos\":\"yes\"}", &r);
    T_CHECK(code == 400 && strstr(r, "\"param\":\"ignore_eos\"") && strstr(r, "ignore_eos must be true or false"),
            "a non-boolean ignore_eos: 400 naming it: %d %s", code, body_of(r));
    free(r);
}

/* Raw malformed requests over a socket (docs/server.md, "Malformed HTTP").
 * Those that reach the handler get a 400 with the error object (code
 * malformed_http); those libmicrohttpd rejects before there is a request
 * get its own status (its HTML body, which the API cannot replace, is not
 * checked). Every one is answered and closed (no request here asks for
 * Connection: close: a connection kept open would hang the test until
 * --timeout); the server answers after them. */
static void test_malformed_http(void) {
    static const struct {
        const char *what, *req;
    } ours[] = {
        {"two Content-Length", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}"},
        {"Content-Length and chunked", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 7\r\n"
                                       "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"},
        {"HTTP/1.1 without Host", "GET /health HTTP/1.1\r\n\r\n"},
        {"two Host headers", "GET /health HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n"},
        {"a space before the colon", "GET /health HTTP/1.1\r\nHost : x\r\n\r\n"},
        {"a header name with a slash", "GET /health HTTP/1.1\r\nHost: x\r\nX/Y: 1\r\n\r\n"},
    };
    for (size_t i = 0; i < sizeof ours / sizeof *ours; i++) {
        char *r = NULL;
        int code = http_raw(ours[i].req, strlen(ours[i].req), &r, 0);
        char type[64] = "", ecode[64] = "";
        json_str(r ? body_of(r) : "", "type", type, sizeof type);
        json_str(r ? body_of(r) : "", "code", ecode, sizeof ecode);
        T_CHECK(code == 400 && r && strstr(r, "Content-Type: application/json") && strstr(body_of(r), "{\"error\":") &&
                    strcmp(type, "invalid_request_error") == 0 && strcmp(ecode, "malformed_http") == 0,
                "malformed HTTP (%s): a 400 with an error object: %d %s", ours[i].what, code, r ? r : "(nothing)");
        free(r);
    }
    /* the same requests made well-formed pass the checks */
    static const char *const fine[] = {
        "GET /health HTTP/1.0\r\n\r\n",
        "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Y.z_~!: 1\r\n\r\n",
        "POST /tokenize HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: 15\r\n\r\n{\"content\":\"a\"}",
        "POST /tokenize HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n"
        "f\r\n{\"content\":\"a\"}\r\n0\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof fine / sizeof *fine; i++) {
        char *r = NULL;
        int code = http_raw(fine[i], strlen(fine[i]), &r, 0);
        T_CHECK(code == 200, "a well-formed raw request %zu: 200 (%d %s)", i, code, r ? body_of(r) : "");
        free(r);
    }
    /* rejected by libmicrohttpd before the handler runs: its status */
    static const struct {
        const char *what, *req;
        int code; /* -1: the connection is closed without an answer */
    } theirs[] = {
        {"a header without a colon", "GET /health HTTP/1.1\r\nHost: x\r\nNo colon here\r\n\r\n", 400},
        {"a Content-Length that is not a number", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: ab\r\n\r\n{}", 400},
        {"a bad chunk size", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n", 400},
        {"a request line without a version", "GET /health\r\n\r\n", 400},
        {"not HTTP", "hello there\r\n\r\n", 400},
        {"HTTP/2.0", "GET /health HTTP/2.0\r\nHost: x\r\n\r\n", 505},
    };
    for (size_t i = 0; i < sizeof theirs / sizeof *theirs; i++) {
        char *r = NULL;
        int code = http_raw(theirs[i].req, strlen(theirs[i].req), &r, 0);
        T_CHECK(code == theirs[i].code, "malformed HTTP (%s), answered by libmicrohttpd: %d (expected %d)",
                theirs[i].what, code, theirs[i].code);
        free(r);
    }
    /* a bad Content-Length: libmicrohttpd 0.9.75 writes its status line
     * and headers twice (issue 34), 1.0 once (docs/server.md) */
    int major = atoi(MHD_get_version());
    static const char *const bad_cl[] = {"-5", "abc"};
    for (int i = 0; i < 2; i++) {
        char req[256], *resp = NULL;
        int n = snprintf(req, sizeof req, "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: %s\r\n\r\n{}", bad_cl[i]);
        int c = http_raw(req, (size_t)n, &resp, 0);
        int lines = 0;
        for (const char *p = resp; p && (p = strstr(p, "HTTP/1.1 400 ")); p++) lines++;
        T_CHECK(c == 400 && (lines == 1 || (major < 1 && lines == 2)),
                "Content-Length: %s: 400 with %d status line%s (libmicrohttpd %s: %s)", bad_cl[i], lines,
                lines == 1 ? "" : "s", MHD_get_version(), major < 1 ? "two are its known defect" : "one expected");
        free(resp);
    }
    char *r = NULL;
    int code = http("GET", "/health", NULL, &r);
    T_CHECK(code == 200, "the server answers after the malformed requests (%d)", code);
    free(r);
}

static void test_http(void) {
    char *r = NULL;
    int code;
    int started = start_server("--slots 2 --ctx 512 --threads 1 --max-body 4096 --max-tokens 256") == 0;
    T_CHECK(started, "dhsa serve starts and listens (log %s)", g_log);
    if (!started) {
        T_SKIP(N_HTTP_CHECKS - 1, "the server did not start");
        return;
    }
    code = http("GET", "/health", NULL, &r);
    T_CHECK(code == 200 && strstr(r, "\"status\":\"ok\"") && json_int(body_of(r), "slots_idle") == 2, "health: %d %s",
            code, body_of(r));
    free(r);
    code = http("GET", "/v1/models", NULL, &r);
    T_CHECK(code == 200 && strstr(r, "\"object\":\"list\"") && strstr(r, "\"id\":\"dhsa-retrieval-8m\""), "models: %d %s",
            code, body_of(r));
    free(r);
    code = http("POST", "/tokenize", "{\"content\":\"The pass key is 40913.\"}", &r);
    char ids[256] = "";
    const char *tk = strstr(body_of(r), "\"tokens\":[");
    if (tk) sscanf(tk + 10, "%255[0-9,]", ids);
    T_CHECK(code == 200 && ids[0] == '1' && ids[1] == ',', "tokenize (BOS first): %d %s", code, body_of(r));
    free(r);
    char body[1024];
    snprintf(body, sizeof body, "{\"tokens\":[%s]}", ids);
    code = http("POST", "/detokenize", body, &r);
    char text[4096];
    json_str(body_of(r), "content", text, sizeof text);
    T_CHECK(code == 200 && strcmp(text, "The pass key is 40913.") == 0, "detokenize(tokenize(x)) == x: %d \"%s\"", code,
            text);
    free(r);

    /* greedy completions against the CLI */
    char want[4096] = "", want2[4096] = "";
    int cli_ok = cli_greedy(PK, 8, want, sizeof want) == 0 && cli_greedy(PK2, 8, want2, sizeof want2) == 0;
    T_CHECK(cli_ok && strlen(want) > 0, "dhsa run --temp 0 gives a continuation: \"%s\"", want);
    const char *greedy = "{\"prompt\":\"" PK "\",\"max_tokens\":8,\"temperature\":0}";
    code = http("POST", "/v1/completions", greedy, &r);
    json_str(body_of(r), "text", text, sizeof text);
    T_CHECK(code == 200 && strcmp(text, want) == 0, "greedy completion equals dhsa run's: %d \"%s\" vs \"%s\"", code,
            text, want);
    T_CHECK(strstr(r, "\"object\":\"text_completion\"") && json_int(body_of(r), "prompt_tokens") > 20 &&
                json_int(body_of(r), "completion_tokens") >= 1 && strstr(r, "\"finish_reason\":\""),
            "completion: object, usage, finish_reason: %s", body_of(r));
    free(r);
    double hits0 = metric("dhsa_cache_hits_total");
    code = http("POST", "/v1/completions", greedy, &r);
    json_str(body_of(r), "text", text, sizeof text);
    T_CHECK(code == 200 && strcmp(text, want) == 0 && json_int(body_of(r), "cached_tokens") > 20,
            "the same prompt again, from the prompt cache: same text, cached_tokens %ld", json_int(body_of(r), "cached_tokens"));
    free(r);
    T_CHECK(metric("dhsa_cache_hits_total") >= hits0 + 1, "metrics count the cache hit");
    /* both slots now hold PK; a prompt sharing a prefix with it reuses it */
    snprintf(body, sizeof body, "{\"prompt\":\"" PK2 "\",\"max_tokens\":8,\"temperature\":0}");
    code = http("POST", "/v1/completions", body, &r);
    json_str(body_of(r), "text", text, sizeof text);
    long cached = json_int(body_of(r), "cached_tokens");
    T_CHECK(code == 200 && strcmp(text, want2) == 0 && cached > 10,
            "a prompt sharing a prefix: dhsa run's text \"%s\" (got \"%s\"), %ld tokens from the cache", want2, text,
            cached);
    free(r);
    /* stop string: the continuation is cut before it */
    char stop[8] = "";
    if (strlen(want) >= 4) memcpy(stop, want + 2, 2);
    snprintf(body, sizeof body, "{\"prompt\":\"" PK "\",\"max_tokens\":8,\"temperature\":0,\"stop\":[\"%s\"]}", stop);
    code = http("POST", "/v1/completions", body, &r);
    json_str(body_of(r), "text", text, sizeof text);
    T_CHECK(code == 200 && strncmp(text, want, 2) == 0 && strlen(text) == 2 && strstr(r, "\"finish_reason\":\"stop\""),
            "stop \"%s\": text \"%s\", %s", stop, text, body_of(r));
    free(r);

    /* streaming */
    snprintf(body, sizeof body, "{\"prompt\":\"" PK "\",\"max_tokens\":8,\"temperature\":0,\"stream\":true}");
    code = http("POST", "/v1/completions", body, &r);
    sse_text(r, "text", text, sizeof text);
    T_CHECK(code == 200 && strstr(r, "Content-Type: text/event-stream") && strcmp(text, want) == 0,
            "a streamed completion: the same text \"%s\" (want \"%s\")", text, want);
    const char *done = strstr(r, "data: [DONE]\n\n");
    T_CHECK(done && done[14] == 0 && strstr(r, "\"usage\":{\"prompt_tokens\"") && strstr(r, "\"finish_reason\":\""),
            "the stream ends in usage and data: [DONE]");
    free(r);
    code = http("POST", "/v1/chat/completions",
                "{\"messages\":[{\"role\":\"user\",\"content\":\"What is the pass key?\"}],\"max_tokens\":6,"
                "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"seed\":3}", &r);
    T_CHECK(code == 200 && strstr(r, "\"object\":\"chat.completion.chunk\"") && strstr(r, "\"delta\":{\"role\":\"assistant\"") &&
                strstr(r, "\"choices\":[],\"usage\":{") && strstr(r, "data: [DONE]"),
            "a streamed chat: chunks, the role first, a usage chunk with no choices, [DONE]");
    free(r);
    code = http("POST", "/v1/chat/completions",
                "{\"messages\":[{\"role\":\"system\",\"content\":\"Answer.\"},{\"role\":\"user\",\"content\":\"Hi\"}],"
                "\"max_tokens\":4,\"temperature\":0}", &r);
    T_CHECK(code == 200 && strstr(r, "\"object\":\"chat.completion\"") && strstr(r, "\"message\":{\"role\":\"assistant\",\"content\":") &&
                json_int(body_of(r), "completion_tokens") <= 4,
            "chat: %d %s", code, body_of(r));
    free(r);
    {   /* a client who types <s></s> gets those as text, not BOS and EOS:
         * the prompt is dhsa_chat_tokenize's (the whole text parsed would be
         * 3 tokens shorter) */
        dhsa_gguf *g = NULL;
        dhsa_tokenizer *vocab = NULL;
        int64_t want_n = -1;
        if (dhsa_gguf_open("models/dhsa-retrieval-8m.gguf", &g) == DHSA_OK && dhsa_tokenizer_from_gguf(g, &vocab) == DHSA_OK) {
            dhsa_chat_message m = {"user", "<s></s>Hi"};
            dhsa_chat_tokenize(dhsa_chat_detect(g), vocab, &m, 1, 1, dhsa_tokenizer_default_flags(vocab) & DHSA_TOKENIZE_ADD_BOS,
                               NULL, 0, &want_n);
        }
        dhsa_tokenizer_free(vocab);
        dhsa_gguf_close(g);
        code = http("POST", "/v1/chat/completions",
                    "{\"messages\":[{\"role\":\"user\",\"content\":\"<s></s>Hi\"}],\"max_tokens\":1,\"temperature\":0}",
                    &r);
        T_CHECK(code == 200 && want_n > 0 && json_int(body_of(r), "prompt_tokens") == want_n,
                "a chat typing <s></s>: %ld prompt tokens, dhsa_chat_tokenize gives %lld: %s",
                json_int(body_of(r), "prompt_tokens"), (long long)want_n, body_of(r));
        free(r);
    }

    test_ignore_eos();

    /* errors */
    code = http("POST", "/v1/completions", "{\"prompt\":", &r);
    T_CHECK(code == 400 && strstr(r, "{\"error\":{\"message\":") && strstr(r, "\"type\":\"invalid_request_error\""),
            "malformed JSON: 400 with an OpenAI error object: %d %s", code, body_of(r));
    free(r);
    code = http("POST", "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"n\":3}", &r);
    T_CHECK(code == 400 && strstr(r, "\"param\":\"n\""), "n = 3: 400 naming n: %s", body_of(r));
    free(r);
    code = http("POST", "/v1/completions", "{\"prompt\":\"a\",\"max_tokens\":500}", &r);
    T_CHECK(code == 400 && strstr(r, "\"param\":\"max_tokens\""), "max_tokens above --max-tokens: %s", body_of(r));
    free(r);
    code = http("POST", "/v1/completions", "{\"prompt\":\"a\",\"max_tokens\":200,\"unknown\":1}", &r);
    T_CHECK(code == 400 && strstr(r, "\"param\":\"unknown\""), "an unknown parameter: %s", body_of(r));
    free(r);
    char *longp = malloc(4000);
    if (longp) {
        strcpy(longp, "{\"prompt\":[");
        for (int i = 0; i < 520; i++) strcat(longp, i ? ",5" : "5");
        strcat(longp, "]}");
    }
    code = longp ? http("POST", "/v1/completions", longp, &r) : -1;
    T_CHECK(code == 400 && strstr(r, "\"code\":\"context_length_exceeded\""), "a prompt longer than --ctx: %d %s", code,
            r ? body_of(r) : "");
    free(r);
    free(longp);
    char *huge = malloc(6000);
    if (huge) {
        memset(huge, ' ', 5999);
        huge[5999] = 0;
        memcpy(huge, "{\"prompt\":\"", 11);
        memcpy(huge + 5990, "\"}", 3);
    }
    code = huge ? http("POST", "/v1/completions", huge, &r) : -1;
    T_CHECK(code == 413 && strstr(r, "--max-body"), "a body over --max-body: %d %s", code, r ? body_of(r) : "");
    free(r);
    free(huge);
    code = http("GET", "/nowhere", NULL, &r);
    T_CHECK(code == 404 && strstr(r, "\"error\""), "404 with an error object");
    free(r);
    code = http("GET", "/v1/completions", NULL, &r);
    T_CHECK(code == 405, "GET on a POST endpoint: 405 (%d)", code);
    free(r);
    test_malformed_http();
    T_CHECK(slots_busy() == 0, "no slot busy after the errors");

    /* a client that goes away mid-stream frees its slot */
    snprintf(body, sizeof body, "{\"prompt\":\"Once upon a time\",\"max_tokens\":256,\"stream\":true,\"seed\":1}");
    char req[1024];
    int n = snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n%s",
                     strlen(body), body);
    double disc0 = metric("dhsa_client_disconnects_total");
    http_raw(req, (size_t)n, &r, 300);
    free(r);
    long busy = -1;
    for (int i = 0; i < 100 && busy != 0; i++) {
        usleep(50000);
        busy = slots_busy();
    }
    T_CHECK(busy == 0, "a client that disconnects mid-stream frees its slot (%ld busy)", busy);
    double disc1 = metric("dhsa_client_disconnects_total");
    T_CHECK(disc0 >= 0 && disc1 >= disc0 + 1, "metrics count the disconnect (%g -> %g)", disc0, disc1);

    /* curl as the client */
    int have_curl = system("command -v curl >/dev/null 2>&1") == 0;
    if (have_curl) {
        char cmd[1024], *o = NULL;
        snprintf(cmd, sizeof cmd,
                 "curl -sS -N http://127.0.0.1:%d/v1/chat/completions -H 'Content-Type: application/json' "
                 "-d '{\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}],\"max_tokens\":4,\"stream\":true}'",
                 g_port);
        FILE *p = popen(cmd, "r");
        size_t cap = 1 << 16, got = 0;
        o = malloc(cap);
        if (p && o) {
            got = fread(o, 1, cap - 1, p);
            o[got] = 0;
        }
        int st = p ? pclose(p) : -1;
        T_CHECK(st == 0 && o && strstr(o, "data: [DONE]"), "curl -N streams a chat to [DONE]");
        free(o);
        snprintf(cmd, sizeof cmd, "curl -sS -o /dev/null -w '%%{http_code}' http://127.0.0.1:%d/v1/completions -d '{bad'",
                 g_port);
        p = popen(cmd, "r");
        char c3[16] = "";
        if (p) {
            if (!fgets(c3, sizeof c3, p)) c3[0] = 0;
            pclose(p);
        }
        T_CHECK(strcmp(c3, "400") == 0, "curl: malformed JSON is a 400 (%s)", c3);
    } else {
        T_SKIP(2, "curl is not installed (apt-get install curl)");
    }

    /* load: 8 clients x 20 requests, every fifth going away early */
    /* warm-up at the same concurrency: the slots' caches, the connection
     * threads and their malloc arenas reach their size before RSS is read
     * (a one-client warm-up left 8 threads' arenas to the load itself:
     * RSS +6-13% once in a loaded full run, never a leak) */
    {
        pthread_t wt[8];
        load_arg wa[8];
        for (int i = 0; i < 8; i++) {
            wa[i] = (load_arg){i, 0, 0, 3};
            pthread_create(&wt[i], NULL, load_client, &wa[i]);
        }
        for (int i = 0; i < 8; i++) pthread_join(wt[i], NULL);
    }
    usleep(200000);
    double rss0 = metric("dhsa_resident_bytes");
    pthread_t th[8];
    load_arg la[8];
    double t0 = dhsa_cli_now_test();
    for (int i = 0; i < 8; i++) {
        la[i] = (load_arg){i, 0, 0, 0};
        pthread_create(&th[i], NULL, load_client, &la[i]);
    }
    int failed = 0, dropped = 0;
    for (int i = 0; i < 8; i++) {
        pthread_join(th[i], NULL);
        failed += la[i].failed;
        dropped += la[i].disconnected;
    }
    double secs = dhsa_cli_now_test() - t0;
    busy = -1;
    for (int i = 0; i < 100 && busy != 0; i++) {
        usleep(50000);
        busy = slots_busy();
    }
    double rss1 = metric("dhsa_resident_bytes");
    printf("test_serve: load: 160 requests (%d dropped by the client) in %.1f s, %d failed; RSS %.1f -> %.1f MiB\n",
           dropped, secs, failed, rss0 / 1048576.0, rss1 / 1048576.0);
    T_CHECK(failed == 0 && dropped == 32, "load test: no failed request (%d failed, %d dropped)", failed, dropped);
    T_CHECK(busy == 0, "load test: no slot left busy (%ld)", busy);
    if (getenv("DHSA_SANITIZED")) /* freed memory stays in the sanitizer's quarantine */
        T_SKIP(1, "RSS after the load test: meaningless under a sanitizer (make test checks it)");
    else
        T_CHECK(rss0 > 0 && rss1 > 0 && rss1 <= rss0 * 1.05,
                "load test: RSS after %.1f MiB within 5%% of before %.1f MiB", rss1 / 1048576.0, rss0 / 1048576.0);
    code = http("GET", "/health", NULL, &r);
    T_CHECK(code == 200 && json_int(body_of(r), "requests_queued") == 0, "nothing queued after the load");
    free(r);
    double passes = metric("dhsa_decode_batches_total"), rows = metric("dhsa_decode_batch_rows_total");
    T_CHECK(passes > 0 && rows > passes, "the slots' decode steps were batched: %g steps in %g passes", rows, passes);
    /* two greedy requests at once, batched together: dhsa run's text each */
    greedy_arg ga[2] = {{want, 0}, {want, 0}};
    pthread_t gt[2];
    for (int i = 0; i < 2; i++) pthread_create(&gt[i], NULL, greedy_client, &ga[i]);
    for (int i = 0; i < 2; i++) pthread_join(gt[i], NULL);
    T_CHECK(ga[0].ok && ga[1].ok, "two concurrent greedy completions both give dhsa run's text");
    test_concurrent_seeds(want, stop);
    double sample_s = metric("dhsa_decode_batch_sample_seconds_total");
    T_CHECK(sample_s > 0 && sample_s < metric("dhsa_decode_batch_eval_seconds_total"),
            "metrics: the batcher's per-token work between passes (%g s) is counted, and less than the passes' (%g s)",
            sample_s, metric("dhsa_decode_batch_eval_seconds_total"));

    /* SIGTERM during a stream */
    int fd = connect_server();
    snprintf(body, sizeof body, "{\"prompt\":\"Once upon a time\",\"max_tokens\":256,\"stream\":true,\"seed\":2}");
    n = snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n%s",
                 strlen(body), body);
    if (fd >= 0) send_all(fd, req, (size_t)n);
    char first[256];
    if (fd >= 0 && recv(fd, first, sizeof first, 0) <= 0) first[0] = 0;
    int rc = stop_server(20);
    if (fd >= 0) close(fd);
    char *log = NULL;
    FILE *f = fopen(g_log, "r");
    if (f) {
        log = calloc(1, 1 << 16);
        if (log && fread(log, 1, (1 << 16) - 1, f) == 0) log[0] = 0;
        fclose(f);
    }
    T_CHECK(rc == 0 && log && strstr(log, "SIGTERM: stopping") && strstr(log, "dhsa serve: stopped"),
            "SIGTERM during a stream: the server stops cleanly (exit %d)", rc);
    free(log);
    unlink(g_log);

    /* --mem-limit against every slot's plan */
    char *o = NULL;
    int mrc = cli_run("serve --slots 8 --ctx 32768 --mem-limit 200M --port 0", 0, &o);
    T_CHECK(mrc == 1 && o && strstr(o, "8 slots need") && strstr(o, "--mem-limit"),
            "--mem-limit below the plan of 8 slots: refused at start (exit %d): %.300s", mrc, o ? o : "");
    free(o);
}

/* ------------------------------------------ nothing leaks between clients --- */

/* Issue 34: with --slots 1, client A's completion left the slot's logits;
 * client B's "prompt": [[]] was then sampled from them (HTTP 200, A's
 * answer). Every form of an empty prompt is refused with a 400 naming it,
 * whatever ran in the slot before; A's prompt then still gives its text. */
static void test_empty_after_other(void) {
    static const char *const a_body =
        "{\"prompt\":\"The secret password is swordfish. I repeat, the secret password is\",\"max_tokens\":3,"
        "\"temperature\":0}";
    static const struct {
        const char *path, *body, *param;
    } empty[] = {
        {"/v1/completions", "{\"prompt\":[[]],\"max_tokens\":5,\"temperature\":0}", "prompt"},
        {"/v1/completions", "{\"prompt\":[],\"max_tokens\":5,\"temperature\":0}", "prompt"},
        {"/v1/completions", "{\"prompt\":\"\",\"max_tokens\":5,\"temperature\":0}", "prompt"},
        {"/v1/completions", "{\"prompt\":[\"\"],\"max_tokens\":5,\"temperature\":0,\"stream\":true}", "prompt"},
        {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"\"}],\"max_tokens\":5,\"temperature\":0}",
         "messages"},
    };
    char *r = NULL, a_text[256] = "";
    int code = http("POST", "/v1/completions", a_body, &r);
    json_str(body_of(r), "text", a_text, sizeof a_text);
    free(r);
    int all = code == 200 && a_text[0];
    for (size_t i = 0; i < sizeof empty / sizeof *empty; i++) {
        code = http("POST", "/v1/completions", a_body, &r); /* A again: the slot holds its logits */
        free(r);
        code = http("POST", empty[i].path, empty[i].body, &r);
        char param[32] = "";
        json_str(body_of(r), "param", param, sizeof param);
        if (code != 400 || strcmp(param, empty[i].param) != 0 || strstr(body_of(r), "\"choices\"")) {
            all = 0;
            fprintf(stderr, "  after client A, %s %s: %d %s\n", empty[i].path, empty[i].body, code, body_of(r));
        }
        free(r);
    }
    T_CHECK(all, "an empty prompt ([[]], [], \"\", [\"\"], empty chat) right after another client's request: 400 "
            "naming it, never that client's answer (A: \"%s\")", a_text);
    char again[256] = "";
    code = http("POST", "/v1/completions", a_body, &r);
    json_str(body_of(r), "text", again, sizeof again);
    free(r);
    T_CHECK(code == 200 && strcmp(again, a_text) == 0, "client A's request after them: the same text (\"%s\", \"%s\")",
            again, a_text);
}

/* N clients at once, each with its own secret (a 6-digit pass key the
 * model copies) in a prompt that shares a long prefix with everyone's (the
 * prompt cache reuses it across clients), over several rounds: whole and
 * streamed completions, chats, a client's own prompt again (from its
 * cache), prompts with no secret after the shared prefix, and empty
 * prompts (400). No response may hold another client's secret (in its
 * bytes or in a stream's joined text); at least 80% of the secret-bearing
 * completions give their own (so that the test would see a leak). A
 * server whose prefill keeps the slot's old cache instead of cutting it
 * back (checked once, by hand) leaks in about half of the requests. */
#define SECRET_DOC "There is important information hidden in this text. Find it and remember it. The grass is green. The sky is blue. "
#define SECRET_ASK "The grass is green. The sky is blue. What is the pass key? The pass key is"
enum { N_SECRET = 24, SECRET_ROUNDS = 4 };
static char g_secret[N_SECRET][16];

typedef struct {
    int id;
    int leaks, own, asked, empty_ok, empty_n, failed;
} secret_arg;

static void *secret_client(void *p) {
    secret_arg *a = p;
    const char *mine = g_secret[a->id];
    for (int round = 0; round < SECRET_ROUNDS; round++) {
        const int kind = (a->id + round * 5) % 7;
        char body[1024], *r = NULL;
        const char *path = "/v1/completions";
        int has_secret = 1, stream = 0, empty = 0;
        switch (kind) {
        case 0:
        case 5: /* 5: again, often its own slot's cache */
            snprintf(body, sizeof body, "{\"prompt\":\"" SECRET_DOC "The pass key is %s. Remember it. %s is the pass key. "
                     SECRET_ASK "\",\"max_tokens\":10,\"temperature\":0}", mine, mine);
            break;
        case 1:
            snprintf(body, sizeof body, "{\"prompt\":\"" SECRET_DOC "The pass key is %s. Remember it. %s is the pass key. "
                     SECRET_ASK "\",\"max_tokens\":10,\"temperature\":0,\"stream\":true}", mine, mine);
            stream = 1;
            break;
        case 2:
            path = "/v1/chat/completions";
            stream = round % 2;
            snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"" SECRET_DOC "The pass key is %s. "
                     "%s is the pass key. What is the pass key?\"}],\"max_tokens\":10,\"temperature\":0.5,\"seed\":%d%s}",
                     mine, mine, a->id, stream ? ",\"stream\":true" : "");
            has_secret = 0; /* the chat's reply need not copy it: only leaks are counted */
            break;
        case 3: /* the shared prefix and the question, no secret: the cache holds others' */
            stream = round % 2;
            snprintf(body, sizeof body, "{\"prompt\":\"" SECRET_DOC SECRET_ASK "\",\"max_tokens\":10,\"temperature\":0%s}",
                     stream ? ",\"stream\":true" : "");
            has_secret = 0;
            break;
        case 4: /* a prefix of everyone's prompt */
            snprintf(body, sizeof body, "{\"prompt\":\"" SECRET_DOC "The pass key is\",\"max_tokens\":10,\"temperature\":0}");
            has_secret = 0;
            break;
        default: { /* 6: empty, in one of its forms */
            static const char *const e[] = {"{\"prompt\":[[]],\"max_tokens\":5,\"temperature\":0}",
                                            "{\"prompt\":\"\",\"max_tokens\":5,\"temperature\":0,\"stream\":true}",
                                            "{\"prompt\":[\"\"],\"max_tokens\":5}"};
            snprintf(body, sizeof body, "%s", e[(a->id + round) % 3]);
            empty = 1;
            has_secret = 0;
        }
        }
        int code = http("POST", path, body, &r);
        const char *resp = r ? body_of(r) : "";
        /* a stream's text is split over its events: searched joined too */
        char joined[4096] = "";
        sse_text(r, kind == 2 ? "content" : "text", joined, sizeof joined);
        if (empty) {
            a->empty_n++;
            a->empty_ok += code == 400 && !strstr(resp, "\"choices\"");
        } else if (code != 200 || !(stream ? strstr(resp, "data: [DONE]") != NULL : strstr(resp, "\"usage\"") != NULL)) {
            a->failed++;
            fprintf(stderr, "  secrets: client %d round %d: %d %.200s\n", a->id, round, code, resp);
        }
        for (int j = 0; j < N_SECRET; j++)
            if (j != a->id && (strstr(resp, g_secret[j]) || strstr(joined, g_secret[j]))) {
                a->leaks++;
                fprintf(stderr, "  LEAK: client %d (secret %s) got client %d's secret %s: %.300s\n", a->id, mine, j,
                        g_secret[j], resp);
            }
        if (has_secret && code == 200) {
            a->asked++;
            a->own += strstr(resp, mine) != NULL || strstr(joined, mine) != NULL;
        }
        free(r);
    }
    return NULL;
}

static void test_secrets(const char *args) {
    char *r = NULL;
    if (start_server(args) != 0) {
        T_CHECK(0, "dhsa serve %s starts (log %s)", args, g_log);
        T_SKIP(4, "the server did not start");
        return;
    }
    for (int i = 0; i < N_SECRET; i++) /* distinct, 6 digits, none a substring of another */
        snprintf(g_secret[i], sizeof g_secret[i], "%d", 271828 + i * 24989);
    test_empty_after_other();
    pthread_t th[N_SECRET];
    secret_arg sa[N_SECRET];
    for (int i = 0; i < N_SECRET; i++) {
        memset(&sa[i], 0, sizeof sa[i]);
        sa[i].id = i;
        pthread_create(&th[i], NULL, secret_client, &sa[i]);
    }
    int leaks = 0, own = 0, asked = 0, empty_ok = 0, empty_n = 0, failed = 0;
    for (int i = 0; i < N_SECRET; i++) {
        pthread_join(th[i], NULL);
        leaks += sa[i].leaks;
        own += sa[i].own;
        asked += sa[i].asked;
        empty_ok += sa[i].empty_ok;
        empty_n += sa[i].empty_n;
        failed += sa[i].failed;
    }
    double hits = metric("dhsa_cache_hits_total");
    printf("test_serve: secrets (serve %s): %d clients x %d requests: %d leaks, %d of %d secret prompts answered with "
           "their own secret, %d of %d empty prompts refused, %d failed, %g cache hits\n", args, N_SECRET, SECRET_ROUNDS,
           leaks, own, asked, empty_ok, empty_n, failed, hits);
    T_CHECK(leaks == 0 && failed == 0 && asked > 0 && own * 10 >= asked * 8 && hits > 0,
            "%d concurrent clients with their own secrets (serve %s): %d leaks (want 0), %d failed, %d of %d give their "
            "own secret (>= 80%%: the model copies it), %g cache hits", N_SECRET, args, leaks, failed, own, asked, hits);
    T_CHECK(empty_n > 0 && empty_ok == empty_n, "empty prompts among them: %d of %d refused with 400", empty_ok, empty_n);
    int code = http("GET", "/health", NULL, &r);
    T_CHECK(code == 200 && json_int(body_of(r), "slots_busy") == 0, "no slot busy after the secrets test");
    free(r);
    stop_server(20);
    unlink(g_log);
}

static void test_no_leaks(void) {
    test_secrets("--slots 1 --ctx 512 --threads 1");
    test_secrets("--slots 4 --ctx 512 --threads 1");
    test_secrets("--slots 3 --ctx 512 --threads 1 --batch off");
}

/* ------------------------------------------------ --mem-limit holds --- */

/* A POST whose body may be answered before it is sent whole (413, 503):
 * sends and reads at once, and stops sending once an answer comes. Returns
 * the status (-1: no answer) and the response in *out. */
static int http_post_big(const char *path, const char *body, size_t len, char **out) {
    *out = NULL;
    int fd = connect_server();
    if (fd < 0) return -1;
    char head[256];
    int hl = snprintf(head, sizeof head, "POST %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: "
                      "application/json\r\nContent-Length: %zu\r\n\r\n", path, len);
    size_t cap = 1 << 16, n = 0, sent = 0, total = (size_t)hl + len;
    char *buf = malloc(cap);
    if (!buf) {
        close(fd);
        return -1;
    }
    double t0 = dhsa_cli_now_test();
    while (dhsa_cli_now_test() - t0 < 120) {
        struct pollfd p = {fd, (short)(POLLIN | (sent < total && n == 0 ? POLLOUT : 0)), 0};
        if (poll(&p, 1, 1000) < 0) break;
        if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
            if (cap - n < 4096) {
                char *nb = realloc(buf, cap * 2);
                if (!nb) break;
                buf = nb;
                cap *= 2;
            }
            ssize_t r = recv(fd, buf + n, cap - n - 1, 0);
            if (r <= 0) break;
            n += (size_t)r;
            continue;
        }
        if (p.revents & POLLOUT) {
            const char *src = sent < (size_t)hl ? head + sent : body + (sent - (size_t)hl);
            size_t left = sent < (size_t)hl ? (size_t)hl - sent : total - sent;
            ssize_t w = send(fd, src, left > 65536 ? 65536 : left, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (w > 0) sent += (size_t)w;
            else if (errno != EAGAIN && errno != EWOULDBLOCK) break;
        }
    }
    close(fd);
    buf[n] = 0;
    dechunk(buf);
    *out = buf;
    int code = -1;
    if (sscanf(buf, "HTTP/1.%*d %d", &code) != 1) code = -1;
    return code;
}

/* VmHWM of the server, bytes (-1 when unknown). */
static double server_hwm(void) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)g_pid);
    FILE *f = fopen(path, "r");
    double v = -1;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "VmHWM:", 6) == 0) v = strtod(line + 6, NULL) * 1024.0;
    if (f) fclose(f);
    return v;
}

typedef struct {
    const char *path;
    char *body;
    size_t len;
    int code, error_object;
    char msg[160];
} big_arg;

static void *big_client(void *p) {
    big_arg *a = p;
    char *r = NULL;
    a->code = http_post_big(a->path, a->body, a->len, &r);
    a->error_object = r && strstr(body_of(r), "{\"error\":{\"message\":") != NULL;
    json_str(r ? body_of(r) : "", "message", a->msg, sizeof a->msg);
    free(r);
    return NULL;
}

/* Issue 34: `serve --slots 1 --ctx 1024 --mem-limit 64M` reached a peak
 * RSS of 1.89 GB under 4 /tokenize and 4 chat bodies of 7 MB at once. Now
 * each request reserves what it will allocate (the body from its
 * Content-Length, the parse from a scan of it, the tokenizer's work, the
 * answer) from what the limit leaves, before allocating: the server's
 * VmHWM stays under the limit, every answer is a result or a 4xx / 503
 * with an error object, and afterwards nothing is left reserved and small
 * requests are served. A Content-Length of 1 TiB is answered 413 at once,
 * unread. */
static void test_mem_limit(void) {
    const double limit = 64.0 * 1048576.0;
    if (getenv("DHSA_SANITIZED")) { /* the shadow memory and the quarantine count in RSS, and in the plan */
        T_SKIP(N_MEM_CHECKS, "--mem-limit 64M against the server's VmHWM: meaningless under a sanitizer (make test "
               "checks it)");
        return;
    }
    if (start_server("--slots 1 --ctx 1024 --mem-limit 64M --threads 1") != 0) {
        T_CHECK(0, "dhsa serve --mem-limit 64M starts (log %s)", g_log);
        T_SKIP(N_MEM_CHECKS - 1, "the server did not start");
        return;
    }
    enum { N = 8, BIG = 7000000 };
    big_arg a[N];
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        memset(&a[i], 0, sizeof a[i]);
        a[i].path = i % 2 ? "/v1/chat/completions" : "/tokenize";
        a[i].body = malloc(BIG + 256);
        if (!a[i].body) continue;
        size_t k = (size_t)sprintf(a[i].body, i % 2 ? "{\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":\""
                                                    : "{\"content\":\"");
        for (size_t j = 0; j < BIG / 5; j++, k += 5) memcpy(a[i].body + k, "word ", 5);
        k += (size_t)sprintf(a[i].body + k, i % 2 ? "\"}]}" : "\"}");
        a[i].len = k;
    }
    double t0 = dhsa_cli_now_test();
    for (int i = 0; i < N; i++) pthread_create(&th[i], NULL, big_client, &a[i]);
    int answered = 1, n200 = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        int ok = a[i].code == 200 || ((a[i].code == 400 || a[i].code == 413 || a[i].code == 503) && a[i].error_object);
        n200 += a[i].code == 200;
        if (!ok) {
            answered = 0;
            fprintf(stderr, "  %s of 7 MB: %d %s\n", a[i].path, a[i].code, a[i].msg);
        }
        free(a[i].body);
    }
    double secs = dhsa_cli_now_test() - t0, hwm = server_hwm();
    printf("test_serve: --mem-limit 64M, 8 concurrent bodies of 7 MB (4 /tokenize, 4 chat): %.2f s, %d answered 200, "
           "server VmHWM %.1f MiB\n", secs, n200, hwm / 1048576.0);
    T_CHECK(answered, "8 concurrent 7 MB bodies under --mem-limit 64M: each a result or a 4xx / 503 with an error object");
    T_CHECK(hwm > 0 && hwm <= limit, "the server's peak RSS (VmHWM) %.1f MiB <= --mem-limit 64 MiB", hwm / 1048576.0);
    char *r = NULL;
    double t1 = dhsa_cli_now_test();
    int code = http_raw("POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 1099511627776\r\n\r\n{\"content\":\"",
                        70, &r, 0);
    double took = dhsa_cli_now_test() - t1;
    T_CHECK(code == 413 && strstr(body_of(r), "--max-body") && took < 5,
            "Content-Length 1 TiB: 413 from the headers, the body unread (%.2f s): %d %s", took, code, body_of(r));
    free(r);
    code = http("POST", "/v1/chat/completions",
                "{\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}],\"max_tokens\":4,\"temperature\":0}", &r);
    int chat_ok = code == 200;
    free(r);
    code = http("POST", "/tokenize", "{\"content\":\"The pass key is 40913.\"}", &r);
    T_CHECK(chat_ok && code == 200 && strstr(body_of(r), "{\"tokens\":[1,"),
            "after them a chat and a /tokenize are served (%d): %s", code, body_of(r));
    free(r);
    double reserved = metric("dhsa_request_memory_reserved_bytes"), pool = metric("dhsa_request_memory_pool_bytes");
    double peak = metric("dhsa_request_memory_reserved_peak_bytes");
    T_CHECK(reserved == 0 && pool > 0 && peak > 0 && peak <= pool,
            "nothing reserved after them (%g bytes), the peak %g within the pool %g", reserved, peak, pool);
    T_CHECK(server_hwm() <= limit, "VmHWM still <= 64 MiB after the 1 TiB header: %.1f MiB", server_hwm() / 1048576.0);
    stop_server(20);
    unlink(g_log);
}

/* ----------------------------------------------------- a clean stop --- */

typedef struct {
    char body[512];
    int started, code;
    char *resp;
} stop_arg;

static void *stop_client(void *p) {
    stop_arg *a = p;
    int fd = connect_server();
    a->code = -1;
    if (fd < 0) return NULL;
    char req[1024];
    int n = snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n%s",
                     strlen(a->body), a->body);
    if (send_all(fd, req, (size_t)n)) {
        close(fd);
        return NULL;
    }
    size_t cap = 1 << 16, got = 0;
    char *buf = malloc(cap);
    for (; buf;) {
        if (cap - got < 4096) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) break;
            buf = nb;
            cap *= 2;
        }
        ssize_t r = recv(fd, buf + got, cap - got - 1, 0);
        if (r <= 0) break;
        got += (size_t)r;
        __atomic_store_n(&a->started, 1, __ATOMIC_SEQ_CST);
    }
    close(fd);
    if (!buf) return NULL;
    buf[got] = 0;
    dechunk(buf);
    if (sscanf(buf, "HTTP/1.%*d %d", &a->code) != 1) a->code = -1;
    a->resp = buf;
    return NULL;
}

static long health_queued(void) {
    char *r = NULL;
    long q = http("GET", "/health", NULL, &r) == 200 ? json_int(body_of(r), "requests_queued") : -1;
    free(r);
    return q;
}

/* Waits up to secs for the server to exit; its exit status, or -1. */
static int wait_exit(double secs) {
    for (double t0 = dhsa_cli_now_test(); dhsa_cli_now_test() - t0 < secs; usleep(20000)) {
        int st;
        if (waitpid(g_pid, &st, WNOHANG) == g_pid) {
            g_pid = 0;
            return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        }
    }
    return -1;
}

/* Issue 34: SIGTERM during 5 streams and 3 queued requests cut the
 * streams off (no error event, no final chunk, no [DONE]) and closed the
 * queued requests' connections with no answer. Now: connects are refused
 * at once, the queued get a 503 with an error object, each stream ends
 * with an error event and data: [DONE], and the server exits 0. A second
 * signal, while a request keeps the drain waiting (a body that never
 * comes), stops it at once (exit 1). */
static void test_clean_stop(void) {
    if (start_server("--slots 5 --ctx 4096 --threads 1 --max-tokens 4000 --timeout 20") != 0) {
        T_CHECK(0, "dhsa serve for the stop test starts (log %s)", g_log);
        T_SKIP(N_STOP_CHECKS - 1, "the server did not start");
        return;
    }
    enum { RUN = 5, QUEUED = 3 };
    stop_arg a[RUN + QUEUED];
    pthread_t th[RUN + QUEUED];
    memset(a, 0, sizeof a);
    for (int i = 0; i < RUN + QUEUED; i++)
        snprintf(a[i].body, sizeof a[i].body, "{\"prompt\":\"Once upon a time %d\",\"max_tokens\":3900,\"ignore_eos\":true,"
                 "\"seed\":%d%s}", i, i, i < RUN || i % 2 ? ",\"stream\":true" : "");
    for (int i = 0; i < RUN; i++) pthread_create(&th[i], NULL, stop_client, &a[i]);
    int started = 0;
    for (double t0 = dhsa_cli_now_test(); started < RUN && dhsa_cli_now_test() - t0 < 30; usleep(10000)) {
        started = 0;
        for (int i = 0; i < RUN; i++) started += __atomic_load_n(&a[i].started, __ATOMIC_SEQ_CST);
    }
    for (int i = RUN; i < RUN + QUEUED; i++) pthread_create(&th[i], NULL, stop_client, &a[i]);
    long queued = -1;
    for (double t0 = dhsa_cli_now_test(); queued != QUEUED && dhsa_cli_now_test() - t0 < 10; usleep(10000))
        queued = health_queued();
    kill(g_pid, SIGTERM);
    usleep(200000);
    int fd = connect_server();
    T_CHECK(fd < 0, "a connection after SIGTERM is refused (%s)", fd < 0 ? strerror(errno) : "accepted");
    if (fd >= 0) close(fd);
    for (int i = 0; i < RUN + QUEUED; i++) pthread_join(th[i], NULL);
    int rc = wait_exit(40);
    int streams_ok = 0, queued_ok = 0;
    for (int i = 0; i < RUN + QUEUED; i++) {
        const char *b = a[i].resp ? body_of(a[i].resp) : "";
        size_t bl = strlen(b);
        int ok;
        if (i < RUN) {
            const char *done = strstr(b, "data: [DONE]\n\n");
            const char *err = strstr(b, "data: {\"error\":{\"message\":");
            char fin[32] = "";
            finish_of(a[i].resp, fin, sizeof fin);
            ok = a[i].code == 200 && done && done + 14 == b + bl && (err || fin[0]);
            streams_ok += ok;
        } else {
            ok = a[i].code == 503 && strstr(b, "{\"error\":{\"message\":\"the server is shutting down\"");
            queued_ok += ok;
        }
        if (!ok)
            fprintf(stderr, "  request %d (%s): %d ...%s\n", i, i < RUN ? "streaming" : "queued", a[i].code,
                    bl > 300 ? b + bl - 300 : b);
        free(a[i].resp);
    }
    printf("test_serve: SIGTERM with %d streams running and %ld queued: %d streams ended with an error event and "
           "[DONE], %d queued answered 503, exit %d\n", RUN, queued, streams_ok, queued_ok, rc);
    T_CHECK(queued == QUEUED && streams_ok == RUN, "SIGTERM during %d streams: each ends with an error event and "
            "data: [DONE] (%d did; %ld requests were queued)", RUN, streams_ok, queued);
    T_CHECK(queued_ok == QUEUED, "SIGTERM: the %d queued requests get a 503 with an error object (%d did)", QUEUED,
            queued_ok);
    T_CHECK(rc == 0, "SIGTERM: the server exits 0 after them (%d)", rc);
    unlink(g_log);

    /* a second signal while the drain waits for a body that never comes */
    if (start_server("--slots 1 --ctx 512 --threads 1 --timeout 20") != 0) {
        T_CHECK(0, "dhsa serve for the second-signal test starts");
        T_SKIP(1, "the server did not start");
        return;
    }
    fd = connect_server();
    const char *partial = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\":";
    if (fd >= 0) send_all(fd, partial, strlen(partial));
    usleep(200000);
    kill(g_pid, SIGTERM);
    int rc1 = wait_exit(1.0); /* still draining: the request is not done */
    double t0 = dhsa_cli_now_test();
    if (g_pid > 0) kill(g_pid, SIGTERM);
    int rc2 = g_pid > 0 ? wait_exit(10) : rc1;
    double took = dhsa_cli_now_test() - t0;
    if (fd >= 0) close(fd);
    T_CHECK(rc1 == -1 && rc2 == 1 && took < 5, "a second signal stops at once: still draining after 1 s (%d), then "
            "exit %d %.2f s after the second", rc1, rc2, took);
    if (g_pid > 0) stop_server(5);
    unlink(g_log);
}

/* ------------------------------------------------------ connections --- */

/* GET /health on a new connection, retried every 100 ms (a refused or
 * closed connection is retried) until it is answered 200 or secs pass.
 * Returns the seconds it took, or -1. */
static double health_within(double secs) {
    double t0 = dhsa_cli_now_test();
    while (dhsa_cli_now_test() - t0 < secs) {
        char *r = NULL;
        int code = http_raw("GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 53, &r, 0);
        free(r);
        if (code == 200) return dhsa_cli_now_test() - t0;
        usleep(100000);
    }
    return -1;
}

/* Issue 34: 140 idle TCP connections (the limit 128) locked every other
 * client out for 59 s, until libmicrohttpd's idle timeout. Now, while the
 * server is full, the connection idle the longest (1 s at least) is closed
 * for a new one: a client gets its answer within a few seconds; a running
 * stream is never the one closed; --max-connections-per-ip does the same
 * within one address. */
static void test_connections(void) {
    if (start_server("--slots 1 --ctx 1024 --threads 1 --max-connections 16 --timeout 30") != 0) {
        T_CHECK(0, "dhsa serve --max-connections 16 starts (log %s)", g_log);
        T_SKIP(N_CONN_CHECKS - 1, "the server did not start");
        return;
    }
    /* a long stream first: it must survive the flood */
    stop_arg st;
    memset(&st, 0, sizeof st);
    snprintf(st.body, sizeof st.body, "{\"prompt\":\"Once upon a time\",\"max_tokens\":900,\"ignore_eos\":true,"
             "\"temperature\":0,\"stream\":true,\"stream_options\":{\"include_usage\":true}}");
    pthread_t sth;
    pthread_create(&sth, NULL, stop_client, &st);
    for (int i = 0; i < 500 && !__atomic_load_n(&st.started, __ATOMIC_SEQ_CST); i++) usleep(10000);
    enum { IDLE = 24 };
    int fds[IDLE];
    for (int i = 0; i < IDLE; i++) fds[i] = connect_server();
    usleep(200000);
    double took = health_within(10);
    printf("test_serve: %d idle connections against --max-connections 16: a client answered after %.2f s\n", IDLE, took);
    T_CHECK(took >= 0 && took < 5, "%d idle connections (limit 16) do not lock a client out: answered after %.2f s",
            IDLE, took);
    double evicted = metric("dhsa_connections_evicted_total");
    T_CHECK(evicted >= 1, "metrics count the idle connections closed for new ones (%g)", evicted);
    /* a second wave, while the stream runs */
    int fds2[IDLE];
    for (int i = 0; i < IDLE; i++) fds2[i] = connect_server();
    took = health_within(10);
    pthread_join(sth, NULL);
    T_CHECK(took >= 0 && st.code == 200 && st.resp && strstr(st.resp, "data: [DONE]") &&
                strstr(st.resp, "\"completion_tokens\":900"),
            "a running stream is not closed for new connections: %d, 900 tokens and [DONE]: %s; a client answered "
            "after %.2f s", st.code, st.resp && strstr(st.resp, "\"completion_tokens\":900") ? "yes" : "no", took);
    free(st.resp);
    for (int i = 0; i < IDLE; i++) {
        if (fds[i] >= 0) close(fds[i]);
        if (fds2[i] >= 0) close(fds2[i]);
    }
    stop_server(20);
    unlink(g_log);
    if (start_server("--slots 1 --ctx 512 --threads 1 --max-connections-per-ip 4 --timeout 30") != 0) {
        T_CHECK(0, "dhsa serve --max-connections-per-ip 4 starts");
        return;
    }
    for (int i = 0; i < 8; i++) fds[i] = connect_server();
    usleep(200000);
    took = health_within(10);
    T_CHECK(took >= 0 && took < 5 && metric("dhsa_connections_evicted_total") >= 1,
            "8 idle connections of one address (--max-connections-per-ip 4): a client of it answered after %.2f s", took);
    for (int i = 0; i < 8; i++)
        if (fds[i] >= 0) close(fds[i]);
    stop_server(20);
    unlink(g_log);
}
#endif

int main(void) {
    signal(SIGPIPE, SIG_IGN);
#ifdef DHSA_HAVE_SERVE
    test_parser();
    test_json_cost();
    if (!getenv("DHSA_CLI")) T_SKIP(N_HTTP_CHECKS + N_LEAK_CHECKS + N_MEM_CHECKS + N_STOP_CHECKS + N_CONN_CHECKS, "DHSA_CLI is not set (tests/run.sh sets it): no server to start");
    else {
        test_http();
        test_no_leaks();
        test_mem_limit();
        test_clean_stop();
        test_connections();
    }
#else
    T_SKIP(N_PARSER_CHECKS + N_HTTP_CHECKS + N_LEAK_CHECKS + N_MEM_CHECKS + N_STOP_CHECKS + N_CONN_CHECKS - 1,
           "built without libmicrohttpd and jansson (apt-get install libmicrohttpd-dev libjansson-dev pkg-config; "
           ".ci/run does): no dhsa serve to test");
    char *o = NULL;
    int rc = getenv("DHSA_CLI") ? cli_run("serve", 0, &o) : -2;
    T_CHECK(rc == 1 && o && strstr(o, "libmicrohttpd") && strstr(o, "jansson"),
            "dhsa serve refuses, naming the packages it needs (exit %d): %s", rc, o ? o : "");
    free(o);
    (void)dhsa_cli_now_test;
#endif
    return t_report("test_serve");
}
