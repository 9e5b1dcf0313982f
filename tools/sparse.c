/* sparse.c: `dhsa bench sparse`, dense vs a sparse method on the same
 * synthetic long-context workload in the same run: routing time, kernel
 * time, dense time, speedup, the density actually used, attention recall,
 * output error and needle hits. See `dhsa bench sparse --help`.
 * --svg draws the first method's layout (tests/test_plots.c).
 * Tested by tests/test_cli.c; numbers in docs/notes/results-attention.md.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "dhsa.h"
#include "lib/svg.h"

const char dhsa_cli_bench_sparse_usage[] =
    "usage: dhsa bench sparse --L N [--heads H] [--kv-heads H] [--dim D]\n"
    "                         [--method dhsa|block|stream|oracle|dense[,...]]\n"
    "                         [--density F | --budget N]\n"
    "                         [--boundary fixed|similarity|learned:FILE]\n"
    "                         [--q-block N] [--chunk N] [--min-chunk N] [--max-chunk N]\n"
    "                         [--score pooled|moments|heads|bound|rows]\n"
    "                         [--sink N] [--local N] [--dense-below N] [--share-heads]\n"
    "                         [--no-causal] [--needles N] [--seed S] [--threads T]\n"
    "                         [--runs N] [--dense-runs N] [--json]\n"
    "                         [--svg FILE [--svg-head H]]\n"
    "\n"
    "Generates a synthetic workload (dhsa_synth_generate: segments of 32..512\n"
    "tokens with their own key directions, queries that retrieve one earlier\n"
    "segment, needle passages of 16 keys at depths 0.1, 0.35, 0.6, 0.85 asked\n"
    "for by the last query blocks), runs dense tiled attention and the chosen\n"
    "method on it in the same process, and prints:\n"
    "  route_ms    routing time (median of --runs)\n"
    "  kernel_ms   sparse attention time with the layout (median of --runs)\n"
    "  dense_ms    dense attention time (median of --dense-runs)\n"
    "  speedup     dense_ms / (route_ms + kernel_ms)\n"
    "  density     keys attended / keys available, over all rows and heads\n"
    "  recall      mean share of each row's dense softmax mass on the keys it\n"
    "              attended to (exp(lse_sparse - lse_dense): no L x L matrix)\n"
    "  rel_err     ||o_sparse - o_dense|| / ||o_dense||\n"
    "  needle_hits (needle, KV head) pairs whose passage (its middle key) the\n"
    "              asking block selected, of needles x kv-heads\n"
    "Methods: dhsa = DHSA routing (similarity boundaries unless --boundary),\n"
    "block = fixed blocks of --chunk keys (default 64) with the same budget\n"
    "rules, stream = sinks + recent keys, oracle = chunks ranked by their true\n"
    "attention mass (a dense pass: slow), dense = no routing. A comma list\n"
    "(--method dhsa,block,stream) runs each against one dense run; --json then\n"
    "prints one object per line.\n"
    "Defaults: heads 8, kv-heads 2, dim 128, causal, density 0.0625, q-block\n"
    "64, sink 64, local 256, dense-below 2048, runs 3, dense-runs 1, threads =\n"
    "online CPUs. learned:FILE reads a predictor file (docs/predictor.md) whose\n"
    "width must be kv-heads x dim.\n"
    "--svg FILE draws the layout of the first method of --method for KV head\n"
    "--svg-head (default 0): per query block its selected key ranges, the\n"
    "chunk starts of the routing (dhsa_route_boundaries), sinks, the local\n"
    "window and the causal diagonal (docs/notes/results-attention.md, Figures).\n";

#define EXIT_RUN DHSA_EXIT_RUN
#define EXIT_USAGE DHSA_EXIT_USAGE


/* The routing rules in force and whether they left anything routed: a
 * bench whose every block ran dense says so (never a silent fallback). */
static void print_routing(const dhsa_router_params *rp, const dhsa_layout_stats *st) {
    int64_t blocks = st->n_blocks * st->Hkv;
    printf("  %-12s sink %lld, local %lld%s, dense below %lld keys: %lld of %lld query blocks x KV heads dense%s\n",
           "routing", (long long)rp->sink_tokens, (long long)rp->local_tokens,
           rp->scale_fixed ? " (each at most 1/8, 1/4 of a block's budget)" : "", (long long)rp->dense_below,
           (long long)st->dense_blocks, (long long)blocks,
           blocks > 0 && st->dense_blocks == blocks ? ": this run was DENSE (--dense-below 0 routes every block)" : "");
}
static void check(dhsa_status st, const char *what) {
    if (st != DHSA_OK) dhsa_cli_die(EXIT_RUN, "%s: %s: %s", what, dhsa_status_str(st), dhsa_last_error());
}

/* Routes and runs one method against the dense result already in a->o and
 * a->lse; sparse outputs go to os/ls. t has room for `runs` doubles. */
