/* http.c: the HTTP layer of `dhsa serve` (libmicrohttpd, docs/server.md):
 * routing, request bodies and the memory pool (--mem-limit), streams
 * (server-sent events), /tokenize, /detokenize, /v1/models, /health,
 * /metrics, and the limits on connections.
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

/* Takes bytes from the memory pool for request r before it allocates them.
 * Returns 0; 413 when the request would need more than the whole pool
 * (it can never be served under --mem-limit); 503 when other requests hold
 * the pool now (it may be retried). msg says which, with the numbers. */
unsigned serve_mem_take(request_ctx *r, size_t bytes, const char *what, char *msg, size_t cap) {
    if (!srv.mem_pool) return 0;
    char a[32], b[32], c[32];
    pthread_mutex_lock(&srv.mu);
    unsigned st = 0;
    if (bytes > srv.mem_pool || r->reserved > srv.mem_pool - bytes) {
        st = 413;
        snprintf(msg, cap, "%s needs about %s of memory; --mem-limit leaves %s for requests (docs/server.md, Memory)",
                 what, dhsa_cli_bytes((double)(r->reserved + bytes), a, sizeof a),
                 dhsa_cli_bytes((double)srv.mem_pool, b, sizeof b));
    } else if (srv.mem_used + bytes > srv.mem_pool) {
        st = 503;
        snprintf(msg, cap, "%s needs about %s of memory and other requests hold %s of the %s --mem-limit leaves for "
                 "requests: retry later", what, dhsa_cli_bytes((double)bytes, a, sizeof a),
                 dhsa_cli_bytes((double)srv.mem_used, b, sizeof b), dhsa_cli_bytes((double)srv.mem_pool, c, sizeof c));
    } else {
        srv.mem_used += bytes;
        if (srv.mem_used > srv.mem_peak) srv.mem_peak = srv.mem_used;
        r->reserved += bytes;
    }
    if (st) srv.n_mem_refused++;
    pthread_mutex_unlock(&srv.mu);
    return st;
}

void serve_mem_give(size_t *reserved) {
    if (!*reserved) return;
    pthread_mutex_lock(&srv.mu);
    srv.mem_used -= *reserved;
    pthread_mutex_unlock(&srv.mu);
    *reserved = 0;
}

/* close_after: the connection ends after this response (a request whose framing
 * cannot be trusted). */
static enum MHD_Result send_text_opt(struct MHD_Connection *c, unsigned code, const char *type, char *body, size_t len,
                                     int close_after) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    /* while the server stops, no connection is kept for another request */
    if (close_after || atomic_load(&srv.stopping)) MHD_add_response_header(r, "Connection", "close");
    enum MHD_Result ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result send_text(struct MHD_Connection *c, unsigned code, const char *type, char *body, size_t len) {
    return send_text_opt(c, code, type, body, len, 0);
}

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned code, json_t *j) {
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!s) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}";
        return send_text(c, 500, "application/json", strdup(oom), sizeof oom - 1);
    }
    return send_text(c, code, "application/json", s, strlen(s));
}

static enum MHD_Result send_error(struct MHD_Connection *c, unsigned code, const char *message, const char *param,
                                  const char *err_code) {
    pthread_mutex_lock(&srv.mu);
    srv.n_errors++;
    pthread_mutex_unlock(&srv.mu);
    if (srv.verbose) fprintf(stderr, "dhsa serve: %u %s\n", code, message);
    return send_json(c, code, serve_error_object(code, message, param, err_code));
}

static int connection_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* 1 when the peer of socket fd has gone (EOF or an error; bytes waiting,
 * a pipelined request, are not read). */
