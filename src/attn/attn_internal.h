/* attn_internal.h: what the attention backends share: the checked problem
 * (sizes, the effective scale, broadcast strides of the dense mask) and the
 * per-key mask rule. Filled by dhsa__attn_check() in attn.c.
 */
#ifndef DHSA_ATTN_INTERNAL_H
#define DHSA_ATTN_INTERNAL_H

#include "core/internal.h"

#include <math.h>

typedef struct {
    int64_t B, Hq, Hkv, G, Lq, Lk, d, dv;
    float scale;
    int64_t mstride[4]; /* attn_mask strides, 0 on broadcast dimensions */
} dhsa__attn_problem;

dhsa_status dhsa__attn_check(const dhsa_attn_desc *a, dhsa__attn_problem *p);

/* Allowed key range [lo, hi) of a query at absolute position pos. */
static inline void dhsa__attn_key_range(const dhsa_attn_desc *a, int64_t Lk, int64_t pos,
                                        int64_t *lo, int64_t *hi) {
    int64_t l = 0, h = Lk;
    if (a->causal && pos + 1 < h) h = pos + 1;
    if (a->window > 0 && pos - a->window + 1 > l) l = pos - a->window + 1;
    if (h < l) h = l;
    *lo = l;
    *hi = h;
}

/* Additive term of key j in batch b from the key mask and key bias:
 * -inf if the mask excludes it, else the bias (0 without one). */
static inline float dhsa__attn_key_add(const dhsa_attn_desc *a, int64_t b, int64_t j) {
    if (a->key_mask) {
        int on = a->key_mask[b * a->key_mask_batch_stride + j] != 0;
        int keep = a->key_mask_polarity == DHSA_MASK_TRUE_KEEPS ? on : !on;
        if (!keep) return -INFINITY;
    }
    return a->key_bias ? a->key_bias[b * a->key_bias_batch_stride + j] : 0.0f;
}

/* Backends. Workspace sizes are exact; run() assumes the check passed and
 * the workspace is at hand. */
size_t dhsa__attn_ref_workspace(const dhsa__attn_problem *p);
dhsa_status dhsa__attn_ref_run(dhsa_ctx *ctx, const dhsa_attn_desc *a, const dhsa__attn_problem *p,
                               void *ws);
size_t dhsa__attn_tiled_workspace(const dhsa_ctx *ctx, const dhsa__attn_problem *p,
                                  const dhsa_attn_desc *a);
dhsa_status dhsa__attn_tiled_run(dhsa_ctx *ctx, const dhsa_attn_desc *a,
                                 const dhsa__attn_problem *p, void *ws);

#endif
