"""model_warmup: every instance runs its warmup requests before it is READY (also after a
restart), as Triton builds them; a failing warmup fails the load with Triton's text; warmup
requests count in the statistics, as in Triton."""

from __future__ import annotations

import json
import os
import signal
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import stubhost
from tests.host.repo_factory import child_stub_pids, config_pbtxt, instance, io, wait_until, write_model

# Appends one JSON line per execute to the file named by the LOG parameter: the instance, the
# stub's pid and each request's inputs (dtype, shape, data), parameters and id. FAIL: "raise"
# (execute raises), "error" (error responses), or a path (raise while that file exists).
# finalize() appends {"finalized": <instance>}.
RECORDER_PY = """
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.log = params["LOG"]["string_value"]
        self.fail = params.get("FAIL", {}).get("string_value", "")
        self.instance = args["model_instance_name"]

    def _write(self, entry):
        with open(self.log, "a") as f:
            f.write(json.dumps(entry) + "\\n")

    def execute(self, requests):
        entry = {"instance": self.instance, "pid": os.getpid(), "requests": []}
        for request in requests:
            inputs = {}
            for tensor in request.inputs():
                a = tensor.as_numpy()
                data = [x.decode("latin1") for x in a.flatten()] if a.dtype == object else a.tobytes().hex()
                inputs[tensor.name()] = {"dtype": str(a.dtype), "shape": list(a.shape), "data": data}
            entry["requests"].append({"inputs": inputs, "params": json.loads(request.parameters()),
                                      "id": request.request_id()})
        self._write(entry)
        if self.fail == "raise" or (self.fail not in ("", "raise", "error") and os.path.exists(self.fail)):
            raise RuntimeError("warmup-boom-42")
        if self.fail == "error":
            return [pb_utils.InferenceResponse(error=pb_utils.TritonError("An Error Occurred")) for _ in requests]
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy().astype(np.float32))]) for r in requests]

    def finalize(self):
        self._write({"finalized": self.instance})
"""

