/*
** tessera serve: an OpenAI-compatible HTTP server over one engine, with
** continuous batching across slots (docs/SERVER.md is the contract).
*/
#ifndef TSR_SERVER_H
#define TSR_SERVER_H

#include <stdbool.h>
#include <stddef.h>

struct tsr_server_options {
  /* the engine: tsr_engine_open's profile (NULL: the default), model (or NULL) and
  ** --set overrides */
  const char *profile, *model;
  const char *const *sets;
  int n_sets;
  const char *host;          /* NULL: the profile's server.host */
  int port;                  /* -1: the profile's server.port; 0: a free port */
  int parallel;              /* slots; <= 0: the profile's server.parallel */
  int queue;                 /* requests that may wait for a slot */
  const char *api_key;       /* NULL: the profile's server.api_key_env, if set */
  const char *alias;         /* model id; NULL: the model file's name */
  size_t max_body;           /* request body limit in bytes */
  const char *chat_template; /* NULL: the GGUF's, else the arch plugin's */
  bool chat_page;            /* serve the chat page at / */
};

/* Loads the engine, listens, serves until SIGINT or SIGTERM, then cancels
** what is in flight and frees everything. Returns a tessera exit code
** (0 after a signal). */
int tsr_server_run(const struct tsr_server_options *opt);

#endif
