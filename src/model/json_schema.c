/* json_schema.c: JSON Schema text into a compiled schema
 * (dhsa_json_schema_compile / _free, the "Structured output" block of
 * include/dhsa.h), the first half of structured output; the automaton that
 * runs a schema and masks tokens is src/model/json_constraint.c.
 *
 *   - a small JSON reader for the schema text (bounded: 1 MiB, 64 levels);
 *   - the compiler from its tree to schema nodes (src/model/json_schema.h;
 *     a keyword outside the subset is refused by name, never ignored).
 * Tests: tests/test_json_constraint.c (schema cases and refusals);
 * docs/server.md (the subset).
 */
#include "core/internal.h"
#include "dhsa.h"
#include "model/json_schema.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SCHEMA_MAX_BYTES ((int64_t)1 << 20)
#define READ_MAX_DEPTH 64

/* --------------------------------------------------------------------- */
/* Reading the schema's JSON                                              */

typedef enum { J_NULL, J_FALSE, J_TRUE, J_NUM, J_STR, J_ARR, J_OBJ } jtype;

typedef struct jval {
    jtype t;
    char *s;            /* J_STR: decoded bytes; J_NUM: the source text; NUL-terminated */
    int64_t n;          /* bytes of s */
    double num;
    struct jval *items; /* J_ARR elements, J_OBJ values: [count] */
    char **keys;        /* J_OBJ: [count], NUL-terminated (a NUL inside a key is refused) */
    int64_t count;
} jval;

static void jval_free(jval *v) {
    if (!v) return;
    for (int64_t i = 0; i < v->count; i++) {
        jval_free(&v->items[i]);
        if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->s);
    memset(v, 0, sizeof *v);
}

typedef struct {
    const unsigned char *p;
    int64_t n, i;
} reader;

static dhsa_status read_fail(const reader *r, const char *what) {
    return dhsa__fail(DHSA_ERR_FORMAT, "the schema is not valid JSON: %s at byte %lld", what, (long long)r->i);
}

static void skip_ws(reader *r) {
    while (r->i < r->n && (r->p[r->i] == ' ' || r->p[r->i] == '\t' || r->p[r->i] == '\n' || r->p[r->i] == '\r'))
        r->i++;
}

static int put_utf8(char *o, uint32_t cp) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 63));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 63));
        o[2] = (char)(0x80 | (cp & 63));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 63));
    o[2] = (char)(0x80 | ((cp >> 6) & 63));
    o[3] = (char)(0x80 | (cp & 63));
    return 4;
}

static int read_hex4(reader *r, uint32_t *out) {
    if (r->i + 4 > r->n) return -1;
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        int h = dhsa__json_hexval(r->p[r->i + k]);
        if (h < 0) return -1;
        v = v * 16 + (uint32_t)h;
    }
    r->i += 4;
    *out = v;
    return 0;
}

/* A string literal at r->i (the opening quote): its decoded bytes. The
 * decoded text is never longer than the raw one. */
static dhsa_status read_string(reader *r, char **out, int64_t *len) {
    int64_t start = ++r->i, end = start;
    while (end < r->n && r->p[end] != '"') end += r->p[end] == '\\' ? 2 : 1;
    if (end >= r->n) return read_fail(r, "unterminated string");
    char *s = malloc((size_t)(end - start) + 1);
    if (!s) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory reading the schema");
    int64_t o = 0;
    while (r->i < end) {
        unsigned char c = r->p[r->i];
        if (c < 0x20) {
            free(s);
            return read_fail(r, "a control byte in a string");
        }
        if (c != '\\') {
            s[o++] = (char)c;
            r->i++;
            continue;
        }
        r->i++;
        unsigned char e = r->p[r->i++];
        const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
        const char *hit = e ? strchr(from, e) : NULL;
        if (hit) {
            s[o++] = to[hit - from];
            continue;
        }
        uint32_t cp;
        if (e != 'u' || read_hex4(r, &cp)) {
            free(s);
            return read_fail(r, "a bad escape");
        }
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            uint32_t lo;
            if (r->i + 6 > end + 0 || r->p[r->i] != '\\' || r->p[r->i + 1] != 'u') {
                free(s);
                return read_fail(r, "a lone surrogate escape");
            }
            r->i += 2;
            if (read_hex4(r, &lo) || lo < 0xDC00 || lo > 0xDFFF) {
                free(s);
                return read_fail(r, "a lone surrogate escape");
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            free(s);
            return read_fail(r, "a lone surrogate escape");
        }
        o += put_utf8(s + o, cp);
    }
    r->i = end + 1;
    s[o] = 0;
    *out = s;
    *len = o;
    return DHSA_OK;
}

