/* test_gguf.c: tests of the GGUF reader and writer (src/model/gguf.c).
 *
 *   - the real model ../shared/models/stories260K.gguf: metadata as its
 *     README documents, every tensor's name, dims, type, size and
 *     alignment, and the bytes of two tensors compared with the same
 *     weights in the llama2.c file stories260K.bin (an independent reader:
 *     plain offsets computed here);
 *   - every vocabulary in ../shared/vocab (vocab-only files, no tensors);
 *   - the writer: its bytes equal a file encoded by hand here, and a round
 *     trip with every value type and tensors of every known type;
 *   - robustness: truncation at every length through the metadata (and a
 *     sample beyond), single-byte corruptions, 2^63 / 2^40 patched into
 *     counts, lengths, dims and offsets, unknown type ids, bad alignment,
 *     nested arrays, and a few thousand random mutations through
 *     dhsa_gguf_fuzz_one (exact-size copies, so ASan sees any over-read).
 *
 * ../shared is absent in a fresh clone: those parts are skipped, loudly.
 * Run: make build/tests/test_gguf && build/tests/test_gguf (from the repo
 * root), or under sanitizers:
 *   make BUILD=build-asan OPT=-O1 EXTRA_CFLAGS="-fsanitize=address,undefined \
 *     -fno-omit-frame-pointer" EXTRA_LDFLAGS="-fsanitize=address,undefined" \
 *     build-asan/tests/test_gguf && build-asan/tests/test_gguf
 */
#include "dhsa.h"
#include "model/gguf.h"
#include "t.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MODEL "../shared/models/stories260K.gguf"
#define MODEL_BIN "../shared/models/stories260K.bin"
#define VOCAB_DIR "../shared/vocab/"

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

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng(void) { /* xorshift64*: deterministic across runs */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}

