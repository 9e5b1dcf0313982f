/* test_model_arch.c: the architectures qwen3, gemma3 and phi3 (and what
 * gemma2 reads beside them) against the double-precision forward of
 * tests/llm_ref.h, on tiny random fixtures:
 *
 *   - each in F32, Q8_0 and Q4_K: logits of a prefill and of token-by-token
 *     decode within 1e-5 relative L2 of the reference, and greedy decoding
 *     equal to the reference's;
 *   - what each adds, with the reference deliberately wrong to show it
 *     matters: q/k norms (qwen3, gemma3); gemma3's sliding layers (5 in 6
 *     by default, or the pattern key), its local RoPE base (10000 when the
 *     key is absent), linear scaling only on the global layers, the final
 *     softcap key, the 62-layer query scale; phi3's fused gate/up (the gate
 *     is the first half), partial rotation, LongRoPE factors chosen by the
 *     session's context with rope.scaling.attn_factor; gemma2's
 *     rope.freq_base_swa and sliding_window_pattern;
 *   - refusals by name: a missing q/k norm, a separate ffn_gate in phi3,
 *     rope_freqs beside LongRoPE factors, a pattern array of the wrong
 *     length;
 *   - `dhsa gen-model --arch A` for every architecture: the file loads in
 *     the runner and the reference, and their logits agree.
 *
 * Build and run alone:
 *   make build/tests/test_model_arch && DHSA_CLI=build/dhsa build/tests/test_model_arch
 */
#include "dhsa.h"
#include "llm_ref.h"
#include "cli_run.h"
#include "t.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The exact route (F32 weight products): the one held to the double
 * reference at the tight bounds below; the fast integer route is checked
 * at its own bound (test_model_ref.c, check_fast). */
static dhsa_session_params exact_params(void) {
    dhsa_session_params p = dhsa_session_default_params();
    p.kv_type = DHSA_F32; /* compared with F32 references (the default is F16) */
    p.exact = 1;
    return p;
}

#define REL_MAX 1e-5 /* relative L2 of the logits against the double reference */
#define FAR 0.02     /* a deliberately wrong reference is at least this far */

static dhsa_ctx *ctx;