static dhsa_status read_value(reader *r, jval *v, int depth) {
    memset(v, 0, sizeof *v);
    if (depth > READ_MAX_DEPTH) return read_fail(r, "nesting deeper than 64 levels");
    skip_ws(r);
    if (r->i >= r->n) return read_fail(r, "unexpected end");
    unsigned char c = r->p[r->i];
    if (c == '"') {
        v->t = J_STR;
        return read_string(r, &v->s, &v->n);
    }
    if (c == '{' || c == '[') {
        v->t = c == '{' ? J_OBJ : J_ARR;
        r->i++;
        int64_t cap = 0;
        skip_ws(r);
        if (r->i < r->n && r->p[r->i] == (c == '{' ? '}' : ']')) {
            r->i++;
            return DHSA_OK;
        }
        for (;;) {
            if (v->count == cap) {
                cap = cap ? cap * 2 : 4;
                jval *it = realloc(v->items, (size_t)cap * sizeof *it);
                if (!it) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory reading the schema");
                v->items = it;
                if (c == '{') {
                    char **k = realloc(v->keys, (size_t)cap * sizeof *k);
                    if (!k) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory reading the schema");
                    v->keys = k;
                }
            }
            memset(&v->items[v->count], 0, sizeof v->items[0]);
            if (c == '{') {
                v->keys[v->count] = NULL;
                skip_ws(r);
                if (r->i >= r->n || r->p[r->i] != '"') {
                    v->count++;
                    return read_fail(r, "expected a member name");
                }
                int64_t klen;
                dhsa_status st = read_string(r, &v->keys[v->count], &klen);
                v->count++;
                if (st) return st;
                if ((int64_t)strlen(v->keys[v->count - 1]) != klen) return read_fail(r, "a NUL in a member name");
                for (int64_t k = 0; k + 1 < v->count; k++)
                    if (strcmp(v->keys[k], v->keys[v->count - 1]) == 0)
                        return dhsa__fail(DHSA_ERR_FORMAT, "the schema repeats the member \"%.60s\" in one object "
                                          "(at byte %lld)", v->keys[k], (long long)r->i);
                skip_ws(r);
                if (r->i >= r->n || r->p[r->i] != ':') return read_fail(r, "expected ':'");
                r->i++;
                dhsa_status st2 = read_value(r, &v->items[v->count - 1], depth + 1);
                if (st2) return st2;
            } else {
                v->count++;
                dhsa_status st = read_value(r, &v->items[v->count - 1], depth + 1);
                if (st) return st;
            }
            skip_ws(r);
            if (r->i < r->n && r->p[r->i] == ',') {
                r->i++;
                continue;
            }
            if (r->i < r->n && r->p[r->i] == (c == '{' ? '}' : ']')) {
                r->i++;
                return DHSA_OK;
            }
            return read_fail(r, c == '{' ? "expected ',' or '}'" : "expected ',' or ']'");
        }
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        int64_t s0 = r->i;
        if (r->p[r->i] == '-') r->i++;
        int64_t d0 = r->i;
        while (r->i < r->n && r->p[r->i] >= '0' && r->p[r->i] <= '9') r->i++;
        if (r->i == d0 || (r->p[d0] == '0' && r->i - d0 > 1)) return read_fail(r, "a malformed number");
        if (r->i < r->n && r->p[r->i] == '.') {
            int64_t f0 = ++r->i;
            while (r->i < r->n && r->p[r->i] >= '0' && r->p[r->i] <= '9') r->i++;
            if (r->i == f0) return read_fail(r, "a malformed number");
        }
        if (r->i < r->n && (r->p[r->i] == 'e' || r->p[r->i] == 'E')) {
            r->i++;
            if (r->i < r->n && (r->p[r->i] == '+' || r->p[r->i] == '-')) r->i++;
            int64_t e0 = r->i;
            while (r->i < r->n && r->p[r->i] >= '0' && r->p[r->i] <= '9') r->i++;
            if (r->i == e0) return read_fail(r, "a malformed number");
        }
        v->t = J_NUM;
        v->n = r->i - s0;
        v->s = malloc((size_t)v->n + 1);
        if (!v->s) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory reading the schema");
        memcpy(v->s, r->p + s0, (size_t)v->n);
        v->s[v->n] = 0;
        v->num = strtod(v->s, NULL);
        return DHSA_OK;
    }
    static const char *const words[3] = {"null", "false", "true"};
    for (int w = 0; w < 3; w++) {
        int64_t l = (int64_t)strlen(words[w]);
        if (r->n - r->i >= l && memcmp(r->p + r->i, words[w], (size_t)l) == 0) {
            r->i += l;
            v->t = w == 0 ? J_NULL : w == 1 ? J_FALSE : J_TRUE;
            return DHSA_OK;
        }
    }
    return read_fail(r, "unexpected character");
}

