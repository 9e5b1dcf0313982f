/* test_json_constraint.c: sampling constrained to JSON (src/model/json_schema.c, json_constraint.c).
 *
 *   - texts accepted and refused byte by byte: any object (json_object
 *     mode) and schema cases (required, enum, const, anyOf, lengths, item
 *     counts, nesting, whitespace runs, numbers, UTF-8 and escapes);
 *   - schemas refused, naming the keyword (pattern, format, minimum, $ref,
 *     overlapping anyOf, required outside properties, bad JSON);
 *   - the mask (first-byte groups, plain string tokens taken at once)
 *     against running every token's bytes alone, on the shipped model's
 *     vocabulary, GPT-2's (byte-level BPE) and Llama's (SentencePiece with
 *     byte tokens; ../shared/vocab, skipped when absent), with the time
 *     per call;
 *   - 20 answers of the shipped model (models/dhsa-retrieval-8m.gguf)
 *     sampled under a schema, each checked by this file's own JSON reader
 *     and schema check (not the library's automaton);
 *   - `dhsa run --json-schema` (DHSA_CLI): an enum answered exactly, a
 *     refused keyword (exit 2), -n before the value closes (exit 1, said).
 * Run: make build/tests/test_json_constraint && build/tests/test_json_constraint
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli_run.h"
#include "dhsa.h"
#include "t.h"

static dhsa_json_schema *compile(const char *schema) {
    dhsa_json_schema *s = NULL;
    if (dhsa_json_schema_compile(schema, schema ? (int64_t)strlen(schema) : 0, &s))
        fprintf(stderr, "compile failed: %s\n", dhsa_last_error());
    return s;
}

/* 1 when text is accepted whole and can end there */
static int accepts(const dhsa_json_schema *s, const char *text) {
    dhsa_json_constraint *c;
    if (!s || dhsa_json_constraint_create(s, NULL, &c)) return -1;
    int ok = dhsa_json_constraint_feed(c, text, (int64_t)strlen(text)) == DHSA_OK && dhsa_json_constraint_can_end(c);
    dhsa_json_constraint_free(c);
    return ok;
}

static void expect_texts(const char *schema, const char *const *good, const char *const *bad) {
    dhsa_json_schema *s = compile(schema);
    T_CHECK(s != NULL, "schema compiles: %s", schema ? schema : "(json_object)");
    for (int i = 0; good[i]; i++) T_CHECK(accepts(s, good[i]) == 1, "%s accepts %s", schema ? schema : "object", good[i]);
    for (int i = 0; bad[i]; i++) T_CHECK(accepts(s, bad[i]) == 0, "%s refuses %s", schema ? schema : "object", bad[i]);
    dhsa_json_schema_free(s);
}

