"""HttpProtocol (stubhost.server.http_protocol) driven through real TCP sockets.

Each test starts uvicorn's ``Server`` with ``http=HttpProtocol`` in a thread of its own, once on
uvloop and once on asyncio's loop, on a pre-bound socket on 127.0.0.1, serving ``App`` below, and
talks to it as a client would: hand-made requests on raw sockets, one response read at a time.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import pytest
import uvicorn
import uvloop

from stubhost.host.doorbell import SPIN_BACKOFF
from stubhost.server.http_protocol import BODY_HIGH_WATER, HttpProtocol


class App:
    """The ASGI application under test; it routes by path and records what it saw."""

    def __init__(self) -> None:
        self.receive_calls: list[int] = []  # receive() calls each whole request body took
        self.largest_chunk = 0  # the largest body chunk one receive() returned
        self.started = threading.Event()  # /sleep or /wait-disconnect is running
        self.disconnected = threading.Event()  # a receive() returned http.disconnect

    async def _read_body(self, receive: Callable[[], Any], delay: float = 0.0) -> bytes | None:
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.disconnected.set()
                return None
            chunks.append(message["body"])
            self.largest_chunk = max(self.largest_chunk, len(message["body"]))
            if not message["more_body"]:
                self.receive_calls.append(len(chunks))
                return b"".join(chunks)
            await asyncio.sleep(delay)  # a slow reader: the server must stop reading the socket

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Any], send: Callable[[Any], Any]) -> None:
        path, query = scope["path"], dict(urllib.parse.parse_qsl(scope["query_string"].decode()))
        start = {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]}
        if path == "/echo":
            body = await self._read_body(receive, float(query.get("delay", 0)))
            if body is not None:
                await send({**start, "headers": [(b"content-length", b"%d" % len(body))]})
                await send({"type": "http.response.body", "body": body})
        elif path == "/sleep":  # answers without reading the request body
            self.started.set()
            await asyncio.sleep(int(query["ms"]) / 1000)
            await send({**start, "headers": [(b"content-length", b"%d" % len(query["ms"]))]})
            await send({"type": "http.response.body", "body": query["ms"].encode()})
        elif path == "/stream":  # no Content-Length
            await send(start)
            await send({"type": "http.response.body", "body": b"hello ", "more_body": True})
            await send({"type": "http.response.body", "body": b"world"})
        elif path == "/fail":
            raise RuntimeError("failed before answering")
        elif path == "/fail-late":
            await send(start)
            await send({"type": "http.response.body", "body": b"partial", "more_body": True})
            raise RuntimeError("failed while answering")
        elif path == "/wait-disconnect":
            await self._read_body(receive)
            self.started.set()
            await self._read_body(receive)  # this time only http.disconnect is right
        elif path == "/short":  # 5 of the 10 bytes it declares
            await send({**start, "headers": [(b"content-length", b"10")]})
            await send({"type": "http.response.body", "body": b"12345"})


class Response(NamedTuple):
    status: int
    headers: dict[str, str]  # names lower-cased
    body: bytes


class Client:
    """One client connection with a read buffer: sends raw bytes, reads HTTP/1.1 responses."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.buf = bytearray()
        self.send = self.sock.sendall

    def _fill(self) -> None:
        data = self.sock.recv(1 << 16)
        if not data:
            raise EOFError("the server closed the connection")
        self.buf += data

    def readline(self) -> bytes:
        while (end := self.buf.find(b"\r\n")) < 0:
            self._fill()
        return self.read(end + 2)[:-2]

    def read(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data

    def head(self) -> tuple[int, dict[str, str]]:
        version, status, *_ = self.readline().split(b" ", 2)
        assert version == b"HTTP/1.1", version
        headers: dict[str, str] = {}
        while line := self.readline():
            name, value = line.split(b":", 1)
            assert name.lower().decode() not in headers, f"repeated header {name!r}"
            headers[name.lower().decode()] = value.strip().decode()
        return int(status), headers

    def response(self) -> Response:
        """Reads one response, its body framed by Content-Length or chunked encoding."""
        status, headers = self.head()
        if headers.get("transfer-encoding") == "chunked":
            assert "content-length" not in headers
            chunks = []
            while size := int(self.readline().split(b";")[0], 16):
                chunks.append(self.read(size))
                assert self.readline() == b""
            assert self.readline() == b""  # no trailers
            return Response(status, headers, b"".join(chunks))
        return Response(status, headers, self.read(int(headers["content-length"])))

    def closed_by_server(self, timeout: float = 2.0) -> bool:
        """True when the server closes the connection within ``timeout`` having sent nothing more."""
        self.sock.settimeout(timeout)
        try:
            return not self.buf and self.sock.recv(1) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False


class Running:
    """uvicorn's Server with HttpProtocol, serving an App in a thread with its own event loop."""

    def __init__(self, loop: str, keep_alive: float) -> None:
        self.app = App()
        self.clients: list[Client] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        config = uvicorn.Config(self.app, http=HttpProtocol, loop="none", lifespan="off", access_log=False,
                                log_config=None, timeout_keep_alive=keep_alive,  # type: ignore[arg-type]
                                timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)
        run = uvloop.run if loop == "uvloop" else asyncio.run
        self.thread = threading.Thread(target=lambda: run(self.server.serve(sockets=[self.sock])), name="http-server")
        self.thread.start()
        wait_for(lambda: self.server.started or not self.thread.is_alive())
        assert self.server.started, "the server did not start"

    def connect(self) -> Client:
        self.clients.append(Client(self.port))
        return self.clients[-1]

    def stop(self) -> None:
        for client in self.clients:
            client.sock.close()
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()
        assert not self.thread.is_alive(), "the server thread did not stop"


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.005)
    return predicate()


