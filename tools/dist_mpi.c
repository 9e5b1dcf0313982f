/* dist_mpi.c: the transport of a context-parallel session over MPI
 * (include/dhsa.h, dhsa_dist; docs/dist.md). Compiled with MPI only when
 * the Makefile finds it (pkg-config mpi-c: DHSA_HAVE_MPI); otherwise the
 * launch detection alone, which refuses an mpirun start with more than one
 * rank. The library never sees MPI.
 *
 * Faults: every operation is non-blocking and polled. A rank that stops
 * (SIGSTOP, a debugger, a frozen node) is found by a liveness check: each
 * rank runs a small thread that answers pings on its own communicator
 * (MPI_THREAD_MULTIPLE), and a rank that has waited DHSA_DIST_PROBE s (5)
 * for an operation pings the others; a rank whose answer does not come in
 * DHSA_DIST_STALL s (15) is stopped, and the waiting rank names it and
 * ends the job (MPI_Abort). A rank that computes for long answers, so long
 * prefill steps are waited for. DHSA_DIST_TIMEOUT (default 3600 s) bounds
 * any one wait all the same (a rank alive but hung). A rank that dies is
 * noticed by mpirun, which ends the others with SIGTERM: a handler writes
 * which rank was told to stop before it exits. Errors from MPI come back
 * as sentences (MPI_ERRORS_RETURN). Every message is one line written with
 * one write(2), prefixed with the rank (dhsa_cli_error_line), so the lines
 * of several ranks do not mix.
 * Tested by tests/test_dist.c (skipped without mpirun).
 */
#include "dist.h"
#include "cli.h"

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
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

static double g_timeout = 3600.0; /* DHSA_DIST_TIMEOUT: any one wait, at most */
static double g_probe = 5.0;      /* DHSA_DIST_PROBE: a wait this long checks the others are alive */
static double g_stall = 15.0;     /* DHSA_DIST_STALL: a rank that does not answer in this long is stopped */
static void fault_point(void);
static int g_started = 0;
static char g_term_msg[320];
static size_t g_term_len;

/* ---------------------------------------------------------- liveness --- */
/* Each rank's answering thread: takes pings (any rank, TAG_PING) on g_live
 * and sends each back (TAG_PONG), polling every 10 ms so that it costs
 * nothing; MPI_Test rather than a blocking receive, which would spin a
 * core. It runs while the main thread computes, so only a rank that is
 * stopped as a whole stays silent. */
#define TAG_PING 7101
#define TAG_PONG 7102
static MPI_Comm g_live = MPI_COMM_NULL;
static pthread_t g_live_thread;
static atomic_int g_live_stop;
static int g_live_on = 0;

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static void *live_main(void *unused) {
    (void)unused;
    int ping = 0;
    MPI_Request r;
    if (MPI_Irecv(&ping, 1, MPI_INT, MPI_ANY_SOURCE, TAG_PING, g_live, &r) != MPI_SUCCESS) return NULL;
    while (!atomic_load(&g_live_stop)) {
        int flag = 0;
        MPI_Status st;
        if (MPI_Test(&r, &flag, &st) != MPI_SUCCESS) return NULL;
        if (!flag) {
            sleep_s(0.01);
            continue;
        }
        int pong = ping;
        MPI_Send(&pong, 1, MPI_INT, st.MPI_SOURCE, TAG_PONG, g_live);
        if (MPI_Irecv(&ping, 1, MPI_INT, MPI_ANY_SOURCE, TAG_PING, g_live, &r) != MPI_SUCCESS) return NULL;
    }
    MPI_Cancel(&r);
    MPI_Wait(&r, MPI_STATUS_IGNORE);
    return NULL;
}

/* Pings every other rank and waits up to g_stall s for the answers. Writes
 * the ranks that did not answer ("1", "1, 3") into who; returns how many. */
