/* llm_ref_model.h: the reference's model (llm_ref.h): llmref_model, plain
 * data a test may build or change by hand, read from an open dhsa_gguf
 * (every architecture and optional tensor of docs/model.md; a tensor it
 * does not read is an error naming it) or from a llama2.c checkpoint.
 * Uses only the public GGUF reader of dhsa.h. Included by llm_ref.h.
 */
#ifndef DHSA_TESTS_LLM_REF_MODEL_H
#define DHSA_TESTS_LLM_REF_MODEL_H

#include "dhsa.h"
#include "llm_ref_formats.h"

/* --------------------------------------------------------------------- */
/* The model                                                              */

typedef enum {
    LLMREF_ARCH_LLAMA = 1,
    LLMREF_ARCH_QWEN2 = 2,
    LLMREF_ARCH_GEMMA2 = 3,
    LLMREF_ARCH_QWEN3 = 4,
    LLMREF_ARCH_GEMMA3 = 5,
    LLMREF_ARCH_PHI3 = 6
} llmref_arch;

static inline int llmref__gemma(llmref_arch a) { return a == LLMREF_ARCH_GEMMA2 || a == LLMREF_ARCH_GEMMA3; }

/* One block. Matrices are row-major [n_out][n_in] (a GGUF [n_in, n_out]
 * tensor as stored); NULL = absent. */
typedef struct {
    double *attn_norm;      /* [n_embd] */
    double *wq;             /* [n_head*hd_k][n_embd] */
    double *wk;             /* [n_head_kv*hd_k][n_embd] */
    double *wv;             /* [n_head_kv*hd_v][n_embd] */
    double *bq, *bk, *bv;   /* [n_head*hd_k], [n_head_kv*hd_k], [n_head_kv*hd_v]; NULL = no bias */
    double *wo;             /* [n_embd][n_head*hd_v] */
    double *bo;             /* [n_embd] attn_output.bias; NULL = none */
    double *post_attn_norm; /* [n_embd]; NULL = none (gemma2 has it) */
    double *ffn_norm;       /* [n_embd] */
    double *w_gate, *w_up;  /* [n_ff][n_embd] */
    double *w_down;         /* [n_embd][n_ff] */
    double *b_gate, *b_up;  /* [n_ff] ffn_gate.bias, ffn_up.bias; NULL = none */
    double *b_down;         /* [n_embd] ffn_down.bias; NULL = none */
    double *post_ffw_norm;  /* [n_embd]; NULL = none (gemma2 has it) */
    double *q_norm, *k_norm; /* [hd_k]: each head of q and k is RMS-normed with it before RoPE; NULL = none */
} llmref_layer;

/* The whole model. The loader sets every field from the file and
 * docs/model.md; a test may change any of them (e.g. rope_neox = 1 on a
 * llama model) to get a deliberately wrong or an equivalent variant. */
typedef struct {
    llmref_arch arch;
    int64_t n_vocab, n_ctx_train, n_embd, n_layer, n_ff;
    int64_t n_head, n_head_kv, hd_k, hd_v, n_rot;
    double rms_eps;
    double rope_base;       /* theta */
    double rope_factor;     /* linear scaling: positions are divided by it (1 = none) */
    int rope_neox;          /* 0: pairs (2i, 2i+1) (llama); 1: (i, i + n_rot/2) (qwen2, gemma2) */
    double embd_scale;      /* x = token_embd[t] * embd_scale (gemma2 sqrt(n_embd), else 1) */
    double attn_scale;      /* scores = q.k * attn_scale (1/sqrt(hd_k); gemma2 with 46 layers
                               1/sqrt(n_embd / n_head)) */
    double attn_softcap;    /* s = cap tanh(s / cap); 0 = none */
    double final_softcap;   /* same on the logits; 0 = none */
    int64_t sliding_window; /* > 0: the sliding layers (below) see keys at p' > p - window */
    int64_t swa_pattern;    /* which layers slide, as llama.cpp's pattern n: l % n < n - 1 (0: all,
                               -1: none); gemma2 2 (the even layers), gemma3 6 (5 in 6) */
    uint8_t *swa;           /* or one flag per layer [n_layer] (NULL: the pattern decides) */
    double rope_base_swa;   /* theta of the sliding layers (gemma2: rope_base; gemma3: 10000) */
    double rope_factor_swa; /* their linear factor (gemma2: rope_factor; gemma3: 1) */
    double rope_attn_factor; /* rotated q, k values are multiplied by it (rope.scaling.attn_factor; 1 = none) */
    int64_t n_ctx_orig;     /* rope.scaling.original_context_length (LongRoPE: above it, the long factors) */
    int gelu;               /* FFN activation: 1 GELU (tanh form, gemma2/3), 0 SiLU */
    /* Which optional arrays llmref_model_alloc allocates. */
    int has_biases;         /* bq, bk, bv in every layer */
    int has_mlp_biases;     /* bo, b_gate, b_up, b_down in every layer */
    int has_output_bias;    /* output_bias */
    int has_post_norms;     /* post_attn_norm, post_ffw_norm in every layer */
    int has_rope_freqs;     /* rope_freqs */
    int has_qk_norm;        /* q_norm, k_norm in every layer (qwen3, gemma3) */
    int tied;               /* output == tok_embd */
    double *tok_embd;       /* [n_vocab][n_embd] */
    double *output_norm;    /* [n_embd] */
    double *output;         /* [n_vocab][n_embd]; the tok_embd pointer when tied */
    double *output_bias;    /* [n_vocab] output.bias; NULL = none */
    double *rope_freqs;     /* [n_rot/2]: theta_i is divided by it; NULL = none */
    double *rope_long, *rope_short; /* [n_rot/2] rope_factors_long/short; NULL = none */
    const double *rope_factors; /* the LongRoPE factors in use, divided like rope_freqs (when that is
                               NULL): rope_short as loaded; llmref_model_set_ctx picks by context */
    llmref_layer *layers;   /* [n_layer] */
} llmref_model;

