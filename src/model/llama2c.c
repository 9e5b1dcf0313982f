/* llama2c.c: llama2.c checkpoints and tokenizer files, converted to GGUF.
 *
 * A llama2.c checkpoint (the legacy format karpathy/llama2.c's run.c reads)
 * is a 28-byte header of 7 little-endian int32
 *   dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
 * (vocab_size < 0: the classifier has its own weights at the end of the
 * file) followed by float32 weights in run.c's memory_map_weights order:
 *   token_embedding [vocab, dim], rms_att [L, dim], wq [L, dim, dim],
 *   wk [L, kv_dim, dim], wv [L, kv_dim, dim], wo [L, dim, dim],
 *   rms_ffn [L, dim], w1 [L, hidden, dim], w2 [L, dim, hidden],
 *   w3 [L, hidden, dim], rms_final [dim], the old RoPE tables
 *   freq_cis_real / freq_cis_imag [seq_len, head_size / 2] each (skipped),
 *   wcls [vocab, dim] (only when unshared),
 * row-major, rows of the input size (W (out, in) @ x (in,) -> (out,)), which
 * is GGUF's [n_in, n_out] byte for byte: no transposition, and no
 * permutation of Q/K rows either, because llama2.c rotates adjacent pairs
 * like GGUF llama's "normal" RoPE (tests/test_llama2c.c checks every byte
 * against a GGUF that llama.cpp's converter made).
 *
 * The tokenizer file is int32 max_token_length, then per token float score,
 * int32 length, the token's bytes (spaces as ' ', ids 1 and 2 as "\n<s>\n"
 * and "\n</s>\n"); the token count is the checkpoint's vocab_size.
 *
 * Contract: nothing in either file is trusted. The header's fields are
 * checked for their domain, the sizes they imply are computed with
 * overflow checks and must equal the file's size exactly, and the
 * tokenizer file is walked once, without allocating, before anything is
 * built; allocations are then bounded by the file sizes
 * (DHSA_LLAMA2C_ALLOC_CAP). A bad file gives DHSA_ERR_FORMAT (or
 * DHSA_ERR_TOO_LARGE above a limit) and one sentence naming the field or
 * the token and the byte offset. The GGUF written follows docs/model.md
 * and llama.cpp's convert-llama2c-to-ggml (token texts with U+2581 for
 * spaces, <unk>/<s>/</s>, token types); docs/llama2c.md lists it.
 *
 * Tests: tests/test_llama2c.c; fuzz: fuzz/llama2c_fuzz.c (make fuzz).
 */
#include "model/llama2c.h"
#include "core/internal.h"
#include "model/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define HEADER_BYTES 28
#define AK42_MAGIC 0x616b3432u /* llama2.c export.py version 1/2 files */
#define MIN_VOCAB 3           /* ids 0 <unk>, 1 <s>, 2 </s> are fixed in llama2.c */
#define BOS_ID 1
#define EOS_ID 2
#define UNK_ID 0

/* --------------------------------------------------------------------- */
/* Small helpers                                                          */

/* What the importer asked the allocator for (see llama2c.h). */
static _Thread_local uint64_t alloc_bytes;
uint64_t dhsa_llama2c__last_alloc(void) { return alloc_bytes; }

static void *counted_malloc(size_t n) {
    alloc_bytes += n;
    return malloc(n ? n : 1);
}

static uint32_t rd_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static int32_t rd_i32(const uint8_t *p) {
    uint32_t v = rd_u32(p);
    return v <= INT32_MAX ? (int32_t)v : (int32_t)((int64_t)v - 4294967296LL);
}
static float rd_f32(const uint8_t *p) {
    uint32_t v = rd_u32(p);
    float f;
    memcpy(&f, &v, sizeof f);
    return f;
}

/* Overflow-checked a*b and a+b; 0 on overflow. */
static int mul_ok(uint64_t a, uint64_t b, uint64_t *r) {
    if (a && b > UINT64_MAX / a) return 0;
    *r = a * b;
    return 1;
}
static int add_ok(uint64_t a, uint64_t b, uint64_t *r) {
    if (b > UINT64_MAX - a) return 0;
    *r = a + b;
    return 1;
}
/* *acc += a*b*c; 0 on overflow. */
static int acc3(uint64_t *acc, uint64_t a, uint64_t b, uint64_t c) {
    uint64_t ab, abc;
    return mul_ok(a, b, &ab) && mul_ok(ab, c, &abc) && add_ok(*acc, abc, acc);
}

/* --------------------------------------------------------------------- */
/* Checkpoint header                                                      */

/* Float counts of the checkpoint's regions after the header, in file
 * order (see the top of the file). */
typedef struct {
    uint64_t embed, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, rope, wcls;
    uint64_t total;  /* all of them */
    uint64_t params; /* total - rope */
} layout;

/* Fills l from the domain-checked config; 0 when a size overflows 64 bits
 * (in bytes, header included). */
