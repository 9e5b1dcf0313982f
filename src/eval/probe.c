/* probe.c: the evaluations' layer hook (contract in probe.h): density
 * used, attention recall and the copy measurements, gathered from each
 * layer's attention call of a session. Tested by tests/test_eval_lib.c
 * (dense against itself, a hand-made layout) and, through the CLI, by
 * tests/test_eval.c.
 */
#include "eval/probe.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

dhsa_status dhsa__probe_init(dhsa__probe *h, dhsa_ctx *ctx, int64_t n_layer, int want_recall) {
    memset(h, 0, sizeof *h);
    if (n_layer < 1) return dhsa__fail(DHSA_ERR_INVALID_ARG, "the probe needs at least one layer, not %lld", (long long)n_layer);
    h->ctx = ctx;
    h->n_layer = n_layer;
    h->want_recall = want_recall;
    h->selected = calloc((size_t)n_layer * 4, sizeof(double));
    if (!h->selected)
        return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory for the evaluation's sums (%lld layers)", (long long)n_layer);
    h->available = h->selected + n_layer;
    h->recall = h->available + n_layer;
    h->rows = h->recall + n_layer;
    return DHSA_OK;
}

void dhsa__probe_clear(dhsa__probe *h) {
    memset(h->selected, 0, (size_t)h->n_layer * 4 * sizeof(double));
    h->late_selected = h->late_available = 0;
    h->copy_cover = h->copy_cover_n = h->copy_mass = h->copy_kept = h->copy_ctl_mass = h->copy_rows = 0;
    h->err[0] = 0;
}

void dhsa__probe_free(dhsa__probe *h) {
    free(h->selected);
    free(h->buf);
    h->selected = NULL;
    h->buf = NULL;
}

double dhsa__probe_density(const dhsa__probe *h) {
    double s = 0, a = 0;
    for (int64_t l = 0; l < h->n_layer; l++) {
        s += h->selected[l];
        a += h->available[l];
    }
    return a > 0 ? s / a : 1.0;
}

double dhsa__probe_late_density(const dhsa__probe *h) {
    return h->late_available > 0 ? h->late_selected / h->late_available : NAN;
}

double dhsa__probe_recall(const dhsa__probe *h, int64_t l) {
    return h->rows[l] > 0 ? h->recall[l] / h->rows[l] : NAN;
}

dhsa_status dhsa__probe_fail(const dhsa__probe *h, dhsa_status s) {
    char msg[768];
    snprintf(msg, sizeof msg, "%s", dhsa_last_error());
    if (h && h->err[0]) return dhsa__fail(s, "%s: %s", msg, h->err);
    return dhsa__fail(s, "%s", msg);
}

/* The keys [lo, hi) query row `pos` may see under a causal (windowed) call. */
static void visible_span(const dhsa_attn_desc *a, int64_t pos, int64_t *lo, int64_t *hi) {
    pos -= a->k_pos0; /* key rows count from k_pos0 (a sliding layer's ring) */
    *hi = a->causal && pos + 1 < a->k.shape[2] ? pos + 1 : a->k.shape[2];
    *lo = a->window > 0 && pos - a->window + 1 > 0 ? pos - a->window + 1 : 0;
    if (*lo > *hi) *lo = *hi;
}

/* Keys of [lo, hi) inside the n ranges r (pairs start, end). */
static int64_t keys_in(const int64_t *r, int64_t n, int64_t lo, int64_t hi) {
    int64_t c = 0;
    for (int64_t k = 0; k < n; k++) {
        int64_t s = r[2 * k] > lo ? r[2 * k] : lo, e = r[2 * k + 1] < hi ? r[2 * k + 1] : hi;
        if (e > s) c += e - s;
    }
    return c;
}

/* Makes sure buf holds n floats. */
static int probe_reserve(dhsa__probe *h, size_t n) {
    if (n <= h->cap) return 0;
    free(h->buf);
    h->buf = malloc(n * sizeof(float));
    h->cap = h->buf ? n : 0;
    if (!h->buf) snprintf(h->err, sizeof h->err, "out of memory for the hook's buffers");
    return h->buf ? 0 : 1;
}

