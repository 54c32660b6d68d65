"""Shared pieces of the `tessera serve` tests: start a server on a free loopback port, talk to
it over raw HTTP, parse its SSE streams and its error JSON, read its memory.

Every test script takes TESSERA_BINARY SOURCE_ROOT DEFAULT_MODEL.gguf and prints
"ok   name" / "FAIL name" per case (scripts/count_tests.py counts those lines).
"""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

HOST = "127.0.0.1"
# The openai package (httpx) and curl honour proxy variables; the server is on loopback.
os.environ["NO_PROXY"] = os.environ["no_proxy"] = "127.0.0.1,localhost"

failures = 0


def report(name, fn):
    """Runs fn, prints one ok/FAIL line for it; a failure's reason goes to stderr."""
    global failures
    try:
        fn()
        print(f"ok   {name}", flush=True)
        return True
    except Exception as e:  # an exception other than AssertionError is a failure too
        failures += 1
        print(f"FAIL {name}", flush=True)
        kind = "" if isinstance(e, AssertionError) else f"{type(e).__name__}: "
        print(f"  {name}: {kind}{e}", file=sys.stderr, flush=True)
        return False


def case(fn):
    report(fn.__name__, fn)
    return fn


def finish():
    sys.exit(1 if failures else 0)


LISTEN_RE = re.compile(r"tessera serve: listening on http://([^\s:/]+|\[[^\]]+\]):(\d+)")


