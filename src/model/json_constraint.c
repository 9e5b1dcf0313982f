/* json_constraint.c: sampling constrained to JSON and to a JSON Schema
 * subset (the "Structured output" block of include/dhsa.h): the runtime
 * half. The schema is compiled by src/model/json_schema.c into nodes
 * (src/model/json_schema.h); this file runs them.
 *
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
 * Tests: tests/test_json_constraint.c (accepted and refused texts, the mask
 * against token-by-token feeding, generation with the shipped model
 * validated by an independent checker).
 */
#include "core/internal.h"
#include "dhsa.h"
#include "model/json_schema.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FRAMES (VALUE_MAX_DEPTH + 3) /* root, values, a property name */
#define INT_DIGITS 16
#define FRAC_DIGITS 16
#define EXP_DIGITS 3

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
                if (dhsa__json_hexval(c) < 0) return 0;
                /* \uD800-\uDFFF (surrogates) refused: what follows is not
                 * checked to pair them, and a lone one is not text */
                if (f->a == 0) f->lo = c == 'd' || c == 'D';
                else if (f->a == 1 && f->lo && dhsa__json_hexval(c) >= 8) return 0;
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
