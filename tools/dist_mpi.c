/* dist_mpi.c: the transport of a context-parallel session over MPI
 * (include/dhsa.h, dhsa_dist; docs/dist.md). Compiled with MPI only when
 * the Makefile finds it (pkg-config mpi-c: DHSA_HAVE_MPI); otherwise the
 * launch detection alone, which refuses an mpirun start with more than one
 * rank. The library never sees MPI.
 *
 * Faults: every operation is non-blocking and polled against a deadline
 * (DHSA_DIST_TIMEOUT seconds, default 300: a wait for the other ranks,
 * which includes their compute), so a rank that stalls ends the job with a
 * sentence on every waiting rank (then MPI_Abort) instead of a hang; a rank
 * that dies is noticed by mpirun, which ends the others with SIGTERM: a
 * handler writes which rank was told to stop before it exits. Errors from
 * MPI come back as sentences (MPI_ERRORS_RETURN).
 * Tested by tests/test_dist.c (skipped without mpirun).
 */
#include "dist.h"

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int g_rank = 0, g_size = 1;

/* The ranks the launcher announces (Open MPI, then MPICH/PMI), 0 without one. */
static int launch_size(void) {
    const char *v = getenv("OMPI_COMM_WORLD_SIZE");
    if (!v) v = getenv("PMI_SIZE");
    return v ? atoi(v) : 0;
}

int dhsa_cli_dist_rank(void) { return g_rank; }
int dhsa_cli_dist_size(void) { return g_size; }

#ifdef DHSA_HAVE_MPI
#include <mpi.h>
#include <time.h>

static double g_timeout = 300.0;
static void fault_point(void);
static int g_started = 0;
static char g_term_msg[160];
static size_t g_term_len;

static void on_term(int sig) {
    (void)sig;
    ssize_t w = write(2, g_term_msg, g_term_len);
    (void)w;
    _exit(143);
}

static int mpi_why(int rc, const char *what, char *why) {
    char s[MPI_MAX_ERROR_STRING];
    int n = 0;
    MPI_Error_string(rc, s, &n);
    snprintf(why, 256, "MPI %.40s failed on rank %d of %d: %.160s", what, g_rank, g_size, s);
    return 1;
}

/* Polls the requests until done or the deadline: at the deadline the job
 * ends (MPI_Abort), saying on this rank what it was waiting for. */
static int wait_all(int n, MPI_Request *r, const char *what, char *why) {
    double t0 = MPI_Wtime();
    long spins = 0;
    for (;;) {
        int flag = 0, rc = MPI_Testall(n, r, &flag, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_why(rc, what, why);
        if (flag) return 0;
        double waited = MPI_Wtime() - t0;
        if (waited > g_timeout) {
            fprintf(stderr,
                    "dhsa: rank %d of %d: no answer from the other ranks for %.0f s in %s (DHSA_DIST_TIMEOUT): a rank "
                    "died or stalled; ending the job\n", g_rank, g_size, waited, what);
            fflush(stderr);
            MPI_Abort(MPI_COMM_WORLD, 3);
            _exit(3);
        }
        if (++spins > 2000) { /* after a short spin, sleep: the cores are shared with the other ranks */
            struct timespec ts = {0, 200000};
            nanosleep(&ts, NULL);
        }
    }
}

static int check_int(size_t bytes, const char *what, char *why) {
    if (bytes > (size_t)INT32_MAX) {
        snprintf(why, 256, "%s of %zu bytes: above the 2^31 bytes one MPI call carries here", what, bytes);
        return 1;
    }
    return 0;
}

static int t_allgather(void *user, const void *send, size_t bytes, void *recv, char *why) {
    (void)user;
    fault_point();
    if (check_int(bytes, "an allgather", why)) return 1;
    MPI_Request r;
    int rc = MPI_Iallgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, MPI_COMM_WORLD, &r);
    if (rc != MPI_SUCCESS) return mpi_why(rc, "Iallgather", why);
    return wait_all(1, &r, "an allgather", why);
}

