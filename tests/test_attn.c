/* test_attn.c: tests of dhsa_attention (include/dhsa.h, dhsa_attn_desc).
 *
 * Oracle: a naive attention in double precision written here, loop by loop
 * from the header's contract (scale, softcap, key_bias, attn_mask, causal,
 * window, key mask polarity, GQA, all-masked rows -> o = 0 / lse = -inf).
 * It reads canonical copies of the inputs (the values actually stored, after
 * F16/BF16 rounding, decoded by a decoder written here), never the strided
 * buffers, so a stride bug in the library cannot hide in the oracle too.
 * Both the TILED backend and the library's REFERENCE backend are compared
 * with it: per element |got - ref| <= atol + rtol * |ref| and NMSE overall;
 * a failure prints the case and the worst element (b, h, i, c).
 *
 * Also: bitwise equality across thread counts and across complementary mask
 * polarities, every ISA the machine has, error paths (nothing written to o),
 * workspace queries and memory budgets, the REFERENCE size cap, and checks
 * that the comparator itself fails on wrong data.
 *
 * Run: make build/tests/test_attn && build/tests/test_attn
 * (or `make test`). Ends with "test_attn: P passed, F failed".
 */
#include "attn/kern.h"
#include "dhsa.h"
#include "t.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TWO_PI 6.283185307179586476925286766559

static dhsa_ctx *g_ctx; /* default ctx: n_threads = 0 (online CPUs) */

/* ------------------------------------------------------------------------ */
/* Deterministic inputs: splitmix64, Box-Muller normals */

#include "rng.h"

/* ------------------------------------------------------------------------ */
/* Element storage. Decoding is written here (by the IEEE definition), so the
 * oracle does not trust the library's converters for what it reads. */

static double f16_decode(uint16_t h) {
    int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 0) v = ldexp((double)m, -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = ldexp((double)(m + 1024), e - 25);
    return sign ? -v : v;
}
static double bf16_decode(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static size_t elem_size(dhsa_type t) { return t == DHSA_F32 ? 4 : 2; }
static const char *tname(dhsa_type t) {
    return t == DHSA_F32 ? "f32" : t == DHSA_F16 ? "f16" : t == DHSA_BF16 ? "bf16" : "?";
}

static double load_elem(const void *base, dhsa_type t, int64_t off) {
    if (t == DHSA_F32) { float f; memcpy(&f, (const char *)base + off * 4, 4); return f; }
    uint16_t h;
    memcpy(&h, (const char *)base + off * 2, 2);
    return t == DHSA_F16 ? f16_decode(h) : bf16_decode(h);
}
/* Stores x rounded to type t; returns the value actually stored. */
static double store_elem(void *base, dhsa_type t, int64_t off, double x) {
    if (t == DHSA_F32) {
        float f = (float)x;
        memcpy((char *)base + off * 4, &f, 4);
        return f;
    }
    uint16_t h = t == DHSA_F16 ? dhsa_f32_to_f16((float)x) : dhsa_f32_to_bf16((float)x);
    memcpy((char *)base + off * 2, &h, 2);
    return load_elem(base, t, off);
}

/* ------------------------------------------------------------------------ */
/* Strided buffers. Layouts of a logical [B, H, L, D] tensor:
 *   BHLD  contiguous (dhsa_tensor_bhld)
 *   BLHD  batch-first (dhsa_tensor_blhd)
 *   PAD   batch-first with padding: 3 spare elements after each head's
 *         vector, 5 after each row, 7 after each batch (stride[2] > D)
 *   DIM2  [B, H, L, 2D+1] with stride[3] = 2 (every other element)
 * Input buffers are pre-filled with 0xFF bytes (NaN in every type), so a
 * kernel that reads outside the view produces NaN and fails; output buffers
 * are pre-filled with 0xA5 so a write outside the view (or no write) shows. */

enum { LAY_BHLD, LAY_BLHD, LAY_PAD, LAY_DIM2 };
static const char *lay_name[] = {"bhld", "blhd", "pad", "dim2"};

typedef struct {
    dhsa_tensor t;     /* the view handed to the library */
    int64_t st[4];     /* strides as this file computes them */
    unsigned char *buf;
    size_t nbytes;
} tbuf;

static void tbuf_make(tbuf *tb, int lay, dhsa_type ty, int64_t B, int64_t H, int64_t L,
                      int64_t D, int fill) {
    int64_t n;
    memset(tb, 0, sizeof *tb);
    switch (lay) {
    case LAY_BLHD:
        tb->st[0] = L * H * D, tb->st[1] = D, tb->st[2] = H * D, tb->st[3] = 1;
        n = B * L * H * D;
        break;
    case LAY_PAD: {
        int64_t dp = D + 3, row = H * dp + 5;
        tb->st[0] = L * row + 7, tb->st[1] = dp, tb->st[2] = row, tb->st[3] = 1;
        n = B * tb->st[0];
        break;
    }
    case LAY_DIM2: {
        int64_t row = 2 * D + 1;
        tb->st[0] = H * L * row + 3, tb->st[1] = L * row, tb->st[2] = row, tb->st[3] = 2;
        n = B * tb->st[0];
        break;
    }
    default:
        tb->st[0] = H * L * D, tb->st[1] = L * D, tb->st[2] = D, tb->st[3] = 1;
        n = B * H * L * D;
    }
    tb->nbytes = (size_t)(n > 0 ? n : 1) * elem_size(ty);
    tb->buf = malloc(tb->nbytes);
    if (!tb->buf) { fprintf(stderr, "out of memory\n"); exit(2); }
    memset(tb->buf, fill, tb->nbytes);
    if (lay == LAY_BHLD) tb->t = dhsa_tensor_bhld(tb->buf, ty, B, H, L, D);
    else if (lay == LAY_BLHD) tb->t = dhsa_tensor_blhd(tb->buf, ty, B, L, H, D);
    else {
        tb->t.data = tb->buf;
        tb->t.type = ty;
        tb->t.shape[0] = B, tb->t.shape[1] = H, tb->t.shape[2] = L, tb->t.shape[3] = D;
        memcpy(tb->t.stride, tb->st, sizeof tb->st);
    }
    if (lay == LAY_BHLD || lay == LAY_BLHD) {
        int ok = tb->t.data == tb->buf && tb->t.type == ty && tb->t.shape[0] == B &&
                 tb->t.shape[1] == H && tb->t.shape[2] == L && tb->t.shape[3] == D &&
                 memcmp(tb->t.stride, tb->st, sizeof tb->st) == 0;
        if (!ok) T_CHECK(0, "dhsa_tensor_%s(B=%lld,H=%lld,L=%lld,D=%lld) gave a wrong view",
                         lay_name[lay], (long long)B, (long long)H, (long long)L, (long long)D);
    }
}

static int64_t tb_off(const tbuf *tb, int64_t b, int64_t h, int64_t i, int64_t c) {
    return b * tb->st[0] + h * tb->st[1] + i * tb->st[2] + c * tb->st[3];
}

/* 1 iff every byte of the buffer outside the logical view still holds fill. */
static int tbuf_outside_untouched(const tbuf *tb, int fill) {
    const dhsa_tensor *t = &tb->t;
    size_t es = elem_size(t->type);
    unsigned char *in = calloc(tb->nbytes, 1);
    if (!in) return 1;
    for (int64_t b = 0; b < t->shape[0]; b++)
        for (int64_t h = 0; h < t->shape[1]; h++)
            for (int64_t i = 0; i < t->shape[2]; i++)
                for (int64_t c = 0; c < t->shape[3]; c++)
                    memset(in + (size_t)tb_off(tb, b, h, i, c) * es, 1, es);
    int ok = 1;
    for (size_t k = 0; k < tb->nbytes && ok; k++)
        if (!in[k] && tb->buf[k] != (unsigned char)fill) ok = 0;
    free(in);
    return ok;
}

static int all_bytes(const unsigned char *p, size_t n, int v) {
    for (size_t k = 0; k < n; k++)
        if (p[k] != (unsigned char)v) return 0;
    return 1;
}

/* ------------------------------------------------------------------------ */
/* A test case */

enum { KM_NONE, KM_RANDOM, KM_PREFIX, KM_SUFFIX, KM_B0ALL };
static const char *km_name[] = {"none", "random", "prefix", "suffix", "batch0-all"};
enum { KB_NONE, KB_RANDOM, KB_ALIBI, KB_SHIFT, KB_B0INF };
static const char *kb_name[] = {"none", "random(-inf 10%)", "alibi", "shift-200", "batch0-inf"};
enum { AM_NONE, AM_FULL, AM_B1, AM_H1, AM_B1H1 };
static const char *am_name[] = {"none", "[B,H]", "[1,H]", "[B,1]", "[1,1]"};
enum { LSE_BHLD, LSE_BLHD, LSE_NONE };
static const char *lse_name[] = {"bhld", "blhd", "none"};

typedef struct {
    const char *tag;
    int64_t B, Hq, Hkv, Lq, Lk, d, dv; /* B 0 -> 1, Hkv 0 -> Hq, dv 0 -> d */
    dhsa_type tq, tk, tv, to;
    int lq, lk, lv, lo, lse;            /* layouts */
    float scale, softcap;
    int causal;
    int64_t q_pos0, window;
    double sigma;                       /* std of q and k entries; 0 -> 1.2 */
    int km;                             /* KM_* */
    dhsa_mask_polarity pol;
    int km_bstride;                     /* 0: Lk, -1: 0 (broadcast), n > 0: Lk + n */
    int kb;                             /* KB_* */
    int kb_bstride;                     /* as km_bstride */
    int am;                             /* AM_* */
    int am_rowinf;                      /* one row of the dense mask all -inf */
    int64_t rows;                       /* query rows checked; 0 = all */
    int noref;                          /* skip the REFERENCE backend (cost) */
    uint64_t seed;
} spec;

typedef struct {
    spec s;
    char desc[700];
    tbuf q, k, v, o, lse;
    double *cq, *ck, *cv;    /* canonical [B,Hq,Lq,d], [B,Hkv,Lk,d], [B,Hkv,Lk,dv] */
    uint8_t *km;
    int64_t km_bs;
    float *kb;
    int64_t kb_bs;
    float *am;
    int64_t am_B, am_H, am_st[4];
    int64_t *rows, R;        /* the checked query rows */
    double *ref_o, *ref_lse; /* oracle [B,Hq,R,dv], [B,Hq,R] */
    double *got_o, *got_lse; /* library, same shapes */
    dhsa_attn_desc a;
} inst;

static void *xcalloc(size_t n, size_t sz) {
    void *p = calloc(n ? n : 1, sz);
    if (!p) { fprintf(stderr, "out of memory\n"); exit(2); }
    return p;
}

static void fill_input(tbuf *tb, double *canon, int64_t B, int64_t H, int64_t L, int64_t D,
                       double sigma, rng_t *r) {
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < L; i++)
                for (int64_t c = 0; c < D; c++)
                    canon[((b * H + h) * L + i) * D + c] =
                        store_elem(tb->buf, tb->t.type, tb_off(tb, b, h, i, c),
                                   sigma * rng_normal(r));
}

static void describe(inst *I) {
    const spec *s = &I->s;
    snprintf(I->desc, sizeof I->desc,
             "%s: B=%lld Hq=%lld Hkv=%lld Lq=%lld Lk=%lld d=%lld dv=%lld q/k/v/o=%s/%s/%s/%s "
             "layout=%s/%s/%s/%s lse=%s scale=%g softcap=%g causal=%d q_pos0=%lld window=%lld "
             "key_mask=%s pol=%d bstride=%lld key_bias=%s bstride=%lld attn_mask=%s%s "
             "sigma=%g rows=%lld/%lld seed=%llu isa=%s",
             s->tag, (long long)s->B, (long long)s->Hq, (long long)s->Hkv, (long long)s->Lq,
             (long long)s->Lk, (long long)s->d, (long long)s->dv, tname(s->tq), tname(s->tk),
             tname(s->tv), tname(s->to), lay_name[s->lq], lay_name[s->lk], lay_name[s->lv],
             lay_name[s->lo], lse_name[s->lse], (double)s->scale, (double)s->softcap, s->causal,
             (long long)s->q_pos0, (long long)s->window, km_name[s->km], (int)s->pol,
             (long long)I->km_bs, kb_name[s->kb], (long long)I->kb_bs, am_name[s->am],
             s->am_rowinf ? "+row-inf" : "", s->sigma, (long long)I->R, (long long)s->Lq,
             (unsigned long long)s->seed, dhsa_isa_name(dhsa_active_isa()));
}

