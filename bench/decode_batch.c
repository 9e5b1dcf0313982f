/* bench/decode_batch.c: the library's cap for dhsa serve's batched decode
 * (docs/notes/results-serve-dist.md, "Where the time goes"). On the default model, one
 * session's one-token step (dhsa_session_eval, and dhsa_session_eval_batch
 * of 1) against dhsa_session_eval_batch over 4 sessions, all on one ctx of
 * T threads, interleaved in 8 rounds of 5 x 10 passes; medians per pass,
 * and the cap 4 x step / batch on the tokens/s of 4 slots against one.
 *
 * Run from the repository root:
 *   cc -std=c11 -O2 -Iinclude -o build/decode_batch bench/decode_batch.c build/libdhsa.a -lpthread -lm
 *   build/decode_batch 1 && build/decode_batch 2 [MODEL.gguf]
 */
#define _POSIX_C_SOURCE 200809L
#include "dhsa.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
int main(int argc, char **argv) {
    int T = argc > 1 ? atoi(argv[1]) : 2;
    dhsa_model_params mp = dhsa_model_default_params();
    const char *path = argc > 2 ? argv[2] : "models/dhsa-retrieval-8m.gguf";
    dhsa_model *m; if (dhsa_model_load(path, &mp, &m)) { puts(dhsa_last_error()); return 1; }
    dhsa_ctx_params cp = dhsa_ctx_default_params(); cp.n_threads = T;
    dhsa_ctx *ctx; dhsa_ctx_create(&cp, &ctx);
    dhsa_session_params sp = dhsa_session_default_params(); sp.n_ctx = 1024;
    dhsa_session *s[4]; int32_t ids[4] = {5, 6, 7, 8}, pr[16];
    for (int i = 0; i < 16; i++) pr[i] = 10 + i;
    int64_t V = dhsa_model_get_info(m)->n_vocab;
    float *lg = malloc(4 * V * sizeof(float));
    for (int i = 0; i < 4; i++) { if (dhsa_session_create(ctx, m, &sp, &s[i])) { puts(dhsa_last_error()); return 1; } dhsa_session_eval(s[i], pr, 16, lg); }
    double one[40], four[40], b1[40]; int n1 = 0, n4 = 0, nb = 0;
    for (int r = 0; r < 8; r++) {
        for (int k = 0; k < 5; k++) {
            double t = now(); for (int j = 0; j < 10; j++) dhsa_session_eval(s[0], ids, 1, lg); one[n1++] = (now() - t) / 10 * 1e3;
            t = now(); for (int j = 0; j < 10; j++) dhsa_session_eval_batch(s, 4, ids, lg); four[n4++] = (now() - t) / 10 * 1e3;
            t = now(); for (int j = 0; j < 10; j++) dhsa_session_eval_batch(s + 1, 1, ids, lg); b1[nb++] = (now() - t) / 10 * 1e3;
        }
        for (int i = 0; i < 4; i++) dhsa_session_truncate(s[i], 16);
    }
    qsort(one, n1, sizeof *one, cmp); qsort(b1, nb, sizeof *b1, cmp); printf("eval_batch of 1 session: %.3f ms\n", b1[nb / 2]); qsort(four, n4, sizeof *four, cmp);
    printf("threads %d: one-session step %.3f ms (1/s %.0f tok/s), 4-session batch %.3f ms (%.0f tok/s): cap %.2fx\n", T,
           one[n1 / 2], 1e3 / one[n1 / 2], four[n4 / 2], 4e3 / four[n4 / 2], 4 * one[n1 / 2] / four[n4 / 2]);
    return 0;
}
