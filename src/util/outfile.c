/* outfile.c: writing a file through a temporary in its folder and a rename
 * (contract in outfile.h; docs/files.md says what the CLI promises).
 * Tested by tests/test_cli_promises.c.
 */
#include "util/outfile.h"

#include "core/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef NAME_MAX
#define NAME_MAX 255
#endif

/* Distinguishes the temporaries of one process's threads. */
static atomic_uint tmp_counter;

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* The file a path names: a symbolic link's target when the link resolves,
 * else the path itself. NULL when out of memory. */
static char *target_of(const char *path) {
    struct stat ls;
    if (lstat(path, &ls) == 0 && S_ISLNK(ls.st_mode)) {
        char *real = realpath(path, NULL);
        if (real) return real;
    }
    return dup_str(path);
}

/* The folder of a path ("." when it has none), into buf. */
static void folder_of(const char *path, char *buf, size_t cap) {
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(buf, cap, ".");
    else if (slash == path) snprintf(buf, cap, "/");
    else snprintf(buf, cap, "%.*s", (int)(slash - path), path);
}

/* A sentence for a temporary that could not be created in the folder. */
static dhsa_status creation_failed(const char *path, const char *folder, int err) {
    struct stat st;
    if (err == ENOENT && stat(folder, &st) != 0)
        return dhsa__fail(DHSA_ERR_IO, "cannot write %s: the folder %s does not exist", path, folder);
    if (err == ENOTDIR || (stat(folder, &st) == 0 && !S_ISDIR(st.st_mode)))
        return dhsa__fail(DHSA_ERR_IO, "cannot write %s: %s is not a folder", path, folder);
    return dhsa__fail(DHSA_ERR_IO, "cannot write %s: no file can be created in the folder %s: %s", path, folder,
                      strerror(err));
}

/* Creates a fresh temporary beside target: NAME.part.PID.N, or
 * .dhsa.part.PID.N in the same folder when NAME is too long for that. On
 * success *tmp is malloc'd and the descriptor is returned; -1 with errno. */
static int create_tmp(const char *target, char **tmp) {
    char folder[PATH_MAX];
    folder_of(target, folder, sizeof folder);
    const char *base = strrchr(target, '/');
    base = base ? base + 1 : target;
    size_t cap = strlen(target) + 64;
    char *name = malloc(cap);
    if (!name) {
        errno = ENOMEM;
        return -1;
    }
    for (int tries = 0; tries < 100; tries++) {
        unsigned n = atomic_fetch_add(&tmp_counter, 1u);
        char suffix[48];
        snprintf(suffix, sizeof suffix, ".part.%ld.%u", (long)getpid(), n);
        if (strlen(base) + strlen(suffix) <= NAME_MAX) snprintf(name, cap, "%s%s", target, suffix);
        else snprintf(name, cap, "%s/.dhsa%s", folder, suffix);
        int fd = open(name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd >= 0) {
            *tmp = name;
            return fd;
        }
        if (errno != EEXIST) break;
    }
    int e = errno;
    free(name);
    errno = e;
    return -1;
}

/* What is wrong with path as an output before anything is created, or OK
 * (*st filled when it exists). */
static dhsa_status refuse_early(const char *path, struct stat *st, int *exists) {
    if (!path || !path[0]) return dhsa__fail(DHSA_ERR_INVALID_ARG, "the output file name is empty");
    size_t n = strlen(path);
    *exists = stat(path, st) == 0;
    if (*exists && S_ISDIR(st->st_mode))
        return dhsa__fail(DHSA_ERR_IO, "cannot write %s: it is a directory (name a file)", path);
    if (path[n - 1] == '/') return dhsa__fail(DHSA_ERR_IO, "cannot write %s: it names a folder (name a file)", path);
    return DHSA_OK;
}

dhsa_status dhsa_outfile_check(const char *path) {
    struct stat st;
    int exists;
    dhsa_status s = refuse_early(path, &st, &exists);
    if (s) return s;
    if (exists && !S_ISREG(st.st_mode)) { /* written in place: opening a FIFO here could block */
        if (access(path, W_OK) != 0)
            return dhsa__fail(DHSA_ERR_IO, "cannot write %s: %s", path, strerror(errno));
        return DHSA_OK;
    }
    char *target = target_of(path), *tmp = NULL;
    if (!target) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory");
    int fd = create_tmp(target, &tmp);
    if (fd < 0) {
        char folder[PATH_MAX];
        folder_of(target, folder, sizeof folder);
        s = creation_failed(path, folder, errno);
        free(target);
        return s;
    }
    close(fd);
    unlink(tmp);
    free(tmp);
    free(target);
    return DHSA_OK;
}

