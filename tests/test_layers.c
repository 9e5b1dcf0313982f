/* test_layers.c: the house rules a reader of the tree relies on
 * (docs/architecture.md, "The layers"), read from the sources themselves:
 *
 *   1. every `#include "..."` in src/ resolves (next to the file, then
 *      include/, then src/, as the compiler's -Iinclude -Isrc do) to a
 *      file, and so to a folder of src/ (or to include/, the public
 *      header, which any folder may include);
 *   2. each folder of src/ includes only itself and the folders the layer
 *      table below lets it (a folder not in the table fails: add it, with
 *      what it may include);
 *   3. no circle of includes between the folders of src/ (checked on the
 *      includes as they are, not on the table); inside src/route, chunking
 *      and selection include nothing of the decode index (ROUTE_LOWER);
 *   4. no source file (.c .h .py .sh) in src/ tools/ tests/ include/
 *      python/ bench/ fuzz/ is over 1,500 lines, except the named
 *      exceptions below while they are being split.
 *
 * Each rule also runs once on a deliberately wrong input (an include from
 * attn up to route, a two-folder circle, a long file) and must fail it.
 * Runs from the repository root (make test does); skipped, saying so,
 * where the source tree is not there.
 */
#include "t.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_LINES 1500

/* ------------------------------------------------------------ the table --- */

/* The layers, bottom first: a folder may include itself, include/ and the
 * folders named here (docs/architecture.md draws the same table). */
static const struct {
    const char *folder;
    const char *may_include; /* space-separated folders of src/ */
} LAYERS[] = {
    {"core", ""},                                   /* ctx, threads, tensors, status, CPU flags, exp */
    {"util", "core"},                               /* temp-name writer, SHA-256 */
    {"attn", "core"},                               /* attention kernels, layouts, merge */
    {"matmul", "core"},                             /* weight formats and products */
    {"route", "attn core util"},                    /* routing: boundaries, selection, prefill, index */
    {"dist", "route attn core"},                    /* context parallelism */
    {"model", "dist route attn matmul util core"},  /* GGUF, tokenizer, forward pass, session */
    {"eval", "util core"},                          /* quality tasks over the public API */
};
#define N_LAYERS (int)(sizeof LAYERS / sizeof LAYERS[0])

/* Files over MAX_LINES while another change splits them (issue 36): each
 * is named, and leaves the list when its split lands. A listed file that
 * is back under the limit is reported so that its line can go. */
static const char *const LONG_FILES[] = {
    /* "path", followed by a comment on what splits it; none at present */
    NULL, /* the end (C has no empty array) */
};
#define N_LONG (int)(sizeof LONG_FILES / sizeof LONG_FILES[0] - 1)

static int layer_of(const char *folder) {
    for (int i = 0; i < N_LAYERS; i++)
        if (!strcmp(LAYERS[i].folder, folder)) return i;
    return -1;
}

/* 1 if folder `from` may include folder `to` (both folders of src/). */
static int allowed(const char *from, const char *to) {
    if (!strcmp(from, to)) return 1;
    int i = layer_of(from);
    if (i < 0) return 0;
    const char *s = LAYERS[i].may_include;
    size_t n = strlen(to);
    while (*s) {
        while (*s == ' ') s++;
        size_t w = strcspn(s, " ");
        if (w == n && !strncmp(s, to, n)) return 1;
        s += w;
    }
    return 0;
}

/* Inside src/route the same rule by file (docs/architecture.md, src/route):
 * the two halves at the bottom, chunking (boundaries, the predictor) and
 * selection (select), with the params and rows they share, include
 * nothing of the two siblings above them, prefill routing (route.c) and
 * the decode index (kv_index.c; its header is the one a file could reach). */
static const char *const ROUTE_LOWER[] = {"params", "rows", "boundaries", "predictor", "select"};
#define N_ROUTE_LOWER (int)(sizeof ROUTE_LOWER / sizeof ROUTE_LOWER[0])

