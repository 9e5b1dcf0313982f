/* eval.h: what the two files of `dhsa eval` share (tools/eval.c: options,
 * fidelity, copy, niah and the command's entry; tools/eval_tasks.c: the
 * retrieval tasks passkey/multikey/multivalue and ruler): the options, the
 * loaded model and the helpers both use. Private to the CLI.
 */
#ifndef DHSA_TOOLS_EVAL_H
#define DHSA_TOOLS_EVAL_H

#include <stdint.h>
#include <stdio.h>

#include "cli.h"
#include "dhsa.h"

#define EXIT_RUN DHSA_EXIT_RUN
#define EXIT_USAGE DHSA_EXIT_USAGE
#define MAX_LIST 16

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
    double carry;        /* < 0 = the default */
    int64_t exact_rows;  /* < 0 = the default */
    int64_t rest;        /* DHSA_CLI_REST_UNSET = the default */
    int64_t hybrid_max_chunk; /* < 0 = the default (0 when --min/--max-chunk are given) */
    int json, show, passage_kind; /* 0 tokens, 1 words, 2 text */
    variant var[MAX_VAR];
    int n_var;
    dhsa_predictor *predictor;
} eval_opts;

/* The model and ctx every command of one run uses. */
typedef struct {
    dhsa_ctx *ctx;
    dhsa_model *m;
    const dhsa_model_info *in;
    const dhsa_tokenizer *tok;
    eval_opts *o;
    int warned_ctx;
} eval_env;

/* In eval.c. */
void *eval_xmalloc(size_t n);
char *eval_read_text(const char *opt, const char *path, int64_t *len);
dhsa_router_params eval_router_for(const eval_opts *o, int64_t L, double density);
void eval_print_router(FILE *f, const dhsa_router_params *rp, int64_t L);
dhsa_eval_method eval_method(const eval_opts *o, dhsa_attn_method m, double density, int64_t L);
void eval_warn_ctx(eval_env *e, int64_t n_ctx);
void eval_json_begin(dhsa_cli_json *j);
void eval_json_cells(dhsa_cli_json *j, const eval_opts *o, const char *const *names, int n_var,
                     const double *hits, const double *dens);
void eval_json_end(dhsa_cli_json *j, double secs);
uint64_t eval_splitmix(uint64_t *s);
dhsa_chat_template eval_pick_template(eval_env *e, const char **why);
/* The heat map of --svg: values [var][depth][length], a panel per variant. */
void eval_write_heatmap(const eval_opts *o, const char *title, const char *subtitle, const char *scale_label,
                        double lo, double hi, int digits, const double *values, const char *const *names,
                        int n_var);

/* In eval_tasks.c. */
int eval_cmd_retrieval(eval_env *e, dhsa_task_kind kind);
int eval_cmd_ruler(eval_env *e);

#endif
