/* dist_route.c: the routing defaults across ranks (docs/dist.md, "The
 * routing defaults under mpirun"): the rows an answering eval ranks by
 * their exact attention and the chunks a decode step carries, each worked
 * out from the ranks' parts over their own keys (dhsa__exact_part,
 * src/route/carry.c) and merged, every rank alike. Called by dist.c
 * (dist_internal.h). Tested by tests/test_dist.c (mpirun: one process's
 * logits at the defaults) and tests/test_exact_rows.c (the parts).
 */
#include "dist/dist_internal.h"

#include "route/carry.h"
#include "route/rows.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* Where an answering eval's last rows rank their chunks by exact attention
 * (include/dhsa/route.h, exact_rows; docs/dist.md): every rank holds some
 * of each row's keys, so each works out its part over its own keys and the
 * parts are merged, every rank alike:
 *   the rows' queries are broadcast by their owners (a decode row is on
 *     every rank);
 *   pass A: each rank's largest score and sum of exponentials per row and
 *     head over its keys (dhsa__exact_part), all-gathered and merged into
 *     the row's own (max M, sum Z);
 *   pass B: each rank's masses per chunk with those, summed over each query
 *     block's rows, all-gathered and summed in rank order, then divided by
 *     the block's rows: the block's mean of its rows' exact mass, as
 *     dhsa__exact_mass gives it in one process (sums in another order).
 * The blocks then route by them (dhsa__kv_index_route_mass). */

/* The rows an eval of positions [len, end) ranks exactly: none, or the
 * last exact_rows, from the start of the query block (of its piece)
 * holding the first; a decode row (end = len + 1) alone. */
void dhsa__dist_exact_rows(dhsa__dist *s, int64_t len, int64_t end, int exact) {
    const int64_t S = s->stripe, R = s->dist->size, qb = s->q_block;
    s->nx = s->nxb = s->nxs = 0;
    if (!exact || !s->exact_rows) return;
    const int64_t x0 = end - s->exact_rows > len ? end - s->exact_rows : len;
    for (int64_t g = len; g < end;) {
        int64_t g1 = (g / S + 1) * S < end ? (g / S + 1) * S : end;
        if (g1 > x0) {
            int64_t e = g + ((x0 > g ? x0 : g) - g) / qb * qb;
            int64_t *sg = s->xseg[s->nxs++];
            sg[0] = e;
            sg[1] = g1 - e;
            sg[2] = end - len == 1 ? -1 : (g / S) % R; /* a decode row: every rank's */
            sg[3] = s->nx;
            sg[4] = s->nxb;
            for (int64_t b = e; b < g1; b += qb) {
                s->xblk[s->nxb][0] = s->nx + b - e;
                s->xblk[s->nxb][1] = g1 - b < qb ? g1 - b : qb;
                s->nxb++;
            }
            for (int64_t x = e; x < g1; x++) s->xpos[s->nx++] = x;
        }
        g = g1;
    }
}

typedef struct {
    dhsa__dist *s;
    dhsa_attn_desc a;
    const int64_t *starts;
    int64_t nc, nr, G, pass;
    atomic_int failed;
} exact_job;

/* pass A: task = (KV group, row); pass B: task = (KV group, block) */
static void exact_task(void *arg, int64_t task, int thread) {
    exact_job *j = arg;
    dhsa__dist *s = j->s;
    const int64_t Hq = s->in->n_head, G = j->G;
    (void)thread;
    dhsa_status st = DHSA_OK;
    if (j->pass == 0) {
        const int64_t g = task / s->nx, x = task % s->nx;
        st = dhsa__exact_part(&j->a, g, x, s->xpos[x], &s->xruns[0][0], j->nr, j->starts, j->nc, NULL,
                              s->xmz + (x * Hq + g * G) * 2, NULL);
    } else {
        const int64_t g = task / s->nxb, b = task % s->nxb;
        double *m = s->xm + (g * s->nxb + b) * (j->nc + 1);
        for (int64_t c = 0; c <= j->nc; c++) m[c] = 0;
        for (int64_t x = s->xblk[b][0]; x < s->xblk[b][0] + s->xblk[b][1] && !st; x++)
            st = dhsa__exact_part(&j->a, g, x, s->xpos[x], &s->xruns[0][0], j->nr, j->starts, j->nc,
                                  s->xmz + (x * Hq + g * G) * 2, NULL, m);
    }
    if (st) atomic_store(&j->failed, 1);
}

