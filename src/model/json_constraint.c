/* json_constraint.c: sampling constrained to JSON and to a JSON Schema
 * subset (the "Structured output" block of include/dhsa.h).
 *
 * Three parts:
 *   - a small JSON reader for the schema text (bounded: 1 MiB, 64 levels),
 *     and the compiler from its tree to schema nodes (a keyword outside the
 *     subset is refused by name, never ignored);
 *   - the automaton: a stack of frames (root, object, array, string,
 *     number, literal, property name), one byte at a time; a frame that ends
 *     pops and tells its parent; a number or a literal that can only end at
 *     the byte after it pops and hands that byte to its parent;
 *   - the mask: each token's bytes (dhsa_json_vocab, once per tokenizer),
 *     grouped by first byte. Per step the 256 first bytes are tried on the
 *     state; a token whose first byte passes is run whole on a copy, but a
 *     token of plain string bytes (valid UTF-8, no quote, backslash or
 *     control byte) inside a string is allowed at once (most of a 151K
 *     vocabulary there).
 * Tests: tests/test_json_constraint.c (accepted and refused texts, schema
 * cases, refusals, the mask against token-by-token feeding, generation with
 * the shipped model validated by an independent checker).
 */
#include "core/internal.h"
#include "dhsa.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SCHEMA_MAX_BYTES ((int64_t)1 << 20)
#define READ_MAX_DEPTH 64
#define VALUE_MAX_DEPTH 32          /* nesting of generated values */
#define MAX_FRAMES (VALUE_MAX_DEPTH + 3) /* root, values, a property name */
#define MAX_PROPS 64
#define INT_DIGITS 16
#define FRAC_DIGITS 16
#define EXP_DIGITS 3

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

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
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
        int h = hexval(r->p[r->i + k]);
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

typedef enum { N_ANY, N_OBJECT, N_ARRAY, N_STRING, N_NUMBER, N_INTEGER, N_LITERALS, N_UNION } node_kind;

typedef struct {
    char *lit;       /* the name as JSON text, quotes included */
    int64_t len;
    int32_t child;   /* the value's node */
} jprop;

typedef struct {
    node_kind kind;
    /* N_OBJECT */
    int has_props;   /* only the listed properties (else any name, values of extra) */
    jprop *props;
    int n_props;
    uint64_t required;
    int32_t extra;   /* without properties: the values' node, -1 = none (only {}) */
    /* N_ARRAY */
    int32_t items;
    int64_t min_items, max_items; /* max -1: no bound */
    /* N_STRING */
    int64_t min_len, max_len;     /* code points; max -1: no bound */
    /* N_LITERALS: JSON texts, sorted by bytes (a prefix first), distinct */
    char **lits;
    int64_t *lit_len;
    int64_t n_lits;
    /* N_UNION: the branch for each first byte (-1: none) */
    int32_t *alts;
    int n_alts;
    int32_t by_first[256];
} jnode;

struct dhsa_json_schema {
    jnode *nodes;
    int32_t n_nodes, cap;
    int32_t root;
};

/* Built-in nodes every schema has (N_ANY's shapes). */
enum { ND_ANY = 0, ND_ANY_OBJECT, ND_ANY_ARRAY, ND_ANY_STRING, ND_ANY_NUMBER, ND_TFN, ND_BUILTIN };

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

/* --------------------------------------------------------------------- */
/* The automaton                                                          */

enum { F_ROOT, F_OBJ, F_ARR, F_STR, F_NUM, F_LIT, F_KEY };
/* phases */
enum { R_BEFORE, R_DONE };
enum { O_OPEN, O_KEY, O_COLON, O_VAL, O_NEXT, O_COMMA };
enum { A_OPEN, A_VAL, A_NEXT, A_COMMA };
enum { S_NORMAL, S_ESC, S_HEX, S_U8 };
enum { NUM_START, NUM_MINUS, NUM_ZERO, NUM_INT, NUM_DOT, NUM_FRAC, NUM_E, NUM_ESIGN, NUM_EXP };

typedef struct {
    uint8_t kind, phase, ws; /* ws: bytes of the current whitespace run (at most 4 x 32 + 1) */
    uint8_t a, lo, hi;       /* string: escape digits / UTF-8 bytes to come, the next byte's range */
    int32_t node;
    int32_t prop;            /* object: the property whose value runs (-1: a free name) */
    int64_t n;               /* array: items; string: code points; number: digits of the part; literal, name: position */
    uint64_t mask;           /* object: properties written; name: candidates; literal: lo | hi << 32 */
} frame;

