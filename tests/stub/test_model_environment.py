"""What a model's process looks like from the inside, as in Triton's embedded interpreter:
``sys.argv`` is ``[""]`` (model code that runs ``unittest.main`` or argparse does not find the
stub's launch argument), and the traceback of an ``async def execute`` that raises lists only
the model's frames."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest

import stubhost
from tests.host.repo_factory import config_pbtxt, io, write_model

ASYNC_MODEL_PY = """
import asyncio
import json
import sys
import unittest

import numpy as np
import triton_python_backend_utils as pb_utils


class ArgvTest(unittest.TestCase):
    def test_nothing(self):
        self.assertTrue(True)


def deep_problem():
    raise KeyError("deep-3141")


class TritonPythonModel:
    def initialize(self, args):
        self.argv_at_init = list(sys.argv)
        # What Triton's QA models do: a unittest run inside the model, driven by sys.argv.
        result = unittest.main(module=__name__, defaultTest="ArgvTest", exit=False, argv=None).result
        self.unittest_ok = result.wasSuccessful() and result.testsRun == 1

    async def execute(self, requests):
        await asyncio.sleep(0)
        if json.loads(requests[0].parameters()).get("raise"):
            deep_problem()
        seen = json.dumps({"init": self.argv_at_init, "now": sys.argv, "unittest_ok": self.unittest_ok})
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([seen.encode()], np.object_))])
                for _ in requests]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[stubhost.Server]:
    repo = tmp_path_factory.mktemp("environment") / "models"
    write_model(repo, "inside", ASYNC_MODEL_PY,
                config_pbtxt("inside", [io("IN", "TYPE_INT32", [1])], [io("OUT", "TYPE_STRING", [1])]))
    with stubhost.Server(repo) as s:
        yield s


def test_the_model_sees_the_argv_of_tritons_embedded_interpreter(server: stubhost.Server) -> None:
    out = server.infer("inside", {"IN": np.zeros(1, np.int32)})
    seen = json.loads(out["OUT"][0])
    assert seen == {"init": [""], "now": [""], "unittest_ok": True}


def test_an_async_execute_that_raises_shows_the_models_frames_only(server: stubhost.Server) -> None:
    with pytest.raises(stubhost.InferenceError) as info:
        server.infer("inside", {"IN": np.zeros(1, np.int32)}, parameters={"raise": True})
    message = info.value.message
    assert message.startswith("Failed to process the request(s) for model 'inside_0', message: KeyError: 'deep-3141'")
    frames = [line.strip() for line in message.split("At:\n", 1)[1].splitlines() if line.strip()]
    assert [frame.rsplit(": ", 1)[1] for frame in frames] == ["deep_problem", "execute"]
    assert all("model.py(" in frame for frame in frames)
