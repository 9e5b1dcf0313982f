/* test_threads.c: the threading rules of include/dhsa.h ("Threads").
 *
 *   - one ctx shared by 4 threads x 200 attention calls (tiled and
 *     reference, dense and with one layout shared read-only, shapes of
 *     different workspace sizes), with a 5th thread trimming the ctx's
 *     scratch and reading its statistics all along: every output equals,
 *     bit for bit, the same call made alone; at 1 and 2 ctx threads;
 *   - dhsa_parallel_for from 4 threads at once on one ctx: every job runs
 *     each of its own tasks exactly once;
 *   - the default model (models/dhsa-retrieval-8m.gguf): two sessions on one
 *     model from two threads (each on its own ctx, then both on one ctx),
 *     dense and DHSA: every step's logits equal the serial run's, bit for bit;
 *   - one session used from two threads: while an eval runs (held inside
 *     its layer hook), a second eval and a reset from another thread, and an
 *     eval from the hook itself, are refused with DHSA_ERR_BUSY and a
 *     sentence saying the session is in use; the held eval is unharmed and
 *     the session works after it;
 *   - one dhsa_kv_index appended to from two threads: each append succeeds
 *     whole or is refused with DHSA_ERR_BUSY, and the index holds exactly
 *     the keys of the appends that succeeded.
 *
 * Run: make build/tests/test_threads && build/tests/test_threads
 * (or `make test`). Ends with "test_threads: P passed, F failed".
 */
#include "dhsa.h"
#include "t.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MODEL "models/dhsa-retrieval-8m.gguf"
#define N_USERS 4
#define N_CALLS 200

/* splitmix64 */
static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float *random_floats(size_t n, uint64_t seed) {
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; x && i < n; i++) x[i] = (float)((double)(rng_next(&seed) >> 11) * 0x1p-53 * 2.0 - 1.0);
    return x;
}

/* ------------------------------------------------------------------------ */
/* Attention on one shared ctx */

typedef struct {
    dhsa_ctx *ctx;
    pthread_barrier_t *start;
    dhsa_attn_desc a;   /* q, k, v its own; o points at out */
    float *q, *k, *v, *out, *want;
    size_t n_out;
    int differ, failed; /* calls whose output differed / that failed */
    char err[256];      /* the first failure's sentence */
} attn_user;

static void *attn_user_main(void *p) {
    attn_user *u = p;
    pthread_barrier_wait(u->start);
    for (int c = 0; c < N_CALLS; c++) {
        memset(u->out, 0xff, u->n_out * sizeof(float)); /* NaN: an unwritten output shows */
        dhsa_status st = dhsa_attention(u->ctx, &u->a);
        if (st) {
            if (!u->failed++) snprintf(u->err, sizeof u->err, "%s: %s", dhsa_status_str(st), dhsa_last_error());
        } else if (memcmp(u->out, u->want, u->n_out * sizeof(float)) != 0) {
            u->differ++;
        }
    }
    return NULL;
}

typedef struct {
    dhsa_ctx *ctx;
    atomic_int *stop;
    int trims;
} trimmer;

/* Gives the scratch back and reads the statistics while the others run. */
static void *trimmer_main(void *p) {
    trimmer *t = p;
    while (!atomic_load(t->stop)) {
        dhsa_ctx_trim(t->ctx);
        (void)dhsa_ctx_mem_stats(t->ctx);
        t->trims++;
    }
    return NULL;
}