/* The running layer's exact masses of the eval's rows into xm [Hkv][nxb][nc
 * + 1] (every rank the same), nc and starts the index's chunks; cnt: the
 * keys this rank holds now. Every rank takes part in every exchange, a
 * failure included. */
dhsa_status dhsa__dist_exact(dhsa__dist *s, int64_t cnt, const int64_t *starts, int64_t nc) {
    const dhsa_model_info *in = s->in;
    const dhsa_dist *d = s->dist;
    const int64_t S = s->stripe, R = d->size, me = d->rank, Hq = in->n_head, hk = in->head_dim_k,
                  Hkv = in->n_head_kv, nx = s->nx, row = Hq * hk;
    char why[256] = "";
    if (nc > s->ncmax) /* every rank's index holds the same chunks: they fail together */
        return dhsa__fail(DHSA_ERR_INTERNAL, "context parallel: %lld chunks to rank exactly, %lld planned",
                          (long long)nc, (long long)s->ncmax);
    /* the rows' queries: a decode row's every rank has; a prefill's, from its owner */
    for (int64_t i = 0; i < s->nxs; i++) {
        const int64_t *sg = s->xseg[i];
        float *dst = s->xq + sg[3] * row;
        if (sg[2] < 0) {
            memcpy(dst, s->q, (size_t)row * sizeof(float));
            continue;
        }
        if (sg[2] == me)
            for (int64_t p = 0; p < s->n_pieces; p++)
                if (s->pieces[p][2] <= sg[0] && sg[0] < s->pieces[p][2] + s->pieces[p][1])
                    memcpy(dst, s->q + (s->pieces[p][0] + sg[0] - s->pieces[p][2]) * row,
                           (size_t)(sg[1] * row) * sizeof(float));
        if (d->bcast(d->user, dst, (size_t)(sg[1] * row) * sizeof(float), (int)sg[2], why))
            return dhsa__dist_fail("sharing the rows ranked exactly", why);
        if (sg[2] != me) s->dst.index += (double)(sg[1] * row) * sizeof(float);
    }
    /* this rank's keys: runs of a stripe each */
    int64_t nr = 0;
    for (int64_t j = 0; j < cnt; j += S, nr++) {
        s->xruns[nr][0] = j;
        s->xruns[nr][1] = cnt - j < S ? cnt - j : S;
        s->xruns[nr][2] = ((j / S) * R + me) * S;
    }
    exact_job job;
    memset(&job, 0, sizeof job);
    job.s = s;
    job.a = dhsa_attn_default_desc();
    job.a.q = dhsa_tensor_blhd(s->xq, DHSA_F32, 1, nx, Hq, hk);
    job.a.k = dhsa__dist_cache_view(s, 0, cnt);
    job.a.causal = 1;
    job.a.softcap = in->attn_softcap;
    job.a.scale = in->attn_scale > 0 ? in->attn_scale : 1.0f / sqrtf((float)hk);
    job.starts = starts;
    job.nc = nc;
    job.nr = nr;
    job.G = Hq / Hkv;
    atomic_init(&job.failed, 0);
    dhsa_parallel_for(s->ctx, Hkv * nx, exact_task, &job);
    dhsa_status st = atomic_load(&job.failed)
                         ? dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory ranking chunks by their exact attention")
                         : DHSA_OK;
    const size_t mz_bytes = (size_t)(nx * Hq * 2) * sizeof(double);
    if (d->allgather(d->user, s->xmz, mz_bytes, s->xmz_all, why)) return dhsa__dist_fail("merging the exact ranking", why);
    s->dst.index += (double)(R - 1) * (double)mz_bytes;
    for (int64_t x = 0; x < nx * Hq; x++) { /* the row's largest score and its sum, over the ranks */
        double M = -INFINITY, Z = 0;
        for (int64_t q = 0; q < R; q++) {
            const double m = s->xmz_all[(q * nx * Hq + x) * 2];
            M = m > M ? m : M;
        }
        for (int64_t q = 0; q < R && M > -INFINITY; q++) {
            const double *mz = s->xmz_all + (q * nx * Hq + x) * 2;
            if (mz[1] > 0) Z += mz[1] * exp(mz[0] - M);
        }
        s->xmz[2 * x] = M;
        s->xmz[2 * x + 1] = Z;
    }
    job.pass = 1;
    dhsa_parallel_for(s->ctx, Hkv * s->nxb, exact_task, &job);
    if (!st && atomic_load(&job.failed))
        st = dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory ranking chunks by their exact attention");
    const int64_t nm = Hkv * s->nxb * (nc + 1);
    if (d->allgather(d->user, s->xm, (size_t)nm * sizeof(double), s->xm_all, why))
        return dhsa__dist_fail("merging the exact ranking", why);
    s->dst.index += (double)(R - 1) * (double)nm * sizeof(double);
    for (int64_t g = 0; g < Hkv; g++)
        for (int64_t b = 0; b < s->nxb; b++) {
            double *m = s->xm + (g * s->nxb + b) * (nc + 1);
            for (int64_t c = 0; c <= nc; c++) {
                double t = 0;
                for (int64_t q = 0; q < R; q++) t += s->xm_all[q * nm + (g * s->nxb + b) * (nc + 1) + c];
                m[c] = t / (double)s->xblk[b][1];
            }
        }
    return st;
}

