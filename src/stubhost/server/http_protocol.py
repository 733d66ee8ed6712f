"""A lean HTTP/1.1 server protocol on httptools that runs an ASGI application.

uvicorn's ``Server`` still owns the listening socket, the connection set and graceful shutdown;
this class replaces its per-connection protocol (``uvicorn.Config(http=HttpProtocol)``). Against
uvicorn's own httptools protocol it drops what a KServe front end never uses (websocket upgrades,
access logs, the header-injection scan of headers the application built itself, a keep-alive
timer re-armed per request, an ``asyncio.Event`` per request) and sends a response's head with
its first body chunk, so a small reply is one socket write. Measured on the fixed-answer ceiling
(2 cores, perf_analyzer, add_sub): ~1.5x the requests per second of uvicorn's protocol.

What it keeps of HTTP/1.1: keep-alive and ``Connection: close`` (HTTP/1.0 closes unless asked
not to), pipelined requests answered in order, chunked request bodies, ``Expect: 100-continue``,
a chunked response when the application gives no Content-Length, HEAD, read back-pressure on
large bodies and write back-pressure on slow readers, ``http.disconnect`` when the client goes
away, 400 for a request httptools cannot parse, 500 for an application that fails before it
answered, an idle keep-alive timeout, and uvicorn's graceful shutdown.
"""

from __future__ import annotations

import asyncio
import collections
import http
import logging
import urllib.parse
from typing import Any

import httptools

from stubhost.host.doorbell import AnswerSpin

_log = logging.getLogger("stubhost.http")

BODY_HIGH_WATER = 1 << 20  # request-body bytes buffered before reading from the socket pauses
NEXT_REQUEST_SPIN_S = 300e-6  # how long the loop stays awake after a response for the client's next request
PIPELINE_DEPTH = 8  # pipelined requests parsed ahead of the one being answered before reading pauses
_ASGI = {"version": "3.0", "spec_version": "2.3"}
_DISCONNECT = {"type": "http.disconnect"}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_STATUS_LINES = {s.value: b"HTTP/1.1 %d %s\r\n" % (s.value, s.phrase.encode()) for s in http.HTTPStatus}


def _status_line(status: int) -> bytes:
    return _STATUS_LINES.get(status) or b"HTTP/1.1 %d \r\n" % status


def _closing_reply(status: int, text: bytes) -> bytes:
    """A whole plain-text response after which the server closes the connection."""
    return (_status_line(status) + b"content-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n%s" % (len(text), text))


class _Exchange:
    """One request on a connection and the ASGI ``receive``/``send`` of its response."""

    __slots__ = ("conn", "scope", "chunks", "buffered", "complete", "delivered", "waiter", "expect_continue",
                 "keep_alive", "head", "head_only", "chunked", "remaining", "finished")

    def __init__(self, conn: HttpProtocol, scope: dict[str, Any], keep_alive: bool, expect_continue: bool) -> None:
        self.conn = conn
        self.scope = scope
        self.chunks: list[bytes] = []
        self.buffered = 0
        self.complete = False  # the whole body was parsed
        self.delivered = False  # ... and handed to the application
        self.waiter: asyncio.Future[None] | None = None
        self.expect_continue = expect_continue
        self.keep_alive = keep_alive
        self.head: bytes | None = None  # the status line and headers, sent with the first body chunk
        self.head_only = scope["method"] == "HEAD"  # its answer has no body
        self.chunked = False
        self.remaining: int | None = None  # body bytes the response still owes its Content-Length
        self.finished = False

    def wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def _wait(self) -> None:
        self.waiter = self.conn.loop.create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None

    async def receive(self) -> dict[str, Any]:
        conn = self.conn
        if self.delivered:  # the body is in: what is left to hear of is the client going away
            while not (conn.closed or self.finished):
                await self._wait()
            return _DISCONNECT
        while not self.chunks and not self.complete:
            if conn.closed:
                return _DISCONNECT
            if self.expect_continue:
                self.expect_continue = False
                conn.transport.write(_CONTINUE)
            conn.resume_reading()
            await self._wait()
        chunks, self.chunks, self.buffered = self.chunks, [], 0
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self.delivered = self.complete
        if conn.reading_paused and conn.incoming is self:
            conn.resume_reading()
        return {"type": "http.request", "body": body, "more_body": not self.complete}

    async def send(self, message: dict[str, Any]) -> None:
        conn = self.conn
        if conn.write_paused and not conn.closed:
            await conn.drain()
        if conn.closed:
            return
        kind = message["type"]
        if self.head is None:
            if kind != "http.response.start":
                raise RuntimeError(f"expected ASGI message 'http.response.start', got '{kind}'")
            self._start(message)
            return
        if kind != "http.response.body" or self.finished:
            raise RuntimeError(f"unexpected ASGI message '{kind}' for this response")
        body = message.get("body", b"")
        more = message.get("more_body", False)
        out: list[Any] = []
        if self.head:
            out.append(self.head)
            self.head = b""  # sent
        if self.head_only:
            body = b""
        if self.chunked:
            if body:
                out += [b"%x\r\n" % len(body), body, b"\r\n"]
            if not more:
                out.append(b"0\r\n\r\n")
        elif body:
            if self.remaining is not None:
                self.remaining -= len(body)
            out.append(body)
        if len(out) == 1:
            conn.transport.write(out[0])
        elif out:
            conn.transport.writelines(out)
        if not more:
            self.finished = True
            if self.remaining:  # a body shorter or longer than its Content-Length: the framing is lost
                self.keep_alive = False
            conn.response_done(self)

    @property
    def head_sent(self) -> bool:
        return self.head == b""

    def _start(self, message: dict[str, Any]) -> None:
        status = message["status"]
        head_only = self.head_only
        lines = [_status_line(status)]
        for name, value in message.get("headers", ()):
            lower = name.lower()
            if lower == b"content-length":
                self.remaining = None if head_only else int(value)
            elif lower == b"connection" and b"close" in value.lower():
                self.keep_alive = False
                continue  # written once below
            lines += [name, b": ", value, b"\r\n"]
        if self.remaining is None and not head_only and status not in (204, 304):
            self.chunked = True
            lines.append(b"transfer-encoding: chunked\r\n")
        if not self.keep_alive or self.conn.stopping:
            self.keep_alive = False
            lines.append(b"connection: close\r\n")
        lines.append(b"\r\n")
        self.head = b"".join(lines)


