/* session_state.c: a session's state after a prefill, saved to a file and
 * loaded back (include/dhsa.h, "Saved state"; docs/prompt-cache.md), so that
 * a long document is prefilled once: `dhsa run --prompt-cache FILE`,
 * `dhsa chat`, Python's Session.save_state / load_state.
 *
 * What a loaded session holds is, bit for bit, what the saving one held:
 * the K and V rows of the used positions (not the whole context), and the
 * routing indexes made again from those keys (an index is a function of
 * the keys it was given, in order, whatever the evals' sizes: the same
 * rule dhsa_session_truncate relies on), so the file carries no index and
 * nothing of it needs trusting. The chunks a one-token eval carries to the
 * next (dhsa_router_params.carry) are not saved: a loaded session has none,
 * as after a prefill (docs/prompt-cache.md). Everything else that decides the state is
 * checked before a byte goes into the session: the model (its file's
 * bytes hashed), the KV type, the attention method and every router
 * parameter, the weight products' route and the CPU kernels, the ubatch,
 * the RoPE frequencies and Q8_0 key offsets (which depend on the context:
 * a session with another --ctx loads the state when they agree), and a
 * learned boundary predictor's weights. A mismatch is refused with the
 * reason and leaves the session as it was.
 *
 * File (little-endian; version 1):
 *   magic "DHSASTAT", u32 version, u32 0x01020304 (byte order)
 *   u64 field[N_FIELDS]                    the header below (F_*)
 *   i64 [n_layer][3]                       per layer: first position, rows, ring
 *   i32 ids[len], zero padding to 8 bytes
 *   f32 logits[n_vocab]                    after the last token, if F_HAS_LOGITS
 *   per layer: K then V, per KV head the rows of positions [first, len)
 *   u64 checksum of every byte before it
 * The file's size follows from the header and must be exact; sizes are
 * bounded by the loading session's (its context, layers, heads) before
 * anything is allocated or read into it; a payload that does not match its
 * checksum empties the session. Written to a temporary name in the same
 * folder, flushed, then renamed over the file.
 * Tested by tests/test_session_state.c; fuzzed by fuzz/state_fuzz.c.
 */
#include "core/internal.h"
#include "model/gguf.h"
#include "model/model_internal.h"
#include "route/predictor_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define STATE_MAGIC "DHSASTAT"
#define STATE_VERSION 1u
#define STATE_ORDER 0x01020304u

/* ---------------------------------------------------------- hashing --- */

/* A 64-bit hash of a byte stream in four lanes of 8-byte words (fast
 * enough to check hundreds of MB in a fraction of a second). It detects
 * corruption and tells models apart; it is not a defence against someone
 * forging a file. */
typedef struct {
    uint64_t v[4];
    unsigned char buf[32];
    size_t nbuf;
    uint64_t total;
} hasher;

#define HP1 0x9E3779B185EBCA87ull
#define HP2 0xC2B2AE3D27D4EB4Full
#define HP3 0x165667B19E3779F9ull

static uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static void hash_init(hasher *h, uint64_t seed) {
    h->v[0] = seed + HP1 + HP2;
    h->v[1] = seed + HP2;
    h->v[2] = seed;
    h->v[3] = seed - HP1;
    h->nbuf = 0;
    h->total = 0;
}

static void hash_block(hasher *h, const unsigned char *p) {
    for (int i = 0; i < 4; i++) {
        uint64_t w;
        memcpy(&w, p + 8 * i, 8);
        h->v[i] = rotl64(h->v[i] + w * HP2, 31) * HP1;
    }
}

static void hash_add(hasher *h, const void *data, size_t n) {
    const unsigned char *p = data;
    h->total += n;
    if (h->nbuf) {
        size_t take = 32 - h->nbuf < n ? 32 - h->nbuf : n;
        memcpy(h->buf + h->nbuf, p, take);
        h->nbuf += take;
        p += take;
        n -= take;
        if (h->nbuf < 32) return;
        hash_block(h, h->buf);
        h->nbuf = 0;
    }
    for (; n >= 32; p += 32, n -= 32) hash_block(h, p);
    memcpy(h->buf, p, n);
    h->nbuf = n;
}