typedef struct {
    int32_t depth;
    frame f[MAX_FRAMES];
} jstate;

struct dhsa_json_vocab {
    int64_t n_vocab;
    int64_t *off;      /* [n_vocab + 1] into bytes */
    uint8_t *bytes;
    uint8_t *plain;    /* [n_vocab] complete UTF-8 without quote, backslash, control bytes */
    int32_t *cps;      /* [n_vocab] its code points */
    int32_t *order;    /* [n_vocab] non-empty ids by first byte */
    int64_t first[257];/* order[first[b] .. first[b+1]) begin with byte b */
};

struct dhsa_json_constraint {
    const dhsa_json_schema *s;
    const dhsa_json_vocab *v;
    jstate st, t1, t2;
    uint8_t *allowed; /* [n_vocab] */
};

static void copy_state(jstate *dst, const jstate *src) {
    dst->depth = src->depth;
    memcpy(dst->f, src->f, (size_t)src->depth * sizeof(frame));
}

static void state_init(jstate *st, int32_t root) {
    st->depth = 1;
    memset(&st->f[0], 0, sizeof st->f[0]);
    st->f[0].kind = F_ROOT;
    st->f[0].phase = R_BEFORE;
    st->f[0].node = root;
}

/* Whitespace between tokens: one run per gap, either one byte (" ", "\t"
 * or "\n") or a newline and then at most 4 spaces or tabs per container
 * open (the indentation of pretty-printed JSON), so that a model cannot
 * fill the output with blanks. containers: objects and arrays open.
 * Returns 1 consumed as whitespace, 0 not whitespace, -1 refused. */
static int gap(frame *f, unsigned char c, int containers) {
    if (c != ' ' && c != '\t' && c != '\n') return 0;
    if (f->ws == 0) {
        f->lo = c == '\n';
        f->ws = 1;
        return 1;
    }
    if (!f->lo || c == '\n' || f->ws - 1 >= 4 * containers) return -1;
    f->ws++;
    return 1;
}

/* The node of the value that begins with byte c where node is expected,
 * or -1. */
static int32_t dispatch(const dhsa_json_schema *s, int32_t node, unsigned char c) {
    for (int guard = 0; guard < 64; guard++) {
        const jnode *n = &s->nodes[node];
        switch (n->kind) {
        case N_ANY:
            if (c == '{') return ND_ANY_OBJECT;
            if (c == '[') return ND_ANY_ARRAY;
            if (c == '"') return ND_ANY_STRING;
            if (c == '-' || (c >= '0' && c <= '9')) return ND_ANY_NUMBER;
            if (c == 't' || c == 'f' || c == 'n') return ND_TFN;
            return -1;
        case N_OBJECT: return c == '{' ? node : -1;
        case N_ARRAY: return c == '[' ? node : -1;
        case N_STRING: return c == '"' ? node : -1;
        case N_NUMBER:
        case N_INTEGER: return c == '-' || (c >= '0' && c <= '9') ? node : -1;
        case N_LITERALS:
            for (int64_t i = 0; i < n->n_lits; i++)
                if ((unsigned char)n->lits[i][0] == c) return node;
            return -1;
        case N_UNION:
            node = n->by_first[c];
            if (node < 0) return -1;
            break;
        }
    }
    return -1;
}

static frame *push(jstate *st, uint8_t kind, int32_t node) {
    if (st->depth >= MAX_FRAMES) return NULL;
    frame *f = &st->f[st->depth++];
    memset(f, 0, sizeof *f);
    f->kind = kind;
    f->node = node;
    f->prop = -1;
    return f;
}

/* Begins a value of node at byte c: 1 consumed, 2 pushed a frame that reads
 * c itself, 0 refused. */