static void test_shared_ctx_attention(int n_threads) {
    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = n_threads;
    dhsa_ctx *ctx = NULL;
    T_CHECK(dhsa_ctx_create(&cp, &ctx) == DHSA_OK, "ctx (%d threads): %s", n_threads, dhsa_last_error());
    if (!ctx) return;
    const int64_t Hq = 4, Hkv = 2, d = 32;
    /* users 2 and 3 share a shape and one layout (read-only from both);
     * 3 runs it on the reference backend */
    const int64_t Lq[N_USERS] = {48, 80, 64, 64}, Lk[N_USERS] = {160, 288, 224, 224};
    dhsa_layout *lay = NULL;
    dhsa_status st = dhsa_layout_create(ctx, 1, Hkv, Lq[2], Lk[2], 16, 4, &lay);
    for (int64_t g = 0; !st && g < Hkv; g++)
        for (int64_t qb = 0; !st && qb < 4; qb++) {
            int64_t r[4] = {0, 16, 100 + 8 * g + qb, 224};
            st = dhsa_layout_set(lay, 0, g, qb, r, 2);
        }
    T_CHECK(st == DHSA_OK, "layout: %s", dhsa_last_error());
    attn_user us[N_USERS];
    memset(us, 0, sizeof us);
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, N_USERS + 1);
    int ok = st == DHSA_OK;
    for (int u = 0; u < N_USERS && ok; u++) {
        attn_user *x = &us[u];
        x->ctx = ctx;
        x->start = &start;
        x->n_out = (size_t)(Hq * Lq[u] * d);
        x->q = random_floats((size_t)(Hq * Lq[u] * d), 11 + (uint64_t)u);
        x->k = random_floats((size_t)(Hkv * Lk[u] * d), 21 + (uint64_t)u);
        x->v = random_floats((size_t)(Hkv * Lk[u] * d), 31 + (uint64_t)u);
        x->out = malloc(x->n_out * sizeof(float));
        x->want = malloc(x->n_out * sizeof(float));
        if (!x->q || !x->k || !x->v || !x->out || !x->want) {
            ok = 0;
            break;
        }
        dhsa_attn_desc a = dhsa_attn_default_desc();
        a.q = dhsa_tensor_bhld(x->q, DHSA_F32, 1, Hq, Lq[u], d);
        a.k = dhsa_tensor_bhld(x->k, DHSA_F32, 1, Hkv, Lk[u], d);
        a.v = dhsa_tensor_bhld(x->v, DHSA_F32, 1, Hkv, Lk[u], d);
        a.o = dhsa_tensor_bhld(x->want, DHSA_F32, 1, Hq, Lq[u], d);
        a.causal = u != 1;
        a.q_pos0 = a.causal ? Lk[u] - Lq[u] : 0;
        a.window = u == 0 ? 96 : 0;
        a.layout = u >= 2 ? lay : NULL;
        a.backend = u == 3 ? DHSA_BACKEND_REFERENCE : DHSA_BACKEND_TILED;
        st = dhsa_attention(ctx, &a); /* the serial result */
        T_CHECK(st == DHSA_OK, "user %d alone: %s", u, dhsa_last_error());
        a.o.data = x->out;
        x->a = a;
        ok = st == DHSA_OK;
    }
    if (ok) {
        pthread_t th[N_USERS], tt;
        atomic_int stop = 0;
        trimmer tr = {ctx, &stop, 0};
        pthread_create(&tt, NULL, trimmer_main, &tr);
        for (int u = 0; u < N_USERS; u++) pthread_create(&th[u], NULL, attn_user_main, &us[u]);
        pthread_barrier_wait(&start);
        for (int u = 0; u < N_USERS; u++) pthread_join(th[u], NULL);
        atomic_store(&stop, 1);
        pthread_join(tt, NULL);
        for (int u = 0; u < N_USERS; u++)
            T_CHECK(us[u].differ == 0 && us[u].failed == 0,
                    "ctx of %d thread(s) shared by %d threads: user %d (%s%s): %d of %d calls differ from the "
                    "serial result, %d failed (%s)",
                    n_threads, N_USERS, u, us[u].a.layout ? "layout, " : "",
                    us[u].a.backend == DHSA_BACKEND_REFERENCE ? "reference" : "tiled", us[u].differ, N_CALLS,
                    us[u].failed, us[u].err);
        T_CHECK(tr.trims > 0, "the trimming thread ran");
        dhsa_mem_stats ms = dhsa_ctx_mem_stats(ctx);
        size_t lb = 0;
        dhsa_layout_size(1, Hkv, Lq[2], Lk[2], 16, 4, &lb);
        dhsa_ctx_trim(ctx);
        ms = dhsa_ctx_mem_stats(ctx);
        T_CHECK(ms.in_use == lb, "after the threads and a trim the ctx holds %zu bytes: the layout's %zu",
                ms.in_use, lb);
    }
    for (int u = 0; u < N_USERS; u++) {
        free(us[u].q);
        free(us[u].k);
        free(us[u].v);
        free(us[u].out);
        free(us[u].want);
    }
    pthread_barrier_destroy(&start);
    dhsa_layout_free(lay);
    dhsa_ctx_free(ctx);
}

/* ------------------------------------------------------------------------ */
/* dhsa_parallel_for from several threads */

#define PF_TASKS 512
#define PF_ROUNDS 50

typedef struct {
    dhsa_ctx *ctx;
    pthread_barrier_t *start;
    int id;
    atomic_int seen[PF_TASKS];
    int wrong;          /* rounds where a task ran other than once */
    atomic_int foreign; /* tasks that ran with another job's argument */
} pf_user;

