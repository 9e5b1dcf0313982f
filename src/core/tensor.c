/* tensor.c: strided views and the F16 / BF16 <-> F32 conversions (round to
 * nearest even; NaN stays NaN, Inf stays Inf). Tested by tests/test_core.c.
 */
#include "core/internal.h"

size_t dhsa_type_size(dhsa_type t) { return t == DHSA_F32 ? 4 : 2; }

const char *dhsa_type_name(dhsa_type t) {
    switch (t) {
    case DHSA_F32: return "f32";
    case DHSA_F16: return "f16";
    case DHSA_BF16: return "bf16";
    }
    return "unknown";
}

dhsa_tensor dhsa_tensor_bhld(void *data, dhsa_type t, int64_t B, int64_t H, int64_t L, int64_t D) {
    dhsa_tensor x = {data, t, {B, H, L, D}, {H * L * D, L * D, D, 1}};
    return x;
}

dhsa_tensor dhsa_tensor_blhd(void *data, dhsa_type t, int64_t B, int64_t L, int64_t H, int64_t D) {
    dhsa_tensor x = {data, t, {B, H, L, D}, {L * H * D, D, H * D, 1}};
    return x;
}

static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t dhsa_f32_to_bf16(float x) {
    uint32_t u = f2u(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

float dhsa_bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }

uint16_t dhsa_f32_to_f16(float x) {
    uint32_t u = f2u(x);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u); /* NaN */
    if (a >= 0x47800000u) {                                   /* >= 65536: Inf or overflow */
        /* values in [65520, 65536) round up to Inf too, handled below */
        return (uint16_t)(sign | 0x7c00u);
    }
    if (a < 0x38800000u) { /* below the smallest normal half (2^-14): subnormal or zero */
        /* value = a_float; half subnormal unit = 2^-24. Round to nearest even. */
        float f = u2f(a);
        float scaled = f * 16777216.0f; /* exact: multiply by 2^24 */
        uint32_t q = (uint32_t)scaled;
        float rem = scaled - (float)q;
        if (rem > 0.5f || (rem == 0.5f && (q & 1))) q++;
        return (uint16_t)(sign | q); /* q may reach 0x400: the smallest normal, still right */
    }
    /* normal: rebias exponent from 127 to 15, round mantissa 23 -> 10 bits */
    uint32_t r = a - 0x38000000u; /* (127 - 15) << 23 */
    uint32_t mant_round = r + 0xfffu + ((r >> 13) & 1);
    uint32_t h = mant_round >> 13;
    if (h >= 0x7c00u) h = 0x7c00u; /* rounded up into Inf */
    return (uint16_t)(sign | h);
}

float dhsa_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    if (e == 0) {
        if (m == 0) return u2f(sign);
        float f = (float)m * (1.0f / 16777216.0f); /* m * 2^-24, exact */
        return sign ? -f : f;
    }
    if (e == 31) return u2f(sign | 0x7f800000u | (m << 13));
    return u2f(sign | ((e + 112u) << 23) | (m << 13));
}
