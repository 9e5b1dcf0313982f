/* cpu.c: run-time CPU feature detection and the process-wide ISA choice.
 * The best ISA the CPU and build support is used unless DHSA_FORCE_SCALAR=1
 * or dhsa_set_isa() says otherwise. Tested by tests/test_attn.c (every ISA
 * against the same reference).
 */
#include "core/internal.h"

#include <stdatomic.h>
#include <stdlib.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

static atomic_int active = -1;

static dhsa_isa detect(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    /* The OS must also save the wide registers: __builtin_cpu_supports checks
     * XCR0 for avx512f/avx2 in GCC >= 11 and clang. */
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("fma"))
        return DHSA_ISA_AVX512;
    /* F16C (CPUID.1:ECX bit 29): not every compiler's builtin knows it */
    unsigned a, b, c, d;
    int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c)
        return DHSA_ISA_AVX2;
#endif
    return DHSA_ISA_SCALAR;
}

static int supported(dhsa_isa isa) { return (int)isa <= (int)detect(); }

dhsa_isa dhsa_active_isa(void) {
    int a = atomic_load(&active);
    if (a < 0) {
        const char *f = getenv("DHSA_FORCE_SCALAR");
        a = (f && f[0] == '1') ? DHSA_ISA_SCALAR : (int)detect();
        int expected = -1;
        if (!atomic_compare_exchange_strong(&active, &expected, a)) a = expected;
    }
    return (dhsa_isa)a;
}

dhsa_status dhsa_set_isa(dhsa_isa isa) {
    if ((int)isa < DHSA_ISA_SCALAR || (int)isa > DHSA_ISA_AVX512)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "unknown ISA %d", (int)isa);
    if (!supported(isa))
        return dhsa__fail(DHSA_ERR_UNSUPPORTED, "this CPU or build does not support %s",
                          dhsa_isa_name(isa));
    atomic_store(&active, (int)isa);
    return DHSA_OK;
}

const char *dhsa_isa_name(dhsa_isa isa) {
    switch (isa) {
    case DHSA_ISA_SCALAR: return "scalar";
    case DHSA_ISA_AVX2: return "avx2";
    case DHSA_ISA_AVX512: return "avx512";
    }
    return "unknown";
}