/* The chunk holding position t (starts [nc + 1] ascending); nc past the
 * last closed chunk. */
static int64_t chunk_at(const int64_t *starts, int64_t nc, int64_t t) {
    if (t >= starts[nc]) return nc;
    int64_t lo = 0, hi = nc; /* starts[lo] <= t < starts[hi] */
    while (hi - lo > 1) {
        const int64_t mid = (lo + hi) / 2;
        if (starts[mid] <= t) lo = mid;
        else hi = mid;
    }
    return lo;
}

/* Rank me's keys among the global ranges rg [n][2] (ascending), in its
 * first cnt slots, as runs (first slot, count, position) into out (NULL:
 * only counted); returns how many. */
static int64_t my_runs(const dhsa__dist *s, const int64_t *rg, int64_t n, int64_t cnt, int64_t (*out)[3]) {
    const int64_t S = s->stripe, R = s->dist->size, me = s->dist->rank;
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++)
        for (int64_t x = rg[2 * i]; x < rg[2 * i + 1];) {
            const int64_t x1 = (x / S + 1) * S < rg[2 * i + 1] ? (x / S + 1) * S : rg[2 * i + 1];
            const int64_t slot = (x / S / R) * S + x % S;
            if ((x / S) % R == me && slot < cnt) {
                if (out) {
                    out[k][0] = slot;
                    out[k][1] = (x1 - x < cnt - slot ? x1 - x : cnt - slot);
                    out[k][2] = x;
                }
                k++;
            }
            x = x1;
        }
    return k;
}

/* The chunks a decode step hands the next (route/carry.h; docs/dhsa.md,
 * "Chunks carried from one decode step to the next"), the step's row
 * (position p, query s->q) having read the keys of gl: each group's share
 * of the row's attention per chunk, as dhsa__carry_chunks works it out in
 * one process, from the ranks' parts (dhsa__exact_part over the keys of
 * gl each holds) merged as dist_exact merges them. out [Hkv][DHSA_CARRY_MAX]
 * (every rank the same). Every rank takes part in every exchange. */
