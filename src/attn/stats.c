/* stats.c: dhsa__attn_count (attn/stats.h), the attention statistics of
 * sessions (dhsa_session_get_stats). Tested through tests/test_model.c and
 * tests/test_dist.c (the density lines). */
#include "attn/stats.h"

#include <string.h>

void dhsa__attn_count(dhsa_attn_stats *const *t, int n, const dhsa_attn_desc *a) {
    dhsa_attn_stats add;
    memset(&add, 0, sizeof add);
    add.layer_calls = 1;
    dhsa_layout_stats ls;
    if (a->layout && dhsa_layout_get_stats(a->layout, &ls) == DHSA_OK) {
        add.blocks = ls.n_blocks * ls.Hkv;
        add.dense_blocks = ls.dense_blocks;
        add.selected = ls.selected;
        add.available = ls.available;
    } else {
        add.dense_calls = 1;
        double keys = 0;
        for (int64_t r = 0; r < a->q.shape[2]; r++) {
            int64_t seen = a->q_pos0 + r + 1;
            if (a->window > 0 && seen > a->window) seen = a->window;
            keys += (double)seen;
        }
        add.selected = add.available = keys * (double)a->k.shape[1];
    }
    for (int i = 0; i < n; i++) {
        t[i]->layer_calls += add.layer_calls;
        t[i]->dense_calls += add.dense_calls;
        t[i]->blocks += add.blocks;
        t[i]->dense_blocks += add.dense_blocks;
        t[i]->selected += add.selected;
        t[i]->available += add.available;
        t[i]->density = t[i]->available > 0 ? t[i]->selected / t[i]->available : 1.0;
    }
}
