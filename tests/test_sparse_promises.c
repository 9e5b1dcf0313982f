/* test_sparse_promises.c: a sparse method never runs dense without saying
 * so (issue 13, point 4).
 *
 *   - the router's defaults route at 4K and density 0.0625: the last query
 *     blocks select keys outside the sinks and the local span (before
 *     scale_fixed, 64 sinks + 256 local keys filled a 4K block's budget of
 *     256, so dhsa, block and oracle chose the same keys);
 *   - dhsa and block then choose different keys (their layouts differ);
 *   - the session statistics (dhsa_session_get_stats) on the shipped model:
 *     dense counts every call without a layout; dhsa under dense_below
 *     counts every block dense; dhsa with dense_below 0 counts routed
 *     blocks and a density below 1, the same as the layouts the layer hook
 *     sees; a failed eval adds nothing; a reset empties them;
 *   - `dhsa run --attn dhsa` on a short prompt says the run was DENSE, and
 *     with --dense-below 0 it does not; so do `bench decode` and `bench
 *     sparse`.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_run.h"
#include "dhsa.h"
#include "t.h"

#define MODEL "models/dhsa-retrieval-8m.gguf"

static uint64_t rng_state = 88172645463325252ull;
static float frand(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 11) / 9007199254740992.0) * 2.0f - 1.0f;
}

/* Keys of block qb outside [0, sink) and [pos0 - local, pos1). */
static int64_t keys_outside_fixed(const dhsa_layout *lay, int64_t g, int64_t qb, int64_t sink, int64_t local,
                                  int64_t q_block) {
    const int64_t *r;
    int64_t n;
    if (dhsa_layout_get(lay, 0, g, qb, &r, &n)) return -1;
    int64_t pos0 = qb * q_block, out = 0;
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = r[2 * i]; j < r[2 * i + 1]; j++) out += j >= sink && j < pos0 - local;
    return out;
}

static void router_defaults_route_at_4k(void) {
    const int64_t L = 4096, H = 4, Hkv = 2, d = 64;
    float *q = malloc((size_t)(L * H * d) * sizeof(float)), *k = malloc((size_t)(L * Hkv * d) * sizeof(float));
    T_CHECK(q && k, "out of memory");
    if (!q || !k) return;
    for (int64_t i = 0; i < L * H * d; i++) q[i] = frand();
    for (int64_t i = 0; i < L * Hkv * d; i++) k[i] = frand() + (float)((i / d / 97) % 5) * 0.3f;
    dhsa_ctx *ctx;
    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = 2;
    T_CHECK(dhsa_ctx_create(&cp, &ctx) == DHSA_OK, "ctx: %s", dhsa_last_error());
    dhsa_attn_desc a = dhsa_attn_default_desc();
    a.q = dhsa_tensor_bhld(q, DHSA_F32, 1, H, L, d);
    a.k = dhsa_tensor_bhld(k, DHSA_F32, 1, Hkv, L, d);
    a.causal = 1;
    dhsa_router_params rp = dhsa_router_default_params();
    T_CHECK(rp.scale_fixed == 1 && rp.density == 0.0625 && rp.dense_below == 2048,
            "defaults: scale_fixed %d, density %g, dense_below %lld", rp.scale_fixed, rp.density,
            (long long)rp.dense_below);
    dhsa_layout *lay[2] = {NULL, NULL};
    for (int m = 0; m < 2; m++) {
        dhsa_router_params r = rp;
        if (m == 1) r.boundary = DHSA_BOUNDARY_FIXED;
        T_CHECK(dhsa_route(ctx, &r, &a, &lay[m]) == DHSA_OK, "route: %s", dhsa_last_error());
    }
    if (lay[0] && lay[1]) {
        const int64_t nqb = L / rp.q_block;
        int64_t routed = 0, differ = 0;
        for (int64_t qb = nqb - 8; qb < nqb; qb++)
            for (int64_t g = 0; g < Hkv; g++) {
                routed += keys_outside_fixed(lay[0], g, qb, rp.sink_tokens, rp.local_tokens, rp.q_block) > 0;
                const int64_t *r0, *r1;
                int64_t n0, n1;
                dhsa_layout_get(lay[0], 0, g, qb, &r0, &n0);
                dhsa_layout_get(lay[1], 0, g, qb, &r1, &n1);
                differ += n0 != n1 || memcmp(r0, r1, (size_t)(2 * n0) * sizeof(int64_t)) != 0;
            }
        /* beyond [0, 64) and [pos0 - 256, pos1): a routed chunk may also sit
         * inside the local span the old defaults read, so most, not all */
        T_CHECK(routed >= 6 * Hkv, "defaults at 4K: %lld of %lld late blocks select keys beyond 64 sinks and 256 "
                "local keys (want most: the budget must leave room for chunks; none did before scale_fixed)",
                (long long)routed, (long long)(8 * Hkv));
        T_CHECK(differ > 0, "defaults at 4K: dhsa and block chose the same keys in every late block");
        dhsa_layout_stats st;
        T_CHECK(dhsa_layout_get_stats(lay[0], &st) == DHSA_OK && st.density < 0.5,
                "defaults at 4K: density used %.4f", st.density);
    }
    dhsa_layout_free(lay[0]);
    dhsa_layout_free(lay[1]);
    dhsa_ctx_free(ctx);
    free(q);
    free(k);
}

