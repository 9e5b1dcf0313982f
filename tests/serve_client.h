/* serve_client.h: the HTTP client and the server control that the
 * loopback tests of `dhsa serve` share (tests/test_serve.c,
 * tests/test_serve_limits.c): a raw HTTP/1.1 client on 127.0.0.1 (bodies,
 * chunked replies, SSE text, a few JSON fields read by hand so that the
 * test does not trust the server's own JSON library), and starting and
 * stopping `dhsa serve` from $DHSA_CLI on a free port. Every function is
 * `static inline`: a test uses the part it needs.
 */
#ifndef DHSA_TESTS_SERVE_CLIENT_H
#define DHSA_TESTS_SERVE_CLIENT_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* seconds, monotonic (the tests do not link tools/cli_base.c) */
static inline double dhsa_cli_now_test(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ------------------------------------------------------------ client --- */

static int g_port;

static inline int connect_server(void) {
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

static inline int send_all(int fd, const char *p, size_t n) {
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
static inline void dechunk(char *resp) {
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
static inline int http_raw(const char *req, size_t req_len, char **out, size_t stop_after) {
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

static inline int http(const char *method, const char *path, const char *body, char **out) {
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

static inline const char *body_of(const char *resp) {
    const char *b = resp ? strstr(resp, "\r\n\r\n") : NULL;
    return b ? b + 4 : "";
}

/* The string value of "key":"..." in s (first one), unescaped for the
 * simple escapes; "" when absent. */
static inline void json_str(const char *s, const char *key, char *out, size_t cap) {
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

static inline long json_int(const char *s, const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = s ? strstr(s, pat) : NULL;
    return p ? strtol(p + strlen(pat), NULL, 10) : -1;
}

/* The concatenated "text" (or "content") of every SSE data line. */
static inline void sse_text(const char *resp, const char *key, char *out, size_t cap) {
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
static inline int start_server(const char *args) {
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
static inline int stop_server(int secs) {
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

static inline long slots_busy(void) {
    char *r;
    int code = http("GET", "/health", NULL, &r);
    long b = code == 200 ? json_int(body_of(r), "slots_busy") : -1;
    free(r);
    return b;
}

static inline double metric(const char *name) {
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

/* The finish_reason of a reply (the last one of a stream) into out. */
static inline void finish_of(const char *resp, char *out, size_t cap) {
    const char *f = NULL;
    for (const char *p = strstr(body_of(resp), "\"finish_reason\":\""); p; p = strstr(p + 1, "\"finish_reason\":\""))
        f = p;
    snprintf(out, cap, "%s", "");
    if (f) sscanf(f + 17, "%31[a-z]", out);
}

#endif