/* Frees every array of m (NULL pointers are skipped) and zeroes m. The
 * arrays must come from malloc (llmref_model_alloc, or a test's own). */
static inline void llmref_model_free(llmref_model *m) {
    if (!m) return;
    if (m->layers) {
        for (int64_t l = 0; l < m->n_layer; l++) {
            llmref_layer *L = &m->layers[l];
            double *arrs[] = {L->attn_norm, L->wq, L->wk,       L->wv,     L->bq,     L->bk,
                              L->bv,        L->wo, L->post_attn_norm, L->ffn_norm, L->w_gate, L->w_up,
                              L->w_down,    L->post_ffw_norm, L->bo, L->b_gate, L->b_up, L->b_down,
                              L->q_norm,    L->k_norm};
            for (size_t i = 0; i < sizeof arrs / sizeof arrs[0]; i++) free(arrs[i]);
        }
        free(m->layers);
    }
    if (m->output != m->tok_embd) free(m->output);
    free(m->tok_embd);
    free(m->output_norm);
    free(m->output_bias);
    free(m->rope_freqs);
    free(m->rope_long);
    free(m->rope_short);
    free(m->swa);
    memset(m, 0, sizeof *m);
}

static inline double *llmref__zeros(int64_t n, int *ok) {
    double *p = calloc((size_t)(n > 0 ? n : 1), sizeof *p);
    if (!p) *ok = 0;
    return p;
}

/* Allocates every weight array the hyperparameters and has_* / tied flags
 * of m call for, zero-filled (norms too; rope_freqs filled with 1), and
 * overwrites the pointers (whatever they held is not freed). -1 when out
 * of memory (m is freed then). */
static inline int llmref_model_alloc(llmref_model *m) {
    int ok = 1;
    int64_t E = m->n_embd, F = m->n_ff, dq = m->n_head * m->hd_k, dk = m->n_head_kv * m->hd_k,
            dv = m->n_head_kv * m->hd_v, da = m->n_head * m->hd_v;
    m->layers = NULL;
    m->rope_freqs = NULL;
    m->rope_long = m->rope_short = NULL;
    m->rope_factors = NULL;
    m->swa = NULL;
    m->tok_embd = llmref__zeros(m->n_vocab * E, &ok);
    m->output_norm = llmref__zeros(E, &ok);
    m->output = m->tied ? m->tok_embd : llmref__zeros(m->n_vocab * E, &ok);
    m->output_bias = m->has_output_bias ? llmref__zeros(m->n_vocab, &ok) : NULL;
    if (m->has_rope_freqs) {
        m->rope_freqs = llmref__zeros(m->n_rot / 2, &ok);
        if (m->rope_freqs)
            for (int64_t i = 0; i < m->n_rot / 2; i++) m->rope_freqs[i] = 1;
    }
    m->layers = calloc((size_t)(m->n_layer > 0 ? m->n_layer : 1), sizeof *m->layers);
    if (!m->layers) ok = 0;
    for (int64_t l = 0; ok && l < m->n_layer; l++) {
        llmref_layer *L = &m->layers[l];
        L->attn_norm = llmref__zeros(E, &ok);
        L->wq = llmref__zeros(dq * E, &ok);
        L->wk = llmref__zeros(dk * E, &ok);
        L->wv = llmref__zeros(dv * E, &ok);
        if (m->has_biases) {
            L->bq = llmref__zeros(dq, &ok);
            L->bk = llmref__zeros(dk, &ok);
            L->bv = llmref__zeros(dv, &ok);
        }
        L->wo = llmref__zeros(E * da, &ok);
        L->ffn_norm = llmref__zeros(E, &ok);
        L->w_gate = llmref__zeros(F * E, &ok);
        L->w_up = llmref__zeros(F * E, &ok);
        L->w_down = llmref__zeros(E * F, &ok);
        if (m->has_mlp_biases) {
            L->bo = llmref__zeros(E, &ok);
            L->b_gate = llmref__zeros(F, &ok);
            L->b_up = llmref__zeros(F, &ok);
            L->b_down = llmref__zeros(E, &ok);
        }
        if (m->has_post_norms) {
            L->post_attn_norm = llmref__zeros(E, &ok);
            L->post_ffw_norm = llmref__zeros(E, &ok);
        }
        if (m->has_qk_norm) {
            L->q_norm = llmref__zeros(m->hd_k, &ok);
            L->k_norm = llmref__zeros(m->hd_k, &ok);
        }
    }
    if (!ok) {
        llmref_model_free(m);
        return llmref__fail("model: out of memory");
    }
    return 0;
}

