/* gguf_fuzz.c: libFuzzer harness for the GGUF reader. Every input is opened
 * from memory and walked completely (src/model/gguf.c, dhsa_gguf_fuzz_one);
 * a broken contract (an error without a sentence, a lookup that disagrees,
 * memory beyond the cap) aborts so libFuzzer keeps the input.
 * Run: make fuzz (FUZZ_SECONDS=30 per harness).
 */
#include <stdint.h>
#include <stdlib.h>

#include "model/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (dhsa_gguf_fuzz_one(data, size)) abort();
    return 0;
}
