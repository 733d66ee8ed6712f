"""The KServe v2 HTTP/REST front end: a plain ASGI application over :class:`InferenceService`.

Routes are Triton's (``/v2/...``, including the repository, statistics, shared-memory, trace and
logging extensions). Errors answer ``{"error": "<message>"}`` with the status Triton gives the error's
code (400 for invalid arguments, 404 not found, 500 internal, 503 unavailable, 501 unsupported).

The app is plain ASGI rather than a framework: routing is one split of the path, and the infer
body is handed to the codec as one buffer, so the request path adds no copies of its own.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import functools
import zlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

import orjson

from stubhost.host.errors import InferenceError
from stubhost.host.repository import FILE_PARAMETER_PREFIX
from stubhost.host.trace import RequestTrace
from stubhost.server import generate, http_codec, http_response
from stubhost.server.header_forward import HeaderForward
from stubhost.server.restricted import Restrictions
from stubhost.server.service import InferenceService

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

HEADER_LENGTH = b"inference-header-content-length"
DEFAULT_MAX_BODY = 1 << 31  # bytes; a larger request is refused before it is read

# Triton's HTTP status for each error code.
STATUS_OF_CODE = {"INVALID_ARG": 400, "UNKNOWN": 400, "ALREADY_EXISTS": 400, "CANCELLED": 400,
                  "NOT_FOUND": 404, "INTERNAL": 500, "UNAVAILABLE": 503, "UNSUPPORTED": 501}

_JSON = [(b"content-type", b"application/json")]


class HttpError(Exception):
    """An HTTP-level failure (bad method, unknown path, oversized body)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _json_body(body: bytes) -> Any:
    if not body:
        return {}
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise InferenceError("INVALID_ARG", f"failed to parse the request JSON buffer: {e}") from None


def _decompress(body: bytes, encoding: str, limit: int) -> bytes:
    """Undoes a request's Content-Encoding (gzip or deflate, as tritonclient may send); the
    expanded body is held to the same limit as a plain one (no decompression bombs)."""
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise HttpError(415, f"unsupported content encoding '{encoding}'")
    inflater = zlib.decompressobj(wbits=31 if encoding == "gzip" else 15)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as e:
        raise InferenceError("INVALID_ARG", f"failed to decompress the request body: {e}") from None
    if len(out) > limit:
        raise HttpError(413, f"decompressed request body is larger than the limit of {limit} bytes")
    if not inflater.eof:
        raise InferenceError("INVALID_ARG", "failed to decompress the request body: it is truncated")
    return out


@functools.lru_cache(maxsize=64)  # clients send few distinct values; parsing one costs up to 0.7 µs
def _compressor(accept: str) -> str:
    """The response encoding to use for an Accept-Encoding header (Triton: gzip or deflate)."""
    offered = {part.split(";")[0].strip() for part in accept.split(",")} if accept else set()
    for encoding in ("gzip", "deflate"):
        if encoding in offered:
            return encoding
    return ""


def _compress(chunks: list[bytes | memoryview], encoding: str) -> bytes:
    compressor = zlib.compressobj(wbits=31 if encoding == "gzip" else 15)
    out = [compressor.compress(c) for c in chunks]
    out.append(compressor.flush())
    return b"".join(out)


