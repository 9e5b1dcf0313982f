/* llm_ref_fixture.h: tiny random GGUF models for the tests (llm_ref.h):
 * llmref_spec, llmref_fixture_build / _write_file, any architecture and
 * weight type, deterministic for a seed, written through the public GGUF
 * writer of dhsa.h. Included by llm_ref.h.
 */
#ifndef DHSA_TESTS_LLM_REF_FIXTURE_H
#define DHSA_TESTS_LLM_REF_FIXTURE_H

#include "dhsa.h"
#include "llm_ref_formats.h"

/* --------------------------------------------------------------------- */
/* Fixtures: tiny random GGUF models                                      */

/* What a fixture holds. Fields that name an optional key: 0 (or NULL)
 * leaves the key out, so the reader's default applies. */
typedef struct {
    const char *arch;          /* general.architecture: "llama", "qwen2", "gemma2", "qwen3", "gemma3",
                                  "phi3" (written as given); qwen3 and gemma3 get attn_q/k_norm, gemma2
                                  and gemma3 post norms, phi3 one ffn_up of 2 n_ff rows (no ffn_gate) */
    uint32_t wtype;            /* ggml type of the layer matrices */
    uint32_t embd_type;        /* token_embd.weight */
    uint32_t output_type;      /* output.weight (when not tied) */
    uint32_t norm_type;        /* norms and biases (F32; F16/BF16 also read) */
    int64_t n_vocab, n_embd, n_layer, n_head, n_ff, n_ctx_train;
    int64_t n_head_kv;         /* 0: key out (= n_head) */
    int64_t head_dim;          /* attention.key_length; 0: key out (= n_embd / n_head) */
    int64_t head_dim_v;        /* attention.value_length; 0: key out (= key length) */
    int64_t n_rot;             /* rope.dimension_count; 0: key out (= key length) */
    double rope_base;          /* rope.freq_base; 0: key out (10000) */
    const char *rope_scaling_type; /* rope.scaling.type; NULL: key out */
    double rope_scaling_factor;    /* rope.scaling.factor; 0: key out */
    int rope_freqs;            /* write rope_freqs.weight [n_rot/2], values in [1, 4) */
    int biases;                /* write attn_q/k/v.bias (qwen2 needs them) */
    int out_bias;              /* write attn_output.bias [n_embd] */
    int ffn_biases;            /* write ffn_gate.bias, ffn_up.bias [n_ff], ffn_down.bias [n_embd] */
    int output_bias;           /* write output.bias [n_vocab] */
    int fused_qkv;             /* one attn_qkv.weight (and attn_qkv.bias with biases) for q, k, v */
    double rms_eps;            /* attention.layer_norm_rms_epsilon; 0: key out */
    double attn_softcap;       /* gemma2.attn_logit_softcapping; 0: key out (50) */
    double final_softcap;      /* gemma2.final_logit_softcapping; 0: key out (30) */
    int64_t sliding_window;    /* A.attention.sliding_window; 0: key out (gemma2 4096, gemma3 none) */
    int64_t swa_pattern;       /* A.attention.sliding_window_pattern; 0: key out (gemma2 2, gemma3 6) */
    const uint8_t *swa_flags;  /* or that key as a BOOL array of n_swa_flags (when swa_pattern is 0) */
    int64_t n_swa_flags;
    double rope_base_swa;      /* A.rope.freq_base_swa; 0: key out */
    int rope_factors;          /* write rope_factors_long/short.weight [n_rot/2], values in [1, 4) */
    double rope_attn_factor;   /* A.rope.scaling.attn_factor; 0: key out (1) */
    int64_t n_ctx_orig;        /* A.rope.scaling.original_context_length; 0: key out (n_ctx_train) */
    int tied;                  /* 1: no output.weight */
    dhsa_gguf_type int_type;   /* type of the integer keys; 0 (UINT8, too small) means UINT32 */
    int f64_keys;              /* 1: float keys as FLOAT64 (else FLOAT32) */
    const char *omit_tensor;   /* leave this tensor out (loader tests); NULL: none */
    const char *extra_tensor;  /* add a tensor of this name, [n_embd] (loader tests); NULL: none */
    double k_bias_big;         /* with biases: attn_k.bias is this (alternating sign per KV head) on
                                  channels n_rot/2 - 1 and n_rot - 1 of each KV head, the pair NeoX
                                  RoPE turns slowest, as in Qwen2.5's (0: plain random biases) */
    uint64_t seed;
} llmref_spec;

