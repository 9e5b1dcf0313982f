/* ctx.c: the context. A fixed pool of worker threads (the caller is thread
 * 0), a tracking allocator with statistics and an optional budget, and a
 * grow-only scratch arena reused by kernels between calls.
 *
 * Contract: dhsa_parallel_for hands tasks out in increasing order through an
 * atomic counter, so which thread runs a task varies, but a task's result
 * must not depend on that (kernels keep per-task reduction order fixed).
 * A ctx may be shared by threads (include/dhsa.h, "Threads"): the pool and
 * the scratch serve one call at a time under call_mu, a recursive lock
 * (a call that makes calls on the same ctx takes it again), held by
 * dhsa_parallel_for for a job and by every scratch user for its whole call;
 * the allocator has its own lock (mem_mu) and never waits for a call.
 * Tested by tests/test_core.c and tests/test_threads.c.
 */
#include "core/internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#define DHSA_ALIGN 64
/* Each tracked block starts with a header of one alignment unit holding its
 * size, so release() can update the statistics. */
#define HDR DHSA_ALIGN

struct dhsa_ctx {
    int n_threads;

    /* one call at a time uses the pool and the scratch (recursive) */
    pthread_mutex_t call_mu;

    /* pool */
    pthread_t *workers;          /* n_threads - 1 */
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    atomic_ullong generation;    /* bumped per job, under mu */
    atomic_int n_idle_done;      /* workers finished with the current job */
    atomic_int stop;
    int n_sleeping;              /* workers waiting on wake; guarded by mu */
    int caller_sleeping;         /* the caller waits on done; guarded by mu */
    dhsa_task_fn fn;
    void *arg;
    int64_t n_tasks;
    atomic_llong next_task;

    /* memory */
    pthread_mutex_t mem_mu;
    dhsa_mem_stats st;
    void *scratch;
    size_t scratch_cap;
};

/* ---------------------------------------------------------------- pool --- */

typedef struct {
    dhsa_ctx *ctx;
    int id;
} worker_arg;

static void run_tasks(dhsa_ctx *ctx, int thread) {
    for (;;) {
        int64_t t = atomic_fetch_add_explicit(&ctx->next_task, 1, memory_order_relaxed);
        if (t >= ctx->n_tasks) break;
        ctx->fn(ctx->arg, t, thread);
    }
}

/* Waiting for the next job or for the workers: spin first, then sleep.
 * A condition variable's wake-up costs tens of microseconds (measured: a
 * decode pass of the default model, about 30 jobs, took 1.8 ms on 2
 * threads against 0.67 ms on 1); the jobs of a decode step follow each
 * other within microseconds, so each waiter polls for about SPIN_ROUNDS
 * pauses (tens of microseconds) before it sleeps, and the side that ends
 * the wait signals only a waiter that has gone to sleep. */
#define SPIN_ROUNDS 4096

static inline void cpu_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void *worker_main(void *p) {
    worker_arg wa = *(worker_arg *)p;
    free(p);
    dhsa_ctx *ctx = wa.ctx;
    uint64_t seen = 0;
    for (;;) {
        int spin = 0;
        while (atomic_load_explicit(&ctx->generation, memory_order_acquire) == seen &&
               !atomic_load_explicit(&ctx->stop, memory_order_relaxed) && spin < SPIN_ROUNDS) {
            cpu_pause();
            spin++;
        }
        if (atomic_load_explicit(&ctx->generation, memory_order_acquire) == seen) {
            /* the caller bumps the generation under mu: checked again under
             * mu, no wake-up is lost */
            pthread_mutex_lock(&ctx->mu);
            ctx->n_sleeping++;
            while (!atomic_load(&ctx->stop) && atomic_load(&ctx->generation) == seen)
                pthread_cond_wait(&ctx->wake, &ctx->mu);
            ctx->n_sleeping--;
            pthread_mutex_unlock(&ctx->mu);
        }
        if (atomic_load(&ctx->stop)) break;
        seen = atomic_load_explicit(&ctx->generation, memory_order_acquire);
        run_tasks(ctx, wa.id);
        if (atomic_fetch_add_explicit(&ctx->n_idle_done, 1, memory_order_acq_rel) + 1 == ctx->n_threads - 1) {
            pthread_mutex_lock(&ctx->mu);
            if (ctx->caller_sleeping) pthread_cond_signal(&ctx->done);
            pthread_mutex_unlock(&ctx->mu);
        }
    }
    return NULL;
}

