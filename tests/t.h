/* t.h: the tiny test harness every tests/test_*.c uses.
 *
 *   T_CHECK(cond, fmt, ...)  counts a check; on failure prints where and why.
 *   T_SKIP(n, fmt, ...)      a part that cannot run here (../shared absent, no
 *                             CLI binary, an ISA this CPU lacks, a sanitizer
 *                             build): prints "SKIP (n checks): why" and counts
 *                             n skipped checks.
 *   return t_report("name"); prints "name: P passed, F failed, S skipped" and
 *                             returns the exit status (0 iff nothing failed:
 *                             a skip never fails).
 *
 * n is the number of T_CHECKs the part runs where it can run, so that
 * passed + failed + skipped is the same on every machine. For a part that
 * reads ../shared it is the count with the files ../shared/models/SHA256SUMS
 * and ../shared/vocab/SHA256SUMS pin; tests/test_skips.c runs test binaries
 * with ../shared hidden and checks that the sum does not move. A part that
 * checks per element of something (a loop over ISAs, over vocabularies)
 * skips per element, with that element's count; one that ran already on
 * another ISA counts what it ran there (t_checks). When the skip path makes
 * checks of its own, n is what the part would run minus those.
 *
 * tests/run.sh runs every test binary and sums these lines into the final
 * "N passed, N failed, M skipped" that `make test` ends with (then a line
 * saying what the skipped checks need, when there are any).
 */
#ifndef DHSA_T_H
#define DHSA_T_H

#include <stdio.h>

static int t_passed, t_failed, t_skipped;

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

#define T_SKIP(n, ...)                                                       \
    do {                                                                     \
        int t_n_ = (n);                                                      \
        t_skipped += t_n_;                                                   \
        fprintf(stderr, "SKIP (%d check%s): ", t_n_, t_n_ == 1 ? "" : "s");  \
        fprintf(stderr, __VA_ARGS__);                                        \
        fputc('\n', stderr);                                                 \
    } while (0)

/* Checks counted so far: a part that runs once per ISA measures itself on
 * the first and skips that many on an ISA this machine lacks. */
static inline int t_checks(void) { return t_passed + t_failed; }

static int t_report(const char *name) {
    printf("%s: %d passed, %d failed, %d skipped\n", name, t_passed, t_failed, t_skipped);
    return t_failed ? 1 : 0;
}

#endif