typedef struct {
    pf_user *u;
    int id;
} pf_job;

static void pf_task(void *arg, int64_t task, int thread) {
    (void)thread;
    pf_job *j = arg;
    if (j->id != j->u->id) atomic_fetch_add(&j->u->foreign, 1);
    atomic_fetch_add(&j->u->seen[task], 1);
}

static void *pf_user_main(void *p) {
    pf_user *u = p;
    pthread_barrier_wait(u->start);
    for (int r = 0; r < PF_ROUNDS; r++) {
        for (int t = 0; t < PF_TASKS; t++) atomic_store(&u->seen[t], 0);
        pf_job j = {u, u->id};
        dhsa_parallel_for(u->ctx, PF_TASKS, pf_task, &j);
        int bad = 0;
        for (int t = 0; t < PF_TASKS; t++) bad |= atomic_load(&u->seen[t]) != 1;
        u->wrong += bad;
    }
    return NULL;
}

static void test_shared_parallel_for(void) {
    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = 2;
    dhsa_ctx *ctx = NULL;
    if (dhsa_ctx_create(&cp, &ctx)) return;
    static pf_user us[N_USERS];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, N_USERS);
    pthread_t th[N_USERS];
    for (int u = 0; u < N_USERS; u++) {
        us[u].ctx = ctx;
        us[u].start = &start;
        us[u].id = u;
        pthread_create(&th[u], NULL, pf_user_main, &us[u]);
    }
    for (int u = 0; u < N_USERS; u++) pthread_join(th[u], NULL);
    for (int u = 0; u < N_USERS; u++)
        T_CHECK(us[u].wrong == 0 && atomic_load(&us[u].foreign) == 0,
                "dhsa_parallel_for from %d threads on one ctx: user %d: %d of %d rounds ran a task other than "
                "once, %d tasks ran with another job's argument",
                N_USERS, u, us[u].wrong, PF_ROUNDS, atomic_load(&us[u].foreign));
    pthread_barrier_destroy(&start);
    dhsa_ctx_free(ctx);
}

/* ------------------------------------------------------------------------ */
/* Sessions on the default model */

#define N_PROMPT 160
#define N_STEPS 12

/* The params of a method, routing really active on short prompts. */
static dhsa_session_params method_params(dhsa_attn_method m) {
    dhsa_session_params sp = dhsa_session_default_params();
    sp.kv_type = DHSA_F32; /* compared with F32 references (the default is F16) */
    sp.n_ctx = 256;
    sp.n_ubatch = 64;
    sp.attn = m;
    sp.router.dense_below = 0;
    sp.router.budget_tokens = 48;
    sp.router.sink_tokens = 4;
    sp.router.local_tokens = 16;
    sp.router.q_block = 16;
    sp.router.min_chunk = 8;
    sp.router.nms_window = 4;
    return sp;
}

/* ids of a deterministic prompt: the built-in filler sentences from `first`. */
static int64_t make_prompt(const dhsa_model *m, int first, int32_t *ids, int64_t n) {
    int64_t ns = 0;
    const char *const *sent = dhsa_task_builtin_sentences(&ns);
    char text[16384] = "";
    size_t len = 0;
    for (int64_t i = first; len + 512 < sizeof text && ns > 0; i++) {
        int w = snprintf(text + len, sizeof text - len, "%s ", sent[i % ns]);
        if (w < 0) break;
        len += (size_t)w;
    }
    const dhsa_tokenizer *tok = dhsa_model_tokenizer(m);
    int64_t got = 0;
    dhsa_status st = dhsa_tokenize(tok, text, (int64_t)len, dhsa_tokenizer_default_flags(tok), NULL, 0, &got);
    int32_t *all = malloc((size_t)got * sizeof(int32_t));
    if (!all || got < n) {
        free(all);
        return 0;
    }
    st = dhsa_tokenize(tok, text, (int64_t)len, dhsa_tokenizer_default_flags(tok), all, got, &got);
    memcpy(ids, all, (size_t)n * sizeof(int32_t));
    free(all);
    return st ? 0 : n;
}

typedef struct {
    dhsa_ctx *ctx;
    const dhsa_model *m;
    dhsa_session_params sp;
    const int32_t *prompt;
    pthread_barrier_t *start;
    float *logits;      /* [N_STEPS + 1][V]: after the prompt, then after each greedy token */
    dhsa_status st;
    char err[256];
} run_arg;

