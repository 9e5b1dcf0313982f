/* test_llama2c.c: tests of the llama2.c importer (src/model/llama2c.c) and
 * of `dhsa convert` / `dhsa inspect` (tools/convert.c, tools/inspect.c).
 *
 *   - the real model ../shared/models/stories260K.bin + tok512.bin against
 *     ../shared/models/stories260K.gguf, which llama.cpp's converter made
 *     (an independent reference): every tensor byte-equal (the GGUF's
 *     output.weight, a copy of the tied embedding, against token_embd),
 *     tokens, scores and token types equal, hyperparameters equal except
 *     llama.context_length (512 from the checkpoint, 2048 in that GGUF);
 *     the prompt "Once upon a time" tokenizes to the ids llama2.c's run.c
 *     gives, and the first greedy ids of run.c detokenize to its text;
 *   - small checkpoints written here (so this runs without ../shared):
 *     shared and separate classifier, GQA, every weight at the place the
 *     llama2.c layout says (each float holds its own index), the token
 *     texts, types and scores; a round trip through a file and
 *     dhsa_gguf_open, and the refusals of dhsa_convert_llama2c;
 *   - robustness: every truncation point and a few extensions of both
 *     files, corrupted header fields (zero, negative, huge, not dividing),
 *     tokenizer corruptions (lengths beyond the file or max_token_length,
 *     NaN / Inf scores, NUL bytes, too few / too many tokens), each with
 *     the sentence checked; and thousands of random mutations through
 *     dhsa_llama2c_fuzz_one (which also checks every converted model);
 *   - the CLI through DHSA_CLI (tests/run.sh sets it; skipped when unset).
 *
 * ../shared is absent in a fresh clone: those parts are skipped, loudly.
 * Run: make build/tests/test_llama2c && build/tests/test_llama2c, or under
 * sanitizers:
 *   make BUILD=build-asan OPT=-O1 EXTRA_CFLAGS="-fsanitize=address,undefined \
 *     -fno-omit-frame-pointer" EXTRA_LDFLAGS="-fsanitize=address,undefined" \
 *     build-asan/tests/test_llama2c && build-asan/tests/test_llama2c
 */
#include "dhsa.h"
#include "model/llama2c.h"
#include "t.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define MODELS "../shared/models/"
#define BIN MODELS "stories260K.bin"
#define TOK MODELS "tok512.bin"
#define GGUF MODELS "stories260K.gguf"

/* --------------------------------------------------------------------- */
/* Helpers                                                                */

static uint8_t *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc(sz > 0 ? (size_t)sz : 1);
    if (p && fread(p, 1, (size_t)sz, f) != (size_t)sz) {
        free(p);
        p = NULL;
    }
    fclose(f);
    *n = (size_t)sz;
    return p;
}

static int write_all(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(p, 1, n, f);
    return fclose(f) == 0 && w == n ? 0 : -1;
}

static uint64_t rng_state = 0x243f6a8885a308d3ull;
static uint64_t rng(void) { /* xorshift64*: deterministic across runs */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}

static void put_i32(uint8_t *p, int32_t v) {
    uint32_t u = (uint32_t)v;
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(u >> (8 * i));
}
static void put_f32(uint8_t *p, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    put_i32(p, (int32_t)u);
}

/* A growable byte buffer. */
typedef struct {
    uint8_t *p;
    size_t n, cap;
} buf;
static void buf_put(buf *b, const void *p, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
}
static void buf_i32(buf *b, int32_t v) {
    uint8_t t[4];
    put_i32(t, v);
    buf_put(b, t, 4);
}
static void buf_f32(buf *b, float v) {
    uint8_t t[4];
    put_f32(t, v);
    buf_put(b, t, 4);
}

/* A checkpoint with the given header whose k-th float is k (exact below
 * 2^24): every weight says where it came from. vocab < 0: a separate
 * classifier. Returns the bytes; *n its size. */
typedef struct {
    int32_t dim, hidden, layers, heads, kv_heads, vocab, seq;
} hdr;

static uint64_t floats_of(hdr h) {
    uint64_t d = (uint64_t)h.dim, hd = (uint64_t)h.hidden, L = (uint64_t)h.layers;
    uint64_t V = (uint64_t)(h.vocab < 0 ? -h.vocab : h.vocab), hs = d / (uint64_t)h.heads;
    uint64_t kvd = (uint64_t)h.kv_heads * hs;
    uint64_t n = V * d + L * d * 2 + L * d * d * 2 + L * d * kvd * 2 + L * d * hd * 3 + d + (uint64_t)h.seq * hs;
    return n + (h.vocab < 0 ? V * d : 0);
}

static uint8_t *make_ckpt(hdr h, size_t *n) {
    buf b = {0};
    int32_t f[7] = {h.dim, h.hidden, h.layers, h.heads, h.kv_heads, h.vocab, h.seq};
    for (int i = 0; i < 7; i++) buf_i32(&b, f[i]);
    uint64_t nf = floats_of(h);
    for (uint64_t k = 0; k < nf; k++) buf_f32(&b, (float)k);
    *n = b.n;
    return b.p;
}

/* A tokenizer of V tokens in llama2.c's layout: <unk>, "\n<s>\n",
 * "\n</s>\n", then byte tokens <0x00>.. (up to 256 of them, as room
 * allows), then words " w<i>" (with a space, like llama2.c's " t"), with
 * score -i. */
static uint8_t *make_tok(int32_t V, size_t *n) {
    buf b = {0};
    buf_i32(&b, 8);
    for (int32_t i = 0; i < V; i++) {
        char s[32];
        if (i == 0) snprintf(s, sizeof s, "<unk>");
        else if (i == 1) snprintf(s, sizeof s, "\n<s>\n");
        else if (i == 2) snprintf(s, sizeof s, "\n</s>\n");
        else if (i - 3 < 256 && V > 300) snprintf(s, sizeof s, "<0x%02X>", i - 3);
        else snprintf(s, sizeof s, " w%d", i);
        buf_f32(&b, i < 3 ? 0.0f : -(float)i);
        buf_i32(&b, (int32_t)strlen(s));
        buf_put(&b, s, strlen(s));
    }
    *n = b.n;
    return b.p;
}

static const hdr H_SMALL = {8, 12, 2, 2, 1, 5, 4};           /* GQA 2:1, head size 4, shared */
static const hdr H_UNSHARED = {8, 12, 2, 2, 2, -5, 4};       /* separate classifier */
static const hdr H_MHA = {16, 20, 3, 4, 4, 6, 3};            /* MHA, head size 4 */

static int contains(const char *s, const char *sub) { return strstr(s, sub) != NULL; }

/* Opens (bin, tok) from exact-size copies. */
static dhsa_status open_copies(const uint8_t *bin, size_t bn, const uint8_t *tok, size_t tn, dhsa_gguf **g) {
    uint8_t *b = malloc(bn ? bn : 1), *t = malloc(tn ? tn : 1);
    if (bn) memcpy(b, bin, bn);
    if (tn) memcpy(t, tok, tn);
    dhsa_status st = dhsa_llama2c_open_memory(b, bn, t, tn, NULL, g);
    free(b);
    free(t);
    return st;
}

/* Every key (type and value, arrays element by element) and every tensor
 * (name, type, dims, bytes) of a equal to b's, in the same order. Returns
 * the number of differences and prints the first few. */
