/* alloc_quadratic.c: a memory-probe target whose peak grows as n^2.
 *
 *   alloc_quadratic N A     allocates A*N*N bytes, writes every page, exits 0
 *
 * The block is written (not just allocated) because untouched pages are
 * never resident. Bad arguments: a message and exit 2. Built by `make test`
 * into build/progs/; driven by tests/test_memprobe.c through `dhsa memprobe`.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A whole-text non-negative integer, or -1. */
static long long parse(const char *s) {
    if (!s[0] || s[0] == '-' || s[0] == '+' || s[0] == ' ') return -1;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    return errno || *end ? -1 : v;
}

int main(int argc, char **argv) {
    long long n = argc == 3 ? parse(argv[1]) : -1, a = argc == 3 ? parse(argv[2]) : -1;
    if (n < 0 || a < 0 || (n > 0 && (uint64_t)a > SIZE_MAX / (uint64_t)n / (uint64_t)n)) {
        fprintf(stderr, "usage: alloc_quadratic N A   (allocates and writes A*N*N bytes)\n");
        return 2;
    }
    size_t bytes = (size_t)a * (size_t)n * (size_t)n;
    unsigned char *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "alloc_quadratic: cannot allocate %zu bytes\n", bytes);
        return 1;
    }
    memset(p, 1, bytes);
    /* Read it back so that the writes cannot be dropped. */
    unsigned sum = 0;
    for (size_t i = 0; i < bytes; i += 4096) sum += p[i];
    free(p);
    return sum == (bytes + 4095) / 4096 ? 0 : 3;
}
