/* num_fuzz.c: libFuzzer harness for the CLI's strict number parsers
 * (dhsa_cli_parse_int / dhsa_cli_parse_real, tools/lib/cli_num.c, compiled
 * into this harness). Input: byte 0 picks the parser, the suffix flag and
 * the bounds (a pair the CLI uses, or two values read from the next 16
 * bytes), byte 1 the size of msg; the rest, up to its first NUL, is the
 * argument (NULL when it is empty and byte 0's top bits are both set).
 *
 * Each result is compared with a reference written here from the contract
 * in tools/cli.h ("the whole string must be the number; integers may take
 * a K/M/G/T suffix (powers of 1024)"): integers are [+-]?[0-9]+ and one
 * optional suffix letter, valued exactly in 128-bit arithmetic; reals are
 * the C decimal or hexadecimal floating forms (no inf / nan: a value must
 * be finite), valued by strtod. Accepted iff the grammar matches the whole
 * string and the value lies in [min, max]; on success *out is that value;
 * on failure msg holds a NUL-terminated sentence that starts with the
 * option's name. A mismatch aborts so libFuzzer keeps the input.
 * Run: make fuzz (FUZZ_SECONDS per harness).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void fail(const char *what, const char *s) {
    fprintf(stderr, "num_fuzz: broken contract: %s; argument \"%s\"\n", what, s ? s : "(null)");
    abort();
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }
static int is_hex(char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

/* [+-]?[0-9]+[kKmMgGtT]? (the suffix only when allowed): 1 and the exact
 * value in *v (saturated far outside int64), else 0. */
static int ref_int(const char *s, int suffix, __int128 *v) {
    const char *p = s;
    int neg = 0;
    if (*p == '+' || *p == '-') neg = *p++ == '-';
    if (!is_digit(*p)) return 0;
    __int128 x = 0;
    const __int128 cap = (__int128)1 << 80;
    for (; is_digit(*p); p++)
        if (x < cap) x = x * 10 + (*p - '0');
    int shift = 0;
    if (suffix && *p) {
        const char *u = strchr("kKmMgGtT", *p);
        if (u) {
            shift = 10 * (int)((u - "kKmMgGtT") / 2 + 1);
            p++;
        }
    }
    if (*p) return 0;
    if (x < cap) x <<= shift; /* x < 2^80 and shift <= 40: fits in 127 bits */
    *v = neg ? -x : x;
    return 1;
}

/* The C floating forms strtod takes, minus inf / nan: 1 when the whole of
 * s is one. */
static int ref_real_grammar(const char *s) {
    const char *p = s;
    if (*p == '+' || *p == '-') p++;
    int hex = p[0] == '0' && (p[1] == 'x' || p[1] == 'X');
    if (hex) p += 2;
    int digits = 0;
    while (hex ? is_hex(*p) : is_digit(*p)) p++, digits++;
    if (*p == '.') {
        p++;
        while (hex ? is_hex(*p) : is_digit(*p)) p++, digits++;
    }
    if (!digits) return 0;
    if (hex ? (*p == 'p' || *p == 'P') : (*p == 'e' || *p == 'E')) {
        const char *e = p + 1;
        if (*e == '+' || *e == '-') e++;
        if (is_digit(*e)) {
            while (is_digit(*e)) e++;
            p = e;
        } else {
            return 0; /* "1e", "0x1p": strtod stops before the letter, so it is trailing garbage */
        }
    }
    return *p == 0;
}

static void check_msg(const char *opt, const char *msg, size_t msg_len, const char *s) {
    if (memchr(msg, 0, msg_len) == NULL) fail("msg is not NUL-terminated within msg_len", s);
    size_t n = strlen(opt);
    if (msg_len > n && strncmp(msg, opt, n) != 0) fail("msg does not start with the option's name", s);
}

