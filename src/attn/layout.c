/* layout.c: sparse layouts. Per (batch, KV head, query block) a sorted list
 * of disjoint key ranges, with an exact size known before anything is
 * routed. Contract in include/dhsa.h; tested by tests/test_route_layout.c.
 */
#include "attn/layout.h"

#include <stdlib.h>

#define MAX_BLOCKS ((int64_t)1 << 40)

static dhsa_status check_sizes(int64_t B, int64_t Hkv, int64_t Lq, int64_t Lk, int64_t q_block,
                               int64_t max_ranges, int64_t *n_blocks, size_t *bytes) {
    if (B < 1 || Hkv < 1 || Lq < 1 || Lk < 0 || q_block < 1 || max_ranges < 1)
        return dhsa__fail(DHSA_ERR_INVALID_ARG,
                          "layout sizes B=%lld Hkv=%lld Lq=%lld Lk=%lld q_block=%lld max_ranges=%lld: "
                          "all must be >= 1 (Lk >= 0)",
                          (long long)B, (long long)Hkv, (long long)Lq, (long long)Lk,
                          (long long)q_block, (long long)max_ranges);
    if (B > (1 << 20) || Hkv > (1 << 16) || Lq > MAX_BLOCKS || Lk > MAX_BLOCKS || max_ranges > (1 << 30))
        return dhsa__fail(DHSA_ERR_TOO_LARGE, "layout sizes are beyond the supported range");
    int64_t nb = (Lq + q_block - 1) / q_block;
    double blocks = (double)B * (double)Hkv * (double)nb;
    double total = sizeof(dhsa_layout) + blocks * 8.0 * (1.0 + 2.0 * (double)max_ranges);
    if (total > 1e15) return dhsa__fail(DHSA_ERR_TOO_LARGE, "a layout of %.3g bytes is too large", total);
    *n_blocks = nb;
    size_t n = (size_t)B * (size_t)Hkv * (size_t)nb;
    *bytes = dhsa__align_up(sizeof(dhsa_layout), 64) + n * 8 + n * (size_t)max_ranges * 16;
    return DHSA_OK;
}

dhsa_status dhsa_layout_size(int64_t B, int64_t Hkv, int64_t Lq, int64_t Lk, int64_t q_block,
                             int64_t max_ranges, size_t *bytes) {
    int64_t nb;
    if (!bytes) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_layout_size: bytes is NULL");
    return check_sizes(B, Hkv, Lq, Lk, q_block, max_ranges, &nb, bytes);
}

dhsa_status dhsa_layout_create(dhsa_ctx *ctx, int64_t B, int64_t Hkv, int64_t Lq, int64_t Lk,
                               int64_t q_block, int64_t max_ranges, dhsa_layout **out) {
    if (!ctx || !out) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_layout_create: NULL argument");
    *out = NULL;
    int64_t nb;
    size_t bytes;
    dhsa_status st = check_sizes(B, Hkv, Lq, Lk, q_block, max_ranges, &nb, &bytes);
    if (st) return st;
    char *mem = dhsa__alloc(ctx, bytes, &st);
    if (!mem) return st;
    dhsa_layout *l = (dhsa_layout *)mem;
    memset(l, 0, sizeof *l);
    l->ctx = ctx;
    l->B = B;
    l->Hkv = Hkv;
    l->Lq = Lq;
    l->Lk = Lk;
    l->q_block = q_block;
    l->n_blocks = nb;
    l->max_ranges = max_ranges;
    size_t n = (size_t)B * (size_t)Hkv * (size_t)nb;
    l->count = (int64_t *)(mem + dhsa__align_up(sizeof(dhsa_layout), 64));
    l->ranges = l->count + n;
    memset(l->count, 0, n * 8);
    *out = l;
    return DHSA_OK;
}

void dhsa_layout_free(dhsa_layout *l) {
    if (l) dhsa_ctx_release(l->ctx, l);
}

static int cmp_pair(const void *a, const void *b) {
    const int64_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0] ? 1 : (x[1] < y[1] ? -1 : x[1] > y[1]);
}

int64_t dhsa__ranges_normalise(int64_t *r, int64_t n) {
    int64_t w = 0;
    for (int64_t i = 0; i < n; i++) /* drop empty ranges */
        if (r[2 * i + 1] > r[2 * i]) {
            r[2 * w] = r[2 * i];
            r[2 * w + 1] = r[2 * i + 1];
            w++;
        }
    n = w;
    if (n > 1) qsort(r, (size_t)n, 2 * sizeof(int64_t), cmp_pair);
    w = 0;
    for (int64_t i = 0; i < n; i++) {
        if (w > 0 && r[2 * i] <= r[2 * (w - 1) + 1]) {
            if (r[2 * i + 1] > r[2 * (w - 1) + 1]) r[2 * (w - 1) + 1] = r[2 * i + 1];
        } else {
            r[2 * w] = r[2 * i];
            r[2 * w + 1] = r[2 * i + 1];
            w++;
        }
    }
    return w;
}

static dhsa_status check_block(const dhsa_layout *l, int64_t b, int64_t g, int64_t qb) {
    if (!l) return dhsa__fail(DHSA_ERR_INVALID_ARG, "layout is NULL");
    if (b < 0 || b >= l->B || g < 0 || g >= l->Hkv || qb < 0 || qb >= l->n_blocks)
        return dhsa__fail(DHSA_ERR_INVALID_ARG,
                          "block (b=%lld, g=%lld, qb=%lld) is outside the layout [%lld, %lld, %lld]",
                          (long long)b, (long long)g, (long long)qb, (long long)l->B,
                          (long long)l->Hkv, (long long)l->n_blocks);
    return DHSA_OK;
}