static int client_gone_fd(int fd) {
    if (fd < 0) return 0;
    char b;
    ssize_t r = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* ------------------------------------------------------ generations --- */

/* The engine's callbacks (engine.h): text, finish and error on the
 * connection's thread inside serve_gen_next, gone on the engine's. */
static void on_text(void *user, const char *bytes, int64_t n) {
    reply *r = user;
    if (r->view_oom) return;
    if (r->view_len + n + 1 > r->view_cap) {
        int64_t cap = r->view_cap ? r->view_cap : 1024;
        while (cap < r->view_len + n + 1) cap *= 2;
        char *v = realloc(r->view, (size_t)cap);
        if (!v) {
            r->view_oom = 1;
            return;
        }
        r->view = v;
        r->view_cap = cap;
    }
    memcpy(r->view + r->view_len, bytes, (size_t)n);
    r->view_len += n;
    r->view[r->view_len] = 0;
}

static void on_finish(void *user, const char *reason) { ((reply *)user)->finish = reason; }

static void on_error(void *user, const char *message) {
    reply *r = user;
    r->error = 1;
    snprintf(r->err_msg, sizeof r->err_msg, "%s", message);
}

static int on_gone(void *user) { return client_gone_fd(((reply *)user)->fd); }

static const serve_gen_callbacks reply_callbacks = {on_text, on_finish, on_error, on_gone};

/* The next piece of the reply: serve_gen_next, and at the end the counts.
 * Returns 1 while it goes on, 0 at the end (r->over). */
static int reply_next(reply *r) {
    if (r->over) return 0;
    if (serve_gen_next(r->g)) return 1;
    r->over = 1;
    serve_gen_get_info(r->g, &r->info);
    if (r->info.gone) r->error = 0; /* nobody to tell */
    return 0;
}

static void reply_free(reply *r) {
    if (!r) return;
    serve_gen_free(r->g);
    serve_request_free(&r->rq);
    free(r->view);
    free(r->pend);
    serve_mem_give(&r->reserved);
    free(r);
}

static void note_done(reply *r) {
    if (!srv.verbose) return;
    serve_gen_info in = r->info;
    if (!r->over && r->g) serve_gen_get_info(r->g, &in);
    fprintf(stderr, "dhsa serve: %s slot %d: prompt %lld (%lld cached), %lld generated, %s, ttft %.3f s\n", r->id,
            in.slot, (long long)in.n_prompt, (long long)in.n_reused, (long long)in.n_gen,
            in.error ? "error" : in.finish ? in.finish : "-", in.t_first > 0 ? in.t_first - r->t_start : 0.0);
}

/* Stream reader: each call sends what is pending, else makes the next
 * event from the text the generation has added (--batch off: after
 * running the next step here; on: after waiting for the batcher's). */
static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    reply *g = cls;
    for (;;) {
        if (g->pend_off < g->pend_len) {
            size_t n = g->pend_len - g->pend_off;
            if (n > max) n = max;
            memcpy(buf, g->pend + g->pend_off, n);
            g->pend_off += n;
            if (g->pend_off == g->pend_len) g->pend_off = g->pend_len = 0;
            return (ssize_t)n;
        }
        if (g->done_sent) return MHD_CONTENT_READER_END_OF_STREAM;
        if (!g->over) {
            reply_next(g);
            if (g->view_oom) return MHD_CONTENT_READER_END_WITH_ERROR;
            if (g->over && g->info.gone) return MHD_CONTENT_READER_END_WITH_ERROR; /* stream_free counts it */
        }
        const char *finish = g->over ? g->finish : NULL;
        int rc = 0;
        if (g->over && g->error) {
            json_t *e = serve_error_object(500, g->err_msg, NULL, NULL);
            rc = serve_push_event(g, e);
            g->finish = finish = "error";
        } else {
            int64_t n = g->view_len - g->sent;
            if (n > 0 || (g->chat && !g->role_sent)) {
                int64_t used = n;
                char *clean = NULL;
                int64_t clen = 0;
                if (n > 0) {
                    clean = serve_utf8_clean(g->view + g->sent, n, finish != NULL, &used, &clen);
                    if (!clean) return MHD_CONTENT_READER_END_WITH_ERROR;
                }
                if (used > 0 || (g->chat && !g->role_sent)) {
                    json_t *o = serve_envelope(g, 1), *ch = json_array();
                    json_array_append_new(ch, serve_choice(g, clean ? clean : "", clen, 1, NULL));
                    json_object_set_new(o, "choices", ch);
                    rc = serve_push_event(g, o);
                    g->role_sent = 1;
                    g->sent += used;
                }
                free(clean);
            }
            if (!rc && finish) {
                json_t *o = serve_envelope(g, 1), *ch = json_array();
                /* the last piece's remaining bytes (an incomplete UTF-8 tail) go with the finish */
                int64_t left = g->view_len - g->sent;
                json_array_append_new(ch, left > 0 ? serve_choice(g, g->view + g->sent, left, 1, finish)
                                                   : serve_choice(g, NULL, 0, 1, finish));
                g->sent = g->view_len;
                json_object_set_new(o, "choices", ch);
                if (!g->rq.include_usage) json_object_set_new(o, "usage", serve_usage_json(g));
                rc = serve_push_event(g, o);
                if (!rc && g->rq.include_usage) {
                    o = serve_envelope(g, 1);
                    json_object_set_new(o, "choices", json_array());
                    json_object_set_new(o, "usage", serve_usage_json(g));
                    rc = serve_push_event(g, o);
                }
            }
        }
        if (rc) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (finish) {
            static const char done[] = "data: [DONE]\n\n";
            char *p = realloc(g->pend, g->pend_len + sizeof done);
            if (!p) return MHD_CONTENT_READER_END_WITH_ERROR;
            g->pend = p;
            memcpy(p + g->pend_len, done, sizeof done - 1);
            g->pend_len += sizeof done - 1;
            g->done_sent = 1;
            note_done(g);
        }
    }
}

/* The response is done with: sent whole, or the connection closed (a
 * client that went away while its stream ran counts as a disconnect). */
static void stream_free(void *cls) {
    reply *g = cls;
    if (!g->done_sent) {
        pthread_mutex_lock(&srv.mu);
        srv.n_disconnects++;
        pthread_mutex_unlock(&srv.mu);
        note_done(g);
    }
    reply_free(g);
}

