/* crash.c: a memory-probe target that fails on purpose.
 *
 *   crash N MODE [FROM]   writes N KiB, then, if N >= FROM (default 0):
 *                         MODE segv: dies of SIGSEGV; abort: of SIGABRT;
 *                         exit: exits with status 3. Below FROM: exits 0.
 *
 * The signal's default action is restored before raising it, so that a
 * sanitizer's handler (make asan) does not turn the death into an exit
 * status. Built by `make test` into build/progs/; driven by
 * tests/test_memprobe.c.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long long parse(const char *s) {
    if (!s[0] || s[0] == '-' || s[0] == '+' || s[0] == ' ') return -1;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    return errno || *end ? -1 : v;
}

int main(int argc, char **argv) {
    long long n = argc >= 3 ? parse(argv[1]) : -1, from = argc == 4 ? parse(argv[3]) : 0;
    const char *mode = argc >= 3 ? argv[2] : "";
    int sig = strcmp(mode, "segv") == 0 ? SIGSEGV : strcmp(mode, "abort") == 0 ? SIGABRT : 0;
    if (n < 0 || n > (1LL << 24) || from < 0 || argc > 4 || (!sig && strcmp(mode, "exit") != 0)) {
        fprintf(stderr, "usage: crash N segv|abort|exit [FROM]\n");
        return 2;
    }
    size_t bytes = (size_t)n * 1024;
    char *p = malloc(bytes ? bytes : 1);
    if (!p) return 1;
    memset(p, 1, bytes);
    /* Read it back: a write followed by free (or by nothing) may be
     * dropped by the compiler, and the pages would never be resident. */
    unsigned sum = 0;
    for (size_t i = 0; i < bytes; i += 4096) sum += (unsigned char)p[i];
    if (sum != (bytes + 4095) / 4096) return 4;
    if (n < from) {
        free(p);
        return 0;
    }
    fprintf(stderr, "crash: failing on purpose (%s) at n=%lld\n", mode, n);
    if (!sig) {
        free(p);
        return 3;
    }
    signal(sig, SIG_DFL);
    raise(sig);
    return 1; /* not reached */
}
