/* gguf.c: GGUF v2/v3 reader (over mmap, or a caller's buffer) and writer.
 *
 * Contract: the reader trusts nothing in the file. Every count, string
 * length, array length, dim, type id, tensor offset + size and the alignment
 * is checked against the bytes that are left before it is used, with
 * overflow-safe arithmetic, and counts are bounded by the file size before
 * anything is allocated (so a 2^63 count costs nothing). What the reader
 * keeps (keys, values, names) is copied out and decoded from little endian;
 * tensor data stays in the mapping. A malformed file gives DHSA_ERR_FORMAT
 * and one sentence naming what is wrong, where (kv / tensor info, key or
 * name, escaped: they may hold any bytes) and at which byte offset. The
 * writer emits v3 with alignment 32.
 *
 * Layout, as read here (all little endian):
 *   "GGUF" u32 version (2|3) u64 n_tensors u64 n_kv
 *   n_kv x { string key, u32 type, value }
 *   n_tensors x { string name, u32 n_dims, u64 dims[n_dims], u32 type,
 *                 u64 offset }
 *   padding to general.alignment (default 32), then the data section.
 *   string = u64 len + bytes; array = u32 elem type, u64 n, n values.
 *
 * Tests: tests/test_gguf.c (real files from ../shared, a writer round trip,
 * truncation, corruption, patched counts and a mutation fuzz loop over
 * dhsa_gguf_fuzz_one). Docs: docs/gguf.md.
 */
#include "model/gguf.h"
#include "core/internal.h"
#include "core/procmem.h"
#include "util/outfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* --------------------------------------------------------------------- */
/* Types                                                                  */

static size_t scalar_size(uint32_t t) {
    switch (t) {
    case DHSA_GGUF_UINT8: case DHSA_GGUF_INT8: case DHSA_GGUF_BOOL: return 1;
    case DHSA_GGUF_UINT16: case DHSA_GGUF_INT16: return 2;
    case DHSA_GGUF_UINT32: case DHSA_GGUF_INT32: case DHSA_GGUF_FLOAT32: return 4;
    case DHSA_GGUF_UINT64: case DHSA_GGUF_INT64: case DHSA_GGUF_FLOAT64: return 8;
    default: return 0; /* STRING, ARRAY, unknown */
    }
}

const char *dhsa_gguf_type_name(dhsa_gguf_type t) {
    switch (t) {
    case DHSA_GGUF_UINT8: return "UINT8";
    case DHSA_GGUF_INT8: return "INT8";
    case DHSA_GGUF_UINT16: return "UINT16";
    case DHSA_GGUF_INT16: return "INT16";
    case DHSA_GGUF_UINT32: return "UINT32";
    case DHSA_GGUF_INT32: return "INT32";
    case DHSA_GGUF_FLOAT32: return "FLOAT32";
    case DHSA_GGUF_BOOL: return "BOOL";
    case DHSA_GGUF_STRING: return "STRING";
    case DHSA_GGUF_ARRAY: return "ARRAY";
    case DHSA_GGUF_UINT64: return "UINT64";
    case DHSA_GGUF_INT64: return "INT64";
    case DHSA_GGUF_FLOAT64: return "FLOAT64";
    }
    return "?";
}

/* Sizes dhsa knows (blk elements per blk_bytes bytes); names for a few
 * more ids so that an error can say what a file holds. */
static const struct {
    uint32_t id;
    const char *name;
    int64_t blk, blk_bytes; /* 0: size unknown to dhsa */
} ggml_types[] = {
    {0, "F32", 1, 4},        {1, "F16", 1, 2},        {2, "Q4_0", 32, 18},     {3, "Q4_1", 32, 20},
    {6, "Q5_0", 32, 22},     {7, "Q5_1", 32, 24},     {8, "Q8_0", 32, 34},     {9, "Q8_1", 0, 0},
    {10, "Q2_K", 256, 84},   {11, "Q3_K", 256, 110},  {12, "Q4_K", 256, 144},  {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210},  {15, "Q8_K", 0, 0},      {16, "IQ2_XXS", 0, 0},   {17, "IQ2_XS", 0, 0},
    {18, "IQ3_XXS", 0, 0},   {19, "IQ1_S", 0, 0},     {20, "IQ4_NL", 32, 18},  {21, "IQ3_S", 0, 0},
    {22, "IQ2_S", 0, 0},     {23, "IQ4_XS", 256, 136}, {24, "I8", 0, 0},       {25, "I16", 0, 0},
    {26, "I32", 0, 0},       {27, "I64", 0, 0},       {28, "F64", 0, 0},       {29, "IQ1_M", 0, 0},
    {30, "BF16", 1, 2},      {34, "TQ1_0", 0, 0},     {35, "TQ2_0", 0, 0},
};

static int ggml_type_index(uint32_t id) {
    for (size_t i = 0; i < sizeof ggml_types / sizeof ggml_types[0]; i++)
        if (ggml_types[i].id == id) return (int)i;
    return -1;
}

const char *dhsa_ggml_type_name(uint32_t ggml_type) {
    int k = ggml_type_index(ggml_type);
    return k < 0 ? "?" : ggml_types[k].name;
}

enum { TB_OK = 0, TB_UNKNOWN_TYPE, TB_BAD_NDIMS, TB_NEG_DIM, TB_OVERFLOW, TB_BLOCK };

/* Element count and bytes of a tensor; *bytes = -1 for a type of unknown
 * size (TB_UNKNOWN_TYPE, *nel still set). */
static int tensor_size(uint32_t type, int n_dims, const int64_t *dims, int64_t *nel, int64_t *bytes) {
    *nel = 0;
    *bytes = -1;
    if (n_dims < 0 || n_dims > DHSA_GGUF_MAX_DIMS) return TB_BAD_NDIMS;
    int64_t n = 1;
    for (int d = 0; d < n_dims; d++) {
        if (dims[d] < 0) return TB_NEG_DIM;
        if (dims[d] != 0 && n > INT64_MAX / dims[d]) return TB_OVERFLOW;
        n *= dims[d];
    }
    *nel = n;
    int k = ggml_type_index(type);
    if (k < 0 || ggml_types[k].blk == 0) return TB_UNKNOWN_TYPE;
    int64_t blk = ggml_types[k].blk, bb = ggml_types[k].blk_bytes;
    int64_t row = n_dims > 0 ? dims[0] : 1;
    if (row % blk != 0) return TB_BLOCK;
    int64_t nb = n / blk;
    if (nb > INT64_MAX / bb) return TB_OVERFLOW;
    *bytes = nb * bb;
    return TB_OK;
}

dhsa_status dhsa_ggml_tensor_bytes(uint32_t ggml_type, int n_dims, const int64_t *dims, int64_t *bytes) {
    if (!bytes || (n_dims > 0 && !dims)) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_ggml_tensor_bytes: NULL argument");
    int64_t nel;
    switch (tensor_size(ggml_type, n_dims, dims, &nel, bytes)) {
    case TB_OK: return DHSA_OK;
    case TB_UNKNOWN_TYPE:
        return dhsa__fail(DHSA_ERR_UNSUPPORTED, "ggml type %u (%s): dhsa does not know its size", ggml_type,
                          dhsa_ggml_type_name(ggml_type));
    case TB_BAD_NDIMS: return dhsa__fail(DHSA_ERR_SHAPE, "a tensor has 0..4 dims, not %d", n_dims);
    case TB_NEG_DIM: return dhsa__fail(DHSA_ERR_SHAPE, "a tensor dim is negative");
    case TB_OVERFLOW: return dhsa__fail(DHSA_ERR_TOO_LARGE, "the tensor's size overflows 64 bits");
    default:
        return dhsa__fail(DHSA_ERR_SHAPE, "dim 0 (%lld) is not a multiple of the %s block (%lld elements)",
                          (long long)dims[0], dhsa_ggml_type_name(ggml_type),
                          (long long)ggml_types[ggml_type_index(ggml_type)].blk);
    }
}

/* --------------------------------------------------------------------- */
/* The reader's object                                                    */

