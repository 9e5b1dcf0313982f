/* test_kv_index_boundaries.c: the index's chunk boundaries, part 2 of
 * kv_index_t.h: FIXED, SIMILARITY on crafted keys against the true
 * segment starts and a double re-implementation of the online rule, the
 * decision delays, and LEARNED against dhsa_route_boundaries and a model
 * of the online rule over dhsa_predictor_score's probabilities.
 *
 * Run: make build/tests/test_kv_index_boundaries && build/tests/test_kv_index_boundaries
 * (or `make test`). Ends with "test_kv_index_boundaries: P passed, F failed, S skipped".
 */

#include "kv_index_t.h"

/* ------------------------------------------------------------------------ */
/* 2. Boundaries */

/* Appends keys [1, Hkv, L, d] (contiguous) one at a time; cnt[m] = closed
 * chunks after m keys (m = 0..L). */
static dhsa_kv_index *append_counting(const dhsa_router_params *rp, const float *k, int64_t Hkv, int64_t L,
                                      int64_t d, int64_t *cnt, const char *label) {
    dhsa_kv_index *ix = ix_new(g_ctx, rp, Hkv, d, L, label);
    if (!ix) return NULL;
    cnt[0] = dhsa_kv_index_chunks(ix, NULL);
    for (int64_t t = 0; t < L; t++) {
        dhsa_tensor kv = dhsa_tensor_bhld((void *)(k + t * d), DHSA_F32, 1, Hkv, 1, d);
        kv.stride[0] = Hkv * L * d;
        kv.stride[1] = L * d;
        if (dhsa_kv_index_append(ix, &kv) != DHSA_OK) {
            T_CHECK(0, "%s: append %lld: %s", label, (long long)t, dhsa_last_error());
            dhsa_kv_index_free(ix);
            return NULL;
        }
        cnt[t + 1] = dhsa_kv_index_chunks(ix, NULL);
    }
    return ix;
}

/* When the chunk count must grow for each boundary: a boundary t that ends a
 * chunk shorter than max_chunk (SIMILARITY) is decided when key t + nms
 * arrives, i.e. the count grows between t + nms and t + nms + 1 keys; a
 * max_chunk cut (and every FIXED chunk) closes when its last key, t - 1,
 * arrives: between t - 1 and t keys. LEARNED: every time `delay` = w - 1
 * keys later (a score needs the w - 1 keys after its candidate). */
static void check_delay(const dhsa_kv_index *ix, const dhsa_router_params *rp, const int64_t *cnt, int64_t L,
                        int64_t delay, const char *label) {
    const int64_t *s;
    int64_t n = dhsa_kv_index_chunks(ix, &s);
    viol v;
    memset(&v, 0, sizeof v);
    int64_t cuts = 0, decided = 0;
    for (int64_t c = 1; c < n; c++) {
        int64_t t = s[c], len = t - s[c - 1];
        int cut = rp->boundary == DHSA_BOUNDARY_FIXED || len == rp->max_chunk;
        /* a cut at t closes when key t + nms - 1 arrives (it waits for the
         * candidates inside its chunk); a decided boundary at key t + nms */
        int64_t m = cut ? (rp->boundary == DHSA_BOUNDARY_FIXED ? t : t + rp->nms_window + delay)
                        : t + rp->nms_window + 1 + delay;
        cuts += cut;
        decided += !cut;
        if (m > L) {
            VIOL_IF(v, 1, "boundary %lld (chunk %lld, length %lld) would be decided at %lld keys > L %lld",
                    (long long)t, (long long)c, (long long)len, (long long)m, (long long)L);
            continue;
        }
        VIOL_IF(v, cnt[m - 1] != c - 1 || cnt[m] != c,
                "boundary %lld (chunk length %lld, %s): chunks %lld after %lld keys and %lld after %lld, want %lld "
                "then %lld",
                (long long)t, (long long)len, cut ? "cut" : "decided", (long long)cnt[m - 1], (long long)(m - 1),
                (long long)cnt[m], (long long)m, (long long)(c - 1), (long long)c);
    }
    VIOL_REPORT(v, "a boundary closes nms_window keys after it (a max_chunk cut: nms_window keys after its last key)", label);
    /* a similarity boundary needs gap = max(min_chunk, nms + 1) keys before
     * it and must be decided (nms keys later) before the max_chunk cut */
    int64_t gap = rp->min_chunk > rp->nms_window + 1 ? rp->min_chunk : rp->nms_window + 1;
    if (rp->boundary != DHSA_BOUNDARY_FIXED && gap + rp->nms_window < rp->max_chunk)
        T_CHECK(decided > 0, "%s: no score-decided boundary to time (%lld cuts)", label, (long long)cuts);
}