static void run_method(dhsa_ctx *ctx, const dhsa_attn_desc *a, const dhsa_router_params *rp, float *os,
                       float *ls, const dhsa_synth_needle *nd, int n_needles, int runs, double *t,
                       double *route_ms, double *kernel_ms, dhsa_layout_stats *st, dhsa_fidelity *fid,
                       int *hits, dhsa_layout **keep) {
    dhsa_layout *lay = NULL;
    for (int r = 0; r < runs; r++) {
        if (lay) dhsa_layout_free(lay);
        double t0 = dhsa_cli_now();
        check(dhsa_route(ctx, rp, a, &lay), "routing");
        t[r] = dhsa_cli_now() - t0;
    }
    *route_ms = dhsa_cli_median(t, runs) * 1e3;
    dhsa_attn_desc s = *a;
    s.layout = lay;
    s.o.data = os;
    s.lse.data = ls;
    for (int r = 0; r < runs; r++) {
        double t0 = dhsa_cli_now();
        check(dhsa_attention(ctx, &s), "sparse attention");
        t[r] = dhsa_cli_now() - t0;
    }
    *kernel_ms = dhsa_cli_median(t, runs) * 1e3;
    check(dhsa_layout_get_stats(lay, st), "layout statistics");
    check(dhsa_fidelity_compare(&a->o, &a->lse, &s.o, &s.lse, fid), "fidelity");
    *hits = 0;
    for (int i = 0; i < n_needles; i++)
        for (int64_t g = 0; g < a->k.shape[1]; g++)
            *hits += dhsa_layout_selects(lay, 0, g, nd[i].row, nd[i].key + nd[i].len / 2) == 1;
    if (keep)
        *keep = lay; /* the caller frees it */
    else
        dhsa_layout_free(lay);
}

/* A synthetic workload in memory: q/k/v from dhsa_synth_generate, dense and
 * sparse outputs and LSEs, and the dense descriptor a (o/lse = the dense
 * buffers). Shared by the demo table and `bench sparse`. */
typedef struct {
    float *q, *k, *v, *od, *os, *ld, *ls;
    dhsa_synth_needle nd[DHSA_SYNTH_MAX_NEEDLES];
    dhsa_attn_desc a;
} workload;

static void workload_make(workload *w, const dhsa_synth_params *sp, int causal, const char *too_short_hint) {
    const int64_t L = sp->L;
    size_t nq = (size_t)(sp->Hq * L * sp->d), nk = (size_t)(sp->Hkv * L * sp->d), nl = (size_t)(sp->Hq * L);
    w->q = dhsa_buffer_alloc(nq * 4), w->k = dhsa_buffer_alloc(nk * 4), w->v = dhsa_buffer_alloc(nk * 4);
    w->od = dhsa_buffer_alloc(nq * 4), w->os = dhsa_buffer_alloc(nq * 4);
    w->ld = dhsa_buffer_alloc(nl * 4), w->ls = dhsa_buffer_alloc(nl * 4);
    if (!w->q || !w->k || !w->v || !w->od || !w->os || !w->ld || !w->ls)
        dhsa_cli_die(EXIT_RUN, "out of memory for L = %lld", (long long)L);
    dhsa_status st = dhsa_synth_generate(sp, w->q, w->k, w->v, w->nd);
    if (st) { /* the library's sentence speaks of its fields: name the options too */
        char msg[512];
        snprintf(msg, sizeof msg, "%s", dhsa_last_error());
        if (st == DHSA_ERR_INVALID_ARG && sp->n_needles > 0)
            dhsa_cli_die(EXIT_USAGE, "--L %lld is too short for %d needles of %lld keys, each asked for by one of "
                         "the last query blocks of %lld rows: %s (%s)", (long long)L, sp->n_needles,
                         (long long)sp->needle_len, (long long)sp->q_block, too_short_hint, msg);
        dhsa_cli_die(EXIT_RUN, "generating the workload: %s", msg);
    }
    dhsa_attn_desc *a = &w->a;
    *a = dhsa_attn_default_desc();
    a->q = dhsa_tensor_bhld(w->q, DHSA_F32, 1, sp->Hq, L, sp->d);
    a->k = dhsa_tensor_bhld(w->k, DHSA_F32, 1, sp->Hkv, L, sp->d);
    a->v = dhsa_tensor_bhld(w->v, DHSA_F32, 1, sp->Hkv, L, sp->d);
    a->o = dhsa_tensor_bhld(w->od, DHSA_F32, 1, sp->Hq, L, sp->d);
    a->lse = dhsa_tensor_bhld(w->ld, DHSA_F32, 1, sp->Hq, L, 1);
    a->causal = causal;
}

static void workload_free(workload *w) {
    float *bufs[7] = {w->q, w->k, w->v, w->od, w->os, w->ld, w->ls};
    for (int i = 0; i < 7; i++) dhsa_buffer_free(bufs[i]);
}