static int start_value(const dhsa_json_schema *s, jstate *st, int32_t node, unsigned char c) {
    int32_t k = dispatch(s, node, c);
    if (k < 0) return 0;
    /* values nest at most VALUE_MAX_DEPTH deep (the root frame below them) */
    if (st->depth > VALUE_MAX_DEPTH) return 0;
    const jnode *n = &s->nodes[k];
    frame *f;
    switch (n->kind) {
    case N_OBJECT: return push(st, F_OBJ, k) != NULL;
    case N_ARRAY: return push(st, F_ARR, k) != NULL;
    case N_STRING: return push(st, F_STR, k) != NULL;
    case N_NUMBER:
    case N_INTEGER: return push(st, F_NUM, k) ? 2 : 0;
    case N_LITERALS:
        if (!(f = push(st, F_LIT, k))) return 0;
        f->mask = (uint64_t)n->n_lits << 32;
        return 2;
    default: return 0;
    }
}

/* The top frame ended: pop it and tell its parent. */
static void pop(const dhsa_json_schema *s, jstate *st) {
    (void)s;
    st->depth--;
    frame *p = &st->f[st->depth - 1];
    p->ws = 0;
    switch (p->kind) {
    case F_ROOT: p->phase = R_DONE; break;
    case F_OBJ:
        if (p->phase == O_KEY) p->phase = O_COLON;
        else {
            if (p->prop >= 0) p->mask |= (uint64_t)1 << p->prop;
            p->phase = O_NEXT;
        }
        break;
    case F_ARR:
        p->n++;
        p->phase = A_NEXT;
        break;
    default: break;
    }
}

static int num_terminal(const frame *f) {
    return f->phase == NUM_ZERO || f->phase == NUM_INT || f->phase == NUM_FRAC || f->phase == NUM_EXP;
}

static int lit_complete(const dhsa_json_schema *s, const frame *f) {
    const jnode *n = &s->nodes[f->node];
    uint32_t lo = (uint32_t)f->mask;
    return n->lit_len[lo] == f->n;
}

