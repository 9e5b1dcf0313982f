/* test_llm_ref.c: validates the test reference itself (tests/llm_ref.h), so
 * that the model runner can be tested against it.
 *
 *   (a) the real model ../shared/models/stories260K.gguf: greedy decoding
 *       from BOS + "Once upon a time" continues ", there was a little girl
 *       named Lily" (text through the library's public tokenizer); the same
 *       with NeoX pairs (wrong for a llama) does not; the llama2.c
 *       checkpoint of the same weights gives the same logits;
 *   (b) dequantization of hand-built blocks of every type against values
 *       worked out by hand (f16 and bf16 too), and the fixture encoder's
 *       round trip;
 *   (c) fixtures for each architecture x each weight type: they open, hold
 *       the keys and tensors the spec says, load, give finite O(1) logits
 *       close to the F32 fixture's, tokenize; defaults, key types, rope
 *       scaling rules and the loader's refusals;
 *   (d) invariants of the forward: causality, rows/positions options,
 *       shift invariance of RoPE, gemma2 window >= n equals no window,
 *       NeoX == normal pairs with permuted Q/K rows, GQA == duplicated KV
 *       heads, linear factor == rope_freqs, and a one-layer model checked
 *       by hand (llama and gemma2); the comparison helper fails when it
 *       should.
 *
 * ../shared is absent in a fresh clone: part (a) is then skipped, loudly.
 * Run: make build/tests/test_llm_ref && build/tests/test_llm_ref
 */
#include "dhsa.h"
#include "llm_ref.h"
#include "t.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MODEL "../shared/models/stories260K.gguf"
#define MODEL_BIN "../shared/models/stories260K.bin"

static const char *const archs[3] = {"llama", "qwen2", "gemma2"};
#define N_TYPES 15
static const uint32_t types[N_TYPES] = {LLMREF_F32,  LLMREF_F16,  LLMREF_BF16,   LLMREF_Q8_0, LLMREF_Q4_0,
                                        LLMREF_Q4_K, LLMREF_Q6_K, LLMREF_Q4_1,   LLMREF_Q5_0, LLMREF_Q5_1,
                                        LLMREF_Q2_K, LLMREF_Q3_K, LLMREF_IQ4_NL, LLMREF_Q5_K, LLMREF_IQ4_XS};

/* --------------------------------------------------------------------- */
/* Helpers                                                                */

/* Builds and loads the fixture of s; 0 on success (failures are counted). */
static int fx_load(const llmref_spec *s, llmref_model *m) {
    uint8_t *b;
    size_t n;
    memset(m, 0, sizeof *m);
    int rc = llmref_fixture_build(s, &b, &n);
    T_CHECK(rc == 0, "fixture %s/%s: %s", s->arch, llmref_type_name(s->wtype), llmref_error());
    if (rc) return -1;
    rc = llmref_model_load_memory(b, n, m);
    T_CHECK(rc == 0, "load fixture %s/%s: %s", s->arch, llmref_type_name(s->wtype), llmref_error());
    free(b);
    return rc;
}

/* logits [n][n_vocab] of ids (malloc'd), or NULL (counted as a failure). */
static double *run(const llmref_model *m, const int32_t *ids, int64_t n, const llmref_opts *o) {
    int64_t rows = n - (o ? o->row0 : 0);
    double *lg = malloc((size_t)(rows * m->n_vocab) * sizeof *lg);
    int rc = lg ? llmref_forward_ex(m, ids, n, o, lg) : -1;
    T_CHECK(rc == 0, "forward: %s", llmref_error());
    if (rc) {
        free(lg);
        return NULL;
    }
    return lg;
}

static double max_abs_diff(const double *a, const double *b, int64_t n) {
    double d = 0;
    for (int64_t i = 0; i < n; i++) d = fmax(d, fabs(a[i] - b[i]));
    return d;
}

static const int32_t seq12[12] = {1, 270, 17, 300, 5, 262, 263, 99, 310, 2, 271, 260};

/* --------------------------------------------------------------------- */
/* (b) Dequantization                                                     */

static void test_scalars(void) {
    static const struct {
        uint16_t h;
        double v;
    } f16[] = {{0x0000, 0.0},     {0x3c00, 1.0},        {0xc000, -2.0},    {0x3800, 0.5},
               {0x7bff, 65504.0}, {0x0001, 0x1p-24},    {0x03ff, 1023 * 0x1p-24}, {0x0400, 0x1p-14},
               {0x3555, 0x1.554p-2}, {0xfbff, -65504.0}, {0x4248, 3.140625}};
    for (size_t i = 0; i < sizeof f16 / sizeof f16[0]; i++)
        T_CHECK(llmref_f16_to_double(f16[i].h) == f16[i].v, "f16 0x%04x: got %.17g want %.17g", f16[i].h,
                llmref_f16_to_double(f16[i].h), f16[i].v);
    T_CHECK(isinf(llmref_f16_to_double(0x7c00)) && llmref_f16_to_double(0xfc00) < 0, "f16 infinities");
    T_CHECK(isnan(llmref_f16_to_double(0x7e00)), "f16 NaN");
    T_CHECK(signbit(llmref_f16_to_double(0x8000)) && llmref_f16_to_double(0x8000) == 0, "f16 -0");
    /* the encoder inverts the decoder on every finite half, and rounds to
     * nearest even between two halves */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        if (((h >> 10) & 31) == 31) continue;
        if (llmref_double_to_f16(llmref_f16_to_double((uint16_t)h)) != h) bad++;
    }
    T_CHECK(bad == 0, "f16 encode(decode(h)) != h for %d halves", bad);
    T_CHECK(llmref_double_to_f16(1.0 + 0x1p-11) == 0x3c00, "1 + half an ulp rounds to even (1.0)");
    T_CHECK(llmref_double_to_f16(1.0 + 3 * 0x1p-11) == 0x3c02, "1 + 1.5 ulp rounds to even (1 + 2 ulp)");
    T_CHECK(llmref_double_to_f16(65520.0) == 0x7c00 && llmref_double_to_f16(65519.0) == 0x7bff, "f16 overflow edge");

    static const struct {
        uint16_t h;
        double v;
    } bf[] = {{0x3f80, 1.0}, {0xc049, -3.140625}, {0x0000, 0.0}, {0x4780, 65536.0}, {0x3e80, 0.25}};
    for (size_t i = 0; i < sizeof bf / sizeof bf[0]; i++)
        T_CHECK(llmref_bf16_to_double(bf[i].h) == bf[i].v, "bf16 0x%04x: got %.17g want %.17g", bf[i].h,
                llmref_bf16_to_double(bf[i].h), bf[i].v);
    T_CHECK(llmref_double_to_bf16(3.14159265) == 0x4049, "bf16 of pi");
}

