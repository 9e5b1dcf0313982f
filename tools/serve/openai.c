/* openai.c: the OpenAI mapping of `dhsa serve` (docs/server.md): a parsed
 * request (request.c) into the prompt's ids (chat templates) and the
 * engine's params (sampling, stops, response_format), and the JSON of
 * replies, stream chunks, usage and errors, with UTF-8 cleaning of the
 * generated text. Tested through the server by tests/test_serve.c and
 * python/tests/test_serve_openai.py.
 */
#ifdef DHSA_HAVE_SERVE
#include "server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------- helpers --- */

double serve_now_s(void) { return dhsa_cli_now(); }

/* UTF-8: the length of the valid sequence at s[0..n), 0 when invalid, -1
 * when s is a valid but incomplete start (more bytes may complete it). */
static int utf8_seq(const unsigned char *s, int64_t n) {
    unsigned c = s[0];
    int len;
    unsigned min;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) len = 2, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF) len = 3, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4) len = 4, min = 0x10000;
    else return 0;
    unsigned cp = c & (0x3Fu >> (len - 1));
    for (int i = 1; i < len; i++) {
        if (i >= n) return -1;
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
        /* reject overlong / surrogate / > U+10FFFF as soon as they show */
        if (i == 1 && ((len == 3 && c == 0xE0 && s[1] < 0xA0) || (len == 3 && c == 0xED && s[1] > 0x9F) ||
                       (len == 4 && c == 0xF0 && s[1] < 0x90) || (len == 4 && c == 0xF4 && s[1] > 0x8F)))
            return 0;
    }
    return cp >= min ? len : 0;
}

/* Valid UTF-8 of s[0..n) into a malloc'd string: invalid bytes become
 * U+FFFD. An incomplete sequence at the end is left out when keep_tail is
 * 0 and *used says how many input bytes were taken. */
char *serve_utf8_clean(const char *s, int64_t n, int final, int64_t *used, int64_t *out_len) {
    char *o = malloc((size_t)n * 3 + 1);
    int64_t i = 0, k = 0;
    if (!o) return NULL;
    while (i < n) {
        int l = utf8_seq((const unsigned char *)s + i, n - i);
        if (l < 0 && !final) break;
        if (l <= 0) {
            memcpy(o + k, "\xEF\xBF\xBD", 3);
            k += 3;
            i++;
            continue;
        }
        memcpy(o + k, s + i, (size_t)l);
        k += l;
        i += l;
    }
    o[k] = 0;
    if (used) *used = i;
    if (out_len) *out_len = k;
    return o;
}

json_t *serve_json_text(const char *s, int64_t n) {
    int64_t len = 0;
    char *c = serve_utf8_clean(s, n, 1, NULL, &len);
    json_t *j = c ? json_stringn(c, (size_t)len) : NULL;
    free(c);
    return j ? j : json_string("");
}

json_t *serve_error_object(unsigned code, const char *message, const char *param, const char *err_code) {
    const char *type = code == 400 || code == 404 || code == 405 || code == 413 ? "invalid_request_error"
                       : code == 503                                          ? "server_busy"
                                                                              : "server_error";
    json_t *e = json_object();
    json_object_set_new(e, "message", serve_json_text(message, (int64_t)strlen(message)));
    json_object_set_new(e, "type", json_string(type));
    json_object_set_new(e, "param", param && param[0] ? json_string(param) : json_null());
    json_object_set_new(e, "code", err_code ? json_string(err_code) : json_null());
    json_t *o = json_object();
    json_object_set_new(o, "error", e);
    return o;
}

json_t *serve_usage_json(const reply *g) {
    json_t *u = json_object();
    json_object_set_new(u, "prompt_tokens", json_integer(g->info.n_prompt));
    json_object_set_new(u, "completion_tokens", json_integer(g->info.n_gen));
    json_object_set_new(u, "total_tokens", json_integer(g->info.n_prompt + g->info.n_gen));
    json_t *d = json_object();
    json_object_set_new(d, "cached_tokens", json_integer(g->info.n_reused));
    json_object_set_new(u, "prompt_tokens_details", d);
    return u;
}

