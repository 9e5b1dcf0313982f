/* test_session_state.c: saved prefills (dhsa_session_save / _load,
 * include/dhsa.h "Saved state"; docs/prompt-cache.md).
 *
 * On the default model (models/dhsa-retrieval-8m.gguf), and on two tiny
 * fixtures of tests/llm_ref.h (qwen2, whose K bias gives a Q8_0 cache
 * centred keys; gemma3, whose sliding layers keep a window), for each KV
 * type (f32, f16, q8_0) and attention method (dense, dhsa with routing
 * active: dense_below 0, a budget of 48 keys, blocks of 16 rows): a session
 * evaluates a prompt A, saves it with its ids and last logits, then
 * evaluates B and decodes greedily; a second session loads the file and
 * must give the same ids, the same last logits, and the same logits for
 * B and every decode step, bit for bit. A session with another context
 * (F32: same RoPE frequencies) loads it too and matches a session of that
 * context that prefilled A itself.
 * Refusals: another KV type, method, density, ubatch or model is
 * DHSA_ERR_INVALID_ARG naming it, and the session keeps its tokens; a file
 * cut short anywhere or with trailing bytes, one byte flipped (header or
 * payload), a file that is not a state, too small an ids buffer: each a
 * clear error (a flipped payload byte leaves the session empty, the rest
 * leave it as it was); a save into a missing folder fails and leaves no
 * file; a successful save leaves no temporary file.
 *
 * Run: make build/tests/test_session_state && build/tests/test_session_state
 * (from the repository root). Ends with "test_session_state: P passed, F failed, S skipped".
 */
#include "dhsa.h"
#include "llm_ref.h"
#include "t.h"

#include <dirent.h>
#include <sys/stat.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MODEL "models/dhsa-retrieval-8m.gguf"
#define N_A 120
#define N_B 30
#define N_DECODE 5

static dhsa_ctx *ctx;
static char dir[256];

static int same_bits(const char *what, const float *a, const float *b, int64_t n) {
    if (memcmp(a, b, (size_t)n * sizeof(float)) == 0) return 1;
    int64_t at = 0;
    double worst = -1;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= worst)) {
            worst = d;
            at = i;
        }
    }
    fprintf(stderr, "  %s: largest difference %.3g at logit %lld (%.9g vs %.9g)\n", what, worst, (long long)at,
            (double)a[at], (double)b[at]);
    return 0;
}

static int32_t argmax(const float *x, int64_t n) {
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return (int32_t)b;
}

static dhsa_session_params params(dhsa_type kv, dhsa_attn_method attn, int64_t n_ctx) {
    dhsa_session_params sp = dhsa_session_default_params();
    sp.n_ctx = n_ctx;
    sp.n_ubatch = 32;
    sp.kv_type = kv;
    sp.attn = attn;
    sp.logits_all = 1;
    sp.router.dense_below = 0;
    sp.router.budget_tokens = 48;
    sp.router.sink_tokens = 4;
    sp.router.local_tokens = 16;
    sp.router.q_block = 16;
    sp.router.min_chunk = 8;
    sp.router.nms_window = 4;
    return sp;
}

/* B's logits and N_DECODE greedy steps' after s holds A: out [N_B + N_DECODE][V]. */
static dhsa_status continue_from(dhsa_session *s, const int32_t *b, int64_t V, float *out) {
    dhsa_status st = dhsa_session_eval(s, b, N_B, out);
    int32_t t = argmax(out + (N_B - 1) * V, V);
    for (int i = 0; i < N_DECODE && !st; i++) {
        st = dhsa_session_eval(s, &t, 1, out + (N_B + i) * V);
        t = argmax(out + (N_B + i) * V, V);
    }
    return st;
}

