/* test_unicode_tables.c: the pre-tokenizers' Unicode tables
 * (src/model/unicode_tables.c) are what their generator makes.
 *
 *   - the tables linked into libdhsa are well formed (sorted, disjoint, not
 *     adjacent, inside U+0000..U+10FFFF; punctuation above ASCII);
 *   - tools/gen/unicode_tables.py, run on the installed Unicode Character
 *     Database (/usr/share/unicode, Debian's unicode-data), writes the
 *     committed file (its tables: the header comment names the installed
 *     version, which may be newer than the pinned one);
 *   - the same generator pinned to another version (13.0.0) writes other
 *     tables: the comparison can fail.
 * Skips, saying why, without python3, without the data files, or with a
 * database older than the pinned version (the generator's exit status 3).
 * Run from the repository root: make test, or build/tests/test_unicode_tables.
 */
#include "model/unicode_tables.h"
#include "t.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define COMMITTED "src/model/unicode_tables.c"
#define GENERATOR "tools/gen/unicode_tables.py"
#define N_GEN_CHECKS 5 /* the checks of the generator's part, where it runs */

static void check_table(const char *name, const uint32_t (*r)[2], size_t n, uint32_t min_cp) {
    size_t bad = n;
    for (size_t i = 0; i < n && bad == n; i++) {
        if (r[i][0] > r[i][1] || r[i][1] > 0x10FFFF || r[i][0] < min_cp) bad = i;
        if (i > 0 && r[i][0] <= r[i - 1][1] + 1) bad = i; /* overlapping, unsorted or adjacent */
    }
    T_CHECK(n > 0 && bad == n, "%s: %zu ranges, range %zu is not sorted, disjoint and apart", name, n, bad);
}

/* The file's text after its first comment (the header naming the
 * installed database's version): malloc'd, NULL if unreadable. */
static char *body_of(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap ? 2 * cap : 1 << 16;
            char *p = realloc(buf, cap);
            if (!p) break;
            buf = p;
        }
        size_t got = fread(buf + n, 1, 4096, f);
        n += got;
        if (got == 0) break;
    }
    fclose(f);
    if (!buf) return NULL;
    buf[n] = 0;
    const char *end = strstr(buf, "*/");
    if (!end) {
        free(buf);
        return NULL;
    }
    memmove(buf, end + 2, strlen(end + 2) + 1);
    return buf;
}

/* 1-based line of the first difference of a and b. */
static int first_diff_line(const char *a, const char *b) {
    int line = 1;
    while (*a && *a == *b) line += *a++ == '\n', b++;
    return line;
}

/* Runs the generator with args into out; returns its exit status, the
 * first line of its stderr in why. */
static int generate(const char *args, const char *out, char *why, size_t cap) {
    char err[] = "/tmp/dhsa_unicode_err.XXXXXX";
    int fd = mkstemp(err);
    if (fd < 0) return -1;
    close(fd);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "python3 " GENERATOR " %s -o '%s' 2>'%s'", args, out, err);
    int rc = system(cmd);
    why[0] = 0;
    FILE *f = fopen(err, "r");
    if (f) {
        if (fgets(why, (int)cap, f)) why[strcspn(why, "\n")] = 0;
        fclose(f);
    }
    unlink(err);
    return rc == -1 ? -1 : WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

int main(void) {
    check_table("letters", dhsa__uni_letter, dhsa__uni_letter_n, 0);
    check_table("numbers", dhsa__uni_number, dhsa__uni_number_n, 0);
    check_table("marks", dhsa__uni_mark, dhsa__uni_mark_n, 0);
    check_table("punctuation", dhsa__uni_punct, dhsa__uni_punct_n, 0x80);

    if (system("python3 -c 'import sys; sys.exit(sys.version_info < (3, 6))' >/dev/null 2>&1") != 0) {
        T_SKIP(N_GEN_CHECKS, "no python3 (3.6 or later): " GENERATOR " is not run");
        return t_report("test_unicode_tables");
    }
    char *committed = body_of(COMMITTED);
    T_CHECK(committed != NULL && access(GENERATOR, R_OK) == 0,
            "%s or %s not found or without its header comment: run from the repository root", COMMITTED, GENERATOR);
    if (!committed || access(GENERATOR, R_OK) != 0) {
        T_SKIP(N_GEN_CHECKS - 1, "the generator's checks need the files above");
        free(committed);
        return t_report("test_unicode_tables");
    }
    char out[] = "/tmp/dhsa_unicode_tables.XXXXXX";
    int fd = mkstemp(out);
    T_CHECK(fd >= 0, "mkstemp");
    if (fd >= 0) close(fd);
    char why[512];
    int rc = generate("", out, why, sizeof why);
    if (rc == 3) {
        T_SKIP(N_GEN_CHECKS - 2, "the installed Unicode data cannot give the pinned tables: %s", why);
    } else {
        T_CHECK(rc == 0, "%s exited %d: %s", GENERATOR, rc, why);
        char *fresh = body_of(out);
        int same = fresh && strcmp(fresh, committed) == 0;
        T_CHECK(same, "%s is not what %s writes from the installed data (first difference at line %d after the "
                "header): regenerate it, or see docs/tokenizer.md on the pinned version",
                COMMITTED, GENERATOR, fresh ? first_diff_line(fresh, committed) : 0);
        free(fresh);
        /* a deliberately wrong input: the tables of Unicode 13.0 */
        rc = generate("--version 13.0.0", out, why, sizeof why);
        fresh = body_of(out);
        T_CHECK(rc == 0 && fresh && strcmp(fresh, committed) != 0,
                "the generator pinned to 13.0.0 (rc %d: %s) must write other tables", rc, why);
        free(fresh);
    }
    unlink(out);
    free(committed);
    return t_report("test_unicode_tables");
}