static enum MHD_Result handle_generate(struct MHD_Connection *c, request_ctx *rc, serve_req_kind kind) {
    serve_limits lim = {srv.max_tokens, 2 * srv.n_ctx + 16, srv.in->n_vocab}; /* a longer prompt is refused below, naming --ctx */
    reply *g = calloc(1, sizeof *g);
    if (!g) return send_error(c, 500, "out of memory", NULL, NULL);
    g->fd = -1;
    serve_error e;
    if (serve_request_parse(kind, rc->body, rc->len, &lim, &g->rq, &e)) {
        reply_free(g);
        return send_error(c, 400, e.message, e.param, NULL);
    }
    free(rc->body); /* parsed: its bytes stay reserved until the answer is sent */
    rc->body = NULL;
    g->conn = c;
    g->fd = connection_fd(c);
    g->chat = kind == SERVE_REQ_CHAT;
    g->created = time(NULL);
    g->t_start = serve_now_s();
    snprintf(g->id, sizeof g->id, "%s-%" PRIu64, g->chat ? "chatcmpl" : "cmpl", (uint64_t)atomic_fetch_add(&srv.id_counter, 1));
    char msg[600];
    const char *param = NULL, *code = NULL;
    int32_t *ids = NULL;
    int64_t n = 0;
    /* a text that cannot fit the context is refused before it is
     * tokenized: a token covers at most max_piece bytes of it */
    int64_t text_bytes = g->chat ? 0 : g->rq.text_len;
    for (int64_t i = 0; i < g->rq.n_messages; i++) text_bytes += (int64_t)strlen(g->rq.messages[i].content);
    unsigned status = 0;
    if ((text_bytes + srv.max_piece - 1) / srv.max_piece > srv.n_ctx) {
        snprintf(msg, sizeof msg, "the prompt's %lld bytes of text are at least %lld tokens (a token covers at most %lld "
                 "bytes here); a slot's context holds %lld (--ctx)", (long long)text_bytes,
                 (long long)((text_bytes + srv.max_piece - 1) / srv.max_piece), (long long)srv.max_piece, (long long)srv.n_ctx);
        status = 400;
        param = g->chat ? "messages" : "prompt";
        code = "context_length_exceeded";
    }
    /* the tokenizer's work (the template's markers: 64 bytes a message) */
    if (!status)
        status = serve_mem_take(rc, (size_t)(text_bytes + 64 * g->rq.n_messages) * TOKENIZE_WORK_PER_BYTE + 4096,
                          "tokenizing the prompt", msg, sizeof msg);
    if (!status) status = serve_prompt_ids(&g->rq, &ids, &n, msg, sizeof msg, &param, &code);
    if (!status && n > srv.n_ctx) {
        snprintf(msg, sizeof msg, "the prompt has %lld tokens; a slot's context holds %lld (--ctx)", (long long)n,
                 (long long)srv.n_ctx);
        status = 400;
        param = g->chat ? "messages" : "prompt";
        code = "context_length_exceeded";
    }
    int64_t room = srv.n_ctx - n;
    int64_t want = g->rq.max_tokens >= 0 ? g->rq.max_tokens : (g->chat ? room : 16); /* OpenAI's defaults */
    if (!status && g->rq.max_tokens > room) {
        snprintf(msg, sizeof msg, "the prompt's %lld tokens and max_tokens %lld do not fit a slot's context of %lld "
                 "tokens (--ctx); max_tokens may be at most %lld here", (long long)n, (long long)g->rq.max_tokens,
                 (long long)srv.n_ctx, (long long)room);
        status = 400;
        param = "max_tokens";
        code = "context_length_exceeded";
    }
    if (status) {
        free(ids);
        reply_free(g);
        return send_error(c, status, msg, param, code);
    }
    const int64_t max_gen = want < srv.max_tokens ? want : srv.max_tokens;
    /* the generation's own memory: the penalties' ids, the sampler (its
     * arrays over the vocabulary), the text and its copies (the
     * connection's view, UTF-8 cleaning, JSON escaping: 20 bytes a byte) */
    status = serve_mem_take(rc, (size_t)(max_gen + 1) * 4 + (size_t)srv.in->n_vocab * (32 + (g->rq.json ? 1 : 0)) +
                              (size_t)max_gen * (size_t)srv.max_piece * 20 + ((size_t)64 << 10),
                      "the generation", msg, sizeof msg);
    if (status) {
        free(ids);
        reply_free(g);
        return send_error(c, status, msg, NULL, NULL);
    }
    serve_gen_params gp;
    serve_gen_params_of(&g->rq, g->chat, ids, n, max_gen, &gp);
    serve_status st = serve_engine_submit(srv.engine, &gp, &reply_callbacks, g, &g->g, msg, sizeof msg);
    free(ids);
    switch (st) {
    case SERVE_OK:
        break;
    case SERVE_QUEUE_FULL:
    case SERVE_QUEUE_TIMEOUT:
        reply_free(g);
        snprintf(msg, sizeof msg, st == SERVE_QUEUE_FULL
                                      ? "all %lld slots are busy and %lld requests wait already (--max-queue): retry later"
                                      : "all %lld slots stayed busy for --queue-timeout %lld s: retry later",
                 (long long)srv.n_slots, st == SERVE_QUEUE_FULL ? (long long)srv.max_queue : (long long)srv.queue_timeout);
        return send_error(c, 503, msg, NULL, NULL);
    case SERVE_STOPPING:
        reply_free(g);
        return send_error(c, 503, "the server is shutting down", NULL, NULL);
    case SERVE_BAD_ATTN: {
        const char *bad = g->rq.attn != SERVE_ATTN_UNSET ? "attn" : "density";
        reply_free(g);
        return send_error(c, 400, msg, bad, NULL);
    }
    case SERVE_GONE: /* the prefill was cut: nobody to answer, or a 503 while stopping */
        pthread_mutex_lock(&srv.mu);
        srv.n_disconnects++;
        pthread_mutex_unlock(&srv.mu);
        reply_free(g);
        return atomic_load(&srv.stopping) ? send_error(c, 503, msg, NULL, NULL) : MHD_NO;
    case SERVE_FAILED:
    default:
        reply_free(g);
        return send_error(c, 500, msg, NULL, NULL);
    }
    if (g->rq.stream) {
        /* the stream outlives the request's handler: its memory goes with it (reply_free) */
        pthread_mutex_lock(&srv.mu);
        g->reserved = rc->reserved;
        rc->reserved = 0;
        pthread_mutex_unlock(&srv.mu);
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, g, stream_free);
        if (!r) {
            reply_free(g);
            return MHD_NO;
        }
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        if (atomic_load(&srv.stopping)) MHD_add_response_header(r, "Connection", "close");
        enum MHD_Result ret = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r); /* stream_free runs when the response is done with */
        return ret;
    }
    /* whole reply */
    while (reply_next(g)) {
    }
    if (g->info.gone) {
        pthread_mutex_lock(&srv.mu);
        srv.n_disconnects++;
        pthread_mutex_unlock(&srv.mu);
        note_done(g);
        reply_free(g);
        return MHD_NO;
    }
    note_done(g);
    if (g->error || g->view_oom) {
        snprintf(msg, sizeof msg, "%s", g->view_oom ? "out of memory" : g->err_msg);
        reply_free(g);
        return send_error(c, atomic_load(&srv.stopping) ? 503 : 500, msg, NULL, NULL);
    }
    json_t *o = serve_envelope(g, 0), *ch = json_array();
    json_array_append_new(ch, serve_choice(g, g->view ? g->view : "", g->view_len, 0, g->finish));
    json_object_set_new(o, "choices", ch);
    json_object_set_new(o, "usage", serve_usage_json(g));
    reply_free(g);
    return send_json(c, 200, o);
}

