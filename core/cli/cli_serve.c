/* `tessera serve`: the OpenAI-compatible HTTP server (docs/SERVER.md). */
#include <stdio.h>

#include "cli.h"
#include "server/server.h"

#define MAX_SETS 64

static void serve_usage(FILE *f) {
  fprintf(f,
          "usage: tessera serve [--profile P | -m MODEL.gguf] [--host H] [--port N]\n"
          "                     [--parallel N] [--queue N] [--api-key KEY] [--alias NAME]\n"
          "                     [--max-body BYTES] [--chat-template chatml|gemma|gemma4]\n"
          "                     [--header-timeout S] [--body-timeout S]\n"
          "                     [--client-connections N] [--cors-origins LIST]\n"
          "                     [--set key=value]... [--threads N] [--no-chat-page]\n"
          "Serves /v1/chat/completions, /v1/completions, /completion, /tokenize,\n"
          "/detokenize, /v1/models, /props, /health, /metrics and /slots (docs/SERVER.md),\n"
          "and a chat page at / (--no-chat-page turns it off). Host,\n"
          "port, slots (--parallel) and the API key's variable default to the profile's\n"
          "server section; --port 0 takes a free port. --queue N requests may wait for a\n"
          "slot (default 64); --max-body (default 1048576) limits a request body. Once\n"
          "listening it writes 'tessera serve: listening on http://HOST:PORT' to stderr.\n"
          "--parallel, --header-timeout, --body-timeout, --client-connections and\n"
          "--cors-origins set the profile's server keys of the same names.\n"
          "SIGINT/SIGTERM cancel what is in flight and stop it (exit 0).\n");
}

static int usage_error(const char *what, const char *arg) {
  fprintf(stderr, "tessera serve: %s%s\n(tessera serve --help for usage)\n", what, arg);
  return TSR_EXIT_USAGE;
}

/* Flags that are the profile's server keys: each becomes a --set. */
static const struct {
  const char *flag, *key;
} server_keys[] = {{"--parallel", "parallel"},
                   {"--header-timeout", "header_timeout"},
                   {"--body-timeout", "body_timeout"},
                   {"--client-connections", "client_connections"},
                   {"--cors-origins", "cors_origins"}};
#define N_SERVER_KEYS (sizeof server_keys / sizeof *server_keys)

int tsr_cli_serve(int argc, char **argv) {
  static const char *sets[MAX_SETS + N_SERVER_KEYS + 2];
  static char threads[32];
  static char key_sets[N_SERVER_KEYS][512];
  struct tsr_server_options o = {.port = -1, .queue = 64, .max_body = 1 << 20, .chat_page = true};
  int n_sets = 0;
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i];
    if (tsr_cli_is_help(f)) {
      serve_usage(stdout);
      return TSR_EXIT_OK;
    }
    if (f[0] != '-') return usage_error("unexpected argument ", f);
    if (!strcmp(f, "--no-chat-page")) {
      o.chat_page = false;
      continue;
    }
    if (i + 1 >= argc) return usage_error("a value is missing after ", f);
    const char *v = argv[++i];
    int64_t n = 0;
    bool ok = true;
    size_t k = 0;
    while (k < N_SERVER_KEYS && strcmp(f, server_keys[k].flag)) k++;
    if (k < N_SERVER_KEYS) { /* the profile checks the value and names the flag's key */
      const bool again = key_sets[k][0] != 0; /* the set is listed already: the last wins */
      int w = snprintf(key_sets[k], sizeof key_sets[k], "server.%s=%s", server_keys[k].key, v);
      if (w < 0 || (size_t)w >= sizeof key_sets[k]) return usage_error("value too long for ", f);
      if (!again) sets[n_sets++] = key_sets[k];
      continue;
    }
    if (!strcmp(f, "-m") || !strcmp(f, "--model")) o.model = v;
    else if (!strcmp(f, "--profile")) o.profile = v;
    else if (!strcmp(f, "--host")) o.host = v;
    else if (!strcmp(f, "--port")) ok = tsr_cli_parse_i64(v, 0, 65535, &n), o.port = (int)n;
    else if (!strcmp(f, "--queue")) ok = tsr_cli_parse_i64(v, 0, 4096, &n), o.queue = (int)n;
    else if (!strcmp(f, "--api-key")) ok = *v != 0, o.api_key = v;
    else if (!strcmp(f, "--alias")) ok = *v != 0, o.alias = v;
    else if (!strcmp(f, "--max-body"))
      ok = tsr_cli_parse_i64(v, 1, (int64_t)1 << 30, &n), o.max_body = (size_t)n;
    else if (!strcmp(f, "--chat-template")) o.chat_template = v;
    else if (!strcmp(f, "--threads") || !strcmp(f, "-t")) {
      /* the profile's `threads`, ahead of the --set overrides */
      ok = tsr_cli_parse_i64(v, 1, 4096, &n);
      if (ok && !threads[0]) {
        memmove(sets + 1, sets, (size_t)n_sets++ * sizeof *sets);
        sets[0] = threads;
      }
      snprintf(threads, sizeof threads, "threads=%lld", (long long)n);
    }
    else if (!strcmp(f, "--set")) {
      if (n_sets == MAX_SETS) return usage_error("more than 64 --set", "");
      sets[n_sets++] = v;
    } else return usage_error("unknown option ", f);
    if (!ok) {
      fprintf(stderr, "tessera serve: %s: '%s' is not a valid value\n", f, v);
      return TSR_EXIT_USAGE;
    }
  }
  o.sets = sets;
  o.n_sets = n_sets;
  return tsr_server_run(&o);
}
