/* engine.c: the engine of `dhsa serve` (docs/server.md): slots (a session
 * each), the FIFO queue for a free slot, the prompt cache (the slot with the
 * longest shared prefix), prefill, sampling and stop checks, and the
 * batcher thread that runs the joined slots' decode steps as one pass.
 */
#ifdef DHSA_HAVE_SERVE
#include "server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* ------------------------------------------------------------ slots --- */

static int64_t common_prefix(const int32_t *a, int64_t na, const int32_t *b, int64_t nb) {
    int64_t n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

/* The free slot for a prompt: the longest cached prefix, then the least
 * recently used. Under srv.mu. */
static slot *best_free(const int32_t *prompt, int64_t n) {
    slot *best = NULL;
    int64_t best_p = -1;
    for (int64_t i = 0; i < srv.n_slots; i++) {
        slot *sl = &srv.slots[i];
        if (sl->busy) continue;
        int64_t p = common_prefix(sl->tokens, sl->n_cached, prompt, n);
        if (p > best_p || (p == best_p && sl->last_used < best->last_used)) {
            best = sl;
            best_p = p;
        }
    }
    return best;
}

/* Waits (FIFO) for a slot. Returns it busy, or NULL: *why says why. */
slot *serve_acquire(const int32_t *prompt, int64_t n, const char **why) {
    pthread_mutex_lock(&srv.mu);
    slot *sl = NULL;
    if (!srv.q_head && (sl = best_free(prompt, n))) {
        sl->busy = 1;
        srv.n_busy++;
        pthread_mutex_unlock(&srv.mu);
        return sl;
    }
    if (srv.n_queued >= srv.max_queue) {
        pthread_mutex_unlock(&srv.mu);
        *why = "queue";
        return NULL;
    }
    waiter w = {0};
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w.cv, &ca);
    pthread_condattr_destroy(&ca);
    w.prompt = prompt;
    w.n_prompt = n;
    if (srv.q_tail) srv.q_tail->next = &w;
    else srv.q_head = &w;
    srv.q_tail = &w;
    srv.n_queued++;
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += (time_t)srv.queue_timeout;
    while (!w.granted && !atomic_load(&srv.stopping)) {
        if (pthread_cond_timedwait(&w.cv, &srv.mu, &dl) == ETIMEDOUT) break;
    }
    if (!w.granted) { /* serve_leave the queue */
        waiter **pp = &srv.q_head, *prev = NULL;
        while (*pp && *pp != &w) {
            prev = *pp;
            pp = &(*pp)->next;
        }
        if (*pp) {
            *pp = w.next;
            if (srv.q_tail == &w) srv.q_tail = prev;
        }
        srv.n_queued--;
        *why = atomic_load(&srv.stopping) ? "stopping" : "timeout";
    }
    sl = w.granted;
    pthread_mutex_unlock(&srv.mu);
    pthread_cond_destroy(&w.cv);
    return sl;
}

/* Gives the slot to the first waiter, or frees it. */
static void release(slot *sl) {
    pthread_mutex_lock(&srv.mu);
    sl->logits_of = NULL; /* the next request starts from its own serve_prefill */
    sl->last_used = ++srv.use_clock;
    if (srv.q_head && !atomic_load(&srv.stopping)) { /* stopping: the waiters serve_leave with a 503 */
        waiter *w = srv.q_head;
        srv.q_head = w->next;
        if (!srv.q_head) srv.q_tail = NULL;
        srv.n_queued--;
        w->granted = sl; /* stays busy */
        pthread_cond_signal(&w->cv);
    } else {
        sl->busy = 0;
        srv.n_busy--;
    }
    pthread_mutex_unlock(&srv.mu);
}

/* The slot's session for a request's attention (the server's unless the
 * request names its own); a change makes the session anew (its cache is
 * then empty). Returns 0, or -1 with msg. */
int serve_slot_prepare(slot *sl, int attn, double density, char *msg, size_t cap) {
    dhsa_session_params sp = srv.sp;
    if (attn != SERVE_ATTN_UNSET) sp.attn = (dhsa_attn_method)attn;
    if (density > 0) sp.router.density = density;
    if (sl->s && sp.attn == sl->sp.attn && sp.router.density == sl->sp.router.density) return 0;
    dhsa_session_free(sl->s);
    sl->s = NULL;
    sl->n_cached = 0;
    if (dhsa_session_create(sl->ctx, srv.m, &sp, &sl->s)) {
        snprintf(msg, cap, "no session for attn %s, density %g: %s", dhsa_attn_method_name(sp.attn),
                 sp.router.density, dhsa_last_error());
        /* back to the server's own, which fitted at start */
        if (dhsa_session_create(sl->ctx, srv.m, &srv.sp, &sl->s) == DHSA_OK) sl->sp = srv.sp;
        return -1;
    }
    sl->sp = sp;
    return 0;
}