static void put_le(uint8_t *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get_le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Opens an exact-size copy of buf[0..n) (so ASan catches a read past n). */
static dhsa_status open_copy(const uint8_t *buf, size_t n, dhsa_gguf **g, uint8_t **copy) {
    *copy = malloc(n ? n : 1);
    if (n) memcpy(*copy, buf, n);
    return dhsa_gguf_open_memory(*copy, n, g);
}

/* Expects buf to be refused with DHSA_ERR_FORMAT and a sentence. */
static int refused(const uint8_t *buf, size_t n) {
    dhsa_gguf *g;
    dhsa_status st = dhsa_gguf_open_memory(buf, n, &g);
    if (dhsa_gguf__last_open_alloc() > DHSA_GGUF_ALLOC_CAP(n)) {
        fprintf(stderr, "open of %zu bytes allocated %llu bytes\n", n, (unsigned long long)dhsa_gguf__last_open_alloc());
        dhsa_gguf_close(g);
        return 0;
    }
    if (st == DHSA_OK) {
        dhsa_gguf_close(g);
        return 0;
    }
    return st == DHSA_ERR_FORMAT && g == NULL && dhsa_last_error()[0] != 0;
}

/* A hand encoder, independent of the writer. */
typedef struct {
    uint8_t *p;
    size_t n, cap;
} hb;
static void hb_bytes(hb *b, const void *s, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}
static void hb_u32(hb *b, uint64_t v) { uint8_t x[4]; put_le(x, v, 4); hb_bytes(b, x, 4); }
static void hb_u64(hb *b, uint64_t v) { uint8_t x[8]; put_le(x, v, 8); hb_bytes(b, x, 8); }
static void hb_str(hb *b, const char *s) { hb_u64(b, strlen(s)); hb_bytes(b, s, strlen(s)); }
static void hb_pad(hb *b, size_t a) { while (b->n % a) hb_bytes(b, "", 1); }
static void hb_header(hb *b, uint64_t n_t, uint64_t n_kv) { hb_bytes(b, "GGUF", 4); hb_u32(b, 3); hb_u64(b, n_t); hb_u64(b, n_kv); }

/* Finds the first occurrence of a length-prefixed name in buf; returns the
 * offset of its length field, or -1. */
static long find_lp(const uint8_t *buf, size_t n, const char *name) {
    size_t len = strlen(name);
    for (size_t i = 8; i + len <= n; i++)
        if (memcmp(buf + i, name, len) == 0 && get_le(buf + i - 8, 8) == len) return (long)(i - 8);
    return -1;
}

/* --------------------------------------------------------------------- */
/* The real model                                                         */

static void check_str(const dhsa_gguf *g, const char *key, const char *want) {
    const char *s = NULL;
    dhsa_status st = dhsa_gguf_get_str(g, key, &s, NULL);
    T_CHECK(st == DHSA_OK && strcmp(s, want) == 0, "%s: want '%s', got %s (%s)", key, want, st ? "error" : s,
            dhsa_last_error());
}

static void check_u32(const dhsa_gguf *g, const char *key, uint32_t want) {
    uint32_t v = 0;
    dhsa_status st = dhsa_gguf_get_u32(g, key, &v);
    T_CHECK(st == DHSA_OK && v == want, "%s: want %u, got %u (%s)", key, want, v, st ? dhsa_last_error() : "ok");
}

static void test_stories(void) {
    if (access(MODEL, R_OK) != 0) {
        T_SKIP(45, "%s is absent: real-model GGUF checks skipped", MODEL);
        return;
    }
    dhsa_gguf *g;
    dhsa_status st = dhsa_gguf_open(MODEL, &g);
    T_CHECK(st == DHSA_OK, "open %s: %s", MODEL, dhsa_last_error());
    if (st) return;
    T_CHECK(dhsa_gguf_version(g) == 3, "version %u", dhsa_gguf_version(g));
    T_CHECK(dhsa_gguf_alignment(g) == 32, "alignment %llu", (unsigned long long)dhsa_gguf_alignment(g));
    T_CHECK(dhsa_gguf_n_kv(g) == 19, "n_kv %lld", (long long)dhsa_gguf_n_kv(g));
    check_str(g, "general.architecture", "llama");
    check_str(g, "tokenizer.ggml.model", "llama");
    check_u32(g, "llama.embedding_length", 64);
    check_u32(g, "llama.feed_forward_length", 172);
    check_u32(g, "llama.block_count", 5);
    check_u32(g, "llama.attention.head_count", 8);
    check_u32(g, "llama.attention.head_count_kv", 4);
    check_u32(g, "llama.rope.dimension_count", 8);
    check_u32(g, "llama.context_length", 2048);
    check_u32(g, "tokenizer.ggml.bos_token_id", 1);
    check_u32(g, "tokenizer.ggml.eos_token_id", 2);
    float eps = 0;
    T_CHECK(dhsa_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &eps) == DHSA_OK && fabsf(eps - 1e-5f) < 1e-9f,
            "rms eps %g", eps);
    int64_t i64 = 0;
    T_CHECK(dhsa_gguf_get_i64(g, "llama.block_count", &i64) == DHSA_OK && i64 == 5, "block_count as i64 %lld", (long long)i64);

    dhsa_gguf_array a;
    st = dhsa_gguf_get_arr(g, "tokenizer.ggml.tokens", &a);
    T_CHECK(st == DHSA_OK && a.type == DHSA_GGUF_STRING && a.n == 512, "tokens: %s n %lld", dhsa_last_error(), (long long)a.n);
    if (st == DHSA_OK && a.n == 512) {
        const dhsa_gguf_str *tok = a.data;
        T_CHECK(strcmp(tok[0].str, "<unk>") == 0 && strcmp(tok[1].str, "<s>") == 0 && strcmp(tok[2].str, "</s>") == 0,
                "first tokens '%s' '%s' '%s'", tok[0].str, tok[1].str, tok[2].str);
        int ok = 1;
        for (int i = 0; i < 512; i++) ok &= tok[i].len > 0 && (int64_t)strlen(tok[i].str) == tok[i].len;
        T_CHECK(ok, "every token is a non-empty string without NUL");
    }
    st = dhsa_gguf_get_arr(g, "tokenizer.ggml.scores", &a);
    T_CHECK(st == DHSA_OK && a.type == DHSA_GGUF_FLOAT32 && a.n == 512, "scores");
    st = dhsa_gguf_get_arr(g, "tokenizer.ggml.token_type", &a);
    T_CHECK(st == DHSA_OK && a.type == DHSA_GGUF_INT32 && a.n == 512, "token_type");
    if (st == DHSA_OK && a.n == 512) {
        const int32_t *tt = a.data;
        T_CHECK(tt[0] == 2 && tt[1] == 3 && tt[2] == 3, "token types of <unk> <s> </s>: %d %d %d", tt[0], tt[1], tt[2]);
    }

    /* Type checks and absent keys: an error with a sentence naming the key. */
    const char *s;
    st = dhsa_gguf_get_str(g, "llama.embedding_length", &s, NULL);
    T_CHECK(st == DHSA_ERR_FORMAT && strstr(dhsa_last_error(), "llama.embedding_length"), "str of a u32: %s", dhsa_last_error());
    uint32_t u32;
    st = dhsa_gguf_get_u32(g, "general.architecture", &u32);
    T_CHECK(st == DHSA_ERR_FORMAT && strstr(dhsa_last_error(), "STRING"), "u32 of a string: %s", dhsa_last_error());
    st = dhsa_gguf_get_u32(g, "no.such.key", &u32);
    T_CHECK(st == DHSA_ERR_FORMAT && strstr(dhsa_last_error(), "no.such.key"), "absent key: %s", dhsa_last_error());
    float f;
    T_CHECK(dhsa_gguf_get_f32(g, "llama.block_count", &f) == DHSA_ERR_FORMAT, "f32 of a u32 refused");
    T_CHECK(dhsa_gguf_get_arr(g, "general.name", &a) == DHSA_ERR_FORMAT, "arr of a string refused");
    int b;
    T_CHECK(dhsa_gguf_get_bool(g, "llama.block_count", &b) == DHSA_ERR_FORMAT, "bool of a u32 refused");
    /* 0xFFFFFFFF fits u32 and i64, is listed, and is refused nowhere. */
    T_CHECK(dhsa_gguf_get_i64(g, "tokenizer.ggml.padding_token_id", &i64) == DHSA_OK && i64 == 4294967295LL, "padding id");
    /* Unknown keys are kept and listed in file order. */
    const dhsa_gguf_kv *kv0 = dhsa_gguf_kv_at(g, 0);
    T_CHECK(kv0 && strcmp(kv0->key, "tokenizer.ggml.tokens") == 0 && kv0->offset == 24, "kv 0 is the tokens at byte 24");
    T_CHECK(dhsa_gguf_find_kv(g, "tokenizer.ggml.seperator_token_id") >= 0, "an odd key is kept");
    T_CHECK(dhsa_gguf_kv_at(g, 19) == NULL && dhsa_gguf_kv_at(g, -1) == NULL, "kv_at out of range");

    /* Tensors: 3 global + 9 per layer. */
    T_CHECK(dhsa_gguf_n_tensors(g) == 3 + 5 * 9, "n_tensors %lld", (long long)dhsa_gguf_n_tensors(g));
    uint64_t ds = dhsa_gguf_data_offset(g), fs = dhsa_gguf_file_size(g);
    T_CHECK(ds % 32 == 0 && ds <= fs && fs == 1185376, "data section at %llu, file %llu", (unsigned long long)ds, (unsigned long long)fs);
    int all_ok = 1;
    int64_t total = 0;
    for (int64_t i = 0; i < dhsa_gguf_n_tensors(g); i++) {
        const dhsa_gguf_tensor *t = dhsa_gguf_tensor_at(g, i);
        int ok = t->type == DHSA_GGML_F32 && t->bytes == t->n_elements * 4 && t->offset % 32 == 0 &&
                 ds + t->offset + (uint64_t)t->bytes <= fs && ((uintptr_t)t->data % 32) == 0 &&
                 dhsa_gguf_find_tensor(g, t->name) == i;
        if (!ok) fprintf(stderr, "tensor %lld '%s' type %u bytes %lld offset %llu\n", (long long)i, t->name, t->type,
                         (long long)t->bytes, (unsigned long long)t->offset);
        all_ok &= ok;
        total += t->bytes;
    }
    T_CHECK(all_ok, "every tensor F32, aligned, inside the file, findable");
    T_CHECK((uint64_t)total <= fs - ds, "tensor bytes %lld fit the data section", (long long)total);
    struct { const char *name; int nd; int64_t d0, d1; } want[] = {
        {"token_embd.weight", 2, 64, 512}, {"output_norm.weight", 1, 64, 1}, {"output.weight", 2, 64, 512},
        {"blk.%d.attn_q.weight", 2, 64, 64}, {"blk.%d.attn_k.weight", 2, 64, 32}, {"blk.%d.attn_v.weight", 2, 64, 32},
        {"blk.%d.attn_output.weight", 2, 64, 64}, {"blk.%d.attn_norm.weight", 1, 64, 1},
        {"blk.%d.ffn_gate.weight", 2, 64, 172}, {"blk.%d.ffn_down.weight", 2, 172, 64},
        {"blk.%d.ffn_up.weight", 2, 64, 172}, {"blk.%d.ffn_norm.weight", 1, 64, 1},
    };
    int found = 0, shapes = 0;
    for (size_t w = 0; w < sizeof want / sizeof want[0]; w++) {
        for (int l = 0; l < (strchr(want[w].name, '%') ? 5 : 1); l++) {
            char name[64];
            snprintf(name, sizeof name, want[w].name, l);
            const dhsa_gguf_tensor *t = dhsa_gguf_tensor_at(g, dhsa_gguf_find_tensor(g, name));
            found += t != NULL;
            shapes += t && t->n_dims == want[w].nd && t->dims[0] == want[w].d0 && t->dims[1] == want[w].d1;
            if (t && !(t->n_dims == want[w].nd && t->dims[0] == want[w].d0 && t->dims[1] == want[w].d1))
                fprintf(stderr, "%s: dims %d [%lld, %lld]\n", name, t->n_dims, (long long)t->dims[0], (long long)t->dims[1]);
        }
    }
    T_CHECK(found == 48 && shapes == 48, "named tensors found %d, right dims %d (of 48)", found, shapes);
    T_CHECK(dhsa_gguf_find_tensor(g, "nope") == -1, "absent tensor");

    /* The same numbers as the llama2.c checkpoint: token embedding
     * (vocab 512 x dim 64) right after the 28-byte header, then the
     * attention RMSNorm weights (layers x dim). */
    size_t bn;
    uint8_t *bin = read_all(MODEL_BIN, &bn);
    if (!bin) {
        T_SKIP(1, "%s is absent: cross-check with the llama2.c file skipped", MODEL_BIN);
    } else {
        const dhsa_gguf_tensor *te = dhsa_gguf_tensor_at(g, dhsa_gguf_find_tensor(g, "token_embd.weight"));
        const dhsa_gguf_tensor *an = dhsa_gguf_tensor_at(g, dhsa_gguf_find_tensor(g, "blk.1.attn_norm.weight"));
        size_t emb = 512 * 64 * 4;
        T_CHECK(bn >= 28 + emb + 5 * 64 * 4 && te && an && memcmp(te->data, bin + 28, emb) == 0 &&
                    memcmp(an->data, bin + 28 + emb + 64 * 4, 64 * 4) == 0,
                "token_embd and blk.1.attn_norm equal the llama2.c file's bytes");
        free(bin);
    }

    /* open_memory over the same bytes gives the same view. */
    size_t n;
    uint8_t *buf = read_all(MODEL, &n);
    dhsa_gguf *g2;
    st = buf ? dhsa_gguf_open_memory(buf, n, &g2) : DHSA_ERR_IO;
    T_CHECK(st == DHSA_OK, "open_memory: %s", dhsa_last_error());
    T_CHECK(dhsa_gguf__last_open_alloc() <= DHSA_GGUF_ALLOC_CAP(n), "the reader allocated %llu bytes for a %zu-byte file",
            (unsigned long long)dhsa_gguf__last_open_alloc(), n);
    if (st == DHSA_OK) {
        int same = dhsa_gguf_n_tensors(g2) == dhsa_gguf_n_tensors(g) && dhsa_gguf_n_kv(g2) == dhsa_gguf_n_kv(g);
        for (int64_t i = 0; same && i < dhsa_gguf_n_tensors(g); i++) {
            const dhsa_gguf_tensor *x = dhsa_gguf_tensor_at(g, i), *y = dhsa_gguf_tensor_at(g2, i);
            same = strcmp(x->name, y->name) == 0 && x->bytes == y->bytes && memcmp(x->data, y->data, (size_t)x->bytes) == 0 &&
                   (const uint8_t *)y->data == buf + ds + y->offset;
        }
        T_CHECK(same, "mmap and memory views agree");
        dhsa_gguf_close(g2);
    }
    free(buf);
    dhsa_gguf_close(g);

    st = dhsa_gguf_open("../shared/models/no-such-file.gguf", &g);
    T_CHECK(st == DHSA_ERR_IO && g == NULL && strstr(dhsa_last_error(), "no-such-file"), "missing file: %s", dhsa_last_error());
    if (access(MODEL_BIN, R_OK) == 0) {
        st = dhsa_gguf_open(MODEL_BIN, &g);
        T_CHECK(st == DHSA_ERR_FORMAT && strstr(dhsa_last_error(), "magic"), "a llama2.c file is not GGUF: %s",
                dhsa_last_error());
    } else {
        T_SKIP(1, "%s is absent: no check that a llama2.c file is not GGUF", MODEL_BIN);
    }
}