static int roll_call(char *who, size_t cap) {
    static int seq = 0;
    int n_silent = 0, ping = ++seq;
    MPI_Request *rq = malloc(2 * (size_t)g_size * sizeof *rq);
    int *pong = malloc((size_t)g_size * sizeof *pong);
    who[0] = 0;
    if (!rq || !pong) {
        free(rq);
        free(pong);
        return 0; /* no memory for the check: keep waiting, DHSA_DIST_TIMEOUT still holds */
    }
    for (int q = 0; q < g_size; q++) {
        rq[2 * q] = rq[2 * q + 1] = MPI_REQUEST_NULL;
        if (q == g_rank) continue;
        MPI_Irecv(&pong[q], 1, MPI_INT, q, TAG_PONG, g_live, &rq[2 * q]);
        MPI_Isend(&ping, 1, MPI_INT, q, TAG_PING, g_live, &rq[2 * q + 1]);
    }
    double t0 = MPI_Wtime();
    int all = 0;
    while (!all && MPI_Wtime() - t0 < g_stall) {
        MPI_Testall(2 * g_size, rq, &all, MPI_STATUSES_IGNORE);
        if (!all) sleep_s(0.002);
    }
    for (int q = 0; !all && q < g_size; q++) {
        int got = 1;
        if (rq[2 * q] != MPI_REQUEST_NULL) MPI_Test(&rq[2 * q], &got, MPI_STATUS_IGNORE);
        if (got) continue;
        size_t used = strlen(who);
        snprintf(who + used, cap - used, "%s%d", n_silent ? ", " : "", q);
        n_silent++;
    }
    free(rq);
    free(pong);
    return n_silent;
}

/* Ends the job from this rank: one line, then MPI_Abort. */
_Noreturn static void end_job(const char *line) {
    dhsa_cli_error_line("%s", line);
    MPI_Abort(MPI_COMM_WORLD, 3);
    _exit(3);
}

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

/* Polls the requests until done. After g_probe s, and every g_probe s
 * after, it checks that the other ranks are alive (roll_call): a rank that
 * does not answer ends the job, named. At g_timeout s the job ends all the
 * same, naming the ranks that do not answer if any. */
