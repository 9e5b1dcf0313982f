/* test_memprobe.c: the memory probe (tools/lib/memprobe.c, `dhsa memprobe`)
 * and the SVG writer (tools/lib/svg_plot.c).
 *
 *   - The fit on exact synthetic data gives back the exact coefficients
 *     (also at n = 2^20, bytes = 2^40, where unscaled normal equations
 *     would lose them), and a perturbed point moves them (the check can
 *     fail); the budget solver against a brute-force search; the verdict
 *     rules on synthetic peaks.
 *   - One command at a time through the library: ok, exit status, signal,
 *     timeout (SIGTERM, and SIGKILL when SIGTERM is ignored), a command that
 *     cannot be started, and the output tail.
 *   - The CLI on programs built from tests/progs/: alloc_quadratic (a*n^2
 *     bytes) must give a within 5% and "quadratic", alloc_linear (b*n bytes)
 *     b within 5% and "linear"; a crash, an exit status and a timeout are
 *     reported as such with exit code 1; usage errors exit 2. The JSON is
 *     checked to parse.
 *   - The SVG is well-formed (balanced tags, escaped text), starts with
 *     <svg, ends with </svg> and has one marker per measured point.
 * Under AddressSanitizer (make asan) the target programs carry shadow
 * memory, so the 5% checks on a and b are skipped (the verdicts are still
 * checked).
 * Run: make test (or DHSA_CLI=build/dhsa build/tests/test_memprobe).
 * Programs are found next to the CLI: $(dirname $DHSA_CLI)/progs/NAME.
 */
#include "dhsa.h"
#include "lib/memprobe.h"
#include "t.h"
#include "lib/svg.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define TEST_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_UNDER_ASAN 1
#endif
#endif

#define MIB 1048576.0

static char cli[512], progs[512], tmpdir[256];

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int rel_close(double got, double want, double rtol) {
    return fabs(got - want) <= rtol * fabs(want);
}

/* ----------------------------------------------------------------- fit --- */

static void test_fit(void) {
    /* Exact data: y = a n^2 + b n + c. */
    static const struct {
        double a, b, c, n0;
    } cases[] = {
        {16.0, 1000.0, 5e6, 1024},     /* a quadratic program */
        {0.0, 65536.0, 1.2e6, 1024},   /* a linear one (a = 0 exactly) */
        {144.0, 3e5, 3e8, 512},        /* PyTorch-like, big baseline */
        {1.0, 1e6, 1e12, 1 << 17},     /* n up to 2^20, bytes ~ 2^40 */
        {-0.5, 2e4, 1e6, 100},         /* concave */
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        double x[5], y[5], coef[3];
        for (int i = 0; i < 5; i++) {
            x[i] = cases[k].n0 * (double)(1 << i) * (i == 4 ? 0.75 : 1.0); /* not all powers of 2 */
            y[i] = (cases[k].a * x[i] + cases[k].b) * x[i] + cases[k].c;
        }
        dhsa_status st = dhsa_memprobe_fit(x, y, 5, coef);
        T_CHECK(st == DHSA_OK, "case %zu: fit failed: %s", k, dhsa_last_error());
        /* Each coefficient within 1e-9 of the largest term it carries. */
        double n = x[3], ymax = y[3];
        T_CHECK(fabs(coef[0] - cases[k].a) * n * n <= 1e-9 * ymax, "case %zu: a = %.12g, want %g",
                k, coef[0], cases[k].a);
        T_CHECK(fabs(coef[1] - cases[k].b) * n <= 1e-9 * ymax, "case %zu: b = %.12g, want %g", k,
                coef[1], cases[k].b);
        T_CHECK(fabs(coef[2] - cases[k].c) <= 1e-9 * ymax, "case %zu: c = %.12g, want %g", k,
                coef[2], cases[k].c);
        /* Three points: the fit is the interpolating parabola. */
        st = dhsa_memprobe_fit(x + 1, y + 1, 3, coef);
        T_CHECK(st == DHSA_OK && fabs(coef[0] - cases[k].a) * n * n <= 1e-9 * ymax,
                "case %zu, 3 points: a = %.12g, want %g", k, coef[0], cases[k].a);
    }

    /* The check can fail: one point 10% off moves a well away. */
    double x[4] = {1024, 2048, 4096, 8192}, y[4], coef[3];
    for (int i = 0; i < 4; i++) y[i] = 16.0 * x[i] * x[i] + 1e6;
    y[2] *= 1.1;
    T_CHECK(dhsa_memprobe_fit(x, y, 4, coef) == DHSA_OK && fabs(coef[0] - 16.0) > 0.1,
            "a 10%% error on one point left a = %g (want it visibly off 16)", coef[0]);

    /* Least squares, not interpolation: noise symmetric around the exact
     * values cancels at the right place. With points +e, -e, +e, -e on a
     * line the fit is that line's best parabola; check the residual sum
     * of squares is no more than that of the true parabola. */
    for (int i = 0; i < 4; i++) y[i] = 65536.0 * x[i] + (i % 2 ? -1e5 : 1e5);
    T_CHECK(dhsa_memprobe_fit(x, y, 4, coef) == DHSA_OK, "noisy fit failed");
    double rss_fit = 0, rss_true = 0;
    for (int i = 0; i < 4; i++) {
        double e = y[i] - ((coef[0] * x[i] + coef[1]) * x[i] + coef[2]);
        rss_fit += e * e;
        rss_true += 1e10;
    }
    T_CHECK(rss_fit <= rss_true * (1 + 1e-12), "fit RSS %g above the true curve's %g", rss_fit,
            rss_true);

    /* Fewer than 3 distinct sizes, and non-finite input, are refused. */
    double xd[4] = {1024, 1024, 2048, 2048}, yd[4] = {1, 2, 3, 4};
    T_CHECK(dhsa_memprobe_fit(xd, yd, 4, coef) == DHSA_ERR_INVALID_ARG,
            "2 distinct sizes were accepted");
    T_CHECK(strstr(dhsa_last_error(), "3 distinct") != NULL, "message: %s", dhsa_last_error());
    double yn[3] = {1, NAN, 3};
    T_CHECK(dhsa_memprobe_fit(x, yn, 3, coef) == DHSA_ERR_NONFINITE, "NaN peak was accepted");
}