static uint64_t hash_end(const hasher *h) {
    uint64_t x = rotl64(h->v[0], 1) + rotl64(h->v[1], 7) + rotl64(h->v[2], 12) + rotl64(h->v[3], 18);
    x ^= h->total * HP3;
    for (size_t i = 0; i < h->nbuf; i++) x = rotl64(x ^ (h->buf[i] * HP3), 11) * HP1;
    x ^= x >> 33;
    x *= HP2;
    x ^= x >> 29;
    x *= HP3;
    x ^= x >> 32;
    return x;
}

static uint64_t hash_bytes(const void *p, size_t n, uint64_t seed) {
    hasher h;
    hash_init(&h, seed);
    hash_add(&h, p, n);
    return hash_end(&h);
}

uint64_t dhsa__state_checksum(const void *data, size_t n) { return hash_bytes(data, n, 7); }

/* The model file's bytes, hashed once per loaded model. */
static uint64_t model_hash(const dhsa_model *m) {
    dhsa_model *mm = (dhsa_model *)m; /* the cache only: the model is otherwise read-only */
    uint64_t h = atomic_load(&mm->file_hash);
    if (h) return h;
    const uint8_t *base;
    uint64_t size;
    dhsa_gguf__bytes(m->g, &base, &size);
    h = hash_bytes(base, (size_t)size, 1);
    if (!h) h = 1;
    atomic_store(&mm->file_hash, h);
    return h;
}

/* ----------------------------------------------------------- header --- */

enum {
    F_MODEL_HASH, F_MODEL_BYTES, F_N_LAYER, F_N_HEAD_KV, F_HD_K, F_HD_V, F_N_VOCAB,
    F_KV_TYPE, F_ATTN, F_EXACT, F_KERNELS, F_N_CTX, F_N_UBATCH, F_ROPE_HASH, F_KOFF_HASH,
    F_LEN, F_HAS_LOGITS, F_PREDICTOR_HASH,
    F_R_METHOD, F_R_BOUNDARY, F_R_LEARNED_THRESHOLD, F_R_CHUNK, F_R_SIM_WINDOW, F_R_THRESHOLD, F_R_NMS_WINDOW,
    F_R_MIN_CHUNK, F_R_MAX_CHUNK, F_R_CAUSAL, F_R_Q_BLOCK, F_R_BUDGET, F_R_DENSITY, F_R_SINK, F_R_LOCAL,
    F_R_DENSE_BELOW, F_R_SHARE_HEADS, F_R_SCORE_MODE, F_R_SCALE_FIXED, F_R_SINK_WINDOW, F_R_SCORE_ROWS,
    F_R_CARRY, F_R_EXACT_ROWS, F_R_REST,
    N_FIELDS = 48 /* the rest reserved (zero) */
};

#define HEAD_BYTES (8 + 4 + 4 + 8 * N_FIELDS)

static uint64_t fbits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static uint64_t dbits(double x) {
    uint64_t u;
    memcpy(&u, &x, 8);
    return u;
}

/* What the weight products and attention kernels run here: the ISA and
 * the routes of the session's weight types (a state from other kernels
 * differs in its last bits from a prefill here). */
static uint64_t kernels_hash(const dhsa_model *m, int exact) {
    char routes[512] = "";
    (void)dhsa_model_routes(m, exact, routes, sizeof routes);
    return hash_bytes(routes, strlen(routes), 2) ^ ((uint64_t)dhsa_active_isa() << 56);
}

static uint64_t predictor_hash(const dhsa_router_params *rp) {
    const dhsa_predictor *pr = rp->predictor;
    if (rp->boundary != DHSA_BOUNDARY_LEARNED || !pr) return 0;
    uint64_t h = hash_bytes(pr->mem, dhsa__predictor_raw_floats(pr->C, pr->hidden) * sizeof(float), 3);
    int64_t dims[3] = {pr->C, pr->w, pr->hidden};
    return h ^ hash_bytes(dims, sizeof dims, 4) ^ fbits(pr->b2);
}

