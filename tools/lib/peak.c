/* peak.c: measured fp32 FMA peak and memory read bandwidth (see peak.h for
 * the contract). The per-ISA loops live in peak_avx512.c / peak_avx2.c; the
 * scalar loops here are plain C float math and stand for what the scalar
 * kernels can reach. Timing, threads and the choice of loop are here.
 *
 * How a measurement runs: n_threads tasks on the ctx (one per thread) spin
 * on their loop in chunks of about a millisecond until a shared deadline;
 * the flops (or bytes) they did, divided by the wall time of the whole
 * parallel region, is one repetition; the best repetition wins.
 * Run: build/dhsa peak [--threads T]. Tested by tests/test_cli.c.
 */
#include "lib/peak.h"

#include "core/internal.h"

#include <math.h>
#include <time.h>

/* ------------------------------------------------------------ helpers --- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Keeps every loop's result observable. */
static volatile float peak_sink;

/* One per task, a cache line each so that threads never share a line. */
typedef struct {
    int64_t work; /* FMA loop iterations, or floats summed */
    float sink;
    char pad[64 - sizeof(int64_t) - sizeof(float)];
} peak_slot;

/* The ctx the measurement runs on: ctx itself when it has enough threads,
 * else a new one stored in *owned (free it after). NULL on failure. */
static dhsa_ctx *pick_ctx(dhsa_ctx *ctx, int *n_threads, dhsa_ctx **owned) {
    *owned = NULL;
    if (ctx && *n_threads <= 0) *n_threads = dhsa_ctx_n_threads(ctx);
    if (ctx && dhsa_ctx_n_threads(ctx) >= *n_threads) return ctx;
    dhsa_ctx_params p = dhsa_ctx_default_params();
    p.n_threads = *n_threads > 0 ? *n_threads : 0;
    if (dhsa_ctx_create(&p, owned) != DHSA_OK) return NULL;
    *n_threads = dhsa_ctx_n_threads(*owned);
    return *owned;
}

/* ---------------------------------------------------------------- FMA --- */

#define SCALAR_CHAINS 12
#define SCALAR_FLOPS_PER_ITER (SCALAR_CHAINS * 2)

/* Plain C: acc = acc * a + b on 12 independent chains held in registers
 * (named variables: an array would live in memory and time store
 * forwarding instead). Without -ffast-math and under -std=c11 the compiler
 * keeps a multiply and an add (2 flops) per step; it may still pack the
 * chains into SSE, as it would for the scalar kernels. */
static float fma_loop_scalar(int64_t n_iter, float a, float b) {
    float c00 = 1.00f, c01 = 1.01f, c02 = 1.02f, c03 = 1.03f, c04 = 1.04f, c05 = 1.05f;
    float c06 = 1.06f, c07 = 1.07f, c08 = 1.08f, c09 = 1.09f, c10 = 1.10f, c11 = 1.11f;
    for (int64_t it = 0; it < n_iter; it++) {
#define STEP(c) c = c * a + b
        STEP(c00); STEP(c01); STEP(c02); STEP(c03); STEP(c04); STEP(c05);
        STEP(c06); STEP(c07); STEP(c08); STEP(c09); STEP(c10); STEP(c11);
#undef STEP
    }
    return ((c00 + c01) + (c02 + c03)) + ((c04 + c05) + (c06 + c07)) + ((c08 + c09) + (c10 + c11));
}

typedef struct {
    dhsa_isa isa;
    int64_t chunk;   /* loop iterations between clock reads */
    double deadline; /* CLOCK_MONOTONIC seconds */
    float a, b;
    peak_slot *slots; /* [n_tasks] */
} fma_job;

static int64_t fma_flops_per_iter(dhsa_isa isa) {
    switch (isa) {
    case DHSA_ISA_AVX512: return DHSA_PEAK_AVX512_FLOPS_PER_ITER;
    case DHSA_ISA_AVX2: return DHSA_PEAK_AVX2_FLOPS_PER_ITER;
    default: return SCALAR_FLOPS_PER_ITER;
    }
}

static float fma_loop(dhsa_isa isa, int64_t n_iter, float a, float b) {
    switch (isa) {
    case DHSA_ISA_AVX512: return dhsa__peak_fma_loop_avx512(n_iter, a, b);
    case DHSA_ISA_AVX2: return dhsa__peak_fma_loop_avx2(n_iter, a, b);
    default: return fma_loop_scalar(n_iter, a, b);
    }
}

