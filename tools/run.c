/* run.c: `dhsa run` (generate text with a GGUF or llama2.c model, dense or
 * routed attention, under a memory limit) and `dhsa plan` (the memory plan
 * of the same command line, without running). See `dhsa help run`.
 * Tested by tests/test_model.c (CLI part); docs/model.md, docs/results.md (docs/notes/).
 * --dump-layout writes a figure (tests/test_plots.c); run under mpirun -np R > 1 runs
 * context parallel (docs/dist.md; tests/test_dist.c), with the command-line parts
 * `dhsa bench model` (bench_model.c) shares (tools/dist.h, dhsa_cli_print_model).
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

/* --dist-stripe and --dist-fetch, the same words after run's and bench
 * model's help (a string of its own: one string of them all would pass
 * the 4095 characters C99 promises to support). */
const char dhsa_cli_dist_usage[] =
    "Context parallel (mpirun -np R, R > 1; docs/dist.md):\n"
    "  --dist-stripe N     positions go to ranks in stripes of N tokens (0, the\n"
    "                      default: contiguous)\n"
    "  --dist-fetch F      dhsa and block: a fetch budget per rank, 0 < F <= 1\n"
    "                      (default: none, routing as one process). Per layer,\n"
    "                      KV head and other rank, a rank fetches at most F of\n"
    "                      that rank's keys its queries could see: the chunks its\n"
    "                      blocks weigh most together; each block then selects\n"
    "                      among its own rank's chunks and those (docs/dist.md,\n"
    "                      \"A fetch budget per rank\"). Refused with one process\n"
    "A stopped rank (SIGSTOP, a frozen node) is found by a liveness check and\n"
    "named: a wait of DHSA_DIST_PROBE s (5) pings the other ranks, and one that\n"
    "does not answer in DHSA_DIST_STALL s (15) ends the job; DHSA_DIST_TIMEOUT\n"
    "(3600 s) bounds any one wait (docs/dist.md, \"Faults\").\n";

/* --prompt-cache and --json, printed after run's usage (its own string:
 * run's is near the 4095 characters C99 promises to support). */
const char dhsa_cli_run_cache_usage[] =
    "Prompt cache (docs/prompt-cache.md):\n"
    "  --prompt-cache FILE reuse the prefill saved in FILE for a prompt that starts\n"
    "                      with its tokens (only the rest is evaluated); save this\n"
    "                      prompt's there; a file of another model or option is\n"
    "                      not used, saying why\n"
    "Structured output (docs/server.md, \"Structured output\"):\n"
    "  --json              the output is one JSON object (sampling constrained\n"
    "                      token by token; it ends when the object closes)\n"
    "  --json-schema S     the output is JSON valid under the schema S (its JSON\n"
    "                      text, or a file); a keyword outside the subset is\n"
    "                      refused by name. Both imply --no-echo. If -n ends the\n"
    "                      value first: a message and exit status 1 (not JSON)\n";

const char dhsa_cli_run_usage[] =
    "usage: dhsa run [-m MODEL] [-p TEXT | -f FILE] [-n N] [options]\n"
    "       dhsa plan [-m MODEL] [options] [--prompt-tokens N]\n"
    "\n"
    "Generates text: tokenizes the prompt (BOS first when the vocabulary asks\n"
    "for it), prefills it in ubatches, then decodes up to N tokens (default\n"
    "128), streaming the text to stdout; stops at EOS (or a chat turn's end).\n"
    "At the end it prints prompt and decode tok/s, the time to the first token\n"
    "and the peak memory on stderr. `dhsa plan` prints the memory plan of the\n"
    "same options and exits.\n"
    "Model:\n"
    "  -m MODEL            GGUF file, or a llama2.c checkpoint with --tokenizer\n"
    "                      (default: the shipped models/" DHSA_DEFAULT_MODEL ")\n"
    "  --tokenizer FILE    the llama2.c tokenizer (tok*.bin)\n"
    "Prompt:\n"
    "  -p TEXT | -f FILE   the prompt (default: empty: BOS only); a FILE larger than\n"
    "                      the context can hold is refused before it is read\n"
    "  --no-bos            do not add BOS\n"

    "  --chat              wrap the prompt in the model's chat template (the\n"
    "                      prompt is plain text; only the template's markers are special)\n"
    "  --system TEXT       system message (--chat only)\n"
    "  --template NAME     --chat's format (default: the model's if checked):\n"
    "                      llama3 chatml qwen2.5 smollm2 gemma mistral llama2 phi3 plain\n"
    "Sampling:\n"
    "  -n N                tokens to generate (default 128)\n"
    "  --temp T            0 = greedy (default 0.8)\n"
    "  --top-k K           (default 40; 0 = off)  --top-p P (default 0.95)\n"
    "  --min-p P           (default 0.05)         --seed S (default 42)\n"
    "  --repeat-penalty R  (default 1 = off)      --repeat-last-n N (default 64)\n"
    "  --ignore-eos        keep going past EOS\n"
    "Memory and speed:\n"
    "  -c, --ctx N         KV cache length (default: the prompt + N, what the run\n"
    "                      needs; with --mem-limit, less when it does not fit);\n"
    "                      longer than trained: a warning; generation stops when\n"
    "                      it is full\n"
    "  --ubatch N          prefill tokens per step (default: largest <= 512\n"
    "                      that fits --mem-limit)\n"
    "  --kv f32|f16|q8_0   KV cache type (default f16, as llama.cpp; with\n"
    "                      --mem-limit and no --kv, q8_0 when f16 does not fit)\n"
    "  --exact             weight products in F32 (default: the fast route)\n"
    "  --mem-limit SIZE    the most the process may hold, its peak RSS (K/M/G\n"
    "                      suffix); refused before running if the plan exceeds it\n"
    "                      (the model, the session's buffers, the process: stacks,\n"
    "                      allocator slack; dhsa plan lists each; docs/model.md)\n"
    "  -t, --threads T     (default: online CPUs)\n"
    "Attention:\n"
    "  --attn dense|dhsa|block|stream|oracle   (default dense)\n"
    "  --density F | --budget N                keys per query block, one of the\n"
    "                                          two (default density 0.0625)\n"
    "  --boundary fixed|similarity|learned:FILE\n"
    "  --sink N            sinks per block (4), of --sink-window 64\n"
    "  --local N           keys before the block's own (default budget/8);\n"
    "                      at most 1/8 and 1/4 of the block's budget\n"
    "  --dense-below N     a block seeing fewer keys runs dense (default\n"
    "                      0: all routed); the run says the density used\n"
    "  --q-block N         rows per block (default 16; 64 past 16K tokens)\n"
    "  --carry F (0.1)  --exact-rows N (64)  --rest N|hybrid (hybrid)\n"
    "  --hybrid-max-chunk N (16; 0: off): chunks of <= N keys on sliding-window models\n"
    "Output:\n"
    "  --ids               print token ids (prompt, then generated) instead of text\n"
    "  --verbose           print the model, the plan and the timings\n"
    "  --no-echo           do not print the prompt before the continuation (--chat\n"
    "                      never does)\n"
    "  --dump-layout FILE  an SVG of one layer's attention layout in the prefill:\n"
    "                      per query block the key ranges it read (docs/dhsa.md)\n"
    "  --dump-layer N      the layer drawn (default 0)\n"
    "  --dump-head H       the KV head drawn (default 0)\n"
    "  --logits-out FILE   the logits of every step, F32 (tests/test_dist.c)\n";

static double mib(size_t b) { return (double)b / (1024.0 * 1024.0); }

typedef struct {
    const char *model, *tokenizer, *prompt, *prompt_file, *system, *template_name;
    int64_t n_predict, threads, prompt_tokens;
    int no_bos, chat, ids, verbose, ignore_eos, no_echo;
    int json;                   /* --json or --json-schema given */
    const char *json_schema;    /* --json-schema's argument */
    int kv_set;                 /* --kv given: --mem-limit's fit keeps it */
    int density_set, budget_set;
    dhsa_sampler_params sp;
    dhsa_session_params ses;
    const char *predictor_path;
    const char *dump_path;      /* --dump-layout */
    const char *logits_path;    /* --logits-out */
    const char *prompt_cache;   /* --prompt-cache */
    int64_t dump_layer, dump_head;
} run_opts;

/* ---------------------------------------------------- context parallel --- */

/* run and bench model under mpirun -np R > 1 (docs/dist.md): starts this
 * rank's transport and sends stdout of every rank but 0 to /dev/null, so
 * rank 0 alone prints the output (the others still say their errors on
 * stderr); NULL for one process, which runs as it always did. */