/* The header of the state of session info i. */
static void make_fields(const dhsa__state_info *i, int has_logits, uint64_t *f) {
    const dhsa_model_info *in = &i->m->info;
    const dhsa_router_params *rp = i->rp;
    const int routed = i->p->attn != DHSA_ATTN_DENSE;
    const uint8_t *base;
    uint64_t size;
    memset(f, 0, N_FIELDS * sizeof *f);
    dhsa_gguf__bytes(i->m->g, &base, &size);
    f[F_MODEL_HASH] = model_hash(i->m);
    f[F_MODEL_BYTES] = size;
    f[F_N_LAYER] = (uint64_t)in->n_layer;
    f[F_N_HEAD_KV] = (uint64_t)in->n_head_kv;
    f[F_HD_K] = (uint64_t)in->head_dim_k;
    f[F_HD_V] = (uint64_t)in->head_dim_v;
    f[F_N_VOCAB] = (uint64_t)in->n_vocab;
    f[F_KV_TYPE] = (uint64_t)i->p->kv_type;
    f[F_ATTN] = (uint64_t)i->p->attn;
    f[F_EXACT] = i->p->exact ? 1 : 0;
    f[F_KERNELS] = kernels_hash(i->m, i->p->exact);
    f[F_N_CTX] = (uint64_t)i->plan->n_ctx;
    f[F_N_UBATCH] = (uint64_t)i->plan->n_ubatch;
    f[F_ROPE_HASH] = hash_bytes(i->inv_freq, (size_t)i->n_inv_freq * sizeof(float), 5);
    f[F_KOFF_HASH] = i->koff ? hash_bytes(i->koff, (size_t)i->n_koff * sizeof(float), 6) : 0;
    f[F_LEN] = (uint64_t)i->len;
    f[F_HAS_LOGITS] = has_logits ? 1 : 0;
    if (!routed) return; /* dense attention never reads the router */
    f[F_PREDICTOR_HASH] = predictor_hash(rp);
    f[F_R_METHOD] = (uint64_t)rp->method;
    f[F_R_BOUNDARY] = (uint64_t)rp->boundary;
    f[F_R_LEARNED_THRESHOLD] = fbits(rp->learned_threshold);
    f[F_R_CHUNK] = (uint64_t)rp->chunk;
    f[F_R_SIM_WINDOW] = (uint64_t)rp->sim_window;
    f[F_R_THRESHOLD] = fbits(rp->threshold);
    f[F_R_NMS_WINDOW] = (uint64_t)rp->nms_window;
    f[F_R_MIN_CHUNK] = (uint64_t)rp->min_chunk;
    f[F_R_MAX_CHUNK] = (uint64_t)rp->max_chunk;
    f[F_R_CAUSAL] = (uint64_t)rp->causal_boundaries;
    f[F_R_Q_BLOCK] = (uint64_t)rp->q_block;
    f[F_R_BUDGET] = (uint64_t)rp->budget_tokens;
    f[F_R_DENSITY] = dbits(rp->density);
    f[F_R_SINK] = (uint64_t)rp->sink_tokens;
    f[F_R_LOCAL] = (uint64_t)rp->local_tokens;
    f[F_R_DENSE_BELOW] = (uint64_t)rp->dense_below;
    f[F_R_SHARE_HEADS] = (uint64_t)rp->share_heads;
    f[F_R_SCORE_MODE] = (uint64_t)rp->score_mode;
    f[F_R_SCALE_FIXED] = (uint64_t)rp->scale_fixed;
    f[F_R_SINK_WINDOW] = (uint64_t)rp->sink_window;
    f[F_R_SCORE_ROWS] = (uint64_t)rp->score_rows;
    f[F_R_CARRY] = dbits(rp->carry);
    f[F_R_EXACT_ROWS] = (uint64_t)rp->exact_rows;
    f[F_R_REST] = (uint64_t)rp->rest;
}

static const char *type_word(uint64_t t) {
    return t == DHSA_F32 ? "f32" : t == DHSA_F16 ? "f16" : t == DHSA_Q8_0 ? "q8_0" : "an unknown type";
}

static const char *attn_word(uint64_t a) { return a <= DHSA_ATTN_ORACLE ? dhsa_attn_method_name((dhsa_attn_method)a) : "?"; }

/* Why a state with header f (file) does not fit a session with header g
 * (its own state's), or NULL when it fits. */