/* Stable storage for copied strings and decoded arrays: a list of chunks,
 * never moved, freed at close. */
typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
} chunk; /* followed by cap bytes; sizeof is a multiple of 8 */

struct dhsa_gguf {
    const uint8_t *base;
    uint64_t size;
    void *map;       /* mmap'd region (munmap at close), or NULL */
    size_t map_len;
    void *owned;     /* read() copy (free at close), or NULL */
    uint32_t version;
    uint64_t alignment, data_start;
    dhsa_gguf_kv *kv;
    int64_t n_kv, cap_kv;
    dhsa_gguf_tensor *t;
    int64_t n_t, cap_t;
    int64_t *kv_hash, *t_hash; /* open addressing, index + 1 (0 = empty) */
    uint64_t kv_hcap, t_hcap;
    chunk *chunks;
    size_t heap;     /* what the reader's own allocations hold (dhsa__heap_block) */
};

/* Bytes the reader asked the allocator for during the last open on this
 * thread (cumulative, so an over-estimate of the peak): the tests and the
 * fuzz harness hold it to a multiple of the file size. */
static _Thread_local uint64_t open_alloc_bytes;

uint64_t dhsa_gguf__last_open_alloc(void) { return open_alloc_bytes; }

/* An allocation the reader keeps: counted for the open and for the plan. */
static void counted(dhsa_gguf *g, uint64_t bytes) {
    open_alloc_bytes += bytes;
    g->heap += dhsa__heap_block((size_t)bytes);
}

void dhsa_gguf__memory(const dhsa_gguf *g, const void **map, size_t *mapped, size_t *owned, size_t *heap) {
    *map = g->map;
    *mapped = g->map ? g->map_len : 0;
    *owned = g->owned ? (size_t)g->size : 0;
    *heap = g->heap;
}

void dhsa_gguf__bytes(const dhsa_gguf *g, const uint8_t **base, uint64_t *size) {
    *base = g->base;
    *size = g->size;
}

static void *arena_alloc(dhsa_gguf *g, size_t n) {
    if (n > SIZE_MAX - 64) return NULL;
    n = (n + 7) & ~(size_t)7;
    chunk *c = g->chunks;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > ((size_t)1 << 16) ? n : ((size_t)1 << 16);
        c = malloc(sizeof(chunk) + cap);
        if (!c) return NULL;
        counted(g, sizeof(chunk) + cap);
        c->cap = cap;
        c->used = 0;
        c->next = g->chunks;
        g->chunks = c;
    }
    void *p = (uint8_t *)(c + 1) + c->used;
    c->used += n;
    return p;
}

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

/* Looks name up in a table whose entries name strings through get(i). */
typedef const char *(*name_of_fn)(const dhsa_gguf *g, int64_t i, int64_t *len);
static const char *kv_name(const dhsa_gguf *g, int64_t i, int64_t *len) {
    *len = g->kv[i].key_len;
    return g->kv[i].key;
}
static const char *t_name(const dhsa_gguf *g, int64_t i, int64_t *len) {
    *len = (int64_t)strlen(g->t[i].name);
    return g->t[i].name;
}

static int64_t hash_find(const dhsa_gguf *g, const int64_t *tab, uint64_t cap, name_of_fn get, const char *s,
                         size_t n) {
    if (!tab) return -1;
    for (uint64_t h = hash_bytes(s, n) & (cap - 1);; h = (h + 1) & (cap - 1)) {
        if (tab[h] == 0) return -1;
        int64_t len;
        const char *name = get(g, tab[h] - 1, &len);
        if ((size_t)len == n && memcmp(name, s, n) == 0) return tab[h] - 1;
    }
}

/* Builds a table over n names; returns the index of a duplicate's second
 * occurrence, -1 if none, or -2 when out of memory. */
static int64_t hash_build(dhsa_gguf *g, int64_t **tab, uint64_t *cap, int64_t n, name_of_fn get) {
    uint64_t c = 16;
    while (c < (uint64_t)n * 2) c *= 2;
    *tab = calloc(c, sizeof(int64_t));
    if (!*tab) return -2;
    counted(g, c * sizeof(int64_t));
    *cap = c;
    for (int64_t i = 0; i < n; i++) {
        int64_t len;
        const char *s = get(g, i, &len);
        uint64_t h = hash_bytes(s, (size_t)len) & (c - 1);
        for (; (*tab)[h] != 0; h = (h + 1) & (c - 1)) {
            int64_t l2;
            const char *s2 = get(g, (*tab)[h] - 1, &l2);
            if (l2 == len && memcmp(s, s2, (size_t)len) == 0) return i;
        }
        (*tab)[h] = i + 1;
    }
    return -1;
}

void dhsa_gguf_close(dhsa_gguf *g) {
    if (!g) return;
    while (g->chunks) {
        chunk *n = g->chunks->next;
        free(g->chunks);
        g->chunks = n;
    }
    free(g->kv);
    free(g->t);
    free(g->kv_hash);
    free(g->t_hash);
    if (g->map) munmap(g->map, g->map_len);
    free(g->owned);
    free(g);
}

/* --------------------------------------------------------------------- */
/* Parsing                                                                */

typedef struct {
    dhsa_gguf *g;
    const uint8_t *p;
    uint64_t size, pos;
    char where[192]; /* "kv 3 ('llama.block_count')" */
} parser;

