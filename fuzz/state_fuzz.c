/* state_fuzz.c: libFuzzer harness for the saved-state reader
 * (src/model/session_state.c, dhsa_session_load_memory). Any input must be
 * loaded or refused with a sentence, without reading or writing outside the
 * session's buffers; a loaded state must leave a session that evaluates
 * one more token, and a refused one a session that still works. The file
 * ends with a checksum that a mutation almost always breaks: an input whose
 * checksum is wrong is also loaded with the right one written in (a copy),
 * so the checks behind it (ids, positions, sizes) see mutated files too.
 * The session: the shipped model (models/dhsa-retrieval-8m.gguf, run from
 * the repository root), context 64, ubatch 64, F16 K/V, dense: the options
 * of the seed `make fuzz` writes with `dhsa run --prompt-cache`.
 * Run: make fuzz.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dhsa.h"
#include "model/model_internal.h"

static dhsa_model *model;
static dhsa_ctx *ctx;
static dhsa_session *sess;
static float *logits;

static void setup(void) {
    if (sess) return;
    if (dhsa_model_load("models/dhsa-retrieval-8m.gguf", NULL, &model)) {
        fprintf(stderr, "state_fuzz: %s (run from the repository root)\n", dhsa_last_error());
        abort();
    }
    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = 1;
    dhsa_session_params sp = dhsa_session_default_params();
    sp.n_ctx = 64;
    sp.n_ubatch = 64;
    sp.kv_type = DHSA_F16;
    if (dhsa_ctx_create(&cp, &ctx) || dhsa_session_create(ctx, model, &sp, &sess)) abort();
    logits = malloc((size_t)dhsa_model_get_info(model)->n_vocab * sizeof(float));
    if (!logits) abort();
}

static void load_one(const uint8_t *data, size_t size) {
    int32_t ids[64];
    int64_t n = -1;
    int has = -1;
    dhsa_status st = dhsa_session_load_memory(sess, data, size, ids, 64, &n, logits, &has);
    if (st == DHSA_OK) {
        if (n < 0 || n > 64 || dhsa_session_length(sess) != n || (has != 0 && has != 1)) abort();
        if (n < 64) {
            int32_t one = 1;
            if (dhsa_session_eval(sess, &one, 1, logits) || dhsa_session_length(sess) != n + 1) abort();
        }
    } else if (!dhsa_last_error()[0]) {
        abort();
    }
    if (dhsa_session_reset(sess)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    setup();
    load_one(data, size);
    if (size < 16) return 0;
    uint64_t sum = dhsa__state_checksum(data, size - 8), stored;
    memcpy(&stored, data + size - 8, 8);
    if (sum != stored) {
        uint8_t *c = malloc(size);
        if (!c) abort();
        memcpy(c, data, size - 8);
        memcpy(c + size - 8, &sum, 8);
        load_one(c, size);
        free(c);
    }
    return 0;
}
