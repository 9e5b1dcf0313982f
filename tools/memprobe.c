/* memprobe.c: `dhsa memprobe`, the memory probe's command line: runs a
 * command once per size n (and repeats), measures each run's peak resident
 * memory in a fresh process, fits peak = a*n^2 + b*n + c, and prints the
 * table, the verdict (linear / quadratic / ...), the bytes per n and per
 * n^2, and the largest n a budget allows; or one JSON object; and an SVG.
 * The measuring and the fitting are in tools/lib/memprobe.c; the method and
 * the verdict rules are in docs/memprobe.md.
 *
 * Exit status: 0 when every run succeeded and a fit was possible, 1 when a
 * run failed (exit status, signal, timeout, not startable) or no fit was
 * possible, 2 on a usage error.
 * Tested by tests/test_memprobe.c (make test).
 */
#include "cli.h"
#include "dhsa.h"
#include "lib/memprobe.h"
#include "lib/svg.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EXIT_RUN DHSA_EXIT_RUN
#define EXIT_USAGE DHSA_EXIT_USAGE
#define MAX_SIZES 256
#define MAX_REPEAT 100

const char dhsa_cli_memprobe_usage[] =
    "usage: dhsa memprobe [options] -- COMMAND [ARGS...]\n"
    "\n"
    "Runs COMMAND once per size n, each time in a fresh process (fork + exec,\n"
    "no shell), with every \"{n}\" in its arguments replaced by n, and records\n"
    "the peak resident memory of each run: max(wait4 ru_maxrss, the largest\n"
    "/proc/PID/status VmHWM sampled every 10 ms while it runs). Then fits\n"
    "peak = a*n^2 + b*n + c by least squares and prints a table (n, peak,\n"
    "peak - baseline, bytes per n, bytes per n^2, wall time, status), the\n"
    "fit, the log-log slope of (peak - baseline) vs n, the verdict, and the\n"
    "largest n whose fitted peak fits the budget.\n"
    "\n"
    "  --sizes LIST     comma-separated sizes, at least 3 distinct, run in\n"
    "                   increasing order (suffix K = 1024; default\n"
    "                   1024,2048,4096,8192)\n"
    "  --repeat N       runs per size; the median peak counts (default 1)\n"
    "  --timeout S      seconds per run before SIGTERM goes to the command's\n"
    "                   process group (default 600; 0 = no limit)\n"
    "  --grace S        seconds from SIGTERM to SIGKILL (default 5)\n"
    "  --baseline CMD   a command measured like the others (CMD is one\n"
    "                   argument, split at blanks, no quoting; {n} becomes\n"
    "                   the smallest size) whose median peak is the baseline:\n"
    "                   what the program holds without the n-dependent work.\n"
    "                   Without it the baseline is the fitted constant c.\n"
    "  --budget BYTES   memory budget for the largest n (suffix K, M, G, T =\n"
    "                   powers of 1024; default: this machine's memory)\n"
    "  --json           one JSON object instead of the table\n"
    "  --svg FILE       plot of the measured peaks and the fitted curve\n"
    "  --quiet          no progress lines, and the command's own output is\n"
    "                   not copied to stderr (the last lines of a failed run\n"
    "                   still are)\n"
    "  --help           this text\n"
    "\n"
    "The command's stdin is /dev/null; its stdout and stderr go to this\n"
    "program's stderr, so --json output stays clean. A run that exits\n"
    "nonzero, dies of a signal or times out is reported as such in the table\n"
    "and left out of the fit; after a timeout, larger sizes are skipped\n"
    "(they would take longer). If the command cannot be started, memprobe\n"
    "stops with an error.\n"
    "\n"
    "Verdict (first rule that holds; share = a*N^2 / (|a|*N^2 + |b|*N) at\n"
    "the largest size N; slope as above):\n"
    "  other      the fit misses some measured peak by more than 5%\n"
    "  constant   the fitted peak grows by less than 1 MiB or less than 1%\n"
    "  quadratic  share >= 0.5 and slope >= 1.5\n"
    "  linear     |share| <= 0.1 and 0.8 <= slope <= 1.2\n"
    "  other      anything else (the reason says why)\n"
    "  unknown    fewer than 3 sizes succeeded: no fit\n"
    "The peak includes the few MiB the forked process holds before exec: a\n"
    "constant, part of c. See docs/memprobe.md.\n"
    "\n"
    "Example: dhsa memprobe --sizes 1024,2048,4096,8192 -- \\\n"
    "             build/progs/alloc_quadratic {n} 16\n";

