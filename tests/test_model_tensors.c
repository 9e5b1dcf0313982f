/* test_model_tensors.c: every tensor of a model file is accounted for, and
 * untrusted strings are escaped (docs/model.md, "Tensors").
 *
 *   - The optional tensors the runner applies, each on its own and all
 *     together, on tiny random models (llama, qwen2, gemma2): attn_output
 *     bias, the MLP biases (ffn_gate/up/down.bias), q/k/v biases,
 *     output.bias, a fused attn_qkv.weight (+ attn_qkv.bias). The logits of
 *     the runner are within 1e-5 (relative L2) of tests/llm_ref.h's double
 *     forward, which reads the same file independently; and the same
 *     reference without the tensor is far off (so ignoring it is caught:
 *     the runner before this file did, with relative errors of 0.7-1.1).
 *   - gemma2 with 46 layers (Gemma 2 27B) scales queries by
 *     1/sqrt(n_embd / n_head), as llama.cpp does; 45 layers and a 46-layer
 *     llama keep 1/sqrt(head_dim). The fixture's head_dim (32) differs
 *     from n_embd / n_head (16), so the wrong rule is visible.
 *   - A tensor the architecture does not use is refused naming it (it
 *     loaded silently before); a name with ESC and other control bytes is
 *     escaped in the sentence, in the reference's sentence, in `dhsa
 *     inspect` and in `dhsa run`'s error (through DHSA_CLI).
 *   - The escaping helper itself (src/core/escape.c): each rule, cutting,
 *     and dhsa__fail's own pass over its sentence.
 *   - `dhsa gen-model --bias all` writes a model every bias of which the
 *     runner and the reference both apply.
 *
 * Build and run alone:
 *   make build/tests/test_model_tensors && DHSA_CLI=build/dhsa build/tests/test_model_tensors
 */
#include "core/internal.h"
#include "dhsa.h"
#include "llm_ref.h"
#include "cli_run.h"
#include "t.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The exact route (F32 weight products): the one held to the double
 * reference at the tight bounds below; the fast integer route is checked
 * at its own bound (test_model_ref.c, check_fast). */
static dhsa_session_params exact_params(void) {
    dhsa_session_params p = dhsa_session_default_params();
    p.kv_type = DHSA_F32; /* compared with F32 references (the default is F16) */
    p.exact = 1;
    return p;
}

#define REL_MAX 1e-5 /* relative L2 of the logits against the double reference */
#define ATOL 2e-4    /* per element, as tests/test_model_ref.c */
#define RTOL 2e-3
#define NMSE 1e-10   /* = REL_MAX^2 */

static dhsa_ctx *ctx;

/* ||a - b|| / ||b|| */
static double rel_l2(const float *a, const double *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static double rel_l2_d(const double *a, const double *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void make_ids(int32_t *ids, int64_t n, int64_t V, uint64_t seed) {
    for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)(llmref_rand_u64(&seed) % (uint64_t)V);
    ids[0] = 1;
}

static dhsa_status load_bytes(const uint8_t *bytes, size_t size, dhsa_model **m) {
    dhsa_gguf *g;
    *m = NULL;
    dhsa_status st = dhsa_gguf_open_memory(bytes, size, &g);
    if (st) return st;
    return dhsa_model_from_gguf(g, NULL, m);
}

/* Logits of every position of ids through a session: one prefill, or (by
 * token) a 3-token prefill and then decode one at a time. */
static dhsa_status run_logits(const dhsa_model *m, const int32_t *ids, int64_t n, int by_token, float *logits) {
    int64_t V = dhsa_model_get_info(m)->n_vocab;
    dhsa_session_params sp = exact_params();
    sp.logits_all = 1;
    dhsa_session *s;
    dhsa_status st = dhsa_session_create(ctx, m, &sp, &s);
    if (st) return st;
    if (by_token) {
        st = dhsa_session_eval(s, ids, 3, logits);
        for (int64_t i = 3; i < n && !st; i++) st = dhsa_session_eval(s, ids + i, 1, logits + i * V);
    } else {
        st = dhsa_session_eval(s, ids, n, logits);
    }
    dhsa_session_free(s);
    return st;
}

/* No byte of s is a control byte (ESC, BEL, ...). */
static int no_controls(const char *s) {
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f) return 0;
    return 1;
}

