/* train.c: `dhsa train-boundary`, training of the learned boundary
 * predictor for one model (docs/predictor.md).
 *
 * Runs the model densely over a text cut into segments of --ctx tokens
 * (BOS first when the vocabulary adds one), and from each selected layer's
 * attention call (the session's layer_hook) keeps the post-RoPE keys and
 * the attention mass later queries put on each key
 * (dhsa_boundary_mass_add); labels each candidate boundary from the two
 * masses around it (dhsa_boundary_labels), trains a fresh predictor on the
 * first part of the text and validates on the rest
 * (dhsa_predictor_train), prints losses, precision/recall and ROC AUC
 * next to the training-free similarity score's AUC on the same samples,
 * and writes the predictor file `--boundary learned:FILE` reads.
 *
 * Exit status: 0 ok, 1 the run failed, 2 a usage error.
 * Tested by tests/test_train.c (the library, and a short run of this
 * command on stories260K); bench/train_stories260k.sh is the documented,
 * reproducible run.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "dhsa.h"

#define EXIT_RUN DHSA_EXIT_RUN
#define EXIT_USAGE DHSA_EXIT_USAGE
#define MAX_LAYERS 1024

const char dhsa_cli_train_boundary_usage[] =
    "usage: dhsa train-boundary -m MODEL --text FILE -o PREDICTOR [options]\n"
    "\n"
    "Trains the learned boundary predictor (docs/predictor.md) for MODEL: runs\n"
    "it densely over FILE in segments of --ctx tokens, labels every candidate\n"
    "boundary c of each selected layer from dense attention (the mass the\n"
    "queries at c + w or later put on keys [c - w, c) against [c, c + w):\n"
    "r = max / min, y = sigmoid(2 (log r - log 2))), trains with focal BCE and\n"
    "Adam on the first part of the text and validates on the last --val share.\n"
    "Prints losses, precision/recall of (p >= 0.5) against (y >= 0.5), ROC AUC\n"
    "of the predictor and of the training-free similarity score, and writes\n"
    "PREDICTOR for --boundary learned:PREDICTOR. One predictor per model: its\n"
    "input width is KV heads x head dim.\n"
    "\n"
    "  -m MODEL           GGUF file, or a llama2.c checkpoint with --tokenizer\n"
    "  --tokenizer FILE   the llama2.c tokenizer (tok*.bin)\n"
    "  --text FILE        training text (UTF-8)\n"
    "  -o FILE            the predictor file to write (checked before the run;\n"
    "                     written through a temporary renamed over it: an\n"
    "                     existing file is replaced only when complete)\n"
    "  --layers L,L,..|all  layers whose keys and labels are used (default all)\n"
    "  --window W         w: keys on each side of a candidate (default 4)\n"
    "  --hidden H         MLP width (default 32)\n"
    "  --ctx N            tokens per segment (default: the trained context)\n"
    "  --val F            share of the text, at its end, for validation\n"
    "                     (default 0.2)\n"
    "  --sink N           no label whose window holds a key before N (default 1:\n"
    "                     BOS draws attention whatever the content)\n"
    "  --steps N          Adam steps (default 2000)   --batch B (default 64)\n"
    "  --lr F             (default 1e-4)              --eval-every N (default 100)\n"
    "  --gamma G          focal exponent (default 2)  --pos-weight P (default 1.3)\n"
    "  --seed S           initial weights and minibatch order (default 1)\n"
    "  --max-tokens N     use only the first N tokens of the text\n"
    "  -t, --threads T    (default: online CPUs)\n";

/* ------------------------------------------------------- collection --- */

/* What the layer hook fills for the segment being evaluated. */
typedef struct {
    dhsa_ctx *ctx;
    int64_t n_layer, C, hd, w, n; /* n: tokens of the segment */
    const int *use;               /* [n_layer]: layer selected */
    float **keys;                 /* [n_layer] -> [n][C] of this segment */
    double **mass;                /* [n_layer] -> [n][2w] */
    int failed;
} hook_state;