dhsa_status dhsa__dist_carry(dhsa__dist *s, const dhsa_layout *gl, int64_t p, int64_t cnt, const int64_t *starts,
                             int64_t nc, double share, int64_t *out) {
    const dhsa_model_info *in = s->in;
    const dhsa_dist *d = s->dist;
    const int64_t R = d->size, Hq = in->n_head, hk = in->head_dim_k, Hkv = in->n_head_kv, G = Hq / Hkv;
    char why[256] = "";
    dhsa_status st = DHSA_OK;
    for (int64_t x = 0; x < Hkv * DHSA_CARRY_MAX; x++) out[x] = -1;
    if (nc > s->ncmax)
        return dhsa__fail(DHSA_ERR_INTERNAL, "context parallel: %lld chunks to carry from, %lld planned", (long long)nc,
                          (long long)s->ncmax);
    dhsa_attn_desc a = dhsa_attn_default_desc();
    a.q = dhsa_tensor_blhd(s->q, DHSA_F32, 1, 1, Hq, hk);
    a.k = dhsa__dist_cache_view(s, 0, cnt);
    a.causal = 1;
    a.softcap = in->attn_softcap;
    a.scale = in->attn_scale > 0 ? in->attn_scale : 1.0f / sqrtf((float)hk);
    int64_t(*runs)[3] = NULL;
    for (int pass = 0; pass < 2; pass++) {
        for (int64_t g = 0; g < Hkv; g++) {
            double *mz = s->xmz + g * G * 2, *m = s->xm + g * (nc + 1);
            if (pass == 0)
                for (int64_t h = 0; h < G; h++) {
                    mz[2 * h] = -INFINITY;
                    mz[2 * h + 1] = 0;
                }
            else
                for (int64_t c = 0; c <= nc; c++) m[c] = 0;
            const int64_t *rg;
            int64_t n;
            if (st || dhsa_layout_get(gl, 0, g, 0, &rg, &n) || n <= 0) continue;
            const int64_t k = my_runs(s, rg, n, cnt, NULL);
            if (k == 0) continue;
            runs = malloc((size_t)k * sizeof *runs);
            if (!runs) {
                st = dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory finding the chunks a decode step carries");
                continue;
            }
            my_runs(s, rg, n, cnt, runs);
            st = dhsa__exact_part(&a, g, 0, p, &runs[0][0], k, starts, nc, pass ? s->xmz + g * G * 2 : NULL,
                                  pass ? NULL : mz, pass ? m : NULL);
            free(runs);
            runs = NULL;
        }
        if (pass == 0) {
            const size_t bytes = (size_t)(Hq * 2) * sizeof(double);
            if (d->allgather(d->user, s->xmz, bytes, s->xmz_all, why)) return dhsa__dist_fail("merging the carried chunks", why);
            s->dst.partial += (double)(R - 1) * (double)bytes;
            for (int64_t x = 0; x < Hq; x++) {
                double M = -INFINITY, Z = 0;
                for (int64_t q = 0; q < R; q++) M = s->xmz_all[(q * Hq + x) * 2] > M ? s->xmz_all[(q * Hq + x) * 2] : M;
                for (int64_t q = 0; q < R && M > -INFINITY; q++) {
                    const double *e = s->xmz_all + (q * Hq + x) * 2;
                    if (e[1] > 0) Z += e[1] * exp(e[0] - M);
                }
                s->xmz[2 * x] = M;
                s->xmz[2 * x + 1] = Z;
            }
        }
    }
    /* only the chunks the step read can hold a share: the same list on
     * every rank (gl is every rank's), packed in place (an entry never
     * moves up), exchanged, summed in rank order */
    int64_t nm = 0;
    for (int64_t g = 0; g < Hkv; g++) {
        const int64_t *rg;
        int64_t n, last = -1;
        if (dhsa_layout_get(gl, 0, g, 0, &rg, &n)) n = 0;
        for (int64_t i = 0; i < n; i++)
            for (int64_t c = chunk_at(starts, nc, rg[2 * i]); c < nc && starts[c] < rg[2 * i + 1]; c++) {
                if (c == last) continue;
                s->xlist[nm] = g * (nc + 1) + c;
                s->xm[nm++] = s->xm[g * (nc + 1) + c];
                last = c;
            }
    }
    if (d->allgather(d->user, s->xm, (size_t)nm * sizeof(double), s->xm_all, why))
        return dhsa__dist_fail("merging the carried chunks", why);
    s->dst.partial += (double)(R - 1) * (double)nm * sizeof(double);
    if (st) return st;
    for (int64_t x = 0; x < Hkv * (nc + 1); x++) s->xm_all[R * nm + x] = 0;
    for (int64_t x = 0; x < nm; x++) {
        double t = 0;
        for (int64_t q = 0; q < R; q++) t += s->xm_all[q * nm + x];
        s->xm_all[R * nm + s->xlist[x]] = t;
    }
    for (int64_t g = 0; g < Hkv; g++)
        dhsa__carry_pick(s->xm_all + R * nm + g * (nc + 1), nc, share, out + g * DHSA_CARRY_MAX);
    return DHSA_OK;
}

