/* `tessera`: one binary, one subcommand per tool. */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "tessera/tessera.h"

struct subcommand {
  const char *name;
  int (*run)(int argc, char **argv); /* NULL: arrives in a later version */
  const char *summary;
};

static const struct subcommand g_subcommands[] = {
    {"run", tsr_cli_run, "generate text from a prompt with a profile"},
#ifdef TSR_HAVE_SERVER
    {"serve", tsr_cli_serve, "OpenAI-compatible HTTP server"},
#else
    {"serve", NULL, "OpenAI-compatible HTTP server (needs libmicrohttpd at build time)"},
#endif
    {"perplexity", tsr_cli_perplexity, "perplexity and KL divergence against a saved base"},
    {"logit-eq", tsr_cli_logit_eq, "compare two profiles' logits on the same tokens"},
    {"ab", tsr_cli_ab, "the same prompts through two profiles, side by side"},
    {"ruler", tsr_cli_ruler, "synthetic long-context tasks with scoring"},
    {"bench", tsr_cli_bench, "prefill and decode tokens/s against the device's ceilings"},
    {"convert", tsr_cli_convert, "Hugging Face safetensors + config -> GGUF"},
    {"gen-model", tsr_cli_gen_model, "random weights in a real architecture's shape"},
    {"gguf", tsr_cli_gguf, "inspect GGUF files"},
    {"parity", tsr_cli_parity, "logits against golden reference outputs"},
    {"plugins", tsr_cli_plugins, "list plugins and their capabilities"},
    {"profile", tsr_cli_profile, "check a profile: composition and memory plan"},
};
#define N_SUBCOMMANDS (sizeof g_subcommands / sizeof g_subcommands[0])

static void usage(FILE *f) {
  fprintf(f, "usage: tessera <command> [options]   (tessera <command> --help)\n\ncommands:\n");
  for (size_t i = 0; i < N_SUBCOMMANDS; i++)
    fprintf(f, "  %-11s %s%s\n", g_subcommands[i].name, g_subcommands[i].summary,
            g_subcommands[i].run ? "" : " [not built in this version]");
  fprintf(f, "\nexit codes: 0 success, 1 runtime error, 2 usage or input error\n");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return TSR_EXIT_USAGE;
  }
  if (tsr_cli_is_help(argv[1])) {
    usage(stdout);
    return TSR_EXIT_OK;
  }
  if (!strcmp(argv[1], "--version")) {
    printf("tessera %s\n", tsr_version());
    return TSR_EXIT_OK;
  }
  for (size_t i = 0; i < N_SUBCOMMANDS; i++) {
    const struct subcommand *sc = &g_subcommands[i];
    if (strcmp(argv[1], sc->name)) continue;
    if (sc->run) return sc->run(argc - 1, argv + 1);
    bool help = argc > 2 && (tsr_cli_is_help(argv[2]));
    fprintf(help ? stdout : stderr, "tessera %s: %s\nnot built in this version of tessera (%s)\n",
            sc->name, sc->summary, tsr_version());
    return help ? TSR_EXIT_OK : TSR_EXIT_USAGE;
  }
  fprintf(stderr, "tessera: unknown command '%s'\n\n", argv[1]);
  usage(stderr);
  return TSR_EXIT_USAGE;
}