static void *run_main(void *p) {
    run_arg *r = p;
    if (r->start) pthread_barrier_wait(r->start);
    const int64_t V = dhsa_model_get_info(r->m)->n_vocab;
    dhsa_session *s = NULL;
    r->st = dhsa_session_create(r->ctx, r->m, &r->sp, &s);
    if (!r->st) r->st = dhsa_session_eval(s, r->prompt, N_PROMPT, r->logits);
    for (int i = 0; i < N_STEPS && !r->st; i++) {
        const float *lg = r->logits + (int64_t)i * V;
        int32_t best = 0;
        for (int64_t j = 1; j < V; j++)
            if (lg[j] > lg[best]) best = (int32_t)j;
        r->st = dhsa_session_eval(s, &best, 1, r->logits + (int64_t)(i + 1) * V);
    }
    if (r->st) snprintf(r->err, sizeof r->err, "%s", dhsa_last_error());
    dhsa_session_free(s);
    return NULL;
}

static void test_sessions(const dhsa_model *m) {
    const int64_t V = dhsa_model_get_info(m)->n_vocab;
    const size_t n_lg = (size_t)(N_STEPS + 1) * (size_t)V;
    int32_t prompt[2][N_PROMPT];
    T_CHECK(make_prompt(m, 0, prompt[0], N_PROMPT) == N_PROMPT && make_prompt(m, 7, prompt[1], N_PROMPT) == N_PROMPT,
            "two prompts of %d tokens", N_PROMPT);
    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = 2;
    dhsa_ctx *ctx[2] = {NULL, NULL};
    dhsa_ctx_create(&cp, &ctx[0]);
    dhsa_ctx_create(&cp, &ctx[1]);
    if (!ctx[0] || !ctx[1]) {
        T_CHECK(0, "two ctxs: %s", dhsa_last_error());
        dhsa_ctx_free(ctx[0]);
        dhsa_ctx_free(ctx[1]);
        return;
    }
    const dhsa_attn_method methods[2] = {DHSA_ATTN_DENSE, DHSA_ATTN_DHSA};
    for (int mi = 0; mi < 2; mi++) {
        float *want[2], *got[2];
        run_arg r[2];
        for (int i = 0; i < 2; i++) {
            want[i] = malloc(n_lg * sizeof(float));
            got[i] = malloc(n_lg * sizeof(float));
            r[i] = (run_arg){ctx[0], m, method_params(methods[mi]), prompt[i], NULL, want[i], DHSA_OK, ""};
            run_main(&r[i]); /* serial */
            T_CHECK(r[i].st == DHSA_OK, "%s, prompt %d alone: %s", dhsa_attn_method_name(methods[mi]), i, r[i].err);
        }
        /* shared = 0: each session on its own ctx; 1: both on ctx[0] */
        for (int shared = 0; shared < 2; shared++)
            for (int round = 0; round < 3; round++) {
                pthread_barrier_t start;
                pthread_barrier_init(&start, NULL, 2);
                pthread_t th[2];
                for (int i = 0; i < 2; i++) {
                    r[i].ctx = ctx[shared ? 0 : i];
                    r[i].start = &start;
                    r[i].logits = got[i];
                    memset(got[i], 0, n_lg * sizeof(float));
                    pthread_create(&th[i], NULL, run_main, &r[i]);
                }
                for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
                pthread_barrier_destroy(&start);
                for (int i = 0; i < 2; i++)
                    T_CHECK(r[i].st == DHSA_OK && memcmp(got[i], want[i], n_lg * sizeof(float)) == 0,
                            "%s, two sessions on one model from two threads (%s), round %d: prompt %d's logits "
                            "differ from the serial run's (status %s %s)",
                            dhsa_attn_method_name(methods[mi]), shared ? "one ctx" : "a ctx each", round, i,
                            dhsa_status_str(r[i].st), r[i].err);
            }
        for (int i = 0; i < 2; i++) {
            free(want[i]);
            free(got[i]);
        }
    }
    dhsa_ctx_free(ctx[0]);
    dhsa_ctx_free(ctx[1]);
}

/* One session, two threads: a layer hook holds the first eval inside. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int inside, release;
    dhsa_session *s;
    dhsa_status from_hook; /* an eval of the same session from inside its hook */
    char hook_err[256];
} hold;

