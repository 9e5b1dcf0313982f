/* chat.c: `dhsa chat`, a conversation over documents (docs/prompt-cache.md,
 * "dhsa chat"). The documents go into the first user turn, prefilled once
 * at the start (or loaded from --prompt-cache); each question renders the
 * whole conversation with the model's chat template and evaluates only
 * what follows the tokens the session already holds (the KV cache and the
 * DHSA routing indexes are kept: dhsa_session_truncate to the common
 * prefix), so a question over a long document costs its own tokens, not
 * the document's. Commands: /add FILE, /clear, /save FILE, /stats, /quit.
 * Line editing with libedit or GNU readline when the build found one and
 * stdin is a terminal; otherwise lines are read as they come (scripts).
 * Tested by tests/test_cli_state.c.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "dhsa.h"

#if defined(DHSA_HAVE_LIBEDIT)
#include <editline/readline.h>
#define LINE_EDITING "libedit"
#elif defined(DHSA_HAVE_READLINE)
#include <readline/history.h>
#include <readline/readline.h>
#define LINE_EDITING "GNU readline"
#else
#define LINE_EDITING NULL
#endif

#define EXIT_RUN DHSA_EXIT_RUN
#define EXIT_USAGE DHSA_EXIT_USAGE
#define MAX_DOCS 64

const char dhsa_cli_chat_usage[] =
    "usage: dhsa chat [-m MODEL] [-f DOCUMENT ...] [options]\n"
    "\n"
    "A conversation over documents: they go into the first user turn and are\n"
    "prefilled once; each question then evaluates only its own tokens (the KV\n"
    "cache and DHSA index are kept). One question per line; the answer streams\n"
    "to stdout, then the time to its first token on stderr. Commands:\n"
    "  /add FILE    add a document (to the next question's turn once the\n"
    "               conversation has begun)\n"
    "  /clear       forget the conversation, keep the documents (and their cache)\n"
    "  /save FILE   save the session's state (a --prompt-cache file)\n"
    "  /stats       tokens in the context, memory, reuse, timings\n"
    "  /quit        (or end of input)\n"
    "Options:\n"
    "  -m MODEL            GGUF file (default: the shipped models/" DHSA_DEFAULT_MODEL ")\n"
    "  -f FILE             a document (repeat for several)\n"
    "  --prompt-cache FILE load the documents' prefill from FILE when it matches\n"
    "                      (model, options, tokens), else prefill and save it there\n"
    "  --system TEXT       system message\n"
    "  --template NAME     chat format: llama3 chatml qwen2.5 smollm2 gemma mistral\n"
    "                      llama2 phi3 (default: the model's own template when dhsa\n"
    "                      renders it exactly, else refused: docs/chat.md)\n"
    "  -n N                most tokens per answer (default 512)\n"
    "  --temp T            0 = greedy (default 0)  --seed S (default 42)\n"
    "  --top-k K, --top-p P, --min-p P, --repeat-penalty R as in dhsa run\n"
    "  --json              every answer is one JSON object (constrained sampling)\n"
    "  --json-schema S     every answer is JSON valid under the schema S (JSON\n"
    "                      text or a file; docs/server.md lists what is supported)\n"
    "  --ctx N             context (default: the trained one)\n"
    "  --ubatch N, --kv f32|f16|q8_0, --exact, --mem-limit SIZE, --threads T\n"
    "  --attn dense|dhsa|block|stream, --density F | --budget N, --dense-below N\n"
    "                      as in dhsa run\n"
    "  --verbose           the model, the plan, the chat template\n";

typedef struct {
    const char *model, *system, *template_name, *prompt_cache;
    const char *docs[MAX_DOCS];
    int n_docs, verbose;
    int json;                /* --json or --json-schema */
    const char *json_schema; /* --json-schema's argument */
    int64_t n_predict, threads;
    dhsa_sampler_params sp;
    dhsa_session_params ses;
} chat_opts;

