/* f32.c: the exact path of the weight products (contract in f32.h,
 * numbers in docs/quant.md): the scalar kernels (the formats' dequantizer,
 * a plain-C micro-tile), the choice of kernels by ISA, the row API, and
 * the path's table for the driver (path.h):
 *   fused  n_tok <= kernels->max_tok_fused: each task streams a chunk of
 *          rows once, dequantizing in registers (decode);
 *   panel  otherwise: a task dequantizes a panel of up to DHSA_QK_PANEL rows,
 *          one K block at a time, into an L2-sized F32 buffer and runs the
 *          mr x nr micro-tile against every token (prefill).
 * The SIMD kernels live in f32_avx2.c / f32_avx512.c and are compared with
 * this file's by tests/test_quant.c.
 *
 * Run: make build/tests/test_quant && build/tests/test_quant;
 *      build/dhsa bench matmul --help.
 */
#include "matmul/f32.h"
#include "matmul/path.h"

#include "core/internal.h"

#include <string.h>

/* Rows per panel of the panel form (a multiple of every ISA's nr). */
#define DHSA_QK_PANEL 64
/* Task sizes: fewer tasks than this much work each are not worth a thread
 * wake-up (a 64 x 64 matrix runs inline on the caller). */
#define FUSED_CHUNK_BYTES (64 * 1024)
#define FUSED_TASK_BYTES (128 * 1024)
#define PANEL_TASK_FLOPS (4.0e6)

/* ---------------------------------------------------- scalar micro-tile --- */

/* 8 lanes summed by the tree (l0 + l4, l1 + l5, ...), then (a0 + a2) + (a1 + a3):
 * the AVX2 order, with multiply and add instead of FMA. */
static float tree8(const float *s) {
    float a0 = s[0] + s[4], a1 = s[1] + s[5], a2 = s[2] + s[6], a3 = s[3] + s[7];
    return (a0 + a2) + (a1 + a3);
}

/* mr = 1 token x nr = 4 rows */
static void tile_scalar(const float *W, int64_t ldw, const float *X, int64_t ldxp, int64_t kp, float *out) {
    (void)ldxp;
    float s[4][8] = {{0}};
    for (int64_t k = 0; k < kp; k += 8)
        for (int r = 0; r < 4; r++)
            for (int j = 0; j < 8; j++) s[r][j] += W[r * ldw + k + j] * X[k + j];
    for (int r = 0; r < 4; r++) out[r] = tree8(s[r]);
}

const dhsa__f32_kernels dhsa__f32_scalar = {"scalar", 1, 4, {0}, dhsa__wt_dequant_scalar, NULL, tile_scalar};

const dhsa__f32_kernels *dhsa__f32_kernels_active(void) {
    switch (dhsa_active_isa()) {
#if defined(__x86_64__)
    case DHSA_ISA_AVX512: return &dhsa__f32_avx512;
    case DHSA_ISA_AVX2: return &dhsa__f32_avx2;
#endif
    default: return &dhsa__f32_scalar;
    }
}

const char *dhsa__f32_path_name(void) {
    switch (dhsa_active_isa()) {
    case DHSA_ISA_AVX512: return "f32 avx512";
    case DHSA_ISA_AVX2: return "f32 avx2";
    default: return "f32 scalar";
    }
}

/* ------------------------------------------------------------ row API --- */

dhsa_status dhsa__dequantize_row(uint32_t type, const void *src, float *dst, int64_t n) {
    dhsa_status st = dhsa__wt_check_n("dhsa__dequantize_row", type, n);
    if (st != DHSA_OK) return st;
    if (n && (!src || !dst)) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa__dequantize_row: src or dst is NULL");
    const dhsa__f32_kernels *k = dhsa__f32_kernels_active();
    /* in K blocks, so every kernel sees the k0/kn it is written for */
    for (int64_t k0 = 0; k0 < n; k0 += DHSA_QK_KC) {
        int64_t kn = n - k0 < DHSA_QK_KC ? n - k0 : DHSA_QK_KC;
        k->dequant(type, src, k0, kn, dst + k0);
    }
    return DHSA_OK;
}

dhsa_status dhsa__wmat_row(const dhsa_wmat *W, int64_t r, float *dst) {
    if (!W || !W->data || !dst) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa__wmat_row: W, its data or dst is NULL");
    if (r < 0 || r >= W->n_out)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa__wmat_row: row %lld is outside [0, %lld)", (long long)r,
                          (long long)W->n_out);
    dhsa_status st = dhsa__wt_check_n("dhsa__wmat_row", W->type, W->n_in);
    if (st != DHSA_OK) return st;
    if (W->row_bytes < dhsa__wt_row_bytes(W->type, W->n_in))
        return dhsa__fail(DHSA_ERR_SHAPE, "dhsa__wmat_row: row_bytes %lld is less than a row of %lld values (%lld)",
                          (long long)W->row_bytes, (long long)W->n_in,
                          (long long)dhsa__wt_row_bytes(W->type, W->n_in));
    return dhsa__dequantize_row(W->type, (const uint8_t *)W->data + r * W->row_bytes, dst, W->n_in);
}

