/* svg.c: the SVG plot writer (contract in svg.h).
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

#include "core/internal.h"
#include "util/outfile.h"

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

/* A copy of s, or NULL for NULL. Sets *fail on allocation failure. */
static char *dup_text(const char *s, int *fail) {
    if (!s) return NULL;
    size_t n = strlen(s);
    char *d = malloc(n + 1);
    if (!d) {
        *fail = 1;
        return NULL;
    }
    memcpy(d, s, n + 1);
    return d;
}

dhsa_plot *dhsa_plot_create(const char *title, const char *x_label, const char *y_label) {
    dhsa_plot *p = calloc(1, sizeof *p);
    if (!p) {
        dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory for a plot");
        return NULL;
    }
    int fail = 0;
    p->title = dup_text(title, &fail);
    p->label[DHSA_AXIS_X] = dup_text(x_label, &fail);
    p->label[DHSA_AXIS_Y] = dup_text(y_label, &fail);
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
    char *s = dup_text(subtitle, &fail);
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
    s.name = name && name[0] ? dup_text(name, &fail) : NULL;
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

/* The smallest of 1, 2, 5 times a power of ten that is >= v (v > 0). */
static double nice_step(double v) {
    double p10 = pow(10.0, floor(log10(v)));
    double m = v / p10;
    return (m <= 1.0 + 1e-9 ? 1.0 : m <= 2.0 + 1e-9 ? 2.0 : m <= 5.0 + 1e-9 ? 5.0 : 10.0) * p10;
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
    double step = nice_step((ax->hi - ax->lo) / unit / 6.0) * unit;
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

/* Length of a valid UTF-8 sequence at s (1..4), or 0 if it is not one. */
static int utf8_len(const unsigned char *s) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    int n;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else
        return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (int i = 2; i < n; i++)
        if (s[i] < 0x80 || s[i] > 0xBF) return 0;
    return n;
}

/* Text as XML character data: markup characters escaped, control
 * characters and invalid UTF-8 bytes replaced by '?'. */
static void put_text(FILE *f, const char *text) {
    const unsigned char *s = (const unsigned char *)text;
    while (*s) {
        unsigned c = *s;
        if (c == '&') fputs("&amp;", f);
        else if (c == '<') fputs("&lt;", f);
        else if (c == '>') fputs("&gt;", f);
        else if (c == '"') fputs("&quot;", f);
        else if (c == '\'') fputs("&apos;", f);
        else if (c < 0x20 && c != '\t') fputc('?', f);
        else if (c >= 0x80) {
            int n = utf8_len(s);
            if (n == 0) {
                fputc('?', f);
            } else {
                fwrite(s, 1, (size_t)n, f);
                s += n - 1;
            }
        } else
            fputc((int)c, f);
        s++;
    }
}

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
        put_text(f, p->title);
        fputs("</text>\n", f);
    }
    if (p->subtitle) {
        fprintf(f, "<text x=\"%.1f\" y=\"44\" text-anchor=\"middle\" font-size=\"11\" "
                   "fill=\"#444\">",
                W / 2.0);
        put_text(f, p->subtitle);
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
        put_text(f, p->label[0]);
        fputs("</text>\n", f);
    }
    if (p->label[1]) {
        fprintf(f,
                "<text x=\"16\" y=\"%.2f\" text-anchor=\"middle\" "
                "transform=\"rotate(-90 16 %.2f)\">",
                top + ph / 2, top + ph / 2);
        put_text(f, p->label[1]);
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
            put_text(f, se->name);
            fputs("</text>\n", f);
        }
    }
    fputs("</svg>\n", f);
    if (ferror(f)) return dhsa__fail(DHSA_ERR_IO, "writing the SVG failed");
    return DHSA_OK;
}

/* Writes obj through a temporary renamed into place (util/outfile.h); the
 * error names the path. The three figure kinds save through it. */
typedef dhsa_status (*svg_writer)(const void *obj, FILE *f);

typedef struct {
    svg_writer write;
    const void *obj;
} svg_job;

static dhsa_status run_svg_job(void *user, FILE *f) {
    const svg_job *j = user;
    return j->write(j->obj, f);
}

static dhsa_status save_svg(const char *path, svg_writer write, const void *obj) {
    svg_job j = {write, obj};
    return dhsa_outfile_write(path, run_svg_job, &j);
}

static dhsa_status write_plot(const void *o, FILE *f) { return dhsa_plot_write(o, f); }
static dhsa_status write_picture(const void *o, FILE *f) { return dhsa_layout_picture_write(o, f); }
static dhsa_status write_heatmap(const void *o, FILE *f) { return dhsa_heatmap_write(o, f); }