/* Sets the fields docs/model.md derives from the architecture and the
 * sizes (call after n_embd, n_head, n_layer and hd_k are set): RoPE
 * pairing, embedding scale, activation, attention scale, q/k norms, which
 * layers slide, and the RoPE of the sliding layers (rope_base_swa = 10000
 * for gemma3, else rope_base; call after rope_base and rope_factor are
 * set) and an attn_factor of 1. The scale is 1/sqrt(hd_k), except for a
 * gemma2 of 46 layers and a gemma3 of 62 (Gemma 2 and 3 27B, whose
 * query_pre_attn_scalar is n_embd / n_head, integer division, not the head
 * dim): 1/sqrt(n_embd / n_head). Does not touch eps, caps or window. */
static inline void llmref_model_derive(llmref_model *m) {
    int gemma = llmref__gemma(m->arch);
    m->rope_neox = m->arch != LLMREF_ARCH_LLAMA;
    m->embd_scale = gemma ? sqrt((double)m->n_embd) : 1.0;
    m->gelu = gemma;
    m->has_qk_norm = m->arch == LLMREF_ARCH_QWEN3 || m->arch == LLMREF_ARCH_GEMMA3;
    int big = (m->arch == LLMREF_ARCH_GEMMA2 && m->n_layer == 46) || (m->arch == LLMREF_ARCH_GEMMA3 && m->n_layer == 62);
    m->attn_scale = 1.0 / sqrt((double)(big ? m->n_embd / m->n_head : m->hd_k));
    m->swa_pattern = m->arch == LLMREF_ARCH_GEMMA2 ? 2 : m->arch == LLMREF_ARCH_GEMMA3 ? 6 : -1;
    m->rope_base_swa = m->arch == LLMREF_ARCH_GEMMA3 ? 10000.0 : m->rope_base;
    m->rope_factor_swa = m->arch == LLMREF_ARCH_GEMMA3 ? 1.0 : m->rope_factor;
    m->rope_attn_factor = 1.0;
}

/* Whether layer l slides (given a window). */
static inline int llmref_layer_slides(const llmref_model *m, int64_t l) {
    if (m->sliding_window <= 0) return 0;
    if (m->swa) return m->swa[l] != 0;
    int64_t n = m->swa_pattern;
    return n == 0 || (n > 0 && l % n < n - 1);
}

/* LongRoPE: the factors a session of n_ctx tokens uses, as llama.cpp
 * picks them: rope_long above n_ctx_orig, else rope_short. */
static inline void llmref_model_set_ctx(llmref_model *m, int64_t n_ctx) {
    m->rope_factors = n_ctx > m->n_ctx_orig ? m->rope_long : m->rope_short;
}

/* ---- reading GGUF metadata ---- */

static inline int llmref__kv_int(const dhsa_gguf *g, const char *key, int64_t def, int required, int64_t *out) {
    int64_t i = dhsa_gguf_find_kv(g, key);
    if (i < 0) {
        if (required) return llmref__fail("model: required key %s is absent", key);
        *out = def;
        return 0;
    }
    const dhsa_gguf_kv *kv = dhsa_gguf_kv_at(g, i);
    switch (kv->type) {
    case DHSA_GGUF_UINT8: case DHSA_GGUF_UINT16: case DHSA_GGUF_UINT32: case DHSA_GGUF_UINT64:
        if (kv->u > (uint64_t)INT64_MAX) return llmref__fail("model: %s = %llu is too large", key, (unsigned long long)kv->u);
        *out = (int64_t)kv->u;
        return 0;
    case DHSA_GGUF_INT8: case DHSA_GGUF_INT16: case DHSA_GGUF_INT32: case DHSA_GGUF_INT64:
        if (kv->i < 0) return llmref__fail("model: %s = %lld is negative", key, (long long)kv->i);
        *out = kv->i;
        return 0;
    default:
        return llmref__fail("model: %s is %s, not an integer", key, dhsa_gguf_type_name(kv->type));
    }
}

static inline int llmref__kv_float(const dhsa_gguf *g, const char *key, double def, double *out) {
    int64_t i = dhsa_gguf_find_kv(g, key);
    if (i < 0) {
        *out = def;
        return 0;
    }
    const dhsa_gguf_kv *kv = dhsa_gguf_kv_at(g, i);
    if (kv->type != DHSA_GGUF_FLOAT32 && kv->type != DHSA_GGUF_FLOAT64)
        return llmref__fail("model: %s is %s, not a float", key, dhsa_gguf_type_name(kv->type));
    *out = kv->f;
    return 0;
}

/* Marks of the tensors the loader read ([n_tensors], set while
 * llmref_model_load runs), so that one it did not read is an error. */
static uint8_t *llmref__used;

/* A file's string for a message: bytes outside printable ASCII as \xNN
 * (the reference's own rule, simpler than the library's: tests print these
 * sentences, and a name may hold ESC). */
