/* matmul.c: `dhsa bench matmul`, the weight products of the model runner
 * (src/matmul/matmul.h) on one shape, per weight type: checks the active ISA
 * against the scalar path first (refusing to time a wrong result), then
 * times dhsa__matmul and prints a table: median of --runs, GFLOP/s, the share
 * of the fp32 FMA peak measured in the same run and, for few tokens, the
 * weight bytes per second against a plain read of the same weight buffer
 * after each timed call (the median of the per-run ratios).
 * See `dhsa bench matmul --help`; numbers in docs/quant.md.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "core/internal.h"
#include "dhsa.h"
#include "matmul/amx.h"
#include "matmul/bf16.h"
#include "matmul/int8.h"
#include "matmul/matmul.h"
#include "lib/peak.h"

const char dhsa_cli_bench_matmul_usage[] =
    "usage: dhsa bench matmul [--type TYPE|all] [--n-in N] [--n-out N]\n"
    "                         [--tok N] [--threads T] [--runs R] [--isa scalar|avx2|avx512] [--seed S]\n"
    "                         [--route exact|fast|both] [--clock wall|cpu]\n"
    "\n"
    "y[t][o] = sum_i W[o][i] x[t][i] with W (n_out x n_in) stored in the weight type\n"
    "and x, y in F32: the products of the model runner. Weights are random valid\n"
    "blocks (random codes, finite scales). For each type:\n"
    "  check     the first and last 64 rows against the scalar path (the\n"
    "            reference): |a - b| <= 2 * gamma * sum |w x| per element (the\n"
    "            worst-case bound of each summation order); a failure exits 1\n"
    "            and prints no timing\n"
    "  ms        median of --runs timed calls after one warm-up\n"
    "  GFLOP/s   2 * n_in * n_out * tok / median time; % peak is the median\n"
    "            over the calls of (the call's GFLOP/s / the fp32 FMA peak measured\n"
    "            with the same threads right after it (after every runs/20-th call\n"
    "            when there are more than 20), so that a machine shared with other\n"
    "            work moves both sides alike\n"
    "  W GB/s    (tok <= 8) weight bytes / time; read GB/s is a plain read of\n"
    "            the same weight buffer with the same threads right after each\n"
    "            call, and % read the median of the per-call ratios (not shown\n"
    "            below 1 MiB, where the read mostly times waking the threads)\n"
    "Routes (docs/quant.md): exact multiplies the weights in F32 (the\n"
    "reference); fast quantizes x to 8-bit blocks and uses integer dot products\n"
    "(AVX512-VNNI, AVX-VNNI or AVX2) for the quantized types, checked against\n"
    "the scalar integer route (|a - b| <= 2e-6 sum |w x|), and rounds x (and F16\n"
    "weights) to BF16 for vdpbf16ps (AVX512-BF16) for F16 and BF16, checked\n"
    "against the scalar BF16 kernels (twice the worst case of the summation\n"
    "order); err is its NMSE against the exact route. Where the CPU has AMX\n"
    "tiles, the fast route's calls of 5 or more tokens take the AMX route (BF16\n"
    "products, every type but F32), timed as \"bf16 amx\" next to the fast route\n"
    "without it and checked against the double product within\n"
    "(2^-8 + 2^-16 + n_in 2^-23) sum |w x|.\n"
    "With both, every run times the two routes back to back and speedup is the\n"
    "median of the per-run ratios. A type the fast route does not cover (F32;\n"
    "F16 and BF16 without AVX512-BF16; all without AVX2) prints \"(exact)\" in\n"
    "its fast row. The BF16 route is timed wherever the CPU has it, also where\n"
    "a session's fast route leaves it off because it does not pay there (the\n"
    "header line says which; DHSA_BF16=off keeps it off).\n"
    "--clock cpu times each call by the CPU time of the calling thread, which\n"
    "with --threads 1 does all the work: on a machine shared with other jobs it\n"
    "leaves out the time they ran (not their effect on the caches); it needs\n"
    "--threads 1, and % peak and % read still compare with wall-clock measurements.\n"
    "Defaults: --route both, --clock wall, --type all, --n-in 4096, --n-out 4096, --tok 1, --runs 7,\n"
    "threads = online CPUs. Sizes accept K/M suffixes (--n-out 11008).\n";

#define EXIT_RUN DHSA_EXIT_RUN

/* --clock cpu: the calling thread's CPU time, seconds */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
#define EXIT_USAGE DHSA_EXIT_USAGE

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Random valid weights: random bytes, then every float value and block
 * scale forced finite and of a modest size. */
