"""Sequence batching control inputs (``sequence_batching { control_input [...] }``) through the
in-process API: the START, END, READY and CORRID tensors a sequence model gets with each request,
their values, dtypes and shapes (with and without ``max_batch_size``), integer and string
correlation ids, and the errors a client gets.

Every model runs ECHO_PY: it answers each control input it got as ``OUT_<name>`` (same values,
dtype and shape) and the names of all its inputs as NAMES.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import stubhost
from stubhost.host.errors import InferenceError
from tests.host.repo_factory import config_pbtxt, io, write_model

TIMEOUT = 30.0
START, END = 1, 2

ECHO_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

CONTROLS = ("START", "END", "READY", "CORRID")


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            inputs = request.inputs()
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            out = [pb_utils.Tensor("OUT_" + t.name(), t.as_numpy().copy()) for t in inputs if t.name() in CONTROLS]
            names = " ".join(sorted(t.name() for t in inputs)).encode()
            out.append(pb_utils.Tensor("NAMES", np.full(x.shape, names, np.object_)))
            responses.append(pb_utils.InferenceResponse(out))
        return responses
"""

# Reschedules each request once and answers, in its second run, the START and END controls it
# saw in both runs: [START 1st, START 2nd, END 1st, END 2nd].
TWICE_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.first = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            seen = [int(pb_utils.get_input_tensor_by_name(request, name).as_numpy()[0]) for name in ("START", "END")]
            key = id(request)
            if key not in self.first:
                self.first[key] = seen
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                responses.append(None)
                continue
            first = self.first.pop(key)
            runs = np.array([first[0], seen[0], first[1], seen[1]], np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("RUNS", runs)]))
        return responses
"""

# control kind -> the text inside its `control [ { ... } ]` entry
INT_START = "kind: CONTROL_SEQUENCE_START int32_false_true: [ 7, 9 ]"
FP_END = "kind: CONTROL_SEQUENCE_END fp32_false_true: [ -1.0, 2.5 ]"
BOOL_READY = "kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ]"
BOOL_START = "kind: CONTROL_SEQUENCE_START bool_false_true: [ false, true ]"
INT_END = "kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ]"
FP_READY = "kind: CONTROL_SEQUENCE_READY fp32_false_true: [ 0.0, 1.0 ]"


def corrid(data_type: str) -> str:
    return f"kind: CONTROL_SEQUENCE_CORRID data_type: {data_type}"


def control_config(name: str, controls: Mapping[str, tuple[str, str]], *, max_batch_size: int = 0,
                   inputs: tuple[str, ...] = (), sequence_extra: str = "", extra: str = "") -> str:
    """A sequence model with input X (FP32 [1]) and the given controls {tensor: (control, output
    data type)}; each control is echoed as OUT_<tensor> with that data type."""
    control_inputs = ",\n".join(f'  {{ name: "{tensor}" control [ {{ {control} }} ] }}'
                                for tensor, (control, _) in controls.items())
    outputs = [io("NAMES", "TYPE_STRING", [1])] + [io(f"OUT_{tensor}", data_type, [1])
                                                  for tensor, (_, data_type) in controls.items()]
    sequence = f"sequence_batching {{\n{sequence_extra}\n control_input [\n{control_inputs}\n ]\n}}\n"
    return config_pbtxt(name, [io("X", "TYPE_FP32", [1]), *inputs], outputs, max_batch_size=max_batch_size,
                        extra=sequence + extra)


MODELS = {
    # no batching: every kind, each with its own data type and false/true values
    "plain": control_config("plain", {"START": (INT_START, "TYPE_INT32"), "END": (FP_END, "TYPE_FP32"),
                                      "READY": (BOOL_READY, "TYPE_BOOL"),
                                      "CORRID": (corrid("TYPE_UINT64"), "TYPE_UINT64")}),
    # batching (shape [1, 1]), two instances, a 32-bit signed CORRID
    "batched": control_config("batched", {"START": (BOOL_START, "TYPE_BOOL"), "END": (INT_END, "TYPE_INT32"),
                                          "READY": (FP_READY, "TYPE_FP32"),
                                          "CORRID": (corrid("TYPE_INT32"), "TYPE_INT32")},
                              max_batch_size=4, extra="instance_group [ { count: 2 kind: KIND_CPU } ]"),
    "text": control_config("text", {"START": (INT_START, "TYPE_INT32"),
                                    "CORRID": (corrid("TYPE_STRING"), "TYPE_STRING")}, max_batch_size=2),
    # START is also a declared input: the control replaces the client's tensor (Triton's override)
    "declared": control_config("declared", {"START": (INT_START, "TYPE_INT32")},
                               inputs=(io("START", "TYPE_INT32", [1], optional=True),)),
    "iterative": control_config("iterative", {"START": (INT_START, "TYPE_INT32"), "END": (INT_END, "TYPE_INT32"),
                                              "CORRID": (corrid("TYPE_UINT64"), "TYPE_UINT64")},
                                sequence_extra=" iterative_sequence: true"),
    # no controls: requests are as before
    "bare": config_pbtxt("bare", [io("X", "TYPE_FP32", [1])], [io("NAMES", "TYPE_STRING", [1])],
                         extra="sequence_batching { }"),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    repo: Path = tmp_path_factory.mktemp("controls") / "models"
    for name, config in MODELS.items():
        write_model(repo, name, ECHO_PY, config)
    write_model(repo, "twice", TWICE_PY, config_pbtxt(
        "twice", [io("X", "TYPE_FP32", [1])], [io("RUNS", "TYPE_INT32", [4])],
        extra="sequence_batching {\n iterative_sequence: true\n control_input [\n"
              f'  {{ name: "START" control [ {{ {INT_START} }} ] }},\n'
              f'  {{ name: "END" control [ {{ {INT_END} }} ] }}\n ]\n}}\n'))
    with stubhost.Server(repo) as srv:
        yield srv


def send(server: stubhost.Server, model: str, correlation_id: int | str, flags: int = 0,
         **inputs: Any) -> dict[str, np.ndarray]:
    batched = model in ("batched", "text")
    x = np.ones((1, 1) if batched else (1,), np.float32)
    return server.infer(model, {"X": x, **inputs}, correlation_id=correlation_id, flags=flags, timeout=TIMEOUT)


def sequence(server: stubhost.Server, model: str, correlation_id: int | str) -> list[dict[str, np.ndarray]]:
    """START, a middle request, END."""
    return [send(server, model, correlation_id, flags) for flags in (START, 0, END)]


def column(results: list[dict[str, np.ndarray]], name: str) -> list[Any]:
    """One output's single value in each result, checking it holds one value."""
    values = []
    for result in results:
        assert result[name].size == 1, (name, result[name])
        values.append(result[name].reshape(-1)[0])
    return values