dhsa_status dhsa_layout_set(dhsa_layout *l, int64_t b, int64_t g, int64_t qb, const int64_t *ranges,
                            int64_t n) {
    dhsa_status st = check_block(l, b, g, qb);
    if (st) return st;
    if (n < 0 || (n > 0 && !ranges))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_layout_set: %lld ranges at %p", (long long)n,
                          (const void *)ranges);
    for (int64_t i = 0; i < n; i++)
        if (ranges[2 * i] < 0 || ranges[2 * i + 1] > l->Lk || ranges[2 * i] > ranges[2 * i + 1])
            return dhsa__fail(DHSA_ERR_INVALID_ARG, "range %lld is [%lld, %lld), outside [0, Lk=%lld)",
                              (long long)i, (long long)ranges[2 * i], (long long)ranges[2 * i + 1],
                              (long long)l->Lk);
    /* Normalise a copy in the ctx's arena-free way: n is small in practice,
     * but never trust it: merge in place in the destination when it fits. */
    int64_t idx = dhsa__layout_index(l, b, g, qb);
    int64_t *dst = l->ranges + idx * l->max_ranges * 2;
    if (n <= l->max_ranges) {
        int64_t tmp[2 * 64];
        int64_t *w = n <= 64 ? tmp : malloc((size_t)n * 2 * sizeof(int64_t));
        if (!w) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory");
        if (n > 0) memcpy(w, ranges, (size_t)n * 2 * sizeof(int64_t));
        int64_t m = dhsa__ranges_normalise(w, n);
        memcpy(dst, w, (size_t)m * 2 * sizeof(int64_t));
        l->count[idx] = m;
        if (w != tmp) free(w);
        return DHSA_OK;
    }
    int64_t *w = malloc((size_t)n * 2 * sizeof(int64_t));
    if (!w) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory");
    memcpy(w, ranges, (size_t)n * 2 * sizeof(int64_t));
    int64_t m = dhsa__ranges_normalise(w, n);
    if (m > l->max_ranges) {
        free(w);
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "%lld disjoint ranges do not fit max_ranges = %lld",
                          (long long)m, (long long)l->max_ranges);
    }
    memcpy(dst, w, (size_t)m * 2 * sizeof(int64_t));
    l->count[idx] = m;
    free(w);
    return DHSA_OK;
}

dhsa_status dhsa_layout_get(const dhsa_layout *l, int64_t b, int64_t g, int64_t qb,
                            const int64_t **ranges, int64_t *n) {
    dhsa_status st = check_block(l, b, g, qb);
    if (st) return st;
    if (!ranges || !n) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_layout_get: NULL output");
    int64_t idx = dhsa__layout_index(l, b, g, qb);
    *ranges = l->ranges + idx * l->max_ranges * 2;
    *n = l->count[idx];
    return DHSA_OK;
}

dhsa_status dhsa_layout_get_stats(const dhsa_layout *l, dhsa_layout_stats *st) {
    if (!l || !st) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_layout_get_stats: NULL argument");
    memset(st, 0, sizeof *st);
    st->B = l->B;
    st->Hkv = l->Hkv;
    st->Lq = l->Lq;
    st->Lk = l->Lk;
    st->q_block = l->q_block;
    st->n_blocks = l->n_blocks;
    st->max_ranges = l->max_ranges;
    st->q_pos0 = l->q_pos0;
    st->causal = l->causal;
    st->window = l->window;
    st->dense_blocks = l->dense_blocks;
    st->chunks = l->chunks;
    st->chunk_mean = l->chunk_mean;
    st->chunk_min = l->chunk_min;
    st->chunk_max = l->chunk_max;
    for (int64_t b = 0; b < l->B; b++)
        for (int64_t g = 0; g < l->Hkv; g++)
            for (int64_t qb = 0; qb < l->n_blocks; qb++) {
                int64_t idx = dhsa__layout_index(l, b, g, qb), n = l->count[idx];
                const int64_t *r = l->ranges + idx * l->max_ranges * 2;
                st->ranges += n;
                int64_t r0 = qb * l->q_block, r1 = r0 + l->q_block < l->Lq ? r0 + l->q_block : l->Lq;
                for (int64_t row = r0; row < r1; row++) {
                    int64_t pos = l->q_pos0 + row, lo = 0, hi = l->Lk;
                    if (l->causal && pos + 1 < hi) hi = pos + 1;
                    if (l->window > 0 && pos - l->window + 1 > lo) lo = pos - l->window + 1;
                    if (hi <= lo) continue;
                    st->available += (double)(hi - lo);
                    for (int64_t i = 0; i < n; i++) {
                        int64_t s = r[2 * i] > lo ? r[2 * i] : lo, e = r[2 * i + 1] < hi ? r[2 * i + 1] : hi;
                        if (e > s) st->selected += (double)(e - s);
                    }
                }
            }
    st->density = st->available > 0 ? st->selected / st->available : 1.0;
    return DHSA_OK;
}

int dhsa_layout_selects(const dhsa_layout *l, int64_t b, int64_t g, int64_t row, int64_t key) {
    if (!l || row < 0 || row >= l->Lq) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_layout_selects: bad row");
    const int64_t *r;
    int64_t n;
    dhsa_status st = dhsa_layout_get(l, b, g, row / l->q_block, &r, &n);
    if (st) return st;
    int64_t lo = 0, hi = n; /* first range whose end > key */
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (r[2 * mid + 1] <= key) lo = mid + 1;
        else hi = mid;
    }
    return lo < n && r[2 * lo] <= key;
}