class Server:
    """`tessera serve -m MODEL --port 0 ARGS...`, stopped by SIGTERM on leaving the `with`.

    Leaving the block is itself a reported case, `<label>_exits_0_on_sigterm`: the process must
    exit 0 within stop_timeout seconds. stderr is drained by a thread so the server never
    blocks on a full pipe; `log()` returns what it wrote.
    """

    def __init__(self, tessera, model, args=(), label="server", env=None, wrapper=(),
                 start_timeout=30.0, stop_timeout=10.0):
        self.label, self.stop_timeout = label, stop_timeout
        self.cmd = [*wrapper, tessera, "serve", "--host", HOST, "--port", "0"]
        if model:
            self.cmd += ["-m", model]
        self.cmd += list(args)
        self.env = dict(os.environ, **(env or {}))
        self.start_timeout = start_timeout
        self.proc, self.port, self.exit_code = None, None, None
        self._err = []
        self._lock = threading.Lock()
        self._listening = threading.Event()

    def _drain(self):
        for raw in self.proc.stderr:
            line = raw.decode("utf-8", "replace")
            with self._lock:
                self._err.append(line)
            m = LISTEN_RE.search(line)
            if m and self.port is None:
                self.port = int(m.group(2))
                self._listening.set()
        self._listening.set()  # EOF: wake start() so it sees the exit

    def log(self):
        with self._lock:
            return "".join(self._err)

    def start(self):
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, env=self.env)
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()
        self._listening.wait(self.start_timeout)
        if self.port is None:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"{' '.join(self.cmd)}: no 'tessera serve: listening on' line in "
                                 f"{self.start_timeout:.0f} s (exit {self.proc.returncode}); "
                                 f"stderr:\n{self.log()[-3000:]}")

    def send_signal(self, sig):
        self.proc.send_signal(sig)

    def wait_exit(self, timeout):
        """The exit code, or None if the process is still running after timeout seconds."""
        try:
            self.exit_code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self._thread.join(5)
        return self.exit_code

    def stop(self, sig=signal.SIGTERM):
        """Sends sig, waits; kills it if it outlives stop_timeout. Returns (code, seconds)."""
        t0 = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.wait_exit(self.stop_timeout)
        took = time.monotonic() - t0
        if code is None:
            self.proc.kill()
            self.proc.wait()
        return code, took

    def __enter__(self):
        # A server that does not start fails this script: every later case needs one.
        if not report(f"{self.label}_starts", self.start):
            finish()
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is not None and self.exit_code is not None:
            return False  # a test already stopped it and checked how
        already_dead = self.proc.poll()

        def exits_0():
            assert already_dead is None, \
                f"the server died during the tests (exit {already_dead}); stderr:\n" \
                f"{self.log()[-3000:]}"
            code, took = self.stop()
            assert code is not None, f"still running {self.stop_timeout:.0f} s after SIGTERM " \
                                     f"(killed); stderr:\n{self.log()[-2000:]}"
            assert code == 0, f"exit {code} after SIGTERM; stderr:\n{self.log()[-3000:]}"

        report(f"{self.label}_exits_0_on_sigterm", exits_0)
        return False

    # ---- HTTP -------------------------------------------------------------------------------

    def conn(self, timeout=60):
        return http.client.HTTPConnection(HOST, self.port, timeout=timeout)

    def request(self, method, path, body=None, headers=None, timeout=60):
        """Raw request: (status, {lower-case header: value}, body bytes)."""
        c = self.conn(timeout)
        try:
            if isinstance(body, (dict, list)):
                body = json.dumps(body).encode()
                headers = {"Content-Type": "application/json", **(headers or {})}
            elif isinstance(body, str):
                body = body.encode()
            if body is not None and not any(k.lower() == "content-type" for k in headers or {}):
                headers = {"Content-Type": "application/json", **(headers or {})}
            c.request(method, path, body=body, headers=headers or {})
            r = c.getresponse()
            data = r.read()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, data
        finally:
            c.close()

    def json(self, method, path, body=None, headers=None, timeout=60):
        """(status, parsed JSON body); the body must be JSON whatever the status."""
        status, hdrs, data = self.request(method, path, body, headers, timeout)
        try:
            doc = json.loads(data)
        except ValueError:
            raise AssertionError(f"{method} {path}: status {status}, body is not JSON: "
                                 f"{data[:300]!r}")
        ctype = hdrs.get("content-type", "")
        assert ctype.startswith("application/json"), \
            f"{method} {path}: status {status}, JSON body with content-type {ctype!r}"
        return status, doc

    def ok(self, method, path, body=None, headers=None, timeout=60):
        """The parsed JSON of a request that must answer 200."""
        status, doc = self.json(method, path, body, headers, timeout)
        assert status == 200, f"{method} {path} {short(body)}: status {status}: {short(doc)}"
        return doc

    def post(self, path, body, headers=None, timeout=60):
        return self.ok("POST", path, body, headers, timeout)

    def get(self, path, headers=None):
        return self.ok("GET", path, None, headers)

    def stream(self, path, body, headers=None, timeout=60):
        """A streaming POST read to the end: a Stream (status, headers, events, done)."""
        c = self.conn(timeout)
        try:
            data = json.dumps(body).encode()
            c.request("POST", path, body=data,
                      headers={"Content-Type": "application/json", **(headers or {})})
            r = c.getresponse()
            hdrs = {k.lower(): v for k, v in r.getheaders()}
            if r.status != 200:
                return Stream(r.status, hdrs, [], False, r.read())
            return read_sse(r, r.status, hdrs)
        finally:
            c.close()

    def slots(self, headers=None):
        doc = self.get("/slots", headers)
        assert isinstance(doc, list) and doc, f"/slots: not a non-empty list: {short(doc)}"
        for s in doc:
            for k in ("id", "state", "n_ctx", "n_cached", "n_prompt", "n_decoded"):
                assert k in s, f"/slots entry without '{k}': {s}"
        return doc

    def wait_slots_idle(self, timeout=60.0, headers=None):
        """Polls /slots until every slot is idle; returns the last answer or fails."""
        t_end = time.monotonic() + timeout
        while True:
            slots = self.slots(headers)
            if all(s["state"] == "idle" for s in slots):
                return slots
            if time.monotonic() > t_end:
                raise AssertionError(f"slots not idle {timeout:.0f} s later: {slots}")
            time.sleep(0.05)

    def metrics(self, headers=None):
        status, hdrs, data = self.request("GET", "/metrics", headers=headers)
        assert status == 200, f"/metrics: status {status}: {data[:300]!r}"
        return parse_metrics(data.decode())

    def rss_kib(self):
        return rss_kib(self.proc.pid)


class Stream:
    def __init__(self, status, headers, events, done, raw, trailing=b""):
        self.status, self.headers, self.events, self.done = status, headers, events, done
        self.raw, self.trailing = raw, trailing

    def __repr__(self):
        return f"<stream {self.status} done={self.done} {len(self.events)} events " \
               f"last={short(self.events[-1:]) if self.events else None} raw={self.raw[-200:]!r}>"


