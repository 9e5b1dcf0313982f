/* test_real_models.c: the pulled pretrained models (dhsa pull, models/catalog)
 * against llama.cpp, from vectors stored by bench/real_models_peer.py.
 *
 *   - tests/real_models.tsv, per model (smollm2-135m-instruct, gemma-3-270m,
 *     qwen2.5-coder-0.5b-instruct): the ids of a short mixed text (prose,
 *     numbers, code, Cyrillic, Japanese, Arabic, emoji; BOS as the
 *     vocabulary says, special tokens parsed), then `dhsa run --exact
 *     --kv f32 --temp 0 -n 16 --ids` (llama.cpp's K/V were F32 too) on a plain prompt, and for the instruct models
 *     on `--chat --template chatml`: the prompt ids and the 16 greedy tokens (or up
 *     to the end of the turn) must be llama.cpp's. llama.cpp's margins
 *     between its best and second logit are stored too: the prompts were
 *     chosen where they are wide (docs/models.md).
 *   - tests/pre_sets_peer.tsv: SmolLM2's vocabulary run under one name of
 *     every pre-tokenizer regex set dhsa runs (dhsa_tok__set_pre), 84
 *     strings each (bench/tokenizer_peer.py's and some aimed at each set):
 *     llama.cpp's ids, with that name in the file.
 * A model that is not pulled skips its checks, saying which pull command
 * brings it ($DHSA_MODELS, default ~/.cache/dhsa/models). A changed id in an
 * expectation must be caught (checked on the first text).
 * Run: make test, or DHSA_CLI=build/dhsa build/tests/test_real_models (from
 * the repository root).
 */
#include "cli_run.h"
#include "dhsa.h"
#include "model/tokenizer.h"
#include "t.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define FIXTURE "tests/real_models.tsv"
#define PRE_FIXTURE "tests/pre_sets_peer.tsv"
#define MAX_IDS 4096

typedef struct {
    const char *name, *file;
    int checks; /* what it runs when present: tok 2, greedy 2, chat 2 */
} model;

static const model models[] = {
    {"smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf", 6},
    {"gemma-3-270m", "gemma-3-270m-q4_k_m.gguf", 4},
    {"qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-0.5b-instruct-q8_0.gguf", 6},
};
#define N_MODELS 3
#define N_PRE_SETS 20

static char models_dir[1024];

static int model_path(const model *m, char *out, size_t cap) {
    snprintf(out, cap, "%s/%s", models_dir, m->file);
    FILE *f = fopen(out, "rb");
    if (f) fclose(f);
    return f != NULL;
}

static long unhex(char *s) {
    long n = 0;
    for (const char *p = s; p[0] && p[1]; p += 2) {
        unsigned v;
        if (sscanf(p, "%2x", &v) != 1) return -1;
        s[n++] = (char)v;
    }
    s[n] = 0;
    return n;
}

/* "1 2 3" -> ids; returns the count. */
static int parse_ids(const char *s, int32_t *ids, int cap) {
    int n = 0;
    char *end;
    while (n < cap) {
        long v = strtol(s, &end, 10);
        if (end == s) break;
        ids[n++] = (int32_t)v;
        s = end;
    }
    return n;
}

static int same(const int32_t *a, int na, const int32_t *b, int nb) {
    return na == nb && memcmp(a, b, sizeof *a * (size_t)na) == 0;
}

static void print_ids(const char *what, const int32_t *a, int n) {
    fprintf(stderr, "    %s:", what);
    for (int i = 0; i < n; i++) fprintf(stderr, " %d", a[i]);
    fprintf(stderr, "\n");
}

static char *fields(char *line, char **f, int max, int *nf) {
    *nf = 0;
    line[strcspn(line, "\n")] = 0;
    for (char *p = line, *tab; *nf < max && p; p = tab ? tab + 1 : NULL) {
        tab = strchr(p, '\t');
        if (tab) *tab = 0;
        f[(*nf)++] = p;
    }
    return line;
}

/* ------------------------------------------------------------- models --- */

static dhsa_tokenizer *load_tokenizer(const char *path) {
    dhsa_gguf *g = NULL;
    dhsa_tokenizer *t = NULL;
    if (dhsa_gguf_open(path, &g) == DHSA_OK) {
        if (dhsa_tokenizer_from_gguf(g, &t) != DHSA_OK) fprintf(stderr, "  %s: %s\n", path, dhsa_last_error());
        dhsa_gguf_close(g);
    }
    return t;
}

