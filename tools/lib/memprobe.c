/* memprobe.c: the memory probe's library side (contract in memprobe.h;
 * the method and the verdict rules are explained in docs/memprobe.md).
 *
 * Running: fork, then in the child setpgid, stdin from /dev/null,
 * stdout+stderr into a pipe, execvp. A second pipe, close-on-exec, carries
 * errno back if exec fails, so "not found" is told apart from a command
 * that exits 127. The parent polls: wait4(WNOHANG) for the end, the output
 * pipe for text, /proc/PID/status for VmHWM every sample period, and the
 * clock for the time limit.
 *
 * Fitting: peak = a*n^2 + b*n + c by least squares on scaled data with
 * Householder QR; the log-log slope by an ordinary line fit of
 * ln(peak - baseline) on ln(n).
 * Tested by tests/test_memprobe.c.
 */
#include "lib/memprobe.h"

#include "core/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------ helpers --- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const char *dhsa_memprobe_state_name(dhsa_memprobe_state s) {
    switch (s) {
    case DHSA_MEMPROBE_OK: return "ok";
    case DHSA_MEMPROBE_EXIT: return "exit";
    case DHSA_MEMPROBE_SIGNAL: return "signal";
    case DHSA_MEMPROBE_TIMEOUT: return "timeout";
    case DHSA_MEMPROBE_EXEC_FAILED: return "exec-failed";
    case DHSA_MEMPROBE_SKIPPED: return "skipped";
    }
    return "unknown";
}

