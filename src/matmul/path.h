/* path.h: what each path of the weight products gives the one plan
 * (matmul.c, dhsa__matmul_plan) and the one driver (driver.c,
 * dhsa__mm_run): a table per path (f32.c, int8.c, bf16.c, amx.c) that says
 * which weight types it covers, how it cuts a call, how it prepares the
 * activations and how it computes a range of rows. Private to src/matmul;
 * includes only formats.h of it.
 *
 * A call runs as:
 *   plan      path->plan fills the geometry below for one shape and kernel
 *             set (the workspace bytes among it);
 *   prepare   the activations of every token into the scratch (int8:
 *             quantized; bf16, amx: rounded to BF16; f32: none), on the
 *             calling thread for few tokens, else in parallel over tokens;
 *   rows      the output rows cut into units, units into tasks, tasks run
 *             on the ctx's threads; each output element is one fixed-order
 *             reduction, so no result depends on the thread count.
 */
#ifndef DHSA_MATMUL_PATH_H
#define DHSA_MATMUL_PATH_H

#include "matmul/formats.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

static inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static inline int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

typedef struct dhsa__path_impl dhsa__path_impl;

/* The plan of one product: the kernel set, its name, its workspace, and
 * how the driver cuts it. */
typedef struct {
    const dhsa__path_impl *path; /* NULL: nothing runs (unsupported, n_tok = 0) */
    const void *k;               /* the path's kernel set */
    const char *name;            /* what runs, e.g. "int8 avx2" (static storage) */
    size_t ws;                   /* bytes of the ctx's scratch the call takes (0: none) */
    int fused;                   /* few tokens: each weight streamed once (decode) */
    int span;                    /* a task's units in one rows() call, else one call per unit */
    int64_t unit_rows, n_units, n_tasks;
    size_t act_bytes;            /* the prepared activations, at the start of the scratch */
    size_t per_thread;           /* then each thread's buffer (thread t at act_bytes + t * per_thread) */
    int align;                   /* the scratch is first aligned up to 64 bytes (ws counts the slack) */
    int64_t prep_tok, n_prep;    /* prep_tok token rows prepared by n_prep tasks (0: no preparation) */
    int prep_inline;             /* ... on the calling thread */
    /* the path's own geometry */
    int64_t lda;                 /* int8: codes per activation row; bf16, amx: BF16 values */
    int64_t nxd, nxs;            /* int8: scales and block sums per activation row */
    int64_t ldb;                 /* f32, bf16: panel buffer row stride */
    int bw, sb, cmax;            /* int8: weight block, activation scale group, largest code */
    int kpanel, kz, kmin;        /* int8: the K types' super-block panel (int8.h: ktile), its code offset, min term */
    int ksplit;                  /* int8: that panel with the scales in the codes (int8.h: ksplit) */
} dhsa__mm_plan;

/* One call in flight: what every task reads. */
typedef struct {
    const dhsa__mm_plan *p;
    const dhsa_wmat *W;
    const float *x; /* [n_tok][ldx] */
    int64_t ldx, n_tok;
    float *y;       /* [n_tok][ldy] */
    int64_t ldy;
    char *act;      /* the prepared activations (p->act_bytes) */
    char *per;      /* the threads' buffers */
    atomic_int st;  /* the first failure of a task (DHSA_OK: none) */
} dhsa__mm_job;

struct dhsa__path_impl {
    const char *fn; /* the name its entry point gives in errors */
    /* the weight types it multiplies, by dhsa__wt_index */
    uint8_t covers[DHSA_QK_N_TYPES];
    /* p's geometry and ws for this call (p->path, p->k set; type covered,
     * n_in a multiple of its block, every size >= 1) */
    void (*plan)(dhsa__mm_plan *p, uint32_t type, int64_t n_in, int64_t n_out, int64_t n_tok, int n_threads);
    /* the activations of tokens [t0, t1) of [0, p->prep_tok) into j->act;
     * NULL: x is read as it is */
    void (*prepare)(const dhsa__mm_job *j, int64_t t0, int64_t t1);
    /* y of rows [o0, o1) for every token; buf: the thread's p->per_thread
     * bytes; a failure goes to j->st */
    void (*rows)(dhsa__mm_job *j, int64_t o0, int64_t o1, char *buf);
    /* several products of one x may share one job (dhsa__mm_run_multi) */
    int multi;
};

extern const dhsa__path_impl dhsa__path_f32;  /* f32.c: the exact path, the reference */
extern const dhsa__path_impl dhsa__path_int8; /* int8.c: 8-bit activations, integer dot products */
extern const dhsa__path_impl dhsa__path_bf16; /* bf16.c: vdpbf16ps on F16/BF16 weights */
extern const dhsa__path_impl dhsa__path_amx;  /* amx.c: prefill on the AMX tiles */

/* 1 when the path multiplies weights of this type. */
static inline int dhsa__path_covers(const dhsa__path_impl *path, uint32_t type) {
    const int i = dhsa__wt_index(type);
    return i >= 0 && path->covers[i];
}

/* The plan of a call of this path with kernel set k (named name); a type
 * the path does not cover or a size < 1 give a plan with path NULL and ws
 * 0 (the caller has checked that n_in is a multiple of the block). */
dhsa__mm_plan dhsa__mm_plan_with(const dhsa__path_impl *path, const void *k, const char *name, uint32_t type,
                                 int64_t n_in, int64_t n_out, int64_t n_tok, int n_threads);

/* Runs a planned product (the arguments checked by the caller: W, x and y
 * as dhsa__matmul's contract, matmul.h), on the ctx's threads with its
 * scratch, under the ctx's lock. n_tok = 0 does nothing. */
dhsa_status dhsa__mm_run(dhsa_ctx *ctx, const dhsa__mm_plan *p, const dhsa_wmat *W, const float *x, int64_t ldx,
                         int64_t n_tok, float *y, int64_t ldy);

/* The products of one x with nw (at most 4) weights of one type and n_in,
 * y[i] [n_tok][W[i]->n_out], planned p[i] with one path whose multi is set
 * and one kernel set, in one parallel job: x prepared once, each product's
 * tasks, rows and sums those of its own call, so every y is bitwise what
 * dhsa__mm_run gives. Only for fused plans, and only where the scratch the
 * largest single plan asks is enough; elsewhere it does nothing and
 * returns 0 (run them one by one). Returns 1 when it ran them, *st the
 * result. */
int dhsa__mm_run_multi(dhsa_ctx *ctx, const dhsa__mm_plan *p, const dhsa_wmat *const *W, int nw, const float *x,
                       int64_t ldx, int64_t n_tok, float *const *y, dhsa_status *st);

#endif
