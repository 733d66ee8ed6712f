"""``stubhost serve``: the KServe v2 HTTP and gRPC server over a Triton model repository.

    stubhost serve --model-repository examples/models [--http-port 8000] [--grpc-port 8001]

Flags follow tritonserver's names and defaults where they apply. Models load before the
endpoints start; a table of models and their state is logged; SIGINT or SIGTERM stops the
endpoints (in-flight requests get ``--exit-timeout-secs`` to finish), finalizes every model and
removes every shared-memory segment. A taken port or a bad repository ends start-up with a
message and exit code 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import socket
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import uvicorn

from stubhost.host.errors import InferenceError
from stubhost.host.python_based import DEFAULT_BACKEND_DIRECTORY
from stubhost.host.rate_limiter import EXECUTION_COUNT, parse_mode, parse_resource
from stubhost.host.server import Server
from stubhost.logs import UNESCAPED, add_log_arguments, configure_logging, flag_bool
from stubhost.server.grpc_app import create_grpc_server
from stubhost.server.header_forward import HeaderForward
from stubhost.server.grpc_options import GrpcOptions, add_grpc_arguments, grpc_options_from_args
from stubhost.server.http_app import DEFAULT_MAX_BODY, HttpFrontend
from stubhost.server.http_protocol import HttpProtocol
from stubhost.server.backend_config import parse_backend_config
from stubhost.server.cache_config import CacheCreateError, parse_cache_settings
from stubhost.server.metrics import MetricsApp
from stubhost.server.metrics_config import parse_metrics_config
from stubhost.server.restricted import Restrictions
from stubhost.server.service import InferenceService
from stubhost.server.trace_config import parse_trace_config
from stubhost.server.trace_settings import TraceManager

log = logging.getLogger("stubhost")


def build_parser() -> argparse.ArgumentParser:
    """The ``stubhost`` command line (``serve`` takes tritonserver's flag names)."""
    parser = argparse.ArgumentParser(prog="stubhost", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve a model repository over KServe v2 HTTP and gRPC",
                                allow_abbrev=False)
    serve.add_argument("--model-repository", "--model-store", action="append", required=True, metavar="DIR",
                       help="a model repository (repeatable)")
    serve.add_argument("--host", default=None, metavar="ADDR",
                       help="address of every endpoint whose own --*-address is not given")
    for name, port in (("http", 8000), ("grpc", 8001), ("metrics", 8002)):
        serve.add_argument(f"--{name}-port", type=int, default=port, help=f"{name} port (0: any free port)")
        serve.add_argument(f"--{name}-address", default=None, metavar="ADDR", help="default 0.0.0.0")
        serve.add_argument(f"--allow-{name}", type=flag_bool, default=True, metavar="BOOL")
    serve.add_argument("--allow-cpu-metrics", type=flag_bool, default=True, metavar="BOOL",
                       help="serve the CPU gauges (nv_cpu_*) on the metrics endpoint")
    serve.add_argument("--metrics-config", action="append", default=[], metavar="SETTING=VALUE",
                       help="a metrics setting (repeatable): counter_latencies=false, summary_latencies=true, "
                            "summary_quantiles=<q>:<err>,... (see docs/frontends.md)")
    serve.add_argument("--http-restricted-api", action="append", default=[], metavar="APIS:KEY=VALUE",
                       help="require header KEY=VALUE for these API groups, e.g. model-repository,shared-memory:k=v")
    serve.add_argument("--grpc-restricted-protocol", action="append", default=[], metavar="APIS:KEY=VALUE",
                       help="require metadata triton-grpc-protocol-KEY=VALUE for these groups")
    for name in ("http", "grpc"):
        serve.add_argument(f"--{name}-header-forward-pattern", default="", metavar="REGEX",
                           help="request headers whose name this matches (ignoring case unless it starts "
                                "with (?-i)) reach the model as string parameters")
    serve.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_BODY,
                       help="largest request body (HTTP) or message (gRPC) accepted")
    serve.add_argument("--id", default="", metavar="NAME",
                       help="the server's name in its metadata (default 'stubhost')")
    serve.add_argument("--model-control-mode", choices=("none", "poll", "explicit"), default="none")
    serve.add_argument("--repository-poll-secs", type=float, default=15.0, metavar="SECONDS",
                       help="in poll mode, the time between two looks at the repositories")
    serve.add_argument("--strict-readiness", type=flag_bool, default=True, metavar="BOOL",
                       help="false: ready whenever live, even while models are not")
    serve.add_argument("--model-load-thread-count", type=int, default=4, metavar="N",
                       help="how many models load at once")
    serve.add_argument("--model-load-retry-count", type=int, default=0, metavar="N",
                       help="how many more times a model whose load fails is tried before the load fails")
    serve.add_argument("--backend-directory", default=DEFAULT_BACKEND_DIRECTORY, metavar="DIR",
                       help="where Python-based backends live: <DIR>/<backend>/model.py")
    serve.add_argument("--backend-config", action="append", default=[], metavar="[BACKEND,]KEY=VALUE",
                       help="e.g. python,shm-default-byte-size=16777216 (see docs/frontends.md)")
    serve.add_argument("--cache-config", action="append", default=[], metavar="CACHE,KEY=VALUE",
                       help="the response cache, e.g. local,size=1048576 (only 'local')")
    serve.add_argument("--response-cache-byte-size", action="append", default=[], metavar="BYTES",
                       help="deprecated: the same as --cache-config local,size=BYTES")
    serve.add_argument("--trace-config", action="append", default=[], metavar="[MODE,]SETTING=VALUE",
                       help="request tracing, e.g. triton,file=/tmp/trace.json or level=TIMESTAMPS "
                            "(see docs/frontends.md)")
    serve.add_argument("--trace-level", action="append", default=[], metavar="LEVEL",
                       help="deprecated: --trace-config level=LEVEL")
    for name, instead in (("file", "triton,file"), ("rate", "rate"), ("count", "count"),
                          ("log-frequency", "triton,log-frequency")):
        serve.add_argument(f"--trace-{name}", default=None, metavar="VALUE",
                           help=f"deprecated: --trace-config {instead}=VALUE")
    serve.add_argument("--rate-limit", default="off", metavar="MODE",
                       help="off (the default) or execution_count: Triton's rate limiter (see docs/scheduling.md)")
    serve.add_argument("--rate-limit-resource", action="append", default=[], metavar="NAME:COUNT[:DEVICE]",
                       help="the copies of a rate limiter resource, on every device or one (repeatable)")
    serve.add_argument("--reuse-http-port", type=flag_bool, default=False, metavar="BOOL",
                       help="let several servers listen on the same HTTP port (each must set it)")
    add_grpc_arguments(serve)  # tritonserver's gRPC TLS, keepalive and port-reuse flags
    for flag in IGNORED_FLAGS:
        serve.add_argument(flag, action="append", default=[], metavar="VALUE", help=argparse.SUPPRESS)
    serve.add_argument("--load-model", action="append", default=[], metavar="NAME",
                       help="in explicit mode, a model to load at start-up ('*': all)")
    serve.add_argument("--exit-on-error", type=flag_bool, default=True, metavar="BOOL",
                       help="fail start-up when a model fails to load")
    serve.add_argument("--strict-model-config", type=flag_bool, default=None, metavar="BOOL",
                       help="true: no auto-completion of model configurations")
    serve.add_argument("--disable-auto-complete-config", action="store_true")
    serve.add_argument("--exit-timeout-secs", type=float, default=30.0,
                       help="how long in-flight requests may run after a stop is asked")
    add_log_arguments(serve)  # tritonserver's --log-* flags
    return parser