def test_no_batching_every_kind_with_its_values_dtypes_and_shape(server):
    results = sequence(server, "plain", 12345)
    assert column(results, "OUT_START") == [9, 7, 7]
    assert column(results, "OUT_END") == [-1.0, -1.0, 2.5]
    assert column(results, "OUT_READY") == [True, True, True]
    assert column(results, "OUT_CORRID") == [12345] * 3
    for result in results:
        assert result["OUT_START"].dtype == np.int32 and result["OUT_START"].shape == (1,)
        assert result["OUT_END"].dtype == np.float32 and result["OUT_END"].shape == (1,)
        assert result["OUT_READY"].dtype == np.bool_ and result["OUT_READY"].shape == (1,)
        assert result["OUT_CORRID"].dtype == np.uint64 and result["OUT_CORRID"].shape == (1,)
        assert result["NAMES"][0] == b"CORRID END READY START X"


def test_a_one_request_sequence_is_start_and_end(server):
    result = send(server, "plain", 2**64 - 1, START | END)
    assert (result["OUT_START"][0], result["OUT_END"][0], result["OUT_READY"][0]) == (9, 2.5, True)
    assert result["OUT_CORRID"][0] == 2**64 - 1  # the whole uint64 range


def test_batching_adds_the_batch_dimension(server):
    results = sequence(server, "batched", 77)
    assert column(results, "OUT_START") == [True, False, False]
    assert column(results, "OUT_END") == [0, 0, 1]
    assert column(results, "OUT_READY") == [1.0, 1.0, 1.0]
    assert column(results, "OUT_CORRID") == [77] * 3
    for result in results:
        for name, dtype in (("OUT_START", np.bool_), ("OUT_END", np.int32), ("OUT_READY", np.float32),
                            ("OUT_CORRID", np.int32)):
            assert result[name].dtype == dtype and result[name].shape == (1, 1), (name, result[name])


def test_interleaved_sequences_each_get_their_own_id(server):
    ids = [101, 102, 103]
    starts = {cid: send(server, "batched", cid, START) for cid in ids}
    middles = {cid: send(server, "batched", cid) for cid in reversed(ids)}
    ends = {cid: send(server, "batched", cid, END) for cid in ids}
    for cid in ids:
        assert [r["OUT_CORRID"][0, 0] for r in (starts[cid], middles[cid], ends[cid])] == [cid] * 3
        assert [r["OUT_START"][0, 0] for r in (starts[cid], middles[cid], ends[cid])] == [True, False, False]