/* One byte: 1 accepted, 0 refused (the state is then not to be used). */
static int step(const dhsa_json_schema *s, jstate *st, unsigned char c) {
    for (;;) {
        frame *f = &st->f[st->depth - 1];
        const jnode *n = &s->nodes[f->node];
        int g, r;
        switch (f->kind) {
        case F_ROOT:
            if (f->phase == R_DONE) return 0;
            if ((g = gap(f, c, st->depth - 1)) != 0) return g > 0;
            r = start_value(s, st, f->node, c);
            if (r == 2) continue;
            return r;
        case F_OBJ:
            switch (f->phase) {
            case O_OPEN:
            case O_COMMA:
                if ((g = gap(f, c, st->depth - 1)) != 0) return g > 0;
                if (c == '"') {
                    if (n->has_props) {
                        uint64_t all = n->n_props == 64 ? ~(uint64_t)0 : (((uint64_t)1 << n->n_props) - 1);
                        uint64_t avail = all & ~f->mask;
                        if (!avail) return 0;
                        frame *k = push(st, F_KEY, f->node);
                        if (!k) return 0;
                        k->mask = avail;
                        k->n = 1;
                        f->phase = O_KEY;
                        return 1;
                    }
                    if (n->extra < 0 || !push(st, F_STR, ND_ANY_STRING)) return 0;
                    f->prop = -1;
                    f->phase = O_KEY;
                    return 1;
                }
                if (c == '}' && f->phase == O_OPEN && (n->required & ~f->mask) == 0) {
                    pop(s, st);
                    return 1;
                }
                return 0;
            case O_COLON:
                if ((g = gap(f, c, st->depth - 1)) != 0) return g > 0;
                if (c != ':') return 0;
                f->phase = O_VAL;
                f->ws = 0;
                return 1;
            case O_VAL:
                if ((g = gap(f, c, st->depth - 1)) != 0) return g > 0;
                r = start_value(s, st, f->prop >= 0 ? n->props[f->prop].child : n->extra, c);
                if (r == 2) continue;
                return r;
            case O_NEXT:
                if ((g = gap(f, c, st->depth - 1)) != 0) return g > 0;
                if (c == ',') {
                    if (n->has_props) {
                        uint64_t all = n->n_props == 64 ? ~(uint64_t)0 : (((uint64_t)1 << n->n_props) - 1);
                        if (!(all & ~f->mask)) return 0;
                    }
                    f->phase = O_COMMA;
                    f->ws = 0;
                    return 1;
                }
                if (c == '}' && (n->required & ~f->mask) == 0) {
                    pop(s, st);
                    return 1;
                }
                return 0;
            default: return 0;
            }
        case F_KEY: {
            const jnode *o = n; /* the object's node */
            uint64_t keep = 0;
            int done = -1;
            for (int i = 0; i < o->n_props; i++) {
                if (!(f->mask >> i & 1)) continue;
                if (f->n < o->props[i].len && (unsigned char)o->props[i].lit[f->n] == c) {
                    keep |= (uint64_t)1 << i;
                    if (o->props[i].len == f->n + 1) done = i;
                }
            }
            if (!keep) return 0;
            f->mask = keep;
            f->n++;
            if (done >= 0) { /* a name's closing quote: no other name goes on from here */
                st->f[st->depth - 2].prop = done;
                pop(s, st);
            }
            return 1;
        }
        case F_ARR:
            switch (f->phase) {
            case A_OPEN:
            case A_COMMA:
                if ((g = gap(f, c, st->depth - 1)) != 0) return g > 0;
                if (c == ']' && f->phase == A_OPEN && n->min_items == 0) {
                    pop(s, st);
                    return 1;
                }
                if (n->max_items >= 0 && f->n >= n->max_items) return 0;
                f->phase = A_VAL;
                r = start_value(s, st, n->items, c);
                if (r == 2) continue;
                return r;
            case A_NEXT:
                if ((g = gap(f, c, st->depth - 1)) != 0) return g > 0;
                if (c == ',' && (n->max_items < 0 || f->n < n->max_items)) {
                    f->phase = A_COMMA;
                    f->ws = 0;
                    return 1;
                }
                if (c == ']' && f->n >= n->min_items) {
                    pop(s, st);
                    return 1;
                }
                return 0;
            default: return 0;
            }
        case F_STR:
            switch (f->phase) {
            case S_NORMAL:
                if (c == '"') {
                    if (f->n < n->min_len) return 0;
                    pop(s, st);
                    return 1;
                }
                if (c < 0x20) return 0;
                if (n->max_len >= 0 && f->n >= n->max_len) return 0;
                if (c == '\\') {
                    f->phase = S_ESC;
                    return 1;
                }
                if (c < 0x80) {
                    f->n++;
                    return 1;
                }
                /* UTF-8 (RFC 3629): the lead byte says how many follow and
                 * the range of the first of them (no overlongs, no
                 * surrogates, nothing past U+10FFFF) */
                if (c >= 0xC2 && c <= 0xDF) f->a = 1, f->lo = 0x80, f->hi = 0xBF;
                else if (c == 0xE0) f->a = 2, f->lo = 0xA0, f->hi = 0xBF;
                else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) f->a = 2, f->lo = 0x80, f->hi = 0xBF;
                else if (c == 0xED) f->a = 2, f->lo = 0x80, f->hi = 0x9F;
                else if (c == 0xF0) f->a = 3, f->lo = 0x90, f->hi = 0xBF;
                else if (c >= 0xF1 && c <= 0xF3) f->a = 3, f->lo = 0x80, f->hi = 0xBF;
                else if (c == 0xF4) f->a = 3, f->lo = 0x80, f->hi = 0x8F;
                else return 0;
                f->n++;
                f->phase = S_U8;
                return 1;
            case S_U8:
                if (c < f->lo || c > f->hi) return 0;
                f->lo = 0x80;
                f->hi = 0xBF;
                if (--f->a == 0) f->phase = S_NORMAL;
                return 1;
            case S_ESC:
                if (c == 'u') {
                    f->phase = S_HEX;
                    f->a = 0;
                    f->lo = 0;
                    return 1;
                }
                if (!strchr("\"\\/bfnrt", c) || c == 0) return 0;
                f->n++;
                f->phase = S_NORMAL;
                return 1;
            case S_HEX:
                if (hexval(c) < 0) return 0;
                /* \uD800-\uDFFF (surrogates) refused: what follows is not
                 * checked to pair them, and a lone one is not text */
                if (f->a == 0) f->lo = c == 'd' || c == 'D';
                else if (f->a == 1 && f->lo && hexval(c) >= 8) return 0;
                if (++f->a == 4) {
                    f->n++;
                    f->phase = S_NORMAL;
                }
                return 1;
            default: return 0;
            }
        case F_NUM: {
            const int digit = c >= '0' && c <= '9', real = n->kind == N_NUMBER;
            switch (f->phase) {
            case NUM_START:
                if (c == '-') f->phase = NUM_MINUS;
                else if (c == '0') f->phase = NUM_ZERO;
                else if (digit) f->phase = NUM_INT, f->n = 1;
                else return 0;
                return 1;
            case NUM_MINUS:
                if (c == '0') f->phase = NUM_ZERO;
                else if (digit) f->phase = NUM_INT, f->n = 1;
                else return 0;
                return 1;
            case NUM_ZERO:
            case NUM_INT:
                if (digit && f->phase == NUM_INT) {
                    if (f->n >= INT_DIGITS) return 0;
                    f->n++;
                    return 1;
                }
                if (digit) return 0; /* no leading zeros */
                if (real && c == '.') {
                    f->phase = NUM_DOT;
                    return 1;
                }
                if (real && (c == 'e' || c == 'E')) {
                    f->phase = NUM_E;
                    return 1;
                }
                break; /* the number ended before c */
            case NUM_DOT:
                if (!digit) return 0;
                f->phase = NUM_FRAC;
                f->n = 1;
                return 1;
            case NUM_FRAC:
                if (digit) {
                    if (f->n >= FRAC_DIGITS) return 0;
                    f->n++;
                    return 1;
                }
                if (c == 'e' || c == 'E') {
                    f->phase = NUM_E;
                    return 1;
                }
                break;
            case NUM_E:
                if (c == '+' || c == '-') {
                    f->phase = NUM_ESIGN;
                    return 1;
                }
                if (!digit) return 0;
                f->phase = NUM_EXP;
                f->n = 1;
                return 1;
            case NUM_ESIGN:
                if (!digit) return 0;
                f->phase = NUM_EXP;
                f->n = 1;
                return 1;
            case NUM_EXP:
                if (digit) {
                    if (f->n >= EXP_DIGITS) return 0;
                    f->n++;
                    return 1;
                }
                break;
            default: return 0;
            }
            pop(s, st);
            continue; /* c belongs to the parent */
        }
        case F_LIT: {
            uint32_t lo = (uint32_t)f->mask, hi = (uint32_t)(f->mask >> 32), a = hi, b = lo;
            for (uint32_t i = lo; i < hi; i++)
                if (n->lit_len[i] > f->n && (unsigned char)n->lits[i][f->n] == c) {
                    if (a == hi) a = i;
                    b = i + 1;
                }
            if (a == hi) {
                if (!lit_complete(s, f)) return 0;
                pop(s, st); /* a number literal ended before c */
                continue;
            }
            f->mask = (uint64_t)a | (uint64_t)b << 32;
            f->n++;
            if (b - a == 1 && n->lit_len[a] == f->n) pop(s, st);
            return 1;
        }
        default: return 0;
        }
    }
}