static void test_fixed_boundaries(void) {
    const int64_t Hkv = 2, d = 16, L = 1000;
    rng_t r = {11};
    float *k = xcalloc((size_t)(Hkv * L * d), sizeof(float));
    for (int64_t i = 0; i < Hkv * L * d; i++) k[i] = (float)rng_normal(&r);
    int64_t *cnt = xcalloc((size_t)(L + 1), sizeof(int64_t));
    const int64_t chunks[] = {1, 48, 64, 999, 1000, 1001};
    for (size_t ci = 0; ci < sizeof chunks / sizeof chunks[0]; ci++) {
        dhsa_router_params rp = dhsa_router_default_params();
        rp.boundary = DHSA_BOUNDARY_FIXED;
        rp.chunk = chunks[ci];
        char label[80];
        snprintf(label, sizeof label, "fixed chunk=%lld L=%lld", (long long)rp.chunk, (long long)L);
        dhsa_kv_index *ix = append_counting(&rp, k, Hkv, L, d, cnt, label);
        if (!ix) continue;
        viol v;
        memset(&v, 0, sizeof v);
        for (int64_t m = 0; m <= L; m++)
            VIOL_IF(v, cnt[m] != m / rp.chunk, "after %lld keys %lld chunks, want %lld", (long long)m,
                    (long long)cnt[m], (long long)(m / rp.chunk));
        VIOL_REPORT(v, "FIXED: a chunk closes as soon as it holds `chunk` keys", label);
        const int64_t *s;
        int64_t n = dhsa_kv_index_chunks(ix, &s);
        int ok = n == L / rp.chunk;
        for (int64_t c = 0; c < n && ok; c++) ok = s[c] == c * rp.chunk;
        T_CHECK(ok, "%s: chunk starts are not 0, chunk, 2 chunk, ... (%lld chunks)", label, (long long)n);
        check_delay(ix, &rp, cnt, L, 0, label);
        dhsa_kv_index_free(ix);
    }
    free(cnt);
    free(k);
}

/* Keys of segments: segment i covers [st[i], st[i + 1]) and has a random
 * unit direction per KV head; key = direction + noise x N(0, I) / sqrt(d). */
static float *segment_keys(const int64_t *st, int nseg, int64_t Hkv, int64_t d, double noise, rng_t *r) {
    const int64_t L = st[nseg];
    float *k = xcalloc((size_t)(Hkv * L * d), sizeof(float));
    double *dir = xcalloc((size_t)d, sizeof(double));
    for (int i = 0; i < nseg; i++)
        for (int64_t g = 0; g < Hkv; g++) {
            double nn = 0;
            for (int64_t x = 0; x < d; x++) {
                dir[x] = rng_normal(r);
                nn += dir[x] * dir[x];
            }
            for (int64_t x = 0; x < d; x++) dir[x] /= sqrt(nn);
            for (int64_t t = st[i]; t < st[i + 1]; t++)
                for (int64_t x = 0; x < d; x++)
                    k[(g * L + t) * d + x] = (float)(dir[x] + noise * rng_normal(r) / sqrt((double)d));
        }
    free(dir);
    return k;
}

/* The online rule on keys whose only score peaks are the true segment
 * starts (after the first), written from the header: a true start s is
 * decided when key s + nms arrives, unless the open chunk reached max_chunk
 * before (a cut at open + max_chunk, closed when its last key
 * open + max_chunk - 1 arrives); it is kept if it is at least min_chunk
 * (and, as the implementation also demands, nms_window + 1) after the open
 * chunk's start. Writes every boundary in order, 0 first; the last one is
 * the start of the open tail. Returns the count. */