# Decoupled: two responses per request, then the final flag alone; recorded as RECORDER_PY does.
DECOUPLED_PY = """
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.log = json.loads(args["model_config"])["parameters"]["LOG"]["string_value"]

    def execute(self, requests):
        with open(self.log, "a") as f:
            f.write(json.dumps({"pid": os.getpid(), "requests": len(requests)}) + "\\n")
        for request in requests:
            sender = request.get_response_sender()
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            for _ in range(2):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x.astype(np.float32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

IO_IN = [io("IN", "TYPE_FP32", [4]), io("S", "TYPE_STRING", [-1], optional=True)]
IO_OUT = [io("OUT", "TYPE_FP32", [4])]
ZEROS = '{ key: "IN" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } }'


def serialized(*strings: bytes) -> bytes:
    """A BYTES tensor as Triton serializes it: a 4-byte little-endian length before each element."""
    return b"".join(struct.pack("<I", len(s)) + s for s in strings)


def make_model(repo: Path, name: str, log: Path, warmup: str, *, source: str = RECORDER_PY,
               max_batch_size: int = 0, count: int = 1, fail: str = "", extra: str = "",
               files: dict[str, bytes] | None = None) -> Path:
    params = f'parameters {{ key: "LOG" value: {{ string_value: "{log}" }} }}'
    if fail:
        params += f' parameters {{ key: "FAIL" value: {{ string_value: "{fail}" }} }}'
    config = config_pbtxt(name, IO_IN, IO_OUT, max_batch_size=max_batch_size,
                          extra=f"{params}\ninstance_group [ {{ count: {count} kind: KIND_CPU }} ]\n"
                                f"model_warmup [ {warmup} ]\n{extra}")
    model_dir = write_model(repo, name, source, config)
    for rel, data in (files or {}).items():
        (model_dir / "warmup" / rel).parent.mkdir(parents=True, exist_ok=True)
        (model_dir / "warmup" / rel).write_bytes(data)
    return model_dir


def entries(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def executions(log: Path) -> list[dict[str, Any]]:
    return [e for e in entries(log) if "requests" in e]


def load_error(repo: Path) -> stubhost.InferenceError:
    with pytest.raises(stubhost.InferenceError) as info:
        with stubhost.Server(repo):
            pass
    return info.value


FILE_SAMPLE = """{ name: "from file" batch_size: 1
    inputs { key: "IN" value: { data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "in.bin" } }
    inputs { key: "S" value: { data_type: TYPE_STRING dims: [ 3 ] input_data_file: "strings/s.bin" } } }"""


def test_every_instance_runs_every_sample_before_it_serves(tmp_path: Path) -> None:
    """max_batch_size > 0: batch_size requests of batch 1 per Execute, count Executes."""
    repo, log = tmp_path / "models", tmp_path / "log.jsonl"
    floats = np.arange(6, dtype=np.float32)  # longer than needed: the first 16 bytes are used
    warmup = f"""
      {{ name: "zeros" batch_size: 2 count: 3 inputs {ZEROS}
         inputs {{ key: "EXTRA" value: {{ data_type: TYPE_INT32 dims: [ 2 ] zero_data: true }} }}
         inputs {{ key: "S" value: {{ data_type: TYPE_STRING dims: [ 2 ] random_data: true }} }} }},
      {{ name: "skipped" batch_size: 0 inputs {ZEROS} }},
      {{ name: "random" batch_size: 1 inputs {{ key: "IN" value: {{ data_type: TYPE_FP32 dims: [ 4 ] random_data: true }} }} }},
      {FILE_SAMPLE}"""
    make_model(repo, "rec", log, warmup, max_batch_size=8, count=2,
               files={"in.bin": floats.tobytes(), "strings/s.bin": serialized(b"a", b"", b"xyz")})
    with stubhost.Server(repo) as server:
        warm = executions(log)  # all written before the constructor returned: before any request
        by_instance: dict[str, list[dict[str, Any]]] = {}
        for e in warm:
            by_instance.setdefault(e["instance"], []).append(e)
        assert sorted(by_instance) == ["rec_0_0", "rec_0_1"]
        for runs in by_instance.values():
            assert [len(e["requests"]) for e in runs] == [2, 2, 2, 1, 1]
            for e in runs[:3]:
                for request in e["requests"]:
                    assert request["params"] == {} and request["id"] == ""
                    inputs = request["inputs"]
                    assert inputs["IN"] == {"dtype": "float32", "shape": [1, 4], "data": "00" * 16}
                    assert inputs["EXTRA"] == {"dtype": "int32", "shape": [1, 2], "data": "00" * 8}
                    assert inputs["S"] == {"dtype": "object", "shape": [1, 2], "data": ["", ""]}
            random_in = runs[3]["requests"][0]["inputs"]
            assert sorted(random_in) == ["IN"]
            assert random_in["IN"]["dtype"] == "float32" and random_in["IN"]["shape"] == [1, 4]
            assert len(random_in["IN"]["data"]) == 32
            from_file = runs[4]["requests"][0]["inputs"]
            assert from_file["IN"] == {"dtype": "float32", "shape": [1, 4], "data": floats[:4].tobytes().hex()}
            assert from_file["S"] == {"dtype": "object", "shape": [1, 3], "data": ["a", "", "xyz"]}
        # random data is drawn for each instance
        assert by_instance["rec_0_0"][3]["requests"][0] != by_instance["rec_0_1"][3]["requests"][0]

        # Triton counts warmup requests: each of batch 1, each Execute one execution
        stats = server.statistics("rec")["model_stats"][0]
        per_instance = 2 * 3 + 1 + 1
        assert stats["inference_count"] == 2 * per_instance
        assert stats["execution_count"] == 2 * (3 + 1 + 1)
        assert stats["inference_stats"]["success"]["count"] == 2 * per_instance
        assert {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]} == {2: 6, 1: 4}
        assert stats["last_inference"] > 0

        out = server.infer("rec", {"IN": np.ones((1, 4), np.float32)}, parameters={"user": 1})
        np.testing.assert_array_equal(out["OUT"], np.ones((1, 4), np.float32))
        later = executions(log)[len(warm):]
        assert len(later) == 1 and later[0]["requests"][0]["params"] == {"user": 1}
        assert server.statistics("rec")["model_stats"][0]["inference_count"] == 2 * per_instance + 1


def test_without_batching_inputs_have_the_sample_dims(tmp_path: Path) -> None:
    repo, log = tmp_path / "models", tmp_path / "log.jsonl"
    make_model(repo, "flat", log, f'{{ name: "three" batch_size: 3 count: 0 inputs {ZEROS} }}')
    with stubhost.Server(repo) as server:
        (e,) = executions(log)  # count 0 runs once
        assert len(e["requests"]) == 3
        assert all(r["inputs"]["IN"]["shape"] == [4] for r in e["requests"])
        stats = server.statistics("flat")["model_stats"][0]
        assert (stats["inference_count"], stats["execution_count"]) == (3, 1)
        assert [b["batch_size"] for b in stats["batch_stats"]] == [3]


@pytest.mark.parametrize(("fail", "batch", "expected"), [
    ("error", 2, "failed to run warmup sample 'zero sample': An Error Occurred; An Error Occurred; "),
    ("raise", 1, None),
])
def test_a_failing_warmup_fails_the_load(tmp_path: Path, fail: str, batch: int, expected: str | None) -> None:
    repo, log = tmp_path / "models", tmp_path / "log.jsonl"
    make_model(repo, "bad", log, f'{{ name: "zero sample" batch_size: {batch} inputs {ZEROS} }}, '
                                 f'{{ name: "second" batch_size: 1 inputs {ZEROS} }}', fail=fail)
    before = child_stub_pids()
    error = load_error(repo)
    assert error.code == "INVALID_ARG"
    if expected is not None:
        assert error.message == expected
    else:
        assert error.message.startswith("failed to run warmup sample 'zero sample': ")
        assert "RuntimeError: warmup-boom-42" in error.message and error.message.endswith("; ")
    assert len(executions(log)) == 1  # the failing sample ends the warmup
    assert {"finalized": "bad_0_0"} in entries(log)  # the instance is finalized, as Triton destroys it
    assert wait_until(lambda: not (child_stub_pids() - before), 5.0), child_stub_pids() - before


def test_decoupled_model_is_warmed_up_to_its_final_flag(tmp_path: Path) -> None:
    repo, log = tmp_path / "models", tmp_path / "log.jsonl"
    make_model(repo, "dec", log, f'{{ name: "d" batch_size: 2 inputs {ZEROS} }}', source=DECOUPLED_PY,
               extra="model_transaction_policy { decoupled: true }")
    with stubhost.Server(repo) as server:
        assert [e["requests"] for e in executions(log)] == [2]
        responses = list(server.stream("dec", {"IN": np.ones(4, np.float32)}))
        assert len(responses) == 2
        assert server.statistics("dec")["model_stats"][0]["inference_count"] == 3


@pytest.mark.parametrize(("files", "code", "expected"), [
    ({}, "INTERNAL", "failed to open text file for read {dir}/warmup/in.bin: No such file or directory"),
    ({"in.bin": b"\0" * 12}, "INVALID_ARG",
     "[request id: <id_unknown>] warmup setting expects 16 bytes, but the data provided from in.binonly has "
     "12 bytes"),
])
def test_warmup_data_files_are_checked_when_the_requests_are_built(
        tmp_path: Path, files: dict[str, bytes], code: str, expected: str) -> None:
    repo, log = tmp_path / "models", tmp_path / "log.jsonl"
    sample = '{ name: "f" batch_size: 1 inputs { key: "IN" value: { data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "in.bin" } } }'
    model_dir = make_model(repo, "files", log, sample, files=files)
    error = load_error(repo)
    assert (error.code, error.message) == (code, expected.format(dir=model_dir))
    assert executions(log) == []


def test_string_files_must_hold_as_many_elements_as_the_shape(tmp_path: Path) -> None:
    repo, log = tmp_path / "models", tmp_path / "log.jsonl"
    make_model(repo, "strs", log, FILE_SAMPLE, files={"in.bin": bytes(16), "strings/s.bin": serialized(b"a")})
    error = load_error(repo)
    assert error.message == ("[request id: <id_unknown>] expected 3 string elements for inference input 'S' "
                             "for model 'strs', got 1")


def test_config_errors_fail_the_load_before_any_warmup(tmp_path: Path) -> None:
    repo, log = tmp_path / "models", tmp_path / "log.jsonl"
    make_model(repo, "cfg", log, '{ name: "v" batch_size: 1 inputs { key: "IN" value: { data_type: TYPE_FP32 '
                                 'dims: [ -1 ] zero_data: true } } }')
    error = load_error(repo)
    assert error.code == "INVALID_ARG"
    assert error.message.endswith("model_warmup 'v': inputs 'IN': dims: warmup setting expects all variable-size "
                                  "dimensions are specified for input 'IN'")


def test_a_restarted_stub_is_warmed_up_before_it_serves(tmp_path: Path) -> None:
    repo, log = tmp_path / "models", tmp_path / "log.jsonl"
    make_model(repo, "again", log, f'{{ name: "w" batch_size: 2 inputs {ZEROS} }}')
    with stubhost.Server(repo, restart=stubhost.RestartPolicy(backoff_s=0.01)) as server:
        inst = instance(server, "again")
        old = inst.process.pid
        os.kill(old, signal.SIGKILL)
        assert wait_until(lambda: inst.process.pid != old and server.model_ready("again"), 15.0)
        out = server.infer("again", {"IN": np.ones(4, np.float32)}, parameters={"user": 1}, timeout=30)
        np.testing.assert_array_equal(out["OUT"], np.ones(4, np.float32))
        new = [e for e in executions(log) if e["pid"] != old]
        assert [len(e["requests"]) for e in new] == [2, 1]  # the warmup first, then the request
        assert new[0]["requests"][0]["params"] == {} and new[1]["requests"][0]["params"] == {"user": 1}
        assert server.statistics("again")["model_stats"][0]["inference_count"] == 2 + 2 + 1


def test_a_restart_whose_warmup_fails_counts_as_a_crash(tmp_path: Path) -> None:
    repo, log, flag = tmp_path / "models", tmp_path / "log.jsonl", tmp_path / "fail-now"
    make_model(repo, "flaky", log, f'{{ name: "w" batch_size: 1 inputs {ZEROS} }}', fail=str(flag))
    policy = stubhost.RestartPolicy(max_restarts=1, backoff_s=0.01)
    before = child_stub_pids()
    with stubhost.Server(repo, restart=policy) as server:
        inst = instance(server, "flaky")
        flag.touch()
        os.kill(inst.process.pid, signal.SIGKILL)
        assert wait_until(lambda: inst.state.name == "FAILED", 15.0), inst.state
        with pytest.raises(stubhost.InferenceError) as info:
            server.infer("flaky", {"IN": np.ones(4, np.float32)}, timeout=5)
        assert "is not healthy" in info.value.message
        assert len(executions(log)) == 2  # the load's warmup, then the restart's failed one
        assert wait_until(lambda: not (child_stub_pids() - before), 5.0)