def get(path: str, extra: bytes = b"") -> bytes:
    return b"GET %s HTTP/1.1\r\nHost: test\r\n%s\r\n" % (path.encode(), extra)


def post(path: str, body: bytes) -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: test\r\nContent-Length: %d\r\n\r\n%s" % (path.encode(), len(body), body)


def chunked_post(path: str, chunks: bytes) -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n%s" % (path.encode(), chunks)


@pytest.fixture(params=["uvloop", "asyncio"])
def serve(request: pytest.FixtureRequest) -> Iterator[Callable[..., Running]]:
    """Starts servers (``serve(keep_alive=...)``), closes their clients, stops them and joins their threads."""
    running: list[Running] = []

    def start(keep_alive: float = 5.0) -> Running:
        running.append(Running(request.param, keep_alive))
        return running[-1]

    yield start
    for r in running:
        r.stop()


@pytest.fixture
def server(serve: Callable[..., Running]) -> Running:
    return serve()


def test_keep_alive_answers_two_requests_on_one_connection(server: Running) -> None:
    """Two requests in turn on one connection are both answered on it."""
    client = server.connect()
    for body in (b"first", b"second"):
        client.send(post("/echo", body))
        response = client.response()
        assert (response.status, response.body) == (200, body)
        assert "connection" not in response.headers


def test_pipelined_requests_are_answered_in_order(server: Running) -> None:
    """Three requests written at once come back in request order, the slowest first."""
    client = server.connect()
    client.send(get("/sleep?ms=60") + get("/sleep?ms=30") + get("/sleep?ms=0"))
    assert [client.response().body for _ in range(3)] == [b"60", b"30", b"0"]
    client.send(post("/echo", b"after"))
    assert client.response().body == b"after"


def test_chunked_request_body_reaches_the_app_whole(server: Running) -> None:
    """A request body sent with Transfer-Encoding: chunked arrives joined, without its framing."""
    client = server.connect()
    client.send(chunked_post("/echo", b"5\r\nhello\r\n1\r\n \r\n"))
    client.send(b"5;ext=1\r\nworld\r\n0\r\n\r\n")
    assert client.response().body == b"hello world"


