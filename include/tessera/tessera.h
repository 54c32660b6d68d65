/*
** tessera — public embedding API.
**
** Every fallible call returns a tsr_status; on failure the message that
** names what went wrong (file, field, layer) is kept per thread and read
** with tsr_error_message(). The message stays valid until the next failing
** call on the same thread.
*/
#ifndef TESSERA_H
#define TESSERA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TSR_VERSION_MAJOR 0
#define TSR_VERSION_MINOR 1
#define TSR_VERSION_PATCH 0

enum tsr_status {
  TSR_OK = 0,
  TSR_ERR_INVALID_ARG,   /* a caller passed something impossible */
  TSR_ERR_IO,            /* open/read/write/mmap failed */
  TSR_ERR_FORMAT,        /* malformed input file or data */
  TSR_ERR_UNSUPPORTED,   /* well-formed but not something this build does */
  TSR_ERR_NOMEM,         /* allocation failed or a size overflowed */
  TSR_ERR_INTERNAL,      /* a broken invariant inside tessera */
};
typedef enum tsr_status tsr_status;

#if defined(__GNUC__)
#define TSR_API __attribute__((visibility("default")))
#else
#define TSR_API
#endif

/* The message of the last failure on this thread ("" if none). */
TSR_API const char *tsr_error_message(void);

/* Human name of a status code, e.g. "format error". */
TSR_API const char *tsr_status_name(tsr_status st);

/* Version string of the linked library, e.g. "0.1.0". */
TSR_API const char *tsr_version(void);

/* ---- the embedding API ---------------------------------------------------
**
** Opaque handles; every struct stays inside the library. An engine is one
** loaded profile (plugins, model, negotiated composition, KV cache, backend).
**
** Threads: calls on one engine, and on the samplers and text streams opened
** from it, must not run at the same time (a caller serialises them), with two
** exceptions: tsr_engine_cancel may be called from any thread at any time, and
** the token and chat calls that only read (tsr_tokenize, tsr_detokenize,
** tsr_token_is_eog, tsr_chat_format, tsr_chat_tokenize) may run on any thread
** alongside anything but tsr_chat_template_choose and tsr_engine_close.
** Different engines may be used from different threads. Errors are per thread
** (tsr_error_message).
**
** Memory: what a call hands back through a char ** or int32_t ** is the
** caller's, released with tsr_free. Strings returned as const char * belong
** to the engine and live as long as it does.
*/

typedef struct tsr_engine tsr_engine;
typedef struct tsr_sampler tsr_sampler;

TSR_API void tsr_free(void *p);

/* Opens profile (a YAML file; NULL: the default profile the build ships),
** with --set style overrides ("ctx=8192", "kv.k=q8_0", "sampling.seed=3"),
** running model (a GGUF path) instead of the profile's when not NULL. Every
** step is checked first: a profile, plugin or model problem fails here naming
** the file, key, plugin or layer. */
TSR_API tsr_status tsr_engine_open(const char *profile, const char *model,
                                   const char *const *sets, int n_sets, tsr_engine **out);
TSR_API void tsr_engine_close(tsr_engine *e);

/* What `tessera profile check` prints for it: the resolved profile, the model,
** the composition and the memory plan (*text: tsr_free it). */
TSR_API tsr_status tsr_engine_describe(tsr_engine *e, char **text);
TSR_API int32_t tsr_engine_n_vocab(const tsr_engine *e);
/* Context length (positions a sequence may hold) and sequences the cache holds
** (the profile's server.parallel). */
TSR_API int32_t tsr_engine_n_ctx(const tsr_engine *e);
TSR_API int32_t tsr_engine_n_seq(const tsr_engine *e);
TSR_API const char *tsr_engine_model_path(const tsr_engine *e);
TSR_API const char *tsr_engine_arch(const tsr_engine *e);
/* Whether the profile loaded plugin name. */
TSR_API int tsr_engine_has_plugin(const tsr_engine *e, const char *name);
/* The profile's sampling.max_tokens (-1: no limit). */
TSR_API int32_t tsr_engine_max_tokens(const tsr_engine *e);
/* The resolved profile's value of one scalar key ("context", "server.port",
** "sampling.top_p") as text (*value: tsr_free it; "" for an optional string
** left unset), and where it was set (*where, may be NULL: "conf/x.yaml:12:5",
** or the profile's path and "(default)"). A key that is not one value of the
** schema is TSR_ERR_INVALID_ARG. */
TSR_API tsr_status tsr_engine_setting(const tsr_engine *e, const char *key, char **value,
                                      const char **where);