static const jval *obj_get(const jval *o, const char *key) {
    if (o->t != J_OBJ) return NULL;
    for (int64_t i = 0; i < o->count; i++)
        if (strcmp(o->keys[i], key) == 0) return &o->items[i];
    return NULL;
}

/* --------------------------------------------------------------------- */
/* A growable byte buffer (compact JSON text of enum values)              */

typedef struct {
    char *p;
    int64_t n, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, int64_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        int64_t cap = b->cap ? b->cap * 2 : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, (size_t)cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, (size_t)n);
    b->n += n;
    b->p[b->n] = 0;
}

/* A string as JSON text: quote, backslash and control bytes escaped (the
 * short forms where JSON has them), every other byte as it is. */
static void sb_string(sbuf *b, const char *s, int64_t n) {
    sb_put(b, "\"", 1);
    for (int64_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char e[8];
        if (c == '"' || c == '\\') {
            e[0] = '\\';
            e[1] = (char)c;
            sb_put(b, e, 2);
        } else if (c < 0x20) {
            const char *sh = c == '\n' ? "\\n" : c == '\t' ? "\\t" : c == '\r' ? "\\r" : c == '\b' ? "\\b"
                             : c == '\f' ? "\\f" : NULL;
            if (sh) sb_put(b, sh, 2);
            else {
                static const char hx[] = "0123456789abcdef";
                char u[6] = {'\\', 'u', '0', '0', hx[c >> 4], hx[c & 15]};
                sb_put(b, u, 6);
            }
        } else {
            sb_put(b, (const char *)&s[i], 1);
        }
    }
    sb_put(b, "\"", 1);
}

static void sb_value(sbuf *b, const jval *v) {
    switch (v->t) {
    case J_NULL: sb_put(b, "null", 4); break;
    case J_FALSE: sb_put(b, "false", 5); break;
    case J_TRUE: sb_put(b, "true", 4); break;
    case J_NUM: sb_put(b, v->s, v->n); break;
    case J_STR: sb_string(b, v->s, v->n); break;
    case J_ARR:
    case J_OBJ:
        sb_put(b, v->t == J_ARR ? "[" : "{", 1);
        for (int64_t i = 0; i < v->count; i++) {
            if (i) sb_put(b, ",", 1);
            if (v->t == J_OBJ) {
                sb_string(b, v->keys[i], (int64_t)strlen(v->keys[i]));
                sb_put(b, ":", 1);
            }
            sb_value(b, &v->items[i]);
        }
        sb_put(b, v->t == J_ARR ? "]" : "}", 1);
        break;
    }
}

/* --------------------------------------------------------------------- */
/* Schema nodes                                                           */

static void node_free(jnode *n) {
    for (int i = 0; i < n->n_props; i++) free(n->props[i].lit);
    free(n->props);
    for (int64_t i = 0; i < n->n_lits; i++) free(n->lits[i]);
    free(n->lits);
    free(n->lit_len);
    free(n->alts);
}

void dhsa_json_schema_free(dhsa_json_schema *s) {
    if (!s) return;
    for (int32_t i = 0; i < s->n_nodes; i++) node_free(&s->nodes[i]);
    free(s->nodes);
    free(s);
}

static int32_t new_node(dhsa_json_schema *s, node_kind k) {
    if (s->n_nodes == s->cap) {
        if (s->cap >= (1 << 24)) return -1;
        int32_t cap = s->cap ? s->cap * 2 : 16;
        jnode *p = realloc(s->nodes, (size_t)cap * sizeof *p);
        if (!p) return -1;
        s->nodes = p;
        s->cap = cap;
    }
    jnode *n = &s->nodes[s->n_nodes];
    memset(n, 0, sizeof *n);
    n->kind = k;
    n->extra = -1;
    n->items = ND_ANY;
    n->max_items = -1;
    n->max_len = -1;
    for (int b = 0; b < 256; b++) n->by_first[b] = -1;
    return s->n_nodes++;
}

