/* svg_plot.c: the SVG plot writer (contract in svg.h).
 *
 * Layout: a title (and optional subtitle) on top, the plot area framed with
 * grid lines at the ticks, tick labels left of and under the frame, axis
 * labels outside them, the legend in the plot area's top-left corner.
 * Ticks: linear axes step by 1, 2 or 5 times a power of ten (of the unit,
 * for bytes: KiB, MiB, GiB...); log axes put ticks at powers of two for
 * bytes and for ranges of at most three decades starting at >= 1 (sizes
 * like 1024..8192), else at powers of ten, with 2 and 5 in between when the
 * range is at most two decades.
 * Tested by tests/test_memprobe.c.
 */
#include "lib/svg.h"
#include "lib/svg_internal.h"

#include "core/internal.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TICKS 64

typedef struct {
    char *name;
    int style;
    double *x, *y; /* n each, copies */
    int64_t n;
} plot_series;

struct dhsa_plot {
    char *title, *subtitle, *label[2];
    int width, height;
    int log_scale[2];
    dhsa_axis_format format[2];
    double fixed_lo[2], fixed_hi[2]; /* NaN = automatic */
    plot_series *series;
    int n_series, cap_series;
};

static const char *const palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                      "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};

/* ------------------------------------------------------------ building --- */

dhsa_plot *dhsa_plot_create(const char *title, const char *x_label, const char *y_label) {
    dhsa_plot *p = calloc(1, sizeof *p);
    if (!p) {
        dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory for a plot");
        return NULL;
    }
    int fail = 0;
    p->title = dhsa_svg_dup_text(title, &fail);
    p->label[DHSA_AXIS_X] = dhsa_svg_dup_text(x_label, &fail);
    p->label[DHSA_AXIS_Y] = dhsa_svg_dup_text(y_label, &fail);
    p->width = 720;
    p->height = 480;
    for (int a = 0; a < 2; a++) p->fixed_lo[a] = p->fixed_hi[a] = NAN;
    if (fail) {
        dhsa_plot_free(p);
        dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory for a plot");
        return NULL;
    }
    return p;
}

void dhsa_plot_free(dhsa_plot *p) {
    if (!p) return;
    for (int i = 0; i < p->n_series; i++) {
        free(p->series[i].name);
        free(p->series[i].x);
        free(p->series[i].y);
    }
    free(p->series);
    free(p->title);
    free(p->subtitle);
    free(p->label[0]);
    free(p->label[1]);
    free(p);
}

dhsa_status dhsa_plot_set_subtitle(dhsa_plot *p, const char *subtitle) {
    int fail = 0;
    char *s = dhsa_svg_dup_text(subtitle, &fail);
    if (fail) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory for a plot subtitle");
    free(p->subtitle);
    p->subtitle = s;
    return DHSA_OK;
}

dhsa_status dhsa_plot_set_size(dhsa_plot *p, int width, int height) {
    if (width < 200 || width > 10000 || height < 200 || height > 10000)
        return dhsa__fail(DHSA_ERR_INVALID_ARG,
                          "plot size %d x %d: each side must be in [200, 10000] pixels", width,
                          height);
    p->width = width;
    p->height = height;
    return DHSA_OK;
}

void dhsa_plot_set_log(dhsa_plot *p, dhsa_axis axis, int log_scale) {
    p->log_scale[axis == DHSA_AXIS_Y] = log_scale != 0;
}

void dhsa_plot_set_format(dhsa_plot *p, dhsa_axis axis, dhsa_axis_format f) {
    p->format[axis == DHSA_AXIS_Y] = f;
}

dhsa_status dhsa_plot_set_range(dhsa_plot *p, dhsa_axis axis, double lo, double hi) {
    int a = axis == DHSA_AXIS_Y;
    if (isinf(lo) || isinf(hi) || (!isnan(lo) && !isnan(hi) && !(lo < hi)))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "plot range [%g, %g]: need finite lo < hi", lo,
                          hi);
    if (p->log_scale[a] && ((!isnan(lo) && lo <= 0) || (!isnan(hi) && hi <= 0)))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "plot range [%g, %g] on a log axis: must be > 0",
                          lo, hi);
    p->fixed_lo[a] = lo;
    p->fixed_hi[a] = hi;
    return DHSA_OK;
}