/* ---- tokens ---- */

enum {
  TSR_TOKENIZE_ADD_SPECIAL = 1,   /* BOS (and EOS) where the model's tokenizer adds them */
  TSR_TOKENIZE_PARSE_SPECIAL = 2, /* text spelling a special token becomes that token */
};
/* *tokens (tsr_free it; NULL when *n is 0). */
TSR_API tsr_status tsr_tokenize(tsr_engine *e, const char *text, size_t len, unsigned flags,
                                int32_t **tokens, size_t *n);
/* The text of n tokens, NUL-terminated (*len, if not NULL, its length). */
TSR_API tsr_status tsr_detokenize(tsr_engine *e, const int32_t *tokens, size_t n, char **text,
                                  size_t *len);
/* Whether token ends a generation (EOS, end of turn). */
TSR_API int tsr_token_is_eog(tsr_engine *e, int32_t token);

/* Text of tokens as they come, in whole UTF-8 characters: a character split
** across tokens waits for its last byte; bytes that can never complete one
** pass through as they are. */
typedef struct tsr_text_stream tsr_text_stream;
TSR_API tsr_status tsr_text_stream_open(tsr_engine *e, tsr_text_stream **out);
TSR_API void tsr_text_stream_close(tsr_text_stream *t);
/* The text token completes (*text valid until the next call on t; *len may be
** 0). A token outside the vocabulary is TSR_ERR_INVALID_ARG. */
TSR_API tsr_status tsr_text_stream_push(tsr_text_stream *t, int32_t token, const char **text,
                                        size_t *len);
/* What is still pending (an incomplete character, at most 3 bytes); the
** stream starts over. */
TSR_API void tsr_text_stream_flush(tsr_text_stream *t, const char **text, size_t *len);

/* The chat template the chat calls use: name ("chatml", "gemma", "gemma4")
** or NULL for the model's own (its GGUF template, else the arch plugin's),
** which an engine starts with when the model has one. *chosen and *source
** (may be NULL) get its name and where it came from. */
TSR_API tsr_status tsr_chat_template_choose(tsr_engine *e, const char *name, const char **chosen,
                                            const char **source);
/* A conversation of n messages (roles[i]: "system", "user" or "assistant")
** rendered with the chosen template; with add_generation_prompt the
** assistant's turn is opened. tsr_chat_tokenize tokenizes it so that only the
** template's own markers become special tokens: the same characters inside a
** message stay text. */
TSR_API tsr_status tsr_chat_format(tsr_engine *e, const char *const *roles,
                                   const char *const *contents, size_t n,
                                   int add_generation_prompt, char **text);
TSR_API tsr_status tsr_chat_tokenize(tsr_engine *e, const char *const *roles,
                                     const char *const *contents, size_t n,
                                     int add_generation_prompt, int32_t **tokens, size_t *n_tokens);

/* ---- sequences and evaluation ---- */

/* Runs n tokens at the next positions of sequence seq (0 .. n_seq-1):
** prefill in ubatches, decode when n is 1. logits_last (n_vocab floats) gets
** the last token's logits, logits_all (when not NULL, n x n_vocab) every
** token's. A full context is TSR_ERR_NOMEM naming it; the sequence is then as
** before the call. */
TSR_API tsr_status tsr_engine_eval(tsr_engine *e, int32_t seq, const int32_t *tokens, int32_t n,
                                   float *logits_last, float *logits_all);
/* Tokens of several sequences in one pass (continuous batching): token i goes
** to the next position of seqs[i]. logits gets a row of n_vocab floats for
** each token whose want_logits[i] is non-zero, in batch order (want_logits
** NULL: the last token of each sequence). A failure leaves every sequence the
** batch touched as it was. */
TSR_API tsr_status tsr_engine_eval_multi(tsr_engine *e, int32_t n, const int32_t *tokens,
                                         const int32_t *seqs, const unsigned char *want_logits,
                                         float *logits);
/* out[i] = log p(tokens[i + 1] | the sequence before it), i < n - 1, after
** evaluating tokens at seq's next positions (out has n - 1 floats; natural log). */
TSR_API tsr_status tsr_engine_logprobs(tsr_engine *e, int32_t seq, const int32_t *tokens,
                                       int32_t n, float *out);

