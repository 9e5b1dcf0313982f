/* tokenizer_fuzz.c: libFuzzer harness for tokenizer input text
 * (dhsa_tokenize / dhsa_detokenize, src/model/tokenizer.c). The
 * vocabularies are loaded once (LLVMFuzzerInitialize): every .gguf file
 * in $DHSA_SHARED/vocab (default ../shared; vocabulary-only GGUF files
 * from llama.cpp), the shipped model's (models/dhsa-retrieval-8m-q8_0.gguf)
 * and $DHSA_SHARED/models/stories260K.gguf; an absent one is skipped, and
 * said so. Each input is tokenized as text by every vocabulary, plain and
 * with the default flags and special tokens parsed.
 *
 * Contracts checked (a broken one aborts so libFuzzer keeps the input):
 * ids = NULL, cap = 0 sizes the buffer (the full count, INVALID_ARG when
 * above 0) and a second call with that cap gives the same count; the count
 * is at most dhsa_tokenize_max_ids(len); every id lies in the vocabulary;
 * detokenize sizes itself the same way; and, plain (no BOS/EOS, specials
 * not parsed), detokenize(tokenize(x)) == x as include/dhsa.h promises,
 * except in the lossy cases docs/tokenizer.md names: a literal U+2581 in
 * SPM text, text that became unk (SPM), and in BPE invalid UTF-8 (read as
 * U+FFFD, as llama.cpp does) or a byte the vocabulary has no token for
 * (dropped, as llama.cpp does).
 *
 * Run: make fuzz (FUZZ_SECONDS per harness); seeds: the test strings of
 * ../shared/vocab (the .inp files) and a few texts the Makefile writes.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dhsa.h"

#define MAX_VOCABS 32

static struct {
    char name[256];
    dhsa_tokenizer *t;
    unsigned char lacks[256]; /* BPE: a byte of valid UTF-8 the vocabulary has no token for (dropped) */
} vocabs[MAX_VOCABS];
static int n_vocabs;

/* Strict UTF-8 (no overlong forms, surrogates or code points above U+10FFFF). */
static int valid_utf8(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int k = c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2 : c >= 0xF0 && c <= 0xF4 ? 3 : -1;
        if (k < 0 || i + (size_t)k >= n) return 0;
        unsigned long cp = c & (0x7Fu >> k);
        for (int j = 1; j <= k; j++) {
            if ((s[i + j] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + j] & 0x3F);
        }
        static const unsigned long min_cp[4] = {0, 0x80, 0x800, 0x10000};
        if (cp < min_cp[k] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        i += (size_t)k + 1;
    }
    return 1;
}

/* Which bytes of valid UTF-8 a BPE vocabulary drops: a one-character text
 * holding the byte that does not come back. */
static void find_lacking_bytes(int v) {
    for (int b = 0; b < 256; b++) {
        uint8_t probe[4];
        size_t n = 0;
        if (b < 0x80) probe[n++] = (uint8_t)b;
        else if (b < 0xC0) probe[n++] = 0xC2, probe[n++] = (uint8_t)b;
        else if (b >= 0xC2 && b <= 0xDF) probe[n++] = (uint8_t)b, probe[n++] = 0x80;
        else if (b >= 0xE1 && b <= 0xEC) probe[n++] = (uint8_t)b, probe[n++] = 0x80, probe[n++] = 0x80;
        else if (b >= 0xF1 && b <= 0xF3) probe[n++] = (uint8_t)b, probe[n++] = 0x80, probe[n++] = 0x80, probe[n++] = 0x80;
        else continue; /* never in valid UTF-8, or only with other continuation bytes: E0 ED EE EF F0 F4 */
        int32_t ids[16];
        int64_t k = 0, len = 0;
        char back[64];
        if (dhsa_tokenize(vocabs[v].t, (const char *)probe, (int64_t)n, 0, ids, 16, &k) != DHSA_OK ||
            dhsa_detokenize(vocabs[v].t, ids, k, 0, back, sizeof back, &len) != DHSA_OK || len != (int64_t)n ||
            memcmp(back, probe, n) != 0)
            vocabs[v].lacks[b] = 1;
    }
}

