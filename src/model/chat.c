/* chat.c: chat templates written by hand (no Jinja): the prompt formats of
 * Llama 3, ChatML (Qwen2, Qwen3), Gemma (2, 3), Mistral, Llama 2 and Phi-3, the detection of a
 * model's format from its GGUF metadata, and the token ids that end a turn.
 *
 * Contract: the "Chat" block of include/dhsa.h. The text never holds the
 * leading BOS (the tokenizer adds it, once, per the vocabulary's flags);
 * every other special text is written as text. dhsa_chat_tokenize turns
 * the template's own markers into their tokens and keeps the messages
 * plain text (the writer records where each message's text lies). Each
 * format and the model template it follows are in docs/chat.md.
 * Tests: tests/test_chat.c (exact strings of every format, detection from
 * GGUFs written in memory, roles and order refused, the cap/len contract).
 */
#include "core/internal.h"
#include "dhsa.h"
#include "model/tokenizer.h"
#include "util/sha256.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* --------------------------------------------------------------------- */
/* A growable output buffer                                               */

typedef struct {
    char *p;
    int64_t n, cap;
    int oom;
    /* where the messages' own text lies: [span[2k], span[2k+1]), sorted;
     * the rest is the template's (dhsa_chat_tokenize parses special tokens
     * there only) */
    int64_t *span;
    int64_t n_span, span_cap;
} sbuf;

static void put(sbuf *b, const char *s, int64_t n) {
    if (b->oom || n <= 0) return;
    if (b->n + n > b->cap) {
        int64_t c = b->cap ? b->cap : 256;
        while (c < b->n + n) c *= 2;
        char *q = realloc(b->p, (size_t)c);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = c;
    }
    memcpy(b->p + b->n, s, (size_t)n);
    b->n += n;
}

static void puts_(sbuf *b, const char *s) { put(b, s, (int64_t)strlen(s)); }

/* Records [start, end) as message text (joined to the span before it when
 * they touch). */
static void mark_content(sbuf *b, int64_t start, int64_t end) {
    if (b->oom || end <= start) return;
    if (b->n_span > 0 && b->span[2 * b->n_span - 1] == start) {
        b->span[2 * b->n_span - 1] = end;
        return;
    }
    if (b->n_span == b->span_cap) {
        int64_t c = b->span_cap ? 2 * b->span_cap : 8;
        int64_t *q = realloc(b->span, sizeof *q * 2 * (size_t)c);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->span = q;
        b->span_cap = c;
    }
    b->span[2 * b->n_span] = start;
    b->span[2 * b->n_span + 1] = end;
    b->n_span++;
}

/* A message's text (content, or a system message merged into a turn). */
static void put_content(sbuf *b, const char *s, int64_t n) {
    int64_t start = b->n;
    put(b, s, n);
    mark_content(b, start, b->n);
}

static void puts_content(sbuf *b, const char *s) { put_content(b, s, (int64_t)strlen(s)); }

/* --------------------------------------------------------------------- */
/* Trimming as Jinja's |trim and Python's str.strip() do it               */

/* Bytes of the whitespace character (Python's str.isspace) that starts
 * s[0..n), or 0. */
static int ws_at(const unsigned char *s, int64_t n) {
    if (n >= 1 && ((s[0] >= 0x09 && s[0] <= 0x0D) || (s[0] >= 0x1C && s[0] <= 0x20))) return 1;
    if (n >= 2 && s[0] == 0xC2 && (s[1] == 0x85 || s[1] == 0xA0)) return 2;
    if (n >= 3 && s[0] == 0xE1 && s[1] == 0x9A && s[2] == 0x80) return 3; /* U+1680 */
    if (n >= 3 && s[0] == 0xE2 && s[1] == 0x80 &&
        ((s[2] >= 0x80 && s[2] <= 0x8A) || s[2] == 0xA8 || s[2] == 0xA9 || s[2] == 0xAF))
        return 3; /* U+2000-200A, U+2028, U+2029, U+202F */
    if (n >= 3 && s[0] == 0xE2 && s[1] == 0x81 && s[2] == 0x9F) return 3; /* U+205F */
    if (n >= 3 && s[0] == 0xE3 && s[1] == 0x80 && s[2] == 0x80) return 3; /* U+3000 */
    return 0;
}