static int64_t model_starts(const int64_t *st, int nseg, const dhsa_router_params *rp, int64_t *exp) {
    const int64_t L = st[nseg], nms = rp->nms_window, mx = rp->max_chunk;
    const int64_t gap = rp->min_chunk > nms + 1 ? rp->min_chunk : nms + 1;
    int64_t n = 0, open = 0;
    exp[n++] = 0;
    for (int i = 1; i < nseg; i++) {
        const int64_t s = st[i];
        /* the cut closes at key open + mx + nms - 1, s is decided at key
         * s + nms: the cut comes first iff s >= open + mx (and a start is
         * only kept within max_chunk of the open chunk's start) */
        while (s >= open + mx) {
            open += mx;
            exp[n++] = open;
            if (open >= s) break;
        }
        if (open >= s) continue; /* the cut landed on s, or passed it: s is lost */
        if (s - open >= gap) {
            exp[n++] = s;
            open = s;
        }
    }
    while (open + mx + nms <= L) { /* the last segment: cut nms keys after it passes max_chunk */
        open += mx;
        exp[n++] = open;
    }
    return n;
}

/* First c where the index's closed-chunk starts s[0..n) differ from the
 * model's boundaries exp[0..ne - 1) (the last is the open tail), or -1. */
static int64_t starts_mismatch(const int64_t *s, int64_t n, const int64_t *exp, int64_t ne) {
    int64_t c = 0;
    while (c < n && c < ne - 1 && s[c] == exp[c]) c++;
    return c == n && n == ne - 1 ? -1 : c;
}

static void test_similarity_crafted(int long_segments, uint64_t seed) {
    char label[120];
    snprintf(label, sizeof label, "similarity crafted %s segments, seed %llu", long_segments ? "long" : "short",
             (unsigned long long)seed);
    const int64_t Hkv = 2, d = 64;
    dhsa_router_params rp = dhsa_router_default_params(); /* w 8, nms 8, min 16, max 256, threshold 1 */
    rng_t r = {seed};
    enum { NSEG = 24 };
    int64_t st[NSEG + 1];
    /* the first segment is 20 keys: long enough for min_chunk and nms, too
     * short for any candidate inside it (a candidate needs min_chunk keys
     * before it and must beat the real start within nms after it) */
    st[0] = 0;
    st[1] = 20;
    for (int i = 2; i <= NSEG; i++) {
        int64_t len = long_segments ? 20 + rng_range(&r, 700) : 20 + rng_range(&r, rp.max_chunk - rp.nms_window - 20);
        st[i] = st[i - 1] + len;
    }
    const int64_t L = st[NSEG];
    float *k = segment_keys(st, NSEG, Hkv, d, 1e-3, &r);
    int64_t *cnt = xcalloc((size_t)(L + 1), sizeof(int64_t));
    int64_t *exp = xcalloc((size_t)(L + 2), sizeof(int64_t));
    dhsa_kv_index *ix = append_counting(&rp, k, Hkv, L, d, cnt, label);
    if (ix) {
        const int64_t *s;
        int64_t n = dhsa_kv_index_chunks(ix, &s);
        /* every true start found exactly (segments here are shorter than
         * max_chunk - nms_window, so no cut can pre-empt one) */
        const int64_t tail0 = open_tail_start(ix, k, Hkv, L, d);
        if (!long_segments) {
            int64_t missing = 0, first_missing = -1;
            for (int i = 1; i < NSEG; i++) {
                int found = st[i] == tail0; /* the last boundary starts the open tail */
                for (int64_t c = 0; c < n && !found; c++) found = s[c] == st[i];
                if (!found && !missing++) first_missing = st[i];
            }
            T_CHECK(missing == 0, "%s: %lld true segment starts are not chunk starts (first: %lld)", label,
                    (long long)missing, (long long)first_missing);
        }
        int64_t ne = model_starts(st, NSEG, &rp, exp);
        int64_t c = starts_mismatch(s, n, exp, ne);
        T_CHECK(tail0 == exp[ne - 1], "%s: the open tail starts at %lld, the model says %lld", label,
                (long long)tail0, (long long)exp[ne - 1]);
        T_CHECK(c < 0,
                "%s: %lld closed chunks, the model wants %lld; first difference at chunk %lld: got %lld, want %lld",
                label, (long long)n, (long long)(ne - 1), (long long)c, (long long)(c >= 0 && c < n ? s[c] : -1),
                (long long)(c >= 0 && c < ne ? exp[c] : -1));
        check_delay(ix, &rp, cnt, L, 0, label);
        /* the comparison can fail: one boundary moved by one position */
        if (ne > 2) {
            exp[1]++;
            T_CHECK(starts_mismatch(s, n, exp, ne) == 1, "%s: the chunk-start comparison misses a moved boundary",
                    label);
        }
        dhsa_kv_index_free(ix);
    }
    free(exp);
    free(cnt);
    free(k);
}

