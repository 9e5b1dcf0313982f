/* proc.c: process memory as Linux reports it (VmHWM, VmRSS) and the peak
 * reset through /proc/self/clear_refs. Elsewhere the readers return 0 and
 * the reset returns DHSA_ERR_UNSUPPORTED. Also what the memory plan counts
 * besides a session's buffers (src/core/procmem.h): the mapped files and
 * the anonymous memory resident now, and glibc's block sizes.
 * Tested by tests/test_core.c and tests/test_memlimit.c.
 */
#include "core/internal.h"
#include "core/procmem.h"

#include <inttypes.h>
#include <stdio.h>

static size_t read_status_kb(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    size_t kb = 0, n = strlen(key);
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, key, n) == 0 && line[n] == ':') {
            unsigned long long v = 0;
            if (sscanf(line + n + 1, "%llu", &v) == 1) kb = (size_t)v;
            break;
        }
    }
    fclose(f);
    return kb * 1024;
}

/* Right after a clear_refs reset the kernel can report VmHWM below VmRSS
 * until the next page fault updates it; the peak is at least the current. */
size_t dhsa_proc_peak_rss(void) {
    size_t hwm = read_status_kb("VmHWM"), rss = read_status_kb("VmRSS");
    return hwm > rss ? hwm : rss;
}
size_t dhsa_proc_rss(void) { return read_status_kb("VmRSS"); }

dhsa_status dhsa_proc_reset_peak_rss(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return dhsa__fail(DHSA_ERR_UNSUPPORTED, "cannot open /proc/self/clear_refs");
    int ok = fputs("5", f) >= 0;
    ok = (fclose(f) == 0) && ok;
    if (!ok) return dhsa__fail(DHSA_ERR_UNSUPPORTED, "writing 5 to /proc/self/clear_refs failed");
    return DHSA_OK;
}

/* ------------------------------------------------- the plan's process --- */

size_t dhsa__heap_block(size_t n) {
    if (n > SIZE_MAX - 2 * DHSA__PAGE) return SIZE_MAX;
    size_t small = dhsa__align_up(n + 8 < 32 ? 32 : n + 8, 16);
    size_t mapped = dhsa__align_up(n + 16, DHSA__PAGE);
    return n >= ((size_t)128 << 10) || mapped < small ? mapped : small;
}

void dhsa__touch(void *p, size_t n) {
    volatile unsigned char *b = p;
    for (size_t i = 0; i < n; i += DHSA__PAGE) b[i] = 0;
    if (n) b[n - 1] = 0;
}

/* The whole size of the file-backed mappings (and the vDSO) in
 * /proc/self/maps, less the part inside [skip_lo, skip_hi). */
static int read_mapped_files(uintptr_t skip_lo, uintptr_t skip_hi, size_t *out) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return 0;
    char line[512];
    size_t total = 0;
    int at_start = 1; /* the buffer holds the start of a line */
    while (fgets(line, sizeof line, f)) {
        int whole = strchr(line, '\n') != NULL;
        int first = at_start;
        at_start = whole;
        if (!first) continue; /* the rest of a long path */
        uintmax_t lo, hi, off, inode;
        char perm[8], dev[16];
        int name = 0;
        if (sscanf(line, "%jx-%jx %7s %jx %15s %ju %n", &lo, &hi, perm, &off, dev, &inode, &name) < 6 || hi < lo)
            continue;
        if (inode == 0 && !(name > 0 && strncmp(line + name, "[vdso]", 6) == 0)) continue;
        uintmax_t size = hi - lo;
        uintmax_t a = lo > skip_lo ? lo : skip_lo, b = hi < skip_hi ? hi : skip_hi;
        if (a < b) size -= b - a;
        total += (size_t)size;
    }
    fclose(f);
    *out = total;
    return 1;
}

static int thp_always(void) {
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f) return 0;
    char line[128] = "";
    int always = fgets(line, sizeof line, f) && strstr(line, "[always]") != NULL;
    fclose(f);
    return always;
}

void dhsa__proc_measure(const void *skip, size_t skip_len, dhsa__proc_mem *out) {
    memset(out, 0, sizeof *out);
    uintptr_t lo = (uintptr_t)skip, hi = skip ? lo + dhsa__align_up(skip_len, DHSA__PAGE) : lo;
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return;
    char line[256];
    int found = 0;
    size_t anon = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long long kb;
        if (sscanf(line, "RssAnon: %llu", &kb) == 1 || sscanf(line, "RssShmem: %llu", &kb) == 1) {
            anon += (size_t)kb * 1024;
            found++;
        }
    }
    fclose(f);
    if (!found || !read_mapped_files(lo, hi, &out->mapped_files)) return;
    out->anon = anon;
    out->thp_always = thp_always();
    out->measured = 1;
}