static int layout_of(const dhsa_llama2c_config *c, layout *l) {
    uint64_t d = (uint64_t)c->dim, h = (uint64_t)c->hidden_dim, L = (uint64_t)c->n_layers;
    uint64_t V = (uint64_t)c->vocab_size, hs = (uint64_t)c->head_size;
    uint64_t kvd = (uint64_t)c->n_kv_heads * hs;
    memset(l, 0, sizeof *l);
    /* Each region at most 2^31^3 < 2^94: compute each with checks. */
    if (!acc3(&l->embed, V, d, 1) || !acc3(&l->rms_att, L, d, 1) || !acc3(&l->wq, L, d, d) ||
        !acc3(&l->wk, L, d, kvd) || !acc3(&l->wv, L, d, kvd) || !acc3(&l->wo, L, d, d) ||
        !acc3(&l->rms_ffn, L, d, 1) || !acc3(&l->w1, L, h, d) || !acc3(&l->w2, L, d, h) ||
        !acc3(&l->w3, L, h, d) || !acc3(&l->rms_final, d, 1, 1) || !acc3(&l->rope, (uint64_t)c->seq_len, hs, 1))
        return 0;
    if (!c->shared_classifier && !acc3(&l->wcls, V, d, 1)) return 0;
    const uint64_t parts[] = {l->embed, l->rms_att, l->wq, l->wk, l->wv, l->wo, l->rms_ffn,
                              l->w1, l->w2, l->w3, l->rms_final, l->rope, l->wcls};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        if (!add_ok(l->total, parts[i], &l->total)) return 0;
    uint64_t bytes;
    if (!mul_ok(l->total, 4, &bytes) || !add_ok(bytes, HEADER_BYTES, &bytes)) return 0;
    l->params = l->total - l->rope;
    return 1;
}

/* Checks the 7 fields' domains (not the file size) and fills c. */
static dhsa_status check_fields(const uint8_t *hdr, dhsa_llama2c_config *c) {
    static const char *const names[7] = {"dim",        "hidden_dim", "n_layers", "n_heads",
                                         "n_kv_heads", "vocab_size", "seq_len"};
    int32_t f[7];
    for (int i = 0; i < 7; i++) f[i] = rd_i32(hdr + 4 * i);
    for (int i = 0; i < 7; i++) {
        if (i == 5) continue;
        if (f[i] <= 0)
            return dhsa__fail(DHSA_ERR_FORMAT, "llama2.c checkpoint: %s is %d in the header (byte %d); it must be positive",
                              names[i], f[i], 4 * i);
    }
    if (f[5] == 0 || f[5] == INT32_MIN)
        return dhsa__fail(DHSA_ERR_FORMAT,
                          "llama2.c checkpoint: vocab_size is %d in the header (byte 20); it must be a nonzero "
                          "count (negative = a separate classifier)",
                          f[5]);
    memset(c, 0, sizeof *c);
    c->dim = f[0];
    c->hidden_dim = f[1];
    c->n_layers = f[2];
    c->n_heads = f[3];
    c->n_kv_heads = f[4];
    c->vocab_size = f[5] < 0 ? -f[5] : f[5];
    c->shared_classifier = f[5] > 0;
    c->seq_len = f[6];
    if (c->dim % c->n_heads != 0)
        return dhsa__fail(DHSA_ERR_FORMAT, "llama2.c checkpoint: n_heads %d does not divide dim %d", c->n_heads,
                          c->dim);
    if (c->n_kv_heads > c->n_heads || c->n_heads % c->n_kv_heads != 0)
        return dhsa__fail(DHSA_ERR_FORMAT,
                          "llama2.c checkpoint: n_kv_heads %d does not divide n_heads %d (grouped-query attention "
                          "needs n_heads = k x n_kv_heads)",
                          c->n_kv_heads, c->n_heads);
    c->head_size = c->dim / c->n_heads;
    if (c->head_size % 2 != 0)
        return dhsa__fail(DHSA_ERR_FORMAT,
                          "llama2.c checkpoint: the head size dim / n_heads = %d / %d = %d is odd; RoPE rotates "
                          "pairs of dims",
                          c->dim, c->n_heads, c->head_size);
    if (c->vocab_size < MIN_VOCAB)
        return dhsa__fail(DHSA_ERR_FORMAT,
                          "llama2.c checkpoint: vocab_size is %d; llama2.c needs at least 3 tokens (0 <unk>, 1 "
                          "<s>, 2 </s>)",
                          c->vocab_size);
    return DHSA_OK;
}

uint64_t dhsa_llama2c__implied_size(const uint8_t header[28]) {
    dhsa_llama2c_config c;
    layout l;
    if (check_fields(header, &c) != DHSA_OK || !layout_of(&c, &l)) return 0;
    return HEADER_BYTES + 4 * l.total;
}

/* The whole header check against a file of `size` bytes whose first
 * min(size, 28) bytes are at p. */
