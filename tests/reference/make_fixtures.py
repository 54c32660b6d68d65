#!/usr/bin/env python3
"""Builds the reference-parity fixtures: tiny random-weight Hugging Face models and their goldens.

For every entry of fixture_models.FIXTURES this writes tests/reference/fixtures/<name>/ holding
the model in Hugging Face form (config.json, generation_config.json, model.safetensors,
tokenizer.json, tokenizer_config.json, chat_template.jinja) and golden.gguf: the reference
outputs of transformers, run in float32 on the CPU from the files just written. README.md
describes each fixture and the golden.gguf layout.

  python3 tests/reference/make_fixtures.py            # (re)write every fixture
  python3 tests/reference/make_fixtures.py --check    # regenerate in a temp dir, compare bytes
  python3 tests/reference/make_fixtures.py --only qwen3_tied gemma4_dense
"""

import os

# Before torch loads: one thread and fixed SIMD paths, so a rerun (and, as far as the BLAS
# allows, another x86 machine) reproduces every float bit for bit.
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["MKL_NUM_THREADS"] = "1"
os.environ.setdefault("MKL_CBWR", "AVX2")
os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import gguf  # noqa: E402
import numpy as np  # noqa: E402
import safetensors  # noqa: E402
import safetensors.torch  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fixture_models as fm  # noqa: E402
import tiny_tokenizers  # noqa: E402

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "fixtures"
MAX_FIXTURE_BYTES = 8 * 1024 * 1024
MIN_LOGIT_STD = 0.5
MIN_DISTINCT_ARGMAX = 10


def setup_torch():
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()


def text_model(model):
    """The decoder stack: model.model, or model.model.language_model for multimodal classes."""
    inner = model.model
    return getattr(inner, "language_model", inner)


# ---------------------------------------------------------------------------------------------
# Writing the Hugging Face files


def legacy_gemma_config(path, cfg):
    """Rewrites a Gemma 4 config.json the way the released checkpoints spell it.

    transformers 5.17 serialises the full-layer overrides as `per_layer_config`; google's
    checkpoints carry `global_head_dim` and `num_global_key_value_heads` instead, and 5.17 reads
    those too. The caller reloads the file and checks it yields the same config.
    """
    root = json.loads(path.read_text())
    text = root["text_config"] if "text_config" in root else root
    overrides = text.pop("per_layer_config", None) or {}
    head_dims = {o["head_dim"] for o in overrides.values()}
    kv_heads = {o["num_key_value_heads"] for o in overrides.values() if "num_key_value_heads" in o}
    if len(head_dims) != 1 or len(kv_heads) > 1:
        raise RuntimeError(f"unexpected per_layer_config {overrides}")
    text["global_head_dim"] = head_dims.pop()
    if kv_heads:
        text["num_global_key_value_heads"] = kv_heads.pop()
    path.write_text(json.dumps(root, indent=2, sort_keys=True) + "\n")


def add_tensors(path, extra):
    with safetensors.safe_open(str(path), "pt") as f:
        metadata = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    clash = set(tensors) & set(extra)
    if clash:
        raise RuntimeError(f"extra tensors already in the checkpoint: {sorted(clash)}")
    tensors.update(extra)
    safetensors.torch.save_file(tensors, str(path), metadata=metadata)


def check_expert_layout(path, model):
    """The checkpoint splits fused experts as mtp_weights does: gate rows first, then up."""
    lm = text_model(model)
    mlp = getattr(lm.layers[0], "mlp", None)
    experts = getattr(mlp, "experts", None)
    if experts is None or not hasattr(experts, "gate_up_proj"):
        return
    inter = experts.gate_up_proj.shape[1] // 2
    with safetensors.safe_open(str(path), "pt") as f:
        names = [k for k in f.keys() if ".layers.0.mlp.experts.1.gate_proj.weight" in k]
        if len(names) != 1:
            raise RuntimeError(f"cannot find expert 1 of layer 0 in {path}: {names}")
        gate = f.get_tensor(names[0])
    want = experts.gate_up_proj[1, :inter].to(gate.dtype)
    if not torch.equal(gate, want):
        raise RuntimeError("checkpoint expert layout differs from the fused parameter's")


