/* model.c: loading a model. Reads the hyperparameters of a GGUF file
 * (docs/model.md) of llama, qwen2, qwen3, gemma2, gemma3 and phi3, binds
 * every tensor the architecture needs after checking its presence, type and
 * shape (q/k norms, phi3's fused gate/up), binds the optional ones it knows
 * (biases, a fused attn_qkv, rope_freqs, LongRoPE factors, output.weight)
 * when present, refuses a file
 * holding any other tensor (naming it: a tensor nobody reads would be a
 * silently wrong model), and keeps the file mapped: matrices are used in
 * place. A llama2.c checkpoint is converted in memory first. Strings from
 * the file are escaped (dhsa__esc) in every sentence.
 * Tested by tests/test_model.c and tests/test_model_ref.c (against the
 * naive forward in tests/llm_ref.h, the real stories260K model and
 * corrupted fixtures), tests/test_model_tensors.c (every optional
 * tensor against the reference, unused tensors, the gemma2 27B scale) and
 * tests/test_model_arch.c (qwen3, gemma3, phi3 and what each adds).
 */
#include "core/internal.h"
#include "model/model_internal.h"
#include "matmul/amx.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DIM ((int64_t)1 << 20)      /* n_embd, n_ff, head dims */
#define MAX_LAYERS 4096
#define MAX_HEADS 4096
#define MAX_VOCAB ((int64_t)1 << 24)

dhsa_model_params dhsa_model_default_params(void) {
    dhsa_model_params p;
    memset(&p, 0, sizeof p);
    p.check_finite = 1;
    return p;
}

/* ---------------------------------------------------------- metadata --- */

static _Thread_local char key_buf[256];

static const char *key_of(const char *arch, const char *suffix) {
    snprintf(key_buf, sizeof key_buf, "%s.%s", arch, suffix);
    return key_buf;
}

/* An integer key in [lo, hi]; absent keys take def (required: def < 0). */
static dhsa_status get_int(const dhsa_gguf *g, const char *key, int64_t def, int64_t lo, int64_t hi, int64_t *out) {
    if (dhsa_gguf_find_kv(g, key) < 0) {
        if (def < 0) return dhsa__fail(DHSA_ERR_FORMAT, "the model has no \"%s\"", key);
        *out = def;
        return DHSA_OK;
    }
    int64_t v;
    dhsa_status st = dhsa_gguf_get_i64(g, key, &v);
    if (st) return st;
    if (v < lo || v > hi)
        return dhsa__fail(DHSA_ERR_FORMAT, "\"%s\" = %lld is outside [%lld, %lld]", key, (long long)v, (long long)lo,
                          (long long)hi);
    *out = v;
    return DHSA_OK;
}

static dhsa_status get_real(const dhsa_gguf *g, const char *key, float def, float lo, float hi, float *out) {
    if (dhsa_gguf_find_kv(g, key) < 0) {
        *out = def;
        return DHSA_OK;
    }
    float v;
    dhsa_status st = dhsa_gguf_get_f32(g, key, &v);
    if (st) return st;
    if (!(v >= lo && v <= hi))
        return dhsa__fail(DHSA_ERR_FORMAT, "\"%s\" = %g is outside [%g, %g]", key, (double)v, (double)lo,
                          (double)hi);
    *out = v;
    return DHSA_OK;
}

/* The architectures, by general.architecture. */
static const struct {
    const char *name;
    dhsa_arch arch;
} arch_table[] = {
    {"llama", DHSA_ARCH_LLAMA}, {"qwen2", DHSA_ARCH_QWEN2},   {"gemma2", DHSA_ARCH_GEMMA2},
    {"qwen3", DHSA_ARCH_QWEN3}, {"gemma3", DHSA_ARCH_GEMMA3}, {"phi3", DHSA_ARCH_PHI3},
};

static int is_gemma(dhsa_arch a) { return a == DHSA_ARCH_GEMMA2 || a == DHSA_ARCH_GEMMA3; }

/* A.attention.sliding_window_pattern, as llama.cpp reads it: an integer n
 * (layer l slides when l % n < n - 1; 0: every layer), or an array of one
 * flag per layer; absent: def. */
static dhsa_status read_swa_pattern(const dhsa_gguf *g, const char *key, int64_t n_layer, int64_t def,
                                    dhsa_model *m) {
    m->swa_pattern = def;
    memset(&m->swa_layers, 0, sizeof m->swa_layers);
    int64_t i = dhsa_gguf_find_kv(g, key);
    if (i < 0) return DHSA_OK;
    const dhsa_gguf_kv *kv = dhsa_gguf_kv_at(g, i);
    if (kv->type != DHSA_GGUF_ARRAY) return get_int(g, key, def, 0, MAX_LAYERS, &m->swa_pattern);
    const dhsa_gguf_array *a = &kv->arr;
    if (a->type != DHSA_GGUF_BOOL && a->type != DHSA_GGUF_UINT8 && a->type != DHSA_GGUF_INT8)
        return dhsa__fail(DHSA_ERR_FORMAT, "\"%s\" is an array of %s; one flag per layer (BOOL) expected", key,
                          dhsa_gguf_type_name(a->type));
    if (a->n != n_layer)
        return dhsa__fail(DHSA_ERR_FORMAT, "\"%s\" has %lld flags for %lld layers", key, (long long)a->n,
                          (long long)n_layer);
    m->swa_layers = *a;
    return DHSA_OK;
}