static int lit_cmp(const void *a, const void *b) {
    const char *const *x = a, *const *y = b;
    return strcmp(*x, *y); /* JSON texts hold no NUL: escaped */
}

/* N_LITERALS from JSON texts texts[0..n) (taken over): sorted, duplicates
 * dropped. */
static int32_t literal_node(dhsa_json_schema *s, char **texts, int64_t n) {
    qsort(texts, (size_t)n, sizeof *texts, lit_cmp);
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        if (m && strcmp(texts[m - 1], texts[i]) == 0) free(texts[i]);
        else texts[m++] = texts[i];
    }
    int32_t id = new_node(s, N_LITERALS);
    int64_t *lens = malloc((size_t)(m ? m : 1) * sizeof *lens);
    if (id < 0 || !lens) {
        for (int64_t i = 0; i < m; i++) free(texts[i]);
        free(texts);
        free(lens);
        return -1;
    }
    for (int64_t i = 0; i < m; i++) lens[i] = (int64_t)strlen(texts[i]);
    s->nodes[id].lits = texts;
    s->nodes[id].lit_len = lens;
    s->nodes[id].n_lits = m;
    return id;
}

static int32_t literal_node_of(dhsa_json_schema *s, const char *const *words, int n) {
    char **t = calloc((size_t)n, sizeof *t);
    if (!t) return -1;
    for (int i = 0; i < n; i++) {
        t[i] = malloc(strlen(words[i]) + 1);
        if (!t[i]) {
            for (int k = 0; k < i; k++) free(t[k]);
            free(t);
            return -1;
        }
        strcpy(t[i], words[i]);
    }
    return literal_node(s, t, n);
}

/* The first bytes a value of node can begin with. */
static void first_bytes(const dhsa_json_schema *s, int32_t node, uint8_t set[256]) {
    const jnode *n = &s->nodes[node];
    switch (n->kind) {
    case N_ANY:
        for (const char *p = "{[\"-0123456789tfn"; *p; p++) set[(unsigned char)*p] = 1;
        break;
    case N_OBJECT: set['{'] = 1; break;
    case N_ARRAY: set['['] = 1; break;
    case N_STRING: set['"'] = 1; break;
    case N_NUMBER:
    case N_INTEGER:
        for (const char *p = "-0123456789"; *p; p++) set[(unsigned char)*p] = 1;
        break;
    case N_LITERALS:
        for (int64_t i = 0; i < n->n_lits; i++) set[(unsigned char)n->lits[i][0]] = 1;
        break;
    case N_UNION:
        for (int b = 0; b < 256; b++) set[b] |= n->by_first[b] >= 0;
        break;
    }
}

/* --------------------------------------------------------------------- */
/* Compiling a schema                                                     */

typedef struct {
    dhsa_json_schema *s;
    int depth;
} compiler;

static const char *const annotations[] = {"title", "description", "default", "examples", "$schema", "$id",
                                          "$comment", "deprecated", "readOnly", "writeOnly", NULL};
static const char *const keywords[] = {"type", "properties", "required", "additionalProperties", "items",
                                       "minItems", "maxItems", "minLength", "maxLength", "enum", "const",
                                       "anyOf", "oneOf", NULL};

static int in_list(const char *const *list, const char *k) {
    for (int i = 0; list[i]; i++)
        if (strcmp(list[i], k) == 0) return 1;
    return 0;
}

static dhsa_status oom(void) { return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory compiling the schema"); }

static dhsa_status compile(compiler *c, const jval *v, const char *path, int32_t *out);

/* A non-negative integer keyword. */
static dhsa_status get_count(const jval *v, const char *key, const char *path, int64_t *out) {
    const jval *x = obj_get(v, key);
    if (!x) return DHSA_OK;
    if (x->t != J_NUM || !(x->num >= 0) || x->num != floor(x->num) || x->num > 9e15)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "schema %s/%s must be a non-negative integer", path, key);
    *out = (int64_t)x->num;
    return DHSA_OK;
}

