/* llamacpp_logits.c: llama.cpp's logits for a list of token ids, for the
 * peer comparison of docs/model.md ("Checked against llama.cpp"). Not part
 * of the build: bench/llamacpp_arch.sh compiles it against a llama.cpp
 * build outside the repository (LLAMA_CPP=/path/to/llama.cpp with build/).
 *
 * usage: llamacpp_logits MODEL.gguf N_CTX OUT.f32 ID...
 * Runs the ids in batches of 512 at positions 0.. in a context of N_CTX tokens
 * (CPU without repacked weights, F32 K/V cache, flash attention off, a
 * full-size SWA cache) and writes the logits of every
 * position, [n_ids][n_vocab] float32 little endian, to OUT.f32.
 */
#include "llama.h"

#include <stdio.h>
#include <stdlib.h>

static void quiet(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    if (level >= GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: llamacpp_logits MODEL.gguf N_CTX OUT.f32 ID...\n");
        return 2;
    }
    int n = argc - 4;
    llama_token *ids = malloc(sizeof *ids * (size_t)n);
    if (!ids) return 1;
    for (int i = 0; i < n; i++) ids[i] = (llama_token)atoi(argv[4 + i]);
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    /* no weight repacking: this build's AMX path crashes on Q8_0 (and the
     * plain CPU kernels are the ones to compare with) */
    mp.use_extra_bufts = false;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "llamacpp_logits: llama.cpp refuses %s\n", argv[1]);
        return 1;
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)atoi(argv[2]);
    cp.n_batch = 512;
    cp.n_ubatch = 512;
    cp.n_threads = cp.n_threads_batch = 2;
    cp.type_k = cp.type_v = GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.swa_full = true;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "llamacpp_logits: no context\n");
        return 1;
    }
    int V = llama_vocab_n_tokens(llama_model_get_vocab(model));
    FILE *f = fopen(argv[3], "wb");
    if (!f) return 1;
    /* batches of at most n_batch tokens, each one's logits written before the next */
    struct llama_batch b = llama_batch_init(512, 0, 1);
    for (int at = 0; at < n; at += 512) {
        int m = n - at < 512 ? n - at : 512;
        for (int i = 0; i < m; i++) {
            b.token[i] = ids[at + i];
            b.pos[i] = at + i;
            b.n_seq_id[i] = 1;
            b.seq_id[i][0] = 0;
            b.logits[i] = 1;
        }
        b.n_tokens = m;
        if (llama_decode(ctx, b) != 0) {
            fprintf(stderr, "llamacpp_logits: llama_decode failed\n");
            return 1;
        }
        for (int i = 0; i < m; i++) fwrite(llama_get_logits_ith(ctx, i), sizeof(float), (size_t)V, f);
    }
    if (fclose(f) != 0) return 1;
    llama_batch_free(b);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    free(ids);
    return 0;
}
