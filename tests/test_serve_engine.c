/* test_serve_engine.c: the engine of `dhsa serve` (tools/serve/engine.h)
 * driven without a socket, on the default model (models/dhsa-retrieval-8m.gguf,
 * or $DHSA_MODEL), then on ../shared/models/stories260K.gguf when present.
 *
 * - Isolation: four requests (greedy; seeded with temperature, top-k,
 *   presence and frequency penalties; a stop string; two sharing the
 *   prompt cache) run alone one after another, then all at once from four
 *   threads, twice: every answer (text, finish reason, token count) equals
 *   its alone answer, with the decode steps batched (4 slots, one ctx) and
 *   with each slot on its own ctx (--batch off, 3 slots). A request never
 *   sees another's state.
 * - Cancel: a generation cancelled after 3 pieces of text ends at once as
 *   gone (the error callback says "cancelled", no finish), short of its
 *   max_gen; its slot is free after, and the next request's answer is its
 *   alone answer.
 * - Queue: with 1 slot and max_queue 1, a second request waits, a third is
 *   refused at once (SERVE_QUEUE_FULL) and the waiting one gets the slot
 *   when the first is freed; with queue_timeout 0.2 s a waiting one leaves
 *   with SERVE_QUEUE_TIMEOUT; serve_engine_stop sends a waiting one away
 *   with SERVE_STOPPING.
 *
 * Run: make build/tests/test_serve_engine && build/tests/test_serve_engine
 * (from the repository root). Ends with "test_serve_engine: P passed, F failed, S skipped".
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dhsa.h"
#include "engine.h"
#include "t.h"

#define N_REQ 4
#define MAX_GEN 24

/* ---------------------------------------------------------- helpers --- */

typedef struct {
    char text[8192];
    int64_t len;
    const char *finish;
    int error, pieces, cancel_after;
    char message[512];
    serve_gen *g;
    serve_gen_info info;
    serve_status st;
} sink;

static void cb_text(void *u, const char *b, int64_t n) {
    sink *s = u;
    if (s->len + n < (int64_t)sizeof s->text) {
        memcpy(s->text + s->len, b, (size_t)n);
        s->len += n;
        s->text[s->len] = 0;
    }
    s->pieces++;
    if (s->cancel_after && s->pieces >= s->cancel_after) serve_gen_cancel(s->g);
}

static void cb_finish(void *u, const char *reason) { ((sink *)u)->finish = reason; }

static void cb_error(void *u, const char *message) {
    sink *s = u;
    s->error = 1;
    snprintf(s->message, sizeof s->message, "%s", message);
}

static const serve_gen_callbacks cbs = {cb_text, cb_finish, cb_error, NULL};

typedef struct {
    const char *prompt, *stop;
    float temperature;
    int64_t top_k;
    double presence, frequency;
    uint64_t seed;
    int64_t max_gen;
} req_spec;

static const req_spec REQS[N_REQ] = {
    {"Once upon a time", NULL, 0.0f, 0, 0, 0, 1, MAX_GEN},
    {"Once upon a time there was a little", NULL, 0.9f, 40, 0.5, 0, 7, MAX_GEN},
    {"The cat sat on the", " the", 0.8f, 0, 0, 0.4, 3, MAX_GEN},
    {"Once upon a time", NULL, 1.0f, 0, 0, 0.3, 11, MAX_GEN + 8},
};

typedef struct {
    dhsa_model *m;
    int32_t ids[N_REQ][256];
    int64_t n_ids[N_REQ];
} world;