/* ------------------------------------------------------ other calls --- */

/* Appends s[0..n) to the growing buffer b (*len used of *cap, which the
 * caller reserved: it never grows past it). Returns 0, or -1 when it would. */
static int put_bytes(char *b, size_t *len, size_t cap, const char *s, size_t n) {
    if (*len + n + 1 > cap) return -1;
    memcpy(b + *len, s, n);
    *len += n;
    b[*len] = 0;
    return 0;
}

/* /tokenize and /detokenize. The tokenizer's work, the ids and the answer
 * are reserved against the memory pool before they are allocated; the
 * answer is written as text (a jansson array would cost some 50 bytes an
 * id), each piece escaped by jansson. */
static enum MHD_Result handle_tokenize(struct MHD_Connection *c, request_ctx *rc, serve_req_kind kind) {
    serve_limits lim = {srv.max_tokens, srv.n_ctx, srv.in->n_vocab};
    serve_request r;
    serve_error e;
    char msg[600];
    if (serve_request_parse(kind, rc->body, rc->len, &lim, &r, &e)) return send_error(c, 400, e.message, e.param, NULL);
    free(rc->body); /* parsed: its bytes stay reserved until the answer is sent */
    rc->body = NULL;
    if (kind == SERVE_REQ_DETOKENIZE) {
        /* the text (at most max_piece bytes an id), its UTF-8 cleaning (3x) and JSON (6x) */
        const size_t text = (size_t)r.n_ids * (size_t)srv.max_piece + 16;
        unsigned st = serve_mem_take(rc, 10 * text + 4096, "detokenizing", msg, sizeof msg);
        if (st) {
            serve_request_free(&r);
            return send_error(c, st, msg, NULL, NULL);
        }
        int64_t n = 0;
        dhsa_detokenize(srv.tok, r.ids, r.n_ids, 0, NULL, 0, &n);
        char *t = malloc((size_t)n + 1);
        if (!t || dhsa_detokenize(srv.tok, r.ids, r.n_ids, 0, t, n, &n)) {
            free(t);
            serve_request_free(&r);
            return send_error(c, 400, dhsa_last_error(), "tokens", NULL);
        }
        json_t *o = json_object();
        json_object_set_new(o, "content", serve_json_text(t, n));
        free(t);
        serve_request_free(&r);
        return send_json(c, 200, o);
    }
    unsigned flags = r.add_special ? (dhsa_tokenizer_default_flags(srv.tok) & DHSA_TOKENIZE_ADD_BOS) : 0;
    unsigned st = serve_mem_take(rc, (size_t)r.text_len * TOKENIZE_WORK_PER_BYTE + 4096, "tokenizing the content", msg,
                           sizeof msg);
    if (st) {
        serve_request_free(&r);
        return send_error(c, st, msg, "content", NULL);
    }
    int64_t n = 0;
    dhsa_status ts = dhsa_tokenize(srv.tok, r.text, r.text_len, flags, NULL, 0, &n); /* the count (cap 0) */
    if (ts == DHSA_ERR_INVALID_ARG && n > 0) ts = DHSA_OK;
    int32_t *ids = ts == DHSA_OK ? malloc((size_t)(n + 1) * sizeof(int32_t)) : NULL;
    if (!ids || dhsa_tokenize(srv.tok, r.text, r.text_len, flags, ids, n, &n)) {
        snprintf(msg, sizeof msg, "%s", ts == DHSA_OK && !ids ? "out of memory" : dhsa_last_error());
        free(ids);
        serve_request_free(&r);
        return send_error(c, ts == DHSA_OK && !ids ? 500 : 400, msg, "content", NULL);
    }
    const int with_pieces = r.with_pieces;
    serve_request_free(&r); /* the text is done with */
    /* an id is at most 10 digits and a comma; with pieces, {"id":..,"piece":".."} with the piece's
     * bytes escaped (U+FFFD for a bad byte: 3 bytes, or \uXXXX: 6) */
    const size_t per = with_pieces ? 32 + 6 * (size_t)srv.max_piece : 12;
    const size_t cap = (size_t)n * per + 64;
    st = serve_mem_take(rc, cap, "the answer", msg, sizeof msg);
    char *b = st ? NULL : malloc(cap);
    if (!b) {
        free(ids);
        return st ? send_error(c, st, msg, NULL, NULL) : send_error(c, 500, "out of memory", NULL, NULL);
    }
    size_t len = 0;
    int bad = put_bytes(b, &len, cap, "{\"tokens\":[", 11);
    for (int64_t i = 0; i < n && !bad; i++) {
        char num[48];
        if (!with_pieces) {
            int k = snprintf(num, sizeof num, "%s%d", i ? "," : "", ids[i]);
            bad = put_bytes(b, &len, cap, num, (size_t)k);
            continue;
        }
        char piece[512];
        int64_t pl = 0;
        if (dhsa_token_to_piece(srv.tok, ids[i], DHSA_DETOKENIZE_SPECIAL, piece, sizeof piece, &pl)) pl = 0;
        json_t *pj = serve_json_text(piece, pl);
        char *ps = pj ? json_dumps(pj, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
        json_decref(pj);
        int k = snprintf(num, sizeof num, "%s{\"id\":%d,\"piece\":", i ? "," : "", ids[i]);
        bad = !ps || put_bytes(b, &len, cap, num, (size_t)k) || put_bytes(b, &len, cap, ps, strlen(ps)) ||
              put_bytes(b, &len, cap, "}", 1);
        free(ps);
    }
    if (!bad) bad = put_bytes(b, &len, cap, "]}", 2);
    free(ids);
    if (bad) {
        free(b);
        return send_error(c, 500, "internal error: the answer outgrew its reserved size", NULL, NULL);
    }
    return send_text(c, 200, "application/json", b, len);
}

static enum MHD_Result handle_models(struct MHD_Connection *c) {
    json_t *m = json_object();
    json_object_set_new(m, "id", json_string(srv.model_name));
    json_object_set_new(m, "object", json_string("model"));
    json_object_set_new(m, "created", json_integer((json_int_t)srv.started));
    json_object_set_new(m, "owned_by", json_string("dhsa"));
    json_t *meta = json_object();
    json_object_set_new(meta, "n_ctx", json_integer(srv.n_ctx));
    json_object_set_new(meta, "n_ctx_train", json_integer(srv.in->n_ctx_train));
    json_object_set_new(meta, "n_vocab", json_integer(srv.in->n_vocab));
    json_object_set_new(meta, "n_params", json_integer(srv.in->n_params));
    json_object_set_new(meta, "slots", json_integer(srv.n_slots));
    json_object_set_new(meta, "attn", json_string(dhsa_attn_method_name(srv.sp.attn)));
    json_object_set_new(meta, "chat_template", json_string(dhsa_chat_template_name(srv.tmpl)));
    json_object_set_new(m, "meta", meta);
    json_t *d = json_array();
    json_array_append_new(d, m);
    json_t *o = json_object();
    json_object_set_new(o, "object", json_string("list"));
    json_object_set_new(o, "data", d);
    return send_json(c, 200, o);
}

static enum MHD_Result handle_health(struct MHD_Connection *c) {
    serve_engine_stats es;
    serve_engine_get_stats(srv.engine, &es);
    int64_t busy = es.n_busy, queued = es.n_queued;
    int stopping = atomic_load(&srv.stopping);
    json_t *o = json_object();
    json_object_set_new(o, "status", json_string(stopping ? "stopping" : "ok"));
    json_object_set_new(o, "slots_idle", json_integer(srv.n_slots - busy));
    json_object_set_new(o, "slots_busy", json_integer(busy));
    json_object_set_new(o, "requests_queued", json_integer(queued));
    return send_json(c, stopping ? 503 : 200, o);
}

static enum MHD_Result handle_metrics(struct MHD_Connection *c) {
    pthread_mutex_lock(&srv.mu);
    server m = srv; /* a copy of the counters */
    pthread_mutex_unlock(&srv.mu);
    serve_engine_stats es;
    serve_engine_get_stats(srv.engine, &es);
    size_t cap = 12288;
    char *b = malloc(cap);
    if (!b) return send_error(c, 500, "out of memory", NULL, NULL);
    static const char *names[5] = {"chat", "completions", "tokenize", "detokenize", "other"};
    size_t k = 0;
#define OUT(...) k += (size_t)snprintf(b + k, k < cap ? cap - k : 0, __VA_ARGS__)
    OUT("# HELP dhsa_requests_total Requests received, by endpoint.\n# TYPE dhsa_requests_total counter\n");
    for (int i = 0; i < 5; i++) OUT("dhsa_requests_total{endpoint=\"%s\"} %" PRIu64 "\n", names[i], m.n_requests[i]);
    OUT("# HELP dhsa_request_errors_total Requests answered with an error.\n# TYPE dhsa_request_errors_total counter\n"
        "dhsa_request_errors_total %" PRIu64 "\n", m.n_errors);
    OUT("# HELP dhsa_client_disconnects_total Generations stopped because the client went away.\n"
        "# TYPE dhsa_client_disconnects_total counter\ndhsa_client_disconnects_total %" PRIu64 "\n", m.n_disconnects);
    OUT("# HELP dhsa_prompt_tokens_total Prompt tokens of the requests (cached ones included).\n"
        "# TYPE dhsa_prompt_tokens_total counter\ndhsa_prompt_tokens_total %" PRIu64 "\n", es.prompt_tokens);
    OUT("# HELP dhsa_prompt_tokens_cached_total Prompt tokens taken from a slot's cache.\n"
        "# TYPE dhsa_prompt_tokens_cached_total counter\ndhsa_prompt_tokens_cached_total %" PRIu64 "\n", es.cached_tokens);
    OUT("# HELP dhsa_cache_hits_total Requests that reused a cached prefix.\n# TYPE dhsa_cache_hits_total counter\n"
        "dhsa_cache_hits_total %" PRIu64 "\n", es.n_cache_hits);
    OUT("# HELP dhsa_generated_tokens_total Tokens generated.\n# TYPE dhsa_generated_tokens_total counter\n"
        "dhsa_generated_tokens_total %" PRIu64 "\n", es.gen_tokens);
    OUT("# HELP dhsa_prefill_seconds_total Time in prompt evaluation.\n# TYPE dhsa_prefill_seconds_total counter\n"
        "dhsa_prefill_seconds_total %.6f\n", es.prefill_s);
    OUT("# HELP dhsa_decode_seconds_total Time in decode steps.\n# TYPE dhsa_decode_seconds_total counter\n"
        "dhsa_decode_seconds_total %.6f\n", es.decode_s);
    uint64_t evaluated = es.prompt_tokens - es.cached_tokens;
    OUT("# HELP dhsa_prefill_tokens_per_second Evaluated prompt tokens per second of serve_prefill, since start.\n"
        "# TYPE dhsa_prefill_tokens_per_second gauge\ndhsa_prefill_tokens_per_second %.3f\n",
        es.prefill_s > 0 ? (double)evaluated / es.prefill_s : 0.0);
    OUT("# HELP dhsa_decode_tokens_per_second Decode steps per second of one slot, since start.\n"
        "# TYPE dhsa_decode_tokens_per_second gauge\ndhsa_decode_tokens_per_second %.3f\n",
        es.decode_s > 0 ? (double)es.gen_tokens / es.decode_s : 0.0);
    OUT("# HELP dhsa_decode_batches_total Batched decode passes (--batch on).\n# TYPE dhsa_decode_batches_total counter\n"
        "dhsa_decode_batches_total %" PRIu64 "\n", es.n_batches);
    OUT("# HELP dhsa_decode_batch_rows_total Decode steps run in those passes (rows / passes = mean batch).\n"
        "# TYPE dhsa_decode_batch_rows_total counter\ndhsa_decode_batch_rows_total %" PRIu64 "\n", es.n_batch_rows);
    OUT("# HELP dhsa_decode_batch_eval_seconds_total Time of those passes in dhsa_session_eval_batch.\n"
        "# TYPE dhsa_decode_batch_eval_seconds_total counter\ndhsa_decode_batch_eval_seconds_total %.6f\n",
        es.batch_eval_s);
    OUT("# HELP dhsa_decode_batch_sample_seconds_total Time the batcher spent between those passes on the rows' "
        "per-token work (sampling, stop checks, text).\n"
        "# TYPE dhsa_decode_batch_sample_seconds_total counter\ndhsa_decode_batch_sample_seconds_total %.6f\n",
        es.batch_sample_s);
    OUT("# HELP dhsa_slots Slots (sessions served at once).\n# TYPE dhsa_slots gauge\ndhsa_slots %lld\n",
        (long long)es.n_slots);
    OUT("# HELP dhsa_slots_busy Slots serving a request.\n# TYPE dhsa_slots_busy gauge\ndhsa_slots_busy %lld\n",
        (long long)es.n_busy);
    OUT("# HELP dhsa_requests_queued Requests waiting for a slot.\n# TYPE dhsa_requests_queued gauge\n"
        "dhsa_requests_queued %lld\n", (long long)es.n_queued);
    OUT("# HELP dhsa_request_memory_pool_bytes What --mem-limit leaves for requests (0: no limit).\n"
        "# TYPE dhsa_request_memory_pool_bytes gauge\ndhsa_request_memory_pool_bytes %zu\n", m.mem_pool);
    OUT("# HELP dhsa_request_memory_reserved_bytes Memory the requests in flight have reserved from it.\n"
        "# TYPE dhsa_request_memory_reserved_bytes gauge\ndhsa_request_memory_reserved_bytes %zu\n", m.mem_used);
    OUT("# HELP dhsa_request_memory_reserved_peak_bytes The most reserved at once since start.\n"
        "# TYPE dhsa_request_memory_reserved_peak_bytes gauge\ndhsa_request_memory_reserved_peak_bytes %zu\n", m.mem_peak);
    OUT("# HELP dhsa_request_memory_refused_total Requests refused (413 or 503) because the pool could not hold them.\n"
        "# TYPE dhsa_request_memory_refused_total counter\ndhsa_request_memory_refused_total %" PRIu64 "\n",
        m.n_mem_refused);
    pthread_mutex_lock(&srv.conn_mu);
    const int64_t n_conns = srv.n_conns;
    const uint64_t n_evicted = srv.n_conn_evicted, n_conn_refused = srv.n_conn_refused;
    pthread_mutex_unlock(&srv.conn_mu);
    OUT("# HELP dhsa_connections Open connections.\n# TYPE dhsa_connections gauge\ndhsa_connections %lld\n",
        (long long)n_conns);
    OUT("# HELP dhsa_connections_evicted_total Idle connections closed to let a new one in (the server was full).\n"
        "# TYPE dhsa_connections_evicted_total counter\ndhsa_connections_evicted_total %" PRIu64 "\n", n_evicted);
    OUT("# HELP dhsa_connections_refused_total New connections closed at once: full, and none idle.\n"
        "# TYPE dhsa_connections_refused_total counter\ndhsa_connections_refused_total %" PRIu64 "\n", n_conn_refused);
    OUT("# HELP dhsa_resident_bytes Resident memory of the process.\n# TYPE dhsa_resident_bytes gauge\n"
        "dhsa_resident_bytes %zu\n", dhsa_proc_rss());
#undef OUT
    if (k >= cap) {
        free(b);
        return send_error(c, 500, "metrics: buffer too small", NULL, NULL);
    }
    return send_text(c, 200, "text/plain; version=0.0.4", b, k);
}

/* ------------------------------------------------------ connections --- */

static conn_rec *conn_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? (conn_rec *)ci->socket_context : NULL;
}

