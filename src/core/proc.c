/* proc.c: process memory as Linux reports it (VmHWM, VmRSS) and the peak
 * reset through /proc/self/clear_refs. Elsewhere the readers return 0 and
 * the reset returns DHSA_ERR_UNSUPPORTED. Tested by tests/test_core.c.
 */
#include "core/internal.h"

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