const char *dhsa_memprobe_signal_name(int sig) {
    static const struct {
        int sig;
        const char *name;
    } names[] = {
        {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
        {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
        {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"}, {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
        {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"}, {SIGCHLD, "SIGCHLD"},
        {SIGCONT, "SIGCONT"}, {SIGSTOP, "SIGSTOP"}, {SIGTSTP, "SIGTSTP"}, {SIGTTIN, "SIGTTIN"},
        {SIGTTOU, "SIGTTOU"}, {SIGXCPU, "SIGXCPU"}, {SIGXFSZ, "SIGXFSZ"}, {SIGSYS, "SIGSYS"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (names[i].sig == sig) return names[i].name;
    static char other[24];
    snprintf(other, sizeof other, "SIG%d", sig);
    return other;
}

/* ------------------------------------------------------- running one --- */

/* The process group of the command running now (0 = none), for signal
 * handlers. */
static volatile sig_atomic_t running_pgid;

void dhsa_memprobe_forward_signal(int sig) {
    pid_t g = (pid_t)running_pgid;
    if (g > 0) kill(-g, sig);
}

dhsa_memprobe_run_params dhsa_memprobe_default_run_params(void) {
    dhsa_memprobe_run_params p;
    memset(&p, 0, sizeof p);
    p.timeout_s = 0.0;
    p.grace_s = 5.0;
    p.sample_s = 0.01;
    p.forward_output = 0;
    return p;
}

/* VmHWM of a live process in bytes; 0 if it cannot be read (no /proc, the
 * process has exited or is a zombie, no such line). */
static uint64_t read_vmhwm(pid_t pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%ld/status", (long)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[256];
    uint64_t kb = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "VmHWM:", 6) == 0) {
            unsigned long long v = 0;
            if (sscanf(line + 6, "%llu", &v) == 1) kb = v;
            break;
        }
    }
    fclose(f);
    return kb * 1024;
}

/* Keeps the last bytes of the output in r->tail. */
static void tail_append(dhsa_memprobe_result *r, const char *buf, size_t n) {
    const size_t cap = DHSA_MEMPROBE_TAIL - 1;
    size_t have = strlen(r->tail);
    if (n >= cap) {
        memcpy(r->tail, buf + (n - cap), cap);
        r->tail[cap] = '\0';
        r->tail_truncated = 1;
        return;
    }
    if (have + n > cap) {
        size_t drop = have + n - cap;
        memmove(r->tail, r->tail + drop, have - drop);
        have -= drop;
        r->tail_truncated = 1;
    }
    memcpy(r->tail + have, buf, n);
    r->tail[have + n] = '\0';
}

/* Reads what the pipe holds now (non-blocking). Returns 0 at end of file
 * (the caller closes it), 1 otherwise. NUL bytes in the output become
 * spaces so the tail stays one C string. */
static int drain_output(int fd, dhsa_memprobe_result *r, int forward) {
    char buf[4096];
    for (;;) {
        ssize_t k = read(fd, buf, sizeof buf);
        if (k > 0) {
            if (forward) {
                ssize_t done = 0;
                while (done < k) {
                    ssize_t w = write(STDERR_FILENO, buf + done, (size_t)(k - done));
                    if (w < 0 && errno == EINTR) continue;
                    if (w <= 0) break;
                    done += w;
                }
            }
            for (ssize_t i = 0; i < k; i++)
                if (buf[i] == '\0') buf[i] = ' ';
            tail_append(r, buf, (size_t)k);
            continue;
        }
        if (k == 0) return 0;
        if (errno == EINTR) continue;
        return 1; /* EAGAIN: nothing more now (or an error: try again later) */
    }
}

static int set_cloexec(int fd) {
    int fl = fcntl(fd, F_GETFD);
    return fl < 0 ? -1 : fcntl(fd, F_SETFD, fl | FD_CLOEXEC);
}

dhsa_status dhsa_memprobe_run(char *const argv[], const dhsa_memprobe_run_params *pp,
                              dhsa_memprobe_result *r) {
    memset(r, 0, sizeof *r);
    r->state = DHSA_MEMPROBE_EXEC_FAILED;
    dhsa_memprobe_run_params p = pp ? *pp : dhsa_memprobe_default_run_params();
    if (!argv || !argv[0] || !argv[0][0])
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "memprobe: no command to run");
    if (!(p.timeout_s >= 0) || !(p.grace_s >= 0) || !(p.sample_s >= 0) || isinf(p.grace_s) ||
        isinf(p.sample_s))
        return dhsa__fail(DHSA_ERR_INVALID_ARG,
                          "memprobe: timeout %g s, grace %g s, sample period %g s: each must "
                          "be >= 0 (grace and period finite)",
                          p.timeout_s, p.grace_s, p.sample_s);
    if (p.sample_s == 0) p.sample_s = 0.01;

    int out[2] = {-1, -1}, err[2] = {-1, -1};
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull < 0 || pipe(out) != 0 || pipe(err) != 0 || set_cloexec(devnull) ||
        set_cloexec(out[0]) || set_cloexec(out[1]) || set_cloexec(err[0]) ||
        set_cloexec(err[1])) {
        int e = errno;
        if (devnull >= 0) close(devnull);
        for (int i = 0; i < 2; i++) {
            if (out[i] >= 0) close(out[i]);
            if (err[i] >= 0) close(err[i]);
        }
        return dhsa__fail(DHSA_ERR_IO, "memprobe: cannot set up pipes: %s", strerror(e));
    }

    double t0 = now_s();
    pid_t pid = fork();
    if (pid == 0) {
        /* The child: only async-signal-safe calls until exec. */
        setpgid(0, 0);
        dup2(devnull, STDIN_FILENO);
        dup2(out[1], STDOUT_FILENO);
        dup2(out[1], STDERR_FILENO);
        execvp(argv[0], argv);
        int e = errno;
        if (write(err[1], &e, sizeof e) < 0) _exit(127);
        _exit(127);
    }
    int fork_errno = errno;
    close(devnull);
    close(out[1]);
    close(err[1]);
    if (pid < 0) {
        close(out[0]);
        close(err[0]);
        return dhsa__fail(DHSA_ERR_IO, "memprobe: fork failed: %s", strerror(fork_errno));
    }
    setpgid(pid, pid); /* also here, so that the group exists before any kill */
    running_pgid = (sig_atomic_t)pid;

    /* Blocks until exec succeeded (the pipe closes on exec: EOF) or failed. */
    int exec_errno = 0;
    ssize_t k;
    do {
        k = read(err[0], &exec_errno, sizeof exec_errno);
    } while (k < 0 && errno == EINTR);
    close(err[0]);
    if (k == (ssize_t)sizeof exec_errno) {
        int st;
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
        running_pgid = 0;
        close(out[0]);
        r->exit_code = exec_errno;
        r->wall_s = now_s() - t0;
        return dhsa__fail(DHSA_ERR_IO, "cannot run \"%s\": %s", argv[0], strerror(exec_errno));
    }

    int fd = out[0];
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    const double deadline = p.timeout_s > 0 ? t0 + p.timeout_s : INFINITY;
    double term_at = 0.0, next_sample = t0;
    int timed_out = 0, killed = 0, status = 0;
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    dhsa_status result = DHSA_OK;
    for (;;) {
        pid_t w = wait4(pid, &status, WNOHANG, &ru);
        if (w == pid) break;
        if (w < 0 && errno != EINTR) {
            result = dhsa__fail(DHSA_ERR_IO, "memprobe: wait4 failed: %s", strerror(errno));
            kill(-pid, SIGKILL);
            while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
            break;
        }
        double now = now_s();
        if (now >= next_sample) {
            uint64_t hwm = read_vmhwm(pid);
            if (hwm) {
                r->vmhwm_samples++;
                if (hwm > r->vmhwm_bytes) r->vmhwm_bytes = hwm;
            }
            next_sample = now + p.sample_s;
        }
        if (!timed_out && now >= deadline) {
            timed_out = 1;
            term_at = now;
            kill(-pid, SIGTERM);
        }
        if (timed_out && !killed && now >= term_at + p.grace_s) {
            killed = 1;
            kill(-pid, SIGKILL);
        }
        /* Sleep until output comes or the next thing to do. */
        double until = next_sample;
        if (!timed_out && deadline < until) until = deadline;
        if (timed_out && !killed && term_at + p.grace_s < until) until = term_at + p.grace_s;
        int ms = (int)ceil((until - now_s()) * 1e3);
        if (ms < 1) ms = 1;
        if (ms > 100) ms = 100;
        struct pollfd pfd = {fd, POLLIN, 0};
        int pr = poll(&pfd, fd >= 0 ? 1 : 0, ms);
        if (pr > 0 && fd >= 0 && !drain_output(fd, r, p.forward_output)) {
            close(fd);
            fd = -1;
        }
    }
    r->wall_s = now_s() - t0;
    running_pgid = 0;
    if (fd >= 0) { /* what is left; descendants may still hold the pipe */
        drain_output(fd, r, p.forward_output);
        close(fd);
    }
    if (timed_out) kill(-pid, SIGKILL); /* whatever of the group survived */

#if defined(__APPLE__)
    r->ru_maxrss_bytes = (uint64_t)ru.ru_maxrss; /* bytes there */
#else
    r->ru_maxrss_bytes = (uint64_t)ru.ru_maxrss * 1024; /* KiB on Linux */
#endif
    r->peak_bytes = r->ru_maxrss_bytes > r->vmhwm_bytes ? r->ru_maxrss_bytes : r->vmhwm_bytes;
    if (WIFEXITED(status)) r->exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) r->signal = WTERMSIG(status);
    if (timed_out)
        r->state = DHSA_MEMPROBE_TIMEOUT;
    else if (WIFSIGNALED(status))
        r->state = DHSA_MEMPROBE_SIGNAL;
    else
        r->state = r->exit_code == 0 ? DHSA_MEMPROBE_OK : DHSA_MEMPROBE_EXIT;
    return result;
}