const dhsa_dist *dhsa_cli_dist_begin(int *argc, char ***argv) {
    const dhsa_dist *dist = dhsa_cli_dist_start(argc, argv);
    if (dist && dist->rank != 0 && !freopen("/dev/null", "w", stdout))
        dhsa_cli_die(EXIT_RUN, "rank %d: cannot silence stdout", dist->rank);
    return dist;
}

/* --dist-stripe N: 0 (contiguous) or N tokens; the session checks that N
 * is a multiple of the 64-row query block. */
int64_t dhsa_cli_dist_stripe_arg(const char *opt, const char *v) { return dhsa_cli_int(opt, v, 0, (int64_t)1 << 30, 1); }

/* --dist-fetch F: 0 < F <= 1 (0 is the default, no budget: left out, not given). */
double dhsa_cli_dist_fetch_arg(const char *opt, const char *v) {
    double f = dhsa_cli_real(opt, v, 0, 1);
    if (!(f > 0))
        dhsa_cli_die(EXIT_USAGE, "%s %s: a share of the keys in (0, 1]; no budget is the default (leave the option "
                     "out)", opt, v);
    return f;
}

/* --dist-fetch with one process: refused, as it would change nothing. */
void dhsa_cli_dist_fetch_needs_ranks(double f) {
    if (f > 0)
        dhsa_cli_die(EXIT_USAGE, "--dist-fetch %g budgets what each rank of a context-parallel prefill fetches from the "
                     "others (under mpirun -np R, R > 1); one process fetches nothing: leave it out", f);
}


dhsa_cli_dist_wire dhsa_cli_dist_wire_sum(const dhsa_dist_stats *mine) {
    dhsa_cli_dist_wire w;
    w.kv = dhsa_cli_dist_sum(mine->kv);
    w.index = dhsa_cli_dist_sum(mine->index);
    w.partial = dhsa_cli_dist_sum(mine->partial);
    w.keys = dhsa_cli_dist_sum(mine->kv_keys);
    w.visible = dhsa_cli_dist_sum(mine->kv_visible);
    w.share_max = dhsa_cli_dist_max(mine->kv_share_max);
    w.window = dhsa_cli_dist_sum(mine->kv_window);
    return w;
}

/* The wire in words: K/V per layer per prompt token (prefill), the index
 * relay, the decode partials per layer per decode step; for DHSA the share
 * of the other ranks' keys fetched that the queries could see, and the
 * largest from one rank in one layer (at most --dist-fetch). */
const char *dhsa_cli_dist_wire_text(const dhsa_cli_dist_wire *w, int64_t n_layer, int64_t n_prompt, int64_t n_dec, char *buf,
                                  size_t cap) {
    int k = snprintf(buf, cap, "K/V %.3f MiB = %.1f bytes per layer per prompt token, index %.3f MiB, decode "
                     "partials %.3f MiB (%.0f bytes per layer per decode token)", w->kv / 1048576.0,
                     n_prompt > 0 ? w->kv / (double)n_layer / (double)n_prompt : 0.0, w->index / 1048576.0,
                     w->partial / 1048576.0, n_dec > 0 ? w->partial / (double)n_layer / (double)n_dec : 0.0);
    if (w->visible > 0 && k > 0 && (size_t)k < cap)
        k += snprintf(buf + k, cap - (size_t)k, "; fetched %.0f of the %.0f keys of other ranks the queries could see "
                      "(%.2f%%; from one rank in one layer at most %.6f)", w->keys, w->visible,
                      100.0 * w->keys / w->visible, w->share_max);
    if (w->window > 0 && k > 0 && (size_t)k < cap)
        snprintf(buf + k, cap - (size_t)k, "; sliding-window layers: %.0f keys of other ranks' stripes their windows "
                 "reach", w->window);
    return buf;
}

/* ------------------------------------------------------------------ run --- */