static const int64_t int_bounds[][2] = {
    {1, 1 << 20}, {0, INT64_MAX}, {INT64_MIN, INT64_MAX}, {1, (int64_t)1 << 31}, {-5, 5}, {0, 0},
    {(int64_t)1 << 40, (int64_t)1 << 50},
};
static const double real_bounds[][2] = {
    {0.0, 1.0}, {0.001, 1e9}, {-DBL_MAX, DBL_MAX}, {0.0, 2.0}, {-1.0, -0.5}, {0.0, 0.0}, {1e-300, 1e-100},
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    const uint8_t mode = data[0], msg_pick = data[1];
    const int real = mode & 1, suffix = (mode >> 1) & 1, from_bytes = (mode >> 2) & 1;
    const int pick_int = (mode >> 3) % (int)(sizeof int_bounds / sizeof int_bounds[0]);
    const int pick_real = (mode >> 3) % (int)(sizeof real_bounds / sizeof real_bounds[0]);
    size_t off = 2;
    uint8_t raw[16] = {0};
    if (from_bytes) {
        size_t k = size - off < 16 ? size - off : 16;
        memcpy(raw, data + off, k);
        off += k;
    }
    /* the argument: the rest up to its first NUL (argv strings have none) */
    size_t n = 0;
    while (off + n < size && data[off + n]) n++;
    char *s = malloc(n + 1);
    if (!s) abort();
    memcpy(s, data + off, n);
    s[n] = 0;
    const char *arg = (mode >> 6) == 3 && n == 0 ? NULL : s; /* NULL is allowed */

    const char *opt = "--opt";
    char msg[96];
    const size_t msg_len = 1 + (size_t)msg_pick % sizeof msg; /* small ones too: truncation must stay safe */
    memset(msg, 'x', sizeof msg);
    if (!real) {
        int64_t lo = int_bounds[pick_int][0], hi = int_bounds[pick_int][1];
        if (from_bytes) {
            memcpy(&lo, raw, 8);
            memcpy(&hi, raw + 8, 8);
            if (lo > hi) {
                int64_t t = lo;
                lo = hi;
                hi = t;
            }
        }
        int64_t out = 0x5a5a5a5a;
        int rc = dhsa_cli_parse_int(opt, arg, lo, hi, suffix, &out, msg, msg_len);
        __int128 v = 0;
        int want = arg && ref_int(arg, suffix, &v) && v >= lo && v <= hi;
        if (rc != 0 && rc != -1) fail("parse_int returns 0 or -1", arg);
        if (want && rc != 0) fail("parse_int refused a number in range", arg);
        if (!want && rc == 0) fail("parse_int accepted what is not a whole number in range", arg);
        if (rc == 0 && (out != (int64_t)v || out < lo || out > hi)) fail("parse_int's value differs", arg);
        if (rc != 0) check_msg(opt, msg, msg_len, arg);
    } else {
        double lo = real_bounds[pick_real][0], hi = real_bounds[pick_real][1];
        if (from_bytes) {
            memcpy(&lo, raw, 8);
            memcpy(&hi, raw + 8, 8);
            if (!isfinite(lo) || !isfinite(hi)) goto done; /* the CLI's bounds are finite */
            if (lo > hi) {
                double t = lo;
                lo = hi;
                hi = t;
            }
        }
        double out = 12345.0;
        int rc = dhsa_cli_parse_real(opt, arg, lo, hi, &out, msg, msg_len);
        int grammar = arg && ref_real_grammar(arg);
        double v = grammar ? strtod(arg, NULL) : 0.0;
        int want = grammar && isfinite(v) && v >= lo && v <= hi;
        if (rc != 0 && rc != -1) fail("parse_real returns 0 or -1", arg);
        if (want && rc != 0) fail("parse_real refused a finite number in range", arg);
        if (!want && rc == 0) fail("parse_real accepted what is not a whole finite number in range", arg);
        if (rc == 0 && (!(out == v) || !isfinite(out) || out < lo || out > hi)) fail("parse_real's value differs", arg);
        if (rc != 0) check_msg(opt, msg, msg_len, arg);
    }
done:
    free(s);
    return 0;
}
