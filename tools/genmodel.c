/* genmodel.c: `dhsa gen-model`, a GGUF with random weights of any
 * architecture the runner reads (llama, qwen2, qwen3, gemma2, gemma3,
 * phi3: each with the tensors and keys of its real files, docs/model.md)
 * for speed and memory benchmarks of the runner (no trained model of that
 * size ships with the tests). The numbers it produces are timings only:
 * random weights write random text.
 * Presets: smollm-135m (SmolLM-135M's shape: 30 layers, n_embd 576, 9/3
 * heads of 64, n_ff 1536, vocab 49152, tied output), tiny (2 layers, 64).
 * --bias adds the optional bias tensors the runner applies (docs/model.md),
 * as Llama-family models converted with attention or MLP biases have them.
 * Tested by tests/test_model.c (a tiny generated model loads and runs),
 * tests/test_model_arch.c (every --arch loads, and its logits are the
 * reference forward's),
 * tests/test_model_tensors.c (--bias all: every bias reaches the logits,
 * against the reference forward) and tests/test_cli_promises.c (the output
 * path: checked first, replaced atomically under a reader, kept on a
 * failed write).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <unistd.h>

#include "cli.h"
#include "dhsa.h"
#include "matmul/formats.h"

#define EXIT_RUN DHSA_EXIT_RUN
#define EXIT_USAGE DHSA_EXIT_USAGE

const char dhsa_cli_gen_model_usage[] =
    "usage: dhsa gen-model -o OUT.gguf [--preset smollm-135m|tiny] [--type TYPE]\n"
    "                      [--arch llama|qwen2|qwen3|gemma2|gemma3|phi3] [--n-embd N] [--n-layer N]\n"
    "                      [--n-head N] [--n-head-kv N] [--window N] [--rope-scale F] [--longrope]\n"
    "                      [--n-ff N] [--vocab N] [--ctx N] [--seed S] [--bias LIST]\n"
    "\n"
    "Writes a GGUF model of the given shape with random weights (matrices\n"
    "~ N(0, 1/n_in), norms 1), a byte-level SentencePiece vocabulary padded\n"
    "with made-up tokens, for benchmarks (dhsa bench model, dhsa run).\n"
    "Default preset smollm-135m (about 135 M parameters), type Q8_0.\n"
    "TYPE (every matrix and the embedding) is one of " DHSA_QK_TYPE_LIST ";\n"
    "the 256-value blocks (Q2_K ... Q6_K, IQ4_XS) need --n-embd and --n-ff\n"
    "multiples of 256. Quantized by dhsa's fixture rules (docs/quant.md).\n"
    "--bias LIST adds bias tensors (F32, ~ N(0, 0.1^2)), a comma-separated\n"
    "list of: qkv (blk.N.attn_q/k/v.bias; qwen2 always has them), out\n"
    "(attn_output.bias), ffn (ffn_gate/up/down.bias), output (output.bias),\n"
    "all, none (the default).\n"
    "--arch writes each architecture's own tensors and keys: qwen2 q/k/v\n"
    "biases; qwen3 per-head q/k norms; gemma2 post norms, softcaps 50/30,\n"
    "window 4096 on even layers; gemma3 q/k and post norms, window 512 on 5\n"
    "layers in 6, RoPE bases 1e6 (global) and 1e4 (local); phi3 one fused\n"
    "attn_qkv and one ffn_up of 2 n_ff rows.\n"
    "--window N: the sliding window of gemma2/gemma3 (0: none). --rope-scale F:\n"
    "linear RoPE scaling (gemma3: its global layers only). --longrope (phi3):\n"
    "rope_factors_long/short.weight (random, in [1, 4) and [1, 1.5)), attn_factor\n"
    "sqrt(1 + ln(32) / ln(ctx / 32)) and an original context of ctx / 32, as a\n"
    "Phi-3-128k file has them: a session above ctx / 32 uses the long factors.\n"
    "OUT.gguf is checked before any work (its folder must take a new file) and\n"
    "written to a temporary beside it, renamed over OUT.gguf when complete: a\n"
    "run that has the old file open keeps it, a failed write leaves it as it\n"
    "was, and an existing file is replaced (the output says so; docs/files.md).\n";

static uint64_t rng_state;
static uint64_t next_u64(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
/* Approximately normal (sum of 4 uniforms, variance 1). */
static float gauss(void) {
    double s = 0;
    for (int i = 0; i < 4; i++) s += (double)(next_u64() >> 11) * (1.0 / 9007199254740992.0);
    return (float)((s - 2.0) * sqrt(3.0));
}

