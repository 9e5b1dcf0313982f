/* dhsa.c: the command-line tool, one binary with subcommands.
 *
 *   dhsa peak         measured fp32 FMA peak (1 thread, all threads) and
 *                     memory read bandwidth of this machine
 *   dhsa bench attn   attention benchmark: checks the result against the
 *                     reference backend first, then times it and reports
 *                     GFLOP/s, share of the measured peak, workspace and RSS
 *   dhsa demo         tiled attention at long context on built-in synthetic
 *                     data: time, memory, error, mask polarity rule
 *
 * Every subcommand takes --help. Exit status: 0 success, 1 a run failed (a
 * library error, a result over tolerance), 2 a usage error (unknown option,
 * a number that does not parse or is out of range).
 * Numbers are parsed strictly: the whole text must be a number in range;
 * sizes accept K/M/G suffixes (powers of 1024: --L 32K).
 * Tested by tests/test_cli.c (make test).
 */
#include "cli.h"
#include "dhsa.h"
#include "lib/peak.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#define EXIT_RUN DHSA_EXIT_RUN     /* the run failed */
#define EXIT_USAGE DHSA_EXIT_USAGE /* the command line is wrong */

/* ---------------------------------------------------------------- usage --- */

static const char usage_main[] =
    "usage: dhsa <command> [options]\n"
    "\n"
    "commands:\n"
    "  run          generate text with a GGUF (or llama2.c) model, dense or DHSA\n"
    "               attention, under a memory limit\n"
    "  chat         a conversation over documents, prefilled once (-f DOC)\n"
    "  plan         the memory plan of a run, without running it\n"
    "  peak         measured fp32 FMA peak and memory read bandwidth\n"
    "  bench attn   attention benchmark (checked against the reference first)\n"
    "  bench sparse DHSA / block / streaming / oracle vs dense on a synthetic\n"
    "               long sequence: speed, density, recall, needles\n"
    "  bench decode one decode step routed through a dhsa_kv_index vs dense\n"
    "  bench matmul weight products per weight type (F32 ... IQ4_XS)\n"
    "  bench model  time to first token, decode tok/s and peak memory of a model\n"
    "               at several lengths, dense vs DHSA\n"
    "  gen-model    a random-weight GGUF of a real model's shape (benchmarks)\n"
    "  train-boundary  train the learned boundary predictor for a model on a text\n"
    "  demo         tiled attention at long context on synthetic data\n"
    "  convert      llama2.c checkpoint + tokenizer -> GGUF file\n"
    "  inspect      a GGUF file's (or llama2.c checkpoint's) metadata and tensors\n"
    "  tokenize     a text's token ids and pieces with a GGUF model's tokenizer\n"
    "  eval         quality of the sparse methods against dense on a model:\n"
    "               fidelity (KL, top-1, perplexity, recall), copy, niah,\n"
    "               passkey, multikey, multivalue\n"
    "  memprobe     peak memory of a command as a size n grows, fitted and\n"
    "               judged (linear or quadratic)\n"
    "  serve        an OpenAI-compatible HTTP server (chat, completions,\n"
    "               streaming, parallel slots, prompt cache)\n"
    "  pull NAME    fetch a pretrained model of the catalog (--list shows it);\n"
    "               then -m NAME names it\n"
    "  help [CMD]   this text, or the usage of CMD\n"
    "\n"
    "`dhsa CMD --help` describes each command. Exit status: 0 ok, 1 the run\n"
    "failed, 2 usage error. dhsa " DHSA_VERSION "\n";

static const char usage_peak[] =
    "usage: dhsa peak [--threads T] [--json]\n"
    "\n"
    "Measures this machine, in this process: fp32 FMA throughput of 1 thread\n"
    "and of T threads (independent FMA chains with the widest vectors the\n"
    "kernels use; 2 flops per lane), and memory read bandwidth of T threads\n"
    "summing a 1 GiB buffer. FMA: best of several repetitions; bandwidth:\n"
    "median of at least 5 passes. GB = 1e9 bytes.\n"
    "\n"
    "  --threads T   threads for the all-threads numbers (default: online CPUs)\n"
    "  --json        one JSON object: isa, gflops_1t, gflops_all, threads,\n"
    "                read_gbps, read_bytes\n"
    "  --help        this text\n"
    "\n"
    "DHSA_FORCE_SCALAR=1 measures the scalar path.\n";

static const char usage_bench[] =
    "usage: dhsa bench NAME [options]\n"
    "\n"
    "  attn     attention kernels: checked against the reference, then GFLOP/s\n"
    "           and the share of the measured peak\n"
    "  sparse   DHSA / block / streaming / oracle vs dense on a synthetic long\n"
    "           sequence: speed, density, recall, needles\n"
    "  decode   one decode step routed through a dhsa_kv_index vs dense\n"
    "  matmul   the weight products per weight type (F32 ... IQ4_XS)\n"
    "  model    a model's time to first token, decode tok/s and peak memory at\n"
    "           several lengths, per attention method\n"
    "\n"
    "`dhsa bench NAME --help` (or `dhsa help bench NAME`) describes each.\n";

static const char usage_bench_attn[] =
    "usage: dhsa bench attn --L N --heads H --dim D [options]\n"
    "\n"
    "Allocates Q, K, V, O with deterministic random values, checks one call\n"
    "against the reference backend (double precision) on the last 32 query\n"
    "rows of every head, and refuses to time a result over tolerance. Then\n"
    "one warm-up call and --runs timed calls; prints the median.\n"
    "\n"
    "  --L N            keys per sequence, Lk (suffix K = 1024: --L 32K)\n"
    "  --Lq N           queries per sequence (default L); the queries are the\n"
    "                   last Lq positions (q_pos0 = L - Lq): --Lq 1 is decode\n"
    "  --batch B        sequences (default 1)\n"
    "  --heads H        query heads\n"
    "  --kv-heads H     key/value heads, dividing --heads (default --heads)\n"
    "  --dim D          head dimension of Q and K\n"
    "  --dv D           head dimension of V and O (default --dim)\n"
    "  --causal         causal mask\n"
    "  --window W       keep only the last W keys of each query (0 = none)\n"
    "  --softcap C      scores become C*tanh(s/C) (0 = none)\n"
    "  --dtype T        f32 | f16 | bf16 for Q, K, V and O (default f32)\n"
    "  --kv-dtype T     f32 | f16 | bf16 | q8_0 for K and V (default --dtype;\n"
    "                   q8_0: 8-bit blocks of 32, --dim and --dv multiples of 32)\n"
    "  --threads T      threads (default: online CPUs)\n"
    "  --backend B      tiled | reference (default tiled)\n"
    "  --isa I          scalar | avx2 | avx512 (default: the best this CPU has;\n"
    "                   the FMA peak is then measured with the same ISA)\n"
    "  --runs N         timed runs, at least 3 (default 5)\n"
    "  --json           one JSON object instead of the table\n"
    "  --help           this text\n"
    "\n"
    "FLOPs count 2*(d + dv) per allowed (query, key) pair per head (QK^T and\n"
    "PV; = 4*d when dv = d): dense calls count Lq*Lk pairs; causal calls with\n"
    "Lq = L and no window count half of dense (the usual convention); other\n"
    "causal or windowed calls count the allowed pairs exactly. GFLOP/s =\n"
    "FLOPs / median time; peak fraction divides by the FMA peak measured in\n"
    "the same process with the same threads (before and after the timed\n"
    "calls; the larger of the two). Decode shapes (Lq <= 16) also report\n"
    "K/V read bandwidth (bytes of K and V / median time); each timed call is\n"
    "followed by a plain vector read of the same K and V buffers with the same\n"
    "threads, and bandwidth_fraction is the median of the per-run ratios\n"
    "(read time / call time); read_gbps is the 1 GiB bandwidth measured after\n"
    "the runs, for reference. extra RSS = peak RSS during the timed calls\n"
    "minus the RSS right after the inputs were allocated and written.\n";