static void test_dequant_blocks(void) {
    double out[512];

    /* F32: little-endian bytes of 1.5f and -2.25f */
    const uint8_t f32[8] = {0x00, 0x00, 0xc0, 0x3f, 0x00, 0x00, 0x10, 0xc0};
    T_CHECK(llmref_dequant(LLMREF_F32, f32, 2, out) == 0 && out[0] == 1.5 && out[1] == -2.25, "F32: %g %g", out[0],
            out[1]);
    const uint8_t f16[4] = {0x00, 0x3c, 0x00, 0xc0}; /* 1, -2 */
    T_CHECK(llmref_dequant(LLMREF_F16, f16, 2, out) == 0 && out[0] == 1 && out[1] == -2, "F16");
    const uint8_t bf16[4] = {0x80, 0x3f, 0x49, 0xc0}; /* 1, -3.140625 */
    T_CHECK(llmref_dequant(LLMREF_BF16, bf16, 2, out) == 0 && out[0] == 1 && out[1] == -3.140625, "BF16");

    /* Q8_0: d = 0.5 (0x3800), q_j = 8 j - 128 */
    uint8_t q8[34] = {0x00, 0x38};
    for (int j = 0; j < 32; j++) q8[2 + j] = (uint8_t)(int8_t)(8 * j - 128);
    int bad = llmref_dequant(LLMREF_Q8_0, q8, 32, out) != 0;
    for (int j = 0; j < 32; j++) bad += out[j] != 0.5 * (8 * j - 128);
    T_CHECK(bad == 0, "Q8_0: %d values wrong", bad);

    /* Q4_0: d = -2 (0xc000), byte j = j | (15 - j) << 4: x[j] = -2 (j - 8),
     * x[j + 16] = -2 (7 - j) */
    uint8_t q4[18] = {0x00, 0xc0};
    for (int j = 0; j < 16; j++) q4[2 + j] = (uint8_t)(j | ((15 - j) << 4));
    bad = llmref_dequant(LLMREF_Q4_0, q4, 32, out) != 0;
    for (int j = 0; j < 16; j++) bad += out[j] != -2.0 * (j - 8) || out[j + 16] != -2.0 * (7 - j);
    T_CHECK(bad == 0, "Q4_0: %d values wrong", bad);

    /* Q4_K: d = 0.5, dmin = 0.25; scales and mins of the 8 sub-blocks below,
     * packed by hand into the 12 bytes (bytes 0-3: sc[0..3] | top 2 bits of
     * sc[4..7] << 6; bytes 4-7 the same for the mins; bytes 8-11: low 4 bits
     * of sc[4..7] | low 4 bits of mn[4..7] << 4). qs byte 32 c + l holds
     * sub-block 2c in its low nibble (here l & 15) and 2c + 1 in its high
     * nibble (here (7 l + c) & 15). */
    const int sc[8] = {1, 2, 63, 17, 33, 48, 5, 62}, mn[8] = {0, 3, 63, 9, 40, 17, 60, 1};
    const uint8_t packed[12] = {0x81, 0xc2, 0x3f, 0xd1, 0x80, 0x43, 0xff, 0x09, 0x81, 0x10, 0xc5, 0x1e};
    uint8_t q4k[144] = {0x00, 0x38, 0x00, 0x34};
    memcpy(q4k + 4, packed, 12);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) q4k[16 + 32 * c + l] = (uint8_t)((l & 15) | (((7 * l + c) & 15) << 4));
    bad = llmref_dequant(LLMREF_Q4_K, q4k, 256, out) != 0;
    for (int j = 0; j < 8; j++)
        for (int l = 0; l < 32; l++) {
            int q = j % 2 == 0 ? (l & 15) : ((7 * l + j / 2) & 15);
            double want = 0.5 * sc[j] * q - 0.25 * mn[j];
            if (out[32 * j + l] != want) {
                if (bad < 3)
                    fprintf(stderr, "Q4_K sub-block %d value %d: got %g want %g\n", j, l, out[32 * j + l], want);
                bad++;
            }
        }
    T_CHECK(bad == 0, "Q4_K: %d values wrong", bad);
    /* the fixture encoder packs the same bytes for these scales: encode the
     * values just decoded and compare the scale bytes */
    uint8_t re[144];
    T_CHECK(llmref_quantize(LLMREF_Q4_K, out, 256, re) == 0, "Q4_K encode");
    double back[256];
    llmref_dequant(LLMREF_Q4_K, re, 256, back);
    T_CHECK(max_abs_diff(back, out, 256) < 0.5 * 0.5 * 63, "Q4_K re-encode stays within a step");

    /* Q6_K, literal bits: d = 1, every scale 1, ql[0] = 0xa5, qh[0] =
     * 0b00100111: value 0 = (5 | 3 << 4) - 32 = 21, value 32 = (0 | 1 << 4)
     * - 32 = -16, value 64 = (10 | 2 << 4) - 32 = 10, value 96 = -32; every
     * other code is 0 -> -32. */
    uint8_t q6[210];
    memset(q6, 0, sizeof q6);
    for (int j = 0; j < 16; j++) q6[192 + j] = 1;
    q6[208] = 0x00;
    q6[209] = 0x3c;
    q6[0] = 0xa5;
    q6[128] = 0x27;
    bad = llmref_dequant(LLMREF_Q6_K, q6, 256, out) != 0;
    for (int v = 0; v < 256; v++) {
        double want = v == 0 ? 21 : v == 32 ? -16 : v == 64 ? 10 : -32;
        bad += out[v] != want;
    }
    T_CHECK(bad == 0, "Q6_K literal block: %d values wrong (x0 %g x32 %g x64 %g)", bad, out[0], out[32], out[64]);

    /* Q6_K pattern: codes (37 v + 11) mod 64, signed scales, d = 0.25,
     * packed the way ggml's quantizer writes them: per half h and l < 32,
     * ql[64h + l] = c[l] & 15 | (c[l + 64] & 15) << 4, ql[64h + l + 32] =
     * c[l + 32] & 15 | (c[l + 96] & 15) << 4, qh[32h + l] = the top 2 bits
     * of c[l], c[l + 32], c[l + 64], c[l + 96] at shifts 0, 2, 4, 6. */
    const int8_t s6[16] = {1, -1, 2, -3, 5, -8, 13, -21, 34, -55, 89, -128, 127, 7, -7, 0};
    int code[256];
    for (int v = 0; v < 256; v++) code[v] = (37 * v + 11) % 64;
    memset(q6, 0, sizeof q6);
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const int *c = code + 128 * h;
            q6[64 * h + l] = (uint8_t)((c[l] & 15) | ((c[l + 64] & 15) << 4));
            q6[64 * h + l + 32] = (uint8_t)((c[l + 32] & 15) | ((c[l + 96] & 15) << 4));
            q6[128 + 32 * h + l] =
                (uint8_t)((c[l] >> 4) | ((c[l + 32] >> 4) << 2) | ((c[l + 64] >> 4) << 4) | ((c[l + 96] >> 4) << 6));
        }
    memcpy(q6 + 192, s6, 16);
    q6[208] = 0x00;
    q6[209] = 0x34; /* 0.25 */
    bad = llmref_dequant(LLMREF_Q6_K, q6, 256, out) != 0;
    for (int v = 0; v < 256; v++) bad += out[v] != 0.25 * s6[v / 16] * (code[v] - 32);
    T_CHECK(bad == 0, "Q6_K pattern: %d values wrong", bad);

    /* refusals */
    T_CHECK(llmref_dequant(LLMREF_Q4_K, q4k, 100, out) != 0, "Q4_K of 100 values is refused");
    T_CHECK(llmref_dequant(16 /* IQ2_XXS */, q4, 32, out) != 0, "unknown type 16 is refused");
    T_CHECK(llmref_type_bytes(LLMREF_Q6_K, 512) == 420 && llmref_type_bytes(LLMREF_Q4_0, 64) == 36 &&
                llmref_type_bytes(LLMREF_Q8_0, 32) == 34 && llmref_type_bytes(LLMREF_Q4_K, 256) == 144,
            "block sizes");
}

/* The encoder round trip on N(0, 1) data: error small for each type (so
 * fixtures carry the random weights they were drawn from). */
static void test_quant_roundtrip(void) {
    enum { N = 1024 };
    static double x[N], y[N];
    static uint8_t buf[N * 4];
    uint64_t st = 42;
    for (int i = 0; i < N; i++) x[i] = llmref_rand_normal(&st);
    const double max_nmse[N_TYPES] = {1e-14, 1e-6, 1e-4, 1e-4, 2e-2, 2e-2, 2e-3, 2e-2,
                                      5e-3,  5e-3, 0.2,  8e-2, 3e-2, 5e-3, 3e-2};
    for (int t = 0; t < N_TYPES; t++) {
        int rc = llmref_quantize(types[t], x, N, buf) || llmref_dequant(types[t], buf, N, y);
        double se = 0, sx = 0;
        for (int i = 0; i < N; i++) {
            se += (x[i] - y[i]) * (x[i] - y[i]);
            sx += x[i] * x[i];
        }
        T_CHECK(rc == 0 && se / sx <= max_nmse[t], "%s round trip: NMSE %.3g (max %.3g)", llmref_type_name(types[t]),
                se / sx, max_nmse[t]);
        if (getenv("LLMREF_VERBOSE")) printf("  %s round trip NMSE %.3g\n", llmref_type_name(types[t]), se / sx);
    }
}

