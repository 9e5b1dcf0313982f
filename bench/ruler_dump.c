/* ruler_dump.c: a development probe for multi-needle routing on a real
 * model (docs/dhsa.md, "Multi-needle tasks"). Builds one RULER prompt of
 * the dev split (multikey, multiquery, ...; the model's chat template),
 * runs it densely and writes, as bench/route_dump.c does, per layer the
 * post-RoPE keys of the whole prompt and the queries of its last R rows
 * (header span = the first asked value's tokens), plus OUT.spans: one line
 * per needle sentence "asked|other LO HI VLO VHI text" (sentence and value
 * token ranges), read by bench/ruler_probe.py.
 *
 *   cc -std=c11 -O2 -Iinclude -o build/ruler_dump bench/ruler_dump.c build/libdhsa.a -lpthread -lm
 *   build/ruler_dump MODEL TASK LENGTH DEPTH SEED R OUT [answer]
 *
 * SEED: the prompt's dhsa_ruler_params.seed; "answer" appends " " and the
 * first expected value less its last token (teacher forcing), so the last
 * rows are those that predict the value.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dhsa.h"

typedef struct {
    FILE *f;
    int64_t R, n;
    int bad;
} dump;

static float get(const dhsa_tensor *t, int64_t h, int64_t i, int64_t x) {
    return ((const float *)t->data)[h * t->stride[1] + i * t->stride[2] + x * t->stride[3]];
}

static int hook(void *user, int64_t layer, const dhsa_attn_desc *a) {
    (void)layer;
    dump *d = user;
    const int64_t n = a->k.shape[2], Hkv = a->k.shape[1], D = a->k.shape[3], Hq = a->q.shape[1], Lq = a->q.shape[2];
    if (n != d->n || a->k.type != DHSA_F32 || a->q.type != DHSA_F32 || Lq < d->R) {
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
    return 0;
}

/* the token holding byte offset c of the concatenated pieces */
static int64_t tok_at(const int64_t *off, int64_t n, int64_t c) {
    int64_t i = 0;
    while (i + 1 < n && off[i + 1] <= c) i++;
    return i;
}

