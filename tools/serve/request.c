/* serve_req.c: the request bodies of `dhsa serve` (tools/serve.h), parsed
 * with jansson and checked field by field: a type or range error names the
 * parameter, as OpenAI's 400 does. Every size is bounded before it is
 * allocated (message count, prompt ids, stop strings); the body itself is
 * bounded by the server (--max-body) before it gets here.
 * Tested by tests/test_serve.c (table of good and bad bodies) and
 * fuzz/serve_fuzz.c (any bytes, under ASan and UBSan).
 */
#ifdef DHSA_HAVE_SERVE
#include "serve.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dhsa.h"

static int fail(serve_error *e, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    return -1;
}

void serve_request_free(serve_request *r) {
    if (!r) return;
    for (int64_t i = 0; i < r->n_messages; i++) {
        free(r->messages[i].role);
        free(r->messages[i].content);
    }
    free(r->messages);
    free(r->text);
    free(r->ids);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    dhsa_json_schema_free(r->json_schema);
    memset(r, 0, sizeof *r);
}

static char *dup_n(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

/* A number field in [lo, hi]; null keeps the default. */
static int get_real(json_t *v, const char *name, double lo, double hi, double *out, serve_error *e) {
    if (json_is_null(v)) return 0;
    if (!json_is_number(v)) return fail(e, name, "%s must be a number", name);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) return fail(e, name, "%s is %g; it must be in [%g, %g]", name, x, lo, hi);
    *out = x;
    return 0;
}

/* An integer field in [lo, hi] (a real with an integral value counts). */
static int get_int(json_t *v, const char *name, int64_t lo, int64_t hi, int64_t *out, serve_error *e) {
    if (json_is_null(v)) return 0;
    int64_t x;
    if (json_is_integer(v)) {
        x = (int64_t)json_integer_value(v);
    } else if (json_is_real(v)) {
        double d = json_real_value(v);
        if (!(d == floor(d)) || !(fabs(d) < 9.0e18)) return fail(e, name, "%s must be an integer", name);
        x = (int64_t)d;
    } else {
        return fail(e, name, "%s must be an integer", name);
    }
    if (x < lo || x > hi)
        return fail(e, name, "%s is %lld; it must be in [%lld, %lld]", name, (long long)x, (long long)lo, (long long)hi);
    *out = x;
    return 0;
}

static int get_bool(json_t *v, const char *name, int *out, serve_error *e) {
    if (json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return fail(e, name, "%s must be true or false", name);
    *out = json_is_true(v);
    return 0;
}

/* Token ids: an array of integers in [0, n_vocab), at most max_ids. */
static int get_ids(json_t *v, const char *name, const serve_limits *lim, serve_request *r, serve_error *e) {
    size_t n = json_array_size(v);
    if ((int64_t)n > lim->max_ids)
        return fail(e, name, "%s has %zu token ids; at most %lld are taken", name, n, (long long)lim->max_ids);
    r->ids = malloc((n ? n : 1) * sizeof(int32_t));
    if (!r->ids) return fail(e, NULL, "out of memory for %zu token ids", n);
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_array_get(v, i);
        if (!json_is_integer(x)) return fail(e, name, "%s[%zu] must be an integer token id", name, i);
        json_int_t id = json_integer_value(x);
        if (id < 0 || id >= lim->n_vocab)
            return fail(e, name, "%s[%zu] is %lld, outside the vocabulary [0, %lld)", name, i, (long long)id,
                        (long long)lim->n_vocab);
        r->ids[i] = (int32_t)id;
    }
    r->n_ids = (int64_t)n;
    r->has_ids = 1;
    return 0;
}

static int is_int_array(json_t *v) {
    if (!json_is_array(v)) return 0;
    for (size_t i = 0; i < json_array_size(v); i++)
        if (!json_is_integer(json_array_get(v, i))) return 0;
    return 1;
}

