/* test_cli_state.c: the prompt cache of the CLI and `dhsa chat`
 * (tools/cli_state.c, tools/chat.c; docs/prompt-cache.md), on the shipped
 * model with a document of about 1,500 tokens:
 *   - `run --prompt-cache F` twice: the second run says it reused all the
 *     prompt's tokens, and both print what a run without the cache prints
 *     (greedy); a prompt that adds a question after the document reuses
 *     the document's tokens and evaluates the rest;
 *   - a file of other options (--kv f16), a corrupted file, a file that is
 *     not a state: not used, saying why, and the run's text is still that
 *     of a run without the cache;
 *   - `dhsa chat -f DOC` driven by a script on stdin (two questions,
 *     /stats, /save, /quit): it answers both, the second reuses all the
 *     conversation before it, /stats and /save report; a second chat with
 *     --prompt-cache loads the documents instead of prefilling them and
 *     gives the same answers.
 * Run: make build/tests/test_cli_state && DHSA_CLI=build/dhsa build/tests/test_cli_state
 */
#include "cli_run.h"
#include "t.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MODEL "models/dhsa-retrieval-8m.gguf"
#define N_CHECKS 16

static char dir[128];

/* stdout of a run (stderr to a file), NULL on failure */
static char *run_out(const char *args, char **err) {
    char cmd[2048], errf[256];
    snprintf(errf, sizeof errf, "%s/stderr", dir);
    snprintf(cmd, sizeof cmd, "'%s' %s 2>%s", getenv("DHSA_CLI"), args, errf);
    FILE *p = popen(cmd, "r");
    char *out = calloc(1, 1 << 16);
    size_t got = p && out ? fread(out, 1, (1 << 16) - 1, p) : 0;
    if (out) out[got] = 0;
    int st = p ? pclose(p) : -1, rc = st >= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    FILE *f = fopen(errf, "rb");
    *err = calloc(1, 1 << 16);
    if (f && *err) {
        size_t n = fread(*err, 1, (1 << 16) - 1, f);
        (*err)[n] = 0;
    }
    if (f) fclose(f);
    if (rc != 0) {
        fprintf(stderr, "  `dhsa %s` exited %d: %s\n", args, rc, *err ? *err : "");
        free(out);
        return NULL;
    }
    return out;
}

static int same(const char *a, const char *b) { return a && b && strcmp(a, b) == 0; }