static dhsa_status check_header(const uint8_t *p, uint64_t size, dhsa_llama2c_config *c) {
    if (size >= 4 && memcmp(p, "GGUF", 4) == 0)
        return dhsa__fail(DHSA_ERR_FORMAT,
                          "llama2.c checkpoint: this is a GGUF file (magic \"GGUF\"), not a llama2.c checkpoint");
    if (size >= 8 && rd_u32(p) == AK42_MAGIC)
        return dhsa__fail(DHSA_ERR_FORMAT,
                          "llama2.c checkpoint: this is a llama2.c export of version %d (magic \"ak42\"); only "
                          "the legacy format run.c reads (export.py --version 0) is supported",
                          rd_i32(p + 4));
    if (size < HEADER_BYTES)
        return dhsa__fail(DHSA_ERR_FORMAT,
                          "llama2.c checkpoint: the file has %llu bytes, fewer than the 28-byte header",
                          (unsigned long long)size);
    dhsa_status st = check_fields(p, c);
    if (st) return st;
    layout l;
    if (!layout_of(c, &l))
        return dhsa__fail(DHSA_ERR_FORMAT,
                          "llama2.c checkpoint: the header (dim %d, hidden_dim %d, n_layers %d, vocab_size %d) "
                          "implies more than 2^64 bytes of weights",
                          c->dim, c->hidden_dim, c->n_layers, c->vocab_size);
    uint64_t want = HEADER_BYTES + 4 * l.total;
    if (want != size) {
        /* Would the other sign of vocab_size fit? Say so: it is a likely
         * mistake of a hand-made file. */
        dhsa_llama2c_config c2 = *c;
        c2.shared_classifier = !c->shared_classifier;
        layout l2;
        const char *hint = "";
        if (layout_of(&c2, &l2) && HEADER_BYTES + 4 * l2.total == size)
            hint = c->shared_classifier ? " (the size fits an unshared classifier: vocab_size should be negative)"
                                        : " (the size fits a shared classifier: vocab_size should be positive)";
        return dhsa__fail(DHSA_ERR_FORMAT,
                          "llama2.c checkpoint: the header (dim %d, hidden_dim %d, n_layers %d, n_heads %d, "
                          "n_kv_heads %d, vocab_size %d, seq_len %d, %s classifier) implies a file of %llu bytes, "
                          "but it has %llu%s",
                          c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads,
                          c->shared_classifier ? c->vocab_size : -c->vocab_size, c->seq_len,
                          c->shared_classifier ? "shared" : "unshared", (unsigned long long)want,
                          (unsigned long long)size, hint);
    }
    if (c->vocab_size > DHSA_TOKENIZER_MAX_VOCAB)
        return dhsa__fail(DHSA_ERR_TOO_LARGE, "llama2.c checkpoint: vocab_size %d is above dhsa's limit %d",
                          c->vocab_size, DHSA_TOKENIZER_MAX_VOCAB);
    c->file_size = size;
    c->n_params = (int64_t)l.params;
    return DHSA_OK;
}

dhsa_status dhsa_llama2c_config_from_memory(const void *bin, size_t size, dhsa_llama2c_config *out) {
    if (!out || (!bin && size))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_llama2c_config_from_memory: NULL argument");
    dhsa_llama2c_config c;
    dhsa_status st = check_header(bin, size, &c);
    if (st == DHSA_OK) *out = c;
    return st;
}

/* Prefixes the last error with a path ("PATH: sentence"). */
static dhsa_status with_path(dhsa_status st, const char *path) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", dhsa_last_error());
    return dhsa__fail(st, "%s: %s", path, msg);
}