static const char usage_demo[] =
    "usage: dhsa demo [--L N] [--threads T] [-m MODEL] [--model-L N]\n"
    "\n"
    "Runs tiled attention on built-in synthetic data (no files): a batch of\n"
    "2 sequences of L tokens (default 8192), the second left-padded by L/4\n"
    "(key_mask, DHSA_MASK_TRUE_IGNORES), 8 query heads sharing 2 K/V heads,\n"
    "dim 128, causal, f32. Prints the time, GFLOP/s, the exact workspace\n"
    "(which does not grow with L) next to what a materialising attention\n"
    "needs, the measured peak RSS, the error against the reference backend,\n"
    "and shows that a key mask without a polarity is refused; then DHSA,\n"
    "fixed blocks and streaming against dense on a synthetic sequence; then\n"
    "a real model (the shipped default, models/" DHSA_DEFAULT_MODEL ",\n"
    "or -m MODEL) answers a passkey question hidden in a prompt of --model-L\n"
    "tokens with each attention method at 6.25% density.\n"
    "\n"
    "  --L N         sequence length (suffix K = 1024; default 8192)\n"
    "  --threads T   threads (default: online CPUs)\n"
    "  -m MODEL      the model of the last part (default: the shipped one)\n"
    "  --model-L N   its prompt length (default 4096)\n"
    "  --help        this text\n";

/* ------------------------------------------------------- errors, timing --- */

static const char *cur_usage = usage_main; /* printed by --help */

/* A library call failed: say which, with the library's sentence. */
static void lib_error(const char *what, dhsa_status st) {
    dhsa_cli_die(EXIT_RUN, "%s failed: %s: %s", what, dhsa_status_str(st), dhsa_last_error());
}

static int online_cpus(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)(n < 1024 ? n : 1024) : 1;
}

static double physical_memory_bytes(void) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (double)pages * (double)page : 0.0;
}

/* Peak RSS so far. The kernel folds per-thread RSS counters into VmHWM
 * lazily, so right after a reset VmHWM can read below VmRSS: take the max. */
static size_t peak_rss_now(void) {
    size_t hwm = dhsa_proc_peak_rss(), rss = dhsa_proc_rss();
    return hwm > rss ? hwm : rss;
}

/* ------------------------------------------------------ option scanning --- */

/* Walks "--name value", "--name=value" and flags. Usage:
 *   opt_scan o = opt_begin(argc, argv, first);
 *   while (opt_next(&o)) { if (opt_is(&o, "--L")) L = parse(opt_value(&o)); ... else
 *   opt_unknown(&o); } */
typedef struct {
    int argc;
    char **argv;
    int i;               /* index of the current argument */
    char name[64];       /* current option without "=value" */
    const char *inl;     /* text after '=', or NULL */
} opt_scan;

static opt_scan opt_begin(int argc, char **argv, int first) {
    opt_scan o;
    memset(&o, 0, sizeof o);
    o.argc = argc;
    o.argv = argv;
    o.i = first - 1;
    return o;
}

/* Advances to the next option; 0 at the end. --help / -h print the usage
 * and exit 0. A bare word is a usage error. */
static int opt_next(opt_scan *o) {
    if (++o->i >= o->argc) return 0;
    const char *a = o->argv[o->i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
        fputs(cur_usage, stdout);
        exit(0);
    }
    if (strncmp(a, "--", 2) != 0 || !a[2]) dhsa_cli_die(EXIT_USAGE, "unexpected argument \"%s\"", a);
    const char *eq = strchr(a, '=');
    size_t n = eq ? (size_t)(eq - a) : strlen(a);
    if (n >= sizeof o->name) dhsa_cli_die(EXIT_USAGE, "unknown option \"%s\"", a);
    memcpy(o->name, a, n);
    o->name[n] = '\0';
    o->inl = eq ? eq + 1 : NULL;
    return 1;
}

static int opt_is(const opt_scan *o, const char *name) { return strcmp(o->name, name) == 0; }

/* The option's value: after '=' or the next argument. */
static const char *opt_value(opt_scan *o) {
    if (o->inl) return o->inl;
    if (o->i + 1 >= o->argc) dhsa_cli_die(EXIT_USAGE, "%s needs a value", o->name);
    return o->argv[++o->i];
}

/* A flag: no value allowed. */
static int opt_flag(const opt_scan *o) {
    if (o->inl) dhsa_cli_die(EXIT_USAGE, "%s takes no value", o->name);
    return 1;
}

static void opt_unknown(const opt_scan *o) { dhsa_cli_die(EXIT_USAGE, "unknown option \"%s\"", o->argv[o->i]); }

/* ----------------------------------------------------------------- peak --- */

static int cmd_peak(int argc, char **argv) {
    cur_usage = usage_peak;
    dhsa_cli_set_command("peak", cur_usage);
    int threads = online_cpus(), json = 0;
    /* Hidden, for tests: --seconds S per measurement, --bytes N buffer. */
    double seconds = 0.6;
    int64_t bytes = (int64_t)1 << 30;
    opt_scan o = opt_begin(argc, argv, 2);
    while (opt_next(&o)) {
        if (opt_is(&o, "--threads"))
            threads = dhsa_cli_threads("--threads", opt_value(&o));
        else if (opt_is(&o, "--json"))
            json = opt_flag(&o);
        else if (opt_is(&o, "--seconds"))
            seconds = dhsa_cli_real("--seconds", opt_value(&o), 0.001, 600.0);
        else if (opt_is(&o, "--bytes"))
            bytes = dhsa_cli_int("--bytes", opt_value(&o), 4096, (int64_t)1 << 40, 1);
        else
            opt_unknown(&o);
    }
    if ((double)bytes > 0.8 * physical_memory_bytes() && physical_memory_bytes() > 0)
        dhsa_cli_die(EXIT_RUN, "--bytes %lld is more than 80%% of this machine's memory", (long long)bytes);

    dhsa_ctx_params p = dhsa_ctx_default_params();
    p.n_threads = threads;
    dhsa_ctx *ctx;
    dhsa_status st = dhsa_ctx_create(&p, &ctx);
    if (st != DHSA_OK) lib_error("dhsa_ctx_create", st);

    double g1 = dhsa_peak_fma_gflops(ctx, 1, seconds);
    double gall = threads > 1 ? dhsa_peak_fma_gflops(ctx, threads, seconds) : g1;
    double bw = dhsa_peak_read_gbps(ctx, threads, (size_t)bytes, seconds);
    if (!(g1 > 0.0) || !(gall > 0.0) || !(bw > 0.0)) {
        fprintf(stderr, "dhsa %s: a measurement failed: %s\n", dhsa_cli_command(), dhsa_last_error());
        dhsa_ctx_free(ctx);
        return EXIT_RUN;
    }
    const char *isa = dhsa_isa_name(dhsa_active_isa());
    if (json) {
        dhsa_cli_json j;
        dhsa_cli_json_init(&j, stdout, 0, "%.6g");
        dhsa_cli_json_object(&j, NULL);
        dhsa_cli_json_str(&j, "isa", isa);
        dhsa_cli_json_num(&j, "gflops_1t", g1);
        dhsa_cli_json_num(&j, "gflops_all", gall);
        dhsa_cli_json_int(&j, "threads", threads);
        dhsa_cli_json_num(&j, "read_gbps", bw);
        dhsa_cli_json_int(&j, "read_bytes", bytes);
        dhsa_cli_json_close(&j);
    } else {
        char b[32];
        printf("dhsa peak: measured in this process (isa %s, %d online CPUs)\n", isa,
               online_cpus());
        printf("  %-28s %9.1f GFLOP/s\n", "fp32 FMA, 1 thread", g1);
        char label[64];
        snprintf(label, sizeof label, "fp32 FMA, %d threads", threads);
        printf("  %-28s %9.1f GFLOP/s\n", label, gall);
        snprintf(label, sizeof label, "memory read, %d thread%s", threads, threads > 1 ? "s" : "");
        printf("  %-28s %9.1f GB/s (%s buffer; GB = 1e9 B)\n", label, bw,
               dhsa_cli_bytes((double)bytes, b, sizeof b));
    }
    dhsa_ctx_free(ctx);
    return 0;
}

/* ------------------------------------------------------ synthetic inputs --- */

/* A host buffer of n elements of one type, contiguous. */
typedef struct {
    void *data;
    dhsa_type type;
    int64_t n;
} host_buf;