/* The completion prompt: a string, [string], [ids] or [[ids]]. */
static int get_prompt(json_t *v, const serve_limits *lim, serve_request *r, serve_error *e) {
    /* an empty prompt would leave nothing of this request's own to sample
     * from (the BOS the server adds is not the client's): refused in every
     * form, "", [], [""], [[]] */
    if ((json_is_string(v) && json_string_length(v) == 0) || (json_is_array(v) && json_array_size(v) == 0) ||
        (json_is_array(v) && json_array_size(v) == 1 &&
         ((json_is_string(json_array_get(v, 0)) && json_string_length(json_array_get(v, 0)) == 0) ||
          (json_is_array(json_array_get(v, 0)) && json_array_size(json_array_get(v, 0)) == 0))))
        return fail(e, "prompt", "prompt is empty: a completion needs at least one token of its own");
    if (json_is_string(v)) {
        r->text_len = (int64_t)json_string_length(v);
        r->text = dup_n(json_string_value(v), (size_t)r->text_len);
        return r->text ? 0 : fail(e, NULL, "out of memory");
    }
    if (json_is_array(v)) {
        size_t n = json_array_size(v);
        if (n > 0 && is_int_array(v)) return get_ids(v, "prompt", lim, r, e);
        if (n == 1 && json_is_string(json_array_get(v, 0))) return get_prompt(json_array_get(v, 0), lim, r, e);
        if (n == 1 && is_int_array(json_array_get(v, 0))) return get_ids(json_array_get(v, 0), "prompt", lim, r, e);
        if (n > 1)
            return fail(e, "prompt", "prompt holds %zu prompts; dhsa serve completes one prompt per request", n);
    }
    return fail(e, "prompt", "prompt must be a string, an array of token ids, or an array holding one of them");
}

/* A message's content: a string, or an array of {"type": "text", "text": ...} parts (joined). */
static int get_content(json_t *v, size_t i, char **out, serve_error *e) {
    if (json_is_string(v)) {
        *out = dup_n(json_string_value(v), json_string_length(v));
        return *out ? 0 : fail(e, NULL, "out of memory");
    }
    if (!json_is_array(v)) return fail(e, "messages", "messages[%zu].content must be a string or an array of text parts", i);
    size_t total = 0;
    for (size_t k = 0; k < json_array_size(v); k++) {
        json_t *part = json_array_get(v, k), *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(type) || strcmp(json_string_value(type), "text") != 0 ||
            !json_is_string(text) || json_object_size(part) != 2)
            return fail(e, "messages", "messages[%zu].content[%zu] must be {\"type\": \"text\", \"text\": ...}: dhsa "
                        "serve takes text only", i, k);
        total += json_string_length(text);
    }
    char *s = malloc(total + 1);
    if (!s) return fail(e, NULL, "out of memory");
    size_t at = 0;
    for (size_t k = 0; k < json_array_size(v); k++) {
        json_t *text = json_object_get(json_array_get(v, k), "text");
        memcpy(s + at, json_string_value(text), json_string_length(text));
        at += json_string_length(text);
    }
    s[at] = 0;
    *out = s;
    return 0;
}

static int get_messages(json_t *v, serve_request *r, serve_error *e) {
    if (!json_is_array(v) || json_array_size(v) == 0)
        return fail(e, "messages", "messages must be a non-empty array of {\"role\": ..., \"content\": ...}");
    size_t n = json_array_size(v);
    if (n > SERVE_MAX_MESSAGES) return fail(e, "messages", "%zu messages; at most %d are taken", n, SERVE_MAX_MESSAGES);
    r->messages = calloc(n, sizeof *r->messages);
    if (!r->messages) return fail(e, NULL, "out of memory");
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(v, i);
        if (!json_is_object(m)) return fail(e, "messages", "messages[%zu] must be an object", i);
        const char *key;
        json_t *x;
        json_object_foreach(m, key, x) {
            if (strcmp(key, "role") != 0 && strcmp(key, "content") != 0)
                return fail(e, "messages", "messages[%zu].%s: dhsa serve takes role and content only (no names, "
                            "tool calls or images)", i, key);
        }
        json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
        if (!json_is_string(role)) return fail(e, "messages", "messages[%zu].role must be a string", i);
        const char *rs = json_string_value(role);
        if (strcmp(rs, "system") != 0 && strcmp(rs, "user") != 0 && strcmp(rs, "assistant") != 0 &&
            strcmp(rs, "developer") != 0)
            return fail(e, "messages", "messages[%zu].role is \"%.40s\"; dhsa serve takes system, developer, user "
                        "and assistant", i, rs);
        if (!content) return fail(e, "messages", "messages[%zu] has no content", i);
        r->n_messages = (int64_t)i + 1;
        /* developer is OpenAI's newer name for system */
        r->messages[i].role = dup_n(strcmp(rs, "developer") == 0 ? "system" : rs,
                                    strlen(strcmp(rs, "developer") == 0 ? "system" : rs));
        if (!r->messages[i].role) return fail(e, NULL, "out of memory");
        if (get_content(content, i, &r->messages[i].content, e)) return -1;
        total += strlen(r->messages[i].content);
    }
    /* the template's markers alone are not a conversation (as an empty
     * completion prompt, which is refused) */
    if (total == 0) return fail(e, "messages", "every message's content is empty: there is nothing to answer");
    return 0;
}