static dhsa_status pfail_at(parser *ps, dhsa_status st, uint64_t at, const char *fmt, ...) DHSA_PRINTF(4, 5);
static dhsa_status pfail_at(parser *ps, dhsa_status st, uint64_t at, const char *fmt, ...) {
    char msg[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return dhsa__fail(st, "GGUF: %s (in %s, at byte offset %llu of a %llu-byte file)", msg, ps->where,
                      (unsigned long long)at, (unsigned long long)ps->size);
}
#define PFAIL(ps, at, ...) pfail_at((ps), DHSA_ERR_FORMAT, (at), __VA_ARGS__)

static uint64_t left(const parser *ps) { return ps->size - ps->pos; }

static dhsa_status need(parser *ps, uint64_t n, const char *what) {
    if (n <= left(ps)) return DHSA_OK;
    return PFAIL(ps, ps->pos, "the file ends inside %s: %llu bytes needed, %llu left", what,
                 (unsigned long long)n, (unsigned long long)left(ps));
}

static uint64_t le(const uint8_t *p, size_t n) {
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static dhsa_status rd_u32(parser *ps, uint32_t *v, const char *what) {
    dhsa_status st = need(ps, 4, what);
    if (st) return st;
    *v = (uint32_t)le(ps->p + ps->pos, 4);
    ps->pos += 4;
    return DHSA_OK;
}

static dhsa_status rd_u64(parser *ps, uint64_t *v, const char *what) {
    dhsa_status st = need(ps, 8, what);
    if (st) return st;
    *v = le(ps->p + ps->pos, 8);
    ps->pos += 8;
    return DHSA_OK;
}

/* A string (u64 length + bytes). copy: into out (NUL-terminated, in the
 * arena); otherwise skipped. */
static dhsa_status rd_str(parser *ps, const char *what, uint64_t max_len, int copy, dhsa_gguf_str *out) {
    uint64_t at = ps->pos, n;
    dhsa_status st = rd_u64(ps, &n, what);
    if (st) return st;
    if (n > max_len)
        return PFAIL(ps, at, "%s has length %llu, over the limit of %llu bytes", what, (unsigned long long)n,
                     (unsigned long long)max_len);
    if (n > left(ps))
        return PFAIL(ps, at, "%s has length %llu, past the end of the file (%llu bytes left)", what,
                     (unsigned long long)n, (unsigned long long)left(ps));
    if (copy) {
        char *s = arena_alloc(ps->g, (size_t)n + 1);
        if (!s) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "GGUF: out of memory copying a %llu-byte string", (unsigned long long)n);
        memcpy(s, ps->p + ps->pos, (size_t)n);
        s[n] = 0;
        out->str = s;
        out->len = (int64_t)n;
    }
    ps->pos += n;
    return DHSA_OK;
}

/* Two's complement sign extension of an sz-byte value, without
 * implementation-defined conversions. */
static int64_t sext(uint64_t raw, size_t sz) {
    if (sz == 8) {
        int64_t v;
        memcpy(&v, &raw, 8);
        return v;
    }
    uint64_t sign = (uint64_t)1 << (8 * sz - 1);
    return (int64_t)(raw & (sign - 1)) - (int64_t)(raw & sign);
}

/* Decodes a scalar of type t at ps->pos into kv fields. */
static dhsa_status rd_scalar(parser *ps, uint32_t t, dhsa_gguf_kv *kv) {
    size_t sz = scalar_size(t);
    uint64_t at = ps->pos;
    dhsa_status st = need(ps, sz, "a value");
    if (st) return st;
    uint64_t raw = le(ps->p + ps->pos, sz);
    ps->pos += sz;
    switch (t) {
    case DHSA_GGUF_BOOL:
        if (raw > 1) return PFAIL(ps, at, "a BOOL holds %llu, not 0 or 1", (unsigned long long)raw);
        kv->u = raw;
        break;
    case DHSA_GGUF_INT8: case DHSA_GGUF_INT16: case DHSA_GGUF_INT32: case DHSA_GGUF_INT64:
        kv->i = sext(raw, sz);
        break;
    case DHSA_GGUF_FLOAT32: {
        uint32_t b = (uint32_t)raw;
        float f;
        memcpy(&f, &b, 4);
        kv->f = f;
        break;
    }
    case DHSA_GGUF_FLOAT64: memcpy(&kv->f, &raw, 8); break;
    default: kv->u = raw; break;
    }
    return DHSA_OK;
}

static dhsa_status rd_array(parser *ps, dhsa_gguf_array *arr, int depth) {
    uint64_t at = ps->pos;
    uint32_t et;
    uint64_t n;
    dhsa_status st = rd_u32(ps, &et, "an array's element type");
    if (st) return st;
    if (et > DHSA_GGUF_FLOAT64) return PFAIL(ps, at, "unknown array element type id %u", et);
    if ((st = rd_u64(ps, &n, "an array's length"))) return st;
    arr->type = (dhsa_gguf_type)et;
    size_t sz = scalar_size(et);
    /* The smallest an element can be in the file bounds n before any
     * allocation. */
    uint64_t min_elem = sz ? sz : et == DHSA_GGUF_STRING ? 8 : 12;
    if (n > left(ps) / min_elem)
        return PFAIL(ps, at + 4, "an array of %llu %s elements cannot fit in the %llu bytes left", (unsigned long long)n,
                     dhsa_gguf_type_name((dhsa_gguf_type)et), (unsigned long long)left(ps));
    arr->n = (int64_t)n;
    arr->data = NULL;
    if (sz) {
        uint8_t *d = n ? arena_alloc(ps->g, (size_t)(n * sz)) : NULL;
        if (n && !d) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "GGUF: out of memory for an array of %llu elements", (unsigned long long)n);
        const uint8_t *src = ps->p + ps->pos;
        for (uint64_t i = 0; i < n; i++) {
            uint64_t v = le(src + i * sz, sz);
            if (et == DHSA_GGUF_BOOL && v > 1)
                return PFAIL(ps, ps->pos + i, "BOOL element %llu of an array holds %llu, not 0 or 1",
                             (unsigned long long)i, (unsigned long long)v);
            switch (sz) { /* native copies of the decoded value */
            case 1: d[i] = (uint8_t)v; break;
            case 2: { uint16_t x = (uint16_t)v; memcpy(d + i * 2, &x, 2); break; }
            case 4: { uint32_t x = (uint32_t)v; memcpy(d + i * 4, &x, 4); break; }
            default: memcpy(d + i * 8, &v, 8); break;
            }
        }
        ps->pos += n * sz;
        arr->data = d;
    } else if (et == DHSA_GGUF_STRING) {
        dhsa_gguf_str *s = n ? arena_alloc(ps->g, (size_t)n * sizeof *s) : NULL;
        if (n && !s) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "GGUF: out of memory for an array of %llu strings", (unsigned long long)n);
        for (uint64_t i = 0; i < n; i++)
            if ((st = rd_str(ps, "a string in an array", UINT64_MAX, 1, &s[i]))) return st;
        arr->data = s;
    } else {
        /* An array of arrays: walked and checked, listed, not kept. */
        if (depth > 0) return PFAIL(ps, at, "arrays nested more than one level deep are not supported");
        for (uint64_t i = 0; i < n; i++) {
            uint64_t at2 = ps->pos;
            uint32_t et2;
            uint64_t n2;
            if ((st = rd_u32(ps, &et2, "an inner array's element type"))) return st;
            if (et2 > DHSA_GGUF_FLOAT64) return PFAIL(ps, at2, "unknown array element type id %u", et2);
            if (et2 == DHSA_GGUF_ARRAY)
                return PFAIL(ps, at2, "arrays nested more than one level deep are not supported");
            if ((st = rd_u64(ps, &n2, "an inner array's length"))) return st;
            size_t sz2 = scalar_size(et2);
            uint64_t min2 = sz2 ? sz2 : 8;
            if (n2 > left(ps) / min2)
                return PFAIL(ps, at2 + 4, "an inner array of %llu %s elements cannot fit in the %llu bytes left",
                             (unsigned long long)n2, dhsa_gguf_type_name((dhsa_gguf_type)et2),
                             (unsigned long long)left(ps));
            if (sz2) {
                ps->pos += n2 * sz2;
            } else {
                for (uint64_t j = 0; j < n2; j++)
                    if ((st = rd_str(ps, "a string in an inner array", UINT64_MAX, 0, NULL))) return st;
            }
        }
    }
    return DHSA_OK;
}

static dhsa_status parse_kv(parser *ps, int64_t idx, dhsa_gguf_kv *kv) {
    memset(kv, 0, sizeof *kv);
    kv->offset = ps->pos;
    snprintf(ps->where, sizeof ps->where, "kv %lld", (long long)idx);
    dhsa_gguf_str key = {0, 0};
    dhsa_status st = rd_str(ps, "the key", DHSA_GGUF_MAX_KEY, 1, &key);
    if (st) return st;
    if (key.len == 0) return PFAIL(ps, kv->offset, "the key is empty");
    kv->key = key.str;
    kv->key_len = key.len;
    char ek[128]; /* the key may hold any bytes: escaped (src/core/escape.c) */
    dhsa__escape(ek, sizeof ek, key.str, (size_t)key.len, DHSA__ESC_QUOTES | DHSA__ESC_ELLIPSIS);
    snprintf(ps->where, sizeof ps->where, "kv %lld ('%s')", (long long)idx, ek);
    uint64_t at = ps->pos;
    uint32_t t;
    if ((st = rd_u32(ps, &t, "the value type"))) return st;
    if (t > DHSA_GGUF_FLOAT64) return PFAIL(ps, at, "unknown value type id %u", t);
    kv->type = (dhsa_gguf_type)t;
    if (t == DHSA_GGUF_STRING) return rd_str(ps, "the string value", UINT64_MAX, 1, &kv->str);
    if (t == DHSA_GGUF_ARRAY) return rd_array(ps, &kv->arr, 0);
    return rd_scalar(ps, t, kv);
}