static inline const char *llmref__printable(const char *s, char *buf, size_t cap) {
    size_t o = 0;
    for (; *s && o + 5 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c >= 0x20 && c < 0x7f && c != '\\') buf[o++] = (char)c;
        else o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
    }
    buf[o] = '\0';
    return buf;
}

/* Dequantizes tensor `name` into dst after checking it is [d0] (d1 = 0) or
 * [d0, d1]. Absent: -1, or 0 with *found = 0 when found is not NULL. */
static inline int llmref__load_tensor(const dhsa_gguf *g, const char *name, int64_t d0, int64_t d1, double *dst,
                                      int *found) {
    int64_t i = dhsa_gguf_find_tensor(g, name);
    if (found) *found = i >= 0;
    if (i < 0) return found ? 0 : llmref__fail("model: tensor %s is absent", name);
    if (llmref__used) llmref__used[i] = 1;
    const dhsa_gguf_tensor *t = dhsa_gguf_tensor_at(g, i);
    int64_t want_n = d1 ? d0 * d1 : d0;
    if (t->dims[0] != d0 || (d1 && t->dims[1] != d1) || t->n_elements != want_n)
        return llmref__fail("model: %s is [%lld, %lld, %lld, %lld], expected [%lld, %lld]", name,
                            (long long)t->dims[0], (long long)t->dims[1], (long long)t->dims[2],
                            (long long)t->dims[3], (long long)d0, (long long)(d1 ? d1 : 1));
    int64_t bytes = llmref_type_bytes(t->type, t->n_elements);
    if (bytes < 0)
        return llmref__fail("model: %s has type %u (%s), which the reference does not read, or a ragged row", name,
                            t->type, llmref_type_name(t->type));
    if (!t->data || t->bytes != bytes)
        return llmref__fail("model: %s holds %lld bytes, expected %lld", name, (long long)t->bytes, (long long)bytes);
    return llmref_dequant(t->type, t->data, t->n_elements, dst);
}

/* An optional tensor of d0 values (d1 = 0) or [d0, d1]: *dst is a new
 * array when the file has it, NULL when not. -1 on a bad tensor or no
 * memory. */
static inline int llmref__load_optional(const dhsa_gguf *g, const char *name, int64_t d0, int64_t d1, double **dst) {
    *dst = NULL;
    if (dhsa_gguf_find_tensor(g, name) < 0) return 0;
    int ok = 1;
    double *buf = llmref__zeros(d1 ? d0 * d1 : d0, &ok);
    if (!ok) return llmref__fail("model: out of memory");
    int found = 0;
    if (llmref__load_tensor(g, name, d0, d1, buf, &found)) {
        free(buf);
        return -1;
    }
    *dst = buf;
    return 0;
}

/* Fills m from an open GGUF by docs/model.md (architectures llama, qwen2,
 * gemma2; missing keys take the table's defaults). Every tensor is checked
 * for shape and dequantized to double; g may be closed after. Where the
 * table is silent, llama.cpp's rule is taken: a rope.scaling.factor
 * applies unless rope.scaling.type says "none" (an absent type counts as
 * linear). Returns 0, or -1 with llmref_error() (m is then zeroed). */