static void test_slope(void) {
    double x[4] = {1024, 2048, 4096, 8192}, q[4], l[4], c[4];
    for (int i = 0; i < 4; i++) {
        q[i] = 16 * x[i] * x[i];
        l[i] = 3 * x[i];
        c[i] = i < 3 ? -1.0 : 5.0; /* one usable point */
    }
    T_CHECK(fabs(dhsa_memprobe_loglog_slope(x, q, 4) - 2.0) < 1e-12, "slope of n^2 = %g",
            dhsa_memprobe_loglog_slope(x, q, 4));
    T_CHECK(fabs(dhsa_memprobe_loglog_slope(x, l, 4) - 1.0) < 1e-12, "slope of n = %g",
            dhsa_memprobe_loglog_slope(x, l, 4));
    T_CHECK(isnan(dhsa_memprobe_loglog_slope(x, c, 4)), "slope of one point is not NaN");
}

/* ---------------------------------------------------------------- budget --- */

static double f2(double a, double b, double c, double n) { return (a * n + b) * n + c; }

static void test_max_n(void) {
    T_CHECK(dhsa_memprobe_max_n(16, 0, 0, 16e6) == 1000, "16 n^2 <= 16e6: %g",
            dhsa_memprobe_max_n(16, 0, 0, 16e6));
    T_CHECK(dhsa_memprobe_max_n(16, 0, 0, 16e6 - 1) == 999, "16 n^2 <= 16e6-1: %g",
            dhsa_memprobe_max_n(16, 0, 0, 16e6 - 1));
    T_CHECK(dhsa_memprobe_max_n(0, 100, 50, 1050) == 10, "100 n + 50 <= 1050: %g",
            dhsa_memprobe_max_n(0, 100, 50, 1050));
    T_CHECK(isinf(dhsa_memprobe_max_n(0, 0, 50, 1050)), "a constant never reaches the budget");
    T_CHECK(dhsa_memprobe_max_n(1, 1, 2000, 1000) == 0, "c over the budget: %g",
            dhsa_memprobe_max_n(1, 1, 2000, 1000));
    /* Concave: -n^2 + 100 n peaks at 2500. */
    T_CHECK(isinf(dhsa_memprobe_max_n(-1, 100, 0, 10000)), "concave below the budget");
    T_CHECK(dhsa_memprobe_max_n(-1, 100, 0, 2000) == 27, "concave first crossing: %g (want 27)",
            dhsa_memprobe_max_n(-1, 100, 0, 2000));
    /* Dips, then rises: f(0) = 30 = f(10). */
    T_CHECK(dhsa_memprobe_max_n(1, -10, 30, 30) == 10, "dip case: %g (want 10)",
            dhsa_memprobe_max_n(1, -10, 30, 30));
    /* Against brute force, convex and linear cases. */
    uint64_t s = 12345;
    int bad = 0;
    for (int t = 0; t < 300; t++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        double a = (double)((s >> 33) % 1000) / 10.0 * (t % 3 == 0 ? 0 : 1);
        double b = (double)((s >> 13) % 100000);
        double c = (double)((s >> 40) % 1000000);
        double B = c + 1e7 + (double)(s % 1000000000);
        double want = 0;
        while (f2(a, b, c, want + 1) <= B) want++;
        double got = dhsa_memprobe_max_n(a, b, c, B);
        if (got != want && !(a == 0 && b == 0)) {
            if (!bad) fprintf(stderr, "max_n(%g, %g, %g, %g) = %g, brute force %g\n", a, b, c, B,
                              got, want);
            bad++;
        }
    }
    T_CHECK(bad == 0, "%d of 300 budget solves disagree with brute force", bad);
}

/* -------------------------------------------------------------- verdict --- */

static dhsa_memprobe_analysis analyze(double a, double b, double c, double noise,
                                      double baseline) {
    double n[5] = {1024, 2048, 3072, 4096, 8192}, y[5];
    for (int i = 0; i < 5; i++) y[i] = f2(a, b, c, n[i]) * (1.0 + (i % 2 ? noise : -noise));
    dhsa_memprobe_analysis an;
    dhsa_status st = dhsa_memprobe_analyze(n, y, 5, baseline, &an);
    T_CHECK(st == DHSA_OK, "analyze failed: %s", dhsa_last_error());
    return an;
}