static dhsa_status parse_tensor(parser *ps, int64_t idx, dhsa_gguf_tensor *t) {
    memset(t, 0, sizeof *t);
    uint64_t start = ps->pos;
    snprintf(ps->where, sizeof ps->where, "tensor info %lld", (long long)idx);
    dhsa_gguf_str name = {0, 0};
    dhsa_status st = rd_str(ps, "the tensor name", DHSA_GGUF_MAX_NAME, 1, &name);
    if (st) return st;
    if (name.len == 0) return PFAIL(ps, start, "the tensor name is empty");
    if ((int64_t)strlen(name.str) != name.len) return PFAIL(ps, start, "the tensor name holds a NUL byte");
    t->name = name.str;
    char en[128];
    dhsa__escape(en, sizeof en, name.str, (size_t)name.len, DHSA__ESC_QUOTES | DHSA__ESC_ELLIPSIS);
    snprintf(ps->where, sizeof ps->where, "tensor info %lld ('%s')", (long long)idx, en);
    uint64_t at = ps->pos;
    uint32_t nd;
    if ((st = rd_u32(ps, &nd, "n_dims"))) return st;
    if (nd > DHSA_GGUF_MAX_DIMS) return PFAIL(ps, at, "n_dims is %u; at most %d are supported", nd, DHSA_GGUF_MAX_DIMS);
    t->n_dims = (int)nd;
    for (int d = 0; d < 4; d++) t->dims[d] = 1;
    for (uint32_t d = 0; d < nd; d++) {
        uint64_t v;
        at = ps->pos;
        if ((st = rd_u64(ps, &v, "a dim"))) return st;
        if (v > (uint64_t)INT64_MAX) return PFAIL(ps, at, "dim %u is %llu, over 2^63 - 1", d, (unsigned long long)v);
        t->dims[d] = (int64_t)v;
    }
    at = ps->pos;
    if ((st = rd_u32(ps, &t->type, "the tensor type"))) return st;
    if ((st = rd_u64(ps, &t->offset, "the tensor offset"))) return st;
    switch (tensor_size(t->type, t->n_dims, t->dims, &t->n_elements, &t->bytes)) {
    case TB_OK: case TB_UNKNOWN_TYPE: break;
    case TB_OVERFLOW:
        return PFAIL(ps, start, "the element count or byte size of dims [%lld, %lld, %lld, %lld] overflows 64 bits",
                     (long long)t->dims[0], (long long)t->dims[1], (long long)t->dims[2], (long long)t->dims[3]);
    case TB_BLOCK:
        return PFAIL(ps, at, "dim 0 (%lld) is not a multiple of the %s block (%lld)", (long long)t->dims[0],
                     dhsa_ggml_type_name(t->type), (long long)ggml_types[ggml_type_index(t->type)].blk);
    default: return PFAIL(ps, start, "bad dims"); /* not reached: checked above */
    }
    return DHSA_OK;
}

static dhsa_status parse(dhsa_gguf *g) {
    parser ps = {.g = g, .p = g->base, .size = g->size, .pos = 0};
    snprintf(ps.where, sizeof ps.where, "the header");
    dhsa_status st;
    if (g->size < 4 || memcmp(g->base, "GGUF", 4) != 0) {
        if (g->size < 4) return PFAIL(&ps, 0, "the file is too short for the magic \"GGUF\"");
        return PFAIL(&ps, 0, "not a GGUF file: the magic is %02x %02x %02x %02x, not \"GGUF\"", g->base[0],
                     g->base[1], g->base[2], g->base[3]);
    }
    ps.pos = 4;
    if ((st = rd_u32(&ps, &g->version, "the version"))) return st;
    if (g->version != 2 && g->version != 3) {
        if (g->version == 1) return PFAIL(&ps, 4, "GGUF version 1 (32-bit counts) is not supported; only 2 and 3");
        if ((g->version & 0xffff) == 0) return PFAIL(&ps, 4, "big-endian GGUF (version field 0x%08x) is not supported", g->version);
        return PFAIL(&ps, 4, "GGUF version %u is not supported; only 2 and 3", g->version);
    }
    uint64_t n_t, n_kv;
    if ((st = rd_u64(&ps, &n_t, "the tensor count"))) return st;
    if ((st = rd_u64(&ps, &n_kv, "the kv count"))) return st;
    /* A kv takes at least 14 bytes (key length 8, a 1-byte key, type 4, a
     * 1-byte value), a tensor info at least 25. */
    if (n_kv > left(&ps) / 14)
        return PFAIL(&ps, 16, "the kv count %llu cannot fit in the %llu bytes left (a kv takes at least 14): truncated or corrupt",
                     (unsigned long long)n_kv, (unsigned long long)left(&ps));
    if (n_t > left(&ps) / 25)
        return PFAIL(&ps, 8, "the tensor count %llu cannot fit in the %llu bytes left (a tensor info takes at least 25): truncated or corrupt",
                     (unsigned long long)n_t, (unsigned long long)left(&ps));

    /* Exact allocations: the counts were bounded by the bytes left. */
    if (n_kv) {
        g->kv = malloc((size_t)n_kv * sizeof *g->kv);
        if (!g->kv) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "GGUF: out of memory for %llu kvs", (unsigned long long)n_kv);
        counted(g, n_kv * sizeof *g->kv);
        g->cap_kv = (int64_t)n_kv;
    }
    for (uint64_t i = 0; i < n_kv; i++) {
        if ((st = parse_kv(&ps, (int64_t)i, &g->kv[g->n_kv]))) return st;
        g->n_kv++;
    }
    int64_t dup = hash_build(g, &g->kv_hash, &g->kv_hcap, g->n_kv, kv_name);
    if (dup == -2) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "GGUF: out of memory for the key table");
    if (dup >= 0) {
        snprintf(ps.where, sizeof ps.where, "kv %lld", (long long)dup);
        return PFAIL(&ps, g->kv[dup].offset, "the key '%s' appears twice",
                     dhsa__escn(g->kv[dup].key, (size_t)g->kv[dup].key_len));
    }

    g->alignment = 32;
    int64_t ai = dhsa_gguf_find_kv(g, "general.alignment");
    if (ai >= 0) {
        const dhsa_gguf_kv *kv = &g->kv[ai];
        snprintf(ps.where, sizeof ps.where, "kv %lld ('general.alignment')", (long long)ai);
        if (kv->type != DHSA_GGUF_UINT32)
            return PFAIL(&ps, kv->offset, "general.alignment has type %s; it must be UINT32", dhsa_gguf_type_name(kv->type));
        if (kv->u == 0 || (kv->u & (kv->u - 1)) != 0)
            return PFAIL(&ps, kv->offset, "general.alignment is %llu, not a power of two", (unsigned long long)kv->u);
        g->alignment = kv->u;
    }

    snprintf(ps.where, sizeof ps.where, "the tensor infos");
    if (n_t > left(&ps) / 25)
        return PFAIL(&ps, 8, "the tensor count %llu cannot fit in the %llu bytes left after the metadata",
                     (unsigned long long)n_t, (unsigned long long)left(&ps));
    if (n_t) {
        g->t = malloc((size_t)n_t * sizeof *g->t);
        if (!g->t) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "GGUF: out of memory for %llu tensor infos", (unsigned long long)n_t);
        counted(g, n_t * sizeof *g->t);
        g->cap_t = (int64_t)n_t;
    }
    for (uint64_t i = 0; i < n_t; i++) {
        if ((st = parse_tensor(&ps, (int64_t)i, &g->t[g->n_t]))) return st;
        g->n_t++;
    }
    dup = hash_build(g, &g->t_hash, &g->t_hcap, g->n_t, t_name);
    if (dup == -2) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "GGUF: out of memory for the tensor table");
    if (dup >= 0) {
        snprintf(ps.where, sizeof ps.where, "tensor info %lld", (long long)dup);
        return PFAIL(&ps, ps.pos, "the tensor name '%s' appears twice", dhsa__esc(g->t[dup].name));
    }

    /* ps.pos <= size < 2^63 and alignment <= 2^31: no overflow. */
    uint64_t pad = (g->alignment - ps.pos % g->alignment) % g->alignment;
    g->data_start = ps.pos + pad;
    snprintf(ps.where, sizeof ps.where, "the data section");
    if (g->n_t > 0 && g->data_start > g->size)
        return PFAIL(&ps, ps.pos, "the data section would start at byte %llu, past the end of the file",
                     (unsigned long long)g->data_start);
    uint64_t data_size = g->data_start <= g->size ? g->size - g->data_start : 0;
    for (int64_t i = 0; i < g->n_t; i++) {
        dhsa_gguf_tensor *t = &g->t[i];
        char en[128];
        dhsa__escape(en, sizeof en, t->name, strlen(t->name), DHSA__ESC_QUOTES | DHSA__ESC_ELLIPSIS);
        snprintf(ps.where, sizeof ps.where, "tensor '%s'", en);
        if (t->offset % g->alignment != 0)
            return PFAIL(&ps, g->data_start, "offset %llu is not a multiple of the alignment %llu",
                         (unsigned long long)t->offset, (unsigned long long)g->alignment);
        if (t->offset > data_size)
            return PFAIL(&ps, g->data_start, "offset %llu is past the end of the %llu-byte data section",
                         (unsigned long long)t->offset, (unsigned long long)data_size);
        if (t->bytes >= 0) {
            if ((uint64_t)t->bytes > data_size - t->offset)
                return PFAIL(&ps, g->data_start,
                             "its data [%llu, %llu) runs past the end of the %llu-byte data section",
                             (unsigned long long)t->offset, (unsigned long long)t->offset + (uint64_t)t->bytes,
                             (unsigned long long)data_size);
            t->data = g->base + g->data_start + t->offset;
        }
    }
    return DHSA_OK;
}