int dhsa_cli_sparse_demo(int64_t L, int threads) {
    dhsa_synth_params sp = dhsa_synth_default_params();
    sp.L = L;
    workload w;
    workload_make(&w, &sp, 1, "give a larger --L");
    const dhsa_synth_needle *nd = w.nd;
    float *os = w.os, *ls = w.ls;
    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = threads;
    dhsa_ctx *ctx;
    check(dhsa_ctx_create(&cp, &ctx), "creating the context");
    dhsa_attn_desc a = w.a;
    double t[1], t0 = dhsa_cli_now();
    check(dhsa_attention(ctx, &a), "dense attention");
    double dense_ms = (dhsa_cli_now() - t0) * 1e3;
    printf("DHSA and baselines on a synthetic sequence: L=%lld, 8 query / 2 KV heads, d=128, causal,\n"
           "density 0.0625 (keys per query block, sinks and the local diagonal included)\n\n",
           (long long)L);
    printf("  %-8s %10s %9s %8s %8s %8s %8s %8s\n", "method", "time ms", "speedup", "density", "recall",
           "rel_err", "needles", "chunks");
    printf("  %-8s %10.1f %9s %8s %8s %8s %8s %8s\n", "dense", dense_ms, "1.00x", "1", "1", "0", "all", "-");
    static const char *names[3] = {"dhsa", "block", "stream"};
    for (int m = 0; m < 3; m++) {
        dhsa_router_params rp = dhsa_router_params_for(L, 0.0625);
        if (m == 1) rp.boundary = DHSA_BOUNDARY_FIXED;
        if (m == 2) rp.method = DHSA_ROUTE_STREAM;
        double route_ms, kernel_ms;
        dhsa_layout_stats st;
        dhsa_fidelity fid;
        int hits;
        run_method(ctx, &a, &rp, os, ls, nd, sp.n_needles, 1, t, &route_ms, &kernel_ms, &st, &fid, &hits, NULL);
        char needles[32], chunks[32];
        snprintf(needles, sizeof needles, "%d/%d", hits, sp.n_needles * (int)sp.Hkv);
        snprintf(chunks, sizeof chunks, "%lld", (long long)st.chunks);
        printf("  %-8s %10.1f %8.2fx %8.4f %8.4f %8.4f %8s %8s\n", names[m], route_ms + kernel_ms,
               dense_ms / (route_ms + kernel_ms), st.density, fid.recall, fid.rel_err, needles,
               m == 2 ? "-" : chunks);
    }
    printf("\n  time = routing + sparse kernel; recall = mean share of each row's dense softmax\n"
           "  mass on the keys it attended to; needles = (needle, KV head) passages found.\n"
           "  More: dhsa bench sparse --help\n");
    dhsa_ctx_free(ctx);
    workload_free(&w);
    return 0;
}

/* The picture of one KV head of a layout (NULL: dense, every allowed key)
 * with the routing's chunk starts (none for stream and dense), written to
 * path. */
static void write_layout_svg(const char *path, dhsa_ctx *ctx, const dhsa_attn_desc *a, const dhsa_router_params *rp,
                             const dhsa_layout *lay, const char *method, const char *bname, int64_t head,
                             double density, uint64_t seed) {
    const int64_t L = a->q.shape[2], Hkv = a->k.shape[1];
    char title[256], sub[512];
    snprintf(title, sizeof title, "dhsa bench sparse: %s layout, L = %lld, density %.4f", method, (long long)L,
             density);
    dhsa_layout_picture *pic = dhsa_layout_picture_create(title, L, L);
    if (!pic) dhsa_cli_die(EXIT_RUN, "layout picture: %s", dhsa_last_error());
    int64_t n_starts = 0, *starts = NULL;
    int chunks = lay && rp->method != DHSA_ROUTE_STREAM;
    if (chunks) {
        check(dhsa_route_boundaries(ctx, rp, a, 0, NULL, 0, &n_starts), "sizing the boundaries");
        starts = malloc((size_t)(n_starts > 0 ? n_starts : 1) * sizeof *starts);
        if (!starts) dhsa_cli_die(EXIT_RUN, "out of memory");
        check(dhsa_route_boundaries(ctx, rp, a, 0, starts, n_starts, &n_starts), "chunk boundaries");
        check(dhsa_layout_picture_set_boundaries(pic, starts, n_starts), "picture boundaries");
    }
    if (lay) {
        dhsa_layout_picture_set_marks(pic, a->causal, rp->sink_tokens, rp->local_tokens);
        check(dhsa_layout_picture_add_layout(pic, lay, 0, head, 0), "picture of the layout");
    } else {
        dhsa_layout_picture_set_marks(pic, a->causal, 0, 0);
        for (int64_t r0 = 0; r0 < L; r0 += rp->q_block) {
            int64_t r1 = r0 + rp->q_block < L ? r0 + rp->q_block : L, all[2] = {0, a->causal ? r1 : L};
            check(dhsa_layout_picture_add_block(pic, r0, r1, all, 1), "picture of dense attention");
        }
    }
    if (chunks)
        snprintf(sub, sizeof sub,
                 "KV head %lld of %lld; q_block %lld; %s boundaries: %lld chunks; sink %lld, local %lld; synthetic "
                 "workload, seed %llu",
                 (long long)head, (long long)Hkv, (long long)rp->q_block, bname, (long long)n_starts,
                 (long long)rp->sink_tokens, (long long)rp->local_tokens, (unsigned long long)seed);
    else
        snprintf(sub, sizeof sub, "KV head %lld of %lld; q_block %lld; %s; synthetic workload, seed %llu",
                 (long long)head, (long long)Hkv, (long long)rp->q_block,
                 lay ? "sinks + recent keys" : "dense: every allowed key", (unsigned long long)seed);
    check(dhsa_layout_picture_set_subtitle(pic, sub), "picture subtitle");
    check(dhsa_layout_picture_save(pic, path), "writing the layout picture");
    dhsa_layout_picture_free(pic);
    free(starts);
}

