/* llama_logits.c: llama.cpp's logits on the token ids tools/peer/mix_check.c
 * uses (splitmix64 from seed 12345, BOS = 1 first, 32 positions), written as
 * F32 [32][n_vocab] to OUT, for mix_check --peer-dir (docs/model.md, "Real
 * quantization mixes"). Not part of the build: it links a llama.cpp built
 * elsewhere (static libraries), e.g.
 *
 *   L=/work/peers/llama.cpp
 *   cc -O2 -I$L/include -I$L/ggml/include tools/peer/llama_logits.c $L/build/src/libllama.a \
 *      $L/build/ggml/src/libggml.a $L/build/ggml/src/libggml-cpu.a $L/build/ggml/src/libggml-base.a \
 *      -lstdc++ -lm -lpthread -fopenmp -ldl -o build/llama_logits
 *   build/llama_logits MODEL.gguf OUT.logits
 *
 * llama.cpp runs with an F32 KV cache and flash attention off (its F16
 * paths alone give 1e-3 relative on an F32 model), and without its extra
 * (repacked) weight buffers, whose AMX path crashed on this machine. */
#include "llama.h"
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
static uint64_t rnd(uint64_t *s) { /* splitmix64, as tests/llm_ref.h's llmref_rand_u64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s MODEL.gguf OUT.logits\n", argv[0]);
        return 1;
    }
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.use_extra_bufts = false; /* the AMX repacking path crashed on this VM */
    struct llama_model *m = llama_model_load_from_file(argv[1], mp);
    if (!m) return 1;
    struct llama_context_params cp = llama_context_default_params();
    cp.type_k = GGML_TYPE_F32; cp.type_v = GGML_TYPE_F32; /* as dhsa's F32 cache */
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.n_ctx = 64; cp.n_batch = 64; cp.n_ubatch = 64; cp.n_threads = 2; cp.n_threads_batch = 2;
    struct llama_context *c = llama_init_from_model(m, cp);
    if (!c) return 1;
    int V = llama_vocab_n_tokens(llama_model_get_vocab(m));
    enum { N = 32 };
    struct llama_batch b = llama_batch_init(N, 0, 1);
    uint64_t s = 12345;
    for (int i = 0; i < N; i++) {
        b.token[i] = (llama_token)(rnd(&s) % (uint64_t)V);
        if (i == 0) b.token[i] = 1;
        b.pos[i] = i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0; b.logits[i] = 1;
    }
    b.n_tokens = N;
    if (llama_decode(c, b)) return 1;
    FILE *f = fopen(argv[2], "wb");
    for (int i = 0; i < N; i++) fwrite(llama_get_logits_ith(c, i), sizeof(float), (size_t)V, f);
    fclose(f);
    return 0;
}
