/* outfile.h: how the project writes a file (internal; the CLI in tools/
 * uses it too). Every writer (the GGUF writer, the predictor, the SVG
 * figures, llama2.c conversion) goes through it, so that every output
 * keeps the same promises (docs/files.md):
 *   - the contents go to a temporary file in the target's folder
 *     (NAME.part.PID.N, created with O_EXCL), are flushed and fsync'ed, and
 *     are renamed over the target only when complete: a reader that has the
 *     old file open or mapped keeps the old bytes (no SIGBUS), and a reader
 *     that opens the name sees the old file or the new one, never a part;
 *   - on any failure the temporary is removed and the old file is untouched;
 *   - an existing file keeps its permission bits; a symbolic link to a file
 *     is followed (its target is replaced, the link stays);
 *   - a target that exists and is not a regular file (a character device
 *     such as /dev/null or /dev/stdout, a FIFO) is written in place: there
 *     is nothing to replace atomically.
 * A process killed while it writes leaves its NAME.part.PID.N behind; the
 * name never shadows the real file.
 * Failing calls return a dhsa_status and set dhsa_last_error() to one
 * sentence that names the path. Tested by tests/test_cli_promises.c
 * (readers that map the file, failed writes, refused paths).
 */
#ifndef DHSA_UTIL_OUTFILE_H
#define DHSA_UTIL_OUTFILE_H

#include "dhsa.h"

#include <stdio.h>

typedef struct {
    FILE *f;    /* write the contents here */
    char *path; /* where they go (a link's target); owned */
    char *tmp;  /* the temporary, NULL when written in place; owned */
} dhsa_outfile;

/* Whether path can be written, checked without touching it: refuses an
 * empty name, a directory, a missing folder, a folder that is not one or
 * in which no file can be created (tried by creating and removing a
 * temporary there). Cheap: for commands to call before any work. */
dhsa_status dhsa_outfile_check(const char *path);

/* Opens the temporary for path (see above). On failure o is empty. */
dhsa_status dhsa_outfile_open(dhsa_outfile *o, const char *path);

/* Flushes, fsyncs and closes the temporary and renames it over the path.
 * On failure (a write error seen by the stream, a full disk, the rename)
 * the temporary is removed. o is released either way. */
dhsa_status dhsa_outfile_commit(dhsa_outfile *o);

/* Closes and removes the temporary, leaving the old file as it was; o is
 * released. Safe on an empty o. */
void dhsa_outfile_discard(dhsa_outfile *o);

/* open + write(user, f) + commit (discard when write fails: its status and
 * sentence are kept, prefixed with the path). */
typedef dhsa_status (*dhsa_outfile_writer)(void *user, FILE *f);
dhsa_status dhsa_outfile_write(const char *path, dhsa_outfile_writer write, void *user);

#endif