dhsa_status dhsa_plot_save(const dhsa_plot *p, const char *path) { return save_svg(path, write_plot, p); }

/* ---------------------------------------------------- layout pictures --- */
/* Contract in svg.h. Rows are kept sorted by (q0, q1) as they are added (a
 * prefill adds them in order, so insertion is a plain append); each row's
 * ranges are sorted and merged in one shared pool. */

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
    if (p) p->title = dup_text(title, &fail);
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
    char *s = dup_text(title, &fail);
    if (fail) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory for a picture title");
    free(p->title);
    p->title = s;
    return DHSA_OK;
}

dhsa_status dhsa_layout_picture_set_subtitle(dhsa_layout_picture *p, const char *subtitle) {
    int fail = 0;
    char *s = dup_text(subtitle, &fail);
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
    double s = nice_step((double)n / 6.0);
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
    put_text(f, text);
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
        put_text(f, p->title);
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
        put_text(f, line);
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

dhsa_status dhsa_layout_picture_save(const dhsa_layout_picture *p, const char *path) { return save_svg(path, write_picture, p); }

/* ------------------------------------------------------------ heat maps --- */

#define HEAT_MAX_PANELS 16
#define HEAT_CELL_W 56.0
#define HEAT_CELL_H 30.0

struct dhsa_heatmap {
    char *title, *subtitle, *label[2], *scale_label;
    int nx, ny, n_panels, digits;
    char **tick[2];  /* nx column labels, ny row labels (NULL = index) */
    double lo, hi;
    char *panel_name[HEAT_MAX_PANELS];
    double *values[HEAT_MAX_PANELS]; /* [ny][nx] */
};

dhsa_heatmap *dhsa_heatmap_create(const char *title, const char *x_label, const char *y_label, int nx,
                                  int ny) {
    if (nx < 1 || nx > 256 || ny < 1 || ny > 256) {
        dhsa__fail(DHSA_ERR_INVALID_ARG, "heat map of %d x %d cells: each side must be in [1, 256]", nx, ny);
        return NULL;
    }
    dhsa_heatmap *h = calloc(1, sizeof *h);
    if (!h) {
        dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory for a heat map");
        return NULL;
    }
    int fail = 0;
    h->title = dup_text(title, &fail);
    h->label[0] = dup_text(x_label, &fail);
    h->label[1] = dup_text(y_label, &fail);
    h->nx = nx;
    h->ny = ny;
    h->lo = 0;
    h->hi = 1;
    h->digits = 2;
    if (fail) {
        dhsa_heatmap_free(h);
        dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory for a heat map");
        return NULL;
    }
    return h;
}

static void free_labels(char **l, int n) {
    if (!l) return;
    for (int i = 0; i < n; i++) free(l[i]);
    free(l);
}

void dhsa_heatmap_free(dhsa_heatmap *h) {
    if (!h) return;
    free(h->title);
    free(h->subtitle);
    free(h->label[0]);
    free(h->label[1]);
    free(h->scale_label);
    free_labels(h->tick[0], h->nx);
    free_labels(h->tick[1], h->ny);
    for (int i = 0; i < h->n_panels; i++) {
        free(h->panel_name[i]);
        free(h->values[i]);
    }
    free(h);
}

dhsa_status dhsa_heatmap_set_subtitle(dhsa_heatmap *h, const char *subtitle) {
    int fail = 0;
    char *s = dup_text(subtitle, &fail);
    if (fail) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory for a heat map subtitle");
    free(h->subtitle);
    h->subtitle = s;
    return DHSA_OK;
}

dhsa_status dhsa_heatmap_set_labels(dhsa_heatmap *h, dhsa_axis axis, const char *const *labels) {
    int a = axis == DHSA_AXIS_Y, n = a ? h->ny : h->nx, fail = 0;
    char **l = calloc((size_t)n, sizeof *l);
    if (!l) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory for heat map labels");
    for (int i = 0; i < n; i++) l[i] = dup_text(labels ? labels[i] : NULL, &fail);
    if (fail) {
        free_labels(l, n);
        return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory for heat map labels");
    }
    free_labels(h->tick[a], n);
    h->tick[a] = l;
    return DHSA_OK;
}

dhsa_status dhsa_heatmap_set_scale(dhsa_heatmap *h, double lo, double hi, const char *label) {
    if (!isfinite(lo) || !isfinite(hi) || !(lo < hi))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "heat map scale [%g, %g]: need finite lo < hi", lo, hi);
    int fail = 0;
    char *s = dup_text(label, &fail);
    if (fail) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory for a heat map label");
    free(h->scale_label);
    h->scale_label = s;
    h->lo = lo;
    h->hi = hi;
    return DHSA_OK;
}