static void parse(int argc, char **argv, chat_opts *o) {
    memset(o, 0, sizeof *o);
    o->n_predict = 512;
    o->sp = dhsa_sampler_default_params();
    o->sp.temperature = 0;
    o->ses = dhsa_session_default_params();
    int density = 0, budget = 0;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(dhsa_cli_chat_usage, stdout);
            exit(0);
        }
        if (strcmp(a, "--exact") == 0) { o->ses.exact = 1; continue; }
        if (strcmp(a, "--verbose") == 0 || strcmp(a, "-v") == 0) { o->verbose = 1; continue; }
        if (strcmp(a, "--json") == 0) {
            if (o->json) dhsa_cli_die(EXIT_USAGE, "--json and --json-schema: give one of them");
            o->json = 1;
            continue;
        }
        if (i + 1 >= argc) dhsa_cli_die(EXIT_USAGE, "%s needs a value (or is unknown: see dhsa help chat)", a);
        const char *v = argv[++i];
        if (strcmp(a, "-m") == 0 || strcmp(a, "--model") == 0) o->model = v;
        else if (strcmp(a, "-f") == 0 || strcmp(a, "--file") == 0) {
            if (o->n_docs == MAX_DOCS) dhsa_cli_die(EXIT_USAGE, "at most %d documents", MAX_DOCS);
            o->docs[o->n_docs++] = v;
        } else if (strcmp(a, "--prompt-cache") == 0) {
            if (!v[0]) dhsa_cli_die(EXIT_USAGE, "--prompt-cache needs a file name");
            o->prompt_cache = v;
        } else if (strcmp(a, "--system") == 0) o->system = v;
        else if (strcmp(a, "--json-schema") == 0) {
            if (o->json) dhsa_cli_die(EXIT_USAGE, "--json and --json-schema: give one of them");
            o->json = 1;
            o->json_schema = v;
        }
        else if (strcmp(a, "--template") == 0) o->template_name = v;
        else if (strcmp(a, "-n") == 0) o->n_predict = dhsa_cli_int(a, v, 1, (int64_t)1 << 31, 1);
        else if (strcmp(a, "--temp") == 0) o->sp.temperature = (float)dhsa_cli_real(a, v, 0, 1e6);
        else if (strcmp(a, "--top-k") == 0) o->sp.top_k = dhsa_cli_int(a, v, 0, (int64_t)1 << 24, 0);
        else if (strcmp(a, "--top-p") == 0) o->sp.top_p = (float)dhsa_cli_real(a, v, 1e-9, 1);
        else if (strcmp(a, "--min-p") == 0) o->sp.min_p = (float)dhsa_cli_real(a, v, 0, 1);
        else if (strcmp(a, "--repeat-penalty") == 0) o->sp.repeat_penalty = (float)dhsa_cli_real(a, v, 1e-6, 1e6);
        else if (strcmp(a, "--seed") == 0) o->sp.seed = (uint64_t)dhsa_cli_int(a, v, 0, INT64_MAX, 0);
        else if (strcmp(a, "--threads") == 0 || strcmp(a, "-t") == 0) o->threads = dhsa_cli_threads(a, v);
        else if (strcmp(a, "--ctx") == 0 || strcmp(a, "-c") == 0) o->ses.n_ctx = dhsa_cli_int(a, v, 1, (int64_t)1 << 31, 1);
        else if (strcmp(a, "--ubatch") == 0) o->ses.n_ubatch = dhsa_cli_int(a, v, 1, 65536, 1);
        else if (strcmp(a, "--mem-limit") == 0) o->ses.mem_limit = (size_t)dhsa_cli_int(a, v, 1, INT64_MAX, 1);
        else if (strcmp(a, "--kv") == 0) {
            if (strcmp(v, "f32") == 0) o->ses.kv_type = DHSA_F32;
            else if (strcmp(v, "f16") == 0) o->ses.kv_type = DHSA_F16;
            else if (strcmp(v, "q8_0") == 0) o->ses.kv_type = DHSA_Q8_0;
            else dhsa_cli_die(EXIT_USAGE, "--kv is f32, f16 or q8_0, not \"%s\"", v);
        } else if (strcmp(a, "--attn") == 0) {
            dhsa_attn_method m;
            for (m = DHSA_ATTN_DENSE; m <= DHSA_ATTN_STREAM; m++)
                if (strcmp(v, dhsa_attn_method_name(m)) == 0) break;
            if (m > DHSA_ATTN_STREAM) dhsa_cli_die(EXIT_USAGE, "--attn is dense, dhsa, block or stream, not \"%s\"", v);
            o->ses.attn = m;
        } else if (strcmp(a, "--density") == 0) {
            o->ses.router.density = dhsa_cli_real(a, v, 1e-6, 1);
            density = 1;
        } else if (strcmp(a, "--budget") == 0) {
            o->ses.router.budget_tokens = dhsa_cli_int(a, v, 1, (int64_t)1 << 31, 1);
            budget = 1;
        } else if (strcmp(a, "--dense-below") == 0) o->ses.router.dense_below = dhsa_cli_int(a, v, 0, (int64_t)1 << 31, 1);
        else dhsa_cli_die(EXIT_USAGE, "unknown option \"%s\" (see dhsa help chat)", a);
    }
    if (density && budget) dhsa_cli_die(EXIT_USAGE, "give --density F or --budget N, not both");
    if (!o->model) {
        char msg[512];
        o->model = dhsa_cli_default_model(msg, sizeof msg);
        if (!o->model) dhsa_cli_die(EXIT_USAGE, "%s", msg);
        fprintf(stderr, "dhsa: model %s (the default; -m MODEL for another)\n", o->model);
    }
}