def save_model_files(spec, out_dir):
    cfg = spec["config"]()
    text_cfg = cfg.get_text_config()
    torch.manual_seed(spec["seed"])
    model = spec["model_cls"]()(cfg).eval()
    gen = torch.Generator().manual_seed(spec["seed"])
    fm.randomize(model, spec, gen, text_cfg)
    extra = fm.mtp_weights(model, spec, gen) if spec["mtp"] else {}
    dtype = getattr(torch, spec["dtype"])
    model.to(dtype)
    model.save_pretrained(out_dir)
    weights = out_dir / "model.safetensors"
    check_expert_layout(weights, model)
    if extra:
        add_tensors(weights, {k: v.to(dtype).contiguous() for k, v in extra.items()})
    if getattr(text_cfg, "model_type", "") == "gemma4_text":
        legacy_gemma_config(out_dir / "config.json", cfg)
    tiny_tokenizers.build(spec["tokenizer"]).save_pretrained(out_dir)
    return cfg


def load_tokenizer(spec, out_dir):
    """The tokenizer as a user would load it from the fixture, checked against a fresh build."""
    tok = transformers.AutoTokenizer.from_pretrained(str(out_dir))
    fresh = tiny_tokenizers.build(spec["tokenizer"])
    text = tiny_tokenizers.PROBE_TEXT
    if len(tok) != fm.VOCAB or tok(text)["input_ids"] != fresh(text)["input_ids"]:
        raise RuntimeError(f"{spec['name']}: saved tokenizer does not reload to the built one")
    return tok


def config_diff(got, want, prefix=""):
    """Keys whose values differ, ignoring where the config was loaded from and its dtype."""
    out = []
    for k in sorted(set(got) | set(want)):
        if k in ("_name_or_path", "dtype"):
            continue
        a, b = got.get(k, "<absent>"), want.get(k, "<absent>")
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_diff(a, b, prefix + k + ".")
        elif a != b:
            out.append(f"{prefix}{k}: {a!r} != {b!r}")
    return out


def load_model(spec, out_dir, want_cfg=None):
    cls = spec["model_cls"]()
    kwargs = dict(dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    if "Gemma4Assistant" not in spec["cls"]:
        kwargs["experts_implementation"] = "eager"
    model, info = cls.from_pretrained(str(out_dir), **kwargs)
    unexpected = [k for k in info["unexpected_keys"] if not k.startswith("mtp.")]
    if info["missing_keys"] or unexpected or info["mismatched_keys"]:
        raise RuntimeError(f"{spec['name']}: reload mismatch {info}")
    if spec["mtp"]:
        with safetensors.safe_open(str(out_dir / "model.safetensors"), "pt") as f:
            if not any(k.startswith("mtp.") for k in f.keys()):
                raise RuntimeError(f"{spec['name']}: mtp.* weights missing from the checkpoint")
    if want_cfg is not None:
        diff = config_diff(model.config.to_dict(), want_cfg.to_dict())
        if diff:
            raise RuntimeError(f"{spec['name']}: config.json reloads differently: {diff}")
    return model.eval()


# ---------------------------------------------------------------------------------------------
# Running the reference


def sequences(spec, tok):
    """Sequence 0: the probe text. Sequence 1: seeded random ids over the whole vocabulary."""
    n0, n1 = spec["seq_lens"]
    ids0 = tok(tiny_tokenizers.PROBE_TEXT)["input_ids"]
    if len(ids0) < n0:
        raise RuntimeError(f"probe text gives {len(ids0)} tokens, want {n0}")
    rng = np.random.Generator(np.random.PCG64(spec["seed"]))
    ids1 = rng.integers(0, fm.VOCAB, size=n1).tolist()
    if tok.bos_token_id is not None:
        ids1[0] = tok.bos_token_id
    return [ids0[:n0], ids1]


class Recorder:
    """Forward hooks that keep the input module's output (the embedding by default) and every
    decoder layer's output."""

    def __init__(self, stack, input_module=None):
        self.embed, self.layers, self.handles = None, {}, []
        module = input_module if input_module is not None else stack.embed_tokens
        self.handles.append(module.register_forward_hook(self._on_embed))
        for i, layer in enumerate(stack.layers):
            self.handles.append(layer.register_forward_hook(self._on_layer(i)))

    def _on_embed(self, _mod, _inp, out):
        self.embed = out.detach()[0].clone()

    def _on_layer(self, i):
        def hook(_mod, _inp, out):
            t = out[0] if isinstance(out, tuple) else out
            self.layers[i] = t.detach()[0].clone()

        return hook

    def close(self):
        for h in self.handles:
            h.remove()


def f32(t):
    return np.ascontiguousarray(t.detach().to(torch.float32).cpu().numpy())


def run_sequence(model, ids, record):
    stack = text_model(model)
    rec = Recorder(stack) if record else None
    try:
        with torch.no_grad():
            out = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False)
    finally:
        if rec:
            rec.close()
    tensors = {"logits": f32(out.logits[0])}
    if record:
        tensors["embed"] = f32(rec.embed)
        for i in range(len(stack.layers)):
            tensors[f"hidden.{i}"] = f32(rec.layers[i])
        if getattr(stack, "hidden_size_per_layer_input", 0):
            tensors["per_layer_inputs"] = per_layer_inputs(stack, ids)
    return tensors


