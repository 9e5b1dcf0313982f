/* carry.h: the chunks a decode step carries to the next
 * (dhsa_router_params.carry, include/dhsa/route.h; docs/dhsa.md, "Chunks
 * carried from one decode step to the next"). A session computes them
 * after each one-token eval's attention (carry.c) and routes the next
 * step with them first (dhsa_kv_index_route_keep). dhsa_kv_index_carry
 * is the public entry (kv_index.c).
 * Tested by tests/test_carry.c.
 */
#ifndef DHSA_ROUTE_CARRY_H
#define DHSA_ROUTE_CARRY_H

#include "core/internal.h"

/* For the one-row attention call a (q [1, Hq, 1, d], its keys k, scale
 * (resolved: not 0) and softcap; no bias or window; a key_mask of batch 0
 * leaves keys out) that read the keys of lay (one block per KV group), and
 * the chunks [starts[c], starts[c + 1]) for c < nc:
 * the share of the row's attention each chunk held, the mean over the
 * group's query heads of each head's softmax over the keys it read; the
 * chunks holding at least `share` go to out[g * DHSA_CARRY_MAX + i],
 * largest share first (ties: the earlier chunk), at most DHSA_CARRY_MAX,
 * the rest of the row -1. Keys after starts[nc] (the index's open tail)
 * belong to no chunk. The scores go through the attention's micro-kernels
 * (F32, F16, BF16 and Q8_0 keys read in place where the ISA has them,
 * else widened by its vector widen), the exponentials through its exp
 * (kern->expw), the sums in double. Scratch from malloc; DHSA_ERR_OUT_OF_MEMORY leaves
 * out all -1. */
dhsa_status dhsa__carry_chunks(const dhsa_attn_desc *a, const dhsa_layout *lay, const int64_t *starts, int64_t nc,
                               double share, int64_t *out);

/* o [DHSA_CARRY_MAX] (all -1 on entry) <- the chunks c < nc whose mass[c]
 * is at least share, largest first (ties: the earlier chunk), at most
 * DHSA_CARRY_MAX: dhsa__carry_chunks' choice from its masses. */
void dhsa__carry_pick(const double *mass, int64_t nc, double share, int64_t *o);

/* The chunks' exact attention mass for rows [r0, r1) of the call a (q
 * [1, Hq, Lq, d], its keys k of KV head g from position 0, causal or not,
 * window, scale (resolved: not 0) and softcap as the attention applies
 * them; no mask or
 * bias): mass[c] for c < nc is the mean, over those rows and the group's
 * query heads, of the share of the row's softmax over every key it may
 * see that the keys [starts[c], starts[c + 1]) hold (keys past starts[nc]
 * enter the softmax and belong to no chunk). The scores through the
 * attention's micro-kernels as dhsa__carry_chunks', the sums in double.
 * Scratch from malloc (G x Lk floats); DHSA_ERR_OUT_OF_MEMORY leaves mass
 * zero. dhsa_router_params.exact_rows ranks by it (kv_index.c). */
dhsa_status dhsa__exact_mass(const dhsa_attn_desc *a, int64_t g, int64_t r0, int64_t r1, const int64_t *starts,
                             int64_t nc, double *mass);

/* One rank's part of dhsa__exact_mass under context parallelism (src/dist:
 * a rank holds some of the keys, docs/dist.md). Row `row` of the call a
 * (q [1, Hq, Lq, d]; scale resolved, softcap; k [1, Hkv, n, d] the rank's
 * keys in its local slots) at position pos, against the keys of KV head g
 * in the runs [n_runs][3] (first local slot, count, position of the
 * first), those at positions <= pos (causal). Two passes:
 *   norm NULL: mz[2 h], mz[2 h + 1] <- for head g G + h (h < G) the largest
 *     score over those keys and the sum of exp(score - it) (-inf and 0
 *     where there are none);
 *   norm [G][2] (the row's largest score and its sum of exponentials over
 *     every rank's keys): mass[c] += for c < nc the sum over the group's
 *     heads of exp(score - norm max) / (norm sum G) over the keys of chunk
 *     [starts[c], starts[c + 1]) here.
 * Summed over the ranks, the second pass is dhsa__exact_mass's row (the
 * same scores and exponentials; sums in another order). Scratch from
 * malloc (G x the keys). */
dhsa_status dhsa__exact_part(const dhsa_attn_desc *a, int64_t g, int64_t row, int64_t pos, const int64_t *runs,
                             int64_t n_runs, const int64_t *starts, int64_t nc, const double *norm, double *mz,
                             double *mass);

#endif