/* -------------------------------------------------------- substitution --- */

void dhsa_memprobe_free_argv(char **argv) {
    if (!argv) return;
    for (char **a = argv; *a; a++) free(*a);
    free(argv);
}

dhsa_status dhsa_memprobe_substitute(char *const argv[], int64_t n, char ***out,
                                     int *n_replaced) {
    *out = NULL;
    if (n_replaced) *n_replaced = 0;
    if (!argv) return dhsa__fail(DHSA_ERR_INVALID_ARG, "memprobe: no command");
    char num[32];
    int num_len = snprintf(num, sizeof num, "%lld", (long long)n);
    size_t argc = 0;
    while (argv[argc]) argc++;
    char **res = calloc(argc + 1, sizeof *res);
    if (!res) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "memprobe: out of memory");
    int replaced = 0;
    for (size_t i = 0; i < argc; i++) {
        const char *s = argv[i];
        size_t hits = 0;
        for (const char *q = strstr(s, "{n}"); q; q = strstr(q + 3, "{n}")) hits++;
        size_t len = strlen(s) + hits * (size_t)num_len - hits * 3;
        char *d = malloc(len + 1), *w = d;
        if (!d) {
            dhsa_memprobe_free_argv(res);
            return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "memprobe: out of memory");
        }
        for (const char *q; (q = strstr(s, "{n}")) != NULL; s = q + 3) {
            memcpy(w, s, (size_t)(q - s));
            w += q - s;
            memcpy(w, num, (size_t)num_len);
            w += num_len;
        }
        strcpy(w, s);
        res[i] = d;
        replaced += (int)hits;
    }
    *out = res;
    if (n_replaced) *n_replaced = replaced;
    return DHSA_OK;
}