static int gguf_diff(const dhsa_gguf *a, const dhsa_gguf *b) {
    int bad = 0;
    if (dhsa_gguf_n_kv(a) != dhsa_gguf_n_kv(b) || dhsa_gguf_n_tensors(a) != dhsa_gguf_n_tensors(b)) {
        fprintf(stderr, "  counts differ: %lld/%lld kv, %lld/%lld tensors\n", (long long)dhsa_gguf_n_kv(a),
                (long long)dhsa_gguf_n_kv(b), (long long)dhsa_gguf_n_tensors(a), (long long)dhsa_gguf_n_tensors(b));
        return 1;
    }
    for (int64_t i = 0; i < dhsa_gguf_n_kv(a); i++) {
        const dhsa_gguf_kv *x = dhsa_gguf_kv_at(a, i), *y = dhsa_gguf_kv_at(b, i);
        int same = x->key_len == y->key_len && memcmp(x->key, y->key, (size_t)x->key_len) == 0 &&
                   x->type == y->type && x->u == y->u && x->i == y->i &&
                   (x->f == y->f || (isnan(x->f) && isnan(y->f))) && x->str.len == y->str.len &&
                   (x->str.len == 0 || memcmp(x->str.str, y->str.str, (size_t)x->str.len) == 0);
        if (same && x->type == DHSA_GGUF_ARRAY) {
            same = x->arr.type == y->arr.type && x->arr.n == y->arr.n;
            if (same && x->arr.type == DHSA_GGUF_STRING) {
                const dhsa_gguf_str *sx = x->arr.data, *sy = y->arr.data;
                for (int64_t j = 0; same && j < x->arr.n; j++)
                    same = sx[j].len == sy[j].len && memcmp(sx[j].str, sy[j].str, (size_t)sx[j].len) == 0;
            } else if (same && x->arr.n > 0) {
                size_t esz = x->arr.type == DHSA_GGUF_FLOAT32 || x->arr.type == DHSA_GGUF_INT32 ||
                                     x->arr.type == DHSA_GGUF_UINT32
                                 ? 4
                                 : 1;
                same = memcmp(x->arr.data, y->arr.data, esz * (size_t)x->arr.n) == 0;
            }
        }
        if (!same && bad++ < 3) fprintf(stderr, "  key %lld (%s) differs\n", (long long)i, x->key);
    }
    for (int64_t i = 0; i < dhsa_gguf_n_tensors(a); i++) {
        const dhsa_gguf_tensor *x = dhsa_gguf_tensor_at(a, i), *y = dhsa_gguf_tensor_at(b, i);
        int same = strcmp(x->name, y->name) == 0 && x->type == y->type && x->n_dims == y->n_dims &&
                   memcmp(x->dims, y->dims, sizeof x->dims) == 0 && x->bytes == y->bytes &&
                   memcmp(x->data, y->data, (size_t)x->bytes) == 0;
        if (!same && bad++ < 3) fprintf(stderr, "  tensor %lld (%s) differs\n", (long long)i, x->name);
    }
    return bad;
}

/* --------------------------------------------------------------------- */
/* The real model against the GGUF llama.cpp made                          */

/* Compares the conversion of (bin, tok) with the reference GGUF; returns
 * the number of differences (so a deliberately wrong input can be shown to
 * fail). */
static int compare_with_reference(const dhsa_gguf *mine, const dhsa_gguf *ref, int verbose) {
    int bad = 0;
    /* Tensors: every reference tensor has its bytes in mine; its tied
     * output.weight is our token_embd. */
    for (int64_t i = 0; i < dhsa_gguf_n_tensors(ref); i++) {
        const dhsa_gguf_tensor *r = dhsa_gguf_tensor_at(ref, i);
        const char *name = r->name;
        if (strcmp(name, "output.weight") == 0 && dhsa_gguf_find_tensor(mine, name) < 0) name = "token_embd.weight";
        int64_t j = dhsa_gguf_find_tensor(mine, name);
        const dhsa_gguf_tensor *m = j >= 0 ? dhsa_gguf_tensor_at(mine, j) : NULL;
        int same = m && m->type == r->type && m->n_dims == r->n_dims && memcmp(m->dims, r->dims, sizeof m->dims) == 0 &&
                   m->bytes == r->bytes && memcmp(m->data, r->data, (size_t)r->bytes) == 0;
        if (!same) {
            if (verbose && bad < 5) {
                int64_t at = -1;
                if (m && m->bytes == r->bytes)
                    for (int64_t k = 0; k < r->n_elements && at < 0; k++)
                        if (memcmp((const float *)m->data + k, (const float *)r->data + k, 4) != 0) at = k;
                fprintf(stderr, "  tensor %s differs (first differing element %lld)\n", r->name, (long long)at);
            }
            bad++;
        }
    }
    /* And no tensor the reference lacks. */
    for (int64_t i = 0; i < dhsa_gguf_n_tensors(mine); i++)
        if (dhsa_gguf_find_tensor(ref, dhsa_gguf_tensor_at(mine, i)->name) < 0) bad++;
    /* Tokenizer arrays. */
    static const char *const arrs[] = {"tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"};
    for (int k = 0; k < 3; k++) {
        dhsa_gguf_array a, b;
        if (dhsa_gguf_get_arr(mine, arrs[k], &a) || dhsa_gguf_get_arr(ref, arrs[k], &b) || a.type != b.type ||
            a.n != b.n) {
            bad++;
            continue;
        }
        for (int64_t j = 0; j < a.n; j++) {
            int same;
            if (a.type == DHSA_GGUF_STRING) {
                const dhsa_gguf_str *x = (const dhsa_gguf_str *)a.data + j, *y = (const dhsa_gguf_str *)b.data + j;
                same = x->len == y->len && memcmp(x->str, y->str, (size_t)x->len) == 0;
            } else {
                same = memcmp((const uint8_t *)a.data + 4 * j, (const uint8_t *)b.data + 4 * j, 4) == 0;
            }
            if (!same) {
                if (verbose) fprintf(stderr, "  %s[%lld] differs\n", arrs[k], (long long)j);
                bad++;
                break;
            }
        }
    }
    /* Hyperparameters and ids, except context_length (see below). */
    static const char *const ints[] = {"llama.embedding_length",        "llama.block_count",
                                       "llama.feed_forward_length",     "llama.attention.head_count",
                                       "llama.attention.head_count_kv", "llama.rope.dimension_count",
                                       "tokenizer.ggml.bos_token_id",   "tokenizer.ggml.eos_token_id",
                                       "tokenizer.ggml.unknown_token_id"};
    for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++) {
        uint32_t x, y;
        if (dhsa_gguf_get_u32(mine, ints[k], &x) || dhsa_gguf_get_u32(ref, ints[k], &y) || x != y) {
            if (verbose) fprintf(stderr, "  %s differs\n", ints[k]);
            bad++;
        }
    }
    float ex, ey;
    if (dhsa_gguf_get_f32(mine, "llama.attention.layer_norm_rms_epsilon", &ex) ||
        dhsa_gguf_get_f32(ref, "llama.attention.layer_norm_rms_epsilon", &ey) || ex != ey)
        bad++;
    const char *sx, *sy;
    if (dhsa_gguf_get_str(mine, "general.architecture", &sx, NULL) ||
        dhsa_gguf_get_str(ref, "general.architecture", &sy, NULL) || strcmp(sx, sy) != 0)
        bad++;
    if (dhsa_gguf_get_str(mine, "tokenizer.ggml.model", &sx, NULL) ||
        dhsa_gguf_get_str(ref, "tokenizer.ggml.model", &sy, NULL) || strcmp(sx, sy) != 0)
        bad++;
    return bad;
}