static inline int llmref_model_load(const dhsa_gguf *g, llmref_model *m) {
    memset(m, 0, sizeof *m);
    const char *arch = NULL;
    if (dhsa_gguf_get_str(g, "general.architecture", &arch, NULL) != DHSA_OK)
        return llmref__fail("model: general.architecture is absent or not a string");
    if (strcmp(arch, "llama") == 0) m->arch = LLMREF_ARCH_LLAMA;
    else if (strcmp(arch, "qwen2") == 0) m->arch = LLMREF_ARCH_QWEN2;
    else if (strcmp(arch, "gemma2") == 0) m->arch = LLMREF_ARCH_GEMMA2;
    else if (strcmp(arch, "qwen3") == 0) m->arch = LLMREF_ARCH_QWEN3;
    else if (strcmp(arch, "gemma3") == 0) m->arch = LLMREF_ARCH_GEMMA3;
    else if (strcmp(arch, "phi3") == 0) m->arch = LLMREF_ARCH_PHI3;
    else {
        char pb[200];
        return llmref__fail("model: architecture '%s' is not llama, qwen2, gemma2, qwen3, gemma3 or phi3",
                            llmref__printable(arch, pb, sizeof pb));
    }
    int gemma = llmref__gemma(m->arch);
    char key[160];
#define LLMREF_KEY(suffix) (snprintf(key, sizeof key, "%s.%s", arch, suffix), key)
    if (llmref__kv_int(g, LLMREF_KEY("context_length"), 0, 1, &m->n_ctx_train) ||
        llmref__kv_int(g, LLMREF_KEY("embedding_length"), 0, 1, &m->n_embd) ||
        llmref__kv_int(g, LLMREF_KEY("block_count"), 0, 1, &m->n_layer) ||
        llmref__kv_int(g, LLMREF_KEY("feed_forward_length"), 0, 1, &m->n_ff) ||
        llmref__kv_int(g, LLMREF_KEY("attention.head_count"), 0, 1, &m->n_head))
        return -1;
    if (m->n_embd < 1 || m->n_layer < 1 || m->n_ff < 1 || m->n_head < 1)
        return llmref__fail("model: a size is 0 (n_embd %lld, n_layer %lld, n_ff %lld, n_head %lld)",
                            (long long)m->n_embd, (long long)m->n_layer, (long long)m->n_ff, (long long)m->n_head);
    if (llmref__kv_int(g, LLMREF_KEY("attention.head_count_kv"), m->n_head, 0, &m->n_head_kv) ||
        llmref__kv_int(g, LLMREF_KEY("attention.key_length"), m->n_embd / m->n_head, 0, &m->hd_k) ||
        llmref__kv_int(g, LLMREF_KEY("attention.value_length"), m->hd_k, 0, &m->hd_v) ||
        llmref__kv_int(g, LLMREF_KEY("rope.dimension_count"), m->hd_k, 0, &m->n_rot) ||
        llmref__kv_float(g, LLMREF_KEY("attention.layer_norm_rms_epsilon"), gemma ? 1e-6 : 1e-5, &m->rms_eps) ||
        llmref__kv_float(g, LLMREF_KEY("rope.freq_base"), 10000.0, &m->rope_base) ||
        llmref__kv_float(g, LLMREF_KEY("rope.scaling.factor"), 1.0, &m->rope_factor))
        return -1;
    if (m->n_head_kv < 1 || m->n_head % m->n_head_kv)
        return llmref__fail("model: %lld query heads do not split into %lld KV heads", (long long)m->n_head,
                            (long long)m->n_head_kv);
    if (m->hd_k < 1 || m->hd_v < 1 || m->n_rot < 0 || m->n_rot > m->hd_k || m->n_rot % 2)
        return llmref__fail("model: head dims %lld/%lld with n_rot %lld", (long long)m->hd_k, (long long)m->hd_v,
                            (long long)m->n_rot);
    if (dhsa_gguf_find_kv(g, LLMREF_KEY("rope.scaling.type")) >= 0) {
        const char *type = NULL;
        if (dhsa_gguf_get_str(g, key, &type, NULL) != DHSA_OK) return llmref__fail("model: %s is not a string", key);
        if (strcmp(type, "none") == 0) m->rope_factor = 1.0;
        else if (strcmp(type, "linear") != 0)
            return llmref__fail("model: rope scaling '%.32s' is not supported (none, linear)", type);
    }
    if (m->rope_factor == 0) m->rope_factor = 1.0; /* llama.cpp: 0 = unset */
    if (!(m->rope_factor > 0) || !(m->rope_base > 0))
        return llmref__fail("model: rope base %g / factor %g", m->rope_base, m->rope_factor);
    if (m->arch == LLMREF_ARCH_GEMMA2) {
        if (llmref__kv_float(g, "gemma2.attn_logit_softcapping", 50.0, &m->attn_softcap) ||
            llmref__kv_float(g, "gemma2.final_logit_softcapping", 30.0, &m->final_softcap) ||
            llmref__kv_int(g, "gemma2.attention.sliding_window", 4096, 0, &m->sliding_window))
            return -1;
    }
    /* gemma3: no attention cap; a final cap and a window only when given */
    if (m->arch == LLMREF_ARCH_GEMMA3 &&
        (llmref__kv_float(g, "gemma3.final_logit_softcapping", 0.0, &m->final_softcap) ||
         llmref__kv_int(g, "gemma3.attention.sliding_window", 0, 0, &m->sliding_window)))
        return -1;
    double attn_factor = 1;
    if (llmref__kv_float(g, LLMREF_KEY("rope.scaling.attn_factor"), 1.0, &attn_factor) ||
        llmref__kv_int(g, LLMREF_KEY("rope.scaling.original_context_length"), m->n_ctx_train, 0, &m->n_ctx_orig))
        return -1;
#undef LLMREF_KEY
    int64_t ti = dhsa_gguf_find_tensor(g, "token_embd.weight");
    if (ti < 0) return llmref__fail("model: tensor token_embd.weight is absent");
    m->n_vocab = dhsa_gguf_tensor_at(g, ti)->dims[1];
    if (m->n_vocab < 1) return llmref__fail("model: token_embd.weight has no rows");
    m->tied = dhsa_gguf_find_tensor(g, "output.weight") < 0;
    m->has_rope_freqs = dhsa_gguf_find_tensor(g, "rope_freqs.weight") >= 0;
    m->has_post_norms = gemma;
    m->has_biases = 0; /* biases are loaded one by one below */
    m->has_mlp_biases = 0;
    m->has_output_bias = 0;
    llmref_model_derive(m);
    m->rope_attn_factor = attn_factor;
    /* the sliding layers (gemma2, and gemma3 with a window): their RoPE
     * base and which ones; phi3's sliding_window is not read (llama.cpp
     * disables it) */
    uint8_t *swa = NULL;
    if (m->arch == LLMREF_ARCH_GEMMA2 || (m->arch == LLMREF_ARCH_GEMMA3 && m->sliding_window > 0)) {
        char k2[96];
        snprintf(k2, sizeof k2, "%s.rope.freq_base_swa", arch);
        if (llmref__kv_float(g, k2, m->rope_base_swa, &m->rope_base_swa)) return -1;
        snprintf(k2, sizeof k2, "%s.attention.sliding_window_pattern", arch);
        int64_t pi = dhsa_gguf_find_kv(g, k2);
        const dhsa_gguf_kv *pkv = pi >= 0 ? dhsa_gguf_kv_at(g, pi) : NULL;
        if (pkv && pkv->type == DHSA_GGUF_ARRAY) {
            if (pkv->arr.type != DHSA_GGUF_BOOL || pkv->arr.n != m->n_layer)
                return llmref__fail("model: %s is not one BOOL per layer", k2);
            swa = malloc((size_t)m->n_layer);
            if (!swa) return llmref__fail("model: out of memory");
            memcpy(swa, pkv->arr.data, (size_t)m->n_layer);
        } else if (pkv && llmref__kv_int(g, k2, 0, 1, &m->swa_pattern)) {
            return -1;
        }
    }
    if (llmref_model_alloc(m)) {
        free(swa);
        return -1;
    }
    m->swa = swa;
    int64_t n_tensors = dhsa_gguf_n_tensors(g);
    llmref__used = calloc((size_t)(n_tensors > 0 ? n_tensors : 1), 1);
    if (!llmref__used) {
        llmref_model_free(m);
        return llmref__fail("model: out of memory");
    }

    int64_t E = m->n_embd, F = m->n_ff, dq = m->n_head * m->hd_k, dk = m->n_head_kv * m->hd_k,
            dv = m->n_head_kv * m->hd_v, da = m->n_head * m->hd_v;
    char name[96];
    if (llmref__load_tensor(g, "token_embd.weight", E, m->n_vocab, m->tok_embd, NULL) ||
        llmref__load_tensor(g, "output_norm.weight", E, 0, m->output_norm, NULL) ||
        (!m->tied && llmref__load_tensor(g, "output.weight", E, m->n_vocab, m->output, NULL)) ||
        (m->rope_freqs && llmref__load_tensor(g, "rope_freqs.weight", m->n_rot / 2, 0, m->rope_freqs, NULL)) ||
        llmref__load_optional(g, "output.bias", m->n_vocab, 0, &m->output_bias) ||
        llmref__load_optional(g, "rope_factors_long.weight", m->n_rot / 2, 0, &m->rope_long) ||
        llmref__load_optional(g, "rope_factors_short.weight", m->n_rot / 2, 0, &m->rope_short))
        goto fail;
    if (m->rope_freqs && (m->rope_long || m->rope_short)) {
        llmref__fail("model: rope_freqs.weight and rope_factors_long/short.weight are two sets of factors");
        goto fail;
    }
    m->rope_factors = m->rope_short; /* a context up to n_ctx_orig; llmref_model_set_ctx changes it */
    for (int64_t l = 0; l < m->n_layer; l++) {
        llmref_layer *L = &m->layers[l];
#define LLMREF_T(suffix) (snprintf(name, sizeof name, "blk.%lld.%s", (long long)l, suffix), name)
        /* Q, K, V: three matrices, or one fused [n_embd, dq + dk + dv] whose
         * rows are Q's, then K's, then V's */
        if (dhsa_gguf_find_tensor(g, LLMREF_T("attn_qkv.weight")) >= 0) {
            int ok = 1;
            double *f = llmref__zeros((dq + dk + dv) * E, &ok);
            if (!ok || llmref__load_tensor(g, name, E, dq + dk + dv, f, NULL)) {
                if (!ok) llmref__fail("model: out of memory");
                free(f);
                goto fail;
            }
            memcpy(L->wq, f, (size_t)(dq * E) * sizeof *f);
            memcpy(L->wk, f + dq * E, (size_t)(dk * E) * sizeof *f);
            memcpy(L->wv, f + (dq + dk) * E, (size_t)(dv * E) * sizeof *f);
            free(f);
        } else if (llmref__load_tensor(g, LLMREF_T("attn_q.weight"), E, dq, L->wq, NULL) ||
                   llmref__load_tensor(g, LLMREF_T("attn_k.weight"), E, dk, L->wk, NULL) ||
                   llmref__load_tensor(g, LLMREF_T("attn_v.weight"), E, dv, L->wv, NULL)) {
            goto fail;
        }
        if (llmref__load_tensor(g, LLMREF_T("attn_norm.weight"), E, 0, L->attn_norm, NULL) ||
            llmref__load_tensor(g, LLMREF_T("attn_output.weight"), da, E, L->wo, NULL) ||
            llmref__load_tensor(g, LLMREF_T("ffn_norm.weight"), E, 0, L->ffn_norm, NULL) ||
            llmref__load_tensor(g, LLMREF_T("ffn_down.weight"), F, E, L->w_down, NULL))
            goto fail;
        if (m->has_qk_norm && (llmref__load_tensor(g, LLMREF_T("attn_q_norm.weight"), m->hd_k, 0, L->q_norm, NULL) ||
                               llmref__load_tensor(g, LLMREF_T("attn_k_norm.weight"), m->hd_k, 0, L->k_norm, NULL)))
            goto fail;
        if (m->arch == LLMREF_ARCH_PHI3) {
            /* one ffn_up [n_embd, 2 n_ff]: rows 0..n_ff-1 the gate, the rest up;
             * its optional bias [2 n_ff] the same */
            int ok = 1;
            double *f = llmref__zeros(2 * F * E, &ok), *fb = NULL;
            if (!ok || llmref__load_tensor(g, LLMREF_T("ffn_up.weight"), E, 2 * F, f, NULL) ||
                llmref__load_optional(g, LLMREF_T("ffn_up.bias"), 2 * F, 0, &fb)) {
                if (!ok) llmref__fail("model: out of memory");
                free(f);
                goto fail;
            }
            memcpy(L->w_gate, f, (size_t)(F * E) * sizeof *f);
            memcpy(L->w_up, f + F * E, (size_t)(F * E) * sizeof *f);
            free(f);
            if (fb) {
                L->b_gate = llmref__zeros(F, &ok);
                L->b_up = llmref__zeros(F, &ok);
                if (ok) {
                    memcpy(L->b_gate, fb, (size_t)F * sizeof *fb);
                    memcpy(L->b_up, fb + F, (size_t)F * sizeof *fb);
                }
                free(fb);
                if (!ok) {
                    llmref__fail("model: out of memory");
                    goto fail;
                }
            }
        } else if (llmref__load_tensor(g, LLMREF_T("ffn_gate.weight"), E, F, L->w_gate, NULL) ||
                   llmref__load_tensor(g, LLMREF_T("ffn_up.weight"), E, F, L->w_up, NULL) ||
                   llmref__load_optional(g, LLMREF_T("ffn_gate.bias"), F, 0, &L->b_gate) ||
                   llmref__load_optional(g, LLMREF_T("ffn_up.bias"), F, 0, &L->b_up)) {
            goto fail;
        }
        if (gemma && (llmref__load_tensor(g, LLMREF_T("post_attention_norm.weight"), E, 0, L->post_attn_norm, NULL) ||
                      llmref__load_tensor(g, LLMREF_T("post_ffw_norm.weight"), E, 0, L->post_ffw_norm, NULL)))
            goto fail;
        /* optional biases of the output projection and the MLP (any architecture) */
        if (llmref__load_optional(g, LLMREF_T("attn_output.bias"), E, 0, &L->bo) ||
            llmref__load_optional(g, LLMREF_T("ffn_down.bias"), E, 0, &L->b_down))
            goto fail;
        /* Q/K/V biases: a fused [dq + dk + dv] cut like the fused matrix, or
         * one by one */
        if (dhsa_gguf_find_tensor(g, LLMREF_T("attn_qkv.bias")) >= 0) {
            double *fb = NULL;
            int ok = 1;
            if (llmref__load_optional(g, name, dq + dk + dv, 0, &fb)) goto fail;
            L->bq = llmref__zeros(dq, &ok);
            L->bk = llmref__zeros(dk, &ok);
            L->bv = llmref__zeros(dv, &ok);
            if (!ok) {
                free(fb);
                llmref__fail("model: out of memory");
                goto fail;
            }
            memcpy(L->bq, fb, (size_t)dq * sizeof *fb);
            memcpy(L->bk, fb + dq, (size_t)dk * sizeof *fb);
            memcpy(L->bv, fb + dq + dk, (size_t)dv * sizeof *fb);
            free(fb);
            continue;
        }
        const char *bname[3] = {"attn_q.bias", "attn_k.bias", "attn_v.bias"};
        int64_t bn[3] = {dq, dk, dv};
        double **bdst[3] = {&L->bq, &L->bk, &L->bv};
        for (int b = 0; b < 3; b++) {
            int ok = 1, found = 0;
            double *buf = llmref__zeros(bn[b], &ok);
            if (!ok) {
                llmref__fail("model: out of memory");
                goto fail;
            }
            if (llmref__load_tensor(g, LLMREF_T(bname[b]), bn[b], 0, buf, &found)) {
                free(buf);
                goto fail;
            }
            if (!found) {
                free(buf);
                if (m->arch == LLMREF_ARCH_QWEN2) {
                    llmref__fail("model: qwen2 needs %s", name);
                    goto fail;
                }
                continue;
            }
            *bdst[b] = buf;
        }
#undef LLMREF_T
    }
    /* every tensor of the file was read: one the reference does not know
     * would change what the model computes */
    for (int64_t i = 0; i < n_tensors; i++)
        if (!llmref__used[i]) {
            char pb[200];
            llmref__fail("model: tensor %s is not one docs/model.md lists for %s",
                         llmref__printable(dhsa_gguf_tensor_at(g, i)->name, pb, sizeof pb), arch);
            goto fail;
        }
    free(llmref__used);
    llmref__used = NULL;
    return 0;
fail:
    free(llmref__used);
    llmref__used = NULL;
    llmref_model_free(m);
    return -1;
}

