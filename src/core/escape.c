/* escape.c: untrusted text (tensor names, keys, architecture names, token
 * pieces: whatever a model file says) made safe for a terminal. A name with
 * an ESC byte could otherwise recolour, move or clear the terminal that
 * prints an error about it, or hide what the error says.
 *
 * Contract (core/internal.h): every byte that a terminal could act on is
 * written as a visible escape, and everything else is kept as it is, so
 * the usual names and UTF-8 pieces ("▁the", CJK) read unchanged:
 *   - \n \t \r; other C0 bytes and DEL as \xNN (lower-case hex: ESC is \x1b);
 *   - bytes that do not start a valid UTF-8 sequence (stray continuation
 *     bytes, overlong forms, surrogates, past U+10FFFF, a sequence cut by
 *     the end) byte by byte as \xNN;
 *   - valid sequences of C1 controls (U+0080..U+009F: CSI is U+009B), the
 *     line / paragraph separators U+2028, U+2029 and the bidirectional
 *     controls (U+200E, U+200F, U+202A..U+202E, U+2066..U+2069, which can
 *     reorder what the reader sees) as the \xNN of each of their bytes;
 *   - with DHSA__ESC_BACKSLASH, \ as \\ (so an escape in the output cannot
 *     be confused with one in the input); with DHSA__ESC_QUOTES, also " and
 *     ' as \" and \' (for text shown between quotes).
 * Output is cut only between escapes, never inside one.
 * Tested by tests/test_model_tensors.c (every rule above, cutting, and the
 * loaders' messages about a tensor named with an ESC byte).
 */
#include "core/internal.h"

#include <stdio.h>

/* Length of the valid UTF-8 sequence at s[0..n) and its code point, or 0. */
static int utf8_seq(const unsigned char *s, size_t n, uint32_t *cp) {
    int k = s[0] >= 0xF0 && s[0] <= 0xF4 ? 4 : s[0] >= 0xE0 && s[0] <= 0xEF ? 3 : s[0] >= 0xC2 && s[0] <= 0xDF ? 2 : 0;
    if (k == 0 || (size_t)k > n) return 0;
    for (int i = 1; i < k; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    if (k == 3 && ((s[0] == 0xE0 && s[1] < 0xA0) || (s[0] == 0xED && s[1] >= 0xA0))) return 0; /* overlong, surrogate */
    if (k == 4 && ((s[0] == 0xF0 && s[1] < 0x90) || (s[0] == 0xF4 && s[1] >= 0x90))) return 0; /* overlong, > 10FFFF */
    uint32_t c = k == 2 ? s[0] & 0x1Fu : k == 3 ? s[0] & 0x0Fu : s[0] & 0x07u;
    for (int i = 1; i < k; i++) c = c << 6 | (s[i] & 0x3Fu);
    *cp = c;
    return k;
}

/* Code points a terminal acts on or that reorder the text around them. */
static int unsafe_code_point(uint32_t c) {
    return (c >= 0x80 && c <= 0x9F) || c == 0x2028 || c == 0x2029 || c == 0x200E || c == 0x200F ||
           (c >= 0x202A && c <= 0x202E) || (c >= 0x2066 && c <= 0x2069);
}

/* The escaped form of the byte or UTF-8 sequence at s[i] into unit[48];
 * its length, and in *step the input bytes it stands for. */
static size_t escape_unit(const unsigned char *s, size_t len, size_t i, unsigned flags, char *unit, size_t *step) {
    const int quotes = (flags & DHSA__ESC_QUOTES) != 0, backslash = quotes || (flags & DHSA__ESC_BACKSLASH);
    unsigned char c = s[i];
    uint32_t cp = 0;
    int k = c >= 0x80 ? utf8_seq(s + i, len - i, &cp) : 0;
    size_t ul = 0;
    *step = k ? (size_t)k : 1;
    if (k && !unsafe_code_point(cp)) {
        memcpy(unit, s + i, (size_t)k);
        ul = (size_t)k;
    } else if (k) { /* a valid but unsafe sequence: each byte shown */
        for (int j = 0; j < k; j++) ul += (size_t)snprintf(unit + ul, 48 - ul, "\\x%02x", s[i + j]);
    } else if (c == '\n' || c == '\t' || c == '\r') {
        unit[0] = '\\';
        unit[1] = c == '\n' ? 'n' : c == '\t' ? 't' : 'r';
        ul = 2;
    } else if (c < 0x20 || c == 0x7F || c >= 0x80) {
        ul = (size_t)snprintf(unit, 48, "\\x%02x", c);
    } else if ((c == '\\' && backslash) || ((c == '"' || c == '\'') && quotes)) {
        unit[0] = '\\';
        unit[1] = (char)c;
        ul = 2;
    } else {
        unit[0] = (char)c;
        ul = 1;
    }
    return ul;
}

size_t dhsa__escape(char *out, size_t cap, const char *text, size_t len, unsigned flags) {
    const unsigned char *s = (const unsigned char *)text;
    if (!s) len = 0;
    char unit[48];
    size_t need = 0, step;
    for (size_t i = 0; i < len; i += step) need += escape_unit(s, len, i, flags, unit, &step);
    if (cap == 0) return need;
    /* room for text: cap minus the NUL, minus "..." when it will be cut */
    const int cut = need > cap - 1, ellipsis = cut && (flags & DHSA__ESC_ELLIPSIS);
    size_t room = cap - 1, put = 0;
    if (ellipsis) room = room >= 3 ? room - 3 : 0;
    for (size_t i = 0; i < len; i += step) {
        size_t ul = escape_unit(s, len, i, flags, unit, &step);
        if (put + ul > room) break; /* whole escapes only */
        memcpy(out + put, unit, ul);
        put += ul;
    }
    if (ellipsis) {
        size_t e = cap - 1 - put < 3 ? cap - 1 - put : 3;
        memcpy(out + put, "...", e);
        put += e;
    }
    out[put] = '\0';
    return need;
}

/* Four rotating buffers per thread: enough for the untrusted strings of one
 * error sentence, which dhsa__fail copies before the next call. */
#define ESC_BUFS 4
#define ESC_BUF_BYTES 200
static _Thread_local char esc_buf[ESC_BUFS][ESC_BUF_BYTES];
static _Thread_local unsigned esc_next;

const char *dhsa__escn(const char *s, size_t len) {
    char *b = esc_buf[esc_next++ % ESC_BUFS];
    if (!s) return "(null)";
    dhsa__escape(b, ESC_BUF_BYTES, s, len, DHSA__ESC_QUOTES | DHSA__ESC_ELLIPSIS);
    return b;
}

const char *dhsa__esc(const char *s) { return dhsa__escn(s, s ? strlen(s) : 0); }