/* The public Q8_0 row conversions (dhsa.h): the weight quantizer above,
 * so a Q8_0 KV cache holds exactly what a Q8_0 weight of the same values
 * would. */
dhsa_status dhsa_q8_0_quantize_row(const float *src, void *dst, int64_t n) {
    return dhsa__quantize_row(DHSA_GGML_Q8_0, src, dst, n);
}

dhsa_status dhsa_q8_0_dequantize_row(const void *src, float *dst, int64_t n) {
    return dhsa__dequantize_row(DHSA_GGML_Q8_0, src, dst, n);
}

/* -------------------------------------------------------- the path --- */

static void f32_plan(dhsa__mm_plan *pp, uint32_t type, int64_t n_in, int64_t n_out, int64_t n_tok, int n_threads) {
    const dhsa__f32_kernels *k = pp->k;
    dhsa__mm_plan p = *pp;
    int64_t row_bytes = dhsa__wt_row_bytes(type, n_in);
    p.fused = n_tok <= k->max_tok_fused[dhsa__wt_index(type)] && k->gemv != NULL;
    if (p.fused) {
        p.span = 1; /* a task's chunks in one gemv call: its prefetch runs on across them */
        p.unit_rows = round_up(ceil_div(FUSED_CHUNK_BYTES, row_bytes > 0 ? row_bytes : 1), 4);
        p.n_units = ceil_div(n_out, p.unit_rows);
        double bytes = (double)row_bytes * (double)n_out;
        double t = bytes / FUSED_TASK_BYTES;
        p.n_tasks = t < 1.0 ? 1 : t > (double)p.n_units ? p.n_units : (int64_t)t;
        *pp = p;
        return;
    }
    int64_t rows = n_out < DHSA_QK_PANEL ? n_out : DHSA_QK_PANEL;
    p.unit_rows = round_up(rows, k->nr);
    p.n_units = ceil_div(n_out, p.unit_rows);
    double t = 2.0 * (double)n_in * (double)n_out * (double)n_tok / PANEL_TASK_FLOPS;
    p.n_tasks = t < 1.0 ? 1 : t > (double)p.n_units ? p.n_units : (int64_t)t;
    int64_t kc = n_in < DHSA_QK_KC ? n_in : DHSA_QK_KC;
    /* +16 floats: rows 64 bytes apart modulo 4 KiB, so the tile's rows do not
     * fight over the same L1 sets */
    p.ldb = round_up(kc, 16) + 16;
    p.per_thread = (size_t)(p.unit_rows + k->mr) * (size_t)p.ldb * sizeof(float);
    int users = p.n_tasks == 1 || n_threads <= 1 ? 1 : n_threads;
    p.ws = (size_t)users * p.per_thread;
    *pp = p;
}

/* Fused form: rows [o0, o1) (a task's chunks), every token. */
static void fused_rows(const dhsa__mm_job *j, int64_t o0, int64_t o1) {
    const dhsa_wmat *W = j->W;
    const dhsa__f32_kernels *k = j->p->k;
    k->gemv(W->type, (const uint8_t *)W->data + o0 * W->row_bytes, W->row_bytes, o1 - o0, W->n_in, j->x, j->ldx,
            j->n_tok, j->y + o0, j->ldy);
}

/* Bytes of a row holding columns [k0, k0 + kn) (k0, kn multiples of the block). */
static inline int64_t seg_bytes(uint32_t type, int64_t kn) {
    return kn / dhsa__wt_block(type) * dhsa__wt_block_bytes(type);
}

/* Prefetches, a slice at a time, the W segments the next K block (or the
 * next panel's first) will dequantize: np short row segments that would
 * otherwise each wait on memory when there are few tokens to hide it. */
typedef struct {
    const uint8_t *base; /* first row's segment */
    int64_t row_bytes, lines, total, done;
} w_prefetch;

static w_prefetch w_prefetch_next(const dhsa__mm_job *j, int64_t o0, int64_t np, int64_t k0) {
    const dhsa_wmat *W = j->W;
    w_prefetch f = {NULL, W->row_bytes, 0, 0, 0};
    int64_t nk0 = k0 + DHSA_QK_KC, no0 = o0, nnp = np;
    if (nk0 >= W->n_in) { /* the next panel */
        nk0 = 0;
        no0 = o0 + np;
        nnp = W->n_out - no0 < np ? W->n_out - no0 : np;
        if (nnp <= 0) return f;
    }
    int64_t nkn = W->n_in - nk0 < DHSA_QK_KC ? W->n_in - nk0 : DHSA_QK_KC;
    int64_t off = seg_bytes(W->type, nk0);
    f.base = (const uint8_t *)W->data + no0 * W->row_bytes + off;
    f.lines = ceil_div(seg_bytes(W->type, nkn), 64);
    f.total = nnp * f.lines;
    return f;
}