static void inst_init(inst *I, const spec *sp) {
    static const uint8_t nonzero[4] = {1, 2, 0x80, 0xFF}; /* any nonzero byte is true */
    memset(I, 0, sizeof *I);
    I->s = *sp;
    spec *s = &I->s;
    if (!s->B) s->B = 1;
    if (!s->Hkv) s->Hkv = s->Hq;
    if (!s->dv) s->dv = s->d;
    if (s->sigma == 0) s->sigma = 1.2;
    if (!s->seed) s->seed = 0x5EED;
    rng_t r = {s->seed * 0x2545F4914F6CDD1Dull + (uint64_t)(s->Lq * 131 + s->d)};
    int64_t B = s->B, Hq = s->Hq, Hkv = s->Hkv, Lq = s->Lq, Lk = s->Lk;

    tbuf_make(&I->q, s->lq, s->tq, B, Hq, Lq, s->d, 0xFF);
    tbuf_make(&I->k, s->lk, s->tk, B, Hkv, Lk, s->d, 0xFF);
    tbuf_make(&I->v, s->lv, s->tv, B, Hkv, Lk, s->dv, 0xFF);
    tbuf_make(&I->o, s->lo, s->to, B, Hq, Lq, s->dv, 0xA5);
    I->cq = xcalloc((size_t)(B * Hq * Lq * s->d), sizeof(double));
    I->ck = xcalloc((size_t)(B * Hkv * Lk * s->d), sizeof(double));
    I->cv = xcalloc((size_t)(B * Hkv * Lk * s->dv), sizeof(double));
    fill_input(&I->q, I->cq, B, Hq, Lq, s->d, s->sigma, &r);
    fill_input(&I->k, I->ck, B, Hkv, Lk, s->d, s->sigma, &r);
    fill_input(&I->v, I->cv, B, Hkv, Lk, s->dv, 1.0, &r);
    if (s->lse != LSE_NONE)
        tbuf_make(&I->lse, s->lse == LSE_BLHD ? LAY_BLHD : LAY_BHLD, DHSA_F32, B, Hq, Lq, 1, 0xA5);

    if (s->km != KM_NONE) {
        I->km_bs = s->km_bstride < 0 ? 0 : Lk + s->km_bstride;
        int64_t nb = I->km_bs ? B : 1, n = (nb - 1) * I->km_bs + Lk;
        I->km = malloc((size_t)n);
        memset(I->km, 0xEE, (size_t)n); /* gaps between batches: "true" if misread */
        for (int64_t b = 0; b < nb; b++) {
            static const double prefix_share[3] = {0.65, 0.4, 0.9};
            int64_t pre = (int64_t)(prefix_share[b % 3] * (double)Lk);
            int64_t len = Lk - b * (Lk / 4); /* valid length for right padding */
            for (int64_t j = 0; j < Lk; j++) {
                int truth;
                switch (s->km) {
                case KM_PREFIX: truth = j < pre; break;
                case KM_SUFFIX: truth = j >= len; break;
                case KM_B0ALL:
                    truth = b == 0 ? s->pol != DHSA_MASK_TRUE_KEEPS : rng_unif(&r) < 0.3;
                    break;
                default: truth = rng_unif(&r) < 0.3;
                }
                I->km[b * I->km_bs + j] = truth ? nonzero[rng_u64(&r) & 3] : 0;
            }
        }
    }
    if (s->kb != KB_NONE) {
        I->kb_bs = s->kb_bstride < 0 ? 0 : Lk + s->kb_bstride;
        int64_t nb = I->kb_bs ? B : 1, n = (nb - 1) * I->kb_bs + Lk;
        I->kb = malloc((size_t)n * sizeof(float));
        for (int64_t x = 0; x < n; x++) I->kb[x] = NAN; /* gaps: NaN if misread */
        for (int64_t b = 0; b < nb; b++)
            for (int64_t j = 0; j < Lk; j++) {
                double x = rng_unif(&r) < 0.1 ? -INFINITY : 0.5 * rng_normal(&r);
                if (s->kb == KB_ALIBI)
                    x = rng_unif(&r) < 0.05 ? -INFINITY : -0.02 * (double)(b + 1) * (double)(Lk - 1 - j);
                else if (s->kb == KB_SHIFT)
                    x = (b == 0 ? -200.0 : 0.0) + 0.5 * rng_normal(&r);
                else if (s->kb == KB_B0INF && b == 0)
                    x = -INFINITY;
                I->kb[b * I->kb_bs + j] = (float)x;
            }
    }
    if (s->am != AM_NONE) {
        I->am_B = (s->am == AM_B1 || s->am == AM_B1H1) ? 1 : B;
        I->am_H = (s->am == AM_H1 || s->am == AM_B1H1) ? 1 : Hq;
        int64_t rs = Lk + 2, plane = Lq * rs;
        I->am_st[3] = 1, I->am_st[2] = rs;
        I->am_st[1] = s->am == AM_B1H1 ? 0 : plane; /* AM_H1: stride kept on a size-1 dim */
        I->am_st[0] = I->am_B == 1 ? 0 : I->am_H * plane;
        int64_t n = I->am_B * I->am_H * plane;
        I->am = malloc((size_t)n * sizeof(float));
        for (int64_t x = 0; x < n; x++) I->am[x] = NAN; /* row padding: NaN if read */
        int64_t inf_row = Lq > 2 ? 2 : Lq - 1;
        for (int64_t b = 0; b < I->am_B; b++)
            for (int64_t h = 0; h < I->am_H; h++)
                for (int64_t i = 0; i < Lq; i++)
                    for (int64_t j = 0; j < Lk; j++) {
                        double x = rng_unif(&r) < 0.1 ? -INFINITY : 0.7 * rng_normal(&r);
                        if (s->am_rowinf && i == inf_row) x = -INFINITY;
                        I->am[b * I->am_H * plane + h * plane + i * rs + j] = (float)x;
                    }
    }

    /* Checked rows: all, or the first and last few plus random ones. */
    I->R = (s->rows <= 0 || s->rows >= Lq) ? Lq : s->rows;
    I->rows = xcalloc((size_t)I->R, sizeof(int64_t));
    if (I->R == Lq) {
        for (int64_t i = 0; i < Lq; i++) I->rows[i] = i;
    } else {
        unsigned char *pick = xcalloc((size_t)Lq, 1);
        int64_t edge = I->R / 4 < 8 ? I->R / 4 : 8, got = 0;
        for (int64_t i = 0; i < edge; i++) pick[i] = pick[Lq - 1 - i] = 1;
        for (int64_t i = 0; i < Lq; i++) got += pick[i];
        while (got < I->R) {
            int64_t i = (int64_t)(rng_u64(&r) % (uint64_t)Lq);
            if (!pick[i]) pick[i] = 1, got++;
        }
        for (int64_t i = 0, n = 0; i < Lq; i++)
            if (pick[i]) I->rows[n++] = i;
        free(pick);
    }
    size_t no = (size_t)(B * Hq * I->R);
    I->ref_o = xcalloc(no * (size_t)s->dv, sizeof(double));
    I->got_o = xcalloc(no * (size_t)s->dv, sizeof(double));
    I->ref_lse = xcalloc(no, sizeof(double));
    I->got_lse = xcalloc(no, sizeof(double));

    dhsa_attn_desc *a = &I->a;
    *a = dhsa_attn_default_desc();
    a->q = I->q.t, a->k = I->k.t, a->v = I->v.t, a->o = I->o.t;
    if (s->lse != LSE_NONE) a->lse = I->lse.t;
    a->scale = s->scale, a->softcap = s->softcap, a->causal = s->causal;
    a->q_pos0 = s->q_pos0, a->window = s->window;
    a->key_mask = I->km, a->key_mask_batch_stride = I->km_bs, a->key_mask_polarity = s->pol;
    a->key_bias = I->kb, a->key_bias_batch_stride = I->kb_bs;
    if (I->am) {
        a->attn_mask.data = I->am;
        a->attn_mask.type = DHSA_F32;
        a->attn_mask.shape[0] = I->am_B, a->attn_mask.shape[1] = I->am_H;
        a->attn_mask.shape[2] = Lq, a->attn_mask.shape[3] = Lk;
        memcpy(a->attn_mask.stride, I->am_st, sizeof I->am_st);
    }
    a->backend = DHSA_BACKEND_TILED;
    describe(I);
}

static void inst_free(inst *I) {
    free(I->q.buf), free(I->k.buf), free(I->v.buf), free(I->o.buf), free(I->lse.buf);
    free(I->cq), free(I->ck), free(I->cv), free(I->km), free(I->kb), free(I->am);
    free(I->rows), free(I->ref_o), free(I->ref_lse), free(I->got_o), free(I->got_lse);
}

/* ------------------------------------------------------------------------ */
/* The oracle: naive attention in double, straight from the header comment.
 * wrong_polarity / scale_mul / no_softcap exist only to build deliberately
 * wrong references that the comparison must reject. */

typedef struct { int wrong_polarity; double scale_mul; int no_softcap; } oracle_opts;
static const oracle_opts EXACT = {0, 1.0, 0};

static void oracle(const inst *I, oracle_opts op, double *o, double *lse) {
    const spec *s = &I->s;
    int64_t B = s->B, Hq = s->Hq, Lq = s->Lq, Lk = s->Lk, d = s->d, dv = s->dv;
    int64_t group = s->Hq / s->Hkv;
    double scale = (s->scale != 0 ? (double)s->scale : 1.0 / sqrt((double)d)) * op.scale_mul;
    double cap = op.no_softcap ? 0 : (double)s->softcap;
    dhsa_mask_polarity pol = s->pol;
    if (op.wrong_polarity)
        pol = pol == DHSA_MASK_TRUE_KEEPS ? DHSA_MASK_TRUE_IGNORES : DHSA_MASK_TRUE_KEEPS;
    double *sc = xcalloc((size_t)Lk, sizeof(double));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++) {
            int64_t hk = h / group; /* GQA: query head h reads K/V head h / (Hq/Hkv) */
            for (int64_t r = 0; r < I->R; r++) {
                int64_t i = I->rows[r], pos = s->q_pos0 + i;
                const double *qi = I->cq + ((b * Hq + h) * Lq + i) * d;
                double m = -INFINITY;
                for (int64_t j = 0; j < Lk; j++) {
                    int keep = 1;
                    if (I->km) {
                        int truth = I->km[b * I->km_bs + j] != 0;
                        keep = pol == DHSA_MASK_TRUE_IGNORES ? !truth : truth;
                    }
                    if (s->causal && j > pos) keep = 0;
                    if (s->window > 0 && j <= pos - s->window) keep = 0;
                    if (!keep) { sc[j] = -INFINITY; continue; }
                    const double *kj = I->ck + ((b * s->Hkv + hk) * Lk + j) * d;
                    double dot = 0;
                    for (int64_t c = 0; c < d; c++) dot += qi[c] * kj[c];
                    double x = scale * dot;
                    if (cap > 0) x = cap * tanh(x / cap);
                    if (I->kb) x += I->kb[b * I->kb_bs + j];
                    if (I->am)
                        x += I->am[(I->am_B == 1 ? 0 : b) * I->am_st[0] +
                                   (I->am_H == 1 ? 0 : h) * I->am_st[1] + i * I->am_st[2] + j];
                    sc[j] = x;
                    if (x > m) m = x;
                }
                double *oi = o + ((b * Hq + h) * I->R + r) * dv;
                for (int64_t c = 0; c < dv; c++) oi[c] = 0;
                if (m == -INFINITY) { /* no allowed key: o = 0, lse = -inf */
                    lse[(b * Hq + h) * I->R + r] = -INFINITY;
                    continue;
                }
                double sum = 0;
                for (int64_t j = 0; j < Lk; j++) {
                    if (sc[j] == -INFINITY) continue;
                    double p = exp(sc[j] - m);
                    const double *vj = I->cv + ((b * s->Hkv + hk) * Lk + j) * dv;
                    sum += p;
                    for (int64_t c = 0; c < dv; c++) oi[c] += p * vj[c];
                }
                for (int64_t c = 0; c < dv; c++) oi[c] /= sum;
                lse[(b * Hq + h) * I->R + r] = m + log(sum);
            }
        }
    free(sc);
}

static int64_t count_masked_rows(const inst *I) {
    int64_t n = 0, N = I->s.B * I->s.Hq * I->R;
    for (int64_t x = 0; x < N; x++) n += I->ref_lse[x] == -INFINITY;
    return n;
}

/* ------------------------------------------------------------------------ */
/* Comparison. Tolerances (u = 2^-24 = 6e-8, the fp32 unit roundoff; the
 * inputs are unit scale: v ~ N(0,1), q,k ~ N(0, sigma^2) with sigma = 1.2,
 * so scores have std ~1.4 (max ~8); sigma = 2.5 cases reach |s| ~ 30).
 *
 * TILED, F32 output, vs the double oracle: atol 3e-5, rtol 2e-5, NMSE 1e-9.
 *   Score error ds, by source (random-sign roundings, so RMS ~ u/2 x the
 *   root-sum-square of the rounded quantities):
 *     the fp32 dot over d <= 128 terms: (u/2) |s| sqrt(d/2) ~ 4e-7 RMS at
 *     |s| ~ 1.4, ~2e-6 for the |s| ~ 30 softcap cases;
 *     s + key_bias in fp32: (u/2) |b|, 6e-6 for the -200 biases used here
 *     (the largest single term);
 *   ds moves o by sum_j p_j ds_j (v_j - o), at most ~4 ds (|v_j - o| <= ~4
 *   for normal v): <= 2.4e-5 worst case. The fp32 accumulation over up to
 *   4097 keys adds ~sqrt(Lk) u sum p|v| ~ 4e-6 relative to |o|; exp and the
 *   final division a few ulp. So atol 3e-5 (the worst case above) and rtol
 *   2e-5 (5x the relative accumulation error). The expected NMSE is
 *   ~(1e-6 / 0.05)^2 ~ 4e-10 at worst (small o: flat softmax over 4K keys);
 *   one misplaced key among 500 effective ones gives ~1e-6 and more.
 * REFERENCE vs the oracle: atol 1e-5, rtol 1e-5, NMSE 1e-12. It accumulates
 *   in double; left are the fp32 rounding of o (u/2 relative, NMSE ~1e-15)
 *   and scale/softcap kept as float (|ds| <= |s| u/2 <= 1e-6, moving o by
 *   <= 4e-6).
 * F16 / BF16 output: the output rounding is at most half an ulp, 2^-11
 *   (F16) or 2^-8 (BF16) relative: added to rtol (and 2^-25, half the
 *   smallest F16 subnormal, to atol). NMSE is then at most the square of the
 *   half ulp, 2.4e-7 and 1.5e-5, plus the F32 part: bounds 3e-7 and 2e-5.
 * LSE = m + log(sum): the score error above (<= 6e-6, 2e-6 typical) plus
 *   the fp32 rounding of |lse| <= ~200 (rtol): TILED atol 3e-5, rtol 1e-5;
 *   REFERENCE atol 1e-5, rtol 1e-6.
 * F16/BF16 inputs need no extra tolerance: the oracle reads the very same
 * rounded values and the library computes in F32 from them.
 * (Measured on AVX-512/AVX2/scalar: worst TILED F32 element 6.5e-6 at
 * |ref| 0.09, NMSE <= 1e-11; REFERENCE <= 5e-8.) */

typedef struct { double atol, rtol, nmse; } tol_t;

static tol_t tol_o(dhsa_backend be, dhsa_type to) {
    tol_t t = be == DHSA_BACKEND_REFERENCE ? (tol_t){1e-5, 1e-5, 1e-12} : (tol_t){3e-5, 2e-5, 1e-9};
    if (to == DHSA_F16) t.rtol += 0x1p-11, t.atol += 0x1p-25, t.nmse = 3e-7;
    if (to == DHSA_BF16) t.rtol += 0x1p-8, t.nmse = 2e-5;
    return t;
}
static tol_t tol_lse(dhsa_backend be) {
    return be == DHSA_BACKEND_REFERENCE ? (tol_t){1e-5, 1e-6, 1e-12} : (tol_t){3e-5, 1e-5, 1e-9};
}

typedef struct {
    int ok;
    int64_t n_bad, n;
    double nmse;
    int64_t at[4];          /* worst element (b, h, i, c) */
    double got, ref, bound; /* its values */
} cmp_t;

/* got/ref are [B, H, R, C]; row r is query row rows[r]. Where mask_lse (the
 * oracle's lse, [B, H, R]) is -inf the row has no allowed key and got must be
 * exactly 0. An infinite ref must be matched exactly; NaN never passes. */
static cmp_t compare(const double *got, const double *ref, const double *mask_lse, int64_t B,
                     int64_t H, int64_t R, int64_t C, const int64_t *rows, tol_t t) {
    cmp_t c;
    memset(&c, 0, sizeof c);
    double num = 0, den = 0, worst = -1;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t r = 0; r < R; r++)
                for (int64_t k = 0; k < C; k++) {
                    int64_t x = ((b * H + h) * R + r) * C + k;
                    double g = got[x], f = ref[x], bound, excess;
                    int bad;
                    if (mask_lse && mask_lse[(b * H + h) * R + r] == -INFINITY) {
                        bound = 0;
                        bad = !(g == 0);
                        excess = bad ? INFINITY : 0;
                    } else if (isinf(f)) {
                        bound = 0;
                        bad = !(g == f);
                        excess = bad ? INFINITY : 0;
                    } else {
                        bound = t.atol + t.rtol * fabs(f);
                        double err = fabs(g - f);
                        bad = !(err <= bound); /* NaN fails */
                        excess = bad && !isfinite(err) ? INFINITY : err / bound;
                        if (isfinite(err)) num += err * err, den += f * f;
                    }
                    c.n++;
                    c.n_bad += bad;
                    if (excess > worst) {
                        worst = excess;
                        c.at[0] = b, c.at[1] = h, c.at[2] = rows[r], c.at[3] = k;
                        c.got = g, c.ref = f, c.bound = bound;
                    }
                }
    c.nmse = den > 0 ? num / den : (num > 0 ? INFINITY : 0);
    c.ok = c.n_bad == 0 && c.nmse <= t.nmse;
    return c;
}