static int get_stop(json_t *v, serve_request *r, serve_error *e) {
    if (json_is_null(v)) return 0;
    json_t *one[1] = {v};
    size_t n = 1;
    json_t **items = one;
    json_t *arr[SERVE_MAX_STOP];
    if (json_is_array(v)) {
        n = json_array_size(v);
        if (n > SERVE_MAX_STOP) return fail(e, "stop", "stop has %zu strings; at most %d", n, SERVE_MAX_STOP);
        for (size_t i = 0; i < n; i++) arr[i] = json_array_get(v, i);
        items = arr;
    }
    for (size_t i = 0; i < n; i++) {
        if (!json_is_string(items[i])) return fail(e, "stop", "stop must be a string or an array of strings");
        size_t len = json_string_length(items[i]);
        if (len == 0) return fail(e, "stop", "a stop string is empty");
        if (len > SERVE_MAX_STOP_BYTES)
            return fail(e, "stop", "a stop string has %zu bytes; at most %d", len, SERVE_MAX_STOP_BYTES);
        r->stop[r->n_stop] = dup_n(json_string_value(items[i]), len);
        if (!r->stop[r->n_stop]) return fail(e, NULL, "out of memory");
        r->stop_len[r->n_stop++] = (int64_t)len;
    }
    return 0;
}

static int get_attn(json_t *v, serve_request *r, serve_error *e) {
    if (json_is_null(v)) return 0;
    if (json_is_string(v))
        for (int m = DHSA_ATTN_DENSE; m <= DHSA_ATTN_ORACLE; m++)
            if (strcmp(json_string_value(v), dhsa_attn_method_name((dhsa_attn_method)m)) == 0) {
                r->attn = m;
                return 0;
            }
    return fail(e, "attn", "attn must be \"dense\", \"dhsa\", \"block\", \"stream\" or \"oracle\"");
}

/* Fields OpenAI defines that dhsa serve takes only at their "off" value:
 * anything else is refused rather than ignored. */
static int off_value(const char *key, json_t *v, serve_error *e) {
    if (json_is_null(v)) return 0;
    if (strcmp(key, "n") == 0 || strcmp(key, "best_of") == 0) {
        if (json_is_integer(v) && json_integer_value(v) == 1) return 0;
        return fail(e, key, "%s must be 1: dhsa serve makes one choice per request", key);
    }
    if (strcmp(key, "logprobs") == 0 || strcmp(key, "echo") == 0 || strcmp(key, "store") == 0 ||
        strcmp(key, "parallel_tool_calls") == 0) {
        if (json_is_false(v) || (strcmp(key, "logprobs") == 0 && json_is_integer(v) && json_integer_value(v) == 0))
            return 0;
        return fail(e, key, "%s is not supported by dhsa serve", key);
    }
    if (strcmp(key, "top_logprobs") == 0) {
        if (json_is_integer(v) && json_integer_value(v) == 0) return 0;
        return fail(e, key, "top_logprobs is not supported by dhsa serve");
    }
    if (strcmp(key, "logit_bias") == 0 || strcmp(key, "metadata") == 0) {
        if (json_is_object(v) && json_object_size(v) == 0) return 0;
        return fail(e, key, "%s is not supported by dhsa serve", key);
    }
    if (strcmp(key, "tools") == 0 || strcmp(key, "functions") == 0) {
        if (json_is_array(v) && json_array_size(v) == 0) return 0;
        return fail(e, key, "%s: dhsa serve does not call tools", key);
    }
    if (strcmp(key, "tool_choice") == 0 || strcmp(key, "function_call") == 0) {
        if (json_is_string(v) && strcmp(json_string_value(v), "none") == 0) return 0;
        return fail(e, key, "%s: dhsa serve does not call tools", key);
    }
    if (strcmp(key, "suffix") == 0) {
        if (json_is_string(v) && json_string_length(v) == 0) return 0;
        return fail(e, key, "suffix (insertion) is not supported by dhsa serve");
    }
    return 1; /* not one of them */
}

