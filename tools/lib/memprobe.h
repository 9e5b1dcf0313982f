/* memprobe.h: measure a command's peak memory as its input grows, and say
 * whether it grows linearly or quadratically (DESIGN.md section 9). The
 * library side of `dhsa memprobe` (tools/memprobe.c): running one command
 * in a fresh process and measuring it, the least-squares fit
 * peak = a*n^2 + b*n + c, the log-log growth slope, the verdict, and the
 * largest n a memory budget allows. Part of the CLI's support library
 * build/libdhsa_cli.a, not of libdhsa (docs/architecture.md).
 * How it works and why: docs/memprobe.md.
 *
 * Contract:
 *   - dhsa_memprobe_run runs argv with fork + execvp (no shell) in its own
 *     process group, stdin from /dev/null, stdout and stderr into a pipe
 *     read by the caller's thread (forwarded to the caller's stderr when
 *     asked; the last bytes are always kept). It measures the peak resident
 *     set as max(wait4 ru_maxrss, the largest /proc/PID/status VmHWM read
 *     while the command runs) and the wall time. Past the time limit the
 *     whole process group gets SIGTERM, then SIGKILL after the grace time.
 *   - Every outcome of the command (exit status, signal, timeout) is a
 *     result, not an error: the call returns DHSA_OK with r->state saying
 *     what happened. The call fails (DHSA_ERR_IO, last error set) only when
 *     the command could not be started (r->state = DHSA_MEMPROBE_EXEC_FAILED,
 *     e.g. not found) or the machinery failed (pipe, fork, wait).
 *   - The peak includes what the forked process held before exec (the
 *     caller's resident pages, inherited copy-on-write, are counted by the
 *     kernel's ru_maxrss): a constant of a few MiB for the dhsa CLI, part
 *     of the fitted c. The largest process of the command's tree counts
 *     (the command, or a child it waited for), not their sum.
 *   - Not thread-safe: one run at a time per process (the running child is
 *     remembered for dhsa_memprobe_forward_signal).
 *   - The analysis functions are pure: no I/O, no allocation beyond their
 *     own scratch, deterministic.
 * Tested by tests/test_memprobe.c (make test).
 */
#ifndef DHSA_EVAL_MEMPROBE_H
#define DHSA_EVAL_MEMPROBE_H

#include "dhsa.h"

#include <stdint.h>

/* ------------------------------------------------------- running one --- */

typedef enum {
    DHSA_MEMPROBE_OK = 0,          /* exited with status 0 */
    DHSA_MEMPROBE_EXIT = 1,        /* exited with a nonzero status */
    DHSA_MEMPROBE_SIGNAL = 2,      /* killed by a signal we did not send
                                      (a crash, abort, the OOM killer) */
    DHSA_MEMPROBE_TIMEOUT = 3,     /* ran past the time limit; we killed it */
    DHSA_MEMPROBE_EXEC_FAILED = 4, /* could not be started */
    DHSA_MEMPROBE_SKIPPED = 5      /* not run (the caller's decision) */
} dhsa_memprobe_state;

typedef struct {
    double timeout_s;   /* SIGTERM to the process group after this; 0 = none */
    double grace_s;     /* SIGKILL this long after SIGTERM (default 5) */
    double sample_s;    /* VmHWM sampling period (default 0.01) */
    int forward_output; /* nonzero: copy the command's output to our stderr */
} dhsa_memprobe_run_params;

#define DHSA_MEMPROBE_TAIL 2048

typedef struct {
    dhsa_memprobe_state state;
    int exit_code;       /* EXIT: the status; EXEC_FAILED: errno of exec */
    int signal;          /* SIGNAL: the signal; TIMEOUT: the one that ended it */
    uint64_t peak_bytes; /* max(ru_maxrss_bytes, vmhwm_bytes) */
    uint64_t ru_maxrss_bytes;
    uint64_t vmhwm_bytes; /* largest sampled VmHWM; 0 if never readable */
    int vmhwm_samples;    /* successful /proc reads */
    double wall_s;
    /* The last bytes the command wrote (stdout and stderr interleaved),
     * NUL-terminated; tail_truncated when earlier output was dropped. */
    char tail[DHSA_MEMPROBE_TAIL];
    int tail_truncated;
} dhsa_memprobe_result;

dhsa_memprobe_run_params dhsa_memprobe_default_run_params(void);

/* Runs argv[0] (searched in PATH like execvp) with argv (NULL-terminated)
 * and measures it. See the contract above. */
dhsa_status dhsa_memprobe_run(char *const argv[], const dhsa_memprobe_run_params *p,
                              dhsa_memprobe_result *r);

/* "ok", "exit", "signal", "timeout", "exec-failed", "skipped". */
const char *dhsa_memprobe_state_name(dhsa_memprobe_state s);
/* "SIGSEGV", "SIGKILL", ... or "SIG<number>" for ones without a name here
 * (the text lives in a static buffer for those: not thread-safe). */