static int expect_close(const char *what, const char *backend, const inst *I, const double *got,
                        const double *ref, int64_t C, int masked_rule, tol_t t) {
    cmp_t c = compare(got, ref, masked_rule ? I->ref_lse : NULL, I->s.B, I->s.Hq, I->R, C,
                      I->rows, t);
    T_CHECK(c.ok,
            "%s %s [%s]: %lld of %lld elements out of tolerance (atol %.1e rtol %.1e), NMSE %.3e "
            "(max %.1e); worst at (b=%lld,h=%lld,i=%lld,c=%lld): got %.9g ref %.9g |diff| %.3e "
            "bound %.3e",
            backend, what, I->desc, (long long)c.n_bad, (long long)c.n, t.atol, t.rtol, c.nmse,
            t.nmse, (long long)c.at[0], (long long)c.at[1], (long long)c.at[2],
            (long long)c.at[3], c.got, c.ref, fabs(c.got - c.ref), c.bound);
    return c.ok;
}

/* ------------------------------------------------------------------------ */
/* Running the library */

static dhsa_status lib_run(inst *I, dhsa_ctx *ctx, dhsa_backend be) {
    memset(I->o.buf, 0xA5, I->o.nbytes);
    if (I->lse.buf) memset(I->lse.buf, 0xA5, I->lse.nbytes);
    dhsa_attn_desc a = I->a;
    a.backend = be;
    return dhsa_attention(ctx, &a);
}

static void lib_gather(inst *I) {
    const spec *s = &I->s;
    for (int64_t b = 0; b < s->B; b++)
        for (int64_t h = 0; h < s->Hq; h++)
            for (int64_t r = 0; r < I->R; r++) {
                int64_t x = (b * s->Hq + h) * I->R + r;
                for (int64_t c = 0; c < s->dv; c++)
                    I->got_o[x * s->dv + c] =
                        load_elem(I->o.buf, s->to, tb_off(&I->o, b, h, I->rows[r], c));
                if (I->lse.buf)
                    I->got_lse[x] = load_elem(I->lse.buf, DHSA_F32, tb_off(&I->lse, b, h, I->rows[r], 0));
            }
}

/* Runs one backend and compares with the oracle results in I->ref_*. */
static int check_backend(inst *I, dhsa_ctx *ctx, dhsa_backend be) {
    const char *bn = dhsa_backend_name(be);
    describe(I);
    dhsa_status st = lib_run(I, ctx, be);
    T_CHECK(st == DHSA_OK, "%s [%s]: dhsa_attention returned %s: %s", bn, I->desc,
            dhsa_status_str(st), dhsa_last_error());
    if (st != DHSA_OK) return 0;
    T_CHECK(tbuf_outside_untouched(&I->o, 0xA5), "%s [%s]: bytes of o outside the view written",
            bn, I->desc);
    lib_gather(I);
    int ok = expect_close("o", bn, I, I->got_o, I->ref_o, I->s.dv, 1, tol_o(be, I->s.to));
    if (I->lse.buf)
        ok &= expect_close("lse", bn, I, I->got_lse, I->ref_lse, 1, 0, tol_lse(be));
    return ok;
}

/* The usual test: oracle, TILED, and (unless noref) REFERENCE. */
static void run_spec(const spec *sp) {
    inst I;
    inst_init(&I, sp);
    oracle(&I, EXACT, I.ref_o, I.ref_lse);
    check_backend(&I, g_ctx, DHSA_BACKEND_TILED);
    if (!I.s.noref) check_backend(&I, g_ctx, DHSA_BACKEND_REFERENCE);
    inst_free(&I);
}

/* ------------------------------------------------------------------------ */
/* The comparator must be able to fail (STYLE 7). */

static void test_comparator_fails(void) {
    spec sp = {.tag = "comparator", .B = 2, .Hq = 2, .Lq = 20, .Lk = 20, .d = 8,
               .km = KM_B0ALL, .pol = DHSA_MASK_TRUE_IGNORES};
    inst I;
    inst_init(&I, &sp);
    oracle(&I, EXACT, I.ref_o, I.ref_lse);
    int64_t n = I.s.B * I.s.Hq * I.R * I.s.dv, nr = I.s.B * I.s.Hq * I.R;
    tol_t t = tol_o(DHSA_BACKEND_TILED, DHSA_F32);
    T_CHECK(count_masked_rows(&I) == I.s.Hq * I.R, "batch 0 fully ignored should mask %lld rows",
            (long long)(I.s.Hq * I.R));

    memcpy(I.got_o, I.ref_o, (size_t)n * sizeof(double));
    cmp_t c = compare(I.got_o, I.ref_o, I.ref_lse, 2, 2, I.R, I.s.dv, I.rows, t);
    T_CHECK(c.ok, "comparator rejects the oracle's own output");

    /* one element of a live row (batch 1) off by 1e-3 */
    int64_t x = ((1 * 2 + 1) * I.R + 13) * I.s.dv + 5;
    I.got_o[x] += 1e-3;
    c = compare(I.got_o, I.ref_o, I.ref_lse, 2, 2, I.R, I.s.dv, I.rows, t);
    T_CHECK(!c.ok && c.n_bad == 1, "comparator misses a 1e-3 error in one element");
    T_CHECK(c.at[0] == 1 && c.at[1] == 1 && c.at[2] == 13 && c.at[3] == 5,
            "comparator reports the worst element at (%lld,%lld,%lld,%lld), want (1,1,13,5)",
            (long long)c.at[0], (long long)c.at[1], (long long)c.at[2], (long long)c.at[3]);
    I.got_o[x] = NAN;
    c = compare(I.got_o, I.ref_o, I.ref_lse, 2, 2, I.R, I.s.dv, I.rows, t);
    T_CHECK(!c.ok, "comparator accepts a NaN");
    I.got_o[x] = I.ref_o[x];
    /* a masked row (batch 0) that is tiny but not exactly 0 */
    I.got_o[3 * I.s.dv + 2] = 1e-30;
    c = compare(I.got_o, I.ref_o, I.ref_lse, 2, 2, I.R, I.s.dv, I.rows, t);
    T_CHECK(!c.ok, "comparator accepts o = 1e-30 on a row with no allowed key");
    I.got_o[3 * I.s.dv + 2] = 0;
    /* lse: finite where -inf is due, and -inf where a finite value is due */
    memcpy(I.got_lse, I.ref_lse, (size_t)nr * sizeof(double));
    I.got_lse[0] = -1e30;
    c = compare(I.got_lse, I.ref_lse, NULL, 2, 2, I.R, 1, I.rows, tol_lse(DHSA_BACKEND_TILED));
    T_CHECK(!c.ok, "comparator accepts a finite lse where -inf is due");
    I.got_lse[0] = -INFINITY;
    I.got_lse[nr - 1] = -INFINITY;
    c = compare(I.got_lse, I.ref_lse, NULL, 2, 2, I.R, 1, I.rows, tol_lse(DHSA_BACKEND_TILED));
    T_CHECK(!c.ok, "comparator accepts lse = -inf where a finite value is due");
    /* NMSE alone: every element within a loose bound but the total too large */
    memcpy(I.got_o, I.ref_o, (size_t)n * sizeof(double));
    for (int64_t k = n / 2; k < n; k++) I.got_o[k] *= 1.001;
    tol_t loose = {1, 1, 1e-12};
    c = compare(I.got_o, I.ref_o, I.ref_lse, 2, 2, I.R, I.s.dv, I.rows, loose);
    T_CHECK(!c.ok && c.n_bad == 0, "comparator ignores the NMSE bound");
    inst_free(&I);
}

/* Library output against deliberately wrong oracles: must NOT match. This
 * also proves the cases are sensitive to what they claim to test. */
static void test_wrong_oracles(void) {
    spec sp = {.tag = "wrong-oracle", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 100, .Lk = 100, .d = 64,
               .km = KM_RANDOM, .pol = DHSA_MASK_TRUE_IGNORES, .causal = 1, .softcap = 5,
               .sigma = 2.5};
    inst I;
    inst_init(&I, &sp);
    oracle(&I, EXACT, I.ref_o, I.ref_lse);
    if (!check_backend(&I, g_ctx, DHSA_BACKEND_TILED)) { inst_free(&I); return; }
    int64_t no = I.s.B * I.s.Hq * I.R * I.s.dv;
    double *wrong_o = xcalloc((size_t)no, sizeof(double));
    double *wrong_lse = xcalloc((size_t)(I.s.B * I.s.Hq * I.R), sizeof(double));
    tol_t t = tol_o(DHSA_BACKEND_TILED, DHSA_F32);
    static const struct { oracle_opts op; const char *what; } wrong[] = {
        {{1, 1.0, 0}, "the opposite mask polarity"},
        {{0, 1.01, 0}, "a scale 1% off"},
        {{0, 1.0, 1}, "no softcap (softcap 5 must matter at these scores)"},
    };
    for (size_t w = 0; w < sizeof wrong / sizeof wrong[0]; w++) {
        oracle(&I, wrong[w].op, wrong_o, wrong_lse);
        cmp_t c = compare(I.got_o, wrong_o, wrong_lse, I.s.B, I.s.Hq, I.R, I.s.dv, I.rows, t);
        T_CHECK(!c.ok, "TILED output matches an oracle with %s [%s]", wrong[w].what, I.desc);
    }
    free(wrong_o);
    free(wrong_lse);
    inst_free(&I);
}

/* ------------------------------------------------------------------------ */
/* Shapes: L x d x GQA grid at small L, long sequences, Lq != Lk */

static void test_grid(void) {
    static const int64_t Ls[] = {1, 7, 63, 64, 65};
    static const int64_t ds[] = {8, 64, 80, 128};
    static const int64_t gs[] = {1, 2, 4, 8};
    int n = 0;
    for (size_t a = 0; a < 5; a++)
        for (size_t b = 0; b < 4; b++)
            for (size_t g = 0; g < 4; g++, n++) {
                int64_t hkv = gs[g] == 8 ? 1 : 2;
                spec sp = {.tag = "grid", .B = n % 3 == 0 ? 2 : 1, .Hq = hkv * gs[g], .Hkv = hkv,
                           .Lq = Ls[a], .Lk = Ls[a], .d = ds[b], .causal = n & 1,
                           .lse = n % 5 == 0 ? LSE_BLHD : LSE_BHLD, .seed = 1000 + (uint64_t)n};
                run_spec(&sp);
            }
    /* d and dv that no vector width divides */
    static const int64_t odd[][2] = {{1, 1}, {3, 5}, {17, 17}, {33, 7}};
    for (int k = 0; k < 4; k++) {
        spec sp = {.tag = "odd-d", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 70, .Lk = 70, .d = odd[k][0],
                   .dv = odd[k][1], .causal = k & 1, .seed = 77 + (uint64_t)k};
        run_spec(&sp);
    }
}

static void test_long(void) {
    /* L = 1000 and 4097: the oracle only on sampled rows (it is O(L^2 d)). */
    run_spec(&(spec){.tag = "L1000", .Hq = 2, .Hkv = 2, .Lq = 1000, .Lk = 1000, .d = 80,
                     .km = KM_RANDOM, .pol = DHSA_MASK_TRUE_IGNORES, .rows = 64});
    run_spec(&(spec){.tag = "L4097", .Hq = 1, .Lq = 4097, .Lk = 4097, .d = 8, .kb = KB_ALIBI,
                     .rows = 64});
    run_spec(&(spec){.tag = "L1000", .Hq = 4, .Hkv = 1, .Lq = 1000, .Lk = 1000, .d = 64,
                     .causal = 1, .rows = 96, .noref = 1});
    run_spec(&(spec){.tag = "L1000", .Hq = 8, .Hkv = 2, .Lq = 1000, .Lk = 1000, .d = 128,
                     .causal = 1, .window = 100, .rows = 32, .noref = 1});
    run_spec(&(spec){.tag = "L4097", .Hq = 1, .Lq = 4097, .Lk = 4097, .d = 64, .causal = 1,
                     .rows = 64, .noref = 1});
}

static void test_lq_ne_lk(void) {
    /* decode: one query at the end of a 1000-key cache */
    run_spec(&(spec){.tag = "decode", .B = 2, .Hq = 8, .Hkv = 2, .Lq = 1, .Lk = 1000,
                     .q_pos0 = 999, .d = 128, .causal = 1, .km = KM_RANDOM,
                     .pol = DHSA_MASK_TRUE_IGNORES});
    run_spec(&(spec){.tag = "decode-window", .Hq = 4, .Hkv = 4, .Lq = 1, .Lk = 1000,
                     .q_pos0 = 999, .d = 64, .causal = 1, .window = 100});
    run_spec(&(spec){.tag = "decode-noncausal", .Hq = 4, .Hkv = 1, .Lq = 1, .Lk = 1000,
                     .q_pos0 = 999, .d = 80});
    /* chunked prefill: 37 new queries after 163 cached keys */
    run_spec(&(spec){.tag = "chunked-prefill", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 37, .Lk = 200,
                     .q_pos0 = 163, .d = 64, .causal = 1});
    run_spec(&(spec){.tag = "chunked-prefill", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 37, .Lk = 200,
                     .q_pos0 = 163, .d = 64, .causal = 1, .window = 16, .km = KM_SUFFIX,
                     .pol = DHSA_MASK_TRUE_IGNORES});
    /* Decode-sized tiles (Lq * Hq/Hkv <= 8 queries) take their own narrow
     * kernels: F16/BF16 caches, strided views, dv != d, masks there too. */
    run_spec(&(spec){.tag = "decode-f16-cache", .B = 2, .Hq = 8, .Hkv = 2, .Lq = 1, .Lk = 777,
                     .q_pos0 = 776, .d = 128, .dv = 80, .tk = DHSA_F16, .tv = DHSA_F16,
                     .causal = 1, .km = KM_RANDOM, .pol = DHSA_MASK_TRUE_KEEPS});
    run_spec(&(spec){.tag = "decode-bf16-strided", .Hq = 6, .Hkv = 2, .Lq = 2, .Lk = 300,
                     .q_pos0 = 298, .d = 80, .dv = 50, .tq = DHSA_BF16, .tk = DHSA_BF16,
                     .tv = DHSA_BF16, .lk = LAY_DIM2, .lv = LAY_PAD, .lo = LAY_PAD, .causal = 1,
                     .softcap = 20, .kb = KB_ALIBI});
    run_spec(&(spec){.tag = "decode-f16-5-queries-wide", .Hq = 10, .Hkv = 2, .Lq = 1, .Lk = 333, .q_pos0 = 332,
                     .d = 200, .dv = 70, .tk = DHSA_F16, .tv = DHSA_F16, .causal = 1});
    run_spec(&(spec){.tag = "decode-bf16-contiguous", .Hq = 12, .Hkv = 4, .Lq = 2, .Lk = 130, .q_pos0 = 128,
                     .d = 40, .dv = 24, .tk = DHSA_BF16, .tv = DHSA_BF16, .causal = 1});
    run_spec(&(spec){.tag = "decode-wide-d", .Hq = 4, .Hkv = 2, .Lq = 1, .Lk = 500, .q_pos0 = 499,
                     .d = 160, .dv = 50, .causal = 1});
    run_spec(&(spec){.tag = "decode-f16-d64-4-queries", .B = 2, .Hq = 8, .Hkv = 2, .Lq = 1, .Lk = 777,
                     .q_pos0 = 776, .d = 64, .tk = DHSA_F16, .tv = DHSA_F16, .causal = 1});
    run_spec(&(spec){.tag = "decode-bf16-d64-2-queries", .Hq = 4, .Hkv = 2, .Lq = 1, .Lk = 517, .q_pos0 = 516,
                     .d = 64, .tk = DHSA_BF16, .tv = DHSA_BF16, .lk = LAY_DIM2, .causal = 1, .window = 200});
    run_spec(&(spec){.tag = "decode-f16-d64-1-query", .Hq = 3, .Hkv = 3, .Lq = 1, .Lk = 401, .q_pos0 = 400,
                     .d = 64, .tk = DHSA_F16, .tv = DHSA_F16, .causal = 1, .km = KM_RANDOM,
                     .pol = DHSA_MASK_TRUE_KEEPS});
    run_spec(&(spec){.tag = "decode-mqa", .Hq = 8, .Hkv = 1, .Lq = 1, .Lk = 1000, .q_pos0 = 999,
                     .d = 64, .causal = 1, .window = 300, .am = AM_FULL, .to = DHSA_F16});
    run_spec(&(spec){.tag = "decode-8-columns", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 4, .Lk = 129,
                     .q_pos0 = 125, .d = 17, .dv = 33, .causal = 1, .km = KM_B0ALL,
                     .pol = DHSA_MASK_TRUE_IGNORES});
    run_spec(&(spec){.tag = "decode-3-rows", .Hq = 1, .Lq = 3, .Lk = 64, .q_pos0 = 61, .d = 8,
                     .causal = 1, .kb = KB_SHIFT});
    run_spec(&(spec){.tag = "Lq>Lk", .Hq = 2, .Lq = 100, .Lk = 7, .d = 8});
    run_spec(&(spec){.tag = "Lq>Lk-causal", .Hq = 2, .Lq = 130, .Lk = 65, .d = 64, .causal = 1});
    run_spec(&(spec){.tag = "Lq<Lk-window", .Hq = 2, .Hkv = 1, .Lq = 65, .Lk = 130, .q_pos0 = 65,
                     .d = 80, .causal = 1, .window = 64});
}

