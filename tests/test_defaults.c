/* test_defaults.c: one set of routing defaults at every entry point (issue
 * 33; docs/dhsa.md, "One set of routing defaults"). For the same length
 * and density, the library (dhsa_router_params_for), a session created
 * with dhsa_session_default_params (its unset fields scaled), the lines
 * that `dhsa eval`, `dhsa plan`, `dhsa run --verbose`, `dhsa bench sparse`
 * and `dhsa bench decode` print, and the Python binding's
 * RouterParams.for_length, must all give the same parameters. Runs on the
 * shipped default model (skipped with a reason when it or the CLI is
 * absent); a few seconds.
 *
 *   make build/tests/test_defaults && DHSA_CLI=build/dhsa build/tests/test_defaults
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_run.h"
#include "dhsa.h"
#include "t.h"

#define MODEL "models/dhsa-retrieval-8m.gguf"

static const char *score_name(int s) {
    static const char *n[] = {"pooled", "moments", "heads", "bound", "rows"};
    return s >= 0 && s < 5 ? n[s] : "?";
}

/* The parameter part of the CLI's routing line (tools/cli_base.c,
 * dhsa_cli_print_router), written independently here. */
static void params_text(const dhsa_router_params *rp, char *buf, size_t cap) {
    char rest[24] = "hybrid";
    if (rp->rest != DHSA_REST_HYBRID) snprintf(rest, sizeof rest, "%lld", (long long)rp->rest);
    snprintf(buf, cap,
             "q_block %lld, sink %lld, local %lld, dense_below %lld, min_chunk %lld, max_chunk %lld, block chunk "
             "%lld, sim_window %lld, nms_window %lld, score %s, score_rows %lld, sink_window %lld, carry %g, exact_rows %lld, rest %s, "
             "hybrid_max_chunk %lld",
             (long long)rp->q_block, (long long)rp->sink_tokens, (long long)rp->local_tokens,
             (long long)rp->dense_below, (long long)rp->min_chunk, (long long)rp->max_chunk, (long long)rp->chunk,
             (long long)rp->sim_window, (long long)rp->nms_window, score_name(rp->score_mode),
             (long long)rp->score_rows, (long long)rp->sink_window, rp->carry, (long long)rp->exact_rows, rest,
             (long long)rp->hybrid_max_chunk);
}

/* hybrid_as >= 0: rest DHSA_REST_HYBRID as a session on a model resolves it
 * (0: the model has no sliding-window layers) */
static void lib_text_as(int64_t L, double density, int64_t hybrid_as, char *buf, size_t cap) {
    dhsa_router_params rp = dhsa_router_params_for(L, density);
    if (hybrid_as >= 0 && rp.rest == DHSA_REST_HYBRID) rp.rest = hybrid_as;
    params_text(&rp, buf, cap);
}

static void lib_text(int64_t L, double density, char *buf, size_t cap) { lib_text_as(L, density, -1, buf, cap); }

/* Every "routing at L = X: P" line of out: P must be the library's for X
 * at the density. Returns the lines found; *seen_L the last X. */
static int check_lines(const char *what, const char *out, double density, int64_t hybrid_as, int64_t *seen_L) {
    int n = 0;
    for (const char *p = out ? strstr(out, "routing at L = ") : NULL; p; p = strstr(p + 1, "routing at L = ")) {
        long long L;
        if (sscanf(p, "routing at L = %lld:", &L) != 1) continue;
        const char *colon = strchr(p, ':'), *eol = strchr(p, '\n');
        if (!colon || !eol || colon > eol) continue;
        char got[512], want[512];
        size_t len = (size_t)(eol - colon - 2) < sizeof got - 1 ? (size_t)(eol - colon - 2) : sizeof got - 1;
        memcpy(got, colon + 2, len);
        got[len] = 0;
        lib_text_as(L, density, hybrid_as, want, sizeof want);
        T_CHECK(strcmp(got, want) == 0, "%s: at L = %lld it runs\n  %s\n  the library's defaults are\n  %s", what,
                L, got, want);
        *seen_L = L;
        n++;
    }
    return n;
}

