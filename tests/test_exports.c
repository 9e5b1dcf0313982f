/* test_exports.c: libdhsa.so exports exactly the functions the public
 * header declares (docs/architecture.md, "The library's face").
 *
 * The library is compiled with -fvisibility=hidden and every declaration of
 * include/dhsa.h carries DHSA_API, so its binary interface is the header and
 * nothing else: the internals (dhsa__*, the declarations of src/ headers)
 * reach tests and tools only through libdhsa.a. This test reads the header
 * (and any header it includes with #include "..."), collects the names of
 * the functions (and extern variables) it declares, runs
 * `nm -D --defined-only` on the shared library and compares the two lists;
 * each name on one side only is printed. It also checks that every
 * declaration starts with DHSA_API, and, so that it can fail, that its
 * parser reads a small header with the traps of the real one (comments,
 * strings, function-pointer typedefs and members, extern "C", declarations
 * over several lines) and that a list with one name too many or too few is
 * told apart.
 *
 * Library: $DHSA_LIB, else libdhsa.so beside $DHSA_CLI (tests/run.sh sets
 * it to BUILD/dhsa), else build/libdhsa.so. Header: include/dhsa.h (run from
 * the repository root, as make test does). Skips, saying so, without nm
 * (binutils). Run: make test, or build/tests/test_exports.
 */
#include "t.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- name lists ---------------------------------------------------------- */

typedef struct {
    char **v;
    int n, cap;
} names;

static void names_add(names *s, const char *p, size_t len) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 256;
        char **v = realloc(s->v, (size_t)s->cap * sizeof *v);
        if (!v) {
            fprintf(stderr, "test_exports: out of memory\n");
            exit(1);
        }
        s->v = v;
    }
    char *c = malloc(len + 1);
    if (!c) {
        fprintf(stderr, "test_exports: out of memory\n");
        exit(1);
    }
    memcpy(c, p, len);
    c[len] = 0;
    s->v[s->n++] = c;
}