/* Whether layer l uses the sliding window (given one). */
static int layer_slides(const dhsa_model *m, int64_t l) {
    if (m->info.sliding_window <= 0) return 0;
    if (m->swa_layers.data) return ((const uint8_t *)m->swa_layers.data)[l] != 0;
    int64_t n = m->swa_pattern;
    return n == 0 || l % n < n - 1;
}

static dhsa_status read_hparams(const dhsa_gguf *g, dhsa_model *m) {
    dhsa_model_info *in = &m->info;
    const char *arch;
    dhsa_status st = dhsa_gguf_get_str(g, "general.architecture", &arch, NULL);
    if (st) return st;
    in->arch_name = NULL;
    for (size_t i = 0; i < sizeof arch_table / sizeof arch_table[0]; i++)
        if (strcmp(arch, arch_table[i].name) == 0) {
            in->arch = arch_table[i].arch;
            in->arch_name = arch_table[i].name;
        }
    if (!in->arch_name)
        return dhsa__fail(DHSA_ERR_UNSUPPORTED,
                          "architecture \"%s\" is not supported (llama, qwen2, qwen3, gemma2, gemma3, phi3 are)",
                          dhsa__esc(arch));
    const char *a = in->arch_name;
    const int gemma = is_gemma(in->arch);
    if ((st = get_int(g, key_of(a, "context_length"), -1, 1, (int64_t)1 << 32, &in->n_ctx_train)) ||
        (st = get_int(g, key_of(a, "embedding_length"), -1, 1, MAX_DIM, &in->n_embd)) ||
        (st = get_int(g, key_of(a, "block_count"), -1, 1, MAX_LAYERS, &in->n_layer)) ||
        (st = get_int(g, key_of(a, "feed_forward_length"), -1, 1, MAX_DIM, &in->n_ff)) ||
        (st = get_int(g, key_of(a, "attention.head_count"), -1, 1, MAX_HEADS, &in->n_head)) ||
        (st = get_int(g, key_of(a, "attention.head_count_kv"), in->n_head, 1, MAX_HEADS, &in->n_head_kv)))
        return st;
    if (in->n_head % in->n_head_kv)
        return dhsa__fail(DHSA_ERR_FORMAT, "%lld query heads are not a multiple of %lld KV heads",
                          (long long)in->n_head, (long long)in->n_head_kv);
    if (in->n_embd % in->n_head && dhsa_gguf_find_kv(g, key_of(a, "attention.key_length")) < 0)
        return dhsa__fail(DHSA_ERR_FORMAT, "n_embd %lld is not a multiple of %lld heads and no key_length is given",
                          (long long)in->n_embd, (long long)in->n_head);
    if ((st = get_int(g, key_of(a, "attention.key_length"), in->n_embd / in->n_head, 1, 4096, &in->head_dim_k)) ||
        (st = get_int(g, key_of(a, "attention.value_length"), in->head_dim_k, 1, 4096, &in->head_dim_v)) ||
        (st = get_int(g, key_of(a, "rope.dimension_count"), in->head_dim_k, 0, in->head_dim_k, &in->n_rot)))
        return st;
    if (in->n_rot % 2) return dhsa__fail(DHSA_ERR_FORMAT, "rope.dimension_count %lld is odd", (long long)in->n_rot);
    if ((st = get_real(g, key_of(a, "attention.layer_norm_rms_epsilon"), gemma ? 1e-6f : 1e-5f, 0.0f, 1.0f,
                       &in->rms_eps)) ||
        (st = get_real(g, key_of(a, "rope.freq_base"), 10000.0f, 1e-3f, 1e12f, &in->rope_base)))
        return st;
    /* RoPE scaling: as llama.cpp, a factor without a type means linear */
    in->rope_linear_factor = 1.0f;
    const char *type = NULL;
    if (dhsa_gguf_find_kv(g, key_of(a, "rope.scaling.type")) >= 0 && (st = dhsa_gguf_get_str(g, key_buf, &type, NULL)))
        return st;
    if (type && strcmp(type, "none") != 0 && strcmp(type, "linear") != 0)
        return dhsa__fail(DHSA_ERR_UNSUPPORTED, "RoPE scaling \"%s\" is not supported (none, linear are; llama3 "
                          "scaling comes as rope_freqs.weight, LongRoPE as rope_factors_long/short.weight)",
                          dhsa__esc(type));
    if (!type || strcmp(type, "linear") == 0) {
        float f;
        if ((st = get_real(g, key_of(a, "rope.scaling.factor"), 1.0f, 0.0f, 1e6f, &f))) return st;
        in->rope_linear_factor = f > 0.0f ? f : 1.0f; /* 0 means none */
    }
    /* rope.scaling.attn_factor scales cos and sin (so each rotated q and k
     * value) in every architecture, as llama.cpp's rope does with it; phi3
     * LongRoPE files carry sqrt(1 + ln(ctx / orig) / ln(orig)) there. */
    if ((st = get_real(g, key_of(a, "rope.scaling.attn_factor"), 1.0f, 1e-6f, 1e6f, &in->rope_attn_factor)) ||
        (st = get_int(g, key_of(a, "rope.scaling.original_context_length"), in->n_ctx_train, 1, (int64_t)1 << 32,
                      &in->n_ctx_orig)))
        return st;
    in->rope_neox = in->arch != DHSA_ARCH_LLAMA;
    in->qk_norm = in->arch == DHSA_ARCH_QWEN3 || in->arch == DHSA_ARCH_GEMMA3;
    in->fused_ffn = in->arch == DHSA_ARCH_PHI3;
    /* Sliding windows and their RoPE, as llama.cpp: gemma2 slides its even
     * layers (window 4096 unless the key says), with the global RoPE unless
     * rope.freq_base_swa is given; gemma3 slides 5 layers in 6 only when
     * the file gives a window, with rope.freq_base_swa (10000 when absent)
     * and no linear scaling on them. phi3's sliding_window key is ignored,
     * as llama.cpp does (it disables Phi's SWA); the others have none. */
    in->rope_base_swa = in->rope_base;
    in->rope_linear_factor_swa = in->rope_linear_factor;
    in->sliding_window = 0;
    m->swa_pattern = 0;
    if (in->arch == DHSA_ARCH_GEMMA2) {
        if ((st = get_real(g, "gemma2.attn_logit_softcapping", 50.0f, 0.0f, 1e9f, &in->attn_softcap)) ||
            (st = get_real(g, "gemma2.final_logit_softcapping", 30.0f, 0.0f, 1e9f, &in->final_softcap)) ||
            (st = get_int(g, "gemma2.attention.sliding_window", 4096, 0, (int64_t)1 << 32, &in->sliding_window)) ||
            (st = read_swa_pattern(g, "gemma2.attention.sliding_window_pattern", in->n_layer, 2, m)) ||
            (st = get_real(g, "gemma2.rope.freq_base_swa", in->rope_base, 1e-3f, 1e12f, &in->rope_base_swa)))
            return st;
    } else if (in->arch == DHSA_ARCH_GEMMA3) {
        /* gemma3 has no attention softcap (llama.cpp reads no key for it) */
        if ((st = get_real(g, "gemma3.final_logit_softcapping", 0.0f, 0.0f, 1e9f, &in->final_softcap)) ||
            (st = get_int(g, "gemma3.attention.sliding_window", 0, 0, (int64_t)1 << 32, &in->sliding_window)))
            return st;
        if (in->sliding_window > 0) {
            if ((st = read_swa_pattern(g, "gemma3.attention.sliding_window_pattern", in->n_layer, 6, m)) ||
                (st = get_real(g, "gemma3.rope.freq_base_swa", 10000.0f, 1e-3f, 1e12f, &in->rope_base_swa)))
                return st;
            in->rope_linear_factor_swa = 1.0f;
        }
    }
    in->n_swa_layers = 0;
    for (int64_t l = 0; l < in->n_layer; l++) in->n_swa_layers += layer_slides(m, l);
    /* The query scale. llama.cpp gives gemma2 27B (which it recognises by
     * its 46 layers, LLM_TYPE_27B) and gemma3 27B (62 layers) 1/sqrt(n_embd
     * / n_head), Gemma's query_pre_attn_scalar, where the smaller ones use
     * 1/sqrt(head_dim); head_dim is 128 at 27B, so the rule matters (issue
     * 12 measured a relative logit error of 0.48 without it; 0.31 on the
     * 46-layer fixture of tests/test_model_tensors.c). The same test, by
     * layer count, here. */
    int big = (in->arch == DHSA_ARCH_GEMMA2 && in->n_layer == 46) ||
              (in->arch == DHSA_ARCH_GEMMA3 && in->n_layer == 62);
    int64_t scalar = big ? in->n_embd / in->n_head : in->head_dim_k;
    in->attn_scale = (float)(1.0 / sqrt((double)scalar));
    return DHSA_OK;
}

