/* `tessera parity MODEL.gguf GOLDEN.gguf`: logits against a reference. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "quality/parity.h"

static void parity_usage(FILE *f) {
  fprintf(f,
          "usage: tessera parity MODEL.gguf GOLDEN.gguf [--max-rel X] [--min-argmax F] [--max-kl X]\n"
          "                      [--threads N] [--attention NAME] [--plugin-path DIR]\n"
          "                      [--require-engaged PLUGIN]...\n"
          "Runs the model on the golden token ids (tests/reference writes golden.gguf) and\n"
          "compares logits per position: max abs and relative error, argmax agreement,\n"
          "KL divergence; for sequence 0 also the hidden state after each layer.\n"
          "--require-engaged fails the run (exit 1) if PLUGIN counted no work.\n"
          "Exits 1 when max rel > --max-rel (default 1e-4), argmax agreement <\n"
          "--min-argmax (default 1.0) or mean KL > --max-kl (default: no limit).\n");
}

int tsr_cli_parity(int argc, char **argv) {
  const char *model = NULL, *golden = NULL;
  struct tsr_parity_options opt = {0};
  const char *required[16];
  int n_required = 0;
  double max_rel = 1e-4, min_argmax = 1.0, max_kl = INFINITY;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (tsr_cli_is_help(a)) {
      parity_usage(stdout);
      return TSR_EXIT_OK;
    }
    bool has_value = i + 1 < argc;
    if (!strcmp(a, "--max-rel") && has_value) max_rel = atof(argv[++i]);
    else if (!strcmp(a, "--min-argmax") && has_value) min_argmax = atof(argv[++i]);
    else if (!strcmp(a, "--max-kl") && has_value) max_kl = atof(argv[++i]);
    else if (!strcmp(a, "--threads") && has_value) opt.n_threads = atoi(argv[++i]);
    else if (!strcmp(a, "--attention") && has_value) opt.attention = argv[++i];
    else if (!strcmp(a, "--plugin-path") && has_value) opt.plugin_dir = argv[++i];
    else if (!strcmp(a, "--require-engaged") && has_value && n_required < 16)
      required[n_required++] = argv[++i];
    else if (a[0] != '-' && !model) model = a;
    else if (a[0] != '-' && !golden) golden = a;
    else {
      fprintf(stderr, "tessera parity: unexpected argument '%s'\n", a);
      parity_usage(stderr);
      return TSR_EXIT_USAGE;
    }
  }
  if (!model || !golden) {
    parity_usage(stderr);
    return TSR_EXIT_USAGE;
  }
  struct tsr_parity_report *r = calloc(1, sizeof *r);
  if (!r) return TSR_EXIT_RUNTIME;
  opt.require_engaged = required;
  opt.n_require_engaged = n_required;
  tsr_status st = tsr_parity_run(model, golden, &opt, r);
  if (st != TSR_OK) {
    fprintf(stderr, "tessera parity: %s\n", tsr_error_message());
    free(r);
    /* a plugin that never engaged is a failed run, not a usage error */
    return (st == TSR_ERR_NOMEM || st == TSR_ERR_INTERNAL) ? TSR_EXIT_RUNTIME : TSR_EXIT_USAGE;
  }
  tsr_parity_print(r, stdout);
  bool pass = r->total.max_rel <= max_rel && r->total.argmax_agreement >= min_argmax &&
              r->total.mean_kl <= max_kl;
  printf("%s: max rel %.3e (limit %.1e), argmax %.2f%% (limit %.2f%%), mean KL %.3e (limit "
         "%.1e)\n", pass ? "PASS" : "FAIL", r->total.max_rel, max_rel,
         100.0 * r->total.argmax_agreement, 100.0 * min_argmax, r->total.mean_kl, max_kl);
  free(r);
  return pass ? TSR_EXIT_OK : TSR_EXIT_RUNTIME;
}
