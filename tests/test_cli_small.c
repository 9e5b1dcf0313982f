/* test_cli_small.c: the small things a user trips on (issue 37), each fixed
 * and checked here:
 *   - the statistics line of `dhsa run` starts on a line of its own when
 *     stdout goes through another process and stderr is a terminal (the
 *     text and the line used to meet: "it isprompt: 20 tokens"), and has
 *     no blank line before it when both go to one pipe (a pty stands in for
 *     the terminal);
 *   - `-n 1` reports no decode speed ("n/a"), not "0.0 tok/s";
 *   - `-c` and `-t` are in the help of run, serve and eval;
 *   - the model line names the GGUF file type as llama.cpp does ("Q4_K -
 *     Medium") and the mix of tensor types (tools/lib/cli_model.c, driven on
 *     files written here in memory);
 *   - `make` rebuilds the CLI when its configuration changes (libmicrohttpd
 *     installed: HAVE_SERVE flips), with no `make clean` (the Makefile's
 *     $(BUILD)/cli-config.txt stamp), in a scratch build folder;
 *   - README.md quotes no test total (it went stale with every commit);
 *   - defaults: an F16 KV cache (library, plan, bench model), the context
 *     sized to the prompt and -n unless --ctx, and --mem-limit fitted by
 *     the KV type (f16 -> q8_0) then the context when neither was given.
 * The CLI parts need DHSA_CLI (tests/run.sh sets it) and skip without it;
 * the make part needs make and the repository root as the working folder.
 * Run: make test (or DHSA_CLI=build/dhsa build/tests/test_cli_small).
 */
#include "dhsa.h"
#include "t.h"
#include "cli_run.h"
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MODEL "models/dhsa-retrieval-8m.gguf"

/* ------------------------------------------------------ statistics line --- */

/* `dhsa run ARGS` with stdout into a pipe (read and dropped) and stderr on
 * a pseudo-terminal; what the terminal received, NUL-terminated (caller
 * frees), or NULL when no pty can be had here. */
static char *run_stderr_on_pty(const char *const *argv) {
    int master = posix_openpt(O_RDWR | O_NOCTTY);
    if (master < 0 || grantpt(master) || unlockpt(master)) return NULL;
    const char *name = ptsname(master);
    int slave = name ? open(name, O_RDWR | O_NOCTTY) : -1;
    int out[2];
    if (slave < 0 || pipe(out)) return NULL;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(out[1], 1);
        dup2(slave, 2);
        close(out[0]);
        close(out[1]);
        close(slave);
        close(master);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(out[1]);
    close(slave);
    size_t cap = 1 << 16, n = 0;
    char *buf = calloc(cap, 1), sink[4096];
    while (read(out[0], sink, sizeof sink) > 0) {}
    close(out[0]);
    int st;
    waitpid(pid, &st, 0);
    for (;;) { /* the child is gone: what it wrote waits in the pty; EIO at its end */
        ssize_t got = read(master, buf + n, cap - n - 1);
        if (got <= 0) break;
        n += (size_t)got;
        if (n + 1 >= cap) break;
    }
    close(master);
    buf[n] = 0;
    return buf;
}

static void test_statistics_line(const char *cli) {
    const char *argv[] = {cli, "run", "-m", MODEL, "-p", "The pass key is 40913. The pass key is", "-n", "3",
                          "--temp", "0", NULL};
    char *err = run_stderr_on_pty(argv);
    if (!err) {
        T_SKIP(2, "no pseudo-terminal here (posix_openpt): the statistics line on a terminal is not checked");
    } else {
        const char *p = strstr(err, "prompt: ");
        T_CHECK(p != NULL, "the statistics reached the terminal: [%.300s]", err);
        /* the tty writes \n as \r\n */
        T_CHECK(p && p > err && p[-1] == '\n',
                "stdout piped, stderr a terminal: the statistics start a line of their own: [%.300s]", err);
        free(err);
    }
    char *out = NULL;
    int rc = cli_run("run -m " MODEL " -p 'The pass key is 40913. The pass key is' -n 3 --temp 0", 0, &out);
    const char *p = out ? strstr(out, "prompt: ") : NULL;
    T_CHECK(rc == 0 && p && p > out && p[-1] == '\n' && !(p - out >= 2 && p[-2] == '\n'),
            "2>&1 into one pipe: the text's own line break, then the statistics, no blank line: [%.300s]",
            out ? out : "");
    free(out);
}

