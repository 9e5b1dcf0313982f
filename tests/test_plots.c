/* test_plots.c: layout pictures (tools/lib/svg_picture.c, dhsa_layout_picture_*),
 * the routing's chunk starts (dhsa_route_boundaries), and the figures the
 * CLI writes: `dhsa bench sparse --svg`, `dhsa run --dump-layout`,
 * `dhsa bench model --svg`.
 *
 *   - The writer on hand-made layouts: one `<rect class="rg"` per range
 *     (counted, and equal to dhsa_layout_picture_count_bars), ranges less
 *     than a pixel apart joined, boundary ticks (`class="bd"`) once per
 *     distinct in-range start, the diagonal only when causal, rows placed at
 *     q_pos0, the density against a hand count, escaped titles, a
 *     well-formed document; a large picture (2^20 keys, 16384 blocks of 48
 *     ranges) stays under 200 KB and says what it left out. Adding a block
 *     changes the count (the count can fail).
 *   - dhsa_route_boundaries: FIXED chunks are multiples of `chunk`;
 *     SIMILARITY starts agree with the layout's statistics (count, min, max
 *     length) from dhsa_route on the same call; cap and NULL rules.
 *   - CLI (env DHSA_CLI; skipped when unset): bench sparse --svg at L=2048,
 *     run --dump-layout on ../shared/models/stories260K.gguf (skipped when
 *     absent) with dhsa routing and dense, bench model --svg on a
 *     gen-model tiny model; usage errors.
 * Run: make test (or DHSA_CLI=build/dhsa build/tests/test_plots).
 */
#include "dhsa.h"
#include "t.h"
#include "lib/svg.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define MODEL "../shared/models/stories260K.gguf"

static char tmpdir[256];

/* ------------------------------------------------------------- helpers --- */

static char *read_file(const char *path, long *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0, got;
    char *buf = malloc(cap);
    while (buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (cap - n < 1024) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) break;
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (buf) buf[n] = '\0';
    if (size) *size = (long)n;
    return buf;
}

static int count_str(const char *s, const char *pat) {
    int n = 0;
    for (const char *p = strstr(s, pat); p; p = strstr(p + 1, pat)) n++;
    return n;
}

/* Elements of a well-formed document (every tag closed in order, no '<'
 * inside a tag, text only inside the root), or -1. */
static int xml_check(const char *s) {
    const char *stack[256];
    size_t len[256];
    int depth = 0, elements = 0;
    for (const char *p = s; *p; p++) {
        if (*p != '<') {
            if (depth == 0 && *p != ' ' && *p != '\n') return -1;
            continue;
        }
        int closing = p[1] == '/';
        const char *name = p + 1 + closing;
        size_t nl = strcspn(name, " \t\n/>");
        const char *end = strchr(p, '>');
        if (!end || nl == 0) return -1;
        for (const char *q = name + nl; q < end; q++)
            if (*q == '<') return -1;
        if (closing) {
            if (depth == 0 || len[depth - 1] != nl || strncmp(stack[depth - 1], name, nl)) return -1;
            depth--;
        } else {
            elements++;
            if (end[-1] != '/') {
                if (depth == 256) return -1;
                stack[depth] = name;
                len[depth++] = nl;
            }
        }
        p = end;
    }
    return depth == 0 ? elements : -1;
}

static void check_doc(const char *svg, const char *what) {
    size_t n = strlen(svg);
    T_CHECK(strncmp(svg, "<svg", 4) == 0, "%s: does not start with <svg", what);
    T_CHECK(n >= 7 && strcmp(svg + n - 7, "</svg>\n") == 0, "%s: does not end with </svg>", what);
    T_CHECK(xml_check(svg) > 0, "%s: not well-formed XML", what);
}

/* Saves the picture under tmpdir/name and reads it back (caller frees). */
static char *save_read(const dhsa_layout_picture *p, const char *name, long *size) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    dhsa_status st = dhsa_layout_picture_save(p, path);
    T_CHECK(st == DHSA_OK, "%s: save: %s", name, dhsa_last_error());
    return st == DHSA_OK ? read_file(path, size) : NULL;
}

