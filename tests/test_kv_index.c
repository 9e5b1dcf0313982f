/* test_kv_index.c: the decode-time index, parts 1 and 3 of kv_index_t.h:
 * incremental equals whole (one call, one key at a time, random
 * ubatches, routing per ubatch, decode steps against a whole prefill
 * routed with q_block = 1), for every boundary kind and chunk score; and
 * the routing rules re-derived from the header and DESIGN.md 5-6 under
 * several parameter sets.
 *
 * Run: make build/tests/test_kv_index && build/tests/test_kv_index
 * (or `make test`). Ends with "test_kv_index: P passed, F failed, S skipped".
 */

#include "kv_index_t.h"

static dhsa_chunk_score g_score = DHSA_SCORE_MOMENTS; /* test_incremental's chunk score */

/* ------------------------------------------------------------------------ */
/* 1. Incremental equals whole */

static void test_incremental(int64_t L, int64_t Hq, int64_t Hkv, int64_t d, dhsa_boundary bd, double density,
                             int64_t budget, uint64_t seed) {
    char label[200];
    snprintf(label, sizeof label, "incremental L=%lld Hq=%lld Hkv=%lld d=%lld %s density %g budget %lld%s",
             (long long)L, (long long)Hq, (long long)Hkv, (long long)d,
             bd == DHSA_BOUNDARY_FIXED ? "fixed" : bd == DHSA_BOUNDARY_LEARNED ? "learned" : "similarity", density,
             (long long)budget, g_score == DHSA_SCORE_POOLED ? " pooled score" : "");
    work W;
    if (!work_synth(&W, L, Hq, Hkv, d, seed)) return;
    dhsa_router_params rp = dhsa_router_default_params();
    rp.score_mode = g_score;
    rp.boundary = bd;
    rp.density = density;
    rp.budget_tokens = budget;
    dhsa_predictor *pred = NULL; /* LEARNED: a random predictor, a threshold some candidates reach */
    if (bd == DHSA_BOUNDARY_LEARNED) {
        float *p = xcalloc((size_t)L, sizeof(float));
        dhsa_tensor kt = dhsa_tensor_bhld(W.k, DHSA_F32, 1, Hkv, L, d);
        T_CHECK(dhsa_predictor_create_random(Hkv * d, 4, 32, seed, &pred) == DHSA_OK &&
                    dhsa_predictor_score(g_ctx, pred, &kt, 0, p) == DHSA_OK,
                "%s: predictor: %s", label, dhsa_last_error());
        rp.predictor = pred;
        rp.learned_threshold = quantile(p, L, 0.75);
        free(p);
    }
    const int64_t qbk = rp.q_block, n_qb = (L + qbk - 1) / qbk;
    rng_t rng = {seed * 77 + 5};

    dhsa_kv_index *one = ix_new(g_ctx, &rp, Hkv, d, L, label);
    dhsa_kv_index *each = ix_new(g_ctx, &rp, Hkv, d, L, label);
    dhsa_kv_index *rnd = ix_new(g_ctx, &rp, Hkv, d, L, label);
    if (!one || !each || !rnd) goto out0;
    dhsa_status st = ix_append(one, &W, 0, L);
    T_CHECK(st == DHSA_OK, "%s: append all: %s", label, dhsa_last_error());
    chunk_info ci; /* what `each` knew after every key */
    T_CHECK(ci_append(&ci, each, &W), "%s: one-key appends failed", label);
    int64_t bad = 0;
    for (int64_t u0 = 0; u0 < L;) {
        int64_t n = 1 + rng_range(&rng, 700);
        if (n > L - u0) n = L - u0;
        bad += ix_append(rnd, &W, u0, n) != DHSA_OK;
        u0 += n;
    }
    T_CHECK(bad == 0, "%s: %lld random-ubatch appends failed: %s", label, (long long)bad, dhsa_last_error());
    T_CHECK(dhsa_kv_index_length(one) == L && dhsa_kv_index_length(each) == L && dhsa_kv_index_length(rnd) == L,
            "%s: lengths %lld %lld %lld, want %lld", label, (long long)dhsa_kv_index_length(one),
            (long long)dhsa_kv_index_length(each), (long long)dhsa_kv_index_length(rnd), (long long)L);

    const int64_t *s1;
    int64_t nc = dhsa_kv_index_chunks(one, &s1);
    int mono = nc >= 1 && s1[0] == 0;
    for (int64_t c = 1; c < nc; c++) mono &= s1[c] > s1[c - 1] && s1[c] < L;
    T_CHECK(mono, "%s: %lld chunk starts, want starts[0] = 0 and increasing in [0, L)", label, (long long)nc);
    T_CHECK(same_starts(one, each), "%s: one call and one key at a time give different chunk starts (%lld vs %lld)",
            label, (long long)nc, (long long)dhsa_kv_index_chunks(each, NULL));
    T_CHECK(same_starts(one, rnd), "%s: one call and random ubatches give different chunk starts (%lld vs %lld)",
            label, (long long)nc, (long long)dhsa_kv_index_chunks(rnd, NULL));

    /* the whole prefill routed through each index */
    dhsa_layout *lw = ix_route(g_ctx, one, &W, 0, L, L, 0, label);
    dhsa_layout *le = ix_route(g_ctx, each, &W, 0, L, L, 0, label);
    dhsa_layout *lr = ix_route(g_ctx, rnd, &W, 0, L, L, 0, label);
    if (lw && le && lr) {
        T_CHECK(blocks_differ(lw, 0, le, 0, n_qb, Hkv, "one call vs one key at a time", 1) == 0,
                "%s: whole-prefill layouts of one call and one key at a time differ", label);
        T_CHECK(blocks_differ(lw, 0, lr, 0, n_qb, Hkv, "one call vs random ubatches", 1) == 0,
                "%s: whole-prefill layouts of one call and random ubatches differ", label);
        rules R;
        memset(&R, 0, sizeof R);
        check_rules(&R, lw, &rp, Hkv, L, L, 0, 0, &ci);
        report_rules(&R, label, 0);
        /* chunks were chosen, so the comparisons saw more than sinks and local */
        T_CHECK(R.with_chunks * 8 >= R.blocks, "%s: only %lld of %lld blocks selected chunks", label,
                (long long)R.with_chunks, (long long)R.blocks);
        dhsa_layout_stats ls;
        dhsa_layout_get_stats(lw, &ls);
        T_CHECK(ls.chunks == nc && ls.q_pos0 == 0 && ls.causal == 1 && ls.Lq == L && ls.Lk == L,
                "%s: stats chunks %lld (index %lld), q_pos0 %lld, causal %d, Lq %lld, Lk %lld", label,
                (long long)ls.chunks, (long long)nc, (long long)ls.q_pos0, ls.causal, (long long)ls.Lq,
                (long long)ls.Lk);
        T_CHECK(ls.dense_blocks < ls.n_blocks * Hkv, "%s: every block is dense (%lld): nothing sparse was compared",
                label, (long long)ls.dense_blocks);
    }

    /* ubatch routing: append a ubatch (a multiple of q_block rows, the last
     * one whatever is left), route its rows at once, compare with the blocks
     * of the whole prefill */
    dhsa_kv_index *ub = ix_new(g_ctx, &rp, Hkv, d, L, label);
    if (ub && lw) {
        int64_t differ = 0, routed = 0, stat_bad = 0;
        for (int64_t u0 = 0; u0 < L;) {
            int64_t n = (1 + rng_range(&rng, 16)) * qbk;
            if (n > L - u0) n = L - u0;
            if (ix_append(ub, &W, u0, n) != DHSA_OK) {
                T_CHECK(0, "%s: ubatch append at %lld: %s", label, (long long)u0, dhsa_last_error());
                break;
            }
            dhsa_layout *lu = ix_route(g_ctx, ub, &W, u0, n, u0 + n, 0, label);
            if (!lu) break;
            char what[300];
            snprintf(what, sizeof what, "%s: ubatch [%lld, %lld) vs whole", label, (long long)u0, (long long)(u0 + n));
            int64_t nb = (n + qbk - 1) / qbk;
            differ += blocks_differ(lu, 0, lw, u0 / qbk, nb, Hkv, what, differ == 0);
            routed += nb * Hkv;
            dhsa_layout_stats ls;
            dhsa_layout_get_stats(lu, &ls);
            stat_bad += ls.q_pos0 != u0 || ls.Lq != n || ls.Lk != u0 + n || ls.n_blocks != nb || ls.causal != 1;
            dhsa_layout_free(lu);
            u0 += n;
        }
        T_CHECK(differ == 0 && routed == n_qb * Hkv,
                "%s: routing each ubatch after appending it: %lld of %lld blocks differ from the whole prefill", label,
                (long long)differ, (long long)routed);
        T_CHECK(stat_bad == 0, "%s: %lld ubatch layouts record wrong q_pos0/Lq/Lk/n_blocks/causal", label,
                (long long)stat_bad);
        T_CHECK(same_starts(one, ub), "%s: ubatch routing index has different chunk starts", label);
    }

    /* the comparator can fail: a routing with twice the density differs */
    if (lw) {
        dhsa_router_params rp2 = rp;
        rp2.density = 2 * rp.density;
        rp2.budget_tokens = 2 * rp.budget_tokens;
        dhsa_kv_index *other = ix_new(g_ctx, &rp2, Hkv, d, L, label);
        if (other && ix_append(other, &W, 0, L) == DHSA_OK) {
            dhsa_layout *lo = ix_route(g_ctx, other, &W, 0, L, L, 0, label);
            if (lo) T_CHECK(blocks_differ(lw, 0, lo, 0, n_qb, Hkv, "", 0) > 0,
                            "%s: the layout comparator sees no difference at double density", label);
            dhsa_layout_free(lo);
        }
        dhsa_kv_index_free(other);
    }
    dhsa_kv_index_free(ub);
    dhsa_layout_free(lw);
    dhsa_layout_free(le);
    dhsa_layout_free(lr);
    ci_free(&ci);
out0:
    dhsa_kv_index_free(one);
    dhsa_kv_index_free(each);
    dhsa_kv_index_free(rnd);
    dhsa_predictor_free(pred);
    work_free(&W);
}

