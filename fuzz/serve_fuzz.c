/* serve_fuzz.c: libFuzzer harness for the request parser of dhsa serve
 * (serve_request_parse, tools/serve/request.c, compiled into this harness with
 * jansson). Input: byte 0 picks the endpoint (chat, completions,
 * tokenize, detokenize), the rest is the body, as the server passes it (not
 * NUL-terminated). Checked on every input, beyond ASan and UBSan: a parse
 * returns 0 or -1; a failure leaves a non-empty NUL-terminated message and
 * an empty request; a success keeps every documented bound (messages,
 * stop strings and their lengths, ids in [0, n_vocab) and at most max_ids,
 * max_tokens within the limit, sampling parameters in range, text lengths
 * those of NUL-free strings). A broken contract aborts so libFuzzer keeps
 * the input. Run: make fuzz (needs libjansson-dev; FUZZ_SECONDS per harness).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

static void broken(const char *what) {
    fprintf(stderr, "serve_fuzz: broken contract: %s\n", what);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    serve_req_kind kind = (serve_req_kind)(1 + data[0] % 4);
    serve_limits lim = {1000, 64, 2048};
    serve_request r;
    serve_error e;
    int rc = serve_request_parse(kind, (const char *)data + 1, size - 1, &lim, &r, &e);
    if (rc != 0 && rc != -1) broken("return value");
    if (rc) {
        if (!e.message[0] || !memchr(e.message, 0, sizeof e.message) || !memchr(e.param, 0, sizeof e.param))
            broken("an error without a sentence");
        if (r.messages || r.text || r.ids || r.n_stop) broken("a failed parse left something behind");
        serve_request_free(&r);
        return 0;
    }
    if (r.kind != kind) broken("kind");
    if (r.n_messages < 0 || r.n_messages > SERVE_MAX_MESSAGES) broken("message count");
    for (int64_t i = 0; i < r.n_messages; i++)
        if (!r.messages[i].role || !r.messages[i].content) broken("a message without role or content");
    if (kind == SERVE_REQ_CHAT && r.n_messages < 1) broken("chat without messages");
    if (r.text && (int64_t)strlen(r.text) != r.text_len) broken("text length (NUL inside)");
    if (r.n_ids < 0 || r.n_ids > lim.max_ids) broken("id count");
    for (int64_t i = 0; i < r.n_ids; i++)
        if (r.ids[i] < 0 || r.ids[i] >= lim.n_vocab) broken("an id outside the vocabulary");
    if (r.n_stop < 0 || r.n_stop > SERVE_MAX_STOP) broken("stop count");
    for (int i = 0; i < r.n_stop; i++)
        if (r.stop_len[i] < 1 || r.stop_len[i] > SERVE_MAX_STOP_BYTES || (int64_t)strlen(r.stop[i]) != r.stop_len[i])
            broken("a stop string");
    if (r.max_tokens < -1 || r.max_tokens > lim.max_tokens) broken("max_tokens");
    if (!(r.temperature >= 0 && r.temperature <= 2) || !(r.top_p > 0 && r.top_p <= 1) || !(r.min_p >= 0 && r.min_p <= 1))
        broken("temperature / top_p / min_p");
    if (!(r.presence_penalty >= -2 && r.presence_penalty <= 2) || !(r.frequency_penalty >= -2 && r.frequency_penalty <= 2))
        broken("penalties");
    if (r.density != 0 && !(r.density > 0 && r.density <= 1)) broken("density");
    if (r.include_usage && !r.stream) broken("include_usage without stream");
    if (r.ignore_eos != 0 && r.ignore_eos != 1) broken("ignore_eos");
    serve_request_free(&r);
    return 0;
}
