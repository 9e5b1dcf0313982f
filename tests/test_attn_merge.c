/* test_attn_merge.c: dhsa_attn_merge (include/dhsa.h) against attention
 * over the union of the parts' keys computed in double.
 *
 * The keys of a causal self-attention (B = 2, Hq = 4 over Hkv = 2, L = Lk
 * = 37, d = 24, dv = 20) are dealt at random to n = 1, 2, 3, 5 parts; each
 * part is dhsa_attention with a key mask keeping its keys (o and lse as
 * [B, L, H, dv] row-major views, the layout context parallelism uses), and
 * the merge must match the double reference over all the kept keys within
 * |a - b| <= 2e-6 + 1e-5 |ref| per element (and the LSE likewise); key 0
 * is in no part, so row 0 has no key anywhere (o = 0, lse = -inf), and
 * causality leaves other rows without keys in some parts (lse = -inf
 * there). In place (o = part 0) and part by part (merge(merge(A, B), C))
 * must give the same bits as one call; NULL, no parts, another shape, F16
 * and a later part aliasing the output are refused with a sentence.
 * Run: make build/tests/test_attn_merge && build/tests/test_attn_merge
 */
#include "t.h"
#include "rng.h"

#include "dhsa.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { B = 2, HQ = 4, HKV = 2, L = 37, D = 24, DV = 20, MAXP = 5 };

static float q[B * L * HQ * D], k[B * HKV * L * D], v[B * HKV * L * DV];
static int part_of[L]; /* -1: in no part */

/* Double reference over every key with part_of >= 0: o [B][L][HQ][DV], lse [B][L][HQ]. */
static void reference(double *o, double *lse) {
    const double scale = 1.0 / sqrt((double)D);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < L; i++)
            for (int h = 0; h < HQ; h++) {
                const int g = h / (HQ / HKV);
                const float *qr = q + ((size_t)(b * L + i) * HQ + h) * D;
                double s[L], mx = -INFINITY;
                for (int j = 0; j <= i; j++) {
                    s[j] = -INFINITY;
                    if (part_of[j] < 0) continue;
                    const float *kr = k + ((size_t)(b * HKV + g) * L + j) * D;
                    double dot = 0;
                    for (int c = 0; c < D; c++) dot += (double)qr[c] * kr[c];
                    s[j] = dot * scale;
                    if (s[j] > mx) mx = s[j];
                }
                double *orow = o + ((size_t)(b * L + i) * HQ + h) * DV, sum = 0;
                for (int c = 0; c < DV; c++) orow[c] = 0;
                if (mx == -INFINITY) {
                    lse[(b * L + i) * HQ + h] = -INFINITY;
                    continue;
                }
                for (int j = 0; j <= i; j++) {
                    if (s[j] == -INFINITY) continue;
                    double w = exp(s[j] - mx);
                    sum += w;
                    const float *vr = v + ((size_t)(b * HKV + g) * L + j) * DV;
                    for (int c = 0; c < DV; c++) orow[c] += w * vr[c];
                }
                for (int c = 0; c < DV; c++) orow[c] /= sum;
                lse[(b * L + i) * HQ + h] = mx + log(sum);
            }
}

/* Part p's attention: o [B][L][HQ][DV], lse [B][L][HQ]. */
static dhsa_status part(dhsa_ctx *ctx, int p, float *o, float *lse) {
    static uint8_t mask[B * L];
    for (int b = 0; b < B; b++)
        for (int j = 0; j < L; j++) mask[b * L + j] = part_of[j] == p;
    dhsa_attn_desc a = dhsa_attn_default_desc();
    a.q = dhsa_tensor_blhd(q, DHSA_F32, B, L, HQ, D);
    a.k = dhsa_tensor_bhld(k, DHSA_F32, B, HKV, L, D);
    a.v = dhsa_tensor_bhld(v, DHSA_F32, B, HKV, L, DV);
    a.o = dhsa_tensor_blhd(o, DHSA_F32, B, L, HQ, DV);
    a.lse = dhsa_tensor_blhd(lse, DHSA_F32, B, L, HQ, 1);
    a.causal = 1;
    a.key_mask = mask;
    a.key_mask_batch_stride = L;
    a.key_mask_polarity = DHSA_MASK_TRUE_KEEPS;
    a.backend = DHSA_BACKEND_REFERENCE;
    return dhsa_attention(ctx, &a);
}