static void conn_mark(struct MHD_Connection *c, int in_request) {
    conn_rec *k = conn_of(c);
    if (!k) return;
    pthread_mutex_lock(&srv.conn_mu);
    k->in_request = in_request;
    if (!in_request) k->idle_since = serve_now_s();
    pthread_mutex_unlock(&srv.conn_mu);
}

void serve_on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe) {
    (void)cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        conn_rec *k = calloc(1, sizeof *k);
        if (!k) return; /* not tracked: never evicted, not counted */
        k->fd = connection_fd(c);
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        if (ci && ci->client_addr && ci->client_addr->sa_family == AF_INET)
            k->ip = ((const struct sockaddr_in *)(const void *)ci->client_addr)->sin_addr.s_addr;
        k->idle_since = serve_now_s();
        pthread_mutex_lock(&srv.conn_mu);
        k->next = srv.conns;
        if (srv.conns) srv.conns->prev = k;
        srv.conns = k;
        srv.n_conns++;
        pthread_mutex_unlock(&srv.conn_mu);
        *socket_context = k;
        return;
    }
    conn_rec *k = *socket_context;
    if (!k) return;
    pthread_mutex_lock(&srv.conn_mu);
    if (k->prev) k->prev->next = k->next;
    else srv.conns = k->next;
    if (k->next) k->next->prev = k->prev;
    srv.n_conns--;
    pthread_mutex_unlock(&srv.conn_mu);
    free(k);
    *socket_context = NULL;
}

