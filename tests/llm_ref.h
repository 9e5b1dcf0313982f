/* llm_ref.h: the independent reference the model runner is tested against.
 *
 * A naive transformer forward pass in double precision, written from
 * docs/model.md alone (plain loops, no KV cache, every weight dequantized to
 * double once), plus what the tests around it need:
 *
 *   - llmref_dequant / llmref_quantize: the ggml block formats F32, F16,
 *     BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K,
 *     Q6_K, IQ4_XS, decoded here from the byte layouts (f16 included), and a
 *     simple encoder for fixtures;
 *   - llmref_model: hyperparameters and weights from an open dhsa_gguf
 *     (architectures llama, qwen2, gemma2, qwen3, gemma3, phi3, with every
 *     optional tensor of docs/model.md: biases, fused QKV, rope_freqs,
 *     LongRoPE factors, output.bias; a tensor
 *     it does not read is an error naming it) or from a llama2.c
 *     checkpoint; every field is plain data, so a test can build a model
 *     by hand or change one field to make a deliberately wrong variant;
 *   - llmref_forward / llmref_forward_ex: logits [n][n_vocab] of a sequence;
 *   - llmref_fixture_build: tiny random GGUF models (test fixtures) for any
 *     architecture and weight type, deterministic for a seed;
 *   - llmref_compare: float logits against double reference logits,
 *     |a-b| <= atol + rtol*|ref| per element and NMSE overall, printing the
 *     worst element on failure.
 *
 * Independence is the point: this file uses only include/dhsa.h's public
 * GGUF reader/writer (and nothing of src/model/), so a bug in the runner or
 * in its quantization kernels cannot hide in a shared helper.
 *
 * Header-only: every function is `static inline`, so a test that includes it
 * and uses a part compiles without unused-function warnings. Errors are
 * return values (0 = ok, -1 = failed) with a sentence in llmref_error().
 * Not thread-safe (one error buffer). Not fast: a forward is
 * O(n^2 d + n P) with P the parameter count, fine for fixtures and the
 * 260K-parameter real model.
 *
 * The parts, each its own header included here: llm_ref_formats.h
 * (errors, half/bfloat16, block formats, random numbers), llm_ref_model.h
 * (the model and its loaders), llm_ref_fixture.h (fixtures); this file
 * holds the forward pass and the comparison.
 *
 * Validated by tests/test_llm_ref.c:
 *   make build/tests/test_llm_ref && build/tests/test_llm_ref
 */
#ifndef DHSA_TESTS_LLM_REF_H
#define DHSA_TESTS_LLM_REF_H

#include "dhsa.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llm_ref_formats.h"
#include "llm_ref_model.h"
#include "llm_ref_fixture.h"

/* --------------------------------------------------------------------- */
/* The forward pass                                                       */

/* out[0..n) = v / sqrt(mean(v^2) + eps) * w   (out may alias v) */
static inline void llmref_rmsnorm(double *out, const double *v, const double *w, int64_t n, double eps) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += v[i] * v[i];
    double r = 1.0 / sqrt(ss / (double)n + eps);
    for (int64_t i = 0; i < n; i++) out[i] = v[i] * r * w[i];
}

/* W [n_out][n_in] @ x [n_in] (+ b [n_out]) -> y [n_out] */
static inline void llmref_matvec(double *y, const double *W, const double *x, const double *b, int64_t n_out,
                                 int64_t n_in) {
    for (int64_t o = 0; o < n_out; o++) {
        const double *w = W + o * n_in;
        double s = 0;
        for (int64_t i = 0; i < n_in; i++) s += w[i] * x[i];
        y[o] = s + (b ? b[o] : 0.0);
    }
}

/* Rotates one head vector v [hd_k] for position pos: pair i < n_rot/2 turns
 * by theta_i = (pos / rope_factor) * base^(-2i/n_rot) / ff_i (ff: rope_freqs,
 * else the LongRoPE factors in use, else 1) and both its values are then
 * multiplied by rope_attn_factor (llama.cpp's mscale on cos and sin); dims
 * at or above n_rot stay. A sliding layer uses rope_base_swa and
 * rope_factor_swa instead. */
static inline void llmref_rope_layer(const llmref_model *m, double *v, int64_t pos, int sliding) {
    int64_t half = m->n_rot / 2;
    double p = (double)pos / (sliding ? m->rope_factor_swa : m->rope_factor);
    double base = sliding ? m->rope_base_swa : m->rope_base;
    const double *ff = m->rope_freqs ? m->rope_freqs : m->rope_factors;
    for (int64_t i = 0; i < half; i++) {
        double theta = p * pow(base, -2.0 * (double)i / (double)m->n_rot);
        if (ff) theta /= ff[i];
        double c = cos(theta) * m->rope_attn_factor, s = sin(theta) * m->rope_attn_factor;
        int64_t ia = m->rope_neox ? i : 2 * i, ib = m->rope_neox ? i + half : 2 * i + 1;
        double a = v[ia], b = v[ib];
        v[ia] = a * c - b * s;
        v[ib] = a * s + b * c;
    }
}