/* The first greedy ids of run.c (karpathy/llama2.c 350e04fe, `run
 * stories260K.bin -z tok512.bin -t 0 -n 256 -i "Once upon a time"`, ids
 * printed by a patched copy; docs/llama2c.md), BOS and the 4 prompt ids
 * first, and the text run.c printed for them. */
static const int32_t greedy_ids[] = {1,   403, 407, 261, 378, 432, 383, 286, 261, 376, 298,
                                     315, 421, 395, 317, 426, 338, 401, 396, 267, 337, 410,
                                     408, 419, 292, 411, 322, 265, 282, 295, 433, 426};
static const char greedy_text[] = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.";

static void test_shared_model(void) {
    if (access(BIN, R_OK) != 0 || access(TOK, R_OK) != 0 || access(GGUF, R_OK) != 0) {
        T_SKIP(15, "../shared/models (stories260K.bin, tok512.bin, stories260K.gguf) absent: real-model tests skipped");
        return;
    }
    dhsa_gguf *mine = NULL, *ref = NULL;
    dhsa_status st = dhsa_llama2c_open(BIN, TOK, &mine);
    T_CHECK(st == DHSA_OK, "dhsa_llama2c_open(stories260K): %s", dhsa_last_error());
    st = dhsa_gguf_open(GGUF, &ref);
    T_CHECK(st == DHSA_OK, "open the reference GGUF: %s", dhsa_last_error());
    if (!mine || !ref) {
        dhsa_gguf_close(mine);
        dhsa_gguf_close(ref);
        return;
    }
    T_CHECK(compare_with_reference(mine, ref, 1) == 0, "stories260K converted differs from stories260K.gguf");
    T_CHECK(dhsa_gguf_n_tensors(mine) == 47 && dhsa_gguf_n_tensors(ref) == 48,
            "47 tensors (tied output) vs the reference's 48 (an output.weight copy): %lld, %lld",
            (long long)dhsa_gguf_n_tensors(mine), (long long)dhsa_gguf_n_tensors(ref));
    uint32_t ctx_mine = 0, ctx_ref = 0;
    dhsa_gguf_get_u32(mine, "llama.context_length", &ctx_mine);
    dhsa_gguf_get_u32(ref, "llama.context_length", &ctx_ref);
    T_CHECK(ctx_mine == 512 && ctx_ref == 2048,
            "context_length: the checkpoint's seq_len 512 (the reference says 2048): %u, %u", ctx_mine, ctx_ref);
    const char *name = NULL;
    dhsa_gguf_get_str(mine, "general.name", &name, NULL);
    T_CHECK(name && strcmp(name, "stories260K") == 0, "general.name from the file name: %s", name ? name : "(none)");
    float base = 0;
    T_CHECK(dhsa_gguf_get_f32(mine, "llama.rope.freq_base", &base) == DHSA_OK && base == 10000.0f,
            "rope.freq_base 10000");

    /* A test that cannot fail is a bug: one flipped weight byte must show. */
    size_t bn, tn;
    uint8_t *bin = read_all(BIN, &bn), *tok = read_all(TOK, &tn);
    if (bin && tok) {
        bin[28 + 4 * 70000 + 1] ^= 0x10; /* a float inside blk.N */
        dhsa_gguf *wrong;
        if (open_copies(bin, bn, tok, tn, &wrong) == DHSA_OK) {
            T_CHECK(compare_with_reference(wrong, ref, 0) == 1, "a flipped weight byte is found (once)");
            dhsa_gguf_close(wrong);
        }
        bin[28 + 4 * 70000 + 1] ^= 0x10;
        tok[4 + 8 + 5 + 8 + 1] ^= 1; /* a byte of token 1's text: <s> is rewritten anyway */
        tok[tn - 1] ^= 1;            /* the last token's text */
        if (open_copies(bin, bn, tok, tn, &wrong) == DHSA_OK) {
            T_CHECK(compare_with_reference(wrong, ref, 0) == 1, "a changed token text is found");
            dhsa_gguf_close(wrong);
        }
        tok[tn - 1] ^= 1;
        tok[4 + 8 + 5 + 8 + 1] ^= 1;
        /* The config reader agrees with the header. */
        dhsa_llama2c_config c;
        T_CHECK(dhsa_llama2c_read_config(BIN, &c) == DHSA_OK && c.dim == 64 && c.hidden_dim == 172 &&
                    c.n_layers == 5 && c.n_heads == 8 && c.n_kv_heads == 4 && c.vocab_size == 512 &&
                    c.seq_len == 512 && c.shared_classifier && c.head_size == 8 && c.file_size == bn &&
                    c.n_params == 260032,
                "read_config(stories260K.bin): %s", dhsa_last_error());
        /* A few hundred mutations of the real files (header and tokenizer
         * regions, where the checks are). */
        size_t total = bn + tn;
        uint8_t *both = malloc(total);
        memcpy(both, bin, bn);
        memcpy(both + bn, tok, tn);
        int broken = 0;
        for (int it = 0; it < 300; it++) {
            uint8_t *m = malloc(total);
            memcpy(m, both, total);
            int nmut = 1 + (int)(rng() % 4);
            for (int k = 0; k < nmut; k++) {
                size_t at = rng() % 2 ? rng() % 28 : bn + rng() % tn;
                m[at] = (uint8_t)rng();
            }
            broken += dhsa_llama2c_fuzz_one(m, total);
            free(m);
        }
        T_CHECK(broken == 0, "300 mutations of stories260K: %d broke a contract", broken);
        T_CHECK(dhsa_llama2c_fuzz_one(both, total) == 0, "the fuzz check passes the real model");
        free(both);
    }
    free(bin);
    free(tok);

    /* The tokenizer built from the conversion agrees with run.c. */
    dhsa_tokenizer *t = NULL;
    st = dhsa_tokenizer_from_gguf(mine, &t);
    T_CHECK(st == DHSA_OK, "tokenizer from the converted model: %s", dhsa_last_error());
    if (t) {
        int32_t ids[64];
        int64_t n = 0;
        const char *prompt = "Once upon a time";
        st = dhsa_tokenize(t, prompt, (int64_t)strlen(prompt), dhsa_tokenizer_default_flags(t), ids, 64, &n);
        T_CHECK(st == DHSA_OK && n == 5 && memcmp(ids, greedy_ids, 5 * sizeof ids[0]) == 0,
                "\"Once upon a time\" -> 1 403 407 261 378 as run.c encodes it (got %lld ids: %d %d %d %d %d)",
                (long long)n, ids[0], ids[1], ids[2], ids[3], ids[4]);
        char text[512];
        int64_t len = 0;
        int64_t n_greedy = (int64_t)(sizeof greedy_ids / sizeof greedy_ids[0]);
        st = dhsa_detokenize(t, greedy_ids, n_greedy, 0, text, (int64_t)sizeof text - 1, &len);
        text[st == DHSA_OK ? len : 0] = 0;
        T_CHECK(st == DHSA_OK && strcmp(text, greedy_text) == 0, "run.c's greedy ids detokenize to its text: \"%s\"",
                text);
        dhsa_tokenizer_free(t);
    }
    dhsa_gguf_close(mine);
    dhsa_gguf_close(ref);
}

/* --------------------------------------------------------------------- */
/* Small checkpoints written here                                         */

/* The float at index k of a checkpoint from make_ckpt is k. */
static float at_index(const dhsa_gguf *g, const char *name, int64_t elem) {
    int64_t i = dhsa_gguf_find_tensor(g, name);
    if (i < 0) return -1.0f;
    const dhsa_gguf_tensor *t = dhsa_gguf_tensor_at(g, i);
    if (elem >= t->n_elements) return -2.0f;
    return ((const float *)t->data)[elem];
}

