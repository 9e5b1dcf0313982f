/* cli.h: subcommands of the dhsa CLI that live in their own files under
 * tools/ (tools/dhsa.c dispatches to them). Each takes main's argc and argv
 * unchanged (argv[1] is the subcommand's name) and returns the process exit
 * status: 0 success, 1 a run failed, 2 a usage error.
 */
#ifndef DHSA_TOOLS_CLI_H
#define DHSA_TOOLS_CLI_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include "dhsa.h"

#if defined(__GNUC__)
#define DHSA_CLI_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define DHSA_CLI_PRINTF(a, b)
#endif

/* ------------------------------------------------------------------------ */
/* What every subcommand shares (tools/cli_base.c): how it fails, its timer,
 * its number and list options. Exit status: 0 success, DHSA_EXIT_RUN a run
 * failed, DHSA_EXIT_USAGE the command line is wrong (nothing ran). */
#define DHSA_EXIT_RUN 1
#define DHSA_EXIT_USAGE 2

/* Names the running command for every message ("run" -> "dhsa run: ...")
 * and what a usage error prints after its sentence and a blank line (NULL:
 * nothing; e.g. "(see dhsa help run)\n" or a whole usage text). */
void dhsa_cli_set_command(const char *name, const char *after_usage_error);
const char *dhsa_cli_command(void);
/* "dhsa NAME: sentence" on stderr, then exit(code). */
_Noreturn void dhsa_cli_die(int code, const char *fmt, ...) DHSA_CLI_PRINTF(2, 3);
/* A library call failed: "dhsa NAME: what: the library's sentence", exit 1. */
_Noreturn void dhsa_cli_die_lib(const char *what);
/* "dhsa NAME: sentence\n" on stderr with one write(2), as dhsa_cli_die
 * writes its line: under mpirun (more than one rank) the line says "rank r
 * of R: " after the name, and the lines of several ranks never mix (a line
 * is cut at 4 KiB, under PIPE_BUF). For warnings and errors that go on. */
void dhsa_cli_error_line(const char *fmt, ...) DHSA_CLI_PRINTF(1, 2);
/* The same line into buf (cap bytes, NUL-terminated); returns its length.
 * For a line written later from a signal handler. */
size_t dhsa_cli_format_line(char *buf, size_t cap, const char *fmt, ...) DHSA_CLI_PRINTF(3, 4);
/* --threads T for every subcommand: 1..1024, and above the online CPUs
 * capped to them with a warning line (more threads than CPUs only wait for
 * each other: 999 on 2 cores took 97 s instead of 1-2 s; results do not
 * depend on the count). */
int dhsa_cli_threads(const char *opt, const char *s);
/* sysconf(_SC_NPROCESSORS_ONLN), at least 1. */
int dhsa_cli_online_cpus(void);
/* Monotonic seconds. */
double dhsa_cli_now(void);
/* Median of v[0..n) (sorts v). */
double dhsa_cli_median(double *v, int n);
/* "512 B", "1.50 KiB", "143 MiB", "-312 KiB": binary units, 3 significant
 * digits; "-" when not finite. */
const char *dhsa_cli_bytes(double bytes, char *buf, size_t cap);
/* Writes s[0..n) to stdout with the library's escaping (src/core/escape.c,
 * flags DHSA__ESC_*): control bytes, invalid UTF-8 and the code points a
 * terminal acts on as \xhh, so a key, a tensor name or a token piece from
 * a file cannot drive the terminal. Returns the bytes written. */
size_t dhsa_cli_print_escaped(const char *s, int64_t n, unsigned flags);

/* ------------------------------------------------------------------------ */
/* JSON out (tools/lib/cli_json.c): the one writer of every --json output.
 * Strings: '"' and '\\' backslashed, other bytes below 0x20 as \u00xx;
 * the style bits add what each output has always done:
 *   DHSA_CLI_JSON_CHECK_UTF8     bytes that are not valid UTF-8 become
 *                                \ufffd (eval: a model's answer may hold
 *                                byte tokens), so the document parses;
 *   DHSA_CLI_JSON_SHORT_ESCAPES  \n and \t as such, DEL as \u007f
 *                                (memprobe: a command's output).
 * Without CHECK_UTF8 bytes from 0x80 up are copied as they are. Numbers
 * that are not finite are written as null (JSON has no NaN or Inf). */
#define DHSA_CLI_JSON_CHECK_UTF8 1u
#define DHSA_CLI_JSON_SHORT_ESCAPES 2u
/* The NUL-terminated s as a JSON string on f. */
void dhsa_cli_json_string(FILE *f, const char *s, unsigned style);
/* v with the printf format fmt (one double conversion), or null. */
void dhsa_cli_json_number(FILE *f, const char *fmt, double v);

