/* test_chat_peer.c: the chat templates of the real models (models/catalog)
 * against llama.cpp.
 *
 * tests/chat_peer.tsv holds, for SmolLM2-135M-Instruct and
 * Qwen2.5-Coder-0.5B-Instruct, their GGUF files' tokenizer.chat_template
 * and architecture, and for gemma-3-270m (whose file has no template) its
 * architecture; then 7 conversations per model (system or not, multi-turn,
 * with and without the generation prompt, whitespace around contents,
 * non-Latin scripts and emoji, code) as llama.cpp's
 * llama_chat_apply_template formats them (bench/chat_peer.py wrote it).
 * Here each template is put in a GGUF written in memory with its
 * architecture, dhsa_chat_detect must find the format (smollm2, qwen2.5:
 * ChatML with the template's default system message; Gemma's turns), and
 * dhsa_chat_apply must write llama.cpp's text byte for byte (plain ChatML
 * where the conversation has no system message: llama.cpp's built-in
 * chatml leaves out the default one that the templates, and dhsa, add;
 * python/tests/test_chat_jinja.py checks those against jinja2). When the pulled files are in $DHSA_MODELS (dhsa pull), detection
 * is checked on them too (skipped, saying so, otherwise). A wrong
 * expectation is caught (the generation prompt flipped).
 * Run: make test, or build/tests/test_chat_peer (from the repository root).
 */
#include "dhsa.h"
#include "t.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FIXTURE "tests/chat_peer.tsv"
#define MAX_LINE (1 << 16)

typedef struct {
    char name[64], arch[32], file[128];
    dhsa_chat_template want, got;
} model;

static model models[] = {
    {"smollm2-135m-instruct", "", "SmolLM2-135M-Instruct.Q4_1.gguf", DHSA_CHAT_SMOLLM2, DHSA_CHAT_NONE},
    {"qwen2.5-coder-0.5b-instruct", "", "qwen2.5-coder-0.5b-instruct-q8_0.gguf", DHSA_CHAT_QWEN25, DHSA_CHAT_NONE},
    {"gemma-3-270m", "", "gemma-3-270m-q4_k_m.gguf", DHSA_CHAT_GEMMA, DHSA_CHAT_NONE},
};
#define N_MODELS 3

static model *find_model(const char *name) {
    for (int i = 0; i < N_MODELS; i++)
        if (strcmp(models[i].name, name) == 0) return &models[i];
    return NULL;
}

/* Decodes hex in place; returns the length, -1 on a bad digit. */
static long unhex(char *s) {
    long n = 0;
    for (const char *p = s; p[0] && p[1]; p += 2) {
        unsigned v;
        if (sscanf(p, "%2x", &v) != 1) return -1;
        s[n++] = (char)v;
    }
    s[n] = 0;
    return n;
}

/* dhsa_chat_detect on a GGUF with arch and tmpl ("" for none); with st
 * set, dhsa_chat_choose's status goes there and its sentence into err. */
static dhsa_chat_template detect_or_choose(const char *arch, const char *tmpl, dhsa_status *choose_st, char *err,
                                           size_t err_cap) {
    dhsa_gguf_writer *w = NULL;
    dhsa_gguf *g = NULL;
    void *buf = NULL;
    size_t size = 0;
    dhsa_chat_template t = DHSA_CHAT_NONE;
    dhsa_status st = dhsa_gguf_writer_create(&w);
    if (!st && tmpl[0]) st = dhsa_gguf_writer_set_str(w, "tokenizer.chat_template", tmpl);
    if (!st) st = dhsa_gguf_writer_set_str(w, "general.architecture", arch);
    if (!st) st = dhsa_gguf_writer_size(w, &size);
    if (!st && !(buf = malloc(size))) st = DHSA_ERR_OUT_OF_MEMORY;
    if (!st) st = dhsa_gguf_writer_write_memory(w, buf, size);
    if (!st) st = dhsa_gguf_open_memory(buf, size, &g);
    if (!st) t = dhsa_chat_detect(g);
    if (!st && choose_st) {
        dhsa_chat_template c;
        const char *how;
        *choose_st = dhsa_chat_choose(g, &c, &how);
        snprintf(err, err_cap, "%s", *choose_st ? dhsa_last_error() : how);
        if (!*choose_st && c != t) *choose_st = DHSA_ERR_INVALID_ARG; /* caught below */
    }
    dhsa_gguf_close(g);
    dhsa_gguf_writer_free(w);
    free(buf);
    return t;
}

static dhsa_chat_template detect_from(const char *arch, const char *tmpl) {
    return detect_or_choose(arch, tmpl, NULL, NULL, 0);
}

/* dhsa_chat_apply's text, NUL-terminated (malloc'd), or NULL. */
static char *apply(dhsa_chat_template t, const dhsa_chat_message *m, int64_t n, int gen, int64_t *len) {
    *len = 0;
    dhsa_chat_apply(t, m, n, gen, NULL, 0, len);
    char *s = malloc((size_t)*len + 1);
    if (!s || dhsa_chat_apply(t, m, n, gen, s, *len, len) != DHSA_OK) {
        free(s);
        return NULL;
    }
    s[*len] = 0;
    return s;
}

