/* cli.h: subcommands of the dhsa CLI that live in their own files under
 * tools/ (tools/dhsa.c dispatches to them). Each takes main's argc and argv
 * unchanged (argv[1] is the subcommand's name) and returns the process exit
 * status: 0 success, 1 a run failed, 2 a usage error.
 */
#ifndef DHSA_TOOLS_CLI_H
#define DHSA_TOOLS_CLI_H

#include <stddef.h>
#include <stdint.h>

/* Strict numbers (tools/cli_num.c): the whole string must be the number;
 * integers may take a K/M/G/T suffix (powers of 1024) when suffix != 0.
 * Return 0, or -1 with a sentence naming the option in msg. */
int dhsa_cli_parse_int(const char *opt, const char *s, int64_t min, int64_t max, int suffix, int64_t *out,
                       char *msg, size_t msg_len);
int dhsa_cli_parse_real(const char *opt, const char *s, double min, double max, double *out, char *msg,
                        size_t msg_len);

/* The whole of a file ("-" = stdin) in a malloc'd, NUL-terminated buffer
 * (tools/cli_file.c); NULL with errno set when it cannot be opened or read
 * (EFBIG above max_bytes, ENOMEM). *len excludes the NUL. */
char *dhsa_cli_read_file(const char *path, int64_t max_bytes, int64_t *len);

/* The shipped default model (tools/cli_file.c), for commands run without
 * -m: $DHSA_MODEL when set, else models/DHSA_DEFAULT_MODEL beside the
 * executable's parent folder (build/dhsa -> models/), else under the
 * current folder. Returns a path that exists, or NULL with a sentence
 * saying where it looked in msg. */
#define DHSA_DEFAULT_MODEL "dhsa-retrieval-8m.gguf"
const char *dhsa_cli_default_model(char *msg, size_t msg_len);

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

/* dhsa run / plan / bench model (tools/run.c): the model runner. */
int dhsa_cli_run(int argc, char **argv);
int dhsa_cli_plan(int argc, char **argv);
extern const char dhsa_cli_run_usage[];
int dhsa_cli_bench_model(int argc, char **argv);
extern const char dhsa_cli_bench_model_usage[];
/* dhsa train-boundary (tools/train.c): the learned boundary predictor. */
int dhsa_cli_train_boundary(int argc, char **argv);
extern const char dhsa_cli_train_boundary_usage[];
/* dhsa gen-model (tools/genmodel.c): random-weight GGUF for benchmarks. */
int dhsa_cli_gen_model(int argc, char **argv);
extern const char dhsa_cli_gen_model_usage[];

/* dhsa eval fidelity|copy|niah (tools/eval.c): quality of the sparse
 * methods on a real model against dense (KL, copy retrieval, needles). */
int dhsa_cli_eval(int argc, char **argv);
extern const char dhsa_cli_eval_usage[];
extern const char dhsa_cli_eval_usage_tasks[]; /* printed after it */

#endif
