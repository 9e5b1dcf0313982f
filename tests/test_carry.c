/* test_carry.c: the chunks a decode step carries to the next
 * (dhsa_router_params.carry; src/route/carry.h, docs/dhsa.md "Chunks
 * carried from one decode step to the next").
 *
 * 1. dhsa__carry_chunks against a double-precision reference written here:
 *    for random one-row calls (G = 1, 3, 8 and 10 query heads per KV head,
 *    d = 40 and 64, F32, F16 and Q8_0 keys, with and without softcap) and
 *    layouts set by hand (ranges that cut chunks, cover the open tail and
 *    skip chunks), each chunk's share of the attention is the mean over the
 *    group's heads of each head's softmax over the keys the layout reads,
 *    from the keys as stored (widened exactly); the carried lists must be
 *    exactly the chunks at or above the share, largest first. Shares within
 *    1e-4 of the threshold are not judged (the kernels' float sums differ
 *    from double there). A planted key makes each list non-empty. The
 *    comparison is shown to fail on a list with one chunk left out.
 * 2. dhsa_kv_index_route_keep: a decode step's kept chunks are read (their
 *    keys in the layout) even when they rank last by score, and so is
 *    the chunk after each (read in neither without the carry); with keep =
 *    NULL, or -1 entries, or a chunk not yet closed, the layout is exactly
 *    dhsa_kv_index_route's.
 * 3. Sessions (the shipped default model, routing active: dense_below 0,
 *    a budget of 48 keys, blocks of 16 rows): decoding with carry 0.1 and
 *    0 gives other logits (the carried chunks change a step's routing:
 *    without that the checks below could not fail); a truncation to the
 *    session's own length drops the carried chunks: the next step gives,
 *    bit for bit, what a session loaded from a state saved at that point
 *    gives (a load holds none), and not what the untruncated session gives.
 * 4. The public entry dhsa_kv_index_carry (what a caller with its own
 *    decode loop runs, dhsa.torch's plug-in): the index's chunks, the
 *    default scale, a key mask of either polarity leaving keys out (a
 *    masked chunk the planted key makes carried without the mask is not
 *    carried with it), and its refusals (share outside [0, 1] or NaN, a
 *    window, more than one row, other keys, NULL, share_heads).
 * 5. The parameter: dhsa_router_params_for gives 0.1, the primitives' 0;
 *    a carry outside [0, 1] is refused by dhsa_route with a sentence.
 *
 * Run: make build/tests/test_carry && build/tests/test_carry
 * Ends with "test_carry: P passed, F failed, S skipped".
 */
