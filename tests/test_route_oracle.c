/* test_route_oracle.c: the oracle method (recall upper bound, needles,
 * its chunk masses recomputed in double), fidelity (attention recall
 * against a brute-force double computation of the selected softmax mass)
 * and the synthetic workloads (include/dhsa.h "Synthetic workloads and
 * fidelity"; DESIGN.md sections 5-7). Harness: route_t.h. *
 * Run: make build/tests/test_route_oracle && build/tests/test_route_oracle
 * (or `make test`). Ends with "test_route_oracle: P passed, F failed, S skipped".
 */

#include "route_t.h"

/* ======================================================================== */
/* 5. The oracle method: recall upper bound and needles                     */

typedef struct {
    float *o, *lse;
    dhsa_tensor to, tl;
} outbuf;

static void outbuf_make(outbuf *ob, int64_t B, int64_t Hq, int64_t L, int64_t d) {
    ob->o = xcalloc((size_t)(B * Hq * L * d), sizeof(float));
    ob->lse = xcalloc((size_t)(B * Hq * L), sizeof(float));
    ob->to = dhsa_tensor_bhld(ob->o, DHSA_F32, B, Hq, L, d);
    ob->tl = dhsa_tensor_bhld(ob->lse, DHSA_F32, B, Hq, L, 1);
}

/* Attention of R (its own causal/window) with a layout (NULL = dense) into ob. */
static int attend(const rdata *R, const dhsa_layout *lay, outbuf *ob, dhsa_backend be) {
    dhsa_attn_desc a = R->a;
    a.v = dhsa_tensor_bhld(R->v, DHSA_F32, R->B, R->Hkv, R->Lk, R->d);
    a.o = ob->to;
    a.lse = ob->tl;
    a.layout = lay;
    a.backend = be;
    dhsa_status st = dhsa_attention(g_ctx, &a);
    T_CHECK(st == DHSA_OK, "attention (%s, %s): %s", lay ? "sparse" : "dense", dhsa_backend_name(be),
            dhsa_last_error());
    return st == DHSA_OK;
}

static double recall_of(const rdata *R, const dhsa_router_params *rp, const outbuf *dense, const char *what,
                        dhsa_layout **keep) {
    dhsa_layout *lay = route(g_ctx, rp, &R->a, what);
    double rec = -1;
    if (lay) {
        outbuf sp;
        outbuf_make(&sp, R->B, R->Hq, R->Lq, R->d);
        dhsa_fidelity f;
        if (attend(R, lay, &sp, DHSA_BACKEND_TILED) &&
            dhsa_fidelity_compare(&dense->to, &dense->tl, &sp.to, &sp.tl, &f) == DHSA_OK)
            rec = f.recall;
        free(sp.o), free(sp.lse);
    }
    if (keep) *keep = lay;
    else dhsa_layout_free(lay);
    return rec;
}

/* The oracle's ranking against masses computed here in double: with fixed
 * chunks (all one size) the oracle must select, for every query block,
 * chunks whose true attention mass (the block's rows and the group's
 * heads, causal and window applied) is at least that of every chunk it
 * left out. Chunks that meet the sinks or the local window, that a row of
 * the block cannot see whole, or that the budget cut are not compared.
 * Shapes: a block's columns (q_block x G) fewer than, equal to and more
 * than the 64 scored together, a last partial block, a window, and
 * chunked prefill (q_pos0 > 0). The same check on another block's masses
 * must fail somewhere, so the check can see a wrong oracle. */
static double oracle_mass(const rdata *R, int64_t g, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    int64_t d = R->d, G = R->Hq / R->Hkv;
    double scale = 1.0 / sqrt((double)d), mass = 0.0;
    double *s = xcalloc((size_t)R->Lk, sizeof(double));
    for (int64_t h = g * G; h < (g + 1) * G; h++)
        for (int64_t r = r0; r < r1; r++) {
            int64_t pos = R->a.q_pos0 + r, hi = pos + 1 < R->Lk ? pos + 1 : R->Lk;
            int64_t lo = R->a.window > 0 && pos - R->a.window + 1 > 0 ? pos - R->a.window + 1 : 0;
            double mx = -INFINITY, z = 0.0, in = 0.0;
            for (int64_t j = lo; j < hi; j++) {
                double v = 0.0;
                for (int64_t x = 0; x < d; x++)
                    v += (double)R->q[(h * R->Lq + r) * d + x] * (double)R->k[(g * R->Lk + j) * d + x];
                s[j] = v * scale;
                if (s[j] > mx) mx = s[j];
            }
            for (int64_t j = lo; j < hi; j++) {
                double e = exp(s[j] - mx);
                z += e;
                if (j >= c0 && j < c1) in += e;
            }
            if (z > 0) mass += in / z;
        }
    free(s);
    return mass;
}