static int hook(void *user, int64_t layer, const dhsa_attn_desc *a) {
    hook_state *h = user;
    /* a sliding layer (its keys a ring from k_pos0) is never routed: no labels */
    if (!h->use[layer] || a->k_pos0) return 0;
    if (dhsa_boundary_mass_add(h->ctx, a, h->w, h->mass[layer], h->n)) {
        h->failed = 1;
        return 1;
    }
    /* the ubatch's new keys: positions [q_pos0, q_pos0 + Lq) of the cache */
    const dhsa_tensor *k = &a->k;
    size_t es = k->type == DHSA_F32 ? 4 : 2;
    for (int64_t t = a->q_pos0; t < a->q_pos0 + a->q.shape[2]; t++)
        for (int64_t g = 0; g < k->shape[1]; g++) {
            const char *row = (const char *)k->data + (size_t)(g * k->stride[1] + t * k->stride[2]) * es;
            float *dst = h->keys[layer] + t * h->C + g * h->hd;
            for (int64_t c = 0; c < h->hd; c++) {
                const char *e = row + (size_t)(c * k->stride[3]) * es;
                if (k->type == DHSA_F32) memcpy(&dst[c], e, 4);
                else {
                    uint16_t u;
                    memcpy(&u, e, 2);
                    dst[c] = k->type == DHSA_F16 ? dhsa_f16_to_f32(u) : dhsa_bf16_to_f32(u);
                }
            }
        }
    return 0;
}

/* --------------------------------------------------------- baselines --- */

/* The training-free score at t: mean over KV heads of 1 - cos(mean of
 * k[t - w, t), mean of k[t, t + w)), as DHSA_BOUNDARY_SIMILARITY with
 * sim_window = w. */
static double similarity(const float *keys, int64_t n, int64_t C, int64_t hd, int64_t w, int64_t t) {
    double sum = 0;
    for (int64_t g = 0; g < C / hd; g++) {
        double ll = 0, rr = 0, lr = 0;
        for (int64_t c = 0; c < hd; c++) {
            double l = 0, r = 0;
            for (int64_t i = 1; i <= w; i++) {
                if (t - i >= 0) l += keys[(t - i) * C + g * hd + c];
                if (t + i - 1 < n) r += keys[(t + i - 1) * C + g * hd + c];
            }
            ll += l * l, rr += r * r, lr += l * r;
        }
        sum += ll > 0 && rr > 0 ? 1 - lr / sqrt(ll * rr) : 0;
    }
    return sum / (double)(C / hd);
}

typedef struct {
    double s;
    int pos;
} scored;

static int cmp_scored(const void *a, const void *b) {
    double x = ((const scored *)a)->s, y = ((const scored *)b)->s;
    return x < y ? -1 : x > y;
}

/* ROC AUC (Mann-Whitney, ties count half). */
static double auc(scored *v, int64_t n) {
    int64_t np = 0;
    for (int64_t i = 0; i < n; i++) np += v[i].pos;
    if (np == 0 || np == n) return 0.5;
    qsort(v, (size_t)n, sizeof *v, cmp_scored);
    double ranks = 0;
    for (int64_t i = 0; i < n;) {
        int64_t k = i;
        while (k < n && v[k].s == v[i].s) k++;
        for (int64_t e = i; e < k; e++)
            if (v[e].pos) ranks += 0.5 * (double)(i + 1 + k);
        i = k;
    }
    return (ranks - (double)np * ((double)np + 1) / 2) / ((double)np * (double)(n - np));
}

static void progress(void *user, const dhsa_train_point *pt) {
    double t0 = *(const double *)user;
    printf("step %6lld  train loss %.5f  val loss %.5f  (%.1f s)\n", (long long)pt->step, pt->train_loss, pt->val_loss,
           dhsa_cli_now() - t0);
    fflush(stdout);
}

/* ------------------------------------------------------------- main --- */

