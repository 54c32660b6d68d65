"""`tessera serve`'s security policy (docs/SERVER.md, "Security"): content types, origins and
CORS, per-phase timeouts against slow clients, the per-client connection cap, half-closed
clients, message fields, the default reply length against the context, and a scheduler
that cannot start.

usage: test_security.py TESSERA_BINARY SOURCE_ROOT DEFAULT_MODEL.gguf
Prints "ok   name" / "FAIL name" per case. No case depends on how fast the machine is: a
deadline is checked only against bounds many times wider than it.
"""
import json
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_util as su  # noqa: E402
from server_util import case, chat_body, check_error  # noqa: E402

TESSERA, SOURCE, MODEL = sys.argv[1], sys.argv[2], sys.argv[3]
CHAT, COMPL = "/v1/chat/completions", "/v1/completions"
INVALID = "invalid_request_error"
ALLOWED = "https://app.example"


def connect(port, timeout=60):
    return socket.create_connection((su.HOST, port), timeout=timeout)


def read_to_close(sock, limit_s):
    """Bytes until the server closes, or raises if it is still open after limit_s."""
    sock.settimeout(limit_s)
    got = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return got
            got += chunk
    except socket.timeout:
        raise AssertionError(f"still open {limit_s} s later; got {got[:300]!r}")
    except ConnectionResetError:
        return got


def request_bytes(path, body, ctype=b"application/json", extra=b""):
    data = json.dumps(body).encode()
    head = b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n" % (path.encode(), len(data))
    if ctype is not None:
        head += b"Content-Type: " + ctype + b"\r\n"
    return head + extra + b"\r\n" + data


def status_of(raw):
    assert raw.startswith(b"HTTP/1.1 "), raw[:200]
    return int(raw[9:12])


def json_of(raw):
    return json.loads(raw.split(b"\r\n\r\n", 1)[1])


