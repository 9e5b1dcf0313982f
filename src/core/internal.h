/* internal.h: private helpers shared by the library's source files (never
 * installed). Error reporting, the ctx's scratch arena, conversions.
 */
#ifndef DHSA_INTERNAL_H
#define DHSA_INTERNAL_H

#include "dhsa.h"

#include <stdint.h>
#include <string.h>

#if defined(__GNUC__)
#define DHSA_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define DHSA_PRINTF(a, b)
#endif

/* Sets this thread's last error sentence and returns s, so that callers can
 * write `return dhsa__fail(DHSA_ERR_SHAPE, "k has %lld rows", n);`. */
dhsa_status dhsa__fail(dhsa_status s, const char *fmt, ...) DHSA_PRINTF(2, 3);

/* The integer dot-product instructions the fast route's kernels may use
 * (matmul/int8.h), best last: the best the CPU has within the active ISA
 * (AVX512-VNNI needs the AVX-512 ISA; AVX-VNNI and AVX2's maddubs the AVX2
 * ISA or more), capped by DHSA_FORCE_ISA (src/core/cpu.c) and by
 * dhsa__set_idot_cap (tests; DHSA__IDOT_AVX512VNNI lifts the cap). */
typedef enum {
    DHSA__IDOT_NONE = 0,
    DHSA__IDOT_AVX2 = 1,       /* vpmaddubsw + vpmaddwd */
    DHSA__IDOT_AVXVNNI = 2,    /* vpdpbusd on ymm (VEX) */
    DHSA__IDOT_AVX512VNNI = 3  /* vpdpbusd on zmm */
} dhsa__idot;
dhsa__idot dhsa__idot_active(void);
/* Sets the cap, returns the one before (tests: the kernels one by one). */
dhsa__idot dhsa__set_idot_cap(dhsa__idot cap);
/* 1 when the CPU can run d's instructions (whatever the caps). */
int dhsa__idot_cpu_has(dhsa__idot d);
const char *dhsa__idot_name(dhsa__idot d);

/* AVX512-BF16 (vdpbf16ps), for the fast route's kernels of F16 and BF16
 * weights (matmul/bf16.h, which also decides whether they pay here): 1 when
 * the CPU has it and the active ISA is AVX-512 (so DHSA_FORCE_ISA=avx2,
 * avx-vnni or scalar turn it off). */
int dhsa__bf16_isa_ok(void);
/* 1 when the CPU can run it, whatever the ISA. */
int dhsa__bf16_cpu_has(void);

/* AMX tiles with BF16 products (matmul/amx.h, the prefill route): 1 when
 * the CPU has them, the OS saves their state and Linux granted this
 * process the tile data (asked on the first call). */
int dhsa__amx_cpu_has(void);
/* ... and the active ISA is AVX-512, AVX512-BF16 is there, DHSA_AMX=1 or
 * dhsa__set_amx_cap(1) turned it on (it is off by default) and neither
 * DHSA_FORCE_ISA=avx512-vnni nor dhsa__set_amx_cap(0) turned it off. */
int dhsa__amx_active(void);
/* Sets the cap (0 off, 1 on where the CPU allows), returns the one before
 * (tests and `dhsa bench matmul`: both prefill routes). */
int dhsa__set_amx_cap(int on);
/* The K panel of Q4_K and Q5_K on the tiles' integer products
 * (matmul/int8.h: dhsa__qi_amxi8; bitwise the AVX512-VNNI kernels, so on
 * by default): 1 when the CPU has AMX-INT8 and the tiles as above, the
 * active ISA is AVX-512 and neither DHSA_FORCE_ISA=avx512-vnni nor
 * dhsa__set_amx_int8_cap(0) turned it off. */
int dhsa__amx_int8_active(void);
/* Sets that cap (0 off, 1 on where the CPU allows); returns the one before. */
int dhsa__set_amx_int8_cap(int on);

/* Untrusted text for a terminal (src/core/escape.c has the rules): control
 * bytes, invalid UTF-8 and the code points a terminal acts on become \xNN
 * escapes; valid UTF-8 is kept. Writes at most cap bytes to out, NUL
 * included (cut between escapes), and returns the length of the whole
 * escaped text, as snprintf does (>= cap: it was cut; cap 0 only counts).
 * Flags: DHSA__ESC_BACKSLASH escapes \ too; DHSA__ESC_QUOTES also " and '
 * (and \); DHSA__ESC_ELLIPSIS ends a cut text with "...". */
#define DHSA__ESC_BACKSLASH 1u
#define DHSA__ESC_QUOTES 2u
#define DHSA__ESC_ELLIPSIS 4u
size_t dhsa__escape(char *out, size_t cap, const char *s, size_t len, unsigned flags);
/* For error sentences: s (NUL-terminated, or its first len bytes) escaped
 * with quotes, cut after ~190 bytes with "...", in one of four rotating
 * thread-local buffers: valid until the fourth call after on this thread,
 * so at most four per sentence. dhsa__fail escapes any control byte left in
 * its sentence as well, but only these calls make the quotes unambiguous. */