/* --------------------------------------------------------------------- */
/* (c) Fixtures                                                           */

static void check_key_int(const dhsa_gguf *g, const char *key, int64_t want) {
    int64_t v = -1;
    T_CHECK(llmref__kv_int(g, key, -1, 1, &v) == 0 && v == want, "%s: got %lld want %lld", key, (long long)v,
            (long long)want);
}

static void check_tensor(const dhsa_gguf *g, const char *name, uint32_t type, int64_t d0, int64_t d1, int *count) {
    int64_t i = dhsa_gguf_find_tensor(g, name);
    const dhsa_gguf_tensor *t = i >= 0 ? dhsa_gguf_tensor_at(g, i) : NULL;
    T_CHECK(t && t->type == type && t->dims[0] == d0 && t->dims[1] == (d1 ? d1 : 1) && t->n_dims == (d1 ? 2 : 1),
            "%s: want %s [%lld, %lld], got %s", name, llmref_type_name(type), (long long)d0, (long long)d1,
            t ? llmref_type_name(t->type) : "absent");
    (*count)++;
}

/* Every key and tensor of the spec, as written. */
static void check_fixture_contents(const dhsa_gguf *g, const llmref_spec *s) {
    char key[128];
    const char *a = NULL;
    T_CHECK(dhsa_gguf_get_str(g, "general.architecture", &a, NULL) == DHSA_OK && strcmp(a, s->arch) == 0,
            "general.architecture");
#define K(suffix) (snprintf(key, sizeof key, "%s.%s", s->arch, suffix), key)
    check_key_int(g, K("context_length"), s->n_ctx_train);
    check_key_int(g, K("embedding_length"), s->n_embd);
    check_key_int(g, K("block_count"), s->n_layer);
    check_key_int(g, K("feed_forward_length"), s->n_ff);
    check_key_int(g, K("attention.head_count"), s->n_head);
    check_key_int(g, K("attention.head_count_kv"), s->n_head_kv);
    check_key_int(g, K("attention.key_length"), s->head_dim);
    check_key_int(g, K("rope.dimension_count"), s->n_rot);
    float f = 0;
    T_CHECK(dhsa_gguf_get_f32(g, K("rope.freq_base"), &f) == DHSA_OK && f == (float)s->rope_base, "%s", key);
    T_CHECK(dhsa_gguf_get_f32(g, K("attention.layer_norm_rms_epsilon"), &f) == DHSA_OK && f == (float)s->rms_eps,
            "%s", key);
    if (strcmp(s->arch, "gemma2") == 0) {
        T_CHECK(dhsa_gguf_get_f32(g, K("attn_logit_softcapping"), &f) == DHSA_OK && f == (float)s->attn_softcap, "%s",
                key);
        T_CHECK(dhsa_gguf_get_f32(g, K("final_logit_softcapping"), &f) == DHSA_OK && f == (float)s->final_softcap,
                "%s", key);
        check_key_int(g, K("attention.sliding_window"), s->sliding_window);
    }
#undef K
    dhsa_gguf_array arr;
    T_CHECK(dhsa_gguf_get_arr(g, "tokenizer.ggml.tokens", &arr) == DHSA_OK && arr.n == s->n_vocab,
            "tokenizer.ggml.tokens has n_vocab entries");
    int n = 0, gemma = strcmp(s->arch, "gemma2") == 0;
    int64_t E = s->n_embd, hd = s->head_dim, kv = s->n_head_kv;
    check_tensor(g, "token_embd.weight", s->embd_type, E, s->n_vocab, &n);
    check_tensor(g, "output_norm.weight", s->norm_type, E, 0, &n);
    if (!s->tied) check_tensor(g, "output.weight", s->output_type, E, s->n_vocab, &n);
    char name[96];
    for (int64_t l = 0; l < s->n_layer; l++) {
#define N(suffix) (snprintf(name, sizeof name, "blk.%lld.%s", (long long)l, suffix), name)
        check_tensor(g, N("attn_norm.weight"), s->norm_type, E, 0, &n);
        check_tensor(g, N("attn_q.weight"), s->wtype, E, s->n_head * hd, &n);
        check_tensor(g, N("attn_k.weight"), s->wtype, E, kv * hd, &n);
        check_tensor(g, N("attn_v.weight"), s->wtype, E, kv * hd, &n);
        if (s->biases) {
            check_tensor(g, N("attn_q.bias"), s->norm_type, s->n_head * hd, 0, &n);
            check_tensor(g, N("attn_k.bias"), s->norm_type, kv * hd, 0, &n);
            check_tensor(g, N("attn_v.bias"), s->norm_type, kv * hd, 0, &n);
        }
        check_tensor(g, N("attn_output.weight"), s->wtype, s->n_head * hd, E, &n);
        check_tensor(g, N("ffn_norm.weight"), s->norm_type, E, 0, &n);
        check_tensor(g, N("ffn_gate.weight"), s->wtype, E, s->n_ff, &n);
        check_tensor(g, N("ffn_up.weight"), s->wtype, E, s->n_ff, &n);
        check_tensor(g, N("ffn_down.weight"), s->wtype, s->n_ff, E, &n);
        if (gemma) {
            check_tensor(g, N("post_attention_norm.weight"), s->norm_type, E, 0, &n);
            check_tensor(g, N("post_ffw_norm.weight"), s->norm_type, E, 0, &n);
        }
#undef N
    }
    T_CHECK(dhsa_gguf_n_tensors(g) == n, "%s: %lld tensors, expected %d", s->arch, (long long)dhsa_gguf_n_tensors(g), n);
}