/* ------------------------------------------------------------------------ */
/* Masks, biases, positions */

static void test_masks(void) {
    const dhsa_mask_polarity IG = DHSA_MASK_TRUE_IGNORES, KE = DHSA_MASK_TRUE_KEEPS;
#define MASK_BASE .B = 2, .Hq = 4, .Hkv = 2, .Lq = 130, .Lk = 130, .d = 64
    run_spec(&(spec){.tag = "key-mask", MASK_BASE, .km = KM_RANDOM, .pol = IG});
    run_spec(&(spec){.tag = "key-mask", MASK_BASE, .km = KM_RANDOM, .pol = KE});
    /* whole leading tiles ignored: the online softmax starts from -inf */
    run_spec(&(spec){.tag = "key-mask", MASK_BASE, .km = KM_PREFIX, .pol = IG});
    run_spec(&(spec){.tag = "key-mask", MASK_BASE, .km = KM_PREFIX, .pol = KE});
    run_spec(&(spec){.tag = "key-mask", MASK_BASE, .km = KM_SUFFIX, .pol = IG, .causal = 1});
    run_spec(&(spec){.tag = "key-mask-bcast", MASK_BASE, .km = KM_RANDOM, .pol = IG, .km_bstride = -1});
    run_spec(&(spec){.tag = "key-mask-bcast", MASK_BASE, .km = KM_PREFIX, .pol = KE, .km_bstride = -1});
    run_spec(&(spec){.tag = "key-mask-stride", MASK_BASE, .km = KM_RANDOM, .pol = KE, .km_bstride = 3});

    run_spec(&(spec){.tag = "key-bias", MASK_BASE, .kb = KB_RANDOM});
    run_spec(&(spec){.tag = "key-bias", MASK_BASE, .kb = KB_ALIBI, .causal = 1});
    run_spec(&(spec){.tag = "key-bias", MASK_BASE, .kb = KB_SHIFT});
    run_spec(&(spec){.tag = "key-bias-bcast", MASK_BASE, .kb = KB_ALIBI, .kb_bstride = -1});
    run_spec(&(spec){.tag = "key-bias-stride", MASK_BASE, .kb = KB_RANDOM, .kb_bstride = 5});

    run_spec(&(spec){.tag = "attn-mask", MASK_BASE, .am = AM_FULL});
    run_spec(&(spec){.tag = "attn-mask", MASK_BASE, .am = AM_B1, .am_rowinf = 1});
    run_spec(&(spec){.tag = "attn-mask", MASK_BASE, .am = AM_H1, .causal = 1});
    run_spec(&(spec){.tag = "attn-mask", MASK_BASE, .am = AM_B1H1, .am_rowinf = 1});
    run_spec(&(spec){.tag = "attn-mask", .B = 3, .Hq = 2, .Lq = 37, .Lk = 200, .q_pos0 = 163,
                     .d = 8, .am = AM_FULL, .causal = 1});

    /* everything at once */
    run_spec(&(spec){.tag = "all-features", .B = 3, .Hq = 8, .Hkv = 2, .Lq = 150, .Lk = 170,
                     .q_pos0 = 20, .d = 80, .dv = 48, .causal = 1, .window = 50, .softcap = 20,
                     .scale = 0.15f, .km = KM_RANDOM, .pol = KE, .km_bstride = 2,
                     .kb = KB_ALIBI, .am = AM_H1, .am_rowinf = 1, .lse = LSE_BLHD});
#undef MASK_BASE
}

/* A mask m read as TRUE_IGNORES keeps exactly the keys that !m read as
 * TRUE_KEEPS keeps: outputs are bitwise equal. m as TRUE_KEEPS differs. */
static void test_polarity(void) {
    static const uint8_t nonzero[4] = {1, 7, 0x80, 0xFF};
    spec sp = {.tag = "polarity", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 150, .Lk = 150, .d = 64,
               .km = KM_RANDOM, .pol = DHSA_MASK_TRUE_IGNORES, .causal = 1};
    inst I;
    inst_init(&I, &sp);
    int64_t n = (I.s.B - 1) * I.km_bs + I.s.Lk;
    uint8_t *m = malloc((size_t)n);
    memcpy(m, I.km, (size_t)n);
    size_t ob = I.o.nbytes, lb = I.lse.nbytes;
    unsigned char *o1 = malloc(ob), *l1 = malloc(lb);
    static const dhsa_backend bes[2] = {DHSA_BACKEND_TILED, DHSA_BACKEND_REFERENCE};
    for (int e = 0; e < 2; e++) {
        const char *bn = dhsa_backend_name(bes[e]);
        memcpy(I.km, m, (size_t)n);
        I.s.pol = I.a.key_mask_polarity = DHSA_MASK_TRUE_IGNORES;
        oracle(&I, EXACT, I.ref_o, I.ref_lse);
        if (!check_backend(&I, g_ctx, bes[e])) continue;
        memcpy(o1, I.o.buf, ob);
        memcpy(l1, I.lse.buf, lb);

        for (int64_t x = 0; x < n; x++) I.km[x] = m[x] ? 0 : nonzero[x & 3];
        I.s.pol = I.a.key_mask_polarity = DHSA_MASK_TRUE_KEEPS;
        dhsa_status st = lib_run(&I, g_ctx, bes[e]);
        T_CHECK(st == DHSA_OK && memcmp(o1, I.o.buf, ob) == 0 && memcmp(l1, I.lse.buf, lb) == 0,
                "%s: mask m with TRUE_IGNORES and !m with TRUE_KEEPS differ (status %s) [%s]", bn,
                dhsa_status_str(st), I.desc);

        memcpy(I.km, m, (size_t)n);
        st = lib_run(&I, g_ctx, bes[e]);
        T_CHECK(st == DHSA_OK && memcmp(o1, I.o.buf, ob) != 0,
                "%s: the same mask bytes with TRUE_KEEPS give the TRUE_IGNORES result [%s]", bn,
                I.desc);
        oracle(&I, EXACT, I.ref_o, I.ref_lse);
        check_backend(&I, g_ctx, bes[e]);
    }
    free(m), free(o1), free(l1);
    inst_free(&I);
}

static void test_positions(void) {
    /* causal, q_pos0 > 0, windows 1 / 16 / 100 / > L, with and without causal */
    run_spec(&(spec){.tag = "causal", .B = 2, .Hq = 2, .Lq = 200, .Lk = 200, .d = 64, .causal = 1});
    run_spec(&(spec){.tag = "causal-qpos0", .Hq = 4, .Hkv = 2, .Lq = 100, .Lk = 100,
                     .q_pos0 = 10, .d = 64, .causal = 1});
    static const int64_t wins[] = {1, 16, 100, 5000};
    for (int w = 0; w < 4; w++)
        for (int causal = 0; causal < 2; causal++)
            run_spec(&(spec){.tag = "window", .Hq = 2, .Hkv = 1, .Lq = 200, .Lk = 200,
                             .d = w & 1 ? 8 : 64, .causal = causal, .window = wins[w],
                             .q_pos0 = causal ? 0 : 30});
    /* softcap: scores with std ~6 (sigma 2.5), so both caps matter */
    run_spec(&(spec){.tag = "softcap", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 130, .Lk = 130, .d = 64,
                     .softcap = 30, .sigma = 2.5});
    run_spec(&(spec){.tag = "softcap", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 130, .Lk = 130, .d = 64,
                     .softcap = 5, .sigma = 2.5, .causal = 1});
    run_spec(&(spec){.tag = "softcap+bias", .Hq = 2, .Lq = 65, .Lk = 65, .d = 8, .softcap = 5,
                     .sigma = 2.5, .kb = KB_RANDOM, .am = AM_FULL});
    /* custom scale */
    run_spec(&(spec){.tag = "scale", .Hq = 2, .Lq = 100, .Lk = 100, .d = 64, .scale = 0.05f});
    run_spec(&(spec){.tag = "scale", .Hq = 2, .Lq = 100, .Lk = 100, .d = 64, .scale = 0.3f,
                     .causal = 1});
    run_spec(&(spec){.tag = "scale+softcap", .Hq = 2, .Lq = 100, .Lk = 100, .d = 80,
                     .scale = 1.0f, .softcap = 5, .sigma = 0.6});
}

/* Rows with no allowed key: o exactly 0, lse = -inf, no NaN. */
static void test_all_masked(void) {
    static const spec cases[] = {
        {.tag = "masked:key-mask-batch0", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 70, .Lk = 70, .d = 64,
         .km = KM_B0ALL, .pol = DHSA_MASK_TRUE_IGNORES},
        {.tag = "masked:key-mask-batch0", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 70, .Lk = 70, .d = 64,
         .km = KM_B0ALL, .pol = DHSA_MASK_TRUE_KEEPS, .causal = 1},
        {.tag = "masked:key-bias-batch0", .B = 2, .Hq = 2, .Lq = 70, .Lk = 70, .d = 8,
         .kb = KB_B0INF},
        {.tag = "masked:attn-mask-row", .B = 2, .Hq = 2, .Lq = 70, .Lk = 140, .d = 64,
         .am = AM_B1H1, .am_rowinf = 1},
        {.tag = "masked:window-beyond-keys", .Hq = 2, .Lq = 8, .Lk = 40, .q_pos0 = 60, .d = 64,
         .causal = 1, .window = 16},
        {.tag = "masked:window-partly", .B = 2, .Hq = 2, .Lq = 12, .Lk = 40, .q_pos0 = 50,
         .d = 80, .causal = 1, .window = 16, .lse = LSE_BLHD},
        {.tag = "masked:f16-out", .B = 2, .Hq = 2, .Lq = 20, .Lk = 70, .d = 8, .to = DHSA_F16,
         .km = KM_B0ALL, .pol = DHSA_MASK_TRUE_IGNORES},
        /* an empty key set (decode with an empty cache): every row has no key */
        {.tag = "masked:Lk=0", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 5, .Lk = 0, .d = 64},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        inst I;
        inst_init(&I, &cases[c]);
        oracle(&I, EXACT, I.ref_o, I.ref_lse);
        T_CHECK(count_masked_rows(&I) > 0, "[%s] has no fully masked row", I.desc);
        check_backend(&I, g_ctx, DHSA_BACKEND_TILED);
        check_backend(&I, g_ctx, DHSA_BACKEND_REFERENCE);
        inst_free(&I);
    }
}

/* ------------------------------------------------------------------------ */
/* Types, strides, batches */

static void test_types_strides(void) {
    const dhsa_type F32 = DHSA_F32, F16 = DHSA_F16, B16 = DHSA_BF16;
    /* dv != d */
    run_spec(&(spec){.tag = "dv", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 100, .Lk = 100, .d = 64, .dv = 32,
                     .causal = 1});
    run_spec(&(spec){.tag = "dv", .Hq = 2, .Lq = 100, .Lk = 100, .d = 8, .dv = 80,
                     .km = KM_RANDOM, .pol = DHSA_MASK_TRUE_KEEPS});
    /* F16 / BF16 inputs and outputs */
    run_spec(&(spec){.tag = "f16-in", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 130, .Lk = 130, .d = 80,
                     .tq = F16, .tk = F16, .tv = F16, .causal = 1});
    run_spec(&(spec){.tag = "bf16-in", .B = 2, .Hq = 4, .Hkv = 1, .Lq = 65, .Lk = 65, .d = 64,
                     .tq = B16, .tk = B16, .tv = B16, .km = KM_RANDOM,
                     .pol = DHSA_MASK_TRUE_IGNORES});
    run_spec(&(spec){.tag = "mixed-in", .Hq = 2, .Lq = 70, .Lk = 70, .d = 128, .tq = F16,
                     .tk = B16, .tv = F32, .kb = KB_RANDOM});
    run_spec(&(spec){.tag = "f16-out", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 130, .Lk = 130, .d = 64,
                     .to = F16, .causal = 1});
    run_spec(&(spec){.tag = "bf16-out", .Hq = 2, .Lq = 65, .Lk = 65, .d = 8, .to = B16});
    run_spec(&(spec){.tag = "f16-all", .Hq = 4, .Hkv = 2, .Lq = 37, .Lk = 200, .q_pos0 = 163,
                     .d = 64, .tq = F16, .tk = F16, .tv = F16, .to = F16, .causal = 1,
                     .km = KM_RANDOM, .pol = DHSA_MASK_TRUE_IGNORES});
    run_spec(&(spec){.tag = "bf16-all", .Hq = 2, .Lq = 100, .Lk = 100, .d = 80, .dv = 32,
                     .tq = B16, .tk = B16, .tv = B16, .to = B16, .softcap = 5, .sigma = 2.5});
    /* strided views */
    run_spec(&(spec){.tag = "batch-first", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 100, .Lk = 100,
                     .d = 64, .lq = LAY_BLHD, .lk = LAY_BLHD, .lv = LAY_BLHD, .lo = LAY_BLHD,
                     .lse = LSE_BLHD, .causal = 1});
    run_spec(&(spec){.tag = "padded", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 100, .Lk = 120,
                     .q_pos0 = 20, .d = 80, .lq = LAY_PAD, .lk = LAY_PAD, .lv = LAY_DIM2,
                     .lo = LAY_PAD, .causal = 1, .km = KM_RANDOM, .pol = DHSA_MASK_TRUE_IGNORES});
    run_spec(&(spec){.tag = "dim-stride-2", .B = 2, .Hq = 2, .Hkv = 1, .Lq = 65, .Lk = 65, .d = 64,
                     .dv = 32, .lq = LAY_DIM2, .lk = LAY_DIM2, .lv = LAY_PAD, .lo = LAY_DIM2});
    run_spec(&(spec){.tag = "strided-f16", .B = 2, .Hq = 4, .Hkv = 1, .Lq = 70, .Lk = 70, .d = 64,
                     .tq = F16, .tk = B16, .tv = F16, .to = F16, .lq = LAY_BLHD, .lk = LAY_DIM2,
                     .lv = LAY_PAD, .lo = LAY_PAD, .lse = LSE_BLHD});
    /* B > 1 with per-batch key masks */
    run_spec(&(spec){.tag = "batches", .B = 3, .Hq = 4, .Hkv = 2, .Lq = 90, .Lk = 90, .d = 64,
                     .km = KM_SUFFIX, .pol = DHSA_MASK_TRUE_IGNORES});
    run_spec(&(spec){.tag = "batches", .B = 3, .Hq = 2, .Lq = 90, .Lk = 90, .d = 8,
                     .km = KM_PREFIX, .pol = DHSA_MASK_TRUE_KEEPS, .kb = KB_RANDOM, .causal = 1});
}

