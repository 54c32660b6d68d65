#!/usr/bin/env python3
"""Trains the reference models (issue #11): a Qwen3 and a Gemma 4 of about 20M parameters, on
the Python documentation mixed with synthetic long-context tasks. README.md beside this file
has the data, the shapes, the budget arithmetic and the commands. Four stages:

  train.py prepare --out PREP                    corpus, tokenizers, token streams (CPU)
  train.py train   --prep PREP --model qwen3 --out RUN --ckpt CKPT   (GPU; resumes from CKPT)
  train.py eval    --prep PREP --hf RUN/hf                held-out perplexity, task accuracy
  train.py export  --prep PREP --hf RUN/hf --tessera BIN --out DIR   GGUF, parity, model card
"""

import sys

sys.dont_write_bytecode = True  # keep __pycache__ out of the source tree

import argparse  # noqa: E402
import json  # noqa: E402
import lzma  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402

import corpus  # noqa: E402
import data  # noqa: E402
import models  # noqa: E402
import tasks  # noqa: E402
import tokenizer as T  # noqa: E402

KINDS = ("qwen3", "gemma4")


def versions():
    import tokenizers
    import torch
    import transformers

    return {"python": sys.version.split()[0], "torch": torch.__version__,
            "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
            "numpy": np.__version__}


def write_json(path, obj):
    Path(path).write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


# ---------------------------------------------------------------------------------------------
# prepare


def cmd_prepare(a):
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    deb = Path(a.deb) if a.deb else corpus.download(a.work)
    src = corpus.extract(deb, a.work)
    docs = corpus.documents(src)
    train = [(r, t) for r, t in docs if not corpus.held_out(r)]
    val = [(r, t) for r, t in docs if corpus.held_out(r)]
    meta = {"package": corpus.PACKAGE, "package_version": corpus.PACKAGE_VERSION,
            "package_sha256": corpus.PACKAGE_SHA256, "license": corpus.LICENSE,
            "documents": {"train": len(train), "val": len(val)},
            "held_out_documents": [r for r, _ in val],
            "chars": {"train": sum(len(t) for _, t in train), "val": sum(len(t) for _, t in val)},
            "versions": versions(), "tokens": {}}
    for kind in KINDS:
        t0 = time.time()
        tok = T.build(kind, [t for _, t in train])
        tok.save_pretrained(out / kind)
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(out / kind))  # what train/eval will load
        meta["tokens"][kind] = {}
        for split, part in (("train", train), ("val", val)):
            stream = []
            for ids in T.encode_batch(tok, [t for _, t in part]):
                stream += T.prefix_ids(tok) + ids + [tok.eos_token_id]
            arr = np.asarray(stream, dtype=np.int64)
            if arr.max() >= 65536:
                raise RuntimeError("token id does not fit uint16")
            arr = arr.astype(np.uint16)
            # The text is not stored: train and eval decode it back for text filler.
            if data.decode_documents(tok, arr) != [t for _, t in part]:
                raise RuntimeError(f"{kind} {split}: decoding the tokens does not give the text")
            with lzma.open(out / kind / f"{split}.bin.xz", "wb", preset=9) as f:
                f.write(arr.tobytes())
            meta["tokens"][kind][split] = int(arr.size)
        print(f"{kind}: tokenizer and token streams in {time.time() - t0:.0f} s, "
              f"{meta['tokens'][kind]}", flush=True)
    files = sorted(p for p in out.rglob("*") if p.is_file() and p.name != "meta.json")
    meta["files"] = {p.relative_to(out).as_posix(): corpus.sha256_file(p) for p in files}
    write_json(out / "meta.json", meta)
    size = sum(p.stat().st_size for p in files)
    print(f"wrote {out}: {len(files)} files, {size / 2**20:.1f} MiB", flush=True)


# ---------------------------------------------------------------------------------------------
# train


