/* mix_check.c: dhsa's logits on GGUF files (e.g. llama-quantize's mixes)
 * against the double-precision reference of tests/llm_ref.h on the same
 * file (docs/model.md, "Real quantization mixes").
 *
 *   cc -std=c11 -O2 -Iinclude -Isrc -Itests tools/peer/mix_check.c build/libdhsa.a -lpthread -lm -o build/mix_check
 *   build/mix_check [--peer-dir DIR] FILE.gguf...
 *
 * Per file: the tensor types it holds (count of each), then the relative
 * L2 error of every logit of 32 positions (random token ids after BOS),
 * prefill and one token at a time, and whether the argmax agrees at every
 * position. With --peer-dir, DIR/NAME.logits (F32 [32][n_vocab], another
 * program's logits on the same ids, e.g. llama.cpp's) is held to the same
 * reference and its error printed too. Exit 1 if a file fails to load or
 * dhsa's error is above 1e-5. */
#include "dhsa.h"
#include "llm_ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double rel(const float *a, const double *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += b[i] * b[i];
    }
    return sqrt(num / den);
}

int main(int argc, char **argv) {
    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = 2;
    dhsa_ctx *ctx;
    if (dhsa_ctx_create(&cp, &ctx)) return 1;
    int bad = 0, f0 = 1;
    const char *peer = NULL;
    if (argc > 2 && strcmp(argv[1], "--peer-dir") == 0) {
        peer = argv[2];
        f0 = 3;
    }
    for (int f = f0; f < argc; f++) {
        dhsa_gguf *g;
        if (dhsa_gguf_open(argv[f], &g)) {
            printf("%s: %s\n", argv[f], dhsa_last_error());
            bad = 1;
            continue;
        }
        int count[64] = {0};
        for (int64_t i = 0; i < dhsa_gguf_n_tensors(g); i++) {
            uint32_t t = dhsa_gguf_tensor_at(g, i)->type;
            if (t < 64) count[t]++;
        }
        printf("%s: tensors", argv[f]);
        for (int t = 0; t < 64; t++)
            if (count[t]) printf(" %s x%d", dhsa_ggml_type_name((uint32_t)t), count[t]);
        printf("\n");
        dhsa_gguf_close(g);
        llmref_model ref;
        dhsa_model *m;
        if (llmref_model_load_file(argv[f], &ref)) {
            printf("  reference: %s\n", llmref_error());
            bad = 1;
            continue;
        }
        if (dhsa_model_load(argv[f], NULL, &m)) {
            printf("  dhsa: %s\n", dhsa_last_error());
            llmref_model_free(&ref);
            bad = 1;
            continue;
        }
        const int64_t n = 32, V = ref.n_vocab;
        int32_t ids[32];
        uint64_t s = 12345;
        for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)(llmref_rand_u64(&s) % (uint64_t)V);
        ids[0] = 1;
        double *want = malloc((size_t)(n * V) * sizeof(double));
        float *got = malloc((size_t)(n * V) * sizeof(float));
        double r[2] = {1, 1};
        int agree[2] = {0, 0};
        if (llmref_forward(&ref, ids, n, want) == 0) {
            for (int by_token = 0; by_token < 2; by_token++) {
                dhsa_session_params sp = dhsa_session_default_params();
                sp.logits_all = 1;
                dhsa_session *ss;
                dhsa_status st = dhsa_session_create(ctx, m, &sp, &ss);
                if (!st && !by_token) st = dhsa_session_eval(ss, ids, n, got);
                for (int64_t i = 0; i < n && !st && by_token; i++) st = dhsa_session_eval(ss, ids + i, 1, got + i * V);
                if (!st) dhsa_session_free(ss);
                if (st) {
                    printf("  eval: %s\n", dhsa_last_error());
                    continue;
                }
                r[by_token] = rel(got, want, n * V);
                agree[by_token] = 1;
                for (int64_t i = 0; i < n; i++) {
                    int64_t a = 0, b = 0;
                    for (int64_t v = 1; v < V; v++) {
                        if (got[i * V + v] > got[i * V + a]) a = v;
                        if (want[i * V + v] > want[i * V + b]) b = v;
                    }
                    agree[by_token] &= a == b;
                }
            }
        }
        printf("  relative L2 error vs double: prefill %.3g, decode %.3g; argmax agrees at every position: %s/%s\n",
               r[0], r[1], agree[0] ? "yes" : "no", agree[1] ? "yes" : "no");
        if (peer) {
            const char *base = strrchr(argv[f], '/') ? strrchr(argv[f], '/') + 1 : argv[f];
            char path[4096];
            snprintf(path, sizeof path, "%s/%s.logits", peer, base);
            FILE *pf = fopen(path, "rb");
            if (pf && fread(got, sizeof(float), (size_t)(n * V), pf) == (size_t)(n * V))
                printf("  peer %s: relative L2 error vs double %.3g\n", path, rel(got, want, n * V));
            else
                printf("  peer %s: not read\n", path);
            if (pf) fclose(pf);
        }
        if (!(r[0] <= 1e-5 && r[1] <= 1e-5)) bad = 1;
        free(want);
        free(got);
        dhsa_model_free(m);
        llmref_model_free(&ref);
    }
    dhsa_ctx_free(ctx);
    return bad;
}