static void test_oracle_masses(void) {
    struct {
        const char *what;
        int64_t Hq, Hkv, Lq, Lk, q_pos0, window, q_block;
    } cs[] = {
        {"G 2, q_block 16 (32 columns: two blocks a tile), L 1000", 4, 2, 1000, 1000, 0, 0, 16},
        {"G 8, q_block 16 (128 columns: two tiles a block), window 300", 8, 1, 700, 700, 0, 300, 16},
        {"G 1, q_block 5 (12 blocks and a part a tile), chunked prefill 300 of 900", 4, 4, 300, 900, 600, 0, 5},
        {"G 4, q_block 16 (64 columns), L 777", 8, 2, 777, 777, 0, 0, 16},
    };
    int64_t wrong_seen = 0;
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
        rdata R;
        rdata_random(&R, 1, cs[ci].Hq, cs[ci].Hkv, cs[ci].Lq, cs[ci].Lk, 32, 40 + ci);
        for (int64_t x = 0; x < R.Hq * R.Lq * R.d; x++) R.q[x] *= 0.6f; /* peaked, not flat */
        R.a = dhsa_attn_default_desc();
        R.a.q = dhsa_tensor_bhld(R.q, DHSA_F32, 1, R.Hq, R.Lq, R.d);
        R.a.k = dhsa_tensor_bhld(R.k, DHSA_F32, 1, R.Hkv, R.Lk, R.d);
        R.a.causal = 1, R.a.q_pos0 = cs[ci].q_pos0, R.a.window = cs[ci].window;
        dhsa_router_params rp = rparams(DHSA_ROUTE_ORACLE, DHSA_BOUNDARY_FIXED, 128, 0);
        rp.chunk = 16, rp.sink_tokens = 16, rp.local_tokens = 32, rp.q_block = cs[ci].q_block;
        dhsa_layout *lay = route(g_ctx, &rp, &R.a, cs[ci].what);
        if (!lay) {
            rdata_free(&R);
            continue;
        }
        int64_t compared = 0, bad = 0, wrong = 0, nqb = (R.Lq + rp.q_block - 1) / rp.q_block;
        for (int64_t g = 0; g < R.Hkv; g++)
            for (int64_t qb = 1; qb < nqb; qb++) {
                int64_t r0 = qb * rp.q_block, r1 = r0 + rp.q_block < R.Lq ? r0 + rp.q_block : R.Lq;
                int64_t first = R.a.q_pos0 + r0, last = R.a.q_pos0 + r1 - 1;
                int64_t vis_lo = R.a.window > 0 && last - R.a.window + 1 > 0 ? last - R.a.window + 1 : 0;
                double min_in = INFINITY, max_out = -INFINITY, wmin_in = INFINITY, wmax_out = -INFINITY;
                int n_in = 0, n_out = 0;
                for (int64_t c0 = 0; c0 + 16 <= first + 1; c0 += 16) {
                    /* whole for every row, away from the sinks and the local keys */
                    if (c0 < rp.sink_tokens || c0 < vis_lo || c0 + 16 > first + 1 - rp.local_tokens) continue;
                    int sel = 0;
                    for (int64_t j = c0; j < c0 + 16; j++) sel += dhsa_layout_selects(lay, 0, g, r0, j) == 1;
                    if (sel != 0 && sel != 16) continue;
                    double ms = oracle_mass(&R, g, r0, r1, c0, c0 + 16);
                    double mw = oracle_mass(&R, g, r0 - rp.q_block, r0, c0, c0 + 16); /* the block before */
                    if (sel == 16) {
                        min_in = ms < min_in ? ms : min_in, wmin_in = mw < wmin_in ? mw : wmin_in, n_in++;
                    } else {
                        max_out = ms > max_out ? ms : max_out, wmax_out = mw > wmax_out ? mw : wmax_out, n_out++;
                    }
                }
                if (n_in == 0 || n_out == 0) continue;
                compared++;
                if (max_out > min_in * (1 + 1e-4) + 1e-9) {
                    if (bad++ < 3)
                        T_CHECK(0, "oracle (%s): KV head %lld block %lld left out a chunk of mass %.6g above a "
                                "selected one's %.6g", cs[ci].what, (long long)g, (long long)qb, max_out, min_in);
                }
                wrong += wmax_out > wmin_in * (1 + 1e-4) + 1e-9;
            }
        T_CHECK(bad == 0, "oracle (%s): %lld of %lld blocks out of mass order", cs[ci].what, (long long)bad,
                (long long)compared);
        T_CHECK(compared >= nqb / 2, "oracle (%s): only %lld of %lld blocks could be compared", cs[ci].what,
                (long long)compared, (long long)nqb);
        wrong_seen += wrong;
        dhsa_layout_free(lay);
        rdata_free(&R);
    }
    T_CHECK(wrong_seen > 0, "the mass-order check passes the previous block's masses too: it cannot see a wrong oracle");
}