static void params_of(const world *w, int i, serve_gen_params *p) {
    const req_spec *r = &REQS[i];
    memset(p, 0, sizeof *p);
    p->prompt = w->ids[i];
    p->n_prompt = w->n_ids[i];
    p->max_gen = r->max_gen;
    p->sampler = dhsa_sampler_default_params();
    p->sampler.temperature = r->temperature;
    p->sampler.top_k = r->top_k;
    p->sampler.seed = r->seed;
    p->presence_penalty = r->presence;
    p->frequency_penalty = r->frequency;
    p->ignore_eos = 1; /* every answer runs to max_gen or a stop string: long enough to overlap */
    const int32_t eos = dhsa_tokenizer_eos(dhsa_model_tokenizer(w->m));
    if (eos >= 0) p->stop_ids[p->n_stop_ids++] = eos;
    if (r->stop) {
        p->stop[0] = r->stop;
        p->stop_len[0] = (int64_t)strlen(r->stop);
        p->n_stop = 1;
    }
    p->attn = SERVE_ENGINE_ATTN_UNSET;
    p->wake_on_text = 1;
}

/* Submits p and runs it to its end. */
static void run(serve_engine *e, const serve_gen_params *p, sink *s) {
    int cancel_after = s->cancel_after;
    memset(s, 0, sizeof *s);
    s->cancel_after = cancel_after;
    char msg[512];
    s->st = serve_engine_submit(e, p, &cbs, s, &s->g, msg, sizeof msg);
    if (s->st != SERVE_OK) {
        snprintf(s->message, sizeof s->message, "%s", msg);
        return;
    }
    while (serve_gen_next(s->g)) {
    }
    serve_gen_get_info(s->g, &s->info);
    serve_gen_free(s->g);
    s->g = NULL;
}

static serve_engine *make_engine(dhsa_model *m, int64_t n_slots, int batch, int64_t max_queue, double queue_timeout) {
    serve_engine_params ep;
    memset(&ep, 0, sizeof ep);
    ep.n_slots = n_slots;
    ep.batch = batch;
    ep.n_threads = 1;
    ep.sp = dhsa_session_default_params();
    ep.sp.n_ctx = 256;
    ep.max_queue = max_queue;
    ep.queue_timeout_s = queue_timeout;
    serve_engine *e = NULL;
    char msg[512];
    dhsa_mem_plan pl;
    if (serve_engine_create(m, &ep, &e, msg, sizeof msg)) {
        fprintf(stderr, "engine: %s\n", msg);
        return NULL;
    }
    if (serve_engine_plan(e, &pl)) {
        fprintf(stderr, "plan: %s\n", dhsa_last_error());
        serve_engine_free(e);
        return NULL;
    }
    dhsa_session_params sp = ep.sp;
    sp.n_ctx = pl.n_ctx;
    sp.n_ubatch = pl.n_ubatch;
    if (serve_engine_open(e, &sp, msg, sizeof msg) || serve_engine_start(e, msg, sizeof msg)) {
        fprintf(stderr, "engine: %s\n", msg);
        serve_engine_free(e);
        return NULL;
    }
    return e;
}

typedef struct {
    serve_engine *e;
    const world *w;
    int i;
    pthread_barrier_t *bar;
    sink s;
} job;

static void *job_main(void *arg) {
    job *j = arg;
    serve_gen_params p;
    params_of(j->w, j->i, &p);
    pthread_barrier_wait(j->bar);
    run(j->e, &p, &j->s);
    return NULL;
}

static int same_answer(const sink *a, const sink *b) {
    return a->st == SERVE_OK && b->st == SERVE_OK && a->len == b->len && memcmp(a->text, b->text, (size_t)a->len) == 0 &&
           a->finish && b->finish && strcmp(a->finish, b->finish) == 0 && a->info.n_gen == b->info.n_gen && !a->error &&
           !b->error;
}

/* ------------------------------------------------------------ parts --- */

