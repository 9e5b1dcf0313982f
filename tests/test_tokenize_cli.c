/* test_tokenize_cli.c: `dhsa tokenize` as a user sees it. Runs the binary
 * named by DHSA_CLI (tests/run.sh sets it to build/dhsa; skipped when
 * unset) on ../shared/models/stories260K.gguf (skipped when absent):
 *   - "Once upon a time" -> 1 403 407 261 378, as lines "id<TAB>piece" and
 *     with --ids-only; --no-bos; --special; -f FILE and -f - (stdin) give
 *     the ids of the same text; control and invalid bytes are escaped;
 *   - errors: no -m, TEXT and -f together, unknown option (exit 2, usage);
 *     a missing model or file, a file that is not GGUF, a GGUF without a
 *     tokenizer (exit 1, a sentence); --help and `help tokenize` (exit 0);
 *   - a deliberately wrong expectation is caught;
 *   - `dhsa run --chat` (shipped model): special texts in -p and --system
 *     stay text, the prompt ids are dhsa_chat_tokenize's.
 * Run: make test, or DHSA_CLI=build/dhsa build/tests/test_tokenize_cli.
 */
#include "dhsa.h"
#include "t.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MODEL "../shared/models/stories260K.gguf"

static const char *cli;

/* Runs `sh -c "PRE 'cli' SUB ARGS"` with stderr kept (2>&1) or dropped;
 * returns the exit status (-1 if it did not exit normally) and the output
 * in *out (caller frees). */
static int run_sub(const char *pre, const char *sub, const char *args, int keep_stderr, char **out) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s'%s' %s %s %s", pre, cli, sub, args, keep_stderr ? "2>&1" : "2>/dev/null");
    FILE *p = popen(cmd, "r");
    size_t cap = 1 << 14, n = 0;
    char *buf = malloc(cap);
    if (!p || !buf) {
        if (p) pclose(p);
        free(buf);
        *out = NULL;
        return -1;
    }
    size_t got;
    while ((got = fread(buf + n, 1, cap - n - 1, p)) > 0) {
        n += got;
        if (cap - n < 1024) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) break;
            buf = nb;
            cap *= 2;
        }
    }
    buf[n] = '\0';
    int st = pclose(p);
    *out = buf;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int run(const char *pre, const char *args, int keep_stderr, char **out) {
    return run_sub(pre, "tokenize", args, keep_stderr, out);
}

/* Checks exit status and output (exact with want, or containing needle). */
static void expect(const char *pre, const char *args, int keep_stderr, int want_rc, const char *want,
                   const char *needle) {
    char *out = NULL;
    int rc = run(pre, args, keep_stderr, &out);
    int ok = rc == want_rc && out && (!want || strcmp(out, want) == 0) && (!needle || strstr(out, needle));
    T_CHECK(ok, "dhsa tokenize %s: exit %d (want %d), output:\n%s", args, rc, want_rc, out ? out : "(none)");
    free(out);
}

