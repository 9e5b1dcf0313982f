/* route_dump.c: a development probe for choosing DHSA's routing on a real
 * model (docs/dhsa.md, "Real pretrained models"). Builds one retrieval
 * task (passkey / multikey) from a filler text and seed of the caller's
 * choosing, runs it densely, and writes per layer the post-RoPE keys of
 * the whole prompt and the queries of its last R rows to a file that
 * bench/route_probe.py reads (which chunk scores, boundaries and key
 * centrings would select the needle, against the true attention).
 *
 *   make build/route_dump
 *   build/route_dump MODEL FILLER KIND LENGTH DEPTH SEED R OUT
 *
 * OUT: int64 header [magic 0x44485341, n_layer, Hq, Hkv, d, n, R,
 * span_lo, span_hi, window of each layer...], float scale, then per layer
 * K [Hkv][n][d] and Q [Hq][R][d] (float32, little-endian).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dhsa.h"

typedef struct {
    FILE *f;
    int64_t R, n, last_layer;
    int bad;
} dump;

static float get(const dhsa_tensor *t, int64_t h, int64_t i, int64_t x) {
    return ((const float *)t->data)[h * t->stride[1] + i * t->stride[2] + x * t->stride[3]];
}

static int hook(void *user, int64_t layer, const dhsa_attn_desc *a) {
    dump *d = user;
    int64_t n = a->k.shape[2];
    if (n != d->n) return 0; /* only the last ubatch (the whole cache) */
    const int64_t Hkv = a->k.shape[1], D = a->k.shape[3], Hq = a->q.shape[1], Lq = a->q.shape[2];
    if (a->k.type != DHSA_F32 || a->q.type != DHSA_F32 || Lq < d->R) {
        d->bad = 1;
        return 1;
    }
    float *row = malloc((size_t)D * sizeof(float));
    for (int64_t h = 0; h < Hkv; h++)
        for (int64_t i = 0; i < n; i++) {
            for (int64_t x = 0; x < D; x++) row[x] = get(&a->k, h, i, x);
            fwrite(row, sizeof(float), (size_t)D, d->f);
        }
    for (int64_t h = 0; h < Hq; h++)
        for (int64_t i = Lq - d->R; i < Lq; i++) {
            for (int64_t x = 0; x < D; x++) row[x] = get(&a->q, h, i, x);
            fwrite(row, sizeof(float), (size_t)D, d->f);
        }
    free(row);
    d->last_layer = layer;
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 9) {
        fprintf(stderr, "usage: %s MODEL FILLER passkey|multikey LENGTH DEPTH SEED R OUT\n", argv[0]);
        return 2;
    }
    dhsa_model *m;
    dhsa_model_params mp = dhsa_model_default_params();
    if (dhsa_model_load(argv[1], &mp, &m)) {
        fprintf(stderr, "%s\n", dhsa_last_error());
        return 1;
    }
    FILE *ff = fopen(argv[2], "rb");
    if (!ff) return 1;
    fseek(ff, 0, SEEK_END);
    long fl = ftell(ff);
    fseek(ff, 0, SEEK_SET);
    char *filler = malloc((size_t)fl + 1);
    if (fread(filler, 1, (size_t)fl, ff) != (size_t)fl) return 1;
    filler[fl] = 0;
    fclose(ff);
    dhsa_task_params tp = dhsa_task_default_params();
    tp.kind = strcmp(argv[3], "multikey") == 0 ? DHSA_TASK_MULTIKEY : DHSA_TASK_PASSKEY;
    tp.length = atoll(argv[4]);
    tp.depth = atof(argv[5]);
    tp.seed = strtoull(argv[6], NULL, 10);
    tp.filler = filler;
    tp.filler_len = fl;
    tp.heldout_numbers = 0; /* development: the training set's numbers */
    dhsa_task task;
    if (strcmp(argv[3], "text") == 0) { /* the filler itself, its first LENGTH tokens (no needle) */
        memset(&task, 0, sizeof task);
        task.ids = malloc((size_t)(tp.length + 1) * sizeof(int32_t));
        int64_t n = 0;
        if (dhsa_tokenize(dhsa_model_tokenizer(m), filler, fl, 0, task.ids, tp.length, &n) && n < tp.length) {
            fprintf(stderr, "%s\n", dhsa_last_error());
            return 1;
        }
        task.n_ids = n < tp.length ? n : tp.length;
        task.n_spans = 1;
    } else if (dhsa_task_build(dhsa_model_tokenizer(m), &tp, &task)) {
        fprintf(stderr, "%s\n", dhsa_last_error());
        return 1;
    }
    const dhsa_model_info *in = dhsa_model_get_info(m);
    dump d = {fopen(argv[8], "wb"), atoll(argv[7]), task.n_ids, -1, 0};
    int64_t hdr[16 + 256] = {0x44485341, in->n_layer, in->n_head, in->n_head_kv, in->head_dim_k, task.n_ids, d.R,
                             task.span_lo[0], task.span_hi[0]};
    fwrite(hdr, sizeof(int64_t), 9, d.f);
    float scale = in->attn_scale;
    fwrite(&scale, sizeof scale, 1, d.f);
    dhsa_ctx *ctx;
    dhsa_ctx_params cp = dhsa_ctx_default_params();
    dhsa_ctx_create(&cp, &ctx);
    dhsa_session_params sp = dhsa_session_default_params();
    sp.n_ctx = task.n_ids;
    sp.n_ubatch = task.n_ids;
    sp.kv_type = DHSA_F32; /* the hook reads F32 rows */
    sp.layer_hook = hook;
    sp.layer_hook_user = &d;
    dhsa_session *s;
    if (dhsa_session_create(ctx, m, &sp, &s)) {
        fprintf(stderr, "%s\n", dhsa_last_error());
        return 1;
    }
    float *logits = malloc((size_t)in->n_vocab * sizeof(float));
    if (dhsa_session_eval(s, task.ids, task.n_ids, logits) || d.bad) {
        fprintf(stderr, "eval: %s\n", dhsa_last_error());
        return 1;
    }
    fclose(d.f);
    int64_t best = 0;
    for (int64_t v = 1; v < in->n_vocab; v++)
        if (logits[v] > logits[best]) best = v;
    char piece[64];
    int64_t pl = 0;
    int32_t bid = (int32_t)best;
    dhsa_detokenize(dhsa_model_tokenizer(m), &bid, 1, 0, piece, sizeof piece - 1, &pl);
    piece[pl < 63 ? pl : 63] = 0;
    printf("n %lld span [%lld, %lld) answer '%s' dense first token '%s'\n", (long long)task.n_ids,
           (long long)task.span_lo[0], (long long)task.span_hi[0], task.answer, piece);
    dhsa_session_free(s);
    dhsa_ctx_free(ctx);
    dhsa_task_free(&task);
    dhsa_model_free(m);
    free(logits);
    free(filler);
    return 0;
}
