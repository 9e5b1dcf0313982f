/* test_cli.c: runs the built CLI (env DHSA_CLI, set by tests/run.sh;
 * default build/dhsa) and checks what a user sees: every --help exits 0
 * with a usage text; bad numbers and unknown options exit 2 with a message
 * naming the option; `bench attn` prints JSON with every documented key and
 * an error under tolerance, and refuses (exit 1, no timing) when its output
 * is deliberately corrupted; `peak --json` has its keys; `demo` runs and
 * shows the mask polarity refusal; --threads above the online CPUs is
 * capped with a warning by every subcommand. Skips when the binary is
 * missing.
 * Run: make test (or DHSA_CLI=build/dhsa build/tests/test_cli).
 */
#include "t.h"

#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *cli;

/* Runs `cli ARGS 2>&1`; returns the exit status (-1 if it did not exit
 * normally) and the output in *out (caller frees). */
static int run(const char *args, char **out) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", cli, args);
    FILE *p = popen(cmd, "r");
    size_t cap = 1 << 14, n = 0;
    char *buf = malloc(cap);
    if (!p || !buf) {
        if (p) pclose(p);
        free(buf);
        *out = NULL;
        return -1;
    }
    size_t got;
    while ((got = fread(buf + n, 1, cap - n - 1, p)) > 0) {
        n += got;
        if (cap - n < 1024) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) break;
            buf = nb;
            cap *= 2;
        }
    }
    buf[n] = '\0';
    int st = pclose(p);
    *out = buf;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The value text after "key": in a flat JSON object, or NULL. */
static const char *json_find(const char *js, const char *key) {
    char pat[128];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(js, pat);
    if (!p) return NULL;
    p += strlen(pat);
    while (*p == ' ') p++;
    return p;
}

/* 1 and *v if "key" holds a number. */
static int json_number(const char *js, const char *key, double *v) {
    const char *p = json_find(js, key);
    if (!p) return 0;
    char *end;
    *v = strtod(p, &end);
    return end != p && (*end == ',' || *end == '}' || *end == ' ');
}

/* --------------------------------------------------------------- help --- */

static void test_help(void) {
    static const char *cases[] = {"--help", "help", "help peak", "help bench", "help demo",
                                  "peak --help", "bench --help", "bench attn --help",
                                  "demo --help", "demo -h", "bench sparse --help",
                                  "bench decode --help", "memprobe --help", "help memprobe"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out;
        int rc = run(cases[i], &out);
        T_CHECK(rc == 0, "dhsa %s: exit %d, want 0", cases[i], rc);
        T_CHECK(out && strstr(out, "usage: dhsa"), "dhsa %s: no usage text in:\n%s", cases[i],
                out ? out : "(none)");
        free(out);
    }
    char *out;
    int rc = run("", &out);
    T_CHECK(rc == 2 && out && strstr(out, "usage: dhsa"), "dhsa with no command: exit %d", rc);
    free(out);
}

/* ---------------------------------------------------------- bad input --- */