/* A small spec for arch and matrix type. The float types and the 32-blocks
 * get n_embd 64, n_ff 96, 4 query heads of 16 on 2 KV heads; the K types
 * (rows must be multiples of 256) n_embd 256, n_ff 512, 4 heads of 64 on 2.
 * n_vocab 320 (3 control, 256 byte tokens, 61 pieces), 2 layers, separate
 * output, every optional key written except rope scaling; qwen2 gets
 * biases; gemma2 gets caps small enough to act (attn 5, final 3) and a
 * window of 5; gemma3 a window of 5 on every other layer (pattern 2, so
 * both kinds of layer are among the two) with a local RoPE base of 1000;
 * phi3 a fused attn_qkv. */
static inline llmref_spec llmref_spec_default(const char *arch, uint32_t wtype) {
    llmref_spec s;
    memset(&s, 0, sizeof s);
    int kq = llmref_type_block(wtype) == 256;
    s.arch = arch;
    s.wtype = s.embd_type = s.output_type = wtype;
    s.norm_type = LLMREF_F32;
    s.n_vocab = 320;
    s.n_embd = kq ? 256 : 64;
    s.n_ff = kq ? 512 : 96;
    s.n_layer = 2;
    s.n_head = 4;
    s.n_head_kv = 2;
    s.head_dim = kq ? 64 : 16;
    s.head_dim_v = s.head_dim;
    s.n_rot = s.head_dim;
    s.n_ctx_train = 256;
    s.rope_base = 10000;
    s.rms_eps = strcmp(arch, "gemma2") == 0 || strcmp(arch, "gemma3") == 0 ? 1e-6 : 1e-5;
    s.biases = strcmp(arch, "qwen2") == 0;
    if (strcmp(arch, "gemma2") == 0) {
        s.attn_softcap = 5;
        s.final_softcap = 3;
        s.sliding_window = 5;
    }
    if (strcmp(arch, "gemma3") == 0) {
        s.sliding_window = 5;
        s.swa_pattern = 2;
        s.rope_base_swa = 1000;
    }
    s.fused_qkv = strcmp(arch, "phi3") == 0;
    s.int_type = DHSA_GGUF_UINT32;
    s.seed = 1;
    return s;
}

/* The sizes a spec implies (defaults applied as the reader would). */
static inline void llmref__spec_dims(const llmref_spec *s, int64_t *n_kv, int64_t *hdk, int64_t *hdv, int64_t *rot) {
    *n_kv = s->n_head_kv ? s->n_head_kv : s->n_head;
    *hdk = s->head_dim ? s->head_dim : (s->n_head ? s->n_embd / s->n_head : 0);
    *hdv = s->head_dim_v ? s->head_dim_v : *hdk;
    *rot = s->n_rot ? s->n_rot : *hdk;
}

/* Token texts of a fixture vocabulary (n strings, malloc'd, and an array of
 * them): <unk>, <s>, </s>, <0x00>..<0xFF> when n >= 288, then
 * pieces: words ("▁the", ...), letters, "▁", ",", ".", then "▁w<i>". */
