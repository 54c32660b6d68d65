#!/usr/bin/env python3
"""A small Qwen3.5 (hybrid: Gated DeltaNet and gated full attention) with a trained MTP
(NextN) head, the instrument that makes spec_mtp's `nextn` acceptance mean something.

The trunk is transformers' Qwen3_5ForCausalLM (`qwen3_5_text`) on the project's qwen3
tokenizer and corpus (`train.py prepare`); the MTP block is built as the released checkpoints
and vLLM/llama.cpp drafters have it (make_mtp_golden.py): entry i is token i+1 with the trunk's
final-normed hidden state at i, x = fc([norm_e(E[t]), norm_h(h)]), one full-attention decoder
layer of the trunk's class over the entries, norm, the tied LM head, predicting token i+2.
Both train together: loss = CE(trunk) + MTP_WEIGHT * CE(head), on corpus windows (a pure
function of seed and step). `export` writes a Hugging Face directory whose `mtp.*` tensors
`tessera convert` turns into blk.N.nextn.*.

  python3 train_mtp.py train --prep PREP --out OUT [--minutes 8] [--device cuda]
  (OUT/hf: config.json, model.safetensors in bf16, the tokenizer; OUT/loss.tsv;
  OUT/status.json)
"""
import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

import data
from export import write_golden

MTP_WEIGHT = 0.5
SHAPE = dict(hidden_size=256, intermediate_size=768, num_hidden_layers=8, num_attention_heads=4,
             num_key_value_heads=2, head_dim=64, linear_num_key_heads=2,
             linear_num_value_heads=4, linear_key_head_dim=64, linear_value_head_dim=64,
             linear_conv_kernel_dim=4, full_attention_interval=4)


def config(tok, ctx):
    from transformers import Qwen3_5TextConfig

    layers = ["full_attention" if (i + 1) % SHAPE["full_attention_interval"] == 0
              else "linear_attention" for i in range(SHAPE["num_hidden_layers"])]
    eot = tok.convert_tokens_to_ids("<|endoftext|>")
    return Qwen3_5TextConfig(
        vocab_size=len(tok), layer_types=layers, max_position_embeddings=ctx, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.25},
        attn_output_gate=True, mtp_num_hidden_layers=1, mtp_use_dedicated_embeddings=False,
        tie_word_embeddings=True, bos_token_id=None, eos_token_id=eot, pad_token_id=eot, **SHAPE)


class MTP(nn.Module):
    """The MTP block, its parameters named as the checkpoints' mtp.* (layers.0 the layer)."""

    def __init__(self, model):
        super().__init__()
        cfg = model.config
        h = cfg.hidden_size
        full = cfg.layer_types.index("full_attention")
        trunk_layer = model.model.layers[full]
        self.layers = nn.ModuleList([type(trunk_layer)(cfg, full)])
        norm = type(trunk_layer.input_layernorm)
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.pre_fc_norm_embedding = norm(h, eps=cfg.rms_norm_eps)
        self.pre_fc_norm_hidden = norm(h, eps=cfg.rms_norm_eps)
        self.norm = norm(h, eps=cfg.rms_norm_eps)

    def forward(self, model, ids, hidden):
        """Logits of entries 0..n-2 (token i+1 with hidden i), each predicting token i+2."""
        n = ids.shape[1] - 1
        emb = model.model.embed_tokens(ids[:, 1:])
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(emb),
                               self.pre_fc_norm_hidden(hidden[:, :n])], dim=-1))
        pos = torch.arange(n, device=ids.device)[None].expand(ids.shape[0], n)
        rope = model.model.rotary_emb(x, pos[None].expand(3, -1, -1))
        mask = torch.full((n, n), float("-inf"), device=ids.device).triu(1)[None, None]
        out = self.layers[0](x, position_embeddings=rope, attention_mask=mask, position_ids=pos)
        out = out[0] if isinstance(out, tuple) else out
        return model.lm_head(self.norm(out))


def windows(tokens, seed, step, batch, ctx):
    """batch corpus windows of ctx + 1 tokens: a function of (seed, step) alone."""
    rng = np.random.default_rng([seed, step])
    starts = rng.integers(0, len(tokens) - ctx - 1, size=batch)
    return np.stack([tokens[s:s + ctx + 1].astype(np.int64) for s in starts])


def losses(model, mtp, x):
    out = model.model(input_ids=x, use_cache=False)
    hidden = out.last_hidden_state  # final-normed
    logits = model.lm_head(hidden)
    ce = nn.functional.cross_entropy
    trunk = ce(logits[:, :-1].flatten(0, 1).float(), x[:, 1:].flatten())
    head = ce(mtp(model, x, hidden)[:, :-1].flatten(0, 1).float(), x[:, 2:].flatten())
    return trunk, head