/* A new connection (libmicrohttpd's accept policy). Under the limits it is
 * let in. At --max-connections (or --max-connections-per-ip for its
 * address) the connection that has been idle the longest, with no request
 * in flight for at least FULL_IDLE_S (the server's short idle timeout
 * while it is full), of that address when the address is at its limit,
 * is shut down and the new one let in; when there is none, the new one is
 * closed at once (the client sees its connection end, not a minute's
 * hang). */
enum MHD_Result serve_on_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen) {
    (void)cls;
    uint32_t ip = 0;
    if (addr && addrlen >= (socklen_t)sizeof(struct sockaddr_in) && addr->sa_family == AF_INET)
        ip = ((const struct sockaddr_in *)(const void *)addr)->sin_addr.s_addr;
    const double now = serve_now_s();
    enum MHD_Result ok = MHD_YES;
    pthread_mutex_lock(&srv.conn_mu);
    int64_t same = 0, live = 0;
    for (conn_rec *k = srv.conns; k; k = k->next) {
        live += !k->evicted;
        same += !k->evicted && k->ip == ip;
    }
    const int ip_full = srv.max_conn_ip > 0 && same >= srv.max_conn_ip, full = live >= srv.max_conn;
    if (full || ip_full) {
        conn_rec *victim = NULL;
        for (conn_rec *k = srv.conns; k; k = k->next)
            if (!k->in_request && !k->evicted && k->fd >= 0 && (!ip_full || k->ip == ip) &&
                now - k->idle_since >= FULL_IDLE_S && (!victim || k->idle_since < victim->idle_since))
                victim = k;
        if (victim) {
            shutdown(victim->fd, SHUT_RDWR); /* its thread sees the end and closes it */
            victim->evicted = 1;
            srv.n_conn_evicted++;
        } else {
            ok = MHD_NO;
            srv.n_conn_refused++;
        }
    }
    pthread_mutex_unlock(&srv.conn_mu);
    if (srv.verbose && (full || ip_full))
        fprintf(stderr, "dhsa serve: %s: %s\n", ip_full ? "--max-connections-per-ip reached" : "--max-connections reached",
                ok == MHD_YES ? "the longest idle connection closed for a new one" : "no idle connection: a new one refused");
    return ok;
}

