#!/usr/bin/env python3
"""linkproxy: an HTTP/1.1 reverse proxy that models one network link in front of an S3 server.

Used by scripts/bench-lazy.sh between a runner's store and SeaweedFS (scripts/seaweedfs.sh), so a
pull over loopback pays what it would pay over a real link. Python 3 standard library only.

The link model:
  * Rate: ONE token bucket shared by ALL connections for the bytes sent to clients (response heads
    and bodies), `--rate` in Mbit/s (10^6 bits/s; 0 = unlimited), burst `--burst-kib` (64 KiB).
    N parallel GETs therefore share the rate, as on a real link (a per-connection limit would give
    N x the rate). Bytes are written in pieces of at most 16 KiB, each after taking its tokens;
    waiters are served in arrival order (one asyncio.Lock), so parallel responses interleave.
  * Upload: request heads and bodies go through a SECOND bucket of the same rate and burst (the
    link is full duplex: an upload does not slow the downloads).
  * Latency: `--delay-ms` is added to every response's time to first byte: the proxy holds the
    response head that long after it arrived from the upstream (one round trip of the link; the
    upstream's own time comes on top).
  * Faults: while the `--control` file holds `down` (polled every 100 ms), no byte moves in either
    direction on any connection, in-flight or new: connections stay open, as a cut link looks to
    TCP; `up` or removing the file resumes.

HTTP handling: several requests per connection (keep-alive); request bodies framed by
Content-Length or chunked; `Expect: 100-continue`; response bodies framed by Content-Length,
chunked (trailers relayed) or the end of the connection; HEAD, 1xx, 204 and 304 responses have no
body. Heads are forwarded unchanged (the Host header too: an S3 client's SigV4 signature covers it,
so the upstream checks the signature against the host the client signed). Each client connection
gets its own upstream connection, kept alive with it. The proxy answers nothing itself: every
path goes upstream.

Log (`--log FILE`): one JSON line per request, written when its response ended:
  {"t": start, s since the epoch, "conn": connection number, "method", "path", "range": the Range
   header or null, "status": int (0 when no response came), "bytes": response body bytes,
   "req_bytes": request body bytes, "ms": start of the request to the end of its response,
   "error": present when the exchange failed}

Usage:
  linkproxy.py --upstream http://127.0.0.1:8333 [--listen 127.0.0.1] [--port 0] [--port-file F]
               [--rate 200] [--delay-ms 20] [--burst-kib 64] [--log F] [--control F]
  linkproxy.py --self-test     starts a local upstream and checks rate sharing, delay, keep-alive,
                               framing, the log line, down/up and SIGTERM (~5 s); exit 0 or 1
The chosen port is printed on stdout (`port N`) and written to --port-file (renamed into place).
SIGTERM or SIGINT closes the listener and every connection and exits 0.
Exit status: 0 ok, 1 a failed self-test or a runtime error, 2 bad arguments.
"""

import argparse
import asyncio
import itertools
import json
import os
import signal
import sys
import time
import urllib.parse

PIECE = 64 * 1024  # largest write that takes tokens at once
HEAD_LIMIT = 1 << 20  # longest accepted request/response head, bytes


class Bucket:
    """A token bucket: `rate` bytes/s (0 = unlimited), at most `burst` bytes saved up while idle.

    `take(n)` takes n tokens at once and may leave the bucket in debt; the taker sleeps only once
    the debt passes `burst` (until it is paid), so a sleep is rarely shorter than the event loop's
    timer resolution (1 ms) and coarse timers do not cap the rate. Takers are served in arrival
    order (one asyncio.Lock, held while sleeping), so parallel responses interleave piece by piece.
    The most that can leave at once after an idle spell is therefore 2 x burst.
    """

    def __init__(self, rate, burst):
        self.rate = float(rate)
        self.burst = float(burst)
        self.tokens = self.burst
        self.stamp = time.monotonic()
        self.lock = asyncio.Lock()

    async def take(self, n):
        if self.rate <= 0:
            return
        async with self.lock:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
            self.tokens -= n
            if self.tokens < -self.burst:
                await asyncio.sleep(-self.tokens / self.rate)