static void fma_task(void *arg, int64_t task, int thread) {
    (void)thread;
    fma_job *j = arg;
    int64_t iters = 0;
    float sink = 0.0f;
    do {
        sink += fma_loop(j->isa, j->chunk, j->a, j->b);
        iters += j->chunk;
    } while (now_s() < j->deadline);
    j->slots[task].work = iters;
    j->slots[task].sink = sink;
}

/* One timed repetition: GFLOP/s of the whole region. */
static double fma_rep(dhsa_ctx *ctx, fma_job *j, int n_tasks, double seconds) {
    double t0 = now_s();
    j->deadline = t0 + seconds;
    dhsa_parallel_for(ctx, n_tasks, fma_task, j);
    double t1 = now_s();
    int64_t iters = 0;
    float sink = 0.0f;
    for (int t = 0; t < n_tasks; t++) {
        iters += j->slots[t].work;
        sink += j->slots[t].sink;
    }
    peak_sink = sink;
    return (double)iters * (double)fma_flops_per_iter(j->isa) / (t1 - t0) * 1e-9;
}

double dhsa_peak_fma_gflops(dhsa_ctx *ctx, int n_threads, double seconds) {
    if (!(seconds > 0.0) || seconds > 3600.0) {
        dhsa__fail(DHSA_ERR_INVALID_ARG, "peak FMA: seconds = %g, use (0, 3600]", seconds);
        return 0.0;
    }
    dhsa_ctx *owned;
    dhsa_ctx *run = pick_ctx(ctx, &n_threads, &owned);
    if (!run) return 0.0;
    peak_slot *slots = dhsa_ctx_alloc(run, (size_t)n_threads * sizeof(peak_slot));
    if (!slots) {
        dhsa_ctx_free(owned);
        return 0.0;
    }
    /* a < 1 and b = 1 - a: every chain converges to 1 and stays a normal
     * number however long it runs. */
    fma_job j = {dhsa_active_isa(), 1, 0.0, 0.999999f, 1.0f - 0.999999f, slots};

    /* Chunk: about a millisecond of one thread's loop, so the clock is read
     * rarely and the deadline overshoots by little. */
    int64_t probe = 1024;
    double dt;
    for (;;) {
        double t0 = now_s();
        peak_sink = fma_loop(j.isa, probe, j.a, j.b);
        dt = now_s() - t0;
        if (dt > 2e-4 || probe > ((int64_t)1 << 40)) break;
        probe *= 4;
    }
    double per_iter = dt / (double)probe;
    double want = fmin(1e-3, seconds / 20.0);
    j.chunk = per_iter > 0.0 ? (int64_t)(want / per_iter) : probe;
    if (j.chunk < 1) j.chunk = 1;

    double rep_s = seconds / 3.0;
    fma_rep(run, &j, n_threads, fmin(rep_s, 0.05)); /* warm-up: clocks, pages, pool */
    double best = 0.0;
    for (int r = 0; r < 3; r++) best = fmax(best, fma_rep(run, &j, n_threads, rep_s));

    dhsa_ctx_release(run, slots);
    dhsa_ctx_free(owned);
    return best;
}

/* --------------------------------------------------------- read bandwidth --- */

static float sum_scalar(const float *p, size_t n) {
    float s[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) s[k] += p[i + k];
    float r = 0.0f;
    for (int k = 0; k < 8; k++) r += s[k];
    for (; i < n; i++) r += p[i];
    return r;
}

typedef struct {
    dhsa_isa isa;
    float *buf;     /* [n] */
    size_t n;
    size_t per;     /* floats per slice, a multiple of 16 (64 bytes) */
    int fill;       /* 1: write the slice (first touch), 0: sum it */
    peak_slot *slots;
} read_job;

static void read_task(void *arg, int64_t task, int thread) {
    (void)thread;
    read_job *j = arg;
    size_t lo = (size_t)task * j->per;
    size_t hi = lo + j->per < j->n ? lo + j->per : j->n;
    if (lo >= hi) return;
    float *p = j->buf + lo;
    size_t n = hi - lo;
    if (j->fill) {
        for (size_t i = 0; i < n; i++) p[i] = 1.0f;
        return;
    }
    float s;
    switch (j->isa) {
    case DHSA_ISA_AVX512: s = dhsa__peak_sum_avx512(p, n); break;
    case DHSA_ISA_AVX2: s = dhsa__peak_sum_avx2(p, n); break;
    default: s = sum_scalar(p, n); break;
    }
    j->slots[task].sink = s;
    j->slots[task].work = (int64_t)n;
}