with su.Server(TESSERA, MODEL, ["--parallel", "2", "--header-timeout", "2", "--body-timeout", "2",
                                "--cors-origins", ALLOWED + ", http://other.example"],
               label="security") as s:

    @case
    def test_bodies_that_are_not_declared_json_are_415():
        body = {"prompt": "x", "max_tokens": 1}
        for ctype in (None, b"text/plain", b"application/x-www-form-urlencoded",
                      b"multipart/form-data; boundary=x", b"application/jsonx", b"text/json"):
            for path in (COMPL, "/tokenize"):
                data = request_bytes(path, body, ctype, b"Connection: close\r\n")
                raw = su.raw_exchange(s.port, data, read_timeout=30)
                assert status_of(raw) == 415, f"{path} Content-Type {ctype}: {raw[:300]!r}"
                e = json_of(raw)["error"]
                assert e["code"] == "unsupported_media_type", e
                assert "application/json" in e["message"], e

    @case
    def test_json_with_parameters_is_accepted():
        for ctype in ("application/json; charset=utf-8", "Application/JSON",
                      "application/json ;x=1"):
            status, hdrs, data = s.request("POST", "/tokenize", json.dumps({"content": "a"}),
                                           {"Content-Type": ctype})
            assert status == 200, f"{ctype}: {status} {data[:200]!r}"

    @case
    def test_an_origin_not_listed_is_403_on_every_path():
        for method, path, body in (("GET", "/health", None), ("GET", "/v1/models", None),
                                   ("POST", COMPL, {"prompt": "x", "max_tokens": 1}),
                                   ("OPTIONS", CHAT, None)):
            status, doc = s.json(method, path, body, {"Origin": "https://evil.example"})
            check_error(status, doc, 403, INVALID, "origin_not_allowed", what=f"{method} {path}")
            assert "evil.example" in doc["error"]["message"], doc

    @case
    def test_a_listed_origin_gets_cors_headers_and_a_preflight():
        status, hdrs, _ = s.request("OPTIONS", CHAT, headers={
            "Origin": ALLOWED, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type, authorization"})
        assert status == 204, status
        assert hdrs.get("access-control-allow-origin") == ALLOWED, hdrs
        assert "POST" in hdrs.get("access-control-allow-methods", ""), hdrs
        allow = hdrs.get("access-control-allow-headers", "").lower()
        assert "content-type" in allow and "authorization" in allow, hdrs
        status, hdrs, data = s.request("POST", COMPL, {"prompt": "x", "max_tokens": 1},
                                       {"Origin": "http://other.example"})
        assert status == 200, data[:300]
        assert hdrs.get("access-control-allow-origin") == "http://other.example", hdrs
        assert hdrs.get("vary") == "Origin", hdrs

    @case
    def test_without_an_origin_there_are_no_cors_headers():
        status, hdrs, _ = s.request("GET", "/v1/models")
        assert status == 200 and "access-control-allow-origin" not in hdrs, hdrs
        status, hdrs, _ = s.request("OPTIONS", "/health")
        assert status == 204 and hdrs.get("allow") == "GET, HEAD, OPTIONS", (status, hdrs)
        assert "access-control-allow-origin" not in hdrs, hdrs

    @case
    def test_headers_trickled_past_the_header_timeout_get_408_and_a_close():
        sock = connect(s.port)
        try:
            t0 = time.monotonic()
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\n")
            got = b""
            sock.settimeout(0.5)
            # one byte every 0.5 s would keep an idle timeout from ever firing
            for b in b"Host: x\r\nX-Slow: " + b"a" * 200:
                try:
                    sock.sendall(bytes([b]))
                    got += sock.recv(65536)
                    break  # an answer, or the close
                except socket.timeout:
                    continue
                except (BrokenPipeError, ConnectionResetError):
                    break
            got += read_to_close(sock, 30)
            took = time.monotonic() - t0
            assert took < 90, f"closed only after {took:.0f} s"
            assert status_of(got) == 408, got[:300]
            e = json_of(got)["error"]
            assert e["code"] == "request_timeout" and "header_timeout" in e["message"], e
        finally:
            sock.close()

    @case
    def test_a_body_trickled_past_the_body_timeout_gets_408_and_a_close():
        sock = connect(s.port)
        try:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                         b"application/json\r\nContent-Length: 1000\r\n\r\n{")
            sock.settimeout(0.5)
            got = b""
            for _ in range(180):  # 90 s of one byte each 0.5 s: far past the 2 s limit
                try:
                    sock.sendall(b" ")
                    got += sock.recv(65536)
                    break
                except socket.timeout:
                    continue
                except (BrokenPipeError, ConnectionResetError):
                    break
            got += read_to_close(sock, 30)
            assert status_of(got) == 408, got[:300]
            assert "body_timeout" in json_of(got)["error"]["message"], got
        finally:
            sock.close()
        m = s.metrics()
        assert m["tessera_connections_timed_out_total"] >= 2, m

    @case
    def test_a_kept_alive_connection_idle_past_the_timeout_is_closed_without_an_answer():
        sock = connect(s.port)
        try:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            sock.settimeout(30)
            got = b""
            while b'"ok"' not in got:
                chunk = sock.recv(4096)
                assert chunk, got
                got += chunk
            rest = read_to_close(sock, 60)
            assert rest == b"", f"an idle kept-alive connection was answered: {rest[:200]!r}"
        finally:
            sock.close()

    @case
    def test_a_request_in_time_is_unaffected_by_the_deadlines():
        r = s.post(COMPL, {"prompt": "in time", "max_tokens": 2, "temperature": 0})
        assert r["usage"]["completion_tokens"] <= 2, r

    @case
    def test_a_half_closed_streaming_client_gets_its_whole_stream():
        sock = connect(s.port)
        try:
            sock.sendall(request_bytes(COMPL, {"prompt": "Once", "max_tokens": 8, "temperature": 0,
                                               "stream": True}))
            sock.shutdown(socket.SHUT_WR)
            got = read_to_close(sock, 60)
        finally:
            sock.close()
        assert got.startswith(b"HTTP/1.1 200"), got[:300]
        assert b"data: [DONE]" in got, got[-300:]
        assert b'"finish_reason":"length"' in got or b'"finish_reason":"stop"' in got, got[-500:]

    @case
    def test_a_half_closed_non_streaming_client_is_told_why_in_a_listed_error():
        n_ctx = s.slots()[0]["n_ctx"]
        sock = connect(s.port)
        try:
            sock.sendall(request_bytes(COMPL, {"prompt": "Once", "max_tokens": n_ctx - 16,
                                               "temperature": 0}))
            sock.shutdown(socket.SHUT_WR)
            got = read_to_close(sock, 60)
        finally:
            sock.close()
        assert status_of(got) == 400, got[:300]
        assert json_of(got)["error"]["code"] == "client_closed", got
        docs = open(os.path.join(SOURCE, "docs", "SERVER.md")).read()
        assert "client_closed" in docs, "docs/SERVER.md does not list client_closed"
        s.wait_slots_idle(30)

    @case
    def test_message_name_and_unknown_part_keys_are_refused():
        for msgs, names in (
                ([{"role": "user", "content": "x", "name": "bob"}], "name"),
                ([{"role": "user", "content": "x", "weight": 1}], "weight"),
                ([{"role": "user", "content": [{"type": "text", "text": "x", "cache": 1}]}],
                 "cache"),
                ([{"role": "user", "content": ["x"]}], "content[0]")):
            status, doc = s.json("POST", CHAT, {"messages": msgs, "max_tokens": 1})
            check_error(status, doc, 400, INVALID, names=names, what=json.dumps(msgs))

    @case
    def test_health_is_ok_while_serving():
        assert s.get("/health") == {"status": "ok"}


# held connections stay open past any idle deadline while the test runs
with su.Server(TESSERA, MODEL, ["--set", "context=96", "--set", "sampling.max_tokens=256",
                                "--client-connections", "3", "--header-timeout", "600"],
               label="limits") as s:
    @case
    def test_without_max_tokens_a_reply_runs_to_the_context_not_refused():
        n_ctx = s.slots()[0]["n_ctx"]
        assert n_ctx == 96, n_ctx
        text = "one two three four five six seven eight nine ten " * 3
        n_prompt = len(s.post("/tokenize", {"content": text})["tokens"])
        assert n_prompt + 256 > n_ctx > n_prompt, (n_prompt, n_ctx)
        for path, body in ((CHAT, chat_body(text)), ("/completion", {"prompt": text})):
            status, doc = s.json("POST", path, {**body, "temperature": 0, "seed": 1})
            assert status == 200, f"{path}: {status} {doc}"
        # an explicit max_tokens over what is left is still refused
        status, doc = s.json("POST", COMPL, {"prompt": text, "max_tokens": 256})
        check_error(status, doc, 400, INVALID, "context_length_exceeded")

    def hold(deadline):
        """A connection the server answered. The server counts a closed connection until it
        has reaped it, so one that just closed may hold a place a moment longer: retry."""
        while True:
            h = connect(s.port)
            try:
                h.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                h.settimeout(30)
                if b"200" in h.recv(4096):
                    return h
            except (BrokenPipeError, ConnectionResetError):
                pass
            h.close()
            assert time.monotonic() < deadline, "a connection under the cap was refused"
            time.sleep(0.2)

    @case
    def test_a_client_over_its_connection_cap_is_turned_away_and_others_are_not():
        deadline = time.monotonic() + 60
        held = []
        try:
            for _ in range(3):
                held.append(hold(deadline))
            extra = connect(s.port)
            try:
                extra.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                got = read_to_close(extra, 30)
            except (BrokenPipeError, ConnectionResetError):
                got = b""
            finally:
                extra.close()
            assert got == b"", f"a 4th connection with --client-connections 3 got {got[:200]!r}"
        finally:
            for h in held:
                h.close()
        deadline = time.monotonic() + 30  # the server lets the closed ones go
        while True:
            try:
                assert s.get("/health") == {"status": "ok"}
                break
            except (AssertionError, OSError):
                assert time.monotonic() < deadline, "no connection accepted after the others closed"
                time.sleep(0.2)


@case
def test_a_scheduler_that_cannot_allocate_fails_the_start_with_exit_1():
    # a batch of 2^31 - 1 tokens asks the scheduler for ~40 GiB; the address space has 3 GiB
    srv = su.Server(TESSERA, MODEL, ["--set", "batch=2147483647"],
                    wrapper=("bash", "-c", 'ulimit -v 3000000 && exec "$@"', "ulimit"))
    try:
        srv.start()
    except AssertionError:
        pass  # no "listening" line: what should happen
    else:
        srv.stop()
        raise AssertionError(f"it listened: {srv.log()[-2000:]}")
    code = srv.proc.wait(30)
    log = srv.log()
    assert code == 1, f"exit {code}: {log[-2000:]}"
    assert "scheduler" in log and "batch" in log, log[-2000:]


su.finish()