static uint64_t mix64(uint64_t x) { /* splitmix64 finaliser */
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* Element i of stream `seed`: uniform in [-1, 1), a function of (seed, i)
 * only, so the inputs do not depend on threads. */
static float synth_value(uint64_t seed, int64_t i) {
    uint64_t r = mix64(seed * 0xD1B54A32D192ED03ull + (uint64_t)i);
    return (float)(r >> 40) * (1.0f / 8388608.0f) - 1.0f;
}

#define FILL_CHUNK ((int64_t)1 << 18)

typedef struct {
    host_buf *buf;
    uint64_t seed; /* 0 = zeros */
} fill_job;

/* Each chunk is written by the thread that runs it: first touch puts the
 * pages where they are used. */
static void fill_task(void *arg, int64_t task, int thread) {
    (void)thread;
    const fill_job *f = arg;
    int64_t lo = task * FILL_CHUNK, hi = lo + FILL_CHUNK < f->buf->n ? lo + FILL_CHUNK : f->buf->n;
    if (f->buf->type == DHSA_Q8_0) { /* whole blocks: FILL_CHUNK and n are multiples of 32 */
        for (int64_t i = lo; i < hi; i += 32) {
            float x[32];
            for (int c = 0; c < 32; c++) x[c] = f->seed ? synth_value(f->seed, i + c) : 0.0f;
            dhsa_q8_0_quantize_row(x, (char *)f->buf->data + dhsa_type_row_bytes(DHSA_Q8_0, i), 32);
        }
        return;
    }
    for (int64_t i = lo; i < hi; i++) {
        float x = f->seed ? synth_value(f->seed, i) : 0.0f;
        switch (f->buf->type) {
        case DHSA_F16: ((uint16_t *)f->buf->data)[i] = dhsa_f32_to_f16(x); break;
        case DHSA_BF16: ((uint16_t *)f->buf->data)[i] = dhsa_f32_to_bf16(x); break;
        default: ((float *)f->buf->data)[i] = x; break;
        }
    }
}

/* Allocates and writes n elements (random for seed != 0, zeros for 0). */
static host_buf host_alloc(dhsa_ctx *ctx, const char *name, dhsa_type t, int64_t n, uint64_t seed) {
    host_buf b = {NULL, t, n};
    size_t bytes = dhsa_type_row_bytes(t, n);
    size_t rounded = (bytes + 63) / 64 * 64;
    b.data = dhsa_buffer_alloc(rounded ? rounded : 64);
    if (!b.data) {
        char s[32];
        dhsa_cli_die(EXIT_RUN, "could not allocate %s for %s", dhsa_cli_bytes((double)bytes, s, sizeof s), name);
    }
    fill_job f = {&b, seed};
    dhsa_parallel_for(ctx, (n + FILL_CHUNK - 1) / FILL_CHUNK, fill_task, &f);
    return b;
}

static float load_elem(const void *data, dhsa_type t, int64_t i) {
    switch (t) {
    case DHSA_F16: return dhsa_f16_to_f32(((const uint16_t *)data)[i]);
    case DHSA_BF16: return dhsa_bf16_to_f32(((const uint16_t *)data)[i]);
    default: return ((const float *)data)[i];
    }
}

/* Element offset of (b, h, l, 0) in a view. */
static int64_t view_off(const dhsa_tensor *t, int64_t b, int64_t h, int64_t l) {
    return b * t->stride[0] + h * t->stride[1] + l * t->stride[2];
}

/* A view of heads [h, h+1) of batch b, rows [l0, l0 + rows). */
static dhsa_tensor sub_view(const dhsa_tensor *t, int64_t b, int64_t h, int64_t l0, int64_t rows) {
    dhsa_tensor s = *t;
    s.data = (char *)t->data + dhsa_type_row_bytes(t->type, view_off(t, b, h, l0));
    s.shape[0] = 1;
    s.shape[1] = 1;
    s.shape[2] = rows;
    return s;
}

/* ------------------------------------------------------ FLOPs and memory --- */

/* Allowed (query, key) pairs of one head, by the library's rule: query i at
 * position q_pos0 + i keeps keys j in [0, Lk) with j <= pos (causal) and
 * j > pos - window (window > 0). Summed row by row: exact, and O(Lq). */
static double allowed_pairs(int64_t Lq, int64_t Lk, int64_t q_pos0, int causal, int64_t window) {
    double pairs = 0.0;
    for (int64_t i = 0; i < Lq; i++) {
        int64_t pos = q_pos0 + i, lo = 0, hi = Lk; /* [lo, hi) */
        if (causal && pos + 1 < hi) hi = pos + 1;
        if (window > 0 && pos - window + 1 > lo) lo = pos - window + 1;
        if (hi > lo) pairs += (double)(hi - lo);
    }
    return pairs;
}

/* FLOPs of one call over `rows` query rows starting at row r0 (every head,
 * every batch), and the rule used (see usage_bench_attn). */
static double attn_flops(const dhsa_attn_desc *a, int64_t r0, int64_t rows, const char **rule) {
    int64_t B = a->q.shape[0], Hq = a->q.shape[1], Lq = a->q.shape[2], Lk = a->k.shape[2];
    double per_pair = 2.0 * (double)(a->q.shape[3] + a->v.shape[3]) * (double)(B * Hq);
    if (!a->causal && a->window <= 0) {
        *rule = "dense";
        return per_pair * (double)rows * (double)Lk;
    }
    if (a->causal && a->window <= 0 && Lq == Lk && a->q_pos0 == 0 && r0 == 0 && rows == Lq) {
        *rule = "causal-half";
        return per_pair * 0.5 * (double)Lq * (double)Lk;
    }
    *rule = "exact-pairs";
    return per_pair * allowed_pairs(rows, Lk, a->q_pos0 + r0, a->causal, a->window);
}

/* --------------------------------------------------- reference check --- */

typedef struct {
    int64_t rows;      /* query rows checked per head */
    double max_abs_err;
    int64_t worst_b, worst_h, worst_row, worst_col;
    float worst_got, worst_want;
    int64_t nonfinite; /* non-finite values in the whole output */
    double ref_seconds; /* time of the reference calls */
    double ref_flops;
} check_result;

/* Compares rows [Lq - rows, Lq) of a->o (already computed) with the
 * reference backend, one (batch, head) call at a time so that the
 * reference's score matrix stays small at any L. The reference runs on its
 * own ctx, freed before returning, so that its memory does not linger. */
static check_result check_against_reference(int threads, const dhsa_attn_desc *a, int64_t rows) {
    check_result r;
    memset(&r, 0, sizeof r);
    int64_t B = a->q.shape[0], Hq = a->q.shape[1], Lq = a->q.shape[2], Lk = a->k.shape[2];
    int64_t Hkv = a->k.shape[1], dv = a->v.shape[3], group = Hq / Hkv;
    if (rows > Lq) rows = Lq;
    r.rows = rows;
    int64_t r0 = Lq - rows;

    dhsa_ctx_params p = dhsa_ctx_default_params();
    p.n_threads = threads;
    dhsa_ctx *rctx;
    dhsa_status st = dhsa_ctx_create(&p, &rctx);
    if (st != DHSA_OK) lib_error("dhsa_ctx_create (reference check)", st);
    float *ref = malloc((size_t)(rows * dv) * sizeof(float)); /* [rows, dv] */
    if (!ref) dhsa_cli_die(EXIT_RUN, "out of memory for the reference check");

    for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < Hq; h++) {
            dhsa_attn_desc s = *a;
            s.q = sub_view(&a->q, b, h, r0, rows);
            s.k = sub_view(&a->k, b, h / group, 0, Lk);
            s.v = sub_view(&a->v, b, h / group, 0, Lk);
            s.o = dhsa_tensor_bhld(ref, DHSA_F32, 1, 1, rows, dv);
            s.lse.data = NULL;
            s.q_pos0 = a->q_pos0 + r0;
            if (a->key_mask) s.key_mask = a->key_mask + b * a->key_mask_batch_stride;
            if (a->key_bias) s.key_bias = a->key_bias + b * a->key_bias_batch_stride;
            if (a->attn_mask.data) { /* slice the dense mask too; size-1 dims broadcast */
                int64_t mb = a->attn_mask.shape[0] > 1 ? b : 0;
                int64_t mh = a->attn_mask.shape[1] > 1 ? h : 0;
                s.attn_mask = sub_view(&a->attn_mask, mb, mh, r0, rows);
            }
            s.backend = DHSA_BACKEND_REFERENCE;
            double need = 64.0 * (double)rows * (double)Lk;
            s.reference_max_bytes = need > (double)((size_t)1 << 30) ? (size_t)need : 0;
            double t0 = dhsa_cli_now();
            st = dhsa_attention(rctx, &s);
            r.ref_seconds += dhsa_cli_now() - t0;
            if (st != DHSA_OK) lib_error("dhsa_attention (reference backend, check slice)", st);

            for (int64_t i = 0; i < rows; i++) {
                int64_t off = view_off(&a->o, b, h, r0 + i);
                for (int64_t c = 0; c < dv; c++) {
                    float got = load_elem(a->o.data, a->o.type, off + c * a->o.stride[3]);
                    float want = ref[i * dv + c];
                    double e = fabs((double)got - (double)want);
                    if (!(e <= r.max_abs_err)) { /* NaN always becomes the worst */
                        r.max_abs_err = isnan(e) ? INFINITY : e;
                        r.worst_b = b;
                        r.worst_h = h;
                        r.worst_row = r0 + i;
                        r.worst_col = c;
                        r.worst_got = got;
                        r.worst_want = want;
                    }
                }
            }
        }
    }
    const char *rule;
    r.ref_flops = attn_flops(a, r0, rows, &rule);
    free(ref);
    dhsa_ctx_free(rctx);