static void check_small(hdr h, const char *what) {
    size_t bn, tn;
    uint8_t *bin = make_ckpt(h, &bn);
    int32_t V = h.vocab < 0 ? -h.vocab : h.vocab;
    uint8_t *tok = make_tok(V, &tn);
    dhsa_gguf *g = NULL;
    dhsa_status st = open_copies(bin, bn, tok, tn, &g);
    T_CHECK(st == DHSA_OK, "%s: open: %s", what, dhsa_last_error());
    if (!g) {
        free(bin);
        free(tok);
        return;
    }
    int64_t d = h.dim, hd = h.hidden, L = h.layers, hs = h.dim / h.heads, kvd = h.kv_heads * hs;
    int shared = h.vocab > 0;
    T_CHECK(dhsa_gguf_n_tensors(g) == 9 * L + 2 + !shared, "%s: %lld tensors", what,
            (long long)dhsa_gguf_n_tensors(g));
    /* Region starts (float indices) from the llama2.c layout, written out
     * here independently of the importer. */
    int64_t embed = 0, rms_att = embed + V * d, wq = rms_att + L * d, wk = wq + L * d * d, wv = wk + L * d * kvd;
    int64_t wo = wv + L * d * kvd, rms_ffn = wo + L * d * d, w1 = rms_ffn + L * d, w2 = w1 + L * hd * d;
    int64_t w3 = w2 + L * d * hd, fin = w3 + L * hd * d, wcls = fin + d + (int64_t)h.seq * hs;
    int64_t l = L - 1; /* the last layer */
    char nm[64];
#define AT(n, e) at_index(g, n, e)
#define BLK(s) (snprintf(nm, sizeof nm, "blk.%lld.%s.weight", (long long)l, s), nm)
    T_CHECK(AT("token_embd.weight", 3 * d + 1) == (float)(embed + 3 * d + 1), "%s: token_embd row 3", what);
    T_CHECK(AT("output_norm.weight", 0) == (float)fin, "%s: output_norm", what);
    T_CHECK(AT(BLK("attn_norm"), 1) == (float)(rms_att + l * d + 1), "%s: attn_norm", what);
    T_CHECK(AT(BLK("attn_q"), d + 2) == (float)(wq + l * d * d + d + 2), "%s: attn_q", what);
    T_CHECK(AT(BLK("attn_k"), d * kvd - 1) == (float)(wk + l * d * kvd + d * kvd - 1), "%s: attn_k", what);
    T_CHECK(AT(BLK("attn_v"), 0) == (float)(wv + l * d * kvd), "%s: attn_v", what);
    T_CHECK(AT(BLK("attn_output"), 5) == (float)(wo + l * d * d + 5), "%s: attn_output", what);
    T_CHECK(AT(BLK("ffn_norm"), d - 1) == (float)(rms_ffn + l * d + d - 1), "%s: ffn_norm", what);
    T_CHECK(AT(BLK("ffn_gate"), 7) == (float)(w1 + l * hd * d + 7), "%s: ffn_gate = w1", what);
    T_CHECK(AT(BLK("ffn_down"), 7) == (float)(w2 + l * d * hd + 7), "%s: ffn_down = w2", what);
    T_CHECK(AT(BLK("ffn_up"), 7) == (float)(w3 + l * hd * d + 7), "%s: ffn_up = w3", what);
    if (!shared) T_CHECK(AT("output.weight", 1) == (float)(wcls + 1), "%s: output = wcls", what);
    else T_CHECK(dhsa_gguf_find_tensor(g, "output.weight") < 0, "%s: no output.weight when tied", what);
#undef AT
#undef BLK
    /* Dims, GGUF order [n_in, n_out]. */
    const dhsa_gguf_tensor *t = dhsa_gguf_tensor_at(g, dhsa_gguf_find_tensor(g, "blk.0.attn_k.weight"));
    T_CHECK(t->n_dims == 2 && t->dims[0] == d && t->dims[1] == kvd, "%s: attn_k dims [%lld, %lld]", what,
            (long long)t->dims[0], (long long)t->dims[1]);
    t = dhsa_gguf_tensor_at(g, dhsa_gguf_find_tensor(g, "blk.0.ffn_down.weight"));
    T_CHECK(t->n_dims == 2 && t->dims[0] == hd && t->dims[1] == d, "%s: ffn_down dims", what);
    t = dhsa_gguf_tensor_at(g, dhsa_gguf_find_tensor(g, "token_embd.weight"));
    T_CHECK(t->n_dims == 2 && t->dims[0] == d && t->dims[1] == V, "%s: token_embd dims", what);
    T_CHECK(((uintptr_t)t->data & 31) == 0, "%s: tensor data 32-byte aligned in memory", what);
    /* Metadata. */
    uint32_t u;
    T_CHECK(dhsa_gguf_get_u32(g, "llama.context_length", &u) == 0 && u == (uint32_t)h.seq, "%s: context", what);
    T_CHECK(dhsa_gguf_get_u32(g, "llama.attention.head_count_kv", &u) == 0 && u == (uint32_t)h.kv_heads,
            "%s: head_count_kv", what);
    T_CHECK(dhsa_gguf_get_u32(g, "llama.rope.dimension_count", &u) == 0 && u == (uint32_t)hs, "%s: n_rot", what);
    int b = 0;
    T_CHECK(dhsa_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b) == 0 && b, "%s: add_bos_token", what);
    T_CHECK(dhsa_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &b) == 0 && b, "%s: add_space_prefix", what);
    dhsa_gguf_array a;
    T_CHECK(dhsa_gguf_get_arr(g, "tokenizer.ggml.tokens", &a) == 0 && a.n == V, "%s: tokens", what);
    const dhsa_gguf_str *s = a.data;
    T_CHECK(strcmp(s[0].str, "<unk>") == 0 && strcmp(s[1].str, "<s>") == 0 && strcmp(s[2].str, "</s>") == 0,
            "%s: ids 0-2 renamed", what);
    T_CHECK(strcmp(s[3].str, "\xe2\x96\x81w3") == 0, "%s: ' ' became U+2581: %s", what, s[3].str);
    T_CHECK(dhsa_gguf_get_arr(g, "tokenizer.ggml.token_type", &a) == 0 && a.n == V &&
                ((const int32_t *)a.data)[0] == DHSA_TOKEN_UNKNOWN &&
                ((const int32_t *)a.data)[1] == DHSA_TOKEN_CONTROL &&
                ((const int32_t *)a.data)[2] == DHSA_TOKEN_CONTROL && ((const int32_t *)a.data)[3] == DHSA_TOKEN_NORMAL,
            "%s: token types", what);
    T_CHECK(dhsa_gguf_get_arr(g, "tokenizer.ggml.scores", &a) == 0 && a.n == V &&
                ((const float *)a.data)[V - 1] == -(float)(V - 1),
            "%s: scores", what);
    T_CHECK(dhsa_llama2c_fuzz_one(bin, bn) == 0, "%s: a lone checkpoint fails cleanly in the fuzz body", what);
    dhsa_gguf_close(g);
    free(bin);
    free(tok);
}