/* A writer that keeps the separators: open an object or an array, write
 * values, close what was opened; closing the outermost one ends the line.
 * key names the member inside an object and is NULL inside an array and at
 * the top. ", " between items, ": " after a key. The struct is the
 * caller's (no allocation); nesting deeper than DHSA_CLI_JSON_MAX_DEPTH
 * writes nothing more and sets too_deep. */
#define DHSA_CLI_JSON_MAX_DEPTH 16
typedef struct {
    FILE *f;
    unsigned style;            /* DHSA_CLI_JSON_* for every string and key */
    const char *number_format; /* printf format of dhsa_cli_json_num ("%.6g") */
    int depth, too_deep;
    char kind[DHSA_CLI_JSON_MAX_DEPTH]; /* '}' or ']' per open level */
    int items[DHSA_CLI_JSON_MAX_DEPTH]; /* items written per open level */
} dhsa_cli_json;
void dhsa_cli_json_init(dhsa_cli_json *j, FILE *f, unsigned style, const char *number_format);
void dhsa_cli_json_object(dhsa_cli_json *j, const char *key);
void dhsa_cli_json_array(dhsa_cli_json *j, const char *key);
void dhsa_cli_json_close(dhsa_cli_json *j);
void dhsa_cli_json_str(dhsa_cli_json *j, const char *key, const char *s); /* s NULL: null */
void dhsa_cli_json_num(dhsa_cli_json *j, const char *key, double v);
/* v with its own printf format fmt instead of number_format ("%.4f"). */
void dhsa_cli_json_numf(dhsa_cli_json *j, const char *key, const char *fmt, double v);
void dhsa_cli_json_int(dhsa_cli_json *j, const char *key, int64_t v);
void dhsa_cli_json_bool(dhsa_cli_json *j, const char *key, int v);
void dhsa_cli_json_null(dhsa_cli_json *j, const char *key);

/* The strict parsers below, exiting with a usage error that names opt. */
int64_t dhsa_cli_int(const char *opt, const char *s, int64_t min, int64_t max, int suffix);
double dhsa_cli_real(const char *opt, const char *s, double min, double max);
/* A comma list of 1..max items ("4K,16K"): an empty list, an empty item or
 * more than max items is a usage error. Items point into buf (cap bytes,
 * which must hold s). Returns the count. */
int dhsa_cli_split_list(const char *opt, const char *s, char *buf, size_t cap, char **items, int max);
int dhsa_cli_int_list(const char *opt, const char *s, int64_t min, int64_t max_value, int suffix, int64_t *out,
                      int max);
int dhsa_cli_real_list(const char *opt, const char *s, double min, double max_value, double *out, int max);
/* --score: "pooled", "moments", "heads" or "bound" (dhsa_chunk_score), and back. */
int dhsa_cli_chunk_score(const char *opt, const char *s);
const char *dhsa_cli_chunk_score_name(int score);
/* The routing defaults of every command (dhsa_router_params_for): unset
 * marks the length-scaled fields (and the chunk score) as not given (-1)
 * before the options are parsed; fill gives each field still unset its
 * default for L tokens at the density; print writes the one line every
 * command prints ("routing at L = ...: ...", tests/test_defaults.c). */
void dhsa_cli_router_unset(dhsa_router_params *rp);
void dhsa_cli_router_fill(dhsa_router_params *rp, int64_t L, double density);
void dhsa_cli_print_router(FILE *f, const dhsa_router_params *rp, int64_t L);
/* --rest's value: "hybrid" (DHSA_REST_HYBRID) or 0 .. DHSA_REST_MAX; and
 * back to text (buf for numbers). */
#define DHSA_CLI_REST_UNSET INT64_MIN
int64_t dhsa_cli_rest(const char *opt, const char *v);
const char *dhsa_cli_rest_text(int64_t rest, char *buf, size_t cap);

/* Strict numbers (tools/lib/cli_num.c): the whole string must be the number;
 * integers may take a K/M/G/T suffix (powers of 1024) when suffix != 0.
 * Return 0, or -1 with a sentence naming the option in msg. */
int dhsa_cli_parse_int(const char *opt, const char *s, int64_t min, int64_t max, int suffix, int64_t *out,
                       char *msg, size_t msg_len);
int dhsa_cli_parse_real(const char *opt, const char *s, double min, double max, double *out, char *msg,
                        size_t msg_len);

