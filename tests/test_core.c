/* test_core.c: tests of the core API of dhsa (include/dhsa.h): status names
 * and the thread-local last error, the context (threads, tracked allocator,
 * statistics, budget), dhsa_parallel_for, F16/BF16 conversions, tensor views,
 * ISA selection and the /proc memory probes.
 *
 * Every expectation comes from the header's contract; the conversions are
 * checked against an independent decoder/rounding written here (ldexp/rint
 * in double), not against the library's own bit tricks.
 *
 * Run: make build/tests/test_core && build/tests/test_core
 * (or `make test`). Ends with "test_core: P passed, F failed".
 */
#include "dhsa.h"
#include "t.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)

/* Under AddressSanitizer (make asan) an impossible allocation aborts by
 * default; the 1 PiB test below needs malloc to return NULL instead. */
#if defined(__SANITIZE_ADDRESS__)
#define TEST_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_UNDER_ASAN 1
#endif
#endif
#ifdef TEST_UNDER_ASAN
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }
#endif

/* ------------------------------------------------------------------------ */
/* Process memory probes. Runs first, while the process is small, so that the
 * peak (VmHWM) is close to the current RSS and a 64 MiB touch must move it. */

static void test_proc_rss(void) {
    /* VmHWM >= VmRSS holds within one read of /proc; across two reads the RSS
     * may grow in between (the first fopen touches pages), so read the RSS
     * first, after a warm-up read. */
    (void)dhsa_proc_rss();
    size_t rss0 = dhsa_proc_rss();
    size_t peak0 = dhsa_proc_peak_rss();
    T_CHECK(peak0 > 0, "dhsa_proc_peak_rss() = 0 on Linux");
    T_CHECK(rss0 > 0, "dhsa_proc_rss() = 0 on Linux");
    T_CHECK(peak0 >= rss0, "peak RSS %zu below current RSS %zu", peak0, rss0);

    /* 64 MiB, every page written (malloc'd pages count only once touched). */
    size_t n = 64 * MIB;
    volatile unsigned char *buf = malloc(n);
    T_CHECK(buf != NULL, "malloc(64 MiB) failed");
    if (!buf) return;
    for (size_t i = 0; i < n; i += 4096) buf[i] = (unsigned char)(i >> 12);
    size_t rss1 = dhsa_proc_rss();
    size_t peak1 = dhsa_proc_peak_rss();
    T_CHECK(peak1 >= peak0 + 60 * MIB,
            "peak RSS grew by %zu bytes after touching 64 MiB (want >= 60 MiB; %zu -> %zu)",
            peak1 - peak0, peak0, peak1);
    T_CHECK(rss1 >= rss0 + 60 * MIB, "RSS grew by only %zu bytes after touching 64 MiB",
            rss1 > rss0 ? rss1 - rss0 : 0);
    free((void *)buf); /* glibc serves 64 MiB by mmap: free returns it to the kernel */

    dhsa_status st = dhsa_proc_reset_peak_rss();
    if (st != DHSA_OK) {
        T_SKIP(1, "dhsa_proc_reset_peak_rss: %s (%s); this kernel may forbid clear_refs",
               dhsa_status_str(st), dhsa_last_error());
        T_CHECK(dhsa_last_error()[0] != '\0', "reset_peak_rss failed without a sentence");
        return;
    }
    /* "Resets VmHWM to the current RSS": the peak now sits at the RSS. */
    size_t peak2 = dhsa_proc_peak_rss(), rss2 = dhsa_proc_rss();
    T_CHECK(peak2 > 0 && peak2 <= rss2 + 8 * MIB,
            "after reset the peak RSS is %zu, far above the current RSS %zu", peak2, rss2);
    if (rss2 + 32 * MIB <= peak1)
        T_CHECK(peak2 + 32 * MIB <= peak1,
                "after free + reset the peak RSS is %zu, was %zu (want it lowered by >= 32 MiB)",
                peak2, peak1);
    else /* e.g. under ASan, whose quarantine keeps freed memory resident */
        T_SKIP(1, "the allocator kept the freed 64 MiB resident (RSS %zu): lowering not checked", rss2);
}

/* ------------------------------------------------------------------------ */
/* Status names and the last error */

static void test_status_names(void) {
    static const struct { dhsa_status s; const char *name; } codes[] = {
        {DHSA_OK, "DHSA_OK"},
        {DHSA_ERR_INVALID_ARG, "DHSA_ERR_INVALID_ARG"},
        {DHSA_ERR_SHAPE, "DHSA_ERR_SHAPE"},
        {DHSA_ERR_OUT_OF_MEMORY, "DHSA_ERR_OUT_OF_MEMORY"},
        {DHSA_ERR_MEMORY_BUDGET, "DHSA_ERR_MEMORY_BUDGET"},
        {DHSA_ERR_UNSUPPORTED, "DHSA_ERR_UNSUPPORTED"},
        {DHSA_ERR_TOO_LARGE, "DHSA_ERR_TOO_LARGE"},
        {DHSA_ERR_IO, "DHSA_ERR_IO"},
        {DHSA_ERR_FORMAT, "DHSA_ERR_FORMAT"},
        {DHSA_ERR_NONFINITE, "DHSA_ERR_NONFINITE"},
        {DHSA_ERR_INTERNAL, "DHSA_ERR_INTERNAL"},
        {DHSA_ERR_BUSY, "DHSA_ERR_BUSY"},
    };
    enum { N = sizeof codes / sizeof codes[0] };
    for (int i = 0; i < N; i++) {
        const char *s = dhsa_status_str(codes[i].s);
        T_CHECK(s != NULL && s[0] != '\0', "dhsa_status_str(%d) is NULL or empty", (int)codes[i].s);
        if (!s) continue;
        /* The header: "Name of a status ("DHSA_ERR_SHAPE")". */
        T_CHECK(strcmp(s, codes[i].name) == 0, "dhsa_status_str(%d) = \"%s\", want \"%s\"",
                (int)codes[i].s, s, codes[i].name);
        for (int j = 0; j < i; j++) {
            const char *t = dhsa_status_str(codes[j].s);
            T_CHECK(t && strcmp(s, t) != 0, "codes %d and %d share the name \"%s\"",
                    (int)codes[i].s, (int)codes[j].s, s);
        }
    }
    const char *unknown = dhsa_status_str((dhsa_status)-99);
    T_CHECK(unknown != NULL && unknown[0] != '\0', "dhsa_status_str(-99) is NULL or empty");
    unknown = dhsa_status_str((dhsa_status)7);
    T_CHECK(unknown != NULL, "dhsa_status_str(7) is NULL");
}