/* Saves after A, loads into a new session, compares the continuations. */
static void round_trip(const dhsa_model *m, const char *label, dhsa_type kv, dhsa_attn_method attn,
                       const int32_t *ids) {
    const int64_t V = dhsa_model_get_info(m)->n_vocab, n_out = (N_B + N_DECODE) * V;
    char nm[128], path[400];
    snprintf(nm, sizeof nm, "%s %s %s", label, dhsa_type_name(kv), dhsa_attn_method_name(attn));
    snprintf(path, sizeof path, "%s/state", dir);
    dhsa_session_params sp = params(kv, attn, 256);
    dhsa_session *a = NULL, *b = NULL;
    float *la = malloc((size_t)N_A * (size_t)V * sizeof(float)), *want = malloc((size_t)n_out * sizeof(float)),
          *got = malloc((size_t)n_out * sizeof(float)), *last = malloc((size_t)V * sizeof(float));
    int32_t back[N_A + 8];
    dhsa_status st = dhsa_session_create(ctx, m, &sp, &a);
    if (!st) st = dhsa_session_create(ctx, m, &sp, &b);
    if (!st) st = dhsa_session_eval(a, ids, N_A, la);
    if (!st) st = dhsa_session_save(a, ids, N_A, la + (N_A - 1) * V, path);
    T_CHECK(st == DHSA_OK && la && want && got && last, "%s: prefill A and save: %s", nm, dhsa_last_error());
    if (st) goto done;
    st = continue_from(a, ids + N_A, V, want);
    int64_t n = -1;
    int has = 0;
    dhsa_status ls = dhsa_session_load(b, path, back, N_A + 8, &n, last, &has);
    T_CHECK(st == DHSA_OK && ls == DHSA_OK && n == N_A && has == 1 && dhsa_session_length(b) == N_A &&
                memcmp(back, ids, N_A * sizeof(int32_t)) == 0,
            "%s: load: %s, %lld ids (%d) back equal, logits stored %d", nm, dhsa_last_error(), (long long)n, N_A, has);
    if (st || ls) goto done;
    T_CHECK(same_bits(nm, last, la + (N_A - 1) * V, V), "%s: the stored last logits are A's", nm);
    st = continue_from(b, ids + N_A, V, got);
    T_CHECK(st == DHSA_OK && same_bits(nm, got, want, n_out),
            "%s: B and %d greedy steps after the load give the saving session's logits bit for bit: %s", nm,
            N_DECODE, st ? dhsa_last_error() : "ran");
    /* a larger context: same RoPE frequencies (no LongRoPE), so it loads,
     * and continues as a session of that context that prefilled A */
    if (kv != DHSA_Q8_0) {
        dhsa_session_free(a);
        dhsa_session_free(b);
        a = b = NULL;
        dhsa_session_params sp2 = params(kv, attn, 320);
        st = dhsa_session_create(ctx, m, &sp2, &a);
        if (!st) st = dhsa_session_create(ctx, m, &sp2, &b);
        if (!st) st = dhsa_session_eval(a, ids, N_A, la);
        if (!st) st = continue_from(a, ids + N_A, V, want);
        if (!st) st = dhsa_session_load(b, path, back, N_A, &n, NULL, NULL);
        if (!st) st = continue_from(b, ids + N_A, V, got);
        T_CHECK(st == DHSA_OK && same_bits(nm, got, want, n_out),
                "%s: loaded into a context of 320 (saved at 256), it continues as a prefill there: %s", nm,
                st ? dhsa_last_error() : "ran");
    }
done:
    dhsa_session_free(a);
    dhsa_session_free(b);
    free(la);
    free(want);
    free(got);
    free(last);
}

static uint8_t *slurp(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    *size = (size_t)n;
    return b;
}

/* A load that must fail with want and a sentence containing word, leaving
 * s with keep tokens (-1: empty). */
static void refused(dhsa_session *s, const void *data, size_t size, dhsa_status want, const char *word, int64_t keep,
                    const char *what) {
    int32_t ids[N_A + 8];
    int64_t n = 0;
    dhsa_status st = dhsa_session_load_memory(s, data, size, ids, N_A + 8, &n, NULL, NULL);
    const char *why = dhsa_last_error();
    int64_t len = dhsa_session_length(s);
    T_CHECK(st == want && strstr(why, word) && len == (keep < 0 ? 0 : keep),
            "%s: %s (want %s), \"%s\" (want \"%s\" in it), the session holds %lld tokens (want %lld)", what,
            dhsa_status_str(st), dhsa_status_str(want), why, word, (long long)len, (long long)(keep < 0 ? 0 : keep));
}