/* ----------------------------------------------------------- tensors --- */

typedef struct {
    dhsa_model *m;
    int64_t n_vectors;   /* floats of F32 copies handed out so far */
    int64_t cap_vectors; /* 0 while counting */
    uint8_t *used;       /* [n_tensors]: 1 once a bind looked the tensor up */
    char name[96];
} binder;

static const dhsa_gguf_tensor *find(const dhsa_gguf *g, const char *name, int64_t *idx) {
    int64_t i = dhsa_gguf_find_tensor(g, name);
    *idx = i;
    return i < 0 ? NULL : dhsa_gguf_tensor_at(g, i);
}

/* find, and the tensor counts as used. */
static const dhsa_gguf_tensor *find_used(binder *b, const char *name, int64_t *idx) {
    const dhsa_gguf_tensor *t = find(b->m->g, name, idx);
    if (t) b->used[*idx] = 1;
    return t;
}

/* A matrix [n_in, n_out] (GGUF order). */
static dhsa_status bind_matrix(binder *b, const char *name, int64_t n_in, int64_t n_out, int optional,
                               dhsa_wmat *out) {
    memset(out, 0, sizeof *out);
    int64_t idx;
    const dhsa_gguf_tensor *t = find_used(b, name, &idx);
    if (!t) {
        if (optional) return DHSA_OK;
        return dhsa__fail(DHSA_ERR_FORMAT, "the model has no tensor \"%s\"", name);
    }
    if (!dhsa__wt_supported(t->type))
        return dhsa__fail(DHSA_ERR_UNSUPPORTED, "tensor \"%s\" has type %s (%u); supported: " DHSA_QK_TYPE_LIST, name, dhsa_ggml_type_name(t->type), t->type);
    if (t->n_dims > 2 || t->dims[0] != n_in || t->dims[1] != n_out)
        return dhsa__fail(DHSA_ERR_SHAPE, "tensor \"%s\" has dims [%lld, %lld] (%u dims); expected [%lld, %lld]", name,
                          (long long)t->dims[0], (long long)t->dims[1], (unsigned)t->n_dims, (long long)n_in,
                          (long long)n_out);
    const void *data;
    int64_t bytes;
    dhsa_status st = dhsa_gguf_tensor_data(b->m->g, idx, &data, &bytes);
    if (st) return st;
    out->type = t->type;
    out->data = data;
    out->n_in = n_in;
    out->n_out = n_out;
    out->row_bytes = dhsa__wt_row_bytes(t->type, n_in);
    if (out->row_bytes < 0 || out->row_bytes * n_out != bytes)
        return dhsa__fail(DHSA_ERR_SHAPE, "tensor \"%s\": rows of %lld values do not fit type %s", name, (long long)n_in,
                          dhsa_ggml_type_name(t->type));
    return DHSA_OK;
}