static void add_vocab(const char *path) {
    if (n_vocabs == MAX_VOCABS) return;
    dhsa_gguf *g;
    if (dhsa_gguf_open(path, &g) != DHSA_OK) {
        fprintf(stderr, "tokenizer_fuzz: SKIP %s: %s\n", path, dhsa_last_error());
        return;
    }
    dhsa_tokenizer *t;
    dhsa_status st = dhsa_tokenizer_from_gguf(g, &t);
    dhsa_gguf_close(g);
    if (st != DHSA_OK) {
        fprintf(stderr, "tokenizer_fuzz: SKIP %s: %s\n", path, dhsa_last_error());
        return;
    }
    snprintf(vocabs[n_vocabs].name, sizeof vocabs[n_vocabs].name, "%s", path);
    vocabs[n_vocabs].t = t;
    if (dhsa_tokenizer_kind_of(t) == DHSA_TOKENIZER_BPE) find_lacking_bytes(n_vocabs);
    n_vocabs++;
    fprintf(stderr, "tokenizer_fuzz: %s (%s, %lld tokens)\n", path,
            dhsa_tokenizer_kind_of(t) == DHSA_TOKENIZER_SPM ? "SPM" : "BPE", (long long)dhsa_tokenizer_n_vocab(t));
}

static void add_if_present(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "tokenizer_fuzz: SKIP %s: absent\n", path);
        return;
    }
    fclose(f);
    add_vocab(path);
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *shared = getenv("DHSA_SHARED");
    if (!shared || !shared[0]) shared = "../shared";
    char dir[1024], path[2048];
    snprintf(dir, sizeof dir, "%s/vocab", shared);
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "tokenizer_fuzz: SKIP the llama.cpp vocabularies: %s is absent\n", dir);
    } else {
        char *names[MAX_VOCABS];
        int n = 0;
        for (struct dirent *e; (e = readdir(d)) && n < MAX_VOCABS;) {
            size_t len = strlen(e->d_name);
            if (len > 5 && strcmp(e->d_name + len - 5, ".gguf") == 0) names[n++] = strdup(e->d_name);
        }
        closedir(d);
        qsort(names, (size_t)n, sizeof names[0], by_name); /* same order every run */
        for (int i = 0; i < n; i++) {
            snprintf(path, sizeof path, "%s/%s", dir, names[i]);
            add_vocab(path);
            free(names[i]);
        }
    }
    add_if_present("models/dhsa-retrieval-8m-q8_0.gguf");
    snprintf(path, sizeof path, "%s/models/stories260K.gguf", shared);
    add_if_present(path);
    if (n_vocabs == 0) {
        fprintf(stderr, "tokenizer_fuzz: no vocabulary found (run from the repository root)\n");
        abort();
    }
    return 0;
}

static void contract(int ok, const char *vocab, const char *what) {
    if (ok) return;
    fprintf(stderr, "tokenizer_fuzz: %s: broken contract: %s (last error: \"%s\")\n", vocab, what,
            dhsa_last_error());
    abort();
}

/* Tokenizes text with flags, checking the sizing contract; returns the
 * ids (malloc'd, at least one slot) and their count in *n. */
static int32_t *tokenize_checked(int v, const char *text, int64_t len, unsigned flags, int64_t *n) {
    const dhsa_tokenizer *t = vocabs[v].t;
    const char *name = vocabs[v].name;
    int64_t need = -1;
    dhsa_status st = dhsa_tokenize(t, text, len, flags, NULL, 0, &need);
    contract(st == (need > 0 ? DHSA_ERR_INVALID_ARG : DHSA_OK), name,
             "ids = NULL, cap = 0: OK for no ids, else INVALID_ARG");
    contract(need >= 0 && need <= dhsa_tokenize_max_ids(len), name, "the count is within dhsa_tokenize_max_ids");
    int32_t *ids = malloc(sizeof *ids * (size_t)(need + 1));
    contract(ids != NULL, name, "malloc");
    int64_t got = -1;
    contract(dhsa_tokenize(t, text, len, flags, ids, need, &got) == DHSA_OK && got == need, name,
             "a second call with the sized buffer gives the same count");
    for (int64_t i = 0; i < got; i++)
        contract(ids[i] >= 0 && ids[i] < dhsa_tokenizer_n_vocab(t), name, "every id lies in the vocabulary");
    *n = got;
    return ids;
}