static const char *mismatch(const uint64_t *f, const uint64_t *g, char *why, size_t cap) {
    static const struct { int field; const char *name; } router[] = {
        {F_R_METHOD, "routing method"}, {F_R_BOUNDARY, "--boundary"}, {F_R_LEARNED_THRESHOLD, "learned threshold"},
        {F_R_CHUNK, "fixed chunk length"}, {F_R_SIM_WINDOW, "similarity window"},
        {F_R_THRESHOLD, "similarity threshold"}, {F_R_NMS_WINDOW, "boundary spacing (nms window)"},
        {F_R_MIN_CHUNK, "minimum chunk"}, {F_R_MAX_CHUNK, "maximum chunk"}, {F_R_CAUSAL, "causal boundaries"},
        {F_R_Q_BLOCK, "--q-block"}, {F_R_BUDGET, "--budget"}, {F_R_DENSITY, "--density"}, {F_R_SINK, "--sink"},
        {F_R_LOCAL, "--local"}, {F_R_DENSE_BELOW, "--dense-below"}, {F_R_SHARE_HEADS, "shared heads"},
        {F_R_SCORE_MODE, "chunk score"}, {F_R_SCALE_FIXED, "fixed sink/local scaling"},
        {F_R_SINK_WINDOW, "--sink-window"}, {F_R_SCORE_ROWS, "--score-rows"}, {F_R_CARRY, "--carry"},
        {F_R_EXACT_ROWS, "--exact-rows"}, {F_R_REST, "--rest"},
        {F_PREDICTOR_HASH, "the learned boundary predictor (another file)"}};
    if (f[F_MODEL_HASH] != g[F_MODEL_HASH] || f[F_MODEL_BYTES] != g[F_MODEL_BYTES] || f[F_N_LAYER] != g[F_N_LAYER] ||
        f[F_N_HEAD_KV] != g[F_N_HEAD_KV] || f[F_HD_K] != g[F_HD_K] || f[F_HD_V] != g[F_HD_V] ||
        f[F_N_VOCAB] != g[F_N_VOCAB]) {
        snprintf(why, cap, "it was saved with another model (a file of %llu bytes, %llu layers, vocabulary %llu; "
                 "this one has %llu bytes, %llu layers, vocabulary %llu%s)", (unsigned long long)f[F_MODEL_BYTES],
                 (unsigned long long)f[F_N_LAYER], (unsigned long long)f[F_N_VOCAB],
                 (unsigned long long)g[F_MODEL_BYTES], (unsigned long long)g[F_N_LAYER],
                 (unsigned long long)g[F_N_VOCAB],
                 f[F_MODEL_BYTES] == g[F_MODEL_BYTES] ? ", but other bytes" : "");
        return why;
    }
    if (f[F_KV_TYPE] != g[F_KV_TYPE]) {
        snprintf(why, cap, "it was saved with a KV cache of %s (--kv), this session's is %s", type_word(f[F_KV_TYPE]),
                 type_word(g[F_KV_TYPE]));
        return why;
    }
    if (f[F_ATTN] != g[F_ATTN]) {
        snprintf(why, cap, "it was saved with --attn %s, this session runs %s", attn_word(f[F_ATTN]),
                 attn_word(g[F_ATTN]));
        return why;
    }
    if (f[F_EXACT] != g[F_EXACT]) {
        snprintf(why, cap, "it was saved with the %s weight products, this session runs the %s ones (--exact)",
                 f[F_EXACT] ? "exact" : "fast", g[F_EXACT] ? "exact" : "fast");
        return why;
    }
    if (f[F_KERNELS] != g[F_KERNELS]) {
        snprintf(why, cap, "it was saved where the CPU kernels or weight-product routes differ from this machine's "
                 "(%s here; DHSA_FORCE_ISA, DHSA_BF16): its last bits would differ from a prefill here",
                 dhsa_isa_name(dhsa_active_isa()));
        return why;
    }
    if (f[F_N_UBATCH] != g[F_N_UBATCH]) {
        snprintf(why, cap, "it was saved with a ubatch of %llu tokens, this session's is %llu (--ubatch)",
                 (unsigned long long)f[F_N_UBATCH], (unsigned long long)g[F_N_UBATCH]);
        return why;
    }
    if (f[F_ROPE_HASH] != g[F_ROPE_HASH] || f[F_KOFF_HASH] != g[F_KOFF_HASH]) {
        snprintf(why, cap, "it was saved with a context of %llu tokens, this session's is %llu, and %s differ with it "
                 "(give --ctx %llu)", (unsigned long long)f[F_N_CTX], (unsigned long long)g[F_N_CTX],
                 f[F_ROPE_HASH] != g[F_ROPE_HASH] ? "the RoPE frequencies (LongRoPE's factor set)"
                                                  : "the Q8_0 cache's key offsets",
                 (unsigned long long)f[F_N_CTX]);
        return why;
    }
    for (size_t r = 0; r < sizeof router / sizeof router[0]; r++)
        if (f[router[r].field] != g[router[r].field]) {
            snprintf(why, cap, "the router's %s differs from this session's", router[r].name);
            return why;
        }
    return NULL;
}

