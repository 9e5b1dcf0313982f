/* test_cli_promises.c: what the CLI and the library's writers promise about
 * files, sizes and messages (issue 13, "Promises that hold"), each checked
 * where it shows: in the built CLI (DHSA_CLI, which tests/run.sh sets;
 * those parts skip without it) and in the library.
 *
 *   Safe writes (src/util/outfile.c, docs/files.md):
 *     - a reader that has FILE mapped while `gen-model -o FILE` replaces it
 *       (with a smaller model) keeps its bytes: no SIGBUS, no change;
 *     - an output path that cannot be written (missing folder, a
 *       directory, a folder that takes no file) is refused before any work
 *       (the 135 M-parameter default preset is never built: low peak RSS),
 *       for every command with an output; nothing is created;
 *     - a write that fails (RLIMIT_FSIZE, SIGXFSZ ignored) leaves the old
 *       file byte for byte and no temporary, in the CLI and the library.
 *   Sizes checked before allocating: `bench model --lengths 2147483648`,
 *     `run -f /dev/zero`, `run -n 2147483648` are refused with a low peak
 *     RSS (the child's, from wait4); `eval copy` on a 32768-token vocabulary
 *     at 2K tokens stays far below the [L][V] logits (256 MiB) it kept.
 *   Messages: each sentence names the option and the real limit or fix;
 *     options that would be ignored are refused; help texts are true; the
 *     sampler refuses logits with no distribution; convert refuses NaN.
 * Each check failed before its fix (see the commit messages).
 * Run: make test (or DHSA_CLI=build/dhsa build/tests/test_cli_promises).
 */
#include "dhsa.h"
#include "t.h"
#include "cli_run.h"
#include "lib/svg.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MODEL "models/dhsa-retrieval-8m.gguf"

static char dir[256];
static const char *cli;

/* ------------------------------------------------------------- helpers --- */

static int has(const char *s, const char *sub) { return s && strstr(s, sub) != NULL; }

/* The file's bytes, NUL-terminated (not counted in *n); NULL if unreadable. */
static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(len > 0 ? (size_t)len + 1 : 1);
    *n = b && len > 0 ? fread(b, 1, (size_t)len, f) : 0;
    if (b) b[*n] = 0; /* callers search it as a string */
    fclose(f);
    return b;
}

/* Entries of dir whose name contains sub. */
static int count_entries(const char *sub) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += strstr(e->d_name, sub) != NULL;
    if (d) closedir(d);
    return n;
}

static int gen_model(const char *opts, const char *name) {
    char args[1024], *out;
    snprintf(args, sizeof args, "gen-model --preset tiny %s -o '%s/%s'", opts, dir, name);
    int rc = cli_run(args, 0, &out);
    T_CHECK(rc == 0, "gen-model %s: rc %d: %.300s", opts, rc, out ? out : "");
    free(out);
    return rc;
}

static sigjmp_buf bus_jmp;
static void on_bus(int sig) {
    (void)sig;
    siglongjmp(bus_jmp, 1);
}

/* ------------------------------------------------------- safe writes --- */