/* A vector of n values (F32/F16/BF16), copied into the model's F32 block.
 * While counting (cap 0) only the size is recorded. */
static dhsa_status bind_vector(binder *b, const char *name, int64_t n, int optional, const float **out) {
    *out = NULL;
    int64_t idx;
    const dhsa_gguf_tensor *t = find_used(b, name, &idx);
    if (!t) {
        if (optional) return DHSA_OK;
        return dhsa__fail(DHSA_ERR_FORMAT, "the model has no tensor \"%s\"", name);
    }
    if (t->type != DHSA_GGML_F32 && t->type != DHSA_GGML_F16 && t->type != DHSA_GGML_BF16)
        return dhsa__fail(DHSA_ERR_UNSUPPORTED, "vector \"%s\" has type %s; F32, F16 or BF16 expected", name,
                          dhsa_ggml_type_name(t->type));
    int64_t count = 1;
    for (int i = 0; i < t->n_dims; i++) count *= t->dims[i];
    if (t->dims[0] != n || count != n)
        return dhsa__fail(DHSA_ERR_SHAPE, "tensor \"%s\" has %lld values in %u dims; expected a vector of %lld", name,
                          (long long)count, (unsigned)t->n_dims, (long long)n);
    if (b->cap_vectors == 0) {
        b->n_vectors += n;
        return DHSA_OK;
    }
    const void *data;
    int64_t bytes;
    dhsa_status st = dhsa_gguf_tensor_data(b->m->g, idx, &data, &bytes);
    if (st) return st;
    float *dst = b->m->vectors + b->n_vectors;
    st = dhsa__dequantize_row(t->type, data, dst, n);
    if (st) return st;
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(dst[i]))
            return dhsa__fail(DHSA_ERR_NONFINITE, "tensor \"%s\" holds %g at %lld", name, (double)dst[i], (long long)i);
    b->n_vectors += n;
    *out = dst;
    return DHSA_OK;
}

static const char *blk(binder *b, int64_t l, const char *what) {
    snprintf(b->name, sizeof b->name, "blk.%lld.%s", (long long)l, what);
    return b->name;
}