/* ------------------------------------------------------------ write --- */

typedef struct {
    FILE *f;
    hasher h;
    int err;
} sink;

static void put(sink *o, const void *p, size_t n) {
    if (o->err || n == 0) return;
    hash_add(&o->h, p, n);
    if (fwrite(p, 1, n, o->f) != n) o->err = errno ? errno : EIO;
}

static size_t pad8(size_t n) { return (8 - n % 8) % 8; }

static dhsa_status save_locked(dhsa_session *s, const int32_t *ids, int64_t n_ids, const float *logits,
                               const char *path) {
    dhsa__state_info i;
    dhsa__session_state_info(s, &i);
    const dhsa_model_info *in = &i.m->info;
    if (n_ids != i.len)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_session_save: %lld ids given, the session holds %lld tokens "
                          "(the ids of its evals, in order)", (long long)n_ids, (long long)i.len);
    if (n_ids > 0 && !ids) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_session_save: ids is NULL");
    for (int64_t t = 0; t < n_ids; t++)
        if (ids[t] < 0 || ids[t] >= in->n_vocab)
            return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_session_save: id %lld at %lld is outside the vocabulary "
                              "(%lld)", (long long)ids[t], (long long)t, (long long)in->n_vocab);
    uint64_t fl[N_FIELDS];
    make_fields(&i, logits != NULL, fl);
    /* a temporary name in the file's folder, renamed over it once complete */
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 40);
    if (!tmp) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory");
    /* a name of its own (the pid and a counter), created with the usual
     * permissions (0666 less the umask), as fopen would make path */
    static atomic_uint counter;
    int fd = -1;
    for (int tries = 0; fd < 0 && tries < 100; tries++) {
        snprintf(tmp, plen + 40, "%s.tmp.%ld.%u", path, (long)getpid(), atomic_fetch_add(&counter, 1) % 1000000u);
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        int e = errno;
        free(tmp);
        return dhsa__fail(DHSA_ERR_IO, "cannot write \"%s\" (a temporary file next to it): %s", path, strerror(e));
    }
    sink o = {fdopen(fd, "wb"), {{0}, {0}, 0, 0}, 0};
    if (!o.f) {
        int e = errno;
        close(fd);
        unlink(tmp);
        free(tmp);
        return dhsa__fail(DHSA_ERR_IO, "cannot write \"%s\": %s", path, strerror(e));
    }
    hash_init(&o.h, 7);
    uint32_t vo[2] = {STATE_VERSION, STATE_ORDER};
    static const unsigned char zeros[8] = {0};
    put(&o, STATE_MAGIC, 8);
    put(&o, vo, sizeof vo);
    put(&o, fl, sizeof fl);
    for (int64_t l = 0; l < in->n_layer; l++) {
        dhsa__state_layer L;
        dhsa__session_state_layer(s, l, &L);
        int64_t row[3] = {L.base, L.rows, L.ring};
        put(&o, row, sizeof row);
    }
    put(&o, ids, (size_t)n_ids * sizeof(int32_t));
    put(&o, zeros, pad8((size_t)n_ids * sizeof(int32_t)));
    if (logits) put(&o, logits, (size_t)in->n_vocab * sizeof(float));
    for (int64_t l = 0; l < in->n_layer; l++) {
        dhsa__state_layer L;
        dhsa__session_state_layer(s, l, &L);
        const int64_t used = i.len - L.base;
        for (int kv = 0; kv < 2; kv++) {
            const size_t row = kv ? L.row_v : L.row_k;
            const char *src = kv ? L.v : L.k;
            for (int64_t h = 0; h < in->n_head_kv; h++)
                put(&o, src + (size_t)h * (size_t)L.rows * row, (size_t)used * row);
        }
    }
    uint64_t sum = hash_end(&o.h);
    put(&o, &sum, sizeof sum);
    if (!o.err && fflush(o.f)) o.err = errno ? errno : EIO;
    if (!o.err && fsync(fileno(o.f))) o.err = errno ? errno : EIO;
    if (fclose(o.f) && !o.err) o.err = errno ? errno : EIO;
    if (!o.err && rename(tmp, path)) o.err = errno ? errno : EIO;
    if (o.err) {
        unlink(tmp);
        free(tmp);
        return dhsa__fail(DHSA_ERR_IO, "cannot write \"%s\": %s", path, strerror(o.err));
    }
    free(tmp);
    return DHSA_OK;
}