def test_a_32_bit_corrid_gets_the_low_bits_of_the_id(server):
    """As Triton copies the uint64 id's first bytes into a 4-byte tensor."""
    for cid, expected in ((2**32 + 5, 5), (2**31 + 1, -(2**31) + 1)):
        results = sequence(server, "batched", cid)
        assert column(results, "OUT_CORRID") == [expected] * 3


def test_string_ids_with_a_string_corrid(server):
    results = sequence(server, "text", "user-42/session")
    assert column(results, "OUT_CORRID") == [b"user-42/session"] * 3
    assert column(results, "OUT_START") == [9, 7, 7]
    assert all(r["OUT_CORRID"].dtype == np.object_ and r["OUT_CORRID"].shape == (1, 1) for r in results)


def test_integer_ids_with_a_string_corrid_are_their_decimal_text(server):
    results = sequence(server, "text", 9000)
    assert column(results, "OUT_CORRID") == [b"9000"] * 3


def test_a_string_id_with_a_numeric_corrid_is_refused(server):
    with pytest.raises(InferenceError) as err:
        send(server, "plain", "abc", START)
    assert err.value.code == "INVALID_ARG"
    assert str(err.value).endswith("inference request to model 'plain' must specify an integer correlation ID: its "
                                   "control input 'CORRID' (CONTROL_SEQUENCE_CORRID) is TYPE_UINT64, got the "
                                   "string 'abc'")
    # the refused START opened no sequence
    with pytest.raises(InferenceError, match="must specify the START flag"):
        send(server, "plain", 555)


def test_a_client_cannot_send_a_control_input(server):
    with pytest.raises(InferenceError) as err:
        send(server, "plain", 31, START, START=np.array([1], np.int32))
    assert err.value.code == "INVALID_ARG"
    # Triton counts a client's control input among the request's inputs, before it looks at names
    assert "expected 1 inputs but got 2 inputs for model 'plain'. Got input(s) ['START','X']" in str(err.value)


def test_a_control_that_is_also_a_declared_input_replaces_the_clients_tensor(server):
    results = [send(server, "declared", 8, flags, START=np.array([1000], np.int32)) for flags in (START, 0, END)]
    assert column(results, "OUT_START") == [9, 7, 7]
    assert [r["NAMES"][0] for r in results] == [b"START X"] * 3


def test_iterative_request_without_id_is_a_start(server):
    """Triton gives such a request a sequence of its own, flagged START only."""
    result = send(server, "iterative", 0, END)
    assert (result["OUT_START"][0], result["OUT_END"][0], result["OUT_CORRID"][0]) == (9, 0, 0)
    with_id = sequence(server, "iterative", 64)
    assert column(with_id, "OUT_START") == [9, 7, 7]
    assert column(with_id, "OUT_END") == [0, 0, 1]
    assert column(with_id, "OUT_CORRID") == [64] * 3


def test_a_model_without_controls_gets_only_its_inputs(server):
    assert server._models["bare"].controls is None  # nothing to do per request
    results = sequence(server, "bare", 5)
    assert [r["NAMES"][0] for r in results] == [b"X"] * 3


def test_the_model_sees_the_controls_through_async_calls_too(server):
    async def run() -> list[dict[str, np.ndarray]]:
        out = []
        for flags in (START, 0, END):
            out.append(await server.infer_async("plain", {"X": np.ones(1, np.float32)}, correlation_id=4,
                                                flags=flags, timeout=TIMEOUT))
        return out

    results = asyncio.run(run())
    assert column(results, "OUT_START") == [9, 7, 7]
    assert column(results, "OUT_CORRID") == [4] * 3


def test_a_rescheduled_request_is_no_longer_the_start_nor_the_end(server):
    """Triton's iterative sequencer clears a rescheduled request's flags, so its START and END
    controls read false from its second run on."""
    result = server.infer("twice", {"X": np.ones(1, np.float32)}, correlation_id=5, flags=START | END,
                          timeout=TIMEOUT)
    assert result["RUNS"].tolist() == [9, 7, 1, 0]
    result = server.infer("twice", {"X": np.ones(1, np.float32)}, correlation_id=6, flags=START, timeout=TIMEOUT)
    assert result["RUNS"].tolist() == [9, 7, 0, 0]


def test_a_batch_of_more_than_one_is_refused_with_tritons_words(server):
    with pytest.raises(InferenceError) as err:
        server.infer("batched", {"X": np.ones((2, 1), np.float32)}, correlation_id=3, flags=START, timeout=TIMEOUT)
    assert err.value.code == "INVALID_ARG"
    assert str(err.value).endswith("inference request to model 'batched' must specify batch-size 1 due to "
                                   "requirements of sequence batcher")
    assert send(server, "batched", 3, START | END)["OUT_START"].tolist() == [[True]]