/* llmref_model_load over a file's bytes (opened and closed here). */
static inline int llmref_model_load_memory(const void *bytes, size_t size, llmref_model *m) {
    dhsa_gguf *g = NULL;
    memset(m, 0, sizeof *m);
    if (dhsa_gguf_open_memory(bytes, size, &g) != DHSA_OK) return llmref__fail("model: %s", dhsa_last_error());
    int rc = llmref_model_load(g, m);
    dhsa_gguf_close(g);
    return rc;
}

static inline int llmref_model_load_file(const char *path, llmref_model *m) {
    dhsa_gguf *g = NULL;
    memset(m, 0, sizeof *m);
    if (dhsa_gguf_open(path, &g) != DHSA_OK) return llmref__fail("model: %s", dhsa_last_error());
    int rc = llmref_model_load(g, m);
    dhsa_gguf_close(g);
    return rc;
}

/* A llama2.c checkpoint (run.c's format, read here independently of the
 * library's converter): a header of 7 int32 (dim, hidden_dim, n_layers,
 * n_heads, n_kv_heads, vocab_size (negative = separate classifier),
 * seq_len), then F32 weights in llama2.c order: token embedding, attention
 * RMS weights, wq, wk, wv, wo, FFN RMS weights, w1 (gate), w2 (down), w3
 * (up), final RMS weight, two RoPE tables (skipped), classifier. Read as a
 * llama: eps 1e-5 (rounded to F32, as GGUF files store it), theta 10000,
 * adjacent pairs. */