/* ------------------------------------------------------------- writer --- */

static void test_hand_made(void) {
    dhsa_ctx *ctx;
    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = 1;
    if (dhsa_ctx_create(&cp, &ctx)) {
        T_CHECK(0, "ctx: %s", dhsa_last_error());
        return;
    }
    /* 256 keys over ~670 px: 2.6 px a key, so a gap of one key stays a gap.
     * KV head 1: block qb selects the sink [0, 4), a chunk, and its own
     * rows; blocks 2 and 5 select nothing more than the diagonal. */
    const int64_t L = 256, qblk = 32;
    dhsa_layout *lay;
    T_CHECK(dhsa_layout_create(ctx, 1, 2, L, L, qblk, 4, &lay) == DHSA_OK, "layout: %s", dhsa_last_error());
    int64_t want = 0;
    for (int64_t qb = 0; qb < L / qblk; qb++) {
        int64_t r[6], n = 0, r0 = qb * qblk;
        if (qb != 2 && qb != 5 && r0 >= 64) {
            r[2 * n] = 0, r[2 * n + 1] = 4, n++;
            r[2 * n] = 20, r[2 * n + 1] = 40, n++;
        }
        r[2 * n] = r0, r[2 * n + 1] = r0 + qblk, n++;
        T_CHECK(dhsa_layout_set(lay, 0, 1, qb, r, n) == DHSA_OK, "set block %lld", (long long)qb);
        want += n;
    }
    dhsa_layout_picture *p = dhsa_layout_picture_create("a<b & \"c\" 'd'", L, L);
    T_CHECK(p != NULL, "create: %s", dhsa_last_error());
    if (!p) {
        dhsa_layout_free(lay);
        dhsa_ctx_free(ctx);
        return;
    }
    T_CHECK(dhsa_layout_picture_add_layout(p, lay, 0, 1, 0) == DHSA_OK, "add_layout: %s", dhsa_last_error());
    T_CHECK(dhsa_layout_picture_add_layout(p, lay, 0, 2, 0) == DHSA_ERR_INVALID_ARG, "KV head 2 of 2 accepted");
    T_CHECK(dhsa_layout_picture_blocks(p) == L / qblk, "blocks %lld", (long long)dhsa_layout_picture_blocks(p));
    dhsa_layout_picture_set_marks(p, 1, 4, 32);
    int64_t starts[] = {0, 40, 17, 40, 100, 300, -5};
    T_CHECK(dhsa_layout_picture_set_boundaries(p, starts, 7) == DHSA_OK, "boundaries");
    T_CHECK(dhsa_layout_picture_set_subtitle(p, "invalid \xff utf-8 <sub>") == DHSA_OK, "subtitle");
    T_CHECK(dhsa_layout_picture_count_bars(p) == want, "count_bars %lld, want %lld",
            (long long)dhsa_layout_picture_count_bars(p), (long long)want);
    char *svg = save_read(p, "hand.svg", NULL);
    if (svg) {
        check_doc(svg, "hand-made picture");
        T_CHECK(count_str(svg, "<rect class=\"rg\"") == want, "%d bars drawn, want %lld",
                count_str(svg, "<rect class=\"rg\""), (long long)want);
        T_CHECK(count_str(svg, "<line class=\"bd\"") == 3, "%d boundary ticks, want 3 (17, 40, 100)",
                count_str(svg, "<line class=\"bd\""));
        T_CHECK(count_str(svg, "class=\"diag\"") == 1 && count_str(svg, "class=\"sink\"") == 1 &&
                    count_str(svg, "class=\"local\"") == 1,
                "diagonal, sink band and local band: one each");
        T_CHECK(strstr(svg, "a&lt;b &amp; &quot;c&quot; &apos;d&apos;") && !strstr(svg, "a<b"), "title not escaped");
        T_CHECK(strstr(svg, "invalid ? utf-8 &lt;sub&gt;") != NULL, "subtitle not escaped");
        T_CHECK(strstr(svg, "8 query blocks, all drawn") != NULL, "the note does not say all blocks were drawn");
        T_CHECK(strstr(svg, "chunk boundaries (3)") != NULL, "legend does not count 3 boundaries");
    }
    free(svg);

    /* The count can fail: one more block is one more bar. */
    int64_t extra[2] = {100, 120};
    T_CHECK(dhsa_layout_picture_add_block(p, 10, 20, extra, 1) == DHSA_OK, "add_block");
    T_CHECK(dhsa_layout_picture_count_bars(p) == want + 1, "count_bars after one more block: %lld",
            (long long)dhsa_layout_picture_count_bars(p));
    /* Not causal: no diagonal, no local band. */
    dhsa_layout_picture_set_marks(p, 0, 0, 32);
    svg = save_read(p, "hand2.svg", NULL);
    if (svg) {
        check_doc(svg, "non-causal picture");
        T_CHECK(!strstr(svg, "class=\"diag\"") && !strstr(svg, "class=\"local\"") && !strstr(svg, "class=\"sink\""),
                "non-causal picture draws a diagonal or bands");
        T_CHECK(count_str(svg, "<rect class=\"rg\"") == want + 1, "bars %d", count_str(svg, "<rect class=\"rg\""));
    }
    free(svg);
    dhsa_layout_picture_free(p);
    dhsa_layout_free(lay);
    dhsa_ctx_free(ctx);
}