class Link:
    """The shared state of the modelled link: both buckets, the delay and up/down."""

    def __init__(self, rate_mbit, delay_ms, burst):
        rate = rate_mbit * 1e6 / 8
        self.down = Bucket(rate, burst)  # upstream -> client
        self.up = Bucket(rate, burst)  # client -> upstream
        self.delay = delay_ms / 1000.0
        self.is_up = asyncio.Event()
        self.is_up.set()

    async def send(self, writer, data, bucket):
        """Writes `data` to `writer` in pieces, each after the link is up and its tokens taken."""
        view = memoryview(data)
        for i in range(0, len(view), PIECE):
            piece = view[i : i + PIECE]
            await self.is_up.wait()
            await bucket.take(len(piece))
            await self.is_up.wait()
            writer.write(piece)
            await writer.drain()


class Closed(Exception):
    """The peer closed its connection where a message was expected to go on."""


def parse_headers(lines):
    """Header lines (bytes, without CRLF) -> list of (lowercased name, value) str pairs."""
    out = []
    for line in lines:
        if not line:
            continue
        name, _, value = line.partition(b":")
        out.append((name.strip().lower().decode("latin-1"), value.strip().decode("latin-1")))
    return out


def header(headers, name):
    """The last value of header `name` (lowercase), or None."""
    value = None
    for k, v in headers:
        if k == name:
            value = v
    return value


def tokens(headers, name):
    """The comma-separated, lowercased tokens of every `name` header (Connection, T-E)."""
    out = []
    for k, v in headers:
        if k == name:
            out += [t.strip().lower() for t in v.split(",") if t.strip()]
    return out


async def read_head(reader, first=False):
    """Reads one message head (through the blank line). None on EOF before its first byte when
    `first` (a client that closed between requests); Closed on EOF inside a head."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        if first and not e.partial.strip():
            return None
        raise Closed("connection closed inside a message head") from e
    except asyncio.LimitOverrunError as e:
        raise Closed("message head over %d bytes" % HEAD_LIMIT) from e
    return head


async def read_exactly(reader, n):
    try:
        return await reader.readexactly(n)
    except asyncio.IncompleteReadError as e:
        raise Closed("connection closed inside a body") from e


async def relay_body(reader, writer, link, bucket, length=None, chunked=False):
    """Copies one body from reader to writer through the link: `length` bytes, or chunked
    (sizes, data, trailers), or (neither) everything until EOF. Returns the body's data bytes."""
    moved = 0
    if chunked:
        while True:
            line = await reader.readuntil(b"\r\n")
            size = int(line.split(b";", 1)[0].strip(), 16)
            await link.send(writer, line, bucket)
            if size == 0:
                while True:  # trailers, then the blank line
                    t = await reader.readuntil(b"\r\n")
                    await link.send(writer, t, bucket)
                    if t == b"\r\n":
                        return moved
            left = size
            while left:
                data = await read_exactly(reader, min(left, PIECE * 4))
                await link.send(writer, data, bucket)
                left -= len(data)
            moved += size
            await link.send(writer, await read_exactly(reader, 2), bucket)
    elif length is not None:
        left = length
        while left:
            data = await reader.read(min(left, PIECE * 4))
            if not data:
                raise Closed("connection closed inside a body")
            await link.send(writer, data, bucket)
            left -= len(data)
        return length
    else:
        while True:
            data = await reader.read(PIECE * 4)
            if not data:
                return moved
            await link.send(writer, data, bucket)
            moved += len(data)


def body_framing(headers):
    """(length, chunked) of a message with a body, from its headers."""
    te = tokens(headers, "transfer-encoding")
    if te and te[-1] == "chunked":
        return None, True
    cl = header(headers, "content-length")
    return (int(cl) if cl is not None else None), False


