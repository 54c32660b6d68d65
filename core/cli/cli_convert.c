/* `tessera convert`: Hugging Face checkpoint -> GGUF (core/model/convert.h). */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "model/convert.h"
#include "common/error.h"
#include "abi/plugin_host.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: tessera convert HF_DIR OUT.gguf [--outtype TYPE] [--token-embedding-type TYPE]\n"
          "                       [--path DIR]... [--quiet]\n"
          "\n"
          "Converts a Hugging Face checkpoint (config.json, model.safetensors or indexed\n"
          "shards, tokenizer.json) into GGUF with llama.cpp's names and layouts. The plugin\n"
          "whose converter lists config.json's model_type (tessera plugins: convert) does\n"
          "the mapping.\n"
          "\n"
          "  --outtype TYPE  %s (default f16). Norms, biases and small vectors\n"
          "                  stay f32. A tensor whose row length the type cannot hold is\n"
          "                  stored as q8_0 or f16, with a note naming it.\n"
          "  --token-embedding-type TYPE\n"
          "                  token_embd.weight in TYPE instead (a tied embedding is also\n"
          "                  the output head: its rounding moves the logits most)\n"
          "  --path DIR      also search DIR for plugins (before $TESSERA_PLUGIN_PATH)\n"
          "  --quiet         print errors only\n"
          "\n"
          "exit codes: 0 ok, 1 runtime error, 2 usage error, unknown model_type, malformed or\n"
          "            unsupported checkpoint\n",
          tsr_convert_outtypes());
}

int tsr_cli_convert(int argc, char **argv) {
  const char *pos[2] = {NULL, NULL};
  const char *dirs[8];
  int n_pos = 0, n_dirs = 0;
  bool quiet = false;
  struct tsr_convert_options o = {.outtype = TSR_F16};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (tsr_cli_is_help(a)) {
      usage(stdout);
      return TSR_EXIT_OK;
    } else if ((!strcmp(a, "--outtype") || !strcmp(a, "--token-embedding-type")) &&
               i + 1 < argc) {
      const bool embd = !strcmp(a, "--token-embedding-type");
      int t = tsr_convert_outtype_parse(argv[++i]);
      if (t < 0) {
        fprintf(stderr, "tessera convert: %s '%s' is not one of %s\n", a, argv[i],
                tsr_convert_outtypes());
        return TSR_EXIT_USAGE;
      }
      if (embd) {
        o.token_embd_set = true;
        o.token_embd_type = (enum tsr_dtype)t;
      } else {
        o.outtype = (enum tsr_dtype)t;
      }
    } else if (!strcmp(a, "--path") && i + 1 < argc && n_dirs < 8) {
      dirs[n_dirs++] = argv[++i];
    } else if (!strcmp(a, "--quiet") || !strcmp(a, "-q")) {
      quiet = true;
    } else if (a[0] == '-' && a[1]) {
      fprintf(stderr, "tessera convert: unknown or incomplete option '%s'\n\n", a);
      usage(stderr);
      return TSR_EXIT_USAGE;
    } else if (n_pos < 2) {
      pos[n_pos++] = a;
    } else {
      fprintf(stderr, "tessera convert: unexpected argument '%s'\n", a);
      return TSR_EXIT_USAGE;
    }
  }
  if (n_pos != 2) {
    usage(stderr);
    return TSR_EXIT_USAGE;
  }
  o.hf_dir = pos[0];
  o.out_path = pos[1];
  o.log = quiet ? NULL : stderr;

  struct tsr_plugin_host *h = NULL;
  tsr_status st = tsr_plugin_host_new(&h);
  for (int i = 0; i < n_dirs && st == TSR_OK; i++) st = tsr_plugin_host_add_search_dir(h, dirs[i]);
  if (st == TSR_OK) st = tsr_convert_run(h, &o, NULL);
  tsr_plugin_host_free(h);
  if (st == TSR_OK) return TSR_EXIT_OK;
  fprintf(stderr, "tessera convert: %s\n", tsr_error_message());
  return (st == TSR_ERR_NOMEM || st == TSR_ERR_INTERNAL) ? TSR_EXIT_RUNTIME : TSR_EXIT_USAGE;
}