static inline int llmref_model_load_llama2c(const char *path, llmref_model *m) {
    memset(m, 0, sizeof *m);
    FILE *f = fopen(path, "rb");
    if (!f) return llmref__fail("llama2.c: cannot open %s", path);
    int32_t h[7];
    if (fread(h, 4, 7, f) != 7) {
        fclose(f);
        return llmref__fail("llama2.c: %s is shorter than its header", path);
    }
    for (int i = 0; i < 7; i++)
        if (i != 5 && h[i] <= 0) {
            fclose(f);
            return llmref__fail("llama2.c: header field %d is %d", i, h[i]);
        }
    m->arch = LLMREF_ARCH_LLAMA;
    m->n_embd = h[0];
    m->n_ff = h[1];
    m->n_layer = h[2];
    m->n_head = h[3];
    m->n_head_kv = h[4];
    m->tied = h[5] > 0;
    m->n_vocab = h[5] > 0 ? h[5] : -(int64_t)h[5];
    m->n_ctx_train = h[6];
    m->hd_k = m->hd_v = m->n_rot = m->n_embd / m->n_head;
    m->rms_eps = (double)1e-5f; /* as a GGUF stores it (F32) */
    m->rope_base = 10000;
    m->rope_factor = 1;
    llmref_model_derive(m);
    if (m->n_vocab < 1 || m->n_head % m->n_head_kv || m->n_embd % m->n_head) {
        fclose(f);
        memset(m, 0, sizeof *m);
        return llmref__fail("llama2.c: inconsistent header");
    }
    if (llmref_model_alloc(m)) {
        fclose(f);
        return -1;
    }
    int64_t E = m->n_embd, F = m->n_ff, dk = m->n_head_kv * m->hd_k, NL = m->n_layer;
    float *buf = NULL;
    int ok = 1;
    /* Reads n floats into dst (skips them when dst is NULL). */
#define LLMREF_RD(dst, n)                                                                    \
    do {                                                                                     \
        int64_t n_ = (n);                                                                    \
        float *b_ = ok ? realloc(buf, (size_t)(n_ > 0 ? n_ : 1) * sizeof *b_) : NULL;        \
        if (!b_ || fread(b_, sizeof *b_, (size_t)n_, f) != (size_t)n_) ok = 0;                \
        if (b_) buf = b_;                                                                    \
        if (ok && (dst))                                                                     \
            for (int64_t i_ = 0; i_ < n_; i_++) ((double *)(dst))[i_] = b_[i_];               \
    } while (0)
    LLMREF_RD(m->tok_embd, m->n_vocab * E);
    for (int64_t l = 0; l < NL; l++) LLMREF_RD(m->layers[l].attn_norm, E);
    for (int64_t l = 0; l < NL; l++) LLMREF_RD(m->layers[l].wq, E * E);
    for (int64_t l = 0; l < NL; l++) LLMREF_RD(m->layers[l].wk, dk * E);
    for (int64_t l = 0; l < NL; l++) LLMREF_RD(m->layers[l].wv, dk * E);
    for (int64_t l = 0; l < NL; l++) LLMREF_RD(m->layers[l].wo, E * E);
    for (int64_t l = 0; l < NL; l++) LLMREF_RD(m->layers[l].ffn_norm, E);
    for (int64_t l = 0; l < NL; l++) LLMREF_RD(m->layers[l].w_gate, F * E);
    for (int64_t l = 0; l < NL; l++) LLMREF_RD(m->layers[l].w_down, E * F);
    for (int64_t l = 0; l < NL; l++) LLMREF_RD(m->layers[l].w_up, F * E);
    LLMREF_RD(m->output_norm, E);
    LLMREF_RD((double *)NULL, m->n_ctx_train * m->hd_k); /* freq_cis_real, freq_cis_imag */
    if (!m->tied) LLMREF_RD(m->output, m->n_vocab * E);
#undef LLMREF_RD
    free(buf);
    fclose(f);
    if (!ok) {
        llmref_model_free(m);
        return llmref__fail("llama2.c: %s is truncated (or out of memory)", path);
    }
    return 0;
}

#endif