/* ------------------------------------------------------- errors, parsing --- */

static const char *cmd_name = "dhsa memprobe";

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* "1024,2048,4K": sorted, distinct, 3..MAX_SIZES sizes in [1, 2^40]. */
static int parse_sizes(const char *s, int64_t *out) {
    int k = 0;
    char item[64];
    const char *p = s;
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len >= sizeof item) dhsa_cli_die(EXIT_USAGE, "--sizes: \"%.*s\" is too long", (int)len, p);
        memcpy(item, p, len);
        item[len] = '\0';
        if (k == MAX_SIZES) dhsa_cli_die(EXIT_USAGE, "--sizes: more than %d sizes", MAX_SIZES);
        out[k++] = dhsa_cli_int("--sizes", item, 1, (int64_t)1 << 40, 1);
        if (!comma) break;
        p = comma + 1;
    }
    qsort(out, (size_t)k, sizeof *out, cmp_i64);
    for (int i = 1; i < k; i++)
        if (out[i] == out[i - 1])
            dhsa_cli_die(EXIT_USAGE, "--sizes: %lld is given twice", (long long)out[i]);
    if (k < 3)
        dhsa_cli_die(EXIT_USAGE, "--sizes: need at least 3 distinct sizes to fit a*n^2 + b*n + c (got %d)", k);
    return k;
}

/* "python3 base.py {n}" -> NULL-terminated words (split at blanks) that
 * point into *storage; free both. */
static char **split_words(const char *s, char **storage) {
    size_t len = strlen(s), n = 0;
    char *copy = malloc(len + 1);
    char **words = calloc(len / 2 + 2, sizeof *words);
    if (!copy || !words) {
        fprintf(stderr, "%s: out of memory\n", cmd_name);
        exit(EXIT_RUN);
    }
    memcpy(copy, s, len + 1);
    for (char *t = strtok(copy, " \t"); t; t = strtok(NULL, " \t")) words[n++] = t;
    if (n == 0) dhsa_cli_die(EXIT_USAGE, "--baseline: the command is empty");
    *storage = copy;
    return words;
}

/* ------------------------------------------------------------- output --- */

/* Appends to a NUL-terminated buffer of cap bytes; cuts what does not fit. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static void appendf(char *buf, size_t cap, const char *fmt, ...) {
    size_t len = strlen(buf);
    if (len + 1 >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + len, cap - len, fmt, ap);
    va_end(ap);
}

/* A coefficient for the table: whole numbers from 100 up, else 4
 * significant digits. */
static const char *fmt_num(char *buf, size_t cap, double v) {
    if (!isfinite(v))
        snprintf(buf, cap, "-");
    else if (fabs(v) >= 100.0 && fabs(v) < 1e15)
        snprintf(buf, cap, "%.0f", v);
    else
        snprintf(buf, cap, "%.4g", v);
    return buf;
}

/* The command line as a JSON array of strings. */
static void json_argv(dhsa_cli_json *j, const char *key, char *const *argv) {
    dhsa_cli_json_array(j, key);
    for (int i = 0; argv[i]; i++) dhsa_cli_json_str(j, NULL, argv[i]);
    dhsa_cli_json_close(j);
}

/* ---------------------------------------------------------------- runs --- */

typedef struct {
    dhsa_memprobe_state state;
    int exit_code, signal;
    double peak, ru_maxrss, vmhwm, wall;
    int vmhwm_samples;
} run_rec;

/* One size: its runs, and the summary the table and the fit use. */
typedef struct {
    int64_t n;
    run_rec *runs;
    int n_runs;
    dhsa_memprobe_state state; /* OK only if every run was; else the first failure */
    int exit_code, signal;     /* of that failure */
    double peak, wall;         /* median over the runs (ok), or the failed run's */
    double ru_maxrss, vmhwm;   /* of the median run (ok) or the failed run */
    char *tail;                /* last output of the failed run, or NULL */
} size_rec;

/* "ok", "exit 3", "SIGSEGV", "timeout", "skipped". */
static const char *status_text(char *buf, size_t cap, const size_rec *s) {
    switch (s->state) {
    case DHSA_MEMPROBE_EXIT: snprintf(buf, cap, "exit %d", s->exit_code); break;
    case DHSA_MEMPROBE_SIGNAL: snprintf(buf, cap, "%s", dhsa_memprobe_signal_name(s->signal)); break;
    default: snprintf(buf, cap, "%s", dhsa_memprobe_state_name(s->state)); break;
    }
    return buf;
}

