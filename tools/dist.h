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

#endif