static void test_object_mode(void) {
    static const char *const good[] = {
        "{}", "{\"a\":1}", " {\"a\" : 1 }", "{\n  \"a\": [1, 2, {\"b\": null}],\n  \"c\": \"x\\u00e9\\n\\\"\"\n}",
        "{\"d\":-0.5e+10,\"e\":true,\"f\":false,\"g\":0,\"h\":1E3,\"i\":[]}", "{\"k\":\"\xc3\xa9\xf0\x9f\x98\x80\"}",
        "{\"\":{\"\":{}}}", "{\"a\":\"\\/\\b\\f\\r\\t\\\\\"}", NULL};
    static const char *const bad[] = {
        "[]", "1", "\"x\"", "{\"a\":1,}", "{\"a\" 1}", "{a:1}", "{\"a\":01}", "{\"a\":1.}", "{\"a\":.5}",
        "{\"a\":\"\x01\"}", "{\"a\":\"\\ud800\"}", "{\"a\":\"\xc0\xaf\"}", "{\"a\":\"\xed\xa0\x80\"}", "{} ",
        "{}\n", "\n\n{}", "{\"a\":tru}", "{\"a\":1}}", "{\"a\":\"\\x\"}", "{\"a\":+1}", "{\"a\":1e}", "{\"a\"::1}",
        "{\r\"a\":1}", "{\"a\":[1 2]}", "{\"a\":nul}", "{", "{\"a\":", NULL};
    expect_texts(NULL, good, bad);
    /* whitespace: one byte, or a newline and 4 blanks per container open */
    dhsa_json_schema *s = compile(NULL);
    T_CHECK(accepts(s, "{\n    \"a\": [\n\t\t\t\t\t\t\t\t1]}") == 1, "indentation of 4 and 8");
    T_CHECK(accepts(s, "{\n     \"a\":1}") == 0, "5 blanks at one level refused");
    T_CHECK(accepts(s, "{  \"a\":1}") == 0, "two spaces refused");
    T_CHECK(accepts(s, "{ \n}") == 0, "a newline after a space refused");
    T_CHECK(accepts(s, "\n{}") == 1 && accepts(s, "\n {}") == 0, "before the value: one byte");
    /* nesting: 32 values deep, not 33 */
    char deep[80] = "{\"a\":", deeper[80] = "{\"a\":";
    for (int i = 0; i < 31; i++) strcat(deep, "[");
    for (int i = 0; i < 31; i++) strcat(deep, "]");
    strcat(deep, "}");
    for (int i = 0; i < 32; i++) strcat(deeper, "[");
    for (int i = 0; i < 32; i++) strcat(deeper, "]");
    strcat(deeper, "}");
    T_CHECK(accepts(s, deep) == 1, "32 levels");
    T_CHECK(accepts(s, deeper) == 0, "33 levels refused");
    /* state: can_end, finished, a failed feed leaves it as it was */
    dhsa_json_constraint *c;
    T_CHECK(dhsa_json_constraint_create(s, NULL, &c) == DHSA_OK, "create");
    T_CHECK(dhsa_json_constraint_feed(c, "{\"a\":", 5) == DHSA_OK && !dhsa_json_constraint_can_end(c), "open");
    T_CHECK(dhsa_json_constraint_feed(c, "]", 1) == DHSA_ERR_FORMAT, "] refused: %s", dhsa_last_error());
    T_CHECK(dhsa_json_constraint_feed(c, "12}", 3) == DHSA_OK && dhsa_json_constraint_finished(c), "the state survived");
    T_CHECK(dhsa_json_constraint_feed(c, " ", 1) == DHSA_ERR_FORMAT, "nothing after the end");
    dhsa_json_constraint_reset(c);
    T_CHECK(!dhsa_json_constraint_can_end(c) && dhsa_json_constraint_feed(c, "{}", 2) == DHSA_OK, "reset");
    dhsa_json_constraint_free(c);
    dhsa_json_schema_free(s);
}

#define PERSON                                                                                                  \
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":5},"       \
    "\"age\":{\"type\":\"integer\"},\"color\":{\"enum\":[\"red\",\"green\",\"blue\"]},\"ok\":{\"type\":"           \
    "\"boolean\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":4},\"minItems\":1,"    \
    "\"maxItems\":2},\"score\":{\"type\":[\"number\",\"null\"]}},\"required\":[\"name\",\"age\"],"                 \
    "\"additionalProperties\":false}"

