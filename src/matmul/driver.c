/* driver.c: the one driver of the weight products (contract in path.h):
 * a planned call takes the ctx's lock and scratch, prepares the
 * activations, then runs its tasks on the ctx's threads; the same for
 * every path, whose table says how to plan, prepare and compute rows.
 *
 * Run: make build/tests/test_quant build/tests/test_qint && build/tests/test_quant && build/tests/test_qint.
 */
#include "matmul/path.h"

#include "core/internal.h"

#include <string.h>

dhsa__mm_plan dhsa__mm_plan_with(const dhsa__path_impl *path, const void *k, const char *name, uint32_t type,
                                 int64_t n_in, int64_t n_out, int64_t n_tok, int n_threads) {
    dhsa__mm_plan p;
    memset(&p, 0, sizeof p);
    p.name = name;
    if (!path || !k || !dhsa__path_covers(path, type) || n_in <= 0 || n_out <= 0 || n_tok <= 0) return p;
    p.path = path;
    p.k = k;
    path->plan(&p, type, n_in, n_out, n_tok, n_threads);
    return p;
}

static void prep_task(void *arg, int64_t task, int thread) {
    (void)thread;
    const dhsa__mm_job *j = arg;
    const dhsa__mm_plan *p = j->p;
    j->p->path->prepare(j, task * p->prep_tok / p->n_prep, (task + 1) * p->prep_tok / p->n_prep);
}

static void prepare(dhsa_ctx *ctx, dhsa__mm_job *j) {
    const dhsa__mm_plan *p = j->p;
    if (!p->path->prepare || p->n_prep <= 0) return;
    /* few tokens: here (about a microsecond a row), sparing a wake-up of
     * the threads; many: in parallel over tokens */
    if (p->prep_inline)
        for (int64_t t = 0; t < p->n_prep; t++) prep_task(j, t, 0);
    else
        dhsa_parallel_for(ctx, p->n_prep, prep_task, j);
}

/* Task `task` of a job: units [u0, u1), in one rows() call or one per unit. */
static void run_task(dhsa__mm_job *j, int64_t task, int thread) {
    const dhsa__mm_plan *p = j->p;
    const int64_t u0 = task * p->n_units / p->n_tasks, u1 = (task + 1) * p->n_units / p->n_tasks;
    const int64_t n_out = j->W->n_out;
    char *buf = j->per ? j->per + (size_t)thread * p->per_thread : NULL;
    if (p->span) {
        const int64_t o0 = u0 * p->unit_rows, o1 = u1 * p->unit_rows < n_out ? u1 * p->unit_rows : n_out;
        if (o0 < o1) p->path->rows(j, o0, o1, buf);
        return;
    }
    for (int64_t u = u0; u < u1; u++) {
        const int64_t o0 = u * p->unit_rows;
        p->path->rows(j, o0, o0 + (n_out - o0 < p->unit_rows ? n_out - o0 : p->unit_rows), buf);
    }
}

static void mm_task(void *arg, int64_t task, int thread) { run_task(arg, task, thread); }

static void job_init(dhsa__mm_job *j, const dhsa__mm_plan *p, const dhsa_wmat *W, const float *x, int64_t ldx,
                     int64_t n_tok, float *y, int64_t ldy, char *ws) {
    memset(j, 0, sizeof *j);
    j->p = p;
    j->W = W;
    j->x = x;
    j->ldx = ldx;
    j->n_tok = n_tok;
    j->y = y;
    j->ldy = ldy;
    if (ws) {
        char *a = p->align ? (char *)round_up((int64_t)(uintptr_t)ws, 64) : ws;
        j->act = a;
        j->per = a + p->act_bytes;
    }
    atomic_init(&j->st, DHSA_OK);
}

