/* matmul.c: the one plan of the weight products and the calls that run
 * it (contract in matmul.h, numbers in docs/quant.md): the rules that pick
 * a path for a weight type and token count, the argument checks every call
 * shares, and the names a session prints. The paths' tables (f32.c,
 * int8.c, bf16.c, amx.c) say how each cuts and computes a call; the one
 * driver (driver.c) runs it.
 *
 * Run: make build/tests/test_quant build/tests/test_qint && build/tests/test_quant && build/tests/test_qint;
 *      build/dhsa bench matmul --help.
 */
#include "matmul/matmul.h"

#include "matmul/amx.h"
#include "matmul/bf16.h"
#include "matmul/int8.h"

#include "core/internal.h"

#include <string.h>

/* ------------------------------------------------------------ checks --- */

/* Checks shared by dhsa__matmul and the workspace query. */
static dhsa_status check_mm(uint32_t type, int64_t n_in, int64_t n_out, int64_t n_tok) {
    if (!dhsa__wt_supported(type)) return dhsa__wt_unsupported("dhsa__matmul", type);
    if (n_in <= 0 || n_out <= 0 || n_tok < 0)
        return dhsa__fail(DHSA_ERR_SHAPE, "dhsa__matmul: n_in = %lld, n_out = %lld, n_tok = %lld (need n_in, n_out >= 1, "
                          "n_tok >= 0)", (long long)n_in, (long long)n_out, (long long)n_tok);
    if (n_in % dhsa__wt_block(type))
        return dhsa__fail(DHSA_ERR_SHAPE, "dhsa__matmul: n_in = %lld is not a multiple of the %s block (%lld values)",
                          (long long)n_in, dhsa__wt_name(type), (long long)dhsa__wt_block(type));
    if (n_in > ((int64_t)1 << 40) || n_out > ((int64_t)1 << 40) || n_tok > ((int64_t)1 << 40))
        return dhsa__fail(DHSA_ERR_TOO_LARGE, "dhsa__matmul: a dimension is above 2^40");
    return DHSA_OK;
}

/* The checks of a call, shared by every path (n_tok = 0 passes). */
static dhsa_status check_call(dhsa_ctx *ctx, const dhsa_wmat *W, const float *x, int64_t ldx, int64_t n_tok,
                              const float *y, int64_t ldy) {
    if (!ctx || !W || !x || !y || !W->data)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa__matmul: ctx, W, W->data, x and y must not be NULL");
    dhsa_status st = check_mm(W->type, W->n_in, W->n_out, n_tok);
    if (st != DHSA_OK) return st;
    if (ldx < W->n_in || ldy < W->n_out)
        return dhsa__fail(DHSA_ERR_SHAPE, "dhsa__matmul: ldx = %lld must be >= n_in = %lld and ldy = %lld >= n_out = %lld",
                          (long long)ldx, (long long)W->n_in, (long long)ldy, (long long)W->n_out);
    int64_t rb = dhsa__wt_row_bytes(W->type, W->n_in);
    if (W->row_bytes < rb)
        return dhsa__fail(DHSA_ERR_SHAPE, "dhsa__matmul: row_bytes = %lld is less than a %s row of %lld values (%lld bytes)",
                          (long long)W->row_bytes, dhsa__wt_name(W->type), (long long)W->n_in, (long long)rb);
    if (n_tok == 0) return DHSA_OK;
    if (ldx > INT64_MAX / n_tok || ldy > INT64_MAX / n_tok || W->row_bytes > INT64_MAX / W->n_out)
        return dhsa__fail(DHSA_ERR_TOO_LARGE, "dhsa__matmul: a buffer size overflows 64 bits");
    /* x and y must not overlap (y is written while x is still read) */
    uintptr_t xa = (uintptr_t)x, xb = (uintptr_t)(x + (n_tok - 1) * ldx + W->n_in);
    uintptr_t ya = (uintptr_t)y, yb = (uintptr_t)(y + (n_tok - 1) * ldy + W->n_out);
    if (xa < yb && ya < xb) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa__matmul: x and y overlap");
    return DHSA_OK;
}

/* ------------------------------------------------------------ the plan --- */

/* The path a call takes, its kernels and their name. */
typedef struct {
    const dhsa__path_impl *impl;
    const void *k;
    const char *name;
} choice;

/* The fast path: the AMX tiles for calls of at least DHSA__AMX_MIN_TOK
 * tokens (every type but F32, where the CPU, the OS and the build have
 * them), the BF16 kernels for F16 and BF16 (where they pay,
 * dhsa__bf16_kernels_active), the integer kernels for the quantized types
 * (except the few-token calls of the types whose integer fused form is
 * slower than the exact one: dhsa__qi_fused_exact), the exact path for
 * the rest. */
static choice choose(dhsa__mm_path path, uint32_t type, int64_t n_tok) {
    if (path == DHSA_MM_FAST) {
        if (n_tok >= DHSA__AMX_MIN_TOK && dhsa__path_covers(&dhsa__path_amx, type)) {
            const dhsa__amx_kernels *k = dhsa__amx_kernels_active();
            if (k) return (choice){&dhsa__path_amx, k, "bf16 amx"};
        }
        if (dhsa__path_covers(&dhsa__path_bf16, type)) {
            const dhsa__bf16_kernels *k = dhsa__bf16_kernels_active();
            if (k) return (choice){&dhsa__path_bf16, k, dhsa__bf16_path_name(k)};
        }
        if (dhsa__path_covers(&dhsa__path_int8, type)) {
            const dhsa__qi_kernels *k = dhsa__qi_kernels_active();
            if (k && !(n_tok <= k->max_tok_fused && dhsa__qi_fused_exact(k, type)))
                return (choice){&dhsa__path_int8, k, dhsa__qi_path_name(k, type)};
        }
    }
    return (choice){&dhsa__path_f32, dhsa__f32_kernels_active(), dhsa__f32_path_name()};
}

