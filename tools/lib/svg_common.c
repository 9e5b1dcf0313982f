/* svg_common.c: what the three SVG drawings share (declared in
 * svg_internal.h): text copies, XML-escaped text, the 1-2-5 tick step and
 * the save through a temporary renamed into place. The drawings are
 * svg_plot.c (plots), svg_picture.c (layout pictures) and svg_heatmap.c
 * (heat maps); their contract is lib/svg.h.
 * Tested through them by tests/test_memprobe.c and tests/test_plots.c.
 */
#include "lib/svg_internal.h"

#include "util/outfile.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A copy of s, or NULL for NULL. Sets *fail on allocation failure. */
char *dhsa_svg_dup_text(const char *s, int *fail) {
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

/* The smallest of 1, 2, 5 times a power of ten that is >= v (v > 0). */
double dhsa_svg_nice_step(double v) {
    double p10 = pow(10.0, floor(log10(v)));
    double m = v / p10;
    return (m <= 1.0 + 1e-9 ? 1.0 : m <= 2.0 + 1e-9 ? 2.0 : m <= 5.0 + 1e-9 ? 5.0 : 10.0) * p10;
}

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
void dhsa_svg_put_text(FILE *f, const char *text) {
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

typedef struct {
    dhsa_svg_writer write;
    const void *obj;
} svg_job;

static dhsa_status run_svg_job(void *user, FILE *f) {
    const svg_job *j = user;
    return j->write(j->obj, f);
}

dhsa_status dhsa_svg_save(const char *path, dhsa_svg_writer write, const void *obj) {
    svg_job j = {write, obj};
    return dhsa_outfile_write(path, run_svg_job, &j);
}