json_t *serve_envelope(const reply *g, int chunk) {
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(g->id));
    json_object_set_new(o, "object", json_string(g->chat ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                                         : "text_completion"));
    json_object_set_new(o, "created", json_integer((json_int_t)g->created));
    json_object_set_new(o, "model", json_string(srv.model_name));
    json_object_set_new(o, "system_fingerprint", json_string("dhsa-" DHSA_VERSION));
    return o;
}

/* The serve_choice of a stream chunk (text may be NULL) or of the whole reply. */
json_t *serve_choice(const reply *g, const char *text, int64_t n, int chunk, const char *finish) {
    json_t *c = json_object();
    json_object_set_new(c, "index", json_integer(0));
    if (g->chat) {
        json_t *m = json_object();
        if (!chunk || !g->role_sent) json_object_set_new(m, "role", json_string("assistant"));
        if (text) json_object_set_new(m, "content", serve_json_text(text, n));
        json_object_set_new(c, chunk ? "delta" : "message", m);
    } else {
        json_object_set_new(c, "text", serve_json_text(text ? text : "", text ? n : 0));
    }
    json_object_set_new(c, "logprobs", json_null());
    json_object_set_new(c, "finish_reason", finish ? json_string(finish) : json_null());
    return c;
}

/* Adds "data: <json>\n\n" to the stream's pending bytes. */
int serve_push_event(reply *g, json_t *j) {
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!s) return -1;
    size_t n = strlen(s), need = g->pend_len + n + 8;
    char *p = realloc(g->pend, need + 1);
    if (!p) {
        free(s);
        return -1;
    }
    g->pend = p;
    memcpy(p + g->pend_len, "data: ", 6);
    memcpy(p + g->pend_len + 6, s, n);
    memcpy(p + g->pend_len + 6 + n, "\n\n", 2);
    g->pend_len += n + 8;
    free(s);
    return 0;
}

/* Builds the prompt's ids for a chat or completion request. Returns 0 or
 * an HTTP status with msg/param/code. */