static void test_fixtures(void) {
    const int32_t ids[6] = {1, 270, 17, 300, 5, 262};
    for (int ai = 0; ai < 3; ai++) {
        double *base_small = NULL, *base_k = NULL; /* F32 logits at both sizes */
        for (int ti = 0; ti < N_TYPES; ti++) {
            llmref_spec s = llmref_spec_default(archs[ai], types[ti]);
            uint8_t *b;
            size_t n;
            if (llmref_fixture_build(&s, &b, &n)) {
                T_CHECK(0, "fixture %s/%s: %s", archs[ai], llmref_type_name(types[ti]), llmref_error());
                continue;
            }
            dhsa_gguf *g = NULL;
            T_CHECK(dhsa_gguf_open_memory(b, n, &g) == DHSA_OK, "open fixture: %s", dhsa_last_error());
            if (!g) {
                free(b);
                continue;
            }
            check_fixture_contents(g, &s);
            dhsa_tokenizer *tok = NULL;
            T_CHECK(dhsa_tokenizer_from_gguf(g, &tok) == DHSA_OK, "tokenizer of fixture: %s", dhsa_last_error());
            if (tok) {
                int32_t tid[32];
                int64_t k = 0;
                char out[64];
                int64_t len = 0;
                const char *text = "once upon a time, the girl";
                int ok = dhsa_tokenize(tok, text, (int64_t)strlen(text), DHSA_TOKENIZE_ADD_BOS, tid, 32, &k) == DHSA_OK &&
                         k > 1 && tid[0] == 1 &&
                         dhsa_detokenize(tok, tid, k, 0, out, sizeof out, &len) == DHSA_OK && len == (int64_t)strlen(text) &&
                         memcmp(out, text, (size_t)len) == 0;
                T_CHECK(ok && dhsa_tokenizer_n_vocab(tok) == s.n_vocab && dhsa_tokenizer_eos(tok) == 2,
                        "fixture vocabulary tokenizes and round-trips");
                dhsa_tokenizer_free(tok);
            }
            llmref_model m;
            int rc = llmref_model_load(g, &m);
            T_CHECK(rc == 0, "load %s/%s: %s", archs[ai], llmref_type_name(types[ti]), llmref_error());
            dhsa_gguf_close(g);
            free(b);
            if (rc) continue;
            T_CHECK(m.n_vocab == s.n_vocab && m.n_embd == s.n_embd && m.n_head_kv == s.n_head_kv &&
                        m.hd_k == s.head_dim && m.n_rot == s.n_rot && m.rms_eps == (double)(float)s.rms_eps &&
                        m.rope_neox == (ai != 0) && m.tied == 0 && (m.layers[0].bq != NULL) == (ai == 1) &&
                        (m.layers[1].post_ffw_norm != NULL) == (ai == 2) &&
                        m.sliding_window == (ai == 2 ? 5 : 0) && m.attn_softcap == (ai == 2 ? 5 : 0),
                    "%s/%s hyperparameters", archs[ai], llmref_type_name(types[ti]));
            double *lg = run(&m, ids, 6, NULL);
            if (lg) {
                double mx = 0;
                int finite = 1;
                for (int64_t i = 0; i < 6 * m.n_vocab; i++) {
                    finite &= isfinite(lg[i]) != 0;
                    mx = fmax(mx, fabs(lg[i]));
                }
                T_CHECK(finite && mx > 0.05 && mx < 20, "%s/%s logits finite and O(1): max |logit| %g", archs[ai],
                        llmref_type_name(types[ti]), mx);
                /* every type carries the same random weights: logits close
                 * to the F32 fixture of the same sizes */
                int kq = llmref_type_block(types[ti]) == 256;
                double **base = kq ? &base_k : &base_small;
                if (kq && !base_k) {
                    llmref_spec sf = s;
                    sf.wtype = sf.embd_type = sf.output_type = LLMREF_F32;
                    llmref_model mf;
                    if (fx_load(&sf, &mf) == 0) {
                        base_k = run(&mf, ids, 6, NULL);
                        llmref_model_free(&mf);
                    }
                }
                if (!*base) {
                    *base = lg;
                    lg = NULL;
                } else {
                    const double tol[N_TYPES] = {0, 1e-5, 3e-4, 3e-3, 0.25, 0.25, 2e-2, 0.25,
                                                 0.1, 0.1, 1.5, 0.5, 0.25, 0.1, 0.25};
                    char what[64];
                    snprintf(what, sizeof what, "%s/%s vs F32", archs[ai], llmref_type_name(types[ti]));
                    llmref_cmp c;
                    llmref_compare_d(what, lg, *base, 6, m.n_vocab, 1e300, 0, tol[ti], &c);
                    T_CHECK(c.nmse <= tol[ti], "%s: NMSE %.3g > %.3g", what, c.nmse, tol[ti]);
                    if (ai == 0) printf("  %-10s logits vs F32: NMSE %.2e, max |diff| %.3g\n", what, c.nmse, c.max_abs);
                }
                free(lg);
            }
            llmref_model_free(&m);
        }
        free(base_small);
        free(base_k);
    }
}

/* Same seed, same bytes; another seed, other weights; per-tensor seeding:
 * a change elsewhere leaves a tensor's bytes alone. */
static void test_fixture_determinism(void) {
    llmref_spec s = llmref_spec_default("llama", LLMREF_Q4_0);
    uint8_t *a, *b, *c;
    size_t na, nb, nc;
    int rc = llmref_fixture_build(&s, &a, &na) | llmref_fixture_build(&s, &b, &nb);
    s.seed = 2;
    rc |= llmref_fixture_build(&s, &c, &nc);
    T_CHECK(rc == 0, "fixtures build");
    if (rc) return;
    T_CHECK(na == nb && memcmp(a, b, na) == 0, "same seed gives the same bytes");
    T_CHECK(na == nc && memcmp(a, c, na) != 0, "another seed gives other weights");
    free(a);
    free(b);
    free(c);

    llmref_model m1, m2;
    llmref_spec s1 = llmref_spec_default("llama", LLMREF_F32), s2 = s1;
    s2.tied = 1;
    s2.biases = 1;
    if (fx_load(&s1, &m1) == 0) {
        if (fx_load(&s2, &m2) == 0) {
            T_CHECK(memcmp(m1.layers[1].wq, m2.layers[1].wq, (size_t)(m1.n_embd * m1.n_head * m1.hd_k) * 8) == 0 &&
                        m2.tied && m2.output == m2.tok_embd && m2.layers[0].bv != NULL,
                    "a tied output and biases leave the other tensors alone");
            llmref_model_free(&m2);
        }
        llmref_model_free(&m1);
    }
}