/* Bytes of the whitespace character that ends s[0..n), or 0. */
static int ws_before(const unsigned char *s, int64_t n) {
    for (int k = 1; k <= 3 && k <= n; k++)
        if (ws_at(s + n - k, k) == k) return k;
    return 0;
}

/* Strips s[*start..*end) in place (offsets into s). */
static void strip_span(const char *s, int64_t *start, int64_t *end) {
    const unsigned char *u = (const unsigned char *)s;
    int k;
    while (*start < *end && (k = ws_at(u + *start, *end - *start)) > 0) *start += k;
    while (*end > *start && (k = ws_before(u + *start, *end - *start)) > 0) *end -= k;
}

static void put_trimmed(sbuf *b, const char *s) {
    int64_t a = 0, e = (int64_t)strlen(s);
    strip_span(s, &a, &e);
    put_content(b, s + a, e - a);
}

/* --------------------------------------------------------------------- */
/* Roles and their order                                                  */

static int is_role(const char *r, const char *name) { return strcmp(r, name) == 0; }

/* Formats with one optional system message first, then user, assistant,
 * user, ... (GEMMA, MISTRAL, LLAMA2: their own templates raise otherwise). */
static dhsa_status check_alternating(const char *fmt, const dhsa_chat_message *m, int64_t n) {
    int64_t first = n > 0 && is_role(m[0].role, "system") ? 1 : 0;
    if (first == 1 && n == 1)
        return dhsa__fail(DHSA_ERR_INVALID_ARG,
                          "dhsa_chat_apply: %s puts the system message into the first user turn, but no user "
                          "message follows it",
                          fmt);
    for (int64_t i = first; i < n; i++) {
        const char *want = (i - first) % 2 == 0 ? "user" : "assistant";
        if (!is_role(m[i].role, want))
            return dhsa__fail(DHSA_ERR_INVALID_ARG,
                              "dhsa_chat_apply: message %lld has role '%s' where %s wants '%s' (one optional "
                              "system message first, then user and assistant in turn)",
                              (long long)i, dhsa__esc(m[i].role), fmt, want);
    }
    return DHSA_OK;
}

static dhsa_status check_roles(const char *fmt, const dhsa_chat_message *m, int64_t n, const char *const *ok) {
    for (int64_t i = 0; i < n; i++) {
        int found = 0;
        for (const char *const *r = ok; *r && !found; r++) found = is_role(m[i].role, *r);
        if (!found)
            return dhsa__fail(DHSA_ERR_INVALID_ARG,
                              "dhsa_chat_apply: message %lld has role '%s', which %s does not know", (long long)i,
                              dhsa__esc(m[i].role), fmt);
    }
    return DHSA_OK;
}

/* --------------------------------------------------------------------- */
/* The formats                                                            */

/* Meta-Llama-3-8B-Instruct: each message is
 * <|start_header_id|>role<|end_header_id|>\n\n{content|trim}<|eot_id|>. */
