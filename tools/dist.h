/* dist.h: the CLI's context-parallel launch (tools/dist_mpi.c, docs/dist.md).
 * `dhsa run` and `dhsa bench model` started by mpirun -np R (R > 1) run one
 * rank each; without mpirun, or with R = 1, they run as one process. Built
 * without MPI (no mpi-c for pkg-config), a launch by mpirun with R > 1 is
 * refused, saying so, rather than run R copies that each do everything. */
#ifndef DHSA_TOOLS_DIST_H
#define DHSA_TOOLS_DIST_H

#include "dhsa.h"

/* Starts MPI when launched by mpirun with more than one rank; returns the
 * transport (NULL for one process). Dies with a sentence on failure. */
const dhsa_dist *dhsa_cli_dist_start(int *argc, char ***argv);
/* Rank and size (0 and 1 for one process). */
int dhsa_cli_dist_rank(void);
int dhsa_cli_dist_size(void);
/* The sum / maximum of x over the ranks (x itself for one process). */
double dhsa_cli_dist_sum(double x);
double dhsa_cli_dist_max(double x);
/* Every rank's x into all [size], in rank order, on every rank (all[0] = x
 * for one process); 0, or nonzero after a sentence (at most 255 bytes) in
 * why. */
int dhsa_cli_dist_gather(double x, double *all, char *why);
/* Returns once every rank has called it (at once for one process); 0, or
 * nonzero after a sentence in why. Timings that start together use it. */
int dhsa_cli_dist_barrier(char *why);
/* 1 when every rank passed the same n ids (a hash gathered on every rank). */
int dhsa_cli_dist_same_ids(const int32_t *ids, int64_t n);
/* Ends MPI (after the last use of the transport). */
void dhsa_cli_dist_finish(void);

/* The context-parallel parts of run's and bench model's command lines
 * (tools/run.c). dhsa_cli_dist_begin: starts this rank's transport and
 * sends stdout of every rank but 0 to /dev/null (NULL: one process). */
const dhsa_dist *dhsa_cli_dist_begin(int *argc, char ***argv);
/* --dist-stripe N (0 or N tokens), --dist-fetch F (0 < F <= 1), and
 * --dist-fetch refused with one process. */
int64_t dhsa_cli_dist_stripe_arg(const char *opt, const char *v);
double dhsa_cli_dist_fetch_arg(const char *opt, const char *v);
void dhsa_cli_dist_fetch_needs_ranks(double f);
/* What crossed the wire in a context-parallel session since it was
 * created: each kind summed over the ranks (dhsa_dist_stats). Collective:
 * every rank calls it, in the same order as its other reductions. */
typedef struct {
    double kv, index, partial;
    double keys, visible, share_max; /* DHSA: keys fetched, keys the queries could see, the largest share */
    double window;                   /* sliding-window layers: the keys their windows reached on other ranks */
} dhsa_cli_dist_wire;
dhsa_cli_dist_wire dhsa_cli_dist_wire_sum(const dhsa_dist_stats *mine);
/* The wire in words into buf (returned). */
const char *dhsa_cli_dist_wire_text(const dhsa_cli_dist_wire *w, int64_t n_layer, int64_t n_prompt, int64_t n_dec,
                                    char *buf, size_t cap);

#endif