int main(void) {
    char a[512], b[512];
    /* the library's values at 4K / 6.25% (docs/dhsa.md's table) */
    dhsa_router_params r4 = dhsa_router_params_for(4096, 0.0625);
    T_CHECK(r4.q_block == 16 && r4.sink_tokens == 4 && r4.local_tokens == 32 && r4.dense_below == 0 &&
                r4.min_chunk == 8 && r4.max_chunk == 32 && r4.chunk == 16 && r4.nms_window == 4 &&
                r4.score_mode == DHSA_SCORE_MOMENTS && r4.score_rows == 4 && r4.sink_window == 64 && r4.density == 0.0625 && r4.carry == 0.1 &&
                r4.exact_rows == 64 && r4.rest == DHSA_REST_HYBRID && r4.hybrid_max_chunk == 16,
            "dhsa_router_params_for(4096, 0.0625) is not the documented set");
    dhsa_router_params r32 = dhsa_router_params_for(32768, 0.0625);
    T_CHECK(r32.q_block == 64 && r32.local_tokens == 256 && r32.dense_below == 0 && r32.min_chunk == 16 &&
                r32.max_chunk == 64,
            "dhsa_router_params_for(32768, 0.0625) is not the documented set");
    /* rest's rule: the summaries in every model from 32K (n rounding to 32K) */
    T_CHECK(r32.rest == DHSA_REST_LONG && dhsa_router_params_for(23171, 0.0625).rest == DHSA_REST_LONG &&
                dhsa_router_params_for(23170, 0.0625).rest == DHSA_REST_HYBRID &&
                dhsa_router_params_for(16384, 0.0625).rest == DHSA_REST_HYBRID,
            "rest: want DHSA_REST_LONG from 32K (n >= 23,171), DHSA_REST_HYBRID below; got %lld at 32768, %lld at "
            "23171, %lld at 23170", (long long)r32.rest, (long long)dhsa_router_params_for(23171, 0.0625).rest,
            (long long)dhsa_router_params_for(23170, 0.0625).rest);
    /* the comparison can fail: two lengths that must differ */
    lib_text(1024, 0.0625, a, sizeof a);
    lib_text(32768, 0.0625, b, sizeof b);
    T_CHECK(strcmp(a, b) != 0, "the defaults at 1K and 32K print the same: the comparisons below cannot fail");
    /* lengths round to the nearest power of two: a prompt of 4,078 tokens
     * and its answer get the defaults of an evaluation at 4K */
    lib_text(4078 + 64, 0.0625, a, sizeof a);
    lib_text(4096, 0.0625, b, sizeof b);
    T_CHECK(strcmp(a, b) == 0, "4,142 tokens and 4,096 get different defaults:\n  %s\n  %s", a, b);

    /* a session with the default params, on the default model */
    dhsa_model *m = NULL;
    dhsa_model_params mp = dhsa_model_default_params();
    if (dhsa_model_load(MODEL, &mp, &m) != DHSA_OK) {
        T_SKIP(3, "%s absent (%s): the session checks are skipped", MODEL, dhsa_last_error());
    } else {
        dhsa_ctx *ctx = NULL;
        dhsa_ctx_params cp = dhsa_ctx_default_params();
        cp.n_threads = 1;
        T_CHECK(dhsa_ctx_create(&cp, &ctx) == DHSA_OK, "ctx: %s", dhsa_last_error());
        const int64_t lens[] = {1024, 4096, 3000, 32768}; /* 32768: rest DHSA_REST_LONG */
        for (int i = 0; i < 4 && ctx; i++) {
            dhsa_session_params sp = dhsa_session_default_params();
            sp.n_ctx = lens[i];
            sp.attn = DHSA_ATTN_DHSA;
            sp.router.density = 0.125;
            dhsa_session *s = NULL;
            dhsa_router_params used;
            if (dhsa_session_create(ctx, m, &sp, &s) != DHSA_OK || dhsa_session_get_router(s, &used) != DHSA_OK) {
                T_CHECK(0, "session of %lld: %s", (long long)lens[i], dhsa_last_error());
                dhsa_session_free(s);
                continue;
            }
            params_text(&used, a, sizeof a);
            lib_text_as(lens[i], 0.125, 0, b, sizeof b); /* the model has no sliding-window layers */
            T_CHECK(strcmp(a, b) == 0 && used.density == 0.125,
                    "a default session of n_ctx %lld routes with\n  %s\n  the library's defaults are\n  %s",
                    (long long)lens[i], a, b);
            dhsa_session_free(s);
        }
        dhsa_ctx_free(ctx);
        dhsa_model_free(m);
    }

    if (!getenv("DHSA_CLI")) {
        T_SKIP(6, "DHSA_CLI unset: the CLI checks are skipped (make test sets it)");
        return t_report("test_defaults");
    }
    struct {
        const char *what, *args;
        int64_t want_L; /* the length the line must name; 0: any */
        double density;
        int64_t hybrid_as; /* a session's report: rest hybrid resolved for the model; -1: the parameters */
    } cmds[] = {
        {"dhsa eval passkey", "eval passkey -m " MODEL " --lengths 1024 --depths 0.5 --trials 1 --attn dhsa "
                              "--density 0.125 --threads 1", 1024, 0.125, -1},
        {"dhsa plan", "plan -m " MODEL " --ctx 1024 -n 5000 -p 'Once upon a time' --attn dhsa --density 0.125",
         1024, 0.125, -1},
        /* the session's routing (no sliding layers: rest hybrid runs as 0) */
        {"dhsa run --verbose", "run -m " MODEL " -n 4 -p 'Once upon a time' --attn dhsa --verbose --threads 1", 0,
         0.0625, 0},
        {"dhsa bench sparse", "bench sparse --L 1024 --heads 4 --kv-heads 2 --dim 32 --runs 1 --dense-runs 1 "
                              "--density 0.125 --threads 1", 1024, 0.125, -1},
        {"dhsa bench decode", "bench decode --L 2048 --heads 4 --kv-heads 2 --dim 32 --runs 1 --threads 1", 2048,
         0.0625, -1},
    };
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        char *out = NULL;
        int rc = cli_run(cmds[i].args, 0, &out);
        int64_t L = -1;
        int n = check_lines(cmds[i].what, out, cmds[i].density, cmds[i].hybrid_as, &L);
        T_CHECK(rc == 0 && n > 0 && (cmds[i].want_L == 0 || L == cmds[i].want_L),
                "%s: exit %d, %d routing lines (last at L = %lld, want %lld); output:\n%s", cmds[i].what, rc, n,
                (long long)L, (long long)cmds[i].want_L, out ? out : "(none)");
        free(out);
    }
    /* Python: RouterParams.for_length, printed in the CLI's format */
    int rc = system("python3 -c 'import numpy' >/dev/null 2>&1");
    if (rc != 0) {
        T_SKIP(1, "python3 with numpy absent: the binding's check is skipped");
    } else {
        FILE *p = popen("cd python && DHSA_LIB=../build/libdhsa.so python3 -c \"import dhsa; r = "
                        "dhsa.RouterParams.for_length(1024, 0.125); print('routing at L = 1024: q_block %d, sink "
                        "%d, local %d, dense_below %d, min_chunk %d, max_chunk %d, block chunk %d, sim_window %d, "
                        "nms_window %d, score %s, score_rows %d, sink_window %d, carry %g, exact_rows %d, rest %s, hybrid_max_chunk %d' % (r.q_block, r.sink, r.local, r.dense_below, "
                        "r.min_chunk, r.max_chunk, r.chunk, r.sim_window, r.nms_window, r.score, r.score_rows, r.sink_window, r.carry, r.exact_rows, 'hybrid' if r.rest == dhsa.REST_HYBRID else r.rest, r.hybrid_max_chunk))\" "
                        "2>&1",
                        "r");
        char buf[2048] = "";
        size_t got = p ? fread(buf, 1, sizeof buf - 1, p) : 0;
        buf[got] = 0;
        if (p) pclose(p);
        int64_t L = -1;
        int n = check_lines("python dhsa.RouterParams.for_length", buf, 0.125, -1, &L);
        T_CHECK(n == 1 && L == 1024, "python: no routing line: %s", buf);
    }
    return t_report("test_defaults");
}