#define LLMREF_SPACE "\xe2\x96\x81" /* U+2581, the SentencePiece space */
static inline char **llmref__vocab(int64_t n, float *scores, int32_t *types) {
    static const char *const words[] = {
        LLMREF_SPACE "the",  LLMREF_SPACE "a",     LLMREF_SPACE "and",    LLMREF_SPACE "to",    LLMREF_SPACE "was",
        LLMREF_SPACE "he",   LLMREF_SPACE "she",   LLMREF_SPACE "it",     LLMREF_SPACE "of",    LLMREF_SPACE "in",
        LLMREF_SPACE "time", LLMREF_SPACE "once",  LLMREF_SPACE "upon",   LLMREF_SPACE "there", LLMREF_SPACE "little",
        LLMREF_SPACE "girl", LLMREF_SPACE "named", LLMREF_SPACE "play",   LLMREF_SPACE "park",  LLMREF_SPACE,
        ",",                ".",                 "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m",
        "n", "o", "p", "q", "r", "s", "t", "u", "v", "w", "x", "y", "z"};
    const int64_t n_words = (int64_t)(sizeof words / sizeof words[0]);
    char **tok = calloc((size_t)n, sizeof *tok);
    if (!tok) return NULL;
    int bytes = n >= 259 + 29;
    for (int64_t i = 0; i < n; i++) {
        char buf[32];
        int32_t type = DHSA_TOKEN_NORMAL;
        float score = 0;
        static const char *const special[3] = {"<unk>", "<s>", "</s>"};
        if (i < 3) {
            snprintf(buf, sizeof buf, "%s", special[i]);
            type = i == 0 ? DHSA_TOKEN_UNKNOWN : DHSA_TOKEN_CONTROL;
        } else if (bytes && i < 259) {
            snprintf(buf, sizeof buf, "<0x%02X>", (unsigned)(i - 3));
            type = DHSA_TOKEN_BYTE;
        } else {
            int64_t wi = i - (bytes ? 259 : 3);
            if (wi < n_words) snprintf(buf, sizeof buf, "%s", words[wi]);
            else snprintf(buf, sizeof buf, LLMREF_SPACE "w%lld", (long long)wi);
            score = -(float)wi;
        }
        tok[i] = malloc(strlen(buf) + 1);
        if (!tok[i]) {
            for (int64_t j = 0; j < i; j++) free(tok[j]);
            free(tok);
            return NULL;
        }
        strcpy(tok[i], buf);
        scores[i] = score;
        types[i] = type;
    }
    return tok;
}

/* Builder state: the writer borrows tensor bytes until the write. */
typedef struct {
    dhsa_gguf_writer *w;
    void **bufs;
    int64_t n_bufs, cap_bufs;
    const llmref_spec *s;
    int failed;
} llmref__fx;

static inline void llmref__fx_tensor(llmref__fx *fx, const char *name, uint32_t type, int64_t n_in, int64_t n_out,
                                     int kind /* 0 matrix, 1 norm, 2 bias, 3 rope_freqs */) {
    if (fx->failed) return;
    if (fx->s->omit_tensor && strcmp(fx->s->omit_tensor, name) == 0) return;
    int64_t n = n_in * (n_out ? n_out : 1);
    int64_t bytes = llmref_type_bytes(type, n);
    if (bytes < 0 || (n_in % llmref_type_block(type))) {
        fx->failed = llmref__fail("fixture: %s [%lld, %lld] cannot be stored as %s (rows of %lld values)", name,
                                  (long long)n_in, (long long)n_out, llmref_type_name(type),
                                  (long long)llmref_type_block(type));
        return;
    }
    double *val = malloc((size_t)n * sizeof *val);
    void *buf = malloc((size_t)(bytes ? bytes : 1));
    if (fx->n_bufs == fx->cap_bufs) {
        int64_t cap = fx->cap_bufs * 2 + 16;
        void **nb = realloc(fx->bufs, (size_t)cap * sizeof *nb);
        if (nb) {
            fx->bufs = nb;
            fx->cap_bufs = cap;
        }
    }
    if (!val || !buf || fx->n_bufs == fx->cap_bufs) {
        free(val);
        free(buf);
        fx->failed = llmref__fail("fixture: out of memory");
        return;
    }
    fx->bufs[fx->n_bufs++] = buf;
    uint64_t st = llmref__hash(fx->s->seed, name); /* per tensor: the others' presence changes nothing */
    double sd = 1.0 / sqrt((double)n_in);
    for (int64_t i = 0; i < n; i++) {
        switch (kind) {
        case 0: val[i] = sd * llmref_rand_normal(&st); break;
        case 1: val[i] = 0.8 + 0.4 * llmref_rand_uniform(&st); break;
        case 2: val[i] = 0.3 * (2.0 * llmref_rand_uniform(&st) - 1.0); break;
        default: val[i] = 1.0 + 3.0 * llmref_rand_uniform(&st); break;
        }
    }
    if (kind == 2 && fx->s->k_bias_big != 0 && strstr(name, "attn_k.bias")) {
        int64_t n_kv, hdk, hdv, rot;
        llmref__spec_dims(fx->s, &n_kv, &hdk, &hdv, &rot);
        for (int64_t h = 0; h < n_kv; h++) {
            double big = h % 2 ? -fx->s->k_bias_big : fx->s->k_bias_big;
            val[h * hdk + rot / 2 - 1] = big;
            val[h * hdk + rot - 1] = 0.8 * big;
        }
    }
    int rc = llmref_quantize(type, val, n, buf);
    free(val);
    if (rc) {
        fx->failed = -1;
        return;
    }
    int64_t dims[2] = {n_in, n_out};
    if (dhsa_gguf_writer_add_tensor(fx->w, name, type, n_out ? 2 : 1, dims, buf, bytes) != DHSA_OK)
        fx->failed = llmref__fail("fixture: add %s: %s", name, dhsa_last_error());
}