static void test_decode_speed(void) {
    char *out = NULL;
    int rc = cli_run("run -m " MODEL " -p 'Once upon a time' -n 1 --temp 0 --ignore-eos", 0, &out);
    T_CHECK(rc == 0 && out && strstr(out, "decode: 1 tokens, n/a tok/s") && !strstr(out, "0.0 tok/s"),
            "-n 1: no decode step, so no decode speed (n/a, not 0.0): %.400s", out ? out : "");
    free(out);
    rc = cli_run("run -m " MODEL " -p 'Once upon a time' -n 4 --temp 0 --ignore-eos", 0, &out);
    T_CHECK(rc == 0 && out && strstr(out, "decode: 4 tokens, ") && !strstr(out, "n/a tok/s"),
            "-n 4: a decode speed: %.400s", out ? out : "");
    free(out);
}

static void test_help_short_options(void) {
    const char *cmds[] = {"run --help", "serve --help", "eval --help"};
    for (int i = 0; i < 3; i++) {
        char *out = NULL;
        cli_run(cmds[i], 0, &out);
        T_CHECK(out && strstr(out, "-c, --ctx") && strstr(out, "-t, --threads"),
                "dhsa %s names -c and -t: %.200s", cmds[i], out ? out : "");
        free(out);
    }
}

/* ------------------------------------------------------ weights naming --- */

/* A GGUF in memory with general.file_type ft (< 0: none) and one 2-D tensor
 * of each type of types[] (256 x rows[i]), opened; buf keeps its bytes. */
static dhsa_gguf *mixed_file(int64_t ft, const uint32_t *types, const int64_t *rows, int n, void **buf) {
    dhsa_gguf_writer *w;
    static uint8_t zeros[1 << 20];
    if (dhsa_gguf_writer_create(&w)) return NULL;
    dhsa_gguf_writer_set_str(w, "general.architecture", "llama");
    if (ft >= 0) dhsa_gguf_writer_set_u32(w, "general.file_type", (uint32_t)ft);
    for (int i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "blk.%d.weight", i);
        int64_t dims[2] = {256, rows[i]}, bytes;
        if (dhsa_ggml_tensor_bytes(types[i], 2, dims, &bytes) || bytes > (int64_t)sizeof zeros ||
            dhsa_gguf_writer_add_tensor(w, name, types[i], 2, dims, zeros, bytes)) {
            dhsa_gguf_writer_free(w);
            return NULL;
        }
    }
    int64_t d1[1] = {256}, b1;
    dhsa_ggml_tensor_bytes(DHSA_GGML_F32, 1, d1, &b1);
    dhsa_gguf_writer_add_tensor(w, "norm.weight", DHSA_GGML_F32, 1, d1, zeros, b1); /* 1-D: not a matrix */
    size_t size;
    dhsa_gguf *g = NULL;
    if (!dhsa_gguf_writer_size(w, &size) && (*buf = malloc(size)) &&
        !dhsa_gguf_writer_write_memory(w, *buf, size))
        dhsa_gguf_open_memory(*buf, size, &g);
    dhsa_gguf_writer_free(w);
    return g;
}

