/* Subcommands of the `tessera` command line. Each takes argv with argv[0]
** set to the subcommand's name and returns the process exit code:
** 0 success, 1 runtime error, 2 usage / profile / input error. */
#ifndef TSR_CLI_H
#define TSR_CLI_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { TSR_EXIT_OK = 0, TSR_EXIT_RUNTIME = 1, TSR_EXIT_USAGE = 2 };

/* A whole decimal integer in [lo, hi]; false for anything else. */
static inline bool tsr_cli_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) return false;
  *out = v;
  return true;
}

/* "--help", "-h" (and "help" where a subcommand name is expected) */
static inline bool tsr_cli_is_help(const char *arg) {
  return !strcmp(arg, "--help") || !strcmp(arg, "-h") || !strcmp(arg, "help");
}

int tsr_cli_gguf(int argc, char **argv);
int tsr_cli_gen_model(int argc, char **argv);
int tsr_cli_plugins(int argc, char **argv);
int tsr_cli_profile(int argc, char **argv);
int tsr_cli_convert(int argc, char **argv);
int tsr_cli_parity(int argc, char **argv);
int tsr_cli_run(int argc, char **argv);
int tsr_cli_perplexity(int argc, char **argv);
int tsr_cli_logit_eq(int argc, char **argv);
int tsr_cli_serve(int argc, char **argv);
int tsr_cli_ruler(int argc, char **argv);
int tsr_cli_ab(int argc, char **argv);
int tsr_cli_bench(int argc, char **argv);

#endif