int main(int argc, char **argv) {
    if (argc != 8 && argc != 9) {
        fprintf(stderr, "usage: %s MODEL TASK LENGTH DEPTH SEED R OUT [answer]\n", argv[0]);
        return 2;
    }
    dhsa_model *m;
    dhsa_model_params mp = dhsa_model_default_params();
    if (dhsa_model_load(argv[1], &mp, &m)) {
        fprintf(stderr, "%s\n", dhsa_last_error());
        return 1;
    }
    const dhsa_tokenizer *tok = dhsa_model_tokenizer(m);
    dhsa_ruler_params tp = dhsa_ruler_default_params();
    if (dhsa_ruler_preset(argv[2], &tp)) {
        fprintf(stderr, "%s\n", dhsa_last_error());
        return 1;
    }
    tp.length = atoll(argv[3]);
    tp.depth = atof(argv[4]);
    tp.seed = strtoull(argv[5], NULL, 10);
    tp.split = DHSA_RULER_DEV;
    char *prose = NULL;
    int64_t prose_len = 0;
    if (tp.haystack == DHSA_RULER_PROSE) {
        if (dhsa_ruler_load_prose(NULL, DHSA_RULER_DEV, &prose, &prose_len)) {
            fprintf(stderr, "%s\n", dhsa_last_error());
            return 1;
        }
        tp.prose = prose;
        tp.prose_len = prose_len;
    }
    const char *how;
    if (dhsa_chat_choose(dhsa_model_gguf(m), &tp.tmpl, &how)) tp.tmpl = DHSA_CHAT_NONE;
    dhsa_ruler_prompt pr;
    if (dhsa_ruler_build(tok, &tp, &pr)) {
        fprintf(stderr, "%s\n", dhsa_last_error());
        return 1;
    }
    if (argc > 8 && strcmp(argv[8], "answer") == 0) { /* teacher-force " " + the first expected value, less its
                                                         last token: the last rows then predict its digits */
        char ans[64];
        snprintf(ans, sizeof ans, " %s", pr.expected[0]);
        int32_t extra[64];
        int64_t ne = 0;
        dhsa_tokenize(tok, ans, (int64_t)strlen(ans), 0, extra, 64, &ne);
        int32_t *ids = realloc(pr.ids, (size_t)(pr.n_ids + ne) * sizeof(int32_t));
        if (!ids) return 1;
        for (int64_t i = 0; i + 1 < ne; i++) ids[pr.n_ids + i] = extra[i];
        pr.ids = ids;
        pr.n_ids += ne - 1;
    }
    const int64_t n = pr.n_ids;
    /* byte offsets of every token's piece */
    int64_t *off = malloc((size_t)(n + 1) * sizeof(int64_t));
    char *text = malloc((size_t)n * 64 + 1);
    int64_t tl = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t l = 0;
        off[i] = tl;
        if (dhsa_detokenize(tok, &pr.ids[i], 1, DHSA_DETOKENIZE_SPECIAL | DHSA_DETOKENIZE_KEEP_SPACE, text + tl, 63,
                            &l))
            l = 0;
        tl += l;
    }
    off[n] = tl;
    text[tl] = 0;
    char spath[4096];
    snprintf(spath, sizeof spath, "%s.spans", argv[7]);
    FILE *sf = fopen(spath, "w");
    int64_t span_lo = 0, span_hi = 0;
    const char *pat = "The secret ";
    for (const char *p = strstr(text, pat); p; p = strstr(p + 1, pat)) {
        const char *is = strstr(p, " is: ");
        const char *dot = is ? strstr(is + 5, ".") : NULL;
        if (!is || !dot || dot - p > 200) continue;
        char val[64];
        int vl = (int)(dot - (is + 5));
        if (vl <= 0 || vl >= 64) continue;
        memcpy(val, is + 5, (size_t)vl);
        val[vl] = 0;
        int asked = 0;
        for (int k = 0; k < pr.n_expected; k++) asked |= strcmp(pr.expected[k], val) == 0;
        int64_t lo = tok_at(off, n, p - text), hi = tok_at(off, n, dot - text) + 1;
        int64_t vlo = tok_at(off, n, is + 5 - text), vhi = tok_at(off, n, dot - 1 - text) + 1;
        if (hi > n - 300) continue; /* the question and answer prefix, not a needle */
        fprintf(sf, "%s %lld %lld %lld %lld %.*s\n", asked ? "asked" : "other", (long long)lo, (long long)hi,
                (long long)vlo, (long long)vhi, (int)(dot - p), p);
        if (asked && !span_hi) span_lo = vlo, span_hi = vhi;
    }
    fclose(sf);
    const dhsa_model_info *in = dhsa_model_get_info(m);
    dump d = {fopen(argv[7], "wb"), atoll(argv[6]), n, 0};
    int64_t hdr[9] = {0x44485341, in->n_layer, in->n_head, in->n_head_kv, in->head_dim_k, n, d.R, span_lo, span_hi};
    fwrite(hdr, sizeof(int64_t), 9, d.f);
    float scale = in->attn_scale;
    fwrite(&scale, sizeof scale, 1, d.f);
    dhsa_ctx *ctx;
    dhsa_ctx_params cp = dhsa_ctx_default_params();
    dhsa_ctx_create(&cp, &ctx);
    dhsa_session_params sp = dhsa_session_default_params();
    sp.n_ctx = n;
    sp.n_ubatch = n;
    sp.kv_type = DHSA_F32;
    sp.layer_hook = hook;
    sp.layer_hook_user = &d;
    dhsa_session *s;
    if (dhsa_session_create(ctx, m, &sp, &s)) {
        fprintf(stderr, "%s\n", dhsa_last_error());
        return 1;
    }
    float *logits = malloc((size_t)in->n_vocab * sizeof(float));
    if (dhsa_session_eval(s, pr.ids, n, logits) || d.bad) {
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
    dhsa_detokenize(tok, &bid, 1, 0, piece, sizeof piece - 1, &pl);
    piece[pl < 63 ? pl : 63] = 0;
    printf("n %lld expected", (long long)n);
    for (int k = 0; k < pr.n_expected; k++) printf(" %s", pr.expected[k]);
    printf(" dense first token '%s'\n", piece);
    dhsa_session_free(s);
    dhsa_ctx_free(ctx);
    dhsa_ruler_free(&pr);
    dhsa_model_free(m);
    free(logits);
    free(off);
    free(text);
    dhsa_ruler_text_free(prose);
    return 0;
}
