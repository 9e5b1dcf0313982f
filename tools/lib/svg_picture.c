/* svg_picture.c: the layout picture, what a sparse layout selects (contract
 * in svg.h, "Layout pictures"): per query block its selected key ranges,
 * the chunk starts, sinks, the local window and the causal diagonal. Rows
 * are kept sorted by (q0, q1) as they are added (a prefill adds them in
 * order, so insertion is a plain append); each row's ranges are sorted and
 * merged in one shared pool.
 * Tested by tests/test_plots.c.
 */
#include "lib/svg.h"
#include "lib/svg_internal.h"

#include "core/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t q0, q1;  /* query positions [q0, q1) */
    int64_t off, n;  /* its ranges: pool[2 * off .. 2 * (off + n)) */
} picture_row;

struct dhsa_layout_picture {
    char *title, *subtitle;
    int64_t n_queries, n_keys;
    int width, height;
    int64_t max_rows, max_bars;
    int causal;
    int64_t sink, local;
    int64_t *bounds; /* sorted, unique, in [1, n_keys) */
    int64_t n_bounds;
    picture_row *rows;
    int64_t n_rows, cap_rows;
    int64_t *pool; /* pairs */
    int64_t n_pool, cap_pool;
};

dhsa_layout_picture *dhsa_layout_picture_create(const char *title, int64_t n_queries,
                                                int64_t n_keys) {
    if (n_queries < 1 || n_keys < 1) {
        dhsa__fail(DHSA_ERR_INVALID_ARG, "layout picture of %lld queries and %lld keys: need >= 1",
                   (long long)n_queries, (long long)n_keys);
        return NULL;
    }
    dhsa_layout_picture *p = calloc(1, sizeof *p);
    int fail = 0;
    if (p) p->title = dhsa_svg_dup_text(title, &fail);
    if (!p || fail) {
        dhsa_layout_picture_free(p);
        dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory for a layout picture");
        return NULL;
    }
    p->n_queries = n_queries;
    p->n_keys = n_keys;
    p->width = 760;
    p->height = 820;
    p->max_rows = 128;
    p->max_bars = 2000;
    return p;
}

void dhsa_layout_picture_free(dhsa_layout_picture *p) {
    if (!p) return;
    free(p->title);
    free(p->subtitle);
    free(p->bounds);
    free(p->rows);
    free(p->pool);
    free(p);
}

dhsa_status dhsa_layout_picture_set_title(dhsa_layout_picture *p, const char *title) {
    int fail = 0;
    char *s = dhsa_svg_dup_text(title, &fail);
    if (fail) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory for a picture title");
    free(p->title);
    p->title = s;
    return DHSA_OK;
}

dhsa_status dhsa_layout_picture_set_subtitle(dhsa_layout_picture *p, const char *subtitle) {
    int fail = 0;
    char *s = dhsa_svg_dup_text(subtitle, &fail);
    if (fail) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory for a picture subtitle");
    free(p->subtitle);
    p->subtitle = s;
    return DHSA_OK;
}

dhsa_status dhsa_layout_picture_set_size(dhsa_layout_picture *p, int width, int height) {
    if (width < 200 || width > 10000 || height < 200 || height > 10000)
        return dhsa__fail(DHSA_ERR_INVALID_ARG,
                          "picture size %d x %d: each side must be in [200, 10000] pixels", width,
                          height);
    p->width = width;
    p->height = height;
    return DHSA_OK;
}

dhsa_status dhsa_layout_picture_set_caps(dhsa_layout_picture *p, int64_t max_rows,
                                         int64_t max_bars) {
    if (max_rows < 1 || max_bars < 16)
        return dhsa__fail(DHSA_ERR_INVALID_ARG,
                          "picture caps: max_rows %lld (>= 1), max_bars %lld (>= 16)",
                          (long long)max_rows, (long long)max_bars);
    p->max_rows = max_rows;
    p->max_bars = max_bars;
    return DHSA_OK;
}