def per_layer_inputs(stack, ids):
    """Gemma 4 PLE: what decoder layer l multiplies into its gate, [n_tokens, n_layers, P]."""
    x = torch.tensor([ids], dtype=torch.long)
    with torch.no_grad():
        emb = stack.embed_tokens(x)
        ple = stack.project_per_layer_inputs(emb, stack.get_per_layer_inputs(x, emb))
    return f32(ple[0])


def check_logits(name, label, logits):
    if not np.isfinite(logits).all():
        raise RuntimeError(f"{name} {label}: non-finite logits")
    std = float(logits.std(axis=-1).mean())
    distinct = len(set(logits.argmax(axis=-1).tolist()))
    if std <= MIN_LOGIT_STD or distinct < MIN_DISTINCT_ARGMAX:
        raise RuntimeError(f"{name} {label}: logit std {std:.3f}, {distinct} distinct argmax")
    return std, distinct


def check_hidden(name, tensors):
    """Every layer's output stays in a sane range and changes the residual stream."""
    rms, prev = [], tensors["embed"]
    for i in range(sum(1 for k in tensors if k.startswith("hidden."))):
        h = tensors[f"hidden.{i}"]
        r = float(np.sqrt((h.astype(np.float64) ** 2).mean()))
        change = float(np.linalg.norm(h - prev) / max(np.linalg.norm(prev), 1e-30))
        if not (1e-2 < r < 1e3) or change < 0.05:
            raise RuntimeError(f"{name} layer {i}: rms {r:.3g}, relative change {change:.3g}")
        rms.append(f"{r:.2f}/{change:.2f}")
        prev = h
    return rms


# ---------------------------------------------------------------------------------------------
# The gemma4_assistant drafter