def read_sse(r, status=200, headers=None):
    """Reads an SSE body from a file-like response to EOF. Each event's data must be JSON or
    [DONE]; anything after [DONE] is kept in .trailing (there should be nothing). A connection
    that breaks mid-stream ends the read (done stays False)."""
    events, done, raw, trailing = [], False, b"", b""
    data_lines = []
    try:
        while True:
            line = r.readline()
            if not line:
                break
            raw += line
            if done:
                trailing += line
                continue
            text = line.decode("utf-8").rstrip("\r\n")
            if text.startswith("data:"):
                data_lines.append(text[5:].lstrip(" "))
            elif text == "" and data_lines:
                payload = "\n".join(data_lines)
                data_lines = []
                if payload == "[DONE]":
                    done = True
                    continue
                try:
                    events.append(json.loads(payload))
                except ValueError:
                    raise AssertionError(f"SSE event is not JSON: {payload[:300]!r}")
            elif text.startswith(":") or text == "":
                pass  # an SSE comment (keep-alive) or a stray blank line
            else:
                assert re.match(r"^(event|id|retry):", text), f"not an SSE line: {text[:200]!r}"
    except (ConnectionError, http.client.IncompleteRead, socket.timeout, OSError):
        pass
    return Stream(status, headers or {}, events, done, raw, trailing)


def short(x, n=400):
    s = x if isinstance(x, str) else json.dumps(x) if isinstance(x, (dict, list)) else repr(x)
    return s if len(s) <= n else s[:n] + "..."


def check_error(status, doc, want_status, want_type, want_code=None, names=None, what=""):
    """An OpenAI-style error: {"error": {"message", "type", "param", "code"}}."""
    where = f"{what}: " if what else ""
    assert status == want_status, f"{where}status {status}, wanted {want_status}: {short(doc)}"
    assert isinstance(doc, dict) and isinstance(doc.get("error"), dict), \
        f"{where}no error object: {short(doc)}"
    e = doc["error"]
    for k in ("message", "type", "param", "code"):
        assert k in e, f"{where}error without '{k}': {short(doc)}"
    assert isinstance(e["message"], str) and e["message"].strip(), f"{where}empty message: {e}"
    assert e["type"] == want_type, f"{where}type {e['type']!r}, wanted {want_type!r}: {e}"
    if want_code is not None:
        assert e["code"] == want_code, f"{where}code {e['code']!r}, wanted {want_code!r}: {e}"
    if names is not None:
        text = e["message"] + " " + str(e.get("param") or "")
        assert names in text, f"{where}the error does not name '{names}': {e}"
    return e


def check_usage(u, max_tokens=None, finish=None):
    for k in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert isinstance(u.get(k), int), f"usage.{k} missing or not an integer: {u}"
    assert u["prompt_tokens"] > 0, u
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], u
    if max_tokens is not None:
        assert u["completion_tokens"] <= max_tokens, f"{u} with max_tokens {max_tokens}"
        if finish == "length":
            assert u["completion_tokens"] == max_tokens, f"{u}: finish 'length' below max_tokens"


