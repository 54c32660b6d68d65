#!/usr/bin/env python3
"""How much does q8_0 rounding alone cost a fixture? Rounds groups of a Hugging Face
checkpoint's weights through q8_0 with ggml's arithmetic (blocks of 32 along each row,
d = amax/127 in f32, codes roundf(x/d), stored and applied scale f16(d)), writes the
result as an f32 checkpoint, converts it with tessera to f32 GGUF and runs `tessera
parity` against the fixture's golden logits of the unrounded weights.

    python3 tests/reference/q8_0_roundtrip.py TESSERA FIXTURE_DIR WORK_DIR [GROUP...]

GROUP: all (default), embed, not_embed, attn, mlp. For qwen3_tied, `all` gives logits
identical to `tessera convert --outtype q8_0` (logit-eq mean TV 0), so the loss that
file shows is q8_0's own, not tessera's."""
import os
import shutil
import subprocess
import sys

import numpy as np
import torch
from safetensors.torch import load_file, save_file

GROUPS = {
    "all": lambda k, v: v.ndim >= 2,
    "embed": lambda k, v: v.ndim >= 2 and "embed" in k,
    "not_embed": lambda k, v: v.ndim >= 2 and "embed" not in k and "lm_head" not in k,
    "attn": lambda k, v: v.ndim >= 2 and "self_attn" in k,
    "mlp": lambda k, v: v.ndim >= 2 and "mlp" in k,
}


def q8_0(x):
    r = x.reshape(-1, 32).astype(np.float32)
    d = (np.abs(r).max(1, keepdims=True) / np.float32(127)).astype(np.float32)
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
    y = r * inv
    q = np.sign(y) * np.floor(np.abs(y) + np.float32(0.5))  # roundf: half away from zero
    return (q * d.astype(np.float16).astype(np.float32)).reshape(x.shape).astype(np.float32)


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    tessera, fixture, work = sys.argv[1:4]
    weights = {k: v.float().numpy() for k, v in load_file(f"{fixture}/model.safetensors").items()}
    for group in sys.argv[4:] or ["all"]:
        out = os.path.join(work, f"{os.path.basename(fixture.rstrip('/'))}-{group}")
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(fixture, out, ignore=shutil.ignore_patterns("model.safetensors"))
        rounded = {k: q8_0(v) if GROUPS[group](k, v) and v.shape[-1] % 32 == 0 else v
                   for k, v in weights.items()}
        save_file({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in rounded.items()},
                  f"{out}/model.safetensors", metadata={"format": "pt"})
        subprocess.run([tessera, "convert", out, f"{out}.gguf", "--outtype", "f32", "--quiet"],
                       check=True)
        r = subprocess.run([tessera, "parity", f"{out}.gguf", f"{fixture}/golden.gguf"],
                           capture_output=True, text=True)
        summary = [line for line in (r.stdout + r.stderr).splitlines() if "mean KL" in line]
        print(f"{group}: {summary[-1].strip() if summary else r.stderr.strip()}")


if __name__ == "__main__":
    main()