static int t_bcast(void *user, void *buf, size_t bytes, int root, char *why) {
    (void)user;
    fault_point();
    if (check_int(bytes, "a broadcast", why)) return 1;
    MPI_Request r;
    int rc = MPI_Ibcast(buf, (int)bytes, MPI_BYTE, root, MPI_COMM_WORLD, &r);
    if (rc != MPI_SUCCESS) return mpi_why(rc, "Ibcast", why);
    return wait_all(1, &r, "a broadcast", why);
}

static int t_alltoallv(void *user, const void *send, const size_t *sb, void *recv, const size_t *rb, char *why) {
    (void)user;
    int *sc = malloc(4 * (size_t)g_size * sizeof(int));
    if (!sc) {
        snprintf(why, 256, "out of memory");
        return 1;
    }
    int *sd = sc + g_size, *rc_ = sc + 2 * g_size, *rd = sc + 3 * g_size;
    size_t so = 0, ro = 0;
    for (int q = 0; q < g_size; q++) {
        if (check_int(so + sb[q], "an all-to-all", why) || check_int(ro + rb[q], "an all-to-all", why)) {
            free(sc);
            return 1;
        }
        sc[q] = (int)sb[q];
        sd[q] = (int)so;
        rc_[q] = (int)rb[q];
        rd[q] = (int)ro;
        so += sb[q];
        ro += rb[q];
    }
    MPI_Request r;
    int rc = MPI_Ialltoallv(send, sc, sd, MPI_BYTE, recv, rc_, rd, MPI_BYTE, MPI_COMM_WORLD, &r);
    int bad = rc != MPI_SUCCESS ? mpi_why(rc, "Ialltoallv", why) : wait_all(1, &r, "an all-to-all", why);
    free(sc);
    return bad;
}

static MPI_Request g_ring[2];

/* DHSA_DIST_FAULT=kill:R or stall:R (tests/test_dist.c): rank R kills
 * itself (SIGKILL) or stops answering at its first transport call. */
static void fault_point(void) {
    static int done = 0;
    const char *f = getenv("DHSA_DIST_FAULT");
    if (done || !f) return;
    done = 1;
    int kill_it = strncmp(f, "kill:", 5) == 0, stall = strncmp(f, "stall:", 6) == 0;
    if ((!kill_it && !stall) || atoi(f + (kill_it ? 5 : 6)) != g_rank) return;
    fprintf(stderr, "dhsa: rank %d: DHSA_DIST_FAULT=%s: %s now\n", g_rank, f, kill_it ? "dying" : "stalling");
    fflush(stderr);
    if (kill_it) raise(SIGKILL);
    for (;;) pause();
}

static int t_ring_start(void *user, const void *send, size_t sbytes, void *recv, size_t rbytes, char *why) {
    (void)user;
    fault_point();
    if (check_int(sbytes, "a ring step", why) || check_int(rbytes, "a ring step", why)) return 1;
    int next = (g_rank + 1) % g_size, prev = (g_rank - 1 + g_size) % g_size;
    int rc = MPI_Irecv(recv, (int)rbytes, MPI_BYTE, prev, 71, MPI_COMM_WORLD, &g_ring[0]);
    if (rc != MPI_SUCCESS) return mpi_why(rc, "Irecv", why);
    rc = MPI_Isend(send, (int)sbytes, MPI_BYTE, next, 71, MPI_COMM_WORLD, &g_ring[1]);
    if (rc != MPI_SUCCESS) return mpi_why(rc, "Isend", why);
    return 0;
}

static int t_ring_wait(void *user, char *why) {
    (void)user;
    return wait_all(2, g_ring, "a K/V ring step", why);
}

static dhsa_dist g_dist;