/* Worst |got - ref| / (2e-6 + 1e-5 |ref|) over o and lse (> 1 fails), and where. */
static double worst_err(const float *o, const float *lse, const double *ro, const double *rl, char *where, size_t cap) {
    double worst = 0;
    snprintf(where, cap, "nowhere");
    for (int x = 0; x < B * L * HQ; x++) {
        if (rl[x] == -INFINITY || lse[x] == -INFINITY) {
            int ok = rl[x] == lse[x];
            for (int c = 0; c < DV; c++) ok &= o[(size_t)x * DV + c] == 0.0f;
            if (!ok) {
                snprintf(where, cap, "row %d: lse %g against %g (no key)", x, (double)lse[x], rl[x]);
                return INFINITY;
            }
            continue;
        }
        double e = fabs(lse[x] - rl[x]) / (2e-6 + 1e-5 * fabs(rl[x]));
        if (!(e <= worst)) {
            worst = e;
            snprintf(where, cap, "lse of row x head %d: %.9g against %.9g", x, (double)lse[x], rl[x]);
        }
        for (int c = 0; c < DV; c++) {
            double r = ro[(size_t)x * DV + c], g = o[(size_t)x * DV + c];
            e = fabs(g - r) / (2e-6 + 1e-5 * fabs(r));
            if (!(e <= worst)) {
                worst = e;
                snprintf(where, cap, "o of row x head %d, channel %d: %.9g against %.9g", x, c, g, r);
            }
        }
    }
    return worst;
}

