/* dist_internal.h: what src/dist's files share (dist.c, dist_route.c):
 * one rank's state and the helpers both use. Private to src/dist.
 */
#ifndef DHSA_DIST_INTERNAL_H
#define DHSA_DIST_INTERNAL_H

#include "dist/dist.h"

#include "attn/layout.h"
#include "core/internal.h"

struct dhsa__dist {
    dhsa_ctx *ctx;
    const dhsa_model_info *in;
    const dhsa_dist *dist;      /* the transport */
    dhsa_type kv_type;
    double fetch_share;         /* dhsa_session_params.dist_fetch_share */
    int64_t n_ctx, cap;         /* the job's context; the most positions of one rank */
    int64_t stripe;             /* position p is rank (p / stripe) % size's */
    float *q, *kt, *vt, *att;   /* the session's forward buffers (dist.h) */
    void *kv;                   /* the session's cache base: a placeholder for routing calls */
    const dhsa__dist_layer_io *io; /* the running layer */
    int64_t len, len_loc;       /* positions committed, and of those, this rank's */
    int mode;                   /* the running eval: 1 a sharded prefill, 2 a decode row on every rank */
    int64_t dist_end;           /* a sharded prefill: the context's length after it */
    int64_t n_rows;             /* this rank's rows in it */
    int64_t n_pieces, max_pieces; /* ... and its runs of consecutive positions in it */
    int64_t (*pieces)[3];       /* [max_pieces]: first row, rows, first position */
    int64_t (*wrg)[2];          /* [cap / S + 2] sliding windows: the tails of this rank's stripes, local slots */
    int64_t *rowpos;            /* [cap] the rows' positions */
    int32_t *own;               /* [cap] the rows' ids */
    float *o2, *lse1, *lse2;    /* partial outputs and LSEs */
    float *krow;                /* [n_head_kv][hd_k] a decode key as the cache holds it */
    float *gather;              /* [R][Hq (hv + 1)] every rank's decode partial */
    /* a DHSA prefill's lists (work_bytes: how many of each) */
    int64_t nl, rmax, tmp_cap;  /* request lists per rank; ranges in one list; sub_layout's ranges */
    dhsa_layout **gl;           /* [max_pieces] the pieces' routed layouts */
    int64_t *nreq, *ngot;       /* [R nl] ranges asked of each rank (per list), and asked of this one */
    int64_t **req, **pre;       /* [R nl] each list's ranges and prefix sums, in reqs / pres */
    int64_t *reqs, *pres;       /* [R nl rmax][2] the lists back to back, in rank order (the outbox); [R nl (rmax + 1)] */
    int64_t *inbox;             /* [R nl rmax][2] the lists other ranks ask of this one */
    size_t *sb, *rb;            /* [R] bytes sent to / received from each rank */
    int64_t *nh;                /* [Hkv] keys received per KV head */
    int32_t *marks;             /* [cap + 1] coverage deltas of one union (zero between uses) */
    int64_t *tmp;               /* [tmp_cap][2] one block's ranges in another rank's slots */
    /* a fetch budget's (fetch_share > 0) */
    int64_t groups, max_chunks;
    unsigned char *allowed, *none; /* [groups][max_chunks]: the chunks a block may select; none, all 0 */
    double *agg;                /* [groups][max_chunks] the blocks' summed per-key weight of each chunk */
    void *order;                /* [max_chunks] chunk_weight */
    int32_t *fmarks;            /* [groups][R][cap + 1] coverage deltas of what is read anyway */
    int64_t *fixed, *nfixed;    /* [groups][R][rmax][2] those ranges, [groups][R] their counts */
    int64_t *left;              /* [2 R] budget left, keys needed, per rank */
    /* the exact ranking of an answering eval's last rows (exact_rows, dist_exact) */
    int64_t exact_rows;         /* the router's exact_rows; 0: off */
    int64_t q_block;            /* the router's query block (divides 64) */
    int64_t xmax, xbmax, ncmax; /* the most rows, query blocks and chunks of one ranking */
    int64_t nx, nxb, nxs;       /* the running eval's: rows (0: none), blocks, segments */
    float *xq;                  /* [xmax][Hq][hk] the rows' queries, position order */
    int64_t *xpos;              /* [xmax] their positions */
    int64_t (*xblk)[2];         /* [xbmax] each block's first row, rows */
    int64_t (*xseg)[5];         /* [xbmax] position, rows, owner rank, first row, first block */
    int64_t (*xruns)[3];        /* [cap / S + 2] this rank's keys: first slot, count, position */
    double *xmz, *xmz_all;      /* [xmax][Hq][2], [R][xmax][Hq][2]: largest score and sum, here / every rank's */
    double *xm, *xm_all;        /* [Hkv][xbmax][ncmax + 1], [R + 1][...]: the blocks' masses, here / every rank's */
    int64_t *xlist;             /* [Hkv][ncmax + 1] the carried chunks' candidates (dist_carry) */
    void *block;                /* the ctx allocation holding the buffers above */
    char *dbuf[2];              /* two shard buffers: one layer's K and V of cap positions */
    size_t dbuf_bytes;
    dhsa_dist_stats dst;
};

/* Shard buffer i (0, 1) where bytes fit in it, else a malloc'd block
 * (*own, freed by the caller; NULL when out of memory). */
void *dhsa__dist_scratch(dhsa__dist *s, int i, size_t bytes, void **own);
/* The view of the running layer's cache holding its first n keys. */
dhsa_tensor dhsa__dist_cache_view(const dhsa__dist *s, int is_v, int64_t n);
/* A transport failure's status, its sentence naming what failed. */
dhsa_status dhsa__dist_fail(const char *what, const char *why);

/* dist_route.c. The rows an eval of positions [len, end) ranks exactly
 * (exact: the session says this eval answers, or is the decode step after
 * one) into s->nx / xpos / xblk / xseg. */
void dhsa__dist_exact_rows(dhsa__dist *s, int64_t len, int64_t end, int exact);
/* The running layer's exact masses of those rows into s->xm [Hkv][nxb][nc
 * + 1] (every rank the same); cnt the keys this rank holds, starts / nc the
 * index's chunks. Every rank takes part in every exchange. */
dhsa_status dhsa__dist_exact(dhsa__dist *s, int64_t cnt, const int64_t *starts, int64_t nc);
/* The chunks a decode step (position p, layout gl) hands the next: out
 * [Hkv][DHSA_CARRY_MAX], every rank the same. Every rank takes part. */
dhsa_status dhsa__dist_carry(dhsa__dist *s, const dhsa_layout *gl, int64_t p, int64_t cnt, const int64_t *starts,
                             int64_t nc, double share, int64_t *out);

/* The running layer's summaries (io->rest) in step with the index's
 * chunks starts / nc, made from the ranks' sums over their own keys (cnt
 * of them). Every rank takes part in every exchange. */
dhsa_status dhsa__dist_rest(dhsa__dist *s, int64_t cnt, const int64_t *starts, int64_t nc);

#endif