/* 1 if file (a path under src/) may include target by the rule above. */
static int route_file_allowed(const char *file, const char *target) {
    if (strncmp(file, "src/route/", 10)) return 1;
    for (int i = 0; i < N_ROUTE_LOWER; i++)
        if (!strncmp(file + 10, ROUTE_LOWER[i], strlen(ROUTE_LOWER[i])))
            return strcmp(target, "src/route/kv_index_internal.h") != 0;
    return 1;
}

/* --------------------------------------------------------- the folders --- */

#define MAX_FOLDERS 64
static char folders[MAX_FOLDERS][64];
static int n_folders;
/* edge[a][b]: the first include seen from folder a to folder b ("" none) */
static char edge[MAX_FOLDERS][MAX_FOLDERS][1400];

static int folder_id(const char *name) {
    for (int i = 0; i < n_folders; i++)
        if (!strcmp(folders[i], name)) return i;
    if (n_folders == MAX_FOLDERS) return -1;
    snprintf(folders[n_folders], sizeof folders[0], "%s", name);
    return n_folders++;
}

/* A circle in the graph edge[][] over n nodes: 1 and the circle's nodes
 * in path[0 .. *len) (path[0] again closes it), or 0. Depth-first search
 * with colours: 1 on the stack, 2 done. */
static int dfs(int u, int n, int *colour, int *stack, int depth, int *path, int *len) {
    colour[u] = 1;
    stack[depth] = u;
    for (int v = 0; v < n; v++) {
        if (v == u || !edge[u][v][0]) continue;
        if (colour[v] == 1) { /* back edge: the circle is stack[from v .. depth] */
            int k = depth;
            while (stack[k] != v) k--;
            *len = 0;
            for (int i = k; i <= depth; i++) path[(*len)++] = stack[i];
            return 1;
        }
        if (!colour[v] && dfs(v, n, colour, stack, depth + 1, path, len)) return 1;
    }
    colour[u] = 2;
    return 0;
}

static int find_circle(int n, int *path, int *len) {
    int colour[MAX_FOLDERS] = {0}, stack[MAX_FOLDERS];
    for (int u = 0; u < n; u++)
        if (!colour[u] && dfs(u, n, colour, stack, 0, path, len)) return 1;
    return 0;
}

/* ----------------------------------------------------------- the files --- */

typedef void (*file_fn)(const char *path, void *arg);

/* Calls fn on every regular file under dir (sorted within each folder, so
 * the messages come in a stable order), skipping hidden entries and
 * __pycache__. */
static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }
static void walk(const char *dir, file_fn fn, void *arg) {
    DIR *d = opendir(dir);
    if (!d) return;
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' || !strcmp(e->d_name, "__pycache__")) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **t = realloc(names, cap * sizeof *names);
            if (!t) break;
            names = t;
        }
        names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; i < n; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        struct stat st;
        if (names[i] && !stat(path, &st)) {
            if (S_ISDIR(st.st_mode)) walk(path, fn, arg);
            else if (S_ISREG(st.st_mode)) fn(path, arg);
        }
        free(names[i]);
    }
    free(names);
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

static int exists(const char *path) {
    struct stat st;
    return !stat(path, &st) && S_ISREG(st.st_mode);
}

/* The folder of src/ a path under src/ is in ("route" for
 * src/route/select.c; a deeper file's folder is its whole directory). */
static void src_folder(const char *path, char *out, size_t cap) {
    const char *p = path + 4; /* after "src/" */
    const char *slash = strrchr(p, '/');
    size_t n = slash ? (size_t)(slash - p) : 0;
    if (n >= cap) n = cap - 1;
    memcpy(out, p, n);
    out[n] = 0;
}

typedef struct {
    int files, includes;
    int unresolved, outside, broken; /* failures, each printed */
} inc_stats;

/* Where `#include "name"` in file resolves: next to the file, then
 * include/, then src/ (the build's -Iinclude -Isrc). */
static int resolve(const char *file, const char *name, char *out, size_t cap) {
    const char *slash = strrchr(file, '/');
    snprintf(out, cap, "%.*s/%s", (int)(slash ? slash - file : 0), file, name);
    if (exists(out)) return 1;
    snprintf(out, cap, "include/%s", name);
    if (exists(out)) return 1;
    snprintf(out, cap, "src/%s", name);
    return exists(out);
}

