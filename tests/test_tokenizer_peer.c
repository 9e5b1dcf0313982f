/* test_tokenizer_peer.c: dhsa's token ids equal llama.cpp's.
 *
 * tests/tokenizer_peer.tsv holds llama.cpp's ids (llama-tokenize, October
 * 2026 source) for 75 strings (special-token texts, control characters,
 * emoji, Korean and other scripts, code, runs of whitespace) through every
 * vocabulary of ../shared/vocab, ../shared/models/stories260K.gguf and the
 * shipped models/dhsa-retrieval-8m.gguf, and 8 strings of invalid UTF-8
 * through the byte-level BPE ones, with special tokens parsed and not, BOS
 * as each vocabulary says (932 cases); bench/tokenizer_peer.py wrote it (and
 * re-runs the comparison where llama.cpp is built). Here every case is
 * tokenized with the same flags and compared id by id: one check per case;
 * a vocabulary that is absent skips its cases (counted). A case with one id
 * changed must be caught, so the comparison can fail.
 * Run: make test, or build/tests/test_tokenizer_peer (from the repository
 * root).
 */
#include "dhsa.h"
#include "t.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FIXTURE "tests/tokenizer_peer.tsv"
#define SHARED "../shared/"
#define MAX_CASE_IDS 1024

typedef struct {
    char name[256];
    dhsa_tokenizer *t;
    int missing;
} vocab;

static vocab vocabs[16];
static int n_vocabs;

/* The tokenizer for a fixture name ("vocab/x.gguf" in ../shared,
 * "repo:models/x.gguf" in the repository); NULL when the file is absent. */
static vocab *get_vocab(const char *name) {
    if (strlen(name) >= 200) return NULL;
    for (int i = 0; i < n_vocabs; i++)
        if (strcmp(vocabs[i].name, name) == 0) return &vocabs[i];
    if (n_vocabs == (int)(sizeof vocabs / sizeof vocabs[0])) return NULL;
    vocab *v = &vocabs[n_vocabs++];
    snprintf(v->name, sizeof v->name, "%.200s", name);
    char path[512];
    if (strncmp(name, "repo:", 5) == 0) snprintf(path, sizeof path, "%.200s", name + 5);
    else snprintf(path, sizeof path, SHARED "%.200s", name);
    dhsa_gguf *g = NULL;
    if (dhsa_gguf_open(path, &g) != DHSA_OK) {
        v->missing = 1;
        return v;
    }
    if (dhsa_tokenizer_from_gguf(g, &v->t) != DHSA_OK) {
        fprintf(stderr, "  %s: %s\n", path, dhsa_last_error());
        v->missing = 1;
    }
    dhsa_gguf_close(g);
    return v;
}

static int hexval(int c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Decodes the hex field into buf; its length, or -1. */
static int64_t unhex(const char *s, const char *end, char *buf, int64_t cap) {
    int64_t n = 0;
    for (; s + 1 < end; s += 2) {
        int a = hexval(s[0]), b = hexval(s[1]);
        if (a < 0 || b < 0 || n == cap) return -1;
        buf[n++] = (char)(a * 16 + b);
    }
    return s == end ? n : -1;
}

int main(void) {
    FILE *f = fopen(FIXTURE, "r");
    T_CHECK(f != NULL, "%s cannot be read (run from the repository root)", FIXTURE);
    if (!f) return t_report("test_tokenizer_peer");
    static char line[1 << 16], text[1 << 15];
    int32_t want[MAX_CASE_IDS], got[MAX_CASE_IDS];
    int n_cases = 0, n_equal = 0, n_skipped = 0, bad_lines = 0, caught = 0, tried_wrong = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#' || line[0] == '\n') continue;
        char *tab1 = strchr(line, '\t'), *tab2 = tab1 ? strchr(tab1 + 1, '\t') : NULL,
             *tab3 = tab2 ? strchr(tab2 + 1, '\t') : NULL;
        if (!tab3) {
            bad_lines++;
            continue;
        }
        *tab1 = *tab2 = 0;
        const char *name = line, *mode = tab1 + 1;
        int64_t len = unhex(tab2 + 1, tab3, text, (int64_t)sizeof text);
        int n_want = 0;
        for (char *p = tab3 + 1, *e; n_want < MAX_CASE_IDS; p = e) {
            long v = strtol(p, &e, 10);
            if (e == p) break;
            want[n_want++] = (int32_t)v;
        }
        int special = strcmp(mode, "special") == 0;
        if (len < 0 || (!special && strcmp(mode, "plain") != 0)) {
            bad_lines++;
            continue;
        }
        vocab *v = get_vocab(name);
        if (!v) { /* a name too long, or too many vocabularies */
            bad_lines++;
            continue;
        }
        if (v->missing) {
            n_skipped++;
            continue;
        }
        unsigned flags = dhsa_tokenizer_default_flags(v->t) | (special ? DHSA_TOKENIZE_PARSE_SPECIAL : 0u);
        int64_t n = 0;
        dhsa_status st = dhsa_tokenize(v->t, text, len, flags, got, MAX_CASE_IDS, &n);
        int same = st == DHSA_OK && n == n_want && memcmp(got, want, sizeof *got * (size_t)n) == 0;
        if (!same) {
            fprintf(stderr, "  %s, specials %s, text \"", name, special ? "parsed" : "not parsed");
            for (int64_t i = 0; i < len; i++)
                fprintf(stderr, (unsigned char)text[i] < 0x20 || text[i] == '"' ? "\\x%02x" : "%c",
                        (unsigned char)text[i]);
            fprintf(stderr, "\"\n    llama.cpp:");
            for (int i = 0; i < n_want; i++) fprintf(stderr, " %d", want[i]);
            fprintf(stderr, "\n    dhsa:     ");
            for (int64_t i = 0; i < n && i < MAX_CASE_IDS; i++) fprintf(stderr, " %d", got[i]);
            fprintf(stderr, "%s\n", st ? dhsa_last_error() : "");
        }
        T_CHECK(same, "%s (%s) case %d differs from llama.cpp", name, mode, n_cases);
        n_equal += same;
        n_cases++;
        /* the same comparison with one expected id changed must fail */
        if (same && n_want > 0) {
            want[n_want / 2] ^= 1;
            caught += memcmp(got, want, sizeof *got * (size_t)n) != 0;
            tried_wrong++;
        }
    }
    fclose(f);
    if (n_skipped) T_SKIP(n_skipped, "%d cases of vocabularies that are absent (../shared)", n_skipped);
    T_CHECK(bad_lines == 0, "%s: %d malformed lines", FIXTURE, bad_lines);
    T_CHECK(n_cases + n_skipped >= 6 * 2 * 60, "%s holds %d cases (want at least 60 strings x 2 modes x 6 vocabularies)",
            FIXTURE, n_cases + n_skipped);
    T_CHECK(caught == tried_wrong, "a changed id was caught in %d of %d cases", caught, tried_wrong);
    printf("  %d of %d cases equal llama.cpp's ids (%d skipped: vocabulary absent)\n", n_equal, n_cases, n_skipped);
    for (int i = 0; i < n_vocabs; i++) dhsa_tokenizer_free(vocabs[i].t);
    return t_report("test_tokenizer_peer");
}
