/* peak.h: the machine's measured peaks, for benchmarks that report the share
 * of the machine they reach (STYLE.md item 10). Part of the CLI's support
 * library build/libdhsa_cli.a, not of libdhsa (docs/architecture.md); the
 * CLI (`dhsa peak`, `dhsa bench attn`) is the user.
 *
 * Both numbers are measured, never derived from a spec sheet: AVX-512 on
 * Zen 4 is double-pumped, turbo depends on how many cores run, and a VM may
 * hide half of it.
 *
 * Contract:
 *   - ctx may be NULL; the measurement then runs on a temporary ctx with
 *     n_threads threads. A ctx with at least n_threads threads is used as it
 *     is (n_threads tasks, one per thread); one with fewer is not, a
 *     temporary ctx is made instead. n_threads <= 0 means the ctx's threads
 *     (or the online CPUs when ctx is NULL).
 *   - The kernels follow dhsa_active_isa() (DHSA_FORCE_SCALAR=1 measures the
 *     scalar path).
 *   - On failure both return 0.0 and dhsa_last_error() says why.
 * Run: build/dhsa peak. Tested by tests/test_cli.c (peak --json).
 */
#ifndef DHSA_UTIL_PEAK_H
#define DHSA_UTIL_PEAK_H

#include "dhsa.h"

#include <stddef.h>
#include <stdint.h>

/* fp32 FMA throughput in GFLOP/s (2 flops per FMA lane) of n_threads threads
 * running independent FMA chains at once. `seconds` is the whole
 * measurement: it is split into 3 timed repetitions (after a short warm-up)
 * and the best is returned. Each repetition times the whole parallel region
 * with CLOCK_MONOTONIC, so threads that start late count against it. */
double dhsa_peak_fma_gflops(dhsa_ctx *ctx, int n_threads, double seconds);

/* Memory read bandwidth in GB/s (1e9 bytes/s) of n_threads threads summing
 * a buffer of `bytes` (0 = 1 GiB; make it much larger than the last-level
 * cache) split into one slice per thread, with the widest vector loads of
 * the active ISA. The buffer comes from the ctx (it counts in its
 * statistics and budget) and is written by the threads that later read it
 * before any pass is timed. Passes repeat until `seconds` have passed (at
 * least 5, at most 100); the median pass is returned (single passes burst
 * above the sustained rate on a shared machine). */
double dhsa_peak_read_gbps(dhsa_ctx *ctx, int n_threads, size_t bytes, double seconds);

/* Seconds n_threads threads take to read `count` existing buffers once
 * (buffer b has n_floats[b] floats, any alignment; each is split into one
 * slice per thread), with the same summing loops: the baseline a
 * memory-bound kernel reading those buffers is compared with, measured in
 * the same run. The bytes are summed as floats whatever they hold. Returns
 * a negative value (last error set) on failure. */
double dhsa_peak_read_buffers_s(dhsa_ctx *ctx, int n_threads, const float *const *bufs,
                                const size_t *n_floats, int count);

/* ---- per-ISA loops (peak_avx512.c, peak_avx2.c); each file compiles to a
 * stub returning 0 where its ISA cannot be built. Private to peak.c. ---- */

/* Runs n_iter rounds of DHSA_PEAK_AVX512_CHAINS independent zmm FMA chains
 * (acc = acc * a + b, a fixed point at 1 so values stay normal); returns a
 * value that depends on every chain, so no chain can be dropped. */
#define DHSA_PEAK_AVX512_CHAINS 24
#define DHSA_PEAK_AVX512_FLOPS_PER_ITER (DHSA_PEAK_AVX512_CHAINS * 16 * 2)
float dhsa__peak_fma_loop_avx512(int64_t n_iter, float a, float b);

#define DHSA_PEAK_AVX2_CHAINS 12
#define DHSA_PEAK_AVX2_FLOPS_PER_ITER (DHSA_PEAK_AVX2_CHAINS * 8 * 2)
float dhsa__peak_fma_loop_avx2(int64_t n_iter, float a, float b);

/* Sum of n floats at p (any alignment; any n). */
float dhsa__peak_sum_avx512(const float *p, size_t n);
float dhsa__peak_sum_avx2(const float *p, size_t n);

#endif