int dhsa_cli_train_boundary(int argc, char **argv) {
    const char *model = NULL, *tokp = NULL, *text_path = NULL, *out = NULL, *layers_arg = "all";
    int64_t w = 4, hidden = 32, n_ctx = 0, sink = 1, threads = 0, max_tokens = 0;
    double val = 0.2;
    dhsa_train_params tp = dhsa_train_default_params();
    dhsa_cli_set_command("train-boundary", "(see dhsa train-boundary --help)\n");
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(dhsa_cli_train_boundary_usage, stdout);
            return 0;
        }
        if (i + 1 >= argc) dhsa_cli_die(EXIT_USAGE, "%s needs a value (or is unknown)", a);
        const char *v = argv[++i];
        if (strcmp(a, "-m") == 0 || strcmp(a, "--model") == 0) model = dhsa_cli_model_arg(v);
        else if (strcmp(a, "--tokenizer") == 0) tokp = v;
        else if (strcmp(a, "--text") == 0) text_path = v;
        else if (strcmp(a, "-o") == 0 || strcmp(a, "--output") == 0) out = v;
        else if (strcmp(a, "--layers") == 0) layers_arg = v;
        else if (strcmp(a, "--window") == 0) w = dhsa_cli_int(a, v, 1, 64, 1);
        else if (strcmp(a, "--hidden") == 0) hidden = dhsa_cli_int(a, v, 1, 4096, 1);
        else if (strcmp(a, "--ctx") == 0) n_ctx = dhsa_cli_int(a, v, 16, (int64_t)1 << 24, 1);
        else if (strcmp(a, "--val") == 0) val = dhsa_cli_real(a, v, 0.01, 0.99);
        else if (strcmp(a, "--sink") == 0) sink = dhsa_cli_int(a, v, 0, (int64_t)1 << 20, 1);
        else if (strcmp(a, "--steps") == 0) tp.steps = dhsa_cli_int(a, v, 0, (int64_t)1 << 40, 1);
        else if (strcmp(a, "--batch") == 0) tp.batch = dhsa_cli_int(a, v, 1, (int64_t)1 << 20, 1);
        else if (strcmp(a, "--lr") == 0) tp.lr = dhsa_cli_real(a, v, 1e-12, 10);
        else if (strcmp(a, "--eval-every") == 0) tp.eval_every = dhsa_cli_int(a, v, 0, (int64_t)1 << 40, 1);
        else if (strcmp(a, "--gamma") == 0) tp.gamma = dhsa_cli_real(a, v, 0, 16);
        else if (strcmp(a, "--pos-weight") == 0) tp.pos_weight = dhsa_cli_real(a, v, 1e-6, 1e6);
        else if (strcmp(a, "--seed") == 0) tp.seed = (uint64_t)dhsa_cli_int(a, v, 0, INT64_MAX, 1);
        else if (strcmp(a, "--max-tokens") == 0) max_tokens = dhsa_cli_int(a, v, 1, INT64_MAX, 1);
        else if (strcmp(a, "--threads") == 0 || strcmp(a, "-t") == 0) threads = dhsa_cli_threads(a, v);
        else dhsa_cli_die(EXIT_USAGE, "unknown option \"%s\"", a);
    }
    if (!model) dhsa_cli_die(EXIT_USAGE, "-m MODEL is required");
    if (!text_path) dhsa_cli_die(EXIT_USAGE, "--text FILE is required");
    if (!out) dhsa_cli_die(EXIT_USAGE, "-o PREDICTOR is required");
    /* before the model runs: minutes of work must not end in "cannot write" */
    dhsa_cli_check_output("-o", out);
    dhsa_cli_check_not_input("-o", out, "-m", model);
    dhsa_cli_check_not_input("-o", out, "--text", text_path);
    dhsa_cli_check_not_input("-o", out, "--tokenizer", tokp);
    dhsa_cli_check_tokenizer(model, tokp);

    double t_start = dhsa_cli_now();
    dhsa_model_params mp = dhsa_model_default_params();
    mp.tokenizer_path = tokp;
    dhsa_model *m;
    if (dhsa_model_load(model, &mp, &m)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
    const dhsa_model_info *in = dhsa_model_get_info(m);
    const int64_t L = in->n_layer, hd = in->head_dim_k, C = in->n_head_kv * hd;
    if (L > MAX_LAYERS) dhsa_cli_die(EXIT_RUN, "the model has %lld layers (at most %d here)", (long long)L, MAX_LAYERS);
    if (C > 8192) dhsa_cli_die(EXIT_RUN, "KV heads x head dim = %lld: the predictor takes at most 8192", (long long)C);
    if (n_ctx == 0) n_ctx = in->n_ctx_train;
    if (n_ctx > in->n_ctx_train)
        fprintf(stderr, "dhsa train-boundary: warning: --ctx %lld is longer than the trained context %lld\n",
                (long long)n_ctx, (long long)in->n_ctx_train);
    if (n_ctx < 4 * w + 2) dhsa_cli_die(EXIT_USAGE, "--ctx %lld is too short for --window %lld", (long long)n_ctx, (long long)w);

    /* layers */
    static int use[MAX_LAYERS];
    int64_t n_use = 0;
    if (strcmp(layers_arg, "all") == 0) {
        for (int64_t l = 0; l < L; l++) use[l] = 1;
        n_use = L;
    } else {
        static char buf[8192], *items[MAX_LAYERS];
        int n = dhsa_cli_split_list("--layers", layers_arg, buf, sizeof buf, items, MAX_LAYERS);
        for (int k = 0; k < n; k++) {
            int64_t l = dhsa_cli_int("--layers", items[k], 0, L - 1, 1);
            if (!use[l]) use[l] = 1, n_use++;
        }
    }

    /* the text, cut into segments of n_ctx tokens (BOS first when the vocabulary adds one) */
    const dhsa_tokenizer *tok = dhsa_model_tokenizer(m);
    int64_t text_len, n_text = 0;
    char *text = dhsa_cli_slurp("--text", text_path, DHSA_TOKENIZER_MAX_TEXT, "the most a text may hold", &text_len);
    if (dhsa_tokenize(tok, text, text_len, 0, NULL, 0, &n_text) != DHSA_OK && n_text == 0)
        dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
    int32_t *ids = malloc((size_t)(n_text + 1) * sizeof(int32_t));
    if (!ids) dhsa_cli_die(EXIT_RUN, "out of memory for %lld tokens", (long long)n_text);
    if (dhsa_tokenize(tok, text, text_len, 0, ids, n_text + 1, &n_text)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
    free(text);
    if (max_tokens && n_text > max_tokens) n_text = max_tokens;
    const int bos = (dhsa_tokenizer_default_flags(tok) & DHSA_TOKENIZE_ADD_BOS) && dhsa_tokenizer_bos(tok) >= 0;
    const int64_t per_seg = n_ctx - bos, n_seg = (n_text + per_seg - 1) / per_seg;
    const int64_t split_tok = (int64_t)floor((double)n_text * (1.0 - val));
    if (n_seg == 0) dhsa_cli_die(EXIT_RUN, "the text has no tokens");

    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = (int)threads;
    dhsa_ctx *ctx;
    if (dhsa_ctx_create(&cp, &ctx)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
    printf("model: %s: %lld layers, %lld KV heads x head dim %lld = C %lld; layers used: %lld\n", model, (long long)L,
           (long long)in->n_head_kv, (long long)hd, (long long)C, (long long)n_use);
    printf("text: %s: %lld tokens in %lld segments of <= %lld (BOS %s); validation: tokens from %lld (last %.0f%%)\n",
           text_path, (long long)n_text, (long long)n_seg, (long long)n_ctx, bos ? "first" : "none",
           (long long)split_tok, 100 * val);
    printf("labels: w %lld, sink %lld; predictor: C %lld, w %lld, hidden %lld; %d threads\n", (long long)w,
           (long long)sink, (long long)C, (long long)w, (long long)hidden, dhsa_ctx_n_threads(ctx));
    fflush(stdout);

    dhsa_session_params sp = dhsa_session_default_params();
    sp.n_ctx = n_ctx;
    sp.attn = DHSA_ATTN_DENSE;
    sp.kv_type = DHSA_F32;
    hook_state hs = {ctx, L, C, hd, w, 0, use, NULL, NULL, 0};
    sp.layer_hook = hook;
    sp.layer_hook_user = &hs;
    dhsa_session *s;
    if (dhsa_session_create(ctx, m, &sp, &s)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());

    /* per (segment, used layer): keys [n][C] and labels [n] */
    const int64_t n_seqs = n_seg * n_use;
    dhsa_train_seq *seqs = calloc((size_t)n_seqs, sizeof *seqs);
    float **keys_of = calloc((size_t)L, sizeof(float *));
    double **mass_of = calloc((size_t)L, sizeof(double *));
    int32_t *seg_ids = malloc((size_t)n_ctx * sizeof(int32_t));
    if (!seqs || !keys_of || !mass_of || !seg_ids) dhsa_cli_die(EXIT_RUN, "out of memory");
    for (int64_t l = 0; l < L; l++)
        if (use[l] && !(mass_of[l] = malloc((size_t)(n_ctx * 2 * w) * sizeof(double)))) dhsa_cli_die(EXIT_RUN, "out of memory");
    hs.keys = keys_of, hs.mass = mass_of;
    double t_lab = dhsa_cli_now(), pos_sum = 0, y_sum = 0;
    int64_t n_lab = 0, q = 0;
    int64_t *lay_pos = calloc((size_t)L, sizeof(int64_t)), *lay_n = calloc((size_t)L, sizeof(int64_t));
    for (int64_t sg = 0; sg < n_seg; sg++) {
        int64_t a = sg * per_seg, b = a + per_seg < n_text ? a + per_seg : n_text, n = (b - a) + bos;
        if (bos) seg_ids[0] = dhsa_tokenizer_bos(tok);
        memcpy(seg_ids + bos, ids + a, (size_t)(b - a) * sizeof(int32_t));
        /* local split: the position of text token split_tok in this segment, clamped */
        int64_t split = split_tok <= a ? 0 : split_tok >= b ? n : split_tok - a + bos;
        hs.n = n;
        for (int64_t l = 0; l < L; l++) {
            if (!use[l]) continue;
            if (!(keys_of[l] = malloc((size_t)(n * C) * sizeof(float)))) dhsa_cli_die(EXIT_RUN, "out of memory");
            memset(mass_of[l], 0, (size_t)(n * 2 * w) * sizeof(double));
        }
        dhsa_session_reset(s);
        if (dhsa_session_eval(s, seg_ids, n, NULL)) dhsa_cli_die(EXIT_RUN, "segment %lld: %s", (long long)sg, dhsa_last_error());
        for (int64_t l = 0; l < L; l++) {
            if (!use[l]) continue;
            float *y = malloc((size_t)n * sizeof(float));
            if (!y) dhsa_cli_die(EXIT_RUN, "out of memory");
            if (dhsa_boundary_labels(mass_of[l], n, w, sink, y, NULL)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
            for (int64_t t = 0; t < n; t++)
                if (y[t] >= 0) n_lab++, lay_n[l]++, y_sum += y[t], pos_sum += y[t] >= 0.5f, lay_pos[l] += y[t] >= 0.5f;
            seqs[q++] = (dhsa_train_seq){keys_of[l], y, n, split};
        }
    }
    t_lab = dhsa_cli_now() - t_lab;
    printf("labels: %lld candidates in %.1f s; mean y %.3f, y >= 0.5: %.3f; per layer y >= 0.5:", (long long)n_lab,
           t_lab, n_lab ? y_sum / (double)n_lab : 0.0, n_lab ? pos_sum / (double)n_lab : 0.0);
    for (int64_t l = 0; l < L; l++)
        if (use[l]) printf(" %lld:%.3f", (long long)l, lay_n[l] ? (double)lay_pos[l] / (double)lay_n[l] : 0.0);
    printf("\n");
    fflush(stdout);

    dhsa_predictor *pr;
    if (dhsa_predictor_create_random(C, w, hidden, tp.seed, &pr)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
    double t_train = dhsa_cli_now();
    tp.progress = progress;
    tp.progress_user = &t_train;
    dhsa_train_report r;
    if (dhsa_predictor_train(ctx, pr, seqs, n_seqs, &tp, &r)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());

    /* the similarity score on the same validation samples */
    scored *sv = malloc((size_t)r.n_val * sizeof(scored));
    int64_t nv = 0;
    if (!sv) dhsa_cli_die(EXIT_RUN, "out of memory");
    for (int64_t i = 0; i < n_seqs; i++)
        for (int64_t t = 0; t < seqs[i].n; t++)
            if (seqs[i].y[t] >= 0 && t - w >= seqs[i].split && nv < r.n_val)
                sv[nv++] = (scored){similarity(seqs[i].keys, seqs[i].n, C, hd, w, t), seqs[i].y[t] >= 0.5f};
    double sim_auc = auc(sv, nv);
    free(sv);

    printf("samples: %lld train (y >= 0.5: %.3f), %lld validation (y >= 0.5: %.3f, mean y %.3f)\n",
           (long long)r.n_train, r.train_pos, (long long)r.n_val, r.val_pos, r.val_y_mean);
    printf("loss: train %.5f -> %.5f, validation %.5f -> %.5f; best constant p = %.3f: validation %.5f; floor "
           "(each label's best p) %.5f: %.0f%% of the reducible loss removed\n",
           r.first.train_loss, r.last.train_loss, r.first.val_loss, r.last.val_loss, r.const_p, r.val_loss_const,
           r.val_loss_floor,
           r.val_loss_const > r.val_loss_floor
               ? 100 * (r.val_loss_const - r.last.val_loss) / (r.val_loss_const - r.val_loss_floor)
               : 0.0);
    printf("validation, p >= 0.5 vs y >= 0.5: precision %.3f recall %.3f F1 %.3f (tp %lld fp %lld fn %lld tn %lld)\n",
           r.precision, r.recall, r.f1, (long long)r.tp, (long long)r.fp, (long long)r.fn, (long long)r.tn);
    printf("validation ROC AUC: learned %.4f, similarity (1 - cos of the mean keys, window %lld) %.4f\n", r.auc,
           (long long)w, sim_auc);
    if (dhsa_predictor_save(pr, out)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
    printf("wrote %s; labels %.1f s, training %.1f s, total %.1f s\n", out, t_lab, r.seconds, dhsa_cli_now() - t_start);

    for (int64_t i = 0; i < n_seqs; i++) {
        free((void *)seqs[i].keys);
        free((void *)seqs[i].y);
    }
    for (int64_t l = 0; l < L; l++) free(mass_of[l]);
    free(seqs), free(keys_of), free(mass_of), free(seg_ids), free(ids), free(lay_pos), free(lay_n);
    dhsa_predictor_free(pr);
    dhsa_session_free(s);
    dhsa_ctx_free(ctx);
    dhsa_model_free(m);
    return 0;
}
