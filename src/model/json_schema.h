/* json_schema.h: a compiled JSON Schema, what src/model/json_schema.c
 * (reading and compiling the schema text) writes and
 * src/model/json_constraint.c (the automaton and the token mask) reads.
 * Private to those two files; the API is the "Structured output" block of
 * include/dhsa.h.
 *
 * A schema is a table of nodes; a node is one shape a value may take.
 * Nodes 0 .. ND_BUILTIN-1 are the same in every schema (an unconstrained
 * value and its shapes); the compiler appends the schema's own and sets
 * root.
 */
#ifndef DHSA_MODEL_JSON_SCHEMA_H
#define DHSA_MODEL_JSON_SCHEMA_H

#include "dhsa.h"

#include <stdint.h>

#define VALUE_MAX_DEPTH 32 /* nesting of generated values (the compiler refuses deeper schemas) */
#define MAX_PROPS 64       /* properties of an object node: bits of jnode.required and of a frame's mask */

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

/* The value of hex digit c, -1 if c is none: \u escapes in the schema's
 * strings and in generated text. */
static inline int dhsa__json_hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

#endif