static void fill_weights(uint32_t type, uint8_t *p, int64_t n_out, int64_t row_bytes, uint64_t seed) {
    int64_t total = n_out * row_bytes;
    uint64_t s = seed;
    for (int64_t i = 0; i < total; i += 8) {
        uint64_t r = splitmix(&s);
        memcpy(p + i, &r, (size_t)(total - i < 8 ? total - i : 8));
    }
    int64_t n = total / dhsa__wt_block_bytes(type);
    for (int64_t b = 0; b < n; b++) {
        uint8_t *q = p + b * dhsa__wt_block_bytes(type);
        uint16_t h;
        uint32_t u;
        switch (type) {
        case DHSA_GGML_F32: /* |x| in [2^-7, 2^0) */
            memcpy(&u, q, 4);
            u = (u & 0x807fffffu) | ((120u + (u >> 23) % 7u) << 23);
            memcpy(q, &u, 4);
            break;
        case DHSA_GGML_F16:
            memcpy(&h, q, 2);
            h = (uint16_t)((h & 0x83ffu) | ((8u + (h >> 10) % 7u) << 10));
            memcpy(q, &h, 2);
            break;
        case DHSA_GGML_BF16:
            memcpy(&h, q, 2);
            h = (uint16_t)((h & 0x807fu) | ((120u + (h >> 7) % 7u) << 7));
            memcpy(q, &h, 2);
            break;
        default: { /* the block scales (f16): where they are, and how many */
            int off = type == DHSA_GGML_Q6_K ? 208 : type == DHSA_GGML_Q2_K ? 80 : type == DHSA_GGML_Q3_K ? 108 : 0;
            int two = type == DHSA_GGML_Q4_K || type == DHSA_GGML_Q5_K || type == DHSA_GGML_Q2_K ||
                      type == DHSA_GGML_Q4_1 || type == DHSA_GGML_Q5_1;
            for (int k = 0; k < (two ? 2 : 1); k++) {
                memcpy(&h, q + off + 2 * k, 2);
                h = (uint16_t)((h & 0x83ffu) | (4u << 10)); /* about 2^-11 */
                memcpy(q + off + 2 * k, &h, 2);
            }
            break;
        }
        }
    }
}

/* The check: rows [r0, r0 + nr) of y against the scalar path on the same
 * rows. Returns the worst |a - b| / tolerance. */
static double check_rows(dhsa_ctx *ctx, const dhsa_wmat *W, int64_t r0, int64_t nr, const float *x, int64_t tok,
                         const float *y, int64_t ldy, int64_t *wt, int64_t *wo) {
    dhsa_isa isa = dhsa_active_isa();
    dhsa_wmat S = *W;
    S.data = (const uint8_t *)W->data + r0 * W->row_bytes;
    S.n_out = nr;
    float *ys = malloc((size_t)(tok * nr) * sizeof(float)), *w = malloc((size_t)W->n_in * sizeof(float));
    if (!ys || !w) dhsa_cli_die(EXIT_RUN, "out of memory");
    dhsa_set_isa(DHSA_ISA_SCALAR);
    dhsa_status st = dhsa__matmul(ctx, &S, x, W->n_in, tok, ys, nr);
    dhsa_set_isa(isa);
    if (st != DHSA_OK) dhsa_cli_die(EXIT_RUN, "scalar reference: %s", dhsa_last_error());
    /* both orders are within gamma_D sum |w x| of the exact sum (quant.h,
     * tests/test_quant.c), so they are within twice that of each other */
    const double u = 0x1p-24;
    const int depth = DHSA_QK_KC / 8 + 3 + (int)((W->n_in + DHSA_QK_KC - 1) / DHSA_QK_KC) + 1;
    double worst = 0.0;
    for (int64_t o = 0; o < nr; o++) {
        if (dhsa__wmat_row(&S, o, w) != DHSA_OK) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
        for (int64_t t = 0; t < tok; t++) {
            double a = 0.0;
            for (int64_t i = 0; i < W->n_in; i++) a += fabs((double)w[i] * x[t * W->n_in + i]);
            double tol = 2.0 * depth * u * a + 1e-30;
            double got = y[t * ldy + r0 + o], err = fabs(got - ys[t * nr + o]);
            double ratio = isfinite(got) ? err / tol : INFINITY;
            if (ratio > worst || (worst == 0.0 && *wt < 0)) {
                worst = ratio;
                *wt = t;
                *wo = r0 + o;
            }
        }
    }
    free(ys);
    free(w);
    return worst;
}