static dhsa_status open_common(dhsa_gguf *g, dhsa_gguf **out) {
    static const uint8_t empty[1];
    open_alloc_bytes = sizeof *g;
    g->heap = dhsa__heap_block(sizeof *g);
    if (!g->base) g->base = empty;
    dhsa_status st = parse(g);
    if (st) {
        dhsa_gguf_close(g);
        return st;
    }
    *out = g;
    return DHSA_OK;
}

dhsa_status dhsa_gguf_open_memory(const void *data, size_t size, dhsa_gguf **out) {
    if (!out) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_gguf_open_memory: out is NULL");
    *out = NULL;
    if (!data && size) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_gguf_open_memory: data is NULL");
    dhsa_gguf *g = calloc(1, sizeof *g);
    if (!g) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "GGUF: out of memory");
    g->base = data;
    g->size = size;
    return open_common(g, out);
}

dhsa_status dhsa_gguf__open_memory_owned(void *data, size_t size, dhsa_gguf **out) {
    if (!out) {
        free(data);
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_gguf__open_memory_owned: out is NULL");
    }
    *out = NULL;
    if (!data && size) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_gguf__open_memory_owned: data is NULL");
    dhsa_gguf *g = calloc(1, sizeof *g);
    if (!g) {
        free(data);
        return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "GGUF: out of memory");
    }
    g->base = data;
    g->size = size;
    g->owned = data; /* freed by dhsa_gguf_close, also when the parse fails */
    return open_common(g, out);
}

dhsa_status dhsa_gguf_open(const char *path, dhsa_gguf **out) {
    if (!out || !path) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_gguf_open: NULL argument");
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return dhsa__fail(DHSA_ERR_IO, "GGUF: cannot open '%s': %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return dhsa__fail(DHSA_ERR_IO, "GGUF: '%s' is not a regular file", path);
    }
    if ((uint64_t)sb.st_size > (uint64_t)SIZE_MAX) {
        close(fd);
        return dhsa__fail(DHSA_ERR_TOO_LARGE, "GGUF: '%s' is too large to map", path);
    }
    dhsa_gguf *g = calloc(1, sizeof *g);
    if (!g) {
        close(fd);
        return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "GGUF: out of memory");
    }
    size_t size = (size_t)sb.st_size;
    g->size = size;
    if (size > 0) {
        void *m = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m != MAP_FAILED) {
            g->map = m;
            g->map_len = size;
            g->base = m;
        } else {
            uint8_t *buf = malloc(size);
            size_t got = 0;
            while (buf && got < size) {
                ssize_t r = read(fd, buf + got, size - got);
                if (r < 0 && errno == EINTR) continue;
                if (r <= 0) break;
                got += (size_t)r;
            }
            if (!buf || got < size) {
                int e = errno;
                free(buf);
                free(g);
                close(fd);
                if (!buf) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "GGUF: out of memory reading '%s'", path);
                return dhsa__fail(DHSA_ERR_IO, "GGUF: cannot read '%s': %s", path, got < size && e ? strerror(e) : "short read");
            }
            g->owned = buf;
            g->base = buf;
        }
    }
    close(fd);
    dhsa_status st = open_common(g, out);
    if (st) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", dhsa_last_error());
        dhsa__fail(st, "%s: %s", path, msg);
    }
    return st;
}

/* --------------------------------------------------------------------- */
/* Queries                                                                */

uint32_t dhsa_gguf_version(const dhsa_gguf *g) { return g ? g->version : 0; }
uint64_t dhsa_gguf_alignment(const dhsa_gguf *g) { return g ? g->alignment : 0; }
uint64_t dhsa_gguf_data_offset(const dhsa_gguf *g) { return g ? g->data_start : 0; }
uint64_t dhsa_gguf_file_size(const dhsa_gguf *g) { return g ? g->size : 0; }
int64_t dhsa_gguf_n_kv(const dhsa_gguf *g) { return g ? g->n_kv : 0; }
int64_t dhsa_gguf_n_tensors(const dhsa_gguf *g) { return g ? g->n_t : 0; }

const dhsa_gguf_kv *dhsa_gguf_kv_at(const dhsa_gguf *g, int64_t i) {
    return g && i >= 0 && i < g->n_kv ? &g->kv[i] : NULL;
}

const dhsa_gguf_tensor *dhsa_gguf_tensor_at(const dhsa_gguf *g, int64_t i) {
    return g && i >= 0 && i < g->n_t ? &g->t[i] : NULL;
}

int64_t dhsa_gguf_find_kv(const dhsa_gguf *g, const char *key) {
    if (!g || !key) return -1;
    return hash_find(g, g->kv_hash, g->kv_hcap, kv_name, key, strlen(key));
}

int64_t dhsa_gguf_find_tensor(const dhsa_gguf *g, const char *name) {
    if (!g || !name) return -1;
    return hash_find(g, g->t_hash, g->t_hcap, t_name, name, strlen(name));
}

dhsa_status dhsa_gguf_tensor_data(const dhsa_gguf *g, int64_t i, const void **data, int64_t *bytes) {
    const dhsa_gguf_tensor *t = dhsa_gguf_tensor_at(g, i);
    if (!t || !data) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_gguf_tensor_data: no tensor %lld", (long long)i);
    if (t->bytes < 0)
        return dhsa__fail(DHSA_ERR_UNSUPPORTED, "GGUF: tensor '%s' has ggml type %u (%s), whose size dhsa does not know",
                          dhsa__esc(t->name), t->type, dhsa_ggml_type_name(t->type));
    *data = t->data;
    if (bytes) *bytes = t->bytes;
    return DHSA_OK;
}

static dhsa_status get_kv(const dhsa_gguf *g, const char *key, const dhsa_gguf_kv **kv) {
    if (!g || !key) return dhsa__fail(DHSA_ERR_INVALID_ARG, "GGUF getter: NULL argument");
    int64_t i = dhsa_gguf_find_kv(g, key);
    if (i < 0) return dhsa__fail(DHSA_ERR_FORMAT, "GGUF: the file has no key '%s'", dhsa__esc(key));
    *kv = &g->kv[i];
    return DHSA_OK;
}

static dhsa_status wrong_type(const dhsa_gguf_kv *kv, const char *want) {
    return dhsa__fail(DHSA_ERR_FORMAT, "GGUF: key '%s' has type %s, not %s", dhsa__escn(kv->key, (size_t)kv->key_len),
                      dhsa_gguf_type_name(kv->type), want);
}

static int is_unsigned(dhsa_gguf_type t) {
    return t == DHSA_GGUF_UINT8 || t == DHSA_GGUF_UINT16 || t == DHSA_GGUF_UINT32 || t == DHSA_GGUF_UINT64;
}
static int is_signed(dhsa_gguf_type t) {
    return t == DHSA_GGUF_INT8 || t == DHSA_GGUF_INT16 || t == DHSA_GGUF_INT32 || t == DHSA_GGUF_INT64;
}