typedef struct {
    dhsa_ctx *ctx;           /* a ctx with in_use > 0, for a failing set_budget */
    char initial[256];       /* the thread's last error before any call */
    char after[256];         /* its last error after its own failing call */
    dhsa_status st;
} tl_arg;

static void *tl_thread(void *p) {
    tl_arg *a = p;
    snprintf(a->initial, sizeof a->initial, "%s", dhsa_last_error());
    a->st = dhsa_ctx_set_budget(a->ctx, 1); /* in_use > 1: must fail */
    snprintf(a->after, sizeof a->after, "%s", dhsa_last_error());
    return NULL;
}

static void test_last_error_thread_local(void) {
    dhsa_ctx_params p = dhsa_ctx_default_params();
    p.n_threads = -5;
    dhsa_ctx *bad = NULL;
    dhsa_status st = dhsa_ctx_create(&p, &bad);
    T_CHECK(st != DHSA_OK, "ctx_create(n_threads=-5) succeeded");
    char mine[256];
    snprintf(mine, sizeof mine, "%s", dhsa_last_error());
    T_CHECK(mine[0] != '\0', "no last error after ctx_create(n_threads=-5)");

    dhsa_ctx_params p1 = dhsa_ctx_default_params();
    p1.n_threads = 1;
    dhsa_ctx *ctx = NULL;
    st = dhsa_ctx_create(&p1, &ctx);
    T_CHECK(st == DHSA_OK && ctx, "ctx_create(n_threads=1): %s", dhsa_status_str(st));
    if (!ctx) return;
    void *blk = dhsa_ctx_alloc(ctx, 4096);
    T_CHECK(blk != NULL, "ctx_alloc(4096) on an unlimited ctx failed");

    tl_arg a;
    memset(&a, 0, sizeof a);
    a.ctx = ctx;
    pthread_t th;
    int rc = pthread_create(&th, NULL, tl_thread, &a);
    T_CHECK(rc == 0, "pthread_create failed");
    if (rc == 0) {
        pthread_join(th, NULL);
        T_CHECK(a.initial[0] == '\0', "a new thread sees last error \"%s\" (set on another thread)",
                a.initial);
        T_CHECK(a.st == DHSA_ERR_MEMORY_BUDGET,
                "set_budget(1) below in_use returned %s, want DHSA_ERR_MEMORY_BUDGET",
                dhsa_status_str(a.st));
        T_CHECK(a.after[0] != '\0', "no sentence after a failing set_budget on a thread");
        T_CHECK(strcmp(a.after, mine) != 0,
                "two different failures on two threads gave the same sentence \"%s\"", mine);
        T_CHECK(strcmp(dhsa_last_error(), mine) == 0,
                "the main thread's last error changed from \"%s\" to \"%s\" by another thread",
                mine, dhsa_last_error());
    }
    dhsa_ctx_release(ctx, blk);
    dhsa_ctx_free(ctx);
}

/* ------------------------------------------------------------------------ */
/* Context creation */

