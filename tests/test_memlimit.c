/* test_memlimit.c: --mem-limit bounds the peak RSS of the process (issue
 * 13, point 3). For several models, contexts, ubatches and attention
 * methods it asks `dhsa plan` for the plan's total with the same command
 * line, runs `dhsa run` under a limit 1% above it with a prompt that nearly
 * fills the context, and checks that the child's peak RSS (wait4's
 * ru_maxrss and the VmHWM the run prints, the larger) stays under the
 * limit; then that a limit 2% below the measured peak is refused before
 * anything runs, with a sentence saying what would fit. Also: the issue's
 * stories260K `--mem-limit 4M` is refused (it peaked at 8.1 MiB), a limit
 * under 1 MiB is printed in KiB, and the library's plan adds up and
 * counts the model's heap (against RssAnon around the load).
 * Models: models/dhsa-retrieval-8m.gguf and -q8_0.gguf, stories260K from
 * ../shared/models (skipped when absent), and two made by gen-model in a
 * temporary folder (the SmolLM-135M shape of the issue, and `tiny`).
 * Before the fix the plan left out the process (code, the model's heap,
 * stacks, the allocator's rounding): the SmolLM-shaped case peaked at
 * 246.7 MiB under a plan of 238.2 MiB, and these checks failed.
 * Prints the table of docs/results.md ("Memory") and
 * docs/notes/results-models.md ("Memory limit vs peak RSS").
 * Run: make test (or DHSA_CLI=build/dhsa build/tests/test_memlimit).
 */
#include "cli_run.h"
#include "dhsa.h"
#include "t.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define SHARED_MODEL "../shared/models/stories260K.gguf"
#define CHECKS_PER_CASE 4

static const char *cli;
static char dir[256];

/* ------------------------------------------------------------- helpers --- */

static int has(const char *s, const char *sub) { return s && strstr(s, sub) != NULL; }


/* The plan's total in bytes from `dhsa plan`: "total ... (N bytes)"; an
 * older CLI printed only "total  238.2 MiB", read as such. 0 if absent. */
static size_t plan_total(const char *out) {
    const char *t = out ? strstr(out, "\n  total") : NULL;
    if (!t) return 0;
    const char *b = strchr(t, '(');
    const char *nl = strchr(t + 1, '\n');
    unsigned long long v = 0;
    if (b && (!nl || b < nl) && sscanf(b, "(%llu bytes)", &v) == 1) return (size_t)v;
    double mib = 0;
    if (sscanf(t, "\n  total %lf MiB", &mib) == 1) return (size_t)(mib * 1048576.0);
    return 0;
}

/* The peak RSS the run printed, in KiB: "peak RSS 247.0 MiB (252960 KiB)",
 * or (an older CLI) "peak RSS 246.7 MiB". 0 if absent. */
static long printed_peak_kb(const char *out) {
    const char *p = out ? strstr(out, "peak RSS ") : NULL;
    if (!p) return 0;
    double mib = 0;
    long kb = 0;
    if (sscanf(p, "peak RSS %lf MiB (%ld KiB)", &mib, &kb) == 2) return kb;
    if (sscanf(p, "peak RSS %lf MiB", &mib) == 1) return (long)(mib * 1024.0);
    return 0;
}

/* n bytes of a made-up English text (a fixed generator: the same bytes,
 * so the same token count, on every machine). */
static int write_prompt(const char *path, int n) {
    static const char *words[] = {"the", "cat", "sat", "on", "a", "mat", "and", "then", "it", "ran", "to",
                                  "big", "red", "house", "where", "little", "girl", "named", "lily", "lived"};
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    uint32_t x = 12345;
    int len = 0;
    while (len < n) {
        x = x * 1103515245u + 12345u;
        const char *w = words[(x >> 16) % (sizeof words / sizeof words[0])];
        for (const char *c = len ? " " : ""; *c && len < n; c++, len++) fputc(*c, f);
        for (const char *c = w; *c && len < n; c++, len++) fputc(*c, f);
    }
    return fclose(f);
}

