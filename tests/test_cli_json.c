/* test_cli_json.c: the CLI's one JSON writer (tools/lib/cli_json.c, linked as
 * build/libdhsa_cli.a): string escaping in each style the CLI's outputs use
 * (quotes, backslash, control bytes, DEL, UTF-8 passed through or checked),
 * numbers (NaN and infinities as null, the caller's format), nesting and
 * separators. Every check compares the exact bytes written with the
 * expected text; the outputs of peak, bench attn, eval and memprobe were
 * compared byte for byte before and after the writer replaced theirs.
 * Run: make build/tests/test_cli_json && build/tests/test_cli_json
 */
#include "t.h"

#include "cli.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What a writer call wrote, via a memory stream. */
typedef struct {
    char *buf;
    size_t len;
    FILE *f;
} capture;

static void cap_open(capture *c) {
    c->buf = NULL;
    c->len = 0;
    c->f = open_memstream(&c->buf, &c->len);
}

/* Closes the stream, compares with want, frees. */
static void cap_check(capture *c, const char *want, const char *what) {
    fclose(c->f);
    T_CHECK(c->len == strlen(want) && memcmp(c->buf, want, c->len) == 0, "%s: wrote [%.*s], want [%s]", what,
            (int)c->len, c->buf, want);
    free(c->buf);
}

static void check_string(const char *s, unsigned style, const char *want, const char *what) {
    capture c;
    cap_open(&c);
    dhsa_cli_json_string(c.f, s, style);
    cap_check(&c, want, what);
}

static void check_number(const char *fmt, double v, const char *want, const char *what) {
    capture c;
    cap_open(&c);
    dhsa_cli_json_number(c.f, fmt, v);
    cap_check(&c, want, what);
}

static void test_strings(void) {
    /* style 0 (peak, bench attn): only quotes, backslash and C0 escaped */
    check_string("a\"b\\c", 0, "\"a\\\"b\\\\c\"", "quote and backslash");
    check_string("\x01\n\t\x1f", 0, "\"\\u0001\\u000a\\u0009\\u001f\"", "control bytes as \\u00xx");
    check_string("\x7f\xc3\xa9\xff", 0, "\"\x7f\xc3\xa9\xff\"", "DEL and bytes >= 0x80 as they are");
    check_string("", 0, "\"\"", "empty string");
    /* CHECK_UTF8 (eval): valid UTF-8 passes, each invalid byte becomes U+FFFD */
    check_string("\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", DHSA_CLI_JSON_CHECK_UTF8,
                 "\"\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"", "2-, 3- and 4-byte UTF-8 pass through");
    check_string("a\xffz", DHSA_CLI_JSON_CHECK_UTF8, "\"a\\ufffdz\"", "0xff");
    check_string("\xc0\xaf", DHSA_CLI_JSON_CHECK_UTF8, "\"\\ufffd\\ufffd\"", "overlong '/'");
    check_string("\xed\xa0\x80", DHSA_CLI_JSON_CHECK_UTF8, "\"\\ufffd\\ufffd\\ufffd\"", "a surrogate");
    check_string("\xf4\x90\x80\x80", DHSA_CLI_JSON_CHECK_UTF8, "\"\\ufffd\\ufffd\\ufffd\\ufffd\"",
                 "past U+10FFFF");
    check_string("x\xe2\x82", DHSA_CLI_JSON_CHECK_UTF8, "\"x\\ufffd\\ufffd\"", "cut short by the end");
    check_string("\"\n\x7f", DHSA_CLI_JSON_CHECK_UTF8, "\"\\\"\\u000a\x7f\"", "eval: \\n as \\u000a, DEL as is");
    /* SHORT_ESCAPES (memprobe): \n, \t short; DEL escaped; other bytes as they are */
    check_string("a\nb\tc\r\x7f\xff\"\\", DHSA_CLI_JSON_SHORT_ESCAPES, "\"a\\nb\\tc\\u000d\\u007f\xff\\\"\\\\\"",
                 "memprobe's escapes");
}

static void test_numbers(void) {
    check_number("%.6g", 1.5, "1.5", "1.5");
    check_number("%.6g", 1.0 / 3.0, "0.333333", "a third to 6 digits");
    check_number("%.10g", 1234567890.0, "1234567890", "bytes to 10 digits");
    check_number("%.10g", 123456789012.0, "1.23456789e+11", "past 10 digits: an exponent, as before");
    check_number("%.6g", -0.0, "-0", "minus zero");
    check_number("%.6g", NAN, "null", "NaN");
    check_number("%.6g", INFINITY, "null", "+Inf");
    check_number("%.10g", -INFINITY, "null", "-Inf");
}

static void test_nesting(void) {
    capture c;
    cap_open(&c);
    dhsa_cli_json j;
    dhsa_cli_json_init(&j, c.f, 0, "%.6g");
    dhsa_cli_json_object(&j, NULL);
    dhsa_cli_json_array(&j, "a");
    dhsa_cli_json_int(&j, NULL, -9007199254740993LL);
    dhsa_cli_json_object(&j, NULL);
    dhsa_cli_json_null(&j, "b");
    dhsa_cli_json_bool(&j, "c", 1);
    dhsa_cli_json_str(&j, "s", NULL);
    dhsa_cli_json_close(&j);
    dhsa_cli_json_array(&j, NULL);
    dhsa_cli_json_close(&j);
    dhsa_cli_json_close(&j);
    dhsa_cli_json_object(&j, "d");
    dhsa_cli_json_close(&j);
    dhsa_cli_json_num(&j, "k\"ey", NAN);
    dhsa_cli_json_num(&j, "e", 0.25);
    dhsa_cli_json_numf(&j, "p", "%.4f", 0.5);
    dhsa_cli_json_numf(&j, "q", "%.4f", -INFINITY);
    dhsa_cli_json_bool(&j, "f", 0);
    dhsa_cli_json_str(&j, "g", "x\"y");
    dhsa_cli_json_close(&j);
    T_CHECK(j.depth == 0 && !j.too_deep, "depth %d after closing all, too_deep %d", j.depth, j.too_deep);
    dhsa_cli_json_close(&j); /* nothing open: writes nothing */
    cap_check(&c,
              "{\"a\": [-9007199254740993, {\"b\": null, \"c\": true, \"s\": null}, []], \"d\": {}, "
              "\"k\\\"ey\": null, \"e\": 0.25, \"p\": 0.5000, \"q\": null, \"f\": false, \"g\": \"x\\\"y\"}\n",
              "nested object");

    cap_open(&c);
    dhsa_cli_json_init(&j, c.f, 0, "%.6g");
    dhsa_cli_json_object(&j, NULL);
    dhsa_cli_json_close(&j);
    cap_check(&c, "{}\n", "empty top-level object");

    /* deeper than the limit: refused and flagged, never written past the stack */
    cap_open(&c);
    dhsa_cli_json_init(&j, c.f, 0, "%.6g");
    for (int i = 0; i < DHSA_CLI_JSON_MAX_DEPTH + 2; i++) dhsa_cli_json_array(&j, NULL);
    T_CHECK(j.too_deep && j.depth == DHSA_CLI_JSON_MAX_DEPTH, "too deep: flag %d, depth %d", j.too_deep, j.depth);
    fclose(c.f);
    free(c.buf);
}

int main(void) {
    test_strings();
    test_numbers();
    test_nesting();
    return t_report("test_cli_json");
}