/* Positions seq holds (= the next position). */
TSR_API int32_t tsr_engine_seq_len(const tsr_engine *e, int32_t seq);
/* Forgets positions [p0, p1) of seq (p1 < 0: to the end); refused, naming
** why, where the sequence could not resume at p0 (recurrent state, or keys a
** sliding window has released). */
TSR_API tsr_status tsr_engine_seq_rm(tsr_engine *e, int32_t seq, int32_t p0, int32_t p1);
/* dst becomes a copy of src (sharing its cached keys and values; recurrent
** layers' state copied). */
TSR_API tsr_status tsr_engine_seq_cp(tsr_engine *e, int32_t src, int32_t dst);
/* Forgets every sequence but seq. */
TSR_API tsr_status tsr_engine_seq_keep(tsr_engine *e, int32_t seq);
/* How many leading tokens of tokens[0..n) seq already holds (prefix reuse). */
TSR_API int32_t tsr_engine_common_prefix(const tsr_engine *e, int32_t seq, const int32_t *tokens,
                                         int32_t n);
/* Drops positions [n_keep, n_keep + n_discard) of seq and moves the later ones
** down, re-rotating their cached keys; refused, unchanged, where the model
** cannot (recurrent layers, released sliding keys). */
TSR_API tsr_status tsr_engine_context_shift(tsr_engine *e, int32_t seq, int32_t n_keep,
                                            int32_t n_discard);

/* ---- sampling ---- */

/* A sampler with the profile's sampling settings, overridden by sets
** ("temperature=0.7", "top_k=40", "top_p=0.9", "min_p=0.05", "seed=7"; seed -1
** draws a random one). A bad value fails naming it. */
TSR_API tsr_status tsr_sampler_open(const tsr_engine *e, const char *const *sets, int n_sets,
                                    tsr_sampler **out);
TSR_API void tsr_sampler_close(tsr_sampler *s);
/* Picks one token from logits[0 .. n_vocab). */
TSR_API tsr_status tsr_sampler_sample(tsr_sampler *s, const float *logits, int32_t *token);
/* The seed it started from (the drawn one when the setting was -1). */
TSR_API uint64_t tsr_sampler_seed(const tsr_sampler *s);
/* "temp 0.8, top_k 40, top_p 0.95, min_p 0.05, seed 3" */
TSR_API const char *tsr_sampler_describe(const tsr_sampler *s);

/* ---- generation ---- */

enum tsr_stop {
  TSR_STOP_NONE = 0,     /* nothing generated yet, or it failed */
  TSR_STOP_LIMIT,        /* max_tokens reached */
  TSR_STOP_EOG,          /* the model ended it (its end-of-generation token is not emitted) */
  TSR_STOP_CANCELLED,    /* the callback returned 0, or tsr_engine_cancel */
  TSR_STOP_CONTEXT_FULL, /* the context is full and could not be shifted */
};

/* Called with each generated token and the text it completes (whole UTF-8
** characters only; len may be 0 while a character is split across tokens).
** Returning 0 stops the generation (TSR_STOP_CANCELLED). */
typedef int (*tsr_token_fn)(void *user, int32_t token, const char *text, size_t len);
/* Makes sequence seq hold exactly prompt[0..n_prompt) (reusing the prefix it
** already holds, evaluating the rest), then samples up to max_tokens tokens
** (< 0: until the model ends it or the context is full) with s, streaming each
** to fn (may be NULL). Decodes through the profile's speculator when it names
** one. A full context is shifted when n_keep >= 0 (the first n_keep tokens
** stay, half of the rest is dropped); otherwise, or where the model cannot
** shift, the generation stops with TSR_STOP_CONTEXT_FULL when max_tokens < 0
** and fails when a fixed max_tokens was asked; after TSR_STOP_CONTEXT_FULL
** tsr_error_message() says why it could not shift. *stop (may be NULL) says
** why it ended. */
TSR_API tsr_status tsr_generate(tsr_engine *e, int32_t seq, tsr_sampler *s, const int32_t *prompt,
                                size_t n_prompt, int64_t max_tokens, int32_t n_keep,
                                tsr_token_fn fn, void *user, enum tsr_stop *stop);