dhsa__mm_plan dhsa__matmul_plan(dhsa__mm_path path, uint32_t type, int64_t n_in, int64_t n_out, int64_t n_tok,
                                int n_threads) {
    const choice c = choose(path, type, n_tok);
    if (check_mm(type, n_in, n_out, n_tok) != DHSA_OK || n_tok == 0) {
        dhsa__mm_plan none;
        memset(&none, 0, sizeof none);
        none.name = c.name;
        return none;
    }
    return dhsa__mm_plan_with(c.impl, c.k, c.name, type, n_in, n_out, n_tok, n_threads);
}

/* ------------------------------------------------------------- calls --- */

dhsa_status dhsa__matmul_on(dhsa_ctx *ctx, dhsa__mm_path path, const dhsa_wmat *W, const float *x, int64_t ldx,
                            int64_t n_tok, float *y, int64_t ldy) {
    dhsa_status st = check_call(ctx, W, x, ldx, n_tok, y, ldy);
    if (st != DHSA_OK || n_tok == 0) return st;
    const dhsa__mm_plan p = dhsa__matmul_plan(path, W->type, W->n_in, W->n_out, n_tok, dhsa_ctx_n_threads(ctx));
    return dhsa__mm_run(ctx, &p, W, x, ldx, n_tok, y, ldy);
}

dhsa_status dhsa__matmul(dhsa_ctx *ctx, const dhsa_wmat *W, const float *x, int64_t ldx, int64_t n_tok, float *y,
                         int64_t ldy) {
    return dhsa__matmul_on(ctx, DHSA_MM_EXACT, W, x, ldx, n_tok, y, ldy);
}

dhsa_status dhsa__matmul_multi_on(dhsa_ctx *ctx, dhsa__mm_path path, const dhsa_wmat *const *W, int nw,
                                  const float *x, int64_t ldx, int64_t n_tok, float *const *y) {
    dhsa_status st = DHSA_OK;
    if (nw >= 1 && W[0] && choose(path, W[0]->type, n_tok).impl->multi) {
        for (int i = 0; i < nw && st == DHSA_OK; i++)
            st = check_call(ctx, W[i], x, ldx, n_tok, y[i], W[i] ? W[i]->n_out : 0);
        if (st != DHSA_OK || n_tok == 0) return st;
        if (nw <= 4) {
            dhsa__mm_plan p[4];
            const int nth = dhsa_ctx_n_threads(ctx);
            for (int i = 0; i < nw; i++) p[i] = dhsa__matmul_plan(path, W[i]->type, W[i]->n_in, W[i]->n_out, n_tok, nth);
            if (dhsa__mm_run_multi(ctx, p, W, nw, x, ldx, n_tok, y, &st)) return st;
        }
    }
    for (int i = 0; i < nw && st == DHSA_OK; i++) st = dhsa__matmul_on(ctx, path, W[i], x, ldx, n_tok, y[i], W[i]->n_out);
    return st;
}

size_t dhsa__matmul_workspace_on(dhsa__mm_path path, uint32_t type, int64_t n_in, int64_t n_out, int64_t n_tok,
                                 int n_threads) {
    return dhsa__matmul_plan(path, type, n_in, n_out, n_tok, n_threads).ws;
}

size_t dhsa__matmul_workspace(uint32_t type, int64_t n_in, int64_t n_out, int64_t n_tok, int n_threads) {
    return dhsa__matmul_workspace_on(DHSA_MM_EXACT, type, n_in, n_out, n_tok, n_threads);
}

int dhsa__matmul_fast_covers(uint32_t type, int64_t n_tok) {
    return choose(DHSA_MM_FAST, type, n_tok).impl != &dhsa__path_f32;
}

/* ------------------------------------------------------------- names --- */

const char *dhsa__matmul_prefill_name(dhsa__mm_path path, uint32_t type) {
    return path == DHSA_MM_FAST && dhsa__amx_takes(type, DHSA__AMX_MIN_TOK) ? "bf16 amx" : NULL;
}

const char *dhsa__matmul_path_name(dhsa__mm_path path, uint32_t type) {
    if (path == DHSA_MM_FAST && dhsa__path_covers(&dhsa__path_int8, type)) {
        const dhsa__qi_kernels *k = dhsa__qi_kernels_active();
        if (k && dhsa__qi_fused_exact(k, type)) /* decode on the exact path (choose) */
            return "int8 avx512-vnni, decode f32 avx512 (faster here)";
        if (k) return dhsa__qi_path_name(k, type);
    }
    if (path == DHSA_MM_FAST && dhsa__path_covers(&dhsa__path_bf16, type)) {
        const dhsa__bf16_kernels *k = dhsa__bf16_kernels_active();
        if (k) return dhsa__bf16_path_name(k);
    }
    /* F16/BF16 where the BF16 kernels could run but do not: say why */
    const char *why = path == DHSA_MM_FAST && dhsa__bf16_type(type) ? dhsa__bf16_off_reason() : NULL;
    if (why && strcmp(why, "DHSA_BF16=off") == 0) return "f32 avx512 (DHSA_BF16=off)";
    if (why) return "f32 avx512 (avx512-bf16 slower here)";
    return dhsa__f32_path_name();
}