/* Decode against prefill.
 *
 * A decode step appends key p and routes the single query row p (Lq = 1,
 * q_pos0 = p, k = the first p + 1 keys). What must equal it is the block of
 * a whole-prefill routing that holds row p and nothing else, i.e. a prefill
 * routed with q_block = 1: there the block's last position is p, so it sees
 * exactly the chunks closed when key p arrived (the decode index holds no
 * others yet); it may attend to keys [0, p + 1), so its budget
 * (density x available keys), its sinks, its local span [p - local, p + 1)
 * and its dense/sparse decision are the same; and its pooled query is row p
 * alone. A 64-row block is not comparable: it pools 64 different rows, may
 * see chunks closed up to its own last row, and has a larger diagonal.
 * Every row is compared.
 *
 * Visibility: a chunk closed when key p arrives is a candidate for row p
 * but not for row p - 1, where it is still part of the open tail, which is
 * read whole. With a short local span the difference shows in the layouts:
 * at row p - 1 every key of that chunk is selected; at row p it competes
 * like any chunk, so for some such chunks keys outside the sinks, the local
 * span and the new tail are left out. */
static void test_decode_vs_prefill(int64_t L, uint64_t seed, int share_heads, int64_t local) {
    char label[160];
    snprintf(label, sizeof label, "decode vs prefill(q_block=1) L=%lld local %lld%s", (long long)L,
             (long long)local, share_heads ? " share_heads" : "");
    work W;
    if (!work_synth(&W, L, 8, 2, 128, seed)) return;
    dhsa_router_params rp = dhsa_router_default_params();
    rp.q_block = 1;
    rp.share_heads = share_heads;
    rp.local_tokens = local;
    rp.density = 0.25; /* beyond sinks + local: decode rows choose chunks */
    const int64_t Hkv = W.Hkv;
    dhsa_kv_index *full = ix_new(g_ctx, &rp, Hkv, W.d, L, label), *ix = ix_new(g_ctx, &rp, Hkv, W.d, L, label);
    dhsa_layout *whole = NULL;
    if (full && ix_append(full, &W, 0, L) == DHSA_OK) whole = ix_route(g_ctx, full, &W, 0, L, L, 0, label);
    if (!whole || !ix) {
        T_CHECK(0, "%s: setup: %s", label, dhsa_last_error());
        goto out;
    }
    /* chunk c of the whole sequence: [S[c], E[c]); ci.cnt is filled as
     * the decode index grows */
    const int64_t *S;
    const int64_t nS = dhsa_kv_index_chunks(full, &S);
    chunk_info ci;
    ci_init(&ci, L);
    ci_ends(&ci, full, W.k, Hkv, W.d);
    const int64_t *E = ci.E;

    rules Rd; /* the rules over every decode row */
    memset(&Rd, 0, sizeof Rd);
    viol hidden;
    memset(&hidden, 0, sizeof hidden);
    int64_t differ = 0, sparse_rows = 0, chunky_rows = 0, shown = 0, events = 0;
    dhsa_layout *prev = NULL;
    for (int64_t t = 0; t < L; t++) {
        const int64_t before = dhsa_kv_index_chunks(ix, NULL);
        if (ix_append(ix, &W, t, 1) != DHSA_OK) {
            T_CHECK(0, "%s: append %lld: %s", label, (long long)t, dhsa_last_error());
            break;
        }
        ci.cnt[t + 1] = dhsa_kv_index_chunks(ix, NULL);
        dhsa_layout *lay = ix_route(g_ctx, ix, &W, t, 1, t + 1, 0, label);
        if (!lay) break;
        char what[240];
        snprintf(what, sizeof what, "%s: decode row %lld vs prefill block %lld", label, (long long)t, (long long)t);
        int64_t dd = blocks_differ(lay, 0, whole, t, 1, Hkv, what, !differ);
        differ += dd > 0;
        check_rules(&Rd, lay, &rp, Hkv, 1, t + 1, t, 0, &ci);
        const int64_t *r;
        int64_t n;
        dhsa_layout_get(lay, 0, 0, 0, &r, &n);
        sparse_rows += !(n == 1 && r[0] == 0 && r[1] == t + 1);
        chunky_rows += n > 2;
        /* chunk c closed when key t arrived (c = before): row t - 1 read it
         * whole as the open tail, row t ranks it */
        const int64_t after = dhsa_kv_index_chunks(ix, NULL);
        if (prev && after == before + 1 && before < nS && t >= rp.dense_below + 1) {
            const int64_t c = before, cs = S[c], ce = E[c];
            for (int64_t g = 0; g < Hkv; g++) {
                const int64_t *rp0, *rp1;
                int64_t np0, np1;
                dhsa_layout_get(prev, 0, g, 0, &rp0, &np0);
                dhsa_layout_get(lay, 0, g, 0, &rp1, &np1);
                int64_t left_out = 0;
                for (int64_t j = cs > rp.sink_tokens ? cs : rp.sink_tokens; j < ce && j < t - local; j++)
                    left_out += !covered(rp1, np1, j, j + 1);
                VIOL_IF(hidden, !covered(rp0, np0, cs, ce < t ? ce : t), /* row t - 1 sees keys < t */
                        "row %lld, KV head %lld: chunk %lld [%lld, %lld), still open (it closes at key %lld), is "
                        "not read whole",
                        (long long)(t - 1), (long long)g, (long long)c, (long long)cs, (long long)ce, (long long)t);
                events++;
                shown += left_out > 0;
            }
        }
        dhsa_layout_free(prev);
        prev = lay;
    }
    dhsa_layout_free(prev);
    T_CHECK(differ == 0, "%s: %lld decode rows differ from the q_block = 1 prefill", label, (long long)differ);
    char l2[200];
    snprintf(l2, sizeof l2, "%s, every decode row", label);
    report_rules(&Rd, l2, 0);
    T_CHECK(sparse_rows >= L - rp.dense_below - 1 && chunky_rows * 4 >= sparse_rows,
            "%s: %lld decode rows were sparse, %lld chose chunks: too few to compare", label, (long long)sparse_rows,
            (long long)chunky_rows);
    VIOL_REPORT(hidden, "before the key that closes it, a chunk is read whole (open tail)", label);
    if (local < 64)
        T_CHECK(shown > 0 && events >= 10,
                "%s: each of %lld just-closed chunks was still read whole at its closing row: the chunk did not "
                "become a candidate there",
                label, (long long)events);
    {
        rules R;
        memset(&R, 0, sizeof R);
        check_rules(&R, whole, &rp, Hkv, L, L, 0, 0, &ci);
        report_rules(&R, label, 0);
    }
    ci_free(&ci);
out:
    dhsa_layout_free(whole);
    dhsa_kv_index_free(full);
    dhsa_kv_index_free(ix);
    work_free(&W);
}