const char *dhsa_memprobe_signal_name(int sig);

/* Sends sig to the process group of the command being run, if any.
 * Async-signal-safe: for the caller's SIGINT/SIGTERM handlers, so that
 * stopping the probe stops the command too. */
void dhsa_memprobe_forward_signal(int sig);

/* Replaces every "{n}" in every argument by the decimal n. *out is a new
 * NULL-terminated array of new strings; free with dhsa_memprobe_free_argv.
 * Returns how many replacements were made through *n_replaced (may be
 * NULL). */
dhsa_status dhsa_memprobe_substitute(char *const argv[], int64_t n, char ***out,
                                     int *n_replaced);
void dhsa_memprobe_free_argv(char **argv);

/* ------------------------------------------------------------ analysis --- */

/* Least squares y ~ coef[0]*x^2 + coef[1]*x + coef[2] over m points, in
 * double, with x scaled by max|x| and y by max|y| (so that n up to 2^20 and
 * bytes up to 2^40 do not make the system ill-conditioned) and solved by
 * Householder QR (no normal equations). Needs at least 3 distinct x:
 * otherwise DHSA_ERR_INVALID_ARG. Non-finite input: DHSA_ERR_NONFINITE. */
dhsa_status dhsa_memprobe_fit(const double *x, const double *y, int m, double coef[3]);

/* Slope of the least-squares line through (ln x, ln y) over the points with
 * x > 0 and y > 0; NaN if fewer than 2 such points with distinct x. */
double dhsa_memprobe_loglog_slope(const double *x, const double *y, int m);

/* The largest integer n >= 0 such that a*m^2 + b*m + c <= budget for every
 * real m in [0, n]: where the fitted curve first crosses the budget. 0 if
 * c > budget already; +INFINITY if the curve never crosses it (a <= 0 and
 * it turns down first, or a = b = 0), or crosses beyond 1e15. */
double dhsa_memprobe_max_n(double a, double b, double c, double budget);

typedef enum {
    DHSA_MEMPROBE_UNKNOWN = 0,  /* no fit: fewer than 3 sizes measured */
    DHSA_MEMPROBE_CONSTANT = 1, /* the peak does not grow with n */
    DHSA_MEMPROBE_LINEAR = 2,
    DHSA_MEMPROBE_QUADRATIC = 3,
    DHSA_MEMPROBE_OTHER = 4     /* in between, faster, concave, or a poor fit */
} dhsa_memprobe_verdict;

/* "unknown", "constant", "linear", "quadratic", "other". */
const char *dhsa_memprobe_verdict_name(dhsa_memprobe_verdict v);

/* The thresholds of the verdict rules (docs/memprobe.md). */
#define DHSA_MEMPROBE_MAX_RESIDUAL 0.05      /* fit error beyond this: "other" */
#define DHSA_MEMPROBE_CONSTANT_BYTES 1048576 /* growth below 1 MiB ... */
#define DHSA_MEMPROBE_CONSTANT_SHARE 0.01    /* ... or below 1% of the peak */
#define DHSA_MEMPROBE_QUAD_SHARE 0.5         /* n^2 share of the growth */
#define DHSA_MEMPROBE_QUAD_SLOPE 1.5
#define DHSA_MEMPROBE_LIN_SHARE 0.1
#define DHSA_MEMPROBE_LIN_SLOPE_LO 0.8
#define DHSA_MEMPROBE_LIN_SLOPE_HI 1.2

typedef struct {
    int fitted;           /* a, b, c hold a fit (at least 3 distinct sizes) */
    int points;           /* sizes used */
    double n_min, n_max;  /* the range of sizes used */
    double a, b, c;       /* peak ~ a*n^2 + b*n + c, bytes */
    double baseline;      /* what the slope subtracts: the measured baseline
                             when one was given, else c */
    int baseline_measured;
    double slope;         /* log-log slope of (peak - baseline) vs n; NaN
                             when fewer than 2 points are above the baseline */
    double n2_share;      /* a*n_max^2 / (|a|*n_max^2 + |b|*n_max): the share
                             of the n^2 term in the fitted growth at n_max */
    double growth;        /* fit(n_max) - fit(n_min), bytes */
    double residual;      /* max over the points of |peak - fit| / peak */
    dhsa_memprobe_verdict verdict;
    char reason[256];     /* one sentence: why this verdict */
} dhsa_memprobe_analysis;

/* Fits and judges m measured points (sizes n[i], peaks peak[i] in bytes;
 * only successful runs). baseline: a measured baseline peak in bytes, or
 * NaN to use the fitted c. Always fills *out (verdict UNKNOWN when no fit
 * is possible, with the reason); returns DHSA_OK, or an error for invalid
 * input (m < 0, NULL pointers, non-finite or negative values). */
dhsa_status dhsa_memprobe_analyze(const double *n, const double *peak, int m, double baseline,
                                  dhsa_memprobe_analysis *out);

#endif
