/* merge.c: dhsa_attn_merge, the exact merge of partial attentions over
 * disjoint key sets through their log-sum-exp (include/dhsa.h).
 *
 * A part is (o_k, lse_k) of one softmax over its keys K_k:
 *   o_k = sum_{j in K_k} e^{s_j} v_j / e^{lse_k},  lse_k = log sum_{j in K_k} e^{s_j}
 * so the attention over the union of the K_k is
 *   o = sum_k e^{lse_k} o_k / sum_k e^{lse_k},     lse = log sum_k e^{lse_k}
 * (the weights taken relative to the larger LSE, in double). Parts are
 * merged left to right, each into the running (o, lse) rounded to F32, so
 * that merging parts as they arrive (context parallelism, src/dist/) gives
 * the same bits as merging them all in one call. A part with lse = -inf
 * (no allowed key) weighs nothing.
 * Tested by tests/test_attn_merge.c against attention over the union
 * computed in double.
 */
#include "core/internal.h"

#include <math.h>
#include <string.h>

/* The running (x, a) of dv values <- its merge with the part (y, b). */
static void merge_row(float *x, int64_t sx, float *a, const float *y, int64_t sy, float b, int64_t dv) {
    if (b == -INFINITY) return;
    if (*a == -INFINITY) {
        for (int64_t c = 0; c < dv; c++) x[c * sx] = y[c * sy];
        *a = b;
        return;
    }
    const double mx = *a > b ? *a : b, wa = exp((double)*a - mx), wb = exp((double)b - mx), sum = wa + wb;
    for (int64_t c = 0; c < dv; c++) x[c * sx] = (float)((wa * x[c * sx] + wb * y[c * sy]) / sum);
    *a = (float)(mx + log(sum));
}

static int same_view(const dhsa_tensor *a, const dhsa_tensor *b) {
    return a->data == b->data && memcmp(a->stride, b->stride, sizeof a->stride) == 0;
}

static dhsa_status check_f32(const dhsa_tensor *t, const char *what, int64_t i, const int64_t *shape, int is_lse) {
    if (!t->data) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_attn_merge: %s %lld has no data", what, (long long)i);
    if (t->type != DHSA_F32)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_attn_merge: %s %lld is not F32", what, (long long)i);
    for (int d = 0; d < 4; d++) {
        const int64_t want = is_lse && d == 3 ? 1 : shape[d];
        if (t->shape[d] != want)
            return dhsa__fail(DHSA_ERR_SHAPE, "dhsa_attn_merge: %s %lld has shape [%lld, %lld, %lld, %lld], want "
                              "[%lld, %lld, %lld, %lld]", what, (long long)i, (long long)t->shape[0],
                              (long long)t->shape[1], (long long)t->shape[2], (long long)t->shape[3],
                              (long long)shape[0], (long long)shape[1], (long long)shape[2],
                              (long long)(is_lse ? 1 : shape[3]));
    }
    return DHSA_OK;
}

dhsa_status dhsa_attn_merge(const dhsa_tensor *o_parts, const dhsa_tensor *lse_parts, int64_t n_parts,
                            const dhsa_tensor *o, const dhsa_tensor *lse) {
    if (!o_parts || !lse_parts || !o || !lse)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_attn_merge: NULL argument");
    if (n_parts < 1) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_attn_merge: %lld parts (at least 1)", (long long)n_parts);
    const int64_t *shape = o->shape;
    dhsa_status st;
    if ((st = check_f32(o, "the output o", 0, shape, 0)) || (st = check_f32(lse, "the output lse", 0, shape, 1)))
        return st;
    for (int64_t k = 0; k < n_parts; k++) {
        if ((st = check_f32(&o_parts[k], "o part", k, shape, 0)) || (st = check_f32(&lse_parts[k], "lse part", k, shape, 1)))
            return st;
        /* the output may be part 0 itself (merging in place); no other part
         * may share its memory, which the first copy would overwrite */
        if (k > 0 && (o_parts[k].data == o->data || lse_parts[k].data == lse->data))
            return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_attn_merge: part %lld is the output; only part 0 may be",
                              (long long)k);
    }
    const int in_place_o = same_view(&o_parts[0], o), in_place_l = same_view(&lse_parts[0], lse);
    if ((o_parts[0].data == o->data && !in_place_o) || (lse_parts[0].data == lse->data && !in_place_l))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_attn_merge: part 0 and the output share memory with other "
                          "strides");
    const int64_t dv = shape[3], so = o->stride[3];
    for (int64_t b = 0; b < shape[0]; b++)
        for (int64_t h = 0; h < shape[1]; h++)
            for (int64_t i = 0; i < shape[2]; i++) {
                float *x = dhsa__at(o, b, h, i), *a = dhsa__at(lse, b, h, i);
                if (!in_place_o) {
                    const float *y = dhsa__at(&o_parts[0], b, h, i);
                    for (int64_t c = 0; c < dv; c++) x[c * so] = y[c * o_parts[0].stride[3]];
                }
                if (!in_place_l) *a = *(const float *)dhsa__at(&lse_parts[0], b, h, i);
                for (int64_t k = 1; k < n_parts; k++)
                    merge_row(x, so, a, dhsa__at(&o_parts[k], b, h, i), o_parts[k].stride[3],
                              *(const float *)dhsa__at(&lse_parts[k], b, h, i), dv);
            }
    return DHSA_OK;
}