static void print_command(FILE *f, char *const *argv) {
    for (int i = 0; argv[i]; i++) fprintf(f, "%s%s", i ? " " : "", argv[i]);
}

/* Stopping memprobe stops the command: forward, then die of the same
 * signal with the default action. */
static void on_signal(int sig) {
    dhsa_memprobe_forward_signal(sig);
    signal(sig, SIG_DFL);
    raise(sig);
}

typedef struct {
    dhsa_memprobe_run_params rp;
    int repeat, quiet;
} probe_opts;

/* Runs argv_tmpl with {n} = n, o->repeat times (stopping at the first
 * failure), into *s. Exits (status 1) if the command cannot be started. */
static void measure_size(char *const *argv_tmpl, int64_t n, const probe_opts *o, size_rec *s,
                         const char *label) {
    memset(s, 0, sizeof *s);
    s->n = n;
    s->runs = calloc((size_t)o->repeat, sizeof *s->runs);
    char **argv = NULL;
    if (!s->runs || dhsa_memprobe_substitute(argv_tmpl, n, &argv, NULL) != DHSA_OK) {
        fprintf(stderr, "%s: out of memory\n", cmd_name);
        exit(EXIT_RUN);
    }
    static dhsa_memprobe_result r; /* 2 KiB of output tail: not on the stack */
    char b1[32], b2[32];
    s->state = DHSA_MEMPROBE_OK;
    for (int i = 0; i < o->repeat; i++) {
        char what[96];
        if (o->repeat > 1)
            snprintf(what, sizeof what, "%s run %d/%d", label, i + 1, o->repeat);
        else
            snprintf(what, sizeof what, "%s", label);
        if (!o->quiet) {
            fprintf(stderr, "%s: %s: ", cmd_name, what);
            print_command(stderr, argv);
            fputc('\n', stderr);
        }
        dhsa_status st = dhsa_memprobe_run(argv, &o->rp, &r);
        if (st != DHSA_OK) {
            fprintf(stderr, "%s: %s\n", cmd_name, dhsa_last_error());
            exit(EXIT_RUN);
        }
        run_rec *rr = &s->runs[s->n_runs++];
        rr->state = r.state;
        rr->exit_code = r.exit_code;
        rr->signal = r.signal;
        rr->peak = (double)r.peak_bytes;
        rr->ru_maxrss = (double)r.ru_maxrss_bytes;
        rr->vmhwm = (double)r.vmhwm_bytes;
        rr->vmhwm_samples = r.vmhwm_samples;
        rr->wall = r.wall_s;
        if (!o->quiet)
            fprintf(stderr, "%s: %s: peak %s, %.3f s, %s\n", cmd_name, what,
                    dhsa_cli_bytes(rr->peak, b1, sizeof b1), rr->wall,
                    r.state == DHSA_MEMPROBE_SIGNAL ? dhsa_memprobe_signal_name(r.signal)
                                                    : dhsa_memprobe_state_name(r.state));
        if (r.state != DHSA_MEMPROBE_OK) {
            s->state = r.state;
            s->exit_code = r.exit_code;
            s->signal = r.signal;
            s->peak = rr->peak;
            s->wall = rr->wall;
            s->ru_maxrss = rr->ru_maxrss;
            s->vmhwm = rr->vmhwm;
            size_t len = strlen(r.tail);
            s->tail = malloc(len + 1);
            if (s->tail) memcpy(s->tail, r.tail, len + 1);
            char how[96];
            if (r.state == DHSA_MEMPROBE_EXIT)
                snprintf(how, sizeof how, "exited with status %d", r.exit_code);
            else if (r.state == DHSA_MEMPROBE_SIGNAL)
                snprintf(how, sizeof how, "died of %s", dhsa_memprobe_signal_name(r.signal));
            else
                snprintf(how, sizeof how, "timed out after %g s (ended by %s)", o->rp.timeout_s,
                         dhsa_memprobe_signal_name(r.signal));
            fprintf(stderr, "%s: %s %s (peak until then %s)%s\n", cmd_name, what, how,
                    dhsa_cli_bytes(rr->peak, b2, sizeof b2),
                    o->quiet && len ? "; its last output:" : "");
            if (o->quiet && len) {
                fprintf(stderr, "%s%s", r.tail_truncated ? "[...]" : "", r.tail);
                if (r.tail[len - 1] != '\n') fputc('\n', stderr);
            }
            break;
        }
    }
    if (s->state == DHSA_MEMPROBE_OK) {
        /* Median peak; wall and the two sources from the run nearest it. */
        double *pk = malloc((size_t)s->n_runs * sizeof *pk);
        double *wl = malloc((size_t)s->n_runs * sizeof *wl);
        if (!pk || !wl) {
            fprintf(stderr, "%s: out of memory\n", cmd_name);
            exit(EXIT_RUN);
        }
        for (int i = 0; i < s->n_runs; i++) {
            pk[i] = s->runs[i].peak;
            wl[i] = s->runs[i].wall;
        }
        s->peak = dhsa_cli_median(pk, s->n_runs);
        s->wall = dhsa_cli_median(wl, s->n_runs);
        int best = 0;
        for (int i = 1; i < s->n_runs; i++)
            if (fabs(s->runs[i].peak - s->peak) < fabs(s->runs[best].peak - s->peak)) best = i;
        s->ru_maxrss = s->runs[best].ru_maxrss;
        s->vmhwm = s->runs[best].vmhwm;
        free(pk);
        free(wl);
    }
    dhsa_memprobe_free_argv(argv);
}