#if defined(__GLIBC__)
    malloc_trim(0); /* hand the reference's freed pages back before RSS is measured */
#endif
    return r;
}

/* Counts NaN/Inf in a contiguous output. */
static int64_t count_nonfinite(const host_buf *o) {
    int64_t bad = 0;
    for (int64_t i = 0; i < o->n; i++) bad += !isfinite(load_elem(o->data, o->type, i));
    return bad;
}

static double tolerance_for(dhsa_type t) {
    /* f32: the tiled kernel against a double-precision oracle. f16/bf16
     * outputs add their own rounding: half an ulp of |o| <= 1. */
    switch (t) {
    case DHSA_F16: return 2e-3;
    case DHSA_BF16: return 8e-3;
    default: return 1e-3;
    }
}

static int parse_dtype(const char *s, dhsa_type *t) {
    if (strcmp(s, "f32") == 0) *t = DHSA_F32;
    else if (strcmp(s, "f16") == 0) *t = DHSA_F16;
    else if (strcmp(s, "bf16") == 0) *t = DHSA_BF16;
    else return 0;
    return 1;
}

/* ----------------------------------------------------------- bench attn --- */

typedef struct {
    int64_t L, Lq, batch, heads, kv_heads, dim, dv, window;
    int causal, threads, runs, json, corrupt, isa; /* isa: -1 = as detected */
    double softcap, peak_seconds;
    int64_t peak_bytes;
    dhsa_type dtype, kv_dtype; /* kv_dtype: K and V (-1 until set: --dtype) */
    dhsa_backend backend;
} bench_opts;

static bench_opts bench_parse(int argc, char **argv) {
    bench_opts b;
    memset(&b, 0, sizeof b);
    b.Lq = -1;
    b.batch = 1;
    b.kv_heads = -1;
    b.dv = -1;
    b.threads = online_cpus();
    b.runs = 5;
    b.dtype = DHSA_F32;
    b.kv_dtype = (dhsa_type)-1;
    b.backend = DHSA_BACKEND_TILED;
    b.peak_seconds = 0.3;
    b.isa = -1;
    const int64_t max_len = (int64_t)1 << 34, max_dim = 1 << 16;
    opt_scan o = opt_begin(argc, argv, 3);
    while (opt_next(&o)) {
        if (opt_is(&o, "--L"))
            b.L = dhsa_cli_int("--L", opt_value(&o), 1, max_len, 1);
        else if (opt_is(&o, "--Lq"))
            b.Lq = dhsa_cli_int("--Lq", opt_value(&o), 1, max_len, 1);
        else if (opt_is(&o, "--batch"))
            b.batch = dhsa_cli_int("--batch", opt_value(&o), 1, 1 << 20, 1);
        else if (opt_is(&o, "--heads"))
            b.heads = dhsa_cli_int("--heads", opt_value(&o), 1, max_dim, 0);
        else if (opt_is(&o, "--kv-heads"))
            b.kv_heads = dhsa_cli_int("--kv-heads", opt_value(&o), 1, max_dim, 0);
        else if (opt_is(&o, "--dim"))
            b.dim = dhsa_cli_int("--dim", opt_value(&o), 1, max_dim, 0);
        else if (opt_is(&o, "--dv"))
            b.dv = dhsa_cli_int("--dv", opt_value(&o), 1, max_dim, 0);
        else if (opt_is(&o, "--causal"))
            b.causal = opt_flag(&o);
        else if (opt_is(&o, "--window"))
            b.window = dhsa_cli_int("--window", opt_value(&o), 0, max_len, 1);
        else if (opt_is(&o, "--softcap"))
            b.softcap = dhsa_cli_real("--softcap", opt_value(&o), 0.0, 1e6);
        else if (opt_is(&o, "--dtype")) {
            const char *v = opt_value(&o);
            if (!parse_dtype(v, &b.dtype))
                dhsa_cli_die(EXIT_USAGE, "--dtype: \"%s\" is not f32, f16 or bf16", v);
        } else if (opt_is(&o, "--kv-dtype")) {
            const char *v = opt_value(&o);
            if (strcmp(v, "q8_0") == 0) b.kv_dtype = DHSA_Q8_0;
            else if (!parse_dtype(v, &b.kv_dtype))
                dhsa_cli_die(EXIT_USAGE, "--kv-dtype: \"%s\" is not f32, f16, bf16 or q8_0", v);
        } else if (opt_is(&o, "--threads"))
            b.threads = dhsa_cli_threads("--threads", opt_value(&o));
        else if (opt_is(&o, "--backend")) {
            const char *v = opt_value(&o);
            if (strcmp(v, "tiled") == 0) b.backend = DHSA_BACKEND_TILED;
            else if (strcmp(v, "reference") == 0) b.backend = DHSA_BACKEND_REFERENCE;
            else dhsa_cli_die(EXIT_USAGE, "--backend: \"%s\" is not tiled or reference", v);
        } else if (opt_is(&o, "--isa")) {
            const char *v = opt_value(&o);
            if (strcmp(v, "scalar") == 0) b.isa = DHSA_ISA_SCALAR;
            else if (strcmp(v, "avx2") == 0) b.isa = DHSA_ISA_AVX2;
            else if (strcmp(v, "avx512") == 0) b.isa = DHSA_ISA_AVX512;
            else dhsa_cli_die(EXIT_USAGE, "--isa: \"%s\" is not scalar, avx2 or avx512", v);
        } else if (opt_is(&o, "--runs"))
            b.runs = (int)dhsa_cli_int("--runs", opt_value(&o), 3, 100000, 0);
        else if (opt_is(&o, "--json"))
            b.json = opt_flag(&o);
        /* Hidden, for tests: a shorter peak measurement, a smaller read
         * bandwidth buffer (decode), a deliberately wrong output element to
         * prove that the correctness gate can fail. */
        else if (opt_is(&o, "--peak-seconds"))
            b.peak_seconds = dhsa_cli_real("--peak-seconds", opt_value(&o), 0.001, 60.0);
        else if (opt_is(&o, "--peak-bytes"))
            b.peak_bytes = dhsa_cli_int("--peak-bytes", opt_value(&o), 4096, (int64_t)1 << 40, 1);
        else if (opt_is(&o, "--corrupt"))
            b.corrupt = opt_flag(&o);
        else
            opt_unknown(&o);
    }
    if (!b.L) dhsa_cli_die(EXIT_USAGE, "--L is required");
    if (!b.heads) dhsa_cli_die(EXIT_USAGE, "--heads is required");
    if (!b.dim) dhsa_cli_die(EXIT_USAGE, "--dim is required");
    if (b.Lq < 0) b.Lq = b.L;
    if (b.kv_heads < 0) b.kv_heads = b.heads;
    if (b.dv < 0) b.dv = b.dim;
    if ((int)b.kv_dtype < 0) b.kv_dtype = b.dtype;
    if (b.kv_dtype == DHSA_Q8_0 && (b.dim % 32 || b.dv % 32))
        dhsa_cli_die(EXIT_USAGE, "--kv-dtype q8_0 stores rows in blocks of 32: --dim %lld and --dv %lld must be "
                     "multiples of 32", (long long)b.dim, (long long)b.dv);
    if (b.heads % b.kv_heads)
        dhsa_cli_die(EXIT_USAGE, "--heads %lld is not a multiple of --kv-heads %lld", (long long)b.heads,
                    (long long)b.kv_heads);
    return b;
}