static dhsa_status compile_object(compiler *c, const jval *v, const char *path, int32_t *out) {
    const jval *props = obj_get(v, "properties"), *req = obj_get(v, "required"),
               *add = obj_get(v, "additionalProperties");
    if (props && props->t != J_OBJ) return dhsa__fail(DHSA_ERR_INVALID_ARG, "schema %s/properties must be an object", path);
    if (req && req->t != J_ARR) return dhsa__fail(DHSA_ERR_INVALID_ARG, "schema %s/required must be an array", path);
    if (add && add->t != J_TRUE && add->t != J_FALSE && add->t != J_OBJ)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "schema %s/additionalProperties must be a boolean or a schema", path);
    if (props && props->count > MAX_PROPS)
        return dhsa__fail(DHSA_ERR_UNSUPPORTED, "schema %s/properties has %lld properties; dhsa constrains at most %d "
                          "per object", path, (long long)props->count, MAX_PROPS);
    if (req && req->count && !props)
        return dhsa__fail(DHSA_ERR_UNSUPPORTED, "schema %s/required without properties is not supported (list the "
                          "required properties under properties)", path);
    int32_t id = new_node(c->s, N_OBJECT);
    if (id < 0) return oom();
    if (props) {
        jprop *pr = calloc((size_t)(props->count ? props->count : 1), sizeof *pr);
        if (!pr) return oom();
        c->s->nodes[id].props = pr;
        c->s->nodes[id].has_props = 1;
        for (int64_t i = 0; i < props->count; i++) {
            sbuf b = {0};
            sb_string(&b, props->keys[i], (int64_t)strlen(props->keys[i]));
            if (b.oom) {
                free(b.p);
                return oom();
            }
            c->s->nodes[id].props[i].lit = b.p;
            c->s->nodes[id].props[i].len = b.n;
            c->s->nodes[id].n_props = (int)i + 1;
            char sub[512];
            snprintf(sub, sizeof sub, "%s/properties/%.200s", path, props->keys[i]);
            int32_t child;
            dhsa_status st = compile(c, &props->items[i], sub, &child);
            if (st) return st;
            c->s->nodes[id].props[i].child = child;
        }
        for (int64_t k = 0; req && k < req->count; k++) {
            const jval *r = &req->items[k];
            if (r->t != J_STR) return dhsa__fail(DHSA_ERR_INVALID_ARG, "schema %s/required/%lld must be a string", path, (long long)k);
            int64_t hit = -1;
            for (int64_t i = 0; i < props->count; i++)
                if (strcmp(props->keys[i], r->s) == 0 && (int64_t)strlen(r->s) == r->n) hit = i;
            if (hit < 0)
                return dhsa__fail(DHSA_ERR_INVALID_ARG, "schema %s/required names \"%.60s\", which is not in "
                                  "properties: it could not be written", path, r->s);
            c->s->nodes[id].required |= (uint64_t)1 << hit;
        }
        /* additionalProperties (true, false or a schema): only the listed
         * properties are written, which every form allows */
    } else if (!add || add->t == J_TRUE) {
        c->s->nodes[id].extra = ND_ANY;
    } else if (add->t == J_OBJ) {
        char sub[512];
        snprintf(sub, sizeof sub, "%s/additionalProperties", path);
        int32_t child;
        dhsa_status st = compile(c, add, sub, &child);
        if (st) return st;
        c->s->nodes[id].extra = child;
    }
    *out = id;
    return DHSA_OK;
}