static void parse(int argc, char **argv, run_opts *o) {
    memset(o, 0, sizeof *o);
    o->n_predict = 128;
    o->sp = dhsa_sampler_default_params();
    o->ses = dhsa_session_default_params();
    dhsa_cli_router_unset(&o->ses.router); /* the defaults for the run's length, once it is known */
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(dhsa_cli_run_usage, stdout);
            fputs(dhsa_cli_run_cache_usage, stdout);
            fputs(dhsa_cli_dist_usage, stdout);
            exit(0);
        }
        /* flags */
        if (strcmp(a, "--no-bos") == 0) { o->no_bos = 1; continue; }
        if (strcmp(a, "--chat") == 0) { o->chat = 1; continue; }
        if (strcmp(a, "--ids") == 0) { o->ids = 1; continue; }
        if (strcmp(a, "--verbose") == 0 || strcmp(a, "-v") == 0) { o->verbose = 1; continue; }
        if (strcmp(a, "--ignore-eos") == 0) { o->ignore_eos = 1; continue; }
        if (strcmp(a, "--no-echo") == 0) { o->no_echo = 1; continue; }
        if (strcmp(a, "--exact") == 0) { o->ses.exact = 1; continue; }
        if (strcmp(a, "--json") == 0) {
            if (o->json_schema) dhsa_cli_die(EXIT_USAGE, "--json and --json-schema: give one of them");
            o->json = 1;
            continue;
        }
        if (i + 1 >= argc) dhsa_cli_die(EXIT_USAGE, "%s needs a value (or is unknown: see dhsa help run)", a);
        const char *v = argv[++i];
        if (strcmp(a, "-m") == 0 || strcmp(a, "--model") == 0) o->model = dhsa_cli_model_arg(v);
        else if (strcmp(a, "--tokenizer") == 0) o->tokenizer = v;
        else if (strcmp(a, "-p") == 0 || strcmp(a, "--prompt") == 0) o->prompt = v;
        else if (strcmp(a, "-f") == 0 || strcmp(a, "--file") == 0) o->prompt_file = v;
        else if (strcmp(a, "--system") == 0) o->system = v;
        else if (strcmp(a, "--template") == 0) o->template_name = v;
        else if (strcmp(a, "-n") == 0) o->n_predict = dhsa_cli_int(a, v, 0, (int64_t)1 << 31, 1);
        else if (strcmp(a, "--temp") == 0) o->sp.temperature = (float)dhsa_cli_real(a, v, 0, 1e6);
        else if (strcmp(a, "--top-k") == 0) o->sp.top_k = dhsa_cli_int(a, v, 0, (int64_t)1 << 24, 0);
        else if (strcmp(a, "--top-p") == 0) o->sp.top_p = (float)dhsa_cli_real(a, v, 1e-9, 1);
        else if (strcmp(a, "--min-p") == 0) o->sp.min_p = (float)dhsa_cli_real(a, v, 0, 1);
        else if (strcmp(a, "--repeat-penalty") == 0) o->sp.repeat_penalty = (float)dhsa_cli_real(a, v, 1e-6, 1e6);
        else if (strcmp(a, "--repeat-last-n") == 0) o->sp.repeat_last_n = dhsa_cli_int(a, v, 0, (int64_t)1 << 31, 0);
        else if (strcmp(a, "--seed") == 0) o->sp.seed = (uint64_t)dhsa_cli_int(a, v, 0, INT64_MAX, 0);
        else if (strcmp(a, "--threads") == 0 || strcmp(a, "-t") == 0) o->threads = dhsa_cli_threads(a, v);
        else if (strcmp(a, "--ctx") == 0 || strcmp(a, "-c") == 0) o->ses.n_ctx = dhsa_cli_int(a, v, 1, (int64_t)1 << 31, 1);
        else if (strcmp(a, "--ubatch") == 0) o->ses.n_ubatch = dhsa_cli_int(a, v, 1, 65536, 1);
        else if (strcmp(a, "--mem-limit") == 0) o->ses.mem_limit = (size_t)dhsa_cli_int(a, v, 1, INT64_MAX, 1);
        else if (strcmp(a, "--prompt-tokens") == 0) o->prompt_tokens = dhsa_cli_int(a, v, 0, (int64_t)1 << 31, 1);
        else if (strcmp(a, "--kv") == 0) {
            o->kv_set = 1;
            if (strcmp(v, "f32") == 0) o->ses.kv_type = DHSA_F32;
            else if (strcmp(v, "f16") == 0) o->ses.kv_type = DHSA_F16;
            else if (strcmp(v, "q8_0") == 0) o->ses.kv_type = DHSA_Q8_0;
            else dhsa_cli_die(EXIT_USAGE, "--kv is f32, f16 or q8_0, not \"%s\"", v);
        } else if (strcmp(a, "--attn") == 0) {
            dhsa_attn_method m;
            for (m = DHSA_ATTN_DENSE; m <= DHSA_ATTN_ORACLE; m++)
                if (strcmp(v, dhsa_attn_method_name(m)) == 0) break;
            if (m > DHSA_ATTN_ORACLE) dhsa_cli_die(EXIT_USAGE, "--attn is dense, dhsa, block, stream or oracle, not \"%s\"", v);
            o->ses.attn = m;
        } else if (strcmp(a, "--density") == 0) {
            o->ses.router.density = dhsa_cli_real(a, v, 1e-6, 1);
            o->density_set = 1;
        } else if (strcmp(a, "--budget") == 0) {
            o->ses.router.budget_tokens = dhsa_cli_int(a, v, 1, (int64_t)1 << 31, 1);
            o->budget_set = 1;
        } else if (strcmp(a, "--boundary") == 0) {
            if (strcmp(v, "fixed") == 0) o->ses.router.boundary = DHSA_BOUNDARY_FIXED;
            else if (strcmp(v, "similarity") == 0) o->ses.router.boundary = DHSA_BOUNDARY_SIMILARITY;
            else if (strncmp(v, "learned:", 8) == 0 && v[8]) {
                o->ses.router.boundary = DHSA_BOUNDARY_LEARNED;
                o->predictor_path = v + 8;
            } else dhsa_cli_die(EXIT_USAGE, "--boundary is fixed, similarity or learned:FILE, not \"%s\"", v);
        } else if (strcmp(a, "--sink") == 0) o->ses.router.sink_tokens = dhsa_cli_int(a, v, 0, (int64_t)1 << 31, 1);
        else if (strcmp(a, "--sink-window") == 0) o->ses.router.sink_window = dhsa_cli_int(a, v, 0, 4096, 0);
        else if (strcmp(a, "--carry") == 0) o->ses.router.carry = dhsa_cli_real(a, v, 0, 1);
        else if (strcmp(a, "--exact-rows") == 0) o->ses.router.exact_rows = dhsa_cli_int(a, v, 0, DHSA_EXACT_ROWS_MAX, 0);
        else if (strcmp(a, "--rest") == 0) o->ses.router.rest = dhsa_cli_rest(a, v);
        else if (strcmp(a, "--hybrid-max-chunk") == 0) o->ses.router.hybrid_max_chunk = dhsa_cli_int(a, v, 0, 1 << 30, 0);
        else if (strcmp(a, "--local") == 0) o->ses.router.local_tokens = dhsa_cli_int(a, v, 0, (int64_t)1 << 31, 1);
        else if (strcmp(a, "--dense-below") == 0) o->ses.router.dense_below = dhsa_cli_int(a, v, 0, (int64_t)1 << 31, 1);
        else if (strcmp(a, "--q-block") == 0) o->ses.router.q_block = dhsa_cli_int(a, v, 1, 65536, 0);
        else if (strcmp(a, "--logits-out") == 0) o->logits_path = v;
        else if (strcmp(a, "--json-schema") == 0) {
            if (o->json) dhsa_cli_die(EXIT_USAGE, "--json and --json-schema: give one of them");
            o->json = 1;
            o->json_schema = v;
        } else if (strcmp(a, "--prompt-cache") == 0) {
            if (!v[0]) dhsa_cli_die(EXIT_USAGE, "--prompt-cache needs a file name");
            o->prompt_cache = v;
        }
        else if (strcmp(a, "--dist-stripe") == 0) o->ses.dist_stripe = dhsa_cli_dist_stripe_arg(a, v);
        else if (strcmp(a, "--dist-fetch") == 0) o->ses.dist_fetch_share = dhsa_cli_dist_fetch_arg(a, v);
        else if (strcmp(a, "--dump-layout") == 0) {
            if (!v[0]) dhsa_cli_die(EXIT_USAGE, "--dump-layout needs a file name");
            o->dump_path = v;
        } else if (strcmp(a, "--dump-layer") == 0) o->dump_layer = dhsa_cli_int(a, v, 0, 1 << 20, 0);
        else if (strcmp(a, "--dump-head") == 0) o->dump_head = dhsa_cli_int(a, v, 0, 1 << 20, 0);
        else dhsa_cli_die(EXIT_USAGE, "unknown option \"%s\" (see dhsa help run)", a);
    }
    if (!o->model) {
        char msg[512];
        o->model = dhsa_cli_default_model(msg, sizeof msg);
        if (!o->model) dhsa_cli_die(EXIT_USAGE, "%s", msg);
        fprintf(stderr, "dhsa: model %s (the default; -m MODEL for another)\n", o->model);
    }
    if (o->prompt && o->prompt_file) dhsa_cli_die(EXIT_USAGE, "give -p or -f, not both");
    /* an option that would change nothing is refused, not ignored */
    if (o->density_set && o->budget_set)
        dhsa_cli_die(EXIT_USAGE, "give --density F or --budget N, not both (--budget sets the keys per query block; "
                     "--density the share of the keys it may see)");
    if (o->system && !o->chat) dhsa_cli_die(EXIT_USAGE, "--system is the system message of a --chat prompt: add --chat");
    if (o->template_name && !o->chat) dhsa_cli_die(EXIT_USAGE, "--template names the template of --chat: add --chat");
    dhsa_cli_check_tokenizer(o->model, o->tokenizer);
    if (o->dump_path) dhsa_cli_check_output("--dump-layout", o->dump_path);
    if (o->prompt_cache && o->dump_path)
        dhsa_cli_die(EXIT_USAGE, "--dump-layout draws the prefill, which --prompt-cache may skip: give one of them");
    if (o->ses.router.boundary == DHSA_BOUNDARY_FIXED && o->ses.attn == DHSA_ATTN_DHSA)
        o->ses.attn = DHSA_ATTN_BLOCK; /* dhsa with fixed chunks is the block baseline */
}

/* Progress bar for long prefills, on a terminal only. */
static void progress(void *user, int64_t done, int64_t total) {
    double t0 = *(double *)user;
    int width = 30, fill = (int)(width * done / (total > 0 ? total : 1));
    double el = dhsa_cli_now() - t0;
    fprintf(stderr, "\rprefill [%.*s%*s] %lld/%lld  %.0f tok/s ", fill, "##############################", width - fill,
            "", (long long)done, (long long)total, el > 0 ? (double)done / el : 0.0);
    if (done == total) fputc('\n', stderr);
}

/* One line of the plan: the size in a unit that shows it (KiB below 1
 * MiB), then what it is. */
static const char *plan_size(size_t bytes, char *b, size_t cap) {
    if (bytes < 1024) snprintf(b, cap, "%zu B", bytes);
    else if (bytes < ((size_t)1 << 20)) snprintf(b, cap, "%.1f KiB", (double)bytes / 1024.0);
    else snprintf(b, cap, "%.1f MiB", mib(bytes));
    return b;
}

static void plan_line(FILE *f, const char *name, size_t bytes, const char *what) {
    char b[32];
    fprintf(f, "  %-19s %12s%s%s\n", name, plan_size(bytes, b, sizeof b), what[0] ? "  " : "", what);
}

static void print_plan(FILE *f, const dhsa_mem_plan *pl, int n_threads) {
    char what[160];
    fprintf(f, "memory plan: ctx %lld tokens, ubatch %lld; the total bounds the peak RSS of the process\n",
            (long long)pl->n_ctx, (long long)pl->n_ubatch);
    plan_line(f, "weights", pl->weights, "tensor data, mapped from the file (counted whole)");
    plan_line(f, "KV cache", pl->kv_cache, "");
    plan_line(f, "activations", pl->activations, "");
    plan_line(f, "attention scratch", pl->attn_workspace, "");
    plan_line(f, "product scratch", pl->matmul_workspace, "");
    plan_line(f, "routing", pl->routing, "");
    plan_line(f, "process", pl->process, "the rest of the process:");
    plan_line(f, "  model file", pl->model_file, "the file besides its tensors (header, metadata)");
    plan_line(f, "  model heap", pl->model_heap, "tokenizer tables, GGUF index, model (counted)");
    plan_line(f, "  code", pl->code, pl->measured ? "program, libraries, other mapped files, whole (measured)"
                                                   : "a fixed allowance (no /proc/self to measure)");
    plan_line(f, "  other", pl->other, pl->measured ? "anonymous memory held now besides the model's (measured)"
                                                     : "not known (no /proc/self)");
    snprintf(what, sizeof what, "%d threads x %zu KiB", n_threads, DHSA_PLAN_STACK_ALLOWANCE >> 10);
    plan_line(f, "  stacks", pl->stacks, what);
    snprintf(what, sizeof what, "the allocator's rounding of the buffers + %zu KiB", DHSA_PLAN_HEAP_MARGIN >> 10);
    plan_line(f, "  allocator slack", pl->slack, what);
    char b[32];
    fprintf(f, "  %-19s %12s  (%zu bytes)\n", "total", plan_size(pl->total, b, sizeof b), pl->total);
}