/* Records one include from folder `from` (of src/) to the resolved path. */
static void add_include(const char *file, int line, const char *from, const char *target, inc_stats *s) {
    char where[256];
    snprintf(where, sizeof where, "%s:%d", file, line);
    if (!strncmp(target, "include/", 8)) return; /* the public header: every layer may */
    if (strncmp(target, "src/", 4)) {
        fprintf(stderr, "FAIL %s includes %s, outside src/ and include/ (the library includes no tools/ or tests/ file)\n",
                where, target);
        s->outside++;
        return;
    }
    char to[64];
    src_folder(target, to, sizeof to);
    int a = folder_id(from), b = folder_id(to);
    if (a < 0 || b < 0) return;
    if (a != b && !edge[a][b][0]) snprintf(edge[a][b], sizeof edge[a][b], "%s (%s)", where, target);
    if (layer_of(from) < 0) {
        fprintf(stderr, "FAIL %s: src/%s is not in the layer table (tests/test_layers.c, docs/architecture.md): "
                        "add it with the folders it may include\n", where, from);
        s->broken++;
    } else if (!allowed(from, to)) {
        fprintf(stderr, "FAIL %s includes %s: src/%s may include only %s%s (the layer table, tests/test_layers.c)\n",
                where, target, from, LAYERS[layer_of(from)].may_include[0] ? LAYERS[layer_of(from)].may_include : "itself",
                LAYERS[layer_of(from)].may_include[0] ? " and itself" : "");
        s->broken++;
    } else if (!route_file_allowed(file, target)) {
        fprintf(stderr, "FAIL %s includes %s: chunking and selection include nothing of the decode index "
                        "(src/route's file rule, tests/test_layers.c)\n", where, target);
        s->broken++;
    }
}

static void scan_includes(const char *path, void *arg) {
    inc_stats *s = arg;
    if (!ends_with(path, ".c") && !ends_with(path, ".h")) return;
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "FAIL %s: cannot be read\n", path);
        s->unresolved++;
        return;
    }
    s->files++;
    char from[64];
    src_folder(path, from, sizeof from);
    folder_id(from);
    char buf[4096];
    int line = 0;
    while (fgets(buf, sizeof buf, f)) {
        line++;
        const char *p = buf;
        while (*p == ' ' || *p == '\t') p++;
        if (*p != '#') continue;
        p++;
        while (*p == ' ' || *p == '\t') p++;
        if (strncmp(p, "include", 7)) continue;
        p += 7;
        while (*p == ' ' || *p == '\t') p++;
        if (*p != '"') continue; /* <system> headers are not ours */
        const char *e = strchr(p + 1, '"');
        if (!e) continue;
        char name[512], target[1024];
        snprintf(name, sizeof name, "%.*s", (int)(e - p - 1), p + 1);
        s->includes++;
        if (!resolve(path, name, target, sizeof target)) {
            fprintf(stderr, "FAIL %s:%d: #include \"%s\" resolves to no file (next to it, include/ or src/)\n", path,
                    line, name);
            s->unresolved++;
            continue;
        }
        add_include(path, line, from, target, s);
    }
    fclose(f);
}

typedef struct {
    int files, over;
    int listed_seen[N_LONG + 1];
} len_stats;

static long count_lines(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    long n = 0;
    int c;
    while ((c = getc(f)) != EOF) n += c == '\n';
    fclose(f);
    return n;
}

static void scan_length(const char *path, void *arg) {
    len_stats *s = arg;
    if (!ends_with(path, ".c") && !ends_with(path, ".h") && !ends_with(path, ".py") && !ends_with(path, ".sh")) return;
    s->files++;
    long n = count_lines(path);
    int listed = -1;
    for (int i = 0; i < N_LONG; i++)
        if (!strcmp(path, LONG_FILES[i])) listed = i;
    if (listed >= 0) {
        s->listed_seen[listed] = 1;
        if (n <= MAX_LINES)
            printf("note: %s is %ld lines now: its line in LONG_FILES (tests/test_layers.c) can go\n", path, n);
        return;
    }
    if (n > MAX_LINES) {
        fprintf(stderr, "FAIL %s: %ld lines, over %d: split it (one idea per file)\n", path, n, MAX_LINES);
        s->over++;
    }
}