static void test_schemas(void) {
    static const char *const g1[] = {
        "{\"name\":\"Al\",\"age\":30}", "{\"age\":-3,\"name\":\"\xc3\xa9t\xc3\xa9\",\"color\":\"red\"}",
        "{\"name\":\"abcde\",\"age\":0,\"ok\":false,\"tags\":[\"a\",\"bcde\"],\"score\":null}",
        "{\"score\":2.5e-3,\"tags\":[\"\"],\"age\":1,\"name\":\"\\n\"}", NULL};
    static const char *const b1[] = {
        "{\"name\":\"Al\"}", "{}", "{\"name\":\"Al\",\"age\":3.5}", "{\"x\":1,\"name\":\"a\",\"age\":1}",
        "{\"name\":\"a\",\"name\":\"b\",\"age\":1}", "{\"name\":\"abcdef\",\"age\":1}", "{\"name\":\"\",\"age\":1}",
        "{\"name\":\"a\",\"age\":1,\"color\":\"pink\"}", "{\"name\":\"a\",\"age\":1,\"tags\":[]}",
        "{\"name\":\"a\",\"age\":1,\"tags\":[\"a\",\"b\",\"c\"]}", "{\"name\":\"a\",\"age\":1e5}",
        "{\"name\":\"a\",\"age\":1,\"ok\":null}", "{\"name\":\"a\",\"age\":1,\"score\":\"1\"}",
        "{\"name\":\"a\",\"age\":12345678901234567}", "{\"name\":\"a\",\"age\":1,\"tags\":[\"abcde\"]}", NULL};
    expect_texts(PERSON, g1, b1);

    static const char *const g2[] = {"\"x\"", "null", " null", NULL}, *const b2[] = {"1", "nul", "\"x\" ", "{}", NULL};
    expect_texts("{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]}", g2, b2);
    static const char *const g3[] = {"1", "12", NULL}, *const b3[] = {"2", "123", "1.0", NULL};
    expect_texts("{\"enum\":[1,12]}", g3, b3);
    static const char *const g4[] = {"{\"a\":[1,2]}", NULL}, *const b4[] = {"{\"a\":[1, 2]}", "{\"a\":[1]}", NULL};
    expect_texts("{\"const\":{\"a\":[1,2]}}", g4, b4);
    static const char *const g5[] = {"{\"x\":1,\"y\":-2}", "{}", NULL}, *const b5[] = {"{\"x\":\"s\"}", NULL};
    expect_texts("{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}", g5, b5);
    static const char *const g6[] = {"[[1],[]]", "[]", NULL}, *const b6[] = {"[[1],[],[]]", "[1]", "{}", NULL};
    expect_texts("{\"type\":\"array\",\"maxItems\":2,\"items\":{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}}",
                 g6, b6);
    static const char *const g7[] = {"{}", NULL}, *const b7[] = {"{\"a\":1}", NULL};
    expect_texts("{\"type\":\"object\",\"additionalProperties\":false}", g7, b7);
    static const char *const g8[] = {"\"\\u00e9\\u0041\"", "\"\\\"q\"", NULL}, *const b8[] = {"\"abc\"", NULL};
    expect_texts("{\"type\":\"string\",\"maxLength\":2,\"title\":\"t\",\"description\":\"d\"}", g8, b8);
    static const char *const g9[] = {"true", "-1.5", "[\"a\",{}]", "{\"q\":[null]}", NULL}, *const b9[] = {"tr", NULL};
    expect_texts("{}", g9, b9);
    expect_texts("true", g9, b9);
    static const char *const g10[] = {"{\"k\\\"\\\\\":1}", NULL}, *const b10[] = {"{\"k\":1}", NULL};
    expect_texts("{\"properties\":{\"k\\\"\\\\\":{\"type\":\"integer\"}},\"required\":[\"k\\\"\\\\\"]}", g10, b10);

    /* a top-level number ends only where the text ends */
    dhsa_json_schema *s = compile("{\"type\":\"number\"}");
    dhsa_json_constraint *c;
    T_CHECK(s && dhsa_json_constraint_create(s, NULL, &c) == DHSA_OK, "number schema");
    if (s && c) {
        T_CHECK(dhsa_json_constraint_feed(c, "12", 2) == DHSA_OK && dhsa_json_constraint_can_end(c) &&
                    !dhsa_json_constraint_finished(c), "12 may end, may go on");
        dhsa_json_constraint_free(c);
    }
    dhsa_json_schema_free(s);
}

static void refused(const char *schema, dhsa_status want, const char *word) {
    dhsa_json_schema *s = (dhsa_json_schema *)1;
    dhsa_status st = dhsa_json_schema_compile(schema, (int64_t)strlen(schema), &s);
    T_CHECK(st == want && s == NULL && strstr(dhsa_last_error(), word), "%s: %s (%s), want %s naming \"%s\"", schema,
            dhsa_status_str(st), dhsa_last_error(), dhsa_status_str(want), word);
}

