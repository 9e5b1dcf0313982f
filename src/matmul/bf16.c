/* bf16.c: the BF16 path of the weight products (contract in bf16.h,
 * numbers in docs/quant.md): the rounding of activations, the scalar
 * kernels that write the contract's order out in C (the reference of
 * bf16_avx512bf16.c), the choice of kernels (DHSA_BF16, the probe of
 * whether they pay here), and the driver: activations
 * rounded to BF16 once per call into the ctx's scratch (in parallel over
 * tokens when there are many), then either
 *   fused  n_tok <= max_tok_fused: each task streams a chunk of rows once,
 *          F16 weights converted in registers, every token per load
 *          (decode);
 *   panel  otherwise: a task converts a panel of DHSA_BF_PANEL rows, one K
 *          block at a time, into an L2 buffer of BF16 (a copy for BF16
 *          weights) and runs the mr x nr tile over every token (prefill).
 * Both sum in the contract's order, so they agree bitwise.
 *
 * Run: make build/tests/test_bf16 && build/tests/test_bf16.
 */
#include "matmul/bf16.h"
#include "matmul/path.h"

#include "core/internal.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

int dhsa__bf16_type(uint32_t type) { return type == DHSA_GGML_F16 || type == DHSA_GGML_BF16; }

uint16_t dhsa__bf16_round(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN, quieted */
    if ((u & 0x7f800000u) == 0) return (uint16_t)((u >> 16) & 0x8000u);      /* zero or denormal: signed zero */
    u += 0x7fffu + ((u >> 16) & 1u); /* to nearest, ties to even (Inf stays Inf) */
    return (uint16_t)(u >> 16);
}