static void test_ctx_create(void) {
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    dhsa_ctx_params p = dhsa_ctx_default_params();
    T_CHECK(p.n_threads == 0 && p.mem_budget == 0,
            "default params n_threads=%d mem_budget=%zu (want 0, 0)", p.n_threads, p.mem_budget);
    dhsa_ctx *ctx = NULL;
    dhsa_status st = dhsa_ctx_create(&p, &ctx);
    T_CHECK(st == DHSA_OK && ctx != NULL, "ctx_create(defaults): %s %s", dhsa_status_str(st),
            dhsa_last_error());
    if (ctx) {
        T_CHECK(dhsa_ctx_n_threads(ctx) == (int)online,
                "n_threads=0 gave %d threads, online CPUs = %ld", dhsa_ctx_n_threads(ctx), online);
        dhsa_mem_stats s = dhsa_ctx_mem_stats(ctx);
        T_CHECK(s.budget == 0, "default ctx has budget %zu, want 0 (unlimited)", s.budget);
        dhsa_ctx_free(ctx);
    }

    p.n_threads = 3;
    ctx = NULL;
    st = dhsa_ctx_create(&p, &ctx);
    T_CHECK(st == DHSA_OK && ctx != NULL, "ctx_create(n_threads=3): %s", dhsa_status_str(st));
    if (ctx) {
        T_CHECK(dhsa_ctx_n_threads(ctx) == 3, "n_threads=3 gave %d", dhsa_ctx_n_threads(ctx));
        dhsa_ctx_free(ctx);
    }

    p.n_threads = -1;
    ctx = (dhsa_ctx *)&p; /* a non-NULL value that must be overwritten */
    st = dhsa_ctx_create(&p, &ctx);
    T_CHECK(st == DHSA_ERR_INVALID_ARG, "ctx_create(n_threads=-1) returned %s, want INVALID_ARG",
            dhsa_status_str(st));
    T_CHECK(ctx == NULL, "ctx_create failed but *out is not NULL");
    T_CHECK(dhsa_last_error()[0] != '\0', "ctx_create(n_threads=-1) set no sentence");

    p.n_threads = 2;
    p.mem_budget = 4096;
    ctx = NULL;
    st = dhsa_ctx_create(&p, &ctx);
    T_CHECK(st == DHSA_OK && ctx, "ctx_create(budget 4096): %s", dhsa_status_str(st));
    if (ctx) {
        T_CHECK(dhsa_ctx_mem_stats(ctx).budget == 4096, "budget %zu, want 4096",
                dhsa_ctx_mem_stats(ctx).budget);
        void *big = dhsa_ctx_alloc(ctx, 8192);
        T_CHECK(big == NULL, "ctx_alloc(8192) under a 4096-byte budget succeeded");
        if (big) dhsa_ctx_release(ctx, big);
        dhsa_ctx_free(ctx);
    }
    dhsa_ctx_free(NULL); /* allowed by the header */
}

/* ------------------------------------------------------------------------ */
/* Tracked allocator. The header counts "bytes currently allocated through
 * the ctx" for dhsa_ctx_alloc(ctx, bytes): the requested bytes, which is also
 * what makes the exact workspace queries and budgets meaningful. So these
 * checks are exact, relative to the stats of the fresh ctx. */