static void test_small_models(void) {
    check_small(H_SMALL, "small GQA shared");
    check_small(H_UNSHARED, "small unshared");
    check_small(H_MHA, "small MHA");

    /* Byte tokens: with V > 300 the tokenizer file has <0x00>..<0xFF>. */
    hdr hb = {4, 4, 1, 1, 1, 320, 2};
    size_t bn, tn;
    uint8_t *bin = make_ckpt(hb, &bn), *tok = make_tok(320, &tn);
    dhsa_gguf *g = NULL;
    T_CHECK(open_copies(bin, bn, tok, tn, &g) == DHSA_OK, "byte tokens: %s", dhsa_last_error());
    if (g) {
        dhsa_gguf_array a;
        dhsa_gguf_get_arr(g, "tokenizer.ggml.token_type", &a);
        const int32_t *ty = a.data;
        T_CHECK(ty[3] == DHSA_TOKEN_BYTE && ty[258] == DHSA_TOKEN_BYTE && ty[259] == DHSA_TOKEN_NORMAL,
                "<0x00>..<0xFF> are BYTE, the next NORMAL: %d %d %d", ty[3], ty[258], ty[259]);
        dhsa_tokenizer *t;
        T_CHECK(dhsa_tokenizer_from_gguf(g, &t) == DHSA_OK, "tokenizer from a small model: %s", dhsa_last_error());
        if (t) {
            /* Byte fallback and U+2581 work with the converted vocab. */
            int32_t ids[16];
            int64_t n = 0;
            T_CHECK(dhsa_tokenize(t, "\x01", 1, 0, ids, 16, &n) == DHSA_OK && n >= 1 && ids[n - 1] == 4,
                    "\\x01 -> <0x01> (id 4): n=%lld, last %d", (long long)n, n ? ids[n - 1] : -1);
            const int32_t back_ids[2] = {300, 4};
            char text[32];
            int64_t len = 0;
            T_CHECK(dhsa_detokenize(t, back_ids, 2, 0, text, 31, &len) == DHSA_OK && len == 5 &&
                        memcmp(text, "w300\x01", 5) == 0,
                    "detokenize 300 4 -> \"w300\\x01\" (len %lld)", (long long)len);
            dhsa_tokenizer_free(t);
        }
        dhsa_gguf_close(g);
    }
    free(bin);
    free(tok);

    /* An empty token text is CONTROL (llama.cpp's rule); names: NULL ->
     * "llama2.c". */
    buf tb = {0};
    buf_i32(&tb, 8);
    const char *texts[5] = {"<unk>", "\n<s>\n", "\n</s>\n", "", "a b"};
    for (int i = 0; i < 5; i++) {
        buf_f32(&tb, 0.5f);
        buf_i32(&tb, (int32_t)strlen(texts[i]));
        buf_put(&tb, texts[i], strlen(texts[i]));
    }
    bin = make_ckpt(H_SMALL, &bn);
    g = NULL;
    T_CHECK(dhsa_llama2c_open_memory(bin, bn, tb.p, tb.n, NULL, &g) == DHSA_OK, "empty token: %s",
            dhsa_last_error());
    if (g) {
        dhsa_gguf_array a;
        dhsa_gguf_get_arr(g, "tokenizer.ggml.token_type", &a);
        T_CHECK(((const int32_t *)a.data)[3] == DHSA_TOKEN_CONTROL, "empty text -> CONTROL");
        dhsa_gguf_get_arr(g, "tokenizer.ggml.tokens", &a);
        T_CHECK(strcmp(((const dhsa_gguf_str *)a.data)[4].str, "a\xe2\x96\x81" "b") == 0, "inner space escaped");
        const char *name;
        T_CHECK(dhsa_gguf_get_str(g, "general.name", &name, NULL) == 0 && strcmp(name, "llama2.c") == 0,
                "default general.name");
        dhsa_gguf_close(g);
    }
    free(bin);
    free(tb.p);
}

/* --------------------------------------------------------------------- */
/* Files: round trip, refusals                                            */

static char tmpdir[64];

static void test_files(void) {
    size_t bn, tn;
    uint8_t *bin = make_ckpt(H_UNSHARED, &bn), *tok = make_tok(5, &tn);
    char pb[128], pt[128], po[128], ppart[140];
    snprintf(pb, sizeof pb, "%s/tiny.bin", tmpdir);
    snprintf(pt, sizeof pt, "%s/tok5.bin", tmpdir);
    snprintf(po, sizeof po, "%s/tiny.gguf", tmpdir);
    snprintf(ppart, sizeof ppart, "%s.part", po);
    T_CHECK(write_all(pb, bin, bn) == 0 && write_all(pt, tok, tn) == 0, "write the small files");

    dhsa_status st = dhsa_convert_llama2c(pb, pt, po);
    T_CHECK(st == DHSA_OK, "convert to a file: %s", dhsa_last_error());
    T_CHECK(access(ppart, F_OK) != 0, "no .part file left behind");
    dhsa_gguf *from_file = NULL, *in_mem = NULL;
    T_CHECK(dhsa_gguf_open(po, &from_file) == DHSA_OK, "reopen the written GGUF: %s", dhsa_last_error());
    T_CHECK(dhsa_llama2c_open(pb, pt, &in_mem) == DHSA_OK, "dhsa_llama2c_open on files: %s", dhsa_last_error());
    if (from_file && in_mem) {
        T_CHECK(gguf_diff(from_file, in_mem) == 0, "the file and the in-memory image hold the same GGUF");
        T_CHECK(dhsa_gguf_file_size(from_file) == dhsa_gguf_file_size(in_mem), "same size: %llu vs %llu",
                (unsigned long long)dhsa_gguf_file_size(from_file), (unsigned long long)dhsa_gguf_file_size(in_mem));
        const char *name;
        T_CHECK(dhsa_gguf_get_str(from_file, "general.name", &name, NULL) == 0 && strcmp(name, "tiny") == 0,
                "general.name is the file name without extension");
    }
    dhsa_gguf_close(from_file);
    dhsa_gguf_close(in_mem);

    /* Refusals. */
    st = dhsa_convert_llama2c(pb, pt, pb);
    T_CHECK(st == DHSA_ERR_INVALID_ARG && contains(dhsa_last_error(), "overwrite"), "output = input refused: %s",
            dhsa_last_error());
    size_t n2;
    uint8_t *again = read_all(pb, &n2);
    T_CHECK(again && n2 == bn && memcmp(again, bin, bn) == 0, "the input is untouched");
    free(again);
    char bad_dir[160];
    snprintf(bad_dir, sizeof bad_dir, "%s/no/such/dir/x.gguf", tmpdir);
    st = dhsa_convert_llama2c(pb, pt, bad_dir);
    T_CHECK(st == DHSA_ERR_IO, "unwritable output: %s", dhsa_last_error());
    st = dhsa_llama2c_open(pb, "/nonexistent/tok.bin", &in_mem);
    T_CHECK(st == DHSA_ERR_IO && in_mem == NULL && contains(dhsa_last_error(), "/nonexistent/tok.bin"),
            "missing tokenizer: %s", dhsa_last_error());
    st = dhsa_llama2c_open(pb, NULL, &in_mem);
    T_CHECK(st == DHSA_ERR_INVALID_ARG && contains(dhsa_last_error(), "tokenizer"), "no tokenizer path: %s",
            dhsa_last_error());
    st = dhsa_llama2c_open(tmpdir, pt, &in_mem);
    T_CHECK(st == DHSA_ERR_IO, "a directory: %s", dhsa_last_error());
    /* A bad tokenizer file is named in the sentence; so is a bad checkpoint. */
    uint8_t *tok_bad = malloc(tn);
    memcpy(tok_bad, tok, tn);
    put_i32(tok_bad, -1);
    char ptb[128];
    snprintf(ptb, sizeof ptb, "%s/tokbad.bin", tmpdir);
    write_all(ptb, tok_bad, tn);
    st = dhsa_llama2c_open(pb, ptb, &in_mem);
    T_CHECK(st == DHSA_ERR_FORMAT && strncmp(dhsa_last_error(), ptb, strlen(ptb)) == 0 &&
                contains(dhsa_last_error(), "max_token_length is -1"),
            "the tokenizer's path starts the sentence: %s", dhsa_last_error());
    st = dhsa_convert_llama2c(pb, ptb, po);
    T_CHECK(st == DHSA_ERR_FORMAT && contains(dhsa_last_error(), ptb), "convert names the bad tokenizer: %s",
            dhsa_last_error());
    st = dhsa_llama2c_open(pt, pt, &in_mem);
    T_CHECK(st == DHSA_ERR_FORMAT && strncmp(dhsa_last_error(), pt, strlen(pt)) == 0 &&
                contains(dhsa_last_error(), "checkpoint"),
            "the checkpoint's path starts the sentence: %s", dhsa_last_error());
    /* A GGUF is not a checkpoint. */
    st = dhsa_llama2c_open(po, pt, &in_mem);
    T_CHECK(st == DHSA_ERR_FORMAT && contains(dhsa_last_error(), "GGUF file"), "GGUF given as checkpoint: %s",
            dhsa_last_error());
    free(tok_bad);
    free(bin);
    free(tok);
}

