/* cli_run.h: running the built CLI from a test (header-only, static).
 * DHSA_CLI holds its path (tests/run.sh sets it; tests skip without it).
 */
#ifndef DHSA_TESTS_CLI_RUN_H
#define DHSA_TESTS_CLI_RUN_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Runs `$DHSA_CLI args 2>&1` (or 2>/dev/null with quiet); returns the exit
 * status (-1 when it did not exit normally) and the output in *out, NUL-
 * terminated (caller frees; may be NULL only when allocation failed). */
static inline int cli_run(const char *args, int quiet, char **out) {
    const char *cli = getenv("DHSA_CLI");
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' %s %s", cli ? cli : "dhsa", args, quiet ? "2>/dev/null" : "2>&1");
    FILE *p = popen(cmd, "r");
    size_t cap = 1 << 16, n = 0, got;
    char *buf = malloc(cap);
    *out = buf;
    if (!p || !buf) {
        if (p) pclose(p);
        return -1;
    }
    while ((got = fread(buf + n, 1, cap - n - 1, p)) > 0) {
        n += got;
        if (cap - n < 1024) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) break;
            *out = buf = nb;
            cap *= 2;
        }
    }
    buf[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Runs `sh -c "PRE exec $DHSA_CLI ARGS 2>&1"` in a child and returns its
 * exit status (-1 if it did not exit), its output in *out (caller frees),
 * its wall time in *secs and its peak RSS in KiB in *maxrss_kb (wait4's
 * ru_maxrss: the child's own, sh being replaced by the CLI; it includes
 * the test's resident set at the fork, a few MiB at most). pre, secs and
 * maxrss_kb may be NULL. */
static inline int cli_run_measured(const char *pre, const char *args, char **out, double *secs, long *maxrss_kb) {
    const char *cli = getenv("DHSA_CLI");
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s exec '%s' %s 2>&1", pre ? pre : "", cli ? cli : "dhsa", args);
    int fd[2];
    *out = NULL;
    if (maxrss_kb) *maxrss_kb = 0;
    if (pipe(fd) != 0) return -1;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        dup2(fd[1], 1);
        close(fd[1]);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    ssize_t got;
    while (buf && (got = read(fd[0], buf + n, cap - n - 1)) > 0) {
        n += (size_t)got;
        if (cap - n < 1024) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) break;
            buf = nb;
            cap *= 2;
        }
    }
    close(fd[0]);
    if (buf) buf[n] = 0;
    *out = buf;
    int st = 0;
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    if (pid < 0 || wait4(pid, &st, 0, &ru) < 0) return -1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (secs) *secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    if (maxrss_kb) *maxrss_kb = ru.ru_maxrss;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

#endif