/* ------------------------------------------------------------- fitting --- */

dhsa_status dhsa_memprobe_fit(const double *x, const double *y, int m, double coef[3]) {
    coef[0] = coef[1] = coef[2] = NAN;
    if (m < 0 || (m > 0 && (!x || !y)))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "memprobe fit: bad input (m = %d)", m);
    double sx = 0.0, sy = 0.0;
    int distinct = 0;
    for (int i = 0; i < m; i++) {
        if (!isfinite(x[i]) || !isfinite(y[i]))
            return dhsa__fail(DHSA_ERR_NONFINITE, "memprobe fit: point %d is (%g, %g)", i, x[i],
                              y[i]);
        if (fabs(x[i]) > sx) sx = fabs(x[i]);
        if (fabs(y[i]) > sy) sy = fabs(y[i]);
        int seen = 0;
        for (int j = 0; j < i && !seen; j++) seen = x[j] == x[i];
        distinct += !seen;
    }
    if (distinct < 3)
        return dhsa__fail(DHSA_ERR_INVALID_ARG,
                          "memprobe fit: a*n^2 + b*n + c needs at least 3 distinct sizes, got %d",
                          distinct);
    if (sy == 0.0) sy = 1.0;

    /* A [m, 3] = [(x/sx)^2, x/sx, 1], rhs [m] = y/sy; reduced in place to
     * R (upper 3x3) and Q^T rhs by three Householder reflections. */
    double *A = malloc((size_t)m * 4 * sizeof *A);
    if (!A) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "memprobe fit: out of memory");
#define AT(i, j) A[(size_t)(i) * 4 + (size_t)(j)] /* column 3 = rhs */
    for (int i = 0; i < m; i++) {
        double t = x[i] / sx;
        AT(i, 0) = t * t;
        AT(i, 1) = t;
        AT(i, 2) = 1.0;
        AT(i, 3) = y[i] / sy;
    }
    double R[3][3] = {{0}}, qty[3];
    for (int k = 0; k < 3; k++) {
        double norm = 0.0;
        for (int i = k; i < m; i++) norm += AT(i, k) * AT(i, k);
        norm = sqrt(norm);
        /* Columns have entries in [0, 1] and norm up to sqrt(m): a pivot this
         * small means the sizes are numerically not distinct. */
        if (norm < 1e-12) {
            free(A);
            return dhsa__fail(DHSA_ERR_INVALID_ARG,
                              "memprobe fit: the sizes are too close together to fit 3 terms");
        }
        double alpha = AT(k, k) > 0 ? -norm : norm;
        double vk = AT(k, k) - alpha; /* v = (vk, A[k+1.., k]) */
        double vnorm2 = vk * vk;
        for (int i = k + 1; i < m; i++) vnorm2 += AT(i, k) * AT(i, k);
        for (int j = k + 1; j < 4 && vnorm2 > 0; j++) {
            double s = vk * AT(k, j);
            for (int i = k + 1; i < m; i++) s += AT(i, k) * AT(i, j);
            double f = 2.0 * s / vnorm2;
            AT(k, j) -= f * vk;
            for (int i = k + 1; i < m; i++) AT(i, j) -= f * AT(i, k);
        }
        R[k][k] = alpha;
        for (int j = k + 1; j < 3; j++) R[k][j] = AT(k, j);
        qty[k] = AT(k, 3);
    }