/* Elements of a [B, H, L, D] tensor; overflow is a usage error. */
static int64_t elems4(int64_t B, int64_t H, int64_t L, int64_t D) {
    int64_t f[4] = {B, H, L, D}, n = 1;
    for (int i = 0; i < 4; i++) {
        if (n > INT64_MAX / f[i]) dhsa_cli_die(EXIT_USAGE, "a Q/K/V/O size overflows 64 bits");
        n *= f[i];
    }
    return n;
}

static int cmd_bench_attn(int argc, char **argv) {
    cur_usage = usage_bench_attn;
    dhsa_cli_set_command("bench attn", cur_usage);
    bench_opts o = bench_parse(argc, argv);
    if (o.isa >= 0) {
        dhsa_status ist = dhsa_set_isa((dhsa_isa)o.isa);
        if (ist != DHSA_OK) lib_error("dhsa_set_isa", ist);
    }
    int64_t nq = elems4(o.batch, o.heads, o.Lq, o.dim);
    int64_t nk = elems4(o.batch, o.kv_heads, o.L, o.dim);
    int64_t nv = elems4(o.batch, o.kv_heads, o.L, o.dv);
    int64_t no = elems4(o.batch, o.heads, o.Lq, o.dv);
    size_t es = dhsa_type_size(o.dtype);
    double qkvo = (double)es * ((double)nq + (double)no) + (double)dhsa_type_row_bytes(o.kv_dtype, nk) +
                  (double)dhsa_type_row_bytes(o.kv_dtype, nv);
    char s1[32], s2[32], s3[32];
    double phys = physical_memory_bytes();
    if (phys > 0 && qkvo > 0.8 * phys)
        dhsa_cli_die(EXIT_RUN, "Q, K, V and O need %s, more than 80%% of this machine's %s",
                  dhsa_cli_bytes(qkvo, s1, sizeof s1), dhsa_cli_bytes(phys, s2, sizeof s2));

    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = o.threads;
    dhsa_ctx *ctx;
    dhsa_status st = dhsa_ctx_create(&cp, &ctx);
    if (st != DHSA_OK) lib_error("dhsa_ctx_create", st);

    /* Q [B, Hq, Lq, d], K [B, Hkv, L, d], V [B, Hkv, L, dv], O [B, Hq, Lq, dv] */
    host_buf q = host_alloc(ctx, "Q", o.dtype, nq, 1);
    host_buf k = host_alloc(ctx, "K", o.kv_dtype, nk, 2);
    host_buf v = host_alloc(ctx, "V", o.kv_dtype, nv, 3);
    host_buf out = host_alloc(ctx, "O", o.dtype, no, 0);
    size_t rss_inputs = dhsa_proc_rss();

    dhsa_attn_desc a = dhsa_attn_default_desc();
    a.q = dhsa_tensor_bhld(q.data, o.dtype, o.batch, o.heads, o.Lq, o.dim);
    a.k = dhsa_tensor_bhld(k.data, o.kv_dtype, o.batch, o.kv_heads, o.L, o.dim);
    a.v = dhsa_tensor_bhld(v.data, o.kv_dtype, o.batch, o.kv_heads, o.L, o.dv);
    a.o = dhsa_tensor_bhld(out.data, o.dtype, o.batch, o.heads, o.Lq, o.dv);
    a.causal = o.causal;
    a.window = o.window;
    a.softcap = (float)o.softcap;
    a.q_pos0 = o.Lq <= o.L ? o.L - o.Lq : 0; /* the queries are the last Lq positions */
    a.backend = o.backend;

    size_t ws = 0;
    st = dhsa_attn_workspace_size(ctx, &a, &ws);
    if (st != DHSA_OK) lib_error("dhsa_attn_workspace_size", st);

    /* 1. Correctness first: one full call, then the reference on a slice. */
    st = dhsa_attention(ctx, &a);
    if (st != DHSA_OK) lib_error("dhsa_attention", st);
    if (o.corrupt) { /* test hook: one wrong element in the checked rows */
        int64_t i = view_off(&a.o, 0, 0, o.Lq - 1);
        float x = load_elem(out.data, o.dtype, i) + 1.0f;
        if (o.dtype == DHSA_F32) ((float *)out.data)[i] = x;
        else if (o.dtype == DHSA_F16) ((uint16_t *)out.data)[i] = dhsa_f32_to_f16(x);
        else ((uint16_t *)out.data)[i] = dhsa_f32_to_bf16(x);
    }
    check_result chk = check_against_reference(o.threads, &a, 32);
    chk.nonfinite = count_nonfinite(&out);
    double tol = tolerance_for(o.dtype);
    if (chk.nonfinite || !(chk.max_abs_err <= tol)) {
        fprintf(stderr,
                "dhsa %s: result check FAILED: max_abs_err %.3g (tolerance %.3g), worst at batch "
                "%lld, head %lld, query row %lld, column %lld: got %.9g, reference %.9g; %lld "
                "non-finite outputs. No timing is reported for a wrong result.\n",
                dhsa_cli_command(), chk.max_abs_err, tol, (long long)chk.worst_b, (long long)chk.worst_h,
                (long long)chk.worst_row, (long long)chk.worst_col, (double)chk.worst_got,
                (double)chk.worst_want, (long long)chk.nonfinite);
        dhsa_ctx_free(ctx);
        return EXIT_RUN;
    }

    /* The machine, measured in this process with the same threads, before
     * and after the timed calls: on a shared machine the larger of the two
     * keeps the peak fraction conservative. */
    double peak = dhsa_peak_fma_gflops(ctx, o.threads, 0.5 * o.peak_seconds);
    if (!(peak > 0.0)) dhsa_cli_die(EXIT_RUN, "measuring the FMA peak failed: %s", dhsa_last_error());

    /* 2. Timing: the peak RSS covers the warm-up and the timed calls. */
    int rss_reset = dhsa_proc_reset_peak_rss() == DHSA_OK;
    dhsa_ctx_reset_peak(ctx);
    st = dhsa_attention(ctx, &a);
    if (st != DHSA_OK) lib_error("dhsa_attention (warm-up)", st);
    /* Decode shapes are memory-bound: each timed call is followed by a plain
     * read of the same K and V buffers with the same threads, and the
     * fraction reported is the median of the per-run ratios, so a machine
     * whose bandwidth drifts during the run moves both sides alike. */
    int decode = o.Lq <= 16;
    double *t = malloc((size_t)o.runs * sizeof *t), *tr = malloc((size_t)o.runs * sizeof *tr),
           *ratio = malloc((size_t)o.runs * sizeof *ratio);
    if (!t || !tr || !ratio) dhsa_cli_die(EXIT_RUN, "out of memory");
    const float *kv_bufs[2] = {(const float *)k.data, (const float *)v.data};
    size_t kv_floats[2] = {dhsa_type_row_bytes(o.kv_dtype, nk) / 4, dhsa_type_row_bytes(o.kv_dtype, nv) / 4};
    for (int r = 0; r < o.runs; r++) {
        double t0 = dhsa_cli_now();
        st = dhsa_attention(ctx, &a);
        t[r] = dhsa_cli_now() - t0;
        if (st != DHSA_OK) lib_error("dhsa_attention (timed run)", st);
        if (decode) {
            tr[r] = dhsa_peak_read_buffers_s(ctx, o.threads, kv_bufs, kv_floats, 2);
            if (!(tr[r] > 0.0)) dhsa_cli_die(EXIT_RUN, "reading K/V for the baseline failed: %s", dhsa_last_error());
            ratio[r] = tr[r] / t[r];
        }
    }
    size_t peak_rss = peak_rss_now();
    dhsa_mem_stats ms = dhsa_ctx_mem_stats(ctx);
    double med = dhsa_cli_median(t, o.runs); /* sorts t */
    double tmin = t[0];
    free(t);

    double peak_after = dhsa_peak_fma_gflops(ctx, o.threads, 0.5 * o.peak_seconds);
    if (!(peak_after > 0.0)) dhsa_cli_die(EXIT_RUN, "measuring the FMA peak failed: %s", dhsa_last_error());
    if (peak_after > peak) peak = peak_after;
    double read_bw = 0.0, kv_read_bw = 0.0, bw_fraction = 0.0;
    if (decode) {
        read_bw = dhsa_peak_read_gbps(ctx, o.threads, (size_t)o.peak_bytes, o.peak_seconds);
        if (!(read_bw > 0.0)) dhsa_cli_die(EXIT_RUN, "measuring read bandwidth failed: %s", dhsa_last_error());
        double tr_med = dhsa_cli_median(tr, o.runs);
        kv_read_bw = (double)(dhsa_type_row_bytes(o.kv_dtype, nk) + dhsa_type_row_bytes(o.kv_dtype, nv)) / tr_med * 1e-9;
        bw_fraction = dhsa_cli_median(ratio, o.runs);
    }
    free(tr);
    free(ratio);

    const char *rule;
    double flops = attn_flops(&a, 0, o.Lq, &rule);
    double gflops = flops / med * 1e-9;
    double kv_bytes = (double)(dhsa_type_row_bytes(o.kv_dtype, nk) + dhsa_type_row_bytes(o.kv_dtype, nv));
    double kv_gbps = kv_bytes / med * 1e-9;
    double ref_gflops = chk.ref_seconds > 0 ? chk.ref_flops / chk.ref_seconds * 1e-9 : 0.0;
    double extra_rss = (double)peak_rss - (double)rss_inputs;
    const char *isa = dhsa_isa_name(dhsa_active_isa());
    const char *backend = dhsa_backend_name(dhsa_attn_resolve_backend(o.backend));

    if (o.json) {
        dhsa_cli_json j;
        dhsa_cli_json_init(&j, stdout, 0, "%.6g");
        dhsa_cli_json_object(&j, NULL);
        dhsa_cli_json_int(&j, "L", o.L);
        dhsa_cli_json_int(&j, "Lq", o.Lq);
        dhsa_cli_json_int(&j, "batch", o.batch);
        dhsa_cli_json_int(&j, "heads", o.heads);
        dhsa_cli_json_int(&j, "kv_heads", o.kv_heads);
        dhsa_cli_json_int(&j, "dim", o.dim);
        dhsa_cli_json_int(&j, "dv", o.dv);
        dhsa_cli_json_bool(&j, "causal", o.causal);
        dhsa_cli_json_int(&j, "window", o.window);
        dhsa_cli_json_num(&j, "softcap", o.softcap);
        dhsa_cli_json_int(&j, "q_pos0", a.q_pos0);
        dhsa_cli_json_str(&j, "dtype", dhsa_type_name(o.dtype));
        dhsa_cli_json_str(&j, "kv_dtype", dhsa_type_name(o.kv_dtype));
        dhsa_cli_json_int(&j, "threads", o.threads);
        dhsa_cli_json_str(&j, "isa", isa);
        dhsa_cli_json_str(&j, "backend", backend);
        dhsa_cli_json_int(&j, "runs", o.runs);
        dhsa_cli_json_num(&j, "median_ms", med * 1e3);
        dhsa_cli_json_num(&j, "min_ms", tmin * 1e3);
        dhsa_cli_json_num(&j, "flops", flops);
        dhsa_cli_json_str(&j, "flops_rule", rule);
        dhsa_cli_json_num(&j, "gflops", gflops);
        dhsa_cli_json_num(&j, "peak_gflops", peak);
        dhsa_cli_json_num(&j, "peak_fraction", gflops / peak);
        dhsa_cli_json_num(&j, "kv_gbps", kv_gbps);
        if (decode) {
            dhsa_cli_json_num(&j, "read_gbps", read_bw);
            dhsa_cli_json_num(&j, "kv_plain_read_gbps", kv_read_bw);
            dhsa_cli_json_num(&j, "bandwidth_fraction", bw_fraction);
        }
        dhsa_cli_json_int(&j, "workspace_bytes", (int64_t)ws);
        dhsa_cli_json_int(&j, "ctx_peak_bytes", (int64_t)ms.peak);
        dhsa_cli_json_num(&j, "qkvo_bytes", qkvo);
        dhsa_cli_json_int(&j, "rss_inputs_bytes", (int64_t)rss_inputs);
        dhsa_cli_json_int(&j, "peak_rss_bytes", (int64_t)peak_rss);
        dhsa_cli_json_num(&j, "extra_rss_bytes", extra_rss);
        dhsa_cli_json_bool(&j, "peak_rss_reset", rss_reset);
        dhsa_cli_json_num(&j, "max_abs_err", chk.max_abs_err);
        dhsa_cli_json_num(&j, "tolerance", tol);
        dhsa_cli_json_int(&j, "checked_rows", chk.rows);
        dhsa_cli_json_num(&j, "reference_gflops", ref_gflops);
        dhsa_cli_json_close(&j);
    } else {
        printf("dhsa bench attn: %s backend, isa %s, %d thread%s\n", backend, isa, o.threads,
               o.threads > 1 ? "s" : "");
        printf("  %-14s B=%lld Hq=%lld Hkv=%lld Lq=%lld Lk=%lld d=%lld dv=%lld %s", "shape",
               (long long)o.batch, (long long)o.heads, (long long)o.kv_heads, (long long)o.Lq,
               (long long)o.L, (long long)o.dim, (long long)o.dv, dhsa_type_name(o.dtype));
        if (o.kv_dtype != o.dtype) printf(", K/V %s", dhsa_type_name(o.kv_dtype));
        if (o.causal) printf(", causal");
        if (o.window) printf(", window %lld", (long long)o.window);
        if (o.softcap > 0) printf(", softcap %g", o.softcap);
        if (a.q_pos0) printf(", q_pos0 %lld", (long long)a.q_pos0);
        printf("\n");
        printf("  %-14s max_abs_err %.3g (tolerance %.0e), last %lld query row%s of every head "
               "vs the reference backend\n",
               "check", chk.max_abs_err, tol, (long long)chk.rows, chk.rows > 1 ? "s" : "");
        printf("  %-14s median %.3f ms, min %.3f ms (%d runs after 1 warm-up)\n", "time", med * 1e3,
               tmin * 1e3, o.runs);
        printf("  %-14s %.1f GFLOP/s (%.4g GFLOP, %s)\n", "throughput", gflops, flops * 1e-9, rule);
        printf("  %-14s %.1f GFLOP/s measured fp32 FMA peak, %d thread%s: %.1f%% of peak\n", "peak",
               peak, o.threads, o.threads > 1 ? "s" : "", 100.0 * gflops / peak);
        if (decode)
            printf("  %-14s K/V read at %.2f GB/s; a plain read of the same K/V after each call: "
                   "%.2f GB/s; median ratio %.1f%% (1 GiB read bandwidth %.2f GB/s)\n",
                   "decode", kv_gbps, kv_read_bw, 100.0 * bw_fraction, read_bw);
        if (chk.ref_flops == 0)
            printf("  %-14s the checked rows have no allowed key: the check only saw zeros\n",
                   "note");
        if (ref_gflops > 0)
            printf("  %-14s reference backend (double, materialising) on the checked rows: %.2f "
                   "GFLOP/s; this run is %.1fx that\n",
                   "baseline", ref_gflops, gflops / ref_gflops);
        printf("  %-14s %s (dhsa_attn_workspace_size), ctx peak %s\n", "workspace",
               dhsa_cli_bytes((double)ws, s1, sizeof s1), dhsa_cli_bytes((double)ms.peak, s2, sizeof s2));
        printf("  %-14s peak RSS %s; Q/K/V/O %s; %s above the RSS after allocating inputs%s\n",
               "memory", dhsa_cli_bytes((double)peak_rss, s1, sizeof s1),
               dhsa_cli_bytes(qkvo, s2, sizeof s2),
               dhsa_cli_bytes(extra_rss > 0 ? extra_rss : 0.0, s3, sizeof s3),
               rss_reset ? "" : " (peak RSS could not be reset: it covers the whole process)");
    }
    dhsa_buffer_free(q.data);
    dhsa_buffer_free(k.data);
    dhsa_buffer_free(v.data);
    dhsa_buffer_free(out.data);
    dhsa_ctx_free(ctx);
    return 0;
}

