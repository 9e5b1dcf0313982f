/* test_model_tensors.c: untrusted strings from model files are escaped
 * before they reach a terminal.
 *
 *   - The escaping helper itself (src/core/escape.c): each rule, cutting,
 *     and dhsa__fail's own pass over its sentence.
 *   - Loader sentences with a file's strings: an architecture name and a
 *     GGUF key holding ESC come out escaped.
 *
 * Build and run alone:
 *   make build/tests/test_model_tensors && DHSA_CLI=build/dhsa build/tests/test_model_tensors
 */
#include "core/internal.h"
#include "dhsa.h"
#include "llm_ref.h"
#include "t.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static dhsa_ctx *ctx;

static dhsa_status load_bytes(const uint8_t *bytes, size_t size, dhsa_model **m) {
    dhsa_gguf *g;
    *m = NULL;
    dhsa_status st = dhsa_gguf_open_memory(bytes, size, &g);
    if (st) return st;
    return dhsa_model_from_gguf(g, NULL, m);
}

/* No byte of s is a control byte (ESC, BEL, ...). */
static int no_controls(const char *s) {
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f) return 0;
    return 1;
}

/* ------------------------------------------------------------ escaping --- */

/* The input of a failed check, for its message: bytes outside printable
 * ASCII as \xNN (independent of the helper under test). */
static const char *hex_of(const char *s, size_t n, char *buf, size_t cap) {
    size_t o = 0;
    for (size_t i = 0; i < n && o + 5 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c > 0x20 && c < 0x7f && c != '\\') buf[o++] = (char)c;
        else o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
    }
    buf[o] = '\0';
    return buf;
}

static void check_esc(const char *in, size_t len, unsigned flags, const char *want) {
    char out[128];
    size_t n = dhsa__escape(out, sizeof out, in, len, flags);
    char shown[160];
    T_CHECK(strcmp(out, want) == 0 && n == strlen(want), "escape of %s (flags %u): got \"%s\" (%zu), want \"%s\"",
            hex_of(in, len, shown, sizeof shown), flags, out, n, want);
}

/* in is a string literal: its length includes any NUL inside */
#define ESC(in, flags, want) check_esc(in, sizeof(in) - 1, flags, want)

static void test_escape(void) {
    ESC("blk.0.\x1b[31mred", 0, "blk.0.\\x1b[31mred");
    ESC("a\nb\tc\rd", 0, "a\\nb\\tc\\rd");
    ESC("\x01\x07\x7f", 0, "\\x01\\x07\\x7f");
    ESC("a\0b", 0, "a\\x00b"); /* with a length, NUL is a byte like any other */
    /* valid UTF-8 is kept: the SentencePiece space, CJK, an emoji */
    ESC("\xe2\x96\x81the \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80", 0,
        "\xe2\x96\x81the \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80");
    /* C1 CSI (U+009B), a bidi override (U+202E), U+2028: escaped byte by byte */
    ESC("\xc2\x9b" "2J", 0, "\\xc2\\x9b2J");
    ESC("ab\xe2\x80\xae" "cd", 0, "ab\\xe2\\x80\\xaecd");
    ESC("\xe2\x80\xa8", 0, "\\xe2\\x80\\xa8");
    /* invalid UTF-8: a stray byte, an overlong '/', a surrogate, a cut sequence */
    ESC("\xff", 0, "\\xff");
    ESC("\xc0\xaf", 0, "\\xc0\\xaf");
    ESC("\xed\xa0\x80", 0, "\\xed\\xa0\\x80");
    ESC("x\xe2\x96", 0, "x\\xe2\\x96");
    ESC("\x80x", 0, "\\x80x");
    /* backslashes and quotes, per flag */
    ESC("a\\b\"c'd", 0, "a\\b\"c'd");
    ESC("a\\b\"c'd", DHSA__ESC_BACKSLASH, "a\\\\b\"c'd");
    ESC("a\\b\"c'd", DHSA__ESC_QUOTES, "a\\\\b\\\"c\\'d");
    /* cutting: between escapes, never inside; "..." when asked; the return
     * value is the whole escaped length either way */
    {
        char o[6];
        size_t n = dhsa__escape(o, sizeof o, "ab\x1b" "cd", 5, 0);
        T_CHECK(n == 8 && strcmp(o, "ab") == 0, "cut before an escape: \"%s\" (%zu)", o, n);
        char e[8];
        n = dhsa__escape(e, sizeof e, "abcdefghij", 10, DHSA__ESC_ELLIPSIS);
        T_CHECK(n == 10 && strcmp(e, "abcd...") == 0, "cut with an ellipsis: \"%s\" (%zu)", e, n);
        n = dhsa__escape(e, sizeof e, "abcdefg", 7, DHSA__ESC_ELLIPSIS);
        T_CHECK(n == 7 && strcmp(e, "abcdefg") == 0, "a text that fits is not cut: \"%s\"", e);
        T_CHECK(dhsa__escape(NULL, 0, "\x1b\x1b", 2, 0) == 8, "cap 0 counts");
    }
    /* the rotating buffers: four strings of one sentence stay distinct */
    {
        const char *a = dhsa__esc("one\x1b"), *b = dhsa__esc("two"), *c = dhsa__esc("three"), *d = dhsa__escn("four!", 4);
        T_CHECK(strcmp(a, "one\\x1b") == 0 && strcmp(b, "two") == 0 && strcmp(c, "three") == 0 &&
                    strcmp(d, "four") == 0,
                "dhsa__esc: %s %s %s %s", a, b, c, d);
    }
    /* dhsa__fail escapes what a caller left raw, and may be given its own
     * previous sentence */
    dhsa__fail(DHSA_ERR_FORMAT, "name \"%s\"", "x\x1b]0;pwned\x07y");
    T_CHECK(strcmp(dhsa_last_error(), "name \"x\\x1b]0;pwned\\x07y\"") == 0, "dhsa__fail escapes: %s",
            dhsa_last_error());
    dhsa__fail(DHSA_ERR_FORMAT, "inner reason");
    dhsa__fail(DHSA_ERR_FORMAT, "layer 3: %s", dhsa_last_error());
    T_CHECK(strcmp(dhsa_last_error(), "layer 3: inner reason") == 0, "dhsa__fail of its own sentence: %s",
            dhsa_last_error());
}

