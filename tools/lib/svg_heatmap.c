/* svg_heatmap.c: the heat map of `dhsa eval` (copy, niah, the retrieval
 * tasks): panels of cells on one colour scale (contract in svg.h, "Heat
 * maps").
 * Tested by tests/test_plots.c and tests/test_eval.c.
 */
#include "lib/svg.h"
#include "lib/svg_internal.h"

#include "core/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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
    h->title = dhsa_svg_dup_text(title, &fail);
    h->label[0] = dhsa_svg_dup_text(x_label, &fail);
    h->label[1] = dhsa_svg_dup_text(y_label, &fail);
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
    char *s = dhsa_svg_dup_text(subtitle, &fail);
    if (fail) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory for a heat map subtitle");
    free(h->subtitle);
    h->subtitle = s;
    return DHSA_OK;
}

dhsa_status dhsa_heatmap_set_labels(dhsa_heatmap *h, dhsa_axis axis, const char *const *labels) {
    int a = axis == DHSA_AXIS_Y, n = a ? h->ny : h->nx, fail = 0;
    char **l = calloc((size_t)n, sizeof *l);
    if (!l) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "out of memory for heat map labels");
    for (int i = 0; i < n; i++) l[i] = dhsa_svg_dup_text(labels ? labels[i] : NULL, &fail);
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
    char *s = dhsa_svg_dup_text(label, &fail);
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
    char *n = dhsa_svg_dup_text(name, &fail);
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
        dhsa_svg_put_text(f, h->title);
        fputs("</text>\n", f);
    }
    if (h->subtitle) {
        fprintf(f, "<text x=\"%.1f\" y=\"44\" text-anchor=\"middle\" font-size=\"11\" fill=\"#444\">", W / 2.0);
        dhsa_svg_put_text(f, h->subtitle);
        fputs("</text>\n", f);
    }
    /* row labels and the y label, left of the first panel */
    for (int r = 0; r < h->ny; r++) {
        heat_tick_label(h, 1, r, buf, sizeof buf);
        fprintf(f, "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"end\" fill=\"#333\">", left - 6.0,
                top + (r + 0.5) * HEAT_CELL_H + 4.0);
        dhsa_svg_put_text(f, buf);
        fputs("</text>\n", f);
    }
    if (h->label[1]) {
        fprintf(f, "<text x=\"16\" y=\"%.2f\" text-anchor=\"middle\" transform=\"rotate(-90 16 %.2f)\">",
                top + ph / 2, top + ph / 2);
        dhsa_svg_put_text(f, h->label[1]);
        fputs("</text>\n", f);
    }
    for (int p = 0; p < h->n_panels; p++) {
        const double x0 = left + p * (pw + gap);
        if (h->panel_name[p]) {
            fprintf(f, "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"middle\" font-weight=\"bold\">", x0 + pw / 2,
                    top - 8.0);
            dhsa_svg_put_text(f, h->panel_name[p]);
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
                dhsa_svg_put_text(f, h->panel_name[p] ? h->panel_name[p] : "");
                fputs(", ", f);
                dhsa_svg_put_text(f, cl);
                fputs(", ", f);
                dhsa_svg_put_text(f, rl);
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
            dhsa_svg_put_text(f, buf);
            fputs("</text>\n", f);
        }
    }
    const double plots_w = np * pw + (np - 1) * gap;
    if (h->label[0]) {
        fprintf(f, "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"middle\">", left + plots_w / 2, H - 14.0);
        dhsa_svg_put_text(f, h->label[0]);
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
        dhsa_svg_put_text(f, h->scale_label);
        fputs("</text>\n", f);
    }
    fputs("</svg>\n", f);
    if (ferror(f)) return dhsa__fail(DHSA_ERR_IO, "writing the SVG failed");
    return DHSA_OK;
}

static dhsa_status write_heatmap(const void *o, FILE *f) { return dhsa_heatmap_write(o, f); }

dhsa_status dhsa_heatmap_save(const dhsa_heatmap *h, const char *path) { return dhsa_svg_save(path, write_heatmap, h); }