static double mib(double b) { return b / 1048576.0; }

/* --------------------------------------------------------------- cases --- */

typedef struct {
    const char *model;   /* path; "@smol" and "@tiny" are made by gen-model */
    const char *label;   /* for the table */
    int64_t ctx, ubatch; /* ubatch 0: the CLI's default (the largest that fits) */
    const char *extra;   /* more options, the same for plan and run */
    int prompt_bytes;    /* the prompt: about ctx - 5% tokens with this model */
} mem_case;

static const mem_case cases[] = {
    {"@smol", "SmolLM-135M shape (gen-model, Q8_0)", 2048, 512, "", 1350},
    {SHARED_MODEL, "stories260K", 2048, 0, "", 5000},
    {SHARED_MODEL, "stories260K", 512, 1, "--attn oracle --dense-below 0 --threads 1", 1300},
    {"models/dhsa-retrieval-8m.gguf", "dhsa-retrieval-8m (F32)", 4096, 64, "--attn dhsa --dense-below 0", 11300},
    {"models/dhsa-retrieval-8m-q8_0.gguf", "dhsa-retrieval-8m-q8_0", 1024, 16, "--kv f16", 2800},
    {"@tiny", "tiny (gen-model, Q8_0)", 512, 128, "--attn stream --dense-below 0", 330},
};
#define N_CASES ((int)(sizeof cases / sizeof cases[0]))

typedef struct {
    int ran;
    size_t plan, limit;
    long peak_kb;
} case_result;

static void model_path(const mem_case *c, char *buf, size_t cap) {
    if (c->model[0] == '@') snprintf(buf, cap, "%s/%s.gguf", dir, c->model + 1);
    else snprintf(buf, cap, "%s", c->model);
}

static void run_case(int i, case_result *r) {
    const mem_case *c = &cases[i];
    char model[512], prompt[512], opts[1600], args[2048];
    model_path(c, model, sizeof model);
    snprintf(prompt, sizeof prompt, "%s/prompt%d.txt", dir, i);
    if (write_prompt(prompt, c->prompt_bytes) != 0) {
        T_CHECK(0, "case %d: cannot write %s", i, prompt);
        return;
    }
    char ub[32] = "";
    if (c->ubatch > 0) snprintf(ub, sizeof ub, " --ubatch %lld", (long long)c->ubatch);
    snprintf(opts, sizeof opts, "-m '%s' --ctx %lld%s -f '%s' -n 4 %s", model, (long long)c->ctx, ub, prompt, c->extra);
    char *out = NULL;
    long rss = 0;
    snprintf(args, sizeof args, "plan %s", opts);
    int rc = cli_run_measured(NULL, args, &out, NULL, &rss);
    size_t plan = rc == 0 ? plan_total(out) : 0;
    T_CHECK(plan > 0, "case %d (%s, ctx %lld): `dhsa %s`: rc %d, no total: %.400s", i, c->label, (long long)c->ctx,
            args, rc, out ? out : "");
    free(out);
    if (!plan) {
        T_SKIP(CHECKS_PER_CASE - 1, "case %d: no plan to run under", i);
        return;
    }
    /* 1% above the plan: what it says the process needs */
    size_t limit = plan + plan / 100;
    snprintf(args, sizeof args, "run %s --mem-limit %zu --no-echo --ids", opts, limit);
    rc = cli_run_measured(NULL, args, &out, NULL, &rss);
    long printed = printed_peak_kb(out);
    long peak = rss > printed ? rss : printed;
    T_CHECK(rc == 0 && has(out, "prompt: ") && printed > 0, "case %d (%s): `dhsa %s`: rc %d: %.600s", i, c->label,
            args, rc, out ? out : "");
    T_CHECK(peak > 0 && (size_t)peak * 1024 <= limit,
            "case %d (%s, ctx %lld, ubatch %lld %s): peak RSS %.2f MiB (wait4 %ld KiB, VmHWM %ld KiB) above "
            "--mem-limit %.2f MiB (the plan said %.2f MiB)",
            i, c->label, (long long)c->ctx, (long long)c->ubatch, c->extra, mib((double)peak * 1024), rss, printed,
            mib((double)limit), mib((double)plan));
    free(out);
    r->ran = 1;
    r->plan = plan;
    r->limit = limit;
    r->peak_kb = peak;
    /* below what it really needed: refused before running, saying what fits
     * (the KV type pinned: without --kv, --mem-limit would take q8_0) */
    size_t below = (size_t)peak * 1024 / 100 * 98;
    snprintf(args, sizeof args, "run %s --mem-limit %zu --no-echo --ids%s", opts, below,
             strstr(c->extra, "--kv") ? "" : " --kv f16");
    rc = cli_run_measured(NULL, args, &out, NULL, &rss);
    T_CHECK(rc == 1 && has(out, "would fit") && !has(out, "prompt: "),
            "case %d (%s): --mem-limit %zu (2%% under the measured peak) not refused before running: rc %d: %.600s",
            i, c->label, below, rc, out ? out : "");
    free(out);
}