/* The online rule of the header, re-implemented from its text in double
 * precision: score(t), t >= 1 = mean over KV heads of 1 - cos(mean of the
 * min(w, t) keys before t, k[t]) (0 where a vector is zero), rounded to
 * fp32; when key `now` arrives its score joins the running mean and
 * population stddev, and the candidate t = now - nms is kept if its score
 * is the highest in [t - nms, now] (the earliest on ties), reaches mean +
 * threshold x stddev, and lies at least min_chunk (and, as the
 * implementation also demands, nms_window + 1) after the open chunk's
 * start; otherwise a chunk reaching max_chunk keys closes at now + 1.
 * k [Hkv][L][d]; writes every boundary to out (0 first, the open tail's
 * start last) and returns the count. */
static int64_t model_online(const float *k, int64_t Hkv, int64_t L, int64_t d, const dhsa_router_params *rp,
                            int64_t *out) {
    float *score = xcalloc((size_t)L + 1, sizeof(float));
    double *m = xcalloc((size_t)d, sizeof(double));
    double sn = 0, smean = 0, sm2 = 0;
    int64_t n = 0, open = 0;
    out[n++] = 0;
    for (int64_t now = 0; now < L; now++) {
        if (now >= 1) {
            const int64_t w = rp->sim_window < now ? rp->sim_window : now;
            double total = 0;
            for (int64_t g = 0; g < Hkv; g++) {
                const float *kt = k + (g * L + now) * d;
                double xy = 0, xx = 0, yy = 0;
                for (int64_t x = 0; x < d; x++) {
                    m[x] = 0;
                    for (int64_t u = now - w; u < now; u++) m[x] += k[(g * L + u) * d + x];
                    xy += m[x] * kt[x];
                    xx += m[x] * m[x];
                    yy += (double)kt[x] * kt[x];
                }
                total += xx > 0 && yy > 0 ? 1.0 - xy / sqrt(xx * yy) : 0.0;
            }
            score[now] = (float)(total / (double)Hkv);
            sn += 1;
            double delta = score[now] - smean;
            smean += delta / sn;
            sm2 += delta * (score[now] - smean);
        }
        const int64_t t = now - rp->nms_window;
        if (t >= 1) {
            const double sd = sn > 1 ? sqrt(sm2 / sn) : 0.0;
            int keep = score[t] >= smean + (double)rp->threshold * sd && t - open >= rp->min_chunk &&
                       t - open >= rp->nms_window + 1 && t - open <= rp->max_chunk;
            for (int64_t u = t - rp->nms_window > 1 ? t - rp->nms_window : 1; keep && u <= now; u++)
                if (u != t && (score[u] > score[t] || (score[u] == score[t] && u < t))) keep = 0;
            if (keep) {
                out[n++] = open = t;
                continue;
            }
        }
        if (now + 1 - open >= rp->max_chunk + rp->nms_window) out[n++] = open = open + rp->max_chunk;
    }
    free(m);
    free(score);
    return n;
}

/* Random keys (no structure) and the synthetic workload under several
 * parameter sets: every chunk in [min_chunk, max_chunk], the open tail
 * shorter than max_chunk, boundaries timed as the header says. */