static void test_rules(void) {
    /* density by hand: 8 keys, causal, rows [0, 8) select [0, 2) and
     * [5, 6): selected sum_r min(2, r + 1) + [r >= 5] = 15 + 3, available
     * 1 + 2 + ... + 8 = 36 */
    dhsa_layout_picture *p = dhsa_layout_picture_create(NULL, 8, 8);
    T_CHECK(p != NULL, "create without a title");
    if (!p) return;
    int64_t r[4] = {5, 6, -3, 2}; /* unsorted, the second clipped to [0, 2) */
    T_CHECK(dhsa_layout_picture_add_block(p, 0, 8, r, 2) == DHSA_OK, "add_block: %s", dhsa_last_error());
    dhsa_layout_picture_set_marks(p, 1, 0, 0);
    double d = dhsa_layout_picture_density(p);
    T_CHECK(fabs(d - 18.0 / 36.0) < 1e-12, "causal density %.6f, want %.6f", d, 18.0 / 36.0);
    dhsa_layout_picture_set_marks(p, 0, 0, 0);
    d = dhsa_layout_picture_density(p);
    T_CHECK(fabs(d - 3.0 / 8.0) < 1e-12, "density %.6f, want 0.375", d);
    T_CHECK(dhsa_layout_picture_add_block(p, 4, 9, r, 1) == DHSA_ERR_INVALID_ARG, "a block past n_queries accepted");
    T_CHECK(dhsa_layout_picture_add_block(p, 4, 4, r, 1) == DHSA_ERR_INVALID_ARG, "an empty block accepted");
    T_CHECK(dhsa_layout_picture_add_block(p, 0, 1, NULL, 1) == DHSA_ERR_INVALID_ARG, "NULL ranges accepted");
    T_CHECK(dhsa_layout_picture_set_caps(p, 0, 100) == DHSA_ERR_INVALID_ARG, "max_rows 0 accepted");
    T_CHECK(dhsa_layout_picture_set_size(p, 100, 500) == DHSA_ERR_INVALID_ARG, "width 100 accepted");
    T_CHECK(dhsa_layout_picture_create("x", 0, 5) == NULL, "a picture of 0 queries");
    dhsa_layout_picture_free(p);

    /* An empty picture: frame and "no data". */
    p = dhsa_layout_picture_create("empty", 100, 100);
    char *svg = p ? save_read(p, "empty.svg", NULL) : NULL;
    if (svg) {
        check_doc(svg, "empty picture");
        T_CHECK(strstr(svg, "no data") && !strstr(svg, "class=\"rg\""), "empty picture draws bars or no note");
    }
    free(svg);
    char path[512];
    snprintf(path, sizeof path, "%s/no-such-dir/x.svg", tmpdir);
    T_CHECK(p && dhsa_layout_picture_save(p, path) == DHSA_ERR_IO, "writing into a missing directory worked");
    dhsa_layout_picture_free(p);

    /* Rows at q_pos0 (a second ubatch), and ranges less than a pixel apart
     * joined: 2^16 keys over ~670 px is ~100 keys a pixel. */
    const int64_t L = 1 << 16;
    p = dhsa_layout_picture_create("join", L, L);
    if (!p) return;
    int64_t near[6] = {0, 10, 20, 30, 30000, 30100}; /* 2 bars: [0, 30) and [30000, 30100) */
    T_CHECK(dhsa_layout_picture_add_block(p, 1024, 2048, near, 3) == DHSA_OK, "add");
    T_CHECK(dhsa_layout_picture_add_block(p, 0, 1024, near + 4, 1) == DHSA_OK, "add out of order");
    T_CHECK(dhsa_layout_picture_count_bars(p) == 3, "bars %lld, want 3 (two ranges joined)",
            (long long)dhsa_layout_picture_count_bars(p));
    svg = save_read(p, "join.svg", NULL);
    if (svg)
        T_CHECK(count_str(svg, "<rect class=\"rg\"") == 3, "drawn %d, want 3", count_str(svg, "<rect class=\"rg\""));
    free(svg);
    dhsa_layout_picture_free(p);

    /* add_layout with q_pos0: block rows land at q_pos0 + row. */
    dhsa_ctx *ctx;
    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = 1;
    if (dhsa_ctx_create(&cp, &ctx)) return;
    dhsa_layout *lay;
    if (dhsa_layout_create(ctx, 1, 1, 16, 64, 16, 2, &lay) == DHSA_OK) {
        int64_t rg[2] = {0, 64};
        dhsa_layout_set(lay, 0, 0, 0, rg, 1);
        p = dhsa_layout_picture_create(NULL, 64, 64);
        T_CHECK(p && dhsa_layout_picture_add_layout(p, lay, 0, 0, 48) == DHSA_OK, "add_layout at q_pos0 48");
        T_CHECK(p && dhsa_layout_picture_add_layout(p, lay, 0, 0, 49) == DHSA_ERR_INVALID_ARG,
                "rows past n_queries accepted");
        if (p) dhsa_layout_picture_set_marks(p, 1, 0, 0);
        /* rows 48..63 see 49..64 keys, all selected: density 1 */
        T_CHECK(p && fabs(dhsa_layout_picture_density(p) - 1.0) < 1e-12, "density at q_pos0: %g",
                p ? dhsa_layout_picture_density(p) : -1.0);
        dhsa_layout_picture_free(p);
        dhsa_layout_free(lay);
    }
    dhsa_ctx_free(ctx);
}

