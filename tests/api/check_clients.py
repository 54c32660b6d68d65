"""`tessera run` and `tessera serve` are clients of the embedding API: every engine,
tokenizer, sampler, profile and plugin access goes through tessera/tessera.h. Their
sources may include only that header, each other's headers, and three utilities below
it that touch no engine state: common/error.h (formatting their own error messages),
common/file.h (opening a file, refusing FIFOs and devices) and model/json.h (the
server's cJSON helpers). Fails naming each other include or
internal call it finds."""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1])
clients = [root / "core/cli/cli_run.c", root / "core/cli/cli_serve.c",
           *sorted((root / "core/server").glob("*.[ch]"))]
allowed = {"tessera/tessera.h", "cli.h", "../cli/cli.h", "server.h", "server/server.h",
           "server_internal.h", "common/error.h", "common/file.h", "model/json.h"}
# prefixes of the core's internal functions a client of the API has no business calling
internal = re.compile(r"\b(tsr_(?:engine_(?:new|free|setup|backend|eval_batch|seq_lens|speculate)|"
                      r"setup_\w+|profile_\w+|plugin_host_\w+|tokenizer_\w+|kv_cache_\w+|"
                      r"sampler_(?:new|free|params_of)|chat_render\w*|utf8_stream_\w+|"
                      r"backend_\w+|graph_\w+))\s*\(")
problems = []
for path in clients:
    text = path.read_text()
    for inc in re.findall(r'#include\s+"([^"]+)"', text):
        if inc not in allowed:
            problems.append(f"{path.relative_to(root)}: includes {inc}")
    for name in sorted(set(internal.findall(text))):
        problems.append(f"{path.relative_to(root)}: calls {name}")
for p in problems:
    print("FAIL", p)
print(f"{len(clients)} client files checked, {len(problems)} problems")
sys.exit(1 if problems else 0)
