/* eval_tasks.c: `dhsa eval passkey|multikey|multivalue|ruler`, the
 * long-context retrieval tasks on a real model, each sparse method against
 * dense in the same process.
 *
 *   passkey, multikey, multivalue  the tasks the default model was trained
 *             on (dhsa.h "Retrieval tasks": dhsa_task_*), built to each
 *             length with the asked needle at each depth, scored by
 *             dhsa_eval_retrieval; every miss of a sparse method is printed
 *             with the share of the needle's keys each layer selected
 *   ruler     RULER-style tasks (dhsa_ruler_*; docs/eval.md "eval ruler"),
 *             scored as RULER scores them, with --out FILE.tsv to resume
 *
 * The options, the model and the shared helpers are tools/eval.c's
 * (tools/eval.h). Tested by tests/test_eval.c and tests/test_eval_ruler.c
 * (CLI parts through DHSA_CLI).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "cli.h"
#include "dhsa.h"
#include "eval.h"
#include "lib/svg.h"

/* ----------------------------------------------------------- retrieval --- */

static char **read_lines(const char *path, int64_t *n_out, char **buf_out) {
    int64_t len;
    char *text = eval_read_text("--keywords", path, &len);
    int64_t cap = 1024, n = 0;
    char **l = eval_xmalloc((size_t)cap * sizeof(char *));
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

int eval_cmd_retrieval(eval_env *e, dhsa_task_kind kind) {
    eval_opts *o = e->o;
    /* filler and keywords */
    char *file_text = NULL, *kw_text = NULL, **kw = NULL;
    int64_t flen = 0, n_kw = 0;
    const char *fill_name;
    if (o->filler_file) {
        file_text = eval_read_text("--filler", o->filler_file, &flen);
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
            dhsa_router_params rp = eval_router_for(o, o->lengths[i], o->densities[0]);
            eval_print_router(stdout, &rp, o->lengths[i]);
        }
    }
    const int n_var = o->n_var, nL = o->n_lengths, nD = o->n_depths;
    size_t n_cells = (size_t)n_var * nD * nL;
    double *hits = calloc(n_cells, sizeof(double)), *dens = calloc(n_cells, sizeof(double));
    double *plen = calloc((size_t)nL, sizeof(double));
    if (!hits || !dens || !plen) dhsa_cli_die(EXIT_RUN, "out of memory");
    dhsa_eval_answer *res = eval_xmalloc(sizeof *res);
    /* misses explained: per variant, misses where every layer selected the needle fully, partly, not at all */
    int64_t *miss_all = calloc((size_t)n_var * 3, sizeof(int64_t));
    double *chunk_sum = calloc((size_t)n_var * 2, sizeof(double)); /* per variant: mean_chunk sum, count */
    if (!miss_all || !chunk_sum) dhsa_cli_die(EXIT_RUN, "out of memory");
    double t0 = dhsa_cli_now();
    dhsa_cli_json j = {0};
    if (o->json) {
        eval_json_begin(&j);
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
                    eval_warn_ctx(e, t.n_ids + cap_ans);
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
        eval_json_cells(&j, o, names, n_var, hits, dens);
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
        eval_json_end(&j, secs);
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
        eval_write_heatmap(o, title, sub, "accuracy", 0, 1, 2, hits, names, n_var);
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
    int needle; /* a sparse method's miss: dhsa_eval_needle; -1 for a full score,
                   a method that does not route, or a line of an older file */
} ruler_row;

static const char *const needle_word[] = {"everywhere", "partly", "nowhere"};

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
                       "expected\tgot\tseconds\tneedle\n"

/* One writer per --out: an exclusive lock held while the file is open
 * (two runs appending to one file would interleave their rows). */
static void ruler_lock_out(FILE *f, const char *path) {
    if (flock(fileno(f), LOCK_EX | LOCK_NB) == 0) return;
    if (errno == EWOULDBLOCK)
        dhsa_cli_die(EXIT_RUN, "%s is being written by another run (it holds the file's lock): wait for that run to "
                     "end, or give another --out", path);
    dhsa_cli_die(EXIT_RUN, "cannot lock %s: %s", path, strerror(errno));
}

/* Reads a previous --out: its settings line must be `config`; every
 * complete line is a finished answer (a line cut by an interruption is
 * cut off the file). Returns the file opened for appending, locked. */
static FILE *ruler_open_out(const eval_opts *o, const char *config, ruler_done *d, int64_t *n_old) {
    *n_old = 0;
    /* created if absent, never truncated before the lock is held; reads
     * start at the beginning, writes go to the end */
    FILE *f = fopen(o->out_path, "a+b");
    if (!f) dhsa_cli_die(EXIT_RUN, "cannot write %s: %s", o->out_path, strerror(errno));
    ruler_lock_out(f, o->out_path);
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
        char *fld[14];
        int k = 0;
        for (char *p = line; k < 14; k++) {
            fld[k] = p;
            char *tab = strchr(p, '\t');
            if (!tab) { k++; break; }
            *tab = 0;
            p = tab + 1;
        }
        /* 13 fields: a file written before the needle column */
        if (k != 13 && k != 14) dhsa_cli_die(EXIT_RUN, "%s line %d: %d fields, not 13 or 14", o->out_path, ln, k);
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
        row.needle = -1;
        for (int w = 0; k == 14 && w < 3; w++)
            if (strcmp(fld[13], needle_word[w]) == 0) row.needle = w;
        done_add(d, &row, key);
        (*n_old)++;
    }
    free(line);
    if (ln == 0) { /* empty file: start it (still holding its lock) */
        if (fflush(f) != 0 || ftruncate(fileno(f), 0) != 0 || fseek(f, 0, SEEK_SET) != 0)
            dhsa_cli_die(EXIT_RUN, "cannot write %s: %s", o->out_path, strerror(errno));
        fprintf(f, "%s\n" RULER_TSV_HEAD, config);
        fflush(f);
        return f;
    }
    if (fflush(f) != 0 || ftruncate(fileno(f), good) != 0 || fseek(f, good, SEEK_SET) != 0)
        dhsa_cli_die(EXIT_RUN, "cannot cut %s to its complete lines: %s", o->out_path, strerror(errno));
    return f;
}

