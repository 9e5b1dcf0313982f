/* convert.c: `dhsa convert`, a llama2.c checkpoint and its tokenizer file
 * to a GGUF file (src/model/llama2c.c does the work; docs/llama2c.md says
 * what is written). The written file is opened again with the GGUF reader
 * and summarised, so what is printed is what a later load will see.
 *
 * Exit status: 0 written, 1 a file is bad or cannot be written (the
 * library's sentence on stderr), 2 a usage error.
 * Tested by tests/test_llama2c.c (through DHSA_CLI, set by tests/run.sh).
 */
#include "cli.h"
#include "dhsa.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXIT_RUN DHSA_EXIT_RUN
#define EXIT_USAGE DHSA_EXIT_USAGE

const char dhsa_cli_convert_usage[] =
    "usage: dhsa convert IN.bin --tokenizer TOK.bin -o OUT.gguf\n"
    "\n"
    "Converts a llama2.c checkpoint (the format karpathy/llama2.c's run.c\n"
    "reads) and its tokenizer file into a GGUF file: architecture llama, F32\n"
    "tensors with llama.cpp's names, the hyperparameters from the header\n"
    "(llama.context_length = the checkpoint's seq_len), and the vocabulary as\n"
    "a SentencePiece (\"llama\") tokenizer. Both files are checked completely\n"
    "before anything is written, and a NaN or infinite weight is refused\n"
    "(naming the tensor). OUT.gguf is checked before any work (its folder must\n"
    "take a new file); the GGUF goes to a temporary beside it\n"
    "(OUT.gguf.part.PID.N) renamed over OUT.gguf when complete (a reader of an\n"
    "existing OUT.gguf keeps it; a failure leaves it as it was), then is read\n"
    "back and summarised.\n"
    "\n"
    "  --tokenizer FILE    the llama2.c tokenizer (tok512.bin, tokenizer.bin)\n"
    "  -o, --output FILE   the GGUF file to write (not one of the inputs)\n"
    "  --help              this text\n"
    "\n"
    "Exit status: 0 written, 1 a file is bad or cannot be written, 2 usage.\n";

int dhsa_cli_convert(int argc, char **argv) {
    const char *in = NULL, *tok = NULL, *out = NULL;
    dhsa_cli_set_command("convert", dhsa_cli_convert_usage);
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(dhsa_cli_convert_usage, stdout);
            return 0;
        }
        const char **slot = strcmp(a, "--tokenizer") == 0                           ? &tok
                            : strcmp(a, "-o") == 0 || strcmp(a, "--output") == 0 ? &out
                                                                                    : NULL;
        if (slot) {
            if (i + 1 >= argc) dhsa_cli_die(EXIT_USAGE, "%s needs a value", a);
            if (*slot) dhsa_cli_die(EXIT_USAGE, "%s is given twice", a);
            *slot = argv[++i];
        } else if (strncmp(a, "--tokenizer=", 12) == 0 || strncmp(a, "--output=", 9) == 0) {
            const char **s2 = a[2] == 't' ? &tok : &out;
            if (*s2) dhsa_cli_die(EXIT_USAGE, "\"%s\" repeats an option given before", a);
            *s2 = strchr(a, '=') + 1;
        } else if (a[0] == '-' && a[1]) {
            dhsa_cli_die(EXIT_USAGE, "unknown option \"%s\"", a);
        } else if (in) {
            dhsa_cli_die(EXIT_USAGE, "unexpected argument \"%s\" (one checkpoint at a time)", a);
        } else {
            in = a;
        }
    }
    if (!in) dhsa_cli_die(EXIT_USAGE, "which checkpoint? (dhsa convert IN.bin --tokenizer TOK.bin -o OUT.gguf)");
    if (!tok) dhsa_cli_die(EXIT_USAGE, "--tokenizer is required (the llama2.c tokenizer file, e.g. tok512.bin)");
    if (!out) dhsa_cli_die(EXIT_USAGE, "-o OUT.gguf is required");

    dhsa_cli_check_output("-o", out); /* before the inputs are read */
    dhsa_cli_check_not_input("-o", out, "the checkpoint", in);
    dhsa_cli_check_not_input("-o", out, "--tokenizer", tok);
    dhsa_status st = dhsa_convert_llama2c(in, tok, out);
    if (st) {
        fprintf(stderr, "dhsa convert: %s: %s\n", dhsa_status_str(st), dhsa_last_error());
        return EXIT_RUN;
    }
    dhsa_llama2c_config c;
    dhsa_gguf *g;
    if ((st = dhsa_llama2c_read_config(in, &c)) || (st = dhsa_gguf_open(out, &g))) {
        fprintf(stderr, "dhsa convert: wrote %s, but reading it back failed: %s: %s\n", out, dhsa_status_str(st),
                dhsa_last_error());
        return EXIT_RUN;
    }
    int64_t n_el = 0, bytes = 0;
    for (int64_t i = 0; i < dhsa_gguf_n_tensors(g); i++) {
        n_el += dhsa_gguf_tensor_at(g, i)->n_elements;
        bytes += dhsa_gguf_tensor_at(g, i)->bytes;
    }
    const char *name = "";
    dhsa_gguf_get_str(g, "general.name", &name, NULL);
    printf("wrote %s: GGUF v%u, %llu bytes (from %s, %llu bytes, and %s)\n", out, dhsa_gguf_version(g),
           (unsigned long long)dhsa_gguf_file_size(g), in, (unsigned long long)c.file_size, tok);
    printf("  model      llama \"%s\": dim %d, hidden %d, %d layers, %d heads (%d KV, head size %d), context %d, "
           "%s classifier\n",
           name, c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.head_size, c.seq_len,
           c.shared_classifier ? "shared (tied to token_embd)" : "separate (output.weight)");
    printf("  tensors    %lld F32, %lld values, %lld bytes\n", (long long)dhsa_gguf_n_tensors(g), (long long)n_el,
           (long long)bytes);
    printf("  tokenizer  %d tokens (llama / SentencePiece), bos 1, eos 2, unk 0\n", c.vocab_size);
    dhsa_gguf_close(g);
    return 0;
}