static void test_similarity_lengths(void) {
    typedef struct {
        int64_t w, nms, mn, mx;
        float threshold;
        int synth;
    } pcase;
    const pcase cases[] = {
        {8, 8, 16, 256, 1.0f, 0}, {3, 2, 4, 24, 1.0f, 0},   {8, 4, 30, 40, 0.5f, 0}, {2, 0, 1, 7, -10.0f, 0},
        {8, 8, 32, 32, 1.0f, 0},  {16, 4, 8, 100, 2.5f, 0}, {8, 8, 16, 256, 1.0f, 1}, {4, 20, 5, 64, 0.0f, 1},
    };
    int64_t *cnt = NULL;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const pcase *pc = &cases[ci];
        dhsa_router_params rp = dhsa_router_default_params();
        rp.sim_window = pc->w, rp.nms_window = pc->nms, rp.min_chunk = pc->mn, rp.max_chunk = pc->mx;
        rp.threshold = pc->threshold;
        char label[160];
        snprintf(label, sizeof label, "similarity lengths %s w=%lld nms=%lld min=%lld max=%lld thr=%g",
                 pc->synth ? "synth" : "random", (long long)pc->w, (long long)pc->nms, (long long)pc->mn,
                 (long long)pc->mx, (double)pc->threshold);
        work W;
        memset(&W, 0, sizeof W);
        if (pc->synth) {
            if (!work_synth(&W, 3000, 2, 2, 32, 100 + ci)) continue;
        } else {
            W.Hq = 2, W.Hkv = 2, W.L = 3000, W.d = 32;
            W.k = xcalloc((size_t)(W.Hkv * W.L * W.d), sizeof(float));
            W.v = xcalloc((size_t)(W.Hkv * W.L * W.d), sizeof(float));
            W.q = xcalloc((size_t)(W.Hq * W.L * W.d), sizeof(float));
            rng_t r = {200 + ci};
            for (int64_t i = 0; i < W.Hkv * W.L * W.d; i++) W.k[i] = (float)rng_normal(&r);
        }
        free(cnt);
        cnt = xcalloc((size_t)(W.L + 1), sizeof(int64_t));
        dhsa_kv_index *ix = append_counting(&rp, W.k, W.Hkv, W.L, W.d, cnt, label);
        if (!ix) {
            work_free(&W);
            continue;
        }
        const int64_t *s;
        int64_t n = dhsa_kv_index_chunks(ix, &s);
        viol v;
        memset(&v, 0, sizeof v);
        int64_t shorter = 0;
        for (int64_t c = 0; c + 1 < n; c++) {
            int64_t len = s[c + 1] - s[c];
            shorter += len < rp.max_chunk;
            VIOL_IF(v, len < rp.min_chunk || len > rp.max_chunk, "chunk %lld [%lld, %lld) has %lld keys",
                    (long long)c, (long long)s[c], (long long)s[c + 1], (long long)len);
        }
        VIOL_REPORT(v, "min_chunk <= chunk length <= max_chunk", label);
        int64_t gap = rp.min_chunk > rp.nms_window + 1 ? rp.min_chunk : rp.nms_window + 1;
        T_CHECK(n >= 2 && (gap + rp.nms_window >= rp.max_chunk || shorter > 0),
                "%s: %lld chunks, %lld shorter than max_chunk: the similarity rule never fired", label, (long long)n,
                (long long)shorter);
        /* the last closed chunk and the open tail, through the layout
         * stats (chunk_mean x chunks = end of the closed chunks) */
        dhsa_layout *lay = ix_route(g_ctx, ix, &W, W.L - 1, 1, W.L, 0, label);
        if (lay) {
            dhsa_layout_stats ls;
            dhsa_layout_get_stats(lay, &ls);
            int64_t tail0 = llround(ls.chunk_mean * (double)ls.chunks);
            T_CHECK(ls.chunks == n && ls.chunk_min >= rp.min_chunk && ls.chunk_max <= rp.max_chunk &&
                        W.L - tail0 >= 0 && W.L - tail0 < rp.max_chunk + rp.nms_window,
                    "%s: stats: %lld chunks (index %lld), lengths %lld..%lld, open tail %lld keys", label,
                    (long long)ls.chunks, (long long)n, (long long)ls.chunk_min, (long long)ls.chunk_max,
                    (long long)(W.L - tail0));
            dhsa_layout_free(lay);
        }
        check_delay(ix, &rp, cnt, W.L, 0, label);
        /* the boundaries, exactly, against the header's rule */
        int64_t *exp = xcalloc((size_t)W.L + 2, sizeof(int64_t));
        int64_t ne = model_online(W.k, W.Hkv, W.L, W.d, &rp, exp);
        int64_t c = starts_mismatch(s, n, exp, ne);
        const int64_t tail0 = open_tail_start(ix, W.k, W.Hkv, W.L, W.d);
        T_CHECK(c < 0 && tail0 == exp[ne - 1],
                "%s: against the online rule: %lld closed chunks (model %lld), first difference at chunk %lld "
                "(got %lld, model %lld); open tail at %lld (model %lld)",
                label, (long long)n, (long long)(ne - 1), (long long)c, (long long)(c >= 0 && c < n ? s[c] : -1),
                (long long)(c >= 0 && c < ne ? exp[c] : -1), (long long)tail0, (long long)exp[ne - 1]);
        free(exp);
        dhsa_kv_index_free(ix);
        work_free(&W);
    }
    free(cnt);
}

