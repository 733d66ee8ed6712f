#!/usr/bin/env python3
"""The ceiling of stubhost's front-end stack: a KServe v2 server on the same stack (grpcio's
asyncio server; uvicorn's Server with stubhost's HTTP protocol, on uvloop) that runs no model. Every infer call is
answered with bytes prepared at start-up (zeros in each output's configured shape, batch 1 for a
model that batches), without looking at the request beyond the protobuf parse (stubhost's front end parses it too).
Metadata, config and readiness come from the
repository's config.pbtxt files, so perf_analyzer drives it exactly as it drives a real server.

No server on this stack can serve more requests per second than this one; bench_scheduling.py
--with-ceiling measures it beside stubhost and the peer.

Usage: python3 benchmarks/fixed_answer_server.py REPOSITORY HTTP_PORT GRPC_PORT
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import orjson
import uvicorn
from google.protobuf import json_format

from stubhost.config import config_dtype_to_triton, config_to_dict, fill_defaults, load_config_file
from stubhost.server import grpc_service_pb2 as pb
from stubhost.server.grpc_methods import generic_handler
from stubhost.server.http_protocol import HttpProtocol
from tritonclient.utils import triton_to_np_dtype


NAME = "fixed-answer"


class Model:
    """One model's fixed answers."""

    def __init__(self, folder: Path) -> None:
        config = load_config_file(folder / "config.pbtxt")
        fill_defaults(config, folder.name)
        self.name = folder.name
        self.config = config_to_dict(config)
        batching = config.max_batch_size > 0

        def tensors(entries: list[dict[str, Any]], concrete: bool) -> list[dict[str, Any]]:
            """Metadata shapes (-1: any), or the shapes of an answer (batch 1, variable dims 1)."""
            batch = ([1] if concrete else [-1]) if batching else []
            return [{"name": e["name"], "datatype": config_dtype_to_triton(e["data_type"]),
                     "shape": batch + [max(int(d), 1) if concrete else int(d) for d in e.get("dims", [])]}
                    for e in entries]

        self.metadata = {"name": self.name, "versions": ["1"], "platform": "python",
                         "inputs": tensors(self.config.get("input", []), False),
                         "outputs": tensors(self.config.get("output", []), False)}
        outputs = tensors(self.config.get("output", []), True)
        arrays = [np.zeros(o["shape"], triton_to_np_dtype(o["datatype"])) for o in outputs]
        response = pb.ModelInferResponse(model_name=self.name, model_version="1")
        for o, a in zip(outputs, arrays):
            response.outputs.add(name=o["name"], datatype=o["datatype"], shape=o["shape"])
            response.raw_output_contents.append(a.tobytes())
        self.grpc_answer = response  # serialized per call, as stubhost's front end does
        head = {"model_name": self.name, "model_version": "1",
                "outputs": [dict(o, parameters={"binary_data_size": a.nbytes}) for o, a in zip(outputs, arrays)]}
        json_head = orjson.dumps(head)
        self.http_answer = json_head + b"".join(a.tobytes() for a in arrays)
        self.http_headers = [(b"content-type", b"application/octet-stream"),
                             (b"inference-header-content-length", str(len(json_head)).encode()),
                             (b"content-length", str(len(self.http_answer)).encode())]
        config_pb = pb.ModelConfigResponse()
        json_format.ParseDict({"config": json.loads(json.dumps(self.config))}, config_pb, ignore_unknown_fields=True)
        self.grpc_config = config_pb


def grpc_behaviors(models: dict[str, Model]) -> dict[str, Any]:
    async def infer(request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        return models[request.model_name].grpc_answer

    async def metadata(request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        return json_format.ParseDict(models[request.name].metadata, pb.ModelMetadataResponse())

    async def config(request: pb.ModelConfigRequest, context: Any) -> pb.ModelConfigResponse:
        return models[request.name].grpc_config

    async def server_metadata(request: Any, context: Any) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name=NAME, version="0")

    async def live(request: Any, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ready(request: Any, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=True)

    async def model_ready(request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=request.name in models)

    return {"ModelInfer": infer, "ModelMetadata": metadata, "ModelConfig": config, "ServerMetadata": server_metadata, "ServerLive": live,
            "ServerReady": ready, "ModelReady": model_ready}


def http_app(models: dict[str, Model]) -> Any:
    json_type = [(b"content-type", b"application/json")]

    async def reply(send: Any, status: int, body: bytes = b"", headers: list | None = None) -> None:
        await send({"type": "http.response.start", "status": status,
                    "headers": headers or [*json_type, (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def app(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        more = True
        while more:  # the request body is read and dropped
            message = await receive()
            more = message.get("more_body", False)
        parts = scope["path"].strip("/").split("/")
        if parts == ["v2"]:
            await reply(send, 200, orjson.dumps({"name": NAME, "version": "0", "extensions": []}))
        elif parts[:2] == ["v2", "health"]:
            await reply(send, 200)
        elif parts[:2] == ["v2", "models"] and len(parts) >= 3 and parts[2] in models:
            model = models[parts[2]]
            action = parts[3] if len(parts) > 3 else ""
            if action == "infer":
                await reply(send, 200, model.http_answer, model.http_headers)
            elif action == "ready":
                await reply(send, 200)
            elif action == "config":
                await reply(send, 200, orjson.dumps(model.config))
            else:
                await reply(send, 200, orjson.dumps(model.metadata))
        else:
            await reply(send, 404, orjson.dumps({"error": "not found"}))

    return app


async def serve(repository: Path, http_port: int, grpc_port: int) -> None:
    models = {m.name: m for m in (Model(f) for f in sorted(repository.iterdir()) if (f / "config.pbtxt").exists())}
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((generic_handler(grpc_behaviors(models)),))
    server.add_insecure_port(f"127.0.0.1:{grpc_port}")
    await server.start()
    config = uvicorn.Config(http_app(models), host="127.0.0.1", port=http_port, loop="none", http=HttpProtocol,
                            lifespan="off", access_log=False, log_level="warning")
    print(f"fixed-answer server: {len(models)} models, HTTP {http_port}, gRPC {grpc_port}", flush=True)
    await uvicorn.Server(config).serve()
    await server.stop(None)


def main() -> None:
    repository, http_port, grpc_port = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    try:
        import uvloop  # the loop stubhost serve runs on
        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve(repository, http_port, grpc_port))


if __name__ == "__main__":
    main()
