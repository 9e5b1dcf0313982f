/* attn_tiled.c: dense attention by tiles with an online softmax. Never
 * builds an Lq x Lk matrix: the extra memory is one workspace per thread of
 * O(W * (d + dv + BC)) floats, independent of Lq and Lk.
 *
 * A task is (batch, KV head, query tile). The queries of one KV group (the
 * G = Hq/Hkv query heads that read the same K/V) are stacked as columns
 * u = row * G + head_in_group, W per tile (W = 64, or 16 when the whole
 * group has at most 16 queries: decode), so each K/V block is loaded once
 * for all heads of the group. Keys are visited in blocks of BC rows over the
 * union of the tile's allowed ranges; the per-ISA micro-kernels (kern.h) do
 * the scores, the softmax step and the P.V update. A tile of at most
 * DHSA_NARROW queries (decode) keeps them as rows instead, so K and V rows
 * stream through full-width vector loads. F16/BF16/Q8_0 K/V rows are
 * widened (exactly) into a block buffer, or read in place by the narrow
 * kernels of ISAs that have them (kern.h): either way the same F32
 * arithmetic as over an F32 view of the same values, bitwise. Each task's arithmetic is
 * fixed, so results do not depend on the thread count.
 *
 * Split-K (few queries, long keys: decode). A call whose query blocks hold
 * at most 16 columns (the W = 16 tiles) and that has at most
 * SPLIT_SLOTS / 2 tiles in all would leave threads idle (gemma-3-270m has
 * one KV head: one task per decode call). Such a tile's keys, in the order
 * they are visited, are cut into pieces of S keys, S a multiple of BC fixed
 * by the tile's key count alone (split_piece), never by the thread count;
 * each piece is a task that leaves its unnormalised output and (m, l) in a
 * slot of the workspace, and a second pass merges a tile's pieces in
 * ascending order in double precision (the LSE merge). So the results are
 * bitwise the same for any number of threads; they differ from the
 * unsplit online softmax by float reassociation only. docs/attention.md,
 * "Split-K decode".
 *
 * Tested by tests/test_attn.c against the double-precision reference.
 */
#include "attn/attn_internal.h"
#include "attn/kern.h"
#include "attn/layout.h"

#define ALIGNF 16 /* floats per 64 bytes */

typedef struct {
    const dhsa_attn_desc *a;
    const dhsa__attn_problem *p;
    const dhsa_attn_kernels *kern;
    int W;
    int64_t n_tiles;   /* per (batch, KV head) */
    int64_t q_block;   /* query rows per block: the layout's, or Lq (dense) */
    int64_t sub_tiles; /* tiles per query block */
    int k_direct, v_direct;
    int k_rows16, v_rows16; /* narrow tiles read 16-bit rows in place (kern.h) */
    int k_rows_q8, v_rows_q8; /* ... and Q8_0 rows */
    char *ws;
    size_t ws_per_thread;
    /* split-K (see the top): slots partial results per tile, 1 = none */
    int64_t n_units;    /* tiles of the call: B * Hkv * n_tiles */
    int64_t slots;      /* pieces a tile may be cut into */
    int64_t nc_max;     /* columns a tile holds at most */
    size_t slot_floats; /* per slot: O [nc_max][dv], m [nc_max], l [nc_max] */
    float *part;        /* [n_units][slots][slot_floats] */
} job;

/* Per-thread workspace, in floats, each part rounded to 64 bytes. */
typedef struct {
    size_t qt, ot, s, kbuf, vbuf, mla, kadd, bounds, total;
} ws_layout;

/* Query rows per block: a tile never spans two blocks of a layout. */
static int64_t q_block_of(const dhsa__attn_problem *p, const dhsa_attn_desc *a) {
    return a->layout ? a->layout->q_block : (p->Lq > 0 ? p->Lq : 1);
}