static void test_bad_input(void) {
    static const struct {
        const char *args, *want; /* want: a substring of the message */
    } cases[] = {
        {"bench attn --L 12x --heads 2 --dim 64", "--L: \"12x\""},
        {"bench attn --L '' --heads 2 --dim 64", "--L: \"\""},
        {"bench attn --L -1 --heads 2 --dim 64", "out of range"},
        {"bench attn --L 0 --heads 2 --dim 64", "out of range"},
        {"bench attn --L 99999999999999999999 --heads 2 --dim 64", "out of range"},
        {"bench attn --L 9999999999999999K --heads 2 --dim 64", "out of range"},
        {"bench attn --L ' 64' --heads 2 --dim 64", "not an integer"},
        {"bench attn --L 64 --heads 2x --dim 64", "--heads"},
        {"bench attn --L 64 --heads 2 --dim 64 --runs 2", "--runs"},
        {"bench attn --L 64 --heads 2 --dim 64 --softcap abc", "--softcap"},
        {"bench attn --L 64 --heads 2 --dim 64 --softcap nan", "--softcap"},
        {"bench attn --L 64 --heads 2 --dim 64 --threads 0", "--threads"},
        {"bench attn --L 64 --heads 2 --dim 64 --dtype f8", "--dtype"},
        {"bench attn --L 64 --heads 3 --kv-heads 2 --dim 64", "multiple"},
        {"bench attn --heads 2 --dim 64", "--L is required"},
        {"bench attn --L 64 --heads 2 --dim", "needs a value"},
        {"bench attn --L 64 --heads 2 --dim 64 --causal=1", "takes no value"},
        {"bench attn --L 64 --heads 2 --dim 64 --bogus", "usage: dhsa bench attn"},
        {"bench nope", "unknown benchmark"},
        {"peak --threads abc", "--threads"},
        {"peak --threads 1.5", "--threads"},
        {"peak --bogus", "usage: dhsa peak"},
        {"peak stray", "unexpected argument"},
        {"demo --L 12x", "--L"},
        {"demo --bogus", "usage: dhsa demo"},
        {"frobnicate", "unknown command"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out;
        int rc = run(cases[i].args, &out);
        T_CHECK(rc == 2, "dhsa %s: exit %d, want 2; output:\n%s", cases[i].args, rc,
                out ? out : "(none)");
        T_CHECK(out && strstr(out, cases[i].want), "dhsa %s: message lacks \"%s\":\n%s",
                cases[i].args, cases[i].want, out ? out : "(none)");
        free(out);
    }
}

/* --------------------------------------------------------- bench attn --- */

static void test_bench_json(void) {
    static const char *keys[] = {
        "median_ms", "gflops", "peak_gflops", "peak_fraction", "workspace_bytes",
        "peak_rss_bytes", "max_abs_err", "L", "Lq", "heads", "kv_heads", "dim", "dv", "causal",
        "window", "dtype", "threads", "isa", "backend", "qkvo_bytes", "extra_rss_bytes", "kv_gbps"};
    char *out;
    const char *args =
        "bench attn --L 256 --heads 2 --kv-heads 1 --dim 64 --causal --runs 3 --json";
    int rc = run(args, &out);
    T_CHECK(rc == 0, "dhsa %s: exit %d; output:\n%s", args, rc, out ? out : "(none)");
    if (!out) return;
    const char *js = strchr(out, '{');
    T_CHECK(js != NULL, "no JSON object in:\n%s", out);
    if (!js) js = out;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        T_CHECK(json_find(js, keys[i]) != NULL, "bench JSON lacks \"%s\":\n%s", keys[i], js);
    double v = -1;
    T_CHECK(json_number(js, "max_abs_err", &v) && v >= 0 && v < 1e-3, "max_abs_err = %g", v);
    T_CHECK(json_number(js, "gflops", &v) && v > 0, "gflops = %g", v);
    T_CHECK(json_number(js, "median_ms", &v) && v > 0, "median_ms = %g", v);
    T_CHECK(json_number(js, "peak_fraction", &v) && v > 0, "peak_fraction = %g", v);
    T_CHECK(json_number(js, "workspace_bytes", &v) && v > 0, "workspace_bytes = %g", v);
    T_CHECK(json_number(js, "L", &v) && v == 256, "L = %g", v);
    T_CHECK(json_number(js, "qkvo_bytes", &v) && v == 4.0 * (2 * 256 * 64 * 2 + 256 * 64 * 2),
            "qkvo_bytes = %g", v);
    const char *c = json_find(js, "causal");
    T_CHECK(c && strncmp(c, "true", 4) == 0, "causal is not true");
    /* The key finder itself can fail: a key that is not there. */
    T_CHECK(json_find(js, "no_such_key") == NULL && !json_number(js, "dtype", &v),
            "json_find accepts what is not there");
    free(out);

    /* Decode shape, K suffix, f16: the decode keys appear. */
    args = "bench attn --L 1K --Lq 1 --heads 4 --kv-heads 2 --dim 32 --dtype f16 --runs 3 --json "
           "--peak-seconds 0.02 --peak-bytes 16M";
    rc = run(args, &out);
    T_CHECK(rc == 0, "dhsa %s: exit %d; output:\n%s", args, rc, out ? out : "(none)");
    if (out) {
        T_CHECK(json_number(out, "L", &v) && v == 1024, "--L 1K gave L = %g", v);
        T_CHECK(json_number(out, "read_gbps", &v) && v > 0, "decode read_gbps = %g", v);
        T_CHECK(json_number(out, "kv_gbps", &v) && v > 0, "decode kv_gbps = %g", v);
        T_CHECK(json_number(out, "max_abs_err", &v) && v < 2e-3, "f16 max_abs_err = %g", v);
        free(out);
    }

    /* The correctness gate: a corrupted output element must stop the run. */
    args = "bench attn --L 128 --heads 2 --dim 32 --runs 3 --json --corrupt";
    rc = run(args, &out);
    T_CHECK(rc == 1, "dhsa %s: exit %d, want 1", args, rc);
    T_CHECK(out && strstr(out, "FAILED") && !strstr(out, "median_ms"),
            "corrupted run still reported timing:\n%s", out ? out : "(none)");
    free(out);
}

/* ---------------------------------------------------------- peak, demo --- */

static void test_peak_json(void) {
    char *out;
    const char *args = "peak --json --threads 2 --seconds 0.05 --bytes 16M";
    int rc = run(args, &out);
    T_CHECK(rc == 0, "dhsa %s: exit %d; output:\n%s", args, rc, out ? out : "(none)");
    if (!out) return;
    double v = 0;
    T_CHECK(json_find(out, "isa") && *json_find(out, "isa") == '"', "peak JSON: isa:\n%s", out);
    T_CHECK(json_number(out, "gflops_1t", &v) && v > 0, "gflops_1t = %g", v);
    T_CHECK(json_number(out, "gflops_all", &v) && v > 0, "gflops_all = %g", v);
    T_CHECK(json_number(out, "threads", &v) && v == 2, "threads = %g", v);
    T_CHECK(json_number(out, "read_gbps", &v) && v > 0, "read_gbps = %g", v);
    free(out);
}

static void test_demo(void) {
    char *out;
    int rc = run("demo --L 1024", &out);
    T_CHECK(rc == 0, "dhsa demo --L 1024: exit %d; output:\n%s", rc, out ? out : "(none)");
    T_CHECK(out && strstr(out, "max_abs_err"), "demo prints no error figure");
    T_CHECK(out && strstr(out, "DHSA_MASK_NO_POLARITY ->") && !strstr(out, "ACCEPTED"),
            "demo does not show the polarity refusal:\n%s", out ? out : "(none)");
    free(out);
}

/* bench sparse / decode: the JSON keys, sane values, and errors */
static void test_sparse_json(void) {
    static const char *keys[] = {"dense_ms", "route_ms", "kernel_ms", "speedup", "density", "recall",
                                 "rel_err", "needle_hits", "needles"};
    char *out;
    const char *args = "bench sparse --L 3K --heads 4 --kv-heads 2 --dim 32 --method dhsa,block,stream "
                       "--dense-below 256 --runs 1 --json";
    int rc = run(args, &out);
    T_CHECK(rc == 0, "dhsa %s: exit %d; output:\n%s", args, rc, out ? out : "(none)");
    int lines = 0;
    for (const char *l = out ? out : ""; (l = strchr(l, '{')) != NULL; l++) {
        lines++;
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
            T_CHECK(json_find(l, keys[i]) != NULL, "bench sparse JSON lacks \"%s\":\n%s", keys[i], l);
        double v;
        T_CHECK(json_number(l, "recall", &v) && v > 0 && v <= 1, "recall = %g", v);
        T_CHECK(json_number(l, "density", &v) && v > 0 && v < 1, "density = %g", v);
        T_CHECK(json_number(l, "needles", &v) && v == 8, "needles = %g", v);
    }
    T_CHECK(lines == 3, "bench sparse printed %d objects for 3 methods:\n%s", lines, out ? out : "");
    free(out);
    args = "bench decode --L 4K --heads 8 --kv-heads 2 --dim 32 --dense-below 512 --runs 3 --json";
    rc = run(args, &out);
    T_CHECK(rc == 0, "dhsa %s: exit %d; output:\n%s", args, rc, out ? out : "(none)");
    double v;
    T_CHECK(out && json_number(out, "bytes_ratio", &v) && v > 1, "decode bytes_ratio = %g", v);
    T_CHECK(out && json_number(out, "recall", &v) && v > 0 && v <= 1, "decode recall = %g", v);
    free(out);
    static const char *bad[] = {"bench sparse --L 1K --method nope", "bench sparse --L 1K --boundary learned:/nonexistent",
                                "bench sparse --L 1K --density 2", "bench decode --L 1K --heads 3 --kv-heads 2",
                                "bench sparse --heads 4"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rc = run(bad[i], &out);
        T_CHECK(rc == 1 || rc == 2, "dhsa %s: exit %d, want 1 or 2", bad[i], rc);
        free(out);
    }
}

/* ------------------------------------------------------------ threads --- */

/* --threads above the online CPUs is capped to them with a warning line, at
 * every subcommand that takes it (tools/cli_base.c, dhsa_cli_threads): 999
 * threads on 2 cores took 97 s for what 2 do in 1-2 s. Each subcommand is
 * stopped by a bad option after --threads (the warning comes first); `run`
 * runs whole, in little time, with the output of --threads CPUs. */
#define N_THREAD_CHECKS 17
static void test_threads_capped(void) {
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (cpus < 1 || cpus >= 1000) {
        T_SKIP(N_THREAD_CHECKS, "%ld online CPUs: --threads 1000 is not above them", cpus);
        return;
    }
    char want[128];
    snprintf(want, sizeof want, "warning: --threads 1000 is above the %ld online CPUs: using %ld", cpus, cpus);
    const char *subs[] = {"run", "plan", "bench model", "bench attn", "bench matmul", "bench sparse", "bench decode",
                          "peak", "demo", "eval fidelity", "eval passkey", "train-boundary", "serve"};
    for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++) {
        char args[256], *out;
        snprintf(args, sizeof args, "%s --threads 1000 --no-such-option", subs[i]);
        run(args, &out);
        T_CHECK(out && strstr(out, want), "dhsa %s: no \"%s\" in:\n%.2000s", args, want, out ? out : "(none)");
        free(out);
    }
    char args[256], *ref = NULL, *out = NULL;
    snprintf(args, sizeof args, "run -p 'Once upon a time' -n 8 --ctx 64 --temp 0 --ids --threads %ld", cpus);
    int rc_ref = run(args, &ref);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = run("run -p 'Once upon a time' -n 8 --ctx 64 --temp 0 --ids --threads 1000", &out);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    T_CHECK(rc == 0 && rc_ref == 0 && out && strstr(out, want), "run --threads 1000: exit %d (%d), output:\n%.2000s", rc,
            rc_ref, out ? out : "(none)");
    /* the ids line (the first that starts with a digit): the same as with the CPUs' count */
    const char *ids = out, *ids_ref = ref;
    while (ids && *ids && !(*ids >= '0' && *ids <= '9')) ids = strchr(ids, '\n') ? strchr(ids, '\n') + 1 : NULL;
    while (ids_ref && *ids_ref && !(*ids_ref >= '0' && *ids_ref <= '9'))
        ids_ref = strchr(ids_ref, '\n') ? strchr(ids_ref, '\n') + 1 : NULL;
    size_t n_ids = ids_ref && *ids_ref ? strcspn(ids_ref, "\n") : 0;
    T_CHECK(n_ids > 0 && ids && strncmp(ids, ids_ref, n_ids + 1) == 0, "run --threads 1000 printed\n%s\nnot\n%s",
            out ? out : "(none)", ref ? ref : "(none)");
    T_CHECK(secs < 20, "run --threads 1000 took %.1f s (20 s at most: capped, it is as fast as %ld threads)", secs,
            cpus);
    free(ref);
    free(out);
}

/* Every check of this file needs the CLI: what a skip of it all counts. */
#define N_CHECKS (176 + N_THREAD_CHECKS)

int main(void) {
    cli = getenv("DHSA_CLI");
    if (!cli || !cli[0]) cli = "build/dhsa";
    if (strchr(cli, '\'')) {
        T_SKIP(N_CHECKS, "DHSA_CLI path contains a quote: %s", cli);
        return t_report("test_cli");
    }
    if (access(cli, X_OK) != 0) {
        T_SKIP(N_CHECKS, "no CLI binary at %s (set DHSA_CLI or run make)", cli);
        return t_report("test_cli");
    }
    test_help();
    test_bad_input();
    test_bench_json();
    test_peak_json();
    test_demo();
    test_sparse_json();
    test_threads_capped();
    return t_report("test_cli");
}