static void names_free(names *s) {
    for (int i = 0; i < s->n; i++) free(s->v[i]);
    free(s->v);
    memset(s, 0, sizeof *s);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Sorts and drops repeats (a function declared twice is one export). */
static void names_sort(names *s) {
    if (s->n > 1) qsort(s->v, (size_t)s->n, sizeof *s->v, cmp_str);
    int k = 0;
    for (int i = 0; i < s->n; i++) {
        if (k > 0 && strcmp(s->v[k - 1], s->v[i]) == 0) {
            free(s->v[i]);
            continue;
        }
        s->v[k++] = s->v[i];
    }
    s->n = k;
}

/* Prints (when verbose) and counts the names of a that b lacks. Both sorted. */
static int names_only_in(const names *a, const names *b, const char *what, int verbose) {
    int n = 0, j = 0;
    for (int i = 0; i < a->n; i++) {
        while (j < b->n && strcmp(b->v[j], a->v[i]) < 0) j++;
        if (j < b->n && strcmp(b->v[j], a->v[i]) == 0) continue;
        if (verbose) fprintf(stderr, "  %s: %s\n", what, a->v[i]);
        n++;
    }
    return n;
}

/* ---- header parser -------------------------------------------------------- */

typedef struct {
    names decl;     /* declared functions and extern variables */
    names unmarked; /* of those, declarations that do not start with DHSA_API */
    names includes; /* "file.h" of #include "file.h" lines */
    int error;      /* an unterminated comment, string or brace */
} header;

static int is_ident(int c) { return isalnum((unsigned char)c) || c == '_'; }

/* Reads the top-level declarations of one header text: statements that end
 * in ';' outside braces. One that is not a typedef and holds a '(' outside
 * braces declares the function named by the identifier before its first
 * '('; one that starts with "extern" and has no '(' declares the variable
 * named by its last identifier. Comments, strings, character constants and
 * preprocessor lines are skipped; the braces of `extern "C" {` are
 * transparent. */
static void parse_header(const char *s, header *h) {
    size_t n = strlen(s), i = 0;
    int depth = 0, line_start = 1, extern_c_open = 0;
    size_t start = 0, paren = 0, last_id = 0, last_id_len = 0;
    int in_stmt = 0, has_paren = 0;
    while (i < n) {
        char c = s[i];
        if (c == '/' && s[i + 1] == '*') {
            const char *e = strstr(s + i + 2, "*/");
            if (!e) {
                h->error = 1;
                return;
            }
            i = (size_t)(e - s) + 2;
            continue;
        }
        if (c == '/' && s[i + 1] == '/') {
            while (i < n && s[i] != '\n') i++;
            continue;
        }
        if (c == '\n') {
            line_start = 1;
            i++;
            continue;
        }
        if (c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v') {
            i++;
            continue;
        }
        if (c == '#' && line_start) {
            size_t b = i;
            for (;;) { /* the directive with its continuation lines */
                while (i < n && s[i] != '\n') i++;
                if (i > 0 && s[i - 1] == '\\' && i < n) {
                    i++;
                    continue;
                }
                break;
            }
            const char *inc = "#include \"";
            if ((size_t)(i - b) > strlen(inc) && strncmp(s + b, inc, strlen(inc)) == 0) {
                const char *q = memchr(s + b + strlen(inc), '"', i - b - strlen(inc));
                if (q) names_add(&h->includes, s + b + strlen(inc), (size_t)(q - (s + b + strlen(inc))));
            }
            continue;
        }
        line_start = 0;
        if (c == '"' || c == '\'') {
            size_t j = i + 1;
            while (j < n && s[j] != c && s[j] != '\n') j += s[j] == '\\' ? 2 : 1;
            if (j >= n || s[j] != c) {
                h->error = 1;
                return;
            }
            /* extern "C" { ... }: the string starts no statement of its own */
            if (in_stmt && depth == 0 && i - start >= 6 && strncmp(s + start, "extern", 6) == 0 &&
                j - i == 2 && s[i + 1] == 'C') {
                size_t k = j + 1;
                while (k < n && isspace((unsigned char)s[k])) k++;
                if (k < n && s[k] == '{') {
                    extern_c_open++;
                    in_stmt = 0;
                    i = k + 1;
                    continue;
                }
            }
            i = j + 1;
            continue;
        }
        if (c == '{') {
            depth++;
            i++;
            continue;
        }
        if (c == '}') {
            if (depth == 0) {
                if (extern_c_open == 0) {
                    h->error = 1;
                    return;
                }
                extern_c_open--;
            } else {
                depth--;
            }
            i++;
            continue;
        }
        if (depth > 0) {
            i++;
            continue;
        }
        if (!in_stmt) {
            in_stmt = 1;
            start = i;
            has_paren = 0;
            last_id_len = 0;
        }
        if (is_ident(c)) {
            size_t b = i;
            while (i < n && is_ident(s[i])) i++;
            last_id = b;
            last_id_len = i - b;
            continue;
        }
        if (c == '(' && !has_paren) {
            has_paren = 1;
            paren = i;
        }
        if (c == ';') {
            int is_typedef = strncmp(s + start, "typedef", 7) == 0 && !is_ident(s[start + 7]);
            int is_extern = strncmp(s + start, "extern", 6) == 0 && !is_ident(s[start + 6]);
            size_t m = start;
            if (is_extern) /* extern DHSA_API const int x; */
                for (m += 6; isspace((unsigned char)s[m]);) m++;
            int marked = strncmp(s + m, "DHSA_API", 8) == 0 && !is_ident(s[m + 8]);
            size_t name = 0, name_len = 0;
            if (!is_typedef && has_paren) {
                /* back from the first '(' to the identifier before it */
                size_t k = paren;
                while (k > start && isspace((unsigned char)s[k - 1])) k--;
                size_t e = k;
                while (k > start && is_ident(s[k - 1])) k--;
                name = k;
                name_len = e - k;
            } else if (!is_typedef && is_extern && last_id_len > 0) {
                name = last_id;
                name_len = last_id_len;
            }
            if (name_len > 0) {
                names_add(&h->decl, s + name, name_len);
                if (!marked) names_add(&h->unmarked, s + name, name_len);
            }
            in_stmt = 0;
        }
        i++;
    }
    if (depth != 0 || extern_c_open != 0) h->error = 1;
}

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    while (b) {
        if (n + 1 >= cap) {
            char *nb = realloc(b, cap *= 2);
            if (!nb) {
                free(b);
                b = NULL;
                break;
            }
            b = nb;
        }
        size_t k = fread(b + n, 1, cap - 1 - n, f);
        if (k == 0) break;
        n += k;
    }
    fclose(f);
    if (b) b[n] = 0;
    return b;
}