static int64_t tile_width(const dhsa__attn_problem *p, const dhsa_attn_desc *a) {
    int64_t rows = q_block_of(p, a) < p->Lq ? q_block_of(p, a) : p->Lq;
    return rows * p->G <= 16 ? 16 : 64;
}

/* Split-K: at most SPLIT_SLOTS pieces per call in all (so the partials
 * stay below SPLIT_SLOTS * 16 * (dv + 2) floats, whatever Lq and Lk), and
 * at least SPLIT_MIN_KEYS keys per piece (a piece's fixed costs, packing
 * the queries and writing its slot, stay small against its keys). */
#define SPLIT_SLOTS 64
#define SPLIT_MIN_KEYS 512

static int64_t n_tiles_of(const dhsa__attn_problem *p, const dhsa_attn_desc *a, int64_t *sub_tiles) {
    const int64_t qb = q_block_of(p, a), W = tile_width(p, a);
    const int64_t full_rows = qb < p->Lq ? qb : p->Lq;
    *sub_tiles = (full_rows * p->G + W - 1) / W;
    return (p->Lq + qb - 1) / qb * *sub_tiles;
}

/* Columns of the widest tile. */
static int64_t nc_max_of(const dhsa__attn_problem *p, const dhsa_attn_desc *a) {
    const int64_t qb = q_block_of(p, a), W = tile_width(p, a);
    const int64_t cols = (qb < p->Lq ? qb : p->Lq) * p->G;
    return cols < W ? cols : W;
}

/* Slots per tile: how many pieces a tile's keys may be cut into; 1 = no
 * split. Depends on the shapes only (never the thread count). */
static int64_t split_slots(const dhsa__attn_problem *p, const dhsa_attn_desc *a) {
    if (tile_width(p, a) != 16) return 1;
    int64_t sub, units = p->B * p->Hkv * n_tiles_of(p, a, &sub);
    int64_t s = SPLIT_SLOTS / (units > 0 ? units : 1);
    int64_t by_keys = (p->Lk + SPLIT_MIN_KEYS - 1) / SPLIT_MIN_KEYS;
    if (by_keys < s) s = by_keys;
    return s >= 2 ? s : 1;
}

/* Keys per piece for a tile that visits count keys: a multiple of BC (so
 * a piece's blocks are those of the unsplit visit), at least
 * SPLIT_MIN_KEYS, and few enough pieces to fit the slots. */
static int64_t split_piece(int64_t count, int64_t slots) {
    int64_t s = (count + slots - 1) / slots;
    s = (s + DHSA_BC - 1) / DHSA_BC * DHSA_BC;
    return s > SPLIT_MIN_KEYS ? s : SPLIT_MIN_KEYS;
}

static size_t slot_floats_of(const dhsa__attn_problem *p, const dhsa_attn_desc *a) {
    return dhsa__align_up((size_t)nc_max_of(p, a) * (size_t)(p->dv + 2), ALIGNF);
}

static int direct_rows(const dhsa_tensor *t) { return t->type == DHSA_F32 && t->stride[3] == 1; }
static int kern16(const dhsa_attn_kernels *k, const dhsa_tensor *t) {
    return k && (t->type == DHSA_F16 || t->type == DHSA_BF16) && t->stride[3] == 1;
}
/* Q8_0 views always have unit dim stride (attn.c checks). */
static int kern_q8(const dhsa_tensor *t) { return t->type == DHSA_Q8_0; }

