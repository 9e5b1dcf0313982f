/* dhsa/model.h: a model: llama2.c checkpoints (converted to GGUF) and the
 * model runner's load, hyperparameters and weights' products
 * (src/model/model.c, llama2c.c; docs/model.md).
 *
 * A section of the public interface: users include <dhsa.h>, which
 * includes every section in order. This file includes the sections it
 * builds on, so it compiles alone too. The rules every call follows
 * (errors, threads, tensors) are at the top of dhsa.h and in dhsa/core.h.
 */
#ifndef DHSA_MODEL_H
#define DHSA_MODEL_H

#include "tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* llama2.c checkpoints (src/model/llama2c.c, docs/llama2c.md)              */

/* The header of a llama2.c checkpoint (run.c's Config: 7 int32), checked
 * against the file: every field positive, n_heads divides dim, n_kv_heads
 * divides n_heads, the head size even, 3 <= vocab_size <= 2^24, and the
 * file exactly as long as the header implies. */
typedef struct {
    int32_t dim, hidden_dim, n_layers, n_heads, n_kv_heads;
    int32_t vocab_size;     /* |vocab_size| of the file */
    int32_t seq_len;        /* the trained context (llama.context_length) */
    int shared_classifier;  /* 1 (vocab_size > 0 in the file): the output
                               projection is token_embd; 0: its own weights
                               at the end of the file */
    int32_t head_size;      /* dim / n_heads */
    uint64_t file_size;     /* bytes of the checkpoint, header included */
    int64_t n_params;       /* floats of the weights the model uses (the
                               RoPE tables the file also holds excluded) */
} dhsa_llama2c_config;

/* Reads and checks the header of the checkpoint at bin_path (only the
 * header is read; the size comes from the file system). A GGUF file, a
 * llama2.c "ak42" export (version 1/2) and a malformed header are
 * DHSA_ERR_FORMAT with a sentence naming the field; missing files
 * DHSA_ERR_IO. */
DHSA_API dhsa_status dhsa_llama2c_read_config(const char *bin_path, dhsa_llama2c_config *out);
/* The same over the checkpoint's bytes. */
DHSA_API dhsa_status dhsa_llama2c_config_from_memory(const void *bin, size_t size, dhsa_llama2c_config *out);

/* Converts a llama2.c checkpoint and its tokenizer file (tok*.bin: int32
 * max_token_length, then per token float score, int32 length, bytes) into
 * a GGUF image in memory (architecture llama, F32 tensors, llama.cpp
 * names; docs/llama2c.md) and opens it: *out is an ordinary dhsa_gguf that
 * owns the image (dhsa_gguf_close frees it). Both files are checked
 * completely before anything is built: the header as above, every token's
 * length within the file and <= max_token_length, finite scores, no NUL
 * in a token's text, and exactly vocab_size tokens in the tokenizer file.
 * A bad file is DHSA_ERR_FORMAT (DHSA_ERR_TOO_LARGE above a limit) with a
 * sentence that starts with the file's path. Memory: the checkpoint is
 * mapped, the image is about its size. *out is NULL on failure. */
DHSA_API dhsa_status dhsa_llama2c_open(const char *bin_path, const char *tok_path, dhsa_gguf **out);
/* The same over the files' bytes, which are only read during the call.
 * name is general.name (NULL: "llama2.c"). */
DHSA_API dhsa_status dhsa_llama2c_open_memory(const void *bin, size_t bin_size, const void *tok, size_t tok_size,
                                              const char *name, dhsa_gguf **out);
/* Writes the GGUF file dhsa_llama2c_open would build at out_gguf_path
 * (with dhsa_gguf_writer_write_file: a temporary renamed when complete, so
 * a failure leaves no partial file and the old one untouched);
 * general.name is the checkpoint's file name without directory and
 * extension. The output may not be either input. A NaN or infinite weight
 * is DHSA_ERR_NONFINITE, naming the tensor, before anything is written. */
DHSA_API dhsa_status dhsa_convert_llama2c(const char *bin_path, const char *tok_path, const char *out_gguf_path);

/* ------------------------------------------------------------------------ */
/* Model runner (src/model/model.c, docs/model.md)                          */

typedef enum {
    DHSA_ARCH_LLAMA = 1,
    DHSA_ARCH_QWEN2 = 2,
    DHSA_ARCH_GEMMA2 = 3,
    DHSA_ARCH_QWEN3 = 4,  /* qwen2 without required biases, plus per-head RMSNorm of q and k */
    DHSA_ARCH_GEMMA3 = 5, /* gemma2 plus q/k norms, 5 sliding layers in 6, no softcaps by default */
    DHSA_ARCH_PHI3 = 6    /* fused attn_qkv and gate/up (ffn_up holds 2 n_ff rows), LongRoPE factors */
} dhsa_arch;