static void refusals(const dhsa_model *m, const dhsa_model *other, const int32_t *ids) {
    char path[400];
    snprintf(path, sizeof path, "%s/state", dir);
    const int64_t V = dhsa_model_get_info(m)->n_vocab;
    float *lg = malloc((size_t)V * sizeof(float));
    dhsa_session_params sp = params(DHSA_F16, DHSA_ATTN_DHSA, 256);
    sp.logits_all = 0;
    dhsa_session *a = NULL, *s = NULL;
    dhsa_status st = dhsa_session_create(ctx, m, &sp, &a);
    if (!st) st = dhsa_session_eval(a, ids, N_A, lg);
    if (!st) st = dhsa_session_save(a, ids, N_A, NULL, path);
    size_t size = 0;
    uint8_t *good = st ? NULL : slurp(path, &size);
    T_CHECK(good && size > 1000, "a saved state to corrupt: %s", dhsa_last_error());
    if (!good) goto done;
    /* other options: refused by name, the session keeps its 7 tokens */
    static const struct { const char *word; int what; } opt[] = {
        {"--kv", 0}, {"--attn", 1}, {"--density", 2}, {"--ubatch", 3}, {"--sink", 4}};
    for (size_t i = 0; i < sizeof opt / sizeof opt[0]; i++) {
        dhsa_session_params o = sp;
        if (opt[i].what == 0) o.kv_type = DHSA_F32;
        if (opt[i].what == 1) o.attn = DHSA_ATTN_DENSE;
        if (opt[i].what == 2) o.router.density = 0.25;
        if (opt[i].what == 3) o.n_ubatch = 16;
        if (opt[i].what == 4) o.router.sink_tokens = 8;
        if (dhsa_session_create(ctx, m, &o, &s) || dhsa_session_eval(s, ids, 7, lg)) {
            T_CHECK(0, "session for %s: %s", opt[i].word, dhsa_last_error());
            continue;
        }
        char what[64];
        snprintf(what, sizeof what, "another %s", opt[i].word);
        refused(s, good, size, DHSA_ERR_INVALID_ARG, opt[i].word, 7, what);
        dhsa_session_free(s);
        s = NULL;
    }
    if (other) {
        dhsa_session_params o = sp;
        o.attn = DHSA_ATTN_DHSA;
        if (!dhsa_session_create(ctx, other, &o, &s)) {
            refused(s, good, size, DHSA_ERR_INVALID_ARG, "another model", 0, "another model");
            dhsa_session_free(s);
            s = NULL;
        }
    }
    if (dhsa_session_create(ctx, m, &sp, &s) || dhsa_session_eval(s, ids, 7, lg)) {
        T_CHECK(0, "a session to load into: %s", dhsa_last_error());
        goto done;
    }
    /* cut short: in the header, the layer table, the ids, the cache, the checksum; trailing bytes */
    size_t cuts[] = {0, 7, 20, 200, 420, 700, size / 2, size - 9, size - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        char what[64];
        snprintf(what, sizeof what, "cut to %zu of %zu bytes", cuts[i], size);
        refused(s, good, cuts[i], DHSA_ERR_FORMAT, cuts[i] < 400 ? "" : "truncated", 7, what);
    }
    uint8_t *bad = malloc(size + 8);
    memcpy(bad, good, size);
    memset(bad + size, 0, 8);
    refused(s, bad, size + 8, DHSA_ERR_FORMAT, "trailing bytes", 7, "8 bytes more");
    /* the length field (header word 15 after 16 bytes): the sizes disagree */
    memcpy(bad, good, size);
    bad[16 + 8 * 15] ^= 1;
    refused(s, bad, size, DHSA_ERR_FORMAT, "", 7, "the length flipped");
    memcpy(bad, good, size);
    bad[0] = 'X';
    refused(s, bad, size, DHSA_ERR_FORMAT, "not a dhsa state", 7, "another magic");
    memcpy(bad, good, size);
    bad[8] = 9;
    refused(s, bad, size, DHSA_ERR_UNSUPPORTED, "version 9", 7, "another version");
    memcpy(bad, good, size);
    bad[16] ^= 0x40; /* the model hash */
    refused(s, bad, size, DHSA_ERR_INVALID_ARG, "another model", 7, "the model hash flipped");
    memcpy(bad, good, size);
    bad[size - 100] ^= 0x10; /* a value in the last layer's V rows */
    refused(s, bad, size, DHSA_ERR_FORMAT, "corrupt", -1, "a cache byte flipped (the session is left empty)");
    /* and the session works after it */
    T_CHECK(dhsa_session_eval(s, ids, 7, lg) == DHSA_OK && dhsa_session_length(s) == 7,
            "an emptied session evaluates again: %s", dhsa_last_error());
    /* an id outside the vocabulary, with the checksum made right: refused before the cache */
    free(bad);
    bad = NULL;
    {
        int32_t ids2[N_A + 8];
        int64_t n = 0;
        st = dhsa_session_load_memory(s, good, size, ids2, N_A - 1, &n, NULL, NULL);
        T_CHECK(st == DHSA_ERR_TOO_LARGE && n == N_A && dhsa_session_length(s) == 7,
                "ids with room for %d of %d: %s, n %lld, the session keeps its 7", N_A - 1, N_A, dhsa_status_str(st),
                (long long)n);
    }
    /* a save into a missing folder fails and leaves nothing; a good one leaves no temporary */
    char bad_path[420];
    snprintf(bad_path, sizeof bad_path, "%s/missing/state", dir);
    T_CHECK(dhsa_session_save(a, ids, N_A, NULL, bad_path) == DHSA_ERR_IO && access(bad_path, F_OK) != 0,
            "a save into a missing folder: DHSA_ERR_IO (%s)", dhsa_last_error());
    T_CHECK(dhsa_session_save(a, ids, N_A - 1, NULL, path) == DHSA_ERR_INVALID_ARG,
            "a save with fewer ids than the session's tokens is refused");
    int others = 0;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));)
        if (e->d_name[0] != '.' && strcmp(e->d_name, "state")) others++;
    if (d) closedir(d);
    T_CHECK(others == 0, "no temporary file is left next to the state (%d other files)", others);
