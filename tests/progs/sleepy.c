/* sleepy.c: a memory-probe target that outlives its time limit.
 *
 *   sleepy SECONDS [ignore-term]   sleeps SECONDS (may be fractional) and
 *                                  exits 0; with ignore-term it ignores
 *                                  SIGTERM, so only SIGKILL ends it early.
 *
 * Built by `make test` into build/progs/; driven by tests/test_memprobe.c
 * (the --timeout and --grace paths of `dhsa memprobe`).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int main(int argc, char **argv) {
    char *end = NULL;
    double s = argc >= 2 ? strtod(argv[1], &end) : -1.0;
    int ignore = argc == 3 && strcmp(argv[2], "ignore-term") == 0;
    if (argc < 2 || argc > 3 || !end || *end || !(s >= 0 && s < 1e6) || (argc == 3 && !ignore)) {
        fprintf(stderr, "usage: sleepy SECONDS [ignore-term]\n");
        return 2;
    }
    if (ignore) signal(SIGTERM, SIG_IGN);
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
    return 0;
}