dhsa_status dhsa_llama2c_read_config(const char *bin_path, dhsa_llama2c_config *out) {
    if (!bin_path || !out) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_llama2c_read_config: NULL argument");
    int fd = open(bin_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return dhsa__fail(DHSA_ERR_IO, "%s: cannot open: %s", bin_path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return dhsa__fail(DHSA_ERR_IO, "%s: not a regular file", bin_path);
    }
    uint8_t hdr[HEADER_BYTES];
    size_t got = 0;
    while (got < sizeof hdr) {
        ssize_t r = read(fd, hdr + got, sizeof hdr - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            close(fd);
            return dhsa__fail(DHSA_ERR_IO, "%s: cannot read: %s", bin_path, strerror(e));
        }
        if (r == 0) break;
        got += (size_t)r;
    }
    close(fd);
    uint64_t size = (uint64_t)sb.st_size;
    if (got < sizeof hdr && got != size)
        return dhsa__fail(DHSA_ERR_IO, "%s: short read of the header", bin_path);
    dhsa_llama2c_config c;
    dhsa_status st = check_header(hdr, size, &c);
    if (st) return with_path(st, bin_path);
    *out = c;
    return DHSA_OK;
}

/* --------------------------------------------------------------------- */
/* Tokenizer file                                                         */

/* U+2581 LOWER ONE EIGHTH BLOCK: SentencePiece's space. */
static const char spm_space[] = "\xe2\x96\x81";

static int is_hex(uint8_t ch) {
    return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F');
}
/* "<0xXX>" with two hex digits: a byte-fallback token. */
static int is_byte_token(const uint8_t *s, int32_t n) {
    return n == 6 && memcmp(s, "<0x", 3) == 0 && is_hex(s[3]) && is_hex(s[4]) && s[5] == '>';
}

/* Walks the tokenizer file once, without allocating: max_token_length,
 * then exactly `vocab` tokens, each with a finite score and a length in
 * [0, max_token_length] inside the file, no NUL in its text, and nothing
 * after the last. *text_bytes: the bytes the GGUF texts take (spaces
 * escaped) with a NUL after each. */
static dhsa_status check_tokenizer(const uint8_t *p, uint64_t size, int32_t vocab, uint64_t *text_bytes) {
    if (size < 4)
        return dhsa__fail(DHSA_ERR_FORMAT,
                          "llama2.c tokenizer: the file has %llu bytes, fewer than the 4-byte max_token_length",
                          (unsigned long long)size);
    int32_t max_len = rd_i32(p);
    if (max_len <= 0)
        return dhsa__fail(DHSA_ERR_FORMAT, "llama2.c tokenizer: max_token_length is %d; it must be positive",
                          max_len);
    if (max_len > DHSA_TOKENIZER_MAX_TOKEN_BYTES)
        return dhsa__fail(DHSA_ERR_TOO_LARGE, "llama2.c tokenizer: max_token_length %d is above dhsa's limit %d",
                          max_len, DHSA_TOKENIZER_MAX_TOKEN_BYTES);
    uint64_t off = 4, total = 0;
    for (int32_t i = 0; i < vocab; i++) {
        if (size - off < 8) {
            if (off == size)
                return dhsa__fail(DHSA_ERR_FORMAT,
                                  "llama2.c tokenizer: the file ends after %d tokens, but the checkpoint's "
                                  "vocab_size is %d",
                                  i, vocab);
            return dhsa__fail(DHSA_ERR_FORMAT,
                              "llama2.c tokenizer: the file ends inside the score and length of token %d (byte "
                              "%llu of %llu); the checkpoint's vocab_size is %d",
                              i, (unsigned long long)off, (unsigned long long)size, vocab);
        }
        float score = rd_f32(p + off);
        int32_t len = rd_i32(p + off + 4);
        if (!isfinite(score))
            return dhsa__fail(DHSA_ERR_FORMAT,
                              "llama2.c tokenizer: token %d has score %g (byte %llu); scores must be finite", i,
                              (double)score, (unsigned long long)off);
        if (len < 0)
            return dhsa__fail(DHSA_ERR_FORMAT, "llama2.c tokenizer: token %d has length %d (byte %llu)", i, len,
                              (unsigned long long)off + 4);
        if (len > max_len)
            return dhsa__fail(DHSA_ERR_FORMAT,
                              "llama2.c tokenizer: token %d is %d bytes long (byte %llu), more than "
                              "max_token_length %d",
                              i, len, (unsigned long long)off + 4, max_len);
        off += 8;
        if ((uint64_t)len > size - off)
            return dhsa__fail(DHSA_ERR_FORMAT,
                              "llama2.c tokenizer: the %d bytes of token %d run past the end of the file (%llu "
                              "bytes left at byte %llu)",
                              len, i, (unsigned long long)(size - off), (unsigned long long)off);
        const uint8_t *s = p + off;
        if (len && memchr(s, 0, (size_t)len))
            return dhsa__fail(DHSA_ERR_FORMAT, "llama2.c tokenizer: token %d holds a NUL byte (at byte %llu)", i,
                              (unsigned long long)(off + (uint64_t)((const uint8_t *)memchr(s, 0, (size_t)len) - s)));
        uint64_t esc = (uint64_t)len;
        for (int32_t j = 0; j < len; j++) esc += s[j] == ' ' ? 2 : 0;
        if (esc > DHSA_TOKENIZER_MAX_TOKEN_BYTES)
            return dhsa__fail(DHSA_ERR_TOO_LARGE,
                              "llama2.c tokenizer: token %d is %llu bytes once spaces become U+2581 (limit %d)", i,
                              (unsigned long long)esc, DHSA_TOKENIZER_MAX_TOKEN_BYTES);
        total += (i <= EOS_ID ? 6 : esc) + 1; /* ids 0..2 become <unk> <s> </s> */
        off += (uint64_t)len;
    }
    if (off != size) {
        /* Count what follows, leniently, to say what the file looks like. */
        int64_t more = 0;
        uint64_t o = off;
        while (size - o >= 8) {
            int32_t len = rd_i32(p + o + 4);
            if (len < 0 || (uint64_t)len > size - o - 8) break;
            o += 8 + (uint64_t)len;
            more++;
        }
        return dhsa__fail(DHSA_ERR_FORMAT,
                          "llama2.c tokenizer: %llu bytes follow token %d, the last of the checkpoint's vocab_size "
                          "%d (they hold %lld more token%s%s): the tokenizer and the checkpoint do not match",
                          (unsigned long long)(size - off), vocab - 1, vocab, (long long)more, more == 1 ? "" : "s",
                          o == size ? "" : " and stray bytes");
    }
    *text_bytes = total;
    return DHSA_OK;
}

/* The vocabulary as GGUF wants it. */
typedef struct {
    char *arena;       /* NUL-terminated texts */
    const char **text; /* [vocab] into arena */
    float *scores;     /* [vocab] */
    int32_t *types;    /* [vocab] dhsa_token_type */
} vocab_buf;

static void vocab_free(vocab_buf *vb) {
    free(vb->arena);
    free(vb->text);
    free(vb->scores);
    free(vb->types);
    memset(vb, 0, sizeof *vb);
}

/* Builds the vocabulary from a checked tokenizer file, the way llama.cpp's
 * convert-llama2c-to-ggml does: ids 0, 1, 2 become <unk> (UNKNOWN), <s>
 * and </s> (CONTROL); an empty text is CONTROL; "<0xXX>" is BYTE; the rest
 * NORMAL; spaces become U+2581. */
static dhsa_status build_vocab(const uint8_t *p, int32_t vocab, uint64_t text_bytes, vocab_buf *vb) {
    memset(vb, 0, sizeof *vb);
    vb->arena = counted_malloc((size_t)text_bytes);
    vb->text = counted_malloc(sizeof *vb->text * (size_t)vocab);
    vb->scores = counted_malloc(sizeof *vb->scores * (size_t)vocab);
    vb->types = counted_malloc(sizeof *vb->types * (size_t)vocab);
    if (!vb->arena || !vb->text || !vb->scores || !vb->types) {
        vocab_free(vb);
        return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "llama2.c tokenizer: out of memory for %d tokens", vocab);
    }
    static const char *const fixed[3] = {"<unk>", "<s>", "</s>"};
    static const int32_t fixed_type[3] = {DHSA_TOKEN_UNKNOWN, DHSA_TOKEN_CONTROL, DHSA_TOKEN_CONTROL};
    uint64_t off = 4, pos = 0;
    for (int32_t i = 0; i < vocab; i++) {
        vb->scores[i] = rd_f32(p + off);
        int32_t len = rd_i32(p + off + 4);
        const uint8_t *s = p + off + 8;
        off += 8 + (uint64_t)len;
        char *dst = vb->arena + pos;
        vb->text[i] = dst;
        if (i <= EOS_ID) {
            size_t n = strlen(fixed[i]);
            memcpy(dst, fixed[i], n + 1);
            pos += n + 1;
            vb->types[i] = fixed_type[i];
            continue;
        }
        vb->types[i] = len == 0 ? DHSA_TOKEN_CONTROL : is_byte_token(s, len) ? DHSA_TOKEN_BYTE : DHSA_TOKEN_NORMAL;
        for (int32_t j = 0; j < len; j++) {
            if (s[j] == ' ') {
                memcpy(dst, spm_space, 3);
                dst += 3;
            } else {
                *dst++ = (char)s[j];
            }
        }
        *dst++ = 0;
        pos = (uint64_t)(dst - vb->arena);
    }
    return DHSA_OK;
}