/* ----------------------------------------------------------------- SVG --- */

static int write_svg(const char *path, char *const *cmd, const size_rec *sz, int k,
                     const dhsa_memprobe_analysis *an) {
    char title[512], sub[512];
    int len = snprintf(title, sizeof title, "peak memory vs n: ");
    for (int i = 0; cmd[i] && len < (int)sizeof title - 1; i++)
        len += snprintf(title + len, sizeof title - (size_t)len, "%s%s", i ? " " : "", cmd[i]);
    int failed = 0;
    for (int i = 0; i < k; i++) failed += sz[i].state != DHSA_MEMPROBE_OK;
    char cb[32];
    if (an->fitted)
        snprintf(sub, sizeof sub,
                 "%s: a = %.4g B per n^2, b = %.4g B per n, c = %s; slope %.2f%s",
                 dhsa_memprobe_verdict_name(an->verdict), an->a, an->b,
                 dhsa_cli_bytes(an->c, cb, sizeof cb), an->slope,
                 failed ? "; failed sizes not shown" : "");
    else
        snprintf(sub, sizeof sub, "no fit: %s", an->reason);
    dhsa_plot *p = dhsa_plot_create(title, "n", "peak resident memory");
    if (!p) return -1;
    dhsa_status st = dhsa_plot_set_subtitle(p, sub);
    dhsa_plot_set_format(p, DHSA_AXIS_Y, DHSA_AXIS_BYTES);
    if (st == DHSA_OK) st = dhsa_plot_set_range(p, DHSA_AXIS_Y, 0.0, NAN);
    double x[MAX_SIZES], y[MAX_SIZES];
    int m = 0;
    for (int i = 0; i < k; i++)
        if (sz[i].state == DHSA_MEMPROBE_OK) {
            x[m] = (double)sz[i].n;
            y[m++] = sz[i].peak;
        }
    if (st == DHSA_OK) st = dhsa_plot_add(p, "measured peak", DHSA_PLOT_POINTS, x, y, m);
    if (st == DHSA_OK && an->fitted) {
        enum { CURVE = 101 };
        double fx[CURVE], fy[CURVE];
        for (int i = 0; i < CURVE; i++) {
            fx[i] = an->n_min + (an->n_max - an->n_min) * i / (CURVE - 1);
            fy[i] = (an->a * fx[i] + an->b) * fx[i] + an->c;
        }
        st = dhsa_plot_add(p, "fit a*n^2 + b*n + c", DHSA_PLOT_LINE | DHSA_PLOT_DASHED, fx, fy,
                           CURVE);
        if (st == DHSA_OK && an->baseline_measured) {
            double bx[2] = {an->n_min, an->n_max}, by[2] = {an->baseline, an->baseline};
            st = dhsa_plot_add(p, "baseline", DHSA_PLOT_LINE, bx, by, 2);
        }
    }
    if (st == DHSA_OK) st = dhsa_plot_save(p, path);
    dhsa_plot_free(p);
    return st == DHSA_OK ? 0 : -1;
}

/* ---------------------------------------------------------------- main --- */