dhsa_status dhsa_session_save(dhsa_session *s, const int32_t *ids, int64_t n_ids, const float *logits,
                              const char *path) {
    if (!path) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_session_save: path is NULL");
    dhsa_status st = dhsa__session_state_enter(s, "dhsa_session_save");
    if (st) return st;
    st = save_locked(s, ids, n_ids, logits, path);
    dhsa__session_state_leave(s);
    return st;
}

/* ------------------------------------------------------------- read --- */

/* Bytes from a file or from memory, hashed as they are read. */
typedef struct {
    FILE *f;
    const unsigned char *mem;
    uint64_t size, at;
    hasher h;
    const char *name;
} source;

static dhsa_status take(source *in, void *dst, uint64_t n, const char *what) {
    if (n > in->size - in->at)
        return dhsa__fail(DHSA_ERR_FORMAT, "state file \"%s\": truncated in %s", in->name, what);
    if (in->mem) {
        memcpy(dst, in->mem + in->at, (size_t)n);
    } else if (fread(dst, 1, (size_t)n, in->f) != (size_t)n) {
        return dhsa__fail(DHSA_ERR_IO, "state file \"%s\": read failed in %s%s%s", in->name, what,
                          ferror(in->f) ? ": " : " (the file shrank)", ferror(in->f) ? strerror(errno) : "");
    }
    in->at += n;
    hash_add(&in->h, dst, (size_t)n);
    return DHSA_OK;
}

/* The bytes a state of these sizes takes (the layout at the top), or 0
 * when it would overflow. */
static uint64_t state_bytes(const uint64_t *f, const int64_t (*lay)[3], const dhsa__state_info *i) {
    const dhsa_model_info *in = &i->m->info;
    const uint64_t len = f[F_LEN];
    uint64_t row = dhsa_type_row_bytes(i->p->kv_type, in->head_dim_k) + dhsa_type_row_bytes(i->p->kv_type, in->head_dim_v);
    uint64_t total = HEAD_BYTES + (uint64_t)in->n_layer * 24 + len * 4 + pad8((size_t)(len * 4) % 8) + 8;
    if (f[F_HAS_LOGITS]) total += (uint64_t)in->n_vocab * 4;
    for (int64_t l = 0; l < in->n_layer; l++) total += (len - (uint64_t)lay[l][0]) * row * (uint64_t)in->n_head_kv;
    return total; /* len <= n_ctx <= 2^31 and the rows as the session holds them: no overflow */
}