typedef struct {
    double selected, available;
    int64_t calls, with_layout, blocks, dense_blocks;
} hook_acc;

static int hook(void *user, int64_t layer, const dhsa_attn_desc *a) {
    (void)layer;
    hook_acc *h = user;
    h->calls++;
    dhsa_layout_stats st;
    if (a->layout && dhsa_layout_get_stats(a->layout, &st) == DHSA_OK) {
        h->with_layout++;
        h->selected += st.selected;
        h->available += st.available;
        h->blocks += st.n_blocks * st.Hkv;
        h->dense_blocks += st.dense_blocks;
    }
    return 0;
}

static void session_stats(void) {
    dhsa_model *m = NULL;
    dhsa_model_params mp = dhsa_model_default_params();
    if (dhsa_model_load(MODEL, &mp, &m) != DHSA_OK) {
        T_CHECK(0, "%s does not load: %s", MODEL, dhsa_last_error());
        return;
    }
    dhsa_ctx *ctx;
    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = 2;
    T_CHECK(dhsa_ctx_create(&cp, &ctx) == DHSA_OK, "ctx: %s", dhsa_last_error());
    enum { N = 600 };
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = 1 + (i * 37) % 1900;
    const int64_t n_layer = dhsa_model_get_info(m)->n_layer;
    /* dense: every call without a layout */
    for (int c = 0; c < 3; c++) {
        dhsa_session_params sp = dhsa_session_default_params();
        sp.kv_type = DHSA_F32; /* compared with F32 references (the default is F16) */
        sp.n_ctx = 1024;
        sp.n_ubatch = 256;
        sp.attn = c == 0 ? DHSA_ATTN_DENSE : DHSA_ATTN_DHSA;
        sp.router.dense_below = c == 2 ? 0 : 2048; /* a set field is kept; the default is 0 */
        hook_acc h;
        memset(&h, 0, sizeof h);
        sp.layer_hook = hook;
        sp.layer_hook_user = &h;
        dhsa_session *s = NULL;
        T_CHECK(dhsa_session_create(ctx, m, &sp, &s) == DHSA_OK, "session: %s", dhsa_last_error());
        if (!s) continue;
        dhsa_attn_stats last, total;
        T_CHECK(dhsa_session_eval(s, ids, N, NULL) == DHSA_OK, "eval: %s", dhsa_last_error());
        T_CHECK(dhsa_session_get_stats(s, &last, &total) == DHSA_OK, "stats: %s", dhsa_last_error());
        T_CHECK(last.layer_calls == 3 * n_layer && total.layer_calls == last.layer_calls,
                "case %d: %lld layer calls (want 3 ubatches x %lld layers)", c, (long long)last.layer_calls,
                (long long)n_layer);
        if (c == 0) {
            T_CHECK(last.dense_calls == last.layer_calls && last.blocks == 0 && last.density == 1.0,
                    "dense: %lld of %lld calls without a layout, %lld blocks, density %g", (long long)last.dense_calls,
                    (long long)last.layer_calls, (long long)last.blocks, last.density);
            /* rows x KV heads: sum over positions p of (p + 1), x Hkv, x layers */
            double want = (double)N * (N + 1) / 2 * (double)dhsa_model_get_info(m)->n_head_kv * (double)n_layer;
            T_CHECK(fabs(last.available - want) < 0.5, "dense: %.0f keys available, want %.0f", last.available, want);
        } else if (c == 1) {
            T_CHECK(last.dense_calls == 0 && last.blocks > 0 && last.dense_blocks == last.blocks &&
                        last.density == 1.0,
                    "dhsa under dense_below: %lld dense calls, %lld of %lld blocks dense, density %g (want every "
                    "block dense, and counted)", (long long)last.dense_calls, (long long)last.dense_blocks,
                    (long long)last.blocks, last.density);
        } else {
            T_CHECK(last.dense_blocks < last.blocks && last.density < 0.9,
                    "dhsa with dense_below 0: %lld of %lld blocks dense, density %g", (long long)last.dense_blocks,
                    (long long)last.blocks, last.density);
        }
        T_CHECK(h.with_layout == last.layer_calls - last.dense_calls && h.blocks == last.blocks &&
                    h.dense_blocks == last.dense_blocks,
                "case %d: stats and the hook's layouts disagree (%lld/%lld calls with a layout, %lld/%lld blocks, "
                "%lld/%lld dense)", c, (long long)(last.layer_calls - last.dense_calls), (long long)h.with_layout,
                (long long)last.blocks, (long long)h.blocks, (long long)last.dense_blocks, (long long)h.dense_blocks);
        if (c == 2)
            T_CHECK(fabs(h.selected - last.selected) < 0.5 && fabs(h.available - last.available) < 0.5,
                    "dhsa: stats %.0f / %.0f keys, layouts %.0f / %.0f", last.selected, last.available, h.selected,
                    h.available);
        /* a failed eval (an id out of range) adds nothing; a good one adds */
        int32_t bad[2] = {5, 1 << 30};
        T_CHECK(dhsa_session_eval(s, bad, 2, NULL) != DHSA_OK, "an out-of-range id was accepted");
        dhsa_attn_stats l2, t2;
        dhsa_session_get_stats(s, &l2, &t2);
        T_CHECK(l2.layer_calls == 0 && t2.layer_calls == total.layer_calls && t2.selected == total.selected,
                "case %d: a failed eval changed the statistics (last %lld calls, total %lld -> %lld)", c,
                (long long)l2.layer_calls, (long long)total.layer_calls, (long long)t2.layer_calls);
        T_CHECK(dhsa_session_eval(s, ids, 1, NULL) == DHSA_OK, "decode: %s", dhsa_last_error());
        dhsa_session_get_stats(s, &l2, &t2);
        T_CHECK(l2.layer_calls == n_layer && t2.layer_calls == total.layer_calls + n_layer,
                "case %d: decode adds %lld calls to the total (want %lld)", c,
                (long long)(t2.layer_calls - total.layer_calls), (long long)n_layer);
        dhsa_session_reset(s);
        dhsa_session_get_stats(s, &l2, &t2);
        T_CHECK(t2.layer_calls == 0 && l2.layer_calls == 0 && t2.density == 1.0, "reset left %lld calls",
                (long long)t2.layer_calls);
        dhsa_session_free(s);
    }
    T_CHECK(dhsa_session_get_stats(NULL, NULL, NULL) == DHSA_ERR_INVALID_ARG, "NULL session accepted");
    dhsa_ctx_free(ctx);
    dhsa_model_free(m);
}