int dhsa_cli_memprobe(int argc, char **argv) {
    dhsa_cli_set_command("memprobe", dhsa_cli_memprobe_usage);
    int64_t sizes[MAX_SIZES] = {1024, 2048, 4096, 8192};
    int n_sizes = 4;
    probe_opts o;
    memset(&o, 0, sizeof o);
    o.rp = dhsa_memprobe_default_run_params();
    o.rp.timeout_s = 600.0;
    o.repeat = 1;
    int json = 0;
    const char *svg = NULL, *baseline_text = NULL;
    double budget = NAN;

    int i = 2;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(dhsa_cli_memprobe_usage, stdout);
            return 0;
        }
        if (strncmp(a, "--", 2) != 0) break; /* the command starts here */
        const char *eq = strchr(a, '=');
        char name[32];
        size_t nl = eq ? (size_t)(eq - a) : strlen(a);
        if (nl >= sizeof name) dhsa_cli_die(EXIT_USAGE, "unknown option \"%s\"", a);
        memcpy(name, a, nl);
        name[nl] = '\0';
        int is_flag = strcmp(name, "--json") == 0 || strcmp(name, "--quiet") == 0;
        const char *val = NULL;
        if (is_flag) {
            if (eq) dhsa_cli_die(EXIT_USAGE, "%s takes no value", name);
        } else if (eq) {
            val = eq + 1;
        } else if (strcmp(name, "--sizes") == 0 || strcmp(name, "--repeat") == 0 ||
                   strcmp(name, "--timeout") == 0 || strcmp(name, "--grace") == 0 ||
                   strcmp(name, "--baseline") == 0 || strcmp(name, "--budget") == 0 ||
                   strcmp(name, "--svg") == 0) {
            if (i + 1 >= argc) dhsa_cli_die(EXIT_USAGE, "%s needs a value", name);
            val = argv[++i];
        }
        if (strcmp(name, "--json") == 0) json = 1;
        else if (strcmp(name, "--quiet") == 0) o.quiet = 1;
        else if (strcmp(name, "--sizes") == 0) n_sizes = parse_sizes(val, sizes);
        else if (strcmp(name, "--repeat") == 0)
            o.repeat = (int)dhsa_cli_int("--repeat", val, 1, MAX_REPEAT, 0);
        else if (strcmp(name, "--timeout") == 0)
            o.rp.timeout_s = dhsa_cli_real("--timeout", val, 0.0, 1e7);
        else if (strcmp(name, "--grace") == 0)
            o.rp.grace_s = dhsa_cli_real("--grace", val, 0.0, 3600.0);
        else if (strcmp(name, "--baseline") == 0) baseline_text = val;
        else if (strcmp(name, "--budget") == 0)
            budget = (double)dhsa_cli_int("--budget", val, 1, (int64_t)1 << 60, 1);
        else if (strcmp(name, "--svg") == 0) {
            if (!val[0]) dhsa_cli_die(EXIT_USAGE, "--svg needs a file name");
            dhsa_cli_check_output("--svg", val); /* before the runs */
            svg = val;
        } else
            dhsa_cli_die(EXIT_USAGE, "unknown option \"%s\"", a);
    }
    if (i >= argc) dhsa_cli_die(EXIT_USAGE, "no command given (put it after --)");
    char **cmd = argv + i; /* NULL-terminated: argv[argc] is NULL */
    int has_n = 0;
    for (int j = 0; cmd[j]; j++) has_n |= strstr(cmd[j], "{n}") != NULL;
    if (!has_n)
        dhsa_cli_die(EXIT_USAGE, "the command has no \"{n}\" in its arguments: every size would run the "
                    "same thing");
    const char *budget_src = "--budget";
    if (isnan(budget)) {
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        budget = pages > 0 && page > 0 ? (double)pages * (double)page : NAN;
        budget_src = "this machine's memory";
    }
    o.rp.forward_output = !o.quiet;

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);

    /* The baseline first, then every size in increasing order. */
    size_rec base;
    memset(&base, 0, sizeof base);
    char **base_cmd = NULL, *base_storage = NULL;
    if (baseline_text) {
        base_cmd = split_words(baseline_text, &base_storage);
        measure_size(base_cmd, sizes[0], &o, &base, "baseline");
    }
    size_rec *sz = calloc((size_t)n_sizes, sizeof *sz);
    if (!sz) {
        fprintf(stderr, "%s: out of memory\n", cmd_name);
        return EXIT_RUN;
    }
    int timed_out = 0;
    for (int k = 0; k < n_sizes; k++) {
        if (timed_out) {
            sz[k].n = sizes[k];
            sz[k].state = DHSA_MEMPROBE_SKIPPED;
            sz[k].peak = sz[k].wall = sz[k].ru_maxrss = sz[k].vmhwm = NAN;
            continue;
        }
        char label[64];
        snprintf(label, sizeof label, "n=%lld (%d/%d)", (long long)sizes[k], k + 1, n_sizes);
        measure_size(cmd, sizes[k], &o, &sz[k], label);
        timed_out = sz[k].state == DHSA_MEMPROBE_TIMEOUT;
    }

    /* Fit the sizes whose every run succeeded. */
    double xs[MAX_SIZES], ys[MAX_SIZES];
    int m = 0, failed = 0;
    for (int k = 0; k < n_sizes; k++) {
        if (sz[k].state == DHSA_MEMPROBE_OK) {
            xs[m] = (double)sz[k].n;
            ys[m++] = sz[k].peak;
        } else {
            failed++;
        }
    }
    int base_ok = baseline_text && base.state == DHSA_MEMPROBE_OK;
    dhsa_memprobe_analysis an;
    if (dhsa_memprobe_analyze(xs, ys, m, base_ok ? base.peak : NAN, &an) != DHSA_OK) {
        fprintf(stderr, "%s: %s\n", cmd_name, dhsa_last_error());
        return EXIT_RUN;
    }
    double max_n = an.fitted && isfinite(budget) ? dhsa_memprobe_max_n(an.a, an.b, an.c, budget)
                                                 : NAN;
    /* A peak that does not grow has no meaningful curvature to extrapolate
     * (with 3 sizes the fit would be a parabola through noise). */
    if (an.verdict == DHSA_MEMPROBE_CONSTANT && isfinite(budget))
        max_n = (an.a * an.n_max + an.b) * an.n_max + an.c <= budget ? INFINITY : 0.0;
    int ok = failed == 0 && an.fitted && (!baseline_text || base_ok);

    /* What failed, in one sentence, for the verdict line and the JSON. */
    char failures[512] = "";
    if (baseline_text && !base_ok) {
        char st[32];
        appendf(failures, sizeof failures,
                "the baseline command failed (%s), so the fitted c stands in for it",
                status_text(st, sizeof st, &base));
    }
    if (failed) {
        appendf(failures, sizeof failures, "%sleft out of the fit (%d of %d sizes):",
                failures[0] ? "; " : "", failed, n_sizes);
        int listed = 0;
        for (int k = 0; k < n_sizes; k++) {
            if (sz[k].state == DHSA_MEMPROBE_OK) continue;
            char st[32];
            appendf(failures, sizeof failures, "%s n=%lld %s", listed++ ? "," : "",
                    (long long)sz[k].n, status_text(st, sizeof st, &sz[k]));
        }
    }

    double bl = an.fitted || base_ok ? an.baseline : NAN;
    if (!an.fitted && base_ok) bl = base.peak;
    if (json) {
        /* memprobe's strings: \n, \t and DEL escaped, other bytes as they are;
         * numbers to 10 digits (byte counts stay exact) */
        dhsa_cli_json j;
        dhsa_cli_json_init(&j, stdout, DHSA_CLI_JSON_SHORT_ESCAPES, "%.10g");
        dhsa_cli_json_object(&j, NULL);
        json_argv(&j, "command", cmd);
        dhsa_cli_json_array(&j, "sizes");
        for (int k = 0; k < n_sizes; k++) dhsa_cli_json_int(&j, NULL, sizes[k]);
        dhsa_cli_json_close(&j);
        dhsa_cli_json_int(&j, "repeat", o.repeat);
        dhsa_cli_json_num(&j, "timeout_s", o.rp.timeout_s);
        dhsa_cli_json_str(&j, "baseline_kind", base_ok ? "command" : "fitted-c");
        if (base_cmd)
            json_argv(&j, "baseline_command", base_cmd);
        else
            dhsa_cli_json_null(&j, "baseline_command");
        if (baseline_text) {
            char st[32];
            dhsa_cli_json_str(&j, "baseline_status", status_text(st, sizeof st, &base));
            dhsa_cli_json_num(&j, "baseline_peak_bytes", base.peak);
        }
        dhsa_cli_json_num(&j, "baseline_bytes", bl);
        dhsa_cli_json_array(&j, "results");
        for (int k = 0; k < n_sizes; k++) {
            const size_rec *s = &sz[k];
            int in_fit = s->state == DHSA_MEMPROBE_OK;
            dhsa_cli_json_object(&j, NULL);
            dhsa_cli_json_int(&j, "n", s->n);
            dhsa_cli_json_str(&j, "status", dhsa_memprobe_state_name(s->state));
            if (s->state == DHSA_MEMPROBE_OK || s->state == DHSA_MEMPROBE_EXIT)
                dhsa_cli_json_int(&j, "exit_code", s->exit_code);
            else
                dhsa_cli_json_null(&j, "exit_code");
            if (s->signal && (s->state == DHSA_MEMPROBE_SIGNAL || s->state == DHSA_MEMPROBE_TIMEOUT))
                dhsa_cli_json_str(&j, "signal", dhsa_memprobe_signal_name(s->signal));
            else
                dhsa_cli_json_null(&j, "signal");
            dhsa_cli_json_bool(&j, "in_fit", in_fit);
            dhsa_cli_json_num(&j, "peak_bytes", s->peak);
            double above = in_fit ? s->peak - bl : NAN;
            dhsa_cli_json_num(&j, "peak_minus_baseline", above);
            dhsa_cli_json_num(&j, "bytes_per_n", above / (double)s->n);
            dhsa_cli_json_num(&j, "bytes_per_n2", above / ((double)s->n * (double)s->n));
            dhsa_cli_json_num(&j, "ru_maxrss_bytes", s->ru_maxrss);
            dhsa_cli_json_num(&j, "vmhwm_bytes", s->vmhwm > 0 ? s->vmhwm : NAN);
            dhsa_cli_json_num(&j, "wall_s", s->wall);
            dhsa_cli_json_array(&j, "runs");
            for (int r = 0; r < s->n_runs; r++) {
                const run_rec *rr = &s->runs[r];
                dhsa_cli_json_object(&j, NULL);
                dhsa_cli_json_str(&j, "status", dhsa_memprobe_state_name(rr->state));
                dhsa_cli_json_num(&j, "peak_bytes", rr->peak);
                dhsa_cli_json_num(&j, "ru_maxrss_bytes", rr->ru_maxrss);
                dhsa_cli_json_num(&j, "vmhwm_bytes", rr->vmhwm > 0 ? rr->vmhwm : NAN);
                dhsa_cli_json_int(&j, "vmhwm_samples", rr->vmhwm_samples);
                dhsa_cli_json_num(&j, "wall_s", rr->wall);
                dhsa_cli_json_close(&j);
            }
            dhsa_cli_json_close(&j);
            if (s->tail) dhsa_cli_json_str(&j, "last_output", s->tail);
            dhsa_cli_json_close(&j);
        }
        dhsa_cli_json_close(&j);
        dhsa_cli_json_int(&j, "sizes_ok", m);
        dhsa_cli_json_int(&j, "sizes_failed", failed);
        dhsa_cli_json_bool(&j, "fitted", an.fitted);
        dhsa_cli_json_num(&j, "a", an.a);
        dhsa_cli_json_num(&j, "b", an.b);
        dhsa_cli_json_num(&j, "c", an.c);
        dhsa_cli_json_num(&j, "bytes_per_n2", an.a);
        dhsa_cli_json_num(&j, "bytes_per_n", an.b);
        dhsa_cli_json_num(&j, "slope", an.slope);
        dhsa_cli_json_num(&j, "n2_share", an.n2_share);
        dhsa_cli_json_num(&j, "residual", an.residual);
        dhsa_cli_json_str(&j, "verdict", dhsa_memprobe_verdict_name(an.verdict));
        dhsa_cli_json_str(&j, "verdict_reason", an.reason);
        dhsa_cli_json_str(&j, "failures", failures[0] ? failures : NULL);
        dhsa_cli_json_num(&j, "budget_bytes", budget);
        dhsa_cli_json_num(&j, "max_n_for_budget", max_n); /* null: no fit, or no limit (below) */
        dhsa_cli_json_bool(&j, "budget_unbounded", isinf(max_n));
        dhsa_cli_json_bool(&j, "ok", ok);
        dhsa_cli_json_close(&j);
    } else {
        char b1[32], b2[32], b3[32];
        printf("dhsa memprobe: ");
        print_command(stdout, cmd);
        printf("\n  %d sizes, %d run%s each (median), timeout %g s; peak = max(wait4 ru_maxrss, "
               "/proc VmHWM)\n\n",
               n_sizes, o.repeat, o.repeat > 1 ? "s" : "", o.rp.timeout_s);
        printf("  %10s %11s %13s %11s %11s %9s  %s\n", "n", "peak", "peak - base", "B per n",
               "B per n^2", "wall s", "status");
        if (baseline_text)
            printf("  %10s %11s %13s %11s %11s %9.3f  %s\n", "baseline",
                   dhsa_cli_bytes(base.peak, b1, sizeof b1), "", "", "", base.wall,
                   status_text(b3, sizeof b3, &base));
        for (int k = 0; k < n_sizes; k++) {
            const size_rec *s = &sz[k];
            int in_fit = s->state == DHSA_MEMPROBE_OK;
            double above = s->peak - bl, n = (double)s->n;
            char pn[24] = "-", pn2[24] = "-", wall[24] = "-";
            if (in_fit && isfinite(above)) {
                fmt_num(pn, sizeof pn, above / n);
                fmt_num(pn2, sizeof pn2, above / (n * n));
            }
            if (isfinite(s->wall)) snprintf(wall, sizeof wall, "%.3f", s->wall);
            printf("  %10lld %11s %13s %11s %11s %9s  %s\n", (long long)s->n,
                   dhsa_cli_bytes(s->peak, b1, sizeof b1),
                   in_fit ? dhsa_cli_bytes(above, b2, sizeof b2) : "-", pn, pn2, wall,
                   status_text(b3, sizeof b3, s));
        }
        printf("\n");
        if (base_ok)
            printf("  %-9s %s: median peak of the --baseline command\n", "baseline",
                   dhsa_cli_bytes(base.peak, b1, sizeof b1));
        else if (an.fitted)
            printf("  %-9s %s: the fitted constant c (%s)\n", "baseline",
                   dhsa_cli_bytes(an.c, b1, sizeof b1),
                   baseline_text ? "the --baseline command failed" : "no --baseline command");
        if (an.fitted) {
            printf("  %-9s peak = %.6g * n^2 %c %.6g * n %c %.6g bytes\n", "fit", an.a,
                   an.b < 0 ? '-' : '+', fabs(an.b), an.c < 0 ? '-' : '+', fabs(an.c));
            printf("  %-9s %.6g bytes per n^2 (a), %.6g bytes per n (b)\n", "per n", an.a, an.b);
            printf("  %-9s the fit misses the measured peaks by at most %.3g%% (%d sizes)\n",
                   "residual", 100.0 * an.residual, an.points);
            if (isnan(an.slope))
                printf("  %-9s none: fewer than 2 sizes peak above the baseline\n", "slope");
            else
                printf("  %-9s %.3f: log-log slope of (peak - baseline) vs n\n", "slope",
                       an.slope);
            printf("  %-9s the n^2 term is %.1f%% of the fitted growth at n=%.0f\n", "n^2 share",
                   100.0 * an.n2_share, an.n_max);
        }
        char from[48] = "";
        if (failed && an.fitted) snprintf(from, sizeof from, " (from %d of %d sizes)", m, n_sizes);
        printf("  %-9s %s%s: %s\n", "verdict", dhsa_memprobe_verdict_name(an.verdict), from,
               an.reason);
        if (failures[0]) printf("  %-9s %s\n", "FAILED", failures);
        if (an.fitted && isfinite(budget)) {
            if (isinf(max_n) && an.verdict == DHSA_MEMPROBE_CONSTANT)
                printf("  %-9s the peak does not grow with n: any n fits within %s (%s)\n",
                       "budget", dhsa_cli_bytes(budget, b1, sizeof b1), budget_src);
            else if (isinf(max_n))
                printf("  %-9s the fitted peak never reaches %s (%s)\n", "budget",
                       dhsa_cli_bytes(budget, b1, sizeof b1), budget_src);
            else
                printf("  %-9s largest n within %s (%s): %.0f%s\n", "budget",
                       dhsa_cli_bytes(budget, b1, sizeof b1), budget_src, max_n,
                       max_n > an.n_max ? " (extrapolated from the fit)" : "");
        }
    }
    fflush(stdout);
    if (svg && write_svg(svg, cmd, sz, n_sizes, &an) != 0) {
        fprintf(stderr, "%s: %s\n", cmd_name, dhsa_last_error());
        ok = 0;
    }
    if (!ok)
        fprintf(stderr, "%s: %s\n", cmd_name,
                failures[0] ? failures : an.reason[0] ? an.reason : "no fit");
    for (int k = 0; k < n_sizes; k++) {
        free(sz[k].runs);
        free(sz[k].tail);
    }
    free(sz);
    free(base.runs);
    free(base.tail);
    free(base_cmd);
    free(base_storage);
    return ok ? 0 : EXIT_RUN;
}