/* --------------------------------------------------------------------- */
/* Conversion                                                             */

#define TRY(call)                                                                                              \
    do {                                                                                                       \
        if ((st = (call)) != DHSA_OK) goto fail;                                                               \
    } while (0)

/* Set while dhsa_convert_llama2c builds its writer: a file is refused
 * when a weight is NaN or infinite (loading in memory leaves that check to
 * the model loader's check_finite, and inspect shows such a file as is). */
static _Thread_local int refuse_nonfinite;

/* Adds one F32 tensor of dims [d0] or [d0, d1] (fastest first). */
static dhsa_status add_f32(dhsa_gguf_writer *w, const char *name, int64_t d0, int64_t d1, const uint8_t *data) {
    int64_t dims[2] = {d0, d1}, n = d0 * (d1 ? d1 : 1);
    for (int64_t i = 0; refuse_nonfinite && i < n; i++) {
        float x = rd_f32(data + 4 * i);
        if (!isfinite(x))
            return dhsa__fail(DHSA_ERR_NONFINITE,
                              "tensor %s: weight %lld of %lld is %s; a checkpoint with NaN or infinite weights is "
                              "not converted", name, (long long)i, (long long)n, isnan(x) ? "NaN" : x > 0 ? "+Inf" : "-Inf");
    }
    return dhsa_gguf_writer_add_tensor(w, name, DHSA_GGML_F32, d1 ? 2 : 1, dims, data, n * 4);
}

/* The writer of the GGUF: metadata, then tensors in llama.cpp's order,
 * their data borrowed from bin (which must outlive the write). */