static ws_layout layout(const dhsa__attn_problem *p, const dhsa_attn_desc *a, int k_direct,
                        int v_direct) {
    size_t W = (size_t)tile_width(p, a);
    ws_layout l;
    size_t dq = dhsa__align_up((size_t)p->d, 16);
    size_t qt = (size_t)p->d * W, qr = DHSA_NARROW * dq;
    l.qt = dhsa__align_up(qt > qr ? qt : qr, ALIGNF);
    l.ot = dhsa__align_up((size_t)p->dv * W, ALIGNF);
    l.s = dhsa__align_up((size_t)DHSA_BC * W, ALIGNF);
    /* gathering buffers: for converted K/V, and for sparse blocks that span
     * several ranges */
    int gather = a->layout != NULL;
    l.kbuf = k_direct && !gather ? 0 : dhsa__align_up((size_t)DHSA_BC * (size_t)p->d, ALIGNF);
    l.vbuf = v_direct && !gather ? 0 : dhsa__align_up((size_t)DHSA_BC * (size_t)p->dv, ALIGNF);
    l.mla = dhsa__align_up(3 * W, ALIGNF);
    l.kadd = dhsa__align_up(DHSA_BC, ALIGNF);
    l.bounds = dhsa__align_up(2 * W * 2 + 2 * DHSA_BC, ALIGNF); /* lo, hi [W], keys [BC]: int64 */
    l.total = l.qt + l.ot + l.s + l.kbuf + l.vbuf + l.mla + l.kadd + l.bounds;
    return l;
}

size_t dhsa__attn_tiled_workspace(const dhsa_ctx *ctx, const dhsa__attn_problem *p,
                                  const dhsa_attn_desc *a) {
    ws_layout l = layout(p, a, direct_rows(&a->k), direct_rows(&a->v));
    size_t bytes = (size_t)dhsa_ctx_n_threads(ctx) * l.total * sizeof(float);
    int64_t slots = split_slots(p, a);
    if (slots > 1) {
        int64_t sub, units = p->B * p->Hkv * n_tiles_of(p, a, &sub);
        bytes += (size_t)units * (size_t)slots * slot_floats_of(p, a) * sizeof(float);
    }
    return bytes;
}

const dhsa_attn_kernels *dhsa__attn_kernels(void) {
    switch (dhsa_active_isa()) {
#if defined(__x86_64__)
    case DHSA_ISA_AVX512: return &dhsa__kern_avx512;
    case DHSA_ISA_AVX2: return &dhsa__kern_avx2;
#endif
    default: return &dhsa__kern_scalar;
    }
}

/* Copies rows keys[0..n) of a strided typed view into dst[n][cols] as F32
 * (Q8_0 rows dequantized: exact). */
static void gather_rows(const dhsa_attn_kernels *kern, const dhsa_tensor *t, int64_t b, int64_t h,
                        const int64_t *keys, int n, int64_t cols, float *dst) {
    for (int j = 0; j < n; j++) {
        const void *row = dhsa__at(t, b, h, keys[j]);
        if (t->type == DHSA_Q8_0)
            kern->widen_q8(row, cols, dst + j * cols);
        else if (t->type == DHSA_F32 && t->stride[3] == 1)
            memcpy(dst + j * cols, row, (size_t)cols * sizeof(float));
        else if (t->stride[3] == 1)
            kern->widen(row, t->type == DHSA_BF16, cols, dst + j * cols);
        else
            for (int64_t c = 0; c < cols; c++) dst[j * cols + c] = dhsa__load(row, t->type, c * t->stride[3]);
    }
}

/* A tile's place in the call and its queries' key ranges. */
typedef struct {
    int64_t b, g, qb, r0, u0;
    int ncols;
    int64_t jlo, jhi, inner_lo, inner_hi; /* union and intersection of the ranges */
    const int64_t *seg;                   /* the key segments to visit */
    int64_t nseg, count;                  /* count: keys visited in all */
} tile_info;

/* Fills ti for tile `unit` (lo, hi: [W] per column); 0 if the tile is
 * empty (the last query block is shorter). */