void dhsa_parallel_for(dhsa_ctx *ctx, int64_t n_tasks, dhsa_task_fn fn, void *arg) {
    if (n_tasks <= 0) return;
    if (ctx->n_threads == 1 || n_tasks == 1) {
        for (int64_t t = 0; t < n_tasks; t++) fn(arg, t, 0);
        return;
    }
    /* the job's fields and the workers' counts serve one job at a time;
     * every worker has finished the previous job (the wait below), so none
     * reads them while they change */
    pthread_mutex_lock(&ctx->call_mu);
    pthread_mutex_lock(&ctx->mu);
    ctx->fn = fn;
    ctx->arg = arg;
    ctx->n_tasks = n_tasks;
    atomic_store(&ctx->next_task, 0);
    atomic_store(&ctx->n_idle_done, 0);
    atomic_fetch_add_explicit(&ctx->generation, 1, memory_order_release);
    if (ctx->n_sleeping) pthread_cond_broadcast(&ctx->wake);
    pthread_mutex_unlock(&ctx->mu);

    run_tasks(ctx, 0);

    const int others = ctx->n_threads - 1;
    for (int spin = 0; spin < SPIN_ROUNDS; spin++) {
        if (atomic_load_explicit(&ctx->n_idle_done, memory_order_acquire) == others) break;
        cpu_pause();
    }
    if (atomic_load_explicit(&ctx->n_idle_done, memory_order_acquire) != others) {
        pthread_mutex_lock(&ctx->mu);
        ctx->caller_sleeping = 1;
        while (atomic_load(&ctx->n_idle_done) != others) pthread_cond_wait(&ctx->done, &ctx->mu);
        ctx->caller_sleeping = 0;
        pthread_mutex_unlock(&ctx->mu);
    }
    pthread_mutex_unlock(&ctx->call_mu);
}

void dhsa__ctx_lock(dhsa_ctx *ctx) { pthread_mutex_lock(&ctx->call_mu); }
void dhsa__ctx_unlock(dhsa_ctx *ctx) { pthread_mutex_unlock(&ctx->call_mu); }

/* ----------------------------------------------------------- lifecycle --- */

dhsa_ctx_params dhsa_ctx_default_params(void) {
    dhsa_ctx_params p = {0, 0};
    return p;
}

static int online_cpus(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

dhsa_status dhsa_ctx_create(const dhsa_ctx_params *p, dhsa_ctx **out) {
    if (!out) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_ctx_create: out is NULL");
    *out = NULL;
    dhsa_ctx_params d = p ? *p : dhsa_ctx_default_params();
    if (d.n_threads < 0 || d.n_threads > 1024)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "n_threads = %d: use 0 (all online CPUs) or 1..1024",
                          d.n_threads);
    dhsa_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "dhsa_ctx_create: out of memory");
    ctx->n_threads = d.n_threads ? d.n_threads : online_cpus();
    ctx->st.budget = d.mem_budget;
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&ctx->call_mu, &ma);
    pthread_mutexattr_destroy(&ma);
    pthread_mutex_init(&ctx->mu, NULL);
    pthread_mutex_init(&ctx->mem_mu, NULL);
    pthread_cond_init(&ctx->wake, NULL);
    pthread_cond_init(&ctx->done, NULL);
    atomic_init(&ctx->next_task, 0);
    atomic_init(&ctx->generation, 0);
    atomic_init(&ctx->n_idle_done, 0);
    atomic_init(&ctx->stop, 0);
    if (ctx->n_threads > 1) {
        ctx->workers = calloc((size_t)ctx->n_threads - 1, sizeof(pthread_t));
        if (!ctx->workers) {
            dhsa_ctx_free(ctx);
            return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "dhsa_ctx_create: out of memory");
        }
        for (int i = 1; i < ctx->n_threads; i++) {
            worker_arg *wa = malloc(sizeof *wa);
            if (wa) {
                wa->ctx = ctx;
                wa->id = i;
            }
            if (!wa || pthread_create(&ctx->workers[i - 1], NULL, worker_main, wa) != 0) {
                free(wa);
                ctx->n_threads = i; /* only i-1 workers exist: free joins those */
                dhsa_ctx_free(ctx);
                return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "could not start worker thread %d", i);
            }
        }
    }
    *out = ctx;
    return DHSA_OK;
}