class Proxy:
    """The listener: one task per client connection, each with its own upstream connection."""

    def __init__(self, upstream, link, log):
        self.host, self.port = upstream
        self.link = link
        self.log = log
        self.ids = itertools.count(1)
        self.tasks = set()

    def log_line(self, entry):
        if self.log is not None:
            self.log.write(json.dumps(entry, separators=(",", ":")) + "\n")
            self.log.flush()

    async def client(self, creader, cwriter):
        task = asyncio.current_task()
        self.tasks.add(task)
        conn = next(self.ids)
        up = None
        try:
            while True:
                head = await read_head(creader, first=True)
                if head is None:
                    return
                keep, up = await self.exchange(conn, head, creader, cwriter, up)
                if not keep:
                    return
        except (Closed, ConnectionError, asyncio.IncompleteReadError, ValueError):
            return
        except asyncio.CancelledError:
            return
        finally:
            self.tasks.discard(task)
            for w in (cwriter, up[1] if up else None):
                if w is not None:
                    w.close()

    async def connect(self):
        return await asyncio.open_connection(self.host, self.port, limit=HEAD_LIMIT)

    async def exchange(self, conn, head, creader, cwriter, up):
        """One request and its response. Returns (keep the client connection, upstream)."""
        t0, m0 = time.time(), time.monotonic()
        lines = head[:-4].split(b"\r\n")
        method, target, version = (lines[0].decode("latin-1").split(" ", 2) + ["", ""])[:3]
        headers = parse_headers(lines[1:])
        entry = {
            "t": round(t0, 3),
            "conn": conn,
            "method": method,
            "path": target,
            "range": header(headers, "range"),
            "status": 0,
            "bytes": 0,
            "req_bytes": 0,
        }
        link = self.link
        req_len, req_chunked = body_framing(headers)
        has_body = req_chunked or bool(req_len)
        expect = (header(headers, "expect") or "").lower() == "100-continue"
        client_close = "close" in tokens(headers, "connection") or (
            version == "HTTP/1.0" and "keep-alive" not in tokens(headers, "connection")
        )
        try:
            # A reused upstream connection may have been closed by the upstream while idle: a
            # request without a body is then sent again once on a fresh connection.
            for attempt in (0, 1):
                reused = up is not None
                if up is None:
                    up = await self.connect()
                ureader, uwriter = up
                try:
                    await link.send(uwriter, head, link.up)
                    if not expect and has_body:
                        entry["req_bytes"] = await relay_body(
                            creader, uwriter, link, link.up, req_len, req_chunked
                        )
                    rhead = await read_head(ureader)
                    break
                except (Closed, ConnectionError):
                    uwriter.close()
                    up = None
                    if not reused or attempt == 1 or has_body:
                        raise
            keep = not client_close
            body_sent = not (expect and has_body)
            # Interim responses (100 Continue, 103) are relayed; after a 100 the body follows.
            while True:
                rlines = rhead[:-4].split(b"\r\n")
                status = int(rlines[0].split(b" ", 2)[1])
                if status >= 200 or status == 101:
                    break
                await link.send(cwriter, rhead, link.down)
                if status == 100 and not body_sent:
                    entry["req_bytes"] = await relay_body(
                        creader, uwriter, link, link.up, req_len, req_chunked
                    )
                    body_sent = True
                rhead = await read_head(ureader)
            if not body_sent:
                keep = False  # refused before its body: the body was never read
            rheaders = parse_headers(rlines[1:])
            entry["status"] = status
            if link.delay:
                await asyncio.sleep(link.delay)
            await link.send(cwriter, rhead, link.down)
            no_body = method == "HEAD" or status in (204, 304) or status < 200
            if not no_body:
                length, chunked = body_framing(rheaders)
                if length is None and not chunked:
                    keep = False  # delimited by the end of the connection
                entry["bytes"] = await relay_body(ureader, cwriter, link, link.down, length, chunked)
            if "close" in tokens(rheaders, "connection") or rlines[0].startswith(b"HTTP/1.0"):
                keep = False
            if not keep:
                uwriter.close()
                up = None
            return keep, up
        except asyncio.CancelledError:
            entry["error"] = "cancelled"
            raise
        except Exception as e:
            entry["error"] = "%s: %s" % (type(e).__name__, e)
            if up is not None:
                up[1].close()
            return False, None
        finally:
            entry["ms"] = round((time.monotonic() - m0) * 1000, 1)
            self.log_line(entry)