/* The global layers' rotation. */
static inline void llmref_rope(const llmref_model *m, double *v, int64_t pos) { llmref_rope_layer(m, v, pos, 0); }

/* Each of the heads [heads][hd] of v RMS-normed with w [hd] (q/k norm). */
static inline void llmref_head_norm(double *v, const double *w, int64_t heads, int64_t hd, double eps) {
    for (int64_t h = 0; h < heads; h++) llmref_rmsnorm(v + h * hd, v + h * hd, w, hd, eps);
}

static inline double llmref_silu(double z) { return z / (1.0 + exp(-z)); }
static inline double llmref_gelu_tanh(double z) {
    const double k = 0.79788456080286535588; /* sqrt(2/pi) */
    return 0.5 * z * (1.0 + tanh(k * (z + 0.044715 * z * z * z)));
}

/* Options of llmref_forward_ex; zeros are the defaults. */
typedef struct {
    int64_t pos0;   /* position of ids[0] (no tokens before it): RoPE and the window see pos0 + t */
    int64_t row0;   /* logits only for rows row0..n-1: logits is [n - row0][n_vocab] */
    double *hidden; /* optional [n][n_embd]: the residual stream after the last layer (before output_norm) */
} llmref_opts;

/* Full causal forward of ids[0..n), no cache: logits [n - row0][n_vocab]
 * for rows row0..n-1 (logits may be NULL to get only o->hidden). Every
 * intermediate is double. -1 for an id out of range, a bad option or no
 * memory. */
