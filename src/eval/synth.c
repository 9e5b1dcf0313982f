/* synth.c: synthetic long-context workloads with real chunk structure and
 * planted needles (contract in include/dhsa.h), and the fidelity metrics
 * that compare a sparse attention result with the dense one.
 * Used by `dhsa bench sparse` and tests/test_route*.c.
 */
#include "core/internal.h"

#include <math.h>
#include <stdlib.h>

/* ---------------------------------------------------------------- prng --- */

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double uniform(uint64_t *s) { return (double)(splitmix(s) >> 11) * (1.0 / 9007199254740992.0); }

static double normal(uint64_t *s) { /* Box-Muller */
    double u = uniform(s), v = uniform(s);
    if (u < 1e-300) u = 1e-300;
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

static void unit(uint64_t *s, float *x, int64_t d) {
    double n = 0;
    for (int64_t c = 0; c < d; c++) {
        x[c] = (float)normal(s);
        n += (double)x[c] * x[c];
    }
    float inv = (float)(1.0 / sqrt(n > 0 ? n : 1));
    for (int64_t c = 0; c < d; c++) x[c] *= inv;
}

dhsa_synth_params dhsa_synth_default_params(void) {
    dhsa_synth_params p;
    memset(&p, 0, sizeof p);
    p.B = 1;
    p.Hq = 8;
    p.Hkv = 2;
    p.L = 4096;
    p.d = 128;
    p.seg_min = 32;
    p.seg_max = 512;
    p.n_needles = 4;
    p.depths[0] = 0.1;
    p.depths[1] = 0.35;
    p.depths[2] = 0.6;
    p.depths[3] = 0.85;
    p.q_block = 64;
    p.needle_len = 16;
    p.seed = 1;
    return p;
}

/* Score scales (scale 1/sqrt(d) is applied by attention): a query on its
 * own topic scores about 5 on that segment's keys, about 4 on the segment
 * it retrieves, about 0 elsewhere; a needle query scores about 14 on its
 * needle. */
#define KEY_NOISE 0.35
#define Q_OWN 0.8
#define Q_REF 0.6
#define Q_GAIN 6.0
#define NEEDLE_Q 0.9 /* a question row: 0.9 needle + own topic; scores ~8 on the passage */

dhsa_status dhsa_synth_generate(const dhsa_synth_params *sp, float *q, float *k, float *v,
                                dhsa_synth_needle *needles) {
    if (!sp || !q || !k || !v || (sp->n_needles > 0 && !needles))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_synth_generate: NULL argument");
    const int64_t B = sp->B, Hq = sp->Hq, Hkv = sp->Hkv, L = sp->L, d = sp->d;
    if (B < 1 || Hkv < 1 || Hq < 1 || Hq % Hkv || L < 1 || d < 1 || d > 65536 || L > ((int64_t)1 << 34))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "synthetic sizes B=%lld Hq=%lld Hkv=%lld L=%lld d=%lld",
                          (long long)B, (long long)Hq, (long long)Hkv, (long long)L, (long long)d);
    if (sp->seg_min < 1 || sp->seg_max < sp->seg_min)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "segment lengths need 1 <= seg_min <= seg_max");
    if (sp->n_needles < 0 || sp->n_needles > DHSA_SYNTH_MAX_NEEDLES || sp->q_block < 1 || sp->needle_len < 1)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "n_needles must be in [0, %d], q_block and needle_len >= 1",
                          DHSA_SYNTH_MAX_NEEDLES);
    int64_t n_qb = (L + sp->q_block - 1) / sp->q_block;
    if (sp->n_needles > n_qb)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "%d needles need as many query blocks (L has %lld)",
                          sp->n_needles, (long long)n_qb);
    for (int i = 0; i < sp->n_needles; i++)
        if (!(sp->depths[i] >= 0.0 && sp->depths[i] < 1.0))
            return dhsa__fail(DHSA_ERR_INVALID_ARG, "needle depth %g is not in [0, 1)", sp->depths[i]);

    /* segments: seg_of[t], their count and starts */
    int64_t *seg_start = malloc((size_t)(L + 1) * sizeof(int64_t));
    int64_t *seg_of = malloc((size_t)L * sizeof(int64_t));
    float *topic = NULL, *dir = malloc((size_t)d * sizeof(float));
    if (!seg_start || !seg_of || !dir) goto oom;
    uint64_t rng = sp->seed * 0x2545f4914f6cdd1dull + 17;
    int64_t ns = 0;
    for (int64_t t = 0; t < L; ns++) {
        int64_t len = sp->seg_min + (int64_t)(uniform(&rng) * (double)(sp->seg_max - sp->seg_min + 1));
        if (len > sp->seg_max) len = sp->seg_max;
        seg_start[ns] = t;
        for (int64_t e = t + len < L ? t + len : L; t < e; t++) seg_of[t] = ns;
    }
    seg_start[ns] = L;
    topic = malloc((size_t)ns * (size_t)Hkv * (size_t)d * sizeof(float)); /* [ns][Hkv][d] */
    if (!topic) goto oom;
    for (int64_t s = 0; s < ns * Hkv; s++) unit(&rng, topic + s * d, d);

    /* each segment retrieves one earlier segment (itself for the first) */
    int64_t *ref = malloc((size_t)ns * sizeof(int64_t));
    if (!ref) goto oom;
    for (int64_t s = 0; s < ns; s++) ref[s] = s == 0 ? 0 : (int64_t)(uniform(&rng) * (double)s);

    const double ksc = sqrt((double)d), noise = KEY_NOISE;
    for (int64_t b = 0; b < B; b++) {
        for (int64_t g = 0; g < Hkv; g++)
            for (int64_t t = 0; t < L; t++) {
                float *kr = k + ((b * Hkv + g) * L + t) * d, *vr = v + ((b * Hkv + g) * L + t) * d;
                const float *u = topic + (seg_of[t] * Hkv + g) * d;
                /* values: the segment's value direction (the second half of
                 * its topic vector, rotated) plus as much noise, so outputs
                 * carry what the attended segments say */
                for (int64_t c = 0; c < d; c++) {
                    kr[c] = (float)((u[c] + noise * normal(&rng) / ksc) * ksc / sqrt(ksc));
                    vr[c] = (float)(u[(c + d / 2) % d] * ksc + normal(&rng));
                }
            }
        for (int64_t h = 0; h < Hq; h++) {
            int64_t g = h / (Hq / Hkv);
            for (int64_t t = 0; t < L; t++) {
                float *qr = q + ((b * Hq + h) * L + t) * d;
                const float *own = topic + (seg_of[t] * Hkv + g) * d;
                const float *rf = topic + (ref[seg_of[t]] * Hkv + g) * d;
                for (int64_t c = 0; c < d; c++)
                    qr[c] = (float)((Q_OWN * own[c] + Q_REF * rf[c] + 0.3 * normal(&rng) / ksc) * Q_GAIN *
                                    sqrt(ksc));
            }
        }
    }
    /* needles: a passage at depth * L, asked for by query block (last - i) */
    for (int i = 0; i < sp->n_needles; i++) {
        int64_t key = (int64_t)(sp->depths[i] * (double)L);
        int64_t len = key + sp->needle_len <= L ? sp->needle_len : L - key;
        /* the deepest needle is asked by the last block, the next deepest
         * by the one before, and so on: questions come after their facts */
        int rank = 0;
        for (int o = 0; o < sp->n_needles; o++)
            rank += sp->depths[o] > sp->depths[i] || (sp->depths[o] == sp->depths[i] && o < i);
        int64_t qb = n_qb - 1 - rank, r0 = qb * sp->q_block, r1 = r0 + sp->q_block < L ? r0 + sp->q_block : L;
        if (key + len > r0) {
            free(ref);
            free(topic);
            free(dir);
            free(seg_start);
            free(seg_of);
            return dhsa__fail(DHSA_ERR_INVALID_ARG,
                              "needle %d at depth %g ([%lld, %lld)) does not end before the block that asks "
                              "for it (rows from %lld): a longer L, fewer needles, a smaller q_block or a smaller "
                              "depth fits it",
                              i, sp->depths[i], (long long)key, (long long)(key + len), (long long)r0);
        }
        needles[i].key = key;
        needles[i].len = len;
        needles[i].row = r0;
        needles[i].rows = r1 - r0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t g = 0; g < Hkv; g++) {
                unit(&rng, dir, d);
                for (int64_t t = key; t < key + len; t++) {
                    float *kr = k + ((b * Hkv + g) * L + t) * d;
                    for (int64_t c = 0; c < d; c++)
                        kr[c] = (float)((dir[c] + noise * normal(&rng) / ksc) * sqrt(ksc));
                }
                for (int64_t h = g * (Hq / Hkv); h < (g + 1) * (Hq / Hkv); h++)
                    for (int64_t row = r0; row < r1; row++) {
                        float *qr = q + ((b * Hq + h) * L + row) * d;
                        const float *own = topic + (seg_of[row] * Hkv + g) * d;
                        for (int64_t c = 0; c < d; c++)
                            qr[c] = (float)((NEEDLE_Q * dir[c] + 0.45 * own[c] + 0.3 * normal(&rng) / ksc) *
                                            Q_GAIN * 1.5 * sqrt(ksc));
                    }
            }
    }
    free(ref);
    free(topic);
    free(dir);
    free(seg_start);
    free(seg_of);
    return DHSA_OK;