/* ------------------------------------------------------------------------ */
/* 2b. LEARNED boundaries: the predictor run inside the index, key by key,
 * against (a) dhsa_route_boundaries on the whole sequence (LEARNED with
 * causal_boundaries = 1, which scores it with dhsa_predictor_score) and (b)
 * a model of the header's online rule written here over the probabilities
 * of dhsa_predictor_score. Both must give the same chunk starts exactly,
 * at every ubatch size (1 = decode) and length. */

/* The online rule on probabilities p [L] (window w): candidate t is judged
 * when the score of t + nms is final, i.e. at key t + nms + w - 1. out gets
 * the closed chunks' starts, then the open tail's start; returns their
 * count (closed chunks + 1). */
static int64_t model_learned(const float *p, int64_t L, int64_t w, const dhsa_router_params *rp, int64_t *out) {
    int64_t n = 0, open = 0;
    out[n++] = 0;
    for (int64_t now = 0; now < L; now++) {
        const int64_t s = now - (w - 1); /* the newest final score */
        if (s < 0) continue;
        const int64_t t = s - rp->nms_window;
        if (t >= 1) {
            int keep = p[t] >= rp->learned_threshold && t - open >= rp->min_chunk && t - open >= rp->nms_window + 1 &&
                       t - open <= rp->max_chunk;
            for (int64_t u = t - rp->nms_window > 1 ? t - rp->nms_window : 1; keep && u <= s; u++)
                if (u != t && (p[u] > p[t] || (p[u] == p[t] && u < t))) keep = 0;
            if (keep) {
                out[n++] = open = t;
                continue;
            }
        }
        if (s + 1 - open >= rp->max_chunk + rp->nms_window) out[n++] = open = open + rp->max_chunk;
    }
    return n;
}

/* Index chunk starts (closed + the open tail's start, nx of them) against
 * dhsa_route_boundaries' starts r[0 .. nr): the same up to the open tail,
 * then only pieces of at most max_chunk. Returns the first differing
 * position (or nx when the route's tail is malformed), -1 if they agree. */
static int64_t route_mismatch(const int64_t *x, int64_t nx, const int64_t *r, int64_t nr, int64_t L,
                              int64_t max_chunk) {
    int64_t c = 0;
    while (c < nx && c < nr && x[c] == r[c]) c++;
    if (c < nx) return c;
    for (int64_t i = nx - 1; i < nr; i++) {
        int64_t end = i + 1 < nr ? r[i + 1] : L;
        if (end <= r[i] || end - r[i] > max_chunk) return nx;
    }
    return -1;
}

typedef struct {
    int64_t w, nms, mn, mx;
    double q; /* threshold: this quantile of the probabilities */
} lcase;