static void test_verdict(void) {
    dhsa_memprobe_analysis an = analyze(16, 0, 2e6, 0.0, NAN);
    T_CHECK(an.verdict == DHSA_MEMPROBE_QUADRATIC && fabs(an.slope - 2) < 1e-6,
            "16 n^2: %s (%s)", dhsa_memprobe_verdict_name(an.verdict), an.reason);
    an = analyze(0, 65536, 2e6, 0.0, NAN);
    T_CHECK(an.verdict == DHSA_MEMPROBE_LINEAR && fabs(an.slope - 1) < 1e-6, "65536 n: %s (%s)",
            dhsa_memprobe_verdict_name(an.verdict), an.reason);
    an = analyze(0, 65536, 2e6, 0.001, NAN); /* 0.1% noise */
    T_CHECK(an.verdict == DHSA_MEMPROBE_LINEAR, "65536 n with noise: %s (%s)",
            dhsa_memprobe_verdict_name(an.verdict), an.reason);
    an = analyze(0, 10, 50e6, 0.0, NAN); /* 80 KiB of growth */
    T_CHECK(an.verdict == DHSA_MEMPROBE_CONSTANT, "10 n + 50 MB: %s (%s)",
            dhsa_memprobe_verdict_name(an.verdict), an.reason);
    /* Half and half at n = 8192: in between. */
    an = analyze(1, 8192 * 3, 1e6, 0.0, NAN);
    T_CHECK(an.verdict == DHSA_MEMPROBE_OTHER && an.n2_share > 0.2 && an.n2_share < 0.3,
            "n^2 + 3*8192 n: %s, share %g (%s)", dhsa_memprobe_verdict_name(an.verdict),
            an.n2_share, an.reason);
    /* PyTorch's fast path: 144 n^2 over a 300 MB process, measured baseline. */
    an = analyze(144, 1000, 3e8, 0.0, 3e8);
    T_CHECK(an.verdict == DHSA_MEMPROBE_QUADRATIC && an.baseline_measured &&
                rel_close(an.a, 144, 1e-9),
            "144 n^2 + 300 MB: %s, a %g (%s)", dhsa_memprobe_verdict_name(an.verdict), an.a,
            an.reason);
    /* Not a parabola: exponential growth misses the fit by far more than 5%. */
    double n[5] = {1024, 2048, 3072, 4096, 8192}, y[5];
    for (int i = 0; i < 5; i++) y[i] = 1e6 * exp2(n[i] / 1024.0);
    dhsa_memprobe_analyze(n, y, 5, NAN, &an);
    T_CHECK(an.verdict == DHSA_MEMPROBE_OTHER && an.residual > DHSA_MEMPROBE_MAX_RESIDUAL,
            "2^(n/1024): %s, residual %g (%s)", dhsa_memprobe_verdict_name(an.verdict),
            an.residual, an.reason);
    /* Two sizes: no fit. */
    dhsa_memprobe_analyze(n, y, 2, NAN, &an);
    T_CHECK(an.verdict == DHSA_MEMPROBE_UNKNOWN && !an.fitted && strstr(an.reason, "3 distinct"),
            "2 sizes: %s (%s)", dhsa_memprobe_verdict_name(an.verdict), an.reason);
    T_CHECK(dhsa_memprobe_analyze(n, y, 3, -1.0, &an) == DHSA_ERR_INVALID_ARG,
            "a negative baseline was accepted");
}

/* ---------------------------------------------------------- substitution --- */

static void test_substitute(void) {
    char *in[] = {"prog", "--len={n}", "{n}{n}", "x{n", NULL}, **out;
    int hits = 0;
    T_CHECK(dhsa_memprobe_substitute(in, 8192, &out, &hits) == DHSA_OK, "substitute failed");
    T_CHECK(hits == 3 && strcmp(out[0], "prog") == 0 && strcmp(out[1], "--len=8192") == 0 &&
                strcmp(out[2], "81928192") == 0 && strcmp(out[3], "x{n") == 0 && !out[4],
            "substitute: %d hits, [%s, %s, %s, %s]", hits, out[0], out[1], out[2], out[3]);
    dhsa_memprobe_free_argv(out);
}

/* ---------------------------------------------------------------- runs --- */

static void prog_path(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/%s", progs, name);
}