static void test_replace_under_reader(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/mapped.gguf", dir);
    if (gen_model("", "mapped.gguf")) return;
    int fd = open(path, O_RDONLY);
    struct stat st;
    T_CHECK(fd >= 0 && fstat(fd, &st) == 0, "open %s", path);
    if (fd < 0) return;
    size_t n = (size_t)st.st_size;
    unsigned char *map = mmap(NULL, n, PROT_READ, MAP_SHARED, fd, 0), *orig = malloc(n);
    close(fd);
    T_CHECK(map != MAP_FAILED && orig, "mmap %s", path);
    if (map == MAP_FAILED || !orig) return;
    memcpy(orig, map, n);

    /* a smaller model (vocabulary 300) over the same name while it is mapped */
    char args[1024], *out;
    snprintf(args, sizeof args, "gen-model --preset tiny --vocab 300 --seed 2 -o '%s'", path);
    int rc = cli_run(args, 0, &out);
    T_CHECK(rc == 0 && has(out, "replacing"), "gen-model over a mapped file: rc %d: %.300s", rc, out ? out : "");
    free(out);

    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_bus;
    sigaction(SIGBUS, &sa, &old);
    volatile int bus = 0, same = 0;
    if (sigsetjmp(bus_jmp, 1) == 0) same = memcmp(map, orig, n) == 0; /* every page of the old mapping */
    else bus = 1;
    sigaction(SIGBUS, &old, NULL);
    T_CHECK(!bus, "reading the old mapping after the rewrite raised SIGBUS (the file was truncated in place)");
    T_CHECK(bus || same, "the old mapping's bytes changed: the file was rewritten in place");
    munmap(map, n);
    free(orig);

    struct stat now;
    dhsa_gguf *g = NULL;
    T_CHECK(stat(path, &now) == 0 && (size_t)now.st_size < n && dhsa_gguf_open(path, &g) == DHSA_OK,
            "the new file is in place and reads (%lld bytes, was %zu): %s", (long long)now.st_size, n,
            dhsa_last_error());
    dhsa_gguf_close(g);
    T_CHECK(count_entries(".part") == 0, "a temporary was left in %s", dir);
}

