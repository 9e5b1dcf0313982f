/* probe.h: the layer hook of the evaluations (src/eval/evaluate.c, and
 * `dhsa eval copy` in tools/eval.c): what a session's layer_hook gathers
 * over its evals. Internal: not in the public header (include/dhsa.h
 * "Evaluation" block has the functions that use it; docs/eval.md the
 * method).
 *
 * Per layer: the selected and available keys (summed over KV heads and
 * query rows, as dhsa_layout_get_stats counts them), and the same for the
 * rows at positions >= late_from only (0: not counted); with want_recall,
 * the attention recall (each routed call rerun dense and with its layout,
 * both with LSE, through dhsa_fidelity_compare), summed over rows and
 * heads; a call without a layout counts as dense (everything selected,
 * recall 1).
 *
 * With copy_len > 0, for the queries of a repetition (positions
 * [copy_at2, copy_at2 + copy_len - 1), each predicting the next passage
 * token): the share of the first copy's keys [copy_at1, copy_at1 +
 * copy_len) the layout selects, the softmax mass a dense attention over
 * the same states puts on the first copy, the part of that mass on keys
 * the layout selects, and (a control) the dense mass on
 * [copy_ctl, copy_ctl + copy_len).
 *
 * Memory: the sums ([n_layer] x 4 doubles) at init; the reruns' outputs
 * and LSEs in a buffer that grows to the largest call (evaluation only, not
 * a hot path of inference). On a failure the hook returns 1 with the
 * reason in err (dhsa__probe_fail builds the caller's sentence).
 * Tested by tests/test_eval_lib.c.
 */
#ifndef DHSA_EVAL_PROBE_H
#define DHSA_EVAL_PROBE_H

#include "dhsa.h"

typedef struct {
    dhsa_ctx *ctx;
    int want_recall;
    int64_t n_layer, late_from, copy_at1, copy_at2, copy_len, copy_ctl;
    double *selected, *available, *recall, *rows; /* [n_layer] each */
    double late_selected, late_available;
    double copy_cover, copy_cover_n, copy_mass, copy_kept, copy_ctl_mass, copy_rows;
    float *buf; /* attention outputs and LSEs of the reruns */
    size_t cap;
    char err[256];
} dhsa__probe;

/* Allocates the sums; DHSA_ERR_OUT_OF_MEMORY (with a sentence) if not. */
dhsa_status dhsa__probe_init(dhsa__probe *h, dhsa_ctx *ctx, int64_t n_layer, int want_recall);
/* Zeroes the sums (the settings stay). */
void dhsa__probe_clear(dhsa__probe *h);
void dhsa__probe_free(dhsa__probe *h);
/* The session layer_hook; user is a dhsa__probe. */
int dhsa__probe_hook(void *user, int64_t layer, const dhsa_attn_desc *a);
/* Selected / available keys over every layer (1 when nothing counted). */
double dhsa__probe_density(const dhsa__probe *h);
/* The same over the rows at positions >= late_from (NaN when none). */
double dhsa__probe_late_density(const dhsa__probe *h);
/* Mean recall of layer l (NaN when no row counted). */
double dhsa__probe_recall(const dhsa__probe *h, int64_t l);
/* A failed eval with the hook's reason: the library's last error, then
 * ": " and h->err when the hook set one; returns s (for `return`). */
dhsa_status dhsa__probe_fail(const dhsa__probe *h, dhsa_status s);

#endif