static int state_can_end(const dhsa_json_schema *s, const jstate *st) {
    const frame *t = &st->f[st->depth - 1];
    if (st->depth == 1) return t->phase == R_DONE;
    if (st->depth != 2) return 0;
    if (t->kind == F_NUM) return num_terminal(t);
    if (t->kind == F_LIT) return lit_complete(s, t);
    return 0;
}

/* --------------------------------------------------------------------- */
/* Vocabulary                                                             */

static int utf8_plain(const uint8_t *p, int64_t n, int32_t *cps) {
    int32_t k = 0;
    for (int64_t i = 0; i < n;) {
        uint8_t c = p[i];
        int need;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c < 0x20 || c == '"' || c == '\\') return 0;
        if (c < 0x80) need = 0;
        else if (c >= 0xC2 && c <= 0xDF) need = 1;
        else if (c == 0xE0) need = 2, lo = 0xA0;
        else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) need = 2;
        else if (c == 0xED) need = 2, hi = 0x9F;
        else if (c == 0xF0) need = 3, lo = 0x90;
        else if (c >= 0xF1 && c <= 0xF3) need = 3;
        else if (c == 0xF4) need = 3, hi = 0x8F;
        else return 0;
        for (int j = 1; j <= need; j++) {
            if (i + j >= n) return 0;
            uint8_t d = p[i + j];
            if (d < (j == 1 ? lo : 0x80) || d > (j == 1 ? hi : 0xBF)) return 0;
        }
        i += need + 1;
        k++;
    }
    *cps = k;
    return 1;
}

void dhsa_json_vocab_free(dhsa_json_vocab *v) {
    if (!v) return;
    free(v->off);
    free(v->bytes);
    free(v->plain);
    free(v->cps);
    free(v->order);
    free(v);
}

