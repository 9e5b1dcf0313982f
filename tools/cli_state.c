/* cli_state.c: the prompt cache of `dhsa run --prompt-cache FILE` and
 * `dhsa chat` (docs/prompt-cache.md): a saved prefill (dhsa_session_save /
 * _load) reused when a prompt starts with its tokens. Every outcome is said
 * on stderr: reused N tokens, or why the file was not used and the prompt
 * is prefilled instead. Tested by tests/test_cli_state.c.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "dhsa.h"

int64_t dhsa_cli_cache_load(dhsa_session *s, const char *path, const int32_t *ids, int64_t n, float *logits,
                            int *have_logits) {
    *have_logits = 0;
    struct stat sb;
    if (stat(path, &sb) != 0 && errno == ENOENT) {
        fprintf(stderr, "dhsa %s: prompt cache %s: none yet: prefilling %lld tokens, then saving them\n",
                dhsa_cli_command(), path, (long long)n);
        return 0;
    }
    const dhsa_mem_plan *pl = dhsa_session_get_plan(s);
    int32_t *saved = malloc((size_t)pl->n_ctx * sizeof(int32_t));
    if (!saved) dhsa_cli_die(DHSA_EXIT_RUN, "out of memory");
    int64_t n_saved = 0;
    int has = 0;
    double t0 = dhsa_cli_now();
    dhsa_status st = dhsa_session_load(s, path, saved, pl->n_ctx, &n_saved, logits, &has);
    double t_load = dhsa_cli_now() - t0;
    if (st) {
        fprintf(stderr, "dhsa %s: prompt cache not used: %s; prefilling %lld tokens, then saving them\n",
                dhsa_cli_command(), dhsa_last_error(), (long long)n);
        free(saved);
        if (dhsa_session_length(s) && dhsa_session_reset(s)) dhsa_cli_die(DHSA_EXIT_RUN, "%s", dhsa_last_error());
        return 0;
    }
    int64_t common = 0;
    while (common < n && common < n_saved && saved[common] == ids[common]) common++;
    free(saved);
    int64_t keep = common;
    if (keep == n && !(n == n_saved && has)) keep = n - 1; /* the last token's logits are needed */
    if (keep < n_saved && dhsa_session_truncate(s, keep)) {
        fprintf(stderr, "dhsa %s: prompt cache %s: %s; prefilling %lld tokens\n", dhsa_cli_command(), path,
                dhsa_last_error(), (long long)n);
        if (dhsa_session_reset(s)) dhsa_cli_die(DHSA_EXIT_RUN, "%s", dhsa_last_error());
        return 0;
    }
    if (keep == 0)
        fprintf(stderr, "dhsa %s: prompt cache %s: its %lld tokens are not a prefix of this prompt: prefilling %lld "
                "tokens\n", dhsa_cli_command(), path, (long long)n_saved, (long long)n);
    else
        fprintf(stderr, "dhsa %s: prompt cache %s: reused %lld of the prompt's %lld tokens (of %lld saved; loaded "
                "in %.3f s)%s\n", dhsa_cli_command(), path, (long long)keep, (long long)n, (long long)n_saved, t_load,
                keep == n ? "" : "; evaluating the rest");
    *have_logits = keep == n;
    return keep;
}

void dhsa_cli_cache_save(dhsa_session *s, const char *path, const int32_t *ids, int64_t n, const float *logits) {
    double t0 = dhsa_cli_now();
    if (dhsa_session_save(s, ids, n, logits, path))
        dhsa_cli_die(DHSA_EXIT_RUN, "--prompt-cache: %s", dhsa_last_error());
    struct stat sb;
    char b[32];
    fprintf(stderr, "dhsa %s: prompt cache %s: saved %lld tokens (%s) in %.3f s\n", dhsa_cli_command(), path,
            (long long)n, dhsa_cli_bytes(stat(path, &sb) == 0 ? (double)sb.st_size : 0.0, b, sizeof b),
            dhsa_cli_now() - t0);
}