/* 1 when the peer of socket fd has gone (EOF or an error; bytes waiting,
 * a pipelined request, are not read). */
int serve_client_gone_fd(int fd) {
    if (fd < 0) return 0;
    char b;
    ssize_t r = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

static int append_out(gen *g, const char *p, int64_t n) {
    if (g->out_len + n + 1 > g->out_cap) {
        int64_t cap = (g->out_cap ? g->out_cap * 2 : 1024);
        while (cap < g->out_len + n + 1) cap *= 2;
        char *o = realloc(g->out, (size_t)cap);
        if (!o) return -1;
        g->out = o;
        g->out_cap = cap;
    }
    memcpy(g->out + g->out_len, p, (size_t)n);
    g->out_len += n;
    return 0;
}

/* Samples one id from logits [n_vocab] with the penalties of OpenAI (over
 * the ids generated so far). With ignore_eos the stop ids' logits are -Inf
 * (as llama.cpp's ignore_eos): the sampler never draws one, so none ends
 * the reply and none is in its text or the slot's cache; their probability
 * goes to the other ids, as a top-k / top-p cut's does. */
int serve_sample_next(gen *g, const float *logits, int32_t *next) {
    slot *sl = g->sl;
    const float *lg = logits;
    if (logits == sl->logits && sl->logits_of != g) {
        snprintf(g->err_msg, sizeof g->err_msg, "internal error: the slot's logits are not this request's own "
                 "(its prompt was not evaluated); nothing was sampled");
        return -1;
    }
    const int penalties = g->touched_count && (g->rq.presence_penalty != 0 || g->rq.frequency_penalty != 0);
    if (penalties || g->rq.ignore_eos || g->jc) {
        memcpy(sl->scratch, logits, (size_t)srv.in->n_vocab * sizeof(float));
        for (int32_t i = 0; penalties && i < g->touched_count; i++) {
            int32_t id = g->touched[i];
            sl->scratch[id] -= (float)(g->rq.frequency_penalty * sl->counts[id] + g->rq.presence_penalty);
        }
        for (int i = 0; g->rq.ignore_eos && i < g->n_stop_ids; i++) sl->scratch[g->stop_ids[i]] = -INFINITY;
        lg = sl->scratch;
        /* JSON: only the ids that continue the value; the stop ids only
         * once it is complete */
        if (g->jc && dhsa_json_constraint_mask(g->jc, sl->scratch, g->stop_ids, g->rq.ignore_eos ? 0 : g->n_stop_ids,
                                               NULL)) {
            snprintf(g->err_msg, sizeof g->err_msg, "response_format: %s", dhsa_last_error());
            return -1;
        }
    }
    if (dhsa_sampler_sample(g->smp, lg, sl->tokens, sl->n_cached, next)) {
        snprintf(g->err_msg, sizeof g->err_msg, "sampling: %s", dhsa_last_error());
        return -1;
    }
    if (sl->counts[*next]++ == 0) g->touched[g->touched_count++] = *next;
    return 0;
}

/* A step's per-token work, first half (no lock: only the step's thread
 * touches what it writes), on the logits [n_vocab] of the decode step or
 * serve_prefill before: ends the generation at max_tokens, a stopping server or
 * a stop id, or samples next_id and puts its text in piece. Returns 1
 * with a piece to publish, 0 when the generation ended (finish or error). */
static int pick(gen *g, const float *logits) {
    slot *sl = g->sl;
    g->piece_len = 0;
    if (g->n_gen >= g->max_gen) {
        g->finish = "length";
        return 0;
    }
    if (atomic_load(&srv.stopping)) {
        g->error = 1;
        snprintf(g->err_msg, sizeof g->err_msg, "the server is shutting down");
        return 0;
    }
    int32_t next;
    if (serve_sample_next(g, logits, &next)) {
        g->error = 1;
        return 0;
    }
    if (g->n_gen == 0) g->t_first = serve_now_s();
    for (int i = 0; i < g->n_stop_ids; i++) /* never true with ignore_eos: serve_sample_next masked them */
        if (next == g->stop_ids[i]) {
            g->finish = "stop";
            return 0;
        }
    if (g->jc && dhsa_json_constraint_accept(g->jc, next)) { /* the mask let it through: a bug if refused */
        g->error = 1;
        snprintf(g->err_msg, sizeof g->err_msg, "internal error: response_format: %s", dhsa_last_error());
        return 0;
    }
    g->n_gen++;
    int64_t len = 0;
    if (dhsa_token_to_piece(srv.tok, next, 0, g->piece, sizeof g->piece, &len) != DHSA_OK) len = 0;
    if (g->first_piece && len > 0) {
        /* a chat reply: SentencePiece's word-start space is not the reply's text */
        if (g->chat && g->piece[0] == ' ' && dhsa_tokenizer_kind_of(srv.tok) == DHSA_TOKENIZER_SPM) {
            memmove(g->piece, g->piece + 1, (size_t)len - 1);
            len--;
        }
        g->first_piece = 0;
    }
    g->piece_len = len;
    g->next_id = next;
    sl->tokens[sl->n_cached] = next;
    return 1;
}

/* Second half, under srv.mu: appends the piece (picked: pick returned 1),
 * ends the text before a stop string (finish "stop"), ends the generation
 * at max_tokens or a full context (finish "length"), and moves safe_len up
 * to all but a tail that could begin a stop string (all of it once the
 * generation ended). Returns 1 when next_id is to be evaluated, 0 when the
 * generation ended. */
static int publish(gen *g, int picked) {
    slot *sl = g->sl;
    if (picked) {
        if (append_out(g, g->piece, g->piece_len)) {
            g->error = 1;
            snprintf(g->err_msg, sizeof g->err_msg, "out of memory");
        } else {
            /* a stop string can only begin in the held-back tail (one
             * wholly before it would have ended the generation already) */
            const char *u = g->out + g->safe_len;
            int64_t n = g->out_len - g->safe_len, cut = -1;
            for (int i = 0; i < g->rq.n_stop; i++) {
                const char *hit = memmem(u, (size_t)n, g->rq.stop[i], (size_t)g->rq.stop_len[i]);
                if (hit && (cut < 0 || hit - u < cut)) cut = hit - u;
            }
            if (cut >= 0) {
                g->out_len = g->safe_len + cut;
                g->finish = "stop";
            } else if (g->jc && dhsa_json_constraint_finished(g->jc)) {
                g->finish = "stop"; /* the JSON value closed: nothing may follow */
            } else if (g->n_gen >= g->max_gen || sl->n_cached >= dhsa_session_get_plan(sl->s)->n_ctx) {
                g->finish = "length";
            }
        }
    }
    if (g->finish || g->error) {
        g->safe_len = g->out_len;
        return 0;
    }
    const char *u = g->out + g->safe_len;
    int64_t n = g->out_len - g->safe_len, hold = 0;
    for (int i = 0; i < g->rq.n_stop; i++)
        for (int64_t k = g->rq.stop_len[i] - 1; k > hold; k--)
            if (k <= n && memcmp(u + n - k, g->rq.stop[i], (size_t)k) == 0) {
                hold = k;
                break;
            }
    g->safe_len = g->out_len - hold;
    return 1;
}

/* Both halves on the connection's thread (before the generation joins
 * the batcher, or with --batch off). Returns publish's answer. */
int serve_advance(gen *g, const float *logits) {
    int picked = pick(g, logits);
    pthread_mutex_lock(&srv.mu);
    int more = publish(g, picked);
    pthread_mutex_unlock(&srv.mu);
    return more;
}

/* --batch off: one whole step on the connection's thread, the per-token
 * work and then the sampled id's decode step. */
void serve_step_alone(gen *g) {
    slot *sl = g->sl;
    if (!serve_advance(g, sl->logits)) return;
    double t = serve_now_s();
    sl->logits_of = NULL;
    if (dhsa_session_eval(sl->s, &g->next_id, 1, sl->logits)) {
        g->error = 1;
        snprintf(g->err_msg, sizeof g->err_msg, "decode: %s", dhsa_last_error());
        sl->n_cached = dhsa_session_length(sl->s);
        return;
    }
    sl->logits_of = g;
    g->t_decode += serve_now_s() - t;
    sl->n_cached++;
}

/* ---------------------------------------------------------- batcher --- */

/* Hands a generation whose first token is published (next_id waiting for
 * its decode step) to the batcher. */
void serve_join(gen *g) {
    pthread_mutex_lock(&srv.mu);
    g->joined = 1;
    g->sl->joined = g;
    pthread_cond_signal(&srv.cv_work);
    pthread_mutex_unlock(&srv.mu);
}

/* The batcher lets go of a generation (under srv.mu); it never touches it
 * again. */
static void detach(gen *g) {
    g->joined = 0;
    g->sl->joined = NULL;
    pthread_cond_signal(&g->cv);
}

/* The connection takes its generation back (its stream ended or failed):
 * the batcher lets go after the pass it may be running. */
void serve_leave(gen *g) {
    pthread_mutex_lock(&srv.mu);
    if (g->joined) {
        g->cancel = 1;
        while (g->joined) pthread_cond_wait(&g->cv, &srv.mu);
    }
    pthread_mutex_unlock(&srv.mu);
}

/* The batcher: runs the pending decode steps of every joined generation
 * as one dhsa_session_eval_batch, then each row's per-token work, and
 * starts the next pass at once; it waits only when no generation is
 * joined. A failed batch is run again one slot at a time, so that each
 * slot gets its own outcome. */
void *serve_batcher_main(void *arg) {
    (void)arg;
    const int64_t V = srv.in->n_vocab;
    pthread_mutex_lock(&srv.mu);
    for (;;) {
        int64_t k = 0;
        for (int64_t i = 0; i < srv.n_slots; i++) {
            gen *g = srv.slots[i].joined;
            if (!g) continue;
            if (g->cancel) {
                detach(g);
                continue;
            }
            srv.batch_sl[k] = &srv.slots[i];
            srv.batch_g[k] = g;
            srv.batch_ss[k] = srv.slots[i].s;
            srv.batch_ids[k++] = g->next_id;
        }
        if (!k) {
            if (srv.batcher_quit) break;
            pthread_cond_wait(&srv.cv_work, &srv.mu);
            continue;
        }
        pthread_mutex_unlock(&srv.mu);
        const double t_eval = serve_now_s();
        dhsa_status st = dhsa_session_eval_batch(srv.batch_ss, k, srv.batch_ids, srv.batch_logits);
        const double t_evaluated = serve_now_s();
        for (int64_t t = 0; t < k; t++) {
            slot *sl = srv.batch_sl[t];
            gen *g = srv.batch_g[t];
            const float *lg = srv.batch_logits + t * V;
            srv.batch_next[t] = -1; /* ended without a piece to publish */
            if (st != DHSA_OK) {
                lg = sl->logits;
                sl->logits_of = NULL;
                if (dhsa_session_eval(sl->s, &srv.batch_ids[t], 1, sl->logits)) {
                    g->error = 1;
                    snprintf(g->err_msg, sizeof g->err_msg, "decode: %s", dhsa_last_error());
                    sl->n_cached = dhsa_session_length(sl->s);
                    continue;
                }
                sl->logits_of = g;
            }
            sl->n_cached++;
            g->t_decode += t_evaluated - t_eval;
            if (serve_client_gone_fd(g->fd)) {
                g->gone = 1;
                continue;
            }
            srv.batch_next[t] = pick(g, lg);
        }
        pthread_mutex_lock(&srv.mu);
        for (int64_t t = 0; t < k; t++) {
            gen *g = srv.batch_g[t];
            int more = srv.batch_next[t] >= 0 && publish(g, srv.batch_next[t]);
            if (!more || g->cancel) detach(g);
            else if (g->rq.stream) pthread_cond_signal(&g->cv);
        }
        srv.n_batches++;
        srv.n_batch_rows += (uint64_t)k;
        srv.batch_eval_s += t_evaluated - t_eval;
        srv.batch_sample_s += serve_now_s() - t_evaluated;
    }
    pthread_mutex_unlock(&srv.mu);
    return NULL;
}

/* ------------------------------------------------------ the replies --- */

/* The connection thread's view of its generation brought up to date:
 * with --batch on, waits until the batcher has published more text or
 * let go. Sets over when the generation has ended. Returns 0, or -1 out
 * of memory. */
int serve_gen_sync(gen *g) {
    int rc = 0;
    pthread_mutex_lock(&srv.mu);
    while (g->joined && g->safe_len == g->view_len) pthread_cond_wait(&g->cv, &srv.mu);
    int64_t n = g->safe_len - g->view_len;
    if (n > 0 && g->view_len + n + 1 > g->view_cap) {
        int64_t cap = g->out_cap > g->view_len + n + 1 ? g->out_cap : g->view_len + n + 1;
        char *v = realloc(g->view, (size_t)cap);
        if (v) {
            g->view = v;
            g->view_cap = cap;
        } else {
            rc = -1;
        }
    }
    if (!rc && n > 0) {
        memcpy(g->view + g->view_len, g->out + g->view_len, (size_t)n);
        g->view_len += n;
    }
    g->over = !g->joined && (g->finish || g->error || g->gone);
    pthread_mutex_unlock(&srv.mu);
    return rc;
}

void serve_gen_free(gen *g) {
    if (!g) return;
    serve_leave(g);
    if (g->sl) {
        slot *sl = g->sl;
        for (int32_t i = 0; i < g->touched_count; i++) sl->counts[g->touched[i]] = 0;
        release(sl);
    }
    dhsa_sampler_free(g->smp);
    dhsa_json_constraint_free(g->jc);
    serve_request_free(&g->rq);
    pthread_cond_destroy(&g->cv);
    free(g->out);
    free(g->view);
    free(g->touched);
    free(g->pend);
    serve_mem_give(&g->reserved);
    free(g);
}

void serve_note_done(gen *g) {
    serve_leave(g);
    pthread_mutex_lock(&srv.mu);
    srv.gen_tokens += (uint64_t)g->n_gen;
    srv.decode_s += g->t_decode;
    pthread_mutex_unlock(&srv.mu);
    if (srv.verbose)
        fprintf(stderr, "dhsa serve: %s slot %d: prompt %lld (%lld cached), %lld generated, %s, ttft %.3f s\n", g->id,
                g->sl ? g->sl->id : -1, (long long)g->n_prompt, (long long)g->n_reused, (long long)g->n_gen,
                g->error ? "error" : g->finish ? g->finish : "-", g->t_first > 0 ? g->t_first - g->t_start : 0.0);
}

/* Evaluates the prompt into the slot: the cached prefix is kept, the rest
 * goes in pieces, with a check for a departed client between them.
 * Returns 0, or an HTTP status with msg. */
unsigned serve_prefill(gen *g, const int32_t *ids, int64_t n, char *msg, size_t cap) {
    slot *sl = g->sl;
    sl->logits_of = NULL;
    if (n < 1) /* serve_handle_generate refuses such a request: this is the last line */
        return snprintf(msg, cap, "internal error: a request with no prompt tokens reached the serve_prefill"), 500;
    int64_t keep = common_prefix(sl->tokens, sl->n_cached, ids, n);
    if (keep >= n) keep = n - 1; /* the last prompt token runs again for its logits */
    if (dhsa_session_truncate(sl->s, keep)) {
        /* a session that could not rebuild its indexes: start it anew */
        snprintf(msg, cap, "prompt cache: %s", dhsa_last_error());
        sl->n_cached = 0;
        if (dhsa_session_reset(sl->s)) return 500;
        keep = 0;
    }
    sl->n_cached = keep;
    g->n_reused = keep;
    memcpy(sl->tokens + keep, ids + keep, (size_t)(n - keep) * sizeof(int32_t));
    const int64_t piece = 4 * dhsa_session_get_plan(sl->s)->n_ubatch;
    double t = serve_now_s();
    for (int64_t at = keep; at < n;) {
        int64_t k = n - at < piece ? n - at : piece;
        if (dhsa_session_eval(sl->s, ids + at, k, at + k == n ? sl->logits : NULL)) {
            snprintf(msg, cap, "serve_prefill: %s", dhsa_last_error());
            sl->n_cached = dhsa_session_length(sl->s);
            return 500;
        }
        at += k;
        sl->n_cached = at;
        if (at == n) sl->logits_of = g;
        if (at < n && (serve_client_gone(g->conn) || atomic_load(&srv.stopping))) {
            snprintf(msg, cap, "%s", atomic_load(&srv.stopping) ? "the server is shutting down" : "the client went away");
            return 499;
        }
    }
    double dt = serve_now_s() - t;
    pthread_mutex_lock(&srv.mu);
    srv.prompt_tokens += (uint64_t)n;
    srv.cached_tokens += (uint64_t)keep;
    if (keep > 0) srv.n_cache_hits++;
    srv.prefill_s += dt;
    pthread_mutex_unlock(&srv.mu);
    g->t_prefill = dt;
    return 0;
}
#else
typedef int dhsa_serve_engine_unused; /* built without libmicrohttpd and jansson: main.c refuses */
#endif