/* An integer kv as (negative?, magnitude-ish): lo/hi checked by callers. */
static dhsa_status get_int(const dhsa_gguf *g, const char *key, int *neg, uint64_t *u, int64_t *i,
                           const dhsa_gguf_kv **kvp) {
    const dhsa_gguf_kv *kv = NULL;
    dhsa_status st = get_kv(g, key, &kv);
    if (st) return st;
    *kvp = kv;
    if (is_unsigned(kv->type)) {
        *neg = 0;
        *u = kv->u;
        return DHSA_OK;
    }
    if (is_signed(kv->type)) {
        *neg = kv->i < 0;
        *i = kv->i;
        *u = kv->i < 0 ? 0 : (uint64_t)kv->i;
        return DHSA_OK;
    }
    return wrong_type(kv, "an integer");
}

static dhsa_status out_of_range(const dhsa_gguf_kv *kv, const char *want) {
    if (is_signed(kv->type))
        return dhsa__fail(DHSA_ERR_FORMAT, "GGUF: key '%s' holds %lld, out of range for %s",
                          dhsa__escn(kv->key, (size_t)kv->key_len), (long long)kv->i, want);
    return dhsa__fail(DHSA_ERR_FORMAT, "GGUF: key '%s' holds %llu, out of range for %s",
                      dhsa__escn(kv->key, (size_t)kv->key_len),
                      (unsigned long long)kv->u, want);
}

dhsa_status dhsa_gguf_get_u32(const dhsa_gguf *g, const char *key, uint32_t *out) {
    int neg;
    uint64_t u;
    int64_t i;
    const dhsa_gguf_kv *kv = NULL;
    dhsa_status st = get_int(g, key, &neg, &u, &i, &kv);
    if (st) return st;
    if (neg || u > UINT32_MAX) return out_of_range(kv, "UINT32");
    *out = (uint32_t)u;
    return DHSA_OK;
}

dhsa_status dhsa_gguf_get_u64(const dhsa_gguf *g, const char *key, uint64_t *out) {
    int neg;
    uint64_t u;
    int64_t i;
    const dhsa_gguf_kv *kv = NULL;
    dhsa_status st = get_int(g, key, &neg, &u, &i, &kv);
    if (st) return st;
    if (neg) return out_of_range(kv, "UINT64");
    *out = u;
    return DHSA_OK;
}

dhsa_status dhsa_gguf_get_i64(const dhsa_gguf *g, const char *key, int64_t *out) {
    int neg;
    uint64_t u;
    int64_t i = 0;
    const dhsa_gguf_kv *kv = NULL;
    dhsa_status st = get_int(g, key, &neg, &u, &i, &kv);
    if (st) return st;
    if (is_signed(kv->type)) {
        *out = i;
        return DHSA_OK;
    }
    if (u > (uint64_t)INT64_MAX) return out_of_range(kv, "INT64");
    *out = (int64_t)u;
    return DHSA_OK;
}

dhsa_status dhsa_gguf_get_f32(const dhsa_gguf *g, const char *key, float *out) {
    const dhsa_gguf_kv *kv = NULL;
    dhsa_status st = get_kv(g, key, &kv);
    if (st) return st;
    if (kv->type != DHSA_GGUF_FLOAT32 && kv->type != DHSA_GGUF_FLOAT64) return wrong_type(kv, "FLOAT32");
    *out = (float)kv->f;
    return DHSA_OK;
}

dhsa_status dhsa_gguf_get_bool(const dhsa_gguf *g, const char *key, int *out) {
    const dhsa_gguf_kv *kv = NULL;
    dhsa_status st = get_kv(g, key, &kv);
    if (st) return st;
    if (kv->type != DHSA_GGUF_BOOL) return wrong_type(kv, "BOOL");
    *out = (int)kv->u;
    return DHSA_OK;
}

dhsa_status dhsa_gguf_get_str(const dhsa_gguf *g, const char *key, const char **out, int64_t *len) {
    const dhsa_gguf_kv *kv = NULL;
    dhsa_status st = get_kv(g, key, &kv);
    if (st) return st;
    if (kv->type != DHSA_GGUF_STRING) return wrong_type(kv, "STRING");
    *out = kv->str.str;
    if (len) *len = kv->str.len;
    return DHSA_OK;
}

dhsa_status dhsa_gguf_get_arr(const dhsa_gguf *g, const char *key, dhsa_gguf_array *out) {
    const dhsa_gguf_kv *kv = NULL;
    dhsa_status st = get_kv(g, key, &kv);
    if (st) return st;
    if (kv->type != DHSA_GGUF_ARRAY) return wrong_type(kv, "ARRAY");
    *out = kv->arr;
    return DHSA_OK;
}

/* --------------------------------------------------------------------- */
/* Fuzz harness body                                                      */

int dhsa_gguf_fuzz_one(const uint8_t *data, size_t size) {
    dhsa_gguf *g;
    dhsa_status st0 = dhsa_gguf_open_memory(data, size, &g);
    if (dhsa_gguf__last_open_alloc() > DHSA_GGUF_ALLOC_CAP(size)) {
        dhsa_gguf_close(g);
        return 1;
    }
    if (st0 != DHSA_OK) return dhsa_last_error()[0] ? 0 : 1;
    int bad = 0;
    volatile uint64_t sink = 0;
    for (int64_t i = 0; i < dhsa_gguf_n_kv(g); i++) {
        const dhsa_gguf_kv *kv = dhsa_gguf_kv_at(g, i);
        for (int64_t c = 0; c < kv->key_len; c++) sink += (uint8_t)kv->key[c];
        if ((int64_t)strlen(kv->key) == kv->key_len && dhsa_gguf_find_kv(g, kv->key) != i) bad = 1;
        uint32_t u32;
        uint64_t u64;
        int64_t i64;
        float f;
        int b;
        const char *s;
        dhsa_gguf_array a;
        /* Every getter on every key: type checks must hold, not crash. */
        if (dhsa_gguf_get_u32(g, kv->key, &u32) == DHSA_OK) sink += u32;
        if (dhsa_gguf_get_u64(g, kv->key, &u64) == DHSA_OK) sink += u64;
        if (dhsa_gguf_get_i64(g, kv->key, &i64) == DHSA_OK) sink += (uint64_t)i64;
        if (dhsa_gguf_get_f32(g, kv->key, &f) == DHSA_OK) sink += (f == f);
        if (dhsa_gguf_get_bool(g, kv->key, &b) == DHSA_OK) sink += (uint64_t)b;
        if (dhsa_gguf_get_str(g, kv->key, &s, &i64) == DHSA_OK)
            for (int64_t c = 0; c <= i64; c++) sink += (uint8_t)s[c]; /* includes the NUL */
        if (dhsa_gguf_get_arr(g, kv->key, &a) == DHSA_OK) {
            if (a.type == DHSA_GGUF_STRING) {
                const dhsa_gguf_str *ss = a.data;
                for (int64_t j = 0; j < a.n; j++) sink += (uint8_t)ss[j].str[ss[j].len];
            } else if (a.type != DHSA_GGUF_ARRAY && a.n > 0) {
                size_t sz = scalar_size(a.type);
                sink += ((const uint8_t *)a.data)[0] + ((const uint8_t *)a.data)[(size_t)a.n * sz - 1];
            }
        }
    }
    for (int64_t i = 0; i < dhsa_gguf_n_tensors(g); i++) {
        const dhsa_gguf_tensor *t = dhsa_gguf_tensor_at(g, i);
        if (dhsa_gguf_find_tensor(g, t->name) != i) bad = 1;
        const void *p;
        int64_t n;
        dhsa_status st = dhsa_gguf_tensor_data(g, i, &p, &n);
        if ((st == DHSA_OK) != (t->bytes >= 0)) bad = 1;
        if (st == DHSA_OK && n > 0) sink += ((const uint8_t *)p)[0] + ((const uint8_t *)p)[n - 1];
        if (st != DHSA_OK && !dhsa_last_error()[0]) bad = 1;
    }
    (void)sink;
    dhsa_gguf_close(g);
    return bad;
}