/* ------------------------------------------------------------------------ */
/* Results do not depend on the number of threads (bitwise). */

static void test_thread_invariance(void) {
    static const spec cases[] = {
        {.tag = "threads", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 300, .Lk = 300, .d = 64, .causal = 1,
         .softcap = 20, .km = KM_RANDOM, .pol = DHSA_MASK_TRUE_IGNORES, .kb = KB_RANDOM,
         .rows = 64},
        {.tag = "threads-decode", .B = 3, .Hq = 8, .Hkv = 2, .Lq = 1, .Lk = 1000, .q_pos0 = 999,
         .d = 128, .causal = 1, .tk = DHSA_F16, .tv = DHSA_F16},
    };
    static const dhsa_backend bes[2] = {DHSA_BACKEND_TILED, DHSA_BACKEND_REFERENCE};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        inst I;
        inst_init(&I, &cases[k]);
        oracle(&I, EXACT, I.ref_o, I.ref_lse);
        unsigned char *o1 = xcalloc(I.o.nbytes, 1), *l1 = xcalloc(I.lse.nbytes, 1);
        for (int e = 0; e < 2; e++)
            for (int nt = 1; nt <= 3; nt++) {
                dhsa_ctx_params p = dhsa_ctx_default_params();
                p.n_threads = nt;
                dhsa_ctx *ctx = NULL;
                if (dhsa_ctx_create(&p, &ctx) != DHSA_OK) {
                    T_CHECK(0, "ctx_create(%d threads): %s", nt, dhsa_last_error());
                    continue;
                }
                if (check_backend(&I, ctx, bes[e]) && nt == 1) {
                    memcpy(o1, I.o.buf, I.o.nbytes);
                    memcpy(l1, I.lse.buf, I.lse.nbytes);
                } else if (nt > 1) {
                    T_CHECK(memcmp(o1, I.o.buf, I.o.nbytes) == 0 &&
                                memcmp(l1, I.lse.buf, I.lse.nbytes) == 0,
                            "%s with %d threads differs bitwise from 1 thread [%s]",
                            dhsa_backend_name(bes[e]), nt, I.desc);
                }
                dhsa_ctx_free(ctx);
            }
        free(o1), free(l1);
        inst_free(&I);
    }
}

/* ------------------------------------------------------------------------ */
/* Errors: a code, a sentence, and nothing written. */

static void expect_error(inst *I, const dhsa_attn_desc *a, dhsa_status want, const char *what) {
    memset(I->o.buf, 0xA5, I->o.nbytes);
    if (I->lse.buf) memset(I->lse.buf, 0xA5, I->lse.nbytes);
    dhsa_status st = dhsa_attention(g_ctx, a);
    if (want != DHSA_OK)
        T_CHECK(st == want, "%s: dhsa_attention returned %s, want %s", what, dhsa_status_str(st),
                dhsa_status_str(want));
    else
        T_CHECK(st < 0, "%s: dhsa_attention returned %s, want an error", what, dhsa_status_str(st));
    T_CHECK(dhsa_last_error()[0] != '\0', "%s: no error sentence", what);
    T_CHECK(all_bytes(I->o.buf, I->o.nbytes, 0xA5) &&
                (!I->lse.buf || all_bytes(I->lse.buf, I->lse.nbytes, 0xA5)),
            "%s: o or lse written although the call failed", what);
    size_t ws = 12345;
    dhsa_status st2 = dhsa_attn_workspace_size(g_ctx, a, &ws);
    T_CHECK(st2 == st, "%s: workspace_size returned %s but dhsa_attention %s", what,
            dhsa_status_str(st2), dhsa_status_str(st));
}

static void test_errors(void) {
    spec sp = {.tag = "errors", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 16, .Lk = 16, .d = 8,
               .km = KM_RANDOM, .pol = DHSA_MASK_TRUE_IGNORES, .am = AM_FULL, .kb = KB_RANDOM};
    inst I;
    inst_init(&I, &sp);
    dhsa_attn_desc a;

    /* the base descriptor is valid */
    dhsa_status st = lib_run(&I, g_ctx, DHSA_BACKEND_TILED);
    T_CHECK(st == DHSA_OK, "error-test base case fails: %s %s", dhsa_status_str(st), dhsa_last_error());

    a = I.a; a.key_mask_polarity = DHSA_MASK_NO_POLARITY;
    expect_error(&I, &a, DHSA_ERR_INVALID_ARG, "key_mask with DHSA_MASK_NO_POLARITY");
    a = I.a; a.key_mask_polarity = (dhsa_mask_polarity)7;
    expect_error(&I, &a, DHSA_ERR_INVALID_ARG, "key_mask polarity 7");
    a = I.a; a.window = -1;
    expect_error(&I, &a, DHSA_ERR_INVALID_ARG, "window -1");
    a = I.a; a.q.data = NULL;
    expect_error(&I, &a, DHSA_ERR_INVALID_ARG, "q.data NULL");
    a = I.a; a.k.data = NULL;
    expect_error(&I, &a, DHSA_ERR_INVALID_ARG, "k.data NULL");
    a = I.a; a.v.data = NULL;
    expect_error(&I, &a, DHSA_ERR_INVALID_ARG, "v.data NULL");
    a = I.a; a.o.data = NULL;
    expect_error(&I, &a, DHSA_ERR_INVALID_ARG, "o.data NULL");
    a = I.a; a.k.shape[3] = 4; a.k.stride[2] = 4;
    expect_error(&I, &a, DHSA_ERR_SHAPE, "k d=4 vs q d=8");
    a = I.a; a.v.shape[2] = 15;
    expect_error(&I, &a, DHSA_ERR_SHAPE, "v Lk=15 vs k Lk=16");
    a = I.a; a.k.shape[0] = 1; a.v.shape[0] = 1;
    expect_error(&I, &a, DHSA_ERR_SHAPE, "k/v batch 1 vs q batch 2");
    a = I.a; a.o.shape[2] = 15;
    expect_error(&I, &a, DHSA_ERR_SHAPE, "o Lq=15 vs q Lq=16");
    a = I.a; a.o.shape[3] = 7;
    expect_error(&I, &a, DHSA_ERR_SHAPE, "o dv=7 vs v dv=8");
    a = I.a; a.o.shape[1] = 2;
    expect_error(&I, &a, DHSA_ERR_SHAPE, "o heads 2 vs q heads 4");
    a = I.a; a.lse.shape[2] = 15;
    expect_error(&I, &a, DHSA_ERR_SHAPE, "lse Lq=15 vs q Lq=16");
    a = I.a; a.lse.type = DHSA_F16;
    expect_error(&I, &a, DHSA_OK, "lse of type F16 (F32 only)");
    a = I.a; a.attn_mask.shape[3] = 15;
    expect_error(&I, &a, DHSA_ERR_SHAPE, "attn_mask Lk=15 vs 16");
    a = I.a; a.attn_mask.shape[1] = 2; a.attn_mask.stride[1] = 0;
    expect_error(&I, &a, DHSA_ERR_SHAPE, "attn_mask heads 2 vs Hq 4 (neither 1 nor Hq)");
    a = I.a; a.attn_mask.type = DHSA_F16;
    expect_error(&I, &a, DHSA_OK, "attn_mask of type F16 (F32 only)");
    a = I.a; a.q.shape[2] = -1; a.o.shape[2] = -1;
    expect_error(&I, &a, DHSA_OK, "negative Lq");
    a = I.a; a.q.type = (dhsa_type)7;
    expect_error(&I, &a, DHSA_OK, "q of type 7");
    a = I.a; a.backend = (dhsa_backend)9;
    expect_error(&I, &a, DHSA_OK, "backend 9");
    /* out of their domains (the header gives no code: any error will do) */
    a = I.a; a.softcap = -1;
    expect_error(&I, &a, DHSA_OK, "softcap -1");
    a = I.a; a.scale = NAN;
    expect_error(&I, &a, DHSA_OK, "scale NaN");
    a = I.a; a.q_pos0 = -1;
    expect_error(&I, &a, DHSA_OK, "q_pos0 -1");
    a = I.a; a.key_mask_batch_stride = -16;
    expect_error(&I, &a, DHSA_OK, "key_mask_batch_stride -16");
    a = I.a; a.key_bias_batch_stride = -16;
    expect_error(&I, &a, DHSA_OK, "key_bias_batch_stride -16");

    /* Lq = 0 is a valid call with nothing to do: OK, nothing written */
    a = I.a; a.q.shape[2] = 0; a.o.shape[2] = 0; a.lse.shape[2] = 0; a.attn_mask.shape[2] = 0;
    memset(I.o.buf, 0xA5, I.o.nbytes);
    memset(I.lse.buf, 0xA5, I.lse.nbytes);
    st = dhsa_attention(g_ctx, &a);
    T_CHECK(st == DHSA_OK, "Lq=0 returned %s: %s", dhsa_status_str(st), dhsa_last_error());
    T_CHECK(all_bytes(I.o.buf, I.o.nbytes, 0xA5) && all_bytes(I.lse.buf, I.lse.nbytes, 0xA5),
            "Lq=0 wrote o or lse");
    inst_free(&I);

    /* Hq not a multiple of Hkv, and Hkv > Hq */
    spec bad = {.tag = "errors-gqa", .Hq = 4, .Hkv = 3, .Lq = 8, .Lk = 8, .d = 8};
    inst_init(&I, &bad);
    expect_error(&I, &I.a, DHSA_ERR_SHAPE, "Hq=4 with Hkv=3");
    inst_free(&I);
    bad.Hq = 2, bad.Hkv = 4;
    inst_init(&I, &bad);
    expect_error(&I, &I.a, DHSA_ERR_SHAPE, "Hq=2 with Hkv=4");
    inst_free(&I);
}

/* ------------------------------------------------------------------------ */
/* Workspace queries and memory budgets */

static size_t ws_for(dhsa_ctx *ctx, dhsa_backend be, void *qb, void *kb, void *vb, void *ob,
                     int64_t Lq, int64_t Lk) {
    dhsa_attn_desc a = dhsa_attn_default_desc();
    a.q = dhsa_tensor_bhld(qb, DHSA_F32, 1, 4, Lq, 64);
    a.k = dhsa_tensor_bhld(kb, DHSA_F32, 1, 2, Lk, 64);
    a.v = dhsa_tensor_bhld(vb, DHSA_F32, 1, 2, Lk, 64);
    a.o = dhsa_tensor_bhld(ob, DHSA_F32, 1, 4, Lq, 64);
    a.causal = 1;
    a.backend = be;
    size_t ws = 0;
    dhsa_status st = dhsa_attn_workspace_size(ctx, &a, &ws);
    T_CHECK(st == DHSA_OK, "workspace_size(%s, Lq=%lld, Lk=%lld): %s %s", dhsa_backend_name(be),
            (long long)Lq, (long long)Lk, dhsa_status_str(st), dhsa_last_error());
    return ws;
}