/* The fast route's check: rows [r0, r0 + nr) of y against the scalar
 * kernels of the same route on the same rows: integer, |a - b| <= 2e-6
 * sum |w x| (the two sum the same exact block integers in different
 * orders, int8.h); BF16, twice the worst case of its order (bf16.h). */
static double check_rows_fast(dhsa_ctx *ctx, const dhsa_wmat *W, int64_t r0, int64_t nr, const float *x, int64_t tok,
                              const float *y, int64_t ldy, int64_t *wt, int64_t *wo) {
    dhsa_wmat S = *W;
    S.data = (const uint8_t *)W->data + r0 * W->row_bytes;
    S.n_out = nr;
    float *ys = malloc((size_t)(tok * nr) * sizeof(float)), *w = malloc((size_t)W->n_in * sizeof(float));
    if (!ys || !w) dhsa_cli_die(EXIT_RUN, "out of memory");
    const int bf = dhsa__bf16_type(W->type);
    dhsa_status st = bf ? dhsa__bf16_matmul(ctx, &dhsa__bf16_scalar, &S, x, W->n_in, tok, ys, nr)
                        : dhsa__qi_matmul(ctx, &dhsa__qi_scalar, &S, x, W->n_in, tok, ys, nr);
    if (st != DHSA_OK) dhsa_cli_die(EXIT_RUN, "scalar %s route: %s", bf ? "BF16" : "integer", dhsa_last_error());
    /* BF16: both orders within gamma_D of the exact sum of the rounded
     * terms (bf16.h), each at most (1 + 2^-8)^2 times its |w x| */
    const double blocks = (double)((W->n_in + DHSA_QK_KC - 1) / DHSA_QK_KC);
    const double rel = bf ? 2.0 * (2.0 * DHSA_QK_KC / 32 + 4 + blocks) * 0x1p-24 * (1 + 0x1p-7) : 2e-6;
    double worst = 0.0;
    for (int64_t o = 0; o < nr; o++) {
        if (dhsa__wmat_row(&S, o, w) != DHSA_OK) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
        for (int64_t t = 0; t < tok; t++) {
            double a = 0.0;
            for (int64_t i = 0; i < W->n_in; i++) a += fabs((double)w[i] * x[t * W->n_in + i]);
            double tol = rel * a + 1e-30;
            double got = y[t * ldy + r0 + o], err = fabs(got - ys[t * nr + o]);
            double ratio = isfinite(got) ? err / tol : INFINITY;
            if (ratio > worst || (worst == 0.0 && *wt < 0)) {
                worst = ratio;
                *wt = t;
                *wo = r0 + o;
            }
        }
    }
    free(ys);
    free(w);
    return worst;
}

/* The AMX route's check (matmul/amx.h): rows [r0, r0 + nr) of y against
 * the double product of the exact route's weights and x, within the
 * route's bound (2^-8 + 2^-16 + n_in 2^-23) sum |w x|. */