/* The crafted cases' routing (one KV head, d from a.k): FIXED chunks of
 * C keys, blocks of C rows, a budget of 2C keys (the block's own chunk
 * and one more), no sinks or local keys; *lr dhsa_route's layout and *li
 * the index's (NULL where a call failed, which is a failed check). */
static void crafted_layouts(dhsa_chunk_score mode, int64_t C, int64_t L, const dhsa_attn_desc *a, const char *label,
                            const char *name, dhsa_layout **lr, dhsa_layout **li) {
    dhsa_router_params rp = dhsa_router_default_params();
    rp.score_mode = mode;
    rp.boundary = DHSA_BOUNDARY_FIXED;
    rp.chunk = C;
    rp.q_block = C;
    rp.budget_tokens = 2 * C;
    rp.sink_tokens = 0;
    rp.local_tokens = 0;
    rp.dense_below = 0;
    dhsa_kv_index *ix = ix_new(g_ctx, &rp, 1, a->k.shape[3], L, label);
    dhsa_status st = dhsa_route(g_ctx, &rp, a, lr);
    T_CHECK(st == DHSA_OK, "%s (%s): dhsa_route: %s", label, name, dhsa_last_error());
    if (ix && dhsa_kv_index_append(ix, &a->k) == DHSA_OK) {
        st = dhsa_kv_index_route(g_ctx, ix, a, li);
        T_CHECK(st == DHSA_OK, "%s (%s): kv_index_route: %s", label, name, dhsa_last_error());
    }
    dhsa_kv_index_free(ix);
}