/* ------------------------------------------------------------ state --- */

typedef struct {
    chat_opts o;
    dhsa_model *m;
    const dhsa_tokenizer *tok;
    dhsa_ctx *ctx;
    dhsa_session *s;
    dhsa_sampler *smp;
    dhsa_json_schema *schema;   /* --json / --json-schema, else NULL */
    dhsa_json_vocab *jvocab;
    dhsa_json_constraint *jc;   /* the answer's, reset per question */
    dhsa_chat_template t;
    unsigned flags;
    int32_t stop[8];
    int n_stop;
    int64_t n_ctx, V;
    float *logits;           /* [V] after the session's last token */
    int32_t *sid;            /* [n_ctx] the session's tokens */
    int64_t slen;
    int32_t *ids;            /* [n_ctx] the rendered conversation */
    char *docs;              /* the documents' block of the first user turn */
    size_t docs_len;
    char *pending;           /* documents added after the first turn: the next turn's */
    dhsa_chat_message *msgs; /* the conversation (contents owned) */
    int64_t n_msgs, cap_msgs;
    int64_t turns, reused_total, evaluated_total;
    double last_ttft, last_rate;
} chat;

static char *dup_text(const char *a, size_t na, const char *b, size_t nb) {
    char *r = malloc(na + nb + 1);
    if (!r) dhsa_cli_die(EXIT_RUN, "out of memory");
    if (na) memcpy(r, a, na);
    if (nb) memcpy(r + na, b, nb);
    r[na + nb] = 0;
    return r;
}

/* Appends FILE to the block *buf as <document name="FILE">...</document>. */
static int add_document(chat *c, char **buf, size_t *len, const char *path) {
    int64_t n = 0;
    char *text = dhsa_cli_read_file(path, dhsa_cli_text_limit(c->tok, c->n_ctx), &n);
    if (!text) {
        fprintf(stderr, "dhsa chat: cannot read %s: %s\n", path, errno ? strerror(errno) : "too large for the context");
        return -1;
    }
    size_t add = strlen(path) + (size_t)n + 64;
    char *nb = realloc(*buf, *len + add + 1);
    if (!nb) dhsa_cli_die(EXIT_RUN, "out of memory");
    *buf = nb;
    *len += (size_t)snprintf(nb + *len, add + 1, "<document name=\"%s\">\n", path);
    memcpy(nb + *len, text, (size_t)n);
    *len += (size_t)n;
    *len += (size_t)snprintf(nb + *len, 32, "\n</document>\n\n");
    free(text);
    return 0;
}

static void push_msg(chat *c, const char *role, char *content) {
    if (c->n_msgs == c->cap_msgs) {
        c->cap_msgs = c->cap_msgs ? 2 * c->cap_msgs : 16;
        c->msgs = realloc(c->msgs, (size_t)c->cap_msgs * sizeof *c->msgs);
        if (!c->msgs) dhsa_cli_die(EXIT_RUN, "out of memory");
    }
    c->msgs[c->n_msgs++] = (dhsa_chat_message){role, content};
}

static void free_msgs(chat *c) {
    for (int64_t i = 0; i < c->n_msgs; i++) free((char *)c->msgs[i].content);
    c->n_msgs = 0;
}

static void clear_msgs(chat *c) {
    free_msgs(c);
    if (c->o.system) push_msg(c, "system", dup_text(c->o.system, strlen(c->o.system), "", 0));
}

/* The conversation's ids (with the assistant's turn opened when gen) into
 * c->ids; -1 (said) when it does not fit the context. */