unsigned serve_prompt_ids(const serve_request *r, int32_t **ids, int64_t *n, char *msg, size_t cap,
                          const char **param, const char **code) {
    unsigned flags = dhsa_tokenizer_default_flags(srv.tok) & DHSA_TOKENIZE_ADD_BOS;
    *param = NULL;
    *code = NULL;
    if (r->kind == SERVE_REQ_COMPLETION && r->has_ids) {
        *ids = malloc((size_t)(r->n_ids + 1) * sizeof(int32_t));
        if (!*ids) return snprintf(msg, cap, "out of memory"), 500;
        memcpy(*ids, r->ids, (size_t)r->n_ids * sizeof(int32_t));
        *n = r->n_ids;
        if (*n < 1) { /* serve_request_parse refuses it already */
            *param = "prompt";
            return snprintf(msg, cap, "prompt is empty: a completion needs at least one token of its own"), 400;
        }
        return 0;
    }
    if (r->kind == SERVE_REQ_CHAT) {
        if (srv.tmpl == DHSA_CHAT_NONE)
            return snprintf(msg, cap, "dhsa serve runs without a chat template (--template plain): start it "
                            "with --template llama3|chatml|qwen2.5|smollm2|gemma|mistral|llama2|phi3, or use "
                            "/v1/completions"), 400;
        dhsa_chat_message *cm = malloc((size_t)r->n_messages * sizeof *cm);
        if (!cm) return snprintf(msg, cap, "out of memory"), 500;
        for (int64_t i = 0; i < r->n_messages; i++) cm[i] = (dhsa_chat_message){r->messages[i].role, r->messages[i].content};
        /* the template's markers are special tokens, the messages plain
         * text: a client cannot forge a turn (docs/chat.md) */
        int64_t cnt = 0;
        *ids = NULL;
        dhsa_status st = dhsa_chat_tokenize(srv.tmpl, srv.tok, cm, r->n_messages, 1, flags, NULL, 0, &cnt);
        if (st == DHSA_OK || (st == DHSA_ERR_INVALID_ARG && cnt > 0)) {
            *ids = malloc((size_t)(cnt + 1) * sizeof(int32_t));
            st = *ids ? dhsa_chat_tokenize(srv.tmpl, srv.tok, cm, r->n_messages, 1, flags, *ids, cnt, n)
                      : DHSA_ERR_OUT_OF_MEMORY;
        }
        free(cm);
        if (st) {
            snprintf(msg, cap, "%s", st == DHSA_ERR_OUT_OF_MEMORY && !*ids ? "out of memory" : dhsa_last_error());
            free(*ids);
            *ids = NULL;
            *param = "messages";
            return st == DHSA_ERR_OUT_OF_MEMORY ? 500 : 400;
        }
        if (*n == 0) {
            *param = "messages";
            return snprintf(msg, cap, "the messages render to no tokens"), 400;
        }
        return 0;
    }
    const char *t = r->text;
    int64_t tl = r->text_len;
    int64_t cnt = 0;
    dhsa_status st = dhsa_tokenize(srv.tok, t, tl, flags, NULL, 0, &cnt);
    if (st != DHSA_OK && st != DHSA_ERR_INVALID_ARG) {
        snprintf(msg, cap, "tokenize: %s", dhsa_last_error());
        return 400;
    }
    *ids = malloc((size_t)(cnt + 1) * sizeof(int32_t));
    if (!*ids || dhsa_tokenize(srv.tok, t, tl, flags, *ids, cnt, n)) {
        snprintf(msg, cap, "tokenize: %s", *ids ? dhsa_last_error() : "out of memory");
        free(*ids);
        *ids = NULL;
        return 500;
    }
    /* the BOS the server adds is not a token of the client's own */
    const int bos_added = (flags & DHSA_TOKENIZE_ADD_BOS) && *n > 0 && (*ids)[0] == dhsa_tokenizer_bos(srv.tok);
    if (*n - bos_added < 1) {
        *param = "prompt";
        return snprintf(msg, cap, "the prompt tokenizes to nothing: a completion needs at least one token of its own"),
               400;
    }
    return 0;
}
/* The engine's params of a parsed request. */
void serve_gen_params_of(const serve_request *rq, int chat, const int32_t *ids, int64_t n, int64_t max_gen,
                         serve_gen_params *p) {
    memset(p, 0, sizeof *p);
    p->prompt = ids;
    p->n_prompt = n;
    p->max_gen = max_gen;
    /* stops: EOS, and the chat format's end-of-turn ids (with ignore_eos
     * they are masked instead: the engine's sample_next) */
    if (dhsa_tokenizer_eos(srv.tok) >= 0) p->stop_ids[p->n_stop_ids++] = dhsa_tokenizer_eos(srv.tok);
    if (chat)
        for (int i = 0; i < srv.n_chat_stop && p->n_stop_ids < SERVE_ENGINE_MAX_STOP_IDS; i++)
            p->stop_ids[p->n_stop_ids++] = srv.chat_stop[i];
    dhsa_sampler_params sp = dhsa_sampler_default_params();
    sp.temperature = (float)rq->temperature;
    sp.top_p = (float)rq->top_p;
    sp.min_p = (float)rq->min_p;
    sp.top_k = rq->top_k;
    sp.repeat_penalty = (float)rq->repeat_penalty;
    sp.repeat_last_n = rq->repeat_last_n;
    if (rq->seed_set) sp.seed = rq->seed;
    else { /* as OpenAI: a request without a seed gets its own */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        sp.seed = ((uint64_t)ts.tv_sec * 1000000007u) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)atomic_load(&srv.id_counter) << 32);
    }
    p->sampler = sp;
    p->presence_penalty = rq->presence_penalty;
    p->frequency_penalty = rq->frequency_penalty;
    p->ignore_eos = rq->ignore_eos;
    for (int i = 0; i < rq->n_stop && i < SERVE_ENGINE_MAX_STOP; i++) {
        p->stop[i] = rq->stop[i];
        p->stop_len[i] = rq->stop_len[i];
        p->n_stop++;
    }
    p->json = rq->json;
    p->json_schema = rq->json_schema;
    p->attn = rq->attn == SERVE_ATTN_UNSET ? SERVE_ENGINE_ATTN_UNSET : rq->attn;
    p->density = rq->density;
    p->strip_first_space = chat;
    p->wake_on_text = rq->stream;
}
#else
typedef int dhsa_serve_openai_unused; /* built without libmicrohttpd and jansson: main.c refuses */
#endif