/* ------------------------------------------------------------ escaping --- */

/* The input of a failed check, for its message: bytes outside printable
 * ASCII as \xNN (independent of the helper under test). */
static const char *hex_of(const char *s, size_t n, char *buf, size_t cap) {
    size_t o = 0;
    for (size_t i = 0; i < n && o + 5 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c > 0x20 && c < 0x7f && c != '\\') buf[o++] = (char)c;
        else o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
    }
    buf[o] = '\0';
    return buf;
}

static void check_esc(const char *in, size_t len, unsigned flags, const char *want) {
    char out[128];
    size_t n = dhsa__escape(out, sizeof out, in, len, flags);
    char shown[160];
    T_CHECK(strcmp(out, want) == 0 && n == strlen(want), "escape of %s (flags %u): got \"%s\" (%zu), want \"%s\"",
            hex_of(in, len, shown, sizeof shown), flags, out, n, want);
}

/* in is a string literal: its length includes any NUL inside */
#define ESC(in, flags, want) check_esc(in, sizeof(in) - 1, flags, want)

static void test_escape(void) {
    ESC("blk.0.\x1b[31mred", 0, "blk.0.\\x1b[31mred");
    ESC("a\nb\tc\rd", 0, "a\\nb\\tc\\rd");
    ESC("\x01\x07\x7f", 0, "\\x01\\x07\\x7f");
    ESC("a\0b", 0, "a\\x00b"); /* with a length, NUL is a byte like any other */
    /* valid UTF-8 is kept: the SentencePiece space, CJK, an emoji */
    ESC("\xe2\x96\x81the \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80", 0,
        "\xe2\x96\x81the \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80");
    /* C1 CSI (U+009B), a bidi override (U+202E), U+2028: escaped byte by byte */
    ESC("\xc2\x9b" "2J", 0, "\\xc2\\x9b2J");
    ESC("ab\xe2\x80\xae" "cd", 0, "ab\\xe2\\x80\\xaecd");
    ESC("\xe2\x80\xa8", 0, "\\xe2\\x80\\xa8");
    /* invalid UTF-8: a stray byte, an overlong '/', a surrogate, a cut sequence */
    ESC("\xff", 0, "\\xff");
    ESC("\xc0\xaf", 0, "\\xc0\\xaf");
    ESC("\xed\xa0\x80", 0, "\\xed\\xa0\\x80");
    ESC("x\xe2\x96", 0, "x\\xe2\\x96");
    ESC("\x80x", 0, "\\x80x");
    /* backslashes and quotes, per flag */
    ESC("a\\b\"c'd", 0, "a\\b\"c'd");
    ESC("a\\b\"c'd", DHSA__ESC_BACKSLASH, "a\\\\b\"c'd");
    ESC("a\\b\"c'd", DHSA__ESC_QUOTES, "a\\\\b\\\"c\\'d");
    /* cutting: between escapes, never inside; "..." when asked; the return
     * value is the whole escaped length either way */
    {
        char o[6];
        size_t n = dhsa__escape(o, sizeof o, "ab\x1b" "cd", 5, 0);
        T_CHECK(n == 8 && strcmp(o, "ab") == 0, "cut before an escape: \"%s\" (%zu)", o, n);
        char e[8];
        n = dhsa__escape(e, sizeof e, "abcdefghij", 10, DHSA__ESC_ELLIPSIS);
        T_CHECK(n == 10 && strcmp(e, "abcd...") == 0, "cut with an ellipsis: \"%s\" (%zu)", e, n);
        n = dhsa__escape(e, sizeof e, "abcdefg", 7, DHSA__ESC_ELLIPSIS);
        T_CHECK(n == 7 && strcmp(e, "abcdefg") == 0, "a text that fits is not cut: \"%s\"", e);
        T_CHECK(dhsa__escape(NULL, 0, "\x1b\x1b", 2, 0) == 8, "cap 0 counts");
    }
    /* the rotating buffers: four strings of one sentence stay distinct */
    {
        const char *a = dhsa__esc("one\x1b"), *b = dhsa__esc("two"), *c = dhsa__esc("three"), *d = dhsa__escn("four!", 4);
        T_CHECK(strcmp(a, "one\\x1b") == 0 && strcmp(b, "two") == 0 && strcmp(c, "three") == 0 &&
                    strcmp(d, "four") == 0,
                "dhsa__esc: %s %s %s %s", a, b, c, d);
    }
    /* dhsa__fail escapes what a caller left raw, and may be given its own
     * previous sentence */
    dhsa__fail(DHSA_ERR_FORMAT, "name \"%s\"", "x\x1b]0;pwned\x07y");
    T_CHECK(strcmp(dhsa_last_error(), "name \"x\\x1b]0;pwned\\x07y\"") == 0, "dhsa__fail escapes: %s",
            dhsa_last_error());
    dhsa__fail(DHSA_ERR_FORMAT, "inner reason");
    dhsa__fail(DHSA_ERR_FORMAT, "layer 3: %s", dhsa_last_error());
    T_CHECK(strcmp(dhsa_last_error(), "layer 3: inner reason") == 0, "dhsa__fail of its own sentence: %s",
            dhsa_last_error());
}