async def watch_control(path, link):
    """Polls the control file every 100 ms: `down` cuts the link, anything else (or no file)
    restores it. Each state taken is written to `<path>.state` (`down` or `up`, replaced
    whole), so a caller can wait until the link is really cut or restored."""
    state = None
    while True:
        try:
            with open(path, "rb") as f:
                down = f.read().strip() == b"down"
        except OSError:
            down = False
        if down:
            link.is_up.clear()
        else:
            link.is_up.set()
        now = b"down" if down else b"up"
        if now != state:
            tmp = "%s.state.tmp" % path
            with open(tmp, "wb") as f:
                f.write(now + b"\n")
            os.replace(tmp, path + ".state")
            state = now
        await asyncio.sleep(0.1)


def write_port_file(path, port):
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w") as f:
        f.write("%d\n" % port)
    os.rename(tmp, path)


async def serve(args):
    u = urllib.parse.urlsplit(args.upstream)
    if u.scheme != "http" or not u.hostname:
        print("linkproxy: --upstream must be http://HOST:PORT", file=sys.stderr)
        return 2
    link = Link(args.rate, args.delay_ms, args.burst_kib * 1024)
    log = open(args.log, "a", buffering=1) if args.log else None
    proxy = Proxy((u.hostname, u.port or 80), link, log)
    server = await asyncio.start_server(proxy.client, args.listen, args.port, limit=HEAD_LIMIT)
    port = server.sockets[0].getsockname()[1]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watcher = asyncio.create_task(watch_control(args.control, link)) if args.control else None
    if args.port_file:
        write_port_file(args.port_file, port)
    print("port %d" % port, flush=True)
    await stop.wait()
    server.close()
    if watcher:
        watcher.cancel()
    for t in list(proxy.tasks):
        t.cancel()
    await asyncio.gather(*proxy.tasks, return_exceptions=True)
    if log:
        log.close()
    return 0


# ------------------------------------------------------------------------------------------------
# Self-test: a local upstream (http.server in a thread), the proxy as a child process.


