/* inspect.c: `dhsa inspect`, what a model file holds: for a GGUF file its
 * version, alignment and data offset, every metadata key with its type and
 * value (arrays summarised: element type, count, the first elements), every
 * tensor (name, type, dims, elements, bytes, offset) and the totals. A
 * llama2.c checkpoint shows its header; with --tokenizer it is converted in
 * memory (src/model/llama2c.c) and the GGUF it becomes is listed the same
 * way. Every string from the file (keys, values, token pieces, tensor
 * names) goes through the library's escaping (src/core/escape.c) first, so
 * listing a hostile file cannot drive the terminal.
 *
 * Exit status: 0 listed, 1 the file is unreadable or malformed (the
 * library's sentence on stderr), 2 a usage error.
 * Tested by tests/test_llama2c.c and tests/test_model_tensors.c (a key and a
 * tensor name holding ESC) through DHSA_CLI, set by tests/run.sh.
 */
#include "cli.h"
#include "core/internal.h"
#include "dhsa.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXIT_RUN DHSA_EXIT_RUN
#define EXIT_USAGE DHSA_EXIT_USAGE
#define STR_SHOWN 64     /* bytes of a string value shown */
#define ELEM_STR_SHOWN 24 /* bytes of a string array element shown */

const char dhsa_cli_inspect_usage[] =
    "usage: dhsa inspect FILE [--tokenizer TOK.bin] [--elements N]\n"
    "\n"
    "Lists what a model file holds. A GGUF file: format version, size,\n"
    "alignment and data offset; every metadata key in file order with its\n"
    "type and value (strings quoted and escaped, cut after 64 bytes; arrays as\n"
    "[TYPE x count] and their first elements); then every tensor with its ggml\n"
    "type, dims (fastest-varying first, as GGUF stores them), elements, bytes\n"
    "and offset in the data section; then the totals. Keys and tensor names\n"
    "are escaped too: control bytes, invalid UTF-8 and the code points a\n"
    "terminal acts on show as \\xhh (ESC as \\x1b).\n"
    "A llama2.c checkpoint: its header; with --tokenizer the GGUF it converts\n"
    "to (the one `dhsa convert` writes), listed as above.\n"
    "\n"
    "  --tokenizer FILE  the llama2.c tokenizer of a llama2.c checkpoint\n"
    "  --elements N      array elements shown per key (default 8; 0 = all)\n"
    "  --help            this text\n"
    "\n"
    "Exit status: 0 listed, 1 the file is unreadable or malformed, 2 usage.\n";

/* A string, quoted and escaped as above; cut after max bytes (0 = never). */
static void print_str(const char *s, int64_t len, int64_t max) {
    int64_t n = max && len > max ? max : len;
    putchar('"');
    dhsa_cli_print_escaped(s, n, DHSA__ESC_QUOTES);
    putchar('"');
    if (n < len) printf("... (%lld bytes)", (long long)len);
}

/* Whether s[0..n) prints as itself (nothing to escape, backslashes included). */
static int prints_plain(const char *s, int64_t n) {
    char buf[2];
    return dhsa__escape(buf, sizeof buf, s, (size_t)n, DHSA__ESC_BACKSLASH) == (size_t)n;
}

/* The shortest decimal that reads back as the same float / double. */
static void print_real(double v, int is_f32) {
    char buf[64];
    for (int prec = 6; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, v);
        double back = strtod(buf, NULL);
        if (is_f32 ? (float)back == (float)v : back == v) break;
    }
    if (isnan(v)) snprintf(buf, sizeof buf, "nan");
    fputs(buf, stdout);
}