# tritonserver flags with no counterpart in stubhost: accepted, so that a launch script written
# for tritonserver starts unchanged, and reported at start-up with the reason.
IGNORED_FLAGS = {
    "--repoagent-directory": "repository agents are not supported",
    "--pinned-memory-pool-byte-size": "tensors cross in each stub's shared-memory pool",
    "--cuda-memory-pool-byte-size": "GPU memory is not pooled",
    "--min-supported-compute-capability": "no GPU backends",
    "--allow-gpu-metrics": "there are no GPU metrics",
    "--metrics-interval-ms": "metrics are read at each scrape",
    "--http-thread-count": "HTTP runs on one event loop",
    "--grpc-infer-allocation-pool-size": "responses are not pooled",
    "--buffer-manager-thread-count": "there is no buffer manager",
    "--host-policy": "host policies are not supported",
    "--enable-peer-access": "no GPU backends",
    "--model-load-gpu-limit": "no GPU backends",
    "--model-namespacing": "model names are one namespace",
}


def _report_ignored(args: argparse.Namespace) -> None:
    for flag, why in IGNORED_FLAGS.items():
        for value in getattr(args, flag.lstrip("-").replace("-", "_")):
            log.warning("%s=%s is accepted and has no effect: %s", flag, value, why)


def _models_to_load(args: argparse.Namespace) -> list[str] | None:
    if args.model_control_mode != "explicit":  # none and poll load every model of the repositories
        return None
    return None if "*" in args.load_model else list(args.load_model)


