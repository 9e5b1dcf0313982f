/* json_fuzz.c: libFuzzer harness for structured output's parsers
 * (src/model/json_schema.c, json_constraint.c): the schema reader and compiler, and the
 * byte automaton. Input: byte 0 picks the mode; with bit 0 clear the rest
 * is a schema (compiled; when it compiles, a constraint on it is fed a few
 * fixed texts and the input itself), with it set the rest is text fed byte
 * by byte to "any object" and to the schema {"type": ["string", "null"]}.
 * Checked on every byte: a refused byte leaves the state as it was (can_end
 * and finished unchanged, the next byte sees the same state as a fresh
 * replay), finished implies can_end. A broken contract aborts.
 * Run: make fuzz (FUZZ_SECONDS per harness).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dhsa.h"

static void fail(const char *what) {
    fprintf(stderr, "json_fuzz: broken contract: %s\n", what);
    abort();
}

static void feed_bytes(const dhsa_json_schema *s, const uint8_t *p, size_t n) {
    dhsa_json_constraint *c, *replay;
    if (dhsa_json_constraint_create(s, NULL, &c)) return;
    if (dhsa_json_constraint_create(s, NULL, &replay)) {
        dhsa_json_constraint_free(c);
        return;
    }
    size_t kept = 0;
    char *acc = malloc(n + 1);
    if (!acc) fail("malloc");
    for (size_t i = 0; i < n; i++) {
        int end0 = dhsa_json_constraint_can_end(c), fin0 = dhsa_json_constraint_finished(c);
        dhsa_status st = dhsa_json_constraint_feed(c, (const char *)p + i, 1);
        if (st == DHSA_OK) {
            acc[kept++] = (char)p[i];
        } else {
            if (st != DHSA_ERR_FORMAT) fail("a refused byte is not DHSA_ERR_FORMAT");
            if (dhsa_json_constraint_can_end(c) != end0 || dhsa_json_constraint_finished(c) != fin0)
                fail("a refused byte changed the state");
        }
        if (dhsa_json_constraint_finished(c) && !dhsa_json_constraint_can_end(c)) fail("finished but cannot end");
    }
    /* the accepted bytes replayed in one call reach the same state */
    dhsa_json_constraint_reset(replay);
    if (dhsa_json_constraint_feed(replay, acc, (int64_t)kept) != DHSA_OK) fail("the accepted bytes refused on replay");
    if (dhsa_json_constraint_can_end(replay) != dhsa_json_constraint_can_end(c) ||
        dhsa_json_constraint_finished(replay) != dhsa_json_constraint_finished(c))
        fail("replay reached another state");
    free(acc);
    dhsa_json_constraint_free(replay);
    dhsa_json_constraint_free(c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 65536) return 0;
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    if (!(data[0] & 1)) {
        dhsa_json_schema *s = NULL;
        dhsa_status st = dhsa_json_schema_compile((const char *)p, (int64_t)n, &s);
        if (st == DHSA_OK) {
            static const char *const texts[] = {"{}", "{\"a\":1}", "[1,2]", "\"x\"", "null", "true", "-1.5e3",
                                                "{\"name\":\"x\",\"n\":[{}]}"};
            for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
                feed_bytes(s, (const uint8_t *)texts[i], strlen(texts[i]));
            feed_bytes(s, p, n);
            dhsa_json_schema_free(s);
        } else if (s) {
            fail("a failed compile returned a schema");
        }
        return 0;
    }
    dhsa_json_schema *obj = NULL, *sn = NULL;
    const char *t = "{\"type\":[\"string\",\"null\"]}";
    if (dhsa_json_schema_compile(NULL, 0, &obj) || dhsa_json_schema_compile(t, (int64_t)strlen(t), &sn))
        fail("the fixed schemas do not compile");
    feed_bytes(obj, p, n);
    feed_bytes(sn, p, n);
    dhsa_json_schema_free(obj);
    dhsa_json_schema_free(sn);
    return 0;
}