/* Other loader sentences with a file's strings: an architecture, a
 * tokenizer model, a key through a getter. */
static void test_loader_sentences(void) {
    llmref_spec s = llmref_spec_default("llama\x1b[5m", LLMREF_F32);
    uint8_t *bytes = NULL;
    size_t size = 0;
    if (!llmref_fixture_build(&s, &bytes, &size)) {
        dhsa_model *m = NULL;
        dhsa_status st = load_bytes(bytes, size, &m);
        T_CHECK(st == DHSA_ERR_UNSUPPORTED && strstr(dhsa_last_error(), "llama\\x1b[5m") &&
                    no_controls(dhsa_last_error()),
                "an architecture name with ESC is escaped: %s", dhsa_last_error());
        dhsa_model_free(m);
        free(bytes);
    }
    /* a GGUF whose key holds ESC, read with the wrong getter */
    dhsa_gguf_writer *w;
    if (dhsa_gguf_writer_create(&w) == DHSA_OK) {
        const char *key = "evil.\x1b[31mkey";
        dhsa_gguf_writer_set_str(w, key, "x");
        size_t n = 0;
        uint8_t *buf = NULL;
        dhsa_gguf *g = NULL;
        if (dhsa_gguf_writer_size(w, &n) == DHSA_OK && (buf = malloc(n)) &&
            dhsa_gguf_writer_write_memory(w, buf, n) == DHSA_OK && dhsa_gguf_open_memory(buf, n, &g) == DHSA_OK) {
            uint32_t v;
            dhsa_status st = dhsa_gguf_get_u32(g, key, &v);
            T_CHECK(st == DHSA_ERR_FORMAT && strstr(dhsa_last_error(), "evil.\\x1b[31mkey") &&
                        no_controls(dhsa_last_error()),
                    "a key with ESC in a getter's sentence: %s", dhsa_last_error());
        } else {
            T_CHECK(0, "writer: %s", dhsa_last_error());
        }
        dhsa_gguf_close(g);
        free(buf);
        dhsa_gguf_writer_free(w);
    }
}

int main(void) {
    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = 2;
    if (dhsa_ctx_create(&cp, &ctx)) {
        printf("test_model_tensors: 0 passed, 1 failed\n");
        return 1;
    }
    test_escape();
    test_loader_sentences();
    dhsa_ctx_free(ctx);
    return t_report("test_model_tensors");
}