void dhsa_cli_print_model(FILE *f, const char *path, const dhsa_model *m, const dhsa_model_info *in) {
    char weights[256];
    dhsa_cli_weights_text(dhsa_model_gguf(m), in->weight_type, weights, sizeof weights);
    fprintf(f, "model: %s: %s, %lld layers, n_embd %lld, n_ff %lld, heads %lld/%lld (kv), head dim %lld, vocab %lld, "
            "trained ctx %lld, %s, %.1f M parameters, %.1f MiB\n",
            path, in->arch_name, (long long)in->n_layer, (long long)in->n_embd, (long long)in->n_ff,
            (long long)in->n_head, (long long)in->n_head_kv, (long long)in->head_dim_k, (long long)in->n_vocab,
            (long long)in->n_ctx_train, weights, (double)in->n_params / 1e6,
            mib((size_t)in->weight_bytes));
    if (in->n_swa_layers > 0)
        fprintf(f, "model: %lld of %lld layers slide (window %lld, RoPE base %g): each keeps a ring of its last "
                "window - 1 + ubatch keys (and a backup of window - 1), not the context, and attends densely; the "
                "sparse methods (dhsa, block, stream, oracle) route only the %lld global layers\n",
                (long long)in->n_swa_layers, (long long)in->n_layer, (long long)in->sliding_window,
                (double)in->rope_base_swa, (long long)(in->n_layer - in->n_swa_layers));
    if (in->has_rope_factors)
        fprintf(f, "model: LongRoPE factors: the short ones up to a context of %lld, the long ones above\n",
                (long long)in->n_ctx_orig);
}

/* Whether the statistics must start with a line break of their own: when
 * stderr is a terminal and stdout goes elsewhere (`dhsa run ... | cat`,
 * `| tee`), the text reaches the terminal through the other process,
 * which may not have written its last line break yet when our stderr
 * line arrives ("it isprompt: 20 tokens"). Writing to one file (the same
 * terminal, 2>&1) keeps the order: no blank line then. */
static int stats_need_newline(void) {
    if (!isatty(2)) return 0;
    struct stat so, se;
    if (fstat(1, &so) != 0 || fstat(2, &se) != 0) return 1;
    return !(so.st_dev == se.st_dev && so.st_ino == se.st_ino && so.st_rdev == se.st_rdev);
}

/* Writes the bytes of one token to stdout. */
static void emit(const dhsa_tokenizer *tok, int32_t id, int first) {
    char buf[512];
    int64_t len;
    if (dhsa_token_to_piece(tok, id, 0, buf, sizeof buf, &len) != DHSA_OK) return;
    const char *p = buf;
    /* SentencePiece: the first piece's added space is not the user's text */
    if (first && len > 0 && buf[0] == ' ' && dhsa_tokenizer_kind_of(tok) == DHSA_TOKENIZER_SPM) {
        p++;
        len--;
    }
    fwrite(p, 1, (size_t)len, stdout);
    fflush(stdout);
}

/* --chat: the prompt as one user turn (after an optional system turn) with
 * the assistant's turn opened, in the chat template named or detected from
 * the model; adds the template's end-of-turn ids to stop. The turns borrow
 * the prompt and system texts. */
typedef struct {
    dhsa_chat_template t;
    const char *how; /* why this format (dhsa_cli_chat_template) */
    dhsa_chat_message msgs[2];
    int n;
} chat_prompt;

