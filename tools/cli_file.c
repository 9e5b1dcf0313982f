/* cli_file.c: the CLI's files (declared in tools/cli.h): reading a whole
 * input file with its size limit known before reading (prompts, texts,
 * haystacks, filler; "-" reads stdin), checks of output paths (before any
 * work) and of options that name files (--tokenizer, --boundary
 * learned:FILE), and finding the default model.
 * Tested by tests/test_cli_promises.c.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "util/outfile.h"

char *dhsa_cli_read_file(const char *path, int64_t max_bytes, int64_t *len) {
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f) return NULL;
    /* the limit before reading: a file's size is known; a pipe or device is
     * read to at most max_bytes + 1 bytes */
    struct stat st;
    int regular = 0;
    int64_t size = 0;
    if (fstat(fileno(f), &st) == 0) {
        int e = S_ISDIR(st.st_mode) ? EISDIR : S_ISREG(st.st_mode) && st.st_size > max_bytes ? EFBIG : 0;
        if (e) {
            if (f != stdin) fclose(f);
            errno = e;
            return NULL;
        }
        regular = S_ISREG(st.st_mode);
        size = (int64_t)st.st_size;
    }
    size_t cap = regular ? (size_t)size + 1 : 1 << 16, n = 0;
    if ((int64_t)cap > max_bytes + 1) cap = (size_t)max_bytes + 1;
    char *buf = malloc(cap + 1);
    int err = buf ? 0 : ENOMEM;
    while (!err) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if ((int64_t)n > max_bytes) {
            err = EFBIG;
            break;
        }
        if (got == 0) break;
        if (n == cap) {
            size_t grow = cap * 2;
            if ((int64_t)grow > max_bytes + 1) grow = (size_t)max_bytes + 1;
            char *b = realloc(buf, grow + 1);
            if (!b) {
                err = ENOMEM;
                break;
            }
            buf = b;
            cap = grow;
        }
    }
    if (!err && ferror(f)) err = errno ? errno : EIO;
    if (f != stdin) fclose(f);
    if (err) {
        free(buf);
        errno = err;
        return NULL;
    }
    buf[n] = 0;
    *len = (int64_t)n;
    return buf;
}

char *dhsa_cli_slurp(const char *opt, const char *path, int64_t max_bytes, const char *limit_why, int64_t *len) {
    char *buf = dhsa_cli_read_file(path, max_bytes, len);
    if (buf) return buf;
    char lim[32];
    if (errno == EISDIR) dhsa_cli_die(DHSA_EXIT_RUN, "%s %s: it is a directory, not a file", opt, path);
    if (errno == EFBIG)
        dhsa_cli_die(DHSA_EXIT_RUN, "%s %s: larger than %s (%lld bytes)%s%s", opt, path,
                     dhsa_cli_bytes((double)max_bytes, lim, sizeof lim), (long long)max_bytes,
                     limit_why ? ", " : "", limit_why ? limit_why : "");
    dhsa_cli_die(DHSA_EXIT_RUN, "cannot read %s (%s): %s", path, opt, strerror(errno));
}

dhsa_json_schema *dhsa_cli_json_schema(const char *opt, const char *arg) {
    dhsa_json_schema *s = NULL;
    if (!arg) {
        if (dhsa_json_schema_compile(NULL, 0, &s)) dhsa_cli_die(DHSA_EXIT_RUN, "%s: %s", opt, dhsa_last_error());
        return s;
    }
    const char *p = arg;
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    char *text = NULL;
    int64_t len;
    if (*p == '{') len = (int64_t)strlen(arg);
    else text = dhsa_cli_slurp(opt, arg, (int64_t)1 << 20, "the most a schema may have", &len);
    if (dhsa_json_schema_compile(text ? text : arg, len, &s)) {
        char why[600];
        snprintf(why, sizeof why, "%s", dhsa_last_error());
        const int from_file = text != NULL;
        free(text);
        dhsa_cli_die(DHSA_EXIT_USAGE, "%s %s: %s", opt, from_file ? arg : "(inline)", why);
    }
    free(text);
    return s;
}