static dhsa_status compile_typed(compiler *c, const jval *v, const char *type, const char *path, int32_t *out) {
    if (strcmp(type, "object") == 0) return compile_object(c, v, path, out);
    if (strcmp(type, "array") == 0) {
        const jval *items = obj_get(v, "items");
        int64_t mn = 0, mx = -1;
        dhsa_status st = get_count(v, "minItems", path, &mn);
        if (!st) st = get_count(v, "maxItems", path, &mx);
        if (st) return st;
        if (mx >= 0 && mn > mx)
            return dhsa__fail(DHSA_ERR_INVALID_ARG, "schema %s: minItems %lld > maxItems %lld", path, (long long)mn,
                              (long long)mx);
        int32_t child = ND_ANY;
        if (items && items->t == J_ARR)
            return dhsa__fail(DHSA_ERR_UNSUPPORTED, "schema %s/items as a list (a tuple) is not supported: give one "
                              "schema for every item", path);
        if (items && items->t == J_FALSE) {
            if (mn > 0) return dhsa__fail(DHSA_ERR_INVALID_ARG, "schema %s: items false with minItems %lld", path, (long long)mn);
            mx = 0;
        } else if (items) {
            char sub[512];
            snprintf(sub, sizeof sub, "%s/items", path);
            if ((st = compile(c, items, sub, &child))) return st;
        }
        int32_t id = new_node(c->s, N_ARRAY);
        if (id < 0) return oom();
        c->s->nodes[id].items = child;
        c->s->nodes[id].min_items = mn;
        c->s->nodes[id].max_items = mx;
        *out = id;
        return DHSA_OK;
    }
    if (strcmp(type, "string") == 0) {
        int64_t mn = 0, mx = -1;
        dhsa_status st = get_count(v, "minLength", path, &mn);
        if (!st) st = get_count(v, "maxLength", path, &mx);
        if (st) return st;
        if (mx >= 0 && mn > mx)
            return dhsa__fail(DHSA_ERR_INVALID_ARG, "schema %s: minLength %lld > maxLength %lld", path, (long long)mn,
                              (long long)mx);
        int32_t id = new_node(c->s, N_STRING);
        if (id < 0) return oom();
        c->s->nodes[id].min_len = mn;
        c->s->nodes[id].max_len = mx;
        *out = id;
        return DHSA_OK;
    }
    if (strcmp(type, "number") == 0 || strcmp(type, "integer") == 0) {
        int32_t id = new_node(c->s, type[0] == 'n' ? N_NUMBER : N_INTEGER);
        if (id < 0) return oom();
        *out = id;
        return DHSA_OK;
    }
    if (strcmp(type, "boolean") == 0 || strcmp(type, "null") == 0) {
        static const char *const tf[2] = {"true", "false"}, *const nul[1] = {"null"};
        int32_t id = type[0] == 'b' ? literal_node_of(c->s, tf, 2) : literal_node_of(c->s, nul, 1);
        if (id < 0) return oom();
        *out = id;
        return DHSA_OK;
    }
    return dhsa__fail(DHSA_ERR_INVALID_ARG, "schema %s/type \"%.40s\" is not a JSON Schema type (object, array, "
                      "string, number, integer, boolean, null)", path, type);
}

/* A union of already compiled branches, refused when two can begin with
 * the same byte (the automaton picks the branch by the first byte). */
static dhsa_status union_node(compiler *c, const int32_t *alts, int n, const char *path, const char *what,
                              int32_t *out) {
    int32_t id = new_node(c->s, N_UNION);
    if (id < 0) return oom();
    int32_t *a = malloc((size_t)n * sizeof *a);
    if (!a) return oom();
    memcpy(a, alts, (size_t)n * sizeof *a);
    c->s->nodes[id].alts = a;
    c->s->nodes[id].n_alts = n;
    for (int i = 0; i < n; i++) {
        uint8_t set[256] = {0};
        first_bytes(c->s, alts[i], set);
        for (int b = 0; b < 256; b++) {
            if (!set[b]) continue;
            int32_t prev = c->s->nodes[id].by_first[b];
            if (prev >= 0 && prev != alts[i]) {
                int pi = 0;
                while (alts[pi] != prev) pi++;
                return dhsa__fail(DHSA_ERR_UNSUPPORTED, "schema %s: %s branches %d and %d can both begin with '%c'; "
                                  "dhsa constrains only branches that begin differently (say a string and null, "
                                  "an object and an array)", path, what, pi, i, b);
            }
            c->s->nodes[id].by_first[b] = alts[i];
        }
    }
    *out = id;
    return DHSA_OK;
}