void dhsa_layout_picture_set_marks(dhsa_layout_picture *p, int causal, int64_t sink,
                                   int64_t local) {
    p->causal = causal != 0;
    p->sink = sink > 0 ? sink : 0;
    p->local = local > 0 ? local : 0;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

dhsa_status dhsa_layout_picture_set_boundaries(dhsa_layout_picture *p, const int64_t *starts,
                                               int64_t n) {
    if (n < 0 || (n > 0 && !starts))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "picture boundaries: n = %lld with no data",
                          (long long)n);
    if ((uint64_t)n > SIZE_MAX / sizeof(int64_t) / 2)
        return dhsa__fail(DHSA_ERR_TOO_LARGE, "%lld boundaries", (long long)n);
    int64_t *b = malloc((size_t)(n > 0 ? n : 1) * sizeof *b);
    if (!b) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory for picture boundaries");
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++)
        if (starts[i] >= 1 && starts[i] < p->n_keys) b[m++] = starts[i];
    if (m > 1) qsort(b, (size_t)m, sizeof *b, cmp_i64);
    int64_t u = 0;
    for (int64_t i = 0; i < m; i++)
        if (u == 0 || b[i] != b[u - 1]) b[u++] = b[i];
    free(p->bounds);
    p->bounds = b;
    p->n_bounds = u;
    return DHSA_OK;
}

dhsa_status dhsa_layout_picture_add_block(dhsa_layout_picture *p, int64_t q0, int64_t q1,
                                          const int64_t *ranges, int64_t n) {
    if (q0 < 0 || q1 <= q0 || q1 > p->n_queries)
        return dhsa__fail(DHSA_ERR_INVALID_ARG,
                          "picture block [%lld, %lld) is not a non-empty part of [0, %lld)",
                          (long long)q0, (long long)q1, (long long)p->n_queries);
    if (n < 0 || (n > 0 && !ranges))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "picture block: n = %lld with no ranges",
                          (long long)n);
    if (n > ((int64_t)1 << 40) || p->n_pool > ((int64_t)1 << 40))
        return dhsa__fail(DHSA_ERR_TOO_LARGE, "a picture of more than 2^40 ranges");
    if (p->n_rows == p->cap_rows) {
        int64_t cap = p->cap_rows ? 2 * p->cap_rows : 64;
        picture_row *r = realloc(p->rows, (size_t)cap * sizeof *r);
        if (!r) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory for picture rows");
        p->rows = r;
        p->cap_rows = cap;
    }
    if (p->n_pool + n > p->cap_pool) {
        int64_t cap = p->cap_pool ? 2 * p->cap_pool : 1024;
        while (cap < p->n_pool + n) cap *= 2;
        int64_t *r = realloc(p->pool, (size_t)cap * 2 * sizeof *r);
        if (!r) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory for picture ranges");
        p->pool = r;
        p->cap_pool = cap;
    }
    int64_t *dst = p->pool + 2 * p->n_pool, m = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t s = ranges[2 * i] > 0 ? ranges[2 * i] : 0;
        int64_t e = ranges[2 * i + 1] < p->n_keys ? ranges[2 * i + 1] : p->n_keys;
        if (e <= s) continue;
        dst[2 * m] = s;
        dst[2 * m + 1] = e;
        m++;
    }
    if (m > 1) qsort(dst, (size_t)m, 2 * sizeof *dst, cmp_i64); /* by start */
    int64_t u = 0;
    for (int64_t i = 0; i < m; i++) { /* merge overlapping or adjacent */
        if (u > 0 && dst[2 * i] <= dst[2 * u - 1]) {
            if (dst[2 * i + 1] > dst[2 * u - 1]) dst[2 * u - 1] = dst[2 * i + 1];
        } else {
            dst[2 * u] = dst[2 * i];
            dst[2 * u + 1] = dst[2 * i + 1];
            u++;
        }
    }
    picture_row row = {q0, q1, p->n_pool, u};
    p->n_pool += u;
    /* insert sorted by (q0, q1): an append when rows come in order */
    int64_t at = p->n_rows;
    while (at > 0 && (p->rows[at - 1].q0 > q0 || (p->rows[at - 1].q0 == q0 && p->rows[at - 1].q1 > q1)))
        at--;
    memmove(p->rows + at + 1, p->rows + at, (size_t)(p->n_rows - at) * sizeof *p->rows);
    p->rows[at] = row;
    p->n_rows++;
    return DHSA_OK;
}

