/* cli_json.c: the one JSON writer behind every --json output of the dhsa
 * CLI (peak, bench attn, sparse and decode, eval, memprobe). It writes to a
 * FILE as it goes, with the separators the CLI has always printed (", "
 * between items, ": " after a key) and one object per line, so scripts
 * that read the old outputs read these byte for byte.
 *
 * Depends on libc and libm only (no dhsa_cli_die, nothing of libdhsa), so
 * tests link it as build/libdhsa_cli.a without compiling tools/ sources:
 * tests/test_cli_json.c checks escaping, nesting and numbers. The server
 * (tools/serve*.c) builds its JSON with jansson and does not use this.
 */
#include "cli.h"

#include <math.h>
#include <stdio.h>

/* Length of the valid UTF-8 sequence at s (1-4), or 0 when s starts an
 * invalid one (stray continuation byte, overlong form, surrogate, past
 * U+10FFFF, or cut short by the NUL). */
static int utf8_length(const unsigned char *s) {
    int n = s[0] >= 0xC2 && s[0] <= 0xDF ? 2 : s[0] >= 0xE0 && s[0] <= 0xEF ? 3 : s[0] >= 0xF0 && s[0] <= 0xF4 ? 4 : 0;
    for (int i = 1; i < n; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    if (n == 3 && ((s[0] == 0xE0 && s[1] < 0xA0) || (s[0] == 0xED && s[1] > 0x9F))) return 0;
    if (n == 4 && ((s[0] == 0xF0 && s[1] < 0x90) || (s[0] == 0xF4 && s[1] > 0x8F))) return 0;
    return n;
}

void dhsa_cli_json_string(FILE *f, const char *s, unsigned style) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') {
            fputc('\\', f);
            fputc(*p, f);
        } else if ((style & DHSA_CLI_JSON_SHORT_ESCAPES) && *p == '\n') {
            fputs("\\n", f);
        } else if ((style & DHSA_CLI_JSON_SHORT_ESCAPES) && *p == '\t') {
            fputs("\\t", f);
        } else if (*p < 0x20 || (*p == 0x7f && (style & DHSA_CLI_JSON_SHORT_ESCAPES))) {
            fprintf(f, "\\u%04x", *p);
        } else if (*p < 0x80 || !(style & DHSA_CLI_JSON_CHECK_UTF8)) {
            fputc(*p, f);
        } else {
            int n = utf8_length(p);
            if (n) {
                fwrite(p, 1, (size_t)n, f);
                p += n - 1;
            } else {
                fputs("\\ufffd", f);
            }
        }
    }
    fputc('"', f);
}

void dhsa_cli_json_number(FILE *f, const char *fmt, double v) {
    if (isfinite(v))
        fprintf(f, fmt, v);
    else
        fputs("null", f); /* JSON has no NaN or Inf */
}

/* ---------------------------------------------------------- the writer --- */

void dhsa_cli_json_init(dhsa_cli_json *j, FILE *f, unsigned style, const char *number_format) {
    *j = (dhsa_cli_json){.f = f, .style = style, .number_format = number_format};
}

/* Before a value: the separator from the item before it, then the key
 * inside an object (NULL inside an array and at the top). */
static void item(dhsa_cli_json *j, const char *key) {
    if (j->depth > 0 && j->items[j->depth - 1]++) fputs(", ", j->f);
    if (key) {
        dhsa_cli_json_string(j->f, key, j->style);
        fputs(": ", j->f);
    }
}

static void open_level(dhsa_cli_json *j, const char *key, char kind) {
    item(j, key);
    if (j->depth == DHSA_CLI_JSON_MAX_DEPTH) {
        j->too_deep = 1; /* a bug of the caller: the output will not parse */
        return;
    }
    fputc(kind, j->f);
    j->kind[j->depth] = kind == '{' ? '}' : ']';
    j->items[j->depth++] = 0;
}

void dhsa_cli_json_object(dhsa_cli_json *j, const char *key) { open_level(j, key, '{'); }
void dhsa_cli_json_array(dhsa_cli_json *j, const char *key) { open_level(j, key, '['); }

void dhsa_cli_json_close(dhsa_cli_json *j) {
    if (j->depth == 0) return;
    fputc(j->kind[--j->depth], j->f);
    if (j->depth == 0) fputc('\n', j->f);
}

void dhsa_cli_json_str(dhsa_cli_json *j, const char *key, const char *s) {
    item(j, key);
    if (s)
        dhsa_cli_json_string(j->f, s, j->style);
    else
        fputs("null", j->f);
}

void dhsa_cli_json_num(dhsa_cli_json *j, const char *key, double v) {
    item(j, key);
    dhsa_cli_json_number(j->f, j->number_format, v);
}

void dhsa_cli_json_numf(dhsa_cli_json *j, const char *key, const char *fmt, double v) {
    item(j, key);
    dhsa_cli_json_number(j->f, fmt, v);
}

void dhsa_cli_json_int(dhsa_cli_json *j, const char *key, int64_t v) {
    item(j, key);
    fprintf(j->f, "%lld", (long long)v);
}

void dhsa_cli_json_bool(dhsa_cli_json *j, const char *key, int v) {
    item(j, key);
    fputs(v ? "true" : "false", j->f);
}

void dhsa_cli_json_null(dhsa_cli_json *j, const char *key) {
    item(j, key);
    fputs("null", j->f);
}