static int tile_setup(const job *jb, int64_t unit, int64_t *lo, int64_t *hi, tile_info *ti) {
    const dhsa_attn_desc *a = jb->a;
    const dhsa__attn_problem *p = jb->p;
    const int64_t G = p->G;
    /* Causal tiles grow with their index: hand the big ones out first. */
    int64_t t = unit % jb->n_tiles, bg = unit / jb->n_tiles;
    if (a->causal) t = jb->n_tiles - 1 - t;
    ti->b = bg / p->Hkv;
    ti->g = bg % p->Hkv;
    /* tile t = sub-tile s of query block qb; columns u0.. of the block */
    ti->qb = t / jb->sub_tiles;
    ti->r0 = ti->qb * jb->q_block;
    const int64_t r1 = ti->r0 + jb->q_block < p->Lq ? ti->r0 + jb->q_block : p->Lq;
    ti->u0 = (t % jb->sub_tiles) * jb->W;
    const int64_t block_cols = (r1 - ti->r0) * G;
    if (ti->u0 >= block_cols) return 0;
    ti->ncols = (int)(block_cols - ti->u0 < jb->W ? block_cols - ti->u0 : jb->W);
    ti->jlo = p->Lk, ti->jhi = 0, ti->inner_lo = 0, ti->inner_hi = p->Lk;
    for (int i = 0; i < ti->ncols; i++) {
        int64_t row = ti->r0 + (ti->u0 + i) / G;
        dhsa__attn_key_range(a, p->Lk, a->q_pos0 + row, &lo[i], &hi[i]);
        if (lo[i] < hi[i]) {
            if (lo[i] < ti->jlo) ti->jlo = lo[i];
            if (hi[i] > ti->jhi) ti->jhi = hi[i];
        }
        if (lo[i] > ti->inner_lo) ti->inner_lo = lo[i];
        if (hi[i] < ti->inner_hi) ti->inner_hi = hi[i];
    }
    /* The key segments to visit: the tile's allowed span, or the layout's
     * ranges of this block clipped to it. */
    ti->seg = NULL;
    ti->nseg = 1;
    if (a->layout) dhsa_layout_get(a->layout, ti->b, ti->g, ti->qb, &ti->seg, &ti->nseg);
    ti->count = 0;
    if (!ti->seg) {
        ti->count = ti->jhi > ti->jlo ? ti->jhi - ti->jlo : 0;
    } else {
        for (int64_t sg = 0; sg < ti->nseg; sg++) {
            int64_t s0 = ti->seg[2 * sg] > ti->jlo ? ti->seg[2 * sg] : ti->jlo;
            int64_t s1 = ti->seg[2 * sg + 1] < ti->jhi ? ti->seg[2 * sg + 1] : ti->jhi;
            if (s1 > s0) ti->count += s1 - s0;
        }
    }
    return 1;
}

/* Pieces of a tile (1 = unsplit) and keys per piece. */
static int64_t tile_pieces(const job *jb, const tile_info *ti, int64_t *per) {
    *per = ti->count;
    if (jb->slots <= 1 || ti->count == 0) return 1;
    *per = split_piece(ti->count, jb->slots);
    return (ti->count + *per - 1) / *per;
}