def check_chunks(stream, obj, model):
    """A finished OpenAI stream: 200, event-stream, chunks of one id ending in [DONE]; returns
    (concatenated text, finish_reason, usage or None)."""
    assert stream.status == 200, f"stream status {stream.status}: {stream.raw[:300]!r}"
    ctype = stream.headers.get("content-type", "")
    assert ctype.startswith("text/event-stream"), f"content-type {ctype!r}"
    assert stream.done, f"no data: [DONE] at the end: {stream}"
    assert not stream.trailing.strip(), f"bytes after [DONE]: {stream.trailing[:200]!r}"
    assert stream.events, "no chunks before [DONE]"
    ids = {e.get("id") for e in stream.events}
    assert len(ids) == 1 and None not in ids, f"chunk ids differ or are missing: {ids}"
    if obj == "chat.completion.chunk":
        first = stream.events[0].get("choices") or [{}]
        assert first[0].get("delta", {}).get("role") == "assistant", \
            f"the first chunk's delta has no role 'assistant': {stream.events[0]}"
    text, finish, usage = "", None, None
    for e in stream.events:
        assert "error" not in e, f"error event in the stream: {e}"
        assert e.get("object") == obj, f"object {e.get('object')!r}, wanted {obj}: {e}"
        if model is not None:
            assert e.get("model") == model, f"model {e.get('model')!r}, wanted {model!r}: {e}"
        assert isinstance(e.get("created"), int), f"created not an integer: {e}"
        if e.get("usage"):
            usage = e["usage"]
        for c in e.get("choices", []):
            assert finish is None, f"a chunk after the one with finish_reason: {e}"
            assert c.get("index") == 0, e
            piece = c["delta"].get("content") if obj == "chat.completion.chunk" else c.get("text")
            if piece is not None:
                assert isinstance(piece, str), e
                text += piece
            finish = c.get("finish_reason") or finish
    assert finish in ("stop", "length"), f"finish_reason {finish!r} in the last chunk"
    return text, finish, usage


METRIC_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)(\s+-?\d+)?$")


def parse_metrics(text):
    """Prometheus text format 0.0.4 -> {name: value} (labels ignored; values summed per name).
    Every line must be a comment or a sample with a float value."""
    values = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            if line.startswith("# TYPE"):
                parts = line.split()
                assert len(parts) == 4 and parts[3] in (
                    "counter", "gauge", "histogram", "summary", "untyped"), f"bad TYPE: {line!r}"
            continue
        m = METRIC_RE.match(line)
        assert m, f"not a Prometheus sample line: {line!r}"
        try:
            v = float(m.group(3))
        except ValueError:
            raise AssertionError(f"sample value is not a number: {line!r}")
        values[m.group(1)] = values.get(m.group(1), 0.0) + v
    return values


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


def raw_exchange(port, data, read_timeout=5.0, close_write=False):
    """Sends raw bytes on a fresh connection, returns whatever comes back until the server
    closes or read_timeout passes (a server that neither answers nor closes is not a crash)."""
    s = socket.create_connection((HOST, port), timeout=read_timeout)
    got = b""
    try:
        s.sendall(data)
        if close_write:
            try:
                s.shutdown(socket.SHUT_WR)
            except OSError:  # the server answered and closed first (ENOTCONN): read its answer
                pass
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
    except (socket.timeout, ConnectionError):
        pass
    finally:
        s.close()
    return got


def open_stream(port, path, body, timeout=120):
    """A streaming POST on a raw socket, read until its headers: (socket, bytes so far)."""
    data = json.dumps({**body, "stream": True}).encode()
    sock = socket.create_connection((HOST, port), timeout=timeout)
    try:
        sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % (path.encode(), len(data)) + data)
        got = b""
        while b"\r\n\r\n" not in got:
            chunk = sock.recv(4096)
            assert chunk, f"{path}: closed before its headers: {got[:300]!r}"
            got += chunk
        assert got.startswith(b"HTTP/1.1 200"), got[:300]
    except BaseException:
        sock.close()
        raise
    return sock, got


def abandon_stream(port, path, body, timeout=30):
    """Starts a streaming request, reads until its first data event, then closes the socket:
    a client that leaves mid-stream."""
    sock, got = open_stream(port, path, body, timeout)
    try:
        while b"data:" not in got:
            chunk = sock.recv(4096)
            assert chunk, f"{path}: closed before the first data event: {got[:300]!r}"
            got += chunk
    finally:
        sock.close()


def chat_body(text="Hello", **kw):
    return {"model": "m", "messages": [{"role": "user", "content": text}], **kw}


def parallel_map(fn, items, threads):
    """fn over items with `threads` worker threads; results in item order. An exception in fn
    is returned in its place (the caller asserts on it)."""
    results = [None] * len(items)
    lock = threading.Lock()
    next_i = [0]

    def worker():
        while True:
            with lock:
                i = next_i[0]
                next_i[0] += 1
            if i >= len(items):
                return
            try:
                results[i] = fn(items[i])
            except Exception as e:
                results[i] = e

    ts = [threading.Thread(target=worker, daemon=True) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return results
