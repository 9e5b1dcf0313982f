/* deq.c: dequantizes one row with dhsa (for tools/peer/gguf_py_dequant.py).
 *
 *   build/peer_deq TYPE N ISA < row > floats
 *
 * TYPE a ggml id, N the values in the row (a whole number of blocks), ISA
 * 0 scalar / 1 AVX2 / 2 AVX-512. Reads the row's bytes from stdin, writes N
 * little-endian F32 values to stdout; exits 1 with a sentence on stderr if
 * dhsa refuses (an ISA the machine lacks included), 2 on a short read. */
#include "dhsa.h"
#include "matmul/f32.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s TYPE N ISA < row > floats\n", argv[0]);
        return 1;
    }
    uint32_t type = (uint32_t)strtoul(argv[1], NULL, 10);
    int64_t n = strtoll(argv[2], NULL, 10);
    if (dhsa_set_isa((dhsa_isa)atoi(argv[3])) != DHSA_OK) {
        fprintf(stderr, "%s\n", dhsa_last_error());
        return 1;
    }
    int64_t rb = dhsa__wt_row_bytes(type, n);
    if (rb < 0 || n <= 0) {
        fprintf(stderr, "type %u: %lld values are not whole blocks of a supported type\n", (unsigned)type, (long long)n);
        return 1;
    }
    unsigned char *row = malloc((size_t)rb);
    float *out = malloc((size_t)n * sizeof(float));
    if (!row || !out) return 1;
    if (fread(row, 1, (size_t)rb, stdin) != (size_t)rb) return 2;
    if (dhsa__dequantize_row(type, row, out, n) != DHSA_OK) {
        fprintf(stderr, "%s\n", dhsa_last_error());
        return 1;
    }
    fwrite(out, sizeof(float), (size_t)n, stdout);
    free(row);
    free(out);
    return 0;
}