static dhsa_status make_writer(const uint8_t *bin, const dhsa_llama2c_config *c, const vocab_buf *vb,
                               const char *name, dhsa_gguf_writer **out) {
    dhsa_gguf_writer *w = NULL;
    dhsa_status st;
    TRY(dhsa_gguf_writer_create(&w));
    TRY(dhsa_gguf_writer_set_str(w, "general.architecture", "llama"));
    TRY(dhsa_gguf_writer_set_str(w, "general.name", name));
    TRY(dhsa_gguf_writer_set_u32(w, "general.file_type", 0)); /* all F32 */
    TRY(dhsa_gguf_writer_set_u32(w, "llama.context_length", (uint32_t)c->seq_len));
    TRY(dhsa_gguf_writer_set_u32(w, "llama.embedding_length", (uint32_t)c->dim));
    TRY(dhsa_gguf_writer_set_u32(w, "llama.block_count", (uint32_t)c->n_layers));
    TRY(dhsa_gguf_writer_set_u32(w, "llama.feed_forward_length", (uint32_t)c->hidden_dim));
    TRY(dhsa_gguf_writer_set_u32(w, "llama.attention.head_count", (uint32_t)c->n_heads));
    TRY(dhsa_gguf_writer_set_u32(w, "llama.attention.head_count_kv", (uint32_t)c->n_kv_heads));
    TRY(dhsa_gguf_writer_set_u32(w, "llama.rope.dimension_count", (uint32_t)c->head_size));
    TRY(dhsa_gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f));
    TRY(dhsa_gguf_writer_set_f32(w, "llama.rope.freq_base", 10000.0f));
    TRY(dhsa_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama"));
    TRY(dhsa_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", vb->text, c->vocab_size));
    TRY(dhsa_gguf_writer_set_arr(w, "tokenizer.ggml.scores", DHSA_GGUF_FLOAT32, vb->scores, c->vocab_size));
    TRY(dhsa_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", DHSA_GGUF_INT32, vb->types, c->vocab_size));
    TRY(dhsa_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", BOS_ID));
    TRY(dhsa_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", EOS_ID));
    TRY(dhsa_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", UNK_ID));
    TRY(dhsa_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", 1));
    TRY(dhsa_gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", 1));

    layout l;
    layout_of(c, &l); /* checked by check_header */
    int64_t d = c->dim, h = c->hidden_dim, V = c->vocab_size, kvd = (int64_t)c->n_kv_heads * c->head_size;
    /* Byte offsets of each region (file order). */
    const uint8_t *embed = bin + HEADER_BYTES;
    const uint8_t *rms_att = embed + 4 * l.embed;
    const uint8_t *wq = rms_att + 4 * l.rms_att;
    const uint8_t *wk = wq + 4 * l.wq;
    const uint8_t *wv = wk + 4 * l.wk;
    const uint8_t *wo = wv + 4 * l.wv;
    const uint8_t *rms_ffn = wo + 4 * l.wo;
    const uint8_t *w1 = rms_ffn + 4 * l.rms_ffn;
    const uint8_t *w2 = w1 + 4 * l.w1;
    const uint8_t *w3 = w2 + 4 * l.w2;
    const uint8_t *rms_final = w3 + 4 * l.w3;
    const uint8_t *wcls = rms_final + 4 * (l.rms_final + l.rope);

    TRY(add_f32(w, "token_embd.weight", d, V, embed));      /* [d, V]: row per token */
    TRY(add_f32(w, "output_norm.weight", d, 0, rms_final)); /* [d] */
    if (!c->shared_classifier) TRY(add_f32(w, "output.weight", d, V, wcls));
    char nm[64];
    for (int64_t i = 0; i < c->n_layers; i++) {
#define BLK(suffix) (snprintf(nm, sizeof nm, "blk.%lld." suffix, (long long)i), nm)
        /* llama2.c W (out, in) row-major = GGUF [in, out]. */
        TRY(add_f32(w, BLK("attn_q.weight"), d, d, wq + 4 * (uint64_t)(i * d * d)));
        TRY(add_f32(w, BLK("attn_k.weight"), d, kvd, wk + 4 * (uint64_t)(i * d * kvd)));
        TRY(add_f32(w, BLK("attn_v.weight"), d, kvd, wv + 4 * (uint64_t)(i * d * kvd)));
        TRY(add_f32(w, BLK("attn_output.weight"), d, d, wo + 4 * (uint64_t)(i * d * d)));
        TRY(add_f32(w, BLK("attn_norm.weight"), d, 0, rms_att + 4 * (uint64_t)(i * d)));
        TRY(add_f32(w, BLK("ffn_gate.weight"), d, h, w1 + 4 * (uint64_t)(i * h * d))); /* w1 */
        TRY(add_f32(w, BLK("ffn_down.weight"), h, d, w2 + 4 * (uint64_t)(i * d * h))); /* w2 */
        TRY(add_f32(w, BLK("ffn_up.weight"), d, h, w3 + 4 * (uint64_t)(i * h * d)));   /* w3 */
        TRY(add_f32(w, BLK("ffn_norm.weight"), d, 0, rms_ffn + 4 * (uint64_t)(i * d)));
#undef BLK
    }
    *out = w;
    return DHSA_OK;
fail:
    dhsa_gguf_writer_free(w);
    return st;
}

/* Checks both files and builds the writer (tensor data borrowed from
 * bin). *which: 0 when the checkpoint is at fault, 1 the tokenizer, -1
 * neither (out of memory, a writer error). */
static dhsa_status convert(const uint8_t *bin, uint64_t bin_size, const uint8_t *tok, uint64_t tok_size,
                           const char *name, dhsa_gguf_writer **w, int *which) {
    *w = NULL;
    *which = 0;
    dhsa_llama2c_config c;
    dhsa_status st = check_header(bin, bin_size, &c);
    if (st) return st;
    *which = 1;
    uint64_t text_bytes = 0;
    if ((st = check_tokenizer(tok, tok_size, c.vocab_size, &text_bytes))) return st;
    *which = -1;
    vocab_buf vb;
    if ((st = build_vocab(tok, c.vocab_size, text_bytes, &vb))) return st;
    st = make_writer(bin, &c, &vb, name ? name : "llama2.c", w);
    vocab_free(&vb); /* the writer copied the arrays */
    if (st == DHSA_ERR_NONFINITE) *which = 0;
    return st;
}

/* dhsa_llama2c_open_memory, with *which as in convert(). */
static dhsa_status open_image(const uint8_t *bin, uint64_t bin_size, const uint8_t *tok, uint64_t tok_size,
                              const char *name, dhsa_gguf **out, int *which) {
    dhsa_gguf_writer *w;
    dhsa_status st = convert(bin, bin_size, tok, tok_size, name, &w, which);
    if (st) return st;
    size_t n;
    if ((st = dhsa_gguf_writer_size(w, &n))) {
        dhsa_gguf_writer_free(w);
        return st;
    }
    /* 64-byte aligned, so tensor data (32-aligned in the file) is
     * 32-aligned in memory too. */
    size_t cap = dhsa__align_up(n ? n : 1, 64);
    void *img = aligned_alloc(64, cap);
    alloc_bytes += cap;
    if (!img) {
        dhsa_gguf_writer_free(w);
        return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "llama2.c: out of memory for a %zu-byte GGUF image", n);
    }
    st = dhsa_gguf_writer_write_memory(w, img, cap);
    dhsa_gguf_writer_free(w);
    if (st) {
        free(img);
        return st;
    }
    st = dhsa_gguf__open_memory_owned(img, n, out); /* frees img on failure */
    if (st) {
        char msg[400];
        snprintf(msg, sizeof msg, "%s", dhsa_last_error());
        return dhsa__fail(DHSA_ERR_INTERNAL, "llama2.c: the GGUF image built does not read back: %s", msg);
    }
    return DHSA_OK;
}

dhsa_status dhsa_llama2c_open_memory(const void *bin, size_t bin_size, const void *tok, size_t tok_size,
                                     const char *name, dhsa_gguf **out) {
    if (!out) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_llama2c_open_memory: out is NULL");
    *out = NULL;
    alloc_bytes = 0;
    if ((!bin && bin_size) || (!tok && tok_size))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_llama2c_open_memory: NULL buffer");
    static const uint8_t empty[1];
    int which;
    return open_image(bin ? bin : empty, bin_size, tok ? tok : empty, tok_size, name, out, &which);
}

/* --------------------------------------------------------------------- */
/* Files                                                                  */

/* A whole file, read-only: mapped, or read into memory when mmap fails. */
typedef struct {
    const uint8_t *p;
    uint64_t size;
    void *map;
    size_t map_len;
    uint8_t *owned;
    dev_t dev;
    ino_t ino;
} file_view;

static void view_close(file_view *v) {
    if (v->map) munmap(v->map, v->map_len);
    free(v->owned);
    memset(v, 0, sizeof *v);
}

static dhsa_status view_open(const char *path, file_view *v) {
    memset(v, 0, sizeof *v);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return dhsa__fail(DHSA_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return dhsa__fail(DHSA_ERR_IO, "%s: not a regular file", path);
    }
    if ((uint64_t)sb.st_size > (uint64_t)SIZE_MAX) {
        close(fd);
        return dhsa__fail(DHSA_ERR_TOO_LARGE, "%s: too large to map", path);
    }
    v->size = (uint64_t)sb.st_size;
    v->dev = sb.st_dev;
    v->ino = sb.st_ino;
    static const uint8_t empty[1];
    v->p = empty;
    if (v->size) {
        void *m = mmap(NULL, (size_t)v->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m != MAP_FAILED) {
            v->map = m;
            v->map_len = (size_t)v->size;
            v->p = m;
        } else {
            v->owned = malloc((size_t)v->size);
            size_t got = 0;
            while (v->owned && got < v->size) {
                ssize_t r = read(fd, v->owned + got, (size_t)v->size - got);
                if (r < 0 && errno == EINTR) continue;
                if (r <= 0) break;
                got += (size_t)r;
            }
            if (!v->owned || got < v->size) {
                int e = errno;
                int oom = !v->owned;
                view_close(v);
                close(fd);
                if (oom) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "%s: out of memory reading it", path);
                return dhsa__fail(DHSA_ERR_IO, "%s: cannot read: %s", path, e ? strerror(e) : "short read");
            }
            v->p = v->owned;
        }
    }
    close(fd);
    return DHSA_OK;
}

/* general.name from a path: the file name without directory and
 * extension ("stories260K" from "models/stories260K.bin"). */
static void name_of_path(const char *path, char *buf, size_t cap) {
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    size_t n = strlen(b);
    const char *dot = strrchr(b, '.');
    if (dot && dot > b) n = (size_t)(dot - b);
    if (n == 0) snprintf(buf, cap, "llama2.c");
    else snprintf(buf, cap, "%.*s", (int)(n < 200 ? n : 200), b);
}

/* Opens both files and builds the writer; on success the views stay open
 * (the writer borrows the checkpoint's bytes). */
static dhsa_status open_and_convert(const char *bin_path, const char *tok_path, file_view *bv, file_view *tv,
                                    dhsa_gguf_writer **w) {
    alloc_bytes = 0;
    dhsa_status st = view_open(bin_path, bv);
    if (st) return st;
    if ((st = view_open(tok_path, tv))) {
        view_close(bv);
        return st;
    }
    char name[256];
    name_of_path(bin_path, name, sizeof name);
    int which;
    st = convert(bv->p, bv->size, tv->p, tv->size, name, w, &which);
    if (st) {
        view_close(bv);
        view_close(tv);
        if (which >= 0) return with_path(st, which == 0 ? bin_path : tok_path);
    }
    return st;
}

dhsa_status dhsa_llama2c_open(const char *bin_path, const char *tok_path, dhsa_gguf **out) {
    if (!out) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_llama2c_open: out is NULL");
    *out = NULL;
    alloc_bytes = 0;
    if (!bin_path) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_llama2c_open: bin_path is NULL");
    if (!tok_path)
        return dhsa__fail(DHSA_ERR_INVALID_ARG,
                          "%s: a llama2.c checkpoint needs its tokenizer file (tok*.bin or tokenizer.bin)", bin_path);
    file_view bv, tv;
    dhsa_status st = view_open(bin_path, &bv);
    if (st) return st;
    if ((st = view_open(tok_path, &tv))) {
        view_close(&bv);
        return st;
    }
    char name[256];
    name_of_path(bin_path, name, sizeof name);
    int which;
    st = open_image(bv.p, bv.size, tv.p, tv.size, name, out, &which);
    view_close(&bv);
    view_close(&tv);
    if (st && which >= 0) return with_path(st, which == 0 ? bin_path : tok_path);
    return st;
}

dhsa_status dhsa_convert_llama2c(const char *bin_path, const char *tok_path, const char *out_gguf_path) {
    if (!bin_path || !tok_path || !out_gguf_path)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_convert_llama2c: NULL argument");
    file_view bv, tv;
    dhsa_gguf_writer *w;
    refuse_nonfinite = 1;
    dhsa_status st = open_and_convert(bin_path, tok_path, &bv, &tv, &w);
    refuse_nonfinite = 0;
    if (st) return st;
    struct stat sb;
    if (stat(out_gguf_path, &sb) == 0 &&
        ((sb.st_dev == bv.dev && sb.st_ino == bv.ino) || (sb.st_dev == tv.dev && sb.st_ino == tv.ino))) {
        st = dhsa__fail(DHSA_ERR_INVALID_ARG, "%s: the output would overwrite an input", out_gguf_path);
        goto done;
    }
    /* through a temporary renamed into place: a failure leaves the old file */
    st = dhsa_gguf_writer_write_file(w, out_gguf_path);
done:
    dhsa_gguf_writer_free(w);
    view_close(&bv);
    view_close(&tv);
    return st;
}

/* --------------------------------------------------------------------- */
/* Fuzz harness body                                                      */

/* Checks a converted model against its checkpoint: hyperparameters, the
 * tensor count, every tensor's bytes in llama2.c's file order (a walk
 * independent of make_writer's offsets), and the tokenizer. 0 = fine. */
static int check_model(const dhsa_gguf *g, const uint8_t *bin, size_t bin_n) {
    dhsa_llama2c_config c;
    if (dhsa_llama2c_config_from_memory(bin, bin_n, &c)) return 1;
    static const char *const keys[] = {"llama.context_length", "llama.embedding_length", "llama.block_count",
                                       "llama.feed_forward_length", "llama.attention.head_count",
                                       "llama.attention.head_count_kv", "llama.rope.dimension_count"};
    const int32_t want[] = {c.seq_len, c.dim, c.n_layers, c.hidden_dim, c.n_heads, c.n_kv_heads, c.head_size};
    for (int i = 0; i < 7; i++) {
        uint32_t v;
        if (dhsa_gguf_get_u32(g, keys[i], &v) || v != (uint32_t)want[i]) return 1;
    }
    if (dhsa_gguf_n_tensors(g) != 9 * (int64_t)c.n_layers + 2 + !c.shared_classifier) return 1;
    static const char *const per_layer[] = {"attn_norm", "attn_q",   "attn_k",   "attn_v",  "attn_output",
                                            "ffn_norm",  "ffn_gate", "ffn_down", "ffn_up"};
    uint64_t off = HEADER_BYTES;
    char nm[64];
    for (int r = -1; r <= 9; r++) { /* -1 token_embd, 0..8 per layer, 9 output_norm */
        int64_t n_l = r >= 0 && r < 9 ? c.n_layers : 1;
        for (int64_t l = 0; l < n_l; l++) {
            if (r < 0) snprintf(nm, sizeof nm, "token_embd.weight");
            else if (r == 9) snprintf(nm, sizeof nm, "output_norm.weight");
            else snprintf(nm, sizeof nm, "blk.%lld.%s.weight", (long long)l, per_layer[r]);
            int64_t i = dhsa_gguf_find_tensor(g, nm);
            const void *p;
            int64_t n;
            if (i < 0 || dhsa_gguf_tensor_data(g, i, &p, &n) || dhsa_gguf_tensor_at(g, i)->type != DHSA_GGML_F32)
                return 1;
            if ((uint64_t)n > bin_n - off || memcmp(p, bin + off, (size_t)n) != 0) return 1;
            if (((uintptr_t)p & 31) != 0) return 1; /* aligned in memory */
            off += (uint64_t)n;
        }
    }
    off += 4 * (uint64_t)c.seq_len * (uint64_t)c.head_size; /* the RoPE tables */
    if (!c.shared_classifier) {
        int64_t i = dhsa_gguf_find_tensor(g, "output.weight");
        const void *p;
        int64_t n;
        if (i < 0 || dhsa_gguf_tensor_data(g, i, &p, &n)) return 1;
        if ((uint64_t)n > bin_n - off || memcmp(p, bin + off, (size_t)n) != 0) return 1;
        off += (uint64_t)n;
    } else if (dhsa_gguf_find_tensor(g, "output.weight") >= 0) {
        return 1;
    }
    if (off != bin_n) return 1;

    dhsa_tokenizer *t;
    if (dhsa_tokenizer_from_gguf(g, &t)) return 1;
    int bad = dhsa_tokenizer_n_vocab(t) != c.vocab_size || dhsa_tokenizer_bos(t) != BOS_ID ||
              dhsa_tokenizer_eos(t) != EOS_ID || dhsa_tokenizer_type(t, UNK_ID) != DHSA_TOKEN_UNKNOWN;
    static const char text[] = "Once upon a time, \xc3\xa9t\xc3\xa9 <s>";
    int32_t ids[64];
    int64_t n_ids = 0, len = 0;
    char back[512];
    if (dhsa_tokenize(t, text, (int64_t)sizeof text - 1, DHSA_TOKENIZE_ADD_BOS, ids, 64, &n_ids)) bad = 1;
    else if (dhsa_detokenize(t, ids, n_ids, 0, back, (int64_t)sizeof back, &len)) bad = 1;
    dhsa_tokenizer_free(t);
    return bad;
}

int dhsa_llama2c_fuzz_one(const uint8_t *data, size_t size) {
    size_t bin_n = size, skip = 0;
    if (size >= 8 && memcmp(data, "L2CF", 4) == 0) {
        uint64_t n = rd_u32(data + 4);
        skip = 8;
        bin_n = n < size - 8 ? (size_t)n : size - 8;
    } else if (size >= HEADER_BYTES) {
        uint64_t n = dhsa_llama2c__implied_size(data);
        if (n && n <= size) bin_n = (size_t)n;
    }
    size_t tok_n = size - skip - bin_n;
    /* Exact-size copies: a read past either end is an ASan report. */
    uint8_t *bin = malloc(bin_n ? bin_n : 1), *tok = malloc(tok_n ? tok_n : 1);
    if (!bin || !tok) {
        free(bin);
        free(tok);
        return 0;
    }
    if (bin_n) memcpy(bin, data + skip, bin_n);
    if (tok_n) memcpy(tok, data + skip + bin_n, tok_n);
    dhsa_gguf *g = NULL;
    dhsa_status st = dhsa_llama2c_open_memory(bin, bin_n, tok, tok_n, "fuzz", &g);
    int bad = dhsa_llama2c__last_alloc() > DHSA_LLAMA2C_ALLOC_CAP(bin_n, tok_n);
    if (st != DHSA_OK) {
        if (g || !dhsa_last_error()[0]) bad = 1;
        if (st != DHSA_ERR_FORMAT && st != DHSA_ERR_TOO_LARGE && st != DHSA_ERR_OUT_OF_MEMORY) bad = 1;
    } else {
        bad |= check_model(g, bin, bin_n);
        dhsa_gguf_close(g);
    }
    free(bin);
    free(tok);
    return bad;
}
