/* svg.h: a small SVG plot writer for the tools' figures (memory probe,
 * benchmarks, fidelity sweeps): line and scatter series on one pair of
 * axes, linear or log scales, ticks with labels (plain numbers or bytes in
 * binary units), grid, title, subtitle and legend; also the layout
 * picture (what a sparse layout selects) and the heat map of `dhsa eval`.
 * One header, one file per drawing: tools/lib/svg_plot.c (plots),
 * svg_picture.c (layout pictures), svg_heatmap.c (heat maps), and
 * svg_common.c for what they share (svg_internal.h). Part of the CLI's
 * support library build/libdhsa_cli.a, not of libdhsa (docs/architecture.md).
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
 *   - The *_save functions write through a temporary renamed over the path
 *     when complete (util/outfile.h): a failure leaves the old file.
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
/* Same, to a file (created, or replaced when complete: a temporary is
 * renamed over it). DHSA_ERR_IO if it cannot be written. */
dhsa_status dhsa_plot_save(const dhsa_plot *p, const char *path);

/* ---- Layout pictures ---------------------------------------------------
 * Which keys each query block attends to: query positions down the y axis
 * (row 0 on top), key positions along the x axis, and for every block of
 * query rows its selected key ranges as filled bars spanning the block's
 * rows. Optional marks: chunk boundaries as vertical ticks above the plot
 * (and faint lines through it), the causal diagonal (key = query
 * position), the sink keys [0, sink) and the local window (the `local`
 * keys before each row, and the row's own) as light bands under the bars.
 * One picture shows one (batch, KV head); small multiples are several
 * pictures.
 *
 * Contract:
 *   - The picture owns copies of everything given to it; rows may be added
 *     in any order (they are drawn sorted by their first position) and may
 *     come from several layouts (a prefill in ubatches: one call per
 *     ubatch with its q_pos0).
 *   - Large pictures stay small files: ranges are drawn, never cells;
 *     ranges of one row closer than a pixel are drawn as one bar; when
 *     there are more rows than max_rows (default 128) or more bars than
 *     max_bars (default 2000), only the first row of every k consecutive
 *     rows is drawn, stretched over the k rows, and a line under the
 *     subtitle says so ("the first of every k drawn"). Boundaries closer
 *     than 2 pixels are drawn once. So the file is at most about
 *     max_bars x 65 bytes + 40 KB (170 KB by default).
 *   - Every drawn bar is one `<rect class="rg" .../>`, every boundary tick
 *     one `<line class="bd" .../>`, the diagonal one `<line class="diag"
 *     .../>`, so a reader can count them.
 *   - Text is XML-escaped; the output starts with "<svg" and ends with
 *     "</svg>\n", like dhsa_plot_write.
 * Tested by tests/test_plots.c (the writer on hand-made layouts and the
 * CLI's --svg / --dump-layout). */

typedef struct dhsa_layout_picture dhsa_layout_picture;

/* An empty picture of query positions [0, n_queries) and key positions
 * [0, n_keys) (both >= 1). Title may be NULL. NULL on failure (last
 * error set). */
dhsa_layout_picture *dhsa_layout_picture_create(const char *title, int64_t n_queries,
                                                int64_t n_keys);
void dhsa_layout_picture_free(dhsa_layout_picture *p); /* NULL allowed */
/* Title and subtitle (NULL = none), replacing earlier ones. */
dhsa_status dhsa_layout_picture_set_title(dhsa_layout_picture *p, const char *title);
dhsa_status dhsa_layout_picture_set_subtitle(dhsa_layout_picture *p, const char *subtitle);
/* Pixel size; each in [200, 10000]. Default 760 x 820. */
dhsa_status dhsa_layout_picture_set_size(dhsa_layout_picture *p, int width, int height);
/* Caps on drawn rows (>= 1) and bars (>= 16); see the contract. */
dhsa_status dhsa_layout_picture_set_caps(dhsa_layout_picture *p, int64_t max_rows,
                                         int64_t max_bars);
/* The marks: causal draws the diagonal and makes dhsa_layout_picture_density
 * count only keys <= the row's position; sink > 0 and local > 0 draw their
 * bands. */
void dhsa_layout_picture_set_marks(dhsa_layout_picture *p, int causal, int64_t sink,
                                   int64_t local);
/* Chunk starts (any order, duplicates allowed; 0 and positions outside
 * [1, n_keys) are not drawn: they mark no boundary). */
