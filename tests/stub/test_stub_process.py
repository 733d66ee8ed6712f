"""What a model sees of its process: its environment and interpreter, where print() goes, and that it
runs apart from the caller."""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Iterator

import numpy as np
import pytest

import stubhost
from tests.host.repo_factory import config_pbtxt, io, wait_until, write_model

ENV_PY = """
import json
import os
import sys

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        print("printed in initialize")

    def execute(self, requests):
        params = json.loads(requests[0].parameters())
        if "print" in params:
            print(params["print"], flush=True)
            print(params["print"] + " on stderr", file=sys.stderr, flush=True)
        observed = {
            "var": os.environ.get("STUBHOST_TEST_VAR"),
            "executable": sys.executable,
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "sid": os.getsid(0),
            "modules": sorted(m for m in sys.modules if m.startswith("stubhost.host")),
        }
        text = np.array([json.dumps(observed).encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", text)]) for _ in requests]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[stubhost.Server]:
    repo = tmp_path_factory.mktemp("stubenv") / "models"
    write_model(repo, "env", ENV_PY, config_pbtxt("env", [io("INPUT0", "TYPE_INT32", [1])],
                                                  [io("OUT", "TYPE_STRING", [1])]))
    env = {**os.environ, "STUBHOST_TEST_VAR": "forty-two"}
    with stubhost.Server(repo, env=env, python_executable=sys.executable) as s:
        yield s


def observe(server: stubhost.Server, **params: str) -> dict[str, object]:
    out = server.infer("env", {"INPUT0": np.zeros(1, np.int32)}, parameters=params)
    return json.loads(out["OUT"][0])


def test_env_reaches_the_stub(server: stubhost.Server) -> None:
    assert observe(server)["var"] == "forty-two"


def test_stub_runs_the_given_interpreter(server: stubhost.Server) -> None:
    assert os.path.realpath(str(observe(server)["executable"])) == os.path.realpath(sys.executable)


def test_model_runs_in_a_child_process_of_its_own_session(server: stubhost.Server) -> None:
    obs = observe(server)
    assert obs["pid"] != os.getpid()
    assert obs["ppid"] == os.getpid()
    assert obs["sid"] != os.getsid(0)  # a terminal's Ctrl-C does not reach it


def test_stub_never_imports_the_host_layer(server: stubhost.Server) -> None:
    assert observe(server)["modules"] == []


def test_model_print_reaches_the_log_as_one_record_per_print_with_the_instance(
        server: stubhost.Server, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="stubhost")
    observe(server, print="hello-from-print-93")

    def records() -> list[logging.LogRecord]:
        return [r for r in caplog.records if "hello-from-print-93" in r.getMessage()]

    assert wait_until(lambda: len(records()) >= 2, 5.0), [r.getMessage() for r in records()]
    by_text = {r.getMessage(): r for r in records()}
    assert set(by_text) == {"hello-from-print-93", "hello-from-print-93 on stderr"}
    assert by_text["hello-from-print-93"].levelno == logging.INFO  # stdout
    assert by_text["hello-from-print-93 on stderr"].levelno == logging.WARNING  # stderr
    for record in records():
        assert record.model_instance == "env_0"  # type: ignore[attr-defined]
        assert record.filename == "model.py"  # the print() call's file and line
