/* status.c: status names, the thread-local last-error sentence and the
 * once-only warnings. Tested by tests/test_core.c.
 */
#include "core/internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <pthread.h>

/* long enough for a refusal that lists the choices (the tokenizer names the
 * ~70 pre-tokenizers it runs) */
static _Thread_local char last_error[1536];

const char *dhsa_status_str(dhsa_status s) {
    switch (s) {
    case DHSA_OK: return "DHSA_OK";
    case DHSA_ERR_INVALID_ARG: return "DHSA_ERR_INVALID_ARG";
    case DHSA_ERR_SHAPE: return "DHSA_ERR_SHAPE";
    case DHSA_ERR_OUT_OF_MEMORY: return "DHSA_ERR_OUT_OF_MEMORY";
    case DHSA_ERR_MEMORY_BUDGET: return "DHSA_ERR_MEMORY_BUDGET";
    case DHSA_ERR_UNSUPPORTED: return "DHSA_ERR_UNSUPPORTED";
    case DHSA_ERR_TOO_LARGE: return "DHSA_ERR_TOO_LARGE";
    case DHSA_ERR_IO: return "DHSA_ERR_IO";
    case DHSA_ERR_FORMAT: return "DHSA_ERR_FORMAT";
    case DHSA_ERR_NONFINITE: return "DHSA_ERR_NONFINITE";
    case DHSA_ERR_INTERNAL: return "DHSA_ERR_INTERNAL";
    case DHSA_ERR_BUSY: return "DHSA_ERR_BUSY";
    }
    return "DHSA_ERR_UNKNOWN";
}

const char *dhsa_last_error(void) { return last_error; }

/* Formatted into a local buffer first: callers pass dhsa_last_error() as
 * an argument ("layer 3: %s"), which must not be the buffer written. Any
 * control byte or unsafe UTF-8 left in the sentence (a file's string a
 * caller did not escape with dhsa__esc) is escaped on the way in, so the
 * sentence is safe to print (src/core/escape.c). */
dhsa_status dhsa__fail(dhsa_status s, const char *fmt, ...) {
    char msg[sizeof last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    dhsa__escape(last_error, sizeof last_error, msg, strlen(msg), DHSA__ESC_ELLIPSIS);
    return s;
}

/* A small fixed table is enough: keys are a handful of string literals. */
static pthread_mutex_t warn_mu = PTHREAD_MUTEX_INITIALIZER;
static const char *warned[32];
static int n_warned;

void dhsa__warn_once(const char *key, const char *fmt, ...) {
    pthread_mutex_lock(&warn_mu);
    for (int i = 0; i < n_warned; i++) {
        if (strcmp(warned[i], key) == 0) {
            pthread_mutex_unlock(&warn_mu);
            return;
        }
    }
    if (n_warned < 32) warned[n_warned++] = key;
    va_list ap;
    va_start(ap, fmt);
    fputs("dhsa: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    pthread_mutex_unlock(&warn_mu);
}
