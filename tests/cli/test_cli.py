"""The `tessera` command line as a user meets it: exit codes and messages.

usage: test_cli.py TESSERA_BINARY SOURCE_ROOT
Prints "ok   name" / "FAIL name" per case, like the C tests.
"""
import os
import subprocess
import sys
import tempfile
from cases import case, finish

TESSERA, SOURCE = sys.argv[1], sys.argv[2]


def run(*args, cwd=None):
    p = subprocess.run([TESSERA, *args], capture_output=True, text=True, cwd=cwd, timeout=120)
    return p.returncode, p.stdout, p.stderr




def expect(code, out, err, want_code, *needles):
    assert code == want_code, f"exit {code}, wanted {want_code}; stderr: {err.strip()}"
    text = out + err
    for n in needles:
        assert n in text, f"'{n}' not in output:\n{text}"


def write(dir_, name, text):
    path = os.path.join(dir_, name)
    with open(path, "w") as f:
        f.write(text)
    return path


TMP = tempfile.mkdtemp(prefix="tsr_cli_")
DEFAULT = os.path.join(SOURCE, "conf", "default.yaml")


@case
def test_help_lists_every_command_and_exit_codes():
    code, out, err = run("--help")
    expect(code, out, err, 0, "gguf", "plugins", "profile", "serve", "exit codes")


@case
def test_unknown_command_is_refused():
    expect(*run("frobnicate"), 2, "unknown command 'frobnicate'")


@case
def test_plugins_lists_every_plugin_folder():
    code, out, err = run("plugins")
    expect(code, out, err, 0, "core", "flash", "q8_0")
    for name in ["arch_qwen", "arch_gemma4", "attn_dca", "kv_turbo", "kv_tcq", "sparse_v",
                 "spec_mtp"]:
        assert name in out, f"{name} missing from tessera plugins:\n{out}"
    assert "[no code yet]" not in out, f"a shipped plugin without code:\n{out}"


@case
def test_default_profile_checks_with_composition_and_memory_plan():
    code, out, err = run("profile", "check", DEFAULT)
    expect(code, out, err, 0, "composition (backend cpu)", "attention flash (core",
           "K f16 (native)", "memory plan:", "weights", "KV full")


@case
def test_example_deployment_extends_default():
    # the example asks for cuda: flash and the core codecs negotiate there too (whether a GPU
    # answers is for `tessera run` to find out)
    path = os.path.join(SOURCE, "conf", "example-deployment.yaml")
    code, out, err = run("profile", "check", path, "--set", "backend=cpu")
    expect(code, out, err, 0, "context: 131072", "K q8_0 (in-register)")
    code, out, err = run("profile", "check", path)
    expect(code, out, err, 0, "composition (backend cuda)", "K q8_0 (in-register)")


@case
def test_gemma4_reference_profiles_run_the_committed_model():
    # the trained Gemma 4 reference model: DCA on its full layers only, and a pass key
    # found half again past its 2048-token trained context
    dca = os.path.join(SOURCE, "conf", "ref-gemma4-dca.yaml")
    code, out, err = run("profile", "check", dca)
    expect(code, out, err, 0, "gemma4, 8 layers", "window 128")
    sliding = out[out.index("  sliding "):out.index("  full ")]
    full = out[out.index("  full "):out.index("  speculator")]
    assert "attention flash (core" in sliding and "attention dca" not in sliding, out
    assert "attention dca (attn_dca" in full and "attention flash" not in full, out
    code, out, err = run("ruler", "--profile", dca, "--task", "passkey", "--ctx", "3072",
                         "--n", "2", "--no-chat")
    expect(code, out, err, 0, "accuracy 100.0% (2.0 of 2)")


@case
def test_unknown_key_names_file_line_and_column():
    p = write(TMP, "unknown.yaml", "model: default\nplugins: [arch_qwen]\nsampling:\n  temprature: 1\n")
    expect(*run("profile", "check", p), 2, "unknown.yaml:4:3", "temprature")


@case
def test_wrong_type_is_refused():
    p = write(TMP, "wrongtype.yaml", "model: default\ncontext: lots\n")
    expect(*run("profile", "check", p), 2, "wrongtype.yaml:2:10", "context")


@case
def test_extends_cycle_is_refused():
    write(TMP, "a.yaml", "extends: b.yaml\nmodel: default\n")
    p = write(TMP, "b.yaml", "extends: a.yaml\n")
    expect(*run("profile", "check", p), 2, "cycle")


@case
def test_impossible_composition_names_layer_and_codec():
    expect(*run("profile", "check", DEFAULT, "--set", "kv.k=q9_0"), 2, "layer 0 (full)",
           "K codec 'q9_0' is not registered")
    expect(*run("profile", "check", DEFAULT, "--set", "attention=dca"), 2,
           "attention 'dca' is not provided by any loaded plugin")