static void test_refused_before_work(void) {
    char args[1200], miss[512], *out;
    snprintf(miss, sizeof miss, "%s/missing", dir);
    int before = count_entries("");
    const struct {
        const char *fmt; /* %s: the bad path */
        const char *opt;
    } cases[] = {
        {"gen-model -o '%s/m.gguf'", "-o"}, /* the 135 M-parameter default preset */
        {"train-boundary -m " MODEL " --text README.md --steps 10 -o '%s/x.prd'", "-o"},
        {"run -p hi -n 1 --dump-layout '%s/x.svg'", "--dump-layout"},
        {"eval copy --lengths 512 --svg '%s/x.svg'", "--svg"},
        {"eval copy --lengths 512 --svg-attn '%s/x.svg'", "--svg-attn"},
        {"bench model --lengths 256 --svg '%s/x'", "--svg"},
        {"bench sparse --L 4096 --svg '%s/x.svg'", "--svg"},
        {"memprobe --sizes 1,2,3 --svg '%s/x.svg' -- true {n}", "--svg"},
        {"convert in.bin --tokenizer tok.bin -o '%s/x.gguf'", "-o"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(args, sizeof args, cases[i].fmt, miss);
        double secs = 0;
        long rss = 0;
        int rc = cli_run_measured(NULL, args, &out, &secs, &rss);
        T_CHECK(rc == 2 && has(out, cases[i].opt) && has(out, miss) && has(out, "does not exist"),
                "`%s`: rc %d (want 2, the folder named): %.400s", args, rc, out ? out : "");
        T_CHECK(rss < 48 * 1024, "`%s`: peak RSS %ld KiB: work ran before the output was checked", args, rss);
        free(out);
    }
    /* a directory, and a folder where no file can be created (root included) */
    snprintf(args, sizeof args, "gen-model -o '%s'", dir);
    int rc = cli_run(args, 0, &out);
    T_CHECK(rc == 2 && has(out, "is a directory"), "gen-model -o DIR: rc %d: %.300s", rc, out ? out : "");
    free(out);
    rc = cli_run("gen-model -o /proc/dhsa_promise.gguf", 0, &out);
    T_CHECK(rc == 2 && has(out, "cannot write /proc/dhsa_promise.gguf"), "gen-model -o /proc/...: rc %d: %.300s", rc,
            out ? out : "");
    free(out);
    T_CHECK(count_entries("") == before && access(miss, F_OK) != 0, "a refused command created something in %s", dir);
    /* the library's writers say the same */
    dhsa_plot *pl = dhsa_plot_create("t", "x", "y");
    char path[700];
    snprintf(path, sizeof path, "%s/x.svg", miss);
    T_CHECK(pl && dhsa_plot_save(pl, path) == DHSA_ERR_IO && has(dhsa_last_error(), "does not exist"),
            "dhsa_plot_save into a missing folder: %s", dhsa_last_error());
    dhsa_plot_free(pl);
}

static void test_failed_write_keeps_old(void) {
    char path[512], args[1024], *out;
    snprintf(path, sizeof path, "%s/kept.gguf", dir);
    if (gen_model("", "kept.gguf")) return;
    size_t n0 = 0, n1 = 0;
    unsigned char *a = slurp(path, &n0);
    /* 16 blocks of 512 bytes: far less than the model; the write fails */
    snprintf(args, sizeof args, "gen-model --preset tiny --seed 3 -o '%s'", path);
    double secs;
    long rss;
    int rc = cli_run_measured("trap '' XFSZ; ulimit -f 16;", args, &out, &secs, &rss);
    unsigned char *b = slurp(path, &n1);
    T_CHECK(rc == 1 && has(out, "kept.gguf") && has(out, "untouched"), "a failed write: rc %d: %.300s", rc,
            out ? out : "");
    T_CHECK(a && b && n0 == n1 && n0 > 0 && memcmp(a, b, n0) == 0,
            "the old file did not survive a failed write (%zu bytes before, %zu after)", n0, n1);
    T_CHECK(count_entries("kept.gguf.part") == 0, "the failed write left its temporary behind");
    free(out), free(a), free(b);

    /* the library: a predictor file and a figure under the same limit */
    char prd[512], svg[512];
    snprintf(prd, sizeof prd, "%s/p.prd", dir);
    snprintf(svg, sizeof svg, "%s/p.svg", dir);
    dhsa_predictor *p1 = NULL, *p2 = NULL;
    T_CHECK(dhsa_predictor_create_random(32, 4, 16, 1, &p1) == DHSA_OK &&
                dhsa_predictor_create_random(512, 4, 256, 2, &p2) == DHSA_OK,
            "predictors: %s", dhsa_last_error());
    dhsa_plot *pl = dhsa_plot_create("t", "x", "y");
    double x[2] = {1, 2}, y[2] = {3, 4};
    T_CHECK(pl && dhsa_plot_add(pl, "s", DHSA_PLOT_LINE, x, y, 2) == DHSA_OK, "plot");
    if (!p1 || !p2 || !pl) return;
    T_CHECK(dhsa_predictor_save(p1, prd) == DHSA_OK && dhsa_plot_save(pl, svg) == DHSA_OK, "first saves: %s",
            dhsa_last_error());
    unsigned char *pa = slurp(prd, &n0), *sa = slurp(svg, &n1);
    size_t m0 = n0, m1 = n1;
    for (int i = 0; i < 200; i++) dhsa_plot_add(pl, "more", DHSA_PLOT_LINE, x, y, 2); /* a larger figure */
    struct rlimit lim, small = {4096, 4096};
    getrlimit(RLIMIT_FSIZE, &lim);
    small.rlim_max = lim.rlim_max;
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    setrlimit(RLIMIT_FSIZE, &small);
    dhsa_status s1 = dhsa_predictor_save(p2, prd), s2 = dhsa_plot_save(pl, svg);
    setrlimit(RLIMIT_FSIZE, &lim);
    signal(SIGXFSZ, prev);
    T_CHECK(s1 == DHSA_ERR_IO && has(dhsa_last_error(), "p.svg"), "saves over the limit: %d %d: %s", (int)s1, (int)s2,
            dhsa_last_error());
    T_CHECK(s2 == DHSA_ERR_IO, "the figure over the limit: %d", (int)s2);
    unsigned char *pb = slurp(prd, &n0), *sb = slurp(svg, &n1);
    T_CHECK(pa && pb && n0 == m0 && memcmp(pa, pb, m0) == 0, "the predictor file did not survive a failed save");
    T_CHECK(sa && sb && n1 == m1 && memcmp(sa, sb, m1) == 0, "the SVG did not survive a failed save");
    T_CHECK(count_entries(".part") == 0, "a failed save left its temporary behind");
    free(pa), free(pb), free(sa), free(sb);
    dhsa_predictor_free(p1);
    dhsa_predictor_free(p2);
    dhsa_plot_free(pl);
}

/* ----------------------------------------------------- sizes first --- */

static void test_sizes_first(void) {
    const struct {
        const char *args, *want;
        int rc;
    } cases[] = {
        {"bench model --lengths 2147483648", "--lengths 2147483648", 2}, /* filled 8 GiB of ids first */
        {"run -f /dev/zero -n 1", "larger than", 1},                      /* read 1 GiB first */
        {"run -p hi -n 2147483648", "-n 2147483648", 2},                  /* "context of 2147483650 tokens" */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out;
        double secs = 0;
        long rss = 0;
        int rc = cli_run_measured(NULL, cases[i].args, &out, &secs, &rss);
        T_CHECK(rc == cases[i].rc && has(out, cases[i].want), "`dhsa %s`: rc %d (want %d): %.400s", cases[i].args,
                rc, cases[i].rc, out ? out : "");
        T_CHECK(rss < 64 * 1024, "`dhsa %s`: peak RSS %ld KiB before the refusal", cases[i].args, rss);
        free(out);
    }
    const char *n_msg = "-n 2147483648";
    char *out;
    int rc = cli_run_measured(NULL, "run -p hi -n 2147483648", &out, NULL, NULL);
    T_CHECK(rc == 2 && has(out, n_msg) && has(out, "at most") && !has(out, "(1 .. 2^31)"),
            "-n out of range names -n and its limit: %.300s", out ? out : "");
    free(out);

    /* eval copy on a 32768-token vocabulary at 2K: [L][V] logits were 256 MiB */
    char args[1024], filler[512];
    if (gen_model("--vocab 32768 --ctx 4096", "v32k.gguf")) return;
    snprintf(filler, sizeof filler, "%s/filler.txt", dir);
    FILE *f = fopen(filler, "w");
    for (int i = 0; f && i < 400; i++) fprintf(f, "The quiet river ran past the old mill and the green fields. ");
    if (f) fclose(f);
    snprintf(args, sizeof args,
             "eval copy -m '%s/v32k.gguf' --lengths 2K --depths 0.5 --trials 1 --attn dense --filler '%s' --json "
             "--threads 2", dir, filler);
    double secs = 0;
    long rss = 0;
    rc = cli_run_measured(NULL, args, &out, &secs, &rss);
    T_CHECK(rc == 0 && has(out, "\"cells\""), "eval copy on a large vocabulary: rc %d: %.300s", rc, out ? out : "");
    T_CHECK(rss < 96 * 1024, "eval copy at 2K x 32768: peak RSS %ld KiB (the [L][V] logits alone are 262144 KiB)",
            rss);
    free(out);
}

/* ---------------------------------------------------------- messages --- */

static void test_messages(void) {
    char args[2048], bad[512], w16[512], *out;
    snprintf(bad, sizeof bad, "%s/bad.prd", dir);
    FILE *f = fopen(bad, "w");
    if (f) fputs("this is not a predictor file at all, just some text\n", f);
    if (f) fclose(f);
    snprintf(w16, sizeof w16, "%s/w16.prd", dir);
    dhsa_predictor *pr = NULL;
    T_CHECK(dhsa_predictor_create_random(16, 4, 8, 1, &pr) == DHSA_OK && dhsa_predictor_save(pr, w16) == DHSA_OK,
            "a 16-wide predictor: %s", dhsa_last_error());
    dhsa_predictor_free(pr);
    pr = NULL;
    T_CHECK(dhsa_predictor_load(bad, &pr) == DHSA_ERR_FORMAT && has(dhsa_last_error(), bad),
            "the library's load error names the file: %s", dhsa_last_error());

    char predbad[700], predw[700], dirarg[700];
    snprintf(predbad, sizeof predbad, "run -p hi -n 1 --attn dhsa --boundary learned:%s", bad);
    snprintf(predw, sizeof predw, "run -p hi -n 1 --attn dhsa --boundary learned:%s", w16);
    snprintf(dirarg, sizeof dirarg, "run -f %s -n 1", dir);
    const struct {
        const char *args;
        int rc;
        const char *want, *not_want;
    } cases[] = {
        {"bench sparse --L 100", 2, "--needles", "use a smaller depth"},
        {dirarg, 1, "is a directory", "Input/output error"},
        {"plan --mem-limit 1", 1, "--mem-limit 1G", NULL},
        {predbad, 1, bad, NULL},
        {predw, 1, "trained for another model", NULL},
        {"run -p hi -n 1 --tokenizer tok.bin", 2, "carries its own tokenizer", NULL},
        {"run -p hi -n 1 --system 'be brief'", 2, "add --chat", NULL},
        {"run -p hi -n 1 --template chatml", 2, "add --chat", NULL},
        {"run -p hi -n 1 --attn dhsa --density 0.1 --budget 64", 2, "not both", NULL},
        {"bench model --lengths 256 --density 0.1 --budget 64", 2, "not both", NULL},
        {"eval copy --lengths 512 --density 0.1 --budget 64", 2, "not both", NULL},
        {"bench sparse --L 4096 --density 0.1 --budget 64", 2, "not both", NULL},
        {"bench model --lengths ''", 2, "--lengths is empty", NULL},
        {"bench model --lengths 256 --boundary learned:x.prd --attn dense,dhsa", 2, "dhsa-learned", NULL},
        {"--help", 0, "memprobe", NULL},
        {"run --help", 0, "default: the prompt + N", NULL},
        {"bench matmul --help", 0, "% peak", "%%"},
        {"bench --help", 0, "matmul", NULL},
        {"help bench model", 0, "usage: dhsa bench model", NULL},
        {"demo --L 1024 --model-L 256 --threads 2", 0, "130 B per L^2", "144 B"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = cli_run(cases[i].args, 0, &out);
        T_CHECK(rc == cases[i].rc && has(out, cases[i].want) && !(cases[i].not_want && has(out, cases[i].not_want)),
                "`dhsa %s`: rc %d (want %d), want \"%s\"%s%s: %.600s", cases[i].args, rc, cases[i].rc, cases[i].want,
                cases[i].not_want ? ", not " : "", cases[i].not_want ? cases[i].not_want : "", out ? out : "");
        free(out);
    }
    int rc = cli_run("bench --help", 0, &out);
    T_CHECK(rc == 0 && has(out, "attn") && has(out, "sparse") && has(out, "decode") && has(out, "model"),
            "bench --help lists every benchmark: %.400s", out ? out : "");
    free(out);
    /* the README quotes the same PyTorch figure as the demo */
    size_t n = 0;
    unsigned char *readme = slurp("README.md", &n);
    T_CHECK(readme && has((char *)readme, "130 bytes per P^2") && !has((char *)readme, "144 bytes"),
            "README.md and the demo disagree on PyTorch's bytes per P^2");
    free(readme);

    /* convert: a checkpoint with a NaN weight is refused, naming the tensor
     * (dim 2, hidden 2, 1 layer, 1 head, vocab 4, seq 2: 46 floats) */
    char bin[512], tok[512], gg[512];
    snprintf(bin, sizeof bin, "%s/nan.bin", dir);
    snprintf(tok, sizeof tok, "%s/nan_tok.bin", dir);
    snprintf(gg, sizeof gg, "%s/nan.gguf", dir);
    f = fopen(bin, "wb");
    int32_t hdr[7] = {2, 2, 1, 1, 1, 4, 2};
    float wts[46] = {0};
    wts[3] = NAN; /* token_embd.weight, element 3 */
    if (f) fwrite(hdr, 4, 7, f), fwrite(wts, 4, 46, f), fclose(f);
    f = fopen(tok, "wb");
    if (f) {
        int32_t maxlen = 8, one = 1, two = 2;
        float zero = 0;
        fwrite(&maxlen, 4, 1, f);
        for (const char *t = "abc"; *t; t++) fwrite(&zero, 4, 1, f), fwrite(&one, 4, 1, f), fwrite(t, 1, 1, f);
        fwrite(&zero, 4, 1, f), fwrite(&two, 4, 1, f), fwrite(" d", 1, 2, f);
        fclose(f);
    }
    snprintf(args, sizeof args, "convert '%s' --tokenizer '%s' -o '%s'", bin, tok, gg);
    rc = cli_run(args, 0, &out);
    T_CHECK(rc == 1 && has(out, "token_embd.weight") && has(out, "NaN") && access(gg, F_OK) != 0,
            "convert of a NaN weight: rc %d: %.400s", rc, out ? out : "");
    free(out);
    wts[3] = 0.5f;
    f = fopen(bin, "wb");
    if (f) fwrite(hdr, 4, 7, f), fwrite(wts, 4, 46, f), fclose(f);
    rc = cli_run(args, 0, &out);
    T_CHECK(rc == 0 && access(gg, F_OK) == 0, "convert of the same checkpoint without the NaN: rc %d: %.400s", rc,
            out ? out : "");
    free(out);
}

/* The sampler has nothing to draw from when a logit is NaN or +Inf or all
 * are -Inf: an error, greedy or not (it returned id 0 with DHSA_OK). */
static void test_sampler(void) {
    for (int greedy = 0; greedy < 2; greedy++) {
        dhsa_sampler_params p = dhsa_sampler_default_params();
        if (greedy) p.temperature = 0;
        dhsa_sampler *s = NULL;
        T_CHECK(dhsa_sampler_create(&p, 4, &s) == DHSA_OK, "sampler");
        if (!s) return;
        const float ninf = -INFINITY, pinf = INFINITY;
        const float all_ninf[4] = {ninf, ninf, ninf, ninf}, one_pinf[4] = {0, pinf, 1, 2}, one_nan[4] = {0, 1, NAN, 2};
        const float ok[4] = {ninf, 1, ninf, 0};
        int32_t id = -7;
        dhsa_status st = dhsa_sampler_sample(s, all_ninf, NULL, 0, &id);
        T_CHECK(st == DHSA_ERR_NONFINITE && has(dhsa_last_error(), "-Inf"), "all -Inf (greedy %d): %d id %d", greedy,
                (int)st, id);
        st = dhsa_sampler_sample(s, one_pinf, NULL, 0, &id);
        T_CHECK(st == DHSA_ERR_NONFINITE && has(dhsa_last_error(), "+Inf"), "a +Inf logit (greedy %d): %d id %d",
                greedy, (int)st, id);
        st = dhsa_sampler_sample(s, one_nan, NULL, 0, &id);
        T_CHECK(st == DHSA_ERR_NONFINITE && has(dhsa_last_error(), "NaN"), "a NaN logit (greedy %d): %d", greedy,
                (int)st);
        st = dhsa_sampler_sample(s, ok, NULL, 0, &id);
        T_CHECK(st == DHSA_OK && (id == 1 || id == 3), "finite logits with some -Inf still sample (greedy %d): %d id %d",
                greedy, (int)st, id);
        dhsa_sampler_free(s);
    }
}

int main(void) {
    test_sampler();
    cli = getenv("DHSA_CLI");
    if (!cli || access(cli, X_OK) != 0) {
        fprintf(stderr, "SKIP: DHSA_CLI unset or not executable (tests/run.sh sets it): CLI promises skipped\n");
        return t_report("test_cli_promises");
    }
    if (access(MODEL, R_OK) != 0) {
        fprintf(stderr, "SKIP: %s absent (run from the repository root): CLI promises skipped\n", MODEL);
        return t_report("test_cli_promises");
    }
    snprintf(dir, sizeof dir, "/tmp/dhsa_promises_XXXXXX");
    if (!mkdtemp(dir)) {
        T_CHECK(0, "mkdtemp: %s", strerror(errno));
        return t_report("test_cli_promises");
    }
    test_replace_under_reader();
    test_refused_before_work();
    test_failed_write_keeps_old();
    test_sizes_first();
    test_messages();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return t_report("test_cli_promises");
}
