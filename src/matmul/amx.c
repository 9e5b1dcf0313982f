/* amx.c: the driver of the AMX route (contract in amx.h): activations
 * rounded to BF16 once per call (in parallel over tokens, padded with zero
 * tokens to a multiple of 16), then per task a unit of up to AMX_U rows:
 * each row read as the exact route reads it, rounded to BF16, packed for
 * the tiles into an L2 buffer, and the 32 x 32 tile (amx_amx.c) run over
 * every token; full tiles store straight into y.
 *
 * Run: make build/tests/test_amx && build/tests/test_amx.
 */
#include "matmul/amx.h"

#include "core/internal.h"
#include "matmul/bf16.h"

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

typedef struct {
    int64_t kp, ntp, unit_rows, n_units, n_tasks;
    size_t xb_bytes, per_thread, ws;
} amx_plan;

static amx_plan make_plan(int64_t n_in, int64_t n_out, int64_t n_tok, int n_threads) {
    amx_plan p;
    memset(&p, 0, sizeof p);
    p.kp = round_up(n_in, 32);
    p.ntp = round_up(n_tok, 16);
    p.unit_rows = AMX_PANEL_BYTES / (p.kp * 2) / 32 * 32;
    if (p.unit_rows < 32) p.unit_rows = 32;
    if (p.unit_rows > AMX_U_MAX) p.unit_rows = AMX_U_MAX;
    p.n_units = (n_out + p.unit_rows - 1) / p.unit_rows;
    p.n_tasks = p.n_units;
    p.xb_bytes = (size_t)round_up((int64_t)((size_t)p.ntp * (size_t)p.kp * 2), 64);
    /* the panel, 16 staged BF16 rows, one F32 row, a 32 x 32 out tile */
    p.per_thread = (size_t)p.unit_rows * (size_t)p.kp * 2 + 16 * (size_t)p.kp * 2 + (size_t)p.kp * 4 + 32 * 32 * 4;
    p.per_thread = (size_t)round_up((int64_t)p.per_thread, 64);
    const int users = p.n_tasks == 1 || n_threads <= 1 ? 1 : n_threads;
    p.ws = p.xb_bytes + (size_t)users * p.per_thread + 64;
    return p;
}

size_t dhsa__amx_workspace(uint32_t type, int64_t n_in, int64_t n_out, int64_t n_tok, int n_threads) {
    if (!dhsa__amx_type(type) || n_in <= 0 || n_out <= 0 || n_tok <= 0) return 0;
    return make_plan(n_in, n_out, n_tok, n_threads).ws;
}

typedef struct {
    const dhsa__amx_kernels *k;
    const dhsa__bf16_kernels *bk; /* rounding and F16/BF16 rows */
    const dhsa_wmat *W;
    const float *x;
    int64_t ldx, n_tok;
    float *y;
    int64_t ldy;
    amx_plan p;
    uint16_t *xb; /* [ntp][kp] */
    char *per; /* per-thread buffers */
    int64_t n_round; /* tasks of the rounding */
    atomic_int st;   /* a failed row read (the caller's checks leave none; kept, not dropped) */
} amx_job;

static void round_task(void *arg, int64_t task, int thread) {
    (void)thread;
    const amx_job *j = arg;
    for (int64_t t = task * j->p.ntp / j->n_round; t < (task + 1) * j->p.ntp / j->n_round; t++) {
        uint16_t *d = j->xb + t * j->p.kp;
        if (t < j->n_tok)
            j->bk->round_act(j->x + t * j->ldx, j->W->n_in, j->p.kp, d);
        else
            memset(d, 0, (size_t)j->p.kp * 2);
    }
}

/* Rows [o0, o0 + np) packed at pw (zeros up to a multiple of 32 rows),
 * then every token tile. */