/* --------------------------------------------------------------------- */
/* Writer                                                                 */

typedef struct {
    char *name;
    size_t name_len;
    uint32_t type;
    int n_dims;
    int64_t dims[4];
    const void *data;
    int64_t bytes;
} wtensor;

struct dhsa_gguf_writer {
    uint8_t *meta; /* encoded kvs, in order */
    size_t meta_len, meta_cap;
    int64_t n_kv;
    char **keys;
    int64_t cap_keys;
    wtensor *t;
    int64_t n_t, cap_t;
    uint64_t alignment;
};

dhsa_status dhsa_gguf_writer_create(dhsa_gguf_writer **out) {
    if (!out) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_gguf_writer_create: out is NULL");
    *out = calloc(1, sizeof **out);
    if (!*out) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "GGUF writer: out of memory");
    (*out)->alignment = 32;
    return DHSA_OK;
}

void dhsa_gguf_writer_free(dhsa_gguf_writer *w) {
    if (!w) return;
    for (int64_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
    for (int64_t i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->keys);
    free(w->t);
    free(w->meta);
    free(w);
}

static int put(dhsa_gguf_writer *w, const void *p, size_t n) {
    if (n > w->meta_cap - w->meta_len) {
        size_t cap = w->meta_cap ? w->meta_cap : 256;
        while (cap - w->meta_len < n) {
            if (cap > SIZE_MAX / 2) return -1;
            cap *= 2;
        }
        uint8_t *m = realloc(w->meta, cap);
        if (!m) return -1;
        w->meta = m;
        w->meta_cap = cap;
    }
    if (n) memcpy(w->meta + w->meta_len, p, n);
    w->meta_len += n;
    return 0;
}

static int put_le(dhsa_gguf_writer *w, uint64_t v, size_t n) {
    uint8_t b[8];
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)(v >> (8 * i));
    return put(w, b, n);
}

static int put_str(dhsa_gguf_writer *w, const char *s, size_t n) {
    return put_le(w, n, 8) || put(w, s, n);
}

/* Starts a kv: checks the key, appends key and type. *mark = where to roll
 * back to on a later failure. */
static dhsa_status kv_begin(dhsa_gguf_writer *w, const char *key, dhsa_gguf_type type, size_t *mark) {
    if (!w || !key) return dhsa__fail(DHSA_ERR_INVALID_ARG, "GGUF writer: NULL argument");
    size_t n = strlen(key);
    if (n == 0 || n > DHSA_GGUF_MAX_KEY)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "GGUF writer: a key must have 1..%d bytes, not %zu", DHSA_GGUF_MAX_KEY, n);
    for (int64_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->keys[i], key) == 0) return dhsa__fail(DHSA_ERR_INVALID_ARG, "GGUF writer: key '%s' is already set", key);
    if (strcmp(key, "general.alignment") == 0 && type != DHSA_GGUF_UINT32)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "GGUF writer: general.alignment must be UINT32");
    *mark = w->meta_len;
    if (put_str(w, key, n) || put_le(w, (uint64_t)type, 4)) {
        w->meta_len = *mark;
        return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "GGUF writer: out of memory");
    }
    return DHSA_OK;
}

/* Ends a kv begun at mark: failed (roll back) or recorded. */
static dhsa_status kv_end(dhsa_gguf_writer *w, const char *key, size_t mark, int failed) {
    char *k = NULL;
    if (!failed && w->n_kv == w->cap_keys) {
        int64_t cap = w->cap_keys ? w->cap_keys * 2 : 32;
        char **keys = realloc(w->keys, (size_t)cap * sizeof *keys);
        if (!keys) failed = 1;
        else {
            w->keys = keys;
            w->cap_keys = cap;
        }
    }
    if (!failed && !(k = strdup(key))) failed = 1;
    if (failed) {
        w->meta_len = mark;
        return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "GGUF writer: out of memory");
    }
    w->keys[w->n_kv++] = k;
    return DHSA_OK;
}

static dhsa_status set_scalar(dhsa_gguf_writer *w, const char *key, dhsa_gguf_type t, uint64_t raw) {
    size_t mark;
    dhsa_status st = kv_begin(w, key, t, &mark);
    if (st) return st;
    return kv_end(w, key, mark, put_le(w, raw, scalar_size(t)));
}

dhsa_status dhsa_gguf_writer_set_u8(dhsa_gguf_writer *w, const char *key, uint8_t v) { return set_scalar(w, key, DHSA_GGUF_UINT8, v); }
dhsa_status dhsa_gguf_writer_set_i8(dhsa_gguf_writer *w, const char *key, int8_t v) { return set_scalar(w, key, DHSA_GGUF_INT8, (uint64_t)(uint8_t)v); }
dhsa_status dhsa_gguf_writer_set_u16(dhsa_gguf_writer *w, const char *key, uint16_t v) { return set_scalar(w, key, DHSA_GGUF_UINT16, v); }
dhsa_status dhsa_gguf_writer_set_i16(dhsa_gguf_writer *w, const char *key, int16_t v) { return set_scalar(w, key, DHSA_GGUF_INT16, (uint64_t)(uint16_t)v); }
dhsa_status dhsa_gguf_writer_set_i32(dhsa_gguf_writer *w, const char *key, int32_t v) { return set_scalar(w, key, DHSA_GGUF_INT32, (uint64_t)(uint32_t)v); }
dhsa_status dhsa_gguf_writer_set_u64(dhsa_gguf_writer *w, const char *key, uint64_t v) { return set_scalar(w, key, DHSA_GGUF_UINT64, v); }
dhsa_status dhsa_gguf_writer_set_i64(dhsa_gguf_writer *w, const char *key, int64_t v) { return set_scalar(w, key, DHSA_GGUF_INT64, (uint64_t)v); }
dhsa_status dhsa_gguf_writer_set_bool(dhsa_gguf_writer *w, const char *key, int v) { return set_scalar(w, key, DHSA_GGUF_BOOL, v != 0); }

dhsa_status dhsa_gguf_writer_set_u32(dhsa_gguf_writer *w, const char *key, uint32_t v) {
    int is_align = key && strcmp(key, "general.alignment") == 0;
    if (is_align && (v == 0 || (v & (v - 1)) != 0))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "GGUF writer: general.alignment %u is not a power of two", v);
    dhsa_status st = set_scalar(w, key, DHSA_GGUF_UINT32, v);
    if (st == DHSA_OK && is_align) w->alignment = v;
    return st;
}

dhsa_status dhsa_gguf_writer_set_f32(dhsa_gguf_writer *w, const char *key, float v) {
    uint32_t b;
    memcpy(&b, &v, 4);
    return set_scalar(w, key, DHSA_GGUF_FLOAT32, b);
}

dhsa_status dhsa_gguf_writer_set_f64(dhsa_gguf_writer *w, const char *key, double v) {
    uint64_t b;
    memcpy(&b, &v, 8);
    return set_scalar(w, key, DHSA_GGUF_FLOAT64, b);
}

dhsa_status dhsa_gguf_writer_set_strn(dhsa_gguf_writer *w, const char *key, const char *s, int64_t len) {
    if (!s || len < 0) return dhsa__fail(DHSA_ERR_INVALID_ARG, "GGUF writer: bad string for key '%s'", key ? key : "(null)");
    size_t mark;
    dhsa_status st = kv_begin(w, key, DHSA_GGUF_STRING, &mark);
    if (st) return st;
    return kv_end(w, key, mark, put_str(w, s, (size_t)len));
}

dhsa_status dhsa_gguf_writer_set_str(dhsa_gguf_writer *w, const char *key, const char *s) {
    if (!s) return dhsa__fail(DHSA_ERR_INVALID_ARG, "GGUF writer: NULL string for key '%s'", key ? key : "(null)");
    return dhsa_gguf_writer_set_strn(w, key, s, (int64_t)strlen(s));
}