/* --------------------------------------------------------------------- */
/* Vocabularies                                                           */

static void test_vocab(void) {
    static const struct { const char *name, *model, *pre; int64_t n; } v[] = {
        {"ggml-vocab-llama-spm.gguf", "llama", "default", 32000},
        {"ggml-vocab-phi-3.gguf", "llama", "default", 32064},
        {"ggml-vocab-gpt-2.gguf", "gpt2", "gpt-2", 50257},
        {"ggml-vocab-starcoder.gguf", "gpt2", "starcoder", 49152},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        char path[256];
        snprintf(path, sizeof path, "%s%s", VOCAB_DIR, v[i].name);
        if (access(path, R_OK) != 0) {
            /* 9 checks for llama-spm (it also has llama.vocab_size), 8 for the others */
            T_SKIP(i == 0 ? 9 : 8, "%s is absent: vocabulary check skipped", path);
            continue;
        }
        dhsa_gguf *g;
        dhsa_status st = dhsa_gguf_open(path, &g);
        T_CHECK(st == DHSA_OK, "open %s: %s", path, dhsa_last_error());
        if (st) continue;
        check_str(g, "tokenizer.ggml.model", v[i].model);
        check_str(g, "tokenizer.ggml.pre", v[i].pre);
        T_CHECK(dhsa_gguf_n_tensors(g) == 0, "%s: vocab-only file has no tensors", v[i].name);
        dhsa_gguf_array tok = {0}, other;
        st = dhsa_gguf_get_arr(g, "tokenizer.ggml.tokens", &tok);
        T_CHECK(st == DHSA_OK && tok.type == DHSA_GGUF_STRING && tok.n == v[i].n, "%s: %lld tokens", v[i].name, (long long)tok.n);
        T_CHECK(dhsa_gguf_get_arr(g, "tokenizer.ggml.token_type", &other) == DHSA_OK && other.n == tok.n,
                "%s: token_type length matches", v[i].name);
        if (dhsa_gguf_find_kv(g, "tokenizer.ggml.scores") >= 0)
            T_CHECK(dhsa_gguf_get_arr(g, "tokenizer.ggml.scores", &other) == DHSA_OK && other.n == tok.n &&
                        other.type == DHSA_GGUF_FLOAT32,
                    "%s: scores length matches", v[i].name);
        if (dhsa_gguf_find_kv(g, "tokenizer.ggml.merges") >= 0)
            T_CHECK(dhsa_gguf_get_arr(g, "tokenizer.ggml.merges", &other) == DHSA_OK && other.type == DHSA_GGUF_STRING && other.n > 0,
                    "%s: merges are strings", v[i].name);
        const char *arch;
        if (dhsa_gguf_get_str(g, "general.architecture", &arch, NULL) == DHSA_OK) {
            char key[128];
            snprintf(key, sizeof key, "%s.vocab_size", arch);
            uint32_t vs;
            if (dhsa_gguf_find_kv(g, key) >= 0)
                T_CHECK(dhsa_gguf_get_u32(g, key, &vs) == DHSA_OK && vs == tok.n, "%s: %s %u vs %lld tokens", v[i].name, key, vs, (long long)tok.n);
        }
        uint32_t bos = 0, eos = 0;
        T_CHECK(dhsa_gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &bos) == DHSA_OK && bos < tok.n &&
                    dhsa_gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &eos) == DHSA_OK && eos < tok.n,
                "%s: bos %u eos %u inside the vocabulary", v[i].name, bos, eos);
        dhsa_gguf_close(g);
    }
}

/* --------------------------------------------------------------------- */
/* Writer                                                                 */

/* The writer's bytes for a tiny file equal a file encoded by hand. */
static void test_writer_bytes(void) {
    float w[3] = {1.0f, -2.0f, 0.5f};
    dhsa_gguf_writer *wr;
    dhsa_gguf_writer_create(&wr);
    dhsa_gguf_writer_set_str(wr, "general.architecture", "llama");
    dhsa_gguf_writer_set_u32(wr, "x.count", 7);
    int64_t dims[1] = {3};
    dhsa_status st = dhsa_gguf_writer_add_tensor(wr, "w", DHSA_GGML_F32, 1, dims, w, 12);
    T_CHECK(st == DHSA_OK, "add_tensor: %s", dhsa_last_error());
    size_t n = 0;
    dhsa_gguf_writer_size(wr, &n);
    uint8_t *out = malloc(n);
    T_CHECK(dhsa_gguf_writer_write_memory(wr, out, n) == DHSA_OK, "write_memory");
    T_CHECK(dhsa_gguf_writer_write_memory(wr, out, n - 1) == DHSA_ERR_INVALID_ARG, "a short buffer is refused");

    hb b = {0};
    hb_header(&b, 1, 2);
    hb_str(&b, "general.architecture"); hb_u32(&b, DHSA_GGUF_STRING); hb_str(&b, "llama");
    hb_str(&b, "x.count"); hb_u32(&b, DHSA_GGUF_UINT32); hb_u32(&b, 7);
    hb_str(&b, "w"); hb_u32(&b, 1); hb_u64(&b, 3); hb_u32(&b, 0); hb_u64(&b, 0);
    hb_pad(&b, 32);
    hb_bytes(&b, w, 12); /* little-endian host assumed by this test */
    hb_pad(&b, 32);
    T_CHECK(n == b.n && memcmp(out, b.p, n) == 0, "writer bytes equal the hand encoding (%zu vs %zu bytes)", n, b.n);
    free(b.p);
    free(out);

    /* Writer refusals. */
    T_CHECK(dhsa_gguf_writer_set_u32(wr, "x.count", 8) == DHSA_ERR_INVALID_ARG, "duplicate key refused");
    T_CHECK(dhsa_gguf_writer_add_tensor(wr, "w", DHSA_GGML_F32, 1, dims, w, 12) == DHSA_ERR_INVALID_ARG, "duplicate tensor refused");
    T_CHECK(dhsa_gguf_writer_add_tensor(wr, "w2", DHSA_GGML_F32, 1, dims, w, 8) == DHSA_ERR_SHAPE, "wrong byte count refused");
    T_CHECK(dhsa_gguf_writer_add_tensor(wr, "q", DHSA_GGML_Q8_0, 1, dims, w, 34) == DHSA_ERR_SHAPE, "row not a block multiple refused");
    T_CHECK(dhsa_gguf_writer_add_tensor(wr, "u", 16, 1, dims, w, 12) == DHSA_ERR_UNSUPPORTED, "unknown-size type refused");
    T_CHECK(dhsa_gguf_writer_set_u32(wr, "general.alignment", 3) == DHSA_ERR_INVALID_ARG, "alignment 3 refused");
    T_CHECK(dhsa_gguf_writer_set_u64(wr, "general.alignment", 32) == DHSA_ERR_INVALID_ARG, "alignment as u64 refused");
    T_CHECK(dhsa_gguf_writer_set_u8(wr, "", 1) == DHSA_ERR_INVALID_ARG, "empty key refused");
    T_CHECK(dhsa_gguf_writer_set_arr(wr, "a", DHSA_GGUF_STRING, w, 1) == DHSA_ERR_INVALID_ARG, "set_arr of strings refused");
    T_CHECK(dhsa_gguf_writer_write_file(wr, "/nonexistent-dir/x.gguf") == DHSA_ERR_IO && dhsa_last_error()[0], "unwritable path");
    dhsa_gguf_writer_free(wr);
}

