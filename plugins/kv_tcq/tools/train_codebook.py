#!/usr/bin/env python3
"""Train a kv_tcq codebook by generalized Lloyd over Viterbi encodings.

A codebook maps each trellis state s (2^(k+6) of them) to a value; a block of 64
rotated values u (scaled to unit variance a value) is coded as the path of states
minimising sum (u_t - book[s_t])^2 (plugins/kv_tcq/tcq.h: right shift
s_t = (s_{t-1} >> k) | (o_t << 6) from s_{-1} = 0; a tie takes the lowest
predecessor, the final state the lowest index; costs in f32, as the plugin's
encoder). Each iteration encodes the training blocks with the current book, then
moves every state's value to the mean of the u_t coded by it (a state nothing
reached keeps its value). The book starts from the Lloyd-Max quantizer of the
same rate (kv_turbo's centroids) shifted within each of its cells by the state's
six low bits, so that the states leading to one step differ.

Data: --synthetic N draws N blocks uniform on the 64-sphere (the law of a rotated
row); --data FILE... reads kv_tcq's dump_blocks files (int32 layer, int32 side 0 K
/ 1 V, 64 f32 u a record). Every --holdout-th block (by position) is held out: the
table reports the mean squared error a value, with the codec's norm correction,
on the training and the held-out blocks, beside the scalar Lloyd-Max quantizer's.

    train_codebook.py --tier turbo3_tcq (--synthetic N | --data F...) [--side k|v|both]
                      [--iters 12] [--holdout 5] [--max-blocks N] --out BOOK.txt
    train_codebook.py --eval BOOK.txt (--synthetic N | --data F...) [--side k|v|both]
        the book's MSE a value on the training and held-out blocks of that data
    train_codebook.py --check BOOK.txt [--data F...]
        retrains with the arguments BOOK.txt records (its data files given again, their
        sha256 compared) and exits 1 when a value differs.
"""
import argparse
import hashlib
import os
import shlex
import sys

import numpy as np

BLOCK = 64
LOW = 6
HERE = os.path.dirname(os.path.abspath(__file__))
TIERS = {"turbo2_tcq": 2, "turbo3_tcq": 3}


def lloyd_max(k):
    """kv_turbo's Lloyd-Max centroids of the same rate, from turbo_centroids.h."""
    text = open(os.path.join(HERE, "..", "..", "kv_turbo", "turbo_centroids.h")).read()
    body = text.split("#define TURBO%d_CENTROIDS" % k)[1].split("#define")[0]
    vals = [float(x.strip().rstrip("f")) for x in body.replace("\\", " ").split(",") if x.strip()]
    return np.array(vals[: 1 << k], dtype=np.float32)


def initial_book(k):
    """Lloyd-Max centroid of the step's bits, shifted by the low bits within its cell."""
    c = lloyd_max(k).astype(np.float64)
    n = 1 << (k + LOW)
    book = np.empty(n)
    for s in range(n):
        o, low = s >> LOW, s & 63
        lo = c[o - 1] if o > 0 else c[o] - (c[1] - c[0])
        hi = c[o + 1] if o + 1 < len(c) else c[o] + (c[-1] - c[-2])
        rev = int(format(low, "06b")[::-1], 2)  # spread the low bits over the cell
        frac = (rev + 0.5) / 64 - 0.5
        book[s] = c[o] + frac * (hi - lo) / 2
    return book.astype(np.float32)


def viterbi(book, k, u):
    """States [B, 64] of the least-cost paths of blocks u [B, 64] (f32 costs)."""
    B, n, npred = u.shape[0], book.shape[0], 1 << k
    cost = np.full((B, n), np.inf, dtype=np.float32)
    cost[:, 0] = 0
    back = np.empty((BLOCK, B, 64), dtype=np.uint8)
    low = np.arange(n) & 63
    for t in range(BLOCK):
        c = cost.reshape(B, 64, npred)
        arg = c.argmin(axis=2)  # the first minimum: the lowest predecessor
        best = np.take_along_axis(c, arg[:, :, None], axis=2)[:, :, 0]
        back[t] = arg
        d = u[:, t, None] - book[None, :]
        cost = best[:, low] + d * d
    s = cost.argmin(axis=1)
    states = np.empty((B, BLOCK), dtype=np.int64)
    rows = np.arange(B)
    for t in range(BLOCK - 1, -1, -1):
        states[:, t] = s
        s = ((s & 63) << k) | back[t, rows, s & 63]
    return states