/* The whole of a file ("-" = stdin) in a malloc'd, NUL-terminated buffer
 * (tools/cli_file.c); NULL with errno set when it cannot be opened or read
 * (EISDIR a directory, EFBIG above max_bytes, ENOMEM). The limit holds
 * before reading: a regular file's size is checked first, and a pipe or
 * device is read to at most max_bytes + 1 bytes. *len excludes the NUL. */
char *dhsa_cli_read_file(const char *path, int64_t max_bytes, int64_t *len);
/* The same, exiting with a sentence that names opt, the path and, when it
 * is too large, the limit and why (limit_why: "the context of 4096
 * tokens", NULL for none). */
char *dhsa_cli_slurp(const char *opt, const char *path, int64_t max_bytes, const char *limit_why, int64_t *len);
/* --json-schema ARG / --json (arg NULL): the compiled schema. ARG is the
 * schema's JSON text when it begins with '{' (after blanks), else a file
 * holding it (at most 1 MiB). Exits (usage) with the reason when it cannot
 * be read or compiled (a keyword outside the subset is named). */
dhsa_json_schema *dhsa_cli_json_schema(const char *opt, const char *arg);
/* The most bytes of text that can tokenize to at most n_tokens tokens with
 * tok: n_tokens x its longest piece (no token stands for more text than
 * its piece), plus room for a BOS; a file limit known before reading. */
int64_t dhsa_cli_text_limit(const dhsa_tokenizer *tok, int64_t n_tokens);

/* Refuses, before any work, an output path that cannot be written (a
 * directory, a missing folder, a folder where no file can be created):
 * usage error naming opt and the path. Every output is then written
 * through a temporary renamed into place (src/util/outfile.h). */
void dhsa_cli_check_output(const char *opt, const char *path);
/* Refuses (usage error) an output that is one of the inputs (same file). */
void dhsa_cli_check_not_input(const char *opt, const char *out, const char *input_opt, const char *input);

/* Usage error for --tokenizer given with a GGUF model (which carries its
 * own tokenizer): the option would be ignored. */
void dhsa_cli_check_tokenizer(const char *model, const char *tokenizer);
/* Loads the predictor of --boundary learned:FILE and checks its width
 * against the model's keys (width_needed, 0 = no check); exits naming the
 * file. */
dhsa_predictor *dhsa_cli_load_predictor(const char *path, int64_t width_needed, const char *width_what);

/* The shipped default model (tools/cli_file.c), for commands run without
 * -m: $DHSA_MODEL when set, else models/DHSA_DEFAULT_MODEL beside the
 * executable's parent folder (build/dhsa -> models/), else under the
 * current folder. Returns a path that exists, or NULL with a sentence
 * saying where it looked in msg. */
#define DHSA_DEFAULT_MODEL "dhsa-retrieval-8m.gguf"
const char *dhsa_cli_default_model(char *msg, size_t msg_len);

/* dhsa pull (tools/pull.c): a model of the catalog (models/catalog) into
 * the cache ($DHSA_MODELS, default ~/.cache/dhsa/models), checked. */
int dhsa_cli_pull(int argc, char **argv);
extern const char dhsa_cli_pull_usage[];
/* What -m ARG names: ARG itself when a file is there, when it has a folder
 * or is not a catalog name; a catalog name's pulled file (or the
 * repository's file for the shipped model). A catalog name not pulled yet
 * exits with a sentence that says `dhsa pull NAME`. Static storage. */
const char *dhsa_cli_model_arg(const char *arg);

/* The model part of `dhsa demo` (tools/demo_model.c): a passkey prompt of
 * about L tokens answered with dense, DHSA, block and streaming attention. */
int dhsa_cli_model_demo(const char *model, int64_t L, int threads);

/* dhsa memprobe (tools/memprobe.c): peak memory of a command as n grows. */
int dhsa_cli_memprobe(int argc, char **argv);
extern const char dhsa_cli_memprobe_usage[]; /* for `dhsa help memprobe` */

/* dhsa bench sparse (tools/sparse.c): dense vs a sparse method, same run. */
int dhsa_cli_bench_sparse(int argc, char **argv);
extern const char dhsa_cli_bench_sparse_usage[];
/* The sparse part of `dhsa demo`: dense vs DHSA vs block vs streaming on a
 * synthetic sequence of L tokens, as a short table. */
int dhsa_cli_sparse_demo(int64_t L, int threads);
/* dhsa bench decode (tools/sparse.c): one decode step, index vs dense. */
int dhsa_cli_bench_decode(int argc, char **argv);
extern const char dhsa_cli_bench_decode_usage[];
/* dhsa bench matmul (tools/matmul.c): the weight products, per weight type. */
int dhsa_cli_bench_matmul(int argc, char **argv);
extern const char dhsa_cli_bench_matmul_usage[];

