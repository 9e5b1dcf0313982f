/* dhsa/eval.h: the long-context retrieval tasks and the measurements behind
 * `dhsa eval` (src/eval; docs/eval.md).
 *
 * A section of the public interface: users include <dhsa.h>, which
 * includes every section in order. This file includes the sections it
 * builds on, so it compiles alone too. The rules every call follows
 * (errors, threads, tensors) are at the top of dhsa.h and in dhsa/core.h.
 */
#ifndef DHSA_EVAL_H
#define DHSA_EVAL_H

#include "session.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Retrieval tasks (src/eval/retrieval.c, docs/eval.md)                     */

/* The long-context retrieval tasks the default model was trained on
 * (train/tasks.py writes the same strings), built to a token length with
 * the asked needle at a depth, and their scoring:
 *   passkey     "There is an important info hidden inside a lot of irrelevant
 *               text. Find it and memorize it. I will quiz you about the
 *               important information there. " FILLER " The pass key is N.
 *               Remember it. N is the pass key. " FILLER " What is the pass
 *               key? The pass key is"                        -> " N" (5 digits)
 *   multikey    "Some special magic numbers are hidden within the following
 *               text. Make sure to memorize it. I will quiz you about the
 *               numbers afterwards. " FILLER with n_keys sentences "One of
 *               the special magic numbers for KW is: N." (distinct keywords)
 *               " What is the special magic number for KW mentioned in the
 *               provided text? The special magic number for KW mentioned in
 *               the provided text is"                        -> " N" (7 digits)
 *   multivalue  the same with n_keys values for one keyword and n_distract
 *               other keywords; " What are all the special magic numbers for
 *               KW mentioned in the provided text? The special magic numbers
 *               for KW mentioned in the provided text are" -> " N1, N2, N3"
 *               (in the order they appear)
 * Numbers come from the held-out set (crc32 of the decimal text = 0 mod
 * 10) or its complement (the training set), so an evaluation never asks a
 * key the model was trained on. */
typedef enum { DHSA_TASK_PASSKEY = 1, DHSA_TASK_MULTIKEY = 2, DHSA_TASK_MULTIVALUE = 3 } dhsa_task_kind;
/* "passkey", "multikey", "multivalue"; "?" otherwise. */
DHSA_API const char *dhsa_task_kind_name(dhsa_task_kind k);
/* Built-in filler: *n plain sentences written for dhsa (public domain),
 * free of numbers; a task built with filler NULL uses them, repeated in an
 * order drawn from its seed. */
DHSA_API const char *const *dhsa_task_builtin_sentences(int64_t *n);

#define DHSA_TASK_MAX_NEEDLES 16

typedef struct {
    dhsa_task_kind kind;
    int64_t length;          /* most prompt tokens, BOS included (>= 64) */
    double depth;            /* 0..1: where the asked needle sits in the filler */
    uint64_t seed;           /* filler offset, keys, other needles' places */
    int n_keys;              /* multikey: needles (default 4); multivalue: values (3) */
    int n_distract;          /* multivalue: other keywords (default 1) */
    const char *filler;      /* filler text (whitespace runs count as one space);
                                NULL: the built-in sentences */
    int64_t filler_len;
    const char *const *keywords; /* multikey / multivalue; NULL = a built-in list */
    int64_t n_keywords;
    int heldout_numbers;     /* 1 (default): held-out numbers; 0: the training set */
} dhsa_task_params;

typedef struct {
    int32_t *ids;            /* [n_ids] the prompt's tokens, BOS first (owned) */
    int64_t n_ids;
    char *prompt;            /* the prompt's text, NUL-terminated (owned) */
    char answer[192];        /* the expected continuation, e.g. " 48213" */
    int n_numbers;           /* numbers the answer must state, in order */
    uint64_t numbers[DHSA_TASK_MAX_NEEDLES];
    int n_spans;             /* token ranges [lo, hi) of the asked numbers in ids */
    int64_t span_lo[DHSA_TASK_MAX_NEEDLES], span_hi[DHSA_TASK_MAX_NEEDLES];
    double depth_used;       /* where the first asked needle starts: its token
                                offset between the preamble and the question, 0..1 */
} dhsa_task;

