/* llamacpp_tokens.c: llama.cpp's token ids for many texts with one
 * vocabulary load (bench/real_models_peer.py and bench/tokenizer_peer.py's
 * pre-tokenizer sets compile and run it against a llama.cpp build outside
 * the repository).
 *
 * usage: llamacpp_tokens MODEL.gguf [--no-parse-special] < HEX(text) lines
 * One line of ids per input line (llama_tokenize with add_special: BOS/EOS
 * as the vocabulary says; special tokens parsed unless told), "ERR n" when
 * llama.cpp fails. Loads the vocabulary only.
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
    if (argc < 2) {
        fprintf(stderr, "usage: llamacpp_tokens MODEL.gguf [--no-parse-special] < hex lines\n");
        return 2;
    }
    int parse = !(argc > 2 && strcmp(argv[2], "--no-parse-special") == 0);
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    struct llama_model *m = llama_model_load_from_file(argv[1], mp);
    if (!m) return 1;
    const struct llama_vocab *v = llama_model_get_vocab(m);
    static char line[1 << 20], text[1 << 19];
    static llama_token ids[1 << 18];
    while (fgets(line, sizeof line, stdin)) {
        int n = 0;
        for (char *p = line; p[0] && p[1] && p[0] != '\n' && n < (int)sizeof text; p += 2) {
            unsigned x;
            if (sscanf(p, "%2x", &x) != 1) break;
            text[n++] = (char)x;
        }
        int k = llama_tokenize(v, text, n, ids, 1 << 18, true, parse);
        if (k < 0) {
            printf("ERR %d\n", k);
            continue;
        }
        for (int i = 0; i < k; i++) printf(i ? " %d" : "%d", ids[i]);
        printf("\n");
        fflush(stdout);
    }
    llama_model_free(m);
    llama_backend_free();
    return 0;
}
