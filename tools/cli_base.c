/* cli_base.c: what every dhsa subcommand shares (declared in tools/cli.h):
 * the message prefix and exit on an error, the monotonic timer, medians,
 * byte sizes for humans, and number and list options that exit with a
 * usage error naming the option. One copy for all tools (no subcommand
 * keeps its own die/now/median/parse).
 * Tested through the CLI by tests/test_cli.c and tests/test_cli_promises.c.
 */
#include "cli.h"
#include "core/internal.h"
#include "dist.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *cmd_name; /* NULL: the top level, "dhsa: ..." */
static const char *after_usage;

void dhsa_cli_set_command(const char *name, const char *after_usage_error) {
    cmd_name = name;
    after_usage = after_usage_error;
}

const char *dhsa_cli_command(void) { return cmd_name ? cmd_name : ""; }

/* The line of dhsa_cli_format_line, from a va_list. */
static size_t format_vline(char *buf, size_t cap, const char *fmt, va_list ap) {
    if (cap < 8) return 0;
    int k = cmd_name ? snprintf(buf, cap, "dhsa %s: ", cmd_name) : snprintf(buf, cap, "dhsa: ");
    size_t n = k > 0 && (size_t)k < cap ? (size_t)k : 0;
    if (dhsa_cli_dist_size() > 1) {
        k = snprintf(buf + n, cap - n, "rank %d of %d: ", dhsa_cli_dist_rank(), dhsa_cli_dist_size());
        if (k > 0 && (size_t)k < cap - n) n += (size_t)k;
    }
    k = vsnprintf(buf + n, cap - n, fmt, ap);
    if (k < 0) k = 0;
    if ((size_t)k >= cap - n - 1) { /* cut: end with "...", room kept for the newline */
        n = cap - 5;
        memcpy(buf + n, "...", 3);
        n += 3;
    } else {
        n += (size_t)k;
    }
    buf[n++] = '\n';
    buf[n] = 0;
    return n;
}

size_t dhsa_cli_format_line(char *buf, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    size_t n = format_vline(buf, cap, fmt, ap);
    va_end(ap);
    return n;
}

/* One write(2) of the whole line: mpirun forwards each rank's stderr as
 * it comes, so a line written in pieces can be cut by another rank's. A
 * line of at most PIPE_BUF bytes is written to a pipe at once. */