void dhsa_ctx_free(dhsa_ctx *ctx) {
    if (!ctx) return;
    if (ctx->workers) {
        pthread_mutex_lock(&ctx->mu);
        atomic_store(&ctx->stop, 1);
        pthread_cond_broadcast(&ctx->wake);
        pthread_mutex_unlock(&ctx->mu);
        for (int i = 1; i < ctx->n_threads; i++) pthread_join(ctx->workers[i - 1], NULL);
        free(ctx->workers);
    }
    if (ctx->scratch) free((char *)ctx->scratch - HDR);
    pthread_mutex_destroy(&ctx->call_mu);
    pthread_mutex_destroy(&ctx->mu);
    pthread_mutex_destroy(&ctx->mem_mu);
    pthread_cond_destroy(&ctx->wake);
    pthread_cond_destroy(&ctx->done);
    free(ctx);
}

int dhsa_ctx_n_threads(const dhsa_ctx *ctx) { return ctx->n_threads; }

/* -------------------------------------------------------------- memory --- */

dhsa_mem_stats dhsa_ctx_mem_stats(const dhsa_ctx *ctx) {
    dhsa_ctx *c = (dhsa_ctx *)ctx;
    pthread_mutex_lock(&c->mem_mu);
    dhsa_mem_stats s = c->st;
    pthread_mutex_unlock(&c->mem_mu);
    return s;
}

void dhsa_ctx_reset_peak(dhsa_ctx *ctx) {
    pthread_mutex_lock(&ctx->mem_mu);
    ctx->st.peak = ctx->st.in_use;
    pthread_mutex_unlock(&ctx->mem_mu);
}

dhsa_status dhsa_ctx_set_budget(dhsa_ctx *ctx, size_t bytes) {
    pthread_mutex_lock(&ctx->mem_mu);
    size_t in_use = ctx->st.in_use;
    if (bytes && in_use > bytes) {
        pthread_mutex_unlock(&ctx->mem_mu);
        return dhsa__fail(DHSA_ERR_MEMORY_BUDGET,
                          "cannot set a budget of %zu bytes: the ctx already holds %zu", bytes, in_use);
    }
    ctx->st.budget = bytes;
    pthread_mutex_unlock(&ctx->mem_mu);
    return DHSA_OK;
}

/* Reserves `add` new bytes (after `sub` are given back) against the
 * budget; caller holds mem_mu. Statistics other than in_use change only in
 * commit(), once the allocation succeeded. */
static dhsa_status reserve(dhsa_ctx *ctx, size_t add, size_t sub) {
    size_t base = ctx->st.in_use - sub;
    if (add > SIZE_MAX - base || (ctx->st.budget && base + add > ctx->st.budget))
        return dhsa__fail(DHSA_ERR_MEMORY_BUDGET,
                          "memory budget exceeded: %zu bytes needed, %zu in use, budget %zu", add, base,
                          ctx->st.budget);
    ctx->st.in_use = base + add;
    return DHSA_OK;
}

static void commit(dhsa_ctx *ctx, size_t add) {
    if (ctx->st.in_use > ctx->st.peak) ctx->st.peak = ctx->st.in_use;
    if (add > ctx->st.largest) ctx->st.largest = add;
    ctx->st.n_allocs++;
}