dhsa_status dhsa_outfile_open(dhsa_outfile *o, const char *path) {
    if (!o) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_outfile_open: NULL argument");
    memset(o, 0, sizeof *o);
    struct stat st;
    int exists;
    dhsa_status s = refuse_early(path, &st, &exists);
    if (s) return s;
    if (!(o->path = target_of(path))) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory");
    if (exists && !S_ISREG(st.st_mode)) {
        if (!(o->f = fopen(o->path, "wb"))) {
            s = dhsa__fail(DHSA_ERR_IO, "cannot write %s: %s", path, strerror(errno));
            free(o->path);
            o->path = NULL;
            return s;
        }
        errno = 0;
        return DHSA_OK;
    }
    int fd = create_tmp(o->path, &o->tmp);
    if (fd < 0) {
        char folder[PATH_MAX];
        folder_of(o->path, folder, sizeof folder);
        s = creation_failed(path, folder, errno);
        free(o->path);
        o->path = NULL;
        return s;
    }
    if (exists) (void)fchmod(fd, st.st_mode & 07777); /* the replaced file's permissions */
    if (!(o->f = fdopen(fd, "wb"))) {
        int e = errno;
        close(fd);
        dhsa_outfile_discard(o);
        return dhsa__fail(DHSA_ERR_IO, "cannot write %s: %s", path, strerror(e));
    }
    errno = 0; /* so that a failed write's errno is the one commit reports */
    return DHSA_OK;
}

static void release(dhsa_outfile *o) {
    free(o->path);
    free(o->tmp);
    memset(o, 0, sizeof *o);
}

void dhsa_outfile_discard(dhsa_outfile *o) {
    if (!o) return;
    if (o->f) fclose(o->f);
    if (o->tmp) unlink(o->tmp);
    release(o);
}

/* Makes the rename itself durable where the folder can be opened. */
static void sync_folder(const char *path) {
    char folder[PATH_MAX];
    folder_of(path, folder, sizeof folder);
    int fd = open(folder, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return;
    (void)fsync(fd);
    close(fd);
}

dhsa_status dhsa_outfile_commit(dhsa_outfile *o) {
    if (!o || !o->f) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_outfile_commit: no file is open");
    int err = 0, seen = errno; /* a failed write's errno, if any (open cleared it) */
    if (fflush(o->f) != 0) err = errno;
    else if (ferror(o->f)) err = seen ? seen : EIO;
    /* fsync of a device or pipe fails with EINVAL: nothing to make durable */
    if (!err && o->tmp && fsync(fileno(o->f)) != 0 && errno != EINVAL) err = errno;
    if (fclose(o->f) != 0 && !err) err = errno;
    o->f = NULL;
    dhsa_status s = DHSA_OK;
    if (err) {
        s = dhsa__fail(DHSA_ERR_IO, "writing %s failed: %s%s", o->path, strerror(err),
                       o->tmp ? " (the old file, if any, is untouched)" : "");
        if (o->tmp) unlink(o->tmp);
    } else if (o->tmp && rename(o->tmp, o->path) != 0) {
        err = errno;
        s = dhsa__fail(DHSA_ERR_IO, "cannot put %s in place (renaming %s): %s", o->path, o->tmp, strerror(err));
        unlink(o->tmp);
    } else if (o->tmp) {
        sync_folder(o->path);
    }
    release(o);
    return s;
}

dhsa_status dhsa_outfile_write(const char *path, dhsa_outfile_writer write, void *user) {
    dhsa_outfile o;
    dhsa_status s = dhsa_outfile_open(&o, path);
    if (s) return s;
    s = write(user, o.f);
    if (s) {
        char msg[400];
        snprintf(msg, sizeof msg, "%s", dhsa_last_error());
        dhsa_outfile_discard(&o);
        return dhsa__fail(s, "writing %s failed: %s", path, msg);
    }
    return dhsa_outfile_commit(&o);
}
