/* eval.c: `dhsa eval fidelity|copy|niah`, quality of the sparse attention
 * methods on a real model, each against dense in the same process.
 *
 *   fidelity  next-token KL(dense || method), top-1 agreement, perplexity of
 *             both, attention recall per layer and the density really used,
 *             over windows of a text file
 *   copy      in-context copying: a random passage early, filler, the
 *             passage again; how much lower the loss is on the repetition
 *             (works with tiny models that have induction heads)
 *   niah      needle in a haystack for instruction models: a needle
 *             sentence at each depth, the question through the chat
 *             template, scored by whether the greedy answer has the number
 *
 * Every method of a command runs with the same routing parameters, scaled
 * to the evaluated length unless given (docs/eval.md says which and why).
 * The measurements are the library's (include/dhsa.h "Evaluation" block:
 * dhsa_eval_fidelity, dhsa_eval_generate, dhsa_eval_retrieval,
 * dhsa_eval_copy, dhsa_niah_build; the layer hook of src/eval/probe.c);
 * this file parses the options, reads the input files, draws the copy
 * passages and NIAH numbers, calls them and prints tables, JSON and heat
 * maps (tools/lib/svg.c).
 * Tested by tests/test_eval.c (CLI part through DHSA_CLI, on stories260K).
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "dhsa.h"
#include "eval/niah.h"
#include "lib/svg.h"

#define EXIT_RUN DHSA_EXIT_RUN
#define EXIT_USAGE DHSA_EXIT_USAGE
#define MAX_LIST 16

const char dhsa_cli_eval_usage[] =
    "usage: dhsa eval fidelity [-m MODEL] -f TEXT [--attn METHOD,...] [--density F,...] [--ctx N] [options]\n"
    "       dhsa eval copy [-m MODEL] [--lengths 512,1K,...] [--depths 0.1,...] [options]\n"
    "       dhsa eval niah [-m MODEL] [--lengths ...] [--depths ...] [--haystack FILE] [options]\n"
    "       dhsa eval passkey|multikey|multivalue [-m MODEL] [--lengths ...] [--depths ...]\n"
    "                      [--filler FILE] [--keywords FILE] [--trials N] [options]\n"
    "       dhsa eval ruler [-m MODEL] [--tasks LIST] [--lengths 4K,...] [--depths ...] [--samples N]\n"
    "                      [--split dev|test] [--out FILE.tsv] [options]\n"
    "\n"
    "fidelity: the text is tokenized and cut into windows of --ctx tokens (BOS\n"
    "  first); each window runs dense and then every method; prints per method\n"
    "  and density: next-token KL(dense || method) in nats, top-1 agreement,\n"
    "  perplexity of the method and of dense, the same KL and top-1 over the\n"
    "  second half of each window (where the budget binds), attention recall\n"
    "  per layer, and the density used (selected / available keys).\n"
    "copy: per length and depth, [BOS] filler, a passage of --passage random\n"
    "  tokens at the depth, filler, the passage again at the end. Score = mean\n"
    "  loss on the first occurrence minus mean loss on the repetition (nats per\n"
    "  token, the passage's first token left out). A method keeps the copy where\n"
    "  dense's score is at least --min-score and the method's is at least half\n"
    "  of dense's. Filler: --filler FILE, or stories sampled from the model\n"
    "  itself (fixed seed).\n"
    "niah: per length and depth, a haystack (built-in sentences or --haystack\n"
    "  FILE) with \"The secret number is NNNN.\" at the depth, then the question\n"
    "  through the chat template (or a plain completion prompt), a greedy answer\n"
    "  of up to --answer-tokens tokens; a hit when it states the number.\n"
    "\n"
    "Model and run:\n"
    "  -m MODEL            GGUF file, or a llama2.c checkpoint with --tokenizer FILE\n"
    "                      (default: the shipped models/" DHSA_DEFAULT_MODEL ")\n"
    "  -t, --threads T     (default: online CPUs)\n"
    "  --attn LIST         dense,dhsa,block,stream,oracle (default: all; fidelity:\n"
    "                      dhsa,block,stream; dense always runs as the reference)\n"
    "  --density LIST      densities (default 0.125)   --budget N: keys per block\n"
    "  --boundary fixed|similarity|learned:FILE   dhsa's boundaries (default similarity)\n"
    "Routing (dhsa_router_params_for(L, density), as every command; docs/dhsa.md):\n"
    "  --q-block N  --sink N  --local N  --dense-below N  --min-chunk N\n"
    "  --max-chunk N  --chunk N (block's)  --sim-window N  --nms-window N\n"
    "  --score pooled|moments|heads|bound|rows  --score-rows N (rows: 0 = all)\n"
    "  --sink-window N (sinks: best of the first N keys; 0: first)\n"
    "fidelity:\n"
    "  -f FILE             the text   -c, --ctx N  window (default: trained context)\n"
    "  --windows N         most windows (default 8)\n"
    "copy and niah:\n"
    "  --lengths LIST      tokens (default 512,1K,2K,4K)\n"
    "  --depths LIST       where the first copy / needle sits, 0..1\n"
    "                      (default 0.05,0.25,0.5,0.75,0.95)\n"
    "  --trials N          passages / needles per cell (default 2)\n"
    "  --seed S            (default 1)\n"
    "  --svg FILE          heat map (length x depth, a panel per method)\n"
    "  --passage N         copy: passage tokens (default 32)\n"
    "  --passage-kind K    copy: tokens (random ordinary tokens, default), words\n"
    "                      (random whole-word tokens) or text (model-sampled text)\n"
    "  --svg-attn FILE     copy: heat map of the share of dense's attention on the\n"
    "                      first copy that each method keeps\n"
    "  --min-score S       copy: dense must reach this score (default 1.0 nats)\n"
    "  --filler FILE       copy: filler text instead of model samples; passkey etc.: the filler\n"
    "  --haystack FILE     niah: haystack text instead of the built-in sentences\n"
    "  --answer-tokens N   niah: longest answer (default 12)\n"
    "  --template auto|plain|NAME  niah: chat template (auto: the model's when its\n"
    "                      GGUF has tokenizer.chat_template, else a plain prompt)\n"
    "  --show              niah: print every answer\n"
    "Output:\n"
    "  --json              one JSON object instead of the tables\n";

/* The retrieval tasks' part (one literal may hold at most 4095 bytes). */
const char dhsa_cli_eval_usage_tasks[] =
    "passkey, multikey, multivalue: the tasks the default model was trained on\n"
    "  (dhsa.h Retrieval tasks block: exact strings), built to each length with\n"
    "  the asked needle at each depth over --filler FILE (default: the built-in\n"
    "  sentences, repeated), held-out numbers, keywords from --keywords FILE (one\n"
    "  a line; default a built-in list); --trials keys per cell (default 2), the\n"
    "  greedy answer (up to --answer-tokens, default 12; multivalue 40) must state\n"
    "  the numbers in order. Every miss of a sparse method is printed with the\n"
    "  share of the needle's number keys each layer selected for the answer rows.\n"
    "  --keys N: multikey needles (default 4) / multivalue values (default 3).\n"
    "ruler: RULER-style tasks (dhsa.h dhsa_ruler_*; docs/eval.md \"eval ruler\"), scored as RULER\n"
    "  scores them (share of expected strings in the answer, case-insensitive).\n"
    "  --tasks LIST        single_noise,single_prose,single_uuid,single_word,multikey,\n"
    "                      multikey_needles,multikey_uuid,multivalue,multiquery,vt,cwe,fwe\n"
    "                      (default: all; without --tasks those whose data is missing are\n"
    "                      skipped, saying why)\n"
    "  --lengths LIST      prompt tokens (default 4K)   --depths LIST (default 0,0.25,0.5,0.75,1)\n"
    "  --samples N         prompts per cell (= --trials; default 2)   --seed S (default 1)\n"
    "  --split dev|test    disjoint pools of values, words and filler (default test;\n"
    "                      choose parameters on dev only)\n"
    "  --out FILE.tsv      every answer as it finishes (task, length, depth, method,\n"
    "                      prompt tokens, expected, got, score); rerun the same command\n"
    "                      to resume: finished answers are skipped\n"
    "  --prose-dir DIR     prose haystack (default /usr/share/doc/gnu-standards: apt-get\n"
    "                      install gnu-standards)   --words FILE: cwe's words (default\n"
    "                      /usr/share/dict/words: apt-get install wamerican)\n"
    "  --template auto|plain|NAME, --answer-tokens N (default RULER's per task), --show\n";

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) dhsa_cli_die(EXIT_RUN, "out of memory (%zu bytes)", n);
    return p;
}

/* A text input of eval (-f, --filler, --haystack, --keywords): corpora,
 * of which the commands use a prefix or repeat a short one; up to the
 * tokenizer's limit, checked before reading. */
static char *read_text(const char *opt, const char *path, int64_t *len) {
    return dhsa_cli_slurp(opt, path, DHSA_TOKENIZER_MAX_TEXT, "the most text the tokenizer takes", len);
}

/* ------------------------------------------------------------- options --- */

/* One method at one density: a row of the tables, a panel of the heat maps.
 * Dense runs once whatever the densities. */
typedef struct {
    dhsa_attn_method method;
    double density;
    char name[48];
} variant;

#define MAX_VAR (MAX_LIST * MAX_LIST)

typedef struct {
    const char *model, *tokenizer, *text_file, *filler_file, *haystack_file, *svg, *svg_attn, *template_name;
    const char *predictor_path, *keywords_file;
    const char *tasks, *out_path, *prose_dir, *words_path; /* ruler */
    int split;                                             /* ruler: dhsa_ruler_split */
    int64_t n_keys;
    int answer_tokens_set;
    int64_t threads, ctx, windows, passage, trials, answer_tokens, budget;
    uint64_t seed;
    dhsa_attn_method methods[MAX_LIST];
    int n_methods;
    double densities[MAX_LIST];
    int n_densities;
    int64_t lengths[MAX_LIST];
    int n_lengths;
    double depths[MAX_LIST];
    int n_depths;
    double min_score;
    dhsa_boundary boundary;
    /* routing overrides; -1 = the scaled default */
    int64_t q_block, sink, local, dense_below, min_chunk, max_chunk, chunk, sim_window, nms_window;
    int score; /* dhsa_chunk_score, -1 = the library default */
    int64_t score_rows; /* -1 = the default */
    int64_t sink_window; /* -1 = the default */
    int json, show, passage_kind; /* 0 tokens, 1 words, 2 text */
    variant var[MAX_VAR];
    int n_var;
    dhsa_predictor *predictor;
} eval_opts;

static dhsa_attn_method parse_method(const char *v) {
    for (dhsa_attn_method m = DHSA_ATTN_DENSE; m <= DHSA_ATTN_ORACLE; m++)
        if (strcmp(v, dhsa_attn_method_name(m)) == 0) return m;
    dhsa_cli_die(EXIT_USAGE, "--attn takes dense, dhsa, block, stream or oracle, not \"%s\"", v);
    return DHSA_ATTN_DENSE;
}

static const char *method_label(const eval_opts *o, dhsa_attn_method m);