/* -------------------------------------------------------------- library --- */

static size_t rss_anon(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "RssAnon: %llu", &kb) == 1) break;
    fclose(f);
    return (size_t)kb * 1024;
}

/* The plan adds up; its measured parts are there; the model's heap, as the
 * library counts it, covers what the load made resident and is not far
 * above it. */
static void library_plan(int sanitized) {
    size_t anon0 = rss_anon();
    dhsa_model *m = NULL;
    dhsa_status st = dhsa_model_load("models/dhsa-retrieval-8m-q8_0.gguf", NULL, &m);
    size_t anon1 = rss_anon();
    dhsa_ctx *ctx = NULL;
    if (st || dhsa_ctx_create(NULL, &ctx)) {
        T_CHECK(0, "load the q8_0 model and a ctx: %s", dhsa_last_error());
        dhsa_model_free(m);
        return;
    }
    dhsa_session_params sp = dhsa_session_default_params();
    sp.n_ctx = 1024;
    dhsa_mem_plan pl;
    st = dhsa_session_plan(ctx, m, &sp, &pl);
    T_CHECK(st == DHSA_OK &&
                pl.process == pl.model_file + pl.model_heap + pl.code + pl.other + pl.stacks + pl.slack &&
                pl.total == pl.weights + pl.kv_cache + pl.activations + pl.attn_workspace + pl.matmul_workspace +
                                pl.routing + pl.process,
            "the plan's total is the sum of its parts, process of its own: %s", st ? dhsa_last_error() : "");
    T_CHECK(pl.measured == (anon0 > 0) && (!pl.measured || pl.code > 0) && pl.model_heap > 0 &&
                pl.stacks == (size_t)dhsa_ctx_n_threads(ctx) * DHSA_PLAN_STACK_ALLOWANCE,
            "measured %d, code %zu, model heap %zu, stacks %zu", pl.measured, pl.code, pl.model_heap, pl.stacks);
    if (sanitized) {
        T_SKIP(1, "a sanitizer build: its allocator's redzones are no part of the count");
    } else if (anon0 > 0) {
        size_t grew = anon1 > anon0 ? anon1 - anon0 : 0;
        T_CHECK(pl.model_heap + (64 << 10) >= grew && pl.model_heap <= grew + grew / 4 + (256 << 10),
                "the model's heap counted %zu bytes; the load made %zu bytes of anonymous memory resident", pl.model_heap,
                grew);
    } else {
        T_SKIP(1, "no /proc/self/status: the count cannot be compared");
    }
    /* a limit below 1 MiB is said in KiB, with what would fit */
    sp.mem_limit = 300 << 10;
    st = dhsa_session_plan(ctx, m, &sp, &pl);
    T_CHECK(st == DHSA_ERR_MEMORY_BUDGET && has(dhsa_last_error(), "300.0 KiB") && has(dhsa_last_error(), "would fit") &&
                !has(dhsa_last_error(), "0.0 MiB"),
            "a 300 KiB limit: %s", dhsa_last_error());
    dhsa_ctx_free(ctx);
    dhsa_model_free(m);
}

