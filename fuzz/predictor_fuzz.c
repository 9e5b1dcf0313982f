/* predictor_fuzz.c: libFuzzer harness for the boundary-predictor file
 * reader (src/route/predictor.c). Any input must load or be refused with a
 * sentence; a loaded predictor must report its sizes.
 * The file ends with a CRC-32 of everything before it, which a mutation
 * almost always breaks: an input whose CRC is wrong is also loaded with
 * the right CRC written in (a copy), so the checks behind the CRC (sizes,
 * finite weights) see mutated files too.
 * Run: make fuzz; seeds: small random predictors (fuzz/predictor_seed.c).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dhsa.h"

/* CRC-32 (IEEE, reflected, as zlib and docs/predictor.md). */
static uint32_t crc32_ieee(const uint8_t *p, size_t n) {
    uint32_t crc = ~0u;
    for (size_t i = 0; i < n; i++) {
        crc ^= p[i];
        for (int k = 0; k < 8; k++) crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1u)));
    }
    return ~crc;
}

static void load_one(const uint8_t *data, size_t size) {
    dhsa_predictor *p = NULL;
    dhsa_status st = dhsa_predictor_load_memory(data, size, &p);
    if (st == DHSA_OK) {
        if (!p || dhsa_predictor_width(p) < 1 || dhsa_predictor_window(p) < 1) abort();
        dhsa_predictor_free(p);
    } else if (p || !dhsa_last_error()[0]) {
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    load_one(data, size);
    if (size < 8) return 0;
    uint32_t crc = crc32_ieee(data, size - 4), stored = 0;
    for (int i = 0; i < 4; i++) stored |= (uint32_t)data[size - 4 + i] << (8 * i); /* little-endian */
    if (crc != stored) {
        uint8_t *c = malloc(size);
        if (!c) abort();
        memcpy(c, data, size - 4);
        for (int i = 0; i < 4; i++) c[size - 4 + i] = (uint8_t)(crc >> (8 * i));
        load_one(c, size);
        free(c);
    }
    return 0;
}