def _bind(address: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A listening TCP socket; a taken port fails here, with Triton's words, before anything runs
    (unless every server on it sets `reuse_port`: the kernel then spreads connections over them)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((address, port))
        sock.listen(1024)
    except OSError as e:
        sock.close()
        raise OSError(f"Socket '{address}:{port}' already in use ({e.strerror})") from None
    sock.setblocking(False)
    return sock


class _Uvicorn(uvicorn.Server):
    """uvicorn without its own signal handling: ``serve`` decides when everything stops."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def _start_asgi(app: Any, sock: socket.socket, args: argparse.Namespace) -> tuple[_Uvicorn, asyncio.Task[None]]:
    # proxy_headers off: the app never reads the client's address or scheme, so uvicorn's
    # X-Forwarded-* middleware would only cost every request a pass over its headers.
    # Each connection runs stubhost's HttpProtocol; uvicorn's Server keeps the socket and the stop.
    config = uvicorn.Config(app, loop="none", http=HttpProtocol, ws="none", lifespan="off", access_log=False,
                            log_config=None, log_level="warning", timeout_graceful_shutdown=args.exit_timeout_secs,
                            proxy_headers=False)
    server = _Uvicorn(config)
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()
            raise OSError("the HTTP server stopped while starting")
        await asyncio.sleep(0.01)
    return server, task


def log_model_table(service: InferenceService) -> None:
    """Logs the models and their state, as tritonserver does at start-up."""
    rows = [(e["name"], e["version"] or "-", e["state"] + (f": {e['reason']}" if e.get("reason") else ""))
            for e in service.repository_index() if "state" in e]  # (a model never loaded is not in it)
    header = ("Model", "Version", "Status")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(3)]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    lines = [rule, "| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |", rule]
    lines += ["| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths)) + " |" for row in rows]
    lines.append(rule)
    log.info("\n%s", "\n".join(lines), extra=UNESCAPED)  # a table is written as is, as Triton does


async def _serve(args: argparse.Namespace, service: InferenceService, sockets: dict[str, socket.socket],
                 http_limits: Restrictions, grpc_limits: Restrictions, grpc_options: GrpcOptions,
                 http_forward: HeaderForward | None, grpc_forward: HeaderForward | None) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    asgi: list[tuple[_Uvicorn, asyncio.Task[None]]] = []
    grpc_server = None
    try:
        if args.allow_grpc:
            grpc_server, port = create_grpc_server(service, f"{args.grpc_address}:{args.grpc_port}",
                                                   restrictions=grpc_limits, max_message=args.max_request_bytes,
                                                   options=grpc_options, header_forward=grpc_forward)
            log.debug("GRPC KeepAlive Option = Value: %s",
                      ", ".join(f"{k} = {v}" for k, v in grpc_options.keepalive_table()))
            await grpc_server.start()
            log.info("Started GRPCInferenceService at %s:%d", args.grpc_address, port)
        if "http" in sockets:
            app = HttpFrontend(service, max_body=args.max_request_bytes, restrictions=http_limits,
                               header_forward=http_forward)
            asgi.append(await _start_asgi(app, sockets["http"], args))
            log.info("Started HTTPService at %s:%d", args.http_address, sockets["http"].getsockname()[1])
        if "metrics" in sockets:
            app = MetricsApp(service.server, cpu_metrics=args.allow_cpu_metrics)
            asgi.append(await _start_asgi(app, sockets["metrics"], args))
            log.info("Started Metrics Service at %s:%d", args.metrics_address, sockets["metrics"].getsockname()[1])
        await stop.wait()
        log.info("stopping: no new requests; waiting up to %ss for requests in flight", args.exit_timeout_secs)
    finally:
        # Every endpoint stops taking new requests at once; requests in flight get the exit
        # timeout to finish. gRPC would also wait for idle streams, so once no request runs any
        # more, its remaining calls are ended (as Triton waits for requests, not connections).
        for server, _ in asgi:
            server.should_exit = True
        draining = [task for _, task in asgi]
        if grpc_server is not None:
            draining.append(asyncio.ensure_future(grpc_server.stop(args.exit_timeout_secs)))
            await service.drained(args.exit_timeout_secs)
            await grpc_server.stop(0)
        await asyncio.gather(*draining, return_exceptions=True)


def serve(args: argparse.Namespace) -> int:
    """Loads the repository, serves until SIGINT/SIGTERM, then shuts everything down."""
    configure_logging(args)
    if args.model_control_mode != "explicit" and args.load_model:
        print("error: --load-model needs --model-control-mode=explicit", file=sys.stderr)
        return 2
    try:
        grpc_options = grpc_options_from_args(args)
        http_forward = HeaderForward.parse("--http-header-forward-pattern", args.http_header_forward_pattern)
        grpc_forward = HeaderForward.parse("--grpc-header-forward-pattern", args.grpc_header_forward_pattern)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.model_control_mode == "poll" and not args.repository_poll_secs > 0:
        print("error: --repository-poll-secs must be positive", file=sys.stderr)
        return 2
    if args.model_load_thread_count < 1:
        print("error: --model-load-thread-count must be at least 1", file=sys.stderr)
        return 2
    if args.model_load_retry_count < 0:
        print("error: --model-load-retry-count must be at least 0", file=sys.stderr)
        return 2
    # Every flag value is read before anything logs or starts: the first bad one ends start-up
    # (a usage error, 2), as tritonserver's option parser does.
    try:
        backend = parse_backend_config(args.backend_config)
        cache = parse_cache_settings(args.cache_config, args.response_cache_byte_size)
        trace = parse_trace_config(args.trace_config, trace_file=args.trace_file, trace_level=args.trace_level,
                                   trace_rate=args.trace_rate, trace_count=args.trace_count,
                                   trace_log_frequency=args.trace_log_frequency)
        metrics_config = parse_metrics_config(args.metrics_config)
        rate_limit = parse_mode(args.rate_limit)
        resources = [parse_resource(value) for value in args.rate_limit_resource]
    except CacheCreateError as e:
        print(f"error: creating server: Invalid argument - {e}", file=sys.stderr)
        return 1
    except ValueError as e:  # every flag reader's error (CacheFlagError, TraceFlagError, ...) is one
        print(f"error: {e}", file=sys.stderr)
        return 2
    for line in backend.report:
        log.info("%s", line)
    for line in cache.report:  # the size in force at INFO, flags that do less than asked at WARNING
        log.log(logging.INFO if line.startswith("Response Cache") else logging.WARNING, "%s", line)
    for line in trace.report:
        log.warning("%s", line)
    for level, line in metrics_config.report:
        log.log(logging.ERROR if level == "ERROR" else logging.WARNING, "%s", line)
    if rate_limit == EXECUTION_COUNT:
        log.info("Rate limit mode: EXEC_COUNT; resources given: %s",
                 ", ".join(f"{n}:{c}" + ("" if d < 0 else f":{d}") for n, c, d in resources) or "none")
    _report_ignored(args)
    for name in ("http", "grpc", "metrics"):
        if getattr(args, f"{name}_address") is None:
            setattr(args, f"{name}_address", args.host or "0.0.0.0")
    try:
        http_limits = Restrictions.parse(args.http_restricted_api, grpc=False)
        grpc_limits = Restrictions.parse(args.grpc_restricted_protocol, grpc=True)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    sockets: dict[str, socket.socket] = {}
    try:
        for name in ("http", "metrics"):
            if getattr(args, f"allow_{name}"):
                sockets[name] = _bind(getattr(args, f"{name}_address"), getattr(args, f"{name}_port"),
                                      reuse_port=name == "http" and args.reuse_http_port)
    except OSError as e:
        for sock in sockets.values():
            sock.close()
        print(f"error: {e}", file=sys.stderr)
        return 1
    auto_complete = not (args.disable_auto_complete_config or args.strict_model_config)
    try:
        # Every model is tried, and the table shows them all, before a failure ends the start-up.
        server = Server(args.model_repository, models=_models_to_load(args), exit_on_error=False,
                        auto_complete_config=auto_complete, load_threads=args.model_load_thread_count,
                        model_load_retry_count=args.model_load_retry_count, metrics_config=metrics_config,
                        stub_settings=backend.stub, response_cache_bytes=cache.size,
                        rate_limit=rate_limit, rate_limit_resources=resources, backend_directory=args.backend_directory,
                        poll_interval=args.repository_poll_secs if args.model_control_mode == "poll" else None)
    except (InferenceError, OSError, KeyboardInterrupt) as e:
        for sock in sockets.values():
            sock.close()
        if isinstance(e, KeyboardInterrupt):
            print("error: interrupted while loading models", file=sys.stderr)
            return 130
        message = e.message if isinstance(e, InferenceError) else str(e)
        print(f"error: creating server: {message}", file=sys.stderr)
        return 1
    server.allow_model_control = args.model_control_mode == "explicit"
    service = InferenceService(server, model_control=server.allow_model_control,
                               strict_readiness=args.strict_readiness, server_id=args.id,
                               tracer=TraceManager(trace.level, trace.rate, trace.count, trace.log_frequency,
                                                   trace.file, opentelemetry=trace.opentelemetry))
    log_model_table(service)
    if args.exit_on_error and server.load_errors:
        for sock in sockets.values():
            sock.close()
        server.close()
        print("error: creating server: Internal - failed to load all models", file=sys.stderr)
        return 1
    try:
        try:
            import uvloop
            uvloop.run(_serve(args, service, sockets, http_limits, grpc_limits, grpc_options, http_forward,
                              grpc_forward))
        except ImportError:
            asyncio.run(_serve(args, service, sockets, http_limits, grpc_limits, grpc_options, http_forward,
                               grpc_forward))
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        for sock in sockets.values():
            sock.close()
        service.tracer.close()  # writes the traces gathered (no request runs any more)
        service.registry.close()
        server.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``stubhost`` command."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        return serve(args)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
