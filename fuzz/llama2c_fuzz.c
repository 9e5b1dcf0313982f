/* llama2c_fuzz.c: libFuzzer harness for the llama2.c checkpoint and
 * tokenizer importer. Each input holds both files ("L2CF" u32 n, n
 * checkpoint bytes, the tokenizer; or a checkpoint then its tokenizer,
 * split where the header says the checkpoint ends), converted in memory
 * and, when that succeeds, checked against the input (src/model/llama2c.c,
 * dhsa_llama2c_fuzz_one). A broken contract (an error without a sentence,
 * an unexpected status, memory beyond the cap, a model that disagrees with
 * its checkpoint) aborts so libFuzzer keeps the input.
 * Run: make fuzz (FUZZ_SECONDS=30 per harness); seeds: a tiny checkpoint
 * written by the Makefile and ../shared/models/stories260K.bin + tok512.bin.
 */
#include <stdint.h>
#include <stdlib.h>

#include "model/llama2c.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (dhsa_llama2c_fuzz_one(data, size)) abort();
    return 0;
}