dhsa_status dhsa_gguf_writer_set_arr(dhsa_gguf_writer *w, const char *key, dhsa_gguf_type elem, const void *data,
                                     int64_t n) {
    size_t sz = scalar_size(elem);
    if (!sz) return dhsa__fail(DHSA_ERR_INVALID_ARG, "GGUF writer: set_arr takes numeric or BOOL elements, not %s (use set_arr_str)",
                               dhsa_gguf_type_name(elem));
    if (n < 0 || (n > 0 && !data)) return dhsa__fail(DHSA_ERR_INVALID_ARG, "GGUF writer: bad array for key '%s'", key ? key : "(null)");
    size_t mark;
    dhsa_status st = kv_begin(w, key, DHSA_GGUF_ARRAY, &mark);
    if (st) return st;
    int failed = put_le(w, (uint64_t)elem, 4) || put_le(w, (uint64_t)n, 8);
    const uint8_t *p = data;
    for (int64_t i = 0; i < n && !failed; i++) {
        uint64_t v = 0;
        switch (sz) {
        case 1: v = p[i]; if (elem == DHSA_GGUF_BOOL) v = v != 0; break;
        case 2: { uint16_t x; memcpy(&x, p + i * 2, 2); v = x; break; }
        case 4: { uint32_t x; memcpy(&x, p + i * 4, 4); v = x; break; }
        default: memcpy(&v, p + i * 8, 8); break;
        }
        failed = put_le(w, v, sz);
    }
    return kv_end(w, key, mark, failed);
}

dhsa_status dhsa_gguf_writer_set_arr_str(dhsa_gguf_writer *w, const char *key, const char *const *strs, int64_t n) {
    if (n < 0 || (n > 0 && !strs)) return dhsa__fail(DHSA_ERR_INVALID_ARG, "GGUF writer: bad string array for key '%s'", key ? key : "(null)");
    for (int64_t i = 0; i < n; i++)
        if (!strs[i]) return dhsa__fail(DHSA_ERR_INVALID_ARG, "GGUF writer: string %lld of '%s' is NULL", (long long)i, key ? key : "(null)");
    size_t mark;
    dhsa_status st = kv_begin(w, key, DHSA_GGUF_ARRAY, &mark);
    if (st) return st;
    int failed = put_le(w, DHSA_GGUF_STRING, 4) || put_le(w, (uint64_t)n, 8);
    for (int64_t i = 0; i < n && !failed; i++) failed = put_str(w, strs[i], strlen(strs[i]));
    return kv_end(w, key, mark, failed);
}

dhsa_status dhsa_gguf_writer_add_tensor(dhsa_gguf_writer *w, const char *name, uint32_t ggml_type, int n_dims,
                                        const int64_t *dims, const void *data, int64_t bytes) {
    if (!w || !name || (n_dims > 0 && !dims)) return dhsa__fail(DHSA_ERR_INVALID_ARG, "GGUF writer: NULL argument");
    size_t n = strlen(name);
    if (n == 0 || n > DHSA_GGUF_MAX_NAME)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "GGUF writer: a tensor name must have 1..%d bytes", DHSA_GGUF_MAX_NAME);
    int64_t want;
    dhsa_status st = dhsa_ggml_tensor_bytes(ggml_type, n_dims, dims, &want);
    if (st) return st;
    if (bytes != want)
        return dhsa__fail(DHSA_ERR_SHAPE, "GGUF writer: tensor '%s' of type %s takes %lld bytes, not %lld", name,
                          dhsa_ggml_type_name(ggml_type), (long long)want, (long long)bytes);
    if (bytes > 0 && !data) return dhsa__fail(DHSA_ERR_INVALID_ARG, "GGUF writer: tensor '%s' has no data", name);
    for (int64_t i = 0; i < w->n_t; i++)
        if (strcmp(w->t[i].name, name) == 0) return dhsa__fail(DHSA_ERR_INVALID_ARG, "GGUF writer: tensor '%s' is already added", name);
    if (w->n_t == w->cap_t) {
        int64_t cap = w->cap_t ? w->cap_t * 2 : 32;
        wtensor *t = realloc(w->t, (size_t)cap * sizeof *t);
        if (!t) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "GGUF writer: out of memory");
        w->t = t;
        w->cap_t = cap;
    }
    wtensor *t = &w->t[w->n_t];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name))) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "GGUF writer: out of memory");
    t->name_len = n;
    t->type = ggml_type;
    t->n_dims = n_dims;
    for (int d = 0; d < n_dims; d++) t->dims[d] = dims[d];
    t->data = data;
    t->bytes = bytes;
    w->n_t++;
    return DHSA_OK;
}

/* Where the bytes go: a buffer, a FILE, or nowhere (counting). */
typedef struct {
    uint8_t *buf;
    FILE *f;
    uint64_t pos;
    int err;
} wsink;

static void emit(wsink *s, const void *p, size_t n) {
    if (s->err || n == 0) return;
    if (s->buf) memcpy(s->buf + s->pos, p, n);
    else if (s->f && fwrite(p, 1, n, s->f) != n) s->err = errno ? errno : EIO;
    s->pos += n;
}

static void emit_le(wsink *s, uint64_t v, size_t n) {
    uint8_t b[8];
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)(v >> (8 * i));
    emit(s, b, n);
}

static void emit_pad(wsink *s, uint64_t align) {
    static const uint8_t zeros[64];
    uint64_t pad = (align - s->pos % align) % align;
    while (pad > 0) {
        size_t k = pad > sizeof zeros ? sizeof zeros : (size_t)pad;
        emit(s, zeros, k);
        pad -= k;
    }
}

static void write_all(const dhsa_gguf_writer *w, wsink *s) {
    uint64_t a = w->alignment;
    emit(s, "GGUF", 4);
    emit_le(s, 3, 4);
    emit_le(s, (uint64_t)w->n_t, 8);
    emit_le(s, (uint64_t)w->n_kv, 8);
    emit(s, w->meta, w->meta_len);
    uint64_t off = 0;
    for (int64_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        emit_le(s, t->name_len, 8);
        emit(s, t->name, t->name_len);
        emit_le(s, (uint64_t)t->n_dims, 4);
        for (int d = 0; d < t->n_dims; d++) emit_le(s, (uint64_t)t->dims[d], 8);
        emit_le(s, t->type, 4);
        emit_le(s, off, 8);
        off += ((uint64_t)t->bytes + a - 1) / a * a;
    }
    if (w->n_t == 0) return;
    emit_pad(s, a);
    for (int64_t i = 0; i < w->n_t; i++) {
        emit(s, w->t[i].data, (size_t)w->t[i].bytes);
        emit_pad(s, a);
    }
}

dhsa_status dhsa_gguf_writer_size(const dhsa_gguf_writer *w, size_t *bytes) {
    if (!w || !bytes) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_gguf_writer_size: NULL argument");
    wsink s = {0};
    write_all(w, &s);
    *bytes = (size_t)s.pos;
    return DHSA_OK;
}

dhsa_status dhsa_gguf_writer_write_memory(const dhsa_gguf_writer *w, void *buf, size_t cap) {
    size_t need_bytes;
    dhsa_status st = dhsa_gguf_writer_size(w, &need_bytes);
    if (st) return st;
    if (!buf || cap < need_bytes)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "GGUF writer: the buffer holds %zu bytes; the file needs %zu", buf ? cap : 0,
                          need_bytes);
    wsink s = {.buf = buf};
    write_all(w, &s);
    return DHSA_OK;
}

dhsa_status dhsa_gguf_writer_write_file(const dhsa_gguf_writer *w, const char *path) {
    if (!w || !path) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_gguf_writer_write_file: NULL argument");
    dhsa_outfile o; /* a temporary renamed into place: readers of the old file keep it */
    dhsa_status st = dhsa_outfile_open(&o, path); /* its sentences name the path */
    if (st) return st;
    errno = 0;
    wsink s = {.f = o.f};
    write_all(w, &s);
    if (s.err) {
        dhsa_outfile_discard(&o);
        return dhsa__fail(DHSA_ERR_IO, "writing %s failed: %s (the old file, if any, is untouched)", path,
                          strerror(s.err));
    }
    return dhsa_outfile_commit(&o);
}