def self_test():
    import http.client
    import http.server
    import socket
    import subprocess
    import tempfile
    import threading

    def blob(n):
        return (bytes(range(251)) * (n // 251 + 1))[:n]

    seen = []  # (path, client port) per upstream request

    class Upstream(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def body(self):
            if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                data = b""
                while True:
                    size = int(self.rfile.readline().split(b";")[0], 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b""):
                            pass
                        return data
                    data += self.rfile.read(size)
                    self.rfile.read(2)
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def reply(self, status, data, extra=(), length=True, send_body=True):
            self.send_response(status)
            for k, v in extra:
                self.send_header(k, v)
            if length:
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if send_body:
                self.wfile.write(data)

        def do_HEAD(self):
            self.do_GET(head=True)

        def do_GET(self, head=False):
            seen.append((self.path, self.client_address[1]))
            parts = self.path.strip("/").split("/")
            kind, n = parts[0], int(parts[1]) if len(parts) > 1 else 0
            data = blob(n)
            if kind == "blob":
                r = self.headers.get("Range")
                if r:
                    a, b = r.split("=")[1].split("-")
                    part = data[int(a) : int(b) + 1]
                    extra = [("Content-Range", "bytes %s-%s/%d" % (a, b, n))]
                    return self.reply(206, part, extra, send_body=not head)
                return self.reply(200, data, send_body=not head)
            if kind == "chunked":
                self.send_response(200)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                third = n // 3
                for piece in (data[:third], data[third : 2 * third], data[2 * third :]):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                self.wfile.write(b"0\r\nX-Trailer: yes\r\n\r\n")
                return None
            if kind == "close":
                self.close_connection = True
                return self.reply(200, data, [("Connection", "close")], length=False)
            if kind == "empty":
                self.send_response(204)
                self.end_headers()
                return None
            if kind == "notmod":
                self.send_response(304)
                self.send_header("ETag", '"x"')
                self.end_headers()
                return None
            return self.reply(404, b"no such path")

        def do_PUT(self):
            seen.append((self.path, self.client_address[1]))
            data = self.body()
            self.reply(200, b"%d %s" % (len(data), data[:16]))

    class Server(http.server.ThreadingHTTPServer):
        daemon_threads = True

    upstream = Server(("127.0.0.1", 0), Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    uport = upstream.server_address[1]

    failures = []

    def check(name, ok, detail):
        print("%s %s: %s" % ("PASS" if ok else "FAIL", name, detail), flush=True)
        if not ok:
            failures.append(name)

    rate_mbit, delay_ms = 40.0, 100.0
    rate = rate_mbit * 1e6 / 8
    tmp = tempfile.mkdtemp(prefix="linkproxy-test.")
    port_file, log_file, control = (os.path.join(tmp, n) for n in ("port", "log", "control"))
    proc = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--upstream", "http://127.0.0.1:%d" % uport]
        + ["--rate", str(rate_mbit), "--delay-ms", str(delay_ms), "--port-file", port_file]
        + ["--log", log_file, "--control", control],
        stdout=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            if os.path.exists(port_file) or proc.poll() is not None:
                break
            time.sleep(0.05)
        if not os.path.exists(port_file):
            print("FAIL start: no port file (exit %s)" % proc.poll())
            return 1
        port = int(open(port_file).read())

        # Delay: time to the first byte of a small response, direct against through the proxy.
        def ttfb(p, n=3):
            c = http.client.HTTPConnection("127.0.0.1", p, timeout=10)
            best = None
            for _ in range(n):
                t = time.monotonic()
                c.request("GET", "/blob/10")
                r = c.getresponse()
                dt = time.monotonic() - t
                r.read()
                best = dt if best is None else min(best, dt)
            c.close()
            return best

        direct, proxied = ttfb(uport), ttfb(port)
        added = (proxied - direct) * 1000
        check(
            "delay",
            delay_ms * 0.95 <= added <= delay_ms + 150,
            "adds %.1f ms to the first byte (--delay-ms %g; direct %.1f ms)"
            % (added, delay_ms, direct * 1000),
        )

        # Keep-alive and framing: one client connection, every kind of message.
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        socks, errs = set(), []
        seen.clear()

        def ask(method, path, want_status, want_body, body=None, hdrs=None, chunked=False):
            c.request(method, path, body=body, headers=hdrs or {}, encode_chunked=chunked)
            socks.add(id(c.sock))
            r = c.getresponse()
            data = r.read()
            if r.status != want_status or data != want_body:
                errs.append("%s %s: %d, %d bytes" % (method, path, r.status, len(data)))

        ask("GET", "/blob/5000", 200, blob(5000))
        ask("HEAD", "/blob/5000", 200, b"")
        ask("GET", "/empty", 204, b"")
        ask("GET", "/notmod", 304, b"")
        ask("GET", "/chunked/7000", 200, blob(7000))
        ask("PUT", "/echo", 200, b"11 hello world", body=b"hello world")
        ask("PUT", "/echo", 200, b"9 abcdefghi", body=iter([b"abc", b"defg", b"hi"]), chunked=True)
        ask("GET", "/blob/100", 206, blob(100), hdrs={"Range": "bytes=0-99"})
        ask("GET", "/blob/300000", 200, blob(300000))
        c.close()
        ports = {p for _, p in seen}
        check(
            "keep-alive",
            not errs and len(socks) == 1 and len(ports) == 1 and len(seen) == 9,
            "9 requests (Content-Length, HEAD, 204, 304, chunked both ways, Range) on %d client "
            "and %d upstream connection(s)%s" % (len(socks), len(ports), "; " + "; ".join(errs) if errs else ""),
        )

        # A response delimited by the end of the connection.
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("GET", "/close/3000")
        r = c.getresponse()
        data = r.read()
        c.close()
        check("close-delimited", data == blob(3000), "%d of 3000 bytes" % len(data))

        # The log: one line per request, with the Range request's fields.
        lines = [json.loads(x) for x in open(log_file)]
        ranged = [x for x in lines if x.get("range") == "bytes=0-99"]
        want = {"method": "GET", "path": "/blob/100", "status": 206, "bytes": 100}
        ok = (
            len(lines) == 3 + 9 + 1
            and len(ranged) == 1
            and all(ranged[0].get(k) == v for k, v in want.items())
            and ranged[0]["ms"] >= delay_ms
            and all(k in ranged[0] for k in ("t", "ms"))
        )
        check("log", ok, "%d lines; the Range line: %s" % (len(lines), ranged[:1]))

        # Rate: two parallel downloads share it; total time = total bytes / rate + one delay.
        size = 3 * 1024 * 1024
        done = {}

        def fetch(i):
            cc = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            cc.request("GET", "/blob/%d" % size)
            data = cc.getresponse().read()
            done[i] = (time.monotonic(), len(data) == size and data == blob(size))
            cc.close()

        t = time.monotonic()
        threads = [threading.Thread(target=fetch, args=(i,)) for i in (0, 1)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        total = max(v[0] for v in done.values()) - t
        first = min(v[0] for v in done.values()) - t
        expect = 2 * size / rate + delay_ms / 1000
        check(
            "rate",
            all(v[1] for v in done.values()) and 0.75 * expect <= total <= 1.25 * expect
            and first >= 0.75 * expect,
            "2 x %d bytes in parallel: %.2f s (first done %.2f s), expected %.2f s at %g Mbit/s "
            "shared (%.2f x)" % (size, total, first, expect, rate_mbit, total / expect),
        )

        # Down/up: an in-flight response stops, a new one does not start; both finish after up.
        got = {}

        def raw(i, path, n):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path.encode())
            got[i] = 0
            buf = b""
            while True:
                d = s.recv(65536)
                if not d:
                    break
                buf += d
                got[i] = len(buf)
                h = buf.find(b"\r\n\r\n")
                if h >= 0 and len(buf) - h - 4 >= n:
                    break
            s.close()
            got[i, "ok"] = buf.endswith(blob(n))

        big = 4 * 1024 * 1024
        t1 = threading.Thread(target=raw, args=(1, "/blob/%d" % big, big))
        t1.start()
        time.sleep(0.3)
        with open(control, "w") as f:
            f.write("down\n")
        time.sleep(0.4)
        t2 = threading.Thread(target=raw, args=(2, "/blob/1000", 1000))
        t2.start()
        a = got.get(1, 0)
        time.sleep(0.7)
        b, new = got.get(1, 0), got.get(2, 0)
        stalled = 0 < a == b < big and new == 0
        os.unlink(control)
        t1.join(10)
        t2.join(10)
        check(
            "down/up",
            stalled and got.get((1, "ok")) is True and got.get((2, "ok")) is True,
            "in flight: %d then %d of %d bytes while down, new request: %d bytes while down; "
            "both complete after up: %s, %s" % (a, b, big, new, got.get((1, "ok")), got.get((2, "ok"))),
        )

        # SIGTERM ends it cleanly (also with an idle keep-alive connection open).
        idle = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        idle.request("GET", "/blob/10")
        idle.getresponse().read()
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(5)
        except subprocess.TimeoutExpired:
            rc = None
        idle.close()
        check("sigterm", rc == 0, "exit status %s" % rc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        upstream.shutdown()
        for n in os.listdir(tmp):
            os.unlink(os.path.join(tmp, n))
        os.rmdir(tmp)
    print("self-test: %s" % ("ok" if not failures else "FAILED: " + ", ".join(failures)))
    return 1 if failures else 0


def main():
    p = argparse.ArgumentParser(
        description="HTTP/1.1 reverse proxy modelling a network link (see the module docstring)"
    )
    p.add_argument("--upstream", help="http://HOST:PORT of the server to forward to")
    p.add_argument("--listen", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="port to listen on (0: any free one)")
    p.add_argument("--port-file", help="write the chosen port to this file")
    p.add_argument("--rate", type=float, default=0, help="Mbit/s shared by all connections (0: unlimited)")
    p.add_argument("--delay-ms", type=float, default=0, help="added to each response's first byte")
    p.add_argument("--burst-kib", type=int, default=64, help="token bucket size in KiB (64)")
    p.add_argument("--log", help="append one JSON line per request to this file")
    p.add_argument("--control", help="file polled every 100 ms: 'down' stalls the link")
    p.add_argument("--self-test", action="store_true", help="check the proxy and exit 0/1")
    args = p.parse_args()
    if args.self_test:
        return self_test()
    if not args.upstream:
        p.error("--upstream is required")
    if args.rate < 0 or args.delay_ms < 0 or args.burst_kib < 1:
        p.error("--rate and --delay-ms must be >= 0, --burst-kib >= 1")
    return asyncio.run(serve(args))


if __name__ == "__main__":
    sys.exit(main())