/* Fills a writer with every value type and tensors of every known type.
 * Returns the buffers the tensors borrow (free after writing). */
static uint8_t *fill_writer(dhsa_gguf_writer *w, int small) {
    dhsa_gguf_writer_set_str(w, "general.architecture", "llama");
    dhsa_gguf_writer_set_u32(w, "general.alignment", 32);
    dhsa_gguf_writer_set_u8(w, "t.u8", 200);
    dhsa_gguf_writer_set_i8(w, "t.i8", -100);
    dhsa_gguf_writer_set_u16(w, "t.u16", 60000);
    dhsa_gguf_writer_set_i16(w, "t.i16", -30000);
    dhsa_gguf_writer_set_u32(w, "t.u32", 4000000000u);
    dhsa_gguf_writer_set_i32(w, "t.i32", -2000000000);
    dhsa_gguf_writer_set_f32(w, "t.f32", 3.5f);
    dhsa_gguf_writer_set_bool(w, "t.bool", 1);
    dhsa_gguf_writer_set_u64(w, "t.u64", ((uint64_t)1 << 63) + 5);
    dhsa_gguf_writer_set_i64(w, "t.i64", -((int64_t)1 << 62));
    dhsa_gguf_writer_set_f64(w, "t.f64", 3.141592653589793);
    dhsa_gguf_writer_set_strn(w, "t.strn", "a\0b", 3);
    const char *strs[] = {"<unk>", "", "héllo", "▁the"};
    dhsa_gguf_writer_set_arr_str(w, "t.arr.str", strs, 4);
    if (!small) {
        uint8_t u8[3] = {1, 2, 255};
        int8_t i8[3] = {-1, 0, 127};
        uint16_t u16[2] = {65535, 3};
        int16_t i16[2] = {-32768, 5};
        uint32_t u32[2] = {0xdeadbeef, 1};
        int32_t i32[3] = {-7, 0, 2147483647};
        float f32[4] = {0.25f, -1e30f, 1e-30f, 0.0f};
        uint8_t bl[3] = {1, 0, 1};
        uint64_t u64[2] = {UINT64_MAX, 0};
        int64_t i64[2] = {INT64_MIN, INT64_MAX};
        double f64[2] = {-0.5, 1e300};
        dhsa_gguf_writer_set_arr(w, "t.arr.u8", DHSA_GGUF_UINT8, u8, 3);
        dhsa_gguf_writer_set_arr(w, "t.arr.i8", DHSA_GGUF_INT8, i8, 3);
        dhsa_gguf_writer_set_arr(w, "t.arr.u16", DHSA_GGUF_UINT16, u16, 2);
        dhsa_gguf_writer_set_arr(w, "t.arr.i16", DHSA_GGUF_INT16, i16, 2);
        dhsa_gguf_writer_set_arr(w, "t.arr.u32", DHSA_GGUF_UINT32, u32, 2);
        dhsa_gguf_writer_set_arr(w, "t.arr.i32", DHSA_GGUF_INT32, i32, 3);
        dhsa_gguf_writer_set_arr(w, "t.arr.f32", DHSA_GGUF_FLOAT32, f32, 4);
        dhsa_gguf_writer_set_arr(w, "t.arr.bool", DHSA_GGUF_BOOL, bl, 3);
        dhsa_gguf_writer_set_arr(w, "t.arr.u64", DHSA_GGUF_UINT64, u64, 2);
        dhsa_gguf_writer_set_arr(w, "t.arr.i64", DHSA_GGUF_INT64, i64, 2);
        dhsa_gguf_writer_set_arr(w, "t.arr.f64", DHSA_GGUF_FLOAT64, f64, 2);
        dhsa_gguf_writer_set_arr(w, "t.arr.empty", DHSA_GGUF_FLOAT32, NULL, 0);
    } else {
        float f32[3] = {1, 2, 3};
        dhsa_gguf_writer_set_arr(w, "t.arr.f32", DHSA_GGUF_FLOAT32, f32, 3);
    }
    /* Tensors: (type, dims) and the bytes each must take. */
    static const struct { const char *name; uint32_t type; int nd; int64_t d[4]; int64_t bytes; } ts[] = {
        {"f32", DHSA_GGML_F32, 2, {8, 3}, 96},         {"f16", DHSA_GGML_F16, 2, {32, 2}, 128},
        {"q8_0", DHSA_GGML_Q8_0, 2, {64, 3}, 204},     {"q4_0", DHSA_GGML_Q4_0, 1, {32}, 18},
        {"q4_k", DHSA_GGML_Q4_K, 2, {256, 2}, 288},    {"q6_k", DHSA_GGML_Q6_K, 1, {256}, 210},
        {"bf16", DHSA_GGML_BF16, 4, {5, 1, 2, 1}, 20}, {"empty", DHSA_GGML_F32, 2, {0, 4}, 0},
    };
    int nt = small ? 3 : (int)(sizeof ts / sizeof ts[0]);
    int64_t total = 0;
    for (int i = 0; i < nt; i++) total += ts[i].bytes;
    uint8_t *data = malloc((size_t)total);
    for (int64_t i = 0; i < total; i++) data[i] = (uint8_t)rng();
    int64_t off = 0;
    for (int i = 0; i < nt; i++) {
        int64_t bytes;
        T_CHECK(dhsa_ggml_tensor_bytes(ts[i].type, ts[i].nd, ts[i].d, &bytes) == DHSA_OK && bytes == ts[i].bytes,
                "%s takes %lld bytes, not %lld", ts[i].name, (long long)bytes, (long long)ts[i].bytes);
        dhsa_status st = dhsa_gguf_writer_add_tensor(w, ts[i].name, ts[i].type, ts[i].nd, ts[i].d, data + off, ts[i].bytes);
        T_CHECK(st == DHSA_OK, "add %s: %s", ts[i].name, dhsa_last_error());
        off += ts[i].bytes;
    }
    return data;
}