/* Each request alone, then all at once (twice): 1 + 2 * N_REQ checks. */
static void test_isolation(const world *w, int64_t n_slots, int batch, const char *what) {
    serve_engine *e = make_engine(w->m, n_slots, batch, 16, 30);
    T_CHECK(e != NULL, "%s: engine", what);
    if (!e) {
        T_SKIP(2 * N_REQ, "%s: no engine", what);
        return;
    }
    static sink alone[N_REQ];
    int ok = 1;
    for (int i = 0; i < N_REQ; i++) {
        serve_gen_params p;
        params_of(w, i, &p);
        alone[i].cancel_after = 0;
        run(e, &p, &alone[i]);
        ok &= alone[i].st == SERVE_OK && alone[i].finish && alone[i].info.n_gen > 0;
    }
    if (!ok) fprintf(stderr, "%s: a request alone failed\n", what);
    for (int round = 0; round < 2; round++) {
        pthread_barrier_t bar;
        pthread_barrier_init(&bar, NULL, N_REQ);
        static job jobs[N_REQ];
        pthread_t th[N_REQ];
        for (int i = 0; i < N_REQ; i++) {
            memset(&jobs[i], 0, sizeof jobs[i]);
            jobs[i].e = e;
            jobs[i].w = w;
            jobs[i].i = i;
            jobs[i].bar = &bar;
            pthread_create(&th[i], NULL, job_main, &jobs[i]);
        }
        for (int i = 0; i < N_REQ; i++) pthread_join(th[i], NULL);
        pthread_barrier_destroy(&bar);
        for (int i = 0; i < N_REQ; i++)
            T_CHECK(ok && same_answer(&jobs[i].s, &alone[i]),
                    "%s, round %d, request %d: together (status %d, %lld ids, %s) \"%.80s\" vs alone (%lld ids, %s) "
                    "\"%.80s\"%s%s", what, round, i, (int)jobs[i].s.st, (long long)jobs[i].s.info.n_gen,
                    jobs[i].s.finish ? jobs[i].s.finish : "-", jobs[i].s.text, (long long)alone[i].info.n_gen,
                    alone[i].finish ? alone[i].finish : "-", alone[i].text, jobs[i].s.error ? ": " : "",
                    jobs[i].s.message);
    }
    serve_engine_stats st;
    serve_engine_get_stats(e, &st);
    if (batch) fprintf(stderr, "test_serve_engine: %s: %llu batched passes, %llu rows (mean batch %.2f)\n", what,
                       (unsigned long long)st.n_batches, (unsigned long long)st.n_batch_rows,
                       st.n_batches ? (double)st.n_batch_rows / (double)st.n_batches : 0.0);
    serve_engine_free(e);
}

/* Cancel after 3 pieces: 6 checks. */
static void test_cancel(const world *w, int batch, const char *what) {
    serve_engine *e = make_engine(w->m, 2, batch, 4, 30);
    if (!e) {
        T_SKIP(6, "%s: no engine", what);
        return;
    }
    sink ref, s, after;
    serve_gen_params p;
    params_of(w, 0, &p);
    ref.cancel_after = 0;
    run(e, &p, &ref); /* the next request's alone answer */
    serve_gen_params pc;
    params_of(w, 1, &pc);
    pc.max_gen = 200;
    s.cancel_after = 3;
    run(e, &pc, &s);
    T_CHECK(s.st == SERVE_OK && s.info.gone && s.error && strcmp(s.message, "cancelled") == 0 && !s.finish,
            "%s: cancelled: status %d, gone %d, error %d \"%s\", finish %s", what, (int)s.st, s.info.gone, s.error,
            s.message, s.finish ? s.finish : "-");
    T_CHECK(s.info.n_gen >= 3 && s.info.n_gen < 200, "%s: cancelled after 3 pieces: %lld ids generated of 200", what,
            (long long)s.info.n_gen);
    T_CHECK(s.pieces == 3, "%s: %d pieces of text reached the caller after the cancel at 3", what, s.pieces);
    serve_engine_stats st;
    serve_engine_get_stats(e, &st);
    T_CHECK(st.n_busy == 0 && st.n_queued == 0, "%s: after the cancel: %lld busy, %lld queued", what,
            (long long)st.n_busy, (long long)st.n_queued);
    after.cancel_after = 0;
    run(e, &p, &after);
    T_CHECK(same_answer(&after, &ref), "%s: after a cancel: \"%.80s\" vs alone \"%.80s\"", what, after.text, ref.text);
    /* cancelled before its first step: submit still answers, next ends at once */
    char msg[256];
    serve_gen *g = NULL;
    sink z;
    memset(&z, 0, sizeof z);
    serve_status ss = serve_engine_submit(e, &pc, &cbs, &z, &g, msg, sizeof msg);
    int steps = 0;
    if (ss == SERVE_OK) {
        z.g = g;
        serve_gen_cancel(g);
        while (serve_gen_next(g)) steps++;
        serve_gen_get_info(g, &z.info);
        serve_gen_free(g);
    }
    /* with batching the batcher thread runs steps on its own from submit
     * on, and a loaded machine can hold this thread back between submit
     * and the cancel for several of them (5 were seen): there the cancel
     * must only end the generation well before max_gen (the exact "at the
     * next token" is the cancel-after-3 check above, made from the
     * callback) */
    const int64_t most = batch ? pc.max_gen / 2 : 2;
    T_CHECK(ss == SERVE_OK && z.info.gone && z.info.n_gen <= most && steps <= (batch ? most : 2),
            "%s: cancelled at once: status %d, gone %d, %lld ids (at most %lld), %d steps", what, (int)ss,
            z.info.gone, (long long)z.info.n_gen, (long long)most, steps);
    serve_engine_free(e);
}