double dhsa_peak_read_gbps(dhsa_ctx *ctx, int n_threads, size_t bytes, double seconds) {
    if (!(seconds > 0.0) || seconds > 3600.0) {
        dhsa__fail(DHSA_ERR_INVALID_ARG, "peak read: seconds = %g, use (0, 3600]", seconds);
        return 0.0;
    }
    if (bytes == 0) bytes = (size_t)1 << 30;
    dhsa_ctx *owned;
    dhsa_ctx *run = pick_ctx(ctx, &n_threads, &owned);
    if (!run) return 0.0;
    size_t n = bytes / sizeof(float);
    if (n < (size_t)n_threads * 16) n = (size_t)n_threads * 16;
    size_t per = (n + (size_t)n_threads - 1) / (size_t)n_threads;
    per = dhsa__align_up(per, 16);

    peak_slot *slots = dhsa_ctx_alloc(run, (size_t)n_threads * sizeof(peak_slot));
    float *buf = slots ? dhsa_ctx_alloc(run, n * sizeof(float)) : NULL;
    if (!buf) {
        dhsa_ctx_release(run, slots);
        dhsa_ctx_free(owned);
        return 0.0;
    }
    read_job j = {dhsa_active_isa(), buf, n, per, 1, slots};
    dhsa_parallel_for(run, n_threads, read_task, &j);
    j.fill = 0;

    /* The median pass, not the best: on a shared VM single passes burst
     * well above what a sustained stream gets (seen: 51 vs 32 GB/s). */
    double rate[100], start = now_s();
    int passes = 0;
    for (int pass = 0; pass < 100; pass++) {
        for (int t = 0; t < n_threads; t++) slots[t].work = 0;
        double t0 = now_s();
        dhsa_parallel_for(run, n_threads, read_task, &j);
        double t1 = now_s();
        float sink = 0.0f;
        int64_t floats = 0;
        for (int t = 0; t < n_threads; t++) {
            sink += slots[t].sink;
            floats += slots[t].work;
        }
        peak_sink = sink;
        rate[passes++] = (double)floats * sizeof(float) / (t1 - t0) * 1e-9;
        if (pass >= 4 && t1 - start >= seconds) break;
    }
    for (int a = 1; a < passes; a++) /* insertion sort: at most 100 values */
        for (int b = a; b > 0 && rate[b] < rate[b - 1]; b--) {
            double x = rate[b];
            rate[b] = rate[b - 1];
            rate[b - 1] = x;
        }
    double best = passes % 2 ? rate[passes / 2] : 0.5 * (rate[passes / 2 - 1] + rate[passes / 2]);

    dhsa_ctx_release(run, buf);
    dhsa_ctx_release(run, slots);
    dhsa_ctx_free(owned);
    return best;
}

/* ------------------------------------------------- existing buffers --- */

typedef struct {
    dhsa_isa isa;
    const float *const *bufs;
    const size_t *n;
    int count, parts;
    float *sinks; /* [parts] */
} bufs_job;

static void bufs_task(void *arg, int64_t task, int thread) {
    (void)thread;
    bufs_job *j = arg;
    float acc = 0.0f;
    for (int b = 0; b < j->count; b++) {
        size_t per = (j->n[b] + (size_t)j->parts - 1) / (size_t)j->parts;
        size_t lo = (size_t)task * per, hi = lo + per < j->n[b] ? lo + per : j->n[b];
        if (lo >= hi) continue;
        const float *p = j->bufs[b] + lo;
        switch (j->isa) {
        case DHSA_ISA_AVX512: acc += dhsa__peak_sum_avx512(p, hi - lo); break;
        case DHSA_ISA_AVX2: acc += dhsa__peak_sum_avx2(p, hi - lo); break;
        default: acc += sum_scalar(p, hi - lo); break;
        }
    }
    j->sinks[task] = acc;
}

double dhsa_peak_read_buffers_s(dhsa_ctx *ctx, int n_threads, const float *const *bufs,
                                const size_t *n_floats, int count) {
    dhsa_ctx *owned;
    dhsa_ctx *run = pick_ctx(ctx, &n_threads, &owned);
    if (!run) return -1.0;
    float sinks[1024];
    if (n_threads > 1024) n_threads = 1024;
    bufs_job j = {dhsa_active_isa(), bufs, n_floats, count, n_threads, sinks};
    double t0 = now_s();
    dhsa_parallel_for(run, n_threads, bufs_task, &j);
    double t = now_s() - t0;
    float s = 0.0f;
    for (int i = 0; i < n_threads; i++) s += sinks[i];
    peak_sink = s;
    dhsa_ctx_free(owned);
    return t;
}