done:
    free(good);
    free(bad);
    free(lg);
    dhsa_session_free(a);
    dhsa_session_free(s);
}

static void make_ids(int32_t *ids, int64_t n, int64_t V, uint64_t seed) {
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)(3 + (seed >> 33) % (uint64_t)(V - 3));
    }
}

static dhsa_model *fixture(const char *arch, uint8_t **bytes) {
    llmref_spec s = llmref_spec_default(arch, LLMREF_F32);
    s.n_embd = 128;
    s.head_dim = 32; /* Q8_0 caches need head dims of 32 */
    s.head_dim_v = 32;
    s.n_rot = 32;
    s.n_ctx_train = 512;
    size_t size;
    dhsa_gguf *g;
    dhsa_model *m = NULL;
    if (llmref_fixture_build(&s, bytes, &size) || dhsa_gguf_open_memory(*bytes, size, &g) ||
        dhsa_model_from_gguf(g, NULL, &m)) {
        T_CHECK(0, "fixture %s: %s %s", arch, llmref_error(), dhsa_last_error());
        return NULL;
    }
    return m;
}

int main(void) {
    dhsa_model *m = NULL;
    dhsa_model_params mp = dhsa_model_default_params();
    T_CHECK(dhsa_model_load(MODEL, &mp, &m) == DHSA_OK, "load %s (run from the repository root): %s", MODEL,
            dhsa_last_error());
    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = 2;
    T_CHECK(dhsa_ctx_create(&cp, &ctx) == DHSA_OK, "ctx: %s", dhsa_last_error());
    snprintf(dir, sizeof dir, "/tmp/dhsa_test_state_%d", (int)getpid());
    T_CHECK(mkdir(dir, 0700) == 0, "temporary folder %s", dir);
    T_CHECK(dhsa_session_save(NULL, NULL, 0, NULL, "x") == DHSA_ERR_INVALID_ARG &&
                dhsa_session_load(NULL, "x", NULL, 0, NULL, NULL, NULL) == DHSA_ERR_INVALID_ARG,
            "a NULL session is refused");
    int32_t ids[N_A + N_B];
    uint8_t *qb = NULL, *gb = NULL;
    dhsa_model *qwen = fixture("qwen2", &qb), *gemma = fixture("gemma3", &gb);
    if (m && ctx) {
        make_ids(ids, N_A + N_B, dhsa_model_get_info(m)->n_vocab, 5);
        static const dhsa_type kvs[3] = {DHSA_F32, DHSA_F16, DHSA_Q8_0};
        for (int k = 0; k < 3; k++) {
            round_trip(m, "default model", kvs[k], DHSA_ATTN_DENSE, ids);
            round_trip(m, "default model", kvs[k], DHSA_ATTN_DHSA, ids);
        }
        refusals(m, qwen, ids);
    }
    if (qwen) {
        make_ids(ids, N_A + N_B, 320, 9);
        round_trip(qwen, "qwen2 fixture (centred Q8_0 keys)", DHSA_Q8_0, DHSA_ATTN_DHSA, ids);
        round_trip(qwen, "qwen2 fixture", DHSA_F16, DHSA_ATTN_DENSE, ids);
    }
    if (gemma) {
        make_ids(ids, N_A + N_B, 320, 11);
        round_trip(gemma, "gemma3 fixture (sliding layers)", DHSA_F32, DHSA_ATTN_DENSE, ids);
        round_trip(gemma, "gemma3 fixture (sliding layers)", DHSA_Q8_0, DHSA_ATTN_DHSA, ids);
    }
    dhsa_model_free(qwen);
    dhsa_model_free(gemma);
    free(qb);
    free(gb);
    char rm[300];
    snprintf(rm, sizeof rm, "rm -rf %s", dir);
    if (system(rm)) fprintf(stderr, "could not remove %s\n", dir);
    dhsa_ctx_free(ctx);
    dhsa_model_free(m);
    return t_report("test_session_state");
}