static void *raw_alloc(size_t bytes) {
    if (bytes > SIZE_MAX - 2 * HDR) return NULL;
    void *p = NULL;
    if (posix_memalign(&p, DHSA_ALIGN, HDR + bytes) != 0) return NULL;
    *(size_t *)p = bytes;
    return (char *)p + HDR;
}

void *dhsa_ctx_alloc(dhsa_ctx *ctx, size_t bytes) {
    dhsa_status st;
    return dhsa__alloc(ctx, bytes, &st);
}

void *dhsa__alloc(dhsa_ctx *ctx, size_t bytes, dhsa_status *status) {
    if (!ctx) {
        *status = dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_ctx_alloc: ctx is NULL");
        return NULL;
    }
    pthread_mutex_lock(&ctx->mem_mu);
    dhsa_status st = reserve(ctx, bytes, 0);
    pthread_mutex_unlock(&ctx->mem_mu);
    *status = st;
    if (st != DHSA_OK) return NULL;
    void *p = raw_alloc(bytes);
    pthread_mutex_lock(&ctx->mem_mu);
    if (p)
        commit(ctx, bytes);
    else
        ctx->st.in_use -= bytes;
    pthread_mutex_unlock(&ctx->mem_mu);
    if (!p) *status = dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory allocating %zu bytes", bytes);
    return p;
}

void dhsa_ctx_release(dhsa_ctx *ctx, void *ptr) {
    if (!ctx || !ptr) return;
    char *base = (char *)ptr - HDR;
    size_t bytes = *(size_t *)base;
    pthread_mutex_lock(&ctx->mem_mu);
    ctx->st.in_use -= bytes;
    pthread_mutex_unlock(&ctx->mem_mu);
    free(base);
}

dhsa_status dhsa__scratch_check(const dhsa_ctx *ctx, size_t bytes) {
    dhsa_ctx *c = (dhsa_ctx *)ctx;
    dhsa_status st = DHSA_OK;
    pthread_mutex_lock(&c->mem_mu);
    if (bytes > c->scratch_cap) {
        size_t after = c->st.in_use - c->scratch_cap + bytes;
        if (c->st.budget && after > c->st.budget)
            st = dhsa__fail(DHSA_ERR_MEMORY_BUDGET,
                            "memory budget exceeded: the call needs %zu bytes of workspace, "
                            "%zu are in use outside it, budget %zu",
                            bytes, c->st.in_use - c->scratch_cap, c->st.budget);
    }
    pthread_mutex_unlock(&c->mem_mu);
    return st;
}

void *dhsa__scratch(dhsa_ctx *ctx, size_t bytes, dhsa_status *st) {
    *st = DHSA_OK;
    if (bytes <= ctx->scratch_cap) return ctx->scratch;
    pthread_mutex_lock(&ctx->mem_mu);
    /* The old buffer is dropped first so the budget sees only the new one. */
    *st = reserve(ctx, bytes, ctx->scratch_cap);
    if (*st == DHSA_OK) {
        if (ctx->scratch) free((char *)ctx->scratch - HDR);
        ctx->scratch = raw_alloc(bytes);
        if (ctx->scratch) {
            ctx->scratch_cap = bytes;
            commit(ctx, bytes);
        } else {
            ctx->st.in_use -= bytes;
            ctx->scratch_cap = 0;
            *st = dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory allocating %zu bytes of workspace",
                             bytes);
        }
    }
    pthread_mutex_unlock(&ctx->mem_mu);
    return *st == DHSA_OK ? ctx->scratch : NULL;
}

void dhsa_ctx_trim(dhsa_ctx *ctx) {
    if (!ctx) return;
    /* not while a call on another thread works in the scratch */
    pthread_mutex_lock(&ctx->call_mu);
    pthread_mutex_lock(&ctx->mem_mu);
    if (ctx->scratch) {
        free((char *)ctx->scratch - HDR);
        ctx->st.in_use -= ctx->scratch_cap;
        ctx->scratch = NULL;
        ctx->scratch_cap = 0;
    }
    pthread_mutex_unlock(&ctx->mem_mu);
    pthread_mutex_unlock(&ctx->call_mu);
}