int dhsa_cli_bench_sparse(int argc, char **argv) {
    dhsa_cli_set_command("bench sparse", "(see dhsa bench sparse --help)\n");
    int64_t L = 0, H = 8, Hkv = 2, D = 128, budget = 0, needles = 4, seed = 1;
    int threads = 0, runs = 3, dense_runs = 1, json = 0, causal = 1;
    double density = 0.0625;
    int density_set = 0;
    const char *method = "dhsa", *boundary = NULL, *svg = NULL;
    int64_t svg_head = 0;
    dhsa_router_params rp = dhsa_router_default_params();
    dhsa_cli_router_unset(&rp); /* the defaults for L and the density, once both are known */
    for (int i = 3; i < argc; i++) {
        const char *o = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
#define OPT(name) (strcmp(o, name) == 0 && (val || (dhsa_cli_die(EXIT_USAGE, "%s needs a value", name), 0)) && ++i)
        if (strcmp(o, "--help") == 0 || strcmp(o, "-h") == 0) {
            fputs(dhsa_cli_bench_sparse_usage, stdout);
            return 0;
        } else if (strcmp(o, "--json") == 0) json = 1;
        else if (strcmp(o, "--no-causal") == 0) causal = 0;
        else if (strcmp(o, "--share-heads") == 0) rp.share_heads = 1;
        else if (OPT("--L")) L = dhsa_cli_int(o, val, 1, (int64_t)1 << 24, 1);
        else if (OPT("--heads")) H = dhsa_cli_int(o, val, 1, 1024, 1);
        else if (OPT("--kv-heads")) Hkv = dhsa_cli_int(o, val, 1, 1024, 1);
        else if (OPT("--dim")) D = dhsa_cli_int(o, val, 1, 4096, 1);
        else if (OPT("--method")) method = val;
        else if (OPT("--density")) density = dhsa_cli_real(o, val, 1e-9, 1.0), density_set = 1;
        else if (OPT("--budget")) budget = dhsa_cli_int(o, val, 1, (int64_t)1 << 40, 1);
        else if (OPT("--boundary")) boundary = val;
        else if (OPT("--q-block")) rp.q_block = dhsa_cli_int(o, val, 1, 1 << 20, 1);
        else if (OPT("--chunk")) rp.chunk = dhsa_cli_int(o, val, 1, (int64_t)1 << 30, 1);
        else if (OPT("--min-chunk")) rp.min_chunk = dhsa_cli_int(o, val, 1, (int64_t)1 << 30, 1);
        else if (OPT("--score")) rp.score_mode = (dhsa_chunk_score)dhsa_cli_chunk_score(o, val);
        else if (OPT("--score-rows")) rp.score_rows = dhsa_cli_int(o, val, 0, 1 << 20, 0);
        else if (OPT("--max-chunk")) rp.max_chunk = dhsa_cli_int(o, val, 1, (int64_t)1 << 30, 1);
        else if (OPT("--sink")) rp.sink_tokens = dhsa_cli_int(o, val, 0, (int64_t)1 << 40, 1);
        else if (OPT("--local")) rp.local_tokens = dhsa_cli_int(o, val, 0, (int64_t)1 << 40, 1);
        else if (OPT("--dense-below")) rp.dense_below = dhsa_cli_int(o, val, 0, (int64_t)1 << 40, 1);
        else if (OPT("--needles")) needles = dhsa_cli_int(o, val, 0, 16, 1);
        else if (OPT("--seed")) seed = dhsa_cli_int(o, val, 0, INT64_MAX, 1);
        else if (OPT("--threads")) threads = dhsa_cli_threads(o, val);
        else if (OPT("--runs")) runs = (int)dhsa_cli_int(o, val, 1, 1000, 1);
        else if (OPT("--dense-runs")) dense_runs = (int)dhsa_cli_int(o, val, 1, 1000, 1);
        else if (OPT("--svg")) svg = val;
        else if (OPT("--svg-head")) svg_head = dhsa_cli_int(o, val, 0, 1023, 1);
        else dhsa_cli_die(EXIT_USAGE, "unknown option \"%s\"", o);
#undef OPT
    }
    if (L == 0) dhsa_cli_die(EXIT_USAGE, "--L is required");
    dhsa_cli_router_fill(&rp, L, density);
    if (svg && !svg[0]) dhsa_cli_die(EXIT_USAGE, "--svg needs a file name");
    if (svg) dhsa_cli_check_output("--svg", svg);
    if (density_set && budget)
        dhsa_cli_die(EXIT_USAGE, "give --density F or --budget N, not both (--budget sets the keys per query block; "
                     "--density the share of the keys it may see)");
    if (svg_head >= Hkv)
        dhsa_cli_die(EXIT_USAGE, "--svg-head %lld: the workload has %lld KV heads", (long long)svg_head, (long long)Hkv);
    if (H % Hkv) dhsa_cli_die(EXIT_USAGE, "--heads %lld is not a multiple of --kv-heads %lld", (long long)H, (long long)Hkv);
    /* --method takes one name or a comma list: one dense run serves all */
    char methods[8][16];
    int n_methods = 0;
    {
        const char *m = method;
        while (*m) {
            size_t len = strcspn(m, ",");
            if (len == 0 || len >= 16 || n_methods == 8) dhsa_cli_die(EXIT_USAGE, "--method %s: bad list", method);
            memcpy(methods[n_methods], m, len);
            methods[n_methods][len] = '\0';
            const char *x = methods[n_methods];
            if (strcmp(x, "dhsa") && strcmp(x, "block") && strcmp(x, "stream") && strcmp(x, "oracle") &&
                strcmp(x, "dense"))
                dhsa_cli_die(EXIT_USAGE, "--method %s: use dhsa, block, stream, oracle or dense (or a comma list)", x);
            n_methods++;
            m += len;
            if (*m == ',') m++;
        }
        if (n_methods == 0) dhsa_cli_die(EXIT_USAGE, "--method is empty");
    }
    if (boundary) {
        if (strcmp(boundary, "fixed") == 0) rp.boundary = DHSA_BOUNDARY_FIXED;
        else if (strcmp(boundary, "similarity") == 0) rp.boundary = DHSA_BOUNDARY_SIMILARITY;
        else if (strncmp(boundary, "learned:", 8) == 0) {
            rp.boundary = DHSA_BOUNDARY_LEARNED;
            rp.predictor = dhsa_cli_load_predictor(boundary + 8, Hkv * D, "the workload (--kv-heads x --dim)");
        }
        else dhsa_cli_die(EXIT_USAGE, "--boundary %s: use fixed, similarity or learned:FILE", boundary);
    }
    rp.budget_tokens = budget;
    rp.density = density;

    dhsa_synth_params sp = dhsa_synth_default_params();
    sp.Hq = H;
    sp.Hkv = Hkv;
    sp.L = L;
    sp.d = D;
    sp.q_block = rp.q_block;
    sp.seed = (uint64_t)seed;
    sp.n_needles = (int)needles;
    int64_t n_qb = (L + rp.q_block - 1) / rp.q_block;
    if (sp.n_needles > n_qb) sp.n_needles = (int)n_qb;
    static const double depth[16] = {0.1, 0.35, 0.6, 0.85, 0.2, 0.45, 0.7, 0.95,
                                     0.05, 0.3, 0.55, 0.8, 0.15, 0.4, 0.65, 0.9};
    for (int i = 0; i < sp.n_needles; i++) sp.depths[i] = depth[i];

    workload w;
    workload_make(&w, &sp, causal, "give a larger --L, fewer --needles or a smaller --q-block");
    const dhsa_synth_needle *nd = w.nd;
    float *os = w.os, *ls = w.ls;

    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = threads;
    /* learned:FILE was loaded above; its predictor lives until exit */
    dhsa_ctx *ctx;
    check(dhsa_ctx_create(&cp, &ctx), "creating the context");
    threads = dhsa_ctx_n_threads(ctx);

    dhsa_attn_desc a = w.a;

    double *t = malloc(sizeof(double) * (size_t)(runs > dense_runs ? runs : dense_runs) * 2);
    if (!t) dhsa_cli_die(EXIT_RUN, "out of memory");
    for (int r = 0; r < dense_runs; r++) {
        double t0 = dhsa_cli_now();
        check(dhsa_attention(ctx, &a), "dense attention");
        t[r] = dhsa_cli_now() - t0;
    }
    double dense_ms = dhsa_cli_median(t, dense_runs) * 1e3;

    dhsa_router_params base = rp;
    for (int mi = 0; mi < n_methods; mi++) {
    const char *method_i = methods[mi];
    int route = strcmp(method_i, "dense") != 0;
    rp = base;
    if (strcmp(method_i, "block") == 0) rp.boundary = DHSA_BOUNDARY_FIXED;
    if (strcmp(method_i, "stream") == 0) rp.method = DHSA_ROUTE_STREAM;
    if (strcmp(method_i, "oracle") == 0) rp.method = DHSA_ROUTE_ORACLE;
    double route_ms = 0, kernel_ms = dense_ms;
    dhsa_layout_stats st;
    memset(&st, 0, sizeof st);
    st.density = 1.0;
    dhsa_fidelity fid = {1.0, 1.0, 0.0, 0};
    int hits = 0, total = sp.n_needles * (int)Hkv;
    dhsa_layout *keep = NULL;
    if (route) {
        run_method(ctx, &a, &rp, os, ls, nd, sp.n_needles, runs, t, &route_ms, &kernel_ms, &st, &fid, &hits,
                   svg && mi == 0 ? &keep : NULL);
    } else {
        hits = total;
    }
    double speedup = dense_ms / (route_ms + kernel_ms);
    const char *bname = rp.boundary == DHSA_BOUNDARY_FIXED      ? "fixed"
                        : rp.boundary == DHSA_BOUNDARY_LEARNED ? "learned"
                                                               : "similarity";
    if (svg && mi == 0) {
        write_layout_svg(svg, ctx, &a, &rp, keep, method_i, bname, svg_head, st.density, (uint64_t)seed);
        dhsa_layout_free(keep);
    }
    if (json) {
        dhsa_cli_json j;
        dhsa_cli_json_init(&j, stdout, 0, "%g");
        dhsa_cli_json_object(&j, NULL);
        dhsa_cli_json_int(&j, "L", L);
        dhsa_cli_json_int(&j, "heads", H);
        dhsa_cli_json_int(&j, "kv_heads", Hkv);
        dhsa_cli_json_int(&j, "dim", D);
        dhsa_cli_json_bool(&j, "causal", causal);
        dhsa_cli_json_str(&j, "method", method_i);
        dhsa_cli_json_str(&j, "boundary", bname);
        dhsa_cli_json_int(&j, "threads", threads);
        dhsa_cli_json_int(&j, "q_block", rp.q_block);
        dhsa_cli_json_int(&j, "budget", budget);
        dhsa_cli_json_num(&j, "target_density", density);
        dhsa_cli_json_numf(&j, "dense_ms", "%.3f", dense_ms);
        dhsa_cli_json_numf(&j, "route_ms", "%.3f", route_ms);
        dhsa_cli_json_numf(&j, "kernel_ms", "%.3f", kernel_ms);
        dhsa_cli_json_numf(&j, "speedup", "%.3f", speedup);
        dhsa_cli_json_numf(&j, "route_share", "%.4f", kernel_ms > 0 ? route_ms / kernel_ms : 0.0);
        dhsa_cli_json_numf(&j, "density", "%.5f", st.density);
        dhsa_cli_json_numf(&j, "recall", "%.5f", fid.recall);
        dhsa_cli_json_numf(&j, "recall_min", "%.5f", fid.recall_min);
        dhsa_cli_json_numf(&j, "rel_err", "%.5f", fid.rel_err);
        dhsa_cli_json_int(&j, "needle_hits", hits);
        dhsa_cli_json_int(&j, "needles", total);
        dhsa_cli_json_int(&j, "chunks", st.chunks);
        dhsa_cli_json_numf(&j, "chunk_mean", "%.2f", st.chunk_mean);
        dhsa_cli_json_int(&j, "chunk_min", st.chunk_min);
        dhsa_cli_json_int(&j, "chunk_max", st.chunk_max);
        dhsa_cli_json_int(&j, "dense_blocks", st.dense_blocks);
        dhsa_cli_json_int(&j, "ranges", st.ranges);
        dhsa_cli_json_close(&j);
    } else {
        printf("dhsa bench sparse: %s (%s boundaries) vs dense, %d thread%s\n", method_i, bname, threads,
               threads > 1 ? "s" : "");
        printf("  %-12s L=%lld Hq=%lld Hkv=%lld d=%lld f32%s, q_block %lld, %s %g\n", "shape", (long long)L,
               (long long)H, (long long)Hkv, (long long)D, causal ? ", causal" : "", (long long)rp.q_block,
               budget ? "budget" : "density", budget ? (double)budget : density);
        printf("  ");
        dhsa_cli_print_router(stdout, &rp, L);
        printf("  %-12s dense %.1f ms (median of %d)\n", "dense", dense_ms, dense_runs);
        printf("  %-12s route %.1f ms + kernel %.1f ms (medians of %d): speedup %.2fx, routing %.1f%% of "
               "the kernel\n", "sparse", route_ms, kernel_ms, runs, speedup,
               kernel_ms > 0 ? 100.0 * route_ms / kernel_ms : 0.0);
        printf("  %-12s %.4f of available keys, %lld ranges, %lld dense blocks\n", "density", st.density,
               (long long)st.ranges, (long long)st.dense_blocks);
        print_routing(&rp, &st);
        if (st.chunks)
            printf("  %-12s %lld chunks, length mean %.1f, min %lld, max %lld\n", "chunks",
                   (long long)st.chunks, st.chunk_mean, (long long)st.chunk_min, (long long)st.chunk_max);
        printf("  %-12s recall %.4f (worst row %.4f), output rel_err %.4f\n", "fidelity", fid.recall,
               fid.recall_min, fid.rel_err);
        printf("  %-12s %d of %d (needle, KV head) passages selected by the block asking for them\n",
               "needles", hits, total);
    }
    }
    rp = base;
    dhsa_ctx_free(ctx);
    free(t);
    dhsa_predictor_free((dhsa_predictor *)rp.predictor);
    workload_free(&w);
    return 0;
}