/* One task: piece `piece` of tile `unit` (task = unit * slots + piece). */
static void tile_task(void *arg, int64_t task, int thread) {
    const job *jb = arg;
    const dhsa_attn_desc *a = jb->a;
    const dhsa__attn_problem *p = jb->p;
    const dhsa_attn_kernels *kern = jb->kern;
    const int W = jb->W;
    const int64_t G = p->G, d = p->d, dv = p->dv;
    const int64_t unit = task / jb->slots, piece = task % jb->slots;

    ws_layout L = layout(p, a, jb->k_direct, jb->v_direct);
    float *base = (float *)(jb->ws + (size_t)thread * jb->ws_per_thread);
    float *Qt = base;                 /* [d][W] */
    float *Ot = Qt + L.qt;            /* [dv][W] */
    float *S = Ot + L.ot;             /* [BC][W] */
    float *Kbuf = S + L.s;            /* [BC][d] when K is not direct */
    float *Vbuf = Kbuf + L.kbuf;      /* [BC][dv] when V is not direct */
    float *m = Vbuf + L.vbuf;         /* [W] */
    float *l = m + W, *alpha = l + W; /* [W] */
    float *kadd = m + L.mla;          /* [BC] */
    int64_t *lo = (int64_t *)(kadd + L.kadd), *hi = lo + W; /* [W] */
    int64_t *keys = hi + W;                                  /* [BC] */

    tile_info ti;
    if (!tile_setup(jb, unit, lo, hi, &ti)) return;
    int64_t per, n_pieces = tile_pieces(jb, &ti, &per);
    if (piece >= n_pieces) return;
    const int64_t b = ti.b, g = ti.g, r0 = ti.r0, u0 = ti.u0;
    const int ncols = ti.ncols;
    const int64_t jlo = ti.jlo, jhi = ti.jhi, inner_lo = ti.inner_lo, inner_hi = ti.inner_hi;

    /* Pack the tile's queries, scaled: transposed (Qt) for wide tiles, as
     * zero-padded rows (Qr) for narrow ones. */
    const int narrow = ncols <= DHSA_NARROW;
    const int64_t dq = (int64_t)dhsa__align_up((size_t)d, 16);
    if (narrow) {
        memset(Qt, 0, (size_t)ncols * dq * sizeof(float));
        memset(S, 0, (size_t)DHSA_BC * W * sizeof(float));
    }
    for (int i = 0; i < W; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
        if (i >= ncols) {
            if (!narrow)
                for (int64_t c = 0; c < d; c++) Qt[c * W + i] = 0.0f;
            continue;
        }
        int64_t u = u0 + i, row = r0 + u / G, hq = g * G + u % G;
        const void *q = dhsa__at(&a->q, b, hq, row);
        for (int64_t c = 0; c < d; c++) {
            float x = p->scale * dhsa__load(q, a->q.type, c * a->q.stride[3]);
            if (narrow)
                Qt[i * dq + c] = x;
            else
                Qt[c * W + i] = x;
        }
    }
    memset(Ot, 0, (size_t)dv * (narrow ? ncols : W) * sizeof(float)); /* narrow: [ncols][dv] */
    /* Element (key j, query i) of the score block: S[j * sj + i * si]. Wide
     * tiles store a key per row ([BC][W]), narrow ones a query per row
     * ([nq][BC]). */
    const int64_t sj = narrow ? 1 : W, si = narrow ? DHSA_BC : 1;

    /* Blocks of up to BC keys are cut from the segments in order; a block
     * that spans several ranges (short content chunks) is gathered into
     * Kbuf/Vbuf, so that sparse layouts keep full blocks instead of paying
     * per-block costs for every short range. This piece visits keys
     * [piece * per, + per) of that order. */
    int64_t dense_seg[2] = {jlo, jhi}, nseg = ti.seg ? ti.nseg : 1;
    const int64_t *seg = ti.seg ? ti.seg : dense_seg;
    int64_t sg = 0, cur = 0, skip = piece * per, remain = per;
    for (; sg < nseg; sg++) { /* find the piece's first key */
        int64_t s0 = seg[2 * sg] > jlo ? seg[2 * sg] : jlo;
        int64_t s1 = seg[2 * sg + 1] < jhi ? seg[2 * sg + 1] : jhi;
        int64_t len = s1 > s0 ? s1 - s0 : 0;
        if (skip < len) {
            cur = s0 + skip;
            break;
        }
        skip -= len;
    }
    for (;;) {
        /* next block: keys[0..n), ascending */
        int n = 0, contiguous = 1;
        while (n < DHSA_BC && sg < nseg && remain > 0) {
            int64_t lo_k = seg[2 * sg] > jlo ? seg[2 * sg] : jlo;
            int64_t hi_k = seg[2 * sg + 1] < jhi ? seg[2 * sg + 1] : jhi;
            if (cur < lo_k) cur = lo_k;
            if (cur >= hi_k) {
                sg++;
                if (sg < nseg) cur = seg[2 * sg];
                continue;
            }
            if (n > 0 && cur != keys[n - 1] + 1) contiguous = 0;
            int64_t take = hi_k - cur < DHSA_BC - n ? hi_k - cur : DHSA_BC - n;
            if (take > remain) take = remain;
            for (int64_t x = 0; x < take; x++) keys[n++] = cur + x;
            cur += take;
            remain -= take;
        }
        if (n == 0) break;
        const int64_t j0 = keys[0];

        /* Per-key additive terms. A block whose keys are all masked out
         * changes nothing (its softmax step would rescale by exactly 1 and
         * add exact zeros), so it is skipped: padding costs no arithmetic. */
        int any_key_add = 0;
        if (a->key_mask || a->key_bias) {
            int open = 0;
            for (int j = 0; j < n; j++) {
                kadd[j] = dhsa__attn_key_add(a, b, keys[j]);
                open += kadd[j] != -INFINITY;
                any_key_add |= kadd[j] != 0.0f;
            }
            if (!open) continue;
        }

        if (narrow && jb->k_rows_q8 && contiguous) { /* Q8_0 rows read in place */
            kern->qk_rows_q8(dhsa__at(&a->k, b, g, j0), a->k.stride[2], n, (int)d, Qt, dq, ncols, S);
        } else if (narrow && jb->k_rows16 && contiguous) { /* F16/BF16 rows read in place */
            kern->qk_rows16(dhsa__at(&a->k, b, g, j0), a->k.type == DHSA_BF16, a->k.stride[2], n, (int)d, Qt, dq,
                            ncols, S);
        } else {
            const float *K;
            int64_t ldk;
            if (jb->k_direct && contiguous) {
                K = dhsa__at(&a->k, b, g, j0);
                ldk = a->k.stride[2];
            } else {
                gather_rows(kern, &a->k, b, g, keys, n, d, Kbuf);
                K = Kbuf;
                ldk = d;
            }
            if (narrow)
                kern->qk_rows(K, ldk, n, (int)d, Qt, dq, ncols, S);
            else
                kern->qk(K, ldk, n, (int)d, Qt, W, S);
        }
        if (a->softcap > 0) kern->softcap(S, narrow ? (int64_t)ncols * DHSA_BC : (int64_t)n * W, a->softcap);

        if (any_key_add) {
            for (int j = 0; j < n; j++)
                if (kadd[j] != 0.0f)
                    for (int i = 0; i < (narrow ? ncols : W); i++) S[j * sj + i * si] += kadd[j];
        }
        if (a->attn_mask.data) {
            const int64_t *ms = p->mstride;
            for (int i = 0; i < ncols; i++) {
                int64_t u = u0 + i, row = r0 + u / G, hq = g * G + u % G;
                const float *mrow = (const float *)a->attn_mask.data + b * ms[0] + hq * ms[1] + row * ms[2];
                for (int j = 0; j < n; j++) S[j * sj + i * si] += mrow[keys[j] * ms[3]];
            }
        }
        if (!(keys[0] >= inner_lo && keys[n - 1] < inner_hi)) {
            for (int j = 0; j < n; j++) {
                int64_t key = keys[j];
                for (int i = 0; i < ncols; i++)
                    if (key < lo[i] || key >= hi[i]) S[j * sj + i * si] = -INFINITY;
            }
        }
        if (narrow)
            kern->softmax_rows(S, n, ncols, m, l, alpha);
        else
            kern->softmax(S, n, W, m, l, alpha);

        if (narrow && jb->v_rows_q8 && contiguous) {
            kern->pv_rows_q8(dhsa__at(&a->v, b, g, j0), a->v.stride[2], n, (int)dv, S, ncols, alpha, Ot);
        } else if (narrow && jb->v_rows16 && contiguous) {
            kern->pv_rows16(dhsa__at(&a->v, b, g, j0), a->v.type == DHSA_BF16, a->v.stride[2], n, (int)dv, S, ncols,
                            alpha, Ot);
        } else {
            const float *V;
            int64_t ldv;
            if (jb->v_direct && contiguous) {
                V = dhsa__at(&a->v, b, g, j0);
                ldv = a->v.stride[2];
            } else {
                gather_rows(kern, &a->v, b, g, keys, n, dv, Vbuf);
                V = Vbuf;
                ldv = dv;
            }
            if (narrow)
                kern->pv_rows(V, ldv, n, (int)dv, S, ncols, alpha, Ot);
            else
                kern->pv(V, ldv, n, (int)dv, S, W, alpha, Ot);
        }
    }

    if (n_pieces > 1) { /* a partial result: the merge pass normalises */
        float *slot = jb->part + ((size_t)unit * (size_t)jb->slots + (size_t)piece) * jb->slot_floats;
        float *pm = slot + jb->nc_max * dv, *pl = pm + jb->nc_max;
        for (int i = 0; i < ncols; i++) {
            for (int64_t c = 0; c < dv; c++) slot[i * dv + c] = narrow ? Ot[i * dv + c] : Ot[c * W + i];
            pm[i] = m[i];
            pl[i] = l[i];
        }
        return;
    }
    for (int i = 0; i < ncols; i++) {
        int64_t u = u0 + i, row = r0 + u / G, hq = g * G + u % G;
        float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
        void *o = dhsa__at(&a->o, b, hq, row);
        for (int64_t c = 0; c < dv; c++) {
            float x = narrow ? Ot[i * dv + c] : Ot[c * W + i];
            dhsa__store(o, a->o.type, c * a->o.stride[3], x * inv);
        }
        if (a->lse.data) {
            float *lse = dhsa__at(&a->lse, b, hq, row);
            *lse = l[i] > 0.0f ? m[i] + logf(l[i]) : -INFINITY;
        }
    }
}