/* One row of real_models.tsv on a present model. */
static void check_row(char **f, int nf, const char *path) {
    static int32_t want[MAX_IDS], want_gen[MAX_IDS], got[MAX_IDS];
    if (strcmp(f[0], "tok") == 0 && nf == 4) {
        long n = unhex(f[2]);
        int nw = parse_ids(f[3], want, MAX_IDS);
        dhsa_tokenizer *t = load_tokenizer(path);
        int64_t k = -1;
        if (t)
            dhsa_tokenize(t, f[2], n, dhsa_tokenizer_default_flags(t) | DHSA_TOKENIZE_PARSE_SPECIAL, got, MAX_IDS, &k);
        T_CHECK(t && same(got, (int)k, want, nw), "%s: the mixed text's %d ids are llama.cpp's (dhsa %lld)", f[1], nw,
                (long long)k);
        if (t && !same(got, (int)k, want, nw)) {
            print_ids("llama.cpp", want, nw);
            print_ids("dhsa     ", got, (int)k);
        }
        if (t && nw > 0) { /* the comparison can fail: one id changed */
            want[nw / 2]++;
            T_CHECK(!same(got, (int)k, want, nw), "%s: a changed id is caught", f[1]);
        }
        dhsa_tokenizer_free(t);
        return;
    }
    int chat = strcmp(f[0], "chat") == 0;
    if ((chat || strcmp(f[0], "greedy") == 0) && nf == 6) {
        unhex(f[2]);
        int np = parse_ids(f[3], want, MAX_IDS), ng = parse_ids(f[4], want_gen, MAX_IDS);
        char args[3000];
        /* llama.cpp's vectors were made with its built-in chatml, which
         * leaves out the default system message of the files' own
         * templates (that dhsa's default format adds, checked against
         * jinja2 by python/tests/test_chat_jinja.py): --template chatml */
        snprintf(args, sizeof args, "run -m '%.1200s' %s-p '%.1200s' -n %d --exact --kv f32 --temp 0 --ids --threads 2", path,
                 chat ? "--chat --template chatml " : "", f[2], ng);
        char *out = NULL;
        double secs = 0;
        int rc = cli_run_measured(NULL, args, &out, &secs, NULL);
        /* --ids prints the prompt's ids, then the generated ones, on one line */
        int n = 0;
        if (rc == 0 && out) {
            for (char *line = out; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
                if (*line >= '0' && *line <= '9') {
                    n = parse_ids(line, got, MAX_IDS);
                    break;
                }
            }
        }
        T_CHECK(rc == 0 && n >= np && same(got, np, want, np), "%s %s: the prompt's %d ids are llama.cpp's (rc %d)",
                f[1], f[0], np, rc);
        /* llama.cpp's list ends with the end-of-turn token it stopped at;
         * dhsa stops there without printing it */
        int ng_cmp = ng;
        if (chat && ng == n - np + 1) {
            dhsa_tokenizer *t = load_tokenizer(path);
            int32_t stop[8];
            int n_stop = 0;
            if (t) dhsa_chat_stop_ids(DHSA_CHAT_CHATML, t, stop, 8, &n_stop);
            for (int s = 0; s < n_stop; s++)
                if (stop[s] == want_gen[ng - 1]) ng_cmp = ng - 1;
            dhsa_tokenizer_free(t);
        }
        int ok = rc == 0 && same(got + np, n - np, want_gen, ng_cmp);
        T_CHECK(ok, "%s %s: the %d greedy tokens (--exact) are llama.cpp's (%.1f s)", f[1], f[0], ng, secs);
        if (!ok) {
            print_ids("llama.cpp", want_gen, ng);
            print_ids("dhsa     ", got + (n >= np ? np : 0), n >= np ? n - np : 0);
            fprintf(stderr, "    llama.cpp's margins: %s\n%s\n", f[5], out ? out : "");
        }
        free(out);
    }
}