dhsa_status dhsa__mm_run(dhsa_ctx *ctx, const dhsa__mm_plan *p, const dhsa_wmat *W, const float *x, int64_t ldx,
                         int64_t n_tok, float *y, int64_t ldy) {
    if (n_tok <= 0) return DHSA_OK;
    if (!p->path)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa__mm_run: no plan for %s weights of %lld x %lld",
                          dhsa__wt_name(W->type) ? dhsa__wt_name(W->type) : "unsupported", (long long)W->n_out,
                          (long long)W->n_in);
    dhsa_status st = DHSA_OK;
    /* the scratch is the ctx's: one call at a time works in it */
    dhsa__ctx_lock(ctx);
    char *ws = NULL;
    if (p->ws) {
        ws = dhsa__scratch(ctx, p->ws, &st);
        if (!ws) {
            dhsa__ctx_unlock(ctx);
            return st;
        }
    }
    dhsa__mm_job j;
    job_init(&j, p, W, x, ldx, n_tok, y, ldy, ws);
    prepare(ctx, &j);
    dhsa_parallel_for(ctx, p->n_tasks, mm_task, &j);
    dhsa__ctx_unlock(ctx);
    return (dhsa_status)atomic_load(&j.st);
}

/* Several products of one activation in one parallel job (the products of
 * a layer that read the same x: q, k, v; gate, up). A decode step is made
 * of small products: one job each costs a wake-up and a barrier each, and
 * a product under two tasks' worth (k and v of a small model) ran on the
 * calling thread alone while the others waited. Here the tasks of all the
 * products form one list and x is prepared once. */
#define MM_MULTI_MAX 4
typedef struct {
    dhsa__mm_plan p[MM_MULTI_MAX];
    dhsa__mm_job j[MM_MULTI_MAX];
    int64_t first[MM_MULTI_MAX + 1]; /* product i has tasks [first[i], first[i + 1]) */
} mm_multi_job;

static void multi_task(void *arg, int64_t task, int thread) {
    mm_multi_job *m = arg;
    int i = 0;
    while (task >= m->first[i + 1]) i++;
    run_task(&m->j[i], task - m->first[i], thread);
}

int dhsa__mm_run_multi(dhsa_ctx *ctx, const dhsa__mm_plan *p, const dhsa_wmat *const *W, int nw, const float *x,
                       int64_t ldx, int64_t n_tok, float *const *y, dhsa_status *st) {
    *st = DHSA_OK;
    if (!ctx || nw < 1 || nw > MM_MULTI_MAX || n_tok < 1) return 0;
    const int nth = dhsa_ctx_n_threads(ctx);
    mm_multi_job m;
    memset(&m, 0, sizeof m);
    size_t per_thread = 0, single_ws = 0;
    for (int i = 0; i < nw; i++) {
        if (!p[i].path || !p[i].path->multi || !p[i].fused || p[i].path != p[0].path || p[i].k != p[0].k ||
            p[i].act_bytes != p[0].act_bytes || p[i].align || !W[i] || !W[i]->data || !y[i] ||
            W[i]->type != W[0]->type || W[i]->n_in != W[0]->n_in)
            return 0;
        m.p[i] = p[i];
        if (p[i].per_thread > per_thread) per_thread = p[i].per_thread;
        if (p[i].ws > single_ws) single_ws = p[i].ws;
        m.first[i + 1] = m.first[i] + p[i].n_tasks;
    }
    /* the session planned its scratch for the single products: beyond it,
     * make them one at a time */
    const size_t ws = p[0].act_bytes + (size_t)nth * per_thread;
    if (ws > single_ws || m.first[nw] < 2) return 0;
    dhsa__ctx_lock(ctx);
    char *buf = dhsa__scratch(ctx, ws, st);
    if (!buf) {
        dhsa__ctx_unlock(ctx);
        return 1;
    }
    for (int i = 0; i < nw; i++) {
        m.p[i].per_thread = per_thread; /* each thread its own buffer even in a product of one task */
        job_init(&m.j[i], &m.p[i], W[i], x, ldx, n_tok, y[i], W[i]->n_out, buf);
    }
    if (m.p[0].path->prepare)
        for (int64_t t = 0; t < m.p[0].prep_tok; t++) m.p[0].path->prepare(&m.j[0], t, t + 1);
    dhsa_parallel_for(ctx, m.first[nw], multi_task, &m);
    dhsa__ctx_unlock(ctx);
    for (int i = 0; i < nw && *st == DHSA_OK; i++) *st = (dhsa_status)atomic_load(&m.j[i].st);
    return 1;
}