/* Element i of an array of numbers, as the C type the reader decoded. */
static void print_elem(const dhsa_gguf_array *a, int64_t i) {
    const void *d = a->data;
    switch (a->type) {
    case DHSA_GGUF_UINT8: printf("%u", ((const uint8_t *)d)[i]); break;
    case DHSA_GGUF_INT8: printf("%d", ((const int8_t *)d)[i]); break;
    case DHSA_GGUF_UINT16: printf("%u", ((const uint16_t *)d)[i]); break;
    case DHSA_GGUF_INT16: printf("%d", ((const int16_t *)d)[i]); break;
    case DHSA_GGUF_UINT32: printf("%u", ((const uint32_t *)d)[i]); break;
    case DHSA_GGUF_INT32: printf("%d", ((const int32_t *)d)[i]); break;
    case DHSA_GGUF_UINT64: printf("%llu", (unsigned long long)((const uint64_t *)d)[i]); break;
    case DHSA_GGUF_INT64: printf("%lld", (long long)((const int64_t *)d)[i]); break;
    case DHSA_GGUF_FLOAT32: print_real(((const float *)d)[i], 1); break;
    case DHSA_GGUF_FLOAT64: print_real(((const double *)d)[i], 0); break;
    case DHSA_GGUF_BOOL: printf("%s", ((const uint8_t *)d)[i] ? "true" : "false"); break;
    case DHSA_GGUF_STRING: {
        const dhsa_gguf_str *s = &((const dhsa_gguf_str *)d)[i];
        print_str(s->str, s->len, ELEM_STR_SHOWN);
        break;
    }
    default: printf("?"); break;
    }
}

static void print_kv(const dhsa_gguf_kv *kv, int64_t n_shown) {
    switch (kv->type) {
    case DHSA_GGUF_UINT8:
    case DHSA_GGUF_UINT16:
    case DHSA_GGUF_UINT32:
    case DHSA_GGUF_UINT64: printf("%-8s %llu", dhsa_gguf_type_name(kv->type), (unsigned long long)kv->u); break;
    case DHSA_GGUF_INT8:
    case DHSA_GGUF_INT16:
    case DHSA_GGUF_INT32:
    case DHSA_GGUF_INT64: printf("%-8s %lld", dhsa_gguf_type_name(kv->type), (long long)kv->i); break;
    case DHSA_GGUF_FLOAT32:
    case DHSA_GGUF_FLOAT64:
        printf("%-8s ", dhsa_gguf_type_name(kv->type));
        print_real(kv->f, kv->type == DHSA_GGUF_FLOAT32);
        break;
    case DHSA_GGUF_BOOL: printf("%-8s %s", "BOOL", kv->u ? "true" : "false"); break;
    case DHSA_GGUF_STRING:
        printf("%-8s ", "STRING");
        print_str(kv->str.str, kv->str.len, STR_SHOWN);
        break;
    case DHSA_GGUF_ARRAY: {
        const dhsa_gguf_array *a = &kv->arr;
        printf("[%s x %lld]", dhsa_gguf_type_name(a->type), (long long)a->n);
        if (a->type == DHSA_GGUF_ARRAY || !a->data) {
            printf(" (nested arrays are listed, not read)");
            break;
        }
        int64_t n = n_shown && a->n > n_shown ? n_shown : a->n;
        for (int64_t i = 0; i < n; i++) {
            fputs(i ? ", " : " ", stdout);
            print_elem(a, i);
        }
        if (n < a->n) printf(", ... (%lld more)", (long long)(a->n - n));
        break;
    }
    default: printf("type %d", (int)kv->type); break;
    }
    putchar('\n');
}