DHSA_API dhsa_task_params dhsa_task_default_params(void);
/* Builds one task with the tokenizer's BOS; the filler span is cut at
 * word boundaries and sized so that n_ids <= length (and close to it).
 * A filler too short for the length is DHSA_ERR_INVALID_ARG. Free with
 * dhsa_task_free (also after a failure: *out is then empty). */
DHSA_API dhsa_status dhsa_task_build(const dhsa_tokenizer *tok, const dhsa_task_params *p, dhsa_task *out);
DHSA_API void dhsa_task_free(dhsa_task *t);
/* 1 when the first numbers (maximal digit runs) of text[0..len) are the
 * task's numbers in order, 0 otherwise. */
DHSA_API int dhsa_task_check(const dhsa_task *t, const char *text, int64_t len);
/* The share of the task's asked-number keys [span_lo, span_hi) that the
 * layout selects for query row `row` of KV head g (1 with layout NULL). */
DHSA_API double dhsa_task_selected(const dhsa_task *t, const dhsa_layout *layout, int64_t g, int64_t row);

/* ------------------------------------------------------------------------ */
/* Evaluation (src/eval/evaluate.c, docs/eval.md)                           */

/* The measurements behind `dhsa eval` (tools/eval.c prints them; the
 * Python binding returns them: dhsa.eval_fidelity, dhsa.eval_retrieval,
 * dhsa.eval_generate). Each runs the model through fresh sessions on the
 * given context and model; the model and context are only read and may
 * be shared with other sessions (not concurrently with them). Nothing is
 * printed. Buffers: the functions allocate what they need (logits,
 * per-layer sums, the recall reruns' outputs) and free it before they
 * return; these are evaluation calls, not inference hot paths. On an
 * error the results are unspecified and dhsa_last_error() says why (a
 * failure inside a layer's measurement is named after the session's
 * sentence). */

/* The routing an evaluation at L tokens runs with by default:
 * dhsa_router_params_for(L, density), the routing every entry point runs
 * (docs/dhsa.md, "One set of routing defaults"). */
DHSA_API dhsa_router_params dhsa_eval_router_params(int64_t L, double density);

/* A method as evaluated: the session's attn and its routing (the block
 * baseline is DHSA_ATTN_BLOCK; learned boundaries are DHSA_ATTN_DHSA with
 * router.boundary LEARNED and router.predictor set). */
typedef struct {
    dhsa_attn_method attn;
    dhsa_router_params router;
} dhsa_eval_method;

/* eval fidelity: ids (the text's tokens, no BOS) are cut into windows of
 * `window` tokens, the tokenizer's BOS first (window - 1 text tokens; a
 * tokenizer without BOS: window text tokens), at most max_windows of them.
 * Each window runs once dense and once per method, with logits for every
 * position; over the predicted positions 0 .. window - 2:
 *   kl         mean KL(p_dense || p_method) of the next-token
 *              distributions, nats (double-precision log-softmax)
 *   top1       share of positions where both argmaxes agree (the first
 *              maximal logit on ties)
 *   ppl, ppl_dense  exp of the mean negative log-likelihood of the actual
 *              next token, under the method and under dense
 *   kl_late, top1_late  the same over positions >= window / 2
 *   density_used       selected / available keys over rows, KV heads and
 *              layers (dhsa_layout_get_stats; a dense call counts all),
 *              mean over windows; density_used_late: the rows at
 *              positions >= window / 2
 *   recall[l]  (when the caller gives the array, [n_layer]) the mean over
 *              rows and heads of exp(lse_sparse - lse_dense) of layer l:
 *              each routed call rerun dense and with its layout
 *              (dhsa_fidelity_compare), over the method's own q/k/v;
 *              dense calls count 1; mean over windows. NaN with
 *              params.recall 0.
 * Dense and every method run side by side over a window, one ubatch of
 * min(window, 512) tokens at a time (the scores are those of whole-window
 * runs). Cost: two extra attention calls per routed layer call (recall);
 * memory: the sessions of dense and every method at once (a KV cache of
 * `window` tokens each) and 2 x min(window, 512) x n_vocab floats of
 * logits. A text shorter than one window is DHSA_ERR_INVALID_ARG. */