/* The merge pass of split-K: one task per (tile, column). The pieces'
 * partial outputs O_p with their running max m_p and sum l_p combine as
 * o = sum_p w_p O_p / sum_p w_p l_p, w_p = exp(m_p - max_p m_p), in the
 * pieces' order and in double: the same result for any thread count. A
 * piece that saw no allowed key for the column (l_p = 0) weighs nothing. */
static void merge_task(void *arg, int64_t task, int thread) {
    (void)thread;
    const job *jb = arg;
    const dhsa_attn_desc *a = jb->a;
    const dhsa__attn_problem *p = jb->p;
    const int64_t unit = task / jb->nc_max, i = task % jb->nc_max, dv = p->dv;
    int64_t lo[64], hi[64]; /* W <= 64 */
    tile_info ti;
    if (!tile_setup(jb, unit, lo, hi, &ti) || i >= ti.ncols) return;
    int64_t per, n_pieces = tile_pieces(jb, &ti, &per);
    if (n_pieces <= 1) return; /* the piece wrote the output */
    const float *slot0 = jb->part + (size_t)unit * (size_t)jb->slots * jb->slot_floats;
    const size_t mo = (size_t)(jb->nc_max * dv), lo_ = mo + (size_t)jb->nc_max;
    double mx = -INFINITY;
    for (int64_t q = 0; q < n_pieces; q++) {
        const float *s = slot0 + (size_t)q * jb->slot_floats;
        if (s[lo_ + i] > 0.0f && s[mo + i] > mx) mx = s[mo + i];
    }
    const int64_t u = ti.u0 + i, row = ti.r0 + u / p->G, hq = ti.g * p->G + u % p->G;
    void *o = dhsa__at(&a->o, ti.b, hq, row);
    double sum = 0.0, acc[256];
    float *lse = a->lse.data ? dhsa__at(&a->lse, ti.b, hq, row) : NULL;
    if (mx == -INFINITY) { /* no key for this query */
        for (int64_t c = 0; c < dv; c++) dhsa__store(o, a->o.type, c * a->o.stride[3], 0.0f);
        if (lse) *lse = -INFINITY;
        return;
    }
    for (int64_t q = 0; q < n_pieces; q++) {
        const float *s = slot0 + (size_t)q * jb->slot_floats;
        if (s[lo_ + i] > 0.0f) sum += exp((double)s[mo + i] - mx) * (double)s[lo_ + i];
    }
    /* dv in chunks of 256 accumulators */
    for (int64_t c0 = 0; c0 < dv; c0 += 256) {
        const int64_t nc = dv - c0 < 256 ? dv - c0 : 256;
        for (int64_t c = 0; c < nc; c++) acc[c] = 0.0;
        for (int64_t q = 0; q < n_pieces; q++) {
            const float *s = slot0 + (size_t)q * jb->slot_floats;
            if (!(s[lo_ + i] > 0.0f)) continue;
            const double w = exp((double)s[mo + i] - mx);
            const float *x = s + i * dv + c0;
            for (int64_t c = 0; c < nc; c++) acc[c] += w * (double)x[c];
        }
        for (int64_t c = 0; c < nc; c++)
            dhsa__store(o, a->o.type, (c0 + c) * a->o.stride[3], (float)(acc[c] / sum));
    }
    if (lse) *lse = (float)(mx + log(sum));
}

