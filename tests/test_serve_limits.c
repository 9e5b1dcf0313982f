/* test_serve_limits.c: the limits of `dhsa serve` (tools/serve/,
 * docs/server.md) over loopback, the server started from the built CLI on
 * a free port with the default model (tests/serve_client.h; what a client
 * asks of the server is tests/test_serve.c).
 *
 * Part 1, nothing leaks between clients (issue 34), on --slots 1, 4
 * (batched) and 3 (--batch off): every form of an empty prompt right after
 * another client's request is a 400 (it was sampled from that request's
 * logits), and 24 concurrent clients with their own secrets, sharing a
 * cached prefix, never see another's.
 * Part 2, --mem-limit (skipped under sanitizers): 8 concurrent 7 MB
 * bodies under --mem-limit 64M leave the server's VmHWM under 64 MiB,
 * each answered 4xx / 503; a 1 TiB Content-Length is a 413 unread.
 * Part 3, a clean stop: SIGTERM during 5 streams and 3 queued requests
 * (error event + [DONE] each, 503 each, exit 0, connects refused), and a
 * second signal ending the drain at once.
 * Part 4, connections: idle ones beyond --max-connections (and
 * --max-connections-per-ip) do not lock a client out; a running stream is
 * never the one closed.
 * Without libmicrohttpd and jansson every part skips, saying so
 * (tests/test_serve checks that `dhsa serve` then refuses).
 *
 * Run: make build/tests/test_serve_limits && DHSA_CLI=build/dhsa build/tests/test_serve_limits
 * (from the repository root). Ends with "test_serve_limits: P passed, F failed, S skipped".
 */
#include "dhsa.h"
#include "t.h"
#include "cli_run.h"

#include <errno.h>
#include <math.h>
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

#define N_LEAK_CHECKS 15 /* 5 per server */
#define N_MEM_CHECKS 6
#define N_STOP_CHECKS 5
#define N_CONN_CHECKS 4

#ifdef DHSA_HAVE_SERVE
#include "serve_client.h"

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
    if (!getenv("DHSA_CLI"))
        T_SKIP(N_LEAK_CHECKS + N_MEM_CHECKS + N_STOP_CHECKS + N_CONN_CHECKS,
               "DHSA_CLI is not set (tests/run.sh sets it): no server to start");
    else {
        test_no_leaks();
        test_mem_limit();
        test_clean_stop();
        test_connections();
    }
#else
    T_SKIP(N_LEAK_CHECKS + N_MEM_CHECKS + N_STOP_CHECKS + N_CONN_CHECKS,
           "built without libmicrohttpd and jansson (apt-get install libmicrohttpd-dev libjansson-dev pkg-config; "
           ".ci/run does): no dhsa serve to test");
#endif
    return t_report("test_serve_limits");
}