static inline int llmref_forward_ex(const llmref_model *m, const int32_t *ids, int64_t n, const llmref_opts *o,
                                    double *logits) {
    llmref_opts def = {0, 0, NULL};
    if (!o) o = &def;
    if (n < 1 || o->row0 < 0 || o->row0 > n || o->pos0 < 0)
        return llmref__fail("forward: n = %lld, row0 = %lld, pos0 = %lld", (long long)n, (long long)o->row0,
                            (long long)o->pos0);
    for (int64_t t = 0; t < n; t++)
        if (ids[t] < 0 || ids[t] >= m->n_vocab)
            return llmref__fail("forward: id %d at %lld is outside [0, %lld)", ids[t], (long long)t,
                                (long long)m->n_vocab);
    const int64_t E = m->n_embd, F = m->n_ff, H = m->n_head, Hkv = m->n_head_kv, dk = m->hd_k, dv = m->hd_v;
    const int64_t group = H / Hkv;
    double *x = malloc((size_t)(n * E) * sizeof *x);         /* [n][E] residual */
    double *h = malloc((size_t)E * sizeof *h);               /* [E] normed input of a sublayer */
    double *q = malloc((size_t)(n * H * dk) * sizeof *q);    /* [n][H*dk] */
    double *k = malloc((size_t)(n * Hkv * dk) * sizeof *k);  /* [n][Hkv*dk] */
    double *v = malloc((size_t)(n * Hkv * dv) * sizeof *v);  /* [n][Hkv*dv] */
    double *a = malloc((size_t)(H * dv) * sizeof *a);        /* [H*dv] attention output of one token */
    double *ob = malloc((size_t)(n * E) * sizeof *ob);       /* [n][E] sublayer outputs */
    double *gt = malloc((size_t)F * sizeof *gt);             /* [F] gate */
    double *up = malloc((size_t)F * sizeof *up);             /* [F] up */
    double *w = malloc((size_t)n * sizeof *w);               /* [n] scores of one query */
    int rc = 0;
    if (!x || !h || !q || !k || !v || !a || !ob || !gt || !up || !w) {
        rc = llmref__fail("forward: out of memory");
        goto done;
    }
    for (int64_t t = 0; t < n; t++)
        for (int64_t i = 0; i < E; i++) x[t * E + i] = m->tok_embd[(int64_t)ids[t] * E + i] * m->embd_scale;

    for (int64_t il = 0; il < m->n_layer; il++) {
        const llmref_layer *L = &m->layers[il];
        int sliding = llmref_layer_slides(m, il);
        /* attention: q, k, v of every token, (q/k-normed per head,) rotated */
        for (int64_t t = 0; t < n; t++) {
            llmref_rmsnorm(h, x + t * E, L->attn_norm, E, m->rms_eps);
            llmref_matvec(q + t * H * dk, L->wq, h, L->bq, H * dk, E);
            llmref_matvec(k + t * Hkv * dk, L->wk, h, L->bk, Hkv * dk, E);
            llmref_matvec(v + t * Hkv * dv, L->wv, h, L->bv, Hkv * dv, E);
            if (L->q_norm) llmref_head_norm(q + t * H * dk, L->q_norm, H, dk, m->rms_eps);
            if (L->k_norm) llmref_head_norm(k + t * Hkv * dk, L->k_norm, Hkv, dk, m->rms_eps);
            for (int64_t hh = 0; hh < H; hh++) llmref_rope_layer(m, q + (t * H + hh) * dk, o->pos0 + t, sliding);
            for (int64_t hh = 0; hh < Hkv; hh++) llmref_rope_layer(m, k + (t * Hkv + hh) * dk, o->pos0 + t, sliding);
        }
        for (int64_t t = 0; t < n; t++) {
            int64_t p = o->pos0 + t;
            for (int64_t hh = 0; hh < H; hh++) {
                const double *qh = q + (t * H + hh) * dk;
                int64_t kvh = hh / group;
                double smax = -INFINITY;
                for (int64_t j = 0; j <= t; j++) {
                    int64_t pj = o->pos0 + j;
                    if (sliding && !(pj > p - m->sliding_window)) {
                        w[j] = -INFINITY;
                        continue;
                    }
                    const double *kj = k + (j * Hkv + kvh) * dk;
                    double s = 0;
                    for (int64_t d = 0; d < dk; d++) s += qh[d] * kj[d];
                    s *= m->attn_scale;
                    if (m->attn_softcap > 0) s = m->attn_softcap * tanh(s / m->attn_softcap);
                    w[j] = s;
                    if (s > smax) smax = s;
                }
                double sum = 0;
                for (int64_t j = 0; j <= t; j++) {
                    w[j] = w[j] == -INFINITY ? 0.0 : exp(w[j] - smax);
                    sum += w[j];
                }
                double *ah = a + hh * dv;
                for (int64_t d = 0; d < dv; d++) ah[d] = 0;
                for (int64_t j = 0; j <= t; j++) {
                    if (w[j] == 0) continue;
                    const double *vj = v + (j * Hkv + kvh) * dv;
                    double pw = w[j] / sum;
                    for (int64_t d = 0; d < dv; d++) ah[d] += pw * vj[d];
                }
            }
            llmref_matvec(ob + t * E, L->wo, a, L->bo, E, H * dv);
        }
        for (int64_t t = 0; t < n; t++) {
            if (L->post_attn_norm) llmref_rmsnorm(ob + t * E, ob + t * E, L->post_attn_norm, E, m->rms_eps);
            for (int64_t i = 0; i < E; i++) x[t * E + i] += ob[t * E + i];
        }
        /* feed-forward */
        for (int64_t t = 0; t < n; t++) {
            llmref_rmsnorm(h, x + t * E, L->ffn_norm, E, m->rms_eps);
            llmref_matvec(gt, L->w_gate, h, L->b_gate, F, E); /* biases before the activation */
            llmref_matvec(up, L->w_up, h, L->b_up, F, E);
            for (int64_t i = 0; i < F; i++) gt[i] = (m->gelu ? llmref_gelu_tanh(gt[i]) : llmref_silu(gt[i])) * up[i];
            double *f = ob + t * E;
            llmref_matvec(f, L->w_down, gt, L->b_down, E, F);
            if (L->post_ffw_norm) llmref_rmsnorm(f, f, L->post_ffw_norm, E, m->rms_eps);
            for (int64_t i = 0; i < E; i++) x[t * E + i] += f[i];
        }
    }
    if (o->hidden) memcpy(o->hidden, x, (size_t)(n * E) * sizeof *x);
    if (logits)
        for (int64_t t = o->row0; t < n; t++) {
            double *lg = logits + (t - o->row0) * m->n_vocab;
            llmref_rmsnorm(h, x + t * E, m->output_norm, E, m->rms_eps);
            llmref_matvec(lg, m->output, h, m->output_bias, m->n_vocab, E);
            if (m->final_softcap > 0)
                for (int64_t i = 0; i < m->n_vocab; i++) lg[i] = m->final_softcap * tanh(lg[i] / m->final_softcap);
        }
done:
    free(x);
    free(h);
    free(q);
    free(k);
    free(v);
    free(a);
    free(ob);
    free(gt);
    free(up);
    free(w);
    return rc;
}

/* logits [n][n_vocab] of ids[0..n) at positions 0..n-1. */
static inline int llmref_forward(const llmref_model *m, const int32_t *ids, int64_t n, double *logits) {
    return llmref_forward_ex(m, ids, n, NULL, logits);
}