static dhsa_status unit(const amx_job *j, int64_t o0, int64_t np, char *buf) {
    const dhsa_wmat *W = j->W;
    const int64_t kp = j->p.kp, n = W->n_in, U = j->p.unit_rows;
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
                j->bk->to_bf16(W->type, src, 0, n, d);
            } else {
                dhsa_status st = dhsa__dequantize_row(W->type, src, row, n);
                if (st != DHSA_OK) return st;
                j->bk->round_act(row, n, kp, d);
            }
        }
        j->k->pack16(stage, kp, kp, pw + g * 16 * kp);
    }
    for (int64_t t0 = 0; t0 < j->p.ntp; t0 += 32) {
        const int nt = j->p.ntp - t0 < 32 ? (int)(j->p.ntp - t0) : 32;
        const int64_t tv = j->n_tok - t0 < nt ? j->n_tok - t0 : nt; /* tokens that are real */
        for (int64_t rb = 0; rb < np; rb += 32) {
            const int64_t rv = np - rb < 32 ? np - rb : 32;
            const uint16_t *p32 = pw + rb * kp; /* groups rb/16 and rb/16 + 1 */
            if (tv == nt && rv == 32) {
                j->k->tile(p32, kp, j->xb + t0 * kp, kp, nt, j->y + t0 * j->ldy + o0 + rb, j->ldy);
            } else {
                j->k->tile(p32, kp, j->xb + t0 * kp, kp, nt, out, 32);
                for (int64_t t = 0; t < tv; t++)
                    memcpy(j->y + (t0 + t) * j->ldy + o0 + rb, out + t * 32, (size_t)rv * sizeof(float));
            }
        }
    }
    return DHSA_OK;
}

static void mm_task(void *arg, int64_t task, int thread) {
    amx_job *j = arg;
    char *buf = j->per + (j->p.n_tasks == 1 ? 0 : (size_t)thread * j->p.per_thread);
    const int64_t o0 = task * j->p.unit_rows;
    const int64_t np = j->W->n_out - o0 < j->p.unit_rows ? j->W->n_out - o0 : j->p.unit_rows;
    dhsa_status st = unit(j, o0, np, buf);
    if (st != DHSA_OK) atomic_store(&j->st, (int)st);
}

dhsa_status dhsa__amx_matmul(dhsa_ctx *ctx, const dhsa__amx_kernels *k, const dhsa_wmat *W, const float *x,
                             int64_t ldx, int64_t n_tok, float *y, int64_t ldy) {
    if (!ctx || !k || !W || !W->data || !x || !y)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa__amx_matmul: ctx, k, W, W->data, x and y must not be NULL");
    if (!dhsa__amx_type(W->type))
        return dhsa__fail(DHSA_ERR_UNSUPPORTED, "dhsa__amx_matmul: weight type %u has no AMX route", W->type);
#if defined(__x86_64__)
    const dhsa__bf16_kernels *bk = &dhsa__bf16_avx512bf16;
#else
    const dhsa__bf16_kernels *bk = NULL;
#endif
    if (!bk || !bk->name)
        return dhsa__fail(DHSA_ERR_UNSUPPORTED, "dhsa__amx_matmul: built without the AVX512-BF16 kernels");
    if (n_tok == 0) return DHSA_OK;
    amx_job j;
    memset(&j, 0, sizeof j);
    j.k = k;
    j.bk = bk;
    j.W = W;
    j.x = x;
    j.ldx = ldx;
    j.n_tok = n_tok;
    j.y = y;
    j.ldy = ldy;
    j.p = make_plan(W->n_in, W->n_out, n_tok, dhsa_ctx_n_threads(ctx));
    dhsa_status st = DHSA_OK;
    dhsa__ctx_lock(ctx);
    char *ws = dhsa__scratch(ctx, j.p.ws, &st);
    if (!ws) {
        dhsa__ctx_unlock(ctx);
        return st;
    }
    char *a = (char *)round_up((int64_t)(uintptr_t)ws, 64);
    j.xb = (uint16_t *)a;
    j.per = a + j.p.xb_bytes;
    atomic_init(&j.st, DHSA_OK);
    j.n_round = j.p.ntp < 64 ? j.p.ntp / 16 : 64;
    dhsa_parallel_for(ctx, j.n_round, round_task, &j);
    dhsa_parallel_for(ctx, j.p.n_tasks, mm_task, &j);
    dhsa__ctx_unlock(ctx);
    return (dhsa_status)atomic_load(&j.st);
}