/* One predictor and key set, every ubatch size: index vs route vs model. */
static void learned_case(const lcase *lc, int64_t L, int64_t Hkv, int64_t d, dhsa_type type, uint64_t seed) {
    const int64_t C = Hkv * d;
    char label[200];
    snprintf(label, sizeof label, "learned L=%lld C=%lld w=%lld nms=%lld min=%lld max=%lld q=%.2f %s", (long long)L,
             (long long)C, (long long)lc->w, (long long)lc->nms, (long long)lc->mn, (long long)lc->mx, lc->q,
             type == DHSA_F16 ? "f16" : "f32");
    dhsa_predictor *pr = NULL;
    if (dhsa_predictor_create_random(C, lc->w, 24, seed, &pr) != DHSA_OK) {
        T_CHECK(0, "%s: create_random: %s", label, dhsa_last_error());
        return;
    }
    /* keys: segments of a random direction per head plus noise, so that
     * the probabilities have structure; F16 keys are stored as F16 */
    rng_t r = {seed * 31 + 7};
    float *k = xcalloc((size_t)(Hkv * L * d), sizeof(float));
    uint16_t *kh = xcalloc((size_t)(Hkv * L * d), sizeof(uint16_t));
    {
        float *dir = xcalloc((size_t)(Hkv * d), sizeof(float));
        for (int64_t t = 0; t < L; t++) {
            if (t % 37 == 0 || rng_range(&r, 50) == 0)
                for (int64_t i = 0; i < Hkv * d; i++) dir[i] = (float)rng_normal(&r);
            for (int64_t g = 0; g < Hkv; g++)
                for (int64_t x = 0; x < d; x++)
                    k[(g * L + t) * d + x] = dir[g * d + x] + 0.3f * (float)rng_normal(&r);
        }
        free(dir);
        for (int64_t i = 0; i < Hkv * L * d; i++) {
            kh[i] = dhsa_f32_to_f16(k[i]);
            if (type == DHSA_F16) k[i] = dhsa_f16_to_f32(kh[i]); /* what the index and the router read */
        }
    }
    void *kdata = type == DHSA_F16 ? (void *)kh : (void *)k;
    dhsa_tensor K = dhsa_tensor_bhld(kdata, type, 1, Hkv, L, d);
    float *p = xcalloc((size_t)L, sizeof(float));
    T_CHECK(dhsa_predictor_score(g_ctx, pr, &K, 0, p) == DHSA_OK, "%s: score: %s", label, dhsa_last_error());
    dhsa_router_params rp = dhsa_router_default_params();
    rp.boundary = DHSA_BOUNDARY_LEARNED;
    rp.predictor = pr;
    rp.nms_window = lc->nms, rp.min_chunk = lc->mn, rp.max_chunk = lc->mx;
    rp.learned_threshold = quantile(p, L, lc->q);
    rp.causal_boundaries = 1;

    /* (b) the model */
    int64_t *exp = xcalloc((size_t)L + 2, sizeof(int64_t));
    const int64_t ne = model_learned(p, L, lc->w, &rp, exp);
    /* (a) the router on the whole sequence */
    int64_t cap = L / lc->mn + 3, nr = 0;
    int64_t *rs = xcalloc((size_t)cap, sizeof(int64_t));
    float *q = xcalloc((size_t)(Hkv * L * d), sizeof(float));
    dhsa_attn_desc a = dhsa_attn_default_desc();
    a.q = dhsa_tensor_bhld(q, DHSA_F32, 1, Hkv, L, d);
    a.k = K;
    a.v = K;
    a.causal = 1;
    dhsa_status st = dhsa_route_boundaries(g_ctx, &rp, &a, 0, rs, cap, &nr);
    T_CHECK(st == DHSA_OK, "%s: route_boundaries: %s", label, dhsa_last_error());
    int64_t c = route_mismatch(exp, ne, rs, nr, L, rp.max_chunk);
    T_CHECK(st != DHSA_OK || c < 0,
            "%s: dhsa_route (causal LEARNED) against the online model: %lld chunks (model %lld closed + tail), first "
            "difference at %lld (route %lld, model %lld)",
            label, (long long)nr, (long long)(ne - 1), (long long)c, (long long)(c >= 0 && c < nr ? rs[c] : -1),
            (long long)(c >= 0 && c < ne ? exp[c] : -1));

    /* the index, appended in ubatches of u keys */
    const int64_t ubs[] = {1, 3, 64, 65, 500, L};
    int64_t *cnt = xcalloc((size_t)L + 1, sizeof(int64_t)), *got = xcalloc((size_t)L + 2, sizeof(int64_t));
    for (size_t ui = 0; ui < sizeof ubs / sizeof ubs[0]; ui++) {
        const int64_t u = ubs[ui];
        if (u > L || (u == L && ui + 1 < sizeof ubs / sizeof ubs[0])) continue; /* L itself comes last */
        dhsa_kv_index *ix = ix_new(g_ctx, &rp, Hkv, d, L, label);
        if (!ix) break;
        int ok = 1;
        for (int64_t u0 = 0; u0 < L && ok; u0 += u) {
            dhsa_tensor part = K;
            part.data = (char *)kdata + (size_t)u0 * (size_t)d * dhsa_type_size(type);
            part.shape[2] = u < L - u0 ? u : L - u0;
            ok = dhsa_kv_index_append(ix, &part) == DHSA_OK;
            if (u == 1) cnt[u0 + 1] = dhsa_kv_index_chunks(ix, NULL);
        }
        T_CHECK(ok, "%s: append in ubatches of %lld: %s", label, (long long)u, dhsa_last_error());
        const int64_t *s;
        int64_t n = dhsa_kv_index_chunks(ix, &s);
        memcpy(got, s, (size_t)n * sizeof(int64_t));
        got[n] = open_tail_start(ix, k, Hkv, L, d);
        int64_t cm = starts_mismatch(s, n, exp, ne);
        T_CHECK(ok && cm < 0 && got[n] == exp[ne - 1],
                "%s, ubatch %lld: index against the online model: %lld closed chunks (model %lld), first difference "
                "at chunk %lld (index %lld, model %lld); open tail at %lld (model %lld)",
                label, (long long)u, (long long)n, (long long)(ne - 1), (long long)cm,
                (long long)(cm >= 0 && cm < n ? s[cm] : -1), (long long)(cm >= 0 && cm < ne ? exp[cm] : -1),
                (long long)got[n], (long long)exp[ne - 1]);
        int64_t cr = route_mismatch(got, n + 1, rs, nr, L, rp.max_chunk);
        T_CHECK(st != DHSA_OK || cr < 0,
                "%s, ubatch %lld: index against dhsa_route on the whole sequence: first difference at %lld (index "
                "%lld, route %lld)",
                label, (long long)u, (long long)cr, (long long)(cr >= 0 && cr <= n ? got[cr] : -1),
                (long long)(cr >= 0 && cr < nr ? rs[cr] : -1));
        if (u == 1 && L >= 300) check_delay(ix, &rp, cnt, L, lc->w - 1, label);
        dhsa_kv_index_free(ix);
    }
    if (L >= 1000) T_CHECK(ne >= 4, "%s: only %lld chunks: the rule barely fired", label, (long long)ne);

    /* the comparison can fail: the router with another threshold (the
     * next quantile up) disagrees with the index at this one */
    if (L >= 1000) {
        dhsa_router_params rp2 = rp;
        rp2.learned_threshold = quantile(p, L, lc->q + (1.0 - lc->q) / 2);
        int64_t nr2 = 0, *rs2 = xcalloc((size_t)cap, sizeof(int64_t));
        T_CHECK(dhsa_route_boundaries(g_ctx, &rp2, &a, 0, rs2, cap, &nr2) == DHSA_OK, "%s: route (threshold 2): %s",
                label, dhsa_last_error());
        T_CHECK(route_mismatch(exp, ne, rs2, nr2, L, rp.max_chunk) >= 0,
                "%s: thresholds %g and %g give the same boundaries: the comparison cannot fail", label,
                (double)rp.learned_threshold, (double)rp2.learned_threshold);
        free(rs2);
    }
    free(cnt);
    free(got);
    free(q);
    free(rs);
    free(exp);
    free(p);
    free(kh);
    free(k);
    dhsa_predictor_free(pr);
}