static void parse(int argc, char **argv, eval_opts *o, const char *sub) {
    memset(o, 0, sizeof *o);
    o->windows = 8;
    o->passage = 32;
    o->trials = 2;
    o->answer_tokens = 12;
    o->seed = 1;
    o->min_score = 1.0;
    o->boundary = DHSA_BOUNDARY_SIMILARITY;
    o->q_block = o->sink = o->local = o->dense_below = o->min_chunk = o->max_chunk = o->chunk = o->sim_window =
        o->nms_window = -1;
    o->score = -1;
    o->split = DHSA_RULER_TEST;
    o->score_rows = -1;
    o->sink_window = -1;
    char buf[1024], *items[MAX_LIST];
    for (int i = 3; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(dhsa_cli_eval_usage, stdout);
            fputs(dhsa_cli_eval_usage_tasks, stdout);
            exit(0);
        }
        if (strcmp(a, "--json") == 0) { o->json = 1; continue; }
        if (strcmp(a, "--show") == 0) { o->show = 1; continue; }
        if (i + 1 >= argc) dhsa_cli_die(EXIT_USAGE, "%s needs a value (or is unknown: see dhsa help eval)", a);
        const char *v = argv[++i];
        if (strcmp(a, "-m") == 0 || strcmp(a, "--model") == 0) o->model = dhsa_cli_model_arg(v);
        else if (strcmp(a, "--tokenizer") == 0) o->tokenizer = v;
        else if (strcmp(a, "-f") == 0 || strcmp(a, "--file") == 0) o->text_file = v;
        else if (strcmp(a, "--filler") == 0) o->filler_file = v;
        else if (strcmp(a, "--haystack") == 0) o->haystack_file = v;
        else if (strcmp(a, "--passage-kind") == 0) {
            if (strcmp(v, "words") == 0) o->passage_kind = 1;
            else if (strcmp(v, "tokens") == 0) o->passage_kind = 0;
            else if (strcmp(v, "text") == 0) o->passage_kind = 2;
            else dhsa_cli_die(EXIT_USAGE, "--passage-kind is words or tokens, not \"%s\"", v);
        }
        else if (strcmp(a, "--svg") == 0) o->svg = v;
        else if (strcmp(a, "--svg-attn") == 0) o->svg_attn = v;
        else if (strcmp(a, "--template") == 0) o->template_name = v;
        else if (strcmp(a, "--threads") == 0 || strcmp(a, "-t") == 0) o->threads = dhsa_cli_threads(a, v);
        else if (strcmp(a, "--ctx") == 0 || strcmp(a, "-c") == 0) o->ctx = dhsa_cli_int(a, v, 2, (int64_t)1 << 24, 1);
        else if (strcmp(a, "--windows") == 0) o->windows = dhsa_cli_int(a, v, 1, 1 << 20, 0);
        else if (strcmp(a, "--passage") == 0) o->passage = dhsa_cli_int(a, v, 2, 4096, 0);
        else if (strcmp(a, "--trials") == 0) o->trials = dhsa_cli_int(a, v, 1, 1000, 0);
        else if (strcmp(a, "--answer-tokens") == 0) {
            o->answer_tokens = dhsa_cli_int(a, v, 1, 1024, 0);
            o->answer_tokens_set = 1;
        }
        else if (strcmp(a, "--keywords") == 0) o->keywords_file = v;
        else if (strcmp(a, "--tasks") == 0) o->tasks = v;
        else if (strcmp(a, "--out") == 0) o->out_path = v;
        else if (strcmp(a, "--prose-dir") == 0) o->prose_dir = v;
        else if (strcmp(a, "--words") == 0) o->words_path = v;
        else if (strcmp(a, "--samples") == 0) o->trials = dhsa_cli_int(a, v, 1, 100000, 0);
        else if (strcmp(a, "--split") == 0) {
            if (strcmp(v, "dev") == 0) o->split = DHSA_RULER_DEV;
            else if (strcmp(v, "test") == 0) o->split = DHSA_RULER_TEST;
            else dhsa_cli_die(EXIT_USAGE, "--split is dev or test, not \"%s\"", v);
        }
        else if (strcmp(a, "--keys") == 0) o->n_keys = dhsa_cli_int(a, v, 1, DHSA_TASK_MAX_NEEDLES, 0);
        else if (strcmp(a, "--seed") == 0) o->seed = (uint64_t)dhsa_cli_int(a, v, 0, INT64_MAX, 0);
        else if (strcmp(a, "--min-score") == 0) o->min_score = dhsa_cli_real(a, v, 0, 100);
        else if (strcmp(a, "--budget") == 0) o->budget = dhsa_cli_int(a, v, 1, (int64_t)1 << 31, 1);
        else if (strcmp(a, "--q-block") == 0) o->q_block = dhsa_cli_int(a, v, 1, 65536, 0);
        else if (strcmp(a, "--sink") == 0) o->sink = dhsa_cli_int(a, v, 0, (int64_t)1 << 31, 1);
        else if (strcmp(a, "--local") == 0) o->local = dhsa_cli_int(a, v, 0, (int64_t)1 << 31, 1);
        else if (strcmp(a, "--dense-below") == 0) o->dense_below = dhsa_cli_int(a, v, 0, (int64_t)1 << 31, 1);
        else if (strcmp(a, "--min-chunk") == 0) o->min_chunk = dhsa_cli_int(a, v, 1, 1 << 20, 0);
        else if (strcmp(a, "--max-chunk") == 0) o->max_chunk = dhsa_cli_int(a, v, 1, 1 << 20, 0);
        else if (strcmp(a, "--chunk") == 0) o->chunk = dhsa_cli_int(a, v, 1, 1 << 20, 0);
        else if (strcmp(a, "--sim-window") == 0) o->sim_window = dhsa_cli_int(a, v, 1, 4096, 0);
        else if (strcmp(a, "--nms-window") == 0) o->nms_window = dhsa_cli_int(a, v, 0, 4096, 0);
        else if (strcmp(a, "--score") == 0) o->score = dhsa_cli_chunk_score(a, v);
        else if (strcmp(a, "--score-rows") == 0) o->score_rows = dhsa_cli_int(a, v, 0, 1 << 20, 0);
        else if (strcmp(a, "--sink-window") == 0) o->sink_window = dhsa_cli_int(a, v, 0, 4096, 0);
        else if (strcmp(a, "--boundary") == 0) {
            if (strcmp(v, "fixed") == 0) o->boundary = DHSA_BOUNDARY_FIXED;
            else if (strcmp(v, "similarity") == 0) o->boundary = DHSA_BOUNDARY_SIMILARITY;
            else if (strncmp(v, "learned:", 8) == 0 && v[8]) {
                o->boundary = DHSA_BOUNDARY_LEARNED;
                o->predictor_path = v + 8;
            } else dhsa_cli_die(EXIT_USAGE, "--boundary is fixed, similarity or learned:FILE, not \"%s\"", v);
        } else if (strcmp(a, "--attn") == 0) {
            o->n_methods = dhsa_cli_split_list(a, v, buf, sizeof buf, items, MAX_LIST);
            for (int k = 0; k < o->n_methods; k++) o->methods[k] = parse_method(items[k]);
        } else if (strcmp(a, "--density") == 0) {
            o->n_densities = dhsa_cli_split_list(a, v, buf, sizeof buf, items, MAX_LIST);
            for (int k = 0; k < o->n_densities; k++) o->densities[k] = dhsa_cli_real(a, items[k], 1e-6, 1);
        } else if (strcmp(a, "--lengths") == 0) {
            o->n_lengths = dhsa_cli_split_list(a, v, buf, sizeof buf, items, MAX_LIST);
            for (int k = 0; k < o->n_lengths; k++) o->lengths[k] = dhsa_cli_int(a, items[k], 16, (int64_t)1 << 24, 1);
        } else if (strcmp(a, "--depths") == 0) {
            o->n_depths = dhsa_cli_split_list(a, v, buf, sizeof buf, items, MAX_LIST);
            for (int k = 0; k < o->n_depths; k++) o->depths[k] = dhsa_cli_real(a, items[k], 0, 1);
        } else dhsa_cli_die(EXIT_USAGE, "unknown option \"%s\" (see dhsa help eval)", a);
    }
    if (!o->model) {
        char msg[512];
        o->model = dhsa_cli_default_model(msg, sizeof msg);
        if (!o->model) dhsa_cli_die(EXIT_USAGE, "%s", msg);
        fprintf(stderr, "dhsa: model %s (the default; -m MODEL for another)\n", o->model);
    }
    if (strcmp(sub, "fidelity") == 0 && !o->text_file) dhsa_cli_die(EXIT_USAGE, "fidelity needs -f TEXT");
    if (!o->n_methods) {
        static const dhsa_attn_method fid[] = {DHSA_ATTN_DHSA, DHSA_ATTN_BLOCK, DHSA_ATTN_STREAM};
        static const dhsa_attn_method all[] = {DHSA_ATTN_DENSE, DHSA_ATTN_DHSA, DHSA_ATTN_BLOCK, DHSA_ATTN_STREAM,
                                               DHSA_ATTN_ORACLE};
        int fidelity = strcmp(sub, "fidelity") == 0;
        o->n_methods = fidelity ? 3 : 5;
        memcpy(o->methods, fidelity ? fid : all, (size_t)o->n_methods * sizeof o->methods[0]);
    }
    if (o->budget && o->n_densities > 0)
        dhsa_cli_die(EXIT_USAGE, "give --density or --budget, not both (--budget sets the keys per query block; "
                     "--density the share of the keys it may see)");
    dhsa_cli_check_tokenizer(o->model, o->tokenizer);
    /* the figures' files, before any work */
    if (o->svg) dhsa_cli_check_output("--svg", o->svg);
    if (o->svg_attn) dhsa_cli_check_output("--svg-attn", o->svg_attn);
    if (!o->n_densities) o->densities[o->n_densities++] = 0.125;
    int ruler = strcmp(sub, "ruler") == 0;
    if (ruler && !o->n_lengths) o->lengths[o->n_lengths++] = 4096;
    if (ruler && !o->n_depths) {
        static const double def[] = {0, 0.25, 0.5, 0.75, 1};
        memcpy(o->depths, def, sizeof def);
        o->n_depths = 5;
    }
    if (o->out_path) dhsa_cli_check_output("--out", o->out_path);
    if (!o->n_lengths) {
        static const int64_t def[] = {512, 1024, 2048, 4096};
        memcpy(o->lengths, def, sizeof def);
        o->n_lengths = 4;
    }
    if (!o->n_depths) {
        static const double def[] = {0.05, 0.25, 0.5, 0.75, 0.95};
        memcpy(o->depths, def, sizeof def);
        o->n_depths = 5;
    }
    for (int mi = 0; mi < o->n_methods; mi++)
        for (int dn = 0; dn < o->n_densities; dn++) {
            int dense = o->methods[mi] == DHSA_ATTN_DENSE;
            if (dense && dn > 0) continue;
            variant *v = &o->var[o->n_var++];
            v->method = o->methods[mi];
            v->density = dense ? 1.0 : o->densities[dn];
            const char *name = method_label(o, v->method);
            if (dense || o->n_densities == 1) snprintf(v->name, sizeof v->name, "%s", name);
            else snprintf(v->name, sizeof v->name, "%s %.3g", name, v->density);
        }
}

/* The routing a method runs with at length L: the scaled defaults of
 * docs/eval.md unless an option set a value. */
static dhsa_router_params router_for(const eval_opts *o, int64_t L, double density) {
    dhsa_router_params rp = dhsa_eval_router_params(L, density);
    if (o->q_block >= 0) rp.q_block = o->q_block;
    if (o->sink >= 0) rp.sink_tokens = o->sink;
    if (o->local >= 0) rp.local_tokens = o->local;
    if (o->dense_below >= 0) rp.dense_below = o->dense_below;
    if (o->min_chunk >= 0) rp.min_chunk = o->min_chunk;
    if (o->max_chunk >= 0) rp.max_chunk = o->max_chunk;
    if (o->chunk >= 0) rp.chunk = o->chunk;
    if (o->sim_window >= 0) rp.sim_window = o->sim_window;
    if (o->nms_window >= 0) rp.nms_window = o->nms_window;
    rp.budget_tokens = o->budget;
    rp.boundary = o->boundary == DHSA_BOUNDARY_FIXED ? DHSA_BOUNDARY_SIMILARITY : o->boundary;
    rp.predictor = o->predictor;
    if (o->score >= 0) rp.score_mode = (dhsa_chunk_score)o->score;
    if (o->score_rows >= 0) rp.score_rows = o->score_rows;
    if (o->sink_window >= 0) rp.sink_window = o->sink_window;
    return rp;
}

