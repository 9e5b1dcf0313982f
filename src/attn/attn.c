/* attn.c: the attention entry points. Checks a descriptor completely before
 * any work (shapes, strides, mask polarity, sizes), resolves the backend
 * (AUTO = TILED; env DHSA_ATTN=tiled|reference overrides AUTO), reserves the
 * exact workspace from the ctx (so a budget refuses the call up front) and
 * runs the backend. Tested by tests/test_attn*.c.
 */
#include "attn/attn_internal.h"
#include "attn/layout.h"

#include <math.h>
#include <stdlib.h>

/* Caps that keep every size product far from overflow. */
#define MAX_DIM ((int64_t)1 << 16)  /* d, dv, heads */
#define MAX_LEN ((int64_t)1 << 40)  /* B, Lq, Lk, q_pos0, window */

dhsa_attn_desc dhsa_attn_default_desc(void) {
    dhsa_attn_desc a;
    memset(&a, 0, sizeof a);
    a.backend = DHSA_BACKEND_AUTO;
    return a;
}

const char *dhsa_backend_name(dhsa_backend b) {
    switch (b) {
    case DHSA_BACKEND_AUTO: return "auto";
    case DHSA_BACKEND_TILED: return "tiled";
    case DHSA_BACKEND_REFERENCE: return "reference";
    }
    return "unknown";
}

dhsa_backend dhsa_attn_resolve_backend(dhsa_backend b) {
    if (b != DHSA_BACKEND_AUTO) return b;
    const char *e = getenv("DHSA_ATTN");
    if (!e || !e[0] || strcmp(e, "tiled") == 0) return DHSA_BACKEND_TILED;
    if (strcmp(e, "reference") == 0) {
        dhsa__warn_once("env-reference",
                        "DHSA_ATTN=reference: attention materialises Lq x Lk scores "
                        "(memory grows quadratically)");
        return DHSA_BACKEND_REFERENCE;
    }
    dhsa__warn_once("env-unknown", "DHSA_ATTN=%s is not tiled|reference: using tiled", e);
    return DHSA_BACKEND_TILED;
}

/* kv: the view is k or v, the only ones that may be Q8_0 (a quantized KV
 * cache); q, o, lse and masks are per-element types. */
static dhsa_status check_view(const char *name, const dhsa_tensor *t, int kv) {
    if (!t->data) return dhsa__fail(DHSA_ERR_INVALID_ARG, "%s has no data (NULL)", name);
    if (t->type == DHSA_Q8_0 && !kv)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "%s is Q8_0, which only k and v may be (a quantized KV cache); "
                          "%s must be F32, F16 or BF16", name, name);
    if (t->type != DHSA_F32 && t->type != DHSA_F16 && t->type != DHSA_BF16 && t->type != DHSA_Q8_0)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "%s has an unknown type %d", name, (int)t->type);
    for (int i = 0; i < 4; i++) {
        int64_t lim = (i == 1 || i == 3) ? MAX_DIM : MAX_LEN;
        int64_t min = (i == 2) ? 0 : 1;
        if (t->shape[i] < min || t->shape[i] > lim)
            return dhsa__fail(t->shape[i] < min ? DHSA_ERR_SHAPE : DHSA_ERR_TOO_LARGE,
                              "%s shape[%d] = %lld is outside [%lld, %lld]", name, i,
                              (long long)t->shape[i], (long long)min, (long long)lim);
        if (t->stride[i] < 0 || t->stride[i] > ((int64_t)1 << 50))
            return dhsa__fail(DHSA_ERR_SHAPE, "%s stride[%d] = %lld: strides must be in [0, 2^50]",
                              name, i, (long long)t->stride[i]);
    }
    return dhsa__check_view_type(name, t);
}

static dhsa_status check_finite(const char *name, const dhsa_tensor *t) {
    for (int64_t b = 0; b < t->shape[0]; b++)
        for (int64_t h = 0; h < t->shape[1]; h++)
            for (int64_t l = 0; l < t->shape[2]; l++) {
                const void *row = dhsa__at(t, b, h, l);
                for (int64_t c = 0; c < t->shape[3]; c++) {
                    float x = dhsa__load(row, t->type, c * t->stride[3]);
                    if (!isfinite(x))
                        return dhsa__fail(DHSA_ERR_NONFINITE, "%s[%lld, %lld, %lld, %lld] = %g", name,
                                          (long long)b, (long long)h, (long long)l, (long long)c,
                                          (double)x);
                }
            }
    return DHSA_OK;
}