/* Drafts a speculative step proposes at most on e: 0 when the profile names no
** speculator, else up to TSR_MAX_DRAFT (a draft and its token fit one ubatch). */
#define TSR_MAX_DRAFT 8
TSR_API int32_t tsr_engine_max_draft(const tsr_engine *e);
/* One speculative step of sequence seq through the profile's speculator, for a caller
** that schedules its own decoding (tsr_generate does this itself): next is the token to
** evaluate next (sampled, not yet in the cache); up to max_draft proposals (at most
** tsr_engine_max_draft) are evaluated with it in one batch and verified with s, so the
** output is distributed as s's own draws (the greedy text at temperature 0). out
** (max_draft + 1 entries) gets the kept proposals, already in the cache, then the
** target's own token, the new next (not in it); *n_out their count, 1 at least. */
TSR_API tsr_status tsr_speculate(tsr_engine *e, int32_t seq, int32_t next, tsr_sampler *s,
                                 int32_t max_draft, int32_t *out, int32_t *n_out);
/* A speculative step of n sequences at once (continuous batching): seqs[i] with next[i],
** its sampler samplers[i] and at most max_draft[i] proposals. Every sequence's token and
** proposals go through one verify batch, which fits a ubatch (where the sum of
** max_draft[i] + 1 would not, every sequence gets ubatch / n - 1 at most; more sequences than
** a ubatch holds are refused). out holds n rows of TSR_MAX_DRAFT + 1 entries (row i as
** tsr_speculate's out for seqs[i]), n_out n counts. A model with recurrent layers verifies each sequence
** in a batch of its own (its state rolls back from one batch's checkpoints). */
TSR_API tsr_status tsr_speculate_multi(tsr_engine *e, int32_t n, const int32_t *seqs,
                                       const int32_t *next, tsr_sampler *const *samplers,
                                       const int32_t *max_draft, int32_t *out, int32_t *n_out);
/* Stops the tsr_generate running on e at its next token (or prefill chunk);
** safe from any thread. A cancel while none runs is forgotten. */
TSR_API void tsr_engine_cancel(tsr_engine *e);
/* Called between prefill chunks: done of total prompt tokens evaluated. */
typedef void (*tsr_progress_fn)(void *user, int64_t done, int64_t total);
TSR_API void tsr_engine_set_progress(tsr_engine *e, tsr_progress_fn fn, void *user);
/* Called with a line of text when generate does something the caller did not
** ask for in so many words: "context full at 2048 tokens: shifted, kept the
** first 4, dropped the next 1022". */
typedef void (*tsr_notice_fn)(void *user, const char *text);
TSR_API void tsr_engine_set_notice(tsr_engine *e, tsr_notice_fn fn, void *user);

/* What the last tsr_generate on e did. */
enum tsr_stat {
  TSR_STAT_PROMPT_TOKENS,    /* tokens of the prompt */
  TSR_STAT_PROMPT_REUSED,    /* of them, already held by the sequence */
  TSR_STAT_PROMPT_MS,        /* time evaluating the rest */
  TSR_STAT_GENERATED,        /* tokens generated (streamed) */
  TSR_STAT_EVAL_STEPS,       /* decode steps (speculative steps count once) */
  TSR_STAT_EVAL_MS,          /* time in them */
  TSR_STAT_SHIFTS,           /* context shifts */
  TSR_STAT_MAX_DRAFT,        /* drafts a speculative step proposes at most (0: no speculator) */
};
TSR_API double tsr_engine_stat(const tsr_engine *e, enum tsr_stat what);

/* ---- what the plugins did ---- */

/* fn for every counter of every loaded plugin (work counted since the
** engine opened or the last reset); fn must not call back into e. */
typedef void (*tsr_counter_fn)(void *user, const char *plugin, const char *counter,
                               uint64_t value);
TSR_API void tsr_engine_counters(const tsr_engine *e, tsr_counter_fn fn, void *user);
TSR_API void tsr_engine_reset_counters(tsr_engine *e);
/* Fails naming each plugin in names that counted no work (or is not loaded). */
TSR_API tsr_status tsr_engine_require_engaged(const tsr_engine *e, const char *const *names,
                                              int n);
enum {
  TSR_REPORT_DECODE = 1,     /* a line per decode policy and layer kind: V rows skipped */
  TSR_REPORT_ENGAGEMENT = 2, /* "plugin: counter=n, ..." for every plugin */
  TSR_REPORT_GRAPHS = 4,     /* the backend's captured graphs and replays, if it keeps any */
};
/* Those reports as text, a line each (*text: tsr_free it; "" when none applies). */
TSR_API tsr_status tsr_engine_report(const tsr_engine *e, unsigned what, char **text);

#ifdef __cplusplus
}
#endif

#endif /* TESSERA_H */