static void test_ctx_alloc(void) {
    dhsa_ctx_params p = dhsa_ctx_default_params();
    p.n_threads = 2;
    dhsa_ctx *ctx = NULL;
    if (dhsa_ctx_create(&p, &ctx) != DHSA_OK || !ctx) {
        T_CHECK(0, "ctx_create failed: %s", dhsa_last_error());
        return;
    }
    dhsa_mem_stats s0 = dhsa_ctx_mem_stats(ctx), s;
    T_CHECK(s0.in_use == s0.peak, "fresh ctx: in_use %zu != peak %zu", s0.in_use, s0.peak);

    unsigned char *a = dhsa_ctx_alloc(ctx, 100);
    T_CHECK(a != NULL, "ctx_alloc(100) failed: %s", dhsa_last_error());
    s = dhsa_ctx_mem_stats(ctx);
    T_CHECK(s.in_use == s0.in_use + 100, "in_use %zu after alloc(100), want %zu", s.in_use,
            s0.in_use + 100);
    T_CHECK(s.peak == s0.in_use + 100, "peak %zu, want %zu", s.peak, s0.in_use + 100);
    T_CHECK(s.n_allocs == s0.n_allocs + 1, "n_allocs %llu, want %llu",
            (unsigned long long)s.n_allocs, (unsigned long long)s0.n_allocs + 1);
    T_CHECK(s.largest == (s0.largest > 100 ? s0.largest : 100), "largest %zu after alloc(100)",
            s.largest);

    unsigned char *b = dhsa_ctx_alloc(ctx, 1000);
    unsigned char *c = dhsa_ctx_alloc(ctx, 37);
    T_CHECK(b && c, "ctx_alloc(1000)/(37) failed");
    s = dhsa_ctx_mem_stats(ctx);
    T_CHECK(s.in_use == s0.in_use + 1137, "in_use %zu, want %zu", s.in_use, s0.in_use + 1137);
    T_CHECK(s.peak == s0.in_use + 1137, "peak %zu, want %zu", s.peak, s0.in_use + 1137);
    T_CHECK(s.largest == (s0.largest > 1000 ? s0.largest : 1000), "largest %zu, want 1000",
            s.largest);
    T_CHECK(s.n_allocs == s0.n_allocs + 3, "n_allocs %llu, want +3",
            (unsigned long long)s.n_allocs);
    unsigned char *ptrs[3] = {a, b, c};
    for (int i = 0; i < 3; i++)
        T_CHECK(((uintptr_t)ptrs[i] & 63) == 0, "ctx_alloc returned %p, not 64-byte aligned",
                (void *)ptrs[i]);
    /* The blocks are usable and disjoint. */
    if (a && b && c) {
        memset(a, 1, 100);
        memset(b, 2, 1000);
        memset(c, 3, 37);
        int ok = 1;
        for (int i = 0; i < 100; i++) ok &= a[i] == 1;
        for (int i = 0; i < 1000; i++) ok &= b[i] == 2;
        for (int i = 0; i < 37; i++) ok &= c[i] == 3;
        T_CHECK(ok, "ctx_alloc blocks overlap");
    }

    dhsa_ctx_release(ctx, a);
    s = dhsa_ctx_mem_stats(ctx);
    T_CHECK(s.in_use == s0.in_use + 1037, "in_use %zu after release(100), want %zu", s.in_use,
            s0.in_use + 1037);
    T_CHECK(s.peak == s0.in_use + 1137, "peak %zu after release, want %zu (unchanged)", s.peak,
            s0.in_use + 1137);
    T_CHECK(s.n_allocs == s0.n_allocs + 3, "release changed n_allocs");
    dhsa_ctx_reset_peak(ctx);
    s = dhsa_ctx_mem_stats(ctx);
    T_CHECK(s.peak == s.in_use, "after reset_peak peak %zu != in_use %zu", s.peak, s.in_use);

    /* Budget: in_use = base + 1037. */
    size_t base = s0.in_use;
    dhsa_status st = dhsa_ctx_set_budget(ctx, base + 1500);
    T_CHECK(st == DHSA_OK, "set_budget(in_use + 463) failed: %s", dhsa_status_str(st));
    T_CHECK(dhsa_ctx_mem_stats(ctx).budget == base + 1500, "budget not recorded");
    void *over = dhsa_ctx_alloc(ctx, 464);
    T_CHECK(over == NULL, "ctx_alloc one byte over the budget succeeded");
    T_CHECK(dhsa_last_error()[0] != '\0', "refused allocation set no sentence");
    s = dhsa_ctx_mem_stats(ctx);
    T_CHECK(s.in_use == base + 1037 && s.n_allocs == s0.n_allocs + 3,
            "a refused allocation changed the stats (in_use %zu, n_allocs %llu)", s.in_use,
            (unsigned long long)s.n_allocs);
    if (over) dhsa_ctx_release(ctx, over);
    void *exact = dhsa_ctx_alloc(ctx, 463); /* reaches the budget exactly */
    T_CHECK(exact != NULL, "ctx_alloc up to exactly the budget failed: %s", dhsa_last_error());
    T_CHECK(dhsa_ctx_mem_stats(ctx).in_use == base + 1500, "in_use %zu, want %zu",
            dhsa_ctx_mem_stats(ctx).in_use, base + 1500);

    st = dhsa_ctx_set_budget(ctx, base + 1000);
    T_CHECK(st == DHSA_ERR_MEMORY_BUDGET, "set_budget below in_use returned %s",
            dhsa_status_str(st));
    T_CHECK(dhsa_last_error()[0] != '\0', "set_budget below in_use set no sentence");
    T_CHECK(dhsa_ctx_mem_stats(ctx).budget == base + 1500,
            "a refused set_budget changed the budget to %zu", dhsa_ctx_mem_stats(ctx).budget);
    st = dhsa_ctx_set_budget(ctx, 0);
    T_CHECK(st == DHSA_OK && dhsa_ctx_mem_stats(ctx).budget == 0, "set_budget(0) failed");
    void *big = dhsa_ctx_alloc(ctx, 4 * MIB);
    T_CHECK(big != NULL, "ctx_alloc(4 MiB) with no budget failed");
    dhsa_ctx_release(ctx, big);

    /* trim gives back only the kernels' scratch arena, never caller blocks */
    size_t before = dhsa_ctx_mem_stats(ctx).in_use;
    dhsa_ctx_trim(ctx);
    T_CHECK(dhsa_ctx_mem_stats(ctx).in_use == before, "trim changed in_use from %zu to %zu",
            before, dhsa_ctx_mem_stats(ctx).in_use);
    if (b) memset(b, 4, 1000); /* still ours */

    /* A request the system cannot meet (1 PiB) fails with a sentence and
     * leaves the statistics as they were: nothing was allocated. */
    s0 = dhsa_ctx_mem_stats(ctx);
    void *pib = dhsa_ctx_alloc(ctx, (size_t)1 << 50);
    T_CHECK(pib == NULL, "ctx_alloc(1 PiB) succeeded");
    if (pib) dhsa_ctx_release(ctx, pib);
    T_CHECK(dhsa_last_error()[0] != '\0', "failed 1 PiB allocation set no sentence");
    s = dhsa_ctx_mem_stats(ctx);
    T_CHECK(s.in_use == s0.in_use && s.n_allocs == s0.n_allocs && s.peak == s0.peak &&
                s.largest == s0.largest,
            "a failed 1 PiB allocation changed the stats: in_use %zu -> %zu, peak %zu -> %zu, "
            "largest %zu -> %zu, n_allocs %llu -> %llu",
            s0.in_use, s.in_use, s0.peak, s.peak, s0.largest, s.largest,
            (unsigned long long)s0.n_allocs, (unsigned long long)s.n_allocs);

    /* Absurd sizes must fail cleanly, not wrap around while rounding. */
    s0 = dhsa_ctx_mem_stats(ctx);
    void *huge = dhsa_ctx_alloc(ctx, SIZE_MAX);
    T_CHECK(huge == NULL, "ctx_alloc(SIZE_MAX) returned non-NULL");
    huge = dhsa_ctx_alloc(ctx, SIZE_MAX - 30);
    T_CHECK(huge == NULL, "ctx_alloc(SIZE_MAX - 30) returned non-NULL");
    T_CHECK(dhsa_last_error()[0] != '\0', "failed huge allocation set no sentence");
    s = dhsa_ctx_mem_stats(ctx);
    T_CHECK(s.in_use == s0.in_use && s.n_allocs == s0.n_allocs && s.peak == s0.peak &&
                s.largest == s0.largest,
            "failed huge allocations changed the stats: in_use %zu -> %zu, peak %zu -> %zu, "
            "largest %zu -> %zu, n_allocs %llu -> %llu",
            s0.in_use, s.in_use, s0.peak, s.peak, s0.largest, s.largest,
            (unsigned long long)s0.n_allocs, (unsigned long long)s.n_allocs);

    dhsa_ctx_release(ctx, b);
    dhsa_ctx_release(ctx, c);
    dhsa_ctx_release(ctx, exact);
    s = dhsa_ctx_mem_stats(ctx);
    T_CHECK(s.in_use == base, "in_use %zu after releasing everything, want %zu", s.in_use, base);
    dhsa_ctx_free(ctx);
}