int main(void) {
    const char *cli = getenv("DHSA_CLI");
    if (!cli || access(cli, X_OK) != 0) {
        T_SKIP(N_CHECKS, "DHSA_CLI is not set to an executable (tests/run.sh sets it): no CLI checks");
        return t_report("test_cli_state");
    }
    if (access(MODEL, R_OK) != 0) {
        T_SKIP(N_CHECKS, "%s is missing (run from the repository root)", MODEL);
        return t_report("test_cli_state");
    }
    snprintf(dir, sizeof dir, "/tmp/dhsa_test_cli_state_%d", (int)getpid());
    char cmd[1024], doc[256], q[256], cache[256];
    snprintf(cmd, sizeof cmd, "mkdir -p %s && head -c 5000 /usr/share/common-licenses/GPL-3 > %s/doc 2>/dev/null || "
             "{ for i in 1 2 3 4 5 6 7 8; do echo 'The quick brown fox jumps over the lazy dog near the river bank, "
             "and the dog sleeps on while the fox runs home to its den in the hills.'; done > %s/doc; }", dir, dir, dir);
    if (system(cmd)) fprintf(stderr, "could not write %s/doc\n", dir);
    snprintf(doc, sizeof doc, "%s/doc", dir);
    snprintf(q, sizeof q, "%s/docq", dir);
    snprintf(cmd, sizeof cmd, "{ cat %s; echo; echo 'What is it about?'; } > %s", doc, q);
    if (system(cmd)) fprintf(stderr, "could not write %s\n", q);
    snprintf(cache, sizeof cache, "%s/cache", dir);
    const char *opts = "-m " MODEL " -n 16 --temp 0 --no-echo --ctx 4096 --kv f32";

    /* run: without the cache, then twice with it */
    char a[1024], *e0, *e1, *e2;
    snprintf(a, sizeof a, "run %s -f %s", opts, doc);
    char *plain = run_out(a, &e0);
    snprintf(a, sizeof a, "run %s -f %s --prompt-cache %s", opts, doc, cache);
    char *first = run_out(a, &e1), *second = run_out(a, &e2);
    T_CHECK(plain && strlen(plain) > 4, "a run without the cache prints text");
    T_CHECK(first && strstr(e1, "none yet") && strstr(e1, "saved"), "the first run says it saves: %s", e1);
    T_CHECK(same(first, plain) && same(second, plain), "both runs with the cache print the text of the run without "
            "it:\n  %s\n  %s\n  %s", plain, first, second);
    const char *r = strstr(e2, "reused ");
    long n_re = 0, n_all = -1;
    if (r) sscanf(r, "reused %ld of the prompt's %ld", &n_re, &n_all);
    T_CHECK(r && n_re == n_all && n_re > 1000, "the second run reused all %ld of the prompt's tokens: %s", n_all, e2);
    free(e0);
    free(e1);
    free(e2);
    free(first);
    free(second);
    /* a question after the document: the document's tokens are reused */
    snprintf(a, sizeof a, "run %s -f %s", opts, q);
    char *qplain = run_out(a, &e0);
    snprintf(a, sizeof a, "run %s -f %s --prompt-cache %s", opts, q, cache);
    char *qcached = run_out(a, &e1);
    r = strstr(e1, "reused ");
    n_re = 0;
    n_all = -1;
    if (r) sscanf(r, "reused %ld of the prompt's %ld", &n_re, &n_all);
    T_CHECK(r && n_re > 1000 && n_re < n_all && strstr(e1, "evaluating the rest"),
            "a prompt that continues the document reuses its tokens (%ld of %ld): %s", n_re, n_all, e1);
    T_CHECK(same(qcached, qplain), "and prints the text of a run without the cache:\n  %s\n  %s", qplain, qcached);
    free(e0);
    free(e1);
    free(qcached);
    free(qplain);
    /* other options: not used, saying why */
    snprintf(a, sizeof a, "run %s -f %s --kv f16", opts, doc); /* the later --kv wins */
    char *f16 = run_out(a, &e0);
    snprintf(cmd, sizeof cmd, "cp %s %s/cache0", cache, dir);
    if (system(cmd)) fprintf(stderr, "cp failed\n");
    snprintf(a, sizeof a, "run %s -f %s --kv f16 --prompt-cache %s", opts, doc, cache);
    char *f16c = run_out(a, &e1);
    T_CHECK(e1 && strstr(e1, "not used") && strstr(e1, "--kv"), "a cache of f32 K/V with --kv f16: not used, "
            "saying why: %s", e1);
    T_CHECK(same(f16c, f16), "and the run prints the uncached f16 text");
    free(e0);
    free(e1);
    free(f16);
    free(f16c);
    /* corrupted, and not a state */
    snprintf(cmd, sizeof cmd, "cp %s/cache0 %s && printf 'XXXX' | dd of=%s bs=1 seek=100000 conv=notrunc 2>/dev/null",
             dir, cache, cache);
    if (system(cmd)) fprintf(stderr, "corrupting failed\n");
    snprintf(a, sizeof a, "run %s -f %s --prompt-cache %s", opts, doc, cache);
    char *cor = run_out(a, &e1);
    T_CHECK(e1 && strstr(e1, "not used") && strstr(e1, "corrupt") && same(cor, plain),
            "a corrupted cache: not used (\"corrupt\"), the text as without it: %s", e1);
    free(e1);
    free(cor);
    snprintf(a, sizeof a, "run %s -f %s --prompt-cache %s", opts, doc, doc);
    snprintf(cmd, sizeof cmd, "cp %s %s/notstate", doc, dir);
    if (system(cmd)) fprintf(stderr, "cp failed\n");
    snprintf(a, sizeof a, "run %s -f %s --prompt-cache %s/notstate", opts, doc, dir);
    char *ns = run_out(a, &e1);
    T_CHECK(e1 && strstr(e1, "not a dhsa state file") && same(ns, plain), "a text file as the cache: not used, "
            "saying so: %s", e1);
    free(e1);
    free(ns);
    free(plain);

    /* chat over the document, driven by stdin */
    char script[256];
    snprintf(script, sizeof script, "%s/script", dir);
    FILE *sf = fopen(script, "w");
    if (sf) {
        fprintf(sf, "What is it about?\n/stats\nAnd who wrote it?\n/save %s/saved\n/quit\n", dir);
        fclose(sf);
    }
    snprintf(a, sizeof a, "chat -m " MODEL " -n 12 --ctx 4096 -f %s --prompt-cache %s/chatcache < %s", doc, dir,
             script);
    char *c1 = run_out(a, &e1);
    char *c2 = run_out(a, &e2);
    T_CHECK(c1 && strchr(c1, '\n') && strchr(strchr(c1, '\n') + 1, '\n'), "chat answers two questions:\n%s", c1);
    T_CHECK(e1 && strstr(e1, "documents:") && strstr(e1, "prefilled"), "the first chat prefills the document: %s",
            e1 ? e1 : "");
    const char *t2 = e1 ? strstr(e1, "[first token after") : NULL;
    t2 = t2 ? strstr(t2 + 1, "[first token after") : NULL;
    long pr = 0, reu = 0, ev = -1;
    if (t2) sscanf(t2, "[first token after %*f s; prompt %ld tokens, %ld reused, %ld evaluated", &pr, &reu, &ev);
    T_CHECK(t2 && reu > 1000 && ev > 0 && ev < 40, "the second question reuses the conversation before it (%ld of %ld "
            "tokens, %ld evaluated): %s", reu, pr, ev, e1 ? e1 : "");
    T_CHECK(e1 && strstr(e1, "context:") && strstr(e1, "reused"), "/stats reports");
    char saved[300];
    snprintf(saved, sizeof saved, "%s/saved", dir);
    T_CHECK(e1 && strstr(e1, "saved") && access(saved, R_OK) == 0, "/save reports and writes %s", saved);
    T_CHECK(e2 && strstr(e2, "loaded from the prompt cache") && same(c1, c2),
            "a second chat with --prompt-cache loads the documents and answers the same: %s", e2 ? e2 : "");
    free(e1);
    free(e2);
    free(c1);
    free(c2);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
    return t_report("test_cli_state");
}