static void cli_says_dense(void) {
    if (!getenv("DHSA_CLI")) {
        T_SKIP(8, "DHSA_CLI is not set (make test sets it)");
        return;
    }
    char *out = NULL;
    int rc = cli_run("run -m " MODEL " --attn dhsa --dense-below 2048 -p 'The pass key is' -n 2 --temp 0", 0, &out);
    T_CHECK(rc == 0 && out && strstr(out, "this run was DENSE"), "run --attn dhsa on a short prompt (exit %d): %s",
            rc, out ? out : "");
    T_CHECK(out && strstr(out, "dense below 2048 keys"), "the output names dense_below: %s", out ? out : "");
    free(out);
    rc = cli_run("run -m " MODEL " --attn dhsa --dense-below 0 --density 0.25 -p 'The pass key is 12345. The "
                 "pass key is 12345. What is the pass key? The pass key is 12345. Remember it.' -n 2 --temp 0",
                 0, &out);
    T_CHECK(rc == 0 && out && !strstr(out, "DENSE") && strstr(out, "density used"),
            "run --attn dhsa --dense-below 0 (exit %d): %s", rc, out ? out : "");
    free(out);
    /* the benches: DENSE said when every block ran dense, not otherwise */
    static const char *bench[4] = {
        "bench decode --L 1024 --heads 4 --kv-heads 2 --dim 32 --runs 1 --dense-below 2048",
        "bench decode --L 1024 --heads 4 --kv-heads 2 --dim 32 --runs 1",
        "bench sparse --L 1024 --heads 4 --kv-heads 2 --dim 32 --runs 1 --method dhsa --dense-below 2048",
        "bench sparse --L 1024 --heads 4 --kv-heads 2 --dim 32 --runs 1 --method dhsa"};
    for (int i = 0; i < 4; i++) {
        rc = cli_run(bench[i], 0, &out);
        int dense = out && strstr(out, "this run was DENSE") != NULL;
        T_CHECK(rc == 0 && out && strstr(out, "dense below") && dense == !(i & 1), "%s (exit %d): %s", bench[i], rc,
                out ? out : "");
        free(out);
    }
    rc = cli_run("help run", 0, &out);
    T_CHECK(rc == 0 && out && strstr(out, "--dense-below") && strstr(out, "(default\n                      0: all routed)"),
            "run --help shows --dense-below and its default: %s", out ? out : "");
    free(out);
}

int main(void) {
    router_defaults_route_at_4k();
    session_stats();
    cli_says_dense();
    return t_report("test_sparse_promises");
}