dhsa_status dhsa_layout_picture_set_boundaries(dhsa_layout_picture *p, const int64_t *starts,
                                               int64_t n);
/* One block: query positions [q0, q1) attend to the n key ranges
 * ranges[2i] .. ranges[2i + 1] (half open). Ranges are clipped to
 * [0, n_keys); empty ones are dropped; they need not be sorted. */
dhsa_status dhsa_layout_picture_add_block(dhsa_layout_picture *p, int64_t q0, int64_t q1,
                                          const int64_t *ranges, int64_t n);
/* Every block of (batch b, KV head g) of a layout, its rows placed at
 * q_pos0 + row (the q_pos0 of the attention call the layout was made for). */
dhsa_status dhsa_layout_picture_add_layout(dhsa_layout_picture *p, const dhsa_layout *layout,
                                           int64_t b, int64_t g, int64_t q_pos0);
/* Blocks added so far. */
int64_t dhsa_layout_picture_blocks(const dhsa_layout_picture *p);
/* Bars dhsa_layout_picture_write will draw (after the merging and the
 * caps). */
int64_t dhsa_layout_picture_count_bars(const dhsa_layout_picture *p);
/* Selected keys / available keys over every added row (available: the
 * keys <= the row's position when causal, else all n_keys; a selected key
 * counts only where it is available). 1 when nothing is available. */
double dhsa_layout_picture_density(const dhsa_layout_picture *p);
/* Writes the SVG document; a picture with no block gets its frame and a
 * "no data" note. */
dhsa_status dhsa_layout_picture_write(const dhsa_layout_picture *p, FILE *f);
/* Same, to a file (created, or replaced when complete); DHSA_ERR_IO if it
 * cannot be written. */
dhsa_status dhsa_layout_picture_save(const dhsa_layout_picture *p, const char *path);
/* ---- Layout pictures end ---- */

/* ---- Heat maps (dhsa eval copy / niah) ---- */

/* A heat map: one or more panels (one per method, say) side by side, each
 * a grid of nx columns x ny rows of cells sharing one colour scale
 * (viridis-like, dark = low), a colour bar with ticks on the right, column
 * labels under each panel, row labels left of the first, panel names
 * above. Row 0 is drawn at the top. Every cell with a finite value is one
 * `<rect class="cell" .../>` with a <title> tooltip (panel, column, row,
 * value) and, unless digits < 0, the value printed in it; a NaN cell is a
 * light grey `<rect class="nocell" .../>` marked "n/a". Values outside the
 * scale are coloured as its ends but printed as they are. The size follows
 * from the grid (cells of 56 x 30 pixels). Copies are made of everything
 * given; text is XML-escaped. */
typedef struct dhsa_heatmap dhsa_heatmap;

/* nx, ny in [1, 256]. Any text may be NULL. NULL on failure (last error set). */
dhsa_heatmap *dhsa_heatmap_create(const char *title, const char *x_label, const char *y_label, int nx,
                                  int ny);
void dhsa_heatmap_free(dhsa_heatmap *h); /* NULL allowed */
dhsa_status dhsa_heatmap_set_subtitle(dhsa_heatmap *h, const char *subtitle);
/* Labels of the columns (axis X: nx strings) or rows (axis Y: ny strings). */
dhsa_status dhsa_heatmap_set_labels(dhsa_heatmap *h, dhsa_axis axis, const char *const *labels);
/* The colour scale [lo, hi] (lo < hi, both finite) and the colour bar's
 * label; default [0, 1], no label. */
dhsa_status dhsa_heatmap_set_scale(dhsa_heatmap *h, double lo, double hi, const char *label);
/* Decimals of the printed values (default 2); negative: no numbers. */
void dhsa_heatmap_set_digits(dhsa_heatmap *h, int digits);
/* Adds a panel: values[ny][nx] row-major (NaN = no value), copied. At most
 * 16 panels. */
dhsa_status dhsa_heatmap_add_panel(dhsa_heatmap *h, const char *name, const double *values);
/* Cells with a finite value over all panels (the "cell" rects written). */
int64_t dhsa_heatmap_count_cells(const dhsa_heatmap *h);
dhsa_status dhsa_heatmap_write(const dhsa_heatmap *h, FILE *f);
/* Same, to a file (created, or replaced when complete); DHSA_ERR_IO if it
 * cannot be written. */
dhsa_status dhsa_heatmap_save(const dhsa_heatmap *h, const char *path);

#endif