/* --------------------------------------------------------------------- */
/* Truncation and corruption                                              */

static void test_truncation(void) {
    size_t bn, tn;
    uint8_t *bin = make_ckpt(H_SMALL, &bn), *tok = make_tok(5, &tn);
    int bad = 0, unclear = 0;
    for (size_t n = 0; n < bn; n++) {
        dhsa_gguf *g = NULL;
        dhsa_status st = open_copies(bin, n, tok, tn, &g);
        if (st != DHSA_ERR_FORMAT || g) bad++;
        const char *e = dhsa_last_error();
        if (!(contains(e, n < 28 ? "fewer than the 28-byte header" : "implies a file of"))) unclear++;
        dhsa_gguf_close(g);
    }
    T_CHECK(bad == 0 && unclear == 0, "every truncation of a %zu-byte checkpoint: %d not refused, %d unclear", bn,
            bad, unclear);
    /* Extended by 1..8 bytes. */
    bad = 0;
    uint8_t *ext = calloc(bn + 8, 1);
    memcpy(ext, bin, bn);
    for (size_t k = 1; k <= 8; k++) {
        dhsa_gguf *g = NULL;
        if (open_copies(ext, bn + k, tok, tn, &g) != DHSA_ERR_FORMAT || !contains(dhsa_last_error(), "but it has"))
            bad++;
        dhsa_gguf_close(g);
    }
    T_CHECK(bad == 0, "a checkpoint with 1..8 extra bytes is refused");
    free(ext);

    bad = unclear = 0;
    for (size_t n = 0; n < tn; n++) {
        dhsa_gguf *g = NULL;
        dhsa_status st = open_copies(bin, bn, tok, n, &g);
        if (st != DHSA_ERR_FORMAT || g) bad++;
        const char *e = dhsa_last_error();
        if (!contains(e, "llama2.c tokenizer:") ||
            !(contains(e, "fewer than the 4-byte") || contains(e, "ends after") || contains(e, "ends inside") ||
              contains(e, "run past the end")))
            unclear++;
        dhsa_gguf_close(g);
    }
    T_CHECK(bad == 0 && unclear == 0, "every truncation of a %zu-byte tokenizer: %d not refused, %d unclear", tn,
            bad, unclear);
    dhsa_gguf *g = NULL;
    T_CHECK(open_copies(bin, bn, tok, tn, &g) == DHSA_OK, "the untruncated pair opens: %s", dhsa_last_error());
    dhsa_gguf_close(g);
    free(bin);
    free(tok);
}

/* Opens bin with header field f (0..6) set to v; returns the status and
 * leaves the sentence in dhsa_last_error(). */
static dhsa_status with_field(hdr h, int f, int32_t v) {
    size_t bn, tn;
    uint8_t *bin = make_ckpt(h, &bn), *tok = make_tok(h.vocab < 0 ? -h.vocab : h.vocab, &tn);
    put_i32(bin + 4 * f, v);
    dhsa_gguf *g = NULL;
    dhsa_status st = open_copies(bin, bn, tok, tn, &g);
    dhsa_gguf_close(g);
    free(bin);
    free(tok);
    return st;
}

static void expect(dhsa_status st, dhsa_status want, const char *sub, const char *what) {
    T_CHECK(st == want && contains(dhsa_last_error(), sub), "%s: want %s with \"%s\", got %s: %s", what,
            dhsa_status_str(want), sub, dhsa_status_str(st), dhsa_last_error());
}

static void test_headers(void) {
    static const char *const names[7] = {"dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size",
                                         "seq_len"};
    for (int f = 0; f < 7; f++) {
        char what[64];
        snprintf(what, sizeof what, "%s = 0", names[f]);
        expect(with_field(H_SMALL, f, 0), DHSA_ERR_FORMAT, names[f], what);
        if (f != 5) {
            snprintf(what, sizeof what, "%s = -3", names[f]);
            expect(with_field(H_SMALL, f, -3), DHSA_ERR_FORMAT, "must be positive", what);
        }
        snprintf(what, sizeof what, "%s = INT32_MIN", names[f]);
        T_CHECK(with_field(H_SMALL, f, INT32_MIN) == DHSA_ERR_FORMAT && dhsa_last_error()[0], "%s: %s", what,
                dhsa_last_error());
        /* Huge: the implied size never matches the small file (and never
         * overflows silently). */
        snprintf(what, sizeof what, "%s = INT32_MAX", names[f]);
        T_CHECK(with_field(H_SMALL, f, INT32_MAX) == DHSA_ERR_FORMAT && dhsa_last_error()[0], "%s: %s", what,
                dhsa_last_error());
    }
    expect(with_field(H_SMALL, 3, 3), DHSA_ERR_FORMAT, "n_heads 3 does not divide dim 8", "n_heads not dividing");
    expect(with_field(H_MHA, 4, 3), DHSA_ERR_FORMAT, "n_kv_heads 3 does not divide n_heads 4", "n_kv not dividing");
    expect(with_field(H_SMALL, 4, 4), DHSA_ERR_FORMAT, "n_kv_heads 4 does not divide n_heads 2", "n_kv > n_heads");
    expect(with_field(H_SMALL, 3, 8), DHSA_ERR_FORMAT, "is odd", "head size 1 (odd)");
    expect(with_field(H_SMALL, 5, 2), DHSA_ERR_FORMAT, "at least 3 tokens", "vocab 2");
    expect(with_field(H_SMALL, 5, -5), DHSA_ERR_FORMAT, "vocab_size should be positive",
           "shared file, negative vocab (hint)");
    expect(with_field(H_UNSHARED, 5, 5), DHSA_ERR_FORMAT, "vocab_size should be negative",
           "unshared file, positive vocab (hint)");
    expect(with_field(H_SMALL, 2, 3), DHSA_ERR_FORMAT, "implies a file of", "more layers than the file holds");
    /* Every field INT32_MAX at once: the implied size overflows 64 bits. */
    size_t bn;
    uint8_t *bin = make_ckpt(H_SMALL, &bn);
    for (int f = 0; f < 7; f++) put_i32(bin + 4 * f, f == 3 || f == 4 ? 1 : 1 << 30);
    dhsa_llama2c_config c;
    expect(dhsa_llama2c_config_from_memory(bin, bn, &c), DHSA_ERR_FORMAT, "more than 2^64", "2^64 overflow");
    /* ak42 exports. */
    put_i32(bin, 0x616b3432);
    put_i32(bin + 4, 1);
    expect(dhsa_llama2c_config_from_memory(bin, bn, &c), DHSA_ERR_FORMAT, "version 1", "ak42 v1 export");
    memcpy(bin, "GGUF", 4);
    expect(dhsa_llama2c_config_from_memory(bin, bn, &c), DHSA_ERR_FORMAT, "GGUF file", "GGUF magic");
    free(bin);
}