dhsa_status dhsa_layout_picture_add_layout(dhsa_layout_picture *p, const dhsa_layout *layout,
                                           int64_t b, int64_t g, int64_t q_pos0) {
    dhsa_layout_stats st;
    dhsa_status s = dhsa_layout_get_stats(layout, &st);
    if (s) return s;
    if (b < 0 || b >= st.B || g < 0 || g >= st.Hkv)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "picture of (b=%lld, g=%lld): the layout has B=%lld, Hkv=%lld",
                          (long long)b, (long long)g, (long long)st.B, (long long)st.Hkv);
    for (int64_t qb = 0; qb < st.n_blocks; qb++) {
        const int64_t *r;
        int64_t n;
        if ((s = dhsa_layout_get(layout, b, g, qb, &r, &n))) return s;
        int64_t r0 = qb * st.q_block, r1 = r0 + st.q_block < st.Lq ? r0 + st.q_block : st.Lq;
        if ((s = dhsa_layout_picture_add_block(p, q_pos0 + r0, q_pos0 + r1, r, n))) return s;
    }
    return DHSA_OK;
}

int64_t dhsa_layout_picture_blocks(const dhsa_layout_picture *p) { return p->n_rows; }

double dhsa_layout_picture_density(const dhsa_layout_picture *p) {
    double sel = 0, avail = 0;
    for (int64_t i = 0; i < p->n_rows; i++) {
        const picture_row *r = &p->rows[i];
        const int64_t *rg = p->pool + 2 * r->off;
        for (int64_t q = r->q0; q < r->q1; q++) {
            int64_t lim = p->causal ? (q + 1 < p->n_keys ? q + 1 : p->n_keys) : p->n_keys;
            avail += (double)lim;
            for (int64_t k = 0; k < r->n && rg[2 * k] < lim; k++)
                sel += (double)((rg[2 * k + 1] < lim ? rg[2 * k + 1] : lim) - rg[2 * k]);
        }
    }
    return avail > 0 ? sel / avail : 1.0;
}

/* Where things go: the plot area and the pixel scale. */
typedef struct {
    double left, top, pw, ph;
} picture_frame;

/* The subtitle cut into at most 3 lines of about (width - 20) / 5.6
 * characters (11 px text), at "; " where it can: line i is
 * [start[i], start[i] + len[i]). Returns the line count (0 without one). */
static int picture_subtitle_lines(const dhsa_layout_picture *p, size_t start[3], size_t len[3]) {
    if (!p->subtitle) return 0;
    const char *s = p->subtitle;
    size_t n = strlen(s), fit = (size_t)((p->width - 20) / 5.6), at = 0;
    int lines = 0;
    while (at < n && lines < 3) {
        size_t end = n;
        if (n - at > fit && lines < 2) {
            end = at + fit;
            size_t cut = 0;
            for (size_t i = at; i + 1 < at + fit; i++) /* the last "; " that fits */
                if (s[i] == ';' && s[i + 1] == ' ') cut = i + 1;
            if (cut) end = cut;
        }
        start[lines] = at;
        len[lines++] = end - at;
        at = end;
        while (at < n && s[at] == ' ') at++;
    }
    return lines;
}

static picture_frame picture_geometry(const dhsa_layout_picture *p) {
    picture_frame g;
    size_t st[3], ln[3];
    g.left = 72.0;
    g.top = 34.0 + 15.0 * picture_subtitle_lines(p, st, ln) + 18.0 /* note line */ + 22.0 /* boundary strip */;
    g.pw = p->width - g.left - 20.0;
    g.ph = p->height - g.top - 64.0; /* tick labels, axis label, legend */
    return g;
}

static double pic_x(const dhsa_layout_picture *p, const picture_frame *g, double key) {
    return g->left + key / (double)p->n_keys * g->pw;
}