@case
def test_plugin_without_code_is_refused():
    # a plugin folder whose manifest names no library: its code is not written yet
    os.makedirs(os.path.join(TMP, "no_code_yet"), exist_ok=True)
    write(os.path.join(TMP, "no_code_yet"), "plugin.ini",
          "[plugin]\nname = no_code_yet\nversion = 0.0.0\nabi = 2.1\n"
          "provides = attention:1\nrequires =\ndescription = not written yet\n")
    p = write(TMP, "nocode.yaml", f"extends: {DEFAULT}\nplugins: [arch_qwen, "
              "{name: no_code_yet, path: no_code_yet}]\n")
    expect(*run("profile", "check", p), 2, "no_code_yet", "has no code yet")


@case
def test_a_manifest_line_too_long_is_named():
    # inih splits a line past its buffer; the error names the long line, not the remainder
    d = os.path.join(TMP, "long_desc")
    os.makedirs(d, exist_ok=True)
    write(d, "plugin.ini", "[plugin]\nname = long_desc\nversion = 0.0.0\nabi = 2.1\n"
          "provides = attention:1\nrequires =\ndescription = " + "d" * 250 + "\n")
    p = write(TMP, "longdesc.yaml", f"extends: {DEFAULT}\nplugins: [arch_qwen, "
              "{name: long_desc, path: long_desc}]\n")
    expect(*run("profile", "check", p), 2, "plugin.ini:7: the line is 264 bytes long",
           "at most 199")


@case
def test_memory_limit_is_enforced():
    expect(*run("profile", "check", DEFAULT, "--set", "memory_limit=1KiB"), 2, "memory_limit")


@case
def test_gen_model_rejects_bad_options():
    expect(*run("gen-model", "--arch", "llama", "-o", os.path.join(TMP, "x.gguf")), 2, "llama")
    expect(*run("gen-model", "--arch", "qwen3", "--type", "q4_K", "-o",
                os.path.join(TMP, "x.gguf")), 2, "block size")
    assert not os.path.exists(os.path.join(TMP, "x.gguf")), "a failed gen-model left a file"


@case
def test_fifos_and_devices_are_refused_not_waited_on():
    # a FIFO without a writer would block an open() forever: every reader refuses it
    fifo = os.path.join(TMP, "fifo")
    if not os.path.exists(fifo):
        os.mkfifo(fifo)
    model = os.path.join(SOURCE, "models", "ref-qwen3-21m.gguf")
    for args in (("gguf", "info", fifo), ("profile", "check", fifo),
                 ("run", "-m", fifo, "-p", "x", "-n", "1"),
                 ("run", "-m", model, "-f", fifo, "-n", "1"),
                 ("profile", "check", write(TMP, "ext_fifo.yaml", f"extends: {fifo}\n")),
                 ("gguf", "info", "/dev/zero"), ("gguf", "info", TMP)):
        code, out, err = run(*args)
        assert code == 2, f"{args}: exit {code}: {err.strip()}"
        assert "not a regular file" in err, f"{args}: {err.strip()}"


@case
def test_a_broken_plugin_elsewhere_on_the_path_is_skipped_with_a_warning():
    # its manifest provides an arch and a converter and names a library that is not one:
    # converting a model another plugin handles still works, and the warning names the broken one
    d = os.path.join(TMP, "broken_path", "broken_arch")
    os.makedirs(d, exist_ok=True)
    write(d, "plugin.ini", "[plugin]\nname = broken_arch\nversion = 1.0.0\nabi = 2.1\n"
          "provides = arch:1, convert:1\nrequires =\nlibrary = libbroken.so\ndescription = broken\n")
    write(d, "libbroken.so", "not an ELF file\n")
    env = dict(os.environ)
    env["TESSERA_PLUGIN_PATH"] = os.path.dirname(d) + ":" + env.get("TESSERA_PLUGIN_PATH", "")
    out = os.path.join(TMP, "broken_convert.gguf")
    p = subprocess.run([TESSERA, "convert", os.path.join(SOURCE, "tests", "reference", "fixtures",
                                                         "qwen3_tied"), out, "--outtype", "f32"],
                       capture_output=True, text=True, env=env, timeout=120)
    expect(p.returncode, p.stdout, p.stderr, 0, "skipping a plugin", "broken_arch", "wrote")


@case
def test_a_prompt_file_with_a_nul_byte_is_refused_not_cut():
    path = os.path.join(TMP, "nul.txt")
    with open(path, "wb") as f:
        f.write(b"hello\0world")
    model = os.path.join(SOURCE, "models", "ref-qwen3-21m.gguf")
    expect(*run("run", "-m", model, "-f", path, "-n", "1"), 2, "NUL byte at offset 5")


finish("cli")