/* ------------------------------------------------------------- decode --- */

const char dhsa_cli_bench_decode_usage[] =
    "usage: dhsa bench decode --L N [--heads H] [--kv-heads H] [--dim D]\n"
    "                         [--density F | --budget N]\n"
    "                         [--boundary fixed|similarity|learned:FILE]\n"
    "                         [--ubatch N] [--sink N] [--local N] [--dense-below N]\n"
    "                         [--threads T] [--runs N] [--json]\n"
    "\n"
    "One decode step at position L-1 of the synthetic workload (see dhsa bench\n"
    "sparse --help): the keys are appended to a dhsa_kv_index in ubatches of\n"
    "--ubatch (default 512), then the last query is routed through the index\n"
    "and run sparse, against dense decode over all L keys in the same run.\n"
    "Prints append cost per token, route and kernel time, dense time, speedup,\n"
    "bytes of K/V read by each (dense: all L keys; sparse: the selected keys),\n"
    "recall, output error, and whether the needle the last block asks for was\n"
    "selected. Defaults: heads 32, kv-heads 8, dim 128, density 0.0625, runs 9.\n"
    "learned:FILE reads a predictor file (docs/predictor.md; its width must be\n"
    "kv-heads x dim): the index then runs the predictor on each key appended,\n"
    "which the append cost includes (--ubatch 1 gives the decode-time cost).\n";