class HttpFrontend:
    """The ASGI application. ``max_body`` bounds a request body in bytes; ``restrictions`` are
    the ``--http-restricted-api`` groups (403 without the header)."""

    def __init__(self, service: InferenceService, *, max_body: int = DEFAULT_MAX_BODY,
                 restrictions: Restrictions | None = None, header_forward: HeaderForward | None = None) -> None:
        self.service = service
        self.max_body = max_body
        self.restrictions = restrictions or Restrictions()
        self.header_forward = header_forward  # --http-header-forward-pattern

    def _guard(self, scope: Scope, category: str) -> None:
        if not self.restrictions:
            return
        refusal = self.restrictions.refusal(category, lambda h: self._header(scope, h.encode("latin-1")) or None,
                                            grpc=False)
        if refusal is not None:
            raise HttpError(403, refusal)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        try:
            await self._dispatch(scope, receive, send)
        except InferenceError as e:
            await self._reply(send, STATUS_OF_CODE.get(e.code, 400), http_response.encode_error(e.message))
        except HttpError as e:
            await self._reply(send, e.status, http_response.encode_error(e.message))

    @staticmethod
    async def _lifespan(receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    @staticmethod
    async def _reply(send: Send, status: int, body: bytes = b"", headers: list[tuple[bytes, bytes]] | None = None,
                     more: list[bytes | memoryview] | None = None) -> None:
        """Sends a whole response; Content-Length is always set (a chunked reply costs the
        client an extra read)."""
        length = len(body) + (sum(map(len, more)) if more else 0)
        headers = [*(_JSON if headers is None else headers), (b"content-length", str(length).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        if not more:
            await send({"type": "http.response.body", "body": body})
            return
        await send({"type": "http.response.body", "body": body, "more_body": True})
        for i, chunk in enumerate(more):
            await send({"type": "http.response.body", "body": chunk, "more_body": i + 1 < len(more)})

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise HttpError(400, "the client disconnected before sending the whole request")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                raise HttpError(413, f"request body is larger than the limit of {self.max_body} bytes")
            parts.append(chunk)
            if not message.get("more_body", False):
                break
        return parts[0] if len(parts) == 1 else b"".join(parts)

    @staticmethod
    def _header(scope: Scope, name: bytes) -> str:
        for key, value in scope["headers"]:
            if key == name:
                return value.decode("latin-1")
        return ""

    async def _dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = scope["method"]
        parts = scope["path"].strip("/").split("/")
        if not parts or parts[0] != "v2":
            raise HttpError(404, "Not Found")
        rest = parts[1:]
        service = self.service
        if not rest:
            self._method(method, "GET")
            self._guard(scope, "metadata")
            await self._reply(send, 200, orjson.dumps(service.metadata()))
            return
        head = rest[0]
        if head == "health" and len(rest) == 2 and rest[1] in ("live", "ready"):
            self._method(method, "GET")
            self._guard(scope, "health")
            ok = service.live() if rest[1] == "live" else service.ready()
            await self._reply(send, 200 if ok else 400, headers=[])
            return
        if head == "models":
            await self._models(scope, receive, send, method, rest[1:])
            return
        if head == "repository":
            self._guard(scope, "model-repository")
            await self._repository(scope, receive, send, method, rest[1:])
            return
        if head in ("systemsharedmemory", "cudasharedmemory"):
            self._guard(scope, "shared-memory")
            await self._shared_memory(scope, receive, send, method, head == "cudasharedmemory", rest[1:])
            return
        if rest == ["logging"]:
            self._guard(scope, "logging")
            await self._logging(scope, receive, send, method)
            return
        if rest == ["trace", "setting"]:
            self._guard(scope, "trace")
            await self._trace_setting(scope, receive, send, method, "")
            return
        raise HttpError(404, "Not Found")

    @staticmethod
    def _method(method: str, expected: str) -> None:
        if method != expected:
            raise HttpError(405, "Method Not Allowed")

    async def _models(self, scope: Scope, receive: Receive, send: Send, method: str, rest: list[str]) -> None:
        service = self.service
        if rest == ["stats"]:
            self._method(method, "GET")
            self._guard(scope, "statistics")
            await self._reply(send, 200, orjson.dumps(service.statistics()))
            return
        if not rest or not rest[0]:
            raise HttpError(404, "Not Found")
        name, rest = rest[0], rest[1:]
        if rest == ["trace", "setting"]:
            self._guard(scope, "trace")
            await self._trace_setting(scope, receive, send, method, name)
            return
        version = ""
        if len(rest) >= 2 and rest[0] == "versions":
            version, rest = rest[1], rest[2:]
        action = rest[0] if rest else ""
        if len(rest) > 1:
            raise HttpError(404, "Not Found")
        if action == "infer":
            self._method(method, "POST")
            self._guard(scope, "inference")
            trace = self._sample(scope, name) if service.tracer.on else None
            if trace is None:
                await self._infer(scope, receive, send, name, version)
            else:
                await self._traced(self._infer, scope, receive, send, name, version, trace)
        elif action in ("generate", "generate_stream"):
            self._method(method, "POST")
            self._guard(scope, "inference")
            stream = action == "generate_stream"
            trace = self._sample(scope, name) if service.tracer.on else None
            if trace is None:
                await self._generate(scope, receive, send, name, version, stream=stream)
            else:
                await self._traced(functools.partial(self._generate, stream=stream), scope, receive, send, name,
                                   version, trace)
        elif action == "":
            self._method(method, "GET")
            self._guard(scope, "metadata")
            await self._reply(send, 200, orjson.dumps(service.model_metadata(name, version)))
        elif action == "ready":
            self._method(method, "GET")
            self._guard(scope, "health")
            await self._reply(send, 200 if service.model_ready(name, version) else 400, headers=[])
        elif action == "config":
            self._method(method, "GET")
            self._guard(scope, "model-config")
            await self._reply(send, 200, orjson.dumps(service.model_config(name, version)))
        elif action == "stats":
            self._method(method, "GET")
            self._guard(scope, "statistics")
            await self._reply(send, 200, orjson.dumps(service.statistics(name, version)))
        else:
            raise HttpError(404, "Not Found")

    def _sample(self, scope: Scope, name: str) -> RequestTrace | None:
        """The trace of a request to `name`, when its trace setting samples it; in OpenTelemetry
        mode, continuing the client's span (its ``traceparent`` header), if it sent one."""
        tracer = self.service.tracer
        if tracer.propagates:
            return tracer.sample(name, self._header(scope, b"traceparent"), self._header(scope, b"tracestate"))
        return tracer.sample(name)

    async def _traced(self, handler: Any, scope: Scope, receive: Receive, send: Send, name: str, version: str,
                      trace: RequestTrace) -> None:
        """`handler` (``_infer`` or ``_generate``) for a sampled request: HTTP_RECV_START now,
        HTTP_SEND_START/END around the reply; the trace is written once the reply is sent (or has
        failed)."""
        trace.timestamp("HTTP_RECV_START")

        async def traced_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                trace.timestamp("HTTP_SEND_START")
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                trace.timestamp("HTTP_SEND_END")

        try:
            await handler(scope, receive, traced_send, name, version, trace=trace)
        finally:
            trace.release()

    async def _infer(self, scope: Scope, receive: Receive, send: Send, name: str, version: str,
                     trace: RequestTrace | None = None) -> None:
        body = await self._read_body(scope, receive)
        body = _decompress(body, self._header(scope, b"content-encoding"), self.max_body)
        if trace is not None:
            trace.timestamp("HTTP_RECV_END")
        length_text = self._header(scope, HEADER_LENGTH)
        header_length = None
        if length_text:
            try:
                header_length = int(length_text)
            except ValueError:
                raise InferenceError("INVALID_ARG", f"invalid Inference-Header-Content-Length '{length_text}'") \
                    from None
        if header_length == 0 or (header_length is None and not body):
            # Triton's raw binary request: a header length of 0 (a missing header counts as the
            # body's length, so an empty body is one too). The body is the data of the model's
            # only input, and every output comes back binary.
            config = self.service.model_config(name, version)
            request = http_codec.decode_raw_request(name, version, body, config)
            binary_default = True
        else:
            request = http_codec.decode_infer_request(name, version, body, header_length)
            binary_default = request.parameters.get("binary_data_output", False) is True
        if self.header_forward is not None:
            request.forwarded = self.header_forward.select(scope["headers"])
        result = await self.service.infer(request, trace=trace)
        chunks, json_length = http_response.encode_infer_response(result, binary_default=binary_default)
        headers = [(b"content-type", b"application/octet-stream" if json_length is not None
                    else b"application/json")]
        if json_length is not None:
            headers.append((HEADER_LENGTH, str(json_length).encode()))
        encoding = _compressor(self._header(scope, b"accept-encoding"))
        if encoding:
            headers.append((b"content-encoding", encoding.encode()))
            await self._reply(send, 200, _compress(chunks, encoding), headers)
            return
        if len(chunks) == 1:
            await self._reply(send, 200, bytes(chunks[0]), headers)
        elif sum(map(len, chunks)) <= 65536:  # small: one body message
            await self._reply(send, 200, b"".join(chunks), headers)
        else:
            await self._reply(send, 200, bytes(chunks[0]), headers, more=chunks[1:])

    async def _generate(self, scope: Scope, receive: Receive, send: Send, name: str, version: str,
                        stream: bool, trace: RequestTrace | None = None) -> None:
        """The generate extension: one JSON response, or (``stream``) one SSE event per response.
        A request refused before the model runs gets a plain JSON error with its status; an error
        the model sends first is, as in Triton, a 400 whose body is that error's event. A client
        that goes away cancels the request. `trace`: the request is traced."""
        body = await self._read_body(scope, receive)
        if trace is not None:
            trace.timestamp("HTTP_RECV_END")
        body = _decompress(body, self._header(scope, b"content-encoding"), self.max_body)
        inputs = self.service.model_metadata(name, version)["inputs"]
        request = generate.decode_generate_request(name, version, body, inputs)
        events = self.service.infer_stream(request, trace)
        if not stream:
            await self._generate_once(send, events, name)
            return
        gone = asyncio.ensure_future(_disconnected(receive))
        started = False
        try:
            async for event in _until(events, gone):
                if event.result is None and event.error is None:
                    continue  # a final flag alone: the stream's end says it
                if not started:
                    await send({"type": "http.response.start", "status": 200 if event.error is None else 400,
                                "headers": [(b"content-type", b"text/event-stream; charset=utf-8"),
                                            (b"cache-control", b"no-cache")]})
                    started = True
                payload = (http_response.encode_error(event.error.message) if event.error is not None
                           else generate.encode_generate_response(event.result))  # type: ignore[arg-type]
                await send({"type": "http.response.body", "body": generate.sse_event(payload), "more_body": True})
        except InferenceError as e:
            if not started:
                raise
            await send({"type": "http.response.body", "body": generate.sse_event(http_response.encode_error(e.message)),
                        "more_body": True})
        finally:
            gone.cancel()
            await events.aclose()
        if not started:  # no response at all (a final flag alone)
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream; charset=utf-8")]})
        await send({"type": "http.response.body", "body": b""})

    async def _generate_once(self, send: Send, events: AsyncGenerator[Any, None], name: str) -> None:
        """``generate``: the request's one response as JSON, or its one error as a 400. A model
        that sends none or several gets Triton's answer: a 200 whose body is an error naming
        ``generate_stream``."""
        answers: list[Any] = []
        try:
            async for event in events:
                if event.error is not None or event.result is not None:
                    answers.append(event)
        finally:
            await events.aclose()
        if len(answers) != 1:
            await self._reply(send, 200, http_response.encode_error(
                "generate expects model to produce exactly 1 response, use generate stream for model that "
                "generates various number of responses"))
        elif answers[0].error is not None:
            await self._reply(send, 400, http_response.encode_error(answers[0].error.message))
        else:
            await self._reply(send, 200, generate.encode_generate_response(answers[0].result))

    async def _logging(self, scope: Scope, receive: Receive, send: Send, method: str) -> None:
        """Triton's logging extension: GET answers the settings, POST changes some and answers all."""
        if method not in ("GET", "POST"):
            raise HttpError(405, "Method Not Allowed")
        changes = None
        if method == "POST":
            changes = _json_body(await self._read_body(scope, receive))
            if not isinstance(changes, dict):
                raise InferenceError("INVALID_ARG", "the request body must be a JSON object")
        await self._reply(send, 200, orjson.dumps(self.service.log_settings(changes)))

    async def _trace_setting(self, scope: Scope, receive: Receive, send: Send, method: str, name: str) -> None:
        """Triton's trace extension: GET answers the settings (a model's, with a name), POST
        changes some and answers all."""
        if method not in ("GET", "POST"):
            raise HttpError(405, "Method Not Allowed")
        body = _json_body(await self._read_body(scope, receive)) if method == "POST" else None
        await self._reply(send, 200, orjson.dumps(self.service.trace_settings(name, body)))

    async def _repository(self, scope: Scope, receive: Receive, send: Send, method: str, rest: list[str]) -> None:
        self._method(method, "POST")
        body = _json_body(await self._read_body(scope, receive))
        if not isinstance(body, dict):
            raise InferenceError("INVALID_ARG", "the request body must be a JSON object")
        if rest == ["index"]:
            ready_only = body.get("ready", False)
            if not isinstance(ready_only, bool):
                raise InferenceError("INVALID_ARG", "'ready' must be a boolean")
            await self._reply(send, 200, orjson.dumps(self.service.repository_index(ready_only)))
            return
        if len(rest) == 3 and rest[0] == "models" and rest[2] in ("load", "unload"):
            parameters = body.get("parameters", {})
            if not isinstance(parameters, dict):
                raise InferenceError("INVALID_ARG", "'parameters' must be a JSON object")
            if rest[2] == "load":
                await self.service.load(rest[1], _load_parameters(rest[1], parameters))
            else:
                await self.service.unload(rest[1], parameters)
            await self._reply(send, 200, headers=[])
            return
        raise HttpError(404, "Not Found")

    async def _shared_memory(self, scope: Scope, receive: Receive, send: Send, method: str, cuda: bool,
                             rest: list[str]) -> None:
        registry = self.service.registry
        region: str | None = None
        if len(rest) >= 2 and rest[0] == "region":
            region, rest = rest[1], rest[2:]
        if rest == ["status"]:
            self._method(method, "GET")
            status = registry.cuda_status(region) if cuda else registry.system_status(region)
            await self._reply(send, 200, orjson.dumps(status))
            return
        if rest == ["unregister"]:
            self._method(method, "POST")
            await self._read_body(scope, receive)
            if cuda:
                registry.unregister_cuda(region)
            else:
                registry.unregister_system(region)
            await self._reply(send, 200, headers=[])
            return
        if rest == ["register"] and region is not None:
            self._method(method, "POST")
            body = _json_body(await self._read_body(scope, receive))
            if not isinstance(body, dict):
                raise InferenceError("INVALID_ARG", "the request body must be a JSON object")
            if cuda:
                handle = body.get("raw_handle")
                b64 = handle.get("b64") if isinstance(handle, dict) else None
                if not isinstance(b64, str):
                    raise InferenceError("INVALID_ARG", "Shared memory register request has no 'raw_handle.b64'")
                registry.register_cuda(region, _b64decode(b64), body.get("device_id", 0), body.get("byte_size", 0))
            else:
                key = body.get("key")
                if not isinstance(key, str):
                    raise InferenceError("INVALID_ARG", "Shared memory register request has no 'key'")
                registry.register_system(region, key, body.get("offset", 0), body.get("byte_size", 0))
            await self._reply(send, 200, headers=[])
            return
        raise HttpError(404, "Not Found")


def _b64decode(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InferenceError("INVALID_ARG", "'raw_handle.b64' is not valid base64") from None


async def _disconnected(receive: Receive) -> None:
    """Returns once the client has gone away (the body was read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _until(events: AsyncIterator[Any], gone: asyncio.Future[None]) -> AsyncIterator[Any]:
    """`events`, until `gone` completes (the client left): then the iteration just ends."""
    while True:
        step = asyncio.ensure_future(events.__anext__())
        done, _ = await asyncio.wait({step, gone}, return_when=asyncio.FIRST_COMPLETED)
        if step not in done:
            step.cancel()  # the generator's clean-up (cancelling the request) runs now
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await step
            return
        try:
            yield step.result()
        except StopAsyncIteration:
            return


def _load_parameters(name: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """A load request's JSON parameters with the override files' base64 decoded to bytes."""
    decoded: dict[str, Any] = {}
    for key, value in parameters.items():
        if key.startswith(FILE_PARAMETER_PREFIX):
            if not isinstance(value, str):
                raise InferenceError("INVALID_ARG", f"failed to load '{name}': the '{key}' parameter must be the "
                                                    "file's content in base64")
            try:
                value = base64.b64decode(value, validate=True)
            except ValueError:
                raise InferenceError("INVALID_ARG", f"failed to load '{name}': the '{key}' parameter is not "
                                                    "valid base64") from None
        decoded[key] = value
    return decoded