static inline void llmref__fx_int(llmref__fx *fx, const char *key, int64_t v) {
    if (fx->failed) return;
    dhsa_status st;
    switch (fx->s->int_type) {
    case DHSA_GGUF_UINT16: st = dhsa_gguf_writer_set_u16(fx->w, key, (uint16_t)v); break;
    case DHSA_GGUF_INT16: st = dhsa_gguf_writer_set_i16(fx->w, key, (int16_t)v); break;
    case DHSA_GGUF_INT32: st = dhsa_gguf_writer_set_i32(fx->w, key, (int32_t)v); break;
    case DHSA_GGUF_UINT64: st = dhsa_gguf_writer_set_u64(fx->w, key, (uint64_t)v); break;
    case DHSA_GGUF_INT64: st = dhsa_gguf_writer_set_i64(fx->w, key, v); break;
    default: st = dhsa_gguf_writer_set_u32(fx->w, key, (uint32_t)v); break;
    }
    if (st != DHSA_OK) fx->failed = llmref__fail("fixture: set %s: %s", key, dhsa_last_error());
}

static inline void llmref__fx_float(llmref__fx *fx, const char *key, double v) {
    if (fx->failed) return;
    dhsa_status st = fx->s->f64_keys ? dhsa_gguf_writer_set_f64(fx->w, key, v)
                                     : dhsa_gguf_writer_set_f32(fx->w, key, (float)v);
    if (st != DHSA_OK) fx->failed = llmref__fail("fixture: set %s: %s", key, dhsa_last_error());
}

static inline void llmref__fx_str(llmref__fx *fx, const char *key, const char *v) {
    if (fx->failed) return;
    if (dhsa_gguf_writer_set_str(fx->w, key, v) != DHSA_OK)
        fx->failed = llmref__fail("fixture: set %s: %s", key, dhsa_last_error());
}

/* Builds the GGUF file of spec s in memory: *bytes (malloc'd, the caller
 * frees) of *size bytes. Weights are random and deterministic for
 * (seed, tensor name): matrices ~ N(0, 1/n_in) (token_embd and output
 * too, so logits stay O(1)), norms uniform in [0.8, 1.2), biases in
 * [-0.3, 0.3), stored in the spec's types. Metadata: the architecture's
 * keys and a SentencePiece ("llama") vocabulary of n_vocab tokens with
 * scores, token types and bos 1 / eos 2 / unk 0. -1 with llmref_error()
 * when the spec cannot be written (e.g. a K type with rows not a multiple
 * of 256). */