/* Opens the small checkpoint with a tokenizer patched by fn. */
static dhsa_status with_tok(void (*fn)(uint8_t *tok, size_t *tn), int32_t vocab_override) {
    size_t bn, tn;
    hdr h = H_SMALL;
    if (vocab_override) h.vocab = vocab_override;
    uint8_t *bin = make_ckpt(h, &bn), *tok = make_tok(5, &tn);
    tok = realloc(tok, tn + 64);
    if (fn) fn(tok, &tn);
    dhsa_gguf *g = NULL;
    dhsa_status st = open_copies(bin, bn, tok, tn, &g);
    dhsa_gguf_close(g);
    free(bin);
    free(tok);
    return st;
}

/* Offsets in make_tok(5): 4 | token 0: 8 + 5 | token 1: 8 + 5 | token 2:
 * 8 + 6 | token 3 " w3": 8 + 3 | token 4 " w4": 8 + 3. */
#define TOK3 (4 + 13 + 13 + 14)
static void t_nan(uint8_t *t, size_t *n) { (void)n; put_f32(t + TOK3, NAN); }
static void t_inf(uint8_t *t, size_t *n) { (void)n; put_f32(t + TOK3, -INFINITY); }
static void t_neg_len(uint8_t *t, size_t *n) { (void)n; put_i32(t + TOK3 + 4, -1); }
static void t_long(uint8_t *t, size_t *n) { (void)n; put_i32(t + TOK3 + 4, 9); }  /* > max 8 */
static void t_past(uint8_t *t, size_t *n) { put_i32(t, 64); put_i32(t + TOK3 + 4, 40); (void)n; }
static void t_nul(uint8_t *t, size_t *n) { (void)n; t[TOK3 + 8 + 1] = 0; }
static void t_max0(uint8_t *t, size_t *n) { (void)n; put_i32(t, 0); }
static void t_maxhuge(uint8_t *t, size_t *n) { (void)n; put_i32(t, 1 << 20); }
static void t_extra(uint8_t *t, size_t *n) { /* a sixth token */
    put_f32(t + *n, 0);
    put_i32(t + *n + 4, 1);
    t[*n + 8] = 'x';
    *n += 9;
}
static void t_stray(uint8_t *t, size_t *n) { t[(*n)++] = 7; }

static void test_tokenizer_corruption(void) {
    expect(with_tok(NULL, 0), DHSA_OK, "", "the unpatched pair");
    expect(with_tok(t_nan, 0), DHSA_ERR_FORMAT, "token 3 has score nan", "NaN score");
    expect(with_tok(t_inf, 0), DHSA_ERR_FORMAT, "token 3 has score -inf", "-Inf score");
    expect(with_tok(t_neg_len, 0), DHSA_ERR_FORMAT, "token 3 has length -1", "negative length");
    expect(with_tok(t_long, 0), DHSA_ERR_FORMAT, "more than max_token_length 8", "length > max_token_length");
    expect(with_tok(t_past, 0), DHSA_ERR_FORMAT, "run past the end of the file", "length beyond the file");
    expect(with_tok(t_nul, 0), DHSA_ERR_FORMAT, "token 3 holds a NUL byte", "NUL in a token");
    expect(with_tok(t_max0, 0), DHSA_ERR_FORMAT, "max_token_length is 0", "max_token_length 0");
    expect(with_tok(t_maxhuge, 0), DHSA_ERR_TOO_LARGE, "above dhsa's limit", "max_token_length 2^20");
    expect(with_tok(t_extra, 0), DHSA_ERR_FORMAT, "(they hold 1 more token)", "6 tokens for vocab 5");
    expect(with_tok(t_stray, 0), DHSA_ERR_FORMAT, "1 bytes follow token 4", "a stray byte");
    /* Vocab mismatch the other way: a checkpoint of vocab 6 (its size
     * right) with the 5-token file. */
    expect(with_tok(NULL, 6), DHSA_ERR_FORMAT, "ends after 5 tokens, but the checkpoint's vocab_size is 6",
           "too few tokens");
}

/* --------------------------------------------------------------------- */
/* Random mutations                                                       */

static void test_mutations(void) {
    const hdr shapes[3] = {H_SMALL, H_UNSHARED, H_MHA};
    int broken = 0, opened = 0, runs = 0;
    for (int s = 0; s < 3; s++) {
        size_t bn, tn;
        uint8_t *bin = make_ckpt(shapes[s], &bn);
        uint8_t *tok = make_tok(shapes[s].vocab < 0 ? -shapes[s].vocab : shapes[s].vocab, &tn);
        size_t total = 8 + bn + tn;
        uint8_t *both = malloc(total);
        memcpy(both, "L2CF", 4);
        put_i32(both + 4, (int32_t)bn);
        memcpy(both + 8, bin, bn);
        memcpy(both + 8 + bn, tok, tn);
        T_CHECK(dhsa_llama2c_fuzz_one(both, total) == 0, "shape %d: the unmutated input passes", s);
        T_CHECK(dhsa_llama2c_fuzz_one(both + 8, total - 8) == 0, "shape %d: split by the header passes", s);
        for (int it = 0; it < 1500; it++) {
            size_t n = total;
            uint8_t *m = malloc(total + 16);
            memcpy(m, both, total);
            int kind = (int)(rng() % 5);
            int nmut = 1 + (int)(rng() % 3);
            for (int k = 0; k < nmut; k++) {
                size_t at;
                /* Most mutations hit the header and the tokenizer, where
                 * the checks are; weights only ever get copied. */
                if (kind == 0) at = 8 + rng() % 28;
                else if (kind == 1) at = 8 + bn + rng() % tn;
                else at = rng() % n;
                uint64_t r = rng();
                if (r % 4 == 0) m[at] = (uint8_t)(r >> 8);
                else if (r % 4 == 1) m[at] ^= (uint8_t)(1u << ((r >> 8) % 8));
                else if (r % 4 == 2 && at + 4 <= n) put_i32(m + at, (int32_t)(r >> 16));
                else m[at] = (uint8_t)(m[at] + 1);
            }
            if (kind == 3) n = rng() % (total + 1); /* truncate too */
            if (kind == 4 && rng() % 2) { /* extend */
                for (int k = 0; k < 8; k++) m[n + k] = (uint8_t)rng();
                n += 1 + rng() % 8;
            }
            uint8_t *exact = malloc(n ? n : 1);
            memcpy(exact, m, n);
            /* With and without the explicit split. */
            int r1 = dhsa_llama2c_fuzz_one(exact, n);
            int r2 = n > 8 ? dhsa_llama2c_fuzz_one(exact + 8, n - 8) : 0;
            if (r1 || r2) {
                if (broken < 3) fprintf(stderr, "  mutation %d of shape %d broke a contract\n", it, s);
                broken++;
            }
            dhsa_gguf *g = NULL;
            if (n >= 8 && dhsa_llama2c_open_memory(exact + 8, bn < n - 8 ? bn : n - 8, exact + 8 + bn,
                                                   n > 8 + bn ? n - 8 - bn : 0, NULL, &g) == DHSA_OK)
                opened++;
            dhsa_gguf_close(g);
            runs++;
            free(exact);
            free(m);
        }
        free(both);
        free(bin);
        free(tok);
    }
    T_CHECK(broken == 0, "%d random mutations: %d broke a contract", runs, broken);
    T_CHECK(opened > 0 && opened < runs, "mutations both open (%d, weights changed) and fail", opened);

    /* Regression inputs from `make fuzz` (none so far: the harness found no
     * crasher in its runs; see docs/llama2c.md). */
}