int dhsa_cli_bench_decode(int argc, char **argv) {
    dhsa_cli_set_command("bench decode", "(see dhsa bench decode --help)\n");
    int64_t L = 0, H = 32, Hkv = 8, D = 128, budget = 0, ubatch = 512;
    int threads = 0, runs = 9, json = 0, density_set = 0;
    double density = 0.0625;
    const char *pred_path = NULL;
    dhsa_router_params rp = dhsa_router_default_params();
    dhsa_cli_router_unset(&rp); /* the defaults for L and the density, once both are known */
    rp.causal_boundaries = 1;
    for (int i = 3; i < argc; i++) {
        const char *o = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
#define OPT(name) (strcmp(o, name) == 0 && (val || (dhsa_cli_die(EXIT_USAGE, "%s needs a value", name), 0)) && ++i)
        if (strcmp(o, "--help") == 0 || strcmp(o, "-h") == 0) {
            fputs(dhsa_cli_bench_decode_usage, stdout);
            return 0;
        } else if (strcmp(o, "--json") == 0) json = 1;
        else if (OPT("--L")) L = dhsa_cli_int(o, val, 2, (int64_t)1 << 24, 1);
        else if (OPT("--heads")) H = dhsa_cli_int(o, val, 1, 1024, 1);
        else if (OPT("--kv-heads")) Hkv = dhsa_cli_int(o, val, 1, 1024, 1);
        else if (OPT("--dim")) D = dhsa_cli_int(o, val, 1, 4096, 1);
        else if (OPT("--density")) density = dhsa_cli_real(o, val, 1e-9, 1.0), density_set = 1;
        else if (OPT("--budget")) budget = dhsa_cli_int(o, val, 1, (int64_t)1 << 40, 1);
        else if (OPT("--ubatch")) ubatch = dhsa_cli_int(o, val, 1, (int64_t)1 << 24, 1);
        else if (OPT("--sink")) rp.sink_tokens = dhsa_cli_int(o, val, 0, (int64_t)1 << 40, 1);
        else if (OPT("--local")) rp.local_tokens = dhsa_cli_int(o, val, 0, (int64_t)1 << 40, 1);
        else if (OPT("--dense-below")) rp.dense_below = dhsa_cli_int(o, val, 0, (int64_t)1 << 40, 1);
        else if (OPT("--boundary")) {
            if (strcmp(val, "fixed") == 0) rp.boundary = DHSA_BOUNDARY_FIXED;
            else if (strcmp(val, "similarity") == 0) rp.boundary = DHSA_BOUNDARY_SIMILARITY;
            else if (strncmp(val, "learned:", 8) == 0 && val[8]) {
                rp.boundary = DHSA_BOUNDARY_LEARNED;
                pred_path = val + 8; /* loaded below, once the shape is known */
            } else dhsa_cli_die(EXIT_USAGE, "--boundary %s: use fixed, similarity or learned:FILE", val);
        } else if (OPT("--threads")) threads = dhsa_cli_threads(o, val);
        else if (OPT("--runs")) runs = (int)dhsa_cli_int(o, val, 1, 1000, 1);
        else dhsa_cli_die(EXIT_USAGE, "unknown option \"%s\"", o);
#undef OPT
    }
    if (L == 0) dhsa_cli_die(EXIT_USAGE, "--L is required");
    dhsa_cli_router_fill(&rp, L, density);
    if (H % Hkv) dhsa_cli_die(EXIT_USAGE, "--heads %lld is not a multiple of --kv-heads %lld", (long long)H, (long long)Hkv);
    if (density_set && budget)
        dhsa_cli_die(EXIT_USAGE, "give --density F or --budget N, not both (--budget sets the keys per query block; "
                     "--density the share of the keys it may see)");
    if (rp.boundary == DHSA_BOUNDARY_LEARNED && pred_path)
        rp.predictor = dhsa_cli_load_predictor(pred_path, Hkv * D, "the workload (--kv-heads x --dim)");
    else if (rp.boundary != DHSA_BOUNDARY_LEARNED)
        pred_path = NULL;
    rp.budget_tokens = budget;
    rp.density = density;
    const char *bname = rp.boundary == DHSA_BOUNDARY_FIXED     ? "fixed"
                        : rp.boundary == DHSA_BOUNDARY_LEARNED ? "learned"
                                                               : "similarity";

    dhsa_synth_params sp = dhsa_synth_default_params();
    sp.Hq = H;
    sp.Hkv = Hkv;
    sp.L = L;
    sp.d = D;
    sp.n_needles = 1;
    sp.depths[0] = 0.35;
    size_t nq = (size_t)(H * L * D), nk = (size_t)(Hkv * L * D);
    float *q = dhsa_buffer_alloc(nq * 4), *k = dhsa_buffer_alloc(nk * 4), *v = dhsa_buffer_alloc(nk * 4);
    float od[4096], os[4096], ld[1024], ls[1024];
    if (!q || !k || !v) dhsa_cli_die(EXIT_RUN, "out of memory for L = %lld", (long long)L);
    if (H * D > 4096 || H > 1024) dhsa_cli_die(EXIT_USAGE, "heads x dim above 4096 is not supported here");
    dhsa_synth_needle nd[1];
    check(dhsa_synth_generate(&sp, q, k, v, nd), "generating the workload");

    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = threads;
    dhsa_ctx *ctx;
    check(dhsa_ctx_create(&cp, &ctx), "creating the context");
    threads = dhsa_ctx_n_threads(ctx);
    dhsa_kv_index *ix;
    check(dhsa_kv_index_create(ctx, &rp, Hkv, D, L, &ix), "creating the index");
    dhsa_tensor K = dhsa_tensor_bhld(k, DHSA_F32, 1, Hkv, L, D);
    double t0 = dhsa_cli_now();
    for (int64_t u0 = 0; u0 < L; u0 += ubatch) {
        dhsa_tensor part = K;
        part.data = k + u0 * D;
        part.shape[2] = ubatch < L - u0 ? ubatch : L - u0;
        check(dhsa_kv_index_append(ix, &part), "appending keys");
    }
    double append_us = (dhsa_cli_now() - t0) * 1e6 / (double)L;

    /* the last query row of every head: q [1, H, 1, D] is a view */
    dhsa_attn_desc a = dhsa_attn_default_desc();
    a.q = dhsa_tensor_bhld(q, DHSA_F32, 1, H, L, D);
    a.q.data = q + (L - 1) * D;
    a.q.shape[2] = 1;
    a.k = K;
    a.v = dhsa_tensor_bhld(v, DHSA_F32, 1, Hkv, L, D);
    a.o = dhsa_tensor_bhld(od, DHSA_F32, 1, H, 1, D);
    a.lse = dhsa_tensor_bhld(ld, DHSA_F32, 1, H, 1, 1);
    a.causal = 1;
    a.q_pos0 = L - 1;
    double *t = malloc(sizeof(double) * (size_t)runs);
    if (!t) dhsa_cli_die(EXIT_RUN, "out of memory");
    check(dhsa_attention(ctx, &a), "dense decode");
    for (int r = 0; r < runs; r++) {
        t0 = dhsa_cli_now();
        check(dhsa_attention(ctx, &a), "dense decode");
        t[r] = dhsa_cli_now() - t0;
    }
    double dense_ms = dhsa_cli_median(t, runs) * 1e3;
    dhsa_layout *lay = NULL;
    for (int r = 0; r < runs; r++) {
        if (lay) dhsa_layout_free(lay);
        t0 = dhsa_cli_now();
        check(dhsa_kv_index_route(ctx, ix, &a, &lay), "routing the query");
        t[r] = dhsa_cli_now() - t0;
    }
    double route_ms = dhsa_cli_median(t, runs) * 1e3;
    dhsa_attn_desc s = a;
    s.layout = lay;
    s.o.data = os;
    s.lse.data = ls;
    check(dhsa_attention(ctx, &s), "sparse decode");
    for (int r = 0; r < runs; r++) {
        t0 = dhsa_cli_now();
        check(dhsa_attention(ctx, &s), "sparse decode");
        t[r] = dhsa_cli_now() - t0;
    }
    double kernel_ms = dhsa_cli_median(t, runs) * 1e3;
    dhsa_layout_stats st;
    check(dhsa_layout_get_stats(lay, &st), "layout statistics");
    dhsa_fidelity fid;
    check(dhsa_fidelity_compare(&a.o, &a.lse, &s.o, &s.lse, &fid), "fidelity");
    int hits = 0;
    for (int64_t g = 0; g < Hkv; g++) hits += dhsa_layout_selects(lay, 0, g, 0, nd[0].key + nd[0].len / 2) == 1;
    double bytes_dense = 2.0 * (double)Hkv * (double)L * (double)D * 4.0;
    double bytes_sparse = 2.0 * st.selected * (double)D * 4.0; /* selected sums over KV heads */
    double speedup = dense_ms / (route_ms + kernel_ms);
    const int64_t *starts;
    int64_t chunks = dhsa_kv_index_chunks(ix, &starts);
    if (json) {
        dhsa_cli_json j;
        dhsa_cli_json_init(&j, stdout, 0, "%g");
        dhsa_cli_json_object(&j, NULL);
        dhsa_cli_json_int(&j, "L", L);
        dhsa_cli_json_int(&j, "heads", H);
        dhsa_cli_json_int(&j, "kv_heads", Hkv);
        dhsa_cli_json_int(&j, "dim", D);
        dhsa_cli_json_int(&j, "threads", threads);
        dhsa_cli_json_str(&j, "boundary", bname);
        dhsa_cli_json_int(&j, "ubatch", ubatch);
        dhsa_cli_json_numf(&j, "append_us_per_token", "%.3f", append_us);
        dhsa_cli_json_numf(&j, "dense_ms", "%.4f", dense_ms);
        dhsa_cli_json_numf(&j, "route_ms", "%.4f", route_ms);
        dhsa_cli_json_numf(&j, "kernel_ms", "%.4f", kernel_ms);
        dhsa_cli_json_numf(&j, "speedup", "%.3f", speedup);
        dhsa_cli_json_numf(&j, "density", "%.5f", st.density);
        dhsa_cli_json_numf(&j, "kv_bytes_dense", "%.0f", bytes_dense);
        dhsa_cli_json_numf(&j, "kv_bytes_sparse", "%.0f", bytes_sparse);
        dhsa_cli_json_numf(&j, "bytes_ratio", "%.3f", bytes_dense / bytes_sparse);
        dhsa_cli_json_numf(&j, "recall", "%.5f", fid.recall);
        dhsa_cli_json_numf(&j, "rel_err", "%.5f", fid.rel_err);
        dhsa_cli_json_int(&j, "needle_hits", hits);
        dhsa_cli_json_int(&j, "needles", Hkv);
        dhsa_cli_json_int(&j, "chunks", chunks);
        dhsa_cli_json_int(&j, "dense_blocks", st.dense_blocks);
        dhsa_cli_json_close(&j);
    } else {
        printf("dhsa bench decode: one query at position %lld, %d thread%s\n", (long long)(L - 1), threads,
               threads > 1 ? "s" : "");
        printf("  %-10s Hq=%lld Hkv=%lld d=%lld f32, %s boundaries, %lld chunks, density %g\n", "shape",
               (long long)H, (long long)Hkv, (long long)D,
               bname, (long long)chunks, density);
        printf("  %-10s %.2f us per token appended (ubatches of %lld)\n", "index", append_us, (long long)ubatch);
        printf("  %-10s dense %.3f ms; route %.3f ms + kernel %.3f ms (medians of %d): speedup %.2fx\n",
               "time", dense_ms, route_ms, kernel_ms, runs, speedup);
        printf("  %-10s dense %.1f MiB, sparse %.2f MiB of K/V: %.1fx fewer (density %.4f)\n", "bytes",
               bytes_dense / 1048576.0, bytes_sparse / 1048576.0, bytes_dense / bytes_sparse, st.density);
        printf("  %-10s recall %.4f, output rel_err %.4f, needle selected for %d of %lld KV heads\n",
               "fidelity", fid.recall, fid.rel_err, hits, (long long)Hkv);
        print_routing(&rp, &st);
        printf("  ");
        dhsa_cli_print_router(stdout, &rp, L);
    }
    dhsa_layout_free(lay);
    dhsa_kv_index_free(ix);
    dhsa_ctx_free(ctx);
    free(t);
    dhsa_predictor_free((dhsa_predictor *)rp.predictor);
    dhsa_buffer_free(q);
    dhsa_buffer_free(k);
    dhsa_buffer_free(v);
    return 0;
}