static int wait_all(int n, MPI_Request *r, const char *what, char *why) {
    double t0 = MPI_Wtime(), next_probe = t0 + g_probe;
    long spins = 0;
    for (;;) {
        int flag = 0, rc = MPI_Testall(n, r, &flag, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_why(rc, what, why);
        if (flag) return 0;
        double now = MPI_Wtime(), waited = now - t0;
        if (g_live_on && now >= next_probe) {
            char who[256], line[640];
            int silent = roll_call(who, sizeof who);
            if (silent) {
                snprintf(line, sizeof line,
                         "rank%s %s of %d did not answer a liveness check for %.0f s (stopped or frozen: "
                         "DHSA_DIST_STALL) while this rank waited %.0f s for %s; ending the job",
                         silent > 1 ? "s" : "", who, g_size, g_stall, MPI_Wtime() - t0, what);
                end_job(line);
            }
            next_probe = MPI_Wtime() + g_probe;
        }
        if (waited > g_timeout) {
            char who[256] = "", line[640];
            double keep = g_stall;
            g_stall = g_stall < 2.0 ? g_stall : 2.0; /* a live rank answers in milliseconds */
            int silent = g_live_on ? roll_call(who, sizeof who) : 0;
            g_stall = keep;
            snprintf(line, sizeof line,
                     "no answer from the other ranks for %.0f s in %s (DHSA_DIST_TIMEOUT): %s%s%s; ending the job",
                     waited, what, silent ? "rank(s) " : (g_live_on ? "every rank is alive, so one is hung or slower "
                                                                     "than DHSA_DIST_TIMEOUT allows" : "a rank died or stalled"),
                     who, silent ? " did not answer a liveness check" : "");
            end_job(line);
        }
        if (++spins > 2000) /* after a short spin, sleep: the cores are shared with the other ranks */
            sleep_s(0.0002);
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

/* DHSA_DIST_FAULT=kill:R, stop:R or stall:R (tests/test_dist.c): rank R
 * kills itself (SIGKILL), stops as a whole (SIGSTOP: its answering thread
 * too), or hangs in its main thread (alive, answering) at its first
 * transport call. */
static void fault_point(void) {
    static int done = 0;
    const char *f = getenv("DHSA_DIST_FAULT");
    if (done || !f) return;
    done = 1;
    int kill_it = strncmp(f, "kill:", 5) == 0, stall = strncmp(f, "stall:", 6) == 0, stop = strncmp(f, "stop:", 5) == 0;
    if ((!kill_it && !stall && !stop) || atoi(f + (stall ? 6 : 5)) != g_rank) return;
    dhsa_cli_error_line("DHSA_DIST_FAULT=%s: %s now", f, kill_it ? "dying" : stop ? "stopping (SIGSTOP)" : "stalling");
    if (kill_it) raise(SIGKILL);
    if (stop) raise(SIGSTOP);
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

/* A positive number of seconds from the environment, else def. */
static double env_seconds(const char *name, double def) {
    const char *v = getenv(name);
    char *end;
    double x = v ? strtod(v, &end) : 0;
    if (!v) return def;
    if (end == v || *end || !(x > 0) || x > 1e9) {
        dhsa_cli_error_line("%s=\"%s\" is not a positive number of seconds", name, v);
        exit(2);
    }
    return x;
}

const dhsa_dist *dhsa_cli_dist_start(int *argc, char ***argv) {
    if (launch_size() <= 1) return NULL;
    int provided = 0;
    /* MULTIPLE: the liveness thread uses MPI beside the main thread */
    if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
        dhsa_cli_error_line("MPI_Init failed: cannot run context parallel");
        exit(1);
    }
    g_started = 1;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    g_timeout = env_seconds("DHSA_DIST_TIMEOUT", g_timeout);
    g_probe = env_seconds("DHSA_DIST_PROBE", g_probe);
    g_stall = env_seconds("DHSA_DIST_STALL", g_stall);
    g_term_len = dhsa_cli_format_line(g_term_msg, sizeof g_term_msg,
                                      "stopped by the launcher (SIGTERM): another rank died or the job was ended");
    signal(SIGTERM, on_term);
    if (g_size == 1) return NULL;
    if (provided >= MPI_THREAD_MULTIPLE && MPI_Comm_dup(MPI_COMM_WORLD, &g_live) == MPI_SUCCESS) {
        MPI_Comm_set_errhandler(g_live, MPI_ERRORS_RETURN);
        atomic_store(&g_live_stop, 0);
        g_live_on = pthread_create(&g_live_thread, NULL, live_main, NULL) == 0;
    }
    if (!g_live_on && g_rank == 0)
        dhsa_cli_error_line("warning: this MPI gives no MPI_THREAD_MULTIPLE, so a stopped rank is only found after "
                            "DHSA_DIST_TIMEOUT = %.0f s", g_timeout);
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
    if (!g_started) return;
    if (g_live_on) {
        /* every rank past its last wait first: none pings a rank whose
         * answering thread has ended */
        char why[256];
        if (dhsa_cli_dist_barrier(why)) dhsa_cli_error_line("%s", why);
        atomic_store(&g_live_stop, 1);
        pthread_join(g_live_thread, NULL);
        g_live_on = 0;
        MPI_Comm_free(&g_live);
    }
    MPI_Finalize();
    g_started = 0;
}

#else /* no MPI */

const dhsa_dist *dhsa_cli_dist_start(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    int n = launch_size();
    if (n > 1) {
        dhsa_cli_error_line("launched as one of %d MPI ranks, but this dhsa was built without MPI, so each rank would "
                            "run the whole job alone: install Open MPI (apt-get install openmpi-bin libopenmpi-dev), "
                            "then make clean && make", n);
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