static void test_refusals(void) {
    refused("{\"type\":\"string\",\"pattern\":\"a+\"}", DHSA_ERR_UNSUPPORTED, "\"pattern\"");
    refused("{\"type\":\"string\",\"format\":\"date\"}", DHSA_ERR_UNSUPPORTED, "\"format\"");
    refused("{\"properties\":{\"n\":{\"type\":\"integer\",\"minimum\":3}}}", DHSA_ERR_UNSUPPORTED, "/properties/n");
    refused("{\"$ref\":\"#/$defs/a\"}", DHSA_ERR_UNSUPPORTED, "inline");
    refused("{\"anyOf\":[{\"type\":\"string\"},{\"enum\":[\"a\"]}]}", DHSA_ERR_UNSUPPORTED, "begin with '\"'");
    refused("{\"properties\":{\"a\":{}},\"required\":[\"b\"]}", DHSA_ERR_INVALID_ARG, "\"b\"");
    refused("{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", DHSA_ERR_INVALID_ARG, "minItems");
    refused("{\"type\":\"array\",\"items\":[{}]}", DHSA_ERR_UNSUPPORTED, "tuple");
    refused("{\"type\":\"strin\"}", DHSA_ERR_INVALID_ARG, "strin");
    refused("{\"enum\":[]}", DHSA_ERR_INVALID_ARG, "enum");
    refused("{\"type\":\"string\",\"enum\":[1]}", DHSA_ERR_INVALID_ARG, "enum");
    refused("false", DHSA_ERR_INVALID_ARG, "false");
    refused("{\"type\":\"object\"", DHSA_ERR_FORMAT, "not valid JSON");
    refused("{\"type\":\"object\",\"type\":\"array\"}", DHSA_ERR_FORMAT, "repeats");
    refused("{\"type\":\"object\"} x", DHSA_ERR_FORMAT, "after");
    refused("{\"items\":{},\"properties\":{}}", DHSA_ERR_UNSUPPORTED, "type");
    refused("{\"enum\":[\"a\"],\"maxLength\":3}", DHSA_ERR_UNSUPPORTED, "maxLength");
    char big[4096] = "{\"properties\":{";
    for (int i = 0; i < 65; i++) snprintf(big + strlen(big), sizeof big - strlen(big), "%s\"p%d\":{}", i ? "," : "", i);
    strcat(big, "}}");
    refused(big, DHSA_ERR_UNSUPPORTED, "64");
    char deep[512] = "";
    for (int i = 0; i < 40; i++) strcat(deep, "{\"items\":");
    strcat(deep, "{}");
    for (int i = 0; i < 40; i++) strcat(deep, "}");
    refused(deep, DHSA_ERR_UNSUPPORTED, "deeper");
}

/* --------------------------------------------------------------------- */
/* The mask against each token run alone                                  */

static const char *const walk_texts[] = {
    "{\"name\":\"Al \xc3\xa9 x\",\"age\":30,\"tags\":[\"ab\",\"c\"],\"score\":-1.25e+2,\"ok\":true,\"color\":\"green\"}",
    "{\"age\": 7, \"name\": \"Zo\"}", NULL};