def drafter_goldens(spec, drafter, out_root):
    """Runs the drafter the way transformers' assisted generation does after one target pass.

    The target (fixture spec["target"]) reads its sequence 0 (N tokens) and returns its
    final-normed hidden states and the K/V of its last non-shared sliding and full layers. The
    target's greedy next token t_N is the first draft input; every step feeds
    [target_embed(token) * sqrt(H_t), h] at position N with the prefix K/V as the only cache,
    then takes the argmax and the projected hidden state to the next step.
    """
    tspec = next(f for f in fm.FIXTURES if f["name"] == spec["target"])
    tdir = out_root / tspec["name"]
    target = load_model(tspec, tdir)
    prefix = sequences(tspec, load_tokenizer(tspec, tdir))[0]
    n = len(prefix)
    with torch.no_grad():
        tout = target(input_ids=torch.tensor([prefix]), use_cache=False,
                      output_hidden_states=True, return_shared_kv_states=True)
    t_hidden = tout.hidden_states[-1]
    kv = {k: (v[0], v[1]) for k, v in tout.shared_kv_states.items()}
    first = int(tout.logits[0, -1].argmax())

    embed = target.get_input_embeddings()
    mask = torch.ones(1, n + 1, dtype=torch.long)
    pos = torch.tensor([[n]], dtype=torch.long)
    token, h = first, t_hidden[:, n - 1 : n]
    tensors, inputs, drafted = {}, [], []
    for step in range(spec["draft_steps"]):
        with torch.no_grad():
            x = torch.cat([embed(torch.tensor([[token]])), h], dim=-1)
            rec = Recorder(drafter.model, drafter.pre_projection) if step == 0 else None
            try:
                out = drafter(inputs_embeds=x, attention_mask=mask, position_ids=pos,
                              shared_kv_states=kv, use_cache=False)
            finally:
                if rec:
                    rec.close()
        logits = out.logits[0, 0]
        inputs.append(token)
        token = int(logits.argmax())
        drafted.append(token)
        h = out.last_hidden_state
        tensors[f"draft.{step}.inputs_embeds"] = f32(x[0, 0])
        tensors[f"draft.{step}.logits"] = f32(logits)
        tensors[f"draft.{step}.projected"] = f32(h[0, 0])
        if rec:
            tensors["draft.0.pre_projection"] = f32(rec.embed[0])
            for i in sorted(rec.layers):
                tensors[f"draft.0.hidden.{i}"] = f32(rec.layers[i][0])

    with torch.no_grad():
        pre = drafter.pre_projection(x)
        masks = drafter.create_attention_masks(pre, mask, kv)
    visible = {k: visible_keys(m, n) for k, m in masks.items()}

    head = {
        "draft.prefix_ids": np.asarray(prefix, dtype=np.int32),
        "draft.input_ids": np.asarray(inputs, dtype=np.int32),
        "draft.tokens": np.asarray(drafted, dtype=np.int32),
        "draft.target_hidden": f32(t_hidden[0]),
    }
    for kind in ("sliding_attention", "full_attention"):
        short = kind.split("_")[0]
        head[f"draft.kv.{short}.k"] = f32(kv[kind][0][0])
        head[f"draft.kv.{short}.v"] = f32(kv[kind][1][0])
    head.update(tensors)
    meta = {
        "golden.draft.target_fixture": tspec["name"],
        "golden.draft.position": n,
        "golden.draft.n_steps": spec["draft_steps"],
        "golden.draft.first_visible_sliding": visible["sliding_attention"][0],
        "golden.draft.n_visible_sliding": visible["sliding_attention"][1],
        "golden.draft.first_visible_full": visible["full_attention"][0],
        "golden.draft.n_visible_full": visible["full_attention"][1],
    }
    for step in range(spec["draft_steps"]):
        lg = head[f"draft.{step}.logits"]
        if not np.isfinite(lg).all() or float(lg.std()) <= MIN_LOGIT_STD:
            raise RuntimeError(f"drafter step {step}: logits std {float(lg.std()):.3f}")
    return head, meta


def visible_keys(mask, n):
    """(first visible key index, count) for the single query row of a drafter mask."""
    if mask is None:
        return 0, n
    row = mask.reshape(-1, mask.shape[-1])[0]
    ok = row if row.dtype == torch.bool else row == 0
    idx = torch.nonzero(ok).flatten().tolist()
    if not idx or idx != list(range(idx[0], idx[-1] + 1)):
        raise RuntimeError(f"drafter mask is not one contiguous run: {idx}")
    return idx[0], len(idx)


# ---------------------------------------------------------------------------------------------
# golden.gguf


