/* cli_file.c: reading a whole input file for the CLI commands (prompts,
 * texts, haystacks, filler). "-" reads stdin. Declared in tools/cli.h.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
