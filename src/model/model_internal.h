/* model_internal.h: the loaded model as the forward pass sees it
 * (src/model/model.c fills it, src/model/session.c runs it).
 */
#ifndef DHSA_MODEL_INTERNAL_H
#define DHSA_MODEL_INTERNAL_H

#include "dhsa.h"
#include "matmul/matmul.h"

#include <stdatomic.h>

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
    _Atomic uint64_t file_hash;  /* the file's bytes hashed (session_state.c), once asked; 0: not yet */
};

/* ---- what src/model/session_state.c (saved prefills) needs of a session
 * (src/model/session.c defines them) ---- */

/* Marks the session busy (DHSA_ERR_BUSY, as an eval would, when it is);
 * refuses a context-parallel session and one a failed eval broke. */
dhsa_status dhsa__session_state_enter(dhsa_session *s, const char *call);
void dhsa__session_state_leave(dhsa_session *s);

/* What decides a session's state besides the tokens. */
typedef struct {
    const dhsa_model *m;
    const dhsa_session_params *p;
    const dhsa_router_params *rp;  /* the routing the method runs with */
    const dhsa_mem_plan *plan;
    int64_t len;                   /* tokens in the cache */
    const float *inv_freq;         /* [n_inv_freq] RoPE frequencies (global, then sliding) */
    int64_t n_inv_freq;
    const float *koff;             /* [n_koff] Q8_0 keys' offsets, or NULL */
    int64_t n_koff;
} dhsa__state_info;
void dhsa__session_state_info(const dhsa_session *s, dhsa__state_info *out);

/* Layer l's cache: K rows k [n_head_kv][rows][row_k bytes], V likewise,
 * holding positions [base, base + rows); ring: a sliding-window ring
 * (its rows are fewer than the context's). */
typedef struct {
    char *k, *v;
    size_t row_k, row_v;
    int64_t rows, base;
    int ring;
} dhsa__state_layer;
void dhsa__session_state_layer(const dhsa_session *s, int64_t l, dhsa__state_layer *out);

/* After the caches' rows were written: the session holds len tokens, layer
 * l's rows starting at position base[l]; the routing indexes are made
 * again from the cache's keys, the statistics start from zero. On failure
 * the cache is empty (as after dhsa_session_reset). */
dhsa_status dhsa__session_state_commit(dhsa_session *s, int64_t len, const int64_t *base);
/* The checksum a state file ends with, of its bytes before it (for the
 * fuzz harness, fuzz/state_fuzz.c, to see past it). */
uint64_t dhsa__state_checksum(const void *data, size_t n);
/* Empties the cache (a load that failed half way). */
void dhsa__session_state_clear(dhsa_session *s);

#endif