dhsa_status dhsa_plot_add(dhsa_plot *p, const char *name, int style, const double *x,
                          const double *y, int64_t n) {
    if (n < 0 || (n > 0 && (!x || !y)))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "plot series: n = %lld with missing data",
                          (long long)n);
    if (!(style & (DHSA_PLOT_POINTS | DHSA_PLOT_LINE)))
        return dhsa__fail(DHSA_ERR_INVALID_ARG,
                          "plot series style %d draws nothing: give DHSA_PLOT_POINTS or "
                          "DHSA_PLOT_LINE",
                          style);
    if ((uint64_t)n > SIZE_MAX / sizeof(double) / 2)
        return dhsa__fail(DHSA_ERR_TOO_LARGE, "plot series of %lld points", (long long)n);
    if (p->n_series == p->cap_series) {
        int cap = p->cap_series ? 2 * p->cap_series : 4;
        plot_series *s = realloc(p->series, (size_t)cap * sizeof *s);
        if (!s) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory for a plot series");
        p->series = s;
        p->cap_series = cap;
    }
    plot_series s = {NULL, style, NULL, NULL, n};
    int fail = 0;
    s.name = name && name[0] ? dhsa_svg_dup_text(name, &fail) : NULL;
    size_t bytes = (size_t)(n > 0 ? n : 1) * sizeof(double);
    s.x = malloc(bytes);
    s.y = malloc(bytes);
    if (fail || !s.x || !s.y) {
        free(s.name);
        free(s.x);
        free(s.y);
        return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory for a plot series");
    }
    if (n > 0) {
        memcpy(s.x, x, (size_t)n * sizeof(double));
        memcpy(s.y, y, (size_t)n * sizeof(double));
    }
    p->series[p->n_series++] = s;
    return DHSA_OK;
}

/* ---------------------------------------------------------------- axes --- */

typedef struct {
    int log_scale;
    dhsa_axis_format format;
    double lo, hi;         /* the range drawn */
    double tick[MAX_TICKS];
    int n_ticks;
    double px0, px1;       /* pixel positions of lo and hi */
    double unit;           /* BYTES on a linear axis: every label in this unit
                              (0.2 GiB, 0.4 GiB...); 0 = each label its own */
} axis_layout;

/* A value can be placed on the axis at all (before range checks). */
static int plottable(double v, int log_scale) { return isfinite(v) && (!log_scale || v > 0); }

/* The axis coordinate: the value, or its log10. */
static double axis_t(const axis_layout *ax, double v) { return ax->log_scale ? log10(v) : v; }

static double to_px(const axis_layout *ax, double v) {
    double t0 = axis_t(ax, ax->lo), t1 = axis_t(ax, ax->hi);
    return ax->px0 + (axis_t(ax, v) - t0) / (t1 - t0) * (ax->px1 - ax->px0);
}

/* The binary unit for a byte value: 1, 1024, 1024^2, ... */
static double byte_unit(double v) {
    double u = 1.0;
    v = fabs(v);
    for (int i = 0; i < 6 && v >= 1024.0 * u; i++) u *= 1024.0;
    return u;
}

static void add_tick(axis_layout *ax, double v) {
    if (ax->n_ticks < MAX_TICKS) ax->tick[ax->n_ticks++] = v;
}

static void layout_linear(axis_layout *ax, int auto_lo, int auto_hi) {
    double unit = ax->format == DHSA_AXIS_BYTES
                      ? byte_unit(fabs(ax->lo) > fabs(ax->hi) ? ax->lo : ax->hi)
                      : 1.0;
    double step = dhsa_svg_nice_step((ax->hi - ax->lo) / unit / 6.0) * unit;
    if (ax->format == DHSA_AXIS_BYTES) ax->unit = unit;
    if (auto_lo) ax->lo = floor(ax->lo / step + 1e-9) * step;
    if (auto_hi) ax->hi = ceil(ax->hi / step - 1e-9) * step;
    double first = ceil(ax->lo / step - 1e-9);
    for (double k = first; k * step <= ax->hi + 1e-9 * step; k++) {
        double v = k * step;
        if (fabs(v) < 1e-12 * step) v = 0.0; /* no "-0" */
        add_tick(ax, v);
    }
}