dhsa_status dhsa__attn_check(const dhsa_attn_desc *a, dhsa__attn_problem *p) {
    dhsa_status st;
    if (!a) return dhsa__fail(DHSA_ERR_INVALID_ARG, "attention descriptor is NULL");
    if ((st = check_view("q", &a->q, 0)) || (st = check_view("k", &a->k, 1)) ||
        (st = check_view("v", &a->v, 1)) || (st = check_view("o", &a->o, 0)))
        return st;
    p->B = a->q.shape[0];
    p->Hq = a->q.shape[1];
    p->Lq = a->q.shape[2];
    p->d = a->q.shape[3];
    p->Hkv = a->k.shape[1];
    p->Lk = a->k.shape[2];
    p->dv = a->v.shape[3];
    if (a->k.shape[0] != p->B || a->v.shape[0] != p->B || a->o.shape[0] != p->B)
        return dhsa__fail(DHSA_ERR_SHAPE, "batch sizes differ: q %lld, k %lld, v %lld, o %lld",
                          (long long)p->B, (long long)a->k.shape[0], (long long)a->v.shape[0],
                          (long long)a->o.shape[0]);
    if (p->Hq % p->Hkv != 0)
        return dhsa__fail(DHSA_ERR_SHAPE, "q has %lld heads, not a multiple of k's %lld",
                          (long long)p->Hq, (long long)p->Hkv);
    if (a->v.shape[1] != p->Hkv)
        return dhsa__fail(DHSA_ERR_SHAPE, "k has %lld heads but v has %lld", (long long)p->Hkv,
                          (long long)a->v.shape[1]);
    if (a->k.shape[3] != p->d)
        return dhsa__fail(DHSA_ERR_SHAPE, "q has dim %lld but k has %lld", (long long)p->d,
                          (long long)a->k.shape[3]);
    if (a->v.shape[2] != p->Lk)
        return dhsa__fail(DHSA_ERR_SHAPE, "k has %lld rows but v has %lld", (long long)p->Lk,
                          (long long)a->v.shape[2]);
    if (a->o.shape[1] != p->Hq || a->o.shape[2] != p->Lq || a->o.shape[3] != p->dv)
        return dhsa__fail(DHSA_ERR_SHAPE, "o is [%lld, %lld, %lld, %lld], expected [%lld, %lld, %lld, %lld]",
                          (long long)a->o.shape[0], (long long)a->o.shape[1], (long long)a->o.shape[2],
                          (long long)a->o.shape[3], (long long)p->B, (long long)p->Hq,
                          (long long)p->Lq, (long long)p->dv);
    if (a->lse.data) {
        if ((st = check_view("lse", &a->lse, 0))) return st;
        if (a->lse.type != DHSA_F32 || a->lse.shape[0] != p->B || a->lse.shape[1] != p->Hq ||
            a->lse.shape[2] != p->Lq || a->lse.shape[3] != 1)
            return dhsa__fail(DHSA_ERR_SHAPE, "lse must be F32 [%lld, %lld, %lld, 1]", (long long)p->B,
                              (long long)p->Hq, (long long)p->Lq);
    }
    p->G = p->Hq / p->Hkv;

    if (!isfinite(a->scale))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "scale must be finite (0 = 1/sqrt(d))");
    p->scale = a->scale != 0.0f ? a->scale : (float)(1.0 / sqrt((double)p->d));
    if (!(a->softcap >= 0.0f) || !isfinite(a->softcap))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "softcap must be finite and >= 0 (0 = none), got %g",
                          (double)a->softcap);
    if (a->q_pos0 < 0 || a->q_pos0 > MAX_LEN)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "q_pos0 = %lld is outside [0, 2^40]",
                          (long long)a->q_pos0);
    if (a->k_pos0 < 0 || a->k_pos0 > a->q_pos0)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "k_pos0 = %lld is outside [0, q_pos0 = %lld]", (long long)a->k_pos0,
                          (long long)a->q_pos0);
    if (a->k_pos0 && a->layout)
        return dhsa__fail(DHSA_ERR_UNSUPPORTED, "a layout over keys from k_pos0 = %lld: layouts are made over keys "
                          "from position 0", (long long)a->k_pos0);
    if (a->window < 0 || a->window > MAX_LEN)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "window = %lld is outside [0 (none), 2^40]",
                          (long long)a->window);
    if (a->key_mask) {
        if (a->key_mask_polarity != DHSA_MASK_TRUE_IGNORES && a->key_mask_polarity != DHSA_MASK_TRUE_KEEPS)
            return dhsa__fail(DHSA_ERR_INVALID_ARG,
                              "key_mask given without a polarity: set key_mask_polarity to "
                              "DHSA_MASK_TRUE_IGNORES (PyTorch key_padding_mask: true = padding) or "
                              "DHSA_MASK_TRUE_KEEPS (SDPA bool attn_mask: true = attend)");
        if (a->key_mask_batch_stride < 0)
            return dhsa__fail(DHSA_ERR_INVALID_ARG, "key_mask_batch_stride must be >= 0");
    }
    if (a->key_bias && a->key_bias_batch_stride < 0)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "key_bias_batch_stride must be >= 0");
    memset(p->mstride, 0, sizeof p->mstride);
    if (a->attn_mask.data) {
        const dhsa_tensor *m = &a->attn_mask;
        if ((st = check_view("attn_mask", m, 0))) return st;
        if (m->type != DHSA_F32) return dhsa__fail(DHSA_ERR_INVALID_ARG, "attn_mask must be F32");
        int ok = (m->shape[0] == 1 || m->shape[0] == p->B) && (m->shape[1] == 1 || m->shape[1] == p->Hq) &&
                 m->shape[2] == p->Lq && m->shape[3] == p->Lk;
        if (!ok)
            return dhsa__fail(DHSA_ERR_SHAPE, "attn_mask is [%lld, %lld, %lld, %lld], expected [%lld|1, %lld|1, %lld, %lld]",
                              (long long)m->shape[0], (long long)m->shape[1], (long long)m->shape[2],
                              (long long)m->shape[3], (long long)p->B, (long long)p->Hq,
                              (long long)p->Lq, (long long)p->Lk);
        for (int i = 0; i < 4; i++) p->mstride[i] = m->shape[i] == 1 ? 0 : m->stride[i];
    }
    if (a->layout) {
        const dhsa_layout *l = a->layout;
        if (l->B != p->B || l->Hkv != p->Hkv || l->Lq != p->Lq || l->Lk != p->Lk)
            return dhsa__fail(DHSA_ERR_SHAPE,
                              "layout was built for B=%lld Hkv=%lld Lq=%lld Lk=%lld but the call has "
                              "B=%lld Hkv=%lld Lq=%lld Lk=%lld",
                              (long long)l->B, (long long)l->Hkv, (long long)l->Lq, (long long)l->Lk,
                              (long long)p->B, (long long)p->Hkv, (long long)p->Lq, (long long)p->Lk);
    }
    if (a->backend != DHSA_BACKEND_AUTO && a->backend != DHSA_BACKEND_TILED &&
        a->backend != DHSA_BACKEND_REFERENCE)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "unknown backend %d", (int)a->backend);
    if (a->check_finite) {
        if ((st = check_finite("q", &a->q)) || (st = check_finite("k", &a->k)) ||
            (st = check_finite("v", &a->v)))
            return st;
    }
    return DHSA_OK;
}

