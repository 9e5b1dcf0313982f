/* cli_run.h: running the built CLI from a test (header-only, static).
 * DHSA_CLI holds its path (tests/run.sh sets it; tests skip without it).
 */
#ifndef DHSA_TESTS_CLI_RUN_H
#define DHSA_TESTS_CLI_RUN_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

/* Runs `$DHSA_CLI args 2>&1` (or 2>/dev/null with quiet); returns the exit
 * status (-1 when it did not exit normally) and the output in *out, NUL-
 * terminated (caller frees; may be NULL only when allocation failed). */
static int cli_run(const char *args, int quiet, char **out) {
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

#endif