/* Parses dir/file and, once each, the headers it includes with
 * #include "...", each found as the compiler finds it: beside the file
 * that includes it (include/dhsa.h's "dhsa/core.h" is include/dhsa/core.h,
 * whose "attn.h" is include/dhsa/attn.h). Returns 0 or -1 (a file that
 * cannot be read, or a parse error). */
static int parse_public(const char *dir, const char *file, header *h, names *seen) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    for (int i = 0; i < seen->n; i++)
        if (strcmp(seen->v[i], path) == 0) return 0;
    names_add(seen, path, strlen(path));
    char *text = read_text(path);
    if (!text) {
        fprintf(stderr, "test_exports: cannot read %s\n", path);
        return -1;
    }
    int first_inc = h->includes.n;
    parse_header(text, h);
    free(text);
    if (h->error) {
        fprintf(stderr, "test_exports: %s: unterminated comment, string or brace\n", path);
        return -1;
    }
    int last_inc = h->includes.n;
    char here[1024]; /* the folder of path */
    const char *slash = strrchr(path, '/');
    snprintf(here, sizeof here, "%.*s", (int)(slash - path), path);
    for (int i = first_inc; i < last_inc; i++) {
        char inc[512];
        snprintf(inc, sizeof inc, "%s", h->includes.v[i]);
        if (parse_public(here, inc, h, seen) != 0) return -1;
    }
    return 0;
}

/* ---- the library's exports ----------------------------------------------- */

/* Symbols that sanitizer builds (make asan/ubsan) add on their own. */
static int sanitizer_symbol(const char *s) {
    return strncmp(s, "__asan", 6) == 0 || strncmp(s, "__odr_asan", 10) == 0 || strncmp(s, "__ubsan", 7) == 0 ||
           strncmp(s, "__sanitizer", 11) == 0 || strncmp(s, "__sancov", 8) == 0;
}

/* `nm -D --defined-only LIB` into out. Returns 0, 1 when nm cannot run, -1
 * when it ran and failed. */
static int exported(const char *lib, names *out) {
    if (system("nm --version >/dev/null 2>&1") != 0) return 1;
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "nm -D --defined-only '%s'", lib);
    FILE *p = popen(cmd, "r");
    if (!p) return 1;
    char line[1024];
    while (fgets(line, sizeof line, p)) {
        /* "ADDRESS TYPE NAME" (the address is absent for absolute symbols) */
        char a[256], b[256], c[768];
        int k = sscanf(line, "%255s %255s %767s", a, b, c);
        const char *name = k == 3 ? c : k == 2 ? b : NULL;
        if (!name) continue;
        char *at = strchr(name, '@'); /* a version suffix, if any */
        if (at) *at = 0;
        if (!sanitizer_symbol(name)) names_add(out, name, strlen(name));
    }
    return pclose(p) == 0 ? 0 : -1;
}

static const char *library_path(char *buf, size_t cap) {
    const char *lib = getenv("DHSA_LIB");
    if (lib && *lib) return lib;
    const char *cli = getenv("DHSA_CLI");
    if (cli && *cli) {
        const char *slash = strrchr(cli, '/');
        if (slash) {
            snprintf(buf, cap, "%.*s/libdhsa.so", (int)(slash - cli), cli);
            return buf;
        }
    }
    return "build/libdhsa.so";
}

/* ---- the parser on a header with the real one's traps --------------------- */

