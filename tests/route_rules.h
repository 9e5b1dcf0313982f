/* route_rules.h: the routing rules the route and decode-index tests check
 * layouts against, written here from the header's words (dhsa/route.h,
 * scale_fixed), independently of src/route/select.c. Included by
 * tests/route_t.h and tests/kv_index_t.h. */
#ifndef DHSA_TEST_ROUTE_RULES_H
#define DHSA_TEST_ROUTE_RULES_H

#include <stdint.h>

#include "dhsa.h"

/* The sinks a block with this budget reads: at most budget / 8, but at
 * least one sink (when sink_tokens > 0). */
static inline int64_t rule_sink(const dhsa_router_params *rp, int64_t budget) {
    if (!rp->scale_fixed || rp->sink_tokens <= budget / 8) return rp->sink_tokens;
    return budget / 8 > 0 ? budget / 8 : 1;
}

/* The local keys before its diagonal: at most budget / 4. */
static inline int64_t rule_local(const dhsa_router_params *rp, int64_t budget) {
    return rp->scale_fixed && rp->local_tokens > budget / 4 ? budget / 4 : rp->local_tokens;
}

#endif