static double pic_y(const dhsa_layout_picture *p, const picture_frame *g, double q) {
    return g->top + q / (double)p->n_queries * g->ph;
}

/* The bars of one row: ranges whose gap is under a pixel join. Writes them
 * (class rg) when f is not NULL, spanning y0..y1; returns their count. */
static int64_t picture_row_bars(const dhsa_layout_picture *p, const picture_frame *g,
                                const picture_row *r, double y0, double y1, FILE *f) {
    const int64_t *rg = p->pool + 2 * r->off;
    int64_t bars = 0;
    for (int64_t i = 0; i < r->n;) {
        double x0 = pic_x(p, g, (double)rg[2 * i]), x1 = pic_x(p, g, (double)rg[2 * i + 1]);
        int64_t j = i + 1;
        while (j < r->n && pic_x(p, g, (double)rg[2 * j]) - x1 < 1.0) {
            x1 = pic_x(p, g, (double)rg[2 * j + 1]);
            j++;
        }
        if (f) {
            double w = x1 - x0 < 0.5 ? 0.5 : x1 - x0, h = y1 - y0 < 0.5 ? 0.5 : y1 - y0;
            fprintf(f, "<rect class=\"rg\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"/>\n",
                    x0, y0, w, h);
        }
        bars++;
        i = j;
    }
    return bars;
}

/* The sampling step: the smallest k such that every k-th row (from the
 * first) keeps within max_rows and max_bars. */
static int64_t picture_step(const dhsa_layout_picture *p, const picture_frame *g) {
    int64_t k = (p->n_rows + p->max_rows - 1) / p->max_rows;
    if (k < 1) k = 1;
    for (;;) {
        int64_t bars = 0;
        for (int64_t i = 0; i < p->n_rows; i += k) bars += picture_row_bars(p, g, &p->rows[i], 0, 0, NULL);
        if (bars <= p->max_bars || k >= p->n_rows) return k;
        int64_t next = (int64_t)ceil((double)k * (double)bars / (double)p->max_bars);
        k = next > k ? next : k + 1;
    }
}

int64_t dhsa_layout_picture_count_bars(const dhsa_layout_picture *p) {
    picture_frame g = picture_geometry(p);
    int64_t k = picture_step(p, &g), bars = 0;
    for (int64_t i = 0; i < p->n_rows; i += k) bars += picture_row_bars(p, &g, &p->rows[i], 0, 0, NULL);
    return bars;
}

/* An axis tick step for [0, n]: powers of two from 2048 up (8K, 16K, ...),
 * else 1, 2 or 5 times a power of ten. */
static int64_t picture_tick_step(int64_t n) {
    if (n >= 2048) {
        int64_t s = 1;
        while (s * 8 <= n) s *= 2;
        return s;
    }
    double s = dhsa_svg_nice_step((double)n / 6.0);
    return s < 1.0 ? 1 : (int64_t)s;
}

static void picture_tick_label(char *buf, size_t cap, int64_t v) {
    if (v >= 1024 && v % 1024 == 0)
        snprintf(buf, cap, "%lldK", (long long)(v / 1024));
    else
        snprintf(buf, cap, "%lld", (long long)v);
}

/* One legend entry at (*x, y): a swatch (0 box, 1 tick, 2 dashed line) and
 * its text; moves *x past it (text width guessed at 5.9 px a character). */
static void picture_legend(FILE *f, double *x, double y, int kind, const char *colour, const char *text) {
    if (kind == 0)
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"14\" height=\"10\" fill=\"%s\"/>\n", *x, y - 9, colour);
    else if (kind == 1)
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\"/>\n", *x + 7, y - 10, *x + 7, y,
                colour);
    else
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-dasharray=\"5 3\"/>\n",
                *x, y - 4, *x + 14, y - 4, colour);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\">", *x + 18, y);
    dhsa_svg_put_text(f, text);
    fputs("</text>\n", f);
    *x += 18 + 5.9 * (double)strlen(text) + 14;
}

