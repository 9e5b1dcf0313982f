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
 * maps (tools/lib/svg_heatmap.c). The retrieval tasks (passkey, multikey,
 * multivalue) and ruler are tools/eval_tasks.c; tools/eval.h is what the
 * two files share.
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
#include "eval.h"
#include "eval/niah.h"
#include "lib/svg.h"

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
    "  loss on the first occurrence minus that on the repetition (nats/token,\n"
    "  not the passage's first). A method keeps the copy where\n"
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
    "  --sink-window N  --carry F (0.1)  --exact-rows N (64)  --rest N|hybrid\n"
    "  --hybrid-max-chunk N (16; 0 off; --min/--max-chunk set it to 0)\n"
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
    "  --passage-kind K    copy: tokens (random, default), words (whole-word\n"
    "                      tokens) or text (model-sampled)\n"
    "  --svg-attn FILE     copy: heat map of dense's attention on the first copy\n"
    "                      that each method keeps\n"
    "  --min-score S       copy: dense must reach this score (default 1.0 nats)\n"
    "  --filler FILE       copy: filler text instead of model samples; passkey etc.: the filler\n"
    "  --haystack FILE     niah: haystack text instead of the built-in sentences\n"
    "  --answer-tokens N   niah: longest answer (default 12)\n"
    "  --template auto|plain|NAME  niah: chat template (auto: the model's when its\n"
    "                      GGUF has tokenizer.chat_template, else a plain prompt)\n"
    "  --show              niah, ruler: every answer\n"
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

void *eval_xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) dhsa_cli_die(EXIT_RUN, "out of memory (%zu bytes)", n);
    return p;
}

/* A text input of eval (-f, --filler, --haystack, --keywords): corpora,
 * of which the commands use a prefix or repeat a short one; up to the
 * tokenizer's limit, checked before reading. */
char *eval_read_text(const char *opt, const char *path, int64_t *len) {
    return dhsa_cli_slurp(opt, path, DHSA_TOKENIZER_MAX_TEXT, "the most text the tokenizer takes", len);
}