typedef struct {
    int64_t window;       /* tokens per window, BOS included (>= 2); 0 = the trained context */
    int64_t max_windows;  /* default 8 */
    int recall;           /* 1 (default): measure the per-layer recall */
} dhsa_eval_fidelity_params;

DHSA_API dhsa_eval_fidelity_params dhsa_eval_fidelity_default_params(void);

typedef struct {
    double kl, top1, ppl, ppl_dense;
    double kl_late, top1_late;
    double density_used, density_used_late;
    int64_t n_predicted, n_predicted_late;
    double *recall;       /* in: the caller's [n_layer] array, or NULL (not measured then) */
} dhsa_eval_fidelity_result;

typedef struct {
    int64_t window, n_windows;  /* as run */
    int64_t n_text;             /* the ids given */
    int64_t n_predicted;        /* dense's predicted positions, all windows */
    double ppl_dense;           /* dense perplexity over them */
} dhsa_eval_fidelity_info;

/* results[n_methods] (each result's recall pointer set by the caller or
 * NULL); info may be NULL. */
DHSA_API dhsa_status dhsa_eval_fidelity(dhsa_ctx *ctx, dhsa_model *m, const int32_t *ids, int64_t n_ids,
                                        const dhsa_eval_fidelity_params *p, const dhsa_eval_method *methods,
                                        int64_t n_methods, dhsa_eval_fidelity_result *results,
                                        dhsa_eval_fidelity_info *info);

/* A greedy answer: the prompt ids[0..n) in a fresh session of the method
 * (cache n_ctx, 0 = n + max_tokens), then argmax tokens until a stop id
 * (not part of the answer) or max_tokens, detokenized with detok_flags.
 * eval niah and the retrieval tasks run this. */
typedef struct {
    dhsa_eval_method method;
    int64_t max_tokens;     /* 0: 12 (dhsa_eval_retrieval: 40 when the task asks
                               several numbers, as multivalue does) */
    int64_t n_ctx;          /* 0: prompt + max_tokens */
    const int32_t *stop;    /* ids that end the answer; NULL: the tokenizer's EOS */
    int n_stop;
    unsigned detok_flags;   /* dhsa_detokenize flags (retrieval: KEEP_SPACE is added) */
} dhsa_eval_answer_params;

DHSA_API dhsa_eval_answer_params dhsa_eval_answer_default_params(void);

#define DHSA_EVAL_MAX_LAYERS 64   /* layers whose needle selection is reported */
#define DHSA_EVAL_ANSWER_ROWS 64  /* answer rows whose needle selection is kept */

/* Why a retrieval miss happened, at the row that produced its first wrong
 * token: the needle's keys selected in every reported layer (the model's
 * error, not the routing's; dense is always this), in some only, or in
 * none. */
typedef enum {
    DHSA_EVAL_NEEDLE_EVERYWHERE = 0,
    DHSA_EVAL_NEEDLE_PARTLY = 1,
    DHSA_EVAL_NEEDLE_NOWHERE = 2
} dhsa_eval_needle;

typedef struct {
    char text[4096];        /* the answer, NUL-terminated (cut to 4095 bytes) */
    int64_t n_tokens;       /* answer tokens generated */
    double density_used;    /* selected / available keys, prompt and answer rows */
    double mean_chunk;      /* dhsa and block: keys per chunk of the boundaries
                               the method cut over the prompt (prompt keys /
                               chunks, summed over layers); 0 for the others */
    /* dhsa_eval_retrieval and dhsa_eval_ruler only (dhsa_eval_generate:
     * hit -1, the rest 0; dhsa_eval_ruler: see there): */
    int hit;                /* dhsa_task_check of text */
    int64_t first_wrong;    /* the first answer token whose text leaves the
                               expected answer; n_tokens when none does */
    int64_t n_layer;        /* layers reported: min(n_layer, DHSA_EVAL_MAX_LAYERS) */
    /* per layer, the share of the asked numbers' keys the layout selects
     * (dhsa_task_selected, mean over KV heads) for the rows that produce
     * the answer (the prompt's last, then each answer token fed back):
     * the least over those rows, and at the row that produced answer token
     * min(first_wrong, DHSA_EVAL_ANSWER_ROWS - 1) (0 for a row never run:
     * the last token is not fed back) */
    double needle_selected[DHSA_EVAL_MAX_LAYERS];
    double selected_at_wrong[DHSA_EVAL_MAX_LAYERS];
    dhsa_eval_needle needle; /* from selected_at_wrong (meaningful for a miss) */
} dhsa_eval_answer;