/* A view of rows [r0, r0 + n) of a matrix. */
static dhsa_wmat row_range(const dhsa_wmat *w, int64_t r0, int64_t n) {
    dhsa_wmat v = *w;
    v.data = (const char *)w->data + r0 * w->row_bytes;
    v.n_out = n;
    return v;
}

/* Q, K and V of layer l: attn_q/k/v.weight, or one fused attn_qkv.weight
 * [n_embd, nq + nk + nv] (llama.cpp's create_tensor_qkv reads either, for
 * every architecture here) whose q, k, v row ranges become the three
 * matrices. Biases: a fused attn_qkv.bias [nq + nk + nv] is cut the same
 * way; otherwise attn_q/k/v.bias are bound one by one (required when
 * need_bias: qwen2). With a fused matrix the separate ones are not looked
 * up, so a file holding both is refused as holding an unused tensor. */
static dhsa_status bind_qkv(binder *b, int64_t l, int64_t E, int64_t nq, int64_t nk, int64_t nv, int need_bias) {
    dhsa__layer *L = &b->m->layers[l];
    dhsa_status st;
    int64_t idx;
    if (find(b->m->g, blk(b, l, "attn_qkv.weight"), &idx)) {
        dhsa_wmat f;
        if ((st = bind_matrix(b, b->name, E, nq + nk + nv, 0, &f))) return st;
        L->wq = row_range(&f, 0, nq);
        L->wk = row_range(&f, nq, nk);
        L->wv = row_range(&f, nq + nk, nv);
    } else if ((st = bind_matrix(b, blk(b, l, "attn_q.weight"), E, nq, 0, &L->wq)) ||
               (st = bind_matrix(b, blk(b, l, "attn_k.weight"), E, nk, 0, &L->wk)) ||
               (st = bind_matrix(b, blk(b, l, "attn_v.weight"), E, nv, 0, &L->wv))) {
        return st;
    }
    if (find(b->m->g, blk(b, l, "attn_qkv.bias"), &idx)) {
        const float *fb;
        if ((st = bind_vector(b, b->name, nq + nk + nv, 0, &fb))) return st;
        L->bq = fb;
        L->bk = fb ? fb + nq : NULL; /* NULL while counting */
        L->bv = fb ? fb + nq + nk : NULL;
        return DHSA_OK;
    }
    if ((st = bind_vector(b, blk(b, l, "attn_q.bias"), nq, !need_bias, &L->bq)) ||
        (st = bind_vector(b, blk(b, l, "attn_k.bias"), nk, !need_bias, &L->bk)) ||
        (st = bind_vector(b, blk(b, l, "attn_v.bias"), nv, !need_bias, &L->bv)))
        return st;
    return DHSA_OK;
}

/* Gate and up of layer l: ffn_gate.weight and ffn_up.weight, or (phi3)
 * one ffn_up.weight [n_embd, 2 n_ff] whose first n_ff rows are the gate
 * and the last n_ff the up projection (llama.cpp's swiglu of the fused
 * product: silu of the first half times the second), with an optional
 * ffn_up.bias [2 n_ff] cut the same way. With the fused form ffn_gate is
 * not looked up, so a file that also holds one is refused as unused. */
static dhsa_status bind_gate_up(binder *b, int64_t l, int64_t E, int64_t F, int fused) {
    dhsa__layer *L = &b->m->layers[l];
    dhsa_status st;
    if (!fused) {
        if ((st = bind_matrix(b, blk(b, l, "ffn_gate.weight"), E, F, 0, &L->w_gate)) ||
            (st = bind_matrix(b, blk(b, l, "ffn_up.weight"), E, F, 0, &L->w_up)) ||
            (st = bind_vector(b, blk(b, l, "ffn_gate.bias"), F, 1, &L->b_gate)) ||
            (st = bind_vector(b, blk(b, l, "ffn_up.bias"), F, 1, &L->b_up)))
            return st;
        return DHSA_OK;
    }
    dhsa_wmat f;
    const float *fb;
    if ((st = bind_matrix(b, blk(b, l, "ffn_up.weight"), E, 2 * F, 0, &f)) ||
        (st = bind_vector(b, blk(b, l, "ffn_up.bias"), 2 * F, 1, &fb)))
        return st;
    L->w_gate = row_range(&f, 0, F);
    L->w_up = row_range(&f, F, F);
    L->b_gate = fb;
    L->b_up = fb ? fb + F : NULL;
    return DHSA_OK;
}

/* Binds everything; run twice: counting vectors (cap 0), then for real.
 * Optional tensors are bound for every architecture (docs/model.md,
 * "Tensors"), so none that dhsa knows is ever ignored. */