static dhsa_status compile(compiler *c, const jval *v, const char *path, int32_t *out) {
    if (c->depth >= VALUE_MAX_DEPTH)
        return dhsa__fail(DHSA_ERR_UNSUPPORTED, "schema %s nests deeper than %d levels", path, VALUE_MAX_DEPTH);
    if (v->t == J_TRUE) {
        *out = ND_ANY;
        return DHSA_OK;
    }
    if (v->t == J_FALSE)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "schema %s is false: no value satisfies it", path[0] ? path : "(root)");
    if (v->t != J_OBJ)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "schema %s must be an object or a boolean", path[0] ? path : "(root)");
    int has[16] = {0};
    for (int64_t i = 0; i < v->count; i++) {
        const char *k = v->keys[i];
        if (in_list(annotations, k)) continue;
        if (!in_list(keywords, k)) {
            const char *hint = strcmp(k, "$ref") == 0 || strcmp(k, "$defs") == 0 || strcmp(k, "definitions") == 0
                                   ? " (write the definitions inline)"
                                   : "";
            return dhsa__fail(DHSA_ERR_UNSUPPORTED, "schema keyword \"%.40s\" at %s is not supported%s; dhsa "
                              "constrains type, properties, required, additionalProperties, items, minItems, "
                              "maxItems, minLength, maxLength, enum, const, anyOf and oneOf (docs/server.md)",
                              k, path[0] ? path : "(root)", hint);
        }
        for (int w = 0; keywords[w]; w++)
            if (strcmp(keywords[w], k) == 0) has[w] = 1;
    }
    const char *where = path[0] ? path : "(root)";
    const jval *en = obj_get(v, "enum"), *cn = obj_get(v, "const"), *ty = obj_get(v, "type");
    const jval *any = obj_get(v, "anyOf") ? obj_get(v, "anyOf") : obj_get(v, "oneOf");
    c->depth++;
    dhsa_status st = DHSA_OK;
    if (en || cn) {
        /* the values themselves: with type only (other keywords would have
         * to be checked on each value) */
        for (int w = 0; keywords[w]; w++)
            if (has[w] && strcmp(keywords[w], "type") && strcmp(keywords[w], "enum") && strcmp(keywords[w], "const")) {
                c->depth--;
                return dhsa__fail(DHSA_ERR_UNSUPPORTED, "schema %s: enum or const together with \"%s\" is not "
                                  "supported", where, keywords[w]);
            }
        if (en && en->t != J_ARR) {
            c->depth--;
            return dhsa__fail(DHSA_ERR_INVALID_ARG, "schema %s/enum must be an array", where);
        }
        int64_t n = en ? en->count : 1;
        char **texts = calloc((size_t)(n ? n : 1), sizeof *texts);
        if (!texts) {
            c->depth--;
            return oom();
        }
        int64_t m = 0;
        for (int64_t i = 0; i < n; i++) {
            const jval *x = en ? &en->items[i] : cn;
            if (en && cn) { /* both: the const, if the enum has it */
                sbuf a = {0}, b = {0};
                sb_value(&a, x);
                sb_value(&b, cn);
                int same = !a.oom && !b.oom && strcmp(a.p, b.p) == 0;
                free(a.p);
                free(b.p);
                if (!same) continue;
            }
            if (ty) { /* only the values of the type(s) */
                int ok = 0;
                for (int64_t k = 0; k < (ty->t == J_ARR ? ty->count : 1); k++) {
                    const jval *tk = ty->t == J_ARR ? &ty->items[k] : ty;
                    if (tk->t != J_STR) continue;
                    const char *t = tk->s;
                    ok |= (strcmp(t, "object") == 0 && x->t == J_OBJ) || (strcmp(t, "array") == 0 && x->t == J_ARR) ||
                          (strcmp(t, "string") == 0 && x->t == J_STR) || (strcmp(t, "number") == 0 && x->t == J_NUM) ||
                          (strcmp(t, "integer") == 0 && x->t == J_NUM && x->num == floor(x->num)) ||
                          (strcmp(t, "boolean") == 0 && (x->t == J_TRUE || x->t == J_FALSE)) ||
                          (strcmp(t, "null") == 0 && x->t == J_NULL);
                }
                if (!ok) continue;
            }
            sbuf b = {0};
            sb_value(&b, x);
            if (b.oom) {
                free(b.p);
                for (int64_t k = 0; k < m; k++) free(texts[k]);
                free(texts);
                c->depth--;
                return oom();
            }
            texts[m++] = b.p;
        }
        if (m == 0) {
            free(texts);
            c->depth--;
            return dhsa__fail(DHSA_ERR_INVALID_ARG, "schema %s: no value of enum/const satisfies it (empty, or none "
                              "of the type)", where);
        }
        *out = literal_node(c->s, texts, m);
        if (*out < 0) st = oom();
    } else if (any) {
        for (int w = 0; keywords[w]; w++)
            if (has[w] && strcmp(keywords[w], "anyOf") && strcmp(keywords[w], "oneOf")) {
                c->depth--;
                return dhsa__fail(DHSA_ERR_UNSUPPORTED, "schema %s: anyOf/oneOf together with \"%s\" is not "
                                  "supported (put it inside each branch)", where, keywords[w]);
            }
        if (obj_get(v, "anyOf") && obj_get(v, "oneOf")) {
            c->depth--;
            return dhsa__fail(DHSA_ERR_UNSUPPORTED, "schema %s: anyOf and oneOf together are not supported", where);
        }
        const char *kw = obj_get(v, "anyOf") ? "anyOf" : "oneOf";
        if (any->t != J_ARR || any->count == 0 || any->count > 64) {
            c->depth--;
            return dhsa__fail(DHSA_ERR_INVALID_ARG, "schema %s/%s must be an array of 1 to 64 schemas", where, kw);
        }
        int32_t alts[64];
        for (int64_t i = 0; i < any->count && !st; i++) {
            char sub[512];
            snprintf(sub, sizeof sub, "%s/%s/%lld", path, kw, (long long)i);
            st = compile(c, &any->items[i], sub, &alts[i]);
        }
        /* branches that begin differently: at most one matches, so oneOf
         * is anyOf here */
        if (!st) st = union_node(c, alts, (int)any->count, where, kw, out);
    } else if (ty) {
        if (ty->t == J_STR) {
            st = compile_typed(c, v, ty->s, path, out);
        } else if (ty->t == J_ARR && ty->count > 0 && ty->count <= 7) {
            int32_t alts[7];
            int n = 0, has_number = 0;
            for (int64_t i = 0; i < ty->count; i++)
                has_number |= ty->items[i].t == J_STR && strcmp(ty->items[i].s, "number") == 0;
            for (int64_t i = 0; i < ty->count && !st; i++) {
                if (ty->items[i].t != J_STR) {
                    st = dhsa__fail(DHSA_ERR_INVALID_ARG, "schema %s/type must be a string or an array of strings", where);
                    break;
                }
                if (has_number && strcmp(ty->items[i].s, "integer") == 0) continue; /* number holds them */
                st = compile_typed(c, v, ty->items[i].s, path, &alts[n++]);
            }
            if (!st) st = n == 1 ? (*out = alts[0], DHSA_OK) : union_node(c, alts, n, where, "type", out);
        } else {
            st = dhsa__fail(DHSA_ERR_INVALID_ARG, "schema %s/type must be a string or an array of 1 to 7 strings", where);
        }
    } else {
        /* no type: the one family its keywords belong to, or any value */
        int obj = has[1] || has[2] || has[3], arr = has[4] || has[5] || has[6], str = has[7] || has[8];
        if (obj + arr + str > 1)
            st = dhsa__fail(DHSA_ERR_UNSUPPORTED, "schema %s has keywords of several types and no \"type\": give "
                            "type", where);
        else if (obj) st = compile_typed(c, v, "object", path, out);
        else if (arr) st = compile_typed(c, v, "array", path, out);
        else if (str) st = compile_typed(c, v, "string", path, out);
        else *out = ND_ANY;
    }
    c->depth--;
    return st;
}