DHSA_API dhsa_status dhsa_eval_generate(dhsa_ctx *ctx, dhsa_model *m, const int32_t *ids, int64_t n_ids,
                                        const dhsa_eval_answer_params *p, dhsa_eval_answer *out);
/* The task's prompt through dhsa_eval_generate, scored and explained. */
DHSA_API dhsa_status dhsa_eval_retrieval(dhsa_ctx *ctx, dhsa_model *m, const dhsa_task *t,
                                         const dhsa_eval_answer_params *p, dhsa_eval_answer *out);
/* eval niah's prompts: a haystack of `sentences` (NULL: the built-in
 * ones, dhsa_task_builtin_sentences) taken in order, cycling, as many as
 * fit `length` tokens, with `needle` (e.g. "The secret number is 4821.")
 * at the sentence boundary whose token offset is nearest depth x the
 * haystack's tokens, then the question: with tmpl NONE the plain
 * completion prompt "HAYSTACK\n\nQuestion: What is the secret number
 * mentioned in the text above?\nAnswer: The secret number is"; with a chat
 * template one user turn "HAYSTACK\n\nWhat is the secret number mentioned
 * in the text above? Answer with the number only." and the assistant's
 * turn opened (dhsa_chat_tokenize, markers parsed as special). The
 * tokenizer's BOS as its default flags say. Sentences are dropped from the
 * end until n_ids <= length (a prompt is at least the question: a length
 * below that gives the question with the needle alone). stop holds the ids
 * that end an answer: EOS, then the template's end-of-turn ids, or BOS for
 * the plain prompt (a base model starts a new document). Free with
 * dhsa_niah_free (also after a failure). */
typedef struct {
    int64_t length;                 /* most prompt tokens (default 1024) */
    double depth;                   /* 0..1 (default 0.5) */
    const char *needle;             /* the needle sentence (required) */
    const char *const *sentences;   /* the haystack; NULL: built-in */
    int64_t n_sentences;
    dhsa_chat_template tmpl;        /* DHSA_CHAT_NONE (default): plain prompt */
} dhsa_niah_params;

typedef struct {
    int32_t *ids;                   /* [n_ids] (owned) */
    int64_t n_ids;
    double depth_used;              /* the needle's token offset in the haystack, 0..1 */
    int64_t n_sentences;            /* haystack sentences used */
    int32_t stop[16];
    int n_stop;
} dhsa_niah_prompt;

DHSA_API dhsa_niah_params dhsa_niah_default_params(void);
DHSA_API dhsa_status dhsa_niah_build(const dhsa_tokenizer *tok, const dhsa_niah_params *p, dhsa_niah_prompt *out);
DHSA_API void dhsa_niah_free(dhsa_niah_prompt *pr);
/* 1 when the answer's text answer[0..len) states the needle's number
 * (`number`: 1..32 ASCII digits), 0 when not, -1 for a bad number. A
 * number is a maximal run of digits with optional ",ddd" thousands groups
 * and no decimal part: "4821", "is 4821.", "4,821", "x4821y" state 4821;
 * "48210", "14821", "4821.5", "04821", "4 8 2 1" do not. */
DHSA_API int dhsa_niah_answer_has(const char *answer, int64_t len, const char *number);
/* eval copy: a sequence [BOS] filler[0, f1) PASSAGE filler[f1, F)
 * PASSAGE of exactly L tokens (F = L - BOS - 2P, f1 = round(depth x F));
 * the spans it puts where (dhsa_eval_copy_sequence fills it in):
 *   first, second  where the two copies of the passage start
 *   control        P filler keys right after the first copy (or before it
 *                  when the filler between the copies is shorter than P)
 * ids has room for L. A length under 2P + 2 or a filler shorter than F is
 * DHSA_ERR_INVALID_ARG. */
