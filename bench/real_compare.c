/* real_compare.c: dhsa's next-token logits against a peer's (llama.cpp's,
 * written by bench/llamacpp_logits.c) on the same real model file and
 * token ids, streamed in pieces of 256 positions so a 262K vocabulary
 * over 2K tokens needs no 2 GB buffer. Not part of the build:
 * bench/real_peer.sh compiles it against build/libdhsa.a.
 *
 * usage: real_compare MODEL.gguf PEER.f32 EXACT ID...
 * EXACT 1: weight products in F32 (--exact), 0 the fast route. Prints
 * one line: positions, the relative L2 distance of the logits (all
 * positions), top-1 agreement, mean and max KL(peer || dhsa) in nats,
 * and at the positions whose argmax differs the largest peer logit gap
 * between the two tokens (a near tie is a small gap).
 */
#include "dhsa.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

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

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: real_compare MODEL.gguf PEER.f32 EXACT ID...\n");
        return 2;
    }
    const int64_t n = argc - 4, piece = 256;
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    for (int64_t i = 0; i < n; i++) ids[i] = atoi(argv[4 + i]);
    dhsa_model *m;
    dhsa_ctx *ctx;
    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = 2;
    if (dhsa_model_load(argv[1], NULL, &m) || dhsa_ctx_create(&cp, &ctx)) {
        fprintf(stderr, "real_compare: %s\n", dhsa_last_error());
        return 1;
    }
    const int64_t V = dhsa_model_get_info(m)->n_vocab;
    dhsa_session_params sp = dhsa_session_default_params();
    sp.n_ctx = n;
    sp.logits_all = 1;
    sp.exact = atoi(argv[3]);
    dhsa_session *s;
    FILE *f = fopen(argv[2], "rb");
    float *got = malloc((size_t)(piece * V) * sizeof *got), *peer = malloc((size_t)V * sizeof *peer);
    if (!f || !got || !peer || dhsa_session_create(ctx, m, &sp, &s)) {
        fprintf(stderr, "real_compare: %s\n", f ? dhsa_last_error() : "cannot open the peer's logits");
        return 1;
    }
    double num = 0, den = 0, kl_sum = 0, kl_max = 0, gap_max = 0;
    int64_t agree = 0;
    for (int64_t at = 0; at < n; at += piece) {
        int64_t k = n - at < piece ? n - at : piece;
        if (dhsa_session_eval(s, ids + at, k, got)) {
            fprintf(stderr, "real_compare: eval: %s\n", dhsa_last_error());
            return 1;
        }
        for (int64_t t = 0; t < k; t++) {
            if (fread(peer, sizeof(float), (size_t)V, f) != (size_t)V) {
                fprintf(stderr, "real_compare: the peer's file is short\n");
                return 1;
            }
            const float *g = got + t * V;
            for (int64_t i = 0; i < V; i++) {
                num += ((double)g[i] - peer[i]) * ((double)g[i] - peer[i]);
                den += (double)peer[i] * peer[i];
            }
            int64_t a = argmax(g, V), b = argmax(peer, V);
            if (a == b) agree++;
            else if ((double)peer[b] - peer[a] > gap_max) gap_max = (double)peer[b] - peer[a];
            double d = kl(peer, g, V);
            kl_sum += d;
            if (d > kl_max) kl_max = d;
        }
    }
    printf("positions %lld, relative L2 %.3e, top-1 agreement %.4f (%lld/%lld), KL mean %.2e max %.2e, largest peer "
           "gap where the argmax differs %.4f\n",
           (long long)n, sqrt(num / den), (double)agree / (double)n, (long long)agree, (long long)n, kl_sum / n, kl_max,
           gap_max);
    dhsa_session_free(s);
    dhsa_model_free(m);
    dhsa_ctx_free(ctx);
    fclose(f);
    free(ids);
    free(got);
    free(peer);
    return 0;
}