static dhsa_status bind_all(binder *b) {
    dhsa_model *m = b->m;
    dhsa_model_info *in = &m->info;
    const int64_t E = in->n_embd, F = in->n_ff, nq = in->n_head * in->head_dim_k,
                  nk = in->n_head_kv * in->head_dim_k, nv = in->n_head_kv * in->head_dim_v,
                  no = in->n_head * in->head_dim_v, half = in->n_rot / 2;
    const int gemma = is_gemma(in->arch), qwen2 = in->arch == DHSA_ARCH_QWEN2;
    dhsa_status st;
    if ((st = bind_matrix(b, "token_embd.weight", E, in->n_vocab, 0, &m->tok_embd)) ||
        (st = bind_vector(b, "output_norm.weight", E, 0, &m->output_norm)) ||
        (st = bind_matrix(b, "output.weight", E, in->n_vocab, 1, &m->output)) ||
        (st = bind_vector(b, "output.bias", in->n_vocab, 1, &m->output_bias)) ||
        (st = bind_vector(b, "rope_freqs.weight", half, 1, &m->rope_freqs)) ||
        (st = bind_vector(b, "rope_factors_long.weight", half, 1, &m->rope_long)) ||
        (st = bind_vector(b, "rope_factors_short.weight", half, 1, &m->rope_short)))
        return st;
    in->tied_output = m->output.data == NULL;
    if (in->tied_output) m->output = m->tok_embd;
    if (b->cap_vectors == 0) {
        in->has_rope_freqs = dhsa_gguf_find_tensor(m->g, "rope_freqs.weight") >= 0;
        in->has_rope_factors = dhsa_gguf_find_tensor(m->g, "rope_factors_long.weight") >= 0 ||
                               dhsa_gguf_find_tensor(m->g, "rope_factors_short.weight") >= 0;
        /* llama.cpp would use rope_freqs and leave the factors unused */
        if (in->has_rope_freqs && in->has_rope_factors)
            return dhsa__fail(DHSA_ERR_UNSUPPORTED, "the model holds rope_freqs.weight and rope_factors_long/short."
                              "weight: two sets of RoPE frequency factors, one of which would be unused");
    }
    for (int64_t l = 0; l < in->n_layer; l++) {
        dhsa__layer *L = &m->layers[l];
        if ((st = bind_vector(b, blk(b, l, "attn_norm.weight"), E, 0, &L->attn_norm)) ||
            (st = bind_vector(b, blk(b, l, "ffn_norm.weight"), E, 0, &L->ffn_norm)) ||
            (st = bind_vector(b, blk(b, l, "post_attention_norm.weight"), E, !gemma, &L->post_attn_norm)) ||
            (st = bind_vector(b, blk(b, l, "post_ffw_norm.weight"), E, !gemma, &L->post_ffw_norm)) ||
            (st = bind_qkv(b, l, E, nq, nk, nv, qwen2)) ||
            (in->qk_norm && ((st = bind_vector(b, blk(b, l, "attn_q_norm.weight"), in->head_dim_k, 0, &L->q_norm)) ||
                             (st = bind_vector(b, blk(b, l, "attn_k_norm.weight"), in->head_dim_k, 0, &L->k_norm)))) ||
            (st = bind_matrix(b, blk(b, l, "attn_output.weight"), no, E, 0, &L->wo)) ||
            (st = bind_vector(b, blk(b, l, "attn_output.bias"), E, 1, &L->bo)) ||
            (st = bind_gate_up(b, l, E, F, in->fused_ffn)) ||
            (st = bind_matrix(b, blk(b, l, "ffn_down.weight"), F, E, 0, &L->w_down)) ||
            (st = bind_vector(b, blk(b, l, "ffn_down.bias"), E, 1, &L->b_down)))
            return st;
        L->window = layer_slides(m, l) ? in->sliding_window : 0;
        L->rope_set = L->window > 0;
    }
    return DHSA_OK;
}

/* Every tensor of the file was looked up by bind_all, or the model is
 * refused naming the first that was not: running without it would compute
 * something else than the file describes, silently (llama.cpp refuses
 * such a file too: "wrong number of tensors"). */
static dhsa_status check_all_used(const dhsa_model *m, const uint8_t *used) {
    const int64_t n = dhsa_gguf_n_tensors(m->g);
    int64_t first = -1, n_unused = 0;
    for (int64_t i = 0; i < n; i++)
        if (!used[i]) {
            if (first < 0) first = i;
            n_unused++;
        }
    if (first < 0) return DHSA_OK;
    char more[64] = "";
    if (n_unused > 1) snprintf(more, sizeof more, " (and %lld more)", (long long)(n_unused - 1));
    return dhsa__fail(DHSA_ERR_UNSUPPORTED,
                      "the model holds tensor \"%s\"%s, which dhsa's %s does not use (llama.cpp would refuse the "
                      "file as well): running without it would give wrong results (docs/model.md lists the tensors "
                      "dhsa applies)",
                      dhsa__esc(dhsa_gguf_tensor_at(m->g, first)->name), more, m->info.arch_name);
}

