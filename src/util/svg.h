/* svg.h: a small SVG plot writer for the tools' figures (memory probe,
 * benchmarks, fidelity sweeps): line and scatter series on one pair of
 * axes, linear or log scales, ticks with labels (plain numbers or bytes in
 * binary units), grid, title, subtitle and legend. Internal: not in the
 * public header.
 *
 * Contract:
 *   - A plot owns copies of everything given to it (titles, labels, series
 *     data); the caller may free its arrays right after dhsa_plot_add.
 *   - Points that cannot be drawn are skipped, never clamped: non-finite x
 *     or y, and values <= 0 on a log axis. A line series is broken at a
 *     skipped point rather than joined across it.
 *   - The axis range is the data's (over all series), widened to tick
 *     positions, unless dhsa_plot_set_range fixes one end or both. A point
 *     outside a fixed range is not drawn; lines are clipped to the plot area.
 *   - Text is XML-escaped, so any title (a command line) is safe.
 *   - Every drawn data point is one `<circle class="pt" .../>` (legend
 *     markers use another class), so a reader can count them.
 *   - The output starts with "<svg" and ends with "</svg>\n" (no XML
 *     declaration: browsers and Markdown renderers do not need one).
 * Failing calls return a dhsa_status and set dhsa_last_error().
 * Tested by tests/test_memprobe.c (the writer alone, and `dhsa memprobe
 * --svg`).
 */
#ifndef DHSA_UTIL_SVG_H
#define DHSA_UTIL_SVG_H

#include "dhsa.h"

#include <stdint.h>
#include <stdio.h>

typedef struct dhsa_plot dhsa_plot;

/* Series style: a set of bits. POINTS draws a marker at every point, LINE
 * joins them in the order given, DASHED makes the line dashed. */
enum {
    DHSA_PLOT_POINTS = 1,
    DHSA_PLOT_LINE = 2,
    DHSA_PLOT_DASHED = 4
};

typedef enum {
    DHSA_AXIS_NUMBER = 0, /* plain numbers: 1024, 0.25, 1.5e+09 */
    DHSA_AXIS_BYTES = 1   /* bytes in binary units: 512 KiB, 16 MiB, 1.5 GiB */
} dhsa_axis_format;

typedef enum { DHSA_AXIS_X = 0, DHSA_AXIS_Y = 1 } dhsa_axis;

/* A new empty plot, 720 x 480 pixels, linear axes, NUMBER format. Any text
 * may be NULL (left out). NULL on failure (out of memory). */
dhsa_plot *dhsa_plot_create(const char *title, const char *x_label, const char *y_label);
void dhsa_plot_free(dhsa_plot *p); /* NULL allowed */

/* A second, smaller line under the title (a verdict, a command). */
dhsa_status dhsa_plot_set_subtitle(dhsa_plot *p, const char *subtitle);
/* Pixel size; each in [200, 10000]. */
dhsa_status dhsa_plot_set_size(dhsa_plot *p, int width, int height);
void dhsa_plot_set_log(dhsa_plot *p, dhsa_axis axis, int log_scale);
void dhsa_plot_set_format(dhsa_plot *p, dhsa_axis axis, dhsa_axis_format f);
/* Fixes the axis range; NaN for an end leaves it automatic. On a log axis a
 * fixed end must be > 0. lo < hi when both are given. */
dhsa_status dhsa_plot_set_range(dhsa_plot *p, dhsa_axis axis, double lo, double hi);

/* Adds a series of n points (x[i], y[i]) with a name for the legend (NULL
 * or "" = not in the legend) and a style (DHSA_PLOT_* bits, at least
 * POINTS or LINE). Series get colours in the order added. n may be 0. */
dhsa_status dhsa_plot_add(dhsa_plot *p, const char *name, int style, const double *x,
                          const double *y, int64_t n);

/* Points of all series that will be drawn (after the skipping rules). */
int64_t dhsa_plot_count_drawn(const dhsa_plot *p);

/* Writes the SVG document. A plot with no drawable point still gets its
 * frame and a "no data" note. */
dhsa_status dhsa_plot_write(const dhsa_plot *p, FILE *f);
/* Same, to a file (created or truncated). DHSA_ERR_IO if it cannot be
 * written. */
dhsa_status dhsa_plot_save(const dhsa_plot *p, const char *path);

#endif