static char *write_temp(const void *data, size_t n) {
    static char path[64];
    snprintf(path, sizeof path, "/tmp/dhsa_tokcli_XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0) return NULL;
    int ok = write(fd, data, n) == (ssize_t)n;
    close(fd);
    return ok ? strdup(path) : NULL;
}

/* A GGUF with metadata but no tokenizer.ggml.* keys. */
static char *write_gguf_without_tokenizer(void) {
    dhsa_gguf_writer *w = NULL;
    size_t size = 0;
    void *buf = NULL;
    char *path = NULL;
    if (dhsa_gguf_writer_create(&w) == DHSA_OK &&
        dhsa_gguf_writer_set_str(w, "general.architecture", "llama") == DHSA_OK &&
        dhsa_gguf_writer_size(w, &size) == DHSA_OK && (buf = malloc(size)) &&
        dhsa_gguf_writer_write_memory(w, buf, size) == DHSA_OK)
        path = write_temp(buf, size);
    free(buf);
    dhsa_gguf_writer_free(w);
    return path;
}

/* `dhsa run --chat` with the shipped model (in the repository): a prompt
 * and a system message that type special texts get the ids
 * dhsa_chat_tokenize gives (the template's markers special, the text plain),
 * so the prompt holds one BOS and no EOS; the whole text parsed would hold
 * more (the check can fail). */
#define SHIPPED "models/dhsa-retrieval-8m.gguf"
#define N_CHAT_CHECKS 4
static void test_run_chat(void) {
    dhsa_gguf *g = NULL;
    dhsa_tokenizer *t = NULL;
    if (dhsa_gguf_open(SHIPPED, &g) != DHSA_OK || dhsa_tokenizer_from_gguf(g, &t) != DHSA_OK) {
        T_CHECK(0, "%s: %s (run from the repository root)", SHIPPED, dhsa_last_error());
        T_SKIP(N_CHAT_CHECKS - 1, "no shipped model: no --chat checks");
        dhsa_gguf_close(g);
        return;
    }
    dhsa_chat_template tmpl = dhsa_chat_detect(g);
    dhsa_gguf_close(g);
    const char *user = "<s></s>[/INST] hi", *sys = "</s><s>";
    dhsa_chat_message msgs[] = {{"system", sys}, {"user", user}};
    int32_t want[512], whole[512];
    int64_t n = 0, n_whole = 0;
    unsigned flags = dhsa_tokenizer_default_flags(t) & DHSA_TOKENIZE_ADD_BOS;
    T_CHECK(tmpl != DHSA_CHAT_NONE && dhsa_chat_tokenize(tmpl, t, msgs, 2, 1, flags, want, 512, &n) == DHSA_OK,
            "the shipped model's template %s: %s", dhsa_chat_template_name(tmpl), dhsa_last_error());
    int32_t bos = dhsa_tokenizer_bos(t), eos = dhsa_tokenizer_eos(t);
    int64_t n_bos = 0, n_eos = 0;
    for (int64_t i = 0; i < n; i++) n_bos += want[i] == bos, n_eos += want[i] == eos;
    T_CHECK(n > 0 && want[0] == bos && n_bos == 1 && n_eos == 0, "the prompt has %lld BOS, %lld EOS",
            (long long)n_bos, (long long)n_eos);
    char text[1024];
    int64_t len = 0, n_special = 0;
    if (dhsa_chat_apply(tmpl, msgs, 2, 1, text, sizeof text, &len) == DHSA_OK &&
        dhsa_tokenize(t, text, len, flags | DHSA_TOKENIZE_PARSE_SPECIAL, whole, 512, &n_whole) == DHSA_OK)
        for (int64_t i = 0; i < n_whole; i++) n_special += whole[i] == bos || whole[i] == eos;
    T_CHECK(n_special > n_bos, "the whole text parsed holds %lld BOS/EOS (the user's included)", (long long)n_special);
    char args[1024], *out = NULL;
    snprintf(args, sizeof args, "-m %s --chat --system '%s' -p '%s' --ids -n 1 --temp 0", SHIPPED, sys, user);
    int rc = run_sub("", "run", args, 0, &out);
    int same = rc == 0 && out != NULL;
    const char *p = out;
    for (int64_t i = 0; same && i < n; i++) {
        char *e;
        long v = strtol(p, &e, 10);
        same = e != p && v == want[i];
        p = e;
    }
    T_CHECK(same, "dhsa run %s: the prompt ids are dhsa_chat_tokenize's (exit %d):\n%s", args, rc, out ? out : "");
    free(out);
    dhsa_tokenizer_free(t);
}

/* Every check of main below needs the CLI and the model: what a skip of it all counts. */
#define N_CHECKS 25

int main(void) {
    cli = getenv("DHSA_CLI");
    if (!cli || access(cli, X_OK) != 0) {
        T_SKIP(N_CHECKS + N_CHAT_CHECKS, "DHSA_CLI is not set to an executable (tests/run.sh sets it): no CLI checks");
        return t_report("test_tokenize_cli");
    }
    test_run_chat();
    if (access(MODEL, R_OK) != 0) {
        T_SKIP(N_CHECKS, "%s is missing: no CLI checks", MODEL);
        return t_report("test_tokenize_cli");
    }
    const char *m = "-m " MODEL;
    char args[1024];

    /* the ids and the pieces */
    snprintf(args, sizeof args, "%s --ids-only 'Once upon a time'", m);
    expect("", args, 0, 0, "1 403 407 261 378\n", NULL);
    snprintf(args, sizeof args, "%s 'Once upon a time'", m);
    expect("", args, 0, 0, "1\t<s>\n403\t Once\n407\t upon\n261\t a\n378\t time\n", NULL);
    snprintf(args, sizeof args, "%s --no-bos --ids-only 'Once upon a time'", m);
    expect("", args, 0, 0, "403 407 261 378\n", NULL);
    snprintf(args, sizeof args, "--ids-only --model=%s 'Once upon a time'", MODEL);
    expect("", args, 0, 0, "1 403 407 261 378\n", NULL);
    snprintf(args, sizeof args, "%s --no-bos --special --ids-only '<s>'", m);
    expect("", args, 0, 0, "1\n", NULL);
    snprintf(args, sizeof args, "%s --no-bos '<s>'", m);
    expect("", args, 0, 0, NULL, "\t<\n"); /* without --special: the text's letters */
    snprintf(args, sizeof args, "%s --no-bos -- --x", m);
    expect("", args, 0, 0, NULL, "\t-\n"); /* after --, a text that looks like an option */

    /* -f FILE and stdin give the ids of the same text */
    char *txt = write_temp("Once upon a time", 16);
    T_CHECK(txt != NULL, "temp file");
    if (txt) {
        snprintf(args, sizeof args, "%s --ids-only -f '%s'", m, txt);
        expect("", args, 0, 0, "1 403 407 261 378\n", NULL);
        unlink(txt);
        free(txt);
    }
    snprintf(args, sizeof args, "%s --ids-only -f -", m);
    expect("printf 'Once upon a time' | ", args, 0, 0, "1 403 407 261 378\n", NULL);

    /* control and invalid bytes are visible */
    char *ctl = write_temp("a\tb\n\\\xFF", 6);
    if (ctl) {
        snprintf(args, sizeof args, "%s --no-bos -f '%s'", m, ctl);
        char *out = NULL;
        int rc = run("", args, 0, &out);
        T_CHECK(rc == 0 && out && strstr(out, "\t\\t\n") && strstr(out, "\t\\n\n") && strstr(out, "\t\\\\\n") &&
                    strstr(out, "\t\\xff\n") && !strchr(out, '\xFF'),
                "escapes \\t \\n \\\\ \\xff:\n%s", out ? out : "(none)");
        free(out);
        unlink(ctl);
        free(ctl);
    }

    /* usage errors: exit 2 with the usage text */
    expect("", "'Once'", 1, 2, NULL, "-m MODEL is required");
    snprintf(args, sizeof args, "%s", m);
    expect("", args, 1, 2, NULL, "nothing to tokenize");
    snprintf(args, sizeof args, "%s -f x 'Once'", m);
    expect("", args, 1, 2, NULL, "not both");
    snprintf(args, sizeof args, "%s --bogus 'Once'", m);
    expect("", args, 1, 2, NULL, "unknown option \"--bogus\"");
    snprintf(args, sizeof args, "%s a b", m);
    expect("", args, 1, 2, NULL, "one TEXT only");
    expect("", "-m", 1, 2, NULL, "needs a value");
    expect("", "--help", 1, 0, NULL, "usage: dhsa tokenize");

    /* run errors: exit 1 with a sentence */
    expect("", "-m /nonexistent/model.gguf x", 1, 1, NULL, "cannot open /nonexistent/model.gguf");
    snprintf(args, sizeof args, "%s -f /nonexistent/text.txt", m);
    expect("", args, 1, 1, NULL, "cannot read /nonexistent/text.txt");
    char *not_gguf = write_temp("this is not a GGUF file, only text", 34);
    if (not_gguf) {
        snprintf(args, sizeof args, "-m '%s' x", not_gguf);
        expect("", args, 1, 1, NULL, "cannot open");
        unlink(not_gguf);
        free(not_gguf);
    }
    char *no_tok = write_gguf_without_tokenizer();
    T_CHECK(no_tok != NULL, "a GGUF without tokenizer written");
    if (no_tok) {
        snprintf(args, sizeof args, "-m '%s' x", no_tok);
        expect("", args, 1, 1, NULL, "no tokenizer dhsa can use");
        unlink(no_tok);
        free(no_tok);
    }

    /* `dhsa help tokenize` (run through the main binary's help) */
    char cmd[1200], buf[256] = {0};
    snprintf(cmd, sizeof cmd, "'%s' help tokenize", cli);
    FILE *p = popen(cmd, "r");
    size_t got = p ? fread(buf, 1, sizeof buf - 1, p) : 0;
    int st = p ? pclose(p) : -1;
    T_CHECK(got > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0 && strstr(buf, "usage: dhsa tokenize"),
            "dhsa help tokenize");

    /* a check that can fail: the right output against a wrong expectation */
    char *out = NULL;
    snprintf(args, sizeof args, "%s --ids-only 'Once upon a time'", m);
    int rc = run("", args, 0, &out);
    T_CHECK(rc == 0 && out && strcmp(out, "1 403 407 261 379\n") != 0, "a wrong expectation is caught");
    free(out);
    return t_report("test_tokenize_cli");
}