static void test_run(void) {
    char path[1200];
    prog_path(path, sizeof path, "alloc_linear");
    if (access(path, X_OK) != 0) {
        T_SKIP(11, "%s not built (make test builds tests/progs): library run tests skipped", path);
        return;
    }
    dhsa_memprobe_run_params p = dhsa_memprobe_default_run_params();
    p.timeout_s = 20;
    dhsa_memprobe_result r;

    /* 64 MiB, written: the peak holds them, ru_maxrss and VmHWM agree. */
    char *ok_argv[] = {path, "1024", "65536", NULL};
    dhsa_status st = dhsa_memprobe_run(ok_argv, &p, &r);
    T_CHECK(st == DHSA_OK && r.state == DHSA_MEMPROBE_OK, "alloc_linear: %s, state %s",
            dhsa_last_error(), dhsa_memprobe_state_name(r.state));
    T_CHECK(r.peak_bytes >= 64 * MIB && r.peak_bytes < 64 * MIB + 64 * MIB,
            "alloc_linear 64 MiB: peak %.1f MiB", (double)r.peak_bytes / MIB);
    T_CHECK(r.peak_bytes == (r.ru_maxrss_bytes > r.vmhwm_bytes ? r.ru_maxrss_bytes : r.vmhwm_bytes),
            "peak is not max(ru_maxrss, VmHWM)");
    T_CHECK(r.wall_s > 0 && r.wall_s < 20, "wall %g s", r.wall_s);

    char crash[1200], sleepy[1200];
    prog_path(crash, sizeof crash, "crash");
    prog_path(sleepy, sizeof sleepy, "sleepy");
    char *exit_argv[] = {crash, "16", "exit", NULL};
    st = dhsa_memprobe_run(exit_argv, &p, &r);
    T_CHECK(st == DHSA_OK && r.state == DHSA_MEMPROBE_EXIT && r.exit_code == 3,
            "crash exit: state %s, code %d", dhsa_memprobe_state_name(r.state), r.exit_code);
    T_CHECK(strstr(r.tail, "failing on purpose") != NULL, "output tail: \"%s\"", r.tail);

    char *abort_argv[] = {crash, "16", "abort", NULL};
    st = dhsa_memprobe_run(abort_argv, &p, &r);
    T_CHECK(st == DHSA_OK && r.state == DHSA_MEMPROBE_SIGNAL && r.signal == SIGABRT,
            "crash abort: state %s, signal %d", dhsa_memprobe_state_name(r.state), r.signal);
    T_CHECK(strcmp(dhsa_memprobe_signal_name(SIGABRT), "SIGABRT") == 0 &&
                strcmp(dhsa_memprobe_signal_name(SIGSEGV), "SIGSEGV") == 0,
            "signal names");

    /* Timeout: SIGTERM ends sleepy; with SIGTERM ignored, SIGKILL after the
     * grace time. */
    p.timeout_s = 0.2;
    p.grace_s = 0.2;
    char *sleep_argv[] = {sleepy, "30", NULL};
    double t0 = now_s();
    st = dhsa_memprobe_run(sleep_argv, &p, &r);
    double t = now_s() - t0;
    T_CHECK(st == DHSA_OK && r.state == DHSA_MEMPROBE_TIMEOUT && r.signal == SIGTERM && t < 5,
            "sleepy: state %s, signal %d, %.2f s", dhsa_memprobe_state_name(r.state), r.signal, t);
    char *stubborn_argv[] = {sleepy, "30", "ignore-term", NULL};
    t0 = now_s();
    st = dhsa_memprobe_run(stubborn_argv, &p, &r);
    t = now_s() - t0;
    T_CHECK(st == DHSA_OK && r.state == DHSA_MEMPROBE_TIMEOUT && r.signal == SIGKILL &&
                t >= 0.35 && t < 5,
            "sleepy ignore-term: state %s, signal %d, %.2f s", dhsa_memprobe_state_name(r.state),
            r.signal, t);

    /* Cannot be started: an error, told apart from an exit status 127. */
    char missing[1200];
    prog_path(missing, sizeof missing, "no-such-program");
    char *missing_argv[] = {missing, "1", NULL};
    st = dhsa_memprobe_run(missing_argv, &p, &r);
    T_CHECK(st == DHSA_ERR_IO && r.state == DHSA_MEMPROBE_EXEC_FAILED && r.exit_code == ENOENT &&
                strstr(dhsa_last_error(), "cannot run"),
            "missing program: %s, state %s, errno %d: %s", dhsa_status_str(st),
            dhsa_memprobe_state_name(r.state), r.exit_code, dhsa_last_error());
}

/* ----------------------------------------------------------- JSON, XML --- */

/* A minimal JSON syntax check (RFC 8259 grammar, no semantics). */
static const char *js_ws(const char *p) {
    while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r') p++;
    return p;
}
static const char *js_value(const char *p, int depth);
static const char *js_string(const char *p) {
    if (*p != '"') return NULL;
    for (p++; *p && *p != '"'; p++) {
        if ((unsigned char)*p < 0x20) return NULL;
        if (*p == '\\') {
            p++;
            if (*p == 'u') {
                for (int i = 1; i <= 4; i++)
                    if (!strchr("0123456789abcdefABCDEF", p[i]) || !p[i]) return NULL;
                p += 4;
            } else if (!*p || !strchr("\"\\/bfnrt", *p)) {
                return NULL;
            }
        }
    }
    return *p == '"' ? p + 1 : NULL;
}
static const char *js_value(const char *p, int depth) {
    if (depth > 32) return NULL;
    p = js_ws(p);
    if (*p == '{' || *p == '[') {
        char close = *p == '{' ? '}' : ']';
        int obj = *p == '{';
        p = js_ws(p + 1);
        if (*p == close) return p + 1;
        for (;;) {
            if (obj) {
                p = js_string(js_ws(p));
                if (!p) return NULL;
                p = js_ws(p);
                if (*p++ != ':') return NULL;
            }
            p = js_value(p, depth + 1);
            if (!p) return NULL;
            p = js_ws(p);
            if (*p == ',') {
                p++;
                continue;
            }
            return *p == close ? p + 1 : NULL;
        }
    }
    if (*p == '"') return js_string(p);
    if (strncmp(p, "true", 4) == 0) return p + 4;
    if (strncmp(p, "false", 5) == 0) return p + 5;
    if (strncmp(p, "null", 4) == 0) return p + 4;
    char *end;
    if (*p != '-' && (*p < '0' || *p > '9')) return NULL;
    strtod(p, &end);
    return end == p ? NULL : end;
}
static int json_valid(const char *s) {
    const char *e = js_value(s, 0);
    return e && *js_ws(e) == '\0';
}

/* The number after "key": at or after `from`; NAN if absent or null. */
static double json_num(const char *from, const char *key) {
    char pat[96];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *p = from ? strstr(from, pat) : NULL;
    if (!p) return NAN;
    p += strlen(pat);
    char *end;
    double v = strtod(p, &end);
    return end == p ? NAN : v;
}

/* The string value after "key": at or after `from`, copied into buf. */
static const char *json_str(const char *from, const char *key, char *buf, size_t cap) {
    char pat[96];
    snprintf(pat, sizeof pat, "\"%s\": \"", key);
    const char *p = from ? strstr(from, pat) : NULL;
    buf[0] = '\0';
    if (!p) return buf;
    p += strlen(pat);
    size_t n = 0;
    while (p[n] && p[n] != '"' && n + 1 < cap) n++;
    memcpy(buf, p, n);
    buf[n] = '\0';
    return buf;
}

/* The per-size result object of size n in memprobe's JSON. */
static const char *json_result(const char *js, long long n) {
    char pat[64];
    snprintf(pat, sizeof pat, "{\"n\": %lld, ", n);
    const char *r = js ? strstr(js, "\"results\"") : NULL;
    return r ? strstr(r, pat) : NULL;
}