typedef struct {
    serve_engine *e;
    const world *w;
    sink s;
} waiter_job;

static void *waiter_main(void *arg) {
    waiter_job *j = arg;
    serve_gen_params p;
    params_of(j->w, 0, &p);
    run(j->e, &p, &j->s);
    return NULL;
}

static int wait_queued(serve_engine *e, int64_t n) {
    for (int k = 0; k < 2000; k++) {
        serve_engine_stats st;
        serve_engine_get_stats(e, &st);
        if (st.n_queued == n) return 1;
        usleep(1000);
    }
    return 0;
}

/* Queue full, queue timeout, stop: 7 checks. */
static void test_queue(const world *w) {
    serve_engine *e = make_engine(w->m, 1, 0, 1, 30);
    if (!e) {
        T_SKIP(7, "queue: no engine");
        return;
    }
    serve_gen_params p;
    params_of(w, 0, &p);
    char msg[256];
    sink a;
    memset(&a, 0, sizeof a);
    serve_gen *ga = NULL;
    serve_status sa = serve_engine_submit(e, &p, &cbs, &a, &ga, msg, sizeof msg); /* holds the only slot */
    static waiter_job b;
    memset(&b, 0, sizeof b);
    b.e = e;
    b.w = w;
    pthread_t tb;
    pthread_create(&tb, NULL, waiter_main, &b);
    int queued = wait_queued(e, 1);
    T_CHECK(sa == SERVE_OK && queued, "queue: the first holds the slot (status %d), the second waits (%d)", (int)sa,
            queued);
    serve_gen *gc = NULL;
    sink c;
    memset(&c, 0, sizeof c);
    serve_status sc = serve_engine_submit(e, &p, &cbs, &c, &gc, msg, sizeof msg);
    T_CHECK(sc == SERVE_QUEUE_FULL && gc == NULL, "queue: a third with max_queue 1: status %d (want %d, queue full)",
            (int)sc, (int)SERVE_QUEUE_FULL);
    if (gc) serve_gen_free(gc);
    while (ga && serve_gen_next(ga)) {
    }
    serve_gen_free(ga);
    pthread_join(tb, NULL);
    T_CHECK(b.s.st == SERVE_OK && b.s.finish && b.s.info.n_gen > 0,
            "queue: the waiting one got the slot and ran: status %d, %lld ids", (int)b.s.st, (long long)b.s.info.n_gen);
    /* stop: a waiting request leaves, the running one ends with an error */
    memset(&a, 0, sizeof a);
    ga = NULL;
    sa = serve_engine_submit(e, &p, &cbs, &a, &ga, msg, sizeof msg);
    static waiter_job d;
    memset(&d, 0, sizeof d);
    d.e = e;
    d.w = w;
    pthread_t td;
    pthread_create(&td, NULL, waiter_main, &d);
    queued = wait_queued(e, 1);
    serve_engine_stop(e);
    pthread_join(td, NULL);
    T_CHECK(sa == SERVE_OK && queued && d.s.st == SERVE_STOPPING, "stop: the waiting one: status %d (want %d)",
            (int)d.s.st, (int)SERVE_STOPPING);
    while (ga && serve_gen_next(ga)) {
    }
    T_CHECK(ga && a.error && strstr(a.message, "shutting down") && !a.finish, "stop: the running one: error %d \"%s\"",
            a.error, a.message);
    serve_gen_free(ga);
    serve_engine_free(e);

    e = make_engine(w->m, 1, 0, 4, 0.2);
    if (!e) {
        T_SKIP(2, "queue timeout: no engine");
        return;
    }
    ga = NULL;
    memset(&a, 0, sizeof a);
    memset(&c, 0, sizeof c);
    sa = serve_engine_submit(e, &p, &cbs, &a, &ga, msg, sizeof msg);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    sc = serve_engine_submit(e, &p, &cbs, &c, &gc, msg, sizeof msg);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double waited = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    T_CHECK(sa == SERVE_OK && sc == SERVE_QUEUE_TIMEOUT && gc == NULL && waited >= 0.19 && waited < 10,
            "queue timeout 0.2 s: status %d after %.3f s (want %d)", (int)sc, waited, (int)SERVE_QUEUE_TIMEOUT);
    serve_engine_stats st;
    serve_engine_get_stats(e, &st);
    T_CHECK(st.n_queued == 0 && st.n_busy == 1, "queue timeout: %lld queued, %lld busy after", (long long)st.n_queued,
            (long long)st.n_busy);
    serve_gen_free(ga);
    serve_engine_free(e);
}

