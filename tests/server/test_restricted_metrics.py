"""Restricted API groups (Triton's --http-restricted-api / --grpc-restricted-protocol), the
metrics endpoint with Triton's counter names, and the per-request tensor limit."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from stubhost.server.restricted import Restrictions
from tests.host.repo_factory import EXAMPLES
from tests.server.serve_process import ServeProcess


@pytest.fixture(scope="module")
def server():
    with ServeProcess(EXAMPLES, "--http-restricted-api", "model-repository,shared-memory:admin-key=s3cret",
                      "--grpc-restricted-protocol", "model-repository,statistics:admin-key=s3cret") as srv:
        yield srv


def _metrics_port(server: ServeProcess) -> int:
    m = re.search(r"Started Metrics Service at \S+:(\d+)", server.log)
    assert m, server.log
    return int(m.group(1))


def _add_sub_inputs(mod):
    inputs = [mod.InferInput("INPUT0", [4], "FP32"), mod.InferInput("INPUT1", [4], "FP32")]
    for i in inputs:
        i.set_data_from_numpy(np.ones(4, np.float32))
    return inputs


def test_http_restricted_group_needs_its_header_and_others_do_not(server):
    client = httpclient.InferenceServerClient(server.http_url)
    with pytest.raises(InferenceServerException, match="This API is restricted, expecting header 'admin-key'"):
        client.get_model_repository_index()
    with pytest.raises(InferenceServerException, match="restricted"):
        client.get_system_shared_memory_status()
    with pytest.raises(InferenceServerException, match="restricted"):
        client.get_model_repository_index(headers={"admin-key": "wrong"})
    index = client.get_model_repository_index(headers={"admin-key": "s3cret"})
    assert {m["name"] for m in index} >= {"add_sub", "identity"}
    assert client.get_system_shared_memory_status(headers={"admin-key": "s3cret"}) == []
    # Unrestricted groups need nothing.
    assert client.is_server_ready()
    client.infer("add_sub", _add_sub_inputs(httpclient))
    client.get_inference_statistics("add_sub")
    client.close()


def test_http_restricted_status_is_403_with_an_error_body(server):
    request = urllib.request.Request(f"http://{server.http_url}/v2/repository/index", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=10)
    assert info.value.code == 403
    assert json.loads(info.value.read()) == {"error": "This API is restricted, expecting header 'admin-key'"}
    info.value.close()


def test_grpc_restricted_protocol_needs_prefixed_metadata(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as info:
        client.get_model_repository_index()
    assert "UNAVAILABLE" in str(info.value.status())
    assert "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'" in info.value.message()
    with pytest.raises(InferenceServerException, match="restricted"):
        client.get_inference_statistics("add_sub")
    ok = {"triton-grpc-protocol-admin-key": "s3cret"}
    assert client.get_model_repository_index(headers=ok).models
    assert client.get_inference_statistics("add_sub", headers=ok).model_stats
    # Shared memory is restricted on HTTP only in this server's configuration.
    assert not client.get_system_shared_memory_status().regions
    client.infer("add_sub", _add_sub_inputs(grpcclient))
    client.close()


def test_metrics_endpoint_counts_requests_with_tritons_names(server):
    client = httpclient.InferenceServerClient(server.http_url)
    url = f"http://127.0.0.1:{_metrics_port(server)}/metrics"

    def counter(name: str, reason: str = "") -> float:
        with urllib.request.urlopen(url, timeout=10) as reply:
            text = reply.read().decode()
        assert f"# TYPE {name} counter" in text
        labels = f'model="add_sub",reason="{reason}",version="1"' if reason else 'model="add_sub",version="1"'
        m = re.search(rf'^{name}{{{labels}}} (\S+)$', text, re.M)
        assert m, text
        return float(m.group(1))

    before_ok, before_fail = counter("nv_inference_request_success"), counter("nv_inference_request_failure", "OTHER")
    for _ in range(3):
        client.infer("add_sub", _add_sub_inputs(httpclient))
    with pytest.raises(InferenceServerException):
        client.infer("add_sub", _add_sub_inputs(httpclient)[:1])  # INPUT1 missing
    assert counter("nv_inference_request_success") == before_ok + 3
    assert counter("nv_inference_request_failure", "OTHER") == before_fail + 1  # refused by the input checks
    assert counter("nv_inference_compute_infer_duration_us") > 0
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(url.replace("/metrics", "/other"), timeout=10)
    assert info.value.code == 404
    info.value.close()
    client.close()


def test_too_many_inputs_are_refused_before_anything_runs(server):
    client = httpclient.InferenceServerClient(server.http_url)
    inputs = []
    for i in range(1025):
        x = httpclient.InferInput(f"IN{i}", [1], "FP32")
        x.set_data_from_numpy(np.zeros(1, np.float32))
        inputs.append(x)
    with pytest.raises(InferenceServerException, match="request has 1025 inputs, more than the limit of 1024"):
        client.infer("add_sub", inputs)
    client.infer("add_sub", _add_sub_inputs(httpclient))
    client.close()


@pytest.mark.parametrize("spec, message", [
    ("model-repository", "expected <api>"),
    ("model-repository:=v", "expected <api>"),
    ("nonsense:k=v", "unknown API 'nonsense'"),
    (":k=v", "expected <api>"),
])
def test_restriction_specs_are_validated(spec, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        Restrictions.parse([spec], grpc=False)


def test_a_category_may_be_in_one_group_only():
    with pytest.raises(ValueError, match="already in another restricted group"):
        Restrictions.parse(["health:a=1", "health,metadata:b=2"], grpc=False)


def test_bad_restriction_flag_fails_start_up_with_a_message():
    srv = ServeProcess(EXAMPLES, "--http-restricted-api", "bogus:k=v", expect_start=False)
    srv.start()
    try:
        assert srv.wait_exit(60) == 2
    finally:
        srv._close_log()
    assert "unknown API 'bogus'" in srv.log
