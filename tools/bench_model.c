/* bench_model.c: `dhsa bench model` (time to first token, prefill and
 * decode speed, planned memory and peak RSS of fresh sessions over random
 * ids, per length and attention method; see `dhsa bench model --help`).
 * --svg writes its figures (tests/test_plots.c); under mpirun -np R > 1 it
 * runs context parallel (docs/dist.md; tests/test_dist.c). Split from
 * run.c, whose sessions' routing it shares (dhsa_router_params_for).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "dhsa.h"
#include "dist.h"
#include "lib/svg.h"

#define EXIT_RUN DHSA_EXIT_RUN
#define EXIT_USAGE DHSA_EXIT_USAGE

static double mib(size_t b) { return (double)b / (1024.0 * 1024.0); }

const char dhsa_cli_bench_model_usage[] =
    "usage: dhsa bench model [-m MODEL] [--tokenizer tok.bin] [--lengths 4K,16K,32K]\n"
    "                        [--attn dense,dhsa] [--decode N] [--density F | --budget N]\n"
    "                        [--boundary learned:FILE] [--runs N] [--mem-limit SIZE]\n"
    "                        [--kv f32|f16|q8_0] [--exact] [--threads T] [--seed S] [--svg FILE]\n"
    "                        [--rest N|hybrid] [--hybrid-max-chunk N] [--carry F]\n"
    "                        [--exact-rows N] (the routing's, as dhsa run's)\n"
    "       mpirun -np R dhsa bench model [the same options] [--dist-stripe N] [--dist-fetch F]\n"
    "\n"
    "For each length L and attention method, in one process: a fresh session\n"
    "of L + decode tokens, a prefill of L random token ids (seeded), then N\n"
    "greedy decode steps (default 16). Prints the time to first token (prefill\n"
    "+ the first sample), prefill tok/s, decode tok/s, the session's planned\n"
    "memory, the process peak RSS during that run (reset before each), and the\n"
    "prefill speedup against the first method of the list at the same length.\n"
    "--boundary learned:FILE loads a predictor file (docs/predictor.md) and adds\n"
    "the method dhsa-learned (dhsa with learned boundaries; dhsa keeps the\n"
    "similarity ones); without --attn the methods are then dhsa,dhsa-learned.\n"
    "--runs N repeats every length's methods N times, interleaved (method 1,\n"
    "2, .., then again), prints each run, then per method the medians and the\n"
    "median over runs of each run's ratio to the first method (ttft, decode).\n"
    "--svg FILE also writes two plots against L, one line per method:\n"
    "FILE-time.svg (time to first token, log-log) and FILE-mem.svg (peak RSS\n"
    "solid, planned session memory dashed); a trailing .svg of FILE is\n"
    "dropped first.\n"
    "--exact runs the weight products on the exact F32 route (the header's\n"
    "\"weight products\" line says which route each weight type takes).\n"
    "--mem-limit SIZE: every session's plan must fit (K/M/G suffix; as in dhsa\n"
    "run, the prefill ubatch shrinks to fit); checked for every length and\n"
    "method before the first run.\n"
    "\n"
    "Under mpirun -np R (R > 1) the job runs context parallel (docs/dist.md):\n"
    "every rank builds the same sessions over the same ids and holds its share\n"
    "of the positions; the plan and --mem-limit are per rank. Rank 0 alone\n"
    "prints (and writes --svg): the row's ttft and decode are the slowest\n"
    "rank's, its plan and peak RSS the largest rank's; under each row, every\n"
    "rank's peak RSS, ttft and decode time, whether the ranks decoded the same\n"
    "ids, and the bytes on the wire (all ranks; as dhsa run's \"dist:\" line).\n"
    "--threads is per rank. Methods dense, dhsa and block only: stream, oracle,\n"
    "dhsa-learned and --kv q8_0 are refused with R > 1. With one process, or\n"
    "-np 1, nothing changes. --dist-fetch applies to the dhsa and block rows\n"
    "(dense passes every key round the ring).\n";

/* The plot files of --svg: FILE without a trailing ".svg", then suffix. */
static void svg_name(char *out, size_t cap, const char *file, const char *suffix) {
    size_t n = strlen(file);
    if (n > 4 && strcmp(file + n - 4, ".svg") == 0) n -= 4;
    snprintf(out, cap, "%.*s%s", (int)n, file, suffix);
}

