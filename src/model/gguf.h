/* gguf.h: private parts of the GGUF reader/writer (src/model/gguf.c). The
 * public API is the GGUF block of include/dhsa.h; docs/gguf.md describes
 * what is read and checked. Tested by tests/test_gguf.c.
 */
#ifndef DHSA_MODEL_GGUF_H
#define DHSA_MODEL_GGUF_H

#include "dhsa.h"

#include <stddef.h>
#include <stdint.h>

/* Limits the reader enforces (see docs/gguf.md). */
#define DHSA_GGUF_MAX_KEY 65535   /* bytes in a key (the spec's limit) */
#define DHSA_GGUF_MAX_NAME 65535  /* bytes in a tensor name */
#define DHSA_GGUF_MAX_DIMS 4

/* Bytes the reader requested from the allocator during the last open on
 * this thread (cumulative). The reader keeps it under
 * DHSA_GGUF_ALLOC_CAP(file size), whatever counts the file claims. */
uint64_t dhsa_gguf__last_open_alloc(void);
#define DHSA_GGUF_ALLOC_CAP(size) ((uint64_t)(size) * 32 + ((uint64_t)1 << 18))

/* Memory the reader holds for g (for the memory plan, src/model/session.c):
 * *map and *mapped its file mapping (NULL and 0 when it has none), *owned
 * the bytes of a copy it owns (read() when mmap failed, or the llama2.c
 * importer's image; 0 otherwise), *heap its own tables and strings as
 * dhsa__heap_block counts them (src/core/procmem.h). */
void dhsa_gguf__memory(const dhsa_gguf *g, const void **map, size_t *mapped, size_t *owned, size_t *heap);

/* The file's bytes [0, size) as the reader holds them (mapped or copied). */
void dhsa_gguf__bytes(const dhsa_gguf *g, const uint8_t **base, uint64_t *size);

/* dhsa_gguf_open_memory over a malloc'd buffer that the dhsa_gguf takes
 * over: freed by dhsa_gguf_close, or at once when the open fails (also on
 * a bad argument). Used by the llama2.c importer (src/model/llama2c.c),
 * which converts a checkpoint into a GGUF image in memory. */
dhsa_status dhsa_gguf__open_memory_owned(void *data, size_t size, dhsa_gguf **out);

/* Fuzz harness body (libFuzzer's LLVMFuzzerTestOneInput calls it): opens
 * data[0..size) from memory and, when that succeeds, walks every key,
 * value, array element, tensor and tensor byte range, and checks the
 * lookups agree. Returns 0, or 1 when a contract is broken (an error
 * without a sentence, a lookup that disagrees, allocation over
 * DHSA_GGUF_ALLOC_CAP); other bugs show up as a crash or a sanitizer
 * report. Not part of the public header. */
int dhsa_gguf_fuzz_one(const uint8_t *data, size_t size);

#endif