static void layout_log(axis_layout *ax, int auto_lo, int auto_hi) {
    int pow2 = ax->format == DHSA_AXIS_BYTES ||
               (ax->lo >= 1.0 && log10(ax->hi / ax->lo) <= 3.0 + 1e-9);
    if (pow2) {
        if (auto_lo) ax->lo = exp2(floor(log2(ax->lo) + 1e-9));
        if (auto_hi) ax->hi = exp2(ceil(log2(ax->hi) - 1e-9));
        double k0 = ceil(log2(ax->lo) - 1e-9), k1 = floor(log2(ax->hi) + 1e-9);
        double every = ceil((k1 - k0 + 1.0) / 10.0);
        if (every < 1) every = 1;
        for (double k = k0; k <= k1; k += every) add_tick(ax, exp2(k));
        return;
    }
    if (auto_lo) ax->lo = pow(10.0, floor(log10(ax->lo) + 1e-9));
    if (auto_hi) ax->hi = pow(10.0, ceil(log10(ax->hi) - 1e-9));
    double d0 = floor(log10(ax->lo) + 1e-9), d1 = ceil(log10(ax->hi) - 1e-9);
    int fine = d1 - d0 <= 2.0;
    double every = ceil((d1 - d0 + 1.0) / 10.0);
    if (every < 1) every = 1;
    for (double d = d0; d <= d1; d += fine ? 1 : every) {
        static const double mult[] = {1.0, 2.0, 5.0};
        for (int m = 0; m < (fine ? 3 : 1); m++) {
            double v = mult[m] * pow(10.0, d);
            if (v >= ax->lo * (1 - 1e-9) && v <= ax->hi * (1 + 1e-9)) add_tick(ax, v);
        }
    }
}

/* Range and ticks of axis a from the drawable points of every series. */
static void layout_axis(const dhsa_plot *p, int a, axis_layout *ax) {
    memset(ax, 0, sizeof *ax);
    ax->log_scale = p->log_scale[a];
    ax->format = p->format[a];
    double lo = INFINITY, hi = -INFINITY;
    for (int s = 0; s < p->n_series; s++) {
        const plot_series *se = &p->series[s];
        for (int64_t i = 0; i < se->n; i++) {
            if (!plottable(se->x[i], p->log_scale[0]) || !plottable(se->y[i], p->log_scale[1]))
                continue;
            double v = a ? se->y[i] : se->x[i];
            if (v < lo) lo = v;
            if (v > hi) hi = v;
        }
    }
    int auto_lo = isnan(p->fixed_lo[a]), auto_hi = isnan(p->fixed_hi[a]);
    if (!auto_lo) lo = p->fixed_lo[a];
    if (!auto_hi) hi = p->fixed_hi[a];
    int lg = ax->log_scale;
    if (!isfinite(lo) && !isfinite(hi)) { /* no data: a unit range */
        lo = lg ? 1.0 : 0.0;
        hi = lg ? 10.0 : 1.0;
    } else if (!isfinite(lo)) {
        lo = lg ? hi / 10.0 : hi - 1.0;
    } else if (!isfinite(hi)) {
        hi = lg ? lo * 10.0 : lo + 1.0;
    }
    if (hi < lo) { /* one fixed end with all the data beyond it */
        if (auto_hi)
            hi = lg ? lo * 10.0 : lo + 1.0;
        else
            lo = lg ? hi / 10.0 : hi - 1.0;
    }
    if (lo == hi) { /* one value: widen around it */
        double w = ax->log_scale ? 2.0 : (lo != 0.0 ? fabs(lo) * 0.5 : 1.0);
        if (auto_lo) lo = ax->log_scale ? lo / w : lo - w;
        if (auto_hi) hi = ax->log_scale ? hi * w : hi + w;
    }
    ax->lo = lo;
    ax->hi = hi;
    if (ax->log_scale)
        layout_log(ax, auto_lo, auto_hi);
    else
        layout_linear(ax, auto_lo, auto_hi);
}

/* -------------------------------------------------------------- output --- */

/* A tick label: plain numbers exact while they are integers below 1e9,
 * else 4 significant digits; bytes in the axis' unit, or else in the
 * largest binary unit <= v. */
static void tick_label(char *buf, size_t cap, double v, const axis_layout *ax) {
    if (v == 0.0) {
        snprintf(buf, cap, "0");
        return;
    }
    if (ax->format == DHSA_AXIS_BYTES) {
        static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
        double u = ax->unit > 0 ? ax->unit : byte_unit(v);
        int k = (int)lround(log2(u) / 10.0);
        snprintf(buf, cap, "%.4g %s", v / u, unit[k]);
        return;
    }
    double a = fabs(v);
    if (a < 1e9 && fabs(v - round(v)) <= 1e-9 * (a > 1.0 ? a : 1.0))
        snprintf(buf, cap, "%.0f", round(v));
    else
        snprintf(buf, cap, "%.4g", v);
}