static dhsa_status workspace(const dhsa_ctx *ctx, const dhsa_attn_desc *a, dhsa__attn_problem *p,
                             dhsa_backend *be, size_t *bytes) {
    dhsa_status st = dhsa__attn_check(a, p);
    if (st) return st;
    *be = dhsa_attn_resolve_backend(a->backend);
    if (*be == DHSA_BACKEND_REFERENCE) {
        size_t cap = a->reference_max_bytes ? a->reference_max_bytes : ((size_t)1 << 30);
        /* Lq, Lk < 2^40: the product in double is exact enough to compare */
        double need = (double)p->Lq * (double)p->Lk * 8.0;
        if (need > (double)cap)
            return dhsa__fail(DHSA_ERR_TOO_LARGE,
                              "the reference backend would materialise %.0f bytes of scores "
                              "(Lq %lld x Lk %lld doubles), above its cap of %zu: raise "
                              "reference_max_bytes or use the tiled backend",
                              need, (long long)p->Lq, (long long)p->Lk, cap);
        *bytes = dhsa__attn_ref_workspace(p);
    } else {
        *bytes = dhsa__attn_tiled_workspace(ctx, p, a);
    }
    return DHSA_OK;
}

dhsa_status dhsa_attn_workspace_size(const dhsa_ctx *ctx, const dhsa_attn_desc *a, size_t *bytes) {
    if (!ctx || !bytes) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_attn_workspace_size: NULL argument");
    dhsa__attn_problem p;
    dhsa_backend be;
    return workspace(ctx, a, &p, &be, bytes);
}

dhsa_status dhsa_attention(dhsa_ctx *ctx, const dhsa_attn_desc *a) {
    if (!ctx) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_attention: ctx is NULL");
    dhsa__attn_problem p;
    dhsa_backend be;
    size_t bytes;
    dhsa_status st = workspace(ctx, a, &p, &be, &bytes);
    if (st) return st;
    if (p.Lq == 0) return DHSA_OK;
    /* keys from k_pos0: the kernels see positions counted from key row 0 */
    dhsa_attn_desc shifted;
    if (a->k_pos0) {
        shifted = *a;
        shifted.q_pos0 -= a->k_pos0;
        shifted.k_pos0 = 0;
        a = &shifted;
    }
    /* the scratch is the ctx's: one call at a time works in it */
    dhsa__ctx_lock(ctx);
    void *ws = dhsa__scratch(ctx, bytes, &st);
    if (ws && be == DHSA_BACKEND_REFERENCE)
        st = dhsa__attn_ref_run(ctx, a, &p, ws);
    else if (ws)
        st = dhsa__attn_tiled_run(ctx, a, &p, ws);
    dhsa__ctx_unlock(ctx);
    return st;
}
