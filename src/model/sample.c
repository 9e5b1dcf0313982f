/* sample.c: choosing the next token from logits. Order of the steps:
 * repetition penalty over the last repeat_last_n ids (positive logits are
 * divided by the penalty, negative ones multiplied), then temperature 0 =
 * argmax (lowest id on ties), else softmax(logits / T), top-k, top-p
 * (smallest set of the most likely ids whose mass reaches p), min-p (ids
 * below min_p x the largest probability go), renormalise, draw with a
 * seeded xoshiro256** generator: the draw walks the kept ids from the most
 * likely (value descending, ties by ascending id), or, when nothing is cut
 * (top-k off or at least the vocabulary, top-p 1, min-p 0), every id in id
 * order: the same distribution without sorting the vocabulary (dhsa
 * serve's batcher samples every slot between two passes, docs/server.md).
 * Deterministic for a seed. A NaN or +Inf
 * logit, or all of them -Inf, is DHSA_ERR_NONFINITE: there is nothing to
 * draw from, and a silent id 0 would look like a real choice.
 * Tested by tests/test_model.c (distributions on hand-made logits, and
 * draw for draw against a plain reference).
 */
#include "core/internal.h"
#include "core/procmem.h"
#include "attn/kern.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct dhsa_sampler {
    dhsa_sampler_params p;
    int64_t n_vocab;
    uint64_t rng[4];
    float *work;     /* [n_vocab] penalised logits */
    int32_t *order;  /* [n_vocab] candidate ids */
    float *prob;     /* [n_vocab] their probabilities */
    uint64_t *keys;  /* [2 * n_vocab] the sort's (key, id) pairs, both halves */
};

dhsa_sampler_params dhsa_sampler_default_params(void) {
    dhsa_sampler_params p;
    memset(&p, 0, sizeof p);
    p.temperature = 0.8f;
    p.top_k = 40;
    p.top_p = 0.95f;
    p.min_p = 0.05f;
    p.repeat_penalty = 1.0f;
    p.repeat_last_n = 64;
    p.seed = 42;
    return p;
}

static uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t next_u64(uint64_t *s) {
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

/* Uniform in [0, 1). */
static double next_unit(uint64_t *s) { return (double)(next_u64(s) >> 11) * (1.0 / 9007199254740992.0); }

dhsa_status dhsa_sampler_create(const dhsa_sampler_params *p, int64_t n_vocab, dhsa_sampler **out) {
    if (!out) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_sampler_create: out is NULL");
    *out = NULL;
    dhsa_sampler_params dp = dhsa_sampler_default_params();
    if (!p) p = &dp;
    if (n_vocab < 1 || n_vocab > ((int64_t)1 << 24))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "vocabulary of %lld ids", (long long)n_vocab);
    if (!(p->temperature >= 0.0f && p->temperature <= 1e6f))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "temperature %g (0 = greedy, or positive)", (double)p->temperature);
    if (p->top_k < 0) return dhsa__fail(DHSA_ERR_INVALID_ARG, "top-k %lld (0 = off)", (long long)p->top_k);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "top-p %g must be in (0, 1]", (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "min-p %g must be in [0, 1]", (double)p->min_p);
    if (!(p->repeat_penalty > 0.0f && p->repeat_penalty <= 1e6f))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "repetition penalty %g must be positive", (double)p->repeat_penalty);
    if (p->repeat_last_n < 0)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "repeat-last-n %lld", (long long)p->repeat_last_n);
    dhsa_sampler *s = calloc(1, sizeof *s);
    if (!s) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory");
    s->p = *p;
    s->n_vocab = n_vocab;
    s->work = malloc((size_t)n_vocab * sizeof(float));
    s->order = malloc((size_t)n_vocab * sizeof(int32_t));
    s->prob = malloc((size_t)n_vocab * sizeof(float));
    s->keys = malloc((size_t)n_vocab * 2 * sizeof(uint64_t));
    if (!s->work || !s->order || !s->prob || !s->keys) {
        dhsa_sampler_free(s);
        return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory");
    }
    /* Written once here, so that they are resident from the start: a memory
     * plan made after the sampler exists counts them (dhsa_mem_plan.other),
     * and sampling allocates nothing. */
    dhsa__touch(s->work, (size_t)n_vocab * sizeof(float));
    dhsa__touch(s->order, (size_t)n_vocab * sizeof(int32_t));
    dhsa__touch(s->prob, (size_t)n_vocab * sizeof(float));
    dhsa__touch(s->keys, (size_t)n_vocab * 2 * sizeof(uint64_t));
    uint64_t x = p->seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix(&x);
    *out = s;
    return DHSA_OK;
}

