#!/usr/bin/env python3
"""Soak test for `tessera serve` (a script, not part of the test suite).

  soak.py TESSERA_BINARY MODEL.gguf [--streams 64] [--minutes 10] [--parallel 8]
          [--rss-bound-mib 32] [--seed 1]

Starts a server, then `--streams` client threads send requests back to back for
`--minutes`: chat and completion, streaming and not, random lengths, and about one
request in five cancelled (a stream closed after a few events, or a non-streaming
request whose socket is closed while it waits). It fails (exit 1) on any request that
ends other than as expected, a slot or queue entry still held after the clients stop,
or RSS that grows by more than --rss-bound-mib between the end of the first minute and
the end. It prints one summary: requests by kind, tokens, errors, RSS over time.
"""
import argparse
import json
import os
import random
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_util as su  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("tessera")
ap.add_argument("model")
ap.add_argument("--streams", type=int, default=64)
ap.add_argument("--minutes", type=float, default=10)
ap.add_argument("--parallel", type=int, default=8)
ap.add_argument("--rss-bound-mib", type=float, default=32)
ap.add_argument("--seed", type=int, default=1)
args = ap.parse_args()

WORDS = ("the cache holds every key and value a model has seen so far while it writes "
         "one token after another from a prompt of any length").split()
lock = threading.Lock()
counts = {}
errors = []
stop_at = 0.0


def count(kind):
    with lock:
        counts[kind] = counts.get(kind, 0) + 1


def error(what):
    with lock:
        errors.append(what)


def request_bytes(path, body):
    data = json.dumps(body).encode()
    return (b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % (path.encode(), len(data))) + data


def one(srv, port, rng):
    chat = rng.random() < 0.5
    stream = rng.random() < 0.5
    cancel = rng.random() < 0.2
    prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 60)))
    n = rng.randint(1, 48)
    if chat:
        path, body = "/v1/chat/completions", su.chat_body(prompt, max_tokens=n)
    else:
        path, body = "/v1/completions", {"prompt": prompt, "max_tokens": n}
    body.update(stream=stream, temperature=rng.choice((0, 0.8)), seed=rng.randint(0, 1 << 30))
    kind = f"{'chat' if chat else 'completion'}{'_stream' if stream else ''}"
    try:
        if cancel:
            # leave after a few bytes of a stream, or while a plain request waits
            sock = socket.create_connection((su.HOST, port), timeout=300)
            try:
                sock.sendall(request_bytes(path, body))
                if stream:
                    sock.recv(rng.randint(1, 400))
                else:
                    time.sleep(rng.random() * 0.2)
            finally:
                sock.close()
            count(kind + "_cancelled")
            return
        if stream:
            st = srv.stream(path, body, timeout=300)
            status, doc = st.status, json.loads(st.raw) if st.status != 200 else None
        else:
            status, doc = srv.json("POST", path, body, timeout=300)
        if status == 503 and doc["error"]["code"] == "server_busy":
            count(kind + "_busy")  # the queue was full: an answer, not an error
            return
        if status != 200:
            error(f"{kind}: status {status}: {su.short(doc)}")
            return
        if stream:
            if not st.done or any("error" in ev for ev in st.events) or st.trailing:
                error(f"{kind}: stream did not end cleanly: {st}")
                return
            finish = st.events[-1]["choices"][0]["finish_reason"] if st.events else None
        else:
            finish = doc["choices"][0]["finish_reason"]
            if doc["usage"]["completion_tokens"] > n:
                error(f"{kind}: {doc['usage']['completion_tokens']} tokens > max_tokens {n}")
                return
        if finish not in ("stop", "length"):
            error(f"{kind}: finish_reason {finish!r}")
            return
        count(kind)
    except (OSError, ValueError, KeyError, IndexError, AssertionError) as e:
        error(f"{kind}{' cancelled' if cancel else ''}: {type(e).__name__}: {e}")


def client(port, i):
    rng = random.Random(args.seed * 1000003 + i)
    while time.monotonic() < stop_at:
        one(srv, port, rng)


srv = su.Server(args.tessera, args.model,
                ["--parallel", str(args.parallel), "--queue", str(args.streams * 2)],
                label="soak", start_timeout=60)
srv.start()
t0 = time.monotonic()
stop_at = t0 + args.minutes * 60
threads = [threading.Thread(target=client, args=(srv.port, i), daemon=True)
           for i in range(args.streams)]
for t in threads:
    t.start()
rss = []  # (seconds, MiB)
while any(t.is_alive() for t in threads):
    rss.append((time.monotonic() - t0, srv.rss_kib() / 1024))
    time.sleep(10)
for t in threads:
    t.join()
try:
    slots = srv.wait_slots_idle(30)
    m = srv.metrics()
    if m["tessera_requests_waiting"] != 0 or m["tessera_slots_busy"] != 0:
        error(f"after the clients stopped: {m['tessera_requests_waiting']} waiting, "
              f"{m['tessera_slots_busy']} slots busy")
except AssertionError as e:
    error(f"stuck: {e}")
    m = {}
rss.append((time.monotonic() - t0, srv.rss_kib() / 1024))
code, _ = srv.stop()
if code != 0:
    error(f"exit {code} after SIGTERM")

after_first_minute = next((r for t, r in rss if t >= 60), rss[0][1])
growth = rss[-1][1] - after_first_minute
total = sum(counts.values())
print(f"soak: {args.streams} streams, {args.minutes:g} min, --parallel {args.parallel}: "
      f"{total} requests ({total / (args.minutes * 60):.1f}/s), {len(errors)} errors")
for k in sorted(counts):
    print(f"  {k}: {counts[k]}")
print(f"  generated tokens: {m.get('tessera_generated_tokens_total', 0):.0f}, "
      f"prompt tokens: {m.get('tessera_prompt_tokens_total', 0):.0f}")
print(f"  RSS MiB: start {rss[0][1]:.1f}, after 1 min {after_first_minute:.1f}, "
      f"max {max(r for _, r in rss):.1f}, end {rss[-1][1]:.1f} "
      f"(growth {growth:+.1f}, bound {args.rss_bound_mib:g})")
for e in errors[:20]:
    print(f"  error: {e}")
if growth > args.rss_bound_mib:
    errors.append("rss")
    print(f"FAIL: RSS grew {growth:.1f} MiB after the first minute")
sys.exit(1 if errors else 0)