static void print_gguf(const dhsa_gguf *g, int64_t n_shown) {
    uint64_t data_bytes = dhsa_gguf_file_size(g) - dhsa_gguf_data_offset(g);
    if (dhsa_gguf_data_offset(g) > dhsa_gguf_file_size(g)) data_bytes = 0; /* no tensors */
    printf("  format     GGUF v%u, %llu bytes, alignment %llu, data section at byte %llu (%llu bytes)\n",
           dhsa_gguf_version(g), (unsigned long long)dhsa_gguf_file_size(g),
           (unsigned long long)dhsa_gguf_alignment(g), (unsigned long long)dhsa_gguf_data_offset(g),
           (unsigned long long)data_bytes);

    int64_t n_kv = dhsa_gguf_n_kv(g), width = 8;
    for (int64_t i = 0; i < n_kv; i++) {
        int64_t l = dhsa_gguf_kv_at(g, i)->key_len;
        if (l > width) width = l;
    }
    if (width > 44) width = 44;
    printf("metadata: %lld key%s\n", (long long)n_kv, n_kv == 1 ? "" : "s");
    for (int64_t i = 0; i < n_kv; i++) {
        const dhsa_gguf_kv *kv = dhsa_gguf_kv_at(g, i);
        printf("  ");
        /* Keys may hold any bytes: a key with anything to escape is shown
         * quoted and escaped, like a value. */
        if (kv->key_len <= 200 && prints_plain(kv->key, kv->key_len)) printf("%-*s ", (int)width, kv->key);
        else {
            print_str(kv->key, kv->key_len, STR_SHOWN);
            putchar(' ');
        }
        print_kv(kv, n_shown);
    }

    int64_t n_t = dhsa_gguf_n_tensors(g), nw = 4;
    for (int64_t i = 0; i < n_t; i++) {
        const char *nm = dhsa_gguf_tensor_at(g, i)->name;
        int64_t l = (int64_t)dhsa__escape(NULL, 0, nm, strlen(nm), DHSA__ESC_BACKSLASH);
        if (l > nw) nw = l;
    }
    if (nw > 48) nw = 48;
    printf("tensors: %lld\n", (long long)n_t);
    if (n_t) printf("  %-*s %-5s %-22s %12s %12s %12s\n", (int)nw, "name", "type", "dims", "elements", "bytes", "offset");
    int64_t total_el = 0, total_bytes = 0, n_unknown = 0;
    int64_t count_of[64] = {0}; /* tensors per ggml type id < 64 */
    for (int64_t i = 0; i < n_t; i++) {
        const dhsa_gguf_tensor *t = dhsa_gguf_tensor_at(g, i);
        char dims[96] = "[";
        for (int d = 0; d < t->n_dims; d++) {
            size_t l = strlen(dims);
            snprintf(dims + l, sizeof dims - l, "%s%lld", d ? ", " : "", (long long)t->dims[d]);
        }
        strncat(dims, "]", sizeof dims - strlen(dims) - 1);
        char type[16];
        snprintf(type, sizeof type, "%s", dhsa_ggml_type_name(t->type));
        if (strcmp(type, "?") == 0) snprintf(type, sizeof type, "#%u", t->type);
        /* names may hold any bytes but NUL: escaped, then padded */
        fputs("  ", stdout);
        int64_t w = (int64_t)dhsa_cli_print_escaped(t->name, (int64_t)strlen(t->name), DHSA__ESC_BACKSLASH);
        for (; w < nw; w++) putchar(' ');
        printf(" %-5s %-22s %12lld ", type, dims, (long long)t->n_elements);
        if (t->bytes >= 0) printf("%12lld", (long long)t->bytes);
        else printf("%12s", "?");
        printf(" %12llu\n", (unsigned long long)t->offset);
        total_el += t->n_elements;
        if (t->bytes >= 0) total_bytes += t->bytes;
        else n_unknown++;
        if (t->type < 64) count_of[t->type]++;
    }
    printf("total: %lld tensors, %lld elements, %lld bytes of tensor data", (long long)n_t, (long long)total_el,
           (long long)total_bytes);
    if (n_unknown) printf(" (+ %lld tensors of a type dhsa cannot size)", (long long)n_unknown);
    const char *sep = "; by type: ";
    for (int ty = 0; ty < 64; ty++) {
        if (!count_of[ty]) continue;
        const char *nm = dhsa_ggml_type_name((uint32_t)ty);
        if (strcmp(nm, "?") == 0) printf("%s#%d %lld", sep, ty, (long long)count_of[ty]);
        else printf("%s%s %lld", sep, nm, (long long)count_of[ty]);
        sep = ", ";
    }
    printf("\n");
}