/* Every kv and tensor of a equals b's. */
static int same_contents(const dhsa_gguf *a, const dhsa_gguf *b) {
    if (dhsa_gguf_n_kv(a) != dhsa_gguf_n_kv(b) || dhsa_gguf_n_tensors(a) != dhsa_gguf_n_tensors(b)) return 0;
    for (int64_t i = 0; i < dhsa_gguf_n_kv(a); i++) {
        const dhsa_gguf_kv *x = dhsa_gguf_kv_at(a, i), *y = dhsa_gguf_kv_at(b, i);
        if (x->key_len != y->key_len || memcmp(x->key, y->key, (size_t)x->key_len) || x->type != y->type) return 0;
        if (x->u != y->u || x->i != y->i || memcmp(&x->f, &y->f, sizeof x->f)) return 0;
        if (x->type == DHSA_GGUF_STRING && (x->str.len != y->str.len || memcmp(x->str.str, y->str.str, (size_t)x->str.len))) return 0;
        if (x->type == DHSA_GGUF_ARRAY) {
            if (x->arr.type != y->arr.type || x->arr.n != y->arr.n) return 0;
            for (int64_t j = 0; j < x->arr.n; j++) {
                if (x->arr.type == DHSA_GGUF_STRING) {
                    const dhsa_gguf_str *s = x->arr.data, *t = y->arr.data;
                    if (s[j].len != t[j].len || memcmp(s[j].str, t[j].str, (size_t)s[j].len)) return 0;
                }
            }
        }
    }
    for (int64_t i = 0; i < dhsa_gguf_n_tensors(a); i++) {
        const dhsa_gguf_tensor *x = dhsa_gguf_tensor_at(a, i), *y = dhsa_gguf_tensor_at(b, i);
        if (strcmp(x->name, y->name) || x->type != y->type || x->n_dims != y->n_dims || x->bytes != y->bytes) return 0;
        for (int d = 0; d < 4; d++) if (x->dims[d] != y->dims[d]) return 0;
        if (x->bytes > 0 && memcmp(x->data, y->data, (size_t)x->bytes)) return 0;
    }
    return 1;
}

static void test_round_trip(void) {
    dhsa_gguf_writer *w;
    T_CHECK(dhsa_gguf_writer_create(&w) == DHSA_OK, "writer");
    uint8_t *data = fill_writer(w, 0);
    size_t n;
    dhsa_gguf_writer_size(w, &n);
    uint8_t *mem = malloc(n);
    T_CHECK(dhsa_gguf_writer_write_memory(w, mem, n) == DHSA_OK, "write_memory: %s", dhsa_last_error());
    char path[] = "/tmp/dhsa_test_gguf_XXXXXX";
    int fd = mkstemp(path);
    T_CHECK(fd >= 0, "mkstemp");
    if (fd >= 0) close(fd);
    dhsa_status st = dhsa_gguf_writer_write_file(w, path);
    T_CHECK(st == DHSA_OK, "write_file: %s", dhsa_last_error());
    size_t fn;
    uint8_t *fbytes = read_all(path, &fn);
    T_CHECK(fbytes && fn == n && memcmp(fbytes, mem, n) == 0, "file bytes equal memory bytes");
    free(fbytes);

    dhsa_gguf *g = NULL, *gm = NULL;
    st = dhsa_gguf_open(path, &g);
    T_CHECK(st == DHSA_OK, "read back: %s", dhsa_last_error());
    T_CHECK(dhsa_gguf_open_memory(mem, n, &gm) == DHSA_OK, "read back from memory: %s", dhsa_last_error());
    if (g && gm) {
        T_CHECK(same_contents(g, gm), "file and memory read the same");
        T_CHECK(dhsa_gguf_version(g) == 3 && dhsa_gguf_alignment(g) == 32 && dhsa_gguf_data_offset(g) % 32 == 0, "v3, aligned 32");
        uint8_t u8v; uint32_t u32v = 0; uint64_t u64v = 0; int64_t i64v = 0; float f = 0; int b = 0;
        const char *s; int64_t len;
        (void)u8v;
        T_CHECK(dhsa_gguf_get_u32(g, "t.u8", &u32v) == DHSA_OK && u32v == 200, "u8 %u", u32v);
        T_CHECK(dhsa_gguf_get_i64(g, "t.i8", &i64v) == DHSA_OK && i64v == -100, "i8 %lld", (long long)i64v);
        T_CHECK(dhsa_gguf_get_u32(g, "t.u16", &u32v) == DHSA_OK && u32v == 60000, "u16");
        T_CHECK(dhsa_gguf_get_i64(g, "t.i16", &i64v) == DHSA_OK && i64v == -30000, "i16");
        T_CHECK(dhsa_gguf_get_u32(g, "t.u32", &u32v) == DHSA_OK && u32v == 4000000000u, "u32");
        T_CHECK(dhsa_gguf_get_i64(g, "t.i32", &i64v) == DHSA_OK && i64v == -2000000000, "i32");
        T_CHECK(dhsa_gguf_get_u32(g, "t.i32", &u32v) == DHSA_ERR_FORMAT && strstr(dhsa_last_error(), "out of range"),
                "negative value refused as u32: %s", dhsa_last_error());
        T_CHECK(dhsa_gguf_get_f32(g, "t.f32", &f) == DHSA_OK && f == 3.5f, "f32");
        T_CHECK(dhsa_gguf_get_bool(g, "t.bool", &b) == DHSA_OK && b == 1, "bool");
        T_CHECK(dhsa_gguf_get_u64(g, "t.u64", &u64v) == DHSA_OK && u64v == ((uint64_t)1 << 63) + 5, "u64");
        T_CHECK(dhsa_gguf_get_i64(g, "t.u64", &i64v) == DHSA_ERR_FORMAT, "u64 over INT64_MAX refused as i64");
        T_CHECK(dhsa_gguf_get_i64(g, "t.i64", &i64v) == DHSA_OK && i64v == -((int64_t)1 << 62), "i64");
        const dhsa_gguf_kv *kv = dhsa_gguf_kv_at(g, dhsa_gguf_find_kv(g, "t.f64"));
        T_CHECK(kv && kv->type == DHSA_GGUF_FLOAT64 && kv->f == 3.141592653589793, "f64");
        T_CHECK(dhsa_gguf_get_str(g, "t.strn", &s, &len) == DHSA_OK && len == 3 && memcmp(s, "a\0b", 4) == 0, "string with a NUL");
        dhsa_gguf_array a;
        T_CHECK(dhsa_gguf_get_arr(g, "t.arr.str", &a) == DHSA_OK && a.type == DHSA_GGUF_STRING && a.n == 4 &&
                    strcmp(((const dhsa_gguf_str *)a.data)[2].str, "héllo") == 0 && ((const dhsa_gguf_str *)a.data)[1].len == 0,
                "string array");
        T_CHECK(dhsa_gguf_get_arr(g, "t.arr.i8", &a) == DHSA_OK && a.type == DHSA_GGUF_INT8 && a.n == 3 &&
                    ((const int8_t *)a.data)[0] == -1 && ((const int8_t *)a.data)[2] == 127, "i8 array");
        T_CHECK(dhsa_gguf_get_arr(g, "t.arr.i16", &a) == DHSA_OK && ((const int16_t *)a.data)[0] == -32768, "i16 array");
        T_CHECK(dhsa_gguf_get_arr(g, "t.arr.u32", &a) == DHSA_OK && ((const uint32_t *)a.data)[0] == 0xdeadbeef, "u32 array");
        T_CHECK(dhsa_gguf_get_arr(g, "t.arr.i32", &a) == DHSA_OK && ((const int32_t *)a.data)[2] == 2147483647, "i32 array");
        T_CHECK(dhsa_gguf_get_arr(g, "t.arr.f32", &a) == DHSA_OK && ((const float *)a.data)[1] == -1e30f &&
                    ((const float *)a.data)[2] == 1e-30f, "f32 array");
        T_CHECK(dhsa_gguf_get_arr(g, "t.arr.bool", &a) == DHSA_OK && a.type == DHSA_GGUF_BOOL && ((const uint8_t *)a.data)[1] == 0 &&
                    ((const uint8_t *)a.data)[2] == 1, "bool array");
        T_CHECK(dhsa_gguf_get_arr(g, "t.arr.u64", &a) == DHSA_OK && ((const uint64_t *)a.data)[0] == UINT64_MAX, "u64 array");
        T_CHECK(dhsa_gguf_get_arr(g, "t.arr.i64", &a) == DHSA_OK && ((const int64_t *)a.data)[0] == INT64_MIN &&
                    ((const int64_t *)a.data)[1] == INT64_MAX, "i64 array");
        T_CHECK(dhsa_gguf_get_arr(g, "t.arr.f64", &a) == DHSA_OK && ((const double *)a.data)[1] == 1e300, "f64 array");
        T_CHECK(dhsa_gguf_get_arr(g, "t.arr.u8", &a) == DHSA_OK && ((const uint8_t *)a.data)[2] == 255, "u8 array");
        T_CHECK(dhsa_gguf_get_arr(g, "t.arr.u16", &a) == DHSA_OK && ((const uint16_t *)a.data)[0] == 65535, "u16 array");
        T_CHECK(dhsa_gguf_get_arr(g, "t.arr.empty", &a) == DHSA_OK && a.n == 0, "empty array");
        /* Tensors: the bytes given to the writer, aligned. */
        int64_t off = 0;
        int ok = dhsa_gguf_n_tensors(g) == 8;
        for (int64_t i = 0; ok && i < dhsa_gguf_n_tensors(g); i++) {
            const dhsa_gguf_tensor *t = dhsa_gguf_tensor_at(g, i);
            ok = (t->bytes == 0 || memcmp(t->data, data + off, (size_t)t->bytes) == 0) && t->offset % 32 == 0 &&
                 ((uintptr_t)t->data % 32) == 0;
            off += t->bytes;
        }
        T_CHECK(ok, "tensor bytes survive the round trip");
        const dhsa_gguf_tensor *t = dhsa_gguf_tensor_at(g, dhsa_gguf_find_tensor(g, "bf16"));
        T_CHECK(t && t->n_dims == 4 && t->dims[0] == 5 && t->dims[2] == 2 && t->n_elements == 10 && t->type == DHSA_GGML_BF16, "bf16 dims");
        t = dhsa_gguf_tensor_at(g, dhsa_gguf_find_tensor(g, "q8_0"));
        T_CHECK(t && t->bytes == 204 && t->n_elements == 192, "q8_0 size");
    }
    dhsa_gguf_close(g);
    dhsa_gguf_close(gm);
    remove(path);
    free(mem);
    free(data);
    dhsa_gguf_writer_free(w);

    /* general.alignment 64 moves the data section and tensor offsets. */
    dhsa_gguf_writer_create(&w);
    dhsa_gguf_writer_set_u32(w, "general.alignment", 64);
    float x[3] = {1, 2, 3};
    int64_t d3[1] = {3};
    dhsa_gguf_writer_add_tensor(w, "a", DHSA_GGML_F32, 1, d3, x, 12);
    dhsa_gguf_writer_add_tensor(w, "b", DHSA_GGML_F32, 1, d3, x, 12);
    dhsa_gguf_writer_size(w, &n);
    mem = malloc(n);
    dhsa_gguf_writer_write_memory(w, mem, n);
    st = dhsa_gguf_open_memory(mem, n, &g);
    T_CHECK(st == DHSA_OK && dhsa_gguf_alignment(g) == 64 && dhsa_gguf_data_offset(g) % 64 == 0 &&
                dhsa_gguf_tensor_at(g, 1)->offset == 64,
            "alignment 64: %s", dhsa_last_error());
    dhsa_gguf_close(g);
    free(mem);
    dhsa_gguf_writer_free(w);
}

