/* cpu.c: run-time CPU feature detection and the process-wide ISA choice.
 * The best ISA the CPU and build support is used unless the environment
 * (read once) or dhsa_set_isa() says otherwise:
 *   DHSA_FORCE_SCALAR=1       the scalar kernels everywhere;
 *   DHSA_FORCE_ISA=scalar     the same;
 *   DHSA_FORCE_ISA=avx2       AVX2 kernels, and no VNNI in the fast route's
 *                             integer kernels (vpmaddubsw): what an AVX2-only
 *                             CPU runs;
 *   DHSA_FORCE_ISA=avx-vnni   AVX2 kernels, the integer ones on AVX-VNNI;
 *   DHSA_FORCE_ISA=avx512-vnni AVX-512 without the AMX tiles (the prefill
 *                             route of matmul/amx.h off, and the K panel of
 *                             Q4_K / Q5_K on the tiles' int8 products,
 *                             matmul/int8.h, on the VNNI kernels: the same
 *                             bits, slower);
 *   DHSA_FORCE_ISA=avx512     the default on an AVX-512 CPU;
 *   DHSA_AMX=1                the prefill route of matmul/amx.h on the AMX
 *                             tiles where the CPU, the OS and the build have
 *                             them (off by default: a row's result then
 *                             depends on the size of the call it is in;
 *                             docs/quant.md, "The AMX route").
 * A value above what the CPU has gives the CPU's best. The integer
 * dot-product level (dhsa__idot_active) follows the active ISA and that cap;
 * AVX512-BF16 (dhsa__bf16_isa_ok, the fast route's F16/BF16 kernels) runs
 * only under the AVX-512 ISA, so avx2, avx-vnni and scalar turn it off
 * (whether those kernels pay on this CPU, and DHSA_BF16, see matmul/bf16.h).
 * Tested by tests/test_attn.c (every ISA against the same reference) and
 * tests/test_qint.c (every integer kernel against the scalar one).
 */
#include "core/internal.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

static atomic_int active = -1;
static atomic_int idot_cap = -1; /* -1: the environment not read yet */
static atomic_int idot_cpu = -1; /* bit 0: AVX-VNNI, bit 1: AVX512-VNNI, bit 2: AVX512-BF16 */

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

/* The caps the environment sets (see the top of the file). */
static void env_caps(int *isa_cap, int *dot_cap) {
    *isa_cap = DHSA_ISA_AVX512;
    *dot_cap = DHSA__IDOT_AVX512VNNI;
    const char *f = getenv("DHSA_FORCE_SCALAR"), *e = getenv("DHSA_FORCE_ISA");
    if (e && strcmp(e, "avx512-vnni") == 0) return; /* the AMX cap: amx_env_on */
    if (f && f[0] == '1') {
        *isa_cap = DHSA_ISA_SCALAR;
        *dot_cap = DHSA__IDOT_NONE;
        return;
    }
    if (!e || !e[0]) return;
    if (strcmp(e, "scalar") == 0) {
        *isa_cap = DHSA_ISA_SCALAR;
        *dot_cap = DHSA__IDOT_NONE;
    } else if (strcmp(e, "avx2") == 0) {
        *isa_cap = DHSA_ISA_AVX2;
        *dot_cap = DHSA__IDOT_AVX2;
    } else if (strcmp(e, "avx-vnni") == 0) {
        *isa_cap = DHSA_ISA_AVX2;
        *dot_cap = DHSA__IDOT_AVXVNNI;
    } else if (strcmp(e, "avx512") != 0) {
        dhsa__warn_once("DHSA_FORCE_ISA", "DHSA_FORCE_ISA=%s is not one of scalar, avx2, avx-vnni, avx512-vnni, avx512: ignored",
                        dhsa__esc(e));
    }
}

static int supported(dhsa_isa isa) { return (int)isa <= (int)detect(); }

dhsa_isa dhsa_active_isa(void) {
    int a = atomic_load(&active);
    if (a < 0) {
        int isa_cap, dot_cap;
        env_caps(&isa_cap, &dot_cap);
        a = (int)detect();
        if (a > isa_cap) a = isa_cap;
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

/* ------------------------------------------- integer dot products --- */

static int idot_cpu_flags(void) {
    int v = atomic_load(&idot_cpu);
    if (v >= 0) return v;
    v = 0;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    /* AVX-VNNI: CPUID.(EAX=7,ECX=1):EAX bit 4 (the OS's saving of ymm is
     * what the AVX2 ISA already required); AVX512-VNNI: the builtin. */
    unsigned a, b, c, d;
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 4))) v |= 1;
    /* AVX512-BF16: the same leaf, EAX bit 5 (the OS's saving of zmm is
     * what the AVX-512 ISA already required) */
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5))) v |= 4;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512vnni")) v |= 2;
#endif
    atomic_store(&idot_cpu, v); /* every thread computes the same value */
    return v;
}

static int idot_cap_now(void) {
    int cap = atomic_load(&idot_cap);
    if (cap < 0) {
        int isa_cap;
        env_caps(&isa_cap, &cap);
        int expected = -1;
        if (!atomic_compare_exchange_strong(&idot_cap, &expected, cap)) cap = expected;
    }
    return cap;
}

