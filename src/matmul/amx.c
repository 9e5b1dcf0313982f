/* amx.c: the driver of the AMX path (contract in amx.h): activations
 * rounded to BF16 once per call (in parallel over tokens, padded with zero
 * tokens to a multiple of 16), then per task a unit of up to AMX_U rows:
 * each row read as the exact path reads it, rounded to BF16, packed for
 * the tiles into an L2 buffer, and the 32 x 32 tile (amx_amx.c) run over
 * every token; full tiles store straight into y.
 *
 * Run: make build/tests/test_amx && build/tests/test_amx.
 */
#include "matmul/amx.h"
#include "matmul/bf16.h"
#include "matmul/f32.h"
#include "matmul/path.h"

#include "core/internal.h"

#include <stdatomic.h>
#include <string.h>

/* Unit rows: a multiple of 32, the packed panel (rows x kp BF16) at most
 * AMX_PANEL_BYTES so that it stays in L2 while every token tile reads it. */
#define AMX_U_MAX 128
#define AMX_PANEL_BYTES (512 * 1024)


const dhsa__amx_kernels *dhsa__amx_kernels_active(void) {
#if defined(__x86_64__)
    if (dhsa__amx_tiles.name && dhsa__bf16_avx512bf16.name && dhsa__amx_active()) return &dhsa__amx_tiles;
#endif
    return NULL;
}

int dhsa__amx_type(uint32_t type) { return type != DHSA_GGML_F32 && dhsa__wt_supported(type); }

int dhsa__amx_takes(uint32_t type, int64_t n_tok) {
    return n_tok >= DHSA__AMX_MIN_TOK && dhsa__amx_type(type) && dhsa__amx_kernels_active() != NULL;
}

/* Scratch (aligned to 64 bytes): every token's activations as BF16
 * ([ntp][kp], ntp = n_tok rounded up to 16 with zero tokens), then each
 * thread's buffer: the packed panel, 16 staged BF16 rows, one F32 row, a
 * 32 x 32 out tile. One task per unit. */
static void amx_plan(dhsa__mm_plan *pp, uint32_t type, int64_t n_in, int64_t n_out, int64_t n_tok, int n_threads) {
    (void)type;
    dhsa__mm_plan p = *pp;
    const int64_t kp = round_up(n_in, 32), ntp = round_up(n_tok, 16);
    p.lda = kp;
    p.align = 1;
    p.prep_tok = ntp;
    p.n_prep = ntp < 64 ? ntp / 16 : 64;
    p.unit_rows = AMX_PANEL_BYTES / (kp * 2) / 32 * 32;
    if (p.unit_rows < 32) p.unit_rows = 32;
    if (p.unit_rows > AMX_U_MAX) p.unit_rows = AMX_U_MAX;
    p.n_units = (n_out + p.unit_rows - 1) / p.unit_rows;
    p.n_tasks = p.n_units;
    p.act_bytes = (size_t)round_up((int64_t)((size_t)ntp * (size_t)kp * 2), 64);
    p.per_thread = (size_t)p.unit_rows * (size_t)kp * 2 + 16 * (size_t)kp * 2 + (size_t)kp * 4 + 32 * 32 * 4;
    p.per_thread = (size_t)round_up((int64_t)p.per_thread, 64);
    const int users = p.n_tasks == 1 || n_threads <= 1 ? 1 : n_threads;
    p.ws = p.act_bytes + (size_t)users * p.per_thread + 64;
    *pp = p;
}

/* The AVX512-BF16 kernels' rounding of activations and F16/BF16 rows
 * (the AMX path runs only where they are built and the CPU has them). */
static const dhsa__bf16_kernels *bf16_k(void) {
#if defined(__x86_64__)
    return &dhsa__bf16_avx512bf16;
#else
    return &dhsa__bf16_scalar;
#endif
}

static void amx_prepare(const dhsa__mm_job *j, int64_t t0, int64_t t1) {
    const int64_t kp = j->p->lda;
    for (int64_t t = t0; t < t1; t++) {
        uint16_t *d = (uint16_t *)j->act + t * kp;
        if (t < j->n_tok)
            bf16_k()->round_act(j->x + t * j->ldx, j->W->n_in, kp, d);
        else
            memset(d, 0, (size_t)kp * 2);
    }
}

/* Rows [o0, o0 + np) packed at pw (zeros up to a multiple of 32 rows),
 * then every token tile. */