def cmd_train(a):
    from transformers import AutoTokenizer, Qwen3_5ForCausalLM

    device = torch.device(a.device if a.device != "auto" else
                          ("cuda" if torch.cuda.is_available() else "cpu"))
    amp = device.type == "cuda" or a.amp
    torch.manual_seed(a.seed)
    prep, out = Path(a.prep), Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(str(prep / "qwen3"))
    model = Qwen3_5ForCausalLM._from_config(config(tok, a.ctx), dtype=torch.float32).to(device)
    model.mtp = MTP(model).to(device)
    n_params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    train_tok = data.load_tokens(prep, "qwen3", "train")
    val_tok = data.load_tokens(prep, "qwen3", "val")
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)
    print(f"Qwen3_5ForCausalLM + MTP: {n_params / 1e6:.2f}M parameters on {device}", flush=True)
    t0, step, log = time.time(), 0, []
    while time.time() - t0 < a.minutes * 60 and (not a.steps or step < a.steps):
        lr = a.lr * min(1.0, (step + 1) / a.warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        x = torch.from_numpy(windows(train_tok, a.seed, step, a.batch, a.ctx)).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            trunk, head = losses(model, model.mtp, x)
        (trunk + MTP_WEIGHT * head).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if step % a.log_every == 0:
            entry = {"step": step, "seconds": round(time.time() - t0, 1),
                     "trunk": round(trunk.item(), 4), "head": round(head.item(), 4)}
            log.append(entry)
            print(json.dumps(entry), flush=True)
    model.eval()
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
        vt, vh = zip(*(losses(model, model.mtp, torch.from_numpy(
            windows(val_tok, a.seed + 1, i, 8, a.ctx)).to(device)) for i in range(4)))
    status = {"steps": step, "minutes": round((time.time() - t0) / 60, 2),
              "params": n_params, "val_trunk": round(float(sum(vt)) / 4, 4),
              "val_head": round(float(sum(vh)) / 4, 4), "batch": a.batch, "ctx": a.ctx,
              "lr": a.lr, "seed": a.seed, "device": str(device), "torch": torch.__version__}
    (out / "loss.tsv").write_text("step\tseconds\ttrunk\thead\n" + "".join(
        f"{e['step']}\t{e['seconds']}\t{e['trunk']}\t{e['head']}\n" for e in log))
    (out / "status.json").write_text(json.dumps(status, indent=2) + "\n")
    model.to("cpu").to(torch.bfloat16).save_pretrained(out / "hf")
    tok.save_pretrained(out / "hf")
    print(json.dumps(status), flush=True)


def cmd_golden(a):
    """The trained model's reference on a held-out window, in the fixtures' golden format:
    GOLDEN (seq.0.ids, seq.0.logits) and MTP_GOLDEN (mtp.ids, mtp.positions, mtp.hidden_in,
    mtp.logits), for plugins/arch_qwen's test_arch_qwen_nextn against the converted model."""
    from safetensors.torch import load_file
    from transformers import Qwen3_5ForCausalLM

    hf = Path(a.hf)
    model = Qwen3_5ForCausalLM.from_pretrained(str(hf), dtype=torch.float32).eval()
    model.mtp = MTP(model)
    state = {k[4:]: v.float() for k, v in load_file(str(hf / "model.safetensors")).items()
             if k.startswith("mtp.")}
    model.mtp.load_state_dict(state, strict=True)
    model.mtp.eval()
    ids = data.load_tokens(Path(a.prep), "qwen3", "val")[a.start:a.start + a.n + 1].astype(np.int64)
    x = torch.from_numpy(ids)[None]
    with torch.no_grad():
        hidden = model.model(input_ids=x, use_cache=False).last_hidden_state
        logits = model.lm_head(hidden)[0]
        head = model.mtp(model, x, hidden)[0]
    n = len(ids) - 1
    Path(a.out).mkdir(parents=True, exist_ok=True)
    write_golden(Path(a.out) / "golden.gguf", {},
               {"seq.0.ids": ids.astype(np.int32), "seq.0.logits": logits.numpy().astype(np.float32)})
    write_golden(Path(a.out) / "mtp_golden.gguf", {},
               {"mtp.ids": ids[1:].astype(np.int32), "mtp.positions": np.arange(n, dtype=np.int32),
                "mtp.hidden_in": hidden[0, :n].numpy().astype(np.float32),
                "mtp.logits": head.numpy().astype(np.float32)})
    agree = float((head[:-1].argmax(-1) == x[0, 2:]).float().mean())
    print(f"golden: {n + 1} held-out tokens from {a.start}; the head's argmax is the token two "
          f"ahead at {agree:.1%} of positions", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("train")
    p.add_argument("--prep", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--minutes", type=float, default=8.0)
    p.add_argument("--steps", type=int, default=0, help="stop here too (0: the minutes only)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--device", default="auto")
    p.add_argument("--amp", action="store_true", help="bf16 autocast off the GPU too")
    g = sub.add_parser("golden")
    g.add_argument("--prep", required=True)
    g.add_argument("--hf", required=True)
    g.add_argument("--out", required=True)
    g.add_argument("--start", type=int, default=1000)
    g.add_argument("--n", type=int, default=96)
    a = ap.parse_args()
    if a.cmd == "train":
        cmd_train(a)
    else:
        cmd_golden(a)


if __name__ == "__main__":
    main()