static int64_t render(chat *c, int gen) {
    int64_t n = 0;
    if (dhsa_chat_tokenize(c->t, c->tok, c->msgs, c->n_msgs, gen, c->flags, c->ids, c->n_ctx, &n)) {
        if (n > c->n_ctx)
            fprintf(stderr, "dhsa chat: the conversation is %lld tokens, the context %lld: /clear, or a larger --ctx\n",
                    (long long)n, (long long)c->n_ctx);
        else
            fprintf(stderr, "dhsa chat: %s\n", dhsa_last_error());
        return -1;
    }
    return n;
}

static void progress(void *user, int64_t done, int64_t total) {
    double t0 = *(double *)user, el = dhsa_cli_now() - t0;
    int width = 30, fill = (int)(width * done / (total > 0 ? total : 1));
    fprintf(stderr, "\rprefill [%.*s%*s] %lld/%lld  %.0f tok/s ", fill, "##############################", width - fill,
            "", (long long)done, (long long)total, el > 0 ? (double)done / el : 0.0);
    if (done == total) fputc('\n', stderr);
}

/* Brings the session to hold ids[0..n) with c->logits after the last:
 * keeps the common prefix with what it holds (never the whole: the last
 * token is evaluated for its logits), evaluates the rest. Returns the
 * tokens reused, -1 on failure (said; the session is then empty). */