static void test_oracle(void) {
    dhsa_synth_params sp = dhsa_synth_default_params();
    sp.B = 1, sp.Hq = 4, sp.Hkv = 2, sp.L = 2048, sp.d = 64, sp.seed = 3;
    dhsa_synth_needle nd[DHSA_SYNTH_MAX_NEEDLES];
    rdata S;
    if (!rdata_synth(&S, &sp, nd)) return;
    S.a.causal = 1;
    outbuf dense;
    outbuf_make(&dense, S.B, S.Hq, S.Lq, S.d);
    if (attend(&S, NULL, &dense, DHSA_BACKEND_TILED)) {
        /* Recalls compared at the same budget (512 of 2048 keys, sinks 64,
         * local 128). The oracle ranks the same chunks by their true mass,
         * so it must do at least as well; the slack 1e-6 covers only float
         * rounding of the LSEs the recalls come from (exp(lse_s - lse_d)
         * with |lse| < ~40: a few ulp, ~1e-6 relative at worst per row,
         * averaging far below that). */
        dhsa_router_params rp = rparams(DHSA_ROUTE_DHSA, DHSA_BOUNDARY_SIMILARITY, 512, 0);
        rp.dense_below = 0, rp.local_tokens = 128;
        double dhsa_sim = recall_of(&S, &rp, &dense, "dhsa/similarity", NULL);
        rp.boundary = DHSA_BOUNDARY_FIXED;
        double block = recall_of(&S, &rp, &dense, "block (fixed 64)", NULL);
        rp.method = DHSA_ROUTE_ORACLE;
        double oracle_fixed = recall_of(&S, &rp, &dense, "oracle/fixed", NULL);
        rp.boundary = DHSA_BOUNDARY_SIMILARITY;
        double oracle_sim = recall_of(&S, &rp, &dense, "oracle/similarity", NULL);
        rp.method = DHSA_ROUTE_STREAM;
        double stream = recall_of(&S, &rp, &dense, "stream", NULL);
        printf("test_route: L=2048 budget 512 recall: dhsa %.4f, block %.4f, stream %.4f, oracle/similarity %.4f, "
               "oracle/fixed %.4f\n", dhsa_sim, block, stream, oracle_sim, oracle_fixed);
        T_CHECK(dhsa_sim > 0 && block > 0 && stream > 0 && oracle_sim > 0 && oracle_fixed > 0,
                "a recall could not be computed");
        T_CHECK(oracle_sim >= dhsa_sim - 1e-6, "oracle/similarity recall %.6f below DHSA's %.6f at the same budget",
                oracle_sim, dhsa_sim);
        T_CHECK(oracle_sim >= block - 1e-6, "oracle/similarity recall %.6f below block's %.6f at the same budget",
                oracle_sim, block);
        T_CHECK(oracle_fixed >= block - 1e-6, "oracle/fixed recall %.6f below block's %.6f (same chunks)",
                oracle_fixed, block);
        T_CHECK(oracle_sim >= stream - 1e-6 && oracle_fixed >= stream - 1e-6,
                "oracle recall (%.6f, %.6f) below streaming's %.6f", oracle_sim, oracle_fixed, stream);
        T_CHECK(oracle_sim < 1.0 && dhsa_sim < oracle_sim + 0.5, "recalls are degenerate (oracle %.6f)", oracle_sim);

        /* needles: a generous budget (1024) makes the oracle select every
         * key of every needle passage for the block that asks for it, for
         * every KV head */
        rp.method = DHSA_ROUTE_ORACLE, rp.budget_tokens = 1024;
        dhsa_layout *lay = NULL;
        recall_of(&S, &rp, &dense, "oracle, needles", &lay);
        if (lay) {
            for (int i = 0; i < sp.n_needles; i++)
                for (int64_t g = 0; g < S.Hkv; g++) {
                    int64_t missed = 0;
                    for (int64_t j = nd[i].key; j < nd[i].key + nd[i].len; j++)
                        missed += dhsa_layout_selects(lay, 0, g, nd[i].row, j) != 1;
                    T_CHECK(nd[i].len > 0 && missed == 0,
                            "oracle (budget 1024) misses %lld of the %lld keys of needle %d (passage at %lld) for "
                            "row %lld, KV head %lld", (long long)missed, (long long)nd[i].len, i,
                            (long long)nd[i].key, (long long)nd[i].row, (long long)g);
                }
            dhsa_layout_free(lay);
        }
        /* the needle check can fail: a streaming layout of 256 recent keys
         * misses the early needles */
        rp.method = DHSA_ROUTE_STREAM, rp.budget_tokens = 256;
        lay = route(g_ctx, &rp, &S.a, "stream, needles");
        if (lay) {
            int missed = 0;
            for (int i = 0; i < sp.n_needles; i++)
                for (int64_t j = nd[i].key; j < nd[i].key + nd[i].len; j++)
                    missed += dhsa_layout_selects(lay, 0, 0, nd[i].row, j) != 1;
            T_CHECK(missed > 0, "a 256-key streaming layout selects every needle: the needle check cannot fail");
            dhsa_layout_free(lay);
        }
    }
    free(dense.o), free(dense.lse);
    rdata_free(&S);
}