static void check_parser(void) {
    static const char text[] =
        "/* dhsa_comment(void); in a comment */\n"
        "#ifndef X_H\n#define X_H\n#include <stddef.h>\n#include \"x_part.h\"\n"
        "#ifdef __cplusplus\nextern \"C\" {\n#endif\n"
        "#define DHSA_API __attribute__((visibility(\"default\")))\n"
        "#define M(a) \\\n  dhsa_in_macro(a);\n"
        "typedef enum { A = 0, B = -1 /* b() */ } e;\n"
        "typedef void (*dhsa_fn)(void *arg, int i);\n"
        "typedef struct {\n    int (*hook)(void *user, const char *s);\n    char c; /* ';' */\n} s;\n"
        "DHSA_API const char *dhsa_one(e x);\n"
        "DHSA_API dhsa_status dhsa_two(int64_t a, int64_t b,\n"
        "                              const char *s /* \"(\" */);\n"
        "DHSA_API int dhsa_one(e x); // declared twice\n"
        "void *dhsa_unmarked (int c);\n"
        "extern DHSA_API const int dhsa_variable;\n"
        "struct tag { int x; };\n"
        "#ifdef __cplusplus\n}\n#endif\n#endif\n";
    header h = {0};
    parse_header(text, &h);
    names_sort(&h.decl);
    names_sort(&h.unmarked);
    static const char *want[] = {"dhsa_one", "dhsa_two", "dhsa_unmarked", "dhsa_variable"};
    int ok = !h.error && h.decl.n == 4;
    for (int i = 0; ok && i < 4; i++) ok = strcmp(h.decl.v[i], want[i]) == 0;
    T_CHECK(ok, "the parser reads the sample header as dhsa_one, dhsa_two, dhsa_unmarked, dhsa_variable "
                "(got %d names%s%s%s)",
            h.decl.n, h.error ? ", a parse error" : "", h.decl.n > 0 ? ", first " : "",
            h.decl.n > 0 ? h.decl.v[0] : "");
    T_CHECK(h.unmarked.n == 1 && strcmp(h.unmarked.v[0], "dhsa_unmarked") == 0,
            "the declaration without DHSA_API is found (got %d)", h.unmarked.n);
    T_CHECK(h.includes.n == 1 && strcmp(h.includes.v[0], "x_part.h") == 0, "#include \"x_part.h\" is followed");
    names_free(&h.decl);
    names_free(&h.unmarked);
    names_free(&h.includes);
    header bad = {0};
    parse_header("DHSA_API int f(void);\n/* never closed", &bad);
    T_CHECK(bad.error, "an unterminated comment is an error, not a shorter list");
    names_free(&bad.decl);
    names_free(&bad.unmarked);
    names_free(&bad.includes);
}

int main(void) {
    check_parser();

    header h = {0};
    names seen = {0};
    int rc = parse_public("include", "dhsa.h", &h, &seen);
    T_CHECK(rc == 0, "include/dhsa.h is read (run from the repository root)");
    names_sort(&h.decl);
    names_sort(&h.unmarked);
    T_CHECK(h.decl.n >= 100, "the public header declares %d functions (expected well over 100)", h.decl.n);
    for (int i = 0; i < h.unmarked.n; i++) fprintf(stderr, "  declared without DHSA_API: %s\n", h.unmarked.v[i]);
    T_CHECK(h.unmarked.n == 0, "every public declaration starts with DHSA_API (%d do not)", h.unmarked.n);

    char buf[1024];
    const char *lib = library_path(buf, sizeof buf);
    names exp = {0};
    int e = exported(lib, &exp);
    if (e == 1) {
        T_SKIP(4, "nm (binutils) cannot run here, so the exports of %s are not compared", lib);
    } else {
        T_CHECK(e == 0 && exp.n > 0, "`nm -D --defined-only %s` lists its exports", lib);
        names_sort(&exp);
        int extra = names_only_in(&exp, &h.decl, "exported, not declared in include/", 1);
        int missing = names_only_in(&h.decl, &exp, "declared, not exported", 1);
        printf("%s: %d exported, %d declared\n", lib, exp.n, h.decl.n);
        T_CHECK(extra == 0, "%d symbols exported that the public header does not declare (listed above)", extra);
        T_CHECK(missing == 0, "%d declared functions not exported (listed above)", missing);
        /* the comparison tells a list one name off apart, either way */
        if (exp.n > 0) {
            names fewer = exp;
            fewer.n--; /* the last name left out */
            int m = names_only_in(&h.decl, &fewer, "", 0);
            names more = {0};
            for (int i = 0; i < exp.n; i++) names_add(&more, exp.v[i], strlen(exp.v[i]));
            names_add(&more, "dhsa__internal_helper", strlen("dhsa__internal_helper"));
            names_sort(&more);
            int x = names_only_in(&more, &h.decl, "", 0);
            T_CHECK(m == missing + 1 && x == extra + 1,
                    "an export list one name short or one name over is told apart (%d, %d)", m - missing,
                    x - extra);
            names_free(&more);
        } else {
            T_CHECK(0, "no exports to alter");
        }
    }
    names_free(&exp);
    names_free(&h.decl);
    names_free(&h.unmarked);
    names_free(&h.includes);
    names_free(&seen);
    return t_report("test_exports");
}