static void test_loader_rules(void) {
    llmref_model m;
    /* every optional key left out: the table's defaults */
    for (int ai = 0; ai < 3; ai++) {
        llmref_spec s = llmref_spec_default(archs[ai], LLMREF_F32);
        s.n_head_kv = s.head_dim = s.head_dim_v = s.n_rot = 0;
        s.rope_base = s.rms_eps = s.attn_softcap = s.final_softcap = 0;
        s.sliding_window = 0;
        if (fx_load(&s, &m) == 0) {
            int gm = ai == 2;
            T_CHECK(m.n_head_kv == 4 && m.hd_k == 16 && m.hd_v == 16 && m.n_rot == 16 && m.rope_base == 10000 &&
                        m.rms_eps == (gm ? 1e-6 : 1e-5) && m.rope_factor == 1 &&
                        m.attn_softcap == (gm ? 50 : 0) && m.final_softcap == (gm ? 30 : 0) &&
                        m.sliding_window == (gm ? 4096 : 0) && m.embd_scale == (gm ? 8.0 : 1.0),
                    "%s defaults", archs[ai]);
            llmref_model_free(&m);
        }
    }
    /* integer keys of any integer type, float keys as F64: same model */
    const dhsa_gguf_type itypes[4] = {DHSA_GGUF_UINT16, DHSA_GGUF_INT32, DHSA_GGUF_UINT64, DHSA_GGUF_INT64};
    for (int i = 0; i < 4; i++) {
        llmref_spec s = llmref_spec_default("gemma2", LLMREF_F16);
        s.int_type = itypes[i];
        s.f64_keys = i & 1;
        s.rms_eps = 1e-6;
        if (fx_load(&s, &m) == 0) {
            T_CHECK(m.n_embd == 64 && m.n_head_kv == 2 && m.sliding_window == 5 && m.n_ctx_train == 256 &&
                        m.rms_eps == (s.f64_keys ? 1e-6 : (double)(float)1e-6),
                    "keys as %s%s", dhsa_gguf_type_name(itypes[i]), s.f64_keys ? " and FLOAT64" : "");
            llmref_model_free(&m);
        }
    }
    /* rope scaling: linear divides positions; an absent type counts as
     * linear (llama.cpp); "none" ignores the factor; yarn is refused */
    const char *stype[4] = {"linear", NULL, "none", "yarn"};
    const double want[4] = {4, 4, 1, -1};
    for (int i = 0; i < 4; i++) {
        llmref_spec s = llmref_spec_default("llama", LLMREF_F32);
        s.rope_scaling_type = stype[i];
        s.rope_scaling_factor = 4;
        uint8_t *b;
        size_t n;
        if (llmref_fixture_build(&s, &b, &n)) continue;
        int rc = llmref_model_load_memory(b, n, &m);
        if (want[i] > 0)
            T_CHECK(rc == 0 && m.rope_factor == want[i], "scaling %s x4: factor %g want %g", stype[i] ? stype[i] : "(absent)",
                    m.rope_factor, want[i]);
        else
            T_CHECK(rc != 0 && strstr(llmref_error(), "yarn"), "yarn is refused, naming it: %s", llmref_error());
        llmref_model_free(&m);
        free(b);
    }
    /* refusals name what is wrong */
    struct {
        const char *arch, *omit, *expect;
        int biases;
    } bad[] = {{"mamba", NULL, "mamba", 0},
               {"llama", "blk.1.ffn_up.weight", "blk.1.ffn_up.weight", 0},
               {"qwen2", NULL, "attn_q.bias", 0},
               {"gemma2", "blk.0.post_ffw_norm.weight", "post_ffw_norm", 0},
               {"llama", "output_norm.weight", "output_norm", 0}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        llmref_spec s = llmref_spec_default(bad[i].arch, LLMREF_F32);
        s.omit_tensor = bad[i].omit;
        s.biases = bad[i].biases;
        uint8_t *b;
        size_t n;
        if (llmref_fixture_build(&s, &b, &n)) continue;
        int rc = llmref_model_load_memory(b, n, &m);
        T_CHECK(rc != 0 && strstr(llmref_error(), bad[i].expect), "refusal %zu: rc %d, '%s' should name %s", i, rc,
                llmref_error(), bad[i].expect);
        free(b);
    }
    /* value heads narrower than key heads (value_length != key_length) */
    {
        llmref_spec sv = llmref_spec_default("qwen2", LLMREF_Q8_0);
        sv.head_dim_v = 8;
        if (fx_load(&sv, &m) == 0) {
            double *lg = run(&m, seq12, 12, NULL);
            int finite = lg != NULL;
            for (int64_t i = 0; lg && i < 12 * m.n_vocab; i++) finite &= isfinite(lg[i]) != 0;
            T_CHECK(m.hd_k == 16 && m.hd_v == 8 && finite, "hd_v 8 with hd_k 16 loads and runs");
            free(lg);
            llmref_model_free(&m);
        }
    }
    /* mixed types, as in a Q4_K_M file: Q6_K embedding, Q8_0 output, F16
     * norms and biases */
    {
        llmref_spec sm = llmref_spec_default("qwen2", LLMREF_Q4_K);
        sm.embd_type = LLMREF_Q6_K;
        sm.output_type = LLMREF_Q8_0;
        sm.norm_type = LLMREF_F16;
        uint8_t *bm;
        size_t nm;
        dhsa_gguf *g = NULL;
        if (llmref_fixture_build(&sm, &bm, &nm) == 0 && dhsa_gguf_open_memory(bm, nm, &g) == DHSA_OK) {
            check_fixture_contents(g, &sm);
            T_CHECK(llmref_model_load(g, &m) == 0 && m.layers[1].bv, "mixed types load: %s", llmref_error());
            llmref_model_free(&m);
            dhsa_gguf_close(g);
        } else {
            T_CHECK(0, "mixed-type fixture: %s", llmref_error());
        }
        free(bm);
    }
    /* a K type needs rows of 256 */
    llmref_spec s = llmref_spec_default("llama", LLMREF_F32);
    s.wtype = LLMREF_Q4_K;
    uint8_t *b = NULL;
    size_t n;
    T_CHECK(llmref_fixture_build(&s, &b, &n) != 0 && b == NULL && strstr(llmref_error(), "Q4_K"),
            "Q4_K with n_embd 64 is refused: %s", llmref_error());
    /* a fixture written to a file loads the same */
    char path[] = "/tmp/llmref_fixture_XXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0) {
        close(fd);
        s = llmref_spec_default("qwen2", LLMREF_Q8_0);
        T_CHECK(llmref_fixture_write_file(&s, path) == 0, "write file: %s", llmref_error());
        T_CHECK(llmref_model_load_file(path, &m) == 0 && m.arch == LLMREF_ARCH_QWEN2 && m.layers[1].bk,
                "load file: %s", llmref_error());
        llmref_model_free(&m);
        unlink(path);
    }
}

/* --------------------------------------------------------------------- */
/* (d) Invariants of the forward                                          */

static void test_causal_and_options(void) {
    for (int ai = 0; ai < 3; ai++) {
        llmref_spec s = llmref_spec_default(archs[ai], LLMREF_F32);
        s.n_rot = 8; /* half the head rotates */
        s.rope_freqs = 1;
        llmref_model m;
        if (fx_load(&s, &m)) continue;
        int64_t V = m.n_vocab;
        double *full = run(&m, seq12, 12, NULL);
        double *pre = run(&m, seq12, 7, NULL);
        if (full && pre)
            T_CHECK(memcmp(full, pre, (size_t)(7 * V) * sizeof *full) == 0,
                    "%s: logits of a prefix do not change when tokens are appended (max diff %g)", archs[ai],
                    max_abs_diff(full, pre, 7 * V));
        /* row0 and hidden */
        double *hid = malloc((size_t)(12 * m.n_embd) * sizeof *hid);
        llmref_opts o = {0, 9, hid};
        double *tail = run(&m, seq12, 12, &o);
        if (full && tail)
            T_CHECK(memcmp(tail, full + 9 * V, (size_t)(3 * V) * sizeof *tail) == 0, "%s: row0 = 9 gives rows 9..11",
                    archs[ai]);
        /* hidden: the logits follow from it by the output norm and matrix */
        if (full && hid) {
            double h[256], l0[512];
            llmref_rmsnorm(h, hid + 11 * m.n_embd, m.output_norm, m.n_embd, m.rms_eps);
            llmref_matvec(l0, m.output, h, NULL, V, m.n_embd);
            if (m.final_softcap > 0)
                for (int64_t i = 0; i < V; i++) l0[i] = m.final_softcap * tanh(l0[i] / m.final_softcap);
            T_CHECK(max_abs_diff(l0, full + 11 * V, V) == 0, "%s: hidden is the last residual", archs[ai]);
        }
        /* RoPE is relative and the window is in relative terms too: a shift
         * of every position changes nothing but rounding */
        llmref_opts sh = {1000, 0, NULL};
        double *shifted = run(&m, seq12, 12, &sh);
        if (full && shifted) {
            char what[64];
            snprintf(what, sizeof what, "%s: positions +1000", archs[ai]);
            T_CHECK(llmref_compare_d(what, shifted, full, 12, V, 1e-9, 1e-9, 1e-18, NULL), "%s", what);
            /* and RoPE does act: positions reversed (a non-shift) differ */
        }
        /* bad input */
        int32_t badid[2] = {1, (int32_t)V};
        double tmp[2 * 512];
        T_CHECK(llmref_forward(&m, badid, 2, tmp) != 0 && strstr(llmref_error(), "outside"), "id out of range refused");
        free(full);
        free(pre);
        free(tail);
        free(shifted);
        free(hid);
        llmref_model_free(&m);
    }
}

/* gemma2: a window >= n is no window; window 5 over 12 tokens is not. */
static void test_window(void) {
    llmref_spec s = llmref_spec_default("gemma2", LLMREF_F32);
    llmref_model m;
    if (fx_load(&s, &m)) return;
    int64_t V = m.n_vocab;
    m.sliding_window = 0;
    double *none = run(&m, seq12, 12, NULL);
    m.sliding_window = 12;
    double *wide = run(&m, seq12, 12, NULL);
    m.sliding_window = 5;
    double *w5 = run(&m, seq12, 12, NULL);
    if (none && wide && w5) {
        T_CHECK(memcmp(none, wide, (size_t)(12 * V) * sizeof *none) == 0, "window 12 over 12 tokens equals no window");
        T_CHECK(memcmp(none, w5, (size_t)(5 * V) * sizeof *none) == 0,
                "window 5: the first 5 rows see every key anyway");
        double d = max_abs_diff(none + 5 * V, w5 + 5 * V, 7 * V);
        T_CHECK(d > 1e-3, "window 5: rows 5.. differ from no window (max diff %g)", d);
    }
    free(none);
    free(wide);
    free(w5);
    /* only even layers slide: with layer 0's attention silenced (Wo = 0),
     * the window changes nothing; with layer 1's silenced instead, it does */
    for (int silenced = 0; silenced < 2; silenced++) {
        llmref_model z;
        if (fx_load(&s, &z)) break;
        memset(z.layers[silenced].wo, 0, (size_t)(z.n_embd * z.n_head * z.hd_v) * sizeof(double));
        z.sliding_window = 0;
        double *g0 = run(&z, seq12, 12, NULL);
        z.sliding_window = 3;
        double *g3 = run(&z, seq12, 12, NULL);
        if (g0 && g3) {
            double d = max_abs_diff(g0, g3, 12 * V);
            if (silenced == 0)
                T_CHECK(d == 0, "layer 1 (odd) does not slide: max diff %g", d);
            else
                T_CHECK(d > 1e-3, "layer 0 (even) slides: max diff %g", d);
        }
        free(g0);
        free(g3);
        llmref_model_free(&z);
    }
    llmref_model_free(&m);
}