/* Recall of the call's layout: the call rerun dense and sparse with LSE. */
static int hook_recall(dhsa__probe *h, int64_t layer, const dhsa_attn_desc *a) {
    const int64_t Hq = a->q.shape[1], n = a->q.shape[2], dv = a->v.shape[3];
    size_t o_n = (size_t)(Hq * n * dv), l_n = (size_t)(Hq * n);
    if (probe_reserve(h, 2 * (o_n + l_n))) return 1;
    dhsa_tensor od = dhsa_tensor_bhld(h->buf, DHSA_F32, 1, Hq, n, dv);
    dhsa_tensor ld = dhsa_tensor_bhld(h->buf + o_n, DHSA_F32, 1, Hq, n, 1);
    dhsa_tensor os = dhsa_tensor_bhld(h->buf + o_n + l_n, DHSA_F32, 1, Hq, n, dv);
    dhsa_tensor lsp = dhsa_tensor_bhld(h->buf + 2 * o_n + l_n, DHSA_F32, 1, Hq, n, 1);
    dhsa_attn_desc d = *a;
    d.o = od;
    d.lse = ld;
    d.layout = NULL;
    dhsa_status st = dhsa_attention(h->ctx, &d);
    if (!st) {
        d.o = os;
        d.lse = lsp;
        d.layout = a->layout;
        st = dhsa_attention(h->ctx, &d);
    }
    dhsa_fidelity fr;
    if (!st) st = dhsa_fidelity_compare(&od, &ld, &os, &lsp, &fr);
    if (st) {
        snprintf(h->err, sizeof h->err, "recall at layer %lld: %s", (long long)layer, dhsa_last_error());
        return 1;
    }
    h->recall[layer] += fr.recall * (double)fr.rows;
    h->rows[layer] += (double)fr.rows;
    return 0;
}

/* The copy measurements for the repetition's rows of this call (see
 * dhsa__probe): four reruns with LSE, over all keys, the first copy, the
 * first copy's keys the layout selects and the control span (three
 * hand-made layouts). */
static int hook_copy(dhsa__probe *h, int64_t layer, const dhsa_attn_desc *a) {
    const int64_t Hq = a->q.shape[1], n = a->q.shape[2], Hkv = a->k.shape[1], dv = a->v.shape[3];
    const int64_t c0 = h->copy_at1, c1 = h->copy_at1 + h->copy_len;
    int64_t r0 = h->copy_at2 - a->q_pos0, r1 = h->copy_at2 + h->copy_len - 1 - a->q_pos0;
    if (r0 < 0) r0 = 0;
    if (r1 > n) r1 = n;
    if (r0 >= r1 || c1 > a->k.shape[2]) return 0;
    int64_t qb = 16, max_r = 1;
    if (a->layout) {
        dhsa_layout_stats ls;
        if (dhsa_layout_get_stats(a->layout, &ls)) return 1;
        qb = ls.q_block;
        max_r = ls.max_ranges;
    }
    /* coverage of the first copy's keys */
    for (int64_t g = 0; g < Hkv; g++)
        for (int64_t i = r0; i < r1; i++) {
            int64_t got = h->copy_len;
            if (a->layout) {
                const int64_t *r;
                int64_t nr;
                if (dhsa_layout_get(a->layout, 0, g, i / qb, &r, &nr)) return 1;
                got = keys_in(r, nr, c0, c1);
            }
            h->copy_cover += (double)got / (double)h->copy_len;
            h->copy_cover_n += 1;
        }
    /* the masses */
    size_t o_n = (size_t)(Hq * n * dv), l_n = (size_t)(Hq * n);
    if (probe_reserve(h, o_n + 4 * l_n)) return 1;
    float *lse_all = h->buf + o_n, *lse_copy = lse_all + l_n, *lse_ctl = lse_copy + l_n, *lse_kept = lse_ctl + l_n;
    dhsa_layout *only = NULL, *ctl = NULL, *kept = NULL;
    dhsa_status st = dhsa_layout_create(h->ctx, 1, Hkv, n, a->k.shape[2], qb, 1, &only);
    if (!st) st = dhsa_layout_create(h->ctx, 1, Hkv, n, a->k.shape[2], qb, 1, &ctl);
    if (!st && a->layout) st = dhsa_layout_create(h->ctx, 1, Hkv, n, a->k.shape[2], qb, max_r, &kept);
    int64_t span[2] = {c0, c1}, cspan[2] = {h->copy_ctl, h->copy_ctl + h->copy_len};
    int64_t *cut = malloc((size_t)(2 * max_r) * sizeof(int64_t));
    if (!cut && !st) st = DHSA_ERR_OUT_OF_MEMORY;
    for (int64_t g = 0; g < Hkv && !st; g++)
        for (int64_t b = r0 / qb; b <= (r1 - 1) / qb && !st; b++) {
            st = dhsa_layout_set(only, 0, g, b, span, 1);
            if (!st) st = dhsa_layout_set(ctl, 0, g, b, cspan, 1);
            if (st || !kept) continue;
            const int64_t *r;
            int64_t nr, nc = 0;
            st = dhsa_layout_get(a->layout, 0, g, b, &r, &nr);
            for (int64_t k = 0; k < nr && !st; k++) {
                int64_t s = r[2 * k] > c0 ? r[2 * k] : c0, e = r[2 * k + 1] < c1 ? r[2 * k + 1] : c1;
                if (e > s) {
                    cut[2 * nc] = s;
                    cut[2 * nc++ + 1] = e;
                }
            }
            if (!st) st = dhsa_layout_set(kept, 0, g, b, cut, nc);
        }
    dhsa_attn_desc d = *a;
    d.o = dhsa_tensor_bhld(h->buf, DHSA_F32, 1, Hq, n, dv);
    float *outs[4] = {lse_all, lse_copy, lse_ctl, lse_kept};
    const dhsa_layout *lays[4] = {NULL, only, ctl, kept};
    for (int k = 0; k < (kept ? 4 : 3) && !st; k++) {
        d.lse = dhsa_tensor_bhld(outs[k], DHSA_F32, 1, Hq, n, 1);
        d.layout = lays[k];
        st = dhsa_attention(h->ctx, &d);
    }
    if (!st)
        for (int64_t q = 0; q < Hq; q++)
            for (int64_t i = r0; i < r1; i++) {
                size_t at = (size_t)(q * n + i);
                double m = exp((double)lse_copy[at] - (double)lse_all[at]);
                h->copy_mass += m;
                h->copy_kept += kept ? exp((double)lse_kept[at] - (double)lse_all[at]) : m;
                h->copy_ctl_mass += exp((double)lse_ctl[at] - (double)lse_all[at]);
                h->copy_rows += 1;
            }
    free(cut);
    dhsa_layout_free(only);
    dhsa_layout_free(ctl);
    dhsa_layout_free(kept);
    if (st) snprintf(h->err, sizeof h->err, "copy mass at layer %lld: %s", (long long)layer, dhsa_last_error());
    return st != DHSA_OK;
}