int main(void) {
    dhsa_ctx *ctx = NULL;
    if (dhsa_ctx_create(NULL, &ctx)) {
        T_CHECK(0, "dhsa_ctx_create: %s", dhsa_last_error());
        return t_report("test_attn_merge");
    }
    rng_t r = {36};
    for (size_t i = 0; i < sizeof q / sizeof *q; i++) q[i] = (float)rng_normal(&r);
    for (size_t i = 0; i < sizeof k / sizeof *k; i++) k[i] = (float)rng_normal(&r);
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) v[i] = (float)rng_normal(&r);
    static float po[MAXP][B * L * HQ * DV], pl[MAXP][B * L * HQ], mo[B * L * HQ * DV], ml[B * L * HQ];
    static double ro[B * L * HQ * DV], rl[B * L * HQ];
    const int counts[4] = {1, 2, 3, 5};
    for (int ci = 0; ci < 4; ci++) {
        const int n = counts[ci];
        for (int j = 0; j < L; j++) part_of[j] = j == 0 ? -1 : (int)(rng_u64(&r) % (uint64_t)n);
        reference(ro, rl);
        dhsa_tensor to[MAXP], tl[MAXP];
        dhsa_status st = DHSA_OK;
        for (int p = 0; p < n && !st; p++) {
            st = part(ctx, p, po[p], pl[p]);
            to[p] = dhsa_tensor_blhd(po[p], DHSA_F32, B, L, HQ, DV);
            tl[p] = dhsa_tensor_blhd(pl[p], DHSA_F32, B, L, HQ, 1);
        }
        T_CHECK(!st, "%d parts: dhsa_attention: %s", n, dhsa_last_error());
        dhsa_tensor oo = dhsa_tensor_blhd(mo, DHSA_F32, B, L, HQ, DV), ol = dhsa_tensor_blhd(ml, DHSA_F32, B, L, HQ, 1);
        st = dhsa_attn_merge(to, tl, n, &oo, &ol);
        char where[256];
        double w = st ? INFINITY : worst_err(mo, ml, ro, rl, where, sizeof where);
        T_CHECK(w <= 1.0, "%d parts: merge against the double reference: worst %.3g of the tolerance at %s (%s)", n, w,
                where, st ? dhsa_last_error() : "");
        int empty_rows = 0;
        for (int p = 0; p < n; p++)
            for (int x = 0; x < B * L * HQ; x++) empty_rows += pl[p][x] == -INFINITY;
        T_CHECK(empty_rows >= (n > 1 ? 2 * B * HQ : B * HQ), "%d parts: only %d part rows without keys", n, empty_rows);
        if (n < 3) continue;
        /* in place, and part by part: the same bits */
        static float io[MAXP][B * L * HQ * DV], il[MAXP][B * L * HQ];
        memcpy(io[0], po[0], sizeof io[0]);
        memcpy(il[0], pl[0], sizeof il[0]);
        dhsa_tensor io0 = dhsa_tensor_blhd(io[0], DHSA_F32, B, L, HQ, DV), il0 = dhsa_tensor_blhd(il[0], DHSA_F32, B, L, HQ, 1);
        dhsa_tensor so[MAXP], sl[MAXP];
        memcpy(so, to, sizeof so);
        memcpy(sl, tl, sizeof sl);
        so[0] = io0;
        sl[0] = il0;
        st = dhsa_attn_merge(so, sl, n, &io0, &il0);
        T_CHECK(!st && memcmp(io[0], mo, sizeof mo) == 0 && memcmp(il[0], ml, sizeof ml) == 0,
                "%d parts in place: not the bits of the merge into another buffer", n);
        memcpy(io[0], po[0], sizeof io[0]);
        memcpy(il[0], pl[0], sizeof il[0]);
        for (int p = 1; p < n && !st; p++) {
            dhsa_tensor two_o[2] = {io0, to[p]}, two_l[2] = {il0, tl[p]};
            st = dhsa_attn_merge(two_o, two_l, 2, &io0, &il0);
        }
        T_CHECK(!st && memcmp(io[0], mo, sizeof mo) == 0 && memcmp(il[0], ml, sizeof ml) == 0,
                "%d parts merged one at a time: not the bits of one call", n);
    }
    /* refusals, nothing written */
    dhsa_tensor to[2] = {dhsa_tensor_blhd(po[0], DHSA_F32, B, L, HQ, DV), dhsa_tensor_blhd(po[1], DHSA_F32, B, L, HQ, DV)};
    dhsa_tensor tl[2] = {dhsa_tensor_blhd(pl[0], DHSA_F32, B, L, HQ, 1), dhsa_tensor_blhd(pl[1], DHSA_F32, B, L, HQ, 1)};
    dhsa_tensor oo = dhsa_tensor_blhd(mo, DHSA_F32, B, L, HQ, DV), ol = dhsa_tensor_blhd(ml, DHSA_F32, B, L, HQ, 1);
    memset(mo, 0x7f, sizeof mo);
    T_CHECK(dhsa_attn_merge(NULL, tl, 2, &oo, &ol) == DHSA_ERR_INVALID_ARG, "a NULL part list is accepted");
    T_CHECK(dhsa_attn_merge(to, tl, 0, &oo, &ol) == DHSA_ERR_INVALID_ARG, "0 parts are accepted");
    dhsa_tensor bad = to[1];
    bad.shape[3] = DV - 1;
    dhsa_tensor bo[2] = {to[0], bad};
    T_CHECK(dhsa_attn_merge(bo, tl, 2, &oo, &ol) == DHSA_ERR_SHAPE && strstr(dhsa_last_error(), "o part 1"),
            "a part of another shape: %s", dhsa_last_error());
    bad = to[1];
    bad.type = DHSA_F16;
    bo[1] = bad;
    T_CHECK(dhsa_attn_merge(bo, tl, 2, &oo, &ol) == DHSA_ERR_INVALID_ARG && strstr(dhsa_last_error(), "F32"),
            "an F16 part: %s", dhsa_last_error());
    dhsa_tensor ao[2] = {oo, to[1]}, al[2] = {ol, tl[1]};
    ao[1] = oo;
    al[1] = ol;
    T_CHECK(dhsa_attn_merge(ao, al, 2, &oo, &ol) == DHSA_ERR_INVALID_ARG && strstr(dhsa_last_error(), "only part 0"),
            "a later part aliasing the output: %s", dhsa_last_error());
    int untouched = 1;
    for (size_t i = 0; i < sizeof mo; i++) untouched &= ((unsigned char *)mo)[i] == 0x7f;
    T_CHECK(untouched, "a refused merge wrote its output");
    dhsa_ctx_free(ctx);
    return t_report("test_attn_merge");
}