static void test_models(void) {
    FILE *fx = fopen(FIXTURE, "r");
    T_CHECK(fx != NULL, "%s opens (run from the repository root)", FIXTURE);
    if (!fx) return;
    static char line[1 << 16];
    int present[N_MODELS], seen[N_MODELS] = {0};
    char paths[N_MODELS][1200];
    for (int i = 0; i < N_MODELS; i++) present[i] = model_path(&models[i], paths[i], sizeof paths[i]);
    while (fgets(line, sizeof line, fx)) {
        if (line[0] == '#') continue;
        char *f[8];
        int nf;
        fields(line, f, 8, &nf);
        if (nf < 4) continue;
        for (int i = 0; i < N_MODELS; i++) {
            if (strcmp(f[1], models[i].name) != 0) continue;
            seen[i] = 1;
            if (present[i]) check_row(f, nf, paths[i]);
        }
    }
    fclose(fx);
    for (int i = 0; i < N_MODELS; i++) {
        if (!present[i])
            T_SKIP(models[i].checks, "%s is not pulled (no %s): `dhsa pull %s` (DHSA_MODELS=%s)", models[i].name,
                   paths[i], models[i].name, models_dir);
        T_CHECK(seen[i], "%s has vectors in %s", models[i].name, FIXTURE);
    }
}

/* ---------------------------------------------------- pre-tokenizers --- */

static void test_pre_sets(void) {
    char path[1200];
    if (!model_path(&models[0], path, sizeof path)) {
        T_SKIP(N_PRE_SETS + 2, "%s is not pulled (no %s): its vocabulary carries the pre-tokenizer vectors "
                               "(`dhsa pull %s`)",
               models[0].name, path, models[0].name);
        return;
    }
    dhsa_gguf *g = NULL;
    dhsa_tokenizer *t = NULL;
    int file_bos = 0;
    if (dhsa_gguf_open(path, &g) == DHSA_OK) {
        file_bos = dhsa_gguf_find_kv(g, "tokenizer.ggml.add_bos_token") >= 0;
        dhsa_tokenizer_from_gguf(g, &t);
        dhsa_gguf_close(g);
    }
    FILE *fx = fopen(PRE_FIXTURE, "r");
    T_CHECK(t && fx, "%s loads and %s opens", path, PRE_FIXTURE);
    if (!t || !fx) {
        if (fx) fclose(fx);
        dhsa_tokenizer_free(t);
        return;
    }
    static char line[1 << 16];
    static int32_t want[MAX_IDS], got[MAX_IDS];
    char cur[64] = "";
    int n_sets = 0, cases = 0, bad = 0;
    for (int more = 1; more;) {
        more = fgets(line, sizeof line, fx) != NULL;
        if (more && line[0] == '#') continue;
        char *f[4] = {0};
        int nf = 0;
        if (more) fields(line, f, 4, &nf);
        if (!more || (nf >= 2 && strcmp(f[0], cur) != 0)) {
            if (cur[0]) {
                T_CHECK(bad == 0, "pre '%s': %d of %d texts give llama.cpp's ids", cur, cases - bad, cases);
                n_sets++;
            }
            if (!more) break;
            snprintf(cur, sizeof cur, "%s", f[0]);
            cases = bad = 0;
            if (dhsa_tok__set_pre(t, cur, file_bos) != DHSA_OK) {
                fprintf(stderr, "  pre '%s': %s\n", cur, dhsa_last_error());
                bad++;
            }
        }
        if (nf < 2) continue;
        long n = unhex(f[1]);
        int nw = nf > 2 ? parse_ids(f[2], want, MAX_IDS) : 0;
        int64_t k = -1;
        dhsa_tokenize(t, f[1], n, dhsa_tokenizer_default_flags(t) | DHSA_TOKENIZE_PARSE_SPECIAL, got, MAX_IDS, &k);
        cases++;
        if (!same(got, (int)k, want, nw)) {
            if (bad++ < 3) {
                fprintf(stderr, "  pre '%s' on \"%.60s\":\n", cur, f[1]);
                print_ids("llama.cpp", want, nw);
                print_ids("dhsa     ", got, (int)k);
            }
        }
    }
    fclose(fx);
    dhsa_tokenizer_free(t);
    T_CHECK(n_sets == N_PRE_SETS, "%d regex sets checked", n_sets);
}

/* The chat format from the file, through the CLI: SmolLM2's template is
 * one dhsa has checked (run --chat names smollm2); a copy of the file with
 * one byte of its template changed is refused by name (exit 1, the
 * closest format and the way out), by run --chat, chat and serve alike,
 * and --template chatml / plain run it. */
