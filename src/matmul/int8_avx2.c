/* int8_avx2.c: AVX2 kernels of the integer path (contract in int8.h; the
 * kernels, and why vpmaddubsw is exact here, in int8_ymm.h). Compiled with
 * -mavx2 -mfma -mf16c by the Makefile (files named *_avx2.c); chosen at run
 * time where the CPU has AVX2 but no VNNI, or DHSA_FORCE_ISA=avx2 says so.
 * Held to the scalar kernels by tests/test_qint.c.
 */
#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define QI_YMM_VNNI 0
#define QI_YMM_KERNELS dhsa__qi_avx2
#include "matmul/int8_ymm.h"
#elif defined(__x86_64__)
#include "matmul/int8.h"
/* Built without AVX2: no kernels (dhsa__qi_kernels_active sees the NULL name). */
const dhsa__qi_kernels dhsa__qi_avx2 = {NULL, 0, 0, 0, 0, NULL, NULL, NULL, NULL, NULL, NULL, 0, NULL, NULL};
#else
typedef int dhsa__qi_avx2_unused; /* ISO C forbids an empty file */
#endif