dhsa_status dhsa_json_vocab_create(const dhsa_tokenizer *t, dhsa_json_vocab **out) {
    if (!out || !t) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_json_vocab_create: NULL argument");
    *out = NULL;
    const int64_t V = dhsa_tokenizer_n_vocab(t);
    dhsa_json_vocab *v = calloc(1, sizeof *v);
    if (!v) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory");
    v->n_vocab = V;
    v->off = malloc((size_t)(V + 1) * sizeof *v->off);
    v->plain = calloc((size_t)V, 1);
    v->cps = calloc((size_t)V, sizeof *v->cps);
    v->order = malloc((size_t)V * sizeof *v->order);
    int64_t cap = V * 8 + 64, used = 0;
    v->bytes = malloc((size_t)cap);
    if (!v->off || !v->plain || !v->cps || !v->order || !v->bytes) {
        dhsa_json_vocab_free(v);
        return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory for a vocabulary of %lld tokens", (long long)V);
    }
    int64_t count[257] = {0};
    for (int64_t id = 0; id < V; id++) {
        v->off[id] = used;
        int64_t len = 0;
        dhsa_status st = dhsa_token_to_piece(t, (int32_t)id, 0, (char *)v->bytes + used, cap - used, &len);
        if (st == DHSA_ERR_INVALID_ARG && len > cap - used) {
            int64_t nc = cap;
            while (nc - used < len) nc *= 2;
            uint8_t *b = realloc(v->bytes, (size_t)nc);
            if (!b) {
                dhsa_json_vocab_free(v);
                return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory for the vocabulary's bytes");
            }
            v->bytes = b;
            cap = nc;
            st = dhsa_token_to_piece(t, (int32_t)id, 0, (char *)v->bytes + used, cap - used, &len);
        }
        if (st) {
            dhsa_json_vocab_free(v);
            return st;
        }
        used += len;
        if (len > 0) {
            count[v->bytes[v->off[id]]]++;
            v->plain[id] = (uint8_t)utf8_plain(v->bytes + v->off[id], len, &v->cps[id]);
        }
    }
    v->off[V] = used;
    v->first[0] = 0;
    for (int b = 0; b < 256; b++) v->first[b + 1] = v->first[b] + count[b];
    int64_t at[256];
    for (int b = 0; b < 256; b++) at[b] = v->first[b];
    for (int64_t id = 0; id < V; id++)
        if (v->off[id + 1] > v->off[id]) v->order[at[v->bytes[v->off[id]]]++] = (int32_t)id;
    *out = v;
    return DHSA_OK;
}

/* --------------------------------------------------------------------- */
/* Constraints                                                            */

dhsa_status dhsa_json_constraint_create(const dhsa_json_schema *s, const dhsa_json_vocab *v,
                                        dhsa_json_constraint **out) {
    if (!out || !s) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_json_constraint_create: NULL argument");
    *out = NULL;
    dhsa_json_constraint *c = calloc(1, sizeof *c);
    if (!c) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory");
    c->s = s;
    c->v = v;
    if (v) {
        c->allowed = malloc((size_t)(v->n_vocab ? v->n_vocab : 1));
        if (!c->allowed) {
            free(c);
            return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory");
        }
    }
    state_init(&c->st, s->root);
    *out = c;
    return DHSA_OK;
}

void dhsa_json_constraint_free(dhsa_json_constraint *c) {
    if (!c) return;
    free(c->allowed);
    free(c);
}

void dhsa_json_constraint_reset(dhsa_json_constraint *c) {
    if (c) state_init(&c->st, c->s->root);
}

static int run_bytes(const dhsa_json_schema *s, jstate *st, const uint8_t *p, int64_t n, int64_t *at) {
    for (int64_t i = 0; i < n; i++)
        if (!step(s, st, p[i])) {
            if (at) *at = i;
            return 0;
        }
    return 1;
}