/* ======================================================================== */
/* 6. Fidelity                                                              */

static void test_fidelity(void) {
    sinst I;
    s_init(&I, &(scase){.tag = "fidelity-half", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 300, .Lk = 300, .d = 64,
                        .q_block = 64, .causal = 1, .sel = SEL_HALF, .seed = 61});
    if (!I.lay) { s_free(&I); return; }
    const scase *s = &I.s;
    const int64_t rows = s->B * s->Hq * s->Lq;
    outbuf dn, sp;
    outbuf_make(&dn, s->B, s->Hq, s->Lq, s->d);
    outbuf_make(&sp, s->B, s->Hq, s->Lq, s->d);
    dhsa_attn_desc a = I.a;
    a.o = dn.to, a.lse = dn.tl, a.layout = NULL;
    dhsa_status st = dhsa_attention(g_ctx, &a);
    a.o = sp.to, a.lse = sp.tl, a.layout = I.lay;
    st |= dhsa_attention(g_ctx, &a);
    T_CHECK(st == DHSA_OK, "fidelity: attention failed: %s", dhsa_last_error());
    dhsa_fidelity f;
    memset(&f, 0xFF, sizeof f);
    /* identical inputs: recall exactly 1 (exp(0)), rel_err exactly 0 */
    T_CHECK(dhsa_fidelity_compare(&dn.to, &dn.tl, &dn.to, &dn.tl, &f) == DHSA_OK && f.recall == 1.0 &&
                f.recall_min == 1.0 && f.rel_err == 0.0 && f.rows == rows,
            "fidelity of a result with itself: recall %.17g min %.17g rel_err %g rows %lld (want 1, 1, 0, %lld)",
            f.recall, f.recall_min, f.rel_err, (long long)f.rows, (long long)rows);
    /* half the keys: recall against the selected softmax mass in double.
     * Tolerance 1e-5: the recall comes from exp(lse_sparse - lse_dense) of
     * two TILED LSEs, each within ~1e-6 of exact here (scores |s| < ~8, lse
     * < ~10: a few fp32 ulp); the mean over 2400 rows stays well inside. */
    double mass_sum = 0, mass_min = 1, num = 0, den = 0;
    int64_t counted = 0;
    const int64_t G = s->Hq / s->Hkv;
    double *sc = xcalloc((size_t)s->Lk, sizeof(double));
    for (int64_t b = 0; b < s->B; b++)
        for (int64_t h = 0; h < s->Hq; h++)
            for (int64_t i = 0; i < s->Lq; i++) {
                int64_t lo, hi, x = (b * s->Hq + h) * s->Lq + i;
                key_span(s->Lk, 1, 0, i, &lo, &hi);
                const uint8_t *bits = I.sel + ((b * s->Hkv + h / G) * I.nqb + i / s->q_block) * s->Lk;
                double m = -INFINITY, tot = 0, sel = 0;
                for (int64_t j = lo; j < hi; j++) {
                    double dot = 0;
                    for (int64_t c = 0; c < s->d; c++)
                        dot += I.cq[x * s->d + c] * I.ck[((b * s->Hkv + h / G) * s->Lk + j) * s->d + c];
                    sc[j] = dot / sqrt((double)s->d);
                    if (sc[j] > m) m = sc[j];
                }
                for (int64_t j = lo; j < hi; j++) {
                    double p = exp(sc[j] - m);
                    tot += p;
                    if (bits[j]) sel += p;
                }
                mass_sum += sel / tot;
                if (sel / tot < mass_min) mass_min = sel / tot;
                counted++;
                for (int64_t c = 0; c < s->d; c++) {
                    double dd = dn.o[x * s->d + c], ss = sp.o[x * s->d + c];
                    num += (dd - ss) * (dd - ss), den += dd * dd;
                }
            }
    free(sc);
    double bf = mass_sum / (double)counted;
    st = dhsa_fidelity_compare(&dn.to, &dn.tl, &sp.to, &sp.tl, &f);
    T_CHECK(st == DHSA_OK, "fidelity_compare: %s", dhsa_last_error());
    T_CHECK(fabs(f.recall - bf) <= 1e-5, "half-key layout: recall %.9f, brute-force selected mass %.9f (|diff| %.2e)",
            f.recall, bf, fabs(f.recall - bf));
    T_CHECK(fabs(f.recall_min - mass_min) <= 1e-5, "half-key layout: recall_min %.9f, brute force %.9f", f.recall_min,
            mass_min);
    T_CHECK(f.rows == counted, "fidelity rows %lld, want %lld", (long long)f.rows, (long long)counted);
    /* rel_err: both sides sum the same float values in double; only the order may differ */
    double rel = sqrt(num / den);
    T_CHECK(fabs(f.rel_err - rel) <= 1e-9 * rel, "rel_err %.12g, brute force %.12g", f.rel_err, rel);
    T_CHECK(bf > 0.2 && bf < 0.9, "half-key layout keeps %.3f of the mass: not a meaningful test", bf);
    /* the recall check can fail: against the mass of the complement */
    T_CHECK(fabs(f.recall - (1 - bf)) > 1e-3, "recall also matches the complement's mass");
    /* errors */
    dhsa_tensor bad = sp.to;
    bad.shape[2] = s->Lq - 1;
    plant_error();
    T_CHECK(dhsa_fidelity_compare(&dn.to, &dn.tl, &bad, &sp.tl, &f) == DHSA_ERR_SHAPE && fresh_error(),
            "fidelity_compare with a shorter sparse o: not SHAPE");
    plant_error();
    T_CHECK(dhsa_fidelity_compare(&dn.to, &dn.tl, &sp.to, NULL, &f) < 0 && fresh_error(),
            "fidelity_compare with lse NULL succeeded");
    bad = sp.to;
    bad.type = DHSA_F16;
    plant_error();
    T_CHECK(dhsa_fidelity_compare(&dn.to, &dn.tl, &bad, &sp.tl, &f) < 0 && fresh_error(),
            "fidelity_compare with an F16 view succeeded");
    free(dn.o), free(dn.lse), free(sp.o), free(sp.lse);
    s_free(&I);
}