static void write_llama3(sbuf *b, const dhsa_chat_message *m, int64_t n, int gen) {
    for (int64_t i = 0; i < n; i++) {
        puts_(b, "<|start_header_id|>");
        puts_(b, m[i].role);
        puts_(b, "<|end_header_id|>\n\n");
        put_trimmed(b, m[i].content);
        puts_(b, "<|eot_id|>");
    }
    if (gen) puts_(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* ChatML (Qwen2-Instruct without its default system message). */
static void write_chatml(sbuf *b, const dhsa_chat_message *m, int64_t n, int gen) {
    for (int64_t i = 0; i < n; i++) {
        puts_(b, "<|im_start|>");
        puts_(b, m[i].role);
        puts_(b, "\n");
        puts_content(b, m[i].content);
        puts_(b, "<|im_end|>\n");
    }
    if (gen) puts_(b, "<|im_start|>assistant\n");
}

/* ChatML with the default system message of a model's own template:
 * Qwen2.5-Instruct's writes its system turn first, always (the given
 * system message, else its default); SmolLM2-Instruct's writes its default
 * before the first message when that is not a system message (an empty
 * conversation stays empty). The rest is ChatML. */
static const char qwen25_system[] = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
static const char smollm2_system[] = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

static void write_chatml_default_system(sbuf *b, const dhsa_chat_message *m, int64_t n, int gen, const char *sys) {
    if (n > 0 && !is_role(m[0].role, "system")) {
        puts_(b, "<|im_start|>system\n");
        puts_(b, sys);
        puts_(b, "<|im_end|>\n");
    }
    write_chatml(b, m, n, gen);
}

/* Gemma 3 (and 2, which has no system role): the system message, as is,
 * plus "\n\n" opens the first user turn; assistant is "model". */
static void write_gemma(sbuf *b, const dhsa_chat_message *m, int64_t n, int gen) {
    const char *sys = NULL;
    int64_t i = 0;
    if (n > 0 && is_role(m[0].role, "system")) sys = m[i++].content;
    for (; i < n; i++) {
        int user = is_role(m[i].role, "user");
        puts_(b, user ? "<start_of_turn>user\n" : "<start_of_turn>model\n");
        if (sys && user) {
            puts_content(b, sys);
            puts_(b, "\n\n");
            sys = NULL;
        }
        put_trimmed(b, m[i].content);
        puts_(b, "<end_of_turn>\n");
    }
    if (gen) puts_(b, "<start_of_turn>model\n");
}

/* Phi-3 (microsoft/Phi-3-mini-4k-instruct, Phi-3.5-mini-instruct; llama.cpp's
 * "phi3"): each message <|role|>\n{content}<|end|>\n, contents as they
 * are; generation prompt <|assistant|>\n. Without a generation prompt the
 * HF template ends with the EOS text; llama.cpp, and dhsa, do not. */
static void write_phi3(sbuf *b, const dhsa_chat_message *m, int64_t n, int gen) {
    for (int64_t i = 0; i < n; i++) {
        puts_(b, "<|");
        puts_(b, m[i].role);
        puts_(b, "|>\n");
        puts_content(b, m[i].content);
        puts_(b, "<|end|>\n");
    }
    if (gen) puts_(b, "<|assistant|>\n");
}

/* Mistral's v1 format (Mistral-7B-Instruct v0.1/v0.2, mistral-common's
 * InstructTokenizerV1): [INST] user [/INST] answer</s>[INST] user [/INST];
 * the system message and "\n\n" open the first user message. Contents as
 * they are. With the tokenizer's space prefix at the start and after each
 * special token this is v1's token stream exactly:
 * <s>▁[INST]▁user▁[/INST]▁answer</s>▁[INST]... */
static void write_mistral(sbuf *b, const dhsa_chat_message *m, int64_t n) {
    const char *sys = NULL;
    int64_t i = 0;
    if (n > 0 && is_role(m[0].role, "system")) sys = m[i++].content;
    for (; i < n; i++) {
        if (is_role(m[i].role, "user")) {
            puts_(b, "[INST] ");
            if (sys) {
                puts_content(b, sys);
                puts_(b, "\n\n");
                sys = NULL;
            }
            puts_content(b, m[i].content);
            puts_(b, " [/INST]");
        } else {
            puts_(b, " ");
            puts_content(b, m[i].content);
            puts_(b, "</s>");
        }
    }
}

/* Llama 2 chat (Meta's chat_completion and the HF template): each user
 * turn is <s>[INST] {strip(<<SYS>>... + content)} [/INST], each answer
 * " {strip(content)} </s>"; the first <s> is left to the tokenizer. */
static void write_llama2(sbuf *b, const dhsa_chat_message *m, int64_t n) {
    const char *sys = NULL;
    int64_t i = 0;
    if (n > 0 && is_role(m[0].role, "system")) sys = m[i++].content;
    for (int64_t turn = 0; i < n; i++) {
        if (is_role(m[i].role, "user")) {
            puts_(b, turn++ ? "<s>[INST] " : "[INST] ");
            int64_t start = b->n, first_span = b->n_span; /* strip() covers the <<SYS>> block and the content together */
            if (sys) {
                puts_(b, "<<SYS>>\n");
                puts_content(b, sys);
                puts_(b, "\n<</SYS>>\n\n");
                sys = NULL;
            }
            puts_content(b, m[i].content);
            if (!b->oom) {
                int64_t a = start, e = b->n;
                strip_span(b->p, &a, &e);
                memmove(b->p + start, b->p + a, (size_t)(e - a));
                b->n = start + (e - a);
                /* the spans of this turn move with the text; what the strip cut off goes */
                int64_t k = first_span;
                for (int64_t j = first_span; j < b->n_span; j++) {
                    int64_t lo = b->span[2 * j] < a ? a : b->span[2 * j], hi = b->span[2 * j + 1] > e ? e : b->span[2 * j + 1];
                    if (hi <= lo) continue;
                    b->span[2 * k] = lo - a + start;
                    b->span[2 * k + 1] = hi - a + start;
                    k++;
                }
                b->n_span = k;
            }
            puts_(b, " [/INST]");
        } else {
            puts_(b, " ");
            put_trimmed(b, m[i].content);
            puts_(b, " </s>");
        }
    }
}

/* --------------------------------------------------------------------- */
/* Public                                                                 */

static const char *const template_names[] = {"none",   "llama3", "chatml",  "gemma",
                                             "mistral", "llama2", "phi3", "qwen2.5", "smollm2"};

const char *dhsa_chat_template_name(dhsa_chat_template t) {
    if ((int)t < 0 || (size_t)t >= sizeof template_names / sizeof template_names[0]) return "?";
    return template_names[t];
}

dhsa_status dhsa_chat_template_from_name(const char *name, dhsa_chat_template *out) {
    if (!name || !out) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_chat_template_from_name: NULL argument");
    for (size_t i = 0; i < sizeof template_names / sizeof template_names[0]; i++)
        if (strcmp(name, template_names[i]) == 0) {
            *out = (dhsa_chat_template)i;
            return DHSA_OK;
        }
    if (strcmp(name, "qwen2") == 0) {
        *out = DHSA_CHAT_CHATML;
        return DHSA_OK;
    }
    return dhsa__fail(DHSA_ERR_UNSUPPORTED,
                      "chat template '%s' is not one dhsa writes (llama3, chatml or qwen2, qwen2.5, smollm2, "
                      "gemma, mistral, llama2, phi3, none)",
                      dhsa__esc(name));
}

/* Checks msgs and writes them in format t into b (the text and its
 * message spans). fn names the caller in errors. */
static dhsa_status chat_build(const char *fn, dhsa_chat_template t, const dhsa_chat_message *msgs, int64_t n,
                              int add_generation_prompt, sbuf *b) {
    for (int64_t i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content)
            return dhsa__fail(DHSA_ERR_INVALID_ARG, "%s: message %lld has a NULL %s", fn, (long long)i,
                              msgs[i].role ? "content" : "role");
    static const char *const roles_llama3[] = {"system", "user", "assistant", "ipython", NULL};
    static const char *const roles_chatml[] = {"system", "user", "assistant", NULL};
    const char *name = dhsa_chat_template_name(t);
    dhsa_status st;
    switch (t) {
    case DHSA_CHAT_LLAMA3: st = check_roles(name, msgs, n, roles_llama3); break;
    case DHSA_CHAT_CHATML:
    case DHSA_CHAT_SMOLLM2:
    case DHSA_CHAT_PHI3: st = check_roles(name, msgs, n, roles_chatml); break;
    case DHSA_CHAT_QWEN25:
        /* its template reads messages[0] and raises on an empty list */
        st = n == 0 ? dhsa__fail(DHSA_ERR_INVALID_ARG, "%s: qwen2.5's template needs at least one message", fn)
                    : check_roles(name, msgs, n, roles_chatml);
        break;
    case DHSA_CHAT_GEMMA:
    case DHSA_CHAT_MISTRAL:
    case DHSA_CHAT_LLAMA2: st = check_alternating(name, msgs, n); break;
    default:
        return dhsa__fail(DHSA_ERR_INVALID_ARG,
                          "%s: template %d is not a format (DHSA_CHAT_NONE means none is known: "
                          "choose one with dhsa_chat_template_from_name)",
                          fn, (int)t);
    }
    if (st) return st;
    switch (t) {
    case DHSA_CHAT_LLAMA3: write_llama3(b, msgs, n, add_generation_prompt); break;
    case DHSA_CHAT_CHATML: write_chatml(b, msgs, n, add_generation_prompt); break;
    case DHSA_CHAT_GEMMA: write_gemma(b, msgs, n, add_generation_prompt); break;
    case DHSA_CHAT_MISTRAL: write_mistral(b, msgs, n); break;
    case DHSA_CHAT_PHI3: write_phi3(b, msgs, n, add_generation_prompt); break;
    case DHSA_CHAT_QWEN25: write_chatml_default_system(b, msgs, n, add_generation_prompt, qwen25_system); break;
    case DHSA_CHAT_SMOLLM2: write_chatml_default_system(b, msgs, n, add_generation_prompt, smollm2_system); break;
    default: write_llama2(b, msgs, n); break;
    }
    if (b->oom) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    return DHSA_OK;
}

static void sbuf_free(sbuf *b) {
    free(b->p);
    free(b->span);
}

dhsa_status dhsa_chat_apply(dhsa_chat_template t, const dhsa_chat_message *msgs, int64_t n,
                            int add_generation_prompt, char *out, int64_t cap, int64_t *len) {
    if (len) *len = 0;
    if (!len || n < 0 || (!msgs && n > 0) || cap < 0 || (!out && cap > 0))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_chat_apply: len and msgs must be given, n and cap >= 0");
    sbuf b = {0};
    dhsa_status st = chat_build("dhsa_chat_apply", t, msgs, n, add_generation_prompt, &b);
    if (st) {
        sbuf_free(&b);
        return st;
    }
    *len = b.n;
    if (b.n > 0 && cap > 0) memcpy(out, b.p, (size_t)(b.n < cap ? b.n : cap));
    sbuf_free(&b);
    if (*len > cap)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_chat_apply: the prompt is %lld bytes, cap is %lld",
                          (long long)*len, (long long)cap);
    return DHSA_OK;
}

dhsa_status dhsa_chat_tokenize(dhsa_chat_template t, const dhsa_tokenizer *tok, const dhsa_chat_message *msgs,
                               int64_t n, int add_generation_prompt, unsigned flags, int32_t *ids, int64_t cap,
                               int64_t *n_ids) {
    if (n_ids) *n_ids = 0;
    if (!tok || !n_ids || n < 0 || (!msgs && n > 0) || cap < 0 || (!ids && cap > 0))
        return dhsa__fail(DHSA_ERR_INVALID_ARG,
                          "dhsa_chat_tokenize: tok, n_ids and msgs must be given, n and cap >= 0");
    if (flags & ~(DHSA_TOKENIZE_ADD_BOS | DHSA_TOKENIZE_ADD_EOS))
        return dhsa__fail(DHSA_ERR_INVALID_ARG,
                          "dhsa_chat_tokenize: flags 0x%x: only DHSA_TOKENIZE_ADD_BOS and _ADD_EOS apply (the "
                          "template's markers are always special tokens, the messages never)",
                          flags);
    sbuf b = {0};
    dhsa_status st = chat_build("dhsa_chat_tokenize", t, msgs, n, add_generation_prompt, &b);
    if (st == DHSA_OK)
        st = dhsa_tok__tokenize_plain_spans(tok, b.p ? b.p : "", b.n, flags, b.span, b.n_span, ids, cap, n_ids);
    sbuf_free(&b);
    return st;
}

/* --------------------------------------------------------------------- */
/* Detection                                                              */

static int has(const char *s, const char *marker) { return s && strstr(s, marker) != NULL; }

static int has_icase(const char *s, const char *lower_marker) {
    size_t m = strlen(lower_marker);
    for (; s && *s; s++) {
        size_t k = 0;
        while (k < m && s[k] && (s[k] | (s[k] >= 'A' && s[k] <= 'Z' ? 0x20 : 0)) == lower_marker[k]) k++;
        if (k == m) return 1;
    }
    return 0;
}

static const char *opt_str(const dhsa_gguf *g, const char *key) {
    const char *s = NULL;
    if (dhsa_gguf_find_kv(g, key) < 0 || dhsa_gguf_get_str(g, key, &s, NULL) != DHSA_OK) return NULL;
    return s;
}

static int vocab_has(const dhsa_gguf *g, const char *text) {
    dhsa_gguf_array a;
    if (dhsa_gguf_find_kv(g, "tokenizer.ggml.tokens") < 0 || dhsa_gguf_get_arr(g, "tokenizer.ggml.tokens", &a) ||
        a.type != DHSA_GGUF_STRING)
        return 0;
    const dhsa_gguf_str *s = a.data;
    int64_t n = (int64_t)strlen(text);
    for (int64_t i = 0; i < a.n; i++)
        if (s[i].len == n && memcmp(s[i].str, text, (size_t)n) == 0) return 1;
    return 0;
}

static int is_one_of(const char *s, const char *const *names) {
    for (; s && *names; names++)
        if (strcmp(s, *names) == 0) return 1;
    return 0;
}

/* The templates dhsa renders byte for byte as jinja2 renders them, by the
 * SHA-256 of their text: python/tests/test_chat_jinja.py renders each
 * with jinja2 (as transformers does) and compares with dhsa_chat_apply.
 * A template whose text differs in one byte is not in this list. */
static const struct {
    const char *sha256, *what;
    dhsa_chat_template format;
} checked_templates[] = {
    {"cd8e9439f0570856fd70470bf8889ebd8b5d1107207f67a5efb46e342330527f", "Qwen2.5-Coder-0.5B-Instruct's",
     DHSA_CHAT_QWEN25},
    {"d5495a1e5db0611132a97e46a65dbb64a642a499421228b9c8b93229097fa9a4", "Qwen2.5-Coder-1.5B-Instruct's",
     DHSA_CHAT_QWEN25},
    {"872be49dbb638044ad01b60388f48d469ff2980e5f0dccdc22ec907db54d0788", "SmolLM2-Instruct's", DHSA_CHAT_SMOLLM2},
};

/* The entry of checked_templates for the template text s[0..n), or -1. */
static int checked_index(const char *s, int64_t n) {
    dhsa_sha256 h;
    char hex[65];
    dhsa_sha256_init(&h);
    dhsa_sha256_update(&h, s, (size_t)n);
    dhsa_sha256_final_hex(&h, hex);
    for (size_t i = 0; i < sizeof checked_templates / sizeof checked_templates[0]; i++)
        if (strcmp(hex, checked_templates[i].sha256) == 0) return (int)i;
    return -1;
}

/* The format of a template text by its markers, in llama.cpp's order. */
static dhsa_chat_template by_markers(const char *tmpl) {
    /* Phi-4 (architecture phi3) separates role and content with
     * <|im_sep|>, not a newline: a format not written here */
    if (has(tmpl, "<|im_start|>")) return has(tmpl, "<|im_sep|>") ? DHSA_CHAT_NONE : DHSA_CHAT_CHATML;
    if (has(tmpl, "[INST]")) {
        if (has(tmpl, "<<SYS>>")) return DHSA_CHAT_LLAMA2;
        /* Mistral's v3 and v7 formats ([AVAILABLE_TOOLS], [SYSTEM_PROMPT])
         * space [INST] differently: not written here */
        if (has(tmpl, "[SYSTEM_PROMPT]") || has(tmpl, "[AVAILABLE_TOOLS]")) return DHSA_CHAT_NONE;
        return DHSA_CHAT_MISTRAL;
    }
    if (has(tmpl, "<|assistant|>") && has(tmpl, "<|end|>")) return DHSA_CHAT_PHI3;
    if (has(tmpl, "<start_of_turn>")) return DHSA_CHAT_GEMMA;
    if (has(tmpl, "<|start_header_id|>") && has(tmpl, "<|end_header_id|>")) return DHSA_CHAT_LLAMA3;
    return DHSA_CHAT_NONE;
}

dhsa_status dhsa_chat_choose(const dhsa_gguf *g, dhsa_chat_template *out, const char **how) {
    if (out) *out = DHSA_CHAT_NONE;
    if (how) *how = NULL;
    if (!g || !out || !how) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_chat_choose: NULL argument");
    const char *tmpl = NULL;
    int64_t len = 0;
    if (dhsa_gguf_find_kv(g, "tokenizer.chat_template") >= 0 &&
        dhsa_gguf_get_str(g, "tokenizer.chat_template", &tmpl, &len) == DHSA_OK) {
        int k = checked_index(tmpl, len);
        if (k >= 0) {
            *out = checked_templates[k].format;
            *how = "the file's tokenizer.chat_template, checked against jinja2";
            return DHSA_OK;
        }
        dhsa_chat_template near = by_markers(tmpl);
        dhsa_sha256 h;
        char hex[65];
        dhsa_sha256_init(&h);
        dhsa_sha256_update(&h, tmpl, (size_t)len);
        dhsa_sha256_final_hex(&h, hex);
        hex[12] = 0;
        *out = near;
        if (near == DHSA_CHAT_NONE)
            return dhsa__fail(DHSA_ERR_UNSUPPORTED,
                              "the model's chat template (tokenizer.chat_template, %llu bytes, sha256 %s...) is "
                              "not one dhsa renders: give --template NAME (llama3, chatml, qwen2.5, smollm2, gemma, "
                              "mistral, llama2, phi3) or --template plain",
                              (unsigned long long)len, hex);
        return dhsa__fail(DHSA_ERR_UNSUPPORTED,
                          "the model's chat template (tokenizer.chat_template, %llu bytes, sha256 %s...) looks like "
                          "%s but is not one dhsa has checked to render exactly (docs/chat.md): give --template %s "
                          "to use dhsa's %s format anyway, or --template plain",
                          (unsigned long long)len, hex, dhsa_chat_template_name(near), dhsa_chat_template_name(near),
                          dhsa_chat_template_name(near));
    }
    dhsa_chat_template t = dhsa_chat_detect(g);
    *out = t;
    if (t == DHSA_CHAT_NONE) {
        const char *arch = opt_str(g, "general.architecture");
        return dhsa__fail(DHSA_ERR_UNSUPPORTED,
                          "the model has no chat template (no tokenizer.chat_template; architecture %s has no "
                          "known format): give --template NAME (llama3, chatml, qwen2.5, smollm2, gemma, mistral, "
                          "llama2, phi3) or --template plain",
                          arch ? dhsa__esc(arch) : "(none)");
    }
    *how = "by the architecture: the file has no tokenizer.chat_template";
    return DHSA_OK;
}

dhsa_chat_template dhsa_chat_detect(const dhsa_gguf *g) {
    if (!g) return DHSA_CHAT_NONE;
    const char *tmpl = NULL;
    int64_t len = 0;
    if (dhsa_gguf_find_kv(g, "tokenizer.chat_template") >= 0 &&
        dhsa_gguf_get_str(g, "tokenizer.chat_template", &tmpl, &len) == DHSA_OK) {
        int k = checked_index(tmpl, len);
        return k >= 0 ? checked_templates[k].format : by_markers(tmpl);
    }
    static const char *const qwen[] = {"qwen", "qwen2", "qwen2moe", "qwen3", "qwen3moe", NULL};
    static const char *const gemma[] = {"gemma", "gemma2", "gemma3", NULL};
    const char *arch = opt_str(g, "general.architecture");
    if (is_one_of(arch, qwen)) return DHSA_CHAT_CHATML;
    if (is_one_of(arch, gemma)) return DHSA_CHAT_GEMMA;
    if (arch && strcmp(arch, "phi3") == 0) return DHSA_CHAT_PHI3;
    if (arch && strcmp(arch, "llama") == 0) {
        if (vocab_has(g, "<|start_header_id|>")) return DHSA_CHAT_LLAMA3;
        if (has_icase(opt_str(g, "general.name"), "mistral") || has_icase(opt_str(g, "general.basename"), "mistral"))
            return DHSA_CHAT_MISTRAL;
        return DHSA_CHAT_LLAMA2;
    }
    return DHSA_CHAT_NONE;
}

/* --------------------------------------------------------------------- */
/* Stop tokens                                                            */

dhsa_status dhsa_chat_stop_ids(dhsa_chat_template t, const dhsa_tokenizer *tok, int32_t *ids, int cap, int *n) {
    if (n) *n = 0;
    if (!tok || !n || cap < 0 || (!ids && cap > 0))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_chat_stop_ids: tok and n must be given, cap >= 0");
    static const char *const llama3[] = {"<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", NULL};
    static const char *const chatml[] = {"<|im_end|>", "<|endoftext|>", NULL};
    static const char *const gemma[] = {"<end_of_turn>", "<eos>", NULL};
    static const char *const phi3[] = {"<|end|>", "<|endoftext|>", NULL};
    static const char *const sentencepiece[] = {"</s>", NULL};
    static const char *const none[] = {NULL};
    const char *const *texts;
    switch (t) {
    case DHSA_CHAT_NONE: texts = none; break;
    case DHSA_CHAT_LLAMA3: texts = llama3; break;
    case DHSA_CHAT_CHATML:
    case DHSA_CHAT_QWEN25:
    case DHSA_CHAT_SMOLLM2: texts = chatml; break;
    case DHSA_CHAT_GEMMA: texts = gemma; break;
    case DHSA_CHAT_PHI3: texts = phi3; break;
    case DHSA_CHAT_MISTRAL:
    case DHSA_CHAT_LLAMA2: texts = sentencepiece; break;
    default: return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_chat_stop_ids: template %d is out of range", (int)t);
    }
    int32_t found[8];
    int k = 0;
    int32_t eos = dhsa_tokenizer_eos(tok);
    if (eos >= 0) found[k++] = eos;
    for (; *texts; texts++) {
        int32_t id = dhsa_tok__find(tok, *texts, (int64_t)strlen(*texts));
        int dup = id < 0;
        for (int j = 0; j < k && !dup; j++) dup = found[j] == id;
        if (!dup) found[k++] = id;
    }
    *n = k;
    for (int j = 0; j < k && j < cap; j++) ids[j] = found[j];
    if (k > cap)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_chat_stop_ids: %d stop ids, cap is %d", k, cap);
    return DHSA_OK;
}