static dhsa_status load_locked(dhsa_session *s, source *src, int32_t *ids, int64_t cap, int64_t *n_ids,
                               float *logits, int *has_logits) {
    dhsa__state_info i;
    dhsa__session_state_info(s, &i);
    const dhsa_model_info *in = &i.m->info;
    const char *name = src->name;
    char magic[8];
    uint32_t vo[2];
    uint64_t f[N_FIELDS], g[N_FIELDS];
    dhsa_status st;
    if (src->size < HEAD_BYTES)
        return dhsa__fail(DHSA_ERR_FORMAT, "state file \"%s\": %llu bytes, too short for a state", name,
                          (unsigned long long)src->size);
    if ((st = take(src, magic, 8, "the header")) || (st = take(src, vo, sizeof vo, "the header"))) return st;
    if (memcmp(magic, STATE_MAGIC, 8))
        return dhsa__fail(DHSA_ERR_FORMAT, "\"%s\" is not a dhsa state file (no DHSASTAT magic)", name);
    if (vo[1] != STATE_ORDER)
        return dhsa__fail(DHSA_ERR_FORMAT, "state file \"%s\": written with another byte order", name);
    if (vo[0] != STATE_VERSION)
        return dhsa__fail(DHSA_ERR_UNSUPPORTED, "state file \"%s\": version %u, this build reads version %u (save "
                          "it again)", name, vo[0], STATE_VERSION);
    if ((st = take(src, f, sizeof f, "the header"))) return st;
    make_fields(&i, 0, g);
    char why[400];
    if (mismatch(f, g, why, sizeof why))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "state file \"%s\" does not fit this session: %s", name, why);
    for (int x = F_R_REST + 1; x < N_FIELDS; x++)
        if (f[x]) return dhsa__fail(DHSA_ERR_FORMAT, "state file \"%s\": reserved header field %d is set", name, x);
    if (f[F_HAS_LOGITS] > 1) return dhsa__fail(DHSA_ERR_FORMAT, "state file \"%s\": bad logits flag", name);
    const int64_t n_ctx = i.plan->n_ctx;
    if (f[F_LEN] > (uint64_t)n_ctx)
        return dhsa__fail(DHSA_ERR_TOO_LARGE, "state file \"%s\" holds %llu tokens, this session's context %lld "
                          "(give --ctx %llu or more)", name, (unsigned long long)f[F_LEN], (long long)n_ctx,
                          (unsigned long long)f[F_LEN]);
    const int64_t len = (int64_t)f[F_LEN];
    int64_t (*lay)[3] = malloc((size_t)in->n_layer * sizeof *lay); /* n_layer: the model's, checked equal */
    if (!lay) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory");
    if ((st = take(src, lay, (uint64_t)in->n_layer * sizeof *lay, "the layer table"))) goto out;
    for (int64_t l = 0; l < in->n_layer; l++) {
        dhsa__state_layer L;
        dhsa__session_state_layer(s, l, &L);
        int ok = lay[l][2] == L.ring && (L.ring ? lay[l][1] == L.rows : 1) && lay[l][0] >= 0 && lay[l][0] <= len &&
                 len - lay[l][0] <= L.rows && (L.ring || lay[l][0] == 0);
        if (!ok) {
            st = dhsa__fail(DHSA_ERR_FORMAT, "state file \"%s\": layer %lld holds positions from %lld in %lld rows "
                            "(%s), which this session's cache of %lld rows cannot", name, (long long)l,
                            (long long)lay[l][0], (long long)lay[l][1], lay[l][2] ? "a ring" : "not a ring",
                            (long long)L.rows);
            goto out;
        }
    }
    const uint64_t want = state_bytes(f, (const int64_t(*)[3])lay, &i);
    if (src->size != want) {
        st = dhsa__fail(DHSA_ERR_FORMAT, "state file \"%s\": %llu bytes, a state of %lld tokens takes %llu (%s)", name,
                        (unsigned long long)src->size, (long long)len, (unsigned long long)want,
                        src->size < want ? "truncated" : "trailing bytes");
        goto out;
    }
    if (n_ids) *n_ids = len;
    if (has_logits) *has_logits = (int)f[F_HAS_LOGITS];
    if (cap < len || (len > 0 && !ids)) {
        st = dhsa__fail(DHSA_ERR_TOO_LARGE, "dhsa_session_load: the state holds %lld tokens, ids has room for %lld",
                        (long long)len, (long long)(ids ? cap : 0));
        goto out;
    }
    if ((st = take(src, ids, (uint64_t)len * 4, "the token ids"))) goto out;
    for (int64_t t = 0; t < len; t++)
        if (ids[t] < 0 || ids[t] >= in->n_vocab) {
            st = dhsa__fail(DHSA_ERR_FORMAT, "state file \"%s\": token %lld is id %lld, outside the vocabulary", name,
                            (long long)t, (long long)ids[t]);
            goto out;
        }
    unsigned char pad[8];
    if ((st = take(src, pad, pad8((size_t)len * 4), "the token ids"))) goto out;
    /* From here the session's cache is written: a failure leaves it empty. */
    dhsa__session_state_clear(s);
    if (f[F_HAS_LOGITS]) {
        if (!logits) { /* not wanted: read through a scratch */
            float tmp[1024];
            for (int64_t x = 0; x < in->n_vocab && !st; x += 1024)
                st = take(src, tmp, (uint64_t)(in->n_vocab - x < 1024 ? in->n_vocab - x : 1024) * 4, "the logits");
        } else {
            st = take(src, logits, (uint64_t)in->n_vocab * 4, "the logits");
        }
        if (st) goto fail;
    }
    for (int64_t l = 0; l < in->n_layer; l++) {
        dhsa__state_layer L;
        dhsa__session_state_layer(s, l, &L);
        const int64_t used = len - lay[l][0];
        for (int kv = 0; kv < 2; kv++) {
            const size_t row = kv ? L.row_v : L.row_k;
            char *dst = kv ? L.v : L.k;
            for (int64_t h = 0; h < in->n_head_kv; h++)
                if ((st = take(src, dst + (size_t)h * (size_t)L.rows * row, (uint64_t)used * row, "the KV cache")))
                    goto fail;
        }
    }
    const uint64_t sum = hash_end(&src->h);
    uint64_t stored;
    if ((st = take(src, &stored, 8, "the checksum"))) goto fail;
    if (stored != sum) {
        st = dhsa__fail(DHSA_ERR_FORMAT, "state file \"%s\" is corrupt: its checksum does not match its bytes", name);
        goto fail;
    }
    {
        int64_t *base = malloc((size_t)in->n_layer * sizeof *base);
        if (!base) {
            st = dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory");
            goto fail;
        }
        for (int64_t l = 0; l < in->n_layer; l++) base[l] = lay[l][0];
        st = dhsa__session_state_commit(s, len, base);
        free(base);
    }
    goto out;