static void mask_matches(const char *what, const dhsa_json_schema *s, const dhsa_json_vocab *v, int64_t V,
                         const char *text, double *ms, int64_t *calls) {
    dhsa_json_constraint *c, *ref;
    if (dhsa_json_constraint_create(s, v, &c) || dhsa_json_constraint_create(s, v, &ref)) {
        T_CHECK(0, "create: %s", dhsa_last_error());
        return;
    }
    float *lg = malloc((size_t)V * sizeof(float));
    int bad = 0;
    int32_t end = 0;
    for (size_t at = 0; at <= strlen(text) && lg; at++) {
        dhsa_json_constraint_reset(c);
        dhsa_json_constraint_reset(ref);
        if (dhsa_json_constraint_feed(c, text, (int64_t)at) || dhsa_json_constraint_feed(ref, text, (int64_t)at)) break;
        for (int64_t i = 0; i < V; i++) lg[i] = 0.0f;
        int64_t n_allowed = 0;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        dhsa_status st = dhsa_json_constraint_mask(c, lg, &end, 1, &n_allowed);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        *ms += (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-6;
        (*calls)++;
        if (st && at < strlen(text)) {
            bad++;
            fprintf(stderr, "%s: mask at %zu: %s\n", what, at, dhsa_last_error());
            continue;
        }
        int64_t count = 0;
        for (int64_t i = 0; i < V; i++) {
            int want = i == end ? dhsa_json_constraint_can_end(ref) : dhsa_json_constraint_allows(ref, (int32_t)i);
            int got = lg[i] == 0.0f;
            count += got;
            if (want != got && bad++ < 5)
                fprintf(stderr, "%s: after %zu bytes, token %lld: mask %d, alone %d\n", what, at, (long long)i, got, want);
        }
        if (count != n_allowed && bad++ < 5) fprintf(stderr, "%s: n_allowed %lld, counted %lld\n", what, (long long)n_allowed, (long long)count);
    }
    T_CHECK(bad == 0 && lg, "%s: the mask equals each token run alone at every prefix (%d differences)", what, bad);
    free(lg);
    dhsa_json_constraint_free(c);
    dhsa_json_constraint_free(ref);
}

static void test_mask(void) {
    static const char *const vocabs[3] = {"models/dhsa-retrieval-8m.gguf", "../shared/vocab/ggml-vocab-gpt-2.gguf",
                                          "../shared/vocab/ggml-vocab-llama-spm.gguf"};
    dhsa_json_schema *person = compile(PERSON), *obj = compile(NULL);
    for (int k = 0; k < 3; k++) {
        dhsa_gguf *g;
        if (dhsa_gguf_open(vocabs[k], &g)) {
            T_SKIP(4, "%s is absent", vocabs[k]);
            continue;
        }
        dhsa_tokenizer *tok;
        dhsa_json_vocab *v = NULL;
        if (dhsa_tokenizer_from_gguf(g, &tok) || dhsa_json_vocab_create(tok, &v)) {
            T_CHECK(0, "%s: %s", vocabs[k], dhsa_last_error());
            dhsa_gguf_close(g);
            continue;
        }
        const int64_t V = dhsa_tokenizer_n_vocab(tok);
        double ms = 0;
        int64_t calls = 0;
        for (int i = 0; walk_texts[i]; i++) {
            char what[128];
            snprintf(what, sizeof what, "%s, person, text %d", vocabs[k], i);
            mask_matches(what, person, v, V, walk_texts[i], &ms, &calls);
            snprintf(what, sizeof what, "%s, object, text %d", vocabs[k], i);
            mask_matches(what, obj, v, V, walk_texts[i], &ms, &calls);
        }
        printf("mask on %s (%lld tokens): %.3f ms per call (mean of %lld)\n", vocabs[k], (long long)V,
               ms / (double)calls, (long long)calls);
        dhsa_json_vocab_free(v);
        dhsa_tokenizer_free(tok);
        dhsa_gguf_close(g);
    }
    dhsa_json_schema_free(person);
    dhsa_json_schema_free(obj);
}

/* --------------------------------------------------------------------- */
/* An independent reader of what the model wrote                           */

typedef struct {
    const char *p;
    int64_t i, n;
} rd;

static void ws(rd *r) {
    while (r->i < r->n && strchr(" \t\n\r", r->p[r->i])) r->i++;
}

/* A JSON string; its code points in *cps, the text (if out) in out[cap]. */
static int rd_string(rd *r, char *out, int cap, int *cps) {
    if (r->i >= r->n || r->p[r->i] != '"') return 0;
    r->i++;
    int k = 0, o = 0;
    while (r->i < r->n && r->p[r->i] != '"') {
        unsigned char c = (unsigned char)r->p[r->i++];
        if (c < 0x20) return 0;
        if (c == '\\') {
            if (r->i >= r->n) return 0;
            char e = r->p[r->i++];
            if (e == 'u') {
                for (int j = 0; j < 4; j++)
                    if (r->i >= r->n || !strchr("0123456789abcdefABCDEF", r->p[r->i++])) return 0;
            } else if (!strchr("\"\\/bfnrt", e)) {
                return 0;
            }
            k++;
        } else if ((c & 0xC0) != 0x80) {
            k++;
        }
        if (out && o < cap - 1) out[o++] = (char)c;
    }
    if (r->i >= r->n) return 0;
    r->i++;
    if (out) out[o] = 0;
    *cps = k;
    return 1;
}

static int rd_value(rd *r, int depth);

static int rd_number(rd *r, int *integer) {
    int64_t s = r->i;
    if (r->i < r->n && r->p[r->i] == '-') r->i++;
    int64_t d = r->i;
    while (r->i < r->n && r->p[r->i] >= '0' && r->p[r->i] <= '9') r->i++;
    if (r->i == d || (r->p[d] == '0' && r->i - d > 1)) return 0;
    *integer = 1;
    if (r->i < r->n && r->p[r->i] == '.') {
        *integer = 0;
        int64_t f = ++r->i;
        while (r->i < r->n && r->p[r->i] >= '0' && r->p[r->i] <= '9') r->i++;
        if (r->i == f) return 0;
    }
    if (r->i < r->n && (r->p[r->i] == 'e' || r->p[r->i] == 'E')) {
        *integer = 0;
        r->i++;
        if (r->i < r->n && (r->p[r->i] == '+' || r->p[r->i] == '-')) r->i++;
        int64_t e = r->i;
        while (r->i < r->n && r->p[r->i] >= '0' && r->p[r->i] <= '9') r->i++;
        if (r->i == e) return 0;
    }
    return r->i > s;
}

static int rd_value(rd *r, int depth) {
    ws(r);
    if (r->i >= r->n || depth > 64) return 0;
    char c = r->p[r->i];
    int k, integer;
    if (c == '"') return rd_string(r, NULL, 0, &k);
    if (c == '{' || c == '[') {
        r->i++;
        ws(r);
        if (r->i < r->n && r->p[r->i] == (c == '{' ? '}' : ']')) return r->i++, 1;
        for (;;) {
            if (c == '{') {
                ws(r);
                if (!rd_string(r, NULL, 0, &k)) return 0;
                ws(r);
                if (r->i >= r->n || r->p[r->i++] != ':') return 0;
            }
            if (!rd_value(r, depth + 1)) return 0;
            ws(r);
            if (r->i < r->n && r->p[r->i] == ',') {
                r->i++;
                continue;
            }
            if (r->i < r->n && r->p[r->i] == (c == '{' ? '}' : ']')) return r->i++, 1;
            return 0;
        }
    }
    for (int w = 0; w < 3; w++) {
        const char *word = w == 0 ? "true" : w == 1 ? "false" : "null";
        if (r->n - r->i >= (int64_t)strlen(word) && memcmp(r->p + r->i, word, strlen(word)) == 0) {
            r->i += (int64_t)strlen(word);
            return 1;
        }
    }
    return rd_number(r, &integer);
}

/* The schema of the model test, checked by hand: an object with name (a
 * string of 1 to 12 code points) and n (an integer), both required, kind
 * one of "a", "b", "c", flag a boolean, list an array of 0 to 3 integers;
 * nothing else, each once. Returns 1 valid, 0 not (why in why). */
#define ANSWER_SCHEMA                                                                                          \
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":12},"      \
    "\"n\":{\"type\":\"integer\"},\"kind\":{\"enum\":[\"a\",\"b\",\"c\"]},\"flag\":{\"type\":\"boolean\"},"       \
    "\"list\":{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"maxItems\":3}},\"required\":[\"name\",\"n\"]}"

static int check_answer(const char *text, int64_t len, const char **why) {
    rd r = {text, 0, len};
    *why = "not an object";
    ws(&r);
    if (r.i >= r.n || text[r.i] != '{') return 0;
    r.i++;
    int seen[5] = {0};
    static const char *const names[5] = {"name", "n", "kind", "flag", "list"};
    ws(&r);
    if (r.i < r.n && text[r.i] == '}') {
        *why = "required names missing";
        return 0;
    }
    for (;;) {
        char key[64];
        int k, cps, integer;
        ws(&r);
        *why = "a bad member name";
        if (!rd_string(&r, key, sizeof key, &k)) return 0;
        int which = -1;
        for (int i = 0; i < 5; i++)
            if (strcmp(key, names[i]) == 0) which = i;
        *why = "an unknown or repeated member";
        if (which < 0 || seen[which]++) return 0;
        ws(&r);
        *why = "no colon";
        if (r.i >= r.n || text[r.i++] != ':') return 0;
        ws(&r);
        *why = "a value of the wrong type";
        if (which == 0) {
            if (!rd_string(&r, NULL, 0, &cps) || cps < 1 || cps > 12) return 0;
        } else if (which == 1) {
            if (!rd_number(&r, &integer) || !integer) return 0;
        } else if (which == 2) {
            char v[8];
            if (!rd_string(&r, v, sizeof v, &cps) || (strcmp(v, "a") && strcmp(v, "b") && strcmp(v, "c"))) return 0;
        } else if (which == 3) {
            if (r.n - r.i >= 4 && memcmp(text + r.i, "true", 4) == 0) r.i += 4;
            else if (r.n - r.i >= 5 && memcmp(text + r.i, "false", 5) == 0) r.i += 5;
            else return 0;
        } else {
            if (r.i >= r.n || text[r.i++] != '[') return 0;
            int items = 0;
            ws(&r);
            if (r.i < r.n && text[r.i] == ']') r.i++;
            else
                for (;;) {
                    ws(&r);
                    if (!rd_number(&r, &integer) || !integer || ++items > 3) return 0;
                    ws(&r);
                    if (r.i < r.n && text[r.i] == ',') r.i++;
                    else if (r.i < r.n && text[r.i] == ']') {
                        r.i++;
                        break;
                    } else return 0;
                }
        }
        ws(&r);
        *why = "no , or }";
        if (r.i < r.n && text[r.i] == ',') {
            r.i++;
            continue;
        }
        if (r.i < r.n && text[r.i] == '}') {
            r.i++;
            break;
        }
        return 0;
    }
    *why = "required names missing";
    if (!seen[0] || !seen[1]) return 0;
    *why = "text after the object";
    if (r.i != r.n) return 0;
    rd all = {text, 0, len};
    *why = "not JSON";
    if (!rd_value(&all, 0) || all.i != len) return 0;
    return 1;
}

static void test_model(void) {
    const char *path = "models/dhsa-retrieval-8m.gguf";
    dhsa_model *m;
    dhsa_model_params mp = dhsa_model_default_params();
    if (dhsa_model_load(path, &mp, &m)) {
        T_SKIP(3, "%s: %s", path, dhsa_last_error());
        return;
    }
    const dhsa_tokenizer *tok = dhsa_model_tokenizer(m);
    const int64_t V = dhsa_model_get_info(m)->n_vocab;
    dhsa_ctx *ctx;
    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = 1;
    dhsa_session_params sp = dhsa_session_default_params();
    sp.n_ctx = 512 + 64;
    sp.attn = DHSA_ATTN_DENSE;
    dhsa_session *s;
    dhsa_json_schema *schema = compile(ANSWER_SCHEMA);
    dhsa_json_vocab *jv = NULL;
    dhsa_json_constraint *jc = NULL;
    float *lg = malloc((size_t)V * sizeof(float));
    if (dhsa_ctx_create(&cp, &ctx) || dhsa_session_create(ctx, m, &sp, &s) || !schema ||
        dhsa_json_vocab_create(tok, &jv) || dhsa_json_constraint_create(schema, jv, &jc) || !lg) {
        T_CHECK(0, "setup: %s", dhsa_last_error());
        return;
    }
    const char *prompt = "The record as JSON: ";
    int32_t ids[256];
    int64_t n_ids = 0;
    int32_t end = dhsa_tokenizer_eos(tok);
    int valid = 0, complete = 0;
    const int max_tokens = 480;
    for (int a = 0; a < 20; a++) {
        dhsa_sampler_params smp_p = dhsa_sampler_default_params();
        smp_p.temperature = 1.0f;
        smp_p.seed = 1000 + (uint64_t)a;
        dhsa_sampler *smp;
        dhsa_session_reset(s);
        dhsa_json_constraint_reset(jc);
        if (dhsa_tokenize(tok, prompt, (int64_t)strlen(prompt), dhsa_tokenizer_default_flags(tok), ids, 256, &n_ids) ||
            dhsa_sampler_create(&smp_p, V, &smp) || dhsa_session_eval(s, ids, n_ids, lg)) {
            T_CHECK(0, "answer %d: %s", a, dhsa_last_error());
            break;
        }
        char text[4096];
        int64_t len = 0;
        int done = 0;
        for (int k = 0; k < max_tokens && !done; k++) {
            int32_t next;
            if (dhsa_json_constraint_mask(jc, lg, &end, end >= 0, NULL) ||
                dhsa_sampler_sample(smp, lg, NULL, 0, &next)) {
                fprintf(stderr, "answer %d: %s\n", a, dhsa_last_error());
                break;
            }
            if (next == end) {
                done = 1;
                break;
            }
            if (dhsa_json_constraint_accept(jc, next)) {
                fprintf(stderr, "answer %d: %s\n", a, dhsa_last_error());
                break;
            }
            int64_t pl = 0;
            dhsa_token_to_piece(tok, next, 0, text + len, (int64_t)sizeof text - 1 - len, &pl);
            len += pl;
            if (dhsa_json_constraint_finished(jc)) done = 1;
            else if (dhsa_session_eval(s, &next, 1, lg)) break;
        }
        text[len] = 0;
        dhsa_sampler_free(smp);
        const char *why = "the answer did not end";
        complete += done;
        int ok = done && check_answer(text, len, &why);
        valid += ok;
        if (!ok) fprintf(stderr, "answer %d invalid (%s): %s\n", a, why, text);
        if (a < 3) printf("answer %d: %s\n", a, text);
    }
    T_CHECK(complete == 20, "%d of 20 answers ended within %d tokens", complete, max_tokens);
    T_CHECK(valid == 20, "%d of 20 answers valid under the schema", valid);
    /* the checker itself refuses what breaks the schema */
    static const char *const wrong[] = {"{\"name\":\"x\"}", "{\"name\":\"\",\"n\":1}", "{\"name\":\"x\",\"n\":1.5}",
                                        "{\"name\":\"x\",\"n\":1,\"kind\":\"d\"}", "{\"name\":\"x\",\"n\":1,\"z\":1}",
                                        "{\"name\":\"x\",\"n\":1,\"list\":[1,2,3,4]}", "{\"name\":\"x\",\"n\":1} ",
                                        "{\"name\":\"x\",\"n\":1", NULL};
    int refused_all = 1;
    const char *why;
    for (int i = 0; wrong[i]; i++) refused_all &= !check_answer(wrong[i], (int64_t)strlen(wrong[i]), &why);
    const char *right = "{ \"n\": -3, \"name\": \"\xc3\xa9\" }";
    T_CHECK(refused_all && check_answer(right, (int64_t)strlen(right), &why), "the checker's own cases");
    dhsa_json_constraint_free(jc);
    dhsa_json_vocab_free(jv);
    dhsa_json_schema_free(schema);
    free(lg);
    dhsa_session_free(s);
    dhsa_ctx_free(ctx);
    dhsa_model_free(m);
}

static void test_cli(void) {
    if (!getenv("DHSA_CLI")) {
        T_SKIP(3, "DHSA_CLI is not set (tests/run.sh sets it): the CLI is not tested");
        return;
    }
    char *out = NULL;
    int rc = cli_run("run -p 'The color is' -n 8 --temp 1 --seed 3 --json-schema "
                     "'{\"enum\": [\"red\", \"green\", 12]}'", 1, &out);
    T_CHECK(rc == 0 && out && (strcmp(out, "\"red\"\n") == 0 || strcmp(out, "\"green\"\n") == 0 ||
                               strcmp(out, "12\n") == 0 || strcmp(out, " \"red\"\n") == 0 ||
                               strcmp(out, " \"green\"\n") == 0 || strcmp(out, " 12\n") == 0),
            "run --json-schema with an enum: exit %d, stdout \"%s\"", rc, out ? out : "");
    free(out);
    rc = cli_run("run -p x --json-schema '{\"type\": \"string\", \"pattern\": \"a\"}'", 0, &out);
    T_CHECK(rc == 2 && out && strstr(out, "\"pattern\""), "a refused keyword: exit %d: %s", rc, out ? out : "");
    free(out);
    rc = cli_run("run -p x -n 2 --json", 0, &out);
    T_CHECK(rc == 1 && out && strstr(out, "finish: length") && strstr(out, "not valid JSON"),
            "-n before the value closes: exit %d: %s", rc, out ? out : "");
    free(out);
}

int main(void) {
    test_object_mode();
    test_schemas();
    test_refusals();
    test_mask();
    test_model();
    test_cli();
    return t_report("test_json_constraint");
}