static void test_memory(void) {
    /* 1. A tiny budget refuses the call before any work. */
    dhsa_ctx_params p = dhsa_ctx_default_params();
    p.n_threads = 2;
    p.mem_budget = 1024;
    dhsa_ctx *tiny = NULL;
    if (dhsa_ctx_create(&p, &tiny) != DHSA_OK) {
        T_CHECK(0, "ctx_create(budget 1024): %s", dhsa_last_error());
        return;
    }
    spec sp = {.tag = "budget", .B = 1, .Hq = 4, .Hkv = 2, .Lq = 256, .Lk = 256, .d = 64,
               .causal = 1, .rows = 32};
    inst I;
    inst_init(&I, &sp);
    for (int e = 0; e < 2; e++) {
        dhsa_backend be = e ? DHSA_BACKEND_REFERENCE : DHSA_BACKEND_TILED;
        dhsa_attn_desc a = I.a;
        a.backend = be;
        size_t ws = 0;
        dhsa_status st = dhsa_attn_workspace_size(tiny, &a, &ws);
        T_CHECK(st == DHSA_OK, "workspace_size on a small-budget ctx: %s", dhsa_status_str(st));
        dhsa_mem_stats s0 = dhsa_ctx_mem_stats(tiny);
        T_CHECK(s0.in_use + ws > 1024, "%s workspace %zu bytes fits 1024 bytes: no budget test",
                dhsa_backend_name(be), ws);
        memset(I.o.buf, 0xA5, I.o.nbytes);
        memset(I.lse.buf, 0xA5, I.lse.nbytes);
        st = dhsa_attention(tiny, &a);
        T_CHECK(st == DHSA_ERR_MEMORY_BUDGET, "%s under a 1024-byte budget returned %s",
                dhsa_backend_name(be), dhsa_status_str(st));
        T_CHECK(dhsa_last_error()[0] != '\0', "budget refusal set no sentence");
        T_CHECK(all_bytes(I.o.buf, I.o.nbytes, 0xA5) && all_bytes(I.lse.buf, I.lse.nbytes, 0xA5),
                "%s refused by the budget but wrote o or lse", dhsa_backend_name(be));
        dhsa_mem_stats s1 = dhsa_ctx_mem_stats(tiny);
        T_CHECK(s1.in_use == s0.in_use && s1.n_allocs == s0.n_allocs,
                "a refused call allocated (in_use %zu -> %zu, n_allocs %llu -> %llu)", s0.in_use,
                s1.in_use, (unsigned long long)s0.n_allocs, (unsigned long long)s1.n_allocs);
    }
    dhsa_ctx_free(tiny);

    /* 2. TILED workspace does not depend on Lq or Lk; REFERENCE's grows with Lk. */
    float *qb = xcalloc((size_t)4 * 4096 * 64, sizeof(float));
    float *kvb = xcalloc((size_t)2 * 4097 * 64, sizeof(float));
    float *vb = xcalloc((size_t)2 * 4097 * 64, sizeof(float));
    float *ob = xcalloc((size_t)4 * 4096 * 64, sizeof(float));
    size_t w1 = ws_for(g_ctx, DHSA_BACKEND_TILED, qb, kvb, vb, ob, 64, 1000);
    size_t w2 = ws_for(g_ctx, DHSA_BACKEND_TILED, qb, kvb, vb, ob, 64, 4097);
    size_t w3 = ws_for(g_ctx, DHSA_BACKEND_TILED, qb, kvb, vb, ob, 4096, 1000);
    size_t w4 = ws_for(g_ctx, DHSA_BACKEND_TILED, qb, kvb, vb, ob, 4096, 4097);
    T_CHECK(w1 == w2 && w1 == w3 && w1 == w4,
            "TILED workspace depends on L: %zu (Lq 64, Lk 1000), %zu (64, 4097), %zu (4096, 1000), "
            "%zu (4096, 4097)", w1, w2, w3, w4);
    size_t r1 = ws_for(g_ctx, DHSA_BACKEND_REFERENCE, qb, kvb, vb, ob, 64, 1000);
    size_t r2 = ws_for(g_ctx, DHSA_BACKEND_REFERENCE, qb, kvb, vb, ob, 64, 4097);
    T_CHECK(r2 > r1, "REFERENCE workspace does not grow with Lk: %zu (1000) vs %zu (4097)", r1, r2);
    free(qb), free(kvb), free(vb), free(ob);

    /* 3. A budget of exactly the workspace is enough; one byte less is not.
     *    Kernels keep their workspace in the ctx's grow-only scratch arena
     *    (counted in in_use) until dhsa_ctx_trim, so each backend starts from
     *    a trimmed ctx: then the call's peak is exactly the workspace, in_use
     *    stays at it, a second call allocates nothing, and trim gives it back. */
    p.mem_budget = 0;
    dhsa_ctx *ctx = NULL;
    if (dhsa_ctx_create(&p, &ctx) != DHSA_OK) {
        T_CHECK(0, "ctx_create: %s", dhsa_last_error());
        inst_free(&I);
        return;
    }
    oracle(&I, EXACT, I.ref_o, I.ref_lse);
    for (int e = 0; e < 2; e++) {
        dhsa_backend be = e ? DHSA_BACKEND_REFERENCE : DHSA_BACKEND_TILED;
        const char *bn = dhsa_backend_name(be);
        dhsa_attn_desc a = I.a;
        a.backend = be;
        dhsa_ctx_trim(ctx);
        size_t base = dhsa_ctx_mem_stats(ctx).in_use;
        T_CHECK(base == 0, "a ctx with nothing allocated holds %zu bytes after trim", base);
        size_t ws = 0;
        T_CHECK(dhsa_attn_workspace_size(ctx, &a, &ws) == DHSA_OK, "workspace_size failed");
        T_CHECK(ws > 0, "%s reports a zero workspace for Lq=Lk=256", bn);
        if (ws > 0) {
            T_CHECK(dhsa_ctx_set_budget(ctx, base + ws - 1) == DHSA_OK, "set_budget failed");
            uint64_t n0 = dhsa_ctx_mem_stats(ctx).n_allocs;
            dhsa_status st = lib_run(&I, ctx, be);
            T_CHECK(st == DHSA_ERR_MEMORY_BUDGET,
                    "%s with a budget one byte below its workspace (%zu) returned %s", bn, ws,
                    dhsa_status_str(st));
            T_CHECK(all_bytes(I.o.buf, I.o.nbytes, 0xA5), "%s refused but wrote o", bn);
            dhsa_mem_stats s1 = dhsa_ctx_mem_stats(ctx);
            T_CHECK(s1.in_use == base && s1.n_allocs == n0,
                    "%s refused by the budget but allocated (in_use %zu, n_allocs +%llu)", bn,
                    s1.in_use, (unsigned long long)(s1.n_allocs - n0));
        }
        T_CHECK(dhsa_ctx_set_budget(ctx, base + ws) == DHSA_OK, "set_budget failed");
        dhsa_ctx_reset_peak(ctx);
        uint64_t n0 = dhsa_ctx_mem_stats(ctx).n_allocs;
        check_backend(&I, ctx, be); /* must succeed with exactly the workspace */
        dhsa_mem_stats s = dhsa_ctx_mem_stats(ctx);
        T_CHECK(s.peak >= base + ws, "%s: peak %zu below in_use %zu + workspace %zu", bn, s.peak,
                base, ws);
        T_CHECK(s.peak <= base + ws, "%s: peak %zu above in_use %zu + workspace %zu", bn, s.peak,
                base, ws);
        T_CHECK(s.in_use == base + ws, "%s: in_use %zu after the call, want %zu + %zu (scratch kept)",
                bn, s.in_use, base, ws);
        T_CHECK(ws == 0 || s.n_allocs > n0, "%s: workspace not allocated through the ctx", bn);
        /* the same call again reuses the arena */
        check_backend(&I, ctx, be);
        dhsa_mem_stats s2 = dhsa_ctx_mem_stats(ctx);
        T_CHECK(s2.in_use == s.in_use && s2.peak == s.peak && s2.n_allocs == s.n_allocs,
                "%s: a repeated call grew the ctx (in_use %zu -> %zu, n_allocs %llu -> %llu)", bn,
                s.in_use, s2.in_use, (unsigned long long)s.n_allocs,
                (unsigned long long)s2.n_allocs);
        dhsa_ctx_trim(ctx);
        T_CHECK(dhsa_ctx_mem_stats(ctx).in_use == base, "%s: in_use %zu after trim, want %zu", bn,
                dhsa_ctx_mem_stats(ctx).in_use, base);
        T_CHECK(dhsa_ctx_set_budget(ctx, 0) == DHSA_OK, "set_budget(0) failed");
    }
    dhsa_ctx_free(ctx);
    inst_free(&I);
}

/* check_finite: NaN/Inf in q, k or v fail with DHSA_ERR_NONFINITE, nothing
 * written; the NaN padding outside the views must not count. */
static void test_check_finite(void) {
    static const dhsa_type types[2] = {DHSA_F32, DHSA_F16};
    for (int t = 0; t < 2; t++) {
        spec sp = {.tag = "check-finite", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 40, .Lk = 50, .d = 64,
                   .tq = types[t], .tk = types[t], .tv = types[t], .lq = LAY_PAD, .lk = LAY_DIM2,
                   .lv = LAY_PAD, .causal = 1};
        inst I;
        inst_init(&I, &sp);
        oracle(&I, EXACT, I.ref_o, I.ref_lse);
        I.a.check_finite = 1;
        check_backend(&I, g_ctx, DHSA_BACKEND_TILED); /* padding is NaN: must pass */
        check_backend(&I, g_ctx, DHSA_BACKEND_REFERENCE);
        static const struct { int which; double bad; const char *what; } planted[] = {
            {0, NAN, "NaN in q"}, {1, INFINITY, "+inf in k"}, {2, -INFINITY, "-inf in v"}};
        for (int k = 0; k < 3; k++) {
            tbuf *tb = planted[k].which == 0 ? &I.q : planted[k].which == 1 ? &I.k : &I.v;
            int64_t off = tb_off(tb, 1, 1, 7, 3);
            unsigned char save[4];
            size_t es = elem_size(tb->t.type);
            memcpy(save, tb->buf + off * (int64_t)es, es);
            store_elem(tb->buf, tb->t.type, off, planted[k].bad);
            for (int e = 0; e < 2; e++) {
                dhsa_backend be = e ? DHSA_BACKEND_REFERENCE : DHSA_BACKEND_TILED;
                dhsa_status st = lib_run(&I, g_ctx, be);
                T_CHECK(st == DHSA_ERR_NONFINITE, "%s %s (%s) with check_finite: %s, want NONFINITE",
                        dhsa_backend_name(be), planted[k].what, tname(types[t]), dhsa_status_str(st));
                T_CHECK(dhsa_last_error()[0] != '\0', "NONFINITE without a sentence");
                T_CHECK(all_bytes(I.o.buf, I.o.nbytes, 0xA5) && all_bytes(I.lse.buf, I.lse.nbytes, 0xA5),
                        "%s: %s rejected but o or lse written", dhsa_backend_name(be), planted[k].what);
            }
            memcpy(tb->buf + off * (int64_t)es, save, es);
        }
        inst_free(&I);
    }
}

/* REFERENCE refuses above reference_max_bytes (DHSA_ERR_TOO_LARGE). */
static void test_reference_cap(void) {
    spec sp = {.tag = "ref-cap", .Hq = 2, .Lq = 64, .Lk = 64, .d = 8};
    inst I;
    inst_init(&I, &sp);
    oracle(&I, EXACT, I.ref_o, I.ref_lse);
    I.a.reference_max_bytes = 64;
    dhsa_status st = lib_run(&I, g_ctx, DHSA_BACKEND_REFERENCE);
    T_CHECK(st == DHSA_ERR_TOO_LARGE, "REFERENCE with reference_max_bytes=64 returned %s",
            dhsa_status_str(st));
    T_CHECK(dhsa_last_error()[0] != '\0', "TOO_LARGE without a sentence");
    T_CHECK(all_bytes(I.o.buf, I.o.nbytes, 0xA5) && all_bytes(I.lse.buf, I.lse.nbytes, 0xA5),
            "REFERENCE refused by its cap but wrote o or lse");
    check_backend(&I, g_ctx, DHSA_BACKEND_TILED); /* the cap is REFERENCE's only */
    I.a.reference_max_bytes = (size_t)1 << 30;
    check_backend(&I, g_ctx, DHSA_BACKEND_REFERENCE);
    I.a.reference_max_bytes = 0; /* default 1 GiB */
    check_backend(&I, g_ctx, DHSA_BACKEND_REFERENCE);
    inst_free(&I);
}

/* ------------------------------------------------------------------------ */
/* Descriptor defaults and backend selection */

static void test_desc_and_backends(void) {
    dhsa_attn_desc a = dhsa_attn_default_desc();
    T_CHECK(a.q.data == NULL && a.k.data == NULL && a.v.data == NULL && a.o.data == NULL &&
                a.lse.data == NULL && a.attn_mask.data == NULL && a.key_mask == NULL &&
                a.key_bias == NULL,
            "default descriptor has a tensor or mask set");
    T_CHECK(a.scale == 0 && a.softcap == 0 && a.causal == 0 && a.q_pos0 == 0 && a.window == 0 &&
                a.key_mask_polarity == DHSA_MASK_NO_POLARITY && a.reference_max_bytes == 0 &&
                a.key_mask_batch_stride == 0 && a.key_bias_batch_stride == 0 && a.check_finite == 0,
            "default descriptor sets a parameter");
    T_CHECK(a.backend == DHSA_BACKEND_AUTO, "default backend %d, want AUTO", (int)a.backend);

    const char *n0 = dhsa_backend_name(DHSA_BACKEND_AUTO), *n1 = dhsa_backend_name(DHSA_BACKEND_TILED),
               *n2 = dhsa_backend_name(DHSA_BACKEND_REFERENCE);
    T_CHECK(n0 && n1 && n2 && n0[0] && n1[0] && n2[0] && strcmp(n0, n1) && strcmp(n1, n2) &&
                strcmp(n0, n2),
            "backend names empty or not distinct");
    T_CHECK(dhsa_attn_resolve_backend(DHSA_BACKEND_TILED) == DHSA_BACKEND_TILED &&
                dhsa_attn_resolve_backend(DHSA_BACKEND_REFERENCE) == DHSA_BACKEND_REFERENCE,
            "explicit backends do not resolve to themselves");
    const char *env = getenv("DHSA_ATTN");
    if (env && env[0]) {
        T_SKIP(6, "DHSA_ATTN=%s set: AUTO resolution not checked", env);
        return;
    }
    T_CHECK(dhsa_attn_resolve_backend(DHSA_BACKEND_AUTO) == DHSA_BACKEND_TILED,
            "AUTO resolves to %s without DHSA_ATTN, want TILED",
            dhsa_backend_name(dhsa_attn_resolve_backend(DHSA_BACKEND_AUTO)));
    /* AUTO gives TILED's bytes */
    spec sp = {.tag = "auto", .B = 2, .Hq = 4, .Hkv = 2, .Lq = 100, .Lk = 100, .d = 64, .causal = 1};
    inst I;
    inst_init(&I, &sp);
    oracle(&I, EXACT, I.ref_o, I.ref_lse);
    if (check_backend(&I, g_ctx, DHSA_BACKEND_TILED)) {
        unsigned char *o1 = malloc(I.o.nbytes);
        memcpy(o1, I.o.buf, I.o.nbytes);
        dhsa_status st = lib_run(&I, g_ctx, DHSA_BACKEND_AUTO);
        T_CHECK(st == DHSA_OK && memcmp(o1, I.o.buf, I.o.nbytes) == 0,
                "AUTO output differs from TILED (status %s)", dhsa_status_str(st));
        free(o1);
    }
    inst_free(&I);
}

/* ------------------------------------------------------------------------ */
/* Split-K decode (attn_tiled.c): few query rows over long keys are cut into
 * pieces by key count and merged by LSE. Hkv = 1 (gemma-3-270m's one KV
 * head) and 2, Lq = 1..4, 4100 keys (pieces of 512 keys and a short last
 * one), F32 / F16 / Q8_0 K and V, dense and with a layout of random ranges;
 * against the double reference here (its inputs are the values the library
 * reads: F16 and Q8_0 decoded by their definitions), and bitwise the same
 * with 1, 2 and 3 threads. */

typedef struct {
    int64_t Hq, Hkv, Lq, Lk, d, dv, window;
    float softcap;
    dhsa_type tkv;
    int layout; /* random key ranges per (KV head) */
} split_case;

/* Q8_0 by its definition: F16 d, then 32 int8 codes per block */
static double q8_value(const unsigned char *row, int64_t c) {
    const unsigned char *blk = row + c / 32 * 34;
    uint16_t h = (uint16_t)(blk[0] | blk[1] << 8);
    return f16_decode(h) * (double)(int8_t)blk[2 + c % 32];
}

