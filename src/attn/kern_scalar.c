/* kern_scalar.c: portable C micro-kernels of the tiled attention; the
 * reference the SIMD kernels are held to, and the path non-x86 machines and
 * DHSA_FORCE_SCALAR=1 run. Contracts in kern.h.
 */
#include "attn/kern.h"
#include "dhsa.h"

static void qk(const float *K, int64_t ldk, int n, int d, const float *Qt, int W, float *S) {
    for (int j = 0; j < n; j++) {
        float *s = S + (int64_t)j * W;
        const float *k = K + j * ldk;
        for (int i = 0; i < W; i++) s[i] = 0.0f;
        for (int c = 0; c < d; c++) {
            float kc = k[c];
            const float *q = Qt + (int64_t)c * W;
            for (int i = 0; i < W; i++) s[i] += kc * q[i];
        }
    }
}

static void softmax(float *S, int n, int W, float *m, float *l, float *alpha) {
    for (int i = 0; i < W; i++) {
        float mx = m[i];
        for (int j = 0; j < n; j++) mx = S[(int64_t)j * W + i] > mx ? S[(int64_t)j * W + i] : mx;
        /* all -inf so far: subtract 0 so exp gives 0, not NaN */
        float base = mx == -INFINITY ? 0.0f : mx;
        alpha[i] = dhsa__expf(m[i] - base);
        float sum = 0.0f;
        for (int j = 0; j < n; j++) {
            float p = dhsa__expf(S[(int64_t)j * W + i] - base);
            S[(int64_t)j * W + i] = p;
            sum += p;
        }
        l[i] = l[i] * alpha[i] + sum;
        m[i] = mx;
    }
}

static void pv(const float *V, int64_t ldv, int n, int dv, const float *S, int W, const float *alpha,
               float *Ot) {
    for (int c = 0; c < dv; c++) {
        float *o = Ot + (int64_t)c * W;
        for (int i = 0; i < W; i++) o[i] *= alpha[i];
        for (int j = 0; j < n; j++) {
            float vc = V[j * ldv + c];
            const float *p = S + (int64_t)j * W;
            for (int i = 0; i < W; i++) o[i] += vc * p[i];
        }
    }
}

static void softcap(float *S, int64_t count, float cap) {
    float inv = 1.0f / cap;
    for (int64_t t = 0; t < count; t++) {
        /* tanh(y) = 1 - 2 / (exp(2y) + 1): exact limits +-1, no overflow */
        float e = dhsa__expf(2.0f * S[t] * inv);
        S[t] = cap * (1.0f - 2.0f / (e + 1.0f));
    }
}

static void qk_rows(const float *K, int64_t ldk, int n, int d, const float *Qr, int64_t dq, int nq,
                    float *Sr) {
    for (int i = 0; i < nq; i++)
        for (int j = 0; j < n; j++) {
            float acc = 0.0f;
            for (int c = 0; c < d; c++) acc += K[j * ldk + c] * Qr[i * dq + c];
            Sr[i * DHSA_BC + j] = acc;
        }
}

static void softmax_rows(float *Sr, int n, int nq, float *m, float *l, float *alpha) {
    for (int i = 0; i < nq; i++) {
        float *s = Sr + i * DHSA_BC;
        float mx = m[i];
        for (int j = 0; j < n; j++) mx = s[j] > mx ? s[j] : mx;
        float base = mx == -INFINITY ? 0.0f : mx;
        alpha[i] = dhsa__expf(m[i] - base);
        float sum = 0.0f;
        for (int j = 0; j < n; j++) {
            s[j] = dhsa__expf(s[j] - base);
            sum += s[j];
        }
        l[i] = l[i] * alpha[i] + sum;
        m[i] = mx;
    }
}

static void pv_rows(const float *V, int64_t ldv, int n, int dv, const float *Sr, int nq,
                    const float *alpha, float *Or) {
    for (int i = 0; i < nq; i++) {
        float *o = Or + (int64_t)i * dv;
        for (int c = 0; c < dv; c++) o[c] *= alpha[i];
        for (int j = 0; j < n; j++) {
            float p = Sr[i * DHSA_BC + j];
            for (int c = 0; c < dv; c++) o[c] += p * V[j * ldv + c];
        }
    }
}

static void widen(const uint16_t *src, int is_bf16, int64_t n, float *dst) {
    for (int64_t c = 0; c < n; c++) dst[c] = is_bf16 ? dhsa_bf16_to_f32(src[c]) : dhsa_f16_to_f32(src[c]);
}

/* Q8_0 block: F16 scale at byte 0, 32 int8 codes at bytes 2..33. */
static void widen_q8(const void *src, int64_t n, float *dst) {
    const unsigned char *blk = src;
    for (int64_t b = 0; b < n / 32; b++, blk += 34, dst += 32) {
        uint16_t h;
        memcpy(&h, blk, 2);
        float d = dhsa_f16_to_f32(h);
        for (int c = 0; c < 32; c++) dst[c] = d * (float)(int8_t)blk[2 + c];
    }
}

static void glu(const float *g, const float *u, int64_t n, int gelu, float *out) {
    for (int64_t i = 0; i < n; i++) {
        float z = g[i];
        /* z^3 may overflow to +-inf: exp then gives 0 or its clamp, and the
         * quotient z or about 0, the limits */
        float a = gelu ? DHSA_GELU_K1 * (z + DHSA_GELU_K3 * z * z * z) : -z;
        out[i] = z / (1.0f + dhsa__expf(a)) * u[i];
    }
}

static void expw(const float *x, int64_t n, float sub, float mul, float *out) {
    for (int64_t i = 0; i < n; i++) out[i] = dhsa__expf((x[i] - sub) * mul);
}

const dhsa_attn_kernels dhsa__kern_scalar = {qk, softmax, pv, softcap, qk_rows, softmax_rows, pv_rows, widen,
                                          NULL, NULL, widen_q8, NULL, NULL, glu, expw};
