/* tokenize.c: `dhsa tokenize`, a model's tokenizer from the shell: opens a
 * GGUF file, builds its tokenizer (src/model/tokenizer.c) and prints the
 * ids of a text, one line per token with the token's bytes made visible,
 * or the ids alone.
 *
 * Exit status: 0 ok, 1 the model or the text could not be read or
 * tokenized, 2 a usage error.
 * Tested by tests/test_tokenize_cli.c (make test).
 */
#include "cli.h"
#include "core/internal.h"
#include "dhsa.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXIT_RUN DHSA_EXIT_RUN
#define EXIT_USAGE DHSA_EXIT_USAGE

const char dhsa_cli_tokenize_usage[] =
    "usage: dhsa tokenize -m MODEL [--no-bos] [--special] [--ids-only] TEXT\n"
    "       dhsa tokenize -m MODEL [options] -f FILE\n"
    "\n"
    "Tokenizes TEXT (or the bytes of FILE) with the vocabulary of the GGUF\n"
    "file MODEL (its tokenizer.ggml.* metadata) and prints one line per\n"
    "token: the id, a tab, and the token's bytes, with \\n \\t \\r \\\\, other\n"
    "control bytes, bytes that are not valid UTF-8 and the code points a\n"
    "terminal acts on (C1 controls, bidirectional overrides) written as\n"
    "escapes (\\xhh), so spaces and control characters are visible. A\n"
    "SentencePiece '\\u2581' shows as the space it stands for; special tokens\n"
    "show as their text (<s>).\n"
    "\n"
    "  -m, --model FILE  the GGUF file\n"
    "  -f, --file FILE   read the text from FILE (\"-\" = standard input)\n"
    "  --no-bos          do not add BOS (otherwise the vocabulary's\n"
    "                    add_bos_token decides, as dhsa_tokenizer_default_flags)\n"
    "  --special         turn special-token texts (<s>, <|eot_id|>) in the\n"
    "                    text into their ids (DHSA_TOKENIZE_PARSE_SPECIAL)\n"
    "  --ids-only        print only the ids, on one line, separated by spaces\n"
    "  --                the next argument is TEXT even if it starts with '-'\n"
    "  --help            this text\n"
    "\n"
    "Example: dhsa tokenize -m ../shared/models/stories260K.gguf \"Once upon a time\"\n";

static const char *cmd_name = "dhsa tokenize";