static int hold_hook(void *user, int64_t layer, const dhsa_attn_desc *a) {
    (void)a;
    hold *h = user;
    if (layer != 0 || h->inside) return 0;
    int32_t one = 5;
    h->from_hook = dhsa_session_eval(h->s, &one, 1, NULL);
    snprintf(h->hook_err, sizeof h->hook_err, "%s", dhsa_last_error());
    pthread_mutex_lock(&h->mu);
    h->inside = 1;
    pthread_cond_broadcast(&h->cv);
    while (!h->release) pthread_cond_wait(&h->cv, &h->mu);
    pthread_mutex_unlock(&h->mu);
    return 0;
}

typedef struct {
    dhsa_session *s;
    const int32_t *ids;
    int64_t n;
    float *logits;
    dhsa_status st;
} eval_arg;

static void *eval_main(void *p) {
    eval_arg *e = p;
    e->st = dhsa_session_eval(e->s, e->ids, e->n, e->logits);
    return NULL;
}

static void test_one_session_two_threads(const dhsa_model *m) {
    const int64_t V = dhsa_model_get_info(m)->n_vocab;
    int32_t prompt[N_PROMPT];
    if (make_prompt(m, 3, prompt, N_PROMPT) != N_PROMPT) return;
    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = 2;
    dhsa_ctx *ctx = NULL;
    if (dhsa_ctx_create(&cp, &ctx)) return;
    float *want = malloc((size_t)V * sizeof(float)), *got = malloc((size_t)V * sizeof(float));
    for (int mi = 0; mi < 2 && want && got; mi++) {
        dhsa_attn_method meth = mi ? DHSA_ATTN_DHSA : DHSA_ATTN_DENSE;
        const char *name = dhsa_attn_method_name(meth);
        dhsa_session_params sp = method_params(meth);
        dhsa_session *ref = NULL, *s = NULL;
        dhsa_status st = dhsa_session_create(ctx, m, &sp, &ref);
        if (!st) st = dhsa_session_eval(ref, prompt, N_PROMPT, want);
        if (!st) st = dhsa_session_eval(ref, prompt, 8, want); /* then 8 more tokens */
        T_CHECK(st == DHSA_OK, "%s reference: %s", name, dhsa_last_error());
        hold h;
        memset(&h, 0, sizeof h);
        pthread_mutex_init(&h.mu, NULL);
        pthread_cond_init(&h.cv, NULL);
        sp.layer_hook = hold_hook;
        sp.layer_hook_user = &h;
        if (!st) st = dhsa_session_create(ctx, m, &sp, &s);
        if (st) {
            dhsa_session_free(ref);
            continue;
        }
        h.s = s;
        eval_arg e = {s, prompt, N_PROMPT, got, DHSA_OK};
        pthread_t th;
        pthread_create(&th, NULL, eval_main, &e);
        pthread_mutex_lock(&h.mu);
        while (!h.inside) pthread_cond_wait(&h.cv, &h.mu);
        pthread_mutex_unlock(&h.mu);
        /* the eval on th is held inside layer 0 */
        int32_t one = 7;
        dhsa_status busy = dhsa_session_eval(s, &one, 1, NULL);
        char busy_err[256];
        snprintf(busy_err, sizeof busy_err, "%s", dhsa_last_error());
        dhsa_status busy_reset = dhsa_session_reset(s);
        T_CHECK(busy == DHSA_ERR_BUSY && strstr(busy_err, "in use"),
                "%s: an eval while another thread's eval runs: %s (want DHSA_ERR_BUSY) \"%s\"", name,
                dhsa_status_str(busy), busy_err);
        T_CHECK(busy_reset == DHSA_ERR_BUSY, "%s: a reset while another thread's eval runs: %s (want DHSA_ERR_BUSY)",
                name, dhsa_status_str(busy_reset));
        T_CHECK(h.from_hook == DHSA_ERR_BUSY && strstr(h.hook_err, "in use"),
                "%s: an eval of the session from inside its own layer hook: %s (want DHSA_ERR_BUSY) \"%s\"", name,
                dhsa_status_str(h.from_hook), h.hook_err);
        pthread_mutex_lock(&h.mu);
        h.release = 1;
        pthread_cond_broadcast(&h.cv);
        pthread_mutex_unlock(&h.mu);
        pthread_join(th, NULL);
        T_CHECK(e.st == DHSA_OK && dhsa_session_length(s) == N_PROMPT,
                "%s: the held eval finished: %s, length %lld (want %d)", name, dhsa_status_str(e.st),
                (long long)dhsa_session_length(s), N_PROMPT);
        st = dhsa_session_eval(s, prompt, 8, got);
        T_CHECK(st == DHSA_OK && memcmp(got, want, (size_t)V * sizeof(float)) == 0,
                "%s: after the refused calls the session goes on as one never used from two threads (%s)", name,
                dhsa_status_str(st));
        dhsa_session_free(s);
        dhsa_session_free(ref);
        pthread_mutex_destroy(&h.mu);
        pthread_cond_destroy(&h.cv);
    }
    free(want);
    free(got);
    dhsa_ctx_free(ctx);
}