int eval_cmd_ruler(eval_env *e) {
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
    dhsa_chat_template tmpl = eval_pick_template(e, &tmpl_why);
    const char *tmpl_name = tmpl == DHSA_CHAT_NONE ? "plain" : dhsa_chat_template_name(tmpl);
    const char *split_name = o->split == DHSA_RULER_DEV ? "dev" : "test";
    /* what a resumed --out must have been written with */
    char config[2048];
    {
        dhsa_router_params rp = eval_router_for(o, 4096, 0.0625);
        snprintf(config, sizeof config,
                 "# dhsa eval ruler: model %s, split %s, seed %llu, template %s, answer tokens %s%lld, boundary %d, "
                 "budget %lld, routing at 4K: q_block %lld sink %lld local %lld dense_below %lld min_chunk %lld "
                 "max_chunk %lld chunk %lld sim_window %lld nms_window %lld score %d carry %g",
                 o->model, split_name, (unsigned long long)o->seed, tmpl_name, o->answer_tokens_set ? "" : "task ",
                 o->answer_tokens_set ? (long long)o->answer_tokens : 0LL, (int)o->boundary, (long long)o->budget,
                 (long long)rp.q_block, (long long)rp.sink_tokens, (long long)rp.local_tokens,
                 (long long)rp.dense_below, (long long)rp.min_chunk, (long long)rp.max_chunk, (long long)rp.chunk,
                 (long long)rp.sim_window, (long long)rp.nms_window, (int)rp.score_mode, rp.carry);
        /* files written before exact_rows existed (= 0) still resume with --exact-rows 0 */
        if (rp.exact_rows)
            snprintf(config + strlen(config), sizeof config - strlen(config), " exact_rows %lld",
                     (long long)rp.exact_rows);
        /* and before rest existed (= 0) with --rest 0 */
        char rest[24];
        if (rp.rest)
            snprintf(config + strlen(config), sizeof config - strlen(config), " rest %s",
                     dhsa_cli_rest_text(rp.rest, rest, sizeof rest));
        /* and before hybrid_max_chunk existed (= 0) with --hybrid-max-chunk 0 */
        if (rp.hybrid_max_chunk)
            snprintf(config + strlen(config), sizeof config - strlen(config), " hybrid_max_chunk %lld",
                     (long long)rp.hybrid_max_chunk);
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
            dhsa_router_params rp = eval_router_for(o, o->lengths[i], o->densities[0]);
            eval_print_router(stdout, &rp, o->lengths[i]);
        }
        fflush(stdout);
    }
    dhsa_eval_answer *res = eval_xmalloc(sizeof *res);
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
                    tp.seed = eval_splitmix(&s);
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
                        eval_warn_ctx(e, pr.n_ids + cap_ans);
                        double ts = dhsa_cli_now();
                        if (dhsa_eval_ruler(e->ctx, e->m, &pr, &ap, res)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
                        double secs = dhsa_cli_now() - ts;
                        double score = dhsa_ruler_score(&pr, res->text, (int64_t)strlen(res->text));
                        /* a miss of a routing method, explained by the layouts at the prompt's last row */
                        const int routes = va->method == DHSA_ATTN_DHSA || va->method == DHSA_ATTN_BLOCK ||
                                           va->method == DHSA_ATTN_STREAM || va->method == DHSA_ATTN_ORACLE;
                        const int needle = score < 1.0 && routes && pr.n_spans > 0 ? (int)res->needle : -1;
                        ruler_row row = {task, li, v, depth, score, res->density_used, tr, pr.n_ids, needle};
                        done_add(&d, &row, key);
                        n_new++;
                        if (out) {
                            fprintf(out, "%s\t%lld\t%g\t%lld\t%s\t%g\t%lld\t%.4f\t%.4f\t%.4f\t", ruler_all[task],
                                    (long long)o->lengths[li], depth, (long long)tr, va->name, va->density,
                                    (long long)pr.n_ids, pr.depth_used, res->density_used, score);
                            tsv_str(out, expected);
                            fputc('\t', out);
                            tsv_str(out, res->text);
                            fprintf(out, "\t%.2f\t%s\n", secs, needle >= 0 ? needle_word[needle] : "-");
                            if (fflush(out) != 0) dhsa_cli_die(EXIT_RUN, "cannot write %s: %s", o->out_path, strerror(errno));
                        }
                        if (o->show && !o->json) {
                            printf("%-16s %-10s L %5lld depth %5.2f (at %.3f) score %.2f%s%s want %s got \"%s\"",
                                   ruler_all[task], va->name, (long long)pr.n_ids, depth, pr.depth_used, score,
                                   needle >= 0 ? " needle " : "", needle >= 0 ? needle_word[needle] : "", expected,
                                   res->text);
                            if (needle >= 0) { /* the share of the needle's keys each layer selected at the last row */
                                printf("; needle keys selected per layer at the prompt's last row:");
                                for (int64_t l = 0; l < res->n_layer; l++) printf(" %.2f", res->selected_at_wrong[l]);
                            }
                            printf("\n");
                        }
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
    /* misses per cell: [0..2] explained as dhsa_eval_needle, [3] a routing method's miss without
       an explanation (a line of an older file; CWE / FWE have nothing to explain by) */
    int64_t *miss = calloc(n_cells * 4, sizeof(int64_t));
    if (!sum || !dsum || !cnt || !plen || !pcnt || !miss) dhsa_cli_die(EXIT_RUN, "out of memory");
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
        const dhsa_attn_method am = o->var[r->var].method;
        if (r->score < 1.0 && am != DHSA_ATTN_DENSE) miss[c * 4 + (r->needle >= 0 ? (size_t)r->needle : 3)]++;
        cnt[c] += 1;
        plen[r->length_i] += (double)r->prompt_tokens;
        pcnt[r->length_i] += 1;
    }
    if (o->json) {
        dhsa_cli_json j;
        eval_json_begin(&j);
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
                    dhsa_cli_json_int(&j, "misses_needle_everywhere", miss[c * 4]);
                    dhsa_cli_json_int(&j, "misses_needle_partly", miss[c * 4 + 1]);
                    dhsa_cli_json_int(&j, "misses_needle_nowhere", miss[c * 4 + 2]);
                    dhsa_cli_json_int(&j, "misses_unexplained", miss[c * 4 + 3]);
                    dhsa_cli_json_close(&j);
                }
        dhsa_cli_json_close(&j);
        eval_json_end(&j, secs);
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
            int64_t mv[4] = {0, 0, 0, 0};
            for (int ti = 0; ti < n_tasks; ti++)
                for (int li = 0; li < nL; li++)
                    for (int w = 0; w < 4; w++)
                        mv[w] += miss[(((size_t)v * RULER_N_ALL + (size_t)tasks[ti]) * nL + (size_t)li) * 4 + (size_t)w];
            if (mv[0] + mv[1] + mv[2] + mv[3])
                printf("\nmisses (answers below a full score), by the asked needles' keys at the prompt's last row in "
                       "the layers that route: %lld selected in every one, %lld in some, %lld in none; %lld not "
                       "explained (lines of an older --out; cwe and fwe)\n",
                       (long long)mv[0], (long long)mv[1], (long long)mv[2], (long long)mv[3]);
        }
        printf("\n(column heads: target length (mean prompt tokens)); %lld new answers, %.1f s\n", (long long)n_new, secs);
    }
    if (o->svg) { /* per method: mean score over the run's tasks that have a depth, per depth and length */
        size_t nh = (size_t)n_var * (size_t)o->n_depths * (size_t)nL;
        double *hv = calloc(nh, sizeof(double)), *hn = calloc(nh, sizeof(double));
        const char *names[MAX_VAR];
        if (!hv || !hn) dhsa_cli_die(EXIT_RUN, "out of memory");
        for (int64_t i = 0; i < d.n; i++) {
            const ruler_row *r = &d.r[i];
            if (r->task < 0 || !in_grid[r->task] || r->length_i < 0 || r->var < 0 || r->trial >= o->trials ||
                r->depth < 0)
                continue;
            for (int di = 0; di < o->n_depths; di++)
                if (fabs(o->depths[di] - r->depth) < 1e-9) {
                    size_t c = ((size_t)r->var * (size_t)o->n_depths + (size_t)di) * (size_t)nL + (size_t)r->length_i;
                    hv[c] += r->score;
                    hn[c] += 1;
                }
        }
        for (size_t c = 0; c < nh; c++) hv[c] = hn[c] > 0 ? hv[c] / hn[c] : NAN;
        for (int v = 0; v < n_var; v++) names[v] = o->var[v].name;
        char sub[1024], list[512] = "";
        for (int ti = 0; ti < n_tasks; ti++) {
            dhsa_ruler_params tp = dhsa_ruler_default_params();
            dhsa_ruler_preset(ruler_all[tasks[ti]], &tp);
            if (tp.task == DHSA_RULER_CWE || tp.task == DHSA_RULER_FWE) continue;
            size_t l = strlen(list);
            snprintf(list + l, sizeof list - l, "%s%s", l ? ", " : "", ruler_all[tasks[ti]]);
        }
        snprintf(sub, sizeof sub, "%s; split %s; %lld samples per cell and task; tasks %s", o->model, split_name,
                 (long long)o->trials, list);
        eval_write_heatmap(o, "RULER: mean score over the tasks (share of expected strings in the answer)", sub,
                           "score", 0, 1, 2, hv, names, n_var);
        free(hv);
        free(hn);
    }
    free(miss);
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

