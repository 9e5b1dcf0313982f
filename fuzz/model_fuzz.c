/* model_fuzz.c: libFuzzer harness for loading a model from GGUF bytes
 * (dhsa_gguf_open_memory + dhsa_model_from_gguf, src/model/model.c) and
 * running it. An input that loads is run for two tokens of prefill and one
 * of decode with a one-thread session of 8 tokens, then freed; the model's
 * tokenizer tokenizes a short text.
 *
 * Contracts checked (a broken one aborts so libFuzzer keeps the input):
 * a refusal leaves *out NULL and a sentence in dhsa_last_error(); a loaded
 * model reports sane sizes; the session's plan is the sum of its parts;
 * eval of in-range ids succeeds, and an id out of range is refused; the
 * tokenizer's ids lie inside its vocabulary; once everything is freed
 * (and the scratch trimmed) the context holds no memory.
 *
 * Run: make fuzz (FUZZ_SECONDS per harness; MODEL_FUZZ_VERBOSE=1 says what
 * each input did). Seeds (the Makefile's fuzz target): tiny models written
 * by `dhsa gen-model` (llama and qwen2, F32 / F16 / BF16 / Q8_0 / Q4_0 /
 * Q4_K / Q6_K; one each of qwen3, gemma2, gemma3 with a window and phi3
 * with LongRoPE factors), models/dhsa-retrieval-8m-q8_0.gguf and
 * ../shared/models/stories260K.gguf when present.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dhsa.h"

static dhsa_ctx *ctx;
static int verbose; /* MODEL_FUZZ_VERBOSE=1: one line per input (what loaded, what ran) */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = 1; /* deterministic, and the machine is shared */
    verbose = getenv("MODEL_FUZZ_VERBOSE") != NULL;
    if (dhsa_ctx_create(&cp, &ctx)) {
        fprintf(stderr, "model_fuzz: dhsa_ctx_create: %s\n", dhsa_last_error());
        abort();
    }
    return 0;
}

static void contract(int ok, const char *what) {
    if (ok) return;
    fprintf(stderr, "model_fuzz: broken contract: %s (last error: \"%s\")\n", what, dhsa_last_error());
    abort();
}

/* The refusal contract of every call here: an error has a sentence. */
static void refused_with_sentence(dhsa_status st, const char *what) {
    if (st != DHSA_OK) contract(dhsa_last_error()[0] != 0, what);
}

static void run_model(const dhsa_model *m) {
    const dhsa_model_info *in = dhsa_model_get_info(m);
    contract(in && in->n_vocab >= 1 && in->n_embd >= 1 && in->n_layer >= 1 && in->n_head >= 1 &&
                 in->n_head_kv >= 1 && in->head_dim_k >= 1 && in->head_dim_v >= 1 && in->n_params > 0 &&
                 in->weight_bytes > 0,
             "a loaded model reports positive sizes");
    const int64_t V = in->n_vocab;

    dhsa_session_params sp = dhsa_session_default_params();
    sp.n_ctx = 8;
    sp.n_ubatch = 2;
    sp.mem_limit = (size_t)1 << 30;
    dhsa_mem_plan plan;
    dhsa_status st = dhsa_session_plan(ctx, m, &sp, &plan);
    refused_with_sentence(st, "dhsa_session_plan refused without a sentence");
    if (st != DHSA_OK) return;
    contract(plan.total == plan.weights + plan.kv_cache + plan.activations + plan.attn_workspace +
                               plan.matmul_workspace + plan.routing + plan.process,
             "the plan's total is the sum of its parts");

    dhsa_session *s = NULL;
    st = dhsa_session_create(ctx, m, &sp, &s);
    refused_with_sentence(st, "dhsa_session_create refused without a sentence");
    contract((st == DHSA_OK) == (s != NULL), "dhsa_session_create: *out set iff DHSA_OK");
    if (st != DHSA_OK && verbose) fprintf(stderr, "model_fuzz: no session: %s\n", dhsa_last_error());
    if (st != DHSA_OK) return;

    float *logits = malloc((size_t)V * sizeof(float)); /* [V]: the last token's */
    contract(logits != NULL, "malloc of the logits");
    int32_t ids[2] = {0, (int32_t)(V - 1)};
    st = dhsa_session_eval(s, ids, 2, logits);
    refused_with_sentence(st, "dhsa_session_eval refused without a sentence");
    if (verbose)
        fprintf(stderr, "model_fuzz: %s, %lld layers, vocab %lld: prefill %s\n", in->arch_name,
                (long long)in->n_layer, (long long)V, st == DHSA_OK ? "ok" : dhsa_last_error());
    if (st == DHSA_OK) {
        contract(dhsa_session_length(s) == 2, "the cache holds the two tokens evaluated");
        int32_t next = (int32_t)(V / 2);
        st = dhsa_session_eval(s, &next, 1, logits);
        refused_with_sentence(st, "dhsa_session_eval (decode) refused without a sentence");
        int32_t bad = (int32_t)V;
        contract(dhsa_session_eval(s, &bad, 1, logits) == DHSA_ERR_INVALID_ARG && dhsa_last_error()[0],
                 "an id out of range is DHSA_ERR_INVALID_ARG with a sentence");
    }
    free(logits);
    dhsa_session_free(s);

    const dhsa_tokenizer *tok = dhsa_model_tokenizer(m);
    if (tok) {
        static const char text[] = "Once upon a time, 42 \xc3\xa9t\xc3\xa9s.";
        int32_t tids[64];
        int64_t n = 0;
        st = dhsa_tokenize(tok, text, (int64_t)sizeof text - 1, dhsa_tokenizer_default_flags(tok), tids, 64, &n);
        refused_with_sentence(st, "dhsa_tokenize refused without a sentence");
        if (st == DHSA_OK)
            for (int64_t i = 0; i < n; i++)
                contract(tids[i] >= 0 && tids[i] < dhsa_tokenizer_n_vocab(tok), "token ids inside the vocab");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dhsa_gguf *g = NULL;
    dhsa_status st = dhsa_gguf_open_memory(data, size, &g);
    refused_with_sentence(st, "dhsa_gguf_open_memory refused without a sentence");
    contract((st == DHSA_OK) == (g != NULL), "dhsa_gguf_open_memory: *out set iff DHSA_OK");
    if (st != DHSA_OK) {
        if (verbose) fprintf(stderr, "model_fuzz: not GGUF: %s\n", dhsa_last_error());
        return 0;
    }

    dhsa_model_params mp = dhsa_model_default_params();
    dhsa_model *m = (dhsa_model *)(uintptr_t)1; /* must come back NULL on failure */
    st = dhsa_model_from_gguf(g, &mp, &m); /* takes g over, also on failure */
    refused_with_sentence(st, "dhsa_model_from_gguf refused without a sentence");
    contract((st == DHSA_OK) == (m != NULL), "dhsa_model_from_gguf: *out set iff DHSA_OK, NULL otherwise");
    if (st != DHSA_OK && verbose) fprintf(stderr, "model_fuzz: refused: %s\n", dhsa_last_error());
    if (st == DHSA_OK) {
        run_model(m);
        dhsa_model_free(m);
    }
    dhsa_ctx_trim(ctx); /* the kernels' scratch stays between calls by design */
    contract(dhsa_ctx_mem_stats(ctx).in_use == 0, "the context holds nothing once the session is freed");
    return 0;
}