/* Tags balanced, entities known, nothing but whitespace outside the root.
 * Returns the number of elements, or -1 (and says why) when malformed. */
static int xml_check(const char *s) {
    const char *stack[256];
    size_t len[256];
    int depth = 0, elements = 0;
    for (const char *p = s; *p; p++) {
        if (*p == '&') {
            if (strncmp(p, "&amp;", 5) && strncmp(p, "&lt;", 4) && strncmp(p, "&gt;", 4) &&
                strncmp(p, "&quot;", 6) && strncmp(p, "&apos;", 6)) {
                fprintf(stderr, "xml: bad entity at \"%.20s\"\n", p);
                return -1;
            }
            continue;
        }
        if (*p == '>') {
            fprintf(stderr, "xml: stray '>' at \"%.20s\"\n", p);
            return -1;
        }
        if (*p != '<') {
            if (depth == 0 && *p != ' ' && *p != '\n') return -1;
            continue;
        }
        int closing = p[1] == '/';
        const char *name = p + 1 + closing;
        size_t nl = strcspn(name, " \t\n/>");
        const char *end = strchr(p, '>');
        if (!end || nl == 0) return -1;
        for (const char *q = name + nl; q < end; q++) /* attribute values quoted, no '<' */
            if (*q == '<') return -1;
        int self = end[-1] == '/';
        if (closing) {
            if (depth == 0 || len[depth - 1] != nl || strncmp(stack[depth - 1], name, nl)) {
                fprintf(stderr, "xml: </%.*s> does not close the open element\n", (int)nl, name);
                return -1;
            }
            depth--;
        } else {
            elements++;
            if (!self) {
                if (depth == 256) return -1;
                stack[depth] = name;
                len[depth++] = nl;
            }
        }
        p = end;
    }
    if (depth != 0) {
        fprintf(stderr, "xml: %d elements left open\n", depth);
        return -1;
    }
    return elements;
}

static int count_str(const char *s, const char *pat) {
    int n = 0;
    for (const char *p = strstr(s, pat); p; p = strstr(p + 1, pat)) n++;
    return n;
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (cap - n < 1024) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) break;
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (buf) buf[n] = '\0';
    return buf;
}

/* Ends with </svg> and a newline, starts with <svg. */
static void check_svg_text(const char *svg, int want_points, const char *what) {
    size_t n = strlen(svg);
    T_CHECK(strncmp(svg, "<svg", 4) == 0, "%s: does not start with <svg", what);
    T_CHECK(n >= 7 && strcmp(svg + n - 7, "</svg>\n") == 0, "%s: does not end with </svg>",
            what);
    T_CHECK(xml_check(svg) > 0, "%s: not well-formed XML", what);
    int pts = count_str(svg, "class=\"pt\"");
    T_CHECK(pts == want_points, "%s: %d points drawn, want %d", what, pts, want_points);
}

/* ----------------------------------------------------------------- SVG --- */

static void test_svg(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/plot.svg", tmpdir);
    double x[6] = {1024, 2048, 4096, 8192, 16384, 32768};
    double y[6] = {17e6, 65e6, 257e6, 1.07e9, -1.0, NAN}; /* 2 not drawable on log axes */
    dhsa_plot *p = dhsa_plot_create("a<b & \"c\" 'd'", "n", "bytes");
    T_CHECK(p != NULL, "dhsa_plot_create failed");
    if (!p) return;
    dhsa_plot_set_log(p, DHSA_AXIS_X, 1);
    dhsa_plot_set_log(p, DHSA_AXIS_Y, 1);
    dhsa_plot_set_format(p, DHSA_AXIS_Y, DHSA_AXIS_BYTES);
    T_CHECK(dhsa_plot_set_subtitle(p, "invalid \xff utf-8, valid \xc3\xa9") == DHSA_OK,
            "subtitle");
    T_CHECK(dhsa_plot_add(p, "measured", DHSA_PLOT_POINTS, x, y, 6) == DHSA_OK, "add points");
    T_CHECK(dhsa_plot_add(p, "fit & co", DHSA_PLOT_LINE | DHSA_PLOT_DASHED, x, y, 6) == DHSA_OK,
            "add line");
    T_CHECK(dhsa_plot_add(p, NULL, DHSA_PLOT_LINE | DHSA_PLOT_POINTS, x, y, 2) == DHSA_OK,
            "add unnamed");
    T_CHECK(dhsa_plot_add(p, "x", 0, x, y, 2) == DHSA_ERR_INVALID_ARG, "style 0 accepted");
    T_CHECK(dhsa_plot_set_range(p, DHSA_AXIS_Y, -1, NAN) == DHSA_ERR_INVALID_ARG,
            "a negative end accepted on a log axis");
    T_CHECK(dhsa_plot_count_drawn(p) == 6, "drawn points %lld, want 4 + 2",
            (long long)dhsa_plot_count_drawn(p));
    T_CHECK(dhsa_plot_save(p, path) == DHSA_OK, "save: %s", dhsa_last_error());
    dhsa_plot_free(p);
    char *svg = read_file(path);
    T_CHECK(svg != NULL, "cannot read %s", path);
    if (!svg) return;
    check_svg_text(svg, 6, "log-log plot");
    T_CHECK(strstr(svg, "a&lt;b &amp; &quot;c&quot; &apos;d&apos;") && !strstr(svg, "a<b"),
            "title not escaped");
    T_CHECK(strstr(svg, "invalid ? utf-8, valid \xc3\xa9") != NULL,
            "invalid UTF-8 not replaced or valid UTF-8 not kept");
    T_CHECK(strstr(svg, "1 GiB") != NULL && strstr(svg, "4096") != NULL,
            "tick labels missing (want 1 GiB on y, 4096 on x)");
    /* The line breaks at the non-drawable points: one polyline of 4 points
     * for the fit, one of 2 for the unnamed series. */
    T_CHECK(count_str(svg, "<polyline") == 2, "%d polylines, want 2",
            count_str(svg, "<polyline"));
    free(svg);

    /* Linear axes, a fixed y range from 0, an empty series, and a plot with
     * no data at all: still well-formed. */
    p = dhsa_plot_create(NULL, NULL, NULL);
    T_CHECK(p != NULL, "create without text");
    if (!p) return;
    dhsa_plot_set_range(p, DHSA_AXIS_Y, 0, NAN);
    dhsa_plot_add(p, "empty", DHSA_PLOT_POINTS, NULL, NULL, 0);
    T_CHECK(dhsa_plot_save(p, path) == DHSA_OK, "save empty: %s", dhsa_last_error());
    svg = read_file(path);
    if (svg) check_svg_text(svg, 0, "empty plot");
    T_CHECK(svg && strstr(svg, "no data"), "empty plot has no \"no data\" note");
    free(svg);
    double ly[3] = {0.25, 0.5, 0.75}, lx[3] = {-1, 0, 1};
    dhsa_plot_add(p, "line", DHSA_PLOT_POINTS | DHSA_PLOT_LINE, lx, ly, 3);
    T_CHECK(dhsa_plot_save(p, path) == DHSA_OK, "save linear");
    svg = read_file(path);
    if (svg) check_svg_text(svg, 3, "linear plot");
    free(svg);
    snprintf(path, sizeof path, "%s/no-such-dir/x.svg", tmpdir);
    T_CHECK(dhsa_plot_save(p, path) == DHSA_ERR_IO, "writing into a missing directory worked");
    dhsa_plot_free(p);
}

