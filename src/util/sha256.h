/* sha256.h: SHA-256 (FIPS 180-4), incremental. Internal; `dhsa pull`
 * (tools/pull.c) checks the models it fetches with it. No allocation, no
 * failure. Tested with the standard vectors by tests/test_sha256.c.
 */
#ifndef DHSA_UTIL_SHA256_H
#define DHSA_UTIL_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint32_t h[8];
    uint64_t bytes; /* message length so far */
    uint8_t block[64];
    size_t fill; /* bytes in block */
} dhsa_sha256;

void dhsa_sha256_init(dhsa_sha256 *s);
void dhsa_sha256_update(dhsa_sha256 *s, const void *data, size_t n);
/* The digest as 64 lowercase hex digits and a NUL (hex[65]). s is spent. */
void dhsa_sha256_final_hex(dhsa_sha256 *s, char hex[65]);

#endif
