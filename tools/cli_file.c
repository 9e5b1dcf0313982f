/* cli_file.c: reading a whole input file for the CLI commands (prompts,
 * texts, haystacks, filler; "-" reads stdin) and finding the default
 * model. Declared in tools/cli.h.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

char *dhsa_cli_read_file(const char *path, int64_t max_bytes, int64_t *len) {
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
        if (n == cap) {
            if ((int64_t)cap >= max_bytes) {
                free(buf);
                buf = NULL;
                errno = EFBIG;
                break;
            }
            char *b = realloc(buf, cap * 2 + 1);
            if (!b) {
                free(buf);
                buf = NULL;
                errno = ENOMEM;
                break;
            }
            buf = b;
            cap *= 2;
        }
    }
    int bad = ferror(f);
    if (f != stdin) fclose(f);
    if (bad && buf) {
        free(buf);
        errno = EIO;
        return NULL;
    }
    if (!buf) return NULL;
    buf[n] = 0;
    *len = (int64_t)n;
    return buf;
}

const char *dhsa_cli_default_model(char *msg, size_t msg_len) {
    static char path[4096];
    const char *env = getenv("DHSA_MODEL");
    if (env && env[0]) {
        if (access(env, R_OK) == 0) return env;
        snprintf(msg, msg_len, "DHSA_MODEL=%s cannot be read", env);
        return NULL;
    }
    char exe[3072];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0; /* the executable's folder (build/) */
            snprintf(path, sizeof path, "%s/../models/%s", exe, DHSA_DEFAULT_MODEL);
            if (access(path, R_OK) == 0) return path;
        }
    }
    snprintf(path, sizeof path, "models/%s", DHSA_DEFAULT_MODEL);
    if (access(path, R_OK) == 0) return path;
    snprintf(msg, msg_len,
             "no -m MODEL given and the default model %s was not found (looked beside the executable in "
             "../models/ and in ./models/; DHSA_MODEL names another file)", DHSA_DEFAULT_MODEL);
    return NULL;
}