int64_t dhsa_cli_text_limit(const dhsa_tokenizer *tok, int64_t n_tokens) {
    int64_t longest = 1;
    for (int64_t id = 0; id < dhsa_tokenizer_n_vocab(tok); id++) {
        int64_t n = 0;
        if (dhsa_tokenizer_text(tok, (int32_t)id, &n) && n > longest) longest = n;
    }
    if (n_tokens < 0 || n_tokens + 1 > DHSA_TOKENIZER_MAX_TEXT / longest) return DHSA_TOKENIZER_MAX_TEXT;
    return (n_tokens + 1) * longest;
}

/* ------------------------------------------------------------ checks --- */

void dhsa_cli_check_output(const char *opt, const char *path) {
    if (dhsa_outfile_check(path)) dhsa_cli_die(DHSA_EXIT_USAGE, "%s: %s", opt, dhsa_last_error());
}

void dhsa_cli_check_not_input(const char *opt, const char *out, const char *input_opt, const char *input) {
    struct stat a, b;
    if (!out || !input || stat(out, &a) != 0 || stat(input, &b) != 0) return;
    if (a.st_dev == b.st_dev && a.st_ino == b.st_ino)
        dhsa_cli_die(DHSA_EXIT_USAGE, "%s %s is the file %s reads (%s): it would be replaced", opt, out, input_opt,
                     input);
}

void dhsa_cli_check_tokenizer(const char *model, const char *tokenizer) {
    if (!tokenizer || !model) return;
    FILE *f = fopen(model, "rb");
    char magic[4] = {0};
    size_t got = f ? fread(magic, 1, 4, f) : 0;
    if (f) fclose(f);
    if (got == 4 && memcmp(magic, "GGUF", 4) == 0)
        dhsa_cli_die(DHSA_EXIT_USAGE,
                     "--tokenizer %s: %s is a GGUF file, which carries its own tokenizer (--tokenizer is for "
                     "llama2.c checkpoints): drop the option",
                     tokenizer, model);
}

dhsa_predictor *dhsa_cli_load_predictor(const char *path, int64_t width_needed, const char *width_what) {
    dhsa_predictor *pr = NULL;
    if (dhsa_predictor_load(path, &pr)) dhsa_cli_die_lib(NULL); /* the sentence names the file */
    if (width_needed > 0 && dhsa_predictor_width(pr) != width_needed)
        dhsa_cli_die(DHSA_EXIT_RUN,
                     "--boundary learned:%s: the predictor reads %lld values per token, but %s has %lld (KV heads x "
                     "head dim): it was trained for another model (dhsa train-boundary trains one for this one)",
                     path, (long long)dhsa_predictor_width(pr), width_what ? width_what : "the model",
                     (long long)width_needed);
    return pr;
}

const char *dhsa_cli_default_model(char *msg, size_t msg_len) {
    static char path[4096];
    const char *env = getenv("DHSA_MODEL");
    if (env && env[0]) {
        if (access(env, R_OK) == 0) return env;
        snprintf(msg, msg_len, "DHSA_MODEL=%s cannot be read", env);
        return NULL;
    }
    char exe[3072];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0; /* the executable's folder (build/) */
            snprintf(path, sizeof path, "%s/../models/%s", exe, DHSA_DEFAULT_MODEL);
            if (access(path, R_OK) == 0) return path;
        }
    }
    snprintf(path, sizeof path, "models/%s", DHSA_DEFAULT_MODEL);
    if (access(path, R_OK) == 0) return path;
    snprintf(msg, msg_len,
             "no -m MODEL given and the default model %s was not found (looked beside the executable in "
             "../models/ and in ./models/; DHSA_MODEL names another file)", DHSA_DEFAULT_MODEL);
    return NULL;
}