int dhsa_cli_tokenize(int argc, char **argv) {
    dhsa_cli_set_command("tokenize", dhsa_cli_tokenize_usage);
    const char *model = NULL, *file = NULL, *text = NULL;
    int no_bos = 0, special = 0, ids_only = 0, only_text = 0;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (!only_text && (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)) {
            fputs(dhsa_cli_tokenize_usage, stdout);
            return 0;
        }
        int is_model = strcmp(a, "-m") == 0 || strcmp(a, "--model") == 0 || strncmp(a, "--model=", 8) == 0;
        int is_file = strcmp(a, "-f") == 0 || strcmp(a, "--file") == 0 || strncmp(a, "--file=", 7) == 0;
        if (!only_text && (is_model || is_file)) {
            const char **dst = is_model ? &model : &file, *eq = strchr(a, '=');
            if (*dst) dhsa_cli_die(EXIT_USAGE, "%s given twice", is_model ? "-m/--model" : "-f/--file");
            if (eq) {
                *dst = eq + 1;
            } else {
                if (i + 1 >= argc) dhsa_cli_die(EXIT_USAGE, "%s needs a value", a);
                *dst = argv[++i];
            }
        } else if (!only_text && strcmp(a, "--no-bos") == 0) {
            no_bos = 1;
        } else if (!only_text && strcmp(a, "--special") == 0) {
            special = 1;
        } else if (!only_text && strcmp(a, "--ids-only") == 0) {
            ids_only = 1;
        } else if (!only_text && strcmp(a, "--") == 0) {
            only_text = 1;
        } else if (!only_text && a[0] == '-' && a[1]) {
            dhsa_cli_die(EXIT_USAGE, "unknown option \"%s\"", a);
        } else {
            if (text) dhsa_cli_die(EXIT_USAGE, "one TEXT only (quote it): \"%s\" and \"%s\"", text, a);
            text = a;
        }
    }
    if (!model) dhsa_cli_die(EXIT_USAGE, "-m MODEL is required");
    model = dhsa_cli_model_arg(model);
    if (text && file) dhsa_cli_die(EXIT_USAGE, "give TEXT or -f FILE, not both");
    if (!text && !file) dhsa_cli_die(EXIT_USAGE, "nothing to tokenize: give TEXT or -f FILE");

    int64_t len = 0;
    char *owned = NULL;
    if (file) {
        owned = dhsa_cli_slurp("-f", file, DHSA_TOKENIZER_MAX_TEXT, "the most text the tokenizer takes", &len);
        text = owned;
    } else {
        len = (int64_t)strlen(text);
    }

    dhsa_gguf *g = NULL;
    dhsa_tokenizer *t = NULL;
    int32_t *ids = NULL;
    int rc = EXIT_RUN;
    dhsa_status st = dhsa_gguf_open(model, &g);
    if (st) {
        fprintf(stderr, "%s: cannot open %s: %s: %s\n", cmd_name, model, dhsa_status_str(st), dhsa_last_error());
        goto done;
    }
    if ((st = dhsa_tokenizer_from_gguf(g, &t))) {
        fprintf(stderr, "%s: %s has no tokenizer dhsa can use: %s: %s\n", cmd_name, model, dhsa_status_str(st),
                dhsa_last_error());
        goto done;
    }
    unsigned flags = dhsa_tokenizer_default_flags(t);
    if (no_bos) flags &= ~DHSA_TOKENIZE_ADD_BOS;
    if (special) flags |= DHSA_TOKENIZE_PARSE_SPECIAL;
    int64_t n = 0;
    st = dhsa_tokenize(t, text, len, flags, NULL, 0, &n); /* size query */
    if (st == DHSA_OK || (st == DHSA_ERR_INVALID_ARG && n > 0)) {
        ids = malloc(sizeof *ids * (size_t)(n > 0 ? n : 1));
        st = ids ? dhsa_tokenize(t, text, len, flags, ids, n, &n) : DHSA_ERR_OUT_OF_MEMORY;
    }
    if (st) {
        fprintf(stderr, "%s: tokenizing failed: %s: %s\n", cmd_name, dhsa_status_str(st), dhsa_last_error());
        goto done;
    }
    char small[256], *piece = small;
    int64_t piece_cap = sizeof small;
    for (int64_t i = 0; i < n; i++) {
        if (ids_only) {
            printf(i ? " %d" : "%d", (int)ids[i]);
            continue;
        }
        int64_t plen = 0;
        st = dhsa_token_to_piece(t, ids[i], DHSA_DETOKENIZE_SPECIAL, piece, piece_cap, &plen);
        if (st == DHSA_ERR_INVALID_ARG && plen > piece_cap) { /* a long piece: grow once */
            char *p = malloc((size_t)plen);
            if (p) {
                if (piece != small) free(piece);
                piece = p;
                piece_cap = plen;
                st = dhsa_token_to_piece(t, ids[i], DHSA_DETOKENIZE_SPECIAL, piece, piece_cap, &plen);
            }
        }
        if (st) {
            fprintf(stderr, "%s: token %d: %s\n", cmd_name, (int)ids[i], dhsa_last_error());
            if (piece != small) free(piece);
            goto done;
        }
        printf("%d\t", (int)ids[i]);
        dhsa_cli_print_escaped(piece, plen, DHSA__ESC_BACKSLASH);
        putchar('\n');
    }
    if (ids_only) putchar('\n');
    if (piece != small) free(piece);
    rc = fflush(stdout) == 0 ? 0 : EXIT_RUN;
done:
    free(ids);
    dhsa_tokenizer_free(t);
    dhsa_gguf_close(g);
    free(owned);
    return rc;
}