static void chat_setup(const dhsa_gguf *g, const dhsa_tokenizer *tok, const char *name, const char *system,
                       const char *text, chat_prompt *c, int32_t *stop, int *n_stop, int cap) {
    c->t = dhsa_cli_chat_template(g, name, &c->how);
    /* the format used is named on every --chat run: which one ran decides
     * what the model saw (stderr, like the statistics) */
    if (c->t == DHSA_CHAT_NONE) {
        if (system) dhsa_cli_die(EXIT_USAGE, "--system needs a chat template: --template plain has none");
        fprintf(stderr, "chat template: none (%s): the prompt as it is\n", c->how);
        return;
    }
    fprintf(stderr, "chat template: %s (%s)\n", dhsa_chat_template_name(c->t), c->how);
    c->n = 0;
    if (system) c->msgs[c->n++] = (dhsa_chat_message){"system", system};
    c->msgs[c->n++] = (dhsa_chat_message){"user", text ? text : ""};
    int extra = 0;
    if (dhsa_chat_stop_ids(c->t, tok, stop + *n_stop, cap - *n_stop, &extra)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
    *n_stop += extra;
}

/* The prompt's ids: the text (c = NULL), or the chat turns, whose text is
 * tokenized as plain text and only the template's markers as special
 * tokens (dhsa_chat_tokenize), so a prompt cannot forge a turn. */
static dhsa_status prompt_ids(const dhsa_tokenizer *tok, const chat_prompt *c, const char *text, int64_t len,
                              unsigned flags, int32_t *ids, int64_t cap, int64_t *n) {
    if (c) return dhsa_chat_tokenize(c->t, tok, c->msgs, c->n, 1, flags, ids, cap, n);
    return dhsa_tokenize(tok, text ? text : "", len, flags, ids, cap, n);
}

/* --------------------------------------------------------- dump layout --- */

/* --dump-layout: the session's layer hook collects the layout of one layer
 * and KV head for every ubatch of the prompt into a picture (each ubatch's
 * blocks placed at its q_pos0), written after the prefill. The chunk
 * starts drawn are those of the routing: for dhsa and block (routed through
 * a per-layer dhsa_kv_index) a second index with the same parameters is fed
 * the same keys, so it closes the same chunks (learned boundaries too: the
 * index runs the predictor); for oracle (dhsa_route over the cache)
 * dhsa_route_boundaries of the last ubatch, which sees the whole prompt;
 * stream and dense have none. Both
 * mirror session.c's method_router (causal boundaries, BLOCK = FIXED). The
 * mirror index lives in its own ctx, outside --mem-limit. */
typedef struct {
    const char *path;
    int64_t layer, head, q_block;
    int active;                 /* set while the prompt is prefilled */
    int causal_window;          /* a dense call had a window (gemma2 layers) */
    dhsa_attn_method attn;
    dhsa_router_params rp;      /* as the session routes */
    dhsa_ctx *ctx;
    dhsa_kv_index *ix;          /* dhsa, block: the mirror index */
    int64_t *starts, n_starts;  /* oracle: the last ubatch's */
    dhsa_layout_picture *pic;
    int64_t ubatches;
    char error[512];
} layout_dump;

static int dump_fail(layout_dump *d, const char *what) {
    snprintf(d->error, sizeof d->error, "--dump-layout: %s: %s", what, dhsa_last_error());
    return 1; /* stops the eval; run_main prints d->error */
}

static int dump_hook(void *user, int64_t layer, const dhsa_attn_desc *a) {
    layout_dump *d = user;
    if (!d->active || layer != d->layer) return 0;
    const int64_t n = a->q.shape[2], pos0 = a->q_pos0;
    d->ubatches++;
    if (d->ix) { /* the ubatch's new keys: cache rows [pos0, pos0 + n) */
        dhsa_tensor kn = a->k;
        kn.data = (char *)kn.data + dhsa_type_row_bytes(kn.type, pos0 * kn.stride[2]);
        kn.shape[2] = n;
        if (dhsa_kv_index_append(d->ix, &kn)) return dump_fail(d, "the mirror index");
    } else if (a->layout && d->rp.method != DHSA_ROUTE_STREAM) {
        int64_t nc = 0;
        if (dhsa_route_boundaries(d->ctx, &d->rp, a, 0, NULL, 0, &nc)) return dump_fail(d, "chunk starts");
        int64_t *st = realloc(d->starts, (size_t)(nc > 0 ? nc : 1) * sizeof *st);
        if (!st) return dump_fail(d, "out of memory");
        d->starts = st;
        if (dhsa_route_boundaries(d->ctx, &d->rp, a, 0, st, nc, &d->n_starts)) return dump_fail(d, "chunk starts");
    }
    if (a->layout) {
        if (dhsa_layout_picture_add_layout(d->pic, a->layout, 0, d->head, pos0)) return dump_fail(d, "the picture");
        return 0;
    }
    /* dense: every causal key (inside the window, if any) */
    if (a->window > 0) d->causal_window = 1;
    for (int64_t r0 = 0; r0 < n; r0 += d->q_block) {
        int64_t r1 = r0 + d->q_block < n ? r0 + d->q_block : n;
        int64_t rg[2] = {a->window > 0 ? pos0 + r0 - a->window + 1 : 0, pos0 + r1};
        if (dhsa_layout_picture_add_block(d->pic, pos0 + r0, pos0 + r1, rg, 1)) return dump_fail(d, "the picture");
    }
    return 0;
}

/* Prepares the dump for a prompt of n_prompt tokens; the hook goes into
 * the session params. */
static void dump_begin(layout_dump *d, const run_opts *o, const dhsa_model_info *in, int64_t n_prompt,
                       dhsa_session_params *ses) {
    memset(d, 0, sizeof *d);
    d->path = o->dump_path;
    d->layer = o->dump_layer;
    d->head = o->dump_head;
    d->attn = o->ses.attn;
    if (d->layer >= in->n_layer)
        dhsa_cli_die(EXIT_USAGE, "--dump-layer %lld: the model has %lld layers", (long long)d->layer, (long long)in->n_layer);
    if (d->head >= in->n_head_kv)
        dhsa_cli_die(EXIT_USAGE, "--dump-head %lld: the model has %lld KV heads", (long long)d->head, (long long)in->n_head_kv);
    d->rp = o->ses.router; /* session.c's method_router */
    switch (d->attn) {
    case DHSA_ATTN_BLOCK:
        d->rp.method = DHSA_ROUTE_DHSA;
        d->rp.boundary = DHSA_BOUNDARY_FIXED;
        break;
    case DHSA_ATTN_STREAM: d->rp.method = DHSA_ROUTE_STREAM; break;
    case DHSA_ATTN_ORACLE: d->rp.method = DHSA_ROUTE_ORACLE; break;
    default:
        d->rp.method = DHSA_ROUTE_DHSA;
        if (d->rp.boundary == DHSA_BOUNDARY_FIXED) d->rp.boundary = DHSA_BOUNDARY_SIMILARITY;
        break;
    }
    d->rp.causal_boundaries = 1;
    d->q_block = d->rp.q_block > 0 ? d->rp.q_block : 64;
    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = 1;
    if (dhsa_ctx_create(&cp, &d->ctx)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
    if ((d->attn == DHSA_ATTN_DHSA || d->attn == DHSA_ATTN_BLOCK) &&
        dhsa_kv_index_create(d->ctx, &d->rp, in->n_head_kv, in->head_dim_k, n_prompt, &d->ix))
        dhsa_cli_die(EXIT_RUN, "--dump-layout: %s", dhsa_last_error());
    d->pic = dhsa_layout_picture_create(NULL, n_prompt, n_prompt);
    if (!d->pic) dhsa_cli_die(EXIT_RUN, "--dump-layout: %s", dhsa_last_error());
    ses->layer_hook = dump_hook;
    ses->layer_hook_user = d;
}

/* Writes the picture (after the prefill) and frees the dump. */
/* What a sparse run really did (the session's statistics), for the prefill and the whole run: keys selected
 * against those available, calls without a layout, blocks run dense, the chunk summaries read (the rest). */
static void density_line(const char *what, const dhsa_attn_stats *st) {
    /* one write: stderr is unbuffered, and under mpirun the ranks share it */
    char line[320];
    int n = snprintf(line, sizeof line, "  %s: density used %.4f over %lld layer calls", what, st->density,
                     (long long)st->layer_calls);
    if (st->dense_calls > 0)
        n += snprintf(line + n, sizeof line - (size_t)n, ", %lld of them without a layout (dense)", (long long)st->dense_calls);
    if (st->blocks > 0)
        n += snprintf(line + n, sizeof line - (size_t)n, ", %lld of %lld query blocks x KV heads ran dense",
                      (long long)st->dense_blocks, (long long)st->blocks);
    if (st->summaries > 0 && st->available > 0) /* the rest's reads (docs/dhsa.md) */
        n += snprintf(line + n, sizeof line - (size_t)n, "; chunk summaries %.4f of the keys besides", st->summaries / st->available);
    fprintf(stderr, "%s\n", line);
}

static void density_report(const dhsa_attn_stats *prefill, const dhsa_session *s, const dhsa_session_params *ses) {
    const dhsa_router_params *rp = &ses->router;
    dhsa_attn_stats total;
    dhsa_session_get_stats(s, NULL, &total);
    char want[64];
    if (rp->budget_tokens > 0) snprintf(want, sizeof want, "a budget of %lld keys", (long long)rp->budget_tokens);
    else snprintf(want, sizeof want, "density %.4g", rp->density);
    fprintf(stderr, "attention: %s at %s (sink %lld, local %lld%s, dense below %lld keys):\n",
            dhsa_attn_method_name(ses->attn), want, (long long)rp->sink_tokens, (long long)rp->local_tokens,
            rp->scale_fixed ? ", at most 1/8 and 1/4 of each block's budget" : "", (long long)rp->dense_below);
    density_line("prefill", prefill);
    density_line("prefill + decode", &total);
    if (total.layer_calls > 0 && total.dense_blocks == total.blocks)
        fprintf(stderr, "attention: this run was DENSE: no query block was routed (each saw fewer than "
                "--dense-below %lld keys, or its budget covered them all; --dense-below 0 routes every block)\n",
                (long long)rp->dense_below);
}

static void dump_end(layout_dump *d, const char *model_path, const dhsa_model_info *in, int64_t n_prompt,
                     int64_t n_ubatch) {
    const dhsa_router_params *rp = &d->rp;
    int routed = d->attn != DHSA_ATTN_DENSE;
    const int64_t *starts = d->starts;
    int64_t n_starts = d->n_starts;
    if (d->ix) n_starts = dhsa_kv_index_chunks(d->ix, &starts);
    if (n_starts && dhsa_layout_picture_set_boundaries(d->pic, starts, n_starts))
        dhsa_cli_die(EXIT_RUN, "--dump-layout: %s", dhsa_last_error());
    dhsa_layout_picture_set_marks(d->pic, 1, routed ? rp->sink_tokens : 0, routed ? rp->local_tokens : 0);
    char title[256], sub[512], chunks[128] = "";
    snprintf(title, sizeof title, "dhsa run: layer %lld, %s, L = %lld, density %.4f", (long long)d->layer,
             dhsa_attn_method_name(d->attn), (long long)n_prompt, dhsa_layout_picture_density(d->pic));
    const char *base = strrchr(model_path, '/');
    if (routed && d->attn != DHSA_ATTN_STREAM)
        snprintf(chunks, sizeof chunks, "; %s boundaries: %lld chunks",
                 rp->boundary == DHSA_BOUNDARY_FIXED ? "fixed" : rp->boundary == DHSA_BOUNDARY_LEARNED ? "learned"
                                                                                                      : "similarity",
                 (long long)n_starts);
    if (routed)
        snprintf(sub, sizeof sub,
                 "%s; KV head %lld of %lld; prompt prefilled in %lld ubatch%s of %lld; q_block %lld%s; sink %lld, "
                 "local %lld, dense below %lld",
                 base ? base + 1 : model_path, (long long)d->head, (long long)in->n_head_kv, (long long)d->ubatches,
                 d->ubatches == 1 ? "" : "es", (long long)n_ubatch, (long long)d->q_block, chunks,
                 (long long)rp->sink_tokens, (long long)rp->local_tokens, (long long)rp->dense_below);
    else
        snprintf(sub, sizeof sub, "%s; KV head %lld of %lld; prompt prefilled in %lld ubatch%s of %lld; dense%s",
                 base ? base + 1 : model_path, (long long)d->head, (long long)in->n_head_kv, (long long)d->ubatches,
                 d->ubatches == 1 ? "" : "es", (long long)n_ubatch,
                 d->causal_window ? " in a sliding window" : ": every causal key");
    if (dhsa_layout_picture_set_title(d->pic, title) || dhsa_layout_picture_set_subtitle(d->pic, sub) ||
        dhsa_layout_picture_save(d->pic, d->path))
        dhsa_cli_die(EXIT_RUN, "--dump-layout: %s", dhsa_last_error());
    fprintf(stderr, "dhsa run: layout of layer %lld, KV head %lld (%lld query blocks) written to %s\n",
            (long long)d->layer, (long long)d->head, (long long)dhsa_layout_picture_blocks(d->pic), d->path);
    dhsa_layout_picture_free(d->pic);
    dhsa_kv_index_free(d->ix);
    dhsa_ctx_free(d->ctx);
    free(d->starts);
    memset(d, 0, sizeof *d);
}

/* The plan did not fit: the library's sentence (which says the limit in
 * units a reader can check), and for a limit under 1 MiB that 1 is one
 * byte: sizes take K, M and G. */
static void plan_failed(dhsa_status st, const dhsa_session_params *ses) {
    char msg[600];
    snprintf(msg, sizeof msg, "%s", dhsa_last_error());
    if (st != DHSA_ERR_MEMORY_BUDGET || !ses->mem_limit || ses->mem_limit >= ((size_t)1 << 20))
        dhsa_cli_die(EXIT_RUN, "%s", msg);
    dhsa_cli_die(EXIT_RUN, "%s (sizes take K, M and G, as in --mem-limit 1G)", msg);
}

/* --mem-limit without --kv or --ctx (llama.cpp's --fit): when the plan
 * does not fit, the session is made smaller, in this order, saying so on
 * stderr: the ubatch (the library takes the largest <= 512 that fits when
 * --ubatch is not given), then the KV cache type (F16 -> Q8_0, where head
 * dims allow it and one process runs: the answer is kept whole, at 8-bit
 * K/V), then the context (down to the largest that fits, at least the
 * prompt + 1: generation stops when it is full); each first while the
 * ubatch stays >= 64. The context comes after
 * the KV type, unlike llama.cpp, because it is already sized to the prompt
 * and -n: cutting it cuts the answer. Nothing given on the command line is
 * changed; when nothing fits, the first plan's sentence is the error.
 * Tested by tests/test_cli_small.c. */
static dhsa_status fit_plan(dhsa_ctx *ctx, const dhsa_model *m, run_opts *o, int ctx_set, int64_t n_prompt,
                            dhsa_mem_plan *plan) {
    dhsa_status st = dhsa_session_plan(ctx, m, &o->ses, plan);
    if (st != DHSA_ERR_MEMORY_BUDGET || !o->ses.mem_limit) return st;
    char lim[32], need[32];
    dhsa_cli_bytes((double)o->ses.mem_limit, lim, sizeof lim);
    const dhsa_model_info *in = dhsa_model_get_info(m);
    const dhsa_type kv0 = o->ses.kv_type;
    const int64_t asked = o->ses.n_ctx;
    const int to_q8 = !o->kv_set && kv0 == DHSA_F16 && !o->ses.dist && in->head_dim_k % 32 == 0 &&
                      in->head_dim_v % 32 == 0;
    /* First with a prefill ubatch of at least 64 (or the whole prompt): a
     * plan that fits only at a ubatch of a few tokens makes the prefill
     * many times slower, so a smaller step of the next kind is taken
     * first; then with any ubatch. */
    for (int pass = 0; pass < 2; pass++) {
        const int64_t min_ub = pass ? 1 : (n_prompt < 64 ? n_prompt : 64);
        if (to_q8) {
            o->ses.kv_type = DHSA_Q8_0;
            o->ses.n_ctx = asked;
            st = dhsa_session_plan(ctx, m, &o->ses, plan);
            if (st == DHSA_OK && plan->n_ubatch >= min_ub) {
                fprintf(stderr, "dhsa %s: --mem-limit %s: KV cache q8_0 (an f16 one does not fit; plan %s; give "
                        "--kv to choose)\n", dhsa_cli_command(), lim,
                        dhsa_cli_bytes((double)plan->total, need, sizeof need));
                return st;
            }
            if (st != DHSA_OK && st != DHSA_ERR_MEMORY_BUDGET) return st;
        }
        if (!ctx_set && asked > n_prompt + 1) {
            int64_t lo = n_prompt + 1, hi = asked - 1, best = 0; /* the largest that fits */
            while (lo <= hi) {
                const int64_t mid = lo + (hi - lo) / 2;
                o->ses.n_ctx = mid;
                st = dhsa_session_plan(ctx, m, &o->ses, plan);
                if (st == DHSA_OK && plan->n_ubatch >= min_ub) best = mid, lo = mid + 1;
                else if (st == DHSA_OK || st == DHSA_ERR_MEMORY_BUDGET) hi = mid - 1;
                else return st;
            }
            if (best) {
                o->ses.n_ctx = best;
                if ((st = dhsa_session_plan(ctx, m, &o->ses, plan)) != DHSA_OK) return st;
                fprintf(stderr, "dhsa %s: --mem-limit %s: context %lld tokens, KV %s%s (the prompt and -n need "
                        "%lld; generation stops when it is full; plan %s)\n", dhsa_cli_command(), lim,
                        (long long)best, dhsa_type_name(o->ses.kv_type),
                        o->ses.kv_type != kv0 ? " (an f16 cache does not fit)" : "", (long long)asked,
                        dhsa_cli_bytes((double)plan->total, need, sizeof need));
                return DHSA_OK;
            }
        }
    }
    o->ses.kv_type = kv0;
    o->ses.n_ctx = asked;
    return dhsa_session_plan(ctx, m, &o->ses, plan); /* the first plan again: its sentence is the error */
}

/* After a context-parallel run: what each rank received and held, and
 * whether every rank generated the same ids (rank 0 says so). */
static int dist_report(const dhsa_session *s, const dhsa_model_info *in, const int32_t *ids, int64_t n_ids,
                       int64_t n_prompt, double t_prompt, int64_t stripe, double fetch) {
    dhsa_dist_stats ds;
    dhsa_session_get_dist_stats(s, &ds);
    const int r = dhsa_cli_dist_rank(), R = dhsa_cli_dist_size();
    const int64_t L = in->n_layer;
    char vis[224] = "";
    int nv = 0;
    if (ds.kv_visible > 0)
        nv = snprintf(vis, sizeof vis, " of the %.0f its queries could see, from one rank in one layer at most %.6f",
                      ds.kv_visible, ds.kv_share_max);
    if (ds.kv_window > 0 && nv >= 0 && (size_t)nv < sizeof vis)
        snprintf(vis + nv, sizeof vis - (size_t)nv, "; %.0f more for sliding windows", ds.kv_window);
    fprintf(stderr, "dist rank %d/%d: received K/V %.3f MiB (%.0f keys%s), index %.3f MiB, decode partials %.3f MiB, "
            "logits %.3f MiB; peak RSS %.1f MiB; KV cache %.1f MiB\n", r, R, ds.kv / 1048576.0, ds.kv_keys, vis,
            ds.index / 1048576.0, ds.partial / 1048576.0, ds.logits / 1048576.0, mib(dhsa_proc_peak_rss()),
            mib(dhsa_session_get_plan(s)->kv_cache));
    fflush(stderr);
    dhsa_cli_dist_wire w = dhsa_cli_dist_wire_sum(&ds);
    double rss = dhsa_cli_dist_max((double)dhsa_proc_peak_rss()), tp = dhsa_cli_dist_max(t_prompt);
    int same = dhsa_cli_dist_same_ids(ids, n_ids);
    if (r != 0) return same;
    char stxt[96], wtxt[512];
    int k = snprintf(stxt, sizeof stxt, stripe ? "%lld" : "contiguous", (long long)stripe);
    if (fetch > 0 && k > 0) snprintf(stxt + k, sizeof stxt - (size_t)k, ", fetch budget %g", fetch);
    const int64_t n_dec = n_ids - n_prompt > 1 ? n_ids - n_prompt - 1 : 0;
    fprintf(stderr, "dist: %d ranks, stripe %s; on the wire (all ranks): %s; slowest prefill %.3f s; largest peak "
            "RSS %.1f MiB\n", R, stxt, dhsa_cli_dist_wire_text(&w, L, n_prompt, n_dec, wtxt, sizeof wtxt), tp,
            rss / 1048576.0);
    fprintf(stderr, same ? "dist: every rank generated the same %lld token ids\n"
                         : "dist: THE RANKS GENERATED DIFFERENT TOKEN IDS (%lld)\n", (long long)n_ids);
    return same;
}

static int run_main(int argc, char **argv, int plan_only) {
    const dhsa_dist *dist = plan_only ? NULL : dhsa_cli_dist_begin(&argc, &argv);
    run_opts o;
    parse(argc, argv, &o);
    if (o.json && o.ids) dhsa_cli_die(EXIT_USAGE, "--ids prints token ids; --json / --json-schema constrain text: give one");
    if (o.json) o.no_echo = 1; /* stdout is the JSON value alone */
    /* the schema before the model: a refused one costs no load */
    dhsa_json_schema *schema = o.json ? dhsa_cli_json_schema(o.json_schema ? "--json-schema" : "--json",
                                                             o.json_schema) : NULL;
    o.ses.dist = dist;
    if (!dist) dhsa_cli_dist_fetch_needs_ranks(o.ses.dist_fetch_share);
    if (dist && o.prompt_cache)
        dhsa_cli_die(EXIT_USAGE, "--prompt-cache: a context-parallel run holds its cache in shares across the ranks; "
                     "it is not saved");
    dhsa_model_params mp = dhsa_model_default_params();
    mp.tokenizer_path = o.tokenizer;
    dhsa_model *m;
    double t_load = dhsa_cli_now();
    if (dhsa_model_load(o.model, &mp, &m)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
    t_load = dhsa_cli_now() - t_load;
    const dhsa_model_info *in = dhsa_model_get_info(m);
    const dhsa_tokenizer *tok = dhsa_model_tokenizer(m);
    dhsa_predictor *pred = NULL;
    if (o.predictor_path) {
        pred = dhsa_cli_load_predictor(o.predictor_path, in->n_head_kv * in->head_dim_k, o.model);
        o.ses.router.predictor = pred;
    }

    /* the prompt */
    char *text = NULL;
    int64_t text_len = 0;
    if (o.prompt_file) {
        int64_t ctx_tokens = o.ses.n_ctx ? o.ses.n_ctx : in->n_ctx_train;
        char why[160];
        snprintf(why, sizeof why, "the most text a context of %lld tokens can hold (%s)", (long long)ctx_tokens,
                 o.ses.n_ctx ? "--ctx" : "the trained context; a longer prompt needs --ctx");
        text = dhsa_cli_slurp("-f", o.prompt_file, dhsa_cli_text_limit(tok, ctx_tokens), why, &text_len);
    }
    else if (o.prompt) {
        text_len = (int64_t)strlen(o.prompt);
        text = malloc((size_t)text_len + 1);
        if (!text) dhsa_cli_die(EXIT_RUN, "out of memory");
        memcpy(text, o.prompt, (size_t)text_len + 1);
    }
    unsigned flags = dhsa_tokenizer_default_flags(tok) & DHSA_TOKENIZE_ADD_BOS;
    if (o.no_bos) flags &= ~DHSA_TOKENIZE_ADD_BOS;
    int32_t stop_ids[8];
    int n_stop = 0;
    if (dhsa_tokenizer_eos(tok) >= 0) stop_ids[n_stop++] = dhsa_tokenizer_eos(tok);
    chat_prompt chat, *chat_p = NULL;
    if (o.chat) {
        chat_setup(dhsa_model_gguf(m), tok, o.template_name, o.system, text, &chat, stop_ids, &n_stop,
                   (int)(sizeof stop_ids / sizeof stop_ids[0]));
        if (chat.t != DHSA_CHAT_NONE) chat_p = &chat;
    }
    int64_t n_prompt = 0;
    if (prompt_ids(tok, chat_p, text, text_len, flags, NULL, 0, &n_prompt) != DHSA_OK && n_prompt == 0)
        dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
    int64_t n_text_ids = n_prompt;
    if (plan_only && o.prompt_tokens) n_prompt = o.prompt_tokens;
    if (n_prompt == 0) dhsa_cli_die(EXIT_RUN, "the prompt is empty and the vocabulary adds no BOS: give -p TEXT");
    const int64_t max_ctx = (int64_t)1 << 31; /* what a session holds */
    const int ctx_set = o.ses.n_ctx != 0;
    if (!ctx_set) {
        /* the context the run needs: the prompt and -n tokens (llama.cpp
         * sizes to the trained context; a 32K F32 cache for a one-line
         * prompt is most of a small model's plan) */
        if (n_prompt + o.n_predict > max_ctx)
            dhsa_cli_die(EXIT_USAGE,
                         "-n %lld: the prompt's %lld tokens and -n tokens must fit one context of at most 2^31 "
                         "(%lld) tokens, so -n may be at most %lld here (or give --ctx: generation stops when "
                         "it is full)",
                         (long long)o.n_predict, (long long)n_prompt, (long long)max_ctx,
                         (long long)(max_ctx - n_prompt));
        o.ses.n_ctx = n_prompt + o.n_predict;
    }
    /* ids: the prompt, then what is generated until -n or a full context */
    int64_t cap = (n_prompt + o.n_predict < o.ses.n_ctx ? n_prompt + o.n_predict : o.ses.n_ctx) + 1;
    if (cap < n_text_ids + 1) cap = n_text_ids + 1;
    int32_t *ids = malloc((size_t)cap * sizeof(int32_t));
    if (!ids) dhsa_cli_die(EXIT_RUN, "out of memory for %lld tokens", (long long)cap);
    if (prompt_ids(tok, chat_p, text, text_len, flags, ids, cap, &n_text_ids))
        dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
    if (o.ses.n_ctx > in->n_ctx_train)
        fprintf(stderr, "dhsa %s: warning: context %lld is longer than the model's trained context %lld: quality "
                "may drop\n", dhsa_cli_command(), (long long)o.ses.n_ctx, (long long)in->n_ctx_train);
    if (n_prompt > o.ses.n_ctx)
        dhsa_cli_die(EXIT_RUN, "the prompt has %lld tokens but --ctx is %lld", (long long)n_prompt, (long long)o.ses.n_ctx);

    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = (int)o.threads;
    dhsa_ctx *ctx;
    if (dhsa_ctx_create(&cp, &ctx)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
    /* The sampler and the logits before the plan: written now, they are
     * resident when it measures the process, so --mem-limit counts them. */
    dhsa_sampler *smp;
    if (dhsa_sampler_create(&o.sp, in->n_vocab, &smp)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
    dhsa_json_vocab *jvocab = NULL;
    dhsa_json_constraint *jc = NULL;
    if (schema && (dhsa_json_vocab_create(tok, &jvocab) || dhsa_json_constraint_create(schema, jvocab, &jc)))
        dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
    float *logits = malloc((size_t)in->n_vocab * sizeof(float));
    if (!logits) dhsa_cli_die(EXIT_RUN, "out of memory");
    volatile float *touch = logits; /* a memset after malloc would become calloc: no page touched */
    for (int64_t i = 0; i < in->n_vocab; i++) touch[i] = 0.0f;
    /* the routing every entry point runs for the tokens this run holds
     * (dhsa_router_params_for), with the options given over it */
    const int64_t run_len = cap - 1;
    dhsa_cli_router_fill(&o.ses.router, run_len, o.ses.router.density);
    dhsa_mem_plan plan;
    dhsa_status st = fit_plan(ctx, m, &o, ctx_set, n_prompt, &plan);
    if (plan_only) {
        dhsa_cli_print_model(stdout, o.model, m, in);
        printf("attention: %s, KV %s, %d threads\n", dhsa_attn_method_name(o.ses.attn),
               dhsa_type_name(o.ses.kv_type), dhsa_ctx_n_threads(ctx));
        if (st) plan_failed(st, &o.ses);
        if (o.ses.attn != DHSA_ATTN_DENSE) dhsa_cli_print_router(stdout, &o.ses.router, run_len);
        print_plan(stdout, &plan, dhsa_ctx_n_threads(ctx));
        if (o.ses.mem_limit) {
            char lim[32];
            printf("  --mem-limit       %14s: fits\n", dhsa_cli_bytes((double)o.ses.mem_limit, lim, sizeof lim));
        }
        free(logits);
        dhsa_sampler_free(smp);
        dhsa_json_constraint_free(jc);
        dhsa_json_vocab_free(jvocab);
        dhsa_json_schema_free(schema);
        dhsa_ctx_free(ctx);
        dhsa_model_free(m);
        dhsa_predictor_free(pred);
        free(ids);
        free(text);
        return 0;
    }
    if (st) plan_failed(st, &o.ses);
    if (o.verbose) {
        dhsa_cli_print_model(stderr, o.model, m, in);
        fprintf(stderr, "attention: %s, KV %s, %d threads, %s; loaded in %.2f s\n", dhsa_attn_method_name(o.ses.attn),
                dhsa_type_name(o.ses.kv_type), dhsa_ctx_n_threads(ctx), dhsa_isa_name(dhsa_active_isa()), t_load);
        char routes[256];
        if (dhsa_model_routes(m, o.ses.exact, routes, sizeof routes) == DHSA_OK)
            fprintf(stderr, "weight products%s: %s\n", o.ses.exact ? " (--exact)" : "", routes);
        print_plan(stderr, &plan, dhsa_ctx_n_threads(ctx));
    }
    double t0 = dhsa_cli_now();
    if (isatty(2) && n_prompt >= 1024) {
        o.ses.progress = progress;
        o.ses.progress_user = &t0;
    }
    layout_dump dump;
    memset(&dump, 0, sizeof dump);
    if (o.dump_path) dump_begin(&dump, &o, in, n_prompt, &o.ses);
    dhsa_session *s;
    if ((st = dhsa_session_create(ctx, m, &o.ses, &s))) plan_failed(st, &o.ses);
    if (o.verbose && o.ses.attn != DHSA_ATTN_DENSE) {
        dhsa_router_params used;
        if (dhsa_session_get_router(s, &used) == DHSA_OK) dhsa_cli_print_router(stderr, &used, run_len);
    }

    if (o.ids) {
        for (int64_t i = 0; i < n_prompt; i++) printf("%s%d", i ? " " : "", ids[i]);
        fflush(stdout);
    } else if (!o.no_echo && !o.chat) { /* a chat shows only the reply */
        for (int64_t i = 0; i < n_prompt; i++) emit(tok, ids[i], i == 0 || (i == 1 && ids[0] == dhsa_tokenizer_bos(tok)));
    }
    t0 = dhsa_cli_now();
    dump.active = 1;
    int64_t reused = 0;
    int have_logits = 0;
    if (o.prompt_cache && !plan_only) reused = dhsa_cli_cache_load(s, o.prompt_cache, ids, n_prompt, logits, &have_logits);
    if (!have_logits && dhsa_session_eval(s, ids + reused, n_prompt - reused, logits))
        dhsa_cli_die(EXIT_RUN, "%s", dump.error[0] ? dump.error : dhsa_last_error());
    dump.active = 0;
    if (o.prompt_cache && !have_logits) {
        double t_save = dhsa_cli_now();
        dhsa_cli_cache_save(s, o.prompt_cache, ids, n_prompt, logits);
        t0 += dhsa_cli_now() - t_save; /* the save is not the prompt's time */
    }
    dhsa_attn_stats st_prefill;
    dhsa_session_get_stats(s, &st_prefill, NULL);
    double t_prompt = dhsa_cli_now() - t0, t_first = 0;
    int64_t n_gen = 0, n_dec = 0, n_mask = 0;
    double t_dec = 0, t_mask = 0;
    FILE *lf = NULL;
    if (o.logits_path && (!dist || dist->rank == 0) && !(lf = fopen(o.logits_path, "wb")))
        dhsa_cli_die(EXIT_RUN, "--logits-out %s: %s", o.logits_path, strerror(errno));
    while (n_gen < o.n_predict) {
        int32_t next;
        if (lf && fwrite(logits, sizeof(float), (size_t)in->n_vocab, lf) != (size_t)in->n_vocab)
            dhsa_cli_die(EXIT_RUN, "--logits-out %s: write failed", o.logits_path);
        if (jc) { /* the ids that cannot continue the JSON text go (the end ids until it is complete) */
            double tm = dhsa_cli_now();
            if (dhsa_json_constraint_mask(jc, logits, stop_ids, o.ignore_eos ? 0 : n_stop, NULL))
                dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
            t_mask += dhsa_cli_now() - tm;
            n_mask++;
        }
        if (dhsa_sampler_sample(smp, logits, ids, n_prompt + n_gen, &next)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
        if (n_gen == 0) t_first = dhsa_cli_now() - t0;
        int stop = 0;
        for (int i = 0; i < n_stop; i++) stop |= next == stop_ids[i];
        if (stop && !o.ignore_eos) break;
        if (jc && dhsa_json_constraint_accept(jc, next)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
        ids[n_prompt + n_gen++] = next;
        if (o.ids) {
            printf(" %d", next);
            fflush(stdout);
        } else {
            emit(tok, next, n_prompt + n_gen == 1);
        }
        if (jc && dhsa_json_constraint_finished(jc)) break; /* the value closed: nothing may follow */
        if (n_gen == o.n_predict) break;
        if (dhsa_session_length(s) >= plan.n_ctx) {
            fprintf(stderr, "\ndhsa %s: the context is full (%lld tokens)\n", dhsa_cli_command(), (long long)plan.n_ctx);
            break;
        }
        double t2 = dhsa_cli_now();
        if (dhsa_session_eval(s, &next, 1, logits)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
        t_dec += dhsa_cli_now() - t2;
        n_dec++;
    }
    if (lf && fclose(lf)) dhsa_cli_die(EXIT_RUN, "--logits-out %s: write failed", o.logits_path);
    printf("\n");
    fflush(stdout);
    if (stats_need_newline()) fputc('\n', stderr);
    if (o.dump_path) dump_end(&dump, o.model, in, n_prompt, plan.n_ubatch);
    if (o.ses.attn != DHSA_ATTN_DENSE) density_report(&st_prefill, s, &o.ses);
    int same = dist ? dist_report(s, in, ids, n_prompt + n_gen, n_prompt, t_prompt, o.ses.dist_stripe,
                                  o.ses.dist_fetch_share) : 1;
    /* Decode speed is defined only when a decode step ran: the first token
     * comes from the prefill's logits, so -n 1 has none ("n/a", not 0). */
    char dec_rate[48];
    if (t_dec > 0 && n_dec > 0) snprintf(dec_rate, sizeof dec_rate, "%.1f tok/s", (double)n_dec / t_dec);
    else snprintf(dec_rate, sizeof dec_rate, "n/a tok/s (no decode step)");
    char reused_text[64] = "";
    if (reused) snprintf(reused_text, sizeof reused_text, " (%lld from the prompt cache)", (long long)reused);
    fprintf(stderr,
            "prompt: %lld tokens%s in %.3f s (%.1f tok/s), first token after %.3f s; decode: %lld tokens, %s; "
            "all forward passes: %.1f tok/s; peak RSS %.1f MiB (%zu KiB)",
            (long long)n_prompt, reused_text, t_prompt, t_prompt > 0 ? (double)n_prompt / t_prompt : 0.0, t_first,
            (long long)n_gen, dec_rate,
            t_prompt + t_dec > 0 ? (double)(n_prompt + n_dec) / (t_prompt + t_dec) : 0.0, mib(dhsa_proc_peak_rss()),
            dhsa_proc_peak_rss() >> 10);
    if (o.ses.mem_limit) {
        char lim[32], pl[32];
        fprintf(stderr, " under --mem-limit %s (plan %s)", dhsa_cli_bytes((double)o.ses.mem_limit, lim, sizeof lim),
                dhsa_cli_bytes((double)dhsa_session_get_plan(s)->total, pl, sizeof pl));
    }
    if (jc) fprintf(stderr, "; JSON mask %.3f ms per token", n_mask ? 1e3 * t_mask / (double)n_mask : 0.0);
    fprintf(stderr, "\n");
    /* a value -n or the context cut short is not JSON: said, and the exit status 1 */
    const int json_cut = jc && !dhsa_json_constraint_can_end(jc);
    if (json_cut)
        fprintf(stderr, "dhsa %s: generation stopped (finish: length, after %lld tokens) before the JSON value was "
                "complete: the output is not valid JSON (raise -n)\n", dhsa_cli_command(), (long long)n_gen);
    dhsa_json_constraint_free(jc);
    dhsa_json_vocab_free(jvocab);
    dhsa_json_schema_free(schema);
    free(logits);
    dhsa_sampler_free(smp);
    dhsa_session_free(s);
    dhsa_ctx_free(ctx);
    dhsa_predictor_free(pred);
    dhsa_model_free(m);
    free(ids);
    free(text);
    dhsa_cli_dist_finish();
    return same && !json_cut ? 0 : 1;
}

int dhsa_cli_run(int argc, char **argv) {
    dhsa_cli_set_command("run", NULL);
    return run_main(argc, argv, 0);
}

int dhsa_cli_plan(int argc, char **argv) {
    dhsa_cli_set_command("plan", NULL);
    return run_main(argc, argv, 1);
}

/* ------------------------------------------------------- bench model --- */