/* --------------------------------------------------------------------- */
/* Hand-made odd files                                                    */

static void test_hand_made(void) {
    /* A tensor of a type dhsa cannot size: kept, data refused on request. */
    hb b = {0};
    hb_header(&b, 2, 0);
    hb_str(&b, "odd"); hb_u32(&b, 1); hb_u64(&b, 32); hb_u32(&b, 16); hb_u64(&b, 0);
    hb_str(&b, "weird"); hb_u32(&b, 2); hb_u64(&b, 4); hb_u64(&b, 4); hb_u32(&b, 99); hb_u64(&b, 32);
    hb_pad(&b, 32);
    for (int i = 0; i < 64; i++) hb_bytes(&b, "\x01", 1);
    dhsa_gguf *g;
    dhsa_status st = dhsa_gguf_open_memory(b.p, b.n, &g);
    T_CHECK(st == DHSA_OK, "unknown tensor types are kept: %s", dhsa_last_error());
    if (st == DHSA_OK) {
        const dhsa_gguf_tensor *t = dhsa_gguf_tensor_at(g, 1);
        T_CHECK(t->bytes == -1 && t->data == NULL && t->type == 99 && t->n_elements == 16, "size unknown");
        const void *p;
        st = dhsa_gguf_tensor_data(g, 0, &p, NULL);
        T_CHECK(st == DHSA_ERR_UNSUPPORTED && strstr(dhsa_last_error(), "odd") && strstr(dhsa_last_error(), "IQ2_XXS"),
                "data of an IQ2_XXS tensor: %s", dhsa_last_error());
        st = dhsa_gguf_tensor_data(g, 1, &p, NULL);
        T_CHECK(st == DHSA_ERR_UNSUPPORTED && strstr(dhsa_last_error(), "99"), "data of type 99: %s", dhsa_last_error());
        dhsa_gguf_close(g);
    }
    free(b.p);

    /* An array of arrays (one level): listed, not kept. Two levels: refused. */
    memset(&b, 0, sizeof b);
    hb_header(&b, 0, 1);
    hb_str(&b, "nested"); hb_u32(&b, DHSA_GGUF_ARRAY); hb_u32(&b, DHSA_GGUF_ARRAY); hb_u64(&b, 2);
    hb_u32(&b, DHSA_GGUF_UINT16); hb_u64(&b, 2); hb_u32(&b, 0x00020001);
    hb_u32(&b, DHSA_GGUF_STRING); hb_u64(&b, 1); hb_str(&b, "x");
    st = dhsa_gguf_open_memory(b.p, b.n, &g);
    T_CHECK(st == DHSA_OK, "one level of nesting: %s", dhsa_last_error());
    if (st == DHSA_OK) {
        const dhsa_gguf_kv *kv = dhsa_gguf_kv_at(g, 0);
        T_CHECK(kv->type == DHSA_GGUF_ARRAY && kv->arr.type == DHSA_GGUF_ARRAY && kv->arr.n == 2 && kv->arr.data == NULL, "nested listed");
        dhsa_gguf_close(g);
    }
    uint8_t *copy = malloc(b.n);
    memcpy(copy, b.p, b.n);
    size_t inner = 24 + 8 + 6 + 4 + 4 + 8; /* header, key "nested", type, elem type, n */
    put_le(copy + inner, DHSA_GGUF_ARRAY, 4);
    T_CHECK(refused(copy, b.n) && strstr(dhsa_last_error(), "nested"), "two levels: %s", dhsa_last_error());
    free(copy);
    free(b.p);

    /* A BOOL that is not 0/1, general.alignment of the wrong type, a
     * duplicate key, a v1 file, a big-endian file, version 4. */
    memset(&b, 0, sizeof b);
    hb_header(&b, 0, 1);
    hb_str(&b, "flag"); hb_u32(&b, DHSA_GGUF_BOOL); hb_bytes(&b, "\x02", 1);
    T_CHECK(refused(b.p, b.n) && strstr(dhsa_last_error(), "BOOL"), "bool 2: %s", dhsa_last_error());
    free(b.p);
    memset(&b, 0, sizeof b);
    hb_header(&b, 0, 1);
    hb_str(&b, "general.alignment"); hb_u32(&b, DHSA_GGUF_UINT64); hb_u64(&b, 32);
    T_CHECK(refused(b.p, b.n) && strstr(dhsa_last_error(), "UINT32"), "alignment as u64: %s", dhsa_last_error());
    free(b.p);
    memset(&b, 0, sizeof b);
    hb_header(&b, 0, 2);
    hb_str(&b, "k"); hb_u32(&b, DHSA_GGUF_UINT8); hb_bytes(&b, "\x01", 1);
    hb_str(&b, "k"); hb_u32(&b, DHSA_GGUF_UINT8); hb_bytes(&b, "\x02", 1);
    T_CHECK(refused(b.p, b.n) && strstr(dhsa_last_error(), "twice"), "duplicate key: %s", dhsa_last_error());
    put_le(b.p + 4, 1, 4);
    T_CHECK(refused(b.p, b.n) && strstr(dhsa_last_error(), "version 1"), "v1: %s", dhsa_last_error());
    put_le(b.p + 4, 0x03000000u, 4);
    T_CHECK(refused(b.p, b.n) && strstr(dhsa_last_error(), "big-endian"), "big endian: %s", dhsa_last_error());
    put_le(b.p + 4, 4, 4);
    T_CHECK(refused(b.p, b.n) && strstr(dhsa_last_error(), "version 4"), "v4: %s", dhsa_last_error());
    put_le(b.p + 4, 2, 4);
    put_le(b.p + 16, 1, 8); /* v2 with one kv: accepted */
    st = dhsa_gguf_open_memory(b.p, b.n, &g);
    T_CHECK(st == DHSA_OK && dhsa_gguf_version(g) == 2, "v2 accepted: %s", dhsa_last_error());
    dhsa_gguf_close(g);
    free(b.p);
    /* The smallest kvs and tensor infos the format allows, by the
     * thousand: the reader's memory stays under its cap. */
    memset(&b, 0, sizeof b);
    hb_header(&b, 3000, 20000);
    for (int i = 0; i < 20000; i++) {
        char k[4] = {(char)('a' + i % 26), (char)('a' + i / 26 % 26), (char)('a' + i / 676 % 26), (char)('0' + i / 17576)};
        hb_u64(&b, 4); hb_bytes(&b, k, 4); hb_u32(&b, DHSA_GGUF_UINT8); hb_bytes(&b, "", 1);
    }
    for (int i = 0; i < 3000; i++) {
        char nm[3] = {(char)('a' + i % 26), (char)('a' + i / 26 % 26), (char)('a' + i / 676 % 26)};
        hb_u64(&b, 3); hb_bytes(&b, nm, 3); hb_u32(&b, 0); hb_u32(&b, 0); hb_u64(&b, 0);
    }
    hb_pad(&b, 32);
    hb_bytes(&b, "\0\0\0\0", 4);
    st = dhsa_gguf_open_memory(b.p, b.n, &g);
    T_CHECK(st == DHSA_OK && dhsa_gguf_n_kv(g) == 20000 && dhsa_gguf_n_tensors(g) == 3000 &&
                dhsa_gguf_tensor_at(g, 2999)->n_elements == 1 && dhsa_gguf_find_kv(g, "zzz0") == 17575,
            "20000 tiny kvs and 3000 scalar tensors: %s", dhsa_last_error());
    T_CHECK(dhsa_gguf__last_open_alloc() <= DHSA_GGUF_ALLOC_CAP(b.n), "tiny kvs: %llu bytes allocated for a %zu-byte file",
            (unsigned long long)dhsa_gguf__last_open_alloc(), b.n);
    fprintf(stderr, "  (tiny kvs: %.1f bytes allocated per file byte)\n", (double)dhsa_gguf__last_open_alloc() / (double)b.n);
    dhsa_gguf_close(g);
    free(b.p);

    T_CHECK(refused((const uint8_t *)"GGU", 3) && strstr(dhsa_last_error(), "magic"), "3 bytes: %s", dhsa_last_error());
    T_CHECK(refused((const uint8_t *)"", 0), "0 bytes");
    T_CHECK(refused((const uint8_t *)"GGML\3\0\0\0", 8) && strstr(dhsa_last_error(), "not a GGUF"), "bad magic: %s", dhsa_last_error());
}