static void weights_case(const char *what, int64_t ft, const uint32_t *types, const int64_t *rows, int n,
                         uint32_t most, const char *want) {
    void *buf = NULL;
    dhsa_gguf *g = mixed_file(ft, types, rows, n, &buf);
    char text[256] = "";
    if (g) dhsa_cli_weights_text(g, most, text, sizeof text);
    T_CHECK(g && strcmp(text, want) == 0, "%s: \"%s\", want \"%s\"", what, text, want);
    dhsa_gguf_close(g);
    free(buf);
}

static void test_weights_text(void) {
    /* Q5_0 22 bytes per 32, Q8_0 34 per 32, Q4_K 144 per 256: 256 x rows */
    const uint32_t mix[3] = {DHSA_GGML_Q4_K, DHSA_GGML_Q5_0, DHSA_GGML_Q8_0};
    const int64_t rows[3] = {100, 300, 50}; /* bytes 14400, 52800, 13600 of 80800 */
    weights_case("Q4_K_M file, mostly Q5_0 bytes", 15, mix, rows, 3, DHSA_GGML_Q5_0,
                 "Q4_K - Medium weights (matrix bytes: Q5_0 65%, Q4_K 18%, Q8_0 17%)");
    weights_case("no general.file_type: the type of most bytes, and the mix", -1, mix, rows, 3, DHSA_GGML_Q5_0,
                 "Q5_0 weights (matrix bytes: Q5_0 65%, Q4_K 18%, Q8_0 17%)");
    weights_case("a file type llama.cpp does not name (yet)", 99, mix, rows, 3, DHSA_GGML_Q5_0,
                 "file type 99 weights (matrix bytes: Q5_0 65%, Q4_K 18%, Q8_0 17%)");
    const uint32_t one[1] = {DHSA_GGML_Q8_0};
    const int64_t r1[1] = {64};
    weights_case("all Q8_0: no mix", 7, one, r1, 1, DHSA_GGML_Q8_0, "Q8_0 weights");
    const uint32_t f32[1] = {DHSA_GGML_F32};
    weights_case("all F32 (file type 0)", 0, f32, r1, 1, DHSA_GGML_F32, "all F32 weights");
    weights_case("one type, no file type", -1, f32, r1, 1, DHSA_GGML_F32, "F32 weights");
    char small[12];
    dhsa_cli_weights_text(NULL, DHSA_GGML_Q8_0, small, sizeof small);
    T_CHECK(strcmp(small, "Q8_0 weigh") == 0 || strcmp(small, "Q8_0 weight") == 0,
            "a short buffer is cut, terminated: \"%s\"", small);
}

/* ------------------------------------------------------ make rebuilds ---- */

static int make_q(const char *build, const char *vars) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s -q BUILD='%s' %s -o '%s/libdhsa.a' "
             "-o '%s/libdhsa_cli.a' -o '%s/libdhsa_serve.a' '%s/dhsa' >/dev/null 2>&1",
             build, vars, build, build, build, build);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_make_tracks_config(void) {
    if (system("command -v make >/dev/null 2>&1") != 0 || access("Makefile", R_OK) != 0 ||
        access("tools/run.c", R_OK) != 0) {
        T_SKIP(3, "make or the repository root (the working folder) is missing: the CLI's rebuild on a "
                  "configuration change is not checked");
        return;
    }
    char build[] = "/tmp/dhsa_make_cfg_XXXXXX";
    if (!mkdtemp(build)) {
        T_SKIP(3, "no scratch folder in /tmp (%s)", strerror(errno));
        return;
    }
    char path[256], stamp[256];
    snprintf(path, sizeof path, "%s/libdhsa.a", build);
    fclose(fopen(path, "w"));
    snprintf(path, sizeof path, "%s/libdhsa_cli.a", build); /* the CLI's support library */
    fclose(fopen(path, "w"));
    snprintf(path, sizeof path, "%s/libdhsa_serve.a", build); /* the server's engine and parser */
    fclose(fopen(path, "w"));
    const char *without = "HAVE_SERVE= HAVE_MPI=", *with = "HAVE_SERVE=1 HAVE_MPI=";
    int first = make_q(build, without); /* writes the stamp; no CLI yet */
    snprintf(path, sizeof path, "%s/dhsa", build);
    snprintf(stamp, sizeof stamp, "%s/cli-config.txt", build);
    struct stat ss;
    FILE *f = fopen(path, "w");
    if (f) fclose(f);
    /* the "built" CLI: just newer than the stamp (and than the sources) */
    if (stat(stamp, &ss) == 0) {
        struct timespec t[2];
        clock_gettime(CLOCK_REALTIME, &t[0]);
        t[1] = t[0];
        utimensat(AT_FDCWD, path, t, 0);
    }
    struct timespec nap = {0, 50 * 1000 * 1000};
    nanosleep(&nap, NULL);
    T_CHECK(first == 1, "make -q: a build folder without the CLI needs it built (%d)", first);
    int same = make_q(build, without);
    T_CHECK(same == 0, "make -q with the same configuration: the CLI is up to date (%d)", same);
    int changed = make_q(build, with);
    T_CHECK(changed == 1, "make -q after HAVE_SERVE changed (libmicrohttpd installed): the CLI is rebuilt, "
                          "no make clean needed (%d)", changed);
    char rm[300];
    snprintf(rm, sizeof rm, "rm -rf '%s'", build);
    if (system(rm) != 0) fprintf(stderr, "note: could not remove %s\n", build);
}

