/* test_dist.c: context parallelism over MPI (docs/dist.md). `dhsa run`
 * under `mpirun -np R` (R = 1, 2, 4, oversubscribed on this machine) must
 * give the same greedy token ids as one process, dense and DHSA (routing
 * forced on: --dense-below 0, density 0.25), contiguous and striped (64),
 * every rank the same ids, and, dense, logits within 1e-5 relative
 * (|a - b| <= 1e-5 (|ref| + rms(ref)) per element, every step). A rank
 * killed, or one that stalls, must end the job with a message within 30 s.
 * The reference is the one-process run of the same binary (its own
 * correctness is tests/test_default_model.c's). Skipped, saying so, without
 * mpirun or with a CLI built without MPI.
 */
#include "t.h"
#include "cli_run.h"

#include <math.h>
#include <stdint.h>

/* every check main makes where it runs: the prompt, 2 methods x (the
 * reference + 2 stripes x 3 rank counts x 3), 6 dense logits, the wrong
 * prompt, 2 faults x 4 */
#define N_CHECKS (1 + 2 * (1 + 2 * 3 * 3) + 6 + 1 + 2 * 4)
#define MPIRUN "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 mpirun --oversubscribe"

/* The generated ids: the last n_gen numbers of the --ids output line. */
static int read_ids(const char *out, int *ids, int cap) {
    int n = 0;
    const char *p = out;
    while (*p && n < cap) {
        char *e;
        long v = strtol(p, &e, 10);
        if (e == p) {
            /* skip to the next line start if not a number */
            const char *nl = strchr(p, '\n');
            if (!nl) break;
            if (n > 0) break; /* the ids line is the first numeric line */
            p = nl + 1;
            continue;
        }
        ids[n++] = (int)v;
        p = e;
        if (*p == '\n') break;
    }
    return n;
}

static float *read_floats(const char *path, long *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long bytes = ftell(f);
    fseek(f, 0, SEEK_SET);
    float *x = malloc((size_t)bytes + 4);
    *n = x ? (long)fread(x, sizeof(float), (size_t)bytes / sizeof(float), f) : 0;
    fclose(f);
    return x;
}

/* The worst |a - b| / (|ref| + rms(ref)) over the files; -1 if they differ in size. */
static double logits_err(const char *ref, const char *got) {
    long na, nb;
    float *a = read_floats(ref, &na), *b = read_floats(got, &nb);
    double worst = -1;
    if (a && b && na == nb && na > 0) {
        double ss = 0;
        for (long i = 0; i < na; i++) ss += (double)a[i] * a[i];
        double rms = sqrt(ss / (double)na);
        worst = 0;
        for (long i = 0; i < na; i++) {
            double e = fabs((double)a[i] - b[i]) / (fabs((double)a[i]) + rms);
            if (e > worst) worst = e;
        }
    }
    free(a);
    free(b);
    return worst;
}

static int write_prompt(const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) return 0;
    for (int i = 1; i <= 12; i++) fprintf(f, "Line %d of the filler text talks about cats and dogs and the weather. ", i);
    fprintf(f, "The pass key is 40913. Remember it. ");
    for (int i = 13; i <= 24; i++) fprintf(f, "Line %d of the filler text talks about cats and dogs and the weather. ", i);
    fprintf(f, "What is the pass key? The pass key is");
    return fclose(f) == 0;
}

