/* params.h: the router's parameters as the routing files share them
 * (params.c): the check every routing call makes and the sizes the
 * parameters imply. The parameters themselves and their defaults are
 * public (include/dhsa.h, dhsa_router_params).
 */
#ifndef DHSA_ROUTE_PARAMS_H
#define DHSA_ROUTE_PARAMS_H

#include "core/internal.h"

/* DHSA_OK, or the first parameter out of range, named, as the failure. */
dhsa_status dhsa__route_check_params(const dhsa_router_params *rp);
/* For Lk keys: the shortest chunk the boundaries can make, the most chunks
 * and the most ranges a query block's selection can write. */
void dhsa__route_limits(const dhsa_router_params *rp, int64_t Lk, int64_t *min_len, int64_t *max_chunks,
                        int64_t *max_ranges);
/* Sinks where the model puts them (dhsa.h, sink_window): 1 when rp picks
 * them (sink_window > sink_tokens). */
int dhsa__sink_picked(const dhsa_router_params *rp);

#endif