/* The chunk score on a crafted copy-like case (include/dhsa.h
 * dhsa_chunk_score). 16 FIXED chunks of 16 keys, d = 16, scale 1/4; the
 * last query block (16 rows, 2 query heads) asks along e0 (q = 8 e0).
 * Every chunk's keys are 1.0 e0 (q.k = 8, weight e^2), except chunk T,
 * whose key T*16 + 7 is 6 e0 (q.k = 48, weight e^12) and whose other 15
 * keys are -0.4 e0 plus +-1 in the other dimensions: its mean along e0 is
 * 0, so the published pooled score ranks it below every other chunk, while
 * it holds ~99% of the block's attention (computed here in double). The
 * budget (32 keys, no sinks, no local span beyond the block's own 16 keys)
 * buys one chunk. MOMENTS must pick T (its key variance along the query
 * gives s^2/2 q^2 var = 4.8 against 2.0 for the others), POOLED must not;
 * and for both scores the index routes every block exactly as dhsa_route
 * does (same chunks, same selection). */
static void test_score_crafted(void) {
    const char *label = "crafted chunk score";
    const int64_t L = 256, C = 16, d = 16, Hq = 2, T = 5, key = T * C + 7;
    float *q = xcalloc((size_t)(Hq * L * d), sizeof(float)), *k = xcalloc((size_t)(L * d), sizeof(float));
    float *v = xcalloc((size_t)(L * d), sizeof(float));
    rng_t r = {99};
    for (int64_t t = 0; t < L; t++) {
        float *kt = k + t * d;
        if (t / C != T) {
            kt[0] = 1.0f;
            for (int64_t x = 1; x < d; x++) kt[x] = (float)(0.01 * rng_normal(&r));
        } else if (t == key) {
            kt[0] = 6.0f;
        } else {
            kt[0] = -0.4f;
            for (int64_t x = 1; x < d; x++) kt[x] = rng_u64(&r) & 1 ? 1.0f : -1.0f;
        }
        for (int64_t x = 0; x < d; x++) v[t * d + x] = (float)rng_normal(&r);
    }
    for (int64_t h = 0; h < Hq; h++)
        for (int64_t t = L - C; t < L; t++) q[(h * L + t) * d] = 8.0f;
    /* the true share of the last block's attention on chunk T */
    double on_t = 0, all = 0;
    for (int64_t t = L - C; t < L; t++) {
        double m = 0, w_t = 0, w_all = 0;
        for (int64_t j = 0; j <= t; j++) m = fmax(m, 0.25 * 8.0 * k[j * d]);
        for (int64_t j = 0; j <= t; j++) {
            double w = exp(0.25 * 8.0 * k[j * d] - m);
            w_all += w;
            if (j / C == T) w_t += w;
        }
        on_t += w_t / w_all;
        all += 1;
    }
    T_CHECK(on_t / all > 0.95, "%s: chunk %lld holds only %.3f of the last block's attention: the case is wrong",
            label, (long long)T, on_t / all);
    dhsa_attn_desc a = dhsa_attn_default_desc();
    a.q = dhsa_tensor_bhld(q, DHSA_F32, 1, Hq, L, d);
    a.k = dhsa_tensor_bhld(k, DHSA_F32, 1, 1, L, d);
    a.v = dhsa_tensor_bhld(v, DHSA_F32, 1, 1, L, d);
    a.causal = 1;
    for (int mode = 0; mode < 4; mode++) {
        const char *name = mode == 3 ? "BOUND" : mode == 2 ? "HEADS" : mode ? "MOMENTS" : "POOLED";
        dhsa_layout *lr = NULL, *li = NULL;
        crafted_layouts((dhsa_chunk_score)mode, C, L, &a, label, name, &lr, &li); /* POOLED, MOMENTS, HEADS, BOUND */
        if (lr && li) {
            char what[120];
            snprintf(what, sizeof what, "%s (%s): index vs dhsa_route", label, name);
            int64_t nd = blocks_differ(li, 0, lr, 0, L / C, 1, what, 1);
            T_CHECK(nd == 0, "%s: %lld blocks differ", what, (long long)nd);
            int sel_r = dhsa_layout_selects(lr, 0, 0, L - 1, key), sel_i = dhsa_layout_selects(li, 0, 0, L - 1, key);
            if (mode)
                T_CHECK(sel_r == 1 && sel_i == 1, "%s: MOMENTS leaves out chunk %lld (route %d, index %d)", label,
                        (long long)T, sel_r, sel_i);
            else /* shows the MOMENTS check can fail: the published score misses it */
                T_CHECK(sel_r == 0 && sel_i == 0, "%s: POOLED selects chunk %lld (route %d, index %d): the case "
                        "does not separate the scores", label, (long long)T, sel_r, sel_i);
        }
        dhsa_layout_free(lr);
        dhsa_layout_free(li);
    }
    free(q), free(k), free(v);
}

