/* cli_num.c: strict command-line number parsing shared by every dhsa
 * subcommand (tools/dhsa.c, tools/memprobe.c, tools/sparse.c). The parsers
 * never exit: they return 0 on success or -1 with a sentence in msg, and
 * each subcommand reports it its own way (usage text, exit status 2).
 * Tested through the CLI by tests/test_cli.c (bad numbers exit 2).
 */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

int dhsa_cli_parse_int(const char *opt, const char *s, int64_t min, int64_t max, int suffix, int64_t *out,
                       char *msg, size_t msg_len) {
    if (!s || !s[0] || isspace((unsigned char)s[0])) {
        snprintf(msg, msg_len, "%s: \"%s\" is not an integer", opt, s ? s : "");
        return -1;
    }
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (end == s) {
        snprintf(msg, msg_len, "%s: \"%s\" is not an integer", opt, s);
        return -1;
    }
    int shift = 0;
    if (suffix && *end) {
        switch (*end) {
        case 'k': case 'K': shift = 10; end++; break;
        case 'm': case 'M': shift = 20; end++; break;
        case 'g': case 'G': shift = 30; end++; break;
        case 't': case 'T': shift = 40; end++; break;
        default: break;
        }
    }
    if (*end) {
        snprintf(msg, msg_len, "%s: \"%s\" is not an integer%s", opt, s,
                 suffix ? " (optionally followed by K, M, G or T)" : "");
        return -1;
    }
    int64_t mult = (int64_t)1 << shift;
    if (errno == ERANGE || (v > 0 && v > INT64_MAX / mult) || (v < 0 && v < INT64_MIN / mult) ||
        (int64_t)v * mult < min || (int64_t)v * mult > max) {
        snprintf(msg, msg_len, "%s: %s is out of range (must be in [%lld, %lld])", opt, s, (long long)min,
                 (long long)max);
        return -1;
    }
    *out = (int64_t)v * mult;
    return 0;
}

int dhsa_cli_parse_real(const char *opt, const char *s, double min, double max, double *out, char *msg,
                        size_t msg_len) {
    if (!s || !s[0] || isspace((unsigned char)s[0])) {
        snprintf(msg, msg_len, "%s: \"%s\" is not a number", opt, s ? s : "");
        return -1;
    }
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end) {
        snprintf(msg, msg_len, "%s: \"%s\" is not a number", opt, s);
        return -1;
    }
    /* Not errno's ERANGE: it also flags underflow ("1e-400"), where strtod
     * returns the nearest double (0 or subnormal), a rounding like any
     * other; overflow is +-HUGE_VAL, which isfinite refuses. */
    if (!isfinite(v) || v < min || v > max) {
        snprintf(msg, msg_len, "%s: %s is out of range (must be in [%g, %g])", opt, s, min, max);
        return -1;
    }
    *out = v;
    return 0;
}
