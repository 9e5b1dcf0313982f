/* model_internal.h: the loaded model as the forward pass sees it
 * (src/model/model.c fills it, src/model/session.c runs it).
 */
#ifndef DHSA_MODEL_INTERNAL_H
#define DHSA_MODEL_INTERNAL_H

#include "dhsa.h"
#include "model/quant.h"

/* One decoder layer. Vectors are F32 copies owned by the model (NULL when
 * the architecture has none); matrices point into the mapped file. */
typedef struct {
    const float *attn_norm;      /* [n_embd] */
    const float *post_attn_norm; /* [n_embd] gemma2 */
    const float *ffn_norm;       /* [n_embd] */
    const float *post_ffw_norm;  /* [n_embd] gemma2, gemma3 */
    const float *q_norm, *k_norm; /* [hd_k] per-head RMSNorm weights (qwen3, gemma3) */
    const float *bq, *bk, *bv;   /* [n_head*hd_k], [n_head_kv*hd_k], [n_head_kv*hd_v] */
    const float *bo;             /* [n_embd] attn_output.bias */
    const float *b_gate, *b_up;  /* [n_ff] ffn_gate.bias, ffn_up.bias */
    const float *b_down;         /* [n_embd] ffn_down.bias */
    /* Matrices; with a fused attn_qkv.weight, wq, wk and wv are views of
     * its three row ranges (q rows first, then k, then v). */
    dhsa_wmat wq;                /* [n_embd] -> [n_head * hd_k] */
    dhsa_wmat wk;                /* [n_embd] -> [n_head_kv * hd_k] */
    dhsa_wmat wv;                /* [n_embd] -> [n_head_kv * hd_v] */
    dhsa_wmat wo;                /* [n_head * hd_v] -> [n_embd] */
    dhsa_wmat w_gate, w_up;      /* [n_embd] -> [n_ff]; phi3: views of ffn_up's two halves */
    dhsa_wmat w_down;            /* [n_ff] -> [n_embd] */
    int64_t window;              /* sliding window of this layer; 0 = none */
    int rope_set;                /* 0: the global RoPE, 1: the sliding layers' (rope_base_swa) */
} dhsa__layer;

struct dhsa_model {
    dhsa_gguf *g;
    dhsa_model_info info;
    dhsa_tokenizer *tok;
    dhsa_wmat tok_embd;          /* [n_vocab] rows of [n_embd] */
    dhsa_wmat output;            /* [n_embd] -> [n_vocab] (tok_embd when tied) */
    const float *output_norm;    /* [n_embd] */
    const float *output_bias;    /* [n_vocab] output.bias or NULL */
    const float *rope_freqs;     /* [n_rot / 2] or NULL */
    const float *rope_long, *rope_short; /* [n_rot / 2] rope_factors_long/short or NULL */
    dhsa__layer *layers;         /* [n_layer] */
    int64_t swa_pattern;         /* sliding_window_pattern n: layer l slides when l % n < n - 1 (0: all) */
    dhsa_gguf_array swa_layers;  /* or the key's per-layer flags (n = n_layer), when an array */
    float *vectors;              /* the F32 copies, one allocation */
    int64_t n_vector_floats;     /* its length (for the memory plan) */
};

#endif