typedef struct {
    int64_t first, second, control, passage, n_ids;
} dhsa_eval_copy_layout;

DHSA_API dhsa_status dhsa_eval_copy_sequence(const int32_t *filler, int64_t n_filler, const int32_t *passage, int64_t P,
                                             int64_t L, double depth, int32_t bos, int32_t *ids, dhsa_eval_copy_layout *at);

/* One copy sequence under a method, one session with the logits of the
 * copies' rows only (64 rows at a time; the numbers are those of one eval
 * over the whole sequence):
 *   first_loss, rep_loss  mean loss (nats/token) on passage tokens 1..P-1
 *                  at the first occurrence and at the repetition; score =
 *                  first_loss - rep_loss (the loss drop)
 *   density_used   selected / available keys, all rows and layers
 * and, for the repetition's queries (the P - 1 rows that predict passage
 * tokens), mean over rows, heads and layers, from each layer's call rerun
 * dense with LSE outputs over all keys, the first copy's keys, those of
 * them the layout selects, and the control span:
 *   copy_keys_selected  share of the first copy's keys the layout selects
 *   copy_mass      dense softmax mass on the first copy
 *   control_mass   the same on the control span
 *   copy_mass_kept (mass on the selected part) / copy_mass (1 when 0) */
typedef struct {
    double first_loss, rep_loss, score, density_used;
    double copy_keys_selected, copy_mass, control_mass, copy_mass_kept;
} dhsa_eval_copy_result;

DHSA_API dhsa_status dhsa_eval_copy(dhsa_ctx *ctx, dhsa_model *m, const dhsa_eval_method *method, const int32_t *ids,
                                    const dhsa_eval_copy_layout *at, dhsa_eval_copy_result *r);

/* Text the model writes itself, as eval copy's filler: n tokens from
 * stories sampled at temperature 1 (the sampler's other defaults), a fresh
 * session of 256 tokens per piece seeded seed x 1000003 + piece, BOS and
 * EOS dropped so the stories run on. */
DHSA_API dhsa_status dhsa_eval_sample_tokens(dhsa_ctx *ctx, dhsa_model *m, int64_t n, uint64_t seed, int32_t *out);

/* The ordinary tokens (DHSA_TOKEN_NORMAL) a passage is drawn from; with
 * words, only whole-word SPM pieces ("\u2581" and 2 or more ASCII
 * letters). *n is their count; more than cap is DHSA_ERR_INVALID_ARG
 * (cap 0 counts). */
DHSA_API dhsa_status dhsa_eval_passage_tokens(const dhsa_tokenizer *tok, int words, int32_t *out, int64_t cap, int64_t *n);
/* RULER-style tasks (src/eval/ruler.c; docs/eval.md "eval ruler"):
 * synthetic long-context tasks modelled on NVIDIA's RULER benchmark (task
 * definitions and scoring learned from it; every string is dhsa's own).
 *
 *   SINGLE      one needle "The secret <kind> for <key> is: <value>." in
 *               the haystack; asked for its value
 *   MULTIKEY    the asked needle among n_keys - 1 needles of other keys
 *               (with haystack NEEDLES, every filler sentence is such a
 *               distractor needle)
 *   MULTIVALUE  n_values needles of one key; asked for all of them
 *   MULTIQUERY  n_keys needles of different keys; asked for n_queries keys
 *   VT          variable tracking: chains "VAR A = 12345." "VAR B = VAR
 *               A." ... (n_chains chains of n_hops hops); asked which
 *               variables get the first chain's value
 *   CWE         common words: a numbered list where n_common words occur
 *               freq_common times and the others freq_uncommon times;
 *               asked for the n_common most frequent
 *   FWE         frequent words: coded words with Zipf counts (exponent
 *               alpha); asked for the three most frequent (the top rank is
 *               written as dots and not asked)
 *
 * Scoring is RULER's string_match_all: the share of expected strings that
 * occur in the answer, case-insensitively, as substrings (multi-value,
 * multi-query, VT and CWE get partial credit). Values, keys, variables and
 * words come from one of two disjoint pools (split DEV or TEST: a hash of
 * the string picks its pool), and so do the noise sentences and the prose,
 * so that parameters chosen on DEV prompts are measured on TEST prompts
 * they never saw. */