def decoded(book, states, u):
    """The codec's decode in u's units: the path's values scaled to u's norm."""
    v = book[states].astype(np.float64)
    un = np.linalg.norm(u.astype(np.float64), axis=1, keepdims=True)
    vn = np.linalg.norm(v, axis=1, keepdims=True)
    return v * np.where(vn > 0, un / np.where(vn > 0, vn, 1), 0)


def mse(book, k, u, chunk):
    err, n = 0.0, 0
    for i in range(0, len(u), chunk):
        x = u[i : i + chunk]
        err += float(((decoded(book, viterbi(book, k, x), x) - x) ** 2).sum())
        n += x.size
    return err / max(n, 1)


def scalar_mse(k, u):
    c = lloyd_max(k).astype(np.float64)
    x = u.astype(np.float64)
    q = c[np.abs(x[:, :, None] - c[None, None, :]).argmin(axis=2)]
    qn, xn = np.linalg.norm(q, axis=1, keepdims=True), np.linalg.norm(x, axis=1, keepdims=True)
    q = q * np.where(qn > 0, xn / np.where(qn > 0, qn, 1), 0)
    return float(((q - x) ** 2).mean())


def load(args):
    if args.synthetic:
        rng = np.random.default_rng(args.seed)
        y = rng.standard_normal((args.synthetic, BLOCK))
        return (8 * y / np.linalg.norm(y, axis=1, keepdims=True)).astype(np.float32), []
    rec = np.dtype([("layer", "<i4"), ("side", "<i4"), ("u", "<f4", BLOCK)])
    parts, sums = [], []
    for path in args.data:
        raw = open(path, "rb").read()
        if len(raw) % rec.itemsize:
            sys.exit("%s: %d bytes is not a whole number of %d-byte records"
                     % (path, len(raw), rec.itemsize))
        r = np.frombuffer(raw, dtype=rec)
        if args.side != "both":
            r = r[r["side"] == (0 if args.side == "k" else 1)]
        u = r["u"]
        if not np.isfinite(u).all():
            sys.exit("%s: a record that is not finite" % path)
        parts.append(u)
        sums.append("%s %s" % (os.path.basename(path), hashlib.sha256(raw).hexdigest()[:16]))
    u = np.concatenate(parts) if parts else np.zeros((0, BLOCK), np.float32)
    if args.max_blocks and len(u) > args.max_blocks:  # evenly spaced, deterministic
        u = u[np.linspace(0, len(u) - 1, args.max_blocks).astype(np.int64)]
    return np.ascontiguousarray(u, dtype=np.float32), sums


def train(args):
    k = TIERS[args.tier]
    u, sums = load(args)
    held = np.arange(len(u)) % args.holdout == args.holdout - 1
    tr, ho = u[~held], u[held]
    if len(tr) < 1000 or len(ho) < 100:
        sys.exit("too few blocks: %d training, %d held out" % (len(tr), len(ho)))
    book = initial_book(k)
    n = book.shape[0]
    log = []
    for it in range(args.iters):
        sums_s, counts = np.zeros(n), np.zeros(n)
        err = 0.0
        for i in range(0, len(tr), args.chunk):
            x = tr[i : i + args.chunk]
            st = viterbi(book, k, x)
            err += float(((book[st] - x) ** 2).sum())
            np.add.at(sums_s, st.ravel(), x.ravel().astype(np.float64))
            np.add.at(counts, st.ravel(), 1)
        new = np.where(counts > 0, sums_s / np.maximum(counts, 1), book)
        book = new.astype(np.float16).astype(np.float32)  # f16-exact, as every backend reads it
        log.append("iteration %d: path MSE %.6f, %d states unused"
                   % (it + 1, err / tr.size, int((counts == 0).sum())))
        print(log[-1], file=sys.stderr)
    table = {
        "train": (mse(book, k, tr, args.chunk), scalar_mse(k, tr), len(tr)),
        "held-out": (mse(book, k, ho, args.chunk), scalar_mse(k, ho), len(ho)),
    }
    return book, sums, table, log