static void run_model(const char *path, const char *name) {
    world *w = calloc(1, sizeof *w);
    dhsa_model_params mp = dhsa_model_default_params();
    if (!w || dhsa_model_load(path, &mp, &w->m)) {
        T_CHECK(0, "%s: %s", path, w ? dhsa_last_error() : "out of memory");
        free(w);
        return;
    }
    const dhsa_tokenizer *tok = dhsa_model_tokenizer(w->m);
    for (int i = 0; i < N_REQ; i++) {
        if (dhsa_tokenize(tok, REQS[i].prompt, (int64_t)strlen(REQS[i].prompt), dhsa_tokenizer_default_flags(tok),
                          w->ids[i], 256, &w->n_ids[i]))
            w->n_ids[i] = 0;
    }
    char what[128];
    snprintf(what, sizeof what, "%s, batched, 4 slots", name);
    test_isolation(w, 4, 1, what);
    snprintf(what, sizeof what, "%s, --batch off, 3 slots", name);
    test_isolation(w, 3, 0, what);
    snprintf(what, sizeof what, "%s, cancel, batched", name);
    test_cancel(w, 1, what);
    snprintf(what, sizeof what, "%s, cancel, --batch off", name);
    test_cancel(w, 0, what);
    test_queue(w);
    dhsa_model_free(w->m);
    free(w);
}

#define CHECKS_PER_MODEL (2 * (1 + 2 * N_REQ) + 2 * 6 + 7)

int main(void) {
    const char *env = getenv("DHSA_MODEL");
    const char *def = env && env[0] ? env : "models/dhsa-retrieval-8m.gguf";
    if (access(def, R_OK) == 0) run_model(def, "default model");
    else T_SKIP(CHECKS_PER_MODEL, "%s is absent (run from the repository root, or set DHSA_MODEL)", def);
    const char *small = "../shared/models/stories260K.gguf";
    if (access(small, R_OK) == 0) run_model(small, "stories260K");
    else T_SKIP(CHECKS_PER_MODEL, "%s is absent (the shared models)", small);
    return t_report("test_serve_engine");
}