def lr_at(step, a):
    """Linear warm-up, then cosine decay to lr_min_ratio x lr at step a.steps."""
    import math

    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    frac = min(1.0, (step - a.warmup) / max(1, a.steps - a.warmup))
    return a.lr * (a.lr_min_ratio + (1 - a.lr_min_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


CALIBRATE = (10, 40)  # --steps 0: the steps whose time sizes the schedule
RUN_KEYS = ("model", "size", "seed", "steps", "batch", "lr", "warmup", "lr_min_ratio",
            "weight_decay", "ctx", "window")


def val_loss(model, val_tokens, prefix, ctx, n_windows, device, amp):
    """Mean next-token loss on the first n_windows held-out windows (prefix + ctx-len(prefix))."""
    import torch

    body = ctx - len(prefix)
    n = min(n_windows, len(val_tokens) // body)
    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for i in range(n):
            ids = np.concatenate([np.asarray(prefix, dtype=np.int64),
                                  val_tokens[i * body:(i + 1) * body].astype(np.int64)])
            x = torch.from_numpy(ids)[None].to(device)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                out = model(input_ids=x, labels=x, use_cache=False)
            total += float(out.loss) * (len(ids) - 1)
            count += len(ids) - 1
    model.train()
    return total / max(count, 1)


def cmd_train(a):
    import torch

    from transformers import AutoTokenizer

    t_start = time.time()
    device = torch.device(a.device if a.device != "auto" else
                          ("cuda" if torch.cuda.is_available() else "cpu"))
    amp = device.type == "cuda" and not a.no_amp
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if a.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    prep, out, ckpt = Path(a.prep), Path(a.out), Path(a.ckpt)
    out.mkdir(parents=True, exist_ok=True)
    ckpt.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(str(prep / a.model))
    model = models.build(a.model, a.size, tok, a.seed, a.window).to(device)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8,
                            fused=device.type == "cuda")
    step, log, elapsed_before = 0, [], 0.0
    state_path = ckpt / "state.pt"
    st = torch.load(state_path, map_location=device, weights_only=False) \
        if state_path.exists() else None
    if st is not None and a.steps == 0:
        a.steps = st["run"]["steps"]  # the schedule an earlier call sized (0: not yet)
    auto = a.steps == 0
    if auto and a.warmup <= CALIBRATE[1]:
        raise SystemExit(f"--steps 0 sizes the schedule during warm-up: --warmup must exceed "
                         f"{CALIBRATE[1]}")
    run = {k: getattr(a, k) for k in RUN_KEYS}
    if st is not None:
        if st["run"] != run:
            raise SystemExit(f"{state_path} was made by another run: {st['run']} != {run}")
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        step, log, elapsed_before = st["step"], st["log"], st["elapsed"]
        print(f"resumed from {state_path} at step {step}", flush=True)
    print(models.describe(model), flush=True)
    print(json.dumps({"run": run, "device": str(device), "amp_bf16": amp, **versions()}),
          flush=True)

    fwd = model
    if a.compile:
        fwd = torch.compile(model)
    val_tokens = data.load_tokens(prep, a.model, "val")
    prefix = T.prefix_ids(tok)
    rows_per_micro = a.micro or a.batch
    if a.batch % rows_per_micro:
        raise SystemExit("--batch must be a multiple of --micro")
    tokens_per_step = a.batch * a.ctx
    flops_tok = models.flops_per_token(model, a.ctx)
    stop_at = min(a.steps, a.max_steps or a.steps) if a.steps else (a.max_steps or 1 << 40)

    def save(final):
        tmp = ckpt / "state.pt.tmp"
        torch.save({"run": run, "model": model.state_dict(), "opt": opt.state_dict(),
                    "step": step, "log": log, "elapsed": elapsed_before + time.time() - t_loop},
                   tmp)
        os.replace(tmp, state_path)
        write_tsv(out / "loss.tsv", log)
        if final:
            export_hf(model, tok, a, out / "hf", log, elapsed_before + time.time() - t_loop)

    loader = data.Loader(prep, a.model, a.seed, a.batch, a.ctx, step, a.workers)
    model.train()
    t_loop = time.time()
    t_log, tok_log = time.time(), 0
    reason = "finished"
    try:
        while step < stop_at:
            lr = lr_at(step, a)
            for g in opt.param_groups:
                g["lr"] = lr
            got, rows = loader.next()
            if got != step:
                raise RuntimeError(f"loader gave step {got}'s batch at step {step}")
            x_all = torch.from_numpy(rows)
            loss_sum = 0.0
            for i in range(0, a.batch, rows_per_micro):
                x = x_all[i:i + rows_per_micro].to(device, non_blocking=True)
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                    out_ = fwd(input_ids=x, labels=x, use_cache=False)
                loss = out_.loss * (rows_per_micro / a.batch)
                loss.backward()
                loss_sum += float(loss.detach())
            gnorm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip))
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if a.steps == 0 and step == CALIBRATE[1]:
                # Size the schedule from the measured step time; nothing before this step
                # depends on it (warm-up is longer), so a rerun with --steps N is identical.
                # (from the log's loop seconds, which a resumed call continues)
                t_now = elapsed_before + time.time() - t_loop
                per_step = (t_now - log[CALIBRATE[0] - 1]["seconds"]) / (CALIBRATE[1] -
                                                                         CALIBRATE[0])
                left = a.budget_minutes * 60 - t_now
                a.steps = max(a.warmup + 10, (step + int(left / per_step)) // 10 * 10)
                run["steps"] = a.steps
                stop_at = min(a.steps, a.max_steps or a.steps)
                print(f"schedule: {a.steps} steps ({per_step:.3f} s per step measured over "
                      f"steps {CALIBRATE[0]}-{CALIBRATE[1]}, --budget-minutes "
                      f"{a.budget_minutes}); rerun with --steps {a.steps} to repeat this run",
                      flush=True)
            tok_log += tokens_per_step
            entry = {"step": step, "tokens": step * tokens_per_step, "loss": round(loss_sum, 5),
                     "lr": lr, "grad_norm": round(gnorm, 4),
                     "seconds": round(elapsed_before + time.time() - t_loop, 1), "val_loss": ""}
            if step % a.eval_every == 0 or step == stop_at:
                entry["val_loss"] = round(val_loss(model, val_tokens, prefix, a.ctx, a.val_windows,
                                                   device, amp), 5)
            log.append(entry)
            if step % a.log_every == 0 or entry["val_loss"] != "" or step == 1:
                dt = time.time() - t_log
                tps = tok_log / dt if dt > 0 else 0.0
                eta = (a.steps - step) * tokens_per_step / tps / 60 if tps and a.steps else 0.0
                print(f"step {step}/{a.steps or '?'} loss {loss_sum:.4f} val {entry['val_loss']} "
                      f"lr {lr:.2e} gnorm {gnorm:.2f} {tps:,.0f} tok/s "
                      f"{tps * flops_tok / 1e12:.1f} TFLOP/s eta {eta:.1f} min", flush=True)
                t_log, tok_log = time.time(), 0
            if a.save_every and step % a.save_every == 0:
                save(False)
            if a.max_minutes and time.time() - t_start > a.max_minutes * 60:
                reason = f"stopped by --max-minutes {a.max_minutes} at step {step}"
                break
    finally:
        loader.close()
    if (step < a.steps or not a.steps) and reason == "finished":
        reason = f"stopped by --max-steps at step {step}"
    done = bool(a.steps) and step >= a.steps
    save(final=done or bool(a.export_partial))
    status = {"step": step, "steps": a.steps, "done": done, "reason": reason,
              "minutes_this_call": round((time.time() - t_start) / 60, 2)}
    write_json(out / "status.json", status)
    print(json.dumps(status), flush=True)


def write_tsv(path, log):
    cols = ["step", "tokens", "loss", "val_loss", "lr", "grad_norm", "seconds"]
    lines = ["\t".join(cols)] + ["\t".join(str(e[c]) for c in cols) for e in log]
    Path(path).write_text("\n".join(lines) + "\n")


def legacy_gemma_config(path):
    """Writes Gemma 4's full-layer overrides as the released config.json files do
    (global_head_dim, num_global_key_value_heads) instead of transformers 5.17's
    per_layer_config, as tests/reference/make_fixtures.py does for the fixtures."""
    root = json.loads(path.read_text())
    overrides = root.pop("per_layer_config", None) or {}
    dims = {o["head_dim"] for o in overrides.values()}
    kv = {o["num_key_value_heads"] for o in overrides.values() if "num_key_value_heads" in o}
    if len(dims) != 1 or len(kv) > 1:
        raise RuntimeError(f"unexpected per_layer_config {overrides}")
    root["global_head_dim"] = dims.pop()
    if kv:
        root["num_global_key_value_heads"] = kv.pop()
    path.write_text(json.dumps(root, indent=2, sort_keys=True) + "\n")


def export_hf(model, tok, a, hf, log, seconds):
    """config.json, model.safetensors (a.export_dtype), tokenizer files, training.json."""
    import copy

    import torch

    hf.mkdir(parents=True, exist_ok=True)
    m = copy.deepcopy(model).to("cpu", getattr(torch, a.export_dtype))
    m.save_pretrained(hf)
    if a.model == "gemma4":
        legacy_gemma_config(hf / "config.json")
    tok.save_pretrained(hf)
    last = [e for e in log if e["val_loss"] != ""]
    write_json(hf / "training.json", {
        "run": {k: getattr(a, k) for k in RUN_KEYS}, "steps_done": log[-1]["step"] if log else 0,
        "tokens": log[-1]["tokens"] if log else 0,
        "final_train_loss": float(np.mean([e["loss"] for e in log[-20:]])) if log else None,
        "final_val_loss": last[-1]["val_loss"] if last else None,
        "train_seconds": round(seconds, 1), "parameters": models.n_params(model),
        "weights_dtype": a.export_dtype, "versions": versions(),
        "data": {"package": corpus.PACKAGE, "package_version": corpus.PACKAGE_VERSION,
                 "license": corpus.LICENSE}})
    print(f"exported {hf}", flush=True)


# ---------------------------------------------------------------------------------------------
# eval


def load_hf(hf, device):
    import torch
    import transformers

    cfg = json.loads((Path(hf) / "config.json").read_text())
    cls = transformers.Qwen3ForCausalLM if cfg["model_type"] == "qwen3" else \
        transformers.Gemma4ForCausalLM
    model = cls.from_pretrained(str(hf), dtype=torch.float32, attn_implementation="sdpa")
    return model.to(device).eval(), ("qwen3" if cfg["model_type"] == "qwen3" else "gemma4")


def task_accuracy(model, tok, src_lines, task, filler, n, ctx, seed, device, amp):
    """Teacher-forced exact match of the answer tokens (= greedy decoding reproduces them)."""
    import torch

    fill = tasks.noise_lines if filler == "noise" else tasks.text_lines(src_lines)
    prefix = T.prefix_ids(tok)
    count = lambda text: len(prefix) + len(T.encode(tok, text))  # noqa: E731
    hits = 0
    for i in range(n):
        s = tasks.fit(task, seed, i, ctx, count, fill)
        p_ids = prefix + T.encode(tok, s["prompt"])
        a_ids = T.encode(tok, s["answer"])
        x = torch.tensor([p_ids + a_ids], device=device)
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(input_ids=x, use_cache=False).logits[0]
        pred = logits[len(p_ids) - 1:len(p_ids) - 1 + len(a_ids)].argmax(-1).tolist()
        hits += pred == a_ids
    return hits / n


def cmd_eval(a):
    import torch

    from transformers import AutoTokenizer

    device = torch.device(a.device if a.device != "auto" else
                          ("cuda" if torch.cuda.is_available() else "cpu"))
    amp = device.type == "cuda" and not a.no_amp
    model, kind = load_hf(a.hf, device)
    tok = AutoTokenizer.from_pretrained(str(a.hf))
    prep = Path(a.prep)
    val = data.load_tokens(prep, kind, "val")
    nll = val_loss(model, val, T.prefix_ids(tok), a.ctx, a.val_windows, device, amp)
    lines = data.load_lines(prep, kind, "val", tok, val)
    res = {"ctx": a.ctx, "val_windows": a.val_windows, "val_loss": round(nll, 5),
           "val_ppl": round(float(np.exp(nll)), 3), "tasks": {}, "n_per_cell": a.n,
           "seed": a.seed, "metric": "teacher-forced exact match of the answer tokens",
           "amp_bf16": amp}
    print(f"held-out loss {nll:.4f} perplexity {np.exp(nll):.2f}", flush=True)
    for task in tasks.TASKS:
        for filler in ("noise", "text"):
            acc = task_accuracy(model, tok, lines, task, filler, a.n, a.ctx, a.seed, device, amp)
            res["tasks"][f"{task}/{filler}"] = acc
            print(f"{task:12s} {filler:5s} {acc:.3f}", flush=True)
    write_json(Path(a.out) if a.out else Path(a.hf) / "eval.json", res)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("prepare", help="corpus, tokenizers and token streams")
    p.add_argument("--out", required=True)
    p.add_argument("--deb", help=f"the {corpus.PACKAGE} .deb (default: apt-get download)")
    p.add_argument("--work", default="/tmp/tessera-train-deb", help="where the .deb unpacks")

    p = sub.add_parser("train", help="train one model; resumes from --ckpt")
    p.add_argument("--prep", required=True)
    p.add_argument("--model", choices=KINDS, required=True)
    p.add_argument("--size", choices=("full", "tiny"), default="full")
    p.add_argument("--out", required=True, help="loss.tsv, status.json and (when done) hf/")
    p.add_argument("--ckpt", required=True, help="state.pt: saved here, resumed from here")
    p.add_argument("--steps", type=int, default=0,
                   help="schedule length; 0: size it to --budget-minutes from the time of "
                        "steps 10-40 (the number is printed and saved; pass it to repeat a run)")
    p.add_argument("--budget-minutes", type=float, default=11.0,
                   help="training time the schedule is sized to when --steps is 0")
    p.add_argument("--batch", type=int, default=48, help="rows of ctx tokens per step")
    p.add_argument("--micro", type=int, default=0, help="rows per forward (default: batch)")
    p.add_argument("--ctx", type=int, default=models.CTX)
    p.add_argument("--window", type=int, default=models.WINDOW,
                   help="gemma4: the sliding layers' window (a short one leaves retrieval past it "
                   "to the full layers)")
    p.add_argument("--lr", type=float, default=1.5e-3)
    p.add_argument("--lr-min-ratio", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--max-steps", type=int, default=0, help="stop at this step (same schedule)")
    p.add_argument("--max-minutes", type=float, default=0, help="save and stop after this")
    p.add_argument("--save-every", type=int, default=500)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--val-windows", type=int, default=16)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--workers", type=int, default=max(1, min(12, (os.cpu_count() or 2) - 2)))
    p.add_argument("--device", default="auto")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--deterministic", action="store_true",
                   help="torch deterministic algorithms (slower; bit-exact reruns)")
    p.add_argument("--no-amp", action="store_true", help="no bf16 autocast on the GPU")
    p.add_argument("--export-dtype", choices=("bfloat16", "float32"), default="bfloat16")
    p.add_argument("--export-partial", action="store_true",
                   help="write hf/ even when stopped before --steps")

    p = sub.add_parser("eval", help="held-out perplexity and task accuracy at 1x context")
    p.add_argument("--prep", required=True)
    p.add_argument("--hf", required=True)
    p.add_argument("--out", help="eval.json path (default: HF/eval.json)")
    p.add_argument("--n", type=int, default=50, help="samples per task and filler")
    p.add_argument("--ctx", type=int, default=models.CTX)
    p.add_argument("--seed", type=int, default=20240611)
    p.add_argument("--val-windows", type=int, default=1000)
    p.add_argument("--device", default="auto")
    p.add_argument("--no-amp", action="store_true")

    p = sub.add_parser("export", help="tessera convert, parity against transformers, model card")
    p.add_argument("--prep", required=True)
    p.add_argument("--hf", required=True)
    p.add_argument("--tessera", required=True, help="the tessera binary")
    p.add_argument("--out", required=True, help="folder for NAME.gguf and NAME.md")
    p.add_argument("--name", required=True)
    p.add_argument("--outtype", choices=("q8_0", "f16", "f32", "bf16"), default="q8_0",
                   help="q8_0: the 20M-parameter models are 40 MB at f16, over --max-mb")
    p.add_argument("--token-embedding-type", choices=("f16", "f32", "bf16", "q8_0"),
                   help="the tied embedding (also the output head) in this type instead")
    p.add_argument("--work", default="/tmp/tessera-train-export", help="goldens, logs")
    p.add_argument("--max-mb", type=float, default=32.0)

    a = ap.parse_args()
    if a.cmd == "prepare":
        cmd_prepare(a)
    elif a.cmd == "train":
        cmd_train(a)
    elif a.cmd == "eval":
        cmd_eval(a)
    else:
        import export

        export.run(a)


if __name__ == "__main__":
    main()