typedef enum {
    DHSA_RULER_SINGLE = 1,
    DHSA_RULER_MULTIKEY = 2,
    DHSA_RULER_MULTIVALUE = 3,
    DHSA_RULER_MULTIQUERY = 4,
    DHSA_RULER_VT = 5,
    DHSA_RULER_CWE = 6,
    DHSA_RULER_FWE = 7
} dhsa_ruler_task;
/* What the keys and values of the needles are: 7-digit numbers, words
 * (adjective-noun pairs such as "quiet-harbor") or UUIDs (version 4). */
typedef enum { DHSA_RULER_NUMBERS = 0, DHSA_RULER_WORDS = 1, DHSA_RULER_UUIDS = 2 } dhsa_ruler_kind;
/* The filler: repeated noise sentences (built in, one set per split),
 * sentences of real prose (params.prose, dhsa_ruler_load_prose), or
 * distractor needles (MULTIKEY only). */
typedef enum { DHSA_RULER_NOISE = 0, DHSA_RULER_PROSE = 1, DHSA_RULER_NEEDLES = 2 } dhsa_ruler_haystack;
typedef enum { DHSA_RULER_DEV = 0, DHSA_RULER_TEST = 1 } dhsa_ruler_split;

#define DHSA_RULER_MAX_EXPECTED 16
#define DHSA_RULER_MAX_SPANS 64

typedef struct {
    dhsa_ruler_task task;
    int64_t length;               /* most prompt tokens, template and BOS included (64 .. 2^24) */
    double depth;                 /* 0..1: where the first asked needle (VT: the chain's
                                     first line) sits in the haystack; CWE, FWE: unused */
    uint64_t seed;                /* everything random in the prompt */
    dhsa_ruler_split split;       /* which pools values and filler come from */
    dhsa_ruler_kind key_kind, value_kind;
    dhsa_ruler_haystack haystack;
    const char *prose;            /* PROSE: the text (its sentences are the units) */
    int64_t prose_len;
    const char *words;            /* CWE: the word list, one a line (dhsa_ruler_load_words);
                                     lowercase ASCII words of 3..12 letters of the split's pool are used */
    int64_t words_len;
    int n_keys, n_values, n_queries; /* 0: per task (MULTIKEY 4 keys, MULTIVALUE 4 values,
                                        MULTIQUERY 4 keys 4 queries, else 1) */
    int n_chains, n_hops;         /* VT: 0 = 1 chain, 4 hops */
    int n_common, freq_common, freq_uncommon; /* CWE: 0 = 10, 30, 3 (length < 4096: 10, 6, 1) */
    double alpha;                 /* FWE: 0 = 2.0 */
    dhsa_chat_template tmpl;      /* DHSA_CHAT_NONE: a plain completion prompt */
} dhsa_ruler_params;

/* A built prompt. With tmpl NONE: the text "<task text>\n<question><answer
 * prefix>" tokenized whole (the tokenizer's default BOS); with a template:
 * the task text and question as one user turn, the assistant's turn
 * opened, then the answer prefix tokenized after it (so the model's
 * answer continues "The secret number for X is:"). */
typedef struct {
    int32_t *ids;                 /* [n_ids] (owned) */
    int64_t n_ids;
    char *text;                   /* the prompt's text (plain) or the user turn's (owned) */
    int n_expected;               /* strings the answer should contain */
    char expected[DHSA_RULER_MAX_EXPECTED][48];
    double depth_used;            /* the first asked needle's token offset in the haystack,
                                     0..1; -1 for CWE and FWE */
    int64_t n_units;              /* haystack units used (sentences, list items, words) */
    int64_t answer_tokens;        /* RULER's answer budget: 128 NIAH, 30 VT, 120 CWE, 50 FWE */
    int32_t stop[16];             /* ids that end an answer (as dhsa_niah_build's) */
    int n_stop;
    /* where the needles state the expected strings: token ranges
     * [span_lo, span_hi) of ids, each an occurrence of expected[span_of]
     * inside a needle sentence (NIAH: the asked values; VT: the chain's
     * variables), in prompt order; 0 spans for CWE and FWE (their answer
     * is spread over the list). dhsa_eval_ruler explains a miss by them. */
    int n_spans;
    int span_of[DHSA_RULER_MAX_SPANS];
    int64_t span_lo[DHSA_RULER_MAX_SPANS], span_hi[DHSA_RULER_MAX_SPANS];
} dhsa_ruler_prompt;