fail:
    dhsa__session_state_clear(s);
out:
    free(lay);
    return st;
}

dhsa_status dhsa_session_load(dhsa_session *s, const char *path, int32_t *ids, int64_t cap, int64_t *n_ids,
                              float *logits, int *has_logits) {
    if (n_ids) *n_ids = 0;
    if (has_logits) *has_logits = 0;
    if (!path) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_session_load: path is NULL");
    dhsa_status st = dhsa__session_state_enter(s, "dhsa_session_load");
    if (st) return st;
    source src;
    memset(&src, 0, sizeof src);
    src.name = path;
    hash_init(&src.h, 7);
    struct stat sb;
    if (!(src.f = fopen(path, "rb"))) {
        st = dhsa__fail(DHSA_ERR_IO, "cannot open state file \"%s\": %s", path, strerror(errno));
    } else if (fstat(fileno(src.f), &sb) || !S_ISREG(sb.st_mode)) {
        st = dhsa__fail(DHSA_ERR_IO, "state file \"%s\" is not a regular file", path);
    } else {
        src.size = (uint64_t)sb.st_size;
        st = load_locked(s, &src, ids, cap, n_ids, logits, has_logits);
    }
    if (src.f) fclose(src.f);
    dhsa__session_state_leave(s);
    return st;
}

dhsa_status dhsa_session_load_memory(dhsa_session *s, const void *data, size_t size, int32_t *ids, int64_t cap,
                                     int64_t *n_ids, float *logits, int *has_logits) {
    if (n_ids) *n_ids = 0;
    if (has_logits) *has_logits = 0;
    if (!data && size) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_session_load_memory: data is NULL");
    dhsa_status st = dhsa__session_state_enter(s, "dhsa_session_load_memory");
    if (st) return st;
    source src;
    memset(&src, 0, sizeof src);
    src.name = "(memory)";
    src.mem = data;
    src.size = size;
    hash_init(&src.h, 7);
    st = load_locked(s, &src, ids, cap, n_ids, logits, has_logits);
    dhsa__session_state_leave(s);
    return st;
}