/* response_format: {"type": "text"}, {"type": "json_object"} or
 * {"type": "json_schema", "json_schema": {"name": ..., "schema": {...},
 * "strict": ..., "description": ...}}; the schema is compiled here, so that
 * one outside the subset is a 400 naming the keyword (docs/server.md). */
static int get_response_format(json_t *v, serve_request *r, serve_error *e) {
    const char *p = "response_format";
    if (json_is_null(v)) return 0;
    json_t *t = json_object_get(v, "type");
    if (!json_is_object(v) || !json_is_string(t))
        return fail(e, p, "response_format must be an object with a type: \"text\", \"json_object\" or \"json_schema\"");
    const char *type = json_string_value(t), *key;
    json_t *x;
    json_object_foreach(v, key, x) {
        if (strcmp(key, "type") != 0 && !(strcmp(type, "json_schema") == 0 && strcmp(key, "json_schema") == 0))
            return fail(e, p, "response_format.%.40s is not supported with type \"%.20s\"", key, type);
    }
    if (strcmp(type, "text") == 0) return 0;
    if (strcmp(type, "json_object") == 0) {
        r->json = 1;
        return 0;
    }
    if (strcmp(type, "json_schema") != 0)
        return fail(e, p, "response_format.type \"%.40s\": dhsa serve takes text, json_object and json_schema", type);
    json_t *js = json_object_get(v, "json_schema");
    if (!json_is_object(js)) return fail(e, p, "response_format.json_schema must be an object holding the schema");
    json_object_foreach(js, key, x) {
        if (strcmp(key, "name") == 0 || strcmp(key, "description") == 0) {
            if (!json_is_string(x)) return fail(e, p, "response_format.json_schema.%s must be a string", key);
        } else if (strcmp(key, "strict") == 0) {
            /* strict or not, the answer follows the schema: sampling is constrained */
            if (!json_is_boolean(x) && !json_is_null(x))
                return fail(e, p, "response_format.json_schema.strict must be true or false");
        } else if (strcmp(key, "schema") != 0) {
            return fail(e, p, "response_format.json_schema.%.40s is not supported (name, description, schema, "
                        "strict are)", key);
        }
    }
    json_t *schema = json_object_get(js, "schema");
    if (!schema) return fail(e, p, "response_format.json_schema.schema is required");
    char *text = json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!text) return fail(e, NULL, "out of memory");
    dhsa_status st = dhsa_json_schema_compile(text, (int64_t)strlen(text), &r->json_schema);
    free(text);
    if (st) return fail(e, p, "response_format.json_schema.schema: %s", dhsa_last_error());
    r->json = 1;
    return 0;
}

