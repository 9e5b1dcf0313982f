/* int8_avxvnni.c: AVX-VNNI kernels of the integer path (contract in
 * int8.h; the kernels in int8_ymm.h, the AVX2 ones with vpdpbusd on ymm
 * for the dot). Compiled with -mavx2 -mfma -mf16c -mavxvnni by the Makefile
 * (files named *_avxvnni.c) where the compiler knows -mavxvnni (GCC >= 11,
 * clang >= 12); chosen at run time where the CPU has AVX-VNNI but not
 * AVX512-VNNI (or the AVX-512 ISA is off: DHSA_FORCE_ISA=avx-vnni).
 * Held to the scalar kernels by tests/test_qint.c.
 */
#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && defined(__AVXVNNI__)
#define QI_YMM_VNNI 1
#define QI_YMM_KERNELS dhsa__qi_avxvnni
#include "matmul/int8_ymm.h"
#elif defined(__x86_64__)
#include "matmul/int8.h"
/* Built without AVX-VNNI: no kernels (dhsa__qi_kernels_active sees the NULL name). */
const dhsa__qi_kernels dhsa__qi_avxvnni = {NULL, 0, 0, 0, 0, NULL, NULL, NULL, NULL, NULL, NULL, 0, NULL, NULL};
#else
typedef int dhsa__qi_avxvnni_unused; /* ISO C forbids an empty file */
#endif