/* The variance term capped (docs/dhsa.md, "The variance term, capped").
 * 16 FIXED chunks of 16 keys, d = 16, scale 1/4, the last block asks
 * along e0 (q = 8 e0: a key's scaled score is 2 k[0]). Chunk J's keys
 * alternate 0 and -20 along e0 (scores 0 and -40: mean -20, variance
 * term s^2/2 q^2 var = 200), chunk T's are all 20 (score 40), the others
 * 0. T holds nearly all the attention; an estimate without the cap puts
 * J at -20 + 200 = 180, 140 nats above its best key, and picks it; with
 * the cap J stays below T. The budget buys one chunk: MOMENTS and HEADS
 * must pick T, in dhsa_route and in the index alike. */
static void test_score_capped(void) {
    const char *label = "capped variance term";
    const int64_t L = 256, C = 16, d = 16, Hq = 2, J = 3, T = 9;
    float *q = xcalloc((size_t)(Hq * L * d), sizeof(float)), *k = xcalloc((size_t)(L * d), sizeof(float));
    float *v = xcalloc((size_t)(L * d), sizeof(float));
    rng_t r = {7};
    for (int64_t t = 0; t < L; t++) {
        float *kt = k + t * d;
        kt[0] = t / C == J ? (t % 2 ? -20.0f : 0.0f) : t / C == T ? 20.0f : 0.0f;
        for (int64_t x = 1; x < d; x++) kt[x] = (float)(0.01 * rng_normal(&r));
        for (int64_t x = 0; x < d; x++) v[t * d + x] = (float)rng_normal(&r);
    }
    for (int64_t h = 0; h < Hq; h++)
        for (int64_t t = L - C; t < L; t++) q[(h * L + t) * d] = 8.0f;
    /* the case: without the cap J outranks T; T holds the attention */
    double mj = 0, vj = 0;
    for (int64_t t = J * C; t < (J + 1) * C; t++) mj += 2.0 * k[t * d] / (double)C;
    for (int64_t t = J * C; t < (J + 1) * C; t++) vj += (2.0 * k[t * d] - mj) * (2.0 * k[t * d] - mj) / (double)C;
    T_CHECK(mj + vj / 2.0 > 40.0 + 100.0, "%s: the uncapped estimate of J (%.1f) does not outrank T: the case is wrong",
            label, mj + vj / 2.0);
    double zt = 0, zall = 0;
    for (int64_t j = 0; j < L; j++) {
        double w = exp(2.0 * k[j * d] - 40.0);
        zall += w;
        if (j / C == T) zt += w;
    }
    T_CHECK(zt / zall > 0.99, "%s: chunk T holds only %.3f of the attention: the case is wrong", label, zt / zall);
    dhsa_attn_desc a = dhsa_attn_default_desc();
    a.q = dhsa_tensor_bhld(q, DHSA_F32, 1, Hq, L, d);
    a.k = dhsa_tensor_bhld(k, DHSA_F32, 1, 1, L, d);
    a.v = dhsa_tensor_bhld(v, DHSA_F32, 1, 1, L, d);
    a.causal = 1;
    for (int mode = 1; mode <= 2; mode++) {
        const char *name = mode == 2 ? "HEADS" : "MOMENTS";
        dhsa_layout *lr = NULL, *li = NULL;
        crafted_layouts(mode == 1 ? DHSA_SCORE_MOMENTS : DHSA_SCORE_HEADS, C, L, &a, label, name, &lr, &li);
        for (int which = 0; which < 2; which++) {
            const dhsa_layout *lay = which ? li : lr;
            if (!lay) continue;
            int on_t = dhsa_layout_selects(lay, 0, 0, L - 1, T * C + 5), on_j = dhsa_layout_selects(lay, 0, 0, L - 1, J * C);
            T_CHECK(on_t == 1 && on_j == 0, "%s (%s, %s): chunk T %s, chunk J %s (want T, not J)", label, name,
                    which ? "index" : "dhsa_route", on_t ? "selected" : "left out", on_j ? "selected" : "left out");
        }
        dhsa_layout_free(lr);
        dhsa_layout_free(li);
    }
    free(q), free(k), free(v);
}

/* Keys stored as F16 and BF16, and batch-first (strided) views: the index
 * reads them as the F32 values they hold. */