/* 2^20 keys, 16384 blocks of 48 ranges each: the file stays small and the
 * note says how many blocks were drawn. */
static void test_large(void) {
    const int64_t L = 1 << 20, qblk = 64, nb = L / qblk;
    dhsa_layout_picture *p = dhsa_layout_picture_create("large", L, L);
    if (!p) return;
    int64_t r[96];
    uint64_t x = 7;
    int ok = 1;
    for (int64_t qb = 0; qb < nb && ok; qb++) {
        for (int i = 0; i < 48; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            int64_t s = (int64_t)((x >> 20) % (uint64_t)L);
            r[2 * i] = s;
            r[2 * i + 1] = s + 64;
        }
        ok = dhsa_layout_picture_add_block(p, qb * qblk, (qb + 1) * qblk, r, 48) == DHSA_OK;
    }
    T_CHECK(ok, "adding 16384 blocks: %s", dhsa_last_error());
    int64_t all[2048];
    for (int i = 0; i < 2048; i++) all[i] = (int64_t)i * 512;
    dhsa_layout_picture_set_boundaries(p, all, 2048);
    dhsa_layout_picture_set_marks(p, 1, 64, 256);
    int64_t bars = dhsa_layout_picture_count_bars(p);
    T_CHECK(bars > 0 && bars <= 2000, "bars %lld, want (0, 2000]", (long long)bars);
    long size = 0;
    char *svg = save_read(p, "large.svg", &size);
    if (svg) {
        check_doc(svg, "large picture");
        T_CHECK(size < 180 * 1024, "large picture is %ld bytes", size);
        T_CHECK(count_str(svg, "<rect class=\"rg\"") == bars, "drawn %d, counted %lld",
                count_str(svg, "<rect class=\"rg\""), (long long)bars);
        T_CHECK(strstr(svg, "16384 query blocks: the first of every") != NULL,
                "the note does not say blocks were left out");
        T_CHECK(count_str(svg, "<line class=\"bd\"") <= 340, "%d boundary ticks on ~670 px (2 px apart)",
                count_str(svg, "<line class=\"bd\""));
    }
    free(svg);
    /* a tighter cap: fewer bars */
    T_CHECK(dhsa_layout_picture_set_caps(p, 32, 100) == DHSA_OK, "caps");
    T_CHECK(dhsa_layout_picture_count_bars(p) <= 100, "bars %lld with max_bars 100",
            (long long)dhsa_layout_picture_count_bars(p));
    dhsa_layout_picture_free(p);
    fprintf(stderr, "large picture: %lld bars, %ld bytes\n", (long long)bars, size);
}

