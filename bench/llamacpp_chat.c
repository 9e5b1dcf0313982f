/* llamacpp_chat.c: llama.cpp's llama_chat_apply_template on a conversation
 * (bench/chat_peer.py compiles and runs it against a llama.cpp build
 * outside the repository).
 *
 * usage: llamacpp_chat TEMPLATE-FILE|@NAME ADD_ASSISTANT ROLE CONTENT...
 * TEMPLATE-FILE holds a tokenizer.chat_template text; @NAME is one of
 * llama.cpp's built-in names (@gemma, @chatml). Prints the text, raw.
 */
#include "llama.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc < 3 || (argc - 3) % 2) {
        fprintf(stderr, "usage: llamacpp_chat TEMPLATE-FILE|@NAME ADD_ASSISTANT ROLE CONTENT...\n");
        return 2;
    }
    char *tmpl = argv[1] + 1;
    if (argv[1][0] != '@') {
        FILE *f = fopen(argv[1], "rb");
        if (!f) return 1;
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        fseek(f, 0, SEEK_SET);
        tmpl = calloc((size_t)n + 1, 1);
        if (!tmpl || fread(tmpl, 1, (size_t)n, f) != (size_t)n) return 1;
        fclose(f);
    }
    int n = (argc - 3) / 2;
    struct llama_chat_message *m = calloc((size_t)n, sizeof *m);
    if (!m) return 1;
    for (int i = 0; i < n; i++) {
        m[i].role = argv[3 + 2 * i];
        m[i].content = argv[4 + 2 * i];
    }
    int cap = 1 << 20;
    char *buf = malloc((size_t)cap);
    int r = buf ? llama_chat_apply_template(tmpl, m, (size_t)n, atoi(argv[2]) != 0, buf, cap) : -1;
    if (r < 0 || r > cap) {
        fprintf(stderr, "llama_chat_apply_template failed (%d)\n", r);
        return 1;
    }
    fwrite(buf, 1, (size_t)r, stdout);
    return 0;
}