/* --------------------------------------------------------------------- */
/* Robustness                                                             */

/* Patches v (n bytes) at off, expects a refusal, restores. */
static int patched_refused(uint8_t *buf, size_t size, size_t off, uint64_t v, int n) {
    uint8_t save[8];
    memcpy(save, buf + off, (size_t)n);
    put_le(buf + off, v, n);
    int r = refused(buf, size);
    memcpy(buf + off, save, (size_t)n);
    return r;
}

/* Truncations, corruptions, patched sizes and mutations of one valid file.
 * Tensor data ends at data_end; everything before is needed. */
static void robustness(const char *what, uint8_t *buf, size_t size, int n_mutations) {
    dhsa_gguf *g;
    dhsa_status st = dhsa_gguf_open_memory(buf, size, &g);
    T_CHECK(st == DHSA_OK, "%s opens: %s", what, dhsa_last_error());
    if (st) return;
    uint64_t ds = dhsa_gguf_data_offset(g), data_end = ds;
    for (int64_t i = 0; i < dhsa_gguf_n_tensors(g); i++) {
        const dhsa_gguf_tensor *t = dhsa_gguf_tensor_at(g, i);
        if (ds + t->offset + (uint64_t)t->bytes > data_end) data_end = ds + t->offset + (uint64_t)t->bytes;
    }

    /* Truncation at every length through the metadata, sampled beyond. */
    int trunc_bad = 0, tested = 0;
    for (size_t len = 0; len < data_end; len = len < ds + 64 ? len + 1 : len + 1 + rng() % (size / 97 + 1)) {
        uint8_t *c;
        dhsa_gguf *gt;
        st = open_copy(buf, len, &gt, &c);
        if (st == DHSA_OK || st != DHSA_ERR_FORMAT || !dhsa_last_error()[0]) {
            if (trunc_bad++ < 3) fprintf(stderr, "%s truncated to %zu: status %d\n", what, len, st);
            dhsa_gguf_close(gt);
        }
        free(c);
        tested++;
    }
    T_CHECK(trunc_bad == 0, "%s: %d of %d truncations not refused", what, trunc_bad, tested);
    if (size > 200) { /* one message, to show what a user reads */
        uint8_t *c;
        dhsa_gguf *gt;
        open_copy(buf, 100, &gt, &c);
        fprintf(stderr, "  (%s cut at 100 bytes: %s)\n", what, dhsa_last_error());
        free(c);
    }

    /* Single-byte corruptions: never a crash, an error has a sentence. */
    int broken = 0, refusals = 0, n_corrupt = 0;
    for (size_t pos = 0; pos < size; pos += pos < ds ? (size < 4096 ? 1 : 3) : 1 + rng() % (size / 50 + 1)) {
        uint8_t save = buf[pos];
        const uint8_t vals[3] = {0xFF, 0x00, (uint8_t)rng()};
        for (int k = 0; k < 3; k++) {
            buf[pos] = vals[k];
            broken += dhsa_gguf_fuzz_one(buf, size);
            dhsa_gguf *gc;
            if (dhsa_gguf_open_memory(buf, size, &gc) != DHSA_OK) refusals++;
            else dhsa_gguf_close(gc);
            n_corrupt++;
        }
        buf[pos] = save;
    }
    T_CHECK(broken == 0, "%s: %d of %d corruptions broke a contract", what, broken, n_corrupt);
    fprintf(stderr, "  (%s: %d of %d single-byte corruptions refused, the rest harmless)\n", what, refusals, n_corrupt);

    /* Huge values patched into every size field we can locate. */
    const uint64_t huge[] = {(uint64_t)1 << 63, (uint64_t)1 << 40, UINT64_MAX};
    int ok = 1;
    for (int h = 0; h < 3; h++) {
        ok &= patched_refused(buf, size, 8, huge[h], 8);  /* tensor count */
        ok &= patched_refused(buf, size, 16, huge[h], 8); /* kv count */
        ok &= patched_refused(buf, size, 24, huge[h], 8); /* first key's length */
    }
    T_CHECK(ok, "%s: huge header counts / key length refused: %s", what, dhsa_last_error());
    int n_str = 0, n_arr = 0, n_sarr = 0;
    ok = 1;
    for (int64_t i = 0; i < dhsa_gguf_n_kv(g); i++) {
        const dhsa_gguf_kv *kv = dhsa_gguf_kv_at(g, i);
        size_t type_at = (size_t)kv->offset + 8 + (size_t)kv->key_len, val = type_at + 4;
        ok &= patched_refused(buf, size, type_at, 13, 4);
        ok &= patched_refused(buf, size, type_at, 0xFFFFFFFFu, 4);
        if (!ok) { fprintf(stderr, "unknown type id in kv %lld not refused\n", (long long)i); break; }
        for (int h = 0; h < 3; h++) {
            if (kv->type == DHSA_GGUF_STRING) {
                ok &= patched_refused(buf, size, val, huge[h], 8);
                n_str += h == 0;
            }
            if (kv->type == DHSA_GGUF_ARRAY) {
                ok &= patched_refused(buf, size, val + 4, huge[h], 8);
                n_arr += h == 0;
                if (kv->arr.type == DHSA_GGUF_STRING && kv->arr.n > 0) {
                    ok &= patched_refused(buf, size, val + 12, huge[h], 8);
                    n_sarr += h == 0;
                }
            }
        }
        if (kv->type == DHSA_GGUF_ARRAY) ok &= patched_refused(buf, size, val, 13, 4);
        if (!ok) { fprintf(stderr, "huge length in kv %lld ('%s') not refused\n", (long long)i, kv->key); break; }
    }
    T_CHECK(ok && n_str > 0 && n_arr > 0 && n_sarr > 0,
            "%s: unknown type ids and huge string (%d) / array (%d) / string-element (%d) lengths refused", what, n_str,
            n_arr, n_sarr);

    ok = 1;
    int n_dim = 0;
    for (int64_t i = 0; i < dhsa_gguf_n_tensors(g); i++) {
        const dhsa_gguf_tensor *t = dhsa_gguf_tensor_at(g, i);
        long at = find_lp(buf, (size_t)ds, t->name);
        if (at < 0) { ok = 0; break; }
        size_t nd_at = (size_t)at + 8 + strlen(t->name), dims_at = nd_at + 4;
        size_t type_at = dims_at + 8 * (size_t)t->n_dims, off_at = type_at + 4;
        ok &= patched_refused(buf, size, nd_at, 5, 4);
        ok &= patched_refused(buf, size, nd_at, 0xFFFFFFFFu, 4);
        for (int h = 0; h < 3; h++) {
            ok &= patched_refused(buf, size, off_at, huge[h], 8);
            if (t->n_dims > 0 && t->n_elements > 0) ok &= patched_refused(buf, size, dims_at, huge[h], 8);
        }
        if (t->n_dims >= 2 && t->dims[1] >= 4) ok &= patched_refused(buf, size, dims_at, (uint64_t)1 << 62, 8);
        ok &= patched_refused(buf, size, off_at, size - ds + 32, 8); /* past the end */
        ok &= patched_refused(buf, size, off_at, t->offset + 1, 8);  /* misaligned */
        if (t->bytes > 0) ok &= patched_refused(buf, size, off_at, (size - ds) / 32 * 32, 8); /* starts in, ends out */
        n_dim++;
        if (!ok) { fprintf(stderr, "patched tensor '%s' not refused: %s\n", t->name, dhsa_last_error()); break; }
    }
    T_CHECK(ok && n_dim == dhsa_gguf_n_tensors(g), "%s: huge / past-the-end dims, n_dims and offsets refused (%d tensors)", what, n_dim);

    /* Bad alignment: 0, 3 and 5 as general.alignment. Where the file has
     * none, rename a UINT32 key of 17 bytes ("llama.block_count"). */
    int64_t ai = dhsa_gguf_find_kv(g, "general.alignment");
    if (ai < 0) {
        ai = dhsa_gguf_find_kv(g, "llama.block_count");
        if (ai >= 0) memcpy(buf + dhsa_gguf_kv_at(g, ai)->offset + 8, "general.alignment", 17);
    }
    if (ai >= 0) {
        const dhsa_gguf_kv *kv = dhsa_gguf_kv_at(g, ai);
        size_t val = (size_t)kv->offset + 8 + 17 + 4;
        T_CHECK(patched_refused(buf, size, val, 0, 4) && strstr(dhsa_last_error(), "power of two"), "%s: alignment 0: %s", what, dhsa_last_error());
        T_CHECK(patched_refused(buf, size, val, 3, 4), "%s: alignment 3", what);
        T_CHECK(patched_refused(buf, size, val, 5, 4), "%s: alignment 5", what);
        if (strcmp(kv->key, "llama.block_count") == 0) memcpy(buf + kv->offset + 8, "llama.block_count", 17);
    } else {
        T_SKIP(3, "%s: no key to patch into general.alignment", what);
    }
    dhsa_gguf_close(g);

    /* Mutations through the fuzz entry point: exact-size copies, 1..8 edits
     * (random byte, 0x00/0xFF, a huge u32/u64 at a random spot), sometimes a
     * cut. Edits land mostly in the metadata, where the parser looks. */
    broken = 0;
    int opened = 0;
    for (int m = 0; m < n_mutations; m++) {
        size_t len = size;
        if (rng() % 8 == 0) len = (size_t)(rng() % (size + 1));
        uint8_t *c = malloc(len ? len : 1);
        memcpy(c, buf, len);
        int edits = 1 + (int)(rng() % 8);
        for (int e = 0; e < edits && len > 0; e++) {
            size_t span = rng() % 4 ? (size_t)(ds < len ? ds : len) : len;
            size_t pos = (size_t)(rng() % span);
            switch (rng() % 5) {
            case 0: c[pos] = (uint8_t)rng(); break;
            case 1: c[pos] = 0; break;
            case 2: c[pos] = 0xFF; break;
            case 3: {
                uint64_t v = huge[rng() % 3];
                if (rng() % 2) v >>= 20;
                if (pos + 8 <= len) put_le(c + pos, v, 8);
                break;
            }
            default: if (pos + 4 <= len) put_le(c + pos, rng() % 2 ? 0xFFFFFFFFu : rng() % 40, 4); break;
            }
        }
        broken += dhsa_gguf_fuzz_one(c, len);
        dhsa_gguf *gm;
        if (dhsa_gguf_open_memory(c, len, &gm) == DHSA_OK) {
            opened++;
            dhsa_gguf_close(gm);
        }
        free(c);
    }
    T_CHECK(broken == 0, "%s: %d of %d mutations broke a contract", what, broken, n_mutations);
    fprintf(stderr, "  (%s: %d of %d mutations still opened)\n", what, opened, n_mutations);
    T_CHECK(dhsa_gguf_fuzz_one(buf, size) == 0, "%s: fuzz_one on the intact file", what);
}

static void test_robustness(void) {
    dhsa_gguf_writer *w;
    dhsa_gguf_writer_create(&w);
    uint8_t *data = fill_writer(w, 1);
    size_t n;
    dhsa_gguf_writer_size(w, &n);
    uint8_t *small = malloc(n);
    dhsa_gguf_writer_write_memory(w, small, n);
    dhsa_gguf_writer_free(w);
    free(data);
    robustness("writer file", small, n, 4000);
    free(small);

    if (access(MODEL, R_OK) != 0) {
        T_SKIP(11, "%s is absent: robustness on the real model skipped", MODEL);
    } else {
        uint8_t *buf = read_all(MODEL, &n);
        robustness("stories260K", buf, n, 600);
        free(buf);
    }
}

int main(void) {
    test_stories();
    test_vocab();
    test_writer_bytes();
    test_round_trip();
    test_hand_made();
    test_robustness();
    return t_report("test_gguf");
}