static double rel_l2(const float *a, const double *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static double rel_l2_d(const double *a, const double *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void make_ids(int32_t *ids, int64_t n, int64_t V, uint64_t seed) {
    for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)(llmref_rand_u64(&seed) % (uint64_t)V);
    ids[0] = 1;
}

/* A fixture loaded by both sides. */
typedef struct {
    uint8_t *bytes;
    size_t size;
    dhsa_model *m;
    llmref_model ref;
} fixture;

static int fixture_open(const llmref_spec *s, fixture *f, const char *label) {
    memset(f, 0, sizeof *f);
    if (llmref_fixture_build(s, &f->bytes, &f->size) || llmref_model_load_memory(f->bytes, f->size, &f->ref)) {
        T_CHECK(0, "%s: fixture / reference: %s", label, llmref_error());
        return -1;
    }
    dhsa_gguf *g;
    if (dhsa_gguf_open_memory(f->bytes, f->size, &g) || dhsa_model_from_gguf(g, NULL, &f->m)) {
        T_CHECK(0, "%s: the runner loads it: %s", label, dhsa_last_error());
        return -1;
    }
    return 0;
}

static void fixture_close(fixture *f) {
    dhsa_model_free(f->m);
    llmref_model_free(&f->ref);
    free(f->bytes);
}

/* Logits of every position through a session of n_ctx (0: trained):
 * one prefill, or a 3-token prefill then one token at a time. */
static dhsa_status run_logits(const dhsa_model *m, int64_t n_ctx, const int32_t *ids, int64_t n, int by_token,
                              float *logits) {
    int64_t V = dhsa_model_get_info(m)->n_vocab;
    dhsa_session_params sp = exact_params();
    sp.logits_all = 1;
    sp.n_ctx = n_ctx;
    dhsa_session *s;
    dhsa_status st = dhsa_session_create(ctx, m, &sp, &s);
    if (st) return st;
    if (by_token) {
        st = dhsa_session_eval(s, ids, 3, logits);
        for (int64_t i = 3; i < n && !st; i++) st = dhsa_session_eval(s, ids + i, 1, logits + i * V);
    } else {
        st = dhsa_session_eval(s, ids, n, logits);
    }
    dhsa_session_free(s);
    return st;
}

/* Runner (prefill and decode) vs reference on the fixture, within
 * REL_MAX; returns the prefill's relative L2 (INFINITY on failure) and
 * leaves the reference logits in *want ([n][V], the caller frees). */
static double check_close(fixture *f, int64_t n_ctx, const int32_t *ids, int64_t n, const char *label,
                          double **want) {
    const int64_t V = f->ref.n_vocab;
    *want = malloc((size_t)(n * V) * sizeof **want);
    float *got = malloc((size_t)(n * V) * sizeof *got);
    double rel = INFINITY, rel_dec = INFINITY;
    if (!*want || !got || llmref_forward(&f->ref, ids, n, *want)) {
        T_CHECK(0, "%s: reference forward: %s", label, llmref_error());
        free(got);
        return INFINITY;
    }
    dhsa_status st = run_logits(f->m, n_ctx, ids, n, 0, got);
    if (!st) rel = rel_l2(got, *want, n * V);
    T_CHECK(rel <= REL_MAX, "%s: prefill logits vs the double reference: relative L2 %.3g: %s", label, rel,
            st ? dhsa_last_error() : "ok");
    st = run_logits(f->m, n_ctx, ids, n, 1, got);
    if (!st) rel_dec = rel_l2(got, *want, n * V);
    T_CHECK(rel_dec <= REL_MAX, "%s: token-by-token decode vs the reference: relative L2 %.3g: %s", label, rel_dec,
            st ? dhsa_last_error() : "ok");
    printf("  %-40s relative L2 %.2e (prefill), %.2e (decode)\n", label, rel, rel_dec);
    free(got);
    return rel;
}

/* The reference after `wrong` (a deliberately wrong change) is far from
 * want. */
static void check_far(llmref_model *r, const int32_t *ids, int64_t n, const double *want, const char *what) {
    double *alt = malloc((size_t)(n * r->n_vocab) * sizeof *alt);
    double d = 0;
    if (alt && llmref_forward(r, ids, n, alt) == 0) d = rel_l2_d(alt, want, n * r->n_vocab);
    T_CHECK(d > FAR, "%s changes the logits (relative L2 %.3g)", what, d);
    free(alt);
}

/* Greedy decoding of 12 tokens: the runner's argmax equals the reference's. */
static void check_greedy(fixture *f, const char *label) {
    const int64_t n_prompt = 4, n_gen = 12, V = f->ref.n_vocab;
    int32_t ref_seq[16], seq[16];
    make_ids(ref_seq, n_prompt, V, 77);
    memcpy(seq, ref_seq, sizeof seq);
    if (llmref_greedy(&f->ref, ref_seq, n_prompt, n_gen)) {
        T_CHECK(0, "%s: reference greedy: %s", label, llmref_error());
        return;
    }
    dhsa_session *s;
    float *lg = malloc((size_t)V * sizeof *lg);
    dhsa_status st = dhsa_session_create(ctx, f->m, NULL, &s);
    if (!st) st = dhsa_session_eval(s, seq, n_prompt, lg);
    for (int64_t i = 0; i < n_gen && !st; i++) {
        int64_t best = 0;
        for (int64_t v = 1; v < V; v++)
            if (lg[v] > lg[best]) best = v;
        seq[n_prompt + i] = (int32_t)best;
        if (i + 1 < n_gen) st = dhsa_session_eval(s, seq + n_prompt + i, 1, lg);
    }
    if (!st) dhsa_session_free(s);
    T_CHECK(!st && memcmp(seq, ref_seq, sizeof(int32_t) * (size_t)(n_prompt + n_gen)) == 0,
            "%s: greedy decoding of %lld tokens equals the reference's: %s", label, (long long)n_gen,
            st ? dhsa_last_error() : "ok");
    free(lg);
}

/* ------------------------------------------------------ per arch, type --- */

static void test_matrix(void) {
    static const char *const arches[] = {"qwen3", "gemma3", "phi3"};
    static const uint32_t types[] = {LLMREF_F32, LLMREF_Q8_0, LLMREF_Q4_K};
    for (int a = 0; a < 3; a++)
        for (int t = 0; t < 3; t++) {
            llmref_spec s = llmref_spec_default(arches[a], types[t]);
            s.seed = 300 + (uint64_t)(a * 3 + t);
            char label[64];
            snprintf(label, sizeof label, "%s %s", arches[a], llmref_type_name(types[t]));
            fixture f;
            if (fixture_open(&s, &f, label)) {
                fixture_close(&f);
                continue;
            }
            const dhsa_model_info *in = dhsa_model_get_info(f.m);
            T_CHECK(strcmp(in->arch_name, arches[a]) == 0 && in->qk_norm == (a != 2) && in->fused_ffn == (a == 2) &&
                        in->rope_neox && in->n_swa_layers == (a == 1 ? 1 : 0),
                    "%s: info (arch %s, qk_norm %d, fused_ffn %d, %lld sliding layers)", label, in->arch_name,
                    in->qk_norm, in->fused_ffn, (long long)in->n_swa_layers);
            int32_t ids[20];
            make_ids(ids, 20, f.ref.n_vocab, s.seed);
            double *want = NULL;
            check_close(&f, 0, ids, 20, label, &want);
            if (types[t] == LLMREF_F32) check_greedy(&f, label);
            /* what the architecture adds matters */
            if (want && types[t] == LLMREF_F32 && a != 2) {
                for (int64_t l = 0; l < f.ref.n_layer; l++) {
                    free(f.ref.layers[l].q_norm);
                    free(f.ref.layers[l].k_norm);
                    f.ref.layers[l].q_norm = f.ref.layers[l].k_norm = NULL;
                }
                char what[96];
                snprintf(what, sizeof what, "%s: leaving out the q/k norms", label);
                check_far(&f.ref, ids, 20, want, what);
            }
            if (want && types[t] == LLMREF_F32 && a == 2) { /* the gate is the first half of ffn_up */
                for (int64_t l = 0; l < f.ref.n_layer; l++) {
                    double *tmp = f.ref.layers[l].w_gate;
                    f.ref.layers[l].w_gate = f.ref.layers[l].w_up;
                    f.ref.layers[l].w_up = tmp;
                }
                check_far(&f.ref, ids, 20, want, "phi3: gate and up halves swapped");
            }
            if (want && types[t] == LLMREF_F32 && a == 1) {
                llmref_model r;
                if (llmref_model_load_memory(f.bytes, f.size, &r) == 0) {
                    r.sliding_window = 0;
                    check_far(&r, ids, 20, want, "gemma3: no sliding window");
                    llmref_model_free(&r);
                }
                if (llmref_model_load_memory(f.bytes, f.size, &r) == 0) {
                    r.rope_base_swa = r.rope_base;
                    check_far(&r, ids, 20, want, "gemma3: the global RoPE base on the sliding layers");
                    llmref_model_free(&r);
                }
            }
            free(want);
            fixture_close(&f);
        }
}

/* ---------------------------------------------------------------- gemma --- */

static void test_gemma(void) {
    int32_t ids[24];
    double *want = NULL;
    fixture f;
    /* gemma3's defaults: 7 layers, a window and no pattern key: layers 0-4
     * and 6 slide, layer 5 is global; the local base is 10000 when
     * rope.freq_base_swa is absent (here the global one is 1e6) */
    llmref_spec s = llmref_spec_default("gemma3", LLMREF_F32);
    s.n_layer = 7;
    s.swa_pattern = 0;
    s.rope_base_swa = 0;
    s.rope_base = 1e6;
    s.sliding_window = 4;
    s.seed = 41;
    if (fixture_open(&s, &f, "gemma3 defaults") == 0) {
        const dhsa_model_info *in = dhsa_model_get_info(f.m);
        T_CHECK(in->n_swa_layers == 6 && in->sliding_window == 4 && in->rope_base_swa == 10000.0f &&
                    in->rope_base == 1e6f && in->attn_softcap == 0 && in->final_softcap == 0,
                "gemma3 defaults: %lld sliding layers (6), window %lld, local base %g, caps %g/%g",
                (long long)in->n_swa_layers, (long long)in->sliding_window, (double)in->rope_base_swa,
                (double)in->attn_softcap, (double)in->final_softcap);
        T_CHECK(llmref_layer_slides(&f.ref, 4) && !llmref_layer_slides(&f.ref, 5) && llmref_layer_slides(&f.ref, 6),
                "the reference slides layers 4 and 6 but not 5");
        make_ids(ids, 24, f.ref.n_vocab, 42);
        check_close(&f, 0, ids, 24, "gemma3 7 layers, default pattern", &want);
        if (want) {
            f.ref.swa_pattern = 2;
            check_far(&f.ref, ids, 24, want, "gemma3: pattern 2 instead of 6");
        }
        free(want);
        want = NULL;
    }
    fixture_close(&f);
    /* the pattern as one flag per layer: layers 1 and 2 of 3 slide */
    static const uint8_t flags[3] = {0, 1, 1};
    s = llmref_spec_default("gemma3", LLMREF_F32);
    s.n_layer = 3;
    s.swa_pattern = 0;
    s.swa_flags = flags;
    s.n_swa_flags = 3;
    s.seed = 49;
    if (fixture_open(&s, &f, "gemma3 pattern flags") == 0) {
        T_CHECK(dhsa_model_get_info(f.m)->n_swa_layers == 2 && !llmref_layer_slides(&f.ref, 0) &&
                    llmref_layer_slides(&f.ref, 2),
                "gemma3 with a BOOL pattern: layers 1 and 2 slide (%lld sliding)",
                (long long)dhsa_model_get_info(f.m)->n_swa_layers);
        make_ids(ids, 24, f.ref.n_vocab, 50);
        check_close(&f, 0, ids, 24, "gemma3 pattern flags 0,1,1", &want);
        if (want) {
            free(f.ref.swa);
            f.ref.swa = NULL;
            f.ref.swa_pattern = 6; /* every layer would slide */
            check_far(&f.ref, ids, 24, want, "gemma3: the default pattern instead of the flags");
        }
        free(want);
        want = NULL;
    }
    fixture_close(&f);
    /* no window key: no layer slides */
    s = llmref_spec_default("gemma3", LLMREF_F32);
    s.sliding_window = 0;
    s.swa_pattern = 0;
    if (fixture_open(&s, &f, "gemma3 without a window") == 0)
        T_CHECK(dhsa_model_get_info(f.m)->n_swa_layers == 0 && !llmref_layer_slides(&f.ref, 0),
                "gemma3 without sliding_window: no layer slides");
    fixture_close(&f);
    /* linear scaling applies to the global layers only; a final cap key applies */
    s = llmref_spec_default("gemma3", LLMREF_F32);
    s.rope_scaling_type = "linear";
    s.rope_scaling_factor = 8;
    s.final_softcap = 2;
    s.seed = 43;
    if (fixture_open(&s, &f, "gemma3 linear x8, final cap 2") == 0) {
        const dhsa_model_info *in = dhsa_model_get_info(f.m);
        T_CHECK(in->rope_linear_factor == 8 && in->rope_linear_factor_swa == 1 && in->final_softcap == 2,
                "gemma3: factor 8 global, 1 local; final cap %g", (double)in->final_softcap);
        make_ids(ids, 24, f.ref.n_vocab, 44);
        check_close(&f, 0, ids, 24, "gemma3 linear x8 (global), final cap 2", &want);
        if (want) {
            f.ref.rope_factor_swa = 8;
            check_far(&f.ref, ids, 24, want, "gemma3: scaling the local layers too");
        }
        free(want);
        want = NULL;
    }
    fixture_close(&f);
    /* 62 layers (Gemma 3 27B): queries scaled by 1/sqrt(n_embd / n_head) */
    s = llmref_spec_default("gemma3", LLMREF_F32);
    s.n_layer = 62;
    s.head_dim = s.head_dim_v = s.n_rot = 32; /* n_embd / n_head = 16 */
    s.seed = 45;
    if (fixture_open(&s, &f, "gemma3 62 layers") == 0) {
        T_CHECK(fabs(dhsa_model_get_info(f.m)->attn_scale - 0.25) < 1e-7 && fabs(f.ref.attn_scale - 0.25) < 1e-15,
                "gemma3 62 layers: scale 1/sqrt(64 / 4) = 1/4 (runner %g)",
                (double)dhsa_model_get_info(f.m)->attn_scale);
        make_ids(ids, 12, f.ref.n_vocab, 46);
        check_close(&f, 0, ids, 12, "gemma3 62 layers (27B scale)", &want);
        if (want) {
            f.ref.attn_scale = 1.0 / sqrt(32.0);
            check_far(&f.ref, ids, 12, want, "gemma3 62 layers with 1/sqrt(head_dim)");
        }
        free(want);
        want = NULL;
    }
    fixture_close(&f);
    /* gemma2 reads rope.freq_base_swa and the pattern key too */
    s = llmref_spec_default("gemma2", LLMREF_F32);
    s.n_layer = 3;
    s.rope_base_swa = 500;
    s.swa_pattern = 3; /* layers 0, 1 slide, 2 does not */
    s.seed = 47;
    if (fixture_open(&s, &f, "gemma2 swa keys") == 0) {
        const dhsa_model_info *in = dhsa_model_get_info(f.m);
        T_CHECK(in->n_swa_layers == 2 && in->rope_base_swa == 500.0f, "gemma2: pattern 3 slides 2 of 3 layers "
                "(%lld), local base %g", (long long)in->n_swa_layers, (double)in->rope_base_swa);
        make_ids(ids, 24, f.ref.n_vocab, 48);
        check_close(&f, 0, ids, 24, "gemma2 freq_base_swa 500, pattern 3", &want);
        if (want) {
            f.ref.rope_base_swa = f.ref.rope_base;
            check_far(&f.ref, ids, 24, want, "gemma2: ignoring rope.freq_base_swa");
        }
        free(want);
        want = NULL;
    }
    fixture_close(&f);
}

/* ----------------------------------------------------------------- phi3 --- */

static void test_phi3(void) {
    int32_t ids[24];
    double *want = NULL, *want_long = NULL;
    fixture f;
    /* LongRoPE: short factors for a context up to original_context_length
     * (32 here), long ones above; attn_factor scales the rotated values */
    llmref_spec s = llmref_spec_default("phi3", LLMREF_F32);
    s.rope_factors = 1;
    s.rope_attn_factor = 1.19;
    s.n_ctx_orig = 32;
    s.seed = 51;
    if (fixture_open(&s, &f, "phi3 LongRoPE") == 0) {
        const dhsa_model_info *in = dhsa_model_get_info(f.m);
        T_CHECK(in->has_rope_factors && in->n_ctx_orig == 32 && fabs(in->rope_attn_factor - 1.19) < 1e-6,
                "phi3: rope factors, original context %lld, attn_factor %g", (long long)in->n_ctx_orig,
                (double)in->rope_attn_factor);
        make_ids(ids, 24, f.ref.n_vocab, 52);
        llmref_model_set_ctx(&f.ref, 32);
        check_close(&f, 32, ids, 24, "phi3 LongRoPE, context 32 (short)", &want);
        llmref_model_set_ctx(&f.ref, 64);
        check_close(&f, 64, ids, 24, "phi3 LongRoPE, context 64 (long)", &want_long);
        if (want && want_long)
            T_CHECK(rel_l2_d(want, want_long, 24 * f.ref.n_vocab) > FAR, "phi3: long and short factors differ");
        /* one batched decode step of a short-context and a long-context
         * session: each row rotates with its own session's factors */
        if (want && want_long) {
            const int64_t V = f.ref.n_vocab;
            dhsa_session *ss[2] = {NULL, NULL};
            dhsa_session_params sp = exact_params();
            float *lg = malloc((size_t)(2 * V) * sizeof *lg);
            dhsa_status st = DHSA_OK;
            for (int k = 0; k < 2 && !st; k++) {
                sp.n_ctx = k ? 64 : 32;
                st = dhsa_session_create(ctx, f.m, &sp, &ss[k]);
                if (!st) st = dhsa_session_eval(ss[k], ids, 23, NULL);
            }
            const int32_t next[2] = {ids[23], ids[23]};
            if (!st && lg) st = dhsa_session_eval_batch(ss, 2, next, lg);
            double r0 = st ? INFINITY : rel_l2(lg, want + 23 * V, V);
            double r1 = st ? INFINITY : rel_l2(lg + V, want_long + 23 * V, V);
            T_CHECK(r0 <= REL_MAX && r1 <= REL_MAX, "phi3 LongRoPE: a batched step of a context-32 and a context-64 "
                    "session, each with its factors: relative L2 %.3g (short), %.3g (long): %s", r0, r1,
                    st ? dhsa_last_error() : "ok");
            dhsa_session_free(ss[0]);
            dhsa_session_free(ss[1]);
            free(lg);
        }
        if (want) {
            llmref_model_set_ctx(&f.ref, 32);
            f.ref.rope_attn_factor = 1;
            check_far(&f.ref, ids, 24, want, "phi3: ignoring rope.scaling.attn_factor");
            f.ref.rope_attn_factor = 1.19;
            f.ref.rope_factors = NULL;
            check_far(&f.ref, ids, 24, want, "phi3: ignoring the short factors");
        }
    }
    free(want);
    free(want_long);
    want = want_long = NULL;
    fixture_close(&f);
    /* partial rotation (Phi-4-mini rotates 3/4 of each head), fused biases */
    s = llmref_spec_default("phi3", LLMREF_Q8_0);
    s.n_rot = 12;
    s.biases = 1;
    s.ffn_biases = 1;
    s.out_bias = 1;
    s.seed = 53;
    if (fixture_open(&s, &f, "phi3 n_rot 12, biases") == 0) {
        make_ids(ids, 24, f.ref.n_vocab, 54);
        check_close(&f, 0, ids, 24, "phi3 Q8_0 n_rot 12, qkv/up/down biases", &want);
        if (want) {
            for (int64_t l = 0; l < f.ref.n_layer; l++) {
                double *tmp = f.ref.layers[l].b_gate;
                f.ref.layers[l].b_gate = f.ref.layers[l].b_up;
                f.ref.layers[l].b_up = tmp;
            }
            check_far(&f.ref, ids, 24, want, "phi3: ffn_up.bias halves swapped");
        }
        free(want);
        want = NULL;
    }
    fixture_close(&f);
}

/* --------------------------------------------------------------- refused --- */

/* The runner refuses the fixture with status want naming `name`, and the
 * reference refuses it too. */
static void check_refused(const llmref_spec *s, dhsa_status want, const char *name, const char *what) {
    uint8_t *bytes = NULL;
    size_t size = 0;
    if (llmref_fixture_build(s, &bytes, &size)) {
        T_CHECK(0, "%s: fixture: %s", what, llmref_error());
        return;
    }
    dhsa_gguf *g = NULL;
    dhsa_model *m = NULL;
    dhsa_status st = dhsa_gguf_open_memory(bytes, size, &g);
    if (!st) st = dhsa_model_from_gguf(g, NULL, &m);
    T_CHECK(st == want && !m && strstr(dhsa_last_error(), name), "%s: refused (%s) naming %s: %s", what,
            dhsa_status_str(st), name, dhsa_last_error());
    llmref_model r;
    int rc = llmref_model_load_memory(bytes, size, &r);
    T_CHECK(rc != 0, "%s: the reference refuses it too: %s", what, rc ? llmref_error() : "loaded");
    if (rc == 0) llmref_model_free(&r);
    dhsa_model_free(m);
    free(bytes);
}

static void test_refused(void) {
    llmref_spec s = llmref_spec_default("qwen3", LLMREF_F32);
    s.omit_tensor = "blk.1.attn_k_norm.weight";
    check_refused(&s, DHSA_ERR_FORMAT, "blk.1.attn_k_norm.weight", "qwen3 without blk.1.attn_k_norm.weight");
    s = llmref_spec_default("gemma3", LLMREF_F32);
    s.omit_tensor = "blk.0.attn_q_norm.weight";
    check_refused(&s, DHSA_ERR_FORMAT, "blk.0.attn_q_norm.weight", "gemma3 without blk.0.attn_q_norm.weight");
    s = llmref_spec_default("phi3", LLMREF_F32);
    s.extra_tensor = "blk.0.ffn_gate.weight"; /* phi3's gate is in ffn_up: this one would be unused */
    check_refused(&s, DHSA_ERR_UNSUPPORTED, "blk.0.ffn_gate.weight", "phi3 with a separate ffn_gate");
    s = llmref_spec_default("qwen2", LLMREF_F32);
    s.extra_tensor = "blk.0.attn_q_norm.weight"; /* a qwen2 has no q/k norms */
    check_refused(&s, DHSA_ERR_UNSUPPORTED, "blk.0.attn_q_norm.weight", "qwen2 with attn_q_norm");
    s = llmref_spec_default("phi3", LLMREF_F32);
    s.rope_factors = 1;
    s.rope_freqs = 1;
    check_refused(&s, DHSA_ERR_UNSUPPORTED, "rope_freqs.weight", "rope_freqs beside LongRoPE factors");
    static const uint8_t two[2] = {1, 0};
    s = llmref_spec_default("gemma3", LLMREF_F32);
    s.n_layer = 3;
    s.swa_pattern = 0;
    s.swa_flags = two;
    s.n_swa_flags = 2;
    check_refused(&s, DHSA_ERR_FORMAT, "gemma3.attention.sliding_window_pattern", "a pattern of 2 flags for 3 layers");
    s = llmref_spec_default("phi3", LLMREF_F32);
    s.omit_tensor = "blk.1.ffn_up.weight"; /* gate and up: both gone */
    check_refused(&s, DHSA_ERR_FORMAT, "blk.1.ffn_up.weight", "phi3 without blk.1.ffn_up.weight");
}

/* ------------------------------------------------------------ gen-model --- */

#define GEN_CHECKS 18

static void test_gen_model(void) {
    const char *cli = getenv("DHSA_CLI");
    if (!cli || access(cli, X_OK) != 0) {
        T_SKIP(GEN_CHECKS, "gen-model needs DHSA_CLI (make test sets it)");
        return;
    }
    char dir[] = "/tmp/dhsa_arch_XXXXXX";
    if (!mkdtemp(dir)) {
        T_CHECK(0, "mkdtemp");
        return;
    }
    static const char *const arches[] = {"llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3"};
    for (int a = 0; a < 6; a++) {
        char path[128], args[256], label[64];
        snprintf(path, sizeof path, "%s/%s.gguf", dir, arches[a]);
        snprintf(args, sizeof args, "gen-model -o '%s' --preset tiny --type F32 --arch %s --bias all", path, arches[a]);
        snprintf(label, sizeof label, "gen-model --arch %s", arches[a]);
        char *out = NULL;
        int rc = cli_run(args, 0, &out);
        T_CHECK(rc == 0 && out && strstr(out, arches[a]), "%s: rc %d: %s", label, rc, out ? out : "");
        free(out);
        dhsa_model *m = NULL;
        llmref_model ref;
        double rel = INFINITY;
        if (rc == 0 && dhsa_model_load(path, NULL, &m) == DHSA_OK && llmref_model_load_file(path, &ref) == 0) {
            const int64_t n = 10, V = ref.n_vocab;
            int32_t ids[10];
            make_ids(ids, n, V, 9);
            double *want = malloc((size_t)(n * V) * sizeof *want);
            float *got = malloc((size_t)(n * V) * sizeof *got);
            if (want && got && llmref_forward(&ref, ids, n, want) == 0 && run_logits(m, 0, ids, n, 0, got) == 0)
                rel = rel_l2(got, want, n * V);
            T_CHECK(strcmp(dhsa_model_get_info(m)->arch_name, arches[a]) == 0 && rel <= REL_MAX,
                    "%s: loads as %s; runner vs reference relative L2 %.3g", label, dhsa_model_get_info(m)->arch_name,
                    rel);
            printf("  %-40s relative L2 %.2e\n", label, rel);
            free(want);
            free(got);
            llmref_model_free(&ref);
        } else {
            T_CHECK(0, "%s: loads: %s / %s", label, dhsa_last_error(), llmref_error());
        }
        dhsa_model_free(m);
        unlink(path);
    }
    /* the options for the sliding and LongRoPE files */
    char path[128], args[320];
    snprintf(path, sizeof path, "%s/opt.gguf", dir);
    struct {
        const char *opts;
        int64_t n_ctx; /* the session's: LongRoPE's choice */
        const char *what;
    } opt[] = {
        {"--arch gemma3 --window 3 --rope-scale 8", 0, "gemma3 --window 3 --rope-scale 8"},
        {"--arch phi3 --longrope --ctx 1024", 32, "phi3 --longrope, context 32 (short)"},
        {"--arch phi3 --longrope --ctx 1024", 64, "phi3 --longrope, context 64 (long)"},
    };
    for (int i = 0; i < 3; i++) {
        snprintf(args, sizeof args, "gen-model -o '%s' --preset tiny --type F32 %s", path, opt[i].opts);
        char *out = NULL;
        int rc = cli_run(args, 0, &out);
        free(out);
        dhsa_model *m = NULL;
        llmref_model ref;
        double rel = INFINITY;
        if (rc == 0 && dhsa_model_load(path, NULL, &m) == DHSA_OK && llmref_model_load_file(path, &ref) == 0) {
            const dhsa_model_info *in = dhsa_model_get_info(m);
            int keys = i == 0 ? in->sliding_window == 3 && in->n_swa_layers == 2 && in->rope_linear_factor == 8 &&
                                    in->rope_linear_factor_swa == 1
                              : in->has_rope_factors && in->n_ctx_orig == 32 && in->rope_attn_factor > 1.1f;
            const int64_t n = 12, V = ref.n_vocab;
            int32_t ids[12];
            make_ids(ids, n, V, 10);
            llmref_model_set_ctx(&ref, opt[i].n_ctx ? opt[i].n_ctx : ref.n_ctx_train);
            double *want = malloc((size_t)(n * V) * sizeof *want);
            float *got = malloc((size_t)(n * V) * sizeof *got);
            if (want && got && llmref_forward(&ref, ids, n, want) == 0 &&
                run_logits(m, opt[i].n_ctx, ids, n, 0, got) == 0)
                rel = rel_l2(got, want, n * V);
            T_CHECK(keys && rel <= REL_MAX, "gen-model %s: its keys read back (%d); relative L2 %.3g", opt[i].what,
                    keys, rel);
            free(want);
            free(got);
            llmref_model_free(&ref);
        } else {
            T_CHECK(0, "gen-model %s: rc %d: %s / %s", opt[i].what, rc, dhsa_last_error(), llmref_error());
        }
        dhsa_model_free(m);
    }
    static const char *const bad[] = {"--arch llama --window 4", "--arch qwen3 --longrope", "--arch mamba"};
    for (int i = 0; i < 3; i++) {
        snprintf(args, sizeof args, "gen-model -o '%s' --preset tiny %s", path, bad[i]);
        char *out = NULL;
        int rc = cli_run(args, 0, &out);
        T_CHECK(rc == 2, "gen-model %s is refused: rc %d: %s", bad[i], rc, out ? out : "");
        free(out);
    }
    unlink(path);
    rmdir(dir);
}

/* ------------------------------------------------ sliding-window rings --- */

static int stop_at_call; /* the layer hook stops the eval at this call (0: never) */
static int stop_hook(void *user, int64_t layer, const dhsa_attn_desc *a) {
    (void)layer;
    (void)a;
    int *calls = user;
    return ++*calls == stop_at_call;
}

/* Every position's logits of ids through a session of n_ctx 64 and ubatch
 * ub: one eval, or pieces of `piece` tokens; with fail_at > 0 a first eval
 * of the whole prompt is stopped by the layer hook at that attention call
 * (after some ubatches ran and moved the rings), then the pieces run as if
 * it had never been made. */
static dhsa_status ring_logits(const dhsa_model *m, int64_t ub, const int32_t *ids, int64_t n, int64_t piece,
                               int fail_at, float *logits, size_t *kv_bytes) {
    const int64_t V = dhsa_model_get_info(m)->n_vocab;
    dhsa_session_params sp = exact_params();
    sp.logits_all = 1;
    sp.n_ctx = 64;
    sp.n_ubatch = ub;
    int calls = 0;
    sp.layer_hook = stop_hook;
    sp.layer_hook_user = &calls;
    stop_at_call = 0;
    dhsa_session *s;
    dhsa_status st = dhsa_session_create(ctx, m, &sp, &s);
    if (st) return st;
    *kv_bytes = dhsa_session_get_plan(s)->kv_cache;
    int64_t done = 0;
    if (fail_at) {
        st = dhsa_session_eval(s, ids, 12, logits); /* committed: 12 tokens */
        stop_at_call = fail_at;
        calls = 0;
        if (!st && dhsa_session_eval(s, ids + 12, n - 12, logits + 12 * V) == DHSA_OK)
            st = DHSA_ERR_INTERNAL; /* the hook did not stop the eval */
        stop_at_call = 0;
        done = 12;
    }
    for (; done < n && !st; done += piece) {
        int64_t k = n - done < piece ? n - done : piece;
        st = dhsa_session_eval(s, ids + done, k, logits + done * V);
    }
    dhsa_session_free(s);
    return st;
}

/* gemma3 and gemma2 fixtures with a window of 5 (every other layer), a
 * context of 64 and ubatches of 3: each sliding layer keeps 4 + 3 rows
 * and a backup of 4, so the ring moves many times in a 40-token prompt.
 * Prefill in one eval, in pieces of 7, token by token, and after an eval
 * stopped by the layer hook mid-way (rings moved past the committed keys,
 * then restored), all within REL_MAX of the double reference (which keeps
 * every key); the plan's KV bytes are the global layers' 64 positions plus
 * the sliding ones' 7 + 4; truncating into what a ring dropped is refused
 * with a sentence and changes nothing, truncating within it works. */
static void test_window_ring(void) {
    static const char *const arches[2] = {"gemma3", "gemma2"};
    for (int a = 0; a < 2; a++) {
        llmref_spec s = llmref_spec_default(arches[a], LLMREF_F32);
        s.n_ctx_train = 64;
        char label[64];
        snprintf(label, sizeof label, "%s window 5 ring, ubatch 3", arches[a]);
        fixture f;
        if (fixture_open(&s, &f, label)) {
            fixture_close(&f);
            continue;
        }
        const int64_t n = 40, V = f.ref.n_vocab;
        int32_t ids[40];
        make_ids(ids, n, V, 5);
        double *want = malloc((size_t)(n * V) * sizeof *want);
        float *got = malloc((size_t)(n * V) * sizeof *got);
        if (!want || !got || llmref_forward(&f.ref, ids, n, want)) {
            T_CHECK(0, "%s: reference forward: %s", label, llmref_error());
        } else {
            static const int64_t pieces[3] = {40, 7, 1};
            const dhsa_model_info *in = dhsa_model_get_info(f.m);
            const size_t row = 2 * (size_t)in->n_head_kv * (size_t)in->head_dim_k * sizeof(float);
            const size_t want_kv = (size_t)(in->n_layer - in->n_swa_layers) * 64 * row +
                                   (size_t)in->n_swa_layers * (4 + 3 + 4) * row;
            for (int i = 0; i < 4; i++) {
                size_t kv = 0;
                dhsa_status st = ring_logits(f.m, 3, ids, n, i < 3 ? pieces[i] : 5, i == 3 ? 9 : 0, got, &kv);
                double rel = st ? INFINITY : rel_l2(got, want, n * V);
                T_CHECK(rel <= REL_MAX && kv == want_kv,
                        "%s, %s: logits vs the double reference: relative L2 %.3g; KV bytes %zu (want %zu: %lld "
                        "global layers x 64 positions, %lld sliding x 7 + 4)%s%s", label,
                        i == 3 ? "after a failed eval" : i == 0 ? "one eval" : i == 1 ? "pieces of 7" : "by token",
                        rel, kv, want_kv, (long long)(in->n_layer - in->n_swa_layers),
                        (long long)in->n_swa_layers, st ? ": " : "", st ? dhsa_last_error() : "");
                if (i == 0) printf("  %-40s relative L2 %.2e, KV %zu bytes\n", label, rel, kv);
            }
        }
        /* truncate: 40 tokens in ubatches of 3 leave the ring from 36 on at most */
        dhsa_session_params sp = exact_params();
        sp.n_ctx = 64;
        sp.n_ubatch = 3;
        dhsa_session *se;
        if (dhsa_session_create(ctx, f.m, &sp, &se) == DHSA_OK) {
            dhsa_status st = dhsa_session_eval(se, ids, n, NULL);
            dhsa_status bad = dhsa_session_truncate(se, 20);
            int refused = bad == DHSA_ERR_UNSUPPORTED && strstr(dhsa_last_error(), "sliding layer") &&
                          dhsa_session_length(se) == n;
            dhsa_status ok = dhsa_session_truncate(se, n - 1);
            T_CHECK(!st && refused && ok == DHSA_OK && dhsa_session_length(se) == n - 1 &&
                        dhsa_session_truncate(se, 0) == DHSA_OK && dhsa_session_eval(se, ids, 5, NULL) == DHSA_OK,
                    "%s: truncate into a moved ring refused (%d, \"%s\"), within it and to 0 done", label, (int)bad,
                    dhsa_last_error());
            dhsa_session_free(se);
        }
        free(want);
        free(got);
        fixture_close(&f);
    }
}

int main(void) {
    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = 2;
    if (dhsa_ctx_create(&cp, &ctx)) {
        printf("test_model_arch: 0 passed, 1 failed\n");
        return 1;
    }
    test_matrix();
    test_gemma();
    test_phi3();
    test_window_ring();
    test_refused();
    test_gen_model();
    dhsa_ctx_free(ctx);
    return t_report("test_model_arch");
}