/* x [H][L][D] random normal -> the typed buffer and the values it holds */
static void *split_fill(dhsa_type t, int64_t H, int64_t L, int64_t D, rng_t *r, double *canon) {
    const int64_t n = H * L * D;
    float *f = xcalloc((size_t)n, sizeof(float));
    for (int64_t i = 0; i < n; i++) f[i] = (float)(1.2 * rng_normal(r));
    if (t == DHSA_F32) {
        for (int64_t i = 0; i < n; i++) canon[i] = f[i];
        return f;
    }
    if (t == DHSA_F16) {
        uint16_t *h = xcalloc((size_t)n, 2);
        for (int64_t i = 0; i < n; i++) h[i] = dhsa_f32_to_f16(f[i]), canon[i] = f16_decode(h[i]);
        free(f);
        return h;
    }
    const size_t rb = dhsa_type_row_bytes(DHSA_Q8_0, D);
    unsigned char *q = xcalloc((size_t)(H * L), rb);
    for (int64_t row = 0; row < H * L; row++) {
        dhsa_q8_0_quantize_row(f + row * D, q + (size_t)row * rb, D);
        for (int64_t c = 0; c < D; c++) canon[row * D + c] = q8_value(q + (size_t)row * rb, c);
    }
    free(f);
    return q;
}

/* o [Hq][Lq][dv], lse [Hq][Lq] in double; keys allowed by causality at
 * q_pos0 = Lk - Lq, the window and sel[g][key] (NULL: all). */
static void split_oracle(const split_case *c, const double *q, const double *k, const double *v,
                         const unsigned char *sel, double *o, double *lse) {
    const int64_t G = c->Hq / c->Hkv, pos0 = c->Lk - c->Lq;
    const double scale = (double)(float)(1.0 / sqrt((double)c->d));
    double *s = xcalloc((size_t)c->Lk, sizeof(double));
    for (int64_t h = 0; h < c->Hq; h++)
        for (int64_t r = 0; r < c->Lq; r++) {
            const int64_t g = h / G, pos = pos0 + r;
            const double *qr = q + (h * c->Lq + r) * c->d;
            double mx = -INFINITY;
            for (int64_t j = 0; j < c->Lk; j++) {
                int ok = j <= pos && (c->window == 0 || j > pos - c->window) && (!sel || sel[g * c->Lk + j]);
                s[j] = -INFINITY;
                if (!ok) continue;
                double x = 0;
                for (int64_t e = 0; e < c->d; e++) x += qr[e] * k[(g * c->Lk + j) * c->d + e];
                x *= scale;
                if (c->softcap > 0) x = c->softcap * tanh(x / c->softcap);
                s[j] = x;
                if (x > mx) mx = x;
            }
            double sum = 0;
            double *orow = o + (h * c->Lq + r) * c->dv;
            for (int64_t e = 0; e < c->dv; e++) orow[e] = 0;
            for (int64_t j = 0; j < c->Lk; j++) {
                if (s[j] == -INFINITY) continue;
                double p = exp(s[j] - mx);
                sum += p;
                for (int64_t e = 0; e < c->dv; e++) orow[e] += p * v[(g * c->Lk + j) * c->dv + e];
            }
            for (int64_t e = 0; e < c->dv; e++) orow[e] = sum > 0 ? orow[e] / sum : 0;
            lse[h * c->Lq + r] = sum > 0 ? mx + log(sum) : -INFINITY;
        }
    free(s);
}

/* got (float) vs ref (double), n values: |a - b| <= atol + rtol |ref| */
static int split_close(const float *got, const double *ref, int64_t n, double atol, double rtol, int64_t *worst) {
    double we = -1;
    int ok = 1;
    for (int64_t i = 0; i < n; i++) {
        double err = isinf(ref[i]) ? (got[i] == ref[i] ? 0 : INFINITY) : fabs(got[i] - ref[i]);
        double ex = err / (atol + rtol * fabs(ref[i]));
        if (!(ex <= 1)) ok = 0;
        if (!(ex <= we)) we = ex, *worst = i;
    }
    return ok;
}

/* One case on the active ISA: 3 checks (the reference with 1 thread;
 * 2 and 3 threads bitwise equal to 1). Returns whether all passed. */
static int split_run(const split_case *c, dhsa_ctx *const ctxs[3], int corrupt) {
    const int64_t Lq = c->Lq, Lk = c->Lk, d = c->d, dv = c->dv, Hq = c->Hq, Hkv = c->Hkv;
    rng_t r = {0x5417 + (uint64_t)(Lq * 131 + Hkv * 7 + c->tkv * 3 + c->layout)};
    double *cq = xcalloc((size_t)(Hq * Lq * d), sizeof(double)), *ck = xcalloc((size_t)(Hkv * Lk * d), sizeof(double)),
           *cv = xcalloc((size_t)(Hkv * Lk * dv), sizeof(double));
    float *q = split_fill(DHSA_F32, Hq, Lq, d, &r, cq);
    void *k = split_fill(c->tkv, Hkv, Lk, d, &r, ck), *v = split_fill(c->tkv, Hkv, Lk, dv, &r, cv);
    float *o[3], *lse[3];
    for (int t = 0; t < 3; t++) {
        o[t] = xcalloc((size_t)(Hq * Lq * dv), sizeof(float));
        lse[t] = xcalloc((size_t)(Hq * Lq), sizeof(float));
    }
    double *ro = xcalloc((size_t)(Hq * Lq * dv), sizeof(double)), *rl = xcalloc((size_t)(Hq * Lq), sizeof(double));
    /* a layout: a sink, random ranges of 1..300 keys, the last 200 keys */
    unsigned char *sel = NULL;
    dhsa_layout *lay = NULL;
    if (c->layout) {
        sel = xcalloc((size_t)(Hkv * Lk), 1);
        T_CHECK(dhsa_layout_create(ctxs[0], 1, Hkv, Lq, Lk, 64, 64, &lay) == DHSA_OK, "layout_create: %s",
                dhsa_last_error());
        for (int64_t g = 0; lay && g < Hkv; g++) {
            int64_t rg[2 * 24], n = 0;
            rg[n++] = 0, rg[n++] = 40;
            for (int i = 0; i < 21; i++) {
                int64_t s0 = 40 + (int64_t)(rng_unif(&r) * (double)(Lk - 600)), len = 1 + (int64_t)(rng_unif(&r) * 300);
                rg[n++] = s0, rg[n++] = s0 + len;
            }
            rg[n++] = Lk - 200, rg[n++] = Lk;
            T_CHECK(dhsa_layout_set(lay, 0, g, 0, rg, n / 2) == DHSA_OK, "layout_set: %s", dhsa_last_error());
            for (int64_t i = 0; i < n; i += 2)
                for (int64_t j = rg[i]; j < rg[i + 1]; j++) sel[g * Lk + j] = 1;
        }
    }
    if (corrupt == 1) cv[(Lk / 2) * dv + 3] += 0.5; /* one value in a middle piece */
    split_oracle(c, cq, ck, cv, corrupt == 2 ? NULL : sel, ro, rl);
    dhsa_attn_desc a = dhsa_attn_default_desc();
    a.q = dhsa_tensor_bhld(q, DHSA_F32, 1, Hq, Lq, d);
    a.k = dhsa_tensor_bhld(k, c->tkv, 1, Hkv, Lk, d);
    a.v = dhsa_tensor_bhld(v, c->tkv, 1, Hkv, Lk, dv);
    a.causal = 1;
    a.q_pos0 = Lk - Lq;
    a.window = c->window;
    a.softcap = c->softcap;
    a.layout = lay;
    char desc[200];
    snprintf(desc, sizeof desc, "split-K %s Hq %lld Hkv %lld Lq %lld Lk %lld d %lld window %lld softcap %g %s, %s",
             dhsa_type_name(c->tkv), (long long)Hq, (long long)Hkv, (long long)Lq, (long long)Lk, (long long)d,
             (long long)c->window, (double)c->softcap, c->layout ? "layout" : "dense", dhsa_isa_name(dhsa_active_isa()));
    int all = 1;
    for (int t = 0; t < 3; t++) {
        a.o = dhsa_tensor_bhld(o[t], DHSA_F32, 1, Hq, Lq, dv);
        a.lse = dhsa_tensor_bhld(lse[t], DHSA_F32, 1, Hq, Lq, 1);
        dhsa_status st = dhsa_attention(ctxs[t], &a);
        if (st != DHSA_OK) {
            if (!corrupt) T_CHECK(0, "%s, %d threads: %s %s", desc, t + 1, dhsa_status_str(st), dhsa_last_error());
            all = 0;
            continue;
        }
        if (t == 0) {
            int64_t wo = 0, wl = 0;
            int ok = split_close(o[0], ro, Hq * Lq * dv, 3e-5, 2e-5, &wo) &
                     split_close(lse[0], rl, Hq * Lq, 3e-5, 1e-5, &wl);
            if (!corrupt)
                T_CHECK(ok, "%s: against double, worst o[%lld] %.9g ref %.9g, lse[%lld] %.9g ref %.9g", desc,
                        (long long)wo, (double)o[0][wo], ro[wo], (long long)wl, (double)lse[0][wl], rl[wl]);
            all &= ok;
        } else {
            int same = memcmp(o[t], o[0], sizeof(float) * (size_t)(Hq * Lq * dv)) == 0 &&
                       memcmp(lse[t], lse[0], sizeof(float) * (size_t)(Hq * Lq)) == 0;
            if (!corrupt) T_CHECK(same, "%s: %d threads differ bitwise from 1 thread", desc, t + 1);
            all &= same;
        }
    }
    dhsa_layout_free(lay);
    free(sel), free(q), free(k), free(v), free(cq), free(ck), free(cv), free(ro), free(rl);
    for (int t = 0; t < 3; t++) free(o[t]), free(lse[t]);
    return all;
}

/* The partials are part of the workspace the query reports: a decode call
 * over 4100 keys needs more than one over 100 (no split), a budget one
 * byte below the reported size refuses the call, the size itself runs it. */
static void split_workspace(dhsa_ctx *ctx) {
    const int64_t Lk = 4100, d = 64;
    float *q = xcalloc(4 * (size_t)d, sizeof(float)), *o = xcalloc(4 * (size_t)d, sizeof(float));
    float *k = xcalloc((size_t)(Lk * d), sizeof(float)), *v = xcalloc((size_t)(Lk * d), sizeof(float));
    for (int64_t i = 0; i < Lk * d; i++) k[i] = (float)(i % 7) * 0.1f, v[i] = (float)(i % 5);
    dhsa_attn_desc a = dhsa_attn_default_desc();
    a.q = dhsa_tensor_bhld(q, DHSA_F32, 1, 4, 1, d);
    a.k = dhsa_tensor_bhld(k, DHSA_F32, 1, 1, 100, d);
    a.v = dhsa_tensor_bhld(v, DHSA_F32, 1, 1, 100, d);
    a.o = dhsa_tensor_bhld(o, DHSA_F32, 1, 4, 1, d);
    a.causal = 1;
    a.q_pos0 = 99;
    size_t w_short = 0, w_long = 0;
    dhsa_status s1 = dhsa_attn_workspace_size(ctx, &a, &w_short);
    a.k.shape[2] = a.v.shape[2] = Lk;
    a.q_pos0 = Lk - 1;
    dhsa_status s2 = dhsa_attn_workspace_size(ctx, &a, &w_long);
    T_CHECK(!s1 && !s2 && w_long > w_short, "split-K workspace: %zu bytes over 4100 keys, %zu over 100 (%s)", w_long,
            w_short, dhsa_last_error());
    dhsa_ctx_trim(ctx);
    size_t base = dhsa_ctx_mem_stats(ctx).in_use;
    dhsa_ctx_set_budget(ctx, base + w_long - 1);
    T_CHECK(dhsa_attention(ctx, &a) == DHSA_ERR_MEMORY_BUDGET, "split-K decode ran under a budget one byte short");
    dhsa_ctx_set_budget(ctx, base + w_long);
    T_CHECK(dhsa_attention(ctx, &a) == DHSA_OK && dhsa_ctx_mem_stats(ctx).peak <= base + w_long,
            "split-K decode within its reported workspace: %s", dhsa_last_error());
    dhsa_ctx_set_budget(ctx, 0);
    free(q), free(o), free(k), free(v);
}

static void test_split_k(void) {
    dhsa_ctx *ctxs[3] = {NULL, NULL, NULL};
    for (int t = 0; t < 3; t++) {
        dhsa_ctx_params p = dhsa_ctx_default_params();
        p.n_threads = t + 1;
        if (dhsa_ctx_create(&p, &ctxs[t]) != DHSA_OK) ctxs[t] = NULL;
    }
    T_CHECK(ctxs[0] && ctxs[1] && ctxs[2], "ctx_create (1, 2, 3 threads): %s", dhsa_last_error());
    if (!ctxs[0] || !ctxs[1] || !ctxs[2]) {
        for (int t = 0; t < 3; t++) dhsa_ctx_free(ctxs[t]);
        return;
    }
    split_workspace(ctxs[1]);
    static const dhsa_type types[3] = {DHSA_F32, DHSA_F16, DHSA_Q8_0};
    for (int ty = 0; ty < 3; ty++)
        for (int lay = 0; lay < 2; lay++)
            for (int64_t lq = 1; lq <= 4; lq++) {
                split_case c = {4, 1, lq, 4100, 64, 64, 0, 0.0f, types[ty], lay};
                if (lq == 2) c.softcap = 30.0f;
                if (lq == 3 && !lay) c.window = 2500;
                split_run(&c, ctxs, 0);
            }
    /* two KV heads, d 128, dv 96 */
    for (int ty = 0; ty < 3; ty++) {
        split_case c = {6, 2, 1, 3000, 128, 96, 0, 0.0f, types[ty], ty == 1};
        split_run(&c, ctxs, 0);
    }
    /* it can fail: a value changed in the middle of the keys, or the
     * reference ignoring the layout */
    split_case c = {4, 1, 1, 4100, 64, 64, 0, 0.0f, DHSA_F32, 1};
    T_CHECK(!split_run(&c, ctxs, 1), "split-K test passes with one value of V changed in the reference");
    T_CHECK(!split_run(&c, ctxs, 2), "split-K test passes with a reference that ignores the layout");
    for (int t = 0; t < 3; t++) dhsa_ctx_free(ctxs[t]);
}

/* ------------------------------------------------------------------------ */

/* The numeric cases (about 3 s per ISA at -O2 on 2 cores). */
static void numeric_suite(void) {
    test_grid();
    test_lq_ne_lk();
    test_masks();
    test_polarity();
    test_positions();
    test_all_masked();
    test_types_strides();
    test_long();
    test_split_k();
}

/* Decode over an F16 / BF16 cache reads its rows in place (kern.h,
 * qk_rows16): the output must be bitwise the output over an F32 cache
 * holding the same (exactly widened) values, on every ISA. */
