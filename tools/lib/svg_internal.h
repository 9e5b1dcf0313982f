/* svg_internal.h: the helpers the SVG drawings of tools/lib share
 * (svg_common.c); private to svg_plot.c, svg_picture.c and svg_heatmap.c.
 * The public side is lib/svg.h.
 */
#ifndef DHSA_TOOLS_SVG_INTERNAL_H
#define DHSA_TOOLS_SVG_INTERNAL_H

#include "lib/svg.h"

#include <stdio.h>

/* A copy of s (malloc), or NULL for NULL. Sets *fail on allocation failure. */
char *dhsa_svg_dup_text(const char *s, int *fail);
/* The smallest of 1, 2, 5 times a power of ten that is >= v (v > 0). */
double dhsa_svg_nice_step(double v);
/* Text as XML character data: markup characters escaped, control
 * characters and invalid UTF-8 bytes replaced by '?'. */
void dhsa_svg_put_text(FILE *f, const char *text);

/* Writes obj with write(obj, f) through a temporary renamed over path when
 * complete (util/outfile.h); the error names the path. The three figure
 * kinds save through it. */
typedef dhsa_status (*dhsa_svg_writer)(const void *obj, FILE *f);
dhsa_status dhsa_svg_save(const char *path, dhsa_svg_writer write, const void *obj);

#endif
