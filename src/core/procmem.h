/* procmem.h: what the process holds besides a session's buffers, for the
 * memory plan (src/model/session.c, dhsa_mem_plan in include/dhsa.h;
 * docs/model.md, "Memory plan"). Implemented in src/core/proc.c; tested by
 * tests/test_memlimit.c (peak RSS of real runs under the plan) and
 * tests/test_core.c (the readers).
 */
#ifndef DHSA_CORE_PROCMEM_H
#define DHSA_CORE_PROCMEM_H

#include <stddef.h>

#define DHSA__PAGE ((size_t)4096)
#define DHSA__HUGE_PAGE ((size_t)2 << 20)

/* Bytes glibc's malloc holds for a request of n: a block from the heap
 * takes n + 8 rounded up to 16 (at least 32); one of 128 KiB or more (the
 * initial mmap threshold) is its own mapping, n + 16 rounded up to a page.
 * The larger of the two for every size, so the count is an upper bound
 * whichever way the allocator's dynamic threshold sends a block. */
size_t dhsa__heap_block(size_t n);

/* Writes one byte of every page of p[0..n) (through a volatile pointer:
 * a compiler turns malloc + memset(0) into calloc, which leaves fresh pages
 * untouched), so that they are resident from now on and a plan made later
 * measures them. The bytes written are 0; the rest is left as it was. */
void dhsa__touch(void *p, size_t n);

/* The process as /proc/self shows it when asked (Linux). */
typedef struct {
    int measured;        /* 1 when read from /proc/self; 0: nothing known */
    size_t mapped_files; /* the whole size of every file-backed mapping (and the
                            vDSO) outside [skip, skip + skip_len): the program,
                            the C library, other mapped files */
    size_t anon;         /* anonymous and shared memory resident now (RssAnon +
                            RssShmem of /proc/self/status) */
    int thp_always;      /* transparent huge pages are "always" (any aligned
                            2 MiB range inside an anonymous mapping may become
                            resident as a whole) */
} dhsa__proc_mem;

/* Fills *out; skip/skip_len name a mapping counted elsewhere (the model's
 * file), NULL/0 for none. Never fails: out->measured says what is known. */
void dhsa__proc_measure(const void *skip, size_t skip_len, dhsa__proc_mem *out);

#endif
