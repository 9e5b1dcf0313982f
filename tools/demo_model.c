/* demo_model.c: the model part of `dhsa demo`: the shipped default model
 * (or -m MODEL) answers a passkey question hidden in a long prompt, with
 * dense attention and with DHSA, fixed blocks and streaming at 6.25%
 * density, with the routing every entry point runs (dhsa_router_params_for). Prints, per method, the
 * answer, whether it is right, the density really used (selected / causal
 * keys, from the session statistics) and the prefill time. Declared in tools/cli.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "dhsa.h"

int dhsa_cli_model_demo(const char *model, int64_t L, int threads) {
    dhsa_model *m = NULL;
    dhsa_ctx *ctx = NULL;
    dhsa_model_params mp = dhsa_model_default_params();
    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = threads;
    if (dhsa_model_load(model, &mp, &m) || dhsa_ctx_create(&cp, &ctx)) {
        fprintf(stderr, "dhsa demo: %s\n", dhsa_last_error());
        dhsa_model_free(m);
        return 1;
    }
    const dhsa_model_info *in = dhsa_model_get_info(m);
    const dhsa_tokenizer *tok = dhsa_model_tokenizer(m);
    dhsa_task_params tp = dhsa_task_default_params();
    tp.kind = DHSA_TASK_PASSKEY;
    tp.length = L;
    tp.depth = 0.3;
    tp.seed = 7;
    dhsa_task t;
    if (dhsa_task_build(tok, &tp, &t)) {
        fprintf(stderr, "dhsa demo: %s\n", dhsa_last_error());
        dhsa_ctx_free(ctx);
        dhsa_model_free(m);
        return 1;
    }
    printf("dhsa demo: the model %s (%lld layers, %.1f M parameters) reads a %lld-token prompt with a pass key at "
           "depth %.2f\n  (built-in filler; \"...The pass key is NNNNN. Remember it...\" then \"What is the pass key? "
           "The pass key is\"); want%s\n\n",
           model, (long long)in->n_layer, (double)in->n_params / 1e6, (long long)t.n_ids, t.depth_used, t.answer);
    printf("  %-8s %-10s %-10s %-14s %s\n", "method", "answer", "right", "density used", "prefill");
    static const dhsa_attn_method methods[] = {DHSA_ATTN_DENSE, DHSA_ATTN_DHSA, DHSA_ATTN_BLOCK, DHSA_ATTN_STREAM};
    float *lg = malloc((size_t)in->n_vocab * sizeof(float));
    int rc = lg ? 0 : 1;
    int32_t eos = dhsa_tokenizer_eos(tok);
    for (size_t k = 0; k < sizeof methods / sizeof methods[0] && !rc; k++) {
        dhsa_session_params sp = dhsa_session_default_params();
        sp.n_ctx = t.n_ids + 16;
        sp.attn = methods[k];
        sp.router.density = 0.0625; /* the routing every entry point runs: dhsa_router_params_for */
        dhsa_session *s = NULL;
        if (dhsa_session_create(ctx, m, &sp, &s)) {
            fprintf(stderr, "dhsa demo: %s\n", dhsa_last_error());
            rc = 1;
            break;
        }
        double t0 = dhsa_cli_now();
        dhsa_status st = dhsa_session_eval(s, t.ids, t.n_ids, lg);
        double secs = dhsa_cli_now() - t0;
        dhsa_attn_stats da;
        dhsa_session_get_stats(s, &da, NULL);
        double dens = da.density;
        int32_t ans[12];
        int64_t na = 0;
        while (!st && na < 12) {
            int32_t best = 0;
            for (int64_t i = 1; i < in->n_vocab; i++)
                if (lg[i] > lg[best]) best = (int32_t)i;
            if (best == eos) break;
            ans[na++] = best;
            st = dhsa_session_eval(s, &best, 1, lg);
        }
        dhsa_session_free(s);
        if (st) {
            fprintf(stderr, "dhsa demo: %s\n", dhsa_last_error());
            rc = 1;
            break;
        }
        char text[256];
        int64_t len = 0;
        if (dhsa_detokenize(tok, ans, na, 0, text, sizeof text - 1, &len)) len = 0;
        text[len] = 0;
        for (char *c = text; *c; c++)
            if (*c == '\n') *c = ' ';
        char shown[24];
        snprintf(shown, sizeof shown, "\"%.8s\"", text);
        printf("  %-8s %-10s %-10s %-14.4f %.2f s\n", dhsa_attn_method_name(methods[k]), shown,
               dhsa_task_check(&t, text, len) ? "yes" : "no", dens, secs);
    }
    printf("\n  (dhsa eval passkey|multikey|multivalue measures this over lengths, depths and keys; docs/eval.md)\n");
    free(lg);
    dhsa_task_free(&t);
    dhsa_ctx_free(ctx);
    dhsa_model_free(m);
    return rc;
}