static int point_in_range(const axis_layout *ax, double v) {
    double eps = 1e-9 * (ax->log_scale ? ax->hi : (ax->hi - ax->lo));
    return v >= ax->lo - eps && v <= ax->hi + eps;
}

int64_t dhsa_plot_count_drawn(const dhsa_plot *p) {
    axis_layout ax[2];
    layout_axis(p, 0, &ax[0]);
    layout_axis(p, 1, &ax[1]);
    int64_t n = 0;
    for (int s = 0; s < p->n_series; s++) {
        const plot_series *se = &p->series[s];
        if (!(se->style & DHSA_PLOT_POINTS)) continue;
        for (int64_t i = 0; i < se->n; i++)
            n += plottable(se->x[i], ax[0].log_scale) && plottable(se->y[i], ax[1].log_scale) &&
                 point_in_range(&ax[0], se->x[i]) && point_in_range(&ax[1], se->y[i]);
    }
    return n;
}

/* One series' lines: a polyline per run of drawable points. */
static void write_lines(FILE *f, const plot_series *se, const axis_layout *ax,
                        const char *colour) {
    int open = 0;
    for (int64_t i = 0; i <= se->n; i++) {
        int ok = i < se->n && plottable(se->x[i], ax[0].log_scale) &&
                 plottable(se->y[i], ax[1].log_scale);
        if (ok && !open) {
            fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s points=\"",
                    colour, se->style & DHSA_PLOT_DASHED ? " stroke-dasharray=\"6 4\"" : "");
            open = 1;
        }
        if (ok) fprintf(f, "%.2f,%.2f ", to_px(&ax[0], se->x[i]), to_px(&ax[1], se->y[i]));
        if (!ok && open) {
            fputs("\"/>\n", f);
            open = 0;
        }
    }
}