/* --------------------------------------------------------------------- */
/* CLI                                                                    */

/* Runs a shell command line; returns its exit status and the captured
 * stdout+stderr in out (NUL-terminated). */
static int run_cmd(const char *cmd, char *out, size_t cap) {
    char full[2048], path[128];
    snprintf(path, sizeof path, "%s/cli_out.txt", tmpdir);
    snprintf(full, sizeof full, "%s > %s 2>&1", cmd, path);
    int rc = system(full);
    size_t n = 0;
    uint8_t *p = read_all(path, &n);
    if (n >= cap) n = cap - 1;
    if (p) memcpy(out, p, n);
    out[p ? n : 0] = 0;
    free(p);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static void test_cli(void) {
    const char *cli = getenv("DHSA_CLI");
    if (!cli || access(cli, X_OK) != 0) {
        T_SKIP(17, "DHSA_CLI unset or not executable (tests/run.sh sets it): CLI checks skipped");
        return;
    }
    static char out[1 << 16];
    char cmd[1024], pb[128], pt[128], po[128];
    snprintf(pb, sizeof pb, "%s/tiny.bin", tmpdir); /* written by test_files */
    snprintf(pt, sizeof pt, "%s/tok5.bin", tmpdir);
    snprintf(po, sizeof po, "%s/cli.gguf", tmpdir);

    snprintf(cmd, sizeof cmd, "%s convert %s --tokenizer %s -o %s", cli, pb, pt, po);
    int rc = run_cmd(cmd, out, sizeof out);
    T_CHECK(rc == 0 && contains(out, "wrote ") && contains(out, po) && contains(out, "separate (output.weight)"),
            "convert: rc %d: %s", rc, out);
    dhsa_gguf *g = NULL;
    T_CHECK(dhsa_gguf_open(po, &g) == DHSA_OK, "the CLI's file opens: %s", dhsa_last_error());
    dhsa_gguf_close(g);

    snprintf(cmd, sizeof cmd, "%s inspect %s", cli, po);
    rc = run_cmd(cmd, out, sizeof out);
    T_CHECK(rc == 0 && contains(out, "GGUF v3") && contains(out, "alignment 32") &&
                contains(out, "llama.context_length") && contains(out, "[STRING x 5] \"<unk>\", \"<s>\"") &&
                contains(out, "blk.1.ffn_down.weight") && contains(out, "[12, 8]") && contains(out, "total: 21 tensors"),
            "inspect GGUF: rc %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s inspect %s --tokenizer %s --elements 2", cli, pb, pt);
    rc = run_cmd(cmd, out, sizeof out);
    T_CHECK(rc == 0 && contains(out, "llama2.c checkpoint") && contains(out, "converted in memory") &&
                contains(out, "\"<unk>\", \"<s>\", ... (3 more)"),
            "inspect llama2.c + tokenizer: rc %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s inspect %s", cli, pb);
    rc = run_cmd(cmd, out, sizeof out);
    T_CHECK(rc == 0 && contains(out, "vocab_size -5") && contains(out, "--tokenizer"),
            "inspect llama2.c alone: rc %d: %s", rc, out);

    /* Errors. */
    snprintf(cmd, sizeof cmd, "%s convert %s --tokenizer %s", cli, pb, pt);
    rc = run_cmd(cmd, out, sizeof out);
    T_CHECK(rc == 2 && contains(out, "-o OUT.gguf is required"), "convert without -o: rc %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s convert %s -o %s", cli, pb, po);
    rc = run_cmd(cmd, out, sizeof out);
    T_CHECK(rc == 2 && contains(out, "--tokenizer is required"), "convert without --tokenizer: rc %d", rc);
    snprintf(cmd, sizeof cmd, "%s convert %s --tokenizer %s -o %s --bogus", cli, pb, pt, po);
    rc = run_cmd(cmd, out, sizeof out);
    T_CHECK(rc == 2 && contains(out, "unknown option"), "convert --bogus: rc %d", rc);
    snprintf(cmd, sizeof cmd, "%s convert %s --tokenizer %s -o %s", cli, pt, pt, po);
    rc = run_cmd(cmd, out, sizeof out);
    T_CHECK(rc == 1 && contains(out, "DHSA_ERR_FORMAT") && contains(out, "llama2.c checkpoint"),
            "convert a bad checkpoint: rc %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s inspect %s", cli, pt);
    rc = run_cmd(cmd, out, sizeof out);
    T_CHECK(rc == 1 && contains(out, "not a GGUF file"), "inspect a tokenizer file: rc %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s inspect %s/missing.gguf", cli, tmpdir);
    rc = run_cmd(cmd, out, sizeof out);
    T_CHECK(rc == 1, "inspect a missing file: rc %d", rc);
    snprintf(cmd, sizeof cmd, "%s inspect", cli);
    rc = run_cmd(cmd, out, sizeof out);
    T_CHECK(rc == 2, "inspect without a file: rc %d", rc);
    snprintf(cmd, sizeof cmd, "%s inspect %s --elements x", cli, po);
    rc = run_cmd(cmd, out, sizeof out);
    T_CHECK(rc == 2 && contains(out, "--elements"), "inspect --elements x: rc %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s help convert", cli);
    rc = run_cmd(cmd, out, sizeof out);
    T_CHECK(rc == 0 && contains(out, "usage: dhsa convert"), "help convert: rc %d", rc);
    snprintf(cmd, sizeof cmd, "%s help inspect", cli);
    rc = run_cmd(cmd, out, sizeof out);
    T_CHECK(rc == 0 && contains(out, "usage: dhsa inspect"), "help inspect: rc %d", rc);

    if (access(BIN, R_OK) == 0 && access(TOK, R_OK) == 0 && access(GGUF, R_OK) == 0) {
        snprintf(cmd, sizeof cmd, "%s inspect %s", cli, GGUF);
        rc = run_cmd(cmd, out, sizeof out);
        T_CHECK(rc == 0 && contains(out, "total: 48 tensors") && contains(out, "llama.context_length") &&
                    contains(out, "2048"),
                "inspect stories260K.gguf: rc %d", rc);
        snprintf(cmd, sizeof cmd, "%s convert %s --tokenizer %s -o %s", cli, BIN, TOK, po);
        rc = run_cmd(cmd, out, sizeof out);
        T_CHECK(rc == 0 && contains(out, "\"stories260K\"") && contains(out, "512 tokens"),
                "convert stories260K: rc %d: %s", rc, out);
    } else {
        T_SKIP(2, "../shared/models absent: CLI checks on stories260K skipped");
    }
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/dhsa_llama2c_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_shared_model();
    test_small_models();
    test_files();
    test_truncation();
    test_headers();
    test_tokenizer_corruption();
    test_mutations();
    test_cli();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return t_report("test_llama2c");
}