/* ------------------------------------------------------------------------ */
/* One decode index, two appending threads */

#define IX_KEYS 4096
#define IX_STEP 16 /* keys per append */

typedef struct {
    dhsa_kv_index *ix;
    pthread_barrier_t *start;
    const float *keys; /* [IX_KEYS][Hkv][d] */
    int64_t Hkv, d;
    int ok, busy, other; /* appends that succeeded, were refused, failed otherwise */
    char err[256];
} ix_user;

/* Appends its keys IX_STEP at a time, each refused one again. */
static void *ix_user_main(void *p) {
    ix_user *u = p;
    pthread_barrier_wait(u->start);
    for (int i = 0; i < IX_KEYS && u->other == 0;) {
        dhsa_tensor k = dhsa_tensor_blhd((void *)(u->keys + (size_t)i * (size_t)(u->Hkv * u->d)), DHSA_F32, 1,
                                         IX_STEP, u->Hkv, u->d);
        dhsa_status st = dhsa_kv_index_append(u->ix, &k);
        if (st == DHSA_OK) {
            u->ok++;
            i += IX_STEP;
        } else if (st == DHSA_ERR_BUSY && strstr(dhsa_last_error(), "in use")) {
            u->busy++;
        } else {
            u->other++;
            snprintf(u->err, sizeof u->err, "%s: %s", dhsa_status_str(st), dhsa_last_error());
        }
    }
    return NULL;
}

static void test_shared_index(void) {
    const int64_t Hkv = 2, d = 64;
    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = 1;
    dhsa_ctx *ctx = NULL;
    if (dhsa_ctx_create(&cp, &ctx)) return;
    dhsa_router_params rp = dhsa_router_default_params();
    dhsa_kv_index *ix = NULL;
    dhsa_status st = dhsa_kv_index_create(ctx, &rp, Hkv, d, 2 * IX_KEYS, &ix);
    T_CHECK(st == DHSA_OK, "index: %s", dhsa_last_error());
    float *keys[2] = {random_floats((size_t)(IX_KEYS * Hkv * d), 5), random_floats((size_t)(IX_KEYS * Hkv * d), 6)};
    if (!st && keys[0] && keys[1]) {
        pthread_barrier_t start;
        pthread_barrier_init(&start, NULL, 2);
        ix_user us[2];
        pthread_t th[2];
        for (int i = 0; i < 2; i++) {
            us[i] = (ix_user){ix, &start, keys[i], Hkv, d, 0, 0, 0, ""};
            pthread_create(&th[i], NULL, ix_user_main, &us[i]);
        }
        for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
        pthread_barrier_destroy(&start);
        T_CHECK(us[0].other == 0 && us[1].other == 0, "appends from two threads: OK or DHSA_ERR_BUSY only (%s%s)",
                us[0].err, us[1].err);
        T_CHECK(dhsa_kv_index_length(ix) == 2 * IX_KEYS && us[0].ok + us[1].ok == 2 * IX_KEYS / IX_STEP,
                "appends from two threads: the index holds %lld keys after %d appends of %d (want %d; %d and %d "
                "appends refused as busy)",
                (long long)dhsa_kv_index_length(ix), us[0].ok + us[1].ok, IX_STEP, 2 * IX_KEYS, us[0].busy,
                us[1].busy);
    }
    free(keys[0]);
    free(keys[1]);
    dhsa_kv_index_free(ix);
    dhsa_ctx_free(ctx);
}

int main(void) {
    test_shared_ctx_attention(1);
    test_shared_ctx_attention(2);
    test_shared_parallel_for();
    test_shared_index();
    dhsa_model *m = NULL;
    dhsa_model_params mp = dhsa_model_default_params();
    T_CHECK(dhsa_model_load(MODEL, &mp, &m) == DHSA_OK, "load %s (run from the repository root): %s", MODEL,
            dhsa_last_error());
    if (m) {
        test_sessions(m);
        test_one_session_two_threads(m);
    }
    dhsa_model_free(m);
    return t_report("test_threads");
}
