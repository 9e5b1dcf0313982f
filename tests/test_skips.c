/* test_skips.c: the skip counts of tests/t.h are honest.
 *
 * For each test binary below (they read ../shared, most also run the CLI)
 * it runs the binary three ways and reads its report line
 * "name: P passed, F failed, S skipped":
 *   - here, with ../shared and the CLI (the reference total P + F + S);
 *   - from a view of the repository whose ../shared is absent: a temporary
 *     folder of symbolic links to every entry of the repository's root, so
 *     that "../shared" from it names nothing (a fresh clone, simulated);
 *   - here with DHSA_CLI unset, for the binaries that run the CLI.
 * Each run must exit 0 (a skip never fails) with the ", S skipped" part in
 * its line; the hidden-data run must skip something; and P + F + S must be
 * the reference total, i.e. every T_SKIP counted the checks it stands for.
 * Where ../shared itself is absent the totals cannot be compared and that
 * comparison is skipped (counted). The line parser is checked on a report
 * without the skipped part, which must be refused.
 *
 * Run from the repository root (make test does): the binaries are the
 * ones beside this one ($(dirname argv[0])), DHSA_CLI as tests/run.sh sets.
 */
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "t.h"

static const struct {
    const char *name;
    int uses_cli;
} bins[] = {
    {"test_chat", 0},  {"test_gguf", 0},  {"test_tokenizer", 0}, {"test_llm_ref", 0},    {"test_llama2c", 1},
    {"test_eval", 1},  {"test_plots", 1}, {"test_train", 1},     {"test_tokenize_cli", 1}, {"test_model", 1},
    {"test_tokenizer_peer", 0}, {"test_serve_engine", 0},
};
#define N_BINS (int)(sizeof bins / sizeof bins[0])

typedef struct {
    int ok; /* a complete report line was found */
    int passed, failed, skipped, rc;
} report;

/* The last "name: P passed, F failed, S skipped" line of out for name. */
static report parse_report(const char *out, const char *name) {
    report r = {0};
    size_t nl = strlen(name);
    for (const char *p = out; p && *p;) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        int a, b, c, used = -1;
        char line[256];
        if (len < sizeof line && len > nl + 2 && strncmp(p, name, nl) == 0 && p[nl] == ':') {
            memcpy(line, p, len);
            line[len] = 0;
            if (sscanf(line + nl, ": %d passed, %d failed, %d skipped%n", &a, &b, &c, &used) == 3 &&
                used == (int)(len - nl)) {
                r.ok = 1;
                r.passed = a, r.failed = b, r.skipped = c;
            }
        }
        p = e ? e + 1 : NULL;
    }
    return r;
}

/* Runs "cd DIR && [env] BIN" with stdout and stderr read; NULL dir: here. */
static report run_bin(const char *dir, const char *env, const char *bin, const char *name) {
    char cmd[3 * PATH_MAX];
    snprintf(cmd, sizeof cmd, "%s%s%s%s %s 2>&1", dir ? "cd '" : "", dir ? dir : "", dir ? "' && " : "",
             env ? env : "", bin);
    FILE *p = popen(cmd, "r");
    size_t cap = 1 << 20, n = 0, got;
    char *out = malloc(cap);
    report r = {0};
    if (!p || !out) {
        if (p) pclose(p);
        free(out);
        r.rc = -1;
        return r;
    }
    while ((got = fread(out + n, 1, cap - n - 1, p)) > 0) {
        n += got;
        if (cap - n < 4096) {
            char *nb = realloc(out, cap * 2);
            if (!nb) break;
            out = nb;
            cap *= 2;
        }
    }
    out[n] = 0;
    int st = pclose(p);
    r = parse_report(out, name);
    r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    if (!r.ok || r.rc != 0) fprintf(stderr, "  %s (in %s):\n%s\n", bin, dir ? dir : ".", out);
    free(out);
    return r;
}

/* --------------------------------------------------------------------- */
/* A view of the repository without ../shared                            */

static char view[64], view_repo[PATH_MAX];

/* Links every entry of the current folder (the repository root) into
 * view/repo; returns 0 on success. */
static int view_create(void) {
    snprintf(view, sizeof view, "/tmp/dhsa_test_skips_XXXXXX");
    if (!mkdtemp(view)) return -1;
    snprintf(view_repo, sizeof view_repo, "%s/repo", view);
    if (mkdir(view_repo, 0700) != 0) return -1;
    char here[PATH_MAX];
    if (!getcwd(here, sizeof here)) return -1;
    DIR *d = opendir(".");
    if (!d) return -1;
    int bad = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char from[2 * PATH_MAX + 2], to[2 * PATH_MAX + 2];
        snprintf(from, sizeof from, "%s/%s", here, e->d_name);
        snprintf(to, sizeof to, "%s/%s", view_repo, e->d_name);
        bad |= symlink(from, to) != 0;
    }
    closedir(d);
    return bad ? -1 : 0;
}

