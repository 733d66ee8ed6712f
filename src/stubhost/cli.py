"""``stubhost serve``: the KServe v2 HTTP and gRPC server over a Triton model repository.

    stubhost serve --model-repository examples/models [--http-port 8000] [--grpc-port 8001]

Flags follow tritonserver's names and defaults where they apply. Models load before the
endpoints start; SIGINT or SIGTERM stops the endpoints (in-flight requests get
``--exit-timeout-secs`` to finish), finalizes every model and removes every shared-memory
segment.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Iterator, Sequence

import uvicorn

from stubhost.host.errors import InferenceError
from stubhost.host.server import Server
from stubhost.server.grpc_app import create_grpc_server
from stubhost.server.http_app import HttpFrontend
from stubhost.server.service import InferenceService

log = logging.getLogger("stubhost")


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean, got '{text}'")


def build_parser() -> argparse.ArgumentParser:
    """The ``stubhost`` command line (``serve`` takes tritonserver's flag names)."""
    parser = argparse.ArgumentParser(prog="stubhost", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve a model repository over KServe v2 HTTP and gRPC",
                                allow_abbrev=False)
    serve.add_argument("--model-repository", "--model-store", action="append", required=True, metavar="DIR",
                       help="the model repository (one for now)")
    serve.add_argument("--http-port", type=int, default=8000, help="HTTP port (0: any free port)")
    serve.add_argument("--grpc-port", type=int, default=8001, help="gRPC port (0: any free port)")
    serve.add_argument("--http-address", default="0.0.0.0")
    serve.add_argument("--grpc-address", default="0.0.0.0")
    serve.add_argument("--allow-http", type=_bool, default=True)
    serve.add_argument("--allow-grpc", type=_bool, default=True)
    serve.add_argument("--model-control-mode", choices=("none", "explicit"), default="none")
    serve.add_argument("--load-model", action="append", default=[], metavar="NAME",
                       help="in explicit mode, a model to load at start-up ('*': all)")
    serve.add_argument("--exit-on-error", type=_bool, default=True,
                       help="fail start-up when a model fails to load")
    serve.add_argument("--strict-model-config", type=_bool, default=None,
                       help="true: no auto-completion of model configurations")
    serve.add_argument("--disable-auto-complete-config", action="store_true")
    serve.add_argument("--exit-timeout-secs", type=float, default=30.0,
                       help="how long in-flight requests may run after a stop is asked")
    serve.add_argument("--log-verbose", type=int, default=0)
    return parser


def _models_to_load(args: argparse.Namespace) -> list[str] | None:
    if args.model_control_mode == "none":
        if args.load_model:
            raise SystemExit("stubhost serve: --load-model needs --model-control-mode=explicit")
        return None
    return None if "*" in args.load_model else list(args.load_model)


class _Uvicorn(uvicorn.Server):
    """uvicorn without its own signal handling: ``serve`` decides when everything stops."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def _serve(args: argparse.Namespace, service: InferenceService) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    grpc_server = None
    http_server = None
    http_task = None
    try:
        if args.allow_grpc:
            grpc_server, port = create_grpc_server(service, f"{args.grpc_address}:{args.grpc_port}")
            await grpc_server.start()
            log.info("Started GRPCInferenceService at %s:%d", args.grpc_address, port)
        if args.allow_http:
            config = uvicorn.Config(HttpFrontend(service), host=args.http_address, port=args.http_port,
                                    loop="none", http="httptools", lifespan="off", access_log=False,
                                    log_level="warning", timeout_graceful_shutdown=args.exit_timeout_secs)
            http_server = _Uvicorn(config)
            http_task = asyncio.ensure_future(http_server.serve())
            while not http_server.started:
                if http_task.done():
                    http_task.result()  # raises why it could not start
                    raise OSError("the HTTP server stopped while starting")
                await asyncio.sleep(0.01)
            port = http_server.servers[0].sockets[0].getsockname()[1]
            log.info("Started HTTPService at %s:%d", args.http_address, port)
        await stop.wait()
        log.info("stopping: no new requests; waiting up to %ss for requests in flight", args.exit_timeout_secs)
    finally:
        if http_server is not None and http_task is not None:
            http_server.should_exit = True
            with contextlib.suppress(Exception):
                await http_task
        if grpc_server is not None:
            await grpc_server.stop(args.exit_timeout_secs)


def serve(args: argparse.Namespace) -> int:
    """Loads the repository, serves until SIGINT/SIGTERM, then shuts everything down."""
    logging.basicConfig(level=logging.DEBUG if args.log_verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if len(args.model_repository) != 1:
        print("stubhost serve: only one --model-repository is supported for now", file=sys.stderr)
        return 2
    auto_complete = not (args.disable_auto_complete_config or args.strict_model_config)
    try:
        server = Server(args.model_repository[0], models=_models_to_load(args), exit_on_error=args.exit_on_error,
                        auto_complete_config=auto_complete)
    except InferenceError as e:
        log.error("%s", e.message)
        print(f"error: creating server: {e.message}", file=sys.stderr)
        return 1
    service = InferenceService(server, model_control=args.model_control_mode == "explicit")
    registry = service.registry
    try:
        try:
            import uvloop
            uvloop.run(_serve(args, service))
        except ImportError:
            asyncio.run(_serve(args, service))
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        registry.close()
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