dhsa_status dhsa_plot_write(const dhsa_plot *p, FILE *f) {
    const int W = p->width, H = p->height;
    const double top = 34.0 + (p->subtitle ? 18.0 : 0.0) + 10.0, bottom = 58.0, left = 86.0,
                 right = 24.0;
    axis_layout ax[2];
    layout_axis(p, 0, &ax[0]);
    layout_axis(p, 1, &ax[1]);
    ax[0].px0 = left;
    ax[0].px1 = W - right;
    ax[1].px0 = H - bottom; /* y grows upwards */
    ax[1].px1 = top;
    const double pw = ax[0].px1 - ax[0].px0, ph = ax[1].px0 - ax[1].px1;
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
    if (p->subtitle) {
        fprintf(f, "<text x=\"%.1f\" y=\"44\" text-anchor=\"middle\" font-size=\"11\" "
                   "fill=\"#444\">",
                W / 2.0);
        dhsa_svg_put_text(f, p->subtitle);
        fputs("</text>\n", f);
    }
    fprintf(f,
            "<defs><clipPath id=\"plot-area\"><rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" "
            "height=\"%.2f\"/></clipPath></defs>\n",
            left, top, pw, ph);

    /* Grid and tick labels. */
    fputs("<g stroke=\"#ddd\" stroke-width=\"1\">\n", f);
    for (int i = 0; i < ax[0].n_ticks; i++) {
        double x = to_px(&ax[0], ax[0].tick[i]);
        fprintf(f, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\"/>\n", x, top, x,
                top + ph);
    }
    for (int i = 0; i < ax[1].n_ticks; i++) {
        double y = to_px(&ax[1], ax[1].tick[i]);
        fprintf(f, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\"/>\n", left, y,
                left + pw, y);
    }
    fputs("</g>\n<g fill=\"#333\">\n", f);
    for (int i = 0; i < ax[0].n_ticks; i++) {
        tick_label(lab, sizeof lab, ax[0].tick[i], &ax[0]);
        fprintf(f, "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"middle\">%s</text>\n",
                to_px(&ax[0], ax[0].tick[i]), top + ph + 16.0, lab);
    }
    for (int i = 0; i < ax[1].n_ticks; i++) {
        tick_label(lab, sizeof lab, ax[1].tick[i], &ax[1]);
        fprintf(f, "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"end\">%s</text>\n", left - 6.0,
                to_px(&ax[1], ax[1].tick[i]) + 4.0, lab);
    }
    fputs("</g>\n", f);
    fprintf(f,
            "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"none\" "
            "stroke=\"#333\"/>\n",
            left, top, pw, ph);
    if (p->label[0]) {
        fprintf(f, "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"middle\">", left + pw / 2,
                (double)H - 14.0);
        dhsa_svg_put_text(f, p->label[0]);
        fputs("</text>\n", f);
    }
    if (p->label[1]) {
        fprintf(f,
                "<text x=\"16\" y=\"%.2f\" text-anchor=\"middle\" "
                "transform=\"rotate(-90 16 %.2f)\">",
                top + ph / 2, top + ph / 2);
        dhsa_svg_put_text(f, p->label[1]);
        fputs("</text>\n", f);
    }

    /* Data: lines (clipped) first, then markers on top. */
    int64_t drawn = 0;
    fputs("<g clip-path=\"url(#plot-area)\">\n", f);
    for (int s = 0; s < p->n_series; s++)
        if (p->series[s].style & DHSA_PLOT_LINE)
            write_lines(f, &p->series[s], ax, palette[s % 8]);
    fputs("</g>\n", f);
    for (int s = 0; s < p->n_series; s++) {
        const plot_series *se = &p->series[s];
        if (!(se->style & DHSA_PLOT_POINTS)) continue;
        fprintf(f, "<g fill=\"%s\">\n", palette[s % 8]);
        for (int64_t i = 0; i < se->n; i++) {
            if (!plottable(se->x[i], ax[0].log_scale) || !plottable(se->y[i], ax[1].log_scale) ||
                !point_in_range(&ax[0], se->x[i]) || !point_in_range(&ax[1], se->y[i]))
                continue;
            fprintf(f, "<circle class=\"pt\" cx=\"%.2f\" cy=\"%.2f\" r=\"3.5\"/>\n",
                    to_px(&ax[0], se->x[i]), to_px(&ax[1], se->y[i]));
            drawn++;
        }
        fputs("</g>\n", f);
    }
    int any_line = 0;
    for (int s = 0; s < p->n_series; s++) {
        const plot_series *se = &p->series[s];
        if (!(se->style & DHSA_PLOT_LINE)) continue;
        for (int64_t i = 0; i < se->n && !any_line; i++)
            any_line = plottable(se->x[i], ax[0].log_scale) && plottable(se->y[i], ax[1].log_scale);
    }
    if (!drawn && !any_line)
        fprintf(f, "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"middle\" fill=\"#888\">no data"
                   "</text>\n",
                left + pw / 2, top + ph / 2);

    /* Legend: top-left inside the plot area. */
    int n_named = 0;
    size_t longest = 0;
    for (int s = 0; s < p->n_series; s++)
        if (p->series[s].name) {
            n_named++;
            size_t len = strlen(p->series[s].name);
            if (len > longest) longest = len;
        }
    if (n_named) {
        double bx = left + 10, by = top + 10, bw = 44.0 + 6.5 * (double)longest,
               bh = 8.0 + 18.0 * n_named;
        if (bw > pw - 20) bw = pw - 20;
        fprintf(f,
                "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"white\" "
                "fill-opacity=\"0.9\" stroke=\"#bbb\"/>\n",
                bx, by, bw, bh);
        int row = 0;
        for (int s = 0; s < p->n_series; s++) {
            const plot_series *se = &p->series[s];
            if (!se->name) continue;
            double y = by + 16.0 + 18.0 * row++;
            const char *c = palette[s % 8];
            if (se->style & DHSA_PLOT_LINE)
                fprintf(f,
                        "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"%s\" "
                        "stroke-width=\"2\"%s/>\n",
                        bx + 6, y - 4, bx + 30, y - 4, c,
                        se->style & DHSA_PLOT_DASHED ? " stroke-dasharray=\"6 4\"" : "");
            if (se->style & DHSA_PLOT_POINTS)
                fprintf(f, "<circle class=\"legend\" cx=\"%.2f\" cy=\"%.2f\" r=\"3.5\" "
                           "fill=\"%s\"/>\n",
                        bx + 18, y - 4, c);
            fprintf(f, "<text x=\"%.2f\" y=\"%.2f\">", bx + 36, y);
            dhsa_svg_put_text(f, se->name);
            fputs("</text>\n", f);
        }
    }
    fputs("</svg>\n", f);
    if (ferror(f)) return dhsa__fail(DHSA_ERR_IO, "writing the SVG failed");
    return DHSA_OK;
}

static dhsa_status write_plot(const void *o, FILE *f) { return dhsa_plot_write(o, f); }

dhsa_status dhsa_plot_save(const dhsa_plot *p, const char *path) { return dhsa_svg_save(path, write_plot, p); }