static dhsa_status check_finite_all(const dhsa_model *m) {
    const dhsa_wmat *mats[8];
    int n = 0;
    mats[n++] = &m->tok_embd;
    if (!m->info.tied_output) mats[n++] = &m->output;
    for (int i = 0; i < n; i++) {
        dhsa_status st = dhsa__wt_check_finite(mats[i]->type, mats[i]->data, mats[i]->n_out, mats[i]->n_in);
        if (st) return st;
    }
    for (int64_t l = 0; l < m->info.n_layer; l++) {
        const dhsa__layer *L = &m->layers[l];
        const dhsa_wmat *lm[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7; i++) {
            dhsa_status st = dhsa__wt_check_finite(lm[i]->type, lm[i]->data, lm[i]->n_out, lm[i]->n_in);
            if (st) return dhsa__fail(st, "layer %lld: %s", (long long)l, dhsa_last_error());
        }
    }
    return DHSA_OK;
}

/* The type holding most matrix bytes, and the totals. */
static void weight_stats(dhsa_model *m) {
    int64_t by_type[64] = {0};
    const dhsa_gguf *g = m->g;
    m->info.n_params = 0;
    m->info.weight_bytes = 0;
    for (int64_t i = 0; i < dhsa_gguf_n_tensors(g); i++) {
        const dhsa_gguf_tensor *t = dhsa_gguf_tensor_at(g, i);
        int64_t count = 1;
        for (int k = 0; k < t->n_dims; k++) count *= t->dims[k];
        m->info.n_params += count;
        m->info.weight_bytes += (int64_t)t->bytes;
        if (t->n_dims == 2 && t->type < 64) by_type[t->type] += (int64_t)t->bytes;
    }
    uint32_t best = 0;
    for (uint32_t t = 1; t < 64; t++)
        if (by_type[t] > by_type[best]) best = t;
    m->info.weight_type = best;
}

/* -------------------------------------------------------------- load --- */

dhsa_status dhsa_model_from_gguf(dhsa_gguf *g, const dhsa_model_params *p, dhsa_model **out) {
    if (!out) {
        dhsa_gguf_close(g);
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_model_from_gguf: out is NULL");
    }
    *out = NULL;
    if (!g) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_model_from_gguf: no GGUF");
    dhsa_model_params dp = dhsa_model_default_params();
    if (!p) p = &dp;
    dhsa_model *m = calloc(1, sizeof *m);
    if (!m) {
        dhsa_gguf_close(g);
        return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory");
    }
    m->g = g;
    uint8_t *used = NULL; /* [n_tensors] marks of bind_all */
    dhsa_status st = read_hparams(g, m);
    if (st) goto fail;
    int64_t idx;
    const dhsa_gguf_tensor *te = find(g, "token_embd.weight", &idx);
    if (!te || te->n_dims != 2) {
        st = dhsa__fail(DHSA_ERR_FORMAT, "the model has no 2-D tensor \"token_embd.weight\"");
        goto fail;
    }
    m->info.n_vocab = te->dims[1];
    if (m->info.n_vocab < 1 || m->info.n_vocab > MAX_VOCAB) {
        st = dhsa__fail(DHSA_ERR_FORMAT, "vocabulary of %lld tokens", (long long)m->info.n_vocab);
        goto fail;
    }
    m->layers = calloc((size_t)m->info.n_layer, sizeof *m->layers);
    if (!m->layers) {
        st = dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory");
        goto fail;
    }
    used = calloc((size_t)(dhsa_gguf_n_tensors(g) > 0 ? dhsa_gguf_n_tensors(g) : 1), 1);
    if (!used) {
        st = dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory");
        goto fail;
    }
    binder b = {.m = m, .used = used};
    if ((st = bind_all(&b))) goto fail;
    m->vectors = malloc((size_t)(b.n_vectors > 0 ? b.n_vectors : 1) * sizeof(float));
    if (!m->vectors) {
        st = dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory");
        goto fail;
    }
    b.cap_vectors = b.n_vectors > 0 ? b.n_vectors : 1;
    m->n_vector_floats = b.cap_vectors;
    b.n_vectors = 0;
    if ((st = bind_all(&b))) goto fail;
    if ((st = check_all_used(m, used))) goto fail;
    free(used);
    used = NULL;
    const float *factors[3] = {m->rope_freqs, m->rope_long, m->rope_short};
    static const char *const factor_names[3] = {"rope_freqs", "rope_factors_long", "rope_factors_short"};
    for (int f = 0; f < 3; f++)
        for (int64_t i = 0; factors[f] && i < m->info.n_rot / 2; i++)
            if (!(factors[f][i] > 0)) {
                st = dhsa__fail(DHSA_ERR_FORMAT, "%s.weight[%lld] = %g is not positive", factor_names[f],
                                (long long)i, (double)factors[f][i]);
                goto fail;
            }
    if (p->check_finite && (st = check_finite_all(m))) goto fail;
    if ((st = dhsa_tokenizer_from_gguf(g, &m->tok))) goto fail;
    if (dhsa_tokenizer_n_vocab(m->tok) > m->info.n_vocab) {
        st = dhsa__fail(DHSA_ERR_FORMAT, "the tokenizer has %lld tokens but token_embd only %lld rows",
                        (long long)dhsa_tokenizer_n_vocab(m->tok), (long long)m->info.n_vocab);
        goto fail;
    }
    weight_stats(m);
    *out = m;
    return DHSA_OK;
fail:
    free(used);
    dhsa_model_free(m);
    return st;
}

