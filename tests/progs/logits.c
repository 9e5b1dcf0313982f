/* logits.c: every token's logits of a GGUF model, dense, F32 KV cache, exact (F32) weight products.
 *
 *   logits MODEL.gguf < ids.txt > logits.f32
 *
 * ids.txt: whitespace-separated token ids (at most 65536). Writes
 * n * n_vocab float32 values (row per token, native byte order) to stdout.
 * Errors: a sentence on stderr, exit 1 (2 for usage). Built by `make test`
 * into build/progs/; used by the trained model's cross-check against
 * PyTorch (python/tests/test_trained_model.py, train/check_logits.py).
 */
#include <stdio.h>
#include <stdlib.h>

#include "dhsa.h"

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: logits MODEL.gguf < ids.txt > logits.f32\n");
        return 2;
    }
    enum { MAX_IDS = 65536 };
    static int32_t ids[MAX_IDS];
    long v;
    int64_t n = 0;
    while (n < MAX_IDS && scanf("%ld", &v) == 1) ids[n++] = (int32_t)v;
    if (n == 0) {
        fprintf(stderr, "logits: no token ids on stdin\n");
        return 1;
    }
    dhsa_model_params mp = dhsa_model_default_params();
    dhsa_model *m = NULL;
    dhsa_ctx *ctx = NULL;
    dhsa_session *s = NULL;
    float *out = NULL;
    int rc = 1;
    if (dhsa_model_load(argv[1], &mp, &m) || dhsa_ctx_create(NULL, &ctx)) goto done;
    const dhsa_model_info *in = dhsa_model_get_info(m);
    dhsa_session_params sp = dhsa_session_default_params();
    sp.kv_type = DHSA_F32; /* compared with F32 references (the default is F16) */
    sp.exact = 1; /* the cross-check is of the exact forward (F32 products); the fast route is held to its own bound in test_model_ref */
    sp.n_ctx = n;
    sp.logits_all = 1;
    if (dhsa_session_create(ctx, m, &sp, &s)) goto done;
    out = malloc((size_t)n * (size_t)in->n_vocab * sizeof(float));
    if (!out) {
        fprintf(stderr, "logits: out of memory\n");
        goto done;
    }
    if (dhsa_session_eval(s, ids, n, out)) goto done;
    rc = fwrite(out, sizeof(float), (size_t)n * (size_t)in->n_vocab, stdout) == (size_t)n * (size_t)in->n_vocab ? 0 : 1;
done:
    if (rc && dhsa_last_error()[0]) fprintf(stderr, "logits: %s\n", dhsa_last_error());
    free(out);
    dhsa_session_free(s);
    dhsa_ctx_free(ctx);
    dhsa_model_free(m);
    return rc;
}