const char *dhsa__esc(const char *s);
const char *dhsa__escn(const char *s, size_t len);

/* The ctx's call lock (recursive): while a thread holds it, no other
 * thread's call uses the ctx's pool or scratch. dhsa_parallel_for takes it
 * for each job; a scratch user takes it for its whole call. */
void dhsa__ctx_lock(dhsa_ctx *ctx);
void dhsa__ctx_unlock(dhsa_ctx *ctx);

/* The ctx's scratch arena: one grow-only buffer kept between calls so that
 * hot paths (decode) do not fault pages in on every call. It counts in the
 * ctx's in_use and is held to the budget. Returns NULL (last error set,
 * DHSA_ERR_MEMORY_BUDGET or DHSA_ERR_OUT_OF_MEMORY in *st) on failure.
 * Only one user at a time: the caller holds dhsa__ctx_lock from before this
 * call until it is done with the buffer. */
void *dhsa__scratch(dhsa_ctx *ctx, size_t bytes, dhsa_status *st);

/* dhsa_ctx_alloc with the failure's status in *st. */
void *dhsa__alloc(dhsa_ctx *ctx, size_t bytes, dhsa_status *st);

/* Checks, without allocating, whether `bytes` of scratch would fit the
 * budget. */
dhsa_status dhsa__scratch_check(const dhsa_ctx *ctx, size_t bytes);

/* One warning line on stderr per distinct key for the whole process. */
void dhsa__warn_once(const char *key, const char *fmt, ...) DHSA_PRINTF(2, 3);

static inline size_t dhsa__align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

/* Q8_0 blocks (dhsa.h, dhsa_type): 32 values in 34 bytes, F16 scale first. */
#define DHSA_Q8_BLOCK 32
#define DHSA_Q8_BYTES 34

/* Value i of a Q8_0 row starting at a block boundary: d * q, exact in F32
 * (an 11-bit scale times a 7-bit code). */
static inline float dhsa__load_q8_0(const void *p, int64_t i) {
    const unsigned char *blk = (const unsigned char *)p + i / DHSA_Q8_BLOCK * DHSA_Q8_BYTES;
    uint16_t h;
    memcpy(&h, blk, 2);
    return dhsa_f16_to_f32(h) * (float)(int8_t)blk[2 + i % DHSA_Q8_BLOCK];
}

/* Loads element i of a typed row as float (Q8_0: the row starts at a
 * block boundary, which a checked view guarantees). */
static inline float dhsa__load(const void *p, dhsa_type t, int64_t i) {
    switch (t) {
    case DHSA_F16: return dhsa_f16_to_f32(((const uint16_t *)p)[i]);
    case DHSA_BF16: return dhsa_bf16_to_f32(((const uint16_t *)p)[i]);
    case DHSA_Q8_0: return dhsa__load_q8_0(p, i);
    default: return ((const float *)p)[i];
    }
}

/* Q8_0 is never an output (outputs are checked to be F32/F16/BF16). */
static inline void dhsa__store(void *p, dhsa_type t, int64_t i, float x) {
    switch (t) {
    case DHSA_F16: ((uint16_t *)p)[i] = dhsa_f32_to_f16(x); break;
    case DHSA_BF16: ((uint16_t *)p)[i] = dhsa_f32_to_bf16(x); break;
    case DHSA_Q8_0: break;
    default: ((float *)p)[i] = x; break;
    }
}

/* Byte offset of element offset off (Q8_0: off a multiple of 32). */
static inline int64_t dhsa__byte_off(dhsa_type t, int64_t off) {
    return t == DHSA_Q8_0 ? off / DHSA_Q8_BLOCK * DHSA_Q8_BYTES : off * (int64_t)dhsa_type_size(t);
}

/* Address of element (b, h, l, 0) of a view. */
static inline void *dhsa__at(const dhsa_tensor *t, int64_t b, int64_t h, int64_t l) {
    int64_t off = b * t->stride[0] + h * t->stride[1] + l * t->stride[2];
    return (char *)t->data + dhsa__byte_off(t->type, off);
}

/* DHSA_OK for an F32/F16/BF16 view; for Q8_0 the rules of dhsa.h (dim a
 * multiple of 32, unit dim stride, other strides multiples of 32), else
 * DHSA_ERR_SHAPE with a sentence naming the view (`name`). An unknown type
 * is DHSA_ERR_INVALID_ARG. */
dhsa_status dhsa__check_view_type(const char *name, const dhsa_tensor *t);

#endif