typedef struct {
    void **bufs;
    int n, cap;
} keep_list;

static void *keep(keep_list *k, size_t bytes) {
    if (k->n == k->cap) {
        k->cap = k->cap ? 2 * k->cap : 64;
        k->bufs = realloc(k->bufs, (size_t)k->cap * sizeof(void *));
        if (!k->bufs) dhsa_cli_die(EXIT_RUN, "out of memory");
    }
    void *p = malloc(bytes ? bytes : 1);
    if (!p) dhsa_cli_die(EXIT_RUN, "out of memory (%zu bytes)", bytes);
    k->bufs[k->n++] = p;
    return p;
}

static void add_matrix(dhsa_gguf_writer *w, keep_list *k, const char *name, uint32_t type, int64_t n_in,
                       int64_t n_out) {
    int64_t rb = dhsa__wt_row_bytes(type, n_in);
    if (rb < 0) dhsa_cli_die(EXIT_USAGE, "%s: %lld values per row do not fit type %s", name, (long long)n_in,
                    dhsa_ggml_type_name(type));
    char *data = keep(k, (size_t)(rb * n_out));
    float *row = malloc((size_t)n_in * sizeof(float));
    if (!row) dhsa_cli_die(EXIT_RUN, "out of memory");
    float sc = (float)(1.0 / sqrt((double)n_in));
    for (int64_t r = 0; r < n_out; r++) {
        for (int64_t i = 0; i < n_in; i++) row[i] = gauss() * sc;
        if (dhsa__quantize_row(type, row, data + r * rb, n_in)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
    }
    free(row);
    int64_t dims[2] = {n_in, n_out};
    if (dhsa_gguf_writer_add_tensor(w, name, type, 2, dims, data, rb * n_out)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
}

static void add_vector(dhsa_gguf_writer *w, keep_list *k, const char *name, int64_t n, float base, float noise) {
    float *v = keep(k, (size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) v[i] = base + noise * gauss();
    int64_t dims[1] = {n};
    if (dhsa_gguf_writer_add_tensor(w, name, DHSA_GGML_F32, 1, dims, v, n * 4)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
}

int dhsa_cli_gen_model(int argc, char **argv) {
    const char *out = NULL, *arch = "llama";
    int64_t E = 576, L = 30, H = 9, Hkv = 3, F = 1536, V = 49152, C = 32768;
    uint64_t seed = 1;
    uint32_t type = DHSA_GGML_Q8_0;
    int b_qkv = 0, b_out = 0, b_ffn = 0, b_output = 0; /* --bias */
    int64_t window = -1;                                /* --window; -1: the architecture's */
    double rope_scale = 0;                              /* --rope-scale; 0: none */
    int longrope = 0;
    dhsa_cli_set_command("gen-model", NULL);
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(dhsa_cli_gen_model_usage, stdout);
            return 0;
        }
        if (strcmp(a, "--longrope") == 0) {
            longrope = 1;
            continue;
        }
        if (i + 1 >= argc) dhsa_cli_die(EXIT_USAGE, "%s needs a value (or is unknown)", a);
        const char *v = argv[++i];
        if (strcmp(a, "-o") == 0) out = v;
        else if (strcmp(a, "--preset") == 0) {
            if (strcmp(v, "smollm-135m") == 0) {
                E = 576; L = 30; H = 9; Hkv = 3; F = 1536; V = 49152; C = 32768;
            } else if (strcmp(v, "tiny") == 0) {
                E = 64; L = 2; H = 4; Hkv = 2; F = 128; V = 512; C = 2048;
            } else dhsa_cli_die(EXIT_USAGE, "unknown preset \"%s\" (smollm-135m, tiny)", v);
        } else if (strcmp(a, "--type") == 0) {
            uint32_t t;
            for (t = 0; t < 64; t++)
                if (dhsa__wt_supported(t) && strcmp(dhsa_ggml_type_name(t), v) == 0) break;
            if (t == 64) dhsa_cli_die(EXIT_USAGE, "--type: \"%s\" is not one of " DHSA_QK_TYPE_LIST, v);
            type = t;
        } else if (strcmp(a, "--arch") == 0) {
            static const char *const arches[] = {"llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3"};
            arch = NULL;
            for (size_t j = 0; j < sizeof arches / sizeof arches[0]; j++)
                if (strcmp(v, arches[j]) == 0) arch = arches[j];
            if (!arch)
                dhsa_cli_die(EXIT_USAGE, "--arch: \"%s\" is not one of llama qwen2 qwen3 gemma2 gemma3 phi3", v);
        } else if (strcmp(a, "--n-embd") == 0) E = dhsa_cli_int(a, v, 1, 1 << 16, 1);
        else if (strcmp(a, "--n-layer") == 0) L = dhsa_cli_int(a, v, 1, 1024, 1);
        else if (strcmp(a, "--n-head") == 0) H = dhsa_cli_int(a, v, 1, 1024, 1);
        else if (strcmp(a, "--n-head-kv") == 0) Hkv = dhsa_cli_int(a, v, 1, 1024, 1);
        else if (strcmp(a, "--n-ff") == 0) F = dhsa_cli_int(a, v, 1, 1 << 18, 1);
        else if (strcmp(a, "--vocab") == 0) V = dhsa_cli_int(a, v, 260, 1 << 20, 1);
        else if (strcmp(a, "--ctx") == 0) C = dhsa_cli_int(a, v, 1, (int64_t)1 << 31, 1);
        else if (strcmp(a, "--seed") == 0) seed = (uint64_t)dhsa_cli_int(a, v, 0, INT64_MAX, 1);
        else if (strcmp(a, "--window") == 0) window = dhsa_cli_int(a, v, 0, (int64_t)1 << 31, 1);
        else if (strcmp(a, "--rope-scale") == 0) rope_scale = dhsa_cli_real(a, v, 1.0, 1e6);
        else if (strcmp(a, "--bias") == 0) {
            b_qkv = b_out = b_ffn = b_output = 0;
            for (const char *p = v; *p;) {
                size_t n = strcspn(p, ",");
                if (n == 3 && strncmp(p, "qkv", 3) == 0) b_qkv = 1;
                else if (n == 3 && strncmp(p, "out", 3) == 0) b_out = 1;
                else if (n == 3 && strncmp(p, "ffn", 3) == 0) b_ffn = 1;
                else if (n == 6 && strncmp(p, "output", 6) == 0) b_output = 1;
                else if (n == 3 && strncmp(p, "all", 3) == 0) b_qkv = b_out = b_ffn = b_output = 1;
                else if (!(n == 4 && strncmp(p, "none", 4) == 0))
                    dhsa_cli_die(EXIT_USAGE, "--bias: \"%.*s\" is not one of qkv, out, ffn, output, all, none", (int)n,
                                 p);
                p += n;
                if (*p == ',') p++;
            }
        }
        else dhsa_cli_die(EXIT_USAGE, "unknown option \"%s\"", a);
    }
    if (!out) dhsa_cli_die(EXIT_USAGE, "-o OUT.gguf is required");
    dhsa_cli_check_output("-o", out); /* before the weights are made */
    if (E % H || H % Hkv) dhsa_cli_die(EXIT_USAGE, "n_embd %% n_head and n_head %% n_head_kv must be 0");
    rng_state = seed;
    const int64_t hd = E / H;
    const int gemma = strcmp(arch, "gemma2") == 0 || strcmp(arch, "gemma3") == 0;
    const int qk_norm = strcmp(arch, "qwen3") == 0 || strcmp(arch, "gemma3") == 0;
    const int phi3 = strcmp(arch, "phi3") == 0;
    if (window >= 0 && !gemma) dhsa_cli_die(EXIT_USAGE, "--window: only gemma2 and gemma3 have sliding layers");
    if (longrope && !phi3) dhsa_cli_die(EXIT_USAGE, "--longrope: only phi3 files carry LongRoPE factors");
    if (longrope && C < 64) dhsa_cli_die(EXIT_USAGE, "--longrope needs --ctx 64 or more (the original is ctx / 32)");
    dhsa_gguf_writer *w;
    if (dhsa_gguf_writer_create(&w)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
    keep_list k = {0};
    char key[128];
#define KEY(s) (snprintf(key, sizeof key, "%s.%s", arch, s), key)
    dhsa_gguf_writer_set_str(w, "general.architecture", arch);
    dhsa_gguf_writer_set_str(w, "general.name", "dhsa random benchmark model");
    dhsa_gguf_writer_set_u32(w, KEY("context_length"), (uint32_t)C);
    dhsa_gguf_writer_set_u32(w, KEY("embedding_length"), (uint32_t)E);
    dhsa_gguf_writer_set_u32(w, KEY("block_count"), (uint32_t)L);
    dhsa_gguf_writer_set_u32(w, KEY("feed_forward_length"), (uint32_t)F);
    dhsa_gguf_writer_set_u32(w, KEY("attention.head_count"), (uint32_t)H);
    dhsa_gguf_writer_set_u32(w, KEY("attention.head_count_kv"), (uint32_t)Hkv);
    dhsa_gguf_writer_set_u32(w, KEY("rope.dimension_count"), (uint32_t)hd);
    dhsa_gguf_writer_set_u32(w, KEY("attention.key_length"), (uint32_t)hd);
    dhsa_gguf_writer_set_u32(w, KEY("attention.value_length"), (uint32_t)hd);
    dhsa_gguf_writer_set_f32(w, KEY("rope.freq_base"), strcmp(arch, "gemma3") == 0 ? 1e6f : 10000.0f);
    dhsa_gguf_writer_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), gemma ? 1e-6f : 1e-5f);
    if (strcmp(arch, "gemma2") == 0) { /* Gemma 2's values */
        dhsa_gguf_writer_set_f32(w, KEY("attn_logit_softcapping"), 50.0f);
        dhsa_gguf_writer_set_f32(w, KEY("final_logit_softcapping"), 30.0f);
        dhsa_gguf_writer_set_u32(w, KEY("attention.sliding_window"), (uint32_t)(window >= 0 ? window : 4096));
    } else if (strcmp(arch, "gemma3") == 0) { /* Gemma 3 1B's */
        dhsa_gguf_writer_set_u32(w, KEY("attention.sliding_window"), (uint32_t)(window >= 0 ? window : 512));
        dhsa_gguf_writer_set_f32(w, KEY("rope.freq_base_swa"), 10000.0f);
    }
    if (rope_scale > 0) {
        dhsa_gguf_writer_set_str(w, KEY("rope.scaling.type"), "linear");
        dhsa_gguf_writer_set_f32(w, KEY("rope.scaling.factor"), (float)rope_scale);
    }
    if (longrope) { /* Phi-3-mini-128k: 131072 over 4096 */
        double scale = 32.0, orig = (double)(C / 32);
        dhsa_gguf_writer_set_u32(w, KEY("rope.scaling.original_context_length"), (uint32_t)(C / 32));
        dhsa_gguf_writer_set_f32(w, KEY("rope.scaling.attn_factor"), (float)sqrt(1.0 + log(scale) / log(orig)));
    }
#undef KEY
    /* vocabulary: <unk> <s> </s>, 256 byte tokens, then made-up pieces */
    char **toks = keep(&k, (size_t)V * sizeof(char *));
    float *scores = keep(&k, (size_t)V * sizeof(float));
    int32_t *types = keep(&k, (size_t)V * sizeof(int32_t));
    for (int64_t i = 0; i < V; i++) {
        toks[i] = keep(&k, 24);
        scores[i] = -(float)i;
        types[i] = 1;
        if (i == 0) strcpy(toks[i], "<unk>"), types[i] = 2;
        else if (i == 1) strcpy(toks[i], "<s>"), types[i] = 3;
        else if (i == 2) strcpy(toks[i], "</s>"), types[i] = 3;
        else if (i < 259) snprintf(toks[i], 24, "<0x%02X>", (unsigned)(i - 3)), types[i] = 6;
        else snprintf(toks[i], 24, "\xe2\x96\x81w%lld", (long long)i);
    }
    dhsa_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    dhsa_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks, V);
    dhsa_gguf_writer_set_arr(w, "tokenizer.ggml.scores", DHSA_GGUF_FLOAT32, scores, V);
    dhsa_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", DHSA_GGUF_INT32, types, V);
    dhsa_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    dhsa_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    dhsa_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    /* tensors */
    add_matrix(w, &k, "token_embd.weight", type, E, V);
    add_vector(w, &k, "output_norm.weight", E, 1.0f, 0.0f);
    if (b_output) add_vector(w, &k, "output.bias", V, 0.0f, 0.1f);
    if (longrope) {
        float *lf = keep(&k, (size_t)(hd / 2) * sizeof(float)), *sf = keep(&k, (size_t)(hd / 2) * sizeof(float));
        for (int64_t i = 0; i < hd / 2; i++) {
            lf[i] = 1.0f + 3.0f * (float)((next_u64() >> 11) * (1.0 / 9007199254740992.0));
            sf[i] = 1.0f + 0.5f * (float)((next_u64() >> 11) * (1.0 / 9007199254740992.0));
        }
        int64_t dims[1] = {hd / 2};
        if (dhsa_gguf_writer_add_tensor(w, "rope_factors_long.weight", DHSA_GGML_F32, 1, dims, lf, hd / 2 * 4) ||
            dhsa_gguf_writer_add_tensor(w, "rope_factors_short.weight", DHSA_GGML_F32, 1, dims, sf, hd / 2 * 4))
            dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
    }
    char name[96];
    for (int64_t l = 0; l < L; l++) {
#define NAME(s) (snprintf(name, sizeof name, "blk.%lld.%s", (long long)l, s), name)
        add_vector(w, &k, NAME("attn_norm.weight"), E, 1.0f, 0.1f);
        if (phi3) {
            add_matrix(w, &k, NAME("attn_qkv.weight"), type, E, (H + 2 * Hkv) * hd);
        } else {
            add_matrix(w, &k, NAME("attn_q.weight"), type, E, H * hd);
            add_matrix(w, &k, NAME("attn_k.weight"), type, E, Hkv * hd);
            add_matrix(w, &k, NAME("attn_v.weight"), type, E, Hkv * hd);
        }
        if (qk_norm) {
            add_vector(w, &k, NAME("attn_q_norm.weight"), hd, 1.0f, 0.1f);
            add_vector(w, &k, NAME("attn_k_norm.weight"), hd, 1.0f, 0.1f);
        }
        if (phi3 && b_qkv) {
            add_vector(w, &k, NAME("attn_qkv.bias"), (H + 2 * Hkv) * hd, 0.0f, 0.1f);
        } else if (b_qkv || strcmp(arch, "qwen2") == 0) {
            add_vector(w, &k, NAME("attn_q.bias"), H * hd, 0.0f, 0.1f);
            add_vector(w, &k, NAME("attn_k.bias"), Hkv * hd, 0.0f, 0.1f);
            add_vector(w, &k, NAME("attn_v.bias"), Hkv * hd, 0.0f, 0.1f);
        }
        add_matrix(w, &k, NAME("attn_output.weight"), type, H * hd, E);
        if (b_out) add_vector(w, &k, NAME("attn_output.bias"), E, 0.0f, 0.1f);
        if (gemma) add_vector(w, &k, NAME("post_attention_norm.weight"), E, 1.0f, 0.1f);
        add_vector(w, &k, NAME("ffn_norm.weight"), E, 1.0f, 0.1f);
        if (phi3) { /* gate rows, then up rows */
            add_matrix(w, &k, NAME("ffn_up.weight"), type, E, 2 * F);
        } else {
            add_matrix(w, &k, NAME("ffn_gate.weight"), type, E, F);
            add_matrix(w, &k, NAME("ffn_up.weight"), type, E, F);
        }
        add_matrix(w, &k, NAME("ffn_down.weight"), type, F, E);
        if (gemma) add_vector(w, &k, NAME("post_ffw_norm.weight"), E, 1.0f, 0.1f);
        if (b_ffn && phi3) {
            add_vector(w, &k, NAME("ffn_up.bias"), 2 * F, 0.0f, 0.1f);
            add_vector(w, &k, NAME("ffn_down.bias"), E, 0.0f, 0.1f);
        } else if (b_ffn) {
            add_vector(w, &k, NAME("ffn_gate.bias"), F, 0.0f, 0.1f);
            add_vector(w, &k, NAME("ffn_up.bias"), F, 0.0f, 0.1f);
            add_vector(w, &k, NAME("ffn_down.bias"), E, 0.0f, 0.1f);
        }
#undef NAME
    }
    /* a temporary renamed over out: a reader of the old file keeps it */
    int replacing = access(out, F_OK) == 0;
    if (dhsa_gguf_writer_write_file(w, out)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
    size_t bytes = 0;
    dhsa_gguf_writer_size(w, &bytes);
    char biases[64] = "";
    if (b_qkv || b_out || b_ffn || b_output)
        snprintf(biases, sizeof biases, ", biases:%s%s%s%s", b_qkv ? " qkv" : "", b_out ? " out" : "",
                 b_ffn ? " ffn" : "", b_output ? " output" : "");
    printf("wrote %s%s: %s, %lld layers, n_embd %lld, heads %lld/%lld, n_ff %lld, vocab %lld, %s%s, %.1f MiB\n", out,
           replacing ? " (replacing the file that was there)" : "", arch, (long long)L, (long long)E, (long long)H,
           (long long)Hkv, (long long)F, (long long)V, dhsa_ggml_type_name(type), biases, (double)bytes / 1048576.0);
    dhsa_gguf_writer_free(w);
    for (int i = 0; i < k.n; i++) free(k.bufs[i]);
    free(k.bufs);
    return 0;
}