static void print_llama2c_header(const char *path, const dhsa_llama2c_config *c) {
    printf("%s: llama2.c checkpoint, %llu bytes\n", path, (unsigned long long)c->file_size);
    printf("  header     dim %d, hidden_dim %d, n_layers %d, n_heads %d, n_kv_heads %d, vocab_size %d, seq_len %d\n",
           c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads,
           c->shared_classifier ? c->vocab_size : -c->vocab_size, c->seq_len);
    printf("  weights    %lld floats, head size %d, %s classifier (+ %lld floats of the old RoPE tables, unused)\n",
           (long long)c->n_params, c->head_size, c->shared_classifier ? "shared" : "separate",
           (long long)c->seq_len * c->head_size);
}

int dhsa_cli_inspect(int argc, char **argv) {
    dhsa_cli_set_command("inspect", dhsa_cli_inspect_usage);
    const char *file = NULL, *tok = NULL;
    int64_t n_shown = 8;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(dhsa_cli_inspect_usage, stdout);
            return 0;
        }
        const char *val = NULL;
        int is_tok = strcmp(a, "--tokenizer") == 0 || strncmp(a, "--tokenizer=", 12) == 0;
        int is_el = strcmp(a, "--elements") == 0 || strncmp(a, "--elements=", 11) == 0;
        if (is_tok || is_el) {
            const char *eq = strchr(a, '=');
            if (eq) val = eq + 1;
            else if (i + 1 < argc) val = argv[++i];
            else dhsa_cli_die(EXIT_USAGE, "%s needs a value", a);
        }
        if (is_tok) {
            if (tok) dhsa_cli_die(EXIT_USAGE, "%s is given twice", "--tokenizer");
            tok = val;
        } else if (is_el) {
            char msg[256];
            if (dhsa_cli_parse_int("--elements", val, 0, INT64_MAX, 0, &n_shown, msg, sizeof msg))
                dhsa_cli_die(EXIT_USAGE, "%s", msg);
        } else if (a[0] == '-' && a[1]) {
            dhsa_cli_die(EXIT_USAGE, "unknown option \"%s\"", a);
        } else if (file) {
            dhsa_cli_die(EXIT_USAGE, "unexpected argument \"%s\" (one file at a time)", a);
        } else {
            file = a;
        }
    }
    if (!file) dhsa_cli_die(EXIT_USAGE, "%s", "which file? (dhsa inspect FILE)");

    unsigned char magic[4] = {0};
    FILE *f = fopen(file, "rb");
    if (!f) {
        fprintf(stderr, "dhsa inspect: cannot open %s\n", file);
        perror("dhsa inspect");
        return EXIT_RUN;
    }
    size_t got = fread(magic, 1, 4, f);
    fclose(f);
    dhsa_gguf *g = NULL;
    dhsa_status st;
    if (got == 4 && memcmp(magic, "GGUF", 4) == 0) {
        if (tok) fprintf(stderr, "dhsa inspect: note: %s is a GGUF file; --tokenizer is not used\n", file);
        if ((st = dhsa_gguf_open(file, &g))) {
            fprintf(stderr, "dhsa inspect: %s: %s\n", dhsa_status_str(st), dhsa_last_error());
            return EXIT_RUN;
        }
        printf("%s\n", file);
        print_gguf(g, n_shown);
        dhsa_gguf_close(g);
        return 0;
    }
    dhsa_llama2c_config c;
    if ((st = dhsa_llama2c_read_config(file, &c))) {
        fprintf(stderr,
                "dhsa inspect: %s is not a GGUF file (no \"GGUF\" magic), and not a llama2.c checkpoint: %s\n",
                file, dhsa_last_error());
        return EXIT_RUN;
    }
    print_llama2c_header(file, &c);
    if (!tok) {
        printf("(give --tokenizer TOK.bin to list the GGUF it converts to)\n");
        return 0;
    }
    if ((st = dhsa_llama2c_open(file, tok, &g))) {
        fprintf(stderr, "dhsa inspect: %s: %s\n", dhsa_status_str(st), dhsa_last_error());
        return EXIT_RUN;
    }
    printf("converted in memory with %s (the GGUF `dhsa convert` writes):\n", tok);
    print_gguf(g, n_shown);
    dhsa_gguf_close(g);
    return 0;
}