static void write_line(const char *buf, size_t n) {
    fflush(stderr); /* what came before stays before */
    while (n > 0) {
        ssize_t w = write(2, buf, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        buf += w;
        n -= (size_t)w;
    }
}

void dhsa_cli_error_line(const char *fmt, ...) {
    char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    size_t n = format_vline(buf, sizeof buf, fmt, ap);
    va_end(ap);
    write_line(buf, n);
}

void dhsa_cli_die(int code, const char *fmt, ...) {
    char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    size_t n = format_vline(buf, sizeof buf, fmt, ap);
    va_end(ap);
    write_line(buf, n);
    /* the usage text once, not once per rank */
    if (code == DHSA_EXIT_USAGE && after_usage && dhsa_cli_dist_rank() == 0) fprintf(stderr, "\n%s", after_usage);
    exit(code);
}

void dhsa_cli_die_lib(const char *what) {
    char msg[600];
    snprintf(msg, sizeof msg, "%s", dhsa_last_error());
    if (what) dhsa_cli_die(DHSA_EXIT_RUN, "%s: %s", what, msg);
    dhsa_cli_die(DHSA_EXIT_RUN, "%s", msg);
}

double dhsa_cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double dhsa_cli_median(double *v, int n) {
    if (n <= 0) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

const char *dhsa_cli_bytes(double b, char *buf, size_t cap) {
    static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    if (!isfinite(b)) {
        snprintf(buf, cap, "-");
        return buf;
    }
    const char *sign = b < 0 ? "-" : "";
    b = fabs(b);
    int u = 0;
    while (b >= 1024.0 && u < 5) {
        b /= 1024.0;
        u++;
    }
    if (u == 0) snprintf(buf, cap, "%s%.0f B", sign, b);
    else snprintf(buf, cap, "%s%.*f %s", sign, b < 10 ? 2 : b < 100 ? 1 : 0, b, unit[u]);
    return buf;
}

static const char *const chunk_scores[] = {"pooled", "moments", "heads", "bound", "rows"};

int dhsa_cli_chunk_score(const char *opt, const char *s) {
    for (int i = 0; i < 5; i++)
        if (strcmp(s, chunk_scores[i]) == 0) return i;
    dhsa_cli_die(DHSA_EXIT_USAGE, "%s takes pooled, moments, heads, bound or rows, not \"%s\"", opt, s);
    return -1;
}

const char *dhsa_cli_chunk_score_name(int score) {
    return score >= 0 && score < 5 ? chunk_scores[score] : "?";
}

int dhsa_cli_online_cpus(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 && n < 1 << 20 ? (int)n : 1;
}

int dhsa_cli_threads(const char *opt, const char *s) {
    int64_t n = dhsa_cli_int(opt, s, 1, 1024, 0);
    const int cpus = dhsa_cli_online_cpus();
    if (n > cpus) {
        dhsa_cli_error_line("warning: %s %lld is above the %d online CPUs: using %d (more threads than CPUs only "
                            "wait for each other; results do not depend on the count)", opt, (long long)n, cpus, cpus);
        n = cpus;
    }
    return (int)n;
}

int64_t dhsa_cli_int(const char *opt, const char *s, int64_t min, int64_t max, int suffix) {
    int64_t v;
    char msg[256];
    if (dhsa_cli_parse_int(opt, s, min, max, suffix, &v, msg, sizeof msg)) dhsa_cli_die(DHSA_EXIT_USAGE, "%s", msg);
    return v;
}

double dhsa_cli_real(const char *opt, const char *s, double min, double max) {
    double v;
    char msg[256];
    if (dhsa_cli_parse_real(opt, s, min, max, &v, msg, sizeof msg)) dhsa_cli_die(DHSA_EXIT_USAGE, "%s", msg);
    return v;
}

int dhsa_cli_split_list(const char *opt, const char *s, char *buf, size_t cap, char **items, int max) {
    if (!s[0]) dhsa_cli_die(DHSA_EXIT_USAGE, "%s is empty: give one value or a comma list", opt);
    if (strlen(s) >= cap) dhsa_cli_die(DHSA_EXIT_USAGE, "%s: the list is longer than %zu characters", opt, cap - 1);
    memcpy(buf, s, strlen(s) + 1);
    int n = 0;
    for (char *p = buf;;) {
        char *c = strchr(p, ',');
        if (c) *c = 0;
        if (!*p) dhsa_cli_die(DHSA_EXIT_USAGE, "%s: empty item in \"%s\"", opt, s);
        if (n == max) dhsa_cli_die(DHSA_EXIT_USAGE, "%s: at most %d items", opt, max);
        items[n++] = p;
        if (!c) break;
        p = c + 1;
    }
    return n;
}

int dhsa_cli_int_list(const char *opt, const char *s, int64_t min, int64_t max_value, int suffix, int64_t *out,
                      int max) {
    char buf[1024], *items[256];
    int n = dhsa_cli_split_list(opt, s, buf, sizeof buf, items, max < 256 ? max : 256);
    for (int i = 0; i < n; i++) out[i] = dhsa_cli_int(opt, items[i], min, max_value, suffix);
    return n;
}

int dhsa_cli_real_list(const char *opt, const char *s, double min, double max_value, double *out, int max) {
    char buf[1024], *items[256];
    int n = dhsa_cli_split_list(opt, s, buf, sizeof buf, items, max < 256 ? max : 256);
    for (int i = 0; i < n; i++) out[i] = dhsa_cli_real(opt, items[i], min, max_value);
    return n;
}

size_t dhsa_cli_print_escaped(const char *s, int64_t n, unsigned flags) {
    size_t need = dhsa__escape(NULL, 0, s, (size_t)n, flags);
    char small[256], *buf = need < sizeof small ? small : malloc(need + 1);
    if (!buf) dhsa_cli_die(DHSA_EXIT_RUN, "out of memory");
    dhsa__escape(buf, need + 1, s, (size_t)n, flags);
    fwrite(buf, 1, need, stdout);
    if (buf != small) free(buf);
    return need;
}

/* ------------------------------------------------------------ routing --- */

void dhsa_cli_router_unset(dhsa_router_params *rp) {
    dhsa_router_params u = dhsa_router_params_for(0, rp->density); /* the scaled fields unset (-1) */
    rp->q_block = u.q_block;
    rp->sink_tokens = u.sink_tokens;
    rp->local_tokens = u.local_tokens;
    rp->dense_below = u.dense_below;
    rp->min_chunk = u.min_chunk;
    rp->max_chunk = u.max_chunk;
    rp->chunk = u.chunk;
    rp->nms_window = u.nms_window;
    rp->score_rows = u.score_rows;
    rp->sink_window = u.sink_window;
    rp->score_mode = (dhsa_chunk_score)-1;
    rp->carry = -1;
    rp->exact_rows = -1;
    rp->rest = DHSA_CLI_REST_UNSET;
    rp->hybrid_max_chunk = -1;
}

int64_t dhsa_cli_rest(const char *opt, const char *v) {
    return v && strcmp(v, "hybrid") == 0 ? DHSA_REST_HYBRID : dhsa_cli_int(opt, v, 0, DHSA_REST_MAX, 0);
}

const char *dhsa_cli_rest_text(int64_t rest, char *buf, size_t cap) {
    if (rest == DHSA_REST_HYBRID) return "hybrid";
    snprintf(buf, cap, "%lld", (long long)rest);
    return buf;
}

void dhsa_cli_router_fill(dhsa_router_params *rp, int64_t L, double density) {
    if ((int)rp->score_mode < 0) rp->score_mode = dhsa_router_params_for(0, density).score_mode;
    if (rp->carry < 0) rp->carry = dhsa_router_params_for(0, density).carry;
    if (rp->exact_rows < 0) rp->exact_rows = dhsa_router_params_for(0, density).exact_rows;
    if (rp->rest == DHSA_CLI_REST_UNSET) rp->rest = dhsa_router_params_for(0, density).rest;
    if (rp->hybrid_max_chunk < 0) rp->hybrid_max_chunk = dhsa_router_params_for(0, density).hybrid_max_chunk;
    rp->density = density;
    dhsa_router_scale(rp, L);
}

void dhsa_cli_print_router(FILE *f, const dhsa_router_params *rp, int64_t L) {
    char rest[24];
    fprintf(f, "routing at L = %lld: q_block %lld, sink %lld, local %lld, dense_below %lld, min_chunk %lld, "
            "max_chunk %lld, block chunk %lld, sim_window %lld, nms_window %lld, score %s, score_rows %lld, sink_window %lld, carry %g, exact_rows %lld, rest %s, hybrid_max_chunk %lld\n",
            (long long)L, (long long)rp->q_block, (long long)rp->sink_tokens, (long long)rp->local_tokens,
            (long long)rp->dense_below, (long long)rp->min_chunk, (long long)rp->max_chunk, (long long)rp->chunk,
            (long long)rp->sim_window, (long long)rp->nms_window, dhsa_cli_chunk_score_name(rp->score_mode),
            (long long)rp->score_rows, (long long)rp->sink_window, rp->carry, (long long)rp->exact_rows,
            dhsa_cli_rest_text(rp->rest, rest, sizeof rest), (long long)rp->hybrid_max_chunk);
}

/* ------------------------------------------------------------ chat format --- */

dhsa_chat_template dhsa_cli_chat_template(const dhsa_gguf *g, const char *name, const char **how) {
    dhsa_chat_template t = DHSA_CHAT_NONE;
    if (name && strcmp(name, "plain") == 0) {
        *how = "--template plain: no chat template";
        return DHSA_CHAT_NONE;
    }
    if (name) {
        if (dhsa_chat_template_from_name(name, &t)) dhsa_cli_die(DHSA_EXIT_USAGE, "%s", dhsa_last_error());
        *how = "--template";
        return t;
    }
    if (dhsa_chat_choose(g, &t, how)) dhsa_cli_die(DHSA_EXIT_RUN, "%s", dhsa_last_error());
    return t;
}