/* Hyperparameters read from the GGUF metadata (docs/model.md). */
typedef struct {
    dhsa_arch arch;
    const char *arch_name;      /* "llama", "qwen2", "gemma2", "qwen3", "gemma3", "phi3" */
    int64_t n_vocab, n_ctx_train, n_embd, n_layer, n_ff;
    int64_t n_head, n_head_kv, head_dim_k, head_dim_v, n_rot;
    float rms_eps, rope_base, rope_linear_factor;
    int rope_neox;              /* 1: split-half pairs (all but llama) */
    int has_rope_freqs;         /* rope_freqs.weight present */
    float rope_base_swa, rope_linear_factor_swa; /* RoPE of the sliding-window layers (gemma2: the
                                   global ones'; gemma3: rope.freq_base_swa or 10000, no scaling) */
    float rope_attn_factor;     /* rope.scaling.attn_factor: rotated q/k values scaled by it (1 = none) */
    int has_rope_factors;       /* rope_factors_long/short.weight present (LongRoPE, phi3) */
    int64_t n_ctx_orig;         /* rope.scaling.original_context_length: a session with a longer
                                   context uses rope_factors_long, else rope_factors_short */
    int qk_norm;                /* per-head RMSNorm of q and k before RoPE (qwen3, gemma3) */
    int fused_ffn;              /* gate and up in one ffn_up.weight of 2 n_ff rows (phi3) */
    float attn_softcap, final_softcap; /* 0 = none */
    float attn_scale;           /* scores = q.k * attn_scale: 1/sqrt(head_dim_k), but gemma2 with
                                   46 layers and gemma3 with 62 (27B) 1/sqrt(n_embd / n_head), as
                                   llama.cpp */
    int64_t sliding_window;     /* window of the sliding layers (gemma2, gemma3); 0 = none */
    int64_t n_swa_layers;       /* how many layers slide (gemma2: the even ones; gemma3: 5 in 6) */
    int tied_output;            /* output.weight absent: token_embd used */
    uint32_t weight_type;       /* ggml type of most matrix bytes */
    int64_t n_params;           /* values in all tensors */
    int64_t weight_bytes;       /* bytes of all tensors */
} dhsa_model_info;

typedef struct dhsa_model dhsa_model;

typedef struct {
    /* A llama2.c checkpoint (a file without the GGUF magic) needs its
     * tokenizer file (tok*.bin); it is converted in memory. */
    const char *tokenizer_path;
    int check_finite;           /* scan every weight for NaN/Inf (default 1) */
} dhsa_model_params;

DHSA_API dhsa_model_params dhsa_model_default_params(void);
/* A model is read-only once loaded: any number of sessions, on any threads
 * and ctxs, may use one at once ("Threads"). */
/* Loads a GGUF model (mmap; weights are used in place) or a llama2.c
 * checkpoint. Every tensor the architecture needs is checked for presence,
 * type and shape before anything runs; the optional ones it knows (biases,
 * fused QKV, rope_freqs, output.weight: docs/model.md) are applied when
 * present; a tensor it does not use is DHSA_ERR_UNSUPPORTED naming it (as
 * llama.cpp refuses such a file), since ignoring it would give wrong
 * results. Names from the file are escaped in every sentence. *out is
 * NULL on failure. */
DHSA_API dhsa_status dhsa_model_load(const char *path, const dhsa_model_params *p, dhsa_model **out);
/* The same from an open GGUF, which the model takes over (it is closed
 * with the model, or at once on failure). */
DHSA_API dhsa_status dhsa_model_from_gguf(dhsa_gguf *g, const dhsa_model_params *p, dhsa_model **out);
/* NULL is allowed. */
DHSA_API void dhsa_model_free(dhsa_model *m);
DHSA_API const dhsa_model_info *dhsa_model_get_info(const dhsa_model *m);
/* Writes to buf (NUL-terminated, cut to n bytes) what the weight products
 * of a session with this `exact` setting run, per weight type of the
 * model's matrices, e.g. "Q4_K, Q6_K: int8 avx512-vnni; F32: f32 avx512". */
DHSA_API dhsa_status dhsa_model_routes(const dhsa_model *m, int exact, char *buf, size_t n);
DHSA_API const dhsa_gguf *dhsa_model_gguf(const dhsa_model *m);
/* The model's tokenizer (owned by the model). */
DHSA_API const dhsa_tokenizer *dhsa_model_tokenizer(const dhsa_model *m);

#ifdef __cplusplus
}
#endif
#endif /* DHSA_MODEL_H */