/* ------------------------------------------------------------------------ */
/* dhsa_parallel_for */

enum { PF_MAX_TASKS = 1000, PF_MAX_THREADS = 64 };

typedef struct {
    atomic_int runs[PF_MAX_TASKS];
    atomic_llong last[PF_MAX_THREADS]; /* last task each thread ran */
    atomic_int bad_thread, out_of_order, calls;
    int n_threads;
} pf_state;

static void pf_task(void *arg, int64_t task, int thread) {
    pf_state *s = arg;
    atomic_fetch_add(&s->calls, 1);
    if (thread < 0 || thread >= s->n_threads || thread >= PF_MAX_THREADS) {
        atomic_fetch_add(&s->bad_thread, 1);
        return;
    }
    if (task >= 0 && task < PF_MAX_TASKS) atomic_fetch_add(&s->runs[task], 1);
    /* "tasks are handed out in increasing order": each thread sees them rising */
    long long prev = atomic_exchange(&s->last[thread], (long long)task);
    if (prev >= task) atomic_fetch_add(&s->out_of_order, 1);
    /* A little work so that threads overlap. */
    volatile double x = 0;
    for (int i = 0; i < (int)(task % 7) * 50; i++) x += i;
    (void)x;
}

static void test_parallel_for(void) {
    static pf_state s;
    for (int nt = 1; nt <= 4; nt++) {
        dhsa_ctx_params p = dhsa_ctx_default_params();
        p.n_threads = nt;
        dhsa_ctx *ctx = NULL;
        if (dhsa_ctx_create(&p, &ctx) != DHSA_OK || !ctx) {
            T_CHECK(0, "ctx_create(%d threads) failed", nt);
            continue;
        }
        static const int64_t ns[] = {0, 1, 1000};
        for (int k = 0; k < 3; k++) {
            int64_t n = ns[k];
            /* Repeat to shake out races in the pool's hand-off. */
            int reps = n == 1000 ? 20 : 200;
            int miss = 0, dup = 0, calls_wrong = 0, bad = 0, order = 0;
            for (int r = 0; r < reps; r++) {
                memset(&s, 0, sizeof s);
                s.n_threads = nt;
                for (int t = 0; t < PF_MAX_THREADS; t++) atomic_store(&s.last[t], -1);
                dhsa_parallel_for(ctx, n, pf_task, &s);
                for (int64_t i = 0; i < n; i++) {
                    int c = atomic_load(&s.runs[i]);
                    miss += c == 0;
                    dup += c > 1;
                }
                calls_wrong += atomic_load(&s.calls) != n;
                bad += atomic_load(&s.bad_thread);
                order += atomic_load(&s.out_of_order);
            }
            T_CHECK(miss == 0 && dup == 0 && calls_wrong == 0,
                    "parallel_for(threads=%d, n_tasks=%lld) x%d: %d tasks never ran, %d ran twice, "
                    "%d rounds with a wrong call count",
                    nt, (long long)n, reps, miss, dup, calls_wrong);
            T_CHECK(bad == 0, "parallel_for(threads=%d): %d calls with thread id out of [0,%d)",
                    nt, bad, nt);
            T_CHECK(order == 0,
                    "parallel_for(threads=%d, n_tasks=%lld): %d times a thread got a task not "
                    "above its previous one",
                    nt, (long long)n, order);
        }
        dhsa_ctx_free(ctx);
    }
}

/* ------------------------------------------------------------------------ */
/* F16 / BF16 conversions, checked against an independent decoder and an
 * independent round-to-nearest-even written with double arithmetic. */

static int is_nan_d(double x) { return x != x; }

/* IEEE binary16 -> double, by the definition. */
static double f16_decode(uint16_t h) {
    int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 0) v = ldexp((double)m, -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = ldexp((double)(m + 1024), e - 25);
    return sign ? -v : v;
}

static uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* The binary16 value nearest to x, ties to even (as a double), or +-inf when
 * x rounds beyond the largest finite half. rint() rounds to nearest even. */
static double f16_round_ref(double x) {
    double a = fabs(x);
    if (a == 0) return x;
    int e;
    frexp(a, &e); /* a in [2^(e-1), 2^e) */
    int exp2 = e - 1 < -14 ? -14 : e - 1; /* subnormals share the 2^-14 binade spacing */
    double ulp = ldexp(1.0, exp2 - 10);
    double r = rint(a / ulp) * ulp;
    if (r > 65504.0) r = INFINITY;
    return x < 0 ? -r : r;
}

/* The bfloat16 value nearest to the float x, ties to even, by the same
 * construction (bf16 has an 8-bit significand and float's exponent range). */
static double bf16_round_ref(float x) {
    double a = fabs((double)x);
    if (a == 0) return x;
    int e;
    frexp(a, &e);
    int exp2 = e - 1 < -126 ? -126 : e - 1;
    double ulp = ldexp(1.0, exp2 - 7);
    double r = rint(a / ulp) * ulp;
    if (r > ldexp(255.0 / 128.0, 127)) r = INFINITY; /* above the largest finite bf16 */
    return x < 0 ? -r : r;
}

static double bf16_decode(uint16_t h) { return bits_f32((uint32_t)h << 16); }