dhsa_status dhsa_layout_picture_write(const dhsa_layout_picture *p, FILE *f) {
    const int W = p->width, H = p->height;
    const picture_frame g = picture_geometry(p);
    const double bottom = g.top + g.ph, right = g.left + g.pw;
    int64_t k = picture_step(p, &g);
    char lab[64];

    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n",
            W, H, W, H);
    fprintf(f, "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", W, H);
    if (p->title) {
        fprintf(f, "<text x=\"%.1f\" y=\"24\" text-anchor=\"middle\" font-size=\"15\" "
                   "font-weight=\"bold\">",
                W / 2.0);
        dhsa_svg_put_text(f, p->title);
        fputs("</text>\n", f);
    }
    size_t sub_at[3], sub_len[3];
    int sub_lines = picture_subtitle_lines(p, sub_at, sub_len);
    for (int i = 0; i < sub_lines; i++) {
        char *line = malloc(sub_len[i] + 1);
        if (!line) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory writing a picture");
        memcpy(line, p->subtitle + sub_at[i], sub_len[i]);
        line[sub_len[i]] = '\0';
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"11\" fill=\"#444\">", W / 2.0,
                44.0 + 15.0 * i);
        dhsa_svg_put_text(f, line);
        fputs("</text>\n", f);
        free(line);
    }
    /* the note: what was left out to keep the file small */
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"11\" fill=\"#666\">",
            W / 2.0, 44.0 + 15.0 * sub_lines + 2.0);
    if (k > 1)
        fprintf(f, "%lld query blocks: the first of every %lld drawn over the %lld rows; ", (long long)p->n_rows,
                (long long)k, (long long)k);
    else
        fprintf(f, "%lld query blocks, all drawn; ", (long long)p->n_rows);
    fputs("ranges less than a pixel apart drawn as one bar</text>\n", f);
    fprintf(f,
            "<defs><clipPath id=\"layout-area\"><rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" "
            "height=\"%.1f\"/></clipPath></defs>\n",
            g.left, g.top, g.pw, g.ph);

    /* axes: ticks and labels */
    fputs("<g stroke=\"#eee\" stroke-width=\"1\">\n", f);
    int64_t sx = picture_tick_step(p->n_keys), sy = picture_tick_step(p->n_queries);
    for (int64_t v = 0; v <= p->n_keys; v += sx)
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", pic_x(p, &g, (double)v), g.top,
                pic_x(p, &g, (double)v), bottom);
    for (int64_t v = 0; v <= p->n_queries; v += sy)
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", g.left, pic_y(p, &g, (double)v),
                right, pic_y(p, &g, (double)v));
    fputs("</g>\n<g fill=\"#333\">\n", f);
    for (int64_t v = 0; v <= p->n_keys; v += sx) {
        picture_tick_label(lab, sizeof lab, v);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", pic_x(p, &g, (double)v),
                bottom + 16.0, lab);
    }
    for (int64_t v = 0; v <= p->n_queries; v += sy) {
        picture_tick_label(lab, sizeof lab, v);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", g.left - 6.0,
                pic_y(p, &g, (double)v) + 4.0, lab);
    }
    fputs("</g>\n", f);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">key position</text>\n", g.left + g.pw / 2,
            bottom + 34.0);
    fprintf(f,
            "<text x=\"16\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 16 %.1f)\">query "
            "position</text>\n",
            g.top + g.ph / 2, g.top + g.ph / 2);

    /* bands under the bars: sinks, and the local window along the diagonal */
    fputs("<g clip-path=\"url(#layout-area)\">\n", f);
    if (p->sink > 0)
        fprintf(f,
                "<rect class=\"sink\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#f4a460\" "
                "fill-opacity=\"0.55\"/>\n",
                g.left, g.top, pic_x(p, &g, (double)p->sink) - g.left, g.ph);
    if (p->causal && p->local > 0) {
        double n = (double)p->n_queries, L = (double)p->local;
        fprintf(f,
                "<polygon class=\"local\" fill=\"#8fd18f\" fill-opacity=\"0.55\" "
                "points=\"%.1f,%.1f %.1f,%.1f %.1f,%.1f ",
                pic_x(p, &g, 0), pic_y(p, &g, 0), pic_x(p, &g, n + 1), pic_y(p, &g, n), pic_x(p, &g, n - L),
                pic_y(p, &g, n));
        if (L < n) fprintf(f, "%.1f,%.1f", pic_x(p, &g, 0), pic_y(p, &g, L));
        fputs("\"/>\n", f);
    }
    /* faint boundary lines through the plot, one path */
    if (p->n_bounds) {
        fputs("<path stroke=\"#888\" stroke-width=\"0.5\" stroke-opacity=\"0.35\" d=\"", f);
        double last = -10;
        for (int64_t i = 0; i < p->n_bounds; i++) {
            double x = pic_x(p, &g, (double)p->bounds[i]);
            if (x - last < 2.0) continue;
            fprintf(f, "M%.1f %.1fV%.1f", x, g.top, bottom);
            last = x;
        }
        fputs("\"/>\n", f);
    }
    fputs("</g>\n<g fill=\"#1f77b4\" fill-opacity=\"0.6\">\n", f);
    for (int64_t i = 0; i < p->n_rows; i += k) {
        int64_t last = i + k - 1 < p->n_rows ? i + k - 1 : p->n_rows - 1;
        int64_t q1 = p->rows[i].q1;
        for (int64_t j = i + 1; j <= last; j++)
            if (p->rows[j].q1 > q1) q1 = p->rows[j].q1;
        picture_row_bars(p, &g, &p->rows[i], pic_y(p, &g, (double)p->rows[i].q0), pic_y(p, &g, (double)q1), f);
    }
    fputs("</g>\n", f);
    if (p->causal) {
        double n = (double)(p->n_queries < p->n_keys ? p->n_queries : p->n_keys);
        fprintf(f,
                "<line class=\"diag\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#b22\" "
                "stroke-width=\"1\" stroke-dasharray=\"5 3\"/>\n",
                pic_x(p, &g, 0), pic_y(p, &g, 0), pic_x(p, &g, n), pic_y(p, &g, n));
    }
    if (p->n_rows == 0)
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#888\">no data</text>\n",
                g.left + g.pw / 2, g.top + g.ph / 2);
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#333\"/>\n",
            g.left, g.top, g.pw, g.ph);

    /* boundary ticks in the strip above the plot */
    if (p->n_bounds) {
        fputs("<g stroke=\"#333\" stroke-width=\"1\">\n", f);
        double last = -10;
        for (int64_t i = 0; i < p->n_bounds; i++) {
            double x = pic_x(p, &g, (double)p->bounds[i]);
            if (x - last < 2.0) continue;
            fprintf(f, "<line class=\"bd\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", x, g.top - 12.0,
                    x, g.top - 2.0);
            last = x;
        }
        fputs("</g>\n", f);
    }

    /* legend: one line under the axis label */
    double lx = 16.0, ly = (double)H - 10.0;
    picture_legend(f, &lx, ly, 0, "#79add2", "selected key ranges");
    if (p->sink > 0) {
        snprintf(lab, sizeof lab, "sinks (%lld keys)", (long long)p->sink);
        picture_legend(f, &lx, ly, 0, "#f8cba2", lab);
    }
    if (p->causal && p->local > 0) {
        snprintf(lab, sizeof lab, "local window (%lld keys)", (long long)p->local);
        picture_legend(f, &lx, ly, 0, "#c0e5c0", lab);
    }
    if (p->n_bounds) {
        snprintf(lab, sizeof lab, "chunk boundaries (%lld)", (long long)p->n_bounds);
        picture_legend(f, &lx, ly, 1, "#333", lab);
    }
    if (p->causal) picture_legend(f, &lx, ly, 2, "#b22", "causal diagonal");
    fputs("</svg>\n", f);
    if (ferror(f)) return dhsa__fail(DHSA_ERR_IO, "writing the SVG failed");
    return DHSA_OK;
}

static dhsa_status write_picture(const void *o, FILE *f) { return dhsa_layout_picture_write(o, f); }

dhsa_status dhsa_layout_picture_save(const dhsa_layout_picture *p, const char *path) { return dhsa_svg_save(path, write_picture, p); }