static double check_rows_amx(const dhsa_wmat *W, int64_t r0, int64_t nr, const float *x, int64_t tok, const float *y,
                             int64_t ldy, int64_t *wt, int64_t *wo) {
    float *w = malloc((size_t)W->n_in * sizeof(float));
    if (!w) dhsa_cli_die(EXIT_RUN, "out of memory");
    const double rel = 0x1p-8 + 0x1p-16 + (double)W->n_in * 0x1p-23;
    double worst = 0.0;
    for (int64_t o = r0; o < r0 + nr; o++) {
        if (dhsa__wmat_row(W, o, w) != DHSA_OK) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
        for (int64_t t = 0; t < tok; t++) {
            double a = 0.0, ref = 0.0;
            for (int64_t i = 0; i < W->n_in; i++) {
                const double p = (double)w[i] * x[t * W->n_in + i];
                ref += p;
                a += fabs(p);
            }
            const double got = y[t * ldy + o], ratio = isfinite(got) ? fabs(got - ref) / (rel * a + 1e-30) : INFINITY;
            if (ratio > worst || (worst == 0.0 && *wt < 0)) {
                worst = ratio;
                *wt = t;
                *wo = o;
            }
        }
    }
    free(w);
    return worst;
}

/* One call of route ri: 0 exact, 1 fast without the AMX tiles, 2 fast with
 * them (the session's default where they run). */
static dhsa_status run_route(dhsa_ctx *ctx, int ri, const dhsa_wmat *W, const float *x, int64_t tok, float *y) {
    if (ri == 0) return dhsa__matmul(ctx, W, x, W->n_in, tok, y, W->n_out);
    const int before = dhsa__set_amx_cap(ri == 2);
    dhsa_status st = dhsa__matmul_on(ctx, DHSA_MM_FAST, W, x, W->n_in, tok, y, W->n_out);
    dhsa__set_amx_cap(before);
    return st;
}

static const uint32_t all_types[] = {
    DHSA_GGML_F32,  DHSA_GGML_F16,  DHSA_GGML_BF16, DHSA_GGML_Q8_0, DHSA_GGML_Q4_0,   DHSA_GGML_Q4_K,
    DHSA_GGML_Q6_K, DHSA_GGML_Q4_1, DHSA_GGML_Q5_0, DHSA_GGML_Q5_1, DHSA_GGML_IQ4_NL, DHSA_GGML_Q2_K,
    DHSA_GGML_Q3_K, DHSA_GGML_Q5_K, DHSA_GGML_IQ4_XS};
#define N_ALL_TYPES ((int)(sizeof all_types / sizeof all_types[0]))

