/* stats.h: what one attention call did, summed into dhsa_attn_stats
 * (include/dhsa.h): the session's and context parallelism's counters
 * (src/model/session.c, src/dist/dist.c). */
#ifndef DHSA_ATTN_STATS_H
#define DHSA_ATTN_STATS_H

#include "dhsa.h"

/* Adds the call a to each of the n counters t[i]: with a layout, its
 * selected and available keys; without one (dense, or a sliding-window
 * layer), every key each row may see. Sums run over query rows x KV heads,
 * as in dhsa_layout_stats; density is recomputed. */
void dhsa__attn_count(dhsa_attn_stats *const *t, int n, const dhsa_attn_desc *a);

#endif