static void test_learned_boundaries(void) {
    const lcase cases[] = {
        {4, 8, 16, 256, 0.7}, /* the defaults, the published window */
        {4, 2, 4, 24, 0.5},   /* short chunks: many max_chunk cuts and decisions */
        {1, 0, 1, 7, 0.3},    /* w = 1 (no delay), no NMS window */
        {5, 3, 8, 40, 0.8},
    };
    const int64_t lengths[] = {1, 2, 9, 300, 2000};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++)
            learned_case(&cases[ci], lengths[li], 2, 16, DHSA_F32, 40 + ci);
    learned_case(&cases[0], 1500, 3, 13, DHSA_F16, 50); /* F16 cache, C = 39 (not a multiple of 8 or 16) */
    /* every ISA the CPU has (the scalar one included) gives the same
     * agreement: the index and the router use the same kernels */
    dhsa_isa best = dhsa_active_isa();
    for (int isa = DHSA_ISA_SCALAR; isa <= (int)best; isa++) {
        if (isa == (int)best || dhsa_set_isa((dhsa_isa)isa) != DHSA_OK) continue;
        learned_case(&cases[1], 2000, 2, 16, DHSA_F32, 60 + isa);
    }
    T_CHECK(dhsa_set_isa(best) == DHSA_OK, "could not restore ISA %s", dhsa_isa_name(best));
}

int main(void) {
    if (!open_ctx()) return t_report("test_kv_index_boundaries");

    test_fixed_boundaries();
    test_similarity_crafted(0, 7);
    test_similarity_crafted(0, 8);
    test_similarity_crafted(1, 9);
    test_similarity_crafted(1, 10);
    test_similarity_lengths();
    test_learned_boundaries();

    dhsa_ctx_free(g_ctx);
    return t_report("test_kv_index_boundaries");
}