static int parse_generate(json_t *root, serve_req_kind kind, const serve_limits *lim, serve_request *r,
                          serve_error *e) {
    const char *key;
    json_t *v;
    int have_input = 0;
    json_t *stream_options = NULL;
    json_object_foreach(root, key, v) {
        int rc = 0;
        if (strcmp(key, "messages") == 0 && kind == SERVE_REQ_CHAT) {
            rc = get_messages(v, r, e);
            have_input = 1;
        } else if (strcmp(key, "prompt") == 0 && kind == SERVE_REQ_COMPLETION) {
            rc = get_prompt(v, lim, r, e);
            have_input = 1;
        } else if (strcmp(key, "model") == 0) {
            if (!json_is_string(v) && !json_is_null(v)) rc = fail(e, key, "model must be a string");
            else if (json_is_string(v)) snprintf(r->model, sizeof r->model, "%s", json_string_value(v));
        } else if (strcmp(key, "stream") == 0) rc = get_bool(v, key, &r->stream, e);
        else if (strcmp(key, "stream_options") == 0) stream_options = v;
        else if (strcmp(key, "max_tokens") == 0 || (strcmp(key, "max_completion_tokens") == 0 && kind == SERVE_REQ_CHAT))
            rc = get_int(v, key, 0, lim->max_tokens, &r->max_tokens, e);
        else if (strcmp(key, "temperature") == 0) rc = get_real(v, key, 0, 2, &r->temperature, e);
        else if (strcmp(key, "top_p") == 0) rc = get_real(v, key, 1e-9, 1, &r->top_p, e);
        else if (strcmp(key, "min_p") == 0) rc = get_real(v, key, 0, 1, &r->min_p, e);
        else if (strcmp(key, "top_k") == 0) rc = get_int(v, key, 0, (int64_t)1 << 24, &r->top_k, e);
        else if (strcmp(key, "repeat_penalty") == 0) rc = get_real(v, key, 1e-6, 1e6, &r->repeat_penalty, e);
        else if (strcmp(key, "repeat_last_n") == 0) rc = get_int(v, key, 0, (int64_t)1 << 31, &r->repeat_last_n, e);
        else if (strcmp(key, "presence_penalty") == 0) rc = get_real(v, key, -2, 2, &r->presence_penalty, e);
        else if (strcmp(key, "frequency_penalty") == 0) rc = get_real(v, key, -2, 2, &r->frequency_penalty, e);
        else if (strcmp(key, "seed") == 0) {
            int64_t s = 0;
            rc = get_int(v, key, INT64_MIN, INT64_MAX, &s, e);
            if (!rc && !json_is_null(v)) {
                r->seed = (uint64_t)s;
                r->seed_set = 1;
            }
        } else if (strcmp(key, "stop") == 0) rc = get_stop(v, r, e);
        else if (strcmp(key, "ignore_eos") == 0) rc = get_bool(v, key, &r->ignore_eos, e); /* vLLM's, llama.cpp's */
        else if (strcmp(key, "attn") == 0) rc = get_attn(v, r, e);
        else if (strcmp(key, "response_format") == 0) rc = get_response_format(v, r, e);
        else if (strcmp(key, "density") == 0) rc = get_real(v, key, 1e-6, 1, &r->density, e);
        else if (strcmp(key, "user") == 0 || strcmp(key, "service_tier") == 0) {
            if (!json_is_string(v) && !json_is_null(v)) rc = fail(e, key, "%s must be a string", key);
        } else {
            int off = off_value(key, v, e);
            if (off < 0) rc = -1;
            else if (off > 0)
                rc = fail(e, key, "unknown parameter \"%.40s\" for %s (docs/server.md lists what dhsa serve takes)",
                          key, kind == SERVE_REQ_CHAT ? "/v1/chat/completions" : "/v1/completions");
        }
        if (rc) return -1;
    }
    if (!have_input)
        return fail(e, kind == SERVE_REQ_CHAT ? "messages" : "prompt", "%s is required",
                    kind == SERVE_REQ_CHAT ? "messages" : "prompt");
    /* a stop string would cut the JSON value short, and it would read as complete */
    if (r->json && r->n_stop)
        return fail(e, "stop", "stop strings with a JSON response_format would cut the value short: give one of them");
    if (stream_options && !json_is_null(stream_options)) {
        if (!r->stream) return fail(e, "stream_options", "stream_options is only allowed with stream: true");
        const char *k2;
        json_t *x;
        if (!json_is_object(stream_options)) return fail(e, "stream_options", "stream_options must be an object");
        json_object_foreach(stream_options, k2, x) {
            if (strcmp(k2, "include_usage") != 0)
                return fail(e, "stream_options", "stream_options.%.40s is not supported (include_usage is)", k2);
            if (get_bool(x, "stream_options.include_usage", &r->include_usage, e)) return -1;
        }
    }
    return 0;
}

static int parse_tokenize(json_t *root, serve_req_kind kind, const serve_limits *lim, serve_request *r,
                          serve_error *e) {
    const char *key;
    json_t *v;
    int have = 0;
    json_object_foreach(root, key, v) {
        int rc = 0;
        if (kind == SERVE_REQ_TOKENIZE && strcmp(key, "content") == 0) {
            if (!json_is_string(v)) rc = fail(e, key, "content must be a string");
            else {
                r->text_len = (int64_t)json_string_length(v);
                r->text = dup_n(json_string_value(v), (size_t)r->text_len);
                if (!r->text) rc = fail(e, NULL, "out of memory");
            }
            have = 1;
        } else if (kind == SERVE_REQ_TOKENIZE && strcmp(key, "add_special") == 0) rc = get_bool(v, key, &r->add_special, e);
        else if (kind == SERVE_REQ_TOKENIZE && strcmp(key, "with_pieces") == 0) rc = get_bool(v, key, &r->with_pieces, e);
        else if (kind == SERVE_REQ_DETOKENIZE && strcmp(key, "tokens") == 0) {
            if (!json_is_array(v)) rc = fail(e, key, "tokens must be an array of token ids");
            else rc = get_ids(v, "tokens", lim, r, e);
            have = 1;
        } else if (strcmp(key, "model") == 0) {
            if (!json_is_string(v) && !json_is_null(v)) rc = fail(e, key, "model must be a string");
        } else {
            rc = fail(e, key, "unknown parameter \"%.40s\" for %s", key,
                      kind == SERVE_REQ_TOKENIZE ? "/tokenize (content, add_special, with_pieces)"
                                                 : "/detokenize (tokens)");
        }
        if (rc) return -1;
    }
    if (!have) return fail(e, kind == SERVE_REQ_TOKENIZE ? "content" : "tokens", "%s is required",
                           kind == SERVE_REQ_TOKENIZE ? "content" : "tokens");
    return 0;
}