/* NeoX pairs (i, i + n_rot/2) on Q/K rows permuted within each head equal
 * normal pairs (2i, 2i + 1) on the original rows (llama.cpp's converter
 * does the inverse for llama). Rows at or above n_rot stay. */
static void permute_rows(double *w, const double *src, int64_t n_heads, int64_t hd, int64_t n_rot, int64_t n_in) {
    for (int64_t h = 0; h < n_heads; h++)
        for (int64_t r = 0; r < hd; r++) {
            int64_t to = r >= n_rot ? r : (r % 2 == 0 ? r / 2 : r / 2 + n_rot / 2);
            memcpy(w + (h * hd + to) * n_in, src + (h * hd + r) * n_in, (size_t)n_in * sizeof *w);
        }
}

static void test_neox_equivalence(void) {
    llmref_spec s = llmref_spec_default("llama", LLMREF_F32);
    s.n_rot = 8;
    s.biases = 1;
    s.rope_freqs = 1;
    llmref_model a, b;
    if (fx_load(&s, &a)) return;
    if (fx_load(&s, &b)) {
        llmref_model_free(&a);
        return;
    }
    int64_t V = a.n_vocab, E = a.n_embd, hd = a.hd_k;
    b.rope_neox = 1;
    double *neox_unpermuted = run(&b, seq12, 12, NULL);
    for (int64_t l = 0; l < a.n_layer; l++) {
        permute_rows(b.layers[l].wq, a.layers[l].wq, a.n_head, hd, a.n_rot, E);
        permute_rows(b.layers[l].wk, a.layers[l].wk, a.n_head_kv, hd, a.n_rot, E);
        permute_rows(b.layers[l].bq, a.layers[l].bq, a.n_head, hd, a.n_rot, 1);
        permute_rows(b.layers[l].bk, a.layers[l].bk, a.n_head_kv, hd, a.n_rot, 1);
    }
    double *normal = run(&a, seq12, 12, NULL), *neox = run(&b, seq12, 12, NULL);
    if (normal && neox && neox_unpermuted) {
        T_CHECK(llmref_compare_d("neox(permuted) vs normal", neox, normal, 12, V, 1e-10, 1e-10, 1e-20, NULL),
                "NeoX pairs on permuted Q/K rows equal normal pairs");
        double d = max_abs_diff(neox_unpermuted, normal, 12 * V);
        T_CHECK(d > 1e-3, "NeoX pairs on the same rows differ from normal pairs (max diff %g)", d);
    }
    free(normal);
    free(neox);
    free(neox_unpermuted);
    llmref_model_free(&a);
    llmref_model_free(&b);
}

/* GQA: query head j uses KV head j / (n_head / n_head_kv). A model with
 * every KV head duplicated that way and n_head_kv = n_head is the same
 * model; duplicated as j % n_head_kv it is not. */
static int dup_kv(const llmref_model *a, llmref_model *b, int modulo) {
    *b = *a;
    b->n_head_kv = a->n_head;
    b->has_biases = a->layers[0].bq != NULL;
    b->has_post_norms = a->layers[0].post_attn_norm != NULL;
    b->has_rope_freqs = a->rope_freqs != NULL;
    if (llmref_model_alloc(b)) return -1;
    int64_t E = a->n_embd, V = a->n_vocab, hd = a->hd_k, group = a->n_head / a->n_head_kv;
    memcpy(b->tok_embd, a->tok_embd, (size_t)(V * E) * 8);
    memcpy(b->output_norm, a->output_norm, (size_t)E * 8);
    if (!a->tied) memcpy(b->output, a->output, (size_t)(V * E) * 8);
    if (a->rope_freqs) memcpy(b->rope_freqs, a->rope_freqs, (size_t)(a->n_rot / 2) * 8);
    for (int64_t l = 0; l < a->n_layer; l++) {
        const llmref_layer *A = &a->layers[l];
        llmref_layer *B = &b->layers[l];
#define CP(f, n)                                         \
    if (A->f) memcpy(B->f, A->f, (size_t)(n) * 8)
        CP(attn_norm, E);
        CP(wq, a->n_head * hd * E);
        CP(bq, a->n_head * hd);
        CP(wo, E * a->n_head * hd);
        CP(post_attn_norm, E);
        CP(ffn_norm, E);
        CP(w_gate, a->n_ff * E);
        CP(w_up, a->n_ff * E);
        CP(w_down, E * a->n_ff);
        CP(post_ffw_norm, E);
#undef CP
        for (int64_t j = 0; j < a->n_head; j++) {
            int64_t src = modulo ? j % a->n_head_kv : j / group;
            memcpy(B->wk + j * hd * E, A->wk + src * hd * E, (size_t)(hd * E) * 8);
            memcpy(B->wv + j * hd * E, A->wv + src * hd * E, (size_t)(hd * E) * 8);
            if (A->bk) memcpy(B->bk + j * hd, A->bk + src * hd, (size_t)hd * 8);
            if (A->bv) memcpy(B->bv + j * hd, A->bv + src * hd, (size_t)hd * 8);
        }
    }
    return 0;
}

static void test_gqa(void) {
    for (int ai = 0; ai < 3; ai++) {
        llmref_spec s = llmref_spec_default(archs[ai], LLMREF_F32);
        s.n_head = 8;
        s.n_head_kv = 2; /* ratio 4 */
        s.head_dim = s.head_dim_v = 8;
        s.n_rot = 8;
        llmref_model a, b, c;
        if (fx_load(&s, &a)) continue;
        if (dup_kv(&a, &b, 0) || dup_kv(&a, &c, 1)) {
            T_CHECK(0, "dup_kv: %s", llmref_error());
            llmref_model_free(&a);
            continue;
        }
        double *ga = run(&a, seq12, 12, NULL), *gb = run(&b, seq12, 12, NULL), *gc = run(&c, seq12, 12, NULL);
        if (ga && gb && gc) {
            char what[64];
            snprintf(what, sizeof what, "%s: GQA 8/2 vs duplicated KV heads", archs[ai]);
            T_CHECK(llmref_compare_d(what, gb, ga, 12, a.n_vocab, 1e-12, 1e-12, 1e-24, NULL), "%s", what);
            double d = max_abs_diff(gc, ga, 12 * a.n_vocab);
            T_CHECK(d > 1e-3, "%s: KV heads taken as j %% n_head_kv differ (max diff %g)", archs[ai], d);
        }
        free(ga);
        free(gb);
        free(gc);
        llmref_model_free(&a);
        llmref_model_free(&b);
        llmref_model_free(&c);
    }
}