#define N_TEMPLATE_CHECKS 7
static void test_template_refusal(void) {
    char path[1200], copy[1300];
    if (!model_path(&models[0], path, sizeof path)) {
        T_SKIP(N_TEMPLATE_CHECKS, "%s is not pulled (dhsa pull %s): no chat-template refusal checks", models[0].name,
               models[0].name);
        return;
    }
    char *out = NULL;
    char args[3000];
    snprintf(args, sizeof args, "run -m '%s' --chat -p Hi -n 1 --temp 0", path);
    int rc = cli_run(args, 0, &out);
    T_CHECK(rc == 0 && out && strstr(out, "chat template: smollm2 (the file's tokenizer.chat_template, checked"),
            "run --chat names the checked format (exit %d):\n%s", rc, out ? out : "");
    free(out);
    /* the copy: the file with "SmolLM" in its template turned into "SmolLN" */
    snprintf(copy, sizeof copy, "%s/dhsa_test_template_%d.gguf", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             (int)getpid());
    FILE *in = fopen(path, "rb"), *o = fopen(copy, "wb");
    int changed = 0;
    static char buf[(1 << 20) + 32];
    size_t n, keep = 0; /* the last bytes of a chunk are searched again with the next */
    while (in && o && (n = fread(buf + keep, 1, sizeof buf - keep, in)) > 0) {
        n += keep;
        for (size_t i = 0; i + 22 <= n && !changed; i++)
            if (memcmp(buf + i, "assistant named SmolLM", 22) == 0) buf[i + 21] = 'N', changed = 1;
        keep = n < 32 ? n : 32;
        fwrite(buf, 1, n - keep, o);
        memmove(buf, buf + n - keep, keep);
    }
    if (o) fwrite(buf, 1, keep, o);
    if (in) fclose(in);
    if (o && fclose(o) != 0) changed = 0;
    T_CHECK(changed, "a copy with one byte of the template changed (%s)", copy);
    const char *cmds[] = {"run -m '%s' --chat -p Hi -n 1", "chat -m '%s' -n 1 </dev/null",
                          /* a port held here: were the refusal gone, serve would fail to listen, not hang */
                          "serve -m '%s' --port %d"};
    int held = socket(AF_INET, SOCK_STREAM, 0), port = 0;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    if (held >= 0 && bind(held, (struct sockaddr *)&a, sizeof a) == 0 && listen(held, 1) == 0 &&
        getsockname(held, (struct sockaddr *)&a, &alen) == 0)
        port = ntohs(a.sin_port);
    for (int i = 0; i < 3; i++) {
        if (i == 2) snprintf(args, sizeof args, cmds[i], copy, port);
        else snprintf(args, sizeof args, cmds[i], copy);
        rc = cli_run(args, 0, &out);
        T_CHECK(rc == 1 && out && strstr(out, "looks like chatml") && strstr(out, "--template chatml") &&
                    strstr(out, "--template plain"),
                "dhsa %s: the unchecked template is refused by name (exit %d):\n%s", args, rc, out ? out : "");
        free(out);
    }
    if (held >= 0) close(held);
    snprintf(args, sizeof args, "run -m '%s' --chat --template chatml -p Hi -n 1 --temp 0", copy);
    rc = cli_run(args, 0, &out);
    T_CHECK(rc == 0 && out && strstr(out, "chat template: chatml (--template)"), "--template chatml runs it (exit %d):\n%s",
            rc, out ? out : "");
    free(out);
    snprintf(args, sizeof args, "run -m '%s' --chat --template plain -p Hi -n 1 --temp 0", copy);
    rc = cli_run(args, 0, &out);
    T_CHECK(rc == 0 && out && strstr(out, "chat template: none (--template plain"), "--template plain runs it (exit %d):\n%s",
            rc, out ? out : "");
    free(out);
    remove(copy);
}

int main(void) {
    const char *env = getenv("DHSA_MODELS");
    if (env && env[0]) snprintf(models_dir, sizeof models_dir, "%s", env);
    else snprintf(models_dir, sizeof models_dir, "%s/.cache/dhsa/models", getenv("HOME") ? getenv("HOME") : ".");
    if (!getenv("DHSA_CLI")) setenv("DHSA_CLI", "build/dhsa", 0);
    test_pre_sets();
    test_models();
    test_template_refusal();
    return t_report("test_real_models");
}