static void test_f16(void) {
    /* Every half: decode matches the definition, and encode(decode(h)) == h. */
    int bad_dec = 0, bad_rt = 0, bad_nan = 0;
    uint16_t first_bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        double ref = f16_decode((uint16_t)h);
        float f = dhsa_f16_to_f32((uint16_t)h);
        if (is_nan_d(ref)) {
            if (f == f) bad_nan++, first_bad = (uint16_t)h;
            uint16_t back = dhsa_f32_to_f16(f);
            if (!is_nan_d(f16_decode(back))) bad_nan++, first_bad = (uint16_t)h;
            continue;
        }
        if ((double)f != ref || (ref == 0 && !signbit(f) != !signbit(ref))) bad_dec++, first_bad = (uint16_t)h;
        if (dhsa_f32_to_f16(f) != h) bad_rt++, first_bad = (uint16_t)h;
    }
    T_CHECK(bad_dec == 0, "f16_to_f32 wrong for %d of 65536 halves (e.g. 0x%04x)", bad_dec, first_bad);
    T_CHECK(bad_rt == 0, "f32_to_f16(f16_to_f32(h)) != h for %d halves (e.g. 0x%04x)", bad_rt, first_bad);
    T_CHECK(bad_nan == 0, "NaN halves not kept NaN through f32 and back (%d, e.g. 0x%04x)", bad_nan,
            first_bad);

    /* Known encodings, ties to even, subnormals, overflow. */
    static const struct { float x; uint16_t h; const char *why; } kv[] = {
        {1.0f, 0x3C00, "1"},
        {-2.0f, 0xC000, "-2"},
        {65504.0f, 0x7BFF, "largest finite"},
        {65519.0f, 0x7BFF, "just below the overflow tie"},
        {65520.0f, 0x7C00, "overflow tie rounds to even = inf"},
        {1e6f, 0x7C00, "overflow"},
        {-1e6f, 0xFC00, "negative overflow"},
        {0x1p-14f, 0x0400, "smallest normal"},
        {0x1p-24f, 0x0001, "smallest subnormal"},
        {0x3FFp-24f, 0x03FF, "largest subnormal"},
        {0x1p-25f, 0x0000, "half the smallest subnormal: tie to even 0"},
        {0x1.000002p-25f, 0x0001, "just above that tie"},
        {0x3p-25f, 0x0002, "tie between subnormals 1 and 2 -> 2"},
        {0x5p-25f, 0x0002, "tie between subnormals 2 and 3 -> 2"},
        {1.0f + 0x1p-11f, 0x3C00, "tie between 1 and 1+2^-10 -> 1"},
        {1.0f + 0x3p-11f, 0x3C02, "tie between 0x3C01 and 0x3C02 -> 0x3C02"},
        {1.0f + 0x1p-11f + 0x1p-20f, 0x3C01, "just above a tie"},
        {1e-10f, 0x0000, "underflow to +0"},
        {-1e-10f, 0x8000, "underflow to -0"},
        {-0.0f, 0x8000, "-0"},
        {0.0f, 0x0000, "+0"},
    };
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++) {
        uint16_t h = dhsa_f32_to_f16(kv[i].x);
        T_CHECK(h == kv[i].h, "f32_to_f16(%a) = 0x%04x, want 0x%04x (%s)", (double)kv[i].x, h,
                kv[i].h, kv[i].why);
    }
    T_CHECK(dhsa_f32_to_f16(INFINITY) == 0x7C00 && dhsa_f32_to_f16(-INFINITY) == 0xFC00,
            "f32_to_f16(+-inf) not +-inf");
    T_CHECK(is_nan_d(f16_decode(dhsa_f32_to_f16(NAN))), "f32_to_f16(NaN) is not a NaN");
    T_CHECK(is_nan_d(f16_decode(dhsa_f32_to_f16(bits_f32(0x7F800001u)))),
            "f32_to_f16(signalling NaN 0x7F800001) is not a NaN");
    T_CHECK(is_nan_d(f16_decode(dhsa_f32_to_f16(bits_f32(0xFFC00000u)))),
            "f32_to_f16(-NaN) is not a NaN");

    /* A sweep over float bit patterns against the double-arithmetic rounding;
     * the stride is odd so every exponent and many low-bit patterns occur. */
    int bad = 0;
    float first = 0;
    for (uint64_t u = 0; u < 0x100000000ull; u += 4093) {
        float x = bits_f32((uint32_t)u);
        if (x != x) continue;
        double want = isinf(x) ? (double)x : f16_round_ref(x);
        double got = f16_decode(dhsa_f32_to_f16(x));
        if (!(got == want) || (want == 0 && !signbit(got) != !signbit(want))) {
            if (!bad) first = x;
            bad++;
        }
    }
    T_CHECK(bad == 0, "f32_to_f16 disagrees with round-to-nearest-even for %d sampled floats "
            "(first %a)", bad, (double)first);
    /* Exactly at every tie between neighbouring halves in [1, 2) and in the
     * subnormals: halfway points are exact floats. */
    bad = 0;
    for (int m = 0; m < 1023; m++) {
        float tie = (float)ldexp(2 * (1024 + m) + 1, -11); /* between 0x3C00+m and +m+1 */
        uint16_t want = (uint16_t)(0x3C00 + m + (m & 1));  /* the even neighbour */
        if (dhsa_f32_to_f16(tie) != want) bad++;
        float stie = (float)ldexp(2 * m + 1, -25); /* between subnormals m and m+1 */
        uint16_t swant = (uint16_t)(m + (m & 1));
        if (dhsa_f32_to_f16(stie) != swant) bad++;
    }
    T_CHECK(bad == 0, "f32_to_f16 misrounds %d exact ties (want ties to even)", bad);
}