/* ------------------------------------------------------- bias fixtures --- */

typedef struct {
    const char *label;
    const char *arch;
    uint32_t wtype;
    int biases, out_bias, ffn_biases, output_bias, fused_qkv;
    uint32_t norm_type; /* 0: F32 */
} bias_case;

/* Zeroes (frees) in ref what the case added, for the "without it" forward. */
static void drop_case_tensors(llmref_model *r, const bias_case *c) {
    for (int64_t l = 0; l < r->n_layer; l++) {
        llmref_layer *L = &r->layers[l];
        if (c->biases && strcmp(c->arch, "qwen2") != 0) {
            free(L->bq), free(L->bk), free(L->bv);
            L->bq = L->bk = L->bv = NULL;
        }
        if (c->out_bias) free(L->bo), L->bo = NULL;
        if (c->ffn_biases) {
            free(L->b_gate), free(L->b_up), free(L->b_down);
            L->b_gate = L->b_up = L->b_down = NULL;
        }
    }
    if (c->output_bias) free(r->output_bias), r->output_bias = NULL;
}

static void check_bias_case(const bias_case *c, uint64_t seed) {
    llmref_spec s = llmref_spec_default(c->arch, c->wtype);
    s.seed = seed;
    s.biases = c->biases || strcmp(c->arch, "qwen2") == 0;
    s.out_bias = c->out_bias;
    s.ffn_biases = c->ffn_biases;
    s.output_bias = c->output_bias;
    s.fused_qkv = c->fused_qkv;
    if (c->norm_type) s.norm_type = c->norm_type;
    uint8_t *bytes = NULL;
    size_t size = 0;
    llmref_model ref;
    memset(&ref, 0, sizeof ref);
    dhsa_model *m = NULL;
    const int64_t n = 20;
    int32_t ids[20];
    double *want = NULL, *without = NULL;
    float *got = NULL, *got_dec = NULL;
    if (llmref_fixture_build(&s, &bytes, &size) || llmref_model_load_memory(bytes, size, &ref)) {
        T_CHECK(0, "%s: fixture / reference: %s", c->label, llmref_error());
        goto done;
    }
    dhsa_status st = load_bytes(bytes, size, &m);
    T_CHECK(st == DHSA_OK, "%s: the runner loads it: %s", c->label, dhsa_last_error());
    if (st) goto done;
    const int64_t V = ref.n_vocab;
    want = malloc((size_t)(n * V) * sizeof *want);
    without = malloc((size_t)(n * V) * sizeof *without);
    got = malloc((size_t)(n * V) * sizeof *got);
    got_dec = malloc((size_t)(n * V) * sizeof *got_dec);
    make_ids(ids, n, V, seed + 3);
    if (llmref_forward(&ref, ids, n, want)) {
        T_CHECK(0, "%s: reference forward: %s", c->label, llmref_error());
        goto done;
    }
    st = run_logits(m, ids, n, 0, got);
    double rel = st ? INFINITY : rel_l2(got, want, n * V);
    llmref_cmp cmp;
    int close = !st && llmref_compare(c->label, got, want, n, V, ATOL, RTOL, NMSE, &cmp);
    T_CHECK(close && rel <= REL_MAX, "%s: logits vs the double reference: relative L2 %.3g (max %.0e): %s", c->label,
            rel, REL_MAX, st ? dhsa_last_error() : "ok");
    printf("  %-34s relative L2 error %.2e\n", c->label, rel);
    st = run_logits(m, ids, n, 1, got_dec);
    double rel_dec = st ? INFINITY : rel_l2(got_dec, want, n * V);
    T_CHECK(rel_dec <= REL_MAX, "%s: decode token by token: relative L2 %.3g: %s", c->label, rel_dec,
            st ? dhsa_last_error() : "ok");
    /* the tensors matter: the reference without them is far away */
    drop_case_tensors(&ref, c);
    if (!c->fused_qkv || c->out_bias || c->ffn_biases || c->output_bias || (c->biases && strcmp(c->arch, "qwen2"))) {
        llmref_forward(&ref, ids, n, without);
        double d = rel_l2_d(without, want, n * V);
        T_CHECK(d > 0.05, "%s: ignoring the tensors would be visible: relative L2 %.3g", c->label, d);
    }
done:
    dhsa_model_free(m);
    llmref_model_free(&ref);
    free(bytes);
    free(want);
    free(without);
    free(got);
    free(got_dec);
}