/* ------------------------------------------------------- wrong on purpose --- */

/* The checks above on inputs that must fail: an include from attn up to
 * route, a circle of two folders, a folder missing from the table. */
static void self_check(void) {
    T_CHECK(!allowed("attn", "route"), "the table lets attn include route");
    T_CHECK(!allowed("core", "attn") && allowed("route", "attn") && allowed("model", "model"),
            "the table's rule is not the one written");
    T_CHECK(!allowed("newfolder", "core"), "a folder missing from the table passes");
    T_CHECK(!route_file_allowed("src/route/select.c", "src/route/kv_index_internal.h") &&
                route_file_allowed("src/route/kv_index.c", "src/route/select.h") &&
                route_file_allowed("src/dist/dist.c", "src/route/kv_index_internal.h"),
            "route's file rule is not the one written");
    n_folders = 0;
    memset(edge, 0, sizeof edge);
    int a = folder_id("attn"), r = folder_id("route"), c = folder_id("core");
    snprintf(edge[r][a], sizeof edge[r][a], "x");
    snprintf(edge[a][c], sizeof edge[a][c], "x");
    int path[MAX_FOLDERS], len = 0;
    T_CHECK(!find_circle(n_folders, path, &len), "a circle found where there is none");
    snprintf(edge[a][r], sizeof edge[a][r], "x");
    T_CHECK(find_circle(n_folders, path, &len) && len == 2, "the circle attn <-> route is not found");
    n_folders = 0;
    memset(edge, 0, sizeof edge);
}

int main(void) {
    self_check();
    if (!exists("src/core/internal.h") || !exists("include/dhsa.h")) {
        T_SKIP(6, "the source tree is not here (run from the repository root, as make test does)");
        return t_report("test_layers");
    }

    /* 1-2: includes resolve and follow the table */
    inc_stats is = {0};
    walk("src", scan_includes, &is);
    T_CHECK(is.files > 50 && is.includes > 100, "read only %d files, %d includes in src/", is.files, is.includes);
    T_CHECK(is.unresolved == 0 && is.outside == 0, "%d includes resolve to no file, %d leave src/ and include/",
            is.unresolved, is.outside);
    T_CHECK(is.broken == 0, "%d includes break the layer table (FAIL lines above)", is.broken);

    /* 3: no circle between folders */
    int path[MAX_FOLDERS], len = 0;
    int circle = find_circle(n_folders, path, &len);
    if (circle) {
        fprintf(stderr, "FAIL include circle between folders of src/:\n");
        for (int i = 0; i < len; i++) {
            int u = path[i], v = path[(i + 1) % len];
            fprintf(stderr, "  src/%s -> src/%s: %s\n", folders[u], folders[v], edge[u][v]);
        }
    }
    T_CHECK(!circle, "the folders of src/ include each other in a circle (above)");

    /* 4: no file over MAX_LINES but the named exceptions */
    len_stats ls = {0};
    const char *roots[] = {"src", "tools", "tests", "include", "python", "bench", "fuzz"};
    for (size_t i = 0; i < sizeof roots / sizeof roots[0]; i++) walk(roots[i], scan_length, &ls);
    T_CHECK(ls.files > 100, "only %d source files counted", ls.files);
    T_CHECK(ls.over == 0, "%d source files over %d lines (FAIL lines above)", ls.over, MAX_LINES);
    for (int i = 0; i < N_LONG; i++)
        if (!ls.listed_seen[i])
            printf("note: %s (in LONG_FILES, tests/test_layers.c) is gone: its line can go\n", LONG_FILES[i]);

    printf("%d files and %d includes in src/ over %d folders; %d source files counted, %d long ones listed\n", is.files,
           is.includes, n_folders, ls.files, N_LONG);
    return t_report("test_layers");
}