class HttpProtocol(asyncio.Protocol):
    """One client connection: parses requests with httptools and runs each in the ASGI app.
    Constructed by uvicorn's ``Server`` (its ``Config.http``)."""

    def __init__(self, config: Any, server_state: Any, app_state: Any = None,
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.app = config.loaded_app
        self.loop = _loop or asyncio.get_event_loop()
        self.state = server_state
        self.keep_alive_s = float(config.timeout_keep_alive)
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.server: tuple[str, int] | None = None
        self.client: tuple[str, int] | None = None
        self.pending: collections.deque[_Exchange] = collections.deque()  # [0] is being answered
        self.incoming: _Exchange | None = None  # the request being parsed
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.expect_continue = False
        self.closed = False
        self.stopping = False
        self.broken = False  # the parser failed: nothing more is read from this connection
        self.reading_paused = False
        self.write_paused = False
        self.drained: asyncio.Future[None] | None = None
        self.last_active = 0.0
        self.idle_timer: asyncio.TimerHandle | None = None
        self.next_spin = AnswerSpin(NEXT_REQUEST_SPIN_S)  # keeps the loop awake for this client's next request

    # ---- connection ------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.state.connections.add(self)
        self.server = _address(transport.get_extra_info("sockname"))
        self.client = _address(transport.get_extra_info("peername"))
        self.last_active = self.loop.time()
        self.idle_timer = self.loop.call_later(self.keep_alive_s, self._check_idle)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.state.connections.discard(self)
        if self.idle_timer is not None:
            self.idle_timer.cancel()
        for exchange in self.pending:
            exchange.wake()
        if self.incoming is not None:
            self.incoming.wake()
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self.broken:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._stop_parsing()  # no protocol switch: the request is answered, then the connection closes
        except httptools.HttpParserError as e:
            _log.debug("unparsable HTTP request: %s", e)
            self._stop_parsing(bad_request=True)

    def _stop_parsing(self, bad_request: bool = False) -> None:
        self.broken = True
        incoming, self.incoming = self.incoming, None
        running = self.pending[0] if self.pending else None
        # the body of the request being answered breaks off: its application must hear a disconnect
        # (the connection closes below), never the end of a body cut short
        cut = bad_request and incoming is not None and incoming is running
        if incoming is not None and not bad_request:
            incoming.complete = True
            incoming.wake()
        elif incoming is not None and not cut and incoming in self.pending:  # (not if answered before its body)
            self.pending.remove(incoming)  # a half-parsed pipelined request is dropped
        for exchange in self.pending:
            exchange.keep_alive = False
        if not self.pending or cut:
            if bad_request and (running is None or running.head is None):  # nothing of an answer sent yet
                self.transport.write(_closing_reply(400, b"Invalid HTTP request received."))
            self.transport.close()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)

    async def drain(self) -> None:
        """Waits until the transport's write buffer is below its low-water mark (or it closed)."""
        while self.write_paused and not self.closed:
            self.drained = self.loop.create_future()
            await self.drained

    def pause_reading(self) -> None:
        if not self.reading_paused and not self.closed:
            self.reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.reading_paused and not self.closed:
            self.reading_paused = False
            self.transport.resume_reading()

    def shutdown(self) -> None:
        """uvicorn's graceful shutdown: an idle connection closes now, a busy one after its answer."""
        self.stopping = True
        if not self.pending:
            self.transport.close()
        else:
            self.pending[0].keep_alive = False

    def _check_idle(self) -> None:
        self.idle_timer = None
        if self.closed:
            return
        idle_for = self.loop.time() - self.last_active
        if self.pending:  # busy: idle time starts when its answer is sent
            idle_for = 0.0
        elif idle_for >= self.keep_alive_s:
            self.transport.close()
            return
        self.idle_timer = self.loop.call_later(self.keep_alive_s - idle_for, self._check_idle)

    # ---- httptools callbacks -----------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = []
        self.expect_continue = False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_continue = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        parser = self.parser
        url = httptools.parse_url(self.url)
        path = url.path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        scope = {"type": "http", "asgi": _ASGI, "http_version": parser.get_http_version(),
                 "method": parser.get_method().decode("ascii"), "scheme": "http", "path": path,
                 "raw_path": url.path, "query_string": url.query or b"", "root_path": "", "headers": self.headers,
                 "server": self.server, "client": self.client}
        exchange = _Exchange(self, scope, parser.should_keep_alive() and not self.stopping, self.expect_continue)
        self.incoming = exchange
        self.pending.append(exchange)
        if len(self.pending) == 1:
            self._run(exchange)
        elif len(self.pending) > PIPELINE_DEPTH:
            self.pause_reading()

    def on_body(self, body: bytes) -> None:
        exchange = self.incoming
        if exchange is None or exchange.finished:
            return  # answered already (e.g. refused as too large): the rest of its body is dropped
        exchange.chunks.append(body)
        exchange.buffered += len(body)
        if exchange.buffered > BODY_HIGH_WATER:
            self.pause_reading()
        exchange.wake()

    def on_message_complete(self) -> None:
        exchange, self.incoming = self.incoming, None
        if exchange is not None:
            exchange.complete = True
            exchange.wake()

    # ---- running requests --------------------------------------------------------------------------
    def _run(self, exchange: _Exchange) -> None:
        task = self.loop.create_task(self._serve(exchange))
        self.state.tasks.add(task)
        task.add_done_callback(self.state.tasks.discard)

    async def _serve(self, exchange: _Exchange) -> None:
        try:
            await self.app(exchange.scope, exchange.receive, exchange.send)
        except BaseException as e:
            if not isinstance(e, asyncio.CancelledError):
                _log.error("the HTTP application failed on %s %s", exchange.scope["method"], exchange.scope["path"],
                           exc_info=True)
            self._fail(exchange)
            if not isinstance(e, Exception):
                raise
        else:
            if not exchange.finished and not self.closed:  # (a client gone mid-answer is no app error)
                _log.error("the HTTP application returned without completing its response to %s %s",
                           exchange.scope["method"], exchange.scope["path"])
                self._fail(exchange)

    def _fail(self, exchange: _Exchange) -> None:
        """A 500 when nothing was sent yet; otherwise the connection is cut (the reply is partial)."""
        if exchange.finished or self.closed:
            return
        if not exchange.head_sent:
            self.transport.write(_closing_reply(500, b"Internal Server Error"))
        exchange.finished = True
        exchange.keep_alive = False
        self.response_done(exchange)

    def response_done(self, exchange: _Exchange) -> None:
        """The response to ``exchange`` (the oldest pending request) is complete: close the
        connection, or start the next pipelined request."""
        if self.pending and self.pending[0] is exchange:
            self.pending.popleft()
        self.state.total_requests += 1
        exchange.wake()  # a receive() waiting for a disconnect returns now
        self.last_active = self.loop.time()
        if not exchange.keep_alive or self.stopping:
            self.transport.close()
            return
        self.resume_reading()  # paused for a full pipeline, or for a body nobody reads any more
        if self.pending:
            self._run(self.pending[0])
        elif len(self.state.tasks) <= 1 and self.next_spin.armed():
            # Nothing else to run (the one task is this response's): a client that sends its next
            # request at once (a closed loop, as perf_analyzer's) finds the loop awake, where a
            # loop that slept in epoll costs a wake-up and cold caches. A busy loop does not spin.
            task = self.loop.create_task(self.next_spin.until(self._next_request_came))
            self.state.tasks.add(task)  # held, as the loop keeps only a weak reference
            task.add_done_callback(self.state.tasks.discard)

    def _next_request_came(self) -> bool:
        return bool(self.pending) or self.closed


def _address(address: Any) -> tuple[str, int] | None:
    return (str(address[0]), int(address[1])) if isinstance(address, tuple) and len(address) >= 2 else None