/* Linear scaling by 2 equals rope_freqs of 2 everywhere; and it matters. */
static void test_rope_scaling(void) {
    llmref_spec s = llmref_spec_default("qwen2", LLMREF_F32);
    llmref_model m;
    if (fx_load(&s, &m)) return;
    int64_t V = m.n_vocab;
    double *plain = run(&m, seq12, 12, NULL);
    m.rope_factor = 2;
    double *lin = run(&m, seq12, 12, NULL);
    m.rope_factor = 1;
    m.rope_freqs = malloc((size_t)(m.n_rot / 2) * sizeof *m.rope_freqs);
    for (int64_t i = 0; i < m.n_rot / 2; i++) m.rope_freqs[i] = 2;
    double *ff = run(&m, seq12, 12, NULL);
    if (plain && lin && ff) {
        T_CHECK(llmref_compare_d("linear x2 vs rope_freqs 2", ff, lin, 12, V, 1e-12, 1e-12, 1e-24, NULL),
                "linear factor 2 equals rope_freqs 2");
        T_CHECK(max_abs_diff(plain, lin, 12 * V) > 1e-3, "linear factor 2 changes the logits");
        T_CHECK(memcmp(plain, lin, (size_t)V * sizeof *plain) == 0, "position 0 does not rotate");
    }
    /* dims at or above n_rot stay; pairs keep their norm */
    double v[16], w[16];
    for (int i = 0; i < 16; i++) v[i] = w[i] = i + 1;
    m.n_rot = 8;
    m.rope_neox = 0;
    llmref_rope(&m, w, 7);
    int same = 1;
    for (int i = 8; i < 16; i++) same &= w[i] == v[i];
    double n0 = v[0] * v[0] + v[1] * v[1], n1 = w[0] * w[0] + w[1] * w[1];
    T_CHECK(same && fabs(n0 - n1) < 1e-12 && w[0] != v[0], "rope leaves dims >= n_rot alone, keeps pair norms");
    /* pair 0 at position 7, normal: theta = 7 / 2 (rope_freqs[0] = 2) */
    T_CHECK(fabs(w[0] - (1 * cos(3.5) - 2 * sin(3.5))) < 1e-14 && fabs(w[1] - (1 * sin(3.5) + 2 * cos(3.5))) < 1e-14,
            "rope pair 0 by hand");
    /* pair 1 of NeoX at n_rot 8 is (1, 5): theta = 7 * 10000^(-2/8) / 2 */
    for (int i = 0; i < 16; i++) w[i] = i + 1;
    m.rope_neox = 1;
    m.rope_base = 10000;
    llmref_rope(&m, w, 7);
    double th = 7 * pow(10000, -0.25) / 2;
    T_CHECK(fabs(w[1] - (2 * cos(th) - 6 * sin(th))) < 1e-14 && fabs(w[5] - (2 * sin(th) + 6 * cos(th))) < 1e-14,
            "NeoX pair (1, 5) by hand");
    free(plain);
    free(lin);
    free(ff);
    llmref_model_free(&m);
}

/* A model small enough to check by hand: 2 dims, 1 head of 2, n_rot 2
 * (theta = position: base^0 = 1), identity Q/K/V/O, embeddings e0 = (1, 0),
 * e1 = (0, 1), e2 = (1, 1), tied; FFN with one hidden unit: gate = up =
 * (1, 0), down = (1, 0)^T, so f = (act(h0) h0, 0); norms 1, eps 0. */
static int hand_model(llmref_model *m, llmref_arch arch) {
    memset(m, 0, sizeof *m);
    m->arch = arch;
    m->n_vocab = 3;
    m->n_embd = 2;
    m->n_layer = 1;
    m->n_ff = 1;
    m->n_head = m->n_head_kv = 1;
    m->hd_k = m->hd_v = m->n_rot = 2;
    m->n_ctx_train = 16;
    m->rms_eps = 0;
    m->rope_base = 10000;
    m->rope_factor = 1;
    m->tied = 1;
    m->has_post_norms = arch == LLMREF_ARCH_GEMMA2;
    llmref_model_derive(m);
    if (llmref_model_alloc(m)) return -1;
    const double emb[6] = {1, 0, 0, 1, 1, 1}, id[4] = {1, 0, 0, 1};
    memcpy(m->tok_embd, emb, sizeof emb);
    m->output_norm[0] = m->output_norm[1] = 1;
    llmref_layer *L = &m->layers[0];
    memcpy(L->wq, id, sizeof id);
    memcpy(L->wk, id, sizeof id);
    memcpy(L->wv, id, sizeof id);
    memcpy(L->wo, id, sizeof id);
    L->attn_norm[0] = L->attn_norm[1] = L->ffn_norm[0] = L->ffn_norm[1] = 1;
    if (L->post_attn_norm) L->post_attn_norm[0] = L->post_attn_norm[1] = L->post_ffw_norm[0] = L->post_ffw_norm[1] = 1;
    L->w_gate[0] = L->w_up[0] = L->w_down[0] = 1; /* gate/up [1][2], down [2][1] */
    return 0;
}

static void rms2(double *v) { /* v / sqrt(mean(v^2)) for 2 dims */
    double r = 1 / sqrt((v[0] * v[0] + v[1] * v[1]) / 2);
    v[0] *= r;
    v[1] *= r;
}

static void test_hand_llama(void) {
    llmref_model m;
    if (hand_model(&m, LLMREF_ARCH_LLAMA)) return;
    const int32_t ids[2] = {0, 1};
    double lg[6];
    T_CHECK(llmref_forward(&m, ids, 2, lg) == 0, "hand forward: %s", llmref_error());
    const double r2 = sqrt(2.0);
    /* token 0 at position 0: everything lies on dim 0, and the final
     * rmsnorm brings it back to (sqrt 2, 0) */
    double want0[3] = {r2, 0, r2};
    /* token 1 at position 1: q = k1 = v1 = (0, sqrt 2); q and k1 turn by 1
     * radian; k0 = v0 = (sqrt 2, 0) */
    double q[2] = {-r2 * sin(1.0), r2 * cos(1.0)};
    double s0 = (q[0] * r2) / r2, s1 = (q[0] * q[0] + q[1] * q[1]) / r2;
    double w0 = exp(s0) / (exp(s0) + exp(s1)), w1 = 1 - w0;
    double x[2] = {w0 * r2, 1 + w1 * r2};
    double h[2] = {x[0], x[1]};
    rms2(h);
    double silu = h[0] / (1 + exp(-h[0]));
    x[0] += silu * h[0];
    rms2(x);
    double want1[3] = {x[0], x[1], x[0] + x[1]};
    double want[6] = {want0[0], want0[1], want0[2], want1[0], want1[1], want1[2]};
    T_CHECK(llmref_compare_d("hand llama", lg, want, 2, 3, 1e-14, 1e-14, 1e-28, NULL), "one-layer llama by hand");
    llmref_model_free(&m);
}

static void test_hand_gemma2(void) {
    llmref_model m;
    if (hand_model(&m, LLMREF_ARCH_GEMMA2)) return;
    m.attn_softcap = 1.5;
    m.final_softcap = 2;
    const int32_t ids[2] = {0, 1};
    const double r2 = sqrt(2.0);
    for (int window = 0; window <= 1; window++) { /* layer 0 is a sliding layer */
        m.sliding_window = window;
        double lg[6];
        T_CHECK(llmref_forward(&m, ids, 2, lg) == 0, "hand forward: %s", llmref_error());
        /* token 0: x = sqrt(2) e0 (embedding scale sqrt(n_embd)); every
         * normed vector is (sqrt 2, 0), the final one too */
        double c0 = 2 * tanh(r2 / 2);
        double want0[3] = {c0, 0, c0};
        /* token 1: x = (0, sqrt 2); q = k1 = v1 = (0, sqrt 2) before RoPE */
        double q[2] = {-r2 * sin(1.0), r2 * cos(1.0)};
        double s0 = 1.5 * tanh(((q[0] * r2) / r2) / 1.5), s1 = 1.5 * tanh(((q[0] * q[0] + q[1] * q[1]) / r2) / 1.5);
        double w0 = window == 1 ? 0 : exp(s0) / (exp(s0) + exp(s1)), w1 = 1 - w0;
        double o[2] = {w0 * r2, w1 * r2};
        if (window == 0) rms2(o); /* with window 1, o = (0, sqrt 2) is already normed */
        double x[2] = {o[0], r2 + o[1]};
        double h[2] = {x[0], x[1]};
        double f0;
        if (window == 0) {
            rms2(h);
            double gelu = 0.5 * h[0] * (1 + tanh(0.79788456080286535588 /* sqrt(2/pi) */ * (h[0] + 0.044715 * h[0] * h[0] * h[0])));
            f0 = gelu * h[0] > 0 ? r2 : 0; /* post_ffw rmsnorm of (f, 0), f > 0 */
        } else {
            f0 = 0; /* h = (0, sqrt 2): gate 0, f = 0; rmsnorm(0) with eps 0 is NaN: see below */
        }
        x[0] += f0;
        rms2(x);
        double want1[3] = {2 * tanh(x[0] / 2), 2 * tanh(x[1] / 2), 2 * tanh((x[0] + x[1]) / 2)};
        double want[6] = {want0[0], want0[1], want0[2], want1[0], want1[1], want1[2]};
        if (window == 0) {
            T_CHECK(llmref_compare_d("hand gemma2", lg, want, 2, 3, 1e-14, 1e-14, 1e-28, NULL),
                    "one-layer gemma2 by hand (caps, scale, post norms, GELU)");
        } else {
            /* the FFN output of token 1 is exactly 0 and its rmsnorm with
             * eps 0 is 0/0: row 1 is NaN, row 0 is as before. With eps > 0
             * the zero stays zero and row 1 is the hand value. */
            T_CHECK(isnan(lg[3]) && lg[0] == want0[0], "window 1 with eps 0: 0/0 in row 1 only");
            m.rms_eps = 1e-300;
            T_CHECK(llmref_forward(&m, ids, 2, lg) == 0, "hand forward: %s", llmref_error());
            T_CHECK(llmref_compare_d("hand gemma2 window 1", lg, want, 2, 3, 1e-14, 1e-14, 1e-28, NULL),
                    "window 1: token 1 attends only to itself");
            m.rms_eps = 0;
        }
    }
    llmref_model_free(&m);
}