static void test_types_strides(void) {
    const char *label = "types and strides";
    work W;
    if (!work_synth(&W, 2600, 4, 2, 48, 31)) return;
    const int64_t L = W.L, Hkv = W.Hkv, d = W.d;
    dhsa_router_params rp = dhsa_router_default_params();
    uint16_t *h16 = xcalloc((size_t)(Hkv * L * d), 2), *b16 = xcalloc((size_t)(Hkv * L * d), 2);
    float *kf16 = xcalloc((size_t)(Hkv * L * d), 4), *kb16 = xcalloc((size_t)(Hkv * L * d), 4);
    float *blhd = xcalloc((size_t)(Hkv * L * d), 4);
    for (int64_t g = 0; g < Hkv; g++)
        for (int64_t t = 0; t < L; t++)
            for (int64_t x = 0; x < d; x++) {
                int64_t i = (g * L + t) * d + x;
                h16[i] = dhsa_f32_to_f16(W.k[i]);
                b16[i] = dhsa_f32_to_bf16(W.k[i]);
                kf16[i] = dhsa_f16_to_f32(h16[i]);
                kb16[i] = dhsa_bf16_to_f32(b16[i]);
                blhd[(t * Hkv + g) * d + x] = W.k[i];
            }
    dhsa_kv_index *a = ix_new(g_ctx, &rp, Hkv, d, L, label), *b = ix_new(g_ctx, &rp, Hkv, d, L, label);
    if (a && b) {
        /* batch-first view, appended in pieces of 100 */
        for (int64_t u0 = 0; u0 < L; u0 += 100) {
            int64_t n = L - u0 < 100 ? L - u0 : 100;
            dhsa_tensor kv = dhsa_tensor_blhd(blhd + u0 * Hkv * d, DHSA_F32, 1, n, Hkv, d);
            T_CHECK(dhsa_kv_index_append(b, &kv) == DHSA_OK, "%s: blhd append: %s", label, dhsa_last_error());
        }
        ix_append(a, &W, 0, L);
        T_CHECK(same_starts(a, b), "%s: a batch-first view gives other chunk starts", label);
        dhsa_layout *la = ix_route(g_ctx, a, &W, 0, L, L, 0, label), *lb = ix_route(g_ctx, b, &W, 0, L, L, 0, label);
        if (la && lb)
            T_CHECK(blocks_differ(la, 0, lb, 0, la ? (L + 63) / 64 : 0, Hkv, "bhld vs blhd", 1) == 0,
                    "%s: a batch-first view routes differently", label);
        dhsa_layout_free(la);
        dhsa_layout_free(lb);
    }
    dhsa_kv_index_free(a);
    dhsa_kv_index_free(b);
    const char *tn[2] = {"f16", "bf16"};
    for (int ty = 0; ty < 2; ty++) {
        dhsa_kv_index *x = ix_new(g_ctx, &rp, Hkv, d, L, label), *y = ix_new(g_ctx, &rp, Hkv, d, L, label);
        if (x && y) {
            dhsa_tensor kt = dhsa_tensor_bhld(ty ? (void *)b16 : (void *)h16, ty ? DHSA_BF16 : DHSA_F16, 1, Hkv, L, d);
            dhsa_tensor kr = dhsa_tensor_bhld(ty ? kb16 : kf16, DHSA_F32, 1, Hkv, L, d);
            T_CHECK(dhsa_kv_index_append(x, &kt) == DHSA_OK && dhsa_kv_index_append(y, &kr) == DHSA_OK,
                    "%s %s: append: %s", label, tn[ty], dhsa_last_error());
            T_CHECK(same_starts(x, y), "%s: %s keys give other chunk starts than their F32 values", label, tn[ty]);
            /* route both with the rounded keys' q (the same q): same layout */
            dhsa_layout *lx = ix_route(g_ctx, x, &W, 0, L, L, 0, label), *ly = ix_route(g_ctx, y, &W, 0, L, L, 0, label);
            if (lx && ly)
                T_CHECK(blocks_differ(lx, 0, ly, 0, (L + 63) / 64, Hkv, tn[ty], 1) == 0,
                        "%s: %s keys route differently from their F32 values", label, tn[ty]);
            dhsa_layout_free(lx);
            dhsa_layout_free(ly);
        }
        dhsa_kv_index_free(x);
        dhsa_kv_index_free(y);
    }
    free(h16);
    free(b16);
    free(kf16);
    free(kb16);
    free(blhd);
    work_free(&W);
}

/* ------------------------------------------------------------------------ */
/* 3. Routing rules under several parameter sets */