/* dhsa convert (tools/convert.c): llama2.c checkpoint + tokenizer -> GGUF. */
int dhsa_cli_convert(int argc, char **argv);
extern const char dhsa_cli_convert_usage[];
/* dhsa inspect (tools/inspect.c): what a GGUF file or llama2.c checkpoint
 * holds (metadata, tensors, totals). */
int dhsa_cli_inspect(int argc, char **argv);
extern const char dhsa_cli_inspect_usage[];

/* dhsa tokenize (tools/tokenize.c): a text's token ids and pieces with a
 * GGUF model's tokenizer. */
int dhsa_cli_tokenize(int argc, char **argv);
extern const char dhsa_cli_tokenize_usage[];

/* The prompt cache (tools/cli_state.c, docs/prompt-cache.md): loads the
 * state saved in path into s (created empty) and keeps of it the longest
 * prefix of ids[0..n) it holds, the last token excluded unless the file
 * holds exactly ids with their logits (then written to logits and
 * *have_logits set); returns the tokens kept (the session's length),
 * saying on stderr what it reused or why it used nothing (a missing file,
 * another model or option, another prompt: the caller prefills). */
int64_t dhsa_cli_cache_load(dhsa_session *s, const char *path, const int32_t *ids, int64_t n, float *logits,
                            int *have_logits);
/* Saves s (holding ids[0..n), logits after the last) to path, saying so;
 * exits on failure. */
void dhsa_cli_cache_save(dhsa_session *s, const char *path, const int32_t *ids, int64_t n, const float *logits);

/* dhsa chat (tools/chat.c): a conversation over documents, prefilled once. */
int dhsa_cli_chat(int argc, char **argv);
extern const char dhsa_cli_chat_usage[];

/* dhsa run / plan / bench model (tools/run.c): the model runner. */
int dhsa_cli_run(int argc, char **argv);
int dhsa_cli_plan(int argc, char **argv);
extern const char dhsa_cli_run_usage[];
int dhsa_cli_bench_model(int argc, char **argv);
/* The model line run and bench model print (tools/run.c). */
void dhsa_cli_print_model(FILE *f, const char *path, const dhsa_model *m, const dhsa_model_info *in);
extern const char dhsa_cli_bench_model_usage[];
extern const char dhsa_cli_dist_usage[]; /* printed after run's and bench model's */
extern const char dhsa_cli_run_cache_usage[]; /* --prompt-cache, printed after run's */
/* dhsa train-boundary (tools/train.c): the learned boundary predictor. */
int dhsa_cli_train_boundary(int argc, char **argv);
extern const char dhsa_cli_train_boundary_usage[];
/* dhsa gen-model (tools/genmodel.c): random-weight GGUF for benchmarks. */
int dhsa_cli_gen_model(int argc, char **argv);
extern const char dhsa_cli_gen_model_usage[];

/* dhsa serve (tools/serve.c): the OpenAI-compatible HTTP server; built
 * to refuse, naming the packages, without libmicrohttpd and jansson. */
int dhsa_cli_serve(int argc, char **argv);
extern const char dhsa_cli_serve_usage[];

/* dhsa eval fidelity|copy|niah (tools/eval.c): quality of the sparse
 * methods on a real model against dense (KL, copy retrieval, needles). */
int dhsa_cli_eval(int argc, char **argv);
extern const char dhsa_cli_eval_usage[];
extern const char dhsa_cli_eval_usage_tasks[]; /* printed after it */

/* ------------------------------------------------------------------------ */
/* The model line's weights (tools/lib/cli_model.c): the GGUF file type as
 * llama.cpp names it ("Q4_K - Medium weights"; without general.file_type
 * the type of most matrix bytes, most_type) and, when the matrices hold
 * more than that one type, their mix by bytes ("(matrix bytes: Q5_0 61%,
 * Q8_0 27%, ...)"). g may be NULL (a llama.2c checkpoint). */
void dhsa_cli_weights_text(const dhsa_gguf *g, uint32_t most_type, char *out, size_t cap);

/* The chat format of run --chat, chat and serve (tools/cli_base.c):
 * --template NAME when given ("plain": DHSA_CHAT_NONE, no template), else
 * the model's own as dhsa_chat_choose checks it; *how says which way
 * ("--template", or dhsa_chat_choose's sentence). A model template dhsa
 * does not render exactly exits with the library's sentence, which names
 * the closest format and asks for --template NAME or --template plain. */
dhsa_chat_template dhsa_cli_chat_template(const dhsa_gguf *g, const char *name, const char **how);

#endif