/* ----------------------------------------------------------------- main --- */

int main(void) {
    /* make asan / make ubsan set it: shadow memory and quarantine are no part of any plan */
    int sanitized = getenv("DHSA_SANITIZED") != NULL;
    library_plan(sanitized);
    cli = getenv("DHSA_CLI");
    int shared = access(SHARED_MODEL, R_OK) == 0;
    if (!cli || access(cli, X_OK) != 0 || sanitized) {
        T_SKIP(N_CASES * CHECKS_PER_CASE + 2, "%s", sanitized ? "a sanitizer build: its shadow memory is no part of the plan"
                                                              : "no CLI (DHSA_CLI; tests/run.sh sets it)");
        return t_report("test_memlimit");
    }
    snprintf(dir, sizeof dir, "/tmp/dhsa_memlimit_XXXXXX");
    if (!mkdtemp(dir)) {
        T_CHECK(0, "mkdtemp");
        return t_report("test_memlimit");
    }
    char args[1024], *out = NULL;
    long rss;
    snprintf(args, sizeof args, "gen-model -o '%s/smol.gguf'", dir);
    int rc_smol = cli_run_measured(NULL, args, &out, NULL, &rss);
    free(out);
    snprintf(args, sizeof args, "gen-model --preset tiny -o '%s/tiny.gguf'", dir);
    int rc_tiny = cli_run_measured(NULL, args, &out, NULL, &rss);
    free(out);
    T_CHECK(rc_smol == 0 && rc_tiny == 0, "gen-model: rc %d (SmolLM-135M shape), %d (tiny)", rc_smol, rc_tiny);

    case_result res[N_CASES];
    memset(res, 0, sizeof res);
    for (int i = 0; i < N_CASES; i++) {
        if (strcmp(cases[i].model, SHARED_MODEL) == 0 && !shared) {
            T_SKIP(CHECKS_PER_CASE, "case %d: %s is absent", i, SHARED_MODEL);
            continue;
        }
        run_case(i, &res[i]);
    }

    /* the issue's: stories260K under 4M peaked at 8.1 MiB; now refused */
    if (shared) {
        rc_smol = cli_run_measured(NULL, "run -m " SHARED_MODEL " --mem-limit 4M -p 'Once upon a time' -n 4", &out,
                                   NULL, &rss);
        T_CHECK(rc_smol == 1 && has(out, "would fit") && has(out, "4.0 MiB") && !has(out, "prompt: "),
                "stories260K --mem-limit 4M: rc %d: %.500s", rc_smol, out ? out : "");
        free(out);
    } else {
        T_SKIP(1, "%s is absent", SHARED_MODEL);
    }

    printf("| model | ctx | ubatch | options | --mem-limit | plan total | peak RSS | headroom |\n");
    printf("|---|---:|---:|---|---:|---:|---:|---:|\n");
    for (int i = 0; i < N_CASES; i++) {
        if (!res[i].ran) continue;
        const mem_case *c = &cases[i];
        double peak = (double)res[i].peak_kb * 1024;
        char ub[32];
        snprintf(ub, sizeof ub, c->ubatch ? "%lld" : "auto", (long long)c->ubatch);
        printf("| %s | %lld | %s | %s | %.2f MiB | %.2f MiB | %.2f MiB | %.2f MiB (%.1f%%) |\n", c->label,
               (long long)c->ctx, ub, c->extra[0] ? c->extra : "dense", mib((double)res[i].limit),
               mib((double)res[i].plan), mib(peak), mib((double)res[i].limit - peak),
               100.0 * ((double)res[i].limit - peak) / (double)res[i].limit);
    }
    char path[512];
    snprintf(path, sizeof path, "%s/smol.gguf", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/tiny.gguf", dir);
    unlink(path);
    for (int i = 0; i < N_CASES; i++) {
        snprintf(path, sizeof path, "%s/prompt%d.txt", dir, i);
        unlink(path);
    }
    rmdir(dir);
    return t_report("test_memlimit");
}