/* Index of the largest x[i]; the lowest index on ties. */
static inline int64_t llmref_argmax(const double *x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Greedy decoding: seq [n_prompt + n_gen] starts with the prompt; each new
 * id is the argmax of the last row of a full forward over seq so far. */
static inline int llmref_greedy(const llmref_model *m, int32_t *seq, int64_t n_prompt, int64_t n_gen) {
    double *lg = malloc((size_t)m->n_vocab * sizeof *lg);
    if (!lg) return llmref__fail("greedy: out of memory");
    for (int64_t i = 0; i < n_gen; i++) {
        int64_t n = n_prompt + i;
        llmref_opts o = {0, n - 1, NULL};
        if (llmref_forward_ex(m, seq, n, &o, lg)) {
            free(lg);
            return -1;
        }
        seq[n] = (int32_t)llmref_argmax(lg, m->n_vocab);
    }
    free(lg);
    return 0;
}

/* --------------------------------------------------------------------- */
/* Comparison                                                             */

typedef struct {
    int64_t n_bad;             /* elements with |a-b| > atol + rtol |ref| (NaN/Inf counts) */
    int64_t worst_row, worst_col; /* the element furthest over its bound */
    double worst_got, worst_ref, worst_ratio; /* |a-b| / (atol + rtol |ref|) there */
    double max_abs;            /* max |a-b| */
    double nmse;               /* sum (a-b)^2 / sum ref^2 */
} llmref_cmp;

static inline int llmref__compare(const char *what, const float *gf, const double *gd, const double *ref,
                                  int64_t rows, int64_t cols, double atol, double rtol, double nmse_max,
                                  llmref_cmp *out) {
    llmref_cmp c;
    memset(&c, 0, sizeof c);
    c.worst_ratio = -1;
    double se = 0, sr = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < cols; j++) {
            int64_t i = r * cols + j;
            double a = gf ? (double)gf[i] : gd[i], b = ref[i];
            double d = fabs(a - b), lim = atol + rtol * fabs(b);
            double ratio = isfinite(a) ? (lim > 0 ? d / lim : (d > 0 ? INFINITY : 0)) : INFINITY;
            if (!(d <= lim) || !isfinite(a)) c.n_bad++;
            if (ratio > c.worst_ratio) {
                c.worst_ratio = ratio;
                c.worst_row = r;
                c.worst_col = j;
                c.worst_got = a;
                c.worst_ref = b;
            }
            if (d > c.max_abs || !isfinite(a)) c.max_abs = isfinite(a) ? d : INFINITY;
            se += isfinite(a) ? d * d : INFINITY;
            sr += b * b;
        }
    c.nmse = sr > 0 ? se / sr : (se > 0 ? INFINITY : 0);
    int ok = c.n_bad == 0 && c.nmse <= nmse_max;
    if (!ok && c.n_bad == 0)
        fprintf(stderr, "%s: every element within atol %g + rtol %g * |ref|, but NMSE %.3g > %.3g (max |diff| %.3g)\n",
                what, atol, rtol, c.nmse, nmse_max, c.max_abs);
    else if (!ok)
        fprintf(stderr,
                "%s: %lld of %lld elements off; worst at (row %lld, col %lld): got %.9g, ref %.9g, |diff| %.3g > "
                "%.3g (atol %g + rtol %g * |ref|); max |diff| %.3g; NMSE %.3g (max %.3g)\n",
                what, (long long)c.n_bad, (long long)(rows * cols), (long long)c.worst_row, (long long)c.worst_col,
                c.worst_got, c.worst_ref, fabs(c.worst_got - c.worst_ref), atol + rtol * fabs(c.worst_ref), atol,
                rtol, c.max_abs, c.nmse, nmse_max);
    if (out) *out = c;
    return ok;
}

/* 1 when every element of got [rows][cols] (float: the runner's logits) is
 * within atol + rtol*|ref| of ref and the NMSE is <= nmse_max; else prints
 * "what", the worst element (row, col) and the NMSE to stderr and returns
 * 0. out (may be NULL) receives the statistics either way. */
static inline int llmref_compare(const char *what, const float *got, const double *ref, int64_t rows, int64_t cols,
                                 double atol, double rtol, double nmse_max, llmref_cmp *out) {
    return llmref__compare(what, got, NULL, ref, rows, cols, atol, rtol, nmse_max, out);
}

/* The same for double results (reference against reference). */
static inline int llmref_compare_d(const char *what, const double *got, const double *ref, int64_t rows, int64_t cols,
                                   double atol, double rtol, double nmse_max, llmref_cmp *out) {
    return llmref__compare(what, NULL, got, ref, rows, cols, atol, rtol, nmse_max, out);
}

#endif