/* ---------------------------------------------------------- boundaries --- */

static void test_route_boundaries(void) {
    dhsa_synth_params sp = dhsa_synth_default_params();
    sp.Hq = 2;
    sp.Hkv = 1;
    sp.L = 3000;
    sp.d = 32;
    size_t n = (size_t)(sp.L * sp.d);
    float *q = malloc(n * 4 * 2), *k = malloc(n * 4), *v = malloc(n * 4);
    dhsa_synth_needle nd[DHSA_SYNTH_MAX_NEEDLES];
    dhsa_ctx *ctx = NULL;
    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = 1;
    if (!q || !k || !v || dhsa_synth_generate(&sp, q, k, v, nd) || dhsa_ctx_create(&cp, &ctx)) {
        T_CHECK(0, "setup: %s", dhsa_last_error());
        free(q), free(k), free(v);
        dhsa_ctx_free(ctx);
        return;
    }
    dhsa_attn_desc a = dhsa_attn_default_desc();
    a.q = dhsa_tensor_bhld(q, DHSA_F32, 1, 2, sp.L, sp.d);
    a.k = dhsa_tensor_bhld(k, DHSA_F32, 1, 1, sp.L, sp.d);
    a.causal = 1;
    dhsa_router_params rp = dhsa_router_default_params();
    rp.boundary = DHSA_BOUNDARY_FIXED;
    rp.chunk = 64;
    int64_t cnt = -1, starts[512];
    T_CHECK(dhsa_route_boundaries(ctx, &rp, &a, 0, NULL, 0, &cnt) == DHSA_OK && cnt == (3000 + 63) / 64,
            "FIXED: sizing gives %lld, want 47", (long long)cnt);
    T_CHECK(dhsa_route_boundaries(ctx, &rp, &a, 0, starts, 10, &cnt) == DHSA_ERR_INVALID_ARG && cnt == 47,
            "cap 10 for 47 chunks accepted (n %lld)", (long long)cnt);
    T_CHECK(dhsa_route_boundaries(ctx, &rp, &a, 0, starts, 512, &cnt) == DHSA_OK, "FIXED: %s", dhsa_last_error());
    int fixed_ok = cnt == 47;
    for (int64_t i = 0; i < cnt && fixed_ok; i++) fixed_ok = starts[i] == 64 * i;
    T_CHECK(fixed_ok, "FIXED starts are not 0, 64, 128, ...");
    T_CHECK(dhsa_route_boundaries(ctx, &rp, &a, 1, starts, 512, &cnt) == DHSA_ERR_INVALID_ARG, "batch 1 of 1 accepted");

    /* SIMILARITY: the same chunks dhsa_route reports in its statistics */
    rp = dhsa_router_default_params();
    rp.dense_below = 0;
    T_CHECK(dhsa_route_boundaries(ctx, &rp, &a, 0, starts, 512, &cnt) == DHSA_OK, "SIMILARITY: %s",
            dhsa_last_error());
    dhsa_layout *lay = NULL;
    dhsa_layout_stats st;
    memset(&st, 0, sizeof st);
    if (dhsa_route(ctx, &rp, &a, &lay) == DHSA_OK) dhsa_layout_get_stats(lay, &st);
    int64_t mn = INT64_MAX, mx = 0;
    int sorted = cnt > 0 && starts[0] == 0;
    for (int64_t i = 0; i < cnt; i++) {
        int64_t len = (i + 1 < cnt ? starts[i + 1] : sp.L) - starts[i];
        if (len < mn) mn = len;
        if (len > mx) mx = len;
        if (i > 0 && starts[i] <= starts[i - 1]) sorted = 0;
    }
    T_CHECK(sorted && cnt == st.chunks && mn == st.chunk_min && mx == st.chunk_max,
            "starts: %lld chunks (%lld..%lld), route: %lld (%lld..%lld)", (long long)cnt, (long long)mn,
            (long long)mx, (long long)st.chunks, (long long)st.chunk_min, (long long)st.chunk_max);
    fprintf(stderr, "route boundaries: %lld similarity chunks at L = 3000\n", (long long)cnt);
    dhsa_layout_free(lay);
    dhsa_ctx_free(ctx);
    free(q);
    free(k);
    free(v);
}