/* ------------------------------------------------------ defaults -------- */

/* "total ... (N bytes)" of a `dhsa plan` output; 0 if absent. */
static long long plan_total(const char *out) {
    const char *p = out ? strstr(out, "  total ") : NULL;
    const char *b = p ? strchr(p, '(') : NULL;
    return b ? atoll(b + 1) : 0;
}

/* F16 KV by default (library, CLI), the context sized to the prompt and
 * -n unless --ctx, and --mem-limit fitted by the KV type then the context
 * when they were not given (docs/model.md, "Defaults"). */
static void test_defaults(void) {
    dhsa_session_params sp = dhsa_session_default_params();
    T_CHECK(sp.kv_type == DHSA_F16, "dhsa_session_default_params: KV F16 (llama.cpp's default), not %s",
            dhsa_type_name(sp.kv_type));
}

static void test_cli_defaults(void) {
    char *out = NULL;
    /* "hello": BOS + 3 pieces; + -n 128 */
    int rc = cli_run("plan -m " MODEL " -p hello", 0, &out);
    T_CHECK(rc == 0 && out && strstr(out, "KV f16") && strstr(out, "ctx 132 tokens"),
            "plan: KV f16, the context the prompt and -n 128 need (132), not the trained 32768: %.600s",
            out ? out : "");
    free(out);
    rc = cli_run("plan -m " MODEL " -p hello --ctx 4K --kv f32", 0, &out);
    T_CHECK(rc == 0 && out && strstr(out, "KV f32") && strstr(out, "ctx 4096 tokens"),
            "plan --ctx 4K --kv f32: as given: %.600s", out ? out : "");
    free(out);
    rc = cli_run("bench model -m " MODEL " --lengths 64 --decode 1 --attn dense --runs 1", 0, &out);
    T_CHECK(rc == 0 && out && strstr(out, "KV f16"), "bench model: KV f16 by default: %.600s", out ? out : "");
    free(out);

    /* --mem-limit between the q8_0 and f16 plans of a 32000-token context */
    const char *big = "plan -m " MODEL " -p hello --prompt-tokens 16000 -n 16000";
    char cmd[512], *o16 = NULL, *o8 = NULL;
    snprintf(cmd, sizeof cmd, "%s --kv f16", big);
    cli_run(cmd, 0, &o16);
    snprintf(cmd, sizeof cmd, "%s --kv q8_0", big);
    cli_run(cmd, 0, &o8);
    long long t16 = plan_total(o16), t8 = plan_total(o8);
    free(o16);
    free(o8);
    T_CHECK(t16 > 0 && t8 > 0 && t16 - t8 > (20 << 20), "the f16 and q8_0 plans (%lld, %lld bytes) are 20+ MiB apart",
            t16, t8);
    long long mid = (t16 + t8) / 2;
    snprintf(cmd, sizeof cmd, "%s --mem-limit %lld", big, mid);
    rc = cli_run(cmd, 0, &out);
    T_CHECK(rc == 0 && out && strstr(out, "KV cache q8_0 (an f16 one does not fit") && strstr(out, "KV q8_0") &&
                strstr(out, "ctx 32000 tokens") && strstr(out, ": fits"),
            "--mem-limit between them, no --kv: q8_0 chosen, said, the context kept: %.700s", out ? out : "");
    free(out);
    snprintf(cmd, sizeof cmd, "%s --mem-limit %lld --kv f16", big, mid);
    rc = cli_run(cmd, 0, &out);
    T_CHECK(rc == 0 && out && strstr(out, ": context ") && strstr(out, "KV f16") && !strstr(out, "q8_0"),
            "--kv f16 given: kept, the context shrinks instead: rc %d %.500s", rc, out ? out : "");
    free(out);
    /* under the q8_0 plan by 8 MiB: the context shrinks (at least the prompt + 1) */
    snprintf(cmd, sizeof cmd, "%s --mem-limit %lld", big, t8 - (8 << 20));
    rc = cli_run(cmd, 0, &out);
    const char *c = out ? strstr(out, "memory plan: ctx ") : NULL;
    long long n_ctx = c ? atoll(c + strlen("memory plan: ctx ")) : 0;
    T_CHECK(rc == 0 && out && strstr(out, ": context ") && strstr(out, "KV q8_0") && n_ctx > 16001 &&
                n_ctx < 32000 && strstr(out, ": fits"),
            "--mem-limit under the q8_0 plan: a shorter context (%lld), said: %.700s", n_ctx, out ? out : "");
    free(out);
    snprintf(cmd, sizeof cmd, "%s --mem-limit %lld --ctx 32000 --kv f16", big, t8 - (8 << 20));
    rc = cli_run(cmd, 0, &out);
    T_CHECK(rc == 1 && out && strstr(out, "--mem-limit") && !strstr(out, ": context ") &&
                !strstr(out, "memory plan: ctx"),
            "--ctx and --kv given: nothing is changed, the plan is refused with its sentence: rc %d %.400s", rc,
            out ? out : "");
    free(out);
}