/* ---------------------------------------------------------- routing --- */

void serve_request_done(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode t) {
    (void)cls;
    (void)t;
    request_ctx *r = *con_cls;
    if (r) {
        conn_mark(c, 0);
        free(r->body);
        serve_mem_give(&r->reserved);
        free(r);
        *con_cls = NULL;
        pthread_mutex_lock(&srv.mu);
        srv.n_active--;
        pthread_mutex_unlock(&srv.mu);
    }
}

/* Malformed headers that libmicrohttpd lets through to the handler (it
 * rejects others itself, docs/server.md): a name that is not an RFC 9110
 * token (empty, a space before the colon), a NUL in a value, a second
 * Content-Length, Content-Length with Transfer-Encoding (the two framings
 * a proxy in front could read differently), HTTP/1.1 without Host. */
typedef struct {
    char why[200];
    int n_length, n_host, n_te;
} header_check;

static int is_tchar(unsigned char ch) {
    return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
           (ch && strchr("!#$%&'*+-.^_`|~", ch) != NULL);
}

static enum MHD_Result check_header(void *cls, enum MHD_ValueKind kind, const char *key, size_t key_size,
                                    const char *value, size_t value_size) {
    (void)kind;
    header_check *h = cls;
    size_t i = 0;
    while (i < key_size && is_tchar((unsigned char)key[i])) i++;
    if (key_size == 0 || i < key_size) {
        snprintf(h->why, sizeof h->why, "malformed HTTP: the header name \"%.60s\" is not a token", key ? key : "");
        return MHD_NO;
    }
    if (value && memchr(value, 0, value_size)) {
        snprintf(h->why, sizeof h->why, "malformed HTTP: the header %.60s holds a NUL byte", key);
        return MHD_NO;
    }
    h->n_length += strcasecmp(key, "Content-Length") == 0;
    h->n_host += strcasecmp(key, "Host") == 0;
    h->n_te += strcasecmp(key, "Transfer-Encoding") == 0;
    return MHD_YES;
}

/* 1 with a sentence in why when the request's headers are malformed. */
static int malformed_headers(struct MHD_Connection *c, const char *version, char *why, size_t cap) {
    header_check h;
    memset(&h, 0, sizeof h);
    MHD_get_connection_values_n(c, MHD_HEADER_KIND, check_header, &h);
    if (!h.why[0] && h.n_length > 1)
        snprintf(h.why, sizeof h.why, "malformed HTTP: %d Content-Length headers", h.n_length);
    if (!h.why[0] && h.n_length && h.n_te)
        snprintf(h.why, sizeof h.why, "malformed HTTP: both Content-Length and Transfer-Encoding");
    if (!h.why[0] && h.n_host != 1 && version && strcmp(version, "HTTP/1.1") == 0)
        snprintf(h.why, sizeof h.why, "malformed HTTP: an HTTP/1.1 request needs exactly one Host header (%d)",
                 h.n_host);
    if (!h.why[0]) return 0;
    snprintf(why, cap, "%s", h.why);
    return 1;
}