static void test_routing_rules(void) {
    typedef struct {
        const char *name;
        int64_t Hq, Hkv;
        dhsa_boundary bd;
        int64_t chunk, budget, sink, local, dense_below, q_block, min_chunk, max_chunk, window;
        double density;
        int share;
    } rcase;
    const rcase cases[] = {
        {"defaults", 8, 2, DHSA_BOUNDARY_SIMILARITY, 64, 0, 64, 256, 2048, 64, 16, 256, 0, 0.0625, 0},
        {"fixed budget 512", 8, 2, DHSA_BOUNDARY_FIXED, 64, 512, 64, 256, 2048, 64, 16, 256, 0, 0, 0},
        {"share_heads", 8, 2, DHSA_BOUNDARY_SIMILARITY, 64, 0, 64, 256, 2048, 64, 16, 256, 0, 0.0625, 1},
        {"MHA 4/4 density 0.25 sink 16 local 300", 4, 4, DHSA_BOUNDARY_SIMILARITY, 64, 0, 16, 300, 1024, 64, 16,
         256, 0, 0.25, 0},
        {"MQA 8/1 q_block 128 budget 300 chunks 8..64", 8, 1, DHSA_BOUNDARY_SIMILARITY, 64, 300, 64, 128, 2048, 128,
         8, 64, 0, 0, 0},
        {"window 3000 density 0.25", 8, 2, DHSA_BOUNDARY_SIMILARITY, 64, 0, 64, 256, 1024, 64, 16, 256, 3000, 0.25, 0},
        {"fixed 48, q_block 40, sinks 0, local 0", 8, 2, DHSA_BOUNDARY_FIXED, 48, 0, 0, 0, 1500, 40, 16, 256, 0,
         0.1, 0},
        {"share_heads MHA 4/4 budget 700", 4, 4, DHSA_BOUNDARY_SIMILARITY, 64, 700, 64, 256, 2048, 64, 16, 256, 0,
         0, 1},
    };
    const int64_t L = 8192 - 25;
    for (size_t ic = 0; ic < sizeof cases / sizeof cases[0]; ic++) {
        const rcase *c = &cases[ic];
        char label[200];
        snprintf(label, sizeof label, "rules %s (L=%lld)", c->name, (long long)L);
        work W;
        if (!work_synth(&W, L, c->Hq, c->Hkv, 64, 300 + ic)) continue;
        dhsa_router_params rp = dhsa_router_default_params();
        rp.boundary = c->bd, rp.chunk = c->chunk, rp.budget_tokens = c->budget, rp.sink_tokens = c->sink;
        rp.local_tokens = c->local, rp.dense_below = c->dense_below, rp.q_block = c->q_block;
        rp.min_chunk = c->min_chunk, rp.max_chunk = c->max_chunk, rp.share_heads = c->share;
        if (c->density > 0) rp.density = c->density;
        dhsa_kv_index *ix = ix_new(g_ctx, &rp, c->Hkv, W.d, L, label);
        chunk_info ci;
        memset(&ci, 0, sizeof ci);
        if (ix && ci_append(&ci, ix, &W)) {
            rules R;
            memset(&R, 0, sizeof R);
            /* whole prefill, a chunked-prefill piece at q_pos0 > 0 (not a
             * multiple of q_block: the layout is routed for these rows,
             * whatever their blocks), and single decode rows */
            dhsa_layout *lay = ix_route(g_ctx, ix, &W, 0, L, L, c->window, label);
            if (lay) {
                check_rules(&R, lay, &rp, c->Hkv, L, L, 0, c->window, &ci);
                if (!c->share && c->Hkv > 1 && c->window == 0) {
                    /* per-group routing: head 1 against head 0 */
                    int64_t nqb = (L + rp.q_block - 1) / rp.q_block;
                    int64_t heads_differ = 0;
                    for (int64_t qb = 0; qb < nqb; qb++) {
                        const int64_t *r0, *r1;
                        int64_t n0, n1;
                        dhsa_layout_get(lay, 0, 0, qb, &r0, &n0);
                        dhsa_layout_get(lay, 0, 1, qb, &r1, &n1);
                        heads_differ += n0 != n1 || memcmp(r0, r1, (size_t)(2 * n0) * sizeof(int64_t)) != 0;
                    }
                    T_CHECK(heads_differ > 0,
                            "%s: per-KV-group routing gives the same ranges to every head (%lld blocks differ): "
                            "the share_heads check could not fail",
                            label, (long long)heads_differ);
                }
                dhsa_layout_free(lay);
            }
            int64_t p0 = L - 1000 - 7;
            dhsa_layout *part = ix_route(g_ctx, ix, &W, p0, 1000, L, c->window, label);
            if (part) {
                /* rows p0.. of a q view whose keys are all L: the index must
                 * equal the cache, so route at Lk = L (rows see up to their
                 * own position only) */
                check_rules(&R, part, &rp, c->Hkv, 1000, L, p0, c->window, &ci);
                dhsa_layout_free(part);
            }
            report_rules(&R, label, c->window > 0);
            T_CHECK(R.with_chunks > 0, "%s: no block selected a chunk", label);
        }
        ci_free(&ci);
        dhsa_kv_index_free(ix);
        work_free(&W);
    }

    /* the rule checker can fail: a hand-made layout selecting all keys for
     * every block breaks causality (and the budget) */
    dhsa_router_params rp = dhsa_router_default_params();
    dhsa_layout *bad = NULL;
    if (dhsa_layout_create(g_ctx, 1, 2, 4096, 4096, 64, 4, &bad) == DHSA_OK) {
        int64_t all[2] = {0, 4096};
        for (int64_t g = 0; g < 2; g++)
            for (int64_t qb = 0; qb < 64; qb++) dhsa_layout_set(bad, 0, g, qb, all, 1);
        rules R;
        memset(&R, 0, sizeof R);
        check_rules(&R, bad, &rp, 2, 4096, 4096, 0, 0, NULL);
        T_CHECK(R.causal.bad > 0 && R.budget_hi.bad > 0,
                "the rule checker accepts a layout that selects every key for every block (%lld causal, %lld budget)",
                (long long)R.causal.bad, (long long)R.budget_hi.bad);
        /* and an empty one misses sinks, local and the dense blocks */
        for (int64_t g = 0; g < 2; g++)
            for (int64_t qb = 0; qb < 64; qb++) dhsa_layout_set(bad, 0, g, qb, all, 0);
        memset(&R, 0, sizeof R);
        check_rules(&R, bad, &rp, 2, 4096, 4096, 0, 0, NULL);
        T_CHECK(R.sinks.bad > 0 && R.local.bad > 0 && R.dense.bad > 0,
                "the rule checker accepts an empty layout");
        dhsa_layout_free(bad);
    } else {
        T_CHECK(0, "layout_create for the checker's own test: %s", dhsa_last_error());
    }
}