static inline int llmref_fixture_build(const llmref_spec *s, uint8_t **bytes, size_t *size) {
    *bytes = NULL;
    *size = 0;
    int64_t n_kv, hdk, hdv, rot;
    llmref__spec_dims(s, &n_kv, &hdk, &hdv, &rot);
    if (!s->arch || s->n_vocab < 3 || s->n_embd < 1 || s->n_layer < 1 || s->n_head < 1 || s->n_ff < 1 ||
        hdk < 1 || hdv < 1 || rot < 0 || rot % 2)
        return llmref__fail("fixture: bad spec (arch %s, n_vocab %lld, n_embd %lld, n_head %lld, hd %lld, n_rot %lld)",
                            s->arch ? s->arch : "NULL", (long long)s->n_vocab, (long long)s->n_embd,
                            (long long)s->n_head, (long long)hdk, (long long)rot);
    llmref__fx fx;
    memset(&fx, 0, sizeof fx);
    fx.s = s;
    if (dhsa_gguf_writer_create(&fx.w) != DHSA_OK) return llmref__fail("fixture: %s", dhsa_last_error());
    const char *A = s->arch;
    char key[160], name[96];
#define LLMREF_K(suffix) (snprintf(key, sizeof key, "%s.%s", A, suffix), key)
    llmref__fx_str(&fx, "general.architecture", A);
    llmref__fx_str(&fx, "general.name", "llmref fixture");
    llmref__fx_int(&fx, LLMREF_K("context_length"), s->n_ctx_train);
    llmref__fx_int(&fx, LLMREF_K("embedding_length"), s->n_embd);
    llmref__fx_int(&fx, LLMREF_K("block_count"), s->n_layer);
    llmref__fx_int(&fx, LLMREF_K("feed_forward_length"), s->n_ff);
    llmref__fx_int(&fx, LLMREF_K("attention.head_count"), s->n_head);
    if (s->n_head_kv) llmref__fx_int(&fx, LLMREF_K("attention.head_count_kv"), s->n_head_kv);
    if (s->head_dim) llmref__fx_int(&fx, LLMREF_K("attention.key_length"), s->head_dim);
    if (s->head_dim_v) llmref__fx_int(&fx, LLMREF_K("attention.value_length"), s->head_dim_v);
    if (s->n_rot) llmref__fx_int(&fx, LLMREF_K("rope.dimension_count"), s->n_rot);
    if (s->rms_eps != 0) llmref__fx_float(&fx, LLMREF_K("attention.layer_norm_rms_epsilon"), s->rms_eps);
    if (s->rope_base != 0) llmref__fx_float(&fx, LLMREF_K("rope.freq_base"), s->rope_base);
    if (s->rope_scaling_type) llmref__fx_str(&fx, LLMREF_K("rope.scaling.type"), s->rope_scaling_type);
    if (s->rope_scaling_factor != 0) llmref__fx_float(&fx, LLMREF_K("rope.scaling.factor"), s->rope_scaling_factor);
    if (s->attn_softcap != 0) llmref__fx_float(&fx, LLMREF_K("attn_logit_softcapping"), s->attn_softcap);
    if (s->final_softcap != 0) llmref__fx_float(&fx, LLMREF_K("final_logit_softcapping"), s->final_softcap);
    if (s->sliding_window) llmref__fx_int(&fx, LLMREF_K("attention.sliding_window"), s->sliding_window);
    if (s->swa_pattern) llmref__fx_int(&fx, LLMREF_K("attention.sliding_window_pattern"), s->swa_pattern);
    if (!s->swa_pattern && s->swa_flags && !fx.failed &&
        dhsa_gguf_writer_set_arr(fx.w, LLMREF_K("attention.sliding_window_pattern"), DHSA_GGUF_BOOL, s->swa_flags,
                                 s->n_swa_flags) != DHSA_OK)
        fx.failed = llmref__fail("fixture: set %s: %s", key, dhsa_last_error());
    if (s->rope_base_swa != 0) llmref__fx_float(&fx, LLMREF_K("rope.freq_base_swa"), s->rope_base_swa);
    if (s->rope_attn_factor != 0) llmref__fx_float(&fx, LLMREF_K("rope.scaling.attn_factor"), s->rope_attn_factor);
    if (s->n_ctx_orig) llmref__fx_int(&fx, LLMREF_K("rope.scaling.original_context_length"), s->n_ctx_orig);
#undef LLMREF_K

    /* vocabulary */
    float *scores = malloc((size_t)s->n_vocab * sizeof *scores);
    int32_t *types = malloc((size_t)s->n_vocab * sizeof *types);
    char **tok = scores && types ? llmref__vocab(s->n_vocab, scores, types) : NULL;
    if (!tok && !fx.failed) fx.failed = llmref__fail("fixture: out of memory");
    llmref__fx_str(&fx, "tokenizer.ggml.model", "llama");
    if (!fx.failed &&
        (dhsa_gguf_writer_set_arr_str(fx.w, "tokenizer.ggml.tokens", (const char *const *)tok, s->n_vocab) ||
         dhsa_gguf_writer_set_arr(fx.w, "tokenizer.ggml.scores", DHSA_GGUF_FLOAT32, scores, s->n_vocab) ||
         dhsa_gguf_writer_set_arr(fx.w, "tokenizer.ggml.token_type", DHSA_GGUF_INT32, types, s->n_vocab) ||
         dhsa_gguf_writer_set_u32(fx.w, "tokenizer.ggml.bos_token_id", 1) ||
         dhsa_gguf_writer_set_u32(fx.w, "tokenizer.ggml.eos_token_id", 2) ||
         dhsa_gguf_writer_set_u32(fx.w, "tokenizer.ggml.unknown_token_id", 0)))
        fx.failed = llmref__fail("fixture: tokenizer keys: %s", dhsa_last_error());
    if (tok)
        for (int64_t i = 0; i < s->n_vocab; i++) free(tok[i]);
    free(tok);
    free(scores);
    free(types);

    /* tensors */
    int64_t E = s->n_embd;
    llmref__fx_tensor(&fx, "token_embd.weight", s->embd_type, E, s->n_vocab, 0);
    llmref__fx_tensor(&fx, "output_norm.weight", s->norm_type, E, 0, 1);
    if (!s->tied) llmref__fx_tensor(&fx, "output.weight", s->output_type, E, s->n_vocab, 0);
    if (s->output_bias) llmref__fx_tensor(&fx, "output.bias", s->norm_type, s->n_vocab, 0, 2);
    if (s->extra_tensor) llmref__fx_tensor(&fx, s->extra_tensor, LLMREF_F32, E, 0, 1);
    if (s->rope_freqs) llmref__fx_tensor(&fx, "rope_freqs.weight", LLMREF_F32, rot / 2, 0, 3);
    if (s->rope_factors) {
        llmref__fx_tensor(&fx, "rope_factors_long.weight", LLMREF_F32, rot / 2, 0, 3);
        llmref__fx_tensor(&fx, "rope_factors_short.weight", LLMREF_F32, rot / 2, 0, 3);
    }
    int gemma = strcmp(A, "gemma2") == 0 || strcmp(A, "gemma3") == 0;
    int qk_norm = strcmp(A, "qwen3") == 0 || strcmp(A, "gemma3") == 0, fused_ffn = strcmp(A, "phi3") == 0;
    for (int64_t l = 0; l < s->n_layer; l++) {
#define LLMREF_N(suffix) (snprintf(name, sizeof name, "blk.%lld.%s", (long long)l, suffix), name)
        llmref__fx_tensor(&fx, LLMREF_N("attn_norm.weight"), s->norm_type, E, 0, 1);
        if (s->fused_qkv) {
            llmref__fx_tensor(&fx, LLMREF_N("attn_qkv.weight"), s->wtype, E, (s->n_head + n_kv) * hdk + n_kv * hdv, 0);
        } else {
            llmref__fx_tensor(&fx, LLMREF_N("attn_q.weight"), s->wtype, E, s->n_head * hdk, 0);
            llmref__fx_tensor(&fx, LLMREF_N("attn_k.weight"), s->wtype, E, n_kv * hdk, 0);
            llmref__fx_tensor(&fx, LLMREF_N("attn_v.weight"), s->wtype, E, n_kv * hdv, 0);
        }
        if (s->biases && s->fused_qkv) {
            llmref__fx_tensor(&fx, LLMREF_N("attn_qkv.bias"), s->norm_type, (s->n_head + n_kv) * hdk + n_kv * hdv, 0, 2);
        } else if (s->biases) {
            llmref__fx_tensor(&fx, LLMREF_N("attn_q.bias"), s->norm_type, s->n_head * hdk, 0, 2);
            llmref__fx_tensor(&fx, LLMREF_N("attn_k.bias"), s->norm_type, n_kv * hdk, 0, 2);
            llmref__fx_tensor(&fx, LLMREF_N("attn_v.bias"), s->norm_type, n_kv * hdv, 0, 2);
        }
        if (qk_norm) {
            llmref__fx_tensor(&fx, LLMREF_N("attn_q_norm.weight"), s->norm_type, hdk, 0, 1);
            llmref__fx_tensor(&fx, LLMREF_N("attn_k_norm.weight"), s->norm_type, hdk, 0, 1);
        }
        llmref__fx_tensor(&fx, LLMREF_N("attn_output.weight"), s->wtype, s->n_head * hdv, E, 0);
        if (s->out_bias) llmref__fx_tensor(&fx, LLMREF_N("attn_output.bias"), s->norm_type, E, 0, 2);
        if (gemma) llmref__fx_tensor(&fx, LLMREF_N("post_attention_norm.weight"), s->norm_type, E, 0, 1);
        llmref__fx_tensor(&fx, LLMREF_N("ffn_norm.weight"), s->norm_type, E, 0, 1);
        if (fused_ffn) {
            llmref__fx_tensor(&fx, LLMREF_N("ffn_up.weight"), s->wtype, E, 2 * s->n_ff, 0);
        } else {
            llmref__fx_tensor(&fx, LLMREF_N("ffn_gate.weight"), s->wtype, E, s->n_ff, 0);
            llmref__fx_tensor(&fx, LLMREF_N("ffn_up.weight"), s->wtype, E, s->n_ff, 0);
        }
        llmref__fx_tensor(&fx, LLMREF_N("ffn_down.weight"), s->wtype, s->n_ff, E, 0);
        if (s->ffn_biases && fused_ffn) {
            llmref__fx_tensor(&fx, LLMREF_N("ffn_up.bias"), s->norm_type, 2 * s->n_ff, 0, 2);
            llmref__fx_tensor(&fx, LLMREF_N("ffn_down.bias"), s->norm_type, E, 0, 2);
        } else if (s->ffn_biases) {
            llmref__fx_tensor(&fx, LLMREF_N("ffn_gate.bias"), s->norm_type, s->n_ff, 0, 2);
            llmref__fx_tensor(&fx, LLMREF_N("ffn_up.bias"), s->norm_type, s->n_ff, 0, 2);
            llmref__fx_tensor(&fx, LLMREF_N("ffn_down.bias"), s->norm_type, E, 0, 2);
        }
        if (gemma) llmref__fx_tensor(&fx, LLMREF_N("post_ffw_norm.weight"), s->norm_type, E, 0, 1);
#undef LLMREF_N
    }

    if (!fx.failed) {
        size_t n = 0;
        if (dhsa_gguf_writer_size(fx.w, &n) != DHSA_OK || !(*bytes = malloc(n)) ||
            dhsa_gguf_writer_write_memory(fx.w, *bytes, n) != DHSA_OK) {
            fx.failed = llmref__fail("fixture: write: %s", dhsa_last_error());
            free(*bytes);
            *bytes = NULL;
        } else {
            *size = n;
        }
    }
    for (int64_t i = 0; i < fx.n_bufs; i++) free(fx.bufs[i]);
    free(fx.bufs);
    dhsa_gguf_writer_free(fx.w);
    return fx.failed ? -1 : 0;
}

/* The fixture of s as a dhsa model in memory: *bytes (the caller frees it
 * after dhsa_model_free(*m), which also closes the GGUF view). On failure
 * -1 with *m NULL and *bytes freed; llmref_error() and dhsa_last_error()
 * say why. */
static inline int llmref_fixture_model(const llmref_spec *s, uint8_t **bytes, dhsa_model **m) {
    size_t n = 0;
    dhsa_gguf *g = NULL;
    *bytes = NULL;
    *m = NULL;
    if (llmref_fixture_build(s, bytes, &n) == 0 && dhsa_gguf_open_memory(*bytes, n, &g) == DHSA_OK &&
        dhsa_model_from_gguf(g, NULL, m) == DHSA_OK)
        return 0;
    free(*bytes);
    *bytes = NULL;
    *m = NULL;
    return -1;
}

/* The fixture of s written to path. */
static inline int llmref_fixture_write_file(const llmref_spec *s, const char *path) {
    uint8_t *b;
    size_t n;
    if (llmref_fixture_build(s, &b, &n)) return -1;
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(b, 1, n, f) == n;
    if (f && fclose(f) != 0) ok = 0;
    free(b);
    return ok ? 0 : llmref__fail("fixture: cannot write %s", path);
}

#endif