/* Detokenizes with flags, checking the sizing contract; returns the bytes
 * (malloc'd) and their count in *len. */
static char *detokenize_checked(int v, const int32_t *ids, int64_t n, unsigned flags, int64_t *len) {
    const dhsa_tokenizer *t = vocabs[v].t;
    const char *name = vocabs[v].name;
    int64_t need = -1;
    dhsa_status st = dhsa_detokenize(t, ids, n, flags, NULL, 0, &need);
    contract(st == (need > 0 ? DHSA_ERR_INVALID_ARG : DHSA_OK) && need >= 0, name,
             "detokenize with cap = 0: OK for no bytes, else INVALID_ARG");
    char *out = malloc((size_t)need + 1);
    contract(out != NULL, name, "malloc");
    int64_t got = -1;
    contract(dhsa_detokenize(t, ids, n, flags, out, need, &got) == DHSA_OK && got == need, name,
             "detokenize into the sized buffer gives the same length");
    *len = got;
    return out;
}

static void dump(const char *what, const void *p, int64_t n) {
    fprintf(stderr, "  %s (%lld bytes):", what, (long long)n);
    for (int64_t i = 0; i < n && i < 256; i++) fprintf(stderr, " %02x", ((const uint8_t *)p)[i]);
    fprintf(stderr, "%s\n", n > 256 ? " ..." : "");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *text = (const char *)data;
    const int64_t len = (int64_t)size;
    int has_meta = 0; /* a literal U+2581 ('\u2581' in UTF-8) */
    for (size_t i = 0; i + 2 < size && !has_meta; i++) has_meta = memcmp(data + i, "\xE2\x96\x81", 3) == 0;
    const int utf8_ok = valid_utf8(data, size);
    for (int v = 0; v < n_vocabs; v++) {
        const dhsa_tokenizer *t = vocabs[v].t;
        const int spm = dhsa_tokenizer_kind_of(t) == DHSA_TOKENIZER_SPM;

        /* plain text: the round trip */
        int64_t n;
        int32_t *ids = tokenize_checked(v, text, len, 0, &n);
        int lossy = spm && has_meta;
        if (spm) {
            for (int64_t i = 0; i < n; i++) lossy |= ids[i] == dhsa_tokenizer_unk(t);
        } else { /* BPE reads invalid UTF-8 as U+FFFD and drops a byte it has no token for */
            lossy |= !utf8_ok;
            for (size_t i = 0; i < size && !lossy; i++) lossy |= vocabs[v].lacks[data[i]];
        }
        int64_t back_len;
        char *back = detokenize_checked(v, ids, n, 0, &back_len);
        if (!lossy && (back_len != len || memcmp(back, text, (size_t)len) != 0)) {
            dump("text", text, len);
            dump("detokenized", back, back_len);
            contract(0, vocabs[v].name, "detokenize(tokenize(x)) == x");
        }
        free(back);
        free(ids);

        /* the default flags with special tokens parsed: sizes and ranges */
        unsigned flags = dhsa_tokenizer_default_flags(t) | DHSA_TOKENIZE_PARSE_SPECIAL;
        ids = tokenize_checked(v, text, len, flags, &n);
        back = detokenize_checked(v, ids, n, DHSA_DETOKENIZE_SPECIAL | DHSA_DETOKENIZE_KEEP_SPACE, &back_len);
        free(back);
        free(ids);
    }
    return 0;
}