void dhsa_sampler_free(dhsa_sampler *s) {
    if (!s) return;
    free(s->work);
    free(s->order);
    free(s->prob);
    free(s->keys);
    free(s);
}

/* The order of the candidates: descending value, ties by ascending id (a
 * total order, so the sequence is unique; -0 and +0 are the same value).
 *
 * The sort key of a value that is not NaN: ascending keys are descending
 * values, and -0 has +0's key. */
static uint32_t descending_key(float f) {
    if (f == 0.0f) f = 0.0f;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u); /* ascending with the value */
    return ~u;
}

/* Keeps in pairs[0..n), (key << 32 | id), those that can be among the
 * first k (1 <= k < n) of the order: the keys at most the k-th smallest
 * key (ties with it included), in their order. Returns how many. The
 * k-th key comes from counting rounds from the top byte, each over the
 * keys that share the bytes found so far (copied to pairs[n..2n)). */
static int64_t keep_best(uint64_t *pairs, int64_t n, int64_t k) {
    const uint64_t *cur = pairs;
    uint64_t *next = pairs + n;
    int64_t m = n, rank = k; /* the k-th key is the rank-th of cur[0..m) */
    uint32_t kth = 0;
    for (int shift = 56; shift >= 32; shift -= 8) {
        int64_t c[256] = {0};
        for (int64_t i = 0; i < m; i++) c[(cur[i] >> shift) & 255]++;
        uint64_t b = 0;
        while (rank > c[b]) rank -= c[b++];
        kth |= (uint32_t)(b << (shift - 32));
        int64_t j = 0;
        for (int64_t i = 0; i < m; i++)
            if (((cur[i] >> shift) & 255) == b) next[j++] = cur[i];
        cur = next;
        m = j;
        if (m == 1) {
            kth = (uint32_t)(cur[0] >> 32);
            break;
        }
    }
    int64_t kept = 0;
    for (int64_t i = 0; i < n; i++)
        if ((uint32_t)(pairs[i] >> 32) <= kth) pairs[kept++] = pairs[i];
    return kept;
}

/* Sorts pairs[0..n), ascending ids on entry, into that order and writes
 * their ids to ids[0..n): a stable LSD radix sort, 4 passes over the key's
 * bytes (a pass whose byte is the same for all is skipped), so equal values
 * keep their ascending ids. No compares to mispredict: the merge sort it
 * replaces cost 3-4x more, and dhsa serve's batcher samples every slot's
 * token between two of its passes (docs/server.md). pairs: [2n]. */
static void sort_pairs(uint64_t *pairs, int64_t n, int32_t *ids) {
    uint64_t *src = pairs, *dst = pairs + n;
    uint32_t at[4][256];
    memset(at, 0, sizeof at);
    for (int64_t i = 0; i < n; i++) {
        uint32_t key = (uint32_t)(src[i] >> 32);
        at[0][key & 255]++;
        at[1][(key >> 8) & 255]++;
        at[2][(key >> 16) & 255]++;
        at[3][key >> 24]++;
    }
    for (int d = 0; d < 4 && n > 1; d++) {
        const int shift = 32 + 8 * d;
        uint32_t *c = at[d];
        if (c[(src[0] >> shift) & 255] == (uint32_t)n) continue;
        for (uint32_t b = 0, sum = 0; b < 256; b++) {
            uint32_t cb = c[b];
            c[b] = sum;
            sum += cb;
        }
        for (int64_t i = 0; i < n; i++) dst[c[(src[i] >> shift) & 255]++] = src[i];
        uint64_t *t = src;
        src = dst;
        dst = t;
    }
    for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)(uint32_t)src[i];
}