#undef AT
    free(A);
    double s2 = qty[2] / R[2][2];
    double s1 = (qty[1] - R[1][2] * s2) / R[1][1];
    double s0 = (qty[0] - R[0][1] * s1 - R[0][2] * s2) / R[0][0];
    coef[0] = s0 * sy / (sx * sx);
    coef[1] = s1 * sy / sx;
    coef[2] = s2 * sy;
    if (!isfinite(coef[0]) || !isfinite(coef[1]) || !isfinite(coef[2]))
        return dhsa__fail(DHSA_ERR_NONFINITE, "memprobe fit: the solution is not finite");
    return DHSA_OK;
}

double dhsa_memprobe_loglog_slope(const double *x, const double *y, int m) {
    double mx = 0.0, my = 0.0;
    int k = 0;
    for (int i = 0; i < m; i++) {
        if (!(x[i] > 0) || !(y[i] > 0) || !isfinite(x[i]) || !isfinite(y[i])) continue;
        mx += log(x[i]);
        my += log(y[i]);
        k++;
    }
    if (k < 2) return NAN;
    mx /= k;
    my /= k;
    double sxx = 0.0, sxy = 0.0;
    for (int i = 0; i < m; i++) {
        if (!(x[i] > 0) || !(y[i] > 0) || !isfinite(x[i]) || !isfinite(y[i])) continue;
        double dx = log(x[i]) - mx;
        sxx += dx * dx;
        sxy += dx * (log(y[i]) - my);
    }
    return sxx > 0 ? sxy / sxx : NAN;
}

static double poly2(double a, double b, double c, double n) { return (a * n + b) * n + c; }

double dhsa_memprobe_max_n(double a, double b, double c, double budget) {
    if (!isfinite(a) || !isfinite(b) || !isfinite(c) || isnan(budget)) return NAN;
    if (budget == INFINITY) return INFINITY;
    double d = c - budget; /* g(x) = a x^2 + b x + d; g(0) = d */
    if (d > 0) return 0.0;
    double x; /* the first x > 0 with g(x) = 0 */
    if (a == 0.0) {
        if (b <= 0.0) return INFINITY;
        x = -d / b;
    } else {
        double disc = b * b - 4.0 * a * d;
        if (a < 0.0 && (b <= 0.0 || disc < 0.0)) return INFINITY; /* turns down first */
        double s = sqrt(disc > 0 ? disc : 0.0);
        /* Both forms avoid cancellation: with b >= 0 the first root is
         * -2d / (b + s) (for a > 0 the positive one, for a < 0 the smaller);
         * with b < 0 (then a > 0) it is (-b + s) / (2a). */
        if (b >= 0.0)
            x = b + s > 0 ? -2.0 * d / (b + s) : 0.0;
        else
            x = (-b + s) / (2.0 * a);
    }
    if (!(x < 1e15)) return INFINITY;
    /* Integer refinement against the rounding of the formula. */
    double n = floor(x);
    while (poly2(a, b, c, n + 1.0) <= budget && n + 1.0 <= x + 2.0) n += 1.0;
    while (n > 0.0 && poly2(a, b, c, n) > budget) n -= 1.0;
    return n;
}

/* ------------------------------------------------------------ analysis --- */

const char *dhsa_memprobe_verdict_name(dhsa_memprobe_verdict v) {
    switch (v) {
    case DHSA_MEMPROBE_UNKNOWN: return "unknown";
    case DHSA_MEMPROBE_CONSTANT: return "constant";
    case DHSA_MEMPROBE_LINEAR: return "linear";
    case DHSA_MEMPROBE_QUADRATIC: return "quadratic";
    case DHSA_MEMPROBE_OTHER: return "other";
    }
    return "unknown";
}