static void test_compare_helper(void) {
    double ref[12];
    float got[12];
    for (int i = 0; i < 12; i++) {
        ref[i] = (i - 6) * 0.75;
        got[i] = (float)ref[i];
    }
    llmref_cmp c;
    T_CHECK(llmref_compare("equal", got, ref, 3, 4, 1e-6, 1e-6, 1e-12, &c) && c.n_bad == 0 && c.nmse == 0,
            "equal arrays pass");
    got[6] += 0.01f; /* row 1, col 2 */
    got[1] += 1e-7f; /* within atol */
    fprintf(stderr, "(the next three comparison failures are deliberate)\n");
    int ok = llmref_compare("deliberately off", got, ref, 3, 4, 1e-3, 1e-3, 1, &c);
    T_CHECK(!ok && c.n_bad == 1 && c.worst_row == 1 && c.worst_col == 2, "one element off fails at (1, 2): %lld bad, (%lld, %lld)",
            (long long)c.n_bad, (long long)c.worst_row, (long long)c.worst_col);
    got[6] = (float)ref[6];
    got[9] = NAN;
    ok = llmref_compare("NaN", got, ref, 3, 4, 1e-3, 1e-3, 1, &c);
    T_CHECK(!ok && c.worst_row == 2 && c.worst_col == 1, "NaN fails and is the worst element");
    got[9] = (float)ref[9];
    /* NMSE bound alone: every element within 10% rtol, but NMSE 1e-4 > 1e-6 */
    for (int i = 0; i < 12; i++) got[i] = (float)(ref[i] * 1.01);
    T_CHECK(!llmref_compare("nmse", got, ref, 3, 4, 0, 0.1, 1e-6, &c) && c.n_bad == 0 && c.nmse > 1e-6,
            "the NMSE bound fails alone");
}

/* --------------------------------------------------------------------- */
/* (a) The real model                                                     */

static char *text_of(const dhsa_tokenizer *t, const int32_t *ids, int64_t n) {
    static char buf[1024];
    int64_t len = 0;
    if (dhsa_detokenize(t, ids, n, 0, buf, sizeof buf - 1, &len) != DHSA_OK) return NULL;
    buf[len] = 0;
    return buf;
}

static void test_stories(void) {
    if (access(MODEL, R_OK) != 0) {
        T_SKIP(11, "%s is absent: the real-model checks of the reference are skipped", MODEL);
        return;
    }
    dhsa_gguf *g = NULL;
    T_CHECK(dhsa_gguf_open(MODEL, &g) == DHSA_OK, "open %s: %s", MODEL, dhsa_last_error());
    if (!g) return;
    llmref_model m;
    dhsa_tokenizer *tok = NULL;
    int rc = llmref_model_load(g, &m);
    T_CHECK(rc == 0, "load %s: %s", MODEL, llmref_error());
    T_CHECK(dhsa_tokenizer_from_gguf(g, &tok) == DHSA_OK, "tokenizer: %s", dhsa_last_error());
    dhsa_gguf_close(g);
    if (rc || !tok) {
        dhsa_tokenizer_free(tok);
        if (!rc) llmref_model_free(&m);
        return;
    }
    T_CHECK(m.arch == LLMREF_ARCH_LLAMA && m.n_vocab == 512 && m.n_embd == 64 && m.n_layer == 5 && m.n_head == 8 &&
                m.n_head_kv == 4 && m.hd_k == 8 && m.n_ff == 172 && !m.rope_neox && m.rope_base == 10000,
            "stories260K hyperparameters");
    /* the GGUF stores the tied classifier as a copy in output.weight */
    T_CHECK(m.tied || memcmp(m.output, m.tok_embd, (size_t)(512 * 64) * sizeof(double)) == 0,
            "stories260K output equals the embedding");

    enum { NP = 5, NG = 20 };
    const int32_t prompt[NP] = {1, 403, 407, 261, 378}; /* BOS "Once upon a time" */
    const char *want = "Once upon a time, there was a little girl named Lily";
    int32_t seq[NP + NG];
    memcpy(seq, prompt, sizeof prompt);
    rc = llmref_greedy(&m, seq, NP, NG);
    char *text = rc ? NULL : text_of(tok, seq, NP + NG);
    printf("  stories260K, reference greedy: \"%s\"\n", text ? text : "(failed)");
    T_CHECK(text && strncmp(text, want, strlen(want)) == 0, "greedy text starts with \"%s\"", want);

    /* the check can fail: NeoX pairs are wrong for a llama */
    m.rope_neox = 1;
    memcpy(seq, prompt, sizeof prompt);
    rc = llmref_greedy(&m, seq, NP, NG);
    text = rc ? NULL : text_of(tok, seq, NP + NG);
    printf("  stories260K with NeoX pairs (wrong): \"%s\"\n", text ? text : "(failed)");
    T_CHECK(text && strstr(text, "little girl named Lily") == NULL, "the wrong variant does not tell the story");
    m.rope_neox = 0;

    /* the llama2.c checkpoint holds the same numbers: same logits */
    if (access(MODEL_BIN, R_OK) == 0) {
        llmref_model mb;
        rc = llmref_model_load_llama2c(MODEL_BIN, &mb);
        T_CHECK(rc == 0, "load %s: %s", MODEL_BIN, llmref_error());
        if (rc == 0) {
            double *la = run(&m, prompt, NP, NULL), *lb = run(&mb, prompt, NP, NULL);
            if (la && lb)
                T_CHECK(memcmp(la, lb, (size_t)(NP * 512) * sizeof *la) == 0,
                        "llama2.c checkpoint and GGUF give the same logits (max diff %g)", max_abs_diff(la, lb, NP * 512));
            free(la);
            free(lb);
            llmref_model_free(&mb);
        }
    } else {
        T_SKIP(4, "%s is absent: the llama2.c comparison is skipped", MODEL_BIN);
    }
    dhsa_tokenizer_free(tok);
    llmref_model_free(&m);
}

int main(void) {
    test_scalars();
    test_dequant_blocks();
    test_quant_roundtrip();
    test_fixtures();
    test_fixture_determinism();
    test_loader_rules();
    test_causal_and_options();
    test_window();
    test_neox_equivalence();
    test_gqa();
    test_rope_scaling();
    test_hand_llama();
    test_hand_gemma2();
    test_compare_helper();
    test_stories();
    return t_report("test_llm_ref");
}