/* --svg of bench model: x = lengths, per method ttft / rss / plan
 * [n_methods][nL]. */
static void write_model_plots(const char *file, const char *model, const char *const *ms, int nm,
                              const int64_t *Ls, int nL, const double *ttft, const double *rss,
                              const double *plan_b, int threads, dhsa_type kv, int ranks) {
    char path[1024], title[512], sub[512];
    double x[32];
    for (int i = 0; i < nL; i++) x[i] = (double)Ls[i];
    const char *base = strrchr(model, '/');
    base = base ? base + 1 : model;
    char par[128] = "";
    if (ranks > 1)
        snprintf(par, sizeof par, "; %d ranks (mpirun): the slowest rank's time, the largest rank's memory", ranks);
    snprintf(sub, sizeof sub, "dhsa bench model -m %s: prefill of L random ids, %d threads, KV %s%s", base, threads,
             dhsa_type_name(kv), par);
    for (int which = 0; which < 2; which++) {
        snprintf(title, sizeof title, "%s against prompt length", which ? "Memory" : "Time to first token");
        dhsa_plot *p = dhsa_plot_create(title, "prompt length L (tokens)", which ? "bytes" : "time to first token (s)");
        if (!p) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
        dhsa_status st = dhsa_plot_set_subtitle(p, sub);
        dhsa_plot_set_log(p, DHSA_AXIS_X, 1);
        dhsa_plot_set_log(p, DHSA_AXIS_Y, 1);
        if (which) dhsa_plot_set_format(p, DHSA_AXIS_Y, DHSA_AXIS_BYTES);
        for (int m = 0; m < nm && st == DHSA_OK; m++) {
            char name[64];
            if (which == 0) {
                st = dhsa_plot_add(p, ms[m], DHSA_PLOT_POINTS | DHSA_PLOT_LINE, x,
                                   ttft + (size_t)m * (size_t)nL, nL);
            } else {
                snprintf(name, sizeof name, "%s: peak RSS", ms[m]);
                st = dhsa_plot_add(p, name, DHSA_PLOT_POINTS | DHSA_PLOT_LINE, x, rss + (size_t)m * (size_t)nL, nL);
            }
        }
        for (int m = 0; which && m < nm && st == DHSA_OK; m++) {
            char name[64];
            snprintf(name, sizeof name, "%s: plan", ms[m]);
            st = dhsa_plot_add(p, name, DHSA_PLOT_POINTS | DHSA_PLOT_LINE | DHSA_PLOT_DASHED, x,
                               plan_b + (size_t)m * (size_t)nL, nL);
        }
        svg_name(path, sizeof path, file, which ? "-mem.svg" : "-time.svg");
        if (st == DHSA_OK) st = dhsa_plot_save(p, path);
        dhsa_plot_free(p);
        if (st) dhsa_cli_die(EXIT_RUN, "--svg: %s", dhsa_last_error());
        fprintf(stderr, "dhsa bench model: wrote %s\n", path);
    }
}

/* What every session of one bench model invocation shares; bench_params
 * makes one session's params from it, the same for the plan checked before
 * the first run and for the run. */
typedef struct {
    int64_t n_dec, budget, stripe, rest, hybrid, exact_rows;
    double density, fetch, carry;
    dhsa_type kv;
    int exact;
    size_t mem_limit;
    dhsa_predictor *pred;
    const dhsa_dist *dist; /* NULL: one process */
} bench_setup;

static dhsa_session_params bench_params(const bench_setup *b, int64_t L, dhsa_attn_method method, int learned) {
    dhsa_session_params sp = dhsa_session_default_params();
    sp.n_ctx = L + b->n_dec;
    sp.kv_type = b->kv;
    sp.exact = b->exact;
    sp.attn = method;
    if (learned) {
        sp.router.boundary = DHSA_BOUNDARY_LEARNED;
        sp.router.predictor = b->pred;
    }
    if (b->density > 0) sp.router.density = b->density;
    if (b->budget > 0) sp.router.budget_tokens = b->budget;
    if (b->rest != DHSA_CLI_REST_UNSET) sp.router.rest = b->rest;
    if (b->hybrid >= 0) sp.router.hybrid_max_chunk = b->hybrid;
    if (b->carry >= 0) sp.router.carry = b->carry;
    if (b->exact_rows >= 0) sp.router.exact_rows = b->exact_rows;
    sp.mem_limit = b->mem_limit;
    sp.dist = b->dist;
    sp.dist_stripe = b->stripe;
    if (method == DHSA_ATTN_DHSA || method == DHSA_ATTN_BLOCK) sp.dist_fetch_share = b->fetch;
    return sp;
}

