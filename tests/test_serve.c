/* test_serve.c: `dhsa serve` (tools/serve/, docs/server.md): the request
 * parser, and the server over loopback for what a client asks of it.
 * Its limits (nothing leaks between clients, --mem-limit, the clean stop,
 * connections) are tests/test_serve_limits.c; the HTTP client and the
 * server control both use are tests/serve_client.h.
 *
 * Part 1, the request parser (tools/serve/request.c) without a socket: a table
 * of good bodies and what they parse to, and bad ones with the parameter
 * the 400 must name; serve_json_cost bounds jansson's allocations for
 * seven shapes of body.
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

#define N_PARSER_CHECKS 68
#define N_HTTP_CHECKS 67

#ifdef DHSA_HAVE_SERVE
#include "serve.h"
#include "serve_client.h"

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
 * either way; a stop string ends a streamed reply in a batch as alone.
 * The sampled prompts share no prefix beyond the BOS with each other or
 * with the greedy one: a slot's prompt cache would serve a prompt whole
 * (or in part) when another ran before it on that slot, which depends on
 * timing when they run at once, and such a split of a prompt into evals
 * may differ from a cold prefill in the last bits (docs/server.md, the
 * prompt cache): "The pass key is" served from PK's cache did, at
 * temperature 1.0, on the AVX-512 VM of 2026-12-06. */
static void test_concurrent_seeds(const char *want, const char *stop) {
    enum { N = 5 };
    req_arg alone[N], together[N];
    memset(alone, 0, sizeof alone);
    snprintf(alone[0].body, sizeof alone[0].body,
             "{\"prompt\":\"Once upon a time\",\"max_tokens\":24,\"temperature\":0.9,\"seed\":11}");
    snprintf(alone[1].body, sizeof alone[1].body,
             "{\"prompt\":\"Long ago in a quiet town\",\"max_tokens\":24,\"temperature\":0.9,\"seed\":12,"
             "\"presence_penalty\":0.8,\"frequency_penalty\":0.6,\"stream\":true}");
    alone[1].stream = 1;
    snprintf(alone[2].body, sizeof alone[2].body,
             "{\"prompt\":\"Remember the number 40913 well.\",\"max_tokens\":24,\"temperature\":0.8,\"top_k\":0,\"seed\":13,"
             "\"repeat_penalty\":1.3}");
    snprintf(alone[3].body, sizeof alone[3].body,
             "{\"prompt\":\"Here is a pass key\",\"max_tokens\":24,\"temperature\":1.0,\"seed\":14,\"stream\":true}");
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
    char req[1024 + 128]; /* a body of up to 1023 bytes after the request line and headers */
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

#endif

int main(void) {
    signal(SIGPIPE, SIG_IGN);
#ifdef DHSA_HAVE_SERVE
    test_parser();
    test_json_cost();
    if (!getenv("DHSA_CLI")) T_SKIP(N_HTTP_CHECKS, "DHSA_CLI is not set (tests/run.sh sets it): no server to start");
    else test_http();
#else
    T_SKIP(N_PARSER_CHECKS + N_HTTP_CHECKS - 1,
           "built without libmicrohttpd and jansson (apt-get install libmicrohttpd-dev libjansson-dev pkg-config; "
           ".ci/run does): no dhsa serve to test");
    char *o = NULL;
    int rc = getenv("DHSA_CLI") ? cli_run("serve", 0, &o) : -2;
    T_CHECK(rc == 1 && o && strstr(o, "libmicrohttpd") && strstr(o, "jansson"),
            "dhsa serve refuses, naming the packages it needs (exit %d): %s", rc, o ? o : "");
    free(o);
#endif
    return t_report("test_serve");
}