int main(void) {
    FILE *f = fopen(FIXTURE, "r");
    T_CHECK(f != NULL, "%s opens (run from the repository root)", FIXTURE);
    if (!f) return t_report("test_chat_peer");
    char *line = malloc(MAX_LINE);
    int cases = 0, bad = 0, caught = 0;
    while (line && fgets(line, MAX_LINE, f)) {
        if (line[0] == '#') continue;
        line[strcspn(line, "\n")] = 0;
        char *fields[5] = {0};
        int nf = 0;
        for (char *p = line, *tab; nf < 5 && p; p = tab ? tab + 1 : NULL) {
            tab = strchr(p, '\t');
            if (tab) *tab = 0;
            fields[nf++] = p;
        }
        if (fields[0][0] == 'T' && nf == 4) {
            model *m = find_model(fields[1]);
            if (!m || unhex(fields[3]) < 0) continue;
            snprintf(m->arch, sizeof m->arch, "%s", fields[2]);
            m->got = detect_from(fields[2], fields[3]);
            T_CHECK(m->got == m->want, "%s: template detected as %d, want %d", m->name, (int)m->got, (int)m->want);
            if (fields[3][0]) { /* the file's template is checked; one byte changed, it is refused */
                dhsa_status cst = DHSA_OK;
                char err[1024];
                detect_or_choose(fields[2], fields[3], &cst, err, sizeof err);
                T_CHECK(cst == DHSA_OK && strstr(err, "checked against jinja2"), "%s: chosen: %s", m->name, err);
                fields[3][strlen(fields[3]) - 1] ^= 1;
                detect_or_choose(fields[2], fields[3], &cst, err, sizeof err);
                T_CHECK(cst == DHSA_ERR_UNSUPPORTED && strstr(err, "looks like chatml") && strstr(err, "--template chatml") &&
                            strstr(err, "--template plain"),
                        "%s: the template with one byte changed is refused by name: %s", m->name, err);
                fields[3][strlen(fields[3]) - 1] ^= 1;
            }
        } else if (fields[0][0] == 'C' && nf == 5) {
            model *m = find_model(fields[1]);
            long nm = unhex(fields[3]), ne = unhex(fields[4]);
            if (!m || nm < 0 || ne < 0) {
                bad++;
                continue;
            }
            /* role \x1f content \x1e role \x1f content ... */
            dhsa_chat_message msg[16];
            int64_t n = 0;
            for (char *p = fields[3]; p && n < 16;) {
                char *rs = strchr(p, '\x1e'), *us = strchr(p, '\x1f');
                if (rs) *rs = 0;
                if (!us) break;
                *us = 0;
                msg[n].role = p;
                msg[n].content = us + 1;
                n++;
                p = rs ? rs + 1 : NULL;
            }
            int gen = atoi(fields[2]);
            int64_t len;
            /* llama.cpp's built-in chatml leaves out the default system
             * message the files' templates (Qwen2.5's, SmolLM2's) add when
             * the conversation has none; dhsa writes it as the templates do
             * (python/tests/test_chat_jinja.py checks that against jinja2),
             * so those conversations are compared with plain chatml */
            dhsa_chat_template fmt = m->got;
            if ((fmt == DHSA_CHAT_QWEN25 || fmt == DHSA_CHAT_SMOLLM2) && (n == 0 || strcmp(msg[0].role, "system") != 0))
                fmt = DHSA_CHAT_CHATML;
            char *got = apply(fmt, msg, n, gen, &len);
            cases++;
            if (!got || len != ne || memcmp(got, fields[4], (size_t)ne) != 0) {
                bad++;
                fprintf(stderr, "  %s (gen %d): dhsa wrote\n%s\n  llama.cpp wrote\n%s\n", m->name, gen,
                        got ? got : "(error)", fields[4]);
            }
            free(got);
            /* the comparison can fail: the generation prompt flipped differs */
            got = apply(fmt, msg, n, !gen, &len);
            caught += got && (len != ne || memcmp(got, fields[4], (size_t)ne) != 0);
            free(got);
        }
    }
    free(line);
    fclose(f);
    T_CHECK(cases == 21 && bad == 0, "%d of %d conversations formatted as llama.cpp does", cases - bad, cases);
    T_CHECK(caught == cases, "a flipped generation prompt is caught in %d of %d", caught, cases);

    /* the pulled files themselves */
    const char *dir = getenv("DHSA_MODELS");
    char def[1024];
    if (!dir || !dir[0]) {
        snprintf(def, sizeof def, "%s/.cache/dhsa/models", getenv("HOME") ? getenv("HOME") : ".");
        dir = def;
    }
    for (int i = 0; i < N_MODELS; i++) {
        char path[1400];
        snprintf(path, sizeof path, "%s/%s", dir, models[i].file);
        dhsa_gguf *g = NULL;
        if (dhsa_gguf_open(path, &g) != DHSA_OK) {
            T_SKIP(1, "%s is not pulled (dhsa pull %s): its template detected from the fixture only", models[i].name,
                   models[i].name);
            continue;
        }
        dhsa_chat_template t = dhsa_chat_detect(g);
        dhsa_gguf_close(g);
        T_CHECK(t == models[i].want, "%s (%s): detected %d, want %d", models[i].name, path, (int)t,
                (int)models[i].want);
    }
    return t_report("test_chat_peer");
}