/* A method as evaluated: dhsa with fixed boundaries is the block baseline. */
static dhsa_attn_method effective(const eval_opts *o, dhsa_attn_method m) {
    return m == DHSA_ATTN_DHSA && o->boundary == DHSA_BOUNDARY_FIXED ? DHSA_ATTN_BLOCK : m;
}

static const char *method_label(const eval_opts *o, dhsa_attn_method m) {
    if (m == DHSA_ATTN_DHSA && o->boundary == DHSA_BOUNDARY_LEARNED) return "dhsa-learned";
    return dhsa_attn_method_name(effective(o, m));
}

static void print_router(FILE *f, const dhsa_router_params *rp, int64_t L) { dhsa_cli_print_router(f, rp, L); }

/* ------------------------------------------------------------ sessions --- */

typedef struct {
    dhsa_ctx *ctx;
    dhsa_model *m;
    const dhsa_model_info *in;
    const dhsa_tokenizer *tok;
    eval_opts *o;
    int warned_ctx;
} eval_env;

/* The method of a variant at length L, as the library evaluates it. */
static dhsa_eval_method eval_method(const eval_opts *o, dhsa_attn_method m, double density, int64_t L) {
    dhsa_eval_method me = {effective(o, m), router_for(o, L, density)};
    return me;
}

/* The warning (once) for a cache longer than the model was trained on. */
static void warn_ctx(eval_env *e, int64_t n_ctx) {
    if (n_ctx > e->in->n_ctx_train && !e->warned_ctx) {
        fprintf(stderr, "dhsa %s: warning: context %lld is longer than the model's trained context %lld: quality "
                "may drop (dense included)\n", dhsa_cli_command(), (long long)n_ctx, (long long)e->in->n_ctx_train);
        e->warned_ctx = 1;
    }
}

/* Every eval --json output: one object on stdout, numbers "%.6g" unless a
 * field gives its own format (a non-finite one is null), strings with
 * invalid UTF-8 replaced by U+FFFD (a model's answer may hold byte tokens)
 * so the document always parses. Opened here; json_end adds the run's
 * seconds and closes it. */
static void json_begin(dhsa_cli_json *j) {
    dhsa_cli_json_init(j, stdout, DHSA_CLI_JSON_CHECK_UTF8, "%.6g");
    dhsa_cli_json_object(j, NULL);
}

/* "cells": accuracy and density used per method, depth and length (niah
 * and the retrieval tasks). */
static void json_cells(dhsa_cli_json *j, const eval_opts *o, const char *const *names, int n_var,
                       const double *hits, const double *dens) {
    const int nD = o->n_depths, nL = o->n_lengths;
    dhsa_cli_json_array(j, "cells");
    for (int v = 0; v < n_var; v++)
        for (int di = 0; di < nD; di++)
            for (int li = 0; li < nL; li++) {
                size_t cell = ((size_t)v * nD + di) * nL + li;
                dhsa_cli_json_object(j, NULL);
                dhsa_cli_json_str(j, "method", names[v]);
                dhsa_cli_json_int(j, "length", o->lengths[li]);
                dhsa_cli_json_numf(j, "depth", "%g", o->depths[di]);
                dhsa_cli_json_numf(j, "accuracy", "%.4f", hits[cell]);
                dhsa_cli_json_numf(j, "density_used", "%.4f", dens[cell]);
                dhsa_cli_json_close(j);
            }
    dhsa_cli_json_close(j);
}

static void json_end(dhsa_cli_json *j, double secs) {
    dhsa_cli_json_numf(j, "seconds", "%.3f", secs);
    dhsa_cli_json_close(j);
}

/* ------------------------------------------------------------ fidelity --- */