void dhsa_heatmap_set_digits(dhsa_heatmap *h, int digits) { h->digits = digits > 9 ? 9 : digits; }

dhsa_status dhsa_heatmap_add_panel(dhsa_heatmap *h, const char *name, const double *values) {
    if (h->n_panels >= HEAT_MAX_PANELS)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "a heat map holds at most %d panels", HEAT_MAX_PANELS);
    int fail = 0;
    char *n = dup_text(name, &fail);
    size_t cells = (size_t)h->nx * (size_t)h->ny;
    double *v = malloc(cells * sizeof *v);
    if (fail || !v) {
        free(n);
        free(v);
        return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory for a heat map panel");
    }
    memcpy(v, values, cells * sizeof *v);
    h->panel_name[h->n_panels] = n;
    h->values[h->n_panels++] = v;
    return DHSA_OK;
}

int64_t dhsa_heatmap_count_cells(const dhsa_heatmap *h) {
    int64_t n = 0;
    for (int p = 0; p < h->n_panels; p++)
        for (int i = 0; i < h->nx * h->ny; i++) n += isfinite(h->values[p][i]) != 0;
    return n;
}

/* Colour of t in [0, 1] on a five-stop viridis ramp; *dark says whether
 * white text reads better on it. */
static void heat_colour(double t, char *buf, size_t cap, int *dark) {
    static const unsigned char stop[5][3] = {
        {0x44, 0x01, 0x54}, {0x3b, 0x52, 0x8b}, {0x21, 0x91, 0x8c}, {0x5e, 0xc9, 0x62}, {0xfd, 0xe7, 0x25}};
    if (!(t >= 0)) t = 0;
    if (t > 1) t = 1;
    double x = t * 4.0;
    int i = (int)x;
    if (i > 3) i = 3;
    double f = x - i;
    int c[3];
    for (int k = 0; k < 3; k++) c[k] = (int)lround(stop[i][k] + f * (stop[i + 1][k] - stop[i][k]));
    snprintf(buf, cap, "#%02x%02x%02x", c[0], c[1], c[2]);
    *dark = t < 0.55;
}

static void heat_tick_label(const dhsa_heatmap *h, int a, int i, char *buf, size_t cap) {
    if (h->tick[a] && h->tick[a][i]) snprintf(buf, cap, "%s", h->tick[a][i]);
    else snprintf(buf, cap, "%d", i);
}

