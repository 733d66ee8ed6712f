"""Where GPU memory comes into models, through real stubs: BLS outputs with ``preferred_memory``,
``KIND_GPU`` instance groups and the ``FORCE_CPU_ONLY_INPUT_TENSORS`` parameter.

Each test asserts what happens on this machine: with a GPU, the GPU behaviour; without one, the
fallback or the refusal a user gets."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import stubhost
from stubhost import InferenceError
from stubhost.gpu import cuda
from tests.host.repo_factory import config_pbtxt, copy_examples, io, write_model

HAS_GPU = cuda.unavailable_reason() is None

PREFERRING_CALLER = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            response = pb_utils.InferenceRequest(
                model_name="add_sub", requested_output_names=["OUTPUT0"],
                inputs=[pb_utils.Tensor("INPUT0", x), pb_utils.Tensor("INPUT1", np.ones_like(x))],
                preferred_memory=pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_GPU, 0)).exec()
            out = pb_utils.get_output_tensor_by_name(response, "OUTPUT0")
            on_cpu = out.is_cpu()
            # A GPU output goes back through DLPack: a copy of the model's own making.
            value = out.as_numpy() if on_cpu else np.asarray(pb_utils.Tensor.from_dlpack("V", out)._array.shape)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("ON_CPU", np.array([on_cpu])),
                pb_utils.Tensor("VALUE", np.asarray(value, dtype=np.float32))]))
        return responses
'''

KIND_REPORTER = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.seen = json.dumps({k: args[k] for k in ("model_instance_kind", "model_instance_device_id",
                                                     "model_instance_name")})

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("ARGS", np.array([self.seen.encode()], dtype=object))])
                for _ in requests]
'''


def test_bls_outputs_preferred_on_the_gpu_land_there_where_a_gpu_is_usable(tmp_path: Path):
    copy_examples(tmp_path, "add_sub")
    write_model(tmp_path, "prefers_gpu", PREFERRING_CALLER,
                config_pbtxt("prefers_gpu", [io("X", "TYPE_FP32", [4])],
                             [io("ON_CPU", "TYPE_BOOL", [1]), io("VALUE", "TYPE_FP32", [-1])]))
    with stubhost.Server(tmp_path) as server:
        out = server.infer("prefers_gpu", {"X": np.arange(4, dtype=np.float32)})
    assert bool(out["ON_CPU"][0]) is (not HAS_GPU)
    if not HAS_GPU:  # a preference: without a GPU the outputs stay on the CPU, values intact
        np.testing.assert_array_equal(out["VALUE"], np.arange(4, dtype=np.float32) + 1)
    else:
        np.testing.assert_array_equal(out["VALUE"], [4])  # the GPU tensor kept its shape


def _gpu_group_repo(tmp_path: Path, gpus: str = "") -> Path:
    write_model(tmp_path, "on_gpu", KIND_REPORTER,
                config_pbtxt("on_gpu", [], [io("ARGS", "TYPE_STRING", [1])],
                             extra=f"instance_group [ {{ count: 2 kind: KIND_GPU {gpus} }} ]"))
    return tmp_path


def test_a_kind_gpu_group_runs_on_the_gpu_or_fails_the_load_with_the_reason(tmp_path: Path):
    if not HAS_GPU:
        # No GPU to fill the group with: Triton's check of the completed config refuses it ...
        with pytest.raises(InferenceError, match="has kind KIND_GPU but specifies no GPUs"):
            with stubhost.Server(_gpu_group_repo(tmp_path / "a")):
                pass
        # ... and a group that names its GPU fails with the reason CUDA gave.
        with pytest.raises(InferenceError, match="asks for GPU instances, but no GPU support is available") as e:
            with stubhost.Server(_gpu_group_repo(tmp_path / "b", gpus="gpus: [ 0 ]")):
                pass
        assert cuda.unavailable_reason() in str(e.value)
        return
    with stubhost.Server(_gpu_group_repo(tmp_path)) as server:
        seen = [json.loads(server.infer("on_gpu", {})["ARGS"][0]) for _ in range(8)]
    assert {s["model_instance_kind"] for s in seen} == {"GPU"}
    assert {s["model_instance_device_id"] for s in seen} <= {str(d) for d in cuda.device_ids()}


@pytest.mark.gpu
def test_a_gpu_id_that_does_not_exist_fails_the_load_with_tritons_words(tmp_path: Path):
    repo = _gpu_group_repo(tmp_path, gpus="gpus: [ 4096 ]")
    with pytest.raises(InferenceError, match="specifies invalid or unsupported gpu id 4096"):
        with stubhost.Server(repo):
            pass


def test_force_cpu_only_input_tensors_must_be_yes_or_no(tmp_path: Path):
    copy_examples(tmp_path, "identity")
    config = (tmp_path / "identity" / "config.pbtxt").read_text()
    config += '\nparameters { key: "FORCE_CPU_ONLY_INPUT_TENSORS" value: { string_value: "sometimes" } }\n'
    (tmp_path / "identity" / "config.pbtxt").write_text(config)
    with pytest.raises(InferenceError, match="FORCE_CPU_ONLY_INPUT_TENSORS must be 'yes' or 'no', got 'sometimes'"):
        with stubhost.Server(tmp_path):
            pass