static int cmd_fidelity(eval_env *e) {
    eval_opts *o = e->o;
    const int64_t NL = e->in->n_layer;
    int64_t len;
    char *text = read_text("-f", o->text_file, &len);
    int64_t n_text = 0;
    dhsa_tokenize(e->tok, text, len, 0, NULL, 0, &n_text);
    int32_t *stream = xmalloc((size_t)(n_text + 1) * sizeof(int32_t));
    if (dhsa_tokenize(e->tok, text, len, 0, stream, n_text + 1, &n_text)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
    free(text);
    const int n_var = o->n_var;
    int64_t W = o->ctx ? o->ctx : e->in->n_ctx_train;
    dhsa_eval_method *methods = xmalloc((size_t)n_var * sizeof *methods);
    dhsa_eval_fidelity_result *res = xmalloc((size_t)n_var * sizeof *res);
    double *rec = xmalloc((size_t)n_var * (size_t)NL * sizeof(double));
    for (int vi = 0; vi < n_var; vi++) {
        methods[vi] = eval_method(o, o->var[vi].method, o->var[vi].density, W);
        res[vi].recall = rec + (size_t)vi * (size_t)NL;
    }
    dhsa_eval_fidelity_params fp = dhsa_eval_fidelity_default_params();
    fp.window = W;
    fp.max_windows = o->windows;
    warn_ctx(e, W);
    dhsa_eval_fidelity_info info;
    double t0 = dhsa_cli_now();
    if (dhsa_eval_fidelity(e->ctx, e->m, stream, n_text, &fp, methods, n_var, res, &info)) {
        if (strncmp(dhsa_last_error(), "the text has", 12) == 0)
            dhsa_cli_die(EXIT_RUN, "%s (give a longer text or a smaller --ctx)", dhsa_last_error());
        dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
    }
    double secs = dhsa_cli_now() - t0;
    dhsa_cli_json j = {0};
    if (o->json) {
        json_begin(&j);
        dhsa_cli_json_str(&j, "command", "fidelity");
        dhsa_cli_json_str(&j, "model", o->model);
        dhsa_cli_json_str(&j, "text", o->text_file);
        dhsa_cli_json_int(&j, "ctx", W);
        dhsa_cli_json_int(&j, "windows", info.n_windows);
        dhsa_cli_json_num(&j, "ppl_dense", info.ppl_dense);
        dhsa_cli_json_array(&j, "results");
    } else {
        printf("fidelity: %s, %lld windows of %lld tokens from %s (%lld tokens)\n", o->model, (long long)info.n_windows,
               (long long)W, o->text_file, (long long)n_text);
        dhsa_router_params rp = router_for(o, W, o->densities[0]);
        print_router(stdout, &rp, W);
        printf("dense perplexity %.4f over %.0f predicted tokens; %.1f s\n\n", info.ppl_dense,
               (double)info.n_predicted, secs);
        printf("| method | density | used | KL nats | top-1 | ppl | ppl dense | used 2nd half | KL 2nd half | "
               "top-1 2nd half |");
        for (int64_t l = 0; l < NL; l++) printf(" recall L%lld |", (long long)l);
        printf("\n|---|---|---|---|---|---|---|---|---|---|");
        for (int64_t l = 0; l < NL; l++) printf("---|");
        printf("\n");
    }
    for (int vi = 0; vi < n_var; vi++) {
        const variant *va = &o->var[vi];
        const dhsa_eval_fidelity_result *r = &res[vi];
        const char *name = method_label(o, va->method);
        int dense = va->method == DHSA_ATTN_DENSE;
        if (o->json) {
            dhsa_cli_json_object(&j, NULL);
            dhsa_cli_json_str(&j, "method", name);
            dhsa_cli_json_numf(&j, "density", "%g", o->budget && !dense ? 0.0 : va->density);
            dhsa_cli_json_numf(&j, "density_used", "%.6f", r->density_used);
            dhsa_cli_json_num(&j, "kl", r->kl);
            dhsa_cli_json_numf(&j, "top1", "%.6f", r->top1);
            dhsa_cli_json_numf(&j, "ppl", "%.6f", r->ppl);
            dhsa_cli_json_numf(&j, "ppl_dense", "%.6f", r->ppl_dense);
            dhsa_cli_json_numf(&j, "density_used_late", "%.6f", r->density_used_late);
            dhsa_cli_json_num(&j, "kl_late", r->kl_late);
            dhsa_cli_json_numf(&j, "top1_late", "%.6f", r->top1_late);
            dhsa_cli_json_array(&j, "recall");
            for (int64_t l = 0; l < NL; l++) dhsa_cli_json_num(&j, NULL, r->recall[l]);
            dhsa_cli_json_close(&j);
            dhsa_cli_json_close(&j);
        } else {
            char dens[32];
            if (dense) snprintf(dens, sizeof dens, "1");
            else if (o->budget) snprintf(dens, sizeof dens, "%lld keys", (long long)o->budget);
            else snprintf(dens, sizeof dens, "%.3g", va->density);
            printf("| %s | %s | %.3f | %.4f | %.3f | %.4f | %.4f | %.3f | %.4f | %.3f |", name, dens, r->density_used,
                   r->kl, r->top1, r->ppl, r->ppl_dense, r->density_used_late, r->kl_late, r->top1_late);
            for (int64_t l = 0; l < NL; l++) printf(" %.3f |", r->recall[l]);
            printf("\n");
        }
    }
    if (o->json) {
        dhsa_cli_json_close(&j); /* results */
        json_end(&j, secs);
    }
    free(methods);
    free(res);
    free(rec);
    free(stream);
    return 0;
}

/* ---------------------------------------------------------------- prng --- */

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* ---------------------------------------------------------------- copy --- */

/* Filler: the tokens of --filler FILE, or stories sampled from the model
 * (temperature 1, the sampler's other defaults, a fresh session of 256
 * tokens per piece; BOS and EOS are dropped so the stories run on). At
 * least `need` tokens. */
static int32_t *make_filler(eval_env *e, int64_t need, uint64_t seed, int from_file, int64_t *n_out) {
    int32_t *f = xmalloc((size_t)need * sizeof(int32_t));
    int64_t n = 0;
    if (from_file) {
        int64_t len, nt = 0;
        char *text = read_text("--filler", e->o->filler_file, &len);
        dhsa_tokenize(e->tok, text, len, 0, NULL, 0, &nt);
        int32_t *t = xmalloc((size_t)(nt + 1) * sizeof(int32_t));
        if (dhsa_tokenize(e->tok, text, len, 0, t, nt + 1, &nt)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
        if (nt == 0) dhsa_cli_die(EXIT_RUN, "the filler file \"%s\" has no tokens", e->o->filler_file);
        while (n < need) { /* repeated when short */
            int64_t k = nt < need - n ? nt : need - n;
            memcpy(f + n, t, (size_t)k * sizeof(int32_t));
            n += k;
        }
        free(t);
        free(text);
        *n_out = n;
        return f;
    }
    if (dhsa_eval_sample_tokens(e->ctx, e->m, need, seed, f)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
    *n_out = need;
    return f;
}

typedef struct {
    double first, rep, score, density; /* means over trials */
    double cover, mass, kept, ctl;     /* first copy: keys selected, dense mass on it, share of that kept;
                                          dense mass on the control span */
} copy_cell;

static void write_heatmap(const eval_opts *o, const char *title, const char *subtitle, const char *scale_label,
                          double lo, double hi, int digits, const double *values /* [var][depth][length] */,
                          const char *const *names, int n_var) {
    dhsa_heatmap *h = dhsa_heatmap_create(title, "length (tokens)", "depth", o->n_lengths, o->n_depths);
    if (!h) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
    char lbuf[MAX_LIST][32], dbuf[MAX_LIST][32];
    const char *ll[MAX_LIST], *dl[MAX_LIST];
    for (int i = 0; i < o->n_lengths; i++) {
        if (o->lengths[i] % 1024 == 0) snprintf(lbuf[i], sizeof lbuf[i], "%lldK", (long long)(o->lengths[i] / 1024));
        else snprintf(lbuf[i], sizeof lbuf[i], "%lld", (long long)o->lengths[i]);
        ll[i] = lbuf[i];
    }
    for (int i = 0; i < o->n_depths; i++) {
        snprintf(dbuf[i], sizeof dbuf[i], "%.0f%%", 100.0 * o->depths[i]);
        dl[i] = dbuf[i];
    }
    dhsa_status st = dhsa_heatmap_set_labels(h, DHSA_AXIS_X, ll);
    if (!st) st = dhsa_heatmap_set_labels(h, DHSA_AXIS_Y, dl);
    if (!st) st = dhsa_heatmap_set_scale(h, lo, hi, scale_label);
    if (!st) st = dhsa_heatmap_set_subtitle(h, subtitle);
    dhsa_heatmap_set_digits(h, digits);
    for (int v = 0; v < n_var && !st; v++)
        st = dhsa_heatmap_add_panel(h, names[v], values + (size_t)v * o->n_depths * o->n_lengths);
    if (!st) st = dhsa_heatmap_save(h, o->svg);
    if (st) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
    dhsa_heatmap_free(h);
    if (!o->json) printf("wrote %s\n", o->svg);
}

static int cmd_copy(eval_env *e) {
    eval_opts *o = e->o;
    const int64_t V = e->in->n_vocab, P = o->passage;
    int64_t max_len = 0;
    for (int i = 0; i < o->n_lengths; i++) {
        if (o->lengths[i] < 2 * P + 2) dhsa_cli_die(EXIT_USAGE, "length %lld is too short for two passages of %lld tokens",
                                           (long long)o->lengths[i], (long long)P);
        if (o->lengths[i] > max_len) max_len = o->lengths[i];
    }
    /* the passage vocabulary: ordinary tokens only */
    int32_t *normal = xmalloc((size_t)V * sizeof(int32_t));
    int64_t n_normal = 0;
    if (dhsa_eval_passage_tokens(e->tok, o->passage_kind == 1, normal, V, &n_normal))
        dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
    if (n_normal < 2) dhsa_cli_die(EXIT_RUN, "the vocabulary has fewer than 2 ordinary tokens");
    double t0 = dhsa_cli_now();
    int64_t n_fill;
    int32_t *filler = make_filler(e, max_len, o->seed, o->filler_file != NULL, &n_fill);
    if (!o->json) {
        printf("copy: %s; passage %lld random tokens (of %lld ordinary ones), %lld trials; filler: %s\n", o->model,
               (long long)P, (long long)n_normal, (long long)o->trials,
               o->filler_file ? o->filler_file : "stories sampled from the model (temperature 1)");
        for (int i = 0; i < o->n_lengths; i++) {
            dhsa_router_params rp = router_for(o, o->lengths[i], o->densities[0]);
            print_router(stdout, &rp, o->lengths[i]);
        }
    }
    const int n_var = o->n_var, nL = o->n_lengths, nD = o->n_depths;
    copy_cell *cells = calloc((size_t)n_var * nL * nD, sizeof *cells);
    int32_t *ids = xmalloc((size_t)max_len * sizeof(int32_t)), *passage = xmalloc((size_t)P * sizeof(int32_t));
    if (!cells) dhsa_cli_die(EXIT_RUN, "out of memory");
    int32_t bos = dhsa_tokenizer_bos(e->tok);
    for (int64_t tr = 0; tr < o->trials; tr++) {
        uint64_t rs = o->seed * 7919u + (uint64_t)tr;
        if (o->passage_kind == 2) { /* model text: P tokens from the middle of a sampled story */
            int64_t nt;
            int32_t *t = make_filler(e, 100 + P, o->seed + 1000 + (uint64_t)tr, 0, &nt);
            memcpy(passage, t + 100, (size_t)P * sizeof(int32_t));
            free(t);
        } else {
            for (int64_t i = 0; i < P; i++) passage[i] = normal[splitmix(&rs) % (uint64_t)n_normal];
        }
        for (int li = 0; li < nL; li++)
            for (int di = 0; di < nD; di++) {
                /* [BOS] F1 passage F2 passage, F1 = depth share of the filler */
                dhsa_eval_copy_layout at;
                if (dhsa_eval_copy_sequence(filler, n_fill, passage, P, o->lengths[li], o->depths[di], bos, ids, &at))
                    dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
                for (int v = 0; v < n_var; v++) {
                    copy_cell *c = &cells[((size_t)v * nD + di) * nL + li];
                    dhsa_eval_method me = eval_method(o, o->var[v].method, o->var[v].density, o->lengths[li]);
                    warn_ctx(e, at.n_ids);
                    dhsa_eval_copy_result r;
                    if (dhsa_eval_copy(e->ctx, e->m, &me, ids, &at, &r)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
                    c->cover += r.copy_keys_selected / (double)o->trials;
                    c->mass += r.copy_mass / (double)o->trials;
                    c->kept += r.copy_mass_kept / (double)o->trials;
                    c->ctl += r.control_mass / (double)o->trials;
                    c->first += r.first_loss / (double)o->trials;
                    c->rep += r.rep_loss / (double)o->trials;
                    c->score += r.score / (double)o->trials;
                    c->density += r.density_used / (double)o->trials;
                }
            }
    }
    double secs = dhsa_cli_now() - t0;
    /* dense's cells, when dense ran, decide "kept" */
    int dense_var = -1;
    const char *names[MAX_VAR];
    for (int v = 0; v < n_var; v++) {
        if (o->var[v].method == DHSA_ATTN_DENSE && dense_var < 0) dense_var = v;
        names[v] = o->var[v].name;
    }
    dhsa_cli_json j = {0};
    if (o->json) {
        json_begin(&j);
        dhsa_cli_json_str(&j, "command", "copy");
        dhsa_cli_json_str(&j, "model", o->model);
        dhsa_cli_json_int(&j, "passage", P);
        dhsa_cli_json_int(&j, "trials", o->trials);
        dhsa_cli_json_numf(&j, "min_score", "%g", o->min_score);
        dhsa_cli_json_array(&j, "cells");
    }
    for (int v = 0; v < n_var; v++) {
        int dense = o->var[v].method == DHSA_ATTN_DENSE;
        if (!o->json) {
            double used = 0;
            for (int k = 0; k < nD * nL; k++) used += cells[(size_t)v * nD * nL + k].density / (nD * nL);
            printf("\n%s", names[v]);
            if (!dense && o->budget) printf(" (budget %lld keys, density used %.3f)", (long long)o->budget, used);
            else if (!dense) printf(" (density %.3g, used %.3f)", o->var[v].density, used);
            if (dense)
                printf(": loss drop (nats/token) / attention mass of the repetition's queries on the first copy "
                       "(on as many filler keys nearby)\n\n| depth |");
            else
                printf(": loss drop (nats/token) / share of dense's mass on the first copy on keys the method "
                       "selects; * kept, x lost\n\n| depth |");
            for (int li = 0; li < nL; li++) printf(" %lld |", (long long)o->lengths[li]);
            printf("\n|---|");
            for (int li = 0; li < nL; li++) printf("---|");
            printf("\n");
        }
        for (int di = 0; di < nD; di++) {
            if (!o->json) printf("| %.2f |", o->depths[di]);
            for (int li = 0; li < nL; li++) {
                const copy_cell *c = &cells[((size_t)v * nD + di) * nL + li];
                const copy_cell *d = dense_var >= 0 ? &cells[((size_t)dense_var * nD + di) * nL + li] : NULL;
                /* by the loss: dense copies, the method keeps half of its drop */
                int kept = d && d->score >= o->min_score && c->score >= 0.5 * d->score;
                int na = !d || d->score < o->min_score;
                /* by attention: dense attends the copy (twice the control), the method keeps half of it */
                int attended = d && d->mass >= 2.0 * d->ctl, kept_attn = c->kept >= 0.5;
                if (o->json) {
                    dhsa_cli_json_object(&j, NULL);
                    dhsa_cli_json_str(&j, "method", method_label(o, o->var[v].method));
                    dhsa_cli_json_numf(&j, "density", "%g", o->var[v].density);
                    dhsa_cli_json_int(&j, "length", o->lengths[li]);
                    dhsa_cli_json_numf(&j, "depth", "%g", o->depths[di]);
                    dhsa_cli_json_numf(&j, "first_loss", "%.5f", c->first);
                    dhsa_cli_json_numf(&j, "rep_loss", "%.5f", c->rep);
                    dhsa_cli_json_numf(&j, "score", "%.5f", c->score);
                    dhsa_cli_json_numf(&j, "density_used", "%.5f", c->density);
                    dhsa_cli_json_numf(&j, "copy_keys_selected", "%.5f", c->cover);
                    dhsa_cli_json_numf(&j, "copy_mass", "%.5f", c->mass);
                    dhsa_cli_json_numf(&j, "control_mass", "%.5f", c->ctl);
                    dhsa_cli_json_numf(&j, "copy_mass_kept", "%.5f", c->kept);
                    if (na) dhsa_cli_json_null(&j, "kept_loss");
                    else dhsa_cli_json_bool(&j, "kept_loss", kept);
                    if (!attended) dhsa_cli_json_null(&j, "kept_attention");
                    else dhsa_cli_json_bool(&j, "kept_attention", kept_attn);
                    dhsa_cli_json_close(&j);
                } else if (dense) {
                    printf(" %.2f%s / %.1f%% (%.1f%%) |", c->score, na ? "" : "*", 100.0 * c->mass, 100.0 * c->ctl);
                } else {
                    printf(" %.2f%s / %.0f%%%s |", c->score, na ? "" : kept ? "*" : "x", 100.0 * c->kept,
                           !attended ? "" : kept_attn ? "*" : "x");
                }
            }
            if (!o->json) printf("\n");
        }
        if (!o->json && !dense) { /* summary over the cells where dense attends the first copy */
            double share = 0, drop = 0;
            int cnt = 0, kept_n = 0;
            for (int k = 0; k < nD * nL; k++) {
                const copy_cell *c = &cells[(size_t)v * nD * nL + k];
                const copy_cell *d = dense_var >= 0 ? &cells[(size_t)dense_var * nD * nL + k] : NULL;
                if (d && d->mass < 2.0 * d->ctl) continue;
                share += c->kept;
                drop += c->score;
                kept_n += c->kept >= 0.5;
                cnt++;
            }
            if (cnt)
                printf("\nover the %d cells%s: mean share kept %.3f, kept in %d; mean loss drop %.3f\n", cnt,
                       dense_var >= 0 ? " where dense attends the first copy" : "", share / cnt, kept_n,
                       drop / cnt);
        }
    }
    if (o->json) {
        dhsa_cli_json_close(&j); /* cells */
        json_end(&j, secs);
    } else
        printf("\n%.1f s. Marks: after the loss drop, * where dense's drop is >= %.2f and the method's at least "
                "half of it (x: less); after the share, * where dense puts at least twice the control's mass on the "
                "first copy and the method keeps at least half of it (x: less). No mark: dense does not copy / "
                "attend (or did not run).\n", secs, o->min_score);
    if (o->svg_attn) {
        double *vals = xmalloc((size_t)n_var * nD * nL * sizeof(double));
        for (size_t i = 0; i < (size_t)n_var * nD * nL; i++) {
            /* n/a where dense does not attend the first copy (less than twice the control's mass) */
            const copy_cell *d = dense_var >= 0 ? &cells[(size_t)dense_var * nD * nL + i % ((size_t)nD * nL)] : NULL;
            vals[i] = d && d->mass < 2.0 * d->ctl ? NAN : cells[i].kept;
        }
        char sub[256];
        snprintf(sub, sizeof sub, "%s; passage %lld tokens, %lld trials; density %.3g; n/a: dense does not attend "
                 "the first copy", o->model, (long long)P, (long long)o->trials, o->densities[0]);
        const char *keep = o->svg;
        o->svg = o->svg_attn;
        write_heatmap(o, "Copy retrieval: share of the attention on the first copy that each method keeps", sub,
                      "share", 0, 1, 2, vals, names, n_var);
        o->svg = keep;
        free(vals);
    }
    if (o->svg) {
        double *vals = xmalloc((size_t)n_var * nD * nL * sizeof(double)), hi = 0;
        for (size_t i = 0; i < (size_t)n_var * nD * nL; i++) {
            vals[i] = cells[i].score;
            if (vals[i] > hi) hi = vals[i];
        }
        char sub[256];
        snprintf(sub, sizeof sub, "%s; passage %lld tokens, %lld trials; density %.3g", o->model, (long long)P,
                 (long long)o->trials, o->densities[0]);
        write_heatmap(o, "Copy retrieval: loss drop on the repeated passage (nats/token)", sub, "nats",
                      0, hi > 0 ? ceil(hi) : 1, 1, vals, names, n_var);
        free(vals);
    }
    free(cells);
    free(ids);
    free(passage);
    free(filler);
    free(normal);
    return 0;
}

/* ---------------------------------------------------------------- niah --- */


/* The prompt format of niah and ruler (--template): auto takes the
 * model's chat template when its GGUF has one dhsa writes, else a plain
 * completion prompt; *why says which and why. */
static dhsa_chat_template pick_template(eval_env *e, const char **why) {
    const eval_opts *o = e->o;
    const dhsa_gguf *g = dhsa_model_gguf(e->m);
    dhsa_chat_template tmpl;
    if (!o->template_name || strcmp(o->template_name, "auto") == 0) {
        if (g && dhsa_gguf_find_kv(g, "tokenizer.chat_template") >= 0) {
            const char *how;
            if (dhsa_chat_choose(g, &tmpl, &how) == DHSA_OK) {
                *why = "the model's chat template, checked against jinja2";
            } else {
                tmpl = DHSA_CHAT_NONE;
                *why = "the model's template is not one dhsa renders exactly (dhsa run --chat says which format "
                       "is closest; give --template NAME to use it): plain prompt";
            }
        } else {
            tmpl = DHSA_CHAT_NONE;
            *why = "the model has no chat template (tokenizer.chat_template): plain completion prompt";
        }
    } else if (strcmp(o->template_name, "plain") == 0) {
        tmpl = DHSA_CHAT_NONE;
        *why = "--template plain";
    } else {
        if (dhsa_chat_template_from_name(o->template_name, &tmpl)) dhsa_cli_die(EXIT_USAGE, "%s", dhsa_last_error());
        *why = "--template";
    }
    return tmpl;
}

static int cmd_niah(eval_env *e) {
    eval_opts *o = e->o;
    /* the haystack's sentences */
    char *file_text = NULL, **sent;
    int64_t n_sent;
    if (o->haystack_file) {
        int64_t len;
        file_text = read_text("--haystack", o->haystack_file, &len);
        n_sent = dhsa__split_sentences(file_text, len, &sent);
        if (n_sent < 0) dhsa_cli_die(EXIT_RUN, "out of memory");
        if (n_sent == 0) dhsa_cli_die(EXIT_RUN, "the haystack file \"%s\" has no sentences", o->haystack_file);
    } else {
        const char *const *builtin_haystack = dhsa_task_builtin_sentences(&n_sent);
        sent = xmalloc((size_t)n_sent * sizeof(char *));
        for (int64_t i = 0; i < n_sent; i++) sent[i] = (char *)builtin_haystack[i];
    }
    /* the prompt format */
    struct {
        dhsa_chat_template tmpl; /* NONE: plain prompt */
    } np;
    const char *tmpl_why;
    np.tmpl = pick_template(e, &tmpl_why);
    if (!o->json) {
        printf("niah: %s; haystack: %s (%lld sentences); prompt: %s (%s); %lld trials, answers of up to %lld "
               "tokens, greedy\n", o->model, o->haystack_file ? o->haystack_file : "built-in sentences",
               (long long)n_sent, np.tmpl == DHSA_CHAT_NONE ? "plain" : dhsa_chat_template_name(np.tmpl), tmpl_why,
               (long long)o->trials, (long long)o->answer_tokens);
        for (int i = 0; i < o->n_lengths; i++) {
            dhsa_router_params rp = router_for(o, o->lengths[i], o->densities[0]);
            print_router(stdout, &rp, o->lengths[i]);
        }
    }
    const int n_var = o->n_var, nL = o->n_lengths, nD = o->n_depths;
    size_t n_cells = (size_t)n_var * nD * nL;
    double *hits = calloc(n_cells, sizeof(double)), *dens = calloc(n_cells, sizeof(double));
    double *plen = calloc((size_t)nL, sizeof(double));
    if (!hits || !dens || !plen) dhsa_cli_die(EXIT_RUN, "out of memory");
    int64_t cap_ans = o->answer_tokens;
    dhsa_eval_answer *res = xmalloc(sizeof *res);
    double t0 = dhsa_cli_now();
    dhsa_cli_json j = {0};
    if (o->json) {
        json_begin(&j);
        dhsa_cli_json_str(&j, "command", "niah");
        dhsa_cli_json_str(&j, "model", o->model);
        dhsa_cli_json_str(&j, "template", np.tmpl == DHSA_CHAT_NONE ? "plain" : dhsa_chat_template_name(np.tmpl));
        dhsa_cli_json_int(&j, "trials", o->trials);
        dhsa_cli_json_array(&j, "answers");
    }
    for (int64_t tr = 0; tr < o->trials; tr++)
        for (int li = 0; li < nL; li++)
            for (int di = 0; di < nD; di++) {
                uint64_t rs = o->seed * 104729u + (uint64_t)(tr * 4096 + li * 64 + di);
                char number[16], needle[64];
                snprintf(number, sizeof number, "%04u", (unsigned)(1000 + splitmix(&rs) % 9000));
                snprintf(needle, sizeof needle, "The secret number is %s.", number);
                dhsa_niah_params npar = dhsa_niah_default_params();
                npar.length = o->lengths[li];
                npar.depth = o->depths[di];
                npar.needle = needle;
                npar.sentences = (const char *const *)sent;
                npar.n_sentences = n_sent;
                npar.tmpl = np.tmpl;
                dhsa_niah_prompt pr;
                if (dhsa_niah_build(e->tok, &npar, &pr)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
                const int32_t *ids = pr.ids;
                const int64_t n_ids = pr.n_ids;
                const double depth_used = pr.depth_used;
                plen[li] += (double)n_ids / (double)(o->trials * nD);
                for (int v = 0; v < n_var; v++) {
                    const variant *va = &o->var[v];
                    dhsa_eval_answer_params ap = dhsa_eval_answer_default_params();
                    ap.method = eval_method(o, va->method, va->density, o->lengths[li]);
                    ap.max_tokens = cap_ans;
                    ap.stop = pr.stop;
                    ap.n_stop = pr.n_stop;
                    warn_ctx(e, n_ids + cap_ans);
                    if (dhsa_eval_generate(e->ctx, e->m, ids, n_ids, &ap, res))
                        dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
                    const char *answer = res->text;
                    int64_t alen = (int64_t)strlen(answer);
                    int hit = dhsa_niah_answer_has(answer, alen, number) == 1;
                    size_t cell = ((size_t)v * nD + di) * nL + li;
                    hits[cell] += hit / (double)o->trials;
                    dens[cell] += res->density_used / (double)o->trials;
                    if (o->json) {
                        dhsa_cli_json_object(&j, NULL);
                        dhsa_cli_json_str(&j, "method", method_label(o, va->method));
                        dhsa_cli_json_numf(&j, "density", "%g", va->density);
                        dhsa_cli_json_int(&j, "length", o->lengths[li]);
                        dhsa_cli_json_int(&j, "prompt_tokens", n_ids);
                        dhsa_cli_json_numf(&j, "depth", "%g", o->depths[di]);
                        dhsa_cli_json_numf(&j, "needle_depth", "%.4f", depth_used);
                        dhsa_cli_json_int(&j, "trial", tr);
                        dhsa_cli_json_str(&j, "number", number);
                        dhsa_cli_json_str(&j, "answer", answer);
                        dhsa_cli_json_bool(&j, "hit", hit);
                        dhsa_cli_json_close(&j);
                    } else if (o->show) {
                        printf("%-8s L %5lld depth %.2f (at %.3f) number %s: %s \"%s\"\n", va->name,
                               (long long)n_ids, o->depths[di], depth_used,
                               number, hit ? "HIT " : "miss", answer);
                    }
                }
                dhsa_niah_free(&pr);
            }
    double secs = dhsa_cli_now() - t0;
    const char *names[MAX_VAR] = {0};
    for (int v = 0; v < n_var; v++) names[v] = o->var[v].name;
    if (o->json) {
        dhsa_cli_json_close(&j);
        json_cells(&j, o, names, n_var, hits, dens);
        json_end(&j, secs);
    } else {
        for (int v = 0; v < n_var; v++) {
            printf("\n%s: share of answers with the number (density used in brackets)\n\n| depth |", names[v]);
            for (int li = 0; li < nL; li++) printf(" %lld (%.0f) |", (long long)o->lengths[li], plen[li]);
            printf("\n|---|");
            for (int li = 0; li < nL; li++) printf("---|");
            printf("\n");
            for (int di = 0; di < nD; di++) {
                printf("| %.2f |", o->depths[di]);
                for (int li = 0; li < nL; li++) {
                    size_t cell = ((size_t)v * nD + di) * nL + li;
                    printf(" %.2f [%.3f] |", hits[cell], dens[cell]);
                }
                printf("\n");
            }
        }
        printf("\n(column heads: target length (mean prompt tokens)); %.1f s\n", secs);
    }
    if (o->svg) {
        char sub[256];
        snprintf(sub, sizeof sub, "%s; %s prompt; %lld trials; density %.3g", o->model,
                 np.tmpl == DHSA_CHAT_NONE ? "plain" : dhsa_chat_template_name(np.tmpl), (long long)o->trials,
                 o->densities[0]);
        write_heatmap(o, "Needle in a haystack: share of answers with the number", sub, "accuracy", 0, 1, 2, hits,
                      names, n_var);
    }
    free(res);
    free(hits);
    free(dens);
    free(plen);
    free(sent);
    free(file_text);
    return 0;
}

/* ----------------------------------------------------------- retrieval --- */

static char **read_lines(const char *path, int64_t *n_out, char **buf_out) {
    int64_t len;
    char *text = read_text("--keywords", path, &len);
    int64_t cap = 1024, n = 0;
    char **l = xmalloc((size_t)cap * sizeof(char *));
    for (char *p = text, *e; p < text + len; p = e + 1) {
        e = memchr(p, '\n', (size_t)(text + len - p));
        if (!e) e = text + len;
        *e = 0;
        if (e > p && e[-1] == '\r') e[-1] = 0;
        if (!*p) continue;
        if (n == cap) {
            cap *= 2;
            char **nl = realloc(l, (size_t)cap * sizeof(char *));
            if (!nl) dhsa_cli_die(EXIT_RUN, "out of memory");
            l = nl;
        }
        l[n++] = p;
    }
    *n_out = n;
    *buf_out = text;
    return l;
}

static int cmd_retrieval(eval_env *e, dhsa_task_kind kind) {
    eval_opts *o = e->o;
    /* filler and keywords */
    char *file_text = NULL, *kw_text = NULL, **kw = NULL;
    int64_t flen = 0, n_kw = 0;
    const char *fill_name;
    if (o->filler_file) {
        file_text = read_text("--filler", o->filler_file, &flen);
        fill_name = o->filler_file;
    } else {
        file_text = NULL; /* dhsa_task_build uses its built-in sentences */
        fill_name = "built-in sentences (repeated; --filler FILE for real text)";
    }
    if (o->keywords_file) kw = read_lines(o->keywords_file, &n_kw, &kw_text);
    int64_t cap_ans = o->answer_tokens_set ? o->answer_tokens : kind == DHSA_TASK_MULTIVALUE ? 40 : 12;
    if (!o->json) {
        printf("%s: %s; filler: %s; keywords: %s; %lld keys per cell, greedy answers of up to %lld tokens; held-out "
               "numbers\n", dhsa_task_kind_name(kind), o->model, fill_name,
               o->keywords_file ? o->keywords_file : "built-in", (long long)o->trials, (long long)cap_ans);
        for (int i = 0; i < o->n_lengths; i++) {
            dhsa_router_params rp = router_for(o, o->lengths[i], o->densities[0]);
            print_router(stdout, &rp, o->lengths[i]);
        }
    }
    const int n_var = o->n_var, nL = o->n_lengths, nD = o->n_depths;
    size_t n_cells = (size_t)n_var * nD * nL;
    double *hits = calloc(n_cells, sizeof(double)), *dens = calloc(n_cells, sizeof(double));
    double *plen = calloc((size_t)nL, sizeof(double));
    if (!hits || !dens || !plen) dhsa_cli_die(EXIT_RUN, "out of memory");
    dhsa_eval_answer *res = xmalloc(sizeof *res);
    /* misses explained: per variant, misses where every layer selected the needle fully, partly, not at all */
    int64_t *miss_all = calloc((size_t)n_var * 3, sizeof(int64_t));
    double *chunk_sum = calloc((size_t)n_var * 2, sizeof(double)); /* per variant: mean_chunk sum, count */
    if (!miss_all || !chunk_sum) dhsa_cli_die(EXIT_RUN, "out of memory");
    double t0 = dhsa_cli_now();
    dhsa_cli_json j = {0};
    if (o->json) {
        json_begin(&j);
        dhsa_cli_json_str(&j, "command", dhsa_task_kind_name(kind));
        dhsa_cli_json_str(&j, "model", o->model);
        dhsa_cli_json_str(&j, "filler", fill_name);
        dhsa_cli_json_int(&j, "trials", o->trials);
        dhsa_cli_json_array(&j, "answers");
    }
    for (int64_t tr = 0; tr < o->trials; tr++)
        for (int li = 0; li < nL; li++)
            for (int di = 0; di < nD; di++) {
                dhsa_task_params tp = dhsa_task_default_params();
                tp.kind = kind;
                tp.length = o->lengths[li];
                tp.depth = o->depths[di];
                tp.seed = o->seed * 1000003u + (uint64_t)(tr * 4096 + li * 64 + di);
                tp.filler = file_text;
                tp.filler_len = flen;
                tp.keywords = (const char *const *)kw;
                tp.n_keywords = n_kw;
                if (o->n_keys) tp.n_keys = (int)o->n_keys;
                dhsa_task t;
                if (dhsa_task_build(e->tok, &tp, &t)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
                plen[li] += (double)t.n_ids / (double)(o->trials * nD);
                for (int v = 0; v < n_var; v++) {
                    const variant *va = &o->var[v];
                    dhsa_eval_answer_params ap = dhsa_eval_answer_default_params();
                    ap.method = eval_method(o, va->method, va->density, o->lengths[li]);
                    ap.max_tokens = cap_ans;
                    warn_ctx(e, t.n_ids + cap_ans);
                    if (dhsa_eval_retrieval(e->ctx, e->m, &t, &ap, res)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
                    const char *answer = res->text;
                    int hit = res->hit;
                    size_t cell = ((size_t)v * nD + di) * nL + li;
                    hits[cell] += hit / (double)o->trials;
                    double d_used = res->density_used;
                    dens[cell] += d_used / (double)o->trials;
                    /* a miss is explained by the layouts of the row that produced
                     * its first wrong token */
                    int64_t k_bad = res->first_wrong < DHSA_EVAL_ANSWER_ROWS - 1 ? res->first_wrong
                                                                                 : DHSA_EVAL_ANSWER_ROWS - 1;
                    if (!hit) miss_all[v * 3 + (int)res->needle]++;
                    if (res->mean_chunk > 0) {
                        chunk_sum[2 * v] += res->mean_chunk;
                        chunk_sum[2 * v + 1] += 1;
                    }
                    if (o->json) {
                        dhsa_cli_json_object(&j, NULL);
                        dhsa_cli_json_str(&j, "method", va->name);
                        dhsa_cli_json_numf(&j, "density", "%g", va->density);
                        dhsa_cli_json_numf(&j, "density_used", "%.4f", d_used);
                        dhsa_cli_json_numf(&j, "mean_chunk", "%.2f", res->mean_chunk);
                        dhsa_cli_json_int(&j, "length", o->lengths[li]);
                        dhsa_cli_json_int(&j, "prompt_tokens", t.n_ids);
                        dhsa_cli_json_numf(&j, "depth", "%g", o->depths[di]);
                        dhsa_cli_json_numf(&j, "needle_depth", "%.4f", t.depth_used);
                        dhsa_cli_json_int(&j, "trial", tr);
                        dhsa_cli_json_str(&j, "expected", t.answer);
                        dhsa_cli_json_str(&j, "answer", answer);
                        dhsa_cli_json_bool(&j, "hit", hit);
                        dhsa_cli_json_array(&j, "needle_selected");
                        for (int64_t l = 0; l < res->n_layer; l++)
                            dhsa_cli_json_numf(&j, NULL, "%.3f", res->needle_selected[l]);
                        dhsa_cli_json_close(&j);
                        dhsa_cli_json_int(&j, "first_wrong_token", hit ? -1 : k_bad);
                        dhsa_cli_json_array(&j, "selected_there");
                        for (int64_t l = 0; l < res->n_layer; l++)
                            dhsa_cli_json_numf(&j, NULL, "%.3f", res->selected_at_wrong[l]);
                        dhsa_cli_json_close(&j);
                        dhsa_cli_json_close(&j);
                    } else if (o->show || (!hit && va->method != DHSA_ATTN_DENSE)) {
                        printf("%-10s L %5lld depth %.2f (at %.3f) want%s: %s \"%s\"; needle keys selected per "
                               "layer (least over the answer's rows):", va->name, (long long)t.n_ids, o->depths[di], t.depth_used, t.answer,
                               hit ? "HIT " : "miss", answer);
                        for (int64_t l = 0; l < res->n_layer; l++) printf(" %.2f", res->needle_selected[l]);
                        if (!hit) {
                            printf("; at answer token %lld (the first wrong):", (long long)k_bad);
                            for (int64_t l = 0; l < res->n_layer; l++) printf(" %.2f", res->selected_at_wrong[l]);
                        }
                        printf("\n");
                    }
                }
                dhsa_task_free(&t);
            }
    double secs = dhsa_cli_now() - t0;
    const char *names[MAX_VAR] = {0};
    for (int v = 0; v < n_var; v++) names[v] = o->var[v].name;
    if (o->json) {
        dhsa_cli_json_close(&j); /* answers */
        json_cells(&j, o, names, n_var, hits, dens);
        dhsa_cli_json_array(&j, "misses");
        for (int v = 0; v < n_var; v++) {
            dhsa_cli_json_object(&j, NULL);
            dhsa_cli_json_str(&j, "method", names[v]);
            dhsa_cli_json_int(&j, "needle_selected_everywhere", miss_all[v * 3]);
            dhsa_cli_json_int(&j, "partly", miss_all[v * 3 + 1]);
            dhsa_cli_json_int(&j, "nowhere", miss_all[v * 3 + 2]);
            dhsa_cli_json_numf(&j, "mean_chunk", "%.2f",
                               chunk_sum[2 * v + 1] > 0 ? chunk_sum[2 * v] / chunk_sum[2 * v + 1] : 0.0);
            dhsa_cli_json_close(&j);
        }
        dhsa_cli_json_close(&j);
        json_end(&j, secs);
    } else {
        for (int v = 0; v < n_var; v++) {
            printf("\n%s: accuracy (density used in brackets)\n\n| depth |", names[v]);
            for (int li = 0; li < nL; li++) printf(" %lld (%.0f) |", (long long)o->lengths[li], plen[li]);
            printf(" mean |\n|---|");
            for (int li = 0; li <= nL; li++) printf("---|");
            printf("\n");
            for (int di = 0; di < nD; di++) {
                printf("| %.2f |", o->depths[di]);
                double m = 0;
                for (int li = 0; li < nL; li++) {
                    size_t cell = ((size_t)v * nD + di) * nL + li;
                    printf(" %.2f [%.3f] |", hits[cell], dens[cell]);
                    m += hits[cell] / nL;
                }
                printf(" %.2f |\n", m);
            }
            printf("| all |");
            for (int li = 0; li < nL; li++) {
                double m = 0, d = 0;
                for (int di = 0; di < nD; di++) {
                    size_t cell = ((size_t)v * nD + di) * nL + li;
                    m += hits[cell] / nD;
                    d += dens[cell] / nD;
                }
                printf(" %.3f [%.3f] |", m, d);
            }
            printf("\n");
            if (chunk_sum[2 * v + 1] > 0)
                printf("chunks: %.2f prompt keys per chunk (mean over prompts and layers)\n",
                       chunk_sum[2 * v] / chunk_sum[2 * v + 1]);
            if (miss_all[v * 3] + miss_all[v * 3 + 1] + miss_all[v * 3 + 2])
                printf("misses, at the row that produced the first wrong token: %lld with the needle's keys selected "
                       "in every layer (the model's error), %lld with them selected in some layers only, %lld with "
                       "them selected nowhere\n",
                       (long long)miss_all[v * 3], (long long)miss_all[v * 3 + 1], (long long)miss_all[v * 3 + 2]);
        }
        printf("\n(column heads: target length (mean prompt tokens)); %.1f s\n", secs);
    }
    if (o->svg) {
        char sub[512], title[128];
        snprintf(sub, sizeof sub, "%s; %lld keys per cell; density %.3g; filler %s", o->model, (long long)o->trials,
                 o->densities[0], o->filler_file ? o->filler_file : "built-in");
        snprintf(title, sizeof title, "%s: accuracy (greedy, held-out keys)", dhsa_task_kind_name(kind));
        write_heatmap(o, title, sub, "accuracy", 0, 1, 2, hits, names, n_var);
    }
    free(res);
    free(miss_all);
    free(chunk_sum);
    free(hits);
    free(dens);
    free(plen);
    free(kw);
    free(kw_text);
    free(file_text);
    return 0;
}

/* --------------------------------------------------------------- ruler --- */

/* The suite's tasks in a fixed order (a task's seed uses its place here,
 * so a cell draws the same prompts whatever --tasks lists). */
static const char *const ruler_all[] = {"single_noise", "single_prose", "single_uuid", "single_word",
                                        "multikey", "multikey_needles", "multikey_uuid", "multivalue",
                                        "multiquery", "vt", "cwe", "fwe"};
#define RULER_N_ALL ((int)(sizeof ruler_all / sizeof ruler_all[0]))

/* One scored answer: a line of --out, and a row of the tables. */
typedef struct {
    int task, length_i, var;      /* indices into ruler_all, o->lengths, o->var */
    double depth, score, density_used;
    int64_t trial, prompt_tokens;
} ruler_row;

typedef struct {
    ruler_row *r;
    int64_t n, cap;
    char **keys; /* "task\tlength\tdepth\ttrial\tmethod" of each finished answer, file and new */
    int64_t n_keys, cap_keys;
} ruler_done;

static void done_add(ruler_done *d, const ruler_row *row, const char *key) {
    if (row) {
        if (d->n == d->cap) {
            d->cap = d->cap ? 2 * d->cap : 256;
            ruler_row *nr = realloc(d->r, (size_t)d->cap * sizeof *nr);
            if (!nr) dhsa_cli_die(EXIT_RUN, "out of memory");
            d->r = nr;
        }
        d->r[d->n++] = *row;
    }
    if (d->n_keys == d->cap_keys) {
        d->cap_keys = d->cap_keys ? 2 * d->cap_keys : 256;
        char **nk = realloc(d->keys, (size_t)d->cap_keys * sizeof *nk);
        if (!nk) dhsa_cli_die(EXIT_RUN, "out of memory");
        d->keys = nk;
    }
    d->keys[d->n_keys] = strdup(key);
    if (!d->keys[d->n_keys]) dhsa_cli_die(EXIT_RUN, "out of memory");
    d->n_keys++;
}

static int done_has(const ruler_done *d, const char *key) {
    for (int64_t i = d->n_keys - 1; i >= 0; i--)
        if (strcmp(d->keys[i], key) == 0) return 1;
    return 0;
}

static void ruler_key(char *buf, size_t cap, const char *task, int64_t length, double depth, int64_t trial,
                      const char *method) {
    snprintf(buf, cap, "%s\t%lld\t%g\t%lld\t%s", task, (long long)length, depth, (long long)trial, method);
}

/* A TSV field: tab, newline, carriage return and backslash escaped. */
static void tsv_str(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '\t') fputs("\\t", f);
        else if (*s == '\n') fputs("\\n", f);
        else if (*s == '\r') fputs("\\r", f);
        else if (*s == '\\') fputs("\\\\", f);
        else fputc(*s, f);
    }
}

#define RULER_TSV_HEAD "task\tlength\tdepth\ttrial\tmethod\tdensity\tprompt_tokens\tdepth_used\tdensity_used\tscore\t" \
                       "expected\tgot\tseconds\n"

/* Reads a previous --out: its settings line must be `config`; every
 * complete line is a finished answer (a line cut by an interruption is
 * cut off the file). Returns the file opened for appending. */
static FILE *ruler_open_out(const eval_opts *o, const char *config, ruler_done *d, int64_t *n_old) {
    *n_old = 0;
    FILE *f = fopen(o->out_path, "r+b");
    if (!f) {
        f = fopen(o->out_path, "wb");
        if (!f) dhsa_cli_die(EXIT_RUN, "cannot write %s: %s", o->out_path, strerror(errno));
        fprintf(f, "%s\n" RULER_TSV_HEAD, config);
        fflush(f);
        return f;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    long good = 0; /* bytes of complete lines */
    int ln = 0;
    while ((n = getline(&line, &cap, f)) > 0) {
        if (line[n - 1] != '\n') break; /* cut by an interruption */
        line[n - 1] = 0;
        ln++;
        if (ln == 1 && strcmp(line, config) != 0)
            dhsa_cli_die(EXIT_USAGE, "%s was written by another run:\n  %s\nthis run is:\n  %s\nto resume, give the same "
                         "options; else use another --out", o->out_path, line, config);
        if (ln == 2 && strncmp(line, "task\t", 5) != 0) dhsa_cli_die(EXIT_USAGE, "%s: line 2 is not the header", o->out_path);
        good += (long)n;
        if (ln <= 2) continue;
        char *fld[13];
        int k = 0;
        for (char *p = line; k < 13; k++) {
            fld[k] = p;
            char *tab = strchr(p, '\t');
            if (!tab) { k++; break; }
            *tab = 0;
            p = tab + 1;
        }
        if (k != 13) dhsa_cli_die(EXIT_RUN, "%s line %d: %d fields, not 13", o->out_path, ln, k);
        char key[512];
        ruler_key(key, sizeof key, fld[0], strtoll(fld[1], NULL, 10), strtod(fld[2], NULL), strtoll(fld[3], NULL, 10),
                  fld[4]);
        ruler_row row;
        memset(&row, 0, sizeof row);
        row.task = row.length_i = row.var = -1;
        for (int t = 0; t < RULER_N_ALL; t++)
            if (strcmp(ruler_all[t], fld[0]) == 0) row.task = t;
        for (int li = 0; li < o->n_lengths; li++)
            if (o->lengths[li] == strtoll(fld[1], NULL, 10)) row.length_i = li;
        for (int v = 0; v < o->n_var; v++)
            if (strcmp(o->var[v].name, fld[4]) == 0) row.var = v;
        row.depth = strtod(fld[2], NULL);
        row.trial = strtoll(fld[3], NULL, 10);
        row.prompt_tokens = strtoll(fld[6], NULL, 10);
        row.density_used = strtod(fld[8], NULL);
        row.score = strtod(fld[9], NULL);
        done_add(d, &row, key);
        (*n_old)++;
    }
    free(line);
    if (ln == 0) { /* empty file: start it */
        fclose(f);
        f = fopen(o->out_path, "wb");
        if (!f) dhsa_cli_die(EXIT_RUN, "cannot write %s: %s", o->out_path, strerror(errno));
        fprintf(f, "%s\n" RULER_TSV_HEAD, config);
        fflush(f);
        return f;
    }
    if (fflush(f) != 0 || ftruncate(fileno(f), good) != 0 || fseek(f, good, SEEK_SET) != 0)
        dhsa_cli_die(EXIT_RUN, "cannot cut %s to its complete lines: %s", o->out_path, strerror(errno));
    return f;
}

static int cmd_ruler(eval_env *e) {
    eval_opts *o = e->o;
    /* the tasks */
    int tasks[RULER_N_ALL], n_tasks = 0, explicit_tasks = o->tasks != NULL;
    if (o->tasks) {
        char buf[1024], *items[RULER_N_ALL * 2];
        int n = dhsa_cli_split_list("--tasks", o->tasks, buf, sizeof buf, items, RULER_N_ALL * 2);
        for (int i = 0; i < n; i++) {
            int found = -1;
            for (int t = 0; t < RULER_N_ALL; t++)
                if (strcmp(items[i], ruler_all[t]) == 0) found = t;
            if (found < 0) {
                dhsa_ruler_params tmp = dhsa_ruler_default_params();
                dhsa_ruler_preset(items[i], &tmp);
                dhsa_cli_die(EXIT_USAGE, "--tasks: %s", dhsa_last_error());
            }
            tasks[n_tasks++] = found;
        }
    } else {
        for (int t = 0; t < RULER_N_ALL; t++) tasks[n_tasks++] = t;
    }
    /* the Debian-packaged data the tasks need: prose and the word list */
    char *prose = NULL, *words = NULL;
    int64_t prose_len = 0, words_len = 0;
    int need_prose = 0, need_words = 0;
    for (int i = 0; i < n_tasks; i++) {
        dhsa_ruler_params tp = dhsa_ruler_default_params();
        dhsa_ruler_preset(ruler_all[tasks[i]], &tp);
        need_prose |= tp.haystack == DHSA_RULER_PROSE && tp.task != DHSA_RULER_CWE;
        need_words |= tp.task == DHSA_RULER_CWE;
    }
    const char *skip_why[2] = {NULL, NULL};
    char why_buf[2][1024];
    if (need_prose && dhsa_ruler_load_prose(o->prose_dir, (dhsa_ruler_split)o->split, &prose, &prose_len)) {
        if (explicit_tasks) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
        snprintf(why_buf[0], sizeof why_buf[0], "%s", dhsa_last_error());
        skip_why[0] = why_buf[0];
    }
    if (need_words && dhsa_ruler_load_words(o->words_path, &words, &words_len)) {
        if (explicit_tasks) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
        snprintf(why_buf[1], sizeof why_buf[1], "%s", dhsa_last_error());
        skip_why[1] = why_buf[1];
    }
    { /* without --tasks, the tasks whose data is missing are skipped, saying so */
        int k = 0;
        for (int i = 0; i < n_tasks; i++) {
            dhsa_ruler_params tp = dhsa_ruler_default_params();
            dhsa_ruler_preset(ruler_all[tasks[i]], &tp);
            const char *why = tp.task == DHSA_RULER_CWE ? skip_why[1]
                              : tp.haystack == DHSA_RULER_PROSE ? skip_why[0] : NULL;
            if (why) fprintf(stderr, "dhsa eval ruler: skipping %s: %s\n", ruler_all[tasks[i]], why);
            else tasks[k++] = tasks[i];
        }
        n_tasks = k;
        if (!n_tasks) dhsa_cli_die(EXIT_RUN, "no task left to run");
    }
    const char *tmpl_why;
    dhsa_chat_template tmpl = pick_template(e, &tmpl_why);
    const char *tmpl_name = tmpl == DHSA_CHAT_NONE ? "plain" : dhsa_chat_template_name(tmpl);
    const char *split_name = o->split == DHSA_RULER_DEV ? "dev" : "test";
    /* what a resumed --out must have been written with */
    char config[2048];
    {
        dhsa_router_params rp = router_for(o, 4096, 0.0625);
        snprintf(config, sizeof config,
                 "# dhsa eval ruler: model %s, split %s, seed %llu, template %s, answer tokens %s%lld, boundary %d, "
                 "budget %lld, routing at 4K: q_block %lld sink %lld local %lld dense_below %lld min_chunk %lld "
                 "max_chunk %lld chunk %lld sim_window %lld nms_window %lld score %d",
                 o->model, split_name, (unsigned long long)o->seed, tmpl_name, o->answer_tokens_set ? "" : "task ",
                 o->answer_tokens_set ? (long long)o->answer_tokens : 0LL, (int)o->boundary, (long long)o->budget,
                 (long long)rp.q_block, (long long)rp.sink_tokens, (long long)rp.local_tokens,
                 (long long)rp.dense_below, (long long)rp.min_chunk, (long long)rp.max_chunk, (long long)rp.chunk,
                 (long long)rp.sim_window, (long long)rp.nms_window, (int)rp.score_mode);
    }
    ruler_done d;
    memset(&d, 0, sizeof d);
    int64_t n_old = 0;
    FILE *out = o->out_path ? ruler_open_out(o, config, &d, &n_old) : NULL;
    if (!o->json) {
        printf("ruler: %s; split %s; prompt: %s (%s); %lld samples per cell, greedy answers%s\n", o->model, split_name,
               tmpl_name, tmpl_why, (long long)o->trials, o->answer_tokens_set ? "" : " of RULER's lengths per task");
        if (out) printf("samples: %s (%lld finished before, skipped)\n", o->out_path, (long long)n_old);
        else printf("samples: not saved (--out FILE.tsv writes each one as it finishes, and resumes)\n");
        for (int i = 0; i < o->n_lengths; i++) {
            dhsa_router_params rp = router_for(o, o->lengths[i], o->densities[0]);
            print_router(stdout, &rp, o->lengths[i]);
        }
        fflush(stdout);
    }
    dhsa_eval_answer *res = xmalloc(sizeof *res);
    double t0 = dhsa_cli_now();
    int64_t n_new = 0;
    for (int li = 0; li < o->n_lengths; li++)
        for (int ti = 0; ti < n_tasks; ti++) {
            const int task = tasks[ti];
            dhsa_ruler_params tp = dhsa_ruler_default_params();
            dhsa_ruler_preset(ruler_all[task], &tp);
            const int no_depth = tp.task == DHSA_RULER_CWE || tp.task == DHSA_RULER_FWE;
            for (int di = 0; di < (no_depth ? 1 : o->n_depths); di++)
                for (int64_t tr = 0; tr < o->trials; tr++) {
                    const double depth = no_depth ? -1 : o->depths[di];
                    char key[512];
                    int todo = 0;
                    for (int v = 0; v < o->n_var; v++) {
                        ruler_key(key, sizeof key, ruler_all[task], o->lengths[li], depth, tr, o->var[v].name);
                        todo |= !done_has(&d, key);
                    }
                    if (!todo) continue;
                    tp.length = o->lengths[li];
                    tp.depth = no_depth ? 0 : depth;
                    tp.split = (dhsa_ruler_split)o->split;
                    tp.tmpl = tmpl;
                    tp.prose = prose;
                    tp.prose_len = prose_len;
                    tp.words = words;
                    tp.words_len = words_len;
                    /* the cell's identity, not its place in the lists, seeds it */
                    uint64_t s = o->seed * 0x9E3779B97F4A7C15ull ^ ((uint64_t)task << 48) ^
                                 ((uint64_t)o->lengths[li] << 20) ^ ((uint64_t)llround(depth * 1000 + 1000) << 8) ^
                                 (uint64_t)tr;
                    tp.seed = splitmix(&s);
                    dhsa_ruler_prompt pr;
                    if (dhsa_ruler_build(e->tok, &tp, &pr)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
                    char expected[DHSA_RULER_MAX_EXPECTED * 50] = "";
                    for (int k = 0; k < pr.n_expected; k++) {
                        size_t l = strlen(expected);
                        snprintf(expected + l, sizeof expected - l, "%s%s", k ? "|" : "", pr.expected[k]);
                    }
                    int64_t cap_ans = o->answer_tokens_set ? o->answer_tokens : pr.answer_tokens;
                    for (int v = 0; v < o->n_var; v++) {
                        const variant *va = &o->var[v];
                        ruler_key(key, sizeof key, ruler_all[task], o->lengths[li], depth, tr, va->name);
                        if (done_has(&d, key)) continue;
                        dhsa_eval_answer_params ap = dhsa_eval_answer_default_params();
                        ap.method = eval_method(o, va->method, va->density, o->lengths[li]);
                        ap.max_tokens = cap_ans;
                        ap.stop = pr.stop;
                        ap.n_stop = pr.n_stop;
                        warn_ctx(e, pr.n_ids + cap_ans);
                        double ts = dhsa_cli_now();
                        if (dhsa_eval_generate(e->ctx, e->m, pr.ids, pr.n_ids, &ap, res))
                            dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
                        double secs = dhsa_cli_now() - ts;
                        double score = dhsa_ruler_score(&pr, res->text, (int64_t)strlen(res->text));
                        ruler_row row = {task, li, v, depth, score, res->density_used, tr, pr.n_ids};
                        done_add(&d, &row, key);
                        n_new++;
                        if (out) {
                            fprintf(out, "%s\t%lld\t%g\t%lld\t%s\t%g\t%lld\t%.4f\t%.4f\t%.4f\t", ruler_all[task],
                                    (long long)o->lengths[li], depth, (long long)tr, va->name, va->density,
                                    (long long)pr.n_ids, pr.depth_used, res->density_used, score);
                            tsv_str(out, expected);
                            fputc('\t', out);
                            tsv_str(out, res->text);
                            fprintf(out, "\t%.2f\n", secs);
                            if (fflush(out) != 0) dhsa_cli_die(EXIT_RUN, "cannot write %s: %s", o->out_path, strerror(errno));
                        }
                        if (o->show && !o->json)
                            printf("%-16s %-10s L %5lld depth %5.2f (at %.3f) score %.2f want %s got \"%s\"\n",
                                   ruler_all[task], va->name, (long long)pr.n_ids, depth, pr.depth_used, score,
                                   expected, res->text);
                    }
                    dhsa_ruler_free(&pr);
                }
        }
    double secs = dhsa_cli_now() - t0;
    if (out && fclose(out) != 0) dhsa_cli_die(EXIT_RUN, "cannot write %s: %s", o->out_path, strerror(errno));
    /* the tables: mean score x 100 per task, length and method over depths and samples */
    const int n_var = o->n_var, nL = o->n_lengths;
    size_t n_cells = (size_t)n_var * RULER_N_ALL * nL;
    double *sum = calloc(n_cells, sizeof(double)), *dsum = calloc(n_cells, sizeof(double));
    double *cnt = calloc(n_cells, sizeof(double)), *plen = calloc((size_t)nL, sizeof(double)),
           *pcnt = calloc((size_t)nL, sizeof(double));
    if (!sum || !dsum || !cnt || !plen || !pcnt) dhsa_cli_die(EXIT_RUN, "out of memory");
    int in_grid[RULER_N_ALL] = {0};
    for (int i = 0; i < n_tasks; i++) in_grid[tasks[i]] = 1;
    for (int64_t i = 0; i < d.n; i++) {
        const ruler_row *r = &d.r[i];
        if (r->task < 0 || !in_grid[r->task] || r->length_i < 0 || r->var < 0 || r->trial >= o->trials) continue;
        if (r->depth >= 0) { /* a depth of this run's list */
            int ok = 0;
            for (int di = 0; di < o->n_depths; di++) ok |= fabs(o->depths[di] - r->depth) < 1e-9;
            if (!ok) continue;
        }
        size_t c = ((size_t)r->var * RULER_N_ALL + (size_t)r->task) * nL + (size_t)r->length_i;
        sum[c] += r->score;
        dsum[c] += r->density_used;
        cnt[c] += 1;
        plen[r->length_i] += (double)r->prompt_tokens;
        pcnt[r->length_i] += 1;
    }
    if (o->json) {
        dhsa_cli_json j;
        json_begin(&j);
        dhsa_cli_json_str(&j, "command", "ruler");
        dhsa_cli_json_str(&j, "model", o->model);
        dhsa_cli_json_str(&j, "split", split_name);
        dhsa_cli_json_str(&j, "template", tmpl_name);
        dhsa_cli_json_int(&j, "samples", o->trials);
        dhsa_cli_json_int(&j, "new_answers", n_new);
        dhsa_cli_json_str(&j, "out", o->out_path); /* NULL: null */
        dhsa_cli_json_array(&j, "cells");
        for (int v = 0; v < n_var; v++)
            for (int ti = 0; ti < n_tasks; ti++)
                for (int li = 0; li < nL; li++) {
                    size_t c = ((size_t)v * RULER_N_ALL + (size_t)tasks[ti]) * nL + (size_t)li;
                    dhsa_cli_json_object(&j, NULL);
                    dhsa_cli_json_str(&j, "task", ruler_all[tasks[ti]]);
                    dhsa_cli_json_str(&j, "method", o->var[v].name);
                    dhsa_cli_json_int(&j, "length", o->lengths[li]);
                    dhsa_cli_json_numf(&j, "answers", "%.0f", cnt[c]);
                    dhsa_cli_json_num(&j, "score", cnt[c] > 0 ? 100 * sum[c] / cnt[c] : NAN);
                    dhsa_cli_json_num(&j, "density_used", cnt[c] > 0 ? dsum[c] / cnt[c] : NAN);
                    dhsa_cli_json_close(&j);
                }
        dhsa_cli_json_close(&j);
        json_end(&j, secs);
    } else {
        for (int v = 0; v < n_var; v++) {
            printf("\n%s: RULER score (share of expected strings in the answer, x100; density used in brackets)\n\n"
                   "| task |", o->var[v].name);
            for (int li = 0; li < nL; li++)
                printf(" %lld (%.0f) |", (long long)o->lengths[li], pcnt[li] > 0 ? plen[li] / pcnt[li] : 0.0);
            printf("\n|---|");
            for (int li = 0; li < nL; li++) printf("---|");
            printf("\n");
            double msum[MAX_LIST] = {0}, mcnt[MAX_LIST] = {0};
            for (int ti = 0; ti < n_tasks; ti++) {
                printf("| %s |", ruler_all[tasks[ti]]);
                for (int li = 0; li < nL; li++) {
                    size_t c = ((size_t)v * RULER_N_ALL + (size_t)tasks[ti]) * nL + (size_t)li;
                    if (cnt[c] > 0) {
                        printf(" %.1f [%.3f] |", 100 * sum[c] / cnt[c], dsum[c] / cnt[c]);
                        msum[li] += 100 * sum[c] / cnt[c];
                        mcnt[li] += 1;
                    } else {
                        printf(" - |");
                    }
                }
                printf("\n");
            }
            printf("| mean of tasks |");
            for (int li = 0; li < nL; li++) printf(mcnt[li] > 0 ? " %.1f |" : " - |", msum[li] / (mcnt[li] > 0 ? mcnt[li] : 1));
            printf("\n");
        }
        printf("\n(column heads: target length (mean prompt tokens)); %lld new answers, %.1f s\n", (long long)n_new, secs);
    }
    for (int64_t i = 0; i < d.n_keys; i++) free(d.keys[i]);
    free(d.keys);
    free(d.r);
    free(sum);
    free(dsum);
    free(cnt);
    free(plen);
    free(pcnt);
    free(res);
    free(prose);
    free(words);
    return 0;
}

/* ---------------------------------------------------------------- main --- */

int dhsa_cli_eval(int argc, char **argv) {
    dhsa_cli_set_command("eval", "(see dhsa help eval)\n");
    if (argc < 3 || strcmp(argv[2], "--help") == 0 || strcmp(argv[2], "-h") == 0) {
        fputs(dhsa_cli_eval_usage, argc < 3 ? stderr : stdout);
        fputs(dhsa_cli_eval_usage_tasks, argc < 3 ? stderr : stdout);
        return argc < 3 ? EXIT_USAGE : 0;
    }
    const char *sub = argv[2];
    if (strcmp(sub, "fidelity") == 0) dhsa_cli_set_command("eval fidelity", "(see dhsa help eval)\n");
    else if (strcmp(sub, "copy") == 0) dhsa_cli_set_command("eval copy", "(see dhsa help eval)\n");
    else if (strcmp(sub, "niah") == 0) dhsa_cli_set_command("eval niah", "(see dhsa help eval)\n");
    else if (strcmp(sub, "passkey") == 0) dhsa_cli_set_command("eval passkey", "(see dhsa help eval)\n");
    else if (strcmp(sub, "multikey") == 0) dhsa_cli_set_command("eval multikey", "(see dhsa help eval)\n");
    else if (strcmp(sub, "multivalue") == 0) dhsa_cli_set_command("eval multivalue", "(see dhsa help eval)\n");
    else if (strcmp(sub, "ruler") == 0) dhsa_cli_set_command("eval ruler", "(see dhsa help eval)\n");
    else dhsa_cli_die(EXIT_USAGE, "unknown evaluation \"%s\": fidelity, copy, niah, passkey, multikey, multivalue or ruler",
                      sub);
    eval_opts o;
    parse(argc, argv, &o, sub);
    dhsa_model_params mp = dhsa_model_default_params();
    mp.tokenizer_path = o.tokenizer;
    eval_env e;
    memset(&e, 0, sizeof e);
    e.o = &o;
    if (dhsa_model_load(o.model, &mp, &e.m)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
    e.in = dhsa_model_get_info(e.m);
    e.tok = dhsa_model_tokenizer(e.m);
    if (o.predictor_path)
        o.predictor = dhsa_cli_load_predictor(o.predictor_path, e.in->n_head_kv * e.in->head_dim_k, o.model);
    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = (int)o.threads;
    if (dhsa_ctx_create(&cp, &e.ctx)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
    int rc;
    if (strcmp(sub, "fidelity") == 0) rc = cmd_fidelity(&e);
    else if (strcmp(sub, "copy") == 0) rc = cmd_copy(&e);
    else if (strcmp(sub, "niah") == 0) rc = cmd_niah(&e);
    else if (strcmp(sub, "passkey") == 0) rc = cmd_retrieval(&e, DHSA_TASK_PASSKEY);
    else if (strcmp(sub, "multikey") == 0) rc = cmd_retrieval(&e, DHSA_TASK_MULTIKEY);
    else if (strcmp(sub, "ruler") == 0) rc = cmd_ruler(&e);
    else rc = cmd_retrieval(&e, DHSA_TASK_MULTIVALUE);
    dhsa_ctx_free(e.ctx);
    dhsa_predictor_free(o.predictor);
    dhsa_model_free(e.m);
    return rc;
}