/* ----------------------------------------------------------------- CLI --- */

/* Runs `$DHSA_CLI args` with stdout and stderr to a file read into *out
 * (caller frees); returns the exit status (-1 if it did not exit). */
static int run_cli(const char *cli, const char *args, char **out) {
    char cmd[8192], ofile[512];
    snprintf(ofile, sizeof ofile, "%s/out.txt", tmpdir);
    snprintf(cmd, sizeof cmd, "'%s' %s >'%s' 2>&1", cli, args, ofile);
    int st = system(cmd);
    *out = read_file(ofile, NULL);
    if (!*out) *out = calloc(1, 1);
    return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_cli_sparse(const char *cli) {
    char args[2048], path[512], *out;
    snprintf(path, sizeof path, "%s/sparse.svg", tmpdir);
    snprintf(args, sizeof args,
             "bench sparse --L 2048 --heads 4 --kv-heads 2 --dim 32 --dense-below 0 --sink 16 --local 64 "
             "--runs 1 --threads 1 --method dhsa,block --svg '%s' --svg-head 1",
             path);
    int rc = run_cli(cli, args, &out);
    T_CHECK(rc == 0, "bench sparse --svg: exit %d\n%s", rc, out);
    long size = 0;
    char *svg = read_file(path, &size);
    T_CHECK(svg != NULL, "bench sparse wrote no %s", path);
    if (svg) {
        check_doc(svg, "bench sparse --svg");
        int bars = count_str(svg, "<rect class=\"rg\""), ticks = count_str(svg, "<line class=\"bd\"");
        /* every one of the 32 blocks selects at least its diagonal */
        T_CHECK(bars >= 32, "bench sparse --svg: %d bars", bars);
        T_CHECK(ticks > 2, "bench sparse --svg: %d boundary ticks", ticks);
        T_CHECK(strstr(svg, "dhsa layout, L = 2048") && strstr(svg, "KV head 1 of 2") &&
                    strstr(svg, "similarity boundaries") && count_str(svg, "class=\"diag\"") == 1,
                "bench sparse --svg: title/subtitle/diagonal missing");
        T_CHECK(size < 200 * 1024, "bench sparse --svg: %ld bytes", size);
        fprintf(stderr, "bench sparse --svg: %d bars, %d ticks, %ld bytes\n", bars, ticks, size);
    }
    free(svg);
    free(out);
    /* dense as the first method: the causal staircase, one bar per block */
    snprintf(args, sizeof args,
             "bench sparse --L 1000 --heads 2 --kv-heads 1 --dim 16 --runs 1 --threads 1 --method dense --q-block 64 "
             "--svg '%s'",
             path);
    rc = run_cli(cli, args, &out);
    svg = read_file(path, NULL);
    T_CHECK(rc == 0 && svg && count_str(svg, "<rect class=\"rg\"") == 16 && !strstr(svg, "class=\"bd\"") &&
                strstr(svg, "density 1.0000"),
            "bench sparse --method dense --svg: exit %d, %d bars (want 16)\n%s", rc,
            svg ? count_str(svg, "<rect class=\"rg\"") : -1, out);
    free(svg);
    free(out);
    rc = run_cli(cli, "bench sparse --L 512 --kv-heads 2 --svg /tmp/x.svg --svg-head 2", &out);
    T_CHECK(rc == 2 && strstr(out, "--svg-head 2"), "--svg-head past the KV heads: exit %d\n%s", rc, out);
    free(out);
}

static void test_cli_run(const char *cli) {
    if (access(MODEL, R_OK) != 0) {
        T_SKIP(11, "%s absent: run --dump-layout checks skipped", MODEL);
        return;
    }
    char args[4096], path[512], prompt[512], *out;
    snprintf(prompt, sizeof prompt, "%s/prompt.txt", tmpdir);
    FILE *f = fopen(prompt, "w");
    if (!f) return;
    for (int i = 0; i < 6; i++)
        fputs("Once upon a time, there was a little girl named Lily. She liked to play in the park with her dog. "
              "One day, the sun was hot and the sky was blue. ",
              f);
    fclose(f);
    snprintf(path, sizeof path, "%s/run.svg", tmpdir);
    snprintf(args, sizeof args,
             "run -m %s -f '%s' -n 4 --temp 0 --threads 1 --attn dhsa --dense-below 0 --q-block 16 --sink 4 "
             "--local 16 --density 0.25 --ubatch 64 --dump-layout '%s' --dump-layer 1 --dump-head 3",
             MODEL, prompt, path);
    int rc = run_cli(cli, args, &out);
    T_CHECK(rc == 0 && strstr(out, "written to"), "run --dump-layout: exit %d\n%s", rc, out);
    char *svg = read_file(path, NULL);
    T_CHECK(svg != NULL, "run --dump-layout wrote no %s", path);
    int bars = 0, ticks = 0;
    if (svg) {
        check_doc(svg, "run --dump-layout");
        bars = count_str(svg, "<rect class=\"rg\"");
        ticks = count_str(svg, "<line class=\"bd\"");
        const char *t = strstr(svg, "L = ");
        long L = t ? strtol(t + 4, NULL, 10) : 0;
        T_CHECK(L > 250 && L < 400, "run --dump-layout: L = %ld, want the ~300-token prompt", L);
        /* ubatches of 64 in blocks of 16: 4 blocks each, the last shorter */
        T_CHECK(strstr(svg, "query blocks, all drawn") && bars >= (L + 15) / 16, "run --dump-layout: %d bars", bars);
        T_CHECK(ticks > 2 && strstr(svg, "layer 1, dhsa") && strstr(svg, "KV head 3 of 4") &&
                    strstr(svg, "similarity boundaries") && strstr(svg, "ubatches of 64"),
                "run --dump-layout: %d ticks, or title/subtitle wrong", ticks);
    }
    free(svg);
    free(out);
    fprintf(stderr, "run --dump-layout: %d bars, %d boundary ticks\n", bars, ticks);

    /* dense: the whole causal triangle, one range per block, density 1 */
    snprintf(args, sizeof args, "run -m %s -f '%s' -n 2 --temp 0 --threads 1 --q-block 32 --dump-layout '%s'",
             MODEL, prompt, path);
    rc = run_cli(cli, args, &out);
    svg = read_file(path, NULL);
    T_CHECK(rc == 0 && svg && strstr(svg, "density 1.0000") && strstr(svg, "dense: every causal key") &&
                !strstr(svg, "class=\"bd\"") && count_str(svg, "<rect class=\"rg\"") >= 8,
            "run --dump-layout dense: exit %d\n%s", rc, out);
    free(svg);
    free(out);

    snprintf(args, sizeof args, "run -m %s -p hi -n 1 --dump-layout '%s' --dump-layer 99", MODEL, path);
    rc = run_cli(cli, args, &out);
    T_CHECK(rc == 2 && strstr(out, "--dump-layer 99"), "--dump-layer 99: exit %d\n%s", rc, out);
    free(out);
    snprintf(args, sizeof args, "run -m %s -p hi -n 1 --dump-layout '' ", MODEL);
    rc = run_cli(cli, args, &out);
    T_CHECK(rc == 2, "--dump-layout '': exit %d\n%s", rc, out);
    free(out);
}

static void test_cli_model(const char *cli) {
    char args[2048], model[512], base[512], path[600], *out;
    snprintf(model, sizeof model, "%s/tiny.gguf", tmpdir);
    snprintf(args, sizeof args, "gen-model --preset tiny -o '%s'", model);
    int rc = run_cli(cli, args, &out);
    T_CHECK(rc == 0, "gen-model: exit %d\n%s", rc, out);
    free(out);
    if (rc) return;
    snprintf(base, sizeof base, "%s/bm.svg", tmpdir);
    snprintf(args, sizeof args,
             "bench model -m '%s' --lengths 256,512,1K --attn dense,dhsa --decode 2 --threads 1 --svg '%s'", model,
             base);
    rc = run_cli(cli, args, &out);
    T_CHECK(rc == 0 && strstr(out, "bm-time.svg") && strstr(out, "bm-mem.svg"), "bench model --svg: exit %d\n%s",
            rc, out);
    free(out);
    snprintf(path, sizeof path, "%s/bm-time.svg", tmpdir);
    char *svg = read_file(path, NULL);
    T_CHECK(svg && count_str(svg, "class=\"pt\"") == 6 && strstr(svg, "Time to first token"),
            "bm-time.svg: %d points, want 3 lengths x 2 methods", svg ? count_str(svg, "class=\"pt\"") : -1);
    if (svg) check_doc(svg, "bm-time.svg");
    free(svg);
    snprintf(path, sizeof path, "%s/bm-mem.svg", tmpdir);
    svg = read_file(path, NULL);
    T_CHECK(svg && count_str(svg, "class=\"pt\"") == 12 && strstr(svg, "dhsa: peak RSS") && strstr(svg, "dense: plan"),
            "bm-mem.svg: %d points, want 3 x 2 x (RSS, plan)", svg ? count_str(svg, "class=\"pt\"") : -1);
    if (svg) check_doc(svg, "bm-mem.svg");
    free(svg);
}

/* ---------------------------------------------------------------- main --- */

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/dhsa_plots_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        fprintf(stderr, "cannot make a temporary directory: %s\n", strerror(errno));
        return 1;
    }
    test_hand_made();
    test_rules();
    test_large();
    test_route_boundaries();
    const char *cli = getenv("DHSA_CLI");
    if (!cli || !cli[0]) {
        T_SKIP(32, "DHSA_CLI unset: CLI checks skipped (make test sets it)");
    } else if (access(cli, X_OK) != 0) {
        T_SKIP(32, "%s is not an executable: CLI checks skipped", cli);
    } else {
        test_cli_sparse(cli);
        test_cli_run(cli);
        test_cli_model(cli);
    }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return t_report("test_plots");
}
