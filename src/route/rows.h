/* rows.h: reading rows of q and k as floats and summing them, shared by the
 * router's files (boundaries.c, select.c, route.c) so that every sum is the
 * same float operations in the same order wherever it is taken.
 */
#ifndef DHSA_ROUTE_ROWS_H
#define DHSA_ROUTE_ROWS_H

#include "core/internal.h"

/* Row l of head h, batch b of a typed view as d floats: in place when the
 * view is F32 with unit dim stride, else converted into buf (exact: every
 * type widens to F32 without rounding). The loops below then read plain
 * floats; the values, and so every sum, are those of dhsa__load. */
static inline const float *dhsa__row_f32(const dhsa_tensor *t, int64_t b, int64_t h, int64_t l, int64_t d, float *buf) {
    const void *row = dhsa__at(t, b, h, l);
    if (t->type == DHSA_F32 && t->stride[3] == 1) return row;
    for (int64_t x = 0; x < d; x++) buf[x] = dhsa__load(row, t->type, x * t->stride[3]);
    return buf;
}

/* sum[x] += q[x] and, with sq, sq[x] += q[x] * q[x], for x < d. Blocks of
 * 16 with a fixed trip count let -O2 vectorize it (no FMA: the build's
 * flags have none, and C11 mode does not contract), and every element
 * gets the same float operations in the same order as a plain loop. */
static inline void dhsa__add_row(float *restrict sum, float *restrict sq, const float *restrict q, int64_t d) {
    int64_t x = 0;
    for (; x + 16 <= d; x += 16) {
        for (int k = 0; k < 16; k++) sum[x + k] += q[x + k];
        if (sq)
            for (int k = 0; k < 16; k++) sq[x + k] += q[x + k] * q[x + k];
    }
    for (; x < d; x++) {
        sum[x] += q[x];
        if (sq) sq[x] += q[x] * q[x];
    }
}

/* L[c] += x[c] (sub: L[c] -= x[c]) in double, blocks of 16 as dhsa__add_row. */
static inline void dhsa__add_row_d(double *restrict L, const float *restrict x, int64_t d, int sub) {
    int64_t c = 0;
    if (sub) {
        for (; c + 16 <= d; c += 16)
            for (int k = 0; k < 16; k++) L[c + k] -= x[c + k];
        for (; c < d; c++) L[c] -= x[c];
    } else {
        for (; c + 16 <= d; c += 16)
            for (int k = 0; k < 16; k++) L[c + k] += x[c + k];
        for (; c < d; c++) L[c] += x[c];
    }
}

#endif