#include "dhsa.h"
#include "route/carry.h"
#include "route/kv_index_internal.h"
#include "t.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t g_rng = 88172645463325252ull;
static double urand(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) / 9007199254740992.0;
}
static double nrand(void) {
    double u = urand() + 1e-12, v = urand();
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

/* The reference: shares per chunk of KV head g (double), keys as stored;
 * keys with skip[t] nonzero (skip may be NULL) take no part. */
static void ref_shares(const float *q, const float *kf, int64_t Hkv, int64_t G, int64_t Lk, int64_t d, float scale,
                       float softcap, int64_t g, const int64_t *r, int64_t nr, const int64_t *starts, int64_t nc,
                       const unsigned char *skip, double *share) {
    (void)Hkv;
    for (int64_t c = 0; c <= nc; c++) share[c] = 0;
    double *lg = malloc((size_t)Lk * sizeof(double));
    for (int64_t h = g * G; h < (g + 1) * G; h++) {
        double m = -INFINITY, z = 0;
        for (int64_t i = 0; i < nr; i++)
            for (int64_t t = r[2 * i]; t < r[2 * i + 1]; t++) {
                double x = 0;
                for (int64_t e = 0; e < d; e++) x += (double)q[h * d + e] * (double)kf[(g * Lk + t) * d + e];
                x *= scale;
                if (softcap > 0) x = softcap * tanh(x / softcap);
                if (skip && skip[t]) x = -INFINITY;
                lg[t] = x;
                m = x > m ? x : m;
            }
        for (int64_t i = 0; i < nr; i++)
            for (int64_t t = r[2 * i]; t < r[2 * i + 1]; t++) z += exp(lg[t] - m);
        for (int64_t i = 0; i < nr; i++)
            for (int64_t t = r[2 * i]; t < r[2 * i + 1]; t++) {
                int64_t c = 0;
                if (t >= starts[nc]) continue;
                while (starts[c + 1] <= t) c++;
                share[c] += exp(lg[t] - m) / z / (double)G;
            }
    }
    free(lg);
}

/* 1 when got (DHSA_CARRY_MAX entries, -1 padded) is the list the shares
 * give: every chunk >= thr + eps in it, none < thr - eps, in descending
 * share order; why says the first difference. */
static int same_list(const int64_t *got, const double *share, int64_t nc, double thr, char *why, size_t cap) {
    const double eps = 1e-4;
    int64_t n = 0;
    while (n < DHSA_CARRY_MAX && got[n] >= 0) n++;
    for (int64_t i = n; i < DHSA_CARRY_MAX; i++)
        if (got[i] != -1) return snprintf(why, cap, "entry %lld after the end is %lld", (long long)i, (long long)got[i]), 0;
    for (int64_t i = 0; i < n; i++) {
        if (got[i] >= nc) return snprintf(why, cap, "chunk %lld of %lld", (long long)got[i], (long long)nc), 0;
        if (share[got[i]] < thr - eps)
            return snprintf(why, cap, "chunk %lld carried with share %.6f < %.3f", (long long)got[i], share[got[i]], thr), 0;
        if (i > 0 && share[got[i]] > share[got[i - 1]] + eps)
            return snprintf(why, cap, "chunk %lld (%.6f) after %lld (%.6f)", (long long)got[i], share[got[i]],
                            (long long)got[i - 1], share[got[i - 1]]), 0;
    }
    int64_t want = 0;
    for (int64_t c = 0; c < nc; c++) {
        if (!(share[c] >= thr + eps)) continue;
        want++;
        int found = 0;
        for (int64_t i = 0; i < n; i++) found |= got[i] == c;
        if (!found && n < DHSA_CARRY_MAX)
            return snprintf(why, cap, "chunk %lld (share %.6f >= %.3f) not carried", (long long)c, share[c], thr), 0;
    }
    if (want > DHSA_CARRY_MAX && n != DHSA_CARRY_MAX) return snprintf(why, cap, "list not full"), 0;
    return 1;
}

static void test_chunks(void) {
    dhsa_ctx *ctx = NULL;
    T_CHECK(dhsa_ctx_create(NULL, &ctx) == DHSA_OK, "ctx");
    if (!ctx) return;
    const int64_t Gs[] = {1, 3, 8, 10}, ds[] = {40, 64};
    const dhsa_type types[] = {DHSA_F32, DHSA_F16, DHSA_Q8_0};
    int judged = 0, failed_shown = 0;
    for (int gi = 0; gi < 4; gi++)
        for (int di = 0; di < 2; di++)
            for (int ti = 0; ti < 3; ti++)
                for (int cap = 0; cap < 2; cap++) {
                    const int64_t G = Gs[gi], d = ds[di], Hkv = 2, Hq = G * Hkv, Lk = 300;
                    const dhsa_type kt = types[ti];
                    if (kt == DHSA_Q8_0 && d % 32) continue;
                    float *q = malloc((size_t)(Hq * d) * sizeof(float)), *kf = malloc((size_t)(Hkv * Lk * d) * sizeof(float));
                    size_t row = dhsa_type_row_bytes(kt, d);
                    unsigned char *kraw = malloc((size_t)(Hkv * Lk) * row);
                    for (int64_t x = 0; x < Hq * d; x++) q[x] = (float)nrand();
                    for (int64_t x = 0; x < Hkv * Lk * d; x++) kf[x] = (float)nrand();
                    /* a planted key per head group: the first head's query direction, strong */
                    for (int64_t g = 0; g < Hkv; g++) {
                        int64_t t = 40 + 97 * g;
                        for (int64_t e = 0; e < d; e++) kf[(g * Lk + t) * d + e] = 3.0f * q[g * G * d + e] / (float)sqrt((double)d) * 4.0f;
                    }
                    /* store the keys in the cache type, then read them back exactly */
                    for (int64_t x = 0; x < Hkv * Lk; x++) {
                        float *src = kf + x * d;
                        unsigned char *dst = kraw + (size_t)x * row;
                        if (kt == DHSA_F32) memcpy(dst, src, (size_t)d * sizeof(float));
                        else if (kt == DHSA_F16)
                            for (int64_t e = 0; e < d; e++) {
                                uint16_t h = dhsa_f32_to_f16(src[e]);
                                memcpy(dst + 2 * e, &h, 2);
                                src[e] = dhsa_f16_to_f32(h);
                            }
                        else {
                            dhsa_q8_0_quantize_row(src, dst, d);
                            dhsa_q8_0_dequantize_row(dst, src, d);
                        }
                    }
                    dhsa_tensor kv = dhsa_tensor_bhld(kraw, kt, 1, Hkv, Lk, d);
                    /* chunks: random lengths 5..30, an open tail of 12 keys */
                    int64_t starts[400], nc = 0;
                    starts[0] = 0;
                    while (starts[nc] + 30 < Lk - 12) {
                        starts[nc + 1] = starts[nc] + 5 + (int64_t)(urand() * 26);
                        nc++;
                    }
                    dhsa_layout *lay = NULL;
                    T_CHECK(dhsa_layout_create(ctx, 1, Hkv, 1, Lk, 1, 64, &lay) == DHSA_OK, "layout");
                    int64_t rg[2][8] = {{0, 4, 33, 70, 120, 133, 250, 300}, {0, 4, 90, 150, 180, 260, 288, 300}};
                    for (int64_t g = 0; g < Hkv; g++) dhsa_layout_set(lay, 0, g, 0, rg[g], 4);
                    dhsa_attn_desc a = dhsa_attn_default_desc();
                    a.q = dhsa_tensor_bhld(q, DHSA_F32, 1, Hq, 1, d);
                    a.k = kv;
                    a.scale = 1.0f / (float)sqrt((double)d);
                    a.softcap = cap ? 7.5f : 0.0f;
                    int64_t out[2 * DHSA_CARRY_MAX];
                    const double thr[] = {0.02, 0.1};
                    for (int s = 0; s < 2; s++) {
                        dhsa_status st = dhsa__carry_chunks(&a, lay, starts, nc, thr[s], out);
                        T_CHECK(st == DHSA_OK, "carry_chunks: %s", dhsa_last_error());
                        for (int64_t g = 0; g < Hkv; g++) {
                            double share[401];
                            const int64_t *r;
                            int64_t nr;
                            dhsa_layout_get(lay, 0, g, 0, &r, &nr);
                            ref_shares(q, kf, Hkv, G, Lk, d, a.scale, a.softcap, g, r, nr, starts, nc, NULL, share);
                            char why[256] = "";
                            int ok = same_list(out + g * DHSA_CARRY_MAX, share, nc, thr[s], why, sizeof why);
                            T_CHECK(ok, "G %lld d %lld %s softcap %d share %.2f group %lld: %s", (long long)G,
                                    (long long)d, dhsa_type_name(kt), cap, thr[s], (long long)g, why);
                            T_CHECK(out[g * DHSA_CARRY_MAX] >= 0, "G %lld d %lld %s: the planted key's chunk is carried",
                                    (long long)G, (long long)d, dhsa_type_name(kt));
                            judged++;
                            if (!failed_shown && out[g * DHSA_CARRY_MAX] >= 0) { /* the comparator can fail */
                                int64_t bad[DHSA_CARRY_MAX];
                                memcpy(bad, out + g * DHSA_CARRY_MAX, sizeof bad);
                                int64_t n = 0;
                                while (n < DHSA_CARRY_MAX && bad[n] >= 0) n++;
                                bad[n - 1] = -1;
                                T_CHECK(!same_list(bad, share, nc, thr[s], why, sizeof why),
                                        "a list with a chunk left out is told apart");
                                failed_shown = 1;
                            }
                        }
                    }
                    /* off: every entry -1 */
                    T_CHECK(dhsa__carry_chunks(&a, lay, starts, nc, 0.0, out) == DHSA_OK && out[0] == -1 &&
                                out[DHSA_CARRY_MAX] == -1,
                            "share 0 carries nothing");
                    dhsa_layout_free(lay);
                    free(q);
                    free(kf);
                    free(kraw);
                }
    T_CHECK(judged > 0, "lists judged: %d", judged);
    dhsa_ctx_free(ctx);
}

/* Keys of KV head g, one chunk per `seg` keys (FIXED), query along -key of
 * chunk `low` so that it ranks last. */
static void test_keep(void) {
    dhsa_ctx *ctx = NULL;
    T_CHECK(dhsa_ctx_create(NULL, &ctx) == DHSA_OK, "ctx");
    if (!ctx) return;
    const int64_t Hkv = 2, G = 2, Hq = 4, d = 32, L = 1024, seg = 16; /* budget 64: room for two chunks */
    dhsa_router_params rp = dhsa_router_params_for(L, 0.0625);
    rp.boundary = DHSA_BOUNDARY_FIXED;
    rp.chunk = seg;
    dhsa_kv_index *ix = NULL;
    T_CHECK(dhsa_kv_index_create(ctx, &rp, Hkv, d, L + 1, &ix) == DHSA_OK, "index: %s", dhsa_last_error());
    float *k = malloc((size_t)(Hkv * L * d) * sizeof(float)), *q = malloc((size_t)(Hq * d) * sizeof(float));
    float *dir = malloc((size_t)((L / seg) * d) * sizeof(float));
    for (int64_t c = 0; c < L / seg; c++)
        for (int64_t e = 0; e < d; e++) dir[c * d + e] = (float)nrand();
    for (int64_t g = 0; g < Hkv; g++)
        for (int64_t t = 0; t < L; t++)
            for (int64_t e = 0; e < d; e++) k[(g * L + t) * d + e] = dir[(t / seg) * d + e] + 0.05f * (float)nrand();
    const int64_t low = 7; /* the chunk the query turns away from, and the one after it */
    for (int64_t h = 0; h < Hq; h++)
        for (int64_t e = 0; e < d; e++) q[h * d + e] = -2.0f * (dir[low * d + e] + dir[(low + 1) * d + e]);
    dhsa_tensor kt = dhsa_tensor_bhld(k, DHSA_F32, 1, Hkv, L, d);
    T_CHECK(dhsa_kv_index_append(ix, &kt) == DHSA_OK, "append: %s", dhsa_last_error());
    dhsa_attn_desc a = dhsa_attn_default_desc();
    a.q = dhsa_tensor_bhld(q, DHSA_F32, 1, Hq, 1, d);
    a.k = kt;
    a.v = kt;
    a.causal = 1;
    a.q_pos0 = L - 1;
    a.scale = 1.0f / (float)sqrt((double)d);
    dhsa_layout *plain = NULL, *kept = NULL, *none = NULL;
    int64_t keep[2 * DHSA_CARRY_MAX], nokeep[2 * DHSA_CARRY_MAX];
    for (int i = 0; i < 2 * DHSA_CARRY_MAX; i++) keep[i] = nokeep[i] = -1;
    keep[0] = low;                    /* group 0 keeps the last-ranked chunk */
    keep[DHSA_CARRY_MAX] = 100000;    /* group 1: no such chunk (ignored) */
    nokeep[0] = L / seg + 3;          /* never a candidate */
    T_CHECK(dhsa_kv_index_route(ctx, ix, &a, &plain) == DHSA_OK, "route: %s", dhsa_last_error());
    T_CHECK(dhsa_kv_index_route_keep(ctx, ix, &a, keep, &kept) == DHSA_OK, "route keep: %s", dhsa_last_error());
    T_CHECK(dhsa_kv_index_route_keep(ctx, ix, &a, nokeep, &none) == DHSA_OK, "route keep none: %s", dhsa_last_error());
    if (plain && kept && none) {
        for (int64_t g = 0; g < Hkv; g++) {
            const int64_t *r0, *r1, *r2;
            int64_t n0, n1, n2;
            dhsa_layout_get(plain, 0, g, 0, &r0, &n0);
            dhsa_layout_get(kept, 0, g, 0, &r1, &n1);
            dhsa_layout_get(none, 0, g, 0, &r2, &n2);
            int has0 = 0, has1 = 0, next0 = 0, next1 = 0;
            for (int64_t i = 0; i < n0; i++) has0 |= r0[2 * i] <= low * seg && r0[2 * i + 1] >= (low + 1) * seg;
            for (int64_t i = 0; i < n1; i++) has1 |= r1[2 * i] <= low * seg && r1[2 * i + 1] >= (low + 1) * seg;
            for (int64_t i = 0; i < n0; i++) next0 |= r0[2 * i] < (low + 2) * seg && r0[2 * i + 1] > (low + 1) * seg;
            for (int64_t i = 0; i < n1; i++) next1 |= r1[2 * i] < (low + 2) * seg && r1[2 * i + 1] > (low + 1) * seg;
            T_CHECK(!has0, "group %lld: the turned-away chunk is not read without carry (the test can fail)", (long long)g);
            T_CHECK(!next0, "group %lld: nor the chunk after it", (long long)g);
            if (g == 0) T_CHECK(has1, "group 0: the kept chunk is read");
            if (g == 0) T_CHECK(next1, "group 0: the chunk after the kept one is read (where a copy goes on)");
            else T_CHECK(n1 == n0 && memcmp(r1, r0, (size_t)(2 * n0) * sizeof(int64_t)) == 0,
                         "group 1: a keep entry past the chunks changes nothing");
            T_CHECK(n2 == n0 && memcmp(r2, r0, (size_t)(2 * n0) * sizeof(int64_t)) == 0,
                    "group %lld: keep lists of no candidate route as dhsa_kv_index_route", (long long)g);
        }
    }
    dhsa_layout_free(plain);
    dhsa_layout_free(kept);
    dhsa_layout_free(none);
    dhsa_kv_index_free(ix);
    free(k);
    free(q);
    free(dir);
    (void)G;
    dhsa_ctx_free(ctx);
}

/* The public entry, dhsa_kv_index_carry: the index's own chunks, the
 * default scale resolved, a key mask of either polarity leaving keys out
 * (against the reference with those keys skipped; the masked chunk is
 * carried without the mask, so the check can fail), and its refusals. */
static void test_public(void) {
    dhsa_ctx *ctx = NULL;
    T_CHECK(dhsa_ctx_create(NULL, &ctx) == DHSA_OK, "ctx");
    if (!ctx) return;
    const int64_t Hkv = 2, G = 3, Hq = 6, d = 32, L = 400;
    dhsa_router_params rp = dhsa_router_params_for(L, 0.25);
    rp.boundary = DHSA_BOUNDARY_FIXED;
    rp.chunk = 16;
    rp.dense_below = 0;
    dhsa_kv_index *ix = NULL;
    T_CHECK(dhsa_kv_index_create(ctx, &rp, Hkv, d, L, &ix) == DHSA_OK, "index: %s", dhsa_last_error());
    float *k = malloc((size_t)(Hkv * L * d) * sizeof(float)), *q = malloc((size_t)(Hq * d) * sizeof(float));
    for (int64_t x = 0; x < Hq * d; x++) q[x] = (float)nrand();
    for (int64_t x = 0; x < Hkv * L * d; x++) k[x] = (float)nrand();
    const int64_t planted = 200; /* in chunk 12, past the sinks, before the local keys */
    for (int64_t g = 0; g < Hkv; g++)
        for (int64_t e = 0; e < d; e++) k[(g * L + planted) * d + e] = 2.0f * q[g * G * d + e];
    dhsa_tensor kt = dhsa_tensor_bhld(k, DHSA_F32, 1, Hkv, L, d);
    T_CHECK(ix && dhsa_kv_index_append(ix, &kt) == DHSA_OK, "append: %s", dhsa_last_error());
    dhsa_attn_desc a = dhsa_attn_default_desc();
    a.q = dhsa_tensor_bhld(q, DHSA_F32, 1, Hq, 1, d);
    a.k = kt;
    a.v = kt;
    a.causal = 1;
    a.q_pos0 = L - 1;
    dhsa_layout *lay = NULL;
    T_CHECK(ix && dhsa_kv_index_route(ctx, ix, &a, &lay) == DHSA_OK, "route: %s", dhsa_last_error());
    if (!ix || !lay) goto done;
    const int64_t *starts;
    const int64_t nc = dhsa_kv_index_chunks(ix, &starts);
    const int64_t pc = planted / 16;
    unsigned char skip[400], keepm[400];
    int seen = 0;
    for (int64_t t = 0; t < L; t++) {
        skip[t] = t >= pc * 16 && t < (pc + 1) * 16;
        keepm[t] = !skip[t];
    }
    for (int m = 0; m < 3; m++) { /* no mask, TRUE_IGNORES, TRUE_KEEPS */
        a.key_mask = m == 0 ? NULL : m == 1 ? skip : keepm;
        a.key_mask_polarity = m == 0 ? DHSA_MASK_NO_POLARITY : m == 1 ? DHSA_MASK_TRUE_IGNORES : DHSA_MASK_TRUE_KEEPS;
        int64_t out[2 * DHSA_CARRY_MAX];
        T_CHECK(dhsa_kv_index_carry(ix, &a, lay, 0.05, out) == DHSA_OK, "carry (mask %d): %s", m, dhsa_last_error());
        for (int64_t g = 0; g < Hkv; g++) {
            const int64_t *r;
            int64_t nr;
            double share[64];
            dhsa_layout_get(lay, 0, g, 0, &r, &nr);
            int reads = 0;
            for (int64_t i = 0; i < nr; i++) reads |= r[2 * i] <= planted && planted < r[2 * i + 1];
            ref_shares(q, k, Hkv, G, L, d, 1.0f / sqrtf((float)d), 0.0f, g, r, nr, starts, nc, m ? skip : NULL, share);
            char why[256] = "";
            T_CHECK(same_list(out + g * DHSA_CARRY_MAX, share, nc, 0.05, why, sizeof why), "mask %d group %lld: %s", m,
                    (long long)g, why);
            int has = 0;
            for (int i = 0; i < DHSA_CARRY_MAX; i++) has |= out[g * DHSA_CARRY_MAX + i] == pc;
            if (reads) T_CHECK(has == (m == 0), "mask %d group %lld: the planted chunk carried %d", m, (long long)g, has);
            seen += reads;
        }
    }
    T_CHECK(seen == 3 * Hkv, "every group's layout reads the planted key (%d of %d)", seen, (int)(3 * Hkv));
    a.key_mask = NULL;
    a.key_mask_polarity = DHSA_MASK_NO_POLARITY;
    int64_t out[2 * DHSA_CARRY_MAX];
    T_CHECK(dhsa_kv_index_carry(ix, &a, lay, 1.5, out) == DHSA_ERR_INVALID_ARG, "a share above 1 is refused");
    T_CHECK(dhsa_kv_index_carry(ix, &a, lay, NAN, out) == DHSA_ERR_INVALID_ARG, "a NaN share is refused");
    a.window = 64;
    T_CHECK(dhsa_kv_index_carry(ix, &a, lay, 0.1, out) == DHSA_ERR_UNSUPPORTED, "a window is refused");
    a.window = 0;
    a.q = dhsa_tensor_bhld(q, DHSA_F32, 1, Hkv, 3, d); /* three rows */
    T_CHECK(dhsa_kv_index_carry(ix, &a, lay, 0.1, out) == DHSA_ERR_SHAPE, "more than one row is refused: %s",
            dhsa_last_error());
    a.q = dhsa_tensor_bhld(q, DHSA_F32, 1, Hq, 1, d);
    a.k = dhsa_tensor_bhld(k, DHSA_F32, 1, Hkv, L - 1, d);
    T_CHECK(dhsa_kv_index_carry(ix, &a, lay, 0.1, out) == DHSA_ERR_SHAPE, "keys other than the index's are refused");
    T_CHECK(dhsa_kv_index_carry(NULL, &a, lay, 0.1, out) == DHSA_ERR_INVALID_ARG, "NULL index");
    dhsa_layout_free(lay);
done:
    dhsa_kv_index_free(ix);
    {
        dhsa_router_params sh = dhsa_router_params_for(L, 0.25);
        sh.share_heads = 1;
        dhsa_kv_index *ix2 = NULL;
        T_CHECK(dhsa_kv_index_create(ctx, &sh, Hkv, d, L, &ix2) == DHSA_OK, "share_heads index");
        if (ix2 && dhsa_kv_index_append(ix2, &kt) == DHSA_OK) {
            dhsa_layout *l2 = NULL;
            a.k = kt;
            if (dhsa_kv_index_route(ctx, ix2, &a, &l2) == DHSA_OK)
                T_CHECK(dhsa_kv_index_carry(ix2, &a, l2, 0.1, out) == DHSA_ERR_UNSUPPORTED, "share_heads is refused");
            dhsa_layout_free(l2);
        }
        dhsa_kv_index_free(ix2);
    }
    free(k);
    free(q);
    dhsa_ctx_free(ctx);
}

#define MODEL "models/dhsa-retrieval-8m.gguf"
#define N_P 200
#define N_STEP 8

static dhsa_session_params sparams(double carry) {
    dhsa_session_params sp = dhsa_session_default_params();
    sp.n_ctx = 256;
    sp.n_ubatch = 32;
    sp.kv_type = DHSA_F32;
    sp.attn = DHSA_ATTN_DHSA;
    sp.router.dense_below = 0;
    sp.router.budget_tokens = 48;
    sp.router.sink_tokens = 4;
    sp.router.local_tokens = 16;
    sp.router.q_block = 16;
    sp.router.min_chunk = 8;
    sp.router.nms_window = 4;
    sp.router.carry = carry;
    return sp;
}

/* prefill ids[0, N_P), then the steps ids[N_P + i] one at a time; out [N_STEP][V] */
static dhsa_status decode_steps(dhsa_session *s, const int32_t *ids, int64_t V, float *out) {
    dhsa_status st = dhsa_session_eval(s, ids, N_P, NULL);
    for (int i = 0; i < N_STEP && !st; i++) st = dhsa_session_eval(s, ids + N_P + i, 1, out + (size_t)i * (size_t)V);
    return st;
}

static void test_session(void) {
    FILE *f = fopen(MODEL, "rb");
    if (!f) {
        T_SKIP(4, MODEL " absent (run from the repository root)");
        return;
    }
    fclose(f);
    dhsa_ctx *ctx = NULL;
    dhsa_model *m = NULL;
    dhsa_ctx_create(NULL, &ctx);
    if (dhsa_model_load(MODEL, NULL, &m) != DHSA_OK) {
        T_CHECK(0, "load %s: %s", MODEL, dhsa_last_error());
        dhsa_ctx_free(ctx);
        return;
    }
    const int64_t V = dhsa_model_get_info(m)->n_vocab;
    int32_t ids[N_P + N_STEP + 1];
    for (int i = 0; i < N_P + N_STEP + 1; i++) ids[i] = (int32_t)(1 + (int64_t)(urand() * (double)(V - 1)));
    float *on = malloc((size_t)(N_STEP * V) * sizeof(float)), *off = malloc((size_t)(N_STEP * V) * sizeof(float));
    dhsa_session *a = NULL, *b = NULL;
    dhsa_session_params p1 = sparams(0.1), p0 = sparams(0.0);
    dhsa_status st = dhsa_session_create(ctx, m, &p1, &a);
    if (!st) st = dhsa_session_create(ctx, m, &p0, &b);
    if (!st) st = decode_steps(a, ids, V, on);
    if (!st) st = decode_steps(b, ids, V, off);
    T_CHECK(st == DHSA_OK, "sessions: %s", dhsa_last_error());
    int differ = 0;
    for (int i = 1; i < N_STEP; i++) differ |= memcmp(on + (size_t)i * (size_t)V, off + (size_t)i * (size_t)V, (size_t)V * sizeof(float)) != 0;
    T_CHECK(!st && differ, "carry 0.1 changes some decode step's logits against carry 0");
    T_CHECK(!st && memcmp(on, off, (size_t)V * sizeof(float)) == 0, "the first step after a prefill carries nothing");
    dhsa_session_free(a);
    dhsa_session_free(b);
    a = b = NULL;
    /* truncation to its own length, against a load of the same point */
    char dir[] = "/tmp/dhsa_test_carry_XXXXXX", path[300];
    if (!mkdtemp(dir)) {
        T_CHECK(0, "mkdtemp");
    } else {
        snprintf(path, sizeof path, "%s/state", dir);
        float *la = malloc((size_t)V * sizeof(float)), *lb = malloc((size_t)V * sizeof(float)),
              *lc = malloc((size_t)V * sizeof(float));
        dhsa_session *c = NULL;
        st = dhsa_session_create(ctx, m, &p1, &a);
        if (!st) st = dhsa_session_create(ctx, m, &p1, &b);
        if (!st) st = dhsa_session_create(ctx, m, &p1, &c);
        if (!st) st = decode_steps(a, ids, V, on);  /* a: prefill + N_STEP steps */
        if (!st) st = decode_steps(c, ids, V, off); /* c: the same, then a step without truncating */
        if (!st) st = dhsa_session_save(a, ids, N_P + N_STEP, NULL, path);
        int64_t n = 0;
        int32_t back[N_P + N_STEP];
        if (!st) st = dhsa_session_load(b, path, back, N_P + N_STEP, &n, NULL, NULL);
        if (!st) st = dhsa_session_truncate(a, dhsa_session_length(a));
        if (!st) st = dhsa_session_eval(a, ids + N_P + N_STEP, 1, la);
        if (!st) st = dhsa_session_eval(b, ids + N_P + N_STEP, 1, lb);
        if (!st) st = dhsa_session_eval(c, ids + N_P + N_STEP, 1, lc);
        T_CHECK(st == DHSA_OK, "truncate / save / load: %s", dhsa_last_error());
        T_CHECK(!st && memcmp(la, lb, (size_t)V * sizeof(float)) == 0,
                "after a truncation to its own length the step is the loaded session's, bit for bit");
        T_CHECK(!st && memcmp(la, lc, (size_t)V * sizeof(float)) != 0,
                "and not the untruncated session's (which carries: the check can fail)");
        dhsa_session_free(c);
        remove(path);
        rmdir(dir);
        free(la);
        free(lb);
        free(lc);
    }
    dhsa_session_free(a);
    dhsa_session_free(b);
    free(on);
    free(off);
    dhsa_model_free(m);
    dhsa_ctx_free(ctx);
}

static void test_param(void) {
    T_CHECK(dhsa_router_params_for(4096, 0.0625).carry == 0.1, "dhsa_router_params_for: carry 0.1");
    T_CHECK(dhsa_router_default_params().carry == 0.0, "dhsa_router_default_params: carry 0");
    dhsa_ctx *ctx = NULL;
    dhsa_ctx_create(NULL, &ctx);
    float q[4 * 8] = {0}, k[4 * 8] = {0};
    dhsa_attn_desc a = dhsa_attn_default_desc();
    a.q = dhsa_tensor_bhld(q, DHSA_F32, 1, 1, 4, 8);
    a.k = a.v = dhsa_tensor_bhld(k, DHSA_F32, 1, 1, 4, 8);
    const double bad[] = {-0.1, 1.5, NAN};
    for (int i = 0; i < 3; i++) {
        dhsa_router_params rp = dhsa_router_params_for(4, 0.5);
        rp.carry = bad[i];
        dhsa_layout *lay = NULL;
        dhsa_status st = dhsa_route(ctx, &rp, &a, &lay);
        T_CHECK(st == DHSA_ERR_INVALID_ARG && strstr(dhsa_last_error(), "carry"), "carry %g refused: %s", bad[i],
                dhsa_last_error());
        dhsa_layout_free(lay);
    }
    dhsa_ctx_free(ctx);
}

int main(void) {
    test_param();
    test_chunks();
    test_keep();
    test_public();
    test_session();
    return t_report("test_carry");
}