static inline float bf16_value(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ------------------------------------------------------ scalar kernels --- */

#define S_MR 1
#define S_NR 4

static void round_act_scalar(const float *x, int64_t n, int64_t npad, uint16_t *xb) {
    for (int64_t i = 0; i < n; i++) xb[i] = dhsa__bf16_round(x[i]);
    for (int64_t i = n; i < npad; i++) xb[i] = 0;
}

static void to_bf16_scalar(uint32_t type, const uint8_t *row, int64_t k0, int64_t kn, uint16_t *dst) {
    const int64_t kp = (kn + 31) / 32 * 32;
    for (int64_t i = 0; i < kn; i++) {
        uint16_t h;
        memcpy(&h, row + 2 * (k0 + i), 2);
        dst[i] = type == DHSA_GGML_F16 ? dhsa__bf16_round(dhsa_f16_to_f32(h)) : h;
    }
    for (int64_t i = kn; i < kp; i++) dst[i] = 0;
}

/* f32.h's lane tree on 16 lanes */
static float tree16(const float *s) {
    float a[8], b[4];
    for (int j = 0; j < 8; j++) a[j] = s[j] + s[j + 8];
    for (int j = 0; j < 4; j++) b[j] = a[j] + a[j + 4];
    return (b[0] + b[2]) + (b[1] + b[3]);
}

/* The contract's sum over kp columns (a multiple of 32) of two BF16 rows. */
static float dot_scalar(const uint16_t *w, const uint16_t *x, int64_t kp) {
    float lane[16] = {0};
    for (int64_t k = 0; k < kp; k += 32)
        for (int j = 0; j < 16; j++) {
            const int64_t c = k + 2 * j;
            lane[j] += bf16_value(w[c + 1]) * bf16_value(x[c + 1]);
            lane[j] += bf16_value(w[c]) * bf16_value(x[c]);
        }
    return tree16(lane);
}

static void tile_scalar(const uint16_t *W, int64_t ldw, const uint16_t *const *X, int64_t kp, float *out) {
    for (int t = 0; t < S_MR; t++)
        for (int r = 0; r < S_NR; r++) out[t * S_NR + r] = dot_scalar(W + r * ldw, X[t], kp);
}

static void gemv_scalar(uint32_t type, const uint8_t *w, int64_t row_bytes, int64_t nrows, int64_t n_in,
                        const uint16_t *xb, int64_t ldxb, int64_t n_tok, float *y, int64_t ldy) {
    uint16_t wb[DHSA_QK_KC];
    for (int64_t r = 0; r < nrows; r++)
        for (int64_t k0 = 0; k0 < n_in; k0 += DHSA_QK_KC) {
            const int64_t kn = n_in - k0 < DHSA_QK_KC ? n_in - k0 : DHSA_QK_KC, kp = (kn + 31) / 32 * 32;
            to_bf16_scalar(type, w + r * row_bytes, k0, kn, wb);
            for (int64_t t = 0; t < n_tok; t++) {
                float s = dot_scalar(wb, xb + t * ldxb + k0, kp);
                y[t * ldy + r] = k0 == 0 ? s : y[t * ldy + r] + s;
            }
        }
}

const dhsa__bf16_kernels dhsa__bf16_scalar = {"scalar", 4, S_MR, S_NR, round_act_scalar, gemv_scalar, to_bf16_scalar,
                                              tile_scalar, NULL};

/* ------------------------------------------------------------- choice --- */

/* A vdpbf16ps (32 multiply-adds) must cost at most this many FMA (16 each)
 * for the path to pay. */
#define BF16_PAYS_RATIO 2.0

static atomic_int mode = -1; /* -1: DHSA_BF16 not read yet */
static _Atomic double probed = -1.0;

static dhsa__bf16_mode mode_now(void) {
    int m = atomic_load(&mode);
    if (m >= 0) return (dhsa__bf16_mode)m;
    const char *e = getenv("DHSA_BF16");
    m = DHSA__BF16_AUTO;
    if (e && strcmp(e, "on") == 0) m = DHSA__BF16_ON;
    else if (e && strcmp(e, "off") == 0) m = DHSA__BF16_OFF;
    else if (e && e[0] && strcmp(e, "auto") != 0)
        dhsa__warn_once("DHSA_BF16", "DHSA_BF16=%s is not one of on, off, auto: auto", dhsa__esc(e));
    int expected = -1;
    if (!atomic_compare_exchange_strong(&mode, &expected, m)) m = expected;
    return (dhsa__bf16_mode)m;
}

dhsa__bf16_mode dhsa__set_bf16_mode(dhsa__bf16_mode m) {
    const dhsa__bf16_mode before = mode_now();
    atomic_store(&mode, (int)m);
    return before;
}

/* The kernels this CPU and ISA can run, whatever the mode. */
static const dhsa__bf16_kernels *runnable(void) {
#if defined(__x86_64__)
    if (dhsa__bf16_isa_ok() && dhsa__bf16_avx512bf16.name) return &dhsa__bf16_avx512bf16;
#endif
    return NULL;
}

double dhsa__bf16_probe(void) {
    double r = atomic_load(&probed);
    if (r >= 0.0) return r;
    const dhsa__bf16_kernels *k = runnable();
    r = k && k->probe ? k->probe() : 0.0;
    double expected = -1.0;
    if (!atomic_compare_exchange_strong(&probed, &expected, r)) r = expected; /* the first measurement stays */
    return r;
}

const dhsa__bf16_kernels *dhsa__bf16_kernels_active(void) {
    const dhsa__bf16_kernels *k = runnable();
    if (!k) return NULL;
    switch (mode_now()) {
    case DHSA__BF16_ON: return k;
    case DHSA__BF16_OFF: return NULL;
    default: {
        const double r = dhsa__bf16_probe();
        return r > 0.0 && r <= BF16_PAYS_RATIO ? k : NULL;
    }
    }
}

const char *dhsa__bf16_off_reason(void) {
    if (!runnable() || dhsa__bf16_kernels_active()) return NULL;
    return mode_now() == DHSA__BF16_OFF ? "DHSA_BF16=off" : "avx512-bf16 slower here";
}

const char *dhsa__bf16_path_name(const dhsa__bf16_kernels *k) {
#if defined(__x86_64__)
    if (k == &dhsa__bf16_avx512bf16) return "bf16 avx512-bf16";
#endif
    return k == &dhsa__bf16_scalar ? "bf16 scalar" : "bf16";
}

/* --------------------------------------------------------- the path --- */

/* Rows per panel, and task sizes as the exact path's (f32.c). */
#define DHSA_BF_PANEL 64
#define BF_FUSED_CHUNK_BYTES (64 * 1024)
#define BF_FUSED_TASK_BYTES (128 * 1024)
#define BF_PANEL_TASK_FLOPS (4.0e6)

/* A row stride of n values (a multiple of 32) that is not a multiple of
 * 4 KiB: rows read together then do not fight over the same L1 sets. */
static int64_t stride_of(int64_t n) {
    const int64_t s = round_up(n, 32);
    return (s * 2) % 4096 == 0 ? s + 32 : s;
}

/* Scratch: every token's activations as BF16 ([n_tok][lda]), then (panel
 * form) each thread's panel of BF16 rows ([unit_rows][ldb]). */
static void bf_plan(dhsa__mm_plan *pp, uint32_t type, int64_t n_in, int64_t n_out, int64_t n_tok, int n_threads) {
    (void)type;
    const dhsa__bf16_kernels *k = pp->k;
    dhsa__mm_plan p = *pp;
    p.fused = n_tok <= k->max_tok_fused;
    p.lda = stride_of(n_in);
    p.act_bytes = (size_t)round_up(n_tok * p.lda * 2, 64);
    p.prep_tok = n_tok;
    p.prep_inline = n_tok <= 8;
    p.n_prep = n_tok <= 8 ? n_tok : n_tok < 64 ? n_tok : 64;
    const int64_t row_bytes = 2 * n_in;
    if (p.fused) {
        p.span = 1;
        p.unit_rows = round_up(ceil_div(BF_FUSED_CHUNK_BYTES, row_bytes), 4);
        p.n_units = ceil_div(n_out, p.unit_rows);
        double t = (double)row_bytes * (double)n_out / BF_FUSED_TASK_BYTES;
        p.n_tasks = t < 1.0 ? 1 : t > (double)p.n_units ? p.n_units : (int64_t)t;
        p.ws = p.act_bytes;
        *pp = p;
        return;
    }
    int64_t rows = n_out < DHSA_BF_PANEL ? n_out : DHSA_BF_PANEL;
    p.unit_rows = round_up(rows, k->nr);
    p.n_units = ceil_div(n_out, p.unit_rows);
    double t = 2.0 * (double)n_in * (double)n_out * (double)n_tok / BF_PANEL_TASK_FLOPS;
    p.n_tasks = t < 1.0 ? 1 : t > (double)p.n_units ? p.n_units : (int64_t)t;
    p.ldb = stride_of(n_in < DHSA_QK_KC ? n_in : DHSA_QK_KC);
    p.per_thread = (size_t)round_up(p.unit_rows * p.ldb * 2, 64);
    int users = p.n_tasks == 1 || n_threads <= 1 ? 1 : n_threads;
    p.ws = p.act_bytes + (size_t)users * p.per_thread;
    *pp = p;
}

static void bf_prepare(const dhsa__mm_job *j, int64_t t0, int64_t t1) {
    const dhsa__bf16_kernels *k = j->p->k;
    for (int64_t t = t0; t < t1; t++)
        k->round_act(j->x + t * j->ldx, j->W->n_in, j->p->lda, (uint16_t *)j->act + t * j->p->lda);
}

/* One panel: rows [o0, o0 + np), every K block, every token. */
static void panel(const dhsa__mm_job *j, int64_t o0, int64_t np, uint16_t *buf) {
    const dhsa__bf16_kernels *k = j->p->k;
    const dhsa_wmat *W = j->W;
    const int mr = k->mr, nr = k->nr;
    const int64_t ldb = j->p->ldb, n_in = W->n_in, n_tok = j->n_tok, np_pad = round_up(np, nr);
    float out[64]; /* mr * nr */
    const uint16_t *X[16]; /* mr token rows */
    for (int64_t k0 = 0; k0 < n_in; k0 += DHSA_QK_KC) {
        const int64_t kn = n_in - k0 < DHSA_QK_KC ? n_in - k0 : DHSA_QK_KC, kp = round_up(kn, 32);
        /* buf [np_pad][ldb]: rows o0.., columns k0..k0+kn as BF16, zero padded */
        for (int64_t r = 0; r < np; r++)
            k->to_bf16(W->type, (const uint8_t *)W->data + (o0 + r) * W->row_bytes, k0, kn, buf + r * ldb);
        for (int64_t r = np; r < np_pad; r++) memset(buf + r * ldb, 0, (size_t)kp * 2);
        for (int64_t t0 = 0; t0 < n_tok; t0 += mr) {
            const int nt = n_tok - t0 < mr ? (int)(n_tok - t0) : mr;
            /* tokens past the last repeat it, their results dropped */
            for (int t = 0; t < mr; t++) X[t] = (const uint16_t *)j->act + (t0 + (t < nt ? t : nt - 1)) * j->p->lda + k0;
            for (int64_t r0 = 0; r0 < np; r0 += nr) {
                k->tile(buf + r0 * ldb, ldb, X, kp, out);
                const int vr = np - r0 < nr ? (int)(np - r0) : nr;
                for (int t = 0; t < nt; t++) {
                    float *yr = j->y + (t0 + t) * j->ldy + o0 + r0;
                    for (int r = 0; r < vr; r++) yr[r] = k0 == 0 ? out[t * nr + r] : yr[r] + out[t * nr + r];
                }
            }
        }
    }
}

static void bf_rows(dhsa__mm_job *j, int64_t o0, int64_t o1, char *buf) {
    const dhsa__bf16_kernels *k = j->p->k;
    const dhsa_wmat *W = j->W;
    if (j->p->fused) {
        k->gemv(W->type, (const uint8_t *)W->data + o0 * W->row_bytes, W->row_bytes, o1 - o0, W->n_in,
                (const uint16_t *)j->act, j->p->lda, j->n_tok, j->y + o0, j->ldy);
        return;
    }
    panel(j, o0, o1 - o0, (uint16_t *)buf);
}

/* F16 and BF16; x rounded to BF16 first. */
const dhsa__path_impl dhsa__path_bf16 = {"dhsa__bf16_matmul", {0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, bf_plan,
                                         bf_prepare, bf_rows, 0};

int dhsa__bf16_fused(const dhsa__bf16_kernels *k, int64_t n_tok) { return k && n_tok <= k->max_tok_fused; }

static dhsa__mm_plan plan_of(const dhsa__bf16_kernels *k, uint32_t type, int64_t n_in, int64_t n_out, int64_t n_tok,
                             int n_threads) {
    return dhsa__mm_plan_with(&dhsa__path_bf16, k, k ? dhsa__bf16_path_name(k) : NULL, type, n_in, n_out, n_tok,
                              n_threads);
}

size_t dhsa__bf16_workspace(const dhsa__bf16_kernels *k, uint32_t type, int64_t n_in, int64_t n_out, int64_t n_tok,
                            int n_threads) {
    return plan_of(k, type, n_in, n_out, n_tok, n_threads).ws;
}

dhsa_status dhsa__bf16_matmul(dhsa_ctx *ctx, const dhsa__bf16_kernels *k, const dhsa_wmat *W, const float *x,
                              int64_t ldx, int64_t n_tok, float *y, int64_t ldy) {
    if (!ctx || !k || !W || !x || !y || !W->data)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa__bf16_matmul: ctx, k, W, W->data, x and y must not be NULL");
    if (!dhsa__bf16_type(W->type))
        return dhsa__fail(DHSA_ERR_UNSUPPORTED, "dhsa__bf16_matmul: weight type %u has no BF16 path", W->type);
    if (n_tok <= 0) return DHSA_OK;
    const dhsa__mm_plan p = plan_of(k, W->type, W->n_in, W->n_out, n_tok, dhsa_ctx_n_threads(ctx));
    return dhsa__mm_run(ctx, &p, W, x, ldx, n_tok, y, ldy);
}
