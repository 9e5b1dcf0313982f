/* llamacpp_greedy.c: llama.cpp's greedy continuation of a list of token
 * ids, with each step's five best logits, for bench/real_peer.sh (64
 * greedy tokens against dhsa's, and the logit gap where they part). Not
 * part of the build: the script compiles it against a llama.cpp build
 * outside the repository.
 *
 * usage: llamacpp_greedy MODEL.gguf N_GEN ID...
 * Prints one line per generated token: "step id top5" where top5 is
 * id:logit x 5 (CPU, no repacked weights, F32 K/V, flash attention off,
 * a full SWA cache, 2 threads; stops at an end-of-generation token).
 */
#include "llama.h"

#include <stdio.h>
#include <stdlib.h>

static void quiet(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    if (level >= GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: llamacpp_greedy MODEL.gguf N_GEN ID...\n");
        return 2;
    }
    int n = argc - 3, n_gen = atoi(argv[2]);
    llama_token *ids = malloc(sizeof *ids * (size_t)(n + n_gen));
    if (!ids) return 1;
    for (int i = 0; i < n; i++) ids[i] = (llama_token)atoi(argv[3 + i]);
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    mp.use_extra_bufts = false;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) return 1;
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)(n + n_gen + 8);
    cp.n_batch = cp.n_ubatch = 512;
    cp.n_threads = cp.n_threads_batch = 2;
    cp.type_k = cp.type_v = GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.swa_full = true;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) return 1;
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    const int V = llama_vocab_n_tokens(vocab);
    struct llama_batch b = llama_batch_init(512, 0, 1);
    int done = 0, len = n;
    for (int step = 0; step <= n_gen; step++) {
        while (done < len) { /* feed what is not in the cache yet */
            int m = len - done < 512 ? len - done : 512;
            for (int i = 0; i < m; i++) {
                b.token[i] = ids[done + i];
                b.pos[i] = done + i;
                b.n_seq_id[i] = 1;
                b.seq_id[i][0] = 0;
                b.logits[i] = done + i == len - 1;
            }
            b.n_tokens = m;
            if (llama_decode(ctx, b) != 0) return 1;
            done += m;
        }
        if (step == n_gen) break;
        const float *lg = llama_get_logits_ith(ctx, -1);
        int top[5] = {-1, -1, -1, -1, -1};
        for (int v = 0; v < V; v++)
            for (int k = 0; k < 5; k++)
                if (top[k] < 0 || lg[v] > lg[top[k]]) {
                    for (int j = 4; j > k; j--) top[j] = top[j - 1];
                    top[k] = v;
                    break;
                }
        printf("%d %d", step, top[0]);
        for (int k = 0; k < 5; k++) printf(" %d:%.6f", top[k], (double)lg[top[k]]);
        printf("\n");
        ids[len++] = top[0];
        if (llama_vocab_is_eog(vocab, top[0])) break;
    }
    llama_batch_free(b);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    free(ids);
    return 0;
}