static void cache16_bitwise(int64_t Hq, int64_t Hkv, int64_t d, int64_t dv) {
    const int64_t L = 300;
    float *q = malloc(sizeof(float) * (size_t)(Hq * d)), *k32 = malloc(sizeof(float) * (size_t)(Hkv * L * d)),
          *v32 = malloc(sizeof(float) * (size_t)(Hkv * L * dv)), *o1 = malloc(sizeof(float) * (size_t)(Hq * dv)),
          *o2 = malloc(sizeof(float) * (size_t)(Hq * dv));
    uint16_t *k16 = malloc(2 * (size_t)(Hkv * L * d)), *v16 = malloc(2 * (size_t)(Hkv * L * dv));
    rng_t seed = {99};
    for (int64_t i = 0; i < Hq * d; i++) q[i] = (float)rng_normal(&seed);
    for (int bf = 0; bf < 2; bf++) {
        for (int64_t i = 0; i < Hkv * L * d; i++) {
            float x = (float)rng_normal(&seed);
            k16[i] = bf ? dhsa_f32_to_bf16(x) : dhsa_f32_to_f16(x);
            k32[i] = bf ? dhsa_bf16_to_f32(k16[i]) : dhsa_f16_to_f32(k16[i]);
        }
        for (int64_t i = 0; i < Hkv * L * dv; i++) {
            float x = (float)rng_normal(&seed);
            v16[i] = bf ? dhsa_f32_to_bf16(x) : dhsa_f32_to_f16(x);
            v32[i] = bf ? dhsa_bf16_to_f32(v16[i]) : dhsa_f16_to_f32(v16[i]);
        }
        const dhsa_type t16 = bf ? DHSA_BF16 : DHSA_F16;
        const dhsa_isa best = dhsa_active_isa();
        for (int isa = DHSA_ISA_SCALAR; isa <= (int)best; isa++) {
            if (dhsa_set_isa((dhsa_isa)isa) != DHSA_OK) continue;
            int same = 1;
            for (int wide = 0; wide < 2; wide++) {
                dhsa_attn_desc a = dhsa_attn_default_desc();
                a.q = dhsa_tensor_bhld(q, DHSA_F32, 1, Hq, 1, d);
                a.k = wide ? dhsa_tensor_bhld(k32, DHSA_F32, 1, Hkv, L, d) : dhsa_tensor_bhld(k16, t16, 1, Hkv, L, d);
                a.v = wide ? dhsa_tensor_bhld(v32, DHSA_F32, 1, Hkv, L, dv) : dhsa_tensor_bhld(v16, t16, 1, Hkv, L, dv);
                a.o = dhsa_tensor_bhld(wide ? o2 : o1, DHSA_F32, 1, Hq, 1, dv);
                a.causal = 1;
                a.q_pos0 = L - 1;
                same &= dhsa_attention(g_ctx, &a) == DHSA_OK;
            }
            same &= memcmp(o1, o2, sizeof(float) * (size_t)(Hq * dv)) == 0;
            T_CHECK(same, "decode over a %s cache = over the F32 cache of its values, bitwise (%s)", bf ? "BF16" : "F16",
                    dhsa_isa_name((dhsa_isa)isa));
        }
        dhsa_set_isa(best);
    }
    free(q); free(k32); free(v32); free(o1); free(o2); free(k16); free(v16);
}

/* Shapes: a d the kernels handle in general, and d = 64 with 4, 2 and 1
 * queries per KV head (kern_avx512.c keeps those queries in registers). */
static void test_cache16_bitwise(void) {
    cache16_bitwise(8, 2, 72, 40);
    cache16_bitwise(8, 2, 64, 64);
    cache16_bitwise(4, 2, 64, 64);
    cache16_bitwise(2, 2, 64, 48);
}

/* ------------------------------------------------------------------------ */
/* The FFN activation kernel (kern.h, glu): act(g) * u against double,
 * on every ISA. SiLU z / (1 + e^-z); GELU in its tanh form as written in
 * the papers, 0.5 z (1 + tanh(sqrt(2/pi) (z + 0.044715 z^3))). Bounds:
 * relative GLU_RTOL (SiLU) and GELU_RTOL (GELU, whose exp argument a
 * carries the rounding of z^3, a relative error of about |a| u for
 * |a| <= 88: largest near z = -9, where the value is ~1e-27) past an
 * absolute 1e-30 (where the true value underflows, the kernels give about
 * z / e^88). Measured here (test output): SiLU 1.9e-7; GELU 9.8e-6, and
 * 1.3e-6 over |z| <= 4. */
#define GLU_RTOL 4e-7
#define GELU_RTOL 1.6e-5
#define GLU_ATOL 1e-30

static double glu_ref(double z, double u, int gelu) {
    if (!gelu) return z / (1.0 + exp(-z)) * u;
    /* 0.5 (1 + tanh y) = 1 / (1 + e^-2y); in double the tanh form loses
     * every digit for y < -19 (1 + tanh y cancels), this one none */
    double y = 0.79788456080286535588 * (z + 0.044715 * z * z * z);
    return z / (1.0 + exp(-2.0 * y)) * u;
}

/* Largest |got - ref| / |ref| where |ref| > atol; *bad counts elements past
 * atol + rtol |ref|, *worst is the index of the largest excess. */
static double glu_compare(const float *g, const float *u, const float *got, int64_t n, int gelu, double rtol,
                          double zmax, int64_t *bad, int64_t *worst) {
    double max_rel = 0, max_ex = -1;
    *bad = 0;
    *worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double ref = glu_ref(g[i], u[i], gelu), e = fabs((double)got[i] - ref);
        if (!(e <= GLU_ATOL + rtol * fabs(ref))) (*bad)++;
        double ex = e - (GLU_ATOL + rtol * fabs(ref));
        if (!(ex <= max_ex)) max_ex = ex, *worst = i;
        if (fabs(ref) > GLU_ATOL && fabs(g[i]) <= zmax && e / fabs(ref) > max_rel) max_rel = e / fabs(ref);
    }
    return max_rel;
}

static int test_glu_isa(const dhsa_attn_kernels *k, const char *isa) {
    const int before = t_checks();
    enum { N = 20000 };
    float *g = malloc(N * sizeof(float)), *u = malloc(N * sizeof(float)), *o = malloc(N * sizeof(float)),
          *o2 = malloc(N * sizeof(float));
    rng_t r = {7};
    for (int gelu = 0; gelu < 2; gelu++) {
        /* a dense grid over where the activation bends, then normals of
         * several scales; up values normal */
        const double lo = gelu ? -12 : -100, hi = gelu ? 12 : 40;
        for (int64_t i = 0; i < N; i++) {
            g[i] = i < N / 2 ? (float)(lo + (hi - lo) * (double)i / (N / 2 - 1))
                             : (float)(rng_normal(&r) * (i % 3 == 0 ? 0.1 : i % 3 == 1 ? 2.0 : 8.0));
            u[i] = (float)rng_normal(&r);
        }
        double rtol = gelu ? GELU_RTOL : GLU_RTOL;
        int ok = 1;
        /* every length 1..40 (vector tails), then the whole array */
        for (int64_t n = 1; n <= 40; n++) {
            k->glu(g + 3 * n, u + 3 * n, n, gelu, o);
            int64_t bad, w;
            glu_compare(g + 3 * n, u + 3 * n, o, n, gelu, rtol, INFINITY, &bad, &w);
            ok &= bad == 0;
        }
        k->glu(g, u, N, gelu, o);
        int64_t bad, w;
        double rel4 = glu_compare(g, u, o, N, gelu, rtol, 4.0, &bad, &w);
        double rel = glu_compare(g, u, o, N, gelu, rtol, INFINITY, &bad, &w);
        printf("test_attn: glu %s %s: max relative error %.2e against double (bound %.1e), %.2e over |z| <= 4\n",
               gelu ? "gelu" : "silu", isa, rel, rtol, rel4);
        T_CHECK(ok && bad == 0, "glu %s (%s): %lld elements past %g + %g |ref|; worst at %lld: z = %.9g u = %.9g got %.9g, "
                "want %.9g", gelu ? "gelu" : "silu", isa, (long long)bad, GLU_ATOL, rtol, (long long)w, (double)g[w],
                (double)u[w], (double)o[w], glu_ref(g[w], u[w], gelu));
        /* in place (out = g, as the session calls it) gives the same bits */
        memcpy(o2, g, N * sizeof(float));
        k->glu(o2, u, N, gelu, o2);
        T_CHECK(memcmp(o, o2, N * sizeof(float)) == 0, "glu %s (%s) in place differs", gelu ? "gelu" : "silu", isa);
        /* NaN in, NaN out; huge |z| (z^3 overflows) gives the limits z and 0 */
        float gz[4] = {NAN, 1e30f, -1e30f, 0.0f}, uz[4] = {1, 1, 1, 1}, oz[4];
        k->glu(gz, uz, 4, gelu, oz);
        T_CHECK(isnan(oz[0]) && oz[1] == 1e30f && fabsf(oz[2]) < 1e-7f && oz[3] == 0.0f,
                "glu %s (%s) edges: NaN -> %g, 1e30 -> %g, -1e30 -> %g, 0 -> %g", gelu ? "gelu" : "silu", isa,
                (double)oz[0], (double)oz[1], (double)oz[2], (double)oz[3]);
        /* the comparator catches the other activation (a test that can fail) */
        glu_compare(g, u, o, N, !gelu, rtol, INFINITY, &bad, &w);
        T_CHECK(bad > 0, "glu comparator accepts %s as %s", gelu ? "gelu" : "silu", gelu ? "silu" : "gelu");
    }
    free(g); free(u); free(o); free(o2);
    return t_checks() - before;
}

/* The sampler's weights (kern.h, expw): exp((x - sub) * mul) against
 * double exp of the same float argument, on every ISA: relative
 * EXPW_RTOL past an absolute 1e-37 (AVX2 flushes below e^-87.3, the
 * others below e^-104); -inf gives 0 and x = sub gives 1 exactly. */
#define EXPW_RTOL 4e-7

static int test_expw_isa(const dhsa_attn_kernels *k, const char *isa) {
    const int before = t_checks();
    enum { N = 20000 };
    float *x = malloc(N * sizeof(float)), *o = malloc(N * sizeof(float));
    rng_t r = {11};
    const float subs[3] = {0.0f, 3.5f, -20.0f}, muls[3] = {1.0f, 1.0f / 0.7f, 0.25f};
    double worst = 0;
    int64_t bad = 0;
    for (int c = 0; c < 3; c++) {
        for (int64_t i = 0; i < N; i++)
            x[i] = i < N / 2 ? (float)(subs[c] - 130.0 / muls[c] + (140.0 / muls[c]) * (double)i / (N / 2 - 1))
                             : (float)(subs[c] + rng_normal(&r) * 8.0);
        x[5] = -INFINITY;
        x[6] = subs[c];
        /* every length 1..40 (vector tails), then the whole array */
        for (int64_t n = 1; n <= 41; n++) {
            const int64_t off = n <= 40 ? 3 * n : 0, len = n <= 40 ? n : N;
            k->expw(x + off, len, subs[c], muls[c], o);
            for (int64_t i = 0; i < len; i++) {
                float a = (x[off + i] - subs[c]) * muls[c];
                double ref = exp((double)a), e = fabs((double)o[i] - ref);
                if (!(e <= 1e-37 + EXPW_RTOL * ref)) bad++;
                if (ref > 1e-37 && e / ref > worst) worst = e / ref;
            }
        }
        k->expw(x, N, subs[c], muls[c], o);
        T_CHECK(o[5] == 0.0f && o[6] == 1.0f, "expw (%s): exp(-inf) = %g, exp(0) = %.9g", isa, (double)o[5],
                (double)o[6]);
    }
    printf("test_attn: expw %s: max relative error %.2e against double (bound %.1e)\n", isa, worst, EXPW_RTOL);
    T_CHECK(bad == 0, "expw (%s): %lld values past 1e-37 + %g exp", isa, (long long)bad, EXPW_RTOL);
    /* the comparison can fail: a weight off by 1e-6 relative is caught */
    x[0] = 1.0f;
    k->expw(x, 1, 0.0f, 1.0f, o);
    T_CHECK(fabs((double)o[0] * (1 + 1e-6) - exp(1.0)) > EXPW_RTOL * exp(1.0), "expw comparator too loose");
    free(x);
    free(o);
    return t_checks() - before;
}

/* f on the scalar kernels, then on every ISA's the CPU has (skipped,
 * said, where it has not); the active ISA restored. */
static void each_isa(int (*f)(const dhsa_attn_kernels *, const char *), const char *what) {
    const dhsa_isa best = dhsa_active_isa();
    int n_checks = f(&dhsa__kern_scalar, "scalar");
    for (int isa = DHSA_ISA_AVX2; isa <= DHSA_ISA_AVX512; isa++) {
        if (dhsa_set_isa((dhsa_isa)isa) != DHSA_OK) {
            T_SKIP(n_checks, "%s: ISA %s unsupported here", what, dhsa_isa_name((dhsa_isa)isa));
            continue;
        }
        f(dhsa__attn_kernels(), dhsa_isa_name((dhsa_isa)isa));
    }
    T_CHECK(dhsa_set_isa(best) == DHSA_OK, "could not restore ISA %s", dhsa_isa_name(best));
}

static void test_expw(void) { each_isa(test_expw_isa, "expw"); }

static void test_glu(void) {
    /* the reference's GELU against the tanh form where that is exact enough */
    double dmax = 0;
    for (double z = -4; z <= 8; z += 1.0 / 64) {
        double t = 0.5 * z * (1.0 + tanh(0.79788456080286535588 * (z + 0.044715 * z * z * z)));
        if (fabs(glu_ref(z, 1, 1) - t) > dmax) dmax = fabs(glu_ref(z, 1, 1) - t);
    }
    T_CHECK(dmax < 1e-14, "glu reference: GELU's sigmoid form differs from the tanh form by %g", dmax);
    each_isa(test_glu_isa, "glu");
}

int main(void) {
    dhsa_ctx_params p = dhsa_ctx_default_params();
    if (dhsa_ctx_create(&p, &g_ctx) != DHSA_OK || !g_ctx) {
        T_CHECK(0, "ctx_create(defaults): %s", dhsa_last_error());
        return t_report("test_attn");
    }
    dhsa_isa best = dhsa_active_isa();
    printf("test_attn: %d threads, active ISA %s\n", dhsa_ctx_n_threads(g_ctx), dhsa_isa_name(best));

    test_comparator_fails();
    test_desc_and_backends();
    test_cache16_bitwise();
    test_glu();
    test_expw();
    int before = t_checks();
    test_wrong_oracles();
    const int n_oracles = t_checks() - before; /* the checks of an ISA that is skipped, below */
    test_errors();
    test_reference_cap();
    test_memory();
    test_check_finite();
    test_thread_invariance();

    /* The numeric cases under every ISA this machine and build offer. */
    before = t_checks();
    numeric_suite();
    const int n_suite = t_checks() - before;
    for (int isa = DHSA_ISA_SCALAR; isa <= DHSA_ISA_AVX512; isa++) {
        if ((dhsa_isa)isa == best) continue; /* done above */
        dhsa_status st = dhsa_set_isa((dhsa_isa)isa);
        if (st == DHSA_ERR_UNSUPPORTED) {
            T_SKIP(1 + n_suite + n_oracles, "ISA %s unsupported here", dhsa_isa_name((dhsa_isa)isa));
            continue;
        }
        T_CHECK(st == DHSA_OK && dhsa_active_isa() == (dhsa_isa)isa, "dhsa_set_isa(%s): %s",
                dhsa_isa_name((dhsa_isa)isa), dhsa_status_str(st));
        if (st != DHSA_OK) continue;
        numeric_suite();
        test_wrong_oracles();
    }
    T_CHECK(dhsa_set_isa(best) == DHSA_OK && dhsa_active_isa() == best, "could not restore ISA %s",
            dhsa_isa_name(best));

    dhsa_ctx_free(g_ctx);
    return t_report("test_attn");
}