/* ------------------------------------------------------ README total ----- */

static void test_readme_quotes_no_total(void) {
    FILE *f = fopen("README.md", "r");
    if (!f) {
        T_SKIP(1, "README.md is not in the working folder (run from the repository root)");
        return;
    }
    char line[4096];
    int stale = 0, at = 0, n = 0;
    while (fgets(line, sizeof line, f)) {
        n++;
        for (char *p = strstr(line, " passed, "); p && !stale; p = strstr(p + 1, " passed, "))
            if (p > line && p[-1] >= '0' && p[-1] <= '9') stale = 1, at = n;
    }
    fclose(f);
    T_CHECK(!stale, "README.md line %d quotes a test total (\"<digits> passed, ...\"): it goes stale; say how to "
                    "get the count instead", at);
}

int main(void) {
    const char *cli = getenv("DHSA_CLI");
    if (!cli || access(cli, X_OK) != 0 || access(MODEL, R_OK) != 0) {
        T_SKIP(8 + 8, "no CLI (DHSA_CLI) or no " MODEL " in the working folder: the run, help and default checks skip");
    } else {
        test_statistics_line(cli);
        test_decode_speed();
        test_help_short_options();
        test_cli_defaults();
    }
    test_defaults();
    test_weights_text();
    test_make_tracks_config();
    test_readme_quotes_no_total();
    return t_report("test_cli_small");
}