static void test_biases(void) {
    static const bias_case cases[] = {
        {"llama attn_output.bias", "llama", LLMREF_F32, 0, 1, 0, 0, 0, 0},
        {"llama ffn_gate/up/down.bias", "llama", LLMREF_F32, 0, 0, 1, 0, 0, 0},
        {"llama attn_q/k/v.bias", "llama", LLMREF_F32, 1, 0, 0, 0, 0, 0},
        {"llama output.bias", "llama", LLMREF_F32, 0, 0, 0, 1, 0, 0},
        {"llama every bias, Q8_0", "llama", LLMREF_Q8_0, 1, 1, 1, 1, 0, 0},
        {"llama every bias, F16 biases", "llama", LLMREF_Q4_K, 1, 1, 1, 1, 0, LLMREF_F16},
        {"qwen2 output.bias", "qwen2", LLMREF_F32, 1, 0, 0, 1, 0, 0},
        {"qwen2 fused attn_qkv + bias", "qwen2", LLMREF_F32, 1, 0, 0, 0, 1, 0},
        {"llama fused attn_qkv, Q4_0", "llama", LLMREF_Q4_0, 0, 0, 0, 0, 1, 0},
        {"gemma2 every bias", "gemma2", LLMREF_F32, 1, 1, 1, 1, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_bias_case(&cases[i], 40 + i);
}

/* ------------------------------------------------------- gemma2 scale --- */

/* The runner against the reference on a model of n_layer layers; with
 * wrong_rule, the reference's scale is swapped to the other rule first and
 * the distance is returned instead. */
static double scale_case(const char *arch, int64_t n_layer, double *ref_scale, int wrong_rule) {
    llmref_spec s = llmref_spec_default(arch, LLMREF_F32);
    s.n_layer = n_layer;
    s.head_dim = 32; /* n_embd / n_head = 16 */
    s.head_dim_v = 32;
    s.n_rot = 32;
    s.seed = 90 + (uint64_t)n_layer;
    uint8_t *bytes = NULL;
    size_t size = 0;
    llmref_model ref;
    memset(&ref, 0, sizeof ref);
    dhsa_model *m = NULL;
    double rel = INFINITY;
    const int64_t n = 12;
    int32_t ids[12];
    if (llmref_fixture_build(&s, &bytes, &size) || llmref_model_load_memory(bytes, size, &ref) ||
        load_bytes(bytes, size, &m) != DHSA_OK) {
        T_CHECK(0, "%s %lld layers: load: %s / %s", arch, (long long)n_layer, llmref_error(), dhsa_last_error());
        goto done;
    }
    *ref_scale = ref.attn_scale;
    if (wrong_rule)
        ref.attn_scale = fabs(ref.attn_scale - 1.0 / sqrt(32.0)) < 1e-12 ? 1.0 / sqrt(16.0) : 1.0 / sqrt(32.0);
    const int64_t V = ref.n_vocab;
    double *want = malloc((size_t)(n * V) * sizeof *want);
    float *got = malloc((size_t)(n * V) * sizeof *got);
    make_ids(ids, n, V, 17);
    if (want && got && llmref_forward(&ref, ids, n, want) == 0 && run_logits(m, ids, n, 0, got) == DHSA_OK)
        rel = rel_l2(got, want, n * V);
    free(want);
    free(got);
done:
    dhsa_model_free(m);
    llmref_model_free(&ref);
    free(bytes);
    return rel;
}

static void test_gemma2_scale(void) {
    double sc = 0;
    double rel = scale_case("gemma2", 46, &sc, 0);
    T_CHECK(fabs(sc - 0.25) < 1e-15, "the reference scales gemma2 46 layers by 1/sqrt(n_embd / n_head) = 1/4: %g", sc);
    T_CHECK(rel <= REL_MAX, "gemma2 46 layers (27B rule): runner vs reference relative L2 %.3g", rel);
    printf("  %-34s relative L2 error %.2e\n", "gemma2 46 layers (27B scale)", rel);
    double wrong = scale_case("gemma2", 46, &sc, 1);
    T_CHECK(wrong > 0.05, "gemma2 46 layers with 1/sqrt(head_dim) is far off: relative L2 %.3g", wrong);
    printf("  %-34s relative L2 error %.2e (the 1/sqrt(head_dim) rule)\n", "gemma2 46 layers", wrong);
    rel = scale_case("gemma2", 45, &sc, 0);
    T_CHECK(fabs(sc - 1.0 / sqrt(32.0)) < 1e-15 && rel <= REL_MAX,
            "gemma2 45 layers keeps 1/sqrt(head_dim) (%g): relative L2 %.3g", sc, rel);
    rel = scale_case("llama", 46, &sc, 0);
    T_CHECK(fabs(sc - 1.0 / sqrt(32.0)) < 1e-15 && rel <= REL_MAX,
            "llama 46 layers keeps 1/sqrt(head_dim) (%g): relative L2 %.3g", sc, rel);
}

/* ------------------------------------------------------ unused tensors --- */

static const char evil_name[] = "blk.0.\x1b[2J\x1b]0;pwned\x07 evil";
static const char evil_shown[] = "blk.0.\\x1b[2J\\x1b]0;pwned\\x07 evil";

/* A fixture of spec s must be refused by the runner and by the reference,
 * both naming `shown` (the name as escaped). */
static void check_refused(const llmref_spec *s, const char *what, const char *shown) {
    uint8_t *bytes = NULL;
    size_t size = 0;
    if (llmref_fixture_build(s, &bytes, &size)) {
        T_CHECK(0, "%s: fixture: %s", what, llmref_error());
        return;
    }
    dhsa_model *m = NULL;
    dhsa_status st = load_bytes(bytes, size, &m);
    const char *e = dhsa_last_error();
    T_CHECK(st == DHSA_ERR_UNSUPPORTED && !m && strstr(e, shown) && no_controls(e),
            "%s: refused naming it (%s): %s", what, dhsa_status_str(st), e);
    llmref_model r;
    int rc = llmref_model_load_memory(bytes, size, &r);
    T_CHECK(rc != 0 && strstr(llmref_error(), shown) && no_controls(llmref_error()),
            "%s: the reference refuses it too: %s", what, rc ? llmref_error() : "loaded");
    if (rc == 0) llmref_model_free(&r);
    dhsa_model_free(m);
    free(bytes);
}

static void test_unused(void) {
    llmref_spec s = llmref_spec_default("llama", LLMREF_F32);
    s.extra_tensor = "blk.1.attn_q_norm.weight"; /* QK-norm: not a llama tensor */
    check_refused(&s, "llama with blk.1.attn_q_norm.weight", "blk.1.attn_q_norm.weight");
    s = llmref_spec_default("gemma2", LLMREF_Q8_0);
    s.extra_tensor = "token_types.weight";
    check_refused(&s, "gemma2 with token_types.weight", "token_types.weight");
    s = llmref_spec_default("qwen2", LLMREF_F32);
    s.fused_qkv = 1;
    s.extra_tensor = "blk.1.attn_k.weight"; /* the fused matrix is used: this one would be ignored */
    check_refused(&s, "qwen2 with fused and separate K", "blk.1.attn_k.weight");
    s = llmref_spec_default("llama", LLMREF_F32);
    s.extra_tensor = evil_name;
    check_refused(&s, "a tensor named with ESC", evil_shown);
    s = llmref_spec_default("llama", LLMREF_F32);
    s.extra_tensor = "rope_freqs.weight"; /* known, but [n_embd] is not its shape: a shape error, by name */
    uint8_t *bytes = NULL;
    size_t size = 0;
    if (!llmref_fixture_build(&s, &bytes, &size)) {
        dhsa_model *m = NULL;
        dhsa_status st = load_bytes(bytes, size, &m);
        T_CHECK(st == DHSA_ERR_SHAPE && strstr(dhsa_last_error(), "rope_freqs.weight"),
                "a known optional tensor of the wrong shape is a shape error: %s", dhsa_last_error());
        dhsa_model_free(m);
        free(bytes);
    }
}

/* Other loader sentences with a file's strings: an architecture, a
 * tokenizer model, a key through a getter. */
static void test_loader_sentences(void) {
    llmref_spec s = llmref_spec_default("llama\x1b[5m", LLMREF_F32);
    uint8_t *bytes = NULL;
    size_t size = 0;
    if (!llmref_fixture_build(&s, &bytes, &size)) {
        dhsa_model *m = NULL;
        dhsa_status st = load_bytes(bytes, size, &m);
        T_CHECK(st == DHSA_ERR_UNSUPPORTED && strstr(dhsa_last_error(), "llama\\x1b[5m") &&
                    no_controls(dhsa_last_error()),
                "an architecture name with ESC is escaped: %s", dhsa_last_error());
        dhsa_model_free(m);
        free(bytes);
    }
    /* a GGUF whose key holds ESC, read with the wrong getter */
    dhsa_gguf_writer *w;
    if (dhsa_gguf_writer_create(&w) == DHSA_OK) {
        const char *key = "evil.\x1b[31mkey";
        dhsa_gguf_writer_set_str(w, key, "x");
        size_t n = 0;
        uint8_t *buf = NULL;
        dhsa_gguf *g = NULL;
        if (dhsa_gguf_writer_size(w, &n) == DHSA_OK && (buf = malloc(n)) &&
            dhsa_gguf_writer_write_memory(w, buf, n) == DHSA_OK && dhsa_gguf_open_memory(buf, n, &g) == DHSA_OK) {
            uint32_t v;
            dhsa_status st = dhsa_gguf_get_u32(g, key, &v);
            T_CHECK(st == DHSA_ERR_FORMAT && strstr(dhsa_last_error(), "evil.\\x1b[31mkey") &&
                        no_controls(dhsa_last_error()),
                    "a key with ESC in a getter's sentence: %s", dhsa_last_error());
        } else {
            T_CHECK(0, "writer: %s", dhsa_last_error());
        }
        dhsa_gguf_close(g);
        free(buf);
        dhsa_gguf_writer_free(w);
    }
}

/* ------------------------------------------------------------- the CLI --- */

#define CLI_CHECKS 5

static void test_cli(void) {
    const char *cli = getenv("DHSA_CLI");
    if (!cli || access(cli, X_OK) != 0) {
        T_SKIP(CLI_CHECKS, "the CLI parts need DHSA_CLI (make test sets it)");
        return;
    }
    char dir[] = "/tmp/dhsa_tensors_XXXXXX";
    if (!mkdtemp(dir)) {
        T_CHECK(0, "mkdtemp");
        return;
    }
    char path[128], gen[128], args[512];
    snprintf(path, sizeof path, "%s/evil.gguf", dir);
    snprintf(gen, sizeof gen, "%s/bias.gguf", dir);
    llmref_spec s = llmref_spec_default("llama", LLMREF_F32);
    s.extra_tensor = evil_name;
    char *out = NULL;
    if (llmref_fixture_write_file(&s, path) == 0) {
        /* inspect lists it, escaped */
        snprintf(args, sizeof args, "inspect '%s'", path);
        int rc = cli_run(args, 0, &out);
        T_CHECK(rc == 0 && out && strstr(out, evil_shown) && !strchr(out, '\x1b') && !strchr(out, '\x07'),
                "dhsa inspect escapes the tensor name: rc %d", rc);
        free(out);
        /* run refuses it, naming it escaped */
        snprintf(args, sizeof args, "run -m '%s' -p hi -n 1", path);
        rc = cli_run(args, 0, &out);
        T_CHECK(rc != 0 && out && strstr(out, evil_shown) && !strchr(out, '\x1b') && !strchr(out, '\x07'),
                "dhsa run refuses it with the name escaped: rc %d: %s", rc, out ? out : "");
        free(out);
    } else {
        T_CHECK(0, "fixture file: %s", llmref_error());
        T_CHECK(0, "(skipped with it)");
    }
    /* gen-model --bias all: every bias is in the file, and both sides apply it */
    snprintf(args, sizeof args, "gen-model -o '%s' --preset tiny --type F32 --bias all", gen);
    int rc = cli_run(args, 0, &out);
    T_CHECK(rc == 0 && out && strstr(out, "biases: qkv out ffn output"), "gen-model --bias all: rc %d: %s", rc,
            out ? out : "");
    free(out);
    dhsa_model *m = NULL;
    llmref_model ref;
    int64_t n_bias = 0;
    if (rc == 0 && dhsa_model_load(gen, NULL, &m) == DHSA_OK && llmref_model_load_file(gen, &ref) == 0) {
        const dhsa_gguf *g = dhsa_model_gguf(m);
        for (int64_t i = 0; i < dhsa_gguf_n_tensors(g); i++) {
            const char *nm = dhsa_gguf_tensor_at(g, i)->name;
            n_bias += strlen(nm) > 5 && strcmp(nm + strlen(nm) - 5, ".bias") == 0;
        }
        const int64_t n = 10, V = ref.n_vocab;
        int32_t ids[10];
        make_ids(ids, n, V, 5);
        double *want = malloc((size_t)(n * V) * sizeof *want);
        float *got = malloc((size_t)(n * V) * sizeof *got);
        double rel = INFINITY;
        if (want && got && llmref_forward(&ref, ids, n, want) == 0 && run_logits(m, ids, n, 0, got) == DHSA_OK)
            rel = rel_l2(got, want, n * V);
        /* 2 layers x (q, k, v, out, gate, up, down) + output */
        T_CHECK(n_bias == 2 * 7 + 1 && rel <= REL_MAX, "gen-model --bias all: %lld bias tensors; runner vs reference "
                "relative L2 %.3g", (long long)n_bias, rel);
        free(want);
        free(got);
        llmref_model_free(&ref);
    } else {
        T_CHECK(0, "gen-model --bias all loads: %s / %s", dhsa_last_error(), llmref_error());
    }
    dhsa_model_free(m);
    snprintf(args, sizeof args, "gen-model -o '%s' --preset tiny --bias qkv,bogus", gen);
    rc = cli_run(args, 0, &out);
    T_CHECK(rc == 2 && out && strstr(out, "bogus"), "gen-model --bias with an unknown part: rc %d", rc);
    free(out);
    unlink(path);
    unlink(gen);
    rmdir(dir);
}

int main(void) {
    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = 2;
    if (dhsa_ctx_create(&cp, &ctx)) {
        printf("test_model_tensors: 0 passed, 1 failed\n");
        return 1;
    }
    test_escape();
    test_biases();
    test_gemma2_scale();
    test_unused();
    test_loader_sentences();
    test_cli();
    dhsa_ctx_free(ctx);
    return t_report("test_model_tensors");
}