/* ------------------------------------------------------------- options --- */


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
    o->carry = -1;
    o->exact_rows = -1;
    o->rest = DHSA_CLI_REST_UNSET;
    o->hybrid_max_chunk = -1;
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
        else if (strcmp(a, "--carry") == 0) o->carry = dhsa_cli_real(a, v, 0, 1);
        else if (strcmp(a, "--exact-rows") == 0) o->exact_rows = dhsa_cli_int(a, v, 0, DHSA_EXACT_ROWS_MAX, 0);
        else if (strcmp(a, "--rest") == 0) o->rest = dhsa_cli_rest(a, v);
        else if (strcmp(a, "--hybrid-max-chunk") == 0) o->hybrid_max_chunk = dhsa_cli_int(a, v, 0, 1 << 30, 0);
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
dhsa_router_params eval_router_for(const eval_opts *o, int64_t L, double density) {
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
    if (o->carry >= 0) rp.carry = o->carry;
    if (o->exact_rows >= 0) rp.exact_rows = o->exact_rows;
    if (o->rest != DHSA_CLI_REST_UNSET) rp.rest = o->rest;
    /* chunk sizes given: they are what runs, on hybrid models too */
    if (o->hybrid_max_chunk >= 0) rp.hybrid_max_chunk = o->hybrid_max_chunk;
    else if (o->min_chunk >= 0 || o->max_chunk >= 0) rp.hybrid_max_chunk = 0;
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

void eval_print_router(FILE *f, const dhsa_router_params *rp, int64_t L) { dhsa_cli_print_router(f, rp, L); }

/* ------------------------------------------------------------ sessions --- */


/* The method of a variant at length L, as the library evaluates it. */
dhsa_eval_method eval_method(const eval_opts *o, dhsa_attn_method m, double density, int64_t L) {
    dhsa_eval_method me = {effective(o, m), eval_router_for(o, L, density)};
    return me;
}

/* The warning (once) for a cache longer than the model was trained on. */
void eval_warn_ctx(eval_env *e, int64_t n_ctx) {
    if (n_ctx > e->in->n_ctx_train && !e->warned_ctx) {
        fprintf(stderr, "dhsa %s: warning: context %lld is longer than the model's trained context %lld: quality "
                "may drop (dense included)\n", dhsa_cli_command(), (long long)n_ctx, (long long)e->in->n_ctx_train);
        e->warned_ctx = 1;
    }
}

/* Every eval --json output: one object on stdout, numbers "%.6g" unless a
 * field gives its own format (a non-finite one is null), strings with
 * invalid UTF-8 replaced by U+FFFD (a model's answer may hold byte tokens)
 * so the document always parses. Opened here; eval_json_end adds the run's
 * seconds and closes it. */
void eval_json_begin(dhsa_cli_json *j) {
    dhsa_cli_json_init(j, stdout, DHSA_CLI_JSON_CHECK_UTF8, "%.6g");
    dhsa_cli_json_object(j, NULL);
}

/* "cells": accuracy and density used per method, depth and length (niah
 * and the retrieval tasks). */
void eval_json_cells(dhsa_cli_json *j, const eval_opts *o, const char *const *names, int n_var,
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

void eval_json_end(dhsa_cli_json *j, double secs) {
    dhsa_cli_json_numf(j, "seconds", "%.3f", secs);
    dhsa_cli_json_close(j);
}

/* ------------------------------------------------------------ fidelity --- */

static int cmd_fidelity(eval_env *e) {
    eval_opts *o = e->o;
    const int64_t NL = e->in->n_layer;
    int64_t len;
    char *text = eval_read_text("-f", o->text_file, &len);
    int64_t n_text = 0;
    dhsa_tokenize(e->tok, text, len, 0, NULL, 0, &n_text);
    int32_t *stream = eval_xmalloc((size_t)(n_text + 1) * sizeof(int32_t));
    if (dhsa_tokenize(e->tok, text, len, 0, stream, n_text + 1, &n_text)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
    free(text);
    const int n_var = o->n_var;
    int64_t W = o->ctx ? o->ctx : e->in->n_ctx_train;
    dhsa_eval_method *methods = eval_xmalloc((size_t)n_var * sizeof *methods);
    dhsa_eval_fidelity_result *res = eval_xmalloc((size_t)n_var * sizeof *res);
    double *rec = eval_xmalloc((size_t)n_var * (size_t)NL * sizeof(double));
    for (int vi = 0; vi < n_var; vi++) {
        methods[vi] = eval_method(o, o->var[vi].method, o->var[vi].density, W);
        res[vi].recall = rec + (size_t)vi * (size_t)NL;
    }
    dhsa_eval_fidelity_params fp = dhsa_eval_fidelity_default_params();
    fp.window = W;
    fp.max_windows = o->windows;
    eval_warn_ctx(e, W);
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
        eval_json_begin(&j);
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
        dhsa_router_params rp = eval_router_for(o, W, o->densities[0]);
        eval_print_router(stdout, &rp, W);
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
        eval_json_end(&j, secs);
    }
    free(methods);
    free(res);
    free(rec);
    free(stream);
    return 0;
}

/* ---------------------------------------------------------------- prng --- */

uint64_t eval_splitmix(uint64_t *s) {
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
    int32_t *f = eval_xmalloc((size_t)need * sizeof(int32_t));
    int64_t n = 0;
    if (from_file) {
        int64_t len, nt = 0;
        char *text = eval_read_text("--filler", e->o->filler_file, &len);
        dhsa_tokenize(e->tok, text, len, 0, NULL, 0, &nt);
        int32_t *t = eval_xmalloc((size_t)(nt + 1) * sizeof(int32_t));
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

void eval_write_heatmap(const eval_opts *o, const char *title, const char *subtitle, const char *scale_label,
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
    int32_t *normal = eval_xmalloc((size_t)V * sizeof(int32_t));
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
            dhsa_router_params rp = eval_router_for(o, o->lengths[i], o->densities[0]);
            eval_print_router(stdout, &rp, o->lengths[i]);
        }
    }
    const int n_var = o->n_var, nL = o->n_lengths, nD = o->n_depths;
    copy_cell *cells = calloc((size_t)n_var * nL * nD, sizeof *cells);
    int32_t *ids = eval_xmalloc((size_t)max_len * sizeof(int32_t)), *passage = eval_xmalloc((size_t)P * sizeof(int32_t));
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
            for (int64_t i = 0; i < P; i++) passage[i] = normal[eval_splitmix(&rs) % (uint64_t)n_normal];
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
                    eval_warn_ctx(e, at.n_ids);
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
        eval_json_begin(&j);
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
        eval_json_end(&j, secs);
    } else
        printf("\n%.1f s. Marks: after the loss drop, * where dense's drop is >= %.2f and the method's at least "
                "half of it (x: less); after the share, * where dense puts at least twice the control's mass on the "
                "first copy and the method keeps at least half of it (x: less). No mark: dense does not copy / "
                "attend (or did not run).\n", secs, o->min_score);
    if (o->svg_attn) {
        double *vals = eval_xmalloc((size_t)n_var * nD * nL * sizeof(double));
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
        eval_write_heatmap(o, "Copy retrieval: share of the attention on the first copy that each method keeps", sub,
                      "share", 0, 1, 2, vals, names, n_var);
        o->svg = keep;
        free(vals);
    }
    if (o->svg) {
        double *vals = eval_xmalloc((size_t)n_var * nD * nL * sizeof(double)), hi = 0;
        for (size_t i = 0; i < (size_t)n_var * nD * nL; i++) {
            vals[i] = cells[i].score;
            if (vals[i] > hi) hi = vals[i];
        }
        char sub[256];
        snprintf(sub, sizeof sub, "%s; passage %lld tokens, %lld trials; density %.3g", o->model, (long long)P,
                 (long long)o->trials, o->densities[0]);
        eval_write_heatmap(o, "Copy retrieval: loss drop on the repeated passage (nats/token)", sub, "nats",
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
dhsa_chat_template eval_pick_template(eval_env *e, const char **why) {
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
        file_text = eval_read_text("--haystack", o->haystack_file, &len);
        n_sent = dhsa__split_sentences(file_text, len, &sent);
        if (n_sent < 0) dhsa_cli_die(EXIT_RUN, "out of memory");
        if (n_sent == 0) dhsa_cli_die(EXIT_RUN, "the haystack file \"%s\" has no sentences", o->haystack_file);
    } else {
        const char *const *builtin_haystack = dhsa_task_builtin_sentences(&n_sent);
        sent = eval_xmalloc((size_t)n_sent * sizeof(char *));
        for (int64_t i = 0; i < n_sent; i++) sent[i] = (char *)builtin_haystack[i];
    }
    /* the prompt format */
    struct {
        dhsa_chat_template tmpl; /* NONE: plain prompt */
    } np;
    const char *tmpl_why;
    np.tmpl = eval_pick_template(e, &tmpl_why);
    if (!o->json) {
        printf("niah: %s; haystack: %s (%lld sentences); prompt: %s (%s); %lld trials, answers of up to %lld "
               "tokens, greedy\n", o->model, o->haystack_file ? o->haystack_file : "built-in sentences",
               (long long)n_sent, np.tmpl == DHSA_CHAT_NONE ? "plain" : dhsa_chat_template_name(np.tmpl), tmpl_why,
               (long long)o->trials, (long long)o->answer_tokens);
        for (int i = 0; i < o->n_lengths; i++) {
            dhsa_router_params rp = eval_router_for(o, o->lengths[i], o->densities[0]);
            eval_print_router(stdout, &rp, o->lengths[i]);
        }
    }
    const int n_var = o->n_var, nL = o->n_lengths, nD = o->n_depths;
    size_t n_cells = (size_t)n_var * nD * nL;
    double *hits = calloc(n_cells, sizeof(double)), *dens = calloc(n_cells, sizeof(double));
    double *plen = calloc((size_t)nL, sizeof(double));
    if (!hits || !dens || !plen) dhsa_cli_die(EXIT_RUN, "out of memory");
    int64_t cap_ans = o->answer_tokens;
    dhsa_eval_answer *res = eval_xmalloc(sizeof *res);
    double t0 = dhsa_cli_now();
    dhsa_cli_json j = {0};
    if (o->json) {
        eval_json_begin(&j);
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
                snprintf(number, sizeof number, "%04u", (unsigned)(1000 + eval_splitmix(&rs) % 9000));
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
                    eval_warn_ctx(e, n_ids + cap_ans);
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
        eval_json_cells(&j, o, names, n_var, hits, dens);
        eval_json_end(&j, secs);
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
        eval_write_heatmap(o, "Needle in a haystack: share of answers with the number", sub, "accuracy", 0, 1, 2, hits,
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
    else if (strcmp(sub, "passkey") == 0) rc = eval_cmd_retrieval(&e, DHSA_TASK_PASSKEY);
    else if (strcmp(sub, "multikey") == 0) rc = eval_cmd_retrieval(&e, DHSA_TASK_MULTIKEY);
    else if (strcmp(sub, "ruler") == 0) rc = eval_cmd_ruler(&e);
    else rc = eval_cmd_retrieval(&e, DHSA_TASK_MULTIVALUE);
    dhsa_ctx_free(e.ctx);
    dhsa_predictor_free(o.predictor);
    dhsa_model_free(e.m);
    return rc;
}
