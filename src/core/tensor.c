/* tensor.c: strided views and the F16 / BF16 <-> F32 conversions (round to
 * nearest even; NaN stays NaN, Inf stays Inf). Tested by tests/test_core.c.
 */
#include "core/internal.h"

size_t dhsa_type_size(dhsa_type t) {
    switch (t) {
    case DHSA_F32: return 4;
    case DHSA_F16:
    case DHSA_BF16: return 2;
    case DHSA_Q8_0: return 0; /* a block type: dhsa_type_row_bytes */
    }
    return 0;
}

size_t dhsa_type_row_bytes(dhsa_type t, int64_t n) {
    if (n < 0) return 0;
    if (t == DHSA_Q8_0) return n % DHSA_Q8_BLOCK ? 0 : (size_t)(n / DHSA_Q8_BLOCK) * DHSA_Q8_BYTES;
    return (size_t)n * dhsa_type_size(t);
}

const char *dhsa_type_name(dhsa_type t) {
    switch (t) {
    case DHSA_F32: return "f32";
    case DHSA_F16: return "f16";
    case DHSA_BF16: return "bf16";
    case DHSA_Q8_0: return "q8_0";
    }
    return "unknown";
}

dhsa_status dhsa__check_view_type(const char *name, const dhsa_tensor *t) {
    if (t->type == DHSA_F32 || t->type == DHSA_F16 || t->type == DHSA_BF16) return DHSA_OK;
    if (t->type != DHSA_Q8_0) return dhsa__fail(DHSA_ERR_INVALID_ARG, "%s has an unknown type %d", name, (int)t->type);
    if (t->shape[3] % DHSA_Q8_BLOCK)
        return dhsa__fail(DHSA_ERR_SHAPE, "%s is Q8_0 with dim %lld: a Q8_0 row is whole blocks of 32 values, so "
                          "the dim must be a multiple of 32", name, (long long)t->shape[3]);
    if (t->stride[3] != 1)
        return dhsa__fail(DHSA_ERR_SHAPE, "%s is Q8_0 with dim stride %lld: Q8_0 rows must be contiguous "
                          "(stride[3] == 1)", name, (long long)t->stride[3]);
    for (int i = 0; i < 3; i++)
        if (t->stride[i] % DHSA_Q8_BLOCK)
            return dhsa__fail(DHSA_ERR_SHAPE, "%s is Q8_0 with stride[%d] = %lld elements: Q8_0 strides must be "
                              "multiples of 32 (rows start at block boundaries)", name, i, (long long)t->stride[i]);
    return DHSA_OK;
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