/* The largest of x [n]. */
static double max_of(const double *x, int n) {
    double m = x[0];
    for (int i = 1; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

/* x [n] times scale, as "a/b/c" with fmt per number (rank order). */
static const char *rank_list(const double *x, int n, double scale, const char *fmt, char *buf, size_t cap) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && used + 2 < cap; i++) {
        if (i) {
            buf[used++] = '/';
            buf[used] = '\0';
        }
        int w = snprintf(buf + used, cap - used, fmt, x[i] * scale);
        if (w < 0) break;
        used += (size_t)w < cap - used ? (size_t)w : cap - used - 1;
    }
    return buf;
}

int dhsa_cli_bench_model(int argc, char **argv) {
    dhsa_cli_set_command("bench model", NULL);
    const dhsa_dist *dist = dhsa_cli_dist_begin(&argc, &argv);
    const int rank0 = !dist || dist->rank == 0, R = dist ? dist->size : 1;
    const char *model = NULL, *tokp = NULL, *lengths = "4K,16K,32K", *methods = NULL, *svg = NULL;
    const char *pred_path = NULL;
    int64_t n_dec = 16, threads = 0, seed = 1, budget = 0, runs = 1, stripe = 0, rest = DHSA_CLI_REST_UNSET, hybrid = -1,
            exact_rows = -1;
    double carry = -1;
    double density = 0, fetch = 0;
    size_t mem_limit = 0;
    dhsa_type kv = DHSA_F16; /* dhsa_session_default_params' */
    int exact = 0;
    for (int i = 3; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(dhsa_cli_bench_model_usage, stdout);
            fputs(dhsa_cli_dist_usage, stdout);
            dhsa_cli_dist_finish();
            return 0;
        }
        if (strcmp(a, "--exact") == 0 && (exact = 1)) continue;
        if (i + 1 >= argc) dhsa_cli_die(EXIT_USAGE, "%s needs a value (or is unknown)", a);
        const char *v = argv[++i];
        if (strcmp(a, "-m") == 0) model = dhsa_cli_model_arg(v);
        else if (strcmp(a, "--tokenizer") == 0) tokp = v;
        else if (strcmp(a, "--lengths") == 0) lengths = v;
        else if (strcmp(a, "--attn") == 0) methods = v;
        else if (strcmp(a, "--decode") == 0) n_dec = dhsa_cli_int(a, v, 1, 1 << 20, 1);
        else if (strcmp(a, "--threads") == 0) threads = dhsa_cli_threads(a, v);
        else if (strcmp(a, "--seed") == 0) seed = dhsa_cli_int(a, v, 0, INT64_MAX, 0);
        else if (strcmp(a, "--density") == 0) density = dhsa_cli_real(a, v, 1e-6, 1);
        else if (strcmp(a, "--budget") == 0) budget = dhsa_cli_int(a, v, 1, (int64_t)1 << 31, 1);
        else if (strcmp(a, "--runs") == 0) runs = dhsa_cli_int(a, v, 1, 1000, 1);
        else if (strcmp(a, "--rest") == 0) rest = dhsa_cli_rest(a, v);
        else if (strcmp(a, "--hybrid-max-chunk") == 0) hybrid = dhsa_cli_int(a, v, 0, (int64_t)1 << 30, 0);
        else if (strcmp(a, "--carry") == 0) carry = dhsa_cli_real(a, v, 0, 1);
        else if (strcmp(a, "--exact-rows") == 0) exact_rows = dhsa_cli_int(a, v, 0, DHSA_EXACT_ROWS_MAX, 0);
        else if (strcmp(a, "--mem-limit") == 0) mem_limit = (size_t)dhsa_cli_int(a, v, 1, INT64_MAX, 1);
        else if (strcmp(a, "--dist-stripe") == 0) stripe = dhsa_cli_dist_stripe_arg(a, v);
        else if (strcmp(a, "--dist-fetch") == 0) fetch = dhsa_cli_dist_fetch_arg(a, v);
        else if (strcmp(a, "--boundary") == 0) {
            if (strncmp(v, "learned:", 8) != 0 || !v[8]) dhsa_cli_die(EXIT_USAGE, "--boundary is learned:FILE, not \"%s\"", v);
            pred_path = v + 8;
        } else if (strcmp(a, "--svg") == 0) {
            if (!v[0]) dhsa_cli_die(EXIT_USAGE, "--svg needs a file name");
            svg = v;
        } else if (strcmp(a, "--kv") == 0) {
            if (strcmp(v, "f32") == 0) kv = DHSA_F32;
            else if (strcmp(v, "f16") == 0) kv = DHSA_F16;
            else if (strcmp(v, "q8_0") == 0) kv = DHSA_Q8_0;
            else dhsa_cli_die(EXIT_USAGE, "--kv is f32, f16 or q8_0");
        } else dhsa_cli_die(EXIT_USAGE, "unknown option \"%s\"", a);
    }
    char dmsg[512];
    if (!model) {
        if (!(model = dhsa_cli_default_model(dmsg, sizeof dmsg))) dhsa_cli_die(EXIT_USAGE, "%s", dmsg);
        if (rank0) fprintf(stderr, "dhsa: model %s (the default; -m MODEL for another)\n", model);
    }
    if (density > 0 && budget > 0)
        dhsa_cli_die(EXIT_USAGE, "give --density F or --budget N, not both (--budget sets the keys per query block; "
                     "--density the share of the keys it may see)");
    dhsa_cli_check_tokenizer(model, tokp);
    int64_t Ls[32];
    int nL = dhsa_cli_int_list("--lengths", lengths, 1, (int64_t)1 << 31, 1, Ls, 32);
    /* a session holds at most 2^31 tokens: refused before anything is allocated */
    for (int i = 0; i < nL; i++)
        if (Ls[i] + n_dec > ((int64_t)1 << 31))
            dhsa_cli_die(EXIT_USAGE,
                         "--lengths %lld: with --decode %lld the session needs %lld tokens, above the 2^31 (%lld) a "
                         "session holds",
                         (long long)Ls[i], (long long)n_dec, (long long)(Ls[i] + n_dec), (long long)1 << 31);
    if (svg && rank0) { /* both plot files, before the first run */
        char path[1024];
        svg_name(path, sizeof path, svg, "-time.svg");
        dhsa_cli_check_output("--svg", path);
        svg_name(path, sizeof path, svg, "-mem.svg");
        dhsa_cli_check_output("--svg", path);
    }
    if (!methods) methods = pred_path ? "dhsa,dhsa-learned" : "dense,dhsa";
    dhsa_attn_method ms[8];
    int learned[8], nm = 0;
    const char *mname[8];
    char mbuf[128], *mitems[8];
    int n_items = dhsa_cli_split_list("--attn", methods, mbuf, sizeof mbuf, mitems, 8);
    for (int k = 0; k < n_items; k++) {
        const char *t = mitems[k];
        dhsa_attn_method m;
        learned[nm] = strcmp(t, "dhsa-learned") == 0;
        if (learned[nm] && !pred_path) dhsa_cli_die(EXIT_USAGE, "--attn dhsa-learned needs --boundary learned:FILE");
        for (m = DHSA_ATTN_DENSE; m <= DHSA_ATTN_ORACLE && !learned[nm]; m++)
            if (strcmp(t, dhsa_attn_method_name(m)) == 0) break;
        if (learned[nm]) m = DHSA_ATTN_DHSA;
        else if (m > DHSA_ATTN_ORACLE) dhsa_cli_die(EXIT_USAGE, "--attn: unknown method \"%s\"", t);
        mname[nm] = learned[nm] ? "dhsa-learned" : dhsa_attn_method_name(m);
        ms[nm++] = m;
    }
    int any_learned = 0, any_routed = 0;
    for (int k = 0; k < nm; k++) {
        any_learned |= learned[k];
        any_routed |= ms[k] == DHSA_ATTN_DHSA || ms[k] == DHSA_ATTN_BLOCK;
    }
    if (!dist) dhsa_cli_dist_fetch_needs_ranks(fetch);
    if (fetch > 0 && !any_routed)
        dhsa_cli_die(EXIT_USAGE, "--dist-fetch %g budgets what dhsa and block fetch; --attn %s has neither (dense passes "
                     "every key round the ring): add one or leave it out", fetch, methods);
    if (pred_path && !any_learned)
        dhsa_cli_die(EXIT_USAGE, "--boundary learned:%s is read by the method dhsa-learned, which --attn %s leaves "
                     "out: add it (or drop --boundary)", pred_path, methods);
    dhsa_model_params mp = dhsa_model_default_params();
    mp.tokenizer_path = tokp;
    dhsa_model *m;
    if (dhsa_model_load(model, &mp, &m)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
    const dhsa_model_info *in = dhsa_model_get_info(m);
    dhsa_predictor *pred = NULL;
    if (pred_path) pred = dhsa_cli_load_predictor(pred_path, in->n_head_kv * in->head_dim_k, model);
    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = (int)threads;
    dhsa_ctx *ctx;
    if (dhsa_ctx_create(&cp, &ctx)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
    const bench_setup bs = {n_dec, budget, stripe, rest, hybrid, exact_rows, density, fetch, carry, kv, exact, mem_limit, pred,
                            dist};
    /* What cannot run across ranks (a method, learned boundaries, the KV
     * type, the stripe) is refused before anything runs, in the library's
     * words: never replaced by something that can. */
    for (int mi = 0; dist && mi < nm; mi++) {
        dhsa_session_params sp = bench_params(&bs, Ls[0], ms[mi], learned[mi]);
        dhsa_mem_plan pl;
        dhsa_status st = dhsa_session_plan(ctx, m, &sp, &pl);
        if (st == DHSA_ERR_UNSUPPORTED || st == DHSA_ERR_INVALID_ARG)
            dhsa_cli_die(EXIT_USAGE, "under mpirun -np %d, --attn %s: %s", R, mname[mi], dhsa_last_error());
    }
    /* every length's and method's session planned before the first run: one
     * too large for this machine (for this rank, under mpirun) or above
     * --mem-limit is refused now, not after the others ran */
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    double phys = pages > 0 && page > 0 ? (double)pages * (double)page : 0;
    for (int li = 0; li < nL; li++)
        for (int mi = 0; mi < nm; mi++) {
            dhsa_session_params sp = bench_params(&bs, Ls[li], ms[mi], learned[mi]);
            dhsa_mem_plan pl;
            if (dhsa_session_plan(ctx, m, &sp, &pl))
                dhsa_cli_die(EXIT_RUN, "--lengths %lld, --attn %s: %s", (long long)Ls[li], mname[mi],
                             dhsa_last_error());
            char need[32], have[32];
            if (phys > 0 && (double)pl.total > phys)
                dhsa_cli_die(EXIT_RUN, "--lengths %lld, --attn %s: a session of %lld tokens needs %s%s, more than "
                             "this machine's %s", (long long)Ls[li], mname[mi], (long long)sp.n_ctx,
                             dhsa_cli_bytes((double)pl.total, need, sizeof need), dist ? " per rank" : "",
                             dhsa_cli_bytes(phys, have, sizeof have));
        }
    dhsa_cli_print_model(stdout, model, m, in);
    char routes[256];
    if (dhsa_model_routes(m, exact, routes, sizeof routes) != DHSA_OK) routes[0] = '\0';
    printf("threads %d, %s, KV %s, decode %lld tokens%s%s\nweight products%s: %s\n", dhsa_ctx_n_threads(ctx),
           dhsa_isa_name(dhsa_active_isa()), dhsa_type_name(kv), (long long)n_dec,
           pred_path ? ", dhsa-learned: predictor " : "", pred_path ? pred_path : "", exact ? " (--exact)" : "", routes);
    if (dist) {
        char stxt[128];
        int k = snprintf(stxt, sizeof stxt, stripe ? "stripes of %lld tokens" : "contiguous", (long long)stripe);
        if (fetch > 0 && k > 0)
            snprintf(stxt + k, sizeof stxt - (size_t)k, ", dhsa and block with a fetch budget of %g (--dist-fetch)",
                     fetch);
        printf("context parallel: %d ranks (mpirun), %s, the threads above per rank; ttft_s and decode_t/s are the "
               "slowest rank's, plan_MiB and peakRSS_MiB the largest rank's; under each row: per rank (rank 0/1/..), "
               "then the bytes on the wire, all ranks\n", R, stxt);
    }
    printf("\n");
    printf("%8s %-12s %4s %10s %12s %11s %12s %12s %9s\n", "L", "attn", "run", "ttft_s", "prefill_t/s", "decode_t/s",
           "plan_MiB", "peakRSS_MiB", "speedup");
    float *logits = malloc((size_t)in->n_vocab * sizeof(float));
    /* per run of one length: [method][run] */
    double *r_ttft = malloc(sizeof(double) * (size_t)(8 * runs)), *r_dec = malloc(sizeof(double) * (size_t)(8 * runs));
    double *r_tmp = malloc(sizeof(double) * (size_t)runs);
    /* under mpirun, every rank's ttft, decode time, peak RSS, plan [4][R] */
    double *g = malloc(sizeof(double) * 4 * (size_t)R);
    if (!logits || !r_ttft || !r_dec || !r_tmp || !g) dhsa_cli_die(EXIT_RUN, "out of memory");
    double svg_ttft[8 * 32], svg_rss[8 * 32], svg_plan[8 * 32]; /* [method][length] for --svg */
    int ids_differ = 0;
    char why[256];
    for (int li = 0; li < nL; li++) {
        int64_t L = Ls[li];
        /* the prompt, then the decoded ids (compared between ranks) */
        int32_t *ids = malloc((size_t)(L + n_dec) * sizeof(int32_t));
        if (!ids) dhsa_cli_die(EXIT_RUN, "out of memory");
        uint64_t x = (uint64_t)seed;
        for (int64_t i = 0; i < L; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            ids[i] = (int32_t)(3 + (x >> 33) % (uint64_t)(in->n_vocab - 3));
        }
        double base = 0;
        for (int64_t run = 0; run < runs; run++)
        for (int mi = 0; mi < nm; mi++) {
            dhsa_session_params sp = bench_params(&bs, L, ms[mi], learned[mi]);
            dhsa_proc_reset_peak_rss();
            dhsa_session *s;
            if (dhsa_session_create(ctx, m, &sp, &s)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
            /* the ranks start each timing together: a rank that arrived early
             * would otherwise count its wait for the others */
            if (dhsa_cli_dist_barrier(why)) dhsa_cli_die(EXIT_RUN, "%s", why);
            double t0 = dhsa_cli_now();
            if (dhsa_session_eval(s, ids, L, logits)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
            int32_t next = 0;
            for (int64_t i = 1; i < in->n_vocab; i++)
                if (logits[i] > logits[next]) next = (int32_t)i;
            double ttft = dhsa_cli_now() - t0;
            if (dhsa_cli_dist_barrier(why)) dhsa_cli_die(EXIT_RUN, "%s", why);
            double t1 = dhsa_cli_now();
            for (int64_t i = 0; i < n_dec; i++) {
                ids[L + i] = next;
                if (dhsa_session_eval(s, &next, 1, logits)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
                int32_t b = 0;
                for (int64_t k = 1; k < in->n_vocab; k++)
                    if (logits[k] > logits[b]) b = (int32_t)k;
                next = b;
            }
            double td = dhsa_cli_now() - t1;
            double rss = (double)dhsa_proc_peak_rss(), plan_b = (double)dhsa_session_get_plan(s)->total;
            dhsa_cli_dist_wire w = {0, 0, 0, 0, 0, 0, 0};
            int same = 1;
            if (dist) { /* collective, on every rank in the same order */
                dhsa_dist_stats ds;
                dhsa_session_get_dist_stats(s, &ds);
                w = dhsa_cli_dist_wire_sum(&ds);
                if (dhsa_cli_dist_gather(ttft, g, why) || dhsa_cli_dist_gather(td, g + R, why) ||
                    dhsa_cli_dist_gather(rss, g + 2 * R, why) || dhsa_cli_dist_gather(plan_b, g + 3 * R, why))
                    dhsa_cli_die(EXIT_RUN, "%s", why);
                same = dhsa_cli_dist_same_ids(ids, L + n_dec);
                ids_differ |= !same;
                ttft = max_of(g, R);
                td = max_of(g + R, R);
                rss = max_of(g + 2 * R, R);
                plan_b = max_of(g + 3 * R, R);
            }
            if (mi == 0) base = ttft;
            printf("%8lld %-12s %4lld %10.3f %12.1f %11.2f %12.1f %12.1f %8.2fx\n", (long long)L, mname[mi],
                   (long long)run + 1, ttft, (double)L / ttft, (double)n_dec / td, mib((size_t)plan_b),
                   mib((size_t)rss), base / ttft);
            if (dist) {
                char a[512], b[512], c[512], wt[512];
                printf("%8s %-12s ranks: peak RSS %s MiB, ttft %s s, decode %s s; %s\n", "", "",
                       rank_list(g + 2 * R, R, 1.0 / 1048576.0, "%.1f", a, sizeof a),
                       rank_list(g, R, 1.0, "%.3f", b, sizeof b), rank_list(g + R, R, 1.0, "%.3f", c, sizeof c),
                       same ? "every rank decoded the same ids" : "THE RANKS DECODED DIFFERENT IDS");
                printf("%8s %-12s wire: %s\n", "", "", dhsa_cli_dist_wire_text(&w, in->n_layer, L, n_dec, wt, sizeof wt));
            }
            fflush(stdout);
            r_ttft[mi * runs + run] = ttft;
            r_dec[mi * runs + run] = (double)n_dec / td;
            svg_rss[mi * nL + li] = rss;
            svg_plan[mi * nL + li] = plan_b;
            dhsa_session_free(s);
            dhsa_ctx_trim(ctx);
        }
        for (int mi = 0; mi < nm; mi++) { /* the plot takes the median ttft */
            for (int64_t r = 0; r < runs; r++) r_tmp[r] = r_ttft[mi * runs + r];
            svg_ttft[mi * nL + li] = dhsa_cli_median(r_tmp, (int)runs);
        }
        if (runs > 1) {
            printf("%8lld medians of %lld interleaved runs; ratios: median over runs of (method / %s) in the same "
                   "run\n", (long long)L, (long long)runs, mname[0]);
            printf("%8s %-12s %10s %12s %11s %12s %12s\n", "L", "attn", "ttft_s", "prefill_t/s", "decode_t/s",
                   "ttft_ratio", "decode_ratio");
            for (int mi = 0; mi < nm; mi++) {
                double t_med, d_med, t_rat, d_rat;
                for (int64_t r = 0; r < runs; r++) r_tmp[r] = r_ttft[mi * runs + r];
                t_med = dhsa_cli_median(r_tmp, (int)runs);
                for (int64_t r = 0; r < runs; r++) r_tmp[r] = r_dec[mi * runs + r];
                d_med = dhsa_cli_median(r_tmp, (int)runs);
                for (int64_t r = 0; r < runs; r++) r_tmp[r] = r_ttft[mi * runs + r] / r_ttft[r];
                t_rat = dhsa_cli_median(r_tmp, (int)runs);
                for (int64_t r = 0; r < runs; r++) r_tmp[r] = r_dec[mi * runs + r] / r_dec[r];
                d_rat = dhsa_cli_median(r_tmp, (int)runs);
                printf("%8lld %-12s %10.3f %12.1f %11.2f %12.3f %12.3f\n", (long long)L, mname[mi], t_med,
                       (double)L / t_med, d_med, t_rat, d_rat);
            }
            fflush(stdout);
        }
        free(ids);
    }
    if (svg && rank0)
        write_model_plots(svg, model, mname, nm, Ls, nL, svg_ttft, svg_rss, svg_plan, dhsa_ctx_n_threads(ctx), kv, R);
    if (ids_differ && rank0)
        fprintf(stderr, "dhsa bench model: THE RANKS DECODED DIFFERENT IDS in at least one run (see the rows)\n");
    free(logits);
    free(r_ttft);
    free(r_dec);
    free(r_tmp);
    free(g);
    dhsa_ctx_free(ctx);
    dhsa_predictor_free(pred);
    dhsa_model_free(m);
    dhsa_cli_dist_finish();
    return ids_differ ? 1 : 0;
}