enum MHD_Result serve_on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)cls;
    request_ctx *r = *con_cls;
    if (!r) {
        r = calloc(1, sizeof *r);
        if (!r) return MHD_NO;
        r->t0 = serve_now_s();
        *con_cls = r;
        pthread_mutex_lock(&srv.mu);
        srv.n_active++;
        pthread_mutex_unlock(&srv.mu);
        conn_mark(c, 1);
        char why[400];
        unsigned early = 0;
        const char *ecode = NULL;
        if (malformed_headers(c, version, why, sizeof why)) {
            early = 400;
            ecode = "malformed_http";
        } else {
            /* the body's size from the headers, before a byte of it is
             * read: over --max-body or the memory pool it is answered at
             * once (and not read) */
            const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
            if (cl) {
                char *end = NULL;
                errno = 0;
                unsigned long long n = strtoull(cl, &end, 10); /* libmicrohttpd has checked the digits */
                if (errno || end == cl || n > (unsigned long long)srv.max_body) {
                    early = 413;
                    snprintf(why, sizeof why, "the request body of %s bytes is larger than --max-body %lld bytes", cl,
                             (long long)srv.max_body);
                } else if (n > 0) {
                    early = serve_mem_take(r, (size_t)n + 1, "the request body", why, sizeof why);
                    if (!early) {
                        r->body = malloc((size_t)n + 1);
                        if (!r->body) return MHD_NO;
                        r->cap = (size_t)n + 1;
                    }
                }
            }
        }
        if (!early) return MHD_YES;
        r->handled = 1; /* answered before the body; the connection is closed after it */
        pthread_mutex_lock(&srv.mu);
        srv.n_errors++;
        pthread_mutex_unlock(&srv.mu);
        if (srv.verbose) fprintf(stderr, "dhsa serve: %u %s\n", early, why);
        json_t *e = serve_error_object(early, why, NULL, ecode);
        char *js = e ? json_dumps(e, JSON_COMPACT) : NULL;
        json_decref(e);
        if (!js) return MHD_NO;
        return send_text_opt(c, early, "application/json", js, strlen(js), 1);
    }
    if (*upload_size) { /* a piece of the body */
        if (!r->too_large && !r->handled) {
            if (r->len + *upload_size > (size_t)srv.max_body) {
                r->too_large = 413;
            } else if (r->len + *upload_size + 1 > r->cap) {
                /* chunked (no Content-Length), or more than it said: the
                 * buffer grows, each growth taken from the pool first */
                size_t cap = r->cap ? r->cap : 4096;
                while (cap < r->len + *upload_size + 1) cap *= 2;
                if (cap > (size_t)srv.max_body + 1) cap = (size_t)srv.max_body + 1;
                char msg[400];
                unsigned st = serve_mem_take(r, cap - r->cap, "the request body", msg, sizeof msg);
                char *b = st ? NULL : realloc(r->body, cap);
                if (st) {
                    r->too_large = (int)st;
                } else if (!b) {
                    return MHD_NO;
                } else {
                    r->body = b;
                    r->cap = cap;
                }
            }
            if (r->too_large) { /* the rest is read and dropped */
                free(r->body);
                r->body = NULL;
                r->len = r->cap = 0;
            } else {
                memcpy(r->body + r->len, upload, *upload_size);
                r->len += *upload_size;
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (r->handled) return MHD_YES;
    r->handled = 1;
    int post = strcmp(method, "POST") == 0, get = strcmp(method, "GET") == 0;
    int ep = strcmp(url, "/v1/chat/completions") == 0 ? 0
             : strcmp(url, "/v1/completions") == 0    ? 1
             : strcmp(url, "/tokenize") == 0          ? 2
             : strcmp(url, "/detokenize") == 0        ? 3
                                                      : 4;
    pthread_mutex_lock(&srv.mu);
    srv.n_requests[ep]++;
    pthread_mutex_unlock(&srv.mu);
    if (atomic_load(&srv.stopping) && ep < 4) return send_error(c, 503, "the server is shutting down", NULL, NULL);
    if (r->too_large) {
        char msg[300];
        if (r->too_large == 413)
            snprintf(msg, sizeof msg, "the request body is larger than --max-body %lld bytes", (long long)srv.max_body);
        else
            snprintf(msg, sizeof msg, "the request body did not fit the memory other requests serve_leave under --mem-limit "
                     "now: retry later");
        return send_error(c, (unsigned)r->too_large, msg, NULL, NULL);
    }
    if (ep < 4 && !post) return send_error(c, 405, "this endpoint takes POST", NULL, NULL);
    if (ep <= 3) { /* what parsing the body takes, before it is parsed */
        char msg[400];
        unsigned st = serve_mem_take(r, serve_json_cost(r->body, r->len), "parsing the request body", msg, sizeof msg);
        if (st) return send_error(c, st, msg, NULL, NULL);
    }
    if (ep == 0 || ep == 1) return handle_generate(c, r, ep == 0 ? SERVE_REQ_CHAT : SERVE_REQ_COMPLETION);
    if (ep == 2 || ep == 3) return handle_tokenize(c, r, ep == 2 ? SERVE_REQ_TOKENIZE : SERVE_REQ_DETOKENIZE);
    int known_get = strcmp(url, "/health") == 0 || strcmp(url, "/metrics") == 0 || strcmp(url, "/v1/models") == 0;
    if (known_get && !get) return send_error(c, 405, "this endpoint takes GET", NULL, NULL);
    if (strcmp(url, "/health") == 0) return handle_health(c);
    if (strcmp(url, "/metrics") == 0) return handle_metrics(c);
    if (strcmp(url, "/v1/models") == 0) return handle_models(c);
    char msg[400];
    snprintf(msg, sizeof msg, "no endpoint %.200s (POST /v1/chat/completions, /v1/completions, /tokenize, "
             "/detokenize; GET /v1/models, /health, /metrics)", url);
    return send_error(c, 404, msg, NULL, NULL);
}
#else
typedef int dhsa_serve_http_unused; /* built without libmicrohttpd and jansson: main.c refuses */
#endif