/* ======================================================================== */
/* 8. Synthetic workloads                                                   */

static void test_synth(void) {
    dhsa_synth_params sp = dhsa_synth_default_params();
    sp.B = 2, sp.Hq = 4, sp.Hkv = 2, sp.L = 2000, sp.d = 32, sp.seed = 17;
    const size_t nq = (size_t)(sp.B * sp.Hq * sp.L * sp.d), nk = (size_t)(sp.B * sp.Hkv * sp.L * sp.d);
    float *q1 = xcalloc(nq, 4), *k1 = xcalloc(nk, 4), *v1 = xcalloc(nk, 4);
    float *q2 = xcalloc(nq, 4), *k2 = xcalloc(nk, 4), *v2 = xcalloc(nk, 4);
    dhsa_synth_needle n1[DHSA_SYNTH_MAX_NEEDLES], n2[DHSA_SYNTH_MAX_NEEDLES];
    memset(n1, 0, sizeof n1), memset(n2, 0, sizeof n2);
    dhsa_status st = dhsa_synth_generate(&sp, q1, k1, v1, n1);
    T_CHECK(st == DHSA_OK, "synth_generate: %s", dhsa_last_error());
    st = dhsa_synth_generate(&sp, q2, k2, v2, n2);
    T_CHECK(st == DHSA_OK && !memcmp(q1, q2, nq * 4) && !memcmp(k1, k2, nk * 4) && !memcmp(v1, v2, nk * 4) &&
                !memcmp(n1, n2, sizeof n1),
            "synth_generate is not deterministic for a seed");
    int finite = 1;
    for (size_t x = 0; x < nq; x++) finite &= isfinite(q1[x]) != 0;
    for (size_t x = 0; x < nk; x++) finite &= isfinite(k1[x]) && isfinite(v1[x]);
    T_CHECK(finite, "synth_generate wrote a non-finite value");
    sp.seed = 18;
    st = dhsa_synth_generate(&sp, q2, k2, v2, n2);
    T_CHECK(st == DHSA_OK && memcmp(q1, q2, nq * 4) && memcmp(k1, k2, nk * 4) && memcmp(v1, v2, nk * 4),
            "synth_generate gives the same data for seeds 17 and 18");
    /* needles: the passage [key, key + len) within [0, L), at depth x L;
     * asked for by query block (last - i), rows [row, row + rows); the
     * question comes after the passage (DESIGN.md 7: "a key that a later
     * query matches strongly"; the header: "a fact far back") */
    const int64_t nqb = (sp.L + sp.q_block - 1) / sp.q_block;
    for (int i = 0; i < sp.n_needles; i++) {
        const dhsa_synth_needle *x = &n1[i];
        int rank = 0; /* the deepest needle is asked by the last block (dhsa.h) */
        for (int o = 0; o < sp.n_needles; o++)
            rank += sp.depths[o] > sp.depths[i] || (sp.depths[o] == sp.depths[i] && o < i);
        int64_t r0 = (nqb - 1 - rank) * sp.q_block, r1 = r0 + sp.q_block < sp.L ? r0 + sp.q_block : sp.L;
        T_CHECK(x->key == (int64_t)(sp.depths[i] * (double)sp.L) && x->len == sp.needle_len && x->key >= 0 &&
                    x->key + x->len <= sp.L,
                "needle %d: passage [%lld, +%lld), want [%lld, +%lld) inside L=%lld", i, (long long)x->key,
                (long long)x->len, (long long)(int64_t)(sp.depths[i] * (double)sp.L), (long long)sp.needle_len,
                (long long)sp.L);
        T_CHECK(x->row == r0 && x->rows == r1 - r0, "needle %d: asked by rows [%lld, +%lld), want block %lld = [%lld, +%lld)",
                i, (long long)x->row, (long long)x->rows, (long long)(nqb - 1 - rank), (long long)r0, (long long)(r1 - r0));
        T_CHECK(x->row >= x->key + x->len, "needle %d: its question rows start at %lld, before the passage ends at %lld",
                i, (long long)x->row, (long long)(x->key + x->len));
    }
    /* a deep needle (depth 0.99, L = 1000): its question (block last - 1 =
     * rows 896..959) would come before the passage, which no causal query
     * could read: refused with a sentence naming the depth */
    sp.seed = 17, sp.L = 1000, sp.n_needles = 2, sp.depths[0] = 0.5, sp.depths[1] = 0.99;
    st = dhsa_synth_generate(&sp, q2, k2, v2, n2);
    T_CHECK(st == DHSA_ERR_INVALID_ARG && strstr(dhsa_last_error(), "0.99"),
            "synth_generate with an unreadable needle: %s, %s", dhsa_status_str(st), dhsa_last_error());
    sp.depths[1] = 0.8; /* [800, 816) is before rows 896..: accepted */
    st = dhsa_synth_generate(&sp, q2, k2, v2, n2);
    T_CHECK(st == DHSA_OK, "synth_generate with needles at 0.5, 0.8, L=1000: %s", dhsa_last_error());
    for (int i = 0; st == DHSA_OK && i < 2; i++)
        T_CHECK(n2[i].row >= n2[i].key + n2[i].len, "needle %d: question rows from %lld, passage ends at %lld", i,
                (long long)n2[i].row, (long long)(n2[i].key + n2[i].len));
    /* bad parameters: an error with a sentence */
    const dhsa_synth_params good = sp;
    struct {
        const char *what;
        dhsa_synth_params p;
    } bad[16];
    int n = 0;
#define SBAD(desc, set)                                  \
    do {                                                 \
        bad[n].what = desc;                              \
        bad[n].p = good;                                 \
        { dhsa_synth_params *p_ = &bad[n].p; set; }      \
        n++;                                             \
    } while (0)
    SBAD("B 0", p_->B = 0);
    SBAD("Hq 3 over Hkv 2", p_->Hq = 3);
    SBAD("Hkv 0", p_->Hkv = 0);
    SBAD("L 0", p_->L = 0);
    SBAD("d 0", p_->d = 0);
    SBAD("seg_min 0", p_->seg_min = 0);
    SBAD("seg_max < seg_min", (p_->seg_min = 50, p_->seg_max = 40));
    SBAD("n_needles -1", p_->n_needles = -1);
    SBAD("n_needles 65", p_->n_needles = DHSA_SYNTH_MAX_NEEDLES + 1);
    SBAD("q_block 0", p_->q_block = 0);
    SBAD("depth 1.0", p_->depths[1] = 1.0);
    SBAD("depth -0.1", p_->depths[0] = -0.1);
    SBAD("depth NaN", p_->depths[0] = NAN);
    SBAD("needle_len 0", p_->needle_len = 0);
    SBAD("2 needles with 1 query block", (p_->L = 60, p_->q_block = 64));
#undef SBAD
    for (int c = 0; c < n; c++) {
        plant_error();
        st = dhsa_synth_generate(&bad[c].p, q2, k2, v2, n2);
        T_CHECK(st < 0 && fresh_error(), "synth_generate with %s: %s, sentence \"%s\"", bad[c].what,
                dhsa_status_str(st), dhsa_last_error());
    }
    plant_error();
    T_CHECK(dhsa_synth_generate(&good, NULL, k2, v2, n2) < 0 && fresh_error(), "synth_generate(q NULL) succeeded");
    plant_error();
    T_CHECK(dhsa_synth_generate(&good, q2, k2, v2, NULL) < 0 && fresh_error(),
            "synth_generate(needles NULL, 2 needles) succeeded");
    T_CHECK(dhsa_synth_generate(NULL, q2, k2, v2, n2) < 0, "synth_generate(params NULL) succeeded");
    free(q1), free(k1), free(v1), free(q2), free(k2), free(v2);
}

int main(void) {
    if (!open_ctx("test_route_oracle")) return t_report("test_route_oracle");
    test_oracle();
    test_oracle_masses();
    test_fidelity();
    test_synth();
    dhsa_ctx_free(g_ctx);
    return t_report("test_route_oracle");
}
