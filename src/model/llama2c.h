/* llama2c.h: private parts of the llama2.c checkpoint importer
 * (src/model/llama2c.c). The public API is the llama2.c block of
 * include/dhsa.h; docs/llama2c.md describes the format and every check.
 * Tested by tests/test_llama2c.c; fuzzed by fuzz/llama2c_fuzz.c.
 */
#ifndef DHSA_MODEL_LLAMA2C_H
#define DHSA_MODEL_LLAMA2C_H

#include "dhsa.h"

#include <stddef.h>
#include <stdint.h>

/* Bytes the importer itself requested from the allocator during the last
 * conversion on this thread (token strings, score and type arrays, the
 * GGUF image), cumulative. The GGUF writer's own copies of the metadata
 * and the GGUF reader's tables are not counted here (the reader keeps its
 * own cap, DHSA_GGUF_ALLOC_CAP). The importer stays under
 * DHSA_LLAMA2C_ALLOC_CAP(checkpoint bytes, tokenizer bytes) whatever the
 * headers claim: a GGUF tensor costs at most ~100 bytes of header and
 * padding where the smallest llama2.c layer (9 tensors) takes 104 bytes, and
 * a token at most 3x its text (spaces become U+2581) plus 16 bytes where the
 * tokenizer file stores 8 + its text. */
uint64_t dhsa_llama2c__last_alloc(void);
#define DHSA_LLAMA2C_ALLOC_CAP(bin, tok) \
    ((uint64_t)(bin) * 16 + (uint64_t)(tok) * 16 + ((uint64_t)1 << 20))

/* Bytes a checkpoint with this 28-byte header should have (header
 * included), computed without looking at a file: 0 when the header's
 * fields are out of their domain (not positive, not dividing, ...) or the
 * size overflows. The fuzz harness splits its input with it. */
uint64_t dhsa_llama2c__implied_size(const uint8_t header[28]);

/* Fuzz harness body (libFuzzer's LLVMFuzzerTestOneInput calls it). The
 * input holds both files:
 *   "L2CF" u32 n (little endian), n checkpoint bytes, the tokenizer bytes;
 * or, without that prefix, a checkpoint followed by its tokenizer, split
 * where the checkpoint's header says the checkpoint ends (the whole input
 * is the checkpoint when the header cannot say). Each part is copied to a
 * buffer of its exact size (so ASan sees an over-read), converted with
 * dhsa_llama2c_open_memory, and, when that succeeds, the model is checked:
 * hyperparameters equal the header, every tensor present with its size
 * and its bytes equal the checkpoint's, and the tokenizer built from the
 * metadata round-trips a short text. Returns 0, or 1 when a contract is
 * broken (an error without a sentence, an unexpected status, allocation
 * over the cap, a converted model that disagrees with its input); other
 * bugs show up as a crash or a sanitizer report. */
int dhsa_llama2c_fuzz_one(const uint8_t *data, size_t size);

#endif