def test_expect_100_continue(server: Running) -> None:
    """With Expect: 100-continue, the server asks for the body before the client sends it."""
    client = server.connect()
    client.send(b"POST /echo HTTP/1.1\r\nHost: test\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
    assert client.read(25) == b"HTTP/1.1 100 Continue\r\n\r\n"
    client.send(b"hello")
    assert client.response()[::2] == (200, b"hello")


@pytest.mark.parametrize("request_bytes", [get("/sleep?ms=0", b"Connection: close\r\n"),
                                           b"GET /sleep?ms=0 HTTP/1.0\r\nHost: test\r\n\r\n"],
                         ids=["connection-close", "http-1.0"])
def test_connection_close_and_http_1_0_close_after_the_response(server: Running, request_bytes: bytes) -> None:
    """``Connection: close``, or HTTP/1.0 without keep-alive: answered with connection: close, then closed."""
    client = server.connect()
    client.send(request_bytes)
    response = client.response()
    assert (response.status, response.body, response.headers["connection"]) == (200, b"0", "close")
    assert client.closed_by_server()


def test_malformed_request_line_gets_400_and_close(server: Running) -> None:
    """A request httptools cannot parse is answered 400 and the connection closes."""
    client = server.connect()
    client.send(b"NOT A REQUEST\r\n\r\n")
    response = client.response()
    assert (response.status, response.headers["connection"]) == (400, "close")
    assert client.closed_by_server()


def test_malformed_chunked_body_is_no_complete_request(server: Running) -> None:
    """A chunked body that breaks off into garbage: a 400, and the app hears a disconnect, not a body's end."""
    client = server.connect()
    client.send(chunked_post("/echo", b"5\r\nhello\r\nZZZ\r\n\r\n"))
    response = client.response()
    assert (response.status, response.headers["connection"]) == (400, "close")
    assert client.closed_by_server()
    assert server.app.disconnected.wait(2)
    assert server.app.receive_calls == []


def test_malformed_body_after_an_early_answer(server: Running, caplog: pytest.LogCaptureFixture) -> None:
    """The rest of a body the app answered without reading is malformed: a 400, and no error in the server."""
    client = server.connect()
    client.send(chunked_post("/sleep?ms=0", b"5\r\nhello\r\n"))
    assert client.response()[::2] == (200, b"0")
    client.send(b"ZZZ\r\n\r\n")
    assert client.response().status == 400
    assert client.closed_by_server()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_response_without_content_length_is_chunked(server: Running) -> None:
    """A response with no Content-Length goes out chunked, and the connection stays usable."""
    client = server.connect()
    client.send(get("/stream"))
    response = client.response()
    assert (response.headers["transfer-encoding"], response.body) == ("chunked", b"hello world")
    client.send(post("/echo", b"next"))
    assert client.response().body == b"next"


def test_head_sends_headers_without_the_body(server: Running) -> None:
    """HEAD: the app's body is dropped but its Content-Length kept; the next request still parses."""
    client = server.connect()
    # the request carries a body only so that /echo answers with a non-empty one
    client.send(b"HEAD /echo HTTP/1.1\r\nHost: test\r\nContent-Length: 5\r\n\r\nhello")
    status, headers = client.head()
    assert (status, headers["content-length"]) == (200, "5")
    assert "transfer-encoding" not in headers
    client.send(post("/echo", b"after head"))
    # had "hello" been sent, it would be read here as the status line
    assert client.response()[::2] == (200, b"after head")


def test_app_failing_before_answering_gets_500_and_close(server: Running, caplog: pytest.LogCaptureFixture) -> None:
    """An app that raises before answering: a logged failure, a 500, then the connection closes
    (the pipelined request behind it is not answered)."""
    client = server.connect()
    client.send(get("/fail") + get("/sleep?ms=0"))
    response = client.response()
    assert (response.status, response.headers["connection"]) == (500, "close")
    assert client.closed_by_server()
    assert "the HTTP application failed on GET /fail" in caplog.messages


def test_app_failing_mid_response_cuts_the_connection(server: Running) -> None:
    """An app that raises after its first body chunk: the client sees EOF before the chunked body ends."""
    client = server.connect()
    client.send(get("/fail-late"))
    status, headers = client.head()
    assert (status, headers["transfer-encoding"]) == (200, "chunked")
    assert client.readline() == b"7" and client.read(9) == b"partial\r\n"
    assert client.closed_by_server()


def test_client_disconnect_reaches_the_app(server: Running, caplog: pytest.LogCaptureFixture) -> None:
    """A client gone after its request: the app's next receive() is http.disconnect (and no answer is no error)."""
    client = server.connect()
    client.send(post("/wait-disconnect", b"body"))
    assert server.app.started.wait(5)
    assert not server.app.disconnected.wait(0.1)  # it waits while the client is there
    client.sock.close()
    assert server.app.disconnected.wait(2)
    assert wait_for(lambda: not server.server.server_state.tasks)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_idle_keep_alive_timeout(serve: Callable[..., Running]) -> None:
    """An idle connection closes after timeout_keep_alive; one with a request in flight is not cut."""
    server = serve(keep_alive=0.3)
    idle, busy = server.connect(), server.connect()
    idle.send(get("/sleep?ms=0"))
    assert idle.response().status == 200
    idle_since = time.monotonic()
    busy.send(get("/sleep?ms=700"))
    assert idle.closed_by_server(timeout=2)
    assert 0.2 <= time.monotonic() - idle_since < 1.0
    assert busy.response()[::2] == (200, b"700")


def test_large_body_arrives_intact_with_back_pressure(server: Running) -> None:
    """A 5 MiB body reaches a slow reader intact, in several receive() chunks none far above BODY_HIGH_WATER."""
    payload = os.urandom(5 << 20)
    client = server.connect()
    client.send(post("/echo?delay=0.02", payload))
    body = client.response().body
    assert (len(body), hashlib.sha256(body).digest()) == (len(payload), hashlib.sha256(payload).digest())
    assert server.app.receive_calls[-1] > 1
    assert server.app.largest_chunk <= 2 * BODY_HIGH_WATER  # reading paused once the buffer was full


def test_body_shorter_than_content_length_closes_the_connection(server: Running) -> None:
    """A response shorter than its Content-Length leaves the framing lost: the server closes."""
    client = server.connect()
    client.send(get("/short"))
    status, headers = client.head()
    assert (status, headers["content-length"]) == (200, "10")
    assert client.read(5) == b"12345"
    assert client.closed_by_server()


def test_graceful_shutdown_completes_the_request_in_flight(server: Running) -> None:
    """should_exit with a request in flight: its answer is sent in full, then the connection closes."""
    client = server.connect()
    client.send(get("/sleep?ms=300"))
    assert server.app.started.wait(5)
    server.server.should_exit = True
    response = client.response()
    assert (response.status, response.body, response.headers["connection"]) == (200, b"300", "close")
    assert client.closed_by_server()
    server.thread.join(5)  # the listening socket closes with it
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", server.port), timeout=1).close()


def _connection(server: Running, client: Client) -> HttpProtocol:
    """The server's protocol object of `client`'s connection."""
    port = client.sock.getsockname()[1]
    return next(c for c in list(server.server.server_state.connections) if c.client and c.client[1] == port)


def test_an_idle_server_stays_awake_a_moment_for_the_clients_next_request(server: Running) -> None:
    """After a response with nothing else to run, the loop spins for the client's next request;
    when none comes within NEXT_REQUEST_SPIN_S, the connection backs off from spinning."""
    client = server.connect()
    client.send(post("/echo", b"x"))
    assert client.response().body == b"x"
    conn = _connection(server, client)
    assert wait_for(lambda: conn.next_spin.skip == SPIN_BACKOFF), "no spin ran after the response"
    client.send(post("/echo", b"y"))  # still answered after a spin in vain
    assert client.response().body == b"y"


def test_a_busy_server_does_not_spin_after_a_response(server: Running) -> None:
    """With another request running, the loop has work: a response starts no spin."""
    busy = server.connect()
    busy.send(get("/sleep?ms=1500"))
    assert wait_for(server.app.started.is_set)
    client = server.connect()
    client.send(post("/echo", b"x"))
    assert client.response().body == b"x"
    conn = _connection(server, client)
    time.sleep(0.05)  # far longer than a spin: one that ran in vain would have set the backoff
    assert conn.next_spin.skip == 0
    assert busy.response().body == b"1500"
