/* t.h: the tiny test harness every tests/test_*.c uses.
 *
 *   T_CHECK(cond, fmt, ...)  counts a check; on failure prints where and why.
 *   T_SKIP(fmt, ...)         says why a part was skipped (missing ../shared).
 *   return t_report("name"); prints "name: P passed, F failed" and returns
 *                             the exit status (0 iff nothing failed).
 * tests/run.sh runs every test binary and sums these lines into the final
 * "N passed, N failed" that `make test` ends with.
 */
#ifndef DHSA_T_H
#define DHSA_T_H

#include <stdio.h>

static int t_passed, t_failed;

#define T_CHECK(cond, ...)                                                   \
    do {                                                                     \
        if (cond) {                                                          \
            t_passed++;                                                      \
        } else {                                                             \
            t_failed++;                                                      \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);             \
            fprintf(stderr, __VA_ARGS__);                                    \
            fputc('\n', stderr);                                             \
        }                                                                    \
    } while (0)

#define T_SKIP(...)                                                          \
    do {                                                                     \
        fprintf(stderr, "SKIP: ");                                           \
        fprintf(stderr, __VA_ARGS__);                                        \
        fputc('\n', stderr);                                                 \
    } while (0)

static int t_report(const char *name) {
    printf("%s: %d passed, %d failed\n", name, t_passed, t_failed);
    return t_failed ? 1 : 0;
}

#endif