static void test_bf16(void) {
    int bad_dec = 0, bad_rt = 0, bad_nan = 0;
    uint16_t first_bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        double ref = bf16_decode((uint16_t)h);
        float f = dhsa_bf16_to_f32((uint16_t)h);
        if (is_nan_d(ref)) {
            if (f == f) bad_nan++, first_bad = (uint16_t)h;
            if (!is_nan_d(bf16_decode(dhsa_f32_to_bf16(f)))) bad_nan++, first_bad = (uint16_t)h;
            continue;
        }
        if (f32_bits(f) != (uint32_t)h << 16) bad_dec++, first_bad = (uint16_t)h;
        if (dhsa_f32_to_bf16(f) != h) bad_rt++, first_bad = (uint16_t)h;
    }
    T_CHECK(bad_dec == 0, "bf16_to_f32 wrong for %d of 65536 values (e.g. 0x%04x)", bad_dec, first_bad);
    T_CHECK(bad_rt == 0, "f32_to_bf16(bf16_to_f32(h)) != h for %d values (e.g. 0x%04x)", bad_rt,
            first_bad);
    T_CHECK(bad_nan == 0, "bf16 NaNs not kept NaN (%d, e.g. 0x%04x)", bad_nan, first_bad);

    static const struct { uint32_t x; uint16_t h; const char *why; } kv[] = {
        {0x3F800000u, 0x3F80, "1"},
        {0x3F808000u, 0x3F80, "tie between 0x3F80 and 0x3F81 -> even 0x3F80"},
        {0x3F818000u, 0x3F82, "tie between 0x3F81 and 0x3F82 -> even 0x3F82"},
        {0x3F808001u, 0x3F81, "just above a tie"},
        {0x3F807FFFu, 0x3F80, "just below a tie"},
        {0x7F7FFFFFu, 0x7F80, "FLT_MAX rounds up to inf"},
        {0x7F7F7FFFu, 0x7F7F, "below the overflow tie"},
        {0x00000001u, 0x0000, "smallest float subnormal -> +0"},
        {0x00008000u, 0x0000, "subnormal tie -> even 0"},
        {0x00018000u, 0x0002, "subnormal tie -> even 2"},
        {0x80000000u, 0x8000, "-0"},
        {0x7F800000u, 0x7F80, "inf"},
        {0xFF800000u, 0xFF80, "-inf"},
    };
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++) {
        uint16_t h = dhsa_f32_to_bf16(bits_f32(kv[i].x));
        T_CHECK(h == kv[i].h, "f32_to_bf16(0x%08x) = 0x%04x, want 0x%04x (%s)", kv[i].x, h,
                kv[i].h, kv[i].why);
    }
    /* NaNs whose rounding carry would reach the exponent or the sign. */
    static const uint32_t nans[] = {0x7F800001u, 0x7FFFFFFFu, 0xFFFFFFFFu, 0x7FC00000u, 0xFF800001u};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++)
        T_CHECK(is_nan_d(bf16_decode(dhsa_f32_to_bf16(bits_f32(nans[i])))),
                "f32_to_bf16(NaN 0x%08x) = 0x%04x, not a NaN", nans[i],
                dhsa_f32_to_bf16(bits_f32(nans[i])));

    int bad = 0;
    float first = 0;
    for (uint64_t u = 0; u < 0x100000000ull; u += 4093) {
        float x = bits_f32((uint32_t)u);
        if (x != x) continue;
        double want = isinf(x) ? (double)x : bf16_round_ref(x);
        double got = bf16_decode(dhsa_f32_to_bf16(x));
        if (!(got == want) || (want == 0 && !signbit(got) != !signbit(want))) {
            if (!bad) first = x;
            bad++;
        }
    }
    T_CHECK(bad == 0, "f32_to_bf16 disagrees with round-to-nearest-even for %d sampled floats "
            "(first %a)", bad, (double)first);
}

/* ------------------------------------------------------------------------ */
/* Tensor views and types */