/* "12.0 MiB", "-312 KiB" for the reasons. */
static const char *fmt_mib(char *buf, size_t cap, double b) {
    static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    const char *sign = b < 0 ? "-" : "";
    b = fabs(b);
    int u = 0;
    while (b >= 1024.0 && u < 5) {
        b /= 1024.0;
        u++;
    }
    snprintf(buf, cap, "%s%.*f %s", sign, u == 0 ? 0 : b < 10 ? 2 : b < 100 ? 1 : 0, b, unit[u]);
    return buf;
}

dhsa_status dhsa_memprobe_analyze(const double *n, const double *peak, int m, double baseline,
                                  dhsa_memprobe_analysis *out) {
    memset(out, 0, sizeof *out);
    out->verdict = DHSA_MEMPROBE_UNKNOWN;
    out->a = out->b = out->c = out->slope = out->n2_share = out->growth = out->residual = NAN;
    out->n_min = out->n_max = NAN;
    out->baseline = baseline;
    if (m < 0 || (m > 0 && (!n || !peak)))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "memprobe analyze: bad input (m = %d)", m);
    if (!isnan(baseline) && !(isfinite(baseline) && baseline >= 0))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "memprobe analyze: baseline %g", baseline);
    int distinct = 0;
    for (int i = 0; i < m; i++) {
        if (!isfinite(n[i]) || !isfinite(peak[i]) || n[i] <= 0 || peak[i] < 0)
            return dhsa__fail(DHSA_ERR_INVALID_ARG,
                              "memprobe analyze: point %d is (n = %g, peak = %g)", i, n[i],
                              peak[i]);
        if (i == 0 || n[i] < out->n_min) out->n_min = n[i];
        if (i == 0 || n[i] > out->n_max) out->n_max = n[i];
        int seen = 0;
        for (int j = 0; j < i && !seen; j++) seen = n[j] == n[i];
        distinct += !seen;
    }
    out->points = m;
    if (distinct < 3) {
        snprintf(out->reason, sizeof out->reason,
                 "no fit: a*n^2 + b*n + c needs at least 3 distinct sizes measured, got %d",
                 distinct);
        return DHSA_OK;
    }
    double coef[3];
    dhsa_status st = dhsa_memprobe_fit(n, peak, m, coef);
    if (st != DHSA_OK) {
        snprintf(out->reason, sizeof out->reason, "no fit: %s", dhsa_last_error());
        return DHSA_OK;
    }
    out->fitted = 1;
    double a = coef[0], b = coef[1], c = coef[2];
    out->a = a;
    out->b = b;
    out->c = c;

    double res = 0.0;
    for (int i = 0; i < m; i++) {
        double e = fabs(peak[i] - poly2(a, b, c, n[i]));
        e = peak[i] > 0 ? e / peak[i] : (e > 0 ? INFINITY : 0.0);
        if (e > res) res = e;
    }
    out->residual = res;
    out->baseline_measured = !isnan(baseline);
    out->baseline = out->baseline_measured ? baseline : c;

    double *above = malloc((size_t)m * sizeof *above);
    if (!above) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "memprobe analyze: out of memory");
    for (int i = 0; i < m; i++) above[i] = peak[i] - out->baseline;
    out->slope = dhsa_memprobe_loglog_slope(n, above, m);
    free(above);

    double nmax = out->n_max, quad = a * nmax * nmax, lin = b * nmax;
    double denom = fabs(quad) + fabs(lin);
    out->n2_share = denom > 0 ? quad / denom : 0.0;
    double f_max = poly2(a, b, c, nmax);
    out->growth = f_max - poly2(a, b, c, out->n_min);

    char g[32], pk[32];
    double share_pct = 100.0 * out->n2_share, slope = out->slope;
    const char *exact = distinct == 3 ? " (3 sizes for 3 unknowns: the fit is exact by "
                                        "construction; more sizes test it)"
                                      : "";
    /* Peaks that all lie within a constant's tolerance of each other are
     * constant whatever the fit says: for a program of ~1 MiB, page-sized
     * noise alone misses a 5% residual limit. */
    double pmin = peak[0], pmax = peak[0];
    for (int i = 1; i < m; i++) {
        if (peak[i] < pmin) pmin = peak[i];
        if (peak[i] > pmax) pmax = peak[i];
    }
    if (pmax - pmin < DHSA_MEMPROBE_CONSTANT_BYTES) {
        out->verdict = DHSA_MEMPROBE_CONSTANT;
        snprintf(out->reason, sizeof out->reason,
                 "the measured peaks stay within %s of each other from n=%.0f to n=%.0f (peak %s)",
                 fmt_mib(g, sizeof g, pmax - pmin), out->n_min, out->n_max, fmt_mib(pk, sizeof pk, pmax));
    } else if (res > DHSA_MEMPROBE_MAX_RESIDUAL) {
        out->verdict = DHSA_MEMPROBE_OTHER;
        snprintf(out->reason, sizeof out->reason,
                 "the fit misses a measured peak by %.1f%% (limit %.0f%%): the peak is not "
                 "a*n^2 + b*n + c over these sizes",
                 100.0 * res, 100.0 * DHSA_MEMPROBE_MAX_RESIDUAL);
    } else if (fabs(out->growth) < DHSA_MEMPROBE_CONSTANT_BYTES ||
               fabs(out->growth) < DHSA_MEMPROBE_CONSTANT_SHARE * fabs(f_max)) {
        out->verdict = DHSA_MEMPROBE_CONSTANT;
        snprintf(out->reason, sizeof out->reason,
                 "the fitted peak changes by only %s from n=%.0f to n=%.0f (peak %s)%s",
                 fmt_mib(g, sizeof g, out->growth), out->n_min, out->n_max,
                 fmt_mib(pk, sizeof pk, f_max), exact);
    } else if (out->n2_share >= DHSA_MEMPROBE_QUAD_SHARE && slope >= DHSA_MEMPROBE_QUAD_SLOPE) {
        out->verdict = DHSA_MEMPROBE_QUADRATIC;
        snprintf(out->reason, sizeof out->reason,
                 "the n^2 term is %.1f%% of the growth at n=%.0f and the log-log slope is "
                 "%.2f%s",
                 share_pct, nmax, slope, exact);
    } else if (fabs(out->n2_share) <= DHSA_MEMPROBE_LIN_SHARE &&
               slope >= DHSA_MEMPROBE_LIN_SLOPE_LO && slope <= DHSA_MEMPROBE_LIN_SLOPE_HI) {
        out->verdict = DHSA_MEMPROBE_LINEAR;
        snprintf(out->reason, sizeof out->reason,
                 "the n^2 term is %.1f%% of the growth at n=%.0f and the log-log slope is "
                 "%.2f%s",
                 share_pct, nmax, slope, exact);
    } else {
        out->verdict = DHSA_MEMPROBE_OTHER;
        if (isnan(slope))
            snprintf(out->reason, sizeof out->reason,
                     "fewer than 2 sizes peak above the baseline (%s): no growth slope",
                     fmt_mib(pk, sizeof pk, out->baseline));
        else if (out->growth < 0)
            snprintf(out->reason, sizeof out->reason,
                     "the peak shrinks as n grows (by %s from n=%.0f to n=%.0f)",
                     fmt_mib(g, sizeof g, -out->growth), out->n_min, out->n_max);
        else if (slope > DHSA_MEMPROBE_LIN_SLOPE_LO)
            snprintf(out->reason, sizeof out->reason,
                     "neither linear nor quadratic: log-log slope %.2f, n^2 term %.1f%% of the "
                     "growth at n=%.0f",
                     slope, share_pct, nmax);
        else
            snprintf(out->reason, sizeof out->reason,
                     "grows slower than n: log-log slope %.2f (is the baseline right?)", slope);
    }
    return DHSA_OK;
}
