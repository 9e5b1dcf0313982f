/* real_compare.c: dhsa's next-token logits against a peer's (llama.cpp's,
 * written by bench/llamacpp_logits.c) on the same real model file and
 * token ids, streamed in pieces of 256 positions so a 262K vocabulary
 * over 2K tokens needs no 2 GB buffer. Not part of the build:
 * bench/real_peer.sh compiles it against build/libdhsa.a.
 *
 * usage: real_compare MODEL.gguf PEER.f32 ID...
 * Runs dhsa's exact route (F32 weight products) and its fast route side
 * by side and prints three lines, exact vs the peer, fast vs the peer and
 * fast vs exact: positions, the relative L2 distance of the logits (all
 * positions), top-1 agreement, mean and max KL(first || second) in nats,
 * and at the positions whose argmax differs the largest logit gap of the
 * first between the two tokens (a near tie is a small gap). With
 * REAL_COMPARE_SHOW set, also each position where a route's KL to the
 * peer exceeds 0.3.
 */
#include "dhsa.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int64_t argmax(const float *x, int64_t n) {
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* KL(p || q) of softmax(p) and softmax(q), nats. */
static double kl(const float *p, const float *q, int64_t n) {
    double mp = p[argmax(p, n)], mq = q[argmax(q, n)], zp = 0, zq = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        zp += exp((double)p[i] - mp);
        zq += exp((double)q[i] - mq);
    }
    for (int64_t i = 0; i < n; i++) {
        double lp = (double)p[i] - mp - log(zp), lq = (double)q[i] - mq - log(zq);
        s += exp(lp) * (lp - lq);
    }
    return s;
}

typedef struct {
    double num, den, kl_sum, kl_max, gap_max;
    int64_t agree, n;
} cmp_stats;

/* Adds one position: ref is the first distribution, got the second. */
static void cmp_add(cmp_stats *c, const float *ref, const float *got, int64_t V) {
    for (int64_t i = 0; i < V; i++) {
        c->num += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
        c->den += (double)ref[i] * ref[i];
    }
    int64_t a = argmax(got, V), b = argmax(ref, V);
    if (a == b) c->agree++;
    else if ((double)ref[b] - ref[a] > c->gap_max) c->gap_max = (double)ref[b] - ref[a];
    double d = kl(ref, got, V);
    c->kl_sum += d;
    if (d > c->kl_max) c->kl_max = d;
    c->n++;
}

static void cmp_print(const char *what, const cmp_stats *c) {
    printf("%-16s positions %lld, relative L2 %.3e, top-1 agreement %.4f (%lld/%lld), KL mean %.2e max %.2e, "
           "largest gap where the argmax differs %.4f\n",
           what, (long long)c->n, sqrt(c->num / c->den), (double)c->agree / (double)c->n, (long long)c->agree,
           (long long)c->n, c->kl_sum / (double)c->n, c->kl_max, c->gap_max);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: real_compare MODEL.gguf PEER.f32 ID...\n");
        return 2;
    }
    const int64_t n = argc - 3, piece = 256;
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    for (int64_t i = 0; i < n; i++) ids[i] = atoi(argv[3 + i]);
    dhsa_model *m;
    dhsa_ctx *ctx;
    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = 2;
    if (dhsa_model_load(argv[1], NULL, &m) || dhsa_ctx_create(&cp, &ctx)) {
        fprintf(stderr, "real_compare: %s\n", dhsa_last_error());
        return 1;
    }
    const int64_t V = dhsa_model_get_info(m)->n_vocab;
    dhsa_session *s[2];
    float *got[2];
    for (int r = 0; r < 2; r++) {
        dhsa_session_params sp = dhsa_session_default_params();
        sp.n_ctx = n;
        sp.logits_all = 1;
        sp.kv_type = DHSA_F32; /* as llama.cpp's run */
        sp.exact = r == 0;
        got[r] = malloc((size_t)(piece * V) * sizeof(float));
        if (!got[r] || dhsa_session_create(ctx, m, &sp, &s[r])) {
            fprintf(stderr, "real_compare: %s\n", dhsa_last_error());
            return 1;
        }
    }
    FILE *f = fopen(argv[2], "rb");
    float *peer = malloc((size_t)V * sizeof *peer);
    if (!f || !peer) {
        fprintf(stderr, "real_compare: cannot open the peer's logits\n");
        return 1;
    }
    cmp_stats c[3];
    memset(c, 0, sizeof c);
    for (int64_t at = 0; at < n; at += piece) {
        int64_t k = n - at < piece ? n - at : piece;
        for (int r = 0; r < 2; r++)
            if (dhsa_session_eval(s[r], ids + at, k, got[r])) {
                fprintf(stderr, "real_compare: eval: %s\n", dhsa_last_error());
                return 1;
            }
        for (int64_t t = 0; t < k; t++) {
            if (fread(peer, sizeof(float), (size_t)V, f) != (size_t)V) {
                fprintf(stderr, "real_compare: the peer's file is short\n");
                return 1;
            }
            if (getenv("REAL_COMPARE_SHOW")) {
                double k0 = kl(peer, got[0] + t * V, V), k1 = kl(peer, got[1] + t * V, V);
                if (k0 > 0.3 || k1 > 0.3)
                    printf("position %lld: KL exact %.3f fast %.3f; argmax peer %lld exact %lld fast %lld\n",
                           (long long)(at + t), k0, k1, (long long)argmax(peer, V), (long long)argmax(got[0] + t * V, V),
                           (long long)argmax(got[1] + t * V, V));
            }
            cmp_add(&c[0], peer, got[0] + t * V, V);
            cmp_add(&c[1], peer, got[1] + t * V, V);
            cmp_add(&c[2], got[0] + t * V, got[1] + t * V, V);
        }
    }
    cmp_print("exact vs peer:", &c[0]);
    cmp_print("fast vs peer:", &c[1]);
    cmp_print("fast vs exact:", &c[2]);
    for (int r = 0; r < 2; r++) {
        dhsa_session_free(s[r]);
        free(got[r]);
    }
    dhsa_model_free(m);
    dhsa_ctx_free(ctx);
    fclose(f);
    free(ids);
    free(peer);
    return 0;
}