static void test_tensors(void) {
    float buf[1];
    dhsa_tensor t = dhsa_tensor_blhd(buf, DHSA_F16, 2, 5, 3, 4); /* [B=2, L=5, H=3, D=4] */
    T_CHECK(t.data == buf && t.type == DHSA_F16, "blhd: data/type not kept");
    T_CHECK(t.shape[0] == 2 && t.shape[1] == 3 && t.shape[2] == 5 && t.shape[3] == 4,
            "blhd shape {%lld,%lld,%lld,%lld}, want logical {2,3,5,4}", (long long)t.shape[0],
            (long long)t.shape[1], (long long)t.shape[2], (long long)t.shape[3]);
    /* element (b,h,l,d) of a [B,L,H,D] buffer sits at ((b*L + l)*H + h)*D + d */
    T_CHECK(t.stride[0] == 60 && t.stride[1] == 4 && t.stride[2] == 12 && t.stride[3] == 1,
            "blhd strides {%lld,%lld,%lld,%lld}, want {60,4,12,1}", (long long)t.stride[0],
            (long long)t.stride[1], (long long)t.stride[2], (long long)t.stride[3]);

    t = dhsa_tensor_bhld(buf, DHSA_BF16, 2, 3, 5, 4);
    T_CHECK(t.data == buf && t.type == DHSA_BF16, "bhld: data/type not kept");
    T_CHECK(t.shape[0] == 2 && t.shape[1] == 3 && t.shape[2] == 5 && t.shape[3] == 4,
            "bhld shape wrong");
    T_CHECK(t.stride[0] == 60 && t.stride[1] == 20 && t.stride[2] == 4 && t.stride[3] == 1,
            "bhld strides {%lld,%lld,%lld,%lld}, want {60,20,4,1}", (long long)t.stride[0],
            (long long)t.stride[1], (long long)t.stride[2], (long long)t.stride[3]);

    /* 64-bit sizes: 128K tokens x 32 heads x 128 dims overflows 32 bits. */
    t = dhsa_tensor_blhd(buf, DHSA_F32, 2, 131072, 32, 128);
    T_CHECK(t.stride[0] == (int64_t)131072 * 32 * 128 && t.stride[2] == 32 * 128,
            "blhd strides overflow at 128K x 32 x 128");

    T_CHECK(dhsa_type_size(DHSA_F32) == 4 && dhsa_type_size(DHSA_F16) == 2 &&
                dhsa_type_size(DHSA_BF16) == 2,
            "type sizes %zu %zu %zu", dhsa_type_size(DHSA_F32), dhsa_type_size(DHSA_F16),
            dhsa_type_size(DHSA_BF16));
    const char *n0 = dhsa_type_name(DHSA_F32), *n1 = dhsa_type_name(DHSA_F16),
               *n2 = dhsa_type_name(DHSA_BF16);
    T_CHECK(n0 && n1 && n2 && n0[0] && n1[0] && n2[0] && strcmp(n0, n1) && strcmp(n1, n2) &&
                strcmp(n0, n2),
            "type names empty or not distinct");
}

/* ------------------------------------------------------------------------ */
/* ISA selection */

static void test_isa(void) {
    dhsa_isa orig = dhsa_active_isa();
    T_CHECK(orig == DHSA_ISA_SCALAR || orig == DHSA_ISA_AVX2 || orig == DHSA_ISA_AVX512,
            "active ISA %d out of range", (int)orig);
    const char *names[3];
    for (int i = 0; i < 3; i++) {
        names[i] = dhsa_isa_name((dhsa_isa)i);
        T_CHECK(names[i] && names[i][0], "dhsa_isa_name(%d) empty", i);
    }
    T_CHECK(names[0] && names[1] && names[2] && strcmp(names[0], names[1]) &&
                strcmp(names[1], names[2]) && strcmp(names[0], names[2]),
            "ISA names not distinct");
    T_CHECK(dhsa_set_isa(DHSA_ISA_SCALAR) == DHSA_OK, "set_isa(SCALAR) failed");
    T_CHECK(dhsa_active_isa() == DHSA_ISA_SCALAR, "set_isa(SCALAR) did not take");
    for (int i = 1; i < 3; i++) {
        dhsa_status st = dhsa_set_isa((dhsa_isa)i);
        if (st == DHSA_ERR_UNSUPPORTED) {
            T_SKIP(1, "ISA %s unsupported here", names[i] ? names[i] : "?");
            T_CHECK(dhsa_active_isa() == DHSA_ISA_SCALAR, "a refused set_isa changed the ISA");
            continue;
        }
        T_CHECK(st == DHSA_OK, "set_isa(%d) returned %s", i, dhsa_status_str(st));
        T_CHECK(dhsa_active_isa() == (dhsa_isa)i, "set_isa(%d) did not take", i);
        dhsa_set_isa(DHSA_ISA_SCALAR);
    }
    T_CHECK(dhsa_set_isa((dhsa_isa)9) != DHSA_OK, "set_isa(9) succeeded");
    T_CHECK(dhsa_set_isa(orig) == DHSA_OK && dhsa_active_isa() == orig, "could not restore ISA");
}

/* dhsa_buffer_alloc: alignment by size class, usable memory, NULL free. */
static void test_buffers(void) {
    size_t sizes[] = {1, 100, 4096, ((size_t)2 << 20) - 1, (size_t)2 << 20, (size_t)3 << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        unsigned char *p = dhsa_buffer_alloc(sizes[i]);
        T_CHECK(p != NULL, "dhsa_buffer_alloc(%zu) failed: %s", sizes[i], dhsa_last_error());
        if (!p) continue;
        size_t want = sizes[i] >= ((size_t)2 << 20) ? ((size_t)2 << 20) : 64;
        T_CHECK((uintptr_t)p % want == 0, "buffer of %zu bytes at %p is not %zu-aligned", sizes[i],
                (void *)p, want);
        memset(p, 0xa5, sizes[i]);
        T_CHECK(p[0] == 0xa5 && p[sizes[i] - 1] == 0xa5, "buffer of %zu bytes not writable", sizes[i]);
        dhsa_buffer_free(p);
    }
    dhsa_buffer_free(NULL);
    T_CHECK(dhsa_buffer_alloc(SIZE_MAX - 10) == NULL, "an impossible buffer was granted");
    T_CHECK(dhsa_last_error()[0] != '\0', "a refused buffer left no error sentence");
}

int main(void) {
    test_proc_rss(); /* first: needs a small process */
    test_buffers();
    test_status_names();
    test_last_error_thread_local();
    test_ctx_create();
    test_ctx_alloc();
    test_parallel_for();
    test_f16();
    test_bf16();
    test_tensors();
    test_isa();
    return t_report("test_core");
}
