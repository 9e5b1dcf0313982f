/* cli_model.c: how the CLI names a model file's weights (dhsa run --verbose,
 * dhsa plan): the file type the converter wrote (GGUF general.file_type,
 * named as llama.cpp names its llama_ftype values, e.g. 15 "Q4_K - Medium")
 * and the mix of tensor types by matrix bytes. A "Q4_K_M" file is a mix:
 * on Qwen2.5 0.5B most matrix bytes are Q5_0 (rows of 896 do not fill a
 * 256-wide K block) and the embeddings Q8_0, so the type of most bytes
 * alone ("Q5_0 weights") misnames it. Tested by tests/test_cli_small.c.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"

/* llama.cpp's names for general.file_type (llama_ftype). Gaps are values
 * llama.cpp removed; they and anything newer print as "file type N". */
static const char *file_type_name(uint32_t ft) {
    switch (ft) {
    case 0: return "all F32";
    case 1: return "F16";
    case 2: return "Q4_0";
    case 3: return "Q4_1";
    case 7: return "Q8_0";
    case 8: return "Q5_0";
    case 9: return "Q5_1";
    case 10: return "Q2_K - Medium";
    case 11: return "Q3_K - Small";
    case 12: return "Q3_K - Medium";
    case 13: return "Q3_K - Large";
    case 14: return "Q4_K - Small";
    case 15: return "Q4_K - Medium";
    case 16: return "Q5_K - Small";
    case 17: return "Q5_K - Medium";
    case 18: return "Q6_K";
    case 19: return "IQ2_XXS - 2.0625 bpw";
    case 20: return "IQ2_XS - 2.3125 bpw";
    case 21: return "Q2_K - Small";
    case 22: return "IQ3_XS - 3.3 bpw";
    case 23: return "IQ3_XXS - 3.0625 bpw";
    case 24: return "IQ1_S - 1.5625 bpw";
    case 25: return "IQ4_NL - 4.5 bpw";
    case 26: return "IQ3_S - 3.4375 bpw";
    case 27: return "IQ3_S mix - 3.66 bpw";
    case 28: return "IQ2_S - 2.5 bpw";
    case 29: return "IQ2_M - 2.7 bpw";
    case 30: return "IQ4_XS - 4.25 bpw";
    case 31: return "IQ1_M - 1.75 bpw";
    case 32: return "BF16";
    default: return NULL;
    }
}

void dhsa_cli_weights_text(const dhsa_gguf *g, uint32_t most_type, char *out, size_t cap) {
    size_t n = 0;
    out[0] = '\0';
#define PUT(...)                                                                      \
    do {                                                                              \
        int k_ = snprintf(out + n, n < cap ? cap - n : 0, __VA_ARGS__);               \
        if (k_ > 0) n = n + (size_t)k_ < cap ? n + (size_t)k_ : cap - 1;              \
    } while (0)
    uint32_t ft;
    if (g && dhsa_gguf_get_u32(g, "general.file_type", &ft) == DHSA_OK) {
        const char *name = file_type_name(ft);
        if (name) PUT("%s", name);
        else PUT("file type %u", ft);
    } else {
        PUT("%s", dhsa_ggml_type_name(most_type));
    }
    PUT(" weights");
    const size_t named = n; /* out[0, named) says the file type */
    if (!g) return;
    /* the mix: matrix bytes per type, largest first */
    int64_t by_type[64] = {0}, total = 0;
    for (int64_t i = 0; i < dhsa_gguf_n_tensors(g); i++) {
        const dhsa_gguf_tensor *t = dhsa_gguf_tensor_at(g, i);
        if (t->n_dims != 2 || t->type >= 64 || t->bytes <= 0) continue;
        by_type[t->type] += t->bytes;
        total += t->bytes;
    }
    int kinds = 0;
    for (int t = 0; t < 64; t++) kinds += by_type[t] > 0;
    if (total == 0) return;
    if (kinds == 1) { /* one type: the mix adds nothing when the name already says it */
        int only = 0;
        while (by_type[only] == 0) only++;
        const char *tn = dhsa_ggml_type_name((uint32_t)only);
        char said[128];
        snprintf(said, sizeof said, "%.*s", (int)named, out);
        if (strstr(said, tn)) return;
    }
    PUT(" (matrix bytes:");
    for (int shown = 0; shown < kinds; shown++) {
        int best = -1;
        for (int t = 0; t < 64; t++)
            if (by_type[t] > 0 && (best < 0 || by_type[t] > by_type[best])) best = t;
        PUT("%s %s %.0f%%", shown ? "," : "", dhsa_ggml_type_name((uint32_t)best),
            100.0 * (double)by_type[best] / (double)total);
        by_type[best] = 0;
    }
    PUT(")");
#undef PUT
}