const dhsa_dist *dhsa_cli_dist_start(int *argc, char ***argv) {
    if (launch_size() <= 1) return NULL;
    int provided = 0;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "dhsa: MPI_Init failed: cannot run context parallel\n");
        exit(1);
    }
    g_started = 1;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    const char *t = getenv("DHSA_DIST_TIMEOUT");
    if (t && atof(t) > 0) g_timeout = atof(t);
    snprintf(g_term_msg, sizeof g_term_msg,
             "dhsa: rank %d of %d: stopped by the launcher (SIGTERM): another rank died or the job was ended\n",
             g_rank, g_size);
    g_term_len = strlen(g_term_msg);
    signal(SIGTERM, on_term);
    if (g_size == 1) return NULL;
    g_dist.rank = g_rank;
    g_dist.size = g_size;
    g_dist.user = NULL;
    g_dist.allgather = t_allgather;
    g_dist.bcast = t_bcast;
    g_dist.alltoallv = t_alltoallv;
    g_dist.ring_start = t_ring_start;
    g_dist.ring_wait = t_ring_wait;
    return &g_dist;
}

static double reduce(double x, MPI_Op op) {
    if (!g_started || g_size == 1) return x;
    double y = x;
    MPI_Request r;
    char why[256];
    if (MPI_Iallreduce(&x, &y, 1, MPI_DOUBLE, op, MPI_COMM_WORLD, &r) != MPI_SUCCESS ||
        wait_all(1, &r, "a reduction", why))
        return x;
    return y;
}

double dhsa_cli_dist_sum(double x) { return reduce(x, MPI_SUM); }
double dhsa_cli_dist_max(double x) { return reduce(x, MPI_MAX); }

int dhsa_cli_dist_gather(double x, double *all, char *why) {
    if (!g_started || g_size == 1) {
        all[0] = x;
        return 0;
    }
    MPI_Request r;
    int rc = MPI_Iallgather(&x, 1, MPI_DOUBLE, all, 1, MPI_DOUBLE, MPI_COMM_WORLD, &r);
    if (rc != MPI_SUCCESS) return mpi_why(rc, "Iallgather", why);
    return wait_all(1, &r, "a gather of per-rank numbers", why);
}

int dhsa_cli_dist_barrier(char *why) {
    if (!g_started || g_size == 1) return 0;
    MPI_Request r;
    int rc = MPI_Ibarrier(MPI_COMM_WORLD, &r);
    if (rc != MPI_SUCCESS) return mpi_why(rc, "Ibarrier", why);
    return wait_all(1, &r, "a barrier", why);
}

int dhsa_cli_dist_same_ids(const int32_t *ids, int64_t n) {
    uint64_t h = 1469598103934665603ull;
    for (int64_t i = 0; i < n; i++) h = (h ^ (uint32_t)ids[i]) * 1099511628211ull;
    h ^= (uint64_t)n;
    double lo = (double)(h & 0xffffffffu), mx = dhsa_cli_dist_max(lo), mn = -dhsa_cli_dist_max(-lo);
    return mx == mn;
}

void dhsa_cli_dist_finish(void) {
    if (g_started) MPI_Finalize();
    g_started = 0;
}

#else /* no MPI */

const dhsa_dist *dhsa_cli_dist_start(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    int n = launch_size();
    if (n > 1) {
        fprintf(stderr, "dhsa: launched as one of %d MPI ranks, but this dhsa was built without MPI, so each rank would "
                        "run the whole job alone: install Open MPI (apt-get install openmpi-bin libopenmpi-dev), "
                        "then make clean && make\n", n);
        exit(1);
    }
    return NULL;
}

double dhsa_cli_dist_sum(double x) { return x; }
double dhsa_cli_dist_max(double x) { return x; }
int dhsa_cli_dist_gather(double x, double *all, char *why) {
    (void)why;
    all[0] = x;
    return 0;
}
int dhsa_cli_dist_barrier(char *why) {
    (void)why;
    return 0;
}
int dhsa_cli_dist_same_ids(const int32_t *ids, int64_t n) {
    (void)ids;
    (void)n;
    return 1;
}
void dhsa_cli_dist_finish(void) {}

#endif