dhsa_status dhsa_json_constraint_feed(dhsa_json_constraint *c, const char *bytes, int64_t n) {
    if (!c || (n > 0 && !bytes) || n < 0) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_json_constraint_feed: bad argument");
    copy_state(&c->t1, &c->st);
    int64_t at = 0;
    if (!run_bytes(c->s, &c->t1, (const uint8_t *)bytes, n, &at)) {
        unsigned char b = (unsigned char)bytes[at];
        return dhsa__fail(DHSA_ERR_FORMAT, "byte %lld (%s%c%s0x%02x) cannot continue the JSON value here",
                          (long long)at, b >= 0x20 && b < 0x7f ? "'" : "", b >= 0x20 && b < 0x7f ? b : ' ',
                          b >= 0x20 && b < 0x7f ? "', " : "", b);
    }
    copy_state(&c->st, &c->t1);
    return DHSA_OK;
}

int dhsa_json_constraint_can_end(const dhsa_json_constraint *c) { return c && state_can_end(c->s, &c->st); }

int dhsa_json_constraint_finished(const dhsa_json_constraint *c) {
    return c && c->st.depth == 1 && c->st.f[0].phase == R_DONE;
}

int dhsa_json_constraint_allows(dhsa_json_constraint *c, int32_t id) {
    if (!c || !c->v || id < 0 || id >= c->v->n_vocab) return 0;
    const dhsa_json_vocab *v = c->v;
    if (v->off[id + 1] == v->off[id]) return 0;
    copy_state(&c->t1, &c->st);
    return run_bytes(c->s, &c->t1, v->bytes + v->off[id], v->off[id + 1] - v->off[id], NULL);
}

dhsa_status dhsa_json_constraint_accept(dhsa_json_constraint *c, int32_t id) {
    if (!c || !c->v) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_json_constraint_accept: no constraint or vocabulary");
    if (id < 0 || id >= c->v->n_vocab)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "token %lld is outside the vocabulary", (long long)id);
    if (!dhsa_json_constraint_allows(c, id))
        return dhsa__fail(DHSA_ERR_FORMAT, "token %lld cannot continue the JSON value here", (long long)id);
    copy_state(&c->st, &c->t1);
    return DHSA_OK;
}

dhsa_status dhsa_json_constraint_mask(dhsa_json_constraint *c, float *logits, const int32_t *end_ids, int64_t n_end,
                                      int64_t *n_allowed) {
    if (n_allowed) *n_allowed = 0;
    if (!c || !c->v || !logits || (n_end > 0 && !end_ids))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_json_constraint_mask: bad argument");
    const dhsa_json_vocab *v = c->v;
    const int64_t V = v->n_vocab;
    memset(c->allowed, 0, (size_t)V);
    /* inside a string, plain tokens need no run: how many code points fit */
    const frame *top = &c->st.f[c->st.depth - 1];
    int64_t room = -1;
    if (top->kind == F_STR && top->phase == S_NORMAL) {
        const jnode *n = &c->s->nodes[top->node];
        room = n->max_len < 0 ? INT64_MAX : n->max_len - top->n;
    }
    int64_t count = 0;
    for (int b = 0; b < 256; b++) {
        if (v->first[b] == v->first[b + 1]) continue;
        copy_state(&c->t1, &c->st);
        if (!step(c->s, &c->t1, (unsigned char)b)) continue;
        for (int64_t k = v->first[b]; k < v->first[b + 1]; k++) {
            const int32_t id = v->order[k];
            const int64_t len = v->off[id + 1] - v->off[id];
            int ok;
            if (len == 1) ok = 1;
            else if (room >= 0 && v->plain[id]) ok = v->cps[id] <= room;
            else {
                copy_state(&c->t2, &c->t1);
                ok = run_bytes(c->s, &c->t2, v->bytes + v->off[id] + 1, len - 1, NULL);
            }
            c->allowed[id] = (uint8_t)ok;
            count += ok;
        }
    }
    const int can_end = state_can_end(c->s, &c->st);
    for (int64_t i = 0; i < n_end; i++) {
        int32_t id = end_ids[i];
        if (id < 0 || id >= V) continue;
        if (c->allowed[id] != can_end) {
            count += can_end ? 1 : -1;
            c->allowed[id] = (uint8_t)can_end;
        }
    }
    if (count == 0)
        return dhsa__fail(DHSA_ERR_UNSUPPORTED, "no token of the vocabulary can continue the JSON value here "
                          "(nothing to sample)");
    for (int64_t i = 0; i < V; i++)
        if (!c->allowed[i]) logits[i] = -INFINITY;
    if (n_allowed) *n_allowed = count;
    return DHSA_OK;
}
