/* arch_compare.c: dhsa's logits and a peer's (llama.cpp's, written by
 * bench/llamacpp_logits.c) against the double-precision reference forward
 * of tests/llm_ref.h, on the same model file and token ids. Not part of
 * the build: bench/llamacpp_arch.sh compiles it against build/libdhsa.a.
 *
 * usage: arch_compare MODEL.gguf N_CTX PEER.f32 ID...
 * dhsa runs its exact route (F32 weight products) with an F32 KV cache.
 * Prints one line: the relative L2 distance (over every position's
 * logits) of dhsa and of the peer to the reference, of dhsa to the peer,
 * and how many positions' argmax agree with the reference's.
 */
#include "dhsa.h"
#include "llm_ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static double rel_f(const float *a, const double *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

static int64_t argmax_f(const float *x, int64_t n) {
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: arch_compare MODEL.gguf N_CTX PEER.f32 ID...\n");
        return 2;
    }
    const int64_t n = argc - 4, n_ctx = atoll(argv[2]);
    int32_t *ids = malloc(sizeof *ids * (size_t)n);
    for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)atoi(argv[4 + i]);
    llmref_model ref;
    if (llmref_model_load_file(argv[1], &ref)) {
        fprintf(stderr, "arch_compare: reference: %s\n", llmref_error());
        return 1;
    }
    llmref_model_set_ctx(&ref, n_ctx);
    const int64_t V = ref.n_vocab;
    double *want = malloc(sizeof *want * (size_t)(n * V));
    float *got = malloc(sizeof *got * (size_t)(n * V)), *peer = malloc(sizeof *peer * (size_t)(n * V));
    if (!want || !got || !peer || llmref_forward(&ref, ids, n, want)) {
        fprintf(stderr, "arch_compare: reference forward: %s\n", llmref_error());
        return 1;
    }
    dhsa_ctx *ctx = NULL;
    dhsa_model *m = NULL;
    dhsa_session *s = NULL;
    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = 2;
    dhsa_session_params sp = dhsa_session_default_params();
    sp.n_ctx = n_ctx;
    sp.logits_all = 1;
    sp.exact = 1; /* F32 weight products: the route held to the reference */
    sp.kv_type = DHSA_F32;
    if (dhsa_ctx_create(&cp, &ctx) || dhsa_model_load(argv[1], NULL, &m) || dhsa_session_create(ctx, m, &sp, &s) ||
        dhsa_session_eval(s, ids, n, got)) {
        fprintf(stderr, "arch_compare: dhsa: %s\n", dhsa_last_error());
        return 1;
    }
    FILE *f = fopen(argv[3], "rb");
    if (!f || fread(peer, sizeof *peer, (size_t)(n * V), f) != (size_t)(n * V)) {
        fprintf(stderr, "arch_compare: %s does not hold %lld x %lld floats\n", argv[3], (long long)n, (long long)V);
        return 1;
    }
    fclose(f);
    double peer_vs_dhsa = 0, den = 0;
    int64_t agree_dhsa = 0, agree_peer = 0;
    for (int64_t t = 0; t < n; t++) {
        int64_t r = llmref_argmax(want + t * V, V);
        agree_dhsa += argmax_f(got + t * V, V) == r;
        agree_peer += argmax_f(peer + t * V, V) == r;
    }
    for (int64_t i = 0; i < n * V; i++) {
        peer_vs_dhsa += ((double)peer[i] - got[i]) * ((double)peer[i] - got[i]);
        den += (double)got[i] * got[i];
    }
    printf("dhsa %.2e  peer %.2e  dhsa-peer %.2e  argmax dhsa %lld/%lld peer %lld/%lld\n", rel_f(got, want, n * V),
           rel_f(peer, want, n * V), sqrt(peer_vs_dhsa / den), (long long)agree_dhsa, (long long)n,
           (long long)agree_peer, (long long)n);
    dhsa_session_free(s);
    dhsa_model_free(m);
    dhsa_ctx_free(ctx);
    llmref_model_free(&ref);
    free(ids);
    free(want);
    free(got);
    free(peer);
    return 0;
}