static int cmd_bench(int argc, char **argv) {
    cur_usage = usage_bench;
    dhsa_cli_set_command("bench", cur_usage);
    if (argc < 3) dhsa_cli_die(EXIT_USAGE, "which benchmark? (attn, sparse, decode, matmul, model)");
    if (strcmp(argv[2], "--help") == 0 || strcmp(argv[2], "-h") == 0) {
        fputs(usage_bench, stdout);
        return 0;
    }
    if (strcmp(argv[2], "attn") == 0) return cmd_bench_attn(argc, argv);
    if (strcmp(argv[2], "sparse") == 0) return dhsa_cli_bench_sparse(argc, argv);
    if (strcmp(argv[2], "decode") == 0) return dhsa_cli_bench_decode(argc, argv);
    if (strcmp(argv[2], "model") == 0) return dhsa_cli_bench_model(argc, argv);
    /* bench matmul: the weight products of the model runner, per weight type */
    if (strcmp(argv[2], "matmul") == 0) return dhsa_cli_bench_matmul(argc, argv);
    dhsa_cli_die(EXIT_USAGE, "unknown benchmark \"%s\" (known: attn, sparse, decode, matmul, model)", argv[2]);
    return EXIT_USAGE;
}

/* ----------------------------------------------------------------- demo --- */