/* Removes the links (never what they point to), then the two folders. */
static void view_remove(void) {
    if (!view[0]) return;
    DIR *d = opendir(view_repo);
    if (d) {
        for (struct dirent *e; (e = readdir(d));) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char to[2 * PATH_MAX + 2];
            snprintf(to, sizeof to, "%s/%s", view_repo, e->d_name);
            struct stat st;
            if (lstat(to, &st) == 0 && S_ISLNK(st.st_mode)) unlink(to);
        }
        closedir(d);
    }
    rmdir(view_repo);
    rmdir(view);
}

/* --------------------------------------------------------------------- */

static void test_parser(void) {
    report r = parse_report("x\ntest_a: 5 passed, 1 failed, 7 skipped\n", "test_a");
    T_CHECK(r.ok && r.passed == 5 && r.failed == 1 && r.skipped == 7, "the parser reads a full report line");
    /* the line every test binary printed before skips were counted */
    r = parse_report("test_a: 5 passed, 1 failed\n", "test_a");
    T_CHECK(!r.ok, "a report without the skipped part is refused");
    r = parse_report("test_a: 5 passed, 1 failed, 7 skipped, more\n", "test_a");
    T_CHECK(!r.ok, "trailing text after the skipped count is refused");
}

int main(int argc, char **argv) {
    (void)argc;
    test_parser();
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", argv[0]);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    else snprintf(dir, sizeof dir, ".");
    const int have_shared = access("../shared/models", R_OK) == 0 && access("../shared/vocab", R_OK) == 0;
    const char *cli = getenv("DHSA_CLI");
    const int have_cli = cli && cli[0] && !strchr(cli, '\'') && access(cli, X_OK) == 0;

    if (view_create() != 0) {
        T_CHECK(0, "could not make the view without ../shared in %s", view);
        view_remove();
        return t_report("test_skips");
    }
    printf("test_skips: %-18s %23s %23s %23s\n", "binary", "here (P/F/S)", "no ../shared (P/F/S)",
           "no DHSA_CLI (P/F/S)");
    for (int i = 0; i < N_BINS; i++) {
        const char *name = bins[i].name;
        char bin[PATH_MAX + 64];
        snprintf(bin, sizeof bin, "%s/%s", dir, name);
        if (access(bin, X_OK) != 0) {
            T_CHECK(0, "%s is not built", bin);
            continue;
        }
        report here = run_bin(NULL, NULL, bin, name);
        report hidden = run_bin(view_repo, NULL, bin, name);
        report nocli = {0};
        if (bins[i].uses_cli) nocli = run_bin(NULL, "env -u DHSA_CLI", bin, name);
        printf("test_skips: %-18s %9d/%d/%-11d %9d/%d/%-11d", name, here.passed, here.failed, here.skipped,
               hidden.passed, hidden.failed, hidden.skipped);
        if (bins[i].uses_cli) printf(" %9d/%d/%d", nocli.passed, nocli.failed, nocli.skipped);
        printf("\n");
        const int total = here.passed + here.failed + here.skipped;

        T_CHECK(here.ok && here.rc == 0, "%s: a report line with the skipped count, exit 0 (exit %d)", name, here.rc);
        T_CHECK(hidden.ok && hidden.rc == 0, "%s without ../shared: a report line with the skipped count, exit 0 "
                                             "(a skip never fails; exit %d)", name, hidden.rc);
        T_CHECK(hidden.skipped > 0, "%s without ../shared skips nothing", name);
        if (have_shared && have_cli)
            T_CHECK(hidden.passed + hidden.failed + hidden.skipped == total,
                    "%s: without ../shared %d passed + %d failed + %d skipped = %d, with it %d: a T_SKIP count is "
                    "off by %d", name, hidden.passed, hidden.failed, hidden.skipped,
                    hidden.passed + hidden.failed + hidden.skipped, total,
                    total - (hidden.passed + hidden.failed + hidden.skipped));
        else
            T_SKIP(1, "%s: ../shared or the CLI absent here, so no total with everything to compare with", name);
        if (bins[i].uses_cli) {
            T_CHECK(nocli.ok && nocli.rc == 0, "%s without DHSA_CLI: a report line, exit 0 (exit %d)", name,
                    nocli.rc);
            if (have_shared && have_cli)
                T_CHECK(nocli.passed + nocli.failed + nocli.skipped == total,
                        "%s: without DHSA_CLI %d passed + %d failed + %d skipped = %d, with it %d: a T_SKIP "
                        "count is off by %d", name, nocli.passed, nocli.failed, nocli.skipped,
                        nocli.passed + nocli.failed + nocli.skipped, total,
                        total - (nocli.passed + nocli.failed + nocli.skipped));
            else
                T_SKIP(1, "%s: ../shared or the CLI absent here, so no total with everything to compare with", name);
        }
    }
    view_remove();
    return t_report("test_skips");
}