/* ----------------------------------------------------------------- CLI --- */

/* Runs `cli memprobe ARGS`; stdout in *out, stderr in *err (caller frees);
 * returns the exit status (-1 if it did not exit). */
static int run_cli(const char *args, char **out, char **err) {
    char cmd[8192], ofile[512], efile[512];
    snprintf(ofile, sizeof ofile, "%s/out.txt", tmpdir);
    snprintf(efile, sizeof efile, "%s/err.txt", tmpdir);
    snprintf(cmd, sizeof cmd, "'%s' %s >'%s' 2>'%s'", cli, args, ofile, efile);
    int st = system(cmd);
    *out = read_file(ofile);
    *err = read_file(efile);
    if (!*out) *out = calloc(1, 1);
    if (!*err) *err = calloc(1, 1);
    return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_cli_fits(void) {
    char args[4096], *out, *err, v[64];
    /* 16 bytes per n^2: 16 MiB .. 1 GiB. */
    snprintf(args, sizeof args,
             "memprobe --json --quiet --sizes 1024,2048,4096,8192 -- '%s/alloc_quadratic' "
             "{n} 16",
             progs);
    double t0 = now_s();
    int rc = run_cli(args, &out, &err);
    double t = now_s() - t0;
    T_CHECK(rc == 0, "quadratic: exit %d\n%s%s", rc, out, err);
    T_CHECK(json_valid(out), "quadratic: output is not valid JSON:\n%s", out);
    double a = json_num(out, "a"), b = json_num(out, "b"), slope = json_num(out, "slope");
    json_str(out, "verdict", v, sizeof v);
    T_CHECK(strcmp(v, "quadratic") == 0, "quadratic: verdict \"%s\"\n%s", v, out);
    T_CHECK(fabs(slope - 2.0) < 0.1, "quadratic: slope %g", slope);
#ifdef TEST_UNDER_ASAN
    T_SKIP(2, "AddressSanitizer build: fitted a = %g (want 16 within 5%% without sanitizers)", a);
#else
    T_CHECK(rel_close(a, 16.0, 0.05), "quadratic: a = %g, want 16 within 5%%", a);
    /* The check can fail: the same data cannot pass for 20 bytes per n^2. */
    T_CHECK(!rel_close(a, 20.0, 0.05), "quadratic: a = %g also passes for 20", a);
#endif
    T_CHECK(json_num(out, "max_n_for_budget") > 8192, "quadratic: max n for the budget %g",
            json_num(out, "max_n_for_budget"));
    fprintf(stderr, "memprobe alloc_quadratic: a = %.4g, b = %.4g, slope %.3f, %.1f s\n", a, b,
            slope, t);
    free(out);
    free(err);

    /* 64 KiB per n: 64 .. 512 MiB; the budget's n is (budget - c) / b. */
    snprintf(args, sizeof args,
             "memprobe --json --quiet --budget 1G --sizes 1024,2048,4096,8192 -- "
             "'%s/alloc_linear' {n} 65536",
             progs);
    t0 = now_s();
    rc = run_cli(args, &out, &err);
    t = now_s() - t0;
    T_CHECK(rc == 0, "linear: exit %d\n%s%s", rc, out, err);
    T_CHECK(json_valid(out), "linear: output is not valid JSON:\n%s", out);
    a = json_num(out, "a");
    b = json_num(out, "b");
    double c = json_num(out, "c"), maxn = json_num(out, "max_n_for_budget");
    json_str(out, "verdict", v, sizeof v);
    T_CHECK(strcmp(v, "linear") == 0, "linear: verdict \"%s\"\n%s", v, out);
#ifdef TEST_UNDER_ASAN
    T_SKIP(3, "AddressSanitizer build: fitted b = %g, c = %g, max n for 1 GiB %g (want b = 65536 "
           "within 5%% without sanitizers)",
           b, c, maxn);
#else
    T_CHECK(rel_close(b, 65536.0, 0.05), "linear: b = %g, want 65536 within 5%%", b);
    T_CHECK(fabs(a) * 8192.0 * 8192.0 < 0.01 * b * 8192.0, "linear: a = %g is not negligible", a);
    T_CHECK(fabs(maxn - (1073741824.0 - c) / b) < 0.01 * maxn + 2,
            "linear: max n for 1 GiB %g, want about %g", maxn, (1073741824.0 - c) / b);
#endif
    fprintf(stderr, "memprobe alloc_linear: a = %.4g, b = %.4g, %.1f s\n", a, b, t);
    free(out);
    free(err);

    /* A measured baseline (the same program at n = 0 bytes per n^2), 3
     * repeats, and the SVG. */
    char svg_path[512];
    snprintf(svg_path, sizeof svg_path, "%s/memprobe.svg", tmpdir);
    snprintf(args, sizeof args,
             "memprobe --json --quiet --repeat 3 --svg '%s' --baseline '%s/alloc_quadratic {n} 0' "
             "--sizes 512,1024,2048,3072,4096 -- '%s/alloc_quadratic' {n} 8",
             svg_path, progs, progs);
    rc = run_cli(args, &out, &err);
    T_CHECK(rc == 0, "baseline: exit %d\n%s%s", rc, out, err);
    T_CHECK(json_valid(out), "baseline: output is not valid JSON:\n%s", out);
    json_str(out, "verdict", v, sizeof v);
    char kind[32];
    json_str(out, "baseline_kind", kind, sizeof kind);
    double base = json_num(out, "baseline_peak_bytes");
    T_CHECK(strcmp(v, "quadratic") == 0 && strcmp(kind, "command") == 0 && base > 0 &&
                base < 64 * MIB,
            "baseline: verdict %s, kind %s, baseline %g\n%s", v, kind, base, out);
    T_CHECK(count_str(out, "\"runs\": [{") == 5 && count_str(out, "\"wall_s\"") == 5 * 4,
            "baseline: want 5 sizes x 3 runs in the JSON\n%s", out);
    char *svg = read_file(svg_path);
    T_CHECK(svg != NULL, "no SVG written at %s", svg_path);
    if (svg) {
        check_svg_text(svg, 5, "memprobe --svg");
        T_CHECK(strstr(svg, "quadratic") != NULL, "the SVG does not name the verdict");
    }
    free(svg);
    free(out);
    free(err);

    /* A peak that does not grow: "constant", and no limit from a budget. */
    snprintf(args, sizeof args,
             "memprobe --json --quiet --sizes 100,200,300,400 -- '%s/alloc_linear' {n} 0", progs);
    rc = run_cli(args, &out, &err);
    json_str(out, "verdict", v, sizeof v);
    T_CHECK(rc == 0 && strcmp(v, "constant") == 0 && strstr(out, "\"budget_unbounded\": true") &&
                strstr(out, "\"max_n_for_budget\": null"),
            "constant: exit %d, verdict \"%s\"\n%s%s", rc, v, out, err);
    free(out);
    free(err);

    /* The text table names every column and the verdict. */
    snprintf(args, sizeof args,
             "memprobe --quiet --sizes 1024,2048,4096 -- '%s/alloc_linear' {n} 4096", progs);
    rc = run_cli(args, &out, &err);
    T_CHECK(rc == 0 && strstr(out, "peak - base") && strstr(out, "B per n^2") &&
                strstr(out, "verdict   linear") && strstr(out, "budget"),
            "table: exit %d\n%s%s", rc, out, err);
    free(out);
    free(err);
}

static void test_cli_failures(void) {
    char args[4096], *out, *err, v[64];
    /* A crash at the largest size: reported, out of the fit, exit 1. */
    snprintf(args, sizeof args,
             "memprobe --json --quiet --sizes 1024,2048,4096,8192 -- '%s/crash' {n} segv 8192",
             progs);
    int rc = run_cli(args, &out, &err);
    const char *r = json_result(out, 8192);
    T_CHECK(rc == 1, "crash: exit %d, want 1\n%s", rc, err);
    T_CHECK(json_valid(out), "crash: output is not valid JSON:\n%s", out);
    T_CHECK(r && strcmp(json_str(r, "status", v, sizeof v), "signal") == 0,
            "crash: status \"%s\", want signal", v);
    T_CHECK(r && strcmp(json_str(r, "signal", v, sizeof v), "SIGSEGV") == 0,
            "crash: signal \"%s\"", v);
    T_CHECK(r && strstr(r, "\"in_fit\": false") && json_num(out, "sizes_failed") == 1 &&
                strstr(out, "\"ok\": false"),
            "crash: not reported as a failure\n%s", out);
    T_CHECK(strstr(out, "\"fitted\": true") && strstr(json_str(out, "failures", v, sizeof v),
                                                      "n=8192 SIGSEGV"),
            "crash: the other 3 sizes should still be fitted, the failure named\n%s", out);
    T_CHECK(strstr(err, "SIGSEGV") && strstr(err, "failing on purpose"),
            "crash: stderr does not say what happened:\n%s", err);
    free(out);
    free(err);

    /* The text table shows the signal by name and the verdict line says
     * sizes were left out. */
    snprintf(args, sizeof args,
             "memprobe --quiet --sizes 1024,2048,4096,8192 -- '%s/crash' {n} abort 4096", progs);
    rc = run_cli(args, &out, &err);
    T_CHECK(rc == 1 && strstr(out, "SIGABRT") && strstr(out, "FAILED") &&
                strstr(out, "unknown"),
            "abort: exit %d\n%s%s", rc, out, err);
    free(out);
    free(err);

    /* Nonzero exit status. */
    snprintf(args, sizeof args, "memprobe --json --quiet --sizes 1,2,3 -- '%s/crash' {n} exit",
             progs);
    rc = run_cli(args, &out, &err);
    r = json_result(out, 2);
    T_CHECK(rc == 1 && r && strcmp(json_str(r, "status", v, sizeof v), "exit") == 0 &&
                json_num(r, "exit_code") == 3,
            "exit 3: exit %d\n%s", rc, out);
    json_str(out, "verdict", v, sizeof v);
    T_CHECK(strcmp(v, "unknown") == 0 && strstr(out, "\"fitted\": false") &&
                strstr(out, "\"a\": null"),
            "exit 3 everywhere: verdict \"%s\"\n%s", v, out);
    free(out);
    free(err);

    /* Timeout: reported, larger sizes skipped, well under the sleep. */
    snprintf(args, sizeof args,
             "memprobe --json --quiet --timeout 0.2 --grace 0.2 --sizes 30,31,32 -- "
             "'%s/sleepy' {n} ignore-term",
             progs);
    double t0 = now_s();
    rc = run_cli(args, &out, &err);
    double t = now_s() - t0;
    r = json_result(out, 30);
    T_CHECK(rc == 1 && t < 10, "timeout: exit %d after %.1f s", rc, t);
    T_CHECK(json_valid(out), "timeout: output is not valid JSON:\n%s", out);
    T_CHECK(r && strcmp(json_str(r, "status", v, sizeof v), "timeout") == 0,
            "timeout: status \"%s\"\n%s", v, out);
    T_CHECK(r && strcmp(json_str(r, "signal", v, sizeof v), "SIGKILL") == 0,
            "timeout: ended by \"%s\", want SIGKILL (SIGTERM is ignored)", v);
    r = json_result(out, 31);
    T_CHECK(r && strcmp(json_str(r, "status", v, sizeof v), "skipped") == 0,
            "after a timeout: status \"%s\", want skipped", v);
    free(out);
    free(err);

    /* Cannot be started. */
    snprintf(args, sizeof args, "memprobe --quiet --sizes 1,2,3 -- '%s/no-such-program' {n}",
             progs);
    rc = run_cli(args, &out, &err);
    T_CHECK(rc == 1 && strstr(err, "cannot run") && strstr(err, "No such file"),
            "missing program: exit %d, stderr:\n%s", rc, err);
    free(out);
    free(err);
}

static void test_cli_usage(void) {
    static const struct {
        const char *args, *want;
        int rc;
    } cases[] = {
        {"memprobe --help", "usage: dhsa memprobe", 0},
        {"help memprobe", "usage: dhsa memprobe", 0},
        {"memprobe -- /bin/true", "no \"{n}\"", 2},
        {"memprobe --sizes 1,2 -- /bin/true {n}", "at least 3", 2},
        {"memprobe --sizes 1,2,2,3 -- /bin/true {n}", "twice", 2},
        {"memprobe --sizes 1,x,3 -- /bin/true {n}", "--sizes: \"x\"", 2},
        {"memprobe --sizes 1,,3 -- /bin/true {n}", "--sizes", 2},
        {"memprobe --sizes 0,1,2 -- /bin/true {n}", "out of range", 2},
        {"memprobe --repeat 0 -- /bin/true {n}", "--repeat", 2},
        {"memprobe --timeout -1 -- /bin/true {n}", "--timeout", 2},
        {"memprobe --timeout nan -- /bin/true {n}", "--timeout", 2},
        {"memprobe --budget 16Q -- /bin/true {n}", "--budget", 2},
        {"memprobe --baseline '  ' -- /bin/true {n}", "empty", 2},
        {"memprobe --json=1 -- /bin/true {n}", "takes no value", 2},
        {"memprobe --sizes", "needs a value", 2},
        {"memprobe --bogus -- /bin/true {n}", "unknown option", 2},
        {"memprobe --sizes 1,2,3", "no command", 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out, *err;
        int rc = run_cli(cases[i].args, &out, &err);
        T_CHECK(rc == cases[i].rc, "dhsa %s: exit %d, want %d", cases[i].args, rc, cases[i].rc);
        T_CHECK(strstr(out, cases[i].want) || strstr(err, cases[i].want),
                "dhsa %s: no \"%s\" in:\n%s%s", cases[i].args, cases[i].want, out, err);
        free(out);
        free(err);
    }
}

/* ---------------------------------------------------------------- main --- */

int main(void) {
    const char *env = getenv("DHSA_CLI");
    snprintf(cli, sizeof cli, "%s", env && env[0] ? env : "build/dhsa");
    const char *slash = strrchr(cli, '/');
    snprintf(progs, sizeof progs, "%.*s/progs", slash ? (int)(slash - cli) : 1,
             slash ? cli : ".");
    snprintf(tmpdir, sizeof tmpdir, "/tmp/dhsa_memprobe_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        fprintf(stderr, "cannot make a temporary directory: %s\n", strerror(errno));
        return 1;
    }

    test_fit();
    test_slope();
    test_max_n();
    test_verdict();
    test_substitute();
    test_svg();
    test_run();

    char prog[1200];
    snprintf(prog, sizeof prog, "%s/alloc_quadratic", progs);
    if (access(cli, X_OK) != 0)
        T_SKIP(75, "%s not found (set DHSA_CLI): CLI tests skipped", cli);
    else if (access(prog, X_OK) != 0)
        T_SKIP(75, "%s not built (make test builds tests/progs): CLI tests skipped", prog);
    else {
        test_cli_usage();
        test_cli_fits();
        test_cli_failures();
    }

    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return t_report("test_memprobe");
}