static int cmd_demo(int argc, char **argv) {
    cur_usage = usage_demo;
    dhsa_cli_set_command("demo", cur_usage);
    int64_t L = 8192, model_L = 4096;
    int threads = online_cpus();
    const char *model = NULL;
    opt_scan op = opt_begin(argc, argv, 2);
    while (opt_next(&op)) {
        if (opt_is(&op, "--L")) L = dhsa_cli_int("--L", opt_value(&op), 64, (int64_t)1 << 20, 1);
        else if (opt_is(&op, "-m")) model = dhsa_cli_model_arg(opt_value(&op));
        else if (opt_is(&op, "--model-L")) model_L = dhsa_cli_int("--model-L", opt_value(&op), 256, (int64_t)1 << 20, 1);
        else if (opt_is(&op, "--threads"))
            threads = dhsa_cli_threads("--threads", opt_value(&op));
        else opt_unknown(&op);
    }
    const int64_t B = 2, Hq = 8, Hkv = 2, d = 128, pad = L / 4;
    double need = 4.0 * (double)(B * L * d) * (double)(2 * Hq + 2 * Hkv);
    double phys = physical_memory_bytes();
    char s1[32], s2[32], s3[32];
    if (phys > 0 && need > 0.8 * phys)
        dhsa_cli_die(EXIT_RUN, "--L %lld needs %s for Q, K, V and O, more than 80%% of this machine's %s",
                  (long long)L, dhsa_cli_bytes(need, s1, sizeof s1), dhsa_cli_bytes(phys, s2, sizeof s2));

    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = threads;
    dhsa_ctx *ctx;
    dhsa_status st = dhsa_ctx_create(&cp, &ctx);
    if (st != DHSA_OK) lib_error("dhsa_ctx_create", st);

    /* Q [B, Hq, L, d], K/V [B, Hkv, L, d], O [B, Hq, L, d]; key_mask [B, L] */
    host_buf q = host_alloc(ctx, "Q", DHSA_F32, B * Hq * L * d, 11);
    host_buf k = host_alloc(ctx, "K", DHSA_F32, B * Hkv * L * d, 12);
    host_buf v = host_alloc(ctx, "V", DHSA_F32, B * Hkv * L * d, 13);
    host_buf out = host_alloc(ctx, "O", DHSA_F32, B * Hq * L * d, 0);
    uint8_t *mask = calloc((size_t)(B * L), 1);
    if (!mask) dhsa_cli_die(EXIT_RUN, "out of memory");
    for (int64_t j = 0; j < pad; j++) mask[L + j] = 1; /* sequence 1: left padding */
    double qkvo = 4.0 * (double)(q.n + k.n + v.n + out.n);
    size_t rss_inputs = dhsa_proc_rss();

    dhsa_attn_desc a = dhsa_attn_default_desc();
    a.q = dhsa_tensor_bhld(q.data, DHSA_F32, B, Hq, L, d);
    a.k = dhsa_tensor_bhld(k.data, DHSA_F32, B, Hkv, L, d);
    a.v = dhsa_tensor_bhld(v.data, DHSA_F32, B, Hkv, L, d);
    a.o = dhsa_tensor_bhld(out.data, DHSA_F32, B, Hq, L, d);
    a.causal = 1;
    a.key_mask = mask;
    a.key_mask_batch_stride = L;
    a.key_mask_polarity = DHSA_MASK_TRUE_IGNORES;
    a.backend = DHSA_BACKEND_TILED;

    /* The mask polarity rule first: a mask without a polarity is refused
     * before any work (one query row, in case it were not). */
    dhsa_attn_desc bad = a;
    bad.q.shape[2] = 1;
    bad.o.shape[2] = 1;
    bad.key_mask_polarity = DHSA_MASK_NO_POLARITY;
    dhsa_status bad_st = dhsa_attention(ctx, &bad);
    char bad_msg[512];
    snprintf(bad_msg, sizeof bad_msg, "%s", dhsa_last_error());

    size_t ws = 0;
    st = dhsa_attn_workspace_size(ctx, &a, &ws);
    if (st != DHSA_OK) lib_error("dhsa_attn_workspace_size", st);
    int rss_reset = dhsa_proc_reset_peak_rss() == DHSA_OK;
    double t0 = dhsa_cli_now();
    st = dhsa_attention(ctx, &a);
    double secs = dhsa_cli_now() - t0;
    if (st != DHSA_OK) lib_error("dhsa_attention", st);
    size_t peak_rss = peak_rss_now();

    /* Padding rows of sequence 1: queries before the first real key have no
     * allowed key (causal + padding) and must be exactly 0. */
    int64_t zero_rows_bad = 0;
    for (int64_t h = 0; h < Hq; h++)
        for (int64_t i = 0; i < pad; i++) {
            const float *row = (const float *)out.data + view_off(&a.o, 1, h, i);
            for (int64_t c = 0; c < d; c++) zero_rows_bad += row[c] != 0.0f;
        }
    check_result chk = check_against_reference(threads, &a, 32);
    chk.nonfinite = count_nonfinite(&out);
    double tol = tolerance_for(DHSA_F32);

    /* Causal pairs, half-square convention, without the padded keys: L^2/2
     * for sequence 0, (L - pad)^2/2 for sequence 1. */
    double flops = 2.0 * (double)(2 * d) * (double)Hq * 0.5 *
                   ((double)L * (double)L + (double)(L - pad) * (double)(L - pad));
    const char *rule = "causal-half, padded keys not counted";
    printf("dhsa demo: tiled attention on synthetic data (isa %s, %d thread%s)\n",
           dhsa_isa_name(dhsa_active_isa()), threads, threads > 1 ? "s" : "");
    printf("  %-13s B=%lld, L=%lld, %lld query heads on %lld K/V heads (GQA), d=%lld, f32, "
           "causal;\n  %-13s sequence 1 left-padded by %lld keys (key_mask, TRUE_IGNORES)\n",
           "shape", (long long)B, (long long)L, (long long)Hq, (long long)Hkv, (long long)d, "",
           (long long)pad);
    printf("  %-13s %.3f s, %.1f GFLOP/s (%.4g GFLOP, %s)\n", "time", secs,
           flops / secs * 1e-9, flops * 1e-9, rule);
    printf("  %-13s peak RSS %s: inputs and output %s, %s more during the call%s\n", "memory",
           dhsa_cli_bytes((double)peak_rss, s1, sizeof s1), dhsa_cli_bytes(qkvo, s2, sizeof s2),
           dhsa_cli_bytes(peak_rss > rss_inputs ? (double)(peak_rss - rss_inputs) : 0.0, s3, sizeof s3),
           rss_reset ? "" : " (peak RSS not resettable here)");
    printf("  %-13s max_abs_err %.3g vs the reference backend, last %lld query rows of every "
           "head (tolerance %.0e)\n",
           "check", chk.max_abs_err, (long long)chk.rows, tol);
    printf("  %-13s %lld rows with no allowed key (padding): %s\n", "padding",
           (long long)(pad * Hq), zero_rows_bad ? "NOT all zero" : "all exactly 0, no NaN");

    /* Memory as L grows: the exact workspace (queried, nothing is run or
     * allocated) against what a materialising attention holds. */
    printf("\n  %-8s %-20s %-24s %s\n", "L", "tiled workspace", "scores B*H*L^2*4 B",
           "PyTorch MHA fast path*");
    for (int64_t m = 1; m <= 16; m *= 4) {
        int64_t Lm = L * m;
        dhsa_attn_desc big = a; /* same buffers: a size query reads no data */
        big.q = dhsa_tensor_bhld(q.data, DHSA_F32, B, Hq, Lm, d);
        big.k = dhsa_tensor_bhld(k.data, DHSA_F32, B, Hkv, Lm, d);
        big.v = dhsa_tensor_bhld(v.data, DHSA_F32, B, Hkv, Lm, d);
        big.o = dhsa_tensor_bhld(out.data, DHSA_F32, B, Hq, Lm, d);
        big.key_mask_batch_stride = Lm;
        size_t wsm = 0;
        if (dhsa_attn_workspace_size(ctx, &big, &wsm) != DHSA_OK) break;
        double scores = (double)B * (double)Hq * (double)Lm * (double)Lm * 4.0;
        double torch = 130.0 * (double)Lm * (double)Lm;
        char sl[32];
        snprintf(sl, sizeof sl, "%lld", (long long)Lm);
        printf("  %-8s %-20s %-24s %s\n", sl, dhsa_cli_bytes((double)wsm, s1, sizeof s1),
               dhsa_cli_bytes(scores, s2, sizeof s2), dhsa_cli_bytes(torch, s3, sizeof s3));
    }
    printf("  * measured 130 B per L^2 of extra peak memory (PyTorch 2.15\n"
           "    nn.MultiheadAttention with key_padding_mask in inference, E=1024, 16 heads,\n"
           "    fp32, B=1; docs/notes/results-attention.md): reference only\n");

    printf("\n  %-13s key_mask with DHSA_MASK_NO_POLARITY -> %s\n", "mask polarity",
           bad_st == DHSA_OK ? "ACCEPTED (it must be refused)" : dhsa_status_str(bad_st));
    if (bad_st != DHSA_OK) printf("  %-13s \"%s\"\n", "", bad_msg);

    int ok = bad_st != DHSA_OK && !zero_rows_bad && !chk.nonfinite && chk.max_abs_err <= tol;
    if (!ok) fprintf(stderr, "dhsa %s: FAILED (see above)\n", dhsa_cli_command());
    free(mask);
    dhsa_buffer_free(q.data);
    dhsa_buffer_free(k.data);
    dhsa_buffer_free(v.data);
    dhsa_buffer_free(out.data);
    dhsa_ctx_free(ctx);
    if (ok) {
        printf("\n");
        fflush(stdout);
        ok = dhsa_cli_sparse_demo(L, threads) == 0;
    }
    if (ok) {
        char msg[512];
        if (!model) model = dhsa_cli_default_model(msg, sizeof msg);
        printf("\n");
        fflush(stdout);
        if (model) ok = dhsa_cli_model_demo(model, model_L, threads) == 0;
        else dhsa_cli_die(EXIT_RUN, "%s", msg);
    }
    return ok ? 0 : EXIT_RUN;
}