def write_golden(path, meta, tensors):
    w = gguf.GGUFWriter(str(path), arch="golden")
    w.add_custom_alignment(32)
    for key, value in meta.items():
        if isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        else:
            raise TypeError(f"{key}: {type(value)}")
    for name, arr in tensors.items():
        if arr.dtype not in (np.float32, np.int32):
            raise TypeError(f"{name}: {arr.dtype}")
        w.add_tensor(name, np.ascontiguousarray(arr))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def build_fixture(spec, out_root):
    name = spec["name"]
    out_dir = out_root / name
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    cfg = save_model_files(spec, out_dir)
    model = load_model(spec, out_dir, cfg)
    tok = load_tokenizer(spec, out_dir)
    text_cfg = model.config.get_text_config()
    meta = {
        "golden.arch": spec["arch"],
        "golden.fixture": name,
        "golden.hf_class": spec["cls"],
        "golden.transformers_version": transformers.__version__,
        "golden.torch_version": torch.__version__,
        "golden.seed": spec["seed"],
        "golden.weights_dtype": spec["dtype"],
        "golden.n_layers": text_cfg.num_hidden_layers,
        "golden.hidden_size": text_cfg.hidden_size,
        "golden.vocab_size": text_cfg.vocab_size,
    }
    tensors, report = {}, []
    if "target" in spec:
        meta["golden.n_sequences"] = 0
        tensors, draft_meta = drafter_goldens(spec, model, out_root)
        meta.update(draft_meta)
        report.append(f"drafted {tensors['draft.tokens'].tolist()} "
                      f"sliding keys {draft_meta['golden.draft.first_visible_sliding']}"
                      f"+{draft_meta['golden.draft.n_visible_sliding']}")
    else:
        seqs = sequences(spec, tok)
        meta["golden.n_sequences"] = len(seqs)
        for i, ids in enumerate(seqs):
            got = run_sequence(model, ids, record=(i == 0))
            std, distinct = check_logits(name, f"seq {i}", got["logits"])
            report.append(f"seq{i} n={len(ids)} std={std:.2f} argmax={distinct}")
            tensors[f"seq.{i}.ids"] = np.asarray(ids, dtype=np.int32)
            tensors[f"seq.{i}.logits"] = got.pop("logits")
            if i == 0:
                report.append("rms/change " + " ".join(check_hidden(name, got)))
                tensors["seq.0.embed"] = got.pop("embed")
                for k, v in got.items():
                    tensors[f"seq.0.{k}"] = v
    write_golden(out_dir / "golden.gguf", meta, tensors)
    for p in out_dir.iterdir():
        p.chmod(0o644)  # save_pretrained leaves model.safetensors owner-only
    size = sum(p.stat().st_size for p in out_dir.rglob("*") if p.is_file())
    if size >= MAX_FIXTURE_BYTES:
        raise RuntimeError(f"{name}: {size} bytes, limit {MAX_FIXTURE_BYTES}")
    print(f"{name:18s} {size / 1e6:5.2f} MB  " + "  ".join(report), flush=True)
    return size


def generate(specs, out_root):
    out_root.mkdir(parents=True, exist_ok=True)
    total = 0
    for spec in specs:
        total += build_fixture(spec, out_root)
    print(f"total {total / 1e6:.2f} MB", flush=True)


# Files in a fixture that other scripts write (each has its own --check).
OTHER_SCRIPTS = {"mtp_golden.gguf": "make_mtp_golden.py",
                 "tokenizer_expected.json": "make_tokenizer_expected.py"}


def compare(specs, committed, fresh):
    """Names every file that differs, is missing or is extra; returns True when all match."""
    ok = True
    for spec in specs:
        a, b = committed / spec["name"], fresh / spec["name"]
        names_a = {p.relative_to(a) for p in a.rglob("*") if p.is_file()} if a.exists() else set()
        names_b = {p.relative_to(b) for p in b.rglob("*") if p.is_file()}
        for rel in sorted(names_a | names_b):
            if rel not in names_a:
                print(f"MISSING {a / rel} (the script writes it)")
            elif rel not in names_b and str(rel) in OTHER_SCRIPTS:
                continue
            elif rel not in names_b:
                print(f"EXTRA {a / rel} (the script does not write it)")
            elif (a / rel).read_bytes() != (b / rel).read_bytes():
                print(f"DIFFERS {a / rel}")
            else:
                continue
            ok = False
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true",
                    help="regenerate into a temporary directory and compare byte for byte")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="fixtures to build (default: all)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="fixtures directory")
    args = ap.parse_args()
    setup_torch()

    names = [f["name"] for f in fm.FIXTURES]
    wanted = args.only or names
    unknown = sorted(set(wanted) - set(names))
    if unknown:
        ap.error(f"unknown fixtures {unknown}; known: {names}")
    # A drafter needs its target built first, in the same output directory.
    need = set(wanted) | {f["target"] for f in fm.FIXTURES if f["name"] in wanted and "target" in f}
    specs = [f for f in fm.FIXTURES if f["name"] in need]

    if not args.check:
        generate(specs, args.out)
        return 0
    with tempfile.TemporaryDirectory(prefix="tessera-fixtures-") as tmp:
        generate(specs, Path(tmp))
        if compare([f for f in specs if f["name"] in wanted], args.out, Path(tmp)):
            print("check: every file matches")
            return 0
    print("check: fixtures differ from what the script writes", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