static inline void w_prefetch_some(w_prefetch *f, int64_t n) {
    for (int64_t e = 0; e < n && f->done < f->total; e++, f->done++)
        __builtin_prefetch(f->base + f->done / f->lines * f->row_bytes + 64 * (f->done % f->lines), 0, 2); /* to L2 */
}

/* One panel: rows [o0, o0 + np), every K block, every token. */
static void panel(const dhsa__mm_job *j, int64_t o0, int64_t np, float *buf, float *xp) {
    const dhsa__f32_kernels *k = j->p->k;
    const dhsa_wmat *W = j->W;
    const int mr = k->mr, nr = k->nr;
    const int64_t ldb = j->p->ldb, n_in = W->n_in, n_tok = j->n_tok;
    const int64_t np_pad = round_up(np, nr);
    const int64_t n_tiles = ceil_div(n_tok, mr) * ceil_div(np, nr);
    float out[64]; /* mr * nr */
    for (int64_t k0 = 0; k0 < n_in; k0 += DHSA_QK_KC) {
        w_prefetch wpf = w_prefetch_next(j, o0, np, k0);
        const int64_t wpf_per_tile = ceil_div(wpf.total, n_tiles);
        const int64_t kn = n_in - k0 < DHSA_QK_KC ? n_in - k0 : DHSA_QK_KC, kp = round_up(kn, 16);
        const int first = k0 == 0;
        /* buf [np_pad][ldb]: W rows o0.., columns k0..k0+kn, zero padded */
        for (int64_t r = 0; r < np; r++) {
            float *b = buf + r * ldb;
            k->dequant(W->type, (const uint8_t *)W->data + (o0 + r) * W->row_bytes, k0, kn, b);
            for (int64_t c = kn; c < kp; c++) b[c] = 0.0f;
        }
        for (int64_t r = np; r < np_pad; r++) memset(buf + r * ldb, 0, (size_t)kp * sizeof(float));
        for (int64_t t0 = 0; t0 < n_tok; t0 += mr) {
            const int nt = n_tok - t0 < mr ? (int)(n_tok - t0) : mr;
            /* xp [mr][ldb]: tokens t0.. (the last one repeated to fill the tile) */
            for (int t = 0; t < mr; t++) {
                const float *src = j->x + (t0 + (t < nt ? t : nt - 1)) * j->ldx + k0;
                float *d = xp + t * ldb;
                memcpy(d, src, (size_t)kn * sizeof(float));
                for (int64_t c = kn; c < kp; c++) d[c] = 0.0f;
            }
            /* the next tile of tokens comes from L3 or memory (x of 512 tokens is
             * megabytes): fetch it while this one computes, a slice per tile */
            const int64_t t_next = t0 + mr, lines = ceil_div(kn, 16); /* 64-byte lines per x row */
            const int64_t n_pf = t_next < n_tok ? mr * lines : 0, per_tile = ceil_div(n_pf, ceil_div(np, nr));
            int64_t pf_i = 0;
            for (int64_t r0 = 0; r0 < np; r0 += nr) {
                for (int64_t e = 0; e < per_tile && pf_i < n_pf; e++, pf_i++) {
                    int64_t tt = t_next + pf_i / lines;
                    if (tt < n_tok) __builtin_prefetch(j->x + tt * j->ldx + k0 + 16 * (pf_i % lines));
                }
                w_prefetch_some(&wpf, wpf_per_tile);
                k->tile(buf + r0 * ldb, ldb, xp, ldb, kp, out);
                const int vr = np - r0 < nr ? (int)(np - r0) : nr;
                for (int t = 0; t < nt; t++) {
                    float *yr = j->y + (t0 + t) * j->ldy + o0 + r0;
                    for (int r = 0; r < vr; r++) yr[r] = first ? out[t * nr + r] : yr[r] + out[t * nr + r];
                }
            }
        }
    }
}

static void f32_rows(dhsa__mm_job *j, int64_t o0, int64_t o1, char *buf) {
    if (j->p->fused) {
        fused_rows(j, o0, o1);
        return;
    }
    float *b = (float *)buf, *xp = b + j->p->unit_rows * j->p->ldb;
    panel(j, o0, o1 - o0, b, xp);
}

/* Every type; no preparation: x is read as it is. */
const dhsa__path_impl dhsa__path_f32 = {"dhsa__matmul", {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, f32_plan, NULL,
                                        f32_rows, 0};

int dhsa__matmul_fused(uint32_t type, int64_t n_tok) {
    const dhsa__f32_kernels *k = dhsa__f32_kernels_active();
    return dhsa__wt_supported(type) && k->gemv && n_tok <= k->max_tok_fused[dhsa__wt_index(type)];
}
