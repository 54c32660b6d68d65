"""Training batches: windows of the corpus mixed with synthetic tasks, a pure function of
(seed, step, row) so that a resumed or repeated run sees exactly the same tokens.

Every row is CTX tokens and starts at position 0 (Gemma rows start with <bos>, as Gemma
prompts do). With probability P_TASK a row is a task sample: prompt + answer + end-of-text,
its length drawn uniformly from [TASK_MIN, CTX], its task from TASK_WEIGHTS and its filler
from noise or corpus lines (half each); the rest of the row is corpus text from a random
offset. Otherwise the row is a corpus window from a random offset. The loss covers every
position. Tasks are rendered as text and tokenized here (tasks.py formats), never stored.
"""

import lzma
import multiprocessing as mp
from pathlib import Path

import numpy as np

import tasks
import tokenizer as T

P_TASK = 0.5
TASK_MIN = 128
TASK_WEIGHTS = (("passkey", 3), ("niah_single", 2), ("niah_multi", 2), ("vt", 3))
ROW_STREAM = 0x5EED  # the row decisions draw from (seed + ROW_STREAM, index)


def load_tokens(prep, kind, split):
    """The token stream of a split: every document as [<bos>] + ids + [eos], uint16, xz."""
    with lzma.open(Path(prep) / kind / f"{split}.bin.xz") as f:
        return np.frombuffer(f.read(), dtype=np.uint16)


def decode_documents(tok, stream):
    """The documents' text back from a token stream (exact: prepare checks the round trip)."""
    cuts = np.flatnonzero(stream == tok.eos_token_id)
    docs, start = [], 0
    for c in cuts:
        docs.append(stream[start:c].tolist())
        start = c + 1
    skip = len(T.prefix_ids(tok))
    return tok.backend_tokenizer.decode_batch([d[skip:] for d in docs],
                                              skip_special_tokens=False)


def load_lines(prep, kind, split, tok, tokens=None):
    """The lines of a split's text, for text filler."""
    tokens = load_tokens(prep, kind, split) if tokens is None else tokens
    return "".join(decode_documents(tok, tokens)).split("\n")


class Source:
    """One tokenizer's corpus tokens and the corpus lines for text filler."""

    def __init__(self, prep, kind, split="train"):
        from transformers import AutoTokenizer

        prep = Path(prep)
        self.tok = AutoTokenizer.from_pretrained(str(prep / kind))
        self.tokens = load_tokens(prep, kind, split)
        lines = load_lines(prep, kind, split, self.tok, self.tokens)
        self.filler_text = tasks.text_lines(lines)
        self.prefix = T.prefix_ids(self.tok)
        self.eos = self.tok.eos_token_id
        # Filler tokens per line, to pick the number of filler lines of a task. Fixed numbers
        # from the data (no running estimate), so a row stays a function of its index alone.
        n_lines = sum(1 for l in lines if l.strip())
        self.per_line = {"noise": len(T.encode(self.tok, tasks.NOISE + "\n")),
                         "text": len(self.tokens) / n_lines}

    def count(self, text):
        return len(self.prefix) + len(T.encode(self.tok, text))

    def task_ids(self, task, seed, index, n_tokens, filler):
        """Token ids of a task sample no longer than n_tokens, the filler shrunk to fit."""
        fill = tasks.noise_lines if filler == "noise" else self.filler_text
        n = max(1, int((n_tokens - 80) / self.per_line[filler]))
        while True:
            s = tasks.render(task, tasks.SplitMix64(seed, index), n, fill)
            ids = self.prefix + T.encode(self.tok, s["prompt"]) + T.encode(self.tok, s["answer"])
            if len(ids) < n_tokens or n == 1:
                break
            n = max(1, int(n * n_tokens / len(ids) * 0.97))
        return ids, s

    def window(self, rng, n):
        off = rng.below(len(self.tokens) - n)
        return self.tokens[off : off + n].astype(np.int64)


def row(src, seed, index, ctx):
    rng = tasks.SplitMix64(seed + ROW_STREAM, index)
    if rng.below(1_000_000) < P_TASK * 1_000_000:
        total = sum(w for _, w in TASK_WEIGHTS)
        pick = rng.below(total)
        for task, w in TASK_WEIGHTS:
            if pick < w:
                break
            pick -= w
        n_tokens = TASK_MIN + rng.below(ctx - TASK_MIN + 1)
        filler = "noise" if rng.below(2) == 0 else "text"
        ids, _ = src.task_ids(task, seed, index, n_tokens, filler)
        ids = np.asarray(ids + [src.eos], dtype=np.int64)[:ctx]
        rest = ctx - len(ids)
        return np.concatenate([ids, src.window(rng, rest)]) if rest else ids
    head = np.asarray(src.prefix, dtype=np.int64)
    return np.concatenate([head, src.window(rng, ctx - len(head))])


def batch(src, seed, step, rows, ctx):
    """[rows, ctx] int64 token ids of one optimizer step."""
    return np.stack([row(src, seed, step * 65536 + r, ctx) for r in range(rows)])


_SRC = None


def _init(prep, kind):
    global _SRC
    _SRC = Source(prep, kind)


def _work(args):
    seed, step, lo, hi, ctx = args
    return np.stack([row(_SRC, seed, step * 65536 + r, ctx) for r in range(lo, hi)])


class Loader:
    """Batches for steps start.. from worker processes, `ahead` steps in flight."""

    def __init__(self, prep, kind, seed, rows, ctx, start, workers, ahead=8):
        self.seed, self.rows, self.ctx, self.queued = seed, rows, ctx, start
        self.pool = mp.get_context("fork").Pool(workers, _init, (str(prep), kind))
        self.parts = max(1, min(workers, rows // 4))
        self.pending = []
        for _ in range(ahead):
            self._submit()

    def _submit(self):
        step, self.queued = self.queued, self.queued + 1
        cuts = np.linspace(0, self.rows, self.parts + 1).astype(int)
        jobs = [self.pool.apply_async(_work, ((self.seed, step, int(a), int(b), self.ctx),))
                for a, b in zip(cuts[:-1], cuts[1:])]
        self.pending.append((step, jobs))

    def next(self):
        """(step, [rows, ctx] token ids) of the next step."""
        step, jobs = self.pending.pop(0)
        self._submit()
        return step, np.concatenate([j.get() for j in jobs])

    def close(self):
        self.pool.terminate()
        self.pool.join()
