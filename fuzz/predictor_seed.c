/* predictor_seed.c: writes the seeds of predictor_fuzz (make fuzz runs it):
 * small random boundary predictors (dhsa_predictor_create_random, saved
 * with dhsa_predictor_save) of a few widths, windows and hidden sizes, so
 * that the fuzzer starts from valid files instead of guessing the format.
 * Usage: predictor_seed DIR
 */
#include <stdio.h>

#include "dhsa.h"

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: predictor_seed DIR\n");
        return 2;
    }
    static const int64_t shapes[][3] = {{1, 1, 1}, {8, 2, 4}, {17, 4, 8}, {64, 7, 16}}; /* C, w, hidden */
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        dhsa_predictor *p;
        char path[4096];
        snprintf(path, sizeof path, "%s/random-C%lld-w%lld-h%lld.pred", argv[1], (long long)shapes[i][0],
                 (long long)shapes[i][1], (long long)shapes[i][2]);
        if (dhsa_predictor_create_random(shapes[i][0], shapes[i][1], shapes[i][2], 1 + i, &p) != DHSA_OK ||
            dhsa_predictor_save(p, path) != DHSA_OK) {
            fprintf(stderr, "predictor_seed: %s: %s\n", path, dhsa_last_error());
            return 1;
        }
        dhsa_predictor_free(p);
    }
    return 0;
}
