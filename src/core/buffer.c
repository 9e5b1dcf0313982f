/* buffer.c: large tensor buffers for callers (K/V caches, benchmark
 * inputs). Long sequences make K and V of one head span thousands of 4 KiB
 * pages; two threads streaming them exhaust the TLB (measured here: dense
 * attention at L = 8192, d = 128 fell from 0.90 to 0.80 of peak). Buffers of
 * 2 MiB or more are therefore 2 MiB aligned and advised as transparent huge
 * pages (Linux MADV_HUGEPAGE; a hint, harmless where unsupported).
 * Tested by tests/test_core.c.
 */
#include "core/internal.h"

#include <stdlib.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#define HUGE_PAGE ((size_t)2 << 20)

void *dhsa_buffer_alloc(size_t bytes) {
    if (bytes == 0) bytes = 1;
    size_t align = bytes >= HUGE_PAGE ? HUGE_PAGE : 64;
    if (bytes > SIZE_MAX - align) {
        dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "buffer of %zu bytes is too large", bytes);
        return NULL;
    }
    size_t rounded = dhsa__align_up(bytes, align);
    void *p = NULL;
    if (posix_memalign(&p, align, rounded) != 0) {
        dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory allocating a %zu-byte buffer", bytes);
        return NULL;
    }
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (align == HUGE_PAGE) (void)madvise(p, rounded, MADV_HUGEPAGE);
#endif
    return p;
}

void dhsa_buffer_free(void *p) { free(p); }