int dhsa_cli_bench_matmul(int argc, char **argv) {
    dhsa_cli_set_command("bench matmul", "(see dhsa bench matmul --help)\n");
    int64_t n_in = 4096, n_out = 4096, tok = 1, seed = 1;
    int threads = 0, runs = 7, isa = -1, corrupt = 0;
    const char *type_arg = "all", *route_arg = "both";
    double (*clock_now)(void) = dhsa_cli_now;
    for (int i = 3; i < argc; i++) {
        const char *o = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
#define OPT(name) (strcmp(o, name) == 0 && (val || (dhsa_cli_die(EXIT_USAGE, "%s needs a value", name), 0)) && ++i)
        if (strcmp(o, "--help") == 0 || strcmp(o, "-h") == 0) {
            fputs(dhsa_cli_bench_matmul_usage, stdout);
            return 0;
        } else if (strcmp(o, "--corrupt") == 0) corrupt = 1; /* test hook: one wrong output before the check */
        else if (OPT("--type")) type_arg = val;
        else if (OPT("--route")) {
            route_arg = val;
            if (strcmp(val, "exact") && strcmp(val, "fast") && strcmp(val, "both"))
                dhsa_cli_die(EXIT_USAGE, "--route: \"%s\" is not exact, fast or both", val);
        }
        else if (OPT("--clock")) {
            if (strcmp(val, "wall") == 0) clock_now = dhsa_cli_now;
            else if (strcmp(val, "cpu") == 0) clock_now = cpu_now;
            else dhsa_cli_die(EXIT_USAGE, "--clock: \"%s\" is not wall or cpu", val);
        }
        else if (OPT("--n-in")) n_in = dhsa_cli_int(o, val, 1, (int64_t)1 << 20, 1);
        else if (OPT("--n-out")) n_out = dhsa_cli_int(o, val, 1, (int64_t)1 << 24, 1);
        else if (OPT("--tok")) tok = dhsa_cli_int(o, val, 1, 1 << 16, 1);
        else if (OPT("--threads")) threads = dhsa_cli_threads(o, val);
        else if (OPT("--runs")) runs = (int)dhsa_cli_int(o, val, 1, 100000, 1);
        else if (OPT("--seed")) seed = dhsa_cli_int(o, val, 0, INT64_MAX, 1);
        else if (OPT("--isa")) {
            if (strcmp(val, "scalar") == 0) isa = DHSA_ISA_SCALAR;
            else if (strcmp(val, "avx2") == 0) isa = DHSA_ISA_AVX2;
            else if (strcmp(val, "avx512") == 0) isa = DHSA_ISA_AVX512;
            else dhsa_cli_die(EXIT_USAGE, "--isa: \"%s\" is not scalar, avx2 or avx512", val);
        } else dhsa_cli_die(EXIT_USAGE, "unknown option \"%s\"", o);
#undef OPT
    }
    uint32_t types[N_ALL_TYPES];
    int n_types = 0, all = strcmp(type_arg, "all") == 0;
    for (int k = 0; k < N_ALL_TYPES; k++) {
        if (!all && strcmp(type_arg, dhsa_ggml_type_name(all_types[k])) != 0) continue;
        if (n_in % dhsa__wt_block(all_types[k])) {
            if (!all)
                dhsa_cli_die(EXIT_USAGE, "--n-in %lld is not a multiple of the %s block (%lld)", (long long)n_in,
                    dhsa_ggml_type_name(all_types[k]), (long long)dhsa__wt_block(all_types[k]));
            printf("(%s skipped: --n-in %lld is not a multiple of its block of %lld)\n",
                   dhsa_ggml_type_name(all_types[k]), (long long)n_in, (long long)dhsa__wt_block(all_types[k]));
            continue;
        }
        types[n_types++] = all_types[k];
    }
    if (!n_types && !all)
        dhsa_cli_die(EXIT_USAGE, "--type: \"%s\" is not one of " DHSA_QK_TYPE_LIST " or all", type_arg);
    if (!n_types) dhsa_cli_die(EXIT_USAGE, "no type has a block dividing --n-in %lld", (long long)n_in);
    if (clock_now == cpu_now && threads != 1)
        dhsa_cli_die(EXIT_USAGE, "--clock cpu needs --threads 1 (the CPU time of the calling thread)");
    if (isa >= 0 && dhsa_set_isa((dhsa_isa)isa) != DHSA_OK) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());

    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = threads;
    dhsa_ctx *ctx;
    if (dhsa_ctx_create(&cp, &ctx) != DHSA_OK) dhsa_cli_die(EXIT_RUN, "dhsa_ctx_create: %s", dhsa_last_error());
    threads = dhsa_ctx_n_threads(ctx);
    const int bw = tok <= 8;

    float *x = dhsa_buffer_alloc((size_t)(tok * n_in) * sizeof(float));
    float *y = dhsa_buffer_alloc((size_t)(tok * n_out) * sizeof(float));
    if (!x || !y) dhsa_cli_die(EXIT_RUN, "out of memory for x and y");
    uint64_t s = (uint64_t)seed * 7919u + 17u;
    for (int64_t i = 0; i < tok * n_in; i++) x[i] = (float)((double)(splitmix(&s) >> 11) * 0x1p-52 - 1.0);

    double peak = dhsa_peak_fma_gflops(ctx, threads, 0.3);
    if (!(peak > 0.0)) dhsa_cli_die(EXIT_RUN, "measuring the FMA peak failed: %s", dhsa_last_error());
    printf("dhsa bench matmul: isa %s, %d thread%s, n_in %lld, n_out %lld, tok %lld, %d runs, %s clock\n",
           dhsa_isa_name(dhsa_active_isa()), threads, threads > 1 ? "s" : "", (long long)n_in, (long long)n_out,
           (long long)tok, runs, clock_now == cpu_now ? "cpu" : "wall");
    /* F16/BF16: the BF16 route is timed wherever it can run, also where the
     * session's fast route leaves it off (DHSA_BF16=auto and the probe says
     * it does not pay); DHSA_BF16=off keeps it off */
    const dhsa__bf16_mode bf_mode0 = dhsa__set_bf16_mode(DHSA__BF16_ON);
    if (bf_mode0 == DHSA__BF16_OFF) dhsa__set_bf16_mode(DHSA__BF16_OFF);
    if (dhsa__bf16_kernels_active())
        printf("BF16 route (F16, BF16): a vdpbf16ps costs %.2f FMA here (probe), so the fast route of a session %s\n",
               dhsa__bf16_probe(), bf_mode0 == DHSA__BF16_ON ? "takes it (DHSA_BF16=on)"
                                   : dhsa__bf16_probe() <= 2.0 ? "takes it" : "does not (the exact route runs); timed here regardless");

    const int do_exact = strcmp(route_arg, "fast") != 0, do_fast = strcmp(route_arg, "exact") != 0;
    if (dhsa__amx_kernels_active() && tok >= DHSA__AMX_MIN_TOK)
        printf("AMX route (calls of >= %d tokens, every type but F32): the fast route of a session takes it; timed "
               "here as \"bf16 amx\" next to the fast route without it\n", DHSA__AMX_MIN_TOK);
    /* per route (exact, fast without AMX, AMX): times, shares of the peak
     * and of the plain read, speedups over exact */
    double *t[3], *pk[3], *ratio[3], *spd[3], *tr = malloc((size_t)runs * sizeof *tr);
    int alloc_ok = tr != NULL;
    for (int ri = 0; ri < 3; ri++) {
        t[ri] = malloc((size_t)runs * sizeof(double));
        pk[ri] = malloc((size_t)runs * sizeof(double));
        ratio[ri] = malloc((size_t)runs * sizeof(double));
        spd[ri] = malloc((size_t)runs * sizeof(double));
        alloc_ok = alloc_ok && t[ri] && pk[ri] && ratio[ri] && spd[ri];
    }
    float *ye = dhsa_buffer_alloc((size_t)(tok * n_out) * sizeof(float));
    typedef struct {
        double ms, gflops, peak_share, wgbps, rdshare, check, err, speedup;
        int fused, ran, covered;
    } route_res;
    struct {
        double mib, rdgbps;
        route_res r[3]; /* exact, fast, amx */
    } res[N_ALL_TYPES];
    if (!alloc_ok || !ye) dhsa_cli_die(EXIT_RUN, "out of memory");
    memset(res, 0, sizeof res);
    int rc = 0;
    for (int ti = 0; ti < n_types && rc == 0; ti++) {
        dhsa_wmat W;
        W.type = types[ti];
        W.n_in = n_in;
        W.n_out = n_out;
        W.row_bytes = dhsa__wt_row_bytes(W.type, n_in);
        size_t wbytes = (size_t)(W.row_bytes * n_out);
        uint8_t *wd = dhsa_buffer_alloc(wbytes);
        if (!wd) dhsa_cli_die(EXIT_RUN, "out of memory for %zu bytes of weights", wbytes);
        fill_weights(W.type, wd, n_out, W.row_bytes, (uint64_t)seed + (uint64_t)ti);
        W.data = wd;
        const char *tn = dhsa_ggml_type_name(W.type);
        const dhsa__qi_kernels *qk = dhsa__qi_type(W.type) ? dhsa__qi_kernels_active() : NULL;
        const dhsa__bf16_kernels *bk = dhsa__bf16_type(W.type) ? dhsa__bf16_kernels_active() : NULL;
        const int amx_before = dhsa__set_amx_cap(0);
        const int fast = do_fast && (qk != NULL || bk != NULL) && dhsa__matmul_fast_covers(W.type, tok);
        dhsa__set_amx_cap(amx_before);
        const int amx = do_fast && dhsa__amx_takes(W.type, tok), exact = do_exact || (!fast && !amx);
        const int on[3] = {exact, fast, amx};

        /* 1. correctness first: the exact route against the scalar path,
         * the fast one against the scalar integer route, AMX against the
         * double product */
        dhsa_status st = dhsa__matmul(ctx, &W, x, n_in, tok, ye, n_out);
        if (st != DHSA_OK) dhsa_cli_die(EXIT_RUN, "%s: %s", tn, dhsa_last_error());
        for (int ri = 0; ri < 3; ri++) {
            if (!on[ri]) continue;
            float *yy = ye;
            if (ri > 0) {
                st = run_route(ctx, ri, &W, x, tok, y);
                if (st != DHSA_OK) dhsa_cli_die(EXIT_RUN, "%s: %s", tn, dhsa_last_error());
                yy = y;
            }
            if (corrupt) yy[(tok - 1) * n_out + n_out - 1] += 1.0f;
            int64_t wt = -1, wo = -1, nr = n_out < 64 ? n_out : 64;
            double worst = 0.0;
            for (int part = 0; part < 2; part++) {
                int64_t pt = -1, po = -1, r0 = part ? n_out - nr : 0;
                double w1 = ri == 0   ? check_rows(ctx, &W, r0, nr, x, tok, yy, n_out, &pt, &po)
                            : ri == 1 ? check_rows_fast(ctx, &W, r0, nr, x, tok, yy, n_out, &pt, &po)
                                      : check_rows_amx(&W, r0, nr, x, tok, yy, n_out, &pt, &po);
                if (!(w1 <= worst)) {
                    worst = w1;
                    wt = pt;
                    wo = po;
                }
            }
            if (corrupt && ri == 0) ye[(tok - 1) * n_out + n_out - 1] -= 1.0f;
            if (!(worst <= 1.0)) {
                fprintf(stderr,
                        "dhsa bench matmul: %s, %s route: check FAILED against %s: token %lld, row %lld is "
                        "%.3g of its tolerance. No timing is reported for a wrong result.\n",
                        tn, ri == 0 ? "exact" : ri == 1 ? "fast" : "AMX",
                        ri == 2 ? "the double product" : "the scalar path", (long long)wt, (long long)wo, worst);
                rc = EXIT_RUN;
                break;
            }
            res[ti].r[ri].check = worst;
            res[ti].r[ri].ran = 1;
            res[ti].r[ri].covered = 1;
            res[ti].r[ri].fused = ri == 0 ? dhsa__matmul_fused(W.type, tok)
                                  : ri == 2 ? 0
                                  : qk      ? tok <= qk->max_tok_fused
                                            : dhsa__bf16_fused(bk, tok);
            if (ri > 0) { /* the fast route's error: NMSE against the exact route */
                double num = 0.0, den = 0.0;
                for (int64_t e = 0; e < tok * n_out; e++) {
                    double d = (double)y[e] - ye[e];
                    num += d * d;
                    den += (double)ye[e] * ye[e];
                }
                res[ti].r[ri].err = num / (den + 1e-300);
            }
        }
        if (rc) {
            dhsa_buffer_free(wd);
            break;
        }

        /* 2. timing, the routes back to back in every run; after each call
         * the FMA peak and (few tokens) a plain read of the weights, each
         * with the same threads */
        const double flops = 2.0 * (double)n_in * (double)n_out * (double)tok;
        double p_last = peak;
        for (int ri = 0; ri < 3; ri++)
            if (on[ri]) run_route(ctx, ri, &W, x, tok, y);
        float *wf = (float *)wd;
        size_t nf = wbytes / 4;
        for (int r = 0; r < runs; r++) {
            if (r % (runs / 20 + 1) == 0) {
                p_last = dhsa_peak_fma_gflops(ctx, threads, 0.03);
                if (!(p_last > 0.0)) dhsa_cli_die(EXIT_RUN, "measuring the FMA peak failed: %s", dhsa_last_error());
                if (p_last > peak) peak = p_last;
            }
            if (bw) {
                const float *bufs[1] = {wf};
                tr[r] = dhsa_peak_read_buffers_s(ctx, threads, bufs, &nf, 1);
                if (!(tr[r] > 0.0)) dhsa_cli_die(EXIT_RUN, "plain read: %s", dhsa_last_error());
            }
            for (int ri = 0; ri < 3; ri++) {
                if (!on[ri]) continue;
                double t0 = clock_now();
                st = run_route(ctx, ri, &W, x, tok, y);
                t[ri][r] = clock_now() - t0;
                if (st != DHSA_OK) dhsa_cli_die(EXIT_RUN, "%s: %s", tn, dhsa_last_error());
                pk[ri][r] = flops / t[ri][r] * 1e-9 / p_last;
                if (bw) ratio[ri][r] = tr[r] / t[ri][r];
                if (ri > 0 && exact) spd[ri][r] = t[0][r] / t[ri][r];
            }
        }
        res[ti].mib = (double)wbytes / 1048576.0;
        res[ti].rdgbps = bw ? (double)wbytes / dhsa_cli_median(tr, runs) * 1e-9 : 0.0;
        for (int ri = 0; ri < 3; ri++) {
            if (!res[ti].r[ri].ran) continue;
            double med = dhsa_cli_median(t[ri], runs);
            route_res *rr = &res[ti].r[ri];
            rr->ms = med * 1e3;
            rr->gflops = flops / med * 1e-9;
            rr->peak_share = dhsa_cli_median(pk[ri], runs);
            rr->wgbps = (double)wbytes / med * 1e-9;
            rr->rdshare = bw ? dhsa_cli_median(ratio[ri], runs) : 0.0;
            rr->speedup = ri > 0 && exact ? dhsa_cli_median(spd[ri], runs) : 0.0;
        }
        if (do_fast && !fast) res[ti].r[1].covered = 0;
        dhsa_buffer_free(wd);
    }
    if (rc == 0) {
        printf("%-6s %-16s %9s %10s %9s %7s %8s%s %9s %8s %8s\n", "type", "route", "W MiB", "median ms", "GFLOP/s",
               "% peak", "W GB/s", bw ? " read GB/s  % read" : "", "check", "err", "speedup");
        for (int ti = 0; ti < n_types; ti++) {
            for (int ri = 0; ri < 3; ri++) {
                const route_res *rr = &res[ti].r[ri];
                if (ri == 1 && do_fast && !rr->covered) {
                    const int before = dhsa__set_amx_cap(0);
                    printf("%-6s %-16s (exact: %s)\n", dhsa_ggml_type_name(types[ti]), "fast",
                           dhsa__matmul_path_name(DHSA_MM_FAST, types[ti]));
                    dhsa__set_amx_cap(before);
                    continue;
                }
                if (!rr->ran) continue;
                char rname[32];
                snprintf(rname, sizeof rname, "%s %s",
                         ri == 0 ? "f32" : ri == 2 || dhsa__bf16_type(types[ti]) ? "bf16" : "int8",
                         ri == 2 ? "amx" : rr->fused ? "fused" : "panel");
                printf("%-6s %-16s %9.1f %10.4f %9.1f %6.1f%% %8.2f", dhsa_ggml_type_name(types[ti]), rname,
                       res[ti].mib, rr->ms, rr->gflops, 100.0 * rr->peak_share, rr->wgbps);
                /* below 1 MiB a plain read mostly times waking the threads */
                if (bw && res[ti].mib >= 1.0) printf(" %9.2f %6.1f%%", res[ti].rdgbps, 100.0 * rr->rdshare);
                else if (bw) printf(" %9s %7s", "-", "-");
                printf(" %5.3f tol", rr->check);
                if (ri > 0) printf(" %8.1e", rr->err);
                else printf(" %8s", "-");
                if (ri > 0 && rr->speedup > 0) printf(" %7.2fx", rr->speedup);
                printf("\n");
            }
        }
        printf("fp32 FMA peak, %d thread%s: %.1f GFLOP/s at best in this run (%% peak: per call, against the peak "
               "measured before it); check: worst |a - b| as a share of its tolerance vs the scalar path (bf16 "
               "amx: vs the double product, bound (2^-8 + 2^-16 + n_in 2^-23) sum |w x|), first "
               "and last 64 rows; err: NMSE of the fast route against the exact one; speedup: exact time / fast "
               "time, median of the per-run ratios\n",
               threads, threads > 1 ? "s" : "", peak);
    }
    for (int ri = 0; ri < 3; ri++) {
        free(t[ri]);
        free(pk[ri]);
        free(ratio[ri]);
        free(spd[ri]);
    }
    free(tr);
    dhsa_buffer_free(ye);
    dhsa_buffer_free(x);
    dhsa_buffer_free(y);
    dhsa_ctx_free(ctx);
    return rc;
}