dhsa_status dhsa_json_schema_compile(const char *schema, int64_t len, dhsa_json_schema **out) {
    if (!out) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_json_schema_compile: out is NULL");
    *out = NULL;
    if (schema && (len < 0 || len > SCHEMA_MAX_BYTES))
        return dhsa__fail(DHSA_ERR_TOO_LARGE, "a schema of %lld bytes; at most %lld are taken", (long long)len,
                          (long long)SCHEMA_MAX_BYTES);
    dhsa_json_schema *s = calloc(1, sizeof *s);
    if (!s) return oom();
    /* the shapes of an unconstrained value */
    static const char *const tfn[3] = {"true", "false", "null"};
    int ok = new_node(s, N_ANY) == ND_ANY && new_node(s, N_OBJECT) == ND_ANY_OBJECT &&
             new_node(s, N_ARRAY) == ND_ANY_ARRAY && new_node(s, N_STRING) == ND_ANY_STRING &&
             new_node(s, N_NUMBER) == ND_ANY_NUMBER && literal_node_of(s, tfn, 3) == ND_TFN;
    if (!ok) {
        dhsa_json_schema_free(s);
        return oom();
    }
    s->nodes[ND_ANY_OBJECT].extra = ND_ANY;
    s->root = ND_ANY_OBJECT;
    if (!schema) {
        *out = s;
        return DHSA_OK;
    }
    reader r = {(const unsigned char *)schema, len, 0};
    jval v;
    dhsa_status st = read_value(&r, &v, 0);
    if (!st) {
        skip_ws(&r);
        if (r.i != r.n) st = read_fail(&r, "text after the schema");
    }
    if (!st) {
        compiler c = {s, 0};
        st = compile(&c, &v, "", &s->root);
    }
    jval_free(&v);
    if (st) {
        dhsa_json_schema_free(s);
        return st;
    }
    *out = s;
    return DHSA_OK;
}
