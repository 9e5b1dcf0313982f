/* niah.c: needle-in-a-haystack scoring and needle placement (contract in
 * niah.h). Used by `dhsa eval niah` (tools/eval.c); tested by
 * tests/test_eval.c.
 */
#include "eval/niah.h"

#include <math.h>
#include <stddef.h>

static int is_digit(char c) { return c >= '0' && c <= '9'; }

int dhsa__niah_answer_has(const char *answer, int64_t len, const char *number) {
    if (!number) return -1;
    int64_t nl = 0;
    while (number[nl]) {
        if (!is_digit(number[nl]) || nl >= 32) return -1;
        nl++;
    }
    if (nl == 0) return -1;
    if (!answer || len <= 0) return 0;
    int64_t i = 0;
    while (i < len) {
        if (!is_digit(answer[i])) {
            i++;
            continue;
        }
        /* a number starts at i: digits, then ",ddd" groups, then ".d+" */
        char digits[33];
        int64_t nd = 0, overflow = 0;
        for (;;) {
            while (i < len && is_digit(answer[i])) {
                if (nd < 32) digits[nd] = answer[i];
                else overflow = 1;
                nd++;
                i++;
            }
            if (i + 3 < len && answer[i] == ',' && is_digit(answer[i + 1]) && is_digit(answer[i + 2]) &&
                is_digit(answer[i + 3]) && (i + 4 >= len || !is_digit(answer[i + 4]))) {
                i++; /* a thousands separator: the group joins the number */
                continue;
            }
            break;
        }
        int decimal = 0;
        if (i + 1 < len && answer[i] == '.' && is_digit(answer[i + 1])) {
            decimal = 1;
            i++;
            while (i < len && is_digit(answer[i])) i++;
        }
        if (!decimal && !overflow && nd == nl) {
            int same = 1;
            for (int64_t k = 0; k < nl && same; k++) same = digits[k] == number[k];
            if (same) return 1;
        }
    }
    return 0;
}

int64_t dhsa__niah_boundary(const int64_t *tokens, int64_t n, double depth) {
    if (n <= 0 || !tokens) return 0;
    if (!(depth >= 0)) depth = 0; /* NaN too */
    if (depth > 1) depth = 1;
    double total = 0;
    for (int64_t i = 0; i < n; i++) total += (double)tokens[i];
    double target = depth * total, off = 0, best_d = INFINITY;
    int64_t best = 0;
    for (int64_t k = 0; k <= n; k++) {
        double d = fabs(off - target);
        if (d < best_d) {
            best_d = d;
            best = k;
        }
        if (k < n) off += (double)tokens[k];
    }
    return best;
}