dhsa_status dhsa_sampler_sample(dhsa_sampler *s, const float *logits, const int32_t *history, int64_t n_history,
                                int32_t *out) {
    if (!s || !logits || !out || (n_history > 0 && !history))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_sampler_sample: NULL argument");
    const int64_t V = s->n_vocab;
    float *w = s->work;
    /* No distribution exists with a NaN or +Inf logit, nor when every logit
     * is -Inf: an error rather than a token nobody chose. */
    int64_t n_minus_inf = 0, best = 0; /* best: the argmax, lowest id on ties */
    for (int64_t i = 0; i < V; i++) {
        if (isnan(logits[i]))
            return dhsa__fail(DHSA_ERR_NONFINITE, "logit %lld of %lld is NaN: no token can be drawn", (long long)i,
                              (long long)V);
        if (logits[i] == INFINITY)
            return dhsa__fail(DHSA_ERR_NONFINITE, "logit %lld of %lld is +Inf: no token can be drawn", (long long)i,
                              (long long)V);
        n_minus_inf += logits[i] == -INFINITY;
        w[i] = logits[i];
        if (w[i] > w[best]) best = i;
    }
    if (n_minus_inf == V)
        return dhsa__fail(DHSA_ERR_NONFINITE, "all %lld logits are -Inf: no token can be drawn", (long long)V);
    if (s->p.repeat_penalty != 1.0f && n_history > 0) {
        int64_t from = n_history > s->p.repeat_last_n ? n_history - s->p.repeat_last_n : 0;
        /* each id once, however often it occurs */
        for (int64_t j = from; j < n_history; j++) {
            int32_t id = history[j];
            if (id < 0 || id >= V) continue;
            int seen = 0;
            for (int64_t k = from; k < j && !seen; k++) seen = history[k] == id;
            if (seen) continue;
            w[id] = w[id] > 0 ? w[id] / s->p.repeat_penalty : w[id] * s->p.repeat_penalty;
        }
        best = 0;
        for (int64_t i = 1; i < V; i++)
            if (w[i] > w[best]) best = i;
    }
    if (w[best] == -INFINITY) /* the penalty pushed the last finite logits to -Inf */
        return dhsa__fail(DHSA_ERR_NONFINITE, "all %lld logits are -Inf after the repetition penalty", (long long)V);
    if (s->p.temperature == 0.0f) {
        *out = (int32_t)best;
        return DHSA_OK;
    }
    if ((s->p.top_k == 0 || s->p.top_k >= V) && s->p.top_p >= 1.0f && s->p.min_p <= 0.0f) {
        /* nothing is cut: every id with its weight exp((w - max) / T), in
         * id order (the attention kernels' vector exp: a scalar double exp
         * per id was 20 us of a 2048-id step, a tenth of a 4-row batched
         * decode pass of the default model in dhsa serve) */
        double sum = 0;
        int64_t last = best; /* the last id that can be drawn (the walk's end, should rounding leave r past it) */
        float mul = 1.0f / s->p.temperature;
        if (mul > FLT_MAX) mul = FLT_MAX; /* a denormal temperature: ties with the max weigh 1, the rest 0 */
        dhsa__attn_kernels()->expw(w, V, w[best], mul, s->prob);
        for (int64_t i = 0; i < V; i++) {
            sum += s->prob[i];
            if (s->prob[i] > 0) last = i;
        }
        double r = next_unit(s->rng) * sum, acc = 0;
        for (int64_t i = 0; i < V; i++) {
            acc += s->prob[i];
            if (r < acc) {
                *out = (int32_t)i;
                return DHSA_OK;
            }
        }
        *out = (int32_t)last;
        return DHSA_OK;
    }
    /* candidates, best first */
    int64_t n = 0;
    for (int64_t i = 0; i < V; i++)
        if (w[i] > -INFINITY) s->keys[n++] = (uint64_t)descending_key(w[i]) << 32 | (uint32_t)i;
    /* top-k: only the candidates that can be among the first k are sorted */
    if (s->p.top_k > 0 && n > s->p.top_k) n = keep_best(s->keys, n, s->p.top_k);
    sort_pairs(s->keys, n, s->order);
    if (s->p.top_k > 0 && n > s->p.top_k) n = s->p.top_k;
    double mx = (double)w[s->order[0]], sum = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = exp(((double)w[s->order[i]] - mx) / (double)s->p.temperature);
        s->prob[i] = (float)e;
        sum += e;
    }
    if (s->p.top_p < 1.0f) {
        double acc = 0;
        int64_t keep = n;
        for (int64_t i = 0; i < n; i++) {
            acc += (double)s->prob[i] / sum;
            if (acc >= (double)s->p.top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }
    if (s->p.min_p > 0.0f) {
        int64_t keep = 1;
        while (keep < n && (double)s->prob[keep] >= (double)s->p.min_p * (double)s->prob[0]) keep++;
        n = keep;
    }
    sum = 0;
    for (int64_t i = 0; i < n; i++) sum += s->prob[i];
    double r = next_unit(s->rng) * sum, acc = 0;
    for (int64_t i = 0; i < n; i++) {
        acc += s->prob[i];
        if (r < acc) {
            *out = s->order[i];
            return DHSA_OK;
        }
    }
    *out = s->order[n - 1];
    return DHSA_OK;
}
