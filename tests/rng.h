/* tests/rng.h: the tests' deterministic inputs: splitmix64 and Box-Muller
 * normals, one seed per stream (rng_t r = {seed}). Header-only; every
 * function is static inline so a test includes it whatever it uses. */
#ifndef DHSA_TESTS_RNG_H
#define DHSA_TESTS_RNG_H

#include <math.h>
#include <stdint.h>

typedef struct { uint64_t s; } rng_t;

static inline uint64_t rng_u64(rng_t *r) {
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
/* uniform in [0, 1) with 53 random bits */
static inline double rng_unif(rng_t *r) { return (double)(rng_u64(r) >> 11) * 0x1p-53; }
static inline double rng_normal(rng_t *r) {
    double u1 = rng_unif(r), u2 = rng_unif(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#endif
