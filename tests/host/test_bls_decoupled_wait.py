"""``exec(decoupled=True)`` returns once the target's first response is there, as in Triton: an
``async def execute`` that awaits ``async_exec(decoupled=True)`` and then walks the iterator
with a plain ``for`` loop does not block its event loop waiting for the first response, so
requests of a decoupled caller still run side by side (Triton's QA test
``test_concurrent_execute_multi_request_bls``)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

import stubhost
from tests.host.repo_factory import config_pbtxt, io, write_model

DECOUPLED = 'model_transaction_policy { decoupled: true }'

SLOW_TARGET_PY = """
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        await asyncio.gather(*(self.answer(r) for r in requests))

    async def answer(self, request):
        await asyncio.sleep(1.0)  # the first (and only) response comes after a second
        x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
        request.get_response_sender().send(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]),
                                           flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

CALLER_PY = """
import asyncio
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        await asyncio.gather(*(self.relay(r) for r in requests))

    async def relay(self, request):
        x = pb_utils.get_input_tensor_by_name(request, "X")
        call = pb_utils.InferenceRequest(model_name="slow_target", inputs=[x], requested_output_names=["Y"])
        responses = await call.async_exec(decoupled=True)
        received = time.monotonic()
        for response in responses:  # a plain loop: the first step must not wait
            if response.has_error():
                raise pb_utils.TritonModelException(response.error().message())
            if response.output_tensors():
                y = pb_utils.get_output_tensor_by_name(response, "Y").as_numpy()
                took = np.array([time.monotonic() - received], np.float64)
                request.get_response_sender().send(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("Y", y), pb_utils.Tensor("FIRST_STEP_S", took)]))
        request.get_response_sender().send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""


def test_async_decoupled_bls_callers_overlap(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    write_model(repo, "slow_target", SLOW_TARGET_PY, config_pbtxt(
        "slow_target", [io("X", "TYPE_FP32", [1])], [io("Y", "TYPE_FP32", [1])], extra=DECOUPLED))
    write_model(repo, "relay", CALLER_PY, config_pbtxt(
        "relay", [io("X", "TYPE_FP32", [1])], [io("Y", "TYPE_FP32", [1]), io("FIRST_STEP_S", "TYPE_FP64", [1])],
        extra=DECOUPLED))
    with stubhost.Server(repo) as server:
        def one(i: int) -> list[dict[str, np.ndarray]]:
            return list(server.stream("relay", {"X": np.array([i], np.float32)}))

        one(0)  # warm: both stubs have run once
        start = time.monotonic()
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(one, range(4)))
        elapsed = time.monotonic() - start
    assert [float(r[0]["Y"][0]) for r in results] == [0.0, 1.0, 2.0, 3.0]
    assert all(float(r[0]["FIRST_STEP_S"][0]) < 0.5 for r in results), results  # the response was there already
    assert elapsed < 2.5, f"4 requests of 1 s took {elapsed:.2f} s: the caller's requests did not overlap"