/* ----------------------------------------------------------------- main --- */

static const char *usage_of(const char *cmd) {
    if (strcmp(cmd, "peak") == 0) return usage_peak;
    if (strcmp(cmd, "bench") == 0) return usage_bench;
    if (strcmp(cmd, "demo") == 0) return usage_demo;
    if (strcmp(cmd, "memprobe") == 0) return dhsa_cli_memprobe_usage;
    if (strcmp(cmd, "run") == 0 || strcmp(cmd, "plan") == 0) return dhsa_cli_run_usage;
    if (strcmp(cmd, "gen-model") == 0) return dhsa_cli_gen_model_usage;
    if (strcmp(cmd, "train-boundary") == 0) return dhsa_cli_train_boundary_usage;
    if (strcmp(cmd, "convert") == 0) return dhsa_cli_convert_usage;
    if (strcmp(cmd, "inspect") == 0) return dhsa_cli_inspect_usage;
    if (strcmp(cmd, "tokenize") == 0) return dhsa_cli_tokenize_usage;
    if (strcmp(cmd, "eval") == 0) return dhsa_cli_eval_usage;
    if (strcmp(cmd, "serve") == 0) return dhsa_cli_serve_usage;
    if (strcmp(cmd, "pull") == 0) return dhsa_cli_pull_usage;
    if (strcmp(cmd, "chat") == 0) return dhsa_cli_chat_usage;
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fputs(usage_main, stderr);
        return EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        fputs(usage_main, stdout);
        return 0;
    }
    if (strcmp(cmd, "--version") == 0) {
        printf("dhsa %s\n", DHSA_VERSION);
        return 0;
    }
    if (strcmp(cmd, "help") == 0) {
        if (argc < 3) {
            fputs(usage_main, stdout);
            return 0;
        }
        const char *u = usage_of(argv[2]);
        if (u == usage_bench && argc > 3) { /* dhsa help bench NAME */
            const char *b = argv[3];
            u = strcmp(b, "attn") == 0     ? usage_bench_attn
                : strcmp(b, "sparse") == 0 ? dhsa_cli_bench_sparse_usage
                : strcmp(b, "decode") == 0 ? dhsa_cli_bench_decode_usage
                : strcmp(b, "matmul") == 0 ? dhsa_cli_bench_matmul_usage
                : strcmp(b, "model") == 0  ? dhsa_cli_bench_model_usage
                                           : NULL;
            if (!u) dhsa_cli_die(EXIT_USAGE, "no benchmark \"%s\" (attn, sparse, decode, matmul, model)", b);
        }
        if (!u) dhsa_cli_die(EXIT_USAGE, "no command \"%s\"", argv[2]);
        fputs(u, stdout);
        if (u == dhsa_cli_eval_usage) fputs(dhsa_cli_eval_usage_tasks, stdout);
        if (u == dhsa_cli_run_usage) fputs(dhsa_cli_run_cache_usage, stdout);
        if (u == dhsa_cli_run_usage || u == dhsa_cli_bench_model_usage) fputs(dhsa_cli_dist_usage, stdout);
        return 0;
    }
    if (strcmp(cmd, "peak") == 0) return cmd_peak(argc, argv);
    if (strcmp(cmd, "bench") == 0) return cmd_bench(argc, argv);
    if (strcmp(cmd, "demo") == 0) return cmd_demo(argc, argv);
    if (strcmp(cmd, "memprobe") == 0) return dhsa_cli_memprobe(argc, argv);
    if (strcmp(cmd, "run") == 0) return dhsa_cli_run(argc, argv);
    if (strcmp(cmd, "plan") == 0) return dhsa_cli_plan(argc, argv);
    if (strcmp(cmd, "gen-model") == 0) return dhsa_cli_gen_model(argc, argv);
    if (strcmp(cmd, "train-boundary") == 0) return dhsa_cli_train_boundary(argc, argv);
    if (strcmp(cmd, "convert") == 0) return dhsa_cli_convert(argc, argv);
    if (strcmp(cmd, "inspect") == 0) return dhsa_cli_inspect(argc, argv);
    if (strcmp(cmd, "tokenize") == 0) return dhsa_cli_tokenize(argc, argv);
    if (strcmp(cmd, "eval") == 0) return dhsa_cli_eval(argc, argv);
    if (strcmp(cmd, "serve") == 0) return dhsa_cli_serve(argc, argv);
    if (strcmp(cmd, "pull") == 0) return dhsa_cli_pull(argc, argv);
    if (strcmp(cmd, "chat") == 0) return dhsa_cli_chat(argc, argv);
    dhsa_cli_die(EXIT_USAGE, "unknown command \"%s\"", cmd);
    return EXIT_USAGE;
}