oom:
    free(topic);
    free(dir);
    free(seg_start);
    free(seg_of);
    return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory generating the synthetic workload");
}

/* ------------------------------------------------------------ fidelity --- */

dhsa_status dhsa_fidelity_compare(const dhsa_tensor *od, const dhsa_tensor *ld, const dhsa_tensor *os,
                                  const dhsa_tensor *ls, dhsa_fidelity *out) {
    if (!od || !ld || !os || !ls || !out || !od->data || !ld->data || !os->data || !ls->data)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_fidelity_compare: NULL argument");
    for (int i = 0; i < 4; i++)
        if (od->shape[i] != os->shape[i] || (i < 3 && (ld->shape[i] != od->shape[i] || ls->shape[i] != od->shape[i])))
            return dhsa__fail(DHSA_ERR_SHAPE, "dense and sparse outputs differ in shape");
    if (od->type != DHSA_F32 || os->type != DHSA_F32 || ld->type != DHSA_F32 || ls->type != DHSA_F32)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_fidelity_compare wants F32 views");
    double rec = 0, rmin = 1.0, num = 0, den = 0;
    int64_t rows = 0;
    for (int64_t b = 0; b < od->shape[0]; b++)
        for (int64_t h = 0; h < od->shape[1]; h++)
            for (int64_t i = 0; i < od->shape[2]; i++) {
                float a = *(const float *)dhsa__at(ld, b, h, i), s = *(const float *)dhsa__at(ls, b, h, i);
                const float *x = dhsa__at(od, b, h, i), *y = dhsa__at(os, b, h, i);
                for (int64_t c = 0; c < od->shape[3]; c++) {
                    double dx = (double)x[c * od->stride[3]], dy = (double)y[c * os->stride[3]];
                    num += (dx - dy) * (dx - dy);
                    den += dx * dx;
                }
                if (a == -INFINITY) continue;
                double r = s == -INFINITY ? 0.0 : exp((double)s - (double)a);
                if (r > 1.0) r = 1.0; /* rounding: a subset cannot hold more mass */
                rec += r;
                if (r < rmin) rmin = r;
                rows++;
            }
    out->recall = rows ? rec / (double)rows : 1.0;
    out->recall_min = rows ? rmin : 1.0;
    out->rel_err = den > 0 ? sqrt(num / den) : sqrt(num);
    out->rows = rows;
    return DHSA_OK;
}