dhsa_status dhsa__attn_tiled_run(dhsa_ctx *ctx, const dhsa_attn_desc *a,
                                 const dhsa__attn_problem *p, void *ws) {
    job jb;
    jb.a = a;
    jb.p = p;
    jb.kern = dhsa__attn_kernels();
    jb.W = (int)tile_width(p, a);
    jb.q_block = q_block_of(p, a);
    jb.n_tiles = n_tiles_of(p, a, &jb.sub_tiles);
    jb.k_direct = direct_rows(&a->k);
    jb.v_direct = direct_rows(&a->v);
    jb.k_rows16 = kern16(jb.kern, &a->k) && jb.kern->qk_rows16;
    jb.v_rows16 = kern16(jb.kern, &a->v) && jb.kern->pv_rows16;
    jb.k_rows_q8 = kern_q8(&a->k) && jb.kern->qk_rows_q8;
    jb.v_rows_q8 = kern_q8(&a->v) && jb.kern->pv_rows_q8;
    jb.ws = ws;
    jb.ws_per_thread = layout(p, a, jb.k_direct, jb.v_direct).total * sizeof(float);
    jb.n_units = p->B * p->Hkv * jb.n_tiles;
    jb.slots = split_slots(p, a);
    jb.nc_max = nc_max_of(p, a);
    jb.slot_floats = slot_floats_of(p, a);
    jb.part = (float *)(jb.ws + (size_t)dhsa_ctx_n_threads(ctx) * jb.ws_per_thread);
    int64_t n_tasks = jb.n_units * jb.slots;
    /* Small calls (decode of a tiny model) cost less than waking the pool:
     * run their tasks here, in the same order, on thread 0's workspace.
     * The tasks are independent, so the results are the same. */
    double flops = 2.0 * (double)p->B * (double)p->Hq * (double)p->Lq * (double)p->Lk * (double)(p->d + p->dv);
    if (flops < 1e6) {
        for (int64_t t = 0; t < n_tasks; t++) tile_task(&jb, t, 0);
        if (jb.slots > 1)
            for (int64_t t = 0; t < jb.n_units * jb.nc_max; t++) merge_task(&jb, t, 0);
        return DHSA_OK;
    }
    dhsa_parallel_for(ctx, n_tasks, tile_task, &jb);
    if (jb.slots > 1) dhsa_parallel_for(ctx, jb.n_units * jb.nc_max, merge_task, &jb);
    return DHSA_OK;
}