/* The cost model (tools/serve.h): jansson 2.14 on 64-bit glibc. A string
 * literal of r raw bytes: the lexer's buffer of its raw text (doubling: at
 * most 2r + 16, one at a time: the largest one, once), the decoded value
 * (at most r + 1 bytes, taken over by the json_t or copied once more as an
 * object key) and its 48-byte json_t; serve_request_parse's own copy of it
 * (r + 1). A number: its 32-byte json_t, a table slot, 4 bytes as a token
 * id. An array: 48 bytes and a table of 8-byte slots that doubles (16 per
 * element). An object: 96 bytes, 8 buckets of 16 bytes to start and a
 * pair of 64 bytes + its key per member, the buckets doubling (32 per
 * member). Each malloc'd block counts 16 bytes of glibc's header and
 * rounding. true, false and null are jansson's singletons. */
size_t serve_json_cost(const char *body, size_t len) {
    size_t strings = 0, max_raw = 0, n_strings = 0, n_numbers = 0, n_arrays = 0, n_objects = 0, n_values = 0;
    for (size_t i = 0; i < len;) {
        const char c = body[i];
        if (c == '"') {
            size_t j = i + 1;
            while (j < len && body[j] != '"') j += body[j] == '\\' ? 2 : 1;
            const size_t raw = (j < len ? j : len) - i - 1;
            strings += raw;
            if (raw > max_raw) max_raw = raw;
            n_strings++;
            n_values++;
            i = j + 1;
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            while (i < len && (body[i] == '-' || body[i] == '+' || body[i] == '.' || body[i] == 'e' || body[i] == 'E' ||
                               (body[i] >= '0' && body[i] <= '9')))
                i++;
            n_numbers++;
            n_values++;
        } else {
            n_arrays += c == '[';
            n_objects += c == '{';
            n_values += c == '[' || c == '{' || c == 't' || c == 'f' || c == 'n';
            i++;
        }
    }
    const size_t block = 16;
    return 3 * strings + n_strings * (48 + 3 * block + 2) + 2 * max_raw + 16 + n_numbers * (32 + block + 4) +
           n_arrays * (48 + block + 64) + n_objects * (96 + 128 + 2 * block) + n_values * (16 + 32 + 64 + block) +
           4096;
}

int serve_request_parse(serve_req_kind kind, const char *body, size_t len, const serve_limits *lim,
                        serve_request *out, serve_error *err) {
    memset(out, 0, sizeof *out);
    memset(err, 0, sizeof *err);
    out->kind = kind;
    dhsa_sampler_params sp = dhsa_sampler_default_params();
    out->temperature = sp.temperature;
    out->top_p = sp.top_p;
    out->min_p = sp.min_p;
    out->top_k = sp.top_k;
    out->repeat_penalty = sp.repeat_penalty;
    out->repeat_last_n = sp.repeat_last_n;
    out->max_tokens = -1;
    out->attn = SERVE_ATTN_UNSET;
    out->add_special = 1;
    if (kind < SERVE_REQ_CHAT || kind > SERVE_REQ_DETOKENIZE) return fail(err, NULL, "unknown request kind");
    json_error_t je;
    /* duplicate keys are an error: which one would win is not the client's guess to make */
    json_t *root = json_loadb(body ? body : "", body ? len : 0, JSON_REJECT_DUPLICATES, &je);
    if (!root) return fail(err, NULL, "the body is not valid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
    int rc;
    if (!json_is_object(root)) rc = fail(err, NULL, "the body must be a JSON object");
    else if (kind == SERVE_REQ_CHAT || kind == SERVE_REQ_COMPLETION) rc = parse_generate(root, kind, lim, out, err);
    else rc = parse_tokenize(root, kind, lim, out, err);
    json_decref(root);
    if (rc) {
        serve_request_free(out);
        out->kind = kind;
    }
    return rc;
}
#else
typedef int dhsa_serve_req_unused; /* built without libmicrohttpd and jansson: tools/serve.c refuses */
#endif