def write(path, args, book, sums, table, log):
    cmd = ["--tier", args.tier, "--side", args.side, "--iters", str(args.iters),
           "--holdout", str(args.holdout), "--max-blocks", str(args.max_blocks)]
    cmd += ["--synthetic", str(args.synthetic), "--seed", str(args.seed)] if args.synthetic else []
    with open(path, "w") as f:
        f.write("# kv_tcq codebook %s: %d states, f16-exact values, state order\n"
                % (args.tier, len(book)))
        f.write("# made by: plugins/kv_tcq/tools/train_codebook.py %s%s --out BOOK\n"
                % (" ".join(cmd), "" if args.synthetic else " --data FILES"))
        f.write("# args: %s\n" % " ".join(shlex.quote(c) for c in cmd))
        for s in sums:
            f.write("# data: %s\n" % s)
        for name, (m, sm, nb) in table.items():
            f.write("# %s: %d blocks, MSE a value %.6f (scalar Lloyd-Max %.6f, %.1f%% lower)\n"
                    % (name, nb, m, sm, 100 * (1 - m / sm)))
        for line in log:
            f.write("# %s\n" % line)
        f.write("kv_tcq-codebook 1 %s %d\n" % (args.tier, len(book)))
        for v in book:
            f.write("%r\n" % float(v))


def read_book(path):
    lines = open(path).read().splitlines()
    args = next(l[len("# args: "):] for l in lines if l.startswith("# args: "))
    data = [l[len("# data: "):] for l in lines if l.startswith("# data: ")]
    head = next(i for i, l in enumerate(lines) if l.startswith("kv_tcq-codebook "))
    return shlex.split(args), data, np.array([float(x) for x in lines[head + 1 :]], np.float32)


def parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tier", choices=sorted(TIERS))
    ap.add_argument("--synthetic", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data", nargs="*", default=[])
    ap.add_argument("--side", choices=["k", "v", "both"], default="both")
    ap.add_argument("--iters", type=int, default=12)
    ap.add_argument("--holdout", type=int, default=5)
    ap.add_argument("--max-blocks", type=int, default=0)
    ap.add_argument("--chunk", type=int, default=8192)
    ap.add_argument("--out")
    ap.add_argument("--check")
    ap.add_argument("--eval")
    return ap


def main():
    a = parser().parse_args()
    if a.check:
        recorded, data, want = read_book(a.check)
        b = parser().parse_args(recorded + (["--data"] + a.data if a.data else []))
        book, sums, _, _ = train(b)
        if sums != data:
            print("data differs from the book's:\n  %s\nagainst\n  %s"
                  % ("\n  ".join(sums), "\n  ".join(data)))
            return 1
        bad = np.flatnonzero(book != want)
        if len(bad):
            print("%s: %d of %d values differ (first: state %d, %g against %g)"
                  % (a.check, len(bad), len(want), bad[0], book[bad[0]], want[bad[0]]))
            return 1
        print("%s: reproduced (%d values)" % (a.check, len(want)))
        return 0
    if a.eval:
        _, _, book = read_book(a.eval)
        k = {256: 2, 512: 3}[len(book)]
        u, _ = load(a)
        held = np.arange(len(u)) % a.holdout == a.holdout - 1
        for name, x in (("train", u[~held]), ("held-out", u[held])):
            m, sm = mse(book, k, x, a.chunk), scalar_mse(k, x)
            print("%s on %s: %d blocks, MSE %.6f against scalar %.6f (%.1f%% lower)"
                  % (a.eval, name, len(x), m, sm, 100 * (1 - m / sm)))
        return 0
    if not a.tier or not a.out or (not a.synthetic) == (not a.data):
        parser().error("--tier, --out and one of --synthetic / --data are needed")
    book, sums, table, log = train(a)
    write(a.out, a, book, sums, table, log)
    for name, (m, sm, nb) in table.items():
        print("%s: %d blocks, MSE %.6f against scalar %.6f" % (name, nb, m, sm))
    return 0


if __name__ == "__main__":
    sys.exit(main())