dhsa_status dhsa_heatmap_write(const dhsa_heatmap *h, FILE *f) {
    const double gap = 24.0, left = 96.0, bar_w = 16.0, right = 92.0;
    const double top = 34.0 + (h->subtitle ? 18.0 : 0.0) + 26.0, bottom = 56.0;
    const double pw = HEAT_CELL_W * h->nx, ph = HEAT_CELL_H * h->ny;
    const int np = h->n_panels > 0 ? h->n_panels : 1;
    const double W = left + np * pw + (np - 1) * gap + right, H = top + ph + bottom;
    char buf[128], col[16];
    int dark;

    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
            "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"12\">\n",
            W, H, W, H);
    fprintf(f, "<rect width=\"%.0f\" height=\"%.0f\" fill=\"white\"/>\n", W, H);
    if (h->title) {
        fprintf(f, "<text x=\"%.1f\" y=\"24\" text-anchor=\"middle\" font-size=\"15\" font-weight=\"bold\">",
                W / 2.0);
        put_text(f, h->title);
        fputs("</text>\n", f);
    }
    if (h->subtitle) {
        fprintf(f, "<text x=\"%.1f\" y=\"44\" text-anchor=\"middle\" font-size=\"11\" fill=\"#444\">", W / 2.0);
        put_text(f, h->subtitle);
        fputs("</text>\n", f);
    }
    /* row labels and the y label, left of the first panel */
    for (int r = 0; r < h->ny; r++) {
        heat_tick_label(h, 1, r, buf, sizeof buf);
        fprintf(f, "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"end\" fill=\"#333\">", left - 6.0,
                top + (r + 0.5) * HEAT_CELL_H + 4.0);
        put_text(f, buf);
        fputs("</text>\n", f);
    }
    if (h->label[1]) {
        fprintf(f, "<text x=\"16\" y=\"%.2f\" text-anchor=\"middle\" transform=\"rotate(-90 16 %.2f)\">",
                top + ph / 2, top + ph / 2);
        put_text(f, h->label[1]);
        fputs("</text>\n", f);
    }
    for (int p = 0; p < h->n_panels; p++) {
        const double x0 = left + p * (pw + gap);
        if (h->panel_name[p]) {
            fprintf(f, "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"middle\" font-weight=\"bold\">", x0 + pw / 2,
                    top - 8.0);
            put_text(f, h->panel_name[p]);
            fputs("</text>\n", f);
        }
        for (int r = 0; r < h->ny; r++)
            for (int c = 0; c < h->nx; c++) {
                double v = h->values[p][(size_t)r * h->nx + c], x = x0 + c * HEAT_CELL_W,
                       y = top + r * HEAT_CELL_H;
                char cl[64], rl[64];
                heat_tick_label(h, 0, c, cl, sizeof cl);
                heat_tick_label(h, 1, r, rl, sizeof rl);
                if (!isfinite(v)) {
                    fprintf(f,
                            "<rect class=\"nocell\" x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" "
                            "fill=\"#e8e8e8\" stroke=\"white\"/>\n",
                            x, y, HEAT_CELL_W, HEAT_CELL_H);
                    fprintf(f, "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"middle\" fill=\"#999\" "
                               "font-size=\"10\">n/a</text>\n",
                            x + HEAT_CELL_W / 2, y + HEAT_CELL_H / 2 + 4.0);
                    continue;
                }
                heat_colour((v - h->lo) / (h->hi - h->lo), col, sizeof col, &dark);
                fprintf(f,
                        "<rect class=\"cell\" x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" "
                        "fill=\"%s\" stroke=\"white\"><title>",
                        x, y, HEAT_CELL_W, HEAT_CELL_H, col);
                put_text(f, h->panel_name[p] ? h->panel_name[p] : "");
                fputs(", ", f);
                put_text(f, cl);
                fputs(", ", f);
                put_text(f, rl);
                fprintf(f, ": %.4g", v);
                fputs("</title></rect>\n", f);
                if (h->digits >= 0) {
                    fprintf(f, "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"middle\" fill=\"%s\" "
                               "font-size=\"11\">%.*f</text>\n",
                            x + HEAT_CELL_W / 2, y + HEAT_CELL_H / 2 + 4.0, dark ? "white" : "black", h->digits,
                            v);
                }
            }
        fprintf(f, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"none\" stroke=\"#333\"/>\n",
                x0, top, pw, ph);
        for (int c = 0; c < h->nx; c++) {
            heat_tick_label(h, 0, c, buf, sizeof buf);
            fprintf(f, "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"middle\" fill=\"#333\">",
                    x0 + (c + 0.5) * HEAT_CELL_W, top + ph + 16.0);
            put_text(f, buf);
            fputs("</text>\n", f);
        }
    }
    const double plots_w = np * pw + (np - 1) * gap;
    if (h->label[0]) {
        fprintf(f, "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"middle\">", left + plots_w / 2, H - 14.0);
        put_text(f, h->label[0]);
        fputs("</text>\n", f);
    }
    if (!h->n_panels)
        fprintf(f, "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"middle\" fill=\"#888\">no data</text>\n",
                left + pw / 2, top + ph / 2);

    /* colour bar: 32 steps from lo (bottom) to hi (top), ticks at both ends and the middle */
    const double bx = left + plots_w + 20.0;
    for (int i = 0; i < 32; i++) {
        heat_colour((i + 0.5) / 32.0, col, sizeof col, &dark);
        fprintf(f, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\"/>\n", bx,
                top + ph - (i + 1) * ph / 32.0, bar_w, ph / 32.0 + 0.5, col);
    }
    fprintf(f, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"none\" stroke=\"#333\"/>\n", bx,
            top, bar_w, ph);
    for (int i = 0; i <= 2; i++) {
        double v = h->lo + (h->hi - h->lo) * i / 2.0;
        fprintf(f, "<text x=\"%.2f\" y=\"%.2f\" fill=\"#333\">%.4g</text>\n", bx + bar_w + 4.0,
                top + ph - ph * i / 2.0 + 4.0, v);
    }
    if (h->scale_label) {
        fprintf(f, "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"middle\" font-size=\"11\" fill=\"#333\">", bx + 8.0,
                top - 8.0);
        put_text(f, h->scale_label);
        fputs("</text>\n", f);
    }
    fputs("</svg>\n", f);
    if (ferror(f)) return dhsa__fail(DHSA_ERR_IO, "writing the SVG failed");
    return DHSA_OK;
}

dhsa_status dhsa_heatmap_save(const dhsa_heatmap *h, const char *path) { return save_svg(path, write_heatmap, h); }