static int64_t advance(chat *c, const int32_t *ids, int64_t n) {
    int64_t keep = 0;
    while (keep < n && keep < c->slen && c->sid[keep] == ids[keep]) keep++;
    if (keep == n) keep = n - 1;
    if (keep < c->slen && dhsa_session_truncate(c->s, keep)) {
        fprintf(stderr, "dhsa chat: %s: evaluating the conversation again\n", dhsa_last_error());
        if (dhsa_session_reset(c->s)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
        keep = 0;
    }
    c->slen = keep;
    if (dhsa_session_eval(c->s, ids + keep, n - keep, c->logits)) {
        fprintf(stderr, "dhsa chat: %s\n", dhsa_last_error());
        dhsa_session_reset(c->s);
        c->slen = 0;
        return -1;
    }
    memcpy(c->sid + keep, ids + keep, (size_t)(n - keep) * sizeof(int32_t));
    c->slen = n;
    c->reused_total += keep;
    c->evaluated_total += n - keep;
    return keep;
}

/* The documents' tokens as every first turn starts with them: the common
 * prefix of the conversation with two different questions after them. */
static int64_t document_prefix(chat *c) {
    const char *probe[2] = {"A", "Z"};
    int64_t n[2];
    int32_t *first = malloc((size_t)c->n_ctx * sizeof(int32_t));
    if (!first) dhsa_cli_die(EXIT_RUN, "out of memory");
    for (int k = 0; k < 2; k++) {
        push_msg(c, "user", dup_text(c->docs, c->docs_len, probe[k], 1));
        n[k] = render(c, 1);
        free((char *)c->msgs[--c->n_msgs].content);
        if (n[k] < 0) {
            free(first);
            return -1;
        }
        if (k == 0) memcpy(first, c->ids, (size_t)n[0] * sizeof(int32_t));
    }
    int64_t p = 0;
    while (p < n[0] && p < n[1] && first[p] == c->ids[p]) p++;
    memcpy(c->ids, first, (size_t)p * sizeof(int32_t));
    free(first);
    return p;
}

/* Prefills the documents (or loads them from --prompt-cache). */
static void prefill_documents(chat *c) {
    int64_t n = document_prefix(c);
    if (n <= 0) return;
    double t0 = dhsa_cli_now();
    int64_t reused = 0;
    int have = 0;
    if (c->o.prompt_cache && c->slen == 0) {
        reused = dhsa_cli_cache_load(c->s, c->o.prompt_cache, c->ids, n, c->logits, &have);
        memcpy(c->sid, c->ids, (size_t)reused * sizeof(int32_t));
        c->slen = reused;
    }
    if (!have && advance(c, c->ids, n) < 0) dhsa_cli_die(EXIT_RUN, "the documents could not be prefilled");
    c->slen = n;
    double el = dhsa_cli_now() - t0;
    fprintf(stderr, "dhsa chat: documents: %lld tokens, %s in %.3f s\n", (long long)n,
            have ? "loaded from the prompt cache" : reused ? "the rest after the prompt cache's evaluated" : "prefilled",
            el);
    if (c->o.prompt_cache && !have) dhsa_cli_cache_save(c->s, c->o.prompt_cache, c->sid, c->slen, c->logits);
}

/* Writes token id's bytes to stdout and to the answer *a. */
static void emit(chat *c, int32_t id, char **a, size_t *len, size_t *cap) {
    char buf[512];
    int64_t n;
    if (dhsa_token_to_piece(c->tok, id, 0, buf, sizeof buf, &n) != DHSA_OK || n <= 0) return;
    fwrite(buf, 1, (size_t)n, stdout);
    fflush(stdout);
    if (*len + (size_t)n + 1 > *cap) {
        *cap = 2 * (*len + (size_t)n + 1);
        *a = realloc(*a, *cap);
        if (!*a) dhsa_cli_die(EXIT_RUN, "out of memory");
    }
    memcpy(*a + *len, buf, (size_t)n);
    *len += (size_t)n;
    (*a)[*len] = 0;
}

static int user_turns(const chat *c) {
    int n = 0;
    for (int64_t i = 0; i < c->n_msgs; i++) n += strcmp(c->msgs[i].role, "user") == 0;
    return n;
}

static void ask(chat *c, const char *q) {
    double t0 = dhsa_cli_now();
    size_t ql = strlen(q);
    if (user_turns(c) == 0) {
        push_msg(c, "user", dup_text(c->docs ? c->docs : "", c->docs_len, q, ql));
    } else {
        push_msg(c, "user", dup_text(c->pending ? c->pending : "", c->pending ? strlen(c->pending) : 0, q, ql));
        free(c->pending);
        c->pending = NULL;
    }
    int64_t n = render(c, 1);
    if (n < 0) {
        free((char *)c->msgs[--c->n_msgs].content);
        return;
    }
    int64_t reused = advance(c, c->ids, n);
    if (reused < 0) {
        free((char *)c->msgs[--c->n_msgs].content);
        return;
    }
    char *ans = NULL;
    size_t alen = 0, acap = 0;
    int64_t gen = 0;
    double t_first = 0, t_dec0 = 0;
    ans = dup_text("", 0, "", 0);
    acap = 1;
    if (c->jc) dhsa_json_constraint_reset(c->jc);
    while (gen < c->o.n_predict) {
        int32_t next;
        if (c->jc && dhsa_json_constraint_mask(c->jc, c->logits, c->stop, c->n_stop, NULL))
            dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
        if (dhsa_sampler_sample(c->smp, c->logits, c->sid, c->slen, &next)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
        if (gen == 0) {
            t_first = dhsa_cli_now() - t0;
            t_dec0 = dhsa_cli_now();
        }
        int stop = 0;
        for (int i = 0; i < c->n_stop; i++) stop |= next == c->stop[i];
        if (stop) break;
        if (c->jc && dhsa_json_constraint_accept(c->jc, next)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
        emit(c, next, &ans, &alen, &acap);
        gen++;
        if (c->jc && dhsa_json_constraint_finished(c->jc)) break; /* the value closed */
        if (c->slen >= c->n_ctx) {
            fprintf(stderr, "\ndhsa chat: the context is full (%lld tokens): /clear to go on\n", (long long)c->n_ctx);
            break;
        }
        if (dhsa_session_eval(c->s, &next, 1, c->logits)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
        c->sid[c->slen++] = next;
    }
    double el = dhsa_cli_now() - t_dec0;
    printf("\n");
    fflush(stdout);
    if (c->jc && !dhsa_json_constraint_can_end(c->jc))
        fprintf(stderr, "dhsa chat: the answer stopped (finish: length, %lld tokens) before its JSON value was "
                "complete: it is not valid JSON (raise -n)\n", (long long)gen);
    push_msg(c, "assistant", ans);
    c->turns++;
    c->last_ttft = t_first;
    c->last_rate = gen > 1 && el > 0 ? (double)(gen - 1) / el : 0;
    fprintf(stderr, "[first token after %.3f s; prompt %lld tokens, %lld reused, %lld evaluated; answer %lld tokens, "
            "%.1f tok/s]\n", t_first, (long long)n, (long long)reused, (long long)(n - reused), (long long)gen,
            c->last_rate);
}

static void stats(chat *c) {
    dhsa_attn_stats tot;
    dhsa_session_get_stats(c->s, NULL, &tot);
    const dhsa_mem_plan *pl = dhsa_session_get_plan(c->s);
    char kv[32], rss[32];
    fprintf(stderr, "context: %lld of %lld tokens (KV cache %s, %s, %s attention); documents %zu bytes; %lld answers; "
            "prompt tokens reused %lld, evaluated %lld; last answer: first token after %.3f s, %.1f tok/s; attention "
            "density %.4f; peak RSS %s\n", (long long)c->slen, (long long)c->n_ctx,
            dhsa_cli_bytes((double)pl->kv_cache, kv, sizeof kv), dhsa_type_name(c->o.ses.kv_type),
            dhsa_attn_method_name(c->o.ses.attn), c->docs_len, (long long)c->turns, (long long)c->reused_total,
            (long long)c->evaluated_total, c->last_ttft, c->last_rate, tot.density,
            dhsa_cli_bytes((double)dhsa_proc_peak_rss(), rss, sizeof rss));
}

/* One line of input (without its newline), or NULL at the end; the caller frees. */
static char *read_line(int tty) {
#if defined(DHSA_HAVE_LIBEDIT) || defined(DHSA_HAVE_READLINE)
    if (tty) {
        char *l = readline("> ");
        if (l && l[0]) add_history(l);
        return l;
    }
#endif
    if (tty) {
        fputs("> ", stderr);
        fflush(stderr);
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n = getline(&line, &cap, stdin);
    if (n < 0) {
        free(line);
        return NULL;
    }
    while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
    return line;
}

static const char *arg_of(const char *line, const char *cmd) {
    size_t n = strlen(cmd);
    if (strncmp(line, cmd, n) || (line[n] && line[n] != ' ')) return NULL;
    line += n;
    while (*line == ' ') line++;
    return line;
}

int dhsa_cli_chat(int argc, char **argv) {
    dhsa_cli_set_command("chat", NULL);
    chat c;
    memset(&c, 0, sizeof c);
    parse(argc, argv, &c.o);
    if (c.o.json) c.schema = dhsa_cli_json_schema(c.o.json_schema ? "--json-schema" : "--json", c.o.json_schema);
    dhsa_model_params mp = dhsa_model_default_params();
    if (dhsa_model_load(c.o.model, &mp, &c.m)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
    const dhsa_model_info *in = dhsa_model_get_info(c.m);
    c.tok = dhsa_model_tokenizer(c.m);
    c.V = in->n_vocab;
    const char *how = NULL;
    c.t = dhsa_cli_chat_template(dhsa_model_gguf(c.m), c.o.template_name, &how);
    if (c.t == DHSA_CHAT_NONE)
        dhsa_cli_die(EXIT_USAGE, "a conversation needs a chat format, and --template %s names none: give "
                     "--template llama3|chatml|qwen2.5|smollm2|gemma|mistral|llama2|phi3",
                     c.o.template_name);
    c.flags = dhsa_tokenizer_default_flags(c.tok) & DHSA_TOKENIZE_ADD_BOS;
    if (dhsa_chat_stop_ids(c.t, c.tok, c.stop, 8, &c.n_stop)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
    if (c.o.ses.n_ctx == 0) c.o.ses.n_ctx = in->n_ctx_train;
    c.n_ctx = c.o.ses.n_ctx;
    dhsa_ctx_params cp = dhsa_ctx_default_params();
    cp.n_threads = (int)c.o.threads;
    if (dhsa_ctx_create(&cp, &c.ctx)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
    if (dhsa_sampler_create(&c.o.sp, c.V, &c.smp)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
    if (c.schema && (dhsa_json_vocab_create(c.tok, &c.jvocab) || dhsa_json_constraint_create(c.schema, c.jvocab, &c.jc)))
        dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
    c.logits = malloc((size_t)c.V * sizeof(float));
    c.sid = malloc((size_t)c.n_ctx * sizeof(int32_t));
    c.ids = malloc((size_t)c.n_ctx * sizeof(int32_t));
    if (!c.logits || !c.sid || !c.ids) dhsa_cli_die(EXIT_RUN, "out of memory for a context of %lld", (long long)c.n_ctx);
    for (int i = 0; i < c.o.n_docs; i++)
        if (add_document(&c, &c.docs, &c.docs_len, c.o.docs[i])) return EXIT_RUN;
    double t_prefill = dhsa_cli_now();
    if (isatty(2)) {
        c.o.ses.progress = progress;
        c.o.ses.progress_user = &t_prefill;
    }
    if (dhsa_session_create(c.ctx, c.m, &c.o.ses, &c.s)) dhsa_cli_die(EXIT_RUN, "%s", dhsa_last_error());
    const int tty = isatty(0);
    if (c.o.verbose || tty) {
        const dhsa_mem_plan *pl = dhsa_session_get_plan(c.s);
        char kv[32];
        fprintf(stderr, "dhsa chat: %s (%s), template %s (%s), context %lld (KV %s %s), %s attention; line editing: %s\n",
                c.o.model, in->arch_name, dhsa_chat_template_name(c.t), how, (long long)c.n_ctx,
                dhsa_cli_bytes((double)pl->kv_cache, kv, sizeof kv), dhsa_type_name(c.o.ses.kv_type),
                dhsa_attn_method_name(c.o.ses.attn),
                LINE_EDITING ? (tty ? LINE_EDITING : LINE_EDITING " (not used: stdin is not a terminal)") : "none in this build");
    }
    clear_msgs(&c);
    if (c.docs) {
        t_prefill = dhsa_cli_now();
        prefill_documents(&c);
    } else if (c.o.prompt_cache) {
        fprintf(stderr, "dhsa chat: --prompt-cache holds the documents' prefill: give -f DOCUMENT\n");
        return EXIT_USAGE;
    }
    if (tty) fprintf(stderr, "Ask about the document%s; /add FILE, /clear, /save FILE, /stats, /quit.\n",
                     c.o.n_docs == 1 ? "" : "s");
    for (char *line; (line = read_line(tty));) {
        const char *arg;
        if (!line[0]) {
        } else if (arg_of(line, "/quit") || arg_of(line, "/exit")) {
            free(line);
            break;
        } else if ((arg = arg_of(line, "/add"))) {
            if (!arg[0]) fprintf(stderr, "/add FILE\n");
            else if (user_turns(&c) == 0) {
                if (add_document(&c, &c.docs, &c.docs_len, arg) == 0) prefill_documents(&c);
            } else {
                size_t pl = c.pending ? strlen(c.pending) : 0;
                if (add_document(&c, &c.pending, &pl, arg) == 0)
                    fprintf(stderr, "dhsa chat: %s goes with your next question\n", arg);
            }
        } else if (arg_of(line, "/clear")) {
            clear_msgs(&c);
            if (c.pending) { /* documents added during the conversation join the first turn's */
                size_t pl = strlen(c.pending);
                c.docs = realloc(c.docs, c.docs_len + pl + 1);
                if (!c.docs) dhsa_cli_die(EXIT_RUN, "out of memory");
                memcpy(c.docs + c.docs_len, c.pending, pl + 1);
                c.docs_len += pl;
                free(c.pending);
                c.pending = NULL;
            }
            fprintf(stderr, "dhsa chat: conversation cleared; the documents stay\n");
        } else if ((arg = arg_of(line, "/save"))) {
            if (!arg[0]) fprintf(stderr, "/save FILE\n");
            else if (c.slen == 0) fprintf(stderr, "dhsa chat: nothing to save yet\n");
            else if (dhsa_session_save(c.s, c.sid, c.slen, c.logits, arg))
                fprintf(stderr, "dhsa chat: /save: %s\n", dhsa_last_error());
            else
                fprintf(stderr, "dhsa chat: saved %lld tokens to %s (--prompt-cache %s reloads the documents)\n",
                        (long long)c.slen, arg, arg);
        } else if (arg_of(line, "/stats")) {
            stats(&c);
        } else if (line[0] == '/' && !strchr(line, ' ')) {
            fprintf(stderr, "dhsa chat: unknown command %s: /add FILE, /clear, /save FILE, /stats, /quit\n", line);
        } else {
            ask(&c, line);
        }
        free(line);
    }
    free_msgs(&c);
    free(c.msgs);
    free(c.docs);
    free(c.pending);
    free(c.logits);
    free(c.sid);
    free(c.ids);
    dhsa_sampler_free(c.smp);
    dhsa_json_constraint_free(c.jc);
    dhsa_json_vocab_free(c.jvocab);
    dhsa_json_schema_free(c.schema);
    dhsa_session_free(c.s);
    dhsa_ctx_free(c.ctx);
    dhsa_model_free(c.m);
    return 0;
}