static dhsa_status unit(const dhsa__mm_job *j, int64_t o0, int64_t np, char *buf) {
    const dhsa__amx_kernels *k = j->p->k;
    const dhsa__bf16_kernels *bk = bf16_k();
    const uint16_t *xb = (const uint16_t *)j->act;
    const dhsa_wmat *W = j->W;
    const int64_t kp = j->p->lda, n = W->n_in, U = j->p->unit_rows;
    uint16_t *pw = (uint16_t *)buf;            /* [U/16][kp/2][16][2] */
    uint16_t *stage = pw + U * kp;             /* [16][kp] */
    float *row = (float *)(stage + 16 * kp);   /* [kp] */
    float *out = row + kp;                     /* [32][32] */
    const int f16 = W->type == DHSA_GGML_F16 || W->type == DHSA_GGML_BF16;
    /* whole pairs of groups: the tile reads 32 rows, so the second group
     * of the last pair is packed too (zeros) rather than left stale */
    for (int64_t g = 0; g * 16 < round_up(np, 32); g++) {
        for (int64_t rr = 0; rr < 16; rr++) {
            const int64_t r = g * 16 + rr;
            uint16_t *d = stage + rr * kp;
            const uint8_t *src = (const uint8_t *)W->data + (o0 + r) * W->row_bytes;
            if (r >= np) {
                memset(d, 0, (size_t)kp * 2);
            } else if (f16) {
                bk->to_bf16(W->type, src, 0, n, d);
            } else {
                dhsa_status st = dhsa__dequantize_row(W->type, src, row, n);
                if (st != DHSA_OK) return st;
                bk->round_act(row, n, kp, d);
            }
        }
        k->pack16(stage, kp, kp, pw + g * 16 * kp);
    }
    for (int64_t t0 = 0; t0 < j->p->prep_tok; t0 += 32) {
        const int nt = j->p->prep_tok - t0 < 32 ? (int)(j->p->prep_tok - t0) : 32;
        const int64_t tv = j->n_tok - t0 < nt ? j->n_tok - t0 : nt; /* tokens that are real */
        for (int64_t rb = 0; rb < np; rb += 32) {
            const int64_t rv = np - rb < 32 ? np - rb : 32;
            const uint16_t *p32 = pw + rb * kp; /* groups rb/16 and rb/16 + 1 */
            if (tv == nt && rv == 32) {
                k->tile(p32, kp, xb + t0 * kp, kp, nt, j->y + t0 * j->ldy + o0 + rb, j->ldy);
            } else {
                k->tile(p32, kp, xb + t0 * kp, kp, nt, out, 32);
                for (int64_t t = 0; t < tv; t++)
                    memcpy(j->y + (t0 + t) * j->ldy + o0 + rb, out + t * 32, (size_t)rv * sizeof(float));
            }
        }
    }
    return DHSA_OK;
}

static void amx_rows(dhsa__mm_job *j, int64_t o0, int64_t o1, char *buf) {
    dhsa_status st = unit(j, o0, o1 - o0, buf);
    if (st != DHSA_OK) atomic_store(&j->st, (int)st);
}

/* Every type but F32; x rounded to BF16 first. */
const dhsa__path_impl dhsa__path_amx = {"dhsa__amx_matmul", {0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, amx_plan,
                                        amx_prepare, amx_rows, 0};

size_t dhsa__amx_workspace(uint32_t type, int64_t n_in, int64_t n_out, int64_t n_tok, int n_threads) {
    /* the plan does not depend on the kernels: any non-NULL set plans it */
    return dhsa__mm_plan_with(&dhsa__path_amx, &dhsa__path_amx, "bf16 amx", type, n_in, n_out, n_tok, n_threads).ws;
}

dhsa_status dhsa__amx_matmul(dhsa_ctx *ctx, const dhsa__amx_kernels *k, const dhsa_wmat *W, const float *x,
                             int64_t ldx, int64_t n_tok, float *y, int64_t ldy) {
    if (!ctx || !k || !W || !W->data || !x || !y)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa__amx_matmul: ctx, k, W, W->data, x and y must not be NULL");
    if (!dhsa__amx_type(W->type))
        return dhsa__fail(DHSA_ERR_UNSUPPORTED, "dhsa__amx_matmul: weight type %u has no AMX path", W->type);
#if defined(__x86_64__)
    const int have_bf16 = dhsa__bf16_avx512bf16.name != NULL;
#else
    const int have_bf16 = 0;
#endif
    if (!have_bf16)
        return dhsa__fail(DHSA_ERR_UNSUPPORTED, "dhsa__amx_matmul: built without the AVX512-BF16 kernels");
    if (n_tok == 0) return DHSA_OK;
    const dhsa__mm_plan p =
        dhsa__mm_plan_with(&dhsa__path_amx, k, "bf16 amx", W->type, W->n_in, W->n_out, n_tok, dhsa_ctx_n_threads(ctx));
    return dhsa__mm_run(ctx, &p, W, x, ldx, n_tok, y, ldy);
}
