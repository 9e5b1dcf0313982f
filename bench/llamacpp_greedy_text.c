/* llamacpp_greedy_text.c: llama.cpp's greedy continuation of a text prompt, for the
 * real-model vectors of tests/test_real_models.c (bench/real_models_peer.py
 * compiles and runs it). Not part of the build: compile against a llama.cpp
 * build outside the repository (see bench/real_models_peer.py).
 *
 * usage: llamacpp_greedy_text MODEL.gguf N PROMPT
 * Tokenizes PROMPT as llama.cpp does by default (BOS as the vocabulary
 * says, special tokens parsed), decodes the prompt as one batch, then N
 * greedy steps (argmax, stopping after an end-of-generation token), with
 * the settings of bench/llamacpp_logits.c (CPU, no repacked weights, F32
 * K/V, flash attention off, 2 threads). Prints the prompt ids on line 1,
 * the generated ids on line 2, and, on line 3, each step's margin between
 * the best and second logit.
 */
#include "llama.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void quiet(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    if (level >= GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: llamacpp_greedy_text MODEL.gguf N PROMPT\n");
        return 2;
    }
    int n_gen = atoi(argv[2]);
    const char *prompt = argv[3];
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    mp.use_extra_bufts = false;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) return 1;
    const struct llama_vocab *v = llama_model_get_vocab(model);
    int n_p = -llama_tokenize(v, prompt, (int)strlen(prompt), NULL, 0, true, true);
    llama_token *toks = malloc(sizeof *toks * (size_t)(n_p + n_gen + 1));
    float *gap = malloc(sizeof *gap * (size_t)(n_gen + 1));
    if (!toks || !gap || llama_tokenize(v, prompt, (int)strlen(prompt), toks, n_p, true, true) != n_p) return 1;
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)(n_p + n_gen + 16);
    cp.n_batch = cp.n_ubatch = 512;
    cp.n_threads = cp.n_threads_batch = 2;
    cp.type_k = cp.type_v = GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.swa_full = true;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) return 1;
    int V = llama_vocab_n_tokens(v), n_out = 0;
    struct llama_batch b = llama_batch_get_one(toks, n_p);
    for (int i = 0; i < n_gen; i++) {
        if (llama_decode(ctx, b) != 0) return 1;
        const float *lg = llama_get_logits_ith(ctx, -1);
        int best = 0, second = 1;
        if (lg[second] > lg[best]) best = 1, second = 0;
        for (int t = 2; t < V; t++) {
            if (lg[t] > lg[best]) second = best, best = t;
            else if (lg[t] > lg[second]) second = t;
        }
        gap[n_out] = lg[best] - lg[second];
        toks[n_p + n_out++] = best;
        if (llama_vocab_is_eog(v, best)) break;
        b = llama_batch_get_one(&toks[n_p + n_out - 1], 1);
    }
    for (int i = 0; i < n_p; i++) printf(i ? " %d" : "%d", toks[i]);
    printf("\n");
    for (int i = 0; i < n_out; i++) printf(i ? " %d" : "%d", toks[n_p + i]);
    printf("\n");
    for (int i = 0; i < n_out; i++) printf(i ? " %.4f" : "%.4f", gap[i]);
    printf("\n");
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