DHSA_API dhsa_ruler_params dhsa_ruler_default_params(void);
/* The suite's named configurations (RULER's, without QA): single_noise,
 * single_prose, single_uuid, single_word, multikey, multikey_needles,
 * multikey_uuid, multivalue, multiquery, vt, cwe, fwe. Sets task, kinds,
 * haystack and counts of *p (the rest is kept); an unknown name is
 * DHSA_ERR_INVALID_ARG naming them all. */
DHSA_API dhsa_status dhsa_ruler_preset(const char *name, dhsa_ruler_params *p);
/* Builds one prompt of at most length tokens: the haystack units are
 * counted up (a binary search over their number) to the most that fit,
 * the needles at the unit boundaries nearest their depths. A haystack or
 * word list too short for the length is DHSA_ERR_INVALID_ARG. Free with
 * dhsa_ruler_free (also after a failure). */
DHSA_API dhsa_status dhsa_ruler_build(const dhsa_tokenizer *tok, const dhsa_ruler_params *p, dhsa_ruler_prompt *out);
DHSA_API void dhsa_ruler_free(dhsa_ruler_prompt *pr);
/* RULER's string_match_all of one answer: the share (0..1) of
 * pr->expected[0..n_expected) found in answer[0..len) as substrings,
 * ASCII case folded; 0 when n_expected is 0. */
DHSA_API double dhsa_ruler_score(const dhsa_ruler_prompt *pr, const char *answer, int64_t len);
/* One RULER prompt through dhsa_eval_generate (pr's ids; p's stops, or
 * pr's when p->stop is NULL), scored and explained: out->hit is 1 when the
 * answer holds every expected string (dhsa_ruler_score == 1), else 0; for
 * a miss, needle_selected / selected_at_wrong / needle say whether the
 * layouts selected the keys of pr's spans, per routed layer, at the
 * prompt's last row (the row that decides the answer's first token:
 * first_wrong is 0) and over all answer rows. Layers that do not route
 * (dense, or a sliding-window layer reading its window) count as 1 and
 * do not decide "partly" or "nowhere". A prompt without spans (CWE, FWE)
 * is scored with needle EVERYWHERE and every share 1. */
DHSA_API dhsa_status dhsa_eval_ruler(dhsa_ctx *ctx, dhsa_model *m, const dhsa_ruler_prompt *pr,
                                     const dhsa_eval_answer_params *p, dhsa_eval_answer *out);
/* The prose haystack from the Debian package gnu-standards (GFDL, in
 * main): the paragraphs (<p> elements, tags removed, entities decoded) of
 * dir/maintain.html for DEV and dir/standards.html for TEST, dir NULL =
 * /usr/share/doc/gnu-standards. *text (malloc'd, the caller frees it) holds
 * them one a line. A missing file is DHSA_ERR_IO whose sentence names the
 * package to install. */
DHSA_API dhsa_status dhsa_ruler_load_prose(const char *dir, dhsa_ruler_split split, char **text, int64_t *len);
/* CWE's word list: path NULL = /usr/share/dict/words (Debian package
 * wamerican); a missing file is DHSA_ERR_IO naming the package. */
DHSA_API dhsa_status dhsa_ruler_load_words(const char *path, char **text, int64_t *len);
/* Frees a text of dhsa_ruler_load_prose / _words (free() does too, from C
 * code linked against the same C library). NULL is fine. */
DHSA_API void dhsa_ruler_text_free(char *text);

#ifdef __cplusplus
}
#endif
#endif /* DHSA_EVAL_H */