/* DESIGN.md section 6: "the kernel reads only the selected ranges plus the
 * open tail chunk". The open tail (the keys after the last closed chunk) is
 * never a candidate, so it must be read whole. Checked here for decode rows
 * with local_tokens shorter than max_chunk, where the local span alone does
 * not always reach back to the tail's start. */
static void test_open_tail(void) {
    const char *label = "open tail read at decode (local 64, max_chunk 256)";
    work W;
    if (!work_synth(&W, 6000, 4, 2, 64, 404)) return;
    dhsa_router_params rp = dhsa_router_default_params();
    rp.local_tokens = 64;
    rp.q_block = 1;
    dhsa_kv_index *ix = ix_new(g_ctx, &rp, W.Hkv, W.d, W.L, label);
    viol v;
    memset(&v, 0, sizeof v);
    for (int64_t t = 0; ix && t < W.L; t++) {
        if (ix_append(ix, &W, t, 1) != DHSA_OK) break;
        if (t < rp.dense_below || t % 37 != 0) continue;
        dhsa_layout *lay = ix_route(g_ctx, ix, &W, t, 1, t + 1, 0, label);
        if (!lay) break;
        dhsa_layout_stats ls;
        dhsa_layout_get_stats(lay, &ls);
        int64_t tail0 = llround(ls.chunk_mean * (double)ls.chunks);
        for (int64_t g = 0; g < W.Hkv; g++) {
            const int64_t *r;
            int64_t n;
            dhsa_layout_get(lay, 0, g, 0, &r, &n);
            char buf[300];
            print_ranges(buf, sizeof buf, r, n);
            VIOL_IF(v, !covered(r, n, tail0, t + 1),
                    "decode row %lld, KV head %lld: open tail [%lld, %lld) (%lld keys) not all selected: %s",
                    (long long)t, (long long)g, (long long)tail0, (long long)(t + 1), (long long)(t + 1 - tail0),
                    buf);
        }
        dhsa_layout_free(lay);
    }
    VIOL_REPORT(v, "DESIGN.md 6: a decode row reads the open tail chunk", label);
    dhsa_kv_index_free(ix);
    work_free(&W);
}

int main(void) {
    g_ctx = ctx_new(0, 0);
    if (!g_ctx) return t_report("test_kv_index");

    /* at L = 4096 the default density (256 keys) is spent on sinks and
     * local alone: a higher one makes the blocks choose chunks */
    test_incremental(4096, 8, 2, 128, DHSA_BOUNDARY_SIMILARITY, 0.25, 0, 1);
    test_incremental(8192, 8, 2, 128, DHSA_BOUNDARY_SIMILARITY, 0.0625, 0, 2);
    test_incremental(8192, 8, 2, 128, DHSA_BOUNDARY_SIMILARITY, 0.25, 0, 22);
    test_incremental(4096 + 37, 4, 4, 64, DHSA_BOUNDARY_FIXED, 0.0625, 700, 3);
    test_incremental(5000, 8, 1, 96, DHSA_BOUNDARY_SIMILARITY, 0.2, 0, 4);
    test_incremental(4096, 8, 2, 64, DHSA_BOUNDARY_LEARNED, 0.25, 0, 5);
    g_score = DHSA_SCORE_POOLED; /* the published score keeps the same guarantees */
    test_incremental(4096, 8, 2, 128, DHSA_BOUNDARY_SIMILARITY, 0.25, 0, 1);
    test_incremental(4096 + 37, 4, 4, 64, DHSA_BOUNDARY_FIXED, 0.0625, 700, 3);
    g_score = DHSA_SCORE_HEADS; /* per-head shares, and the keys' range (its open chunk kept outside the ring) */
    test_incremental(4096, 8, 2, 128, DHSA_BOUNDARY_SIMILARITY, 0.25, 0, 1);
    test_incremental(4096 + 37, 4, 4, 64, DHSA_BOUNDARY_FIXED, 0.0625, 700, 3);
    g_score = DHSA_SCORE_BOUND;
    test_incremental(4096, 8, 2, 128, DHSA_BOUNDARY_SIMILARITY, 0.25, 0, 1);
    test_incremental(4096 + 37, 4, 4, 64, DHSA_BOUNDARY_FIXED, 0.0625, 700, 3);
    test_incremental(4096, 8, 2, 64, DHSA_BOUNDARY_LEARNED, 0.25, 0, 5);
    g_score = DHSA_SCORE_ROWS; /* per-row shares (the routing every entry point runs) */
    test_incremental(4096, 8, 2, 128, DHSA_BOUNDARY_SIMILARITY, 0.25, 0, 1);
    test_incremental(4096 + 37, 4, 4, 64, DHSA_BOUNDARY_FIXED, 0.0625, 700, 3);
    g_score = DHSA_SCORE_MOMENTS;
    test_score_crafted();
    test_score_capped();
    test_decode_vs_prefill(4096, 5, 0, 256);
    test_decode_vs_prefill(4096, 6, 1, 256);
    test_decode_vs_prefill(4096, 7, 0, 16);
    test_types_strides();

    test_routing_rules();
    test_open_tail();

    dhsa_ctx_free(g_ctx);
    return t_report("test_kv_index");
}