/* ------------------------------------------------- the keys left out --- */

/* As one process's dhsa__rest_sync (route/rest.h), where every rank holds
 * some of each chunk's keys: each rank sums its own keys and values per
 * stale chunk and KV head (in double, in position order), the sums are
 * all-gathered and added in rank order, and every rank makes the same
 * summaries from them. In batches of chunks that fit the shard buffers. */
dhsa_status dhsa__dist_rest(dhsa__dist *s, int64_t cnt, const int64_t *starts, int64_t nc) {
    dhsa__rest *r = s->io->rest;
    const dhsa_dist *d = s->dist;
    const int64_t S = s->stripe, R = d->size, me = d->rank, Hkv = s->in->n_head_kv, dk = s->in->head_dim_k,
                  dv = s->in->head_dim_v, per = Hkv * (dk + dv);
    const int64_t from = dhsa__rest_stale(r, starts, nc);
    int64_t batch = (int64_t)(s->dbuf_bytes / ((size_t)(R * per) * sizeof(double)));
    if (batch < 1) batch = 1;
    const dhsa_tensor kc = dhsa__dist_cache_view(s, 0, cnt), vc = dhsa__dist_cache_view(s, 1, cnt);
    float *row = malloc((size_t)(dk > dv ? dk : dv) * sizeof(float));
    char why[256] = "";
    dhsa_status st = DHSA_OK;
    if (from == nc) st = dhsa__rest_set(r, starts, nc, from, from, NULL);
    for (int64_t c0 = from; c0 < nc; c0 += batch) { /* the same batches on every rank (the index is alike) */
        const int64_t c1 = nc - c0 < batch ? nc : c0 + batch;
        const size_t bytes = (size_t)((c1 - c0) * per) * sizeof(double);
        void *own0, *own1;
        double *mine = dhsa__dist_scratch(s, 0, bytes, &own0), *all = dhsa__dist_scratch(s, 1, (size_t)R * bytes, &own1);
        if (!mine || !all || !row) {
            free(own0);
            free(own1);
            free(row);
            return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory for the summaries' sums");
        }
        memset(mine, 0, bytes);
        int64_t c = c0; /* the chunk of position x: positions ascend over the stripes */
        for (int64_t j = 0; j < cnt; j += S) { /* this rank's stripes, in position order */
            const int64_t p0 = ((j / S) * R + me) * S, n = cnt - j < S ? cnt - j : S;
            const int64_t x0 = p0 > starts[c0] ? p0 : starts[c0], x1 = p0 + n < starts[c1] ? p0 + n : starts[c1];
            for (int64_t x = x0; x < x1; x++) {
                while (starts[c + 1] <= x) c++;
                for (int64_t g = 0; g < Hkv; g++) {
                    double *acc = mine + ((c - c0) * Hkv + g) * (dk + dv);
                    const float *kr = dhsa__row_f32(&kc, 0, g, j + x - p0, dk, row);
                    for (int64_t e = 0; e < dk; e++) acc[e] += kr[e];
                    const float *vr = dhsa__row_f32(&vc, 0, g, j + x - p0, dv, row);
                    for (int64_t e = 0; e < dv; e++) acc[dk + e] += vr[e];
                }
            }
        }
        const int bad = d->allgather(d->user, mine, bytes, all, why);
        if (!bad) {
            const int64_t nv = (c1 - c0) * per;
            for (int64_t i = 0; i < nv; i++) {
                double t = 0;
                for (int64_t q = 0; q < R; q++) t += all[q * nv + i];
                mine[i] = t;
            }
            s->dst.index += (double)((R - 1) * (int64_t)bytes);
            if (!st) st = dhsa__rest_set(r, starts, nc, c0, c1, mine);
        }
        free(own0);
        free(own1);
        if (bad) {
            free(row);
            return dhsa__dist_fail("gathering the summaries' sums", why);
        }
    }
    free(row);
    return st;
}
