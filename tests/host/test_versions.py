"""Version policies: which versions are served and which one a request reaches."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

import stubhost
from tests.host.repo_factory import config_pbtxt, io, write_model

VERSION_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

from .helper import TAG  # each version folder has its own helper.py


class TritonPythonModel:
    def initialize(self, args):
        self.version = int(args["model_version"])

    def execute(self, requests):
        return [pb_utils.InferenceResponse([
            pb_utils.Tensor("VERSION", np.array([self.version, r.model_version()], dtype=np.int32)),
            pb_utils.Tensor("TAG", np.array([TAG.encode()], dtype=np.object_)),
        ]) for r in requests]
"""

POLICIES = {
    "all": "version_policy: { all {} }",
    "default": "",
    "latest2": "version_policy: { latest { num_versions: 2 } }",
    "specific": "version_policy: { specific { versions: [ 1, 3 ] } }",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[stubhost.Server]:
    repo = tmp_path_factory.mktemp("versions") / "models"
    for name, policy in POLICIES.items():
        write_model(repo, name, {v: VERSION_PY for v in (1, 2, 3)}, config_pbtxt(
            name, [io("INPUT0", "TYPE_INT32", [1])],
            [io("VERSION", "TYPE_INT32", [2]), io("TAG", "TYPE_STRING", [1])], extra=policy),
            files={f"{v}/helper.py": f"TAG = 'helper of version {v}'\n" for v in (1, 2, 3)})
    with stubhost.Server(repo) as s:
        yield s


def served_version(server: stubhost.Server, model: str, version: str | int = "") -> int:
    out = server.infer(model, {"INPUT0": np.zeros(1, np.int32)}, model_version=version)
    stub_version, request_version = (int(v) for v in out["VERSION"])
    assert stub_version == request_version, "the request's model_version() disagrees with the stub's version"
    return stub_version


@pytest.mark.parametrize("version", ["1", "2", "3", 1, 2, 3])
def test_all_policy_serves_the_requested_version(server: stubhost.Server, version: str | int) -> None:
    assert served_version(server, "all", version) == int(version)


@pytest.mark.parametrize("version", ["", -1, "-1"])
def test_unspecified_version_is_the_latest(server: stubhost.Server, version: str | int) -> None:
    assert served_version(server, "all", version) == 3


def test_each_version_imports_its_own_helper(server: stubhost.Server) -> None:
    for v in (1, 2, 3):
        out = server.infer("all", {"INPUT0": np.zeros(1, np.int32)}, model_version=v)
        assert out["TAG"].tolist() == [f"helper of version {v}".encode()]


def test_default_policy_serves_only_the_latest(server: stubhost.Server) -> None:
    assert served_version(server, "default") == 3
    assert served_version(server, "default", "3") == 3
    for old in ("1", "2"):
        with pytest.raises(stubhost.InferenceError) as info:
            served_version(server, "default", old)
        assert info.value.code == "NOT_FOUND"
    assert server.model_metadata("default")["versions"] == ["3"]


def test_latest_two_serves_versions_two_and_three(server: stubhost.Server) -> None:
    assert server.model_metadata("latest2")["versions"] == ["2", "3"]
    assert served_version(server, "latest2", "2") == 2
    with pytest.raises(stubhost.InferenceError):
        served_version(server, "latest2", "1")


def test_specific_policy_serves_the_listed_versions(server: stubhost.Server) -> None:
    assert server.model_metadata("specific")["versions"] == ["1", "3"]
    assert served_version(server, "specific", "1") == 1
    assert served_version(server, "specific") == 3
    with pytest.raises(stubhost.InferenceError) as info:
        served_version(server, "specific", "2")
    assert info.value.code == "NOT_FOUND"


def test_model_ready_per_version(server: stubhost.Server) -> None:
    assert all(server.model_ready("all", v) for v in ("1", "2", "3"))
    assert server.model_ready("default", "3") and not server.model_ready("default", "1")
    assert server.model_ready("specific", 1) and not server.model_ready("specific", 2)
    assert not server.model_ready("all", "4")


def test_all_policy_metadata_lists_every_version(server: stubhost.Server) -> None:
    assert server.model_metadata("all")["versions"] == ["1", "2", "3"]