int dhsa__probe_hook(void *user, int64_t layer, const dhsa_attn_desc *a) {
    dhsa__probe *h = user;
    const int64_t Hq = a->q.shape[1], n = a->q.shape[2], Hkv = a->k.shape[1];
    if (layer < 0 || layer >= h->n_layer) return 1;
    int64_t qb = 1;
    if (a->layout) {
        dhsa_layout_stats ls;
        if (dhsa_layout_get_stats(a->layout, &ls)) {
            snprintf(h->err, sizeof h->err, "layout stats: %s", dhsa_last_error());
            return 1;
        }
        h->selected[layer] += ls.selected;
        h->available[layer] += ls.available;
        qb = ls.q_block;
    }
    double vis_all = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t pos = a->q_pos0 + i, lo, hi;
        visible_span(a, pos, &lo, &hi);
        vis_all += (double)(hi - lo);
        if (!h->late_from || pos < h->late_from) continue;
        for (int64_t g = 0; g < Hkv; g++) {
            int64_t sel = hi - lo;
            if (a->layout) {
                const int64_t *r;
                int64_t nr;
                if (dhsa_layout_get(a->layout, 0, g, i / qb, &r, &nr)) return 1;
                sel = keys_in(r, nr, lo, hi);
            }
            h->late_selected += (double)sel;
            h->late_available += (double)(hi - lo);
        }
    }
    if (!a->layout) { /* dense call: everything selected, recall 1 */
        h->selected[layer] += vis_all * (double)Hkv;
        h->available[layer] += vis_all * (double)Hkv;
        h->recall[layer] += (double)(Hq * n);
        h->rows[layer] += (double)(Hq * n);
    } else if (h->want_recall && hook_recall(h, layer, a)) {
        return 1;
    }
    if (h->copy_len > 0 && hook_copy(h, layer, a)) return 1;
    return 0;
}