dhsa__idot dhsa__idot_active(void) {
    const dhsa_isa isa = dhsa_active_isa();
    const int cap = idot_cap_now();
    const int f = idot_cpu_flags();
    /* the best level within the cap that this CPU and ISA run: a CPU with
     * AVX512-VNNI may lack AVX-VNNI (AMD Zen 4), so a cap below AVX512-VNNI
     * steps down past the levels the CPU does not have */
    for (int l = cap < DHSA__IDOT_AVX512VNNI ? cap : DHSA__IDOT_AVX512VNNI; l > DHSA__IDOT_NONE; l--) {
        if (l == DHSA__IDOT_AVX512VNNI && isa == DHSA_ISA_AVX512 && (f & 2)) return DHSA__IDOT_AVX512VNNI;
        if (l == DHSA__IDOT_AVXVNNI && isa >= DHSA_ISA_AVX2 && (f & 1)) return DHSA__IDOT_AVXVNNI;
        if (l == DHSA__IDOT_AVX2 && isa >= DHSA_ISA_AVX2) return DHSA__IDOT_AVX2;
    }
    return DHSA__IDOT_NONE;
}

dhsa__idot dhsa__set_idot_cap(dhsa__idot cap) {
    const int before = idot_cap_now();
    atomic_store(&idot_cap, (int)cap);
    return (dhsa__idot)before;
}

int dhsa__idot_cpu_has(dhsa__idot d) {
    const dhsa_isa cpu = detect();
    const int f = idot_cpu_flags();
    switch (d) {
    case DHSA__IDOT_NONE: return 1;
    case DHSA__IDOT_AVX2: return cpu >= DHSA_ISA_AVX2;
    case DHSA__IDOT_AVXVNNI: return cpu >= DHSA_ISA_AVX2 && (f & 1);
    case DHSA__IDOT_AVX512VNNI: return cpu == DHSA_ISA_AVX512 && (f & 2);
    }
    return 0;
}

const char *dhsa__idot_name(dhsa__idot d) {
    switch (d) {
    case DHSA__IDOT_NONE: return "none";
    case DHSA__IDOT_AVX2: return "avx2";
    case DHSA__IDOT_AVXVNNI: return "avx-vnni";
    case DHSA__IDOT_AVX512VNNI: return "avx512-vnni";
    }
    return "unknown";
}

/* ------------------------------------------------------ AVX512-BF16 --- */

int dhsa__bf16_cpu_has(void) { return detect() == DHSA_ISA_AVX512 && (idot_cpu_flags() & 4); }

int dhsa__bf16_isa_ok(void) { return dhsa_active_isa() == DHSA_ISA_AVX512 && (idot_cpu_flags() & 4); }

/* ------------------------------------------------------------- AMX --- */

static atomic_int amx_cpu = -1; /* -1: not asked yet */
static atomic_int amx_cap = -1; /* -1: the environment not read yet */

/* The CPU has the tiles and their BF16 products (CPUID.(7,0):EDX bits 24
 * and 22), the OS saves their state (XCR0 bits 17 and 18), and Linux
 * gave this process the tile data (arch_prctl ARCH_REQ_XCOMP_PERM, asked
 * once; a process-wide grant). */
static int amx_probe(void) {
#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return 0; /* OSXSAVE */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 22))) return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return 0;
    const long arch_req_xcomp_perm = 0x1023, xfeature_xtiledata = 18;
    return syscall(SYS_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) == 0;
#else
    return 0;
#endif
}

int dhsa__amx_cpu_has(void) {
    int v = atomic_load(&amx_cpu);
    if (v < 0) {
        v = amx_probe();
        atomic_store(&amx_cpu, v);
    }
    return v;
}

static int amx_env_on(void) {
    int v = atomic_load(&amx_cap);
    if (v < 0) {
        /* Opt-in: the tiles' BF16 products run for calls of 5 or more
         * tokens only, so with them the same token's row differs in its
         * last bits between a prefill and a decode step, a prompt-cache
         * hit's short suffix or a server's batch of other clients' rows;
         * an answer would depend on how (and beside whom) it was run. */
        const char *e = getenv("DHSA_FORCE_ISA"), *on = getenv("DHSA_AMX");
        v = on && strcmp(on, "1") == 0 && !(e && strcmp(e, "avx512-vnni") == 0);
        int expected = -1;
        if (!atomic_compare_exchange_strong(&amx_cap, &expected, v)) v = expected;
    }
    return v;
}

int dhsa__amx_active(void) {
    return dhsa_active_isa() == DHSA_ISA_AVX512 && dhsa__bf16_cpu_has() && amx_env_on() && dhsa__amx_cpu_has();
}

/* AMX-INT8 (CPUID.(7,0):EDX bit 25) beside the tiles dhsa__amx_cpu_has
 * found (every CPU with one has the other so far). */
static atomic_int amx_i8_cpu = -1, amx_i8_cap = -1;

static int amx_i8_probe(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    unsigned a, b, c, d;
    return dhsa__amx_cpu_has() && __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 25));
#else
    return 0;
#endif
}

static int amx_i8_cap_get(void) {
    int cap = atomic_load(&amx_i8_cap);
    if (cap < 0) { /* on unless DHSA_FORCE_ISA=avx512-vnni (lower ISAs: dhsa_active_isa) */
        const char *e = getenv("DHSA_FORCE_ISA");
        cap = !(e && strcmp(e, "avx512-vnni") == 0);
        int expected = -1;
        if (!atomic_compare_exchange_strong(&amx_i8_cap, &expected, cap)) cap = expected;
    }
    return cap;
}

int dhsa__amx_int8_active(void) {
    int cpu = atomic_load(&amx_i8_cpu);
    if (cpu < 0) {
        cpu = amx_i8_probe();
        atomic_store(&amx_i8_cpu, cpu);
    }
    return cpu && amx_i8_cap_get() && dhsa_active_isa() == DHSA_ISA_AVX512;
}

int dhsa__set_amx_int8_cap(int on) {
    const int before = amx_i8_cap_get();
    atomic_store(&amx_i8_cap, on ? 1 : 0);
    return before;
}

int dhsa__set_amx_cap(int on) {
    const int before = amx_env_on();
    atomic_store(&amx_cap, on ? 1 : 0);
    return before;
}