int main(void) {
    const char *cli = getenv("DHSA_CLI");
    char *out = NULL;
    if (!cli || system("command -v mpirun >/dev/null 2>&1") != 0) {
        T_SKIP(N_CHECKS, "no mpirun (or no DHSA_CLI): apt-get install openmpi-bin libopenmpi-dev, then make "
               "clean && make (.ci/run does)");
        return t_report("test_dist");
    }
    /* a CLI built without MPI refuses a launch of 2 ranks, saying so */
    char cmd[4096];
    snprintf(cmd, sizeof cmd, MPIRUN " -np 2 '%s' run -p x -n 1 --ctx 64 2>&1", cli);
    FILE *pp = popen(cmd, "r");
    char probe[8192] = "";
    size_t got = pp ? fread(probe, 1, sizeof probe - 1, pp) : 0;
    probe[got] = 0;
    if (pp) pclose(pp);
    if (strstr(probe, "built without MPI")) {
        T_SKIP(N_CHECKS, "this dhsa was built without MPI (pkg-config mpi-c found nothing): install "
               "libopenmpi-dev, then make clean && make");
        return t_report("test_dist");
    }
    char dir[] = "/tmp/dhsa_test_dist_XXXXXX";
    if (!mkdtemp(dir)) {
        T_CHECK(0, "mkdtemp");
        return t_report("test_dist");
    }
    char prompt[256], refl[256], gotl[256];
    snprintf(prompt, sizeof prompt, "%s/prompt.txt", dir);
    T_CHECK(write_prompt(prompt), "writing %s", prompt);
    const char *methods[2] = {"--attn dense", "--attn dhsa --dense-below 0 --density 0.25"};
    const int stripes[2] = {0, 64}, nps[3] = {1, 2, 4};
    for (int mi = 0; mi < 2; mi++) {
        char args[1024];
        snprintf(refl, sizeof refl, "%s/ref%d.f32", dir, mi);
        snprintf(args, sizeof args, "run -f %s -n 6 --temp 0 --ids -t 1 --ctx 1024 %s --logits-out %s", prompt,
                 methods[mi], refl);
        int rc = cli_run(args, 1, &out);
        int ref[2048], n_ref = out ? read_ids(out, ref, 2048) : 0;
        T_CHECK(rc == 0 && n_ref > 600, "%s: one process: exit %d, %d ids", methods[mi], rc, n_ref);
        free(out);
        for (int si = 0; si < 2; si++)
            for (int ni = 0; ni < 3; ni++) {
                snprintf(gotl, sizeof gotl, "%s/got%d%d%d.f32", dir, mi, si, ni);
                snprintf(cmd, sizeof cmd, MPIRUN " -np %d '%s' run -f %s -n 6 --temp 0 --ids -t 1 --ctx 1024 %s "
                         "--dist-stripe %d --logits-out %s 2>%s/err", nps[ni], cli, prompt, methods[mi], stripes[si],
                         gotl, dir);
                FILE *p = popen(cmd, "r");
                char buf[65536];
                size_t nb = p ? fread(buf, 1, sizeof buf - 1, p) : 0;
                buf[nb] = 0;
                int st = p ? pclose(p) : -1;
                int ids[2048], n = read_ids(buf, ids, 2048), same = n == n_ref;
                for (int i = 0; same && i < n; i++) same = ids[i] == ref[i];
                T_CHECK(st == 0, "%s stripe %d np %d: exit status %d", methods[mi], stripes[si], nps[ni], st);
                T_CHECK(same, "%s stripe %d np %d: %d ids, not the one process's %d (first generated: %d vs %d)",
                        methods[mi], stripes[si], nps[ni], n, n_ref, n > 0 ? ids[n - 1] : -1, ref[n_ref - 1]);
                char ep[300];
                snprintf(ep, sizeof ep, "%s/err", dir);
                FILE *e = fopen(ep, "r");
                char eb[65536] = "";
                size_t ne = e ? fread(eb, 1, sizeof eb - 1, e) : 0;
                eb[ne] = 0;
                if (e) fclose(e);
                T_CHECK(nps[ni] == 1 || strstr(eb, "dist: every rank generated the same"),
                        "%s stripe %d np %d: the ranks did not say they generated the same ids:\n%.2000s", methods[mi],
                        stripes[si], nps[ni], eb);
                if (mi == 0) {
                    double err = logits_err(refl, gotl);
                    T_CHECK(err >= 0 && err <= 1e-5, "dense stripe %d np %d: logits differ by %.3g relative (1e-5)",
                            stripes[si], nps[ni], err);
                }
            }
    }
    /* the comparison can fail: the logits of another prompt */
    {
        char args[1024];
        snprintf(gotl, sizeof gotl, "%s/other.f32", dir);
        snprintf(args, sizeof args, "run -p \"A different prompt entirely, about ships.\" -n 6 --temp 0 --ids -t 1 --ctx "
                 "1024 --ignore-eos --logits-out %s", gotl);
        int rc = cli_run(args, 1, &out);
        free(out);
        snprintf(refl, sizeof refl, "%s/ref0.f32", dir);
        double err = logits_err(refl, gotl);
        T_CHECK(rc == 0 && (err < 0 || err > 1e-3), "another prompt's logits pass the comparison (%.3g)", err);
    }
    /* faults: a killed rank, a stalled rank; each must end the job, saying so, within 30 s */
    const char *faults[2] = {"kill:1", "stall:1"};
    for (int f = 0; f < 2; f++) {
        char pre[256];
        snprintf(pre, sizeof pre, "DHSA_DIST_FAULT=%s DHSA_DIST_TIMEOUT=5 " MPIRUN " -np 2", faults[f]);
        double secs = 0;
        char args[1024];
        snprintf(args, sizeof args, "run -f %s -n 4 --temp 0 --ctx 1024", prompt);
        snprintf(cmd, sizeof cmd, "%s '%s' %s", pre, cli, args);
        char full[4200];
        snprintf(full, sizeof full, "timeout 60 sh -c \"%s\" 2>&1", cmd);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        FILE *p = popen(full, "r");
        static char buf[65536];
        size_t nb = p ? fread(buf, 1, sizeof buf - 1, p) : 0;
        buf[nb] = 0;
        int st = p ? pclose(p) : -1;
        clock_gettime(CLOCK_MONOTONIC, &t1);
        secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        T_CHECK(st != 0, "%s: the job exited 0", faults[f]);
        T_CHECK(secs < 30, "%s: the job took %.1f s to end (30 s at most)", faults[f], secs);
        const char *want = f == 0 ? "stopped by the launcher" : "no answer from the other ranks";
        T_CHECK(strstr(buf, want) != NULL, "%s: no \"%s\" in the output:\n%.3000s", faults[f], want, buf);
        T_CHECK(strstr(buf, "DHSA_DIST_FAULT") != NULL, "%s: the fault did not happen:\n%.2000s", faults[f], buf);
        fprintf(stderr, "test_dist: %s ended the job in %.1f s\n", faults[f], secs);
    }
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "test_dist: could not remove %s\n", dir);
    return t_report("test_dist");
}