dhsa_status dhsa_model_load(const char *path, const dhsa_model_params *p, dhsa_model **out) {
    if (!out) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_model_load: out is NULL");
    *out = NULL;
    if (!path) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_model_load: path is NULL");
    dhsa_model_params dp = dhsa_model_default_params();
    if (!p) p = &dp;
    FILE *f = fopen(path, "rb");
    if (!f) return dhsa__fail(DHSA_ERR_IO, "cannot open \"%s\"", path);
    char magic[4] = {0};
    size_t got = fread(magic, 1, 4, f);
    fclose(f);
    dhsa_gguf *g = NULL;
    dhsa_status st;
    if (got == 4 && memcmp(magic, "GGUF", 4) == 0) {
        st = dhsa_gguf_open(path, &g);
    } else if (p->tokenizer_path) {
        st = dhsa_llama2c_open(path, p->tokenizer_path, &g);
    } else {
        return dhsa__fail(DHSA_ERR_FORMAT, "\"%s\" is not a GGUF file (a llama2.c checkpoint needs its tokenizer "
                          "file: --tokenizer tok.bin)", path);
    }
    if (st) return st;
    return dhsa_model_from_gguf(g, p, out);
}

void dhsa_model_free(dhsa_model *m) {
    if (!m) return;
    dhsa_tokenizer_free(m->tok);
    dhsa_gguf_close(m->g);
    free(m->layers);
    free(m->vectors);
    free(m);
}

const dhsa_model_info *dhsa_model_get_info(const dhsa_model *m) { return m ? &m->info : NULL; }

dhsa_status dhsa_model_routes(const dhsa_model *m, int exact, char *buf, size_t n) {
    if (!m || !buf || n == 0) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_model_routes: m and buf must be set, n >= 1");
    /* the distinct types of every matrix, in first-seen order */
    uint32_t types[32];
    int nt = 0;
    for (int64_t l = -1; l < m->info.n_layer; l++) {
        const dhsa_wmat *ms[7];
        int k = 0;
        if (l < 0) {
            ms[k++] = &m->output;
        } else {
            const dhsa__layer *L = &m->layers[l];
            const dhsa_wmat *all[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
            for (int i = 0; i < 7; i++) ms[k++] = all[i];
        }
        for (int i = 0; i < k; i++) {
            if (!ms[i]->data) continue;
            int seen = 0;
            for (int j = 0; j < nt; j++) seen |= types[j] == ms[i]->type;
            if (!seen && nt < 32) types[nt++] = ms[i]->type;
        }
    }
    /* group the types by path name */
    buf[0] = '\0';
    size_t used = 0;
    int done[32] = {0};
    for (int i = 0; i < nt; i++) {
        if (done[i]) continue;
        const char *path = dhsa__matmul_path_name(exact ? DHSA_MM_EXACT : DHSA_MM_FAST, types[i]);
        for (int j = i; j < nt; j++) {
            if (done[j] || strcmp(path, dhsa__matmul_path_name(exact ? DHSA_MM_EXACT : DHSA_MM_FAST, types[j]))) continue;
            done[j] = 1;
            int w = snprintf(buf + used, n - used, "%s%s", j == i ? (used ? "; " : "") : ", ", dhsa_ggml_type_name(types[j]));
            used += w > 0 && (size_t)w < n - used ? (size_t)w : n - used - 1;
        }
        int w = snprintf(buf + used, n - used, ": %s", path);
        used += w > 0 && (size_t)w < n - used ? (size_t)w : n - used - 1;
    }
    /* prefill on the AMX tiles (matmul/amx.h): said once */
    for (int i = 0; i < nt; i++) {
        const char *pre = dhsa__matmul_prefill_name(exact ? DHSA_MM_EXACT : DHSA_MM_FAST, types[i]);
        if (!pre) continue;
        int w = snprintf(buf + used, n - used, "; calls of >= %d tokens (prefill): %s", DHSA__AMX_MIN_TOK, pre);
        used += w > 0 && (size_t)w < n - used ? (size_t)w : n - used - 1;
        break;
    }
    return DHSA_OK;
}
const dhsa_gguf *dhsa_model_gguf(const dhsa_model *m) { return m ? m->g : NULL; }
const dhsa_tokenizer *dhsa_model_tokenizer(const dhsa_model *m) { return m ? m->tok : NULL; }
